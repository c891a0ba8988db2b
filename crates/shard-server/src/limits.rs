//! `limit_req_zone` and `limit_conn_zone`: tables in shared memory that every worker of
//! every generation reads and writes, so a limit holds for the server, not per worker.
//!
//! A zone is one `MAP_SHARED | MAP_ANONYMOUS` mapping of the configured size, created by the
//! master before it forks (and kept across reloads while its name and size stay). Word 0 is a
//! lock (the holder's pid); the rest are entries of four words: a 128-bit key (a hash of the
//! key variable's value; all-zero is a free entry), then, for requests, the bucket's excess in
//! thousandths of a request and the time of the last one, or, for connections, the count and
//! the time it last changed. Lookups probe [`PROBE`] entries from the key's home; a full
//! neighbourhood reuses its least recently used entry, as nginx's zones drop their oldest
//! state. This module owns the layout and the arithmetic (nginx's leaky bucket); the worker
//! decides what a verdict does to a request.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};

/// Entries probed from a key's home before one is reused.
const PROBE: usize = 16;

/// Words per entry: key high, key low, value, time.
const ENTRY_WORDS: usize = 4;

/// Words before the first entry: the lock, and padding to a cache line.
const HEADER_WORDS: usize = 8;

/// Spins on a busy lock before looking whether its holder still lives.
const SPINS_BEFORE_CHECK: u32 = 1 << 16;

/// One zone's mapping. A handle: copies share the same memory, which is never unmapped (the
/// master and its workers keep zones for their whole life).
#[derive(Clone, Copy)]
pub struct Zone {
    base: *const AtomicU64,
    words: usize,
}

// SAFETY: the mapping is process-shared memory accessed only through atomics.
unsafe impl Send for Zone {}
// SAFETY: as above.
unsafe impl Sync for Zone {}

/// What `limit_req` decides for one request and one zone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReqVerdict {
    /// Within the rate.
    Pass,
    /// Within the burst: the excess, in thousandths of a request (the worker delays by
    /// `excess / rate` unless `nodelay`).
    Excess(u64),
    /// Beyond the burst: refused (`limit_req_status`), with the excess it would have had.
    Reject(u64),
}

/// A held shared-memory lock; dropping it releases the lock.
pub(crate) struct Guard<'z> {
    lock: &'z AtomicU64,
}

/// Takes a lock word in shared memory (the holder's pid while held). A holder that died (a
/// killed worker) is detected after a while of spinning and its lock taken over. Also the
/// lock of `ssl_session_cache shared:` zones (`sessions.rs`).
pub(crate) fn lock(lock: &AtomicU64) -> Guard<'_> {
    let me = shard_event::process::getpid() as u64;
    let mut spins = 0u32;
    loop {
        match lock.compare_exchange_weak(0, me, Ordering::Acquire, Ordering::Relaxed) {
            Ok(_) => return Guard { lock },
            Err(holder) => {
                spins += 1;
                if spins.is_multiple_of(SPINS_BEFORE_CHECK) && holder != 0 {
                    // SAFETY: kill(2) with signal 0 only checks that the pid exists.
                    let gone = unsafe { libc::kill(holder as libc::pid_t, 0) } != 0
                        && io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
                    if gone {
                        let _ =
                            lock.compare_exchange(holder, 0, Ordering::AcqRel, Ordering::Relaxed);
                    }
                }
                if spins.is_multiple_of(64) {
                    std::thread::yield_now();
                } else {
                    std::hint::spin_loop();
                }
            }
        }
    }
}

impl Drop for Guard<'_> {
    fn drop(&mut self) {
        self.lock.store(0, Ordering::Release);
    }
}

/// A zeroed `MAP_SHARED | MAP_ANONYMOUS` mapping of `words` 64-bit words, never unmapped:
/// the memory of the zones here and of `cache.rs`'s keys zones.
pub(crate) fn map_words(words: usize) -> io::Result<*const AtomicU64> {
    // SAFETY: anonymous shared mapping with no address hint; the result is checked.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            words * 8,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    Ok(p as *const AtomicU64)
}

impl Zone {
    /// Maps a zeroed zone of `bytes` (at least one entry).
    pub fn create(bytes: usize) -> io::Result<Zone> {
        let words = (bytes / 8).max(HEADER_WORDS + ENTRY_WORDS);
        Ok(Zone {
            base: map_words(words)?,
            words,
        })
    }

