//! Starting shard or nginx with the bench's configuration, and asking them for numbers.
//!
//! Both servers get the same workload shape: `worker_processes N`, one `reuseport` listener on
//! a free loopback port, `location = /ok { return 200 "OK"; }`, `stub_status`, no access log,
//! and keep-alive limits high enough that no load run closes a connection on its own. The
//! proxy bench changes only what `Spec` leaves open: what `/ok` does, an `upstream` in `http`,
//! a `stream {}` block and a `load_module` line.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

pub enum Kind {
    Shard(PathBuf),
    Nginx(PathBuf),
}

impl Kind {
    pub fn name(&self) -> &'static str {
        match self {
            Kind::Shard(_) => "shard",
            Kind::Nginx(_) => "nginx",
        }
    }
}

pub fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/usr/local/sbin")])
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// The servers a side-by-side bench runs: `--shard`, `--nginx`, `--no-nginx`.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct Peers {
    /// The shard binary (default: next to this one).
    #[arg(long)]
    pub shard: Option<PathBuf>,
    /// The nginx binary (default: `nginx` on PATH or /usr/sbin/nginx).
    #[arg(long)]
    pub nginx: Option<PathBuf>,
    /// Skip nginx even when it is installed.
    #[arg(long)]
    pub no_nginx: bool,
}

impl Peers {
    /// shard's binary, and nginx's unless `--no-nginx` (a note in `notes` when it is wanted
    /// and missing).
    pub fn binaries(&self, notes: &mut Vec<String>) -> anyhow::Result<(PathBuf, Option<PathBuf>)> {
        let shard = crate::shard_binary(self.shard.as_deref())?;
        Ok((
            shard,
            nginx_or_note(self.nginx.as_deref(), self.no_nginx, notes),
        ))
    }
}

/// The nginx to run beside shard (none with `--no-nginx`); when it is wanted and missing, a
/// note saying how to install it.
pub fn nginx_or_note(
    given: Option<&Path>,
    no_nginx: bool,
    notes: &mut Vec<String>,
) -> Option<PathBuf> {
    if no_nginx {
        return None;
    }
    let found = find_nginx(given);
    if found.is_none() {
        notes.push(
            "nginx not found: measuring shard alone (install: apt-get install nginx-light)"
                .to_string(),
        );
    }
    found
}

/// Writes a report to `--out` when given, creating its directory.
pub fn write_report(out: Option<&Path>, report: &str) -> anyhow::Result<()> {
    if let Some(out) = out {
        if let Some(d) = out.parent() {
            std::fs::create_dir_all(d)?;
        }
        std::fs::write(out, report)?;
    }
    Ok(())
}

pub fn find_nginx(given: Option<&Path>) -> Option<PathBuf> {
    match given {
        Some(p) => p.is_file().then(|| p.to_path_buf()),
        None => which("nginx"),
    }
}

/// Counters summed over a shard's workers.
#[derive(Debug, Clone, Copy, Default)]
pub struct StatusTotals {
    pub accepted: u64,
    pub requests: u64,
}

/// `"field":N` of each worker in a `shard_status` JSON body, in worker-index order.
fn per_worker(body: &str, field: &str) -> Vec<u64> {
    let workers = body.split("\"listeners\"").next().unwrap_or("");
    let key = format!("\"{field}\":");
    workers
        .match_indices(&key)
        .filter_map(|(i, m)| {
            let rest = &workers[i + m.len()..];
            rest[..rest
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(rest.len())]
                .parse()
                .ok()
        })
        .collect()
}

pub struct Running {
    child: Child,
    /// The master's pid when it is not `child` (see `Spec::detach`).
    detached: Option<i32>,
    pub port: u16,
    pub dir: PathBuf,
}

/// What a bench server runs: the same shape for shard and nginx.
#[derive(Default)]
pub struct Spec {
    pub workers: usize,
    /// Parameters after `listen 127.0.0.1:PORT`, e.g. `reuseport` or `reuseport shards=2`.
    pub listen_opts: String,
    /// Extra directives inside `events {}`, e.g. `accept_mutex on;`.
    pub events: String,
    /// Extra directives inside `server {}`, e.g. more locations.
    pub server_extra: String,
    /// Directives of `location = /ok` instead of `return 200 "OK";`, e.g. a `proxy_pass`.
    pub ok: Option<String>,
    /// Extra directives inside `http {}` before the server, e.g. an `upstream` block; `{port}`
    /// stands for the listening port (more servers on the same address).
    pub http_extra: String,
    /// The body of a `stream {}` block, when there is one.
    pub stream: Option<String>,
    /// Extra main-context directives at the top, e.g. nginx's `load_module`.
    pub main_extra: String,
    /// Room for this many idle connections on top of the load.
    pub idle: usize,
    /// A name for the prefix directory.
    pub tag: String,
    /// Start the master through a shell that exits at once, so that the master is not this
    /// process's child. nginx ignores `USR2` while its parent is the process that started it
    /// (`ngx_parent`), so under `daemon off` a binary upgrade needs this.
    pub detach: bool,
}

