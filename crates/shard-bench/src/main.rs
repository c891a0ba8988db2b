//! `shard-bench`: runs shard and, when installed, nginx with the same workload and the same
//! number of workers, and prints what does not drift on a noisy machine: system calls per
//! request (`strace -c -f` on the workers), worker CPU time per request, and worker memory per
//! idle keep-alive connection; and, with `proxy`, the same for shard and nginx as reverse
//! proxies (HTTP with keep-alive to the upstream, and the `stream` TCP relay's throughput),
//! and, with `fastcgi`, in front of the same PHP-FPM pool.
//!
//! This crate owns the servers' start-up for measurement, the load (wrk when installed, else
//! the built-in load generator of `loadgen`, which `shard-bench load URL` also runs on its own)
//! and the report. It is a benchmark, not a test: CI runs it
//! only as `--smoke`, which checks that every step works on tiny numbers.

mod bodies;
mod cache;
mod compare;
mod experiments;
mod fastcgi;
mod h2bench;
mod h2client;
mod load;
pub mod loadgen;
mod procfs;
mod proxy;
mod quic;
mod reload;
mod routing;
mod servers;
mod soak;
mod statics;
mod svg;
mod tlsbench;
mod ws;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};

use servers::{Kind, Running};

#[derive(Parser, Debug)]
#[command(
    name = "shard-bench",
    about = "shard vs nginx: syscalls, CPU and memory per request"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// `return 200 "OK"`: syscalls/request (keep-alive and a connection per request), worker
    /// CPU per request, worker memory per idle keep-alive connection.
    Speed(SpeedArgs),
    /// Load generator: closed loop (-c, -d or -n) or open loop (-R, latency from the intended
    /// send time), keep-alive or --close; latency percentiles, errors and a log2 histogram.
    Load(loadgen::LoadArgs),
    /// Re-run the articles' experiments (E1-E6, see docs/bench.md) against shard in every
    /// accept strategy and, when installed, nginx; writes report.md, SVG charts, results.json
    /// and the configurations used into --out.
    Experiment(experiments::ExperimentArgs),
    /// Run your own configuration under each accept strategy with the same load and say which
    /// wins on requests/s, on p99 and on the spread between workers, and why.
    Compare(compare::CompareArgs),
    /// Reverse proxy, shard and nginx side by side: proxied requests/s, syscalls and worker CPU
    /// per proxied request, backend connections opened (keep-alive reuse), and the stream
    /// relay's MB/s in both directions.
    Proxy(proxy::ProxyArgs),
    /// FastCGI to the same PHP-FPM pool, shard and nginx side by side: requests/s, syscalls
    /// and worker CPU per request of the front (the pool's cost is the same for both).
    Fastcgi(fastcgi::FastcgiArgs),
    /// Keep-alive, close, pipelined, slow, aborted, static and proxied clients for --minutes;
    /// every worker's RSS and descriptors sampled each second, reported as growth per 100k
    /// requests.
    Soak(soak::SoakArgs),
    /// Request bodies through the proxy, shard and nginx side by side: worker memory per
    /// stalled upload, MB/s of a large upload buffered and streamed, temporary files left
    /// after the runs, a worker SIGKILL and a reload.
    Bodies(bodies::BodiesArgs),
    /// Static files of 33 B, 16 KiB and 1 MiB, sendfile off and on, open_file_cache off and
    /// on, pipelined: syscalls and worker CPU per request, shard and nginx in the same run.
    Static(statics::StaticArgs),
    /// Reloads and a binary upgrade under keep-alive, connection-per-request and WebSocket
    /// clients, shard and nginx side by side: failed requests per reload, broken tunnels, and
    /// the latency of requests that arrived during a reload.
    Reload(reload::ReloadArgs),
    /// TLS termination, shard and nginx on the same certificate: full and resumed
    /// handshakes per second and worker CPU per handshake, and a 1 MiB file's MB/s over TLS.
    Tls(tlsbench::TlsArgs),
    /// Routing as the configuration grows: 10 to 50,000 server blocks, 10 to 10,000 prefix
    /// locations, maps of 10 to 100,000 keys; worker CPU per request for the first, middle,
    /// last and an unknown entry, `-t` and reload time and worker RSS, shard and nginx in the
    /// same run.
    Routing(routing::RoutingArgs),
    /// HTTP/2 with h2load: h2c and TLS, `return 200`, a 16 KiB file and the proxy; requests
    /// per worker CPU-second and memory per idle HTTP/2 connection, shard and nginx.
    H2(h2bench::H2Args),
    /// HTTP/3 with the bench's own QUIC client against shard's HTTP/2 (h2load): requests per
    /// worker CPU-second, and memory per idle QUIC connection.
    H3(quic::H3Args),
    /// proxy_cache hits of 1 KiB, 64 KiB and 1 MiB objects, shard and nginx on the same
    /// configuration: requests/s and worker CPU per hit, and whether the first answer after a
    /// restart on the same cache directory is a hit.
    Cache(cache::CacheArgs),
}

