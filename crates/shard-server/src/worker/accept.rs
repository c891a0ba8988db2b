//! Accepting: the listeners of one worker by strategy (its own shard, a shared socket with
//! `EPOLLEXCLUSIVE`, a shared socket under the accept mutex), the back-off at
//! `worker_connections` and at the descriptor limit, and the siblings' shards it adopts while
//! their worker is not serving.
//!
//! It owns when a listener is in epoll. It does not serve connections: an accepted socket goes
//! to `conn.rs` (HTTP) or `relay.rs` (stream) at once.

use super::*;
use crate::shm::{STEER_FUNNEL, STEER_HELP};

impl Worker<'_> {
    pub(super) fn register_listener(&mut self, i: usize) -> std::io::Result<()> {
        let l = &mut self.listeners[i];
        if l.registered {
            return Ok(());
        }
        // Level-triggered: a batch that stops before EAGAIN is reported again by the next wait.
        let interest = match l.mode {
            AcceptMode::Exclusive => Interest::READ | Interest::EXCLUSIVE,
            _ => Interest::READ,
        };
        self.poll.add(l.fd, Token::Listener(i).encode(), interest)?;
        l.registered = true;
        Ok(())
    }

    /// Registers listener `i`; a failure is logged (the listener stays out of epoll until the
    /// next attempt: a re-arm, a resumed pause, a mutex won).
    pub(super) fn poll_listener(&mut self, i: usize) {
        if let Err(e) = self.register_listener(i) {
            crate::log!(
                Alert,
                "epoll_ctl() failed ({})",
                shard_event::os_error_text(&e)
            );
        }
    }

    pub(super) fn unregister_listener(&mut self, i: usize) {
        let l = &mut self.listeners[i];
        if l.registered {
            let _ = self.poll.delete(l.fd);
            l.registered = false;
        }
    }

    /// Polls the shards of siblings that the master asks help for (`STEER_HELP`: stalled, or
    /// backlogged while this worker's shard is empty; `STEER_FUNNEL`: the funnel's shard of
    /// this worker's group, or one still holding connections while the funnel is on, see
    /// `steer.rs`) or that are not serving at all (dead
    /// and not yet respawned, stopped or stuck for `ORPHANED_AFTER_MS`, which holds with
    /// `reuseport_steering off` too), and stops polling them once their worker is back: the
    /// master keeps every shard open and every worker inherited every shard, so a queue never
    /// waits for one worker. Checked once per heartbeat and whenever the master's steering
    /// epoch moves.
    pub(super) fn adopt_orphaned_shards(&mut self) {
        if self.shutting_down {
            return;
        }
        for i in 0..self.listeners.len() {
            let Some(j) = self.listeners[i].adopted_from else {
                continue;
            };
            let bits = self.region.steer_bits(j);
            let not_serving = bits & STEER_HELP != 0
                || !self.region.serving(j, self.cx.now_ms, ORPHANED_AFTER_MS);
            let n = self.n_workers;
            let funnel = bits & STEER_FUNNEL != 0
                && crate::steer::funnel_group(j, n) == crate::steer::funnel_group(self.idx, n);
            let orphaned = not_serving || funnel;
            let l = &mut self.listeners[i];
            if orphaned == l.enabled {
                continue;
            }
            l.enabled = orphaned;
            // The funnel's polling is routine under load (the master logs it once).
            if orphaned && not_serving {
                crate::log!(
                    Info,
                    "worker {} is not serving: worker {} polls its shard of {}",
                    j,
                    self.idx,
                    self.cx.cfg.listeners[l.conf_idx].addr
                );
            }
            if orphaned {
                if self.accept_paused_until.is_none() {
                    self.poll_listener(i);
                }
            } else {
                self.unregister_listener(i);
            }
        }
    }

    /// nginx's ngx_trylock_accept_mutex, per lock: keep a lock's listeners registered while we
    /// keep winning it, drop them when another worker holds it.
    pub(super) fn try_accept_mutex(&mut self) {
        for j in 0..self.locks.len() {
            let (id, held) = self.locks[j];
            let won = self.region.try_lock_accept(id, self.pid);
            if won == held {
                continue;
            }
            for i in 0..self.listeners.len() {
                let l = &self.listeners[i];
                if l.mode != AcceptMode::Mutex || l.lock != id {
                    continue;
                }
                if won {
                    self.poll_listener(i);
                } else {
                    self.unregister_listener(i);
                }
            }
            self.locks[j].1 = won;
        }
    }

    /// Unlocks what this worker holds; `held` stays set, as nginx's `ngx_accept_mutex_held`,
    /// so the listeners stay registered while the next `try_accept_mutex` wins again.
    pub(super) fn release_accept_locks(&self) {
        for &(id, held) in &self.locks {
            if held {
                self.region.unlock_accept(id, self.pid);
            }
        }
    }

    pub(super) fn accept_on(&mut self, li: usize) {
        // A `quic` socket carries the datagrams of connections in progress: read whatever
        // the worker's state (a stopping worker drains its QUIC connections there).
        if self.listeners.get(li).is_some_and(|l| l.quic) {
            self.quic_readable(li);
            return;
        }
        // A pause taken for an earlier listener of the same batch holds for this one too.
        if li >= self.listeners.len() || self.shutting_down || self.accept_paused_until.is_some() {
            return;
        }
        // A sibling's shard is helped a batch at a time, whatever `multi_accept` says: what
        // this worker takes it must serve promptly, or it only moves the queue.
        let batch = if self.listeners[li].adopted_from.is_some() {
            ACCEPT_BATCH
        } else {
            batch_size(self.multi_accept)
        };
        self.accept_batch(li, batch);
    }

    /// Whether `n` more connections fit under `worker_connections`, after closing idle
    /// keep-alive connections if that is what it takes (nginx's `ngx_drain_connections`).
    pub(super) fn room_for_connections(&mut self, n: usize) -> bool {
        if self.connections_used() + n <= self.conns_max {
            return true;
        }
        let mut idle: Vec<(u64, usize)> = self
            .conns
            .iter()
            .filter(|(_, c)| c.is_idle())
            .map(|(k, c)| (c.deadline_ms, k))
            .collect();
        if idle.is_empty() {
            return false;
        }
        // The longest idle first (the earliest keep-alive deadline); as nginx, an eighth of
        // them and at most 32 at a time, at least one.
        idle.sort_unstable();
        let drain = (idle.len() / 8)
            .clamp(n, IDLE_DRAIN_MAX.max(n))
            .min(idle.len());
        for &(_, k) in &idle[..drain] {
            self.close(k);
        }
        self.connections_used() + n <= self.conns_max
    }

    /// Stops polling every listener until a connection closes or `accept_mutex_delay`
    /// passes; logs `alert` once per shortage.
    pub(super) fn pause_accepting(
        &mut self,
        need: usize,
        for_cap: bool,
        alert: std::fmt::Arguments<'_>,
    ) {
        self.accept_paused_for_cap = for_cap;
        self.accept_pause_need = need;
        if !self.accept_pause_logged {
            self.accept_pause_logged = true;
            crate::log!(Alert, "{alert}");
            WorkerSlot::bump(&self.cx.slot.accept_pauses, 1);
        }
        let delay = self.cx.cfg.events.accept_mutex_delay_ms.max(1);
        self.accept_paused_until = Some(self.cx.now_ms + delay);
        for i in 0..self.listeners.len() {
            // QUIC connections in progress read their datagrams there (new ones are
            // refused at the cap by `h3.rs`).
            if !self.listeners[i].quic {
                self.unregister_listener(i);
            }
        }
        if self.accept_mutex {
            self.release_accept_locks();
            for l in &mut self.locks {
                l.1 = false;
            }
        }
    }

    pub(super) fn resume_accepting(&mut self) {
        self.accept_paused_until = None;
        if self.shutting_down {
            return;
        }
        for i in 0..self.listeners.len() {
            // `Mutex` listeners come back through `try_accept_mutex`.
            if self.listeners[i].mode != AcceptMode::Mutex && self.listeners[i].enabled {
                self.poll_listener(i);
            }
        }
    }

    /// Accepts up to `batch` connections from listener `li` and starts serving them.
    pub(super) fn accept_batch(&mut self, li: usize, batch: usize) {
        let fd = self.listeners[li].fd;
        let cfg = self.cx.cfg;
        let conf_l = &cfg.listeners[self.listeners[li].conf_idx];
        if conf_l.opts.quic {
            // QUIC datagrams (`h3.rs`).
            self.quic_readable(li);
            return;
        }
        if conf_l.opts.udp {
            // Datagrams, not connections (`udp.rs`).
            self.udp_readable(li);
            return;
        }
        // An HTTP connection starts with its default server's settings (timeouts); an HTTP
        // listener always has an http block, the check only keeps this free of a panic.
        let http_server = match (conf_l.kind, cfg.http.as_ref()) {
            (shard_config::ListenerKind::Http, Some(h)) => Some(&h.servers[conf_l.default_server]),
            (shard_config::ListenerKind::Http, None) => return,
            (shard_config::ListenerKind::Stream { .. }, _) => None,
        };
        // A stream relay needs its upstream socket too: two connections, as in nginx.
        let need = if http_server.is_some() { 1 } else { 2 };
        for _ in 0..batch {
            if !self.room_for_connections(need) {
                let n = self.conns_max;
                self.pause_accepting(
                    need,
                    true,
                    format_args!("{n} worker_connections are not enough"),
                );
                break;
            }
            let (cfd, peer) = match shard_event::sock::accept(fd) {
                Ok(x) => x,
                Err(e) => {
                    match e.raw_os_error() {
                        Some(libc::EAGAIN) | Some(libc::ECONNABORTED) | Some(libc::EINTR) => {}
                        // Out of descriptors: as nginx, stop accepting for a while instead
                        // of being woken for the same queued connection again and again.
                        // The files kept for the next request give theirs back first.
                        Some(libc::EMFILE) | Some(libc::ENFILE) if self.release_held_files() => {
                            continue;
                        }
                        Some(libc::EMFILE) | Some(libc::ENFILE) => {
                            let text = shard_event::os_error_text(&e);
                            self.pause_accepting(
                                need,
                                false,
                                format_args!("accept4() failed ({text})"),
                            );
                        }
                        _ => crate::log!(
                            Alert,
                            "accept4() failed ({})",
                            shard_event::os_error_text(&e)
                        ),
                    }
                    break;
                }
            };
            self.accept_pause_logged = false;
            WorkerSlot::bump(&self.cx.slot.accepted, 1);
            WorkerSlot::bump(&self.cx.slot.handled, 1);
            WorkerSlot::bump(&self.cx.slot.active, 1);
            let l = &mut self.listeners[li];
            l.accepts += 1;
            if l.adopted_from.is_some() {
                WorkerSlot::bump(&self.cx.slot.adopted, 1);
                WorkerSlot::bump(&self.cx.slot.stolen, 1);
            }
            let conf_idx = l.conf_idx;
            let tls = match self.tls.get(conf_idx).map(super::tls::TlsConn::new) {
                None => None,
                Some(Ok(mut t)) => {
                    t.cert_pending = self.tls.dynamic.get(conf_idx).copied().unwrap_or(false);
                    Some(Box::new(t))
                }
                Some(Err(e)) => {
                    crate::log!(Alert, "cannot start TLS ({e})");
                    WorkerSlot::drop_one(&self.cx.slot.active);
                    continue;
                }
            };
            let Some(_) = http_server else {
                if let shard_config::ListenerKind::Stream { server } = conf_l.kind {
                    self.start_relay(
                        cfd,
                        peer,
                        conf_l.addr,
                        server,
                        tls,
                        conf_l.opts.proxy_protocol,
                    );
                }
                continue;
            };
            let id = self.next_conn_id;
            self.next_conn_id += 1;
            let number = self.region.connections.fetch_add(1, Relaxed) + 1;
            let key = self
                .conns
                .insert(Conn::new(cfd, peer, conf_idx, id, number, self.cx.now_ms));
            self.conns[key].tls = tls;
            self.conns[key].pp_pending = conf_l.opts.proxy_protocol;
            self.debug_accepted(number, peer, super::conn::fd_of(&self.conns[key].fd));
            self.start_reading(key, true);
            self.conns[key].await_first_byte(self.cx.slot);
            let deadline = self.conns[key].deadline_ms;
            self.set_conn_deadline(key, deadline);
            if self.listeners[li].mode == AcceptMode::Mutex {
                // As nginx posts accept events: the lock is held for accepting only; the new
                // connections are served after it is released.
                self.posted.push(key);
            } else {
                self.drive(key);
            }
        }
        if self.accept_mutex {
            self.accept_disabled = accept_disabled(self.conns_max, self.connections_used());
        }
        let l = &mut self.listeners[li];
        // Not while paused: the pause took the listener out of epoll on purpose.
        if l.mode == AcceptMode::Exclusive
            && l.accepts >= EXCLUSIVE_REARM_EVERY
            && self.accept_paused_until.is_none()
        {
            l.accepts = 0;
            self.unregister_listener(li);
            self.poll_listener(li);
        }
    }
}

