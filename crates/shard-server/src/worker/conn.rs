//! One client connection of a worker: its buffers, its phase, and the loop that drives it.
//!
//! `drive` is the only place that reads, writes and closes a connection. It runs until the
//! connection must wait for the kernel (socket drained, send buffer full) and then makes sure the
//! connection is registered in epoll, once, edge-triggered.

use std::net::SocketAddr;
use std::os::fd::{AsRawFd, OwnedFd};

use shard_config::{ErrorPageStatus, LingeringClose, LocationConf, LogFormat, VerifyClient};
use shard_http::body::ChunkedDecoder;

use super::script::Outcome;
use super::step::{Flush, Io, Reply, Step};
use super::tls::ClientOutcome;
use super::Worker;
use crate::shm::WorkerSlot;

/// First read buffer of a connection. Larger heads grow it up to the
/// `large_client_header_buffers` total.
const READ_BUFFER_BYTES: usize = 4096;
/// Bytes of a static file copied per `pread` when `sendfile` is off.
const FILE_CHUNK_BYTES: usize = 32 * 1024;
/// File chunks (`pread` + `write`, or one `sendfile`) moved per `flush` call: a client that
/// reads fast enough does not keep the worker to itself for a whole large file.
const FLUSH_CHUNKS_MAX: usize = 16;
/// A file body up to this size, without `sendfile`, is read into the output buffer behind its
/// head (one `pread`), so that both leave in one write.
const INLINE_BODY_BYTES: u64 = 32 * 1024;
/// A head is sent with `MSG_MORE` (held back to share a segment with the file) only before a
/// `sendfile` body up to this size. Measured on loopback: 18% less worker CPU per request for
/// 33 B and 16 KiB files, but 4.5 times more for a 1 MiB file, whose `sendfile` then builds
/// its segments the slow way.
const CORK_FILE_MAX_BYTES: u64 = 64 * 1024;
/// Bytes of a mapped file (`files::OpenFile::mapping`) given to one `writev`, a chunk as
/// [`FILE_CHUNK_BYTES`]. Measured on loopback, 1 MiB file: 16 KiB costs 1.3 times the worker
/// CPU per request of 32 KiB, 64 KiB 1.9 times, 256 KiB 1.3 times.
const MAPPED_WRITE_BYTES: u64 = 32 * 1024;
/// Spare requests a worker keeps for reuse (`Worker::req_spares`), 464 bytes each.
const REQ_SPARES_MAX: usize = 64;
/// Pipelined responses gathered before a write.
const PIPELINE_GATHER_BYTES: usize = 64 * 1024;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Phase {
    /// Reading a request head.
    Reading,
    /// Processing a request: writing its response and discarding its body.
    Writing,
    /// Idle keep-alive.
    Waiting,
}

enum BodyLeft {
    None,
    Length(u64),
    Chunked(ChunkedDecoder),
}

struct FileBody {
    /// Shared with `open_file_cache` when the location has one.
    fd: super::files::FileRef,
    offset: u64,
    remaining: u64,
    sendfile: bool,
    /// Sent from the file's mapping, with the head in the same `writev`.
    mapped: bool,
    /// The loop turn in which a `stat` made for this request gave the size the response
    /// uses; `None` once part of the body left from the mapping (see `flush`).
    size_checked_turn: Option<u64>,
    /// `charset` with `source_charset` and a `charset_map`: each byte read is replaced
    /// (the file is then read, never sent by `sendfile` or from its mapping).
    recode: Option<std::sync::Arc<[u8; 256]>>,
}

impl FileBody {
    /// Appends up to `want` bytes from where the body is (recoded when it must be) to
    /// `out`, and moves past them. `Ok(0)`: the file ended before the body did.
    fn read_into(&mut self, out: &mut Vec<u8>, want: usize) -> std::io::Result<usize> {
        let n = shard_event::sock::pread_append(self.fd.as_raw_fd(), out, want, self.offset)?;
        if let Some(t) = self.recode.as_deref() {
            let at = out.len() - n;
            recode(&mut out[at..], t);
        }
        self.offset += n as u64;
        self.remaining -= n as u64;
        Ok(n)
    }
}

/// Replaces each byte of `data` by its entry in `table` (`charset_map`).
pub(super) fn recode(data: &mut [u8], table: &[u8; 256]) {
    for b in data {
        *b = table[usize::from(*b)];
    }
}

pub(super) struct Conn {
    /// Closed when the connection is dropped (`close`); closing also removes it from epoll.
    /// None for a stream of an HTTP/2 connection (`h2.rs`), which has no socket of its own.
    pub(super) fd: Option<OwnedFd>,
    /// HTTP/2: the session (index into `Worker::h2`) this connection carries (`H2_SESSION`)
    /// or is a stream of (`H2_STREAM`); 0 for HTTP/1.x.
    pub(super) h2: u32,
    /// A subrequest's connection (`ssi.rs`): its index into `Worker::subs` + 1; 0 otherwise.
    /// No socket either: its output goes to its parent's pipe.
    pub(super) sub: u32,
    pub(super) id: u64,
    /// Its number among every connection of the server (`$connection`, the error log's `*N`).
    pub(super) number: u64,
    pub(super) peer: Option<SocketAddr>,
    /// Index into `Config::listeners`.
    pub(super) listener: usize,
    pub(super) phase: Phase,
    /// Accepted and nothing read yet: counted as waiting, as nginx counts a connection that
    /// has not sent a byte (`stub_status`), though its phase is already `Reading`.
    pub(super) before_first_byte: bool,
    pub(super) registered: bool,
    /// The socket may have unread bytes (set by an event or at accept, cleared on a short read).
    pub(super) readable: bool,
    pub(super) writable: bool,
    pub(super) eof: bool,
    /// The peer's end of stream (or an error) was reported with an event: a short read then
    /// does not mean drained, since the edge that reported the FIN will not come again.
    pub(super) hup: bool,
    pub(super) inbuf: Vec<u8>,
    pub(super) out: Vec<u8>,
    pub(super) out_pos: usize,
    pub(super) requests: u64,
    /// When the connection was accepted (`keepalive_time`).
    pub(super) opened_ms: u64,
    pub(super) deadline_ms: u64,
    pub(super) close_after: bool,
    /// Closing: the write side is shut and input is read and dropped until end of stream or
    /// the lingering deadline, so the peer sees our response and not a reset.
    pub(super) lingering: bool,
    /// TLS records of a connection accepted on an `ssl` listener (`tls.rs`).
    pub(super) tls: Option<Box<super::tls::TlsConn>>,
    /// Plain HTTP arrived on an `ssl` listener: its request is answered with nginx's 400
    /// ("The plain HTTP request was sent to HTTPS port", `error_page 497`).
    pub(super) plain_on_tls: bool,
    /// `listen ... proxy_protocol`: the PROXY protocol header is still to be read, before
    /// anything else (the TLS handshake too).
    pub(super) pp_pending: bool,
    /// The PROXY protocol header it began with (`$proxy_protocol_*`, `real_ip_header
    /// proxy_protocol`).
    pub(super) proxy_protocol: Option<Box<shard_http::proxy_protocol::Header>>,
    /// The earliest deadline queued in the timer heap for this connection.
    pub(super) timer_at: u64,
    /// The request in progress: every phase but `Waiting` has one (`start_reading` makes
    /// it); a connection between requests holds none.
    pub(super) req: Option<Box<Req>>,
}

/// What one request holds, from the first byte of its head to the end of its response (and
/// of the lingering close after it).
pub(super) struct Req {
    file: Option<FileBody>,
    body: BodyLeft,
    pub(super) body_bytes_max: u64,
    pub(super) body_bytes: u64,
    /// The worker's number for it, which `$request_id` is made from when asked for.
    pub(super) request_seq: u64,
    /// When its head was complete (monotonic ms; `$request_time`).
    pub(super) request_started_ms: u64,
    /// Index into `HttpConf::servers` of the current request's server.
    pub(super) server: usize,
    /// The current request's regex captures (`$1`...) in its path, or in `capture_text` when
    /// a rewrite instruction made them.
    pub(super) captures: shard_http::route::Captures,
    pub(super) capture_text: Option<String>,
    /// The names of `captures` (a regex's `(?<name>...)` groups), by index.
    pub(super) capture_names: Vec<Option<String>>,
    /// Values `set` gave the current request's variables.
    pub(super) user_vars: Vec<(String, Vec<u8>)>,
    /// `add_header`s of an `if` that held: they replace the location's for this response.
    pub(super) if_headers: Option<Vec<shard_config::AddHeader>>,
    /// `proxy_pass` inside an `if` that held: the location (index into the server's) the
    /// request takes once the location's rewrite phase ends.
    pub(super) if_location: Option<usize>,
    /// The userid module's `Set-Cookie` (and `P3P`) lines for this response.
    pub(super) uid_header: Option<Box<[u8]>>,
    /// `$upstream_cache_status` of the proxied response ("" without a cache).
    pub(super) cache_status: &'static str,
    /// The peers a proxied request tried before it went on to an `error_page`.
    pub(super) upstream_tries: Vec<shard_http::vars::UpstreamTry>,
    /// `$request_body` after a proxied request went on to an `error_page` or an
    /// `X-Accel-Redirect` (empty otherwise).
    pub(super) request_body: Vec<u8>,
    /// The body a failed proxied request read, kept for the proxied location its
    /// `error_page` leads to (nginx gives the next upstream the same body).
    pub(super) kept_body: Option<Box<super::body::Spool>>,
    /// `$slice_range`: the slice the proxy asks for now (`slice`; empty otherwise).
    pub(super) slice_range: String,
    /// `$pipe`: the request was already in the input when the one before it ended.
    pub(super) pipelined: bool,
    /// The current request's client: the peer, or what `set_real_ip_from` lets a header say.
    pub(super) client: Option<SocketAddr>,
    /// `limit_req` delays the request (still unparsed in `inbuf`) until then (0: not delayed).
    pub(super) delayed_until: u64,
    /// The delayed request was counted by `limit_req` already.
    pub(super) limit_passed: bool,
    /// `auth_delay`: the response (a 401) leaves no earlier than this (0: not held).
    pub(super) hold_until_ms: u64,
    /// `auth_request`: the status its subrequest answered (`None`: not asked yet).
    pub(super) auth_status: Option<u16>,
    /// Written after the file body (`add_trailer`: the end of its chunk, the last chunk and
    /// the trailers).
    pub(super) tail: Vec<u8>,
    /// `$limit_req_status`, `$limit_conn_status` of the request ("" where no limit ran).
    pub(super) limit_req_status: &'static str,
    pub(super) limit_conn_status: &'static str,
    /// `limit_conn` counts this request holds: (zone, key), released when it ends.
    pub(super) conn_held: Vec<(usize, u128)>,
    /// The request is being answered by an `error_page`: no second one replaces its errors.
    pub(super) in_error_page: bool,
    /// The status an `error_page` gives a successful answer (`error_page 404 /404.html` sends
    /// the page with 404).
    pub(super) status_override: Option<u16>,
    /// The `Location` of an answer an `error_page` took (`return 302 URL` with `error_page
    /// 302 /page`): nginx keeps the header across the internal redirect, so the page goes
    /// out with it.
    pub(super) kept_location: Option<Box<str>>,
    /// `lingering_close`, `lingering_time`, `lingering_timeout` of the request's location.
    pub(super) linger: shard_config::Lingering,
    /// When reading to discard (a body nobody needs, or input before a close) must end: the
    /// start of that reading plus `lingering_time`; 0 while not discarding.
    pub(super) linger_until_ms: u64,
    pub(super) send_timeout_ms: u64,
    /// `http2_chunk_size` of the request's location: its DATA frames' largest size.
    pub(super) h2_chunk: usize,
    /// `client_body_timeout` of the request's location.
    pub(super) body_timeout_ms: u64,
    pub(super) keepalive_timeout_ms: u64,
    /// The request being proxied (`proxy.rs`).
    pub(super) proxy: Option<Box<super::proxy::Proxy>>,
    /// `auth_basic` refused the request: the realm its 401 names in `WWW-Authenticate`.
    pub(super) www_authenticate: Option<String>,
    /// Header lines an upstream's `X-Accel-Redirect` response passes on to the response
    /// of its redirect (`Set-Cookie`, `Content-Disposition`, `Cache-Control`, `Expires`,
    /// `Accept-Ranges`, as nginx), each ending in CRLF.
    pub(super) accel_headers: Option<Box<[u8]>>,
    /// `limit_rate` of the current response (`None`: unlimited).
    pub(super) rate: Option<Box<Rate>>,
    /// `set $limit_rate` or an upstream's `X-Accel-Limit-Rate`: the rate, over `limit_rate`.
    pub(super) rate_set: Option<u64>,
    /// The response head's length, for `$bytes_sent` (0 where unknown), and the head itself
    /// where a log format reads `$sent_http_NAME`.
    pub(super) head_bytes: u64,
    pub(super) sent_head: Vec<u8>,
    /// The error log context of the request's server or location (`log::set_context`).
    pub(super) log_ctx: (u64, u8),
    /// `ssi on`: the response leaves through this pipe (`ssi.rs`).
    pub(super) ssi: Option<Box<super::ssi::Pipe>>,
}

/// [`Conn::rq`] on the field alone, so that the connection's other fields stay free to borrow.
#[inline]
fn req_of(req: &mut Option<Box<Req>>) -> &mut Req {
    match req {
        Some(r) => r,
        None => req_missing(req),
    }
}

#[cold]
#[inline(never)]
fn req_missing(req: &mut Option<Box<Req>>) -> &mut Req {
    debug_assert!(false, "a request outside a request");
    req.insert(Box::new(Req::fallback()))
}

/// [`Conn::raw_fd`] on the field alone.
pub(super) fn fd_of(fd: &Option<OwnedFd>) -> std::os::fd::RawFd {
    fd.as_ref().map_or(-1, |f| f.as_raw_fd())
}

/// Where a connection's response bytes go: its socket (or TLS), its HTTP/2 session's frames,
/// or its parent's subrequest output (`ssi.rs`).
struct Sink {
    h2_tag: u32,
    sub: u32,
    fd: std::os::fd::RawFd,
    key: usize,
    chunk: usize,
}

impl Sink {
    fn of(h2_tag: u32, sub: u32, fd: &Option<OwnedFd>, key: usize, chunk: usize) -> Sink {
        Sink {
            h2_tag,
            sub,
            fd: fd_of(fd),
            key,
            chunk,
        }
    }

    fn write(
        &self,
        h2: &mut slab::Slab<super::h2::Session>,
        h3: &mut slab::Slab<super::h3::H3Conn>,
        subs: &mut slab::Slab<super::ssi::SubOut>,
        tls: &mut Option<Box<super::tls::TlsConn>>,
        b: &[u8],
        cork: bool,
    ) -> std::io::Result<usize> {
        if self.h2_tag & super::h3::H3_STREAM != 0 {
            Worker::h3_send(h3, self.h2_tag, self.key, b)
        } else if self.h2_tag & super::h2::H2_STREAM != 0 {
            Worker::h2_send(h2, self.h2_tag, self.key, b, self.chunk)
        } else if self.sub != 0 {
            super::ssi::sub_send(subs, self.sub, b)
        } else {
            send(self.fd, tls, b, cork)
        }
    }
}

/// Writes `buf` to the socket `fd`, or through its TLS.
fn send(
    fd: std::os::fd::RawFd,
    tls: &mut Option<Box<super::tls::TlsConn>>,
    buf: &[u8],
    more: bool,
) -> std::io::Result<usize> {
    match tls.as_mut() {
        Some(t) => super::tls::write(fd, t, buf),
        None if more => shard_event::sock::send_more(fd, buf),
        None => shard_event::sock::write(fd, buf),
    }
}

impl Req {
    /// Bytes of the file body still to send (`None`: no file body).
    pub(super) fn file_remaining(&self) -> Option<u64> {
        self.file.as_ref().map(|f| f.remaining)
    }

    /// Makes a used request a new one, begun on a connection whose listener's default server
    /// has the settings `base`: its timeouts are that server's until the request picks a
    /// location. What the vectors hold is dropped, their room kept.
    fn reset(&mut self, base: &shard_config::LocationConf) {
        self.file = None;
        self.body = BodyLeft::None;
        self.body_bytes_max = 0;
        self.body_bytes = 0;
        self.request_seq = 0;
        self.request_started_ms = 0;
        self.server = 0;
        self.captures.clear();
        self.capture_text = None;
        self.capture_names.clear();
        self.user_vars.clear();
        self.if_headers = None;
        self.if_location = None;
        self.uid_header = None;
        self.cache_status = "";
        self.upstream_tries.clear();
        self.request_body = Vec::new();
        self.client = None;
        self.delayed_until = 0;
        self.limit_passed = false;
        self.hold_until_ms = 0;
        self.auth_status = None;
        self.tail.clear();
        self.limit_req_status = "";
        self.limit_conn_status = "";
        self.conn_held.clear();
        self.in_error_page = false;
        self.status_override = None;
        self.kept_location = None;
        self.kept_body = None;
        self.slice_range.clear();
        self.linger = base.lingering;
        self.linger_until_ms = 0;
        self.send_timeout_ms = base.send_timeout_ms;
        self.h2_chunk = base.http2_chunk_size;
        self.body_timeout_ms = base.client_body_timeout_ms;
        self.keepalive_timeout_ms = base.keepalive_timeout_ms;
        self.proxy = None;
        self.www_authenticate = None;
        self.accel_headers = None;
        self.rate = None;
        self.rate_set = None;
        self.head_bytes = 0;
        self.sent_head = Vec::new();
        self.log_ctx = (0, 0);
        self.ssi = None;
    }

    /// nginx's defaults, for [`Conn::rq`]'s case that should not happen.
    fn fallback() -> Req {
        Req::timeouts(
            shard_config::Lingering {
                close: LingeringClose::On,
                time_ms: 30_000,
                timeout_ms: 5_000,
            },
            60_000,
            60_000,
            75_000,
        )
    }

    #[cold]
    #[inline(never)]
    fn fallback_ref() -> &'static Req {
        debug_assert!(false, "a request outside a request");
        thread_local!(static FALLBACK: &'static Req = Box::leak(Box::new(Req::fallback())));
        FALLBACK.with(|r| *r)
    }

    fn timeouts(linger: shard_config::Lingering, send: u64, body: u64, keepalive: u64) -> Req {
        Req {
            file: None,
            body: BodyLeft::None,
            body_bytes_max: 0,
            body_bytes: 0,
            request_seq: 0,
            request_started_ms: 0,
            server: 0,
            captures: Vec::new(),
            capture_text: None,
            capture_names: Vec::new(),
            user_vars: Vec::new(),
            if_headers: None,
            if_location: None,
            uid_header: None,
            cache_status: "",
            upstream_tries: Vec::new(),
            request_body: Vec::new(),
            pipelined: false,
            client: None,
            delayed_until: 0,
            limit_passed: false,
            hold_until_ms: 0,
            auth_status: None,
            tail: Vec::new(),
            limit_req_status: "",
            limit_conn_status: "",
            conn_held: Vec::new(),
            in_error_page: false,
            status_override: None,
            kept_location: None,
            kept_body: None,
            slice_range: String::new(),
            linger,
            linger_until_ms: 0,
            send_timeout_ms: send,
            h2_chunk: 8 * 1024,
            body_timeout_ms: body,
            keepalive_timeout_ms: keepalive,
            proxy: None,
            www_authenticate: None,
            accel_headers: None,
            rate: None,
            rate_set: None,
            head_bytes: 0,
            sent_head: Vec::new(),
            log_ctx: (0, 0),
            ssi: None,
        }
    }
}

/// How many internal redirects (`try_files`, `error_page`) one request may take; one more is
/// nginx's "rewrite or internal redirection cycle" (500).
const MAX_INTERNAL_REDIRECTS: usize = 10;

/// What `limit_conn` and `limit_req` decided for a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Limited {
    Pass,
    /// Milliseconds to hold the request back.
    Delay(u64),
    /// The status to refuse it with.
    Refuse(u16),
}

/// What the phases before the content decided for a request.
enum Action {
    /// The location's content: proxy, `return`, status page or static file.
    Content,
    /// An error status (`deny`, `internal`, `try_files ... =404`).
    Status(u16),
    /// A `return` (or redirecting `rewrite`) of the rewrite instructions, its text expanded.
    Return(u16, Option<String>),
    Redirect(Redirect),
    /// An answer with no body of shard's own making (WebDAV): status, `Location`.
    Answer(u16, Option<String>),
}