#[derive(clap::Args, Debug, Clone)]
pub struct SpeedArgs {
    /// Worker processes for both servers.
    #[arg(long, default_value_t = 2)]
    workers: usize,
    /// Seconds per load run.
    #[arg(long, default_value_t = 5)]
    duration: u64,
    /// Concurrent client connections per load run.
    #[arg(long, default_value_t = 50)]
    connections: usize,
    /// Idle keep-alive connections for the memory measurement.
    #[arg(long, default_value_t = 10_000)]
    idle: usize,
    /// `--shard`, `--nginx`, `--no-nginx`.
    #[command(flatten)]
    peers: crate::servers::Peers,
    /// Use the built-in load generator even when wrk is installed.
    #[arg(long)]
    builtin_load: bool,
    /// The URL path to load: `/ok` (`return 200 "OK"`) or `/static.html` (a 4 KiB file).
    #[arg(long, default_value = "/ok")]
    path: String,
    /// Also measure shard with `worker_sandbox on` (a row of its own).
    #[arg(long)]
    sandbox: bool,
    /// Measure the sandbox's cost as N pairs of fresh shard starts with `worker_sandbox` off
    /// and on, in alternating order, 1 worker pinned to one CPU and the load to another:
    /// the mean per-pair change of worker CPU per request and its standard error. Run-to-run
    /// drift cancels within a pair, which a single row cannot give.
    #[arg(long, default_value_t = 0)]
    sandbox_pairs: usize,
    /// Tiny numbers, to check that the bench works (CI).
    #[arg(long)]
    smoke: bool,
    /// Also write the report here.
    #[arg(long)]
    out: Option<PathBuf>,
}

fn main() {
    let cli = Cli::parse();
    let res = match cli.cmd {
        Cmd::Speed(a) => speed(a),
        Cmd::Static(a) => statics::run(a),
        Cmd::Load(a) => loadgen::command(a),
        Cmd::Experiment(a) => experiments::run(a),
        Cmd::Compare(a) => compare::run(a),
        Cmd::Proxy(a) => proxy::run(a),
        Cmd::Cache(a) => cache::run(a),
        Cmd::Fastcgi(a) => fastcgi::run(a),
        Cmd::Soak(a) => soak::run(a),
        Cmd::Bodies(a) => bodies::run(a),
        Cmd::Reload(a) => reload::run(a),
        Cmd::Tls(a) => tlsbench::run(a),
        Cmd::Routing(a) => routing::run(a),
        Cmd::H2(a) => h2bench::run(a),
        Cmd::H3(a) => quic::h3_run(a),
    };
    if let Err(e) = res {
        eprintln!("shard-bench: {e:#}");
        std::process::exit(1);
    }
}

/// One server's results.
#[derive(Default, Debug)]
struct Row {
    name: String,
    syscalls_keepalive: Option<f64>,
    syscalls_close: Option<f64>,
    cpu_us_per_req: Option<f64>,
    rps: Option<f64>,
    idle_bytes_per_conn: Option<f64>,
}

