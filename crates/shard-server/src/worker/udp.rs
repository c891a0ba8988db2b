//! The `stream` module's UDP proxy (`listen ... udp`), as nginx's: each client address on a
//! listening socket is a session, with its own connected socket to the upstream peer chosen for
//! it; the client's datagrams go up, the peer's come back through the listening socket.
//!
//! This module owns the sessions (`Worker::udp`, found by listener and client address), the
//! datagram I/O on both sides, and their end: `proxy_responses` answers to each client datagram
//! received, `proxy_requests` datagrams taken (the next one starts a new session), or
//! `proxy_timeout` without a datagram either way. It reuses the relay's peer choice, access
//! rules, variables and access log (`relay.rs`), and does not own the sockets' creation (the
//! master's `listen.rs`).
//!
//! Bounds: a datagram is at most [`DATAGRAM_MAX`] bytes; a readiness report reads at most
//! [`READ_BATCH`] datagrams from one socket before the loop turns to others; sessions count
//! against `worker_connections` as two connections, as a TCP relay.

use std::cmp::Reverse;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

use super::token::{self, Token};
use super::Worker;
use crate::shm::WorkerSlot;

/// Largest datagram relayed (the UDP payload limit).
pub(super) const DATAGRAM_MAX: usize = 65_535;
/// Datagrams read from one socket per readiness report.
const READ_BATCH: usize = 64;
/// Datagrams a session holds back per direction while `proxy_upload_rate` or
/// `proxy_download_rate` delays them; beyond, new ones are dropped (as a full socket buffer
/// would drop them).
const HELD_MAX: usize = 64;

pub(super) struct UdpSession {
    pub(super) id: u64,
    number: u64,
    /// Index into `StreamConf::servers`.
    pub(super) server: usize,
    /// The worker's listener the client wrote to, and its socket (answers leave through it).
    li: usize,
    listen_fd: RawFd,
    listen: SocketAddr,
    client: SocketAddr,
    /// Still takes the client's datagrams (until `proxy_requests`).
    open: bool,
    /// The socket connected to the peer, once chosen.
    up: Option<OwnedFd>,
    /// Index into `StreamConf::upstreams`, and the peer chosen.
    pub(super) ups: usize,
    pub(super) peer: Option<usize>,
    attempts: Vec<SocketAddr>,
    requests: u32,
    responses: u32,
    from_client: u64,
    to_client: u64,
    started_ms: u64,
    first_byte_ms: Option<u64>,
    deadline_ms: u64,
    status: u16,
    log_ctx: (u64, u8),
    /// `limit_conn` counts held: (zone index into the worker's zones, key).
    held: Vec<(usize, u128)>,
    /// `proxy_download_rate`, `proxy_upload_rate` (bytes per second, 0: none), and the
    /// datagrams they hold back each way, sent when the rate allows (`wake_ms`, 0: none).
    rates: (u64, u64),
    held_down: std::collections::VecDeque<Vec<u8>>,
    held_up: std::collections::VecDeque<Vec<u8>>,
    wake_ms: u64,
}

impl UdpSession {
    /// nginx's allowance of a limited direction: `rate` bytes for each second begun since
    /// the session started, less what went already (`sent`). At most 0: wait.
    fn allowance(&self, rate: u64, sent: u64, now_ms: u64) -> i64 {
        let secs = now_ms / 1000 - self.started_ms / 1000;
        (rate.saturating_mul(secs + 1)) as i64 - sent as i64
    }

    /// When an allowance of `a` (at most 0) becomes positive: it grows by `rate` at each
    /// second boundary, so at the first boundary past `-a / rate` more of them (nginx polls
    /// every millisecond once its own estimate is spent; a boundary is exact).
    fn wake_ms(rate: u64, a: i64, now_ms: u64) -> u64 {
        let seconds = a.unsigned_abs() / rate.max(1) + 1;
        (now_ms / 1000 + seconds) * 1000
    }
}

