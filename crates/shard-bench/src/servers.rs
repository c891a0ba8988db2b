//! Starting shard or nginx with the bench's configuration, and asking them for numbers.
//!
//! Both servers get the same workload shape: `worker_processes N`, one `reuseport` listener on
//! a free loopback port, `location = /ok { return 200 "OK"; }`, `stub_status`, no access log,
//! and keep-alive limits high enough that no load run closes a connection on its own.

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

pub fn find_nginx(given: Option<&Path>) -> Option<PathBuf> {
    match given {
        Some(p) => p.is_file().then(|| p.to_path_buf()),
        None => which("nginx"),
    }
}

pub struct Running {
    child: Child,
    pub port: u16,
    pub dir: PathBuf,
}

const HTTP_BLOCK: &str = r#"
http {
    access_log off;
    keepalive_requests 1000000;
    keepalive_timeout 300s;
    server {
        listen 127.0.0.1:{port} reuseport;
        location = /ok { return 200 "OK"; }
        location = /stub_status { stub_status; }
    }
}
"#;

pub fn start(kind: &Kind, workers: usize, idle: usize) -> Result<Running> {
    let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let dir = std::env::temp_dir().join(format!(
        "shard-bench-{}-{}",
        std::process::id(),
        kind.name()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("conf"))?;
    std::fs::create_dir_all(dir.join("logs"))?;
    // Every idle connection may hash to the same worker; leave room for the load too.
    let conns = idle + 1024;
    let head = format!(
        "worker_processes {workers};\nworker_rlimit_nofile {};\npid {}/logs/bench.pid;\nerror_log {}/logs/error.log error;\nevents {{ worker_connections {conns}; }}\n",
        conns * 2 + 64,
        dir.display(),
        dir.display()
    );
    let mut conf = head + &HTTP_BLOCK.replace("{port}", &port.to_string());
    let mut cmd = match kind {
        Kind::Shard(bin) => Command::new(bin),
        Kind::Nginx(bin) => {
            conf = format!("daemon off;\nmaster_process on;\n{conf}");
            let mut c = Command::new(bin);
            c.arg("-e").arg(dir.join("logs/error.log"));
            c
        }
    };
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
    let mut r = Running { child, port, dir };
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(Some(st)) = r.child.try_wait() {
            let err = std::fs::read_to_string(r.dir.join("logs/stderr.log")).unwrap_or_default();
            bail!("{} exited with {st}: {err}", kind.name());
        }
        if r.requests().is_ok() && r.worker_pids().map(|p| p.len()).unwrap_or(0) == workers {
            return Ok(r);
        }
        if Instant::now() > deadline {
            bail!("{} did not start within 10 s", kind.name());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl Running {
    /// The master's children: the workers.
    pub fn worker_pids(&self) -> Result<Vec<i32>> {
        let pid = self.child.id();
        let text = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))?;
        Ok(text
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
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
        unsafe { libc::kill(self.child.id() as i32, libc::SIGQUIT) };
        let deadline = Instant::now() + Duration::from_secs(10);
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
