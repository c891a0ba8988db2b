//! HTTP/2 connections (`http2 on`, `listen ... http2`), on shard's own frames and HPACK
//! (`shard_http::h2frame`, `shard_http::hpack`).
//!
//! A connection that negotiated `h2` (ALPN) or began with the HTTP/2 preface (`h2c`, as
//! nginx: prior knowledge on a plain listener) becomes a *session*: its socket's bytes are
//! cut into frames here, and the session keeps the connection's state: settings, flow
//! control windows both ways, the HPACK decoder, the streams by id. Each stream is carried by
//! a *stream connection* of its own in `Worker::conns`: no socket, its input the HTTP/1.1
//! head its HEADERS say (and its DATA, framed as the head says), its output parsed back into
//! HEADERS and DATA frames ([`Worker::h2_send`]). So every phase, the proxy, static files,
//! error pages and the access log run per stream exactly as for HTTP/1.1, on the request
//! (`conn::Req`) the stream connection holds.
//!
//! This module owns the sessions (`Worker::h2`) and the translation both ways; it does not
//! own the phases, the socket's TLS, or closing connections (the loop's `close`).

use std::collections::HashMap;

use shard_http::body::ChunkedDecoder;
use shard_http::h2frame::{self, code, ConnError, Frame, Reader};
use shard_http::hpack;

use super::conn::{Conn, Phase};
use super::Worker;

/// `Conn::h2` of a connection that carries a session (its index + 1 in the low bits).
pub(super) const H2_SESSION: u32 = 1 << 30;
/// `Conn::h2` of a stream connection.
pub(super) const H2_STREAM: u32 = 1 << 31;
/// Bit 29 is `h3::H3_STREAM`: an HTTP/3 stream connection has `H2_STREAM` too.
const INDEX_MASK: u32 = super::h3::H3_STREAM - 1;

/// Bytes of frames a session holds for its socket before its streams' writes wait, and
/// before it stops reading (so that a client that does not read its PING and SETTINGS
/// answers costs no more).
const SESSION_OUT_MAX: usize = 256 * 1024;
/// A stream's request body bytes waiting in its connection's input before its window is
/// given back (the client cannot send more meanwhile).
const STREAM_INPUT_MAX: usize = 64 * 1024;
/// A response head longer than this, from our own phases or an upstream, fails its stream.
const RESPONSE_HEAD_MAX: usize = 256 * 1024;
/// Streams the client resets within [`RESET_WINDOW_MS`] before the session is ended with
/// `ENHANCE_YOUR_CALM` (rapid reset, CVE-2023-44487), as a multiple of
/// `http2_max_concurrent_streams`.
const RESETS_PER_WINDOW: u32 = 2;
const RESET_WINDOW_MS: u64 = 1_000;
/// nginx's flood rule (`ngx_http_v2_read_handler`): a client whose bytes are more than 8
/// times what its requests carry, past this allowance, is sending control frames for their
/// own sake (PING, SETTINGS, PRIORITY, WINDOW_UPDATE, empty frames): the connection ends.
const FLOOD_ALLOWANCE: u64 = 1 << 20;
/// Empty DATA frames (no data, no END_STREAM) a session takes before it ends with
/// `ENHANCE_YOUR_CALM`: they carry nothing and cost a frame's work each (CVE-2019-9518).
const EMPTY_FRAMES_MAX: u32 = 1_000;
/// Rounds of read, frames, streams and write one drive of a session makes before it yields.
const SESSION_ROUNDS_MAX: usize = 16;
/// HTTP/2's initial window (RFC 9113, 6.9.2) and its largest (6.9.1).
const DEFAULT_WINDOW: i64 = 65_535;
const MAX_WINDOW: i64 = (1 << 31) - 1;
/// The connection's receive window is opened to the largest at once (as nginx): streams'
/// windows bound what a client may send. What it used is given back past this much.
const CONN_WINDOW_REFILL: u64 = 1 << 20;

/// Priority records a session keeps (streams opened or not), and the depth of the tree
/// looked at.
const PRIORITIES_MAX: usize = 1024;
const PRIORITY_DEPTH_MAX: usize = 32;

/// A HEADERS frame's priority fields, or a PRIORITY frame's, from the frame's bytes:
/// `(stream, depends on, weight 1..=256, exclusive)`.
fn frame_priority(raw: &[u8]) -> Option<(u32, u32, u16, bool)> {
    let head = raw.get(..9)?;
    let (ty, flags) = (head[3], head[4]);
    let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
    let p = &raw[9..];
    let p = match ty {
        h2frame::kind::PRIORITY => p,
        h2frame::kind::HEADERS if flags & h2frame::flag::PRIORITY != 0 => {
            if flags & h2frame::flag::PADDED != 0 {
                p.get(1..)?
            } else {
                p
            }
        }
        _ => return None,
    };
    let d = u32::from_be_bytes(p.get(..4)?.try_into().ok()?);
    let weight = u16::from(*p.get(4)?) + 1;
    Some((stream, d & 0x7fff_ffff, weight, d & 0x8000_0000 != 0))
}

/// SETTINGS identifiers (RFC 9113, 6.5.2).
mod setting {
    pub const ENABLE_PUSH: u16 = 2;
    pub const MAX_CONCURRENT_STREAMS: u16 = 3;
    pub const INITIAL_WINDOW_SIZE: u16 = 4;
    pub const MAX_FRAME_SIZE: u16 = 5;
    pub const MAX_HEADER_LIST_SIZE: u16 = 6;
}

/// One HTTP/2 connection.
pub(super) struct Session {
    /// The socket's connection.
    key: usize,
    /// Client bytes not yet cut into frames (the preface first).
    input: Vec<u8>,
    preface_read: bool,
    reader: Reader,
    decoder: hpack::Decoder,
    /// Frames for the socket.
    out: Vec<u8>,
    /// Stream connections by stream id, and the streams by their connections' keys.
    ids: HashMap<u32, usize, foldhash::fast::RandomState>,
    /// RFC 7540's priorities, as nginx keeps them: each stream id's parent and weight
    /// (from HEADERS and PRIORITY frames, also for streams not opened yet). Streams that
    /// wait for window go on in this order ([`Session::priority_key`]).
    prio: HashMap<u32, (u32, u16), foldhash::fast::RandomState>,
    streams: HashMap<usize, Stream, foldhash::fast::RandomState>,
    /// Stream connections to drive in this round.
    ready: Vec<usize>,
    /// A drive of this session is on the stack: a stream that ends asks for no other.
    in_drive: bool,
    /// `h2` for TLS, `h2c` for plain (`$http2`).
    tls: bool,
    max_streams: u32,
    /// The largest stream id the client opened.
    last_id: u32,
    /// What each of our streams' windows start at (SETTINGS_INITIAL_WINDOW_SIZE we sent).
    our_window: i64,
    /// The client acknowledged our SETTINGS (until then a window below HTTP/2's default is
    /// not known to it: a stream with a body is refused, as nginx).
    settings_acked: bool,
    /// The client's SETTINGS_INITIAL_WINDOW_SIZE and SETTINGS_MAX_FRAME_SIZE.
    peer_window: i64,
    peer_max_frame: usize,
    /// Bytes we may still send on the connection, and bytes the client sent that were not
    /// given back yet.
    send_window: i64,
    recv_used: u64,
    max_list: usize,
    resets: u32,
    resets_since_ms: u64,
    /// `GOAWAY` was sent (reload, stop, `keepalive_requests`, `keepalive_time`): no new
    /// streams; those taken finish.
    going_away: bool,
    /// The client sent `GOAWAY`, or the session failed: it ends once its streams have.
    closed: bool,
    /// Streams taken so far, and the default server's `keepalive_requests` and
    /// `keepalive_time`, which end the session as nginx ends an HTTP/2 connection.
    taken: u64,
    keepalive_requests: u64,
    keepalive_time_ms: u64,
    /// `taken` at `http2_rebalance`'s last look: the connection's weight is the difference.
    taken_at_look: u64,
    /// The default server's `keepalive_timeout` (a session without streams closes after
    /// it) and `http2_recv_buffer_size` (the most client bytes held undecoded).
    keepalive_timeout_ms: u64,
    /// The default server's `client_header_timeout`: how long a header block may stay open
    /// (nginx: the HTTP/2 meaning since 1.19.7, when `http2_recv_timeout` went).
    header_timeout_ms: u64,
    /// When the open header block began (0: none is open).
    block_since_ms: u64,
    /// The default server's `send_timeout`: output that makes no progress for this long
    /// ends the connection, as nginx's HTTP/2 write timer; since when it has made none (0:
    /// nothing waits).
    send_timeout_ms: u64,
    stalled_since_ms: u64,
    recv_buffer_size: usize,
    /// Bytes read from the client, and the part of them that was requests (header blocks as
    /// their HTTP/1.1 heads, body data): nginx's flood rule compares the two.
    total_bytes: u64,
    payload_bytes: u64,
    empty_frames: u32,
    /// Ended and written: the write side is shut and input is read and dropped until the
    /// client closes or this time, so that the client reads every answer rather than a reset
    /// (nginx's lingering close of an HTTP/2 connection). 0 while open.
    lingering_until_ms: u64,
    lingering: shard_config::Lingering,
    /// `http2_rebalance` of the address's default server.
    rebalance: bool,
}

