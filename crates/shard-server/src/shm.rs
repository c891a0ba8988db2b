//! The shared-memory region: per-worker counters and heartbeats, and the accept mutex.
//!
//! The master maps it before forking any worker; every worker and every respawned worker sees
//! the same bytes. Each `WorkerSlot` has exactly one writer (its worker), so its counters are
//! updated with plain relaxed loads and stores rather than read-modify-write instructions;
//! readers (status pages in any worker, the master) may see a slightly stale value, never a
//! torn one.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Upper bound of `worker_processes` (and of the config check).
pub const MAX_WORKERS: usize = 1024;

/// One worker's numbers. 128-byte aligned so that two workers never share a cache line
/// (or an adjacent-line prefetch pair).
#[repr(C, align(128))]
#[derive(Default, bytemuck::Zeroable)]
pub struct WorkerSlot {
    pub pid: AtomicU64,
    pub accepted: AtomicU64,
    pub handled: AtomicU64,
    pub requests: AtomicU64,
    pub active: AtomicU64,
    pub reading: AtomicU64,
    pub writing: AtomicU64,
    pub waiting: AtomicU64,
    /// `CLOCK_MONOTONIC` milliseconds of the last loop iteration.
    pub heartbeat_ms: AtomicU64,
    pub cpu_ms: AtomicU64,
    /// The configuration generation the worker runs.
    pub generation: AtomicU64,
    /// The worker index the slot serves (for counters kept per index across generations).
    pub idx: AtomicU64,
    /// Turns a connection ended because it used up its budget (`TURN_ROUNDS_MAX`).
    pub budget_yields: AtomicU64,
    /// Connections accepted from a sibling's shard while that worker was not serving it.
    pub adopted: AtomicU64,
    /// Times the worker reached `worker_connections` (or the descriptor limit) and paused
    /// accepting.
    pub accept_pauses: AtomicU64,
    /// Request-body bytes held in memory now (gauge).
    pub body_mem_bytes: AtomicU64,
    /// Request-body bytes written to temporary files, ever.
    pub body_spooled_bytes: AtomicU64,
    /// Request-body temporary files open now (gauge).
    pub body_temp_files: AtomicU64,
    /// 1 while the worker waits in `epoll_wait`, 0 while its loop runs (with `heartbeat_ms`,
    /// what the master judges a stall by).
    pub idle: AtomicU64,
    /// Connections accepted from a sibling's shard (stalled, backlogged or without a worker).
    pub stolen: AtomicU64,
    /// Times the master found this worker stalled. Written by the master, the one exception to
    /// the single-writer rule of this struct: the worker never writes it.
    pub stalls: AtomicU64,
    /// `open_file_cache` lookups answered from the cache.
    pub file_cache_hits: AtomicU64,
    /// `open_file_cache` lookups that opened the file (not cached, too old, or too few uses).
    pub file_cache_misses: AtomicU64,
    /// Entries in the worker's `open_file_cache`s now (gauge).
    pub file_cache_entries: AtomicU64,
    /// TLS handshakes completed.
    pub tls_handshakes: AtomicU64,
    /// Time spent processing TLS handshake messages, microseconds (the handshakes' CPU).
    pub tls_handshake_us: AtomicU64,
    /// Handshake messages put off to a later loop turn: more than `TLS_HANDSHAKES_PER_TURN`
    /// were ready in one turn (`worker.rs`).
    pub tls_handshakes_deferred: AtomicU64,
    /// HTTP/2 connections sent `GOAWAY` by `http2_rebalance`, ever.
    pub h2_rebalanced: AtomicU64,
    /// `http2_rebalance` shed connections: until this `CLOCK_MONOTONIC` millisecond, the
    /// master's steering program sends new connections to the siblings (their clients
    /// reconnecting must not land here again).
    pub shed_until_ms: AtomicU64,
    /// QUIC connections of the worker now (gauge).
    pub quic_connections: AtomicU64,
    /// Datagrams the worker read from its `quic` sockets.
    pub quic_datagrams: AtomicU64,
    /// Datagrams for a QUIC connection this worker does not hold (dropped): with steering by
    /// connection ID, a connection of a worker that died; without, also a client whose
    /// address changed.
    pub quic_strays: AtomicU64,
    /// Retry packets sent (`quic_retry on`).
    pub quic_retries: AtomicU64,
    /// HTTP/3 requests that came in 0-RTT data (`ssl_early_data on`), before the handshake
    /// completed.
    pub quic_0rtt: AtomicU64,
    /// Datagrams that carried this worker's key in their connection ID (placed by connection
    /// ID where the group is steered), and datagrams whose ID the client chose (Initial and
    /// 0-RTT packets: placed by the hash of the addresses).
    pub quic_by_cid: AtomicU64,
    pub quic_by_hash: AtomicU64,
}

