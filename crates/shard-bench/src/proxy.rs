//! `shard-bench proxy`: shard and nginx as reverse proxies, side by side, in one run.
//!
//! HTTP: one backend, a shard with one worker answering `location = /ok { return 200 "OK"; }`,
//! serves both fronts in turn. Each front (`--workers` workers) proxies `/ok` to it through
//! `upstream backend { keepalive 32; }` with `proxy_http_version 1.1` and `Connection ""`, so
//! both sides of the proxy are keep-alive. What is measured is the front alone: its workers'
//! system calls (`strace -c -f`) and CPU time per proxied request. A proxied request is one the
//! backend counted (`shard_status`), so an error page of the front never counts as throughput.
//! The backend's `accepted` before and after shows how many upstream connections the front
//! opened, i.e. whether its keep-alive pool is reused.
//!
//! Stream: a source upstream (writes a fixed number of bytes to each connection, then closes)
//! and a sink upstream (reads the connection's share, then answers `done N` and closes) run as
//! threads of this process. The client never half-closes: nginx's stream proxy ends the whole
//! session on the client's FIN unless `proxy_half_close on`, and this measures throughput, not
//! half-close;
//! each front relays to them with `stream { server { proxy_pass ...; proxy_buffer_size 16k; } }`
//! and the client moves `--mbytes` MiB each way over a few parallel connections.
//!
//! Deliberately not here: request bodies, TLS, latency percentiles (run `shard-bench load`
//! against a front for those), and the backend's own cost, which is the same for both fronts.

use std::cell::Cell;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, ensure, Context, Result};

use crate::procfs;
use crate::servers::{self, Kind, Running, Spec, StatusTotals};
use crate::Tools;

/// Parallel client connections of the stream relay, each moving 1/4 of `--mbytes`.
const STREAM_CONNECTIONS: usize = 4;
/// The client's and the upstreams' buffer for the stream relay.
const STREAM_CHUNK_BYTES: usize = 256 * 1024;
/// A stalled relay fails the round instead of hanging the bench.
const STREAM_TIMEOUT: Duration = Duration::from_secs(60);
/// `keepalive` of the fronts' upstream block. Its `keepalive_requests` is raised from nginx's
/// default of 1000 (shard's is the same) so that, as on the client side, no run closes an
/// upstream connection on its own and the connections opened are the ones the pool lacked.
const UPSTREAM_KEEPALIVE: usize = 32;

#[derive(clap::Args, Debug, Clone)]
pub struct ProxyArgs {
    /// Worker processes of each front (the backend always has one).
    #[arg(long, default_value_t = 2)]
    workers: usize,
    /// Seconds per load run.
    #[arg(long, default_value_t = 5)]
    duration: u64,
    /// Concurrent client connections per load run.
    #[arg(long, default_value_t = 50)]
    connections: usize,
    /// MiB relayed by the stream proxy in each direction, split over 4 connections.
    #[arg(long, default_value_t = 256)]
    mbytes: u64,
    /// `--shard`, `--nginx`, `--no-nginx`.
    #[command(flatten)]
    peers: crate::servers::Peers,
    /// Use the built-in load generator even when wrk is installed.
    #[arg(long)]
    builtin_load: bool,
    /// Tiny numbers, to check that the bench works (CI).
    #[arg(long)]
    smoke: bool,
    /// Also write the report here.
    #[arg(long)]
    out: Option<PathBuf>,
}

impl ProxyArgs {
    /// Stream rounds per direction; the report shows the median.
    fn rounds(&self) -> usize {
        if self.smoke {
            1
        } else {
            3
        }
    }

    fn bytes_per_stream_connection(&self) -> u64 {
        self.mbytes * 1024 * 1024 / STREAM_CONNECTIONS as u64
    }
}