/// The response side of a stream's output, parsed from the HTTP/1.1 bytes its connection
/// writes (HTTP/2's and HTTP/3's streams alike).
pub(super) enum Out {
    /// Gathering the head.
    Head(Vec<u8>),
    Length(u64),
    Chunked(ChunkedDecoder),
    /// Neither length nor chunks: the body ends when the stream connection closes.
    UntilClose,
    /// Sent whole (or there is no body): what else comes is dropped.
    Done,
}

pub(super) struct Stream {
    id: u32,
    /// Bytes we may still send on the stream, and bytes the client may still send.
    send_window: i64,
    recv_window: i64,
    /// The request body is framed as chunks in the head given to the stream connection.
    chunked_in: bool,
    /// What the request's `content-length` still expects of DATA (`None`: chunked, or no
    /// body).
    body_left: Option<u64>,
    /// The body broke its `content-length`: the request answers 400 where it has not
    /// answered yet.
    pub(super) body_error: bool,
    /// The HEADERS (and CONTINUATION) payload's length: nginx's `$request_length` for the
    /// head.
    pub(super) head_len: u32,
    /// A `HEAD` request: the response has no body whatever its head says.
    head_only: bool,
    /// The client's END_STREAM came.
    recv_done: bool,
    out: Out,
    /// The stream connection waits for window (its last write was refused).
    blocked: bool,
    /// `http2_chunk_size` of the stream's location: the largest DATA frame sent.
    chunk: usize,
}

/// Requests per second below which a worker never sheds connections (`http2_rebalance`):
/// a light load is not worth a reconnection.
const REBALANCE_FLOOR: f64 = 50.0;
/// A worker sheds when its rate is above this many times its siblings' mean.
const REBALANCE_RATIO: f64 = 1.2;
/// The least share of the gap a connection must carry to be moved.
const REBALANCE_MIN_SHARE: f64 = 0.05;
/// After shedding, the looks this long are only measured: the reconnected clients' load must
/// show on the workers that took them before the next decision.
const REBALANCE_HOLD_MS: u64 = 2000;
/// How long the master's steering sends new connections away from a worker that shed
/// (`WorkerSlot::shed_until_ms`): long enough for clients to reconnect.
const REBALANCE_STEER_MS: u64 = 1000;

/// What `http2_rebalance` remembers between its looks.
#[derive(Debug, Default)]
pub(super) struct Rebalance {
    /// When the window began, and the requests counted then: this worker's and its
    /// siblings' (by slot, `None` for a slot without a worker).
    since_ms: u64,
    mine: u64,
    others: Vec<Option<u64>>,
    /// No decision before this (`REBALANCE_HOLD_MS`).
    hold_until_ms: u64,
    /// Connections chosen, `(key, connection id)`, whose `GOAWAY` waits until the master's
    /// steering sends new connections away from this worker (its `STEER_AWAY` bit), so
    /// that their clients' reconnections do not land here again; at the latest at the next
    /// look.
    pending: Vec<(usize, u64)>,
}

/// Which HTTP/2 connections a worker serving `mine` requests per second sends `GOAWAY`, its
/// siblings serving `others`, its candidates being `(key, requests per second)`. None unless
/// it carries at least [`REBALANCE_FLOOR`] and more than [`REBALANCE_RATIO`] times their
/// mean; then the heaviest that together move at most half the gap (moving `w` of a gap `d`
/// to a sibling leaves `|d - 2w|`), or, when each alone is more, the one that narrows the gap
/// most (any below the whole gap narrows it). A connection that carried less than
/// [`REBALANCE_MIN_SHARE`] of the gap is never chosen: its reconnection would cost more
/// than the load it moves.
pub(super) fn rebalance_pick(mine: f64, others: &[f64], conns: &[(usize, f64)]) -> Vec<usize> {
    if others.is_empty() || mine < REBALANCE_FLOOR {
        return Vec::new();
    }
    let mean = others.iter().sum::<f64>() / others.len() as f64;
    let gap = mine - mean;
    if mine <= REBALANCE_RATIO * mean || gap < REBALANCE_FLOOR {
        return Vec::new();
    }
    let least = (gap * REBALANCE_MIN_SHARE).max(f64::MIN_POSITIVE);
    let mut by_rate: Vec<(usize, f64)> = conns.iter().copied().filter(|c| c.1 >= least).collect();
    by_rate.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    let mut left = gap / 2.0;
    let mut picked = Vec::new();
    for &(key, w) in &by_rate {
        if w <= left {
            picked.push(key);
            left -= w;
        }
    }
    if picked.is_empty() {
        // Each is above half the gap: the one that leaves the smallest gap, `|gap - 2w|`.
        if let Some(&(key, _)) = by_rate
            .iter()
            .filter(|c| c.1 < gap)
            .min_by(|a, b| (gap - 2.0 * a.1).abs().total_cmp(&(gap - 2.0 * b.1).abs()))
        {
            picked.push(key);
        }
    }
    picked
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

/// Hop-by-hop fields, which HTTP/2 forbids in requests (a malformed request) and which a
/// response's HTTP/1.1 head loses on the way out.
pub(super) fn hop_by_hop(name: &[u8]) -> bool {
    [
        &b"connection"[..],
        b"keep-alive",
        b"transfer-encoding",
        b"proxy-connection",
        b"upgrade",
    ]
    .iter()
    .any(|h| name.eq_ignore_ascii_case(h))
}

/// A request's header fields as the phases read them: the HTTP/1.1 head, `None` when the
/// request is malformed in a way nginx resets (RFC 9113, 8.1.1: a stream error). Pseudo-
/// header mistakes (missing, repeated, unknown, out of order, bad values) are nginx's 400:
/// a head whose request line the HTTP/1.x parser refuses.
pub(super) fn request_head(
    fields: &[(&[u8], &[u8])],
    end_stream: bool,
    chunked: &mut bool,
) -> Option<Vec<u8>> {
    let (mut method, mut path, mut scheme, mut authority) = (None, None, false, None);
    let mut regular = false;
    let bad_request = || Some(INVALID_REQUEST.to_vec());
    for &(n, v) in fields {
        if n.first() == Some(&b':') {
            if regular {
                return bad_request();
            }
            match n {
                b":method" if method.is_none() => method = Some(v),
                b":path" if path.is_none() && !v.is_empty() => path = Some(v),
                b":scheme" if !scheme && !v.is_empty() => scheme = true,
                b":authority" if authority.is_none() => authority = Some(v),
                _ => return bad_request(),
            }
            continue;
        }
        regular = true;
        if hop_by_hop(n) || (n == b"te" && v != b"trailers") {
            return None;
        }
    }
    let (Some(method), Some(path), true) = (method, path, scheme) else {
        return bad_request();
    };
    if v_has_ctl(method) || v_has_ctl(path) || path.contains(&b' ') {
        return bad_request();
    }
    let mut h = Vec::with_capacity(256);
    h.extend_from_slice(method);
    h.push(b' ');
    h.extend_from_slice(path);
    h.extend_from_slice(b" HTTP/1.1\r\n");
    let has_host = fields.iter().any(|&(n, _)| n == b"host");
    if let (false, Some(a)) = (has_host, authority) {
        h.extend_from_slice(b"Host: ");
        h.extend_from_slice(a);
        h.extend_from_slice(b"\r\n");
    }
    let mut length = false;
    let mut cookies = 0;
    let mut bad = false;
    for &(n, v) in fields {
        // `te: trailers` (the only TE HTTP/2 allows) stays: `grpc_pass` passes it on.
        if n.first() == Some(&b':') {
            continue;
        }
        // nginx's `ngx_http_v2_validate_header`: a name with an uppercase letter, a control
        // byte, a space or a colon, or a value with NUL, CR or LF, is a bad request (400),
        // not a reset; other odd names are left to `ignore_invalid_headers`.
        if n.is_empty()
            || n.iter()
                .any(|&b| b <= 0x20 || b == 0x7f || b == b':' || b.is_ascii_uppercase())
            || v_has_ctl(v)
        {
            bad = true;
            continue;
        }
        if n == b"cookie" {
            cookies += 1;
            continue;
        }
        if n == b"content-length" {
            length = true;
        }
        h.extend_from_slice(n);
        h.extend_from_slice(b": ");
        h.extend_from_slice(v);
        h.extend_from_slice(b"\r\n");
    }
    // Cookies, split into fields by the client's compression, joined again (8.2.3).
    if cookies > 0 {
        h.extend_from_slice(b"Cookie: ");
        let mut first = true;
        for &(_, v) in fields.iter().filter(|&&(n, _)| n == b"cookie") {
            if !first {
                h.extend_from_slice(b"; ");
            }
            first = false;
            h.extend_from_slice(v);
        }
        h.extend_from_slice(b"\r\n");
    }
    if !end_stream && !length {
        h.extend_from_slice(b"Transfer-Encoding: chunked\r\n");
        *chunked = true;
    }
    if bad {
        // A line the HTTP/1.x parser refuses, so the request gets its 400 (page, log line,
        // access log) the way every other bad request does.
        h.extend_from_slice(INVALID_LINE);
    }
    h.extend_from_slice(b"\r\n");
    Some(h)
}

/// A head whose request line no HTTP/1.x parser takes: the stream's answer is the 400 of a
/// malformed request.
const INVALID_REQUEST: &[u8] = b"\x00\r\n\r\n";

/// Stands for a header field HTTP/2 took but nginx refuses: never a valid HTTP/1.x line.
const INVALID_LINE: &[u8] = b"\x00\r\n";

/// The most bytes of a response's trailers a stream sends (HEADERS and CONTINUATION).
const TRAILERS_MAX: usize = 256 * 1024;

/// What writes a field block: HPACK for HTTP/2, QPACK for HTTP/3 (`h3.rs`).
pub(super) trait FieldEncoder {
    fn status(&self, code: u16, out: &mut Vec<u8>);
    /// `name` is lowercase.
    fn field(&self, name: &[u8], value: &[u8], out: &mut Vec<u8>);
}

impl FieldEncoder for hpack::Encoder {
    fn status(&self, code: u16, out: &mut Vec<u8>) {
        hpack::Encoder::status(self, code, out);
    }

    fn field(&self, name: &[u8], value: &[u8], out: &mut Vec<u8>) {
        hpack::Encoder::field(self, name, value, out);
    }
}

/// How a response's body is framed, as its HTTP/1.1 head says.
pub(super) struct Framing {
    pub(super) status: u16,
    pub(super) length: Option<u64>,
    pub(super) chunked: bool,
}

/// Writes the fields of a stream's HTTP/1.1 response head into `block` (the status first,
/// names lowercased, hop-by-hop fields left out) and says how its body is framed; `None`
/// for a 1xx, which is not passed on (HTTP/2 and HTTP/3 clients send their body without
/// waiting for `100 Continue`).
pub(super) fn response_block(
    head: &[u8],
    e: &impl FieldEncoder,
    block: &mut Vec<u8>,
) -> std::io::Result<Option<Framing>> {
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
        return Ok(None);
    }
    e.status(status, block);
    let mut length: Option<u64> = None;
    let mut chunked = false;
    let mut name = Vec::with_capacity(32);
    for f in r.headers.iter() {
        let n = f.name.as_bytes();
        if n.eq_ignore_ascii_case(b"transfer-encoding") {
            chunked = true;
        }
        if hop_by_hop(n) {
            continue;
        }
        if n.eq_ignore_ascii_case(b"content-length") {
            length = std::str::from_utf8(f.value)
                .ok()
                .and_then(|v| v.trim().parse().ok());
        }
        name.clear();
        name.extend(n.iter().map(u8::to_ascii_lowercase));
        e.field(&name, f.value, block);
    }
    Ok(Some(Framing {
        status,
        length,
        chunked,
    }))
}