impl Spec {
    /// The configuration text for `kind` on `port` with prefix `dir`.
    pub fn conf(&self, kind: &Kind, port: u16, dir: &Path) -> String {
        // Every idle connection may hash to the same worker; leave room for the load too.
        let conns = self.idle + 1024;
        let mut c = String::new();
        // Both in the foreground: the bench waits on the master it starts.
        c.push_str("daemon off;\nmaster_process on;\n");
        // `load_module` must come before the blocks that use the module.
        c.push_str(&self.main_extra);
        c.push_str(&format!(
            "worker_processes {};\nworker_rlimit_nofile {};\npid {d}/logs/bench.pid;\n\
             error_log {d}/logs/error.log error;\nevents {{\n    worker_connections {conns};\n    {}\n}}\n",
            self.workers,
            conns * 2 + 64,
            self.events,
            d = dir.display()
        ));
        let status = if matches!(kind, Kind::Shard(_)) {
            "location = /status { shard_status; }"
        } else {
            ""
        };
        let ok = self.ok.as_deref().unwrap_or("return 200 \"OK\";");
        c.push_str(&format!(
            "http {{\n    access_log off;\n    keepalive_requests 1000000;\n    keepalive_timeout 300s;\n\
             {}\n    server {{\n        listen 127.0.0.1:{port} {};\n        root {}/html;\n\
             location = /ok {{ {ok} }}\n        location = /stub_status {{ stub_status; }}\n\
             {status}\n        {}\n    }}\n}}\n",
            self.http_extra.replace("{port}", &port.to_string()),
            self.listen_opts,
            dir.display(),
            self.server_extra
        ));
        if let Some(stream) = &self.stream {
            c.push_str(&format!("stream {{\n{stream}\n}}\n"));
        }
        c
    }
}

/// The `speed` server: `/ok` and a 4 KiB `/static.html`, with `main_extra` at the top.
pub fn start_speed(kind: &Kind, workers: usize, idle: usize, main_extra: &str) -> Result<Running> {
    let spec = Spec {
        workers,
        listen_opts: "reuseport".into(),
        events: String::new(),
        server_extra: String::new(),
        ok: None,
        http_extra: String::new(),
        stream: None,
        main_extra: main_extra.to_string(),
        idle,
        tag: "speed".into(),
        detach: false,
    };
    start_with(kind, &spec, |dir| {
        std::fs::write(dir.join("html/static.html"), vec![b'x'; 4096])?;
        Ok(())
    })
}

/// A loopback port that was free a moment ago, never handed out twice by this process: the
/// kernel may give one released port to two probes in a row, and two servers that both listen
/// with `reuseport` on it would share one reuseport group without an error.
pub fn free_port() -> Result<u16> {
    static HANDED_OUT: std::sync::Mutex<std::collections::BTreeSet<u16>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    for _ in 0..1000 {
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        if HANDED_OUT
            .lock()
            .map_err(|_| anyhow::anyhow!("port registry poisoned"))?
            .insert(port)
        {
            return Ok(port);
        }
    }
    bail!("no loopback port that this process has not handed out already")
}

/// Starts `kind` with `spec`; `prepare` may put files under the prefix (`html/`) first.
///
/// Another process (a second bench, a test) may probe the same free port between our probe
/// and the server's bind. The server then fails to bind, or, where both listen with
/// `reuseport`, joins the other's reuseport group without an error and shares its clients:
/// either way the start is retried on a new port.
pub fn start_with(
    kind: &Kind,
    spec: &Spec,
    prepare: impl Fn(&Path) -> Result<()>,
) -> Result<Running> {
    let mut tries = 0;
    loop {
        tries += 1;
        let port = free_port()?;
        let started = match start_on(kind, spec, port, &prepare)? {
            Started::Up(r) => {
                let foreign = foreign_listeners(port, r.master_pid());
                if foreign.is_empty() {
                    return Ok(r);
                }
                r.stop();
                format!("port {port} is shared with listeners {foreign:?} of another process")
            }
            Started::InUse(why) => why,
        };
        if tries == 3 {
            bail!(
                "{} found no port of its own three times: {started}",
                kind.name()
            );
        }
    }
}

