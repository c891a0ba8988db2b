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

struct Outcome {
    name: &'static str,
    m: Measured,
    /// CPU ticks per worker during the run.
    cpu: Vec<u64>,
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
    let mut outcomes = Vec::new();
    for (name, reuseport, mutex) in STRATEGIES {
        let path = conf.with_file_name(format!(
            ".shard-compare-{}.conf",
            name.split(' ').next().unwrap_or("x")
        ));
        std::fs::write(&path, rewrite(&text, reuseport, mutex))?;
        eprintln!("shard-bench compare: {name}");
        let res = run_one(&shard, &prefix, &path, port, &load);
        let _ = std::fs::remove_file(&path);
        let (m, cpu) = res.with_context(|| format!("running {name}"))?;
        outcomes.push(Outcome { name, m, cpu });
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
        "# {} under each accept strategy: {} load, {} connections, {} s each\n",
        a.conf.display(),
        a.workload,
        a.connections,
        a.duration
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
            x.m.rps,
            x.m.p50_ms,
            x.m.p99_ms,
            x.m.max_ms,
            x.m.errors,
            spread(&x.cpu)
        );
    }
    let best = |f: &dyn Fn(&Outcome) -> f64, lower: bool| -> &Outcome {
        o.iter()
            .min_by(|x, y| {
                let (a, b) = (f(x), f(y));
                if lower {
                    a.total_cmp(&b)
                } else {
                    b.total_cmp(&a)
                }
            })
            .expect("three outcomes")
    };
    let rps = best(&|x| x.m.rps, false);
    let p99 = best(&|x| x.m.p99_ms, true);
    let even = best(&|x| spread(&x.cpu), true);
    let worst_rps = best(&|x| x.m.rps, true);
    let _ = writeln!(
        s,
        "\n- requests/s: **{}** ({:.0}, {:+.0}% over the slowest, {})",
        rps.name,
        rps.m.rps,
        (rps.m.rps / worst_rps.m.rps.max(1.0) - 1.0) * 100.0,
        worst_rps.name
    );
    let _ = writeln!(
        s,
        "- p99 latency: **{}** ({:.2} ms)",
        p99.name, p99.m.p99_ms
    );
    let _ = writeln!(
        s,
        "- spread between workers: **{}** (busiest/idlest CPU {:.2})",
        even.name,
        spread(&even.cpu)
    );
    let _ = writeln!(s, "\nWhy:");
    if (rps.m.rps / worst_rps.m.rps.max(1.0)) < 1.05 {
        let _ = writeln!(
            s,
            "- throughput is within 5% across strategies: on this machine and load, accepting is not the \
             bottleneck (the articles' gains need many cores and many new connections)."
        );
    }
    if let Some(m) = o.iter().find(|x| x.name == "accept_mutex on") {
        if spread(&m.cpu) > 2.0 {
            let _ = writeln!(
                s,
                "- with the accept mutex one worker takes most connections while it keeps winning the lock \
                 (nginx's behaviour too); fine at low load, it concentrates latency at high load."
            );
        }
    }
    if p99.name != "reuseport" {
        let _ = writeln!(
            s,
            "- per-worker queues (reuseport) pin each connection to one worker when the kernel hashes it: a \
             busy or stalled worker delays everything in its queue, which shows in p99; a shared queue lets \
             any free worker take the next connection."
        );
    } else {
        let _ = writeln!(
            s,
            "- reuseport spreads connections evenly and avoids wake-up contention; its risk is a stalled \
             worker's queue (see experiment E4), which this run did not exercise."
        );
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
}
