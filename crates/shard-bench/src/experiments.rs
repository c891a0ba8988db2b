//! The articles' experiments (E1-E6, described in docs/bench.md), re-run on this machine against
//! shard in every accept strategy and, when installed, nginx with the same settings.
//!
//! This module owns the experiment plans (which configurations, which load, what to disturb),
//! the per-worker measurements (CPU from /proc for both servers, accepted connections from
//! `shard_status` for shard) and the output directory: `report.md`, SVG charts, `results.json`
//! and every configuration used (`confs/`), so that a user can re-run any row by hand.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use crate::procfs;
use crate::servers::{self, Kind, Running, Spec};
use crate::svg;

/// What the experiment runner needs from the load generator, in milliseconds.
#[derive(Debug, Clone, Default)]
pub struct Measured {
    pub requests: u64,
    pub errors: u64,
    pub rps: f64,
    pub min_ms: f64,
    pub mean_ms: f64,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    pub stdev_ms: f64,
    /// Requests per log2 bucket of microseconds: bucket i is `[2^i, 2^(i+1))` µs.
    pub log2_us: Vec<u64>,
}

/// One load run's shape.
#[derive(Debug, Clone)]
pub struct Load {
    pub path: String,
    pub conns: usize,
    pub close: bool,
    pub duration: Option<Duration>,
    pub requests: Option<u64>,
    pub headers: Vec<(String, String)>,
    /// Open loop at this many requests/s in total (each connection at its share); `None`:
    /// closed loop.
    pub rate: Option<f64>,
}

#[derive(clap::Args, Debug, Clone)]
pub struct ExperimentArgs {
    /// e1, e2, e3, e4, e5, e6, e7, e8 or all.
    pub which: String,
    /// Worker processes (E2 always uses 3, as the article).
    #[arg(long, default_value_t = 4)]
    pub workers: usize,
    /// Seconds per load run.
    #[arg(long, default_value_t = 5)]
    pub duration: u64,
    /// auto (use nginx when installed), off, or the path of an nginx binary.
    #[arg(long, default_value = "auto")]
    pub nginx: String,
    /// Output directory.
    #[arg(long, default_value = "bench/out")]
    pub out: PathBuf,
    /// The shard binary (default: next to this one).
    #[arg(long)]
    pub shard: Option<PathBuf>,
    /// E4: how long worker 0 stays stopped, in seconds (30 shows a long stall end to end).
    #[arg(long, default_value_t = 1.0)]
    pub stall: f64,
    /// E4: the open-loop arrival rate in requests/s; default: 40% of what shard serves here
    /// with a new connection per request, measured first. E7: the HTTP/2 clients' rate in
    /// all; default 16000.
    #[arg(long)]
    pub rate: Option<f64>,
    /// E3: also N pairs of shard's shared socket and reuseport with steering, fresh servers
    /// in alternating order, and the median of each pair's stdev ratio (drift between two
    /// rows measured a minute apart moves one ratio by tens of percent on a busy machine).
    #[arg(long, default_value_t = 0)]
    pub e3_pairs: usize,
    /// E1: also N rounds of shard reuseport with steering on and off, both servers running,
    /// measured in alternating order each round: the median requests/s ratio and each one's
    /// CPU max/min, closed loop and at half load (rows measured a minute apart differ by
    /// 5-15% here from drift alone).
    #[arg(long, default_value_t = 0)]
    pub e1_rounds: usize,
    /// Tiny counts and durations: checks the pipeline end to end (CI).
    #[arg(long)]
    pub smoke: bool,
}

/// An accept strategy as configuration.
#[derive(Clone)]
struct Strategy {
    name: &'static str,
    listen: &'static str,
    events: &'static str,
    /// nginx has no `shards=`: such strategies run on shard only.
    shard_only: bool,
}

const MUTEX_ON: Strategy = Strategy {
    name: "accept_mutex on",
    listen: "",
    events: "accept_mutex on;",
    shard_only: false,
};
const MUTEX_OFF: Strategy = Strategy {
    name: "accept_mutex off",
    listen: "",
    events: "accept_mutex off;",
    shard_only: false,
};
const REUSEPORT: Strategy = Strategy {
    name: "reuseport",
    listen: "reuseport",
    events: "",
    shard_only: false,
};
/// shard's reuseport as nginx has it: no steering away from a stalled worker.
const REUSEPORT_NO_STEERING: Strategy = Strategy {
    name: "reuseport, steering off",
    listen: "reuseport",
    events: "reuseport_steering off;",
    shard_only: true,
};
const SHARDS_1: Strategy = Strategy {
    name: "reuseport shards=1",
    listen: "reuseport shards=1",
    events: "",
    shard_only: true,
};
const SHARDS_AUTO: Strategy = Strategy {
    name: "reuseport shards=auto",
    listen: "reuseport shards=auto",
    events: "",
    shard_only: true,
};

/// One server run of an experiment.
struct Run<'a> {
    exp: &'a str,
    kind: &'a Kind,
    st: &'a Strategy,
    workers: usize,
    server_extra: &'a str,
}

/// One row of a table: one server in one strategy.
#[derive(Debug, Clone, Default)]
struct Row {
    experiment: String,
    server: String,
    strategy: String,
    load: Measured,

    /// Share of the workers' CPU time per worker (sums to 1).
    cpu_share: Vec<f64>,
    /// Share of accepted connections per worker (shard only).
    accepted_share: Option<Vec<f64>>,
    syscalls_per_request: Option<f64>,
    /// E1: the CPU shares again at half the row's requests/s, open loop (every connection at
    /// the same rate, so a worker's CPU follows the connections it holds, not the scheduler).
    half_load_cpu_share: Option<Vec<f64>>,
    /// E2's probe: the worker that took each of six sequential connections.
    probe: Option<Vec<Option<usize>>>,
    /// E4: what the stall did.
    stall: Option<StallStats>,
    /// E7: what the clients did.
    e7: Option<E7Stats>,
}

/// E7's numbers for one row.
#[derive(Debug, Clone, Default)]
struct E7Stats {
    /// The CPU shares of the run's second half (rebalancing has acted by then).
    settled_cpu_share: Vec<f64>,
    reconnects: u64,
    retried: u64,
    /// Per client: its requests in flight, and the worker that served most of its requests
    /// in the first and in the last third of them (`None`: unknown).
    clients: Vec<(usize, Option<usize>, Option<usize>)>,
}

/// E4's numbers for one row, from every request's start and end.
#[derive(Debug, Clone, Default)]
struct StallStats {
    workers: usize,
    rate: f64,
    /// Completions per second during the stall as a share of the second before it.
    served_share: f64,
    /// Requests whose (intended) start fell in the stall window.
    arrived: u64,
    /// Of those, answered after more than 100 ms or not at all.
    slow: u64,
    p99_ms: f64,
    p999_ms: f64,
    failed: u64,
    /// Completions per `TIMELINE_BIN_MS` over the whole run.
    timeline: Vec<u64>,
    /// The stall window, in milliseconds from the start.
    window_ms: (u64, u64),
}

/// Width of a bin of E4's time series.
const TIMELINE_BIN_MS: u64 = 50;
/// E4 counts a request slower than this as caught by the stall.
const SLOW_MS: u64 = 100;

impl Row {
    fn spread(v: &[f64]) -> String {
        let r = spread_of(v);
        if v.is_empty() {
            "-".into()
        } else if r.is_infinite() {
            "∞".into()
        } else {
            format!("{r:.2}")
        }
    }
}

fn pct(v: &[f64]) -> String {
    v.iter()
        .map(|x| format!("{:.0}%", x * 100.0))
        .collect::<Vec<_>>()
        .join(" / ")
}

fn shares(v: &[u64]) -> Vec<f64> {
    let total = v.iter().sum::<u64>().max(1) as f64;
    v.iter().map(|&x| x as f64 / total).collect()
}

