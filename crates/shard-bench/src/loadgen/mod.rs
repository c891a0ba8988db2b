//! The load generator: `shard-bench load URL`, and the engine that the speed bench and the
//! experiments call directly through [`run`].
//!
//! This module owns the load spec ([`LoadSpec`]), the engine (std threads, each running its own
//! edge-triggered epoll loop over non-blocking sockets, in `worker`), the response framing
//! (`response`) and the report ([`LoadReport`], rendered as text or JSON in `report`).
//!
//! * Closed loop (default): every connection sends its next request as soon as the previous
//!   response is complete. Latency runs from the request write (keep-alive) or from the
//!   connect start (`close`) to the last byte of the response.
//! * Open loop (`rate`): every connection has a schedule of intended send times (the total rate
//!   spread evenly over the connections, like wrk2) and latency runs from the *intended* send
//!   time, so a stall of the server shows in the tail instead of silently lowering the rate
//!   (coordinated-omission correction).
//!
//! Latencies go into an `hdrhistogram::Histogram<u64>` in microseconds with 3 significant
//! figures, one per thread, merged at the end.

mod report;
pub(crate) mod response;
mod worker;

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use hdrhistogram::Histogram;

pub use report::{log2_buckets, render_json, render_text};

/// The longest run: `duration` is capped here.
pub const MAX_DURATION: Duration = Duration::from_secs(3600);
/// The most requests one run may be asked for.
pub const MAX_REQUESTS: u64 = 100_000_000;
/// The highest latency the histograms track, in microseconds (larger values saturate).
pub const MAX_LATENCY_US: u64 = 3_600_000_000;

/// Where the requests go: `http://HOST:PORT/path`, HOST an IPv4 literal or `localhost`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub addr: SocketAddr,
    /// The `Host` header value.
    pub host: String,
    /// The request target, starting with `/`.
    pub path: String,
}

impl Target {
    /// Parses `http://HOST[:PORT][/path]`; no TLS, no IPv6, no name lookup beyond `localhost`.
    pub fn parse(url: &str) -> Result<Target> {
        let rest = url
            .strip_prefix("http://")
            .with_context(|| format!("{url}: only http:// URLs are supported"))?;
        let (authority, path) = match rest.find(['/', '?']) {
            Some(i) if rest.as_bytes()[i] == b'/' => (&rest[..i], &rest[i..]),
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/"),
        };
        let path = if path.starts_with('?') {
            format!("/{path}")
        } else {
            path.to_string()
        };
        ensure!(
            !path.bytes().any(|b| b <= b' ' || b == 0x7f),
            "{url}: the path has spaces or control characters"
        );
        let (host, port) = match authority.rsplit_once(':') {
            Some((h, p)) => (
                h,
                p.parse::<u16>()
                    .ok()
                    .filter(|&p| p != 0)
                    .with_context(|| format!("{url}: bad port {p:?}"))?,
            ),
            None => (authority, 80),
        };
        let ip: Ipv4Addr = if host.eq_ignore_ascii_case("localhost") {
            Ipv4Addr::LOCALHOST
        } else {
            host.parse()
                .with_context(|| format!("{url}: the host must be an IPv4 literal or localhost"))?
        };
        Ok(Target {
            addr: SocketAddr::V4(SocketAddrV4::new(ip, port)),
            host: authority.to_string(),
            path,
        })
    }

    /// The request bytes every connection sends: `Host`, the user's `headers`, `User-Agent`
    /// and, with `close`, `Connection: close`; a user's header replaces the default of the
    /// same name (`-H 'Host: b.test'` benchmarks a name-based virtual host).
    pub fn request(&self, close: bool, headers: &[(String, String)]) -> Vec<u8> {
        let given = |name: &str| headers.iter().any(|(k, _)| k.eq_ignore_ascii_case(name));
        let mut r = format!("GET {} HTTP/1.1\r\n", self.path);
        if !given("host") {
            r.push_str(&format!("Host: {}\r\n", self.host));
        }
        for (k, v) in headers {
            r.push_str(&format!("{k}: {v}\r\n"));
        }
        if !given("user-agent") {
            r.push_str("User-Agent: shard-bench\r\n");
        }
        if close && !given("connection") {
            r.push_str("Connection: close\r\n");
        }
        r.push_str("\r\n");
        r.into_bytes()
    }
}