impl WorkerSlot {
    /// Every number back to zero, for a worker of a new generation taking this slot. Listed
    /// field by field through a destructuring, so a new field cannot be forgotten here.
    pub fn reset(&self) {
        let WorkerSlot {
            pid,
            accepted,
            handled,
            requests,
            active,
            reading,
            writing,
            waiting,
            heartbeat_ms,
            cpu_ms,
            generation,
            idx,
            budget_yields,
            adopted,
            accept_pauses,
            body_mem_bytes,
            body_spooled_bytes,
            body_temp_files,
            idle,
            stolen,
            stalls,
            file_cache_hits,
            file_cache_misses,
            file_cache_entries,
            tls_handshakes,
            tls_handshake_us,
            tls_handshakes_deferred,
            h2_rebalanced,
            shed_until_ms,
            quic_connections,
            quic_datagrams,
            quic_strays,
            quic_retries,
            quic_0rtt,
            quic_by_cid,
            quic_by_hash,
        } = self;
        for c in [
            pid,
            accepted,
            handled,
            requests,
            active,
            reading,
            writing,
            waiting,
            heartbeat_ms,
            cpu_ms,
            generation,
            idx,
            budget_yields,
            adopted,
            accept_pauses,
            body_mem_bytes,
            body_spooled_bytes,
            body_temp_files,
            idle,
            stolen,
            stalls,
            file_cache_hits,
            file_cache_misses,
            file_cache_entries,
            tls_handshakes,
            tls_handshake_us,
            tls_handshakes_deferred,
            h2_rebalanced,
            shed_until_ms,
            quic_connections,
            quic_datagrams,
            quic_strays,
            quic_retries,
            quic_0rtt,
            quic_by_cid,
            quic_by_hash,
        ] {
            c.store(0, Relaxed);
        }
    }

    /// The monotonic counters: `accepted`, `handled`, `requests`, `cpu_ms`, `budget_yields`,
    /// `adopted`, `accept_pauses`, `body_spooled_bytes`, `stolen`, `stalls`,
    /// `file_cache_hits`, `file_cache_misses`, `tls_handshakes`, `tls_handshake_us`,
    /// `tls_handshakes_deferred`, `h2_rebalanced`, `quic_datagrams`, `quic_strays`,
    /// `quic_retries`, `quic_0rtt`, `quic_by_cid`, `quic_by_hash`.
    pub fn counters(&self) -> [&AtomicU64; COUNTERS] {
        [
            &self.accepted,
            &self.handled,
            &self.requests,
            &self.cpu_ms,
            &self.budget_yields,
            &self.adopted,
            &self.accept_pauses,
            &self.body_spooled_bytes,
            &self.stolen,
            &self.stalls,
            &self.file_cache_hits,
            &self.file_cache_misses,
            &self.tls_handshakes,
            &self.tls_handshake_us,
            &self.tls_handshakes_deferred,
            &self.h2_rebalanced,
            &self.quic_datagrams,
            &self.quic_strays,
            &self.quic_retries,
            &self.quic_0rtt,
            &self.quic_by_cid,
            &self.quic_by_hash,
        ]
    }

