//! The worker's DNS resolver (`resolver`, `resolver_timeout`): names asked of the configured
//! servers without blocking, from the worker's own epoll loop.
//!
//! This module owns the queries in flight (one UDP socket each, connected to the server, so
//! the kernel picks a random source port and drops datagrams from anyone else; a random id;
//! the answer must name the question), the fall back to TCP for a truncated answer, A then
//! AAAA (`ipv4=`/`ipv6=`), and a bounded cache per worker (the TTL, or `valid=`). Requests
//! that wait for a name are listed on its query and driven again when it ends; their own
//! deadline (`resolver_timeout`) ends their wait. What a name is for (`proxy_pass` with
//! variables) is `proxy.rs`'s; the message bytes are `crate::dns`'s.

use std::collections::HashMap;
use std::net::IpAddr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;

use shard_config::ResolverConf;
use shard_event::sock::Connect;

use super::token::{self, Token};
use super::Worker;
use crate::dns::{self, Answer, DnsError};

/// Names kept per worker; beyond, expired entries go first, then any.
const CACHE_MAX: usize = 1024;
/// Queries in flight per worker; beyond, a name fails at once (`2: Server failure`).
const QUERIES_MAX: usize = 256;
/// A query with no usable answer yet is sent again, to the next server, this often (nginx's
/// `resend_timeout`), until `resolver_timeout` ends it.
const RESEND_MS: u64 = 5_000;
/// The shortest time an answer is kept (a TTL of 0 would be asked again per request).
const MIN_TTL_MS: u64 = 1_000;
/// A UDP answer's largest size read (EDNS is not offered: 512 is what servers send).
const UDP_ANSWER_MAX: usize = 4096;
/// CNAMEs a query follows with queries of their own (nginx has no bound but loops).
const CNAMES_MAX: u8 = 8;

/// Set in a waiter's id when it is a stream relay's (`relays` key) rather than an HTTP
/// connection's (`conns` key); connection ids are counters that never reach it.
pub(super) const RELAY_WAITER: u64 = 1 << 63;

/// A name's answer as the cache holds it.
#[derive(Debug, Clone)]
pub(super) struct Cached {
    pub(super) result: Result<Vec<IpAddr>, DnsError>,
    expires_ms: u64,
}

/// What [`Worker::resolve_name`] found.
pub(super) enum Resolved {
    Ready(Vec<IpAddr>),
    Failed(DnsError),
    /// A query is in flight; the caller is driven again when it ends.
    Waiting,
}

struct Query {
    /// The cache key (name and families).
    key: String,
    name: String,
    conf: Arc<ResolverConf>,
    server: usize,
    id: u16,
    qtype: u16,
    fd: OwnedFd,
    gen: u64,
    /// Over TCP (after a truncated UDP answer): the length-prefixed query and how much of it
    /// went, and what came back.
    tcp: bool,
    out: Vec<u8>,
    out_pos: usize,
    inbuf: Vec<u8>,
    found: Vec<IpAddr>,
    ttl: u32,
    /// CNAMEs followed with a query of their own so far, and the name first asked (the
    /// AAAA question after the A one is about it, not about the A's alias).
    cnames: u8,
    orig: String,
    /// The alias the last answer named without an address of its type.
    last_cname: Option<String>,
    started_ms: u64,
    /// When it was last sent (resent after [`RESEND_MS`] without an answer).
    sent_ms: u64,
    /// `(connection key, connection id)` of the requests waiting.
    waiters: Vec<(usize, u64)>,
}

#[derive(Default)]
pub(super) struct Resolver {
    queries: slab::Slab<Query>,
    cache: HashMap<String, Cached>,
    /// Per `resolver` (its servers): the next server to ask, in turn, as each of nginx's
    /// resolvers keeps its own.
    rotate: HashMap<Vec<std::net::SocketAddr>, usize>,
    /// A failure being handed to the requests that waited for it: failures are not cached
    /// (nginx's: the next request asks again, of the next server), so the waiters read it
    /// here while they are driven.
    failing: Option<(String, DnsError)>,
}

