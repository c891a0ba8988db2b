//! `open_file_cache`: the descriptors and metadata of files a worker opened for static
//! responses, kept per worker and per location (nginx keeps one cache per configuration that
//! sets it), bounded by `max`, looked at again after `open_file_cache_valid`, dropped after
//! `inactive` without use.
//!
//! It owns when a path is opened again. It does not open (`respond::open_file` does) and it
//! does not decide anything about a response. A cached descriptor is shared (`Rc`) with the
//! responses that read from it, so an entry evicted or replaced while a large file is being
//! sent stays open until that response ends.
//!
//! Correctness across changes of the file: an entry older than `open_file_cache_valid` is
//! never used; the path is opened anew, so a file replaced by `rename` is the new file, a
//! deleted one is 404 (or its error is cached, with `open_file_cache_errors on`), and a
//! truncated one has its new size (the open descriptor of a file truncated in place sees the
//! new size at once; its `Content-Length` is that of the last `fstat`, and a response that
//! finds fewer bytes than it promised closes the connection, as without the cache).
//!
//! Where a location has no `open_file_cache` (nginx's default), [`Reuse`] keeps the
//! descriptors of the files last served, but never their metadata: every request still
//! `stat`s its path, and the held descriptor is used only when that `stat` shows the very file
//! it holds, unchanged in permissions (`FileId`). A request then costs one `stat` where it
//! cost `open`, `fstat` and `close`, and nothing a client or an operator sees changes: a file
//! replaced, truncated, deleted or made unreadable is seen at once, as nginx sees it.

use std::cell::{Cell, OnceCell};
// A fraction of SipHash's cost per lookup (one per static request), seeded per process. Not
// as flood-proof as SipHash: clients choose the keys (missing paths too, with
// `open_file_cache_errors on`), but every map here is bounded (`max`, `REUSE_MAX`), so the
// worst a chosen set of colliding paths costs is a probe among that many.
use foldhash::HashMap;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::rc::Rc;

use shard_config::OpenFileCache;
use shard_event::fs::{FileId, Mapping, Stat};
use shard_http::static_file::FileMeta;

/// Descriptors [`Reuse`] holds at most, per worker.
pub(super) const REUSE_MAX: usize = 64;

/// A held descriptor unused this long is closed, so that a deleted file's space or a file
/// system that is to be unmounted is not held for longer.
pub(super) const REUSE_INACTIVE_MS: u64 = 5_000;

/// Files up to this size are mapped once kept (by `open_file_cache` or [`Reuse`]) and sent
/// from the mapping with `sendfile` off: one copy, page cache to socket, instead of `pread`
/// and `write`. Larger ones are read in chunks, so that a worker's mappings (which count in
/// its resident size while their pages are in the page tables) stay small.
pub(super) const MAP_FILE_MAX_BYTES: u64 = 8 * 1024 * 1024;

/// An open file that responses read from, shared (`Rc`) by them, a location's
/// `open_file_cache` and [`Reuse`]; and its mapping, made the first time a kept file's body
/// is sent (a file opened for one response is not worth mapping).
pub(super) struct OpenFile {
    fd: std::fs::File,
    /// A cache or [`Reuse`] keeps it.
    kept: Cell<bool>,
    /// It was found kept by a later request: a file asked for again is worth mapping, one
    /// asked for once is not (`mmap`, faults and `munmap` cost more than one `pread`).
    reused: Cell<bool>,
    map: OnceCell<Option<Mapping>>,
    /// Never written while open (a `proxy_cache` entry: renamed into place whole, its size
    /// fixed): sent from its mapping with no `stat` of its size.
    sealed: Cell<bool>,
    /// The request (the worker's `request_seq`) for which a `stat` last gave its size: that
    /// request's response, sent from the mapping at once, needs no other look at it (see
    /// `conn.rs`'s `flush`).
    size_checked_for: Cell<u64>,
}

pub(super) type FileRef = Rc<OpenFile>;

/// Files a worker keeps mapped at most. A large `open_file_cache max=` must not bring the
/// worker near the kernel's `vm.max_map_count` (65530 by default), where `malloc` itself
/// would fail; past this, kept files are read with `pread`.
pub(super) const MAPPINGS_MAX: usize = 4096;