/// Writes a chunked response's trailer lines (`Name: value\n` each) into `block`: names in
/// lowercase, lines without a colon and hop-by-hop fields left out. Whether any was.
pub(super) fn trailer_fields(lines: &[u8], e: &impl FieldEncoder, block: &mut Vec<u8>) -> bool {
    let mut name = Vec::new();
    let mut any = false;
    for line in lines.split(|&b| b == b'\n') {
        let Some(colon) = memchr::memchr(b':', line) else {
            continue;
        };
        let (n, v) = (&line[..colon], &line[colon + 1..]);
        if n.is_empty() || hop_by_hop(n) {
            continue;
        }
        name.clear();
        name.extend(n.iter().map(u8::to_ascii_lowercase));
        e.field(&name, v.trim_ascii(), block);
        any = true;
    }
    any
}

/// The HPACK block of a chunked response's trailer lines (empty when there are none).
fn trailer_block(lines: &[u8]) -> Vec<u8> {
    let mut block = Vec::new();
    trailer_fields(lines, &hpack::Encoder, &mut block);
    block
}

/// CR, LF or NUL in a field: malformed (RFC 9113, 8.2.1).
fn v_has_ctl(v: &[u8]) -> bool {
    v.iter().any(|&b| b == b'\r' || b == b'\n' || b == 0)
}

impl Session {
    /// The response head of stream `st` is whole: HEADERS go out, and the body's framing is
    /// known.
    fn begin(&mut self, st: &mut Stream, head: &[u8]) -> std::io::Result<()> {
        let mut block = Vec::with_capacity(256);
        let Some(Framing {
            status,
            length,
            chunked,
        }) = response_block(head, &hpack::Encoder, &mut block)?
        else {
            st.out = Out::Head(Vec::new());
            return Ok(());
        };
        let no_body = st.head_only || status == 204 || status == 304;
        let end_now = no_body || length == Some(0);
        h2frame::push_headers(&mut self.out, st.id, &block, end_now, self.peer_max_frame);
        st.out = if end_now {
            Out::Done
        } else if chunked {
            // Trailers (`add_trailer`, an upstream's) go as a last HEADERS frame.
            let mut dec = ChunkedDecoder::new();
            dec.keep_trailers(TRAILERS_MAX);
            Out::Chunked(dec)
        } else if let Some(n) = length {
            Out::Length(n)
        } else {
            Out::UntilClose
        };
        Ok(())
    }