/// A start on one port: up, or refused because the port was taken.
enum Started {
    Up(Running),
    InUse(String),
}

/// Socket inodes listening on loopback `port` that process `pid` does not hold (by
/// `/proc/net/tcp` and `/proc/PID/fd`; empty where either cannot be read).
fn foreign_listeners(port: u16, pid: i32) -> Vec<u64> {
    let Ok(table) = std::fs::read_to_string("/proc/net/tcp") else {
        return Vec::new();
    };
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return Vec::new();
    };
    let held: Vec<u64> = fds
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter_map(|l| {
            let l = l.to_str()?;
            l.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok()
        })
        .collect();
    let local = format!(":{port:04X}");
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            // sl local rem st tx:rx tr:when retrnsmt uid timeout inode
            let f: Vec<&str> = line.split_whitespace().collect();
            let listening = f.get(3) == Some(&"0A") && f.get(1)?.ends_with(&local);
            listening.then(|| f.get(9)?.parse().ok())?
        })
        .filter(|inode| !held.contains(inode))
        .collect()
}

fn start_on(
    kind: &Kind,
    spec: &Spec,
    port: u16,
    prepare: &impl Fn(&Path) -> Result<()>,
) -> Result<Started> {
    let workers = spec.workers;
    let dir = std::env::temp_dir().join(format!(
        "shard-bench-{}-{}-{}",
        std::process::id(),
        kind.name(),
        spec.tag
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("conf"))?;
    std::fs::create_dir_all(dir.join("logs"))?;
    std::fs::create_dir_all(dir.join("html"))?;
    prepare(&dir)?;
    let conf = spec.conf(kind, port, &dir);
    let bin = match kind {
        Kind::Shard(bin) | Kind::Nginx(bin) => bin,
    };
    let mut cmd = if spec.detach {
        let mut c = Command::new("/bin/sh");
        // The shell outlives the start long enough for the master to record it as its
        // parent (`ngx_parent`), then exits.
        c.arg("-c").arg("\"$0\" \"$@\" & sleep 0.3").arg(bin);
        c
    } else {
        Command::new(bin)
    };
    if matches!(kind, Kind::Nginx(_)) {
        cmd.arg("-e").arg(dir.join("logs/error.log"));
    }
    let conf_path = dir.join("conf/bench.conf");
    std::fs::write(&conf_path, conf)?;
    cmd.arg("-p").arg(&dir).arg("-c").arg(&conf_path);
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(std::fs::File::create(
            dir.join("logs/stderr.log"),
        )?));
    let child = cmd
        .spawn()
        .with_context(|| format!("spawn {}", kind.name()))?;
    let mut r = Running {
        child,
        detached: None,
        port,
        dir,
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if spec.detach && r.detached.is_none() {
            r.detached = std::fs::read_to_string(r.dir.join("logs/bench.pid"))
                .ok()
                .and_then(|t| t.trim().parse().ok());
            let _ = r.child.try_wait();
        } else if let Ok(Some(st)) = r.child.try_wait().map(|s| s.filter(|_| !spec.detach)) {
            let err = std::fs::read_to_string(r.dir.join("logs/stderr.log")).unwrap_or_default();
            let log = std::fs::read_to_string(r.dir.join("logs/error.log")).unwrap_or_default();
            if err.contains("Address already in use") || log.contains("Address already in use") {
                return Ok(Started::InUse(err));
            }
            bail!("{} exited with {st}: {err}", kind.name());
        }
        if r.requests().is_ok()
            && r.worker_pids().map(|p| p.len()).unwrap_or(0) == workers
            && (!spec.detach || r.detached.is_some())
        {
            if spec.detach {
                // Returns with the master re-parented, ready for `USR2`.
                let _ = r.child.wait();
            }
            return Ok(Started::Up(r));
        }
        if Instant::now() > deadline {
            // Not left behind: a server that never answered the check may still be
            // running and holding its ports (nginx 1.22 on a `listen ... http2` port does).
            r.stop();
            bail!("{} did not start within 10 s", kind.name());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl Running {
    pub fn master_pid(&self) -> i32 {
        self.detached.unwrap_or(self.child.id() as i32)
    }

    /// The configuration file the server runs.
    pub fn conf_path(&self) -> PathBuf {
        self.dir.join("conf/bench.conf")
    }

    /// Per-worker `accepted` from `shard_status` (shard only), in worker-index order.
    pub fn accepted_per_worker(&self) -> Result<Vec<u64>> {
        Ok(per_worker(&self.shard_status()?, "accepted"))
    }

    /// `accepted` and `requests` summed over the workers, from one `shard_status` read (shard
    /// only). The read is itself one accepted connection and one request.
    pub fn status_totals(&self) -> Result<StatusTotals> {
        let body = self.shard_status()?;
        Ok(StatusTotals {
            accepted: per_worker(&body, "accepted").iter().sum(),
            requests: per_worker(&body, "requests").iter().sum(),
        })
    }

    fn shard_status(&self) -> Result<String> {
        let mut s = TcpStream::connect(("127.0.0.1", self.port))?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        s.write_all(b"GET /status HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n")?;
        let mut body = String::new();
        s.read_to_string(&mut body)?;
        Ok(body)
    }

    /// The worker (index into `worker_pids`) that holds the server side of the connection
    /// whose client port is `client_port`, found through /proc/net/tcp and each worker's fds.
    pub fn worker_holding(&self, client_port: u16) -> Result<Option<usize>> {
        let table = std::fs::read_to_string("/proc/net/tcp")?;
        let local = format!(":{:04X}", self.port);
        let remote = format!(":{client_port:04X}");
        let inode = table.lines().skip(1).find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() > 9 && f[1].ends_with(&local) && f[2].ends_with(&remote))
                .then(|| f[9].to_string())
        });
        let Some(inode) = inode else { return Ok(None) };
        let want = format!("socket:[{inode}]");
        for (i, pid) in self.worker_pids()?.iter().enumerate() {
            let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
                continue;
            };
            for fd in fds.flatten() {
                if std::fs::read_link(fd.path()).is_ok_and(|t| t.to_string_lossy() == want) {
                    return Ok(Some(i));
                }
            }
        }
        Ok(None)
    }

    /// The master's children: the workers.
    pub fn worker_pids(&self) -> Result<Vec<i32>> {
        let pid = self.master_pid();
        let text = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))?;
        // Not the cache manager and loader processes, which both servers also run.
        Ok(text
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .filter(|p: &i32| {
                let cmd = std::fs::read(format!("/proc/{p}/cmdline")).unwrap_or_default();
                !cmd.windows(5).any(|w| w == b"cache")
            })
            .collect())
    }

    /// `requests` from `stub_status` (same format in both servers).
    pub fn requests(&self) -> Result<u64> {
        let mut s = TcpStream::connect(("127.0.0.1", self.port))?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        s.write_all(b"GET /stub_status HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n")?;
        let mut body = String::new();
        s.read_to_string(&mut body)?;
        let line = body
            .lines()
            .skip_while(|l| !l.starts_with("server accepts"))
            .nth(1)
            .context("no stub_status counters")?;
        line.split_whitespace()
            .nth(2)
            .and_then(|n| n.parse().ok())
            .context("bad stub_status counters")
    }

    pub fn stop(mut self) {
        // SAFETY-free: kill(2) through libc with plain integers.
        unsafe { libc::kill(self.master_pid(), libc::SIGQUIT) };
        let deadline = Instant::now() + Duration::from_secs(10);
        if let Some(pid) = self.detached {
            let _ = self.child.wait();
            let gone = || {
                std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |s| {
                    s.rsplit(')')
                        .next()
                        .unwrap_or("")
                        .trim_start()
                        .starts_with('Z')
                })
            };
            while Instant::now() < deadline && !gone() {
                std::thread::sleep(Duration::from_millis(20));
            }
            if !gone() {
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
            let _ = std::fs::remove_dir_all(&self.dir);
            return;
        }
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                let _ = std::fs::remove_dir_all(&self.dir);
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listener_is_foreign_to_every_process_but_its_own() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let me = std::process::id() as i32;
        assert_eq!(foreign_listeners(port, me), Vec::<u64>::new());
        // SAFETY: getppid(2) cannot fail.
        let parent = unsafe { libc::getppid() };
        assert_eq!(foreign_listeners(port, parent).len(), 1);
    }

    #[test]
    fn no_port_is_handed_out_twice() {
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..200 {
            assert!(seen.insert(free_port().unwrap()));
        }
    }
}
