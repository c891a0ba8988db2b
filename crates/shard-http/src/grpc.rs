//! gRPC's transport to an upstream (`grpc_pass`, as nginx's `ngx_http_grpc_module`): one
//! HTTP/2 connection as a client, one stream at a time, without I/O.
//!
//! The worker's proxy builds an HTTP/1.1 request head as for `proxy_pass` (the `grpc_*`
//! settings in place of the `proxy_*` ones); [`Conn::begin`] turns it into the connection
//! preface (first stream only) and a HEADERS frame, and the body goes out as DATA frames
//! as the upstream's flow-control windows allow ([`Conn::push_body`], [`Conn::end_body`]).
//! What the upstream answers is turned back into an HTTP/1.1 response the proxy reads as
//! any other: its HEADERS as a head, its DATA as chunks, its trailing HEADERS (`grpc-status`)
//! as the last chunk's trailers ([`Conn::feed`]). SETTINGS and PING are acknowledged and
//! WINDOW_UPDATE applied on the way; what must be written waits in [`Conn::out`].
//!
//! A [`Conn`] is the connection's: it lives with the upstream connection, so a kept-alive
//! connection (`keepalive` in its `upstream`) goes on with the next odd stream id and the
//! settings the upstream gave before. This module owns the frames and their order; the
//! sockets, the timeouts and the choice of peer are the worker's.

use crate::h2frame::{self, code, Frame, Reader};
use crate::hpack;

/// HTTP/2's initial flow-control window (RFC 9113, 6.9.2) and the largest one (6.9.1).
const DEFAULT_WINDOW: i64 = 65_535;
const MAX_WINDOW: i64 = (1 << 31) - 1;
/// What we received is given back once this much of our (largest) window is used.
const WINDOW_REFILL: u64 = 1 << 30;
/// The most bytes of one upstream header block (HEADERS and CONTINUATIONs, encoded).
const BLOCK_MAX: usize = 256 * 1024;
/// The highest stream id a connection uses before it is no longer kept.
const STREAM_ID_MAX: u32 = (1 << 31) - 2;

/// SETTINGS identifiers (RFC 9113, 6.5.2).
const ENABLE_PUSH: u16 = 2;
const INITIAL_WINDOW_SIZE: u16 = 4;
const MAX_FRAME_SIZE: u16 = 5;

/// Why a response cannot go on. Before its head reached the client, each is the proxy's
/// 502 (or another peer); after it, the client's response is cut.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// The upstream broke HTTP/2 (or gRPC's use of it); the text is nginx's log wording.
    Protocol(String),
    /// The upstream reset our stream with this code before the response ended.
    Reset(u32),
    /// The upstream's GOAWAY says our stream was not processed.
    GoAway(u32),
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Protocol(s) => f.write_str(s),
            Error::Reset(c) => write!(f, "upstream rejected request with error {c}"),
            Error::GoAway(c) => write!(f, "upstream sent goaway with error {c}"),
        }
    }
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// No stream, or the response head not read yet.
    #[default]
    Head,
    /// The head was read: DATA, then trailers or END_STREAM.
    Body,
    /// END_STREAM came: the response is whole.
    Done,
}

/// The stream of the request in hand.
#[derive(Debug, Default)]
struct Stream {
    id: u32,
    /// What we may still send on it.
    window: i64,
    /// Request body bytes not yet framed (the windows were shut).
    body: Vec<u8>,
    body_end: bool,
    end_sent: bool,
    phase: Phase,
    /// The response's `content-length`, checked against its DATA.
    length: Option<u64>,
    received: u64,
    /// DATA bytes received on the stream and not given back yet.
    unacked: u64,
    /// A RST_STREAM NO_ERROR came after the whole response (the rest of the body is not
    /// wanted); another is an error, as nginx ("frame for closed stream").
    reset: bool,
}