    /// Takes HTTP/1.1 response bytes of stream `st`: `Ok(n)` of `buf` taken, `WouldBlock`
    /// while a window (or the session's output) is full.
    fn send(&mut self, st: &mut Stream, buf: &[u8]) -> std::io::Result<usize> {
        use std::io::{Error, ErrorKind};
        match &mut st.out {
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
                let head = std::mem::take(acc);
                self.begin(st, &head[..head_len])?;
                Ok(head_len - before)
            }
            Out::Done => Ok(buf.len()),
            _ => {
                let room = self
                    .send_window
                    .min(st.send_window)
                    .min(self.peer_max_frame.min(st.chunk) as i64);
                if room <= 0 || self.out.len() >= SESSION_OUT_MAX {
                    st.blocked = true;
                    return Err(ErrorKind::WouldBlock.into());
                }
                let room = room as usize;
                let (used, sent, end) = match &mut st.out {
                    Out::Length(left) => {
                        let n = (room as u64).min(*left).min(buf.len() as u64) as usize;
                        *left -= n as u64;
                        h2frame::push_data(&mut self.out, st.id, &buf[..n], *left == 0);
                        (n, n, *left == 0)
                    }
                    Out::Chunked(dec) => {
                        let mut data = Vec::new();
                        let f = dec
                            .feed_into(&buf[..room.min(buf.len())], &mut data)
                            .map_err(|_| Error::new(ErrorKind::InvalidData, "bad chunks"))?;
                        let done = dec.is_done();
                        let trailers = done.then(|| trailer_block(dec.trailers_kept()));
                        let trailers = trailers.filter(|t| !t.is_empty());
                        if !data.is_empty() || (done && trailers.is_none()) {
                            h2frame::push_data(
                                &mut self.out,
                                st.id,
                                &data,
                                done && trailers.is_none(),
                            );
                        }
                        if let Some(t) = trailers {
                            h2frame::push_headers(
                                &mut self.out,
                                st.id,
                                &t,
                                true,
                                self.peer_max_frame,
                            );
                        }
                        (f.consumed, data.len(), done)
                    }
                    _ => {
                        let n = room.min(buf.len());
                        h2frame::push_data(&mut self.out, st.id, &buf[..n], false);
                        (n, n, false)
                    }
                };
                self.send_window -= sent as i64;
                st.send_window -= sent as i64;
                if end {
                    st.out = Out::Done;
                }
                Ok(used)
            }
        }
    }

    /// Stream `st`'s connection closed: its response ends here, whole or cut.
    fn finish(&mut self, st: &mut Stream) {
        match st.out {
            Out::Done => {
                // Answered before the client finished its body: it may stop (8.1).
                if !st.recv_done {
                    h2frame::push_rst_stream(&mut self.out, st.id, code::NO_ERROR);
                }
            }
            Out::UntilClose => h2frame::push_data(&mut self.out, st.id, b"", true),
            _ => h2frame::push_rst_stream(&mut self.out, st.id, code::INTERNAL_ERROR),
        }
        st.out = Out::Done;
    }

    /// Records a priority (RFC 7540, 5.3): `id` depends on `dep` with `weight` (1..=256);
    /// `exclusive` makes it the only child of `dep`, its siblings its own children. A stream
    /// made to depend on its own descendant first moves that descendant up, as the RFC asks.
    fn prioritize(&mut self, id: u32, dep: u32, weight: u16, exclusive: bool) {
        if self.prio.len() >= PRIORITIES_MAX && !self.prio.contains_key(&id) {
            return;
        }
        if self.ancestors(dep).any(|a| a == id) {
            let old = self.prio.get(&id).map_or(0, |r| r.0);
            if let Some(r) = self.prio.get_mut(&dep) {
                r.0 = old;
            }
        }
        if exclusive {
            for (k, r) in self.prio.iter_mut() {
                if r.0 == dep && *k != id {
                    r.0 = id;
                }
            }
        }
        self.prio.insert(id, (dep, weight));
    }

    /// The ids above `id` in the priority tree, nearest first (bounded: a tree is shallow).
    fn ancestors(&self, id: u32) -> impl Iterator<Item = u32> + '_ {
        let mut at = id;
        std::iter::from_fn(move || {
            let parent = self.prio.get(&at).map_or(0, |r| r.0);
            (parent != 0).then(|| {
                at = parent;
                parent
            })
        })
        .take(PRIORITY_DEPTH_MAX)
    }

    /// How stream `id` goes before others, as nginx orders its frames: nearer the root
    /// first, then the larger share of its parent's (weight over 256, times the parent's).
    fn priority_key(&self, id: u32) -> (usize, std::cmp::Reverse<u64>) {
        let mut rank = 1;
        let mut share = 1u64 << 32;
        let mut at = id;
        while let Some(&(parent, weight)) = self.prio.get(&at) {
            share = share * u64::from(weight) / 256;
            if parent == 0 || rank >= PRIORITY_DEPTH_MAX {
                break;
            }
            rank += 1;
            at = parent;
        }
        if !self.prio.contains_key(&id) {
            share = share * 16 / 256;
        }
        (rank, std::cmp::Reverse(share))
    }

    /// Sends `GOAWAY` with the last stream taken: no new streams; those taken finish.
    fn go_away(&mut self, code: u32) {
        if !self.going_away {
            self.going_away = true;
            h2frame::push_goaway(&mut self.out, self.last_id, code);
        }
    }
}

