//! Test support: start the real `shard` binary with a configuration on free loopback ports,
//! talk HTTP/1.1 to it over real sockets, and wait on conditions with deadlines (never sleeps
//! used as synchronisation).

#![allow(dead_code)]

pub mod h2client;
pub mod upstream;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_shard");

/// Polls `f` until it returns `Some` or `timeout` passes.
pub fn wait_for<T>(timeout: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        if Instant::now() > deadline {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A port that was free a moment ago (bound to port 0 and released), and never handed to
/// another test of this process. The kernel may give the same released port to two probes in
/// a row; two servers that both `listen ... reuseport` on it then join one reuseport group
/// without an error and answer each other's clients (CI once saw a stopping server answer a
/// sibling test's requests).
pub fn free_port() -> u16 {
    static HANDED_OUT: std::sync::Mutex<std::collections::BTreeSet<u16>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    for _ in 0..1000 {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        if HANDED_OUT.lock().unwrap().insert(port) {
            return port;
        }
    }
    panic!("no loopback port that this process has not handed out already");
}

/// A test's directory, removed when dropped unless the test is failing (then it is kept, with
/// its logs, for whoever reads the failure).
pub struct TempDir(PathBuf);

impl TempDir {
    /// Hands the directory to an owner that removes it itself.
    pub fn keep(mut self) -> PathBuf {
        std::mem::take(&mut self.0)
    }
}

impl std::ops::Deref for TempDir {
    type Target = PathBuf;
    fn deref(&self) -> &PathBuf {
        &self.0
    }
}

impl AsRef<Path> for TempDir {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<std::ffi::OsStr> for TempDir {
    fn as_ref(&self) -> &std::ffi::OsStr {
        self.0.as_os_str()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        remove_unless_panicking(&self.0);
    }
}

fn remove_unless_panicking(dir: &Path) {
    if dir.as_os_str().is_empty() {
        return;
    }
    if std::thread::panicking() {
        eprintln!("kept for inspection: {}", dir.display());
    } else {
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// A fresh, empty directory for one test, with `conf/`, `logs/` and `html/`.
pub fn temp_dir(tag: &str) -> TempDir {
    static N: AtomicUsize = AtomicUsize::new(0);
    let d = std::env::temp_dir().join(format!(
        "shard-test-{}-{}-{}",
        tag,
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(d.join("conf")).unwrap();
    std::fs::create_dir_all(d.join("logs")).unwrap();
    // The default root exists before a server starts, as in an installation (a sandboxed
    // worker can only be granted a root that exists when it starts).
    std::fs::create_dir_all(d.join("html")).unwrap();
    TempDir(d)
}

/// A Python that can `import module` (`python3`, else Debian's `/usr/bin/python3`, which its
/// `python3-*` packages serve); without one, the part of the test named `what` says SKIPPED
/// with `missing` (how to get it).
pub fn python_with(module: &str, what: &str, missing: &str) -> Option<&'static str> {
    let found = ["python3", "/usr/bin/python3"].into_iter().find(|p| {
        Command::new(p)
            .args(["-c", &format!("import {module}")])
            .output()
            .is_ok_and(|o| o.status.success())
    });
    if found.is_none() {
        skipped(what, missing);
    }
    found
}

/// Runs the client script `script` with `py` against `port` (at most `secs` seconds) and
/// returns what it printed; fails the test when the script fails.
pub fn run_client(py: &str, script: &str, secs: u32, port: u16, args: &[&str]) -> String {
    let out = Command::new("timeout")
        .arg(secs.to_string())
        .arg(py)
        .arg(script)
        .arg(port.to_string())
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{script} {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Says loudly that a test checked nothing because a tool is missing, and how to get it.
pub fn skipped(test: &str, why: &str) {
    eprintln!("SKIPPED: {test}: {why}");
    println!("SKIPPED: {test}: {why}");
}

pub struct Server {
    pub child: Option<Child>,
    /// The prefix; removed when the server is dropped (kept if the test failed).
    pub dir: PathBuf,
    pub port: u16,
    /// The ports that replaced `{port1}`, `{port2}`, ... (see [`Server::start_ports`]).
    pub ports: Vec<u16>,
}

impl Server {
    /// Starts shard with `conf`, where every `{port}` is replaced by a free port and `{dir}` by
    /// the prefix. Waits until `/status` (which the caller must configure at
    /// `location = /status { shard_status; }`) reports `workers` live workers.
    pub fn start(tag: &str, conf: &str, workers: usize) -> Server {
        Self::start_env(tag, conf, workers, &[])
    }

    pub fn start_env(tag: &str, conf: &str, workers: usize, env: &[(&str, &str)]) -> Server {
        Self::start_full(tag, conf, workers, env, 0)
    }

    /// Like `start`, and `{port1}` .. `{portN}` are replaced by `n` more free ports (listeners
    /// of other server blocks), read back from `ports`. A test never writes a port it probed
    /// itself into a listen directive: when another test takes it first, the start is retried
    /// on new ports here.
    pub fn start_ports(tag: &str, conf: &str, workers: usize, n: usize) -> Server {
        Self::start_full(tag, conf, workers, &[], n)
    }

    fn start_full(tag: &str, conf: &str, workers: usize, env: &[(&str, &str)], n: usize) -> Server {
        // `free_port` can race with another test taking the same port between our probe and
        // shard's bind: start again on new ports when that is what happened.
        for _ in 0..3 {
            match Self::try_start(tag, conf, workers, env, n) {
                Ok(s) => return s,
                Err(stderr) if stderr.contains("Address already in use") => continue,
                Err(stderr) => panic!("shard did not become ready: {stderr}"),
            }
        }
        panic!("shard could not bind a free port three times");
    }

    fn try_start(
        tag: &str,
        conf: &str,
        workers: usize,
        env: &[(&str, &str)],
        n: usize,
    ) -> Result<Server, String> {
        let dir = temp_dir(tag).keep();
        // Distinct ports: `free_port` never hands the same port out twice.
        let taken: Vec<u16> = (0..=n).map(|_| free_port()).collect();
        let port = taken[0];
        let ports: Vec<u16> = taken[1..].to_vec();
        let mut text = conf
            .replace("{port}", &port.to_string())
            .replace("{dir}", dir.to_str().unwrap());
        // From the highest, so that `{port1}` does not match the start of `{port12}`.
        for (i, p) in ports.iter().enumerate().rev() {
            text = text.replace(&format!("{{port{}}}", i + 1), &p.to_string());
        }
        // `SHARD_TEST_SANDBOX=1` runs every server with `worker_sandbox on` (the whole suite
        // then checks that the sandbox lets through everything shard does).
        // In the foreground: the test waits on the master it starts (shard's default, as
        // nginx's, is `daemon on`).
        if !text.contains("daemon ") {
            text = format!("daemon off;\n{text}");
        }
        if std::env::var_os("SHARD_TEST_SANDBOX").is_some_and(|v| v == "1")
            && !text.contains("worker_sandbox")
        {
            text = format!("worker_sandbox on;\n{text}");
        }
        std::fs::write(dir.join("conf/shard.conf"), text).unwrap();
        // `SHARD_TEST_WRAP="strace -f -o FILE"` runs every server under that command (how
        // the sandbox's system-call table was measured).
        let mut cmd = match std::env::var("SHARD_TEST_WRAP") {
            Ok(w) if !w.trim().is_empty() => {
                let mut parts = w.split_whitespace();
                let mut c = Command::new(parts.next().unwrap_or("env"));
                c.args(parts).arg(BIN);
                c
            }
            _ => Command::new(BIN),
        };
        cmd.arg("-p").arg(&dir).arg("-c").arg("conf/shard.conf");
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(
                std::fs::File::create(dir.join("logs/stderr.log")).unwrap(),
            ));
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().expect("spawn shard");
        let mut s = Server {
            child: Some(child),
            dir,
            port,
            ports,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(child) = s.child.as_mut() {
                if let Ok(Some(_)) = child.try_wait() {
                    s.child = None;
                    return Err(s.stderr());
                }
            }
            if let Ok(resp) = try_get(s.addr(), "/status") {
                let ws = parse_workers(&resp.body_str());
                if ws.len() == workers && ws.iter().all(|w| w.pid > 0 && pid_alive(w.pid as i32)) {
                    return Ok(s);
                }
            }
            if Instant::now() > deadline {
                return Err(s.stderr());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    pub fn pid(&self) -> i32 {
        self.child.as_ref().unwrap().id() as i32
    }

    pub fn stderr(&self) -> String {
        std::fs::read_to_string(self.dir.join("logs/stderr.log")).unwrap_or_default()
    }

    /// Waits until the status page lists `n` workers, each with a live pid.
    pub fn wait_workers(&mut self, n: usize) -> Vec<Worker> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(st)) = child.try_wait() {
                    panic!("shard exited early with {st}: {}", self.stderr());
                }
            }
            if let Ok(resp) = try_get(self.addr(), "/status") {
                let ws = parse_workers(&resp.body_str());
                if ws.len() == n && ws.iter().all(|w| w.pid > 0 && pid_alive(w.pid as i32)) {
                    return ws;
                }
            }
            if Instant::now() > deadline {
                panic!("shard did not become ready: {}", self.stderr());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn workers(&self) -> Vec<Worker> {
        parse_workers(&get(self.addr(), "/status").body_str())
    }

    pub fn signal(&self, sig: i32) {
        // SAFETY: plain kill(2) on our child.
        unsafe { libc::kill(self.pid(), sig) };
    }

    /// Waits for the master to exit and returns its exit code.
    pub fn wait_exit(&mut self, timeout: Duration) -> i32 {
        let mut child = self.child.take().unwrap();
        let st = wait_for(timeout, "shard to exit", || child.try_wait().unwrap());
        st.code().unwrap_or(-1)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            // SAFETY: plain kill(2) on our child.
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = c.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
        // A worker that panicked (a debug assertion, an unexpected state) is respawned by the
        // master, so a test could pass without seeing it: look for it here.
        let stderr = self.stderr();
        if !std::thread::panicking() && stderr.contains("panicked at") {
            let dir = std::mem::take(&mut self.dir);
            panic!("a shard process panicked ({}): {stderr}", dir.display());
        }
        remove_unless_panicking(&self.dir);
    }
}

pub fn pid_alive(pid: i32) -> bool {
    // A zombie still answers kill(0); look at /proc state too.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => !s
            .rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z'),
        Err(_) => false,
    }
}

#[derive(Debug, Clone)]
pub struct Worker {
    pub idx: usize,
    pub pid: u64,
    pub accepted: u64,
    pub requests: u64,
    pub active: u64,
    pub body_mem_bytes: u64,
    pub body_spooled_bytes: u64,
    pub body_temp_files: u64,
    pub cpu_ms: u64,
    pub stolen: u64,
    pub stalls: u64,
}

fn json_u64(obj: &str, key: &str) -> u64 {
    let pat = format!("\"{key}\":");
    let i = obj
        .find(&pat)
        .unwrap_or_else(|| panic!("no {key} in {obj}"))
        + pat.len();
    obj[i..]
        .chars()
        .take_while(|c| c.is_ascii_digit())
        .collect::<String>()
        .parse()
        .unwrap()
}

/// Minimal reader of the `workers` array of `/status` (the format is ours and flat).
pub fn parse_workers(json: &str) -> Vec<Worker> {
    let Some(start) = json.find("\"workers\":[") else {
        return Vec::new();
    };
    let rest = &json[start + 11..];
    let end = rest.find(']').unwrap_or(rest.len());
    rest[..end]
        .split("},")
        .filter(|o| o.contains("\"idx\""))
        .map(|o| Worker {
            idx: json_u64(o, "idx") as usize,
            pid: json_u64(o, "pid"),
            accepted: json_u64(o, "accepted"),
            requests: json_u64(o, "requests"),
            active: json_u64(o, "active"),
            body_mem_bytes: json_u64(o, "body_mem_bytes"),
            body_spooled_bytes: json_u64(o, "body_spooled_bytes"),
            body_temp_files: json_u64(o, "body_temp_files"),
            cpu_ms: json_u64(o, "cpu_ms"),
            stolen: json_u64(o, "stolen"),
            stalls: json_u64(o, "stalls"),
        })
        .collect()
}

#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
    pub fn body_str(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Reads one response from `s`. `head_only` for responses to HEAD (no body despite length).
pub fn read_response(s: &mut TcpStream, head_only: bool) -> std::io::Result<Response> {
    let mut buf = Vec::new();
    let mut tmp = [0u8; 16384];
    let head_end = loop {
        if let Some(i) = find(&buf, b"\r\n\r\n") {
            break i + 4;
        }
        let n = s.read(&mut tmp)?;
        if n == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "eof before head",
            ));
        }
        buf.extend_from_slice(&tmp[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or("");
    let status: u16 = status_line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let headers: Vec<(String, String)> = lines
        .filter(|l| !l.is_empty())
        .filter_map(|l| {
            l.split_once(':')
                .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        })
        .collect();
    let mut body = buf[head_end..].to_vec();
    let len = headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.parse::<usize>().ok());
    let chunked = headers.iter().any(|(k, v)| {
        k.eq_ignore_ascii_case("transfer-encoding") && v.eq_ignore_ascii_case("chunked")
    });
    if head_only || status == 304 || status == 204 {
        body.clear();
    } else if chunked {
        // Until the last chunk (no trailers), then de-chunked.
        while find(&body, b"\r\n0\r\n\r\n").is_none() && !body.starts_with(b"0\r\n\r\n") {
            let n = s.read(&mut tmp)?;
            if n == 0 {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "eof in chunked body",
                ));
            }
            body.extend_from_slice(&tmp[..n]);
        }
        let mut out = Vec::new();
        let mut rest = &body[..];
        while let Some(nl) = find(rest, b"\r\n") {
            let size = std::str::from_utf8(&rest[..nl])
                .ok()
                .and_then(|h| usize::from_str_radix(h.split(';').next()?.trim(), 16).ok())
                .unwrap_or(0);
            if size == 0 {
                break;
            }
            out.extend_from_slice(&rest[nl + 2..nl + 2 + size]);
            rest = &rest[nl + 2 + size + 2..];
        }
        body = out;
    } else if let Some(len) = len {
        while body.len() < len {
            let n = s.read(&mut tmp)?;
            if n == 0 {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "eof in body",
                ));
            }
            body.extend_from_slice(&tmp[..n]);
        }
        body.truncate(len);
    } else {
        loop {
            let n = s.read(&mut tmp)?;
            if n == 0 {
                break;
            }
            body.extend_from_slice(&tmp[..n]);
        }
    }
    Ok(Response {
        status,
        headers,
        body,
    })
}

pub fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

pub fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

/// Sends raw bytes on a new connection and reads one response.
pub fn raw(addr: SocketAddr, req: &[u8]) -> Response {
    let mut s = connect(addr);
    s.write_all(req).unwrap();
    read_response(&mut s, req.starts_with(b"HEAD")).expect("response")
}

pub fn try_get(addr: SocketAddr, path: &str) -> std::io::Result<Response> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_millis(500))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )?;
    read_response(&mut s, false)
}

pub fn get(addr: SocketAddr, path: &str) -> Response {
    try_get(addr, path).unwrap_or_else(|e| panic!("GET {path}: {e}"))
}

/// Waits until `generation` runs `workers` live workers (read from `/status`).
pub fn wait_generation(s: &Server, generation: u64, workers: usize) {
    wait_for(
        Duration::from_secs(15),
        &format!("generation {generation}"),
        || {
            let body = try_get(s.addr(), "/status").ok()?.body_str();
            let g: u64 = body
                .split("\"generation\":")
                .nth(1)?
                .split(',')
                .next()?
                .parse()
                .ok()?;
            let ws = parse_workers(&body);
            (g == generation
                && ws.len() == workers
                && ws.iter().all(|w| w.pid > 0 && pid_alive(w.pid as i32)))
            .then_some(())
        },
    );
}

/// The server's error log so far (empty before it exists).
pub fn error_log(s: &Server) -> String {
    std::fs::read_to_string(s.dir.join("logs/error.log")).unwrap_or_default()
}

/// Waits until every worker pid in `old` accepts no more: it has exited, or logged that it is
/// gracefully shutting down (a worker says so after it has taken what was queued for it and
/// left its listeners). Until then an old worker may still take, and answer with the old
/// configuration, a connection opened after the new generation is up.
pub fn wait_stopped_accepting(s: &Server, old: &[u64]) {
    wait_for(Duration::from_secs(10), "old workers stopping", || {
        let text = error_log(s);
        old.iter()
            .all(|&p| {
                !pid_alive(p as i32)
                    || text.lines().any(|l| {
                        l.contains(&format!(" {p}#0: worker "))
                            && l.contains("gracefully shutting down")
                    })
            })
            .then_some(())
    });
}

/// The line a master logs when it attaches the program that deals new connections in turn.
pub const DEALT_LINE: &str = "are dealt in turn";

/// Waits until `logs/error.log` under `dir` says `times` times that a master deals new
/// connections in turn (eBPF), or that `bpf(2)` refused it. Returns `false`, after saying
/// SKIPPED, where it was refused for want of privilege (a master without `CAP_BPF`); any
/// other refusal (the verifier's) fails the test.
pub fn wait_dealt(dir: &Path, times: usize) -> bool {
    let log = || std::fs::read_to_string(dir.join("logs/error.log")).unwrap_or_default();
    wait_for(Duration::from_secs(10), "the dealing program", || {
        let t = log();
        (t.matches(DEALT_LINE).count() >= times || t.contains("bpf(2) refused")).then_some(())
    });
    let t = log();
    if t.contains("bpf(2) refused") && t.contains("Operation not permitted") {
        eprintln!("SKIPPED: this master may not load eBPF: {t}");
        return false;
    }
    assert!(!t.contains("bpf(2) refused"), "{t}");
    true
}

/// 40 new connections, one after the other, to a server of 4 workers that deals them in
/// turn: each worker takes 10 of them, or 11 with one of the two `/status` requests that
/// count them.
pub fn assert_dealt_in_turn(s: &Server) {
    let accepted = || -> Vec<u64> {
        parse_workers(&get(s.addr(), "/status").body_str())
            .iter()
            .map(|w| w.accepted)
            .collect()
    };
    let before = accepted();
    for _ in 0..40 {
        assert_eq!(get(s.addr(), "/ok").status, 200);
    }
    let got: Vec<u64> = accepted().iter().zip(&before).map(|(a, b)| a - b).collect();
    assert_eq!(got.iter().sum::<u64>(), 41, "{got:?}");
    assert!(got.iter().all(|&g| (10..=11).contains(&g)), "{got:?}");
}

pub fn write_file(dir: &Path, rel: &str, data: &[u8]) {
    let p = dir.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, data).unwrap();
}

