//! `proxy_cache_path`'s two halves: the keys zone in shared memory, and the entry files on
//! disk. This module owns their layouts and the rules that read upstream headers into a
//! validity (nginx's `ngx_http_upstream` cache rules); the worker (`worker/cache.rs`) decides
//! when a request looks, waits, stores or serves, and the manager (`master.rs`) evicts.
//!
//! **The zone** is one `MAP_SHARED | MAP_ANONYMOUS` mapping made by the master before it
//! forks, kept across reloads while its name and size stay (as the `limit_*` zones, whose
//! lock it uses). Word 0 is the lock; word 1 the bytes of the entries the zone knows. Then
//! entries of [`ENTRY_WORDS`]: the key's 128-bit hash (all-zero: free), the number of uses,
//! the last use (unix milliseconds), flags (bit 0: the file exists; the high half: the pid
//! updating it), when that update began (ms, 0: none), the file's size, the key's low half,
//! and the file's version. Word 2 counts versions: every store, refresh or find of a file
//! gives its entry the next one, so a worker that keeps an entry's file open (the worker's
//! `CacheMemo`) knows, from the zone alone, that it is still the file at the path.
//! A full neighbourhood drops its least recently used entry from the zone (its file stays,
//! found again on disk by the next request that misses, or removed by the manager).
//!
//! **The manager** ([`manage`]) is a process of its own beside the workers, as nginx's
//! cache manager: it removes entries unused for `inactive`, then the least recently used
//! while the files exceed `max_size` or the file system has less than `min_free` free, and
//! temporary files a dead writer left. It works from the zone (a walk of its memory without
//! the lock, each removal checked under it); the directory itself is walked every
//! [`DISK_SCAN_SECS`], for files the zone does not know. **The loader** ([`load`])
//! indexes what is on disk at start and reload and exits; requests do not wait for it: one
//! that misses in the zone looks on disk, so a restart serves the entries of the run before
//! at once.
//!
//! **An entry file** is written to a temporary name in the cache directory and renamed into
//! place when the response is complete, so a reader sees a whole entry or none, whatever
//! kills the writer. Its layout: a 72-byte header ([`MAGIC`], fresh-until, stored-at, body
//! length, key length, head length, the `Vary` variant hash, the `stale-*` seconds, the
//! status of an intercepted error), the key, the upstream's response head (framing fields
//! removed), then the body.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use md5::{Digest, Md5};

/// Entries probed from a key's home before one is dropped.
const PROBE: usize = 16;
/// Words per entry.
const ENTRY_WORDS: usize = 9;
/// Words before the first entry: the lock, the bytes known, padding.
const HEADER_WORDS: usize = 8;

/// The first bytes of every entry file (the format's version is its last digit).
pub const MAGIC: &[u8; 8] = b"SHARDC2\n";
/// Bytes of an entry file's fixed header.
pub const HEADER_LEN: usize = 72;

const FLAG_EXISTS: u64 = 1;
/// The holder of an update sits above the flag bit: its pid, then a serial of its own.
const HOLDER_SHIFT: u32 = 1;
const OWNER_SERIAL_BITS: u32 = 24;

/// A token naming one request of this process as an update's holder.
pub fn owner(serial: u64) -> u64 {
    ((shard_event::process::getpid() as u64) << OWNER_SERIAL_BITS)
        | (serial & ((1 << OWNER_SERIAL_BITS) - 1))
}

/// One keys zone. A handle: copies share the same memory, never unmapped.
#[derive(Clone, Copy)]
pub struct Zone {
    base: *const AtomicU64,
    words: usize,
}

// SAFETY: process-shared memory accessed only through atomics.
unsafe impl Send for Zone {}
// SAFETY: as above.
unsafe impl Sync for Zone {}

/// What the zone knows of a key when a request looks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Seen {
    /// The file was stored (or found) and not removed since.
    pub exists: bool,
    /// Requests for the key so far, this one counted.
    pub uses: u64,
    /// Another request updates the entry (since less than the lock age).
    pub updating: bool,
    /// The version of the file the zone knows (0: none); read before the file is opened,
    /// it is never newer than what the open finds.
    pub version: u64,
}

impl Zone {
    /// Maps a zeroed zone of `bytes` (at least one entry).
    pub fn create(bytes: usize) -> io::Result<Zone> {
        let words = (bytes / 8).max(HEADER_WORDS + ENTRY_WORDS);
        Ok(Zone {
            base: crate::limits::map_words(words)?,
            words,
        })
    }

    fn word(&self, i: usize) -> &AtomicU64 {
        debug_assert!(i < self.words);
        // SAFETY: `i` is within the zeroed, aligned mapping, which lives as long as the
        // process; `AtomicU64` has the layout of `u64`.
        unsafe { &*self.base.add(i) }
    }

    fn entries(&self) -> usize {
        (self.words - HEADER_WORDS) / ENTRY_WORDS
    }

    fn get(&self, w: usize, f: usize) -> u64 {
        self.word(w + f).load(Ordering::Relaxed)
    }

    fn set(&self, w: usize, f: usize, v: u64) {
        self.word(w + f).store(v, Ordering::Relaxed)
    }

    /// The entry of `key`: found, or claimed (free, else the least recently used of its
    /// neighbourhood that nobody updates, whose bytes leave the zone's total).
    fn slot(&self, key: u128, claim: bool) -> Option<usize> {
        let hi = (key >> 64) as u64;
        let lo = (key as u64) | 1;
        let n = self.entries();
        let home = (lo as usize ^ hi as usize) % n;
        let mut oldest: Option<(usize, u64)> = None;
        let mut free = None;
        for k in 0..PROBE.min(n) {
            let w = HEADER_WORDS + ((home + k) % n) * ENTRY_WORDS;
            let (h, l) = (self.get(w, 0), self.get(w, 1));
            if h == hi && l == lo {
                return Some(w);
            }
            if h == 0 && l == 0 {
                free.get_or_insert(w);
                continue;
            }
            if self.get(w, 5) != 0 {
                continue;
            }
            let t = self.get(w, 3);
            if oldest.is_none_or(|(_, o)| t < o) {
                oldest = Some((w, t));
            }
        }
        if !claim {
            return None;
        }
        let w = match free {
            Some(w) => w,
            None => {
                let (w, _) = oldest?;
                self.forget(w);
                w
            }
        };
        for f in 2..ENTRY_WORDS {
            self.set(w, f, 0);
        }
        self.set(w, 0, hi);
        self.set(w, 1, lo);
        self.set(w, 7, key as u64);
        Some(w)
    }

    fn forget(&self, w: usize) {
        let size = self.get(w, 6);
        let total = self.word(1).load(Ordering::Relaxed);
        self.word(1)
            .store(total.saturating_sub(size), Ordering::Relaxed);
        for f in 0..ENTRY_WORDS {
            self.set(w, f, 0);
        }
    }

