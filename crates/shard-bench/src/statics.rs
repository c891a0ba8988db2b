//! `shard-bench static`: static files of 33 B, 16 KiB and 1 MiB, with `sendfile` off (nginx's
//! default) and on, `open_file_cache` off and on, and pipelined requests, against shard and
//! nginx in the same run: system calls and worker CPU per request, requests/s.
//!
//! It owns the cases and their table. Starting servers is `servers.rs`'s, counting system
//! calls and CPU `procfs.rs`'s.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, Context, Result};

use crate::median;
use crate::procfs;
use crate::servers::{self, Kind, Running, Spec};

#[derive(clap::Args, Debug, Clone)]
pub struct StaticArgs {
    /// Worker processes for both servers.
    #[arg(long, default_value_t = 2)]
    pub workers: usize,
    /// Seconds per load run.
    #[arg(long, default_value_t = 2)]
    pub duration: u64,
    /// Kept-alive client connections.
    #[arg(long, default_value_t = 20)]
    pub connections: usize,
    /// Load runs per case and server, the servers alternating; the report gives medians.
    #[arg(long, default_value_t = 5)]
    pub rounds: usize,
    /// `--shard`, `--nginx`, `--no-nginx`.
    #[command(flatten)]
    pub peers: crate::servers::Peers,
    /// Two cases, one round of 1 s: checks that the bench works (CI).
    #[arg(long)]
    pub smoke: bool,
    /// Also write the report here.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Only the cases of these file sizes in bytes: 33, 16384, 1048576 (repeatable).
    #[arg(long)]
    pub size: Vec<usize>,
    /// Only the cases with `sendfile` on (true) or off (false).
    #[arg(long)]
    pub sendfile: Option<bool>,
    /// Only the cases with `open_file_cache` on (true) or off (false).
    #[arg(long)]
    pub cache: Option<bool>,
    /// Only the pipelined cases (true) or only the others (false).
    #[arg(long)]
    pub pipelined: Option<bool>,
}

/// Requests per write in the pipelined cases.
const PIPELINE: usize = 10;

/// One configuration and load.
#[derive(Debug, Clone, Copy)]
struct Case {
    file: &'static str,
    size: usize,
    sendfile: bool,
    cache: bool,
    pipelined: bool,
}

const FILES: [(&str, usize); 3] = [
    ("s33.txt", 33),
    ("s16k.txt", 16 * 1024),
    ("s1m.bin", 1024 * 1024),
];

fn cases(smoke: bool) -> Vec<Case> {
    let mut v = Vec::new();
    for cache in [false, true] {
        for sendfile in [false, true] {
            for (file, size) in FILES {
                v.push(Case {
                    file,
                    size,
                    sendfile,
                    cache,
                    pipelined: false,
                });
            }
        }
        v.push(Case {
            file: FILES[0].0,
            size: FILES[0].1,
            sendfile: false,
            cache,
            pipelined: true,
        });
    }
    if smoke {
        v.retain(|c| c.size == 33 && !c.sendfile && (!c.cache || c.pipelined));
    }
    v
}

fn size_label(n: usize) -> String {
    match n {
        n if n >= 1 << 20 => format!("{} MiB", n >> 20),
        n if n >= 1 << 10 => format!("{} KiB", n >> 10),
        n => format!("{n} B"),
    }
}

/// One server's numbers for one case.
#[derive(Debug, Clone, Copy, Default)]
struct Measure {
    syscalls: Option<f64>,
    cpu_us: f64,
    rps: f64,
    /// Median over the rounds of shard's CPU per request / this server's, each round's pair
    /// measured back to back (shard's own row: 1).
    ratio: f64,
}

/// wrk's pipelining script: `PIPELINE` requests for `path` in one write.
fn pipeline_script(dir: &Path, path: &str) -> Result<PathBuf> {
    let p = dir.join("pipeline.lua");
    std::fs::write(
        &p,
        format!(
            "init = function(args)\n  local r = {{}}\n  for i = 1, {PIPELINE} do r[i] = wrk.format(nil, \"{path}\") end\n  req = table.concat(r)\nend\nrequest = function() return req end\n"
        ),
    )?;
    Ok(p)
}

