//! The `stream` module's TCP relay: one accepted client, one upstream, bytes both ways.
//!
//! This module owns, per relay: choosing an upstream peer (smooth weighted round robin as
//! nginx's, `down` skipped, `backup` only when no primary is left, a peer that failed
//! `max_fails` times within `fail_timeout` skipped for `fail_timeout`; the failure state is
//! per worker), the nonblocking `connect` with `proxy_connect_timeout` and the move to the next
//! peer, then the relay itself: two bounded buffers of `proxy_buffer_size` (client → upstream
//! and upstream → client) with backpressure (a side is not read while its buffer to the other
//! side is full), end of stream (on one side it becomes `shutdown(SHUT_WR)` on the other once
//! its buffer is flushed) and `proxy_timeout` between successive reads or writes. A relay
//! closes when one direction is done (both with `proxy_half_close on`), on an error, or on a
//! timeout; then its
//! `access_log` lines (stream `log_format`, the stream variables) are written.
//!
//! Both descriptors sit in the worker's epoll, registered once, edge-triggered, with a
//! `Token::RelayClient` or `Token::RelayUpstream` carrying the relay's key and generation. A relay counts as one connection in `accepted`/`handled`/`active`
//! (as nginx counts the client connection) and as two against `worker_connections` (the client
//! and the upstream socket, as nginx spends two connection structures).

use std::cmp::Reverse;
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

use shard_config::{StreamConf, StreamServerConf};
use shard_event::sock::{Connect, ConnectError};

use super::step::Io;

/// Plaintext kept from the end of a stream client's handshake until the upstream connects.
const EARLY_BYTES_MAX: usize = 16 * 1024;
use super::token::{self, Token};
use super::{balance, Worker};
use crate::shm::WorkerSlot;

/// What is known of one side of a relay or tunnel: the socket's readiness (edge-triggered:
/// set by an event, cleared by `EAGAIN`) and how far its end of stream went.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Ends {
    pub(super) readable: bool,
    pub(super) writable: bool,
    /// End of stream read from this side.
    pub(super) eof: bool,
    /// We sent FIN to this side (`shutdown(SHUT_WR)`).
    pub(super) shut: bool,
}

struct Side {
    /// `None` while no upstream socket exists; closed when dropped.
    fd: Option<OwnedFd>,
    e: Ends,
}

impl Side {
    /// The descriptor for a system call (-1 when there is none: the call fails with EBADF).
    fn raw(&self) -> RawFd {
        self.fd.as_ref().map_or(-1, AsRawFd::as_raw_fd)
    }

    fn new(fd: Option<OwnedFd>) -> Side {
        Side {
            fd,
            e: Ends {
                readable: true,
                writable: true,
                eof: false,
                shut: false,
            },
        }
    }
}

/// A bounded byte queue: `buf[start..end]` waits to be written.
pub(super) struct Pipe {
    buf: Box<[u8]>,
    start: usize,
    end: usize,
    /// Bytes written out of it, ever.
    pub(super) written: u64,
}

impl Pipe {
    pub(super) fn new(size: usize) -> Pipe {
        Pipe {
            buf: vec![0u8; size].into_boxed_slice(),
            start: 0,
            end: 0,
            written: 0,
        }
    }
    /// A pipe of `size` bytes (more if `first` needs more) holding `first`.
    pub(super) fn with(size: usize, first: &[u8]) -> Pipe {
        let mut p = Pipe::new(size.max(first.len()));
        p.buf[..first.len()].copy_from_slice(first);
        p.end = first.len();
        p
    }
    /// Bytes taken into it, ever (written out, or still waiting).
    fn taken(&self) -> u64 {
        self.written + (self.end - self.start) as u64
    }

    pub(super) fn is_empty(&self) -> bool {
        self.start == self.end
    }
    /// Room to read into, compacting first when the tail is full.
    fn make_room(&mut self) -> bool {
        if self.end < self.buf.len() {
            return true;
        }
        if self.start > 0 {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
            return true;
        }
        false
    }
}

pub(super) struct Relay {
    pub(super) id: u64,
    /// Its number among every connection of the server (the error log's `*N`).
    /// The server's `error_log` context (`log::set_context`).
    log_ctx: (u64, u8),
    number: u64,
    client: Side,
    /// `fd == -1` while no upstream socket exists.
    upstream: Side,
    /// Client to upstream, and upstream to client; allocated once connected.
    up: Option<Pipe>,
    down: Option<Pipe>,
    peer: Option<SocketAddr>,
    /// Index into `StreamConf::servers`.
    server: usize,
    /// The listening address (nginx's `server:` in log lines).
    listen: SocketAddr,
    /// While connecting: which peers this relay already tried, and the one in progress.
    tried: Vec<bool>,
    current_peer: Option<usize>,
    connecting: bool,
    pub(super) deadline_ms: u64,
    /// The earliest deadline queued in the timer heap for this relay.
    timer_at: u64,
    /// TLS records of a client accepted on a `listen ... ssl` (`tls.rs`).
    tls: Option<Box<super::tls::TlsConn>>,
    /// The TLS handshake is not done: no upstream is contacted yet (nginx's order).
    handshaking: bool,
    /// Plaintext that came with the end of the handshake, for the upstream.
    early: Vec<u8>,
    /// TLS to the upstream (`proxy_ssl on`), from the connect of the current attempt.
    up_tls: Option<Box<super::tls::UpTls>>,
    /// Its handshake is not done: the relay is still connecting.
    up_handshaking: bool,
    /// `proxy_protocol on` with `proxy_ssl on`: the PROXY header's bytes not yet written,
    /// in plain text before the handshake (as nginx sends it).
    pp_plain: Vec<u8>,
    /// Our close_notify to the upstream is queued; its FIN follows it.
    up_fin_pending: bool,
    /// `listen ... proxy_protocol`: the client's PROXY protocol header is still to be read.
    pp_pending: bool,
    /// The header it sent: its addresses go to the upstream with `proxy_protocol on`.
    pp: Option<Box<shard_http::proxy_protocol::Header>>,
    /// For the access log: when the session began, each peer address tried, when the
    /// current attempt's connect began, how long the connect took, when the relay started,
    /// when the upstream's first byte came, and the bytes of our own PROXY header in `up`.
    started_ms: u64,
    attempts: Vec<SocketAddr>,
    connect_began_ms: u64,
    connect_ms: Option<u64>,
    first_byte_ms: Option<u64>,
    pp_out: u64,
    /// Values of the server's `set`s, from when the session began.
    user: Vec<(String, Vec<u8>)>,
    /// A session answered without an upstream (`deny`, `return`): its status and bytes
    /// sent.
    fixed: Option<(u16, u64)>,
    /// `allow`/`deny` wait for the PROXY header (`listen ... proxy_protocol`).
    access_deferred: bool,
    /// The upstream this relay uses: the server's, or (`proxy_pass` with variables) the one
    /// its value named, `usize::MAX` until then; indexes past the configuration's are
    /// `stream_dyn`.
    ups: usize,
    /// `proxy_pass $var` named a host whose addresses are being asked of the `resolver`.
    resolving: bool,
    /// The upstream's name, when a further attempt found no live peer.
    no_live: Option<String>,
    /// `ssl_preread on`: reading the ClientHello (into `early`), and what it said.
    prereading: bool,
    preread_done: bool,
    hello: Option<Box<crate::preread::Hello>>,
    /// The connection's own peer, when `set_real_ip_from` replaced `peer` with the PROXY
    /// header's source (`$realip_remote_addr`).
    realip: Option<SocketAddr>,
    /// `limit_conn` counts this session holds: (zone index into the worker's zones, key).
    held: Vec<(usize, u128)>,
    /// `$limit_conn_status`: `PASSED`, `REJECTED`, `REJECTED_DRY_RUN`, or "" (no zone applied).
    limit_conn_status: &'static str,
    /// `proxy_download_rate`, `proxy_upload_rate` of this session (0: unlimited).
    rates: (u64, u64),
    /// `proxy_download_rate`/`proxy_upload_rate` hold a side's reads back until then (0:
    /// not held).
    rate_wake_ms: u64,
}

/// At most this many upstreams a worker makes for addresses `proxy_pass $var` rendered
/// (one per distinct address, kept for the worker's life).
const STREAM_DYN_MAX: usize = 1024;

/// Where `proxy_pass $var` leads a session.
enum PassTarget {
    /// This upstream (an index for [`Worker::stream_ups`]).
    Ready(usize),
    /// The `resolver` is asked; the session goes on when it answers.
    Wait,
    /// Nowhere (logged): the session ends.
    Fail,
}

/// What the stream access log knows of one session when it ends.
#[derive(Clone, Copy)]
pub(super) struct Session<'a> {
    number: u64,
    /// Index into `StreamConf::servers` (whose `ssl_verify_client` judged the certificate).
    server: usize,
    client: Option<SocketAddr>,
    local: SocketAddr,
    status: u16,
    started_ms: u64,
    bytes_sent: u64,
    bytes_received: u64,
    upstream: &'a [SocketAddr],
    /// No live peer was left for a further attempt: that attempt, named by the upstream
    /// (nginx's `$upstream_addr` ends with the upstream's name).
    no_live: Option<&'a str>,
    up_sent: u64,
    up_received: u64,
    connect_ms: Option<u64>,
    first_byte_ms: Option<u64>,
    pp: Option<&'a shard_http::proxy_protocol::Header>,
    /// The stream block's `map`s, `geo`s and `split_clients`.
    maps: &'a [shard_config::MapConf],
    /// The stream block's `geoip_*` databases.
    geoip: Option<&'a shard_config::GeoipConf>,
    /// Values of the server's `set`s.
    user: &'a [(String, Vec<u8>)],
    /// The ClientHello `ssl_preread` read.
    hello: Option<&'a crate::preread::Hello>,
    /// The connection's own peer when realip replaced `client`.
    realip: Option<SocketAddr>,
    /// The client's TLS (`listen ... ssl`), once its handshake is done.
    tls: Option<&'a super::tls::TlsConn>,
    /// `$limit_conn_status`.
    limit_conn_status: &'static str,
    /// The groups of the `map` expression whose value is being rendered (`$1`, `$name`).
    groups: Option<&'a Groups<'a>>,
    /// A UDP session (`$protocol`).
    udp: bool,
}

impl<'a> Session<'a> {
    /// A session's view with its identity and nothing relayed yet: no bytes, no upstream,
    /// no PROXY header, TLS, `set`s or groups (what `return`, a refusal and UDP start from).
    fn new(
        number: u64,
        server: usize,
        client: Option<SocketAddr>,
        local: SocketAddr,
        started_ms: u64,
        maps: &'a [shard_config::MapConf],
        geoip: Option<&'a shard_config::GeoipConf>,
    ) -> Session<'a> {
        Session {
            number,
            server,
            client,
            local,
            status: 200,
            started_ms,
            bytes_sent: 0,
            bytes_received: 0,
            upstream: &[],
            no_live: None,
            up_sent: 0,
            up_received: 0,
            connect_ms: None,
            first_byte_ms: None,
            pp: None,
            maps,
            geoip,
            user: &[],
            hello: None,
            realip: None,
            tls: None,
            limit_conn_status: "",
            groups: None,
            udp: false,
        }
    }
}

