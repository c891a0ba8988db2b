//! Files: for static responses one `open` and one `fstat`, and the request-body temporary
//! files, which never have a name for longer than one system call. Descriptors are returned
//! owned.

use std::ffi::CStr;
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use crate::cvt;

/// What the static-file path needs from `fstat`.
#[derive(Debug, Clone, Copy)]
pub struct Stat {
    pub size: u64,
    pub mtime_secs: i64,
    pub is_dir: bool,
    pub is_file: bool,
    pub id: FileId,
}

/// Which file a `stat` saw, and everything about it that decides whether this process may
/// open it: two equal `FileId`s of a file held open are the same file with the same
/// permissions (an inode number is not reused while a descriptor keeps the inode alive, and
/// any change of mode, owner or ACL moves `ctime`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileId {
    pub dev: u64,
    pub ino: u64,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub ctime: (i64, i64),
}

impl Stat {
    fn from_raw(st: &libc::stat) -> Stat {
        let fmt = st.st_mode & libc::S_IFMT;
        Stat {
            size: st.st_size as u64,
            mtime_secs: st.st_mtime,
            is_dir: fmt == libc::S_IFDIR,
            is_file: fmt == libc::S_IFREG,
            id: FileId {
                dev: st.st_dev,
                ino: st.st_ino,
                mode: st.st_mode,
                uid: st.st_uid,
                gid: st.st_gid,
                ctime: (st.st_ctime, st.st_ctime_nsec),
            },
        }
    }
}

/// The file system type (`statfs`'s `f_type`, a magic number) of the file open at `fd`.
pub fn fs_type(fd: RawFd) -> io::Result<i64> {
    let mut st = MaybeUninit::<libc::statfs>::zeroed();
    // SAFETY: st is valid for writes.
    cvt(unsafe { libc::fstatfs(fd, st.as_mut_ptr()) })?;
    // SAFETY: fstatfs filled it.
    let f_type = unsafe { st.assume_init_ref() }.f_type;
    // `f_type`'s width differs between architectures.
    #[allow(clippy::unnecessary_cast)]
    Ok(f_type as i64)
}

/// Stats the file open at `fd`.
pub fn fstat(fd: RawFd) -> io::Result<Stat> {
    let mut st = MaybeUninit::<libc::stat>::zeroed();
    // SAFETY: st is valid for writes.
    cvt(unsafe { libc::fstat(fd, st.as_mut_ptr()) })?;
    // SAFETY: fstat filled it.
    Ok(Stat::from_raw(unsafe { st.assume_init_ref() }))
}

/// Stats `path` (following links, as `open` does) without opening it.
pub fn stat_path(path: &CStr) -> io::Result<Stat> {
    let mut st = MaybeUninit::<libc::stat>::zeroed();
    // SAFETY: path is NUL-terminated and st is valid for writes.
    cvt(unsafe { libc::stat(path.as_ptr(), st.as_mut_ptr()) })?;
    // SAFETY: stat filled it.
    Ok(Stat::from_raw(unsafe { st.assume_init_ref() }))
}

