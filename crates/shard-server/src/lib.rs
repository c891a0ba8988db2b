//! The shard server: a master process that owns every listening socket and a set of
//! single-threaded worker processes, each running its own epoll loop.
//!
//! This crate owns the process model (fork, respawn, signals), the listeners and their shards,
//! the accept strategies, the connection I/O of the HTTP data path, and the shared-memory
//! counters. It does not parse configuration (`shard-config`) nor HTTP (`shard-http`), and it
//! calls the kernel only through `shard-event`, except for socket set-up done with `socket2`.

pub mod cache;
pub mod dns;
mod keys;
pub mod limits;
pub mod listen;
pub mod log;
pub mod master;
pub mod preread;
pub mod privilege;
pub mod sandbox;
pub mod sessions;
pub mod shm;
pub mod status;
mod steer;
pub mod tls;
mod worker;
mod x509;

pub use master::{run, RunOptions};

/// Sends `sig` to `pid` (used by `shard -s`).
pub fn signal(pid: libc::pid_t, sig: libc::c_int) -> std::io::Result<()> {
    shard_event::process::kill(pid, sig)
}
