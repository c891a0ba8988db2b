//! The master process: opens every listener and shard, forks the workers, respawns the ones
//! that die, reloads the configuration, hands its sockets to a new binary, and turns signals
//! into actions.
//!
//! The master never serves traffic and stays single-threaded (so that `fork` is sound). It
//! reads signals from a signalfd in a plain epoll loop; nothing runs in signal context.
//!
//! Workers belong to a *generation* (1 at start, +1 per reload). Only the current generation is
//! respawned; older ones are stopping gracefully. Each worker writes its counters into a slot of
//! the shared region; slots are allocated so that an old generation still finishing its
//! requests keeps its own while the new one starts.

use std::collections::HashMap;
use std::ffi::OsString;
use std::os::fd::RawFd;
use std::path::PathBuf;
use std::sync::atomic::Ordering::Relaxed;

use anyhow::{Context, Result};
use shard_config::{Config, WorkerProcesses};
use shard_event::process::{self, Exit, Fork, SignalFd};
use shard_event::{Events, Interest, Poll};

use crate::listen::{self, Inherited, OpenListener};
use crate::privilege::{self, Identity};
use crate::shm::{self, SharedRegion, WorkerSlot, MAX_WORKERS};
use crate::steer;
use crate::worker::{self, WorkerArgs};

/// How long a fast stop (`TERM`/`INT`) waits for workers before `SIGKILL`.
const FAST_STOP_GRACE_MS: u64 = 5_000;

/// Re-reads the configuration from where it came from (same file, prefix and `-g`).
pub type Reloader = Box<dyn FnMut() -> Result<Config, String>>;

pub struct RunOptions {
    pub config: Config,
    /// Shown in log lines: the configuration file, or "(embedded default)".
    pub conf_name: String,
    pub reload: Reloader,
}

/// The number of workers `worker_processes` asks for on this machine.
pub fn resolve_workers(wp: WorkerProcesses) -> usize {
    match wp {
        WorkerProcesses::Fixed(n) => n.clamp(1, MAX_WORKERS),
        WorkerProcesses::Auto => process::available_cpus().min(MAX_WORKERS),
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Stopping {
    No,
    Graceful,
    Fast { kill_at_ms: u64 },
}

/// A live worker process.
struct Proc {
    idx: usize,
    slot: usize,
    generation: u64,
}

/// A worker of the current generation to start again at `at_ms`.
struct Respawn {
    idx: usize,
    generation: u64,
    at_ms: u64,
}

/// A worker that dies before it finished starting (it never wrote its pid into its slot) is
/// respawned after a delay that doubles each time, from `RESPAWN_DELAY_MIN_MS` to
/// `RESPAWN_DELAY_MAX_MS`, so a worker that cannot start does not become a fork loop; one that
/// ran is respawned at once, as nginx does. A failed `fork` is retried with the same delays.
/// Meanwhile its siblings serve its shard (`Worker::adopt_orphaned_shards`).
const RESPAWN_DELAY_MIN_MS: u64 = 100;
const RESPAWN_DELAY_MAX_MS: u64 = 5000;

struct Master {
    cfg: Config,
    /// Who the workers of the current configuration run as (`None`: the master is not root).
    identity: Option<Identity>,
    n_workers: usize,
    listeners: Vec<OpenListener>,
    region: SharedRegion,
    access_logs: HashMap<PathBuf, RawFd>,
    /// Every `limit_*_zone` mapped so far, by name and size (kept across reloads: a zone of
    /// the same name and size keeps its state, as nginx's).
    zones_by_name: HashMap<(String, usize), crate::limits::Zone>,
    /// The zones of the current configuration, in its `limit_zones` order.
    zones: Vec<crate::limits::Zone>,
    procs: HashMap<libc::pid_t, Proc>,
    generation: u64,
    /// Slot of each worker index of the current generation.
    slots: Vec<usize>,
    poll: Poll,
    signals: SignalFd,
    stopping: Stopping,
    reload: Reloader,
    /// `SIGWINCH` stopped the workers (binary upgrade); `SIGHUP` brings them back.
    workers_stopped: bool,
    /// A new binary started by `SIGUSR2`, while it runs.
    upgrade_child: Option<libc::pid_t>,
    /// The pid file this master owns: `pid`, or `pid.oldbin` after an upgrade started.
    pid_path: Option<PathBuf>,
    exe: PathBuf,
    args: Vec<OsString>,
    /// Workers waiting to be started again, and the current delay per worker index.
    respawns: Vec<Respawn>,
    /// What each `ssl` listener presents; rebuilt at reload.
    tls: crate::tls::TlsContexts,
    /// Session-ticket keys, made once: every worker of every generation shares them.
    ticketer: std::sync::Arc<dyn rustls::server::ProducesTickets>,
    /// What the master exits with once stopped: 1 when it stopped because no worker of its
    /// generation could run.
    exit_code: i32,
    respawn_delay_ms: HashMap<usize, u64>,
    /// Per worker index of the current generation: what the stall detector remembers
    /// (`steer.rs`); empty while steering is off or not needed.
    judges: Vec<steer::Judge>,
    /// When the next steering tick is due.
    next_steer_ms: u64,
    /// What a backlogged (busy, not stalled) worker gets (`steer::Backlog`).
    backlog: steer::Backlog,
    /// `steer::Funnel` is used (`SHARD_STEER_FUNNEL`), and its state.
    funnel_enabled: bool,
    funnel: steer::Funnel,
    /// The cache manager process of the current configuration (`cache::manage`), while one
    /// runs, and the cache loader (`cache::load`) while it indexes.
    cache_manager: Option<libc::pid_t>,
    cache_loader: Option<libc::pid_t>,
}

fn tcp_nodelay(cfg: &Config) -> bool {
    cfg.http
        .as_ref()
        .is_none_or(|h| h.servers.iter().all(|s| s.base.tcp_nodelay))
}

/// The shared-memory zones of `cfg`'s `limit_req_zone`/`limit_conn_zone`, in order: mapped
/// anew, or the one of the same name and size already mapped.
fn map_zones(
    cfg: &Config,
    known: &mut HashMap<(String, usize), crate::limits::Zone>,
) -> Result<Vec<crate::limits::Zone>, String> {
    let http = cfg.http.iter().flat_map(|h| &h.limit_zones);
    // The stream's zones follow http's, in a namespace of their own.
    let stream = cfg.stream.iter().flat_map(|s| &s.limit_zones);
    let mut out = Vec::new();
    for (z, prefix) in http.map(|z| (z, "")).chain(stream.map(|z| (z, "stream:"))) {
        let key = (format!("{prefix}{}", z.name), z.size);
        let zone = match known.get(&key) {
            Some(zone) => *zone,
            None => {
                let zone = crate::limits::Zone::create(z.size)
                    .map_err(|e| format!("mmap(MAP_ANON|MAP_SHARED, {}) failed ({e})", z.size))?;
                known.insert(key, zone);
                zone
            }
        };
        out.push(zone);
    }
    Ok(out)
}

/// Every access log once: its path (the `syslog:...` text for syslog) and its syslog
/// settings.
type LogDest = (PathBuf, Option<std::sync::Arc<shard_config::Syslog>>);

fn access_log_paths(cfg: &Config) -> Vec<LogDest> {
    let mut v: Vec<LogDest> = Vec::new();
    let http = cfg.http.iter().flat_map(|h| &h.servers).flat_map(|s| {
        std::iter::once(&s.base)
            .chain(s.locations.iter())
            .flat_map(|l| &l.access_logs)
    });
    let stream = cfg
        .stream
        .iter()
        .flat_map(|s| &s.servers)
        .flat_map(|s| &s.access_logs);
    // A path with variables is opened by the worker, line by line.
    for al in http.chain(stream).filter(|al| al.path_vars.is_none()) {
        if !v.iter().any(|(p, _)| *p == al.path) {
            v.push((al.path.clone(), al.syslog.clone()));
        }
    }
    for p in &cfg.declared_logs {
        if !v.iter().any(|(q, _)| q == p) {
            v.push((p.clone(), None));
        }
    }
    // The error logs below main: opened (and reopened) the same way; workers find them by
    // path (a syslog one by its `syslog:...` text).
    for l in &cfg.context_error_logs {
        let dest = match &l.target {
            shard_config::LogTarget::File(p) => (p.clone(), None),
            shard_config::LogTarget::Syslog(s) => (PathBuf::from(&s.text), Some(s.clone())),
            shard_config::LogTarget::Stderr => continue,
        };
        if !v.iter().any(|(q, _)| *q == dest.0) {
            v.push(dest);
        }
    }
    v
}

/// Creates every `client_body_temp_path` (mode 0700, owned by the workers' identity when the
/// master is root), as nginx's `ngx_create_paths`. Level directories are the workers' to
/// create.
fn create_temp_paths(cfg: &Config, owner: Option<&Identity>) -> Result<(), String> {
    let Some(http) = cfg.http.as_ref() else {
        return Ok(());
    };
    let temp = http.client_body_temp_paths().into_iter().map(|tp| &tp.path);
    // `proxy_cache_path`: the workers write entries there, as in a temporary path.
    for p in temp.chain(http.cache_paths.iter().map(|c| &c.path)) {
        // Missing parents as `mkdir -p` makes them (searchable by the workers); the directory
        // itself 0700, and only it changes owner.
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|e| format!("mkdir() \"{}\" failed ({e})", parent.display()))?;
        }
        let mut b = std::fs::DirBuilder::new();
        std::os::unix::fs::DirBuilderExt::mode(&mut b, 0o700);
        match b.create(p) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && p.is_dir() => {}
            Err(e) => return Err(format!("mkdir() \"{}\" failed ({e})", p.display())),
        }
        if let Some(id) = owner {
            std::os::unix::fs::chown(p, Some(id.uid), Some(id.gid))
                .map_err(|e| format!("chown(\"{}\", {}) failed ({e})", p.display(), id.uid))?;
        }
    }
    Ok(())
}