impl Worker<'_> {
    /// Datagrams are waiting on UDP listener `li`: each goes to its client's session (one is
    /// started for a new client), at most [`READ_BATCH`] of them.
    pub(super) fn udp_readable(&mut self, li: usize) {
        let fd = self.listeners[li].fd;
        let mut buf = std::mem::take(&mut self.udp_buf);
        buf.resize(DATAGRAM_MAX, 0);
        for _ in 0..READ_BATCH {
            let (n, from) = match shard_event::sock::recv_from(fd, &mut buf) {
                Ok((n, Some(from))) => (n, from),
                Ok((_, None)) => continue,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    crate::log!(
                        Alert,
                        "recvfrom() failed ({})",
                        shard_event::os_error_text(&e)
                    );
                    break;
                }
            };
            let key = match self.udp_by_client.get(&(li, from)) {
                Some(&k) => k,
                None => match self.udp_start(li, fd, from) {
                    Some(k) => k,
                    None => continue,
                },
            };
            self.udp_from_client(key, &buf[..n]);
        }
        self.udp_buf = buf;
    }

    /// A new session for `client` on listener `li`: access rules, then `return` or a peer.
    fn udp_start(&mut self, li: usize, fd: RawFd, client: SocketAddr) -> Option<usize> {
        let conf_l = &self.cx.cfg.listeners[self.listeners[li].conf_idx];
        let shard_config::ListenerKind::Stream { server } = conf_l.kind else {
            return None;
        };
        if !self.room_for_connections(2) {
            crate::log!(
                Alert,
                "{} worker_connections are not enough",
                self.conns_max
            );
            return None;
        }
        let listen = conf_l.addr;
        let cfg = self.cx.cfg;
        let conf = cfg.stream.as_ref().and_then(|s| s.servers.get(server))?;
        let id = self.next_conn_id;
        self.next_conn_id += 1;
        let number = self
            .region
            .connections
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            + 1;
        WorkerSlot::bump(&self.cx.slot.accepted, 1);
        WorkerSlot::bump(&self.cx.slot.handled, 1);
        WorkerSlot::bump(&self.cx.slot.active, 1);
        let log_ctx = self.log_ctx_of(conf.error_logs.as_ref());
        let key = self.udp.insert(UdpSession {
            id,
            number,
            server,
            li,
            listen_fd: fd,
            listen,
            client,
            open: true,
            up: None,
            ups: conf.upstream,
            peer: None,
            attempts: Vec::new(),
            requests: 0,
            responses: 0,
            from_client: 0,
            to_client: 0,
            started_ms: self.cx.now_ms,
            first_byte_ms: None,
            deadline_ms: u64::MAX,
            status: 200,
            log_ctx,
            held: Vec::new(),
            rates: (0, 0),
            held_down: std::collections::VecDeque::new(),
            held_up: std::collections::VecDeque::new(),
            wake_ms: 0,
        });
        let outer = crate::log::set_connection(number);
        let outer_ctx = crate::log::set_context(log_ctx.0, log_ctx.1);
        let started = self.udp_begin(key);
        crate::log::restore_context(outer_ctx);
        crate::log::set_connection(outer);
        if started {
            self.udp_by_client.insert((li, client), key);
            Some(key)
        } else {
            None
        }
    }

    /// Access, `return`, then the peer and its socket; `false` when the session ended here.
    fn udp_begin(&mut self, key: usize) -> bool {
        let (server, client, listen) = {
            let s = &self.udp[key];
            (s.server, s.client, s.listen)
        };
        crate::log!(Info, "client {client} connected to {listen}");
        let conf = &self.stream().servers[server];
        let allowed = conf
            .access_rules
            .iter()
            .find(|r| r.matches(client.ip()))
            .is_none_or(|r| r.allow);
        if !allowed {
            crate::log!(
                Error,
                "access forbidden by rule, client: {}, server: {listen}",
                client.ip()
            );
            self.udp[key].status = 403;
            self.udp_close(key);
            return false;
        }
        if !conf.limit_conn.is_empty() && !self.udp_limit_conn(key) {
            self.udp[key].status = 503;
            self.udp_close(key);
            return false;
        }
        let conf = &self.stream().servers[server];
        if let Some(ret) = &conf.ret {
            // `return VALUE`: one datagram back, and the session is done.
            let v = self.udp_render(key, ret);
            let s = &mut self.udp[key];
            match shard_event::sock::send_to(s.listen_fd, &v, &s.client) {
                Ok(n) => s.to_client += n as u64,
                Err(e) => crate::log!(
                    Info,
                    "sendto() failed ({}) while sending to client",
                    shard_event::os_error_text(&e)
                ),
            }
            self.udp_close(key);
            return false;
        }
        let ups = self.udp[key].ups;
        if ups == usize::MAX {
            self.udp[key].status = 502;
            self.udp_close(key);
            return false;
        }
        let hash_key = match &self.stream_ups(ups).balance {
            shard_config::Balance::Hash { key: parts, .. } => Some(self.udp_render(key, parts)),
            _ => None,
        };
        let tried = vec![false; self.stream_ups(ups).peers.len()];
        let Some(p) = self.pick_peer(ups, &tried, hash_key.as_deref()) else {
            crate::log!(
                Error,
                "no live upstreams while connecting to upstream, udp client: {}, server: {listen}",
                client.ip()
            );
            self.udp[key].status = 502;
            self.udp_close(key);
            return false;
        };
        let addr = self.stream_ups(ups).peers[p].addr;
        let s = &mut self.udp[key];
        s.peer = Some(p);
        s.attempts.push(addr);
        let fd = match shard_event::sock::udp_connected(&addr) {
            Ok(fd) => fd,
            Err(e) => {
                crate::log!(
                    Error,
                    "connect() failed ({}) while connecting to upstream, udp client: {}, server: {listen}, upstream: \"{addr}\"",
                    shard_event::os_error_text(&e),
                    client.ip()
                );
                s.status = 502;
                self.udp_close(key);
                return false;
            }
        };
        let generation = token::generation(s.id);
        if let Err(e) = self.poll.add(
            fd.as_raw_fd(),
            Token::Udp { key, generation }.encode(),
            shard_event::Interest::READ,
        ) {
            crate::log!(
                Alert,
                "epoll_ctl(ADD) failed ({})",
                shard_event::os_error_text(&e)
            );
            self.udp[key].status = 500;
            self.udp_close(key);
            return false;
        }
        crate::log!(Info, "proxy {addr} connected (udp)");
        self.udp[key].up = Some(fd);
        let conf = &self.stream().servers[server];
        let size = |w: &Self, v: &shard_config::SizeValue| match v {
            shard_config::SizeValue::Fixed(n) => *n,
            shard_config::SizeValue::Vars(parts) => {
                let text = String::from_utf8_lossy(&w.udp_render(key, parts)).into_owned();
                shard_config::parse_size(&text).unwrap_or(0)
            }
        };
        let rates = (
            size(self, &conf.download_rate),
            size(self, &conf.upload_rate),
        );
        self.udp[key].rates = rates;
        true
    }

    /// One datagram from the client: up to the peer; the session may then be complete.
    fn udp_from_client(&mut self, key: usize, data: &[u8]) {
        let (number, log_ctx) = (self.udp[key].number, self.udp[key].log_ctx);
        let outer = crate::log::set_connection(number);
        let outer_ctx = crate::log::set_context(log_ctx.0, log_ctx.1);
        // `proxy_upload_rate`: over the allowance (or behind held ones) it waits its turn.
        let now = self.cx.now_ms;
        let s = &mut self.udp[key];
        let rate = s.rates.1;
        if rate > 0 {
            let a = s.allowance(rate, s.from_client, now);
            if !s.held_up.is_empty() || a <= 0 {
                if s.held_up.len() < HELD_MAX {
                    s.held_up.push_back(data.to_vec());
                }
                let wake = UdpSession::wake_ms(rate, a.min(0), now);
                self.udp_wake_at(key, wake);
                crate::log::restore_context(outer_ctx);
                crate::log::set_connection(outer);
                return;
            }
        }
        self.udp_forward_up(key, data);
        crate::log::restore_context(outer_ctx);
        crate::log::set_connection(outer);
    }

    /// A client datagram goes to the peer: counted, `proxy_requests` applied.
    fn udp_forward_up(&mut self, key: usize, data: &[u8]) {
        let conf = &self.stream().servers[self.udp[key].server];
        let (requests_max, timeout) = (conf.requests, conf.timeout_ms);
        let s = &mut self.udp[key];
        s.requests += 1;
        s.from_client += data.len() as u64;
        let up = s.up.as_ref().map_or(-1, AsRawFd::as_raw_fd);
        if let Err(e) = shard_event::sock::write(up, data) {
            crate::log!(
                Error,
                "send() failed ({}) while proxying connection, udp client: {}",
                shard_event::os_error_text(&e),
                s.client.ip()
            );
        }
        if requests_max > 0 && s.requests >= requests_max {
            // `proxy_requests`: the next datagram from this client starts a new session.
            s.open = false;
            let k = (s.li, s.client);
            self.udp_by_client.remove(&k);
        }
        self.udp_set_deadline(key, self.cx.now_ms + timeout);
        self.udp_maybe_done(key);
    }

    /// Schedules the release of held datagrams at `at` (the earlier of two wins).
    fn udp_wake_at(&mut self, key: usize, at: u64) {
        let s = &mut self.udp[key];
        if s.wake_ms != 0 && s.wake_ms <= at {
            return;
        }
        s.wake_ms = at;
        self.udp_timers.push(Reverse((at, key, s.id)));
    }

    /// The rates' timer: held datagrams go as far as the allowances let them, the rest wait
    /// again; the session may then be complete.
    fn udp_release(&mut self, key: usize) {
        let now = self.cx.now_ms;
        self.udp[key].wake_ms = 0;
        loop {
            let s = &mut self.udp[key];
            if s.held_up.is_empty() {
                break;
            }
            let a = s.allowance(s.rates.1, s.from_client, now);
            if a <= 0 {
                let wake = UdpSession::wake_ms(s.rates.1, a, now);
                self.udp_wake_at(key, wake);
                break;
            }
            let Some(d) = s.held_up.pop_front() else {
                break;
            };
            self.udp_forward_up(key, &d);
            if !self.udp.contains(key) {
                return;
            }
        }
        loop {
            let s = &mut self.udp[key];
            if s.held_down.is_empty() {
                break;
            }
            let a = s.allowance(s.rates.0, s.to_client, now);
            if a <= 0 {
                let wake = UdpSession::wake_ms(s.rates.0, a, now);
                self.udp_wake_at(key, wake);
                break;
            }
            if let Some(d) = s.held_down.pop_front() {
                udp_send_to_client(s, &d);
            }
        }
        self.udp_maybe_done(key);
    }

    /// The peer's socket is readable: its datagrams go back to the client.
    pub(super) fn on_udp_event(&mut self, key: usize, generation: u32) {
        let Some(s) = self.udp.get(key) else {
            return;
        };
        if token::generation(s.id) != generation {
            return;
        }
        let (number, log_ctx) = (s.number, s.log_ctx);
        let outer = crate::log::set_connection(number);
        let outer_ctx = crate::log::set_context(log_ctx.0, log_ctx.1);
        let conf = &self.stream().servers[s.server];
        let (timeout, per) = (conf.timeout_ms, conf.responses);
        let mut buf = std::mem::take(&mut self.udp_buf);
        buf.resize(DATAGRAM_MAX, 0);
        let mut failed = false;
        for _ in 0..READ_BATCH {
            let s = &mut self.udp[key];
            // As nginx: no more is read than `proxy_responses` expects.
            if per
                .is_some_and(|per| u64::from(s.responses) >= u64::from(per) * u64::from(s.requests))
            {
                break;
            }
            let up = s.up.as_ref().map_or(-1, AsRawFd::as_raw_fd);
            match shard_event::sock::read(up, &mut buf) {
                Ok(n) => {
                    if s.first_byte_ms.is_none() {
                        s.first_byte_ms = Some(self.cx.now_ms.saturating_sub(s.started_ms));
                    }
                    s.responses += 1;
                    // `proxy_download_rate`: over the allowance it waits its turn.
                    let rate = s.rates.0;
                    let a = s.allowance(rate, s.to_client, self.cx.now_ms);
                    if rate > 0 && (!s.held_down.is_empty() || a <= 0) {
                        if s.held_down.len() < HELD_MAX {
                            s.held_down.push_back(buf[..n].to_vec());
                        }
                        let wake = UdpSession::wake_ms(rate, a.min(0), self.cx.now_ms);
                        self.udp_wake_at(key, wake);
                        continue;
                    }
                    udp_send_to_client(s, &buf[..n]);
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    // An ICMP error (the port is closed): nginx's 502.
                    crate::log!(
                        Error,
                        "recv() failed ({}) while proxying connection, udp client: {}, upstream: \"{}\"",
                        shard_event::os_error_text(&e),
                        s.client.ip(),
                        s.attempts.last().map_or(String::new(), |a| a.to_string())
                    );
                    s.status = 502;
                    failed = true;
                    break;
                }
            }
        }
        self.udp_buf = buf;
        if failed {
            // The peer refused: it counts as a failure (`max_fails`), as nginx's.
            let (ups, peer) = (self.udp[key].ups, self.udp[key].peer);
            if let Some(p) = peer {
                self.peer_failed(ups, p);
            }
            self.udp_close(key);
        } else {
            self.udp_set_deadline(key, self.cx.now_ms + timeout);
            self.udp_maybe_done(key);
        }
        crate::log::restore_context(outer_ctx);
        crate::log::set_connection(outer);
    }

    /// nginx's end of a UDP session: every datagram `proxy_requests` lets it take came, and
    /// `proxy_responses` answers to each arrived.
    fn udp_maybe_done(&mut self, key: usize) {
        let Some(s) = self.udp.get(key) else {
            return;
        };
        if !s.held_up.is_empty() || !s.held_down.is_empty() {
            return;
        }
        let conf = &self.stream().servers[s.server];
        if conf.requests > 0 && s.requests < conf.requests {
            return;
        }
        let Some(per) = conf.responses else {
            return;
        };
        if u64::from(s.responses) < u64::from(per) * u64::from(s.requests) {
            return;
        }
        crate::log!(Info, "udp done");
        self.udp_close(key);
    }

    fn udp_set_deadline(&mut self, key: usize, at: u64) {
        let s = &mut self.udp[key];
        s.deadline_ms = at;
        self.udp_timers.push(Reverse((at, key, s.id)));
    }

    /// Sessions whose `proxy_timeout` passed: done when every expected answer came (or none
    /// is expected), else nginx's "upstream timed out" and 502.
    pub(super) fn expire_udp_timers(&mut self) {
        while let Some(&Reverse((deadline, key, id))) = self.udp_timers.peek() {
            if deadline > self.cx.now_ms {
                break;
            }
            self.udp_timers.pop();
            let Some(s) = self.udp.get(key) else {
                continue;
            };
            if s.id == id && s.wake_ms == deadline && s.wake_ms != 0 {
                let (number, log_ctx) = (s.number, s.log_ctx);
                let outer = crate::log::set_connection(number);
                let outer_ctx = crate::log::set_context(log_ctx.0, log_ctx.1);
                self.udp_release(key);
                crate::log::restore_context(outer_ctx);
                crate::log::set_connection(outer);
                continue;
            }
            if s.id != id || s.deadline_ms != deadline {
                continue;
            }
            let conf = &self.stream().servers[s.server];
            let answered = conf
                .responses
                .is_none_or(|per| u64::from(s.responses) >= u64::from(per) * u64::from(s.requests));
            let (number, log_ctx) = (s.number, s.log_ctx);
            let outer = crate::log::set_connection(number);
            let outer_ctx = crate::log::set_context(log_ctx.0, log_ctx.1);
            if !answered {
                let s = &mut self.udp[key];
                crate::log!(
                    Error,
                    "upstream timed out (110: Connection timed out) while proxying connection, udp client: {}, server: {}, upstream: \"{}\"",
                    s.client.ip(),
                    s.listen,
                    s.attempts.last().map_or(String::new(), |a| a.to_string())
                );
                s.status = 502;
            }
            self.udp_close(key);
            crate::log::restore_context(outer_ctx);
            crate::log::set_connection(outer);
        }
    }

    /// The earliest UDP session deadline (for the loop's wait).
    pub(super) fn next_udp_deadline(&self) -> Option<u64> {
        self.udp_timers.peek().map(|Reverse((d, _, _))| *d)
    }

    /// Ends session `key`: its access log line, its socket, its counts.
    pub(super) fn udp_close(&mut self, key: usize) {
        if !self.udp.contains(key) {
            return;
        }
        let server = self.udp[key].server;
        {
            let s = &self.udp[key];
            crate::log!(
                Info,
                "udp client disconnected, bytes from/to client:{}/{}, bytes from/to upstream:{}/{}",
                s.from_client,
                s.to_client,
                s.to_client,
                s.from_client
            );
        }
        if !self.stream().servers[server].access_logs.is_empty() {
            let lines = {
                let s = &self.udp[key];
                let session = self.udp_session(s);
                self.session_lines(server, &session)
            };
            self.write_stream_logs(server, lines);
        }
        let now = self.cx.now_ms;
        for (z, k) in std::mem::take(&mut self.udp[key].held) {
            self.zones[z].release(k, now);
        }
        let s = self.udp.remove(key);
        if s.open && self.udp_by_client.get(&(s.li, s.client)) == Some(&key) {
            self.udp_by_client.remove(&(s.li, s.client));
        }
        // Dropping the session closes its upstream socket (and takes it out of epoll).
        drop(s);
        WorkerSlot::drop_one(&self.cx.slot.active);
    }

    /// Closes every UDP session (the worker is stopping).
    pub(super) fn close_all_udp(&mut self) {
        let keys: Vec<usize> = self.udp.iter().map(|(k, _)| k).collect();
        for k in keys {
            self.udp_close(k);
        }
    }

    /// `limit_conn` for a new session: a count in each zone for its key; `false` when a zone
    /// is full (logged as nginx's), unless `limit_conn_dry_run`.
    fn udp_limit_conn(&mut self, key: usize) -> bool {
        let cfg = self.cx.cfg;
        let Some(stream) = cfg.stream.as_ref() else {
            return true;
        };
        let conf = &stream.servers[self.udp[key].server];
        let base = cfg.http.as_ref().map_or(0, |h| h.limit_zones.len());
        let mut took = Vec::new();
        let mut pass = true;
        for lc in &conf.limit_conn {
            let z = &stream.limit_zones[lc.zone];
            let v = self.udp_render(key, &z.key);
            if v.is_empty() {
                continue;
            }
            let k = crate::limits::key_hash(&v);
            if self.zones[base + lc.zone].acquire(k, lc.max, self.cx.now_ms) {
                took.push((base + lc.zone, k));
                continue;
            }
            let dry = conf.limit_conn_dry_run;
            let s = &self.udp[key];
            crate::log!(
                Error,
                "limiting connections{} by zone \"{}\", udp client: {}, server: {}",
                if dry { ", dry run," } else { "" },
                z.name,
                s.client.ip(),
                s.listen
            );
            if !dry {
                pass = false;
            }
            break;
        }
        self.udp[key].held = took;
        pass
    }

    /// A template's value for session `key` (the stream variables).
    fn udp_render(&self, key: usize, parts: &[shard_config::Part]) -> Vec<u8> {
        let s = &self.udp[key];
        let session = self.udp_session(s);
        let mut v = Vec::new();
        super::relay::render_parts(&mut v, parts, &session, self.cx.now_ms, &self.hostname);
        v
    }
}

