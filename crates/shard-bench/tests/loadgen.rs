//! `shard-bench load` against tiny HTTP servers started inside the test: exact request counts,
//! error kinds, the JSON report, and coordinated-omission correction in the open loop.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How the test server answers.
#[derive(Clone)]
struct Behaviour {
    response: &'static [u8],
    /// Close after every response (the body is close-delimited or the client asked).
    close_after: bool,
    /// Sleep this long before answering request number `stall_at` (counted from 1).
    stall_at: u64,
    stall: Duration,
}

const OK: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nOK";

struct Server {
    port: u16,
    requests: Arc<AtomicU64>,
    connections: Arc<AtomicU64>,
}

fn serve(b: Behaviour) -> Server {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let requests = Arc::new(AtomicU64::new(0));
    let connections = Arc::new(AtomicU64::new(0));
    let (rq, cn) = (requests.clone(), connections.clone());
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(s) = s else { continue };
            cn.fetch_add(1, Ordering::Relaxed);
            let (b, rq) = (b.clone(), rq.clone());
            std::thread::spawn(move || answer(s, &b, &rq));
        }
    });
    Server {
        port,
        requests,
        connections,
    }
}

fn answer(mut s: TcpStream, b: &Behaviour, requests: &AtomicU64) {
    let mut buf = Vec::new();
    let mut tmp = [0u8; 4096];
    loop {
        let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
            match s.read(&mut tmp) {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&tmp[..n]),
            }
            continue;
        };
        let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
        buf.drain(..end + 4);
        let n = requests.fetch_add(1, Ordering::Relaxed) + 1;
        if n == b.stall_at {
            std::thread::sleep(b.stall);
        }
        if s.write_all(b.response).is_err() {
            return;
        }
        if b.close_after || head.contains("connection: close") {
            return;
        }
    }
}

fn ok_server() -> Server {
    serve(Behaviour {
        response: OK,
        close_after: false,
        stall_at: 0,
        stall: Duration::ZERO,
    })
}

/// Runs `shard-bench load` with `args` and `--json`; returns the parsed report.
fn load(url: &str, args: &[&str]) -> Json {
    let out = Command::new(env!("CARGO_BIN_EXE_shard-bench"))
        .arg("load")
        .arg(url)
        .args(args)
        .arg("--json")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    parse_json(text.trim()).unwrap_or_else(|e| panic!("{e}: {text}"))
}

fn url(port: u16) -> String {
    format!("http://127.0.0.1:{port}/ok")
}

#[test]
fn keep_alive_makes_exactly_n_requests() {
    let srv = ok_server();
    let r = load(&url(srv.port), &["-n", "200", "-c", "8", "-t", "2"]);
    assert_eq!(r.num("requests"), 200.0);
    assert_eq!(r.get("errors").num("total"), 0.0);
    assert_eq!(srv.requests.load(Ordering::Relaxed), 200);
    assert!(srv.connections.load(Ordering::Relaxed) <= 8);
    assert_eq!(r.num("bytes"), 200.0 * OK.len() as f64);
}

#[test]
fn close_makes_exactly_n_requests_on_n_connections() {
    let srv = ok_server();
    let r = load(&url(srv.port), &["-n", "200", "-c", "8", "--close"]);
    assert_eq!(r.num("requests"), 200.0);
    assert_eq!(r.get("errors").num("total"), 0.0);
    assert_eq!(srv.requests.load(Ordering::Relaxed), 200);
    assert_eq!(srv.connections.load(Ordering::Relaxed), 200);
}

#[test]
fn close_delimited_and_chunked_bodies_are_read() {
    let srv = serve(Behaviour {
        response: b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nuntil the end",
        close_after: true,
        stall_at: 0,
        stall: Duration::ZERO,
    });
    let r = load(&url(srv.port), &["-n", "50", "-c", "4"]);
    assert_eq!(r.num("requests"), 50.0);
    assert_eq!(r.get("errors").num("total"), 0.0);
    let srv = serve(Behaviour {
        response: b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nOK\r\n0\r\n\r\n",
        close_after: false,
        stall_at: 0,
        stall: Duration::ZERO,
    });
    let r = load(&url(srv.port), &["-n", "50", "-c", "4"]);
    assert_eq!(r.num("requests"), 50.0);
    assert_eq!(r.get("errors").num("total"), 0.0);
    assert!(srv.connections.load(Ordering::Relaxed) <= 4);
}