/// `worker_sandbox on` on a kernel without Landlock or seccomp: said once, by the master.
fn sandbox_notice(cfg: &Config) {
    if !cfg.main.worker_sandbox {
        return;
    }
    let (landlock, seccomp) = crate::sandbox::kernel_support();
    if landlock.is_none() {
        crate::log!(
            Notice,
            "worker_sandbox: the kernel has no Landlock: workers are not confined to their files"
        );
    }
    if !seccomp {
        crate::log!(
            Notice,
            "worker_sandbox: the kernel has no seccomp: workers' system calls are not filtered"
        );
    }
}

/// The workers' identity for `cfg`, with nginx's warning when `user` is ignored and a notice
/// when the default identity had to take another group than `nobody`.
fn identity_for(cfg: &Config) -> Result<Option<Identity>, String> {
    if let Some(w) = privilege::ignored_user_warning(cfg) {
        crate::log!(Warn, "{w}");
    }
    let id = privilege::worker_identity(cfg)?;
    if let Some(id) = &id {
        for w in privilege::unreachable_paths(cfg, id) {
            crate::log!(Warn, "{w}");
        }
        if cfg.main.user.is_none() && id.group != "nobody" {
            crate::log!(
                Notice,
                "no \"user\" directive: workers run as \"{}\", group \"{}\" (there is no group \"nobody\")",
                id.user,
                id.group
            );
        }
    }
    Ok(id)
}

fn describe(listeners: &[OpenListener]) -> String {
    let shown: Vec<String> = listeners
        .iter()
        .map(|l| {
            let addr = match &l.opts.unix {
                Some(p) => format!("unix:{}", p.display()),
                None => shard_event::sock::local_addr(l.fds[0])
                    .map_or(l.addr.to_string(), |a| a.to_string()),
            };
            if l.per_worker {
                format!("{addr} (reuseport, {} shards)", l.active)
            } else if l.reuseport {
                // As `/status` reports it: shard 0 (of 1) polled by every worker.
                let n = l.active;
                let s = if n == 1 { "" } else { "s" };
                format!("{addr} (reuseport, {n} shared shard{s})")
            } else {
                format!("{addr} (shared)")
            }
        })
        .collect();
    if shown.is_empty() {
        "nothing".to_string()
    } else {
        shown.join(", ")
    }
}

/// `master_process off`: the one worker loop runs in this process (nginx's single-process
/// mode, for debugging): no respawn, no reload, no binary upgrade; `QUIT`, `TERM` and
/// `USR1` work as for a worker. Privileges are dropped as for any worker.
#[allow(clippy::too_many_arguments)]
fn single_process(
    cfg: &Config,
    listeners: &[OpenListener],
    region: &SharedRegion,
    access_logs: &HashMap<PathBuf, RawFd>,
    zones: &[crate::limits::Zone],
    tls: &crate::tls::TlsContexts,
    identity: Option<Identity>,
    poll: Poll,
    signals: SignalFd,
) -> i32 {
    // The worker reads its own signalfd and waits in its own epoll.
    drop(signals);
    drop(poll);
    crate::log!(
        Notice,
        "master_process off: serving in this process (no reload, no respawn)"
    );
    let w = region.worker(0);
    w.reset();
    w.generation.store(1, Relaxed);
    region.slot_of[0].store(0, Relaxed);
    region.n_workers.store(1, Relaxed);
    if let Err(e) = privilege::enter_worker(identity.as_ref(), cfg.transparent_binds()) {
        crate::log!(Emerg, "{e}");
        return 1;
    }
    let code = worker::run(WorkerArgs {
        idx: 0,
        slot: 0,
        n_workers: 1,
        cfg,
        listeners,
        region,
        access_logs,
        zones,
        tls,
    });
    crate::log!(Notice, "exit");
    code
}

/// Where process titles are written (see `shard_event::process::init_title`); set once by
/// the master, inherited by the workers it forks.
static TITLE: std::sync::OnceLock<Option<process::TitleArea>> = std::sync::OnceLock::new();

/// Sets the title `ps` shows for this process, as nginx's (`shard: worker process`).
pub(crate) fn set_title(title: &str) {
    if let Some(Some(area)) = TITLE.get() {
        process::set_title(*area, title);
    }
}