    /// A request looks at `key`: counts the use, and says whether the file exists and
    /// whether another request updates it (since less than `lock_age_ms`, from a live pid).
    pub fn look(&self, key: u128, now_ms: u64, used_ms: u64, lock_age_ms: u64) -> Seen {
        let _g = crate::limits::lock(self.word(0));
        let Some(w) = self.slot(key, true) else {
            return Seen::default();
        };
        let uses = self.get(w, 2) + 1;
        self.set(w, 2, uses);
        self.set(w, 3, used_ms);
        let since = self.get(w, 5);
        let updating = since != 0
            && now_ms.saturating_sub(since) < lock_age_ms
            && pid_alive(self.get(w, 4) >> HOLDER_SHIFT >> OWNER_SERIAL_BITS);
        let exists = self.get(w, 4) & FLAG_EXISTS != 0;
        Seen {
            exists,
            uses,
            updating,
            version: if exists { self.get(w, 8) } else { 0 },
        }
    }

    /// Takes the update of `key` for request `owner` ([`owner`]) unless another live request
    /// holds it (since less than `lock_age_ms`). `true`: `owner` holds it now.
    pub fn try_update(&self, key: u128, now_ms: u64, lock_age_ms: u64, owner: u64) -> bool {
        let _g = crate::limits::lock(self.word(0));
        let Some(w) = self.slot(key, true) else {
            return true;
        };
        let since = self.get(w, 5);
        let holder = self.get(w, 4) >> HOLDER_SHIFT;
        if since != 0
            && holder != owner
            && now_ms.saturating_sub(since) < lock_age_ms
            && pid_alive(holder >> OWNER_SERIAL_BITS)
        {
            return false;
        }
        self.set(w, 5, now_ms.max(1));
        self.set(
            w,
            4,
            (self.get(w, 4) & FLAG_EXISTS) | (owner << HOLDER_SHIFT),
        );
        true
    }

    /// Ends `owner`'s update of `key` taken by [`Zone::try_update`], stored or not.
    pub fn end_update(&self, key: u128, owner: u64) {
        let _g = crate::limits::lock(self.word(0));
        if let Some(w) = self.slot(key, false) {
            if self.get(w, 4) >> HOLDER_SHIFT == owner {
                self.set(w, 5, 0);
                self.set(w, 4, self.get(w, 4) & FLAG_EXISTS);
            }
        }
    }

    /// `key`'s file exists with `size` bytes (stored now, or found on disk), used at
    /// `used_ms` ([`unix_ms`]).
    pub fn stored(&self, key: u128, size: u64, used_ms: u64) {
        let _g = crate::limits::lock(self.word(0));
        let Some(w) = self.slot(key, true) else {
            return;
        };
        let old = if self.get(w, 4) & FLAG_EXISTS != 0 {
            self.get(w, 6)
        } else {
            0
        };
        let total = self.word(1).load(Ordering::Relaxed);
        self.word(1)
            .store(total.saturating_sub(old) + size, Ordering::Relaxed);
        self.set(w, 4, self.get(w, 4) | FLAG_EXISTS);
        self.set(w, 6, size);
        self.set(w, 3, used_ms);
        self.set(w, 8, self.next_version());
    }

    /// The next file version (zone word 2); the zone's lock is held.
    fn next_version(&self) -> u64 {
        let v = self.word(2).load(Ordering::Relaxed) + 1;
        self.word(2).store(v, Ordering::Relaxed);
        v
    }

    /// The loader found `key`'s file with `size` bytes, last changed at `used_ms`: the zone
    /// learns it unless it knows it already. `true`: it was new to the zone.
    pub fn found(&self, key: u128, size: u64, used_ms: u64) -> bool {
        let _g = crate::limits::lock(self.word(0));
        let Some(w) = self.slot(key, true) else {
            return false;
        };
        if self.get(w, 4) & FLAG_EXISTS != 0 {
            return false;
        }
        let total = self.word(1).load(Ordering::Relaxed);
        self.word(1).store(total + size, Ordering::Relaxed);
        self.set(w, 4, self.get(w, 4) | FLAG_EXISTS);
        self.set(w, 6, size);
        self.set(w, 3, used_ms);
        self.set(w, 8, self.next_version());
        true
    }

    /// `key`'s file is gone (removed by the manager, or found missing).
    pub fn removed(&self, key: u128) {
        let _g = crate::limits::lock(self.word(0));
        if let Some(w) = self.slot(key, false) {
            if self.get(w, 5) == 0 {
                self.forget(w);
            } else {
                let size = self.get(w, 6);
                let total = self.word(1).load(Ordering::Relaxed);
                self.word(1)
                    .store(total.saturating_sub(size), Ordering::Relaxed);
                self.set(w, 6, 0);
                self.set(w, 8, 0);
                self.set(w, 4, self.get(w, 4) & !FLAG_EXISTS);
            }
        }
    }

    /// Bytes of the files the zone knows.
    pub fn bytes(&self) -> u64 {
        self.word(1).load(Ordering::Relaxed)
    }

    /// Every entry whose file exists: its key, last use ([`unix_ms`]) and size.
    pub fn snapshot(&self) -> Vec<(u128, u64, u64)> {
        let mut v = Vec::new();
        self.each(|key, used, size| v.push((key, used, size)));
        v
    }

    /// Calls `f` with the key, last use and size of every entry whose file exists. Without
    /// the lock: a walk of a large zone must not stall the workers' lookups, so an entry may
    /// be read as it changes; what is done with it is checked again under the lock
    /// ([`Zone::evict`]).
    pub fn each(&self, mut f: impl FnMut(u128, u64, u64)) {
        for i in 0..self.entries() {
            let w = HEADER_WORDS + i * ENTRY_WORDS;
            if self.get(w, 4) & FLAG_EXISTS != 0 {
                let key = (u128::from(self.get(w, 0)) << 64) | u128::from(self.get(w, 7));
                f(key, self.get(w, 3), self.get(w, 6));
            }
        }
    }

    /// The manager removes `key`'s entry, last used at `used_ms` when it looked: only if it
    /// was not used since and nobody updates it. `true`: gone from the zone (the caller
    /// removes the file).
    pub fn evict(&self, key: u128, used_ms: u64) -> bool {
        let _g = crate::limits::lock(self.word(0));
        let Some(w) = self.slot(key, false) else {
            return false;
        };
        if self.get(w, 4) & FLAG_EXISTS == 0 || self.get(w, 3) != used_ms || self.get(w, 5) != 0 {
            return false;
        }
        self.forget(w);
        true
    }
}

/// The zones mapped so far in this process, by name and size. The master maps them before
/// it forks; a worker finds its configuration's zones here (the map is copied by `fork`, the
/// memory it points to is shared).
fn mapped() -> &'static std::sync::Mutex<std::collections::HashMap<(String, usize), Zone>> {
    static M: std::sync::OnceLock<
        std::sync::Mutex<std::collections::HashMap<(String, usize), Zone>>,
    > = std::sync::OnceLock::new();
    M.get_or_init(Default::default)
}