impl Worker<'_> {
    /// Whether the connection on `key` speaks HTTP/2: over TLS when its ALPN chose `h2`, in
    /// plain when it begins with the preface and its address has HTTP/2 on.
    pub(super) fn h2_wanted(&self, key: usize) -> bool {
        let c = &self.conns[key];
        // Plain bytes on a TLS address are answered as HTTP/1.x (nginx's 400), never as h2c.
        if c.h2 != 0 || c.requests != 0 || c.plain_on_tls {
            return false;
        }
        let (Some(http), Some(l)) = (
            self.cx.cfg.http.as_ref(),
            self.cx.cfg.listeners.get(c.listener),
        ) else {
            return false;
        };
        match c.tls.as_ref() {
            Some(t) => t.conn.alpn_protocol() == Some(b"h2"),
            None => {
                // "PRI" tells the preface from any method (`PROPFIND`, `PUT`).
                l.http2(http, false)
                    && c.inbuf.len() >= 3
                    && h2frame::PREFACE.starts_with(&c.inbuf[..c.inbuf.len().min(16)])
            }
        }
    }

    /// The connection on `key` becomes an HTTP/2 session; what it read so far is the start
    /// of the client's preface. Our SETTINGS go out at once.
    pub(super) fn h2_start(&mut self, key: usize) {
        let Some(srv) = self.default_server(self.conns[key].listener) else {
            return;
        };
        let conf = srv.http2;
        let limits = srv.large_client_header_buffers;
        // nginx's header limit: the buffers' whole size, names and values counted.
        let max_list = limits.0 * limits.1;
        // As configured (0 too): a client may send that much before the stream is read; the
        // window is given back, to at least one frame's worth, as the stream takes its body.
        let our_window = conf.body_preread_size as i64;
        let mut out = Vec::with_capacity(64);
        h2frame::push_settings(
            &mut out,
            &[
                (setting::ENABLE_PUSH, 0),
                (setting::MAX_CONCURRENT_STREAMS, conf.max_concurrent_streams),
                (setting::INITIAL_WINDOW_SIZE, our_window as u32),
                (setting::MAX_HEADER_LIST_SIZE, max_list as u32),
            ],
        );
        h2frame::push_window_update(&mut out, 0, (MAX_WINDOW - DEFAULT_WINDOW) as u32);
        let c = &mut self.conns[key];
        let input = std::mem::take(&mut c.inbuf);
        let tls = c.tls.is_some();
        let total_bytes = input.len() as u64;
        let idx = self.h2.insert(Session {
            key,
            input,
            preface_read: false,
            reader: {
                let mut r = Reader::new(h2frame::DEFAULT_MAX_FRAME, max_list);
                r.max_data = our_window as usize;
                r
            },
            decoder: {
                let mut d = hpack::Decoder::new(4096);
                d.set_max_field(limits.1);
                d
            },
            out,
            ids: HashMap::default(),
            prio: HashMap::default(),
            streams: HashMap::default(),
            ready: Vec::new(),
            in_drive: false,
            tls,
            max_streams: conf.max_concurrent_streams,
            last_id: 0,
            our_window,
            settings_acked: false,
            peer_window: DEFAULT_WINDOW,
            peer_max_frame: h2frame::DEFAULT_MAX_FRAME,
            send_window: DEFAULT_WINDOW,
            recv_used: 0,
            max_list,
            resets: 0,
            resets_since_ms: self.cx.now_ms,
            going_away: false,
            closed: false,
            taken: 0,
            taken_at_look: 0,
            keepalive_requests: srv.base.keepalive_requests,
            keepalive_time_ms: srv.base.keepalive_time_ms,
            keepalive_timeout_ms: srv.base.keepalive_timeout_ms,
            header_timeout_ms: srv.client_header_timeout_ms,
            block_since_ms: 0,
            send_timeout_ms: srv.base.send_timeout_ms,
            stalled_since_ms: 0,
            recv_buffer_size: conf.recv_buffer_size,
            total_bytes,
            payload_bytes: 0,
            empty_frames: 0,
            lingering_until_ms: 0,
            lingering: srv.base.lingering,
            rebalance: conf.rebalance,
        });
        let c = &mut self.conns[key];
        c.h2 = tag(H2_SESSION, idx);
        // The connection carries no request of its own any more.
        if let Some(r) = c.req.take() {
            self.give_req(r);
        }
        self.set_phase(key, Phase::Waiting);
    }

    /// Runs a session: reads its socket, takes its frames, drives the streams that can go
    /// on, and writes what they made. The one step of a session connection.
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
        let read_max = self.h2[idx].recv_buffer_size;
        // Still moving after the last round: the socket's edges were used up, so the
        // session takes another turn after the worker's other connections.
        let mut used_up = true;
        for _ in 0..SESSION_ROUNDS_MAX {
            let mut progress = false;
            // Read what the socket has, while the session's answers can go out.
            let s = &self.h2[idx];
            let pending_in = s.input.len();
            let room_out = s.out.len() < SESSION_OUT_MAX;
            if self.conns[key].readable && pending_in < read_max && room_out && !s.closed {
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
                        s.input.extend_from_slice(&buf);
                        s.total_bytes += n as u64;
                        progress = true;
                        if s.total_bytes / 8 > s.payload_bytes + FLOOD_ALLOWANCE {
                            self.give_buf(buf);
                            crate::log!(
                                Info,
                                "http2 flood detected{}",
                                self.log_context(key, None)
                            );
                            return self.h2_fail(key, idx, code::NO_ERROR);
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
            match self.h2_frames(key, idx) {
                Ok(p) => progress |= p,
                Err(ConnError(code)) => return self.h2_fail(key, idx, code),
            }
            let ready = std::mem::take(&mut self.h2[idx].ready);
            for s in ready {
                progress = true;
                self.drive(s);
            }
            self.h2_refill(idx);
            let s = &mut self.h2[idx];
            if s.streams.is_empty() && s.taken > 0 && s.keepalive_timeout_ms == 0 {
                // `keepalive_timeout 0`: no connection is kept between requests, as nginx's
                // (the streams taken were answered, then GOAWAY).
                s.go_away(code::NO_ERROR);
            }
            let before = self.h2[idx].out.len();
            match self.h2_write(key, idx) {
                Io::Close => return Io::Close,
                Io::Wait => {}
                // Written: streams that waited for the session's output may go on.
                // Written: the socket may be read again (reading stops while frames wait)
                // and streams that waited for the session's output may go on.
                Io::Ready => {
                    if before > 0 {
                        progress = true;
                        self.h2_unblock(idx);
                    }
                }
            }
            if !progress && self.h2[idx].ready.is_empty() {
                used_up = false;
                break;
            }
        }
        if used_up {
            self.yield_conn(key);
        }
        let s = &mut self.h2[idx];
        if s.input.is_empty() && s.input.capacity() > 0 {
            s.input = Vec::new();
        }
        if s.out.is_empty() && s.out.capacity() > 0 {
            s.out = Vec::new();
        }
        if self.conns[key].out.is_empty() {
            let out = std::mem::take(&mut self.conns[key].out);
            self.conns[key].out_pos = 0;
            self.give_buf(out);
        }
        let now = self.cx.now_ms;
        let s = &mut self.h2[idx];
        if !s.reader.in_block() {
            s.block_since_ms = 0;
        } else if s.block_since_ms == 0 {
            s.block_since_ms = now;
        }
        let idle = s.streams.is_empty();
        let done = (s.going_away || s.closed) && idle;
        let c = &mut self.conns[key];
        if done && c.out.is_empty() && s.out.is_empty() {
            return self.h2_shut(key, idx);
        }
        c.deadline_ms = if idle && s.taken == 0 {
            // Before its first stream (`keepalive_timeout 0` included), a connection waits
            // for it at least `client_header_timeout`.
            now + s.keepalive_timeout_ms.max(s.header_timeout_ms)
        } else if idle {
            now + s.keepalive_timeout_ms
        } else {
            u64::MAX
        };
        // A header block left open ends the connection after `client_header_timeout`,
        // whatever else it carries.
        if s.block_since_ms != 0 {
            c.deadline_ms = c.deadline_ms.min(s.block_since_ms + s.header_timeout_ms);
        }
        // Output the client does not take ends it after `send_timeout`.
        let waiting = c.out_pos < c.out.len()
            || !s.out.is_empty()
            || c.tls.as_ref().is_some_and(|t| t.has_output());
        if !waiting {
            s.stalled_since_ms = 0;
        } else {
            if s.stalled_since_ms == 0 {
                s.stalled_since_ms = now;
            }
            c.deadline_ms = c.deadline_ms.min(s.stalled_since_ms + s.send_timeout_ms);
        }
        if !self.conns[key].readable || !self.conns[key].writable {
            self.ensure_registered(key);
        }
        Io::Wait
    }

    /// The session fails (a connection error, a flood): `GOAWAY` with `code`, its streams
    /// end, and it closes the lingering way, so that the client reads the `GOAWAY`.
    fn h2_fail(&mut self, key: usize, idx: usize, code: u32) -> super::step::Io {
        let s = &mut self.h2[idx];
        // Frames not yet begun answer streams that end here (or a flood's PING ACKs): the
        // GOAWAY goes right after the bytes already on their way, and nothing more is read.
        s.out.clear();
        s.input = Vec::new();
        s.go_away(code);
        s.closed = true;
        let keys: Vec<usize> = s.streams.keys().copied().collect();
        s.streams.clear();
        s.ids.clear();
        for k in keys {
            self.close(k);
        }
        match self.h2_write(key, idx) {
            super::step::Io::Ready => self.h2_shut(key, idx),
            super::step::Io::Close => super::step::Io::Close,
            // Bytes left: closing now would reset the connection and destroy the GOAWAY.
            // The session writes on (reading nothing) and shuts once they are out, or ends
            // after `send_timeout` when the client does not take them.
            super::step::Io::Wait => {
                let now = self.cx.now_ms;
                let s = &mut self.h2[idx];
                if s.stalled_since_ms == 0 {
                    s.stalled_since_ms = now;
                }
                let c = &mut self.conns[key];
                c.deadline_ms = s.stalled_since_ms + s.send_timeout_ms;
                self.ensure_registered(key);
                super::step::Io::Wait
            }
        }
    }

    /// A session's deadline passed: when a header block stayed open for
    /// `client_header_timeout`, the connection ends with `GOAWAY` (`PROTOCOL_ERROR`, as
    /// nginx's timed-out read) and true; false for any other deadline.
    pub(super) fn h2_header_timeout(&mut self, key: usize) -> bool {
        let Some(idx) = session_of(self.conns[key].h2) else {
            return false;
        };
        let s = &self.h2[idx];
        if s.block_since_ms == 0
            || s.closed
            || s.lingering_until_ms != 0
            || self.cx.now_ms < s.block_since_ms + s.header_timeout_ms
        {
            return false;
        }
        crate::log!(
            Info,
            "client timed out (110: Connection timed out) while reading client request headers{}",
            self.log_context(key, None)
        );
        if matches!(
            self.h2_fail(key, idx, code::PROTOCOL_ERROR),
            super::step::Io::Close
        ) {
            self.close(key);
        }
        true
    }

    /// FIN after the last frame, then read and drop what still comes: closing with unread
    /// input would reset the connection and could destroy answers (or a GOAWAY) in flight.
    fn h2_shut(&mut self, key: usize, idx: usize) -> super::step::Io {
        let c = &mut self.conns[key];
        let fd = super::conn::fd_of(&c.fd);
        match c.tls.as_mut() {
            Some(t) => super::relay::Endpoint::shut(&mut super::tls::TlsSide { fd, t }),
            None => shard_event::sock::shutdown_write(fd),
        }
        let s = &mut self.h2[idx];
        s.lingering_until_ms = self.cx.now_ms + s.lingering.time_ms.max(1);
        self.h2_linger(key, idx)
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
            c.deadline_ms = (self.cx.now_ms + s.lingering.timeout_ms).min(s.lingering_until_ms);
            self.ensure_registered(key);
        }
        res
    }

    /// Takes the whole frames the session has read. `Ok(true)` when something happened;
    /// `Err` ends the connection with that code.
    fn h2_frames(&mut self, key: usize, idx: usize) -> Result<bool, ConnError> {
        let s = &mut self.h2[idx];
        if !s.preface_read {
            let n = s.input.len().min(h2frame::PREFACE.len());
            if s.input[..n] != h2frame::PREFACE[..n] {
                crate::log!(
                    Info,
                    "client sent invalid HTTP/2 preface{}",
                    self.log_context(key, None)
                );
                return Err(ConnError(code::PROTOCOL_ERROR));
            }
            if n < h2frame::PREFACE.len() {
                return Ok(false);
            }
            s.input.drain(..n);
            s.preface_read = true;
        }
        let mut input = std::mem::take(&mut s.input);
        let mut reader = std::mem::replace(&mut s.reader, Reader::new(0, 0));
        let mut pos = 0;
        let mut progress = false;
        let res = loop {
            if self.h2[idx].out.len() >= SESSION_OUT_MAX || self.h2[idx].closed {
                break Ok(());
            }
            let (frame, used) = match reader.next(&input[pos..]) {
                Ok(Some(f)) => f,
                Ok(None) => break Ok(()),
                Err(e) => break Err(e),
            };
            if let Some((id, dep, weight, exclusive)) = frame_priority(&input[pos..pos + used]) {
                self.h2[idx].prioritize(id, dep, weight, exclusive);
            }
            pos += used;
            progress = true;
            if let Err(e) = self.h2_frame(key, idx, frame) {
                break Err(e);
            }
        };
        input.drain(..pos);
        let s = &mut self.h2[idx];
        s.reader = reader;
        s.input = input;
        if let Err(ConnError(c)) = res {
            crate::log!(
                Info,
                "client HTTP/2 connection error: {}{}",
                match c {
                    code::PROTOCOL_ERROR => "protocol error",
                    code::FLOW_CONTROL_ERROR => "flow control error",
                    code::FRAME_SIZE_ERROR => "frame size error",
                    code::COMPRESSION_ERROR => "compression error",
                    code::ENHANCE_YOUR_CALM => "excessive load generating behavior",
                    _ => "error",
                },
                self.log_context(key, None)
            );
        }
        res.map(|()| progress)
    }

    /// One frame of the client's.
    fn h2_frame(&mut self, key: usize, idx: usize, frame: Frame<'_>) -> Result<(), ConnError> {
        let s = &mut self.h2[idx];
        match frame {
            Frame::Settings { ack: true, .. } => s.settings_acked = true,
            Frame::Priority { .. } | Frame::Unknown => {}
            Frame::Ping { ack: true, .. } => {}
            Frame::Ping { ack: false, data } => h2frame::push_ping_ack(&mut s.out, &data),
            Frame::Settings { ack: false, params } => {
                for (id, v) in params {
                    match id {
                        setting::ENABLE_PUSH if v > 1 => {
                            return Err(ConnError(code::PROTOCOL_ERROR))
                        }
                        setting::INITIAL_WINDOW_SIZE => {
                            if i64::from(v) > MAX_WINDOW {
                                return Err(ConnError(code::FLOW_CONTROL_ERROR));
                            }
                            let delta = i64::from(v) - s.peer_window;
                            s.peer_window = i64::from(v);
                            for st in s.streams.values_mut() {
                                st.send_window += delta;
                                if st.send_window > MAX_WINDOW {
                                    return Err(ConnError(code::FLOW_CONTROL_ERROR));
                                }
                            }
                        }
                        setting::MAX_FRAME_SIZE => {
                            if !(16_384..=16_777_215).contains(&v) {
                                return Err(ConnError(code::PROTOCOL_ERROR));
                            }
                            s.peer_max_frame = v as usize;
                        }
                        _ => {}
                    }
                }
                h2frame::push_settings_ack(&mut s.out);
                self.h2_unblock(idx);
            }
            Frame::WindowUpdate {
                stream: 0,
                increment,
            } => {
                s.send_window += i64::from(increment);
                if s.send_window > MAX_WINDOW {
                    return Err(ConnError(code::FLOW_CONTROL_ERROR));
                }
                self.h2_unblock(idx);
            }
            Frame::WindowUpdate { stream, increment } => {
                if stream > s.last_id {
                    return Err(ConnError(code::PROTOCOL_ERROR));
                }
                let Some(&sk) = s.ids.get(&stream) else {
                    return Ok(());
                };
                let Some(st) = s.streams.get_mut(&sk) else {
                    return Ok(());
                };
                if increment == 0 {
                    h2frame::push_rst_stream(&mut s.out, stream, code::PROTOCOL_ERROR);
                    self.h2_drop_stream(idx, sk);
                    return Ok(());
                }
                st.send_window += i64::from(increment);
                if st.send_window > MAX_WINDOW {
                    h2frame::push_rst_stream(&mut s.out, stream, code::FLOW_CONTROL_ERROR);
                    self.h2_drop_stream(idx, sk);
                    return Ok(());
                }
                if st.blocked && st.send_window > 0 && s.send_window > 0 {
                    st.blocked = false;
                    s.ready.push(sk);
                    if let Some(c) = self.conns.get_mut(sk) {
                        c.writable = true;
                    }
                }
            }
            Frame::Headers {
                stream,
                block,
                end_stream,
            } => {
                // The block is decoded whatever becomes of the stream: the decoder's table
                // is the connection's.
                // The fields in one buffer: (name start, value start, value end) each.
                let mut flat: Vec<u8> = Vec::with_capacity(block.len() * 2);
                let mut spans: Vec<(usize, usize, usize)> = Vec::with_capacity(16);
                let decoded = s.decoder.decode(block, s.max_list, |n, v| {
                    let a = flat.len();
                    flat.extend_from_slice(n);
                    let b = flat.len();
                    flat.extend_from_slice(v);
                    spans.push((a, b, flat.len()));
                });
                let fields: Vec<(&[u8], &[u8])> = spans
                    .iter()
                    .map(|&(a, b, c)| (&flat[a..b], &flat[b..c]))
                    .collect();
                if let Err(e) = decoded {
                    // nginx counts a new stream as processed from its HEADERS on: the GOAWAY
                    // names it as the last.
                    if stream > s.last_id && stream % 2 == 1 && !s.ids.contains_key(&stream) {
                        s.last_id = stream;
                    }
                    // nginx 1.22's answers: a field or a list over
                    // `large_client_header_buffers` is abuse, a block that ends inside a
                    // field a size error, the rest compression errors.
                    return Err(ConnError(match e {
                        hpack::Error::ListTooLarge | hpack::Error::FieldTooLarge => {
                            code::ENHANCE_YOUR_CALM
                        }
                        hpack::Error::Truncated => code::FRAME_SIZE_ERROR,
                        _ => code::COMPRESSION_ERROR,
                    }));
                }
                if let Some(&sk) = s.ids.get(&stream) {
                    // Trailers: they end the body; their fields are not kept.
                    if !end_stream {
                        return Err(ConnError(code::PROTOCOL_ERROR));
                    }
                    self.h2_body(idx, sk, b"", true);
                    return Ok(());
                }
                if stream <= s.last_id || stream % 2 == 0 {
                    return Err(ConnError(code::PROTOCOL_ERROR));
                }
                s.last_id = stream;
                s.payload_bytes += block.len() as u64;
                if s.going_away {
                    return Ok(());
                }
                if s.ids.len() >= s.max_streams as usize {
                    h2frame::push_rst_stream(&mut s.out, stream, code::REFUSED_STREAM);
                    return Ok(());
                }
                if !s.settings_acked && !end_stream && s.our_window < DEFAULT_WINDOW {
                    // nginx: "client sent stream with data before settings were
                    // acknowledged": its body could only break the smaller window.
                    crate::log!(
                        Info,
                        "client sent stream with data before settings were acknowledged"
                    );
                    h2frame::push_rst_stream(&mut s.out, stream, code::REFUSED_STREAM);
                    return Ok(());
                }
                let mut chunked = false;
                let Some(head) = request_head(&fields, end_stream, &mut chunked) else {
                    h2frame::push_rst_stream(&mut s.out, stream, code::PROTOCOL_ERROR);
                    return Ok(());
                };
                let head_only = fields.iter().any(|&(n, v)| n == b":method" && v == b"HEAD");
                let head_len = block.len() as u32;
                self.h2_stream(
                    key, idx, stream, head, head_len, chunked, head_only, end_stream,
                );
            }
            Frame::Data {
                stream,
                data,
                end_stream,
                flow_len,
            } => {
                s.recv_used += flow_len as u64;
                if stream > s.last_id {
                    return Err(ConnError(code::PROTOCOL_ERROR));
                }
                if flow_len == 0 && !end_stream {
                    s.empty_frames += 1;
                    if s.empty_frames > EMPTY_FRAMES_MAX {
                        return Err(ConnError(code::ENHANCE_YOUR_CALM));
                    }
                }
                let Some(&sk) = s.ids.get(&stream) else {
                    h2frame::push_rst_stream(&mut s.out, stream, code::STREAM_CLOSED);
                    return Ok(());
                };
                s.payload_bytes += data.len() as u64;
                let Some(st) = s.streams.get_mut(&sk) else {
                    return Ok(());
                };
                if st.recv_done {
                    h2frame::push_rst_stream(&mut s.out, stream, code::STREAM_CLOSED);
                    self.h2_drop_stream(idx, sk);
                    return Ok(());
                }
                st.recv_window -= flow_len as i64;
                if st.recv_window < 0 {
                    h2frame::push_rst_stream(&mut s.out, stream, code::FLOW_CONTROL_ERROR);
                    self.h2_drop_stream(idx, sk);
                    return Ok(());
                }
                // Padding is given back at once; the data when the stream has taken it.
                let pad = flow_len - data.len();
                if pad > 0 {
                    st.recv_window += pad as i64;
                    h2frame::push_window_update(&mut s.out, stream, pad as u32);
                }
                self.h2_body(idx, sk, data, end_stream);
            }
            Frame::RstStream { stream, .. } => {
                if stream > s.last_id {
                    return Err(ConnError(code::PROTOCOL_ERROR));
                }
                if let Some(&sk) = s.ids.get(&stream) {
                    self.h2_reset_by_client(key, idx, sk);
                }
            }
            Frame::GoAway { .. } => s.closed = true,
            Frame::PushPromise { .. } => return Err(ConnError(code::PROTOCOL_ERROR)),
        }
        Ok(())
    }

    /// Body bytes (or the end) of the stream on `sk`, into its connection's input.
    fn h2_body(&mut self, idx: usize, sk: usize, data: &[u8], end: bool) {
        let s = &mut self.h2[idx];
        let Some(st) = s.streams.get_mut(&sk) else {
            return;
        };
        let Some(c) = self.conns.get_mut(sk) else {
            return;
        };
        // A body that breaks its `content-length` (more DATA, or END_STREAM before it all
        // came) is a bad request, as nginx's `ngx_http_v2_process_request_body`: the request
        // answers 400 if it has not answered yet, and takes no more of it.
        let broken = match st.body_left.as_mut() {
            Some(left) if data.len() as u64 > *left => {
                Some("client intended to send body data larger than declared".to_string())
            }
            Some(left) if end && data.len() as u64 != *left => {
                let n = *left - data.len() as u64;
                Some(format!(
                    "client prematurely closed stream: {n} bytes of request body were not received"
                ))
            }
            Some(left) => {
                *left -= data.len() as u64;
                None
            }
            None => None,
        };
        if let Some(msg) = broken {
            crate::log!(Info, "{msg}");
            st.recv_done = true;
            st.body_left = Some(0);
            st.body_error = true;
            s.ready.push(sk);
            return;
        }
        if st.chunked_in && !data.is_empty() {
            c.inbuf
                .extend_from_slice(format!("{:x}\r\n", data.len()).as_bytes());
            c.inbuf.extend_from_slice(data);
            c.inbuf.extend_from_slice(b"\r\n");
        } else {
            c.inbuf.extend_from_slice(data);
        }
        if end && !st.recv_done {
            st.recv_done = true;
            if st.chunked_in {
                c.inbuf.extend_from_slice(b"0\r\n\r\n");
            }
        }
        s.ready.push(sk);
    }

    /// Gives windows back: the connection's as the client uses it, each stream's once its
    /// connection has taken what it was sent.
    fn h2_refill(&mut self, idx: usize) {
        let s = &mut self.h2[idx];
        if s.recv_used >= CONN_WINDOW_REFILL {
            h2frame::push_window_update(&mut s.out, 0, s.recv_used as u32);
            s.recv_used = 0;
        }
        // A small (or 0) `http2_body_preread_size` is the start only: a stream being read
        // gets at least a frame's worth back.
        let target = s.our_window.max(h2frame::DEFAULT_MAX_FRAME as i64);
        for (&sk, st) in s.streams.iter_mut() {
            if st.recv_done || st.recv_window > target / 2 {
                continue;
            }
            let waiting = self.conns.get(sk).map_or(0, |c| c.inbuf.len());
            if waiting < STREAM_INPUT_MAX {
                let give = target - st.recv_window;
                st.recv_window = target;
                h2frame::push_window_update(&mut s.out, st.id, give as u32);
            }
        }
    }

    /// Streams that waited for window or for the session's output go on when they can.
    /// Returns whether any did.
    fn h2_unblock(&mut self, idx: usize) -> bool {
        let s = &mut self.h2[idx];
        if s.out.len() >= SESSION_OUT_MAX || s.send_window <= 0 {
            return false;
        }
        // Those that waited go on in priority order (nginx's frame queue order).
        let mut go: Vec<(usize, u32)> = Vec::new();
        for (&sk, st) in s.streams.iter_mut() {
            if st.blocked && st.send_window > 0 {
                st.blocked = false;
                go.push((sk, st.id));
            }
        }
        let s = &self.h2[idx];
        go.sort_by_key(|&(_, id)| (s.priority_key(id), id));
        let any = !go.is_empty();
        for (sk, _) in go {
            self.h2[idx].ready.push(sk);
            if let Some(c) = self.conns.get_mut(sk) {
                c.writable = true;
            }
        }
        any
    }

    /// A stream the session ends on its own (its RST_STREAM is written): its connection
    /// closes, and its response is not finished again.
    fn h2_drop_stream(&mut self, idx: usize, sk: usize) {
        let s = &mut self.h2[idx];
        if let Some(st) = s.streams.remove(&sk) {
            s.ids.remove(&st.id);
        }
        self.close(sk);
    }

    /// A stream the client reset: its connection closes now, freeing its request, its
    /// upstream connection and its buffers; too many in a second end the session (rapid
    /// reset).
    fn h2_reset_by_client(&mut self, key: usize, idx: usize, sk: usize) {
        self.h2_drop_stream(idx, sk);
        let s = &mut self.h2[idx];
        if self.cx.now_ms.saturating_sub(s.resets_since_ms) > RESET_WINDOW_MS {
            s.resets = 0;
            s.resets_since_ms = self.cx.now_ms;
        }
        s.resets += 1;
        if s.resets > RESETS_PER_WINDOW * s.max_streams {
            let n = s.resets;
            crate::log!(
                Info,
                "client reset too many HTTP/2 streams ({n} in {RESET_WINDOW_MS} ms), closing connection{}",
                self.log_context(key, None)
            );
            let s = &mut self.h2[idx];
            s.go_away(code::ENHANCE_YOUR_CALM);
            s.closed = true;
        }
    }

    /// A new stream: its connection, and the HTTP/1.1 head of its request as its input
    /// (`head_len`: its header block as sent, `$request_length`).
    #[allow(clippy::too_many_arguments)]
    fn h2_stream(
        &mut self,
        key: usize,
        idx: usize,
        id: u32,
        head: Vec<u8>,
        head_len: u32,
        chunked_in: bool,
        head_only: bool,
        end_stream: bool,
    ) {
        let parent = &self.conns[key];
        let (peer, listener, number, opened) = (
            parent.peer,
            parent.listener,
            parent.number,
            parent.opened_ms,
        );
        let proxy_protocol = parent.proxy_protocol.clone();
        let body_left = (!chunked_in && !end_stream)
            .then(|| {
                shard_http::proxy::head_fields(&head)
                    .find(|(n, _)| n.eq_ignore_ascii_case(b"content-length"))
                    .and_then(|(_, v)| std::str::from_utf8(v).ok()?.parse::<u64>().ok())
            })
            .flatten();
        let conn_id = self.next_conn_id;
        self.next_conn_id += 1;
        let mut c = Conn::new_stream(peer, listener, conn_id, number, self.cx.now_ms);
        c.h2 = tag(H2_STREAM, idx);
        c.proxy_protocol = proxy_protocol;
        // `$connection_requests`: the streams of the connection so far, this one included
        // (its request counts itself when the phases take it).
        c.requests = self.h2[idx].taken;
        let sk = self.conns.insert(c);
        self.start_reading(sk, true);
        let s = &mut self.h2[idx];
        s.payload_bytes += head.len() as u64;
        // The head is the stream's input buffer; body data is appended to it.
        self.conns[sk].inbuf = head;
        s.ids.insert(id, sk);
        s.streams.insert(
            sk,
            Stream {
                id,
                send_window: s.peer_window,
                recv_window: s.our_window,
                chunked_in,
                body_left,
                body_error: false,
                head_len,
                head_only,
                recv_done: end_stream,
                out: Out::Head(Vec::new()),
                blocked: false,
                chunk: 8 * 1024,
            },
        );
        s.ready.push(sk);
        // nginx's `keepalive_requests` and `keepalive_time` for HTTP/2: the connection takes
        // no more streams (GOAWAY), those it has finish.
        s.taken += 1;
        let aged = self.cx.now_ms.saturating_sub(opened) >= s.keepalive_time_ms;
        if s.taken >= s.keepalive_requests || aged {
            s.go_away(code::NO_ERROR);
        }
    }

    /// Writes the session's frames to the socket.
    fn h2_write(&mut self, key: usize, idx: usize) -> super::step::Io {
        use super::step::Io;
        let c = &mut self.conns[key];
        let s = &mut self.h2[idx];
        let fd = super::conn::fd_of(&c.fd);
        // The frames being written are taken over whole, and new ones only once they are
        // out: what waits for a blocked socket stays in `s.out`, under its bound.
        loop {
            if c.out_pos >= c.out.len() {
                if s.out.is_empty() {
                    break;
                }
                c.out.clear();
                std::mem::swap(&mut c.out, &mut s.out);
                c.out_pos = 0;
            }
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
                    if n > 0 {
                        s.stalled_since_ms = 0;
                    }
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
        chunk: usize,
    ) -> std::io::Result<usize> {
        let gone = || std::io::Error::from(std::io::ErrorKind::BrokenPipe);
        let s = session_of(h2)
            .and_then(|i| sessions.get_mut(i))
            .ok_or_else(gone)?;
        let mut st = s.streams.remove(&key).ok_or_else(gone)?;
        st.chunk = chunk.max(1);
        let res = s.send(&mut st, buf);
        s.streams.insert(key, st);
        res
    }

    /// A stream connection closes: its response ends, whole or cut, and its session writes
    /// what that made (unless the session is the one driving it).
    pub(super) fn h2_stream_closed(&mut self, h2: u32, key: usize) {
        if h2 & super::h3::H3_STREAM != 0 {
            self.h3_stream_closed(h2, key);
            return;
        }
        let Some(idx) = session_of(h2) else {
            return;
        };
        let Some(s) = self.h2.get_mut(idx) else {
            return;
        };
        if let Some(mut st) = s.streams.remove(&key) {
            s.ids.remove(&st.id);
            s.finish(&mut st);
        }
        self.h2_stream_moved(h2);
    }

    /// A stream connection ran outside its session's drive (a timer, its upstream, its
    /// end): its session writes what the stream made.
    pub(super) fn h2_stream_moved(&mut self, h2: u32) {
        if h2 & super::h3::H3_STREAM != 0 {
            self.h3_stream_moved(h2);
            return;
        }
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
        self.h2[idx].go_away(code::NO_ERROR);
        self.drive(key);
    }

    /// `http2_rebalance`, looked at once a second: when this worker served well more
    /// requests in the last window than its siblings ([`rebalance_pick`]), the HTTP/2
    /// connections that carried them get a graceful `GOAWAY` (their streams in flight finish;
    /// the client opens a new connection for the next ones), and for
    /// [`REBALANCE_STEER_MS`] the master's steering deals new connections to the siblings.
    pub(super) fn h2_rebalance(&mut self) {
        use std::sync::atomic::Ordering::Relaxed;
        if self.shutting_down || !self.h2.iter().any(|(_, s)| s.rebalance) {
            return;
        }
        let me = self.cx.slot as *const crate::shm::WorkerSlot;
        let mine_now = self.cx.slot.requests.load(Relaxed);
        let others_now: Vec<Option<u64>> = self
            .region
            .current()
            .filter(|w| !std::ptr::eq(*w, me))
            .map(|w| (w.pid.load(Relaxed) != 0).then(|| w.requests.load(Relaxed)))
            .collect();
        let now = self.cx.now_ms;
        // Chosen at the last look and the steering bit never came: sent now.
        self.h2_shed_pending();
        let rb = &mut self.rebalance;
        let window_ms = now.saturating_sub(rb.since_ms);
        let comparable = rb.since_ms != 0 && rb.others.len() == others_now.len();
        let per_sec = |n: u64| n as f64 * 1000.0 / window_ms.max(1) as f64;
        let mine = per_sec(mine_now.saturating_sub(rb.mine));
        let others: Vec<f64> = others_now
            .iter()
            .zip(&rb.others)
            .filter_map(|(a, b)| Some(per_sec(a.as_ref()?.saturating_sub(*b.as_ref()?))))
            .collect();
        let decide = comparable && window_ms >= 500 && now >= rb.hold_until_ms;
        rb.since_ms = now;
        rb.mine = mine_now;
        rb.others = others_now;
        let conns: Vec<(usize, f64)> = self
            .h2
            .iter_mut()
            .map(|(_, s)| {
                let rate = per_sec(s.taken - s.taken_at_look);
                s.taken_at_look = s.taken;
                (s, rate)
            })
            .filter(|(s, _)| s.rebalance && !s.going_away && !s.closed)
            .map(|(s, rate)| (s.key, rate))
            .collect();
        if !decide {
            return;
        }
        let picked = rebalance_pick(mine, &others, &conns);
        if picked.is_empty() {
            return;
        }
        crate::log!(
            Info,
            "http2_rebalance: {mine:.0} requests/s against siblings' {:?}: GOAWAY to {} of {} \
             HTTP/2 connections",
            others.iter().map(|o| o.round() as u64).collect::<Vec<_>>(),
            picked.len(),
            conns.len()
        );
        self.rebalance.hold_until_ms = now + REBALANCE_HOLD_MS;
        crate::shm::WorkerSlot::bump(&self.cx.slot.h2_rebalanced, picked.len() as u64);
        self.rebalance.pending = picked
            .into_iter()
            .map(|key| (key, self.conns[key].id))
            .collect();
        // Where the master steers (reuseport with `reuseport_steering`), it first takes
        // this worker out of the program for `REBALANCE_STEER_MS`; its bit says when.
        let steered = self.cx.cfg.events.reuseport_steering
            && self.n_workers >= 2
            && self.cx.cfg.listeners.iter().any(|l| l.opts.reuseport);
        if steered {
            self.cx
                .slot
                .shed_until_ms
                .store(now + REBALANCE_STEER_MS, Relaxed);
        } else {
            self.h2_shed_pending();
        }
    }

    /// Sends the `GOAWAY`s `http2_rebalance` chose (see `Rebalance::pending`) to those
    /// connections still open.
    pub(super) fn h2_shed_pending(&mut self) {
        let pending = std::mem::take(&mut self.rebalance.pending);
        if pending.is_empty() {
            return;
        }
        // The steering window runs from the GOAWAYs, when their clients reconnect.
        if self
            .cx
            .slot
            .shed_until_ms
            .load(std::sync::atomic::Ordering::Relaxed)
            != 0
        {
            self.cx.slot.shed_until_ms.store(
                self.cx.now_ms + REBALANCE_STEER_MS,
                std::sync::atomic::Ordering::Relaxed,
            );
        }
        for (key, id) in pending {
            if self.conns.get(key).is_some_and(|c| c.id == id) {
                self.h2_go_away(key);
            }
        }
    }

    /// Whether chosen connections wait for the steering bit (see `Rebalance::pending`).
    pub(super) fn h2_shed_waiting(&self) -> bool {
        !self.rebalance.pending.is_empty()
    }

    /// `$http2`: `h2` or `h2c` for a stream connection, empty otherwise.
    pub(super) fn h2_var(&self, key: usize) -> &'static str {
        let c = &self.conns[key];
        if c.h2 & H2_STREAM == 0 || c.h2 & super::h3::H3_STREAM != 0 {
            return "";
        }
        match session_of(c.h2).and_then(|i| self.h2.get(i)) {
            Some(s) if s.tls => "h2",
            Some(_) => "h2c",
            None => "",
        }
    }

    /// Whether the request on `key` came over TLS: its own connection's, its HTTP/2
    /// session's, or QUIC's (an HTTP/3 stream).
    pub(super) fn is_tls(&self, key: usize) -> bool {
        let Some(c) = self.conns.get(key) else {
            return false;
        };
        c.tls.is_some()
            || c.h2 & super::h3::H3_STREAM != 0
            || self
                .h2_parent(key)
                .is_some_and(|p| self.conns[p].tls.is_some())
    }

    /// The TLS of the session a stream connection belongs to (for `$ssl_*`, `$https`).
    /// The HTTP/2 stream the connection `key` carries, if it is one.
    pub(super) fn h2_stream_of(&self, key: usize) -> Option<&Stream> {
        self.h2_session_of_stream(key)?.streams.get(&key)
    }

    pub(super) fn h2_parent(&self, key: usize) -> Option<usize> {
        self.h2_session_of_stream(key).map(|s| s.key)
    }

    /// The session of the HTTP/2 stream connection `key` (none for HTTP/3's streams).
    fn h2_session_of_stream(&self, key: usize) -> Option<&Session> {
        let c = self.conns.get(key)?;
        if c.h2 & H2_STREAM == 0 || c.h2 & super::h3::H3_STREAM != 0 {
            return None;
        }
        self.h2.get(session_of(c.h2)?)
    }
}