/// A `resolver`'s identity in the cache: nginx keeps one cache per resolver, so answers
/// kept under one `valid=` are not read under another.
fn conf_key(conf: &ResolverConf) -> String {
    format!(
        "{}{}/{:?}/{:?}",
        u8::from(conf.ipv4),
        u8::from(conf.ipv6),
        conf.valid_ms,
        conf.servers
    )
}

impl Worker<'_> {
    /// The addresses of `name` for the request on `key`: from the cache, or a query is
    /// started (or joined) and the request waits.
    pub(super) fn resolve_name(
        &mut self,
        key: usize,
        name: &str,
        conf: &Arc<ResolverConf>,
    ) -> Resolved {
        let waiter = (key, self.conns[key].id);
        self.resolve_for(Some(waiter), name, conf)
    }

    /// [`Worker::resolve_name`] for `waiter` (a request to drive again when the answer
    /// comes), or for nobody (`server ... resolve`: the next heartbeat reads the cache).
    pub(super) fn resolve_for(
        &mut self,
        waiter: Option<(usize, u64)>,
        name: &str,
        conf: &Arc<ResolverConf>,
    ) -> Resolved {
        let name = name.trim_end_matches('.').to_ascii_lowercase();
        if !dns::valid_name(&name) {
            return Resolved::Failed(DnsError::FormatError);
        }
        let ck = format!("{name}/{}", conf_key(conf));
        if let Some((k, e)) = &self.resolver.failing {
            if *k == ck {
                return Resolved::Failed(*e);
            }
        }
        if let Some(c) = self.resolver.cache.get(&ck) {
            if c.expires_ms > self.cx.now_ms {
                return match &c.result {
                    Ok(a) => Resolved::Ready(a.clone()),
                    Err(e) => Resolved::Failed(*e),
                };
            }
        }
        if let Some((_, q)) = self.resolver.queries.iter_mut().find(|(_, q)| q.key == ck) {
            if let Some(w) = waiter.filter(|w| !q.waiters.contains(w)) {
                q.waiters.push(w);
            }
            return Resolved::Waiting;
        }
        if self.resolver.queries.len() >= QUERIES_MAX {
            crate::log!(
                Error,
                "too many DNS queries in flight while resolving {name}"
            );
            return Resolved::Failed(DnsError::ServerFailure);
        }
        let server = self.next_server(conf);
        let qtype = if conf.ipv4 {
            dns::TYPE_A
        } else {
            dns::TYPE_AAAA
        };
        match self.start_query(ck, name.clone(), conf.clone(), server, qtype, waiter) {
            Ok(()) => Resolved::Waiting,
            Err(e) => {
                crate::log!(
                    Error,
                    "could not ask the resolver {} for {name} ({})",
                    conf.servers
                        .get(server)
                        .map_or(String::new(), |s| s.to_string()),
                    shard_event::os_error_text(&e)
                );
                Resolved::Failed(DnsError::ServerFailure)
            }
        }
    }

    /// The server of `conf` to ask next, in turn.
    fn next_server(&mut self, conf: &ResolverConf) -> usize {
        let n = conf.servers.len().max(1);
        let turn = self
            .resolver
            .rotate
            .entry(conf.servers.clone())
            .or_insert(0);
        let server = *turn % n;
        *turn = (server + 1) % n;
        server
    }

    fn start_query(
        &mut self,
        ck: String,
        name: String,
        conf: Arc<ResolverConf>,
        server: usize,
        qtype: u16,
        waiter: Option<(usize, u64)>,
    ) -> std::io::Result<()> {
        let addr = *conf
            .servers
            .get(server)
            .ok_or_else(|| std::io::Error::other("no name servers defined"))?;
        let fd = shard_event::sock::udp_connected(&addr)?;
        let id = self.random_u16();
        let q = dns::query(id, &name, qtype);
        shard_event::sock::write(fd.as_raw_fd(), &q)?;
        let gen = self.next_conn_id;
        self.next_conn_id += 1;
        let raw = fd.as_raw_fd();
        let orig = name.clone();
        let qk = self.resolver.queries.insert(Query {
            key: ck,
            name,
            conf,
            server,
            id,
            qtype,
            fd,
            gen,
            tcp: false,
            out: Vec::new(),
            out_pos: 0,
            inbuf: Vec::new(),
            found: Vec::new(),
            ttl: u32::MAX,
            cnames: 0,
            orig,
            last_cname: None,
            started_ms: self.cx.now_ms,
            sent_ms: self.cx.now_ms,
            waiters: waiter.into_iter().collect(),
        });
        let token = Token::Resolver {
            key: qk,
            generation: token::generation(gen),
        };
        if let Err(e) = self.poll.add(raw, token.encode(), resolver_interest()) {
            self.resolver.queries.remove(qk);
            return Err(e);
        }
        Ok(())
    }

    fn random_u16(&mut self) -> u16 {
        // xorshift64, the worker's generator (seeded per process, never 0).
        let mut x = self.rng;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.rng = x;
        (x >> 24) as u16
    }

    /// An event on a query's socket.
    pub(super) fn on_resolver_event(&mut self, qk: usize, generation: u32) {
        let Some(q) = self.resolver.queries.get_mut(qk) else {
            return;
        };
        if token::generation(q.gen) != generation {
            return;
        }
        let outcome = if q.tcp { tcp_step(q) } else { udp_step(q) };
        match outcome {
            Step::Wait => {}
            Step::Answer(a) => self.on_answer(qk, a),
            // A server that cannot be reached (ICMP unreachable, a refused or broken TCP
            // connection) fails nothing yet: the query is sent again, to the next server,
            // at its resend time, as nginx's.
            Step::Unreachable => {}
        }
    }

    /// Sends query `qk` again over UDP to the next server of its resolver, with its id: a
    /// fresh socket replaces the old one (an answer on the old one is no longer read).
    fn resend_query(&mut self, qk: usize) {
        let conf = self.resolver.queries[qk].conf.clone();
        let server = self.next_server(&conf);
        let q = &mut self.resolver.queries[qk];
        q.sent_ms = self.cx.now_ms;
        let Some(addr) = conf.servers.get(server).copied() else {
            return;
        };
        let Ok(fd) = shard_event::sock::udp_connected(&addr) else {
            return;
        };
        let msg = dns::query(q.id, &q.name, q.qtype);
        if shard_event::sock::write(fd.as_raw_fd(), &msg).is_err() {
            return;
        }
        q.server = server;
        q.tcp = false;
        q.out.clear();
        q.out_pos = 0;
        q.inbuf.clear();
        let raw = fd.as_raw_fd();
        q.fd = fd;
        let token = Token::Resolver {
            key: qk,
            generation: token::generation(q.gen),
        };
        let _ = self.poll.add(raw, token.encode(), resolver_interest());
    }

    fn on_answer(&mut self, qk: usize, a: Result<Answer, DnsError>) {
        let q = &mut self.resolver.queries[qk];
        match a {
            Ok(Answer::Truncated) => {
                // Again over TCP, to the same server.
                let addr = q.conf.servers[q.server];
                let fd = match shard_event::sock::connect_nonblocking(&addr) {
                    Ok(Connect::Done(fd)) | Ok(Connect::InProgress(fd)) => fd,
                    // Sent again at its resend time, as one that cannot be reached.
                    Err(_) => return,
                };
                let msg = dns::query(q.id, &q.name, q.qtype);
                q.out = (msg.len() as u16).to_be_bytes().to_vec();
                q.out.extend_from_slice(&msg);
                q.out_pos = 0;
                q.inbuf.clear();
                q.tcp = true;
                let raw = fd.as_raw_fd();
                // The UDP socket closes (and leaves epoll) as it is replaced.
                q.fd = fd;
                let token = Token::Resolver {
                    key: qk,
                    generation: token::generation(q.gen),
                };
                if self
                    .poll
                    .add(raw, token.encode(), resolver_interest())
                    .is_err()
                {
                    self.finish_query(qk, Err(DnsError::ServerFailure));
                }
            }
            Ok(Answer::Cname(target, ttl)) => {
                // Only an alias, no address of the type: kept, and followed if the pair's
                // last answer is this and no address came (nginx's rule).
                q.ttl = q.ttl.min(ttl);
                q.last_cname = Some(target);
                self.pair_step(qk);
            }
            Ok(Answer::Addrs(addrs, ttl)) => {
                q.found.extend(addrs);
                q.ttl = q.ttl.min(ttl);
                q.last_cname = None;
                self.pair_step(qk);
            }
            // An error in either answer fails the name, addresses of the other too (nginx).
            Err(e) => self.finish_query(qk, Err(e)),
        }
    }

    /// One answer of a name's A/AAAA pair is in: the AAAA question next (A first, then
    /// AAAA, each over a fresh socket and id), or the pair is done: its addresses, else the
    /// alias the last answer named is resolved the same way (at most [`CNAMES_MAX`] times),
    /// else the name is not found.
    fn pair_step(&mut self, qk: usize) {
        let q = &self.resolver.queries[qk];
        if q.qtype == dns::TYPE_A && q.conf.ipv6 {
            let name = q.name.clone();
            return self.continue_query(qk, name, dns::TYPE_AAAA, false);
        }
        if !q.found.is_empty() {
            let q = self.resolver.queries.remove(qk);
            return self.deliver(&q.key, Ok(q.found), q.ttl, q.conf.valid_ms, &q.waiters);
        }
        match q.last_cname.clone() {
            Some(target) if q.cnames < CNAMES_MAX && dns::valid_name(&target) => {
                let qtype = if q.conf.ipv4 {
                    dns::TYPE_A
                } else {
                    dns::TYPE_AAAA
                };
                self.continue_query(qk, target, qtype, true);
            }
            _ => self.finish_query(qk, Err(DnsError::HostNotFound)),
        }
    }

    /// Query `qk` goes on as a question for `name` and `qtype` on a fresh socket and id,
    /// keeping its waiters, addresses and TTL (`alias`: one more CNAME followed).
    fn continue_query(&mut self, qk: usize, name: String, qtype: u16, alias: bool) {
        let old = self.resolver.queries.remove(qk);
        let (ck, conf, server) = (old.key.clone(), old.conf.clone(), old.server);
        if self
            .start_query(ck.clone(), name, conf, server, qtype, None)
            .is_err()
        {
            let result = if old.found.is_empty() {
                Err(DnsError::ServerFailure)
            } else {
                Ok(old.found)
            };
            return self.deliver(&ck, result, old.ttl, old.conf.valid_ms, &old.waiters);
        }
        if let Some((_, nq)) = self.resolver.queries.iter_mut().find(|(_, x)| x.key == ck) {
            nq.found = old.found;
            nq.ttl = old.ttl;
            nq.waiters = old.waiters;
            nq.orig = old.orig;
            nq.cnames = old.cnames + u8::from(alias);
            nq.started_ms = old.started_ms;
        }
    }

    fn finish_query(&mut self, qk: usize, result: Result<Vec<IpAddr>, DnsError>) {
        if !self.resolver.queries.contains(qk) {
            return;
        }
        let q = self.resolver.queries.remove(qk);
        self.deliver(&q.key, result, q.ttl, q.conf.valid_ms, &q.waiters);
    }

    /// Caches a name's result and drives the requests that waited for it.
    fn deliver(
        &mut self,
        ck: &str,
        result: Result<Vec<IpAddr>, DnsError>,
        ttl: u32,
        valid: Option<u64>,
        waiters: &[(usize, u64)],
    ) {
        let keep_ms = match &result {
            Ok(_) => valid
                .unwrap_or(u64::from(ttl).saturating_mul(1000))
                .max(MIN_TTL_MS),
            Err(e) => {
                self.resolver.failing = Some((ck.to_string(), *e));
                self.drive_waiters(waiters);
                self.resolver.failing = None;
                return;
            }
        };
        let cache = &mut self.resolver.cache;
        if cache.len() >= CACHE_MAX {
            let now = self.cx.now_ms;
            cache.retain(|_, c| c.expires_ms > now);
            if cache.len() >= CACHE_MAX {
                if let Some(k) = cache.keys().next().cloned() {
                    cache.remove(&k);
                }
            }
        }
        cache.insert(
            ck.to_string(),
            Cached {
                result,
                expires_ms: self.cx.now_ms + keep_ms,
            },
        );
        self.drive_waiters(waiters);
        if waiters.is_empty() {
            // A `server ... resolve` name asked by the heartbeat: applied now, while the
            // answer is fresh (a TTL shorter than the heartbeat would otherwise never be).
            self.refresh_resolved_upstreams();
        }
    }

    /// Drives the requests and sessions that waited on a query.
    fn drive_waiters(&mut self, waiters: &[(usize, u64)]) {
        for &(key, id) in waiters {
            if id & RELAY_WAITER != 0 {
                if self
                    .relays
                    .get(key)
                    .is_some_and(|r| r.id == id & !RELAY_WAITER)
                {
                    self.resume_resolved_relay(key);
                }
            } else if self.conns.get(key).is_some_and(|c| c.id == id) {
                self.drive(key);
            }
        }
    }

    /// Drops queries nobody will read any more (past their `resolver_timeout`), and sends
    /// again those unanswered for [`RESEND_MS`].
    pub(super) fn expire_queries(&mut self) {
        let now = self.cx.now_ms;
        let due: Vec<usize> = self
            .resolver
            .queries
            .iter()
            .filter(|(_, q)| {
                now.saturating_sub(q.sent_ms) >= RESEND_MS
                    && now.saturating_sub(q.started_ms) <= q.conf.timeout_ms
            })
            .map(|(k, _)| k)
            .collect();
        for k in due {
            self.resend_query(k);
        }
        let old: Vec<usize> = self
            .resolver
            .queries
            .iter()
            .filter(|(_, q)| now.saturating_sub(q.started_ms) > q.conf.timeout_ms)
            .map(|(k, _)| k)
            .collect();
        for k in old {
            self.finish_query(k, Err(DnsError::TimedOut));
        }
    }
}

