//! `shard-bench routing`: what choosing a server, a location and a `map` value costs as the
//! configuration grows, shard and nginx on the same generated configurations in the same run.
//!
//! Three families of configurations: N `server` blocks (each `server_name sI.test
//! www.sI.test`), M prefix locations in one server (`location /pI/`), and a `map $arg_k` of K
//! keys. For each size the requests that name the first, the middle and the last entry and an
//! unknown one are loaded in turn (each answer checked once first); the report gives worker
//! CPU per request, requests/s, the time of `-t`, of a reload (until every worker is new) and
//! worker RSS. A benchmark, not a test: CI runs only `--smoke`.
//!
//! It owns the generated configurations and their table; starting servers is `servers.rs`'s,
//! CPU and memory `procfs.rs`'s, the load `loadgen`'s (the built-in generator, which sends the
//! `Host` a row needs).

use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};

use crate::servers::{self, Kind, Running, Spec};
use crate::{loadgen, median, procfs};

#[derive(clap::Args, Debug, Clone)]
pub struct RoutingArgs {
    /// Worker processes for both servers.
    #[arg(long, default_value_t = 1)]
    pub workers: usize,
    /// Seconds per load run.
    #[arg(long, default_value_t = 2)]
    pub duration: u64,
    /// Kept-alive client connections.
    #[arg(long, default_value_t = 8)]
    pub connections: usize,
    /// Load runs per request and server, the servers alternating; the report gives medians.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Numbers of `server` blocks (repeatable; default 10, 1000, 10000, 50000).
    #[arg(long = "servers")]
    pub servers: Vec<usize>,
    /// Numbers of prefix locations (repeatable; default 10, 1000, 10000).
    #[arg(long = "locations")]
    pub locations: Vec<usize>,
    /// Numbers of `map` keys (repeatable; default 10, 1000, 100000).
    #[arg(long = "keys")]
    pub keys: Vec<usize>,
    /// `--shard`, `--nginx`, `--no-nginx`.
    #[command(flatten)]
    pub peers: servers::Peers,
    /// The smallest size of each family, one round of 1 s: checks that the bench works (CI).
    #[arg(long)]
    pub smoke: bool,
    /// Also write the report here.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// One generated configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Family {
    Servers(usize),
    Locations(usize),
    Keys(usize),
}

impl Family {
    fn label(&self) -> String {
        match self {
            Family::Servers(n) => format!("{n} servers"),
            Family::Locations(n) => format!("{n} locations"),
            Family::Keys(n) => format!("map of {n} keys"),
        }
    }

    /// What the configuration adds to the bench's shape: `http {}` directives (with `{port}`
    /// for the port) and the main server's.
    fn spec(&self, workers: usize) -> Spec {
        // nginx needs its hashes sized for big configurations (shard accepts and ignores
        // these, with a warning).
        let mut http = String::from(
            "server_names_hash_max_size 262144;\nserver_names_hash_bucket_size 128;\n\
             map_hash_max_size 262144;\nmap_hash_bucket_size 128;\n",
        );
        let mut server = String::from("location / { return 200 \"none\"; }\n");
        match *self {
            Family::Servers(n) => {
                for i in 0..n {
                    let _ = writeln!(
                        http,
                        "server {{ listen 127.0.0.1:{{port}}; server_name s{i}.test www.s{i}.test; \
                         return 200 \"s{i}\"; }}"
                    );
                }
            }
            Family::Locations(n) => {
                for i in 0..n {
                    let _ = writeln!(server, "location /p{i}/ {{ return 200 \"p{i}\"; }}");
                }
            }
            Family::Keys(n) => {
                http.push_str("map $arg_k $v {\n    default none;\n");
                for i in 0..n {
                    let _ = writeln!(http, "    k{i} v{i};");
                }
                http.push_str("}\n");
                server.push_str("location = /m { return 200 \"$v\"; }\n");
            }
        }
        Spec {
            workers,
            listen_opts: "reuseport default_server".into(),
            http_extra: http,
            server_extra: server,
            tag: "routing".into(),
            ..Spec::default()
        }
    }