#[cfg(test)]
mod tests {
    use super::rebalance_pick;

    #[test]
    fn rebalancing_sheds_only_from_a_worker_well_above_its_siblings() {
        let conns = [(1, 400.0), (2, 200.0), (3, 100.0), (4, 0.0)];
        // Even, light, or no sibling: nothing.
        assert!(rebalance_pick(700.0, &[650.0], &conns).is_empty());
        assert!(rebalance_pick(40.0, &[0.0], &conns).is_empty());
        assert!(rebalance_pick(700.0, &[], &conns).is_empty());
        // 700 against 100: a gap of 600, half of it moved by the heaviest that fit (200 and
        // 100 make 300; the 400 alone would leave a gap of 200 the other way).
        assert_eq!(rebalance_pick(700.0, &[100.0], &conns), vec![2, 3]);
        // Against two siblings at 100 and 300 (mean 200): a gap of 500, 250 to move.
        assert_eq!(rebalance_pick(700.0, &[100.0, 300.0], &conns), vec![2]);
    }

    #[test]
    fn one_heavy_connection_moves_only_when_that_narrows_the_gap() {
        // 1000 against 400: a gap of 600; the 500 alone is above half of it, and moving it
        // leaves a gap of 400 the other way: still narrower.
        assert_eq!(
            rebalance_pick(1000.0, &[400.0], &[(7, 500.0), (8, 0.0)]),
            vec![7]
        );
        // The 1000 is the whole load: moving it moves the gap, never narrows it.
        assert!(rebalance_pick(1000.0, &[100.0], &[(7, 1000.0)]).is_empty());
        // A connection with nothing in the window, or next to nothing, is never chosen.
        assert!(rebalance_pick(1000.0, &[100.0], &[(8, 0.0)]).is_empty());
        assert_eq!(
            rebalance_pick(1000.0, &[100.0], &[(7, 300.0), (8, 1.0), (9, 20.0)]),
            vec![7]
        );
    }
}
