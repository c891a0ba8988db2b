//! Load through wrk (the built-in generator is `loadgen`), and idle keep-alive connections.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, Context, Result};

/// Runs wrk and returns its requests per second.
pub fn wrk(
    bin: &Path,
    port: u16,
    path: &str,
    conns: usize,
    d: Duration,
    keepalive: bool,
) -> Result<f64> {
    let mut c = Command::new(bin);
    c.arg(format!("-t{}", conns.clamp(1, 2)))
        .arg(format!("-c{conns}"))
        .arg(format!("-d{}s", d.as_secs().max(1)))
        .arg(format!("http://127.0.0.1:{port}{path}"));
    if !keepalive {
        c.arg("-H").arg("Connection: close");
    }
    let out = c.output().context("running wrk")?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!("wrk failed: {text}{}", String::from_utf8_lossy(&out.stderr));
    }
    text.lines()
        .find_map(|l| l.strip_prefix("Requests/sec:"))
        .and_then(|v| v.trim().parse().ok())
        .context("no Requests/sec in wrk output")
}

/// Reads one response whose body is `Content-Length` bytes; returns false on close or error.
fn read_one(s: &mut TcpStream, buf: &mut Vec<u8>) -> bool {
    buf.clear();
    let mut tmp = [0u8; 4096];
    loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..i]).to_ascii_lowercase();
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            if buf.len() >= i + 4 + len {
                return true;
            }
        }
        match s.read(&mut tmp) {
            Ok(0) | Err(_) => return false,
            Ok(n) => buf.extend_from_slice(&tmp[..n]),
        }
    }
}

/// Opens `n` connections, makes one request on each and keeps them open and idle.
pub fn idle_connections(port: u16, path: &str, n: usize) -> Result<Vec<TcpStream>> {
    let req = format!("GET {path} HTTP/1.1\r\nHost: bench\r\n\r\n");
    let mut v = Vec::with_capacity(n);
    let mut buf = Vec::new();
    for i in 0..n {
        let mut s = TcpStream::connect(("127.0.0.1", port))
            .with_context(|| format!("idle connection {i}"))?;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        s.write_all(req.as_bytes())?;
        if !read_one(&mut s, &mut buf) {
            bail!("idle connection {i}: no response");
        }
        v.push(s);
    }
    Ok(v)
}