/// Bytes of files a worker keeps mapped at most. The pages a mapping was sent from stay in
/// the worker's page tables and count in its resident size (and in what the OOM killer
/// weighs); past this, kept files are read with `pread`.
pub(super) const MAPPED_BYTES_MAX: u64 = 256 * 1024 * 1024;

thread_local! {
    /// The mappings alive in this worker (its one thread), and their bytes.
    static MAPPINGS: Cell<usize> = const { Cell::new(0) };
    static MAPPED_BYTES: Cell<u64> = const { Cell::new(0) };
}

impl Drop for OpenFile {
    fn drop(&mut self) {
        if let Some(m) = self.mapped() {
            MAPPINGS.set(MAPPINGS.get().saturating_sub(1));
            MAPPED_BYTES.set(MAPPED_BYTES.get().saturating_sub(m.len() as u64));
        }
    }
}

impl OpenFile {
    pub(super) fn new(fd: OwnedFd) -> FileRef {
        Rc::new(OpenFile {
            fd: fd.into(),
            kept: Cell::new(false),
            reused: Cell::new(false),
            map: OnceCell::new(),
            sealed: Cell::new(false),
            size_checked_for: Cell::new(0),
        })
    }

    /// A `stat` of the path or the descriptor gave the size that `request`'s response uses.
    pub(super) fn size_checked(&self, request: u64) {
        self.size_checked_for.set(request);
    }

    pub(super) fn size_checked_for(&self) -> u64 {
        self.size_checked_for.get()
    }

    /// The mapping of the file's first `size` bytes (its size when first asked), when the file
    /// is kept, not empty and at most [`MAP_FILE_MAX_BYTES`], and `mmap` succeeded.
    pub(super) fn mapping(&self, size: u64) -> Option<&Mapping> {
        if let Some(m) = self.map.get() {
            return m.as_ref();
        }
        if !self.kept.get()
            || !self.reused.get()
            || size == 0
            || size > MAP_FILE_MAX_BYTES
            || MAPPINGS.get() >= MAPPINGS_MAX
            || MAPPED_BYTES.get() + size > MAPPED_BYTES_MAX
        {
            // Not now; perhaps at a later request (a mapping ended, the file was asked again).
            return None;
        }
        let m = Mapping::new(self.fd.as_raw_fd(), size as usize).ok();
        if m.is_some() {
            MAPPINGS.set(MAPPINGS.get() + 1);
            MAPPED_BYTES.set(MAPPED_BYTES.get() + size);
        }
        self.map.get_or_init(|| m).as_ref()
    }

    /// The file will not change while open (see `sealed`).
    pub(super) fn seal(&self) {
        self.sealed.set(true);
    }

    pub(super) fn sealed(&self) -> bool {
        self.sealed.get()
    }

    /// Reads exactly `buf.len()` bytes at `offset` (`pread`).
    pub(super) fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        std::os::unix::fs::FileExt::read_exact_at(&self.fd, buf, offset)
    }

    /// Reads at most `buf.len()` bytes at `offset` (`pread`).
    pub(super) fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
        std::os::unix::fs::FileExt::read_at(&self.fd, buf, offset)
    }

    /// The mapping [`OpenFile::mapping`] made, if any.
    pub(super) fn mapped(&self) -> Option<&Mapping> {
        self.map.get().and_then(Option::as_ref)
    }
}

impl AsRawFd for OpenFile {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// What opening a path gave.
#[derive(Clone)]
pub(super) enum Opened {
    File(FileRef, FileMeta),
    Missing,
    Forbidden,
}

enum State {
    Open(FileRef, FileMeta),
    /// A lookup error, kept with `open_file_cache_errors on`.
    Error(Opened),
    /// Used fewer than `open_file_cache_min_uses` times: counted, no descriptor kept.
    Counted,
}

struct Entry {
    state: State,
    uses: u32,
    /// When the path was last opened: the entry is used until `valid` after it.
    opened_ms: u64,
    used_ms: u64,
}

/// One location's cache.
pub(super) struct FileCache {
    max: usize,
    map: HashMap<Box<[u8]>, Entry>,
}

impl FileCache {
    pub(super) fn new(max: usize) -> FileCache {
        FileCache {
            max,
            map: HashMap::default(),
        }
    }

    pub(super) fn len(&self) -> usize {
        self.map.len()
    }

