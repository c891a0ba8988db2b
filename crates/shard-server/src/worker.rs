//! A worker process: one thread, one epoll loop, every connection it accepted.
//!
//! The loop owns the events, the turns of connections that used up their budget, timers,
//! signals and the worker's counters in shared memory. Accepting is `accept.rs`, connection
//! I/O `conn.rs` (HTTP), `proxy.rs` and `relay.rs`. HTTP decisions (parsing, routing, what to
//! answer) are delegated to `shard-http`; this module only moves bytes and files.
//!
//! System calls are the product's cost model, so the data path is written to the floor of what
//! the kernel needs:
//! - a new connection is read from at once, before it is added to epoll: on loopback and with
//!   `deferred` the request is usually already there, and a connection answered and closed in
//!   that first pass never costs an `epoll_ctl`;
//! - connections are registered once, edge-triggered for read and write, and never modified;
//! - a read that returns less than the free buffer space means the socket is drained (the same
//!   rule as nginx's `ngx_unix_recv`), so no read is spent to learn `EAGAIN`;
//! - pipelined responses are gathered into one buffer and written with one `write`.

mod accept;
mod auth;
mod balance;
mod body;
mod conn;
mod ctx;
mod dav;
mod files;
mod h2;
mod h3;
pub(crate) use h3::quic_reset_secret;
mod proxy;
mod relay;
mod resolver;
mod respond;
mod script;
mod ssi;
mod step;
mod subfilter;
mod tls;
mod token;
mod trailers;
mod tunnel;
mod udp;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::os::fd::RawFd;
use std::path::PathBuf;
use std::sync::atomic::Ordering::Relaxed;

use shard_config::Config;
use shard_event::process::SignalFd;
use shard_event::{Events, Interest, Poll};
use slab::Slab;

use crate::listen::OpenListener;
use crate::shm::{Region, WorkerSlot};
use balance::PeerState;
use conn::Conn;
use proxy::UpConn;
use relay::Relay;
use token::Token;

/// Connections accepted per readiness report when `multi_accept` is off. Small, so that with a
/// shared socket the next worker gets a turn, and above 1, so that under load one
/// `epoll_wait` is shared by several connections.
const ACCEPT_BATCH: usize = 8;
/// nginx re-adds an `EPOLLEXCLUSIVE` listener every 16 accepts (1.21.6) so that the worker
/// registered first does not take most connections; so does shard.
const EXCLUSIVE_REARM_EVERY: u64 = 16;
/// Upper bound of the epoll_wait timeout: the heartbeat and CPU time are refreshed at least
/// this often.
const HEARTBEAT_MS: u64 = 1000;
/// Events taken per `epoll_wait`.
const EVENTS_MAX: usize = 512;
/// Rounds of a connection's state machine per wake-up (sozu's `MAX_LOOP_ITERATIONS` habit): a
/// connection that still has work after this many takes its next turn after every other
/// ready connection, so one fast pipelining client cannot keep the worker to itself.
const TURN_ROUNDS_MAX: usize = 64;
/// TLS handshake messages a worker processes per loop turn (and again per run of the
/// connections that yielded): a handshake is the most CPU a single read costs (a key
/// exchange and a signature, 0.1-0.2 ms), so beyond these a connection with a handshake
/// message waiting takes its turn after the other ready connections, and a burst of new TLS
/// clients does not hold up requests already being served.
pub(crate) const TLS_HANDSHAKES_PER_TURN: u32 = 4;
/// A sibling whose loop has not run for this long is not serving: its shard is adopted.
/// Several heartbeats (`HEARTBEAT_MS`), so an idle worker is never taken for a stuck one.
const ORPHANED_AFTER_MS: u64 = 3 * HEARTBEAT_MS;
/// Idle keep-alive connections closed at most per attempt to make room at the connection cap
/// (nginx's `ngx_drain_connections`).
const IDLE_DRAIN_MAX: usize = 32;
/// Access-log bytes buffered per file before a write (nginx's `buffer=64k`).
const ACCESS_LOG_BUFFER_BYTES: usize = 64 * 1024;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum AcceptMode {
    /// Our own reuseport shard: polled by this worker only.
    Shard,
    /// A socket polled by several workers (a shared socket, or a shard of `shards=N` with
    /// fewer shards than workers), `accept_mutex off`: `EPOLLEXCLUSIVE`, re-armed periodically.
    Exclusive,
    /// The same with `accept_mutex on`: polled only while this worker holds the socket's lock.
    Mutex,
}

struct WListener {
    fd: RawFd,
    conf_idx: usize,
    mode: AcceptMode,
    /// The accept lock guarding this socket in `Mutex` mode (see `Region::lock_id`).
    lock: usize,
    registered: bool,
    accepts: u64,
    /// A sibling's shard, polled (with `EPOLLEXCLUSIVE`) only while that worker is not
    /// serving; `None` for this worker's own sockets.
    adopted_from: Option<usize>,
    /// Polled now. Own sockets always are; an adopted shard while its worker is away.
    enabled: bool,
    /// A `quic` socket (`h3.rs`): polled for as long as the worker has QUIC connections,
    /// never paused, never adopted by a sibling (its datagrams belong to connections).
    quic: bool,
    /// Its key in the group's steering plane (`listen::QuicPlane`), which every connection
    /// ID this worker issues carries.
    quic_key: Option<u32>,
}

/// A path `open_log_file_cache` counts: its lines within `inactive`, and its descriptor once
/// it has `min_uses` of them.
struct LogCacheEntry {
    file: Option<(std::fs::File, u64)>,
    uses: u32,
    last_ms: u64,
    /// Order of last use (milliseconds tie).
    last_seq: u64,
}

/// One access log file: a descriptor inherited from the master (reopened on `SIGUSR1`) and a
/// bounded buffer flushed when full, once a second and at exit.
struct AccessLogFile {
    path: PathBuf,
    fd: RawFd,
    buf: Vec<u8>,
    /// `gzip[=LEVEL]`: each flush is one gzip member.
    gzip: Option<u32>,
    /// `flush=`: the longest a buffered line waits.
    flush_ms: u64,
    /// When the buffer took its first line (0: empty).
    since_ms: u64,
    /// `syslog:...`: `fd` is a datagram socket, each line one message, never buffered.
    syslog: Option<std::sync::Arc<shard_config::Syslog>>,
}

