//! Listening sockets and shards, created by the master and held by it for the life of an address.
//!
//! A listener is one configured address. Without `reuseport` it is one shared socket that every
//! worker polls. With `reuseport` it is a group of `SO_REUSEPORT` sockets, one *shard* per
//! worker (or `shards=N`): shard k is polled by worker k (or by workers `k mod N`). The master
//! creates every shard before forking and never closes one while the address is configured,
//! for two reasons that come from Linux:
//! - closing one socket of a reuseport group resets the connections queued on it (unless
//!   `net.ipv4.tcp_migrate_req=1`, Linux 5.14+), so a dying worker must not take its shard with it;
//! - the kernel picks a socket by index in the group (`reuseport_select_sock`), and closing
//!   one moves the last socket into its slot, so keeping all of them open keeps indices stable.
//!
//! Reload and upgrade follow from the same rule. Sockets are matched by address and reused as
//! they are, shards by index; changed options are re-applied. A group that needs more shards
//! grows by binding new ones; one that needs fewer keeps its extra shards open, steers new
//! connections away from them with a reuseport BPF program, and has workers drain what was
//! already queued on them, so no reload resets a connection whatever `tcp_migrate_req` says.
//! Turning `reuseport` on makes the shared socket shard 0 of a new group; turning it off steers
//! every new connection to shard 0, which then serves as the shared socket.
//!
//! Every worker inherits every shard's descriptor, so a sibling could take over a stalled
//! worker's queue later; this module only creates and describes them.

use std::collections::HashMap;
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
    /// The sockets form a `SO_REUSEPORT` group (even when the configuration no longer asks for
    /// `reuseport`: a group is never dissolved while its address lives).
    pub reuseport: bool,
    /// Every socket of the address, in group order.
    pub fds: Vec<RawFd>,
    /// New connections go to `fds[..active]` only; the rest are drained.
    pub active: usize,
    /// Each worker polls its own shard alone (`reuseport` with one shard per worker).
    pub per_worker: bool,
    pub backlog: i32,
    pub n_workers: usize,
    pub opts: ListenOpts,
    /// The sockets came from systemd (`LISTEN_FDS`): without `backlog=` they keep the backlog
    /// their `.socket` unit gave them.
    pub systemd: bool,
    /// The group indices the attached steering program sends new connections to, and whether
    /// it deals them in turn (eBPF) rather than at random (cBPF); `None` when no program is
    /// attached (the kernel's hash over every socket).
    program: Option<(Vec<u32>, bool)>,
    /// The kernel refused a program once (logged once per address).
    pub steer_refused: bool,
    /// `bpf(2)` refused the dealing program once: the group falls back to the random one.
    pub deal_refused: bool,
    /// A `quic` group steered by connection ID (`None`: the kernel's hash places datagrams).
    pub quic: Option<QuicPlane>,
}

/// A `quic` group's steering plane: every socket has a key (below
/// `shard_event::bpf::QUIC_KEYS`) that the worker reading it writes into the first two bytes
/// of every connection ID it issues, and the group's program sends each datagram that
/// carries such an ID to that key's socket (`shard_event::bpf::quic_program`), so a client
/// whose address changes still reaches its worker. A reload gives the new generation fresh
/// sockets and keys and keeps the old ones for the stopping workers, which go on receiving
/// their connections' datagrams while new connections (Initial packets) go only to the fresh
/// sockets of live workers.
#[derive(Debug)]
pub struct QuicPlane {
    steering: shard_event::bpf::QuicSteering,
    /// The keys of `OpenListener::fds`, in the same order.
    pub keys: Vec<u32>,
    /// Sockets of earlier generations, read by their stopping workers: (generation, socket,
    /// key). The master's copy closes once no worker of that generation runs.
    pub retired: Vec<(u64, RawFd, u32)>,
    /// Keys of the master this one upgraded from (its workers drain their connections on
    /// its sockets, still in the array): never given out here.
    reserved: Vec<u32>,
    next_key: u32,
    /// The keys new connections go to, as attached.
    fresh: Vec<u32>,
}

impl QuicPlane {
    fn take_key(&mut self) -> u32 {
        loop {
            let k = self.next_key;
            self.next_key = (self.next_key + 1) % shard_event::bpf::QUIC_KEYS;
            if !self.keys.contains(&k)
                && !self.retired.iter().any(|r| r.2 == k)
                && !self.reserved.contains(&k)
            {
                return k;
            }
        }
    }