    /// A fresh entry's result, or `None`: not cached, too old, or not used often enough yet
    /// (the caller opens the path and calls [`FileCache::put`]).
    pub(super) fn get(&mut self, path: &Path, now_ms: u64, conf: &OpenFileCache) -> Option<Opened> {
        let e = self.map.get_mut(key(path))?;
        if now_ms.saturating_sub(e.opened_ms) >= conf.valid_ms {
            return None;
        }
        let hit = match &e.state {
            State::Open(fd, meta) => {
                fd.reused.set(true);
                Opened::File(fd.clone(), *meta)
            }
            State::Error(o) => o.clone(),
            State::Counted => return None,
        };
        e.uses = e.uses.saturating_add(1);
        e.used_ms = now_ms;
        Some(hit)
    }

    /// Records what opening `path` gave: a descriptor once the path was used
    /// `min_uses` times, an error with `errors on`; otherwise only the use is counted.
    pub(super) fn put(&mut self, path: &Path, opened: &Opened, now_ms: u64, conf: &OpenFileCache) {
        let uses = self
            .map
            .get(key(path))
            .map_or(0, |e| e.uses)
            .saturating_add(1);
        let state = match opened {
            Opened::File(fd, meta) if uses >= conf.min_uses => {
                fd.kept.set(true);
                State::Open(fd.clone(), *meta)
            }
            Opened::File(..) => State::Counted,
            err if conf.errors => State::Error(err.clone()),
            _ => State::Counted,
        };
        if !self.map.contains_key(key(path)) && self.map.len() >= self.max {
            self.evict_least_recent();
        }
        if self.max == 0 {
            return;
        }
        self.map.insert(
            key(path).into(),
            Entry {
                state,
                uses,
                opened_ms: now_ms,
                used_ms: now_ms,
            },
        );
    }

    fn evict_least_recent(&mut self) {
        remove_least_recent(&mut self.map, |e| e.used_ms);
    }

    /// Drops the entries not used for `inactive_ms` (their uses start again from zero).
    pub(super) fn expire(&mut self, now_ms: u64, inactive_ms: u64) {
        self.map
            .retain(|_, e| now_ms.saturating_sub(e.used_ms) < inactive_ms);
    }
}

/// The file maps' key: a path's bytes. `Path`'s own hash walks its components, several times
/// the cost of hashing the bytes (once per static request); the paths come from
/// `static_file::map_path`, so two spellings of one path do not occur.
fn key(path: &Path) -> &[u8] {
    path.as_os_str().as_bytes()
}

/// Removes the entry of `map` whose `used_ms` is the oldest (the caches' eviction).
fn remove_least_recent<K: Clone + Eq + std::hash::Hash, V>(
    map: &mut HashMap<K, V>,
    used_ms: impl Fn(&V) -> u64,
) {
    if let Some(k) = map
        .iter()
        .min_by_key(|(_, v)| used_ms(v))
        .map(|(k, _)| k.clone())
    {
        map.remove(&k);
    }
}

/// `proxy_cache` entry files a worker keeps open at most ([`CacheMemo`]).
pub(super) const CACHE_MEMO_MAX: usize = 64;

/// A kept entry is opened again after this long, however used: an entry file an operator
/// removed or replaced by hand (the zone does not see that) is seen within this time.
pub(super) const CACHE_MEMO_VALID_MS: u64 = 1_000;

/// The `proxy_cache` entries a worker served last, kept open with their header and stored
/// head, so that a hit on one costs no `open`, `pread`, `fstat` or `close`, and its body
/// leaves from a mapping as a kept static file's. A kept entry is never trusted on its own:
/// it is used only while the keys zone gives its key the version it had before its file was
/// opened (`cache::Seen::version`); every store, refresh, find or removal of the key, by any
/// process, gives it another. Entry files are renamed into place whole and never written
/// again but for their fixed header (a refresh, which changes the version), so a kept one
/// never shrinks under its mapping. Entries with a `Vary` variant, or larger than
/// [`MAP_FILE_MAX_BYTES`], are not kept; one unused for [`REUSE_INACTIVE_MS`] is closed, so
/// that the space of a file the cache manager removed is not held for longer, and one kept
/// for [`CACHE_MEMO_VALID_MS`] is opened again, so that a file removed by hand (`rm`, as
/// operators purge nginx caches) stops being served as it would with nginx.
#[derive(Default)]
pub(super) struct CacheMemo {
    /// By keys zone (index into the worker's zones) and the zone's key.
    map: HashMap<(usize, u128), Memo>,
}

/// One kept entry.
pub(super) struct Memo {
    version: u64,
    pub(super) file: FileRef,
    pub(super) header: crate::cache::Header,
    key: Box<[u8]>,
    pub(super) head: Box<[u8]>,
    used_ms: u64,
    opened_ms: u64,
}

impl CacheMemo {
    /// The kept entry of `key` in `zone`, when the zone's `version` is the one it was kept
    /// with; a kept entry of another version or key is closed.
    pub(super) fn get(
        &mut self,
        zone: usize,
        zkey: u128,
        version: u64,
        key: &[u8],
        now_ms: u64,
    ) -> Option<&Memo> {
        if version == 0 {
            return None;
        }
        let m = self.map.get(&(zone, zkey))?;
        if m.version != version
            || *m.key != *key
            || now_ms.saturating_sub(m.opened_ms) >= CACHE_MEMO_VALID_MS
        {
            self.map.remove(&(zone, zkey));
            return None;
        }
        let m = self.map.get_mut(&(zone, zkey)).expect("found above");
        m.used_ms = now_ms;
        m.file.reused.set(true);
        Some(m)
    }

