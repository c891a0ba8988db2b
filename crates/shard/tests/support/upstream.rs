//! A small HTTP/1.x upstream for the reverse-proxy tests: a std `TcpListener` on a free loopback
//! port, one thread per connection, requests parsed in a loop on keep-alive connections (head,
//! then a body by `Content-Length` or chunked), and a closure that decides each reply. Every
//! request received is recorded, and accepted connections and complete requests are counted, so
//! a test asserts on what the upstream saw rather than on what shard says it sent.
//!
//! It is deliberately not a general HTTP server: no pipelining guarantees beyond what falls out
//! of the buffer, no `Expect` handling, no timeouts other than a generous cap on each socket so
//! that a forgotten connection cannot keep a thread alive for ever.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// A cap on every blocking read or write of the upstream, so a thread never outlives a test by
/// much; tests themselves finish well within it.
const IO_TIMEOUT: Duration = Duration::from_secs(20);
/// The largest request head the upstream accepts.
const HEAD_MAX: usize = 64 * 1024;

/// One request as the upstream received it.
#[derive(Debug, Clone)]
pub struct Received {
    /// 1-based number of the connection it came on (in accept order).
    pub conn: usize,
    /// 1-based number of the request on its connection.
    pub nth: usize,
    pub method: String,
    pub target: String,
    /// The request line's version, e.g. `HTTP/1.0`.
    pub version: String,
    pub headers: Vec<(String, String)>,
    /// The body, de-chunked when it came chunked.
    pub body: Vec<u8>,
    /// The body came with `Transfer-Encoding: chunked`.
    pub chunked: bool,
}

impl Received {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
    /// Every value of `name`, in order.
    pub fn header_all(&self, name: &str) -> Vec<&str> {
        self.headers
            .iter()
            .filter(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
            .collect()
    }
    fn wants_close(&self) -> bool {
        let conn = self.header_all("connection").join(",").to_ascii_lowercase();
        let tokens: Vec<&str> = conn.split(',').map(str::trim).collect();
        if self.version == "HTTP/1.1" {
            tokens.contains(&"close")
        } else {
            !tokens.contains(&"keep-alive")
        }
    }
}

/// A one-shot signal from the test to an upstream thread (a latch, not a sleep).
#[derive(Clone, Default)]
pub struct Gate(Arc<(Mutex<bool>, Condvar)>);

impl Gate {
    pub fn new() -> Gate {
        Gate::default()
    }
    pub fn open(&self) {
        let (m, c) = &*self.0;
        *m.lock().unwrap() = true;
        c.notify_all();
    }
    /// Waits until opened or `timeout` passes; true when opened.
    pub fn wait(&self, timeout: Duration) -> bool {
        let (m, c) = &*self.0;
        let g = m.lock().unwrap();
        let (g, _) = c.wait_timeout_while(g, timeout, |open| !*open).unwrap();
        *g
    }
}

/// What the upstream does with one request.
#[derive(Clone)]
pub enum Reply {
    /// 200 with the request body as the body, `Content-Length`.
    Echo,
    /// This status, these headers, this body with `Content-Length` (unless `headers` sets
    /// `Content-Length` or `Transfer-Encoding` itself, then the body is written as is). A
    /// `Connection: close` among `headers` closes the connection after the body.
    Fixed {
        status: u16,
        headers: Vec<(String, String)>,
        body: Vec<u8>,
    },
    /// 200 with `pattern(n, n)` as the body, `Content-Length: n`.
    Large(usize),
    /// 200, `Transfer-Encoding: chunked`, one chunk per piece (each its own `write`), then the
    /// last chunk.
    Chunked(Vec<Vec<u8>>),
    /// `HTTP/1.1 200` with `Connection: close` and no length: the body ends when the upstream
    /// closes.
    CloseDelimited(Vec<u8>),
    /// The head of a `Content-Length: len` response with `pattern(len, len)` as its body, of
    /// which `sent` bytes are written; then waits for `gate` (or the I/O cap) and resets the
    /// connection (SO_LINGER 0).
    ResetMid { len: usize, sent: usize, gate: Gate },
    /// Reset the connection at once, sending nothing.
    ResetNow,
    /// Close the connection at once (FIN), sending nothing.
    CloseNow,
    /// Never answer: read and drop whatever comes until the peer closes (or the I/O cap).
    Stall,
    /// Write these bytes as they are, then close.
    Raw(Vec<u8>),
    /// The reply, then close the connection without having said so.
    ThenClose(Box<Reply>),
    /// The reply after a pause: a slow upstream (the only sleep in these tests, and it is the
    /// behaviour under test, not synchronisation).
    Delayed(Duration, Box<Reply>),
}

impl Reply {
    pub fn text(status: u16, body: &str) -> Reply {
        Reply::Fixed {
            status,
            headers: vec![("Content-Type".into(), "text/plain".into())],
            body: body.as_bytes().to_vec(),
        }
    }
    /// Not HTTP at all.
    pub fn garbage() -> Reply {
        Reply::Raw(b"hello\r\n\r\n".to_vec())
    }
}

type Decide = dyn Fn(&Received) -> Reply + Send + Sync;

/// A running test upstream. Its threads are left to end on their own (a closed peer or the I/O
/// cap); the listener lives as long as the test process.
pub struct Upstream {
    pub port: u16,
    accepted: Arc<AtomicUsize>,
    requests: Arc<AtomicUsize>,
    log: Arc<Mutex<Vec<Received>>>,
}

impl Upstream {
    /// An upstream whose replies `decide` chooses.
    pub fn start(decide: impl Fn(&Received) -> Reply + Send + Sync + 'static) -> Upstream {
        Self::spawn(false, Arc::new(decide))
    }