/// One front's results.
#[derive(Default, Debug)]
struct Row {
    name: String,
    rps: Option<f64>,
    syscalls_per_req: Option<f64>,
    cpu_us_per_req: Option<f64>,
    /// Upstream connections the front opened during the whole HTTP part.
    backend_conns: Option<u64>,
    /// Requests the backend served for the front during the whole HTTP part.
    proxied: Option<u64>,
    down_mb_s: Option<f64>,
    up_mb_s: Option<f64>,
}

pub fn run(mut a: ProxyArgs) -> Result<()> {
    if a.smoke {
        a.duration = 1;
        a.connections = a.connections.min(4);
        a.mbytes = a.mbytes.min(4);
    }
    ensure!(a.workers >= 1, "--workers must be at least 1");
    ensure!(a.connections >= 1, "--connections must be at least 1");
    ensure!(
        (1..=1 << 20).contains(&a.mbytes),
        "--mbytes must be between 1 and 1048576"
    );
    procfs::raise_nofile_limit();
    let shard = crate::shard_binary(a.peers.shard.as_deref())?;
    let tools = Tools::find(&a.peers, a.builtin_load);
    let mut notes = tools.notes.clone();

    let backend = Backend::start(&shard)?;
    let upstreams = Upstreams::start(a.bytes_per_stream_connection())?;

    let mut kinds = vec![Kind::Shard(shard)];
    if let Some(n) = &tools.nginx {
        kinds.push(Kind::Nginx(n.clone()));
    }
    let mut rows = Vec::new();
    for kind in &kinds {
        let name = kind.name();
        let mut row = Row {
            name: name.to_string(),
            ..Default::default()
        };
        eprintln!(
            "shard-bench: {name}: HTTP proxy, {} workers, {} connections",
            a.workers, a.connections
        );
        if let Err(e) = http_front(kind, &backend, &tools, &a, &mut row, &mut notes, false) {
            notes.push(format!("{name}: HTTP proxy not measured: {}", one_line(&e)));
        }
        // The same through `proxy_pass https://`: TLS to the backend on kept-alive
        // connections (the handshakes are a few; the records are per request).
        let mut tls_row = Row {
            name: format!("{name}, https upstream"),
            ..Default::default()
        };
        eprintln!("shard-bench: {name}: HTTP proxy to an https:// upstream");
        if let Err(e) = http_front(kind, &backend, &tools, &a, &mut tls_row, &mut notes, true) {
            notes.push(format!(
                "{name}: HTTP proxy to https not measured: {}",
                one_line(&e)
            ));
        }
        eprintln!(
            "shard-bench: {name}: stream relay, {} MiB each way",
            a.mbytes
        );
        let load_module = match kind {
            Kind::Shard(_) => Ok(String::new()),
            Kind::Nginx(bin) => nginx_stream_module(bin),
        };
        match load_module {
            Ok(m) => {
                if let Err(e) = stream_front(kind, &m, &upstreams, &a, &mut row) {
                    let e = one_line(&e);
                    notes.push(if e.contains("unknown directive \"stream\"") {
                        format!("{name}: no stream module: {e}")
                    } else {
                        format!("{name}: stream relay not measured: {e}")
                    });
                }
            }
            Err(why) => notes.push(format!("{name}: no stream module: {why}")),
        }
        rows.push(row);
        rows.push(tls_row);
    }
    let _ = std::fs::remove_dir_all(&backend.pems);
    backend.srv.stop();
    for n in &notes[tools.notes.len()..] {
        eprintln!("shard-bench: {n}");
    }

    let report = render(&a, &rows, &notes);
    print!("{report}");
    crate::servers::write_report(a.out.as_deref(), &report)
}

// ---------------------------------------------------------------------------------------------
// HTTP

/// The shared backend (plain and TLS listeners), and how often the bench itself read its
/// status.
struct Backend {
    srv: Running,
    /// The backend's `listen ... ssl` (an ECDSA P-256 certificate made at run time).
    tls_port: u16,
    reads: Cell<u64>,
    pems: PathBuf,
}

