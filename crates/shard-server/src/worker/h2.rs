//! HTTP/2 connections (`http2 on`, `listen ... http2`): the `h2` crate's server state
//! machine, driven from the worker's loop without a runtime.
//!
//! A connection that negotiated `h2` (ALPN) or began with the HTTP/2 preface (`h2c`, as
//! nginx: prior knowledge on a plain listener) becomes a *session*: its socket's bytes go
//! through an in-memory reader/writer ([`MemIo`]) that `h2` polls with a no-op waker, so
//! the loop re-polls after every event (socket readable, a stream wrote, a stream ended).
//! Each stream is carried by a *stream connection* of its own in `Worker::conns`: no socket,
//! its input the HTTP/1.1 head its HEADERS say (and its DATA, framed as the head says), its
//! output parsed back into HEADERS and DATA frames ([`Stream::send`]). So every phase, the
//! proxy, static files, error pages and the access log run per stream exactly as for
//! HTTP/1.1, on the request (`conn::Req`) the stream connection holds.
//!
//! This module owns the sessions (`Worker::h2`) and the translation both ways; it does not
//! own the phases, the socket's TLS, or closing connections (the loop's `close`).

use std::cell::RefCell;
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

use bytes::{Buf, Bytes, BytesMut};
use shard_http::body::ChunkedDecoder;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::conn::{Conn, Phase};
use super::Worker;

/// `Conn::h2` of a connection that carries a session (its index + 1 in the low bits).
pub(super) const H2_SESSION: u32 = 1 << 30;
/// `Conn::h2` of a stream connection.
pub(super) const H2_STREAM: u32 = 1 << 31;
const INDEX_MASK: u32 = H2_SESSION - 1;

/// Bytes of frames a session holds for its socket before its streams' writes wait: the
/// bound on what a client that does not read costs, whatever its windows say.
const SESSION_OUT_MAX: usize = 256 * 1024;
/// Bytes a stream may hand `h2` beyond the capacity granted to it, so that a small response
/// leaves in the pass that made it (the client's windows start at 64 KiB).
const UNRESERVED_BYTES: usize = 16 * 1024;
/// A stream's request body bytes waiting in its connection's input before more DATA is taken
/// from `h2` (the window the client sees stays closed meanwhile).
const STREAM_INPUT_MAX: usize = 64 * 1024;
/// A response head longer than this, from our own phases or an upstream, fails its stream.
const RESPONSE_HEAD_MAX: usize = 64 * 1024;
/// Streams the client resets within [`RESET_WINDOW_MS`] before the session is ended with
/// `ENHANCE_YOUR_CALM` (rapid reset, CVE-2023-44487), as a multiple of
/// `http2_max_concurrent_streams`.
const RESETS_PER_WINDOW: u32 = 2;
const RESET_WINDOW_MS: u64 = 1_000;
/// nginx's flood rule (`ngx_http_v2_read_handler`): a client whose bytes are more than 8
/// times what its requests carry, past this allowance, is sending control frames for their
/// own sake (PING, SETTINGS, PRIORITY, WINDOW_UPDATE, empty frames): the connection ends.
const FLOOD_ALLOWANCE: u64 = 1 << 20;
/// Rounds of read, poll and write one drive of a session makes before it yields.
const SESSION_ROUNDS_MAX: usize = 16;

/// The in-memory socket `h2` reads and writes.
#[derive(Default)]
struct Pipe {
    input: BytesMut,
    output: Vec<u8>,
}

#[derive(Clone)]
struct MemIo(Rc<RefCell<Pipe>>);