/// How many UDP sessions of upstream `ups` each peer serves in this worker (`least_conn`,
/// `max_conns`).
pub(super) fn count_udp_peers(sessions: &slab::Slab<UdpSession>, ups: usize, active: &mut [u64]) {
    for (_, s) in sessions.iter() {
        if s.ups == ups {
            if let Some(p) = s.peer {
                if let Some(a) = active.get_mut(p) {
                    *a += 1;
                }
            }
        }
    }
}

impl UdpSession {
    /// The values the stream variables read.
    pub(super) fn facts(&self) -> UdpFacts<'_> {
        UdpFacts {
            number: self.number,
            server: self.server,
            client: self.client,
            local: self.listen,
            status: self.status,
            started_ms: self.started_ms,
            bytes_sent: self.to_client,
            bytes_received: self.from_client,
            upstream: &self.attempts,
            up_sent: self.from_client,
            up_received: self.to_client,
            first_byte_ms: self.first_byte_ms,
        }
    }
}

/// What `relay.rs` needs of a UDP session to build its variables' view.
pub(super) struct UdpFacts<'a> {
    pub(super) number: u64,
    pub(super) server: usize,
    pub(super) client: SocketAddr,
    pub(super) local: SocketAddr,
    pub(super) status: u16,
    pub(super) started_ms: u64,
    pub(super) bytes_sent: u64,
    pub(super) bytes_received: u64,
    pub(super) upstream: &'a [SocketAddr],
    pub(super) up_sent: u64,
    pub(super) up_received: u64,
    pub(super) first_byte_ms: Option<u64>,
}

/// The sessions of a worker, by listener and client.
pub(super) type UdpIndex = HashMap<(usize, SocketAddr), usize>;

/// A peer's datagram to the client, through the listening socket.
fn udp_send_to_client(s: &mut UdpSession, data: &[u8]) {
    match shard_event::sock::send_to(s.listen_fd, data, &s.client) {
        Ok(n) => s.to_client += n as u64,
        Err(e) => crate::log!(
            Info,
            "sendto() failed ({}) while proxying connection, udp client: {}",
            shard_event::os_error_text(&e),
            s.client.ip()
        ),
    }
}
