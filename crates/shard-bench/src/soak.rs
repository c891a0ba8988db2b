//! `shard-bench soak`: shard under a mix of well-behaved, hostile and unlucky clients for a
//! long time, watching every worker's resident memory and open descriptors once a second.
//!
//! The mix: keep-alive and close-per-request `return`s, pipelined batches, slow clients that
//! trickle their heads, clients that abort mid-response or mid-request, static files, and
//! proxied requests with and without a body through an `upstream` with a keep-alive pool
//! (the upstream is a second server block of the same shard). What must not happen over time:
//! descriptors or memory that grow with the number of requests. The report gives both as
//! growth per 100,000 requests between the end of the warm-up and the end of the run, and the
//! client-side outcomes (answered, failed) per kind.
//!
//! It measures; it does not judge, except in `--smoke`, where it checks that every kind of
//! client got answers and that no descriptor leaked.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};

use crate::loadgen::response::{Feed, Reader};
use crate::servers::{self, Kind, Spec};

#[derive(clap::Args, Debug, Clone)]
pub struct SoakArgs {
    /// How long to run.
    #[arg(long, default_value_t = 10.0)]
    pub minutes: f64,
    /// Worker processes.
    #[arg(long, default_value_t = 2)]
    pub workers: usize,
    /// The shard binary (default: next to this one).
    #[arg(long)]
    pub shard: Option<PathBuf>,
    /// A few seconds, to check that the soak works (CI).
    #[arg(long)]
    pub smoke: bool,
    /// Also write the report (and the per-second samples as CSV) here.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// The kinds of clients, each run by its own threads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Client {
    KeepAlive,
    Close,
    Pipelined,
    Slow,
    Aborted,
    Static,
    Proxied,
    ProxiedPost,
}

const CLIENTS: [(Client, usize); 8] = [
    (Client::KeepAlive, 3),
    (Client::Close, 2),
    (Client::Pipelined, 1),
    (Client::Slow, 2),
    (Client::Aborted, 2),
    (Client::Static, 1),
    (Client::Proxied, 2),
    (Client::ProxiedPost, 1),
];

#[derive(Default)]
struct Tally {
    ok: AtomicU64,
    failed: AtomicU64,
}

/// One second's look at the workers.
#[derive(Clone, Copy, Debug)]
struct Sample {
    secs: f64,
    requests: u64,
    rss_bytes: u64,
    fds: u64,
}