impl AccessLogFile {
    /// Writes out what the buffer holds (compressed with `gzip`).
    fn flush(&mut self) {
        if self.buf.is_empty() {
            return;
        }
        if let Some(s) = &self.syslog {
            // RFC 3164, one datagram per line: the header, then the line without its
            // newline; `severity=` or `info`, as nginx's access log.
            let now = shard_event::unix_secs();
            for line in self.buf.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
                let mut msg = s
                    .header(s.severity.unwrap_or(6), now, crate::log::hostname())
                    .into_bytes();
                msg.extend_from_slice(line);
                let _ = shard_event::sock::write(self.fd, &msg);
            }
            self.buf.clear();
            return;
        }
        match self.gzip {
            Some(level) => {
                use std::io::Write as _;
                let mut enc = flate2::write::GzEncoder::new(
                    Vec::with_capacity(self.buf.len() / 4 + 64),
                    flate2::Compression::new(level),
                );
                let member = enc.write_all(&self.buf).and_then(|()| enc.finish());
                if let Ok(bytes) = member {
                    let _ = shard_event::sock::write(self.fd, &bytes);
                }
            }
            None => {
                let _ = shard_event::sock::write(self.fd, &self.buf);
            }
        }
        self.buf.clear();
    }
}

pub(crate) struct Worker<'a> {
    idx: usize,
    /// Workers of this generation (`worker_processes`), for the funnel's groups.
    n_workers: usize,
    pid: u64,
    /// What steps need besides their object: clock, counters slot, spare buffers and
    /// requests (`ctx.rs`).
    cx: ctx::Ctx<'a>,
    listeners_open: &'a [OpenListener],
    region: &'a Region,
    poll: Poll,
    signals: SignalFd,
    listeners: Vec<WListener>,
    conns: Slab<Conn>,
    /// Stream relays (`relay.rs`): each counts as two connections against `conns_max`.
    relays: Slab<Relay>,
    /// `(deadline_ms, relay key, relay id)`, re-armed lazily as `timers`.
    relay_timers: BinaryHeap<Reverse<(u64, usize, u64)>>,
    /// The stream's UDP sessions (`udp.rs`), found by listener and client address, their
    /// `proxy_timeout` deadlines, and one datagram buffer for all of them.
    udp: Slab<udp::UdpSession>,
    udp_by_client: udp::UdpIndex,
    udp_timers: BinaryHeap<Reverse<(u64, usize, u64)>>,
    udp_buf: Vec<u8>,
    /// HTTP/3 (`h3.rs`): the QUIC endpoint of each `quic` socket (by listener index), the
    /// QUIC connections, their timers (re-armed lazily as `timers`), one datagram buffer.
    quic: Vec<Option<h3::Endpoint>>,
    h3: Slab<h3::H3Conn>,
    h3_timers: BinaryHeap<Reverse<(u64, usize, u64)>>,
    h3_buf: Vec<u8>,
    /// Per upstream, per peer: failures and round-robin weights (this worker's view).
    peer_state: Vec<Vec<PeerState>>,
    /// Upstream connections of the HTTP proxy (`proxy.rs`), busy or pooled.
    upconns: Slab<UpConn>,
    /// Per http upstream: idle pooled connections (keys into `upconns`), oldest first.
    pools: Vec<Vec<usize>>,
    /// Per http upstream, per peer: this worker's failures and round-robin weights.
    http_peer_state: Vec<Vec<PeerState>>,
    conns_max: usize,
    next_conn_id: u64,
    /// `(deadline_ms, slab key, conn id)`: at most one entry per connection; a popped entry
    /// whose connection has a later deadline is pushed again (lazy re-arming keeps the hot path
    /// free of heap operations).
    timers: BinaryHeap<Reverse<(u64, usize, u64)>>,
    shutting_down: bool,
    /// Connections accepted under the accept mutex, served once it is released.
    posted: Vec<usize>,
    /// Connections and relays that used up their turn's budget with work left: driven again
    /// after the next (non-blocking) `epoll_wait`.
    ready: Vec<Token>,
    /// `worker_shutdown_timeout`: when a graceful stop closes whatever is still open.
    shutdown_deadline_ms: Option<u64>,
    /// `worker_shutdown_drain`: until then a graceful stop leaves idle keep-alive connections
    /// open (a request arriving on one is answered with `Connection: close`); then those
    /// still idle are closed.
    drain_until_ms: Option<u64>,
    accept_mutex: bool,
    /// The accept locks this worker's `Mutex` listeners use, and whether it holds each.
    locks: Vec<(usize, bool)>,
    accept_disabled: i64,
    /// Accepting is paused (at `worker_connections`, or on `EMFILE`/`ENFILE`) until a
    /// connection closes or this time passes: the listeners are out of epoll meanwhile, so a
    /// level-triggered listener cannot spin the loop.
    accept_paused_until: Option<u64>,
    /// The pause is for `worker_connections` (a closed connection ends it early), not for
    /// descriptors (only the delay ends it: connections closing in this worker say nothing
    /// about the system's file table, and resuming at once would spin on `EMFILE`).
    accept_paused_for_cap: bool,
    /// Connections the accept that paused needed (2 for a stream relay): a cap pause ends
    /// when that many fit again, not one.
    accept_pause_need: usize,
    /// The pause's alert was logged; cleared by the next successful accept, so a shortage
    /// that lasts is logged once, not once per `accept_mutex_delay`.
    accept_pause_logged: bool,
    multi_accept: bool,
    access_logs: Vec<AccessLogFile>,
    access_log_idx: HashMap<PathBuf, usize>,
    /// `error_log` contexts below main (`log::set_context`), by the address of their list in
    /// the configuration: context number and lowest level.
    log_ctx: HashMap<usize, (u64, u8)>,
    /// `open_log_file_cache`: access logs with variables in their paths, by rendered path.
    log_cache: HashMap<String, LogCacheEntry>,
    /// When the earliest buffered access-log line is due (`flush=`; 0: none waits).
    log_flush_at: u64,
    /// HTTP/2 sessions (`h2.rs`), each on a connection of `conns`.
    h2: Slab<h2::Session>,
    /// The outputs of subrequests (`ssi.rs`), each on a connection of `conns`.
    subs: Slab<ssi::SubOut>,
    /// `http2_rebalance`'s window (`h2.rs`).
    rebalance: h2::Rebalance,
    /// Request-body bytes this worker holds in memory (`body.rs`).
    body_mem: usize,
    /// `cpu_ms` of the slot when this worker took it: a respawned worker continues the dead
    /// one's count, as every counter of the slot.
    cpu_base_ms: u64,
    /// The last temporary-file number used.
    temp_seq: u64,
    last_heartbeat_ms: u64,
    /// `Region::steer_epoch` when this worker last looked at its siblings' steering bits.
    steer_epoch: u64,
    /// Per location (by address) with `open_file_cache`: the cache and its `inactive`.
    file_caches: HashMap<usize, (files::FileCache, u64)>,
    /// Entries in all of them.
    file_cache_entries: usize,
    /// Descriptors kept for locations without `open_file_cache`.
    reuse: files::Reuse,
    /// `proxy_cache` entries kept open after serving them.
    cache_memo: files::CacheMemo,
    /// `$hostname`, read once.
    hostname: String,
    /// The shared `limit_*` zones (see `WorkerArgs::zones`).
    zones: &'a [crate::limits::Zone],
    /// The keys zones of `HttpConf::cache_paths`, in order (`crate::cache`).
    cache_zones: Vec<crate::cache::Zone>,
    /// Numbers the requests that take a cache key's update (`crate::cache::owner`).
    cache_serial: u64,
    /// The TLS configuration of each `ssl` listener (see `WorkerArgs::tls`).
    tls: &'a crate::tls::TlsContexts,
    /// Upstream TLS configurations with a client certificate named by variables
    /// (`proxy_ssl_certificate $var`), by their settings with the names rendered; bounded.
    client_certs: HashMap<shard_config::ProxySsl, std::sync::Arc<rustls::ClientConfig>>,
    /// Consistent-hash rings of http upstreams (`hash ... consistent`), built on first use.
    rings: HashMap<usize, Vec<(u32, usize)>>,
    /// The same for stream upstreams.
    stream_rings: HashMap<usize, Vec<(u32, usize)>>,
    /// Upstreams made for addresses a stream `proxy_pass $var` rendered (`relay.rs`):
    /// index `upstreams.len() + i`, with their `peer_state` entries; by address.
    stream_dyn: Vec<std::rc::Rc<shard_config::UpstreamConf>>,
    stream_dyn_index: HashMap<String, usize>,
    /// Requests this worker has begun, and a random key: together they make `$request_id`.
    request_seq: u64,
    request_id_key: u64,
    /// xorshift state for `random` upstreams and DNS query ids (never 0).
    rng: u64,
    /// The userid module's sequence numbers (v1, v2), as nginx's `sequencer_v1`/`_v2`.
    uid_seq: (u32, u32),
    /// DNS queries in flight and answers kept (`resolver.rs`).
    resolver: resolver::Resolver,
    /// Upstreams made for hosts `proxy_pass` with variables resolved (`proxy.rs`): index
    /// `upstreams.len() + i`, with their `http_peer_state` and `pools` entries; by name.
    dyn_ups: Vec<std::rc::Rc<shard_config::UpstreamConf>>,
    dyn_index: HashMap<String, usize>,
    /// Configuration upstreams with `server ... resolve` whose peers this worker resolved
    /// again: the upstream index new requests take instead (into `dyn_ups`).
    shadow: HashMap<usize, usize>,
}

