//! `ssl_session_cache shared:NAME:SIZE`: TLS sessions in shared memory, so a client resumes
//! on whichever worker its next connection reaches (TLS 1.2 session IDs, and TLS 1.3
//! resumption when `ssl_session_tickets off` makes rustls issue tickets that name a cached
//! session instead of carrying it).
//!
//! A zone is one `MAP_SHARED | MAP_ANONYMOUS` mapping made by the master before it forks,
//! kept for the master's life and reused by every reload that names the same zone with the
//! same size, as nginx keeps its shared zones. Word 0 is the lock (`limits::lock`); the rest
//! are slots of [`SLOT_BYTES`]: the expiry time (unix ms, 0 for a free slot), the key's and
//! the value's lengths, the key, the value. A key's slot is one of [`PROBE`] from its hash;
//! a full neighbourhood gives up its slot that expires first. A session too large for a slot
//! (a long client certificate chain) is not cached. This module owns the layout; rustls
//! decides what a session is and when it is asked for.

use std::io;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

/// Bytes per slot: a session with an ECDSA client certificate fits; nginx counts about 4000
/// sessions per megabyte, shard 2048.
pub const SLOT_BYTES: usize = 512;
/// Expiry, then the two lengths.
const SLOT_HEADER: usize = 16;
/// The longest key: rustls's session IDs and stateful tickets are 32 bytes.
const KEY_MAX: usize = 32;
/// The longest value.
const VALUE_MAX: usize = SLOT_BYTES - SLOT_HEADER - KEY_MAX;
/// Bytes before the first slot: the lock, padded to a cache line.
const HEADER_BYTES: usize = 64;
/// Slots looked at from a key's home.
const PROBE: usize = 4;

/// One zone: the mapping and what the server names it with.
pub struct SharedSessions {
    base: *mut u8,
    slots: usize,
    timeout_ms: u64,
}

// SAFETY: the mapping is process-shared memory, read and written only under its lock.
unsafe impl Send for SharedSessions {}
// SAFETY: as above.
unsafe impl Sync for SharedSessions {}

impl std::fmt::Debug for SharedSessions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SharedSessions({} slots)", self.slots)
    }
}

/// The zones made so far, by name and size: a reload naming one again gets the same memory
/// (and its sessions).
type Zones = Vec<(String, usize, Arc<SharedSessions>)>;
static ZONES: Mutex<Zones> = Mutex::new(Vec::new());

/// The zone `name` of `bytes` (made now, or the one an earlier configuration made), whose
/// sessions live `timeout_ms` (`ssl_session_timeout`; the last configuration's wins).
pub fn zone(name: &str, bytes: usize, timeout_ms: u64) -> io::Result<Arc<SharedSessions>> {
    let mut zones = ZONES.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, _, z)) = zones.iter().find(|(n, b, _)| n == name && *b == bytes) {
        if z.timeout_ms == timeout_ms {
            return Ok(z.clone());
        }
        let again = Arc::new(SharedSessions {
            base: z.base,
            slots: z.slots,
            timeout_ms,
        });
        return Ok(again);
    }
    let slots = bytes.saturating_sub(HEADER_BYTES) / SLOT_BYTES;
    if slots == 0 {
        return Err(io::Error::other(format!("zone \"{name}\" is too small")));
    }
    // SAFETY: anonymous shared mapping with no address hint; the result is checked.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            HEADER_BYTES + slots * SLOT_BYTES,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    let z = Arc::new(SharedSessions {
        base: p.cast(),
        slots,
        timeout_ms,
    });
    zones.push((name.to_string(), bytes, z.clone()));
    Ok(z)
}

impl SharedSessions {
    fn lock_word(&self) -> &AtomicU64 {
        // SAFETY: the mapping starts page-aligned and lives as long as the process; the first
        // word is the lock, only ever accessed atomically.
        unsafe { &*(self.base as *const AtomicU64) }
    }

    /// Slot `i`'s bytes. Only under the lock.
    #[allow(clippy::mut_from_ref)]
    fn slot(&self, i: usize) -> &mut [u8] {
        debug_assert!(i < self.slots);
        // SAFETY: slot `i` lies within the mapping; callers hold the zone's lock, so no other
        // process or thread touches these bytes meanwhile.
        unsafe {
            std::slice::from_raw_parts_mut(self.base.add(HEADER_BYTES + i * SLOT_BYTES), SLOT_BYTES)
        }
    }

    fn home(&self, key: &[u8]) -> usize {
        // FNV-1a: keys are random bytes already.
        let h = key.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
        (h % self.slots as u64) as usize
    }