/// Runs the master until it stops; returns the process exit code.
pub fn run(opts: RunOptions) -> Result<i32> {
    let cfg = opts.config;
    // Drawn here, before any worker is forked: every worker of every generation makes the
    // same stateless reset tokens (`worker/h3.rs`).
    crate::worker::quic_reset_secret();
    crate::log::make_prefix_logs_dir(&cfg.prefix);
    crate::log::init(&cfg.main.error_log.target, cfg.main.error_log.level)
        .context("cannot open the error log")?;
    crate::log::init_extra(&cfg.main.more_error_logs).context("cannot open an error log")?;
    // `master_process off` serves in this one process: one worker, as nginx's single-process
    // mode ignores `worker_processes`.
    let n_workers = if cfg.main.master_process {
        resolve_workers(cfg.main.worker_processes)
    } else {
        1
    };
    cfg.check_workers(n_workers)
        .map_err(|e| anyhow::anyhow!("{e}"))?;

    process::block_signals().context("sigprocmask")?;
    let mut signals = SignalFd::new().context("signalfd")?;
    let mut poll = Poll::new().context("epoll_create")?;
    poll.add(signals.fd(), 0, Interest::READ)
        .context("epoll_ctl")?;

    // Sockets handed over by a previous master or systemd are adopted before anything binds.
    let mut inherited = Inherited::from_env();
    let adopting = !inherited.is_empty();
    let upgraded = inherited.upgrade;
    let nodelay = tcp_nodelay(&cfg);
    let mut listeners = Vec::with_capacity(cfg.listeners.len());
    for (i, l) in cfg.listeners.iter().enumerate() {
        let ol = listen::open(i, l, n_workers, nodelay, &mut inherited)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        listeners.push(ol);
    }
    if adopting {
        crate::log!(Notice, "using inherited sockets");
    }
    for addr in inherited.close_unclaimed() {
        crate::log!(
            Notice,
            "closing inherited sockets of {addr}: no longer configured"
        );
    }

    let identity = identity_for(&cfg).map_err(|e| anyhow::anyhow!("{e}"))?;
    // Certificates are read here, as root, before any worker exists; a reload reads them
    // again and keeps the running generation when one fails.
    let ticketer = crate::tls::ticketer().map_err(|e| anyhow::anyhow!("{e}"))?;
    let tls = crate::tls::build(&cfg, &ticketer).map_err(|e| anyhow::anyhow!("{e}"))?;
    crate::tls::encryption_notice(&tls);
    sandbox_notice(&cfg);
    create_temp_paths(&cfg, identity.as_ref()).map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut access_logs = HashMap::new();
    for (path, syslog) in access_log_paths(&cfg) {
        let fd = match syslog {
            // A datagram socket the workers inherit, as a file's descriptor.
            Some(s) => crate::log::open_syslog(&s),
            None => crate::log::open_append(&path).map_err(|e| anyhow::anyhow!("{e}"))?,
        };
        access_logs.insert(path, fd);
    }

    // `daemon on`: everything that can fail at start has been tried and said on the
    // terminal; now detach. A master started by a binary upgrade is already detached (its
    // parent is the old master), as nginx skips `ngx_daemon` when it inherits sockets.
    if cfg.main.daemon && !upgraded {
        // SAFETY: the master is single-threaded (ARCHITECTURE.md invariant).
        match unsafe { process::fork() }.context("fork() failed")? {
            process::Fork::Parent(_) => std::process::exit(0),
            process::Fork::Child => {
                process::detach(crate::log::file_fd()).context("setsid() failed")?;
                if crate::log::file_fd().is_some() {
                    crate::log::stderr_follows_log();
                }
            }
        }
        // A signalfd wakes the epoll instances registered by the process that added it: the
        // daemon makes its own, or no signal would ever wake it.
        signals = SignalFd::new().context("signalfd")?;
        poll = Poll::new().context("epoll_create")?;
        poll.add(signals.fd(), 0, Interest::READ)
            .context("epoll_ctl")?;
    }

    let region = shm::create().context("cannot map the shared-memory region")?;
    region.n_workers.store(n_workers as u64, Relaxed);
    // A binary upgrade's counts: counters continue from the old master's (at USR2).
    if let Some(v) = std::env::var_os(shm::COUNTERS_ENV) {
        region.seed_counters(&v.to_string_lossy());
        std::env::remove_var(shm::COUNTERS_ENV);
    }

    if let Some(pid_path) = &cfg.main.pid {
        std::fs::write(pid_path, format!("{}\n", process::getpid()))
            .with_context(|| format!("open() \"{}\" failed", pid_path.display()))?;
    }

    crate::log!(
        Notice,
        "shard/{} started with {}: {} worker processes, listening on {}",
        env!("CARGO_PKG_VERSION"),
        opts.conf_name,
        n_workers,
        describe(&listeners)
    );

    let mut zones_by_name = HashMap::new();
    let zones = map_zones(&cfg, &mut zones_by_name).map_err(|e| anyhow::anyhow!("{e}"))?;
    crate::cache::map_zones(&cfg).map_err(|e| anyhow::anyhow!("{e}"))?;
    if !cfg.main.master_process {
        return Ok(single_process(
            &cfg,
            &listeners,
            &region,
            &access_logs,
            &zones,
            &tls,
            identity,
            poll,
            signals,
        ));
    }
    let mut m = Master {
        tls,
        ticketer,
        zones_by_name,
        zones,
        pid_path: cfg.main.pid.clone(),
        cfg,
        identity,
        n_workers,
        listeners,
        region,
        access_logs,
        procs: HashMap::new(),
        generation: 1,
        slots: Vec::new(),
        poll,
        signals,
        stopping: Stopping::No,
        reload: opts.reload,
        workers_stopped: false,
        upgrade_child: None,
        exe: std::env::current_exe().unwrap_or_else(|_| PathBuf::from("shard")),
        args: std::env::args_os().skip(1).collect(),
        respawns: Vec::new(),
        exit_code: 0,
        respawn_delay_ms: HashMap::new(),
        judges: Vec::new(),
        next_steer_ms: 0,
        backlog: steer::Backlog::from_env(),
        funnel_enabled: steer::funnel_from_env(),
        funnel: steer::Funnel::default(),
        cache_manager: None,
        cache_loader: None,
    };
    // `ps` tells the master from its workers, as nginx's titles do. The arguments were copied
    // (for a binary upgrade) above; the title overwrites the originals.
    let cmdline: Vec<String> = std::env::args().collect();
    let _ = TITLE.set(process::init_title());
    set_title(&format!("shard: master process {}", cmdline.join(" ")));
    m.start_generation()?;
    let code = m.run_loop();
    m.stop_cache_manager();
    // As nginx: the files of Unix-domain listeners go with the master, unless a new binary
    // took the sockets over.
    if m.upgrade_child.is_none() {
        for l in &m.listeners {
            if let Some(p) = &l.opts.unix {
                let _ = std::fs::remove_file(p);
            }
        }
    }
    if let Some(pid_path) = &m.pid_path {
        let _ = std::fs::remove_file(pid_path);
    }
    crate::log!(Notice, "exit");
    Ok(code)
}

impl Master {
    fn slot_free(&self, s: usize) -> bool {
        !self.procs.values().any(|p| p.slot == s)
    }

    /// Starts the cache manager of the current configuration (when it has a cache), in place
    /// of the one of the configuration before.
    fn restart_cache_manager(&mut self) {
        self.stop_cache_manager();
        if self
            .cfg
            .http
            .as_ref()
            .is_none_or(|h| h.cache_paths.is_empty())
        {
            return;
        }
        let master_pid = process::getpid();
        // SAFETY: the master is single-threaded (ARCHITECTURE.md invariant).
        match unsafe { process::fork() } {
            Ok(Fork::Parent(pid)) => {
                self.cache_manager = Some(pid);
                crate::log!(Notice, "start cache manager process {pid}");
                self.start_cache_loader();
            }
            Ok(Fork::Child) => {
                process::set_parent_death_signal(libc::SIGTERM);
                // The master's signals are blocked for its signalfd: the manager takes their
                // default actions (TERM and QUIT end it).
                let _ = process::unblock_signals();
                if process::getppid() != master_pid {
                    std::process::exit(0);
                }
                set_title("shard: cache manager process");
                if let Err(e) = privilege::enter_worker(self.identity.as_ref(), false) {
                    crate::log!(Emerg, "{e}");
                    std::process::exit(2);
                }
                crate::cache::manage(&self.cfg, master_pid);
                std::process::exit(0);
            }
            Err(e) => crate::log!(Alert, "fork() of the cache manager failed ({e})"),
        }
    }

