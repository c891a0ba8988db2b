//! `shard-bench h2`: HTTP/2, shard and nginx side by side, loaded by `h2load` (Debian's
//! `nghttp2-client`) on the same certificate (made at run time with `rcgen`) and workers.
//!
//! Rows: `h2c` (prior knowledge) and TLS (ALPN `h2`), each with `return 200`, a 16 KiB static
//! file and the proxy to a local upstream (a server block of the same process, the same for
//! both), `h2load -c CLIENTS -m STREAMS` for `--duration` seconds. Reported per row: requests
//! per second, the workers' CPU per request from `/proc` (steadier than throughput on a shared
//! machine) and requests per worker CPU-second; then the workers' memory per idle HTTP/2
//! connection (`--idle` connections that each made one request). It measures; it does not
//! judge, except in `--smoke`, where it checks that every shard number was measured.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};

use crate::procfs;
use crate::servers::{self, Kind, Spec};

#[derive(clap::Args, Debug, Clone)]
pub struct H2Args {
    /// Worker processes of each server.
    #[arg(long, default_value_t = 2)]
    workers: usize,
    /// `h2load -c`: connections.
    #[arg(long, default_value_t = 100)]
    clients: usize,
    /// `h2load -m`: streams at once per connection.
    #[arg(long, default_value_t = 10)]
    streams: usize,
    /// Seconds per row.
    #[arg(long, default_value_t = 5)]
    duration: u64,
    /// Idle HTTP/2 connections held for the memory figure.
    #[arg(long, default_value_t = 2000)]
    idle: usize,
    #[command(flatten)]
    peers: servers::Peers,
    /// Tiny numbers, to check that the bench works (CI).
    #[arg(long)]
    smoke: bool,
    /// Also write the report here.
    #[arg(long)]
    out: Option<PathBuf>,
}

#[derive(Debug, Clone)]
struct Row {
    server: &'static str,
    name: String,
    reqs: u64,
    failed: u64,
    per_sec: f64,
    cpu_us: f64,
}

const FILE_BYTES: usize = 16 * 1024;

pub fn run(mut a: H2Args) -> Result<()> {
    if a.smoke {
        a.duration = 1;
        a.clients = a.clients.min(4);
        a.streams = a.streams.min(4);
        // Enough that their memory shows in whole pages (50 fitted in what was resident).
        a.idle = a.idle.min(400);
    }
    if servers::which("h2load").is_none() {
        bail!("h2load is not installed: apt-get install nghttp2-client");
    }
    procfs::raise_nofile_limit();
    let mut notes = Vec::new();
    let (shard, nginx) = a.peers.binaries(&mut notes)?;
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
    let cert = rcgen::CertificateParams::new(vec!["bench.test".to_string()])?.self_signed(&key)?;
    let pem_dir = std::env::temp_dir().join(format!("shard-bench-h2-{}", std::process::id()));
    std::fs::create_dir_all(&pem_dir)?;
    std::fs::write(pem_dir.join("cert.pem"), cert.pem())?;
    std::fs::write(pem_dir.join("key.pem"), key.serialize_pem())?;
    let mut kinds = vec![Kind::Shard(shard)];
    if let Some(n) = nginx {
        kinds.push(Kind::Nginx(n));
    }
    let mut rows = Vec::new();
    let mut idle = Vec::new();
    for kind in &kinds {
        eprintln!("shard-bench: {}: HTTP/2", kind.name());
        match front(kind, &pem_dir, &a) {
            Ok((r, m)) => {
                rows.extend(r);
                idle.push((kind.name(), m));
            }
            Err(e) => notes.push(format!("{}: not all measured: {e:#}", kind.name())),
        }
    }
    let _ = std::fs::remove_dir_all(&pem_dir);
    let report = render(&a, &rows, &idle, &notes);
    print!("{report}");
    servers::write_report(a.out.as_deref(), &report)?;
    if a.smoke {
        let shard_rows: Vec<&Row> = rows.iter().filter(|r| r.server == "shard").collect();
        ensure!(
            shard_rows.len() == 6
                && shard_rows
                    .iter()
                    .all(|r| r.reqs > 0 && r.failed == 0 && r.cpu_us > 0.0),
            "smoke: shard's HTTP/2 rows were not all measured: {rows:?} {notes:?}"
        );
        ensure!(
            idle.iter().any(|(n, m)| *n == "shard" && *m > 0.0),
            "smoke: no memory figure for shard: {notes:?}"
        );
    }
    Ok(())
}

