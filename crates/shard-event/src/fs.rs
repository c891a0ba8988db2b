//! Files: for static responses one `open` and one `fstat`, and the request-body temporary
//! files, which never have a name for longer than one system call. Descriptors are returned
//! owned.

use std::ffi::CStr;
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{FromRawFd, OwnedFd};

use crate::cvt;

/// What the static-file path needs from `fstat`.
#[derive(Debug, Clone, Copy)]
pub struct Stat {
    pub size: u64,
    pub mtime_secs: i64,
    pub is_dir: bool,
    pub is_file: bool,
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
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut st = MaybeUninit::<libc::stat>::zeroed();
    // SAFETY: st is valid for writes.
    cvt(unsafe { libc::fstat(fd, st.as_mut_ptr()) })?;
    // SAFETY: fstat filled it.
    let st = unsafe { st.assume_init() };
    let fmt = st.st_mode & libc::S_IFMT;
    Ok((
        owned,
        Stat {
            size: st.st_size as u64,
            mtime_secs: st.st_mtime,
            is_dir: fmt == libc::S_IFDIR,
            is_file: fmt == libc::S_IFREG,
        },
    ))
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