    fn stop_cache_manager(&mut self) {
        for pid in [self.cache_manager.take(), self.cache_loader.take()]
            .into_iter()
            .flatten()
        {
            let _ = process::kill(pid, libc::SIGTERM);
        }
    }

    /// Starts the cache loader of the current configuration: it indexes what is on disk and
    /// exits (nginx starts one at start and at each reload).
    fn start_cache_loader(&mut self) {
        let master_pid = process::getpid();
        // SAFETY: the master is single-threaded (ARCHITECTURE.md invariant).
        match unsafe { process::fork() } {
            Ok(Fork::Parent(pid)) => {
                self.cache_loader = Some(pid);
                crate::log!(Notice, "start cache loader process {pid}");
            }
            Ok(Fork::Child) => {
                process::set_parent_death_signal(libc::SIGTERM);
                let _ = process::unblock_signals();
                if process::getppid() != master_pid {
                    std::process::exit(0);
                }
                set_title("shard: cache loader process");
                if let Err(e) = privilege::enter_worker(self.identity.as_ref(), false) {
                    crate::log!(Emerg, "{e}");
                    std::process::exit(2);
                }
                let n = crate::cache::load(&self.cfg);
                crate::log!(Notice, "http file cache: {n} entries indexed");
                std::process::exit(0);
            }
            Err(e) => crate::log!(Alert, "fork() of the cache loader failed ({e})"),
        }
    }

    /// Allocates slots and starts every worker of the current generation.
    fn start_generation(&mut self) -> Result<()> {
        self.restart_cache_manager();
        let mut slots = Vec::with_capacity(self.n_workers);
        let mut s = 0;
        while slots.len() < self.n_workers {
            if s >= MAX_WORKERS {
                anyhow::bail!(
                    "no free worker slot: too many workers of older generations are still stopping"
                );
            }
            if self.slot_free(s) {
                slots.push(s);
            }
            s += 1;
        }
        for (i, &s) in slots.iter().enumerate() {
            let w = self.region.worker(s);
            // A new generation's worker starts from zero in every number, whatever an older
            // worker left in the slot (a respawn, unlike this, continues them).
            w.reset();
            w.generation.store(self.generation, Relaxed);
            w.idx.store(i as u64, Relaxed);
            self.region.slot_of[i].store(s as u64, Relaxed);
        }
        self.region.n_workers.store(self.n_workers as u64, Relaxed);
        self.region.generation.store(self.generation, Relaxed);
        self.slots = slots;
        // The new generation's workers are judged afresh, each after a grace period; its
        // groups stay dealt in turn meanwhile.
        self.stop_steering(self.cfg.events.reuseport_steering);
        self.respawns.clear();
        self.respawn_delay_ms.clear();
        // The configuration's parse left freed memory behind; the workers should not start
        // with it resident.
        shard_event::process::trim_heap();
        for idx in 0..self.n_workers {
            if let Err(e) = self.spawn(idx) {
                // The shard is not lost: its siblings serve it until the retry succeeds.
                crate::log!(Alert, "could not start worker {idx}: {e:#}");
                self.schedule_respawn(idx);
            }
        }
        Ok(())
    }

    /// Starts worker `idx` again after its current delay, doubling the delay.
    fn schedule_respawn(&mut self, idx: usize) {
        let slot = self.respawn_delay_ms.entry(idx).or_insert(0);
        *slot = (*slot * 2).clamp(RESPAWN_DELAY_MIN_MS, RESPAWN_DELAY_MAX_MS);
        let d = *slot;
        let at_ms = shard_event::monotonic_ms() + d;
        // Every worker of the generation keeps dying before it starts, and none runs:
        // holding the sockets would queue connections nobody serves.
        let current = self.generation;
        if self.respawn_delay_ms.len() >= self.n_workers
            && self
                .respawn_delay_ms
                .values()
                .all(|&d| d >= RESPAWN_DELAY_MAX_MS)
            && !self.procs.values().any(|p| p.generation == current)
        {
            crate::log!(
                Emerg,
                "no worker process of generation {current} could start: exiting"
            );
            self.exit_code = 1;
            self.stopping = Stopping::Graceful;
            self.signal_workers(libc::SIGQUIT, None);
            return;
        }
        crate::log!(Notice, "respawning worker {idx} in {d} ms");
        self.respawns.push(Respawn {
            idx,
            generation: self.generation,
            at_ms,
        });
    }

    /// Runs the respawns that are due; returns the time until the next one.
    fn run_respawns(&mut self) -> Option<u64> {
        let now = shard_event::monotonic_ms();
        let due: Vec<Respawn>;
        (due, self.respawns) = std::mem::take(&mut self.respawns)
            .into_iter()
            .partition(|r| r.at_ms <= now);
        for r in due {
            if r.generation != self.generation
                || self.stopping != Stopping::No
                || self.workers_stopped
            {
                continue;
            }
            if let Err(e) = self.spawn(r.idx) {
                crate::log!(Alert, "could not respawn worker {}: {e:#}", r.idx);
                self.schedule_respawn(r.idx);
            }
        }
        self.respawns
            .iter()
            .map(|r| r.at_ms.saturating_sub(now))
            .min()
    }

    fn spawn(&mut self, idx: usize) -> Result<()> {
        let master_pid = process::getpid();
        let slot = self.slots[idx];
        // SAFETY: the master is single-threaded (ARCHITECTURE.md invariant): nothing in it
        // starts a thread, so the child inherits no lock another thread holds.
        match unsafe { process::fork() }.context("fork() failed")? {
            Fork::Parent(pid) => {
                self.procs.insert(
                    pid,
                    Proc {
                        idx,
                        slot,
                        generation: self.generation,
                    },
                );
                crate::log!(
                    Notice,
                    "start worker process {pid} (worker {idx}, generation {})",
                    self.generation
                );
                Ok(())
            }
            Fork::Child => {
                // A worker never outlives its master: if the master is killed, workers stop
                // gracefully instead of holding the port forever.
                process::set_parent_death_signal(libc::SIGQUIT);
                if process::getppid() != master_pid {
                    std::process::exit(0);
                }
                if let Some(n) = self.cfg.main.worker_rlimit_nofile {
                    if let Err(e) = process::set_nofile_limit(n) {
                        crate::log!(
                            Alert,
                            "setrlimit(RLIMIT_NOFILE, {n}) failed ({})",
                            shard_event::os_error_text(&e)
                        );
                    }
                }
                self.worker_process_settings(idx);
                // No silent root worker: one that cannot give up its privileges exits with 2,
                // which is never respawned.
                let keep = self.cfg.transparent_binds();
                if let Err(e) = privilege::enter_worker(self.identity.as_ref(), keep) {
                    crate::log!(Emerg, "{e}");
                    std::process::exit(2);
                }
                self.worker_directory();
                // The `quic` sockets other workers read: a socket must close once its own
                // worker and the master let it go.
                for l in &self.listeners {
                    for fd in l.quic_foreign_fds(idx) {
                        shard_event::sock::close(fd);
                    }
                }
                let code = worker::run(WorkerArgs {
                    idx,
                    slot,
                    n_workers: self.n_workers,
                    cfg: &self.cfg,
                    listeners: &self.listeners,
                    region: &self.region,
                    access_logs: &self.access_logs,
                    zones: &self.zones,
                    tls: &self.tls,
                });
                std::process::exit(code);
            }
        }
    }