    /// The slot holding `key`, unexpired, under the lock.
    fn find(&self, key: &[u8], now: u64) -> Option<usize> {
        let home = self.home(key);
        (0..PROBE.min(self.slots))
            .map(|k| (home + k) % self.slots)
            .find(|&i| {
                let s = self.slot(i);
                let (expires, klen, _) = header(s);
                expires > now && klen == key.len() && &s[SLOT_HEADER..SLOT_HEADER + klen] == key
            })
    }

    fn value(&self, i: usize) -> Vec<u8> {
        let s = self.slot(i);
        let (_, _, vlen) = header(s);
        s[SLOT_HEADER + KEY_MAX..SLOT_HEADER + KEY_MAX + vlen].to_vec()
    }
}

/// A slot's expiry and lengths (bounded, whatever the memory holds).
fn header(s: &[u8]) -> (u64, usize, usize) {
    let word = |i: usize| u64::from_ne_bytes(s[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
    let lens = word(1);
    (
        word(0),
        ((lens & 0xffff_ffff) as usize).min(KEY_MAX),
        ((lens >> 32) as usize).min(VALUE_MAX),
    )
}

impl rustls::server::StoresServerSessions for SharedSessions {
    fn put(&self, key: Vec<u8>, value: Vec<u8>) -> bool {
        if key.is_empty() || key.len() > KEY_MAX || value.len() > VALUE_MAX {
            return false;
        }
        let now = shard_event::unix_ms();
        let _g = crate::limits::lock(self.lock_word());
        let home = self.home(&key);
        // The key's own slot, else a free or expired one, else the one expiring first.
        let i = self.find(&key, now).unwrap_or_else(|| {
            (0..PROBE.min(self.slots))
                .map(|k| (home + k) % self.slots)
                .min_by_key(|&i| {
                    let (expires, _, _) = header(self.slot(i));
                    if expires <= now {
                        0
                    } else {
                        expires
                    }
                })
                .expect("at least one slot")
        });
        let s = self.slot(i);
        let expires = now + self.timeout_ms.max(1);
        s[0..8].copy_from_slice(&expires.to_ne_bytes());
        let lens = key.len() as u64 | (value.len() as u64) << 32;
        s[8..16].copy_from_slice(&lens.to_ne_bytes());
        s[SLOT_HEADER..SLOT_HEADER + key.len()].copy_from_slice(&key);
        s[SLOT_HEADER + KEY_MAX..SLOT_HEADER + KEY_MAX + value.len()].copy_from_slice(&value);
        true
    }

    fn get(&self, key: &[u8]) -> Option<Vec<u8>> {
        let now = shard_event::unix_ms();
        let _g = crate::limits::lock(self.lock_word());
        self.find(key, now).map(|i| self.value(i))
    }

    fn take(&self, key: &[u8]) -> Option<Vec<u8>> {
        let now = shard_event::unix_ms();
        let _g = crate::limits::lock(self.lock_word());
        let i = self.find(key, now)?;
        let v = self.value(i);
        self.slot(i)[0..8].copy_from_slice(&0u64.to_ne_bytes());
        Some(v)
    }

    fn can_cache(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::server::StoresServerSessions;

    #[test]
    fn sessions_are_put_found_taken_and_bounded() {
        let z = zone("unit", 64 + 8 * SLOT_BYTES, 60_000).unwrap();
        assert!(z.put(vec![1; 32], vec![7; 100]));
        assert_eq!(z.get(&[1; 32]), Some(vec![7; 100]));
        assert_eq!(z.take(&[1; 32]), Some(vec![7; 100]));
        assert_eq!(z.get(&[1; 32]), None, "taken");
        assert!(!z.put(vec![2; 33], vec![0]), "a key too long");
        assert!(
            !z.put(vec![2; 32], vec![0; VALUE_MAX + 1]),
            "a value too long"
        );
        // More keys than slots: every put succeeds, the latest is found.
        for k in 0..100u8 {
            assert!(z.put(vec![k; 32], vec![k; 10]));
            assert_eq!(z.get(&[k; 32]), Some(vec![k; 10]));
        }
        // The same name and size again: the same memory.
        let again = zone("unit", 64 + 8 * SLOT_BYTES, 60_000).unwrap();
        assert_eq!(again.get(&[99; 32]), Some(vec![99; 10]));
        // Expired sessions are not found.
        let short = zone("short", 64 + 8 * SLOT_BYTES, 1).unwrap();
        assert!(short.put(vec![3; 32], vec![3]));
        std::thread::sleep(std::time::Duration::from_millis(5));
        assert_eq!(short.get(&[3; 32]), None);
    }
}
