//! The HTTP reverse proxy's I/O: one client request relayed to an upstream peer and its
//! response streamed back.
//!
//! This module owns, per proxied request ([`Proxy`], hung on the client's `Conn`): reading the
//! request body before the upstream is contacted (`proxy_request_buffering on`; where it is
//! kept is `body.rs`'s) or streaming it through one bounded buffer as it arrives (`off`),
//! choosing a peer (the stream module's smooth weighted round robin
//! with `max_fails`/`fail_timeout`, state kept per worker), taking a pooled connection or
//! connecting without blocking, sending the request, reading the response head, and moving the
//! body to the client through a bounded buffer (`proxy_buffer_size`, plus `proxy_buffers` when
//! `proxy_buffering on`): the upstream is not read while that much waits for the client.
//! Failures before the response head reached the client become another peer
//! (`proxy_next_upstream`), a 502 or a 504; after it, the client connection is closed so it
//! sees a truncated response rather than a wrong one.
//!
//! It also owns the upstream connections ([`UpConn`]) and the per-upstream keep-alive pools
//! (`keepalive N`): idle connections stay in epoll, and any event on one (the peer closed it or
//! sent bytes nobody asked for) closes it. What to send and how to read a head are decided by
//! `shard_http::proxy`; this module moves bytes.
//!
//! Upstream sockets sit in the worker's epoll, registered once, edge-triggered, with a
//! `Token::Upstream` carrying the connection's key and generation.
//!
//! `proxy_pass https://`: after the connect, the TLS handshake (within
//! `proxy_connect_timeout`, as nginx), then the same steps with the connection's bytes going
//! through rustls (`tls.rs`'s client side); a request body file is read and encrypted, not
//! sent with `sendfile`. Pooled connections keep their TLS session.

use std::os::fd::{AsRawFd, OwnedFd};
use std::rc::Rc;

use shard_config::{Balance, HttpConf, LocationConf, PeerConf, ProxyPass, UpstreamConf};
use shard_event::sock::{Connect, ConnectError};
use shard_http::body::ChunkedDecoder;
use shard_http::proxy::{Failure, Framing, ResponseParse};
use shard_http::request::{Body, Method, Request};

use super::body::Spool;
use super::step::{Flush, Io, Step};
use super::token::{self, Token};
use super::tunnel::{Pumped, Tunnel, Waiting};
use super::{balance, Worker};

/// Smallest read from an upstream.
/// Upstream TLS configurations a worker keeps for certificates named by variables.
const CLIENT_CERTS_MAX: usize = 64;
const READ_MIN_BYTES: usize = 4096;
/// Most bytes of a request body file handed to one `sendfile`.
const SENDFILE_CHUNK_BYTES: u64 = 1 << 20;
/// Bytes read per `read` of a body that already goes to a file.
const SPOOL_READ_BYTES: usize = 64 * 1024;
/// A request body file's bytes read and encrypted at once for an `https://` upstream.
const TLS_BODY_CHUNK_BYTES: usize = 16 * 1024;
/// Body bytes per FastCGI `STDIN` record read from a body file (a multiple of 8: no padding).
const FCGI_RECORD_BYTES: usize = 32 * 1024;
/// Reads that look for FastCGI's `END_REQUEST` after a body with a known length.
const FCGI_TAIL_READS: usize = 4;
/// FastCGI's `STDIN` record type.
const STDIN_RECORD: u8 = 5;
/// The most bytes of a gRPC response's trailers passed on (as HTTP/2 sends them).
const GRPC_TRAILERS_MAX: usize = 16 * 1024;
/// `sendfile` calls of a request body per turn of its connection.
const SENDFILE_CHUNKS_MAX: usize = 16;

/// One connection to an upstream peer: serving a request, or idle in its upstream's pool.
pub(super) struct UpConn {
    /// Closed when the connection is dropped (`close_upconn`).
    pub(super) fd: OwnedFd,
    /// Unique in the worker (from the same counter as client connections): the token's
    /// generation.
    id: u64,
    upstream: usize,
    peer: usize,
    pub(super) readable: bool,
    pub(super) writable: bool,
    /// The peer's end of stream (or an error) was reported: a read must follow even after a
    /// short read, since no further edge will come.
    hup: bool,
    /// The client connection `(key, id)` this connection serves; `None` while pooled.
    owner: Option<(usize, u64)>,
    /// Requests sent on this connection.
    requests: u64,
    /// When it went idle in the pool.
    idle_since_ms: u64,
    /// When it was opened (the upstream's `keepalive_time`).
    opened_ms: u64,
    /// TLS to the upstream (`proxy_pass https://`).
    pub(super) tls: Option<Box<super::tls::UpTls>>,
    /// A tunnel's close_notify to the upstream is queued; its FIN follows it.
    pub(super) fin_pending: bool,
    /// Which `proxy_ssl_*` client configuration it was opened with (its address; 0 for
    /// plain TCP): a pooled connection serves only passes with the same one, so a location
    /// that verifies never reuses a connection that was not verified.
    tls_config: usize,
    /// `grpc_pass`: the connection speaks HTTP/2, its state kept while pooled.
    grpc: Option<Box<shard_http::grpc::Conn>>,
}

impl UpConn {
    /// TLS records (or the FIN behind them) wait to be written to the upstream.
    pub(super) fn tls_pending(&self) -> bool {
        self.fin_pending || self.tls.as_ref().is_some_and(|t| t.wants_write())
    }