fn speed(mut a: SpeedArgs) -> Result<()> {
    if a.smoke {
        a.duration = 1;
        a.connections = a.connections.min(8);
        a.idle = a.idle.min(200);
    }
    procfs::raise_nofile_limit();
    let shard = shard_binary(a.peers.shard.as_deref())?;
    let Tools {
        nginx,
        strace,
        wrk,
        notes,
    } = Tools::find(&a.peers, a.builtin_load);

    let mut kinds = vec![(Kind::Shard(shard.clone()), "shard", "")];
    if a.sandbox {
        kinds.push((
            Kind::Shard(shard.clone()),
            "shard (worker_sandbox on)",
            "worker_sandbox on;\n",
        ));
    }
    if let Some(n) = nginx {
        kinds.push((Kind::Nginx(n), "nginx", ""));
    }
    let mut rows = Vec::new();
    for (kind, name, main_extra) in kinds {
        eprintln!("shard-bench: measuring {name} with {} workers", a.workers);
        let srv = servers::start_speed(&kind, a.workers, a.idle, main_extra)
            .with_context(|| format!("starting {name}"))?;
        let mut row = Row {
            name: name.to_string(),
            ..Default::default()
        };
        if let Some(strace) = &strace {
            row.syscalls_keepalive = Some(syscalls_per_request(
                &srv,
                strace,
                wrk.as_deref(),
                &a,
                true,
            )?);
            row.syscalls_close = Some(syscalls_per_request(
                &srv,
                strace,
                wrk.as_deref(),
                &a,
                false,
            )?);
        }
        let (cpu, rps) = cpu_per_request(&srv, wrk.as_deref(), &a)?;
        row.cpu_us_per_req = Some(cpu);
        row.rps = Some(rps);
        row.idle_bytes_per_conn = Some(idle_memory(&srv, a.idle)?);
        srv.stop();
        rows.push(row);
    }
    let mut report = render(&a, &rows, &notes);
    if a.sandbox_pairs > 0 {
        report.push_str(&sandbox_pairs(&a, &shard, wrk.as_deref())?);
    }
    print!("{report}");
    servers::write_report(a.out.as_deref(), &report)
}

/// The shard binary: `given`, or the one next to this binary.
fn shard_binary(given: Option<&std::path::Path>) -> Result<PathBuf> {
    let shard = match given {
        Some(p) => p.to_path_buf(),
        None => std::env::current_exe()?.with_file_name("shard"),
    };
    anyhow::ensure!(
        shard.exists(),
        "no shard binary at {} (build it: cargo build --release -p shard)",
        shard.display()
    );
    Ok(shard)
}

/// The optional tools, found once per run, and a note for each one that is missing.
struct Tools {
    nginx: Option<PathBuf>,
    strace: Option<PathBuf>,
    wrk: Option<PathBuf>,
    notes: Vec<String>,
}

impl Tools {
    fn find(peers: &servers::Peers, builtin_load: bool) -> Tools {
        let mut notes = Vec::new();
        let nginx = servers::nginx_or_note(peers.nginx.as_deref(), peers.no_nginx, &mut notes);
        let strace = servers::which("strace");
        let wrk = if builtin_load {
            None
        } else {
            servers::which("wrk")
        };
        if strace.is_none() {
            notes.push(
                "strace not found: no syscall counts (install: apt-get install strace)".to_string(),
            );
        }
        if wrk.is_none() {
            notes.push(
                "wrk not used: built-in load generator (install: apt-get install wrk)".to_string(),
            );
        }
        for n in &notes {
            eprintln!("shard-bench: {n}");
        }
        Tools {
            nginx,
            strace,
            wrk,
            notes,
        }
    }
}