/// A regular expression's groups over `text`, and their names by number.
#[derive(Clone, Copy)]
struct Groups<'a> {
    ranges: &'a [Option<(usize, usize)>],
    text: &'a str,
    names: &'a [Option<String>],
}

impl<'a> Worker<'a> {
    /// The `stream` block. A relay exists only when there is one (it was accepted on a stream
    /// listener); without one this is an empty block rather than a panic.
    pub(super) fn stream(&self) -> &'a StreamConf {
        static NONE: StreamConf = StreamConf {
            geoip: None,
            upstreams: Vec::new(),
            servers: Vec::new(),
            maps: Vec::new(),
            limit_zones: Vec::new(),
        };
        self.cx.cfg.stream.as_ref().unwrap_or(&NONE)
    }

    pub(super) fn stream_server(&self, server: usize) -> &'a StreamServerConf {
        &self.stream().servers[server]
    }

    /// Connections counted against `worker_connections`: a relay is two, an upstream
    /// connection of the HTTP proxy (busy or pooled) one.
    pub(super) fn connections_used(&self) -> usize {
        self.conns.len() + 2 * self.relays.len() + 2 * self.udp.len() + self.upconns.len()
    }

    /// Takes an accepted client of the stream server `server` (already counted as accepted,
    /// handled and active) and starts connecting to its upstream.
    pub(super) fn start_relay(
        &mut self,
        fd: OwnedFd,
        peer: Option<SocketAddr>,
        listen: SocketAddr,
        server: usize,
        tls: Option<Box<super::tls::TlsConn>>,
        proxy_protocol: bool,
    ) {
        let conf = self.stream_server(server);
        let _ = shard_event::sock::set_nodelay(fd.as_raw_fd(), true);
        let local = || shard_event::sock::local_addr(fd.as_raw_fd()).unwrap_or(listen);
        // The connection's number (`$connection`, the error log's `*N`), taken at accept as
        // nginx's, so that `return` and `set` see it too.
        let number = self
            .region
            .connections
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            + 1;
        let quick = |status: u16, sent: u64| Session {
            status,
            bytes_sent: sent,
            ..Session::new(
                number,
                server,
                peer,
                local(),
                self.cx.now_ms,
                &self.stream().maps,
                self.stream().geoip.as_deref(),
            )
        };
        // `set` (preaccess), `allow`/`deny` (access), then `return`: answered (or refused)
        // at once, no upstream. A relay evaluates its `set`s again once its PROXY header
        // is read (`relay_begin`).
        // With a PROXY header to read first, or TLS before `return`, these wait for the
        // relay (`relay_begin`, `relay_content`).
        let user = if conf.sets.is_empty() || (conf.ret.is_none() && conf.access_logs.is_empty()) {
            Vec::new()
        } else {
            self.eval_sets(server, quick(200, 0))
        };
        let deferred = proxy_protocol || !conf.limit_conn.is_empty();
        if !deferred {
            let ip = peer.map(|p| p.ip());
            let allowed = conf
                .access_rules
                .iter()
                .find(|r| r.matches_client(ip))
                .is_none_or(|r| r.allow);
            if !allowed {
                crate::log!(
                    Error,
                    "access forbidden by rule, client: {}, server: {listen}",
                    ip.map_or("unix:".to_string(), |ip| ip.to_string())
                );
                if !conf.access_logs.is_empty() {
                    let s = Session {
                        user: &user,
                        ..quick(403, 0)
                    };
                    let lines = self.session_lines(server, &s);
                    self.write_stream_logs(server, lines);
                }
                drop(fd);
                WorkerSlot::drop_one(&self.cx.slot.active);
                return;
            }
        }
        if let Some(parts) = conf
            .ret
            .as_ref()
            .filter(|_| !deferred && tls.is_none() && !conf.ssl_preread)
        {
            let mut text = Vec::new();
            let s = Session {
                user: &user,
                ..quick(200, 0)
            };
            session_parts(&mut text, parts, &s, self.cx.now_ms, &self.hostname, 0);
            let sent = shard_event::sock::write(fd.as_raw_fd(), &text).unwrap_or(0);
            if !conf.access_logs.is_empty() {
                let s = Session {
                    user: &user,
                    ..quick(200, sent as u64)
                };
                let lines = self.session_lines(server, &s);
                self.write_stream_logs(server, lines);
            }
            shard_event::sock::shutdown_write(fd.as_raw_fd());
            drop(fd);
            WorkerSlot::drop_one(&self.cx.slot.active);
            return;
        }
        let conf_upstream = conf.upstream;
        let has_limit_conn = !conf.limit_conn.is_empty();
        let id = self.next_conn_id;
        self.next_conn_id += 1;
        let n_peers = self
            .cx
            .cfg
            .stream
            .as_ref()
            .and_then(|s| s.upstreams.get(s.servers[server].upstream))
            .map_or(0, |u| u.peers.len());
        let raw = fd.as_raw_fd();
        self.debug_client(number, peer);
        let outer = crate::log::set_connection(number);
        let log_ctx = self.log_ctx_of(self.stream_server(server).error_logs.as_ref());
        let outer_ctx = crate::log::set_context(log_ctx.0, log_ctx.1);
        crate::debug!(
            "stream session: {} fd:{raw}",
            peer.map_or("unix:".to_string(), |p| p.to_string())
        );
        let key = self.relays.insert(Relay {
            id,
            log_ctx,
            number,
            client: Side::new(Some(fd)),
            upstream: Side::new(None),
            up: None,
            down: None,
            peer,
            server,
            listen,
            tried: vec![false; n_peers],
            current_peer: None,
            connecting: true,
            resolving: false,
            no_live: None,
            deadline_ms: u64::MAX,
            timer_at: u64::MAX,
            handshaking: tls.is_some(),
            tls,
            early: Vec::new(),
            up_tls: None,
            up_handshaking: false,
            pp_plain: Vec::new(),
            up_fin_pending: false,
            pp_pending: proxy_protocol,
            pp: None,
            started_ms: self.cx.now_ms,
            attempts: Vec::new(),
            connect_began_ms: self.cx.now_ms,
            connect_ms: None,
            first_byte_ms: None,
            pp_out: 0,
            user: Vec::new(),
            fixed: None,
            access_deferred: proxy_protocol || has_limit_conn,
            ups: conf_upstream,
            prereading: false,
            preread_done: false,
            hello: None,
            realip: None,
            held: Vec::new(),
            limit_conn_status: "",
            rates: (0, 0),
            rate_wake_ms: 0,
        });
        if crate::log::enabled(shard_config::LogLevel::Info) {
            // nginx's line for every stream session.
            let r = &self.relays[key];
            let local = shard_event::sock::local_addr(raw).unwrap_or(r.listen);
            crate::log!(
                Info,
                "client {} connected to {local}",
                r.peer.map_or("-".to_string(), |p| p.to_string())
            );
        }
        if let Err(e) = self.poll.add(raw, token(key, id, false), relay_interest()) {
            crate::log!(
                Alert,
                "epoll_ctl(ADD) failed ({})",
                shard_event::os_error_text(&e)
            );
            self.close_relay(key);
            crate::log::restore_context(outer_ctx);
            crate::log::set_connection(outer);
            return;
        }
        let io = if self.relays[key].pp_pending {
            let t = self.stream_server(server).proxy_protocol_timeout_ms;
            self.set_relay_deadline(key, self.cx.now_ms + t);
            self.relay_read_pp(key)
        } else {
            self.relay_begin(key)
        };
        self.end_relay_turn(key, io);
        crate::log::restore_context(outer_ctx);
        crate::log::set_connection(outer);
    }

    /// What the access log and the variables know of relay `key` now.
    fn relay_session(&self, key: usize) -> Session<'_> {
        let r = &self.relays[key];
        let (up, down) = (r.up.as_ref(), r.down.as_ref());
        let status = if let Some((status, _)) = r.fixed {
            status
        } else if r.pp_pending {
            400
        } else if r.handshaking {
            // nginx's stream SSL phase ends a failed handshake as an internal error.
            500
        } else if up.is_none() {
            502
        } else {
            200
        };
        Session {
            number: r.number,
            server: r.server,
            client: r.peer,
            local: shard_event::sock::local_addr(r.client.raw()).unwrap_or(r.listen),
            status,
            started_ms: r.started_ms,
            bytes_sent: r.fixed.map_or(0, |f| f.1) + down.map_or(0, |p| p.written),
            bytes_received: up.map_or(0, |p| p.taken().saturating_sub(r.pp_out)),
            upstream: &r.attempts,
            no_live: r.no_live.as_deref(),
            up_sent: up.map_or(0, |p| p.written),
            up_received: down.map_or(0, Pipe::taken),
            connect_ms: r.connect_ms,
            first_byte_ms: r.first_byte_ms,
            pp: r.pp.as_deref(),
            maps: &self.stream().maps,
            geoip: self.stream().geoip.as_deref(),
            user: &r.user,
            hello: r.hello.as_deref(),
            realip: r.realip,
            tls: r.tls.as_deref().filter(|_| !r.handshaking),
            limit_conn_status: r.limit_conn_status,
            groups: None,
            udp: false,
        }
    }

    /// The values of stream server `server`'s `set`s, in order (each sees those before it).
    fn eval_sets(&self, server: usize, s: Session<'_>) -> Vec<(String, Vec<u8>)> {
        let sets = &self.stream_server(server).sets;
        let mut user: Vec<(String, Vec<u8>)> = Vec::with_capacity(sets.len());
        for (name, value) in sets {
            let mut v = Vec::new();
            let at = Session { user: &user, ..s };
            session_parts(&mut v, value, &at, self.cx.now_ms, &self.hostname, 0);
            user.retain(|(n, _)| n != name);
            user.push((name.clone(), v));
        }
        user
    }

    /// The client is ready to be served (its PROXY header, if any, read): `set`, then
    /// `allow`/`deny` if `start_relay` left them for the header, then its TLS handshake,
    /// then the content (`return` or the upstream).
    fn relay_begin(&mut self, key: usize) -> Io {
        let server = self.relays[key].server;
        let conf = self.cx.cfg.stream.as_ref().map(|s| &s.servers[server]);
        let Some(conf) = conf else { return Io::Close };
        // `set_real_ip_from` (post-accept): a trusted peer's PROXY header names the client.
        let r = &mut self.relays[key];
        if let Some(src) = r.pp.as_ref().and_then(|h| h.src) {
            let ip = r.peer.map(|p| p.ip());
            if conf.real_ip_from.iter().any(|n| n.matches_client(ip)) {
                r.realip = r.peer;
                r.peer = Some(src);
            }
        }
        if !conf.sets.is_empty() {
            let user = self.eval_sets(server, self.relay_session(key));
            self.relays[key].user = user;
        }
        if !conf.limit_conn.is_empty() && !self.stream_limit_conn(key, conf) {
            return Io::Close;
        }
        let r = &self.relays[key];
        if r.access_deferred {
            {
                let ip = r.peer.map(|p| p.ip());
                let allowed = conf
                    .access_rules
                    .iter()
                    .find(|rule| rule.matches_client(ip))
                    .is_none_or(|rule| rule.allow);
                if !allowed {
                    crate::log!(
                        Error,
                        "access forbidden by rule, client: {}, server: {}",
                        ip.map_or("unix:".to_string(), |ip| ip.to_string()),
                        r.listen
                    );
                    self.relays[key].fixed = Some((403, 0));
                    return Io::Close;
                }
            }
        }
        if self.relays[key].handshaking {
            // The upstream is contacted once the client finished its handshake, within
            // `ssl_handshake_timeout`.
            self.set_relay_deadline(key, self.cx.now_ms + conf.ssl_handshake_timeout_ms);
            self.handshake(key)
        } else {
            self.relay_content(key)
        }
    }

    /// `limit_conn` (preaccess): takes a count in each zone for the session's key; `false`
    /// when a zone is full (the session ends with 503, as nginx's), unless dry run.
    fn stream_limit_conn(&mut self, key: usize, conf: &StreamServerConf) -> bool {
        let Some(stream) = self.cx.cfg.stream.as_ref() else {
            return true;
        };
        let base = self.cx.cfg.http.as_ref().map_or(0, |h| h.limit_zones.len());
        let mut took = Vec::new();
        let mut pass = true;
        let mut status = "";
        {
            let s = self.relay_session(key);
            for lc in &conf.limit_conn {
                let z = &stream.limit_zones[lc.zone];
                let mut v = Vec::new();
                session_parts(&mut v, &z.key, &s, self.cx.now_ms, &self.hostname, 0);
                if v.is_empty() {
                    continue;
                }
                let k = crate::limits::key_hash(&v);
                if self.zones[base + lc.zone].acquire(k, lc.max, self.cx.now_ms) {
                    took.push((base + lc.zone, k));
                    status = "PASSED";
                    continue;
                }
                let dry = conf.limit_conn_dry_run;
                status = if dry { "REJECTED_DRY_RUN" } else { "REJECTED" };
                crate::log!(
                    Error,
                    "limiting connections{} by zone \"{}\", client: {}, server: {}",
                    if dry { ", dry run," } else { "" },
                    z.name,
                    s.client.map_or("-".to_string(), |p| p.ip().to_string()),
                    s.local
                );
                if !dry {
                    pass = false;
                }
                break;
            }
        }
        let r = &mut self.relays[key];
        r.held = took;
        r.limit_conn_status = status;
        if !pass {
            r.fixed = Some((503, 0));
        }
        pass
    }

    /// `ssl_preread on`: reads the client's first bytes (kept in `early`, for the
    /// upstream) until they hold a whole ClientHello, are not TLS, end, or
    /// `preread_timeout` passes (then the session goes on, as nginx's); a full
    /// `preread_buffer_size` without one ends the session (400).
    fn relay_preread(&mut self, key: usize) -> Io {
        let limit = self
            .stream_server(self.relays[key].server)
            .preread_buffer_size;
        loop {
            let r = &mut self.relays[key];
            match crate::preread::parse(&r.early) {
                crate::preread::Preread::Hello(h) => {
                    r.hello = Some(Box::new(h));
                    break;
                }
                crate::preread::Preread::NotTls => break,
                crate::preread::Preread::Partial => {}
            }
            if r.early.len() >= limit {
                crate::log!(
                    Error,
                    "preread buffer full, client: {}, server: {}",
                    r.peer.map_or("-".to_string(), |p| p.ip().to_string()),
                    r.listen
                );
                r.fixed = Some((400, 0));
                return Io::Close;
            }
            let mut buf = vec![0u8; limit - r.early.len()];
            match shard_event::sock::read(r.client.raw(), &mut buf) {
                Ok(0) => break,
                Ok(n) => r.early.extend_from_slice(&buf[..n]),
                Err(e) if would_block(&e) => {
                    r.client.e.readable = false;
                    return Io::Wait;
                }
                Err(_) => return Io::Close,
            }
        }
        let r = &mut self.relays[key];
        r.prereading = false;
        r.preread_done = true;
        self.relay_content(key)
    }

    /// Stream upstream `i`: the configuration's, or one of this worker's (`stream_dyn`).
    pub(super) fn stream_ups(&self, i: usize) -> super::proxy::UpRef<'a> {
        let cfg = self.cx.cfg;
        let conf = cfg.stream.as_ref().map_or(&[][..], |s| &s.upstreams[..]);
        match conf.get(i) {
            Some(u) => super::proxy::UpRef::Conf(u),
            None => super::proxy::UpRef::Dyn(self.stream_dyn[i - conf.len()].clone()),
        }
    }

    /// What `proxy_pass $var` rendered to: an `upstream` name, an `ADDRESS:PORT`, or a
    /// `HOST:PORT` the server's `resolver` resolves (an upstream of this worker, made once
    /// per name and addresses). Anything else is logged as nginx and ends the session.
    fn stream_pass_target(&mut self, key: usize, target: &str) -> PassTarget {
        let cfg = self.cx.cfg;
        let conf = cfg.stream.as_ref().map_or(&[][..], |s| &s.upstreams[..]);
        if let Some(i) = conf.iter().position(|u| u.name == target) {
            return PassTarget::Ready(i);
        }
        let r = &self.relays[key];
        let client = r.peer.map_or("-".to_string(), |p| p.ip().to_string());
        let listen = r.listen;
        let addrs = match target.parse::<SocketAddr>() {
            Ok(addr) => vec![addr],
            Err(_) => {
                // A host name: its port is required (nginx's "no port in upstream").
                let port = target
                    .rsplit_once(':')
                    .filter(|(h, _)| !h.is_empty() && !h.ends_with(':'))
                    .and_then(|(h, p)| Some((h, p.parse::<u16>().ok()?)));
                let Some((host, port)) = port else {
                    crate::log!(
                        Error,
                        "no port in upstream \"{target}\", client: {client}, server: {listen}"
                    );
                    // nginx's evaluation errors end the session with 500.
                    self.relays[key].fixed = Some((500, 0));
                    return PassTarget::Fail;
                };
                let Some(rconf) = self.stream_server(r.server).resolver.clone() else {
                    crate::log!(
                        Error,
                        "no resolver defined to resolve {host}, client: {client}, server: {listen}"
                    );
                    self.relays[key].fixed = Some((500, 0));
                    return PassTarget::Fail;
                };
                let waiter = (key, r.id | super::resolver::RELAY_WAITER);
                match self.resolve_for(Some(waiter), host, &rconf) {
                    super::resolver::Resolved::Ready(ips) => ips
                        .into_iter()
                        .map(|ip| SocketAddr::new(ip, port))
                        .collect(),
                    super::resolver::Resolved::Failed(e) => {
                        crate::log!(
                            Error,
                            "{host} could not be resolved ({}), client: {client}, server: {listen}",
                            e.text()
                        );
                        return PassTarget::Fail;
                    }
                    super::resolver::Resolved::Waiting => return PassTarget::Wait,
                }
            }
        };
        if let Some(&i) = self.stream_dyn_index.get(target) {
            let u = &self.stream_dyn[i];
            if u.peers.len() == addrs.len() && u.peers.iter().zip(&addrs).all(|(p, a)| p.addr == *a)
            {
                return PassTarget::Ready(conf.len() + i);
            }
        }
        if self.stream_dyn.len() >= STREAM_DYN_MAX {
            crate::log!(
                Error,
                "too many proxy_pass addresses in this worker ({STREAM_DYN_MAX}), client: {client}, server: {listen}"
            );
            self.relays[key].fixed = Some((500, 0));
            return PassTarget::Fail;
        }
        let peers = addrs
            .iter()
            .map(|&addr| shard_config::PeerConf {
                addr,
                name: addr.to_string(),
                weight: 1,
                max_fails: 1,
                fail_timeout_ms: 10_000,
                max_conns: 0,
                unix: None,
                backup: false,
                down: false,
                resolve: None,
            })
            .collect();
        let u = shard_config::UpstreamConf {
            name: target.to_string(),
            place: shard_config::Place {
                file: String::new(),
                line: 0,
            },
            peers,
            keepalive: 0,
            keepalive_timeout_ms: 60_000,
            keepalive_requests: 1000,
            keepalive_time_ms: 3_600_000,
            balance: shard_config::Balance::RoundRobin,
            resolver: None,
        };
        self.peer_state.push(balance::PeerState::table(&u.peers));
        self.stream_dyn.push(std::rc::Rc::new(u));
        let i = self.stream_dyn.len() - 1;
        self.stream_dyn_index.insert(target.to_string(), i);
        PassTarget::Ready(conf.len() + i)
    }

    /// The `resolver` answered for a session that waited on it: it goes on.
    pub(super) fn resume_resolved_relay(&mut self, key: usize) {
        let r = &mut self.relays[key];
        if !r.resolving {
            return;
        }
        r.resolving = false;
        let outer = crate::log::set_connection(r.number);
        let outer_ctx = crate::log::set_context(r.log_ctx.0, r.log_ctx.1);
        let io = self.relay_content(key);
        self.end_relay_turn(key, io);
        crate::log::restore_context(outer_ctx);
        crate::log::set_connection(outer);
    }

    /// The content phase: `return`'s value to the client (through TLS on a `listen ... ssl`),
    /// or the upstream.
    fn relay_content(&mut self, key: usize) -> Io {
        let server = self.relays[key].server;
        let cfg = self.cx.cfg;
        let Some(conf) = cfg.stream.as_ref().map(|s| &s.servers[server]) else {
            return Io::Close;
        };
        let r = &mut self.relays[key];
        if conf.ssl_preread && !r.preread_done && r.tls.is_none() {
            r.prereading = true;
            self.set_relay_deadline(key, self.cx.now_ms + conf.preread_timeout_ms);
            return self.relay_preread(key);
        }
        let Some(parts) = conf.ret.as_ref() else {
            if let Some(pass) = &conf.pass_vars {
                let mut v = Vec::new();
                let s = self.relay_session(key);
                session_parts(&mut v, pass, &s, self.cx.now_ms, &self.hostname, 0);
                let target = String::from_utf8_lossy(&v).into_owned();
                let i = match self.stream_pass_target(key, &target) {
                    PassTarget::Ready(i) => i,
                    PassTarget::Fail => return Io::Close,
                    PassTarget::Wait => {
                        let timeout = conf.resolver.as_ref().map_or(30_000, |r| r.timeout_ms);
                        // The resolver ends the query at `resolver_timeout` (and the session
                        // then with nginx's line); this deadline is the backstop.
                        self.relays[key].resolving = true;
                        self.set_relay_deadline(key, self.cx.now_ms + timeout + 1_000);
                        return Io::Wait;
                    }
                };
                let n = self.stream_ups(i).peers.len();
                let r = &mut self.relays[key];
                r.ups = i;
                r.tried = vec![false; n];
            }
            return self.connect_next(key);
        };
        let mut text = Vec::new();
        session_parts(
            &mut text,
            parts,
            &self.relay_session(key),
            self.cx.now_ms,
            &self.hostname,
            0,
        );
        let r = &mut self.relays[key];
        let fd = r.client.raw();
        let sent = match r.tls.as_mut() {
            Some(t) => {
                use std::io::Write;
                let _ = t.conn.writer().write_all(&text);
                t.conn.send_close_notify();
                let _ = super::tls::flush(fd, t);
                text.len()
            }
            None => shard_event::sock::write(fd, &text).unwrap_or(0),
        };
        shard_event::sock::shutdown_write(fd);
        r.fixed = Some((200, sent as u64));
        Io::Close
    }

    /// Reads the client's PROXY protocol header (`listen ... proxy_protocol`), as the HTTP
    /// side does: looked at with `MSG_PEEK` until whole, then exactly its bytes read.
    fn relay_read_pp(&mut self, key: usize) -> Io {
        use shard_http::proxy_protocol::{parse, Parsed, MAX_HEADER, V1_MAX};
        let r = &mut self.relays[key];
        if !r.client.e.readable {
            return Io::Wait;
        }
        let fd = r.client.raw();
        let mut buf = vec![0u8; MAX_HEADER];
        match shard_event::sock::peek(fd, &mut buf) {
            Ok(0) => Io::Close,
            Ok(n) => match parse(&buf[..n]) {
                Parsed::Partial if n < MAX_HEADER => {
                    r.client.e.readable = false;
                    Io::Wait
                }
                Parsed::Complete(h, len) => match shard_event::sock::read(fd, &mut buf[..len]) {
                    Ok(got) if got == len => {
                        r.pp = Some(Box::new(h));
                        r.pp_pending = false;
                        self.relay_begin(key)
                    }
                    _ => Io::Close,
                },
                Parsed::Partial | Parsed::Invalid => {
                    let text: String = buf[..n.min(V1_MAX)]
                        .iter()
                        .flat_map(|&b| std::ascii::escape_default(b))
                        .map(char::from)
                        .collect();
                    crate::log!(
                        Error,
                        "broken header: \"{text}\" while reading PROXY protocol, client: {}, server: {}",
                        r.peer.map_or("-".to_string(), |p| p.ip().to_string()),
                        r.listen
                    );
                    Io::Close
                }
            },
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                r.client.e.readable = false;
                Io::Wait
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Io::Wait,
            Err(_) => Io::Close,
        }
    }

    /// Drives a TLS client's handshake; connects to the upstream when it is done.
    fn handshake(&mut self, key: usize) -> Io {
        if self.relays[key]
            .tls
            .as_ref()
            .is_some_and(|t| t.cert_pending)
        {
            if let Some(io) = self.stream_render_certs(key) {
                return io;
            }
        }
        let r = &mut self.relays[key];
        let fd = r.client.raw();
        let Some(t) = r.tls.as_mut() else {
            r.handshaking = false;
            return self.relay_content(key);
        };
        let room = EARLY_BYTES_MAX.saturating_sub(r.early.len());
        if r.client.e.readable && room > 0 {
            match super::tls::read_into(fd, t, &mut r.early, room) {
                Ok(0) if t.conn.is_handshaking() => return Io::Close,
                Ok(_) => {}
                Err(super::tls::NotTls::Error(e)) if e.kind() == io::ErrorKind::WouldBlock => {
                    r.client.e.readable = false;
                }
                Err(_) => return Io::Close,
            }
        }
        match super::tls::flush(fd, t) {
            Ok(true) => {}
            Ok(false) => r.client.e.writable = false,
            Err(_) => return Io::Close,
        }
        if t.conn.is_handshaking() {
            return Io::Wait;
        }
        r.handshaking = false;
        if !self.stream_client_verified(key) {
            self.relays[key].fixed = Some((500, 0));
            return Io::Close;
        }
        self.relay_content(key)
    }

    /// `ssl_verify_client` of a stream server, once the handshake is done: as nginx's stream
    /// SSL handler, a failed certificate (or none, with `on`) is logged at `info` and ends
    /// the session.
    fn stream_client_verified(&mut self, key: usize) -> bool {
        use shard_config::VerifyClient;
        let server = self.relays[key].server;
        let conf = self.stream_server(server);
        let (mode, depth) = (conf.ssl.verify_client, conf.ssl.verify_depth);
        if mode == VerifyClient::Off {
            return true;
        }
        let verifier = self.tls.stream_verifier(server).cloned();
        let r = &mut self.relays[key];
        let Some(t) = r.tls.as_mut() else {
            return true;
        };
        let cc = super::tls::client_cert(t, server, verifier.as_ref(), depth);
        let why = match (cc.outcome, mode) {
            (super::tls::ClientOutcome::None, VerifyClient::On) => {
                "client sent no required SSL certificate".to_string()
            }
            (super::tls::ClientOutcome::Failed { issuer: true }, VerifyClient::OptionalNoCa) => {
                return true
            }
            (super::tls::ClientOutcome::Failed { .. }, _) => {
                let why = cc.verify.strip_prefix("FAILED:").unwrap_or(&cc.verify);
                format!(
                    "client SSL certificate verify error: ({}:{why})",
                    cc.error_code
                )
            }
            _ => return true,
        };
        crate::log!(
            Info,
            "{why}, client: {}, server: {}",
            r.peer.map_or("-".to_string(), |p| p.ip().to_string()),
            r.listen
        );
        false
    }

    /// Acts on what a relay step decided: the one place a relay closes, apart from the
    /// worker's shutdown.
    fn end_relay_turn(&mut self, key: usize, io: Io) {
        if io == Io::Close {
            self.close_relay(key);
        }
    }

    fn set_relay_deadline(&mut self, key: usize, deadline: u64) {
        let r = &mut self.relays[key];
        r.deadline_ms = deadline;
        if deadline < r.timer_at {
            r.timer_at = deadline;
            self.relay_timers.push(Reverse((deadline, key, r.id)));
        }
    }

    /// The upstream's method (smooth weighted round robin, or `least_conn` over this
    /// worker's relays) over the peers not yet tried by this relay.
    pub(super) fn pick_peer(
        &mut self,
        upstream: usize,
        tried: &[bool],
        key: Option<&[u8]>,
    ) -> Option<usize> {
        self.cx.cfg.stream.as_ref()?;
        let ups = self.stream_ups(upstream);
        // This worker's relays per peer: for `least_conn` and `max_conns`.
        let least = ups.balance == shard_config::Balance::LeastConn;
        let two = ups.balance == shard_config::Balance::Random { two: true };
        let mut active = Vec::new();
        if least || two || ups.peers.iter().any(|p| p.max_conns > 0) {
            active = vec![0u64; ups.peers.len()];
            for (_, r) in self.relays.iter() {
                if r.ups == upstream {
                    if let Some(p) = r.current_peer {
                        active[p] += 1;
                    }
                }
            }
            super::udp::count_udp_peers(&self.udp, upstream, &mut active);
        }
        let full = balance::with_full(&ups.peers, tried, &active);
        let tried = full.as_deref().unwrap_or(tried);
        // An empty key falls back to round robin (below), as nginx.
        let key = key.filter(|k| !k.is_empty());
        if let (shard_config::Balance::Hash { consistent, .. }, Some(key)) = (&ups.balance, key) {
            let state = &mut self.peer_state[upstream];
            if *consistent {
                let ring = self
                    .stream_rings
                    .entry(upstream)
                    .or_insert_with(|| balance::ring(&ups.peers));
                return balance::pick_consistent(
                    &ups.peers,
                    state,
                    tried,
                    ring,
                    key,
                    self.cx.now_ms,
                );
            }
            return balance::pick_hash(&ups.peers, state, tried, key, self.cx.now_ms);
        }
        if let shard_config::Balance::Random { two } = ups.balance {
            return balance::pick_random(
                &ups.peers,
                &mut self.peer_state[upstream],
                tried,
                &active,
                two,
                &mut self.rng,
                self.cx.now_ms,
            );
        }
        if least {
            return balance::pick_least_conn(
                &ups.peers,
                &mut self.peer_state[upstream],
                tried,
                &active,
                self.cx.now_ms,
            );
        }
        balance::pick(
            &ups.peers,
            &mut self.peer_state[upstream],
            tried,
            self.cx.now_ms,
        )
    }

    pub(super) fn peer_failed(&mut self, upstream: usize, peer: usize) {
        if self.cx.cfg.stream.is_none() {
            return;
        }
        let ups = self.stream_ups(upstream);
        let peers = &ups.peers;
        if balance::failed(peers, &mut self.peer_state[upstream], peer, self.cx.now_ms) {
            crate::log!(
                Warn,
                "upstream server temporarily disabled, upstream: \"{}\"",
                peers[peer].addr
            );
        }
    }

    fn log_upstream_error(&self, key: usize, what: &str) {
        self.log_upstream_error_in(key, what, "connecting to upstream");
    }

    /// `{what} while {during}, client: ..., server: ..., upstream: "..."`, nginx's shape.
    fn log_upstream_error_in(&self, key: usize, what: &str, during: &str) {
        let r = &self.relays[key];
        let addr = match r.current_peer {
            Some(p) if r.ups != usize::MAX => self.stream_ups(r.ups).peers[p].addr.to_string(),
            _ => String::new(),
        };
        crate::log!(
            Info,
            "{what} while {during}, client: {}, server: {}, upstream: \"{addr}\"",
            r.peer.map_or("-".to_string(), |p| p.ip().to_string()),
            r.listen
        );
    }

    /// `ssl_certificate` with variables in a stream server: peeks at the hello, renders and
    /// loads the pairs with the session's variables (`$ssl_server_name` the peeked SNI), and
    /// leaves them for the resolver; a pair that cannot be loaded fails the handshake.
    /// `Some` when the hello is not whole yet.
    fn stream_render_certs(&mut self, key: usize) -> Option<Io> {
        use super::tls::Peek;
        let r = &mut self.relays[key];
        if !r.client.e.readable {
            return Some(Io::Wait);
        }
        let sni = match super::tls::peek_hello(r.client.raw()) {
            Peek::Wait => {
                r.client.e.readable = false;
                return Some(Io::Wait);
            }
            Peek::Other => {
                r.tls.as_mut()?.cert_pending = false;
                return None;
            }
            Peek::Hello(sni) => sni,
        };
        r.tls.as_mut()?.peeked(sni);
        let server = r.server;
        // The session's TLS variables are shown while the pairs render (only the SNI has a
        // value yet).
        r.handshaking = false;
        let srv = self.stream_server(server);
        let mut keys = Vec::new();
        for pair in &srv.ssl.certificates {
            let Some(v) = pair.vars.as_ref() else {
                continue;
            };
            let text = |b: Vec<u8>| String::from_utf8_lossy(&b).into_owned();
            let cert = v.dir.join(text(self.render_session(key, &v.cert)));
            let key_path = v.dir.join(text(self.render_session(key, &v.key)));
            let loaded = crate::tls::load_rendered(
                &cert,
                &key_path,
                pair.password_file.as_deref(),
                &pair.place,
            );
            match loaded {
                Ok(k) => keys.push(k),
                Err(e) => {
                    let r = &self.relays[key];
                    crate::log!(
                        Error,
                        "{e} while SSL handshaking, client: {}, server: {}",
                        r.peer.map_or("-".to_string(), |p| p.ip().to_string()),
                        r.listen
                    );
                    keys.clear();
                    break;
                }
            }
        }
        let r = &mut self.relays[key];
        r.handshaking = true;
        if let Some(t) = r.tls.as_mut() {
            t.chosen = Some(keys);
        }
        None
    }

    /// A value with the stream's variables, for relay `key`.
    fn render_session(&self, key: usize, parts: &[shard_config::Part]) -> Vec<u8> {
        let mut v = Vec::new();
        session_parts(
            &mut v,
            parts,
            &self.relay_session(key),
            self.cx.now_ms,
            &self.hostname,
            0,
        );
        v
    }

    /// `proxy_bind`'s address for this session (`None`: off, empty or unparsable, the last
    /// logged as nginx's "invalid local address").
    fn stream_bind_addr(&self, key: usize) -> Option<std::net::SocketAddr> {
        let parts = self.stream_server(self.relays[key].server).bind.as_ref()?;
        let v = self.render_session(key, parts);
        let text = String::from_utf8_lossy(&v);
        if text.is_empty() {
            return None;
        }
        let a = shard_config::parse_bind_addr(&text);
        if a.is_none() {
            crate::log!(Error, "invalid local address \"{text}\"");
        }
        a
    }

    fn connect_next(&mut self, key: usize) -> Io {
        let server = self.relays[key].server;
        let upstream = self.relays[key].ups;
        let (connect_timeout, next_upstream, tries_max, tries_ms) = {
            let s = self.stream_server(server);
            (
                s.connect_timeout_ms,
                s.next_upstream,
                s.next_upstream_tries as usize,
                s.next_upstream_timeout_ms,
            )
        };
        if upstream == usize::MAX {
            return Io::Close;
        }
        // `hash KEY`: the key, rendered once per session.
        let ups = self.stream_ups(upstream);
        let hashed = match &ups.balance {
            shard_config::Balance::Hash { key, .. } => Some(key),
            _ => None,
        };
        let hash_key = hashed.map(|parts| self.render_session(key, parts));
        loop {
            let r = &mut self.relays[key];
            // `proxy_next_upstream off`: one attempt only.
            if !next_upstream && r.current_peer.is_some() {
                return Io::Close;
            }
            // `proxy_next_upstream_tries`, `proxy_next_upstream_timeout`.
            if r.current_peer.is_some()
                && ((tries_max > 0 && r.attempts.len() >= tries_max)
                    || (tries_ms > 0 && self.cx.now_ms.saturating_sub(r.started_ms) >= tries_ms))
            {
                return Io::Close;
            }
            // Dropping the failed attempt's socket closes it.
            r.upstream = Side::new(None);
            r.up_tls = None;
            r.up_handshaking = false;
            r.up_fin_pending = false;
            let first = r.current_peer.is_none();
            // An upstream `proxy_pass $var` made is the session's own in nginx: no failure
            // of an earlier session counts.
            let conf_ups = self.stream().upstreams.len();
            if first && upstream >= conf_ups {
                let peers = &self.stream_ups(upstream).peers;
                self.peer_state[upstream] = balance::PeerState::table(peers);
            }
            let r = &mut self.relays[key];
            let tried = std::mem::take(&mut r.tried);
            let pick = self.pick_peer(upstream, &tried, hash_key.as_deref());
            let r = &mut self.relays[key];
            r.tried = tried;
            let Some(p) = pick else {
                // Every peer tried: the session ends. Peers left but none live: nginx's "no
                // live upstreams", an attempt named by the upstream. (`balance::pick` marked
                // every peer live again.)
                // (A `down` peer is never counted as one left, as nginx's tries count.)
                let r = &self.relays[key];
                let peers = &self.stream_ups(upstream).peers;
                let left = r
                    .tried
                    .iter()
                    .zip(peers.iter())
                    .any(|(t, p)| !*t && !p.down);
                if !first && !left {
                    return Io::Close;
                }
                crate::log!(
                    Error,
                    "no live upstreams while connecting to upstream, client: {}, server: {}",
                    r.peer.map_or("-".to_string(), |p| p.ip().to_string()),
                    r.listen
                );
                let name = self.stream_ups(upstream).name.clone();
                self.relays[key].no_live = Some(name);
                return Io::Close;
            };
            r.tried[p] = true;
            r.current_peer = Some(p);
            let addr = self.stream_ups(upstream).peers[p].addr;
            let r = &mut self.relays[key];
            r.attempts.push(addr);
            r.connect_began_ms = self.cx.now_ms;
            let local = self.stream_bind_addr(key);
            let connected = match &self.stream_ups(upstream).peers[p].unix {
                Some(path) => {
                    shard_event::sock::connect_unix_nonblocking(path).map_err(ConnectError::Connect)
                }
                None => shard_event::sock::connect_nonblocking_from(
                    &addr,
                    local,
                    self.stream_server(self.relays[key].server).bind_transparent,
                ),
            };
            let (fd, done) = match connected {
                Ok(Connect::Done(fd)) => (fd, true),
                Ok(Connect::InProgress(fd)) => (fd, false),
                Err(ConnectError::Bind(e)) => {
                    // nginx: the session ends with 500, no other peer is tried.
                    crate::log!(
                        Crit,
                        "bind({}) failed ({})",
                        local.map_or_else(String::new, |a| if a.port() == 0 {
                            a.ip().to_string()
                        } else {
                            a.to_string()
                        }),
                        shard_event::os_error_text(&e)
                    );
                    self.relays[key].fixed = Some((500, 0));
                    return Io::Close;
                }
                Err(ConnectError::Transparent(e)) => {
                    crate::log!(
                        Alert,
                        "setsockopt(IP_TRANSPARENT) failed ({})",
                        shard_event::os_error_text(&e)
                    );
                    self.relays[key].fixed = Some((500, 0));
                    return Io::Close;
                }
                Err(ConnectError::Connect(e)) => {
                    self.log_upstream_error(
                        key,
                        &format!("connect() failed ({})", shard_event::os_error_text(&e)),
                    );
                    self.peer_failed(upstream, p);
                    continue;
                }
            };
            let raw = fd.as_raw_fd();
            // nginx's stream `tcp_nodelay on` (its default), on both sides.
            let _ = shard_event::sock::set_nodelay(raw, true);
            let r = &mut self.relays[key];
            r.upstream = Side::new(Some(fd));
            r.upstream.e.writable = done;
            if let Err(e) = self.poll.add(raw, token(key, r.id, true), relay_interest()) {
                crate::log!(
                    Alert,
                    "epoll_ctl(ADD) failed ({})",
                    shard_event::os_error_text(&e)
                );
                return Io::Close;
            }
            if done {
                return self.connected(key);
            }
            self.set_relay_deadline(key, self.cx.now_ms + connect_timeout);
            return Io::Wait;
        }
    }

    /// The upstream socket reported writability while connecting: finished, failed or
    /// spurious (an event of a previous attempt's socket).
    fn check_connect(&mut self, key: usize) -> Io {
        let r = &mut self.relays[key];
        if !r.upstream.e.writable || r.upstream.fd.is_none() {
            return Io::Wait;
        }
        let fd = r.upstream.raw();
        let failure = match shard_event::sock::take_error(fd) {
            Ok(Some(e)) | Err(e) => Some(e),
            Ok(None) => match shard_event::sock::peer_addr(fd) {
                Ok(_) => None,
                Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => {
                    r.upstream.e.writable = false;
                    return Io::Wait;
                }
                Err(e) => Some(e),
            },
        };
        match failure {
            None => self.connected(key),
            Some(e) => {
                self.log_upstream_error(
                    key,
                    &format!("connect() failed ({})", shard_event::os_error_text(&e)),
                );
                self.fail_current_peer(key);
                self.connect_next(key)
            }
        }
    }

    fn fail_current_peer(&mut self, key: usize) {
        let r = &self.relays[key];
        let upstream = r.ups;
        if let Some(p) = r.current_peer {
            self.peer_failed(upstream, p);
        }
    }

    fn connected(&mut self, key: usize) -> Io {
        let s = self.stream_server(self.relays[key].server);
        if let Some(ssl) = s.proxy_ssl.as_ref() {
            // `proxy_ssl on`: the handshake first, within `proxy_connect_timeout`.
            let config = match ssl.certificate_vars.as_ref() {
                None => self.tls.upstream(ssl).cloned(),
                Some(vars) => {
                    let text = |b: Vec<u8>| String::from_utf8_lossy(&b).into_owned();
                    let cert = text(self.render_session(key, &vars.cert));
                    let key_name = text(self.render_session(key, &vars.key));
                    match self.client_tls(ssl, vars, &cert, &key_name, &s.place) {
                        Ok(c) => c,
                        Err(e) => {
                            self.log_upstream_error(key, &e);
                            return Io::Close;
                        }
                    }
                }
            };
            let Some(config) = config else {
                // Built by the master for every `proxy_ssl on` server.
                self.log_upstream_error(key, "no TLS client configuration for proxy_ssl");
                return Io::Close;
            };
            let config = &config;
            let name = match &ssl.name_vars {
                Some(t) => {
                    let v =
                        String::from_utf8_lossy(&self.render_session(key, &t.parts)).into_owned();
                    Some(super::proxy::host_of(&v).to_string())
                }
                // A port in the name is dropped, as nginx drops it.
                None => ssl
                    .name
                    .as_deref()
                    .map(|n| super::proxy::host_of(n).to_string()),
            }
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| {
                super::proxy::host_of(&self.stream_ups(self.relays[key].ups).name).to_string()
            });
            let conn = rustls::pki_types::ServerName::try_from(name)
                .map_err(|e| e.to_string())
                .and_then(|n| {
                    rustls::ClientConnection::new(config.clone(), n).map_err(|e| e.to_string())
                });
            let timeout = s.connect_timeout_ms;
            let pp = s.proxy_protocol.then(|| self.pp_header(key));
            match conn {
                Ok(c) => {
                    let r = &mut self.relays[key];
                    r.up_tls = Some(Box::new(c));
                    r.up_handshaking = true;
                    r.pp_plain = pp.unwrap_or_default();
                    r.pp_out = 0;
                    self.set_relay_deadline(key, self.cx.now_ms + timeout);
                    return self.up_handshake(key);
                }
                Err(e) => {
                    self.log_upstream_error(
                        key,
                        &format!("SSL to the upstream cannot start ({e})"),
                    );
                    return Io::Close;
                }
            }
        }
        self.relay_ready(key)
    }

    /// One step of the TLS handshake with the upstream; the relay starts when it is done,
    /// the next peer is tried when it fails.
    fn up_handshake(&mut self, key: usize) -> Io {
        let r = &mut self.relays[key];
        let fd = r.upstream.raw();
        // The PROXY header goes first, in plain text.
        while !r.pp_plain.is_empty() {
            if !r.upstream.e.writable {
                return Io::Wait;
            }
            match shard_event::sock::write(fd, &r.pp_plain) {
                // Not in the pipe's count (`pp_out` stays 0): nothing to take from it.
                Ok(n) => {
                    r.pp_plain.drain(..n);
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    r.upstream.e.writable = false;
                    return Io::Wait;
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    let msg = format!("send() failed ({e})");
                    self.log_upstream_error_in(key, &msg, "SSL handshaking to upstream");
                    self.fail_current_peer(key);
                    return self.connect_next(key);
                }
            }
        }
        let Some(c) = r.up_tls.as_mut() else {
            return Io::Close;
        };
        let e = &mut r.upstream.e;
        match super::tls::handshake_up(fd, c, &mut e.readable, &mut e.writable) {
            Ok(true) => {
                r.up_handshaking = false;
                self.relay_ready(key)
            }
            Ok(false) => Io::Wait,
            Err(e) => {
                self.log_upstream_error_in(
                    key,
                    &format!("SSL_do_handshake() failed ({e})"),
                    "SSL handshaking to upstream",
                );
                self.fail_current_peer(key);
                self.connect_next(key)
            }
        }
    }

    /// A rate directive's value for this session (variables rendered now; an empty or
    /// invalid value is no limit).
    fn session_size(&self, key: usize, v: &shard_config::SizeValue) -> u64 {
        match v {
            shard_config::SizeValue::Fixed(n) => *n,
            shard_config::SizeValue::Vars(parts) => {
                let text = String::from_utf8_lossy(&self.render_session(key, parts)).into_owned();
                shard_config::parse_size(&text).unwrap_or(0)
            }
        }
    }

    /// The PROXY protocol v1 header for the upstream (`proxy_protocol on`), with the
    /// client's addresses (those its own PROXY header gave, when it sent one).
    fn pp_header(&self, key: usize) -> Vec<u8> {
        let r = &self.relays[key];
        let from_header = r.pp.as_ref().and_then(|h| h.src.zip(h.dst));
        let local = shard_event::sock::local_addr(r.client.raw()).ok();
        let pair = from_header.or_else(|| r.peer.zip(local));
        let mut head = Vec::with_capacity(64);
        match pair {
            Some((src, dst)) => shard_http::proxy_protocol::write_v1(&mut head, src, dst),
            None => head.extend_from_slice(b"PROXY UNKNOWN\r\n"),
        }
        head
    }

    /// The upstream is connected (and its TLS handshake done): the pipes, then bytes.
    fn relay_ready(&mut self, key: usize) -> Io {
        let rates = {
            let s = self.stream_server(self.relays[key].server);
            (
                self.session_size(key, &s.download_rate),
                self.session_size(key, &s.upload_rate),
            )
        };
        self.relays[key].rates = rates;
        let upstream = self.relays[key].ups;
        let (size, timeout, send_pp) = {
            let s = self.stream_server(self.relays[key].server);
            (s.buffer_size, s.timeout_ms, s.proxy_protocol)
        };
        let r = &mut self.relays[key];
        r.connecting = false;
        r.connect_ms = Some(self.cx.now_ms.saturating_sub(r.connect_began_ms));
        if crate::log::enabled(shard_config::LogLevel::Info) {
            let up = r.upstream.raw();
            let local =
                shard_event::sock::local_addr(up).map_or("-".to_string(), |a| a.to_string());
            let peer = r.attempts.last().map_or("-".to_string(), |a| a.to_string());
            crate::log!(Info, "proxy {local} connected to {peer}");
        }
        // `proxy_protocol on`: the header first (over TLS, it went before the handshake).
        let pp = (send_pp && self.relays[key].up_tls.is_none()).then(|| self.pp_header(key));
        let r = &mut self.relays[key];
        // What the client sent with the end of its handshake goes first.
        let mut early = std::mem::take(&mut r.early);
        if let Some(mut head) = pp {
            r.pp_out = head.len() as u64;
            head.extend_from_slice(&early);
            early = head;
        }
        r.up = Some(Pipe::with(size, &early));
        r.down = Some(Pipe::new(size));
        if let Some(p) = r.current_peer {
            balance::succeeded(&mut self.peer_state[upstream], p);
        }
        self.set_relay_deadline(key, self.cx.now_ms + timeout);
        self.pump(key)
    }

    pub(super) fn on_relay_event(
        &mut self,
        key: usize,
        generation: u32,
        upstream: bool,
        ev: shard_event::Event,
    ) {
        let Some(r) = self.relays.get_mut(key) else {
            return;
        };
        if token::generation(r.id) != generation {
            return; // registered for a relay that closed since
        }
        let outer = crate::log::set_connection(r.number);
        let outer_ctx = crate::log::set_context(r.log_ctx.0, r.log_ctx.1);
        let side = if upstream {
            &mut r.upstream
        } else {
            &mut r.client
        };
        if ev.readable() {
            side.e.readable = true;
        }
        if ev.writable() {
            side.e.writable = true;
        }
        let io = match (r.connecting, upstream) {
            (true, false) if r.pp_pending => self.relay_read_pp(key),
            (true, false) if r.handshaking => self.handshake(key),
            (true, false) if r.prereading => self.relay_preread(key),
            (true, true) if r.up_handshaking => self.up_handshake(key),
            (true, true) => self.check_connect(key),
            (true, false) => Io::Wait,
            (false, _) => self.pump(key),
        };
        self.end_relay_turn(key, io);
        crate::log::restore_context(outer_ctx);
        crate::log::set_connection(outer);
    }

    /// Moves bytes both ways until both sides must wait or the turn's budget is used; `Close`
    /// when both directions are done or one failed.
    fn pump(&mut self, key: usize) -> Io {
        let conf = self.stream_server(self.relays[key].server);
        let (timeout, half_close) = (conf.timeout_ms, conf.half_close);
        let now = self.cx.now_ms;
        let r = &mut self.relays[key];
        let (down_rate, up_rate) = r.rates;
        let (started, pp_out) = (r.started_ms, r.pp_out);
        let (Some(up), Some(down)) = (r.up.as_mut(), r.down.as_mut()) else {
            return Io::Wait;
        };
        let mut moved = false;
        let mut rounds = 0;
        let mut yielded = false;
        let result = loop {
            rounds += 1;
            if rounds > super::TURN_ROUNDS_MAX {
                // Both sides keep up: go on after the worker's other connections.
                yielded = true;
                break Ok(());
            }
            let (c, u) = (r.client.raw(), r.upstream.raw());
            let mut up_plain = Fd(u);
            let mut up_tls_side;
            let up_side: &mut dyn Endpoint = match r.up_tls.as_mut() {
                Some(t) => {
                    up_tls_side = super::tls::UpTlsSide {
                        fd: u,
                        c: t,
                        fin_pending: &mut r.up_fin_pending,
                    };
                    &mut up_tls_side
                }
                None => &mut up_plain,
            };
            let mut plain = Fd(c);
            let mut tls_side;
            let client: &mut dyn Endpoint = match r.tls.as_mut() {
                Some(t) => {
                    tls_side = super::tls::TlsSide { fd: c, t };
                    &mut tls_side
                }
                None => &mut plain,
            };
            let up_cap = rate_cap(
                up_rate,
                now.saturating_sub(started),
                up.taken().saturating_sub(pp_out),
            );
            let down_cap = rate_cap(down_rate, now.saturating_sub(started), down.taken());
            let a = move_between(
                client,
                &mut r.client.e,
                up_side,
                &mut r.upstream.e,
                up,
                up_cap,
            );
            let b = move_between(
                up_side,
                &mut r.upstream.e,
                client,
                &mut r.client.e,
                down,
                down_cap,
            );
            match (a, b) {
                (Err(e), _) | (_, Err(e)) => break Err(e),
                (Ok(false), Ok(false)) => break Ok(()),
                _ => moved = true,
            }
        };
        if r.first_byte_ms.is_none() && down.taken() > 0 {
            r.first_byte_ms = Some(self.cx.now_ms.saturating_sub(r.started_ms));
        }
        // Records TLS still holds for the client go out as the socket takes them.
        let mut tls_pending = false;
        if let Some(t) = r.tls.as_mut() {
            if r.client.e.writable && t.has_output() {
                match super::tls::flush(r.client.raw(), t) {
                    Ok(true) => {}
                    Ok(false) => r.client.e.writable = false,
                    Err(_) => return Io::Close,
                }
            }
            tls_pending = t.has_output();
            if !t.counted && !t.conn.is_handshaking() {
                t.counted = true;
                WorkerSlot::bump(&self.cx.slot.tls_handshakes, 1);
                WorkerSlot::bump(&self.cx.slot.tls_handshake_us, t.handshake_ns / 1000);
            }
        }
        if let Some(t) = r.up_tls.as_mut() {
            if r.upstream.e.writable && (t.wants_write() || r.up_fin_pending) {
                match super::tls::finish_up(r.upstream.raw(), t, &mut r.up_fin_pending) {
                    Ok(true) => {}
                    Ok(false) => r.upstream.e.writable = false,
                    Err(_) => return Io::Close,
                }
            }
            tls_pending |= t.wants_write() || r.up_fin_pending;
        }
        // Without `proxy_half_close`, the session ends once either side ended and what it
        // sent was delivered (the FIN passed on marks that).
        let ended = if half_close {
            r.upstream.e.shut && r.client.e.shut
        } else {
            r.upstream.e.shut || r.client.e.shut
        };
        let done = ended && !tls_pending;
        let generation = token::generation(r.id);
        if let Err((op, e)) = result {
            crate::log!(
                Info,
                "{op} failed ({}) while proxying connection, client: {}, server: {}",
                shard_event::os_error_text(&e),
                r.peer.map_or("-".to_string(), |p| p.ip().to_string()),
                r.listen
            );
            return Io::Close;
        }
        if done {
            return Io::Close;
        }
        // A side whose rate is spent and that has more to read waits for its next share.
        let mut wake = u64::MAX;
        if !r.client.e.eof && r.client.e.readable {
            wake = wake.min(rate_wake(
                up_rate,
                now.saturating_sub(started),
                up.taken().saturating_sub(pp_out),
            ));
        }
        if !r.upstream.e.eof && r.upstream.e.readable {
            wake = wake.min(rate_wake(
                down_rate,
                now.saturating_sub(started),
                down.taken(),
            ));
        }
        if moved {
            self.set_relay_deadline(key, self.cx.now_ms + timeout);
        }
        if wake != u64::MAX {
            let at = now + wake;
            let r = &mut self.relays[key];
            if r.rate_wake_ms == 0 || at < r.rate_wake_ms {
                r.rate_wake_ms = at;
                if at < r.timer_at {
                    r.timer_at = at;
                    self.relay_timers.push(Reverse((at, key, r.id)));
                }
            }
        }
        if yielded {
            self.yield_turn(Token::RelayClient { key, generation });
        }
        Io::Wait
    }

    /// The next turn of a relay that used up its budget.
    pub(super) fn resume_relay(&mut self, key: usize) {
        let io = self.pump(key);
        self.end_relay_turn(key, io);
    }

    pub(super) fn close_relay(&mut self, key: usize) {
        if !self.relays.contains(key) {
            return;
        }
        let server = self.relays[key].server;
        crate::debug!("close stream connection: {}", self.relays[key].client.raw());
        crate::log::debug_connection(self.relays[key].number, false);
        if crate::log::enabled(shard_config::LogLevel::Info) {
            // nginx's closing line: who ended it, and the bytes each way.
            let s = self.relay_session(key);
            let r = &self.relays[key];
            let who = if r.upstream.e.eof && !r.client.e.eof {
                "upstream"
            } else {
                "client"
            };
            crate::log!(
                Info,
                "{who} disconnected, bytes from/to client:{}/{}, bytes from/to upstream:{}/{}",
                s.bytes_received,
                s.bytes_sent,
                s.up_received,
                s.up_sent
            );
        }
        if !self.stream_server(server).access_logs.is_empty() {
            let lines = self.session_lines(server, &self.relay_session(key));
            self.write_stream_logs(server, lines);
        }
        let now = self.cx.now_ms;
        for (z, k) in std::mem::take(&mut self.relays[key].held) {
            self.zones[z].release(k, now);
        }
        // Dropping the relay closes both sockets, which removes them from epoll.
        drop(self.relays.remove(key));
        WorkerSlot::drop_one(&self.cx.slot.active);
    }

    fn on_relay_timeout(&mut self, key: usize) -> Io {
        let r = &self.relays[key];
        if r.pp_pending {
            crate::log!(
                Info,
                "client timed out (110: Connection timed out) while reading PROXY protocol, client: {}, server: {}",
                r.peer.map_or("-".to_string(), |p| p.ip().to_string()),
                r.listen
            );
            return Io::Close;
        }
        if r.handshaking {
            crate::log!(
                Info,
                "SSL handshaking timed out, client: {}, server: {}",
                r.peer.map_or("-".to_string(), |p| p.ip().to_string()),
                r.listen
            );
            return Io::Close;
        }
        if r.resolving {
            crate::log!(
                Error,
                "upstream name could not be resolved in time (110: Operation timed out), client: {}, server: {}",
                r.peer.map_or("-".to_string(), |p| p.ip().to_string()),
                r.listen
            );
            return Io::Close;
        }
        if r.prereading {
            // nginx's preread phase goes on when its timer fires.
            let r = &mut self.relays[key];
            r.prereading = false;
            r.preread_done = true;
            return self.relay_content(key);
        }
        if r.connecting {
            self.log_upstream_error(key, "upstream timed out (110: Connection timed out)");
            self.fail_current_peer(key);
            return self.connect_next(key);
        }
        crate::log!(
            Info,
            "timed out (110: Connection timed out) while proxying connection, client: {}, server: {}",
            r.peer.map_or("-".to_string(), |p| p.ip().to_string()),
            r.listen
        );
        Io::Close
    }

    pub(super) fn expire_relay_timers(&mut self) {
        while let Some(&Reverse((deadline, key, id))) = self.relay_timers.peek() {
            if deadline > self.cx.now_ms {
                break;
            }
            self.relay_timers.pop();
            let Some(r) = self.relays.get_mut(key) else {
                continue;
            };
            if r.id != id || deadline != r.timer_at {
                continue;
            }
            let now = self.cx.now_ms;
            let wake = r.rate_wake_ms != 0 && r.rate_wake_ms <= now;
            if wake {
                r.rate_wake_ms = 0;
            }
            let expired = r.deadline_ms <= now;
            if expired {
                r.deadline_ms = u64::MAX;
            }
            // The earliest of what is left waits in the heap.
            let next = r.deadline_ms.min(if r.rate_wake_ms == 0 {
                u64::MAX
            } else {
                r.rate_wake_ms
            });
            r.timer_at = next;
            if next != u64::MAX {
                self.relay_timers.push(Reverse((next, key, id)));
            }
            if !expired && !wake {
                continue;
            }
            let outer = crate::log::set_connection(r.number);
            let outer_ctx = crate::log::set_context(r.log_ctx.0, r.log_ctx.1);
            let io = if expired {
                self.on_relay_timeout(key)
            } else {
                self.pump(key)
            };
            self.end_relay_turn(key, io);
            crate::log::restore_context(outer_ctx);
            crate::log::set_connection(outer);
        }
    }

    /// Closes every relay (`worker_shutdown_timeout` expired).
    pub(super) fn close_all_relays(&mut self) {
        let keys: Vec<usize> = self.relays.iter().map(|(k, _)| k).collect();
        for k in keys {
            self.close_relay(k);
        }
    }
}

