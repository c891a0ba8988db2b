//! The master process: opens every listener and shard, forks the workers, respawns the ones
//! that die, and turns signals into actions.
//!
//! The master never serves traffic and stays single-threaded (so that `fork` is sound). It
//! reads signals from a signalfd in a plain epoll loop; nothing runs in signal context.

use std::collections::HashMap;
use std::os::fd::RawFd;
use std::path::PathBuf;
use std::sync::atomic::Ordering::Relaxed;

use anyhow::{Context, Result};
use shard_config::{Config, WorkerProcesses};
use shard_event::process::{self, Exit, Fork, SignalFd};
use shard_event::{Events, Interest, Poll};

use crate::listen::{self, OpenListener};
use crate::shm::{self, SharedRegion, MAX_WORKERS};
use crate::worker::{self, WorkerArgs};

/// How long a fast stop (`TERM`/`INT`) waits for workers before `SIGKILL`.
const FAST_STOP_GRACE_MS: u64 = 5_000;

pub struct RunOptions {
    pub config: Config,
    /// Shown in log lines: the configuration file, or "(embedded default)".
    pub conf_name: String,
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

struct Master {
    cfg: Config,
    n_workers: usize,
    listeners: Vec<OpenListener>,
    region: SharedRegion,
    access_logs: HashMap<PathBuf, RawFd>,
    /// pid of worker k, or None while it is not running.
    workers: Vec<Option<libc::pid_t>>,
    poll: Poll,
    signals: SignalFd,
    stopping: Stopping,
}

/// Runs the master until it stops; returns the process exit code.
pub fn run(opts: RunOptions) -> Result<i32> {
    let cfg = opts.config;
    crate::log::init(&cfg.main.error_log.target, cfg.main.error_log.level)
        .context("cannot open the error log")?;
    let n_workers = resolve_workers(cfg.main.worker_processes);
    cfg.check_workers(n_workers)
        .map_err(|e| anyhow::anyhow!("{e}"))?;

    process::block_signals().context("sigprocmask")?;
    let signals = SignalFd::new().context("signalfd")?;
    let poll = Poll::new().context("epoll_create")?;
    poll.add(signals.fd(), 0, Interest::READ)
        .context("epoll_ctl")?;

    let tcp_nodelay = cfg
        .http
        .as_ref()
        .is_none_or(|h| h.servers.iter().all(|s| s.base.tcp_nodelay));
    let mut listeners = Vec::with_capacity(cfg.listeners.len());
    for (i, l) in cfg.listeners.iter().enumerate() {
        let ol = listen::open(i, l, n_workers, tcp_nodelay).map_err(|e| anyhow::anyhow!("{e}"))?;
        listeners.push(ol);
    }

    let mut access_logs = HashMap::new();
    if let Some(http) = &cfg.http {
        for s in &http.servers {
            for loc in std::iter::once(&s.base).chain(s.locations.iter()) {
                if let Some(al) = &loc.access_log {
                    if !access_logs.contains_key(&al.path) {
                        let fd = crate::log::open_append(&al.path)
                            .map_err(|e| anyhow::anyhow!("{e}"))?;
                        access_logs.insert(al.path.clone(), fd);
                    }
                }
            }
        }
    }

    let region = shm::create().context("cannot map the shared-memory region")?;
    region.n_workers.store(n_workers as u64, Relaxed);

    if let Some(pid_path) = &cfg.main.pid {
        std::fs::write(pid_path, format!("{}\n", process::getpid()))
            .with_context(|| format!("open() \"{}\" failed", pid_path.display()))?;
    }

    let shown: Vec<String> = listeners
        .iter()
        .map(|l| {
            let addr = shard_event::sock::local_addr(l.fds[0])
                .map_or(l.addr.to_string(), |a| a.to_string());
            if l.reuseport {
                format!("{addr} (reuseport, {} shards)", l.fds.len())
            } else {
                format!("{addr} (shared)")
            }
        })
        .collect();
    crate::log!(
        Notice,
        "shard/{} started with {}: {} worker processes, listening on {}",
        env!("CARGO_PKG_VERSION"),
        opts.conf_name,
        n_workers,
        if shown.is_empty() {
            "nothing".to_string()
        } else {
            shown.join(", ")
        }
    );

    let mut m = Master {
        cfg,
        n_workers,
        listeners,
        region,
        access_logs,
        workers: vec![None; n_workers],
        poll,
        signals,
        stopping: Stopping::No,
    };
    for idx in 0..n_workers {
        m.spawn(idx)?;
    }
    let code = m.run_loop();
    if let Some(pid_path) = &m.cfg.main.pid {
        let _ = std::fs::remove_file(pid_path);
    }
    crate::log!(Notice, "exit");
    Ok(code)
}

impl Master {
    fn spawn(&mut self, idx: usize) -> Result<()> {
        let master_pid = process::getpid();
        match process::fork().context("fork() failed")? {
            Fork::Parent(pid) => {
                self.workers[idx] = Some(pid);
                crate::log!(Notice, "start worker process {pid} (worker {idx})");
                Ok(())
            }
            Fork::Child => {
                // A worker never outlives its master: if the master is killed, workers stop
                // gracefully instead of holding the port forever.
                process::set_parent_death_signal(libc::SIGQUIT);
                if libc_getppid() != master_pid {
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
                let code = worker::run(WorkerArgs {
                    idx,
                    n_workers: self.n_workers,
                    cfg: &self.cfg,
                    listeners: &self.listeners,
                    region: &self.region,
                    access_logs: &self.access_logs,
                });
                std::process::exit(code);
            }
        }
    }

    fn signal_workers(&self, sig: libc::c_int) {
        for pid in self.workers.iter().flatten() {
            let _ = process::kill(*pid, sig);
        }
    }

    fn run_loop(&mut self) -> i32 {
        let mut events = Events::with_capacity(8);
        loop {
            let timeout = match self.stopping {
                Stopping::Fast { kill_at_ms } => {
                    kill_at_ms.saturating_sub(shard_event::monotonic_ms()) as i32
                }
                _ => -1,
            };
            let _ = self.poll.wait(&mut events, timeout);
            while let Some((sig, _from)) = self.signals.read() {
                self.on_signal(sig);
            }
            if let Stopping::Fast { kill_at_ms } = self.stopping {
                if shard_event::monotonic_ms() >= kill_at_ms {
                    crate::log!(Alert, "workers did not stop in time, sending SIGKILL");
                    self.signal_workers(libc::SIGKILL);
                    self.stopping = Stopping::Fast {
                        kill_at_ms: u64::MAX,
                    };
                }
            }
            if self.stopping != Stopping::No && self.workers.iter().all(Option::is_none) {
                return 0;
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
                    self.signal_workers(libc::SIGQUIT);
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
                    self.signal_workers(libc::SIGTERM);
                }
            }
            libc::SIGUSR1 => {
                crate::log!(Notice, "signal {sig} (SIGUSR1) received, reopening logs");
                if let Err(e) = crate::log::reopen() {
                    crate::log!(Alert, "{e}");
                }
                self.signal_workers(libc::SIGUSR1);
            }
            libc::SIGHUP => {
                crate::log!(
                    Warn,
                    "signal {sig} (SIGHUP) received: configuration reload is not implemented yet, \
                     keeping the running configuration"
                );
            }
            _ => crate::log!(Info, "signal {sig} ignored"),
        }
    }

    fn reap(&mut self) {
        while let Some((pid, exit)) = process::reap() {
            let Some(idx) = self.workers.iter().position(|w| *w == Some(pid)) else {
                continue;
            };
            self.workers[idx] = None;
            if self.region.force_unlock_accept(pid as u64) {
                crate::log!(
                    Alert,
                    "worker process {pid} held the accept mutex; released"
                );
            }
            let how = match exit {
                Exit::Code(c) => format!("exited with code {c}"),
                Exit::Signal(s) => format!("exited on signal {s}"),
            };
            if self.stopping != Stopping::No {
                crate::log!(Notice, "worker process {pid} (worker {idx}) {how}");
                continue;
            }
            if exit == Exit::Code(2) {
                crate::log!(
                    Alert,
                    "worker process {pid} (worker {idx}) {how}: fatal, not respawning"
                );
                continue;
            }
            crate::log!(
                Alert,
                "worker process {pid} (worker {idx}) {how}, respawning"
            );
            if let Err(e) = self.spawn(idx) {
                crate::log!(Alert, "could not respawn worker {idx}: {e:#}");
            }
        }
    }
}

fn libc_getppid() -> libc::pid_t {
    shard_event::process::getppid()
}