    fn attach(&mut self, fd: RawFd, fresh: Vec<u32>) -> io::Result<()> {
        if fresh == self.fresh {
            return Ok(());
        }
        self.steering.attach(fd, &fresh)?;
        self.fresh = fresh;
        Ok(())
    }
}

/// Steers a new `quic` group by connection ID, in the socket array of the master this one
/// upgraded from when there is one (`inherited`: its descriptor and keys). Where `bpf(2)`
/// refuses (no `CAP_BPF`), the kernel's hash of the client's address places datagrams: said
/// once per address.
pub fn quic_start(ol: &mut OpenListener, inherited: Option<(RawFd, Vec<u32>)>) {
    if !ol.opts.quic || !ol.reuseport || ol.quic.is_some() {
        if let Some((fd, _)) = inherited {
            shard_event::sock::close(fd);
        }
        return;
    }
    let res = (|| -> io::Result<QuicPlane> {
        if ebpf_disabled_for_test() {
            return Err(io::Error::from_raw_os_error(libc::EPERM));
        }
        let (steering, reserved) = match inherited {
            // SAFETY: a descriptor the previous master handed over for this, owned by
            // nobody else here.
            Some((fd, keys)) => (
                shard_event::bpf::QuicSteering::from_map(unsafe {
                    std::os::fd::FromRawFd::from_raw_fd(fd)
                }),
                keys,
            ),
            None => (shard_event::bpf::QuicSteering::new()?, Vec::new()),
        };
        let next_key = reserved
            .iter()
            .max()
            .map_or(0, |k| (k + 1) % shard_event::bpf::QUIC_KEYS);
        let mut plane = QuicPlane {
            steering,
            keys: Vec::new(),
            retired: Vec::new(),
            reserved,
            next_key,
            fresh: Vec::new(),
        };
        for &fd in &ol.fds {
            let k = plane.take_key();
            plane.steering.insert(k, fd)?;
            plane.keys.push(k);
        }
        let fresh = plane.keys[..ol.active.min(plane.keys.len())].to_vec();
        plane.attach(ol.fds[0], fresh)?;
        Ok(plane)
    })();
    match res {
        Ok(plane) => {
            crate::log!(
                Info,
                "QUIC datagrams to {} are steered by connection ID (eBPF)",
                ol.addr
            );
            ol.quic = Some(plane);
        }
        Err(e) => crate::log!(
            Notice,
            "QUIC datagrams to {} are placed by the kernel's hash of the client's address \
             (eBPF: {}): a client whose address changes may reach another worker",
            ol.addr,
            shard_event::os_error_text(&e)
        ),
    }
}

/// A new generation of a steered `quic` group: fresh sockets and keys for its `n_workers`
/// workers; the old sockets stay open (retired, with `old_generation`) for the old workers,
/// which drain their connections on them; new connections go to the fresh ones only.
pub fn quic_renew(ol: &mut OpenListener, old_generation: u64, n_workers: usize) -> io::Result<()> {
    let Some(plane) = ol.quic.as_mut() else {
        return Ok(());
    };
    let mut fds = Vec::with_capacity(n_workers);
    let mut keys = Vec::with_capacity(n_workers);
    let fail = |fds: Vec<RawFd>, e: io::Error| {
        for fd in fds {
            shard_event::sock::close(fd);
        }
        Err(e)
    };
    for _ in 0..n_workers {
        let fd = match new_socket(&ol.addr, &ol.opts, false, true) {
            Ok(fd) => fd,
            Err(ShardError::Io(e) | ShardError::Refused(e)) => return fail(fds, e),
        };
        fds.push(fd);
        let k = plane.take_key();
        if let Err(e) = plane.steering.insert(k, fd) {
            return fail(fds, e);
        }
        keys.push(k);
    }
    for (fd, key) in ol.fds.drain(..).zip(plane.keys.drain(..)) {
        plane.retired.push((old_generation, fd, key));
    }
    ol.fds = fds;
    ol.active = n_workers;
    ol.per_worker = true;
    ol.n_workers = n_workers;
    plane.keys = keys;
    let fresh = plane.keys.clone();
    plane.attach(ol.fds[0], fresh)
}

/// Closes the master's copies of retired `quic` sockets whose generation no longer runs
/// (`running` says which do).
pub fn quic_release(ol: &mut OpenListener, running: impl Fn(u64) -> bool) {
    let Some(plane) = ol.quic.as_mut() else {
        return;
    };
    plane.retired.retain(|&(g, fd, _)| {
        let keep = running(g);
        if !keep {
            shard_event::sock::close(fd);
        }
        keep
    });
}