/// A kept-alive load on `path`, pipelined or not.
fn load(
    srv: &Running,
    wrk: Option<&Path>,
    path: &str,
    a: &StaticArgs,
    pipelined: bool,
    d: Duration,
) -> Result<()> {
    match wrk {
        Some(w) => {
            let mut c = Command::new(w);
            c.arg(format!("-t{}", a.connections.clamp(1, 2)))
                .arg(format!("-c{}", a.connections))
                .arg(format!("-d{}s", d.as_secs().max(1)))
                .arg(format!("http://127.0.0.1:{}{path}", srv.port));
            if pipelined {
                c.arg("-s").arg(pipeline_script(&srv.dir, path)?);
            }
            let out = c.output().context("running wrk")?;
            if !out.status.success() {
                bail!(
                    "wrk failed: {}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            Ok(())
        }
        None => {
            anyhow::ensure!(!pipelined, "pipelined cases need wrk");
            crate::run_load(srv.port, path, None, a.connections, d, true)
        }
    }
}

/// Worker CPU µs per request and requests/s of one load run of `d` on `case`'s file.
fn cpu_round(srv: &Running, case: &Case, a: &StaticArgs, wrk: Option<&Path>) -> Result<(f64, f64)> {
    let path = format!("/{}", case.file);
    let d = Duration::from_secs(a.duration.max(1));
    let pids = srv.worker_pids()?;
    let cpu0 = procfs::cpu_ticks(&pids)?;
    let r0 = srv.requests()?;
    let t0 = std::time::Instant::now();
    load(srv, wrk, &path, a, case.pipelined, d)?;
    let secs = t0.elapsed().as_secs_f64();
    let r1 = srv.requests()?;
    let cpu1 = procfs::cpu_ticks(&pids)?;
    let n = r1.saturating_sub(r0).max(1) as f64;
    Ok((
        (cpu1 - cpu0) as f64 * 1e6 / procfs::ticks_per_sec() / n,
        n / secs,
    ))
}

/// System calls per request of one traced load run.
fn syscalls_round(
    srv: &Running,
    case: &Case,
    a: &StaticArgs,
    wrk: Option<&Path>,
    strace: &Path,
) -> Result<f64> {
    let path = format!("/{}", case.file);
    let pids = srv.worker_pids()?;
    let tracer = procfs::Strace::attach(strace, &pids)?;
    let r0 = srv.requests()?;
    load(
        srv,
        wrk,
        &path,
        a,
        case.pipelined,
        Duration::from_secs(a.duration.max(1)),
    )?;
    let r1 = srv.requests()?;
    let calls = tracer.finish()?;
    Ok(calls as f64 / r1.saturating_sub(r0).max(1) as f64)
}

/// Every server of one case, started side by side: a warm-up each (page cache, buffers,
/// `open_file_cache`), then `--rounds` CPU runs in alternating order (shard, nginx; nginx,
/// shard; ...), so that the machine's drift falls on both alike, then one traced run each.
fn measure_case(
    servers: &[Running],
    case: &Case,
    a: &StaticArgs,
    wrk: Option<&Path>,
    strace: Option<&Path>,
) -> Result<Vec<Measure>> {
    let path = format!("/{}", case.file);
    for srv in servers {
        load(srv, wrk, &path, a, case.pipelined, Duration::from_secs(1))?;
    }
    let mut runs: Vec<Vec<(f64, f64)>> = vec![Vec::new(); servers.len()];
    for round in 0..a.rounds.max(1) {
        let mut order: Vec<usize> = (0..servers.len()).collect();
        if round % 2 == 1 {
            order.reverse();
        }
        for i in order {
            runs[i].push(cpu_round(&servers[i], case, a, wrk)?);
        }
    }
    let mut out = Vec::new();
    for (i, srv) in servers.iter().enumerate() {
        let syscalls = match strace {
            Some(st) => Some(syscalls_round(srv, case, a, wrk, st)?),
            None => None,
        };
        let ratios = runs[0]
            .iter()
            .zip(&runs[i])
            .map(|(s, o)| s.0 / o.0.max(1e-9))
            .collect();
        out.push(Measure {
            syscalls,
            cpu_us: median(runs[i].iter().map(|r| r.0).collect()),
            rps: median(runs[i].iter().map(|r| r.1).collect()),
            ratio: median(ratios),
        });
    }
    Ok(out)
}

pub fn run(mut a: StaticArgs) -> Result<()> {
    if a.smoke {
        a.duration = 1;
        a.rounds = 1;
        a.connections = a.connections.min(4);
    }
    procfs::raise_nofile_limit();
    let shard = crate::shard_binary(a.peers.shard.as_deref())?;
    let tools = crate::Tools::find(&a.peers, false);
    let mut kinds = vec![Kind::Shard(shard)];
    if let Some(n) = &tools.nginx {
        kinds.push(Kind::Nginx(n.clone()));
    }
    let mut notes = tools.notes.clone();
    let mut cases = cases(a.smoke);
    cases.retain(|c| {
        (a.size.is_empty() || a.size.contains(&c.size))
            && a.sendfile.is_none_or(|v| v == c.sendfile)
            && a.cache.is_none_or(|v| v == c.cache)
            && a.pipelined.is_none_or(|v| v == c.pipelined)
    });
    if tools.wrk.is_none() {
        cases.retain(|c| !c.pipelined);
        notes.push("pipelined cases skipped: they need wrk (apt-get install wrk)".into());
    }
    let mut rows: Vec<(Case, Vec<Measure>)> = Vec::new();
    for case in &cases {
        eprintln!(
            "shard-bench static: {}, sendfile {}, open_file_cache {}{}",
            size_label(case.size),
            if case.sendfile { "on" } else { "off" },
            if case.cache { "on" } else { "off" },
            if case.pipelined { ", pipelined" } else { "" }
        );
        let spec = Spec {
            workers: a.workers,
            listen_opts: "reuseport".into(),
            http_extra: format!(
                "sendfile {};\n{}",
                if case.sendfile { "on" } else { "off" },
                if case.cache {
                    "open_file_cache max=1000 inactive=60s;\n"
                } else {
                    ""
                }
            ),
            tag: "static".into(),
            ..Spec::default()
        };
        let mut servers = Vec::new();
        for kind in &kinds {
            let srv = servers::start_with(kind, &spec, |dir| {
                for (f, size) in FILES {
                    let body: Vec<u8> = (0..size).map(|i| b'a' + (i % 26) as u8).collect();
                    std::fs::write(dir.join("html").join(f), body)?;
                }
                Ok(())
            })
            .with_context(|| format!("starting {}", kind.name()))?;
            servers.push(srv);
        }
        let m = measure_case(
            &servers,
            case,
            &a,
            tools.wrk.as_deref(),
            tools.strace.as_deref(),
        );
        for srv in servers {
            srv.stop();
        }
        rows.push((*case, m?));
    }
    let report = render(&a, &kinds, &rows, &notes);
    print!("{report}");
    servers::write_report(a.out.as_deref(), &report)
}

fn f(v: Option<f64>, digits: usize) -> String {
    v.map_or("-".into(), |x| format!("{x:.digits$}"))
}

fn render(
    a: &StaticArgs,
    kinds: &[Kind],
    rows: &[(Case, Vec<Measure>)],
    notes: &[String],
) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# shard-bench static: {} workers, {} kept-alive connections, {} s x {} rounds per case, shard and nginx alternating (medians; CPU shard/nginx is the median of each round's ratio){}\n",
        a.workers,
        a.connections,
        a.duration,
        a.rounds,
        if a.smoke { " (smoke: numbers are not meaningful)" } else { "" }
    );
    let nginx = kinds.len() > 1;
    let _ = writeln!(
        s,
        "| file | sendfile | open_file_cache | pipelined | shard syscalls/req | nginx syscalls/req | shard CPU µs/req | nginx CPU µs/req | CPU shard/nginx | shard req/s | nginx req/s |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|---|---|");
    for (c, m) in rows {
        let n = m.get(1).filter(|_| nginx);
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {:.2} | {} | {} | {:.0} | {} |",
            size_label(c.size),
            if c.sendfile { "on" } else { "off" },
            if c.cache { "on" } else { "off" },
            if c.pipelined {
                format!("{PIPELINE} per write")
            } else {
                "no".into()
            },
            f(m[0].syscalls, 2),
            f(n.and_then(|n| n.syscalls), 2),
            m[0].cpu_us,
            f(n.map(|n| n.cpu_us), 2),
            f(n.map(|n| n.ratio), 2),
            m[0].rps,
            f(n.map(|n| n.rps), 0),
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