fn token(key: usize, id: u64, upstream: bool) -> u64 {
    let generation = token::generation(id);
    if upstream {
        Token::RelayUpstream { key, generation }.encode()
    } else {
        Token::RelayClient { key, generation }.encode()
    }
}

fn relay_interest() -> shard_event::Interest {
    shard_event::Interest::READ
        | shard_event::Interest::WRITE
        | shard_event::Interest::RDHUP
        | shard_event::Interest::EDGE
}

fn would_block(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::WouldBlock
}

/// One side of a relay or tunnel as bytes move: a socket, or a TLS connection over one.
pub(super) trait Endpoint {
    fn recv(&mut self, buf: &mut [u8]) -> io::Result<usize>;
    fn send(&mut self, buf: &[u8]) -> io::Result<usize>;
    /// End of stream to the peer once everything queued went out.
    fn shut(&mut self);
}

/// A plain socket.
pub(super) struct Fd(pub(super) RawFd);

impl Endpoint for Fd {
    fn recv(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        shard_event::sock::read(self.0, buf)
    }
    fn send(&mut self, buf: &[u8]) -> io::Result<usize> {
        shard_event::sock::write(self.0, buf)
    }
    fn shut(&mut self) {
        shard_event::sock::shutdown_write(self.0);
    }
}