    /// Single-writer increment (see the module doc).
    #[inline]
    pub fn bump(counter: &AtomicU64, by: u64) {
        counter.store(counter.load(Relaxed).wrapping_add(by), Relaxed);
    }

    /// Single-writer decrement of a gauge. A gauge never goes below zero: every decrement
    /// pairs with an earlier increment, and debug builds (the integration tests) check it.
    #[inline]
    pub fn drop_one(counter: &AtomicU64) {
        let v = counter.load(Relaxed);
        debug_assert!(v > 0, "a gauge went below zero");
        counter.store(v.saturating_sub(1), Relaxed);
    }
}

/// Accept locks for shards shared by several workers (`shards=N` with `accept_mutex on`): shard
/// k of every such listener uses lock `1 + k mod SHARD_LOCKS`. Lock 0 is nginx's one accept
/// mutex, for plain shared sockets.
pub const SHARD_LOCKS: usize = 64;

#[repr(C)]
#[derive(bytemuck::Zeroable)]
pub struct Region {
    /// Configuration generation: 1 at start, +1 per reload.
    pub generation: AtomicU64,
    /// Number of worker slots in use.
    pub n_workers: AtomicU64,
    /// Accept mutex (lock 0): 0 when free, else the holder's pid.
    pub accept_mutex: AtomicU64,
    /// Connections accepted by every worker of every generation: each connection's number
    /// (nginx's `ngx_connection_counter`: `$connection`, the error log's `*N`).
    pub connections: AtomicU64,
    /// The program the master's reuseport groups run (`PROGRAM_*`), for `shard_status`.
    pub steer_program: AtomicU64,
    _pad: [u64; 11],
    /// Locks 1..=SHARD_LOCKS, same encoding as `accept_mutex`.
    pub shard_locks: [AtomicU64; SHARD_LOCKS],
    /// Bumped by the master whenever a bit of `steer` changes (workers compare it once per
    /// loop turn; `SIGURG` wakes those that wait).
    pub steer_epoch: AtomicU64,
    /// Per worker index of the current generation: the master's `STEER_*` bits.
    pub steer: [AtomicU64; MAX_WORKERS],
    /// The slot of worker index `i` of the current generation. During a reload, workers of an
    /// older generation keep their own slots until they exit, so slots are allocated, not
    /// equal to the worker index.
    pub slot_of: [AtomicU64; MAX_WORKERS],
    pub workers: [WorkerSlot; MAX_WORKERS],
    /// Per worker index, the counters of that index's workers that exited for good (an old
    /// generation after a reload, a worker stopped by `WINCH`), so that totals survive
    /// reloads as nginx's shared counters do. Written by the master only, inside `fold_seq`.
    pub retired: [Retired; MAX_WORKERS],
    /// Odd while the master moves an exited slot's counters into `retired`: readers retry
    /// (a sequence lock), so no total is read half moved.
    pub fold_seq: AtomicU64,
}

/// `Region::steer_program`: new connections land on per-worker shards at random: the kernel's
/// flow hash (`reuseport_steering off`, or nothing to steer) or the classic program's draw
/// (`bpf(2)` refused the dealing program).
pub const PROGRAM_RANDOM: u64 = 0;
/// Every per-worker group deals new connections in turn (eBPF).
pub const PROGRAM_ROUND_ROBIN: u64 = 1;

/// The name `shard_status` gives a `Region::steer_program` value.
pub fn program_name(v: u64) -> &'static str {
    match v {
        PROGRAM_ROUND_ROBIN => "round_robin",
        _ => "random",
    }
}

/// The environment variable that hands a binary upgrade's new master the counts so far.
pub const COUNTERS_ENV: &str = "SHARD_COUNTERS";

/// The counters (not the gauges) of a [`WorkerSlot`], in the order of [`WorkerSlot::counters`].
pub const COUNTERS: usize = 22;

/// The counters of exited workers of one index (see `Region::retired`).
#[repr(C)]
#[derive(bytemuck::Zeroable)]
pub struct Retired {
    pub counters: [AtomicU64; COUNTERS],
}

