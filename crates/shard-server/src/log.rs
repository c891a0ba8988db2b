//! The error log: nginx's line format, levels, one `write(2)` per line with `O_APPEND`.
//!
//! `2026/11/22 10:00:00 [notice] 1234#0: message`. The master opens the file and workers
//! inherit the descriptor, so every process appends to the same file; one write per line keeps
//! lines whole. Reopening (`SIGUSR1`) swaps the descriptor in place. Debug lines (`debug!`)
//! are formatted only where a log takes the debug level or the connection at work is a
//! `debug_connection` client's (whose lines then go to every log of its level).

use std::fs::OpenOptions;
use std::io;
use std::os::fd::{IntoRawFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicI32, AtomicU64, AtomicU8, Ordering::Relaxed};
use std::sync::Mutex;

use shard_config::{LogLevel, LogTarget};

static FD: AtomicI32 = AtomicI32::new(2);
/// The number of the connection being served (0: none): lines logged meanwhile carry nginx's
/// `*N`. Processes are single-threaded, so one value per process is the current one.
static CONNECTION: AtomicU64 = AtomicU64::new(0);
/// Standard error is the error log file (a daemon): a reopen points it at the new file.
static STDERR_IS_LOG: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Says that standard error was pointed at the error log file (`daemon on`).
pub fn stderr_follows_log() {
    STDERR_IS_LOG.store(true, Relaxed);
}
static LEVEL: AtomicU8 = AtomicU8::new(LogLevel::Notice as u8);
/// What `reopen` opens again. A mutex, not a `static mut`: processes are single-threaded, so
/// it is never contended, and no `unsafe` is needed outside `shard-event`.
static TARGET: Mutex<Option<LogTarget>> = Mutex::new(None);

pub fn level_name(l: LogLevel) -> &'static str {
    match l {
        LogLevel::Debug => "debug",
        LogLevel::Info => "info",
        LogLevel::Notice => "notice",
        LogLevel::Warn => "warn",
        LogLevel::Error => "error",
        LogLevel::Crit => "crit",
        LogLevel::Alert => "alert",
        LogLevel::Emerg => "emerg",
    }
}

fn open_target(target: &LogTarget) -> io::Result<RawFd> {
    match target {
        LogTarget::Stderr => Ok(2),
        LogTarget::File(path) => open_append(path),
        LogTarget::Syslog(s) => Ok(open_syslog(s)),
    }
}

/// A datagram socket connected to the syslog server (`-1` when it cannot be made: nginx
/// drops the messages then too, and says why once).
pub fn open_syslog(s: &shard_config::Syslog) -> RawFd {
    use std::os::fd::IntoRawFd as _;
    let r = match &s.server {
        shard_config::SyslogServer::Udp(a) => shard_event::sock::udp_connected(a),
        shard_config::SyslogServer::Unix(p) => shard_event::sock::unix_datagram_connected(p),
    };
    match r {
        Ok(fd) => fd.into_raw_fd(),
        Err(e) => {
            eprintln!(
                "shard: connect() to syslog \"{}\" failed ({})",
                s.text,
                shard_event::os_error_text(&e)
            );
            -1
        }
    }
}

/// The main context's further `error_log`s: descriptor, level, target.
static EXTRA: Mutex<Vec<(RawFd, LogLevel, LogTarget)>> = Mutex::new(Vec::new());
/// The lowest level any of them takes (`Emerg + 1`: none).
static EXTRA_LEVEL: AtomicU8 = AtomicU8::new(LogLevel::Emerg as u8 + 1);

/// Opens the further `error_log`s (replacing the previous ones); one that cannot be opened
/// is an error, as the first's.
pub fn init_extra(logs: &[shard_config::ErrorLog]) -> io::Result<()> {
    let mut opened = Vec::with_capacity(logs.len());
    for l in logs {
        match open_target(&l.target) {
            Ok(fd) => opened.push((fd, l.level, l.target.clone())),
            Err(e) => {
                for (fd, _, _) in opened {
                    if fd > 2 {
                        shard_event::sock::close(fd);
                    }
                }
                return Err(e);
            }
        }
    }
    let min = opened
        .iter()
        .map(|(_, l, _)| *l as u8)
        .min()
        .unwrap_or(LogLevel::Emerg as u8 + 1);
    let old = std::mem::replace(
        &mut *EXTRA.lock().unwrap_or_else(|e| e.into_inner()),
        opened,
    );
    for (fd, _, _) in old {
        if fd > 2 {
            shard_event::sock::close(fd);
        }
    }
    EXTRA_LEVEL.store(min, Relaxed);
    Ok(())
}