    fn word(&self, i: usize) -> &AtomicU64 {
        debug_assert!(i < self.words);
        // SAFETY: `i` is within the mapping, which is zero-initialised, aligned, and lives as
        // long as the process; `AtomicU64` has the layout of `u64`.
        unsafe { &*self.base.add(i) }
    }

    fn entries(&self) -> usize {
        (self.words - HEADER_WORDS) / ENTRY_WORDS
    }

    /// Takes the zone's lock ([`lock`]).
    fn lock(&self) -> Guard<'_> {
        lock(self.word(0))
    }

    /// The entry of `key` (found, or claimed: a free one, else the least recently used of
    /// its neighbourhood, whose state is dropped). `None`: every neighbour is in use by a
    /// connection count (never dropped).
    fn slot(&self, key: u128, keep_busy: bool) -> Option<usize> {
        let hi = (key >> 64) as u64;
        let lo = (key as u64) | 1; // never all-zero: (0, 0) marks a free entry
        let n = self.entries();
        let home = (lo as usize ^ hi as usize) % n;
        let mut oldest: Option<(usize, u64)> = None;
        for k in 0..PROBE.min(n) {
            let i = (home + k) % n;
            let w = HEADER_WORDS + i * ENTRY_WORDS;
            let (h, l) = (
                self.word(w).load(Ordering::Relaxed),
                self.word(w + 1).load(Ordering::Relaxed),
            );
            if h == hi && l == lo {
                return Some(w);
            }
            if h == 0 && l == 0 {
                self.word(w).store(hi, Ordering::Relaxed);
                self.word(w + 1).store(lo, Ordering::Relaxed);
                self.word(w + 2).store(0, Ordering::Relaxed);
                self.word(w + 3).store(0, Ordering::Relaxed);
                return Some(w);
            }
            if keep_busy && self.word(w + 2).load(Ordering::Relaxed) > 0 {
                continue;
            }
            let t = self.word(w + 3).load(Ordering::Relaxed);
            if oldest.is_none_or(|(_, o)| t < o) {
                oldest = Some((w, t));
            }
        }
        let (w, _) = oldest?;
        self.word(w).store(hi, Ordering::Relaxed);
        self.word(w + 1).store(lo, Ordering::Relaxed);
        self.word(w + 2).store(0, Ordering::Relaxed);
        self.word(w + 3).store(0, Ordering::Relaxed);
        Some(w)
    }

    /// nginx's leaky bucket for one request at `now_ms`: the excess drains at
    /// `rate_milli` (thousandths of a request per second) and each request adds 1000; over
    /// `burst_milli` the request is refused and the bucket left as it was.
    pub fn request(&self, key: u128, now_ms: u64, rate_milli: u64, burst_milli: u64) -> ReqVerdict {
        let _g = self.lock();
        let Some(w) = self.slot(key, false) else {
            return ReqVerdict::Pass;
        };
        let (excess, last) = (
            self.word(w + 2).load(Ordering::Relaxed),
            self.word(w + 3).load(Ordering::Relaxed),
        );
        let fresh = last == 0;
        let elapsed = now_ms.saturating_sub(last);
        let drained = rate_milli.saturating_mul(elapsed) / 1000;
        // nginx: `excess - rate * ms / 1000 + 1000`, then at least 0: a bucket that drained
        // for more than its excess takes this request at 0 (passed at once), not at 1000.
        let new = if fresh {
            0
        } else {
            excess.saturating_add(1000).saturating_sub(drained)
        };
        if new > burst_milli {
            return ReqVerdict::Reject(new);
        }
        self.word(w + 2).store(new, Ordering::Relaxed);
        self.word(w + 3).store(now_ms.max(1), Ordering::Relaxed);
        if new == 0 {
            ReqVerdict::Pass
        } else {
            ReqVerdict::Excess(new)
        }
    }

    /// `limit_conn`: counts one more request for `key` unless `max` are in flight.
    pub fn acquire(&self, key: u128, max: u64, now_ms: u64) -> bool {
        let _g = self.lock();
        let Some(w) = self.slot(key, true) else {
            // Every neighbour is counting: nginx cannot allocate either, and refuses.
            return false;
        };
        let n = self.word(w + 2).load(Ordering::Relaxed);
        if n >= max {
            return false;
        }
        self.word(w + 2).store(n + 1, Ordering::Relaxed);
        self.word(w + 3).store(now_ms.max(1), Ordering::Relaxed);
        true
    }

    /// Ends one request counted by [`Zone::acquire`].
    pub fn release(&self, key: u128, now_ms: u64) {
        let _g = self.lock();
        if let Some(w) = self.slot(key, true) {
            let n = self.word(w + 2).load(Ordering::Relaxed);
            self.word(w + 2)
                .store(n.saturating_sub(1), Ordering::Relaxed);
            self.word(w + 3).store(now_ms.max(1), Ordering::Relaxed);
        }
    }
}