/// New connections of a steered `quic` group go to the sockets of the workers `weights`
/// leaves live (all of them when none is). True: nothing else to follow.
fn quic_steer(l: &mut OpenListener, weights: &[u32]) -> bool {
    let Some(plane) = l.quic.as_mut() else {
        return true;
    };
    let n = l.active.min(plane.keys.len());
    let mut fresh: Vec<u32> = (0..n)
        .filter(|&j| weights.get(j).is_none_or(|&w| w > 0))
        .map(|j| plane.keys[j])
        .collect();
    if fresh.is_empty() {
        fresh = plane.keys[..n].to_vec();
    }
    if let Err(e) = plane.attach(l.fds[0], fresh) {
        crate::log!(
            Alert,
            "steering QUIC datagrams to {} failed ({})",
            l.addr,
            shard_event::os_error_text(&e)
        );
        return false;
    }
    true
}

impl OpenListener {
    /// The key of worker `idx`'s socket in a steered `quic` group (its connection IDs carry
    /// it).
    pub fn quic_key(&self, idx: usize) -> Option<u32> {
        let p = self.quic.as_ref()?;
        p.keys.get(idx % self.active.max(1)).copied()
    }

    /// The `quic` socket worker `idx` reads: every datagram of a QUIC connection must reach
    /// the worker that holds it, so with `reuseport` each worker reads its own socket (the
    /// group's program or the kernel's hash places datagrams), and a shared socket is read
    /// by worker 0 alone.
    pub fn quic_fd_for_worker(&self, idx: usize) -> Option<RawFd> {
        if self.reuseport {
            Some(self.fd_for_worker(idx))
        } else {
            (idx == 0).then(|| self.fds[0])
        }
    }

    /// The `quic` sockets worker `idx` does not read: its siblings' and earlier generations'.
    /// A new worker closes its copies, so that a socket closes once its own worker and the
    /// master let it go.
    pub fn quic_foreign_fds(&self, idx: usize) -> Vec<RawFd> {
        if !self.opts.quic {
            return Vec::new();
        }
        let own = self.quic_fd_for_worker(idx);
        let mut v: Vec<RawFd> = self
            .fds
            .iter()
            .copied()
            .filter(|&fd| Some(fd) != own)
            .collect();
        if let Some(p) = &self.quic {
            v.extend(p.retired.iter().map(|r| r.1));
        }
        v
    }
}

impl OpenListener {
    /// Forgets which program the group runs (another master may have replaced it), so that
    /// the next `steer` attaches one whatever it would be.
    pub fn forget_program(&mut self) {
        if self.reuseport {
            self.program = Some((Vec::new(), false));
        }
        if let Some(p) = &mut self.quic {
            p.fresh.clear();
        }
    }

    /// How this group places new connections, as `shm::PROGRAM_*`: dealt in turn, or at
    /// random (the kernel's hash, or the classic program's draw).
    pub fn program_kind(&self) -> u64 {
        if self.dealt() {
            crate::shm::PROGRAM_ROUND_ROBIN
        } else {
            crate::shm::PROGRAM_RANDOM
        }
    }

    /// Whether the group's program deals in turn (kept so through a reload).
    fn dealt(&self) -> bool {
        matches!(&self.program, Some((live, true)) if !live.is_empty())
    }

    /// Whether worker `idx` is the only one polling its socket (a per-worker shard).
    pub fn owned_by_one(&self) -> bool {
        self.per_worker
    }

    /// The workers that poll socket `k` of this listener.
    pub fn pollers(&self, k: usize) -> Vec<usize> {
        if k >= self.active {
            return vec![k % self.n_workers.max(1)];
        }
        (0..self.n_workers)
            .filter(|w| w % self.active == k)
            .collect()
    }

    /// The socket worker `idx` accepts new connections from.
    pub fn fd_for_worker(&self, idx: usize) -> RawFd {
        self.fds[idx % self.active.max(1)]
    }

    /// Sockets no longer chosen by the kernel that worker `idx` drains (after a reload lowered
    /// the number of shards).
    pub fn draining_for_worker(&self, idx: usize) -> Vec<RawFd> {
        (self.active..self.fds.len())
            .filter(|j| j % self.n_workers.max(1) == idx)
            .map(|j| self.fds[j])
            .collect()
    }

    /// Closes every socket (the address left the configuration).
    pub fn close(self) {
        for fd in self.fds {
            shard_event::sock::close(fd);
        }
        for (_, fd, _) in self.quic.into_iter().flat_map(|p| p.retired) {
            shard_event::sock::close(fd);
        }
    }
}