/// Maps every keys zone of `cfg` not mapped yet (a reload keeps a zone whose name and size
/// stay, and with it what the cache knows).
pub fn map_zones(cfg: &shard_config::Config) -> Result<(), String> {
    let Some(http) = cfg.http.as_ref() else {
        return Ok(());
    };
    let mut m = mapped().lock().unwrap_or_else(|e| e.into_inner());
    for c in &http.cache_paths {
        let k = (c.name.clone(), c.zone_size);
        if let std::collections::hash_map::Entry::Vacant(v) = m.entry(k) {
            let z = Zone::create(c.zone_size)
                .map_err(|e| format!("mmap(MAP_ANON|MAP_SHARED, {}) failed ({e})", c.zone_size))?;
            v.insert(z);
        }
    }
    Ok(())
}

/// The zones of `cfg`'s `proxy_cache_path`s, in order (mapped by [`map_zones`]; one this
/// process lacks is made here, unshared, so a worker never runs without one).
pub fn zones_of(cfg: &shard_config::Config) -> Vec<Zone> {
    let Some(http) = cfg.http.as_ref() else {
        return Vec::new();
    };
    let mut m = mapped().lock().unwrap_or_else(|e| e.into_inner());
    http.cache_paths
        .iter()
        .filter_map(|c| {
            let k = (c.name.clone(), c.zone_size);
            if let Some(z) = m.get(&k) {
                return Some(*z);
            }
            let z = Zone::create(c.zone_size).ok()?;
            m.insert(k, z);
            Some(z)
        })
        .collect()
}

fn pid_alive(pid: u64) -> bool {
    if pid == 0 {
        return false;
    }
    // SAFETY: kill(2) with signal 0 only checks that the pid exists.
    let r = unsafe { libc::kill(pid as libc::pid_t, 0) };
    r == 0 || io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

/// The wall clock in milliseconds: when an entry was last used (compared across processes
/// and with files' modification times).
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The MD5 of a cache key, as nginx names entry files by.
pub fn key_md5(key: &[u8]) -> [u8; 16] {
    Md5::digest(key).into()
}

/// The zone's key for an MD5 (and back: [`Zone::snapshot`] gives the MD5s it holds).
pub fn zone_key(md5: &[u8; 16]) -> u128 {
    u128::from_be_bytes(*md5)
}

/// The hash of a `Vary` variant: the main entry's MD5 and the request's values of the
/// fields `Vary` names (nginx 1.7.7's secondary keys).
pub fn variant_md5(main: &[u8; 16], fields: &[(&str, Option<&[u8]>)]) -> [u8; 16] {
    let mut h = Md5::new();
    h.update(main);
    for (name, value) in fields {
        h.update(name.to_ascii_lowercase().as_bytes());
        h.update(b":");
        h.update(value.unwrap_or(b""));
        h.update(b"\r\n");
    }
    h.finalize().into()
}

/// Lowercase hex of an MD5.
pub fn hex(md5: &[u8; 16]) -> String {
    let mut s = String::with_capacity(32);
    for b in md5 {
        s.push(char::from(b"0123456789abcdef"[usize::from(b >> 4)]));
        s.push(char::from(b"0123456789abcdef"[usize::from(b & 15)]));
    }
    s
}

/// An entry's file, as nginx places it: `levels=1:2` takes the last hex digit, then the two
/// before it, as directories (`/cache/c/29/b7f54b2df7773722d382f4809d65029c`).
pub fn entry_path(dir: &Path, levels: &[u8], md5: &[u8; 16]) -> PathBuf {
    use std::os::unix::ffi::{OsStrExt, OsStringExt};
    let name = hex(md5);
    let d = dir.as_os_str().as_bytes();
    let mut p = Vec::with_capacity(d.len() + 8 + name.len());
    p.extend_from_slice(d);
    let mut end = name.len();
    for &l in levels {
        let l = usize::from(l);
        p.push(b'/');
        p.extend_from_slice(&name.as_bytes()[end - l..end]);
        end -= l;
    }
    p.push(b'/');
    p.extend_from_slice(name.as_bytes());
    PathBuf::from(std::ffi::OsString::from_vec(p))
}

/// The fixed header of an entry file.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Header {
    /// Fresh until (unix seconds).
    pub valid_until: u64,
    /// When the response was stored (unix seconds).
    pub stored_at: u64,
    pub body_len: u64,
    pub key_len: u32,
    pub head_len: u32,
    /// The variant this entry holds (all-zero: the response had no `Vary`).
    pub variant: [u8; 16],
    /// `Cache-Control: stale-while-revalidate=N` and `stale-if-error=N`: seconds after
    /// `valid_until` the entry may still answer while it is updated, or for an error.
    pub updating_secs: u32,
    pub error_secs: u32,
    /// An error `proxy_intercept_errors` took: the entry answers with this status (its
    /// `error_page`), as nginx's cached error (0: a response).
    pub error_status: u16,
}