    /// Keeps an entry just opened, whose key had `version` in the zone before the open.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn put(
        &mut self,
        zone: usize,
        zkey: u128,
        version: u64,
        key: &[u8],
        file: &FileRef,
        header: &crate::cache::Header,
        head: &[u8],
        now_ms: u64,
    ) {
        let size = header.body_start() + header.body_len;
        if version == 0 || header.variant != [0; 16] || size > MAP_FILE_MAX_BYTES {
            self.map.remove(&(zone, zkey));
            return;
        }
        if !self.map.contains_key(&(zone, zkey)) && self.map.len() >= CACHE_MEMO_MAX {
            remove_least_recent(&mut self.map, |m| m.used_ms);
        }
        file.kept.set(true);
        self.map.insert(
            (zone, zkey),
            Memo {
                version,
                file: file.clone(),
                header: header.clone(),
                key: key.into(),
                head: head.into(),
                used_ms: now_ms,
                opened_ms: now_ms,
            },
        );
    }

    /// Closes every kept entry (the worker ran out of descriptors); whether any was.
    pub(super) fn clear(&mut self) -> bool {
        let any = !self.map.is_empty();
        self.map.clear();
        any
    }

    /// Closes the entries unused for [`REUSE_INACTIVE_MS`].
    pub(super) fn expire(&mut self, now_ms: u64) {
        self.map
            .retain(|_, m| now_ms.saturating_sub(m.used_ms) < REUSE_INACTIVE_MS);
    }
}

/// File systems whose `stat` sees every change at once, so that a held descriptor is kept
/// only there (`statfs` magic numbers): ext2/3/4, XFS, Btrfs, tmpfs, ramfs, overlayfs, F2FS,
/// ZFS, bcachefs, SquashFS, EROFS, ISO 9660. A network or FUSE file system answers `stat` from
/// a cache for seconds, where `open` asks the server: another host's rename would not be seen.
const LOCAL_FILE_SYSTEMS: [i64; 12] = [
    0xEF53,
    0x5846_5342,
    0x9123_683E,
    0x0102_1994,
    0x8584_58f6,
    0x794c_7630,
    0xF2F5_2010,
    0x2fc1_2fc1,
    0xca45_1a4e,
    0x7371_7368,
    0xE0F5_E1E2,
    0x9660,
];

/// Descriptors of regular files kept open between requests of a location without
/// `open_file_cache` (see the module's documentation), keyed by path.
#[derive(Default)]
pub(super) struct Reuse {
    map: HashMap<Box<[u8]>, Kept>,
    /// Per device: whether its file system is one of [`LOCAL_FILE_SYSTEMS`].
    local: HashMap<u64, bool>,
}

struct Kept {
    fd: FileRef,
    id: FileId,
    used_ms: u64,
}

impl Reuse {
    /// Whether a descriptor of `path` is held.
    #[cfg(test)]
    fn holds(&self, path: &Path) -> bool {
        self.map.contains_key(key(path))
    }

