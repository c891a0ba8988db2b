//! `shard-bench bodies`: request bodies through the reverse proxy, shard and nginx side by
//! side: what stalled uploads cost a worker, how fast a large upload goes through (buffered,
//! and with `proxy_request_buffering off`), and whether temporary files are left behind.
//!
//! The upstream is a sink in this process (a thread per connection: read the head, read the
//! body by its `Content-Length`, answer `200` with the count). Each front runs with
//! `client_max_body_size 0` and `client_body_temp_path client_body_temp` under its prefix.
//!
//! - **stalled**: `--stalled` clients each send 900 KB of a 1 MB upload and stop. When the
//!   front has read all of it (no bytes left in its sockets' receive queues, from
//!   `/proc/net/tcp`), the growth of the workers' RSS divided by the clients.
//! - **upload**: `--mbytes` MiB in one request, `/buf` (buffered) and `/stream` (buffering off):
//!   MB/s from the first byte sent to the response, and the workers' peak RSS growth meanwhile
//!   (sampled every 20 ms).
//! - **temp files**: files under the temporary directory after the runs, after a worker of a
//!   front holding a half-sent upload is killed with `SIGKILL`, and after a reload with one.
//!
//! It measures; it does not judge, except in `--smoke`, where it checks that every number was
//! measured for shard and that shard left no file.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};

use crate::procfs;
use crate::servers::{self, Kind, Running, Spec};

#[derive(clap::Args, Debug, Clone)]
pub struct BodiesArgs {
    /// Worker processes of each front.
    #[arg(long, default_value_t = 1)]
    workers: usize,
    /// Clients that each send 900 KB of a 1 MB upload and stall.
    #[arg(long, default_value_t = 200)]
    stalled: usize,
    /// MiB of the one large upload.
    #[arg(long, default_value_t = 100)]
    mbytes: u64,
    #[command(flatten)]
    peers: servers::Peers,
    /// Tiny numbers, to check that the bench works (CI).
    #[arg(long)]
    smoke: bool,
    /// Also write the report here.
    #[arg(long)]
    out: Option<PathBuf>,
}

/// Sent by each stalled client, of the `STALL_LENGTH` it announces.
const STALL_SENT: usize = 900_000;
const STALL_LENGTH: usize = 1_000_000;
/// The client's write size for the large upload.
const UPLOAD_CHUNK: usize = 256 * 1024;

#[derive(Default, Debug)]
struct Row {
    name: String,
    stalled_bytes_per_conn: Option<f64>,
    buffered_mb_s: Option<f64>,
    buffered_peak_kib: Option<f64>,
    streamed_mb_s: Option<f64>,
    streamed_peak_kib: Option<f64>,
    files_after_runs: Option<usize>,
    files_after_kill: Option<usize>,
    files_after_reload: Option<usize>,
}

pub fn run(mut a: BodiesArgs) -> Result<()> {
    if a.smoke {
        a.stalled = a.stalled.min(10);
        a.mbytes = a.mbytes.min(8);
    }
    ensure!(a.workers >= 1, "--workers must be at least 1");
    ensure!(a.mbytes >= 1, "--mbytes must be at least 1");
    procfs::raise_nofile_limit();
    let mut notes = Vec::new();
    let (shard, nginx) = a.peers.binaries(&mut notes)?;
    let sink = Sink::start()?;
    let mut kinds = vec![Kind::Shard(shard)];
    if let Some(n) = nginx {
        kinds.push(Kind::Nginx(n));
    }
    let mut rows = Vec::new();
    for kind in &kinds {
        let name = kind.name();
        eprintln!("shard-bench: {name}: request bodies");
        let mut row = Row {
            name: name.to_string(),
            ..Default::default()
        };
        if let Err(e) = front(kind, &sink, &a, &mut row) {
            notes.push(format!("{name}: not all measured: {e:#}"));
        }
        rows.push(row);
    }
    sink.stop.store(true, Relaxed);
    let report = render(&a, &rows, &notes);
    print!("{report}");
    servers::write_report(a.out.as_deref(), &report)?;
    if a.smoke {
        let s = &rows[0];
        ensure!(
            s.stalled_bytes_per_conn.is_some()
                && s.buffered_mb_s.is_some()
                && s.streamed_mb_s.is_some(),
            "smoke: shard's numbers were not all measured: {s:?} {notes:?}"
        );
        ensure!(
            s.files_after_runs == Some(0)
                && s.files_after_kill == Some(0)
                && s.files_after_reload == Some(0),
            "smoke: shard left temporary files: {s:?}"
        );
    }
    Ok(())
}

