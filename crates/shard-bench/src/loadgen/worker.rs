//! One load thread: its own edge-triggered epoll over its share of the connections, each a
//! small state machine (connect, write the request, read the response, next request).
//!
//! Every socket is registered once, for input and output, edge-triggered, with its slot and a
//! generation in the event data, so an event for a socket that has since been replaced is
//! recognised. After a `Connection: close` response the socket waits in `draining` until the
//! server's FIN, so that the server, not this client, holds the TIME_WAIT state.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::ops::Range;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use hdrhistogram::Histogram;
use socket2::{Domain, Socket, Type};

use super::response::{Feed, Reader};
use super::{new_histogram, Errors, LoadSpec};

/// What every thread of one run shares.
pub struct Shared {
    /// When the load starts (threads wait for it); the report's time runs from here.
    pub start: Instant,
    deadline: Instant,
    /// The request budget (`-n`), and how many requests have been started against it.
    limit: Option<u64>,
    issued: AtomicU64,
    /// Requests started over all threads: the next one's request (`LoadSpec::paths`).
    turn: AtomicU64,
    /// Open loop: each connection's time between intended sends, and the offset between the
    /// first sends of neighbouring connections.
    interval: Option<Duration>,
    spacing: Duration,
    close: bool,
    timeout: Duration,
    addr: SocketAddr,
    record: bool,
}

impl Shared {
    pub fn new(spec: &LoadSpec, start: Instant) -> Shared {
        let (interval, spacing) = match spec.rate {
            Some(r) => (
                Some(Duration::from_secs_f64(spec.connections as f64 / r)),
                Duration::from_secs_f64(1.0 / r),
            ),
            None => (None, Duration::ZERO),
        };
        Shared {
            start,
            deadline: start + spec.duration,
            limit: spec.requests,
            issued: AtomicU64::new(0),
            turn: AtomicU64::new(0),
            interval,
            spacing,
            close: spec.close,
            timeout: spec.timeout,
            addr: spec.target.addr,
            record: spec.record,
        }
    }
}

/// One thread's results.
pub struct Outcome {
    pub requests: u64,
    pub bytes: u64,
    pub errors: Errors,
    pub histogram: Histogram<u64>,
    /// When this thread stopped.
    pub end: Instant,
    /// Every request (`LoadSpec::record`).
    pub samples: Vec<super::Sample>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum St {
    /// No request in flight (the socket, if any, is an idle keep-alive connection).
    Free,
    Connecting,
    Writing,
    Reading,
}

#[derive(Debug, Clone, Copy)]
enum Kind {
    Connect,
    Reset,
    Timeout,
    Other,
}

struct Conn {
    sock: Option<TcpStream>,
    gen: u32,
    st: St,
    written: usize,
    /// The request in flight (index into `Worker::reqs`).
    req: usize,
    /// Where this request's latency starts: the intended send time (open loop), the connect
    /// start (`close`), or the request write (keep-alive); set when known.
    t0: Option<Instant>,
    /// When the request in flight fails as a timeout.
    deadline: Instant,
    /// Responses read on the current socket.
    served: u32,
    /// Whether any byte of the current response arrived.
    got_bytes: bool,
    /// Whether the current request was already resent once after a stale keep-alive close.
    retried: bool,
    reader: Reader,
    /// Open loop: the intended send time of the next request.
    next_send: Instant,
}

const EV_IN: u32 = libc::EPOLLIN as u32;
const EV_OUT: u32 = libc::EPOLLOUT as u32;
const EV_ERR: u32 = libc::EPOLLERR as u32;
const EV_HUP: u32 = libc::EPOLLHUP as u32;
const EV_RDHUP: u32 = libc::EPOLLRDHUP as u32;
const EV_ET: u32 = libc::EPOLLET as u32;

struct Worker<'a> {
    sh: &'a Shared,
    /// The requests, taken in turn (one, unless `LoadSpec::paths`).
    reqs: &'a [Vec<u8>],
    ep: OwnedFd,
    conns: Vec<Conn>,
    /// Sockets after a complete `Connection: close` response, waiting for the server's FIN,
    /// by their event data, with the time they are given up at.
    draining: HashMap<u64, (TcpStream, Instant)>,
    /// Slots whose next request starts at the top of the loop.
    ready: Vec<usize>,
    /// Open loop: slots waiting for their intended send time.
    timers: BinaryHeap<Reverse<(Instant, usize)>>,
    /// The request budget is spent: start nothing more.
    exhausted: bool,
    /// Requests started and not yet complete or failed.
    active: usize,
    buf: Vec<u8>,
    out: Outcome,
}