/// Set when the kernel refused `SO_REUSEPORT` once, so it is reported only once.
static REUSEPORT_WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn os_err(what: &str, addr: &SocketAddr, e: io::Error) -> io::Error {
    io::Error::new(
        e.kind(),
        format!("{what} {addr} failed ({})", shard_event::os_error_text(&e)),
    )
}

fn socket_for(addr: &SocketAddr, opts: &ListenOpts, tcp_nodelay: bool) -> io::Result<Socket> {
    if opts.unix.is_some() {
        return Socket::new(Domain::UNIX, Type::STREAM.cloexec().nonblocking(), None);
    }
    let (ty, proto) = if opts.udp {
        (Type::DGRAM, Protocol::UDP)
    } else {
        (Type::STREAM, Protocol::TCP)
    };
    let s = Socket::new(
        Domain::for_address(*addr),
        ty.cloexec().nonblocking(),
        Some(proto),
    )?;
    s.set_reuse_address(true)?;
    if addr.is_ipv6() {
        s.set_only_v6(opts.ipv6only)?;
    }
    if opts.udp {
        return Ok(s);
    }
    // Accepted sockets inherit TCP_NODELAY from the listener on Linux (the child socket is a
    // clone of the listener), which saves one setsockopt per connection.
    if tcp_nodelay {
        s.set_nodelay(true)?;
    }
    Ok(s)
}

/// Options that may change on a live socket: applied at creation and again on every reload.
fn apply_opts(fd: RawFd, addr: &SocketAddr, opts: &ListenOpts) -> io::Result<()> {
    use shard_event::sock::set_opt;
    if let Some(n) = opts.rcvbuf {
        set_opt(fd, libc::SOL_SOCKET, libc::SO_RCVBUF, n as i32)
            .map_err(|e| os_err("setsockopt(SO_RCVBUF) for", addr, e))?;
    }
    if let Some(n) = opts.sndbuf {
        set_opt(fd, libc::SOL_SOCKET, libc::SO_SNDBUF, n as i32)
            .map_err(|e| os_err("setsockopt(SO_SNDBUF) for", addr, e))?;
    }
    if opts.unix.is_some() || opts.udp {
        return Ok(());
    }
    match opts.so_keepalive {
        Some(SoKeepalive::On) => set_opt(fd, libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1)?,
        Some(SoKeepalive::Off) => set_opt(fd, libc::SOL_SOCKET, libc::SO_KEEPALIVE, 0)?,
        None => {}
    }
    // TCP_DEFER_ACCEPT: seconds to wait for data before accept() reports the connection.
    set_opt(
        fd,
        libc::IPPROTO_TCP,
        libc::TCP_DEFER_ACCEPT,
        opts.deferred as i32,
    )
    .map_err(|e| os_err("setsockopt(TCP_DEFER_ACCEPT) for", addr, e))?;
    Ok(())
}

fn bind_listen(s: &Socket, addr: &SocketAddr, opts: &ListenOpts) -> io::Result<RawFd> {
    if let Some(path) = &opts.unix {
        // As nginx: a file left at the path fails the bind (EADDRINUSE); the socket is made
        // reachable by every user (the workers run as another one), 0666.
        let text = format!("bind() to unix:{} failed", path.display());
        let sa = socket2::SockAddr::unix(path)
            .map_err(|e| io::Error::new(e.kind(), format!("{text} ({e})")))?;
        s.bind(&sa).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("{text} ({})", shard_event::os_error_text(&e)),
            )
        })?;
        use std::os::unix::fs::PermissionsExt;
        if let Err(e) = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666)) {
            crate::log!(Alert, "chmod() \"{}\" failed ({e})", path.display());
        }
        s.listen(opts.backlog).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!(
                    "listen() to unix:{} failed ({})",
                    path.display(),
                    shard_event::os_error_text(&e)
                ),
            )
        })?;
        return Ok(std::os::fd::AsRawFd::as_raw_fd(s));
    }
    s.bind(&(*addr).into())
        .map_err(|e| os_err("bind() to", addr, e))?;
    if opts.udp {
        // A datagram socket is bound only.
        let fd = std::os::fd::AsRawFd::as_raw_fd(s);
        apply_opts(fd, addr, opts)?;
        return Ok(fd);
    }
    s.listen(opts.backlog)
        .map_err(|e| os_err("listen() to", addr, e))?;
    let fd = std::os::fd::AsRawFd::as_raw_fd(s);
    apply_opts(fd, addr, opts)?;
    Ok(fd)
}