    /// `worker_rlimit_core`, `worker_priority` and `worker_cpu_affinity` in a new worker, before it gives up root (a negative nice value needs it). A failure
    /// is logged and the worker goes on, as nginx's does.
    fn worker_process_settings(&self, idx: usize) {
        let main = &self.cfg.main;
        if let Some(n) = main.worker_rlimit_core {
            if let Err(e) = process::set_core_limit(n) {
                crate::log!(
                    Alert,
                    "setrlimit(RLIMIT_CORE, {n}) failed ({})",
                    shard_event::os_error_text(&e)
                );
            }
        }
        if main.worker_priority != 0 {
            if let Err(e) = process::set_priority(main.worker_priority) {
                crate::log!(
                    Alert,
                    "setpriority({}) failed ({})",
                    main.worker_priority,
                    shard_event::os_error_text(&e)
                );
            }
        }
        if let Some(aff) = &main.worker_cpu_affinity {
            let online = process::cpu_affinity().unwrap_or(u64::MAX);
            if let Some(mask) = aff.for_worker(idx, online) {
                match process::set_cpu_affinity(mask) {
                    Ok(()) => {
                        crate::log!(Notice, "sched_setaffinity(): using cpus {}", cpu_list(mask))
                    }
                    Err(e) => crate::log!(
                        Alert,
                        "sched_setaffinity() failed ({})",
                        shard_event::os_error_text(&e)
                    ),
                }
            }
        }
    }

    /// `working_directory`, after the worker gave up root as nginx's does (the directory must
    /// be the worker user's).
    fn worker_directory(&self) {
        let main = &self.cfg.main;
        if let Some(dir) = &main.working_directory {
            if let Err(e) = std::env::set_current_dir(dir) {
                crate::log!(
                    Alert,
                    "chdir(\"{}\") failed ({})",
                    dir.display(),
                    shard_event::os_error_text(&e)
                );
            }
        }
    }

    fn signal_workers(&self, sig: libc::c_int, only_generation: Option<u64>) {
        for (pid, p) in &self.procs {
            if only_generation.is_none_or(|g| g == p.generation) {
                let _ = process::kill(*pid, sig);
            }
        }
    }

    fn run_loop(&mut self) -> i32 {
        let mut events = Events::with_capacity(8);
        loop {
            let mut timeout = match self.stopping {
                Stopping::Fast { kill_at_ms } => {
                    kill_at_ms.saturating_sub(shard_event::monotonic_ms()) as i32
                }
                _ => -1,
            };
            if let Some(next) = self.run_respawns() {
                let next = next.min(i32::MAX as u64) as i32;
                timeout = if timeout < 0 { next } else { timeout.min(next) };
            }
            if let Some(next) = self.steer_tick() {
                let next = next.min(i32::MAX as u64) as i32;
                timeout = if timeout < 0 { next } else { timeout.min(next) };
            }
            let _ = self.poll.wait(&mut events, timeout);
            while let Some((sig, _from)) = self.signals.read() {
                self.on_signal(sig);
            }
            if self.stopping != Stopping::No {
                self.stop_cache_manager();
            }
            if let Stopping::Fast { kill_at_ms } = self.stopping {
                if shard_event::monotonic_ms() >= kill_at_ms {
                    crate::log!(Alert, "workers did not stop in time, sending SIGKILL");
                    self.signal_workers(libc::SIGKILL, None);
                    self.stopping = Stopping::Fast {
                        kill_at_ms: u64::MAX,
                    };
                }
            }
            if self.stopping != Stopping::No && self.procs.is_empty() {
                return self.exit_code;
            }
        }
    }

    fn on_signal(&mut self, sig: libc::c_int) {
        match sig {
            libc::SIGCHLD => self.reap(),
            libc::SIGQUIT => {
                if self.stopping == Stopping::No {
                    crate::log!(
                        Notice,
                        "signal {sig} (SIGQUIT) received, shutting down gracefully"
                    );
                    self.stopping = Stopping::Graceful;
                    self.signal_workers(libc::SIGQUIT, None);
                }
            }
            libc::SIGTERM | libc::SIGINT => {
                crate::log!(
                    Notice,
                    "signal {sig} ({}) received, exiting",
                    if sig == libc::SIGTERM {
                        "SIGTERM"
                    } else {
                        "SIGINT"
                    }
                );
                if !matches!(self.stopping, Stopping::Fast { .. }) {
                    self.stopping = Stopping::Fast {
                        kill_at_ms: shard_event::monotonic_ms() + FAST_STOP_GRACE_MS,
                    };
                    self.signal_workers(libc::SIGTERM, None);
                }
            }
            libc::SIGUSR1 => {
                crate::log!(Notice, "signal {sig} (SIGUSR1) received, reopening logs");
                self.reopen_logs();
                self.signal_workers(libc::SIGUSR1, None);
            }
            libc::SIGHUP if self.stopping == Stopping::No => {
                if self.workers_stopped {
                    crate::log!(
                        Notice,
                        "signal {sig} (SIGHUP) received, starting workers again"
                    );
                    self.workers_stopped = false;
                    self.generation += 1;
                    if let Err(e) = self.start_generation() {
                        crate::log!(Alert, "{e:#}");
                    }
                } else {
                    crate::log!(Notice, "signal {sig} (SIGHUP) received, reconfiguring");
                    self.reconfigure();
                }
            }
            libc::SIGUSR2 if self.stopping == Stopping::No => self.upgrade(),
            libc::SIGWINCH if self.stopping == Stopping::No => {
                crate::log!(
                    Notice,
                    "signal {sig} (SIGWINCH) received, gracefully stopping workers"
                );
                self.workers_stopped = true;
                self.signal_workers(libc::SIGQUIT, None);
            }
            _ => crate::log!(Info, "signal {sig} ignored"),
        }
    }