/// `Region::steer` bit: the worker's loop has not turned for `reuseport_stall_threshold` with
/// work waiting (or it is dead and not yet back).
pub const STEER_STALLED: u64 = 1;
/// `Region::steer` bit: siblings poll this worker's shards (it is stalled; with
/// `SHARD_STEER_BACKLOG=steal`, also while it is backlogged).
pub const STEER_HELP: u64 = 2;
/// `Region::steer` bit: the reuseport program sends this worker's shards no new connection
/// (stalled, or backlogged: its queue is longer than the live workers' mean).
pub const STEER_AWAY: u64 = 4;
/// `Region::steer` bit: the server is saturated (the funnel, `steer::Funnel`), and this
/// worker's shard takes new connections for its group of `steer::FUNNEL_GROUP` workers (or
/// still holds some): the group's other workers poll it too, so the group serves one queue
/// in order (`steer.rs`).
pub const STEER_FUNNEL: u64 = 8;

impl Region {
    /// Worker `idx`'s `STEER_*` bits.
    pub fn steer_bits(&self, idx: usize) -> u64 {
        self.steer.get(idx).map_or(0, |b| b.load(Relaxed))
    }

    /// A slot by slot number.
    pub fn worker(&self, slot: usize) -> &WorkerSlot {
        &self.workers[slot]
    }

    /// The current generation's workers, in index order.
    pub fn current(&self) -> impl Iterator<Item = &WorkerSlot> {
        let n = (self.n_workers.load(Relaxed) as usize).min(MAX_WORKERS);
        self.slot_of
            .iter()
            .take(n)
            .map(|s| &self.workers[(s.load(Relaxed) as usize).min(MAX_WORKERS - 1)])
    }

    /// Workers of older generations still stopping (a reload's previous workers finishing
    /// their connections): every slot with a pid and another generation than the current.
    pub fn stopping(&self) -> impl Iterator<Item = &WorkerSlot> {
        let current = self.generation.load(Relaxed);
        self.workers
            .iter()
            .filter(move |w| w.pid.load(Relaxed) != 0 && w.generation.load(Relaxed) != current)
    }

    /// Moves the counters of `slot`, whose worker (index `idx`) exited and will not be
    /// respawned into it, into `retired[idx]`. The master only.
    pub fn fold(&self, slot: usize, idx: usize) {
        let (Some(w), Some(r)) = (self.workers.get(slot), self.retired.get(idx)) else {
            return;
        };
        self.fold_seq
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        for (c, total) in w.counters().into_iter().zip(&r.counters) {
            total.fetch_add(c.swap(0, Relaxed), Relaxed);
        }
        self.fold_seq
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
    }

    /// Every index's counters over every generation, for a binary upgrade's new master
    /// (`COUNTERS_ENV`): `IDX:C0,C1,...;` for each index that counted anything.
    pub fn counters_env(&self) -> String {
        self.read_consistent(|r| {
            let mut s = String::new();
            for idx in 0..MAX_WORKERS {
                let v: Vec<u64> = (0..COUNTERS).map(|c| r.counter_of(idx, c)).collect();
                if v.iter().any(|&x| x > 0) {
                    let list: Vec<String> = v.iter().map(u64::to_string).collect();
                    s.push_str(&format!("{idx}:{};", list.join(",")));
                }
            }
            s
        })
    }

    /// Starts the retired totals from `counters_env`'s text (malformed entries are skipped).
    pub fn seed_counters(&self, text: &str) {
        for entry in text.split(';').filter(|e| !e.is_empty()) {
            let Some((idx, list)) = entry.split_once(':') else {
                continue;
            };
            let Some(r) = idx.parse::<usize>().ok().and_then(|i| self.retired.get(i)) else {
                continue;
            };
            for (c, v) in list.split(',').enumerate().take(COUNTERS) {
                if let Ok(v) = v.parse::<u64>() {
                    r.counters[c].store(v, Relaxed);
                }
            }
        }
    }