/// Whether tests asked to simulate a kernel without `SO_REUSEPORT` (see docs/directives.md).
fn reuseport_disabled_for_test() -> bool {
    std::env::var_os("SHARD_TEST_NO_REUSEPORT").is_some()
}

/// A kernel that refuses reuseport programs (`SO_ATTACH_REUSEPORT_CBPF`), for the tests.
fn cbpf_disabled_for_test() -> bool {
    std::env::var_os("SHARD_TEST_NO_CBPF").is_some()
}

/// A master that may not load eBPF (no `CAP_BPF`), for the tests; implied by a kernel that
/// refuses every reuseport program.
fn ebpf_disabled_for_test() -> bool {
    std::env::var_os("SHARD_TEST_NO_EBPF").is_some() || cbpf_disabled_for_test()
}

/// Said once per master: every group falls back alike.
static DEAL_REFUSED_SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn warn_refused(addr: &SocketAddr, e: &io::Error) {
    if !REUSEPORT_WARNED.swap(true, std::sync::atomic::Ordering::Relaxed) {
        crate::log!(
            Warn,
            "setsockopt(SO_REUSEPORT) failed ({}), reuseport is not supported here: \
             falling back to a shared socket for {} and every other reuseport listener",
            shard_event::os_error_text(e),
            addr
        );
    }
}

/// One new socket, in the address's reuseport group when `group`.
fn new_socket(
    addr: &SocketAddr,
    opts: &ListenOpts,
    tcp_nodelay: bool,
    group: bool,
) -> Result<RawFd, ShardError> {
    let s = socket_for(addr, opts, tcp_nodelay).map_err(ShardError::Io)?;
    if group {
        if reuseport_disabled_for_test() {
            return Err(ShardError::Refused(io::Error::from_raw_os_error(
                libc::ENOPROTOOPT,
            )));
        }
        s.set_reuse_port(true).map_err(ShardError::Refused)?;
    }
    bind_listen(&s, addr, opts).map_err(ShardError::Io)?;
    Ok(s.into_raw_fd())
}

enum ShardError {
    Refused(io::Error),
    Io(io::Error),
}

/// Sockets the master starts with instead of binding: from a previous master (binary upgrade,
/// `SHARD_INHERIT`) or from systemd (`LISTEN_FDS`). Keyed by address, in group order.
#[derive(Default, Debug)]
pub struct Inherited {
    by_addr: HashMap<SocketAddr, Vec<(usize, RawFd)>>,
    /// The addresses whose sockets systemd passed.
    systemd: std::collections::HashSet<SocketAddr>,
    /// The sockets came from a master being upgraded (`SHARD_INHERIT`).
    pub upgrade: bool,
    /// Steered `quic` groups of the master being upgraded (`QUIC_INHERIT_ENV`): by address,
    /// the socket array and the keys its sockets use.
    quic: HashMap<SocketAddr, (RawFd, Vec<u32>)>,
}

/// The environment variable a master hands its `quic` groups' steering to a new binary
/// with: `address=fd:key,key,...` entries separated by `;` (the socket array's descriptor,
/// and every key in use, so that the new master's keys are others).
pub const QUIC_INHERIT_ENV: &str = "SHARD_QUIC_PLANES";

/// The `QUIC_INHERIT_ENV` value for `listeners`, and the descriptors it names.
pub fn quic_inherit_env_value(listeners: &[OpenListener]) -> (String, Vec<RawFd>) {
    let mut s = String::new();
    let mut fds = Vec::new();
    for l in listeners {
        let Some(p) = &l.quic else {
            continue;
        };
        let fd = p.steering.map_fd();
        let keys: Vec<String> = p
            .keys
            .iter()
            .chain(p.retired.iter().map(|r| &r.2))
            .chain(p.reserved.iter())
            .map(u32::to_string)
            .collect();
        s.push_str(&format!("{}={fd}:{};", l.addr, keys.join(",")));
        fds.push(fd);
    }
    (s, fds)
}

/// The environment variable a master hands its sockets to a new binary with:
/// `fd:index:address` entries separated by `;`.
pub const INHERIT_ENV: &str = "SHARD_INHERIT";

