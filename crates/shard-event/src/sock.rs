//! Data-path socket calls on raw descriptors: one system call each, no hidden retries.
//!
//! Calls that create a descriptor return it owned (`OwnedFd`: closed when dropped, so a
//! connection's socket is closed exactly once, by dropping the connection). Calls on an
//! existing descriptor take `RawFd`, borrowed for the call. Listener creation (bind, options)
//! is done with `socket2` in `shard-server`.

use std::io;
use std::mem::{size_of, MaybeUninit};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{FromRawFd, OwnedFd, RawFd};

use crate::{cvt, cvt_size};

fn sockaddr_to_std(storage: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match storage.ss_family as libc::c_int {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in.
            let a = unsafe { &*(storage as *const _ as *const libc::sockaddr_in) };
            let ip = Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr));
            Some(SocketAddr::V4(SocketAddrV4::new(
                ip,
                u16::from_be(a.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says the storage holds a sockaddr_in6.
            let a = unsafe { &*(storage as *const _ as *const libc::sockaddr_in6) };
            let ip = Ipv6Addr::from(a.sin6_addr.s6_addr);
            Some(SocketAddr::V6(SocketAddrV6::new(
                ip,
                u16::from_be(a.sin6_port),
                a.sin6_flowinfo,
                a.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

/// `accept4(SOCK_NONBLOCK | SOCK_CLOEXEC)`: the new descriptor and the peer address.
pub fn accept(listen_fd: RawFd) -> io::Result<(OwnedFd, Option<SocketAddr>)> {
    let mut storage = MaybeUninit::<libc::sockaddr_storage>::zeroed();
    let mut len = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    // SAFETY: storage and len are valid for writes of the sizes given.
    let fd = cvt(unsafe {
        libc::accept4(
            listen_fd,
            storage.as_mut_ptr() as *mut libc::sockaddr,
            &mut len,
            libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
        )
    })?;
    // SAFETY: accept4 initialised the storage (zeroed before, so any unwritten tail is valid).
    let storage = unsafe { storage.assume_init() };
    // SAFETY: accept4 returned a new descriptor that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    Ok((fd, sockaddr_to_std(&storage)))
}

/// `read(2)` into `buf`; `Ok(0)` is end of stream.
pub fn read(fd: RawFd, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: buf is valid for writes of buf.len() bytes.
    cvt_size(unsafe { libc::read(fd, buf.as_mut_ptr() as *mut libc::c_void, buf.len()) })
}

/// Reads into the spare capacity of `buf`, extending its length by what was read.
pub fn read_into(fd: RawFd, buf: &mut Vec<u8>) -> io::Result<usize> {
    let spare = buf.spare_capacity_mut();
    // SAFETY: spare capacity is valid for writes; we only expose bytes the kernel wrote.
    let n =
        cvt_size(unsafe { libc::read(fd, spare.as_mut_ptr() as *mut libc::c_void, spare.len()) })?;
    // SAFETY: the kernel initialised `n` bytes of the spare capacity.
    unsafe { buf.set_len(buf.len() + n) };
    Ok(n)
}

/// `recv(2)` with `MSG_PEEK`: what the socket holds, left in it (the PROXY protocol header is
/// looked at before the bytes behind it, a TLS handshake's, are read by someone else).
pub fn peek(fd: RawFd, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: buf is valid for writes of buf.len() bytes.
    cvt_size(unsafe {
        libc::recv(
            fd,
            buf.as_mut_ptr() as *mut libc::c_void,
            buf.len(),
            libc::MSG_PEEK,
        )
    })
}

/// Reads at most `max` bytes into the spare capacity of `buf` (reserving room first),
/// extending its length by what was read.
pub fn read_into_max(fd: RawFd, buf: &mut Vec<u8>, max: usize) -> io::Result<usize> {
    buf.reserve_exact(max);
    let spare = &mut buf.spare_capacity_mut()[..max];
    // SAFETY: spare capacity is valid for writes of `max` bytes; we only expose bytes the
    // kernel wrote.
    let n = cvt_size(unsafe { libc::read(fd, spare.as_mut_ptr() as *mut libc::c_void, max) })?;
    // SAFETY: the kernel initialised `n` bytes of the spare capacity.
    unsafe { buf.set_len(buf.len() + n) };
    Ok(n)
}

/// `write(2)`.
pub fn write(fd: RawFd, buf: &[u8]) -> io::Result<usize> {
    // SAFETY: buf is valid for reads of buf.len() bytes.
    cvt_size(unsafe { libc::write(fd, buf.as_ptr() as *const libc::c_void, buf.len()) })
}

/// `send(2)` with `MSG_MORE`: more data (a file by `sendfile`) follows, so the kernel holds a
/// partial segment back to fill it (nginx's `tcp_nopush`, per call).
pub fn send_more(fd: RawFd, buf: &[u8]) -> io::Result<usize> {
    // SAFETY: buf is valid for reads of buf.len() bytes.
    cvt_size(unsafe {
        libc::send(
            fd,
            buf.as_ptr() as *const libc::c_void,
            buf.len(),
            libc::MSG_MORE | libc::MSG_NOSIGNAL,
        )
    })
}

/// `sendfile(2)` from `file_fd` at `*offset`, advancing it.
pub fn sendfile(
    sock_fd: RawFd,
    file_fd: RawFd,
    offset: &mut u64,
    count: usize,
) -> io::Result<usize> {
    let mut off = *offset as libc::off_t;
    // SAFETY: `off` is a valid off_t the kernel updates.
    let n = cvt_size(unsafe { libc::sendfile(sock_fd, file_fd, &mut off, count) })?;
    *offset = off as u64;
    Ok(n)
}

/// `pread(2)` of up to `max` bytes appended to `buf`, into its spare capacity: nothing is
/// zero-filled first. Returns the bytes read.
pub fn pread_append(fd: RawFd, buf: &mut Vec<u8>, max: usize, offset: u64) -> io::Result<usize> {
    buf.reserve(max);
    let spare = buf.spare_capacity_mut();
    let max = max.min(spare.len());
    // SAFETY: `spare` is valid for writes of `max` bytes; the kernel writes at most that.
    let n = cvt_size(unsafe {
        libc::pread(
            fd,
            spare.as_mut_ptr() as *mut libc::c_void,
            max,
            offset as libc::off_t,
        )
    })?;
    // SAFETY: the kernel initialised `n` bytes of the spare capacity.
    unsafe { buf.set_len(buf.len() + n) };
    Ok(n)
}

/// `pread(2)`.
pub fn pread(fd: RawFd, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    // SAFETY: buf is valid for writes of buf.len() bytes.
    cvt_size(unsafe {
        libc::pread(
            fd,
            buf.as_mut_ptr() as *mut libc::c_void,
            buf.len(),
            offset as libc::off_t,
        )
    })
}

pub fn close(fd: RawFd) {
    // SAFETY: the caller owns `fd` and never uses it again.
    unsafe { libc::close(fd) };
}

/// `shutdown(SHUT_WR)`: sends FIN, keeps reading possible (lingering close).
pub fn shutdown_write(fd: RawFd) {
    // SAFETY: plain system call.
    unsafe { libc::shutdown(fd, libc::SHUT_WR) };
}

fn setsockopt_int(
    fd: RawFd,
    level: libc::c_int,
    name: libc::c_int,
    val: libc::c_int,
) -> io::Result<()> {
    // SAFETY: `val` lives across the call and its size is given.
    cvt(unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            &val as *const _ as *const libc::c_void,
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    })?;
    Ok(())
}

pub fn set_nodelay(fd: RawFd, on: bool) -> io::Result<()> {
    setsockopt_int(fd, libc::IPPROTO_TCP, libc::TCP_NODELAY, on as libc::c_int)
}

/// `SO_KEEPALIVE` (`proxy_socket_keepalive on`): TCP keep-alive probes on an upstream socket.
pub fn set_keepalive(fd: RawFd, on: bool) -> io::Result<()> {
    setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_KEEPALIVE, on as libc::c_int)
}

/// `TCP_DEFER_ACCEPT`: the kernel reports a connection to `accept` only once data arrived (or
/// after `secs`).
pub fn set_defer_accept(fd: RawFd, secs: i32) -> io::Result<()> {
    setsockopt_int(fd, libc::IPPROTO_TCP, libc::TCP_DEFER_ACCEPT, secs)
}

/// The accept queue of a listening TCP socket, from `TCP_INFO`: for a socket in LISTEN state
/// Linux reports the current queue length in `tcpi_unacked` and the backlog limit in
/// `tcpi_sacked` (net/ipv4/tcp.c, tcp_get_info).
pub fn listen_queue(fd: RawFd) -> io::Result<(u32, u32)> {
    let mut info = MaybeUninit::<libc::tcp_info>::zeroed();
    let mut len = size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: info and len are valid for writes of the sizes given.
    cvt(unsafe {
        libc::getsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            info.as_mut_ptr() as *mut libc::c_void,
            &mut len,
        )
    })?;
    // SAFETY: zeroed then (partly) written by the kernel: every bit pattern is a valid tcp_info.
    let info = unsafe { info.assume_init() };
    Ok((info.tcpi_unacked, info.tcpi_sacked))
}

/// Whether a datagram waits in socket `fd`'s receive queue (`FIONREAD` on a datagram socket
/// is the size of the next one; an empty datagram reads as none).
pub fn datagram_waiting(fd: RawFd) -> bool {
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD writes one int.
    let r = unsafe { libc::ioctl(fd, libc::FIONREAD, &mut n) };
    r == 0 && n > 0
}

/// `getsockname(2)`: the bound address (a port-0 bind resolves to the real port).
pub fn local_addr(fd: RawFd) -> io::Result<SocketAddr> {
    let mut storage = MaybeUninit::<libc::sockaddr_storage>::zeroed();
    let mut len = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    // SAFETY: storage and len are valid for writes of the sizes given.
    cvt(unsafe { libc::getsockname(fd, storage.as_mut_ptr() as *mut libc::sockaddr, &mut len) })?;
    // SAFETY: zeroed, then written by the kernel.
    let storage = unsafe { storage.assume_init() };
    sockaddr_to_std(&storage).ok_or_else(|| io::Error::from_raw_os_error(libc::EAFNOSUPPORT))
}

// ---------------------------------------------------------------------------------------
// Listener management on descriptors the master already holds (reload, upgrade).

/// Sets an integer socket option at `SOL_SOCKET` or `IPPROTO_TCP` level.
pub fn set_opt(
    fd: RawFd,
    level: libc::c_int,
    name: libc::c_int,
    val: libc::c_int,
) -> io::Result<()> {
    setsockopt_int(fd, level, name, val)
}

/// Reads an integer socket option.
pub fn get_opt(fd: RawFd, level: libc::c_int, name: libc::c_int) -> io::Result<libc::c_int> {
    let mut val: libc::c_int = 0;
    let mut len = size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `val` and `len` are valid for writes of the sizes given.
    cvt(unsafe {
        libc::getsockopt(
            fd,
            level,
            name,
            &mut val as *mut _ as *mut libc::c_void,
            &mut len,
        )
    })?;
    Ok(val)
}

/// `listen(2)` again on a listening socket: Linux updates the backlog in place.
pub fn relisten(fd: RawFd, backlog: i32) -> io::Result<()> {
    // SAFETY: plain system call on an integer descriptor.
    cvt(unsafe { libc::listen(fd, backlog) }).map(|_| ())
}

/// Whether `fd` is a listening TCP socket (for descriptors handed over by a previous master
/// or by systemd).
pub fn is_listening_tcp(fd: RawFd) -> bool {
    get_opt(fd, libc::SOL_SOCKET, libc::SO_ACCEPTCONN).is_ok_and(|v| v == 1)
        && get_opt(fd, libc::SOL_SOCKET, libc::SO_TYPE).is_ok_and(|v| v == libc::SOCK_STREAM)
}

/// Steers a reuseport group's new connections to the sockets at the group indices in `live`,
/// spread at random; an empty `live` detaches the program. Attaching to any socket of the group
/// replaces the group's program.
pub fn steer_reuseport_to(fd: RawFd, live: &[u32]) -> io::Result<()> {
    if live.is_empty() {
        let zero: libc::c_int = 0;
        // SAFETY: the option takes no meaningful value; a valid int is passed.
        return cvt(unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_DETACH_REUSEPORT_BPF,
                &zero as *const _ as *const libc::c_void,
                size_of::<libc::c_int>() as libc::socklen_t,
            )
        })
        .map(|_| ());
    }
    let prog = steering_program(live);
    let fprog = libc::sock_fprog {
        len: prog.len() as u16,
        filter: prog.as_ptr() as *mut libc::sock_filter,
    };
    // SAFETY: `fprog` points at `prog`, which outlives the call; the kernel copies it.
    cvt(unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_ATTACH_REUSEPORT_CBPF,
            &fprog as *const _ as *const libc::c_void,
            size_of::<libc::sock_fprog>() as libc::socklen_t,
        )
    })
    .map(|_| ())
}