    /// `SIGHUP`: re-read the configuration; on success start a new generation on the same
    /// sockets and stop the old one gracefully; on failure keep everything as it is.
    fn reconfigure(&mut self) {
        let cfg = match (self.reload)() {
            Ok(c) => c,
            Err(e) => {
                crate::log!(Emerg, "{e}");
                crate::log!(Alert, "reload failed: keeping the running configuration");
                return;
            }
        };
        for w in &cfg.warnings {
            crate::log!(Warn, "{w}");
        }
        let n_workers = resolve_workers(cfg.main.worker_processes);
        if let Err(e) = cfg.check_workers(n_workers) {
            crate::log!(Emerg, "{e}");
            crate::log!(Alert, "reload failed: keeping the running configuration");
            return;
        }
        let identity = match identity_for(&cfg)
            .and_then(|id| create_temp_paths(&cfg, id.as_ref()).map(|()| id))
        {
            Ok(id) => id,
            Err(e) => {
                crate::log!(Emerg, "{e}");
                crate::log!(Alert, "reload failed: keeping the running configuration");
                return;
            }
        };
        if !self.cfg.main.worker_sandbox {
            sandbox_notice(&cfg);
        }
        let nodelay = tcp_nodelay(&cfg);
        // New addresses first: a bind that fails leaves the running set untouched.
        let mut fresh: HashMap<usize, OpenListener> = HashMap::new();
        for (i, l) in cfg.listeners.iter().enumerate() {
            if self
                .listeners
                .iter()
                .any(|o| o.addr == l.addr && o.opts.udp == l.opts.udp)
            {
                continue;
            }
            match listen::open(i, l, n_workers, nodelay, &mut Inherited::default()) {
                Ok(ol) => {
                    fresh.insert(i, ol);
                }
                Err(e) => {
                    crate::log!(Emerg, "{e}");
                    crate::log!(Alert, "reload failed: keeping the running configuration");
                    for (_, ol) in fresh {
                        ol.close();
                    }
                    return;
                }
            }
        }
        let tls = match crate::tls::build(&cfg, &self.ticketer) {
            Ok(t) => t,
            Err(e) => {
                crate::log!(Emerg, "{e}");
                crate::log!(Alert, "reload failed: keeping the running configuration");
                for (_, ol) in fresh {
                    ol.close();
                }
                return;
            }
        };
        let zones = match map_zones(&cfg, &mut self.zones_by_name)
            .and_then(|z| crate::cache::map_zones(&cfg).map(|()| z))
        {
            Ok(z) => z,
            Err(e) => {
                crate::log!(Emerg, "{e}");
                crate::log!(Alert, "reload failed: keeping the running configuration");
                return;
            }
        };
        let mut access_logs = HashMap::new();
        for (path, syslog) in access_log_paths(&cfg) {
            let fd = match self.access_logs.remove(&path) {
                Some(fd) => fd,
                None if syslog.is_some() => {
                    crate::log::open_syslog(syslog.as_deref().expect("checked"))
                }
                None => match crate::log::open_append(&path) {
                    Ok(fd) => fd,
                    Err(e) => {
                        crate::log!(Alert, "{e}");
                        continue;
                    }
                },
            };
            access_logs.insert(path, fd);
        }
        for (_, fd) in self.access_logs.drain() {
            shard_event::sock::close(fd);
        }
        self.access_logs = access_logs;

        let mut old: Vec<Option<OpenListener>> = std::mem::take(&mut self.listeners)
            .into_iter()
            .map(Some)
            .collect();
        let mut listeners = Vec::with_capacity(cfg.listeners.len());
        for (i, l) in cfg.listeners.iter().enumerate() {
            if let Some(ol) = fresh.remove(&i) {
                listeners.push(ol);
                continue;
            }
            let prev = old
                .iter_mut()
                .find(|o| {
                    o.as_ref()
                        .is_some_and(|o| o.addr == l.addr && o.opts.udp == l.opts.udp)
                })
                .and_then(Option::take)
                .expect("matched above");
            // While a new binary runs, its master steers the groups (a reload here must not
            // detach its program).
            let steer_now = self.upgrade_child.is_none();
            match listen::reconcile(prev, i, l, n_workers, nodelay, steer_now) {
                Ok(mut ol) => {
                    // A steered `quic` group: the new generation reads fresh sockets; the
                    // old workers drain their connections on the old ones.
                    if let Err(e) = listen::quic_renew(&mut ol, self.generation, n_workers) {
                        crate::log!(
                            Alert,
                            "new QUIC sockets for {} failed ({e}): the generations share \
                             theirs",
                            l.addr
                        );
                    }
                    listeners.push(ol)
                }
                Err(e) => crate::log!(Alert, "{e}: {} is no longer served", l.addr),
            }
        }
        for ol in old.into_iter().flatten() {
            crate::log!(Notice, "closing {}: no longer configured", ol.addr);
            ol.close();
        }
        if let Err(e) = crate::log::init_extra(&cfg.main.more_error_logs) {
            crate::log!(
                Alert,
                "cannot open a new error log ({e}): keeping the old ones"
            );
        }
        if cfg.main.error_log.target != self.cfg.main.error_log.target
            || cfg.main.error_log.level != self.cfg.main.error_log.level
        {
            if let Err(e) = crate::log::init(&cfg.main.error_log.target, cfg.main.error_log.level) {
                crate::log!(
                    Alert,
                    "cannot open the new error log ({e}): keeping the old one"
                );
            }
        }
        let old_generation = self.generation;
        self.cfg = cfg;
        self.tls = tls;
        self.zones = zones;
        self.identity = identity;
        self.listeners = listeners;
        self.n_workers = n_workers;
        self.generation += 1;
        crate::log!(
            Notice,
            "reconfigured: generation {}, {} worker processes, listening on {}",
            self.generation,
            n_workers,
            describe(&self.listeners)
        );
        // Old workers stop accepting first, then finish what they have and exit; whatever
        // arrives meanwhile waits in the sockets (all held here) for the new generation, so
        // no request after the reload is answered with the old configuration.
        for (pid, p) in &self.procs {
            if p.generation <= old_generation {
                let _ = process::kill(*pid, libc::SIGQUIT);
            }
        }
        if let Err(e) = self.start_generation() {
            crate::log!(Alert, "{e:#}");
        }
    }

    /// `SIGUSR1`: the master opens every log file again first (creating the new files of a
    /// rotation) and gives them to the workers' user, as nginx's `ngx_reopen_files`, so that
    /// workers that are no longer root can open them in turn.
    fn reopen_logs(&mut self) {
        if let Err(e) = crate::log::reopen() {
            crate::log!(Alert, "{e}");
        }
        // Syslog destinations are sockets: nothing to reopen.
        let mut paths: Vec<PathBuf> = self
            .access_logs
            .keys()
            .filter(|p| !p.to_string_lossy().starts_with("syslog:"))
            .cloned()
            .collect();
        paths.extend(crate::log::path());
        paths.extend(crate::log::extra_paths());
        for path in &paths {
            if let Some(fd) = self.access_logs.get_mut(path) {
                match crate::log::open_append(path) {
                    Ok(new) => {
                        shard_event::sock::close(*fd);
                        *fd = new;
                    }
                    Err(e) => crate::log!(Alert, "{e}"),
                }
            }
            if let Some(id) = &self.identity {
                if let Err(e) = std::os::unix::fs::chown(path, Some(id.uid), None) {
                    crate::log!(
                        Alert,
                        "chown(\"{}\", {}) failed ({e})",
                        path.display(),
                        id.uid
                    );
                }
            }
        }
    }

    /// `SIGUSR2`: start the binary at our own path with every listening socket inherited. The
    /// new master adopts them by address and shard index; this one keeps serving until told
    /// otherwise (`SIGWINCH`, `SIGQUIT`), and takes its pid file back if the new one fails.
    fn upgrade(&mut self) {
        if let Some(pid) = self.upgrade_child {
            crate::log!(
                Alert,
                "an upgrade is already running (new master {pid}): ignoring SIGUSR2"
            );
            return;
        }
        if let Some(p) = &self.pid_path {
            let old = oldbin(p);
            if let Err(e) = std::fs::rename(p, &old) {
                crate::log!(
                    Alert,
                    "rename() \"{}\" to \"{}\" failed ({e}): upgrade cancelled",
                    p.display(),
                    old.display()
                );
                return;
            }
            self.pid_path = Some(old);
        }
        // Datagram sockets are not handed over (the new master binds its own); a steered
        // `quic` group's socket array is, so that this master's connections keep their
        // datagrams while its workers drain them.
        let (quic_env, quic_fds) = listen::quic_inherit_env_value(&self.listeners);
        let fds: Vec<RawFd> = self
            .listeners
            .iter()
            .filter(|l| !l.opts.udp)
            .flat_map(|l| l.fds.iter().copied())
            .chain(quic_fds)
            .collect();
        for &fd in &fds {
            let _ = shard_event::sock::set_cloexec(fd, false);
        }
        let res = std::process::Command::new(&self.exe)
            .args(&self.args)
            .env(
                listen::INHERIT_ENV,
                listen::inherit_env_value(&self.listeners),
            )
            .env(listen::QUIC_INHERIT_ENV, quic_env)
            // The counts so far, so the new master's counters go on from them.
            .env(shm::COUNTERS_ENV, self.region.counters_env())
            .spawn();
        for &fd in &fds {
            let _ = shard_event::sock::set_cloexec(fd, true);
        }
        match res {
            Ok(child) => {
                let pid = child.id() as libc::pid_t;
                crate::log!(
                    Notice,
                    "signal SIGUSR2 received: started new binary {} as pid {pid}",
                    self.exe.display()
                );
                self.upgrade_child = Some(pid);
            }
            Err(e) => {
                self.restore_pid_file();
                crate::log!(
                    Alert,
                    "execve() \"{}\" failed ({e}): upgrade cancelled, keeping serving",
                    self.exe.display()
                );
            }
        }
    }