impl Inherited {
    /// Reads `SHARD_INHERIT`, or systemd's `LISTEN_FDS` when `LISTEN_PID` is this process.
    /// Descriptors that are not listening TCP sockets are ignored.
    pub fn from_env() -> Inherited {
        let mut inh = Inherited::default();
        if let Ok(v) = std::env::var(INHERIT_ENV) {
            inh.upgrade = true;
            for entry in v.split(';').filter(|e| !e.is_empty()) {
                let mut it = entry.splitn(3, ':');
                let (Some(fd), Some(idx), Some(addr)) = (it.next(), it.next(), it.next()) else {
                    continue;
                };
                let (Ok(fd), Ok(idx), Ok(addr)) = (
                    fd.parse::<RawFd>(),
                    idx.parse::<usize>(),
                    addr.parse::<SocketAddr>(),
                ) else {
                    continue;
                };
                if shard_event::sock::is_listening_tcp(fd) && adopt(fd) {
                    inh.by_addr.entry(addr).or_default().push((idx, fd));
                }
            }
        }
        let systemd = std::env::var("LISTEN_PID")
            .ok()
            .and_then(|p| p.parse::<u32>().ok())
            == Some(std::process::id());
        if systemd {
            let n: RawFd = std::env::var("LISTEN_FDS")
                .ok()
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
            for fd in 3..3 + n {
                if !shard_event::sock::is_listening_tcp(fd) || !adopt(fd) {
                    continue;
                }
                if let Ok(addr) = shard_event::sock::local_addr(fd) {
                    inh.systemd.insert(addr);
                    let v = inh.by_addr.entry(addr).or_default();
                    let idx = v.len();
                    v.push((idx, fd));
                }
            }
        }
        for v in inh.by_addr.values_mut() {
            v.sort_unstable();
        }
        if let Ok(v) = std::env::var(QUIC_INHERIT_ENV) {
            for entry in v.split(';').filter(|e| !e.is_empty()) {
                let Some((addr, rest)) = entry.split_once('=') else {
                    continue;
                };
                let Some((fd, keys)) = rest.split_once(':') else {
                    continue;
                };
                let (Ok(addr), Ok(fd)) = (addr.parse::<SocketAddr>(), fd.parse::<RawFd>()) else {
                    continue;
                };
                let keys = keys.split(',').filter_map(|k| k.parse().ok()).collect();
                let _ = shard_event::sock::set_cloexec(fd, true);
                inh.quic.insert(addr, (fd, keys));
            }
            std::env::remove_var(QUIC_INHERIT_ENV);
        }
        std::env::remove_var(INHERIT_ENV);
        inh
    }

    pub fn is_empty(&self) -> bool {
        self.by_addr.is_empty()
    }

    fn take(&mut self, addr: &SocketAddr) -> Vec<RawFd> {
        self.by_addr
            .remove(addr)
            .map(|v| v.into_iter().map(|(_, fd)| fd).collect())
            .unwrap_or_default()
    }

    /// Closes what no listener claimed; returns the addresses.
    pub fn close_unclaimed(self) -> Vec<SocketAddr> {
        for (fd, _) in self.quic.into_values() {
            shard_event::sock::close(fd);
        }
        let mut gone = Vec::new();
        for (addr, v) in self.by_addr {
            for (_, fd) in v {
                shard_event::sock::close(fd);
            }
            gone.push(addr);
        }
        gone
    }
}

/// Makes an inherited descriptor fit for workers: non-blocking (a worker must never block in
/// `accept`) and closed on `exec` like every socket shard opens itself.
fn adopt(fd: RawFd) -> bool {
    let ok = shard_event::sock::set_nonblocking(fd).is_ok()
        && shard_event::sock::set_cloexec(fd, true).is_ok();
    if !ok {
        crate::log!(Alert, "cannot adopt inherited descriptor {fd}: ignored");
    }
    ok
}

/// The `SHARD_INHERIT` value describing `listeners`.
pub fn inherit_env_value(listeners: &[OpenListener]) -> String {
    let mut s = String::new();
    for l in listeners.iter().filter(|l| !l.opts.udp) {
        for (k, fd) in l.fds.iter().enumerate() {
            s.push_str(&format!("{fd}:{k}:{};", l.addr));
        }
    }
    s
}

/// Opens `l` for `n_workers` workers: one shared socket, or a group of shards. Sockets of the
/// same address in `inherited` are adopted instead of bound.
pub fn open(
    conf_idx: usize,
    l: &Listener,
    n_workers: usize,
    tcp_nodelay: bool,
    inherited: &mut Inherited,
) -> io::Result<OpenListener> {
    // Inherited sockets are TCP ones (`Inherited::from_env`): a datagram address of the
    // same address and port binds its own.
    let systemd = !l.opts.udp && inherited.systemd.contains(&l.addr);
    let fds = if l.opts.udp {
        Vec::new()
    } else {
        inherited.take(&l.addr)
    };
    let group = fds.first().is_some_and(|&fd| {
        shard_event::sock::get_opt(fd, libc::SOL_SOCKET, libc::SO_REUSEPORT).is_ok_and(|v| v == 1)
    });
    let existing = OpenListener {
        addr: l.addr,
        conf_idx,
        reuseport: group,
        active: fds.len(),
        fds,
        per_worker: false,
        backlog: l.opts.backlog,
        n_workers,
        opts: l.opts.clone(),
        systemd,
        // A previous master may have steered the group; re-steering below resets it.
        program: group.then(|| (Vec::new(), false)),
        steer_refused: false,
        deal_refused: false,
        quic: None,
    };
    let mut ol = reconcile(existing, conf_idx, l, n_workers, tcp_nodelay, true)?;
    let handed = inherited.quic.remove(&l.addr).filter(|_| l.opts.quic);
    quic_start(&mut ol, handed);
    Ok(ol)
}