/// Most sockets a steering program can choose among: two instructions per entry of its jump
/// table keep it far below cBPF's 4096-instruction limit.
pub const STEER_MAX: usize = 1024;

pub(crate) const BPF_LD_W_ABS: u16 = 0x20;
pub(crate) const BPF_ALU_MOD_K: u16 = 0x94;
pub(crate) const BPF_JMP_JEQ_K: u16 = 0x15;
pub(crate) const BPF_RET_A: u16 = 0x16;
pub(crate) const BPF_RET_K: u16 = 0x06;
/// `SKF_AD_OFF + SKF_AD_RANDOM`: a random 32-bit number. Random rather than the flow hash
/// (`SKF_AD_RXHASH`): a NIC without receive hashing leaves the hash 0 for every SYN, which
/// would send every connection to one socket.
pub(crate) const AD_RANDOM: u32 = (-0x1000i32) as u32 + 56;

/// The classic BPF program that maps every new connection to one of `live` (group indices),
/// uniformly at random: `A = random % live.len()`, then, when `live` is not simply
/// `0..live.len()`, a jump table from `A` to `live[A]`. Every path returns an entry of `live`;
/// `live` must be non-empty and hold at most [`STEER_MAX`] entries.
pub fn steering_program(live: &[u32]) -> Vec<libc::sock_filter> {
    assert!(!live.is_empty() && live.len() <= STEER_MAX);
    let ins = |code, jt, jf, k| libc::sock_filter { code, jt, jf, k };
    if live.len() == 1 {
        return vec![ins(BPF_RET_K, 0, 0, live[0])];
    }
    let mut prog = vec![
        ins(BPF_LD_W_ABS, 0, 0, AD_RANDOM),
        ins(BPF_ALU_MOD_K, 0, 0, live.len() as u32),
    ];
    if live.iter().enumerate().all(|(k, &v)| v == k as u32) {
        prog.push(ins(BPF_RET_A, 0, 0, 0));
        return prog;
    }
    // `if A == k return live[k]`: on a match fall through to the return, else skip it. The
    // last entry needs no test: `A` is below `live.len()`.
    for (k, &idx) in live.iter().enumerate().take(live.len() - 1) {
        prog.push(ins(BPF_JMP_JEQ_K, 0, 1, k as u32));
        prog.push(ins(BPF_RET_K, 0, 0, idx));
    }
    prog.push(ins(BPF_RET_K, 0, 0, live[live.len() - 1]));
    prog
}

