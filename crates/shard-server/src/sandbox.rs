//! `worker_sandbox on` (beyond nginx): a worker confines itself once it is set up, so that a
//! logic bug in the data path can reach neither files nor system calls the configuration does
//! not need.
//!
//! This module owns what a worker may open ([`Plan`], computed from the configuration and
//! printed by `shard -T`), the Landlock ruleset that enforces it, and the one table of system
//! calls the worker loop makes ([`SYSCALLS`]), enforced with seccomp: any other call fails with
//! `EPERM`. It does not decide who the worker runs as (`privilege.rs`), and it never confines
//! the master, which must bind, re-read the configuration and exec a new binary.
//!
//! A kernel without Landlock or seccomp gets a notice from the master, once, and the rest of
//! the sandbox still applies.

use std::path::{Path, PathBuf};

use landlock::{
    Access, AccessFs, BitFlags, PathBeneath, PathFd, Ruleset, RulesetAttr, RulesetCreatedAttr,
    RulesetStatus, ABI,
};
use shard_config::{Config, LogTarget};

/// What a sandboxed worker may open, from the configuration.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Plan {
    /// Read (files and directory listings): every `root` and `alias`.
    pub read: Vec<PathBuf>,
    /// Write to existing files (log reopening after rotation: the master creates the new file):
    /// the directories of the error and access logs.
    pub append: Vec<PathBuf>,
    /// Read, write, create and remove beneath: the request-body temporary directories.
    pub temp: Vec<PathBuf>,
}

fn push_once(v: &mut Vec<PathBuf>, p: &Path) {
    if !v.iter().any(|q| q == p) {
        v.push(p.to_path_buf());
    }
}

/// The directory a path template names before its first variable (`/var/log/$host.log`:
/// `/var/log`).
fn literal_dir(template: &Path) -> PathBuf {
    let text = template.to_string_lossy();
    let lit = &text[..text.find('$').unwrap_or(text.len())];
    match lit.rfind('/') {
        Some(0) => PathBuf::from("/"),
        Some(i) => PathBuf::from(&lit[..i]),
        None => PathBuf::from("."),
    }
}

/// The literal directory a path template begins in (relative ones under `base`).
fn template_dir(parts: &[shard_config::Part], base: &Path) -> PathBuf {
    let lit: String = parts
        .iter()
        .map_while(|p| match p {
            shard_config::Part::Lit(t) => Some(t.as_str()),
            _ => None,
        })
        .collect();
    base.join(literal_dir(Path::new(&format!("{lit}$"))))
}