    /// The held descriptor of `path` with what `stat` (called only when one is held) says of
    /// the path now, when that is the file it holds; a held descriptor of another file, or of
    /// a path `stat` no longer finds, is closed.
    pub(super) fn get(
        &mut self,
        path: &Path,
        now_ms: u64,
        stat: impl FnOnce() -> Option<Stat>,
    ) -> Option<(FileRef, Stat)> {
        let held = self.map.get_mut(key(path))?;
        match stat() {
            Some(st) if st.id == held.id => {
                held.used_ms = now_ms;
                held.fd.reused.set(true);
                Some((held.fd.clone(), st))
            }
            _ => {
                self.map.remove(key(path));
                None
            }
        }
    }

    /// Keeps `fd`, just opened at `path` and found to be `id`, when it lies on a local file
    /// system; the least recently used descriptor is closed when [`REUSE_MAX`] are held.
    pub(super) fn put(&mut self, path: &Path, fd: &FileRef, id: FileId, now_ms: u64) {
        let local = *self.local.entry(id.dev).or_insert_with(|| {
            shard_event::fs::fs_type(fd.as_raw_fd()).is_ok_and(|t| LOCAL_FILE_SYSTEMS.contains(&t))
        });
        if !local {
            return;
        }
        fd.kept.set(true);
        if !self.map.contains_key(key(path)) && self.map.len() >= REUSE_MAX {
            remove_least_recent(&mut self.map, |h| h.used_ms);
        }
        self.map.insert(
            key(path).into(),
            Kept {
                fd: fd.clone(),
                id,
                used_ms: now_ms,
            },
        );
    }

    /// Closes every held descriptor (the worker ran out of descriptors); whether any was.
    pub(super) fn clear(&mut self) -> bool {
        let any = !self.map.is_empty();
        self.map.clear();
        any
    }