/// Opens `path` read-only (non-blocking, close-on-exec) and stats the open descriptor, so the
/// metadata describes exactly the file that will be sent.
pub fn open_stat(path: &CStr) -> io::Result<(OwnedFd, Stat)> {
    // SAFETY: path is a valid NUL-terminated string.
    let fd = cvt(unsafe {
        libc::open(
            path.as_ptr(),
            libc::O_RDONLY | libc::O_NONBLOCK | libc::O_CLOEXEC,
        )
    })?;
    // SAFETY: open returned a new descriptor that nothing else owns.
    finish_open(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Creates a temporary file that has no name: `O_TMPFILE` in `dir`, or, where the file system
/// lacks it, `path` created exclusively and unlinked at once. Either way nothing is left on
/// disk when the descriptor closes, whatever happens to the process. `Err(AlreadyExists)`: the
/// fallback found `path` taken; the caller picks another name.
pub fn create_unlinked(dir: &CStr, path: &CStr) -> io::Result<OwnedFd> {
    // SAFETY: dir is a valid NUL-terminated string.
    let r = unsafe {
        libc::open(
            dir.as_ptr(),
            libc::O_TMPFILE | libc::O_RDWR | libc::O_CLOEXEC,
            0o600 as libc::c_uint,
        )
    };
    match cvt(r) {
        // SAFETY: open returned a new descriptor that nothing else owns.
        Ok(fd) => return Ok(unsafe { OwnedFd::from_raw_fd(fd) }),
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::EOPNOTSUPP | libc::EISDIR | libc::EINVAL)
            ) => {}
        Err(e) => return Err(e),
    }
    // SAFETY: path is a valid NUL-terminated string.
    let fd = cvt(unsafe {
        libc::open(
            path.as_ptr(),
            libc::O_CREAT | libc::O_EXCL | libc::O_RDWR | libc::O_CLOEXEC,
            0o600 as libc::c_uint,
        )
    })?;
    // SAFETY: as above.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: path is a valid NUL-terminated string.
    cvt(unsafe { libc::unlink(path.as_ptr()) })?;
    Ok(owned)
}

/// `write(2)` of all of `buf` to a file (a regular file never writes short but on an error).
pub fn write_all(fd: std::os::fd::RawFd, mut buf: &[u8]) -> io::Result<()> {
    while !buf.is_empty() {
        // SAFETY: buf is valid for reads of buf.len() bytes.
        let n = unsafe { libc::write(fd, buf.as_ptr() as *const libc::c_void, buf.len()) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(io::Error::from(io::ErrorKind::WriteZero));
        }
        buf = &buf[n as usize..];
    }
    Ok(())
}

/// How [`open_stat_checked`] treats symbolic links below the unchecked part (nginx's
/// `disable_symlinks`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Symlinks {
    /// Any symbolic link is refused.
    Refuse,
    /// A symbolic link is followed only when it and what it points to have the same owner.
    SameOwner,
}

fn stat_at(dir: RawFd, name: &CStr, flags: libc::c_int) -> io::Result<libc::stat> {
    let mut st = MaybeUninit::<libc::stat>::zeroed();
    // SAFETY: name is NUL-terminated; st is valid for writes.
    cvt(unsafe { libc::fstatat(dir, name.as_ptr(), st.as_mut_ptr(), flags) })?;
    // SAFETY: fstatat filled it.
    Ok(unsafe { st.assume_init() })
}