impl Plan {
    pub fn from_config(cfg: &Config) -> Plan {
        let mut plan = Plan::default();
        for l in std::iter::once(&cfg.main.error_log).chain(&cfg.main.more_error_logs) {
            if let LogTarget::File(p) = &l.target {
                if let Some(d) = p.parent() {
                    push_once(&mut plan.append, d);
                }
            }
        }
        // `ssl_certificate $var`: the worker reads the pairs at each handshake.
        let servers_ssl = cfg
            .http
            .iter()
            .flat_map(|h| h.servers.iter().map(|s| &s.ssl))
            .chain(
                cfg.stream
                    .iter()
                    .flat_map(|st| st.servers.iter().map(|s| &s.ssl)),
            );
        // Stream's `proxy_ssl_certificate $var`: read per session.
        for ssl in cfg
            .stream
            .iter()
            .flat_map(|st| st.servers.iter().filter_map(|s| s.proxy_ssl.as_ref()))
        {
            if let Some(v) = &ssl.certificate_vars {
                push_once(&mut plan.read, &template_dir(&v.cert, &v.dir));
                push_once(&mut plan.read, &template_dir(&v.key, &v.dir));
                if let Some(pw) = ssl.password_file.as_deref().and_then(Path::parent) {
                    push_once(&mut plan.read, pw);
                }
            }
        }
        for ssl in servers_ssl {
            for pair in &ssl.certificates {
                if let Some(v) = &pair.vars {
                    push_once(&mut plan.read, &template_dir(&v.cert, &v.dir));
                    push_once(&mut plan.read, &template_dir(&v.key, &v.dir));
                    if let Some(pw) = pair.password_file.as_deref().and_then(Path::parent) {
                        push_once(&mut plan.read, pw);
                    }
                }
            }
        }
        if let Some(http) = &cfg.http {
            for s in &http.servers {
                for l in std::iter::once(&s.base).chain(&s.locations) {
                    push_once(&mut plan.read, l.alias.as_deref().unwrap_or(&l.root));
                    // A user file named by variables is read per request: the directory its
                    // name begins in (the configuration's, for a relative one).
                    let basics = l.auth_basic.iter().chain(
                        l.limit_except
                            .iter()
                            .filter_map(|le| le.auth_basic.as_ref()),
                    );
                    for ab in basics.filter(|ab| ab.file_vars.is_some()) {
                        push_once(&mut plan.read, &literal_dir(&ab.conf_dir.join(&ab.file)));
                    }
                    // `proxy_store` writes files where `root` maps URIs, or under its path.
                    match &l.proxy.store {
                        Some(shard_config::Store::Mapped) => {
                            push_once(&mut plan.temp, l.alias.as_deref().unwrap_or(&l.root))
                        }
                        Some(shard_config::Store::Path(parts)) => {
                            push_once(&mut plan.temp, &template_dir(parts, Path::new("/")));
                        }
                        None => {}
                    }
                    // `proxy_ssl_certificate $var`: the worker reads the pair per request.
                    if let Some(v) = &l.proxy.ssl.certificate_vars {
                        push_once(&mut plan.read, &template_dir(&v.cert, &v.dir));
                        push_once(&mut plan.read, &template_dir(&v.key, &v.dir));
                        if let Some(pw) =
                            l.proxy.ssl.password_file.as_deref().and_then(Path::parent)
                        {
                            push_once(&mut plan.read, pw);
                        }
                    }
                    for al in l.access_logs.iter().filter(|al| al.syslog.is_none()) {
                        match &al.path_vars {
                            // The worker creates these files: the literal directory before
                            // the first variable.
                            Some(_) => push_once(&mut plan.temp, &literal_dir(&al.path)),
                            None => {
                                if let Some(d) = al.path.parent() {
                                    push_once(&mut plan.append, d);
                                }
                            }
                        }
                    }
                }
            }
            for tp in http.client_body_temp_paths() {
                push_once(&mut plan.temp, &tp.path);
            }
            for c in &http.cache_paths {
                push_once(&mut plan.temp, &c.path);
            }
        }
        for s in cfg.stream.iter().flat_map(|s| &s.servers) {
            for al in s.access_logs.iter().filter(|al| al.path_vars.is_some()) {
                push_once(&mut plan.temp, &literal_dir(&al.path));
            }
        }
        plan
    }

    /// The plan as `shard -T` prints it, one path per line.
    pub fn render(&self, on: bool) -> String {
        let mut s = format!(
            "# worker_sandbox {}: what a worker may open{}\n",
            if on { "on" } else { "off" },
            if on { "" } else { " once it is on" }
        );
        for (what, v) in [
            ("read", &self.read),
            ("write to existing files", &self.append),
            ("read, write, create, remove", &self.temp),
        ] {
            for p in v {
                s.push_str(&format!("#   {what}: {}\n", p.display()));
            }
        }
        s.push_str(&format!(
            "#   system calls: {} (any other fails with EPERM)\n",
            SYSCALLS.len()
        ));
        s
    }
}