struct Ctx {
    args: ExperimentArgs,
    shard: PathBuf,
    nginx: Option<PathBuf>,
    strace: Option<PathBuf>,
    rows: Vec<Row>,
    notes: Vec<String>,
    /// Experiments with reports of their own shape (E8): title, markdown.
    sections: Vec<(String, String)>,
}

impl Ctx {
    fn kinds(&self, s: &Strategy) -> Vec<Kind> {
        let mut k = vec![Kind::Shard(self.shard.clone())];
        if let (Some(n), false) = (&self.nginx, s.shard_only) {
            k.push(Kind::Nginx(n.clone()));
        }
        k
    }

    fn dur(&self, secs: u64) -> Duration {
        if self.args.smoke {
            Duration::from_millis(500)
        } else {
            Duration::from_secs(secs)
        }
    }

    /// Starts `kind` in `strategy`, keeps its configuration, runs `body`, stops it.
    fn with_server<T>(
        &mut self,
        run: Run<'_>,
        prepare: impl Fn(&Path) -> Result<()>,
        body: impl FnOnce(&mut Ctx, &Running) -> Result<T>,
    ) -> Result<T> {
        self.with_server_full(run, 0, prepare, body)
    }

    /// The same with room for `idle` more connections per worker.
    fn with_server_idle<T>(
        &mut self,
        run: Run<'_>,
        idle: usize,
        body: impl FnOnce(&mut Ctx, &Running) -> Result<T>,
    ) -> Result<T> {
        self.with_server_full(run, idle, |_| Ok(()), body)
    }

    fn with_server_full<T>(
        &mut self,
        run: Run<'_>,
        idle: usize,
        prepare: impl Fn(&Path) -> Result<()>,
        body: impl FnOnce(&mut Ctx, &Running) -> Result<T>,
    ) -> Result<T> {
        let Run {
            exp,
            kind,
            st,
            workers,
            server_extra,
        } = run;
        let spec = Spec {
            workers,
            listen_opts: st.listen.to_string(),
            events: st.events.to_string(),
            server_extra: server_extra.to_string(),
            ok: None,
            http_extra: String::new(),
            stream: None,
            main_extra: String::new(),
            idle,
            tag: format!("{exp}-{}", st.name.replace([' ', '=', ','], "_")),
            detach: false,
        };
        let srv = servers::start_with(kind, &spec, prepare)
            .with_context(|| format!("{exp}: starting {} ({})", kind.name(), st.name))?;
        let confs = self.args.out.join("confs");
        std::fs::create_dir_all(&confs)?;
        let keep = confs.join(format!(
            "{exp}-{}-{}.conf",
            kind.name(),
            st.name.replace([' ', '=', ','], "_")
        ));
        std::fs::copy(srv.conf_path(), keep)?;
        let res = body(self, &srv);
        srv.stop();
        res
    }
}

/// An experiment whose rows need nothing but the load and the measurements around it.
struct Plan<'a> {
    exp: &'a str,
    strategies: &'a [Strategy],
    workers: usize,
    server_extra: &'a str,
    prepare: fn(&Path) -> Result<()>,
    load: &'a Load,
    during: Option<&'a (dyn Fn(Vec<i32>) + Sync)>,
}

impl Ctx {
    /// Runs `plan.load` on every server in every strategy of the plan and records a row each.
    fn measured_rows(&mut self, plan: Plan<'_>) -> Result<()> {
        for st in plan.strategies {
            for kind in self.kinds(st) {
                let run = Run {
                    exp: plan.exp,
                    kind: &kind,
                    st,
                    workers: plan.workers,
                    server_extra: plan.server_extra,
                };
                let row = self.with_server(run, plan.prepare, |_, srv| {
                    let (m, cpu, acc) = measure(srv, plan.load, plan.during)?;
                    Ok(Row {
                        experiment: plan.exp.to_ascii_uppercase(),
                        server: kind.name().into(),
                        strategy: strategy_label(&kind, st),
                        load: m,
                        cpu_share: cpu,
                        accepted_share: acc,
                        ..Default::default()
                    })
                })?;
                self.rows.push(row);
            }
        }
        Ok(())
    }
}

/// Runs the load on `srv` and measures the workers around it. `during` runs alongside the
/// load (E4's stall) with the worker pids.
fn measure(
    srv: &Running,
    load: &Load,
    during: Option<&(dyn Fn(Vec<i32>) + Sync)>,
) -> Result<(Measured, Vec<f64>, Option<Vec<f64>>)> {
    let pids = srv.worker_pids()?;
    let cpu0: Vec<u64> = pids
        .iter()
        .map(|p| procfs::cpu_ticks(&[*p]).unwrap_or(0))
        .collect();
    let acc0 = srv.accepted_per_worker().ok().filter(|v| !v.is_empty());
    let m = std::thread::scope(|sc| {
        if let Some(f) = during {
            let pids = pids.clone();
            sc.spawn(move || f(pids));
        }
        drive(srv.port, load)
    })?;
    let cpu1: Vec<u64> = pids
        .iter()
        .map(|p| procfs::cpu_ticks(&[*p]).unwrap_or(0))
        .collect();
    let cpu: Vec<u64> = cpu1
        .iter()
        .zip(&cpu0)
        .map(|(a, b)| a.saturating_sub(*b))
        .collect();
    let acc = accepted_since(srv, acc0);
    Ok((m, shares(&cpu), acc))
}

/// Each worker's share of the connections accepted since `before` (read from `shard_status`
/// before the load); `None` when either read failed or the workers changed.
fn accepted_since(srv: &Running, before: Option<Vec<u64>>) -> Option<Vec<f64>> {
    match (before, srv.accepted_per_worker().ok()) {
        (Some(a0), Some(a1)) if a0.len() == a1.len() => Some(shares(
            &a1.iter()
                .zip(&a0)
                .map(|(a, b)| a.saturating_sub(*b))
                .collect::<Vec<_>>(),
        )),
        _ => None,
    }
}

/// The load generator, through its library interface.
pub fn drive(port: u16, load: &Load) -> Result<Measured> {
    drive_addr(std::net::SocketAddr::from(([127, 0, 0, 1], port)), load)
}

/// The same against any address (IPv6 included).
pub fn drive_addr(addr: std::net::SocketAddr, load: &Load) -> Result<Measured> {
    let target = crate::loadgen::Target::parse(&format!("http://{addr}{}", load.path))?;
    let mut spec = crate::loadgen::LoadSpec::new(target);
    spec.connections = load.conns.max(1);
    spec.threads = 2.min(spec.connections);
    spec.close = load.close;
    spec.headers = load.headers.clone();
    spec.requests = load.requests;
    spec.duration = load.duration.unwrap_or(crate::loadgen::MAX_DURATION);
    spec.rate = load.rate;
    let r = crate::loadgen::run(&spec)?;
    Ok(measured(&r))
}

/// The latency summary of a load report.
fn measured(r: &crate::loadgen::LoadReport) -> Measured {
    from_histogram(&r.histogram, r.requests, r.errors.total(), r.rps)
}

/// The latency summary of a histogram of microseconds.
fn from_histogram(
    h: &hdrhistogram::Histogram<u64>,
    requests: u64,
    errors: u64,
    rps: f64,
) -> Measured {
    let ms = |us: u64| us as f64 / 1000.0;
    let mut log2_us = Vec::new();
    for v in h.iter_recorded() {
        let low = h.lowest_equivalent(v.value_iterated_to()).max(1);
        let i = 63 - low.leading_zeros() as usize;
        if log2_us.len() <= i {
            log2_us.resize(i + 1, 0);
        }
        log2_us[i] += v.count_at_value();
    }
    let empty = h.is_empty();
    Measured {
        requests,
        errors,
        rps,
        min_ms: if empty { 0.0 } else { ms(h.min()) },
        mean_ms: h.mean() / 1000.0,
        p50_ms: ms(h.value_at_quantile(0.5)),
        p90_ms: ms(h.value_at_quantile(0.9)),
        p99_ms: ms(h.value_at_quantile(0.99)),
        max_ms: ms(h.max()),
        stdev_ms: h.stdev() / 1000.0,
        log2_us,
    }
}