/// A request between its limits and its content, for [`Worker::run_phases`].
pub(super) struct Phases {
    pub(super) req: shard_http::request::Request,
    pub(super) head: Vec<u8>,
    /// Internal redirects so far.
    pub(super) hops: usize,
    pub(super) keep_alive: bool,
    /// The input buffer holds more than this request's head (a pipelined request or a body).
    pub(super) more_input: bool,
    /// A status the phases answer with at once (497, 495, 496, a limit's refusal, a failed
    /// upstream's 502 or 504).
    pub(super) forced: Option<u16>,
    /// The rewrite phases' verdict when they already ran.
    pub(super) rewritten: Option<Rewritten>,
    /// The request's upstream failed: an error page is not proxied again (the status's own
    /// page is sent instead).
    pub(super) after_upstream: bool,
}

/// What nginx's rewrite phases decided for a request.
pub(super) enum Rewritten {
    /// Go on in the location found.
    Stay,
    /// `return` (or a redirecting `rewrite`), its text expanded.
    Return(u16, Option<String>),
    /// The location's instructions are a `return` (`LocationConf::ret`, answered by the
    /// content step): no limit, access rule or `try_files` applies.
    Returned,
    /// More than `MAX_INTERNAL_REDIRECTS` changes of location: nginx's 500.
    Cycle,
    /// The content is decided (a WebDAV `PUT` done): this status, with this `Location`.
    Answer(u16, Option<String>),
}

/// Where an internal redirect goes.
pub(super) enum Redirect {
    Named(String),
    Uri { path: String, query: Option<String> },
}

impl Redirect {
    /// `@name`, or a URI whose `?` starts its arguments (none: no arguments, as nginx).
    pub(super) fn parse(target: &str) -> Redirect {
        if target.starts_with('@') {
            return Redirect::Named(target.to_string());
        }
        match target.split_once('?') {
            Some((p, q)) => Redirect::Uri {
                path: p.to_string(),
                query: Some(q.to_string()),
            },
            None => Redirect::Uri {
                path: target.to_string(),
                query: None,
            },
        }
    }
}

