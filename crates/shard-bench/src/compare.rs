//! `shard-bench compare`: the user's own configuration under each accept strategy, with the
//! same load, and a verdict in a few lines.
//!
//! This module owns the changes made to a configuration per strategy and the verdict. The
//! configuration is read with shard's own parser (`shard_config::tree`: every `include`
//! followed), changed in the tree (every `listen` gets or loses `reuseport`/`shards=`,
//! `events` gets `accept_mutex` and `reuseport_steering`; what shard would write goes to a
//! private directory, relative read paths become absolute against the user's prefix) and
//! written as one file into that directory, which is removed afterwards. The user's files are
//! only read.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};

use shard_config::tree::Node;

use crate::experiments::{drive_addr, Load, Measured};
use crate::median;

#[derive(clap::Args, Debug, Clone)]
pub struct CompareArgs {
    /// The configuration to compare (nginx syntax, as shard runs it).
    #[arg(short = 'c', long = "conf")]
    pub conf: PathBuf,
    /// The prefix shard runs with (default: the parent of the configuration's `conf/`
    /// directory, else the configuration's directory).
    #[arg(short = 'p', long)]
    pub prefix: Option<PathBuf>,
    /// keepalive (closed loop, kept-alive connections) or close (a connection per request).
    #[arg(long, default_value = "close")]
    pub workload: String,
    /// The path requested.
    #[arg(long, default_value = "/")]
    pub path: String,
    /// Client connections.
    #[arg(long, default_value_t = 50)]
    pub connections: usize,
    /// Seconds per strategy.
    #[arg(long, default_value_t = 5)]
    pub duration: u64,
    /// Runs of each strategy, interleaved; with 2 or more the verdict measures the run-to-run
    /// noise and says when a difference is within it.
    #[arg(long, default_value_t = 2)]
    pub rounds: usize,
    /// The shard binary (default: next to this one).
    #[arg(long)]
    pub shard: Option<PathBuf>,
    /// The address to load (as in `listen`, e.g. `127.0.0.1:8080` or `8080`); default: the
    /// first HTTP address of the configuration.
    #[arg(long)]
    pub listen: Option<String>,
    /// The `Host` header sent; default: the first name of the server that answers on that
    /// address.
    #[arg(long)]
    pub host: Option<String>,
}

/// One accept strategy as the changes it makes to a configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Strategy {
    pub name: &'static str,
    /// `listen ... reuseport`, with `shards=auto` when set.
    pub reuseport: bool,
    pub shards_auto: bool,
    pub accept_mutex: bool,
    pub steering: bool,
}

const fn strategy(
    name: &'static str,
    reuseport: bool,
    shards_auto: bool,
    accept_mutex: bool,
    steering: bool,
) -> Strategy {
    Strategy {
        name,
        reuseport,
        shards_auto,
        accept_mutex,
        steering,
    }
}

/// Every strategy shard has; `shards=auto` is added where it differs from both a shared
/// socket and one shard per worker (see `strategies`).
const STRATEGIES: [Strategy; 4] = [
    strategy("reuseport, steering on", true, false, false, true),
    strategy("reuseport, steering off", true, false, false, false),
    strategy(
        "accept_mutex off (EPOLLEXCLUSIVE)",
        false,
        false,
        false,
        true,
    ),
    strategy("accept_mutex on", false, false, true, true),
];
const SHARDS_AUTO: Strategy = strategy("reuseport shards=auto", true, true, false, true);

/// The strategies for `n_workers` workers on `cpus` CPUs.
fn strategies(n_workers: usize, cpus: usize) -> Vec<Strategy> {
    let mut v = STRATEGIES.to_vec();
    let auto = shard_config::shard_count(Some(shard_config::Shards::Auto), n_workers, cpus);
    if auto > 1 && auto < n_workers {
        v.push(SHARDS_AUTO);
    }
    v
}