#[test]
fn status_500_counts_as_bad_status() {
    let srv = serve(Behaviour {
        response: b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\n\r\n",
        close_after: false,
        stall_at: 0,
        stall: Duration::ZERO,
    });
    let r = load(&url(srv.port), &["-n", "100", "-c", "4"]);
    let e = r.get("errors");
    assert_eq!(r.num("requests"), 100.0);
    assert_eq!(e.num("status"), 100.0);
    assert_eq!(e.num("total"), 100.0);
    assert_eq!(e.num("connect") + e.num("reset") + e.num("other"), 0.0);
}

#[test]
fn refused_port_counts_connect_errors() {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let r = load(&url(port), &["-n", "30", "-c", "3"]);
    let e = r.get("errors");
    assert_eq!(r.num("requests"), 0.0);
    assert_eq!(e.num("connect"), 30.0);
    assert_eq!(e.num("total"), 30.0);
}

#[test]
fn json_has_every_field() {
    let srv = ok_server();
    let r = load(&url(srv.port), &["-n", "20", "-c", "2"]);
    for k in [
        "url",
        "connections",
        "threads",
        "close",
        "rate",
        "requests",
        "duration_s",
        "rps",
        "bytes",
        "latency_us",
        "errors",
        "histogram",
    ] {
        assert!(r.obj().contains_key(k), "{k} missing");
    }
    let lat = r.get("latency_us");
    for k in ["min", "mean", "p50", "p90", "p99", "p99_9", "max", "stdev"] {
        assert!(lat.num(k) >= 0.0, "{k}");
    }
    assert!(lat.num("min") <= lat.num("p50") && lat.num("p50") <= lat.num("max"));
    for k in ["total", "connect", "reset", "timeout", "status", "other"] {
        assert_eq!(r.get("errors").num(k), 0.0, "{k}");
    }
    let Json::Arr(h) = r.get("histogram") else {
        panic!("histogram is not an array")
    };
    let sum: f64 = h.iter().map(|b| b.num("count")).sum();
    assert_eq!(sum, 20.0);
    assert!(r.num("rps") > 0.0);
}

#[test]
fn text_report_has_summary_and_histogram() {
    let srv = ok_server();
    let out = Command::new(env!("CARGO_BIN_EXE_shard-bench"))
        .args(["load", &url(srv.port), "-n", "100", "-c", "2"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("requests    100\n"), "{text}");
    assert!(text.contains("p99.9"), "{text}");
    assert!(text.contains(" value |---"), "{text}");
    let bars: u64 = text
        .lines()
        .filter(|l| l.contains(" |") && l.contains('*'))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum();
    assert_eq!(bars, 100, "{text}");
}

#[test]
fn bad_arguments_are_refused() {
    for args in [
        &["load", "http://127.0.0.1:1/", "-d", "3601"][..],
        &["load", "http://127.0.0.1:1/", "-n", "100000001"],
        &["load", "https://127.0.0.1:1/"],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_shard-bench"))
            .args(args)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?}");
    }
}

/// One connection at 200 req/s; the server stalls 300 ms once. Measured from the intended send
/// times, the requests that should have gone out during the stall are all late, not just the
/// one the server held.
#[test]
fn open_loop_shows_a_stall_in_many_requests() {
    let srv = serve(Behaviour {
        response: OK,
        close_after: false,
        stall_at: 20,
        stall: Duration::from_millis(300),
    });
    let r = load(&url(srv.port), &["-c", "1", "-R", "200", "-n", "150"]);
    assert_eq!(r.num("requests"), 150.0);
    let Json::Arr(h) = r.get("histogram") else {
        panic!("histogram is not an array")
    };
    // Requests of 32 ms or more: about 50 of the ~60 scheduled in the stall.
    let late: f64 = h
        .iter()
        .filter(|b| b.num("from_us") >= 32768.0)
        .map(|b| b.num("count"))
        .sum();
    assert!(late >= 20.0, "only {late} late requests");
    assert!(r.get("latency_us").num("max") >= 250_000.0);
    // The open loop keeps the rate: 150 requests at 200/s take about 0.75 s.
    assert!(r.num("duration_s") >= 0.7, "{}", r.num("duration_s"));
}

// A small JSON reader, enough for the report.

#[derive(Debug, Clone, PartialEq)]
enum Json {
    Null,
    Bool(bool),
    Num(f64),
    Str(String),
    Arr(Vec<Json>),
    Obj(BTreeMap<String, Json>),
}

impl Json {
    fn obj(&self) -> &BTreeMap<String, Json> {
        match self {
            Json::Obj(m) => m,
            other => panic!("not an object: {other:?}"),
        }
    }
    fn get(&self, k: &str) -> &Json {
        self.obj()
            .get(k)
            .unwrap_or_else(|| panic!("no {k} in {self:?}"))
    }
    fn num(&self, k: &str) -> f64 {
        match self.get(k) {
            Json::Num(n) => *n,
            other => panic!("{k} is not a number: {other:?}"),
        }
    }
}

