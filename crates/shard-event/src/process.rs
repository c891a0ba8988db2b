//! Processes and signals: fork, wait, kill, signal masks and signalfd, rlimits, CPU counts.
//!
//! shard never installs signal handlers: the master blocks the signals it cares about and reads
//! them from a signalfd, so no code runs in signal context. The mask is inherited by `fork`, and
//! a worker reads its own signals from its own signalfd the same way.

use std::io;
use std::mem::{size_of, MaybeUninit};
use std::os::fd::RawFd;

use crate::{cvt, cvt_size};

/// The signals shard handles through signalfd. `SIGCONT` wakes a worker that was stopped while
/// waiting for events, so that its heartbeat moves at once; `SIGURG` is the master's "the
/// steering changed" to its workers.
pub const HANDLED_SIGNALS: [libc::c_int; 10] = [
    libc::SIGCHLD,
    libc::SIGHUP,
    libc::SIGQUIT,
    libc::SIGTERM,
    libc::SIGINT,
    libc::SIGUSR1,
    libc::SIGUSR2,
    libc::SIGWINCH,
    libc::SIGCONT,
    libc::SIGURG,
];

fn handled_set() -> libc::sigset_t {
    let mut set = MaybeUninit::<libc::sigset_t>::uninit();
    // SAFETY: sigemptyset initialises the set; sigaddset only writes into it.
    unsafe {
        libc::sigemptyset(set.as_mut_ptr());
        for s in HANDLED_SIGNALS {
            libc::sigaddset(set.as_mut_ptr(), s);
        }
        set.assume_init()
    }
}

/// Blocks [`HANDLED_SIGNALS`] and ignores `SIGPIPE` (a write to a closed socket must return
/// `EPIPE`, not kill the worker).
pub fn block_signals() -> io::Result<()> {
    let set = handled_set();
    // SAFETY: `set` is initialised; SIG_IGN is a valid disposition for SIGPIPE.
    unsafe {
        cvt(libc::sigprocmask(
            libc::SIG_BLOCK,
            &set,
            std::ptr::null_mut(),
        ))?;
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
    Ok(())
}

/// Restores the default mask (before `exec`, so that a new binary starts clean).
pub fn unblock_signals() -> io::Result<()> {
    let set = handled_set();
    // SAFETY: `set` is initialised.
    cvt(unsafe { libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut()) })?;
    Ok(())
}

/// A non-blocking signalfd for [`HANDLED_SIGNALS`]; they must already be blocked.
pub struct SignalFd {
    fd: RawFd,
}

impl SignalFd {
    pub fn new() -> io::Result<SignalFd> {
        let set = handled_set();
        // SAFETY: `set` is initialised.
        let fd = cvt(unsafe { libc::signalfd(-1, &set, libc::SFD_NONBLOCK | libc::SFD_CLOEXEC) })?;
        Ok(SignalFd { fd })
    }

    pub fn fd(&self) -> RawFd {
        self.fd
    }

    /// The next pending signal and its sender's pid, or `None` when none is pending.
    pub fn read(&self) -> Option<(libc::c_int, libc::pid_t)> {
        let mut info = MaybeUninit::<libc::signalfd_siginfo>::zeroed();
        // SAFETY: info is valid for writes of its size.
        let n = cvt_size(unsafe {
            libc::read(
                self.fd,
                info.as_mut_ptr() as *mut libc::c_void,
                size_of::<libc::signalfd_siginfo>(),
            )
        });
        match n {
            Ok(n) if n == size_of::<libc::signalfd_siginfo>() => {
                // SAFETY: the kernel wrote a whole siginfo.
                let info = unsafe { info.assume_init() };
                Some((info.ssi_signo as libc::c_int, info.ssi_pid as libc::pid_t))
            }
            _ => None,
        }
    }
}

impl Drop for SignalFd {
    fn drop(&mut self) {
        // SAFETY: we own fd.
        unsafe { libc::close(self.fd) };
    }
}

pub enum Fork {
    Parent(libc::pid_t),
    Child,
}