/// One step from `src` to `dst` through `pipe`: a read when there is room, a write when there
/// is data, FIN to `dst` once `src` ended and `pipe` is flushed. Returns whether anything
/// happened. Shared by the stream relay and the HTTP proxy's upgraded connections
/// (`tunnel.rs`), over plain sockets or TLS.
pub(super) fn move_between(
    src_io: &mut dyn Endpoint,
    src: &mut Ends,
    dst_io: &mut dyn Endpoint,
    dst: &mut Ends,
    pipe: &mut Pipe,
    cap: usize,
) -> Result<bool, (&'static str, io::Error)> {
    let mut progress = false;
    if !src.eof && src.readable && cap > 0 && pipe.make_room() {
        let room = (pipe.buf.len() - pipe.end).min(cap);
        match src_io.recv(&mut pipe.buf[pipe.end..pipe.end + room]) {
            Ok(0) => {
                src.eof = true;
                progress = true;
            }
            Ok(n) => {
                pipe.end += n;
                progress = true;
            }
            Err(e) if would_block(&e) => src.readable = false,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => progress = true,
            Err(e) => return Err(("recv()", e)),
        }
    }
    if !pipe.is_empty() && dst.writable {
        match dst_io.send(&pipe.buf[pipe.start..pipe.end]) {
            Ok(n) => {
                pipe.start += n;
                pipe.written += n as u64;
                if pipe.is_empty() {
                    pipe.start = 0;
                    pipe.end = 0;
                }
                progress = true;
            }
            Err(e) if would_block(&e) => dst.writable = false,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => progress = true,
            Err(e) => return Err(("send()", e)),
        }
    }
    if src.eof && pipe.is_empty() && !dst.shut {
        dst_io.shut();
        dst.shut = true;
        progress = true;
    }
    Ok(progress)
}