/// A configuration with every endpoint the tests use. `{listen_opts}` is replaced by the
/// caller's listen options, `{events}` by extra `events` directives, `{workers}` by the count.
pub const BASE_CONF: &str = r#"
worker_processes {workers};
error_log logs/error.log info;
pid logs/shard.pid;
events {
    worker_connections 1024;
    {events}
}
http {
    access_log logs/access.log combined;
    server {
        listen 127.0.0.1:{port} {listen_opts};
        root {dir}/html;
        location = /status { shard_status; }
        location = /stub { stub_status; }
        location = /ok { return 200 "OK"; }
        location / { }
    }
}
"#;

pub fn base_conf(workers: usize, listen_opts: &str, events: &str) -> String {
    BASE_CONF
        .replace("{workers}", &workers.to_string())
        .replace("{listen_opts}", listen_opts)
        .replace("{events}", events)
}

/// Runs the binary with `args` and returns (exit code, stderr).
pub fn run_cli(args: &[&str]) -> (i32, String) {
    let out = Command::new(BIN).args(args).output().expect("run shard");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Sums the `accepted` counters of a worker list.
pub fn total_accepted(ws: &[Worker]) -> u64 {
    ws.iter().map(|w| w.accepted).sum()
}

/// Splits `buf` into the complete responses it holds (by `Content-Length`), in order.
pub fn parse_responses(buf: &[u8]) -> Vec<Response> {
    let mut out = Vec::new();
    let mut at = 0;
    while let Some(end) = find(&buf[at..], b"\r\n\r\n") {
        let head = String::from_utf8_lossy(&buf[at..at + end]).into_owned();
        let mut lines = head.split("\r\n");
        let status = lines
            .next()
            .unwrap_or("")
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let headers: Vec<(String, String)> = lines
            .filter_map(|l| {
                l.split_once(':')
                    .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
            })
            .collect();
        let len = headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
            .and_then(|(_, v)| v.parse::<usize>().ok())
            .unwrap_or(0);
        let body_at = at + end + 4;
        if buf.len() < body_at + len {
            break;
        }
        out.push(Response {
            status,
            headers,
            body: buf[body_at..body_at + len].to_vec(),
        });
        at = body_at + len;
    }
    out
}

/// Reads from `s` until `n` complete responses have arrived.
pub fn read_responses(s: &mut TcpStream, n: usize) -> Vec<Response> {
    let mut buf = Vec::new();
    let mut tmp = [0u8; 16384];
    loop {
        let rs = parse_responses(&buf);
        if rs.len() >= n {
            return rs;
        }
        let got = s.read(&mut tmp).expect("read responses");
        assert!(
            got > 0,
            "connection closed after {} of {n} responses",
            rs.len()
        );
        buf.extend_from_slice(&tmp[..got]);
    }
}

/// The installed nginx, if any (the tests that compare with it say SKIPPED without it).
pub fn nginx_binary() -> Option<&'static Path> {
    ["/usr/sbin/nginx", "/usr/bin/nginx", "/usr/local/sbin/nginx"]
        .iter()
        .map(Path::new)
        .find(|p| p.is_file())
}