/// Where a rewritten configuration lives and reads from.
struct Paths<'a> {
    /// The user's prefix: relative read paths (`root`, `alias`, `disable_symlinks from=`)
    /// resolve against it.
    prefix: &'a Path,
    /// The private directory shard runs in (`-p`): every file it writes goes here.
    work: &'a Path,
}

/// What the baseline rewrite left out, for the report.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct LeftOut {
    ssl_listens: usize,
    unix_listens: usize,
    ssl_directives: usize,
}

/// The user's tree made runnable in `paths.work` without touching anything of the user's:
/// `ssl` and `unix:` listeners (which shard does not serve) and `ssl_*` directives removed,
/// write paths moved into the work directory, read paths made absolute, an `events` block
/// where there is none.
fn baseline(tree: &[Node], paths: &Paths<'_>) -> (Vec<Node>, LeftOut) {
    let mut left = LeftOut::default();
    let mut logs = 0usize;
    let mut out = base_walk(tree, paths, &mut left, &mut logs);
    if !out.iter().any(|n| n.name == "events") {
        out.push(Node {
            block: Some(Vec::new()),
            ..Node::new("events", &[])
        });
    }
    // The bench waits on the master it starts: in the foreground, whatever the file says.
    out.retain(|n| n.name != "pid" && n.name != "daemon" && n.name != "master_process");
    out.insert(0, Node::new("daemon", &["off"]));
    out.insert(
        0,
        Node::new(
            "pid",
            &[&paths.work.join("logs/shard.pid").to_string_lossy()],
        ),
    );
    (out, left)
}

fn base_walk(nodes: &[Node], paths: &Paths<'_>, left: &mut LeftOut, logs: &mut usize) -> Vec<Node> {
    let mut out = Vec::with_capacity(nodes.len());
    let absolute = |p: &str| -> String {
        if Path::new(p).is_absolute() || p.starts_with('$') {
            p.to_string()
        } else {
            paths.prefix.join(p).to_string_lossy().into_owned()
        }
    };
    for n in nodes {
        let mut n = n.clone();
        match n.name.as_str() {
            "listen" => {
                if n.args.iter().skip(1).any(|a| a == "ssl") {
                    left.ssl_listens += 1;
                    continue;
                }
                if n.args.first().is_some_and(|a| a.starts_with("unix:")) {
                    left.unix_listens += 1;
                    continue;
                }
            }
            name if name.starts_with("ssl_") || name == "ssl" => {
                left.ssl_directives += 1;
                continue;
            }
            "root" | "alias" => {
                if let Some(a) = n.args.first_mut() {
                    *a = absolute(a);
                }
            }
            "disable_symlinks" => {
                for a in n.args.iter_mut() {
                    if let Some(p) = a.strip_prefix("from=") {
                        if !p.eq_ignore_ascii_case("$document_root") {
                            *a = format!("from={}", absolute(p));
                        }
                    }
                }
            }
            "error_log" => {
                if let Some(a) = n.args.first_mut() {
                    if a != "stderr" && !a.starts_with("syslog:") {
                        *a = paths
                            .work
                            .join("logs/error.log")
                            .to_string_lossy()
                            .into_owned();
                    }
                }
            }
            "access_log" => {
                if let Some(a) = n.args.first_mut() {
                    if a != "off" && !a.starts_with("syslog:") {
                        *logs += 1;
                        *a = paths
                            .work
                            .join(format!("logs/access-{logs}.log"))
                            .to_string_lossy()
                            .into_owned();
                    }
                }
            }
            "client_body_temp_path" => {
                if let Some(a) = n.args.first_mut() {
                    *a = paths
                        .work
                        .join("client_body_temp")
                        .to_string_lossy()
                        .into_owned();
                }
            }
            _ => {}
        }
        if let Some(b) = &n.block {
            let kept = base_walk(b, paths, left, logs);
            // A server whose every `listen` was left out would listen on nginx's default
            // `*:80` instead: it is left out whole.
            let listens = |v: &[Node]| v.iter().filter(|d| d.name == "listen").count();
            if n.name == "server" && listens(b) > 0 && listens(&kept) == 0 {
                continue;
            }
            n.block = Some(kept);
        }
        out.push(n);
    }
    out
}