/// `fork(2)`.
///
/// # Safety
/// The calling process must have a single thread: the child gets a copy of every lock and
/// allocator state, and a lock held by another thread at the time would never be released in
/// it. (shard's master is single-threaded: an architecture invariant.)
pub unsafe fn fork() -> io::Result<Fork> {
    // SAFETY: the caller guarantees a single-threaded process (see above).
    let pid = cvt(unsafe { libc::fork() })?;
    Ok(if pid == 0 {
        Fork::Child
    } else {
        Fork::Parent(pid)
    })
}

/// Detaches the calling process from its terminal as a daemon does: a new session
/// (`setsid`), standard input and output on `/dev/null`, and standard error on `stderr_to`
/// when given (nginx points it at the error log file; with `error_log stderr` it is left
/// alone, as nginx's `ngx_daemon`), so that nothing keeps the starter's terminal or pipes.
pub fn detach(stderr_to: Option<RawFd>) -> io::Result<()> {
    // SAFETY: plain system calls on descriptors this function opens or on 0 and 1.
    unsafe {
        cvt(libc::setsid())?;
        let fd = cvt(libc::open(
            c"/dev/null".as_ptr(),
            libc::O_RDWR | libc::O_CLOEXEC,
        ))?;
        let r0 = libc::dup2(fd, 0);
        let r1 = libc::dup2(fd, 1);
        libc::close(fd);
        cvt(r0)?;
        cvt(r1)?;
        if let Some(e) = stderr_to {
            cvt(libc::dup2(e, 2))?;
        }
    }
    Ok(())
}

/// Points standard error at `fd` (`dup2`): a daemon's stderr follows its error log.
pub fn stderr_to(fd: RawFd) -> io::Result<()> {
    // SAFETY: plain dup2 of descriptors this process owns.
    cvt(unsafe { libc::dup2(fd, 2) }).map(|_| ())
}

/// How a reaped child ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    Code(i32),
    Signal(i32),
}

/// Reaps one exited child without blocking.
pub fn reap() -> Option<(libc::pid_t, Exit)> {
    let mut status = 0;
    // SAFETY: status is a valid int for the kernel to write.
    let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
    if pid <= 0 {
        return None;
    }
    let exit = if libc::WIFSIGNALED(status) {
        Exit::Signal(libc::WTERMSIG(status))
    } else {
        Exit::Code(libc::WEXITSTATUS(status))
    };
    Some((pid, exit))
}

pub fn kill(pid: libc::pid_t, sig: libc::c_int) -> io::Result<()> {
    // SAFETY: plain system call.
    cvt(unsafe { libc::kill(pid, sig) })?;
    Ok(())
}

/// This process's pid, asked of the kernel once per process: glibc no longer caches it, and
/// the cache zones' and `limit_*` zones' locks name their holder on every request. A child
/// of `fork` (this module's or any other, through `pthread_atfork`) asks again.
pub fn getpid() -> libc::pid_t {
    static PID: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);
    static AT_FORK: std::sync::Once = std::sync::Once::new();
    extern "C" fn forget_in_child() {
        PID.store(0, std::sync::atomic::Ordering::Relaxed);
    }
    let pid = PID.load(std::sync::atomic::Ordering::Relaxed);
    if pid != 0 {
        return pid;
    }
    AT_FORK.call_once(|| {
        // SAFETY: registers a handler that only stores to an atomic; runs in the child of
        // every later fork(3).
        unsafe { libc::pthread_atfork(None, None, Some(forget_in_child)) };
    });
    // SAFETY: always succeeds.
    let pid = unsafe { libc::getpid() };
    PID.store(pid, std::sync::atomic::Ordering::Relaxed);
    pid
}

/// Asks the kernel to send `sig` to this process when its parent (the master) dies, so that
/// workers never outlive a master killed with `SIGKILL`.
pub fn set_parent_death_signal(sig: libc::c_int) {
    // SAFETY: prctl with integer arguments only.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, sig as libc::c_ulong, 0, 0, 0) };
}

