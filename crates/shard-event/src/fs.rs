//! Files for static responses: one `open` and one `fstat`; the descriptor is returned owned.

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