    /// One read into `buf`, at most `room` bytes (through TLS when the connection has it).
    /// `Ok(None)`: nothing to read until the next event (a short read drained the socket
    /// before, unless the peer ended the stream); `Ok(Some(0))`: the peer closed.
    /// A step of the upstream connection: it needs no worker.
    pub(super) fn read_into(
        &mut self,
        buf: &mut Vec<u8>,
        room: usize,
    ) -> std::io::Result<Option<usize>> {
        let uc = self;
        if !uc.readable && !uc.hup {
            return Ok(None);
        }
        let want = room.max(1);
        if let Some(t) = uc.tls.as_mut() {
            let mut readable = uc.readable || uc.hup;
            let res = super::tls::read_up(uc.fd.as_raw_fd(), t, buf, want, &mut readable);
            uc.readable = readable;
            return res;
        }
        if buf.capacity() - buf.len() < want {
            buf.reserve(want);
        }
        let spare = buf.capacity() - buf.len();
        loop {
            match shard_event::sock::read_into(uc.fd.as_raw_fd(), buf) {
                Ok(n) => {
                    debug_assert!(n <= spare);
                    // A short read drained the socket, unless the peer also ended the stream.
                    uc.readable = n >= spare || uc.hup;
                    return Ok(Some(n));
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    uc.readable = false;
                    return Ok(None);
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// Writes `buf[*pos..]` while the socket takes it. `Ok(true)`: all of it is written;
    /// `Ok(false)`: the socket is full (it is then marked not writable until its next event).
    fn write_from(&mut self, buf: &[u8], pos: &mut usize) -> std::io::Result<bool> {
        if let Some(t) = self.tls.as_mut() {
            let fd = self.fd.as_raw_fd();
            return super::tls::write_up(fd, t, buf, pos, &mut self.writable);
        }
        while *pos < buf.len() {
            if !self.writable {
                return Ok(false);
            }
            match shard_event::sock::write(self.fd.as_raw_fd(), &buf[*pos..]) {
                Ok(n) => {
                    debug_assert!(n <= buf.len() - *pos);
                    *pos += n;
                    if *pos < buf.len() {
                        self.writable = false;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    self.writable = false;
                    return Ok(false);
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }
}

#[path = "cache.rs"]
mod cache;
#[path = "grpc.rs"]
mod grpc;
#[path = "slice.rs"]
mod slice;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum State {
    /// Reading the client's request body into memory.
    ReadBody,
    /// Choosing a peer and getting a connection to it.
    Connect,
    /// `proxy_pass` with variables: waiting for the resolver's answer about its host.
    Resolving,
    /// Waiting for a non-blocking connect.
    Connecting,
    /// The TLS handshake with an `https://` upstream.
    Handshaking,
    /// Writing the request (with a buffered body).
    Sending,
    /// Streaming the body as it arrives (`proxy_request_buffering off`), after the head.
    StreamBody,
    /// Reading the response head.
    ReadingHead,
    /// Streaming the response body.
    ReadingBody,
    /// The upstream switched protocols (`101`): bytes both ways (`tunnel.rs`).
    Tunnel,
}

/// How the upstream response body is being read.
enum UpBody {
    None,
    Length(u64),
    Chunked(ChunkedDecoder),
    Close,
}

pub(super) struct Proxy {
    server: usize,
    /// Index into the server's `locations`; `None` is the server's base settings.
    location: Option<usize>,
    req: Request,
    /// The request head as received.
    head: Vec<u8>,
    /// The request body, de-chunked: in memory, or in a temporary file (`body.rs`).
    body: Spool,
    /// How much of a body file went to the current upstream attempt.
    file_pos: u64,
    /// The body goes upstream as it arrives (`proxy_request_buffering off`): `body.mem` is
    /// then the bounded buffer between client and upstream, `stream_pos` how much of it was
    /// written.
    streaming: bool,
    /// A streamed body is re-chunked for the upstream.
    stream_chunked: bool,
    stream_pos: usize,
    /// Streaming: the body bytes read before the head went out, copied after it into
    /// `upreq` so that head and preread leave in one write (one TLS record), as nginx sends
    /// its buffers; `stream_pos` passes them once the head is written.
    folded_body: usize,
    /// FastCGI: a streamed body that was whole when the request was built went with the
    /// params, its end record too.
    stream_ended_in_head: bool,
    /// A streamed body's bytes while they fit in `client_body_buffer_size` (`$request_body`
    /// once the body is whole, as nginx's unbuffered body in its one buffer); `None` past it.
    stream_copy: Option<Vec<u8>>,
    /// The upstream answered before the whole body was sent: its connection is not reused.
    body_cut: bool,
    /// `proxy_store`: the answer being saved (renamed in place once whole).
    store: Option<Box<StoreFile>>,
    /// The next attempt goes to this peer on a fresh connection (its pooled one was closed).
    retry_peer: Option<usize>,
    /// An upstream's `X-Accel-Redirect` target, and the header lines it passes on.
    accel: Option<Box<(String, Vec<u8>)>>,
    /// `proxy_limit_rate`: when the response body began, its bytes read from the upstream
    /// so far, and when a read held back by the rate may go on (0: not held).
    up_rate: UpRate,
    state: State,
    /// The last attempt's failure: when no peer is left, a timeout answers 504, else 502.
    last_failure: Option<Failure>,
    /// The request to write upstream and how much of it is written.
    upreq: Vec<u8>,
    upreq_pos: usize,
    up: Option<usize>,
    /// Whether `up` came from the pool (a failure on it before any response byte is retried
    /// on a fresh connection, as the peer may have closed it while idle).
    reused: bool,
    tried: Vec<bool>,
    tries: u32,
    /// Bytes read from the upstream and not yet passed on.
    rbuf: Vec<u8>,
    scratch: Vec<u8>,
    upbody: UpBody,
    upstream_reusable: bool,
    /// The client is sent chunked encoding.
    client_chunked: bool,
    /// `add_trailer`: the last chunk carries the location's trailers (`trailers.rs`).
    trailers: bool,
    /// `charset` recoding of the body (`source_charset`, or the upstream's own charset with
    /// `override_charset on`, by a `charset_map`).
    recode: Option<std::sync::Arc<[u8; 256]>>,
    /// `gunzip on`: the gzip-encoded body decompressed for a client that does not take gzip.
    gunzip: Option<Box<flate2::write::MultiGzDecoder<Vec<u8>>>>,
    /// `sub_filter` on the body.
    sub: Option<Box<shard_http::subfilter::SubFilter>>,
    /// `gzip`: the body compressed for the client.
    gzip: Option<Box<flate2::write::GzEncoder<Vec<u8>>>>,
    /// An `auth_request` subrequest: the main request it holds, resumed with its status.
    auth: Option<Box<AuthPending>>,
    keep_alive: bool,
    /// The response head went to the client: no retry and no error page any more.
    head_sent: bool,
    status: u16,
    body_sent: u64,
    /// Each peer tried, for `$upstream_addr`, `$upstream_status` and the times; and when the
    /// current attempt began (monotonic ms).
    attempts: Vec<shard_http::vars::UpstreamTry>,
    attempt_started_ms: u64,
    /// The client asked to switch protocols and the upstream request forwards it: a `101`
    /// makes the connection a tunnel.
    upgrade: bool,
    tunnel: Option<Box<Tunnel>>,
    /// `fastcgi_pass`: the upstream speaks FastCGI (`shard_http::fastcgi`).
    fcgi: Option<Box<Fcgi>>,
    /// `proxy_pass` with variables: what this request's URL rendered to, once its host is
    /// known (a named upstream, or one this worker made for the addresses).
    dyn_pass: Option<Rc<ProxyPass>>,
    /// The host being resolved, for the timeout's log line.
    dyn_host: Option<String>,
    /// `proxy_next_upstream_timeout`: no attempt starts after this (monotonic ms).
    retry_until_ms: u64,
    /// `proxy_set_body` or `proxy_pass_request_body off`: the client's body is not sent.
    body_skipped: bool,
    /// `proxy_cache`: this request's part in a cache (`cache.rs`), once it looked.
    cache: Option<Box<cache::CacheReq>>,
    cache_looked: bool,
    /// A HEAD asked upstream as GET (`proxy_cache_convert_head`): the body is read and
    /// stored, not sent.
    upstream_get: bool,
    /// Where the body starts in `upreq` when it went there whole (0: it did not): the
    /// access log's `$request_body` once the response is done.
    upreq_body_at: usize,
    /// A WebDAV `PUT` (`worker/dav.rs`): the body is read, then put in place; no upstream.
    pub(super) dav: bool,
    /// `proxy_cache_background_update`: the client had its (stale) answer; this request now
    /// updates the entry, and nothing of it goes to the client.
    background: bool,
    /// One range of the body goes to the client: `[start, end)` of it, and how much of the
    /// body went by (`cache.rs`'s range on a live answer).
    window: Option<(u64, u64, u64)>,
    /// `grpc_pass`: the request goes as an HTTP/2 stream (the connection's
    /// `shard_http::grpc::Conn`), and whether this attempt's stream was begun.
    grpc: bool,
    grpc_begun: bool,
    /// `slice`: the slices asked for so far (`slice.rs`).
    slice: Option<Box<slice::Slice>>,
}

/// A FastCGI attempt's wire state: the records read and not yet decoded, the application's
/// stderr for the log, and a body file's `STDIN` record being written.
#[derive(Default)]
struct Fcgi {
    decoder: shard_http::fastcgi::Decoder,
    raw: Vec<u8>,
    stderr: Vec<u8>,
    /// One `STDIN` record of a body file (header, a piece of the file, padding).
    out: Vec<u8>,
    out_pos: usize,
    /// The empty `STDIN` record that ends the body was queued.
    stdin_done: bool,
    /// The whole body (or none) went with the params in `upreq`: no file to send.
    body_in_head: bool,
}

impl Fcgi {
    /// A new attempt (another connection): nothing of the last one's wire state is kept.
    fn restart(&mut self) {
        self.decoder = shard_http::fastcgi::Decoder::new();
        self.raw.clear();
        self.stderr.clear();
        self.out.clear();
        self.out_pos = 0;
        self.stdin_done = false;
    }
}

/// `proxy_limit_rate`'s accounting for one response (nginx's event pipe formula: each
/// second begun since the body started brings `RATE` more bytes).
#[derive(Default, Clone, Copy)]
struct UpRate {
    start_ms: u64,
    read: u64,
    resume_ms: u64,
}

impl UpRate {
    /// Bytes that may be read now at `rate`, and when the next share is due.
    fn allowance(&self, rate: u64, now_ms: u64) -> (u64, u64) {
        let elapsed = now_ms.saturating_sub(self.start_ms);
        let budget = rate.saturating_mul(elapsed / 1000 + 1);
        (
            budget.saturating_sub(self.read),
            self.start_ms + (elapsed / 1000 + 1) * 1000,
        )
    }
}

impl Proxy {
    fn new(
        server: usize,
        location: Option<usize>,
        req: Request,
        head: Vec<u8>,
        keep_alive: bool,
        n_peers: usize,
    ) -> Proxy {
        Proxy {
            server,
            location,
            req,
            head,
            body: Spool::default(),
            file_pos: 0,
            streaming: false,
            stream_ended_in_head: false,
            stream_chunked: false,
            stream_pos: 0,
            folded_body: 0,
            stream_copy: None,
            up_rate: UpRate::default(),
            accel: None,
            body_cut: false,
            store: None,
            retry_peer: None,
            state: State::ReadBody,
            last_failure: None,
            upreq: Vec::new(),
            upreq_pos: 0,
            up: None,
            reused: false,
            tried: vec![false; n_peers],
            tries: 0,
            attempts: Vec::new(),
            attempt_started_ms: 0,
            rbuf: Vec::new(),
            scratch: Vec::new(),
            upbody: UpBody::None,
            upstream_reusable: false,
            client_chunked: false,
            trailers: false,
            recode: None,
            gunzip: None,
            sub: None,
            gzip: None,
            auth: None,
            keep_alive,
            head_sent: false,
            status: 0,
            body_sent: 0,
            upgrade: false,
            tunnel: None,
            fcgi: None,
            dyn_pass: None,
            dyn_host: None,
            retry_until_ms: u64::MAX,
            body_skipped: false,
            cache: None,
            cache_looked: false,
            upstream_get: false,
            upreq_body_at: 0,
            dav: false,
            background: false,
            window: None,
            grpc: false,
            grpc_begun: false,
            slice: None,
        }
    }

    /// The upstream connection in use, if any.
    pub(super) fn upstream_conn(&self) -> Option<usize> {
        self.up
    }
}

/// Most upstreams a worker makes for names `proxy_pass` resolves at run time.
const DYN_UPSTREAMS_MAX: usize = 4096;

/// An http upstream: the configuration's, or one a worker made at run time. Owned, so that
/// holding it does not borrow the worker.
pub(super) enum UpRef<'a> {
    Conf(&'a UpstreamConf),
    Dyn(Rc<UpstreamConf>),
}

impl std::ops::Deref for UpRef<'_> {
    type Target = UpstreamConf;
    fn deref(&self) -> &UpstreamConf {
        match self {
            UpRef::Conf(u) => u,
            UpRef::Dyn(u) => u,
        }
    }
}

/// A request's `proxy_pass`: the location's, or the one its variables rendered to.
pub(super) enum PassRef<'a> {
    Conf(&'a ProxyPass),
    Dyn(Rc<ProxyPass>),
}

impl std::ops::Deref for PassRef<'_> {
    type Target = ProxyPass;
    fn deref(&self) -> &ProxyPass {
        match self {
            PassRef::Conf(p) => p,
            PassRef::Dyn(p) => p,
        }
    }
}

/// What one step of a proxied request decided; `drive_proxy` alone acts on it (answers,
/// finishes, truncates or closes), so no step ends the request or the connection itself.
#[derive(Debug)]
enum Flow {
    /// The state moved on: run the next step.
    Next,
    /// Wait for the kernel (the client or the upstream socket).
    Wait,
    /// Answer with this error page; nothing of a response was sent yet.
    Fail(u16),
    /// The upstream response is complete.
    Finished,
    /// The upstream failed after the response head reached the client (already logged): the
    /// client gets what arrived, then a close.
    Abort,
    /// The client connection failed: close it.
    Close,
    /// The upstream answered with `X-Accel-Redirect` (in `Proxy::accel`): the request goes
    /// on at that URI or named location.
    Redirect,
}

fn upconn_interest() -> shard_event::Interest {
    shard_event::Interest::READ
        | shard_event::Interest::WRITE
        | shard_event::Interest::RDHUP
        | shard_event::Interest::EDGE
}

impl<'a> Worker<'a> {
    /// The `http` block. A proxied request exists only when there is one (it was parsed by an
    /// HTTP listener); without one this is an empty block rather than a panic.
    pub(super) fn http(&self) -> &'a HttpConf {
        static NONE: HttpConf = HttpConf {
            servers: Vec::new(),
            charset_maps: Vec::new(),
            maps: Vec::new(),
            limit_zones: Vec::new(),
            cache_paths: Vec::new(),
            upstreams: Vec::new(),
        };
        self.cx.cfg.http.as_ref().unwrap_or(&NONE)
    }

    /// The upstream's balancing method for the request on `key`.
    fn pick_http_peer(&mut self, key: usize, p: &Proxy, upstream: usize) -> Option<usize> {
        let ups = self.ups(upstream);
        let now = self.cx.now_ms;
        // An upstream `proxy_pass` with variables made is the request's own in nginx (its
        // peers made per request): no failure of an earlier request counts.
        if p.tries == 0 && upstream >= self.http().upstreams.len() {
            self.http_peer_state[upstream] = balance::PeerState::table(&ups.peers);
        }
        // This worker's connections in use per peer: for `least_conn` and `max_conns`.
        let needs_active = matches!(
            ups.balance,
            Balance::LeastConn | Balance::Random { two: true }
        ) || ups.peers.iter().any(|p| p.max_conns > 0);
        let mut active = Vec::new();
        if needs_active {
            active = vec![0u64; ups.peers.len()];
            for (_, uc) in self.upconns.iter() {
                if uc.upstream == upstream && uc.owner.is_some() {
                    active[uc.peer] += 1;
                }
            }
        }
        let full = balance::with_full(&ups.peers, &p.tried, &active);
        let tried = full.as_deref().unwrap_or(&p.tried);
        match &ups.balance {
            Balance::RoundRobin => {
                balance::pick(&ups.peers, &mut self.http_peer_state[upstream], tried, now)
            }
            Balance::LeastConn => balance::pick_least_conn(
                &ups.peers,
                &mut self.http_peer_state[upstream],
                tried,
                &active,
                now,
            ),
            Balance::Random { two } => balance::pick_random(
                &ups.peers,
                &mut self.http_peer_state[upstream],
                tried,
                &active,
                *two,
                &mut self.rng,
                now,
            ),
            Balance::IpHash => {
                let ip = self.conns[key].rq().client.map(|c| c.ip());
                balance::pick_ip_hash(
                    &ups.peers,
                    &mut self.http_peer_state[upstream],
                    tried,
                    ip,
                    now,
                )
            }
            Balance::Hash {
                key: parts,
                consistent,
            } => {
                let loc = self.proxy_location(p);
                let value = {
                    let mut storage = shard_http::vars::header_storage();
                    let hs = shard_http::vars::request_headers(&p.head, &mut storage);
                    let ctx = self.var_ctx(key, &p.req, hs, loc);
                    let mut v = Vec::new();
                    shard_http::vars::push_parts(&mut v, parts, &ctx);
                    v
                };
                if value.is_empty() {
                    // nginx: an empty key falls back to round robin.
                    return balance::pick(
                        &ups.peers,
                        &mut self.http_peer_state[upstream],
                        tried,
                        now,
                    );
                }
                if *consistent {
                    let ring = self
                        .rings
                        .entry(upstream)
                        .or_insert_with(|| balance::ring(&ups.peers));
                    balance::pick_consistent(
                        &ups.peers,
                        &mut self.http_peer_state[upstream],
                        tried,
                        ring,
                        &value,
                        now,
                    )
                } else {
                    balance::pick_hash(
                        &ups.peers,
                        &mut self.http_peer_state[upstream],
                        tried,
                        &value,
                        now,
                    )
                }
            }
        }
    }

    pub(super) fn proxy_location(&self, p: &Proxy) -> &'a LocationConf {
        let s = &self.http().servers[p.server];
        p.location.map_or(&s.base, |i| &s.locations[i])
    }

    /// The request's pass: the location's, or what its variables rendered to.
    fn proxy_pass(&self, p: &Proxy) -> Option<PassRef<'a>> {
        if let Some(d) = &p.dyn_pass {
            return Some(PassRef::Dyn(d.clone()));
        }
        self.proxy_location(p)
            .proxy_pass
            .as_ref()
            .map(PassRef::Conf)
    }

    /// Http upstream `i`: the configuration's, or one of this worker's (`dyn_ups`).
    pub(super) fn ups(&self, i: usize) -> UpRef<'a> {
        let conf = &self.http().upstreams;
        match conf.get(i) {
            Some(u) => UpRef::Conf(u),
            None => UpRef::Dyn(self.dyn_ups[i - conf.len()].clone()),
        }
    }

    /// The upstream index for `addrs` of `name` (`host:port`), made once per set of addresses:
    /// an upstream that changed is a new entry (requests in flight keep their peers), the
    /// old one stays, up to [`DYN_UPSTREAMS_MAX`]. `None` at the cap.
    fn dyn_upstream(
        &mut self,
        name: &str,
        addrs: &[std::net::SocketAddr],
        unix: Option<&std::path::Path>,
    ) -> Option<usize> {
        let base = self.http().upstreams.len();
        if let Some(&i) = self.dyn_index.get(name) {
            let same = self.dyn_ups[i].peers.len() == addrs.len()
                && self.dyn_ups[i]
                    .peers
                    .iter()
                    .zip(addrs)
                    .all(|(p, a)| p.addr == *a);
            if same {
                return Some(base + i);
            }
        }
        if self.dyn_ups.len() >= DYN_UPSTREAMS_MAX {
            return None;
        }
        let peers: Vec<PeerConf> = addrs
            .iter()
            .map(|a| PeerConf {
                addr: *a,
                name: match unix {
                    Some(_) => name.to_string(),
                    None => a.to_string(),
                },
                weight: 1,
                max_fails: 1,
                fail_timeout_ms: 10_000,
                max_conns: 0,
                unix: unix.map(std::path::Path::to_path_buf),
                backup: false,
                down: false,
                resolve: None,
            })
            .collect();
        let u = UpstreamConf {
            name: name.to_string(),
            place: shard_config::Place {
                file: String::new(),
                line: 0,
            },
            peers,
            keepalive: 0,
            keepalive_timeout_ms: 60_000,
            keepalive_requests: 1000,
            keepalive_time_ms: 3_600_000,
            balance: Balance::RoundRobin,
            resolver: None,
        };
        self.http_peer_state
            .push(balance::PeerState::table(&u.peers));
        self.pools.push(Vec::new());
        self.dyn_ups.push(Rc::new(u));
        let i = self.dyn_ups.len() - 1;
        self.dyn_index.insert(name.to_string(), i);
        Some(base + i)
    }

    /// `server NAME resolve`: asks again for every such name whose answer expired (the
    /// answers come to the cache), and when the addresses of an upstream's names changed,
    /// makes its new peers an upstream of the worker that new requests take (`shadow`);
    /// requests in flight keep the peers they started with. A name without an answer keeps
    /// its last addresses.
    pub(super) fn refresh_resolved_upstreams(&mut self) {
        let http = self.http();
        for (i, u) in http.upstreams.iter().enumerate() {
            let Some(conf) = u.resolver.clone() else {
                continue;
            };
            let current = self.ups(self.shadow.get(&i).copied().unwrap_or(i));
            let mut peers: Vec<PeerConf> = Vec::with_capacity(current.peers.len());
            let mut changed = false;
            let mut done = Vec::new();
            for tpl in &u.peers {
                let Some(written) = tpl.resolve.as_deref() else {
                    peers.push(tpl.clone());
                    continue;
                };
                if done.contains(&written) {
                    continue;
                }
                done.push(written);
                let (host, port) = match written.rsplit_once(':') {
                    Some((h, p)) if p.parse::<u16>().is_ok() => (h, p.parse::<u16>().unwrap_or(80)),
                    _ => (written, 80),
                };
                let before: Vec<PeerConf> = current
                    .peers
                    .iter()
                    .filter(|p| p.resolve.as_deref() == Some(written))
                    .cloned()
                    .collect();
                match self.resolve_for(None, host, &conf) {
                    super::resolver::Resolved::Ready(ips) => {
                        let now: Vec<PeerConf> = ips
                            .iter()
                            .map(|ip| PeerConf {
                                addr: std::net::SocketAddr::new(*ip, port),
                                name: std::net::SocketAddr::new(*ip, port).to_string(),
                                down: tpl.down && !tpl.addr.ip().is_unspecified(),
                                ..tpl.clone()
                            })
                            .collect();
                        let same = now.len() == before.len()
                            && now
                                .iter()
                                .zip(&before)
                                .all(|(a, b)| a.addr == b.addr && a.down == b.down);
                        changed |= !same;
                        peers.extend(now);
                    }
                    _ => peers.extend(before),
                }
            }
            if !changed {
                continue;
            }
            if self.dyn_ups.len() >= DYN_UPSTREAMS_MAX {
                crate::log!(
                    Error,
                    "too many upstreams resolved at run time to follow \"{}\"",
                    u.name
                );
                continue;
            }
            let addrs: Vec<String> = peers.iter().map(|p| p.name.clone()).collect();
            crate::log!(
                Notice,
                "upstream \"{}\" now has the peers {}",
                u.name,
                addrs.join(", ")
            );
            let nu = UpstreamConf { peers, ..u.clone() };
            self.http_peer_state
                .push(balance::PeerState::table(&nu.peers));
            self.pools.push(Vec::new());
            self.dyn_ups.push(Rc::new(nu));
            let eff = self.http().upstreams.len() + self.dyn_ups.len() - 1;
            self.shadow.insert(i, eff);
        }
    }

    /// `proxy_pass` with variables: renders the URL and finds its host, as nginx: a named
    /// upstream, an address, or a name asked of `resolver`. `Ok(false)`: the request waits
    /// for the resolver. `Err(status)`: answered with it (logged here).
    fn dynamic_pass(
        &mut self,
        key: usize,
        p: &mut Proxy,
        parts: &[shard_config::Part],
    ) -> Result<bool, u16> {
        let loc = self.proxy_location(p);
        let url = {
            let mut storage = shard_http::vars::header_storage();
            let hs = shard_http::vars::request_headers(&p.head, &mut storage);
            let ctx = self.var_ctx(key, &p.req, hs, loc);
            shard_http::vars::render(parts, &ctx)
        };
        let starts = |s: &str, pre: &str| {
            s.len() >= pre.len() && s.as_bytes()[..pre.len()].eq_ignore_ascii_case(pre.as_bytes())
        };
        let (mut tls, mut rest) = if starts(&url, "http://") {
            (false, &url[7..])
        } else if starts(&url, "https://") {
            (true, &url[8..])
        } else {
            self.log_proxy_error(key, p, &format!("invalid URL prefix in \"{url}\""), None);
            return Err(500);
        };
        if p.grpc {
            // `grpc_pass $var`: the value may name its scheme, as nginx's run-time parse.
            if starts(rest, "grpcs://") {
                (tls, rest) = (true, &rest[8..]);
            } else if starts(rest, "grpc://") {
                rest = &rest[7..];
            }
        }
        if let Some(path) = rest.strip_prefix("unix:") {
            // `fastcgi_pass $socket` with `unix:/path`, or `proxy_pass http://$target` with
            // `unix:/path[:/uri]` (as nginx, the path ends at the first `:`).
            let app = p.fcgi.is_some() || self.proxy_location(p).gateway.is_some();
            let (path, uri) = match path.split_once(':').filter(|_| !app) {
                Some((path, u)) => (path, Some(u.to_string()).filter(|u| !u.is_empty())),
                None => (path, None),
            };
            let name = format!("unix:{path}");
            let any = std::net::SocketAddr::from(([0, 0, 0, 0], 0));
            let Some(i) = self.dyn_upstream(&name, &[any], Some(std::path::Path::new(path))) else {
                return Err(502);
            };
            let finish_pass = ProxyPass {
                upstream: i,
                uri,
                proxy_host: "localhost".to_string(),
                proxy_port: 80,
                tls,
                dynamic: Some(Vec::new()),
            };
            p.tried = vec![false; 1];
            p.dyn_pass = Some(Rc::new(finish_pass));
            return Ok(true);
        }
        let (hostport, uri) = match rest.find(['/', '?']) {
            Some(i) => (&rest[..i], Some(rest[i..].to_string())),
            None => (rest, None),
        };
        let default_port = if tls { 443 } else { 80 };
        let (host, port) = match hostport.rsplit_once(':') {
            Some((h, pt)) if !h.ends_with(']') || hostport.starts_with('[') => {
                match pt.parse::<u16>() {
                    Ok(n) if n > 0 => (h, Some(n)),
                    _ if hostport.starts_with('[') && hostport.ends_with(']') => (hostport, None),
                    _ => {
                        self.log_proxy_error(
                            key,
                            p,
                            &format!("invalid port in upstream \"{hostport}\""),
                            None,
                        );
                        return Err(502);
                    }
                }
            }
            _ => (hostport, None),
        };
        if host.is_empty() {
            self.log_proxy_error(key, p, &format!("no host in upstream \"{hostport}\""), None);
            return Err(502);
        }
        let finish =
            |p: &mut Proxy, upstream: usize, n: usize, proxy_host: String, proxy_port: u16| {
                p.tried = vec![false; n];
                p.dyn_pass = Some(Rc::new(ProxyPass {
                    upstream,
                    uri: uri.clone(),
                    proxy_host,
                    proxy_port,
                    tls,
                    // Marks a rendered pass: its URI goes as it is.
                    dynamic: Some(Vec::new()),
                }));
            };
        // A named upstream (no port given), as nginx looks first.
        if port.is_none() {
            if let Some(i) = self
                .http()
                .upstreams
                .iter()
                .position(|u| u.name.eq_ignore_ascii_case(host))
            {
                let n = self.http().upstreams[i].peers.len();
                finish(p, i, n, host.to_string(), default_port);
                return Ok(true);
            }
        }
        let port = port.unwrap_or(default_port);
        let proxy_host = if port == default_port {
            host.to_string()
        } else {
            format!("{host}:{port}")
        };
        // An upstream another `proxy_pass` made for this host and port, as nginx finds its
        // implicit upstreams (no resolver needed then).
        let implicit = format!("{host}:{port}");
        if let Some(i) = self
            .http()
            .upstreams
            .iter()
            .position(|u| u.name.eq_ignore_ascii_case(&implicit))
        {
            let n = self.http().upstreams[i].peers.len();
            finish(p, i, n, proxy_host, port);
            return Ok(true);
        }
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        let addrs: Vec<std::net::SocketAddr> = if let Ok(ip) = bare.parse::<std::net::IpAddr>() {
            vec![std::net::SocketAddr::new(ip, port)]
        } else {
            let Some(conf) = loc.resolver.clone() else {
                self.log_proxy_error(
                    key,
                    p,
                    &format!("no resolver defined to resolve {host}"),
                    None,
                );
                return Err(502);
            };
            match self.resolve_name(key, host, &conf) {
                super::resolver::Resolved::Ready(ips) => ips
                    .into_iter()
                    .map(|ip| std::net::SocketAddr::new(ip, port))
                    .collect(),
                super::resolver::Resolved::Failed(e) => {
                    self.log_proxy_error(
                        key,
                        p,
                        &format!("{host} could not be resolved ({})", e.text()),
                        None,
                    );
                    return Err(502);
                }
                super::resolver::Resolved::Waiting => {
                    p.dyn_host = Some(host.to_string());
                    return Ok(false);
                }
            }
        };
        let name = format!("{bare}:{port}");
        let Some(i) = self.dyn_upstream(&name, &addrs, None) else {
            self.log_proxy_error(
                key,
                p,
                &format!("too many upstreams resolved at run time to add \"{name}\""),
                None,
            );
            return Err(502);
        };
        finish(p, i, addrs.len(), proxy_host, port);
        Ok(true)
    }

    /// Starts proxying the request just parsed on connection `key` (`head` is its head as
    /// received; `more_input`: bytes followed it, a body's start). `loc` has a `proxy_pass`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn start_proxy(
        &mut self,
        key: usize,
        server: usize,
        loc: &'a LocationConf,
        req: Request,
        head: Vec<u8>,
        more_input: bool,
        keep_alive: bool,
    ) {
        let srv = &self.http().servers[server];
        let location = srv
            .locations
            .iter()
            .position(|l| std::ptr::eq(l, loc))
            .filter(|_| !std::ptr::eq(&srv.base, loc));
        let n_peers = loc
            .proxy_pass
            .as_ref()
            .filter(|pass| pass.dynamic.is_none())
            .map_or(0, |pass| self.ups(pass.upstream).peers.len());
        let cont = req.expect_continue;
        let mut p = Box::new(Proxy::new(server, location, req, head, keep_alive, n_peers));
        // The response buffers come from the worker's pool (given back by `give_proxy_bufs`).
        p.rbuf = self.take_buf(READ_MIN_BYTES);
        p.grpc = loc.grpc;
        // An `error_page` after a failed upstream request: the body that one read.
        if let Some(kept) = self.conns[key].rq().kept_body.take() {
            p.body = *kept;
        }
        if loc.slice_size > 0 {
            self.slice_begin(key, &mut p, loc.slice_size);
        }
        if loc.fastcgi.is_some() {
            p.fcgi = Some(Box::new(Fcgi {
                raw: self.take_buf(READ_MIN_BYTES),
                ..Default::default()
            }));
        }
        let c = &mut self.conns[key];
        c.rq().proxy = Some(p);
        if cont && !more_input {
            c.out.extend_from_slice(b"HTTP/1.1 100 Continue\r\n\r\n");
        }
    }

    /// Runs the proxied request of connection `key` until it must wait or is finished.
    ///
    /// The request's state is taken off the connection for the turn and handed to each step
    /// as `&mut Proxy`, so the type says it is there; the steps return a [`Flow`] and only
    /// [`Worker::end_proxy_turn`] puts the state back, answers, finishes or closes.
    pub(super) fn drive_proxy(&mut self, key: usize) -> Step {
        let Some(c) = self.conns.get_mut(key) else {
            return Step::Wait;
        };
        let id = c.id;
        let Some(mut p) = c.rq().proxy.take() else {
            return Step::Done;
        };
        if p.background && self.conns[key].has_output() {
            // The client's stale answer still leaves while the update runs.
            if let Flush::Failed = self.flush(key) {
                return self.end_proxy_turn(key, id, p, Flow::Close);
            }
        }
        let mut rounds = 0;
        let flow = loop {
            rounds += 1;
            if rounds > super::TURN_ROUNDS_MAX {
                self.yield_conn(key);
                break Flow::Wait;
            }
            if self.client_abandoned(key, &p) {
                break Flow::Close;
            }
            if !p.head_sent && self.h2_stream_of(key).is_some_and(|st| st.body_error) {
                // An HTTP/2 stream whose body broke its `content-length`.
                break Flow::Fail(400);
            }
            if p.dav && p.state == State::Connect {
                // A WebDAV `PUT` with its body read: put in place, answered; no upstream.
                let loc = self.proxy_location(&p);
                let (status, location) = self.dav_put_done(key, loc, &p.req, &p.head, &p.body);
                let req = p.req.clone();
                let head = std::mem::take(&mut p.head);
                let (server, keep_alive) = (p.server, p.keep_alive);
                self.give_proxy_bufs(p);
                self.dav_put_answer(key, server, loc, req, head, keep_alive, status, location);
                return Step::Done;
            }
            let flow = match p.state {
                State::ReadBody => self.read_request_body(key, &mut p),
                State::Connect => self.proxy_connect(key, &mut p),
                State::Resolving => {
                    // Driven by the answer (or by a client event): look again.
                    p.state = State::Connect;
                    Flow::Next
                }
                State::Connecting => self.check_upstream_connect(key, &mut p),
                State::Handshaking => self.upstream_handshake(key, &mut p),
                State::Sending => self.send_request(key, &mut p),
                State::StreamBody => self.stream_body(key, &mut p),
                State::ReadingHead => self.read_response_head(key, &mut p),
                State::ReadingBody => self.relay_response_body(key, &mut p),
                State::Tunnel => self.run_tunnel(key, &mut p),
            };
            // `proxy_cache_background_update`: the stale answer is complete; the update runs.
            if matches!(flow, Flow::Finished) && self.cache_background(key, &mut p) {
                continue;
            }
            // `slice`: the next slice is asked for.
            if matches!(flow, Flow::Finished) && self.slice_next(key, &mut p) {
                continue;
            }
            // `proxy_cache_use_stale`: a failed upstream answered by the stale entry.
            if matches!(flow, Flow::Fail(_))
                && !p.background
                && p.last_failure.is_some()
                && !p.head_sent
                && self.cache_stale_on_failure(&mut p)
            {
                continue;
            }
            if !matches!(flow, Flow::Next) {
                break flow;
            }
        };
        self.end_proxy_turn(key, id, p, flow)
    }

    /// Acts on what the steps decided: the one place a proxied request is put back on its
    /// connection, answered with an error page, finished, truncated or closed.
    fn end_proxy_turn(&mut self, key: usize, id: u64, mut p: Box<Proxy>, flow: Flow) -> Step {
        if self.conns.get(key).is_none_or(|c| c.id != id) {
            // The client connection closed during the turn (a failed read or write).
            if let Some(u) = p.up.take() {
                self.close_upconn(u);
            }
            self.give_proxy_bufs(p);
            return Step::Wait;
        }
        if p.background && matches!(flow, Flow::Fail(_) | Flow::Redirect | Flow::Abort) {
            // An update that failed: the client already has its answer.
            if let Some(u) = p.up.take() {
                self.close_upconn(u);
            }
            if !p.keep_alive {
                self.conns[key].close_after = true;
            }
            self.give_proxy_bufs(p);
            return Step::Done;
        }
        if p.auth.is_some() && !matches!(flow, Flow::Next | Flow::Wait) {
            let status = match flow {
                Flow::Finished | Flow::Redirect => p.status,
                Flow::Fail(s) => s,
                _ => 502,
            };
            return self.auth_done(key, p, status);
        }
        match flow {
            Flow::Next | Flow::Wait => {
                // The client's socket stays in epoll while the upstream works, so that its
                // close is seen (`client_abandoned`); a request read whole at once may not
                // have registered it yet.
                if self.conns[key].fd.is_some() && !p.head_sent {
                    self.ensure_registered(key);
                }
                self.conns[key].rq().proxy = Some(p);
                Step::Wait
            }
            Flow::Fail(status) => {
                self.proxy_fail_reply(key, p, status);
                Step::Done
            }
            Flow::Redirect => {
                self.proxy_accel_redirect(key, p);
                Step::Done
            }
            Flow::Finished => {
                self.finish_response(key, p);
                Step::Done
            }
            Flow::Abort => {
                self.abort_response(key, p);
                Step::Done
            }
            Flow::Close => {
                if let Some(u) = p.up.take() {
                    self.close_upconn(u);
                }
                self.give_proxy_bufs(p);
                self.close(key);
                Step::Wait
            }
        }
    }

    /// nginx's `ngx_http_upstream_check_broken_connection`: the client closed its end
    /// (`EPOLLRDHUP`) while its request waits for the upstream's answer head. Unless
    /// `proxy_ignore_client_abort on`, the upstream's request ends too: logged at `info`
    /// and in the access log as 499, as nginx's; true when it does.
    fn client_abandoned(&mut self, key: usize, p: &Proxy) -> bool {
        let c = &self.conns[key];
        // Only a client socket (not an HTTP/2 stream or a subrequest) says so.
        if !c.hup || c.fd.is_none() || c.sub != 0 || p.head_sent || p.background || p.dav {
            return false;
        }
        // A response the cache may store is read whole anyway, as nginx's.
        if p.auth.is_some() || p.cache.as_ref().is_some_and(|c| c.cacheable) {
            return false;
        }
        let what = match p.state {
            State::Connect | State::Resolving | State::Connecting | State::Handshaking => {
                "connecting to upstream"
            }
            State::Sending => "sending request to upstream",
            State::ReadingHead => "reading response header from upstream",
            _ => return false,
        };
        if self.proxy_location(p).proxy.ignore_client_abort {
            return false;
        }
        // nginx's words, with the upstream when a connection to one was made.
        let msg = format!(
            "epoll_wait() reported that client prematurely closed connection, so upstream connection is closed too while {what}"
        );
        self.log_proxy_current_at(shard_config::LogLevel::Info, key, p, &msg);
        self.log_proxy_access(key, p, 499, 0);
        true
    }

    /// Reads the request body: into memory up to `client_body_buffer_size`, then into a
    /// temporary file.
    fn read_request_body(&mut self, key: usize, p: &mut Proxy) -> Flow {
        // A pending `100 Continue` goes out first.
        if self.conns[key].has_output() {
            match self.flush_or_wait(key) {
                Io::Ready => {}
                Io::Wait => return Flow::Wait,
                Io::Close => return Flow::Close,
            }
        }
        let loc = self.proxy_location(p);
        let conf = &loc.body;
        let passes_body = loc.proxy.pass_request_body && loc.proxy.set_body.is_none();
        if !loc.proxy.request_buffering && passes_body && !p.dav && self.conns[key].body_pending() {
            // nginx streams a chunked body only to an HTTP/1.1 upstream; to 1.0 it buffers.
            let chunked = p.req.body == Body::Chunked;
            // FastCGI needs no length: its records carry a chunked body as it is decoded.
            let fcgi = p.fcgi.is_some();
            // SCGI and uwsgi say the length first: a chunked body is read whole, as nginx.
            let http11 = loc.gateway.is_none() && loc.proxy.http_version_minor >= 1;
            if !chunked || fcgi || http11 {
                p.streaming = true;
                p.stream_chunked = chunked;
                p.stream_copy = Some(Vec::new());
                p.state = State::Connect;
                return Flow::Next;
            }
        }
        let mut rounds = 0;
        loop {
            rounds += 1;
            if rounds > super::TURN_ROUNDS_MAX {
                // A fast client does not keep the worker to itself for a whole body.
                self.yield_conn(key);
                return Flow::Wait;
            }
            let pending = self.conns[key].body_pending();
            // Grown by what was read, not doubled: a stalled body holds about
            // `client_body_buffer_size` plus one read.
            p.body.mem.reserve_exact(self.conns[key].inbuf.len());
            let done = !pending || self.consume_body(key, Some(&mut p.body.mem));
            let c = &self.conns[key];
            if c.close_after {
                // Malformed or too large chunked body: nothing was sent upstream.
                return Flow::Fail(self.bad_body_status(key));
            }
            if p.req.body != Body::None && self.spool_settle(&mut p.body, conf, done).is_err() {
                return Flow::Fail(500);
            }
            if done {
                p.state = State::Connect;
                return Flow::Next;
            }
            // Once the body goes to a file it is read in larger pieces, each written at once;
            // the buffer is given back whenever the client has sent all it has, so a stalled
            // upload holds none.
            let piece = if p.body.file().is_some() {
                conf.buffer_size.max(SPOOL_READ_BYTES)
            } else {
                conf.buffer_size
            };
            let room = piece.saturating_sub(p.body.mem.len());
            let io = match self.read_body_direct(key, &mut p.body.mem, room) {
                Some(io) => io,
                None => self.read_more(key),
            };
            match io {
                Io::Ready => {}
                Io::Wait => {
                    if p.body.file().is_some() && self.spool_idle(&mut p.body, conf).is_err() {
                        return Flow::Fail(500);
                    }
                    return Flow::Wait;
                }
                Io::Close => return Flow::Close,
            }
        }
    }

    /// Chooses a connection for the next attempt: pooled, or a new non-blocking connect.
    fn proxy_connect(&mut self, key: usize, p: &mut Proxy) -> Flow {
        // `proxy_cache`: looked at once, before the first attempt (and again after each wait
        // on `proxy_cache_lock`).
        if !p.cache_looked {
            if let Some(flow) = self.cache_lookup(key, p) {
                p.cache_looked = !matches!(flow, Flow::Wait);
                return flow;
            }
            p.cache_looked = true;
        }
        if p.dyn_pass.is_none() {
            let loc = self.proxy_location(p);
            // An upstream with `server ... resolve` whose names this worker resolved again:
            // the request takes the current peers (and keeps them through its retries).
            if let Some(pass) = loc.proxy_pass.as_ref().filter(|x| x.dynamic.is_none()) {
                if let Some(&eff) = self.shadow.get(&pass.upstream) {
                    p.tried = vec![false; self.ups(eff).peers.len()];
                    p.dyn_pass = Some(Rc::new(ProxyPass {
                        upstream: eff,
                        ..pass.clone()
                    }));
                }
            }
            if let Some(parts) = loc.proxy_pass.as_ref().and_then(|x| x.dynamic.as_ref()) {
                match self.dynamic_pass(key, p, parts) {
                    Ok(true) => p.dyn_host = None,
                    Ok(false) => {
                        p.state = State::Resolving;
                        let t = loc.resolver.as_ref().map_or(30_000, |r| r.timeout_ms);
                        self.set_proxy_deadline(key, t);
                        return Flow::Wait;
                    }
                    Err(status) => return Flow::Fail(status),
                }
            }
        }
        let Some(pass) = self.proxy_pass(p) else {
            return Flow::Fail(500);
        };
        let upstream = pass.upstream;
        let conn_id = self.conns[key].id;
        let loc = self.proxy_location(p);
        if p.upreq.is_empty() && !self.build_upstream_request(key, p, &pass) {
            return Flow::Fail(500);
        }
        let ups = self.ups(upstream);
        let peer = match p.retry_peer.take() {
            // A pooled connection the peer had closed: the same peer again, on a fresh
            // connection (it already counted as a try).
            Some(peer) => peer,
            None => {
                let tries_max = loc.proxy.next_upstream_tries;
                if tries_max > 0 && p.tries >= tries_max {
                    return no_more_peers(p, 502);
                }
                let pick = self.pick_http_peer(key, p, upstream);
                let Some(peer) = pick else {
                    // Every peer tried: the last failure's status. Peers left but none live
                    // (down, or failed within `fail_timeout`): nginx's "no live upstreams",
                    // an attempt named by the upstream (`$upstream_addr` ends `..., NAME`),
                    // and 502.
                    // (A `down` peer is never counted as one left, as nginx's tries count.)
                    let left = p
                        .tried
                        .iter()
                        .zip(ups.peers.iter())
                        .any(|(t, peer)| !*t && !peer.down);
                    if p.tries > 0 && !left {
                        return no_more_peers(p, 502);
                    }
                    crate::log!(
                        Error,
                        "no live upstreams while connecting to upstream, upstream: \"{}\"",
                        ups.name
                    );
                    p.attempts.push(shard_http::vars::UpstreamTry {
                        addr: ups.name.clone(),
                        status: Some(502),
                        ..Default::default()
                    });
                    // `balance::pick` marked every peer live again.
                    return Flow::Fail(502);
                };
                // `proxy_next_upstream_timeout`: no new attempt past it (the first sets it).
                let nu_timeout = loc.proxy.next_upstream_timeout_ms;
                if p.tries == 0 {
                    p.retry_until_ms = match nu_timeout {
                        0 => u64::MAX,
                        t => self.cx.now_ms.saturating_add(t),
                    };
                } else if self.cx.now_ms >= p.retry_until_ms {
                    return no_more_peers(p, 502);
                }
                p.tried[peer] = true;
                p.tries += 1;
                p.attempts.push(shard_http::vars::UpstreamTry {
                    addr: ups.peers[peer].name.clone(),
                    ..Default::default()
                });
                p.attempt_started_ms = self.cx.now_ms;
                // The balancer chose; a kept-alive connection to that peer only saves the
                // connect, as nginx's keepalive module wraps the balancer.
                // A pooled connection speaks what it was opened for: TLS or not, and TLS
                // with the same `proxy_ssl_*` settings.
                let want = if pass.tls {
                    // No configuration (never expected) matches no pooled connection.
                    self.upstream_tls(key, p, loc)
                        .ok()
                        .flatten()
                        .map_or(usize::MAX, |c| config_id(&c))
                } else {
                    0
                };
                let pooled = self.take_pooled(upstream, peer);
                let pooled = match pooled {
                    Some(u)
                        if self.upconns[u].tls_config != want
                            || self.upconns[u].grpc.is_some() != p.grpc =>
                    {
                        self.close_upconn(u);
                        None
                    }
                    other => other,
                };
                if let Some(u) = pooled {
                    let uc = &mut self.upconns[u];
                    uc.owner = Some((key, conn_id));
                    uc.writable = true;
                    uc.requests += 1;
                    p.up = Some(u);
                    p.reused = true;
                    p.upreq_pos = 0;
                    p.grpc_begun = false;
                    p.file_pos = 0;
                    if let Some(f) = p.fcgi.as_mut() {
                        f.restart();
                    }
                    p.state = State::Sending;
                    self.set_proxy_deadline(key, loc.proxy.send_timeout_ms);
                    return Flow::Next;
                }
                peer
            }
        };
        p.reused = false;
        p.upreq_pos = 0;
        p.grpc_begun = false;
        p.file_pos = 0;
        if let Some(f) = p.fcgi.as_mut() {
            f.restart();
        }
        // An upstream connection counts against worker_connections as in nginx, where
        // `ngx_event_connect_peer` fails and the request ends with a 500.
        if !self.room_for_connections(1) {
            crate::log!(
                Alert,
                "{} worker_connections are not enough while connecting to upstream",
                self.conns_max
            );
            return Flow::Fail(500);
        }
        let addr = ups.peers[peer].addr;
        let connected = match &ups.peers[peer].unix {
            Some(path) => shard_event::sock::connect_unix_nonblocking(path),
            None => {
                let local = match &loc.proxy.bind {
                    Some(parts) => self.proxy_bind_addr(key, p, loc, parts),
                    None => None,
                };
                match shard_event::sock::connect_nonblocking_from(
                    &addr,
                    local,
                    loc.proxy.bind_transparent,
                ) {
                    Ok(c) => Ok(c),
                    Err(ConnectError::Connect(e)) => Err(e),
                    Err(ConnectError::Transparent(e)) => {
                        // nginx: an alert, and the request ends in 500.
                        crate::log!(Alert, "setsockopt(IP_TRANSPARENT) failed ({})", os(&e));
                        return Flow::Fail(500);
                    }
                    Err(ConnectError::Bind(e)) => {
                        // nginx: `bind(ADDR) failed` at crit, and the request ends in 500
                        // without trying another peer (the address is wrong for all).
                        crate::log!(
                            Crit,
                            "bind({}) failed ({})",
                            local.map_or_else(String::new, bind_text),
                            os(&e)
                        );
                        return Flow::Fail(500);
                    }
                }
            }
        };
        let (fd, done) = match connected {
            Ok(Connect::Done(fd)) => (fd, true),
            Ok(Connect::InProgress(fd)) => (fd, false),
            Err(e) => {
                self.log_proxy_error(
                    key,
                    p,
                    &format!("connect() failed ({}) while connecting to upstream", os(&e)),
                    Some(&ups.peers[peer].name),
                );
                self.proxy_peer_failed(upstream, peer);
                // The next attempt, or the error page.
                return retry_or_fail(p, loc, Failure::Error, false);
            }
        };
        let id = self.next_conn_id;
        self.next_conn_id += 1;
        let raw = fd.as_raw_fd();
        let u = self.upconns.insert(UpConn {
            fd,
            id,
            upstream,
            peer,
            readable: false,
            writable: done,
            hup: false,
            owner: Some((key, conn_id)),
            requests: 1,
            idle_since_ms: 0,
            opened_ms: self.cx.now_ms,
            tls: None,
            fin_pending: false,
            tls_config: 0,
            grpc: p.grpc.then(|| Box::new(shard_http::grpc::Conn::new())),
        });
        let token = Token::Upstream {
            key: u,
            generation: token::generation(id),
        };
        if let Err(e) = self.poll.add(raw, token.encode(), upconn_interest()) {
            crate::log!(Alert, "epoll_ctl(ADD) failed ({})", os(&e));
            self.close_upconn(u);
            return Flow::Fail(500);
        }
        let _ = shard_event::sock::set_nodelay(raw, true);
        if loc.proxy.socket_keepalive {
            let _ = shard_event::sock::set_keepalive(raw, true);
        }
        p.up = Some(u);
        if done {
            return self.upstream_connected(key, p);
        }
        p.state = State::Connecting;
        self.set_proxy_deadline(key, loc.proxy.connect_timeout_ms);
        Flow::Next
    }

    /// The connect completed: the request is sent next, or first the TLS handshake of
    /// `proxy_pass https://`, in `proxy_connect_timeout` as nginx times it.
    fn upstream_connected(&mut self, key: usize, p: &mut Proxy) -> Flow {
        let loc = self.proxy_location(p);
        if let Some(a) = p.attempts.last_mut() {
            a.connect_ms = Some(self.cx.now_ms.saturating_sub(p.attempt_started_ms));
        }
        let Some(u) = p.up else {
            return Flow::Fail(502);
        };
        // The request's pass: with variables, the scheme is the rendered value's.
        if let Some(pass) = self.proxy_pass(p).filter(|pass| pass.tls) {
            let config = match self.upstream_tls(key, p, loc) {
                Ok(Some(c)) => c,
                // Built by the master for every location that passes to https://.
                Ok(None) => return Flow::Fail(500),
                Err(msg) => {
                    self.log_proxy_error_current(key, p, &msg);
                    return Flow::Fail(500);
                }
            };
            let config = &config;
            let name = match &loc.proxy.ssl.name_vars {
                Some(t) => {
                    let v = self.render(key, &p.req, &p.head, loc, &t.parts);
                    Some(host_of(&v).to_string())
                }
                // A port in the name is dropped, as nginx drops it.
                None => loc
                    .proxy
                    .ssl
                    .name
                    .as_deref()
                    .map(|n| host_of(n).to_string()),
            }
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| host_of(&pass.proxy_host).to_string());
            let conn = rustls::pki_types::ServerName::try_from(name.clone())
                .map_err(|e| e.to_string())
                .and_then(|n| {
                    rustls::ClientConnection::new(config.clone(), n).map_err(|e| e.to_string())
                });
            match conn {
                Ok(c) => {
                    let uc = &mut self.upconns[u];
                    uc.tls = Some(Box::new(c));
                    uc.tls_config = config_id(config);
                }
                Err(e) => {
                    let msg = format!(
                        "SSL to upstream \"{name}\" cannot start ({e}) while SSL handshaking to upstream"
                    );
                    self.log_proxy_error_current(key, p, &msg);
                    return Flow::Fail(502);
                }
            }
            p.state = State::Handshaking;
            self.set_proxy_deadline(key, loc.proxy.connect_timeout_ms);
            return Flow::Next;
        }
        p.state = State::Sending;
        self.set_proxy_deadline(key, loc.proxy.send_timeout_ms);
        Flow::Next
    }