/// How many bytes a side limited to `rate` bytes per second may read now, `elapsed_ms` into
/// the session with `received` read so far: nginx's stream formula, `rate * (seconds + 1) -
/// received` (so a session may read one second's share at once). `rate` 0: no limit.
fn rate_cap(rate: u64, elapsed_ms: u64, received: u64) -> usize {
    if rate == 0 {
        return usize::MAX;
    }
    let allowed = rate.saturating_mul(elapsed_ms / 1000 + 1);
    allowed.saturating_sub(received).min(usize::MAX as u64) as usize
}

/// Milliseconds until a side held back by its rate may read again (`u64::MAX`: not held).
fn rate_wake(rate: u64, elapsed_ms: u64, received: u64) -> u64 {
    if rate == 0 || rate_cap(rate, elapsed_ms, received) > 0 {
        return u64::MAX;
    }
    // The next whole second of the session raises the allowance.
    let over = received - rate.saturating_mul(elapsed_ms / 1000 + 1);
    let secs = over / rate + 1;
    (elapsed_ms / 1000 + secs) * 1000 - elapsed_ms
}

/// One stream variable of `s` (see `parse::stream::stream_variable` for the names).
/// How deep `map`s may refer to `map`s (a loop renders empty past it).
const MAP_DEPTH_MAX: usize = 16;