/// `$request_id` of request number `seq` of this worker: 128 bits no other request shares,
/// from a random per-worker key mixed (splitmix64) with the sequence number.
fn request_id(key: u64, seq: u64) -> u128 {
    fn mix(mut z: u64) -> u64 {
        z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    let hi = mix(key ^ seq);
    let lo = mix(key.rotate_left(32) ^ seq.wrapping_mul(0xD6E8_FEB8_6659_FD93));
    (u128::from(hi) << 64) | u128::from(lo)
}

/// What one read of a connection's socket gave ([`Conn::read`]).
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Read {
    /// Bytes arrived.
    Got,
    /// Interrupted: read again.
    Again,
    /// The socket is drained: wait for the kernel.
    Drained,
    /// The input buffer holds all a head may take: the parser decides (431, 414).
    Full,
    /// The turn's TLS handshake budget is spent: go on after the other connections.
    Deferred,
    /// End of stream, or an error: close.
    Closed,
}

impl Conn {
    /// A connection accepted on an HTTP listener, before its first request.
    pub(super) fn new(
        fd: OwnedFd,
        peer: Option<SocketAddr>,
        listener: usize,
        id: u64,
        number: u64,
        now_ms: u64,
    ) -> Conn {
        let mut c = Conn::new_socketless(peer, listener, id, number, now_ms);
        c.fd = Some(fd);
        c
    }

    fn new_socketless(
        peer: Option<SocketAddr>,
        listener: usize,
        id: u64,
        number: u64,
        now_ms: u64,
    ) -> Conn {
        Conn {
            fd: None,
            h2: 0,
            sub: 0,
            id,
            number,
            peer,
            listener,
            phase: Phase::Reading,
            before_first_byte: false,
            registered: false,
            readable: true,
            writable: true,
            eof: false,
            hup: false,
            inbuf: Vec::new(),
            out: Vec::new(),
            out_pos: 0,
            requests: 0,
            opened_ms: now_ms,
            deadline_ms: 0,
            close_after: false,
            lingering: false,
            tls: None,
            plain_on_tls: false,
            pp_pending: false,
            proxy_protocol: None,
            timer_at: u64::MAX,
            req: None,
        }
    }

    /// A stream of an HTTP/2 session (`h2.rs`): no socket; its input is put in `inbuf` by
    /// the session, its output goes to the session's frames.
    pub(super) fn new_stream(
        peer: Option<SocketAddr>,
        listener: usize,
        id: u64,
        number: u64,
        now_ms: u64,
    ) -> Conn {
        let mut c = Conn::new_socketless(peer, listener, id, number, now_ms);
        c.readable = false;
        c.registered = true;
        c
    }

    /// Reads into the spare room of `buf`, at most `max` bytes: from the socket, or through
    /// TLS. The contract of `read(2)` (`Ok(0)` at end of stream, `WouldBlock`), and a short
    /// read still means drained. Plain HTTP on a TLS port comes back as its bytes, appended,
    /// with `plain_on_tls` set (only at the connection's first read, into `inbuf`).
    pub(super) fn recv(&mut self, buf: &mut Vec<u8>, max: usize) -> std::io::Result<usize> {
        if self.fd.is_none() {
            // An HTTP/2 stream: its session puts its input in `inbuf`.
            return Err(std::io::ErrorKind::WouldBlock.into());
        }
        let fd = self.raw_fd();
        let Some(t) = self.tls.as_mut() else {
            return shard_event::sock::read_into_max(fd, buf, max);
        };
        match super::tls::read_into(fd, t, buf, max) {
            Ok(n) => {
                // close_notify (or the end of stream) came with these bytes: the next read
                // returns 0 although no event will say so.
                if t.peer_closed {
                    self.hup = true;
                }
                Ok(n)
            }
            Err(super::tls::NotTls::Error(e)) => Err(e),
            Err(super::tls::NotTls::Plain(bytes)) => {
                self.tls = None;
                self.plain_on_tls = true;
                buf.extend_from_slice(&bytes);
                // More of the request may wait in the socket: read on to `EAGAIN` (rustls
                // read at most a record's worth, not what the buffer had room for).
                self.readable = true;
                self.hup = true;
                Ok(bytes.len().max(1))
            }
        }
    }

    /// The request in progress. A connection has one in every phase but `Waiting`; should a
    /// step reach for it between requests, it gets one with nginx's default timeouts rather
    /// than a worker that panics.
    /// The socket's descriptor; -1 for an HTTP/2 stream, so that a system call made on it by
    /// mistake fails (`EBADF`) rather than reaching another file.
    pub(super) fn raw_fd(&self) -> std::os::fd::RawFd {
        fd_of(&self.fd)
    }

    #[inline]
    pub(super) fn rq(&mut self) -> &mut Req {
        req_of(&mut self.req)
    }

    /// The request in progress, to read; see [`Conn::rq`].
    #[inline]
    pub(super) fn rd(&self) -> &Req {
        match self.req.as_deref() {
            Some(r) => r,
            None => Req::fallback_ref(),
        }
    }

    pub(super) fn is_idle(&self) -> bool {
        self.phase == Phase::Waiting && self.inbuf.is_empty() && self.out_pos >= self.out.len()
    }

    pub(super) fn has_output(&self) -> bool {
        self.out_pos < self.out.len()
            || self.has_file()
            || self.tls.as_ref().is_some_and(|t| t.has_output())
            || self.ssi_busy()
    }

    /// An SSI response whose bytes were all taken is not all out yet (`ssi.rs`).
    #[inline]
    fn ssi_busy(&self) -> bool {
        self.req
            .as_ref()
            .and_then(|r| r.ssi.as_ref())
            .is_some_and(|p| p.busy())
    }

    /// Output waits only while more complete requests may sit in the input buffer, so that
    /// pipelined responses leave in one `write`; everything else is written at once.
    #[inline]
    fn must_flush_now(&self) -> bool {
        self.has_output()
            && (self.inbuf.is_empty()
                || self.has_file()
                || self.close_after
                || self.lingering
                || self.out.len() >= PIPELINE_GATHER_BYTES
                || self.req.as_ref().is_some_and(|r| r.ssi.is_some()))
    }

    /// The next deadline while reading to discard: `lingering_timeout` from now, but never past
    /// `lingering_time` from the start (nginx's `ngx_http_lingering_close_handler`).
    fn linger_deadline(&self, now_ms: u64) -> u64 {
        (now_ms + self.rd().linger.timeout_ms).min(self.rd().linger_until_ms)
    }

    pub(super) fn body_pending(&self) -> bool {
        self.req
            .as_ref()
            .is_some_and(|r| !matches!(r.body, BodyLeft::None))
    }

    /// The request's whole body when all of it is in the input buffer (decoded when chunked;
    /// empty without one), without consuming it; `None` while some is yet to come.
    pub(super) fn body_at_hand(&self) -> Option<Vec<u8>> {
        match &self.req.as_ref()?.body {
            BodyLeft::None => Some(Vec::new()),
            BodyLeft::Length(left) => {
                let n = usize::try_from(*left).ok()?;
                self.inbuf.get(..n).map(<[u8]>::to_vec)
            }
            BodyLeft::Chunked(dec) => {
                let mut dec = dec.clone();
                let mut out = Vec::new();
                dec.feed_into(&self.inbuf, &mut out).ok()?;
                dec.is_done().then_some(out)
            }
        }
    }

    /// A file body is still to be sent.
    fn has_file(&self) -> bool {
        self.req.as_ref().is_some_and(|r| r.file.is_some())
    }

    /// Moves the connection to `phase`, and the slot's gauges with it.
    pub(super) fn set_phase(&mut self, slot: &WorkerSlot, phase: Phase) {
        if self.phase != phase || self.before_first_byte {
            WorkerSlot::drop_one(self.gauge(slot));
            self.before_first_byte = false;
            WorkerSlot::bump(super::phase_counter(slot, phase), 1);
            self.phase = phase;
        }
    }

    /// The slot's gauge this connection is counted in.
    pub(super) fn gauge<'s>(&self, slot: &'s WorkerSlot) -> &'s std::sync::atomic::AtomicU64 {
        if self.before_first_byte {
            &slot.waiting
        } else {
            super::phase_counter(slot, self.phase)
        }
    }

    /// Just accepted: counted as waiting until its first byte arrives.
    pub(super) fn await_first_byte(&mut self, slot: &WorkerSlot) {
        if !self.before_first_byte {
            WorkerSlot::drop_one(self.gauge(slot));
            self.before_first_byte = true;
            WorkerSlot::bump(&slot.waiting, 1);
        }
    }

    /// Puts the connection into the request-head phase (at accept, `fresh`, or after a
    /// keep-alive wait) with a new request: a spare of `cx` reset to the default server
    /// `srv`'s settings, and `client_header_timeout` from now. A request it still held is
    /// handed back for the worker to release (not expected: requests go back when they end).
    pub(super) fn start_reading(
        &mut self,
        cx: &mut super::ctx::Ctx<'_>,
        srv: Option<&shard_config::ServerConf>,
        fresh: bool,
    ) -> Option<Box<Req>> {
        let timeout = srv.map_or(60_000, |s| s.client_header_timeout_ms);
        let mut req = match cx.req_spares.pop() {
            Some(r) => r,
            None => Box::new(Req::fallback()),
        };
        match srv {
            Some(s) => req.reset(&s.base),
            None => *req = Req::fallback(),
        }
        req.client = self.peer;
        req.pipelined = !fresh && !self.inbuf.is_empty();
        let old = self.req.replace(req);
        if fresh {
            WorkerSlot::bump(&cx.slot.reading, 1);
        } else {
            self.set_phase(cx.slot, Phase::Reading);
        }
        self.deadline_ms = cx.now_ms + timeout;
        old
    }

    /// Reads once into the input buffer (a spare buffer of `cx` when it has none), at most
    /// to `limit` bytes while reading a head; counts a TLS handshake's messages against the
    /// turn's budget and a finished handshake in the slot; moves the body and lingering
    /// deadlines. A step of the connection: the loop registers, yields and closes on what it
    /// says.
    pub(super) fn read(&mut self, cx: &mut super::ctx::Ctx<'_>, limit: usize) -> Read {
        if self.inbuf.capacity() == 0 {
            self.inbuf = cx.take_buf(READ_BUFFER_BYTES);
        }
        // Handshake records processed before this read, to charge the turn's budget with
        // what the read processes (a read that finds nothing costs none of it).
        let steps_before = match self.tls.as_ref() {
            Some(t) if t.conn.is_handshaking() => {
                if cx.handshakes_left == 0 {
                    WorkerSlot::bump(&cx.slot.tls_handshakes_deferred, 1);
                    return Read::Deferred;
                }
                Some(t.handshake_steps)
            }
            _ => None,
        };
        let c = self;
        if c.inbuf.len() == c.inbuf.capacity() {
            if c.inbuf.len() >= limit && !c.body_pending() {
                // The parser already had the whole allowance and still wants more: it will
                // report 431 or 414 on this buffer, so stop reading.
                return Read::Full;
            }
            let grow = c.inbuf.capacity().max(READ_BUFFER_BYTES);
            c.inbuf.reserve(grow);
        }
        let spare = c.inbuf.capacity() - c.inbuf.len();
        let mut inbuf = std::mem::take(&mut c.inbuf);
        let res = c.recv(&mut inbuf, spare);
        c.inbuf = inbuf;
        if let (Some(before), Some(t)) = (steps_before, c.tls.as_ref()) {
            cx.handshakes_left = cx
                .handshakes_left
                .saturating_sub(t.handshake_steps.wrapping_sub(before));
        }
        if let Some(t) = c
            .tls
            .as_mut()
            .filter(|t| !t.counted && !t.conn.is_handshaking())
        {
            t.counted = true;
            WorkerSlot::bump(&cx.slot.tls_handshakes, 1);
            WorkerSlot::bump(&cx.slot.tls_handshake_us, t.handshake_ns / 1000);
        }
        match res {
            Ok(0) => {
                c.eof = true;
                c.readable = false;
                Read::Closed
            }
            Ok(n) => {
                debug_assert!(n <= spare || c.plain_on_tls);
                // A short read means drained (no read is spent on EAGAIN), unless the FIN was
                // reported: then the next read returns 0 and the connection is closed now
                // instead of at its timeout.
                if n < spare && !c.hup {
                    c.readable = false;
                }
                if c.before_first_byte {
                    WorkerSlot::drop_one(&cx.slot.waiting);
                    c.before_first_byte = false;
                    WorkerSlot::bump(super::phase_counter(cx.slot, c.phase), 1);
                }
                if c.phase == Phase::Waiting {
                    // The loop gives it a new request (`start_reading`).
                } else if c.rq().linger_until_ms != 0 && (c.body_pending() || c.lingering) {
                    c.deadline_ms = c.linger_deadline(cx.now_ms);
                } else if c.body_pending() {
                    c.deadline_ms = cx.now_ms + c.rq().body_timeout_ms;
                }
                Read::Got
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                c.readable = false;
                Read::Drained
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => Read::Again,
            Err(_) => Read::Closed,
        }
    }

    /// Writes the output buffer, then the file body, until done, blocked, failed, or
    /// [`FLUSH_CHUNKS_MAX`] file chunks were moved in this call (then `Flush::Yield`: the
    /// connection takes its next turn after the worker's other connections).
    ///
    /// `key` is the connection's own (an HTTP/2 stream's output goes to its session in
    /// `h2`); the clock is `cx`'s. A step of the connection: it needs no worker.
    pub(super) fn flush(
        &mut self,
        key: usize,
        cx: &super::ctx::Ctx<'_>,
        h2: &mut slab::Slab<super::h2::Session>,
        h3: &mut slab::Slab<super::h3::H3Conn>,
        subs: &mut slab::Slab<super::ssi::SubOut>,
    ) -> Flush {
        let now_ms = cx.now_ms;
        let turn = cx.turn;
        let c = self;
        let r = req_of(&mut c.req);
        let mut chunks = 0;
        let mut size_checked = false;
        // `auth_delay`: the answer waits, its timer wakes the connection.
        if r.hold_until_ms > now_ms {
            c.deadline_ms = r.hold_until_ms;
            return Flush::Blocked;
        }
        loop {
            // `limit_rate`: nothing more may leave before the next second's share.
            let pending = c.out_pos < c.out.len()
                || r.file.is_some()
                || c.tls.as_ref().is_some_and(|t| t.has_output());
            if let Some(rate) = r.rate.as_mut() {
                // A client that closed its side while its answer is held back is gone, as
                // nginx's `ngx_http_test_reading` takes the end of its input: no more
                // shares are waited for.
                if c.hup && c.h2 == 0 && rate.allowance(now_ms) == 0 && pending {
                    crate::log!(
                        Info,
                        "client prematurely closed connection while sending response to client"
                    );
                    return Flush::Failed;
                }
                if rate.allowance(now_ms) == 0 && pending {
                    rate.resume_ms = rate.next_share_ms(now_ms);
                    c.deadline_ms = rate.resume_ms;
                    return Flush::Blocked;
                }
            }
            // A mapped file: what is left of the output buffer and the next part of the file
            // in one `writev`. A short count is a full socket or a file that shrank under
            // the mapping; the next call tells which (`EAGAIN`, or `EFAULT` and a failure).
            // (Not under `limit_rate`: its writes are cut to each second's share.)
            let rated = r.rate.is_some();
            if let Some(f) = r
                .file
                .as_mut()
                .filter(|f| f.mapped && f.remaining > 0 && !rated)
            {
                let Some(map) = f.fd.mapped() else {
                    return Flush::Failed;
                };
                if !c.writable {
                    return Flush::Blocked;
                }
                if chunks == FLUSH_CHUNKS_MAX {
                    return Flush::Yield;
                }
                let want = f.remaining.min(MAPPED_WRITE_BYTES);
                // The end of a file that shrank is not always a fault: the rest of the page
                // that holds its new end reads as zeros, and any chunk may cover that page.
                // So each call sends from the mapping only after a `stat` said the file
                // still holds all the response owes: the request's own, made in this loop
                // turn before any of the body left, or an `fstat` now (an `open_file_cache`
                // entry's size may be old; a loop turn may serve several requests in a row;
                // a large file's response spans turns). Else the `pread` way, whose short
                // read fails it. The window left is a truncation within one call. A sealed
                // file (a cache entry) never shrinks.
                if !size_checked && !f.fd.sealed() && f.size_checked_turn != Some(turn) {
                    match shard_event::fs::fstat(f.fd.as_raw_fd()) {
                        Ok(st) if st.size >= f.offset + f.remaining => size_checked = true,
                        _ => {
                            f.mapped = false;
                            continue;
                        }
                    }
                }
                chunks += 1;
                let head = &c.out[c.out_pos..];
                match shard_event::fs::writev_mapped(
                    fd_of(&c.fd),
                    head,
                    map,
                    f.offset as usize,
                    want as usize,
                ) {
                    Ok(0) => return Flush::Failed,
                    Ok(n) => {
                        f.size_checked_turn = None;
                        let h = n.min(head.len());
                        let b = (n - h) as u64;
                        c.out_pos += h;
                        f.offset += b;
                        f.remaining -= b;
                        c.deadline_ms = now_ms + r.send_timeout_ms;
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        c.writable = false;
                        return Flush::Blocked;
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    // The file shrank under the mapping, and the kernel dropped what this call
                    // held, the output buffer's part too: the rest goes the `pread` way, so the
                    // responses gathered before this one and its head still leave, and the
                    // short read then ends the connection.
                    Err(e) if e.raw_os_error() == Some(libc::EFAULT) => f.mapped = false,
                    Err(_) => return Flush::Failed,
                }
                continue;
            }
            // An HTTP/2 stream whose window took part of a file chunk: the rest joins the
            // next chunk before it goes, so a frame is not cut where a read ended (nginx
            // frames across its buffers).
            if c.fd.is_none() && c.h2 != 0 && r.ssi.is_none() && r.rate.is_none() {
                if let Some(f) = r.file.as_mut().filter(|f| !f.sendfile && f.remaining > 0) {
                    let pending = c.out.len() - c.out_pos;
                    if c.out_pos > 0 && pending > 0 && pending < FILE_CHUNK_BYTES {
                        let want = (FILE_CHUNK_BYTES - pending).min(f.remaining as usize);
                        // (A failed read is met again, and answered, by the loop's own.)
                        let _ = f.read_into(&mut c.out, want);
                    }
                }
            }
            // A head followed by a small file sent with `sendfile`: one segment, not two.
            let more = r.file.as_ref().is_some_and(|f| {
                f.sendfile && f.remaining > 0 && f.remaining <= CORK_FILE_MAX_BYTES
            });
            while c.out_pos < c.out.len() {
                if !c.writable {
                    return Flush::Blocked;
                }
                let allow = r.rate.as_ref().map_or(usize::MAX, |rate| {
                    usize::try_from(rate.allowance(now_ms)).unwrap_or(usize::MAX)
                });
                if allow == 0 {
                    break;
                }
                let end = c.out.len().min(c.out_pos.saturating_add(allow));
                let out = std::mem::take(&mut c.out);
                let cork = more && end == out.len();
                let to = Sink::of(c.h2, c.sub, &c.fd, key, r.h2_chunk);
                let tls = &mut c.tls;
                let mut sink = |b: &[u8]| to.write(h2, h3, subs, tls, b, cork);
                let res = match r.ssi.as_deref_mut() {
                    Some(p) => {
                        let res = p.write(&out[c.out_pos..end], &mut sink);
                        if p.must_close {
                            c.close_after = true;
                        }
                        res
                    }
                    None => sink(&out[c.out_pos..end]),
                };
                c.out = out;
                match res {
                    Ok(n) => {
                        debug_assert!(n <= c.out.len() - c.out_pos);
                        let offered = end - c.out_pos;
                        c.out_pos += n;
                        if let Some(rate) = r.rate.as_mut() {
                            rate.sent += n as u64;
                        }
                        c.deadline_ms = now_ms + r.send_timeout_ms;
                        // A short write means the socket is full; through TLS it means
                        // only that the plaintext buffer was (the next call says). A write
                        // `limit_rate` cut is not short; an HTTP/2 stream's says WouldBlock
                        // when its window is full.
                        if n < offered && c.tls.is_none() && c.fd.is_some() {
                            c.writable = false;
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        // An SSI pipe waiting for its command or subrequest is not a full
                        // socket: the worker wakes the connection (`Worker::ssi_step`).
                        if r.ssi.as_ref().is_none_or(|p| p.sink_blocked) {
                            c.writable = false;
                        }
                        return Flush::Blocked;
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(_) => return Flush::Failed,
                }
            }
            if c.out_pos < c.out.len() {
                // Cut short by `limit_rate`: the top of the loop waits for the next share.
                continue;
            }
            c.out.clear();
            c.out_pos = 0;
            if r.file.as_ref().is_none_or(|f| f.remaining == 0) {
                // An SSI response: its own output, commands and subrequests first.
                if let Some(p) = r.ssi.as_deref_mut().filter(|p| p.busy()) {
                    if !c.writable {
                        return Flush::Blocked;
                    }
                    let to = Sink::of(c.h2, c.sub, &c.fd, key, r.h2_chunk);
                    let tls = &mut c.tls;
                    let mut sink = |b: &[u8]| to.write(h2, h3, subs, tls, b, false);
                    match p.write(&[], &mut sink) {
                        Ok(_) if !p.busy() => {}
                        Ok(_) => return Flush::Blocked,
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                            if p.sink_blocked {
                                c.writable = false;
                            }
                            return Flush::Blocked;
                        }
                        Err(_) => return Flush::Failed,
                    }
                    if p.must_close {
                        c.close_after = true;
                    }
                }
                r.file = None;
                if !r.tail.is_empty() {
                    // What follows the file body (`add_trailer`), through the same writes.
                    c.out.append(&mut r.tail);
                    continue;
                }
                // Records TLS still holds go out before the response counts as written.
                if let Some(t) = c.tls.as_mut() {
                    match super::tls::flush(fd_of(&c.fd), t) {
                        Ok(true) => {}
                        Ok(false) => {
                            c.writable = false;
                            return Flush::Blocked;
                        }
                        Err(_) => return Flush::Failed,
                    }
                }
                return Flush::Done;
            }
            let Some(f) = r.file.as_mut() else {
                return Flush::Done;
            };
            if !c.writable {
                return Flush::Blocked;
            }
            if chunks == FLUSH_CHUNKS_MAX {
                return Flush::Yield;
            }
            chunks += 1;
            let mut want = f.remaining.min(1 << 30) as usize;
            if let Some(rate) = r.rate.as_ref() {
                let allow = usize::try_from(rate.allowance(now_ms)).unwrap_or(usize::MAX);
                if allow == 0 {
                    continue;
                }
                want = want.min(allow);
            }
            if !f.sendfile {
                // Copy a chunk into the output buffer; the next pass writes it.
                match f.read_into(&mut c.out, want.min(FILE_CHUNK_BYTES)) {
                    // The file shrank under us: the promised Content-Length cannot be met.
                    Ok(0) => return Flush::Failed,
                    Ok(_) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(_) => return Flush::Failed,
                }
                continue;
            }
            match shard_event::sock::sendfile(fd_of(&c.fd), f.fd.as_raw_fd(), &mut f.offset, want) {
                Ok(0) => return Flush::Failed,
                Ok(n) => {
                    debug_assert!(n as u64 <= f.remaining);
                    f.remaining -= n as u64;
                    if let Some(rate) = r.rate.as_mut() {
                        rate.sent += n as u64;
                    }
                    c.deadline_ms = now_ms + r.send_timeout_ms;
                    if n < want && f.remaining > 0 {
                        c.writable = false;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    c.writable = false;
                    return Flush::Blocked;
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => return Flush::Failed,
            }
        }
    }
}

impl<'a> Worker<'a> {
    pub(super) fn set_phase(&mut self, key: usize, phase: Phase) {
        self.conns[key].set_phase(self.cx.slot, phase);
    }

    /// Puts a connection into the request-head phase (at accept or after a keep-alive wait),
    /// with a new request ([`Conn::start_reading`]).
    pub(super) fn start_reading(&mut self, key: usize, fresh: bool) {
        let srv = self.default_server(self.conns[key].listener);
        if let Some(old) = self.conns[key].start_reading(&mut self.cx, srv, fresh) {
            self.give_req(old);
        }
        // Until the request names its server, its messages go to the default server's logs.
        let ctx = self.log_ctx_of(srv.and_then(|s| s.base.error_logs.as_ref()));
        self.conns[key].rq().log_ctx = ctx;
    }

    /// `$request_id` of the request on `key`: made when asked for, which most requests never do.
    pub(super) fn request_id(&self, key: usize) -> u128 {
        request_id(self.request_id_key, self.conns[key].rd().request_seq)
    }

    /// Keeps a finished request for the next one (its vectors keep their room).
    pub(super) fn give_req(&mut self, mut r: Box<Req>) {
        if let Some(p) = r.proxy.take() {
            // Not expected: the proxy step hands its state back before a request ends.
            if let Some(u) = p.upstream_conn() {
                self.close_upconn(u);
            }
            self.give_proxy_bufs(p);
        }
        if self.cx.req_spares.len() < REQ_SPARES_MAX {
            self.cx.req_spares.push(r);
        }
    }

    /// The default server of an HTTP listener, whose settings a request has until its
    /// `Host` chose one. Looked up rather than kept on the connection.
    /// (Accepting needs one, so every HTTP connection has it.)
    pub(super) fn default_server(&self, listener: usize) -> Option<&'a shard_config::ServerConf> {
        let cfg = self.cx.cfg;
        let l = &cfg.listeners[listener];
        cfg.http.as_ref().map(|h| &h.servers[l.default_server])
    }

    pub(super) fn on_conn_event(&mut self, key: usize, generation: u32, ev: shard_event::Event) {
        let Some(c) = self.conns.get_mut(key) else {
            return;
        };
        if super::token::generation(c.id) != generation {
            return; // registered for a connection that closed since
        }
        if ev.readable() {
            c.readable = true;
        }
        if ev.writable() {
            c.writable = true;
        }
        if ev.hup() {
            c.hup = true;
        }
        self.drive(key);
    }

    pub(super) fn ensure_registered(&mut self, key: usize) -> bool {
        let c = &mut self.conns[key];
        if c.registered || c.fd.is_none() {
            return true;
        }
        let interest = shard_event::Interest::READ
            | shard_event::Interest::WRITE
            | shard_event::Interest::RDHUP
            | shard_event::Interest::EDGE;
        let token = super::token::Token::Conn {
            key,
            generation: super::token::generation(c.id),
        };
        match self.poll.add(fd_of(&c.fd), token.encode(), interest) {
            Ok(()) => {
                c.registered = true;
                true
            }
            Err(e) => {
                crate::log!(
                    Alert,
                    "epoll_ctl(ADD) failed ({})",
                    shard_event::os_error_text(&e)
                );
                false
            }
        }
    }

    pub(super) fn close(&mut self, key: usize) {
        if !self.conns.contains(key) {
            return;
        }
        self.release_limits(key);
        let h2 = self.conns[key].h2;
        if h2 & super::h2::H2_SESSION != 0 {
            self.h2_session_closed(h2);
        }
        let mut c = self.conns.remove(key);
        crate::debug!("close http connection: {}", fd_of(&c.fd));
        crate::log::debug_connection(c.number, false);
        // A subrequest ends with its parent, and its parent learns of its end.
        if let Some(w) = c
            .req
            .as_ref()
            .and_then(|r| r.ssi.as_ref())
            .and_then(|p| p.waiting())
        {
            self.sub_abort(w);
        }
        if c.sub != 0 {
            self.sub_closed(c.sub, c.id);
        }
        if let Some(t) = c.tls.as_mut() {
            super::tls::close_notify(fd_of(&c.fd), t);
        }
        // Dropping `c` closes its socket (which removes it from epoll; no EPOLL_CTL_DEL
        // needed) and its file.
        if let Some(r) = c.req.take() {
            self.give_req(r);
        }
        WorkerSlot::drop_one(c.gauge(self.cx.slot));
        if h2 & super::h2::H2_STREAM == 0 && c.sub == 0 {
            WorkerSlot::drop_one(&self.cx.slot.active);
        }
        let inbuf = std::mem::take(&mut c.inbuf);
        let out = std::mem::take(&mut c.out);
        self.give_buf(inbuf);
        self.give_buf(out);
        if h2 & super::h2::H2_STREAM != 0 {
            self.h2_stream_closed(h2, key);
        }
    }

    pub(super) fn on_timeout(&mut self, key: usize) {
        // `limit_rate` held the response back: its next share of bytes is due.
        let rate = self.conns[key].req.as_mut().and_then(|r| r.rate.as_mut());
        if let Some(r) = rate.filter(|r| r.resume_ms != 0) {
            if self.cx.now_ms >= r.resume_ms {
                r.resume_ms = 0;
                let c = &mut self.conns[key];
                c.deadline_ms = self.cx.now_ms + c.rq().send_timeout_ms;
                self.drive(key);
                return;
            }
        }
        // `auth_delay` held the answer: it goes now.
        let held = self.conns[key]
            .req
            .as_mut()
            .filter(|r| r.hold_until_ms != 0);
        if let Some(r) = held {
            if self.cx.now_ms >= r.hold_until_ms {
                r.hold_until_ms = 0;
                let send = r.send_timeout_ms;
                self.conns[key].deadline_ms = self.cx.now_ms + send;
                self.drive(key);
                return;
            }
        }
        if self.proxy_timeout(key) {
            return;
        }
        if self.conns[key].h2 & super::h2::H2_SESSION != 0 && self.h2_header_timeout(key) {
            return;
        }
        let c = &mut self.conns[key];
        if c.req.as_ref().is_some_and(|r| r.delayed_until != 0) {
            // A request `limit_req` delayed: its turn now.
            c.rq().delayed_until = 0;
            c.rq().limit_passed = true;
            let listener = c.listener;
            let timeout = self
                .default_server(listener)
                .map_or(60_000, |s| s.client_header_timeout_ms);
            let c = &mut self.conns[key];
            c.deadline_ms = self.cx.now_ms + timeout;
            self.drive(key);
            return;
        }
        let c = &self.conns[key];
        if c.lingering {
            self.close(key);
            return;
        }
        match c.phase {
            Phase::Reading if !c.inbuf.is_empty() && !c.has_output() => {
                let line = self.unparsed_request(key);
                crate::log!(
                    Info,
                    "client timed out (110: Connection timed out) while reading client request headers{}",
                    self.log_context(key, Some(&line))
                );
                self.error_reply(key, 408, "");
                self.log_refused(key, 408, &line);
                self.drive(key);
            }
            Phase::Reading | Phase::Waiting => self.close(key),
            // The response went out and the rest of the body, being discarded, stopped
            // coming for `lingering_timeout` (or `lingering_time` passed): nginx closes
            // without a word.
            Phase::Writing if c.body_pending() && !c.has_output() => self.close(key),
            Phase::Writing => {
                crate::log!(
                    Info,
                    "client timed out (110: Connection timed out) while sending response to client{}",
                    self.log_context(key, None)
                );
                if let Some(t) = self.conns[key].tls.as_mut() {
                    t.quiet = true;
                }
                self.close(key);
            }
        }
    }

    /// Writes what connection `key` has to write ([`Conn::flush`]).
    pub(super) fn flush(&mut self, key: usize) -> Flush {
        let Worker {
            conns,
            cx,
            h2,
            h3,
            subs,
            ..
        } = self;
        conns[key].flush(key, cx, h2, h3, subs)
    }

    /// Runs the connection until it must wait for the kernel, is closed, or used up its turn
    /// (`TURN_ROUNDS_MAX` rounds; then it is queued to go on after the other connections),
    /// then makes sure its deadline is queued: the steps move `deadline_ms` freely (send,
    /// body, keep-alive timeouts), and an earlier one than the queued timer must be queued
    /// too, or a 1 s `send_timeout` would wait for a 60 s header timer.
    pub(super) fn drive(&mut self, key: usize) {
        let Some((id, number, h2, sub)) =
            self.conns.get(key).map(|c| (c.id, c.number, c.h2, c.sub))
        else {
            return;
        };
        let outer = crate::log::set_connection(number);
        let ctx = self.conns[key].req.as_ref().map_or((0, 0), |r| r.log_ctx);
        let outer_ctx = crate::log::set_context(ctx.0, ctx.1);
        self.drive_turn(key);
        if self
            .conns
            .get(key)
            .and_then(|c| c.req.as_ref())
            .is_some_and(|r| r.ssi.is_some())
        {
            self.ssi_after_drive(key);
        }
        if sub != 0 {
            // What the subrequest wrote waits in `subs`: its parent takes it.
            self.sub_moved(sub, id);
        }
        crate::log::restore_context(outer_ctx);
        crate::log::set_connection(outer);
        if h2 & super::h2::H2_STREAM != 0 {
            // What the stream wrote is queued in `h2`: its session frames and sends it.
            self.h2_stream_moved(h2);
        }
        if let Some(c) = self.conns.get(key).filter(|c| c.id == id) {
            let d = c.deadline_ms;
            self.set_conn_deadline(key, d);
            debug_assert!(self.conns[key].timer_at <= self.conns[key].deadline_ms);
        }
    }

    pub(super) fn drive_turn(&mut self, key: usize) {
        // The one place a step's `Io::Close` closes the connection.
        macro_rules! step {
            ($io:expr) => {
                match $io {
                    Io::Ready => {}
                    Io::Wait => return,
                    Io::Close => {
                        self.close(key);
                        return;
                    }
                }
            };
        }
        let mut rounds = 0;
        loop {
            if !self.conns.contains(key) {
                return;
            }
            rounds += 1;
            if rounds > super::TURN_ROUNDS_MAX {
                self.yield_conn(key);
                return;
            }
            if self.conns[key].pp_pending {
                step!(self.read_proxy_protocol(key));
                continue;
            }
            if self.conns[key].h2 & super::h2::H2_SESSION != 0 {
                if let Io::Close = self.h2_drive(key) {
                    self.close(key);
                }
                return;
            }
            if self.conns[key]
                .req
                .as_ref()
                .is_some_and(|r| r.proxy.is_some())
            {
                match self.drive_proxy(key) {
                    Step::Done => continue,
                    Step::Wait => return,
                }
            }
            if self.conns[key].must_flush_now() {
                step!(self.flush_or_wait(key));
            }
            let c = &mut self.conns[key];
            if c.lingering {
                step!(self.discard_input(key));
                continue;
            }
            if c.close_after {
                let unread = c.body_pending() || !c.inbuf.is_empty() || (c.readable && !c.eof);
                // (Between requests there is no response to protect.)
                let linger = match c
                    .req
                    .as_ref()
                    .filter(|_| c.fd.is_some())
                    .map(|r| r.linger.close)
                {
                    None | Some(LingeringClose::Off) => false,
                    Some(LingeringClose::On) => unread,
                    Some(LingeringClose::Always) => !c.eof,
                };
                if linger {
                    // Unread input would make close() send a reset that can destroy the
                    // response in flight: send FIN, then read and discard for a while.
                    match c.tls.as_mut() {
                        // close_notify, and the FIN once the records are out.
                        Some(t) => super::relay::Endpoint::shut(&mut super::tls::TlsSide {
                            fd: fd_of(&c.fd),
                            t,
                        }),
                        None => shard_event::sock::shutdown_write(fd_of(&c.fd)),
                    }
                    c.lingering = true;
                    c.rq().linger_until_ms = self.cx.now_ms + c.rq().linger.time_ms;
                    c.deadline_ms = c.linger_deadline(self.cx.now_ms);
                    self.conns[key].inbuf.clear();
                    continue;
                }
                self.close(key);
                return;
            }
            // Discard what remains of the request body: each read may wait
            // `lingering_timeout`, and all of it `lingering_time`.
            if c.body_pending() {
                if c.rq().linger_until_ms == 0 {
                    c.rq().linger_until_ms = self.cx.now_ms + c.rq().linger.time_ms;
                    c.deadline_ms = c.linger_deadline(self.cx.now_ms);
                }
                if self.consume_body(key, None) {
                    continue;
                }
                step!(self.flush_or_wait(key));
                step!(self.read_more(key));
                continue;
            }
            let c = &mut self.conns[key];
            if c.phase == Phase::Writing {
                // The response and the body are done: keep-alive.
                c.rq().linger_until_ms = 0;
                if !c.rq().conn_held.is_empty() {
                    self.release_limits(key);
                }
                let c = &mut self.conns[key];
                if c.inbuf.is_empty() {
                    c.deadline_ms = self.cx.now_ms + c.rq().keepalive_timeout_ms;
                    // Between requests a connection holds no request.
                    let r = c.req.take();
                    if let Some(r) = r {
                        self.give_req(r);
                    }
                    let c = &mut self.conns[key];
                    let inbuf = std::mem::take(&mut c.inbuf);
                    let out = std::mem::take(&mut c.out);
                    c.out_pos = 0;
                    self.give_buf(inbuf);
                    self.give_buf(out);
                    self.set_phase(key, Phase::Waiting);
                    // A response promised keep-alive before the stop began: the connection
                    // waits out the drain window like any idle one.
                    if self.shutting_down && !self.draining() {
                        self.close(key);
                        return;
                    }
                } else {
                    self.start_reading(key, false);
                }
            }
            let c = &self.conns[key];
            if c.req.as_ref().is_some_and(|r| r.delayed_until != 0) {
                // `limit_req` holds the request back; its timer resumes it. A client that
                // closed meanwhile is gone, as nginx's `ngx_http_test_reading` takes it (a
                // graceful stop would otherwise wait out the delay).
                if c.hup && c.h2 == 0 {
                    crate::log!(
                        Info,
                        "client prematurely closed connection while limiting requests"
                    );
                    self.close(key);
                }
                return;
            }
            if !c.inbuf.is_empty() {
                if self.h2_wanted(key) {
                    self.h2_start(key);
                    continue;
                }
                let c = &self.conns[key];
                let limits = self.limits(c.listener);
                match shard_http::request::parse(&c.inbuf, &limits) {
                    shard_http::request::Parse::Complete { req, head_len } => {
                        self.handle(key, req, head_len);
                        continue;
                    }
                    shard_http::request::Parse::Partial => {}
                    shard_http::request::Parse::Error(rej) => {
                        // nginx's words: which part was being read, and the context.
                        let part = if ["header", "Host", "Length", "Encoding", "duplicate"]
                            .iter()
                            .any(|w| rej.reason.contains(w))
                        {
                            "headers"
                        } else {
                            "line"
                        };
                        let line = self.unparsed_request(key);
                        crate::log!(
                            Info,
                            "client sent {} while reading client request {part}{}",
                            rej.reason,
                            self.log_context(key, Some(&line))
                        );
                        let status = rej.status;
                        // The default server's `add_header ... always` go with the page, as
                        // nginx's headers filter runs with the server's settings.
                        let cfg = self.cx.cfg;
                        let server = self.conns[key].rq().server;
                        // Their `$ssl_client_*` see the certificate judged for that server.
                        if let (Some(srv), Some(t)) = (
                            cfg.http.as_ref().and_then(|h| h.servers.get(server)),
                            self.conns[key].tls.as_mut(),
                        ) {
                            if srv.ssl.verify_client != VerifyClient::Off {
                                let verifier = self.tls.client_verifier(server);
                                super::tls::client_cert(t, server, verifier, srv.ssl.verify_depth);
                            }
                        }
                        let extra = cfg
                            .http
                            .as_ref()
                            .and_then(|h| h.servers.get(server))
                            .filter(|s| !s.base.add_headers.is_empty())
                            .map(|s| {
                                super::respond::extra_headers(
                                    self,
                                    key,
                                    &line,
                                    &s.base,
                                    &[],
                                    status,
                                    None,
                                    Some("text/html"),
                                )
                            })
                            .unwrap_or_default();
                        // The default server's `error_page` for the status, as nginx's
                        // special response handler takes it for a request it could not read:
                        // the page is requested anew with GET, the connection closes after.
                        if let Some((target, st)) = head_error_page(cfg, server, status) {
                            let head = format!("GET {target} HTTP/1.0\r\n\r\n");
                            let limits = self.limits(self.conns[key].listener);
                            if let shard_http::request::Parse::Complete { mut req, head_len } =
                                shard_http::request::parse(head.as_bytes(), &limits)
                            {
                                let c = &mut self.conns[key];
                                c.inbuf.clear();
                                c.inbuf.extend_from_slice(head.as_bytes());
                                req.request_line = line.request_line.clone();
                                req.keep_alive = false;
                                req.head_error_page = Some(match st {
                                    ErrorPageStatus::Original => Some(status),
                                    ErrorPageStatus::Code(code) => Some(code),
                                    ErrorPageStatus::Target => None,
                                });
                                self.handle(key, req, head_len);
                                continue;
                            }
                        }
                        self.error_page_with(key, status, false, None, &extra);
                        self.log_refused(key, status, &line);
                        continue;
                    }
                }
            }
            step!(self.flush_or_wait(key));
            step!(self.read_more(key));
        }
    }

    /// Writes pending output; when it cannot all go, the connection is registered (send
    /// buffer full) or queued for its next turn (its share of a file moved).
    pub(super) fn flush_or_wait(&mut self, key: usize) -> Io {
        if !self.conns[key].has_output() {
            return Io::Ready;
        }
        match self.flush(key) {
            Flush::Done => Io::Ready,
            Flush::Blocked => {
                self.ensure_registered(key);
                Io::Wait
            }
            Flush::Yield => {
                self.yield_conn(key);
                Io::Wait
            }
            Flush::Failed => Io::Close,
        }
    }

    /// The header limits and name rules of a listener's default server: nginx reads a head
    /// with the default server's settings, before its Host header chose one. Looked up rather
    /// than kept on the connection, which would cost every idle connection 32 bytes.
    fn limits(&self, listener: usize) -> shard_http::request::Limits {
        let l = &self.cx.cfg.listeners[listener];
        // An HTTP listener always has an http block; without one, shard-http's defaults.
        let Some(s) = self
            .cx
            .cfg
            .http
            .as_ref()
            .map(|h| &h.servers[l.default_server])
        else {
            return shard_http::request::Limits::default();
        };
        shard_http::request::Limits {
            header_buffer_size: s.client_header_buffer_size,
            large_buffers: s.large_client_header_buffers.0,
            large_buffer_size: s.large_client_header_buffers.1,
            names: shard_http::request::NamePolicy {
                underscores: s.underscores_in_headers,
                ignore_invalid: s.ignore_invalid_headers,
            },
            merge_slashes: s.merge_slashes,
        }
    }

    /// Reads once into the input buffer: `Ready` when bytes arrived, `Wait` when the socket is
    /// drained (the connection is then registered), `Close` at end of stream or on an error.
    /// Reads the PROXY protocol header a `proxy_protocol` listener's connection begins with:
    /// looked at with `MSG_PEEK` until it is whole, then exactly its bytes are read, so what
    /// follows (a TLS handshake, a request) stays in the socket for the next step. A header
    /// that is not one is nginx's `broken header` and a close; a slow one runs into
    /// `client_header_timeout` like a slow request head.
    fn read_proxy_protocol(&mut self, key: usize) -> Io {
        use shard_http::proxy_protocol::{parse, Parsed, MAX_HEADER};
        let c = &mut self.conns[key];
        if !c.readable {
            self.ensure_registered(key);
            return Io::Wait;
        }
        let fd = fd_of(&c.fd);
        let mut buf = self.take_buf(MAX_HEADER);
        buf.resize(MAX_HEADER, 0);
        let io = match shard_event::sock::peek(fd, &mut buf) {
            Ok(0) => Io::Close,
            Ok(n) => match parse(&buf[..n]) {
                Parsed::Partial if n < MAX_HEADER => {
                    // The rest comes with the next edge.
                    self.conns[key].readable = false;
                    self.ensure_registered(key);
                    Io::Wait
                }
                Parsed::Complete(h, len) => {
                    // Consume exactly the header.
                    match shard_event::sock::read(fd, &mut buf[..len]) {
                        Ok(r) if r == len => {
                            let c = &mut self.conns[key];
                            c.proxy_protocol = Some(Box::new(h));
                            c.pp_pending = false;
                            Io::Ready
                        }
                        _ => Io::Close,
                    }
                }
                Parsed::Partial | Parsed::Invalid => {
                    let shown = n.min(shard_http::proxy_protocol::V1_MAX);
                    // Escaped: a log line is never split by what a client sent.
                    let text: String = buf[..shown]
                        .iter()
                        .flat_map(|&b| std::ascii::escape_default(b))
                        .map(char::from)
                        .collect();
                    let c = &self.conns[key];
                    crate::log!(
                        Error,
                        "broken header: \"{text}\" while reading PROXY protocol, client: {}, server: {}",
                        c.peer.map_or("-".to_string(), |a| a.ip().to_string()),
                        self.cx.cfg.listeners[c.listener].addr,
                    );
                    Io::Close
                }
            },
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                self.conns[key].readable = false;
                self.ensure_registered(key);
                Io::Wait
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => Io::Ready,
            Err(_) => Io::Close,
        };
        buf.clear();
        self.give_buf(buf);
        io
    }

    pub(super) fn read_more(&mut self, key: usize) -> Io {
        if self.conns[key].fd.is_none() {
            // An HTTP/2 stream: its session brings more input and drives it.
            return Io::Wait;
        }
        if !self.conns[key].readable {
            self.ensure_registered(key);
            return Io::Wait;
        }
        if self.conns[key].tls.as_ref().is_some_and(|t| t.cert_pending) {
            if let Some(io) = self.tls_render_certs(key) {
                return io;
            }
        }
        let limit = {
            let l = self.limits(self.conns[key].listener);
            (l.large_buffers * l.large_buffer_size).max(READ_BUFFER_BYTES)
        };
        match self.conns[key].read(&mut self.cx, limit) {
            Read::Got => {
                if self.conns[key].phase == Phase::Waiting {
                    self.start_reading(key, false);
                }
                Io::Ready
            }
            Read::Again => Io::Ready,
            Read::Full => Io::Wait,
            Read::Drained => {
                self.ensure_registered(key);
                Io::Wait
            }
            Read::Deferred => {
                self.yield_conn(key);
                Io::Wait
            }
            Read::Closed => Io::Close,
        }
    }

    /// `ssl_certificate` with variables: peeks at the client's hello, picks the server its
    /// SNI names, renders and loads that server's pairs (in a request-less context: the
    /// connection's variables, `$ssl_server_name`, maps and geo), and leaves them for the
    /// resolver. A pair that cannot be loaded is logged as nginx's and fails the handshake.
    /// `Some` when the hello is not whole yet.
    fn tls_render_certs(&mut self, key: usize) -> Option<Io> {
        use super::tls::Peek;
        let fd = self.conns[key].raw_fd();
        let sni = match super::tls::peek_hello(fd) {
            Peek::Wait => {
                self.conns[key].readable = false;
                self.ensure_registered(key);
                return Some(Io::Wait);
            }
            Peek::Other => {
                if let Some(t) = self.conns[key].tls.as_mut() {
                    t.cert_pending = false;
                }
                return None;
            }
            Peek::Hello(sni) => sni,
        };
        let http = self.http();
        let listener = &self.cx.cfg.listeners[self.conns[key].listener];
        let lower = sni.to_ascii_lowercase();
        let server = shard_http::route::select_server(
            listener,
            Some(&lower).filter(|s| !s.is_empty()).map(|s| s.as_str()),
        );
        let c = &mut self.conns[key];
        let t = c.tls.as_mut()?;
        t.peeked(sni);
        let srv = http.servers.get(server)?;
        // A server with no certificate of its own handshakes with the default server's
        // (nginx keeps the default's context), its variables read in the named server.
        let owner = if srv.ssl.certificates.is_empty() && !srv.ssl.reject_handshake {
            http.servers.get(listener.default_server)?
        } else {
            srv
        };
        if !owner.ssl.certificates.iter().any(|p| p.vars.is_some()) {
            return None;
        }
        // The variables read the connection's request slot: a bare one, as nginx's fake
        // request of the certificate callback.
        let temp = c.req.is_none();
        if temp {
            let mut r = Req::fallback();
            r.client = c.peer;
            r.server = server;
            c.req = Some(Box::new(r));
        }
        let req = shard_http::request::Request::unparsed(b"");
        let mut keys = Vec::new();
        for pair in &owner.ssl.certificates {
            let Some(v) = pair.vars.as_ref() else {
                continue;
            };
            let cert = v.dir.join(self.render(key, &req, b"", &srv.base, &v.cert));
            let key_path = v.dir.join(self.render(key, &req, b"", &srv.base, &v.key));
            match crate::tls::load_rendered(
                &cert,
                &key_path,
                pair.password_file.as_deref(),
                &pair.place,
            ) {
                Ok(k) => keys.push(k),
                Err(e) => {
                    crate::log!(
                        Error,
                        "{e} while SSL handshaking{}",
                        self.log_context(key, None)
                    );
                    keys.clear();
                    break;
                }
            }
        }
        let c = &mut self.conns[key];
        if temp {
            c.req = None;
        }
        if let Some(t) = c.tls.as_mut() {
            t.chosen = Some(keys);
        }
        None
    }

    /// Reads body bytes of a `Content-Length` body straight into `sink`, at most `room`, when the
    /// input buffer holds none (one copy less, and reads as large as the body buffer rather
    /// than the head buffer). `None`: not applicable, use the input buffer.
    pub(super) fn read_body_direct(
        &mut self,
        key: usize,
        sink: &mut Vec<u8>,
        room: usize,
    ) -> Option<Io> {
        let c = &mut self.conns[key];
        let BodyLeft::Length(left) = &mut req_of(&mut c.req).body else {
            return None;
        };
        if !c.inbuf.is_empty() || room == 0 {
            return None;
        }
        if !c.readable {
            self.ensure_registered(key);
            return Some(Io::Wait);
        }
        let want = (*left).min(room as u64) as usize;
        let res = c.recv(sink, want);
        let r = req_of(&mut c.req);
        let BodyLeft::Length(left) = &mut r.body else {
            return None;
        };
        match res {
            Ok(0) => {
                c.eof = true;
                c.readable = false;
                Some(Io::Close)
            }
            Ok(n) => {
                *left -= n as u64;
                r.body_bytes += n as u64;
                if *left == 0 {
                    r.body = BodyLeft::None;
                }
                if n < want && !c.hup {
                    c.readable = false;
                }
                c.deadline_ms = self.cx.now_ms + r.body_timeout_ms;
                Some(Io::Ready)
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                c.readable = false;
                self.ensure_registered(key);
                Some(Io::Wait)
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => Some(Io::Ready),
            Err(_) => Some(Io::Close),
        }
    }

    /// Lingering close: read and drop input until end of stream or the lingering deadline.
    fn discard_input(&mut self, key: usize) -> Io {
        let c = &mut self.conns[key];
        if !c.readable {
            self.ensure_registered(key);
            return Io::Wait;
        }
        // Into the input buffer (empty while lingering), dropped at once.
        let mut scratch = std::mem::take(&mut c.inbuf);
        scratch.clear();
        let res = c.recv(&mut scratch, 4096);
        scratch.clear();
        c.inbuf = scratch;
        match res {
            Ok(0) => Io::Close,
            Ok(_) => {
                let c = &mut self.conns[key];
                c.deadline_ms = c.linger_deadline(self.cx.now_ms);
                Io::Ready
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                c.readable = false;
                self.ensure_registered(key);
                Io::Wait
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => Io::Ready,
            Err(_) => Io::Close,
        }
    }

    /// Consumes body bytes from the input buffer, appending them to `sink` (the proxy's body)
    /// or discarding them. Returns true when the body is complete (or the connection got an
    /// error reply), false when more input is needed.
    pub(super) fn consume_body(&mut self, key: usize, mut sink: Option<&mut Vec<u8>>) -> bool {
        let c = &mut self.conns[key];
        let (used, data, done, bad) = match &mut req_of(&mut c.req).body {
            BodyLeft::None => return true,
            BodyLeft::Length(left) => {
                let take = (*left).min(c.inbuf.len() as u64);
                *left -= take;
                if let Some(s) = sink.as_deref_mut() {
                    s.extend_from_slice(&c.inbuf[..take as usize]);
                }
                (take as usize, take, *left == 0, None)
            }
            BodyLeft::Chunked(dec) => {
                let fed = match sink {
                    Some(s) => dec.feed_into(&c.inbuf, s),
                    None => dec.feed(&c.inbuf),
                };
                match fed {
                    Ok(f) => (f.consumed, f.data, dec.is_done(), None),
                    Err(rej) => (c.inbuf.len(), 0, true, Some(rej)),
                }
            }
        };
        c.inbuf.drain(..used);
        c.rq().body_bytes += data;
        if done {
            c.rq().body = BodyLeft::None;
        }
        if let Some(rej) = bad {
            crate::log!(Info, "client sent invalid chunked body: {}", rej.reason);
            c.close_after = true;
            c.rq().body = BodyLeft::None;
            return true;
        }
        if c.rq().body_bytes_max > 0 && c.rq().body_bytes > c.rq().body_bytes_max {
            // Chunked bodies learn their size as they go. The response was already sent, so
            // the only honest thing left is to stop reading and close.
            crate::log!(
                Error,
                "client intended to send too large chunked body: {} bytes",
                c.rq().body_bytes
            );
            c.close_after = true;
            c.rq().body = BodyLeft::None;
            return true;
        }
        done
    }

    /// nginx's context of a per-request error-log line, appended to the message: `, client:
    /// ADDR, server: NAME, request: "LINE", host: "HOST"` (the request and host when known).
    pub(super) fn log_context(
        &self,
        key: usize,
        req: Option<&shard_http::request::Request>,
    ) -> String {
        let c = &self.conns[key];
        // A connection between requests (or an HTTP/2 session) names its peer and the
        // default server.
        let (server, client) = match c.req.as_deref() {
            Some(r) => (r.server, r.client),
            None => (
                self.cx
                    .cfg
                    .listeners
                    .get(c.listener)
                    .map_or(0, |l| l.default_server),
                c.peer,
            ),
        };
        let server = self
            .cx
            .cfg
            .http
            .as_ref()
            .and_then(|h| h.servers.get(server))
            .map_or("", shard_http::route::server_name);
        let mut s = format!(
            ", client: {}, server: {server}",
            client.map_or("-".to_string(), |a| a.ip().to_string())
        );
        if let Some(r) = req {
            s.push_str(&format!(", request: \"{}\"", r.request_line));
            if let Some(h) = r.host_as_sent() {
                s.push_str(&format!(", host: \"{h}\""));
            }
        }
        s
    }

    /// The access-log line of a request refused before its head was parsed (400, 408, 414,
    /// 431, 501, 505; `req` from [`Worker::unparsed_request`]): in the access logs of the
    /// listener's default server, as nginx, with `$request` as far as it was received.
    fn log_refused(&mut self, key: usize, status: u16, req: &shard_http::request::Request) {
        let Some(http) = self.cx.cfg.http.as_ref() else {
            return;
        };
        let srv = &http.servers[self.conns[key].rq().server];
        if srv.base.access_logs.is_empty() {
            return;
        }
        let bytes = shard_http::response::error_body(status).len() as u64;
        self.log_access(key, &srv.base, req, status, bytes, &[]);
    }

    /// A request refused before its head was parsed, as the logs see it: its server is the
    /// listener's default server (nginx), its `$request` the first line as far as received.
    fn unparsed_request(&mut self, key: usize) -> shard_http::request::Request {
        let c = &mut self.conns[key];
        c.rq().server = self.cx.cfg.listeners[c.listener].default_server;
        shard_http::request::Request::unparsed(&c.inbuf)
    }

    /// Queues an error page and marks the connection to close after it.
    pub(super) fn error_reply(&mut self, key: usize, status: u16, request_line: &str) {
        let _ = request_line;
        self.error_page(key, status, false);
    }

    /// Queues an error page; without `keep_alive` the connection closes after it and any
    /// unread body is abandoned.
    pub(super) fn error_page(&mut self, key: usize, status: u16, keep_alive: bool) {
        self.error_page_in(key, status, keep_alive, None);
    }

    /// [`Worker::error_page`] with the settings (`server_tokens`, `charset`) of `loc`, else
    /// of the connection's server: its default server's until a request chose one, as nginx
    /// answers a request it could not read.
    pub(super) fn error_page_in(
        &mut self,
        key: usize,
        status: u16,
        keep_alive: bool,
        loc: Option<&LocationConf>,
    ) {
        self.error_page_with(key, status, keep_alive, loc, &[]);
    }

    /// [`Worker::error_page_in`] with `extra` header lines (the location's `add_header`s a
    /// caller rendered for the request).
    pub(super) fn error_page_with(
        &mut self,
        key: usize,
        status: u16,
        keep_alive: bool,
        loc: Option<&LocationConf>,
        extra: &[u8],
    ) {
        let cfg = self.cx.cfg;
        let loc = loc.or_else(|| {
            let h = cfg.http.as_ref()?;
            h.servers.get(self.conns[key].rq().server).map(|s| &s.base)
        });
        let date = std::mem::take(&mut self.cx.date);
        {
            let c = &mut self.conns[key];
            if c.out.capacity() == 0 {
                c.out = self.cx.spare_buf();
                c.out.clear();
            }
            let body = shard_http::response::error_body(status);
            shard_http::response::write_head(
                &mut c.out,
                &shard_http::response::Head {
                    status,
                    date: &date,
                    content_type: Some("text/html"),
                    content_length: Some(body.len() as u64),
                    keep_alive,
                    server: loc.map_or(
                        shard_http::response::SERVER_TOKENS_ON,
                        shard_http::response::server_value,
                    ),
                    charset: loc.and_then(|l| shard_http::response::charset_for(l, "text/html")),
                    extra,
                    ..Default::default()
                },
            );
            c.out.extend_from_slice(body);
            if !keep_alive {
                c.close_after = true;
                c.rq().body = BodyLeft::None;
            }
        }
        self.cx.date = date;
        if self.conns[key].phase != Phase::Writing {
            self.set_phase(key, Phase::Writing);
        }
    }

    /// Answers the request whose head is the first `head_len` bytes of the input buffer.
    fn handle(&mut self, key: usize, mut req: shard_http::request::Request, head_len: usize) {
        // An HTTP/2 stream's head was its header block: `$request_length` counts that.
        if let Some(n) = self.h2_stream_of(key).map(|st| st.head_len) {
            req.head_len = n as usize;
        }
        let cfg = self.cx.cfg;
        if self.conns[key].h2 != 0 {
            // A stream's request, given as HTTP/1.1: `$request` and `$server_protocol` say
            // what the client spoke.
            req.http2 = true;
            req.http3 = self.conns[key].h2 & super::h3::H3_STREAM != 0;
            let version = if req.http3 { "HTTP/3.0" } else { "HTTP/2.0" };
            if let Some(line) = req.request_line.strip_suffix("HTTP/1.1") {
                req.request_line = format!("{line}{version}");
            }
        }
        let Some(http) = cfg.http.as_ref() else {
            WorkerSlot::bump(&self.cx.slot.requests, 1);
            self.set_phase(key, Phase::Writing);
            self.error_reply(key, 500, "");
            return;
        };
        let listener = &cfg.listeners[self.conns[key].listener];
        let server_idx = shard_http::route::select_server(listener, req.host.as_deref());
        let server = &http.servers[server_idx];
        self.conns[key].rq().server = server_idx;
        let first = self.locate(key, server, &req.path);
        self.enter_log_context(key, first);
        // nginx's post-read phase: the client address a trusted proxy reports.
        let c = &mut self.conns[key];
        c.rq().client = c.peer;
        c.rq().www_authenticate = None;
        c.rq().accel_headers = None;
        // `limit_rate` is taken when the response starts (`settle_limit_rate`).
        c.rq().rate = None;
        if !first.real_ip.from.is_empty() {
            let peer = c.peer;
            let mut storage = shard_http::vars::header_storage();
            let hs = shard_http::vars::request_headers(&c.inbuf[..head_len], &mut storage);
            let pp_src = c.proxy_protocol.as_ref().and_then(|h| h.src);
            let pp = pp_src.map(|a| a.ip());
            let from = peer.map(|p| p.ip());
            if let Some(ip) = shard_http::vars::real_ip(from, &first.real_ip, hs, pp) {
                // nginx's realip: the PROXY header's port with it, else none (`$remote_port`
                // is then empty).
                let port = if first.real_ip.header == "proxy_protocol" {
                    pp_src.map_or(0, |a| a.port())
                } else {
                    0
                };
                c.rq().client = Some(SocketAddr::new(ip, port));
            }
        }
        // The head is kept when the request may be proxied, limited, redirected internally, or
        // a variable needs its header lines; the common static and `return` paths copy nothing.
        let limited = !first.limit_req.is_empty() || !first.limit_conn.is_empty();
        let keep_head = limited
            || first.proxy_pass.is_some()
            || first.auth_basic.is_some()
            || first.limit_except.is_some()
            || first.doc_root_vars.is_some()
            || !server.script.is_empty()
            || !first.script.is_empty()
            || !first.error_pages.is_empty()
            || first.try_files.is_some()
            || first.ssi.enabled
            || first.needs_head;
        let head = if keep_head {
            // A pooled buffer (given back with the request), not an allocation of its own.
            let mut h = self.cx.take_buf(head_len);
            h.extend_from_slice(&self.conns[key].inbuf[..head_len]);
            h
        } else {
            Vec::new()
        };
        // nginx's preaccess phase: `limit_conn`, then `limit_req`, which may delay the request:
        // it then stays unparsed in the buffer, nothing else changed, until its timer.
        // Plain HTTP on an `ssl` listener: nginx's internal 497, which `error_page 497` may
        // turn into a redirect to https; the connection closes after the answer.
        let mut forced = self.conns[key].plain_on_tls.then_some(497);
        if forced.is_some() {
            crate::log!(
                Info,
                "client sent plain HTTP request to HTTPS port while reading client request headers{}",
                self.log_context(key, Some(&req))
            );
        }
        // A `Host` other than the name the handshake negotiated (SNI), for a server that
        // verifies client certificates, is 421: the certificate was judged for another name
        // (nginx's `ngx_http_set_virtual_server`).
        // An HTTP/2 stream's TLS is its session's connection's.
        let tls_key = self.h2_parent(key).unwrap_or(key);
        if forced.is_none() && server.ssl.verify_client != VerifyClient::Off {
            let sni = self.conns[tls_key]
                .tls
                .as_ref()
                .and_then(|t| t.server_name());
            if let (Some(sni), Some(host)) = (sni, req.host.as_deref()) {
                if !sni.eq_ignore_ascii_case(host) {
                    crate::log!(
                        Info,
                        "client attempted to request the server name different from the one that was negotiated while reading client request headers{}",
                        self.log_context(key, Some(&req))
                    );
                    forced = Some(421);
                }
            }
        }
        // `ssl_verify_client` of the request's server, as nginx checks it once the headers
        // are read: none sent is 496 (`on`), one that does not verify 495.
        if let (VerifyClient::On | VerifyClient::Optional | VerifyClient::OptionalNoCa, Some(t)) =
            (server.ssl.verify_client, self.conns[tls_key].tls.as_mut())
        {
            let verifier = self.tls.client_verifier(server_idx);
            let cc = super::tls::client_cert(t, server_idx, verifier, server.ssl.verify_depth);
            let refuse = match (cc.outcome, server.ssl.verify_client) {
                (ClientOutcome::None, VerifyClient::On) => Some(496),
                (ClientOutcome::Failed { issuer: true }, VerifyClient::OptionalNoCa) => None,
                (ClientOutcome::Failed { .. }, _) => Some(495),
                _ => None,
            };
            if let Some(code) = refuse.filter(|_| forced.is_none()) {
                let why = if code == 496 {
                    "client sent no required SSL certificate".to_string()
                } else {
                    let why = cc.verify.strip_prefix("FAILED:").unwrap_or(&cc.verify);
                    format!(
                        "client SSL certificate verify error: ({}:{why})",
                        cc.error_code
                    )
                };
                crate::log!(
                    Info,
                    "{why} while reading client request headers{}",
                    self.log_context(key, Some(&req))
                );
                forced = Some(code);
            }
        }
        // nginx's rewrite phases (the server's instructions, then the location's, again after
        // each change of location) come before its preaccess (limits) and access phases: a
        // `return` there is never limited or denied. A request refused before the phases
        // (497, 495, 496) runs none of them, as nginx refuses it in
        // `ngx_http_process_request`. A delayed request runs them again when it is handled
        // after its delay, from a clean state.
        let mut loc = first;
        let mut hops = 0;
        // A subrequest is its main request's (`$request_id`).
        let seq = match self.sub_request_seq(key) {
            Some(seq) => seq,
            None => {
                self.request_seq += 1;
                self.request_seq
            }
        };
        let c = &mut self.conns[key];
        c.rq().request_seq = seq;
        c.rq().user_vars.clear();
        c.rq().if_headers = None;
        c.rq().cache_status = "";
        // `server_name ~...(?<name>...)`: the named captures of the expression that chose the
        // server are the request's variables, as nginx's.
        if let Some(host) = req.host.as_deref() {
            let mut caps = Vec::new();
            for n in &server.server_names {
                let shard_config::ServerName::Regex(re) = n else {
                    continue;
                };
                if !re.0.captures_into(host, &mut caps) {
                    continue;
                }
                for (name, cap) in re.0.capture_names().iter().zip(&caps) {
                    if let (Some(name), Some((a, b))) = (name, cap) {
                        let v = host.as_bytes()[*a..*b].to_vec();
                        c.rq().user_vars.push((name.clone(), v));
                    }
                }
                break;
            }
        }
        // nginx's `auto_redirect` (its find-config phase, before any rewrite): `/dir` where
        // `location /dir/` passes to an upstream is a 301 to `/dir/`, arguments kept.
        let auto = auto_redirect(server, &req).filter(|_| forced.is_none());
        let rewritten = Some(if let Some((i, r)) = auto {
            loc = &server.locations[i];
            r
        } else if forced.is_none() {
            self.rewrite_phase(key, server, &mut loc, &mut req, &head, &mut hops)
        } else {
            Rewritten::Stay
        });
        let limited = !loc.limit_req.is_empty() || !loc.limit_conn.is_empty();
        // A request delayed by `limit_req` keeps its status when it is handled again.
        let c = &mut self.conns[key];
        c.rq().limit_conn_status = "";
        if !c.rq().limit_passed {
            c.rq().limit_req_status = "";
        }
        if limited && forced.is_none() && matches!(rewritten, Some(Rewritten::Stay)) {
            match self.check_limits(key, loc, &req, &head) {
                Limited::Pass => {}
                Limited::Delay(ms) => {
                    let c = &mut self.conns[key];
                    c.rq().delayed_until = self.cx.now_ms + ms.max(1);
                    let until = c.rq().delayed_until;
                    self.set_conn_deadline(key, until);
                    // Registered now if the request came with the accept (no read waited
                    // yet): the end of the client's input must be seen during the delay.
                    self.ensure_registered(key);
                    return;
                }
                Limited::Refuse(status) => forced = Some(status),
            }
        }
        WorkerSlot::bump(&self.cx.slot.requests, 1);
        if req.invalid_headers > 0 {
            crate::log!(
                Info,
                "client sent {} invalid header line(s) (ignored), request: \"{}\"",
                req.invalid_headers,
                req.request_line
            );
        }
        self.set_phase(key, Phase::Writing);
        let c = &mut self.conns[key];
        let more_input = c.inbuf.len() > head_len;
        c.inbuf.drain(..head_len);

        let c = &mut self.conns[key];
        c.requests += 1;
        c.rq().request_started_ms = self.cx.now_ms;
        c.rq().in_error_page = false;
        c.rq().status_override = None;
        if let Some(status) = req.head_error_page {
            c.rq().in_error_page = true;
            c.rq().status_override = status;
        }
        c.rq().send_timeout_ms = first.send_timeout_ms;
        c.rq().h2_chunk = first.http2_chunk_size;
        c.rq().body_timeout_ms = first.client_body_timeout_ms;
        c.rq().keepalive_timeout_ms = first.keepalive_timeout_ms;
        c.rq().linger = first.lingering;
        c.rq().linger_until_ms = 0;
        c.rq().body_bytes = 0;
        c.rq().body_bytes_max = first.client_max_body_size;
        let keep_alive =
            shard_http::response::keep_alive(&req, first, c.requests, self.shutting_down)
                && self.cx.now_ms.saturating_sub(c.opened_ms) < first.keepalive_time_ms
                && !c.plain_on_tls
                && c.h2 == 0
                && c.sub == 0
                && !matches!(forced, Some(495 | 496));

        // Body: refuse what announces itself too large before reading any of it.
        match req.body {
            shard_http::request::Body::Length(n)
                if first.client_max_body_size > 0 && n > first.client_max_body_size =>
            {
                crate::log!(
                    Error,
                    "client intended to send too large body: {n} bytes{}",
                    self.log_context(key, Some(&req))
                );
                self.error_page_in(key, 413, false, Some(first));
                self.log_access(
                    key,
                    first,
                    &req,
                    413,
                    shard_http::response::error_body(413).len() as u64,
                    &head,
                );
                return;
            }
            shard_http::request::Body::Length(0) | shard_http::request::Body::None => {
                c.rq().body = BodyLeft::None
            }
            shard_http::request::Body::Length(n) => c.rq().body = BodyLeft::Length(n),
            shard_http::request::Body::Chunked => {
                c.rq().body = BodyLeft::Chunked(ChunkedDecoder::new())
            }
        }
        if c.body_pending() {
            let deadline = self.cx.now_ms + c.rq().body_timeout_ms;
            self.set_conn_deadline(key, deadline);
        }
        let c = &mut self.conns[key];
        if c.out.capacity() == 0 {
            c.out = self.cx.spare_buf();
            c.out.clear();
        }

        self.run_phases(
            key,
            server_idx,
            loc,
            Phases {
                req,
                head,
                hops,
                keep_alive,
                more_input,
                forced,
                rewritten,
                after_upstream: false,
            },
        );
    }

    /// nginx's server rewrite phase (`server`'s instructions), the
    /// search for the location if they changed the URI, then the location's rewrite phase,
    /// again after each change of location. Counts each change in `hops`.
    #[allow(clippy::too_many_arguments)]
    fn rewrite_phase<'s>(
        &mut self,
        key: usize,
        server: &'s shard_config::ServerConf,
        loc: &mut &'s LocationConf,
        req: &mut shard_http::request::Request,
        head: &[u8],
        hops: &mut usize,
    ) -> Rewritten {
        // A named location is entered past the server's rewrite phase, as nginx's
        // `ngx_http_named_location` does.
        let named = loc.kind == shard_config::LocationKind::Named;
        if !server.script.is_empty() && !named {
            let before = req.path.clone();
            match self.run_script(key, &server.script, req, head, &server.base) {
                Outcome::Return { code, text } => return Rewritten::Return(code, text),
                Outcome::Stay | Outcome::Relocate => {
                    // The location is searched after the server's script whatever it
                    // did (nginx's `valid_location = 1` there).
                    req.location_left = false;
                    if req.path != before {
                        *loc = self.locate(key, server, &req.path.clone());
                    }
                }
            }
        }
        loop {
            if *hops > MAX_INTERNAL_REDIRECTS {
                return Rewritten::Cycle;
            }
            if loc.ret.is_some() {
                return Rewritten::Returned;
            }
            if loc.script.is_empty() {
                // No `if` ran here: only a `limit_except` may give another location.
                if loc.limit_except.is_some() {
                    self.block_location(key, server, loc, req);
                }
                return Rewritten::Stay;
            }
            self.conns[key].rq().if_location = None;
            match self.run_script(key, &loc.script, req, head, loc) {
                Outcome::Return { code, text } => return Rewritten::Return(code, text),
                Outcome::Relocate => {
                    *hops += 1;
                    *loc = self.locate(key, server, &req.path.clone());
                }
                Outcome::Stay => {
                    self.block_location(key, server, loc, req);
                    return Rewritten::Stay;
                }
            }
        }
    }

    /// The location an `if` with a `proxy_pass` (that held) or a `limit_except` with one (for
    /// another method) gives the request: `loc` becomes it, as nginx's nested configuration.
    fn block_location<'s>(
        &mut self,
        key: usize,
        server: &'s shard_config::ServerConf,
        loc: &mut &'s LocationConf,
        req: &shard_http::request::Request,
    ) {
        if let Some(i) = self.conns[key].rq().if_location.take() {
            if let Some(l) = server.locations.get(i) {
                *loc = l;
            }
        }
        if let Some(i) = limit_except(loc, req).and_then(|le| le.location) {
            if let Some(l) = server.locations.get(i) {
                *loc = l;
            }
        }
    }

    /// `limit_conn` and `limit_req` of `loc` for the request on `key`: counted in the shared
    /// zones; a refusal is logged at the directive's level, a delay one level lower (nginx).
    fn check_limits(
        &mut self,
        key: usize,
        loc: &LocationConf,
        req: &shard_http::request::Request,
        head: &[u8],
    ) -> Limited {
        let http = self.http();
        let mut storage = shard_http::vars::header_storage();
        let hs = shard_http::vars::request_headers(head, &mut storage);
        let now = self.cx.now_ms;
        let mut held = Vec::new();
        let mut verdict = Limited::Pass;
        let mut conn_status = "";
        let mut req_status = self.conns[key].rq().limit_req_status;
        {
            let ctx = self.var_ctx(key, req, hs, loc);
            for lc in &loc.limit_conn {
                let z = &http.limit_zones[lc.zone];
                let mut v = Vec::new();
                shard_http::vars::push_parts(&mut v, &z.key, &ctx);
                if v.is_empty() {
                    continue;
                }
                let k = crate::limits::key_hash(&v);
                if self.zones[lc.zone].acquire(k, lc.max, now) {
                    held.push((lc.zone, k));
                    conn_status = "PASSED";
                } else {
                    let dry = loc.limit_conn_dry_run;
                    crate::log_at!(
                        loc.limit_conn_log_level,
                        "limiting connections{} by zone \"{}\"{}",
                        if dry { ", dry run," } else { "" },
                        z.name,
                        self.log_context(key, Some(req))
                    );
                    if dry {
                        conn_status = "REJECTED_DRY_RUN";
                        break;
                    }
                    conn_status = "REJECTED";
                    verdict = Limited::Refuse(loc.limit_conn_status);
                    break;
                }
            }
            if !self.conns[key].rd().limit_passed && verdict == Limited::Pass {
                let mut delay_ms = 0;
                let mut delay_by: Option<(u64, &str)> = None;
                for lr in &loc.limit_req {
                    let z = &http.limit_zones[lr.zone];
                    let mut v = Vec::new();
                    shard_http::vars::push_parts(&mut v, &z.key, &ctx);
                    if v.is_empty() {
                        continue;
                    }
                    let rate = z.rate_milli.unwrap_or(1000).max(1);
                    let k = crate::limits::key_hash(&v);
                    let dry = loc.limit_req_dry_run;
                    req_status = "PASSED";
                    match self.zones[lr.zone].request(k, now, rate, lr.burst * 1000) {
                        crate::limits::ReqVerdict::Pass => {}
                        crate::limits::ReqVerdict::Excess(excess) => {
                            if excess > lr.delay.saturating_mul(1000) {
                                let ms = (excess - lr.delay.saturating_mul(1000)) * 1000 / rate;
                                if ms >= delay_ms {
                                    delay_by = Some((excess, z.name.as_str()));
                                }
                                delay_ms = delay_ms.max(ms);
                            }
                        }
                        crate::limits::ReqVerdict::Reject(excess) => {
                            crate::log_at!(
                                loc.limit_req_log_level,
                                "limiting requests{}, excess: {}.{:03} by zone \"{}\"{}",
                                if dry { ", dry run" } else { "" },
                                excess / 1000,
                                excess % 1000,
                                z.name,
                                self.log_context(key, Some(req))
                            );
                            if dry {
                                req_status = "REJECTED_DRY_RUN";
                                delay_ms = 0;
                                break;
                            }
                            req_status = "REJECTED";
                            verdict = Limited::Refuse(loc.limit_req_status);
                            break;
                        }
                    }
                }
                if let (Limited::Pass, true, Some((excess, zone))) =
                    (verdict, delay_ms > 0, delay_by)
                {
                    // nginx logs a delay one level below a refusal (`info` stays `info`).
                    use shard_config::LogLevel as L;
                    let level = match loc.limit_req_log_level {
                        L::Error => L::Warn,
                        L::Warn => L::Notice,
                        _ => L::Info,
                    };
                    crate::log_at!(
                        level,
                        "delaying request{}, excess: {}.{:03}, by zone \"{}\"{}",
                        if loc.limit_req_dry_run {
                            ", dry run"
                        } else {
                            ""
                        },
                        excess / 1000,
                        excess % 1000,
                        zone,
                        self.log_context(key, Some(req))
                    );
                }
                if verdict == Limited::Pass && delay_ms > 0 {
                    if loc.limit_req_dry_run {
                        req_status = "DELAYED_DRY_RUN";
                    } else {
                        req_status = "DELAYED";
                        verdict = Limited::Delay(delay_ms);
                    }
                }
            }
        }
        self.conns[key].rq().limit_passed = false;
        self.conns[key].rq().limit_conn_status = conn_status;
        self.conns[key].rq().limit_req_status = req_status;
        if verdict != Limited::Pass {
            // Refused or delayed: this request holds no count yet.
            for (z, k) in held {
                self.zones[z].release(k, now);
            }
        } else {
            self.conns[key].rq().conn_held = held;
        }
        verdict
    }

    /// Gives back the `limit_conn` counts the request on `key` holds.
    pub(super) fn release_limits(&mut self, key: usize) {
        let Some(c) = self.conns.get_mut(key) else {
            return;
        };
        let Some(r) = c.req.as_mut() else {
            return;
        };
        let now = self.cx.now_ms;
        for (z, k) in std::mem::take(&mut r.conn_held) {
            self.zones[z].release(k, now);
        }
    }

    /// The location for `path` in `server`, its captures kept on the connection.
    fn locate<'s>(
        &mut self,
        key: usize,
        server: &'s shard_config::ServerConf,
        path: &str,
    ) -> &'s LocationConf {
        let mut captures = std::mem::take(&mut self.conns[key].rq().captures);
        let loc = shard_http::route::find_location_index(server, path, &mut captures)
            .map_or(&server.base, |i| &server.locations[i]);
        let c = &mut self.conns[key];
        c.rq().captures = captures;
        c.rq().capture_text = None;
        let re = loc.regex.as_ref().filter(|_| !c.rq().captures.is_empty());
        shard_http::route::capture_names_into(&mut c.rq().capture_names, re);
        loc
    }

    /// An internal redirect: to a named location, or to a URI (whose `?` starts the new
    /// arguments) searched anew. An unknown named location is the server's own settings
    /// with a 500 logged, as nginx finalizes with 500.
    pub(super) fn redirect<'s>(
        &mut self,
        key: usize,
        server: &'s shard_config::ServerConf,
        target: Redirect,
        req: &mut shard_http::request::Request,
    ) -> &'s LocationConf {
        // A location is searched (or named) anew: nginx's `valid_location = 1`.
        req.location_left = false;
        match target {
            Redirect::Named(name) => match shard_http::route::named_location(server, &name) {
                Some(l) => {
                    self.conns[key].rq().captures.clear();
                    self.conns[key].rq().capture_names.clear();
                    l
                }
                None => {
                    crate::log!(Error, "could not find named location \"{name}\"");
                    self.conns[key].rq().captures.clear();
                    self.conns[key].rq().capture_names.clear();
                    &server.base
                }
            },
            Redirect::Uri { path, query } => {
                req.path = path;
                req.query = query;
                req.uri_changed = true;
                let p = req.path.clone();
                self.locate(key, server, &p)
            }
        }
    }

    /// `try_files`: the first candidate that exists (a directory for one written with a
    /// trailing `/`, else anything but a directory) becomes the URI served here, without that
    /// `/` (so `$uri/` of `/sub` serves nginx's 301 to `/sub/`); else the last parameter
    /// decides.
    fn try_files(
        &mut self,
        key: usize,
        loc: &LocationConf,
        tf: &shard_config::TryFiles,
        req: &mut shard_http::request::Request,
        head: &[u8],
    ) -> Action {
        let mut storage = shard_http::vars::header_storage();
        let hs = shard_http::vars::request_headers(head, &mut storage);
        let mut found = None;
        let last = {
            let ctx = self.var_ctx(key, req, hs, loc);
            let root = shard_http::vars::doc_root(&ctx);
            for f in &tf.files {
                let uri = shard_http::vars::render(&f.name, &ctx);
                let path = shard_http::static_file::map_try_path_with(loc, &uri, root.as_deref());
                match std::fs::metadata(&path) {
                    Ok(m) if m.is_dir() == f.dir => {
                        found = Some((uri, f.dir));
                        break;
                    }
                    _ => {}
                }
            }
            match &tf.last {
                shard_config::TryLast::Uri(parts) => {
                    Some(Redirect::parse(&shard_http::vars::render(parts, &ctx)))
                }
                shard_config::TryLast::Named(n) => Some(Redirect::Named(n.clone())),
                shard_config::TryLast::Code(_) => None,
            }
        };
        if let Some((uri, dir)) = found {
            req.add_uri_to_alias = !dir
                && loc.alias.is_some()
                && loc.alias_from.is_none()
                && loc.kind == shard_config::LocationKind::Regex;
            req.path = uri;
            req.uri_changed = true;
            return Action::Content;
        }
        match (last, &tf.last) {
            (Some(r), _) => Action::Redirect(r),
            (None, shard_config::TryLast::Code(c)) => Action::Status(*c),
            (None, _) => Action::Status(500),
        }
    }

    /// Writes the request's line into every `access_log` of `loc`. `head` is the request head
    /// when a format needs its header lines (see `LocationConf::needs_head`), else may be empty.
    pub(super) fn log_access(
        &mut self,
        key: usize,
        loc: &LocationConf,
        req: &shard_http::request::Request,
        status: u16,
        bytes: u64,
        head: &[u8],
    ) {
        self.log_access_with(key, loc, req, status, bytes, head, &[]);
    }

    /// [`Worker::log_access`] of a proxied request, with the peers it tried.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn log_access_with(
        &mut self,
        key: usize,
        loc: &LocationConf,
        req: &shard_http::request::Request,
        status: u16,
        bytes: u64,
        head: &[u8],
        upstream: &[shard_http::vars::UpstreamTry],
    ) {
        self.log_access_body(key, loc, req, status, bytes, head, upstream, None);
    }

    /// [`Worker::log_access_with`] with the request body the proxy still holds, for
    /// `$request_body` (nginx keeps a body read into memory until the request ends).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn log_access_body(
        &mut self,
        key: usize,
        loc: &LocationConf,
        req: &shard_http::request::Request,
        status: u16,
        bytes: u64,
        head: &[u8],
        upstream: &[shard_http::vars::UpstreamTry],
        body: Option<&[u8]>,
    ) {
        crate::debug!(
            "http finalize request: {status}, \"{}{}{}\" sent:{bytes}",
            req.path,
            if req.query.is_some() { "?" } else { "" },
            req.query.as_deref().unwrap_or("")
        );
        // Subrequests are logged only with `log_subrequest on`.
        let sub = self.conns[key].sub != 0;
        if sub && !loc.log_subrequest {
            return;
        }
        // `post_action`: the request is answered; its action runs beside, unread.
        if let Some(uri) = loc.post_action.as_deref().filter(|_| !sub) {
            self.post_action(key, uri, head);
        }
        for al in &loc.access_logs {
            let i = match (&al.path_vars, self.access_log_idx.get(&al.path)) {
                (Some(_), _) => usize::MAX,
                (None, Some(&i)) => i,
                (None, None) => continue,
            };
            if al.format.name == LogFormat::COMBINED
                && al.condition.is_none()
                && al.path_vars.is_none()
            {
                let peer = self.conns[key]
                    .rq()
                    .client
                    .map_or(std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED), |p| {
                        p.ip()
                    });
                let f = &mut self.access_logs[i];
                shard_http::access_log::write_combined(
                    &mut f.buf,
                    peer,
                    &self.cx.log_time,
                    &req.request_line,
                    status,
                    bytes,
                    req.referer.as_deref(),
                    req.user_agent.as_deref(),
                );
            } else {
                let mut storage = shard_http::vars::header_storage();
                let headers = shard_http::vars::request_headers(head, &mut storage);
                let mut ctx = self.var_ctx(key, req, headers, loc);
                if let Some(b) = body {
                    ctx.conn.request_body = b;
                }
                let cache_status = self.conns[key].rd().cache_status;
                let head_bytes = self.conns[key].rd().head_bytes;
                ctx.done = Some(shard_http::vars::Done {
                    status,
                    body_bytes: bytes,
                    bytes: bytes + head_bytes,
                    head: &self.conns[key].rd().sent_head,
                    upstream,
                    cache_status,
                    ..Default::default()
                });
                if al
                    .condition
                    .as_ref()
                    .is_some_and(|c| !shard_http::access_log::condition_holds(c, &ctx))
                {
                    continue;
                }
                let mut line = Vec::with_capacity(256);
                shard_http::access_log::write_format(&mut line, &al.format, &ctx);
                if let Some(parts) = &al.path_vars {
                    let path = shard_http::vars::render(parts, &ctx);
                    self.write_log_path(&path, &line, loc.open_log_file_cache.as_ref());
                    continue;
                }
                self.access_logs[i].buf.extend_from_slice(&line);
            }
            self.flush_access_log_if(i, al.buffer);
        }
    }

    /// Writes the response head (and small bodies) into the output buffer, or sets up a file
    /// body. Returns what the access log needs.
    fn respond(
        &mut self,
        key: usize,
        server: &shard_config::ServerConf,
        loc: &LocationConf,
        req: &shard_http::request::Request,
        keep_alive: bool,
        head: &[u8],
    ) -> Reply {
        let _ = server;
        super::respond::respond(self, key, loc, req, keep_alive, head)
    }

    /// The server of the current request on `key`.
    pub(super) fn server_of(&self, key: usize) -> &shard_config::ServerConf {
        &self.http().servers[self.conns[key].rd().server]
    }

    /// The variables of the current request on `key`, before its response.
    pub(super) fn var_ctx<'v>(
        &'v self,
        key: usize,
        req: &'v shard_http::request::Request,
        headers: &'v [shard_http::vars::Header<'v>],
        loc: &'v LocationConf,
    ) -> shard_http::vars::Ctx<'v> {
        let c = &self.conns[key];
        let srv = self.server_of(key);
        shard_http::vars::Ctx {
            req,
            headers,
            client: c.rd().client,
            server_addr: self.cx.cfg.listeners[c.listener].addr,
            server_name: shard_http::route::server_name(srv),
            location: loc,
            pass: loc.proxy_pass.as_ref(),
            conn: self.var_conn(key),
            scope: self.var_scope(key, req),
            done: None,
        }
    }

    /// `allow`/`deny` of `loc` refuse the client (logged as nginx logs it).
    fn access_denied(
        &self,
        key: usize,
        loc: &LocationConf,
        req: &shard_http::request::Request,
    ) -> bool {
        let rules = match limit_except(loc, req) {
            Some(le) => &le.access_rules,
            None => &loc.access_rules,
        };
        if rules.is_empty() {
            return false;
        }
        let client = self.conns[key].rd().client.map(|p| p.ip());
        let allowed = rules
            .iter()
            .find(|r| r.matches_client(client))
            .is_none_or(|r| r.allow);
        if !allowed {
            crate::log!(
                Error,
                "access forbidden by rule{}",
                self.log_context(key, Some(req))
            );
        }
        !allowed
    }

    /// nginx's access phase: `allow`/`deny` and `auth_basic`, both required (`satisfy all`)
    /// or either enough (`satisfy any`). `None` lets the request through.
    fn access_phase<'s>(
        &mut self,
        key: usize,
        server: &'s shard_config::ServerConf,
        loc: &LocationConf,
        req: &shard_http::request::Request,
        head: &[u8],
    ) -> Access<'s> {
        // A subrequest skips the access phase: its main request passed it (nginx).
        if self.conns[key].sub != 0 {
            return Access::Pass;
        }
        if !loc.satisfy_any {
            if self.access_denied(key, loc, req) {
                return Access::Deny(403);
            }
            if let Some(code) = self.auth_basic_denied(key, loc, req, head) {
                return Access::Deny(code);
            }
            return match self.auth_request_result(key, server, loc, req, head) {
                Ok(None) => Access::Pass,
                Ok(Some(code)) => Access::Deny(code),
                Err(ask) => Access::Ask(ask),
            };
        }
        // `satisfy any`: one handler that lets the request through is enough; when none
        // does, a 401 met on the way stays (nginx's `access_code`), else the last 403.
        let le = limit_except(loc, req);
        let has_rules = !le.map_or(&loc.access_rules, |l| &l.access_rules).is_empty();
        let has_auth = le.map_or(loc.auth_basic.is_some(), |l| l.auth_basic.is_some());
        let denied = self.access_denied(key, loc, req);
        if has_rules && !denied {
            return Access::Pass;
        }
        let mut code = denied.then_some(403);
        if has_auth {
            match self.auth_basic_denied(key, loc, req, head) {
                None => return Access::Pass,
                Some(c @ (401 | 403)) => {
                    if code != Some(401) {
                        code = Some(c);
                    }
                }
                Some(c) => return Access::Deny(c),
            }
        }
        if loc.auth_request.is_some() {
            match self.auth_request_result(key, server, loc, req, head) {
                Ok(None) => return Access::Pass,
                Ok(Some(c @ (401 | 403))) => {
                    if code != Some(401) {
                        code = Some(c);
                    }
                }
                Ok(Some(c)) => return Access::Deny(c),
                Err(ask) => return Access::Ask(ask),
            }
        }
        match code {
            Some(c) => Access::Deny(c),
            None => Access::Pass,
        }
    }

    /// `auth_request` of `loc`: `Ok(None)` lets the request through (not configured, or its
    /// subrequest answered 2xx), `Ok(Some(code))` refuses it (401, 403; 500 for any other
    /// answer, as nginx), `Err` when the subrequest must ask an upstream first (the
    /// proxy then resumes the phases with its answer in `Req::auth_status`). A subrequest
    /// to a location of this server runs its rewrite phase (`if`, `return`) here; its
    /// content is a `return`, a file (200, else 404) or a proxied answer.
    fn auth_request_result<'s>(
        &mut self,
        key: usize,
        server: &'s shard_config::ServerConf,
        loc: &LocationConf,
        req: &shard_http::request::Request,
        head: &[u8],
    ) -> Result<Option<u16>, Box<AuthAsk<'s>>> {
        let Some(uri) = loc.auth_request.as_deref() else {
            return Ok(None);
        };
        let status = match self.conns[key].rd().auth_status {
            Some(st) => st,
            None => {
                let mut sub = req.clone();
                sub.body = shard_http::request::Body::None;
                let (path, query) = match uri.split_once('?') {
                    Some((p, q)) => (p.to_string(), Some(q.to_string())),
                    None => (uri.to_string(), None),
                };
                let c = &mut self.conns[key];
                let saved = (
                    std::mem::take(&mut c.rq().captures),
                    std::mem::take(&mut c.rq().capture_names),
                    c.rq().capture_text.take(),
                );
                let mut sub_loc =
                    self.redirect(key, server, Redirect::Uri { path, query }, &mut sub);
                let mut hops = 0;
                let st = match self.rewrite_phase(
                    key,
                    server,
                    &mut sub_loc,
                    &mut sub,
                    head,
                    &mut hops,
                ) {
                    Rewritten::Return(code, _) => Some(code),
                    Rewritten::Returned => sub_loc.ret.as_ref().map(|r| r.code),
                    Rewritten::Cycle => Some(500),
                    Rewritten::Stay | Rewritten::Answer(..) => None,
                };
                let proxied = sub_loc.proxy_pass.is_some()
                    && sub_loc.ret.is_none()
                    && sub_loc.handler.is_none();
                let st = match st {
                    Some(code) => code,
                    None if proxied => {
                        return Err(Box::new(AuthAsk {
                            loc: sub_loc,
                            req: sub,
                            captures: saved,
                        }));
                    }
                    None => {
                        let root = self.doc_root(key, &sub, sub_loc, head);
                        let path = shard_http::static_file::map_path_with(
                            sub_loc,
                            &sub.path,
                            root.as_deref(),
                        );
                        match std::fs::metadata(&path) {
                            Ok(m) if m.is_file() => 200,
                            Ok(_) => 403,
                            Err(_) => 404,
                        }
                    }
                };
                let c = &mut self.conns[key];
                (c.rq().captures, c.rq().capture_names, c.rq().capture_text) = saved;
                c.rq().auth_status = Some(st);
                self.auth_request_vars(key, req, head, loc, st, &[]);
                st
            }
        };
        Ok(match status {
            200..=299 => None,
            401 | 403 => Some(status),
            other => {
                crate::log!(
                    Error,
                    "auth request unexpected status: {other}{}",
                    self.log_context(key, Some(req))
                );
                Some(500)
            }
        })
    }

    /// `auth_basic` of `loc`: `None` lets the request through, else the status (401, with
    /// the realm for `WWW-Authenticate`, or 500 when the user file is unreadable).
    fn auth_basic_denied(
        &mut self,
        key: usize,
        loc: &LocationConf,
        req: &shard_http::request::Request,
        head: &[u8],
    ) -> Option<u16> {
        let conf = match limit_except(loc, req) {
            Some(le) => le.auth_basic.as_ref()?,
            None => loc.auth_basic.as_ref()?,
        };
        // `auth_basic_user_file $var`: the file this request names, read now (as nginx reads
        // every user file).
        let rendered;
        let conf = match &conf.file_vars {
            None => conf,
            Some(parts) => {
                let name = self.render(key, req, head, loc, parts);
                let path = conf.conf_dir.join(&name);
                let users = match std::fs::read_to_string(&path) {
                    Ok(text) => Ok(shard_config::AuthBasic::parse_users(&text)),
                    Err(e) => Err(format!(
                        "open() \"{}\" failed ({})",
                        path.display(),
                        shard_event::os_error_text(&e)
                    )),
                };
                rendered = shard_config::AuthBasic {
                    realm: conf.realm.clone(),
                    file: path,
                    users,
                    file_vars: None,
                    conf_dir: std::path::PathBuf::new(),
                };
                &rendered
            }
        };
        let mut storage = shard_http::vars::header_storage();
        let hs = shard_http::vars::request_headers(head, &mut storage);
        let authorization = hs
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case("authorization"))
            .map(|h| h.value);
        match super::auth::check(conf, authorization) {
            super::auth::Auth::Granted => None,
            super::auth::Auth::Denied(why) => {
                if let Some(why) = why {
                    crate::log!(Error, "{why}{}", self.log_context(key, Some(req)));
                }
                self.conns[key].rq().www_authenticate = Some(conf.realm.clone());
                Some(401)
            }
            super::auth::Auth::Broken(why) => {
                crate::log!(Error, "{why}{}", self.log_context(key, Some(req)));
                Some(500)
            }
        }
    }

    /// The root or alias of `loc` for this request when it has variables (`root /srv/$host`).
    pub(super) fn doc_root(
        &self,
        key: usize,
        req: &shard_http::request::Request,
        loc: &LocationConf,
        head: &[u8],
    ) -> Option<std::path::PathBuf> {
        loc.doc_root_vars.as_ref()?;
        let mut storage = shard_http::vars::header_storage();
        let hs = shard_http::vars::request_headers(head, &mut storage);
        shard_http::vars::doc_root(&self.var_ctx(key, req, hs, loc))
    }

    /// nginx's absolute form of a redirect to a relative `location` (`/...`): the scheme,
    /// the request's host (the server's first name with `server_name_in_redirect on`, or
    /// without a host) and the listening port unless it is the scheme's (or with
    /// `port_in_redirect off`). `None`: nothing to change (`absolute_redirect off`, or not
    /// relative).
    pub(super) fn absolute_redirect(
        &self,
        key: usize,
        loc: &LocationConf,
        req: &shard_http::request::Request,
        location: &str,
    ) -> Option<String> {
        if !location.starts_with('/') || !loc.absolute_redirect {
            return None;
        }
        // nginx: the server's name with `server_name_in_redirect on`, else the request's
        // host, else the address the connection came in on.
        let name = shard_http::route::server_name(self.server_of(key));
        let local;
        let host = match req.host.as_deref() {
            _ if loc.server_name_in_redirect => name,
            Some(h) => h,
            None => {
                local = shard_event::sock::local_addr(fd_of(&self.conns[key].fd))
                    .map_or_else(|_| name.to_string(), |a| a.ip().to_string());
                &local
            }
        };
        let https = self.is_tls(key);
        let port = if loc.port_in_redirect {
            self.cx.cfg.listeners[self.conns[key].listener].addr.port()
        } else if https {
            443
        } else {
            80
        };
        Some(shard_http::response::absolute_location_scheme(
            location, host, port, https,
        ))
    }

    /// nginx's `return 444`: the connection closes with nothing sent.
    pub(super) fn close_without_response(&mut self, key: usize) {
        let c = &mut self.conns[key];
        c.out.clear();
        c.close_after = true;
        c.rq().body = BodyLeft::None;
    }

    /// Captures, `set` values and maps of the current request on `key`.
    pub(super) fn var_scope<'v>(
        &'v self,
        key: usize,
        req: &'v shard_http::request::Request,
    ) -> shard_http::vars::Scope<'v> {
        let c = &self.conns[key];
        shard_http::vars::Scope {
            captures: &c.rd().captures,
            capture_text: c.rd().capture_text.as_deref().unwrap_or(&req.path),
            capture_names: &c.rd().capture_names,
            user: &c.rd().user_vars,
            maps: self.cx.cfg.http.as_ref().map_or(&[][..], |h| &h.maps),
        }
    }

    /// What the variables of the current request on `key` need from the connection.
    pub(super) fn var_conn(&self, key: usize) -> shard_http::vars::Conn<'_> {
        let c = &self.conns[key];
        let now = shard_event::unix_ms();
        shard_http::vars::Conn {
            connection: c.number,
            requests: c.requests,
            now_ms: now,
            started_ms: now
                .saturating_sub(self.cx.now_ms.saturating_sub(c.rd().request_started_ms)),
            opened_ms: now.saturating_sub(self.cx.now_ms.saturating_sub(c.opened_ms)),
            peer: c.peer,
            limit_req_status: c.rd().limit_req_status,
            limit_conn_status: c.rd().limit_conn_status,
            request_id: self.request_id(key),
            hostname: &self.hostname,
            proxy_protocol: c.proxy_protocol.as_deref(),
            // The client certificate as `handle` judged it for the request's server
            // (`ssl_verify_client`); a server that asks for none has none, as in nginx.
            tls: match (
                self.h2_parent(key).and_then(|p| self.conns.get(p)),
                self.h3_tls(key),
            ) {
                (Some(p), _) => p.tls.as_ref().map(|t| t.vars(c.rd().server)),
                // QUIC is TLS 1.3; its cipher and session are quinn's own.
                (None, Some((server_name, alpn, early_data))) => Some(shard_http::vars::Tls {
                    protocol: "TLSv1.3",
                    cipher: "",
                    server_name,
                    session_reused: false,
                    alpn,
                    curve: "",
                    session_id: "",
                    ciphers: "",
                    curves: "",
                    early_data,
                    client: shard_http::vars::ClientCert {
                        verify: "NONE",
                        ..Default::default()
                    },
                }),
                (None, None) => c.tls.as_ref().map(|t| t.vars(c.rd().server)),
            },
            http2: self.h2_var(key),
            http3: if self.h3_tls(key).is_some() { "h3" } else { "" },
            upstream: &c.rd().upstream_tries,
            request_body: &c.rd().request_body,
            request_body_file: None,
            status: Some(self.region),
            limit_rate: c
                .rd()
                .rate
                .as_ref()
                .map(|r| r.bytes_per_sec)
                .or(c.rd().rate_set)
                .unwrap_or(0),
            pipelined: c.rd().pipelined,
            slice_range: &c.rd().slice_range,
        }
    }

    /// Sets the connection's deadline and queues a timer when it is earlier than the one
    /// already queued (later deadlines are re-armed lazily by `expire_timers`).
    pub(super) fn set_conn_deadline(&mut self, key: usize, deadline: u64) {
        let c = &mut self.conns[key];
        c.deadline_ms = deadline;
        if deadline < c.timer_at {
            c.timer_at = deadline;
            self.timers.push(std::cmp::Reverse((deadline, key, c.id)));
        }
    }

    pub(super) fn out_buf(&mut self, key: usize) -> &mut Vec<u8> {
        &mut self.conns[key].out
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn set_file_body(
        &mut self,
        key: usize,
        fd: super::files::FileRef,
        offset: u64,
        len: u64,
        sendfile: bool,
        file_size: u64,
        recoded: Option<std::sync::Arc<[u8; 256]>>,
    ) {
        let c = &mut self.conns[key];
        if len == 0 {
            return;
        }
        // Recoded bytes are read in user space.
        let sendfile = sendfile && recoded.is_none();
        // TLS encrypts in user space: the file is read and written through it; an HTTP/2
        // stream's goes into frames.
        let socket =
            c.tls.is_none() && c.fd.is_some() && c.req.as_ref().is_none_or(|r| r.ssi.is_none());
        let sendfile = sendfile && socket;
        let (mut offset, mut len) = (offset, len);
        let inline = !sendfile && len <= INLINE_BODY_BYTES && c.out.len() < PIPELINE_GATHER_BYTES;
        // A kept file is sent from its mapping (never read in user space, where a truncated
        // file would raise SIGBUS): one copy and, with the head, one `writev`. Not when more
        // pipelined requests wait: their responses gather behind this one's inline body.
        let gathering = inline && !c.inbuf.is_empty();
        let mapped = !sendfile
            && socket
            && !gathering
            && recoded.is_none()
            && fd
                .mapping(file_size)
                .is_some_and(|m| offset.saturating_add(len) <= m.len() as u64);
        // A small body without `sendfile` is read behind its head now: head and body leave
        // in one write (with the other pipelined responses), and the descriptor closes at
        // once. A short read (the file shrank) leaves the rest to `flush`, which fails it.
        if inline && !mapped {
            let n = loop {
                match shard_event::sock::pread_append(
                    fd.as_raw_fd(),
                    &mut c.out,
                    len as usize,
                    offset,
                ) {
                    Ok(n) => break n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(_) => break 0,
                }
            };
            if let Some(t) = recoded.as_deref() {
                let at = c.out.len() - n;
                recode(&mut c.out[at..], t);
            }
            offset += n as u64;
            len -= n as u64;
            if len == 0 {
                return;
            }
        }
        let size_checked_turn = (fd.size_checked_for() == self.request_seq).then_some(self.cx.turn);
        c.rq().file = Some(FileBody {
            fd,
            offset,
            remaining: len,
            sendfile,
            mapped,
            size_checked_turn,
            recode: recoded,
        });
    }

    /// The response's `limit_rate`, as nginx's write filter takes it when the response starts:
    /// `set $limit_rate` or `X-Accel-Limit-Rate` if given, else the location's (variables
    /// rendered now); `limit_rate_after` from the location. Counted from the request's start.
    #[inline]
    pub(super) fn settle_limit_rate(
        &mut self,
        key: usize,
        loc: &LocationConf,
        req: &shard_http::request::Request,
        head: &[u8],
    ) {
        // The common case: no limit, nothing to render.
        if loc.limit_rate.is_zero() {
            if let Some(r) = self.conns[key].req.as_mut() {
                if r.rate_set.is_none() {
                    r.rate = None;
                    return;
                }
            }
        }
        self.settle_limit_rate_slow(key, loc, req, head);
    }

    #[cold]
    fn settle_limit_rate_slow(
        &mut self,
        key: usize,
        loc: &LocationConf,
        req: &shard_http::request::Request,
        head: &[u8],
    ) {
        let set = self.conns[key].rd().rate_set;
        let bytes = match set {
            Some(n) => n,
            None => self.size_value(key, loc, req, head, &loc.limit_rate),
        };
        let after = if bytes > 0 {
            self.size_value(key, loc, req, head, &loc.limit_rate_after)
        } else {
            0
        };
        let start_ms = self.conns[key].rd().request_started_ms;
        self.conns[key].rq().rate = (bytes > 0).then(|| {
            Box::new(Rate {
                bytes_per_sec: bytes,
                after,
                start_ms,
                sent: 0,
                resume_ms: 0,
            })
        });
    }

    /// A size directive's value for this request: empty is 0, as is one that is not a size
    /// (logged, as nginx's `ngx_http_complex_value_size`).
    fn size_value(
        &mut self,
        key: usize,
        loc: &LocationConf,
        req: &shard_http::request::Request,
        head: &[u8],
        v: &shard_config::SizeValue,
    ) -> u64 {
        let parts = match v {
            shard_config::SizeValue::Fixed(n) => return *n,
            shard_config::SizeValue::Vars(parts) => parts,
        };
        let text = self.render(key, req, head, loc, parts);
        if text.is_empty() {
            return 0;
        }
        shard_config::parse_size(&text).unwrap_or_else(|| {
            crate::log!(
                Error,
                "invalid size \"{text}\"{}",
                self.log_context(key, Some(req))
            );
            0
        })
    }
}

