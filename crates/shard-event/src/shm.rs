//! An anonymous shared mapping created by the master before it forks workers.
//!
//! The region is zero-filled, shared between the master and every worker it forks (and every
//! worker it respawns), and never resized. Its layout is defined by `shard-server`; this module
//! only maps it and hands out a typed reference.

use std::io;
use std::ptr::NonNull;

/// A `MAP_SHARED | MAP_ANONYMOUS` mapping holding one `T`.
///
/// `T` must be valid when all-zero (`bytemuck::Zeroable`, derived, so the compiler checks it
/// field by field) and is shared by several processes, so it is only mutated through atomics:
/// `shard-server` uses structs of `AtomicU64`, and `Sync` is required so that only types safe
/// to share by reference can be mapped.
pub struct Shared<T> {
    ptr: NonNull<T>,
}

impl<T: bytemuck::Zeroable + Sync> Shared<T> {
    pub fn new_zeroed() -> io::Result<Shared<T>> {
        let len = std::mem::size_of::<T>().max(1);
        // SAFETY: anonymous mapping with no address hint; the result is checked.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Shared {
            ptr: NonNull::new(p as *mut T).expect("mmap returned null"),
        })
    }
}

impl<T> std::ops::Deref for Shared<T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the mapping lives as long as `self` and holds a zero-initialised, valid `T`.
        unsafe { self.ptr.as_ref() }
    }
}

// The mapping is never unmapped: the master and its workers keep it for their whole life, and
// forked children inherit it. Dropping does nothing on purpose.