impl Header {
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[..8].copy_from_slice(MAGIC);
        b[8..16].copy_from_slice(&self.valid_until.to_le_bytes());
        b[16..24].copy_from_slice(&self.stored_at.to_le_bytes());
        b[24..32].copy_from_slice(&self.body_len.to_le_bytes());
        b[32..36].copy_from_slice(&self.key_len.to_le_bytes());
        b[36..40].copy_from_slice(&self.head_len.to_le_bytes());
        b[40..56].copy_from_slice(&self.variant);
        b[56..60].copy_from_slice(&self.updating_secs.to_le_bytes());
        b[60..64].copy_from_slice(&self.error_secs.to_le_bytes());
        b[64..66].copy_from_slice(&self.error_status.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Option<Header> {
        if b.len() < HEADER_LEN || &b[..8] != MAGIC {
            return None;
        }
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        Some(Header {
            valid_until: u64_at(8),
            stored_at: u64_at(16),
            body_len: u64_at(24),
            key_len: u32_at(32),
            head_len: u32_at(36),
            variant: b[40..56].try_into().expect("16 bytes"),
            updating_secs: u32_at(56),
            error_secs: u32_at(60),
            error_status: u16::from_le_bytes([b[64], b[65]]),
        })
    }

    /// Where the body starts in the file.
    pub fn body_start(&self) -> u64 {
        HEADER_LEN as u64 + u64::from(self.key_len) + u64::from(self.head_len)
    }
}

/// A stored entry opened for reading: its header, its response head, and the file.
pub struct Entry {
    pub file: File,
    pub header: Header,
    /// The upstream's status line and fields, ending with an empty line.
    pub head: Vec<u8>,
}

/// The largest stored head read back (a larger one is not an entry shard wrote).
pub const HEAD_MAX: u32 = 1 << 20;

/// Opens the entry at `path` for `key`: `Ok(None)` when there is none, or it is not a whole
/// entry of this key (another key with the same hash, a foreign file, a short file).
pub fn open(path: &Path, key: &[u8]) -> io::Result<Option<Entry>> {
    let file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    // One read takes the header, the key and the head of most entries; a short one is the
    // whole file, whose size is then known without an `fstat`.
    let mut buf = vec![0u8; OPEN_READ_BYTES];
    let n = loop {
        match file.read_at(&mut buf, 0) {
            Ok(n) => break n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    };
    let Some(header) = Header::decode(&buf[..n]) else {
        return Ok(None);
    };
    if header.head_len > HEAD_MAX || header.key_len as usize != key.len() {
        return Ok(None);
    }
    let size = if n < buf.len() {
        n as u64
    } else {
        file.metadata()?.len()
    };
    if size != header.body_start() + header.body_len {
        return Ok(None);
    }
    let key_at = HEADER_LEN;
    let head_at = key_at + key.len();
    let end = head_at + header.head_len as usize;
    if end > n {
        buf.resize(end, 0);
        file.read_exact_at(&mut buf[n..end], n as u64)?;
    }
    if &buf[key_at..head_at] != key {
        return Ok(None);
    }
    let head = buf[head_at..end].to_vec();
    Ok(Some(Entry { file, header, head }))
}

/// Bytes [`open`] reads at once from the start of an entry file.
const OPEN_READ_BYTES: usize = 4096;

/// The stored form of an upstream response head: as received, without the fields that
/// framed it on that connection (the entry's length frames it when served); a 200 gets
/// `Accept-Ranges: bytes`, as nginx's range filter gives a cached response.
pub fn stored_head(raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(raw.len() + 24);
    let ok_200 = raw.get(9..13) == Some(b"200 ") || raw.get(9..12) == Some(b"200");
    let mut ranges = false;
    let mut first = true;
    for line in raw.split_inclusive(|&b| b == b'\n') {
        let name = line
            .iter()
            .position(|&b| b == b':')
            .map(|i| &line[..i])
            .unwrap_or(b"");
        let framing = !first
            && [
                &b"transfer-encoding"[..],
                b"content-length",
                b"connection",
                b"keep-alive",
            ]
            .iter()
            .any(|f| name.eq_ignore_ascii_case(f));
        first = false;
        ranges |= name.eq_ignore_ascii_case(b"accept-ranges");
        if !framing {
            out.extend_from_slice(line);
        }
    }
    if ok_200 && !ranges && out.ends_with(b"\r\n\r\n") {
        let end = out.len() - 2;
        out.splice(end..end, b"Accept-Ranges: bytes\r\n".iter().copied());
    }
    out
}

/// A stored head made ready to parse as a response with a body of `body_len` bytes.
pub fn served_head(head: &[u8], body_len: u64) -> Vec<u8> {
    let mut v = Vec::with_capacity(head.len() + 32);
    served_head_into(&mut v, head, body_len);
    v
}

/// [`served_head`], appended to `out`.
pub fn served_head_into(out: &mut Vec<u8>, head: &[u8], body_len: u64) {
    // The blank line that ends the head goes (`\r\n`, or a CGI head's bare `\n`: its last
    // field keeps its own line end).
    let end = if head.ends_with(b"\r\n") {
        head.len() - 2
    } else {
        head.len().saturating_sub(1)
    };
    out.extend_from_slice(&head[..end]);
    out.extend_from_slice(b"Content-Length: ");
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    let mut n = body_len;
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[i..]);
    out.extend_from_slice(b"\r\n\r\n");
}

/// Why a response is or is not stored, and until when it is fresh.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Validity {
    /// Fresh until this time (unix seconds).
    Until(u64),
    /// Not to be cached (a header said so, or no `proxy_cache_valid` covers the status).
    No,
}

/// nginx's rules for how long a response is fresh: `X-Accel-Expires`, then
/// `Cache-Control` (`no-cache`, `no-store`, `private` refuse; `s-maxage`, then `max-age`),
/// then `Expires`, each unless `proxy_ignore_headers` names it; else the first
/// `proxy_cache_valid` for the status. `Set-Cookie` and `Vary: *` refuse.
pub fn validity(
    status: u16,
    headers: &[(String, Vec<u8>)],
    valid: &[shard_config::CacheValid],
    ignore: u16,
    now: u64,
) -> Validity {
    use shard_config::ignore as ig;
    fn field<'h>(
        headers: &'h [(String, Vec<u8>)],
        name: &'static str,
    ) -> impl Iterator<Item = &'h [u8]> {
        headers
            .iter()
            .filter(move |(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_slice())
    }
    let field = |name: &'static str| field(headers, name);
    // A 206 reaches the cache only where the request's `Range` was set on purpose
    // (`proxy_set_header Range $slice_range`): stored as `proxy_cache_valid` says, as nginx.
    if matches!(status, 100..=199) {
        return Validity::No;
    }
    if ignore & ig::SET_COOKIE == 0 && field("set-cookie").next().is_some() {
        return Validity::No;
    }
    if ignore & ig::VARY == 0 && field("vary").any(|v| v.trim_ascii() == b"*") {
        return Validity::No;
    }
    if ignore & ig::X_ACCEL_EXPIRES == 0 {
        if let Some(v) = field("x-accel-expires").next() {
            let v = String::from_utf8_lossy(v.trim_ascii()).into_owned();
            let (abs, digits) = match v.strip_prefix('@') {
                Some(d) => (true, d.to_string()),
                None => (false, v),
            };
            if let Ok(n) = digits.parse::<u64>() {
                if n == 0 && !abs {
                    return Validity::No;
                }
                // `@TIME` is taken as it is, even past (the entry is then stored expired,
                // as nginx does).
                return Validity::Until(if abs { n } else { now + n });
            }
        }
    }
    if ignore & ig::CACHE_CONTROL == 0 {
        let mut max_age = None;
        let mut s_maxage = None;
        for v in field("cache-control") {
            let v = String::from_utf8_lossy(v).to_ascii_lowercase();
            for d in v.split(',') {
                let d = d.trim();
                if d == "no-cache" || d == "no-store" || d == "private" {
                    return Validity::No;
                }
                if let Some(n) = d.strip_prefix("s-maxage=") {
                    s_maxage = n.trim_matches('"').parse::<u64>().ok().or(s_maxage);
                } else if let Some(n) = d.strip_prefix("max-age=") {
                    max_age = n.trim_matches('"').parse::<u64>().ok().or(max_age);
                }
            }
        }
        if let Some(n) = s_maxage.or(max_age) {
            return if n == 0 {
                Validity::No
            } else {
                Validity::Until(now + n)
            };
        }
    }
    if ignore & ig::EXPIRES == 0 {
        if let Some(v) = field("expires").next() {
            let t = std::str::from_utf8(v)
                .ok()
                .and_then(|s| httpdate::parse_http_date(s.trim()).ok())
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map(|d| d.as_secs());
            return match t {
                Some(t) if t > now => Validity::Until(t),
                _ => Validity::No,
            };
        }
    }
    match valid_for(valid, status) {
        Some(s) if s > 0 => Validity::Until(now + s),
        _ => Validity::No,
    }
}

/// `Cache-Control`'s `stale-while-revalidate=N` and `stale-if-error=N` (RFC 5861), unless
/// `proxy_ignore_headers Cache-Control`: kept whatever else set the entry's freshness.
pub fn stale_extensions(headers: &[(String, Vec<u8>)], ignore: u16) -> (u32, u32) {
    let (mut updating, mut error) = (0, 0);
    if ignore & shard_config::ignore::CACHE_CONTROL != 0 {
        return (0, 0);
    }
    for (n, v) in headers {
        if !n.eq_ignore_ascii_case("cache-control") {
            continue;
        }
        let v = String::from_utf8_lossy(v).to_ascii_lowercase();
        for d in v.split(',') {
            let d = d.trim();
            if let Some(x) = d.strip_prefix("stale-while-revalidate=") {
                updating = x.trim_matches('"').parse().unwrap_or(updating);
            } else if let Some(x) = d.strip_prefix("stale-if-error=") {
                error = x.trim_matches('"').parse().unwrap_or(error);
            }
        }
    }
    (updating, error)
}