impl<'a> Worker<'a> {
    /// nginx's phases from the rewrite phase on, for the request in `ph` in `loc` of server
    /// `server_idx`: rewrite (again after each internal redirect), access, `try_files`,
    /// content, `error_page`, the access log. A proxied location starts the proxy and
    /// returns; its access-log line is written when the response ends.
    // After an internal redirect the rewrite phases run again: the server's instructions
    // too, then the new location's.
    pub(super) fn run_phases(
        &mut self,
        key: usize,
        server_idx: usize,
        mut loc: &'a LocationConf,
        ph: Phases,
    ) {
        let cfg = self.cx.cfg;
        let Phases {
            mut req,
            head,
            mut hops,
            keep_alive,
            more_input,
            mut forced,
            mut rewritten,
            after_upstream,
        } = ph;
        if after_upstream {
            // The phases start again from the error page: the connection is answering.
            if self.conns[key].phase != Phase::Writing {
                self.set_phase(key, Phase::Writing);
            }
        }
        let Some(http) = cfg.http.as_ref() else {
            return;
        };
        let server = &http.servers[server_idx];
        let out_start = self.conns[key].out.len();
        let reply = loop {
            self.enter_log_context(key, loc);
            let mut returned = false;
            let mut answered = None;
            let scripted = match rewritten.take().unwrap_or_else(|| {
                self.rewrite_phase(key, server, &mut loc, &mut req, &head, &mut hops)
            }) {
                Rewritten::Stay => None,
                Rewritten::Return(code, text) => Some((code, text)),
                Rewritten::Returned => {
                    returned = true;
                    None
                }
                Rewritten::Answer(code, location) => {
                    answered = Some((code, location));
                    None
                }
                Rewritten::Cycle => {
                    crate::log!(
                        Error,
                        "rewrite or internal redirection cycle while internally redirecting to \"{}\"",
                        req.path
                    );
                    self.conns[key].rq().in_error_page = true;
                    break super::respond::status(self, key, loc, &req, keep_alive, &head, 500);
                }
            };
            // nginx's order: `internal` is checked when the location is found, a `return`
            // ends the rewrite phase, then access (`allow`/`deny`), then `try_files`.
            let action = if let Some(code) = forced.take() {
                Action::Status(code)
            } else if let Some((code, location)) = answered.take() {
                Action::Answer(code, location)
            } else if loc.internal && hops == 0 && self.conns[key].sub == 0 {
                // (A subrequest is internal, as nginx's: it may reach `internal` locations.)
                Action::Status(404)
            } else if let Some((code, text)) = scripted {
                Action::Return(code, text)
            } else if returned {
                Action::Content
            } else if let Some(code) = match self.access_phase(key, server, loc, &req, &head) {
                Access::Pass => None,
                Access::Deny(code) => Some(code),
                Access::Ask(ask) => {
                    // `auth_request` to an upstream: the subrequest is proxied on this
                    // connection, and its answer starts these phases again.
                    self.start_auth_request(
                        key,
                        server_idx,
                        ask,
                        super::proxy::AuthWait {
                            location: loc_index(server, loc),
                            req,
                            head,
                            hops,
                            keep_alive,
                            more_input,
                        },
                    );
                    return;
                }
            } {
                // `auth_delay`: a refused password is answered only after the delay.
                if code == 401 && loc.auth_delay_ms > 0 {
                    crate::log!(
                        Info,
                        "delaying unauthorized request{}",
                        self.log_context(key, Some(&req))
                    );
                    self.conns[key].rq().hold_until_ms = self.cx.now_ms + loc.auth_delay_ms;
                }
                Action::Status(code)
            } else {
                // The precontent phase: `mirror` (main requests only), then `try_files`.
                if !loc.mirrors.is_empty() && self.conns[key].sub == 0 {
                    self.mirror(key, loc, &req, &head);
                }
                match &loc.try_files {
                    Some(tf) => self.try_files(key, loc, tf, &mut req, &head),
                    None => Action::Content,
                }
            };
            let proxied = loc.proxy_pass.is_some() && loc.ret.is_none() && loc.handler.is_none();
            self.settle_limit_rate(key, loc, &req, &head);
            if loc.userid.is_some() || self.conns[key].rd().uid_header.is_some() {
                self.userid_step(key, loc, &req, &head);
            }
            let reply = match action {
                Action::Redirect(target) => {
                    hops += 1;
                    let uri = !matches!(target, Redirect::Named(_));
                    loc = self.redirect(key, server, target, &mut req);
                    // A URI is searched anew, `auto_redirect` included (nginx's find-config
                    // phase); a named location is not.
                    if let Some((i, r)) = auto_redirect(server, &req).filter(|_| uri) {
                        loc = &server.locations[i];
                        rewritten = Some(r);
                    }
                    continue;
                }
                Action::Return(code, text) => {
                    super::respond::returned(self, key, loc, &req, keep_alive, &head, code, text)
                }
                Action::Status(code) => {
                    super::respond::status(self, key, loc, &req, keep_alive, &head, code)
                }
                Action::Answer(code, location) => {
                    self.dav_answer(key, loc, &req, keep_alive, &head, code, location)
                }
                Action::Content if !proxied && super::dav::dav_method(loc, &req).is_some() => {
                    let bit = super::dav::dav_method(loc, &req).unwrap_or(0);
                    match self.dav(key, loc, &req, &head, bit) {
                        super::dav::DavStep::Answer(code, location) => {
                            self.dav_answer(key, loc, &req, keep_alive, &head, code, location)
                        }
                        super::dav::DavStep::ReadBody => {
                            // `PUT`: the body is read as the proxy reads one, then put in
                            // place (`Worker::dav_put_end`), which answers.
                            self.start_proxy(
                                key, server_idx, loc, req, head, more_input, keep_alive,
                            );
                            if let Some(p) = self.conns[key].rq().proxy.as_mut() {
                                p.dav = true;
                            }
                            return;
                        }
                    }
                }
                Action::Content
                    if proxied
                        && loc
                            .gateway
                            .as_ref()
                            .is_some_and(|g| g.wire == shard_config::Wire::Memcached)
                        && !matches!(
                            req.method,
                            shard_http::request::Method::Get | shard_http::request::Method::Head
                        ) =>
                {
                    // memcached answers `GET` and `HEAD` alone, as nginx's module.
                    super::respond::status(self, key, loc, &req, keep_alive, &head, 405)
                }
                Action::Content if proxied => {
                    // The access log line is written when the proxied response ends.
                    self.start_proxy(key, server_idx, loc, req, head, more_input, keep_alive);
                    return;
                }
                Action::Content => self.respond(key, server, loc, &req, keep_alive, &head),
            };
            if let Some(uri) = reply.redirect {
                // The index module's internal redirect: the location is searched anew.
                hops += 1;
                let query = req.query.clone();
                loc = self.redirect(key, server, Redirect::Uri { path: uri, query }, &mut req);
                if let Some((i, r)) = auto_redirect(server, &req) {
                    loc = &server.locations[i];
                    rewritten = Some(r);
                }
                continue;
            }
            let Some(i) = reply.error_page else {
                break reply;
            };
            // `error_page`: the page is requested anew with GET (a HEAD stays HEAD).
            let ep = &loc.error_pages[i];
            let target = {
                let mut storage = shard_http::vars::header_storage();
                let hs = shard_http::vars::request_headers(&head, &mut storage);
                let ctx = self.var_ctx(key, &req, hs, loc);
                shard_http::vars::render(&ep.target, &ctx)
            };
            let c = &mut self.conns[key];
            // `recursive_error_pages on`: the page's own errors may take an `error_page`
            // too (the internal-redirect bound ends a loop with 500, as nginx's).
            c.rq().in_error_page = !loc.recursive_error_pages;
            // An internal redirect starts the modules afresh, as nginx's: the page's location
            // asks its own `auth_request`.
            c.rq().auth_status = None;
            if !(target.starts_with('/') || target.starts_with('@')) {
                // A URL: a redirect, 302 unless `=CODE` says otherwise.
                let code = match ep.status {
                    ErrorPageStatus::Code(c) => c,
                    _ => 302,
                };
                let r = shard_http::response::return_reply(code, Some(target), "text/html");
                break super::respond::simple_reply(self, key, loc, &req, keep_alive, &head, r);
            }
            c.rq().status_override = match ep.status {
                ErrorPageStatus::Original => Some(reply.status),
                ErrorPageStatus::Code(code) => Some(code),
                ErrorPageStatus::Target => None,
            };
            // A URI is requested with GET (HEAD stays HEAD); a named location keeps the
            // method, as nginx's `ngx_http_send_error_page`.
            if req.method != shard_http::request::Method::Head && !target.starts_with('@') {
                req.method = shard_http::request::Method::Get;
            }
            hops += 1;
            let target = Redirect::parse(&target);
            let uri = !matches!(target, Redirect::Named(_));
            let mut next = self.redirect(key, server, target, &mut req);
            if let Some((i, r)) = auto_redirect(server, &req).filter(|_| uri) {
                next = &server.locations[i];
                rewritten = Some(r);
            }
            let next_proxied = next.proxy_pass.is_some() && next.ret.is_none();
            if next_proxied
                && req.body != shard_http::request::Body::None
                && self.conns[key].rd().kept_body.is_none()
            {
                // Its body is being discarded: the upstream cannot be given a request whose
                // body is gone, so the error is sent as it is. (A body a failed upstream
                // request read is kept and goes to the next upstream.)
                break super::respond::status(
                    self,
                    key,
                    loc,
                    &req,
                    keep_alive,
                    &head,
                    reply.status,
                );
            }
            loc = next;
        };
        self.frame_trailers(
            key,
            out_start,
            &req,
            &head,
            loc,
            reply.status,
            reply.body_bytes,
        );
        let c = &mut self.conns[key];
        if !keep_alive {
            c.close_after = true;
        }
        if let Some(secs) = loc.keepalive_header {
            let sent = c.out_pos;
            keep_alive_header(&mut c.out, sent, out_start, secs);
        }
        // `$bytes_sent` counts the head too: its length, where a log format may ask for it;
        // `$sent_http_NAME` reads its lines.
        if loc
            .access_logs
            .iter()
            .any(|al| al.format.name != LogFormat::COMBINED)
        {
            let out = &c.out[out_start.min(c.out.len())..];
            let len = memchr::memmem::find(out, b"\r\n\r\n").map_or(0, |i| i + 4);
            let wants_head = loc.access_logs.iter().any(|al| al.format.reads_sent_http);
            let head = if wants_head {
                out[..len].to_vec()
            } else {
                Vec::new()
            };
            c.rq().head_bytes = len as u64;
            c.rq().sent_head = head;
        }
        self.log_access(key, loc, &req, reply.status, reply.body_bytes, &head);
    }
}