/// The files among the further `error_log`s (for the master's `chown` at reopen).
pub fn extra_paths() -> Vec<std::path::PathBuf> {
    EXTRA
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .filter_map(|(_, _, t)| match t {
            LogTarget::File(p) => Some(p.clone()),
            _ => None,
        })
        .collect()
}

/// The error log's syslog settings when it goes to syslog (read on each line: lines are
/// few, and the lock is never contended in a single-threaded process).
static SYSLOG: Mutex<Option<std::sync::Arc<shard_config::Syslog>>> = Mutex::new(None);

/// This machine's name, for syslog headers.
pub fn hostname() -> &'static str {
    static NAME: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    NAME.get_or_init(shard_event::process::hostname)
}

/// Creates `PREFIX/logs` when it is missing: the one directory an nginx installation has for
/// its default logs (`make install` creates it), so the embedded default configuration runs in
/// an empty directory. No other log directory is ever created.
pub fn make_prefix_logs_dir(prefix: &Path) {
    let _ = std::fs::create_dir(prefix.join("logs"));
}

/// Every log file `cfg` names (the error log, then each access log once) opened as the
/// server would open it, and closed: `-t` fails where the start would.
pub fn check_files(cfg: &shard_config::Config) -> Result<(), String> {
    let mut paths: Vec<&Path> = Vec::new();
    for l in std::iter::once(&cfg.main.error_log).chain(&cfg.main.more_error_logs) {
        if let LogTarget::File(p) = &l.target {
            paths.push(p);
        }
    }
    if let Some(http) = &cfg.http {
        for s in &http.servers {
            for l in std::iter::once(&s.base).chain(&s.locations) {
                for al in l.access_logs.iter().filter(|al| al.syslog.is_none()) {
                    if !paths.contains(&al.path.as_path()) {
                        paths.push(&al.path);
                    }
                }
            }
        }
    }
    for p in paths {
        let fd = open_append(p).map_err(|e| e.to_string())?;
        shard_event::sock::close(fd);
    }
    Ok(())
}

/// Opens the configured log. Until this is called, messages go to stderr at `notice`.
pub fn init(target: &LogTarget, level: LogLevel) -> io::Result<()> {
    let fd = open_target(target)?;
    let old = FD.swap(fd, Relaxed);
    if old > 2 {
        shard_event::sock::close(old);
    }
    LEVEL.store(level as u8, Relaxed);
    *SYSLOG.lock().unwrap_or_else(|e| e.into_inner()) = match target {
        LogTarget::Syslog(s) => Some(s.clone()),
        _ => None,
    };
    *TARGET.lock().unwrap_or_else(|e| e.into_inner()) = Some(target.clone());
    Ok(())
}

/// The error log's descriptor, when it is a file (not standard error).
pub fn file_fd() -> Option<RawFd> {
    if SYSLOG.lock().unwrap_or_else(|e| e.into_inner()).is_some() {
        return None;
    }
    let fd = FD.load(Relaxed);
    (fd > 2).then_some(fd)
}

/// The error log's path, when it is a file.
pub fn path() -> Option<std::path::PathBuf> {
    match TARGET.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
        Some(LogTarget::File(p)) => Some(p.clone()),
        _ => None,
    }
}

/// Reopens the log file (after rotation).
pub fn reopen() -> io::Result<()> {
    for (fd, _, t) in EXTRA.lock().unwrap_or_else(|e| e.into_inner()).iter_mut() {
        if let LogTarget::File(_) = t {
            let new = open_target(t)?;
            shard_event::sock::close(*fd);
            *fd = new;
        }
    }
    let target = TARGET.lock().unwrap_or_else(|e| e.into_inner()).clone();
    if let Some(t) = target {
        let level = LEVEL.load(Relaxed);
        let fd = open_target(&t)?;
        let old = FD.swap(fd, Relaxed);
        if old > 2 {
            shard_event::sock::close(old);
        }
        if fd > 2 && STDERR_IS_LOG.load(Relaxed) {
            let _ = shard_event::process::stderr_to(fd);
        }
        LEVEL.store(level, Relaxed);
    }
    Ok(())
}