/// Every system call a worker makes after it is set up, found by tracing the whole test suite
/// (`SHARD_TEST_WRAP="strace -f -ff -o DIR/t"`) and kept here, in one table. A sandboxed test
/// that needs one more fails (`tests/sandbox.rs`).
pub const SYSCALLS: &[(&str, i64)] = &[
    // The loop, sockets and files.
    ("read", libc::SYS_read),
    ("readv", libc::SYS_readv),
    ("write", libc::SYS_write),
    ("writev", libc::SYS_writev),
    ("pread64", libc::SYS_pread64),
    ("pwrite64", libc::SYS_pwrite64),
    ("sendfile", libc::SYS_sendfile),
    ("close", libc::SYS_close),
    ("fcntl", libc::SYS_fcntl),
    ("lseek", libc::SYS_lseek),
    ("fstat", libc::SYS_fstat),
    ("newfstatat", libc::SYS_newfstatat),
    ("statx", libc::SYS_statx),
    ("fstatfs", libc::SYS_fstatfs),
    ("openat", libc::SYS_openat),
    // `autoindex` lists a directory.
    ("getdents64", libc::SYS_getdents64),
    ("mkdirat", libc::SYS_mkdirat),
    // The cache renames a whole entry into place.
    ("renameat", libc::SYS_renameat),
    ("renameat2", libc::SYS_renameat2),
    ("unlinkat", libc::SYS_unlinkat),
    // `proxy_store` gives a saved file its mode and the upstream's `Last-Modified`.
    ("fchmod", libc::SYS_fchmod),
    ("utimensat", libc::SYS_utimensat),
    // `$request_body_file` names an unnamed body file.
    ("linkat", libc::SYS_linkat),
    // The same calls by their older names, which std uses where they exist.
    #[cfg(target_arch = "x86_64")]
    ("open", libc::SYS_open),
    #[cfg(target_arch = "x86_64")]
    ("stat", libc::SYS_stat),
    #[cfg(target_arch = "x86_64")]
    ("lstat", libc::SYS_lstat),
    #[cfg(target_arch = "x86_64")]
    ("mkdir", libc::SYS_mkdir),
    #[cfg(target_arch = "x86_64")]
    ("unlink", libc::SYS_unlink),
    #[cfg(target_arch = "x86_64")]
    ("rename", libc::SYS_rename),
    #[cfg(target_arch = "x86_64")]
    ("epoll_wait", libc::SYS_epoll_wait),
    ("epoll_pwait", libc::SYS_epoll_pwait),
    ("epoll_ctl", libc::SYS_epoll_ctl),
    ("accept4", libc::SYS_accept4),
    ("socket", libc::SYS_socket),
    ("connect", libc::SYS_connect),
    // `proxy_bind`: the upstream socket's local address.
    ("bind", libc::SYS_bind),
    ("shutdown", libc::SYS_shutdown),
    ("getsockopt", libc::SYS_getsockopt),
    ("setsockopt", libc::SYS_setsockopt),
    ("getsockname", libc::SYS_getsockname),
    ("getpeername", libc::SYS_getpeername),
    ("recvfrom", libc::SYS_recvfrom),
    ("sendto", libc::SYS_sendto),
    // QUIC datagrams cut by the kernel (`quic_gso on`: `UDP_SEGMENT` travels as a control
    // message).
    ("sendmsg", libc::SYS_sendmsg),
    // Time, identity, accounting.
    ("clock_gettime", libc::SYS_clock_gettime),
    ("gettimeofday", libc::SYS_gettimeofday),
    ("getrusage", libc::SYS_getrusage),
    ("getpid", libc::SYS_getpid),
    ("getppid", libc::SYS_getppid),
    ("gettid", libc::SYS_gettid),
    ("geteuid", libc::SYS_geteuid),
    ("getuid", libc::SYS_getuid),
    // Memory.
    ("brk", libc::SYS_brk),
    ("mmap", libc::SYS_mmap),
    ("munmap", libc::SYS_munmap),
    ("mremap", libc::SYS_mremap),
    ("madvise", libc::SYS_madvise),
    ("mprotect", libc::SYS_mprotect),
    // Threads' runtime, signals and the way out (a panic aborts through these).
    ("futex", libc::SYS_futex),
    ("sched_yield", libc::SYS_sched_yield),
    ("rt_sigprocmask", libc::SYS_rt_sigprocmask),
    ("rt_sigreturn", libc::SYS_rt_sigreturn),
    ("rt_sigaction", libc::SYS_rt_sigaction),
    ("sigaltstack", libc::SYS_sigaltstack),
    ("tgkill", libc::SYS_tgkill),
    ("getrandom", libc::SYS_getrandom),
    ("restart_syscall", libc::SYS_restart_syscall),
    ("exit", libc::SYS_exit),
    ("exit_group", libc::SYS_exit_group),
];

/// What the running kernel offers, for the master's notice.
pub fn kernel_support() -> (Option<i64>, bool) {
    // SAFETY: landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION) only returns
    // the ABI version; prctl(PR_GET_SECCOMP) only reads.
    let abi = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            1u32,
        )
    };
    let seccomp = unsafe { libc::prctl(libc::PR_GET_SECCOMP, 0, 0, 0, 0) } >= 0;
    ((abi > 0).then_some(abi), seccomp)
}

/// What was applied.
#[derive(Debug, Clone, Copy)]
pub struct Applied {
    pub landlock: bool,
    pub seccomp: bool,
}

/// Confines the calling worker: Landlock to `plan`, then the seccomp allowlist. Paths that do
/// not exist are left out (nothing under them can be opened anyway). Errors other than a
/// kernel without support are returned: the worker must then not serve.
pub fn enter(plan: &Plan) -> Result<Applied, String> {
    let landlock = landlock(plan).map_err(|e| format!("landlock: {e}"))?;
    let seccomp = seccomp()?;
    Ok(Applied { landlock, seccomp })
}