/// Clears or sets `FD_CLOEXEC` (descriptors handed to a new binary must survive `exec`).
pub fn set_cloexec(fd: RawFd, on: bool) -> io::Result<()> {
    // SAFETY: fcntl on an integer descriptor with integer arguments.
    let flags = cvt(unsafe { libc::fcntl(fd, libc::F_GETFD) })?;
    let flags = if on {
        flags | libc::FD_CLOEXEC
    } else {
        flags & !libc::FD_CLOEXEC
    };
    // SAFETY: as above.
    cvt(unsafe { libc::fcntl(fd, libc::F_SETFD, flags) }).map(|_| ())
}

/// Sets `O_NONBLOCK` (descriptors handed over by systemd are usually blocking, and a worker
/// must never block in `accept`).
pub fn set_nonblocking(fd: RawFd) -> io::Result<()> {
    // SAFETY: fcntl on an integer descriptor with integer arguments.
    let flags = cvt(unsafe { libc::fcntl(fd, libc::F_GETFL) })?;
    // SAFETY: as above.
    cvt(unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) }).map(|_| ())
}

// ---------------------------------------------------------------------------------------
// Outgoing connections (the stream module's upstreams).

fn std_to_sockaddr(addr: &SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: an all-zero sockaddr_storage is a valid value.
    let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match addr {
        SocketAddr::V4(a) => {
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in.
            let sin = unsafe { &mut *(&mut storage as *mut _ as *mut libc::sockaddr_in) };
            sin.sin_family = libc::AF_INET as libc::sa_family_t;
            sin.sin_port = a.port().to_be();
            sin.sin_addr.s_addr = u32::from(*a.ip()).to_be();
            size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in6.
            let sin6 = unsafe { &mut *(&mut storage as *mut _ as *mut libc::sockaddr_in6) };
            sin6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            sin6.sin6_port = a.port().to_be();
            sin6.sin6_addr.s6_addr = a.ip().octets();
            sin6.sin6_flowinfo = a.flowinfo();
            sin6.sin6_scope_id = a.scope_id();
            size_of::<libc::sockaddr_in6>()
        }
    };
    (storage, len as libc::socklen_t)
}