fn open_at(dir: RawFd, name: &CStr, flags: libc::c_int) -> io::Result<OwnedFd> {
    // SAFETY: name is NUL-terminated.
    let fd = cvt(unsafe { libc::openat(dir, name.as_ptr(), flags | libc::O_CLOEXEC) })?;
    // SAFETY: openat returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Opens `base` + `rest` like [`open_stat`], with `base` resolved as usual and every component
/// of `rest` checked for symbolic links one `openat` at a time, as nginx's
/// `ngx_open_file_wrapper` with `disable_symlinks`: a refused link is `ELOOP`.
pub fn open_stat_checked(base: &CStr, rest: &[u8], mode: Symlinks) -> io::Result<(OwnedFd, Stat)> {
    let mut dir = open_at(libc::AT_FDCWD, base, libc::O_PATH | libc::O_DIRECTORY)?;
    let parts: Vec<&[u8]> = rest
        .split(|&b| b == b'/')
        .filter(|p| !p.is_empty())
        .collect();
    let (last, dirs) = parts
        .split_last()
        .map_or((&b"."[..], &[][..]), |(l, d)| (*l, d));
    for part in dirs {
        dir = open_component(&dir, part, libc::O_PATH | libc::O_DIRECTORY, mode)?;
    }
    finish_open(open_component(
        &dir,
        last,
        libc::O_RDONLY | libc::O_NONBLOCK,
        mode,
    )?)
}

/// Opens one path component under `dir` with `flags`, refusing a symbolic link per `mode`.
fn open_component(
    dir: &OwnedFd,
    part: &[u8],
    flags: libc::c_int,
    mode: Symlinks,
) -> io::Result<OwnedFd> {
    let name =
        std::ffi::CString::new(part).map_err(|_| io::Error::from_raw_os_error(libc::ENOENT))?;
    let link = stat_at(dir.as_raw_fd(), &name, libc::AT_SYMLINK_NOFOLLOW)?;
    if link.st_mode & libc::S_IFMT != libc::S_IFLNK {
        // Not a link when checked: with O_NOFOLLOW, one swapped in since then fails.
        return match open_at(dir.as_raw_fd(), &name, flags | libc::O_NOFOLLOW) {
            Err(e) if e.raw_os_error() == Some(libc::ENOTDIR) && flags & libc::O_PATH != 0 => {
                Err(io::Error::from_raw_os_error(libc::ELOOP))
            }
            r => r,
        };
    }
    let target = stat_at(dir.as_raw_fd(), &name, 0)?;
    if mode == Symlinks::Refuse || target.st_uid != link.st_uid {
        return Err(io::Error::from_raw_os_error(libc::ELOOP));
    }
    let fd = open_at(dir.as_raw_fd(), &name, flags)?;
    // What was opened must be what was checked (the link may have changed meanwhile).
    let id = fstat(fd.as_raw_fd())?.id;
    if id.ino != target.st_ino || id.dev != target.st_dev {
        return Err(io::Error::from_raw_os_error(libc::ELOOP));
    }
    Ok(fd)
}

/// Stats an open descriptor, so the metadata describes exactly the file that was opened.
fn finish_open(owned: OwnedFd) -> io::Result<(OwnedFd, Stat)> {
    let st = fstat(owned.as_raw_fd())?;
    Ok((owned, st))
}

/// A read-only shared mapping of a whole file, for the kernel to copy from ([`writev_mapped`]):
/// the file's bytes then cross one copy, page cache to socket, where `pread` and `write` cross
/// two.
///
/// Its bytes are never read in user space, and the type gives no way to: a file truncated
/// under a mapping raises `SIGBUS` on a user-space read of the lost pages, while the kernel's
/// own copy from them fails with `EFAULT` (or stops short), which a response handles as it
/// handles a short `pread`.
pub struct Mapping {
    ptr: std::ptr::NonNull<libc::c_void>,
    len: usize,
}

impl Mapping {
    /// Maps the first `len` bytes of `fd` (`len` > 0).
    pub fn new(fd: RawFd, len: usize) -> io::Result<Mapping> {
        if len == 0 {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        // SAFETY: a fresh mapping chosen by the kernel; nothing aliases it.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr =
            std::ptr::NonNull::new(p).ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))?;
        Ok(Mapping { ptr, len })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, unmapped once.
        unsafe { libc::munmap(self.ptr.as_ptr(), self.len) };
    }
}

/// `writev(2)` of `head` then `len` bytes of `map` from `offset` (clamped to the mapping), in
/// one call: a response's head and its file leave together. The kernel copies from the
/// mapping; a part of it beyond a truncated file's end stops the copy (a short count, or
/// `EFAULT` when nothing was written).
pub fn writev_mapped(
    fd: RawFd,
    head: &[u8],
    map: &Mapping,
    offset: usize,
    len: usize,
) -> io::Result<usize> {
    let offset = offset.min(map.len);
    let len = len.min(map.len - offset);
    let iov = [
        libc::iovec {
            iov_base: head.as_ptr() as *mut libc::c_void,
            iov_len: head.len(),
        },
        libc::iovec {
            // SAFETY (of the arithmetic): `offset` is within the mapping.
            iov_base: unsafe { (map.ptr.as_ptr() as *mut u8).add(offset) } as *mut libc::c_void,
            iov_len: len,
        },
    ];
    let (iov, cnt) = if head.is_empty() {
        (&iov[1..], 1)
    } else {
        (&iov[..], 2)
    };
    // SAFETY: both iovecs describe readable memory that outlives the call (the mapping is
    // borrowed); the kernel only reads them.
    let n = unsafe { libc::writev(fd, iov.as_ptr(), cnt) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}
