//! Experiment E8 (`shard-bench experiment e8`): QUIC connections through reloads, a stalled
//! worker and clients that change their port, with shard's steering by connection ID and
//! with the kernel's hash (`SHARD_TEST_NO_EBPF`, nginx's situation without a `quic_bpf` that
//! keeps connections across reloads).
//!
//! The load is this process's own QUIC client: `quinn-proto` (the same sans-I/O QUIC as the
//! server, driven by one thread and `poll(2)`), HTTP/3 frames and QPACK from `shard_http::h3`.
//! Open loop: a new connection every `1 / rate` seconds, each with its own UDP socket; a
//! connection sends a `GET /ok` every 100 ms for 3 seconds, then closes. A request unanswered
//! for 3 s fails its connection (hung); a connection the server closes or resets fails.
//! "Time to first byte" is per request, from its HEADERS sent to the response's HEADERS.
//!
//! Scenarios, each on a fresh server with two workers: `base` (nothing happens), `reloads`
//! (a `SIGHUP` every second, ten of them), `stall` (worker 0 `SIGSTOP`ped for 5 s: the rate
//! of first requests served for connections that arrive during the stall, against the rate
//! before it), `rebind` (every connection moves to a new local port every second, as a NAT
//! rebinding does), `upgrade` (a binary upgrade: `USR2`, then `WINCH` and `QUIT` to the old
//! master two seconds later).

use std::collections::HashMap;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use quinn_proto as qp;
use shard_http::h3;

use crate::servers::{self, Kind, Spec};

/// One connection's life: requests this far apart, for this long.
const REQUEST_EVERY: Duration = Duration::from_millis(100);
const CONN_LIFETIME: Duration = Duration::from_secs(3);
/// A request unanswered this long fails its connection.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(3);
/// Time series bins.
pub const BIN_MS: u64 = 250;

#[derive(Debug, Default, Clone)]
pub struct Outcome {
    pub scenario: String,
    pub steering: bool,
    pub started: u64,
    pub completed: u64,
    /// Lost (closed or reset by the server, or no handshake) and hung (a request unanswered).
    pub failed: u64,
    pub hung: u64,
    /// Connections the server sent GOAWAY and closed cleanly once their request was
    /// answered (a reload): the client went on on a new connection, as browsers do.
    pub goaway: u64,
    /// Requests refused after a GOAWAY (`H3_REQUEST_REJECTED`), or in flight when the
    /// server closed cleanly: sent again on the new connection, as RFC 9114 allows.
    pub rejected: u64,
    pub requests: u64,
    pub ttfb: Vec<u64>,
    /// Requests answered per bin.
    pub timeline: Vec<u64>,
    /// `stall`: first requests served per second for connections opened before the stall and
    /// during it (the window's start and end in bins, for the chart's shade).
    pub before_rate: f64,
    pub during_rate: f64,
    pub shade: Option<(f64, f64)>,
    pub strays: u64,
    pub first_errors: Vec<String>,
}

impl Outcome {
    pub fn quantile_ms(&self, q: f64) -> f64 {
        if self.ttfb.is_empty() {
            return 0.0;
        }
        let mut v = self.ttfb.clone();
        v.sort_unstable();
        let i = ((v.len() as f64 * q).ceil() as usize).clamp(1, v.len()) - 1;
        v[i] as f64 / 1000.0
    }

    /// Log2 buckets of the time to first byte (microseconds).
    pub fn log2_us(&self) -> Vec<u64> {
        let mut b = Vec::new();
        for &us in &self.ttfb {
            let i = 63 - us.max(1).leading_zeros() as usize;
            if b.len() <= i {
                b.resize(i + 1, 0);
            }
            b[i] += 1;
        }
        b
    }
}