/// Makes `old` (the sockets of the same address) serve `l` with `n_workers` workers: reuses
/// every socket, re-applies options, grows the group if needed and steers it (a group dealt in
/// turn stays so; the next steering tick applies the stalls). Without `steer_now` (a binary
/// upgrade's new master steers the groups) it leaves the group's program alone.
pub fn reconcile(
    old: OpenListener,
    conf_idx: usize,
    l: &Listener,
    n_workers: usize,
    tcp_nodelay: bool,
    steer_now: bool,
) -> io::Result<OpenListener> {
    let old_dealt = old.dealt();
    let mut fds = old.fds;
    let mut group = old.reuseport;
    // A systemd socket keeps its unit's backlog unless `backlog=` says otherwise; sockets
    // added to its group get the same.
    let mut opts = l.opts.clone();
    if old.systemd && !l.opts.backlog_set {
        if let Some(b) = fds
            .first()
            .and_then(|&fd| shard_event::sock::listen_queue(fd).ok())
            .map(|(_, b)| b as i32)
            .filter(|&b| b > 0)
        {
            opts.backlog = b;
        }
    }
    let l = &Listener { opts, ..l.clone() };
    // A Unix-domain socket is one shared socket (Linux has no reuseport groups for it).
    let mut want_group = l.opts.reuseport && l.opts.unix.is_none();
    let cpus = shard_event::process::available_cpus();
    let n_target = if want_group {
        shard_config::shard_count(l.opts.shards, n_workers, cpus)
    } else {
        1
    };

    for &fd in &fds {
        if !l.opts.udp {
            shard_event::sock::relisten(fd, l.opts.backlog)
                .map_err(|e| os_err("listen() to", &l.addr, e))?;
        }
        apply_opts(fd, &l.addr, &l.opts)?;
    }
    if want_group && !fds.is_empty() && !group {
        // Turning reuseport on: the shared socket becomes shard 0 of a new group.
        let res = if reuseport_disabled_for_test() {
            Err(io::Error::from_raw_os_error(libc::ENOPROTOOPT))
        } else {
            shard_event::sock::set_opt(fds[0], libc::SOL_SOCKET, libc::SO_REUSEPORT, 1)
        };
        match res {
            Ok(()) => group = true,
            Err(e) => {
                warn_refused(&l.addr, &e);
                want_group = false;
            }
        }
    }
    if fds.is_empty() && !want_group {
        fds.push(
            new_socket(&l.addr, &l.opts, tcp_nodelay, false).map_err(|e| match e {
                ShardError::Io(e) | ShardError::Refused(e) => e,
            })?,
        );
    }
    let preexisting = fds.len();
    while want_group && fds.len() < n_target {
        match new_socket(&l.addr, &l.opts, tcp_nodelay, true) {
            Ok(fd) => {
                fds.push(fd);
                group = true;
            }
            Err(ShardError::Refused(e)) if fds.is_empty() => {
                warn_refused(&l.addr, &e);
                want_group = false;
                fds.push(new_socket(&l.addr, &l.opts, tcp_nodelay, false).map_err(
                    |e| match e {
                        ShardError::Io(e) | ShardError::Refused(e) => e,
                    },
                )?);
            }
            Err(ShardError::Refused(e) | ShardError::Io(e)) => {
                for fd in fds.drain(preexisting..) {
                    shard_event::sock::close(fd);
                }
                return Err(e);
            }
        }
    }
    let active = if want_group {
        n_target.min(fds.len())
    } else {
        1
    };
    let mut ol = OpenListener {
        addr: l.addr,
        conf_idx,
        reuseport: group,
        per_worker: want_group && l.opts.shards.is_none() && active >= n_workers,
        active,
        fds,
        backlog: l.opts.backlog,
        n_workers,
        opts: l.opts.clone(),
        systemd: old.systemd,
        program: old.program,
        steer_refused: old.steer_refused,
        deal_refused: old.deal_refused,
        quic: old.quic,
    };
    if !steer_now {
        ol.forget_program();
        return Ok(ol);
    }
    if steer(&mut ol, &[], old_dealt) && ol.active < ol.fds.len() {
        crate::log!(
            Notice,
            "{}: {} of {} shards take new connections; the other {} are steered out of the kernel's \
             choice by a reuseport BPF program and drained by workers (none is closed, so no queued \
             connection is reset, whatever net.ipv4.tcp_migrate_req says)",
            ol.addr,
            ol.active,
            ol.fds.len(),
            ol.fds.len() - ol.active
        );
    }
    Ok(ol)
}

