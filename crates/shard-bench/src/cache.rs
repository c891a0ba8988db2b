//! `shard-bench cache`: `proxy_cache` hits, shard and nginx side by side, in one run.
//!
//! One backend (a shard with one worker) serves objects of 1 KiB, 64 KiB and 1 MiB from a
//! directory this run writes. Each front (`--workers` workers) proxies `/o/` to it with
//! `proxy_cache` (`proxy_cache_valid 200 1h`, a keys zone of 10 MiB, `levels=1:2`) on the same
//! configuration text. Per object: one request stores it, a second must say `HIT`, then the
//! load runs on that one URL: requests/s and the front's worker CPU per request, and the
//! requests that reached the backend during the load (misses; 0 when every answer was a hit).
//! Then the front is stopped and started again on the same cache directory: whether its
//! first answer is a hit, and how long after the start that answer came.
//!
//! Stale-while-updating: a second location (`/s/`) of the same front serves the 1 KiB object
//! from a slow backend location (`limit_rate 10k`: about 100 ms) with `proxy_cache_valid 200
//! 1s`, `proxy_cache_use_stale updating` and `proxy_cache_background_update on`, so the entry
//! expires every second under load and is updated behind the answers. An open-loop load of
//! `--rate` requests/s (the built-in generator, for its histogram) measures p99 there and on
//! a plain hit; the goal is the first within 2 ms of the second.
//!
//! Deliberately not here (yet): a 90%-hit mix over many keys (the load generators load one
//! URL) and a cold start with 100k entries on disk; `docs/bench.md` says so.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};

use crate::servers::{self, Kind, Running, Spec};
use crate::Tools;
use crate::{fmt, procfs};

/// The objects: name and size.
const OBJECTS: [(&str, usize); 3] = [("1k", 1024), ("64k", 64 * 1024), ("1m", 1024 * 1024)];