/// A keep-alive (or connection-per-request) load on `GET /ok` at `port`: wrk when given, else
/// the built-in load generator.
fn run_load(
    port: u16,
    path: &str,
    wrk: Option<&std::path::Path>,
    connections: usize,
    d: Duration,
    keepalive: bool,
) -> Result<()> {
    match wrk {
        Some(w) => load::wrk(w, port, path, connections, d, keepalive).map(|_| ()),
        None => {
            let target = loadgen::Target::parse(&format!("http://127.0.0.1:{port}{path}"))?;
            let spec = loadgen::LoadSpec {
                connections,
                duration: d,
                close: !keepalive,
                ..loadgen::LoadSpec::new(target)
            };
            let r = loadgen::run(&spec)?;
            anyhow::ensure!(
                r.requests > 0,
                "built-in load: no responses ({:?})",
                r.errors
            );
            Ok(())
        }
    }
}

fn syscalls_per_request(
    srv: &Running,
    strace: &std::path::Path,
    wrk: Option<&std::path::Path>,
    a: &SpeedArgs,
    keepalive: bool,
) -> Result<f64> {
    let pids = srv.worker_pids()?;
    let tracer = procfs::Strace::attach(strace, &pids)?;
    let before = srv.requests()?;
    run_load(
        srv.port,
        &a.path,
        wrk,
        a.connections,
        Duration::from_secs(a.duration),
        keepalive,
    )?;
    let after = srv.requests()?;
    let calls = tracer.finish()?;
    // The second status request is counted in `after` and was served while traced.
    let requests = after.saturating_sub(before).max(1);
    Ok(calls as f64 / requests as f64)
}

fn cpu_per_request(
    srv: &Running,
    wrk: Option<&std::path::Path>,
    a: &SpeedArgs,
) -> Result<(f64, f64)> {
    let pids = srv.worker_pids()?;
    let cpu0 = procfs::cpu_ticks(&pids)?;
    let r0 = srv.requests()?;
    let t0 = std::time::Instant::now();
    run_load(
        srv.port,
        &a.path,
        wrk,
        a.connections,
        Duration::from_secs(a.duration),
        true,
    )?;
    let secs = t0.elapsed().as_secs_f64();
    let r1 = srv.requests()?;
    let cpu1 = procfs::cpu_ticks(&pids)?;
    let requests = r1.saturating_sub(r0).max(1) as f64;
    let ticks = (cpu1 - cpu0) as f64;
    let us = ticks * 1e6 / procfs::ticks_per_sec() / requests;
    Ok((us, requests / secs))
}

/// `--sandbox-pairs`: worker CPU per request of shard with `worker_sandbox` off and on, N
/// pairs of fresh starts in alternating order (off-on, on-off, ...), each run after a 1 s
/// warm-up. With two CPUs or more the worker runs on the last one and the load on the first,
/// so neither competes with the other for a CPU.
fn sandbox_pairs(
    a: &SpeedArgs,
    shard: &std::path::Path,
    wrk: Option<&std::path::Path>,
) -> Result<String> {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let pin = cpus >= 2;
    if pin {
        procfs::pin(0, &[0])?;
    }
    let one = SpeedArgs {
        workers: 1,
        ..a.clone()
    };
    let mut pairs = Vec::new();
    let mut lines = String::new();
    for i in 0..a.sandbox_pairs {
        let order = if i % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        };
        let mut us = [0.0f64; 2];
        for on in order {
            let extra = if on { "worker_sandbox on;\n" } else { "" };
            let srv = servers::start_speed(&Kind::Shard(shard.to_path_buf()), 1, 0, extra)?;
            if pin {
                for pid in srv.worker_pids()? {
                    procfs::pin(pid, &[cpus - 1])?;
                }
            }
            run_load(
                srv.port,
                &a.path,
                wrk,
                a.connections,
                Duration::from_secs(1),
                true,
            )?;
            us[on as usize] = cpu_per_request(&srv, wrk, &one)?.0;
            srv.stop();
        }
        let change = us[1] / us[0] - 1.0;
        lines.push_str(&format!(
            "| {} | {} | {:.3} | {:.3} | {:+.2}% |\n",
            i + 1,
            if order[0] { "on, off" } else { "off, on" },
            us[0],
            us[1],
            change * 100.0
        ));
        pairs.push(change);
    }
    if pin {
        procfs::pin(0, &(0..cpus).collect::<Vec<_>>())?;
    }
    let n = pairs.len() as f64;
    let mean = pairs.iter().sum::<f64>() / n;
    let sd = if pairs.len() > 1 {
        (pairs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0)).sqrt()
    } else {
        0.0
    };
    let se = sd / n.sqrt();
    let mut s =
        format!(
        "\n## worker_sandbox cost: {} pairs, GET {}, 1 worker{}, {} connections, {} s per run\n\n",
        pairs.len(),
        a.path,
        if pin { " pinned apart from the load" } else { " (1 CPU: not pinned)" },
        a.connections,
        a.duration
    );
    s.push_str("| pair | order | off µs/req | on µs/req | change |\n|---|---|---|---|---|\n");
    s.push_str(&lines);
    s.push_str(&format!(
        "\nSandbox cost: mean {:+.2}% per request, standard error {:.2}%, median {:+.2}% ({} pairs)\n",
        mean * 100.0,
        se * 100.0,
        median(pairs.clone()) * 100.0,
        pairs.len()
    ));
    Ok(s)
}

