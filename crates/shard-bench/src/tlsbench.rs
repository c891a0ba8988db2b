//! `shard-bench tls`: TLS termination, shard and nginx (Debian's, with OpenSSL) side by side
//! on the same ECDSA P-256 certificate (made at run time with `rcgen`) and the same workers.
//!
//! Three loads, each for `--duration` seconds from `--clients` threads in this process (a
//! rustls client; the same client for both servers, so its own cost weighs the same):
//! - **full handshakes**: a new connection per request, no resumption;
//! - **resumed handshakes**: a new connection per request, resuming with session tickets;
//! - **bulk**: a 1 MiB static file again and again on kept-alive TLS connections.
//!
//! The handshakes are measured once per protocol, TLS 1.3 and TLS 1.2, the client allowing
//! only that one, and both servers are configured with `ssl_protocols TLSv1.2 TLSv1.3`
//! (nginx's default since 1.23.4; Debian 12's nginx 1.22 would otherwise speak TLS 1.2 only,
//! and its resumptions would skip the key exchange a TLS 1.3 resumption makes).
//!
//! Reported per server: connections (or MB) per second, and the workers' CPU per handshake
//! (or per MB) from `/proc`, which drifts less than throughput on a shared machine. It
//! measures; it does not judge, except in `--smoke`, where it checks that every shard number
//! was measured.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use rustls::pki_types::{CertificateDer, ServerName};

use crate::procfs;
use crate::servers::{self, Kind, Running, Spec};

#[derive(clap::Args, Debug, Clone)]
pub struct TlsArgs {
    /// Worker processes of each server.
    #[arg(long, default_value_t = 2)]
    workers: usize,
    /// Client threads.
    #[arg(long, default_value_t = 8)]
    clients: usize,
    /// Seconds per load.
    #[arg(long, default_value_t = 5)]
    duration: u64,
    #[command(flatten)]
    peers: servers::Peers,
    /// Also run E3 with TLS handshakes as the CPU work: full handshakes from `--e3-clients`
    /// threads under each accept strategy; latency percentiles, stdev and per-worker spread.
    #[arg(long)]
    e3: bool,
    /// Client threads of the E3 run.
    #[arg(long, default_value_t = 32)]
    e3_clients: usize,
    /// Tiny numbers, to check that the bench works (CI).
    #[arg(long)]
    smoke: bool,
    /// Also write the report here.
    #[arg(long)]
    out: Option<PathBuf>,
}

#[derive(Default, Debug, Clone, Copy)]
struct Measured {
    per_sec: f64,
    /// Worker CPU microseconds per connection (or per MB for bulk).
    cpu_us: f64,
    /// Resumed handshakes among all (resumption load only).
    resumed: f64,
}

#[derive(Default, Debug)]
struct Row {
    name: String,
    /// `TLSv1.3` or `TLSv1.2`: the only version the client offered.
    proto: &'static str,
    full: Option<Measured>,
    resumed: Option<Measured>,
    bulk: Option<Measured>,
}

const BULK_BYTES: usize = 1 << 20;

