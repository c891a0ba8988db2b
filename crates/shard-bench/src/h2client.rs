//! A closed-loop HTTP/2 load of a few long-lived connections of unequal weight (E7), on
//! shard_http's frames and HPACK.
//!
//! Each client is a thread that sends its requests at a fixed rate (open loop: `weight`
//! times `unit_rate` per second, each request's latency counted from when it was due, so a
//! server that falls behind cannot slow the clients down and hide it) on one h2c
//! connection, as an API client or a browser does, and reconnects when the server sends
//! `GOAWAY` (as every real client does; `h2load` does not, which is why this exists). A
//! request above the `GOAWAY`'s last stream id, or refused, was not processed: it is sent
//! again on the next connection, its latency still counted from when it was first due. Every response names the worker
//! that served it (`add_header X-Pid $pid`), so the report says where each client's load went.
//!
//! It owns the clients and their counts; it judges nothing.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use hdrhistogram::Histogram;
use shard_http::h2frame::{self, Frame, Reader};
use shard_http::hpack;

/// Each client's weight, from the worker pid each is on.
pub type Assign = Box<dyn Fn(&[u32]) -> Vec<usize> + Send + Sync>;

/// What one run does.
pub struct Spec {
    pub addr: SocketAddr,
    pub path: String,
    /// Each client's rate in `unit_rate`s, decided once every client has connected and
    /// learnt which worker it is on (`assign(pids)`, one pid per client).
    pub assign: Assign,
    /// Requests per second of a weight of 1.
    pub unit_rate: f64,
    pub clients: usize,
    pub duration: Duration,
}

/// What one client did.
#[derive(Debug, Clone, Default)]
pub struct ClientReport {
    pub weight: usize,
    /// Requests answered per worker pid, in the order the worker first answered.
    pub served_by: Vec<(u32, u64)>,
    /// Connections after the first (each after a `GOAWAY` or a close).
    pub reconnects: u64,
    /// Requests sent again on a new connection (not processed by the first).
    pub retried: u64,
}

/// What the run did.
pub struct Report {
    pub requests: u64,
    pub errors: u64,
    /// Latency of every answered request, microseconds.
    pub histogram: Histogram<u64>,
    pub elapsed: Duration,
    pub clients: Vec<ClientReport>,
}

/// A read waits at most this long, so that a client sees its deadline.
const READ_TICK: Duration = Duration::from_millis(100);
/// After the deadline, how long a client waits for the answers still due.
const DRAIN: Duration = Duration::from_secs(3);
/// The most requests a client has in flight; more that are due wait (their latency grows).
const INFLIGHT_MAX: usize = 100;
/// The shortest read timeout (a zero one would block).
const READ_MIN: Duration = Duration::from_micros(50);

/// Runs the clients; every one connects first, then all start at once.
pub fn run(spec: Spec) -> Result<Report> {
    let spec = Arc::new(spec);
    let pids = Arc::new(Mutex::new(vec![0u32; spec.clients]));
    let weights = Arc::new(Mutex::new(Vec::new()));
    let probed = Arc::new(Barrier::new(spec.clients + 1));
    let assigned = Arc::new(Barrier::new(spec.clients + 1));
    let mut threads = Vec::new();
    for i in 0..spec.clients {
        let (spec, pids, weights) = (spec.clone(), pids.clone(), weights.clone());
        let (probed, assigned) = (probed.clone(), assigned.clone());
        threads.push(std::thread::spawn(move || {
            client(i, &spec, &pids, &weights, &probed, &assigned)
        }));
    }
    probed.wait();
    let w = (spec.assign)(&pids.lock().unwrap());
    anyhow::ensure!(w.len() == spec.clients, "one weight per client");
    *weights.lock().unwrap() = w;
    let t0 = Instant::now();
    assigned.wait();
    let mut report = Report {
        requests: 0,
        errors: 0,
        histogram: Histogram::new_with_bounds(1, crate::loadgen::MAX_LATENCY_US, 3)?,
        elapsed: Duration::ZERO,
        clients: Vec::new(),
    };
    for t in threads {
        let (c, h, errors) = t
            .join()
            .map_err(|_| anyhow::anyhow!("an HTTP/2 client panicked"))??;
        report.requests += h.len();
        report.errors += errors;
        report.histogram.add(&h)?;
        report.clients.push(c);
    }
    report.elapsed = t0.elapsed();
    Ok(report)
}

type ClientOut = (ClientReport, Histogram<u64>, u64);