/// The outcome of starting a nonblocking `connect`.
#[derive(Debug)]
pub enum Connect {
    /// Connected at once (possible on loopback).
    Done(OwnedFd),
    /// `EINPROGRESS`: wait for writability, then check [`take_error`].
    InProgress(OwnedFd),
}

/// A new nonblocking, close-on-exec TCP socket connecting to `addr`. On an immediate failure
/// the socket is closed and the error returned.
pub fn connect_nonblocking(addr: &SocketAddr) -> io::Result<Connect> {
    connect_nonblocking_from(addr, None, false).map_err(|e| match e {
        ConnectError::Bind(e) | ConnectError::Connect(e) | ConnectError::Transparent(e) => e,
    })
}

/// Why [`connect_nonblocking_from`] failed.
#[derive(Debug)]
pub enum ConnectError {
    /// `bind` to the local address (nginx's `bind(ADDR) failed`).
    Bind(io::Error),
    /// `IP_TRANSPARENT` refused (nginx's `setsockopt(IP_TRANSPARENT) failed`).
    Transparent(io::Error),
    /// `socket` or `connect`.
    Connect(io::Error),
}

/// Like [`connect_nonblocking`], from the local address `local` when given (`proxy_bind`):
/// with port 0, `IP_BIND_ADDRESS_NO_PORT` lets the kernel choose the port at `connect`, so
/// that many connections from one address to different upstreams share ports, as nginx does.
pub fn connect_nonblocking_from(
    addr: &SocketAddr,
    local: Option<SocketAddr>,
    transparent: bool,
) -> Result<Connect, ConnectError> {
    let domain = if addr.is_ipv4() {
        libc::AF_INET
    } else {
        libc::AF_INET6
    };
    // SAFETY: plain system call without pointers.
    let fd = cvt(unsafe {
        libc::socket(
            domain,
            libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            libc::IPPROTO_TCP,
        )
    })
    .map_err(ConnectError::Connect)?;
    // SAFETY: socket returned a new descriptor that nothing else owns; dropping it on an
    // error below closes it.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    if let Some(local) = local {
        // `transparent`: the local address may be one this host does not have.
        if transparent {
            let (level, opt) = if local.is_ipv4() {
                (libc::SOL_IP, libc::IP_TRANSPARENT)
            } else {
                (libc::SOL_IPV6, libc::IPV6_TRANSPARENT)
            };
            set_opt(fd, level, opt, 1).map_err(ConnectError::Transparent)?;
        }
        if local.port() == 0 {
            let _ = set_opt(fd, libc::SOL_IP, libc::IP_BIND_ADDRESS_NO_PORT, 1);
        }
        let (storage, len) = std_to_sockaddr(&local);
        // SAFETY: `storage` holds a valid sockaddr of `len` bytes for the duration of the call.
        cvt(unsafe { libc::bind(fd, &storage as *const _ as *const libc::sockaddr, len) })
            .map_err(ConnectError::Bind)?;
    }
    let (storage, len) = std_to_sockaddr(addr);
    // SAFETY: `storage` holds a valid sockaddr of `len` bytes for the duration of the call.
    let r = cvt(unsafe { libc::connect(fd, &storage as *const _ as *const libc::sockaddr, len) });
    match r {
        Ok(_) => Ok(Connect::Done(owned)),
        Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => Ok(Connect::InProgress(owned)),
        Err(e) => Err(ConnectError::Connect(e)),
    }
}