    /// An upstream that answers every request with 200 and `body`.
    pub fn text(body: &'static str) -> Upstream {
        Self::start(move |_| Reply::text(200, body))
    }

    /// An upstream that accepts each connection and closes it at once, reading nothing.
    pub fn closer() -> Upstream {
        Self::spawn(true, Arc::new(|_: &Received| Reply::CloseNow))
    }

    fn spawn(close_on_accept: bool, decide: Arc<Decide>) -> Upstream {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let accepted = Arc::new(AtomicUsize::new(0));
        let requests = Arc::new(AtomicUsize::new(0));
        let log = Arc::new(Mutex::new(Vec::new()));
        let (a, r, lg) = (accepted.clone(), requests.clone(), log.clone());
        std::thread::spawn(move || {
            for s in l.incoming() {
                let Ok(s) = s else { continue };
                // Counted before anything is done with the socket, so that whatever the peer
                // observes afterwards (a close, a reply) happens after the count.
                let conn = a.fetch_add(1, Ordering::SeqCst) + 1;
                if close_on_accept {
                    drop(s);
                    continue;
                }
                let (r, lg, d) = (r.clone(), lg.clone(), decide.clone());
                std::thread::spawn(move || serve(s, conn, &r, &lg, &*d));
            }
        });
        Upstream {
            port,
            accepted,
            requests,
            log,
        }
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }
    /// Connections accepted so far.
    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
    /// Complete requests received so far.
    pub fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }
    /// Every request received so far, in arrival order.
    pub fn received(&self) -> Vec<Received> {
        self.log.lock().unwrap().clone()
    }
    /// The latest request received; panics when there is none.
    pub fn last(&self) -> Received {
        self.received()
            .pop()
            .expect("the upstream received no request")
    }
}

/// A port that nothing listens on (connect() is refused), for the rest of the test process: a
/// socket bound to it and never listening holds it, so no other test's port-0 bind or
/// connect() can take it and start answering there. (A probed and released port could be.)
pub fn refusing_port() -> u16 {
    static HELD: std::sync::Mutex<Vec<socket2::Socket>> = std::sync::Mutex::new(Vec::new());
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    sock.bind(&std::net::SocketAddr::from(([127, 0, 0, 1], 0)).into())
        .unwrap();
    let port = sock.local_addr().unwrap().as_socket().unwrap().port();
    HELD.lock().unwrap().push(sock);
    port
}

/// A port where a connect() gets no answer: a listener with a zero backlog whose one-slot accept
/// queue is already full, so the kernel drops further SYNs (Linux `tcp_conn_request`). Keep the
/// value alive for as long as the port must stay silent.
pub struct Blackhole {
    pub port: u16,
    _listener: TcpListener,
    _queued: Vec<TcpStream>,
}

impl Blackhole {
    pub fn new() -> Blackhole {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        // SAFETY: listen(2) again on our own listening socket only changes its backlog.
        let rc = unsafe { libc::listen(l.as_raw_fd(), 0) };
        assert_eq!(rc, 0, "listen(0)");
        let addr = l.local_addr().unwrap();
        let mut queued = Vec::new();
        for _ in 0..4 {
            match TcpStream::connect_timeout(&addr, Duration::from_millis(200)) {
                Ok(s) => queued.push(s),
                Err(_) => {
                    return Blackhole {
                        port: addr.port(),
                        _listener: l,
                        _queued: queued,
                    }
                }
            }
        }
        panic!("the accept queue of a zero-backlog listener never filled up");
    }
}