/// Text and stream variables of `s`.
fn session_parts(
    out: &mut Vec<u8>,
    parts: &[shard_config::Part],
    s: &Session<'_>,
    now_ms: u64,
    host: &str,
    depth: usize,
) {
    for p in parts {
        match p {
            shard_config::Part::Lit(t) => out.extend_from_slice(t.as_bytes()),
            shard_config::Part::Var(v) => session_var(out, v, s, now_ms, host, depth),
        }
    }
}

/// One stream variable of `s` (see `parse::stream::stream_variable` for the names); `depth`
/// counts the `map`s it is inside.
fn session_var(
    out: &mut Vec<u8>,
    var: &shard_config::Var,
    s: &Session<'_>,
    now_ms: u64,
    host: &str,
    depth: usize,
) {
    use shard_config::Var;
    use shard_http::response::push_u64;
    use shard_http::vars::push_secs;
    use std::io::Write;
    let secs_since = |out: &mut Vec<u8>, from: u64| push_secs(out, now_ms.saturating_sub(from));
    match var {
        Var::RemoteAddr => match s.client {
            Some(a) => {
                let _ = write!(out, "{}", a.ip());
            }
            // A Unix-domain client: nginx's `unix:`.
            None => out.extend_from_slice(b"unix:"),
        },
        Var::RemotePort => {
            if let Some(a) = s.client {
                push_u64(out, u64::from(a.port()));
            }
        }
        Var::BinaryRemoteAddr => match s.client.map(|a| a.ip()) {
            Some(std::net::IpAddr::V4(v4)) => out.extend_from_slice(&v4.octets()),
            Some(std::net::IpAddr::V6(v6)) => out.extend_from_slice(&v6.octets()),
            None => {}
        },
        Var::ServerAddr if shard_config::is_unix_stand_in(&s.local) => {
            out.extend_from_slice(b"unix:");
        }
        Var::ServerAddr => {
            let _ = write!(out, "{}", s.local.ip());
        }
        Var::ServerPort if shard_config::is_unix_stand_in(&s.local) => {}
        Var::ServerPort => push_u64(out, u64::from(s.local.port())),
        Var::Protocol => out.extend_from_slice(if s.udp { b"UDP" } else { b"TCP" }),
        Var::Status => push_u64(out, u64::from(s.status)),
        Var::BytesSent => push_u64(out, s.bytes_sent),
        Var::BytesReceived => push_u64(out, s.bytes_received),
        Var::SessionTime => secs_since(out, s.started_ms),
        Var::Connection => push_u64(out, s.number),
        Var::Hostname => out.extend_from_slice(host.as_bytes()),
        Var::Pid => push_u64(out, shard_event::process::getpid() as u64),
        Var::NginxVersion => out.extend_from_slice(env!("CARGO_PKG_VERSION").as_bytes()),
        Var::Msec => push_secs(out, shard_event::unix_ms()),
        Var::TimeLocal => {
            out.extend_from_slice(shard_http::log_time(shard_event::unix_secs()).as_bytes())
        }
        Var::TimeIso8601 => {
            out.extend_from_slice(shard_http::iso8601_time(shard_event::unix_secs()).as_bytes())
        }
        Var::UpstreamAddr => {
            for (i, a) in s.upstream.iter().enumerate() {
                if i > 0 {
                    out.extend_from_slice(b", ");
                }
                let _ = write!(out, "{a}");
            }
            if let Some(name) = s.no_live {
                if !s.upstream.is_empty() {
                    out.extend_from_slice(b", ");
                }
                out.extend_from_slice(name.as_bytes());
            }
        }
        // One value per attempt, as nginx keeps a state per attempt: the attempts before the
        // last failed (no bytes, times not measured), the last is the session's.
        Var::UpstreamBytesSent => per_attempt(out, s, |out| push_u64(out, s.up_sent), b"0"),
        Var::UpstreamBytesReceived => per_attempt(out, s, |out| push_u64(out, s.up_received), b"0"),
        Var::UpstreamConnectTime => per_attempt(
            out,
            s,
            |out| match s.connect_ms {
                Some(ms) => push_secs(out, ms),
                None => out.push(b'-'),
            },
            b"-",
        ),
        Var::UpstreamFirstByteTime => per_attempt(
            out,
            s,
            |out| match s.first_byte_ms {
                Some(ms) => push_secs(out, ms),
                None => out.push(b'-'),
            },
            b"-",
        ),
        Var::UpstreamSessionTime => per_attempt(
            out,
            s,
            |out| match s.connect_ms {
                Some(_) => secs_since(out, s.started_ms),
                None => out.push(b'-'),
            },
            b"-",
        ),
        Var::ProxyProtocolAddr
        | Var::ProxyProtocolServerAddr
        | Var::ProxyProtocolPort
        | Var::ProxyProtocolServerPort
        | Var::ProxyProtocolTlv(_) => shard_http::vars::push_proxy_protocol(out, var, s.pp),
        v if v.is_tls() => {
            let tls = s.tls.map(|t| t.vars(s.server));
            shard_http::vars::push_tls(out, var, tls.as_ref(), now_ms);
        }
        Var::Geoip(g) => {
            if let (Some(conf), Some(client)) = (s.geoip, s.client) {
                conf.push(out, *g, client.ip());
            }
        }
        Var::RealipRemoteAddr => {
            if let Some(a) = s.realip.or(s.client) {
                let _ = write!(out, "{}", a.ip());
            }
        }
        Var::RealipRemotePort => {
            if let Some(a) = s.realip.or(s.client) {
                push_u64(out, u64::from(a.port()));
            }
        }
        Var::LimitConnStatus => out.extend_from_slice(s.limit_conn_status.as_bytes()),
        Var::SslPrereadProtocol | Var::SslPrereadServerName | Var::SslPrereadAlpnProtocols => {
            if let Some(h) = s.hello {
                let v = match var {
                    Var::SslPrereadProtocol => &h.protocol,
                    Var::SslPrereadServerName => &h.server_name,
                    _ => &h.alpn,
                };
                out.extend_from_slice(v.as_bytes());
            }
        }
        Var::User(name) if s.user.iter().any(|(n, _)| n == name) => {
            if let Some((_, v)) = s.user.iter().rev().find(|(n, _)| n == name) {
                out.extend_from_slice(v);
            }
        }
        Var::User(name)
            if s.groups
                .is_some_and(|g| g.names.iter().flatten().any(|n| n == name)) =>
        {
            // A named group of the `map` expression whose value this is.
            if let Some(g) = s.groups {
                let i = g
                    .names
                    .iter()
                    .position(|n| n.as_deref() == Some(name.as_str()));
                if let Some(Some((a, b))) = i.and_then(|i| g.ranges.get(i)) {
                    out.extend_from_slice(&g.text.as_bytes()[*a..*b]);
                }
            }
        }
        Var::Capture(n) => {
            if let Some(g) = s.groups {
                if let Some(Some((a, b))) = g.ranges.get(usize::from(*n)) {
                    out.extend_from_slice(&g.text.as_bytes()[*a..*b]);
                }
            }
        }
        Var::User(name) if depth < MAP_DEPTH_MAX => {
            if let Some(m) = s.maps.iter().find(|m| &m.name == name) {
                let mut src = Vec::new();
                session_parts(&mut src, &m.source, s, now_ms, host, depth + 1);
                let text = String::from_utf8_lossy(&src);
                let mut caps = Vec::new();
                match shard_http::vars::map_lookup_with(m, &text, &mut caps) {
                    (value, Some(re)) => {
                        let groups = Groups {
                            ranges: &caps,
                            text: &text,
                            names: re.capture_names(),
                        };
                        let inner = Session {
                            groups: Some(&groups),
                            ..*s
                        };
                        session_parts(out, value, &inner, now_ms, host, depth + 1);
                    }
                    (value, None) => session_parts(out, value, s, now_ms, host, depth + 1),
                }
            }
        }
        _ => {}
    }
}