enum Step {
    Wait,
    Answer(Result<Answer, DnsError>),
    /// The server cannot be reached (the query waits for its resend).
    Unreachable,
}

fn udp_step(q: &mut Query) -> Step {
    let mut buf = vec![0u8; UDP_ANSWER_MAX];
    loop {
        match shard_event::sock::read(q.fd.as_raw_fd(), &mut buf) {
            Ok(n) => match dns::parse(&buf[..n], q.id, &q.name, q.qtype) {
                // Not ours (a late answer, a spoofed one): ignored, as nginx does.
                Err(DnsError::Invalid) => continue,
                other => return Step::Answer(other),
            },
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Step::Wait,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            // ICMP port unreachable: nobody listens there.
            Err(_) => return Step::Unreachable,
        }
    }
}

fn tcp_step(q: &mut Query) -> Step {
    let fd = q.fd.as_raw_fd();
    while q.out_pos < q.out.len() {
        match shard_event::sock::write(fd, &q.out[q.out_pos..]) {
            Ok(n) => q.out_pos += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Step::Wait,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return Step::Unreachable,
        }
    }
    loop {
        if q.inbuf.len() >= 2 {
            let len = usize::from(u16::from_be_bytes([q.inbuf[0], q.inbuf[1]]));
            if q.inbuf.len() >= 2 + len {
                return Step::Answer(
                    match dns::parse(&q.inbuf[2..2 + len], q.id, &q.name, q.qtype) {
                        Ok(Answer::Truncated) => Err(DnsError::Invalid),
                        other => other,
                    },
                );
            }
        }
        q.inbuf.reserve(4096);
        match shard_event::sock::read_into(fd, &mut q.inbuf) {
            Ok(0) => return Step::Unreachable,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Step::Wait,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return Step::Unreachable,
        }
    }
}

fn resolver_interest() -> shard_event::Interest {
    shard_event::Interest::READ | shard_event::Interest::WRITE | shard_event::Interest::EDGE
}