/// The median of `v` (the mean of the middle two for an even count; 0 when empty).
pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

fn idle_memory(srv: &Running, n: usize) -> Result<f64> {
    let pids = srv.worker_pids()?;
    // Warm up: the first connections allocate what every connection then reuses.
    drop(load::idle_connections(srv.port, "/ok", 100.min(n))?);
    let m0 = procfs::rss_bytes(&pids)?;
    let conns = load::idle_connections(srv.port, "/ok", n)?;
    let m1 = procfs::rss_bytes(&pids)?;
    drop(conns);
    Ok((m1 as f64 - m0 as f64) / n as f64)
}

fn fmt(v: Option<f64>, digits: usize) -> String {
    v.map_or("-".to_string(), |x| format!("{x:.digits$}"))
}

fn render(a: &SpeedArgs, rows: &[Row], notes: &[String]) -> String {
    let mut s = String::new();
    s.push_str(&format!(
        "# shard-bench speed: GET {} ({}), {} workers, {} connections, {} s per run, {} idle connections{}\n\n",
        a.path,
        if a.path == "/ok" { "return 200 \"OK\"" } else { "a static file" },
        a.workers,
        a.connections,
        a.duration,
        a.idle,
        if a.smoke { " (smoke: numbers are not meaningful)" } else { "" }
    ));
    s.push_str("| server | syscalls/req keep-alive | syscalls/req new conn | worker CPU µs/req | req/s (keep-alive) | worker bytes/idle conn |\n");
    s.push_str("|---|---|---|---|---|---|\n");
    for r in rows {
        s.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} |\n",
            r.name,
            fmt(r.syscalls_keepalive, 3),
            fmt(r.syscalls_close, 3),
            fmt(r.cpu_us_per_req, 2),
            fmt(r.rps, 0),
            fmt(r.idle_bytes_per_conn, 0)
        ));
    }
    if rows.len() == 2 {
        let (x, y) = (&rows[0], &rows[1]);
        if let (Some(a), Some(b)) = (x.cpu_us_per_req, y.cpu_us_per_req) {
            s.push_str(&format!("\nCPU per request, shard/nginx: {:.2}\n", a / b));
        }
        if let (Some(a), Some(b)) = (x.idle_bytes_per_conn, y.idle_bytes_per_conn) {
            s.push_str(&format!(
                "Memory per idle connection, shard/nginx: {:.2}\n",
                a / b.max(1.0)
            ));
        }
    }
    for n in notes {
        s.push_str(&format!("\nnote: {n}\n"));
    }
    s
}