/// `debug_connection`: the numbers of this process's connections that log at the debug
/// level to every error log, few at a time (a list: a check is a scan of a handful).
static DEBUG_CONNS: Mutex<Vec<u64>> = Mutex::new(Vec::new());
/// `DEBUG_CONNS` is not empty: the common case checks this alone.
static DEBUG_ANY: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Connection `n` (a `debug_connection` client's) logs at the debug level everywhere while
/// `on`; off when it closes.
pub fn debug_connection(n: u64, on: bool) {
    if !on && !DEBUG_ANY.load(Relaxed) {
        return;
    }
    let mut list = DEBUG_CONNS.lock().unwrap_or_else(|e| e.into_inner());
    if on {
        list.push(n);
    } else {
        list.retain(|&x| x != n);
    }
    DEBUG_ANY.store(!list.is_empty(), Relaxed);
}

/// The connection whose work follows is a `debug_connection` client's.
fn debug_conn() -> bool {
    if !DEBUG_ANY.load(Relaxed) {
        return false;
    }
    let n = CONNECTION.load(Relaxed);
    n != 0
        && DEBUG_CONNS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(&n)
}

/// Whether a debug line would be written now (`debug!`): a debug level where the work is,
/// or a `debug_connection` client's connection.
#[inline]
pub fn debug_on() -> bool {
    enabled(LogLevel::Debug) || debug_conn()
}

pub fn enabled(level: LogLevel) -> bool {
    if CONTEXT.load(Relaxed) != 0 {
        return level as u8 >= CONTEXT_LEVEL.load(Relaxed);
    }
    level as u8 >= LEVEL.load(Relaxed).min(EXTRA_LEVEL.load(Relaxed))
}

/// `YYYY/MM/DD HH:MM:SS` in UTC.
pub fn timestamp(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}/{m:02}/{d:02} {:02}:{:02}:{:02}",
        rem / 3600,
        (rem / 60) % 60,
        rem % 60
    )
}

/// Howard Hinnant's days-to-civil algorithm.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// Sets the connection whose work follows (0: none) and returns the previous one, for the
/// caller to restore.
pub fn set_connection(n: u64) -> u64 {
    CONNECTION.swap(n, Relaxed)
}

/// One destination of a context's error log: descriptor, lowest level, syslog settings.
pub type Dest = (
    RawFd,
    LogLevel,
    Option<std::sync::Arc<shard_config::Syslog>>,
);

/// The error logs below the main context (`error_log` in http, server, location, stream), by
/// context number less one; a worker fills it once at start (`set_contexts`).
static CONTEXTS: Mutex<Vec<Vec<Dest>>> = Mutex::new(Vec::new());
/// The context whose work follows (0: the main context's logs).
static CONTEXT: AtomicU64 = AtomicU64::new(0);
/// The lowest level the current context takes.
static CONTEXT_LEVEL: AtomicU8 = AtomicU8::new(LogLevel::Emerg as u8 + 1);

/// A worker's error log contexts (numbered from 1 in this order).
pub fn set_contexts(contexts: Vec<Vec<Dest>>) {
    *CONTEXTS.lock().unwrap_or_else(|e| e.into_inner()) = contexts;
}

/// The lowest level a context's destinations take (`Emerg + 1` for none).
pub fn context_level(dests: &[Dest]) -> u8 {
    dests
        .iter()
        .map(|d| d.1 as u8)
        .min()
        .unwrap_or(LogLevel::Emerg as u8 + 1)
}

/// Sets the error log context whose work follows, with its lowest level (`context_level`):
/// 0 is the main context. Returns the previous context and level, for `restore_context`.
pub fn set_context(ctx: u64, level: u8) -> (u64, u8) {
    (
        CONTEXT.swap(ctx, Relaxed),
        CONTEXT_LEVEL.swap(level, Relaxed),
    )
}

/// Puts back what `set_context` returned.
pub fn restore_context(prev: (u64, u8)) {
    CONTEXT.store(prev.0, Relaxed);
    CONTEXT_LEVEL.store(prev.1, Relaxed);
}