    /// The TLS configuration of `loc`'s upstream connections for this request: the master's,
    /// or, with `proxy_ssl_certificate` named by variables, one made with the certificate
    /// they name now (kept per worker; an empty name offers none, as nginx). Err: nginx's
    /// words for a certificate that cannot be loaded.
    pub(super) fn upstream_tls(
        &mut self,
        key: usize,
        p: &Proxy,
        loc: &LocationConf,
    ) -> Result<Option<std::sync::Arc<rustls::ClientConfig>>, String> {
        let Some(vars) = loc.proxy.ssl.certificate_vars.as_ref() else {
            return Ok(self.tls.upstream(&loc.proxy.ssl).cloned());
        };
        let cert = self.render(key, &p.req, &p.head, loc, &vars.cert);
        let key_name = self.render(key, &p.req, &p.head, loc, &vars.key);
        self.client_tls(&loc.proxy.ssl, vars, &cert, &key_name, &loc.place)
    }

    /// The client configuration of `ssl` with its certificate pair rendered as `cert` and
    /// `key_name` (none when `cert` is empty): built once, kept per worker (at most
    /// [`CLIENT_CERTS_MAX`]). http's requests and stream's sessions.
    pub(super) fn client_tls(
        &mut self,
        ssl: &shard_config::ProxySsl,
        vars: &shard_config::CertVars,
        cert: &str,
        key_name: &str,
        place: &shard_config::Place,
    ) -> Result<Option<std::sync::Arc<rustls::ClientConfig>>, String> {
        if cert.is_empty() {
            return Ok(self.tls.upstream(ssl).cloned());
        }
        let mut ssl = ssl.clone();
        ssl.certificate_vars = None;
        ssl.certificate = Some(vars.dir.join(cert));
        ssl.certificate_key = Some(vars.dir.join(key_name));
        if let Some(c) = self.client_certs.get(&ssl) {
            return Ok(Some(c.clone()));
        }
        let c = std::sync::Arc::new(crate::tls::upstream_config(&ssl, place)?);
        if self.client_certs.len() >= CLIENT_CERTS_MAX {
            self.client_certs.clear();
        }
        self.client_certs.insert(ssl, c.clone());
        Ok(Some(c))
    }

    /// One step of the TLS handshake with an `https://` upstream.
    fn upstream_handshake(&mut self, key: usize, p: &mut Proxy) -> Flow {
        let Some(uc) = p.up.and_then(|u| self.upconns.get_mut(u)) else {
            return Flow::Fail(502);
        };
        let fd = uc.fd.as_raw_fd();
        let mut readable = uc.readable || uc.hup;
        let Some(t) = uc.tls.as_mut() else {
            return Flow::Fail(502);
        };
        let res = super::tls::handshake_up(fd, t, &mut readable, &mut uc.writable);
        uc.readable = readable;
        match res {
            Ok(true) => {
                let loc = self.proxy_location(p);
                p.state = State::Sending;
                self.set_proxy_deadline(key, loc.proxy.send_timeout_ms);
                Flow::Next
            }
            Ok(false) => Flow::Wait,
            Err(e) => {
                let msg =
                    format!("SSL_do_handshake() failed ({e}) while SSL handshaking to upstream");
                self.attempt_failed(key, p, Failure::Error, &msg)
            }
        }
    }

    /// `proxy_bind`'s address for this request: rendered, then parsed; an empty value binds
    /// nothing, an unparsable one is logged (as nginx's "invalid local address") and binds
    /// nothing.
    fn proxy_bind_addr(
        &self,
        key: usize,
        p: &Proxy,
        loc: &LocationConf,
        parts: &[shard_config::Part],
    ) -> Option<std::net::SocketAddr> {
        let text = if let [shard_config::Part::Lit(t)] = parts {
            t.clone()
        } else {
            let mut storage = shard_http::vars::header_storage();
            let hs = shard_http::vars::request_headers(&p.head, &mut storage);
            let ctx = self.var_ctx(key, &p.req, hs, loc);
            shard_http::vars::render(parts, &ctx)
        };
        if text.is_empty() {
            return None;
        }
        let a = shard_config::parse_bind_addr(&text);
        if a.is_none() {
            crate::log!(Error, "invalid local address \"{text}\"");
        }
        a
    }