impl Backend {
    fn start(shard: &Path) -> Result<Backend> {
        let pems = std::env::temp_dir().join(format!("shard-bench-proxy-{}", std::process::id()));
        std::fs::create_dir_all(&pems)?;
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
        let cert = rcgen::CertificateParams::new(vec!["backend".to_string()])?.self_signed(&key)?;
        std::fs::write(pems.join("cert.pem"), cert.pem())?;
        std::fs::write(pems.join("key.pem"), key.serialize_pem())?;
        let tls_port = servers::free_port()?;
        let spec = Spec {
            workers: 1,
            listen_opts: String::new(),
            events: String::new(),
            server_extra: format!(
                "listen 127.0.0.1:{tls_port} ssl; ssl_certificate {}; ssl_certificate_key {};",
                pems.join("cert.pem").display(),
                pems.join("key.pem").display()
            ),
            ok: None,
            http_extra: String::new(),
            stream: None,
            main_extra: String::new(),
            idle: 0,
            tag: "proxy-backend".into(),
            detach: false,
        };
        let srv = servers::start_with(&Kind::Shard(shard.to_path_buf()), &spec, |_| Ok(()))
            .context("starting the backend (shard, 1 worker)")?;
        Ok(Backend {
            srv,
            tls_port,
            reads: Cell::new(0),
            pems,
        })
    }

    /// `accepted` and `requests` less the bench's own status reads (each is one connection and
    /// one request), so that differences count only what the front sent.
    fn totals(&self) -> Result<StatusTotals> {
        let reads = self.reads.get() + 1;
        self.reads.set(reads);
        let t = self.srv.status_totals()?;
        Ok(StatusTotals {
            accepted: t.accepted.saturating_sub(reads),
            requests: t.requests.saturating_sub(reads),
        })
    }
}

fn http_front(
    kind: &Kind,
    backend: &Backend,
    tools: &Tools,
    a: &ProxyArgs,
    row: &mut Row,
    notes: &mut Vec<String>,
    tls: bool,
) -> Result<()> {
    let (scheme, port) = if tls {
        ("https", backend.tls_port)
    } else {
        ("http", backend.srv.port)
    };
    let spec = Spec {
        workers: a.workers,
        listen_opts: "reuseport".into(),
        events: String::new(),
        server_extra: String::new(),
        ok: Some(format!(
            "proxy_pass {scheme}://backend; proxy_http_version 1.1; proxy_set_header Connection \"\";"
        )),
        http_extra: format!(
            "upstream backend {{ server 127.0.0.1:{port}; keepalive {UPSTREAM_KEEPALIVE}; \
             keepalive_requests 1000000; }}"
        ),
        stream: None,
        main_extra: String::new(),
        idle: 0,
        tag: "proxy-http".into(),
        detach: false,
    };
    let front = servers::start_with(kind, &spec, |_| Ok(())).context("starting the front")?;
    let res = measure_http(&front, backend, tools, a, row, notes);
    front.stop();
    res
}