impl AsyncRead for MemIo {
    fn poll_read(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let mut p = self.0.borrow_mut();
        if p.input.is_empty() {
            // The loop polls again when the socket has more.
            return Poll::Pending;
        }
        let n = p.input.len().min(buf.remaining());
        buf.put_slice(&p.input[..n]);
        p.input.advance(n);
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for MemIo {
    fn poll_write(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        b: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let mut p = self.0.borrow_mut();
        // Full: `h2` stops reading frames until its answers (PING, SETTINGS acks) can go,
        // which bounds what a flood costs.
        if p.output.len() >= SESSION_OUT_MAX {
            return Poll::Pending;
        }
        p.output.extend_from_slice(b);
        Poll::Ready(Ok(b.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

type Handshake = h2::server::Handshake<MemIo, Bytes>;
type H2Conn = h2::server::Connection<MemIo, Bytes>;

enum State {
    Handshaking(Pin<Box<Handshake>>),
    Open(Box<H2Conn>),
    Done,
}

/// One HTTP/2 connection.
pub(super) struct Session {
    /// The socket's connection.
    key: usize,
    io: Rc<RefCell<Pipe>>,
    state: State,
    /// Its streams, by their connections' keys.
    streams: HashMap<usize, Stream, foldhash::fast::RandomState>,
    /// Stream connections to drive in this round.
    ready: Vec<usize>,
    /// A drive of this session is on the stack: a stream that ends asks for no other.
    in_drive: bool,
    /// `h2` for TLS, `h2c` for plain (`$http2`).
    tls: bool,
    max_streams: u32,
    resets: u32,
    resets_since_ms: u64,
    /// The loop asked it to end (reload, stop, `keepalive_requests`, `keepalive_time`):
    /// `GOAWAY` was sent.
    going_away: bool,
    /// Streams taken so far, and the default server's `keepalive_requests` and
    /// `keepalive_time`, which end the session as nginx ends an HTTP/2 connection.
    taken: u64,
    keepalive_requests: u64,
    keepalive_time_ms: u64,
    /// Bytes read from the client, and the part of them that was requests (header blocks as
    /// their HTTP/1.1 heads, body data): nginx's flood rule compares the two.
    total_bytes: u64,
    payload_bytes: u64,
    /// Ended and written: the write side is shut and input is read and dropped until the
    /// client closes or this time, so that the client reads every answer rather than a reset
    /// (nginx's lingering close of an HTTP/2 connection). 0 while open.
    lingering_until_ms: u64,
    lingering: shard_config::Lingering,
}

/// The response side of a stream's output, parsed from the HTTP/1.1 bytes its connection
/// writes.
enum Out {
    /// Gathering the head.
    Head(Vec<u8>),
    Length(u64),
    Chunked(ChunkedDecoder),
    /// Neither length nor chunks: the body ends when the stream connection closes.
    UntilClose,
    /// Sent whole (or there is no body): what else comes is dropped.
    Done,
}

struct Stream {
    respond: Option<h2::server::SendResponse<Bytes>>,
    send: Option<h2::SendStream<Bytes>>,
    recv: Option<h2::RecvStream>,
    /// The request body is framed as chunks in the head given to the stream connection.
    chunked_in: bool,
    /// A `HEAD` request: the response has no body whatever its head says.
    head_only: bool,
    out: Out,
    /// Bytes still allowed beyond granted capacity ([`UNRESERVED_BYTES`]).
    unreserved: usize,
    /// The stream connection waits for window (its last write was refused).
    blocked: bool,
}

impl Session {
    fn conn(&mut self) -> Option<&mut H2Conn> {
        match &mut self.state {
            State::Open(c) => Some(c),
            _ => None,
        }
    }
}

/// `Conn::h2` of the session at `idx` or a stream of it.
fn tag(flag: u32, idx: usize) -> u32 {
    flag | (idx as u32 + 1)
}

/// The session index in a `Conn::h2`.
pub(super) fn session_of(h2: u32) -> Option<usize> {
    let i = h2 & INDEX_MASK;
    (i != 0).then(|| (i - 1) as usize)
}

fn now_cx() -> Context<'static> {
    Context::from_waker(Waker::noop())
}

/// The HTTP/1.1 head a stream's request is given to the phases as: nginx's own mapping of
/// the pseudo-headers (`:authority` as `Host` when there is none), cookies joined with "; "
/// (RFC 9113, 8.2.3), and a body framed by its `content-length` or as chunks.
fn request_head(parts: &http::request::Parts, end_stream: bool, chunked: &mut bool) -> Vec<u8> {
    let mut h = Vec::with_capacity(256);
    h.extend_from_slice(parts.method.as_str().as_bytes());
    h.push(b' ');
    let target = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    h.extend_from_slice(if target.is_empty() {
        b"/"
    } else {
        target.as_bytes()
    });
    h.extend_from_slice(b" HTTP/1.1\r\n");
    let has_host = parts.headers.contains_key(http::header::HOST);
    if let (false, Some(a)) = (has_host, parts.uri.authority()) {
        h.extend_from_slice(b"Host: ");
        h.extend_from_slice(a.as_str().as_bytes());
        h.extend_from_slice(b"\r\n");
    }
    let mut cookies: Vec<&[u8]> = Vec::new();
    let mut length = false;
    for (name, value) in &parts.headers {
        if name == http::header::COOKIE {
            cookies.push(value.as_bytes());
            continue;
        }
        // Connection-specific fields are malformed in HTTP/2 (`h2` refuses them); `te`
        // may only say `trailers`, which means nothing to HTTP/1.1 here.
        if name == http::header::TE {
            continue;
        }
        if name == http::header::CONTENT_LENGTH {
            length = true;
        }
        h.extend_from_slice(name.as_str().as_bytes());
        h.extend_from_slice(b": ");
        h.extend_from_slice(value.as_bytes());
        h.extend_from_slice(b"\r\n");
    }
    if !cookies.is_empty() {
        h.extend_from_slice(b"Cookie: ");
        for (i, c) in cookies.iter().enumerate() {
            if i > 0 {
                h.extend_from_slice(b"; ");
            }
            h.extend_from_slice(c);
        }
        h.extend_from_slice(b"\r\n");
    }
    if !end_stream && !length {
        h.extend_from_slice(b"Transfer-Encoding: chunked\r\n");
        *chunked = true;
    }
    h.extend_from_slice(b"\r\n");
    h
}

/// Hop-by-hop fields of an HTTP/1.1 response head, which HTTP/2 forbids.
fn hop_by_hop(name: &str) -> bool {
    name.eq_ignore_ascii_case("connection")
        || name.eq_ignore_ascii_case("keep-alive")
        || name.eq_ignore_ascii_case("transfer-encoding")
        || name.eq_ignore_ascii_case("proxy-connection")
        || name.eq_ignore_ascii_case("upgrade")
}

impl Stream {
    /// Takes HTTP/1.1 response bytes from the stream connection: `Ok(n)` of `buf` taken,
    /// `WouldBlock` while the stream's window (or the session's output) is full.
    fn send(&mut self, buf: &[u8], session_out: usize) -> std::io::Result<usize> {
        use std::io::{Error, ErrorKind};
        let gone = || Error::from(ErrorKind::BrokenPipe);
        match &mut self.out {
            Out::Head(acc) => {
                let before = acc.len();
                let take = buf
                    .len()
                    .min(RESPONSE_HEAD_MAX + 4 - before.min(RESPONSE_HEAD_MAX));
                acc.extend_from_slice(&buf[..take]);
                let Some(end) = memchr::memmem::find(acc, b"\r\n\r\n") else {
                    if acc.len() > RESPONSE_HEAD_MAX {
                        return Err(Error::new(ErrorKind::InvalidData, "response head too long"));
                    }
                    return Ok(take);
                };
                let head_len = end + 4;
                let used = head_len - before;
                let head = std::mem::take(acc);
                self.begin(&head[..head_len])?;
                Ok(used)
            }
            Out::Done => Ok(buf.len()),
            _ => {
                if session_out >= SESSION_OUT_MAX {
                    self.blocked = true;
                    return Err(ErrorKind::WouldBlock.into());
                }
                let send = self.send.as_mut().ok_or_else(gone)?;
                let want = buf.len().min(SESSION_OUT_MAX);
                send.reserve_capacity(want);
                let mut room = send.capacity();
                if room == 0 {
                    room = self.unreserved.min(want);
                    self.unreserved -= room;
                }
                if room == 0 {
                    self.blocked = true;
                    return Err(ErrorKind::WouldBlock.into());
                }
                let (used, data, end) = match &mut self.out {
                    Out::Length(left) => {
                        let n = (room as u64).min(*left).min(buf.len() as u64) as usize;
                        *left -= n as u64;
                        (n, Bytes::copy_from_slice(&buf[..n]), *left == 0)
                    }
                    Out::Chunked(dec) => {
                        let mut data = Vec::new();
                        let f = dec
                            .feed_into(&buf[..room.min(buf.len())], &mut data)
                            .map_err(|_| Error::new(ErrorKind::InvalidData, "bad chunks"))?;
                        (f.consumed, Bytes::from(data), dec.is_done())
                    }
                    _ => {
                        let n = room.min(buf.len());
                        (n, Bytes::copy_from_slice(&buf[..n]), false)
                    }
                };
                if !data.is_empty() || end {
                    send.send_data(data, end).map_err(|_| gone())?;
                }
                if end {
                    self.out = Out::Done;
                }
                Ok(used)
            }
        }
    }

    /// The response head is whole: HEADERS go out, and the body's framing is known.
    fn begin(&mut self, head: &[u8]) -> std::io::Result<()> {
        use std::io::{Error, ErrorKind};
        let mut fields = [httparse::EMPTY_HEADER; 128];
        let mut r = httparse::Response::new(&mut fields);
        let bad = || Error::new(ErrorKind::InvalidData, "response head");
        match r.parse(head) {
            Ok(httparse::Status::Complete(_)) => {}
            _ => return Err(bad()),
        }
        let status = r.code.ok_or_else(bad)?;
        if (100..200).contains(&status) {
            // `100 Continue`: HTTP/2 clients send their body without waiting for it.
            self.out = Out::Head(Vec::new());
            return Ok(());
        }
        let mut resp = http::Response::builder().status(status);
        let mut length: Option<u64> = None;
        let mut chunked = false;
        for f in r.headers.iter() {
            if f.name.eq_ignore_ascii_case("transfer-encoding") {
                chunked = true;
            }
            if hop_by_hop(f.name) {
                continue;
            }
            if f.name.eq_ignore_ascii_case("content-length") {
                length = std::str::from_utf8(f.value)
                    .ok()
                    .and_then(|v| v.trim().parse().ok());
            }
            let (Ok(n), Ok(v)) = (
                http::HeaderName::from_bytes(f.name.as_bytes()),
                http::HeaderValue::from_bytes(f.value),
            ) else {
                continue;
            };
            resp = resp.header(n, v);
        }
        let resp = resp.body(()).map_err(|_| bad())?;
        let no_body = self.head_only || status == 204 || status == 304;
        let respond = self.respond.as_mut().ok_or_else(bad)?;
        let end_now = no_body || length == Some(0);
        let send = respond
            .send_response(resp, end_now)
            .map_err(|_| Error::from(ErrorKind::BrokenPipe))?;
        self.respond = None;
        self.out = if end_now {
            Out::Done
        } else if chunked {
            Out::Chunked(ChunkedDecoder::new())
        } else if let Some(n) = length {
            Out::Length(n)
        } else {
            Out::UntilClose
        };
        self.send = Some(send);
        Ok(())
    }

    /// The stream connection closed: the response ends here, whole or cut.
    fn finish(&mut self) {
        match self.out {
            Out::Done => {}
            Out::UntilClose => {
                if let Some(s) = self.send.as_mut() {
                    let _ = s.send_data(Bytes::new(), true);
                }
            }
            _ => {
                if let Some(s) = self.send.as_mut() {
                    s.send_reset(h2::Reason::INTERNAL_ERROR);
                } else if let Some(r) = self.respond.as_mut() {
                    r.send_reset(h2::Reason::INTERNAL_ERROR);
                }
            }
        }
        self.out = Out::Done;
    }
}

impl Worker<'_> {
    /// Whether listener `li` speaks HTTP/2: over TLS when its ALPN chose `h2`, in plain when
    /// the connection begins with the preface.
    pub(super) fn h2_wanted(&self, key: usize) -> bool {
        let c = &self.conns[key];
        if c.h2 != 0 || c.requests != 0 {
            return false;
        }
        let (Some(http), Some(l)) = (self.cfg.http.as_ref(), self.cfg.listeners.get(c.listener))
        else {
            return false;
        };
        match c.tls.as_ref() {
            Some(t) => t.conn.alpn_protocol() == Some(b"h2"),
            None => {
                // "PRI" tells the preface from any method (`PROPFIND`, `PUT`).
                l.http2(http, false)
                    && c.inbuf.len() >= 3
                    && b"PRI * HTTP/2.0\r\n".starts_with(&c.inbuf[..c.inbuf.len().min(16)])
            }
        }
    }

    /// The connection on `key` becomes an HTTP/2 session; what it read so far is the start
    /// of the client's preface.
    pub(super) fn h2_start(&mut self, key: usize) {
        let (Some(http), Some(l)) = (
            self.cfg.http.as_ref(),
            self.cfg.listeners.get(self.conns[key].listener),
        ) else {
            return;
        };
        let srv = &http.servers[l.default_server];
        let conf = srv.http2;
        let limits = srv.large_client_header_buffers;
        let io = Rc::new(RefCell::new(Pipe::default()));
        let c = &mut self.conns[key];
        io.borrow_mut().input.extend_from_slice(&c.inbuf);
        c.inbuf.clear();
        let mut b = h2::server::Builder::new();
        b.max_concurrent_streams(conf.max_concurrent_streams)
            // 0 (nginx: open the window once the body is asked for) is one frame's worth:
            // the window reopens as the stream's body is taken either way.
            .initial_window_size(conf.body_preread_size.max(16_384) as u32)
            .max_frame_size(16_384)
            .max_header_list_size((limits.0 * limits.1).max(4096) as u32)
            .max_send_buffer_size(conf.chunk_size.max(16_384) * 4)
            .max_concurrent_reset_streams(conf.max_concurrent_streams as usize);
        let hs = b.handshake::<MemIo, Bytes>(MemIo(io.clone()));
        let tls = c.tls.is_some();
        let idx = self.h2.insert(Session {
            key,
            io,
            state: State::Handshaking(Box::pin(hs)),
            streams: HashMap::default(),
            ready: Vec::new(),
            in_drive: false,
            tls,
            max_streams: conf.max_concurrent_streams,
            resets: 0,
            resets_since_ms: self.now_ms,
            going_away: false,
            taken: 0,
            total_bytes: 0,
            payload_bytes: 0,
            lingering_until_ms: 0,
            lingering: srv.base.lingering,
            keepalive_requests: srv.base.keepalive_requests,
            keepalive_time_ms: srv.base.keepalive_time_ms,
        });
        let c = &mut self.conns[key];
        c.h2 = tag(H2_SESSION, idx);
        // The connection carries no request of its own any more.
        if let Some(r) = c.req.take() {
            self.give_req(r);
        }
        self.set_phase(key, Phase::Waiting);
    }

    /// Runs a session: reads its socket, lets `h2` make and end streams, drives the streams
    /// that can go on, and writes what `h2` framed. The one step of a session connection.
    pub(super) fn h2_drive(&mut self, key: usize) -> super::step::Io {
        use super::step::Io;
        let Some(idx) = session_of(self.conns[key].h2) else {
            return Io::Close;
        };
        if self.h2[idx].in_drive {
            return Io::Wait;
        }
        self.h2[idx].in_drive = true;
        let io = self.h2_rounds(key, idx);
        if let Some(s) = self.h2.get_mut(idx) {
            s.in_drive = false;
        }
        io
    }

    fn h2_rounds(&mut self, key: usize, idx: usize) -> super::step::Io {
        use super::step::Io;
        if self.h2[idx].lingering_until_ms != 0 {
            return self.h2_linger(key, idx);
        }
        let read_max = self
            .cfg
            .http
            .as_ref()
            .and_then(|h| {
                let l = self.cfg.listeners.get(self.conns[key].listener)?;
                Some(h.servers[l.default_server].http2.recv_buffer_size)
            })
            .unwrap_or(256 * 1024);
        for _ in 0..SESSION_ROUNDS_MAX {
            let mut progress = false;
            // Read what the socket has, up to what `h2` has taken.
            let pending_in = self.h2[idx].io.borrow().input.len();
            if self.conns[key].readable && pending_in < read_max {
                // A pool buffer for the read: an idle session keeps none.
                let mut buf = self.take_buf(16 * 1024);
                let c = &mut self.conns[key];
                let spare = (buf.capacity() - buf.len()).min(read_max - pending_in);
                match c.recv(&mut buf, spare) {
                    Ok(0) => {
                        c.eof = true;
                        self.give_buf(buf);
                        return Io::Close;
                    }
                    Ok(n) => {
                        if n < spare && !c.hup {
                            c.readable = false;
                        }
                        let s = &mut self.h2[idx];
                        s.io.borrow_mut().input.extend_from_slice(&buf);
                        s.total_bytes += n as u64;
                        progress = true;
                        if s.total_bytes / 8 > s.payload_bytes + FLOOD_ALLOWANCE {
                            self.give_buf(buf);
                            crate::log!(
                                Info,
                                "http2 flood detected{}",
                                self.log_context(key, None)
                            );
                            if let Some(conn) = self.h2[idx].conn() {
                                conn.abrupt_shutdown(h2::Reason::NO_ERROR);
                            }
                            let _ = self.h2_poll(key, idx);
                            let _ = self.h2_write(key, idx);
                            return Io::Close;
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => c.readable = false,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(_) => {
                        self.give_buf(buf);
                        return Io::Close;
                    }
                }
                self.give_buf(buf);
            }
            match self.h2_poll(key, idx) {
                Ok(p) => progress |= p,
                Err(()) => {
                    // Whatever `h2` said last (GOAWAY) still goes out.
                    let _ = self.h2_write(key, idx);
                    return Io::Close;
                }
            }
            let ready = std::mem::take(&mut self.h2[idx].ready);
            for s in ready {
                progress = true;
                self.drive(s);
            }
            if self.h2_poll(key, idx).is_err() {
                let _ = self.h2_write(key, idx);
                return Io::Close;
            }
            let before = self.h2[idx].io.borrow().output.len();
            match self.h2_write(key, idx) {
                Io::Close => return Io::Close,
                // Frames left: the socket's next edge drives the session again.
                Io::Wait => {}
                // Written: blocked streams may have window again.
                Io::Ready => progress |= before > 0,
            }
            if !progress && self.h2[idx].ready.is_empty() {
                break;
            }
        }
        {
            // What `h2` took and what went out leaves no room behind.
            let mut p = self.h2[idx].io.borrow_mut();
            if p.input.is_empty() && p.input.capacity() > 0 {
                p.input = BytesMut::new();
            }
            if p.output.is_empty() && p.output.capacity() > 0 {
                p.output = Vec::new();
            }
        }
        if self.conns[key].out.is_empty() {
            let out = std::mem::take(&mut self.conns[key].out);
            self.conns[key].out_pos = 0;
            self.give_buf(out);
        }
        let s = &self.h2[idx];
        let idle = s.streams.is_empty();
        // A graceful end is h2's two steps (GOAWAY with the largest id and a PING, then, once
        // the PING comes back, GOAWAY with the last stream taken): the streams a client sent
        // in between are answered, so it is over when h2 says so. An idle session that never
        // gets there runs into `keepalive_timeout` below.
        let done = matches!(s.state, State::Done);
        let c = &mut self.conns[key];
        if done && c.out.is_empty() && self.h2[idx].io.borrow().output.is_empty() {
            // FIN after the last frame, then read and drop what still comes: closing with
            // unread input would reset the connection and could destroy answers in flight.
            let fd = super::conn::fd_of(&c.fd);
            match c.tls.as_mut() {
                Some(t) => super::relay::Endpoint::shut(&mut super::tls::TlsSide { fd, t }),
                None => shard_event::sock::shutdown_write(fd),
            }
            let s = &mut self.h2[idx];
            s.lingering_until_ms = self.now_ms + s.lingering.time_ms.max(1);
            return self.h2_linger(key, idx);
        }
        if idle {
            let ka = self.cfg.http.as_ref().map_or(75_000, |h| {
                h.servers
                    .get(
                        self.cfg
                            .listeners
                            .get(c.listener)
                            .map_or(0, |l| l.default_server),
                    )
                    .map_or(75_000, |s| s.base.keepalive_timeout_ms)
            });
            c.deadline_ms = self.now_ms + ka;
        } else {
            c.deadline_ms = u64::MAX;
        }
        if !self.conns[key].readable || !self.conns[key].writable {
            self.ensure_registered(key);
        }
        Io::Wait
    }

    /// A session's lingering close: input is read and dropped until the client closes (then
    /// `Close`) or the lingering deadline (the loop's timer closes it).
    fn h2_linger(&mut self, key: usize, idx: usize) -> super::step::Io {
        use super::step::Io;
        let mut buf = self.take_buf(16 * 1024);
        let c = &mut self.conns[key];
        let res = loop {
            if !c.readable {
                break Io::Wait;
            }
            buf.clear();
            let spare = buf.capacity();
            match c.recv(&mut buf, spare) {
                Ok(0) => break Io::Close,
                Ok(n) if n < spare && !c.hup => c.readable = false,
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => c.readable = false,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => break Io::Close,
            }
        };
        self.give_buf(buf);
        if let Io::Wait = res {
            let s = &self.h2[idx];
            let c = &mut self.conns[key];
            c.deadline_ms = (self.now_ms + s.lingering.timeout_ms).min(s.lingering_until_ms);
            self.ensure_registered(key);
        }
        res
    }

    /// Polls `h2`: the handshake, new streams, request body data, resets, window updates.
    /// `Ok(true)` when something happened; `Err` when the session is over.
    fn h2_poll(&mut self, key: usize, idx: usize) -> Result<bool, ()> {
        let mut cx = now_cx();
        let mut progress = false;
        let s = &mut self.h2[idx];
        if let State::Handshaking(hs) = &mut s.state {
            match hs.as_mut().poll(&mut cx) {
                Poll::Pending => return Ok(false),
                Poll::Ready(Ok(conn)) => {
                    s.state = State::Open(Box::new(conn));
                    progress = true;
                }
                Poll::Ready(Err(e)) => {
                    crate::log!(
                        Info,
                        "client sent invalid HTTP/2 preface ({e}){}",
                        self.log_context(key, None)
                    );
                    self.h2[idx].state = State::Done;
                    return Err(());
                }
            }
        }
        // New streams.
        loop {
            let s = &mut self.h2[idx];
            let Some(conn) = s.conn() else {
                break;
            };
            match conn.poll_accept(&mut cx) {
                Poll::Pending => break,
                Poll::Ready(None) => {
                    s.state = State::Done;
                    break;
                }
                Poll::Ready(Some(Err(e))) => {
                    if e.is_io() || e.is_go_away() || e.reason().is_some() {
                        crate::log!(
                            Info,
                            "client HTTP/2 connection error: {e}{}",
                            self.log_context(key, None)
                        );
                    }
                    self.h2[idx].state = State::Done;
                    return Err(());
                }
                Poll::Ready(Some(Ok((req, respond)))) => {
                    progress = true;
                    self.h2_stream(key, idx, req, respond);
                    // nginx's `keepalive_requests` and `keepalive_time` for HTTP/2: the
                    // connection takes no more streams (GOAWAY), those it has finish.
                    let opened = self.conns[key].opened_ms;
                    let s = &mut self.h2[idx];
                    s.taken += 1;
                    let aged = self.now_ms.saturating_sub(opened) >= s.keepalive_time_ms;
                    if !s.going_away && (s.taken >= s.keepalive_requests || aged) {
                        s.going_away = true;
                        if let Some(conn) = s.conn() {
                            conn.graceful_shutdown();
                        }
                    }
                }
            }
        }
        // Each stream: resets, body data, window.
        let keys: Vec<usize> = self.h2[idx].streams.keys().copied().collect();
        for sk in keys {
            let room = self
                .conns
                .get(sk)
                .map_or(0, |c| STREAM_INPUT_MAX.saturating_sub(c.inbuf.len()));
            let Some(st) = self.h2[idx].streams.get_mut(&sk) else {
                continue;
            };
            let reset = match (&mut st.respond, &mut st.send) {
                (Some(r), _) => matches!(r.poll_reset(&mut cx), Poll::Ready(_)),
                (None, Some(s)) => matches!(s.poll_reset(&mut cx), Poll::Ready(_)),
                _ => false,
            };
            if reset {
                progress = true;
                self.h2_reset_by_client(key, idx, sk);
                continue;
            }
            let mut data: Vec<u8> = Vec::new();
            let mut payload = 0u64;
            let mut ended = false;
            let mut failed = false;
            if let Some(recv) = st.recv.as_mut() {
                while data.len() < room {
                    match recv.poll_data(&mut cx) {
                        Poll::Pending => break,
                        Poll::Ready(None) => {
                            ended = true;
                            break;
                        }
                        Poll::Ready(Some(Ok(b))) => {
                            let _ = recv.flow_control().release_capacity(b.len());
                            payload += b.len() as u64;
                            if st.chunked_in && !b.is_empty() {
                                data.extend_from_slice(format!("{:x}\r\n", b.len()).as_bytes());
                                data.extend_from_slice(&b);
                                data.extend_from_slice(b"\r\n");
                            } else {
                                data.extend_from_slice(&b);
                            }
                        }
                        Poll::Ready(Some(Err(_))) => {
                            failed = true;
                            break;
                        }
                    }
                }
            }
            self.h2[idx].payload_bytes += payload;
            let Some(st) = self.h2[idx].streams.get_mut(&sk) else {
                continue;
            };
            if ended {
                st.recv = None;
                if st.chunked_in {
                    data.extend_from_slice(b"0\r\n\r\n");
                }
            }
            if st.blocked {
                if let Some(send) = st.send.as_mut() {
                    if matches!(send.poll_capacity(&mut cx), Poll::Ready(Some(Ok(n))) if n > 0)
                        || send.capacity() > 0
                    {
                        st.blocked = false;
                        st.unreserved = UNRESERVED_BYTES;
                    }
                }
                if !st.blocked && self.h2[idx].io.borrow().output.len() < SESSION_OUT_MAX {
                    if let Some(c) = self.conns.get_mut(sk) {
                        c.writable = true;
                    }
                    self.h2[idx].ready.push(sk);
                    progress = true;
                } else {
                    if let Some(s) = self.h2[idx].streams.get_mut(&sk) {
                        s.blocked = true;
                    }
                }
            }
            if failed {
                progress = true;
                self.h2_reset_by_client(key, idx, sk);
                continue;
            }
            if !data.is_empty() {
                progress = true;
                if let Some(c) = self.conns.get_mut(sk) {
                    c.inbuf.extend_from_slice(&data);
                }
                self.h2[idx].ready.push(sk);
            }
        }
        // Frames queued by the streams (and `h2`'s own) into the pipe.
        if let Some(conn) = self.h2[idx].conn() {
            if let Poll::Ready(Some(Err(_))) = conn.poll_accept(&mut cx) {
                self.h2[idx].state = State::Done;
                return Err(());
            }
        }
        Ok(progress)
    }

    /// A stream the client reset (or whose body failed): its connection closes now, freeing
    /// its request, its upstream connection and its buffers; too many in a second end the
    /// session (rapid reset).
    fn h2_reset_by_client(&mut self, key: usize, idx: usize, sk: usize) {
        if let Some(mut st) = self.h2[idx].streams.remove(&sk) {
            st.out = Out::Done;
        }
        self.close(sk);
        let s = &mut self.h2[idx];
        if self.now_ms.saturating_sub(s.resets_since_ms) > RESET_WINDOW_MS {
            s.resets = 0;
            s.resets_since_ms = self.now_ms;
        }
        s.resets += 1;
        if s.resets > RESETS_PER_WINDOW * s.max_streams {
            let n = s.resets;
            crate::log!(
                Info,
                "client reset too many HTTP/2 streams ({n} in {RESET_WINDOW_MS} ms), closing connection{}",
                self.log_context(key, None)
            );
            if let Some(conn) = self.h2[idx].conn() {
                conn.abrupt_shutdown(h2::Reason::ENHANCE_YOUR_CALM);
            }
        }
    }

    /// A new stream: its connection, and the HTTP/1.1 head of its request as its input.
    fn h2_stream(
        &mut self,
        key: usize,
        idx: usize,
        req: http::Request<h2::RecvStream>,
        respond: h2::server::SendResponse<Bytes>,
    ) {
        let (parts, recv) = req.into_parts();
        let end = recv.is_end_stream();
        let mut chunked = false;
        let head = request_head(&parts, end, &mut chunked);
        self.h2[idx].payload_bytes += head.len() as u64;
        let head_only = parts.method == http::Method::HEAD;
        let parent = &self.conns[key];
        let (peer, listener, number) = (parent.peer, parent.listener, parent.number);
        let id = self.next_conn_id;
        self.next_conn_id += 1;
        let mut c = Conn::new_stream(peer, listener, id, number, self.now_ms);
        c.h2 = tag(H2_STREAM, idx);
        c.proxy_protocol = parent.proxy_protocol.clone();
        let sk = self.conns.insert(c);
        self.start_reading(sk, true);
        let mut inbuf = self.take_buf(head.len().max(4096));
        inbuf.extend_from_slice(&head);
        self.conns[sk].inbuf = inbuf;
        self.h2[idx].streams.insert(
            sk,
            Stream {
                respond: Some(respond),
                send: None,
                recv: (!end).then_some(recv),
                chunked_in: chunked,
                head_only,
                out: Out::Head(Vec::new()),
                unreserved: UNRESERVED_BYTES,
                blocked: false,
            },
        );
        self.h2[idx].ready.push(sk);
    }

    /// Writes the frames `h2` made to the socket.
    fn h2_write(&mut self, key: usize, idx: usize) -> super::step::Io {
        use super::step::Io;
        let c = &mut self.conns[key];
        {
            let mut p = self.h2[idx].io.borrow_mut();
            if !p.output.is_empty() {
                if c.out.is_empty() {
                    std::mem::swap(&mut c.out, &mut p.output);
                    c.out_pos = 0;
                } else {
                    c.out.extend_from_slice(&p.output);
                    p.output.clear();
                }
            }
        }
        // The session's own writes: no request, no file, no `limit_rate`.
        let fd = super::conn::fd_of(&c.fd);
        while c.out_pos < c.out.len() {
            if !c.writable {
                return Io::Wait;
            }
            let res = match c.tls.as_mut() {
                Some(t) => super::tls::write(fd, t, &c.out[c.out_pos..]),
                None => shard_event::sock::write(fd, &c.out[c.out_pos..]),
            };
            match res {
                Ok(n) => {
                    let offered = c.out.len() - c.out_pos;
                    c.out_pos += n;
                    if n < offered && c.tls.is_none() {
                        c.writable = false;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    c.writable = false;
                    return Io::Wait;
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => return Io::Close,
            }
        }
        c.out.clear();
        c.out_pos = 0;
        if let Some(t) = c.tls.as_mut() {
            match super::tls::flush(fd, t) {
                Ok(true) => {}
                Ok(false) => {
                    c.writable = false;
                    return Io::Wait;
                }
                Err(_) => return Io::Close,
            }
        }
        Io::Ready
    }

    /// `send` of a stream connection: its response bytes into frames.
    pub(super) fn h2_send(
        sessions: &mut slab::Slab<Session>,
        h2: u32,
        key: usize,
        buf: &[u8],
    ) -> std::io::Result<usize> {
        let gone = || std::io::Error::from(std::io::ErrorKind::BrokenPipe);
        let s = session_of(h2)
            .and_then(|i| sessions.get_mut(i))
            .ok_or_else(gone)?;
        let out = s.io.borrow().output.len();
        s.streams.get_mut(&key).ok_or_else(gone)?.send(buf, out)
    }

    /// A stream connection closes: its response ends, whole or cut, and its session writes
    /// what that made (unless the session is the one driving it).
    pub(super) fn h2_stream_closed(&mut self, h2: u32, key: usize) {
        let Some(idx) = session_of(h2) else {
            return;
        };
        let Some(s) = self.h2.get_mut(idx) else {
            return;
        };
        if let Some(mut st) = s.streams.remove(&key) {
            st.finish();
        }
        self.h2_stream_moved(h2);
    }

    /// A stream connection ran outside its session's drive (a timer, its upstream, its
    /// end): its session polls `h2` and writes what the stream queued.
    pub(super) fn h2_stream_moved(&mut self, h2: u32) {
        let Some(s) = session_of(h2).and_then(|i| self.h2.get(i)) else {
            return;
        };
        if !s.in_drive {
            let parent = s.key;
            self.drive(parent);
        }
    }

    /// A session connection closes: every stream with it.
    pub(super) fn h2_session_closed(&mut self, h2: u32) {
        let Some(idx) = session_of(h2) else {
            return;
        };
        let Some(s) = self.h2.get_mut(idx) else {
            return;
        };
        s.in_drive = true;
        let keys: Vec<usize> = s.streams.keys().copied().collect();
        for k in keys {
            self.close(k);
        }
        self.h2.remove(idx);
    }

    /// Ends the session on `key` gracefully (reload, stop): `GOAWAY` with the last stream
    /// id; its streams finish, then it closes.
    pub(super) fn h2_go_away(&mut self, key: usize) {
        let Some(idx) = session_of(self.conns[key].h2) else {
            return;
        };
        let s = &mut self.h2[idx];
        if !s.going_away {
            s.going_away = true;
            if let Some(conn) = s.conn() {
                conn.graceful_shutdown();
            }
        }
        self.drive(key);
    }

    /// `$http2`: `h2` or `h2c` for a stream connection, empty otherwise.
    pub(super) fn h2_var(&self, key: usize) -> &'static str {
        let c = &self.conns[key];
        if c.h2 & H2_STREAM == 0 {
            return "";
        }
        match session_of(c.h2).and_then(|i| self.h2.get(i)) {
            Some(s) if s.tls => "h2",
            Some(_) => "h2c",
            None => "",
        }
    }

    /// The TLS of the session a stream connection belongs to (for `$ssl_*`, `$https`).
    pub(super) fn h2_parent(&self, key: usize) -> Option<usize> {
        let c = self.conns.get(key)?;
        if c.h2 & H2_STREAM == 0 {
            return None;
        }
        session_of(c.h2).and_then(|i| self.h2.get(i)).map(|s| s.key)
    }
}