/// The rows of one server, and its bytes per idle HTTP/2 connection.
fn front(kind: &Kind, pems: &Path, a: &H2Args) -> Result<(Vec<Row>, f64)> {
    let tls_port = servers::free_port()?;
    let h2c_port = servers::free_port()?;
    let up_port = servers::free_port()?;
    let spec = Spec {
        workers: a.workers,
        // `listen ... http2`, the form both nginx 1.22 and shard read, on ports of their own:
        // nginx 1.22 speaks only HTTP/2 there, and the bench's readiness check is HTTP/1.1.
        server_extra: format!(
            "listen 127.0.0.1:{h2c_port} http2;\n        \
             listen 127.0.0.1:{tls_port} ssl http2;\n        \
             ssl_certificate {}; ssl_certificate_key {};\n        \
             location /p/ {{ proxy_pass http://127.0.0.1:{up_port}/; }}",
            pems.join("cert.pem").display(),
            pems.join("key.pem").display()
        ),
        http_extra: format!(
            "server {{ listen 127.0.0.1:{up_port}; location / {{ return 200 \"upstream\"; }} }}"
        ),
        idle: a.idle + a.clients,
        tag: "h2".into(),
        ..Default::default()
    };
    let srv = servers::start_with(kind, &spec, |dir| {
        std::fs::write(dir.join("html/f16k"), vec![b'x'; FILE_BYTES])?;
        Ok(())
    })?;
    let res = (|| -> Result<(Vec<Row>, f64)> {
        let pids = srv.worker_pids()?;
        let mut rows = Vec::new();
        for (proto, port) in [("h2c", h2c_port), ("TLS", tls_port)] {
            let scheme = if proto == "TLS" { "https" } else { "http" };
            for (what, path) in [
                ("return 200", "/ok"),
                ("16 KiB file", "/f16k"),
                ("proxy", "/p/x"),
            ] {
                let url = format!("{scheme}://127.0.0.1:{port}{path}");
                let t0 = procfs::cpu_ticks(&pids)?;
                let (reqs, failed, per_sec) = h2load(&url, a)?;
                let t1 = procfs::cpu_ticks(&pids)?;
                let cpu_us = (t1 - t0) as f64 * 1e6 / procfs::ticks_per_sec() / reqs.max(1) as f64;
                rows.push(Row {
                    server: kind.name(),
                    name: format!("{proto}, {what}"),
                    reqs,
                    failed,
                    per_sec,
                    cpu_us,
                });
            }
        }
        let mem = idle_bytes(SocketAddr::from(([127, 0, 0, 1], h2c_port)), &pids, a.idle)?;
        Ok((rows, mem))
    })();
    srv.stop();
    res
}

/// Runs `h2load` on `url`: (requests that succeeded, that failed, requests per second).
fn h2load(url: &str, a: &H2Args) -> Result<(u64, u64, f64)> {
    let out = Command::new("timeout")
        .arg((a.duration + 30).to_string())
        .arg("h2load")
        .args(["-D", &a.duration.to_string()])
        .args(["-c", &a.clients.to_string()])
        .args(["-m", &a.streams.to_string()])
        .args(["-t", "1", url])
        .output()
        .context("running h2load")?;
    let text = String::from_utf8_lossy(&out.stdout);
    let num_before = |needle: &str| -> Option<f64> {
        let i = text.find(needle)?;
        text[..i].split_whitespace().last()?.parse().ok()
    };
    let ok = num_before(" succeeded").context("h2load: no 'succeeded'")? as u64;
    let failed = num_before(" failed").unwrap_or(0.0) as u64;
    let per_sec = num_before(" req/s").unwrap_or(0.0);
    Ok((ok, failed, per_sec))
}

/// The workers' memory growth per HTTP/2 connection that made one request and then waits.
fn idle_bytes(addr: SocketAddr, pids: &[i32], n: usize) -> Result<f64> {
    use shard_http::{h2frame, hpack};
    // The client preface, an empty SETTINGS, a GET / (HEADERS, END_STREAM | END_HEADERS),
    // and the ACK of the server's SETTINGS.
    let e = hpack::Encoder;
    let mut block = Vec::new();
    for (n, v) in [
        (&b":method"[..], &b"GET"[..]),
        (b":scheme", b"http"),
        (b":path", b"/"),
        (b":authority", b"localhost"),
    ] {
        e.field(n, v, &mut block);
    }
    let mut hello = h2frame::PREFACE.to_vec();
    h2frame::push_settings(&mut hello, &[]);
    h2frame::push_headers(&mut hello, 1, &block, true, h2frame::DEFAULT_MAX_FRAME);
    h2frame::push_settings_ack(&mut hello);
    let before = procfs::rss_bytes(pids)?;
    let mut held = Vec::with_capacity(n);
    for _ in 0..n {
        let mut s = TcpStream::connect(addr)?;
        s.write_all(&hello)?;
        held.push(s);
    }
    // Every connection answered: its response read (a short read of what arrived is enough).
    for s in &mut held {
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        let mut b = [0u8; 4096];
        let _ = s.read(&mut b)?;
    }
    std::thread::sleep(Duration::from_millis(500));
    let after = procfs::rss_bytes(pids)?;
    drop(held);
    Ok(after.saturating_sub(before) as f64 / n as f64)
}

fn render(a: &H2Args, rows: &[Row], idle: &[(&str, f64)], notes: &[String]) -> String {
    let mut r = format!(
        "# shard-bench h2: h2load -c {} -m {}, {} s per row, {} workers\n\n\
         | server | row | requests | failed | req/s | worker CPU µs/req | req per CPU-s |\n\
         |---|---|---|---|---|---|---|\n",
        a.clients, a.streams, a.duration, a.workers
    );
    for x in rows {
        r.push_str(&format!(
            "| {} | {} | {} | {} | {:.0} | {:.2} | {:.0} |\n",
            x.server,
            x.name,
            x.reqs,
            x.failed,
            x.per_sec,
            x.cpu_us,
            if x.cpu_us > 0.0 { 1e6 / x.cpu_us } else { 0.0 }
        ));
    }
    let ratio_rows: Vec<String> = rows
        .iter()
        .filter(|x| x.server == "shard")
        .filter_map(|s| {
            let n = rows
                .iter()
                .find(|x| x.server == "nginx" && x.name == s.name)?;
            (s.cpu_us > 0.0).then(|| format!("{}: {:.2}", s.name, n.cpu_us / s.cpu_us))
        })
        .collect();
    if !ratio_rows.is_empty() {
        r.push_str(&format!(
            "\nRequests per worker CPU-second, shard/nginx: {}\n",
            ratio_rows.join("; ")
        ));
    }
    r.push_str(&format!(
        "\nMemory per idle HTTP/2 connection ({} held, one request each): {}\n",
        a.idle,
        idle.iter()
            .map(|(n, m)| format!("{n} {m:.0} bytes"))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    for n in notes {
        r.push_str(&format!("\nNote: {n}\n"));
    }
    r
}