    /// False when no request can be made (the request fails with 500, logged).
    fn build_upstream_request(&mut self, key: usize, p: &mut Proxy, pass: &ProxyPass) -> bool {
        let srv = &self.http().servers[p.server];
        let loc = self.proxy_location(p);
        let c = &self.conns[key];
        let listener = &self.cx.cfg.listeners[c.listener];
        let server_name = shard_http::route::server_name(srv);
        // `proxy_set_body`: this body instead of the client's; `proxy_pass_request_body off`:
        // none (the client's was read and is dropped).
        let own_body = loc
            .fastcgi
            .is_none()
            .then_some(())
            .and(loc.proxy.set_body.as_ref())
            .map(|parts| {
                let mut storage = shard_http::vars::header_storage();
                let hs = shard_http::vars::request_headers(&p.head, &mut storage);
                let mut ctx = self.var_ctx(key, &p.req, hs, loc);
                if p.body.file().is_none() {
                    ctx.conn.request_body = &p.body.mem;
                }
                ctx.conn.request_body_file = Some(&p.body);
                shard_http::vars::render(parts, &ctx).into_bytes()
            });
        p.body_skipped = loc.fastcgi.is_none()
            && (own_body.is_some()
                || !loc.proxy.pass_request_body
                || loc.gateway.as_ref().is_some_and(|g| {
                    !g.pass_request_body || g.wire == shard_config::Wire::Memcached
                }));
        let body_len = match (&own_body, p.req.body) {
            (Some(b), _) => Some(b.len() as u64),
            _ if p.body_skipped => None,
            (None, Body::None) => None,
            (None, Body::Length(n)) if p.streaming => Some(n),
            (None, Body::Chunked) if p.streaming => None,
            _ => Some(p.body.len()),
        };
        let in_memory = if p.body.file().is_some() {
            0
        } else {
            p.body.mem.len()
        };
        let mut out = Vec::with_capacity(p.head.len() + 128 + in_memory);
        let cached = (loc.fastcgi.is_some() || loc.gateway.is_some())
            .then(|| self.fcgi_cache_params(p))
            .flatten();
        let mut conn = self.var_conn(key);
        // `$request_body`: the body when it is whole in memory.
        if !p.streaming && p.body.file().is_none() {
            conn.request_body = &p.body.mem;
        }
        conn.request_body_file = Some(&p.body);
        let ctx = shard_http::proxy::RequestCtx {
            req: &p.req,
            head: &p.head,
            location: loc,
            pass,
            client: c.rd().client,
            server_addr: listener.addr,
            server_name,
            body_len,
            body_chunked: p.stream_chunked,
            conn,
            scope: self.var_scope(key, &p.req),
        };
        if let Some(fc) = loc.fastcgi.as_deref() {
            // The body in memory leaves in STDIN records behind the params; a body file's
            // records are written by `send_fcgi_body`.
            let body = if !fc.pass_request_body || p.req.body == Body::None {
                Some(&[][..])
            } else if p.body.file().is_some() || p.streaming {
                // STDIN records follow (`send_fcgi_body`, or `stream_body` as it arrives).
                None
            } else {
                Some(&p.body.mem[..])
            };
            let validators = cached.as_ref().map(|(l, e)| (&l[..], &e[..]));
            shard_http::fastcgi::write_request(&mut out, &ctx, fc, body, validators);
            if let Some(f) = p.fcgi.as_mut() {
                f.body_in_head = body.is_some();
            }
            if p.streaming {
                // What the client already sent goes with the params, in one write (as
                // nginx's request chain), and the end record when that is all of it.
                let mut pre = Vec::new();
                let done =
                    !self.conns[key].body_pending() || self.consume_body(key, Some(&mut pre));
                if !self.conns[key].close_after {
                    let bound = loc.body.buffer_size.max(1);
                    if p.stream_copy
                        .as_ref()
                        .is_some_and(|c| c.len() + pre.len() > bound)
                    {
                        p.stream_copy = None;
                    }
                    if let Some(copy) = &mut p.stream_copy {
                        copy.extend_from_slice(&pre);
                    }
                    if !pre.is_empty() {
                        shard_http::fastcgi::push_stdin(&mut out, &pre);
                    }
                    if done {
                        shard_http::fastcgi::push_stdin_end(&mut out);
                        p.stream_ended_in_head = true;
                    }
                }
            }
            p.body.mem = Vec::new();
            self.recharge(&mut p.body);
            p.upreq = out;
            return true;
        }
        if let Some(gw) = loc.gateway.as_deref() {
            // SCGI or uwsgi: the params' block, then the body as the proxy sends it.
            let validators = cached.as_ref().map(|(l, e)| (&l[..], &e[..]));
            if let Err(why) = shard_http::gateway::write_head(&mut out, &ctx, gw, validators) {
                crate::log!(Error, "{why}{}", self.log_context(key, None));
                return false;
            }
        } else {
            shard_http::proxy::write_request(&mut out, &ctx);
            self.cache_request(p, &mut out);
        }
        if p.body_skipped {
            if let Some(b) = own_body {
                out.extend_from_slice(&b);
            }
            p.body.mem = Vec::new();
            self.recharge(&mut p.body);
        } else if p.body.file().is_none() && !p.streaming {
            // A body that fits in memory leaves with the head, in one write; it is kept there
            // for another attempt (and the access log), and its buffer goes back.
            p.upreq_body_at = if p.body.mem.is_empty() { 0 } else { out.len() };
            out.extend_from_slice(&p.body.mem);
            p.body.mem = Vec::new();
            self.recharge(&mut p.body);
        }
        // nginx tunnels a `101` only for a client that asked to upgrade; shard also wants the
        // request to have forwarded it (`proxy_set_header Upgrade ...` over HTTP/1.1).
        // The client's own `Upgrade` is never passed: without a `proxy_set_header Upgrade`
        // the request cannot ask, and neither head needs reading.
        // A subrequest is never upgraded (nginx: "connection upgrade in subrequest").
        p.upgrade = self.conns[key].sub == 0
            && loc
                .proxy
                .set_headers
                .iter()
                .any(|(n, _)| n.eq_ignore_ascii_case("upgrade"))
            && shard_http::proxy::upgrade_requested(&p.head)
            && shard_http::proxy::upgrade_requested(&out);
        p.upreq = out;
        true
    }

    fn check_upstream_connect(&mut self, key: usize, p: &mut Proxy) -> Flow {
        let Some(u) = p.up else {
            p.state = State::Connect;
            return Flow::Next;
        };
        let uc = &mut self.upconns[u];
        if !uc.writable {
            return Flow::Wait;
        }
        // Writability of a socket that only ever had this connect: `SO_ERROR` says it all.
        let failure = match shard_event::sock::take_error(uc.fd.as_raw_fd()) {
            Ok(Some(e)) | Err(e) => Some(e),
            Ok(None) => None,
        };
        if let Some(e) = failure {
            let msg = format!("connect() failed ({}) while connecting to upstream", os(&e));
            return self.attempt_failed(key, p, Failure::Error, &msg);
        }
        self.upstream_connected(key, p)
    }

    /// Writes the request head and a buffered body. `proxy_send_timeout` is the time between
    /// two writes that make progress, as nginx, not the whole upload.
    fn send_request(&mut self, key: usize, p: &mut Proxy) -> Flow {
        let mut progressed = false;
        let flow = self.send_request_io(key, p, &mut progressed);
        if progressed && matches!(flow, Flow::Wait) && p.state == State::Sending {
            let loc = self.proxy_location(p);
            self.set_proxy_deadline(key, loc.proxy.send_timeout_ms);
        }
        flow
    }