fn measure_http(
    front: &Running,
    backend: &Backend,
    tools: &Tools,
    a: &ProxyArgs,
    row: &mut Row,
    notes: &mut Vec<String>,
) -> Result<()> {
    let d = Duration::from_secs(a.duration);
    let wrk = tools.wrk.as_deref();
    let b0 = backend.totals()?;
    // One proxied answer first: a load on a front that answers 502 would measure error pages.
    proxied_ok(front.port)?;

    if let Some(strace) = &tools.strace {
        let pids = front.worker_pids()?;
        let tracer = procfs::Strace::attach(strace, &pids)?;
        let r0 = backend.totals()?.requests;
        let load = crate::run_load(front.port, "/ok", wrk, a.connections, d, true);
        let r1 = backend.totals();
        // Detach before any error is returned: a tracer left behind slows the next front.
        let calls = tracer.finish()?;
        load?;
        let proxied = r1?.requests.saturating_sub(r0).max(1);
        row.syscalls_per_req = Some(calls as f64 / proxied as f64);
    }

    let pids = front.worker_pids()?;
    let f0 = front.requests()?;
    let cpu0 = procfs::cpu_ticks(&pids)?;
    let r0 = backend.totals()?.requests;
    let t0 = Instant::now();
    crate::run_load(front.port, "/ok", wrk, a.connections, d, true)?;
    let secs = t0.elapsed().as_secs_f64();
    let r1 = backend.totals()?.requests;
    let cpu1 = procfs::cpu_ticks(&pids)?;
    let f1 = front.requests()?;
    let proxied = r1.saturating_sub(r0);
    ensure!(proxied > 0, "the backend served no request during the load");
    row.cpu_us_per_req =
        Some((cpu1 - cpu0) as f64 * 1e6 / procfs::ticks_per_sec() / proxied as f64);
    row.rps = Some(proxied as f64 / secs);
    // The front counts its own stub_status read (1) besides the proxied requests.
    let unproxied = f1.saturating_sub(f0).saturating_sub(1 + proxied);
    if unproxied > 1 {
        notes.push(format!(
            "{}: {unproxied} requests answered by the front without reaching the backend (errors)",
            row.name
        ));
    }

    let b1 = backend.totals()?;
    row.backend_conns = Some(b1.accepted.saturating_sub(b0.accepted));
    row.proxied = Some(b1.requests.saturating_sub(b0.requests));
    Ok(())
}