/// The baseline under one strategy: every `listen` of every server (http and stream) gets or
/// loses `reuseport` and `shards=`; `events` gets `accept_mutex` and `reuseport_steering`.
pub fn apply(tree: &[Node], st: &Strategy) -> Vec<Node> {
    tree.iter()
        .map(|n| {
            let mut n = n.clone();
            if n.name == "listen" {
                n.args
                    .retain(|a| a != "reuseport" && !a.starts_with("shards="));
                if st.reuseport {
                    n.args.push("reuseport".into());
                    if st.shards_auto {
                        n.args.push("shards=auto".into());
                    }
                }
            }
            if let Some(b) = &n.block {
                let mut b = apply(b, st);
                if n.name == "events" {
                    b.retain(|d| d.name != "accept_mutex" && d.name != "reuseport_steering");
                    b.push(Node::new(
                        "accept_mutex",
                        &[if st.accept_mutex { "on" } else { "off" }],
                    ));
                    b.push(Node::new(
                        "reuseport_steering",
                        &[if st.steering { "on" } else { "off" }],
                    ));
                }
                n.block = Some(b);
            }
            n
        })
        .collect()
}

fn default_prefix(conf: &Path) -> PathBuf {
    let dir = conf.parent().unwrap_or(Path::new("."));
    match (dir.file_name(), dir.parent()) {
        (Some(n), Some(up)) if n == "conf" => up.to_path_buf(),
        _ => dir.to_path_buf(),
    }
}

/// One strategy's rounds.
struct Outcome {
    name: &'static str,
    /// Each round's measurement and CPU ticks per worker.
    rounds: Vec<(Measured, Vec<u64>)>,
}

impl Outcome {
    fn each(&self, f: impl Fn(&Measured) -> f64) -> Vec<f64> {
        self.rounds.iter().map(|(m, _)| f(m)).collect()
    }
    /// CPU ticks per worker, summed over the rounds (workers by index).
    fn cpu(&self) -> Vec<u64> {
        let n = self.rounds.iter().map(|r| r.1.len()).max().unwrap_or(0);
        (0..n)
            .map(|i| {
                self.rounds
                    .iter()
                    .map(|r| r.1.get(i).copied().unwrap_or(0))
                    .sum()
            })
            .collect()
    }
    fn summary(&self) -> Summary {
        Summary {
            name: self.name,
            rps: median(self.each(|m| m.rps)),
            p99_ms: median(self.each(|m| m.p99_ms)),
            spread: spread(&self.cpu()),
        }
    }
}

/// What the verdict's sentences are made of: one strategy's medians.
#[derive(Debug, Clone, Copy)]
struct Summary {
    name: &'static str,
    rps: f64,
    p99_ms: f64,
    spread: f64,
}

/// The largest relative difference (in %) between rounds of one strategy, over all
/// strategies: the run-to-run noise of this machine and load. `None` with one round.
fn noise(o: &[Outcome], f: impl Fn(&Measured) -> f64) -> Option<f64> {
    let mut worst: Option<f64> = None;
    for x in o {
        let v = x.each(&f);
        if v.len() < 2 {
            return None;
        }
        let (lo, hi) = v
            .iter()
            .fold((f64::INFINITY, 0f64), |(lo, hi), &y| (lo.min(y), hi.max(y)));
        let m = median(v);
        if m > 0.0 {
            let pct = (hi - lo) / m * 100.0;
            worst = Some(worst.map_or(pct, |w: f64| w.max(pct)));
        }
    }
    worst
}

/// Workers whose busiest/idlest CPU ratio is at least this did unequal work.
const UNEVEN_SPREAD: f64 = 1.5;