    fn send_request_io(&mut self, key: usize, p: &mut Proxy, progressed: &mut bool) -> Flow {
        let Some(u) = p.up else {
            p.state = State::Connect;
            return Flow::Next;
        };
        if p.grpc {
            return self.grpc_begin(p);
        }
        if p.streaming
            && p.upreq_pos == 0
            && p.folded_body == 0
            && p.stream_pos == 0
            && !p.body.mem.is_empty()
        {
            p.upreq.extend_from_slice(&p.body.mem);
            p.folded_body = p.body.mem.len();
        }
        let uc = &mut self.upconns[u];
        let before = p.upreq_pos;
        let written = uc.write_from(&p.upreq, &mut p.upreq_pos);
        *progressed |= p.upreq_pos > before;
        match written {
            Ok(true) => p.stream_pos = p.stream_pos.max(p.folded_body),
            Ok(false) => return Flow::Wait,
            Err(e) => {
                let msg = format!(
                    "writev() failed ({}) while sending request to upstream",
                    os(&e)
                );
                return self.attempt_failed(key, p, Failure::Error, &msg);
            }
        }
        if p.streaming {
            p.state = State::StreamBody;
            return Flow::Next;
        }
        if p.fcgi.is_some() {
            return self.send_fcgi_body(key, p, progressed);
        }
        if p.body_skipped {
            return self.body_sent(key, p);
        }
        if let Some((file, len)) = p.body.file() {
            let mut chunks = 0;
            while p.file_pos < len {
                if !uc.writable {
                    return Flow::Wait;
                }
                chunks += 1;
                if chunks > SENDFILE_CHUNKS_MAX {
                    // A fast upstream does not keep the worker to itself for a whole body.
                    self.yield_conn(key);
                    return Flow::Wait;
                }
                let want = (len - p.file_pos).min(SENDFILE_CHUNK_BYTES) as usize;
                if uc.tls.is_some() {
                    // Encrypted in user space: read, then written through TLS.
                    let mut chunk = std::mem::take(&mut p.scratch);
                    chunk.resize(want.min(TLS_BODY_CHUNK_BYTES), 0);
                    let res = shard_event::sock::pread(file.as_raw_fd(), &mut chunk, p.file_pos)
                        .and_then(|n| {
                            if n == 0 {
                                return Err(std::io::Error::other(
                                    "the request body file was truncated",
                                ));
                            }
                            let mut pos = 0;
                            let done = uc.write_from(&chunk[..n], &mut pos)?;
                            Ok((pos, done))
                        });
                    chunk.clear();
                    p.scratch = chunk;
                    match res {
                        Ok((sent, done)) => {
                            p.file_pos += sent as u64;
                            *progressed |= sent > 0;
                            if !done {
                                return Flow::Wait;
                            }
                        }
                        Err(e) => {
                            let msg = format!(
                                "SSL_write() failed ({}) while sending request to upstream",
                                os(&e)
                            );
                            return self.attempt_failed(key, p, Failure::Error, &msg);
                        }
                    }
                    continue;
                }
                match shard_event::sock::sendfile(
                    uc.fd.as_raw_fd(),
                    file.as_raw_fd(),
                    &mut p.file_pos,
                    want,
                ) {
                    Ok(0) => {
                        let msg = "sendfile() reported that the request body file was truncated while sending request to upstream";
                        return self.attempt_failed(key, p, Failure::Error, msg);
                    }
                    Ok(n) => {
                        *progressed = true;
                        if n < want {
                            uc.writable = false;
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        uc.writable = false;
                        return Flow::Wait;
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        let msg = format!(
                            "sendfile() failed ({}) while sending request to upstream",
                            os(&e)
                        );
                        return self.attempt_failed(key, p, Failure::Error, &msg);
                    }
                }
            }
        }
        self.body_sent(key, p)
    }

    /// FastCGI: a body file goes in `STDIN` records, each read from the file (with `pread`)
    /// into one bounded buffer and written before the next is read; then the empty `STDIN`
    /// record. A body that was in memory already left with the params.
    fn send_fcgi_body(&mut self, key: usize, p: &mut Proxy, progressed: &mut bool) -> Flow {
        let Some(u) = p.up else {
            p.state = State::Connect;
            return Flow::Next;
        };
        let Some(f) = p.fcgi.as_mut() else {
            return self.body_sent(key, p);
        };
        let file = if f.body_in_head { None } else { p.body.file() };
        let mut records = 0;
        loop {
            if f.out_pos < f.out.len() {
                let before = f.out_pos;
                let res = self.upconns[u].write_from(&f.out, &mut f.out_pos);
                *progressed |= f.out_pos > before;
                match res {
                    Ok(true) => {}
                    Ok(false) => return Flow::Wait,
                    Err(e) => {
                        let msg = format!(
                            "writev() failed ({}) while sending request to upstream",
                            os(&e)
                        );
                        return self.attempt_failed(key, p, Failure::Error, &msg);
                    }
                }
                continue;
            }
            f.out.clear();
            f.out_pos = 0;
            match file {
                Some((fd, len)) if p.file_pos < len => {
                    records += 1;
                    if records > SENDFILE_CHUNKS_MAX {
                        self.yield_conn(key);
                        return Flow::Wait;
                    }
                    let want = ((len - p.file_pos) as usize).min(FCGI_RECORD_BYTES);
                    let start = f.out.len();
                    f.out
                        .resize(start + shard_http::fastcgi::HEADER_LEN + want, 0);
                    let read = shard_event::sock::pread(
                        fd.as_raw_fd(),
                        &mut f.out[start + shard_http::fastcgi::HEADER_LEN..],
                        p.file_pos,
                    );
                    let n = match read {
                        Ok(0) | Err(_) => {
                            let msg = "the request body file could not be read while sending request to upstream";
                            return self.attempt_failed(key, p, Failure::Error, msg);
                        }
                        Ok(n) => n,
                    };
                    f.out.truncate(start + shard_http::fastcgi::HEADER_LEN + n);
                    let mut header = Vec::with_capacity(shard_http::fastcgi::HEADER_LEN);
                    shard_http::fastcgi::push_record_header(&mut header, STDIN_RECORD, n);
                    f.out[start..start + shard_http::fastcgi::HEADER_LEN].copy_from_slice(&header);
                    f.out.resize(f.out.len() + header[6] as usize, 0);
                    p.file_pos += n as u64;
                }
                _ if !f.body_in_head && !f.stdin_done => {
                    f.stdin_done = true;
                    shard_http::fastcgi::push_stdin_end(&mut f.out);
                }
                _ => break,
            }
        }
        self.body_sent(key, p)
    }

    /// Moves the body from the client to the upstream as it arrives, through `body.mem`
    /// (at most `client_body_buffer_size` plus one read): the client is not read while the
    /// upstream does not take what waits, and nothing is written while the client sends
    /// nothing. An upstream that answers before the body is all sent is read at once.
    fn stream_body(&mut self, key: usize, p: &mut Proxy) -> Flow {
        if p.grpc {
            return self.grpc_exchange(key, p);
        }
        let loc = self.proxy_location(p);
        let bound = loc.body.buffer_size.max(1);
        let Some(u) = p.up else {
            return Flow::Fail(502);
        };
        let mut rounds = 0;
        loop {
            rounds += 1;
            if rounds > super::TURN_ROUNDS_MAX {
                self.yield_conn(key);
                return Flow::Wait;
            }
            let uc = &self.upconns[u];
            let early = if uc.tls.is_some() && uc.readable && !uc.hup {
                // Over TLS, readable may be a session ticket and not a response: only
                // plaintext (or the end of stream) is one. What was read starts the head.
                p.rbuf.clear();
                match self.read_upstream(p, loc.proxy.buffer_size) {
                    Ok(Some(_)) => Some(false),
                    Ok(None) => None,
                    Err(e) => {
                        let msg = format!(
                            "SSL_read() failed ({}) while sending request to upstream",
                            os(&e)
                        );
                        return self.attempt_failed(key, p, Failure::Error, &msg);
                    }
                }
            } else {
                (uc.readable || uc.hup).then_some(true)
            };
            if let Some(clear) = early {
                // An early response (or a close): the rest of the body is not sent; the
                // client connection discards it once the response is done.
                if self.conns[key].body_pending() || p.stream_pos < p.body.mem.len() {
                    p.body_cut = true;
                }
                if !clear {
                    return self.await_response(key, p);
                }
                return self.body_sent(key, p);
            }
            // Write what waits.
            let uc = &mut self.upconns[u];
            match uc.write_from(&p.body.mem, &mut p.stream_pos) {
                Ok(_) => {}
                Err(e) if matches!(e.raw_os_error(), Some(libc::EPIPE | libc::ECONNRESET)) => {
                    // The upstream stopped reading, most likely after answering early (a 413
                    // of its own): its response, if any, is read next; without one the read
                    // fails and the attempt with it.
                    uc.readable = true;
                    uc.hup = true;
                    p.body_cut = true;
                    return self.body_sent(key, p);
                }
                Err(e) => {
                    let msg = format!(
                        "writev() failed ({}) while sending request to upstream",
                        os(&e)
                    );
                    return self.attempt_failed(key, p, Failure::Error, &msg);
                }
            }
            if p.stream_pos < p.body.mem.len() {
                // Back-pressure: the upstream's send timeout runs; the client is not read.
                self.set_proxy_deadline(key, loc.proxy.send_timeout_ms);
                return Flow::Wait;
            }
            p.body.mem.clear();
            p.stream_pos = 0;
            if !self.conns[key].body_pending() {
                if self.conns[key].close_after {
                    // A malformed or too large chunked body, after part of it went upstream.
                    return Flow::Fail(self.bad_body_status(key));
                }
                // FastCGI: the empty `STDIN` record ends the body.
                let ended = p.stream_ended_in_head;
                if let Some(f) = p.fcgi.as_mut().filter(|f| !f.stdin_done && !ended) {
                    f.stdin_done = true;
                    shard_http::fastcgi::push_stdin_end(&mut p.body.mem);
                    continue;
                }
                return self.body_sent(key, p);
            }
            // Fill from what the client sent, up to the bound or until it has no more.
            while p.body.mem.len() < bound && self.conns[key].body_pending() {
                if !p.stream_chunked {
                    let room = bound - p.body.mem.len();
                    match self.read_body_direct(key, &mut p.body.mem, room) {
                        Some(Io::Ready) => continue,
                        Some(Io::Wait) if !p.body.mem.is_empty() => break,
                        Some(Io::Wait) => {
                            let t = self.cx.now_ms + self.conns[key].rq().body_timeout_ms;
                            self.set_conn_deadline(key, t);
                            return Flow::Wait;
                        }
                        Some(Io::Close) => return Flow::Close,
                        None => {}
                    }
                }
                if self.conns[key].inbuf.is_empty() {
                    match self.read_more(key) {
                        Io::Ready => {}
                        Io::Wait if !p.body.mem.is_empty() => break,
                        Io::Wait => {
                            let t = self.cx.now_ms + self.conns[key].rq().body_timeout_ms;
                            self.set_conn_deadline(key, t);
                            return Flow::Wait;
                        }
                        Io::Close => return Flow::Close,
                    }
                }
                let more = self.conns[key].inbuf.len();
                p.body.mem.reserve_exact(more);
                let before = p.body.mem.len();
                let got = if p.stream_chunked {
                    p.scratch.clear();
                    let done = self.consume_body(key, Some(&mut p.scratch));
                    if p.fcgi.is_some() {
                        // Decoded, for `STDIN` records.
                        p.body.mem.extend_from_slice(&p.scratch);
                    } else {
                        if !p.scratch.is_empty() {
                            shard_http::proxy::write_chunk(&mut p.body.mem, &p.scratch);
                        }
                        if done && !self.conns[key].close_after {
                            p.body.mem.extend_from_slice(shard_http::proxy::LAST_CHUNK);
                        }
                    }
                    &p.scratch[..]
                } else {
                    self.consume_body(key, Some(&mut p.body.mem));
                    &p.body.mem[before..]
                };
                if let Some(copy) = &mut p.stream_copy {
                    if copy.len() + got.len() <= bound {
                        copy.extend_from_slice(got);
                    } else {
                        p.stream_copy = None;
                    }
                }
                if self.conns[key].close_after {
                    // A malformed or too large chunked body, after part of it went upstream.
                    self.recharge(&mut p.body);
                    return Flow::Fail(self.bad_body_status(key));
                }
            }
            // FastCGI: what was read goes in `STDIN` records.
            if p.fcgi.is_some() && !p.body.mem.is_empty() {
                let raw = std::mem::take(&mut p.body.mem);
                p.body.mem.reserve(raw.len() + 64);
                shard_http::fastcgi::push_stdin(&mut p.body.mem, &raw);
            }
            self.recharge(&mut p.body);
        }
    }

    /// The status of a request body the client broke off (`close_after` set while reading
    /// it): 413 past `client_max_body_size`, else 400 (a malformed chunked body).
    fn bad_body_status(&self, key: usize) -> u16 {
        let r = self.conns[key].rd();
        if r.body_bytes_max > 0 && r.body_bytes > r.body_bytes_max {
            413
        } else {
            400
        }
    }

    /// The request (or what the upstream wanted of it) is sent: wait for the response head.
    fn body_sent(&mut self, key: usize, p: &mut Proxy) -> Flow {
        if let Some(a) = p.attempts.last_mut() {
            let body = if p.streaming {
                p.stream_pos as u64
            } else {
                p.file_pos
            };
            a.bytes_sent = p.upreq.len() as u64 + body;
        }
        p.rbuf.clear();
        self.await_response(key, p)
    }

    /// Reads the response head next, from what `rbuf` already holds on.
    fn await_response(&mut self, key: usize, p: &mut Proxy) -> Flow {
        let loc = self.proxy_location(p);
        p.state = State::ReadingHead;
        self.set_proxy_deadline(key, loc.proxy.read_timeout_ms);
        Flow::Next
    }

    /// One read from the upstream into `rbuf`, at most `room` bytes. `Ok(None)`: must wait.
    /// `Ok(Some(0))`: the response ended (the peer closed, or FastCGI's `END_REQUEST`).
    fn read_upstream(&mut self, p: &mut Proxy, room: usize) -> std::io::Result<Option<usize>> {
        if let Some(c) = p.cache.as_mut().filter(|c| c.serving) {
            return Self::cache_read(c, &mut p.rbuf, room);
        }
        if p.grpc {
            let head_max = self.proxy_location(p).proxy.buffer_size;
            return self.grpc_read(p, head_max);
        }
        let Some(mut f) = p.fcgi.take() else {
            let read = self.read_upstream_into(p.up, &mut p.rbuf, room);
            if let (Ok(Some(n)), Some(a)) = (&read, p.attempts.last_mut()) {
                a.bytes_received += *n as u64;
            }
            return read;
        };
        let res = self.read_fcgi(p.up, &mut f, &mut p.rbuf, room);
        p.fcgi = Some(f);
        res
    }

    /// FastCGI: reads records and decodes them, until some response bytes, the end of the
    /// response, or nothing more to read. The application's stderr is kept in `f.stderr`.
    fn read_fcgi(
        &mut self,
        up: Option<usize>,
        f: &mut Fcgi,
        out: &mut Vec<u8>,
        room: usize,
    ) -> std::io::Result<Option<usize>> {
        loop {
            let before = out.len();
            let fed = f
                .decoder
                .feed(&f.raw, out, &mut f.stderr)
                .map_err(std::io::Error::other)?;
            f.raw.drain(..fed.consumed);
            let n = out.len() - before;
            if n > 0 {
                return Ok(Some(n));
            }
            if fed.ended {
                return Ok(Some(0));
            }
            let want = room.max(shard_http::fastcgi::HEADER_LEN);
            match self.read_upstream_into(up, &mut f.raw, want)? {
                None => return Ok(None),
                Some(0) => {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        "upstream prematurely closed FastCGI stdout",
                    ))
                }
                Some(_) => {}
            }
        }
    }

    /// One read from upstream connection `up` into `buf`, at most `room` bytes
    /// ([`UpConn::read_into`]).
    fn read_upstream_into(
        &mut self,
        up: Option<usize>,
        buf: &mut Vec<u8>,
        room: usize,
    ) -> std::io::Result<Option<usize>> {
        let Some(uc) = up.and_then(|u| self.upconns.get_mut(u)) else {
            return Err(std::io::Error::from_raw_os_error(libc::EBADF));
        };
        uc.read_into(buf, room)
    }

    fn read_response_head(&mut self, key: usize, p: &mut Proxy) -> Flow {
        if let Some(flow) = p.grpc.then(|| self.grpc_pump(key, p)).flatten() {
            return flow;
        }
        let loc = self.proxy_location(p);
        let max = loc.proxy.buffer_size;
        loop {
            let serving = p.cache.as_ref().is_some_and(|c| c.serving);
            // A HEAD asked as GET reads the body (to store it); a HEAD served from the cache
            // reads none.
            let head_request = p.req.method == Method::Head && (serving || !p.upstream_get);
            let pass = &self.proxy_location(p).proxy.pass_headers;
            let parsed = if p.fcgi.is_some() {
                if let Some(flow) = self.fcgi_stderr(key, p, true) {
                    return flow;
                }
                shard_http::fastcgi::parse_head(&p.rbuf, max, head_request, pass)
            } else if let Some(gw) = loc.gateway.as_deref() {
                if gw.wire == shard_config::Wire::Memcached {
                    // The key as sent: `get KEY\r\n`.
                    let mkey = p
                        .upreq
                        .get(4..p.upreq.len().saturating_sub(2))
                        .unwrap_or(b"");
                    match shard_http::gateway::parse_memcached(
                        &p.rbuf,
                        mkey,
                        gw.gzip_flag,
                        head_request,
                    ) {
                        ResponseParse::Complete { mut head, head_len } => {
                            if head.status == 404 {
                                // nginx intercepts memcached's miss: its own 404 (and
                                // `error_page 404`).
                                crate::log!(
                                    Info,
                                    "key: \"{}\" was not found by memcached{}",
                                    String::from_utf8_lossy(mkey),
                                    self.log_context(key, Some(&p.req))
                                );
                                return Flow::Fail(404);
                            }
                            let ct = shard_http::static_file::content_type(
                                loc,
                                std::path::Path::new(&p.req.path),
                            );
                            head.headers
                                .insert(0, ("Content-Type".to_string(), ct.as_bytes().to_vec()));
                            ResponseParse::Complete { head, head_len }
                        }
                        other => other,
                    }
                } else {
                    shard_http::gateway::parse_head(&p.rbuf, max, head_request, pass)
                }
            } else {
                shard_http::proxy::parse_response_passing(
                    &p.rbuf,
                    max,
                    head_request,
                    pass,
                    p.upgrade,
                )
            };
            match parsed {
                ResponseParse::Interim { head_len } => {
                    p.rbuf.drain(..head_len);
                    continue;
                }
                ResponseParse::Invalid(why) => {
                    return self.attempt_failed(key, p, Failure::InvalidHeader, why);
                }
                ResponseParse::Complete { mut head, head_len } => {
                    // An `auth_request` subrequest wants the status alone.
                    if let Some(a) = p.auth.as_mut() {
                        p.status = head.status;
                        p.upstream_reusable = false;
                        // A 401's challenge goes to the client, as nginx passes it.
                        a.www = head
                            .headers
                            .iter()
                            .find(|(n, _)| n.eq_ignore_ascii_case("www-authenticate"))
                            .map(|(_, v)| v.clone());
                        // `auth_request_set` reads its `$upstream_http_*`.
                        if let Some(t) = p.attempts.last_mut() {
                            t.status = Some(head.status);
                            t.headers = shard_http::proxy::header_lines(&p.rbuf[..head_len]);
                        }
                        return Flow::Finished;
                    }
                    let nu = loc.proxy.next_upstream;
                    // With no peer left to try, the last peer's answer goes to the client
                    // as it is, as nginx (`peer.tries > 1` in `ngx_http_upstream_test_next`).
                    if !serving
                        && nu.retries_status(head.status)
                        && may_retry(p, loc, true)
                        && !self.stream_spent(key, p)
                        && self.peer_left(p)
                    {
                        let msg = format!("upstream returned {}", head.status);
                        return self.attempt_failed(key, p, Failure::Status(head.status), &msg);
                    }
                    // `proxy_cache`: a revalidated or stale entry instead, or the entry to
                    // store begins.
                    if p.cache.is_some() {
                        if let Some(flow) = self.cache_on_head(key, p, &head, head_len) {
                            return flow;
                        }
                    }
                    // `proxy_intercept_errors`: the location's `error_page` for this status
                    // replaces the upstream's answer, which is not read further; the try
                    // keeps the status it answered (`$upstream_status` there).
                    if let Some(a) = p.attempts.last_mut() {
                        a.status = Some(head.status);
                    }
                    if loc.proxy.intercept_errors
                        && head.status >= 300
                        && loc
                            .error_pages
                            .iter()
                            .any(|e| e.codes.contains(&head.status))
                    {
                        // A 401's challenges go with the error page, as nginx passes them.
                        if head.status == 401 {
                            let mut lines = Vec::new();
                            for (_, v) in head
                                .headers
                                .iter()
                                .filter(|(n, _)| n.eq_ignore_ascii_case("www-authenticate"))
                            {
                                lines.extend_from_slice(b"WWW-Authenticate: ");
                                lines.extend(v.iter().filter(|&&b| b != b'\r' && b != b'\n'));
                                lines.extend_from_slice(b"\r\n");
                            }
                            if !lines.is_empty() {
                                self.conns[key].rq().accel_headers = Some(lines.into_boxed_slice());
                            }
                        }
                        return Flow::Fail(head.status);
                    }
                    // `X-Accel-Limit-Rate`: this response's rate, and that of the page an
                    // `X-Accel-Redirect` leads to, over `limit_rate`.
                    if head.accel_limit_rate
                        && loc.proxy.ignore_headers & shard_config::ignore::X_ACCEL_LIMIT_RATE == 0
                    {
                        let rate = raw_header(&p.rbuf[..head_len], "x-accel-limit-rate")
                            .and_then(|v| std::str::from_utf8(v).ok()?.trim().parse().ok());
                        if let Some(n) = rate {
                            self.conns[key].rq().rate_set = Some(n);
                            self.settle_limit_rate(key, loc, &p.req, &p.head);
                        }
                    }
                    if !loc.proxy.ignore_accel_redirect && head.accel_redirect {
                        if let Some(target) = accel_redirect(&p.rbuf[..head_len]) {
                            if let Some(a) = p.attempts.last_mut() {
                                a.headers = shard_http::proxy::header_lines(&p.rbuf[..head_len]);
                            }
                            p.accel = Some(Box::new(target));
                            return Flow::Redirect;
                        }
                    }
                    match self.slice_head(p, &mut head) {
                        slice::SliceHead::Respond => {}
                        slice::SliceHead::Body => {
                            // A following slice: its head is not the client's.
                            p.rbuf.drain(..head_len);
                            p.state = State::ReadingBody;
                            return Flow::Next;
                        }
                        slice::SliceHead::Status(code) => return Flow::Fail(code),
                        slice::SliceHead::Fail(msg) => {
                            self.log_proxy_error_current(key, p, &msg);
                            return if p.head_sent {
                                Flow::Abort
                            } else {
                                Flow::Fail(500)
                            };
                        }
                    }
                    self.start_response(key, p, head, head_len);
                    return Flow::Next;
                }
                ResponseParse::Partial => {}
            }
            let room = max.saturating_sub(p.rbuf.len()).max(READ_MIN_BYTES);
            match self.read_upstream(p, room) {
                Ok(None) => return Flow::Wait,
                // A FastCGI response whose records ended before its head did is an invalid
                // header, as nginx (`fastcgi_next_upstream invalid_header` tries the next).
                Ok(Some(0)) if p.fcgi.is_some() => {
                    return self.attempt_failed(
                        key,
                        p,
                        Failure::InvalidHeader,
                        "upstream prematurely closed FastCGI stdout while reading response header from upstream",
                    );
                }
                Ok(Some(0)) => {
                    return self.attempt_failed(
                        key,
                        p,
                        Failure::Error,
                        "upstream prematurely closed connection while reading response header from upstream",
                    );
                }
                Ok(Some(_)) => {}
                Err(e) => {
                    let msg = recv_failed(&e, "while reading response header from upstream");
                    // A FastCGI record nginx would refuse is an invalid header.
                    let why = if e.kind() == std::io::ErrorKind::Other {
                        Failure::InvalidHeader
                    } else {
                        Failure::Error
                    };
                    return self.attempt_failed(key, p, why, &msg);
                }
            }
        }
    }

    /// FastCGI: logs what the application wrote to stderr since the last look, as nginx
    /// (`FastCGI sent in stderr: "..."`). Before the response head, a `fastcgi_catch_stderr`
    /// string in it makes the attempt fail as an invalid header.
    fn fcgi_stderr(&mut self, key: usize, p: &mut Proxy, before_head: bool) -> Option<Flow> {
        let f = p.fcgi.as_mut()?;
        if f.stderr.is_empty() {
            return None;
        }
        let text = std::mem::take(&mut f.stderr);
        let during = if before_head {
            " while reading response header from upstream"
        } else {
            " while reading upstream"
        };
        let msg = shard_http::fastcgi::stderr_message(&text) + during;
        let loc = self.proxy_location(p);
        let caught = before_head
            && loc.fastcgi.as_ref().is_some_and(|fc| {
                fc.catch_stderr
                    .iter()
                    .any(|c| !c.is_empty() && text.windows(c.len()).any(|w| w == c.as_bytes()))
            });
        if caught {
            return Some(self.attempt_failed(key, p, Failure::InvalidHeader, &msg));
        }
        self.log_proxy_error_current(key, p, &msg);
        None
    }

    /// The response head is accepted: write the client's head and start the body.
    /// An upstream's `X-Accel-Charset: DST`, as nginx's charset filter takes an override:
    /// a name no `charset_map` or `charset` knows is logged and changes nothing; a type
    /// without a charset gets `; charset=DST`; one with another charset is recoded where a
    /// `charset_map` joins them (not when encoded), else left as it is, logged.
    fn accel_charset(
        &mut self,
        key: usize,
        p: &mut Proxy,
        loc: &LocationConf,
        head: &mut shard_http::proxy::ResponseHead,
        dst: &str,
    ) {
        let maps = &self.http().charset_maps;
        if !charset_known(dst, maps, loc) {
            self.log_proxy_error_current(key, p, &format!("unknown charset \"{dst}\" to override"));
            return;
        }
        let encoded = head
            .headers
            .iter()
            .any(|(n, _)| n.eq_ignore_ascii_case("content-encoding"));
        let Some((_, value)) = head
            .headers
            .iter_mut()
            .find(|(n, _)| n.eq_ignore_ascii_case("content-type"))
        else {
            return;
        };
        let ct = String::from_utf8_lossy(value).into_owned();
        let (new_ct, table, err) = charset_override(&ct, dst, maps, encoded);
        if let Some(v) = new_ct {
            *value = v.into_bytes();
        }
        if let Some(t) = table {
            p.recode = Some(std::sync::Arc::new(t));
        }
        if let Some(msg) = err {
            self.log_proxy_error_current(key, p, &msg);
        }
    }

    fn start_response(
        &mut self,
        key: usize,
        p: &mut Proxy,
        mut head: shard_http::proxy::ResponseHead,
        head_len: usize,
    ) {
        let loc = self.proxy_location(p);
        // An `error_page` without `=` that led here: a successful answer goes out with the
        // error's status (`=CODE`: that one), as nginx's `err_status`.
        if let Some(code) = self.conns[key]
            .rd()
            .status_override
            .filter(|_| (200..300).contains(&head.status))
        {
            head.status = code;
        }
        // `$upstream_http_*`, `$upstream_cookie_*`: every header line as received, hidden
        // ones (`X-Accel-*`) too.
        if loc.upstream_vars {
            if let Some(a) = p.attempts.last_mut() {
                a.headers = shard_http::proxy::header_lines(&p.rbuf[..head_len]);
            }
        }
        // `proxy_hide_header`.
        if !loc.proxy.hide_headers.is_empty() {
            head.headers.retain(|(n, _)| {
                !loc.proxy
                    .hide_headers
                    .iter()
                    .any(|h| n.eq_ignore_ascii_case(h))
            });
        }
        // `proxy_redirect`, then nginx's absolute form of a relative `Location`.
        if let Some(pass) = loc.proxy_pass.as_ref() {
            for (name, value) in &mut head.headers {
                if !(name.eq_ignore_ascii_case("location") || name.eq_ignore_ascii_case("refresh"))
                {
                    continue;
                }
                let Ok(v) = std::str::from_utf8(value) else {
                    continue;
                };
                let is_location = name.eq_ignore_ascii_case("location");
                let render = |parts: &[shard_config::Part], caps: shard_http::proxy::Groups<'_>| {
                    self.render_with_captures(key, &p.req, &p.head, loc, parts, caps)
                };
                // nginx: `proxy_redirect default` does nothing when `proxy_pass` has variables.
                let default_with_vars = pass.dynamic.is_some()
                    && matches!(loc.proxy.redirect, shard_config::ProxyRedirect::Default);
                // A `Refresh` is rewritten from after its `url=`, as nginx's.
                let at = if is_location {
                    Some(0)
                } else {
                    v.to_ascii_lowercase().find("url=").map(|i| i + 4)
                };
                let mut new = match at {
                    Some(at) if !default_with_vars => {
                        shard_http::proxy::redirect_location(&v[at..], loc, pass, &render)
                            .map(|n| format!("{}{n}", &v[..at]))
                    }
                    _ => None,
                };
                // As nginx (`ngx_http_upstream_rewrite_location`): only a `Location` that
                // `proxy_redirect` rewrote becomes the response's redirect, made absolute per
                // `absolute_redirect`; one passed as the upstream wrote it (FastCGI's always)
                // stays as it is, relative or not.
                if is_location {
                    if let Some(cur) = new.as_deref() {
                        if let Some(abs) = self.absolute_redirect(key, loc, &p.req, cur) {
                            new = Some(abs);
                        }
                    }
                }
                if let Some(n) = new {
                    *value = n.into_bytes();
                }
            }
        }
        // `proxy_cookie_flags`, then `proxy_cookie_domain` and `proxy_cookie_path`.
        let pc = &loc.proxy;
        if !pc.cookie_flags.is_empty() || !pc.cookie_domain.is_empty() || !pc.cookie_path.is_empty()
        {
            let render = |parts: &[shard_config::Part], caps: shard_http::proxy::Groups<'_>| {
                self.render_with_captures(key, &p.req, &p.head, loc, parts, caps)
            };
            let plain = |parts: &[shard_config::Part]| render(parts, None);
            for (name, value) in &mut head.headers {
                if !name.eq_ignore_ascii_case("set-cookie") {
                    continue;
                }
                // Each rewrite reads the cookie only when it has rules.
                let flags = (!pc.cookie_flags.is_empty())
                    .then(|| shard_http::proxy::set_cookie_flags(value, &pc.cookie_flags, &plain))
                    .flatten();
                if let Some(v) = flags {
                    *value = v;
                }
                let moved = (!pc.cookie_domain.is_empty() || !pc.cookie_path.is_empty())
                    .then(|| {
                        shard_http::proxy::rewrite_set_cookie(
                            value,
                            &pc.cookie_domain,
                            &pc.cookie_path,
                            &render,
                        )
                    })
                    .flatten();
                if let Some(v) = moved {
                    *value = v;
                }
            }
        }
        // `charset`: added to a proxied Content-Type that has none, as nginx's filter does;
        // the body recoded from `source_charset` (or, with `override_charset on`, from the
        // charset the upstream named) where a `charset_map` joins them, not when encoded.
        p.recode = None;
        // `X-Accel-Charset` (unless ignored): the charset the client gets, over `charset`
        // and whatever the types say, as nginx's `override_charset` header.
        let accel_charset = head
            .accel_charset
            .then(|| raw_header(&p.rbuf[..head_len], "x-accel-charset"))
            .flatten()
            .filter(|_| loc.proxy.ignore_headers & shard_config::ignore::X_ACCEL_CHARSET == 0)
            .map(|v| String::from_utf8_lossy(v).trim().to_string())
            .filter(|v| !v.is_empty());
        if let Some(dst) = accel_charset {
            self.accel_charset(key, p, loc, &mut head, &dst);
        } else if let Some(dst) = loc.charset.as_deref() {
            let encoded = head
                .headers
                .iter()
                .any(|(n, _)| n.eq_ignore_ascii_case("content-encoding"));
            let maps = &self.http().charset_maps;
            for (name, value) in &mut head.headers {
                if !name.eq_ignore_ascii_case("content-type") {
                    continue;
                }
                let ct = String::from_utf8_lossy(value).into_owned();
                if let Some(cs) = shard_http::response::charset_for(loc, &ct) {
                    value.extend_from_slice(b"; charset=");
                    value.extend_from_slice(cs.as_bytes());
                    if let Some(src) = loc.source_charset.as_deref().filter(|_| !encoded) {
                        p.recode = shard_config::recode_table(maps, src, dst).map(Into::into);
                    }
                } else if loc.override_charset && !encoded {
                    let Some((ty, src)) = shard_http::response::named_charset(&ct) else {
                        continue;
                    };
                    if !shard_http::response::charset_type(loc, ty) {
                        continue;
                    }
                    if let Some(t) = shard_config::recode_table(maps, src, dst) {
                        p.recode = Some(std::sync::Arc::new(t));
                        *value = format!("{ty}; charset={dst}").into_bytes();
                    }
                }
            }
        }
        // `gunzip on`: a gzip-encoded answer is decompressed for a client that does not take
        // gzip (its length then unknown); `gzip_vary` names `Accept-Encoding` either way.
        p.gunzip = None;
        let gzipped = loc.gzip.gunzip
            && head.headers.iter().any(|(n, v)| {
                n.eq_ignore_ascii_case("content-encoding")
                    && String::from_utf8_lossy(v)
                        .trim()
                        .eq_ignore_ascii_case("gzip")
            });
        if gzipped {
            if loc.gzip.vary
                && !head.headers.iter().any(|(n, v)| {
                    n.eq_ignore_ascii_case("vary") && v.eq_ignore_ascii_case(b"accept-encoding")
                })
            {
                head.headers
                    .push(("Vary".to_string(), b"Accept-Encoding".to_vec()));
            }
            if !super::respond::gzip_ok(loc, &p.req) {
                head.headers
                    .retain(|(n, _)| !n.eq_ignore_ascii_case("content-encoding"));
                if head.framing != Framing::None {
                    p.gunzip = Some(Box::new(flate2::write::MultiGzDecoder::new(Vec::new())));
                }
            }
        }
        // `sub_filter`: on a body not (or no longer) encoded, of a type it applies to; the
        // validators go (a weak `ETag` stays with `sub_filter_last_modified on`).
        p.sub = None;
        if !loc.sub_filter.pairs.is_empty()
            && head.framing != Framing::None
            && !head
                .headers
                .iter()
                .any(|(n, _)| n.eq_ignore_ascii_case("content-encoding"))
        {
            let ct = head
                .headers
                .iter()
                .find(|(n, _)| n.eq_ignore_ascii_case("content-type"))
                .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
                // `sub_filter_types *` takes an answer without a type too (nginx's test of the
                // type passes any response when the list is `*`).
                .or_else(|| loc.sub_filter.any_type.then(String::new));
            if let Some(f) = ct.and_then(|ct| self.sub_filter_for(key, &p.req, &p.head, loc, &ct)) {
                p.sub = Some(Box::new(f));
                if loc.sub_filter.last_modified {
                    for (n, v) in &mut head.headers {
                        if n.eq_ignore_ascii_case("etag") && !v.starts_with(b"W/") {
                            v.splice(0..0, b"W/".iter().copied());
                        }
                    }
                } else {
                    head.headers.retain(|(n, _)| {
                        !n.eq_ignore_ascii_case("last-modified") && !n.eq_ignore_ascii_case("etag")
                    });
                }
            }
        }
        // `proxy_store`: a 200 answer to `GET` is saved as a file, written to a temporary name
        // beside it and renamed once whole (an answer cut short leaves nothing).
        p.store = None;
        if let Some(store) = loc.proxy.store.as_ref().filter(|_| {
            head.status == 200
                && p.req.method == Method::Get
                && !p.background
                && head.framing != Framing::None
        }) {
            let dest = match store {
                shard_config::Store::Mapped => shard_http::static_file::map_path(loc, &p.req.path),
                shard_config::Store::Path(parts) => {
                    std::path::PathBuf::from(self.render(key, &p.req, &p.head, loc, parts))
                }
            };
            let last_modified = head
                .headers
                .iter()
                .find(|(n, _)| n.eq_ignore_ascii_case("last-modified"))
                .and_then(|(_, v)| httpdate::parse_http_date(&String::from_utf8_lossy(v)).ok());
            match StoreFile::create(dest, loc.proxy.store_access, last_modified) {
                Ok(f) => p.store = Some(Box::new(f)),
                Err((path, e)) => crate::log!(
                    Crit,
                    "open() \"{}\" failed ({}){}",
                    path.display(),
                    shard_event::os_error_text(&e),
                    self.log_context(key, Some(&p.req))
                ),
            }
        }
        // `ssi`: the answer leaves through an SSI pipe (`ssi.rs`), which reads it as it is
        // written; not an encoded one, and not compressed here then (the pipe sees the
        // bytes gzip would make).
        let ssi = super::ssi::may_filter(loc)
            && head.status != 101
            && !head
                .headers
                .iter()
                .any(|(n, _)| n.eq_ignore_ascii_case("content-encoding"))
            && self.filter_begin(
                key,
                &p.req,
                &p.head,
                loc,
                head.headers
                    .iter()
                    .find(|(n, _)| n.eq_ignore_ascii_case("content-type"))
                    .and_then(|(_, v)| std::str::from_utf8(v).ok()),
                head.status,
            );
        // `gzip`: the answer compressed as it streams, as nginx's gzip filter does for any
        // response (after `sub_filter`; `Vary` with `gzip_vary` whenever gzip applies).
        p.gzip = None;
        if loc.gzip.enabled && !ssi && head.framing != Framing::None && head.status != 101 {
            let field = |name: &str| {
                head.headers
                    .iter()
                    .find(|(n, _)| n.eq_ignore_ascii_case(name))
                    .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
            };
            let ct = field("content-type");
            let encoded = field("content-encoding").is_some();
            let cc = field("cache-control")
                .unwrap_or_default()
                .to_ascii_lowercase();
            let traits = shard_http::gzip::ResponseTraits {
                last_modified: field("last-modified").is_some(),
                etag: field("etag").is_some(),
                expired: field("expires").is_some_and(|e| {
                    httpdate::parse_http_date(e.trim())
                        .map_or(true, |t| t <= std::time::SystemTime::now())
                }),
                no_cache: cc.contains("no-cache"),
                no_store: cc.contains("no-store"),
                private: cc.contains("private"),
            };
            let len = match head.framing {
                Framing::Length(n) if p.sub.is_none() => {
                    n.min(shard_http::gzip::GZIP_MAX_FILE_BYTES)
                }
                _ => loc.gzip.min_length,
            };
            let g = shard_http::gzip::decide_for(
                &loc.gzip,
                &p.req,
                head.status,
                ct.as_deref(),
                len,
                &traits,
            );
            let vary_named = head.headers.iter().any(|(n, v)| {
                n.eq_ignore_ascii_case("vary")
                    && String::from_utf8_lossy(v)
                        .to_ascii_lowercase()
                        .contains("accept-encoding")
            });
            if g.vary && !vary_named && !encoded {
                head.headers.push((
                    "Vary".to_string(),
                    shard_http::gzip::VARY.as_bytes().to_vec(),
                ));
            }
            if g.compress && !encoded && p.gunzip.is_none() {
                let level = flate2::Compression::new(loc.gzip.comp_level);
                p.gzip = Some(Box::new(flate2::write::GzEncoder::new(Vec::new(), level)));
                head.headers.retain(|(n, _)| {
                    !n.eq_ignore_ascii_case("content-length")
                        && !n.eq_ignore_ascii_case("accept-ranges")
                });
                for (n, v) in &mut head.headers {
                    if n.eq_ignore_ascii_case("etag") && !v.starts_with(b"W/") {
                        v.splice(0..0, b"W/".iter().copied());
                    }
                }
                head.headers.push((
                    "Content-Encoding".to_string(),
                    shard_http::gzip::ENCODING.as_bytes().to_vec(),
                ));
            }
        }
        if let Some(u) = p.up {
            let (upstream, peer) = (self.upconns[u].upstream, self.upconns[u].peer);
            balance::succeeded(&mut self.http_peer_state[upstream], peer);
        }
        p.rbuf.drain(..head_len);
        // `chunked_transfer_encoding off`: a body of unknown length ends with the connection,
        // as for an HTTP/1.0 client.
        // Decompressed, the body's length is not the upstream's.
        let mut framing = match head.framing {
            Framing::Length(_) if p.gunzip.is_some() || p.sub.is_some() || p.gzip.is_some() => {
                Framing::Close
            }
            f => f,
        };
        // A cached location answers one `Range` of a live 200 as nginx's range filter does
        // (the whole answer is still read and stored).
        p.window = None;
        if let Some((a, b, n)) = self.cache_live_range(p, &head, framing) {
            head.status = 206;
            head.headers
                .retain(|(n, _)| !n.eq_ignore_ascii_case("content-range"));
            head.headers.push((
                "Content-Range".to_string(),
                format!("bytes {a}-{b}/{n}").into_bytes(),
            ));
            framing = Framing::Length(b - a + 1);
            p.window = Some((a, b + 1, 0));
        }
        // An SSI or addition pipe reads the body and frames it again for the client: it
        // needs to see where the body ends, so it gets chunks whatever the client speaks.
        let piped = self.conns[key].rd().ssi.is_some();
        let (mut client_framing, reusable) = shard_http::proxy::client_framing(
            framing,
            (p.req.minor_version >= 1 && loc.chunked_transfer_encoding) || piped,
        );
        // `add_trailer`: chunked even when the length is known, as nginx.
        p.trailers = !loc.add_trailers.is_empty()
            && head.status != 101
            && head.framing != Framing::None
            && super::trailers::expected(loc, &p.req, head.status);
        if p.trailers {
            client_framing = Framing::Chunked;
        }
        p.keep_alive &= reusable;
        p.client_chunked =
            client_framing == Framing::Chunked && !(p.upstream_get && p.req.method == Method::Head);
        if let Some(c) = p.cache.as_ref().filter(|_| !p.background) {
            self.conns[key].rq().cache_status = c.status.as_str();
        }
        p.upbody = match head.framing {
            Framing::None => UpBody::None,
            Framing::Length(n) => UpBody::Length(n),
            Framing::Chunked => {
                let mut dec = ChunkedDecoder::new();
                if p.grpc {
                    // gRPC's status is in the trailers: they go on (nginx's `pass_trailers`).
                    dec.keep_trailers(GRPC_TRAILERS_MAX);
                }
                UpBody::Chunked(dec)
            }
            Framing::Close => UpBody::Close,
        };
        p.upstream_reusable = head.reusable;
        self.slice_started(p, head.status);
        if p.fcgi.is_some() {
            // Decided at the end: `fastcgi_keep_conn on` and a clean `END_REQUEST`.
            p.upstream_reusable = loc.fastcgi.as_ref().is_some_and(|f| f.keep_conn);
        }
        p.status = head.status;
        if let Some(a) = p.attempts.last_mut() {
            a.status = Some(head.status);
            a.header_ms = Some(self.cx.now_ms.saturating_sub(p.attempt_started_ms));
        }
        p.head_sent = true;
        let loc = self.proxy_location(p);
        // `expires` replaces the upstream's `Expires` and `Cache-Control`, as nginx's
        // `ngx_http_set_expires` does (it keeps one line and clears the rest).
        if matches!(loc.expires, Some(ref e) if !matches!(e, shard_config::Expires::Var(_)))
            && shard_http::response::headers_apply(head.status)
        {
            head.headers.retain(|(n, _)| {
                !n.eq_ignore_ascii_case("cache-control") && !n.eq_ignore_ascii_case("expires")
            });
        }
        let mut extra = Vec::new();
        // The userid module's cookie (its filter runs before `add_header`'s).
        if let Some(u) = self.conns[key].rd().uid_header.as_deref() {
            extra.extend_from_slice(u);
        }
        let if_headers = self.conns[key].rq().if_headers.clone();
        if loc.expires.is_some() || !loc.add_headers.is_empty() || if_headers.is_some() {
            let mut storage = shard_http::vars::header_storage();
            let hs = shard_http::vars::request_headers(&p.head, &mut storage);
            let mut ctx = self.var_ctx(key, &p.req, hs, loc);
            ctx.done = Some(shard_http::vars::Done {
                status: head.status,
                upstream: &p.attempts,
                cache_status: p.cache.as_ref().map_or("", |c| c.status.as_str()),
                ..Default::default()
            });
            ctx.conn.request_body = body_in_memory(p);
            ctx.conn.request_body_file = Some(&p.body);
            // `expires modified`: from the upstream's `Last-Modified`, as nginx's.
            let mtime = head
                .headers
                .iter()
                .find(|(n, _)| n.eq_ignore_ascii_case("last-modified"))
                .and_then(|(_, v)| std::str::from_utf8(v).ok())
                .and_then(|v| httpdate::parse_http_date(v.trim()).ok())
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .and_then(|d| i64::try_from(d.as_secs()).ok());
            shard_http::response::write_extra(
                &mut extra,
                loc,
                if_headers.as_deref(),
                head.status,
                self.cx.now_secs,
                mtime,
                Some(&ctx),
            );
        }
        // `proxy_pass_header Server` / `Date`: the upstream's or none, as nginx.
        let passes = |n: &str| loc.proxy.pass_headers.iter().any(|h| h == n);
        let server = if passes("server") {
            &b""[..]
        } else {
            shard_http::response::server_value(loc)
        };
        let date: &[u8] = if passes("date") { b"" } else { &self.cx.date };
        let c = &mut self.conns[key];
        if c.out_pos > 0 && c.out_pos >= c.out.len() {
            c.out.clear();
            c.out_pos = 0;
        }
        // A background update writes nothing to the client.
        let mut sink = Vec::new();
        let head_at = c.out.len();
        shard_http::proxy::write_client_head(
            if p.background { &mut sink } else { &mut c.out },
            &head,
            date,
            client_framing,
            p.keep_alive,
            server,
            &extra,
        );
        if let Some(secs) = loc.keepalive_header.filter(|_| !p.background) {
            let sent = c.out_pos;
            super::conn::keep_alive_header(&mut c.out, sent, head_at, secs);
        }
        // `$bytes_sent` and `$sent_http_NAME` of the access log: the head as written.
        if !p.background && !loc.access_logs.is_empty() {
            let written = &c.out[head_at..];
            let wants_head = loc.access_logs.iter().any(|al| al.format.reads_sent_http);
            let len = written.len() as u64;
            let copy = if wants_head {
                written.to_vec()
            } else {
                Vec::new()
            };
            c.rq().head_bytes = len;
            c.rq().sent_head = copy;
        }
        if head.status == 101 {
            // Switched: what either side sent behind the heads starts the pipes.
            p.keep_alive = false;
            p.upstream_reusable = false;
            let t = Tunnel::new(loc.proxy.buffer_size, &c.inbuf, &p.rbuf);
            c.inbuf.clear();
            p.rbuf.clear();
            p.tunnel = Some(Box::new(t));
            p.state = State::Tunnel;
            self.set_proxy_deadline(key, loc.proxy.read_timeout_ms);
            return;
        }
        p.state = State::ReadingBody;
    }

    /// One turn of an upgraded connection: bytes both ways, then the timeout that runs now.
    fn run_tunnel(&mut self, key: usize, p: &mut Proxy) -> Flow {
        let (Some(u), Some(mut t)) = (p.up, p.tunnel.take()) else {
            return Flow::Close;
        };
        let pumped = self.pump_tunnel(key, u, &mut t);
        p.body_sent = t.bytes_to_client();
        let waiting = t.waiting(
            self.conns[key].writable,
            self.conns[key].tls.as_ref().is_some_and(|t| t.has_output()),
            self.upconns[u].writable,
            self.upconns[u].tls_pending(),
        );
        p.tunnel = Some(t);
        match pumped {
            Pumped::Done => Flow::Finished,
            Pumped::Failed(op, e) => {
                let msg = format!(
                    "{op} failed ({}) while proxying upgraded connection",
                    os(&e)
                );
                self.log_proxy_error_current(key, p, &msg);
                Flow::Abort
            }
            Pumped::Wait { moved, yielded } => {
                if moved {
                    let pc = &self.proxy_location(p).proxy;
                    let timeout = match waiting {
                        Waiting::UpstreamWrite => pc.send_timeout_ms,
                        Waiting::ClientWrite => self.conns[key].rq().send_timeout_ms,
                        Waiting::Read => pc.read_timeout_ms,
                    };
                    self.set_proxy_deadline(key, timeout);
                }
                if yielded {
                    self.yield_conn(key);
                } else {
                    self.ensure_registered(key);
                }
                Flow::Wait
            }
        }
    }

    /// Moves response body bytes from `rbuf` to the client's output; reads more while the
    /// output holds less than the buffer bound.
    fn relay_response_body(&mut self, key: usize, p: &mut Proxy) -> Flow {
        if let Some(flow) = p.grpc.then(|| self.grpc_pump(key, p)).flatten() {
            return flow;
        }
        // A cached entry whose body needs no filter goes out as a file body.
        if let Some(flow) = self.cache_send_file(key, p) {
            return flow;
        }
        let loc = self.proxy_location(p);
        let pc = &loc.proxy;
        let bound = if pc.buffering {
            pc.buffer_size + pc.buffers.0 * pc.buffers.1
        } else {
            pc.buffer_size
        };
        let mut rounds = 0;
        loop {
            rounds += 1;
            if rounds > super::TURN_ROUNDS_MAX {
                // Upstream and client both keep up: go on after the other connections.
                self.yield_conn(key);
                return Flow::Wait;
            }
            // Pass on what was read.
            match self.pass_body(key, p) {
                Ok(true) => return Flow::Finished,
                Ok(false) => {}
                Err(why) => {
                    self.log_proxy_error_current(key, p, why);
                    return Flow::Abort;
                }
            }
            // Write what waits for the client.
            let c = &self.conns[key];
            if c.has_output() {
                match self.flush(key) {
                    Flush::Failed => return Flow::Close,
                    Flush::Blocked | Flush::Yield => {
                        self.ensure_registered(key);
                    }
                    Flush::Done => {}
                }
            }
            let c = &mut self.conns[key];
            let pending = c.out.len() - c.out_pos;
            if pending >= bound {
                // Backpressure: the client's send timeout runs.
                return Flow::Wait;
            }
            if c.out_pos > 0 {
                c.out.drain(..c.out_pos);
                c.out_pos = 0;
            }
            let mut room = (bound - pending).max(READ_MIN_BYTES);
            if pc.limit_rate > 0 && pc.buffering {
                // `proxy_limit_rate`: no more than this second's share; the read waits on a
                // timer for the next (`proxy_timeout`).
                if p.up_rate.start_ms == 0 {
                    p.up_rate.start_ms = self.cx.now_ms;
                }
                let (allowed, next_ms) = p.up_rate.allowance(pc.limit_rate, self.cx.now_ms);
                if allowed == 0 {
                    p.up_rate.resume_ms = next_ms;
                    let wait = next_ms.saturating_sub(self.cx.now_ms);
                    self.set_proxy_deadline(key, wait.min(pc.read_timeout_ms));
                    return Flow::Wait;
                }
                room = room.min(usize::try_from(allowed).unwrap_or(usize::MAX));
            }
            let before = p.rbuf.len();
            let read = self.read_upstream(p, room);
            p.up_rate.read += p.rbuf.len().saturating_sub(before) as u64;
            match read {
                Ok(None) => {
                    if self.conns[key].out.is_empty() {
                        self.set_proxy_deadline(key, pc.read_timeout_ms);
                    }
                    return Flow::Wait;
                }
                Ok(Some(0)) => {
                    if matches!(p.upbody, UpBody::Close) {
                        // FastCGI's END_REQUEST leaves the connection as `keep_conn` says.
                        p.upstream_reusable &= p.fcgi.is_some();
                        if self.finish_passing(key, p).is_err() {
                            self.log_proxy_error_current(
                                key,
                                p,
                                "upstream sent invalid gzip response while reading upstream",
                            );
                            return Flow::Abort;
                        }
                        if p.client_chunked {
                            let last = self.proxy_last_chunk(key, p);
                            self.conns[key].out.extend_from_slice(&last);
                        }
                        return Flow::Finished;
                    }
                    self.log_proxy_error_current(
                        key,
                        p,
                        "upstream prematurely closed connection while reading upstream",
                    );
                    return Flow::Abort;
                }
                Ok(Some(_)) => {
                    self.set_proxy_deadline(key, pc.read_timeout_ms);
                    let _ = self.fcgi_stderr(key, p, false);
                }
                Err(e) => {
                    let msg = recv_failed(&e, "while reading upstream");
                    self.log_proxy_error_current(key, p, &msg);
                    return Flow::Abort;
                }
            }
        }
    }

    /// Moves `rbuf` into the client's output per the framings. `Ok(true)`: the upstream body
    /// is complete.
    fn pass_body(&mut self, key: usize, p: &mut Proxy) -> Result<bool, &'static str> {
        let done = self.pass_body_framed(key, p)?;
        if let Some(a) = p.attempts.last_mut() {
            a.response_length = p.body_sent;
        }
        if done && p.client_chunked {
            let last = self.proxy_last_chunk(key, p);
            self.conns[key].out.extend_from_slice(&last);
        }
        Ok(done)
    }

    /// The last chunk of a chunked response to the client, with `add_trailer`'s fields
    /// rendered now (`$upstream_response_length` and the clock at the end).
    fn proxy_last_chunk(&self, key: usize, p: &Proxy) -> Vec<u8> {
        let passed = match &p.upbody {
            UpBody::Chunked(dec) if p.grpc => dec.trailers_kept(),
            _ => &[],
        };
        if !p.trailers && passed.is_empty() {
            return shard_http::proxy::LAST_CHUNK.to_vec();
        }
        let loc = self.proxy_location(p);
        let mut out = if p.trailers {
            self.last_chunk(
                key,
                &p.req,
                &p.head,
                loc,
                p.status,
                p.body_sent,
                &p.attempts,
                &[],
            )
        } else {
            shard_http::proxy::LAST_CHUNK.to_vec()
        };
        // The upstream's trailers (`grpc_pass`) before the blank line that ends them all.
        out.truncate(out.len() - 2);
        for line in passed.split(|&b| b == b'\n') {
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            if !line.is_empty() {
                out.extend_from_slice(line);
                out.extend_from_slice(b"\r\n");
            }
        }
        out.extend_from_slice(b"\r\n");
        out
    }

    /// [`Worker::pass_body`] without the last chunk.
    fn pass_body_framed(&mut self, key: usize, p: &mut Proxy) -> Result<bool, &'static str> {
        let c = &mut self.conns[key];
        // A HEAD asked upstream as GET: the body is stored, not sent.
        let mut sink = Vec::new();
        let discard = p.background || (p.upstream_get && p.req.method == Method::Head);
        let mut emit = Emit {
            out: if discard { &mut sink } else { &mut c.out },
            chunked: p.client_chunked,
            recode: p.recode.as_deref(),
            gunzip: p.gunzip.as_deref_mut(),
            sub: p.sub.as_deref_mut(),
            gzip: p.gzip.as_deref_mut(),
        };
        let storing = p.cache.as_ref().is_some_and(|c| c.storing());
        match &mut p.upbody {
            UpBody::None => {
                if !p.rbuf.is_empty() {
                    p.upstream_reusable = false;
                }
                Ok(true)
            }
            UpBody::Length(left) => {
                let take = (*left).min(p.rbuf.len() as u64) as usize;
                if storing {
                    cache::store(&mut p.cache, &p.rbuf[..take]);
                }
                StoreFile::write(&mut p.store, &p.rbuf[..take]);
                let part = window_of(&mut p.window, take);
                p.body_sent += emit.data(&mut p.rbuf[part])?;
                *left -= take as u64;
                p.rbuf.drain(..take);
                if *left == 0 {
                    if !p.rbuf.is_empty() {
                        p.upstream_reusable = false;
                    }
                    p.body_sent += emit.finish()?;
                    return Ok(true);
                }
                Ok(false)
            }
            UpBody::Chunked(dec) => {
                p.scratch.clear();
                let feed = dec
                    .feed_into(&p.rbuf, &mut p.scratch)
                    .map_err(|_| "upstream sent invalid chunked response")?;
                p.rbuf.drain(..feed.consumed);
                if storing {
                    cache::store(&mut p.cache, &p.scratch);
                }
                StoreFile::write(&mut p.store, &p.scratch);
                p.body_sent += emit.data(&mut p.scratch)?;
                if dec.is_done() {
                    if !p.rbuf.is_empty() {
                        p.upstream_reusable = false;
                    }
                    p.body_sent += emit.finish()?;
                    return Ok(true);
                }
                Ok(false)
            }
            UpBody::Close => {
                if storing {
                    cache::store(&mut p.cache, &p.rbuf);
                }
                StoreFile::write(&mut p.store, &p.rbuf);
                p.body_sent += emit.data(&mut p.rbuf)?;
                p.rbuf.clear();
                Ok(false)
            }
        }
    }

    /// The end of a body that ends with the upstream's close: what `gunzip` still holds.
    fn finish_passing(&mut self, key: usize, p: &mut Proxy) -> Result<(), &'static str> {
        let c = &mut self.conns[key];
        let mut emit = Emit {
            out: &mut c.out,
            chunked: p.client_chunked,
            recode: p.recode.as_deref(),
            gunzip: p.gunzip.as_deref_mut(),
            sub: p.sub.as_deref_mut(),
            gzip: p.gzip.as_deref_mut(),
        };
        p.body_sent += emit.finish()?;
        Ok(())
    }

    /// The upstream response is complete: release the upstream connection, log, and hand the
    /// client connection back to the keep-alive logic.
    fn finish_response(&mut self, key: usize, mut p: Box<Proxy>) {
        if let Some(mut f) = p.fcgi.take() {
            // A body with `Content-Length` may end before `END_REQUEST` was read: the
            // connection is reused only once it was (what is already there is looked at).
            let mut sink = Vec::new();
            for _ in 0..FCGI_TAIL_READS {
                if f.decoder.is_done() || !p.upstream_reusable {
                    break;
                }
                sink.clear();
                if !matches!(self.read_fcgi(p.up, &mut f, &mut sink, 64), Ok(Some(0))) {
                    break;
                }
            }
            p.upstream_reusable &= f.decoder.is_done() && f.raw.is_empty() && sink.is_empty();
            p.fcgi = Some(f);
            let _ = self.fcgi_stderr(key, &mut p, false);
        }
        if p.grpc {
            // Kept only with the stream ended both ways and every answer (a SETTINGS ack
            // read with the response) written.
            let flushed = p.up.is_some_and(|u| matches!(self.grpc_flush(u), Ok(true)));
            p.upstream_reusable = flushed
                && p.up
                    .and_then(|u| self.upconns[u].grpc.as_ref())
                    .is_some_and(|g| g.reusable());
        }
        self.cache_commit(&mut p);
        if let Some(f) = p.store.take() {
            if let Err((path, e)) = f.commit() {
                crate::log!(
                    Crit,
                    "rename() \"{}\" failed ({})",
                    path.display(),
                    shard_event::os_error_text(&e)
                );
            }
        }
        if !p.keep_alive {
            self.conns[key].close_after = true;
        }
        if let Some(u) = p.up {
            if p.upstream_reusable && !p.body_cut {
                self.pool_upconn(u);
            } else {
                self.close_upconn(u);
            }
        }
        // A background update's client was logged when its answer was complete.
        if !p.background {
            self.log_proxy_access(key, &p, p.status, p.body_sent);
        }
        self.give_proxy_bufs(p);
    }

    /// A failure after the head reached the client: the client sees a truncated response
    /// (what was already received still goes out; nothing more follows it).
    fn abort_response(&mut self, key: usize, p: Box<Proxy>) {
        if let Some(u) = p.up {
            self.close_upconn(u);
        }
        self.log_proxy_access(key, &p, p.status, p.body_sent);
        let c = &mut self.conns[key];
        c.close_after = true;
        // A truncated response must not end with close_notify, which says it is whole.
        if let Some(t) = c.tls.as_mut() {
            t.quiet = true;
        }
        self.give_proxy_bufs(p);
    }

    /// Gives back a proxied request's buffers and its body (memory and temporary file).
    pub(super) fn give_proxy_bufs(&mut self, p: Box<Proxy>) {
        let Proxy {
            rbuf,
            scratch,
            head,
            body,
            fcgi,
            ..
        } = *p;
        self.spool_release(body);
        if let Some(f) = fcgi {
            self.give_buf(f.raw);
        }
        self.give_buf(rbuf);
        self.give_buf(scratch);
        self.give_buf(head);
    }

    /// Whether another attempt could go to a peer not tried yet (within
    /// `proxy_next_upstream_tries`), whatever their failure state.
    fn peer_left(&self, p: &Proxy) -> bool {
        let Some(pass) = self.proxy_pass(p) else {
            return false;
        };
        let tries_max = self.proxy_location(p).proxy.next_upstream_tries;
        if tries_max > 0 && p.tries >= tries_max {
            return false;
        }
        let ups = self.ups(pass.upstream);
        let peers = &ups.peers;
        peers
            .iter()
            .zip(&p.tried)
            .any(|(peer, &tried)| !tried && !peer.down)
    }

    /// A streamed body that began to be sent or read cannot be sent again: no other attempt,
    /// and an upstream's error status is passed on, as nginx (`request_sent &&
    /// request_body_no_buffering`).
    fn stream_spent(&self, key: usize, p: &Proxy) -> bool {
        p.streaming
            && (p.upreq_pos > 0
                || matches!(p.state, State::ReadingHead)
                || self.conns[key].rd().body_bytes > 0)
    }

    /// The current attempt failed before the response head went to the client.
    fn attempt_failed(&mut self, key: usize, p: &mut Proxy, why: Failure, msg: &str) -> Flow {
        if let Some(a) = p.attempts.last_mut() {
            a.response_ms = Some(self.cx.now_ms.saturating_sub(p.attempt_started_ms));
            if let Failure::Status(st) = why {
                a.status = Some(st);
            } else if why == Failure::Timeout {
                a.status = Some(504);
            }
        }
        self.log_proxy_error_current(key, p, msg);
        let sent = p.upreq_pos > 0 || matches!(p.state, State::ReadingHead);
        let spent = self.stream_spent(key, p);
        let reused = p.reused && !spent;
        let nothing_back = p.rbuf.is_empty();
        p.reused = false;
        if let Some((u, upstream, peer)) =
            p.up.take()
                .and_then(|u| self.upconns.get(u).map(|uc| (u, uc.upstream, uc.peer)))
        {
            self.close_upconn(u);
            // A pooled connection the peer closed while idle says nothing about the peer: try
            // again on a fresh connection, whatever the method (nothing was processed).
            if reused && why == Failure::Error && nothing_back {
                p.state = State::Connect;
                p.retry_peer = Some(peer);
                p.rbuf.clear();
                return Flow::Next;
            }
            if why.counts_against_peer() {
                self.proxy_peer_failed(upstream, peer);
            }
        }
        let loc = self.proxy_location(p);
        if spent {
            p.last_failure = Some(why);
            return no_more_peers(p, why.status());
        }
        retry_or_fail(p, loc, why, sent)
    }

    /// `X-Accel-Redirect`: the upstream's answer is dropped (its connection closed) and the
    /// request goes through the phases again at the target, with GET (a HEAD stays HEAD),
    /// as nginx's internal redirect; a few of the upstream's headers go with it.
    fn proxy_accel_redirect(&mut self, key: usize, mut p: Box<Proxy>) {
        if let Some(u) = p.up.take() {
            self.close_upconn(u);
        }
        let Some(accel) = p.accel.take() else {
            self.proxy_fail_reply(key, p, 502);
            return;
        };
        let (target, passed) = *accel;
        // The redirected request still sees the answer that sent it (`$upstream_http_*`).
        self.conns[key].rq().upstream_tries = p.attempts.clone();
        self.conns[key].rq().request_body = body_in_memory(&p).to_vec();
        // nginx unescapes the target's path and refuses an unsafe one (`..` segments, NUL)
        // with a 404 (`ngx_http_parse_unsafe_uri`).
        let Some(target) = accel_target(&target) else {
            self.log_proxy_error_current(key, &p, &format!("unsafe URI \"{target}\" was detected"));
            self.proxy_fail_reply(key, p, 404);
            return;
        };
        let keep = shard_http::proxy::error_keeps_connection(
            200,
            p.keep_alive,
            self.conns[key].body_pending(),
        );
        let mut req = p.req.clone();
        let head = std::mem::take(&mut p.head);
        let server = p.server;
        self.give_proxy_bufs(p);
        if req.method != shard_http::request::Method::Head {
            req.method = shard_http::request::Method::Get;
        }
        self.conns[key].rq().accel_headers =
            (!passed.is_empty()).then(|| passed.into_boxed_slice());
        let cfg = self.cx.cfg;
        let Some(srv) = cfg.http.as_ref().map(|h| &h.servers[server]) else {
            return;
        };
        let loc = self.redirect(key, srv, super::conn::Redirect::parse(&target), &mut req);
        self.run_phases(
            key,
            server,
            loc,
            super::conn::Phases {
                req,
                head,
                hops: 1,
                keep_alive: keep,
                more_input: false,
                forced: None,
                rewritten: None,
                after_upstream: false,
            },
        );
    }

    /// Ends the proxied request with an error page (nothing of a response was sent yet).
    fn proxy_fail_reply(&mut self, key: usize, mut p: Box<Proxy>, status: u16) {
        if let Some(u) = p.up.take() {
            self.close_upconn(u);
        }
        let keep = shard_http::proxy::error_keeps_connection(
            status,
            p.keep_alive,
            self.conns[key].body_pending(),
        );
        // nginx's `error_page` for a failed upstream (`error_page 502 504 /50x.html`): the
        // request goes through the phases again, answered with that status.
        let loc = self.proxy_location(&p);
        // `$upstream_*` in the error page (and its location) are the tries that led there,
        // and `$request_body` the body that went up.
        self.conns[key].rq().upstream_tries = p.attempts.clone();
        self.conns[key].rq().request_body = body_in_memory(&p).to_vec();
        // The body as read, for a proxied location the `error_page` may lead to: in its
        // file, or in memory (where the request went up whole). A streamed or FastCGI
        // body cannot be sent again.
        let c = &mut self.conns[key];
        c.rq().kept_body = if p.streaming || p.fcgi.is_some() || c.body_pending() {
            None
        } else if p.body.file().is_some() {
            Some(Box::new(std::mem::take(&mut p.body)))
        } else if p.req.body == Body::None || !c.rd().request_body.is_empty() {
            let mut kept = super::body::Spool::default();
            kept.mem = c.rd().request_body.clone();
            Some(Box::new(kept))
        } else {
            None
        };
        if !self.conns[key].rq().in_error_page
            && loc.error_pages.iter().any(|e| e.codes.contains(&status))
        {
            let req = p.req.clone();
            let head = std::mem::take(&mut p.head);
            let server = p.server;
            self.give_proxy_bufs(p);
            self.run_phases(
                key,
                server,
                loc,
                super::conn::Phases {
                    req,
                    head,
                    hops: 0,
                    keep_alive: keep,
                    more_input: false,
                    forced: Some(status),
                    rewritten: Some(super::conn::Rewritten::Stay),
                    after_upstream: true,
                },
            );
            return;
        }
        let loc = self.proxy_location(&p);
        // The location's `add_header ... always` (and those for this status) go with the page,
        // rendered with the tries that led to it.
        let extra = super::respond::extra_headers(
            self,
            key,
            &p.req,
            loc,
            &p.head,
            status,
            None,
            Some("text/html"),
        );
        self.error_page_with(key, status, keep, Some(loc), &extra);
        let len = shard_http::response::error_body(status).len() as u64;
        self.log_proxy_access(key, &p, status, len);
        self.give_proxy_bufs(p);
    }

    fn log_proxy_access(&mut self, key: usize, p: &Proxy, status: u16, bytes: u64) {
        let loc = self.proxy_location(p);
        if loc.access_logs.is_empty() {
            return;
        }
        let mut attempts = p.attempts.clone();
        if let Some(a) = attempts.last_mut().filter(|a| a.response_ms.is_none()) {
            a.response_ms = Some(self.cx.now_ms.saturating_sub(p.attempt_started_ms));
        }
        let body = (p.upreq_body_at > 0).then(|| &p.upreq[p.upreq_body_at.min(p.upreq.len())..]);
        self.log_access_body(key, loc, &p.req, status, bytes, &p.head, &attempts, body);
    }

    fn set_proxy_deadline(&mut self, key: usize, timeout_ms: u64) {
        let mut t = self.cx.now_ms + timeout_ms;
        // A response `limit_rate` holds back resumes first (`on_timeout`).
        if let Some(r) = self.conns[key]
            .rd()
            .rate
            .as_ref()
            .filter(|r| r.resume_ms != 0)
        {
            t = t.min(r.resume_ms);
        }
        self.set_conn_deadline(key, t);
    }

    /// The connection's deadline passed while proxying. Returns true when it was handled.
    pub(super) fn proxy_timeout(&mut self, key: usize) -> bool {
        let c = &mut self.conns[key];
        let id = c.id;
        let Some(mut p) = c.req.as_mut().and_then(|r| r.proxy.take()) else {
            return false;
        };
        let flow = match p.state {
            State::ReadBody => {
                // `client_body_timeout` passed between two reads of the body.
                crate::log!(
                    Info,
                    "client timed out (110: Connection timed out) while reading client request body"
                );
                Flow::Fail(408)
            }
            State::Connect => Flow::Next,
            State::Resolving => {
                // `resolver_timeout` passed without an answer.
                let host = p.dyn_host.clone().unwrap_or_default();
                self.log_proxy_error(
                    key,
                    &p,
                    &format!("{host} could not be resolved (110: Operation timed out)"),
                    None,
                );
                Flow::Fail(502)
            }
            State::StreamBody if p.stream_pos >= p.body.mem.len() => {
                crate::log!(
                    Info,
                    "client timed out (110: Connection timed out) while reading client request body"
                );
                Flow::Fail(408)
            }
            State::Connecting
            | State::Handshaking
            | State::Sending
            | State::StreamBody
            | State::ReadingHead => {
                let what = match p.state {
                    State::Connecting => "upstream timed out (110: Connection timed out) while connecting to upstream",
                    State::Handshaking => "upstream timed out (110: Connection timed out) while SSL handshaking to upstream",
                    State::Sending | State::StreamBody => "upstream timed out (110: Connection timed out) while sending request to upstream",
                    _ => "upstream timed out (110: Connection timed out) while reading response header from upstream",
                };
                // A timeout is never a stale pooled connection.
                p.reused = false;
                self.attempt_failed(key, &mut p, Failure::Timeout, what)
            }
            State::Tunnel => {
                let waiting = match (p.tunnel.as_ref(), p.up) {
                    (Some(t), Some(u)) => t.waiting(
                        self.conns[key].writable,
                        self.conns[key].tls.as_ref().is_some_and(|t| t.has_output()),
                        self.upconns[u].writable,
                        self.upconns[u].tls_pending(),
                    ),
                    _ => Waiting::Read,
                };
                if waiting == Waiting::ClientWrite {
                    crate::log!(
                        Info,
                        "client timed out (110: Connection timed out) while proxying upgraded connection"
                    );
                } else {
                    self.log_proxy_error_current(
                        key,
                        &p,
                        "upstream timed out (110: Connection timed out) while proxying upgraded connection",
                    );
                }
                Flow::Close
            }
            State::ReadingBody
                if p.up_rate.resume_ms != 0 && self.cx.now_ms >= p.up_rate.resume_ms =>
            {
                // A read `proxy_limit_rate` held back may go on.
                p.up_rate.resume_ms = 0;
                Flow::Next
            }
            State::ReadingBody => {
                let c = &self.conns[key];
                if c.has_output() {
                    crate::log!(
                        Info,
                        "client timed out (110: Connection timed out) while sending to client"
                    );
                } else {
                    self.log_proxy_error_current(
                        key,
                        &p,
                        "upstream timed out (110: Connection timed out) while reading upstream",
                    );
                }
                // Truncated: the client gets nothing more.
                Flow::Close
            }
        };
        // A background update's timeout ends the update, not the client's connection.
        let close_after_abort = matches!(flow, Flow::Close) && !p.background;
        let flow = if close_after_abort { Flow::Abort } else { flow };
        self.end_proxy_turn(key, id, p, flow);
        if close_after_abort {
            self.close(key);
        } else {
            self.drive(key);
        }
        true
    }

    fn proxy_peer_failed(&mut self, upstream: usize, peer: usize) {
        let ups = self.ups(upstream);
        let peers = &ups.peers;
        if balance::failed(
            peers,
            &mut self.http_peer_state[upstream],
            peer,
            self.cx.now_ms,
        ) {
            crate::log!(
                Warn,
                "upstream server temporarily disabled, upstream: \"{}\"",
                peers[peer].addr
            );
        }
    }

    /// An error-log line in nginx's shape: `MSG, client: A, server: NAME, request: "LINE",
    /// upstream: "http://PEER/URI", host: "HOST"` (`https://` for a TLS upstream).
    fn log_proxy_error(&self, key: usize, p: &Proxy, msg: &str, addr: Option<&str>) {
        self.log_proxy_at(shard_config::LogLevel::Error, key, p, msg, addr);
    }

    /// [`Worker::log_proxy_error`] at `level`.
    fn log_proxy_at(
        &self,
        level: shard_config::LogLevel,
        key: usize,
        p: &Proxy,
        msg: &str,
        addr: Option<&str>,
    ) {
        let c = &self.conns[key];
        let srv = &self.http().servers[p.server];
        let server_name = shard_http::route::server_name(srv);
        let upstream = match (addr, self.proxy_pass(p)) {
            // nginx: `fastcgi://127.0.0.1:9000`, `fastcgi://unix:/run/php.sock:` (`scgi://`,
            // `uwsgi://` the same).
            (Some(a), Some(pass))
                if p.fcgi.is_some() || self.proxy_location(p).gateway.is_some() =>
            {
                let tail = if a.starts_with("unix:") { ":" } else { "" };
                let wire = self
                    .proxy_location(p)
                    .gateway
                    .as_ref()
                    .map_or("fastcgi", |g| g.wire.name());
                // uwsgi over TLS: `suwsgi://`.
                let s = if pass.tls { "s" } else { "" };
                format!(", upstream: \"{s}{wire}://{a}{tail}\"")
            }
            // nginx: `grpc://127.0.0.1:50051` (`grpcs://` over TLS), no URI.
            (Some(a), Some(pass)) if p.grpc => {
                let s = if pass.tls { "s" } else { "" };
                format!(", upstream: \"grpc{s}://{a}\"")
            }
            (Some(a), Some(pass)) => {
                let uri = shard_http::proxy::upstream_uri(&p.req, self.proxy_location(p), &pass);
                let scheme = if pass.tls { "https" } else { "http" };
                format!(", upstream: \"{scheme}://{a}{uri}\"")
            }
            _ => String::new(),
        };
        // The `Host` as the client sent it, port and all, as nginx writes it.
        let host = p
            .req
            .host_as_sent()
            .map_or(String::new(), |h| format!(", host: \"{h}\""));
        crate::log_at!(
            level,
            "{msg}, client: {}, server: {server_name}, request: \"{}\"{upstream}{host}",
            c.peer.map_or("-".to_string(), |a| a.ip().to_string()),
            p.req.request_line,
        );
    }

    fn log_proxy_error_current(&self, key: usize, p: &Proxy, msg: &str) {
        self.log_proxy_current_at(shard_config::LogLevel::Error, key, p, msg);
    }

    /// A proxy log line naming the upstream connection in use, if any, at `level`.
    fn log_proxy_current_at(
        &self,
        level: shard_config::LogLevel,
        key: usize,
        p: &Proxy,
        msg: &str,
    ) {
        let addr = p.up.and_then(|u| {
            let uc = self.upconns.get(u)?;
            Some(self.ups(uc.upstream).peers[uc.peer].name.clone())
        });
        self.log_proxy_at(level, key, p, msg, addr.as_deref());
    }

    /// An event on an upstream connection.
    pub(super) fn on_upconn_event(&mut self, u: usize, generation: u32, ev: shard_event::Event) {
        let Some(uc) = self.upconns.get_mut(u) else {
            return;
        };
        if token::generation(uc.id) != generation {
            return; // registered for a connection that closed since
        }
        if ev.readable() {
            uc.readable = true;
        }
        if ev.writable() {
            uc.writable = true;
        }
        if ev.hup() {
            uc.hup = true;
        }
        match uc.owner {
            Some((key, id)) => {
                if self.conns.get(key).is_some_and(|c| c.id == id) {
                    self.drive(key);
                }
            }
            None => {
                // Idle in the pool: the peer closed it, or sent something unasked (a gRPC
                // upstream's control frames are answered, and the connection stays).
                if (ev.readable() || ev.hup()) && !self.grpc_idle_read(u) {
                    let upstream = self.upconns[u].upstream;
                    self.pools[upstream].retain(|&k| k != u);
                    self.close_upconn(u);
                }
            }
        }
    }

    /// The most recently pooled connection to `peer` of `upstream` that is still within
    /// `keepalive_timeout` (older ones met on the way are closed), taken out of the pool.
    fn take_pooled(&mut self, upstream: usize, peer: usize) -> Option<usize> {
        let timeout = self.ups(upstream).keepalive_timeout_ms;
        while let Some(i) = self.pools[upstream]
            .iter()
            .rposition(|&u| self.upconns[u].peer == peer)
        {
            let u = self.pools[upstream].remove(i);
            if self.cx.now_ms.saturating_sub(self.upconns[u].idle_since_ms) < timeout {
                return Some(u);
            }
            self.close_upconn(u);
        }
        None
    }

    /// Keeps an upstream connection for the next request, within `keepalive` and
    /// `keepalive_requests`; otherwise closes it.
    fn pool_upconn(&mut self, u: usize) {
        let uc = &self.upconns[u];
        let ups = self.ups(uc.upstream);
        // A connection whose FIN came with the response is done: no further edge would tell
        // the pool, and the next request would find it closed.
        if ups.keepalive == 0
            || uc.requests >= ups.keepalive_requests
            || self.cx.now_ms.saturating_sub(uc.opened_ms) >= ups.keepalive_time_ms
            || self.shutting_down
            || uc.hup
        {
            self.close_upconn(u);
            return;
        }
        let upstream = uc.upstream;
        let fd = uc.fd.as_raw_fd();
        let readable = uc.readable || uc.hup;
        if let Some(t) = self.upconns[u].tls.as_mut() {
            // Bytes behind the response would be read as the next one's start.
            if !super::tls::up_idle(fd, t, readable) {
                self.close_upconn(u);
                return;
            }
        }
        let pool = &mut self.pools[upstream];
        if pool.len() >= ups.keepalive {
            // The least recently used goes, as nginx's cache queue.
            let old = pool.remove(0);
            self.close_upconn(old);
        }
        let uc = &mut self.upconns[u];
        uc.owner = None;
        uc.idle_since_ms = self.cx.now_ms;
        uc.readable = false;
        self.pools[upstream].push(u);
    }

    pub(super) fn close_upconn(&mut self, u: usize) {
        // Dropping it closes the socket, which removes it from epoll.
        if let Some(mut uc) = self.upconns.try_remove(u) {
            if let Some(t) = uc.tls.as_mut() {
                super::tls::close_up(uc.fd.as_raw_fd(), t);
            }
        }
    }

    /// Closes pooled connections idle for longer than their upstream's `keepalive_timeout`
    /// (all of them when the worker is stopping).
    pub(super) fn expire_pools(&mut self) {
        let Some(http) = self.cx.cfg.http.as_ref() else {
            return;
        };
        for (i, ups) in http.upstreams.iter().enumerate() {
            let now = self.cx.now_ms;
            let stopping = self.shutting_down;
            let upconns = &self.upconns;
            let (old, keep): (Vec<usize>, Vec<usize>) = self.pools[i].iter().partition(|&&u| {
                stopping || now.saturating_sub(upconns[u].idle_since_ms) >= ups.keepalive_timeout_ms
            });
            self.pools[i] = keep;
            for u in old {
                self.close_upconn(u);
            }
        }
    }
}