pub fn run(a: SoakArgs) -> Result<()> {
    let shard = super::shard_binary(a.shard.as_deref())?;
    crate::procfs::raise_nofile_limit();
    let duration = if a.smoke {
        Duration::from_secs(4)
    } else {
        Duration::from_secs_f64(a.minutes * 60.0)
    };
    let warmup = (duration / 10).min(Duration::from_secs(30));
    let backend_port = servers::free_port()?;
    let spec = Spec {
        workers: a.workers,
        listen_opts: "reuseport".into(),
        events: String::new(),
        server_extra: "location /proxy/ { proxy_pass http://back/; proxy_http_version 1.1; \
                       proxy_set_header Connection \"\"; }\n        \
                       location /files/ { }"
            .into(),
        ok: None,
        http_extra: format!(
            "upstream back {{ server 127.0.0.1:{backend_port}; keepalive 8; }}\n    \
             server {{ listen 127.0.0.1:{backend_port}; \
             location / {{ return 200 \"from the backend\"; }} }}\n    \
             client_header_timeout 5s; client_body_timeout 5s; send_timeout 5s;"
        ),
        stream: None,
        main_extra: String::new(),
        idle: 0,
        tag: "soak".into(),
        detach: false,
    };
    let server = servers::start_with(&Kind::Shard(shard), &spec, |dir| {
        let files = dir.join("html/files");
        std::fs::create_dir_all(&files)?;
        std::fs::write(files.join("small"), vec![b's'; 4096])?;
        std::fs::write(files.join("big"), vec![b'b'; 1 << 20])?;
        Ok(())
    })?;
    let addr = SocketAddr::from(([127, 0, 0, 1], server.port));
    let pids = server.worker_pids()?;

    let stop = Arc::new(AtomicBool::new(false));
    let tallies: Arc<Vec<Tally>> = Arc::new(CLIENTS.iter().map(|_| Tally::default()).collect());
    let mut threads = Vec::new();
    for (i, &(kind, n)) in CLIENTS.iter().enumerate() {
        for t in 0..n {
            let (stop, tallies) = (stop.clone(), tallies.clone());
            threads.push(std::thread::spawn(move || {
                let mut seed = 0x9e37_79b9_7f4a_7c15u64 ^ ((i * 16 + t) as u64);
                while !stop.load(Relaxed) {
                    let tally = &tallies[i];
                    match one_round(kind, addr, &mut seed) {
                        Ok(n) => tally.ok.fetch_add(n, Relaxed),
                        Err(_) => tally.failed.fetch_add(1, Relaxed),
                    };
                }
            }));
        }
    }

    let t0 = Instant::now();
    let mut samples = Vec::new();
    while t0.elapsed() < duration {
        std::thread::sleep(Duration::from_secs(1));
        // Workers of a soak are never replaced; a missing one is a crash worth stopping for.
        let rss_bytes = crate::procfs::rss_bytes(&pids)?;
        let fds = pids.iter().map(|&p| fd_count(p)).sum::<Result<u64>>()?;
        samples.push(Sample {
            secs: t0.elapsed().as_secs_f64(),
            requests: server.requests()?,
            rss_bytes,
            fds,
        });
    }
    stop.store(true, Relaxed);
    for t in threads {
        let _ = t.join();
    }
    // Idle again: what is still open now is what the run left behind.
    std::thread::sleep(Duration::from_secs(1));
    let idle_fds = pids.iter().map(|&p| fd_count(p)).sum::<Result<u64>>()?;
    let first_fds = samples.first().map_or(0, |s| s.fds);
    if idle_fds > first_fds {
        eprintln!("descriptors left open after the run: {}", fd_kinds(&pids));
    }

    let base = samples
        .iter()
        .find(|s| s.secs >= warmup.as_secs_f64())
        .or(samples.first())
        .copied();
    let last = samples.last().copied();
    let mut report = String::new();
    report.push_str(&format!(
        "# shard-bench soak\n\n{:.1} minutes, {} workers, warm-up {} s; samples every second.\n\n",
        duration.as_secs_f64() / 60.0,
        a.workers,
        warmup.as_secs()
    ));
    report.push_str("| client | answered | failed |\n|---|---|---|\n");
    for (i, &(kind, n)) in CLIENTS.iter().enumerate() {
        report.push_str(&format!(
            "| {kind:?} ×{n} | {} | {} |\n",
            tallies[i].ok.load(Relaxed),
            tallies[i].failed.load(Relaxed)
        ));
    }
    if let (Some(b), Some(l)) = (base, last) {
        let reqs = l.requests.saturating_sub(b.requests).max(1) as f64;
        let per_100k = 100_000.0 / reqs;
        report.push_str(&format!(
            "\n| | after warm-up | at the end | growth per 100k requests |\n|---|---|---|---|\n\
             | requests (stub_status) | {} | {} | |\n\
             | worker RSS | {:.1} MiB | {:.1} MiB | {:+.2} KiB |\n\
             | worker descriptors | {} | {} | {:+.3} |\n\n\
             Descriptors when the run started: {first_fds}; once idle after it: {idle_fds}.\n",
            b.requests,
            l.requests,
            b.rss_bytes as f64 / (1 << 20) as f64,
            l.rss_bytes as f64 / (1 << 20) as f64,
            (l.rss_bytes as f64 - b.rss_bytes as f64) / 1024.0 * per_100k,
            b.fds,
            l.fds,
            (l.fds as f64 - b.fds as f64) * per_100k,
        ));
    }
    println!("{report}");
    if let Some(out) = &a.out {
        std::fs::create_dir_all(out)?;
        std::fs::write(out.join("soak.md"), &report)?;
        let mut csv = String::from("secs,requests,rss_bytes,fds\n");
        for s in &samples {
            csv.push_str(&format!(
                "{:.1},{},{},{}\n",
                s.secs, s.requests, s.rss_bytes, s.fds
            ));
        }
        std::fs::write(out.join("soak.csv"), csv)?;
    }
    server.stop();
    if a.smoke {
        for (i, &(kind, _)) in CLIENTS.iter().enumerate() {
            if tallies[i].ok.load(Relaxed) == 0 {
                bail!("soak smoke: no {kind:?} client was answered");
            }
        }
        if idle_fds > first_fds {
            bail!("soak smoke: {first_fds} descriptors before the run, {idle_fds} after it");
        }
    }
    Ok(())
}

/// What the open descriptors of `pids` are, counted by kind (`socket`, `anon_inode:...`, a
/// path), for a report of what leaked.
fn fd_kinds(pids: &[i32]) -> String {
    let mut kinds: std::collections::BTreeMap<String, u64> = Default::default();
    for p in pids {
        let Ok(dir) = std::fs::read_dir(format!("/proc/{p}/fd")) else {
            continue;
        };
        for e in dir.flatten() {
            let t = std::fs::read_link(e.path()).map_or("?".into(), |t| {
                let t = t.to_string_lossy().into_owned();
                t.split(':').next().unwrap_or("").to_string()
            });
            *kinds.entry(t).or_default() += 1;
        }
    }
    format!("{kinds:?}")
}