pub fn run(args: ExperimentArgs) -> Result<()> {
    procfs::raise_nofile_limit();
    let shard = match &args.shard {
        Some(p) => p.clone(),
        None => std::env::current_exe()?.with_file_name("shard"),
    };
    anyhow::ensure!(
        shard.exists(),
        "no shard binary at {} (cargo build --release -p shard)",
        shard.display()
    );
    let nginx = match args.nginx.as_str() {
        "off" => None,
        "auto" => servers::find_nginx(None),
        p => Some(
            servers::find_nginx(Some(Path::new(p))).with_context(|| format!("no nginx at {p}"))?,
        ),
    };
    let mut notes = Vec::new();
    if nginx.is_none() && args.nginx == "auto" {
        notes.push(
            "nginx not found: shard rows only (install: apt-get install nginx-light)".to_string(),
        );
    }
    let strace = servers::which("strace");
    if strace.is_none() {
        notes.push(
            "strace not found: no syscall counts in E1 (install: apt-get install strace)"
                .to_string(),
        );
    }
    std::fs::create_dir_all(&args.out)?;
    let which = args.which.to_ascii_lowercase();
    let mut cx = Ctx {
        args,
        shard,
        nginx,
        strace,
        rows: Vec::new(),
        notes,
        sections: Vec::new(),
    };
    let all = which == "all";
    let mut ran = false;
    for (name, f) in [
        ("e1", e1 as fn(&mut Ctx) -> Result<()>),
        ("e2", e2),
        ("e3", e3),
        ("e4", e4),
        ("e5", e5),
        ("e6", e6),
        ("e7", e7),
        ("e8", e8),
    ] {
        if all || which == name {
            eprintln!("shard-bench: experiment {name}");
            f(&mut cx)?;
            ran = true;
        }
    }
    anyhow::ensure!(
        ran,
        "unknown experiment {which:?}: e1, e2, e3, e4, e5, e6, e7, e8 or all"
    );
    write_outputs(&cx)?;
    eprintln!(
        "shard-bench: report written to {}",
        cx.args.out.join("report.md").display()
    );
    Ok(())
}

fn ok_load(cx: &Ctx, close: bool, conns: usize, secs: u64) -> Load {
    Load {
        path: "/ok".into(),
        conns: if cx.args.smoke { conns.min(8) } else { conns },
        close,
        duration: Some(cx.dur(secs)),
        requests: None,
        headers: Vec::new(),
        rate: None,
    }
}

/// E8: QUIC connections through reloads, a stall and port rebinding, with steering by
/// connection ID and with the kernel's hash (`quic.rs`). shard only: Debian's nginx 1.22 has
/// no HTTP/3.
fn e8(cx: &mut Ctx) -> Result<()> {
    let rows = crate::quic::e8(&cx.shard, cx.args.smoke, cx.args.rate)?;
    let body = crate::quic::report(&rows, &cx.args.out)?;
    if cx.args.smoke {
        let done: u64 = rows.iter().map(|r| r.requests).sum();
        anyhow::ensure!(done > 0, "e8: no request was answered");
        let steered_fail: u64 = rows
            .iter()
            .filter(|r| r.steering && r.scenario == "base")
            .map(|r| r.failed + r.hung)
            .sum();
        anyhow::ensure!(
            steered_fail == 0,
            "e8: base connections failed with steering"
        );
    }
    cx.sections.push((
        "E8. QUIC connections through reloads, a stalled worker and port rebinding: steering \
         by connection ID against the kernel's hash (shard only: nginx 1.22 has no HTTP/3)"
            .to_string(),
        body,
    ));
    Ok(())
}

/// E1: requests/s and latency by accept strategy, `return 200 "OK"`, keep-alive.
fn e1(cx: &mut Ctx) -> Result<()> {
    let workers = cx.args.workers;
    let load = ok_load(cx, false, 50, cx.args.duration);
    for st in &[MUTEX_ON, MUTEX_OFF, REUSEPORT, REUSEPORT_NO_STEERING] {
        for kind in cx.kinds(st) {
            let row = cx.with_server(
                Run {
                    exp: "e1",
                    kind: &kind,
                    st,
                    workers,
                    server_extra: "",
                },
                |_| Ok(()),
                |cx, srv| {
                    let (m, cpu, acc) = measure(srv, &load, None)?;
                    let half_cpu = measure_half_load(srv, &load, m.rps)?;
                    let mut row = Row {
                        experiment: "E1".into(),
                        half_load_cpu_share: Some(half_cpu),
                        server: kind.name().into(),
                        strategy: strategy_label(&kind, st),
                        load: m,
                        cpu_share: cpu,
                        accepted_share: acc,
                        ..Default::default()
                    };
                    if let Some(strace) = cx.strace.clone() {
                        let pids = srv.worker_pids()?;
                        let tracer = procfs::Strace::attach(&strace, &pids)?;
                        let r0 = srv.requests()?;
                        let traced = Load {
                            duration: Some(cx.dur(2)),
                            ..load.clone()
                        };
                        drive(srv.port, &traced)?;
                        let r1 = srv.requests()?;
                        let calls = tracer.finish()?;
                        row.syscalls_per_request =
                            Some(calls as f64 / r1.saturating_sub(r0).max(1) as f64);
                    }
                    Ok(row)
                },
            )?;
            cx.rows.push(row);
        }
    }
    if cx.args.e1_rounds > 0 {
        e1_rounds(cx, &load)?;
    }
    Ok(())
}

/// The CPU shares of `load` run again open loop at half of `rps` (what it served closed
/// loop), on new connections, so the placement is drawn (or dealt) again: every connection
/// then sends at the same rate, and a worker's CPU follows the connections it holds.
fn measure_half_load(srv: &Running, load: &Load, rps: f64) -> Result<Vec<f64>> {
    let half = Load {
        rate: Some((rps / 2.0).max(100.0)),
        ..load.clone()
    };
    Ok(measure(srv, &half, None)?.1)
}

/// A ratio of the spread of `shares` (max/min; infinite where a worker had none).
fn spread_of(shares: &[f64]) -> f64 {
    let max = shares.iter().copied().fold(0.0, f64::max);
    let min = shares.iter().copied().fold(f64::INFINITY, f64::min);
    if min > 0.0 {
        max / min
    } else {
        f64::INFINITY
    }
}