/// Whether a failed attempt may go to another peer (see `shard_http::proxy::may_retry`).
/// The part of the next `n` body bytes inside `window` (all of them without one), and the
/// window moved past them.
fn window_of(window: &mut Option<(u64, u64, u64)>, n: usize) -> std::ops::Range<usize> {
    let Some((start, end, pos)) = window.as_mut() else {
        return 0..n;
    };
    let from = (*start).saturating_sub(*pos).min(n as u64) as usize;
    let to = (*end).saturating_sub(*pos).min(n as u64) as usize;
    *pos += n as u64;
    from..to.max(from)
}

fn may_retry(p: &Proxy, loc: &LocationConf, sent: bool) -> bool {
    shard_http::proxy::may_retry(
        p.head_sent,
        sent,
        &p.req.method,
        loc.proxy.next_upstream.non_idempotent,
    )
}

/// After a failed attempt: another peer when `proxy_next_upstream` asks for one and the
/// request may be retried, else the error page.
fn retry_or_fail(p: &mut Proxy, loc: &LocationConf, why: Failure, sent: bool) -> Flow {
    p.last_failure = Some(why);
    if why.retried_by(&loc.proxy.next_upstream) && may_retry(p, loc, sent) {
        p.state = State::Connect;
        p.rbuf.clear();
        return Flow::Next;
    }
    no_more_peers(p, why.status())
}