pub(crate) struct WorkerArgs<'a> {
    pub idx: usize,
    /// The worker's slot in the shared region.
    pub slot: usize,
    pub n_workers: usize,
    pub cfg: &'a Config,
    pub listeners: &'a [OpenListener],
    pub region: &'a Region,
    pub access_logs: &'a HashMap<PathBuf, RawFd>,
    /// `limit_req_zone`/`limit_conn_zone` mappings, in `HttpConf::limit_zones` order.
    pub zones: &'a [crate::limits::Zone],
    /// Per `Config::listeners` entry: what an `ssl` listener presents (`crate::tls`).
    pub tls: &'a crate::tls::TlsContexts,
}

/// Runs worker `idx` until it is told to stop; returns the process exit code.
pub(crate) fn run(args: WorkerArgs<'_>) -> i32 {
    let cfg = args.cfg;
    // Fault injection for the tests of what the master does when no worker can run (a
    // worker's fatal start-up failures, such as a failed privilege drop, cannot be caused on
    // purpose in a test). Never set in production.
    if let Some(how) = std::env::var_os("SHARD_TEST_FAIL_WORKER_START") {
        if how == "crash" {
            // Dies as a crash at start-up would: before it is known as started.
            std::process::abort();
        }
        crate::log!(
            Emerg,
            "worker initialisation failed: SHARD_TEST_FAIL_WORKER_START is set"
        );
        return 2;
    }
    // nginx's `env`: the worker's environment, once the hook above was read.
    shard_event::process::set_environment(&cfg.main.env);
    crate::master::set_title("shard: worker process");
    let mut w = match Worker::new(args) {
        Ok(w) => w,
        Err(e) => {
            crate::log!(Emerg, "worker initialisation failed: {e}");
            // 2 tells the master not to respawn (nginx's fatal exit code).
            return 2;
        }
    };
    // Set up: from here on the worker needs only its roots, logs, temporary directories and
    // the loop's system calls.
    if cfg.main.worker_sandbox {
        if let Err(e) = crate::sandbox::enter(&crate::sandbox::Plan::from_config(cfg)) {
            crate::log!(Emerg, "worker_sandbox: {e}");
            return 2;
        }
    }
    w.run_loop();
    w.flush_access_logs();
    0
}