/// The client's TLS: ALPN `h3`, any certificate (the bench's own self-signed one).
#[derive(Debug)]
struct AnyCert(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AnyCert {
    fn verify_server_cert(
        &self,
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &[rustls::pki_types::CertificateDer<'_>],
        _: &rustls::pki_types::ServerName<'_>,
        _: &[u8],
        _: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        _: &[u8],
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        Ok(rustls::client::danger::HandshakeSignatureValid::assertion())
    }

    fn verify_tls13_signature(
        &self,
        _: &[u8],
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        Ok(rustls::client::danger::HandshakeSignatureValid::assertion())
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

fn client_config() -> Result<qp::ClientConfig> {
    let prov = Arc::new(rustls::crypto::ring::default_provider());
    let mut tls = rustls::ClientConfig::builder_with_provider(prov.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyCert(prov)))
        .with_no_client_auth();
    tls.alpn_protocols = vec![b"h3".to_vec()];
    let q = qp::crypto::rustls::QuicClientConfig::try_from(tls)?;
    Ok(qp::ClientConfig::new(Arc::new(q)))
}

/// Something the run does at a time since its start (a signal to the server).
type Event<'a> = (Duration, Box<dyn FnMut() + 'a>);

/// One client connection.
struct Conn {
    handle: qp::ConnectionHandle,
    conn: qp::Connection,
    sock: UdpSocket,
    started: Instant,
    connected: bool,
    /// The request in flight: its stream, when it was sent, whether its HEADERS came.
    in_flight: Option<(qp::StreamId, Instant, bool)>,
    input: Vec<u8>,
    next_request: Instant,
    next_rebind: Option<Instant>,
    requests: u64,
    /// The first request's answer came (for the stall's rate).
    first_done: bool,
    ended: bool,
    /// When its requests stop (a replacement after a GOAWAY keeps its predecessor's).
    deadline: Instant,
    /// The server sent GOAWAY: no new request; a clean close is no failure.
    goaway: bool,
    /// The server's unidirectional streams, read for GOAWAY.
    uni: HashMap<qp::StreamId, Vec<u8>>,
}

/// The load of one scenario, driven until `until`, then until every connection ended.
struct Load {
    ep: qp::Endpoint,
    cfg: qp::ClientConfig,
    server: SocketAddr,
    conns: Vec<Conn>,
    by_handle: HashMap<qp::ConnectionHandle, usize>,
    rebind: bool,
    t0: Instant,
    out: Outcome,
    /// When each connection started, and when its first request was answered (ms since t0).
    firsts: Vec<(u64, Option<u64>)>,
    buf: Vec<u8>,
    /// Connections to open again (after a GOAWAY), with their deadlines.
    reopen: Vec<Instant>,
    /// A connection's life, and the pause between its requests.
    lifetime: Duration,
    every: Duration,
}

impl Load {
    fn new(server: SocketAddr, rebind: bool) -> Result<Load> {
        Ok(Load {
            ep: qp::Endpoint::new(Arc::new(qp::EndpointConfig::default()), None, false, None),
            cfg: client_config()?,
            server,
            conns: Vec::new(),
            by_handle: HashMap::new(),
            rebind,
            t0: Instant::now(),
            out: Outcome::default(),
            firsts: Vec::new(),
            buf: Vec::with_capacity(65_536),
            reopen: Vec::new(),
            lifetime: CONN_LIFETIME,
            every: REQUEST_EVERY,
        })
    }

    fn error(&mut self, e: String) {
        if self.out.first_errors.len() < 5 {
            self.out.first_errors.push(e);
        }
    }

    fn open(&mut self, now: Instant) -> Result<()> {
        self.open_until(now, now + self.lifetime, true)
    }

    /// A connection whose requests stop at `deadline`; `arrival`: a new client (counted),
    /// not one going on after a GOAWAY.
    fn open_until(&mut self, now: Instant, deadline: Instant, arrival: bool) -> Result<()> {
        let (handle, conn) = self
            .ep
            .connect(now, self.cfg.clone(), self.server, "localhost")
            .context("connect")?;
        let sock = UdpSocket::bind("127.0.0.1:0")?;
        sock.set_nonblocking(true)?;
        let i = self.conns.len();
        self.conns.push(Conn {
            handle,
            conn,
            sock,
            started: now,
            connected: false,
            in_flight: None,
            input: Vec::new(),
            next_request: now,
            next_rebind: self.rebind.then(|| now + Duration::from_secs(1)),
            requests: 0,
            first_done: !arrival,
            ended: false,
            deadline,
            goaway: false,
            uni: HashMap::new(),
        });
        self.by_handle.insert(handle, i);
        self.firsts
            .push((now.duration_since(self.t0).as_millis() as u64, None));
        if arrival {
            self.out.started += 1;
        }
        Ok(())
    }

    fn end(&mut self, i: usize, ok: bool, why: &str) {
        let c = &mut self.conns[i];
        if c.ended {
            return;
        }
        c.ended = true;
        c.conn.close(
            Instant::now(),
            qp::VarInt::from_u32(0x100),
            bytes::Bytes::new(),
        );
        if ok {
            self.out.completed += 1;
        } else {
            if why.starts_with("hung") {
                self.out.hung += 1;
            } else {
                self.out.failed += 1;
            }
            let e = format!("connection {i}: {why}");
            self.error(e);
        }
    }

    /// Moves connection `i`: its events, its request, its datagrams out.
    fn step(&mut self, i: usize, now: Instant) {
        // Endpoint events both ways.
        while let Some(ev) = self.conns[i].conn.poll_endpoint_events() {
            let h = self.conns[i].handle;
            if let Some(back) = self.ep.handle_event(h, ev) {
                self.conns[i].conn.handle_event(back);
            }
        }
        while let Some(ev) = self.conns[i].conn.poll() {
            match ev {
                qp::Event::Connected => {
                    let c = &mut self.conns[i];
                    c.connected = true;
                    if let Some(id) = c.conn.streams().open(qp::Dir::Uni) {
                        let _ = c
                            .conn
                            .send_stream(id)
                            .write(&h3::control_stream_start(65_536));
                    }
                }
                qp::Event::ConnectionLost { reason } => {
                    let c = &self.conns[i];
                    if c.ended {
                        continue;
                    }
                    let clean = matches!(&reason,
                        qp::ConnectionError::ApplicationClosed(a) if a.error_code == qp::VarInt::from_u32(0x100));
                    if clean {
                        // A graceful end (a reload; `H3_NO_ERROR`, a GOAWAY before it or
                        // crossing it): go on on a new connection, where a request that
                        // was in flight is sent again (the server did not take it).
                        if c.in_flight.is_some() {
                            self.out.rejected += 1;
                        }
                        self.conns[i].ended = true;
                        self.out.goaway += 1;
                        let deadline = self.conns[i].deadline;
                        if now < deadline {
                            self.reopen.push(deadline);
                        } else {
                            self.out.completed += 1;
                        }
                    } else {
                        self.end(i, false, &format!("lost: {reason}"));
                    }
                }
                qp::Event::Stream(qp::StreamEvent::Readable { id }) => self.read(i, id, now),
                qp::Event::Stream(qp::StreamEvent::Opened { dir: qp::Dir::Uni }) => {
                    // The server's control and QPACK streams: read and dropped.
                    while let Some(id) = self.conns[i].conn.streams().accept(qp::Dir::Uni) {
                        self.drain_uni(i, id);
                    }
                }
                _ => {}
            }
        }
        let c = &mut self.conns[i];
        if c.connected && !c.ended {
            if let Some((_, sent, _)) = c.in_flight {
                if now.duration_since(sent) > REQUEST_TIMEOUT {
                    self.end(i, false, "hung: a request unanswered for 3 s");
                }
            } else if now >= c.deadline {
                self.end(i, true, "");
            } else if now >= c.next_request && !c.goaway {
                if let Some(id) = c.conn.streams().open(qp::Dir::Bi) {
                    let e = h3::Encoder;
                    let mut block = Vec::new();
                    e.start(&mut block);
                    e.field(b":method", b"GET", &mut block);
                    e.field(b":scheme", b"https", &mut block);
                    e.field(b":authority", b"localhost", &mut block);
                    e.field(b":path", b"/ok", &mut block);
                    let mut f = Vec::new();
                    h3::push_frame_head(&mut f, h3::frame::HEADERS, block.len());
                    f.extend_from_slice(&block);
                    let mut s = c.conn.send_stream(id);
                    let _ = s.write(&f);
                    let _ = s.finish();
                    c.in_flight = Some((id, now, false));
                    c.input.clear();
                }
            }
        }
        let c = &mut self.conns[i];
        if !c.ended && !c.connected && now.duration_since(c.started) > REQUEST_TIMEOUT {
            self.end(i, false, "hung: no handshake in 3 s");
        }
        let c = &mut self.conns[i];
        if let Some(at) = c.next_rebind.filter(|&t| now >= t) {
            // A NAT rebinding: the same connection from a new port.
            if let Ok(s) = UdpSocket::bind("127.0.0.1:0") {
                let _ = s.set_nonblocking(true);
                c.sock = s;
            }
            c.next_rebind = Some(at + Duration::from_secs(1));
        }
        loop {
            self.buf.clear();
            let Some(t) = c.conn.poll_transmit(now, 1, &mut self.buf) else {
                break;
            };
            let _ = c.sock.send_to(&self.buf[..t.size], t.destination);
        }
    }

    /// Reads a server's unidirectional stream; on its control stream, a GOAWAY.
    fn drain_uni(&mut self, i: usize, id: qp::StreamId) {
        let c = &mut self.conns[i];
        let buf = c.uni.entry(id).or_default();
        if let Ok(mut chunks) = c.conn.recv_stream(id).read(true) {
            while let Ok(Some(ch)) = chunks.next(usize::MAX) {
                if buf.len() < 4096 {
                    buf.extend_from_slice(&ch.bytes);
                }
            }
            let _ = chunks.finalize();
        }
        let Some((ty, n)) = h3::read_varint(buf) else {
            return;
        };
        if ty != h3::stream_type::CONTROL {
            buf.clear();
            return;
        }
        let mut at = n;
        while let Some(h) = h3::frame_head(&buf[at..]) {
            if h.ty == h3::frame::GOAWAY {
                c.goaway = true;
            }
            at += h.head_len + h.len as usize;
            if at > buf.len() {
                break;
            }
        }
    }

    fn read(&mut self, i: usize, id: qp::StreamId, now: Instant) {
        let t0 = self.t0;
        let c = &mut self.conns[i];
        if c.in_flight.is_none_or(|f| f.0 != id) {
            self.drain_uni(i, id);
            return;
        }
        let mut fin = false;
        let mut rejected = false;
        if let Ok(mut chunks) = c.conn.recv_stream(id).read(true) {
            loop {
                match chunks.next(usize::MAX) {
                    Ok(Some(ch)) => c.input.extend_from_slice(&ch.bytes),
                    Ok(None) => {
                        fin = true;
                        break;
                    }
                    Err(qp::ReadError::Reset(code)) => {
                        rejected = code == qp::VarInt::from_u32(0x10b);
                        break;
                    }
                    Err(_) => break,
                }
            }
            let _ = chunks.finalize();
        }
        if rejected {
            // Refused after a GOAWAY: sent again on the next connection.
            c.in_flight = None;
            c.goaway = true;
            self.out.rejected += 1;
            return;
        }
        let (_, sent, seen) = c.in_flight.expect("checked");
        if !seen && h3::frame_head(&c.input).is_some_and(|h| h.ty == h3::frame::HEADERS) {
            let us = now.duration_since(sent).as_micros() as u64;
            self.out.ttfb.push(us);
            c.in_flight = Some((id, sent, true));
        }
        if fin {
            c.in_flight = None;
            c.requests += 1;
            c.next_request = now + self.every;
            self.out.requests += 1;
            let bin = (now.duration_since(t0).as_millis() as u64 / BIN_MS) as usize;
            if self.out.timeline.len() <= bin {
                self.out.timeline.resize(bin + 1, 0);
            }
            self.out.timeline[bin] += 1;
            if !c.first_done {
                c.first_done = true;
                self.firsts[i].1 = Some(now.duration_since(t0).as_millis() as u64);
            }
        }
    }

    /// Reads every socket that has datagrams.
    fn receive(&mut self, now: Instant) {
        let mut dgram = [0u8; 65_536];
        let mut touched = Vec::new();
        for i in 0..self.conns.len() {
            if self.conns[i].ended && self.conns[i].conn.is_drained() {
                continue;
            }
            while let Ok((n, from)) = self.conns[i].sock.recv_from(&mut dgram) {
                let mut resp = Vec::new();
                match self
                    .ep
                    .handle(now, from, None, None, dgram[..n].into(), &mut resp)
                {
                    Some(qp::DatagramEvent::ConnectionEvent(h, ev)) => {
                        if let Some(&k) = self.by_handle.get(&h) {
                            self.conns[k].conn.handle_event(ev);
                            touched.push(k);
                        }
                    }
                    Some(qp::DatagramEvent::Response(t)) => {
                        let _ = self.conns[i].sock.send_to(&resp[..t.size], t.destination);
                    }
                    _ => {}
                }
            }
        }
        for k in touched {
            self.step(k, now);
        }
    }

    /// Runs: a new connection every `1/rate` s until `until`; `events` at their times
    /// (since the start) with what they do; then until every connection ended.
    fn run(&mut self, rate: f64, until: Duration, events: &mut [Event<'_>]) -> Result<()> {
        self.run_max(rate, until, events, usize::MAX, |_| false)
    }

    /// `run`, opening at most `max_conns` connections, and stopping early once `done` says
    /// so (its connections are then left as they are).
    fn run_max(
        &mut self,
        rate: f64,
        until: Duration,
        events: &mut [Event<'_>],
        max_conns: usize,
        done: impl Fn(&Load) -> bool,
    ) -> Result<()> {
        self.t0 = Instant::now();
        let gap = Duration::from_secs_f64(1.0 / rate);
        let mut next_open = self.t0;
        let mut next_event = 0;
        let hard_stop = until + self.lifetime + REQUEST_TIMEOUT + Duration::from_secs(3);
        loop {
            let now = Instant::now();
            let t = now.duration_since(self.t0);
            while next_event < events.len() && t >= events[next_event].0 {
                (events[next_event].1)();
                next_event += 1;
            }
            while t < until && now >= next_open && self.conns.len() < max_conns {
                self.open(now)?;
                next_open += gap;
            }
            for deadline in std::mem::take(&mut self.reopen) {
                self.open_until(now, deadline, false)?;
            }
            // Timers.
            for i in 0..self.conns.len() {
                let c = &mut self.conns[i];
                if c.conn.is_drained() {
                    continue;
                }
                if c.conn.poll_timeout().is_some_and(|at| at <= now) {
                    c.conn.handle_timeout(now);
                }
                self.step(i, now);
            }
            self.receive(now);
            if done(self) {
                break;
            }
            let live = self.conns.iter().any(|c| !c.ended);
            if (t >= until && !live) || t > hard_stop {
                for i in 0..self.conns.len() {
                    if !self.conns[i].ended {
                        self.end(i, false, "hung: still open at the end");
                    }
                }
                break;
            }
            // Wait for a datagram on any socket, at most 2 ms.
            let mut fds: Vec<libc::pollfd> = self
                .conns
                .iter()
                .filter(|c| !c.conn.is_drained())
                .map(|c| libc::pollfd {
                    fd: c.sock.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                })
                .collect();
            // SAFETY: a valid array of pollfd for its length.
            unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 2) };
        }
        Ok(())
    }
}

/// `GET /status` on the server's TCP port: the pid of worker `idx` and the workers' total of
/// `key`.
fn status(port: u16) -> String {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return String::new();
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    let _ = s.write_all(b"GET /status HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

fn sum_field(body: &str, key: &str) -> u64 {
    let pat = format!("\"{key}\":");
    body.match_indices(&pat)
        .filter_map(|(i, _)| {
            body[i + pat.len()..]
                .split(|c: char| !c.is_ascii_digit())
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

fn worker_pid(port: u16, idx: usize) -> Option<i32> {
    let body = status(port);
    let at = body.find(&format!("{{\"idx\":{idx},\"pid\":"))?;
    let rest = &body[at..];
    let p = rest.split("\"pid\":").nth(1)?;
    p.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
}

/// One scenario on a fresh server.
fn scenario(shard: &Path, name: &str, steering: bool, rate: f64, smoke: bool) -> Result<Outcome> {
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_string()])?;
    let certs = std::env::temp_dir().join(format!("shard-bench-e8-{}", std::process::id()));
    std::fs::create_dir_all(&certs)?;
    let (crt, key) = (certs.join("cert.pem"), certs.join("key.pem"));
    std::fs::write(&crt, cert.cert.pem())?;
    std::fs::write(&key, cert.key_pair.serialize_pem())?;
    let spec = Spec {
        workers: 2,
        listen_opts: "reuseport".into(),
        http_extra: format!(
            "server {{\n listen 127.0.0.1:{{port}} quic reuseport;\n \
             ssl_certificate {};\n ssl_certificate_key {};\n \
             location = /ok {{ return 200 \"OK\"; }}\n }}",
            crt.display(),
            key.display()
        ),
        tag: format!("e8-{name}"),
        ..Spec::default()
    };
    let prepare = |_: &Path| -> Result<()> { Ok(()) };
    // The kernel's hash: the master reads this at start (its children inherit it).
    if !steering {
        std::env::set_var("SHARD_TEST_NO_EBPF", "1");
    }
    let run = servers::start_with(&Kind::Shard(shard.to_path_buf()), &spec, prepare);
    std::env::remove_var("SHARD_TEST_NO_EBPF");
    let run = run?;
    let port = run.port;
    let master = run.master_pid();
    let until = if smoke {
        Duration::from_secs(2)
    } else {
        Duration::from_secs(12)
    };
    let mut load = Load::new(SocketAddr::from(([127, 0, 0, 1], port)), name == "rebind")?;
    let mut events: Vec<Event<'_>> = Vec::new();
    let (stall_from, stall_for) = if smoke {
        (Duration::from_millis(500), Duration::from_secs(1))
    } else {
        (Duration::from_secs(4), Duration::from_secs(5))
    };
    let stopped = std::cell::Cell::new(0i32);
    match name {
        "reloads" => {
            let n = if smoke { 1 } else { 10 };
            for k in 0..n {
                events.push((
                    Duration::from_secs(1 + k),
                    Box::new(move || unsafe {
                        libc::kill(master, libc::SIGHUP);
                    }),
                ));
            }
        }
        "upgrade" => {
            // USR2; the old master's workers stop (WINCH) and it quits once the new master
            // runs its own (it starts in well under a second here).
            let (at, then) = if smoke {
                (Duration::from_millis(500), Duration::from_millis(1500))
            } else {
                (Duration::from_secs(3), Duration::from_secs(5))
            };
            events.push((
                at,
                Box::new(move || unsafe {
                    libc::kill(master, libc::SIGUSR2);
                }),
            ));
            events.push((
                then,
                Box::new(move || unsafe {
                    libc::kill(master, libc::SIGWINCH);
                    libc::kill(master, libc::SIGQUIT);
                }),
            ));
        }
        "stall" => {
            let stopped = &stopped;
            events.push((
                stall_from,
                Box::new(move || {
                    if let Some(pid) = worker_pid(port, 0) {
                        unsafe { libc::kill(pid, libc::SIGSTOP) };
                        stopped.set(pid);
                    }
                }),
            ));
            events.push((
                stall_from + stall_for,
                Box::new(move || {
                    if stopped.get() > 0 {
                        unsafe { libc::kill(stopped.get(), libc::SIGCONT) };
                    }
                }),
            ));
        }
        _ => {}
    }
    let res = load.run(rate, until, &mut events);
    drop(events);
    if stopped.get() > 0 {
        unsafe { libc::kill(stopped.get(), libc::SIGCONT) };
    }
    let body = status(port);
    load.out.strays = sum_field(&body, "quic_strays");
    // After an upgrade the master is the new one, not our child: stop it by its pid file.
    let dir = run.dir.clone();
    run.stop();
    if let Some(pid) = crate::reload::pid_file(&dir).filter(|&p| p != master) {
        unsafe { libc::kill(pid, libc::SIGQUIT) };
        crate::reload::wait_until(Duration::from_secs(15), || !crate::reload::alive(pid));
    }
    res?;
    let mut out = std::mem::take(&mut load.out);
    out.scenario = name.to_string();
    out.steering = steering;
    if name == "stall" {
        // Connections opened in a window, and those of them whose first request was served
        // within the request timeout: per second of the window.
        let rate_in = |from: u64, to: u64| -> f64 {
            let served = load
                .firsts
                .iter()
                .filter(|(s, d)| {
                    (from..to).contains(s)
                        && d.is_some_and(|d| d - s <= REQUEST_TIMEOUT.as_millis() as u64)
                })
                .count();
            served as f64 * 1000.0 / (to - from).max(1) as f64
        };
        let a = stall_from.as_millis() as u64;
        let b = a + stall_for.as_millis() as u64;
        out.before_rate = rate_in(a.saturating_sub(3000).max(500), a);
        // The master needs its stall verdict first (reuseport_stall_threshold): the window
        // starts a second in.
        out.during_rate = rate_in((a + 1000).min(b), b);
        out.shade = Some((a as f64 / BIN_MS as f64, b as f64 / BIN_MS as f64));
    }
    Ok(out)
}

/// E8: every scenario with steering on and with the kernel's hash.
pub fn e8(shard: &Path, smoke: bool, rate: Option<f64>) -> Result<Vec<Outcome>> {
    let rate = rate.unwrap_or(if smoke { 10.0 } else { 20.0 });
    let names: &[&str] = if smoke {
        &["base", "rebind"]
    } else {
        &["base", "reloads", "upgrade", "stall", "rebind"]
    };
    let mut all = Vec::new();
    for &name in names {
        for steering in [true, false] {
            eprintln!(
                "shard-bench: e8 {name} ({})",
                if steering { "steering" } else { "kernel hash" }
            );
            all.push(scenario(shard, name, steering, rate, smoke)?);
        }
    }
    Ok(all)
}

/// The report's section and charts (written into `out`).
pub fn report(rows: &[Outcome], out: &Path) -> Result<String> {
    use std::fmt::Write as _;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "| scenario | placement | connections | completed | failed | hung | GOAWAY | rejected | requests | \
         strays | TTFB p50 ms | p99 ms | p99.9 ms | max ms |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    for r in rows {
        let _ =
            writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.2} | {:.2} | {:.2} | {:.2} |",
            r.scenario,
            if r.steering { "steering by CID" } else { "kernel hash" },
            r.started,
            r.completed,
            r.failed,
            r.hung,
            r.goaway,
            r.rejected,
            r.requests,
            r.strays,
            r.quantile_ms(0.5),
            r.quantile_ms(0.99),
            r.quantile_ms(0.999),
            r.quantile_ms(1.0),
        );
    }
    for r in rows.iter().filter(|r| r.scenario == "stall") {
        let _ = writeln!(
            s,
            "\nstall, {}: first requests served {:.1}/s for connections arriving during the stall, \
             {:.1}/s before it (ratio {:.2}).",
            if r.steering { "steering by CID" } else { "kernel hash" },
            r.during_rate,
            r.before_rate,
            if r.before_rate > 0.0 { r.during_rate / r.before_rate } else { 0.0 }
        );
    }
    for r in rows.iter().filter(|r| !r.first_errors.is_empty()) {
        let _ = writeln!(
            s,
            "\n{} ({}) first errors: {}",
            r.scenario,
            if r.steering { "steering" } else { "hash" },
            r.first_errors.join("; ")
        );
    }
    let label = |r: &Outcome| {
        format!(
            "{} ({})",
            r.scenario,
            if r.steering { "steering" } else { "hash" }
        )
    };
    let series: Vec<(String, Vec<u64>)> = rows.iter().map(|r| (label(r), r.log2_us())).collect();
    std::fs::write(
        out.join("e8-ttfb.svg"),
        crate::svg::log2_histograms_log_count("E8: time to first byte per request", &series),
    )?;
    for name in ["reloads", "upgrade", "stall", "rebind"] {
        let mine: Vec<&Outcome> = rows.iter().filter(|r| r.scenario == name).collect();
        if mine.is_empty() {
            continue;
        }
        let series: Vec<(String, Vec<u64>)> = mine
            .iter()
            .map(|r| (label(r), r.timeline.clone()))
            .collect();
        std::fs::write(
            out.join(format!("e8-timeline-{name}.svg")),
            crate::svg::timeseries(
                &format!("E8 {name}: requests answered per {BIN_MS} ms"),
                BIN_MS,
                &series,
                mine[0].shade,
            ),
        )?;
    }
    let _ = writeln!(
        s,
        "\nCharts: `e8-ttfb.svg` (time to first byte, log2 buckets, log count), \
         `e8-timeline-*.svg` (requests answered per {BIN_MS} ms)."
    );
    Ok(s)
}

// --- `shard-bench h3`: HTTP/3 against shard's own HTTP/2 -----------------------------------

#[derive(clap::Args, Debug, Clone)]
pub struct H3Args {
    /// Worker processes.
    #[arg(long, default_value_t = 2)]
    workers: usize,
    /// Connections, each with one request in flight (closed loop), for both protocols.
    #[arg(long, default_value_t = 32)]
    clients: usize,
    /// Seconds per row.
    #[arg(long, default_value_t = 5)]
    duration: u64,
    /// Idle QUIC connections held for the memory figure.
    #[arg(long, default_value_t = 1000)]
    idle: usize,
    /// The shard binary (default: next to this one).
    #[arg(long)]
    shard: Option<std::path::PathBuf>,
    /// Tiny numbers, to check that the bench works (CI).
    #[arg(long)]
    smoke: bool,
    /// Also write the report here.
    #[arg(long)]
    out: Option<std::path::PathBuf>,
}

/// h2load's `requests:` line: (succeeded, failed).
fn h2load_counts(text: &str) -> (u64, u64) {
    let Some(line) = text.lines().find(|l| l.starts_with("requests:")) else {
        return (0, 0);
    };
    let field = |i: usize| -> u64 {
        line.split(',')
            .nth(i)
            .and_then(|p| p.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    (field(3), field(4))
}

/// `shard-bench h3`: `return 200` over HTTP/3 (the bench's own client, `clients` connections
/// with one request in flight each) and over HTTP/2 with TLS (`h2load -c clients -m 1`, where
/// installed) against one shard with both addresses; requests/s, the workers' CPU per request
/// (`/proc`) and requests per worker CPU-second; then the workers' memory per idle QUIC
/// connection (each made one request). Loopback hides what QUIC is for (loss, head-of-line
/// blocking, connection migration across networks): these figures are the cost of QUIC's
/// user-space transport and encryption per request, nothing more.
pub fn h3_run(mut a: H3Args) -> Result<()> {
    use std::fmt::Write as _;
    if a.smoke {
        a.duration = 1;
        a.clients = a.clients.min(4);
        a.idle = a.idle.min(100);
    }
    crate::procfs::raise_nofile_limit();
    let shard = match &a.shard {
        Some(p) => p.clone(),
        None => std::env::current_exe()?.with_file_name("shard"),
    };
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_string()])?;
    let certs = std::env::temp_dir().join(format!("shard-bench-h3-{}", std::process::id()));
    std::fs::create_dir_all(&certs)?;
    let (crt, key) = (certs.join("cert.pem"), certs.join("key.pem"));
    std::fs::write(&crt, cert.cert.pem())?;
    std::fs::write(&key, cert.key_pair.serialize_pem())?;
    let tls_port = servers::free_port()?;
    let spec = Spec {
        workers: a.workers,
        http_extra: format!(
            "server {{\n listen 127.0.0.1:{{port}} quic reuseport;\n \
             listen 127.0.0.1:{tls_port} ssl http2;\n \
             ssl_certificate {};\n ssl_certificate_key {};\n \
             location = /ok {{ return 200 \"OK\"; }}\n }}",
            crt.display(),
            key.display()
        ),
        idle: a.idle + a.clients,
        tag: "h3".into(),
        ..Spec::default()
    };
    let srv = servers::start_with(&Kind::Shard(shard), &spec, |_| Ok(()))?;
    let res = (|| -> Result<String> {
        let pids = srv.worker_pids()?;
        let server = SocketAddr::from(([127, 0, 0, 1], srv.port));
        let mut r = String::new();
        let _ = writeln!(
            r,
            "# shard-bench h3\n\n{} workers, {} connections with one request in flight each, {} s \
             per row, `return 200`, TLS 1.3 both ways, 2 cores shared with the clients.\n\n\
             | protocol | requests | failed | requests/s | worker CPU µs/request | requests per \
             worker CPU-second |\n|---|---:|---:|---:|---:|---:|",
            a.workers, a.clients, a.duration
        );
        // HTTP/3: every connection opened at once, each a request after the other.
        let mut load = Load::new(server, false)?;
        load.every = Duration::ZERO;
        load.lifetime = Duration::from_secs(a.duration);
        let t0 = crate::procfs::cpu_ticks(&pids)?;
        let start = Instant::now();
        load.run_max(
            1000.0,
            Duration::from_secs(a.duration),
            &mut [],
            a.clients,
            |_| false,
        )?;
        let secs = start.elapsed().as_secs_f64();
        let t1 = crate::procfs::cpu_ticks(&pids)?;
        let reqs = load.out.requests;
        let cpu_s = (t1 - t0) as f64 / crate::procfs::ticks_per_sec();
        let h3_per_cpu = reqs as f64 / cpu_s.max(1e-9);
        let _ = writeln!(
            r,
            "| HTTP/3 | {reqs} | {} | {:.0} | {:.1} | {:.0} |",
            load.out.failed + load.out.hung,
            reqs as f64 / secs,
            cpu_s * 1e6 / reqs.max(1) as f64,
            h3_per_cpu
        );
        // HTTP/2 over TLS by h2load, the same shape.
        let mut h2_per_cpu = None;
        if servers::which("h2load").is_some() {
            let t0 = crate::procfs::cpu_ticks(&pids)?;
            let out = std::process::Command::new("h2load")
                .args(["-c", &a.clients.to_string(), "-m", "1", "-D"])
                .arg(a.duration.to_string())
                .arg(format!("https://127.0.0.1:{tls_port}/ok"))
                .output()?;
            let t1 = crate::procfs::cpu_ticks(&pids)?;
            let (succeeded, failed) = h2load_counts(&String::from_utf8_lossy(&out.stdout));
            let cpu_s = (t1 - t0) as f64 / crate::procfs::ticks_per_sec();
            let per = succeeded as f64 / cpu_s.max(1e-9);
            h2_per_cpu = Some(per);
            let _ = writeln!(
                r,
                "| HTTP/2 (h2load) | {succeeded} | {failed} | {:.0} | {:.1} | {:.0} |",
                succeeded as f64 / a.duration as f64,
                cpu_s * 1e6 / succeeded.max(1) as f64,
                per
            );
        } else {
            let _ = writeln!(
                r,
                "\nh2load not found: no HTTP/2 row (install: apt-get install nghttp2-client)."
            );
        }
        if let Some(h2) = h2_per_cpu {
            let _ = writeln!(
                r,
                "\nHTTP/3 / HTTP/2 requests per worker CPU-second: {:.2}.",
                h3_per_cpu / h2.max(1e-9)
            );
        }
        // Memory: `idle` connections, each after one request, held open.
        let before = crate::procfs::rss_bytes(&pids)?;
        let mut idle = Load::new(server, false)?;
        idle.every = Duration::from_secs(3600);
        idle.lifetime = Duration::from_secs(120);
        let n = a.idle;
        idle.run_max(2000.0, Duration::from_secs(60), &mut [], n, |l| {
            l.conns.len() >= n && l.conns.iter().all(|c| c.first_done)
        })?;
        std::thread::sleep(Duration::from_millis(500));
        let after = crate::procfs::rss_bytes(&pids)?;
        let per = after.saturating_sub(before) as f64 / n as f64;
        let _ = writeln!(
            r,
            "\nWorkers' memory per idle QUIC connection (one request made, {n} held): {per:.0} \
             bytes."
        );
        if a.smoke {
            anyhow::ensure!(reqs > 0, "smoke: no HTTP/3 request answered");
        }
        Ok(r)
    })();
    srv.stop();
    let _ = std::fs::remove_dir_all(&certs);
    let report = res?;
    print!("{report}");
    servers::write_report(a.out.as_deref(), &report)?;
    Ok(())
}