/// E1's rounds (`--e1-rounds`): steering on and off side by side, alternating.
fn e1_rounds(cx: &mut Ctx, load: &Load) -> Result<()> {
    let workers = cx.args.workers;
    let rounds = cx.args.e1_rounds;
    let shard = Kind::Shard(cx.shard.clone());
    let run = |st| Run {
        exp: "e1-rounds",
        kind: &shard,
        st,
        workers,
        server_extra: "",
    };
    // Per round, [on, off]: requests/s, CPU max/min closed loop and at half load.
    let mut rps = Vec::new();
    let mut cpu = [Vec::new(), Vec::new()];
    let mut half = [Vec::new(), Vec::new()];
    cx.with_server(
        run(&REUSEPORT),
        |_| Ok(()),
        |cx, on| {
            cx.with_server(
                run(&REUSEPORT_NO_STEERING),
                |_| Ok(()),
                |_, off| {
                    for i in 0..rounds {
                        let mut r = [0.0f64; 2];
                        for k in if i % 2 == 0 { [0, 1] } else { [1, 0] } {
                            let srv = if k == 0 { on } else { off };
                            let (m, c, _) = measure(srv, load, None)?;
                            let hc = measure_half_load(srv, load, m.rps)?;
                            r[k] = m.rps;
                            cpu[k].push(spread_of(&c));
                            half[k].push(spread_of(&hc));
                        }
                        rps.push(r[0] / r[1].max(1e-9));
                    }
                    Ok(())
                },
            )
        },
    )?;
    let list = |v: &[f64]| {
        v.iter()
            .map(|x| format!("{x:.2}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    // `a, b, c (median m)`
    let summed = |v: &[f64]| format!("{} (median {:.2})", list(v), crate::median(v.to_vec()));
    cx.notes.push(format!(
        "E1 rounds ({workers} workers, both servers running, alternating order): requests/s \
         steering on / off per round {}, median **{:.3}**; CPU max/min closed loop, on: {}, \
         off: {}; at half load (open loop), on: {}, off: {}",
        list(&rps),
        crate::median(rps.clone()),
        summed(&cpu[0]),
        summed(&cpu[1]),
        summed(&half[0]),
        summed(&half[1]),
    ));
    Ok(())
}

/// E2: who gets the connection. 3 workers; six sequential connections (kept open so the
/// holder can be found), then a per-worker load share under a connection-per-request run.
fn e2(cx: &mut Ctx) -> Result<()> {
    let load = ok_load(cx, true, 6, cx.args.duration);
    for st in [MUTEX_ON, MUTEX_OFF, REUSEPORT] {
        for kind in cx.kinds(&st) {
            let row = cx.with_server(
                Run {
                    exp: "e2",
                    kind: &kind,
                    st: &st,
                    workers: 3,
                    server_extra: "",
                },
                |_| Ok(()),
                |_, srv| {
                    let mut probe = Vec::new();
                    let mut held = Vec::new();
                    for _ in 0..6 {
                        let mut s = std::net::TcpStream::connect(("127.0.0.1", srv.port))?;
                        use std::io::{Read, Write};
                        s.write_all(b"GET /ok HTTP/1.1\r\nHost: bench\r\n\r\n")?;
                        let mut b = [0u8; 512];
                        let _ = s.read(&mut b)?;
                        probe.push(srv.worker_holding(s.local_addr()?.port())?);
                        held.push(s);
                    }
                    drop(held);
                    let (m, cpu, acc) = measure(srv, &load, None)?;
                    Ok(Row {
                        experiment: "E2".into(),
                        server: kind.name().into(),
                        strategy: strategy_label(&kind, &st),
                        load: m,
                        cpu_share: cpu,
                        accepted_share: acc,
                        probe: Some(probe),
                        ..Default::default()
                    })
                },
            )?;
            cx.rows.push(row);
        }
    }
    Ok(())
}

/// Size of E3's compressible file: gzip of it costs the worker real CPU per request.
const E3_FILE_BYTES: usize = 256 * 1024;

fn e3_file(dir: &Path) -> Result<()> {
    let mut text = String::with_capacity(E3_FILE_BYTES + 128);
    let mut i = 0u64;
    while text.len() < E3_FILE_BYTES {
        let _ = writeln!(
            text,
            "line {i}: the quick brown fox jumps over the lazy dog {}",
            i * 7919 % 1000
        );
        i += 1;
    }
    std::fs::write(dir.join("html/big.txt"), text)?;
    Ok(())
}

/// E3: latency distribution under CPU-heavy requests (gzip), a connection per request.
fn e3(cx: &mut Ctx) -> Result<()> {
    let workers = cx.args.workers;
    let load = Load {
        path: "/big.txt".into(),
        conns: if cx.args.smoke { 8 } else { 200 },
        close: true,
        duration: None,
        requests: Some(if cx.args.smoke { 50 } else { 20_000 }),
        headers: vec![("Accept-Encoding".into(), "gzip".into())],
        rate: None,
    };
    let server_extra = "gzip on; gzip_comp_level 6; gzip_types text/plain;";
    cx.measured_rows(Plan {
        exp: "e3",
        strategies: &[MUTEX_OFF, REUSEPORT, REUSEPORT_NO_STEERING],
        workers,
        server_extra,
        prepare: e3_file,
        load: &load,
        during: None,
    })?;
    if cx.args.e3_pairs == 0 {
        return Ok(());
    }
    let shard = Kind::Shard(cx.shard.clone());
    let mut ratios = Vec::new();
    // Requests/s of the same pairs: a lower spread bought with less throughput would show.
    let mut rps_ratios = Vec::new();
    let mut lines = String::new();
    for i in 0..cx.args.e3_pairs {
        let order = if i % 2 == 0 {
            [&MUTEX_OFF, &REUSEPORT]
        } else {
            [&REUSEPORT, &MUTEX_OFF]
        };
        let mut stdev = [0.0f64; 2];
        let mut rps = [0.0f64; 2];
        for st in order {
            let run = Run {
                exp: "e3",
                kind: &shard,
                st,
                workers,
                server_extra,
            };
            let m = cx.with_server(run, e3_file, |_, srv| Ok(measure(srv, &load, None)?.0))?;
            stdev[usize::from(st.name == REUSEPORT.name)] = m.stdev_ms;
            rps[usize::from(st.name == REUSEPORT.name)] = m.rps;
        }
        let ratio = stdev[1] / stdev[0].max(1e-9);
        rps_ratios.push(rps[1] / rps[0].max(1e-9));
        let _ = write!(
            lines,
            "{}{:.2}/{:.2}={:.2}",
            if i == 0 { "" } else { ", " },
            stdev[1],
            stdev[0],
            ratio
        );
        ratios.push(ratio);
    }
    cx.notes.push(format!(
        "E3 pairs ({workers} workers): latency stdev ms of shard reuseport with steering / shard \
         shared socket (`accept_mutex off`), fresh servers in alternating order: {lines}; \
         median ratio {:.2} over {} pairs; requests/s of the same pairs, steering / shared \
         socket: median {:.2}",
        crate::median(ratios.clone()),
        ratios.len(),
        crate::median(rps_ratios)
    ));
    Ok(())
}

/// E4: one worker stopped (SIGSTOP) for `--stall` seconds during an open-loop,
/// connection-per-request run at a fixed arrival rate, with 2 and `--workers` workers.
fn e4(cx: &mut Ctx) -> Result<()> {
    let mut counts = vec![2, cx.args.workers.max(2)];
    counts.dedup();
    let (warm, stall, after) = if cx.args.smoke {
        (
            Duration::from_millis(300),
            Duration::from_millis(300),
            Duration::from_millis(300),
        )
    } else {
        (
            Duration::from_millis(1500),
            Duration::from_secs_f64(cx.args.stall.clamp(0.05, 120.0)),
            Duration::from_millis(1500),
        )
    };
    let strategies = [REUSEPORT, REUSEPORT_NO_STEERING, MUTEX_ON, MUTEX_OFF];
    for workers in counts {
        let rate = match cx.args.rate {
            Some(r) => r,
            None => e4_calibrate(cx, workers)? * E4_RATE_SHARE,
        };
        // Enough connections that those the stall holds do not throttle the arrivals: an
        // open loop sends on time only from a free connection.
        let conns = if cx.args.smoke {
            16
        } else {
            ((rate * (stall.as_secs_f64() + 0.5)) as usize).clamp(200, 4000)
        };
        let load = Load {
            path: "/ok".into(),
            conns,
            close: true,
            duration: Some(warm + stall + after),
            requests: None,
            headers: Vec::new(),
            rate: None,
        };
        for st in &strategies {
            for kind in cx.kinds(st) {
                let tag = format!("e4-{workers}w");
                let run = Run {
                    exp: &tag,
                    kind: &kind,
                    st,
                    workers,
                    server_extra: "",
                };
                let row = cx.with_server_idle(run, conns, |_, srv| {
                    let pids = srv.worker_pids()?;
                    let victim = *pids.first().context("no worker")?;
                    let acc0 = srv.accepted_per_worker().ok();
                    let r = std::thread::scope(|sc| {
                        sc.spawn(move || {
                            std::thread::sleep(warm);
                            let t = Instant::now();
                            // kill(2) with plain integers.
                            unsafe { libc::kill(victim, libc::SIGSTOP) };
                            std::thread::sleep(stall.saturating_sub(t.elapsed()));
                            unsafe { libc::kill(victim, libc::SIGCONT) };
                        });
                        drive_open(srv.port, &load, rate)
                    })?;
                    let acc = accepted_since(srv, acc0);
                    let window = (warm.as_millis() as u64, (warm + stall).as_millis() as u64);
                    let stats = stall_stats(&r.samples, window, workers, rate);
                    Ok(Row {
                        experiment: "E4".into(),
                        server: kind.name().into(),
                        strategy: format!("{} ({workers} workers)", strategy_label(&kind, st)),
                        load: measured(&r),
                        accepted_share: acc,
                        stall: Some(stats),
                        ..Default::default()
                    })
                })?;
                cx.rows.push(row);
            }
        }
    }
    cx.notes.push(format!(
        "E4: open loop (arrivals on schedule whatever the answers; latency counted from the intended start), \
         a new connection per request; worker 0 stopped with SIGSTOP {:.1} s into each run for {:.1} s; \
         a request is slow past {SLOW_MS} ms",
        warm.as_secs_f64(),
        stall.as_secs_f64()
    ));
    Ok(())
}

/// shard's reuseport rows say whether steering is on; nginx's have none.
fn strategy_label(kind: &Kind, st: &Strategy) -> String {
    if matches!(kind, Kind::Shard(_)) && st.name == REUSEPORT.name {
        "reuseport, steering on".to_string()
    } else {
        st.name.to_string()
    }
}

/// E4's default arrival rate as a share of the calibration run's requests/s: below half, so
/// that with 2 workers and one stopped the survivor is not already at the machine's limit
/// (at exactly half it is, on 2 CPUs shared with the load generator, and the run then
/// measures capacity, not steering).
const E4_RATE_SHARE: f64 = 0.4;

/// What shard serves here, closed loop, a new connection per request, reuseport (requests/s).
fn e4_calibrate(cx: &mut Ctx, workers: usize) -> Result<f64> {
    let load = ok_load(cx, true, 50, 2);
    let kind = Kind::Shard(cx.shard.clone());
    let run = Run {
        exp: "e4-calibrate",
        kind: &kind,
        st: &REUSEPORT,
        workers,
        server_extra: "",
    };
    let rps = cx.with_server(run, |_| Ok(()), |_, srv| Ok(drive(srv.port, &load)?.rps))?;
    anyhow::ensure!(rps > 0.0, "E4: the calibration run served nothing");
    cx.notes.push(format!(
        "E4 ({workers} workers): shard served {rps:.0} requests/s closed loop with a new connection \
         per request; the open loop runs at {:.0}% of that unless --rate says otherwise",
        E4_RATE_SHARE * 100.0
    ));
    Ok(rps)
}

/// E4's numbers from a recorded run: the stall window is `window` (ms from the start).
fn stall_stats(
    samples: &[crate::loadgen::Sample],
    window: (u64, u64),
    workers: usize,
    rate: f64,
) -> StallStats {
    let (w0, w1) = (window.0 * 1000, window.1 * 1000);
    let before_from = w0.saturating_sub(1_000_000);
    let done_in = |a: u64, b: u64| {
        samples
            .iter()
            .filter(|s| s.ok && s.done_us >= a && s.done_us < b)
            .count() as f64
    };
    let before = done_in(before_from, w0) / ((w0 - before_from).max(1) as f64 / 1e6);
    let during = done_in(w0, w1) / ((w1 - w0).max(1) as f64 / 1e6);
    let arrived: Vec<_> = samples
        .iter()
        .filter(|s| s.start_us >= w0 && s.start_us < w1)
        .collect();
    let slow = arrived
        .iter()
        .filter(|s| !s.ok || s.done_us.saturating_sub(s.start_us) > SLOW_MS * 1000)
        .count() as u64;
    let mut lat: Vec<u64> = samples
        .iter()
        .filter(|s| s.ok)
        .map(|s| s.done_us.saturating_sub(s.start_us))
        .collect();
    lat.sort_unstable();
    let q = |p: f64| {
        if lat.is_empty() {
            0.0
        } else {
            lat[((lat.len() as f64 * p) as usize).min(lat.len() - 1)] as f64 / 1000.0
        }
    };
    let end = samples.iter().map(|s| s.done_us).max().unwrap_or(0);
    let bins = (end / (TIMELINE_BIN_MS * 1000) + 1) as usize;
    let mut timeline = vec![0u64; bins];
    for s in samples.iter().filter(|s| s.ok) {
        timeline[(s.done_us / (TIMELINE_BIN_MS * 1000)) as usize] += 1;
    }
    StallStats {
        workers,
        rate,
        served_share: if before > 0.0 { during / before } else { 0.0 },
        arrived: arrived.len() as u64,
        slow,
        p99_ms: q(0.99),
        p999_ms: q(0.999),
        failed: samples.iter().filter(|s| !s.ok).count() as u64,
        timeline,
        window_ms: window,
    }
}

/// An open-loop run at `rate` requests/s that keeps every request's start and end.
fn drive_open(port: u16, load: &Load, rate: f64) -> Result<crate::loadgen::LoadReport> {
    let target = crate::loadgen::Target::parse(&format!("http://127.0.0.1:{port}{}", load.path))?;
    let mut spec = crate::loadgen::LoadSpec::new(target);
    spec.connections = load.conns.max(1);
    spec.threads = 2.min(spec.connections);
    spec.close = load.close;
    spec.rate = Some(rate);
    spec.record = true;
    spec.duration = load.duration.unwrap_or(crate::loadgen::MAX_DURATION);
    spec.timeout = Duration::from_secs(60).max(spec.duration);
    crate::loadgen::run(&spec)
}

/// E5: fewer shards than workers: shards=auto, shards=1 and one shard per worker.
fn e5(cx: &mut Ctx) -> Result<()> {
    let workers = cx.args.workers;
    let load = ok_load(cx, true, 50, cx.args.duration);
    cx.measured_rows(Plan {
        exp: "e5",
        strategies: &[SHARDS_AUTO, SHARDS_1, REUSEPORT, MUTEX_OFF],
        workers,
        server_extra: "",
        prepare: |_| Ok(()),
        load: &load,
        during: None,
    })?;
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    cx.notes.push(format!(
        "E5: shards=auto is {} shard(s) here ({cpus} CPUs / 8, at least 1)",
        (cpus / 8).clamp(1, workers)
    ));
    Ok(())
}

/// E6: reloads that change `worker_processes` (2 <-> 4) under a connection-per-request load,
/// `reuseport`: every failed request is a connection lost by the reload.
fn e6(cx: &mut Ctx) -> Result<()> {
    let reloads = if cx.args.smoke { 4 } else { 30 };
    let gap = if cx.args.smoke {
        Duration::from_millis(150)
    } else {
        Duration::from_millis(300)
    };
    let mut load = ok_load(cx, true, 20, 1);
    load.duration = Some(gap * (reloads + 2));
    let st = REUSEPORT;
    for kind in cx.kinds(&st) {
        let row = cx.with_server(
            Run {
                exp: "e6",
                kind: &kind,
                st: &st,
                workers: 2,
                server_extra: "",
            },
            |_| Ok(()),
            |_, srv| {
                let (port, dir, master) = (srv.port, srv.dir.clone(), srv.master_pid());
                let conf_path = srv.conf_path();
                let kind_ref = &kind;
                let reloader = move |_pids: Vec<i32>| {
                    for i in 0..reloads {
                        std::thread::sleep(gap);
                        let spec = Spec {
                            workers: if i % 2 == 0 { 4 } else { 2 },
                            listen_opts: st.listen.to_string(),
                            events: st.events.to_string(),
                            server_extra: String::new(),
                            ok: None,
                            http_extra: String::new(),
                            stream: None,
                            main_extra: String::new(),
                            idle: 0,
                            tag: String::new(),
                            detach: false,
                        };
                        let _ = std::fs::write(&conf_path, spec.conf(kind_ref, port, &dir));
                        // SAFETY-free: kill(2) with plain integers.
                        unsafe { libc::kill(master, libc::SIGHUP) };
                    }
                };
                let (m, cpu, acc) = measure(srv, &load, Some(&reloader))?;
                Ok(Row {
                    experiment: "E6".into(),
                    server: kind.name().into(),
                    strategy: format!("{} ({reloads} reloads, workers 2 <-> 4)", st.name),
                    load: m,
                    cpu_share: cpu,
                    accepted_share: acc,
                    ..Default::default()
                })
            },
        )?;
        cx.rows.push(row);
    }
    Ok(())
}

/// E7: a few long-lived HTTP/2 connections of unequal weight. Every client connects and
/// learns its worker first; then the clients on the worker that holds the most of them send
/// `HEAVY` times the others' rate: the case connection-level balancing cannot fix
/// (whichever worker accepted the heavy clients carries them), built on purpose rather than
/// waited for. Open loop, `--rate` requests/s in all (default `E7_RATE`); clients reconnect
/// on `GOAWAY` (`h2client.rs`).
fn e7(cx: &mut Ctx) -> Result<()> {
    const HEAVY: usize = 8;
    const LIGHT: usize = 1;
    let smoke = cx.args.smoke;
    let clients = if smoke { 4 } else { 8 };
    // Rebalancing looks once a second and waits two after acting: a run needs room for that.
    let duration = if smoke {
        cx.dur(1)
    } else {
        Duration::from_secs(cx.args.duration.max(12))
    };
    let workers = cx.args.workers;
    let total = cx
        .args
        .rate
        .unwrap_or(if smoke { E7_RATE / 10.0 } else { E7_RATE });
    // Half the clients heavy, as near as the placement allows: the unit from that split.
    let unit_rate = total / ((clients / 2 * HEAVY + (clients - clients / 2) * LIGHT) as f64);
    let variants: [(&str, &str, bool); 2] = [
        ("reuseport, http2_rebalance off", "", false),
        ("reuseport, http2_rebalance on", "http2_rebalance on;", true),
    ];
    for (name, directive, shard_only) in variants {
        let st = Strategy {
            name,
            listen: "reuseport",
            events: "",
            shard_only,
        };
        for kind in cx.kinds(&st) {
            let h2_port = servers::free_port()?;
            let extra = format!(
                "listen 127.0.0.1:{h2_port} reuseport http2;\n        \
                 add_header X-Pid $pid always;\n        {directive}"
            );
            let row = cx.with_server(
                Run {
                    exp: "e7",
                    kind: &kind,
                    st: &st,
                    workers,
                    server_extra: &extra,
                },
                |_| Ok(()),
                |_, srv| {
                    let pids = srv.worker_pids()?;
                    let ticks = |pids: &[i32]| -> Vec<u64> {
                        pids.iter()
                            .map(|p| procfs::cpu_ticks(&[*p]).unwrap_or(0))
                            .collect()
                    };
                    let spec = crate::h2client::Spec {
                        addr: std::net::SocketAddr::from(([127, 0, 0, 1], h2_port)),
                        path: "/ok".into(),
                        assign: Box::new(|on: &[u32]| {
                            let mut count: Vec<(u32, usize)> = Vec::new();
                            for &p in on.iter().filter(|&&p| p != 0) {
                                match count.iter_mut().find(|c| c.0 == p) {
                                    Some(c) => c.1 += 1,
                                    None => count.push((p, 1)),
                                }
                            }
                            let most = count.iter().max_by_key(|c| c.1).map(|c| c.0);
                            on.iter()
                                .map(|&p| if Some(p) == most { HEAVY } else { LIGHT })
                                .collect()
                        }),
                        unit_rate,
                        clients,
                        duration,
                    };
                    let cpu0 = ticks(&pids);
                    let (report, cpu_mid) = std::thread::scope(|sc| {
                        let load = sc.spawn(|| crate::h2client::run(spec));
                        // The probes take a moment; the halves are near enough.
                        std::thread::sleep(duration / 2);
                        let mid = ticks(&pids);
                        (load.join(), mid)
                    });
                    let report = report.map_err(|_| anyhow::anyhow!("the E7 load panicked"))??;
                    let cpu1 = ticks(&pids);
                    let diff = |a: &[u64], b: &[u64]| -> Vec<u64> {
                        a.iter().zip(b).map(|(x, y)| x.saturating_sub(*y)).collect()
                    };
                    let worker_of = |pid: u32| pids.iter().position(|&p| p as u32 == pid);
                    let secs = report.elapsed.as_secs_f64().max(1e-3);
                    let m = from_histogram(
                        &report.histogram,
                        report.requests,
                        report.errors,
                        report.requests as f64 / secs,
                    );
                    let clients = report
                        .clients
                        .iter()
                        .map(|c| {
                            let first = c.served_by.first().and_then(|s| worker_of(s.0));
                            let last = c.served_by.last().and_then(|s| worker_of(s.0));
                            (c.weight, first, last)
                        })
                        .collect();
                    Ok(Row {
                        experiment: "E7".into(),
                        server: kind.name().into(),
                        strategy: strategy_label(&kind, &st),
                        load: m,
                        cpu_share: shares(&diff(&cpu1, &cpu0)),
                        e7: Some(E7Stats {
                            settled_cpu_share: shares(&diff(&cpu1, &cpu_mid)),
                            reconnects: report.clients.iter().map(|c| c.reconnects).sum(),
                            retried: report.clients.iter().map(|c| c.retried).sum(),
                            clients,
                        }),
                        ..Default::default()
                    })
                },
            )?;
            cx.rows.push(row);
        }
    }
    Ok(())
}

/// E7's requests per second in all, when `--rate` does not say: well under what either
/// server serves on two cores, so that the CPU shares follow the clients' placement.
const E7_RATE: f64 = 16_000.0;

fn e7_report(s: &mut String, rows: &[&Row]) {
    let _ = writeln!(
        s,
        "Each client sends its requests at a fixed rate on one h2c connection (latency from \
         when each was due) and reconnects on `GOAWAY`; the clients on the worker that took \
         the most of them send 8 times the others' rate. CPU shares from `/proc`, per worker; \"second half\": once rebalancing \
         (one look a second, two seconds' hold after acting) has acted. Where each client was \
         served: its first worker -> its last (`*`: a heavy client).\n"
    );
    let _ = writeln!(
        s,
        "| server | strategy | req/s | p50 ms | p99 | max | errors | reconnects | retried | \
         CPU share per worker | max/min CPU | second half | max/min CPU, second half | clients |"
    );
    let _ = writeln!(
        s,
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    );
    for r in rows {
        let m = &r.load;
        let x = r.e7.clone().unwrap_or_default();
        let w = |v: Option<usize>| v.map_or("?".into(), |v| format!("w{v}"));
        let placed: Vec<String> = x
            .clients
            .iter()
            .map(|&(weight, a, b)| {
                let star = if weight > 1 { "*" } else { "" };
                if a == b {
                    format!("{}{star}", w(a))
                } else {
                    format!("{}->{}{star}", w(a), w(b))
                }
            })
            .collect();
        let _ = writeln!(
            s,
            "| {} | {} | {:.0} | {:.2} | {:.2} | {:.2} | {} | {} | {} | {} | {} | {} | {} | {} |",
            r.server,
            r.strategy,
            m.rps,
            m.p50_ms,
            m.p99_ms,
            m.max_ms,
            m.errors,
            x.reconnects,
            x.retried,
            pct(&r.cpu_share),
            Row::spread(&r.cpu_share),
            pct(&x.settled_cpu_share),
            Row::spread(&x.settled_cpu_share),
            placed.join(" "),
        );
    }
}

const TITLES: [(&str, &str); 7] = [
    ("E1", "Throughput and latency by accept strategy (NGINX 1.9.1 article): return 200 \"OK\", keep-alive, 50 connections"),
    ("E2", "Who gets the connection (Cloudflare): 3 workers, six sequential connections, then a connection-per-request run"),
    ("E3", "Latency under CPU-heavy requests (Cloudflare): gzip of a 256 KiB text file, a connection per request, 200 connections"),
    ("E4", "A stalled worker (Cloudflare): one worker SIGSTOPped during a connection-per-request run"),
    ("E5", "Fewer shards than workers (Intel, nginx-devel): return 200 \"OK\", a connection per request"),
    ("E6", "Sockets survive reloads (nginx-devel): worker_processes 2 <-> 4 under a connection-per-request load; errors are lost connections"),
    ("E7", "Multiplexing makes connection balancing coarse: a few long-lived HTTP/2 connections of unequal weight, the heavy ones on one worker; shard with http2_rebalance off and on, nginx"),
];

fn machine() -> String {
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let migrate = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_migrate_req").unwrap_or_default();
    format!(
        "{cpus} CPUs available to the process, Linux {}, net.ipv4.tcp_migrate_req={}",
        kernel.trim(),
        migrate.trim()
    )
}

fn nginx_version(bin: &Path) -> String {
    std::process::Command::new(bin)
        .arg("-v")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stderr).trim().to_string())
        .unwrap_or_default()
}

fn report(cx: &Ctx) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "# shard-bench experiments\n");
    let _ = writeln!(s, "- machine: {}", machine());
    let _ = writeln!(s, "- shard: {}", cx.shard.display());
    if let Some(n) = &cx.nginx {
        let _ = writeln!(s, "- nginx: {} ({})", n.display(), nginx_version(n));
    }
    let args: Vec<String> = std::env::args().collect();
    let _ = writeln!(s, "- command: `{}`", args.join(" "));
    let _ = writeln!(s, "- configurations: `confs/` (run any of them by hand with `shard -p DIR -c FILE` or `nginx -p DIR -c FILE`)");
    if cx.args.smoke {
        let _ = writeln!(
            s,
            "- **smoke run: tiny durations, the numbers mean nothing**"
        );
    }
    for (exp, title) in TITLES {
        let rows: Vec<&Row> = cx.rows.iter().filter(|r| r.experiment == exp).collect();
        if rows.is_empty() {
            continue;
        }
        let _ = writeln!(s, "\n## {exp}. {title}\n");
        if exp == "E4" {
            e4_report(&mut s, &rows);
            continue;
        }
        if exp == "E7" {
            e7_report(&mut s, &rows);
            for chart in charts_for(exp) {
                let _ = writeln!(s, "\n![{exp} {chart}]({chart})");
            }
            continue;
        }
        let _ = writeln!(s, "| server | strategy | req/s | mean ms | p50 | p90 | p99 | max | stdev ms | errors | CPU share per worker | max/min CPU | accepted share | max/min accepted |{}",
            if exp == "E1" { " syscalls/req | max/min CPU at half load |" } else if exp == "E2" { " six connections went to |" } else { "" });
        let _ = writeln!(
            s,
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|{}",
            if exp == "E1" {
                "---|---|"
            } else if exp == "E2" {
                "---|"
            } else {
                ""
            }
        );
        for r in rows {
            let m = &r.load;
            let acc = r.accepted_share.as_deref();
            let _ = write!(
                s,
                "| {} | {} | {:.0} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {} | {} | {} | {} | {} |",
                r.server,
                r.strategy,
                m.rps,
                m.mean_ms,
                m.p50_ms,
                m.p90_ms,
                m.p99_ms,
                m.max_ms,
                m.stdev_ms,
                m.errors,
                pct(&r.cpu_share),
                Row::spread(&r.cpu_share),
                acc.map_or("-".into(), pct),
                acc.map_or("-".into(), Row::spread),
            );
            if exp == "E1" {
                let _ = write!(
                    s,
                    " {} | {} |",
                    r.syscalls_per_request
                        .map_or("-".into(), |v| format!("{v:.3}")),
                    r.half_load_cpu_share
                        .as_deref()
                        .map_or("-".into(), Row::spread)
                );
            }
            if exp == "E2" {
                let p = r.probe.as_deref().unwrap_or(&[]);
                let txt: Vec<String> = p
                    .iter()
                    .map(|w| w.map_or("?".into(), |w| format!("w{w}")))
                    .collect();
                let _ = write!(s, " {} |", txt.join(" "));
            }
            s.push('\n');
        }
        for chart in charts_for(exp) {
            let _ = writeln!(s, "\n![{exp} {chart}]({chart})");
        }
    }
    for (title, body) in &cx.sections {
        let _ = writeln!(s, "\n## {title}\n\n{body}");
    }
    if !cx.notes.is_empty() {
        let _ = writeln!(s, "\n## Notes\n");
        for n in &cx.notes {
            let _ = writeln!(s, "- {n}");
        }
    }
    s
}