pub fn set_nofile_limit(n: u64) -> io::Result<()> {
    let lim = libc::rlimit {
        rlim_cur: n as libc::rlim_t,
        rlim_max: n as libc::rlim_t,
    };
    // SAFETY: `lim` is a valid rlimit.
    cvt(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) })?;
    Ok(())
}

/// Sets the calling process's `RLIMIT_CORE` (soft and hard) to `n` bytes.
pub fn set_core_limit(n: u64) -> io::Result<()> {
    let lim = libc::rlimit {
        rlim_cur: n as libc::rlim_t,
        rlim_max: n as libc::rlim_t,
    };
    // SAFETY: `lim` is a valid rlimit.
    cvt(unsafe { libc::setrlimit(libc::RLIMIT_CORE, &lim) })?;
    Ok(())
}

/// Sets the calling process's nice value.
pub fn set_priority(nice: i32) -> io::Result<()> {
    // SAFETY: plain syscall on the calling process (who 0).
    cvt(unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, nice) })?;
    Ok(())
}

/// The CPUs (0 to 63) the calling process may run on, as a bit mask.
pub fn cpu_affinity() -> io::Result<u64> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; the kernel fills it.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    cvt(unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) })?;
    let mut mask = 0u64;
    for cpu in 0..64 {
        // SAFETY: cpu is below CPU_SETSIZE.
        if unsafe { libc::CPU_ISSET(cpu, &set) } {
            mask |= 1 << cpu;
        }
    }
    Ok(mask)
}

/// Binds the calling process to the CPUs of `mask` (bit N is CPU N).
pub fn set_cpu_affinity(mask: u64) -> io::Result<()> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for cpu in 0..64 {
        if mask & (1 << cpu) != 0 {
            // SAFETY: cpu is below CPU_SETSIZE.
            unsafe { libc::CPU_SET(cpu, &mut set) };
        }
    }
    // SAFETY: set is a valid cpu_set_t of the size given.
    cvt(unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) })?;
    Ok(())
}

/// User plus system CPU time of the calling process, in milliseconds.
pub fn cpu_time_ms() -> u64 {
    let mut ru = MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: ru is valid for writes.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, ru.as_mut_ptr()) };
    // SAFETY: zeroed and filled by the kernel.
    let ru = unsafe { ru.assume_init() };
    let ms = |t: libc::timeval| t.tv_sec as u64 * 1000 + t.tv_usec as u64 / 1000;
    ms(ru.ru_utime) + ms(ru.ru_stime)
}

/// CPUs this process may run on: `std::thread::available_parallelism`, which takes the
/// affinity mask (of any size) and the CPU quota of the process's own cgroup and its
/// ancestors (v2 `cpu.max`, v1 `cpu.cfs_quota_us`, found through `/proc/self/cgroup` and the
/// mount table), rounded up; at least 1. nginx's `auto` counts only online CPUs, which
/// overcommits workers inside containers. (An earlier hand-written version read only the
/// root cgroup's files and a 1024-CPU mask.)
/// Gives the allocator's free memory back to the kernel (glibc's `malloc_trim`; nothing
/// elsewhere). A master that has just read a large configuration forks workers that would
/// otherwise carry the parse's high-water mark as resident pages.
pub fn trim_heap() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only walks the allocator's own free lists.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// nginx's `env` for a worker: every inherited variable is removed but `TZ` and the `keep`
/// names with no value; the names with a value are set to it. For a freshly forked,
/// single-threaded worker only (the environment is not guarded against other threads).
pub fn set_environment(vars: &[(String, Option<String>)]) {
    use std::ffi::CString;
    let kept: Vec<(CString, CString)> = std::env::vars_os()
        .filter(|(k, _)| k == "TZ" || vars.iter().any(|(n, v)| v.is_none() && k == n.as_str()))
        .filter_map(|(k, v)| {
            use std::os::unix::ffi::OsStrExt;
            Some((
                CString::new(k.as_bytes()).ok()?,
                CString::new(v.as_bytes()).ok()?,
            ))
        })
        .collect();
    let set: Vec<(CString, CString)> = vars
        .iter()
        .filter_map(|(n, v)| {
            Some((
                CString::new(n.as_str()).ok()?,
                CString::new(v.as_deref()?).ok()?,
            ))
        })
        .collect();
    // SAFETY: called in a single-threaded process (a worker right after fork), so no other
    // thread reads the environment while it changes; every string is NUL-terminated.
    unsafe {
        libc::clearenv();
        for (k, v) in kept.iter().chain(&set) {
            libc::setenv(k.as_ptr(), v.as_ptr(), 1);
        }
    }
}

