//! `shard-bench reload`: what reloads and a binary upgrade cost clients, shard and nginx side
//! by side (and shard with `worker_shutdown_drain off`, nginx's behaviour, as the control).
//!
//! Three kinds of client run in this process for the whole run, each a thread with blocking
//! sockets:
//! - **keep-alive**: `GET /ok` on one connection in a tight loop; a new connection only after
//!   `Connection: close`. A request that gets no answer (reset, end of stream, timeout) is a
//!   failed request, as wrk counts it, and the client reconnects.
//! - **close**: a new connection per request.
//! - **WebSocket**: a tunnel to an echo upstream in this process (`ws.rs`) through
//!   `location /ws/` (nginx's documented configuration with the `map` idiom); a message every
//!   `--ws-interval-ms`, checked when it comes back. A send or receive that fails is a broken
//!   tunnel (the client opens a new one).
//!
//! After a warm-up, the master gets `SIGHUP` every `--interval-ms` (`--reloads` times, the
//! same configuration), then a binary upgrade (`USR2`, then `WINCH` and `QUIT` to the old
//! master once the new one runs its workers). Every keep-alive request's latency is kept with
//! its start time: "during reload" is within `RELOAD_WINDOW` after a signal, "outside" is the
//! rest. It measures; it does not judge, except in `--smoke`, where it checks that the run
//! worked and that shard failed no request.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};

use crate::servers::{self, Kind, Running, Spec};
use crate::ws;

#[derive(clap::Args, Debug, Clone)]
pub struct ReloadArgs {
    /// Worker processes of each server.
    #[arg(long, default_value_t = 2)]
    workers: usize,
    /// Reloads (`SIGHUP`) per server.
    #[arg(long, default_value_t = 10)]
    reloads: usize,
    /// Milliseconds between two reloads.
    #[arg(long, default_value_t = 1000)]
    interval_ms: u64,
    /// Skip the binary upgrade after the reloads.
    #[arg(long)]
    no_upgrade: bool,
    /// Keep-alive clients.
    #[arg(long, default_value_t = 50)]
    keepalive: usize,
    /// Clients that open a connection per request.
    #[arg(long, default_value_t = 4)]
    close: usize,
    /// WebSocket clients.
    #[arg(long, default_value_t = 10)]
    websockets: usize,
    /// Milliseconds between two messages of a WebSocket client.
    #[arg(long, default_value_t = 20)]
    ws_interval_ms: u64,
    #[command(flatten)]
    peers: servers::Peers,
    /// Tiny numbers, to check that the bench works (CI).
    #[arg(long)]
    smoke: bool,
    /// Also write the report here.
    #[arg(long)]
    out: Option<PathBuf>,
}

/// A keep-alive request that started this soon after a signal counts as "during reload".
const RELOAD_WINDOW: Duration = Duration::from_millis(500);
/// Every client socket's read and write timeout: a request unanswered this long failed.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Default, Debug)]
struct Row {
    name: String,
    ok: u64,
    keepalive_failed: u64,
    close_failed: u64,
    ws_messages: u64,
    ws_broken: u64,
    /// Signals sent: reloads, plus one for the upgrade.
    signals: usize,
    /// Keep-alive latencies, milliseconds: during reload moments and outside them.
    during: Vec<f64>,
    outside: Vec<f64>,
    first_errors: Vec<String>,
}

/// What the client threads share.
#[derive(Default)]
struct Shared {
    stop: AtomicBool,
    /// (start since the run began, latency ms) of every answered keep-alive request.
    latencies: Mutex<Vec<(Duration, f64)>>,
    ok: std::sync::atomic::AtomicU64,
    keepalive_failed: std::sync::atomic::AtomicU64,
    close_failed: std::sync::atomic::AtomicU64,
    ws_messages: std::sync::atomic::AtomicU64,
    ws_broken: std::sync::atomic::AtomicU64,
    errors: Mutex<Vec<String>>,
}

impl Shared {
    fn error(&self, what: String) {
        let mut e = self.errors.lock().unwrap();
        if e.len() < 5 {
            e.push(what);
        }
    }
}

