//! Listening sockets and shards, created by the master and held by it for the life of an address.
//!
//! A listener is one configured address. Without `reuseport` it is one shared socket that every
//! worker polls. With `reuseport` it is a group of `SO_REUSEPORT` sockets, one *shard* per
//! worker: shard k is polled only by worker k. The master creates every shard before forking and
//! never closes one while the address is configured, for two reasons that come from Linux:
//! - closing one socket of a reuseport group resets the connections queued on it (unless
//!   `net.ipv4.tcp_migrate_req=1`, Linux 5.14+), so a dying worker must not take its shard with it;
//! - the kernel picks a socket by index in the group (`reuseport_select_sock`), and closing
//!   one moves the last socket into its slot, so keeping all of them open keeps indices stable.
//!
//! Every worker inherits every shard's descriptor, so a sibling could take over a stalled
//! worker's queue later; this module only creates and describes them.

use std::io;
use std::net::SocketAddr;
use std::os::fd::{IntoRawFd, RawFd};

use shard_config::{ListenOpts, Listener, SoKeepalive};
use socket2::{Domain, Protocol, Socket, Type};

/// One configured address and its sockets.
#[derive(Debug)]
pub struct OpenListener {
    pub addr: SocketAddr,
    /// Index into `Config::listeners`.
    pub conf_idx: usize,
    /// `true` when `reuseport` was asked for and the kernel accepted it.
    pub reuseport: bool,
    /// One shared socket, or the shards: one per worker (index = shard index = worker index),
    /// or fewer with `shards=N`, where worker k polls shard `k mod N`.
    pub fds: Vec<RawFd>,
    pub backlog: i32,
    pub n_workers: usize,
}

impl OpenListener {
    /// Whether worker `idx` is the only one polling its socket (a per-worker shard).
    pub fn owned_by_one(&self) -> bool {
        self.reuseport && self.fds.len() >= self.n_workers
    }

    /// The workers that poll socket `k` of this listener.
    pub fn pollers(&self, k: usize) -> Vec<usize> {
        (0..self.n_workers)
            .filter(|w| !self.reuseport || w % self.fds.len() == k)
            .collect()
    }

    /// The socket worker `idx` polls.
    pub fn fd_for_worker(&self, idx: usize) -> RawFd {
        if self.reuseport {
            self.fds[idx % self.fds.len()]
        } else {
            self.fds[0]
        }
    }
}

/// Set when the kernel refused `SO_REUSEPORT` once, so it is reported only once.
static REUSEPORT_WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn socket_for(addr: &SocketAddr, opts: &ListenOpts, tcp_nodelay: bool) -> io::Result<Socket> {
    let s = Socket::new(
        Domain::for_address(*addr),
        Type::STREAM.cloexec().nonblocking(),
        Some(Protocol::TCP),
    )?;
    s.set_reuse_address(true)?;
    if addr.is_ipv6() {
        s.set_only_v6(opts.ipv6only)?;
    }
    if let Some(n) = opts.rcvbuf {
        s.set_recv_buffer_size(n)?;
    }
    if let Some(n) = opts.sndbuf {
        s.set_send_buffer_size(n)?;
    }
    match opts.so_keepalive {
        Some(SoKeepalive::On) => s.set_keepalive(true)?,
        Some(SoKeepalive::Off) => s.set_keepalive(false)?,
        None => {}
    }
    // Accepted sockets inherit TCP_NODELAY from the listener on Linux (the child socket is a
    // clone of the listener), which saves one setsockopt per connection.
    if tcp_nodelay {
        s.set_nodelay(true)?;
    }
    Ok(s)
}

fn bind_listen(s: &Socket, addr: &SocketAddr, opts: &ListenOpts) -> io::Result<()> {
    s.bind(&(*addr).into()).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!(
                "bind() to {addr} failed ({})",
                shard_event::os_error_text(&e)
            ),
        )
    })?;
    s.listen(opts.backlog).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!(
                "listen() to {addr} failed ({})",
                shard_event::os_error_text(&e)
            ),
        )
    })?;
    if opts.deferred {
        // TCP_DEFER_ACCEPT: seconds to wait for data before accept() reports the connection.
        shard_event::sock::set_defer_accept(std::os::fd::AsRawFd::as_raw_fd(s), 1).map_err(
            |e| {
                io::Error::new(
                    e.kind(),
                    format!(
                        "setsockopt(TCP_DEFER_ACCEPT) for {addr} failed ({})",
                        shard_event::os_error_text(&e)
                    ),
                )
            },
        )?;
    }
    Ok(())
}

/// Whether tests asked to simulate a kernel without `SO_REUSEPORT` (see docs/directives.md).
fn reuseport_disabled_for_test() -> bool {
    std::env::var_os("SHARD_TEST_NO_REUSEPORT").is_some()
}

/// Opens `l` for `n_workers` workers: one shared socket, or `shard_count` shards.
pub fn open(
    conf_idx: usize,
    l: &Listener,
    n_workers: usize,
    tcp_nodelay: bool,
) -> io::Result<OpenListener> {
    if l.opts.reuseport {
        let cpus = shard_event::process::available_cpus();
        let n = shard_config::shard_count(l.opts.shards, n_workers, cpus);
        match open_shards(l, n, tcp_nodelay) {
            Ok(fds) => {
                return Ok(OpenListener {
                    addr: l.addr,
                    conf_idx,
                    reuseport: true,
                    fds,
                    backlog: l.opts.backlog,
                    n_workers,
                })
            }
            Err(ShardError::Refused(e)) => {
                if !REUSEPORT_WARNED.swap(true, std::sync::atomic::Ordering::Relaxed) {
                    crate::log!(
                        Warn,
                        "setsockopt(SO_REUSEPORT) failed ({}), reuseport is not supported here: \
                         falling back to a shared socket for {} and every other reuseport listener",
                        shard_event::os_error_text(&e),
                        l.addr
                    );
                }
            }
            Err(ShardError::Io(e)) => return Err(e),
        }
    }
    let s = socket_for(&l.addr, &l.opts, tcp_nodelay)?;
    bind_listen(&s, &l.addr, &l.opts)?;
    Ok(OpenListener {
        addr: l.addr,
        conf_idx,
        reuseport: false,
        fds: vec![s.into_raw_fd()],
        backlog: l.opts.backlog,
        n_workers,
    })
}

enum ShardError {
    Refused(io::Error),
    Io(io::Error),
}

fn open_shards(l: &Listener, n: usize, tcp_nodelay: bool) -> Result<Vec<RawFd>, ShardError> {
    let mut socks: Vec<Socket> = Vec::with_capacity(n);
    for _ in 0..n {
        let s = socket_for(&l.addr, &l.opts, tcp_nodelay).map_err(ShardError::Io)?;
        if reuseport_disabled_for_test() {
            return Err(ShardError::Refused(io::Error::from_raw_os_error(
                libc::ENOPROTOOPT,
            )));
        }
        s.set_reuse_port(true).map_err(ShardError::Refused)?;
        bind_listen(&s, &l.addr, &l.opts).map_err(ShardError::Io)?;
        socks.push(s);
    }
    // Shards join the reuseport group in index order, so shard k is slot k in the group.
    Ok(socks.into_iter().map(|s| s.into_raw_fd()).collect())
}