fn fd_count(pid: i32) -> Result<u64> {
    Ok(std::fs::read_dir(format!("/proc/{pid}/fd"))?.count() as u64)
}

fn next(seed: &mut u64) -> u64 {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    *seed
}

fn connect(addr: SocketAddr) -> std::io::Result<TcpStream> {
    let s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    s.set_write_timeout(Some(Duration::from_secs(10)))?;
    Ok(s)
}

/// Reads `n` whole responses; all must be 200.
fn read_responses(s: &mut TcpStream, n: usize) -> std::io::Result<()> {
    let mut reader = Reader::default();
    let mut buf = vec![0u8; 64 * 1024];
    let mut pending: Vec<u8> = Vec::new();
    let mut done = 0;
    while done < n {
        if pending.is_empty() {
            let got = s.read(&mut buf)?;
            if got == 0 {
                if reader.eof_completes() {
                    return Ok(());
                }
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            pending.extend_from_slice(&buf[..got]);
        }
        match reader.feed(&pending) {
            Feed::More => pending.clear(),
            Feed::Done(used) => {
                if reader.status != 200 {
                    return Err(std::io::Error::other(format!("status {}", reader.status)));
                }
                pending.drain(..used);
                reader.reset();
                done += 1;
            }
            Feed::Bad => return Err(std::io::Error::other("bad response")),
        }
    }
    Ok(())
}

const GET_OK: &[u8] = b"GET /ok HTTP/1.1\r\nHost: soak\r\n\r\n";

/// One round of a client: returns how many responses it got.
fn one_round(kind: Client, addr: SocketAddr, seed: &mut u64) -> std::io::Result<u64> {
    match kind {
        Client::KeepAlive | Client::Proxied => {
            let req: &[u8] = if kind == Client::Proxied {
                b"GET /proxy/x HTTP/1.1\r\nHost: soak\r\n\r\n"
            } else {
                GET_OK
            };
            let mut s = connect(addr)?;
            for _ in 0..100 {
                s.write_all(req)?;
                read_responses(&mut s, 1)?;
            }
            Ok(100)
        }
        Client::Close => {
            let mut s = connect(addr)?;
            s.write_all(b"GET /ok HTTP/1.1\r\nHost: soak\r\nConnection: close\r\n\r\n")?;
            read_responses(&mut s, 1)?;
            Ok(1)
        }
        Client::Pipelined => {
            let mut s = connect(addr)?;
            s.write_all(&GET_OK.repeat(32))?;
            read_responses(&mut s, 32)?;
            Ok(32)
        }
        Client::Slow => {
            let mut s = connect(addr)?;
            s.set_nodelay(true)?;
            for chunk in GET_OK.chunks(4) {
                s.write_all(chunk)?;
                std::thread::sleep(Duration::from_millis(20));
            }
            read_responses(&mut s, 1)?;
            Ok(1)
        }
        Client::Aborted => {
            let mut s = connect(addr)?;
            match next(seed) % 3 {
                // Half a head, then gone.
                0 => s.write_all(b"GET /ok HTTP/1.1\r\nHo")?,
                // Half a body, then gone.
                1 => s.write_all(
                    b"POST /proxy/x HTTP/1.1\r\nHost: soak\r\nContent-Length: 1000\r\n\r\nabc",
                )?,
                // A large file, read a little, then reset.
                _ => {
                    s.write_all(b"GET /files/big HTTP/1.1\r\nHost: soak\r\n\r\n")?;
                    let mut buf = [0u8; 8192];
                    let _ = s.read(&mut buf)?;
                    socket2::SockRef::from(&s).set_linger(Some(Duration::ZERO))?;
                }
            }
            Ok(1)
        }
        Client::Static => {
            let mut s = connect(addr)?;
            for _ in 0..20 {
                s.write_all(b"GET /files/small HTTP/1.1\r\nHost: soak\r\n\r\n")?;
                read_responses(&mut s, 1)?;
            }
            s.write_all(b"GET /files/big HTTP/1.1\r\nHost: soak\r\n\r\n")?;
            read_responses(&mut s, 1)?;
            Ok(21)
        }
        Client::ProxiedPost => {
            let mut s = connect(addr)?;
            let body = vec![b'p'; 10_000];
            for _ in 0..20 {
                s.write_all(
                    b"POST /proxy/up HTTP/1.1\r\nHost: soak\r\nContent-Length: 10000\r\n\r\n",
                )?;
                s.write_all(&body)?;
                read_responses(&mut s, 1)?;
            }
            Ok(20)
        }
    }
}