fn front(kind: &Kind, sink: &Sink, a: &BodiesArgs, row: &mut Row) -> Result<()> {
    let spec = Spec {
        workers: a.workers,
        listen_opts: String::new(),
        events: String::new(),
        server_extra: "location /buf { proxy_pass http://sink; }\n\
             location /stream { proxy_pass http://sink; proxy_request_buffering off; }"
            .to_string(),
        ok: None,
        http_extra: format!(
            "client_max_body_size 0;\n    client_body_temp_path client_body_temp;\n    \
             upstream sink {{ server 127.0.0.1:{}; }}",
            sink.port
        ),
        stream: None,
        main_extra: String::new(),
        idle: a.stalled + 64,
        tag: "bodies".into(),
        detach: false,
    };
    let srv = servers::start_with(kind, &spec, |_| Ok(()))?;
    let res = measure(&srv, a, row);
    srv.stop();
    res
}

fn measure(srv: &Running, a: &BodiesArgs, row: &mut Row) -> Result<()> {
    let temp = srv.dir.join("client_body_temp");
    row.stalled_bytes_per_conn = Some(stalled(srv, a.stalled)?);
    let (mb_s, peak) = upload(srv, "/buf", a.mbytes)?;
    row.buffered_mb_s = Some(mb_s);
    row.buffered_peak_kib = Some(peak);
    let (mb_s, peak) = upload(srv, "/stream", a.mbytes)?;
    row.streamed_mb_s = Some(mb_s);
    row.streamed_peak_kib = Some(peak);
    row.files_after_runs = Some(files_under(&temp));

    // A worker killed while it holds a half-sent upload.
    let c = half_upload(srv)?;
    let pids = srv.worker_pids()?;
    for p in &pids {
        // SAFETY-free: kill(2) with plain integers.
        unsafe { libc::kill(*p, libc::SIGKILL) };
    }
    wait_until(Duration::from_secs(10), || {
        srv.worker_pids()
            .is_ok_and(|now| now.len() == pids.len() && now.iter().all(|p| !pids.contains(p)))
    })
    .context("no worker came back after SIGKILL")?;
    drop(c);
    row.files_after_kill = Some(files_under(&temp));

    // A reload while a worker holds one; the old worker finishes (the client gives up).
    let c = half_upload(srv)?;
    let pids = srv.worker_pids()?;
    unsafe { libc::kill(srv.master_pid(), libc::SIGHUP) };
    wait_until(Duration::from_secs(10), || {
        srv.worker_pids()
            .is_ok_and(|now| now.iter().any(|p| !pids.contains(p)))
    })
    .context("no new worker after SIGHUP")?;
    drop(c);
    wait_until(Duration::from_secs(15), || {
        srv.worker_pids()
            .is_ok_and(|now| now.iter().all(|p| !pids.contains(p)))
    })
    .context("the old worker did not exit after the reload")?;
    row.files_after_reload = Some(files_under(&temp));
    Ok(())
}

fn post_head(path: &str, len: usize) -> String {
    format!(
        "POST {path} HTTP/1.1\r\nHost: bench\r\nConnection: close\r\nContent-Length: {len}\r\n\r\n"
    )
}

/// One client that sent 900 KB of a 1 MB body, once the front read all of it.
fn half_upload(srv: &Running) -> Result<TcpStream> {
    let mut c = TcpStream::connect(("127.0.0.1", srv.port))?;
    c.write_all(post_head("/buf", STALL_LENGTH).as_bytes())?;
    c.write_all(&vec![b'x'; STALL_SENT])?;
    wait_until(Duration::from_secs(10), || rx_queued(srv.port) == Some(0))
        .context("the front did not read the upload")?;
    Ok(c)
}

