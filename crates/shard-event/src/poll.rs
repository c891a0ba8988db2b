//! epoll: one `Poll` per worker (and one in the master), tokens are plain `u64`s.
//!
//! The worker chooses tokens and flags; this module only translates them. `EPOLLEXCLUSIVE` is
//! exposed as-is because the accept strategies are built from it (Linux 4.5+).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use crate::cvt;

/// Interest flags for [`Poll::add`]. Combine with `|`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Interest(u32);

impl Interest {
    pub const READ: Interest = Interest(libc::EPOLLIN as u32);
    pub const WRITE: Interest = Interest(libc::EPOLLOUT as u32);
    /// Peer closed its writing half; reported with the read event.
    pub const RDHUP: Interest = Interest(libc::EPOLLRDHUP as u32);
    /// Edge-triggered: the caller must consume until it knows the source is drained.
    pub const EDGE: Interest = Interest(libc::EPOLLET as u32);
    /// Wake only one (or a few) of the epoll instances waiting on this file (Linux 4.5+).
    pub const EXCLUSIVE: Interest = Interest(libc::EPOLLEXCLUSIVE as u32);

    pub const fn bits(self) -> u32 {
        self.0
    }
}

impl std::ops::BitOr for Interest {
    type Output = Interest;
    fn bitor(self, rhs: Interest) -> Interest {
        Interest(self.0 | rhs.0)
    }
}

/// One readiness report.
#[derive(Debug, Clone, Copy)]
pub struct Event {
    pub token: u64,
    flags: u32,
}

impl Event {
    pub fn readable(&self) -> bool {
        self.flags & (libc::EPOLLIN as u32 | libc::EPOLLHUP as u32 | libc::EPOLLERR as u32) != 0
    }
    pub fn writable(&self) -> bool {
        self.flags & (libc::EPOLLOUT as u32 | libc::EPOLLHUP as u32 | libc::EPOLLERR as u32) != 0
    }
    /// The peer shut down its writing side or the connection failed.
    pub fn hup(&self) -> bool {
        self.flags & (libc::EPOLLRDHUP as u32 | libc::EPOLLHUP as u32 | libc::EPOLLERR as u32) != 0
    }
}

/// A bounded event buffer for [`Poll::wait`].
pub struct Events {
    buf: Vec<libc::epoll_event>,
    len: usize,
}

impl Events {
    pub fn with_capacity(n: usize) -> Events {
        let n = n.max(1);
        Events {
            buf: vec![libc::epoll_event { events: 0, u64: 0 }; n],
            len: 0,
        }
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn get(&self, i: usize) -> Event {
        let e = self.buf[i];
        Event {
            token: e.u64,
            flags: e.events,
        }
    }
}

/// An epoll instance, closed on drop.
pub struct Poll {
    epfd: OwnedFd,
}

impl Poll {
    pub fn new() -> io::Result<Poll> {
        // SAFETY: plain system call without pointers.
        let epfd = cvt(unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) })?;
        // SAFETY: a new descriptor that nothing else owns.
        let epfd = unsafe { OwnedFd::from_raw_fd(epfd) };
        Ok(Poll { epfd })
    }

    fn ctl(&self, op: libc::c_int, fd: RawFd, token: u64, interest: Interest) -> io::Result<()> {
        let mut ev = libc::epoll_event {
            events: interest.bits(),
            u64: token,
        };
        // SAFETY: `ev` is a valid epoll_event for the duration of the call.
        cvt(unsafe { libc::epoll_ctl(self.epfd.as_raw_fd(), op, fd, &mut ev) })?;
        Ok(())
    }

    pub fn add(&self, fd: RawFd, token: u64, interest: Interest) -> io::Result<()> {
        self.ctl(libc::EPOLL_CTL_ADD, fd, token, interest)
    }

    pub fn modify(&self, fd: RawFd, token: u64, interest: Interest) -> io::Result<()> {
        self.ctl(libc::EPOLL_CTL_MOD, fd, token, interest)
    }

    pub fn delete(&self, fd: RawFd) -> io::Result<()> {
        self.ctl(libc::EPOLL_CTL_DEL, fd, 0, Interest(0))
    }

    /// Waits up to `timeout_ms` (-1: forever). `EINTR` is reported as zero events.
    pub fn wait(&self, events: &mut Events, timeout_ms: i32) -> io::Result<usize> {
        // SAFETY: the buffer holds `buf.len()` writable epoll_event slots.
        let n = unsafe {
            libc::epoll_wait(
                self.epfd.as_raw_fd(),
                events.buf.as_mut_ptr(),
                events.buf.len() as libc::c_int,
                timeout_ms,
            )
        };
        if n < 0 {
            let err = io::Error::last_os_error();
            events.len = 0;
            if err.kind() == io::ErrorKind::Interrupted {
                return Ok(0);
            }
            return Err(err);
        }
        events.len = n as usize;
        Ok(events.len)
    }
}