impl Worker<'_> {
    /// `auth_request_set` of `loc`: each variable set from the subrequest's answer
    /// (`status`, and the upstream tried when it was proxied).
    pub(super) fn auth_request_vars(
        &mut self,
        key: usize,
        req: &shard_http::request::Request,
        head: &[u8],
        loc: &LocationConf,
        status: u16,
        upstream: &[shard_http::vars::UpstreamTry],
    ) {
        if loc.auth_request_set.is_empty() {
            return;
        }
        let mut storage = shard_http::vars::header_storage();
        let hs = shard_http::vars::request_headers(head, &mut storage);
        let mut values = Vec::new();
        {
            let mut ctx = self.var_ctx(key, req, hs, loc);
            ctx.done = Some(shard_http::vars::Done {
                status,
                upstream,
                ..Default::default()
            });
            for (name, parts) in &loc.auth_request_set {
                let mut v = Vec::new();
                shard_http::vars::push_parts(&mut v, parts, &ctx);
                values.push((name.clone(), v));
            }
        }
        for (name, v) in values {
            // `$args` is set on the request by the caller (`auth_done`), `$limit_rate` here.
            if name == "limit_rate" {
                if let Some(n) = shard_config::parse_size(&String::from_utf8_lossy(&v)) {
                    self.conns[key].rq().rate_set = Some(n);
                }
                continue;
            }
            let vars = &mut self.conns[key].rq().user_vars;
            match vars.iter_mut().find(|(n, _)| *n == name) {
                Some(slot) => slot.1 = v,
                None => vars.push((name, v)),
            }
        }
    }
}