pub fn run(mut a: TlsArgs) -> Result<()> {
    if a.smoke {
        a.duration = 1;
        a.clients = a.clients.min(2);
    }
    procfs::raise_nofile_limit();
    let mut notes = Vec::new();
    let (shard, nginx) = a.peers.binaries(&mut notes)?;
    // One certificate for both: a test CA and a leaf for `bench.test`.
    let ca_key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key)?;
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
    let leaf = rcgen::CertificateParams::new(vec!["bench.test".to_string()])?
        .signed_by(&key, &ca, &ca_key)?;
    let pem_dir = std::env::temp_dir().join(format!("shard-bench-tls-{}", std::process::id()));
    std::fs::create_dir_all(&pem_dir)?;
    std::fs::write(pem_dir.join("cert.pem"), leaf.pem())?;
    std::fs::write(pem_dir.join("key.pem"), key.serialize_pem())?;
    let ca_der = ca.der().clone();

    let mut kinds = vec![Kind::Shard(shard)];
    if let Some(n) = nginx {
        kinds.push(Kind::Nginx(n));
    }
    let mut rows = Vec::new();
    for kind in &kinds {
        eprintln!("shard-bench: {}: TLS", kind.name());
        let mut two = [TLS13, TLS12].map(|v| Row {
            name: kind.name().to_string(),
            proto: proto_name(v),
            ..Default::default()
        });
        if let Err(e) = front(kind, &pem_dir, &ca_der, &a, &mut two) {
            notes.push(format!("{}: not all measured: {e:#}", kind.name()));
        }
        rows.extend(two);
    }
    let mut e3_rows = Vec::new();
    if a.e3 {
        for kind in &kinds {
            for st in &E3_STRATEGIES {
                if st.shard_only && matches!(kind, Kind::Nginx(_)) {
                    continue;
                }
                eprintln!("shard-bench: {}: E3 over TLS, {}", kind.name(), st.name);
                match e3_row(kind, st, &pem_dir, &ca_der, &a) {
                    Ok(r) => e3_rows.push(r),
                    Err(e) => notes.push(format!("{} E3 {}: {e:#}", kind.name(), st.name)),
                }
            }
        }
    }
    let _ = std::fs::remove_dir_all(&pem_dir);
    let mut report = render(&a, &rows, &notes);
    if a.e3 {
        report.push_str(&render_e3(&a, &e3_rows));
    }
    print!("{report}");
    servers::write_report(a.out.as_deref(), &report)?;
    if a.smoke {
        for s in &rows[..2] {
            ensure!(
                s.full.is_some_and(|m| m.per_sec > 0.0)
                    && s.resumed
                        .is_some_and(|m| m.per_sec > 0.0 && m.resumed > 0.5)
                    && (s.proto != "TLSv1.3" || s.bulk.is_some_and(|m| m.per_sec > 0.0)),
                "smoke: shard's TLS numbers were not all measured: {s:?} {notes:?}"
            );
        }
    }
    Ok(())
}

type Version = &'static rustls::SupportedProtocolVersion;
const TLS13: Version = &rustls::version::TLS13;
const TLS12: Version = &rustls::version::TLS12;

fn proto_name(v: Version) -> &'static str {
    if v.version == rustls::ProtocolVersion::TLSv1_3 {
        "TLSv1.3"
    } else {
        "TLSv1.2"
    }
}

/// Both servers allow both versions, so the client's choice decides.
const PROTOCOLS: &str = "ssl_protocols TLSv1.2 TLSv1.3;";

/// The loads against one server: handshakes per protocol (`rows`: TLS 1.3, then TLS 1.2),
/// bulk over TLS 1.3.
fn front(
    kind: &Kind,
    pems: &Path,
    ca: &CertificateDer<'static>,
    a: &TlsArgs,
    rows: &mut [Row; 2],
) -> Result<()> {
    let tls_port = servers::free_port()?;
    let spec = Spec {
        workers: a.workers,
        listen_opts: String::new(),
        server_extra: format!(
            "listen 127.0.0.1:{tls_port} ssl reuseport;\n        ssl_certificate {}; ssl_certificate_key {};\n        \
             ssl_session_cache none; ssl_session_tickets on; {PROTOCOLS}",
            pems.join("cert.pem").display(),
            pems.join("key.pem").display()
        ),
        idle: 256,
        tag: "tls".into(),
        ..Default::default()
    };
    let srv = servers::start_with(kind, &spec, |dir| {
        std::fs::write(dir.join("html/big.bin"), vec![b'x'; BULK_BYTES])?;
        Ok(())
    })?;
    let addr = SocketAddr::from(([127, 0, 0, 1], tls_port));
    let res = (|| -> Result<()> {
        for (row, v) in rows.iter_mut().zip([TLS13, TLS12]) {
            row.full = Some(measure(&srv, addr, ca, a, Mode::Full, v)?);
            row.resumed = Some(measure(&srv, addr, ca, a, Mode::Resumed, v)?);
        }
        rows[0].bulk = Some(measure(&srv, addr, ca, a, Mode::Bulk, TLS13)?);
        Ok(())
    })();
    srv.stop();
    res
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Full,
    Resumed,
    Bulk,
}