    /// Reads through `f` with no fold in progress (retried a few times, then taken as is).
    pub fn read_consistent<T>(&self, mut f: impl FnMut(&Region) -> T) -> T {
        for _ in 0..64 {
            let before = self.fold_seq.load(std::sync::atomic::Ordering::Acquire);
            if before.is_multiple_of(2) {
                let v = f(self);
                if self.fold_seq.load(std::sync::atomic::Ordering::Acquire) == before {
                    return v;
                }
            }
            std::hint::spin_loop();
        }
        f(self)
    }

    /// Counter `c` (an index into [`WorkerSlot::counters`]) of worker index `idx` over every
    /// generation: what exited workers of that index counted, and what the live ones (the
    /// current worker and older ones still stopping) count.
    pub fn counter_of(&self, idx: usize, c: usize) -> u64 {
        let retired = self
            .retired
            .get(idx)
            .map_or(0, |r| r.counters[c].load(Relaxed));
        retired
            + self
                .workers
                .iter()
                .filter(|w| w.idx.load(Relaxed) == idx as u64)
                .map(|w| w.counters()[c].load(Relaxed))
                .sum::<u64>()
    }

    /// Counter `c` over every worker of every generation.
    pub fn counter_total(&self, c: usize) -> u64 {
        let retired: u64 = self
            .retired
            .iter()
            .map(|r| r.counters[c].load(Relaxed))
            .sum();
        retired
            + self
                .workers
                .iter()
                .map(|w| w.counters()[c].load(Relaxed))
                .sum::<u64>()
    }

    /// Whether worker `idx` of the current generation is serving: it has a pid and its loop
    /// ran within `stale_ms`. A dead worker not yet respawned, a stopped one and one stuck in
    /// a long computation all read as not serving.
    pub fn serving(&self, idx: usize, now_ms: u64, stale_ms: u64) -> bool {
        if idx >= MAX_WORKERS || idx >= self.n_workers.load(Relaxed) as usize {
            return false;
        }
        let w = &self.workers[(self.slot_of[idx].load(Relaxed) as usize).min(MAX_WORKERS - 1)];
        w.pid.load(Relaxed) != 0 && now_ms.saturating_sub(w.heartbeat_ms.load(Relaxed)) < stale_ms
    }

    /// The lock a shared socket is guarded by: 0 for a plain shared socket, `1 + k` for shard k.
    pub fn lock_id(shard: Option<usize>) -> usize {
        shard.map_or(0, |k| 1 + k % SHARD_LOCKS)
    }

    fn lock(&self, id: usize) -> &AtomicU64 {
        match id {
            0 => &self.accept_mutex,
            k => &self.shard_locks[(k - 1) % SHARD_LOCKS],
        }
    }

    /// Takes lock `id` for `pid` if it is free (nginx's ngx_shmtx_trylock).
    pub fn try_lock_accept(&self, id: usize, pid: u64) -> bool {
        let l = self.lock(id);
        l.load(Relaxed) == 0
            && l.compare_exchange(0, pid, std::sync::atomic::Ordering::Acquire, Relaxed)
                .is_ok()
    }

    pub fn unlock_accept(&self, id: usize, pid: u64) {
        let _ =
            self.lock(id)
                .compare_exchange(pid, 0, std::sync::atomic::Ordering::Release, Relaxed);
    }

    /// Frees every lock a dead worker held (the master calls this on every reaped worker).
    pub fn force_unlock_accept(&self, dead_pid: u64) -> bool {
        let mut freed = false;
        for l in std::iter::once(&self.accept_mutex).chain(self.shard_locks.iter()) {
            freed |= l
                .compare_exchange(dead_pid, 0, std::sync::atomic::Ordering::AcqRel, Relaxed)
                .is_ok();
        }
        freed
    }
}

pub type SharedRegion = shard_event::shm::Shared<Region>;

pub fn create() -> std::io::Result<SharedRegion> {
    // `Region` derives `Zeroable`: made only of atomics, so all-zero is valid.
    let r = shard_event::shm::Shared::<Region>::new_zeroed()?;
    r.generation.store(1, Relaxed);
    Ok(r)
}