/// The verdict's "Why" lines: every one follows from the numbers given.
fn why(s: &[Summary], rps_noise: Option<f64>, p99_noise: Option<f64>) -> Vec<String> {
    let mut out = Vec::new();
    let Some(fast) = s.iter().max_by(|a, b| a.rps.total_cmp(&b.rps)) else {
        return out;
    };
    let slow = s
        .iter()
        .min_by(|a, b| a.rps.total_cmp(&b.rps))
        .unwrap_or(fast);
    let against = |d: f64, n: Option<f64>, what: &str| {
        match n {
        Some(n) if d.abs() <= n => format!(
            "within the {n:.0}% by which rounds of one strategy differed: no strategy is {what} on this machine and load"
        ),
        Some(n) => format!("more than the {n:.0}% by which rounds of one strategy differed"),
        None => "one round each, so the run-to-run noise was not measured (--rounds 3)".into(),
    }
    };
    let d = (fast.rps / slow.rps.max(1.0) - 1.0) * 100.0;
    out.push(format!(
        "requests/s: {} {:.0} against {} {:.0} ({d:+.1}%), {}.",
        fast.name,
        fast.rps,
        slow.name,
        slow.rps,
        against(d, rps_noise, "faster")
    ));
    let low = s
        .iter()
        .min_by(|a, b| a.p99_ms.total_cmp(&b.p99_ms))
        .unwrap_or(fast);
    let high = s
        .iter()
        .max_by(|a, b| a.p99_ms.total_cmp(&b.p99_ms))
        .unwrap_or(fast);
    let d = (high.p99_ms / low.p99_ms.max(1e-3) - 1.0) * 100.0;
    let p99_beyond = p99_noise.is_some_and(|n| d > n);
    out.push(format!(
        "p99: {} {:.2} ms against {} {:.2} ms ({d:+.0}%), {}.",
        low.name,
        low.p99_ms,
        high.name,
        high.p99_ms,
        against(d, p99_noise, "steadier")
    ));
    if p99_beyond && high.name.starts_with("reuseport") {
        out.push(
            "reuseport had the highest p99, beyond the noise: with per-worker queues a new connection waits              for the worker the kernel hashed it to, even while another worker is free."
                .into(),
        );
    }
    let uneven: Vec<&Summary> = s.iter().filter(|x| x.spread >= UNEVEN_SPREAD).collect();
    if uneven.is_empty() {
        let most = s.iter().map(|x| x.spread).fold(0.0, f64::max);
        out.push(format!(
            "every strategy spread the work evenly: the busiest worker used at most {most:.2}x the CPU of the idlest."
        ));
    }
    for x in uneven {
        let why = if x.name == "accept_mutex on" {
            "the worker holding the accept mutex takes the new connections while the others wait for it"
        } else if x.name.starts_with("reuseport") {
            "the kernel's hash gave some workers more connections than others"
        } else {
            "epoll woke some workers more often than others"
        };
        let ratio = if x.spread.is_finite() {
            format!("{:.2}x", x.spread)
        } else {
            "all".to_string()
        };
        out.push(format!(
            "{}: the busiest worker used {ratio} the CPU of the idlest: {why}.",
            x.name
        ));
    }
    out
}

fn spread(v: &[u64]) -> f64 {
    let max = v.iter().copied().max().unwrap_or(0) as f64;
    let min = v.iter().copied().min().unwrap_or(0) as f64;
    if min == 0.0 {
        f64::INFINITY
    } else {
        max / min
    }
}

/// What is loaded: the address connected to, the `Host` sent, and a description for the
/// report.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Target {
    connect: SocketAddr,
    host: String,
    listen: SocketAddr,
    /// Every HTTP address of the configuration, in order.
    all: Vec<SocketAddr>,
}