/// The worker counts E4 ran with, in run order.
fn e4_worker_counts(rows: &[&Row]) -> Vec<usize> {
    let mut counts: Vec<usize> = rows
        .iter()
        .filter_map(|r| r.stall.as_ref())
        .map(|x| x.workers)
        .collect();
    counts.dedup();
    counts
}

/// E4's table, its goals and charts (per worker count).
fn e4_report(s: &mut String, rows: &[&Row]) {
    let _ = writeln!(
        s,
        "| server | strategy | arrivals/s | served during the stall / before | arrived in the stall | \
         slower than {SLOW_MS} ms or failed | p99 ms | p99.9 ms | failed | accepted share |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|---|");
    for r in rows {
        let Some(st) = &r.stall else { continue };
        let _ = writeln!(
            s,
            "| {} | {} | {:.0} | {:.2} | {} | {} ({:.1}%) | {:.1} | {:.1} | {} | {} |",
            r.server,
            r.strategy,
            st.rate,
            st.served_share,
            st.arrived,
            st.slow,
            100.0 * st.slow as f64 / st.arrived.max(1) as f64,
            st.p99_ms,
            st.p999_ms,
            st.failed,
            r.accepted_share.as_deref().map_or("-".into(), pct),
        );
    }
    let counts = e4_worker_counts(rows);
    let _ = writeln!(s, "\nGoals (issue 11), same run:\n");
    for w in &counts {
        let pick = |server: &str, strategy: &str| {
            rows.iter().find(|r| {
                r.server == server
                    && r.strategy == format!("{strategy} ({w} workers)")
                    && r.stall.is_some()
            })
        };
        let (Some(steer), Some(shared)) = (
            pick("shard", "reuseport, steering on"),
            pick("shard", "accept_mutex off"),
        ) else {
            continue;
        };
        let (a, b) = (
            steer.stall.as_ref().unwrap(),
            shared.stall.as_ref().unwrap(),
        );
        let ratio = a.served_share / b.served_share.max(1e-9);
        let slow = 100.0 * a.slow as f64 / a.arrived.max(1) as f64;
        let _ = writeln!(
            s,
            "- {w} workers: served rate during the stall with steering = {ratio:.2} x the shared socket's \
             (goal >= 0.9: {}); {slow:.2}% of the requests that arrived during the stall were slower than \
             {SLOW_MS} ms or failed (goal <= 1%: {}); {} failed",
            if ratio >= 0.9 { "met" } else { "missed" },
            if slow <= 1.0 { "met" } else { "missed" },
            a.failed
        );
    }
    for w in counts {
        let _ = writeln!(s, "\n![E4 {w} workers, time series](e4-timeline-{w}w.svg)");
        let _ = writeln!(s, "\n![E4 {w} workers, latency](e4-latency-{w}w.svg)");
    }
}