/// A nonblocking UDP socket connected to `addr` (a DNS server): the kernel picks a random
/// source port, and only `addr`'s datagrams are received on it.
pub fn udp_connected(addr: &SocketAddr) -> io::Result<OwnedFd> {
    let domain = if addr.is_ipv4() {
        libc::AF_INET
    } else {
        libc::AF_INET6
    };
    // SAFETY: plain system call without pointers.
    let fd = cvt(unsafe {
        libc::socket(
            domain,
            libc::SOCK_DGRAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            libc::IPPROTO_UDP,
        )
    })?;
    // SAFETY: socket returned a new descriptor that nothing else owns.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    let (storage, len) = std_to_sockaddr(addr);
    // SAFETY: `storage` holds a valid sockaddr of `len` bytes for the duration of the call.
    cvt(unsafe { libc::connect(fd, &storage as *const _ as *const libc::sockaddr, len) })?;
    Ok(owned)
}

/// `recvfrom(2)` of one datagram into `buf`: its length (0 for an empty datagram) and sender.
pub fn recv_from(fd: RawFd, buf: &mut [u8]) -> io::Result<(usize, Option<SocketAddr>)> {
    let mut storage = MaybeUninit::<libc::sockaddr_storage>::zeroed();
    let mut len = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    // SAFETY: buf is valid for writes of buf.len() bytes; storage and len for their sizes.
    let n = cvt_size(unsafe {
        libc::recvfrom(
            fd,
            buf.as_mut_ptr() as *mut libc::c_void,
            buf.len(),
            0,
            storage.as_mut_ptr() as *mut libc::sockaddr,
            &mut len,
        )
    })?;
    // SAFETY: recvfrom filled the storage (or left it zeroed, an unknown family).
    let from = sockaddr_to_std(unsafe { storage.assume_init_ref() });
    Ok((n, from))
}