/// Runs the connections `slots` (global indices) until the deadline or the request budget.
pub fn run(sh: &Shared, reqs: &[Vec<u8>], slots: Range<usize>) -> Result<Outcome> {
    // SAFETY: epoll_create1 has no memory effects; the result is checked.
    let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error()).context("epoll_create1");
    }
    // SAFETY: `fd` is a new descriptor that nothing else owns.
    let ep = unsafe { OwnedFd::from_raw_fd(fd) };
    let now = Instant::now();
    let mut w = Worker {
        sh,
        reqs,
        ep,
        conns: Vec::with_capacity(slots.len()),
        draining: HashMap::new(),
        ready: Vec::with_capacity(slots.len()),
        timers: BinaryHeap::new(),
        exhausted: false,
        active: 0,
        buf: vec![0; 64 * 1024],
        out: Outcome {
            requests: 0,
            bytes: 0,
            errors: Errors::default(),
            histogram: new_histogram(),
            end: now,
            samples: Vec::new(),
        },
    };
    for (i, global) in slots.enumerate() {
        let next_send = sh.start + sh.spacing * global as u32;
        w.conns.push(Conn {
            sock: None,
            gen: 0,
            st: St::Free,
            written: 0,
            req: 0,
            t0: None,
            deadline: now,
            served: 0,
            got_bytes: false,
            retried: false,
            reader: Reader::default(),
            next_send,
        });
        if sh.interval.is_some() {
            w.timers.push(Reverse((next_send, i)));
        } else {
            w.ready.push(i);
        }
    }
    if let Some(d) = sh.start.checked_duration_since(Instant::now()) {
        std::thread::sleep(d);
    }
    w.event_loop()?;
    Ok(w.out)
}