/// The 128-bit key of a zone entry for the key variable's value.
pub fn key_hash(value: &[u8]) -> u128 {
    use std::hash::{Hash, Hasher};
    let mut a = std::collections::hash_map::DefaultHasher::new();
    value.hash(&mut a);
    let mut b = std::collections::hash_map::DefaultHasher::new();
    0x5eed_u32.hash(&mut b);
    value.hash(&mut b);
    (u128::from(a.finish()) << 64) | u128::from(b.finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leaky_bucket_as_nginx() {
        let z = Zone::create(4096).unwrap();
        let k = key_hash(b"10.0.0.1");
        // 1 r/s, burst 2.
        let (rate, burst) = (1000, 2000);
        assert_eq!(z.request(k, 10_000, rate, burst), ReqVerdict::Pass);
        assert_eq!(z.request(k, 10_000, rate, burst), ReqVerdict::Excess(1000));
        assert_eq!(z.request(k, 10_000, rate, burst), ReqVerdict::Excess(2000));
        assert_eq!(z.request(k, 10_000, rate, burst), ReqVerdict::Reject(3000));
        // Half a second drains half a request.
        assert_eq!(z.request(k, 10_500, rate, burst), ReqVerdict::Reject(2500));
        assert_eq!(z.request(k, 11_000, rate, burst), ReqVerdict::Excess(2000));
        // Another key is not affected.
        assert_eq!(
            z.request(key_hash(b"x"), 11_000, rate, burst),
            ReqVerdict::Pass
        );
        // Long idle: the bucket is empty again, and the next request passes at once.
        assert_eq!(z.request(k, 20_000, rate, burst), ReqVerdict::Pass);
        assert_eq!(z.request(k, 20_000, rate, burst), ReqVerdict::Excess(1000));
        // One second drains the one request in excess: the next passes (excess 0), as nginx's
        // `excess - rate * ms / 1000 + 1000` floored at 0.
        assert_eq!(z.request(k, 21_000, rate, burst), ReqVerdict::Excess(1000));
        assert_eq!(z.request(k, 23_000, rate, burst), ReqVerdict::Pass);
    }

    #[test]
    fn connection_counts() {
        let z = Zone::create(4096).unwrap();
        let k = key_hash(b"a");
        assert!(z.acquire(k, 2, 1));
        assert!(z.acquire(k, 2, 1));
        assert!(!z.acquire(k, 2, 1));
        z.release(k, 2);
        assert!(z.acquire(k, 2, 3));
    }

    #[test]
    fn a_full_zone_reuses_its_oldest_entries() {
        let z = Zone::create(64 + 8 * 32).unwrap(); // 8 entries
        for i in 0..100u64 {
            assert_eq!(
                z.request(key_hash(&i.to_le_bytes()), 1 + i, 1000, 0),
                ReqVerdict::Pass
            );
        }
    }

    #[test]
    fn shared_with_a_child_process() {
        let z = Zone::create(4096).unwrap();
        let k = key_hash(b"shared");
        // SAFETY: the child only touches the shared zone and exits.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            let ok = z.acquire(k, 5, 1);
            unsafe { libc::_exit(if ok { 0 } else { 1 }) };
        }
        let mut st = 0;
        // SAFETY: waiting for our own child.
        unsafe { libc::waitpid(pid, &mut st, 0) };
        assert_eq!(libc::WEXITSTATUS(st), 0);
        for _ in 0..4 {
            assert!(z.acquire(k, 5, 2));
        }
        assert!(!z.acquire(k, 5, 2), "the child's count is seen here");
    }
}