/// One load run.
#[derive(Debug, Clone)]
pub struct LoadSpec {
    pub target: Target,
    /// Concurrent connections (each carries at most one request at a time).
    pub connections: usize,
    /// Threads, each with its own epoll and its share of the connections.
    pub threads: usize,
    /// How long to run; with `requests`, whichever ends first. At most [`MAX_DURATION`].
    pub duration: Duration,
    /// Stop after this many requests (responses plus failed attempts); at most
    /// [`MAX_REQUESTS`].
    pub requests: Option<u64>,
    /// A new connection per request (`Connection: close`) instead of keep-alive.
    pub close: bool,
    /// Open loop: requests per second in total, spread evenly over the connections.
    pub rate: Option<f64>,
    /// A request (connect included) that takes longer than this fails as a timeout.
    pub timeout: Duration,
    /// Extra request headers (name, value), e.g. `Accept-Encoding`.
    pub headers: Vec<(String, String)>,
    /// Keep every request's start and end (`LoadReport::samples`), for time series.
    pub record: bool,
    /// Request targets taken in turn, one per request over all connections (empty: the
    /// target's own path): a run over many keys of a cache, each key once.
    pub paths: Vec<String>,
}

impl LoadSpec {
    /// The defaults of the command line: 10 connections, 2 threads, 10 s, keep-alive, closed
    /// loop, 5 s timeout.
    pub fn new(target: Target) -> LoadSpec {
        LoadSpec {
            target,
            connections: 10,
            threads: 2,
            duration: Duration::from_secs(10),
            requests: None,
            close: false,
            rate: None,
            timeout: Duration::from_secs(5),
            headers: Vec::new(),
            record: false,
            paths: Vec::new(),
        }
    }

    fn check(&self) -> Result<()> {
        ensure!(
            (1..=1_000_000).contains(&self.connections),
            "connections must be 1..=1000000"
        );
        ensure!(
            (1..=1024).contains(&self.threads),
            "threads must be 1..=1024"
        );
        ensure!(
            !self.duration.is_zero() && self.duration <= MAX_DURATION,
            "duration must be above 0 and at most {} s",
            MAX_DURATION.as_secs()
        );
        if let Some(n) = self.requests {
            ensure!(
                (1..=MAX_REQUESTS).contains(&n),
                "requests must be 1..={MAX_REQUESTS}"
            );
        }
        if let Some(r) = self.rate {
            ensure!(
                r.is_finite() && r > 0.0 && r <= 1e8,
                "rate must be above 0 and at most 1e8"
            );
        }
        ensure!(!self.timeout.is_zero(), "the timeout must be above 0");
        for (k, v) in &self.headers {
            ensure!(
                !k.is_empty()
                    && k.bytes().all(|b| b.is_ascii_graphic() && b != b':')
                    && !v.bytes().any(|b| b == b'\r' || b == b'\n'),
                "bad header {k:?}: {v:?}"
            );
        }
        Ok(())
    }
}

/// Failed requests by kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Errors {
    /// The connect failed (refused, unreachable, out of ports).
    pub connect: u64,
    /// The connection was reset, or closed before the response was complete.
    pub reset: u64,
    /// No complete response within the timeout (connect included).
    pub timeout: u64,
    /// A complete response whose status is not 2xx or 3xx. These are also counted in
    /// [`LoadReport::requests`].
    pub status: u64,
    /// Anything else: other I/O errors, a response that is not HTTP.
    pub other: u64,
}

