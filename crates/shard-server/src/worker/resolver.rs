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
/// How long a failure is remembered, so that the requests waiting for it read it and a burst
/// of requests for a dead name does not become a burst of queries.
const NEGATIVE_TTL_MS: u64 = 1_000;
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
    started_ms: u64,
    /// `(connection key, connection id)` of the requests waiting.
    waiters: Vec<(usize, u64)>,
}

#[derive(Default)]
pub(super) struct Resolver {
    queries: slab::Slab<Query>,
    cache: HashMap<String, Cached>,
    /// The next server to ask, in turn.
    rotate: usize,
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
        let ck = format!("{name}/{}{}", u8::from(conf.ipv4), u8::from(conf.ipv6));
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
        let server = self.resolver.rotate % conf.servers.len().max(1);
        self.resolver.rotate = self.resolver.rotate.wrapping_add(1);
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
            started_ms: self.cx.now_ms,
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

    /// A new id for query `qk` (its answers to the old one are ignored).
    fn random_u16_for(&mut self, qk: usize) -> u16 {
        let old = self.resolver.queries[qk].id;
        loop {
            let id = self.random_u16();
            if id != old {
                return id;
            }
        }
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
            Step::Fail(e) => self.finish_query(qk, Err(e)),
        }
    }

    fn on_answer(&mut self, qk: usize, a: Result<Answer, DnsError>) {
        let q = &mut self.resolver.queries[qk];
        match a {
            Ok(Answer::Truncated) => {
                // Again over TCP, to the same server.
                let addr = q.conf.servers[q.server];
                let fd = match shard_event::sock::connect_nonblocking(&addr) {
                    Ok(Connect::Done(fd)) | Ok(Connect::InProgress(fd)) => fd,
                    Err(_) => return self.finish_query(qk, Err(DnsError::ServerFailure)),
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
                // The name is an alias of one this answer has no records for: that name is
                // asked (same server, type and waiters), at most `CNAMES_MAX` times.
                if q.cnames >= CNAMES_MAX || !dns::valid_name(&target) {
                    return self.finish_query(qk, Err(DnsError::HostNotFound));
                }
                q.ttl = q.ttl.min(ttl);
                q.cnames += 1;
                q.name = target;
                let id = self.random_u16_for(qk);
                let q = &mut self.resolver.queries[qk];
                q.id = id;
                let msg = dns::query(q.id, &q.name, q.qtype);
                let sent = if q.tcp {
                    q.out = (msg.len() as u16).to_be_bytes().to_vec();
                    q.out.extend_from_slice(&msg);
                    q.out_pos = 0;
                    q.inbuf.clear();
                    tcp_step(q)
                } else {
                    match shard_event::sock::write(q.fd.as_raw_fd(), &msg) {
                        Ok(_) => Step::Wait,
                        Err(_) => Step::Fail(DnsError::ServerFailure),
                    }
                };
                match sent {
                    Step::Wait => {}
                    Step::Answer(a) => self.on_answer(qk, a),
                    Step::Fail(e) => self.finish_query(qk, Err(e)),
                }
            }
            Ok(Answer::Addrs(addrs, ttl)) => {
                q.found.extend(addrs);
                q.ttl = q.ttl.min(ttl);
                if q.qtype == dns::TYPE_A && q.conf.ipv6 {
                    // Then AAAA, on a fresh socket (and id).
                    let (ck, name, conf, server) =
                        (q.key.clone(), q.orig.clone(), q.conf.clone(), q.server);
                    let valid = conf.valid_ms;
                    let old = self.resolver.queries.remove(qk);
                    let found = old.found;
                    let ttl = old.ttl;
                    let waiters = old.waiters;
                    if self
                        .start_query(ck.clone(), name, conf, server, dns::TYPE_AAAA, None)
                        .is_err()
                    {
                        return self.deliver(&ck, Ok(found), ttl, valid, &waiters);
                    }
                    if let Some((_, nq)) =
                        self.resolver.queries.iter_mut().find(|(_, x)| x.key == ck)
                    {
                        nq.found = found;
                        nq.ttl = ttl;
                        nq.waiters = waiters;
                    }
                    return;
                }
                let found = std::mem::take(&mut q.found);
                let ttl = q.ttl;
                if found.is_empty() {
                    self.finish_query(qk, Err(DnsError::HostNotFound));
                } else {
                    let q = self.resolver.queries.remove(qk);
                    self.deliver(&q.key, Ok(found), ttl, q.conf.valid_ms, &q.waiters);
                }
            }
            Err(e) => {
                // An AAAA failure after A records still answers with those.
                if !q.found.is_empty() {
                    let q = self.resolver.queries.remove(qk);
                    let (found, ttl) = (q.found.clone(), q.ttl);
                    return self.deliver(&q.key, Ok(found), ttl, q.conf.valid_ms, &q.waiters);
                }
                self.finish_query(qk, Err(e));
            }
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
            Err(_) => NEGATIVE_TTL_MS,
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
        if waiters.is_empty() {
            // A `server ... resolve` name asked by the heartbeat: applied now, while the
            // answer is fresh (a TTL shorter than the heartbeat would otherwise never be).
            self.refresh_resolved_upstreams();
        }
    }

    /// Drops queries nobody will read any more (past their `resolver_timeout`).
    pub(super) fn expire_queries(&mut self) {
        let now = self.cx.now_ms;
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
    Fail(DnsError),
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
            Err(_) => return Step::Fail(DnsError::ServerFailure),
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
            Err(_) => return Step::Fail(DnsError::ServerFailure),
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
            Ok(0) => return Step::Fail(DnsError::ServerFailure),
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Step::Wait,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return Step::Fail(DnsError::ServerFailure),
        }
    }
}

fn resolver_interest() -> shard_event::Interest {
    shard_event::Interest::READ | shard_event::Interest::WRITE | shard_event::Interest::EDGE
}