/// nginx's not-modified filter for a response served from an entry, whose stored fields
/// `last_modified` and `etag` are these: `Some(304)`, `Some(412)`, or `None` (send it).
pub fn conditional(
    req: &shard_http::request::Request,
    last_modified: Option<&str>,
    etag: Option<&str>,
    ims_mode: shard_config::IfModifiedSince,
) -> Option<u16> {
    let time = |s: &str| httpdate::parse_http_date(s.trim()).ok();
    let lm = last_modified.and_then(time);
    let matches = |list: &str, weak: bool| {
        let Some(e) = etag else {
            return false;
        };
        let strip = |t: &str| t.trim().trim_start_matches("W/").to_string();
        list.split(',').any(|t| {
            let t = t.trim();
            t == "*"
                || if weak {
                    strip(t) == strip(e)
                } else {
                    !t.starts_with("W/") && !e.starts_with("W/") && t == e.trim()
                }
        })
    };
    if let Some(iums) = req.if_unmodified_since.as_deref() {
        match (time(iums), lm) {
            (Some(t), Some(l)) if l <= t => {}
            (None, _) => {}
            _ => return Some(412),
        }
    }
    if let Some(im) = req.if_match.as_deref() {
        if !matches(im, false) {
            return Some(412);
        }
    }
    let ims = req
        .if_modified_since
        .as_deref()
        .filter(|_| ims_mode != shard_config::IfModifiedSince::Off);
    let inm = req.if_none_match.as_deref();
    if ims.is_none() && inm.is_none() {
        return None;
    }
    if let Some(ims) = ims {
        let ok = match (time(ims), lm) {
            (Some(t), Some(l)) => match ims_mode {
                shard_config::IfModifiedSince::Before => l <= t,
                _ => l == t,
            },
            _ => false,
        };
        if !ok {
            return None;
        }
    }
    if let Some(inm) = inm {
        if !matches(inm, true) {
            return None;
        }
    }
    Some(304)
}

/// `proxy_cache_valid`: the first directive that names the status or says `any`.
pub fn valid_for(valid: &[shard_config::CacheValid], status: u16) -> Option<u64> {
    valid
        .iter()
        .find(|v| v.codes.is_empty() || v.codes.contains(&status))
        .map(|v| v.secs)
}

/// A temporary entry being written: removed unless [`Writer::commit`] renames it in place.
pub struct Writer {
    file: File,
    tmp: PathBuf,
    header: Header,
    written: u64,
    committed: bool,
}

