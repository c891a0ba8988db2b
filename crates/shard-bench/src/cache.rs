//! `shard-bench cache`: `proxy_cache` hits, shard and nginx side by side, in one run.
//!
//! One backend (a shard with one worker) serves objects of 1 KiB, 64 KiB and 1 MiB from a
//! directory this run writes. Each front (`--workers` workers) proxies `/o/` to it with
//! `proxy_cache` (`proxy_cache_valid 200 1h`, a keys zone of 10 MiB, `levels=1:2`) on the same
//! configuration text. Both fronts run from the start; in each, one request stores every
//! object and a second must say `HIT`. Then per object the loads on that one URL alternate
//! between the fronts, [`ROUNDS`] each (the median is reported, so that a ratio compares runs
//! seconds apart on a machine whose speed drifts): requests/s and the front's worker CPU per
//! request, and the requests that reached the backend during the loads (misses; 0 when every
//! answer was a hit).
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
//! A 90%-hit mix: a third location (`/m/`) caches a slow backend of the bench's own (a
//! thread per connection that answers 1 KiB [`SLOW_MS`] after each request); `--hot` keys
//! (`/m/1k?k=N`) are stored first, then two open loops run together for `--duration`: 90% of
//! `--rate` on the hot keys in turn (hits), 10% with `X-Miss: 1`, which the location passes
//! to the slow backend and does not store (`proxy_cache_bypass`, `proxy_no_cache`): misses
//! that hold an upstream connection for [`SLOW_MS`] each. p50 and p99 of the hits, p99 of
//! the misses: the hits must not wait for the misses.
//!
//! A cold start: `--entries` keys (`/o/1k?n=N`) are stored (each once, 50 connections), the
//! front is stopped and started again on the directory, and a second of load over 1,000 of
//! those keys follows at once: answers, how many went to the backend (0: all from the cache),
//! and, for shard, when its cache loader process had indexed them all (it exits then;
//! nginx's loader starts a minute after the start, and both look on disk meanwhile).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};

use crate::servers::{self, Kind, Running, Spec};
use crate::Tools;
use crate::{fmt, procfs};

/// Keys of the cold start (`--entries`' default), and keys loaded right after the restart.
const ENTRIES: usize = 100_000;
const AFTER_RESTART_KEYS: usize = 1000;

/// How long the mix's slow backend takes per answer.
const SLOW_MS: u64 = 100;

/// Hit loads per object and front, alternating between the fronts; the median is reported.
const ROUNDS: usize = 3;

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
    /// Hot keys of the 90%-hit mix.
    #[arg(long, default_value_t = 1000)]
    hot: usize,
    /// Entries stored before the cold start.
    #[arg(long, default_value_t = ENTRIES)]
    entries: usize,
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
    /// The 90%-hit mix: p50 and p99 of the hits, p99 of the misses (ms), and the hits'
    /// cache statuses that were not `HIT` (should be none).
    mix: Option<Mix>,
    /// The cold start.
    cold: Option<Cold>,
}

#[derive(Debug, Default, Clone)]
struct Mix {
    hit_p50_ms: f64,
    hit_p99_ms: f64,
    miss_p99_ms: f64,
    hits: u64,
    misses: u64,
}

#[derive(Debug, Default, Clone)]
struct Cold {
    /// Seconds to store the entries, and the backend requests that took.
    fill_secs: f64,
    stored: u64,
    /// After the restart: answers in the first second over `AFTER_RESTART_KEYS` stored keys,
    /// and how many reached the backend.
    answers: u64,
    to_backend: u64,
    /// shard: ms after the start when the cache loader process had exited.
    loader_ms: Option<f64>,
}