/// One HTTP/2 connection to a gRPC upstream.
#[derive(Debug)]
pub struct Conn {
    reader: Reader,
    decoder: hpack::Decoder,
    /// Frames to write to the upstream, in order.
    pub out: Vec<u8>,
    /// Bytes read from the upstream and not yet cut into frames.
    pub raw: Vec<u8>,
    started: bool,
    next_stream: u32,
    peer_window: i64,
    peer_max_frame: usize,
    /// What we may still send on the connection.
    conn_window: i64,
    /// DATA bytes received on the connection and not given back yet.
    unacked: u64,
    /// The upstream's GOAWAY: no new stream.
    goaway: bool,
    /// A connection error: nothing more on it.
    broken: bool,
    s: Stream,
}

impl Default for Conn {
    fn default() -> Self {
        Self::new()
    }
}

impl Conn {
    pub fn new() -> Conn {
        Conn {
            reader: Reader::new(h2frame::DEFAULT_MAX_FRAME, BLOCK_MAX),
            decoder: hpack::Decoder::new(4096),
            out: Vec::new(),
            raw: Vec::new(),
            started: false,
            next_stream: 1,
            peer_window: DEFAULT_WINDOW,
            peer_max_frame: h2frame::DEFAULT_MAX_FRAME,
            conn_window: DEFAULT_WINDOW,
            unacked: 0,
            goaway: false,
            broken: false,
            s: Stream::default(),
        }
    }