/// A template's value for a session's view (`udp.rs` renders with it).
pub(super) fn render_parts(
    out: &mut Vec<u8>,
    parts: &[shard_config::Part],
    s: &Session<'_>,
    now_ms: u64,
    host: &str,
) {
    session_parts(out, parts, s, now_ms, host, 0);
}

/// Where a stream access-log line goes.
pub(super) enum LogDest {
    /// `Worker::access_logs[i]`.
    File(usize),
    /// A path rendered from variables.
    Path(String),
}

impl Worker<'_> {
    /// The lines the `access_log`s of stream server `server` get for `s`, by log file (an
    /// index into the worker's files, or a path rendered from variables).
    pub(super) fn session_lines(&self, server: usize, s: &Session<'_>) -> Vec<(LogDest, Vec<u8>)> {
        let mut lines = Vec::new();
        for al in &self.stream_server(server).access_logs {
            let dest = match (&al.path_vars, self.access_log_idx.get(&al.path)) {
                (Some(parts), _) => {
                    let mut p = Vec::new();
                    session_parts(&mut p, parts, s, self.cx.now_ms, &self.hostname, 0);
                    LogDest::Path(String::from_utf8_lossy(&p).into_owned())
                }
                (None, Some(&i)) => LogDest::File(i),
                (None, None) => continue,
            };
            let var = |v: &mut Vec<u8>, var: &shard_config::Var| {
                session_var(v, var, s, self.cx.now_ms, &self.hostname, 0)
            };
            if let Some(c) = &al.condition {
                let mut v = Vec::new();
                session_parts(&mut v, c, s, self.cx.now_ms, &self.hostname, 0);
                if !shard_http::access_log::value_holds(&v) {
                    continue;
                }
            }
            let mut line = Vec::with_capacity(128);
            shard_http::access_log::write_format_with(&mut line, &al.format, var);
            lines.push((dest, line));
        }
        lines
    }

    /// Appends `lines` to their files: written at once, or kept up to `buffer=`.
    pub(super) fn write_stream_logs(&mut self, server: usize, lines: Vec<(LogDest, Vec<u8>)>) {
        let logs = &self
            .cx
            .cfg
            .stream
            .as_ref()
            .map_or(&[][..], |s| &s.servers[server].access_logs[..]);
        for (dest, line) in lines {
            let i = match dest {
                LogDest::File(i) => i,
                LogDest::Path(p) => {
                    self.write_log_path(&p, &line, None);
                    continue;
                }
            };
            let buffer = logs
                .iter()
                .find(|al| self.access_log_idx.get(&al.path) == Some(&i))
                .and_then(|al| al.buffer);
            self.append_access_log(i, &line, buffer);
        }
    }
}