pub fn run(mut a: CacheArgs) -> Result<()> {
    if a.smoke {
        a.duration = 1;
        a.connections = a.connections.min(4);
        a.hot = a.hot.min(20);
        a.entries = a.entries.min(200);
    }
    ensure!(
        a.hot >= 1 && a.entries >= 1,
        "--hot and --entries must be at least 1"
    );
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
    // Every front runs from the start: the hit loads alternate between them (shard, nginx,
    // shard, ...), so each ratio compares loads seconds apart on a machine whose speed drifts.
    let slow = slow_backend()?;
    let mut fronts = Vec::new();
    let mut running = Vec::new();
    for kind in &kinds {
        let name = kind.name().to_string();
        let cache_dir = work.join(format!("cache-{name}"));
        let _ = std::fs::remove_dir_all(&cache_dir);
        let spec = front_spec(backend.port, slow, &cache_dir, a.workers);
        let started = servers::start_with(kind, &spec, |_| Ok(()))
            .context("starting the front")
            .and_then(|r| {
                for (object, size) in OBJECTS {
                    store(r.port, &format!("/o/{object}"), size)?;
                }
                Ok(r)
            });
        match started {
            Ok(r) => running.push(Some(r)),
            Err(e) => {
                notes.push(format!("{name}: not measured: {e:#}"));
                running.push(None);
            }
        }
        fronts.push(Front {
            name,
            cells: vec![Cell::default(); OBJECTS.len()],
            ..Default::default()
        });
    }
    let rounds = if a.smoke { 1 } else { ROUNDS };
    for (i, (object, _)) in OBJECTS.iter().enumerate() {
        let mut samples: Vec<Vec<Cell>> = vec![Vec::new(); kinds.len()];
        for round in 0..rounds {
            for (j, r) in running.iter().enumerate() {
                let Some(r) = r else { continue };
                eprintln!(
                    "shard-bench: {}: {object} hits, round {} of {rounds}",
                    fronts[j].name,
                    round + 1
                );
                match hit_load(r, &backend, &format!("/o/{object}"), &tools, &a) {
                    Ok(c) => samples[j].push(c),
                    Err(e) => notes.push(format!("{}: {object}: {e:#}", fronts[j].name)),
                }
            }
        }
        for (j, s) in samples.into_iter().enumerate() {
            fronts[j].cells[i] = median_cell(s);
        }
    }
    for (j, kind) in kinds.iter().enumerate() {
        let Some(r) = running[j].take() else { continue };
        eprintln!("shard-bench: {}: latency, mix, restart", fronts[j].name);
        let cache_dir = work.join(format!("cache-{}", fronts[j].name));
        let spec = front_spec(backend.port, slow, &cache_dir, a.workers);
        if let Err(e) = measure_front(kind, &spec, r, &backend, &a, &mut fronts[j]) {
            notes.push(format!("{}: not measured: {e:#}", fronts[j].name));
        }
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

fn front_spec(backend: u16, slow: u16, cache_dir: &Path, workers: usize) -> Spec {
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
                       add_header X-Cache $upstream_cache_status; }\n\
                       location /m/ { proxy_pass http://slow; proxy_http_version 1.1; \
                       proxy_set_header Connection \"\"; proxy_cache bench; \
                       proxy_cache_valid 200 1h; proxy_cache_bypass $http_x_miss; \
                       proxy_no_cache $http_x_miss; \
                       add_header X-Cache $upstream_cache_status; }"
            .into(),
        ok: None,
        http_extra: format!(
            // `use_temp_path=off`: nginx writes its temporary files in the cache directory
            // (as shard always does), not under its compiled-in `proxy_temp_path`, which
            // the workers' user may not be able to write.
            "proxy_cache_path {} levels=1:2 keys_zone=bench:64m use_temp_path=off; \
             upstream backend {{ server 127.0.0.1:{backend}; keepalive 32; }} \
             upstream slow {{ server 127.0.0.1:{slow}; keepalive 32; }}",
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

/// Stores `path` (`size` bytes) in the front's cache and checks the next answer is a hit.
fn store(port: u16, path: &str, size: usize) -> Result<()> {
    let (st, _, len) = get(port, path)?;
    ensure!(st == 200 && len == size, "GET {path}: {st}, {len} bytes");
    let (_, cache, _) = get(port, path)?;
    ensure!(cache == "HIT", "GET {path} again was {cache:?}, not HIT");
    Ok(())
}

/// One load of `--duration` on `path` (a stored entry): requests/s, the front's worker CPU
/// per request, and the requests that reached the backend meanwhile.
fn hit_load(
    front: &Running,
    backend: &Running,
    path: &str,
    tools: &Tools,
    a: &CacheArgs,
) -> Result<Cell> {
    let pids = front.worker_pids()?;
    let b0 = backend.requests()?;
    let f0 = front.requests()?;
    let cpu0 = procfs::cpu_ticks(&pids)?;
    let t0 = Instant::now();
    crate::run_load(
        front.port,
        path,
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
    Ok(Cell {
        rps: Some(served as f64 / secs),
        cpu_us_per_req: Some((cpu1 - cpu0) as f64 * 1e6 / procfs::ticks_per_sec() / served as f64),
        misses: Some(misses),
    })
}

/// The round with the median CPU per request (misses summed over the rounds).
fn median_cell(mut s: Vec<Cell>) -> Cell {
    if s.is_empty() {
        return Cell::default();
    }
    let misses = s.iter().filter_map(|c| c.misses).sum();
    s.sort_by(|x, y| {
        x.cpu_us_per_req
            .partial_cmp(&y.cpu_us_per_req)
            .unwrap_or(std::cmp::Ordering::Equal)
    });
    Cell {
        misses: Some(misses),
        ..s[s.len() / 2].clone()
    }
}

/// The rest of one front's figures, on `front` (running, its entries stored): latency, the
/// mix, then a restart and the cold start (it is stopped).
fn measure_front(
    kind: &Kind,
    spec: &Spec,
    front: Running,
    backend: &Running,
    a: &CacheArgs,
    f: &mut Front,
) -> Result<()> {
    let res = (|| -> Result<()> {
        // Latency at a steady rate: plain hits, then an entry that keeps expiring.
        let (_, _, len) = get(front.port, "/s/1k")?;
        ensure!(len == 1024, "GET /s/1k: {len} bytes");
        f.p99_hit_ms = Some(p99_ms(front.port, "/o/1k", a)?);
        f.p99_swu_ms = Some(p99_ms(front.port, "/s/1k", a)?);
        f.mix = Some(mix(front.port, a)?);
        Ok(())
    })();
    front.stop();
    res?;
    // A restart on the same directory: is the first answer a hit?
    let t0 = Instant::now();
    let front = servers::start_with(kind, spec, |_| Ok(())).context("starting the front again")?;
    let first = get(front.port, "/o/1k");
    let ms = t0.elapsed().as_secs_f64() * 1000.0;
    front.stop();
    let (_, cache, _) = first?;
    f.restart = Some((if cache.is_empty() { "-".into() } else { cache }, ms));
    f.cold = Some(cold_start(kind, spec, backend, a)?);
    Ok(())
}

/// Starts the mix's slow backend on a loopback port: each connection gets a thread that
/// answers every request head with 1 KiB, [`SLOW_MS`] later (kept alive). It lives as long
/// as the bench.
fn slow_backend() -> Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    let port = l.local_addr()?.port();
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            std::thread::spawn(move || slow_conn(s));
        }
    });
    Ok(port)
}

fn slow_conn(mut s: TcpStream) {
    let body = [b'm'; 1024];
    let mut head = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    head.extend_from_slice(&body);
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        // Requests have no body here (GET).
        while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            buf.drain(..end + 4);
            std::thread::sleep(Duration::from_millis(SLOW_MS));
            if s.write_all(&head).is_err() {
                return;
            }
        }
        match s.read(&mut chunk) {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// The 90%-hit mix (see the module's text).
fn mix(port: u16, a: &CacheArgs) -> Result<Mix> {
    let hot: Vec<String> = (0..a.hot).map(|i| format!("/m/1k?k={i}")).collect();
    let target = crate::loadgen::Target::parse(&format!("http://127.0.0.1:{port}/m/1k"))?;
    // Each hot key once (misses of the slow location, in parallel), then each is a hit.
    let fill = crate::loadgen::LoadSpec {
        connections: 100.min(a.hot),
        duration: Duration::from_secs(60),
        requests: Some(a.hot as u64),
        paths: hot.clone(),
        ..crate::loadgen::LoadSpec::new(target.clone())
    };
    let r = crate::loadgen::run(&fill)?;
    ensure!(
        r.requests == a.hot as u64,
        "storing the hot keys: {} answers ({:?})",
        r.requests,
        r.errors
    );
    for i in [0, a.hot / 2, a.hot - 1] {
        let (_, cache, _) = get(port, &format!("/m/1k?k={i}"))?;
        ensure!(
            cache == "HIT",
            "hot key {i} was {cache:?} after it was stored"
        );
    }
    let hits = crate::loadgen::LoadSpec {
        connections: a.connections,
        duration: Duration::from_secs(a.duration),
        rate: Some(a.rate * 0.9),
        paths: hot,
        ..crate::loadgen::LoadSpec::new(target.clone())
    };
    // Enough connections that a miss never waits for another on its connection (three
    // times the misses in flight at the rate).
    let miss_rate = a.rate * 0.1;
    let in_flight = miss_rate * SLOW_MS as f64 / 1000.0;
    let misses = crate::loadgen::LoadSpec {
        connections: ((in_flight * 3.0).ceil() as usize).max(4),
        duration: Duration::from_secs(a.duration),
        rate: Some(miss_rate),
        headers: vec![("X-Miss".into(), "1".into())],
        ..crate::loadgen::LoadSpec::new(target)
    };
    let (h, m) = std::thread::scope(|s| {
        let m = s.spawn(|| crate::loadgen::run(&misses));
        let h = crate::loadgen::run(&hits);
        (h, m.join())
    });
    let h = h?;
    let m = m.map_err(|_| anyhow::anyhow!("the miss load panicked"))??;
    ensure!(h.requests > 0 && m.requests > 0, "no responses in the mix");
    let ms =
        |r: &crate::loadgen::LoadReport, q: f64| r.histogram.value_at_quantile(q) as f64 / 1000.0;
    Ok(Mix {
        hit_p50_ms: ms(&h, 0.5),
        hit_p99_ms: ms(&h, 0.99),
        miss_p99_ms: ms(&m, 0.99),
        hits: h.requests,
        misses: m.requests,
    })
}

/// The cold start (see the module's text): stores `--entries` keys, restarts the front on
/// the directory and loads stored keys at once.
fn cold_start(kind: &Kind, spec: &Spec, backend: &Running, a: &CacheArgs) -> Result<Cold> {
    let front = servers::start_with(kind, spec, |_| Ok(())).context("starting the front")?;
    let keys: Vec<String> = (0..a.entries).map(|i| format!("/o/1k?n={i}")).collect();
    let target = crate::loadgen::Target::parse(&format!("http://127.0.0.1:{}/o/1k", front.port))?;
    let b0 = backend.requests()?;
    let t0 = Instant::now();
    let fill = crate::loadgen::LoadSpec {
        connections: 50.min(a.entries),
        duration: Duration::from_secs(600),
        requests: Some(a.entries as u64),
        paths: keys.clone(),
        ..crate::loadgen::LoadSpec::new(target)
    };
    let r = crate::loadgen::run(&fill);
    let fill_secs = t0.elapsed().as_secs_f64();
    let stored = backend.requests()?.saturating_sub(b0 + 1);
    front.stop();
    let r = r?;
    ensure!(
        r.requests == a.entries as u64,
        "storing {} entries: {} answers ({:?})",
        a.entries,
        r.requests,
        r.errors
    );
    // Spread over the stored keys.
    let step = (a.entries / AFTER_RESTART_KEYS).max(1);
    let some: Vec<String> = keys.iter().step_by(step).cloned().collect();
    let t0 = Instant::now();
    let front = servers::start_with(kind, spec, |_| Ok(())).context("starting the front again")?;
    let res = (|| -> Result<Cold> {
        let b0 = backend.requests()?;
        let target =
            crate::loadgen::Target::parse(&format!("http://127.0.0.1:{}/o/1k", front.port))?;
        let load = crate::loadgen::LoadSpec {
            connections: a.connections,
            duration: Duration::from_secs(1),
            paths: some,
            ..crate::loadgen::LoadSpec::new(target)
        };
        let r = crate::loadgen::run(&load)?;
        let to_backend = backend.requests()?.saturating_sub(b0 + 1);
        // shard's loader exits once it has indexed the directory.
        let loader_ms = if matches!(kind, Kind::Shard(_)) {
            let deadline = Instant::now() + Duration::from_secs(120);
            loop {
                if !has_child(front.master_pid(), b"cache loader") {
                    break Some(t0.elapsed().as_secs_f64() * 1000.0);
                }
                if Instant::now() > deadline {
                    break None;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        } else {
            None
        };
        Ok(Cold {
            fill_secs,
            stored,
            answers: r.requests,
            to_backend,
            loader_ms,
        })
    })();
    front.stop();
    res
}

/// Whether a child of `pid` has `name` in its command line (its process title).
fn has_child(pid: i32, name: &[u8]) -> bool {
    let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")) else {
        return false;
    };
    text.split_whitespace().any(|p| {
        std::fs::read(format!("/proc/{p}/cmdline"))
            .unwrap_or_default()
            .windows(name.len())
            .any(|w| w == name)
    })
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
        "# shard-bench cache: proxy_cache hits, {} front workers, {} connections, {} s per run, \
         the median of {} runs alternating between the servers\n\n",
        a.workers,
        a.connections,
        a.duration,
        if a.smoke { 1 } else { ROUNDS }
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
    s.push_str(&format!(
        "\n90%-hit mix: {} hot keys at {:.0} requests/s, and {:.0} requests/s of misses to a \
         backend that answers in {SLOW_MS} ms\n\n\
         | server | hits | hit p50 (ms) | hit p99 (ms) | misses | miss p99 (ms) |\n|---|---:|---:|---:|---:|---:|\n",
        a.hot,
        a.rate * 0.9,
        a.rate * 0.1
    ));
    for f in fronts {
        let m = f.mix.clone();
        s.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} |\n",
            f.name,
            m.as_ref().map_or("-".into(), |m| m.hits.to_string()),
            fmt(m.as_ref().map(|m| m.hit_p50_ms), 2),
            fmt(m.as_ref().map(|m| m.hit_p99_ms), 2),
            m.as_ref().map_or("-".into(), |m| m.misses.to_string()),
            fmt(m.as_ref().map(|m| m.miss_p99_ms), 1),
        ));
    }
    s.push_str(&format!(
        "\nCold start: {} entries stored, the front restarted on them, then 1 s of load over \
         {} of them at once\n\n\
         | server | seconds to store | backend requests | answers in the first second | of them from the backend | loader done (ms after the start) |\n\
         |---|---:|---:|---:|---:|---:|\n",
        a.entries, AFTER_RESTART_KEYS.min(a.entries)
    ));
    for f in fronts {
        let c = f.cold.clone();
        s.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} |\n",
            f.name,
            fmt(c.as_ref().map(|c| c.fill_secs), 1),
            c.as_ref().map_or("-".into(), |c| c.stored.to_string()),
            c.as_ref().map_or("-".into(), |c| c.answers.to_string()),
            c.as_ref().map_or("-".into(), |c| c.to_backend.to_string()),
            fmt(c.as_ref().and_then(|c| c.loader_ms), 0),
        ));
    }
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
                mix: Some(Mix {
                    hit_p50_ms: 0.2,
                    hit_p99_ms: 0.5,
                    miss_p99_ms: 101.0,
                    hits: 900,
                    misses: 100,
                }),
                cold: Some(Cold {
                    fill_secs: 3.0,
                    stored: 100,
                    answers: 5000,
                    to_backend: 0,
                    loader_ms: Some(250.0),
                }),
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
                mix: None,
                cold: None,
            },
        ];
        let a = CacheArgs {
            workers: 2,
            duration: 1,
            connections: 4,
            rate: 100.0,
            hot: 10,
            entries: 100,
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
        assert!(
            r.contains("| shard | 900 | 0.20 | 0.50 | 100 | 101.0 |"),
            "{r}"
        );
        assert!(r.contains("| shard | 3.0 | 100 | 5000 | 0 | 250 |"), "{r}");
        assert!(r.contains("| nginx | - | - | - | - | - |"), "{r}");
    }
}