/// A deterministic byte pattern (xorshift), the same for the same `(len, seed)`.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// FNV-1a of `data`: enough to tell two multi-megabyte bodies apart in an assertion message.
pub fn checksum(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    })
}

fn serve(
    mut s: TcpStream,
    conn: usize,
    requests: &AtomicUsize,
    log: &Mutex<Vec<Received>>,
    decide: &Decide,
) {
    let _ = s.set_read_timeout(Some(IO_TIMEOUT));
    let _ = s.set_write_timeout(Some(IO_TIMEOUT));
    let _ = s.set_nodelay(true);
    let mut buf = Vec::new();
    let mut nth = 0;
    loop {
        nth += 1;
        let Some(req) = read_request(&mut s, &mut buf, conn, nth) else {
            return;
        };
        requests.fetch_add(1, Ordering::SeqCst);
        log.lock().unwrap().push(req.clone());
        let reply = decide(&req);
        match write_reply(&mut s, &req, reply) {
            Ok(true) => continue,
            _ => return,
        }
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Reads more into `buf`; false at end of stream or on an error.
fn fill(s: &mut TcpStream, buf: &mut Vec<u8>) -> bool {
    let mut tmp = [0u8; 65536];
    match s.read(&mut tmp) {
        Ok(0) | Err(_) => false,
        Ok(n) => {
            buf.extend_from_slice(&tmp[..n]);
            true
        }
    }
}

/// Takes a line ending in CRLF off the front of `buf`, reading as needed.
fn take_line(s: &mut TcpStream, buf: &mut Vec<u8>) -> Option<String> {
    loop {
        if let Some(i) = find(buf, b"\r\n") {
            let line = String::from_utf8_lossy(&buf[..i]).into_owned();
            buf.drain(..i + 2);
            return Some(line);
        }
        if buf.len() > HEAD_MAX || !fill(s, buf) {
            return None;
        }
    }
}

fn take_exact(s: &mut TcpStream, buf: &mut Vec<u8>, n: usize) -> Option<Vec<u8>> {
    while buf.len() < n {
        if !fill(s, buf) {
            return None;
        }
    }
    Some(buf.drain(..n).collect())
}

/// One request off the connection; `None` when it closed (or sent something unparseable).
fn read_request(s: &mut TcpStream, buf: &mut Vec<u8>, conn: usize, nth: usize) -> Option<Received> {
    let head_end = loop {
        if let Some(i) = find(buf, b"\r\n\r\n") {
            break i + 4;
        }
        if buf.len() > HEAD_MAX || !fill(s, buf) {
            return None;
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    buf.drain(..head_end);
    let mut lines = head.split("\r\n");
    let mut rl = lines.next()?.split(' ');
    let (method, target, version) = (
        rl.next()?.to_string(),
        rl.next()?.to_string(),
        rl.next()?.to_string(),
    );
    let headers: Vec<(String, String)> = lines
        .filter(|l| !l.is_empty())
        .filter_map(|l| {
            l.split_once(':')
                .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        })
        .collect();
    let mut req = Received {
        conn,
        nth,
        method,
        target,
        version,
        headers,
        body: Vec::new(),
        chunked: false,
    };
    let te = req.header_all("transfer-encoding").join(",");
    if te.to_ascii_lowercase().contains("chunked") {
        req.chunked = true;
        loop {
            let line = take_line(s, buf)?;
            let size = usize::from_str_radix(line.split(';').next()?.trim(), 16).ok()?;
            if size == 0 {
                // Trailers, up to the empty line.
                while !take_line(s, buf)?.is_empty() {}
                break;
            }
            let data = take_exact(s, buf, size)?;
            req.body.extend_from_slice(&data);
            if !take_line(s, buf)?.is_empty() {
                return None;
            }
        }
    } else if let Some(len) = req.header("content-length") {
        let len: usize = len.parse().ok()?;
        req.body = take_exact(s, buf, len)?;
    }
    Some(req)
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        201 => "Created",
        204 => "No Content",
        304 => "Not Modified",
        404 => "Not Found",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        _ => "Whatever",
    }
}

/// Arms a reset: with SO_LINGER at zero, the close that follows (`serve` returning drops the
/// socket) sends RST instead of FIN.
fn arm_reset(s: &TcpStream) {
    let lg = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: setsockopt on a descriptor we own, with a correctly sized `linger`.
    unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            &lg as *const libc::linger as *const libc::c_void,
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        );
    }
}

/// Writes `reply`; `Ok(true)` when the connection may carry another request.
fn write_reply(s: &mut TcpStream, req: &Received, reply: Reply) -> std::io::Result<bool> {
    let keep = !req.wants_close();
    // A keep-alive answer to an HTTP/1.0 request must say so; a closing one to HTTP/1.1 too.
    let conn_header = match (keep, req.version.as_str()) {
        (true, "HTTP/1.1") => "",
        (true, _) => "Connection: keep-alive\r\n",
        (false, _) => "Connection: close\r\n",
    };
    match reply {
        Reply::Echo => {
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n\
                 Content-Length: {}\r\n{conn_header}\r\n",
                req.body.len()
            );
            s.write_all(head.as_bytes())?;
            if req.method != "HEAD" {
                s.write_all(&req.body)?;
            }
            Ok(keep)
        }
        Reply::Fixed {
            status,
            headers,
            body,
        } => {
            let mut head = format!("HTTP/1.1 {status} {}\r\n", reason(status));
            let mut framed = false;
            let mut close = !keep;
            for (k, v) in &headers {
                head.push_str(&format!("{k}: {v}\r\n"));
                framed |= k.eq_ignore_ascii_case("content-length")
                    || k.eq_ignore_ascii_case("transfer-encoding");
                close |= k.eq_ignore_ascii_case("connection") && v.eq_ignore_ascii_case("close");
            }
            let bodiless = status == 204 || status == 304 || (100..200).contains(&status);
            if !framed && !bodiless {
                head.push_str(&format!("Content-Length: {}\r\n", body.len()));
            }
            if !headers
                .iter()
                .any(|(k, _)| k.eq_ignore_ascii_case("connection"))
            {
                head.push_str(conn_header);
            }
            head.push_str("\r\n");
            s.write_all(head.as_bytes())?;
            if req.method != "HEAD" {
                s.write_all(&body)?;
            }
            Ok(!close)
        }
        Reply::Large(n) => {
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n\
                 Content-Length: {n}\r\n{conn_header}\r\n"
            );
            s.write_all(head.as_bytes())?;
            if req.method != "HEAD" {
                s.write_all(&pattern(n, n as u64))?;
            }
            Ok(keep)
        }
        Reply::Chunked(pieces) => {
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n\
                 Transfer-Encoding: chunked\r\n{conn_header}\r\n"
            );
            s.write_all(head.as_bytes())?;
            for p in pieces.iter().filter(|p| !p.is_empty()) {
                let mut chunk = format!("{:x}\r\n", p.len()).into_bytes();
                chunk.extend_from_slice(p);
                chunk.extend_from_slice(b"\r\n");
                s.write_all(&chunk)?;
            }
            s.write_all(b"0\r\n\r\n")?;
            Ok(keep)
        }
        Reply::CloseDelimited(body) => {
            // One write, so that a short body and the FIN that follows arrive together.
            let mut out = b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n\
                            Connection: close\r\n\r\n"
                .to_vec();
            out.extend_from_slice(&body);
            s.write_all(&out)?;
            Ok(false)
        }
        Reply::ResetMid { len, sent, gate } => {
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n\
                 Content-Length: {len}\r\n{conn_header}\r\n"
            );
            s.write_all(head.as_bytes())?;
            s.write_all(&pattern(len, len as u64)[..sent.min(len)])?;
            gate.wait(IO_TIMEOUT);
            arm_reset(s);
            Ok(false)
        }
        Reply::ResetNow => {
            arm_reset(s);
            Ok(false)
        }
        Reply::CloseNow => Ok(false),
        Reply::Stall => {
            let deadline = Instant::now() + IO_TIMEOUT;
            let mut tmp = [0u8; 4096];
            while Instant::now() < deadline {
                match s.read(&mut tmp) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
            }
            Ok(false)
        }
        Reply::Raw(bytes) => {
            s.write_all(&bytes)?;
            Ok(false)
        }
        Reply::ThenClose(r) => {
            write_reply(s, req, *r)?;
            Ok(false)
        }
        Reply::Delayed(d, r) => {
            std::thread::sleep(d);
            write_reply(s, req, *r)
        }
    }
}