impl Writer {
    /// Starts an entry in `dir` (a hidden temporary name, removed if the write fails).
    pub fn create(dir: &Path, key: &[u8], head: &[u8], mut header: Header) -> io::Result<Writer> {
        use std::sync::atomic::AtomicU32;
        static SERIAL: AtomicU32 = AtomicU32::new(0);
        let n = SERIAL.fetch_add(1, Ordering::Relaxed);
        let tmp = dir.join(format!(".shard-tmp-{}-{n}", std::process::id()));
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)?;
        header.key_len = key.len() as u32;
        header.head_len = head.len() as u32;
        let w = Writer {
            file,
            tmp,
            header,
            written: 0,
            committed: false,
        };
        let mut first = Vec::with_capacity(HEADER_LEN + key.len() + head.len());
        first.extend_from_slice(&w.header.encode());
        first.extend_from_slice(key);
        first.extend_from_slice(head);
        w.file.write_all_at(&first, 0)?;
        Ok(w)
    }

    /// Appends body bytes.
    pub fn write(&mut self, data: &[u8]) -> io::Result<()> {
        let at = self.header.body_start() + self.written;
        self.file.write_all_at(data, at)?;
        self.written += data.len() as u64;
        Ok(())
    }

    pub fn written(&self) -> u64 {
        self.written
    }

    /// The body is whole: the header gets its length and the file its name, `path`
    /// (directories made as needed). Returns the file's size.
    pub fn commit(mut self, path: &Path) -> io::Result<u64> {
        self.header.body_len = self.written;
        self.file.write_all_at(&self.header.encode(), 0)?;
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::rename(&self.tmp, path)?;
        self.committed = true;
        Ok(self.header.body_start() + self.written)
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        if !self.committed {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

/// A revalidated entry at `path` is fresh again until `until`: its header is rewritten in
/// place (a reader sees the old or the new time; both are whole).
pub fn refresh(path: &Path, header: &Header, until: u64, now: u64) -> io::Result<()> {
    let h = Header {
        valid_until: until,
        stored_at: now,
        ..header.clone()
    };
    let w = std::fs::OpenOptions::new().write(true).open(path)?;
    w.write_all_at(&h.encode(), 0)
}

/// One file of a cache directory, as the manager sees it.
#[derive(Debug)]
struct OnDisk {
    path: PathBuf,
    md5: [u8; 16],
    size: u64,
    /// Last use (unix ms): the zone's, else the file's modification time.
    used: u64,
}

/// How often the manager walks the cache directories themselves (the loader walks them at the
/// start), for entry files the zone does not know (dropped from a full zone); every pass
/// looks at the top of each directory, where writers put their temporary files. Between, a
/// pass works from the zone alone: a `stat` of every file each second cost a fourth of a CPU
/// at 100k entries.
const DISK_SCAN_SECS: u64 = 60;

/// How long a temporary file whose writer still lives may stay (a response that long is
/// still being written; one older is a leak).
const TEMP_MAX_AGE_SECS: u64 = 24 * 3600;

fn parse_md5(name: &str) -> Option<[u8; 16]> {
    if name.len() != 32 {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(name.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// Whether a file named `name` is a temporary file (`None`: it is not one) whose writer is
/// gone or that is older than any response takes.
fn temp_leaked(name: &str, mtime_ms: u64, now_ms: u64) -> Option<bool> {
    let rest = name.strip_prefix(".shard-tmp-")?;
    let pid = rest.split('-').next().and_then(|p| p.parse::<u64>().ok());
    Some(!pid.is_some_and(pid_alive) || now_ms.saturating_sub(mtime_ms) > TEMP_MAX_AGE_SECS * 1000)
}

/// The temporary files at the top of `dir` whose writer is gone (or that are older than any
/// response takes); nothing else there is looked at closer than its name.
fn leaked_temps(dir: &Path, now_ms: u64) -> Vec<PathBuf> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    rd.flatten()
        .filter(|e| e.file_name().as_encoded_bytes().starts_with(b".shard-tmp-"))
        .filter_map(|e| {
            let mtime = e.metadata().ok()?.modified().ok()?;
            let mtime = mtime
                .duration_since(std::time::UNIX_EPOCH)
                .ok()?
                .as_millis() as u64;
            let name = e.file_name().to_string_lossy().into_owned();
            temp_leaked(&name, mtime, now_ms)
                .unwrap_or(false)
                .then(|| e.path())
        })
        .collect()
}

/// Every entry file under `dir` (at most `levels.len()` directories deep), and the
/// temporary files whose writer is gone.
fn scan(dir: &Path, depth: usize, now_ms: u64) -> (Vec<OnDisk>, Vec<PathBuf>) {
    let mut files = Vec::new();
    let mut leaked = Vec::new();
    walk(dir, depth, now_ms, |f| files.push(f), |t| leaked.push(t));
    (files, leaked)
}

/// [`scan`] one file at a time: `file` gets each entry file (after its `stat`), `leak` each
/// temporary file whose writer is gone, as the walk finds them.
fn walk(
    dir: &Path,
    depth: usize,
    now_ms: u64,
    mut file: impl FnMut(OnDisk),
    mut leak: impl FnMut(PathBuf),
) {
    let mut stack = vec![(dir.to_path_buf(), 0)];
    while let Some((d, level)) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let Ok(meta) = e.metadata() else {
                continue;
            };
            let name = e.file_name().to_string_lossy().into_owned();
            let mtime = meta
                .modified()
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_millis() as u64);
            if meta.is_dir() {
                if level < depth {
                    stack.push((e.path(), level + 1));
                }
            } else if let Some(gone) = temp_leaked(&name, mtime, now_ms) {
                if gone {
                    leak(e.path());
                }
            } else if let Some(md5) = parse_md5(&name) {
                file(OnDisk {
                    path: e.path(),
                    md5,
                    size: meta.len(),
                    used: mtime,
                });
            }
        }
    }
}

/// Free bytes of the file system holding `dir` (for an unprivileged process).
fn free_bytes(dir: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: statvfs(3) fills the zeroed struct for a NUL-terminated path.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above; the result is checked.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    Some(st.f_bavail as u64 * st.f_frsize as u64)
}

/// One pass of the manager over cache `cp` at `now_ms` ([`unix_ms`]): what it removed (at
/// most `limit` files, and every leaked temporary file).
pub fn manage_pass(
    cp: &shard_config::CachePath,
    zone: &Zone,
    now_ms: u64,
    limit: usize,
    disk: bool,
) -> usize {
    if !disk {
        // Writers put their temporary files at the top of the directory: a cheap look.
        let leaked = leaked_temps(&cp.path, now_ms);
        for t in &leaked {
            let _ = std::fs::remove_file(t);
        }
        return manage_zone(cp, zone, now_ms, limit) + leaked.len();
    }
    let (mut files, leaked) = scan(&cp.path, cp.levels.len(), now_ms);
    for t in &leaked {
        let _ = std::fs::remove_file(t);
    }
    let known: std::collections::HashMap<u128, u64> = zone
        .snapshot()
        .into_iter()
        .map(|(k, used, _)| (k, used))
        .collect();
    for f in &mut files {
        if let Some(&u) = known.get(&zone_key(&f.md5)) {
            f.used = u;
        }
    }
    // Least recently used first.
    files.sort_by_key(|f| f.used);
    let mut total: u64 = files.iter().map(|f| f.size).sum();
    let mut free = (cp.min_free > 0).then(|| free_bytes(&cp.path)).flatten();
    let mut removed = 0;
    for f in &files {
        if removed >= limit {
            break;
        }
        let inactive = now_ms.saturating_sub(f.used) >= cp.inactive_secs * 1000;
        let over = cp.max_size > 0 && total > cp.max_size;
        let short = free.is_some_and(|b| b < cp.min_free);
        if !(inactive || over || short) {
            // Sorted by use: nothing after this one is older; only sizes could still call.
            if cp.max_size == 0 && free.is_none() {
                break;
            }
            continue;
        }
        if std::fs::remove_file(&f.path).is_ok() {
            zone.removed(zone_key(&f.md5));
            total = total.saturating_sub(f.size);
            if let Some(b) = free.as_mut() {
                *b += f.size;
            }
            removed += 1;
        }
    }
    removed + leaked.len()
}

/// The cache loader (its own process, as nginx's): indexes the entries on disk of every
/// cache of `cfg` in the zones, `loader_files` at a time and `loader_sleep` apart, then
/// returns how many it added. Requests do not wait for it (a miss in the zone looks on disk);
/// it gives the zone the sizes and ages the manager and `proxy_cache_min_uses` go by.
/// A pass of the manager from the zone alone: the entries unused for `inactive`, then the
/// least recently used while the zone's files exceed `max_size` or the file system has less
/// than `min_free`, at most `limit`. Costs a walk of the zone's memory when nothing is due.
fn manage_zone(cp: &shard_config::CachePath, zone: &Zone, now_ms: u64, limit: usize) -> usize {
    let inactive_ms = cp.inactive_secs * 1000;
    let mut total = zone.bytes();
    let mut free = (cp.min_free > 0).then(|| free_bytes(&cp.path)).flatten();
    let over = |total: u64| cp.max_size > 0 && total > cp.max_size;
    let short = |free: Option<u64>| free.is_some_and(|b| b < cp.min_free);
    let all = over(total) || short(free);
    let mut due = Vec::new();
    zone.each(|key, used, size| {
        if all || now_ms.saturating_sub(used) >= inactive_ms {
            due.push((used, key, size));
        }
    });
    // Least recently used first.
    due.sort_unstable();
    let mut removed = 0;
    for (used, key, size) in due {
        if removed >= limit {
            break;
        }
        if now_ms.saturating_sub(used) < inactive_ms && !over(total) && !short(free) {
            break;
        }
        if zone.evict(key, used) {
            let path = entry_path(&cp.path, &cp.levels, &key.to_be_bytes());
            let _ = std::fs::remove_file(path);
            total = total.saturating_sub(size);
            if let Some(b) = free.as_mut() {
                *b += size;
            }
            removed += 1;
        }
    }
    removed
}

pub fn load(cfg: &shard_config::Config) -> usize {
    let Some(http) = cfg.http.as_ref() else {
        return 0;
    };
    let zones = zones_of(cfg);
    let mut added = 0;
    for (cp, z) in http.cache_paths.iter().zip(&zones) {
        // Paced as nginx's loader: `loader_files` files (each a `stat`), then
        // `loader_sleep`, so that indexing a large cache after a start does not take the
        // CPU the workers serve its hits with.
        let batch = cp.loader_files.max(1) as usize;
        let mut seen = 0;
        walk(
            &cp.path,
            cp.levels.len(),
            unix_ms(),
            |f| {
                if seen > 0 && seen % batch == 0 {
                    std::thread::sleep(std::time::Duration::from_millis(cp.loader_sleep_ms));
                }
                seen += 1;
                if z.found(zone_key(&f.md5), f.size, f.used) {
                    added += 1;
                }
            },
            |_| {},
        );
    }
    added
}

/// The cache manager's loop (its own process, as nginx's): passes over every cache of `cfg`,
/// each removing at most `manager_files` files, `manager_sleep` apart while there is work,
/// a second apart when there was none. Returns when the master `master` is gone.
pub fn manage(cfg: &shard_config::Config, master: libc::pid_t) {
    let Some(http) = cfg.http.as_ref() else {
        return;
    };
    let zones = zones_of(cfg);
    // The loader walks the directories at the start: the manager's first walk comes later.
    let mut last_disk = std::time::Instant::now();
    loop {
        if shard_event::process::getppid() != master {
            return;
        }
        let now = unix_ms();
        let disk = last_disk.elapsed().as_secs() >= DISK_SCAN_SECS;
        if disk {
            last_disk = std::time::Instant::now();
        }
        let mut busy = false;
        let mut sleep_ms = 1000;
        for (cp, z) in http.cache_paths.iter().zip(&zones) {
            let limit = cp.manager_files.max(1) as usize;
            if manage_pass(cp, z, now, limit, disk) >= limit {
                busy = true;
                sleep_ms = sleep_ms.min(cp.manager_sleep_ms.max(1));
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(if busy {
            sleep_ms
        } else {
            1000
        }));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shard_config::CacheValid;

    fn h(list: &[(&str, &str)]) -> Vec<(String, Vec<u8>)> {
        list.iter()
            .map(|(n, v)| (n.to_string(), v.as_bytes().to_vec()))
            .collect()
    }

    #[test]
    fn paths_follow_nginx_levels() {
        let md5 = key_md5(b"http://127.0.0.1:8081/t.html");
        let name = hex(&md5);
        let p = entry_path(Path::new("/c"), &[1, 2], &md5);
        let want = format!("/c/{}/{}/{}", &name[31..], &name[29..31], name);
        assert_eq!(p, PathBuf::from(want));
        assert_eq!(
            entry_path(Path::new("/c"), &[], &md5),
            Path::new("/c").join(&name)
        );
    }

    #[test]
    fn validity_follows_nginx_order() {
        let valid = vec![
            CacheValid {
                codes: vec![200, 302],
                secs: 2,
            },
            CacheValid {
                codes: vec![],
                secs: 60,
            },
        ];
        let now = 1000;
        assert_eq!(validity(200, &[], &valid, 0, now), Validity::Until(1002));
        assert_eq!(validity(404, &[], &valid, 0, now), Validity::Until(1060));
        assert_eq!(validity(404, &[], &valid[..1], 0, now), Validity::No);
        let cc = h(&[("Cache-Control", "public, max-age=100")]);
        assert_eq!(validity(200, &cc, &valid, 0, now), Validity::Until(1100));
        let both = h(&[
            ("Cache-Control", "max-age=100, s-maxage=7"),
            ("X-Accel-Expires", "5"),
        ]);
        assert_eq!(validity(200, &both, &valid, 0, now), Validity::Until(1005));
        use shard_config::ignore as ig;
        assert_eq!(
            validity(200, &both, &valid, ig::X_ACCEL_EXPIRES, now),
            Validity::Until(1007)
        );
        assert_eq!(
            validity(200, &h(&[("Cache-Control", "no-cache")]), &valid, 0, now),
            Validity::No
        );
        assert_eq!(
            validity(200, &h(&[("Set-Cookie", "a=b")]), &valid, 0, now),
            Validity::No
        );
        assert_eq!(
            validity(
                200,
                &h(&[("Set-Cookie", "a=b")]),
                &valid,
                ig::SET_COOKIE,
                now
            ),
            Validity::Until(1002)
        );
        assert_eq!(
            validity(200, &h(&[("X-Accel-Expires", "@1500")]), &valid, 0, now),
            Validity::Until(1500)
        );
        assert_eq!(
            validity(200, &h(&[("X-Accel-Expires", "0")]), &valid, 0, now),
            Validity::No
        );
        assert_eq!(
            validity(200, &h(&[("X-Accel-Expires", "@1")]), &valid, 0, now),
            Validity::Until(1),
            "stored expired, as nginx"
        );
        let ext = h(&[(
            "Cache-Control",
            "max-age=1, stale-while-revalidate=5, stale-if-error=7",
        )]);
        assert_eq!(stale_extensions(&ext, 0), (5, 7));
        assert_eq!(stale_extensions(&ext, ig::CACHE_CONTROL), (0, 0));
        let past = h(&[("Expires", "Thu, 01 Jan 1970 00:00:01 GMT")]);
        assert_eq!(validity(200, &past, &valid, 0, now), Validity::No);
        assert_eq!(
            validity(200, &h(&[("Vary", "*")]), &valid, 0, now),
            Validity::No
        );
        let only_200 = [CacheValid {
            codes: vec![200],
            secs: 2,
        }];
        assert_eq!(validity(206, &[], &only_200, 0, now), Validity::No);
        let with_206 = [CacheValid {
            codes: vec![200, 206],
            secs: 2,
        }];
        assert_eq!(
            validity(206, &[], &with_206, 0, now),
            Validity::Until(now + 2),
            "a slice (proxy_cache_valid 200 206)"
        );
    }

    #[test]
    fn preconditions_are_judged_as_nginx_does_for_cached_responses() {
        use shard_config::IfModifiedSince as M;
        use shard_http::request::{parse, Limits, Parse};
        let req = |extra: &str| {
            let raw = format!("GET / HTTP/1.1\r\nHost: x\r\n{extra}\r\n");
            match parse(raw.as_bytes(), &Limits::default()) {
                Parse::Complete { req, .. } => req,
                other => panic!("{other:?}"),
            }
        };
        let lm = Some("Mon, 02 Jan 2006 15:04:05 GMT");
        let etag = Some("\"v1\"");
        let c = |extra: &str| conditional(&req(extra), lm, etag, M::Exact);
        assert_eq!(c(""), None);
        assert_eq!(
            c("If-Modified-Since: Mon, 02 Jan 2006 15:04:05 GMT\r\n"),
            Some(304)
        );
        assert_eq!(
            c("If-Modified-Since: Mon, 02 Jan 2006 15:04:06 GMT\r\n"),
            None
        );
        assert_eq!(c("If-None-Match: W/\"v1\"\r\n"), Some(304));
        assert_eq!(c("If-None-Match: \"v2\"\r\n"), None);
        assert_eq!(
            c("If-Unmodified-Since: Fri, 05 Jul 1985 14:30:52 GMT\r\n"),
            Some(412)
        );
        assert_eq!(c("If-Match: \"v2\"\r\n"), Some(412));
        assert_eq!(
            conditional(
                &req("If-Modified-Since: Mon, 02 Jan 2006 15:04:06 GMT\r\n"),
                lm,
                etag,
                M::Before
            ),
            Some(304)
        );
    }

    #[test]
    fn an_entry_is_whole_or_absent() {
        let dir = std::env::temp_dir().join(format!("shard-cache-unit-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let key = b"KEY";
        let md5 = key_md5(key);
        let path = entry_path(&dir, &[1, 2], &md5);
        let head = stored_head(
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\nX-A: b\r\n\r\n",
        );
        assert_eq!(
            head,
            b"HTTP/1.1 200 OK\r\nX-A: b\r\nAccept-Ranges: bytes\r\n\r\n"
        );
        let header = Header {
            valid_until: 99,
            ..Header::default()
        };
        {
            let mut w = Writer::create(&dir, key, &head, header.clone()).unwrap();
            w.write(b"hel").unwrap();
            // Dropped before its commit: nothing is left.
        }
        assert!(open(&path, key).unwrap().is_none());
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
        let mut w = Writer::create(&dir, key, &head, header).unwrap();
        w.write(b"hel").unwrap();
        w.write(b"lo").unwrap();
        let size = w.commit(&path).unwrap();
        let e = open(&path, key).unwrap().expect("stored");
        assert_eq!(size, e.file.metadata().unwrap().len());
        assert_eq!(e.head, head);
        assert_eq!(e.header.body_len, 5);
        assert_eq!(e.header.valid_until, 99);
        let mut body = vec![0; 5];
        e.file
            .read_exact_at(&mut body, e.header.body_start())
            .unwrap();
        assert_eq!(body, b"hello");
        assert!(open(&path, b"OTHER").unwrap().is_none(), "another key");
        refresh(&path, &e.header, 500, 400).unwrap();
        assert_eq!(open(&path, key).unwrap().unwrap().header.valid_until, 500);
        assert_eq!(
            served_head(&head, 5),
            b"HTTP/1.1 200 OK\r\nX-A: b\r\nAccept-Ranges: bytes\r\nContent-Length: 5\r\n\r\n"
        );
        // A FastCGI entry keeps its CGI head, lines ending in a bare `\n`.
        assert_eq!(
            served_head(b"Status: 206\nContent-Range: bytes 0-1/9\n\n", 2),
            b"Status: 206\nContent-Range: bytes 0-1/9\nContent-Length: 2\r\n\r\n"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_manager_removes_inactive_then_least_recently_used() {
        let dir = std::env::temp_dir().join(format!("shard-cache-mgr-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let z = Zone::create(8192).unwrap();
        let mut cp = shard_config::CachePath {
            name: "t".into(),
            zone_size: 8192,
            path: dir.clone(),
            levels: vec![1, 2],
            inactive_secs: 600,
            max_size: 0,
            min_free: 0,
            use_temp_path: true,
            manager_files: 100,
            manager_sleep_ms: 50,
            manager_threshold_ms: 200,
            loader_files: 100,
            loader_sleep_ms: 50,
            loader_threshold_ms: 200,
            place: shard_config::Place {
                file: "t".into(),
                line: 1,
            },
        };
        let now = unix_ms();
        let mut paths = Vec::new();
        for (i, k) in [&b"a"[..], b"b", b"c"].iter().enumerate() {
            let md5 = key_md5(k);
            let p = entry_path(&dir, &cp.levels, &md5);
            let w = Writer::create(&dir, k, b"HTTP/1.1 200 OK\r\n\r\n", Header::default()).unwrap();
            let size = w.commit(&p).unwrap();
            // Used one after the other: a, then b, then c.
            z.stored(zone_key(&md5), size, now - 30_000 + i as u64 * 10_000);
            paths.push((p, size));
        }
        // A writer that died left a temporary file.
        std::fs::write(dir.join(".shard-tmp-999999999-0"), b"x").unwrap();
        assert_eq!(manage_pass(&cp, &z, now, 100, false), 1, "only the leak");
        assert!(paths.iter().all(|(p, _)| p.exists()));
        // Over max_size by one file: the least recently used goes (by the zone alone).
        cp.max_size = paths[1].1 + paths[2].1;
        assert_eq!(manage_pass(&cp, &z, now, 100, false), 1);
        assert!(!paths[0].0.exists() && paths[1].0.exists() && paths[2].0.exists());
        assert_eq!(z.snapshot().len(), 2);
        // An entry used since the manager looked is not evicted for that look.
        let kb = zone_key(&key_md5(b"b"));
        let (_, used_b, _) = z.snapshot().into_iter().find(|e| e.0 == kb).unwrap();
        z.look(kb, 1, used_b + 1, 0);
        assert!(!z.evict(kb, used_b));
        z.stored(kb, paths[1].1, used_b);
        // Unused for longer than `inactive`: gone.
        cp.max_size = 0;
        cp.inactive_secs = 15;
        assert_eq!(manage_pass(&cp, &z, now, 100, false), 1);
        assert!(!paths[1].0.exists() && paths[2].0.exists());
        // A file the zone does not know (dropped from a full zone) goes at the next walk of
        // the directory, by its modification time.
        let zc = zone_key(&key_md5(b"c"));
        let (_, used_c, _) = z.snapshot().into_iter().find(|e| e.0 == zc).unwrap();
        assert!(z.evict(zc, used_c));
        cp.inactive_secs = 0;
        assert_eq!(manage_pass(&cp, &z, now + 1000, 100, false), 0);
        assert!(paths[2].0.exists());
        assert_eq!(manage_pass(&cp, &z, now + 1000, 100, true), 1);
        assert!(!paths[2].0.exists());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_zone_counts_uses_and_one_update_at_a_time() {
        let z = Zone::create(8192).unwrap();
        let k = zone_key(&key_md5(b"a"));
        let s = z.look(k, 1000, 1, 5000);
        assert_eq!((s.exists, s.uses, s.updating), (false, 1, false));
        let (me, other) = (owner(1), owner(2));
        assert!(z.try_update(k, 1000, 5000, me));
        assert!(z.look(k, 1050, 1, 5000).updating);
        assert!(!z.try_update(k, 1050, 5000, other), "one request at a time");
        assert!(z.try_update(k, 7000, 5000, other), "past the lock age");
        z.end_update(k, me);
        assert!(z.look(k, 7001, 7, 5000).updating, "not mine to end");
        z.end_update(k, other);
        assert!(z.try_update(k, 7002, 5000, me));
        assert_eq!(z.look(k, 7100, 7, 5000).uses, 4);
        z.stored(k, 300, 1);
        z.end_update(k, me);
        assert!(z.look(k, 1300, 1, 5000).exists);
        assert_eq!(z.bytes(), 300);
        assert_eq!(z.snapshot().len(), 1);
        assert!(!z.found(k, 999, 1), "known already");
        z.removed(k);
        assert_eq!(z.bytes(), 0);
        assert!(z.found(k, 50, 1));
        assert_eq!(z.bytes(), 50);
        z.removed(k);
        assert!(!z.look(k, 1400, 1, 5000).exists);
    }

    #[test]
    fn another_process_update_is_seen_until_the_lock_age() {
        let z = Zone::create(8192).unwrap();
        let k = zone_key(&key_md5(b"b"));
        // SAFETY: the child only touches the shared zone, then waits to be killed.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            let ok = z.try_update(k, 1000, 5000, owner(1));
            unsafe { libc::_exit(if ok { 0 } else { 1 }) };
        }
        let mut st = 0;
        // SAFETY: waiting for our own child.
        unsafe { libc::waitpid(pid, &mut st, 0) };
        assert_eq!(libc::WEXITSTATUS(st), 0);
        // The child is gone: its update no longer holds.
        assert!(!z.look(k, 1001, 1, 5000).updating);
        assert!(z.try_update(k, 1001, 5000, owner(1)));
    }
}