impl Worker<'_> {
    /// The variables' view of a UDP session (`udp.rs`).
    pub(super) fn udp_session<'s>(&'s self, u: &'s super::udp::UdpSession) -> Session<'s> {
        let f = u.facts();
        Session {
            status: f.status,
            bytes_sent: f.bytes_sent,
            bytes_received: f.bytes_received,
            upstream: f.upstream,
            no_live: None,
            up_sent: f.up_sent,
            up_received: f.up_received,
            connect_ms: Some(0),
            first_byte_ms: f.first_byte_ms,
            udp: true,
            ..Session::new(
                f.number,
                f.server,
                Some(f.client),
                f.local,
                f.started_ms,
                &self.stream().maps,
                self.stream().geoip.as_deref(),
            )
        }
    }
}

/// A per-attempt upstream variable: `failed` for each attempt before the last (and for a
/// no-live attempt, after which the last real one failed too), `last` for the last one;
/// nothing without attempts.
fn per_attempt(out: &mut Vec<u8>, s: &Session<'_>, last: impl FnOnce(&mut Vec<u8>), failed: &[u8]) {
    let n = s.upstream.len() + usize::from(s.no_live.is_some());
    for i in 0..n {
        if i > 0 {
            out.extend_from_slice(b", ");
        }
        if i + 1 == n && s.no_live.is_none() {
            last(out);
            return;
        }
        out.extend_from_slice(failed);
    }
}
