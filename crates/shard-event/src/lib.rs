//! The operating-system edge of shard: epoll, signalfd, sockets, processes and shared memory.
//!
//! Every `unsafe` block of the project lives in this crate, each behind a small function with a
//! `SAFETY:` comment, and this is the only crate that calls epoll. It owns no policy: which
//! socket to poll, when to accept and what to answer are decided by `shard-server`.
//!
//! Contract, as mio states it: events are edge- or level-triggered as registered, may be
//! spurious, and `WouldBlock` is never an error here; it is returned as `io::ErrorKind::WouldBlock`
//! for the caller to treat as "done for now".

pub mod bpf;
pub mod fs;
pub mod poll;
pub mod process;
pub mod shm;
pub mod sock;

pub use poll::{Event, Events, Interest, Poll};

use std::io;

/// Turns a `-1` return into the thread's `errno` as an `io::Error`.
pub(crate) fn cvt(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

pub(crate) fn cvt_size(ret: libc::ssize_t) -> io::Result<usize> {
    if ret == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret as usize)
    }
}

/// Milliseconds of `CLOCK_MONOTONIC` (a vDSO call, not a system call on x86_64 and arm64).
pub fn monotonic_ms() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1000 + ts.tv_nsec as u64 / 1_000_000
}

/// Seconds since the Unix epoch, from `CLOCK_REALTIME` (vDSO).
/// Milliseconds since the epoch (`CLOCK_REALTIME`).
pub fn unix_ms() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
    ts.tv_sec as u64 * 1000 + ts.tv_nsec as u64 / 1_000_000
}

pub fn unix_secs() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
    ts.tv_sec as u64
}

/// An error as nginx prints it: `98: Address already in use` (errno and its text), or the
/// error's own text when it carries no errno.
pub fn os_error_text(e: &io::Error) -> String {
    match e.raw_os_error() {
        Some(code) => {
            let full = io::Error::from_raw_os_error(code).to_string();
            // std renders "Address already in use (os error 98)".
            let text = full.split(" (os error").next().unwrap_or(&full);
            format!("{code}: {text}")
        }
        None => e.to_string(),
    }
}