/// No peer is left: 504 when the last attempt timed out, 502 after any other failure, else
/// `status`.
fn no_more_peers(p: &Proxy, status: u16) -> Flow {
    Flow::Fail(p.last_failure.map_or(status, Failure::status))
}

/// A client configuration's identity, for matching pooled connections to passes.
fn config_id(c: &std::sync::Arc<rustls::ClientConfig>) -> usize {
    std::sync::Arc::as_ptr(c) as usize
}

/// `$proxy_host` without its port (`backend:8443` → `backend`), an IPv6 address without
/// its brackets: the name `proxy_ssl_name` defaults to.
pub(super) fn host_of(proxy_host: &str) -> &str {
    if let Some(v6) = proxy_host.strip_prefix('[') {
        return v6.split(']').next().unwrap_or(v6);
    }
    match proxy_host.rsplit_once(':') {
        Some((host, port)) if !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) => host,
        _ => proxy_host,
    }
}

/// nginx's message for a failed read: the system call's error, or FastCGI's own words (a
/// record it refuses, stdout closed before the end).
fn recv_failed(e: &std::io::Error, during: &str) -> String {
    if e.raw_os_error().is_some() {
        format!("recv() failed ({}) {during}", os(e))
    } else {
        format!("{e} {during}")
    }
}