fn landlock(plan: &Plan) -> Result<bool, landlock::RulesetError> {
    // The rights of ABI 2: read, write, make, remove, refer. Truncation (ABI 3) and device
    // ioctls (ABI 5) are left to seccomp, which refuses `truncate`, `ftruncate` and `ioctl`
    // outright: handled by Landlock, each `open` would walk the whole path up to `/` to
    // learn that they are not granted (measured: +8% CPU per static request).
    let abi = ABI::V2;
    let all = AccessFs::from_all(abi);
    let append: BitFlags<AccessFs> = AccessFs::WriteFile.into();
    let mut rs = Ruleset::default().handle_access(all)?.create()?;
    for (paths, access) in [
        (&plan.read, AccessFs::from_read(abi)),
        (&plan.append, append),
        (&plan.temp, all),
    ] {
        for p in paths {
            if let Ok(fd) = PathFd::new(p) {
                rs = rs.add_rule(PathBeneath::new(fd, access))?;
            }
        }
    }
    let status = rs.restrict_self()?;
    Ok(status.ruleset != RulesetStatus::NotEnforced)
}

fn seccomp() -> Result<bool, String> {
    let (_, supported) = kernel_support();
    if !supported {
        return Ok(false);
    }
    let Some(arch) = audit_arch() else {
        return Err(format!(
            "seccomp: no filter for the {} architecture",
            std::env::consts::ARCH
        ));
    };
    let nrs: Vec<i64> = SYSCALLS.iter().map(|&(_, nr)| nr).collect();
    let prog = allowlist_program(&nrs, arch)
        .ok_or_else(|| "seccomp: the allowlist does not fit a filter".to_string())?;
    seccompiler::apply_filter(&prog).map_err(|e| format!("seccomp: {e}"))?;
    Ok(true)
}

/// The audit architecture seccomp reports for this build's target.
fn audit_arch() -> Option<u32> {
    match std::env::consts::ARCH {
        "x86_64" => Some(62 | 0x8000_0000 | 0x4000_0000),
        "aarch64" => Some(183 | 0x8000_0000 | 0x4000_0000),
        _ => None,
    }
}

