//! The worker's context: what a step needs besides the object it works on (a connection,
//! its request, an upstream connection) and that is not the loop's: the configuration,
//! the worker's slot of counters in the shared region, the clock of the current loop turn,
//! and the spare buffers and requests that connections borrow and give back.
//!
//! A step written as a method of its object takes `&Ctx` or `&mut Ctx` next to it
//! (`Conn::flush`), so it can be run and tested on a socketpair without a worker; the
//! borrow of the context and of the object are disjoint fields of `Worker`. It owns no
//! connection and closes nothing: the loop (`Worker`) alone registers, times and closes
//! connections.

use shard_config::Config;

use crate::shm::WorkerSlot;

/// Buffers kept for reuse at most (each at most [`BUF_KEEP_MAX_BYTES`]).
const BUFS_KEPT_MAX: usize = 256;
/// A buffer larger than this is freed rather than kept.
const BUF_KEEP_MAX_BYTES: usize = 64 * 1024;

pub(crate) struct Ctx<'a> {
    pub(super) cfg: &'a Config,
    pub(super) slot: &'a WorkerSlot,
    /// Loop turns so far (`epoll_wait` returns). A turn is not an instant: accepting a batch
    /// serves each connection as it comes, so one turn may span several clients' round trips.
    pub(super) turn: u64,
    /// `CLOCK_MONOTONIC` milliseconds at the start of the turn.
    pub(super) now_ms: u64,
    /// Unix seconds, and the `Date` header and access-log time made from them once a second.
    pub(super) now_secs: u64,
    pub(super) date: Vec<u8>,
    pub(super) log_time: String,
    /// TLS handshake messages this turn may still process (`TLS_HANDSHAKES_PER_TURN`).
    pub(super) handshakes_left: u32,
    /// Spare buffers, so that connections do not allocate per request.
    pool: Vec<Vec<u8>>,
    /// Requests of connections that went idle or closed, kept to be reset for the next ones
    /// (a request is allocated once, not once per request), at most `REQ_SPARES_MAX`.
    /// Boxed: the allocations themselves move between connections and this list.
    #[allow(clippy::vec_box)]
    pub(super) req_spares: Vec<Box<super::conn::Req>>,
}

impl<'a> Ctx<'a> {
    pub(super) fn new(cfg: &'a Config, slot: &'a WorkerSlot, now_ms: u64) -> Ctx<'a> {
        Ctx {
            cfg,
            slot,
            turn: 0,
            now_ms,
            now_secs: 0,
            date: Vec::new(),
            log_time: String::new(),
            handshakes_left: super::TLS_HANDSHAKES_PER_TURN,
            pool: Vec::new(),
            req_spares: Vec::new(),
        }
    }

    /// Reads the clocks for a new loop turn; true when a new second began (the `Date` and
    /// log times were made again).
    pub(super) fn tick(&mut self) -> bool {
        self.turn += 1;
        self.now_ms = shard_event::monotonic_ms();
        let secs = shard_event::unix_secs();
        if secs == self.now_secs {
            return false;
        }
        self.now_secs = secs;
        self.date = shard_http::http_date(secs).into_bytes();
        self.log_time = shard_http::log_time(secs);
        true
    }

    /// An empty buffer of at least `cap` bytes, a spare one when there is one.
    pub(super) fn take_buf(&mut self, cap: usize) -> Vec<u8> {
        match self.pool.pop() {
            Some(mut b) => {
                b.clear();
                if b.capacity() < cap {
                    b.reserve(cap);
                }
                b
            }
            None => Vec::with_capacity(cap),
        }
    }

    /// A spare buffer as it was given back (empty, its capacity kept), or a new empty one
    /// (no allocation).
    pub(super) fn spare_buf(&mut self) -> Vec<u8> {
        self.pool.pop().unwrap_or_default()
    }

    /// Keeps `b` for a later [`Ctx::take_buf`]: only ordinary-size buffers, and a bounded
    /// number of them.
    pub(super) fn give_buf(&mut self, mut b: Vec<u8>) {
        if b.capacity() > 0 && b.capacity() <= BUF_KEEP_MAX_BYTES && self.pool.len() < BUFS_KEPT_MAX
        {
            b.clear();
            self.pool.push(b);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The least configuration a context needs.
    fn config() -> Config {
        shard_config::parse_str(
            "events {}",
            "t.conf",
            std::path::Path::new("/nonexistent"),
            std::path::Path::new("/pfx"),
            None,
        )
        .unwrap()
    }

    #[test]
    fn buffers_are_reused_within_bounds() {
        let cfg = config();
        let slot = WorkerSlot::default();
        let mut cx = Ctx::new(&cfg, &slot, 0);
        let mut b = cx.take_buf(100);
        b.extend_from_slice(b"left over");
        let p = b.as_ptr();
        cx.give_buf(b);
        let again = cx.take_buf(10);
        assert_eq!(again.as_ptr(), p, "the same allocation");
        assert!(again.is_empty());
        // Too large, or empty: not kept.
        cx.give_buf(Vec::with_capacity(BUF_KEEP_MAX_BYTES + 1));
        cx.give_buf(Vec::new());
        assert!(cx.pool.is_empty());
        for _ in 0..BUFS_KEPT_MAX + 10 {
            cx.give_buf(Vec::with_capacity(16));
        }
        assert_eq!(cx.pool.len(), BUFS_KEPT_MAX);
    }

    #[test]
    fn a_new_second_remakes_the_dates() {
        let cfg = config();
        let slot = WorkerSlot::default();
        let mut cx = Ctx::new(&cfg, &slot, 0);
        assert!(cx.tick());
        assert_eq!(cx.turn, 1);
        assert_eq!(cx.date.len(), 29);
        // Within the same second (almost always): only the turn and the milliseconds move.
        let secs = cx.now_secs;
        if !cx.tick() {
            assert_eq!(cx.now_secs, secs);
        }
        assert_eq!(cx.turn, 2);
    }
}