/// What the access phase decided.
pub(super) enum Access<'s> {
    Pass,
    Deny(u16),
    /// `auth_request` must ask an upstream first.
    Ask(Box<AuthAsk<'s>>),
}

/// An `auth_request` subrequest to proxy: its location and request, and the main request's
/// captures to put back when it answered.
pub(super) struct AuthAsk<'s> {
    pub(super) loc: &'s LocationConf,
    pub(super) req: shard_http::request::Request,
    pub(super) captures: SavedCaptures,
}

/// A request's regex captures, their names and text, set aside while a subrequest runs.
pub(super) type SavedCaptures = (
    Vec<Option<(usize, usize)>>,
    Vec<Option<String>>,
    Option<String>,
);

/// The index of `loc` in `server.locations` (`None`: the server's own settings).
pub(super) fn loc_index(server: &shard_config::ServerConf, loc: &LocationConf) -> Option<usize> {
    server.locations.iter().position(|l| std::ptr::eq(l, loc))
}

/// The `limit_except` block that applies to `req` in `loc`: one whose methods do not include
/// the request's.
fn limit_except<'l>(
    loc: &'l LocationConf,
    req: &shard_http::request::Request,
) -> Option<&'l shard_config::LimitExcept> {
    let le = loc.limit_except.as_deref()?;
    let m = req.method.as_str();
    (!le.methods.iter().any(|x| x == m)).then_some(le)
}