/// Worker RSS growth per stalled 900 KB upload, in bytes.
fn stalled(srv: &Running, n: usize) -> Result<f64> {
    let pids = srv.worker_pids()?;
    // One complete upload first, so that allocator and buffers are warm.
    let (_, _) = upload_bytes(srv, "/buf", STALL_SENT)?;
    let before = procfs::rss_bytes(&pids)?;
    let data = vec![b'x'; STALL_SENT];
    let mut held = Vec::with_capacity(n);
    for _ in 0..n {
        let mut c = TcpStream::connect(("127.0.0.1", srv.port))?;
        c.write_all(post_head("/buf", STALL_LENGTH).as_bytes())?;
        c.write_all(&data)?;
        held.push(c);
    }
    wait_until(Duration::from_secs(30), || rx_queued(srv.port) == Some(0))
        .context("the front did not read the stalled uploads")?;
    // Let the last reads land in memory or on disk.
    std::thread::sleep(Duration::from_millis(200));
    let after = procfs::rss_bytes(&pids)?;
    drop(held);
    Ok(after.saturating_sub(before) as f64 / n as f64)
}

/// MB/s of one `mbytes` MiB upload to `path`, and the workers' peak RSS growth in KiB.
fn upload(srv: &Running, path: &str, mbytes: u64) -> Result<(f64, f64)> {
    upload_bytes(srv, path, (mbytes << 20) as usize)
}

