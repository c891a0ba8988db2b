//! `shard-bench fastcgi`: shard and nginx in front of the same PHP-FPM pool, side by side.
//!
//! One pool (Debian's `php-fpm`, started by the bench with its own configuration: `pm =
//! static`, a unix socket in the bench's directory) serves a tiny page (`<?php echo "OK";`).
//! Each front (`--workers` workers) passes `location = /ok` to it through `upstream fpm {
//! server unix:...; keepalive 8; }` with `fastcgi_keep_conn on`, so both sides stay open. What
//! is measured is the front alone: requests/s, its workers' system calls (`strace -c -f`) and
//! CPU time per request. The pool's own cost is the same for both fronts and is not counted.
//!
//! Deliberately not here: request bodies, large responses (the proxy's buffers are measured by
//! `shard-bench proxy` and `bodies`), and PHP's own speed.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};

use crate::procfs;
use crate::servers::{self, Kind, Running, Spec};
use crate::Tools;

/// PHP-FPM children. A child serves one connection for as long as the front keeps it open
/// (`fastcgi_keep_conn on`), so the children must outnumber the connections every worker may
/// keep (`keepalive` × workers) and the load's concurrency: otherwise new connections wait in
/// the pool's backlog behind idle kept ones, in nginx as in shard (p99 of 370-470 ms with 16
/// clients, 8 children and `keepalive 8` on 2 workers, measured on both).
const FPM_CHILDREN: usize = 24;
/// `keepalive` of the fronts' upstream block (per worker).
const UPSTREAM_KEEPALIVE: usize = 4;

#[derive(clap::Args, Debug, Clone)]
pub struct FastcgiArgs {
    /// Worker processes of each front.
    #[arg(long, default_value_t = 2)]
    workers: usize,
    /// Seconds per load run.
    #[arg(long, default_value_t = 5)]
    duration: u64,
    /// Concurrent client connections per load run.
    #[arg(long, default_value_t = 16)]
    connections: usize,
    /// The php-fpm binary (default: `php-fpm` on the PATH, else `/usr/sbin/php-fpm*`).
    #[arg(long)]
    php_fpm: Option<PathBuf>,
    /// `--shard`, `--nginx`, `--no-nginx`.
    #[command(flatten)]
    peers: crate::servers::Peers,
    /// Use the built-in load generator even when wrk is installed.
    #[arg(long)]
    builtin_load: bool,
    /// Tiny numbers, to check that the bench works (CI).
    #[arg(long)]
    smoke: bool,
    /// Also write the report here.
    #[arg(long)]
    out: Option<PathBuf>,
}

#[derive(Default, Debug)]
struct Row {
    name: String,
    rps: Option<f64>,
    syscalls_per_req: Option<f64>,
    cpu_us_per_req: Option<f64>,
}

/// A PHP-FPM pool of the bench's own, stopped when dropped.
struct Pool {
    child: Child,
    dir: PathBuf,
    sock: PathBuf,
}

impl Drop for Pool {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// php-fpm as `--php-fpm` names it, on the PATH, or Debian's versioned one.
fn find_php_fpm(given: Option<&Path>) -> Option<PathBuf> {
    if let Some(p) = given {
        return Some(p.to_path_buf());
    }
    if let Ok(out) = Command::new("sh")
        .args(["-c", "command -v php-fpm"])
        .output()
    {
        let p = String::from_utf8_lossy(&out.stdout).trim().to_string();
        if !p.is_empty() {
            return Some(PathBuf::from(p));
        }
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/sbin")
        .ok()?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("php-fpm"))
        })
        .collect();
    found.sort();
    found.pop()
}