impl Errors {
    /// Every error, `status` included.
    pub fn total(&self) -> u64 {
        self.connect + self.reset + self.timeout + self.status + self.other
    }

    /// The errors that ended a request without a response (all but `status`).
    pub fn failed(&self) -> u64 {
        self.total() - self.status
    }

    fn add(&mut self, o: &Errors) {
        self.connect += o.connect;
        self.reset += o.reset;
        self.timeout += o.timeout;
        self.status += o.status;
        self.other += o.other;
    }
}

/// What a run measured, merged over the threads.
#[derive(Debug, Clone)]
pub struct LoadReport {
    /// Complete responses, whatever their status.
    pub requests: u64,
    /// From the start to the end of the run (the deadline, or the last response for
    /// `requests`).
    pub elapsed: Duration,
    /// `requests` per second of `elapsed`.
    pub rps: f64,
    /// Response bytes read.
    pub bytes: u64,
    pub errors: Errors,
    /// Latency of every complete response, in microseconds.
    pub histogram: Histogram<u64>,
    /// Every request, complete or failed, by start time (only with `LoadSpec::record`).
    pub samples: Vec<Sample>,
}

/// One request of a recorded run, in microseconds from the start of the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Sample {
    /// When the request started: its intended send time in an open loop.
    pub start_us: u64,
    /// When its response completed, or when it failed.
    pub done_us: u64,
    /// A complete 2xx or 3xx response.
    pub ok: bool,
}

pub(crate) fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, MAX_LATENCY_US, 3).expect("valid histogram bounds")
}

/// Runs the load described by `spec` and returns the merged results.
pub fn run(spec: &LoadSpec) -> Result<LoadReport> {
    spec.check()?;
    let threads = spec.threads.min(spec.connections);
    let requests: Vec<Vec<u8>> = if spec.paths.is_empty() {
        vec![spec.target.request(spec.close, &spec.headers)]
    } else {
        spec.paths
            .iter()
            .map(|p| {
                let t = Target {
                    path: p.clone(),
                    ..spec.target.clone()
                };
                t.request(spec.close, &spec.headers)
            })
            .collect()
    };
    let shared = worker::Shared::new(spec, Instant::now() + Duration::from_millis(1));
    let per = spec.connections / threads;
    let extra = spec.connections % threads;
    let results = std::thread::scope(|s| {
        let mut handles = Vec::new();
        let mut first = 0;
        for t in 0..threads {
            let n = per + usize::from(t < extra);
            let (shared, request) = (&shared, &requests[..]);
            let slots = first..first + n;
            first += n;
            handles.push(
                std::thread::Builder::new()
                    .name(format!("load-{t}"))
                    .spawn_scoped(s, move || worker::run(shared, request, slots)),
            );
        }
        handles
            .into_iter()
            .map(|h| match h {
                Ok(h) => h.join().unwrap_or_else(|_| bail!("a load thread panicked")),
                Err(e) => Err(e.into()),
            })
            .collect::<Vec<_>>()
    });
    let mut report = LoadReport {
        requests: 0,
        elapsed: Duration::ZERO,
        rps: 0.0,
        bytes: 0,
        errors: Errors::default(),
        histogram: new_histogram(),
        samples: Vec::new(),
    };
    let mut end = shared.start;
    for r in results {
        let r = r?;
        report.requests += r.requests;
        report.bytes += r.bytes;
        report.errors.add(&r.errors);
        report
            .histogram
            .add(&r.histogram)
            .context("merging histograms")?;
        end = end.max(r.end);
        report.samples.extend(r.samples);
    }
    report.samples.sort_unstable();
    report.elapsed = end.saturating_duration_since(shared.start);
    let secs = report.elapsed.as_secs_f64();
    report.rps = if secs > 0.0 {
        report.requests as f64 / secs
    } else {
        0.0
    };
    Ok(report)
}