/// `sendto(2)` of one datagram to `addr`.
pub fn send_to(fd: RawFd, buf: &[u8], addr: &SocketAddr) -> io::Result<usize> {
    let (storage, len) = std_to_sockaddr(addr);
    // SAFETY: buf is valid for reads of buf.len() bytes; storage holds a sockaddr of len.
    cvt_size(unsafe {
        libc::sendto(
            fd,
            buf.as_ptr() as *const libc::c_void,
            buf.len(),
            libc::MSG_DONTWAIT,
            &storage as *const _ as *const libc::sockaddr,
            len,
        )
    })
}

/// `sendmsg(2)` of `buf` to `addr` as datagrams of `segment` bytes each (the last may be
/// shorter), cut by the kernel (`UDP_SEGMENT`, Linux 4.18+): one system call for many.
pub fn send_to_segmented(
    fd: RawFd,
    buf: &[u8],
    addr: &SocketAddr,
    segment: u16,
) -> io::Result<usize> {
    let (mut storage, len) = std_to_sockaddr(addr);
    let mut iov = libc::iovec {
        iov_base: buf.as_ptr() as *mut libc::c_void,
        iov_len: buf.len(),
    };
    // Room for one control message of a u16, 8-byte aligned.
    let mut control = [0u64; 4];
    // SAFETY: a zeroed msghdr is valid; every pointer set below outlives the call, and the
    // control message is written inside `control` (CMSG_SPACE(2) <= 32 bytes).
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_name = &mut storage as *mut _ as *mut libc::c_void;
        msg.msg_namelen = len;
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr() as *mut libc::c_void;
        msg.msg_controllen = libc::CMSG_SPACE(2) as usize;
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        (*cmsg).cmsg_level = libc::SOL_UDP;
        (*cmsg).cmsg_type = libc::UDP_SEGMENT;
        (*cmsg).cmsg_len = libc::CMSG_LEN(2) as usize;
        std::ptr::write_unaligned(libc::CMSG_DATA(cmsg) as *mut u16, segment);
        cvt_size(libc::sendmsg(fd, &msg, libc::MSG_DONTWAIT))
    }
}