    /// The rows: (label, Host, path, expected body) for the first, middle and last entry and
    /// an unknown one.
    fn requests(&self) -> Vec<(&'static str, String, String, String)> {
        let n = match *self {
            Family::Servers(n) | Family::Locations(n) | Family::Keys(n) => n,
        };
        let picks = [("first", 0), ("middle", n / 2), ("last", n - 1)];
        let mut v: Vec<_> = picks
            .iter()
            .map(|&(what, i)| match self {
                Family::Servers(_) => (what, format!("s{i}.test"), "/".into(), format!("s{i}")),
                Family::Locations(_) => (what, "h".into(), format!("/p{i}/x"), format!("p{i}")),
                Family::Keys(_) => (what, "h".into(), format!("/m?k=k{i}"), format!("v{i}")),
            })
            .collect();
        v.push(match self {
            Family::Servers(_) => ("unknown", "unknown.test".into(), "/".into(), "none".into()),
            Family::Locations(_) => ("unknown", "h".into(), "/q/x".into(), "none".into()),
            Family::Keys(_) => ("unknown", "h".into(), "/m?k=zz".into(), "none".into()),
        });
        v
    }
}

/// One server's numbers for one request.
#[derive(Debug, Clone, Copy, Default)]
struct Measure {
    cpu_us: f64,
    rps: f64,
}

/// One server's numbers for one configuration.
#[derive(Debug, Clone, Default)]
struct ConfMeasure {
    test_s: f64,
    reload_s: Option<f64>,
    rss_kib: f64,
    rows: Vec<Measure>,
}

/// The body of one `GET path` with `Host: host` (checked before a row is loaded).
fn fetch(port: u16, host: &str, path: &str) -> Result<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )?;
    let mut raw = String::new();
    s.read_to_string(&mut raw)?;
    let status = raw
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = raw
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_string();
    Ok((status, body))
}

/// Worker CPU µs per request and requests/s of one kept-alive load of `d`.
fn cpu_round(
    srv: &Running,
    host: &str,
    path: &str,
    a: &RoutingArgs,
    d: Duration,
) -> Result<Measure> {
    let pids = srv.worker_pids()?;
    let mut target = loadgen::Target::parse(&format!("http://127.0.0.1:{}{path}", srv.port))?;
    target.host = host.to_string();
    let spec = loadgen::LoadSpec {
        connections: a.connections,
        threads: a.connections.clamp(1, 2),
        duration: d,
        ..loadgen::LoadSpec::new(target)
    };
    let cpu0 = procfs::cpu_ticks(&pids)?;
    let r = loadgen::run(&spec)?;
    let cpu1 = procfs::cpu_ticks(&pids)?;
    ensure!(r.requests > 0, "no responses ({:?})", r.errors);
    Ok(Measure {
        cpu_us: (cpu1 - cpu0) as f64 * 1e6 / procfs::ticks_per_sec() / r.requests as f64,
        rps: r.rps,
    })
}