pub fn run(mut a: ReloadArgs) -> Result<()> {
    if a.smoke {
        a.reloads = a.reloads.min(2);
        a.interval_ms = a.interval_ms.min(300);
        a.keepalive = a.keepalive.min(4);
        a.close = a.close.min(1);
        a.websockets = a.websockets.min(2);
    }
    ensure!(a.workers >= 1, "--workers must be at least 1");
    crate::procfs::raise_nofile_limit();
    let mut notes = Vec::new();
    let (shard, nginx) = a.peers.binaries(&mut notes)?;
    let echo = ws::echo_server(false).context("WebSocket echo upstream")?;
    let mut fronts: Vec<(String, Kind, &str)> = vec![
        ("shard".into(), Kind::Shard(shard.clone()), ""),
        (
            "shard, worker_shutdown_drain off".into(),
            Kind::Shard(shard),
            "worker_shutdown_drain off;\n",
        ),
    ];
    if let Some(n) = nginx {
        fronts.push(("nginx".into(), Kind::Nginx(n), ""));
    }
    let mut rows = Vec::new();
    for (name, kind, main_extra) in &fronts {
        eprintln!("shard-bench: {name}: {} reloads", a.reloads);
        match front(kind, main_extra, echo, &a) {
            Ok(mut row) => {
                row.name = name.clone();
                rows.push(row);
            }
            Err(e) => notes.push(format!("{name}: not measured: {e:#}")),
        }
    }
    let report = render(&a, &rows, &notes);
    print!("{report}");
    servers::write_report(a.out.as_deref(), &report)?;
    if a.smoke {
        let s = rows
            .first()
            .filter(|r| r.name == "shard")
            .with_context(|| format!("smoke: shard was not measured: {notes:?}"))?;
        ensure!(
            s.ok > 0 && s.ws_messages > 0,
            "smoke: no traffic went through: {s:?}"
        );
        ensure!(
            s.keepalive_failed == 0 && s.close_failed == 0 && s.ws_broken == 0,
            "smoke: shard failed requests or broke tunnels across reloads: {s:?}"
        );
    }
    Ok(())
}

fn spec(a: &ReloadArgs, main_extra: &str, echo: SocketAddr) -> Spec {
    Spec {
        workers: a.workers,
        listen_opts: "reuseport".into(),
        main_extra: main_extra.to_string(),
        http_extra: "map $http_upgrade $connection_upgrade { default upgrade; '' close; }".into(),
        server_extra: format!(
            "location /ws/ {{ proxy_pass http://{echo}; proxy_http_version 1.1; \
             proxy_set_header Upgrade $http_upgrade; \
             proxy_set_header Connection $connection_upgrade; proxy_read_timeout 300s; }}"
        ),
        idle: a.keepalive + a.close + 2 * a.websockets + 64,
        tag: "reload".into(),
        // nginx honours `USR2` only when its parent changed since it started.
        detach: true,
        ..Default::default()
    }
}

fn front(kind: &Kind, main_extra: &str, echo: SocketAddr, a: &ReloadArgs) -> Result<Row> {
    let srv = servers::start_with(kind, &spec(a, main_extra, echo), |_| Ok(()))?;
    let res = measure(&srv, a);
    // After an upgrade the master is the new one, not our child: stop it by its pid file.
    if let Some(pid) = pid_file(&srv.dir) {
        if pid != srv.master_pid() {
            unsafe { libc::kill(pid, libc::SIGQUIT) };
            wait_until(Duration::from_secs(15), || !alive(pid));
        }
    }
    srv.stop();
    res
}

fn measure(srv: &Running, a: &ReloadArgs) -> Result<Row> {
    let addr = SocketAddr::from(([127, 0, 0, 1], srv.port));
    let shared = Arc::new(Shared::default());
    let t0 = Instant::now();
    let mut threads = Vec::new();
    for _ in 0..a.keepalive {
        let sh = shared.clone();
        threads.push(std::thread::spawn(move || keepalive_client(addr, &sh, t0)));
    }
    for _ in 0..a.close {
        let sh = shared.clone();
        threads.push(std::thread::spawn(move || close_client(addr, &sh)));
    }
    for _ in 0..a.websockets {
        let sh = shared.clone();
        let every = Duration::from_millis(a.ws_interval_ms);
        threads.push(std::thread::spawn(move || ws_client(addr, &sh, every)));
    }
    let interval = Duration::from_millis(a.interval_ms);
    std::thread::sleep(interval);
    let mut signals = Vec::new();
    let mut master = srv.master_pid();
    for _ in 0..a.reloads {
        signals.push(t0.elapsed());
        unsafe { libc::kill(master, libc::SIGHUP) };
        std::thread::sleep(interval);
    }
    let mut result = Ok(());
    if !a.no_upgrade {
        signals.push(t0.elapsed());
        match upgrade(srv, master, a.workers) {
            Ok(new) => master = new,
            Err(e) => result = Err(e),
        }
        std::thread::sleep(interval);
    }
    let _ = master;
    shared.stop.store(true, Relaxed);
    for t in threads {
        let _ = t.join();
    }
    result?;
    let mut row = Row {
        ok: shared.ok.load(Relaxed),
        keepalive_failed: shared.keepalive_failed.load(Relaxed),
        close_failed: shared.close_failed.load(Relaxed),
        ws_messages: shared.ws_messages.load(Relaxed),
        ws_broken: shared.ws_broken.load(Relaxed),
        signals: signals.len(),
        first_errors: shared.errors.lock().unwrap().clone(),
        ..Default::default()
    };
    for &(at, ms) in shared.latencies.lock().unwrap().iter() {
        let during = signals.iter().any(|&s| at >= s && at < s + RELOAD_WINDOW);
        if during {
            row.during.push(ms);
        } else {
            row.outside.push(ms);
        }
    }
    Ok(row)
}