fn parse_json(s: &str) -> Result<Json, String> {
    let b = s.as_bytes();
    let mut i = 0;
    let v = value(b, &mut i)?;
    ws(b, &mut i);
    if i != b.len() {
        return Err(format!("trailing bytes at {i}"));
    }
    Ok(v)
}

fn ws(b: &[u8], i: &mut usize) {
    while *i < b.len() && b[*i].is_ascii_whitespace() {
        *i += 1;
    }
}

fn expect(b: &[u8], i: &mut usize, c: u8) -> Result<(), String> {
    ws(b, i);
    if b.get(*i) == Some(&c) {
        *i += 1;
        Ok(())
    } else {
        Err(format!("expected {:?} at {i}", c as char))
    }
}

fn value(b: &[u8], i: &mut usize) -> Result<Json, String> {
    ws(b, i);
    match b.get(*i) {
        Some(b'{') => {
            *i += 1;
            let mut m = BTreeMap::new();
            ws(b, i);
            if b.get(*i) == Some(&b'}') {
                *i += 1;
                return Ok(Json::Obj(m));
            }
            loop {
                ws(b, i);
                let Json::Str(k) = value(b, i)? else {
                    return Err(format!("object key at {i}"));
                };
                expect(b, i, b':')?;
                m.insert(k, value(b, i)?);
                ws(b, i);
                match b.get(*i) {
                    Some(b',') => *i += 1,
                    Some(b'}') => {
                        *i += 1;
                        return Ok(Json::Obj(m));
                    }
                    _ => return Err(format!("object at {i}")),
                }
            }
        }
        Some(b'[') => {
            *i += 1;
            let mut v = Vec::new();
            ws(b, i);
            if b.get(*i) == Some(&b']') {
                *i += 1;
                return Ok(Json::Arr(v));
            }
            loop {
                v.push(value(b, i)?);
                ws(b, i);
                match b.get(*i) {
                    Some(b',') => *i += 1,
                    Some(b']') => {
                        *i += 1;
                        return Ok(Json::Arr(v));
                    }
                    _ => return Err(format!("array at {i}")),
                }
            }
        }
        Some(b'"') => {
            *i += 1;
            let mut s = String::new();
            loop {
                match b.get(*i) {
                    Some(b'"') => {
                        *i += 1;
                        return Ok(Json::Str(s));
                    }
                    Some(b'\\') => {
                        let c = b.get(*i + 1).ok_or("escape")?;
                        *i += 2;
                        match c {
                            b'"' => s.push('"'),
                            b'\\' => s.push('\\'),
                            b'/' => s.push('/'),
                            b'n' => s.push('\n'),
                            b't' => s.push('\t'),
                            b'r' => s.push('\r'),
                            b'u' => {
                                let hex = std::str::from_utf8(b.get(*i..*i + 4).ok_or("\\u")?)
                                    .map_err(|e| e.to_string())?;
                                let n = u32::from_str_radix(hex, 16).map_err(|e| e.to_string())?;
                                s.push(char::from_u32(n).ok_or("\\u")?);
                                *i += 4;
                            }
                            _ => return Err(format!("escape at {i}")),
                        }
                    }
                    Some(_) => {
                        let start = *i;
                        while *i < b.len() && b[*i] != b'"' && b[*i] != b'\\' {
                            *i += 1;
                        }
                        s.push_str(std::str::from_utf8(&b[start..*i]).map_err(|e| e.to_string())?);
                    }
                    None => return Err("unterminated string".into()),
                }
            }
        }
        Some(b't') if b[*i..].starts_with(b"true") => {
            *i += 4;
            Ok(Json::Bool(true))
        }
        Some(b'f') if b[*i..].starts_with(b"false") => {
            *i += 5;
            Ok(Json::Bool(false))
        }
        Some(b'n') if b[*i..].starts_with(b"null") => {
            *i += 4;
            Ok(Json::Null)
        }
        Some(c) if *c == b'-' || c.is_ascii_digit() => {
            let start = *i;
            while *i < b.len() && matches!(b[*i], b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9') {
                *i += 1;
            }
            std::str::from_utf8(&b[start..*i])
                .unwrap()
                .parse()
                .map(Json::Num)
                .map_err(|e| format!("number at {start}: {e}"))
        }
        _ => Err(format!("value at {i}")),
    }
}