fn client(
    i: usize,
    spec: &Spec,
    pids: &Mutex<Vec<u32>>,
    weights: &Mutex<Vec<usize>>,
    probed: &Barrier,
    assigned: &Barrier,
) -> Result<ClientOut> {
    let mut rep = ClientReport::default();
    let mut hist = Histogram::<u64>::new_with_bounds(1, crate::loadgen::MAX_LATENCY_US, 3)?;
    let mut errors = 0u64;
    // The probe: one request, so that the assignment knows this client's worker. A failure
    // still meets the barriers (the others must not wait for ever).
    let first = Conn::open(spec.addr).and_then(|mut c| {
        c.send(&spec.path, Instant::now())?;
        let mut done = Vec::new();
        while done.is_empty() {
            c.turn(READ_TICK, &mut done)?;
        }
        Ok((c, done))
    });
    let mut conn = match first {
        Ok((c, done)) => {
            if let Some(a) = done.first() {
                pids.lock().unwrap()[i] = a.pid;
            }
            Some(c)
        }
        Err(_) => None,
    };
    probed.wait();
    assigned.wait();
    rep.weight = weights.lock().unwrap()[i];
    let mut conn = conn.take().context("the probe request failed")?;
    let start = Instant::now();
    let deadline = start + spec.duration;
    let interval = Duration::from_secs_f64(1.0 / (rep.weight.max(1) as f64 * spec.unit_rate));
    let mut next_due = start;
    // When each request to send was due, oldest first (those sent again after a GOAWAY
    // first of all).
    let mut pending: std::collections::VecDeque<Instant> = Default::default();
    loop {
        let now = Instant::now();
        let sending = now < deadline;
        if !sending && (conn.inflight.is_empty() || now > deadline + DRAIN) {
            break;
        }
        while sending && rep.weight > 0 && next_due <= now {
            pending.push_back(next_due);
            next_due += interval;
        }
        while conn.goaway.is_none() && conn.inflight.len() < INFLIGHT_MAX {
            let Some(due) = pending.pop_front() else {
                break;
            };
            if conn.send(&spec.path, due).is_err() {
                pending.push_front(due);
                break;
            }
        }
        let wait = if sending {
            next_due.saturating_duration_since(Instant::now())
        } else {
            READ_TICK
        };
        let mut done = Vec::new();
        let res = conn.turn(wait.clamp(READ_MIN, READ_TICK), &mut done);
        for a in done {
            if a.status == 200 {
                let us = a.started.elapsed().as_micros().max(1) as u64;
                hist.record(us.min(hist.high()))?;
                match rep.served_by.iter_mut().find(|s| s.0 == a.pid) {
                    Some(s) => s.1 += 1,
                    None => rep.served_by.push((a.pid, 1)),
                }
            } else {
                errors += 1;
            }
        }
        let ended = res.is_err();
        let mut retry = std::mem::take(&mut conn.retry);
        rep.retried += retry.len() as u64;
        retry.sort();
        for due in retry.into_iter().rev() {
            pending.push_front(due);
        }
        let drained = conn.goaway.is_some() && conn.inflight.is_empty();
        if ended || drained {
            // Requests the server took and never answered are lost.
            errors += conn.inflight.len() as u64;
            if !sending {
                break;
            }
            match Conn::open(spec.addr) {
                Ok(c) => {
                    conn = c;
                    rep.reconnects += 1;
                }
                Err(_) => {
                    errors += pending.len() as u64;
                    pending.clear();
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
        }
    }
    // Due and never sent (the server fell that far behind): failures too.
    errors += pending.len() as u64;
    Ok((rep, hist, errors))
}

/// An answered request.
struct Answer {
    started: Instant,
    status: u16,
    pid: u32,
}

/// One HTTP/2 connection of a client.
struct Conn {
    s: TcpStream,
    next_id: u32,
    input: Vec<u8>,
    reader: Reader,
    decoder: hpack::Decoder,
    /// Streams in flight: their start, and the status and pid once their HEADERS came.
    inflight: HashMap<u32, (Instant, u16, u32)>,
    goaway: Option<u32>,
    /// Requests not processed (above the GOAWAY's last id, or refused): to send again.
    retry: Vec<Instant>,
}

impl Conn {
    fn open(addr: SocketAddr) -> std::io::Result<Conn> {
        let mut s = TcpStream::connect(addr)?;
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(READ_TICK))?;
        let mut hello = h2frame::PREFACE.to_vec();
        h2frame::push_settings(&mut hello, &[]);
        h2frame::push_window_update(&mut hello, 0, 1 << 30);
        s.write_all(&hello)?;
        Ok(Conn {
            s,
            next_id: 1,
            input: Vec::new(),
            reader: Reader::new(1 << 24, 1 << 20),
            decoder: hpack::Decoder::new(4096),
            inflight: HashMap::new(),
            goaway: None,
            retry: Vec::new(),
        })
    }

    fn send(&mut self, path: &str, started: Instant) -> std::io::Result<()> {
        let e = hpack::Encoder;
        let mut block = Vec::new();
        e.field(b":method", b"GET", &mut block);
        e.field(b":scheme", b"http", &mut block);
        e.field(b":path", path.as_bytes(), &mut block);
        e.field(b":authority", b"localhost", &mut block);
        let mut out = Vec::new();
        h2frame::push_headers(
            &mut out,
            self.next_id,
            &block,
            true,
            h2frame::DEFAULT_MAX_FRAME,
        );
        self.s.write_all(&out)?;
        self.inflight.insert(self.next_id, (started, 0, 0));
        self.next_id += 2;
        Ok(())
    }

    /// Reads once (waiting at most `wait`) and handles every whole frame: answers go to
    /// `done`. An error: the connection is over.
    fn turn(&mut self, wait: Duration, done: &mut Vec<Answer>) -> std::io::Result<()> {
        self.s.set_read_timeout(Some(wait))?;
        let mut b = [0u8; 65536];
        match self.s.read(&mut b) {
            Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => self.input.extend_from_slice(&b[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(e) => return Err(e),
        }
        let mut used_total = 0;
        let mut replies = Vec::new();
        loop {
            let (frame, used) = match self.reader.next(&self.input[used_total..]) {
                Ok(Some(f)) => f,
                Ok(None) => break,
                Err(e) => {
                    return Err(std::io::Error::other(format!("frame error {e:?}")));
                }
            };
            used_total += used;
            match frame {
                Frame::Settings { ack: false, .. } => h2frame::push_settings_ack(&mut replies),
                Frame::Ping { ack: false, data } => h2frame::push_ping_ack(&mut replies, &data),
                Frame::GoAway { last_stream, .. } => {
                    self.goaway = Some(last_stream);
                    let above: Vec<u32> = self
                        .inflight
                        .keys()
                        .copied()
                        .filter(|&id| id > last_stream)
                        .collect();
                    for id in above {
                        if let Some((started, ..)) = self.inflight.remove(&id) {
                            self.retry.push(started);
                        }
                    }
                }
                Frame::Headers {
                    stream,
                    block,
                    end_stream,
                } => {
                    let (mut status, mut pid) = (0u16, 0u32);
                    self.decoder
                        .decode(block, 1 << 20, |n, v| {
                            let text = std::str::from_utf8(v).unwrap_or("");
                            if n == b":status" {
                                status = text.parse().unwrap_or(0);
                            } else if n == b"x-pid" {
                                pid = text.parse().unwrap_or(0);
                            }
                        })
                        .map_err(|e| std::io::Error::other(format!("hpack {e:?}")))?;
                    if let Some(f) = self.inflight.get_mut(&stream) {
                        f.1 = status;
                        f.2 = pid;
                    }
                    if end_stream {
                        finish(&mut self.inflight, done, stream);
                    }
                }
                Frame::Data {
                    stream,
                    end_stream,
                    flow_len,
                    ..
                } => {
                    if !end_stream && flow_len > 0 {
                        h2frame::push_window_update(&mut replies, stream, flow_len as u32);
                    }
                    if end_stream {
                        finish(&mut self.inflight, done, stream);
                    }
                }
                Frame::RstStream { stream, code } => {
                    if let Some((started, ..)) = self.inflight.remove(&stream) {
                        if code == h2frame::code::REFUSED_STREAM {
                            self.retry.push(started);
                        } else {
                            done.push(Answer {
                                started,
                                status: 0,
                                pid: 0,
                            });
                        }
                    }
                }
                _ => {}
            }
        }
        self.input.drain(..used_total);
        if !replies.is_empty() {
            self.s.write_all(&replies)?;
        }
        Ok(())
    }
}

/// Stream `id` ended: its answer, if it was in flight.
fn finish(inflight: &mut HashMap<u32, (Instant, u16, u32)>, done: &mut Vec<Answer>, id: u32) {
    if let Some((started, status, pid)) = inflight.remove(&id) {
        done.push(Answer {
            started,
            status,
            pid,
        });
    }
}