pub fn write(level: LogLevel, msg: std::fmt::Arguments<'_>) {
    // A `debug_connection` client's lines go to every destination whatever its level, as
    // nginx's `ngx_log_error_core` does for such a connection.
    let every = debug_conn();
    if !every && !enabled(level) {
        return;
    }
    let conn = CONNECTION.load(Relaxed);
    let line = if conn == 0 {
        format!(
            "{} [{}] {}#0: {}\n",
            timestamp(shard_event::unix_secs()),
            level_name(level),
            shard_event::process::getpid(),
            msg
        )
    } else {
        format!(
            "{} [{}] {}#0: *{conn} {}\n",
            timestamp(shard_event::unix_secs()),
            level_name(level),
            shard_event::process::getpid(),
            msg
        )
    };
    let ctx = CONTEXT.load(Relaxed);
    if ctx != 0 {
        // A request's or session's messages go to its level's logs only, as nginx's.
        let contexts = CONTEXTS.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(dests) = contexts.get(ctx as usize - 1) {
            for (fd, min, syslog) in dests {
                if every || level >= *min {
                    write_to(*fd, syslog.as_deref(), level, &line);
                }
            }
        }
        return;
    }
    if every || level as u8 >= LEVEL.load(Relaxed) {
        let syslog = SYSLOG.lock().unwrap_or_else(|e| e.into_inner()).clone();
        write_to(FD.load(Relaxed), syslog.as_deref(), level, &line);
    }
    if every || level as u8 >= EXTRA_LEVEL.load(Relaxed) {
        for (fd, min, t) in EXTRA.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            if every || level >= *min {
                let syslog = match t {
                    LogTarget::Syslog(s) => Some(&**s),
                    _ => None,
                };
                write_to(*fd, syslog, level, &line);
            }
        }
    }
}

/// One error line to one destination: as it is, or for syslog one datagram, without its
/// newline, after the RFC 3164 header (the line's level as the severity, whatever
/// `severity=` says: nginx reads it for access logs only).
fn write_to(fd: RawFd, syslog: Option<&shard_config::Syslog>, level: LogLevel, line: &str) {
    match syslog {
        Some(s) => {
            // As nginx: `severity=` is the access log's; an error line's is its level.
            let severity = 7 - level as u8;
            let mut msg = s.header(severity, shard_event::unix_secs(), hostname());
            msg.push_str(line.trim_end_matches('\n'));
            let _ = shard_event::sock::write(fd, msg.as_bytes());
        }
        None => {
            let _ = shard_event::sock::write(fd, line.as_bytes());
        }
    }
}

#[macro_export]
macro_rules! log {
    ($level:ident, $($arg:tt)*) => {
        $crate::log::write(shard_config::LogLevel::$level, format_args!($($arg)*))
    };
}

/// A debug line (nginx's `ngx_log_debug`): its arguments are formatted only when a debug
/// level or a `debug_connection` client wants it.
#[macro_export]
macro_rules! debug {
    ($($arg:tt)*) => {
        if $crate::log::debug_on() {
            $crate::log::write(shard_config::LogLevel::Debug, format_args!($($arg)*))
        }
    };
}

/// `log!` with a level known only at run time (`limit_req_log_level`).
#[macro_export]
macro_rules! log_at {
    ($level:expr, $($arg:tt)*) => {
        $crate::log::write($level, format_args!($($arg)*))
    };
}

/// Opens a log file for appending, creating the file but no directory: a log in a directory
/// that does not exist is an error, as in nginx (`open() "/x/y.log" failed (2: No such file
/// or directory)`).
pub fn open_append(path: &Path) -> io::Result<RawFd> {
    OpenOptions::new()
        .append(true)
        .create(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(path)
        .map(|f| f.into_raw_fd())
        .map_err(|e| {
            let text = shard_event::os_error_text(&e);
            io::Error::new(
                e.kind(),
                format!("open() \"{}\" failed ({text})", path.display()),
            )
        })
}

#[cfg(test)]
mod tests {
    #[test]
    fn timestamp_format() {
        assert_eq!(super::timestamp(0), "1970/01/01 00:00:00");
        assert_eq!(super::timestamp(1_795_000_000), "2026/11/18 11:06:40");
    }
}