/// How long a binary upgrade may take to have its new master and workers running.
const UPGRADE_WAIT: Duration = Duration::from_secs(30);

/// `USR2` to `master`; once the new master runs `workers` workers, `WINCH` and `QUIT` to the
/// old one. Returns the new master's pid.
fn upgrade(srv: &Running, master: i32, workers: usize) -> Result<i32> {
    unsafe { libc::kill(master, libc::SIGUSR2) };
    let mut new = None;
    // Generous: a debug build starting beside a loaded test suite (valgrind runs included)
    // took more than 10 s once.
    wait_until(UPGRADE_WAIT, || {
        new = pid_file(&srv.dir).filter(|&p| p != master && alive(p));
        new.is_some_and(|p| children(p) >= workers)
    });
    let new = new.filter(|&p| children(p) >= workers).with_context(|| {
        format!(
            "binary upgrade: no new master with its workers within {} s",
            UPGRADE_WAIT.as_secs()
        )
    })?;
    unsafe { libc::kill(master, libc::SIGWINCH) };
    unsafe { libc::kill(master, libc::SIGQUIT) };
    Ok(new)
}

pub(crate) fn pid_file(dir: &Path) -> Option<i32> {
    std::fs::read_to_string(dir.join("logs/bench.pid"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

pub(crate) fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        !s.rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z')
    })
}

fn children(pid: i32) -> usize {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .map_or(0, |t| t.split_whitespace().count())
}