fn os(e: &std::io::Error) -> String {
    shard_event::os_error_text(e)
}

/// An upstream's `X-Accel-Redirect` target, with the header lines nginx passes on to the
/// redirected response (`Set-Cookie`, `Content-Disposition`, `Cache-Control`, `Expires`;
/// nginx's `Accept-Ranges` too, which shard's own static response already writes).
/// An `X-Accel-Redirect` target as the redirect takes it: a named location as it is, a URI
/// with its path unescaped (the arguments as sent); `None` when the path is unsafe (a `..`
/// segment, a NUL, bytes that are not UTF-8 once unescaped), as nginx judges it.
fn accel_target(target: &str) -> Option<String> {
    if target.starts_with('@') {
        return Some(target.to_string());
    }
    let (path, query) = match target.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (target, None),
    };
    let raw = path.as_bytes();
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        let hex = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
        match (
            raw[i],
            raw.get(i + 1).copied().and_then(hex),
            raw.get(i + 2).copied().and_then(hex),
        ) {
            (b'%', Some(h), Some(l)) => {
                out.push(h << 4 | l);
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    let path = String::from_utf8(out).ok()?;
    let unsafe_dots = path == ".."
        || path.starts_with("../")
        || path.contains("/../")
        || path.ends_with("/..")
        || path.contains('\0');
    if unsafe_dots {
        return None;
    }
    Some(match query {
        Some(q) => format!("{path}?{q}"),
        None => path,
    })
}

/// `head` is the response head as received (HTTP, or a FastCGI application's CGI head),
/// where the proxy's parse has already hidden the `X-Accel-*` family.
fn accel_redirect(head: &[u8]) -> Option<(String, Vec<u8>)> {
    const PASSED: [&str; 6] = [
        "content-type",
        "set-cookie",
        "content-disposition",
        "cache-control",
        "expires",
        "accept-ranges",
    ];
    let headers: Vec<(&str, &[u8])> = head
        .split(|&b| b == b'\n')
        .filter_map(|l| {
            let l = l.strip_suffix(b"\r").unwrap_or(l);
            let i = l.iter().position(|&b| b == b':')?;
            let name = std::str::from_utf8(&l[..i]).ok()?;
            let v = &l[i + 1..];
            let start = v
                .iter()
                .position(|b| !b.is_ascii_whitespace())
                .unwrap_or(v.len());
            let end = v
                .iter()
                .rposition(|b| !b.is_ascii_whitespace())
                .map_or(start, |e| e + 1);
            Some((name, &v[start..end.max(start)]))
        })
        .collect();
    let (_, v) = headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case("x-accel-redirect"))?;
    let target = String::from_utf8_lossy(v).trim().to_string();
    if target.is_empty() {
        return None;
    }
    let mut passed = Vec::new();
    for (n, v) in &headers {
        if PASSED.iter().any(|p| n.eq_ignore_ascii_case(p)) {
            passed.extend_from_slice(n.as_bytes());
            passed.extend_from_slice(b": ");
            passed.extend_from_slice(v);
            passed.extend_from_slice(b"\r\n");
        }
    }
    Some((target, passed))
}

/// The `Content-Type` value (when it changes), the recoding table (when the body is
/// recoded) and the error to log for an upstream's `X-Accel-Charset: DST` on a response of
/// type `ct`, as nginx's charset filter takes an override (see `Worker::accel_charset`).
/// Whether `name` is a charset the configuration knows for an override: one a
/// `charset_map` or the location's `charset` names, or a common one.
pub(super) fn charset_known(
    name: &str,
    maps: &[shard_config::CharsetMap],
    loc: &LocationConf,
) -> bool {
    maps.iter()
        .any(|m| m.from.eq_ignore_ascii_case(name) || m.to.eq_ignore_ascii_case(name))
        || loc
            .charset
            .as_deref()
            .is_some_and(|c| c.eq_ignore_ascii_case(name))
        || ["utf-8", "koi8-r", "windows-1251", "iso-8859-1"]
            .iter()
            .any(|c| c.eq_ignore_ascii_case(name))
}

pub(super) fn charset_override(
    ct: &str,
    dst: &str,
    maps: &[shard_config::CharsetMap],
    encoded: bool,
) -> (Option<String>, Option<[u8; 256]>, Option<String>) {
    match shard_http::response::named_charset(ct) {
        None => {
            let ty = ct.trim_end().trim_end_matches(';').trim_end();
            (Some(format!("{ty}; charset={dst}")), None, None)
        }
        Some((ty, src)) if src.eq_ignore_ascii_case(dst) => {
            (Some(format!("{ty}; charset={dst}")), None, None)
        }
        Some(_) if encoded => (None, None, None),
        Some((ty, src)) => match shard_config::recode_table(maps, src, dst) {
            Some(t) => (Some(format!("{ty}; charset={dst}")), Some(t), None),
            None => (
                None,
                None,
                Some(format!(
                    "no \"charset_map\" between the charsets \"{src}\" and \"{dst}\""
                )),
            ),
        },
    }
}

/// The first `name:` line of a response head as received (hidden headers included).
fn raw_header<'h>(head: &'h [u8], name: &str) -> Option<&'h [u8]> {
    shard_http::proxy::head_fields(head)
        .find(|(n, _)| n.eq_ignore_ascii_case(name.as_bytes()))
        .map(|(_, v)| v)
}

/// A local address as nginx's `bind()` error names it: the IP alone when the port is 0.
fn bind_text(a: std::net::SocketAddr) -> String {
    if a.port() == 0 {
        a.ip().to_string()
    } else {
        a.to_string()
    }
}

/// The main request an `auth_request` subrequest holds while its upstream answers.
pub(super) struct AuthWait {
    /// Its location in its server (`None`: the server's own settings).
    pub(super) location: Option<usize>,
    pub(super) req: Request,
    pub(super) head: Vec<u8>,
    pub(super) hops: usize,
    pub(super) keep_alive: bool,
    pub(super) more_input: bool,
}

pub(super) struct AuthPending {
    wait: AuthWait,
    server: usize,
    captures: super::conn::SavedCaptures,
    /// The subrequest's `WWW-Authenticate`, passed with its 401.
    www: Option<Vec<u8>>,
}

impl<'a> Worker<'a> {
    /// Proxies `auth_request`'s subrequest on connection `key` (no body of its own), the
    /// main request waiting in it.
    pub(super) fn start_auth_request(
        &mut self,
        key: usize,
        server: usize,
        ask: Box<super::conn::AuthAsk<'a>>,
        wait: AuthWait,
    ) {
        let ask = *ask;
        let head = wait.head.clone();
        self.start_proxy(key, server, ask.loc, ask.req, head, false, wait.keep_alive);
        if let Some(p) = self.conns[key].rq().proxy.as_mut() {
            p.state = State::Connect;
            p.auth = Some(Box::new(AuthPending {
                wait,
                server,
                captures: ask.captures,
                www: None,
            }));
        }
    }

    /// The subrequest answered `status` (or failed with it): its connection goes, and the
    /// main request's phases start again with the answer.
    fn auth_done(&mut self, key: usize, mut p: Box<Proxy>, status: u16) -> Step {
        if let Some(u) = p.up.take() {
            self.close_upconn(u);
        }
        let Some(a) = p.auth.take() else {
            self.give_proxy_bufs(p);
            return Step::Done;
        };
        let attempts = std::mem::take(&mut p.attempts);
        self.give_proxy_bufs(p);
        let AuthPending {
            wait,
            server,
            captures,
            www,
        } = *a;
        let c = &mut self.conns[key];
        let r = c.rq();
        (r.captures, r.capture_names, r.capture_text) = captures;
        r.auth_status = Some(status);
        if let Some(v) = www.filter(|_| status == 401) {
            let mut line = b"WWW-Authenticate: ".to_vec();
            line.extend(v.into_iter().filter(|&b| b != b'\r' && b != b'\n'));
            line.extend_from_slice(b"\r\n");
            r.accel_headers = Some(line.into_boxed_slice());
        }
        let srv = &self.http().servers[server];
        let loc = wait.location.map_or(&srv.base, |i| &srv.locations[i]);
        self.auth_request_vars(key, &wait.req, &wait.head, loc, status, &attempts);
        // `auth_request_set $args ...`: the request's arguments, as nginx's set handler.
        let mut req = wait.req;
        if loc.auth_request_set.iter().any(|(n, _)| n == "args") {
            let v = self.conns[key]
                .rd()
                .user_vars
                .iter()
                .rev()
                .find(|(n, _)| n == "args")
                .map(|(_, v)| String::from_utf8_lossy(v).into_owned());
            if let Some(v) = v {
                req.query = Some(v);
            }
        }
        self.run_phases(
            key,
            server,
            loc,
            super::conn::Phases {
                req,
                head: wait.head,
                hops: wait.hops,
                keep_alive: wait.keep_alive,
                more_input: wait.more_input,
                forced: None,
                rewritten: None,
                after_upstream: false,
            },
        );
        Step::Done
    }
}

/// Body bytes on their way to the client: recoded (`charset`), decompressed (`gunzip`),
/// then framed (chunked or as they are).
/// Compressed bytes a proxied answer gathers before they go to the client (nginx's
/// `gzip_buffers` default: 32 x 4 KiB or 16 x 8 KiB; one buffer's worth here).
const GZIP_OUT_BYTES: usize = 8192;

struct Emit<'a> {
    out: &'a mut Vec<u8>,
    chunked: bool,
    recode: Option<&'a [u8; 256]>,
    gunzip: Option<&'a mut flate2::write::MultiGzDecoder<Vec<u8>>>,
    sub: Option<&'a mut shard_http::subfilter::SubFilter>,
    gzip: Option<&'a mut flate2::write::GzEncoder<Vec<u8>>>,
}

impl Emit<'_> {
    /// Passes `data` on; the bytes the client gets.
    fn data(&mut self, data: &mut [u8]) -> Result<u64, &'static str> {
        use std::io::Write;
        if let Some(t) = self.recode {
            super::conn::recode(data, t);
        }
        match self.gunzip.as_deref_mut() {
            Some(g) => {
                g.write_all(data)
                    .map_err(|_| "upstream sent invalid gzip response")?;
                let plain = std::mem::take(g.get_mut());
                Ok(self.filtered(&plain, false))
            }
            None => Ok(self.filtered(data, false)),
        }
    }

    /// Through `sub_filter` (its held bytes too when `last`), then `gzip`, then framed.
    fn filtered(&mut self, data: &[u8], last: bool) -> u64 {
        let Some(f) = self.sub.as_deref_mut() else {
            return self.compressed(data, last);
        };
        let mut out = Vec::with_capacity(data.len());
        f.feed(data, &mut out);
        if last {
            f.finish(&mut out);
        }
        self.compressed(&out, last)
    }

    /// Through `gzip` (its trailer when `last`), then framed.
    fn compressed(&mut self, data: &[u8], last: bool) -> u64 {
        use std::io::Write;
        let Some(g) = self.gzip.as_deref_mut() else {
            return self.framed(data);
        };
        // Writing to memory cannot fail.
        let _ = g.write_all(data);
        if last {
            let _ = g.try_finish();
        } else if g.get_ref().len() < GZIP_OUT_BYTES {
            // As nginx's gzip buffers: compressed bytes go out a buffer at a time.
            return 0;
        }
        let out = std::mem::take(g.get_mut());
        self.framed(&out)
    }

    /// The body ended: what the decompressor still holds (and a check that the gzip stream
    /// was whole).
    fn finish(&mut self) -> Result<u64, &'static str> {
        let plain = match self.gunzip.as_deref_mut() {
            Some(g) => {
                g.try_finish()
                    .map_err(|_| "upstream sent invalid gzip response")?;
                std::mem::take(g.get_mut())
            }
            None => Vec::new(),
        };
        Ok(self.filtered(&plain, true))
    }

    fn framed(&mut self, data: &[u8]) -> u64 {
        if data.is_empty() {
            return 0;
        }
        if self.chunked {
            shard_http::proxy::write_chunk(self.out, data);
        } else {
            self.out.extend_from_slice(data);
        }
        data.len() as u64
    }
}

/// `$request_body` once the body went upstream: a body sent from memory (it follows the
/// upstream request's head), or a streamed one that fit in `client_body_buffer_size`;
/// empty for a body in a file, as nginx's.
fn body_in_memory(p: &Proxy) -> &[u8] {
    if p.fcgi.is_none() && !p.streaming && !p.body_skipped && p.body.file().is_none() {
        match memchr::memmem::find(&p.upreq, b"\r\n\r\n") {
            Some(end) => &p.upreq[end + 4..],
            None => &[],
        }
    } else {
        p.stream_copy
            .as_deref()
            .filter(|_| p.streaming && !p.body_cut)
            .unwrap_or(&[])
    }
}

/// A `proxy_store` file being written: a temporary name beside its destination, removed
/// unless [`StoreFile::commit`] renames it in place.
pub(super) struct StoreFile {
    file: std::fs::File,
    tmp: std::path::PathBuf,
    dest: std::path::PathBuf,
    mtime: Option<std::time::SystemTime>,
    mode: u32,
    failed: bool,
}

impl StoreFile {
    /// Starts the file for `dest` (its directories made as needed). Err: the path that failed.
    fn create(
        dest: std::path::PathBuf,
        mode: u32,
        mtime: Option<std::time::SystemTime>,
    ) -> Result<StoreFile, (std::path::PathBuf, std::io::Error)> {
        use std::sync::atomic::{AtomicU32, Ordering};
        static SERIAL: AtomicU32 = AtomicU32::new(0);
        let dir = dest
            .parent()
            .map_or_else(|| std::path::PathBuf::from("/"), |d| d.to_path_buf());
        std::fs::create_dir_all(&dir).map_err(|e| (dir.clone(), e))?;
        let n = SERIAL.fetch_add(1, Ordering::Relaxed);
        let tmp = dir.join(format!(".shard-store-{}-{n}", std::process::id()));
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)
            .map_err(|e| (tmp.clone(), e))?;
        Ok(StoreFile {
            file,
            tmp,
            dest,
            mtime,
            mode,
            failed: false,
        })
    }

    /// Body bytes (a failed write stops saving, and says why).
    fn write(f: &mut Option<Box<StoreFile>>, data: &[u8]) {
        use std::io::Write as _;
        let Some(s) = f.as_mut().filter(|s| !s.failed) else {
            return;
        };
        if let Err(e) = s.file.write_all(data) {
            crate::log!(
                Crit,
                "write() to \"{}\" failed ({})",
                s.tmp.display(),
                shard_event::os_error_text(&e)
            );
            s.failed = true;
        }
    }

    /// The answer is whole: the file takes its mode, the upstream's `Last-Modified` and its
    /// name.
    fn commit(mut self) -> Result<(), (std::path::PathBuf, std::io::Error)> {
        use std::os::unix::fs::PermissionsExt;
        if self.failed {
            return Ok(());
        }
        let _ = self
            .file
            .set_permissions(std::fs::Permissions::from_mode(self.mode));
        if let Some(t) = self.mtime {
            let _ = self.file.set_modified(t);
        }
        std::fs::rename(&self.tmp, &self.dest).map_err(|e| (self.dest.clone(), e))?;
        // Renamed: nothing left for `drop` to remove.
        self.tmp = std::path::PathBuf::new();
        Ok(())
    }
}

impl Drop for StoreFile {
    fn drop(&mut self) {
        if !self.tmp.as_os_str().is_empty() {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

#[cfg(test)]
mod tests {
    /// The upstream connection's steps (`UpConn::write_from`, `UpConn::read_into`) on a
    /// socketpair, without a worker.
    mod steps {
        use super::super::UpConn;
        use std::io::{Read, Write};
        use std::os::fd::OwnedFd;
        use std::os::unix::net::UnixStream;

        fn pair() -> (UpConn, UnixStream) {
            let (ours, peer) = UnixStream::pair().unwrap();
            ours.set_nonblocking(true).unwrap();
            let uc = UpConn {
                fd: OwnedFd::from(ours),
                id: 1,
                upstream: 0,
                peer: 0,
                // As a new connection: nothing to read before the request went out.
                readable: false,
                writable: true,
                hup: false,
                owner: None,
                requests: 0,
                idle_since_ms: 0,
                opened_ms: 0,
                tls: None,
                fin_pending: false,
                tls_config: 0,
                grpc: None,
            };
            (uc, peer)
        }

        #[test]
        fn a_request_goes_out_whole_or_waits_for_room() {
            let (mut uc, mut peer) = pair();
            let mut pos = 0;
            assert!(uc.write_from(b"GET / HTTP/1.1\r\n\r\n", &mut pos).unwrap());
            assert_eq!(pos, 18);
            let mut b = [0u8; 64];
            assert_eq!(peer.read(&mut b).unwrap(), 18);
            // More than the socket holds: written up to the full buffer, then it waits.
            let big = vec![b'b'; 8 << 20];
            let mut pos = 0;
            assert!(!uc.write_from(&big, &mut pos).unwrap());
            assert!(!uc.writable && pos > 0 && pos < big.len());
            // Not writable: nothing is tried until the kernel says so.
            let before = pos;
            assert!(!uc.write_from(&big, &mut pos).unwrap());
            assert_eq!(pos, before);
        }

        #[test]
        fn a_read_waits_for_its_event_and_a_short_read_drains() {
            let (mut uc, mut peer) = pair();
            let mut buf = Vec::new();
            peer.write_all(b"HTTP/1.1 200 OK\r\n").unwrap();
            // No event yet: no read (no EAGAIN spent).
            assert!(uc.read_into(&mut buf, 4096).unwrap().is_none());
            uc.readable = true;
            assert_eq!(uc.read_into(&mut buf, 4096).unwrap(), Some(17));
            assert_eq!(buf, b"HTTP/1.1 200 OK\r\n");
            assert!(!uc.readable, "a short read drained the socket");
            // A read as large as the room leaves it readable: more may wait.
            peer.write_all(&[b'x'; 100]).unwrap();
            uc.readable = true;
            let mut small = Vec::with_capacity(10);
            let got = uc.read_into(&mut small, 10).unwrap().unwrap();
            assert_eq!(got, small.capacity());
            assert!(uc.readable);
        }

        #[test]
        fn the_peers_end_is_read_after_a_short_read_when_hup_came() {
            let (mut uc, peer) = pair();
            drop(peer);
            // EPOLLRDHUP came with the last bytes: the end is read even though the last read
            // was short, since no other edge will come.
            uc.hup = true;
            let mut buf = Vec::new();
            assert_eq!(uc.read_into(&mut buf, 4096).unwrap(), Some(0));
        }
    }
}