    /// Closes the descriptors unused for [`REUSE_INACTIVE_MS`].
    pub(super) fn expire(&mut self, now_ms: u64) {
        self.map
            .retain(|_, h| now_ms.saturating_sub(h.used_ms) < REUSE_INACTIVE_MS);
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.map.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conf(max: usize, min_uses: u32, errors: bool) -> OpenFileCache {
        OpenFileCache {
            max: Some(max),
            inactive_ms: 1000,
            valid_ms: 100,
            min_uses,
            errors,
        }
    }

    fn file() -> Opened {
        let fd: OwnedFd = std::fs::File::open("/dev/null").unwrap().into();
        Opened::File(
            OpenFile::new(fd),
            FileMeta {
                size: 1,
                mtime_secs: 0,
                is_dir: false,
                is_file: true,
            },
        )
    }

    #[test]
    fn an_entry_is_used_until_valid_passes_then_opened_again() {
        let c = conf(4, 1, false);
        let mut fc = FileCache::new(4);
        let p = Path::new("/a");
        assert!(fc.get(p, 0, &c).is_none());
        fc.put(p, &file(), 0, &c);
        assert!(matches!(fc.get(p, 99, &c), Some(Opened::File(..))));
        assert!(fc.get(p, 100, &c).is_none());
    }

    #[test]
    fn min_uses_and_errors_decide_what_is_kept() {
        let c = conf(4, 2, false);
        let mut fc = FileCache::new(4);
        let p = Path::new("/a");
        fc.put(p, &file(), 0, &c);
        assert!(fc.get(p, 1, &c).is_none(), "one use is not enough");
        fc.put(p, &file(), 1, &c);
        assert!(matches!(fc.get(p, 2, &c), Some(Opened::File(..))));
        // Errors: kept only with `errors on`.
        let q = Path::new("/missing");
        fc.put(q, &Opened::Missing, 0, &c);
        assert!(fc.get(q, 1, &c).is_none());
        let e = conf(4, 1, true);
        fc.put(q, &Opened::Missing, 0, &e);
        assert!(matches!(fc.get(q, 1, &e), Some(Opened::Missing)));
    }

    #[test]
    fn never_more_than_max_entries_least_recent_out_first() {
        let c = conf(3, 1, false);
        let mut fc = FileCache::new(3);
        for (i, p) in ["/a", "/b", "/c"].iter().enumerate() {
            fc.put(Path::new(p), &file(), i as u64, &c);
        }
        assert!(fc.get(Path::new("/a"), 10, &c).is_some());
        fc.put(Path::new("/d"), &file(), 11, &c);
        assert_eq!(fc.len(), 3);
        assert!(
            fc.get(Path::new("/b"), 12, &c).is_none(),
            "/b was the least recent"
        );
        assert!(fc.get(Path::new("/a"), 12, &c).is_some());
        fc.expire(2000, 1000);
        assert_eq!(fc.len(), 0);
    }

    fn id(ino: u64) -> FileId {
        FileId {
            dev: 1,
            ino,
            mode: 0o100644,
            uid: 0,
            gid: 0,
            ctime: (0, 0),
        }
    }

    fn stat(id: FileId) -> Stat {
        Stat {
            size: 1,
            mtime_secs: 0,
            is_dir: false,
            is_file: true,
            id,
        }
    }

    fn fd() -> FileRef {
        OpenFile::new(std::fs::File::open("/dev/null").unwrap().into())
    }

    /// A `Reuse` that takes the test's device 1 for a local file system (whatever holds
    /// /dev/null here).
    fn reuse() -> Reuse {
        let mut r = Reuse::default();
        r.local.insert(1, true);
        r
    }

    #[test]
    fn a_held_descriptor_is_used_only_for_the_same_unchanged_file() {
        let mut r = reuse();
        let p = Path::new("/a");
        assert!(!r.holds(p));
        r.put(p, &fd(), id(7), 0);
        assert!(r.get(p, 1, || Some(stat(id(7)))).is_some());
        let mut chmod = id(7);
        chmod.mode = 0o100600;
        assert!(
            r.get(p, 2, || Some(stat(chmod))).is_none(),
            "permissions changed"
        );
        assert!(!r.holds(p), "the stale descriptor is closed");
        r.put(p, &fd(), id(7), 3);
        assert!(
            r.get(p, 4, || Some(stat(id(8)))).is_none(),
            "another file at the path"
        );
        assert!(!r.holds(p));
        r.put(p, &fd(), id(7), 5);
        assert!(r.get(p, 6, || None).is_none(), "the path is gone");
        assert!(!r.holds(p));
        let mut called = false;
        assert!(r
            .get(Path::new("/b"), 7, || {
                called = true;
                None
            })
            .is_none());
        assert!(!called, "no stat for a path nothing is held for");
    }

    #[test]
    fn reuse_holds_at_most_its_max_and_closes_what_is_unused() {
        let mut r = reuse();
        for i in 0..REUSE_MAX as u64 + 10 {
            r.put(&std::path::PathBuf::from(format!("/f{i}")), &fd(), id(i), i);
        }
        assert_eq!(r.len(), REUSE_MAX);
        assert!(!r.holds(Path::new("/f0")), "the least recent went first");
        let last = REUSE_MAX as u64 + 9;
        r.expire(last + REUSE_INACTIVE_MS - 1);
        assert_eq!(r.len(), 1, "only the last one is recent enough");
        r.expire(last + REUSE_INACTIVE_MS);
        assert_eq!(r.len(), 0);
    }

    #[test]
    fn nothing_is_held_from_a_file_system_that_is_not_local() {
        let mut r = Reuse::default();
        r.local.insert(1, false);
        r.put(Path::new("/nfs/a"), &fd(), id(7), 0);
        assert!(!r.holds(Path::new("/nfs/a")));
    }

    #[test]
    fn only_a_kept_file_is_mapped_and_the_mappings_are_counted() {
        let path = std::env::temp_dir().join(format!("shard-map-{}", std::process::id()));
        std::fs::write(&path, vec![b'x'; 10_000]).unwrap();
        let open = || OpenFile::new(std::fs::File::open(&path).unwrap().into());
        let before = MAPPINGS.get();
        let once = open();
        assert!(
            once.mapping(10_000).is_none(),
            "a file opened for one response"
        );
        let kept = open();
        kept.kept.set(true);
        assert!(
            kept.mapping(10_000).is_none(),
            "not before it is asked for again"
        );
        kept.reused.set(true);
        assert_eq!(kept.mapping(10_000).map(Mapping::len), Some(10_000));
        assert_eq!(kept.mapping(1).map(Mapping::len), Some(10_000), "made once");
        assert_eq!(MAPPINGS.get(), before + 1);
        let empty = open();
        empty.kept.set(true);
        empty.reused.set(true);
        assert!(empty.mapping(0).is_none());
        let huge = open();
        huge.kept.set(true);
        huge.reused.set(true);
        assert!(
            huge.mapping(MAP_FILE_MAX_BYTES + 1).is_none(),
            "read in chunks"
        );
        drop(kept);
        assert_eq!(MAPPINGS.get(), before);
        // At the bound, a kept file is read with `pread` instead.
        MAPPINGS.set(MAPPINGS_MAX);
        let late = open();
        late.kept.set(true);
        late.reused.set(true);
        assert!(late.mapping(10_000).is_none());
        MAPPINGS.set(before);
        let bytes = MAPPED_BYTES.get();
        MAPPED_BYTES.set(MAPPED_BYTES_MAX - 9_999);
        assert!(late.mapping(10_000).is_none(), "the bytes' bound too");
        MAPPED_BYTES.set(bytes);
        assert!(
            late.mapping(10_000).is_some(),
            "mapped once below the bounds"
        );
        assert_eq!(MAPPED_BYTES.get(), bytes + 10_000);
        drop(late);
        assert_eq!((MAPPINGS.get(), MAPPED_BYTES.get()), (before, bytes));
        std::fs::remove_file(&path).unwrap();
    }
    #[test]
    fn a_kept_cache_entry_serves_only_its_own_version_and_key() {
        let header = crate::cache::Header {
            body_len: 10,
            ..Default::default()
        };
        let f = match file() {
            Opened::File(f, _) => f,
            _ => unreachable!(),
        };
        let mut m = CacheMemo::default();
        // Version 0: the zone knew no file when the request looked; nothing is kept.
        m.put(0, 7, 0, b"k", &f, &header, b"HTTP/1.1 200 OK\r\n\r\n", 0);
        assert!(m.get(0, 7, 0, b"k", 1).is_none());
        m.put(0, 7, 3, b"k", &f, &header, b"HTTP/1.1 200 OK\r\n\r\n", 0);
        assert!(f.kept.get(), "kept: worth mapping when asked again");
        let got = m.get(0, 7, 3, b"k", 1).expect("same version, same key");
        assert_eq!(&*got.head, b"HTTP/1.1 200 OK\r\n\r\n");
        assert!(f.reused.get());
        assert!(m.get(1, 7, 3, b"k", 1).is_none(), "another zone");
        assert!(
            m.get(0, 7, 3, b"other", 1).is_none(),
            "another key: dropped"
        );
        assert!(m.get(0, 7, 3, b"k", 1).is_none(), "dropped by the mismatch");
        m.put(0, 7, 3, b"k", &f, &header, b"", 0);
        assert!(m.get(0, 7, 3, b"k", CACHE_MEMO_VALID_MS - 1).is_some());
        assert!(
            m.get(0, 7, 3, b"k", CACHE_MEMO_VALID_MS).is_none(),
            "opened again after a while, however used"
        );
        m.put(0, 7, 3, b"k", &f, &header, b"", 0);
        assert!(
            m.get(0, 7, 4, b"k", 1).is_none(),
            "stored again, refreshed or removed"
        );
        // A variant, or a file too large to map, is not kept.
        let variant = crate::cache::Header {
            variant: [1; 16],
            ..header.clone()
        };
        m.put(0, 8, 3, b"k", &f, &variant, b"", 0);
        assert!(m.get(0, 8, 3, b"k", 1).is_none());
        let huge = crate::cache::Header {
            body_len: MAP_FILE_MAX_BYTES,
            ..header.clone()
        };
        m.put(0, 9, 3, b"k", &f, &huge, b"", 0);
        assert!(m.get(0, 9, 3, b"k", 1).is_none());
        // Bounded, least recently used out first; closed after inactivity.
        for k in 0..CACHE_MEMO_MAX as u128 + 1 {
            m.put(0, 100 + k, 1, b"k", &f, &header, b"", k as u64);
        }
        assert_eq!(m.map.len(), CACHE_MEMO_MAX);
        assert!(m.get(0, 100, 1, b"k", 200).is_none(), "the oldest went");
        m.expire(200 + REUSE_INACTIVE_MS);
        assert_eq!(m.map.len(), 0);
        assert!(!m.clear());
    }
}