impl Worker<'_> {
    /// Connection `number` (http or stream) of a `debug_connection` client logs at the debug
    /// level everywhere until it closes.
    pub(super) fn debug_client(&self, number: u64, peer: Option<std::net::SocketAddr>) {
        let list = &self.cx.cfg.events.debug_connection;
        if !list.is_empty() && shard_config::DebugConnection::matches(list, peer.map(|p| p.ip())) {
            crate::log::debug_connection(number, true);
        }
    }

    /// A connection just accepted: a `debug_connection` client's logs at the debug level
    /// everywhere until it closes; the debug line of its accept.
    pub(super) fn debug_accepted(
        &mut self,
        number: u64,
        peer: Option<std::net::SocketAddr>,
        fd: i32,
    ) {
        self.debug_client(number, peer);
        let outer = crate::log::set_connection(number);
        match peer {
            Some(p) => crate::debug!("accept: {p} fd:{fd}"),
            None => crate::debug!("accept: unix: fd:{fd}"),
        }
        crate::log::set_connection(outer);
    }
}

/// Connections accepted per readiness report: all that are queued with `multi_accept on`,
/// at most [`ACCEPT_BATCH`] with it off.
fn batch_size(multi_accept: bool) -> usize {
    if multi_accept {
        usize::MAX
    } else {
        ACCEPT_BATCH
    }
}