pub(crate) fn wait_until(timeout: Duration, mut f: impl FnMut() -> bool) {
    let end = Instant::now() + timeout;
    while !f() && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn connect(addr: SocketAddr) -> std::io::Result<TcpStream> {
    let s = TcpStream::connect_timeout(&addr, CLIENT_TIMEOUT)?;
    s.set_read_timeout(Some(CLIENT_TIMEOUT))?;
    s.set_write_timeout(Some(CLIENT_TIMEOUT))?;
    s.set_nodelay(true)?;
    Ok(s)
}

/// One `GET /ok` on `s`: `Ok(keep)` when `200 OK` came whole (`keep`: the connection stays).
fn exchange(s: &mut TcpStream, close: bool) -> std::io::Result<bool> {
    let req: &[u8] = if close {
        b"GET /ok HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n"
    } else {
        b"GET /ok HTTP/1.1\r\nHost: bench\r\n\r\n"
    };
    s.write_all(req)?;
    let mut buf = Vec::with_capacity(512);
    let mut chunk = [0u8; 1024];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            if buf.len() >= end + 4 + len {
                if !head.starts_with("http/1.1 200") {
                    return Err(std::io::Error::other(format!(
                        "answered {}",
                        head.lines().next().unwrap_or("")
                    )));
                }
                return Ok(!head.contains("\r\nconnection: close"));
            }
        }
        let n = s.read(&mut chunk)?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

fn keepalive_client(addr: SocketAddr, sh: &Shared, t0: Instant) {
    let mut conn: Option<TcpStream> = None;
    let mut lat = Vec::new();
    while !sh.stop.load(Relaxed) {
        let s = match conn.as_mut() {
            Some(s) => s,
            None => match connect(addr) {
                Ok(s) => conn.insert(s),
                Err(e) => {
                    sh.keepalive_failed.fetch_add(1, Relaxed);
                    sh.error(format!("keep-alive connect: {e}"));
                    continue;
                }
            },
        };
        let start = Instant::now();
        match exchange(s, false) {
            Ok(keep) => {
                sh.ok.fetch_add(1, Relaxed);
                lat.push((start - t0, start.elapsed().as_secs_f64() * 1000.0));
                if !keep {
                    conn = None;
                }
            }
            Err(e) => {
                sh.keepalive_failed.fetch_add(1, Relaxed);
                sh.error(format!("keep-alive: {e}"));
                conn = None;
            }
        }
    }
    sh.latencies.lock().unwrap().extend(lat);
}

fn close_client(addr: SocketAddr, sh: &Shared) {
    while !sh.stop.load(Relaxed) {
        match connect(addr).and_then(|mut s| exchange(&mut s, true)) {
            Ok(_) => {
                sh.ok.fetch_add(1, Relaxed);
            }
            Err(e) => {
                sh.close_failed.fetch_add(1, Relaxed);
                sh.error(format!("close: {e}"));
            }
        }
    }
}

fn ws_client(addr: SocketAddr, sh: &Shared, every: Duration) {
    let mut conn: Option<ws::Conn> = None;
    let mut n = 0u64;
    while !sh.stop.load(Relaxed) {
        let c = match conn.as_mut() {
            Some(c) => c,
            None => match ws::connect(addr, "/ws/bench", "", CLIENT_TIMEOUT) {
                Ok((_, Some(c))) => conn.insert(c),
                Ok((hs, None)) => {
                    sh.ws_broken.fetch_add(1, Relaxed);
                    sh.error(format!("websocket handshake answered {}", hs.status));
                    std::thread::sleep(every);
                    continue;
                }
                Err(e) => {
                    sh.ws_broken.fetch_add(1, Relaxed);
                    sh.error(format!("websocket handshake: {e}"));
                    std::thread::sleep(every);
                    continue;
                }
            },
        };
        n += 1;
        let msg = format!("message {n}");
        let echoed = c
            .send(ws::OP_TEXT, msg.as_bytes())
            .and_then(|()| c.recv())
            .and_then(|f| {
                if f.payload == msg.as_bytes() {
                    Ok(())
                } else {
                    Err(std::io::Error::other("wrong echo"))
                }
            });
        match echoed {
            Ok(()) => {
                sh.ws_messages.fetch_add(1, Relaxed);
            }
            Err(e) => {
                sh.ws_broken.fetch_add(1, Relaxed);
                sh.error(format!("websocket: {e}"));
                conn = None;
            }
        }
        std::thread::sleep(every);
    }
    if let Some(c) = conn {
        let _ = c.close();
    }
}

fn percentile(v: &mut [f64], p: f64) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    Some(v[i])
}

fn ms(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v:.2}"))
}

fn render(a: &ReloadArgs, rows: &[Row], notes: &[String]) -> String {
    let mut s = String::new();
    s.push_str(&format!(
        "# shard-bench reload\n\n{} workers; {} keep-alive clients, {} connection-per-request \
         clients, {} WebSocket clients (a message every {} ms); {} reloads {} ms apart{}. \
         \"During reload\": keep-alive requests that started within {} ms after a signal.\n\n",
        a.workers,
        a.keepalive,
        a.close,
        a.websockets,
        a.ws_interval_ms,
        a.reloads,
        a.interval_ms,
        if a.no_upgrade {
            ""
        } else {
            ", then a binary upgrade"
        },
        RELOAD_WINDOW.as_millis()
    ));
    s.push_str(
        "| server | requests ok | failed keep-alive | failed new-conn | failed per signal | \
         WebSocket messages | broken tunnels | p50 / p99 / max ms outside reloads | \
         p50 / p99 / max ms during reloads |\n|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        let mut out = r.outside.clone();
        let mut dur = r.during.clone();
        let failed = r.keepalive_failed + r.close_failed;
        s.push_str(&format!(
            "| {} | {} | {} | {} | {:.1} | {} | {} | {} / {} / {} | {} / {} / {} |\n",
            r.name,
            r.ok,
            r.keepalive_failed,
            r.close_failed,
            failed as f64 / r.signals.max(1) as f64,
            r.ws_messages,
            r.ws_broken,
            ms(percentile(&mut out, 0.5)),
            ms(percentile(&mut out, 0.99)),
            ms(percentile(&mut out, 1.0)),
            ms(percentile(&mut dur, 0.5)),
            ms(percentile(&mut dur, 0.99)),
            ms(percentile(&mut dur, 1.0)),
        ));
    }
    for r in rows.iter().filter(|r| !r.first_errors.is_empty()) {
        s.push_str(&format!(
            "\n{}: first errors: {}\n",
            r.name,
            r.first_errors.join("; ")
        ));
    }
    for n in notes {
        s.push_str(&format!("\nNote: {n}\n"));
    }
    s
}
