//! `shard-bench compare`: the user's own configuration under each accept strategy, with the
//! same load, and a verdict in a few lines.
//!
//! This module owns the rewriting of a configuration per strategy (the `listen` parameters
//! `reuseport`/`shards=` and `events { accept_mutex }`, nothing else) and the verdict. The
//! rewritten files are written next to the original (so that relative `include`s still work)
//! under hidden names, and removed afterwards.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};

use crate::experiments::{drive, Load, Measured};

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
}

/// The strategies compared, as (name, reuseport, accept_mutex).
const STRATEGIES: [(&str, bool, bool); 3] = [
    ("reuseport", true, false),
    ("accept_mutex off (EPOLLEXCLUSIVE)", false, false),
    ("accept_mutex on", false, true),
];

/// Rewrites `text` for one strategy: every `listen` gets or loses `reuseport` (and any
/// `shards=`), and `events` gets `accept_mutex on|off`.
pub fn rewrite(text: &str, reuseport: bool, accept_mutex: bool) -> String {
    let mut out = String::with_capacity(text.len() + 64);
    for line in text.lines() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("listen ") || trimmed.starts_with("listen\t") {
            if let Some(end) = trimmed.find(';') {
                let indent = &line[..line.len() - trimmed.len()];
                let mut words: Vec<&str> = trimmed[..end]
                    .split_whitespace()
                    .filter(|w| *w != "reuseport" && !w.starts_with("shards="))
                    .collect();
                if reuseport {
                    words.push("reuseport");
                }
                let _ = writeln!(out, "{indent}{};{}", words.join(" "), &trimmed[end + 1..]);
                continue;
            }
        }
        if trimmed.starts_with("accept_mutex ") || trimmed.starts_with("accept_mutex\t") {
            continue;
        }
        out.push_str(line);
        out.push('\n');
        if trimmed.starts_with("events") && trimmed.contains('{') {
            let _ = writeln!(
                out,
                "    accept_mutex {};",
                if accept_mutex { "on" } else { "off" }
            );
        }
    }
    out
}

fn default_prefix(conf: &Path) -> PathBuf {
    let dir = conf.parent().unwrap_or(Path::new("."));
    match (dir.file_name(), dir.parent()) {
        (Some(n), Some(up)) if n == "conf" => up.to_path_buf(),
        _ => dir.to_path_buf(),
    }
}

/// The first address the configuration listens on, from shard's own `-t` parse.
fn first_port(text: &str) -> Result<u16> {
    for line in text.lines() {
        let t = line.trim_start();
        if let Some(rest) = t.strip_prefix("listen") {
            let addr = rest
                .split_whitespace()
                .next()
                .unwrap_or("")
                .trim_end_matches(';');
            let port = addr.rsplit(':').next().unwrap_or(addr);
            if let Ok(p) = port.parse() {
                return Ok(p);
            }
        }
    }
    bail!("no listen directive with a port found")
}

/// One strategy's rounds.
struct Outcome {
    name: &'static str,
    /// Each round's measurement and CPU ticks per worker.
    rounds: Vec<(Measured, Vec<u64>)>,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
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
    if p99_beyond && high.name == "reuseport" {
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
        } else if x.name == "reuseport" {
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

pub fn run(a: CompareArgs) -> Result<()> {
    crate::procfs::raise_nofile_limit();
    let shard = match &a.shard {
        Some(p) => p.clone(),
        None => std::env::current_exe()?.with_file_name("shard"),
    };
    let conf =
        std::fs::canonicalize(&a.conf).with_context(|| format!("reading {}", a.conf.display()))?;
    let text =
        std::fs::read_to_string(&conf).with_context(|| format!("reading {}", a.conf.display()))?;
    let port = first_port(&text)?;
    let prefix = a.prefix.clone().unwrap_or_else(|| default_prefix(&conf));
    let close = match a.workload.as_str() {
        "close" => true,
        "keepalive" => false,
        w => bail!("unknown workload {w:?}: keepalive or close"),
    };
    let load = Load {
        path: a.path.clone(),
        conns: a.connections,
        close,
        duration: Some(Duration::from_secs(a.duration)),
        requests: None,
        headers: Vec::new(),
    };
    anyhow::ensure!(
        (1..=20).contains(&a.rounds),
        "--rounds must be between 1 and 20"
    );
    let mut outcomes: Vec<Outcome> = STRATEGIES
        .iter()
        .map(|&(name, _, _)| Outcome {
            name,
            rounds: Vec::new(),
        })
        .collect();
    // Interleaved, so that a drift of the machine spreads over every strategy.
    for round in 0..a.rounds {
        for (i, (name, reuseport, mutex)) in STRATEGIES.into_iter().enumerate() {
            let path = conf.with_file_name(format!(
                ".shard-compare-{}.conf",
                name.split(' ').next().unwrap_or("x")
            ));
            std::fs::write(&path, rewrite(&text, reuseport, mutex))?;
            eprintln!("shard-bench compare: {name}, round {}", round + 1);
            let res = run_one(&shard, &prefix, &path, port, &load);
            let _ = std::fs::remove_file(&path);
            let r = res.with_context(|| format!("running {name}"))?;
            outcomes[i].rounds.push(r);
        }
    }
    print!("{}", verdict(&a, &outcomes));
    Ok(())
}

fn run_one(
    shard: &Path,
    prefix: &Path,
    conf: &Path,
    port: u16,
    load: &Load,
) -> Result<(Measured, Vec<u64>)> {
    let errlog =
        std::env::temp_dir().join(format!("shard-bench-compare-{}.stderr", std::process::id()));
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
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Ok(Some(st)) = child.try_wait() {
                let err = std::fs::read_to_string(&errlog).unwrap_or_default();
                bail!("shard exited with {st}: {}", err.trim());
            }
            anyhow::ensure!(
                std::time::Instant::now() < deadline,
                "shard did not listen on port {port} within 10 s"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let pids = children(child.id())?;
        let cpu0: Vec<u64> = pids
            .iter()
            .map(|p| crate::procfs::cpu_ticks(&[*p]).unwrap_or(0))
            .collect();
        let m = drive(port, load)?;
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
    let _ = std::fs::remove_file(&errlog);
    result
}

fn children(pid: u32) -> Result<Vec<i32>> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))?;
    Ok(text
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect())
}

fn verdict(a: &CompareArgs, o: &[Outcome]) -> String {
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

    #[test]
    fn rewrite_toggles_listen_parameters_and_the_accept_mutex() {
        let conf = "events {\n    accept_mutex on;\n}\nhttp {\n  server {\n    listen 127.0.0.1:80 reuseport shards=2 backlog=10; # x\n  }\n}\n";
        let r = rewrite(conf, false, false);
        assert!(r.contains("listen 127.0.0.1:80 backlog=10; # x"), "{r}");
        assert!(r.contains("events {\n    accept_mutex off;\n}"), "{r}");
        let r = rewrite(conf, true, true);
        assert!(
            r.contains("listen 127.0.0.1:80 backlog=10 reuseport;"),
            "{r}"
        );
        assert_eq!(r.matches("accept_mutex").count(), 1, "{r}");
        assert_eq!(first_port(conf).unwrap(), 80);
        assert_eq!(
            default_prefix(Path::new("/a/conf/x.conf")),
            PathBuf::from("/a")
        );
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