/// Picks the address to load among the configuration's HTTP listeners (`--listen`, else the
/// first) and the `Host` to send (`--host`, else the first name of the server that answers
/// there by default); says why when nothing can be measured.
fn target(
    cfg: &shard_config::Config,
    listen: Option<&str>,
    host: Option<&str>,
    left: &LeftOut,
) -> Result<Target> {
    let http: Vec<&shard_config::Listener> = cfg
        .listeners
        .iter()
        .filter(|l| matches!(l.kind, shard_config::ListenerKind::Http))
        .collect();
    if http.is_empty() {
        let mut why = Vec::new();
        if cfg
            .listeners
            .iter()
            .any(|l| matches!(l.kind, shard_config::ListenerKind::Stream { .. }))
        {
            why.push(
                "its only listeners are in stream {}, and compare measures HTTP requests"
                    .to_string(),
            );
        }
        if left.ssl_listens > 0 {
            why.push(format!(
                "{} `listen ... ssl` (TLS), which shard does not serve yet",
                left.ssl_listens
            ));
        }
        if left.unix_listens > 0 {
            why.push(format!(
                "{} `listen unix:...`, which shard does not serve",
                left.unix_listens
            ));
        }
        if why.is_empty() {
            why.push("it has no HTTP listener".into());
        }
        bail!(
            "compare cannot measure this configuration: {}",
            why.join("; ")
        );
    }
    let chosen = match listen {
        None => http[0],
        Some(want) => {
            let port_only = want.parse::<u16>().ok();
            let addr = want.parse::<SocketAddr>().ok();
            *http
                .iter()
                .find(|l| Some(l.addr) == addr || port_only == Some(l.addr.port()))
                .with_context(|| {
                    format!(
                        "--listen {want}: the configuration listens on {}",
                        http.iter()
                            .map(|l| l.addr.to_string())
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                })?
        }
    };
    let mut connect = chosen.addr;
    if connect.ip().is_unspecified() {
        connect.set_ip(if connect.is_ipv4() {
            std::net::Ipv4Addr::LOCALHOST.into()
        } else {
            std::net::Ipv6Addr::LOCALHOST.into()
        });
    }
    let host = match host {
        Some(h) => h.to_string(),
        None => cfg
            .http
            .as_ref()
            .and_then(|h| h.servers.get(chosen.default_server))
            .and_then(|s| {
                s.server_names.iter().find_map(|n| match n {
                    shard_config::ServerName::Exact(n) if !n.is_empty() => Some(n.clone()),
                    _ => None,
                })
            })
            .unwrap_or_else(|| connect.to_string()),
    };
    Ok(Target {
        connect,
        host,
        listen: chosen.addr,
        all: http.iter().map(|l| l.addr).collect(),
    })
}

/// A private directory removed when dropped.
struct WorkDir(PathBuf);

impl WorkDir {
    fn new() -> Result<WorkDir> {
        let p = std::env::temp_dir().join(format!("shard-bench-compare-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(p.join("conf"))?;
        std::fs::create_dir_all(p.join("logs"))?;
        // Workers that are no longer root write their logs here.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(p.join("logs"), std::fs::Permissions::from_mode(0o777))?;
        Ok(WorkDir(p))
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub fn run(a: CompareArgs) -> Result<()> {
    crate::procfs::raise_nofile_limit();
    let shard = match &a.shard {
        Some(p) => p.clone(),
        None => std::env::current_exe()?.with_file_name("shard"),
    };
    let conf =
        std::fs::canonicalize(&a.conf).with_context(|| format!("reading {}", a.conf.display()))?;
    let prefix = a.prefix.clone().unwrap_or_else(|| default_prefix(&conf));
    let prefix = std::fs::canonicalize(&prefix).unwrap_or(prefix);
    let close = match a.workload.as_str() {
        "close" => true,
        "keepalive" => false,
        w => bail!("unknown workload {w:?}: keepalive or close"),
    };
    anyhow::ensure!(
        (1..=20).contains(&a.rounds),
        "--rounds must be between 1 and 20"
    );
    let tree =
        shard_config::tree::load_expanded(&conf).map_err(|e| anyhow::anyhow!("{}", e.message))?;
    let work = WorkDir::new()?;
    let paths = Paths {
        prefix: &prefix,
        work: &work.0,
    };
    let (base, left) = baseline(&tree, &paths);
    // The parser decides what the configuration listens on, as `shard -t` would.
    let probe = work.0.join("conf/shard.conf");
    std::fs::write(
        &probe,
        shard_config::tree::render(&apply(&base, &STRATEGIES[2])),
    )?;
    let cfg = shard_config::load(&probe, &work.0, None).map_err(|e| {
        anyhow::anyhow!(
            "shard refuses this configuration (as rewritten for compare): {}",
            e.message
        )
    })?;
    let tgt = target(&cfg, a.listen.as_deref(), a.host.as_deref(), &left)?;
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    // As the server resolves it (`auto`: the CPUs available to the process).
    let n_workers = match cfg.main.worker_processes {
        shard_config::WorkerProcesses::Fixed(n) => n.max(1),
        shard_config::WorkerProcesses::Auto => cpus,
    };
    let strategies = strategies(n_workers, cpus);
    let load = Load {
        path: a.path.clone(),
        conns: a.connections,
        close,
        duration: Some(Duration::from_secs(a.duration)),
        requests: None,
        headers: vec![("Host".into(), tgt.host.clone())],
        rate: None,
    };
    let mut outcomes: Vec<Outcome> = strategies
        .iter()
        .map(|st| Outcome {
            name: st.name,
            rounds: Vec::new(),
        })
        .collect();
    // Interleaved, so that a drift of the machine spreads over every strategy.
    for round in 0..a.rounds {
        for (i, st) in strategies.iter().enumerate() {
            let path = work.0.join(format!("conf/strategy-{i}.conf"));
            std::fs::write(&path, shard_config::tree::render(&apply(&base, st)))?;
            eprintln!("shard-bench compare: {}, round {}", st.name, round + 1);
            let r = run_one(&shard, &work.0, &path, tgt.connect, &load)
                .with_context(|| format!("running {}", st.name))?;
            outcomes[i].rounds.push(r);
        }
    }
    print!("{}", verdict(&a, &tgt, &left, n_workers, &outcomes));
    Ok(())
}

fn run_one(
    shard: &Path,
    prefix: &Path,
    conf: &Path,
    addr: SocketAddr,
    load: &Load,
) -> Result<(Measured, Vec<u64>)> {
    let errlog = prefix.join("logs/stderr.log");
    let mut child = std::process::Command::new(shard)
        .arg("-p")
        .arg(prefix)
        .arg("-c")
        .arg(conf)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&errlog)?)
        .spawn()?;
    let result = (|| {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(addr).is_err() {
            if let Ok(Some(st)) = child.try_wait() {
                let err = std::fs::read_to_string(&errlog).unwrap_or_default();
                bail!("shard exited with {st}: {}", err.trim());
            }
            anyhow::ensure!(
                std::time::Instant::now() < deadline,
                "shard did not listen on {addr} within 10 s"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let pids = children(child.id())?;
        let cpu0: Vec<u64> = pids
            .iter()
            .map(|p| crate::procfs::cpu_ticks(&[*p]).unwrap_or(0))
            .collect();
        let m = drive_addr(addr, load)?;
        let cpu1: Vec<u64> = pids
            .iter()
            .map(|p| crate::procfs::cpu_ticks(&[*p]).unwrap_or(0))
            .collect();
        // Work per worker: CPU ticks (the configuration need not expose shard_status).
        Ok((
            m,
            cpu1.iter()
                .zip(&cpu0)
                .map(|(a, b)| a.saturating_sub(*b))
                .collect(),
        ))
    })();
    // SAFETY-free: kill(2) with plain integers.
    unsafe { libc::kill(child.id() as i32, libc::SIGQUIT) };
    let _ = child.wait();
    result
}

fn children(pid: u32) -> Result<Vec<i32>> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))?;
    Ok(text
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect())
}

fn verdict(a: &CompareArgs, t: &Target, left: &LeftOut, n_workers: usize, o: &[Outcome]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# {} under each accept strategy: {} load, {} connections, {} s each, {} round(s), medians\n",
        a.conf.display(),
        a.workload,
        a.connections,
        a.duration,
        a.rounds
    );
    let _ = writeln!(
        s,
        "Loaded {} (connecting to {}) with `Host: {}`, path {}; {n_workers} worker processes. \
         Every `listen` of every server was switched (HTTP addresses: {}).",
        t.listen,
        t.connect,
        t.host,
        a.path,
        t.all
            .iter()
            .map(SocketAddr::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    );
    if *left != LeftOut::default() {
        let _ = writeln!(
            s,
            "Left out (shard does not serve them): {} `ssl` listener(s), {} `unix:` listener(s), \
             {} `ssl_*` directive(s).",
            left.ssl_listens, left.unix_listens, left.ssl_directives
        );
    }
    s.push('\n');
    let _ = writeln!(
        s,
        "| strategy | req/s | p50 ms | p99 ms | max ms | errors | worker CPU max/min |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|");
    for x in o {
        let _ = writeln!(
            s,
            "| {} | {:.0} | {:.2} | {:.2} | {:.2} | {} | {:.2} |",
            x.name,
            median(x.each(|m| m.rps)),
            median(x.each(|m| m.p50_ms)),
            median(x.each(|m| m.p99_ms)),
            x.each(|m| m.max_ms).into_iter().fold(0.0, f64::max),
            x.rounds.iter().map(|r| r.0.errors).sum::<u64>(),
            spread(&x.cpu())
        );
    }
    let summaries: Vec<Summary> = o.iter().map(Outcome::summary).collect();
    let _ = writeln!(s, "\nWhy (each line from the numbers above):");
    for line in why(&summaries, noise(o, |m| m.rps), noise(o, |m| m.p99_ms)) {
        let _ = writeln!(s, "- {line}");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree_of(text: &str) -> Vec<Node> {
        let dir = std::env::temp_dir().join(format!(
            "shard-compare-unit-{}-{}",
            std::process::id(),
            text.len()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("t.conf"), text).unwrap();
        let t = shard_config::tree::load_expanded(&dir.join("t.conf")).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        t
    }

    fn find<'a>(t: &'a [Node], name: &str, out: &mut Vec<&'a Node>) {
        for n in t {
            if n.name == name {
                out.push(n);
            }
            if let Some(b) = &n.block {
                find(b, name, out);
            }
        }
    }

    #[test]
    fn apply_switches_every_listen_and_the_events_block() {
        let t = tree_of(
            "events { accept_mutex on; worker_connections 64; } http { server { listen 127.0.0.1:80 reuseport shards=2 backlog=10; } \
             server { listen 81 default_server; } } stream { server { listen 82; proxy_pass 127.0.0.1:9; } }",
        );
        let r = apply(&t, &STRATEGIES[0]);
        let mut l = Vec::new();
        find(&r, "listen", &mut l);
        assert_eq!(l.len(), 3);
        assert_eq!(l[0].args, ["127.0.0.1:80", "backlog=10", "reuseport"]);
        assert_eq!(l[1].args, ["81", "default_server", "reuseport"]);
        assert_eq!(l[2].args, ["82", "reuseport"]);
        let text = shard_config::tree::render(&apply(&t, &STRATEGIES[3]));
        assert!(text.contains("listen 127.0.0.1:80 backlog=10;"), "{text}");
        assert_eq!(text.matches("accept_mutex").count(), 1, "{text}");
        assert!(
            text.contains("accept_mutex on;") && text.contains("reuseport_steering on;"),
            "{text}"
        );
        let text = shard_config::tree::render(&apply(&t, &SHARDS_AUTO));
        assert!(
            text.contains("listen 81 default_server reuseport shards=auto;"),
            "{text}"
        );
        assert_eq!(
            default_prefix(Path::new("/a/conf/x.conf")),
            PathBuf::from("/a")
        );
    }

    #[test]
    fn the_baseline_writes_nothing_of_the_users_and_reads_from_their_prefix() {
        let t = tree_of(
            "pid /run/nginx.pid; error_log /var/log/nginx/error.log warn; http { access_log logs/a.log combined; \
             server { listen 80; listen 443 ssl; ssl_certificate c.pem; listen unix:/run/x.sock; root html; \
             location /a { alias /abs/a; access_log off; } location /b { alias rel/b; } \
             disable_symlinks on from=html; client_body_temp_path tmp 1 2; } }",
        );
        let paths = Paths {
            prefix: Path::new("/user/prefix"),
            work: Path::new("/work/dir"),
        };
        let (b, left) = baseline(&t, &paths);
        assert_eq!(
            left,
            LeftOut {
                ssl_listens: 1,
                unix_listens: 1,
                ssl_directives: 1
            }
        );
        let text = shard_config::tree::render(&b);
        for want in [
            "pid /work/dir/logs/shard.pid;",
            "error_log /work/dir/logs/error.log warn;",
            "access_log /work/dir/logs/access-1.log combined;",
            "access_log off;",
            "root /user/prefix/html;",
            "alias /abs/a;",
            "alias /user/prefix/rel/b;",
            "disable_symlinks on from=/user/prefix/html;",
            "client_body_temp_path /work/dir/client_body_temp 1 2;",
            "events {\n}",
        ] {
            assert!(text.contains(want), "{want} missing: {text}");
        }
        assert!(!text.contains("ssl") && !text.contains("unix:"), "{text}");
        assert_eq!(text.matches("pid ").count(), 1, "{text}");
    }

    fn sum(name: &'static str, rps: f64, p99_ms: f64, spread: f64) -> Summary {
        Summary {
            name,
            rps,
            p99_ms,
            spread,
        }
    }

    #[test]
    fn why_says_only_what_the_numbers_show() {
        // The case: the mutex run is even (1.00) and wins; nothing may say it
        // concentrates connections, and a 3% lead inside 8% of noise is no lead.
        let s = [
            sum("reuseport", 10_000.0, 2.0, 1.02),
            sum("accept_mutex off (EPOLLEXCLUSIVE)", 10_100.0, 2.1, 1.05),
            sum("accept_mutex on", 10_300.0, 1.9, 1.00),
        ];
        let w = why(&s, Some(8.0), Some(20.0)).join("\n");
        assert!(!w.contains("takes the new connections"), "{w}");
        assert!(
            w.contains(
                "requests/s: accept_mutex on 10300 against reuseport 10000 (+3.0%), within the 8%"
            ),
            "{w}"
        );
        assert!(w.contains("no strategy is faster"), "{w}");
        assert!(
            w.contains("spread the work evenly: the busiest worker used at most 1.05x"),
            "{w}"
        );
        assert!(!w.contains("reuseport had the highest p99"), "{w}");

        // Beyond the noise, in the data: the sentences follow.
        let s = [
            sum("reuseport", 10_000.0, 9.0, 1.1),
            sum("accept_mutex off (EPOLLEXCLUSIVE)", 14_000.0, 2.0, 1.1),
            sum("accept_mutex on", 12_000.0, 3.0, 3.5),
        ];
        let w = why(&s, Some(5.0), Some(10.0)).join("\n");
        assert!(w.contains("(+40.0%), more than the 5%"), "{w}");
        assert!(
            w.contains("reuseport had the highest p99, beyond the noise"),
            "{w}"
        );
        assert!(
            w.contains("accept_mutex on: the busiest worker used 3.50x"),
            "{w}"
        );
        assert!(!w.contains("evenly"), "{w}");

        // One round: the noise is said to be unknown.
        let w = why(&s, None, None).join("\n");
        assert!(w.contains("the run-to-run noise was not measured"), "{w}");
        assert!(!w.contains("beyond the noise"), "{w}");
    }
}