/// Seconds of `BIN -t` on the running server's configuration.
fn test_time(kind: &Kind, srv: &Running) -> Result<f64> {
    let bin = match kind {
        Kind::Shard(b) | Kind::Nginx(b) => b,
    };
    let mut c = Command::new(bin);
    if matches!(kind, Kind::Nginx(_)) {
        c.arg("-e").arg(srv.dir.join("logs/error.log"));
    }
    c.arg("-q")
        .arg("-t")
        .arg("-p")
        .arg(&srv.dir)
        .arg("-c")
        .arg(srv.conf_path());
    let t = Instant::now();
    let out = c.output().context("running -t")?;
    let secs = t.elapsed().as_secs_f64();
    ensure!(
        out.status.success(),
        "{} -t failed: {}",
        kind.name(),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(secs)
}

/// Seconds from `SIGHUP` until every worker is a new one and answers; `None` when that did
/// not happen within 60 s.
fn reload_time(srv: &Running, workers: usize, host: &str, path: &str) -> Result<Option<f64>> {
    let old = srv.worker_pids()?;
    let t = Instant::now();
    // SAFETY-free: kill(2) with plain integers.
    unsafe { libc::kill(srv.master_pid(), libc::SIGHUP) };
    while t.elapsed() < Duration::from_secs(60) {
        let now = srv.worker_pids().unwrap_or_default();
        let fresh = now.iter().filter(|p| !old.contains(p)).count();
        if fresh >= workers
            && now.iter().all(|p| !old.contains(p))
            && fetch(srv.port, host, path).is_ok_and(|(s, _)| s == 200)
        {
            return Ok(Some(t.elapsed().as_secs_f64()));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(None)
}

fn measure(
    fam: Family,
    kinds: &[Kind],
    a: &RoutingArgs,
    notes: &mut Vec<String>,
) -> Result<Vec<ConfMeasure>> {
    let spec = fam.spec(a.workers);
    let mut servers = Vec::new();
    for kind in kinds {
        let srv = servers::start_with(kind, &spec, |_| Ok(()))
            .with_context(|| format!("starting {} with {}", kind.name(), fam.label()))?;
        servers.push(srv);
    }
    let result = (|| {
        let reqs = fam.requests();
        let d = Duration::from_secs(a.duration.max(1));
        let mut out: Vec<ConfMeasure> = vec![ConfMeasure::default(); servers.len()];
        for (srv, kind) in servers.iter().zip(kinds) {
            for (what, host, path, want) in &reqs {
                let (status, body) = fetch(srv.port, host, path)?;
                if status != 200 || body != *want {
                    bail!(
                        "{} answered {status} {body:?} for the {what} entry of {} ({host}{path}), not {want:?}",
                        kind.name(),
                        fam.label()
                    );
                }
            }
        }
        // Per request: a warm-up each, then rounds in alternating order.
        for (what, host, path, _) in &reqs {
            for srv in &servers {
                cpu_round(srv, host, path, a, Duration::from_millis(300))?;
            }
            let mut runs: Vec<Vec<Measure>> = vec![Vec::new(); servers.len()];
            for round in 0..a.rounds.max(1) {
                let mut order: Vec<usize> = (0..servers.len()).collect();
                if round % 2 == 1 {
                    order.reverse();
                }
                for i in order {
                    runs[i].push(cpu_round(&servers[i], host, path, a, d)?);
                }
            }
            for (i, r) in runs.iter().enumerate() {
                out[i].rows.push(Measure {
                    cpu_us: median(r.iter().map(|m| m.cpu_us).collect()),
                    rps: median(r.iter().map(|m| m.rps).collect()),
                });
            }
            eprintln!(
                "shard-bench routing: {}, {what}: {}",
                fam.label(),
                runs.iter()
                    .zip(kinds)
                    .map(|(r, k)| format!(
                        "{} {:.2} µs",
                        k.name(),
                        median(r.iter().map(|m| m.cpu_us).collect())
                    ))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
        for (i, (srv, kind)) in servers.iter().zip(kinds).enumerate() {
            let pids = srv.worker_pids()?;
            out[i].rss_kib = procfs::rss_bytes(&pids)? as f64 / 1024.0 / pids.len().max(1) as f64;
            out[i].test_s = test_time(kind, srv)?;
            let (_, host, path, _) = &reqs[0];
            out[i].reload_s = reload_time(srv, a.workers, host, path)?;
            if out[i].reload_s.is_none() {
                notes.push(format!(
                    "{} with {}: a reload did not replace every worker within 60 s",
                    kind.name(),
                    fam.label()
                ));
            }
        }
        Ok(out)
    })();
    for srv in servers {
        srv.stop();
    }
    result
}

pub fn run(mut a: RoutingArgs) -> Result<()> {
    if a.smoke {
        a.duration = 1;
        a.rounds = 1;
        a.connections = a.connections.min(4);
    }
    procfs::raise_nofile_limit();
    let mut notes = Vec::new();
    let (shard, nginx) = a.peers.binaries(&mut notes)?;
    for n in &notes {
        eprintln!("shard-bench: {n}");
    }
    let mut kinds = vec![Kind::Shard(shard)];
    if let Some(n) = nginx {
        kinds.push(Kind::Nginx(n));
    }
    let or = |given: &[usize], default: &[usize]| -> Vec<usize> {
        let v = if given.is_empty() { default } else { given };
        v.iter().copied().filter(|&n| n > 0).collect()
    };
    let (servers, locations, keys) = if a.smoke {
        (vec![10], vec![10], vec![10])
    } else {
        (
            or(&a.servers, &[10, 1_000, 10_000, 50_000]),
            or(&a.locations, &[10, 1_000, 10_000]),
            or(&a.keys, &[10, 1_000, 100_000]),
        )
    };
    let families: Vec<Family> = servers
        .into_iter()
        .map(Family::Servers)
        .chain(locations.into_iter().map(Family::Locations))
        .chain(keys.into_iter().map(Family::Keys))
        .collect();
    let mut results = Vec::new();
    for fam in families {
        let m = measure(fam, &kinds, &a, &mut notes)?;
        results.push((fam, m));
    }
    let report = render(&a, &kinds, &results, &notes);
    print!("{report}");
    servers::write_report(a.out.as_deref(), &report)
}

fn opt(v: Option<f64>, digits: usize) -> String {
    v.map_or("-".into(), |x| format!("{x:.digits$}"))
}

fn render(
    a: &RoutingArgs,
    kinds: &[Kind],
    results: &[(Family, Vec<ConfMeasure>)],
    notes: &[String],
) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# shard-bench routing: {} worker(s), {} kept-alive connections, {} s x {} rounds per request, shard and nginx alternating (medians){}\n",
        a.workers,
        a.connections,
        a.duration,
        a.rounds,
        if a.smoke { " (smoke: numbers are not meaningful)" } else { "" }
    );
    let nginx = kinds.len() > 1;
    let _ = writeln!(
        s,
        "| configuration | request | shard CPU µs/req | nginx CPU µs/req | CPU shard/nginx | shard req/s | nginx req/s |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|");
    for (fam, m) in results {
        for (i, (what, ..)) in fam.requests().iter().enumerate() {
            let sh = m[0].rows[i];
            let ng = m.get(1).filter(|_| nginx).map(|n| n.rows[i]);
            let _ = writeln!(
                s,
                "| {} | {what} | {:.2} | {} | {} | {:.0} | {} |",
                fam.label(),
                sh.cpu_us,
                opt(ng.map(|n| n.cpu_us), 2),
                opt(ng.map(|n| sh.cpu_us / n.cpu_us.max(1e-9)), 2),
                sh.rps,
                opt(ng.map(|n| n.rps), 0),
            );
        }
    }
    let _ = writeln!(
        s,
        "\n| configuration | shard -t s | nginx -t s | shard reload s | nginx reload s | shard worker RSS KiB | nginx worker RSS KiB |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|");
    for (fam, m) in results {
        let ng = m.get(1).filter(|_| nginx);
        let _ = writeln!(
            s,
            "| {} | {:.3} | {} | {} | {} | {:.0} | {} |",
            fam.label(),
            m[0].test_s,
            opt(ng.map(|n| n.test_s), 3),
            opt(m[0].reload_s, 3),
            opt(ng.and_then(|n| n.reload_s), 3),
            m[0].rss_kib,
            opt(ng.map(|n| n.rss_kib), 0),
        );
    }
    if !notes.is_empty() {
        let _ = writeln!(s, "\nNotes:");
        for n in notes {
            let _ = writeln!(s, "- {n}");
        }
    }
    s
}