/// `shard-bench load`.
#[derive(clap::Args, Debug, Clone)]
pub struct LoadArgs {
    /// http://HOST:PORT/path (HOST: an IPv4 literal or localhost).
    url: String,
    /// Concurrent connections.
    #[arg(short = 'c', long, default_value_t = 10)]
    connections: usize,
    /// Threads (each runs its own epoll over its share of the connections).
    #[arg(short = 't', long, default_value_t = 2)]
    threads: usize,
    /// Seconds to run (at most 3600); default 10, or 3600 as a bound when -n is given.
    #[arg(short = 'd', long, value_parser = clap::value_parser!(u64).range(1..=3600))]
    duration: Option<u64>,
    /// Requests to make, then stop (at most 100000000).
    #[arg(short = 'n', long, value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    requests: Option<u64>,
    /// Open loop: this many requests per second in total, latency from the intended send
    /// time (coordinated-omission corrected).
    #[arg(short = 'R', long)]
    rate: Option<f64>,
    /// A new connection per request (sends `Connection: close`).
    #[arg(long)]
    close: bool,
    /// Seconds before a request (connect included) fails as a timeout.
    #[arg(long, default_value_t = 5.0)]
    timeout: f64,
    /// An extra request header, `Name: value` (repeatable).
    #[arg(short = 'H', long = "header")]
    headers: Vec<String>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

/// Runs `shard-bench load` and prints the report.
pub fn command(a: LoadArgs) -> Result<()> {
    let target = Target::parse(&a.url)?;
    ensure!(
        a.timeout.is_finite() && a.timeout > 0.0 && a.timeout <= 3600.0,
        "--timeout must be above 0 and at most 3600"
    );
    let spec = LoadSpec {
        target,
        connections: a.connections,
        threads: a.threads,
        duration: Duration::from_secs(match (a.duration, a.requests) {
            (Some(d), _) => d,
            (None, Some(_)) => MAX_DURATION.as_secs(),
            (None, None) => 10,
        }),
        requests: a.requests,
        close: a.close,
        rate: a.rate,
        record: false,
        paths: Vec::new(),
        timeout: Duration::from_secs_f64(a.timeout),
        headers: a
            .headers
            .iter()
            .map(|h| {
                h.split_once(':')
                    .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
                    .with_context(|| format!("-H {h:?}: expected `Name: value`"))
            })
            .collect::<Result<_>>()?,
    };
    crate::procfs::raise_nofile_limit();
    let report = run(&spec)?;
    if a.json {
        println!("{}", render_json(&spec, &report));
    } else {
        print!("{}", render_text(&spec, &report));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_urls() {
        let t = Target::parse("http://127.0.0.1:8080/ok?x=1").unwrap();
        assert_eq!(t.addr, "127.0.0.1:8080".parse().unwrap());
        assert_eq!(t.host, "127.0.0.1:8080");
        assert_eq!(t.path, "/ok?x=1");
        let t = Target::parse("http://localhost").unwrap();
        assert_eq!(t.addr, "127.0.0.1:80".parse().unwrap());
        assert_eq!(t.path, "/");
        assert_eq!(Target::parse("http://localhost:9?a").unwrap().path, "/?a");
        assert!(Target::parse("https://127.0.0.1/").is_err());
        assert!(Target::parse("http://example.com/").is_err());
        assert!(Target::parse("http://127.0.0.1:0/").is_err());
        assert!(Target::parse("http://127.0.0.1/a b").is_err());
    }

    #[test]
    fn checks_bounds() {
        let mut s = LoadSpec::new(Target::parse("http://127.0.0.1:1/").unwrap());
        assert!(s.check().is_ok());
        s.duration = Duration::from_secs(3601);
        assert!(s.check().is_err());
        s.duration = Duration::from_secs(1);
        s.requests = Some(MAX_REQUESTS + 1);
        assert!(s.check().is_err());
        s.requests = None;
        s.rate = Some(0.0);
        assert!(s.check().is_err());
    }
}