fn upload_bytes(srv: &Running, path: &str, len: usize) -> Result<(f64, f64)> {
    let pids = srv.worker_pids()?;
    let base = procfs::rss_bytes(&pids)?;
    let peak = Arc::new(AtomicU64::new(base));
    let done = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (peak, done, pids) = (peak.clone(), done.clone(), pids.clone());
        std::thread::spawn(move || {
            while !done.load(Relaxed) {
                if let Ok(r) = procfs::rss_bytes(&pids) {
                    peak.fetch_max(r, Relaxed);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    let t = Instant::now();
    let res = (|| -> Result<()> {
        let mut c = TcpStream::connect(("127.0.0.1", srv.port))?;
        c.set_read_timeout(Some(Duration::from_secs(120)))?;
        c.write_all(post_head(path, len).as_bytes())?;
        let chunk = vec![b'y'; UPLOAD_CHUNK];
        let mut left = len;
        while left > 0 {
            let n = left.min(chunk.len());
            c.write_all(&chunk[..n])?;
            left -= n;
        }
        let mut resp = Vec::new();
        c.read_to_end(&mut resp)?;
        let text = String::from_utf8_lossy(&resp);
        if !text.starts_with("HTTP/1.1 200") || !text.ends_with(&format!("got {len}")) {
            bail!(
                "{path}: unexpected response: {}",
                text.lines().next().unwrap_or("")
            );
        }
        Ok(())
    })();
    let secs = t.elapsed().as_secs_f64();
    done.store(true, Relaxed);
    let _ = sampler.join();
    res?;
    let growth = peak.load(Relaxed).saturating_sub(base) as f64 / 1024.0;
    Ok((len as f64 / 1e6 / secs, growth))
}

/// Bytes waiting in the receive queues of the front's accepted connections (`/proc/net/tcp`).
fn rx_queued(port: u16) -> Option<u64> {
    let table = std::fs::read_to_string("/proc/net/tcp").ok()?;
    let local = format!(":{port:04X}");
    let mut sum = 0;
    for l in table.lines().skip(1) {
        let f: Vec<&str> = l.split_whitespace().collect();
        // An accepted connection: our port locally, established (01).
        if f.len() > 4 && f[1].ends_with(&local) && f[3] == "01" {
            let rx = f[4].split(':').nth(1)?;
            sum += u64::from_str_radix(rx, 16).ok()?;
        }
    }
    Some(sum)
}

fn wait_until(limit: Duration, mut f: impl FnMut() -> bool) -> Result<()> {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if f() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    bail!("timed out after {limit:?}")
}

/// Files (not directories) under `dir`, recursively; 0 when it does not exist.
fn files_under(dir: &Path) -> usize {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return 0;
    };
    rd.flatten()
        .map(|e| {
            let p = e.path();
            if p.is_dir() {
                files_under(&p)
            } else {
                1
            }
        })
        .sum()
}

/// The upstream: reads each request's body by its `Content-Length` and answers with the count.
struct Sink {
    port: u16,
    stop: Arc<AtomicBool>,
}

impl Sink {
    fn start() -> Result<Sink> {
        let l = TcpListener::bind("127.0.0.1:0")?;
        let port = l.local_addr()?.port();
        let stop = Arc::new(AtomicBool::new(false));
        std::thread::spawn(move || {
            for s in l.incoming() {
                let Ok(s) = s else { continue };
                std::thread::spawn(move || {
                    let _ = sink_conn(s);
                });
            }
        });
        Ok(Sink { port, stop })
    }
}

fn sink_conn(mut s: TcpStream) -> Result<()> {
    s.set_read_timeout(Some(Duration::from_secs(120)))?;
    let mut buf = vec![0u8; 256 * 1024];
    let mut head = Vec::new();
    let end = loop {
        let n = s.read(&mut buf)?;
        if n == 0 {
            return Ok(());
        }
        head.extend_from_slice(&buf[..n]);
        if let Some(i) = head.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
    };
    let text = String::from_utf8_lossy(&head[..end]).to_ascii_lowercase();
    let len: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    let mut got = (head.len() - end) as u64;
    while got < len {
        let n = s.read(&mut buf)?;
        if n == 0 {
            break;
        }
        got += n as u64;
    }
    let body = format!("got {got}");
    s.write_all(
        format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    )?;
    Ok(())
}

fn fmt<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or("-".to_string(), |v| v.to_string())
}

fn f1(v: Option<f64>) -> Option<String> {
    v.map(|v| format!("{v:.1}"))
}

fn render(a: &BodiesArgs, rows: &[Row], notes: &[String]) -> String {
    let mut s = format!(
        "# shard-bench bodies\n\n{} worker(s); {} stalled uploads of {} of {} bytes; one {} MiB \
         upload buffered (/buf) and streamed (/stream, proxy_request_buffering off).\n\n\
         | server | stalled: worker RSS per upload (KiB) | buffered MB/s | buffered peak RSS \
         growth (KiB) | streamed MB/s | streamed peak RSS growth (KiB) | temp files after runs \
         | after worker SIGKILL | after reload |\n|---|---|---|---|---|---|---|---|---|\n",
        a.workers, a.stalled, STALL_SENT, STALL_LENGTH, a.mbytes
    );
    for r in rows {
        s.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            r.name,
            fmt(f1(r.stalled_bytes_per_conn.map(|b| b / 1024.0))),
            fmt(f1(r.buffered_mb_s)),
            fmt(f1(r.buffered_peak_kib)),
            fmt(f1(r.streamed_mb_s)),
            fmt(f1(r.streamed_peak_kib)),
            fmt(r.files_after_runs),
            fmt(r.files_after_kill),
            fmt(r.files_after_reload),
        ));
    }
    if let (Some(sh), Some(ng)) = (rows.first(), rows.get(1)) {
        let ratio = |x: Option<f64>, y: Option<f64>| match (x, y) {
            (Some(x), Some(y)) if y > 0.0 => format!("{:.2}", x / y),
            _ => "-".to_string(),
        };
        s.push_str(&format!(
            "\nshard/nginx: stalled memory {}, buffered MB/s {}, streamed MB/s {}\n",
            ratio(sh.stalled_bytes_per_conn, ng.stalled_bytes_per_conn),
            ratio(sh.buffered_mb_s, ng.buffered_mb_s),
            ratio(sh.streamed_mb_s, ng.streamed_mb_s)
        ));
    }
    for n in notes {
        s.push_str(&format!("\nnote: {n}\n"));
    }
    s
}