impl Pool {
    fn start(bin: &Path) -> Result<Pool> {
        let dir = std::env::temp_dir().join(format!("shard-bench-fpm-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("html"))?;
        std::fs::write(dir.join("html/ok.php"), "<?php echo \"OK\";")?;
        let sock = dir.join("fpm.sock");
        let d = dir.display();
        std::fs::write(
            dir.join("fpm.conf"),
            format!(
                "[global]\npid = {d}/fpm.pid\nerror_log = {d}/fpm.log\ndaemonize = no\n\
                 [bench]\nlisten = {}\nlisten.mode = 0666\npm = static\npm.max_children = {FPM_CHILDREN}\n\
                 pm.max_requests = 0\nphp_admin_value[display_errors] = off\n",
                sock.display()
            ),
        )?;
        let child = Command::new(bin)
            .args(["-F", "-R", "-n", "-y"])
            .arg(dir.join("fpm.conf"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let mut pool = Pool { child, dir, sock };
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::os::unix::net::UnixStream::connect(&pool.sock).is_err() {
            if let Ok(Some(st)) = pool.child.try_wait() {
                bail!("php-fpm exited ({st}) before listening");
            }
            ensure!(
                Instant::now() < deadline,
                "php-fpm did not listen within 10 s"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(pool)
    }
}

pub fn run(mut a: FastcgiArgs) -> Result<()> {
    if a.smoke {
        a.duration = 1;
        a.connections = a.connections.min(4);
    }
    ensure!(a.workers >= 1, "--workers must be at least 1");
    ensure!(a.connections >= 1, "--connections must be at least 1");
    procfs::raise_nofile_limit();
    let shard = crate::shard_binary(a.peers.shard.as_deref())?;
    let tools = Tools::find(&a.peers, a.builtin_load);
    let mut notes = tools.notes.clone();
    let Some(fpm_bin) = find_php_fpm(a.php_fpm.as_deref()) else {
        let report = "# shard-bench fastcgi\n\nSKIPPED: php-fpm is not installed \
             (apt-get install php-fpm, or --php-fpm PATH).\n"
            .to_string();
        print!("{report}");
        return crate::servers::write_report(a.out.as_deref(), &report);
    };
    let pool = Pool::start(&fpm_bin)?;
    let mut kinds = vec![Kind::Shard(shard)];
    if let Some(n) = &tools.nginx {
        kinds.push(Kind::Nginx(n.clone()));
    }
    let mut rows = Vec::new();
    for kind in &kinds {
        let name = kind.name();
        let mut row = Row {
            name: name.to_string(),
            ..Default::default()
        };
        eprintln!(
            "shard-bench: {name}: FastCGI to PHP-FPM, {} workers, {} connections",
            a.workers, a.connections
        );
        if let Err(e) = front(kind, &pool, &tools, &a, &mut row) {
            notes.push(format!("{name}: not measured: {e:#}"));
        }
        rows.push(row);
    }
    drop(pool);
    for n in &notes[tools.notes.len()..] {
        eprintln!("shard-bench: {n}");
    }
    let report = render(&a, &fpm_bin, &rows, &notes);
    print!("{report}");
    crate::servers::write_report(a.out.as_deref(), &report)
}

fn front(kind: &Kind, pool: &Pool, tools: &Tools, a: &FastcgiArgs, row: &mut Row) -> Result<()> {
    let script = pool.dir.join("html/ok.php");
    let spec = Spec {
        workers: a.workers,
        listen_opts: "reuseport".into(),
        events: String::new(),
        server_extra: String::new(),
        ok: Some(format!(
            "fastcgi_pass fpm; fastcgi_keep_conn on; \
             fastcgi_param SCRIPT_FILENAME {}; fastcgi_param REQUEST_METHOD $request_method; \
             fastcgi_param QUERY_STRING $query_string; fastcgi_param SERVER_PROTOCOL $server_protocol;",
            script.display()
        )),
        http_extra: format!(
            "upstream fpm {{ server unix:{}; keepalive {UPSTREAM_KEEPALIVE}; }}",
            pool.sock.display()
        ),
        stream: None,
        main_extra: String::new(),
        idle: 0,
        tag: "fastcgi".into(),
        detach: false,
    };
    let srv = servers::start_with(kind, &spec, |_| Ok(())).context("starting the front")?;
    let res = measure(&srv, tools, a, row);
    srv.stop();
    res
}

fn measure(srv: &Running, tools: &Tools, a: &FastcgiArgs, row: &mut Row) -> Result<()> {
    let d = Duration::from_secs(a.duration);
    let wrk = tools.wrk.as_deref();
    php_ok(srv.port)?;
    if let Some(strace) = &tools.strace {
        let pids = srv.worker_pids()?;
        let tracer = procfs::Strace::attach(strace, &pids)?;
        let r0 = srv.requests()?;
        let load = crate::run_load(srv.port, "/ok", wrk, a.connections, d, true);
        let r1 = srv.requests();
        let calls = tracer.finish()?;
        load?;
        // Less the status read itself.
        let n = r1?.saturating_sub(r0 + 1).max(1);
        row.syscalls_per_req = Some(calls as f64 / n as f64);
    }
    let pids = srv.worker_pids()?;
    let r0 = srv.requests()?;
    let cpu0 = procfs::cpu_ticks(&pids)?;
    let t0 = Instant::now();
    crate::run_load(srv.port, "/ok", wrk, a.connections, d, true)?;
    let secs = t0.elapsed().as_secs_f64();
    let cpu1 = procfs::cpu_ticks(&pids)?;
    let n = srv.requests()?.saturating_sub(r0 + 1);
    ensure!(n > 0, "no request was served during the load");
    // Still PHP's answer after the load (not an error page all along).
    php_ok(srv.port)?;
    row.cpu_us_per_req = Some((cpu1 - cpu0) as f64 * 1e6 / procfs::ticks_per_sec() / n as f64);
    row.rps = Some(n as f64 / secs);
    Ok(())
}

/// `GET /ok` answers PHP's 200 "OK".
fn php_ok(port: u16) -> Result<()> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    s.write_all(b"GET /ok HTTP/1.0\r\nHost: bench\r\n\r\n")?;
    let mut resp = Vec::new();
    s.read_to_end(&mut resp).context("reading the response")?;
    let text = String::from_utf8_lossy(&resp);
    ensure!(
        text.starts_with("HTTP/1.1 200") && text.ends_with("\r\n\r\nOK"),
        "GET /ok did not return PHP's 200 \"OK\": {:?}",
        text.chars().take(300).collect::<String>()
    );
    Ok(())
}

fn fmt(v: Option<f64>, digits: usize) -> String {
    v.map_or("-".to_string(), |x| format!("{x:.digits$}"))
}

fn render(a: &FastcgiArgs, fpm: &Path, rows: &[Row], notes: &[String]) -> String {
    let mut s = format!(
        "# shard-bench fastcgi: {} front workers, {} connections, {} s per run{}\n\n",
        a.workers,
        a.connections,
        a.duration,
        if a.smoke {
            " (smoke: numbers are not meaningful)"
        } else {
            ""
        }
    );
    s.push_str(&format!(
        "Pool: `{}`, `pm = static`, {FPM_CHILDREN} children, a unix socket, `<?php echo \"OK\";`. \
         Fronts: `upstream fpm {{ server unix:...; keepalive {UPSTREAM_KEEPALIVE}; }}`, \
         `fastcgi_keep_conn on`, four `fastcgi_param`s.\n\n",
        fpm.display()
    ));
    s.push_str("| server | req/s | syscalls/req | worker CPU µs/req |\n|---|---|---|---|\n");
    for r in rows {
        s.push_str(&format!(
            "| {} | {} | {} | {} |\n",
            r.name,
            fmt(r.rps, 0),
            fmt(r.syscalls_per_req, 2),
            fmt(r.cpu_us_per_req, 2)
        ));
    }
    if let (Some(x), Some(y)) = (
        rows.iter()
            .find(|r| r.name == "shard")
            .and_then(|r| r.cpu_us_per_req),
        rows.iter()
            .find(|r| r.name == "nginx")
            .and_then(|r| r.cpu_us_per_req),
    ) {
        s.push_str(&format!(
            "\nshard / nginx worker CPU per request: {:.2}\n",
            x / y
        ));
    }
    if !notes.is_empty() {
        s.push_str("\nNotes:\n");
        for n in notes {
            s.push_str(&format!("- {n}\n"));
        }
    }
    s
}