/// Starts `nginx` with `conf` written to `dir/nginx.conf` (prefix `dir`, error log in
/// `dir/logs`) and waits until it accepts on `port`.
pub fn start_nginx(nginx: &Path, dir: &Path, conf: &str, port: u16) -> Nginx {
    std::fs::create_dir_all(dir.join("logs")).unwrap();
    std::fs::write(dir.join("nginx.conf"), conf).unwrap();
    let child = Command::new(nginx)
        .arg("-p")
        .arg(dir)
        .arg("-e")
        .arg(dir.join("logs/nginx-error.log"))
        .arg("-c")
        .arg(dir.join("nginx.conf"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start nginx");
    let mut n = Nginx(child);
    wait_for(Duration::from_secs(10), "nginx listening", || {
        if let Ok(Some(st)) = n.0.try_wait() {
            panic!("nginx exited: {st}");
        }
        TcpStream::connect(("127.0.0.1", port)).ok()
    });
    n
}

/// An nginx started by a test, stopped as its documentation says (QUIT to the master, which
/// stops its workers) when dropped, and waited for; SIGKILL to the master would orphan its
/// workers.
pub struct Nginx(pub Child);

impl Drop for Nginx {
    fn drop(&mut self) {
        // SAFETY: plain kill(2) on our child.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGQUIT) };
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `key` of `/status` summed over the workers.
pub fn status_field(s: &Server, key: &str) -> u64 {
    try_status_field(s, key).unwrap_or_else(|| panic!("no /status answer for {key}"))
}

/// The same, `None` when the status page cannot be had (at the cap its request may wait).
pub fn try_status_field(s: &Server, key: &str) -> Option<u64> {
    let body = try_get(s.addr(), "/status").ok()?.body_str();
    let pat = format!("\"{key}\":");
    body.match_indices(&pat)
        .map(|(i, _)| {
            body[i + pat.len()..]
                .chars()
                .take_while(|c| c.is_ascii_digit())
                .collect::<String>()
                .parse::<u64>()
                .ok()
        })
        .sum()
}

/// Sends `head` (a request head without its final empty line) with `Connection: close`
/// and reads until the server closes: the status (0 when nothing came back, as after
/// `return 444`), the header lines (names lowercase) and the raw body.
pub fn exchange(addr: SocketAddr, head: &str) -> (u16, Vec<(String, String)>, Vec<u8>) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(s, "{head}\r\nConnection: close\r\n\r\n").unwrap();
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    let end = find(&raw, b"\r\n\r\n").map_or(raw.len(), |i| i + 4);
    let text = String::from_utf8_lossy(&raw[..end]).into_owned();
    let mut lines = text.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let hs = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    (status, hs, raw[end..].to_vec())
}