fn charts_for(exp: &str) -> Vec<String> {
    let e = exp.to_ascii_lowercase();
    match exp {
        "E1" => vec![format!("{e}-rps.svg"), format!("{e}-cpu-share.svg")],
        "E2" | "E5" | "E7" => vec![format!("{e}-cpu-share.svg")],
        "E6" => Vec::new(),
        _ => vec![format!("{e}-latency.svg")],
    }
}

fn label(r: &Row) -> String {
    format!("{} {}", r.server, r.strategy)
}

fn write_outputs(cx: &Ctx) -> Result<()> {
    let out = &cx.args.out;
    std::fs::write(out.join("report.md"), report(cx))?;
    for (exp, title) in TITLES {
        let rows: Vec<&Row> = cx.rows.iter().filter(|r| r.experiment == exp).collect();
        if rows.is_empty() {
            continue;
        }
        let e = exp.to_ascii_lowercase();
        let short_title = title.split(':').next().unwrap_or(title);
        if exp == "E1" {
            let groups: Vec<(String, Vec<f64>)> =
                rows.iter().map(|r| (label(r), vec![r.load.rps])).collect();
            std::fs::write(
                out.join(format!("{e}-rps.svg")),
                svg::grouped_bars(
                    &format!("{exp}: requests/s"),
                    "requests/s",
                    &["req/s".into()],
                    &groups,
                ),
            )?;
        }
        if matches!(exp, "E1" | "E2" | "E5" | "E7") {
            let n = rows.iter().map(|r| r.cpu_share.len()).max().unwrap_or(0);
            let series: Vec<String> = (0..n).map(|i| format!("worker {i}")).collect();
            // E7: the second half, once rebalancing has acted.
            let shares = |r: &Row| -> Vec<f64> {
                r.e7.as_ref()
                    .map_or(&r.cpu_share, |x| &x.settled_cpu_share)
                    .clone()
            };
            let groups: Vec<(String, Vec<f64>)> = rows
                .iter()
                .map(|r| (label(r), shares(r).iter().map(|x| x * 100.0).collect()))
                .collect();
            std::fs::write(
                out.join(format!("{e}-cpu-share.svg")),
                svg::grouped_bars(
                    &format!("{exp}: {short_title}: CPU share per worker"),
                    "% of worker CPU",
                    &series,
                    &groups,
                ),
            )?;
        }
        if exp == "E4" {
            for w in e4_worker_counts(&rows) {
                let mine: Vec<&&Row> = rows
                    .iter()
                    .filter(|r| r.stall.as_ref().is_some_and(|x| x.workers == w))
                    .collect();
                let window = mine[0].stall.as_ref().unwrap().window_ms;
                let bin = TIMELINE_BIN_MS as f64;
                let series: Vec<(String, Vec<u64>)> = mine
                    .iter()
                    .map(|r| (label(r), r.stall.as_ref().unwrap().timeline.clone()))
                    .collect();
                std::fs::write(
                    out.join(format!("e4-timeline-{w}w.svg")),
                    svg::timeseries(
                        &format!("E4, {w} workers: responses per {TIMELINE_BIN_MS} ms, one worker stopped"),
                        TIMELINE_BIN_MS,
                        &series,
                        Some((window.0 as f64 / bin, window.1 as f64 / bin)),
                    ),
                )?;
                let hist: Vec<(String, Vec<u64>)> = mine
                    .iter()
                    .map(|r| (label(r), r.load.log2_us.clone()))
                    .collect();
                std::fs::write(
                    out.join(format!("e4-latency-{w}w.svg")),
                    svg::log2_histograms_log_count(
                        &format!("E4, {w} workers: latency from the intended start"),
                        &hist,
                    ),
                )?;
            }
        }
        if exp == "E3" {
            let series: Vec<(String, Vec<u64>)> = rows
                .iter()
                .map(|r| (label(r), r.load.log2_us.clone()))
                .collect();
            std::fs::write(
                out.join(format!("{e}-latency.svg")),
                svg::log2_histograms(&format!("{exp}: {short_title}: latency"), &series),
            )?;
        }
    }
    std::fs::write(out.join("results.json"), json(cx))?;
    Ok(())
}