/// `limit_rate` state of one response, as nginx's write filter counts it: after
/// `limit_rate_after` bytes, `bytes_per_sec` for each second begun since the request started.
pub(super) struct Rate {
    pub(super) bytes_per_sec: u64,
    pub(super) after: u64,
    pub(super) start_ms: u64,
    /// Bytes of this response written so far (head included).
    pub(super) sent: u64,
    /// When the writes held back may go on (0: not held).
    pub(super) resume_ms: u64,
}

impl Rate {
    /// Bytes that may leave now.
    fn allowance(&self, now_ms: u64) -> u64 {
        let seconds = now_ms.saturating_sub(self.start_ms) / 1000 + 1;
        let budget = self
            .bytes_per_sec
            .saturating_mul(seconds)
            .saturating_add(self.after);
        budget.saturating_sub(self.sent)
    }

    /// When the next second's share is due.
    fn next_share_ms(&self, now_ms: u64) -> u64 {
        let elapsed = now_ms.saturating_sub(self.start_ms);
        self.start_ms + (elapsed / 1000 + 1) * 1000
    }
}

/// `keepalive_timeout T HEADER`: `Keep-Alive: timeout=HEADER` after the `Connection:
/// keep-alive` of the head written at `from` in `out` (nothing when the answer closes, or
/// when that part of `out` already left: `sent` bytes of it did).
pub(super) fn keep_alive_header(out: &mut Vec<u8>, sent: usize, from: usize, secs: u64) {
    const LINE: &[u8] = b"Connection: keep-alive\r\n";
    let region = &out[from.min(out.len())..];
    let end = memchr::memmem::find(region, b"\r\n\r\n").map_or(region.len(), |i| i + 2);
    if let Some(i) = memchr::memmem::find(&region[..end], LINE) {
        let at = from + i + LINE.len();
        if at < sent {
            return;
        }
        let line = format!("Keep-Alive: timeout={secs}\r\n");
        out.splice(at..at, line.into_bytes());
    }
}