    /// Starts a stream for the HTTP/1.1 request `head` (request line and header lines, as
    /// the proxy wrote them): `:method`, `:scheme` (`https` for `grpcs://`), `:path`,
    /// `:authority` (`authority` unless the head has a `Host`, which then goes as a `host`
    /// field, as nginx), the other fields but the connection's own, and `te: trailers` when
    /// the client asked for trailers. `end_stream`: the request has no body. Fails on a
    /// head that is not a request.
    pub fn begin(
        &mut self,
        head: &[u8],
        authority: &[u8],
        https: bool,
        te_trailers: bool,
        end_stream: bool,
    ) -> Result<(), &'static str> {
        let mut lines = head
            .split(|&b| b == b'\n')
            .map(|l| l.strip_suffix(b"\r").unwrap_or(l));
        let first = lines.next().ok_or("no request line")?;
        let mut parts = first.splitn(3, |&b| b == b' ');
        let method = parts.next().filter(|m| !m.is_empty()).ok_or("no method")?;
        let path = parts.next().filter(|p| !p.is_empty()).ok_or("no path")?;
        let e = hpack::Encoder;
        let mut block = Vec::with_capacity(head.len());
        e.field(b":method", method, &mut block);
        e.field(
            b":scheme",
            if https { b"https" } else { b"http" },
            &mut block,
        );
        e.field(b":path", path, &mut block);
        let mut rest = Vec::new();
        let mut host = false;
        let mut name = Vec::new();
        for line in lines {
            if line.is_empty() {
                break;
            }
            let Some(colon) = memchr::memchr(b':', line) else {
                continue;
            };
            name.clear();
            name.extend(line[..colon].iter().map(u8::to_ascii_lowercase));
            let value = crate::proxy::trim_ows(&line[colon + 1..]);
            match &name[..] {
                b"host" => {
                    host = true;
                    e.field(b"host", value, &mut rest);
                }
                b"connection" | b"keep-alive" | b"proxy-connection" | b"transfer-encoding"
                | b"upgrade" | b"te" | b"expect" => {}
                _ => e.field(&name, value, &mut rest),
            }
        }
        if !host {
            e.field(b":authority", authority, &mut block);
        }
        block.extend_from_slice(&rest);
        if te_trailers {
            e.field(b"te", b"trailers", &mut block);
        }
        if !self.started {
            self.started = true;
            self.out.extend_from_slice(h2frame::PREFACE);
            h2frame::push_settings(
                &mut self.out,
                &[(ENABLE_PUSH, 0), (INITIAL_WINDOW_SIZE, MAX_WINDOW as u32)],
            );
            h2frame::push_window_update(&mut self.out, 0, (MAX_WINDOW - DEFAULT_WINDOW) as u32);
        }
        let id = self.next_stream;
        self.next_stream += 2;
        self.s = Stream {
            id,
            window: self.peer_window,
            body_end: end_stream,
            end_sent: end_stream,
            ..Stream::default()
        };
        h2frame::push_headers(&mut self.out, id, &block, end_stream, self.peer_max_frame);
        Ok(())
    }

    /// Queues request body bytes (`last`: the body ends with them); they go out as the
    /// windows allow.
    pub fn push_body(&mut self, data: &[u8], last: bool) {
        if self.s.end_sent {
            return;
        }
        self.s.body.extend_from_slice(data);
        self.s.body_end |= last;
        self.pump();
    }

    /// The request body is whole: its last DATA frame carries END_STREAM (an empty one when
    /// all of it already went).
    pub fn end_body(&mut self) {
        self.s.body_end = true;
        self.pump();
    }

    /// Request body bytes that wait for the upstream's window.
    pub fn body_waiting(&self) -> usize {
        self.s.body.len()
    }

    /// The whole request, END_STREAM included, is framed (not necessarily written).
    pub fn request_sent(&self) -> bool {
        self.s.end_sent
    }

    /// The response ended (END_STREAM).
    pub fn response_done(&self) -> bool {
        self.s.phase == Phase::Done
    }

    /// The response head was read.
    pub fn head_read(&self) -> bool {
        self.s.phase != Phase::Head
    }

    /// Whether the connection may carry another stream once [`Conn::out`] is written: the
    /// stream ended both ways, no GOAWAY, no error, and stream ids left.
    pub fn reusable(&self) -> bool {
        self.started
            && !self.goaway
            && !self.broken
            && self.s.end_sent
            && self.s.phase == Phase::Done
            && self.s.body.is_empty()
            && self.raw.is_empty()
            && !self.reader.in_block()
            && self.next_stream <= STREAM_ID_MAX
    }

    /// A kept-alive connection with no stream read something: the upstream's control
    /// frames (SETTINGS, its acknowledgement of ours, PING, WINDOW_UPDATE) are answered and
    /// the connection stays, as while a stream is read ([`Conn::feed`]); a GOAWAY, a frame
    /// for the stream that ended, or a broken frame means it is not kept (`false`).
    /// Answers wait in [`Conn::out`].
    pub fn idle_feed(&mut self) -> bool {
        if self.goaway || self.broken || self.s.phase != Phase::Done || !self.s.end_sent {
            return false;
        }
        // The frames a stream reads, with the stream done: a stream's frame is an error
        // there ("frame for closed stream"), and nothing may come out as a response.
        let mut http = Vec::new();
        self.feed(&mut http, 0).is_ok() && http.is_empty() && !self.goaway
    }

    /// Frames what the windows let go of the queued body.
    fn pump(&mut self) {
        let s = &mut self.s;
        while !s.body.is_empty() && !s.end_sent {
            let n = (s.body.len() as i64)
                .min(self.conn_window)
                .min(s.window)
                .min(self.peer_max_frame as i64);
            if n <= 0 {
                return;
            }
            let n = n as usize;
            let last = s.body_end && n == s.body.len();
            h2frame::push_data(&mut self.out, s.id, &s.body[..n], last);
            s.body.drain(..n);
            self.conn_window -= n as i64;
            s.window -= n as i64;
            s.end_sent = last;
        }
        if s.body.is_empty() && s.body_end && !s.end_sent && s.id != 0 {
            h2frame::push_data(&mut self.out, s.id, &[], true);
            s.end_sent = true;
        }
    }

    /// Cuts the frames in [`Conn::raw`] and acts on them: the response goes to `http` as
    /// HTTP/1.1 (a head at most `head_max` bytes long, then chunks, then the last chunk
    /// with the trailers), answers to [`Conn::out`]. Returns at the end of the whole frames
    /// read or of the response.
    pub fn feed(&mut self, http: &mut Vec<u8>, head_max: usize) -> Result<(), Error> {
        let mut pos = 0;
        let res = self.feed_frames(&mut pos, http, head_max);
        self.raw.drain(..pos);
        if res.is_err() {
            self.broken = true;
        } else {
            // A window update or new settings may let more of the body go.
            self.pump();
        }
        res
    }

    fn feed_frames(
        &mut self,
        pos: &mut usize,
        http: &mut Vec<u8>,
        head_max: usize,
    ) -> Result<(), Error> {
        let raw = std::mem::take(&mut self.raw);
        let mut reader = std::mem::replace(&mut self.reader, Reader::new(0, 0));
        let res = self.frames(&mut reader, &raw, pos, http, head_max);
        self.reader = reader;
        self.raw = raw;
        res
    }

    fn frames(
        &mut self,
        reader: &mut Reader,
        raw: &[u8],
        pos: &mut usize,
        http: &mut Vec<u8>,
        head_max: usize,
    ) -> Result<(), Error> {
        let proto = |s: &str| Error::Protocol(s.to_string());
        loop {
            let (frame, used) = match reader.next(&raw[*pos..]) {
                Ok(Some(f)) => f,
                Ok(None) => return Ok(()),
                Err(e) => {
                    return Err(Error::Protocol(format!(
                        "upstream sent invalid http2 frame (error {})",
                        e.0
                    )));
                }
            };
            let mine = |stream: u32| stream == self.s.id && self.s.id != 0;
            let act = match frame {
                Frame::Settings { ack: false, params } => {
                    for (id, v) in params {
                        match id {
                            INITIAL_WINDOW_SIZE => {
                                if i64::from(v) > MAX_WINDOW {
                                    break;
                                }
                                let delta = i64::from(v) - self.peer_window;
                                self.peer_window = i64::from(v);
                                self.s.window += delta;
                            }
                            MAX_FRAME_SIZE if (16_384..=16_777_215).contains(&v) => {
                                self.peer_max_frame = v as usize;
                            }
                            _ => {}
                        }
                    }
                    h2frame::push_settings_ack(&mut self.out);
                    Ok(())
                }
                Frame::Ping { ack: false, data } => {
                    h2frame::push_ping_ack(&mut self.out, &data);
                    Ok(())
                }
                Frame::WindowUpdate { stream, increment } => {
                    if stream == 0 {
                        self.conn_window += i64::from(increment);
                        if self.conn_window > MAX_WINDOW {
                            Err(proto(
                                "upstream sent too large http2 connection window update",
                            ))
                        } else {
                            Ok(())
                        }
                    } else if mine(stream) {
                        self.s.window += i64::from(increment);
                        if self.s.window > MAX_WINDOW {
                            Err(proto("upstream sent too large http2 stream window update"))
                        } else {
                            Ok(())
                        }
                    } else {
                        Ok(())
                    }
                }
                Frame::GoAway { last_stream, code } => {
                    self.goaway = true;
                    if self.s.id != 0 && last_stream < self.s.id && self.s.phase != Phase::Done {
                        Err(Error::GoAway(code))
                    } else {
                        Ok(())
                    }
                }
                Frame::RstStream { stream, code } if mine(stream) => {
                    if self.s.phase == Phase::Done && code == code::NO_ERROR && !self.s.reset {
                        // After a whole response: the rest of the body is not wanted.
                        self.s.reset = true;
                        self.s.body.clear();
                        self.s.end_sent = true;
                        Ok(())
                    } else if self.s.reset && code == code::STREAM_CLOSED {
                        // Our DATA that crossed the first reset, refused: expected.
                        Ok(())
                    } else if self.s.reset {
                        Err(proto("upstream sent frame for closed stream"))
                    } else {
                        Err(Error::Reset(code))
                    }
                }
                Frame::Headers {
                    stream,
                    block,
                    end_stream,
                } if mine(stream) => self.headers(block, end_stream, http, head_max),
                Frame::Data {
                    stream,
                    data,
                    end_stream,
                    flow_len,
                } => {
                    self.unacked += flow_len as u64;
                    if mine(stream) {
                        self.data(data, end_stream, flow_len, http)
                    } else {
                        Ok(())
                    }
                }
                Frame::Headers { .. } => Err(proto("upstream sent frame for unknown stream")),
                _ => Ok(()),
            };
            *pos += used;
            act?;
            if self.unacked >= WINDOW_REFILL {
                h2frame::push_window_update(&mut self.out, 0, self.unacked as u32);
                self.unacked = 0;
            }
        }
    }

    fn headers(
        &mut self,
        block: &[u8],
        end_stream: bool,
        http: &mut Vec<u8>,
        head_max: usize,
    ) -> Result<(), Error> {
        let proto = |s: &str| Error::Protocol(s.to_string());
        match self.s.phase {
            Phase::Head => {
                let start = http.len();
                let mut status = None;
                let mut bad = None;
                let mut length = None;
                http.extend_from_slice(b"HTTP/1.1 ");
                let line_end = http.len();
                let res = self.decoder.decode(block, head_max, |n, v| {
                    if n == b":status" {
                        status = std::str::from_utf8(v)
                            .ok()
                            .filter(|s| s.len() == 3)
                            .and_then(|s| s.parse::<u16>().ok())
                            .filter(|s| (100..1000).contains(s));
                        if status.is_none() {
                            bad = Some("upstream sent invalid :status header");
                        }
                        return;
                    }
                    if !valid_field(n, v) {
                        bad = Some("upstream sent invalid header");
                        return;
                    }
                    if n == b"content-length" {
                        length = crate::proxy::parse_length(v);
                        return;
                    }
                    if n == b"connection" || n == b"transfer-encoding" {
                        return;
                    }
                    http.extend_from_slice(n);
                    http.extend_from_slice(b": ");
                    http.extend_from_slice(v);
                    http.extend_from_slice(b"\r\n");
                });
                if res.is_err() {
                    http.truncate(start);
                    return Err(proto("upstream sent invalid http2 table index"));
                }
                if let Some(b) = bad {
                    http.truncate(start);
                    return Err(proto(b));
                }
                let Some(status) = status else {
                    http.truncate(start);
                    return Err(proto("upstream sent no :status header"));
                };
                if (100..200).contains(&status) {
                    // An interim response: the final head follows.
                    http.truncate(start);
                    if end_stream {
                        return Err(proto("upstream prematurely closed stream"));
                    }
                    return Ok(());
                }
                let mut line = Vec::with_capacity(32);
                push_u64(&mut line, u64::from(status));
                line.push(b' ');
                line.extend_from_slice(crate::response::status_text(status).as_bytes());
                line.extend_from_slice(b"\r\n");
                http.splice(line_end..line_end, line);
                self.s.length = length;
                if end_stream {
                    if length.is_some_and(|n| n != 0) {
                        http.truncate(start);
                        return Err(proto("upstream prematurely closed stream"));
                    }
                    http.extend_from_slice(b"Content-Length: 0\r\n\r\n");
                    self.s.phase = Phase::Done;
                } else {
                    http.extend_from_slice(b"Transfer-Encoding: chunked\r\n\r\n");
                    self.s.phase = Phase::Body;
                }
                if http.len() - start > head_max {
                    return Err(proto("upstream sent too big header"));
                }
                Ok(())
            }
            Phase::Body => {
                // Trailers: they end the stream.
                if !end_stream {
                    return Err(proto("upstream sent trailer without end stream flag"));
                }
                self.body_ended(http)?;
                http.truncate(http.len() - 2);
                let mut bad = false;
                let res = self.decoder.decode(block, head_max, |n, v| {
                    if !valid_field(n, v) {
                        bad = true;
                        return;
                    }
                    http.extend_from_slice(n);
                    http.extend_from_slice(b": ");
                    http.extend_from_slice(v);
                    http.extend_from_slice(b"\r\n");
                });
                http.extend_from_slice(b"\r\n");
                if res.is_err() || bad {
                    return Err(proto("upstream sent invalid trailer"));
                }
                Ok(())
            }
            Phase::Done => Err(proto("upstream sent frame for closed stream")),
        }
    }

    fn data(
        &mut self,
        data: &[u8],
        end_stream: bool,
        flow_len: usize,
        http: &mut Vec<u8>,
    ) -> Result<(), Error> {
        let proto = |s: &str| Error::Protocol(s.to_string());
        if self.s.phase != Phase::Body {
            return Err(proto("upstream sent unexpected DATA frame"));
        }
        self.s.unacked += flow_len as u64;
        self.s.received += data.len() as u64;
        if self.s.length.is_some_and(|n| self.s.received > n) {
            return Err(proto(
                "upstream sent response body larger than indicated content length",
            ));
        }
        if !data.is_empty() {
            crate::proxy::write_chunk(http, data);
        }
        if self.s.unacked >= WINDOW_REFILL {
            h2frame::push_window_update(&mut self.out, self.s.id, self.s.unacked as u32);
            self.s.unacked = 0;
        }
        if end_stream {
            self.body_ended(http)?;
        }
        Ok(())
    }

    /// END_STREAM after the head: the last chunk (its trailers, if any, follow it).
    fn body_ended(&mut self, http: &mut Vec<u8>) -> Result<(), Error> {
        if self.s.length.is_some_and(|n| self.s.received != n) {
            return Err(Error::Protocol(
                "upstream prematurely closed stream".to_string(),
            ));
        }
        http.extend_from_slice(b"0\r\n\r\n");
        self.s.phase = Phase::Done;
        Ok(())
    }
}