fn json(cx: &Ctx) -> String {
    let f = |v: &[f64]| {
        v.iter()
            .map(|x| format!("{x:.4}"))
            .collect::<Vec<_>>()
            .join(",")
    };
    let mut s = String::from("[\n");
    for (i, r) in cx.rows.iter().enumerate() {
        let m = &r.load;
        let _ = write!(
            s,
            "{{\"experiment\":\"{}\",\"server\":\"{}\",\"strategy\":\"{}\",\"requests\":{},\"errors\":{},\"rps\":{:.1},\
             \"latency_ms\":{{\"min\":{:.3},\"mean\":{:.3},\"p50\":{:.3},\"p90\":{:.3},\"p99\":{:.3},\"max\":{:.3},\"stdev\":{:.3}}},\
             \"log2_us\":[{}],\"cpu_share\":[{}],\"accepted_share\":{},\"syscalls_per_request\":{},\"half_load_cpu_share\":{},\"probe\":{},\"stall\":{},\"e7\":{}}}{}",
            r.experiment,
            r.server,
            r.strategy,
            m.requests,
            m.errors,
            m.rps,
            m.min_ms,
            m.mean_ms,
            m.p50_ms,
            m.p90_ms,
            m.p99_ms,
            m.max_ms,
            m.stdev_ms,
            m.log2_us.iter().map(u64::to_string).collect::<Vec<_>>().join(","),
            f(&r.cpu_share),
            r.accepted_share.as_deref().map_or("null".into(), |v| format!("[{}]", f(v))),
            r.syscalls_per_request.map_or("null".into(), |v| format!("{v:.3}")),
            r.half_load_cpu_share.as_deref().map_or("null".into(), |v| format!("[{}]", f(v))),
            r.probe.as_deref().map_or("null".into(), |p| format!(
                "[{}]",
                p.iter().map(|w| w.map_or("null".into(), |w| w.to_string())).collect::<Vec<_>>().join(",")
            )),
            r.stall.as_ref().map_or("null".into(), |x| format!(
                "{{\"workers\":{},\"rate\":{:.1},\"served_share\":{:.4},\"arrived\":{},\"slow\":{},\"p99_ms\":{:.3},\
                 \"p999_ms\":{:.3},\"failed\":{},\"window_ms\":[{},{}],\"per_50ms\":[{}]}}",
                x.workers, x.rate, x.served_share, x.arrived, x.slow, x.p99_ms, x.p999_ms, x.failed,
                x.window_ms.0, x.window_ms.1,
                x.timeline.iter().map(u64::to_string).collect::<Vec<_>>().join(",")
            )),
            r.e7.as_ref().map_or("null".into(), |x| format!(
                "{{\"settled_cpu_share\":[{}],\"reconnects\":{},\"retried\":{}}}",
                f(&x.settled_cpu_share), x.reconnects, x.retried
            )),
            if i + 1 < cx.rows.len() { "," } else { "" }
        );
        s.push('\n');
    }
    s.push_str("]\n");
    s
}
