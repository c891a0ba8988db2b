//! The bench in smoke mode: every step runs on tiny numbers (CI checks that it works, not how
//! fast anything is).

use std::process::Command;

/// Runs `cmd` to its end and returns its standard output; fails the test, showing both
/// outputs, when it exits unsuccessfully.
fn stdout_of(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

fn strace_installed() -> bool {
    ["/usr/bin/strace", "/bin/strace", "/usr/local/bin/strace"]
        .iter()
        .any(|p| std::path::Path::new(p).is_file())
}

#[test]
fn speed_smoke_runs_and_reports_every_column_for_shard() {
    let bench = env!("CARGO_BIN_EXE_shard-bench");
    let shard = std::path::Path::new(bench).with_file_name("shard");
    assert!(
        shard.exists(),
        "cargo test builds every workspace binary: {}",
        shard.display()
    );
    let text = stdout_of(Command::new(bench).args([
        "speed",
        "--smoke",
        "--workers",
        "2",
        "--no-nginx",
        "--builtin-load",
        "--sandbox",
        "--sandbox-pairs",
        "2",
        "--path",
        "/static.html",
    ]));
    let row = text
        .lines()
        .find(|l| l.starts_with("| shard |"))
        .unwrap_or_else(|| panic!("{text}"));
    let cols: Vec<&str> = row.split('|').map(str::trim).collect();
    // CPU, req/s and memory are measured without optional tools; syscalls with strace.
    if strace_installed() {
        assert!(cols[2].parse::<f64>().unwrap() > 0.0, "{row}");
        assert!(cols[3].parse::<f64>().unwrap() > 0.0, "{row}");
    } else {
        println!("SKIPPED: syscalls/request: strace is not installed (apt-get install strace)");
    }
    assert!(cols[4].parse::<f64>().is_ok(), "{row}");
    // --path loads the bench's 4 KiB static file (the E1 experiment covers `/ok`).
    assert!(text.contains("GET /static.html (a static file)"), "{text}");
    // --sandbox adds a measured row of its own.
    let sandboxed = text
        .lines()
        .find(|l| l.starts_with("| shard (worker_sandbox on) |"))
        .unwrap_or_else(|| panic!("no sandbox row: {text}"));
    let c: Vec<&str> = sandboxed.split('|').map(str::trim).collect();
    assert!(c[4].parse::<f64>().unwrap() > 0.0, "{sandboxed}");
    // --sandbox-pairs: two pairs in alternating order, and their mean.
    assert!(text.contains("| 1 | off, on |"), "{text}");
    assert!(text.contains("| 2 | on, off |"), "{text}");
    assert!(text.contains("Sandbox cost: mean "), "{text}");
    assert!(cols[5].parse::<f64>().unwrap() > 0.0, "{row}");
    assert!(cols[6].parse::<f64>().is_ok(), "{row}");
}

#[test]
fn proxy_smoke_measures_the_http_proxy_and_the_stream_relay_for_shard() {
    let bench = env!("CARGO_BIN_EXE_shard-bench");
    let text = stdout_of(Command::new(bench).args([
        "proxy",
        "--smoke",
        "--workers",
        "2",
        "--no-nginx",
        "--builtin-load",
    ]));
    let row = text
        .lines()
        .find(|l| l.starts_with("| shard |"))
        .unwrap_or_else(|| panic!("{text}"));
    let cols: Vec<&str> = row.split('|').map(str::trim).collect();
    let num = |i: usize| -> f64 {
        cols[i]
            .parse()
            .unwrap_or_else(|_| panic!("column {i} not measured: {text}"))
    };
    // Proxied req/s, worker CPU, backend connections and both stream directions are measured
    // without optional tools; syscalls need strace.
    assert!(num(2) > 0.0, "{text}");
    if strace_installed() {
        assert!(num(3) > 0.0, "{text}");
    } else {
        println!(
            "SKIPPED: syscalls/proxied request: strace is not installed (apt-get install strace)"
        );
    }
    assert!(num(4) >= 0.0, "{text}");
    // Keep-alive to the backend: 4 client connections and one check request need a handful
    // of upstream connections, not one per request.
    assert!((1.0..=16.0).contains(&num(5)), "{text}");
    assert!(num(6) > 0.0, "{text}");
    assert!(num(7) > 0.0, "{text}");
}

#[test]
fn cache_smoke_measures_hits_of_every_size_and_a_restart_for_shard() {
    let bench = env!("CARGO_BIN_EXE_shard-bench");
    let text = stdout_of(Command::new(bench).args([
        "cache",
        "--smoke",
        "--workers",
        "2",
        "--no-nginx",
        "--builtin-load",
    ]));
    for object in ["1k", "64k", "1m"] {
        let row = text
            .lines()
            .find(|l| l.starts_with(&format!("| {object} | shard |")))
            .unwrap_or_else(|| panic!("{text}"));
        let cols: Vec<&str> = row.split('|').map(str::trim).collect();
        let num = |i: usize| -> f64 {
            cols[i]
                .parse()
                .unwrap_or_else(|_| panic!("column {i} not measured: {text}"))
        };
        assert!(num(3) > 0.0 && num(4) > 0.0, "{text}");
        // Every answer under load was a hit: the backend saw none of them.
        assert_eq!(num(5), 0.0, "{text}");
    }
    assert!(
        text.contains("| shard | HIT |"),
        "a restart serves hits: {text}"
    );
    // The 90%-hit mix and the cold start are measured: hits and misses both answered; the
    // 200 smoke entries each reached the backend once, and none after the restart.
    let row_after = |heading: &str| -> Vec<String> {
        text.lines()
            .skip_while(|l| !l.starts_with(heading))
            .find(|l| l.starts_with("| shard |"))
            .unwrap_or_else(|| panic!("no shard row after {heading:?}: {text}"))
            .split('|')
            .map(|c| c.trim().to_string())
            .collect()
    };
    let mix = row_after("90%-hit mix");
    let n = |cols: &[String], i: usize| -> f64 {
        cols[i]
            .replace(',', "")
            .parse()
            .unwrap_or_else(|_| panic!("column {i} not measured: {text}"))
    };
    assert!(n(&mix, 2) > 0.0 && n(&mix, 5) > 0.0, "{text}");
    let cold = row_after("Cold start");
    assert_eq!(n(&cold, 3), 200.0, "{text}");
    assert!(n(&cold, 4) > 0.0, "{text}");
    assert_eq!(n(&cold, 5), 0.0, "{text}");
}

#[test]
fn experiments_smoke_writes_the_report_charts_and_configurations() {
    let bench = env!("CARGO_BIN_EXE_shard-bench");
    let out = std::env::temp_dir().join(format!("shard-bench-smoke-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let res = Command::new(bench)
        .args([
            "experiment",
            "all",
            "--smoke",
            "--workers",
            "2",
            "--nginx",
            "off",
            "--e3-pairs",
            "2",
            "--e1-rounds",
            "1",
            "--out",
        ])
        .arg(&out)
        .output()
        .unwrap();
    assert!(
        res.status.success(),
        "{}",
        String::from_utf8_lossy(&res.stderr)
    );
    let report = std::fs::read_to_string(out.join("report.md")).unwrap();
    for e in [
        "## E1.", "## E2.", "## E3.", "## E4.", "## E5.", "## E6.", "## E7.", "## E8.",
    ] {
        assert!(report.contains(e), "{e} missing: {report}");
    }
    // --e3-pairs: the pairs and their median ratio, as a note.
    assert!(
        report.contains("E3 pairs (2 workers)")
            && report.contains("median ratio")
            && report.contains("requests/s of the same pairs"),
        "{report}"
    );
    // --e1-rounds: steering on and off side by side, and E1's half-load column.
    assert!(
        report.contains("E1 rounds (2 workers")
            && report.contains("requests/s steering on / off per round")
            && report.contains("at half load (open loop)")
            && report.contains("max/min CPU at half load"),
        "{report}"
    );
    for strategy in [
        "| shard | accept_mutex on |",
        "| shard | accept_mutex off |",
        "| shard | reuseport, steering on |",
        "| shard | reuseport, steering off |",
        "| shard | reuseport, steering on (2 workers) |",
        "| shard | reuseport shards=auto |",
        "| shard | reuseport, http2_rebalance off |",
        "| shard | reuseport, http2_rebalance on |",
        "| rebind | steering by CID |",
        "| rebind | kernel hash |",
    ] {
        assert!(report.contains(strategy), "{strategy} missing: {report}");
    }
    for svg in [
        "e1-rps.svg",
        "e1-cpu-share.svg",
        "e2-cpu-share.svg",
        "e3-latency.svg",
        "e4-latency-2w.svg",
        "e4-timeline-2w.svg",
        "e5-cpu-share.svg",
        "e7-cpu-share.svg",
        "e8-ttfb.svg",
        "e8-timeline-rebind.svg",
    ] {
        let text = std::fs::read_to_string(out.join(svg)).unwrap();
        assert!(
            text.starts_with("<svg") && text.trim_end().ends_with("</svg>"),
            "{svg}"
        );
    }
    let json = std::fs::read_to_string(out.join("results.json")).unwrap();
    assert!(json.trim_start().starts_with('[') && json.contains("\"experiment\":\"E4\""));
    assert!(json.contains("\"stall\":{\"workers\":2,"), "{json}");
    assert!(report.contains("Goals (issue 11)"), "{report}");
    // E6: the reloads under load lost no connection.
    let e6 = &json[json.find("\"experiment\":\"E6\"").expect("an E6 row")..];
    let e6 = &e6[..e6[1..].find("\"experiment\"").map_or(e6.len(), |i| i + 1)];
    assert!(e6.contains("\"errors\":0,"), "E6 lost connections: {e6}");
    // E7: the HTTP/2 clients were answered, without a failure.
    let e7 = &json[json.find("\"experiment\":\"E7\"").expect("an E7 row")..];
    assert!(
        e7.contains("\"errors\":0,") && !e7.contains("\"requests\":0,"),
        "E7: {e7}"
    );
    let confs = std::fs::read_dir(out.join("confs")).unwrap().count();
    assert!(confs >= 14, "{confs} configurations kept");
    // Every run served without errors (E2's probe found a worker for each connection).
    assert!(!report.contains("| ? "), "{report}");
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn compare_runs_a_user_configuration_under_each_strategy() {
    let bench = env!("CARGO_BIN_EXE_shard-bench");
    let dir = std::env::temp_dir().join(format!("shard-bench-compare-test-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("conf")).unwrap();
    let port = free_port();
    let conf = format!(
        "worker_processes 2;\nerror_log stderr;\nevents {{\n    accept_mutex on;\n}}\nhttp {{\n    access_log off;\n    server {{\n        listen 127.0.0.1:{port};\n        location / {{ return 200 \"hi\"; }}\n    }}\n}}\n"
    );
    std::fs::write(dir.join("conf/mine.conf"), conf).unwrap();
    let text = stdout_of(
        Command::new(bench)
            .args(["compare", "--duration", "1", "--connections", "4", "-c"])
            .arg(dir.join("conf/mine.conf")),
    );
    for row in [
        "| reuseport, steering on |",
        "| reuseport, steering off |",
        "| accept_mutex off (EPOLLEXCLUSIVE) |",
        "| accept_mutex on |",
        "Why (each line from the numbers above):",
        "- requests/s: ",
        "- p99: ",
    ] {
        assert!(text.contains(row), "{row} missing: {text}");
    }
    // Two rounds by default: the noise is measured and named in the verdict.
    assert!(
        text.contains("by which rounds of one strategy differed"),
        "{text}"
    );
    // The keep-alive workload, one round: the noise is said to be unmeasured.
    let out = Command::new(bench)
        .args([
            "compare",
            "--workload",
            "keepalive",
            "--rounds",
            "1",
            "--duration",
            "1",
            "--connections",
            "4",
            "-c",
        ])
        .arg(dir.join("conf/mine.conf"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("keepalive load"), "{text}");
    assert!(
        text.contains("the run-to-run noise was not measured"),
        "{text}"
    );
    // Nothing is written beside the user's file.
    let left: Vec<_> = std::fs::read_dir(dir.join("conf")).unwrap().collect();
    assert_eq!(left.len(), 1);
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Every file under `dir` (path, bytes, permissions), sorted: two equal snapshots mean nothing
/// was written, added or removed.
fn snapshot(dir: &std::path::Path) -> Vec<(std::path::PathBuf, Vec<u8>, u32)> {
    use std::os::unix::fs::PermissionsExt;
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let meta = std::fs::symlink_metadata(&p).unwrap();
            if meta.is_dir() {
                stack.push(p.clone());
                out.push((p, Vec::new(), meta.permissions().mode()));
            } else {
                let bytes = std::fs::read(&p).unwrap_or_default();
                out.push((p, bytes, meta.permissions().mode()));
            }
        }
    }
    out.sort();
    out
}

/// A free loopback port never handed to another test of this process: the kernel may give
/// one released port to two probes in a row, and two servers listening with `reuseport` on it
/// would share one reuseport group without an error.
fn free_port() -> u16 {
    static HANDED_OUT: std::sync::Mutex<std::collections::BTreeSet<u16>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    for _ in 0..1000 {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
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

/// Runs `compare` (one round of 1 s, 4 connections, plus `extra`) on `conf` and checks that
/// it gives a verdict and leaves the directory `dir` byte-identical; returns the report.
fn compare_shape(dir: &std::path::Path, conf: &str, extra: &[&str]) -> String {
    let bench = env!("CARGO_BIN_EXE_shard-bench");
    let shard = std::path::Path::new(bench).with_file_name("shard");
    let t = Command::new(&shard)
        .arg("-t")
        .arg("-p")
        .arg(dir)
        .arg("-c")
        .arg(dir.join(conf))
        .output()
        .unwrap();
    // Valid as written; the one failure allowed is `-t` opening a log under the test's
    // never-created absolute paths, as `nginx -t` would (compare must not need them).
    let stderr = String::from_utf8_lossy(&t.stderr);
    assert!(
        t.status.success()
            || stderr
                .lines()
                .filter(|l| l.contains("[emerg]"))
                .all(|l| l.contains("open() \"/var/log/shard-compare-test-never")),
        "shard -t refuses the test's configuration: {}",
        stderr
    );
    let before = snapshot(dir);
    let text = stdout_of(
        Command::new(bench)
            .args([
                "compare",
                "--rounds",
                "1",
                "--duration",
                "1",
                "--connections",
                "4",
            ])
            .args(extra)
            .arg("-p")
            .arg(dir)
            .arg("-c")
            .arg(dir.join(conf)),
    );
    assert!(text.contains("| reuseport, steering on |"), "{text}");
    assert!(
        text.contains("Why (each line from the numbers above):"),
        "{text}"
    );
    assert!(text.contains("| 0 |"), "a strategy had errors: {text}");
    assert!(before == snapshot(dir), "compare changed {}", dir.display());
    text
}

fn shape_dir(tag: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("shard-bench-shape-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("html")).unwrap();
    std::fs::write(dir.join("html/index.html"), "hello\n").unwrap();
    dir
}

#[test]
fn compare_runs_configurations_in_the_shapes_people_write() {
    // One-line blocks.
    let dir = shape_dir("oneline");
    let port = free_port();
    std::fs::write(
        dir.join("one.conf"),
        format!("worker_processes 2; events {{ worker_connections 1024; }} http {{ access_log off; server {{ listen 127.0.0.1:{port}; root html; }} }}\n"),
    )
    .unwrap();
    let r = compare_shape(&dir, "one.conf", &[]);
    assert!(r.contains(&format!("Loaded 127.0.0.1:{port}")), "{r}");
    let _ = std::fs::remove_dir_all(&dir);

    // Debian-like: nginx.conf + conf.d/*.conf + sites-enabled/default, with `listen` only in
    // the site, write paths outside the prefix, and mime.types from the bundle.
    let dir = shape_dir("debian");
    let port = free_port();
    std::fs::create_dir_all(dir.join("conf.d")).unwrap();
    std::fs::create_dir_all(dir.join("sites-enabled")).unwrap();
    std::fs::write(
        dir.join("nginx.conf"),
        "worker_processes 2;\npid /run/shard-compare-test-never.pid;\nerror_log /var/log/shard-compare-test-never/error.log;\n\
         events {\n\tworker_connections 768;\n\t# multi_accept on;\n}\n\
         http {\n\tinclude mime.types;\n\tdefault_type application/octet-stream;\n\
         \taccess_log /var/log/shard-compare-test-never/access.log;\n\tinclude conf.d/*.conf;\n\tinclude sites-enabled/*;\n}\n",
    )
    .unwrap();
    std::fs::write(dir.join("conf.d/gzip.conf"), "gzip on;\n").unwrap();
    std::fs::write(
        dir.join("sites-enabled/default"),
        format!(
            "server {{\n\tlisten 127.0.0.1:{port} default_server;\n\tserver_name example.test www.example.test;\n\
             \troot {};\n\tindex index.html;\n\tlocation / {{\n\t}}\n}}\n",
            dir.join("html").display()
        ),
    )
    .unwrap();
    let r = compare_shape(&dir, "nginx.conf", &[]);
    assert!(r.contains("`Host: example.test`"), "{r}");
    assert!(!std::path::Path::new("/var/log/shard-compare-test-never").exists());
    assert!(!std::path::Path::new("/run/shard-compare-test-never.pid").exists());
    let _ = std::fs::remove_dir_all(&dir);

    // Comments, `default_server`, `backlog=`, a commented-out listen; two servers on two
    // ports, the second chosen with --listen; `include` with a glob.
    let dir = shape_dir("two");
    let (p1, p2) = (free_port(), free_port());
    std::fs::create_dir_all(dir.join("conf/servers")).unwrap();
    std::fs::write(
        dir.join("conf/main.conf"),
        "worker_processes 2; # two\nevents {\n    accept_mutex on; # will be switched\n}\nhttp {\n    access_log off;\n    include servers/*.conf;\n}\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("conf/servers/a.conf"),
        format!("server {{\n    # listen 80;\n    listen 127.0.0.1:{p1} default_server backlog=128; # first\n    server_name a.test;\n    root html;\n}}\n"),
    )
    .unwrap();
    std::fs::write(
        dir.join("conf/servers/b.conf"),
        format!("server {{\n    listen 127.0.0.1:{p2};\n    server_name b.test;\n    location / {{ return 200 \"b\"; }}\n}}\n"),
    )
    .unwrap();
    let r = compare_shape(&dir, "conf/main.conf", &["--listen", &p2.to_string()]);
    assert!(r.contains(&format!("Loaded 127.0.0.1:{p2}")), "{r}");
    assert!(r.contains("`Host: b.test`"), "{r}");
    assert!(
        r.contains(&format!("127.0.0.1:{p1}, 127.0.0.1:{p2}")),
        "{r}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn compare_says_why_it_cannot_measure_a_configuration() {
    let bench = env!("CARGO_BIN_EXE_shard-bench");
    let dir = shape_dir("cannot");
    for (conf, why) in [
        (
            "events {}\nstream { server { listen 127.0.0.1:1; proxy_pass 127.0.0.1:9; } }\n",
            "its only listeners are in stream {}",
        ),
        (
            "events {}\nhttp { server { listen 127.0.0.1:1 ssl; ssl_certificate c.pem; } }\n",
            "`listen ... ssl` (TLS), which shard does not serve yet",
        ),
        (
            "events {}\nhttp { server { listen unix:/tmp/x.sock; } }\n",
            "`listen unix:...`",
        ),
    ] {
        std::fs::write(dir.join("x.conf"), conf).unwrap();
        let before = snapshot(&dir);
        let out = Command::new(bench)
            .args(["compare", "--rounds", "1", "--duration", "1", "-c"])
            .arg(dir.join("x.conf"))
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        assert!(
            err.contains("compare cannot measure this configuration") && err.contains(why),
            "{err}"
        );
        // One sentence, not a stack of contexts.
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(before == snapshot(&dir));
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn soak_smoke_answers_every_kind_of_client_and_leaks_no_descriptor() {
    let bench = env!("CARGO_BIN_EXE_shard-bench");
    let text = stdout_of(Command::new(bench).args(["soak", "--smoke", "--workers", "2"]));
    assert!(text.contains("growth per 100k requests"), "{text}");
}

#[test]
fn bodies_smoke_measures_uploads_and_shard_leaves_no_temporary_file() {
    let bench = env!("CARGO_BIN_EXE_shard-bench");
    // In --smoke the bench itself fails unless every shard number was measured and no
    // temporary file was left after the runs, a worker SIGKILL and a reload.
    let text = stdout_of(Command::new(bench).args(["bodies", "--smoke", "--no-nginx"]));
    let row = text
        .lines()
        .find(|l| l.starts_with("| shard |"))
        .unwrap_or_else(|| panic!("{text}"));
    let cols: Vec<&str> = row.split('|').map(str::trim).collect();
    for i in [2, 3, 5] {
        assert!(cols[i].parse::<f64>().unwrap() > 0.0, "column {i}: {text}");
    }
    assert_eq!(&cols[7..10], ["0", "0", "0"], "{text}");
}

#[test]
fn load_with_a_host_header_benchmarks_a_name_based_virtual_host() {
    // A shard whose default server answers 404 and whose `b.test` answers 200.
    let dir = std::env::temp_dir().join(format!("shard-bench-vhost-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("logs")).unwrap();
    let port = free_port();
    std::fs::write(
        dir.join("shard.conf"),
        format!(
            "worker_processes 1;\nerror_log logs/error.log;\nevents {{}}\nhttp {{ access_log off;\n\
             server {{ listen 127.0.0.1:{port}; return 404; }}\n\
             server {{ listen 127.0.0.1:{port}; server_name b.test; return 200 \"b\"; }}\n}}\n"
        ),
    )
    .unwrap();
    let shard = std::path::Path::new(env!("CARGO_BIN_EXE_shard-bench")).with_file_name("shard");
    let mut child = Command::new(&shard)
        .args(["-g", "daemon off;"])
        .arg("-p")
        .arg(&dir)
        .arg("-c")
        .arg(dir.join("shard.conf"))
        .spawn()
        .expect("start shard");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(std::time::Instant::now() < deadline, "shard did not start");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let out = Command::new(env!("CARGO_BIN_EXE_shard-bench"))
        .args([
            "load",
            "-c",
            "2",
            "-n",
            "40",
            "--json",
            "-H",
            "Host: b.test",
        ])
        .arg(format!("http://127.0.0.1:{port}/"))
        .output()
        .unwrap();
    // SAFETY: plain kill(2) on our child.
    unsafe { libc::kill(child.id() as i32, libc::SIGQUIT) };
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("\"requests\":40,"), "{text}");
    assert!(text.contains("\"errors\":{\"total\":0,"), "{text}");
}

#[test]
fn experiment_with_nginx_auto_runs_nginx_beside_shard_when_installed() {
    let nginx = ["/usr/sbin/nginx", "/usr/bin/nginx", "/usr/local/sbin/nginx"]
        .iter()
        .any(|p| std::path::Path::new(p).is_file());
    if !nginx {
        println!(
            "SKIPPED: experiment --nginx auto: nginx is not installed (apt-get install nginx-light)"
        );
        return;
    }
    let bench = env!("CARGO_BIN_EXE_shard-bench");
    let out = std::env::temp_dir().join(format!("shard-bench-smoke-auto-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let res = Command::new(bench)
        .args([
            "experiment",
            "e1",
            "--smoke",
            "--workers",
            "2",
            "--nginx",
            "auto",
            "--out",
        ])
        .arg(&out)
        .output()
        .unwrap();
    assert!(
        res.status.success(),
        "{}",
        String::from_utf8_lossy(&res.stderr)
    );
    let report = std::fs::read_to_string(out.join("report.md")).unwrap();
    for strategy in ["accept_mutex on", "accept_mutex off", "reuseport"] {
        for server in ["shard", "nginx"] {
            // shard's reuseport rows say whether steering is on.
            let row = if server == "shard" && strategy == "reuseport" {
                "| shard | reuseport, steering on |".to_string()
            } else {
                format!("| {server} | {strategy} |")
            };
            assert!(report.contains(&row), "{row} missing: {report}");
        }
    }
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn the_fairness_script_runs_the_pipeliner_beside_ordinary_clients() {
    if Command::new("python3").arg("--version").output().is_err() {
        println!("SKIPPED: bench/fairness/run.sh: python3 is not installed");
        return;
    }
    let bench = env!("CARGO_BIN_EXE_shard-bench");
    let shard = std::path::Path::new(bench).with_file_name("shard");
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bench/fairness/run.sh");
    let text = stdout_of(
        Command::new("bash")
            .arg(&script)
            .arg(&shard)
            .arg("smoke")
            .env("FAIRNESS_SECONDS", "1")
            .env("SHARD_BENCH", bench),
    );
    assert!(text.contains("50 keep-alive clients for 1 s"), "{text}");
    assert!(text.contains("requests/s"), "{text}");
    assert!(text.contains("errors      0 "), "{text}");
    let hog: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("hog responses: "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("{text}"));
    assert!(hog > 0, "{text}");
}

#[test]
fn static_smoke_reports_syscalls_and_cpu_per_static_request() {
    let bench = env!("CARGO_BIN_EXE_shard-bench");
    let text = stdout_of(Command::new(bench).args(["static", "--smoke", "--no-nginx"]));
    let row = text
        .lines()
        .find(|l| l.starts_with("| 33 B | off | off | no |"))
        .unwrap_or_else(|| panic!("no 33 B row: {text}"));
    let cells: Vec<&str> = row.split('|').map(str::trim).collect();
    // CPU µs per request and requests/s are measured.
    assert!(cells[7].parse::<f64>().unwrap() > 0.0, "{row}");
    assert!(cells[10].parse::<f64>().unwrap() > 0.0, "{row}");
    let wrk = ["/usr/bin/wrk", "/usr/local/bin/wrk"]
        .iter()
        .any(|p| std::path::Path::new(p).is_file());
    if wrk {
        assert!(text.contains("| 10 per write |"), "{text}");
    } else {
        println!("SKIPPED: the pipelined static rows: wrk is not installed (apt-get install wrk)");
        assert!(text.contains("pipelined cases skipped"), "{text}");
    }
}

#[test]
fn reload_smoke_fails_no_request_and_breaks_no_tunnel_for_shard() {
    let bench = env!("CARGO_BIN_EXE_shard-bench");
    // In --smoke the bench itself fails unless shard answered every request and kept every
    // tunnel across the reloads and the binary upgrade.
    let text = stdout_of(Command::new(bench).args(["reload", "--smoke", "--no-nginx"]));
    let row = |name: &str| -> Vec<String> {
        text.lines()
            .find(|l| l.starts_with(&format!("| {name} |")))
            .unwrap_or_else(|| panic!("no {name} row: {text}"))
            .split('|')
            .map(|c| c.trim().to_string())
            .collect()
    };
    let shard = row("shard");
    assert!(shard[2].parse::<u64>().unwrap() > 0, "{text}");
    assert_eq!((shard[3].as_str(), shard[7].as_str()), ("0", "0"), "{text}");
    assert!(shard[6].parse::<u64>().unwrap() > 0, "{text}");
    // The control row (nginx's behaviour) ran too; its failures are timing, not checked.
    assert!(
        row("shard, worker_shutdown_drain off")[2]
            .parse::<u64>()
            .unwrap()
            > 0
    );
}

#[test]
fn tls_smoke_measures_handshakes_resumption_and_bulk_for_shard() {
    let bench = env!("CARGO_BIN_EXE_shard-bench");
    // In --smoke the bench fails unless full, resumed (with tickets) and bulk were measured.
    let text = stdout_of(Command::new(bench).args(["tls", "--smoke", "--no-nginx", "--e3"]));
    // A row per protocol; bulk (columns 8 and 9) is measured on TLS 1.3 only.
    for (proto, numbered) in [
        ("TLSv1.3", &[3, 4, 5, 7, 8, 9][..]),
        ("TLSv1.2", &[3, 4, 5, 7]),
    ] {
        let row = text
            .lines()
            .find(|l| l.starts_with(&format!("| shard | {proto} |")))
            .unwrap_or_else(|| panic!("{proto}: {text}"));
        let cols: Vec<&str> = row.split('|').map(str::trim).collect();
        for &i in numbered {
            assert!(
                cols[i].parse::<f64>().unwrap() > 0.0,
                "{proto} column {i}: {text}"
            );
        }
        assert_eq!(cols[6], "1.00", "every connection resumed: {text}");
    }
    // --e3: a latency row per accept strategy, with handshakes counted.
    let e3: Vec<&str> = text
        .lines()
        .filter(|l| {
            l.starts_with("| shard | ") && (l.contains("reuseport") || l.contains("shared socket"))
        })
        .collect();
    assert_eq!(e3.len(), 3, "{text}");
    for row in e3 {
        let c: Vec<&str> = row.split('|').map(str::trim).collect();
        assert!(c[3].parse::<u64>().unwrap() > 0, "{row}");
    }
}

#[test]
fn the_callgrind_script_counts_instructions_per_static_response() {
    let have = |tool: &str| {
        Command::new(tool)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if !have("valgrind") || !have("python3") {
        println!(
            "SKIPPED: bench/callgrind/static.sh: valgrind or python3 is not installed \
             (apt-get install valgrind python3)"
        );
        return;
    }
    let bench = env!("CARGO_BIN_EXE_shard-bench");
    let shard = std::path::Path::new(bench).with_file_name("shard");
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bench/callgrind/static.sh");
    let port = free_port();
    // nginx is left out (a path that is not there): the script must say so.
    let text = stdout_of(
        Command::new("bash")
            .arg(&script)
            .arg(&shard)
            .arg("/nonexistent/nginx")
            .env("PORT", port.to_string())
            .env("LOW", "2")
            .env("HIGH", "6"),
    );
    for cache in ["on", "off"] {
        let n: u64 = text
            .lines()
            .find_map(|l| l.strip_prefix(&format!("shard open_file_cache {cache}: ")))
            .and_then(|l| l.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{text}"));
        // A debug build: many more than a release build's ~12k, but never none.
        assert!(n > 1000, "{text}");
    }
    assert!(text.contains("SKIPPED nginx"), "{text}");
}

/// Runs `bench/callgrind/SCRIPT` with a tiny count against the debug shard (nginx left out,
/// loudly) and returns the instructions it reports after `shard front: `; `None` (said
/// loudly) without valgrind or python3.
fn callgrind_front(script: &str) -> Option<u64> {
    let have = |tool: &str| {
        Command::new(tool)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if !have("valgrind") || !have("python3") {
        println!(
            "SKIPPED: bench/callgrind/{script}: valgrind or python3 is not installed \
             (apt-get install valgrind python3)"
        );
        return None;
    }
    let bench = env!("CARGO_BIN_EXE_shard-bench");
    let shard = std::path::Path::new(bench).with_file_name("shard");
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../bench/callgrind")
        .join(script);
    let text = stdout_of(
        Command::new("bash")
            .arg(&path)
            .arg(&shard)
            .arg("/nonexistent/nginx")
            .env("PORT", free_port().to_string())
            .env("BPORT", free_port().to_string())
            .env("LOW", "2")
            .env("HIGH", "6"),
    );
    assert!(text.contains("SKIPPED nginx"), "{text}");
    let n = text
        .lines()
        .find_map(|l| l.strip_prefix("shard front: "))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{text}"));
    Some(n)
}

#[test]
fn the_callgrind_script_counts_instructions_per_proxied_request() {
    // A debug build: many more than a release build's ~22k, but never none.
    if let Some(n) = callgrind_front("proxy.sh") {
        assert!(n > 1000, "{n}");
    }
}

#[test]
fn the_callgrind_script_counts_instructions_per_cache_hit() {
    // A debug build: many more than a release build's ~23k, but never none.
    if let Some(n) = callgrind_front("cache.sh") {
        assert!(n > 1000, "{n}");
    }
}

#[test]
fn routing_smoke_checks_every_entry_and_reports_cpu_and_load_costs() {
    let bench = env!("CARGO_BIN_EXE_shard-bench");
    // The bench itself fails when a server answers a row's request with the wrong entry.
    let text = stdout_of(Command::new(bench).args(["routing", "--smoke", "--no-nginx"]));
    for conf in ["10 servers", "10 locations", "map of 10 keys"] {
        for what in ["first", "middle", "last", "unknown"] {
            let row = text
                .lines()
                .find(|l| l.starts_with(&format!("| {conf} | {what} |")))
                .unwrap_or_else(|| panic!("no {conf} {what} row: {text}"));
            let cells: Vec<&str> = row.split('|').map(str::trim).collect();
            assert!(cells[3].parse::<f64>().unwrap() > 0.0, "{row}");
        }
        let row = text
            .lines()
            .rfind(|l| l.starts_with(&format!("| {conf} |")))
            .unwrap();
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        // -t time, reload time and worker RSS are measured.
        assert!(cells[2].parse::<f64>().unwrap() > 0.0, "{row}");
        assert!(cells[4].parse::<f64>().unwrap() > 0.0, "{row}");
        assert!(cells[6].parse::<f64>().unwrap() > 0.0, "{row}");
    }
}

#[test]
fn fastcgi_smoke_measures_the_front_of_a_php_fpm_pool_for_shard() {
    let bench = env!("CARGO_BIN_EXE_shard-bench");
    let text = stdout_of(Command::new(bench).args([
        "fastcgi",
        "--smoke",
        "--workers",
        "2",
        "--no-nginx",
        "--builtin-load",
    ]));
    if text.contains("SKIPPED: php-fpm is not installed") {
        println!(
            "SKIPPED: shard-bench fastcgi: php-fpm is not installed (apt-get install php-fpm)"
        );
        return;
    }
    let row = text
        .lines()
        .find(|l| l.starts_with("| shard |"))
        .unwrap_or_else(|| panic!("{text}"));
    let cols: Vec<&str> = row.split('|').map(str::trim).collect();
    let num = |i: usize| -> f64 {
        cols[i]
            .parse()
            .unwrap_or_else(|_| panic!("column {i} not measured: {text}"))
    };
    assert!(num(2) > 0.0, "{text}");
    if strace_installed() {
        assert!(num(3) > 0.0, "{text}");
    }
    assert!(num(4) > 0.0, "{text}");
}

#[test]
fn h2_smoke_measures_every_row_and_the_idle_memory_for_shard() {
    let h2load = ["/usr/bin/h2load", "/usr/local/bin/h2load"]
        .iter()
        .any(|p| std::path::Path::new(p).is_file());
    if !h2load {
        println!(
            "SKIPPED: shard-bench h2: h2load is not installed (apt-get install nghttp2-client)"
        );
        return;
    }
    let bench = env!("CARGO_BIN_EXE_shard-bench");
    // In --smoke the bench fails unless every shard row served requests without a failure
    // and the idle memory was measured.
    let text = stdout_of(Command::new(bench).args(["h2", "--smoke", "--no-nginx"]));
    for row in [
        "h2c, return 200",
        "h2c, 16 KiB file",
        "h2c, proxy",
        "TLS, return 200",
        "TLS, 16 KiB file",
        "TLS, proxy",
    ] {
        let line = text
            .lines()
            .find(|l| l.starts_with(&format!("| shard | {row} |")))
            .unwrap_or_else(|| panic!("{row}: {text}"));
        let cols: Vec<&str> = line.split('|').map(str::trim).collect();
        assert!(cols[3].parse::<u64>().unwrap() > 0, "{line}");
        assert_eq!(cols[4], "0", "{line}");
    }
    assert!(text.contains("Memory per idle HTTP/2 connection"), "{text}");
}

#[test]
fn h3_smoke_measures_http3_beside_http2_and_the_idle_memory() {
    let bench = env!("CARGO_BIN_EXE_shard-bench");
    let text = stdout_of(Command::new(bench).args(["h3", "--smoke"]));
    let row = text
        .lines()
        .find(|l| l.starts_with("| HTTP/3 |"))
        .unwrap_or_else(|| panic!("{text}"));
    let cols: Vec<&str> = row.split('|').map(str::trim).collect();
    assert!(cols[2].parse::<u64>().unwrap() > 0, "{text}");
    assert_eq!(cols[3], "0", "no HTTP/3 request failed: {text}");
    assert!(cols[6].parse::<f64>().unwrap() > 0.0, "{text}");
    if text.contains("h2load not found") {
        println!("SKIPPED: h3 smoke's HTTP/2 row: h2load is not installed (apt-get install nghttp2-client)");
    } else {
        let h2 = text
            .lines()
            .find(|l| l.starts_with("| HTTP/2 (h2load) |"))
            .unwrap_or_else(|| panic!("{text}"));
        let cols: Vec<&str> = h2.split('|').map(str::trim).collect();
        assert!(cols[2].parse::<u64>().unwrap() > 0, "{text}");
        assert_eq!(cols[3], "0", "{text}");
    }
    assert!(
        text.contains("Workers' memory per idle QUIC connection"),
        "{text}"
    );
}