impl Worker<'_> {
    fn event_loop(&mut self) -> Result<()> {
        let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; 512];
        let scan_every = (self.sh.timeout / 4).min(Duration::from_millis(50));
        let mut next_scan = Instant::now() + scan_every;
        loop {
            let now = Instant::now();
            if now >= self.sh.deadline || (self.exhausted && self.active == 0) {
                self.out.end = now;
                return Ok(());
            }
            for slot in std::mem::take(&mut self.ready) {
                self.start(slot, now);
            }
            while let Some(&Reverse((t, slot))) = self.timers.peek() {
                if t > now {
                    break;
                }
                self.timers.pop();
                self.start(slot, now);
            }
            if now >= next_scan {
                self.expire(now);
                next_scan = now + scan_every;
            }
            let wait = if self.ready.is_empty() {
                let mut until = self.sh.deadline.min(next_scan);
                if let Some(&Reverse((t, _))) = self.timers.peek() {
                    until = until.min(t);
                }
                until.saturating_duration_since(now)
            } else {
                Duration::ZERO
            };
            let n = epoll_wait(&self.ep, &mut events, wait).context("epoll_wait")?;
            for ev in &events[..n] {
                let (data, bits) = (ev.u64, ev.events);
                self.event(data, bits);
            }
        }
    }

    /// Starts the next request on `slot`, if the run and the budget allow one.
    fn start(&mut self, slot: usize, now: Instant) {
        if now >= self.sh.deadline || self.exhausted {
            return;
        }
        if let Some(n) = self.sh.limit {
            if self.sh.issued.fetch_add(1, Ordering::Relaxed) >= n {
                self.exhausted = true;
                return;
            }
        }
        self.active += 1;
        let c = &mut self.conns[slot];
        c.t0 = None;
        if let Some(iv) = self.sh.interval {
            c.t0 = Some(c.next_send);
            c.next_send += iv;
        }
        c.deadline = now + self.sh.timeout;
        if self.reqs.len() > 1 {
            c.req =
                (self.sh.turn.fetch_add(1, Ordering::Relaxed) % self.reqs.len() as u64) as usize;
        }
        c.got_bytes = false;
        c.retried = false;
        c.written = 0;
        c.reader.reset();
        if self.sh.close || c.sock.is_none() {
            self.connect(slot, now);
        } else {
            c.st = St::Writing;
            self.write(slot);
        }
    }

    /// Opens a new socket for `slot`'s request in flight.
    fn connect(&mut self, slot: usize, now: Instant) {
        let c = &mut self.conns[slot];
        c.sock = None;
        c.served = 0;
        c.gen = c.gen.wrapping_add(1);
        if c.t0.is_none() && self.sh.close {
            c.t0 = Some(now);
        }
        let sock = match Socket::new(Domain::IPV4, Type::STREAM.nonblocking().cloexec(), None) {
            Ok(s) => s,
            Err(_) => return self.fail(slot, Kind::Other),
        };
        let _ = sock.set_nodelay(true);
        let data = (u64::from(c.gen) << 32) | slot as u64;
        let mut ev = libc::epoll_event {
            events: EV_IN | EV_OUT | EV_RDHUP | EV_ET,
            u64: data,
        };
        // SAFETY: both descriptors are open; `ev` is a valid epoll_event.
        let r = unsafe {
            libc::epoll_ctl(
                self.ep.as_raw_fd(),
                libc::EPOLL_CTL_ADD,
                sock.as_raw_fd(),
                &mut ev,
            )
        };
        if r < 0 {
            return self.fail(slot, Kind::Other);
        }
        let res = sock.connect(&self.sh.addr.into());
        c.sock = Some(sock.into());
        match res {
            Ok(()) => {
                c.st = St::Writing;
                self.write(slot);
            }
            Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => c.st = St::Connecting,
            Err(_) => self.fail(slot, Kind::Connect),
        }
    }

    fn write(&mut self, slot: usize) {
        let c = &mut self.conns[slot];
        if c.t0.is_none() {
            c.t0 = Some(Instant::now());
        }
        let Some(sock) = c.sock.as_mut() else { return };
        loop {
            let req = &self.reqs[c.req];
            match sock.write(&req[c.written..]) {
                Ok(n) => {
                    c.written += n;
                    if c.written == req.len() {
                        c.st = St::Reading;
                        return;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return self.io_error(slot, &e),
            }
        }
    }

    fn event(&mut self, data: u64, bits: u32) {
        let slot = (data & 0xffff_ffff) as usize;
        let gen = (data >> 32) as u32;
        if self.conns[slot].gen != gen {
            self.drain(data);
            return;
        }
        let c = &mut self.conns[slot];
        match c.st {
            St::Connecting if bits & (EV_OUT | EV_ERR | EV_HUP) != 0 => {
                let err = c.sock.as_ref().map(|s| s.take_error());
                match err {
                    Some(Ok(None)) if bits & EV_HUP == 0 => {
                        c.st = St::Writing;
                        self.write(slot);
                    }
                    _ => self.fail(slot, Kind::Connect),
                }
            }
            St::Writing if bits & (EV_OUT | EV_ERR | EV_HUP) != 0 => self.write(slot),
            St::Reading if bits & (EV_IN | EV_RDHUP | EV_ERR | EV_HUP) != 0 => {
                self.read(slot, bits)
            }
            St::Free if bits & (EV_IN | EV_RDHUP | EV_ERR | EV_HUP) != 0 => {
                // An idle keep-alive connection: the server closed it, or the event is stale.
                let Some(sock) = c.sock.as_mut() else { return };
                match sock.read(&mut self.buf) {
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    _ => {
                        c.sock = None;
                        c.served = 0;
                    }
                }
            }
            _ => {}
        }
    }

    fn read(&mut self, slot: usize, bits: u32) {
        let c = &mut self.conns[slot];
        let Some(sock) = c.sock.as_mut() else { return };
        loop {
            match sock.read(&mut self.buf) {
                Ok(0) => {
                    if c.reader.eof_completes() {
                        return self.complete(slot, true, bits);
                    }
                    return self.closed_early(slot, Kind::Reset);
                }
                Ok(n) => {
                    self.out.bytes += n as u64;
                    c.got_bytes = true;
                    match c.reader.feed(&self.buf[..n]) {
                        Feed::Done(_) => return self.complete(slot, false, bits),
                        Feed::Bad => return self.fail(slot, Kind::Other),
                        // A short read emptied the socket: the next bytes bring an event,
                        // unless the peer's FIN is already in (then the next read sees it).
                        Feed::More if n < self.buf.len() && bits & (EV_RDHUP | EV_HUP) == 0 => {
                            return
                        }
                        Feed::More => {}
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    return match classify(&e) {
                        Kind::Reset => self.closed_early(slot, Kind::Reset),
                        k => self.fail(slot, k),
                    }
                }
            }
        }
    }

    /// The connection ended before the response: a keep-alive connection that the server
    /// closed as the request went out is retried once on a new one (as HTTP clients do for
    /// idempotent requests); anything else is an error.
    fn closed_early(&mut self, slot: usize, kind: Kind) {
        let c = &mut self.conns[slot];
        if c.served > 0 && !c.got_bytes && !c.retried {
            c.retried = true;
            c.written = 0;
            c.reader.reset();
            self.connect(slot, Instant::now());
        } else {
            self.fail(slot, kind);
        }
    }

    fn complete(&mut self, slot: usize, eof: bool, bits: u32) {
        let now = Instant::now();
        let c = &mut self.conns[slot];
        let t0 = c.t0.unwrap_or(now);
        let us = now.saturating_duration_since(t0).as_micros();
        self.out
            .histogram
            .saturating_record(u64::try_from(us).unwrap_or(u64::MAX));
        self.out.requests += 1;
        let ok = (200..400).contains(&c.reader.status);
        if !ok {
            self.out.errors.status += 1;
        }
        if self.sh.record {
            self.out.samples.push(super::Sample {
                start_us: micros(t0.saturating_duration_since(self.sh.start)),
                done_us: micros(now.saturating_duration_since(self.sh.start)),
                ok,
            });
        }
        self.active -= 1;
        c.served += 1;
        c.st = St::Free;
        if eof || self.sh.close || !c.reader.keep_alive {
            let sock = c.sock.take();
            c.served = 0;
            if let (Some(mut sock), false) = (sock, eof || bits & EV_RDHUP != 0) {
                // Wait for the server's FIN unless it is already here.
                match sock.read(&mut self.buf) {
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        let data = (u64::from(c.gen) << 32) | slot as u64;
                        self.draining.insert(
                            data,
                            (sock, now + self.sh.timeout.max(Duration::from_secs(1))),
                        );
                    }
                    _ => {}
                }
            }
        }
        self.next(slot, now);
    }

    /// An event for a replaced socket: a draining one reads to its end.
    fn drain(&mut self, data: u64) {
        let Some((sock, _)) = self.draining.get_mut(&data) else {
            return;
        };
        loop {
            match sock.read(&mut self.buf) {
                Ok(n) if n > 0 => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                _ => {
                    self.draining.remove(&data);
                    return;
                }
            }
        }
    }

    fn io_error(&mut self, slot: usize, e: &io::Error) {
        match classify(e) {
            Kind::Reset => self.closed_early(slot, Kind::Reset),
            k => self.fail(slot, k),
        }
    }

    fn fail(&mut self, slot: usize, kind: Kind) {
        let e = &mut self.out.errors;
        match kind {
            Kind::Connect => e.connect += 1,
            Kind::Reset => e.reset += 1,
            Kind::Timeout => e.timeout += 1,
            Kind::Other => e.other += 1,
        }
        self.active -= 1;
        let c = &mut self.conns[slot];
        if self.sh.record {
            let now = Instant::now();
            self.out.samples.push(super::Sample {
                start_us: micros(c.t0.unwrap_or(now).saturating_duration_since(self.sh.start)),
                done_us: micros(now.saturating_duration_since(self.sh.start)),
                ok: false,
            });
        }
        c.sock = None;
        c.served = 0;
        c.st = St::Free;
        // A new generation: events still queued for the closed socket are ignored.
        c.gen = c.gen.wrapping_add(1);
        self.next(slot, Instant::now());
    }

    /// Queues `slot`'s next request: now (closed loop) or at its intended time (open loop).
    fn next(&mut self, slot: usize, now: Instant) {
        let t = self.conns[slot].next_send;
        if self.sh.interval.is_some() && t > now {
            self.timers.push(Reverse((t, slot)));
        } else {
            self.ready.push(slot);
        }
    }

    /// Fails the requests past their timeout and gives up on slow draining sockets.
    fn expire(&mut self, now: Instant) {
        for slot in 0..self.conns.len() {
            let c = &self.conns[slot];
            if c.st != St::Free && now >= c.deadline {
                self.fail(slot, Kind::Timeout);
            }
        }
        self.draining.retain(|_, (_, until)| *until > now);
    }
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

fn classify(e: &io::Error) -> Kind {
    match e.raw_os_error() {
        Some(libc::ECONNRESET | libc::EPIPE | libc::ECONNABORTED) => Kind::Reset,
        Some(libc::ETIMEDOUT) => Kind::Timeout,
        _ => Kind::Other,
    }
}

/// Whether the kernel has `epoll_pwait2` (nanosecond timeouts, Linux 5.11).
static PWAIT2: AtomicBool = AtomicBool::new(true);

/// Waits up to `timeout` for events; returns how many were written to `events`.
fn epoll_wait(ep: &OwnedFd, events: &mut [libc::epoll_event], timeout: Duration) -> Result<usize> {
    let max = events.len().min(i32::MAX as usize) as libc::c_int;
    loop {
        let r = if PWAIT2.load(Ordering::Relaxed) {
            let ts = libc::timespec {
                tv_sec: timeout.as_secs().min(i32::MAX as u64) as libc::time_t,
                tv_nsec: timeout.subsec_nanos() as libc::c_long,
            };
            // SAFETY: `events` has room for `max` entries, `ts` outlives the call, and a null
            // signal mask leaves the mask alone.
            let r = unsafe {
                libc::syscall(
                    libc::SYS_epoll_pwait2,
                    ep.as_raw_fd(),
                    events.as_mut_ptr(),
                    max,
                    &ts as *const libc::timespec,
                    std::ptr::null::<libc::sigset_t>(),
                    0usize,
                )
            };
            if r < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::ENOSYS) {
                PWAIT2.store(false, Ordering::Relaxed);
                continue;
            }
            r as i64
        } else {
            // Round up: waking early would spin.
            let ms = timeout.as_nanos().div_ceil(1_000_000).min(i32::MAX as u128) as libc::c_int;
            // SAFETY: `events` has room for `max` entries.
            (unsafe { libc::epoll_wait(ep.as_raw_fd(), events.as_mut_ptr(), max, ms) }) as i64
        };
        if r >= 0 {
            return Ok(r as usize);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e.into());
        }
    }
}