#[derive(clap::Args, Debug, Clone)]
pub struct CacheArgs {
    /// Worker processes of each front (the backend always has one).
    #[arg(long, default_value_t = 2)]
    workers: usize,
    /// Seconds per load run.
    #[arg(long, default_value_t = 5)]
    duration: u64,
    /// Concurrent client connections per load run.
    #[arg(long, default_value_t = 50)]
    connections: usize,
    /// Requests per second of the open-loop latency runs (hit, and stale-while-updating).
    #[arg(long, default_value_t = 2000.0)]
    rate: f64,
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

/// One front's numbers for one object.
#[derive(Debug, Default, Clone)]
struct Cell {
    rps: Option<f64>,
    cpu_us_per_req: Option<f64>,
    misses: Option<u64>,
}

#[derive(Debug, Default)]
struct Front {
    name: String,
    cells: Vec<Cell>,
    /// After a restart on the same directory: the first answer's cache status and how long
    /// after the start it came (ms).
    restart: Option<(String, f64)>,
    /// p99 (ms) of plain hits, and of answers for an entry that expires every second and is
    /// updated in the background.
    p99_hit_ms: Option<f64>,
    p99_swu_ms: Option<f64>,
}

pub fn run(mut a: CacheArgs) -> Result<()> {
    if a.smoke {
        a.duration = 1;
        a.connections = a.connections.min(4);
    }
    ensure!(a.workers >= 1, "--workers must be at least 1");
    ensure!(a.connections >= 1, "--connections must be at least 1");
    procfs::raise_nofile_limit();
    let shard = crate::shard_binary(a.peers.shard.as_deref())?;
    let tools = Tools::find(&a.peers, a.builtin_load);
    let mut notes = tools.notes.clone();

    let work = std::env::temp_dir().join(format!("shard-bench-cache-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    let objects = work.join("objects");
    std::fs::create_dir_all(&objects)?;
    for (name, size) in OBJECTS {
        let body: Vec<u8> = (0..size).map(|i| b'a' + (i % 26) as u8).collect();
        std::fs::write(objects.join(name), body)?;
    }
    // The fronts' workers (`nobody`) write the cache under here.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&work, std::fs::Permissions::from_mode(0o755))?;
    let backend = start_backend(&shard, &objects)?;

    let mut kinds = vec![Kind::Shard(shard)];
    if let Some(n) = &tools.nginx {
        kinds.push(Kind::Nginx(n.clone()));
    }
    let mut fronts = Vec::new();
    for kind in &kinds {
        let name = kind.name().to_string();
        eprintln!(
            "shard-bench: {name}: cache hits, {} workers, {} connections",
            a.workers, a.connections
        );
        let mut f = Front {
            name: name.clone(),
            ..Default::default()
        };
        let cache_dir = work.join(format!("cache-{name}"));
        if let Err(e) = measure_front(kind, &backend, &cache_dir, &tools, &a, &mut f) {
            notes.push(format!("{name}: not measured: {e:#}"));
        }
        fronts.push(f);
    }
    backend.stop();
    let _ = std::fs::remove_dir_all(&work);
    let report = render(&a, &fronts, &notes);
    print!("{report}");
    servers::write_report(a.out.as_deref(), &report)
}

fn start_backend(shard: &Path, objects: &Path) -> Result<Running> {
    let spec = Spec {
        workers: 1,
        listen_opts: String::new(),
        events: String::new(),
        server_extra: format!(
            "location /o/ {{ alias {o}/; }} location /slow/ {{ alias {o}/; limit_rate 10k; }}",
            o = objects.display()
        ),
        ok: None,
        http_extra: String::new(),
        stream: None,
        main_extra: String::new(),
        idle: 0,
        tag: "cache-backend".into(),
        detach: false,
    };
    servers::start_with(&Kind::Shard(shard.to_path_buf()), &spec, |_| Ok(()))
        .context("starting the backend (shard, 1 worker)")
}

fn front_spec(backend: u16, cache_dir: &Path, workers: usize) -> Spec {
    Spec {
        workers,
        listen_opts: "reuseport".into(),
        events: String::new(),
        server_extra: "location /o/ { proxy_pass http://backend; proxy_http_version 1.1; \
                       proxy_set_header Connection \"\"; proxy_cache bench; \
                       proxy_cache_valid 200 1h; add_header X-Cache $upstream_cache_status; }\n\
                       location /s/ { proxy_pass http://backend/slow/; proxy_http_version 1.1; \
                       proxy_set_header Connection \"\"; proxy_cache bench; \
                       proxy_cache_valid 200 1s; proxy_cache_use_stale updating; \
                       proxy_cache_background_update on; \
                       add_header X-Cache $upstream_cache_status; }"
            .into(),
        ok: None,
        http_extra: format!(
            // `use_temp_path=off`: nginx writes its temporary files in the cache directory
            // (as shard always does), not under its compiled-in `proxy_temp_path`, which
            // the workers' user may not be able to write.
            "proxy_cache_path {} levels=1:2 keys_zone=bench:10m use_temp_path=off; \
             upstream backend {{ server 127.0.0.1:{backend}; keepalive 32; }}",
            cache_dir.display()
        ),
        stream: None,
        main_extra: String::new(),
        idle: 0,
        tag: "cache-front".into(),
        detach: false,
    }
}

/// `GET path`: the status, the `X-Cache` value and the body's length.
fn get(port: u16, path: &str) -> Result<(u16, String, usize)> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n"
    )?;
    let mut resp = Vec::new();
    s.read_to_end(&mut resp).context("reading a response")?;
    let end = resp
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map_or(resp.len(), |i| i + 4);
    let head = String::from_utf8_lossy(&resp[..end]).into_owned();
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let cache = head
        .lines()
        .find_map(|l| {
            l.split_once(':')
                .filter(|(n, _)| n.eq_ignore_ascii_case("x-cache"))
        })
        .map(|(_, v)| v.trim().to_string())
        .unwrap_or_default();
    Ok((status, cache, resp.len() - end))
}

fn measure_front(
    kind: &Kind,
    backend: &Running,
    cache_dir: &Path,
    tools: &Tools,
    a: &CacheArgs,
    f: &mut Front,
) -> Result<()> {
    let _ = std::fs::remove_dir_all(cache_dir);
    let spec = front_spec(backend.port, cache_dir, a.workers);
    let front = servers::start_with(kind, &spec, |_| Ok(())).context("starting the front")?;
    let res = (|| -> Result<()> {
        for (name, size) in OBJECTS {
            let path = format!("/o/{name}");
            let (st, _, len) = get(front.port, &path)?;
            ensure!(st == 200 && len == size, "GET {path}: {st}, {len} bytes");
            let (_, cache, _) = get(front.port, &path)?;
            ensure!(cache == "HIT", "GET {path} again was {cache:?}, not HIT");
            let pids = front.worker_pids()?;
            let b0 = backend.requests()?;
            let f0 = front.requests()?;
            let cpu0 = procfs::cpu_ticks(&pids)?;
            let t0 = Instant::now();
            crate::run_load(
                front.port,
                &path,
                tools.wrk.as_deref(),
                a.connections,
                Duration::from_secs(a.duration),
                true,
            )?;
            let secs = t0.elapsed().as_secs_f64();
            let cpu1 = procfs::cpu_ticks(&pids)?;
            let served = front.requests()?.saturating_sub(f0 + 1).max(1);
            // The backend counts the bench's own status reads (one each).
            let misses = backend.requests()?.saturating_sub(b0 + 1);
            f.cells.push(Cell {
                rps: Some(served as f64 / secs),
                cpu_us_per_req: Some(
                    (cpu1 - cpu0) as f64 * 1e6 / procfs::ticks_per_sec() / served as f64,
                ),
                misses: Some(misses),
            });
        }
        // Latency at a steady rate: plain hits, then an entry that keeps expiring.
        let (_, _, len) = get(front.port, "/s/1k")?;
        ensure!(len == 1024, "GET /s/1k: {len} bytes");
        f.p99_hit_ms = Some(p99_ms(front.port, "/o/1k", a)?);
        f.p99_swu_ms = Some(p99_ms(front.port, "/s/1k", a)?);
        Ok(())
    })();
    front.stop();
    res?;
    // A restart on the same directory: is the first answer a hit?
    let t0 = Instant::now();
    let front = servers::start_with(kind, &spec, |_| Ok(())).context("starting the front again")?;
    let first = get(front.port, "/o/1k");
    let ms = t0.elapsed().as_secs_f64() * 1000.0;
    front.stop();
    let (_, cache, _) = first?;
    f.restart = Some((if cache.is_empty() { "-".into() } else { cache }, ms));
    Ok(())
}

/// p99 latency (ms) of an open-loop load of `--rate` requests/s on `path`.
fn p99_ms(port: u16, path: &str, a: &CacheArgs) -> Result<f64> {
    let target = crate::loadgen::Target::parse(&format!("http://127.0.0.1:{port}{path}"))?;
    let spec = crate::loadgen::LoadSpec {
        connections: a.connections,
        duration: Duration::from_secs(a.duration),
        rate: Some(a.rate),
        ..crate::loadgen::LoadSpec::new(target)
    };
    let r = crate::loadgen::run(&spec)?;
    ensure!(r.requests > 0, "no responses on {path}");
    Ok(r.histogram.value_at_quantile(0.99) as f64 / 1000.0)
}

fn render(a: &CacheArgs, fronts: &[Front], notes: &[String]) -> String {
    let mut s = format!(
        "# shard-bench cache: proxy_cache hits, {} front workers, {} connections, {} s per run\n\n",
        a.workers, a.connections, a.duration
    );
    s.push_str(
        "| object | server | requests/s | worker CPU µs/request | misses during the load |\n",
    );
    s.push_str("|---|---|---:|---:|---:|\n");
    for (i, (name, _)) in OBJECTS.iter().enumerate() {
        for f in fronts {
            let c = f.cells.get(i).cloned().unwrap_or_default();
            s.push_str(&format!(
                "| {name} | {} | {} | {} | {} |\n",
                f.name,
                fmt(c.rps, 0),
                fmt(c.cpu_us_per_req, 2),
                c.misses.map_or("-".into(), |m| m.to_string())
            ));
        }
    }
    if fronts.len() >= 2 {
        s.push_str("\n| object | shard / nginx worker CPU per request |\n|---|---:|\n");
        for (i, (name, _)) in OBJECTS.iter().enumerate() {
            let cpu = |f: &Front| f.cells.get(i).and_then(|c| c.cpu_us_per_req);
            let r = match (cpu(&fronts[0]), cpu(&fronts[1])) {
                (Some(x), Some(y)) if y > 0.0 => Some(x / y),
                _ => None,
            };
            s.push_str(&format!("| {name} | {} |\n", fmt(r, 2)));
        }
    }
    s.push_str("\n| server | first answer after a restart on the same cache | ms after the start |\n|---|---|---:|\n");
    for f in fronts {
        let (st, ms) = f
            .restart
            .clone()
            .map_or(("-".to_string(), None), |(c, m)| (c, Some(m)));
        s.push_str(&format!("| {} | {st} | {} |\n", f.name, fmt(ms, 0)));
    }
    s.push_str(
        "\n| server | p99 hit (ms) | p99 stale-while-updating (ms) | difference (ms) |\n|---|---:|---:|---:|\n",
    );
    for f in fronts {
        let d = match (f.p99_hit_ms, f.p99_swu_ms) {
            (Some(h), Some(w)) => Some(w - h),
            _ => None,
        };
        s.push_str(&format!(
            "| {} | {} | {} | {} |\n",
            f.name,
            fmt(f.p99_hit_ms, 2),
            fmt(f.p99_swu_ms, 2),
            fmt(d, 2)
        ));
    }
    s.push_str(&format!(
        "\n(open loop, {} requests/s over {} connections, built-in load generator)\n",
        a.rate, a.connections
    ));
    if !notes.is_empty() {
        s.push_str("\nNotes:\n");
        for n in notes {
            s.push_str(&format!("- {n}\n"));
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_report_has_a_row_per_object_and_server_and_the_ratios() {
        let cells = vec![
            Cell {
                rps: Some(1000.0),
                cpu_us_per_req: Some(10.0),
                misses: Some(0),
            };
            3
        ];
        let fronts = vec![
            Front {
                name: "shard".into(),
                cells: cells.clone(),
                restart: Some(("HIT".into(), 20.0)),
                p99_hit_ms: Some(1.0),
                p99_swu_ms: Some(1.5),
            },
            Front {
                name: "nginx".into(),
                cells: cells
                    .into_iter()
                    .map(|c| Cell {
                        cpu_us_per_req: Some(20.0),
                        ..c
                    })
                    .collect(),
                restart: None,
                p99_hit_ms: None,
                p99_swu_ms: None,
            },
        ];
        let a = CacheArgs {
            workers: 2,
            duration: 1,
            connections: 4,
            rate: 100.0,
            peers: Default::default(),
            builtin_load: false,
            smoke: true,
            out: None,
        };
        let r = render(&a, &fronts, &[]);
        assert!(r.contains("| 64k | nginx | 1000 | 20.00 | 0 |"), "{r}");
        assert!(r.contains("| 1m | 0.50 |"), "{r}");
        assert!(r.contains("| shard | HIT | 20 |"), "{r}");
        assert!(r.contains("| shard | 1.00 | 1.50 | 0.50 |"), "{r}");
    }
}