impl Worker<'_> {
    /// The userid module for the request on `key` in `loc`: the client's cookie read
    /// (`$uid_got`), a new identifier made when it has none or `$uid_reset` says so
    /// (`$uid_set`, and the `Set-Cookie` the response carries), as nginx's filter.
    fn userid_step(
        &mut self,
        key: usize,
        loc: &LocationConf,
        req: &shard_http::request::Request,
        head: &[u8],
    ) {
        use shard_config::UseridMode;
        self.conns[key].rq().uid_header = None;
        let Some(u) = loc.userid.clone() else {
            return;
        };
        // The client's cookie of that name, decoded (at least 22 characters of base64).
        let mut storage = shard_http::vars::header_storage();
        let hs = shard_http::vars::request_headers(head, &mut storage);
        let cookie = hs
            .iter()
            .filter(|h| h.name.eq_ignore_ascii_case("cookie"))
            .filter_map(|h| std::str::from_utf8(h.value).ok())
            .flat_map(|v| v.split(';'))
            .filter_map(|kv| kv.trim().split_once('='))
            .find(|(k, _)| *k == u.name)
            .map(|(_, v)| v.to_string());
        let got = cookie.as_deref().and_then(|v| {
            if v.len() < 22 {
                crate::log!(
                    Info,
                    "client sent too short userid cookie \"{}={v}\"{}",
                    u.name,
                    self.log_context(key, Some(req))
                );
                return None;
            }
            let padded = format!("{}==", v.get(..22)?);
            let bytes = shard_http::base64_decode(&padded)?;
            <[u8; 16]>::try_from(bytes.as_slice()).ok()
        });
        let text = |uid: &[u8; 16]| {
            let mut t = format!("{}=", u.name);
            for w in uid.chunks_exact(4) {
                let v = u32::from_ne_bytes([w[0], w[1], w[2], w[3]]);
                t.push_str(&format!("{v:08X}"));
            }
            t
        };
        let set_var = |w: &mut Self, name: &str, value: String| {
            let vars = &mut w.conns[key].rq().user_vars;
            match vars.iter_mut().find(|(n, _)| n == name) {
                Some(slot) => slot.1 = value.into_bytes(),
                None => vars.push((name.to_string(), value.into_bytes())),
            }
        };
        if let Some(g) = &got {
            set_var(self, "uid_got", text(g));
        }
        if u.mode == UseridMode::Log {
            return;
        }
        let reset_var = [shard_config::Part::Var(shard_config::Var::User(
            "uid_reset".to_string(),
        ))];
        let reset = self.render(key, req, head, loc, &reset_var);
        let renew = got.is_none() || !(reset.is_empty() || reset == "0");
        if !renew {
            return;
        }
        if let (Some(g), "log") = (&got, reset.as_str()) {
            crate::log!(
                Info,
                "userid cookie \"{}\" was reset{}",
                text(g),
                self.log_context(key, Some(req))
            );
        }
        // nginx's layout: service, time, start value, sequence; v2 in network order.
        let v1 = u.mode == UseridMode::V1;
        let word = |n: u32| if v1 { n.to_ne_bytes() } else { n.to_be_bytes() };
        let service: [u8; 4] = match u.service {
            Some(n) => word(n),
            None if v1 => [0; 4],
            None => {
                let fd = self.conns[self.h2_parent(key).unwrap_or(key)].raw_fd();
                // A Unix-domain socket has no address: 0, as nginx.
                match shard_event::sock::local_addr(fd) {
                    Ok(std::net::SocketAddr::V4(a)) => a.ip().octets(),
                    Ok(std::net::SocketAddr::V6(a)) => {
                        let o = a.ip().octets();
                        [o[12], o[13], o[14], o[15]]
                    }
                    Err(_) => [0; 4],
                }
            }
        };
        let now = self.cx.now_secs as u32;
        let start = (now & 0xff) << 24 | (std::process::id() & 0xffff) << 8;
        let seq = if v1 {
            let s = self.uid_seq.0;
            self.uid_seq.0 = s.wrapping_add(0x100);
            s
        } else {
            let s = self.uid_seq.1;
            self.uid_seq.1 = s.wrapping_add(0x100).max(0x0303_0302);
            s
        };
        let mut uid = [0u8; 16];
        uid[..4].copy_from_slice(&service);
        uid[4..8].copy_from_slice(&word(now));
        uid[8..12].copy_from_slice(&word(start));
        uid[12..].copy_from_slice(&word(seq));
        set_var(self, "uid_set", text(&uid));
        let mut value = shard_http::base64_encode(&uid).into_bytes();
        if let Some(m) = u.mark {
            if value.len() > 22 {
                value[22] = m;
            }
        }
        let mut line = format!("Set-Cookie: {}=", u.name).into_bytes();
        line.extend_from_slice(&value);
        match u.expires {
            Some(None) => line.extend_from_slice(b"; expires=Thu, 31-Dec-37 23:55:55 GMT"),
            Some(Some(secs)) => {
                line.extend_from_slice(b"; expires=");
                line.extend_from_slice(shard_http::cookie_time(self.cx.now_secs + secs).as_bytes());
            }
            None => {}
        }
        if let Some(d) = &u.domain {
            line.extend_from_slice(format!("; domain={d}").as_bytes());
        }
        line.extend_from_slice(format!("; path={}", u.path).as_bytes());
        if u.secure {
            line.extend_from_slice(b"; secure");
        }
        if u.httponly {
            line.extend_from_slice(b"; httponly");
        }
        if let Some(s) = &u.samesite {
            line.extend_from_slice(format!("; samesite={s}").as_bytes());
        }
        line.extend_from_slice(b"\r\n");
        if let Some(p) = &u.p3p {
            line.extend_from_slice(format!("P3P: {p}\r\n").as_bytes());
        }
        self.conns[key].rq().uid_header = Some(line.into_boxed_slice());
    }
}

/// nginx's `auto_redirect` (its find-config phase): `/dir` where `location /dir/` passes to
/// an upstream is a 301 to `/dir/`, arguments kept. The location and the redirect.
fn auto_redirect(
    server: &shard_config::ServerConf,
    req: &shard_http::request::Request,
) -> Option<(usize, Rewritten)> {
    let i = server.index.auto_redirect(&req.path)?;
    let mut target = String::with_capacity(req.path.len() + 1);
    shard_http::static_file::escape_uri(&req.path, &mut target);
    target.push('/');
    if let Some(q) = &req.query {
        target.push('?');
        target.push_str(q);
    }
    Some((i, Rewritten::Return(301, Some(target))))
}

/// The default server's `error_page` for a request refused while its head was read: its
/// target when that is a plain URI (variables need a request to render them; a URL or a
/// named location is left to shard's own page), and how its status is sent.
fn head_error_page(
    cfg: &shard_config::Config,
    server: usize,
    status: u16,
) -> Option<(String, ErrorPageStatus)> {
    let srv = cfg.http.as_ref()?.servers.get(server)?;
    let ep = srv
        .base
        .error_pages
        .iter()
        .find(|e| e.codes.contains(&status))?;
    let mut target = String::new();
    for p in &ep.target {
        match p {
            shard_config::Part::Lit(s) => target.push_str(s),
            shard_config::Part::Var(_) => return None,
        }
    }
    (target.starts_with('/') && !target.bytes().any(|b| b <= b' ')).then_some((target, ep.status))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(text: &str) -> shard_config::Config {
        shard_config::parse_str(
            text,
            "t.conf",
            std::path::Path::new("/nonexistent"),
            std::path::Path::new("/pfx"),
            None,
        )
        .unwrap()
    }

    /// What an idle keep-alive connection costs the worker is `Conn` (its request went back
    /// to the spares): `shard-bench speed` measured 206 bytes per idle connection with 184
    /// here, against nginx's 521. A field added to `Conn` rather than `Req` shows here first.
    #[test]
    fn an_idle_connection_holds_no_request_state() {
        assert!(
            std::mem::size_of::<Conn>() <= 192,
            "Conn grew to {} bytes",
            std::mem::size_of::<Conn>()
        );
    }

    /// A spare request is reset to a new one: nothing of the request before it is left,
    /// its timeouts are the default server's, and its vectors keep their room.
    #[test]
    fn a_reused_request_starts_clean_with_the_servers_timeouts() {
        let cfg = server(
            "events {}\nhttp { server { listen 127.0.0.1:1; send_timeout 7s; \
             client_body_timeout 8s; keepalive_timeout 9s; lingering_time 11s; } }\n",
        );
        let srv = &cfg.http.as_ref().unwrap().servers[0];
        let mut r = Req::fallback();
        r.server = 3;
        r.request_seq = 42;
        r.user_vars.push(("a".into(), b"b".to_vec()));
        r.captures.extend([Some((0, 1)), None]);
        r.capture_text = Some("x".into());
        r.if_headers = Some(Vec::new());
        r.delayed_until = 5;
        r.limit_passed = true;
        r.limit_req_status = "PASSED";
        r.in_error_page = true;
        r.status_override = Some(404);
        r.www_authenticate = Some("realm".into());
        r.accel_headers = Some(Box::from(&b"Set-Cookie: a=b\r\n"[..]));
        r.body = BodyLeft::Length(3);
        r.body_bytes = 9;
        r.linger_until_ms = 77;
        let room = r.user_vars.capacity();
        r.reset(&srv.base);
        assert_eq!((r.server, r.request_seq, r.delayed_until), (0, 0, 0));
        assert!(r.user_vars.is_empty() && r.user_vars.capacity() == room);
        assert!(r.captures.is_empty() && r.capture_text.is_none());
        assert!(r.if_headers.is_none() && r.www_authenticate.is_none());
        assert!(r.accel_headers.is_none() && r.status_override.is_none());
        assert!(!r.limit_passed && !r.in_error_page && r.limit_req_status.is_empty());
        assert!(matches!(r.body, BodyLeft::None) && r.body_bytes == 0);
        assert_eq!(r.linger_until_ms, 0);
        assert_eq!(
            (r.send_timeout_ms, r.body_timeout_ms, r.keepalive_timeout_ms),
            (7_000, 8_000, 9_000)
        );
        assert_eq!(r.linger.time_ms, 11_000);
    }

    /// `Conn::rq` between requests does not panic a release worker: it gets nginx's
    /// default timeouts (debug builds stop there, since it means a step lost track).
    #[cfg(not(debug_assertions))]
    #[test]
    fn a_request_outside_a_request_has_nginx_defaults() {
        let mut req = None;
        let r = req_of(&mut req);
        assert_eq!(
            (r.send_timeout_ms, r.keepalive_timeout_ms),
            (60_000, 75_000)
        );
    }

    /// The connection's steps (`Conn::read`, `Conn::flush`) on a socketpair, without a
    /// worker: a connection with a request (defaults), its socket non-blocking, and the peer
    /// on the other end.
    mod steps {
        use super::*;
        use crate::worker::ctx::Ctx;
        use std::io::Read as _;
        use std::os::unix::net::UnixStream;

        struct Pair {
            conn: Conn,
            peer: UnixStream,
            cfg: &'static shard_config::Config,
            slot: &'static crate::shm::WorkerSlot,
            h2: slab::Slab<crate::worker::h2::Session>,
            h3: slab::Slab<crate::worker::h3::H3Conn>,
            subs: slab::Slab<crate::worker::ssi::SubOut>,
        }

        fn pair() -> Pair {
            let (ours, peer) = UnixStream::pair().unwrap();
            ours.set_nonblocking(true).unwrap();
            let mut conn = Conn::new(OwnedFd::from(ours), None, 0, 1, 1, 0);
            conn.req = Some(Box::new(Req::fallback()));
            Pair {
                conn,
                peer,
                cfg: Box::leak(Box::new(server("events {}"))),
                slot: Box::leak(Box::default()),
                h2: slab::Slab::new(),
                h3: slab::Slab::new(),
                subs: slab::Slab::new(),
            }
        }

        impl Pair {
            fn cx(&self, now_ms: u64) -> Ctx<'static> {
                Ctx::new(self.cfg, self.slot, now_ms)
            }

            fn flush(&mut self, now_ms: u64) -> Flush {
                let cx = self.cx(now_ms);
                self.conn
                    .flush(0, &cx, &mut self.h2, &mut self.h3, &mut self.subs)
            }

            /// What the peer can read now.
            fn drain(&mut self) -> Vec<u8> {
                self.peer.set_nonblocking(true).unwrap();
                let mut all = Vec::new();
                let mut b = vec![0u8; 1 << 16];
                while let Ok(n) = self.peer.read(&mut b) {
                    if n == 0 {
                        break;
                    }
                    all.extend_from_slice(&b[..n]);
                }
                all
            }
        }

        #[test]
        fn a_request_starts_from_a_spare_with_the_servers_header_timeout() {
            let cfg = server(
                "events {} http { server { listen 127.0.0.1:1; client_header_timeout 7s; } }",
            );
            let srv = &cfg.http.as_ref().unwrap().servers[0];
            let slot = crate::shm::WorkerSlot::default();
            let mut cx = Ctx::new(&cfg, &slot, 1000);
            let mut p = pair();
            p.conn.req = None;
            p.conn.phase = Phase::Reading;
            // At accept: counted as reading, the header timer from now.
            assert!(p.conn.start_reading(&mut cx, Some(srv), true).is_none());
            assert_eq!(slot.reading.load(std::sync::atomic::Ordering::Relaxed), 1);
            assert_eq!(p.conn.deadline_ms, 1000 + 7000);
            assert!(p.conn.req.is_some());
            // Between requests it waits without one; the next takes the spare given back.
            let r = p.conn.req.take().unwrap();
            let spare = &*r as *const Req;
            cx.req_spares.push(r);
            p.conn.set_phase(&slot, Phase::Waiting);
            assert_eq!(slot.reading.load(std::sync::atomic::Ordering::Relaxed), 0);
            assert_eq!(slot.waiting.load(std::sync::atomic::Ordering::Relaxed), 1);
            cx.now_ms = 5000;
            assert!(p.conn.start_reading(&mut cx, Some(srv), false).is_none());
            assert_eq!(p.conn.phase, Phase::Reading);
            assert_eq!(slot.waiting.load(std::sync::atomic::Ordering::Relaxed), 0);
            assert_eq!(slot.reading.load(std::sync::atomic::Ordering::Relaxed), 1);
            assert_eq!(p.conn.deadline_ms, 5000 + 7000);
            assert!(
                std::ptr::eq(&**p.conn.req.as_ref().unwrap(), spare),
                "the spare reused"
            );
            assert!(cx.req_spares.is_empty());
        }

        #[test]
        fn a_read_takes_what_arrived_then_says_drained_then_closed() {
            use std::io::Write;
            let mut p = pair();
            let mut cx = p.cx(0);
            p.peer.write_all(b"GET / HTTP/1.1\r\n").unwrap();
            assert_eq!(p.conn.read(&mut cx, 1 << 20), Read::Got);
            assert_eq!(p.conn.inbuf, b"GET / HTTP/1.1\r\n");
            assert!(
                !p.conn.readable,
                "a short read means drained: no read spent on EAGAIN"
            );
            // Told readable again with nothing there: drained, the loop registers it.
            p.conn.readable = true;
            assert_eq!(p.conn.read(&mut cx, 1 << 20), Read::Drained);
            p.peer.write_all(b"Host: a\r\n").unwrap();
            p.conn.readable = true;
            assert_eq!(p.conn.read(&mut cx, 1 << 20), Read::Got);
            assert_eq!(p.conn.inbuf, b"GET / HTTP/1.1\r\nHost: a\r\n");
            p.peer.shutdown(std::net::Shutdown::Write).unwrap();
            p.conn.readable = true;
            assert_eq!(p.conn.read(&mut cx, 1 << 20), Read::Closed);
            assert!(p.conn.eof);
        }

        #[test]
        fn a_head_at_its_allowance_is_not_read_further() {
            use std::io::Write;
            let mut p = pair();
            let mut cx = p.cx(0);
            // More than the allowance (the buffer's first size) waits in the socket.
            p.peer
                .write_all(&vec![b'a'; READ_BUFFER_BYTES * 3])
                .unwrap();
            assert_eq!(p.conn.read(&mut cx, READ_BUFFER_BYTES), Read::Got);
            assert_eq!(p.conn.inbuf.len(), p.conn.inbuf.capacity());
            p.conn.readable = true;
            assert_eq!(p.conn.read(&mut cx, p.conn.inbuf.len()), Read::Full);
            // With a larger allowance the buffer grows and reading goes on.
            assert_eq!(p.conn.read(&mut cx, 1 << 20), Read::Got);
        }

        #[test]
        fn the_output_goes_out_and_the_buffer_is_emptied() {
            let mut p = pair();
            p.conn.out = b"HTTP/1.1 200 OK\r\n\r\n".to_vec();
            assert!(matches!(p.flush(1000), Flush::Done));
            assert!(p.conn.out.is_empty() && p.conn.out_pos == 0);
            assert_eq!(p.drain(), b"HTTP/1.1 200 OK\r\n\r\n");
            // The send timeout runs from the write.
            assert_eq!(p.conn.deadline_ms, 1000 + p.conn.rd().send_timeout_ms);
        }

        #[test]
        fn a_full_socket_blocks_and_the_rest_goes_when_it_drains() {
            let mut p = pair();
            let body: Vec<u8> = (0..4u32 << 20).map(|i| (i % 251) as u8).collect();
            p.conn.out = body.clone();
            assert!(matches!(p.flush(0), Flush::Blocked));
            assert!(!p.conn.writable, "a full socket waits for EPOLLOUT");
            assert!(p.conn.out_pos > 0 && p.conn.out_pos < body.len());
            let mut got = Vec::new();
            loop {
                got.extend(p.drain());
                // The kernel said writable again (what the loop does on EPOLLOUT).
                p.conn.writable = true;
                match p.flush(0) {
                    Flush::Done => break,
                    Flush::Blocked => {}
                    _ => panic!("neither done nor blocked"),
                }
            }
            got.extend(p.drain());
            assert!(
                got == body,
                "{} bytes of {} arrived intact",
                got.len(),
                body.len()
            );
        }

        #[test]
        fn limit_rate_holds_the_rest_until_the_next_seconds_share() {
            let mut p = pair();
            p.conn.rq().rate = Some(Box::new(Rate {
                bytes_per_sec: 1000,
                after: 0,
                start_ms: 0,
                sent: 0,
                resume_ms: 0,
            }));
            p.conn.out = vec![b'x'; 2500];
            assert!(matches!(p.flush(10), Flush::Blocked));
            assert_eq!(p.drain().len(), 1000, "the first second's share");
            let resume = p.conn.rd().rate.as_ref().unwrap().resume_ms;
            assert_eq!(resume, 1000);
            assert_eq!(p.conn.deadline_ms, resume, "woken for the next share");
            assert!(matches!(p.flush(1000), Flush::Blocked));
            assert_eq!(p.drain().len(), 1000);
            assert!(matches!(p.flush(2000), Flush::Done));
            assert_eq!(p.drain().len(), 500);
        }

        #[test]
        fn a_file_body_follows_the_head_read_or_sent() {
            for sendfile in [false, true] {
                let mut p = pair();
                let dir = std::env::temp_dir()
                    .join(format!("shard-flush-{}-{sendfile}", std::process::id()));
                std::fs::create_dir_all(&dir).unwrap();
                let path = dir.join("f");
                let data: Vec<u8> = (0..300_000u32).map(|i| (i % 253) as u8).collect();
                std::fs::write(&path, &data).unwrap();
                let fd = OwnedFd::from(std::fs::File::open(&path).unwrap());
                p.conn.out = b"HEAD|".to_vec();
                p.conn.rq().file = Some(FileBody {
                    fd: crate::worker::files::OpenFile::new(fd),
                    offset: 100,
                    remaining: 200_000,
                    sendfile,
                    mapped: false,
                    size_checked_turn: None,
                    recode: None,
                });
                let mut got = Vec::new();
                let mut turns = 0;
                loop {
                    turns += 1;
                    assert!(turns < 1000, "no end");
                    match p.flush(0) {
                        Flush::Done => break,
                        Flush::Blocked => p.conn.writable = true,
                        // Its share of the file moved: the loop gives it another turn.
                        Flush::Yield => {}
                        Flush::Failed => panic!("failed (sendfile {sendfile})"),
                    }
                    got.extend(p.drain());
                }
                got.extend(p.drain());
                assert!(p.conn.rd().file.is_none(), "the body is done");
                assert_eq!(&got[..5], b"HEAD|");
                assert!(got[5..] == data[100..200_100], "sendfile {sendfile}");
                let _ = std::fs::remove_dir_all(&dir);
            }
        }

        #[test]
        fn a_file_that_shrank_fails_the_response() {
            let mut p = pair();
            let path =
                std::env::temp_dir().join(format!("shard-flush-short-{}", std::process::id()));
            std::fs::write(&path, vec![b'y'; 1000]).unwrap();
            let fd = OwnedFd::from(std::fs::File::open(&path).unwrap());
            let _ = std::fs::remove_file(&path);
            p.conn.rq().file = Some(FileBody {
                fd: crate::worker::files::OpenFile::new(fd),
                offset: 0,
                remaining: 5000,
                sendfile: false,
                mapped: false,
                size_checked_turn: None,
                recode: None,
            });
            let mut outcome = Flush::Yield;
            for _ in 0..100 {
                outcome = p.flush(0);
                p.drain();
                p.conn.writable = true;
                if !matches!(outcome, Flush::Yield | Flush::Blocked) {
                    break;
                }
            }
            assert!(
                matches!(outcome, Flush::Failed),
                "the promised length cannot be met"
            );
        }
    }
}