/// nginx's `ngx_accept_disabled = connection_n / 8 - free_connection_n`: positive once more than
/// 7/8 of a worker's connections are in use, the number of loop iterations it then sits out the
/// accept mutex so that a fuller worker leaves new connections to the others.
fn accept_disabled(conns_max: usize, used: usize) -> i64 {
    let free = conns_max as i64 - used as i64;
    conns_max as i64 / 8 - free
}

#[cfg(test)]
mod tests {
    use super::{accept_disabled, batch_size};

    #[test]
    fn multi_accept_off_takes_at_most_eight_per_readiness_report() {
        assert_eq!(batch_size(false), 8);
        assert_eq!(batch_size(true), usize::MAX);
    }

    #[test]
    fn a_worker_more_than_seven_eighths_full_sits_out_the_accept_mutex() {
        // 512 connections: 448 used is exactly 7/8, still competing; one more sits out.
        assert_eq!(accept_disabled(512, 0), -448);
        assert_eq!(accept_disabled(512, 448), 0);
        assert_eq!(accept_disabled(512, 449), 1);
        assert_eq!(accept_disabled(512, 512), 64);
        // nginx's integer division: 16 connections, 14 used is 7/8.
        assert_eq!(accept_disabled(16, 14), 0);
        assert_eq!(accept_disabled(16, 15), 1);
    }
}