    fn restore_pid_file(&mut self) {
        if let (Some(cur), Some(orig)) = (&self.pid_path, &self.cfg.main.pid) {
            if cur != orig {
                let _ = std::fs::rename(cur, orig);
                self.pid_path = Some(orig.clone());
            }
        }
    }

    /// Whether the stall detector runs: steering is on, the server runs normally (not stopping,
    /// not handing over to a new binary, whose master steers the same groups) and some
    /// reuseport group has a shard per worker, at least two of them.
    fn steering_wanted(&self) -> bool {
        self.cfg.events.reuseport_steering
            && self.stopping == Stopping::No
            && !self.workers_stopped
            && self.upgrade_child.is_none()
            && self.n_workers >= 2
            && self
                .listeners
                .iter()
                .any(|l| l.reuseport && l.per_worker && l.active >= 2)
    }

    /// Forgets every verdict, clears the workers' steering bits and gives each group back the
    /// program of its surplus shards alone, dealing new connections in turn over its other
    /// shards with `deal` (a new generation, steering on), else as the kernel's hash does.
    /// Cheap when nothing changes: `listen::steer` compares before it attaches.
    fn stop_steering(&mut self, deal: bool) {
        if !self.judges.is_empty() {
            self.judges.clear();
            self.funnel = steer::Funnel::default();
            let mut changed = false;
            for j in 0..MAX_WORKERS {
                changed |= steer::publish(&self.region, j, false, false, false, false);
            }
            if changed {
                self.region.steer_epoch.fetch_add(1, Relaxed);
                self.signal_workers(libc::SIGURG, Some(self.generation));
            }
        }
        if self.upgrade_child.is_some() {
            // The new binary's master steers the same groups, and may have attached its
            // program already: leave it, and re-attach ours if the upgrade fails.
            for l in &mut self.listeners {
                l.forget_program();
            }
            return;
        }
        for l in &mut self.listeners {
            listen::steer(l, &[], deal);
        }
        self.publish_program();
    }

    /// Tells `/status` how the per-worker groups place new connections: the weakest of them
    /// (one group at random makes the server's spread random).
    fn publish_program(&self) {
        let program = self
            .listeners
            .iter()
            .filter(|l| l.reuseport && l.per_worker)
            .map(OpenListener::program_kind)
            .min()
            .unwrap_or(shm::PROGRAM_RANDOM);
        self.region.steer_program.store(program, Relaxed);
    }

    /// Judges every worker when a tick is due (`steer.rs`), steers each reuseport group to the
    /// shards of live workers, and tells the workers which shards to help drain. Returns the
    /// time until the next tick.
    fn steer_tick(&mut self) -> Option<u64> {
        if !self.steering_wanted() {
            self.stop_steering(false);
            return None;
        }
        let thr = self.cfg.events.reuseport_stall_threshold_ms;
        let now = shard_event::monotonic_ms();
        if now < self.next_steer_ms {
            return Some(self.next_steer_ms - now);
        }
        // Provisional; a quiet server is looked at less often (below).
        self.next_steer_ms = now + steer::tick_ms(thr);
        let n = self.n_workers.min(MAX_WORKERS);
        let mut changed = false;
        if self.judges.len() != n {
            self.judges = (0..n).map(|_| steer::Judge::new(now, thr)).collect();
            // Fewer workers than before (a reload): no bit of a former one stays set.
            for j in n..MAX_WORKERS {
                changed |= steer::publish(&self.region, j, false, false, false, false);
            }
        }
        let mut queued = vec![0u32; n];
        for l in self
            .listeners
            .iter()
            .filter(|l| l.reuseport && l.per_worker)
        {
            for (j, q) in queued.iter_mut().enumerate().take(l.active) {
                // A datagram socket has no accept queue: a datagram waiting is work waiting
                // (what tells a stopped worker from an idle one).
                *q += if l.opts.udp {
                    u32::from(shard_event::sock::datagram_waiting(l.fds[j]))
                } else {
                    shard_event::sock::listen_queue(l.fds[j]).map_or(0, |(q, _)| q)
                };
            }
        }
        let mut quiet = true;
        // A slot the region does not list (no worker started there) counts as dead.
        let mut dead = vec![true; n];
        // `http2_rebalance` just shed connections there: their reconnections go elsewhere.
        let mut shedding = vec![false; n];
        for (j, w) in self.region.current().enumerate().take(n) {
            dead[j] = w.pid.load(Relaxed) == 0;
            shedding[j] = w.shed_until_ms.load(Relaxed) > now;
            let o = steer::Observation {
                alive: !dead[j],
                heartbeat_ms: w.heartbeat_ms.load(Relaxed),
                idle: w.idle.load(Relaxed) == 1,
                queued: queued[j],
            };
            quiet &= o.alive && o.idle && o.queued == 0 && !self.judges[j].stalled();
            match self.judges[j].observe(o, now, thr) {
                Some(steer::Change::Stalled { idle, silent_ms }) => {
                    WorkerSlot::bump(&w.stalls, 1);
                    let why = if !o.alive {
                        "it is not running".to_string()
                    } else if idle {
                        format!("{} connections wait in its queue", o.queued)
                    } else {
                        format!("its loop has not turned for {silent_ms} ms")
                    };
                    crate::log!(
                        Notice,
                        "worker {j} (pid {}) stalled: {why}; new connections are steered to its \
                         siblings, which drain its queue",
                        w.pid.load(Relaxed)
                    );
                }
                Some(steer::Change::Live { stalled_ms }) => crate::log!(
                    Notice,
                    "worker {j} is live again after {stalled_ms} ms stalled: new connections are \
                     steered back to it"
                ),
                None => {}
            }
        }
        let stalled: Vec<bool> = self.judges.iter().map(steer::Judge::stalled).collect();
        // The funnel only where every per-worker group's program is in force: without one,
        // new connections still land on every shard, and each group would poll them all.
        let programs_work = self
            .listeners
            .iter()
            .filter(|l| l.reuseport && l.per_worker)
            .all(|l| !l.steer_refused);
        let was_on = self.funnel.is_on();
        // Out of the funnel: dead, or stalled too long to be merely busy.
        let out: Vec<bool> = (0..n)
            .map(|k| dead[k] || self.judges[k].stalled_for(now) >= steer::FUNNEL_OUT_MS)
            .collect();
        let targets = if self.funnel_enabled && programs_work {
            self.funnel.tick(&queued, &stalled, &out)
        } else {
            self.funnel = steer::Funnel::default();
            Vec::new()
        };
        let funnel_on = !targets.is_empty();
        let mut backlogged = vec![false; n];
        if self.backlog != steer::Backlog::Off {
            let live: Vec<usize> = (0..n).filter(|&k| !stalled[k]).collect();
            // Under the funnel its targets hold every queue: none counts as backlogged.
            let mean = (live.len() >= 2 && !funnel_on).then(|| {
                live.iter().map(|&k| f64::from(queued[k])).sum::<f64>() / live.len() as f64
            });
            for j in 0..n {
                backlogged[j] = self.judges[j].judge_backlog(queued[j], mean);
            }
        }
        let steer_backlog = self.backlog == steer::Backlog::Steer;
        // Each shard's share of new connections. Under the funnel a target takes the shares
        // of its group's workers in the funnel, itself stalled or not (its group polls it).
        let weights: Vec<u32> = (0..n)
            .map(|j| {
                if funnel_on {
                    targets.iter().find(|t| t.0 == j).map_or(0, |t| t.1)
                } else {
                    u32::from(!(stalled[j] || (steer_backlog && backlogged[j]) || shedding[j]))
                }
            })
            .collect();
        let away: Vec<bool> = weights.iter().map(|&w| w == 0).collect();
        let mut followed = true;
        for l in &mut self.listeners {
            // A listener without `reuseport` has no program to follow.
            let ok = listen::steer(l, &weights, true);
            followed &= ok || !l.reuseport;
        }
        self.publish_program();
        let all_away = away.iter().all(|&a| a);
        for j in 0..n {
            changed |= steer::publish(
                &self.region,
                j,
                stalled[j],
                stalled[j] || (backlogged[j] && !steer_backlog),
                away[j] && followed && !all_away,
                funnel_on && (weights[j] > 0 || queued[j] > 0),
            );
        }
        if changed {
            self.region.steer_epoch.fetch_add(1, Relaxed);
            self.signal_workers(libc::SIGURG, Some(self.generation));
        }
        // Said once the programs and the bits say it.
        if funnel_on != was_on {
            let in_funnel = out.iter().filter(|&&o| !o).count();
            if funnel_on {
                let ws: Vec<usize> = targets.iter().map(|t| t.0).collect();
                crate::log!(
                    Info,
                    "every worker has {} or more connections queued: new connections go to \
                     the shards of workers {ws:?}, which their groups serve as one queue",
                    steer::FUNNEL_ENTER_QUEUE
                );
            } else if in_funnel < 2 {
                crate::log!(
                    Info,
                    "one queue per group ends: fewer than two workers are running and not \
                     stalled for {} ms",
                    steer::FUNNEL_OUT_MS
                );
            } else if !programs_work {
                crate::log!(
                    Info,
                    "one queue per group ends: the kernel refused the steering program"
                );
            } else {
                crate::log!(
                    Info,
                    "the queues drained: every worker's shard takes new connections again"
                );
            }
        }
        // Every worker waiting with nothing queued: none can be stalled within a threshold
        // from now, so the next look is a threshold away (a stall then shows within two
        // thresholds instead of 1.25) and an idle server's master wakes 4 times less often.
        let next = if quiet {
            thr.min(steer::QUIET_TICK_MAX_MS)
        } else {
            steer::tick_ms(thr)
        };
        self.next_steer_ms = now + next;
        Some(next)
    }