pub fn available_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

pub fn getppid() -> libc::pid_t {
    // SAFETY: always succeeds.
    unsafe { libc::getppid() }
}

/// Whether the process runs as root (the `user` directive only applies then, as in nginx).
pub fn is_root() -> bool {
    // SAFETY: geteuid has no failure mode and no memory effects.
    unsafe { libc::geteuid() == 0 }
}

/// The uid and primary gid of user `name` (`getpwnam`); `None` when there is no such user.
pub fn user_ids(name: &str) -> Option<(u32, u32)> {
    let c = std::ffi::CString::new(name).ok()?;
    // SAFETY: getpwnam returns a pointer into static storage or null; read before other calls.
    let pw = unsafe { libc::getpwnam(c.as_ptr()) };
    if pw.is_null() {
        return None;
    }
    // SAFETY: `pw` is non-null and points at a valid passwd entry.
    Some(unsafe { ((*pw).pw_uid, (*pw).pw_gid) })
}

/// The gid of group `name` (`getgrnam`); `None` when there is no such group.
pub fn group_id(name: &str) -> Option<u32> {
    let c = std::ffi::CString::new(name).ok()?;
    // SAFETY: as above, for group entries.
    let gr = unsafe { libc::getgrnam(c.as_ptr()) };
    if gr.is_null() {
        return None;
    }
    // SAFETY: `gr` is non-null.
    Some(unsafe { (*gr).gr_gid })
}

/// `CAP_NET_RAW`, which `IP_TRANSPARENT` needs (or `CAP_NET_ADMIN`).
const CAP_NET_RAW: libc::c_ulong = 13;

/// Switches a root process to `uid`/`gid` for good, keeping no privilege: the capability
/// bounding set is emptied (while still root, which may), supplementary groups are reset,
/// then gid, then uid, then the ambient set is cleared; the result is checked.
pub fn drop_to(uid: u32, gid: u32, keep_net_raw: bool) -> Result<(), String> {
    let last_cap = std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse::<libc::c_ulong>().ok())
        .unwrap_or(63);
    for cap in 0..=last_cap {
        if keep_net_raw && cap == CAP_NET_RAW {
            continue;
        }
        // SAFETY: prctl with integer arguments. EINVAL past the kernel's last capability.
        let r = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) };
        if r == -1 && io::Error::last_os_error().raw_os_error() != Some(libc::EINVAL) {
            return Err(format!(
                "prctl(PR_CAPBSET_DROP, {cap}) failed ({})",
                io::Error::last_os_error()
            ));
        }
    }
    // SAFETY: plain system calls with integer arguments and a valid one-element list.
    unsafe {
        if libc::setgroups(1, &gid) == -1 {
            return Err(format!(
                "setgroups({gid}) failed ({})",
                io::Error::last_os_error()
            ));
        }
        if libc::setgid(gid) == -1 {
            return Err(format!(
                "setgid({gid}) failed ({})",
                io::Error::last_os_error()
            ));
        }
        // `transparent` binds (nginx keeps CAP_NET_RAW for them): the permitted set survives
        // the setuid, then CAP_NET_RAW alone is made effective.
        if keep_net_raw && libc::prctl(libc::PR_SET_KEEPCAPS, 1, 0, 0, 0) == -1 {
            return Err(format!(
                "prctl(PR_SET_KEEPCAPS, 1) failed ({})",
                io::Error::last_os_error()
            ));
        }
        if libc::setuid(uid) == -1 {
            return Err(format!(
                "setuid({uid}) failed ({})",
                io::Error::last_os_error()
            ));
        }
        if keep_net_raw && uid != 0 {
            #[repr(C)]
            struct Header {
                version: u32,
                pid: i32,
            }
            #[repr(C)]
            #[derive(Clone, Copy)]
            struct Data {
                effective: u32,
                permitted: u32,
                inheritable: u32,
            }
            let mut header = Header {
                version: 0x2008_0522, // _LINUX_CAPABILITY_VERSION_3
                pid: 0,
            };
            let raw = 1u32 << CAP_NET_RAW;
            let data = [
                Data {
                    effective: raw,
                    permitted: raw,
                    inheritable: 0,
                },
                Data {
                    effective: 0,
                    permitted: 0,
                    inheritable: 0,
                },
            ];
            if libc::syscall(libc::SYS_capset, &mut header as *mut Header, data.as_ptr()) == -1 {
                return Err(format!(
                    "capset(CAP_NET_RAW) failed ({})",
                    io::Error::last_os_error()
                ));
            }
            libc::prctl(libc::PR_SET_KEEPCAPS, 0, 0, 0, 0);
        }
        // Ambient capabilities (Linux 4.3+); EINVAL on older kernels means there are none.
        let r = libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
            0,
            0,
            0,
        );
        if r == -1 && io::Error::last_os_error().raw_os_error() != Some(libc::EINVAL) {
            return Err(format!(
                "prctl(PR_CAP_AMBIENT_CLEAR_ALL) failed ({})",
                io::Error::last_os_error()
            ));
        }
        // Nothing may bring root back.
        if uid != 0 && (libc::setuid(0) != -1 || libc::geteuid() == 0) {
            return Err("setuid(0) succeeded after dropping privileges".to_string());
        }
    }
    Ok(())
}