/// nginx's checks of an upstream's field (`ngx_http_grpc_validate_header_name` and
/// `_value`): a name of lowercase characters without controls, spaces or colons, a value
/// without NUL, CR or LF.
fn valid_field(name: &[u8], value: &[u8]) -> bool {
    !name.is_empty()
        && name
            .iter()
            .all(|&b| b > 0x20 && b != 0x7f && b != b':' && !b.is_ascii_uppercase())
        && !value.iter().any(|&b| b == b'\r' || b == b'\n' || b == 0)
}

fn push_u64(out: &mut Vec<u8>, n: u64) {
    out.extend_from_slice(n.to_string().as_bytes());
}

/// Whether a client's `TE` asks for trailers (nginx's `$grpc_internal_trailers`).
pub fn te_trailers(te: &[u8]) -> bool {
    te.split(|&b| b == b',').any(|t| {
        let t = crate::proxy::trim_ows(t);
        let t = t.split(|&b| b == b';').next().unwrap_or(t);
        crate::proxy::trim_ows(t).eq_ignore_ascii_case(b"trailers")
    })
}

/// Reset the stream of a response cut short (the client left): the connection could then
/// carry another, but is not kept (nginx closes it too).
pub fn cancel(c: &mut Conn) {
    if c.s.id != 0 && c.s.phase != Phase::Done {
        h2frame::push_rst_stream(&mut c.out, c.s.id, code::CANCEL);
        c.broken = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The frames of `out` as (type, flags, stream, payload).
    fn frames(mut out: &[u8]) -> Vec<(u8, u8, u32, Vec<u8>)> {
        if out.starts_with(h2frame::PREFACE) {
            out = &out[h2frame::PREFACE.len()..];
        }
        let mut v = Vec::new();
        while out.len() >= 9 {
            let len =
                (usize::from(out[0]) << 16) | (usize::from(out[1]) << 8) | usize::from(out[2]);
            let stream = u32::from_be_bytes([out[5], out[6], out[7], out[8]]);
            v.push((out[3], out[4], stream, out[9..9 + len].to_vec()));
            out = &out[9 + len..];
        }
        v
    }

    fn decode(block: &[u8]) -> Vec<(String, String)> {
        let mut d = hpack::Decoder::new(4096);
        let mut v = Vec::new();
        d.decode(block, 1 << 20, |n, val| {
            v.push((
                String::from_utf8_lossy(n).into_owned(),
                String::from_utf8_lossy(val).into_owned(),
            ))
        })
        .unwrap();
        v
    }

    fn response(c: &mut Conn, frames: &[u8]) -> Result<String, Error> {
        c.raw.extend_from_slice(frames);
        let mut http = Vec::new();
        c.feed(&mut http, 4096)?;
        Ok(String::from_utf8(http).unwrap())
    }

    fn head_block(fields: &[(&str, &str)]) -> Vec<u8> {
        let mut b = Vec::new();
        for (n, v) in fields {
            if *n == ":status" {
                hpack::Encoder.status(v.parse().unwrap(), &mut b);
            } else {
                hpack::Encoder.field(n.as_bytes(), v.as_bytes(), &mut b);
            }
        }
        b
    }

    const REQ: &[u8] = b"POST /SayHello HTTP/1.1\r\nConnection: close\r\n\
Content-Type: application/grpc\r\nTransfer-Encoding: chunked\r\n\r\n";

    #[test]
    fn a_request_is_the_preface_then_headers_then_data_as_the_window_allows() {
        let mut c = Conn::new();
        c.begin(REQ, b"127.0.0.1:8081", false, true, false).unwrap();
        assert!(c.out.starts_with(h2frame::PREFACE));
        let f = frames(&c.out);
        assert_eq!(f[0].0, h2frame::kind::SETTINGS);
        assert_eq!(f[1].0, h2frame::kind::WINDOW_UPDATE);
        assert_eq!((f[2].0, f[2].1, f[2].2), (h2frame::kind::HEADERS, 4, 1));
        let fields = decode(&f[2].3);
        let want = [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", "/SayHello"),
            (":authority", "127.0.0.1:8081"),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
        ];
        let fields: Vec<(&str, &str)> = fields
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_str()))
            .collect();
        assert_eq!(fields, want);
        c.out.clear();
        // The upstream allows 2 bytes per stream.
        let mut s = Vec::new();
        h2frame::push_settings(&mut s, &[(INITIAL_WINDOW_SIZE, 2)]);
        response(&mut c, &s).unwrap();
        c.push_body(b"Hello", true);
        let f = frames(&c.out);
        assert_eq!(f[0].0, h2frame::kind::SETTINGS);
        assert_eq!(f[0].1, h2frame::flag::ACK);
        assert_eq!(
            (f[1].0, f[1].1, &f[1].3[..]),
            (h2frame::kind::DATA, 0, &b"He"[..])
        );
        assert_eq!(f.len(), 2);
        assert!(!c.request_sent());
        c.out.clear();
        let mut w = Vec::new();
        h2frame::push_window_update(&mut w, 1, 3);
        response(&mut c, &w).unwrap();
        c.push_body(b"", false);
        let f = frames(&c.out);
        assert_eq!(
            (f[0].0, f[0].1, &f[0].3[..]),
            (h2frame::kind::DATA, 1, &b"llo"[..])
        );
        assert!(c.request_sent());
    }

    #[test]
    fn a_response_becomes_http11_chunks_with_trailers_and_the_connection_is_kept() {
        let mut c = Conn::new();
        c.begin(REQ, b"127.0.0.1:8081", false, false, false)
            .unwrap();
        c.end_body();
        let f = frames(&c.out);
        assert_eq!(f.last().unwrap().1, h2frame::flag::END_STREAM);
        let mut up = Vec::new();
        let head = head_block(&[(":status", "200"), ("content-type", "application/grpc")]);
        h2frame::push_headers(&mut up, 1, &head, false, 16384);
        h2frame::push_data(&mut up, 1, b"Hello world", false);
        let tr = head_block(&[("grpc-status", "0"), ("grpc-message", "")]);
        h2frame::push_headers(&mut up, 1, &tr, true, 16384);
        let http = response(&mut c, &up).unwrap();
        assert_eq!(
            http,
            "HTTP/1.1 200 OK\r\ncontent-type: application/grpc\r\nTransfer-Encoding: chunked\r\n\r\n\
             b\r\nHello world\r\n0\r\ngrpc-status: 0\r\ngrpc-message: \r\n\r\n"
        );
        assert!(c.response_done() && c.reusable());
        // The next stream on the same connection: id 3, no preface.
        c.out.clear();
        c.begin(REQ, b"127.0.0.1:8081", false, false, true).unwrap();
        let f = frames(&c.out);
        assert_eq!((f[0].0, f[0].1, f[0].2), (h2frame::kind::HEADERS, 5, 3));
    }

    #[test]
    fn a_trailers_only_answer_has_no_body() {
        let mut c = Conn::new();
        c.begin(REQ, b"127.0.0.1:8081", false, false, true).unwrap();
        let mut up = Vec::new();
        let head = head_block(&[(":status", "200"), ("grpc-status", "12")]);
        h2frame::push_headers(&mut up, 1, &head, true, 16384);
        let http = response(&mut c, &up).unwrap();
        assert_eq!(
            http,
            "HTTP/1.1 200 OK\r\ngrpc-status: 12\r\nContent-Length: 0\r\n\r\n"
        );
        assert!(c.reusable());
    }

    #[test]
    fn resets_goaways_and_wrong_lengths_fail_the_stream() {
        let mut c = Conn::new();
        c.begin(REQ, b"127.0.0.1:8081", false, false, true).unwrap();
        let mut up = Vec::new();
        h2frame::push_rst_stream(&mut up, 1, code::REFUSED_STREAM);
        assert_eq!(
            response(&mut c, &up),
            Err(Error::Reset(code::REFUSED_STREAM))
        );
        assert!(!c.reusable());

        let mut c = Conn::new();
        c.begin(REQ, b"127.0.0.1:8081", false, false, true).unwrap();
        let mut up = Vec::new();
        h2frame::push_goaway(&mut up, 0, 5);
        assert_eq!(response(&mut c, &up), Err(Error::GoAway(5)));

        // A GOAWAY that lets the stream finish: answered, not kept.
        let mut c = Conn::new();
        c.begin(REQ, b"127.0.0.1:8081", false, false, true).unwrap();
        let mut up = Vec::new();
        h2frame::push_goaway(&mut up, 1, 0);
        let head = head_block(&[(":status", "200")]);
        h2frame::push_headers(&mut up, 1, &head, true, 16384);
        assert!(response(&mut c, &up).is_ok());
        assert!(c.response_done() && !c.reusable());

        for cl in ["42", "8"] {
            let mut c = Conn::new();
            c.begin(REQ, b"127.0.0.1:8081", false, false, true).unwrap();
            let mut up = Vec::new();
            let head = head_block(&[(":status", "200"), ("content-length", cl)]);
            h2frame::push_headers(&mut up, 1, &head, false, 16384);
            h2frame::push_data(&mut up, 1, b"Hello world", true);
            assert!(
                matches!(response(&mut c, &up), Err(Error::Protocol(_))),
                "{cl}"
            );
        }
    }

    #[test]
    fn pings_are_answered_and_interim_heads_skipped() {
        let mut c = Conn::new();
        c.begin(REQ, b"127.0.0.1:8081", false, false, true).unwrap();
        c.out.clear();
        let mut up = Vec::new();
        up.extend_from_slice(&[0, 0, 8, h2frame::kind::PING, 0, 0, 0, 0, 0]);
        up.extend_from_slice(b"12345678");
        h2frame::push_headers(&mut up, 1, &head_block(&[(":status", "100")]), false, 16384);
        h2frame::push_headers(&mut up, 1, &head_block(&[(":status", "404")]), true, 16384);
        let http = response(&mut c, &up).unwrap();
        assert_eq!(http, "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n");
        let f = frames(&c.out);
        assert_eq!(
            (f[0].0, f[0].1, &f[0].3[..]),
            (h2frame::kind::PING, 1, &b"12345678"[..])
        );
    }

    #[test]
    fn an_idle_connection_answers_control_frames_and_stays() {
        let mut c = Conn::new();
        c.begin(REQ, b"a:1", false, false, true).unwrap();
        let mut up = Vec::new();
        h2frame::push_headers(&mut up, 1, &head_block(&[(":status", "200")]), true, 16384);
        response(&mut c, &up).unwrap();
        assert!(c.reusable());
        c.out.clear();
        // Pooled: the acknowledgement of our SETTINGS, a PING, a window.
        h2frame::push_settings_ack(&mut c.raw);
        c.raw
            .extend_from_slice(&[0, 0, 8, h2frame::kind::PING, 0, 0, 0, 0, 0]);
        c.raw.extend_from_slice(b"abcdefgh");
        h2frame::push_window_update(&mut c.raw, 0, 100);
        assert!(c.idle_feed());
        assert!(c.reusable());
        let f = frames(&c.out);
        assert_eq!((f[0].0, f[0].1), (h2frame::kind::PING, 1));
        // A GOAWAY: not kept.
        h2frame::push_goaway(&mut c.raw, 1, 0);
        assert!(!c.idle_feed());
        assert!(!c.reusable());
    }

    #[test]
    fn te_asks_for_trailers_in_a_list() {
        assert!(te_trailers(b"trailers"));
        assert!(te_trailers(b"gzip, Trailers;q=1"));
        assert!(!te_trailers(b"gzip"));
    }
}