/// Attaches (or detaches) the steering program so that new connections go to `fds[..active]`
/// in proportion to `weights` (worker `j`'s shard of a per-worker group; 0: stalled,
/// backlogged or out of the funnel; 1 where it says nothing): the one place the facts, a
/// reload's surplus shards, stalls and the funnel, meet. With `deal` (`reuseport_steering on`)
/// the program deals them in turn (`shard_event::bpf`), every socket live or not, so that the
/// spread does not depend on the kernel's hash; where `bpf(2)` refuses it, and without `deal`,
/// a classic program draws at random, and none is attached where it would choose every
/// socket once, as the kernel's hash does. Returns whether the group's program now follows
/// `weights` (false where the kernel refused it, and for a listener without `reuseport`, which
/// has no program).
pub fn steer(l: &mut OpenListener, weights: &[u32], deal: bool) -> bool {
    // A steered `quic` group has its own program (connection IDs); other datagram groups
    // keep the kernel's hash of the client's address: a program choosing per packet would
    // scatter a UDP session's datagrams.
    if l.opts.udp && l.reuseport {
        return quic_steer(l, weights);
    }
    if !l.reuseport || l.opts.udp {
        return false;
    }
    let weights_used = if l.per_worker { weights } else { &[] };
    let live = crate::steer::live_shards(l.active, weights_used);
    // Dealt: per-worker groups only; `shards=N` groups are outside steering (directives.md)
    // and keep the kernel's hash.
    let deal = deal && l.per_worker && !l.deal_refused && !l.steer_refused;
    let plain = live.len() == l.fds.len() && live.iter().enumerate().all(|(k, &v)| v as usize == k);
    let want = (deal || !plain).then_some((live, deal));
    if want == l.program {
        return true;
    }
    if let Some((live, true)) = &want {
        let res = if ebpf_disabled_for_test() {
            Err(io::Error::from_raw_os_error(libc::EPERM))
        } else {
            shard_event::bpf::deal_reuseport_to(l.fds[0], live)
        };
        match res {
            Ok(()) => {
                if !l.dealt() {
                    crate::log!(
                        Info,
                        "new connections to {} are dealt in turn over its shards (eBPF)",
                        l.addr
                    );
                }
                l.program = want;
                return true;
            }
            Err(e) => {
                l.deal_refused = true;
                if !DEAL_REFUSED_SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
                    crate::log!(
                        Notice,
                        "bpf(2) refused the program that deals new connections to {} in turn \
                         ({}): reuseport groups spread them at random instead (a master \
                         needs CAP_BPF, or kernel.unprivileged_bpf_disabled=0, and Linux 5.12)",
                        l.addr,
                        shard_event::os_error_text(&e)
                    );
                }
                return steer(l, weights, false);
            }
        }
    }
    let want = want.map(|(live, _)| live);
    let res = if want.is_some() && cbpf_disabled_for_test() {
        Err(io::Error::from_raw_os_error(libc::EPERM))
    } else {
        shard_event::sock::steer_reuseport_to(l.fds[0], want.as_deref().unwrap_or(&[]))
    };
    match res {
        Ok(()) => {
            l.program = want.map(|live| (live, false));
            true
        }
        // Nothing was attached (a group adopted from a previous master that never steered).
        Err(e) if want.is_none() && e.raw_os_error() == Some(libc::ENOENT) => {
            l.program = None;
            true
        }
        Err(e) => {
            if !l.steer_refused {
                l.steer_refused = true;
                crate::log!(
                    Alert,
                    "setsockopt(SO_ATTACH_REUSEPORT_CBPF) for {} failed ({}): new connections are not \
                     steered away from surplus or stalled shards; workers still drain them",
                    l.addr,
                    shard_event::os_error_text(&e)
                );
            }
            false
        }
    }
}