impl<'a> Worker<'a> {
    fn new(a: WorkerArgs<'a>) -> std::io::Result<Worker<'a>> {
        let poll = Poll::new()?;
        let signals = SignalFd::new()?;
        poll.add(signals.fd(), Token::Signal.encode(), Interest::READ)?;
        let ev = &a.cfg.events;
        // nginx: reuseport disables the accept mutex for that socket; one worker needs no mutex.
        let use_mutex = ev.accept_mutex && a.n_workers > 1;
        let mut listeners = Vec::new();
        let mut locks: Vec<(usize, bool)> = Vec::new();
        for l in a.listeners {
            if l.opts.quic {
                // Its own socket only (`OpenListener::quic_fd_for_worker`).
                if let Some(fd) = l.quic_fd_for_worker(a.idx) {
                    listeners.push(WListener {
                        fd,
                        conf_idx: l.conf_idx,
                        mode: AcceptMode::Shard,
                        lock: 0,
                        registered: false,
                        accepts: 0,
                        adopted_from: None,
                        enabled: true,
                        quic: true,
                        quic_key: l.quic_key(a.idx),
                    });
                }
                continue;
            }
            let mode = if l.owned_by_one() {
                AcceptMode::Shard
            } else if use_mutex {
                AcceptMode::Mutex
            } else {
                AcceptMode::Exclusive
            };
            let shard = l.reuseport.then(|| a.idx % l.active.max(1));
            let lock = Region::lock_id(shard);
            if mode == AcceptMode::Mutex && !locks.iter().any(|&(id, _)| id == lock) {
                locks.push((lock, false));
            }
            listeners.push(WListener {
                fd: l.fd_for_worker(a.idx),
                conf_idx: l.conf_idx,
                mode,
                lock,
                registered: false,
                accepts: 0,
                adopted_from: None,
                enabled: true,
                quic: false,
                quic_key: None,
            });
            // The siblings' shards, for when their worker is not serving them.
            if mode == AcceptMode::Shard {
                for j in (0..l.active.min(a.n_workers)).filter(|&j| j != a.idx) {
                    listeners.push(WListener {
                        fd: l.fds[j],
                        conf_idx: l.conf_idx,
                        mode: AcceptMode::Exclusive,
                        lock: 0,
                        registered: false,
                        accepts: 0,
                        adopted_from: Some(j),
                        enabled: false,
                        quic: false,
                        quic_key: None,
                    });
                }
            }
            // Shards a reload took out of the kernel's choice: drain what was queued on them.
            for fd in l.draining_for_worker(a.idx) {
                listeners.push(WListener {
                    fd,
                    conf_idx: l.conf_idx,
                    mode: AcceptMode::Shard,
                    lock: 0,
                    registered: false,
                    accepts: 0,
                    adopted_from: None,
                    enabled: true,
                    quic: false,
                    quic_key: None,
                });
            }
        }
        let mut access_logs = Vec::new();
        let mut access_log_idx = HashMap::new();
        let every_log: Vec<&shard_config::AccessLog> = a
            .cfg
            .http
            .iter()
            .flat_map(|h| &h.servers)
            .flat_map(|s| std::iter::once(&s.base).chain(s.locations.iter()))
            .flat_map(|l| &l.access_logs)
            .chain(
                a.cfg
                    .stream
                    .iter()
                    .flat_map(|s| &s.servers)
                    .flat_map(|s| &s.access_logs),
            )
            .collect();
        for (path, fd) in a.access_logs {
            let first = every_log.iter().find(|al| al.path == *path);
            // A syslog destination only an `error_log` names: a socket, never reopened.
            let error_syslog = a
                .cfg
                .context_error_logs
                .iter()
                .find_map(|l| match &l.target {
                    shard_config::LogTarget::Syslog(s) if path.as_os_str() == s.text.as_str() => {
                        Some(s.clone())
                    }
                    _ => None,
                });
            access_log_idx.insert(path.clone(), access_logs.len());
            access_logs.push(AccessLogFile {
                path: path.clone(),
                fd: *fd,
                buf: Vec::with_capacity(ACCESS_LOG_BUFFER_BYTES),
                gzip: first.and_then(|al| al.gzip),
                flush_ms: first.and_then(|al| al.flush_ms).unwrap_or(HEARTBEAT_MS),
                since_ms: 0,
                syslog: first.and_then(|al| al.syslog.clone()).or(error_syslog),
            });
        }
        let pid = shard_event::process::getpid() as u64;
        let slot = a.region.worker(a.slot);
        slot.pid.store(pid, Relaxed);
        // The previous holder of this slot (a dead worker) left its connections behind.
        for c in [
            &slot.active,
            &slot.reading,
            &slot.writing,
            &slot.waiting,
            &slot.body_mem_bytes,
            &slot.body_temp_files,
            &slot.quic_connections,
        ] {
            c.store(0, Relaxed);
        }
        let now_ms = shard_event::monotonic_ms();
        slot.heartbeat_ms.store(now_ms, Relaxed);
        let mut w = Worker {
            idx: a.idx,
            n_workers: a.n_workers,
            pid,
            cx: ctx::Ctx::new(a.cfg, slot, now_ms),
            listeners_open: a.listeners,
            region: a.region,
            poll,
            signals,
            listeners,
            conns: Slab::with_capacity(ev.worker_connections.min(4096)),
            relays: Slab::new(),
            relay_timers: BinaryHeap::new(),
            udp: Slab::new(),
            udp_by_client: HashMap::new(),
            udp_timers: BinaryHeap::new(),
            udp_buf: Vec::new(),
            quic: Vec::new(),
            h3: Slab::new(),
            h3_timers: BinaryHeap::new(),
            h3_buf: Vec::new(),
            peer_state: a.cfg.stream.as_ref().map_or(Vec::new(), |s| {
                s.upstreams
                    .iter()
                    .map(|u| PeerState::table(&u.peers))
                    .collect()
            }),
            upconns: Slab::new(),
            pools: a
                .cfg
                .http
                .as_ref()
                .map_or(Vec::new(), |h| vec![Vec::new(); h.upstreams.len()]),
            http_peer_state: a.cfg.http.as_ref().map_or(Vec::new(), |h| {
                h.upstreams
                    .iter()
                    .map(|u| PeerState::table(&u.peers))
                    .collect()
            }),
            conns_max: ev.worker_connections.min(token::KEY_MAX),
            next_conn_id: 0,
            timers: BinaryHeap::new(),
            shutting_down: false,
            posted: Vec::new(),
            ready: Vec::new(),
            shutdown_deadline_ms: None,
            drain_until_ms: None,
            accept_mutex: use_mutex && !locks.is_empty(),
            locks,
            accept_disabled: 0,
            accept_paused_until: None,
            accept_paused_for_cap: false,
            accept_pause_need: 1,
            accept_pause_logged: false,
            multi_accept: ev.multi_accept,
            access_logs,
            access_log_idx,
            log_ctx: HashMap::new(),
            log_cache: HashMap::new(),
            log_flush_at: 0,
            h2: Slab::new(),
            subs: Slab::new(),
            rebalance: h2::Rebalance::default(),
            body_mem: 0,
            cpu_base_ms: slot.cpu_ms.load(Relaxed),
            // Apart from other workers' numbers, for the named fallback of `O_TMPFILE`.
            temp_seq: pid.wrapping_mul(100_000),
            last_heartbeat_ms: now_ms,
            steer_epoch: 0,
            file_caches: HashMap::new(),
            reuse: files::Reuse::default(),
            cache_memo: files::CacheMemo::default(),
            file_cache_entries: 0,
            hostname: shard_event::process::hostname(),
            zones: a.zones,
            cache_zones: crate::cache::zones_of(a.cfg),
            cache_serial: 0,
            tls: a.tls,
            client_certs: HashMap::new(),
            rings: HashMap::new(),
            stream_rings: HashMap::new(),
            stream_dyn: Vec::new(),
            stream_dyn_index: HashMap::new(),
            request_seq: 0,
            request_id_key: shard_event::process::random_u64(),
            resolver: resolver::Resolver::default(),
            dyn_ups: Vec::new(),
            dyn_index: HashMap::new(),
            shadow: HashMap::new(),
            rng: shard_event::process::random_u64() | 1,
            uid_seq: (1, 0x0303_0302),
        };
        w.update_time();
        w.install_log_contexts();
        w.quic_setup();
        for i in 0..w.listeners.len() {
            if w.listeners[i].mode != AcceptMode::Mutex && w.listeners[i].enabled {
                w.register_listener(i)?;
            }
        }
        crate::log!(Info, "worker {} started", w.idx);
        Ok(w)
    }

    /// Reads the clocks; true when a new second began.
    fn update_time(&mut self) -> bool {
        self.cx.tick()
    }

    fn run_loop(&mut self) {
        let mut events = Events::with_capacity(EVENTS_MAX);
        loop {
            if self.shutting_down && self.relays.is_empty() && self.h3.is_empty() {
                // Subrequests nobody reads (`mirror`, `post_action`) do not hold a stopping
                // worker once nothing else is left, as nginx's do not: they may even wait on
                // this worker's own listeners, which accept no more.
                if !self.conns.is_empty() {
                    self.end_background_subrequests();
                }
                if self.conns.is_empty() {
                    crate::log!(Info, "worker {} exiting", self.idx);
                    return;
                }
            }
            let mut timeout = HEARTBEAT_MS;
            if let Some(until) = self.accept_paused_until {
                let room = self.accept_paused_for_cap
                    && self.connections_used() + self.accept_pause_need <= self.conns_max;
                if room || self.cx.now_ms >= until {
                    self.resume_accepting();
                } else {
                    timeout = timeout.min(until - self.cx.now_ms);
                }
            }
            if self.accept_mutex && !self.shutting_down && self.accept_paused_until.is_none() {
                if self.accept_disabled > 0 {
                    self.accept_disabled -= 1;
                } else {
                    self.try_accept_mutex();
                }
                if self.locks.iter().any(|&(_, held)| !held) {
                    timeout = timeout.min(self.cx.cfg.events.accept_mutex_delay_ms.max(1));
                }
            }
            if !self.ready.is_empty() {
                timeout = 0;
            }
            if let Some(Reverse((deadline, _, _))) = self.timers.peek() {
                timeout = timeout.min(deadline.saturating_sub(self.cx.now_ms));
            }
            if let Some(Reverse((deadline, _, _))) = self.relay_timers.peek() {
                timeout = timeout.min(deadline.saturating_sub(self.cx.now_ms));
            }
            if let Some(deadline) = self.next_udp_deadline() {
                timeout = timeout.min(deadline.saturating_sub(self.cx.now_ms));
            }
            if let Some(deadline) = self.next_h3_deadline() {
                timeout = timeout.min(deadline.saturating_sub(self.cx.now_ms));
            }
            if self.log_flush_at != 0 {
                timeout = timeout.min(self.log_flush_at.saturating_sub(self.cx.now_ms));
            }
            if let Some(until) = self.drain_until_ms {
                if self.cx.now_ms >= until {
                    self.drain_until_ms = None;
                    self.close_idle_connections();
                    continue;
                }
                timeout = timeout.min(until - self.cx.now_ms);
            }
            if let Some(deadline) = self.shutdown_deadline_ms {
                if self.cx.now_ms >= deadline {
                    crate::log!(
                        Notice,
                        "worker {}: worker_shutdown_timeout expired, closing {} connections",
                        self.idx,
                        self.conns.len() + self.relays.len()
                    );
                    let keys: Vec<usize> = self.conns.iter().map(|(k, _)| k).collect();
                    self.h3_close_all();
                    for k in keys {
                        self.close(k);
                    }
                    self.close_all_relays();
                    continue;
                }
                timeout = timeout.min(deadline - self.cx.now_ms);
            }
            // With `heartbeat_ms`, what the master tells a waiting worker from a stalled one.
            if timeout > 0 {
                self.cx.slot.idle.store(1, Relaxed);
            }
            self.cx.handshakes_left = TLS_HANDSHAKES_PER_TURN;
            let n = match self.poll.wait(&mut events, timeout as i32) {
                Ok(n) => n,
                Err(e) => {
                    crate::log!(
                        Alert,
                        "epoll_wait() failed ({})",
                        shard_event::os_error_text(&e)
                    );
                    0
                }
            };
            let new_second = self.update_time();
            self.cx.slot.heartbeat_ms.store(self.cx.now_ms, Relaxed);
            self.cx.slot.idle.store(0, Relaxed);
            // `http2_rebalance` looks once a second, with the new second's clocks.
            if new_second && !self.h2.is_empty() {
                self.h2_rebalance();
            }
            // Accept events first, then release the mutex before connection work, as nginx
            // posts accept events: the lock is held only for accepting.
            for i in 0..n {
                if let Some(Token::Listener(li)) = Token::decode(events.get(i).token) {
                    self.accept_on(li);
                }
            }
            self.release_accept_locks();
            for key in std::mem::take(&mut self.posted) {
                self.drive(key);
            }
            for i in 0..n {
                let ev = events.get(i);
                match Token::decode(ev.token) {
                    Some(Token::Signal) => self.on_signals(),
                    Some(Token::Conn { key, generation }) => {
                        self.on_conn_event(key, generation, ev)
                    }
                    Some(Token::Upstream { key, generation }) => {
                        self.on_upconn_event(key, generation, ev)
                    }
                    Some(Token::RelayClient { key, generation }) => {
                        self.on_relay_event(key, generation, false, ev)
                    }
                    Some(Token::RelayUpstream { key, generation }) => {
                        self.on_relay_event(key, generation, true, ev)
                    }
                    Some(Token::Resolver { key, generation }) => {
                        self.on_resolver_event(key, generation)
                    }
                    Some(Token::Udp { key, generation }) => self.on_udp_event(key, generation),
                    Some(Token::Listener(_)) | None => {}
                }
            }
            self.run_ready();
            self.expire_timers();
            self.expire_relay_timers();
            self.expire_udp_timers();
            self.expire_h3_timers();
            self.flush_due_access_logs();
            if self.cx.now_ms.saturating_sub(self.last_heartbeat_ms) >= HEARTBEAT_MS {
                self.last_heartbeat_ms = self.cx.now_ms;
                self.publish_cpu();
                self.flush_access_logs();
                self.expire_pools();
                self.expire_queries();
                self.refresh_resolved_upstreams();
                self.expire_file_caches();
                self.adopt_orphaned_shards();
            }
            let epoch = self.region.steer_epoch.load(Relaxed);
            if epoch != self.steer_epoch {
                self.steer_epoch = epoch;
                self.adopt_orphaned_shards();
                // `http2_rebalance`: new connections now go to the siblings.
                if self.h2_shed_waiting()
                    && self.region.steer_bits(self.idx) & crate::shm::STEER_AWAY != 0
                {
                    self.h2_shed_pending();
                }
            }
            self.cx.slot.heartbeat_ms.store(self.cx.now_ms, Relaxed);
        }
    }

    /// Queues a connection or relay that used up its turn; it is driven again after the next
    /// `epoll_wait`, which then does not block.
    fn yield_turn(&mut self, t: Token) {
        WorkerSlot::bump(&self.cx.slot.budget_yields, 1);
        self.ready.push(t);
    }

    /// Closes every descriptor kept for a next request (`Reuse`, `CacheMemo`): the worker ran
    /// out of descriptors. Whether any was.
    fn release_held_files(&mut self) -> bool {
        self.reuse.clear() | self.cache_memo.clear()
    }

    /// Drops `open_file_cache` entries unused for their location's `inactive`.
    fn expire_file_caches(&mut self) {
        let now = self.cx.now_ms;
        self.reuse.expire(now);
        self.cache_memo.expire(now);
        let mut total = 0;
        for (cache, inactive) in self.file_caches.values_mut() {
            cache.expire(now, *inactive);
            total += cache.len();
        }
        self.file_cache_entries = total;
        self.cx.slot.file_cache_entries.store(total as u64, Relaxed);
    }

    /// Publishes the worker's CPU time in its slot, continuing the slot's count.
    pub(crate) fn publish_cpu(&self) {
        self.cx.slot.cpu_ms.store(
            self.cpu_base_ms + shard_event::process::cpu_time_ms(),
            Relaxed,
        );
    }

    /// Queues client connection `key` for its next turn (see `yield_turn`).
    fn yield_conn(&mut self, key: usize) {
        if let Some(c) = self.conns.get(key) {
            let generation = token::generation(c.id);
            self.yield_turn(Token::Conn { key, generation });
        }
    }

    /// Gives every connection that yielded its next turn (those closed since are skipped by
    /// their generation).
    fn run_ready(&mut self) {
        self.cx.handshakes_left = TLS_HANDSHAKES_PER_TURN;
        for t in std::mem::take(&mut self.ready) {
            match t {
                Token::Conn { key, generation } => {
                    if self
                        .conns
                        .get(key)
                        .is_some_and(|c| token::generation(c.id) == generation)
                    {
                        self.drive(key);
                    }
                }
                Token::RelayClient { key, generation } => {
                    if self
                        .relays
                        .get(key)
                        .is_some_and(|r| token::generation(r.id) == generation)
                    {
                        self.resume_relay(key);
                    }
                }
                _ => debug_assert!(false, "only connections and relays yield: {t:?}"),
            }
        }
    }

    fn on_signals(&mut self) {
        while let Some((sig, _)) = self.signals.read() {
            match sig {
                libc::SIGQUIT => self.begin_graceful_stop(),
                libc::SIGTERM | libc::SIGINT => {
                    crate::log!(Notice, "worker {} exiting (fast stop)", self.idx);
                    self.h3_close_all();
                    self.flush_access_logs();
                    std::process::exit(0);
                }
                libc::SIGUSR1 => self.reopen_access_logs(),
                _ => {}
            }
        }
    }

    fn begin_graceful_stop(&mut self) {
        if self.shutting_down {
            return;
        }
        crate::master::set_title("shard: worker process is shutting down");
        self.shutting_down = true;
        // Take what is already queued on our sockets: for an address the new configuration
        // dropped, nobody else will. The answers carry `Connection: close`.
        for i in 0..self.listeners.len() {
            if self.listeners[i].registered {
                self.accept_batch(i, usize::MAX);
            }
        }
        // A UDP session has no end of its own to wait for: it ends with the worker.
        self.close_all_udp();
        self.shutdown_deadline_ms = self
            .cx
            .cfg
            .main
            .worker_shutdown_timeout_ms
            .map(|t| self.cx.now_ms + t);
        for i in 0..self.listeners.len() {
            // A `quic` socket is read until the worker's QUIC connections are gone (new
            // connections on it are left to the next generation).
            if !self.listeners[i].quic {
                self.unregister_listener(i);
            }
        }
        self.h3_go_away_all();
        // Said once this worker accepts no more: a reader of the line may count on it.
        crate::log!(Notice, "worker {} gracefully shutting down", self.idx);
        self.release_accept_locks();
        for l in &mut self.locks {
            l.1 = false;
        }
        self.accept_mutex = false;
        // Pooled upstream connections go now (no request will be sent on them); busy ones
        // close after their response instead of returning to the pool.
        self.expire_pools();
        // HTTP/2 sessions are sent GOAWAY with their last stream id: their streams finish,
        // then they close (as nginx).
        let sessions: Vec<usize> = self
            .conns
            .iter()
            .filter(|(_, c)| c.h2 & h2::H2_SESSION != 0)
            .map(|(k, _)| k)
            .collect();
        for k in sessions {
            self.h2_go_away(k);
        }
        // Busy client connections close after their current response (`Connection: close`).
        // Idle keep-alive ones stay for the drain window: closing one at the moment its
        // client sends the next request would fail that request (nginx's behaviour, kept by
        // `worker_shutdown_drain off`). A request arriving in the window is served and
        // answered with `Connection: close`.
        let drain = self.cx.cfg.main.worker_shutdown_drain_ms;
        let drain = self
            .cx
            .cfg
            .main
            .worker_shutdown_timeout_ms
            .map_or(drain, |t| drain.min(t));
        if drain == 0 {
            self.close_idle_connections();
        } else {
            self.drain_until_ms = Some(self.cx.now_ms + drain);
        }
        for key in std::mem::take(&mut self.posted) {
            self.drive(key);
        }
    }

    /// A graceful stop is in its drain window (idle keep-alive connections stay open).
    pub(crate) fn draining(&self) -> bool {
        self.drain_until_ms.is_some()
    }

    /// Closes the idle keep-alive connections (a graceful stop's drain window ended).
    fn close_idle_connections(&mut self) {
        let idle: Vec<usize> = self
            .conns
            .iter()
            .filter(|(_, c)| c.is_idle() && c.h2 == 0)
            .map(|(k, _)| k)
            .collect();
        if !idle.is_empty() {
            crate::log!(
                Info,
                "worker {}: closing {} idle keep-alive connections",
                self.idx,
                idle.len()
            );
        }
        for k in idle {
            self.close(k);
        }
    }

    fn reopen_access_logs(&mut self) {
        self.flush_access_logs();
        let _ = crate::log::reopen();
        let mut reopened = Vec::new();
        for f in self.access_logs.iter_mut().filter(|f| f.syslog.is_none()) {
            match crate::log::open_append(&f.path) {
                Ok(fd) => {
                    reopened.push(f.fd);
                    f.fd = fd;
                }
                Err(e) => crate::log!(Alert, "{e}"),
            }
        }
        // The error log contexts take the new descriptors before the old ones close.
        self.install_log_contexts();
        for fd in reopened {
            shard_event::sock::close(fd);
        }
        // Written to the new error log: a rotation script (or test) sees each worker done.
        crate::log!(Notice, "worker {}: reopening logs", self.idx);
    }

    /// Numbers every `error_log` list below main (http, server, location, stream server) and
    /// gives `log` their destinations: the descriptors the master opened (by path), standard
    /// error, syslog sockets.
    fn install_log_contexts(&mut self) {
        let cfg = self.cx.cfg;
        let lists = cfg
            .http
            .iter()
            .flat_map(|h| &h.servers)
            .flat_map(|s| std::iter::once(&s.base).chain(&s.locations))
            .filter_map(|l| l.error_logs.as_ref())
            .chain(
                cfg.stream
                    .iter()
                    .flat_map(|s| &s.servers)
                    .filter_map(|s| s.error_logs.as_ref()),
            );
        let mut contexts: Vec<Vec<crate::log::Dest>> = Vec::new();
        self.log_ctx.clear();
        for list in lists {
            let at = std::sync::Arc::as_ptr(list) as usize;
            if self.log_ctx.contains_key(&at) {
                continue;
            }
            let mut dests = Vec::new();
            for l in list.iter() {
                let (key, syslog) = match &l.target {
                    shard_config::LogTarget::Stderr => {
                        dests.push((2, l.level, None));
                        continue;
                    }
                    shard_config::LogTarget::File(p) => (p.clone(), None),
                    shard_config::LogTarget::Syslog(s) => (PathBuf::from(&s.text), Some(s.clone())),
                };
                if let Some(&i) = self.access_log_idx.get(&key) {
                    dests.push((self.access_logs[i].fd, l.level, syslog));
                }
            }
            let level = crate::log::context_level(&dests);
            contexts.push(dests);
            self.log_ctx.insert(at, (contexts.len() as u64, level));
        }
        crate::log::set_contexts(contexts);
    }

    /// The request on `key` is now in `loc` (or its server's base): its messages go to that
    /// level's `error_log`s from here on.
    #[inline]
    fn enter_log_context(&mut self, key: usize, loc: &shard_config::LocationConf) {
        let ctx = self.log_ctx_of(loc.error_logs.as_ref());
        let Some(r) = self.conns.get_mut(key).and_then(|c| c.req.as_mut()) else {
            return;
        };
        // Unchanged (the common case: no `error_log` below main): `drive` set it already.
        if r.log_ctx != ctx {
            r.log_ctx = ctx;
            crate::log::set_context(ctx.0, ctx.1);
        }
        crate::debug!("using configuration \"{}\"", loc.path);
    }

    /// The error log context of a level's `error_log` list (`None`: the main context).
    #[inline]
    fn log_ctx_of(&self, logs: Option<&std::sync::Arc<Vec<shard_config::ErrorLog>>>) -> (u64, u8) {
        logs.and_then(|l| {
            self.log_ctx
                .get(&(std::sync::Arc::as_ptr(l) as usize))
                .copied()
        })
        // The main context: its level is not read (`log::enabled` looks at context 0's own).
        .unwrap_or((0, 0))
    }

    /// Appends `line` to access log `i` and writes it out as [`Worker::flush_access_log_if`]
    /// says.
    fn append_access_log(&mut self, i: usize, line: &[u8], buffer: Option<usize>) {
        let f = &mut self.access_logs[i];
        f.buf.extend_from_slice(line);
        self.flush_access_log_if(i, buffer);
    }

    /// As nginx: each line at once unless `buffer=` (then when it is full, or at the
    /// periodic flush).
    fn flush_access_log_if(&mut self, i: usize, buffer: Option<usize>) {
        let f = &mut self.access_logs[i];
        let limit = buffer.map_or(0, |b| b.min(ACCESS_LOG_BUFFER_BYTES - 2048));
        if f.buf.len() >= limit.max(1) {
            f.flush();
            f.since_ms = 0;
        } else if !f.buf.is_empty() && f.since_ms == 0 {
            f.since_ms = self.cx.now_ms;
            let due = self.cx.now_ms + f.flush_ms;
            if self.log_flush_at == 0 || due < self.log_flush_at {
                self.log_flush_at = due;
            }
        }
    }

    /// `flush=`: writes out the buffers whose first line has waited long enough.
    fn flush_due_access_logs(&mut self) {
        if self.log_flush_at == 0 || self.cx.now_ms < self.log_flush_at {
            return;
        }
        let now = self.cx.now_ms;
        let mut next = 0;
        for f in &mut self.access_logs {
            if f.since_ms == 0 {
                continue;
            }
            let due = f.since_ms + f.flush_ms;
            if due <= now {
                f.flush();
                f.since_ms = 0;
            } else if next == 0 || due < next {
                next = due;
            }
        }
        self.log_flush_at = next;
    }

    /// One line to an access log whose path has variables: the file is opened (created),
    /// written and closed, as nginx's without `open_log_file_cache`; with it, a path written
    /// `min_uses` times within `inactive` keeps its descriptor (up to `max` paths, the least
    /// recently written forgotten first; a descriptor older than `valid` is opened anew).
    fn write_log_path(
        &mut self,
        path: &str,
        line: &[u8],
        cache: Option<&shard_config::OpenLogCache>,
    ) {
        use std::io::Write as _;
        let now = self.cx.now_ms;
        let Some(c) = cache else {
            self.write_log_once(path, line);
            return;
        };
        self.log_cache
            .retain(|_, e| now.saturating_sub(e.last_ms) < c.inactive_ms);
        self.temp_seq = self.temp_seq.wrapping_add(1);
        let seq = self.temp_seq;
        if let Some(e) = self.log_cache.get_mut(path) {
            e.uses = e.uses.saturating_add(1);
            e.last_ms = now;
            e.last_seq = seq;
            if e.file
                .as_ref()
                .is_some_and(|(_, at)| now.saturating_sub(*at) >= c.valid_ms)
            {
                e.file = None;
            }
            if let Some((f, _)) = &mut e.file {
                if let Err(err) = f.write_all(line) {
                    crate::log!(
                        Crit,
                        "write() \"{path}\" failed ({})",
                        shard_event::os_error_text(&err)
                    );
                }
                return;
            }
        }
        // Opened now; a path that cannot be opened is not counted (as nginx's cache of
        // log files, which keeps no errors).
        let mut f = match open_log(path) {
            Ok(f) => f,
            Err(err) => {
                self.log_cache.remove(path);
                crate::log!(
                    Crit,
                    "open() \"{path}\" failed ({})",
                    shard_event::os_error_text(&err)
                );
                return;
            }
        };
        if let Err(err) = f.write_all(line) {
            crate::log!(
                Crit,
                "write() \"{path}\" failed ({})",
                shard_event::os_error_text(&err)
            );
        }
        if !self.log_cache.contains_key(path) {
            while self.log_cache.len() >= c.max {
                let lru = self
                    .log_cache
                    .iter()
                    .min_by_key(|(_, e)| e.last_seq)
                    .map(|(k, _)| k.clone());
                match lru {
                    Some(k) => self.log_cache.remove(&k),
                    None => break,
                };
            }
            self.log_cache.insert(
                path.to_string(),
                LogCacheEntry {
                    file: None,
                    uses: 1,
                    last_ms: now,
                    last_seq: seq,
                },
            );
        }
        if let Some(e) = self.log_cache.get_mut(path) {
            if e.uses >= c.min_uses {
                e.file = Some((f, now));
            }
        }
    }

    /// [`Worker::write_log_path`] without a cache.
    fn write_log_once(&self, path: &str, line: &[u8]) {
        use std::io::Write as _;
        let res = open_log(path)
            .map_err(|e| ("open()", e))
            .and_then(|mut f| f.write_all(line).map_err(|e| ("write()", e)));
        if let Err((call, e)) = res {
            crate::log!(
                Crit,
                "{call} \"{path}\" failed ({})",
                shard_event::os_error_text(&e)
            );
        }
    }

    fn flush_access_logs(&mut self) {
        for f in &mut self.access_logs {
            f.flush();
            f.since_ms = 0;
        }
        self.log_flush_at = 0;
    }

    fn expire_timers(&mut self) {
        while let Some(&Reverse((deadline, key, id))) = self.timers.peek() {
            if deadline > self.cx.now_ms {
                break;
            }
            self.timers.pop();
            let Some(c) = self.conns.get_mut(key) else {
                continue;
            };
            if c.id != id || deadline != c.timer_at {
                // A connection closed, or an entry superseded by an earlier one.
                continue;
            }
            c.timer_at = u64::MAX;
            if c.deadline_ms > self.cx.now_ms {
                let d = c.deadline_ms;
                self.set_conn_deadline(key, d);
                continue;
            }
            let outer = crate::log::set_connection(c.number);
            let ctx = c.req.as_ref().map_or((0, 0), |r| r.log_ctx);
            let outer_ctx = crate::log::set_context(ctx.0, ctx.1);
            self.on_timeout(key);
            crate::log::restore_context(outer_ctx);
            crate::log::set_connection(outer);
            if let Some(c) = self.conns.get(key) {
                if c.id == id {
                    let d = c.deadline_ms;
                    self.set_conn_deadline(key, d);
                }
            }
        }
    }

    fn take_buf(&mut self, cap: usize) -> Vec<u8> {
        self.cx.take_buf(cap)
    }

    fn give_buf(&mut self, b: Vec<u8>) {
        self.cx.give_buf(b)
    }
}

/// The `WorkerSlot` counter a connection phase is counted in.
fn phase_counter(slot: &WorkerSlot, phase: conn::Phase) -> &std::sync::atomic::AtomicU64 {
    match phase {
        conn::Phase::Reading => &slot.reading,
        conn::Phase::Writing => &slot.writing,
        conn::Phase::Waiting => &slot.waiting,
    }
}

/// An access log file with variables in its path, opened by the worker to append.
fn open_log(path: &str) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt as _;
    std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o644)
        .custom_flags(libc::O_CLOEXEC)
        .open(path)
}