fn client_config(
    ca: &CertificateDer<'static>,
    resume: bool,
    version: Version,
) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    let _ = roots.add(ca.clone());
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut c = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[version])
        .expect("a version rustls has")
        .with_root_certificates(roots)
        .with_no_client_auth();
    c.alpn_protocols = vec![b"http/1.1".to_vec()];
    if !resume {
        c.resumption = rustls::client::Resumption::disabled();
    }
    Arc::new(c)
}

type Tls = rustls::StreamOwned<rustls::ClientConnection, TcpStream>;

fn connect(addr: SocketAddr, config: &Arc<rustls::ClientConfig>) -> std::io::Result<Tls> {
    let sock = TcpStream::connect(addr)?;
    sock.set_read_timeout(Some(Duration::from_secs(10)))?;
    sock.set_nodelay(true)?;
    let conn = rustls::ClientConnection::new(
        config.clone(),
        ServerName::try_from("bench.test").expect("a DNS name"),
    )
    .map_err(std::io::Error::other)?;
    Ok(rustls::StreamOwned::new(conn, sock))
}

/// One `GET`; the body's length.
fn get(s: &mut Tls, path: &str, close: bool) -> std::io::Result<usize> {
    let conn = if close { "close" } else { "keep-alive" };
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: bench.test\r\nConnection: {conn}\r\n\r\n"
    )?;
    let mut buf = Vec::with_capacity(1024);
    let mut b = vec![0u8; 64 * 1024];
    let end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = s.read(&mut b)?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        buf.extend_from_slice(&b[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    let mut got = buf.len() - end;
    while got < len {
        let n = s.read(&mut b)?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        got += n;
    }
    Ok(len)
}

fn measure(
    srv: &Running,
    addr: SocketAddr,
    ca: &CertificateDer<'static>,
    a: &TlsArgs,
    mode: Mode,
    version: Version,
) -> Result<Measured> {
    let config = client_config(ca, mode == Mode::Resumed, version);
    if mode == Mode::Resumed {
        // A ticket in the store for each client thread before the clock starts: shard sends
        // one per TLS 1.3 connection and a resumption uses its ticket up, so the store holds
        // as many tickets as the warm-up made. The warm-up connections are all opened (each
        // `ClientHello`, which would take a ticket, is built at once) before any completes,
        // so none of them resumes. One warm-up left a second thread with no ticket whenever
        // both started before the first connection finished: one full handshake per row.
        let mut warm = (0..a.clients.max(1))
            .map(|_| connect(addr, &config))
            .collect::<std::io::Result<Vec<_>>>()?;
        for s in &mut warm {
            get(s, "/ok", true).context("warm-up")?;
        }
    }
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let resumed = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let pids = srv.worker_pids()?;
    let cpu0 = procfs::cpu_ticks(&pids)?;
    let t0 = Instant::now();
    let threads: Vec<_> = (0..a.clients)
        .map(|_| {
            let (stop, done, resumed, errors, config) = (
                stop.clone(),
                done.clone(),
                resumed.clone(),
                errors.clone(),
                config.clone(),
            );
            std::thread::spawn(move || {
                let mut keep: Option<Tls> = None;
                while !stop.load(Relaxed) {
                    let r = if mode == Mode::Bulk {
                        let s = match keep.as_mut() {
                            Some(s) => s,
                            None => match connect(addr, &config) {
                                Ok(s) => keep.insert(s),
                                Err(_) => {
                                    errors.fetch_add(1, Relaxed);
                                    continue;
                                }
                            },
                        };
                        get(s, "/big.bin", false).map(|n| n as u64)
                    } else {
                        connect(addr, &config).and_then(|mut s| {
                            get(&mut s, "/ok", true)?;
                            if s.conn.handshake_kind() == Some(rustls::HandshakeKind::Resumed) {
                                resumed.fetch_add(1, Relaxed);
                            }
                            // One connection done.
                            Ok(1)
                        })
                    };
                    match r {
                        Ok(n) => {
                            done.fetch_add(n, Relaxed);
                        }
                        Err(_) => {
                            errors.fetch_add(1, Relaxed);
                            keep = None;
                        }
                    }
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs(a.duration));
    stop.store(true, Relaxed);
    for t in threads {
        let _ = t.join();
    }
    let secs = t0.elapsed().as_secs_f64();
    let cpu1 = procfs::cpu_ticks(&pids)?;
    let n = done.load(Relaxed);
    ensure!(n > 0, "nothing completed ({} errors)", errors.load(Relaxed));
    let cpu_us = (cpu1 - cpu0) as f64 * 1e6 / procfs::ticks_per_sec();
    Ok(match mode {
        Mode::Bulk => {
            let mb = n as f64 / 1e6;
            Measured {
                per_sec: mb / secs,
                cpu_us: cpu_us / mb,
                resumed: 0.0,
            }
        }
        _ => Measured {
            per_sec: n as f64 / secs,
            cpu_us: cpu_us / n as f64,
            resumed: resumed.load(Relaxed) as f64 / n as f64,
        },
    })
}

/// An accept strategy of the E3 run: `listen` parameters and `events` directives.
struct E3Strategy {
    name: &'static str,
    listen: &'static str,
    events: &'static str,
    shard_only: bool,
}

const E3_STRATEGIES: [E3Strategy; 3] = [
    E3Strategy {
        name: "shared socket (accept_mutex off)",
        listen: "",
        events: "accept_mutex off;",
        shard_only: false,
    },
    E3Strategy {
        name: "reuseport",
        listen: "reuseport",
        events: "",
        shard_only: false,
    },
    E3Strategy {
        name: "reuseport, steering off",
        listen: "reuseport",
        events: "reuseport_steering off;",
        shard_only: true,
    },
];

#[derive(Debug)]
struct E3Row {
    server: String,
    strategy: &'static str,
    handshakes: u64,
    p50_ms: f64,
    p99_ms: f64,
    max_ms: f64,
    stdev_ms: f64,
    /// Accepted per worker (shard only).
    spread: Option<Vec<u64>>,
}

/// Full handshakes (a new TLS connection per request) from `e3_clients` threads for
/// `duration` s against one accept strategy; each connection's time from connect to the
/// response's end.
fn e3_row(
    kind: &Kind,
    st: &E3Strategy,
    pems: &Path,
    ca: &CertificateDer<'static>,
    a: &TlsArgs,
) -> Result<E3Row> {
    let tls_port = servers::free_port()?;
    let spec = Spec {
        workers: a.workers,
        listen_opts: String::new(),
        events: st.events.to_string(),
        server_extra: format!(
            "listen 127.0.0.1:{tls_port} ssl {};\n        ssl_certificate {}; ssl_certificate_key {}; {PROTOCOLS}",
            st.listen,
            pems.join("cert.pem").display(),
            pems.join("key.pem").display()
        ),
        idle: 256,
        tag: "tls-e3".into(),
        ..Default::default()
    };
    let srv = servers::start_with(kind, &spec, |_| Ok(()))?;
    let addr = SocketAddr::from(([127, 0, 0, 1], tls_port));
    let config = client_config(ca, false, TLS13);
    let acc0 = srv.accepted_per_worker().ok();
    let stop = Arc::new(AtomicBool::new(false));
    let clients = if a.smoke { 2 } else { a.e3_clients };
    let threads: Vec<_> = (0..clients)
        .map(|_| {
            let (stop, config) = (stop.clone(), config.clone());
            std::thread::spawn(move || {
                let mut lat = Vec::new();
                while !stop.load(Relaxed) {
                    let t0 = Instant::now();
                    if connect(addr, &config)
                        .and_then(|mut s| get(&mut s, "/ok", true))
                        .is_ok()
                    {
                        lat.push(t0.elapsed().as_secs_f64() * 1000.0);
                    }
                }
                lat
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs(a.duration));
    stop.store(true, Relaxed);
    let mut lat: Vec<f64> = threads
        .into_iter()
        .flat_map(|t| t.join().unwrap_or_default())
        .collect();
    let acc1 = srv.accepted_per_worker().ok();
    srv.stop();
    ensure!(!lat.is_empty(), "no handshake completed");
    lat.sort_by(f64::total_cmp);
    let n = lat.len();
    let mean = lat.iter().sum::<f64>() / n as f64;
    let var = lat.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n as f64;
    let pick = |q: f64| lat[((n as f64 - 1.0) * q).round() as usize];
    let spread = match (acc0, acc1) {
        (Some(a0), Some(a1)) if a0.len() == a1.len() && !a0.is_empty() => Some(
            a1.iter()
                .zip(&a0)
                .map(|(b, a)| b.saturating_sub(*a))
                .collect(),
        ),
        _ => None,
    };
    Ok(E3Row {
        server: kind.name().to_string(),
        strategy: st.name,
        handshakes: n as u64,
        p50_ms: pick(0.5),
        p99_ms: pick(0.99),
        max_ms: pick(1.0),
        stdev_ms: var.sqrt(),
        spread,
    })
}

fn render_e3(a: &TlsArgs, rows: &[E3Row]) -> String {
    let mut s = format!(
        "\n## E3 with TLS handshakes as the CPU work\n\n{} workers, {} client threads, {} s per \
         row: every request is a new connection with a full handshake, so the handshake is the \
         worker's CPU-heavy work (Cloudflare's E3 used a Lua loop); TLS 1.3.\n\n\
         | server | strategy | handshakes | p50 ms | p99 ms | max ms | stdev ms | accepted per worker |\n\
         |---|---|---|---|---|---|---|---|\n",
        a.workers,
        if a.smoke { 2 } else { a.e3_clients },
        a.duration
    );
    for r in rows {
        s.push_str(&format!(
            "| {} | {} | {} | {:.2} | {:.2} | {:.2} | {:.2} | {} |\n",
            r.server,
            r.strategy,
            r.handshakes,
            r.p50_ms,
            r.p99_ms,
            r.max_ms,
            r.stdev_ms,
            r.spread.as_ref().map_or("-".to_string(), |v| {
                v.iter().map(u64::to_string).collect::<Vec<_>>().join(" / ")
            })
        ));
    }
    s
}

fn fmt(m: Option<Measured>, f: impl Fn(Measured) -> String) -> String {
    m.map_or("-".to_string(), f)
}

fn render(a: &TlsArgs, rows: &[Row], notes: &[String]) -> String {
    let mut s = format!(
        "# shard-bench tls\n\n{} workers, {} client threads (rustls), {} s per load, ECDSA P-256 \
         certificate; both servers allow TLS 1.2 and 1.3, the client offers only the row's \
         version. full: a new connection per request without resumption; resumed: with \
         session tickets; bulk (TLS 1.3): a 1 MiB file on kept-alive connections.\n\n\
         | server | protocol | full handshakes/s | worker CPU µs/handshake | resumed handshakes/s | resumed share | worker CPU µs/resumption | bulk MB/s | worker CPU ms/MB |\n\
         |---|---|---|---|---|---|---|---|---|\n",
        a.workers, a.clients, a.duration
    );
    for r in rows {
        s.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            r.name,
            r.proto,
            fmt(r.full, |m| format!("{:.0}", m.per_sec)),
            fmt(r.full, |m| format!("{:.0}", m.cpu_us)),
            fmt(r.resumed, |m| format!("{:.0}", m.per_sec)),
            fmt(r.resumed, |m| format!("{:.2}", m.resumed)),
            fmt(r.resumed, |m| format!("{:.0}", m.cpu_us)),
            fmt(r.bulk, |m| format!("{:.0}", m.per_sec)),
            fmt(r.bulk, |m| format!("{:.2}", m.cpu_us / 1000.0)),
        ));
    }
    for n in notes {
        s.push_str(&format!("\nNote: {n}\n"));
    }
    s
}