    fn reap(&mut self) {
        while let Some((pid, exit)) = process::reap() {
            let how = match exit {
                Exit::Code(c) => format!("exited with code {c}"),
                Exit::Signal(s) => format!("exited on signal {s}"),
            };
            if self.upgrade_child == Some(pid) {
                self.upgrade_child = None;
                // The pid file first: whoever reads this line finds the pid file back.
                self.restore_pid_file();
                crate::log!(
                    Alert,
                    "new binary (pid {pid}) {how}: keeping serving with this one"
                );
                continue;
            }
            if self.cache_loader == Some(pid) {
                self.cache_loader = None;
                crate::log!(Notice, "cache loader process {pid} {how}");
                continue;
            }
            if self.cache_manager == Some(pid) {
                self.cache_manager = None;
                if self.stopping == Stopping::No {
                    crate::log!(Alert, "cache manager process {pid} {how}, respawning");
                    self.restart_cache_manager();
                }
                continue;
            }
            let Some(p) = self.procs.remove(&pid) else {
                continue;
            };
            // `quic` sockets of a generation whose last worker is gone close here.
            let procs = &self.procs;
            for l in &mut self.listeners {
                listen::quic_release(l, |g| procs.values().any(|p| p.generation == g));
            }
            if self.region.force_unlock_accept(pid as u64) {
                crate::log!(
                    Alert,
                    "worker process {pid} held the accept mutex; released"
                );
            }
            // A worker writes its pid into its slot once it is set up; then siblings see at
            // once that its shard has nobody serving it.
            let slot_pid = &self.region.worker(p.slot).pid;
            let started = slot_pid.load(Relaxed) == pid as u64;
            slot_pid.store(0, Relaxed);
            let (idx, generation) = (p.idx, p.generation);
            let respawned = !(self.stopping != Stopping::No
                || generation != self.generation
                || self.workers_stopped
                || exit == Exit::Code(2));
            if !respawned {
                // Its counts join the index's retired totals: the slot may go to a worker of
                // another generation, which starts from zero.
                self.region.fold(p.slot, idx);
            }
            if self.stopping != Stopping::No
                || generation != self.generation
                || self.workers_stopped
            {
                crate::log!(
                    Notice,
                    "worker process {pid} (worker {idx}, generation {generation}) {how}"
                );
                continue;
            }
            if exit == Exit::Code(2) {
                crate::log!(
                    Alert,
                    "worker process {pid} (worker {idx}) {how}: fatal, not respawning"
                );
                let current = self.generation;
                if !self.procs.values().any(|p| p.generation == current) && self.respawns.is_empty()
                {
                    // Holding the sockets with nobody to serve them would queue connections
                    // for ever: stop, and say so with the exit code (a supervisor restarts).
                    crate::log!(
                        Emerg,
                        "no worker process of generation {current} could run: exiting"
                    );
                    self.exit_code = 1;
                    self.stopping = Stopping::Graceful;
                    self.signal_workers(libc::SIGQUIT, None);
                }
                continue;
            }
            // nginx's levels: an exit with code 0 (a worker told to stop directly) is a
            // notice, a signal or another code an alert.
            if exit == Exit::Code(0) {
                crate::log!(
                    Notice,
                    "worker process {pid} (worker {idx}) {how}, respawning"
                );
            } else {
                crate::log!(
                    Alert,
                    "worker process {pid} (worker {idx}) {how}, respawning"
                );
            }
            if !started {
                self.schedule_respawn(idx);
                continue;
            }
            self.respawn_delay_ms.remove(&idx);
            if let Err(e) = self.spawn(idx) {
                crate::log!(Alert, "could not respawn worker {idx}: {e:#}");
                self.schedule_respawn(idx);
            }
        }
    }
}

/// nginx's name for the pid file of a master being replaced.
fn oldbin(p: &std::path::Path) -> PathBuf {
    let mut s = p.as_os_str().to_owned();
    s.push(".oldbin");
    PathBuf::from(s)
}

/// The CPUs of a mask as nginx logs them (`0,2,3`).
fn cpu_list(mask: u64) -> String {
    (0..64)
        .filter(|c| mask & (1u64 << c) != 0)
        .map(|c| c.to_string())
        .collect::<Vec<_>>()
        .join(",")
}