/// `PR_SET_NO_NEW_PRIVS`: no program this process runs can gain privileges (set-user-ID
/// bits, file capabilities), for the rest of its life.
pub fn set_no_new_privs() -> io::Result<()> {
    // SAFETY: prctl with integer arguments.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The machine's host name (`gethostname`), "" when it cannot be read.
pub fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its whole length; the name is NUL-terminated within it
    // or truncated, and only the bytes before the first NUL are read.
    let r = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if r != 0 {
        return String::new();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// 64 random bits from the kernel (`getrandom`); the time and pid if it fails.
pub fn random_u64() -> u64 {
    let mut v = [0u8; 8];
    // SAFETY: the buffer is valid for 8 bytes.
    let n = unsafe { libc::getrandom(v.as_mut_ptr().cast(), v.len(), 0) };
    if n == 8 {
        return u64::from_ne_bytes(v);
    }
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    t ^ (u64::from(std::process::id()) << 32)
}

/// The memory `ps` reads a process's command line from: the original `argv` strings and, once
/// the environment strings were moved out of the way, the `environ` area after them (nginx's
/// `ngx_init_setproctitle`). Titles are written there.
#[derive(Debug, Clone, Copy)]
pub struct TitleArea {
    start: usize,
    len: usize,
}

extern "C" {
    static mut environ: *mut *mut libc::c_char;
}

/// Prepares process titles: copies every environment string that lies in the kernel's
/// environment area to the heap (so `getenv` keeps working) and returns the area from the
/// first argument to the end of the environment. `None` when `/proc/self/stat` cannot be
/// read; titles are then not set.
///
/// Call it once, early, in a single-threaded process, before anything keeps a pointer into
/// the original argument or environment strings (`std::env::args` copies them on each call).
pub fn init_title() -> Option<TitleArea> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name, which may contain spaces and parentheses.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split(' ').collect();
    // `arg_start` is field 48 of stat(5), `env_end` field 51; `rest` starts at field 3.
    let num = |n: usize| f.get(n - 3).and_then(|v| v.trim().parse::<usize>().ok());
    let (arg_start, arg_end, env_start, env_end) = (num(48)?, num(49)?, num(50)?, num(51)?);
    if arg_start == 0 || arg_end <= arg_start {
        return None;
    }
    let mut end = arg_end;
    if env_start == arg_end && env_end > env_start {
        // SAFETY: single-threaded (the caller's contract), so nothing reads `environ` while
        // its entries are replaced; each entry is a valid C string, and `strdup` returns
        // another (or null, in which case the entry is left as it was and the area stops
        // before it).
        unsafe {
            let mut p = environ;
            let mut movable = true;
            while !p.is_null() && !(*p).is_null() {
                let s = *p as usize;
                if (env_start..env_end).contains(&s) {
                    let copy = libc::strdup(*p);
                    if copy.is_null() {
                        movable = false;
                        break;
                    }
                    *p = copy;
                }
                p = p.add(1);
            }
            if movable {
                end = env_end;
            }
        }
    }
    Some(TitleArea {
        start: arg_start,
        len: end - arg_start,
    })
}

/// Sets the title `ps` shows for this process (`shard: worker process`): written at the start
/// of the area, cut to fit, the rest zeroed.
pub fn set_title(area: TitleArea, title: &str) {
    if area.len < 2 {
        return;
    }
    let n = title.len().min(area.len - 1);
    // SAFETY: the area is this process's own argument and environment strings (from
    // /proc/self/stat), writable stack memory that no Rust value refers to: `init_title` moved
    // the environment strings elsewhere, and the standard library copies arguments when asked.
    unsafe {
        let dst = area.start as *mut u8;
        std::ptr::copy_nonoverlapping(title.as_ptr(), dst, n);
        std::ptr::write_bytes(dst.add(n), 0, area.len - n);
    }
}

#[link(name = "crypt")]
extern "C" {
    fn crypt(key: *const libc::c_char, salt: *const libc::c_char) -> *mut libc::c_char;
}

/// `crypt(3)` (libcrypt: DES, `$1$` MD5, `$5$`/`$6$` SHA-2, `$y$` yescrypt ...): `key`
/// hashed with the method and salt of `setting`, as an htpasswd line stores it. `None` when
/// libcrypt refuses the setting. Not reentrant (a static buffer): workers are one thread.
pub fn crypt_hash(key: &str, setting: &str) -> Option<String> {
    let k = std::ffi::CString::new(key).ok()?;
    let s = std::ffi::CString::new(setting).ok()?;
    // SAFETY: both are NUL-terminated strings alive for the call; the result points into
    // libcrypt's static buffer, copied out before anything else calls crypt.
    let out = unsafe { crypt(k.as_ptr(), s.as_ptr()) };
    if out.is_null() {
        return None;
    }
    // SAFETY: a non-null result is a NUL-terminated string.
    let text = unsafe { std::ffi::CStr::from_ptr(out) }.to_str().ok()?;
    // libxcrypt signals failure with a string starting with `*`.
    (!text.starts_with('*')).then(|| text.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `set_environment` in a process of its own (this test binary again, with one test).
    #[test]
    fn the_environment_keeps_tz_and_the_named_variables() {
        if std::env::var_os("SHARD_ENV_CHILD").is_some() {
            set_environment(&[
                ("KEEP_ME".to_string(), None),
                ("NEW_ONE".to_string(), Some("three".to_string())),
                ("ABSENT".to_string(), None),
            ]);
            let mut vars: Vec<String> = std::env::vars().map(|(k, v)| format!("{k}={v}")).collect();
            vars.sort();
            println!("VARS:{}", vars.join(","));
            return;
        }
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "process::tests::the_environment_keeps_tz_and_the_named_variables",
                "--nocapture",
                "--test-threads=1",
            ])
            .env_clear()
            .env("SHARD_ENV_CHILD", "1")
            .env("KEEP_ME", "one")
            .env("DROP_ME", "two")
            .env("TZ", "UTC")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let line = text
            .split("VARS:")
            .nth(1)
            .and_then(|rest| rest.lines().next());
        assert_eq!(line, Some("KEEP_ME=one,NEW_ONE=three,TZ=UTC"), "{text}");
    }
}