const BPF_LD_W_ABS: u16 = (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16;
const BPF_JEQ_K: u16 = (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16;
const BPF_JGE_K: u16 = (libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K) as u16;
const BPF_RET_K: u16 = (libc::BPF_RET | libc::BPF_K) as u16;
const RET_ALLOW: u32 = 0x7fff_0000;
const RET_EPERM: u32 = 0x0005_0000 | libc::EPERM as u32;

/// Where a jump of the allowlist program goes, before offsets are known.
#[derive(Clone, Copy)]
enum To {
    Next,
    Allow,
    Deny,
    At(usize),
}

/// The seccomp program: the architecture checked, then a binary search over the sorted
/// system-call numbers (leaves of at most four equality tests), so a call costs about
/// log2(N) comparisons where a linear filter (seccompiler's) costs up to N; what is not in
/// `nrs` (x32 calls included) gets `EPERM`. `None` if a jump would exceed BPF's 255.
pub(crate) fn allowlist_program(nrs: &[i64], arch: u32) -> Option<seccompiler::BpfProgram> {
    let mut nums: Vec<u32> = nrs.iter().map(|&n| n as u32).collect();
    nums.sort_unstable();
    nums.dedup();
    // (code, k, jt, jf)
    let mut ins: Vec<(u16, u32, To, To)> = vec![
        (BPF_LD_W_ABS, 4, To::Next, To::Next),
        (BPF_JEQ_K, arch, To::Next, To::Deny),
        (BPF_LD_W_ABS, 0, To::Next, To::Next),
    ];
    fn tree(ins: &mut Vec<(u16, u32, To, To)>, nums: &[u32]) {
        if nums.len() <= 4 {
            for (i, &n) in nums.iter().enumerate() {
                let miss = if i + 1 == nums.len() {
                    To::Deny
                } else {
                    To::Next
                };
                ins.push((BPF_JEQ_K, n, To::Allow, miss));
            }
            return;
        }
        let mid = nums.len() / 2;
        let at = ins.len();
        ins.push((BPF_JGE_K, nums[mid], To::Next, To::Next));
        tree(ins, &nums[..mid]);
        let right = ins.len();
        ins[at].2 = To::At(right);
        tree(ins, &nums[mid..]);
    }
    if nums.is_empty() {
        ins.push((BPF_RET_K, RET_EPERM, To::Next, To::Next));
    } else {
        tree(&mut ins, &nums);
    }
    let allow = ins.len();
    ins.push((BPF_RET_K, RET_ALLOW, To::Next, To::Next));
    let deny = ins.len();
    ins.push((BPF_RET_K, RET_EPERM, To::Next, To::Next));
    let mut prog = Vec::with_capacity(ins.len());
    for (i, &(code, k, jt, jf)) in ins.iter().enumerate() {
        let off = |t: To| -> Option<u8> {
            let target = match t {
                To::Next => i + 1,
                To::Allow => allow,
                To::Deny => deny,
                To::At(a) => a,
            };
            u8::try_from(target.checked_sub(i + 1)?).ok()
        };
        let (jt, jf) = if code == BPF_JEQ_K || code == BPF_JGE_K {
            (off(jt)?, off(jf)?)
        } else {
            (0, 0)
        };
        prog.push(seccompiler::sock_filter { code, jt, jf, k });
    }
    Some(prog)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs the allowlist program on (arch, nr) as the kernel would.
    fn run(prog: &[seccompiler::sock_filter], arch: u32, nr: u32) -> u32 {
        let (mut pc, mut a) = (0usize, 0u32);
        loop {
            let f = &prog[pc];
            match f.code {
                BPF_LD_W_ABS => a = if f.k == 4 { arch } else { nr },
                BPF_JEQ_K | BPF_JGE_K => {
                    let hit = if f.code == BPF_JEQ_K {
                        a == f.k
                    } else {
                        a >= f.k
                    };
                    pc += usize::from(if hit { f.jt } else { f.jf });
                }
                BPF_RET_K => return f.k,
                c => panic!("unexpected code {c}"),
            }
            pc += 1;
        }
    }

    #[test]
    fn the_allowlist_program_allows_exactly_its_calls() {
        let arch = audit_arch().unwrap();
        let nrs: Vec<i64> = SYSCALLS.iter().map(|&(_, nr)| nr).collect();
        let prog = allowlist_program(&nrs, arch).expect("fits");
        for nr in 0..1024u32 {
            let want = if nrs.contains(&i64::from(nr)) {
                RET_ALLOW
            } else {
                RET_EPERM
            };
            assert_eq!(run(&prog, arch, nr), want, "syscall {nr}");
        }
        assert_eq!(run(&prog, arch, 0x4000_0000), RET_EPERM, "x32");
        assert_eq!(run(&prog, arch ^ 1, 0), RET_EPERM, "another architecture");
        // Every subset size works too (the tree's shapes).
        for n in 0..nrs.len() {
            let p = allowlist_program(&nrs[..n], arch).unwrap();
            for &nr in &nrs {
                let want = if nrs[..n].contains(&nr) {
                    RET_ALLOW
                } else {
                    RET_EPERM
                };
                assert_eq!(run(&p, arch, nr as u32), want);
            }
        }
        // A lookup takes about log2(N) comparisons: the longest path is short.
        assert!(prog.len() < nrs.len() * 2, "{}", prog.len());
    }

    #[test]
    fn the_plan_names_roots_logs_and_temporary_directories() {
        let text = "error_log /var/log/shard/error.log;\nevents {}\nhttp {\n\
             access_log /var/log/shard/access.log;\n\
             server { listen 127.0.0.1:8080; root /srv/www;\n\
               location /img/ { alias /srv/images/; }\n\
               location /up { client_body_temp_path /var/spool/shard; } }\n}\n";
        let cfg = shard_config::parse_str(
            text,
            "t.conf",
            Path::new("/nonexistent"),
            Path::new("/pfx"),
            None,
        )
        .unwrap();
        let plan = Plan::from_config(&cfg);
        assert_eq!(
            plan.read,
            vec![PathBuf::from("/srv/www"), PathBuf::from("/srv/images/")]
        );
        assert_eq!(plan.append, vec![PathBuf::from("/var/log/shard")]);
        assert_eq!(
            plan.temp,
            vec![
                PathBuf::from("/pfx/client_body_temp"),
                PathBuf::from("/var/spool/shard")
            ]
        );
        let text = plan.render(true);
        assert!(text.contains("#   read: /srv/images/\n"), "{text}");
        // Every syscall of the table once.
        let mut nrs: Vec<_> = SYSCALLS.iter().map(|s| s.1).collect();
        nrs.sort_unstable();
        nrs.dedup();
        assert_eq!(nrs.len(), SYSCALLS.len());
    }
}