/// `GET /ok` through the front answers 200 with the backend's body.
fn proxied_ok(port: u16) -> Result<()> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    s.write_all(b"GET /ok HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n")?;
    let mut resp = Vec::new();
    s.read_to_end(&mut resp)
        .context("reading the proxied response")?;
    let text = String::from_utf8_lossy(&resp);
    ensure!(
        text.starts_with("HTTP/1.1 200") && text.ends_with("\r\n\r\nOK"),
        "GET /ok through the front did not return the backend's 200 \"OK\": {:?}",
        text.chars().take(300).collect::<String>()
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Stream

/// The relay's upstreams, threads of this process: a source and a sink.
struct Upstreams {
    source_port: u16,
    sink_port: u16,
    bytes_per_conn: u64,
}

impl Upstreams {
    fn start(bytes_per_conn: u64) -> Result<Upstreams> {
        let source = TcpListener::bind("127.0.0.1:0")?;
        let sink = TcpListener::bind("127.0.0.1:0")?;
        let up = Upstreams {
            source_port: source.local_addr()?.port(),
            sink_port: sink.local_addr()?.port(),
            bytes_per_conn,
        };
        // The accept loops live as long as the process; each connection gets its own thread
        // (a handful per round).
        thread::spawn(move || {
            for s in source.incoming().flatten() {
                thread::spawn(move || {
                    let _ = write_n(&s, bytes_per_conn);
                });
            }
        });
        thread::spawn(move || {
            for mut s in sink.incoming().flatten() {
                thread::spawn(move || {
                    if let Ok(n) = read_up_to(&s, bytes_per_conn) {
                        let _ = s.write_all(format!("done {n}").as_bytes());
                    }
                });
            }
        });
        Ok(up)
    }
}

fn write_n(mut s: &TcpStream, n: u64) -> std::io::Result<()> {
    s.set_write_timeout(Some(STREAM_TIMEOUT))?;
    let buf = vec![0x5a_u8; STREAM_CHUNK_BYTES];
    let mut left = n;
    while left > 0 {
        let k = left.min(buf.len() as u64) as usize;
        s.write_all(&buf[..k])?;
        left -= k as u64;
    }
    Ok(())
}

/// Reads until EOF or until `max` bytes came; returns the count.
fn read_up_to(mut s: &TcpStream, max: u64) -> std::io::Result<u64> {
    s.set_read_timeout(Some(STREAM_TIMEOUT))?;
    let mut buf = vec![0u8; STREAM_CHUNK_BYTES];
    let mut n = 0;
    while n < max {
        match s.read(&mut buf)? {
            0 => break,
            k => n += k as u64,
        }
    }
    Ok(n)
}

/// The `load_module` line that nginx needs for `stream {}` (empty when the module is built
/// in), or why it has no stream module.
fn nginx_stream_module(bin: &Path) -> Result<String, String> {
    let out = Command::new(bin)
        .arg("-V")
        .output()
        .map_err(|e| format!("{} -V: {e}", bin.display()))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    stream_module_line(&text, |so| so.is_file())
}

/// `stream_module`'s decision from the text of `nginx -V`; `installed` says whether a module
/// file exists.
fn stream_module_line(v: &str, installed: impl Fn(&Path) -> bool) -> Result<String, String> {
    let args: Vec<&str> = v.split_whitespace().collect();
    if args.contains(&"--with-stream") {
        return Ok(String::new());
    }
    if args.contains(&"--with-stream=dynamic") {
        let dir = args
            .iter()
            .find_map(|a| a.strip_prefix("--modules-path="))
            .unwrap_or("/usr/lib/nginx/modules");
        let so = Path::new(dir).join("ngx_stream_module.so");
        if installed(&so) {
            return Ok(format!("load_module {};\n", so.display()));
        }
        return Err(format!(
            "built --with-stream=dynamic but {} is not installed \
             (install: apt-get install libnginx-mod-stream, or nginx-full)",
            so.display()
        ));
    }
    Err(
        "built without --with-stream (install: apt-get install nginx-full, \
         or libnginx-mod-stream)"
            .into(),
    )
}

fn stream_front(
    kind: &Kind,
    load_module: &str,
    up: &Upstreams,
    a: &ProxyArgs,
    row: &mut Row,
) -> Result<()> {
    let down_port = servers::free_port()?;
    let up_port = servers::free_port()?;
    let spec = Spec {
        workers: a.workers,
        listen_opts: "reuseport".into(),
        events: String::new(),
        server_extra: String::new(),
        ok: None,
        http_extra: String::new(),
        stream: Some(format!(
            "    server {{ listen 127.0.0.1:{down_port}; proxy_pass 127.0.0.1:{}; proxy_buffer_size 16k; }}\n\
             \x20   server {{ listen 127.0.0.1:{up_port}; proxy_pass 127.0.0.1:{}; proxy_buffer_size 16k; }}",
            up.source_port, up.sink_port
        )),
        main_extra: load_module.to_string(),
        idle: 0,
        tag: "proxy-stream".into(),
        detach: false,
    };
    let front = servers::start_with(kind, &spec, |_| Ok(())).context("starting the front")?;
    let mut measure = || -> Result<()> {
        row.down_mb_s = Some(median_mb_s(a.rounds(), || {
            relay(down_port, up.bytes_per_conn, Direction::Down)
        })?);
        row.up_mb_s = Some(median_mb_s(a.rounds(), || {
            relay(up_port, up.bytes_per_conn, Direction::Up)
        })?);
        Ok(())
    };
    let res = measure();
    front.stop();
    res
}

#[derive(Clone, Copy)]
enum Direction {
    /// The source upstream writes, the client reads.
    Down,
    /// The client writes, the sink upstream reads.
    Up,
}

fn median_mb_s(rounds: usize, mut round: impl FnMut() -> Result<f64>) -> Result<f64> {
    let mut v = (0..rounds).map(|_| round()).collect::<Result<Vec<f64>>>()?;
    v.sort_by(f64::total_cmp);
    Ok(v[v.len() / 2])
}

/// One round: `STREAM_CONNECTIONS` parallel connections through the relay at `port`, each
/// moving `per_conn` bytes in `dir`; returns MB/s (10^6 bytes) from the first connect to the
/// last byte.
fn relay(port: u16, per_conn: u64, dir: Direction) -> Result<f64> {
    let t0 = Instant::now();
    let clients: Vec<_> = (0..STREAM_CONNECTIONS)
        .map(|_| {
            thread::spawn(move || match dir {
                Direction::Down => download(port, per_conn),
                Direction::Up => upload(port, per_conn),
            })
        })
        .collect();
    for c in clients {
        c.join()
            .map_err(|_| anyhow!("stream client thread panicked"))??;
    }
    let secs = t0.elapsed().as_secs_f64();
    Ok((per_conn * STREAM_CONNECTIONS as u64) as f64 / secs / 1e6)
}

fn download(port: u16, per_conn: u64) -> Result<()> {
    let s = TcpStream::connect(("127.0.0.1", port))?;
    // One byte more than expected would show a relay that duplicates data.
    let n = read_up_to(&s, per_conn + 1).context("reading through the relay")?;
    if n != per_conn {
        bail!("the relay delivered {n} of {per_conn} bytes");
    }
    Ok(())
}

fn upload(port: u16, per_conn: u64) -> Result<()> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    write_n(&s, per_conn).context("writing through the relay")?;
    s.set_read_timeout(Some(STREAM_TIMEOUT))?;
    let mut reply = String::new();
    s.read_to_string(&mut reply)
        .context("reading the sink's reply")?;
    if reply != format!("done {per_conn}") {
        bail!("the sink answered {reply:?} for {per_conn} bytes sent");
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Report

/// An error with its causes on one line, for a note (a server's stderr ends in a newline).
fn one_line(e: &anyhow::Error) -> String {
    format!("{e:#}").trim_end().replace('\n', " / ")
}

fn fmt(v: Option<f64>, digits: usize) -> String {
    v.map_or("-".to_string(), |x| format!("{x:.digits$}"))
}

/// One column of a row, for the shard/nginx ratios.
type Metric = fn(&Row) -> Option<f64>;

fn render(a: &ProxyArgs, rows: &[Row], notes: &[String]) -> String {
    let mut s = String::new();
    s.push_str(&format!(
        "# shard-bench proxy: {} front workers, {} connections, {} s per run; stream {} MiB each way over {} connections, median of {}{}\n\n",
        a.workers,
        a.connections,
        a.duration,
        a.mbytes,
        STREAM_CONNECTIONS,
        a.rounds(),
        if a.smoke { " (smoke: numbers are not meaningful)" } else { "" }
    ));
    s.push_str(&format!(
        "Backend: shard, 1 worker, `location = /ok {{ return 200 \"OK\"; }}`, the same for both fronts. \
         Fronts: `upstream backend {{ keepalive {UPSTREAM_KEEPALIVE}; keepalive_requests 1000000; }}`, `proxy_http_version 1.1`, \
         `proxy_set_header Connection \"\"`; stream: `proxy_buffer_size 16k`.\n\n"
    ));
    s.push_str("| server | proxied req/s | syscalls/proxied req | worker CPU µs/req | backend connections opened | stream MB/s down | stream MB/s up |\n");
    s.push_str("|---|---|---|---|---|---|---|\n");
    for r in rows {
        s.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} |\n",
            r.name,
            fmt(r.rps, 0),
            fmt(r.syscalls_per_req, 3),
            fmt(r.cpu_us_per_req, 2),
            r.backend_conns.map_or("-".to_string(), |n| n.to_string()),
            fmt(r.down_mb_s, 0),
            fmt(r.up_mb_s, 0),
        ));
    }
    s.push('\n');
    for r in rows {
        if let (Some(c), Some(p)) = (r.backend_conns, r.proxied) {
            s.push_str(&format!(
                "{}: {c} backend connections opened for {p} proxied requests (all runs).\n",
                r.name
            ));
        }
    }
    // shard against nginx, for each way to the backend.
    let pairs: Vec<(&Row, &Row)> = rows
        .iter()
        .filter_map(|x| {
            let twin = x.name.strip_prefix("shard")?;
            let y = rows
                .iter()
                .find(|y| y.name.strip_prefix("nginx") == Some(twin))?;
            Some((x, y))
        })
        .collect();
    for (x, y) in pairs {
        let ratios: [(&str, Metric); 5] = [
            ("Proxied req/s", |r| r.rps),
            ("Syscalls per proxied request", |r| r.syscalls_per_req),
            ("Worker CPU per proxied request", |r| r.cpu_us_per_req),
            ("Stream MB/s down", |r| r.down_mb_s),
            ("Stream MB/s up", |r| r.up_mb_s),
        ];
        let mut first = true;
        for (what, get) in ratios {
            if let (Some(a), Some(b)) = (get(x), get(y)) {
                if first {
                    s.push('\n');
                    first = false;
                }
                s.push_str(&format!(
                    "{what}, {}/{}: {:.2}\n",
                    x.name,
                    y.name,
                    a / b.max(f64::MIN_POSITIVE)
                ));
            }
        }
    }
    for n in notes {
        s.push_str(&format!("\nnote: {n}\n"));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stream_module_is_found_from_nginx_v() {
        let debian = "nginx version: nginx/1.22.1\nconfigure arguments: --with-cc-opt=-O2 \
                      --modules-path=/usr/lib/nginx/modules --with-stream=dynamic \
                      --with-stream_ssl_module";
        assert_eq!(
            stream_module_line(debian, |_| true).unwrap(),
            "load_module /usr/lib/nginx/modules/ngx_stream_module.so;\n"
        );
        let missing = stream_module_line(debian, |_| false).unwrap_err();
        assert!(missing.contains("libnginx-mod-stream"), "{missing}");
        let built_in = "configure arguments: --with-stream --with-stream_ssl_module";
        assert_eq!(stream_module_line(built_in, |_| false).unwrap(), "");
        // `--with-stream_ssl_module` alone is not the stream module.
        let none = "configure arguments: --with-http_ssl_module --with-stream_ssl_module";
        assert!(stream_module_line(none, |_| true).is_err());
    }

    #[test]
    fn the_report_has_a_row_per_server_and_the_ratios() {
        let a = ProxyArgs {
            workers: 2,
            duration: 5,
            connections: 50,
            mbytes: 256,
            peers: Default::default(),
            builtin_load: false,
            smoke: false,
            out: None,
        };
        let rows = [
            Row {
                name: "shard".into(),
                rps: Some(40000.0),
                syscalls_per_req: Some(4.0),
                cpu_us_per_req: Some(10.0),
                backend_conns: Some(50),
                proxied: Some(400000),
                down_mb_s: Some(1000.0),
                up_mb_s: None,
            },
            Row {
                name: "nginx".into(),
                rps: Some(20000.0),
                syscalls_per_req: None,
                cpu_us_per_req: Some(20.0),
                backend_conns: Some(60),
                proxied: Some(200000),
                down_mb_s: Some(500.0),
                up_mb_s: Some(400.0),
            },
        ];
        let r = render(&a, &rows, &["nginx: no stream module".into()]);
        assert!(
            r.contains("| shard | 40000 | 4.000 | 10.00 | 50 | 1000 | - |"),
            "{r}"
        );
        // The https-upstream rows pair with each other, not with the plain ones.
        let row = |name: &str, rps: f64| Row {
            name: name.into(),
            rps: Some(rps),
            ..Default::default()
        };
        let four = [
            row("shard", 10.0),
            row("shard, https upstream", 3000.0),
            row("nginx", 10.0),
            row("nginx, https upstream", 1000.0),
        ];
        let r4 = render(&a, &four, &[]);
        assert!(r4.contains("Proxied req/s, shard/nginx: 1.00"), "{r4}");
        assert!(
            r4.contains("Proxied req/s, shard, https upstream/nginx, https upstream: 3.00"),
            "{r4}"
        );
        assert!(
            r.contains("| nginx | 20000 | - | 20.00 | 60 | 500 | 400 |"),
            "{r}"
        );
        assert!(r.contains("Proxied req/s, shard/nginx: 2.00"), "{r}");
        assert!(
            r.contains("Worker CPU per proxied request, shard/nginx: 0.50"),
            "{r}"
        );
        assert!(
            !r.contains("Syscalls per proxied request, shard/nginx"),
            "{r}"
        );
        assert!(r.contains("note: nginx: no stream module"), "{r}");
    }
}