/// A nonblocking datagram socket connected to the Unix-domain socket at `path` (a syslog
/// daemon's `/dev/log`).
pub fn unix_datagram_connected(path: &std::path::Path) -> io::Result<OwnedFd> {
    // SAFETY: plain system call without pointers.
    let fd = cvt(unsafe {
        libc::socket(
            libc::AF_UNIX,
            libc::SOCK_DGRAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    })?;
    // SAFETY: socket returned a new descriptor that nothing else owns.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    let (sun, len) = unix_sockaddr(path)?;
    // SAFETY: `sun` is a valid sockaddr_un of at least `len` bytes for the call.
    cvt(unsafe { libc::connect(fd, &sun as *const _ as *const libc::sockaddr, len) })?;
    Ok(owned)
}

/// The `sockaddr_un` of `path` and its length (`ENAMETOOLONG` when it does not fit).
fn unix_sockaddr(path: &std::path::Path) -> io::Result<(libc::sockaddr_un, libc::socklen_t)> {
    use std::os::unix::ffi::OsStrExt;
    // SAFETY: all-zero is a valid sockaddr_un.
    let mut sun: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    sun.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = path.as_os_str().as_bytes();
    if bytes.len() >= sun.sun_path.len() {
        return Err(io::Error::from_raw_os_error(libc::ENAMETOOLONG));
    }
    for (d, &b) in sun.sun_path.iter_mut().zip(bytes) {
        *d = b as libc::c_char;
    }
    let len = (std::mem::size_of::<libc::sa_family_t>() + bytes.len() + 1) as libc::socklen_t;
    Ok((sun, len))
}

/// A nonblocking connect to the Unix-domain stream socket at `path` (an upstream `server
/// unix:/path`). A full listen queue is `EAGAIN`, an error as nginx treats it.
pub fn connect_unix_nonblocking(path: &std::path::Path) -> io::Result<Connect> {
    // SAFETY: plain system call without pointers.
    let fd = cvt(unsafe {
        libc::socket(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    })?;
    // SAFETY: socket returned a new descriptor that nothing else owns.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    let (sun, len) = unix_sockaddr(path)?;
    // SAFETY: `sun` is a valid sockaddr_un of at least `len` bytes for the call.
    let r = cvt(unsafe { libc::connect(fd, &sun as *const _ as *const libc::sockaddr, len) });
    match r {
        Ok(_) => Ok(Connect::Done(owned)),
        Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => Ok(Connect::InProgress(owned)),
        Err(e) => Err(e),
    }
}

/// `SO_ERROR`: the pending error of a socket (a finished nonblocking `connect`), cleared.
pub fn take_error(fd: RawFd) -> io::Result<Option<io::Error>> {
    let v = get_opt(fd, libc::SOL_SOCKET, libc::SO_ERROR)?;
    Ok((v != 0).then(|| io::Error::from_raw_os_error(v)))
}

/// `getpeername(2)`: the connected peer (`ENOTCONN` while a `connect` is still in progress).
pub fn peer_addr(fd: RawFd) -> io::Result<SocketAddr> {
    let mut storage = MaybeUninit::<libc::sockaddr_storage>::zeroed();
    let mut len = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    // SAFETY: storage and len are valid for writes of the sizes given.
    cvt(unsafe { libc::getpeername(fd, storage.as_mut_ptr() as *mut libc::sockaddr, &mut len) })?;
    // SAFETY: zeroed, then written by the kernel.
    let storage = unsafe { storage.assume_init() };
    sockaddr_to_std(&storage).ok_or_else(|| io::Error::from_raw_os_error(libc::EAFNOSUPPORT))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A model of the kernel's cBPF interpreter for the instructions a steering program uses;
    /// `random` is what `SKF_AD_RANDOM` would load.
    fn run(prog: &[libc::sock_filter], random: u32) -> u32 {
        let (mut a, mut pc) = (0u32, 0usize);
        loop {
            let i = prog[pc];
            pc += 1;
            match i.code {
                BPF_LD_W_ABS => {
                    assert_eq!(i.k, AD_RANDOM, "only the random ancillary load is used");
                    a = random;
                }
                BPF_ALU_MOD_K => {
                    assert_ne!(i.k, 0, "the kernel rejects a modulo by zero");
                    a %= i.k;
                }
                BPF_JMP_JEQ_K => pc += usize::from(if a == i.k { i.jt } else { i.jf }),
                BPF_RET_A => return a,
                BPF_RET_K => return i.k,
                c => panic!("unexpected opcode {c:#x}"),
            }
            assert!(pc < prog.len(), "fell off the end of the program");
        }
    }

    fn check(live: &[u32]) {
        let prog = steering_program(live);
        assert!(prog.len() <= 4096);
        let n = live.len() as u32;
        // Every residue of the random input reaches a different live socket, so the spread
        // over the live sockets is as even as the random numbers.
        let mut hit = vec![0u32; live.len()];
        for r in (0..3 * n).chain([u32::MAX, u32::MAX - 1, u32::MAX / 2, 0x8000_0000]) {
            let out = run(&prog, r);
            let k = live
                .iter()
                .position(|&v| v == out)
                .unwrap_or_else(|| panic!("{live:?}: input {r} went to {out}, not a live shard"));
            assert_eq!(k as u32, r % n, "{live:?}: input {r}");
            hit[k] += 1;
        }
        assert!(hit.iter().all(|&h| h > 0), "{live:?}: {hit:?}");
    }

    /// Calls `check` with every subset of the first `every` shards, `random` pseudo-random
    /// subsets of 64, `0..n` and `[n - 1]` for every n up to 64, and the longest list.
    pub(crate) fn each_live_set(every: u32, random: usize, mut check: impl FnMut(&[u32])) {
        for mask in 1u32..(1 << every) {
            let live: Vec<u32> = (0..every).filter(|b| mask & (1 << b) != 0).collect();
            check(&live);
        }
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for _ in 0..random {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let live: Vec<u32> = (0..64).filter(|b| x & (1 << b) != 0).collect();
            if !live.is_empty() {
                check(&live);
            }
        }
        for n in 1..=64 {
            check(&(0..n).collect::<Vec<_>>());
            check(&[n - 1]);
        }
        check(&(0..STEER_MAX as u32).rev().collect::<Vec<_>>());
    }

    #[test]
    fn every_live_set_of_up_to_64_shards_gets_every_connection() {
        each_live_set(12, 20_000, check);
    }
}
