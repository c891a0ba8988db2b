//! What an operator's tools see: log files across rotation, reopen, reload and a worker's
//! death; counters across reloads; the Prometheus exposition; requests refused before they
//! were parsed in the access log; nginx's error-log fields.

mod support;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::path::Path;
use std::time::Duration;

use support::*;

const TIMEOUT: Duration = Duration::from_secs(10);

fn conf(workers: usize) -> String {
    format!(
        "worker_processes {workers};\n\
         error_log logs/error.log info;\n\
         pid logs/shard.pid;\n\
         events {{ worker_connections 256; }}\n\
         http {{\n\
         access_log logs/access.log;\n\
         server {{\n\
         listen 127.0.0.1:{{port}};\n\
         location = /status {{ shard_status; }}\n\
         location = /stub {{ stub_status; }}\n\
         location / {{ return 200 \"ok\"; }}\n\
         }}\n\
         }}\n"
    )
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_default()
}

/// Each `/r/<tag>-<n>` request line in `text`, with how many times it appears.
fn tagged(text: &str, tag: &str) -> HashMap<u64, usize> {
    let mut m = HashMap::new();
    let pat = format!("GET /r/{tag}-");
    for line in text.lines() {
        if let Some(i) = line.find(&pat) {
            let n: u64 = line[i + pat.len()..]
                .split(' ')
                .next()
                .unwrap()
                .parse()
                .unwrap();
            *m.entry(n).or_insert(0) += 1;
        }
    }
    m
}

/// Sends `n` requests `/r/<tag>-<i>`, each on its own connection.
fn send(s: &Server, tag: &str, n: u64) {
    for i in 0..n {
        let r = get(s.addr(), &format!("/r/{tag}-{i}"));
        assert_eq!(r.status, 200);
    }
}

/// Waits until every request of batch `tag` is in `file`, once each.
fn wait_logged(file: &Path, tag: &str, n: u64) {
    wait_for(
        TIMEOUT,
        &format!("batch {tag} in {}", file.display()),
        || {
            let m = tagged(&read(file), tag);
            (m.len() as u64 == n && m.values().all(|&c| c == 1)).then_some(())
        },
    );
}

#[test]
fn no_access_log_line_is_lost_across_rotate_reopen_reload_and_a_killed_worker() {
    let s = Server::start("ops-rotate", &conf(2), 2);
    let log = s.dir.join("logs/access.log");
    let rotated = s.dir.join("logs/access.log.1");
    send(&s, "a", 50);
    wait_logged(&log, "a", 50);

    // logrotate: rename, then `shard -s reopen`.
    std::fs::rename(&log, &rotated).unwrap();
    let conf_path = s.dir.join("conf/shard.conf");
    let (code, err) = run_cli(&[
        "-p",
        s.dir.to_str().unwrap(),
        "-c",
        conf_path.to_str().unwrap(),
        "-s",
        "reopen",
    ]);
    assert_eq!(code, 0, "{err}");
    wait_for(TIMEOUT, "the new access.log", || log.exists().then_some(()));
    // The workers reopen on USR1 too; what they had buffered went to the rotated file first.
    wait_for(TIMEOUT, "the workers to reopen", || {
        let err = read(&s.dir.join("logs/error.log"));
        (err.matches(": reopening logs").count() >= 2).then_some(())
    });
    send(&s, "b", 50);
    wait_logged(&log, "b", 50);

    // A reload: the new generation writes to the new file.
    let old = s.workers();
    s.signal(libc::SIGHUP);
    wait_for(TIMEOUT, "the new generation", || {
        let now = s.workers();
        (now.len() == 2 && now.iter().all(|w| old.iter().all(|o| o.pid != w.pid))).then_some(())
    });
    send(&s, "c", 50);
    wait_logged(&log, "c", 50);

    // A worker killed: its replacement writes to the new file too.
    let victim = s.workers()[0].pid as i32;
    unsafe { libc::kill(victim, libc::SIGKILL) };
    wait_for(TIMEOUT, "the replacement worker", || {
        let ws = s.workers();
        (ws.len() == 2
            && ws
                .iter()
                .all(|w| w.pid as i32 != victim && w.pid > 0 && pid_alive(w.pid as i32)))
        .then_some(())
    });
    send(&s, "d", 50);
    wait_logged(&log, "d", 50);

    // Nothing of b, c, d went to the rotated file; a is whole there.
    let old_text = read(&rotated);
    for tag in ["b", "c", "d"] {
        assert!(
            tagged(&old_text, tag).is_empty(),
            "{tag} in the rotated file"
        );
    }
    let a = tagged(&old_text, "a");
    assert!(a.len() == 50 && a.values().all(|&c| c == 1));
    // The error log was reopened too.
    assert!(s.dir.join("logs/error.log").exists());
    let _ = std::io::stdout().flush();
}

/// A raw request on a new connection; the whole answer.
fn raw_answer(s: &Server, req: &[u8]) -> String {
    let mut c = connect(s.addr());
    c.write_all(req).unwrap();
    let mut v = Vec::new();
    let _ = c.read_to_end(&mut v);
    String::from_utf8_lossy(&v).into_owned()
}

#[test]
fn refused_requests_reach_the_access_log_as_nginx_logs_them() {
    let s = Server::start("ops-refused", &conf(1), 1);
    let long = format!("GET /{} HTTP/1.1\r\nHost: a\r\n\r\n", "x".repeat(9000));
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (b"GET /a b c\r\n\r\n".to_vec(), "400"),
        (long.into_bytes(), "414"),
        (b"GET / HTTP/2.0\r\nHost: a\r\n\r\n".to_vec(), "505"),
        (
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\n\r\n".to_vec(),
            "501",
        ),
    ];
    for (req, status) in &cases {
        let answer = raw_answer(&s, req);
        assert!(
            answer.starts_with(&format!("HTTP/1.1 {status}")),
            "{status}: {answer}"
        );
    }
    let log = s.dir.join("logs/access.log");
    let text = wait_for(TIMEOUT, "the refused requests' lines", || {
        let t = read(&log);
        cases
            .iter()
            .all(|(_, st)| t.contains(&format!("\" {st} ")))
            .then_some(t)
    });
    // nginx's shape: the request line as far as it was read, the status, the bytes sent.
    assert!(text.contains("\"GET /a b c\" 400 "), "{text}");
    assert!(text.contains("\"GET / HTTP/2.0\" 505 "), "{text}");
}

#[test]
fn error_log_lines_carry_nginx_connection_number_and_context() {
    let s = Server::start(
        "ops-errlog",
        &conf(1).replace(
            "location / {",
            "location = /missing { root html; }\n location / {",
        ),
        1,
    );
    let _ = raw_answer(&s, b"GET /a b c\r\n\r\n");
    let r = raw(
        s.addr(),
        b"GET /missing HTTP/1.1\r\nHost: example.test\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(r.status, 404);
    let log = s.dir.join("logs/error.log");
    let text = wait_for(TIMEOUT, "both error-log lines", || {
        let t = read(&log);
        (t.contains("while reading client request line") && t.contains("/html/missing\" failed"))
            .then_some(t)
    });
    let line = |needle: &str| -> String {
        text.lines()
            .find(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("{needle}: {text}"))
            .to_string()
    };
    // `... [info] PID#0: *N client sent ... while reading client request line, client: ADDR,
    // server: NAME, request: "LINE"`: fail2ban's and nginx's parsers read these fields.
    let bad = line("while reading client request line");
    let after_pid = bad.split("#0: ").nth(1).unwrap();
    assert!(after_pid.starts_with('*'), "{bad}");
    let n: u64 = after_pid[1..].split(' ').next().unwrap().parse().unwrap();
    assert!(n >= 1, "{bad}");
    assert!(
        bad.contains("[info]") && bad.contains(" client sent "),
        "{bad}"
    );
    assert!(
        bad.ends_with(", client: 127.0.0.1, server: , request: \"GET /a b c\""),
        "{bad}"
    );
    let missing = line("/html/missing\" failed");
    assert!(
        missing.contains("[error]") && missing.contains("#0: *"),
        "{missing}"
    );
    assert!(
        missing.ends_with(
            "failed (2: No such file or directory), client: 127.0.0.1, server: , \
             request: \"GET /missing HTTP/1.1\", host: \"example.test\""
        ),
        "{missing}"
    );
    // Connection numbers grow from one connection to the next.
    let m: u64 = missing
        .split("#0: *")
        .nth(1)
        .unwrap()
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(m > n, "{bad}\n{missing}");
}

/// The Prometheus exposition, parsed: every sample line must parse (none skipped), every
/// family has its HELP, and no series repeats. Returns `(metric{sorted labels}, value)`.
fn scrape(s: &Server) -> Vec<(String, f64)> {
    let text = get(s.addr(), "/status?format=prometheus").body_str();
    let parsed = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string())))
        .unwrap_or_else(|e| panic!("{e}: {text}"));
    let sample_lines = text
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .count();
    assert_eq!(
        parsed.samples.len(),
        sample_lines,
        "a line did not parse: {text}"
    );
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::new();
    for sm in &parsed.samples {
        assert!(
            parsed.docs.contains_key(&sm.metric),
            "no HELP for {}",
            sm.metric
        );
        let mut labels: Vec<String> = sm.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        labels.sort();
        let key = format!("{}{{{}}}", sm.metric, labels.join(","));
        assert!(seen.insert(key.clone()), "duplicate series {key}");
        let v = match sm.value {
            prometheus_parse::Value::Counter(v) => {
                assert!(sm.metric.ends_with("_total"), "{key} is a counter");
                v
            }
            prometheus_parse::Value::Gauge(v) => {
                assert!(!sm.metric.ends_with("_total"), "{key} is a gauge");
                v
            }
            _ => panic!("{key}: untyped"),
        };
        if sm.metric != "shard_worker_info" {
            assert!(sm.labels.get("pid").is_none(), "{key}: no series by pid");
        }
        out.push((key, v));
    }
    out
}

fn stub_numbers(s: &Server) -> [u64; 3] {
    let body = get(s.addr(), "/stub").body_str();
    let line = body.lines().nth(2).unwrap();
    let v: Vec<u64> = line
        .split_whitespace()
        .map(|n| n.parse().unwrap())
        .collect();
    [v[0], v[1], v[2]]
}

#[test]
fn counters_only_grow_across_ten_reloads_and_series_do_not_churn() {
    let s = Server::start("ops-counters", &conf(2), 2);
    send(&s, "w", 20);
    let series = |sc: &[(String, f64)]| -> Vec<String> {
        let mut v: Vec<String> = sc
            .iter()
            .map(|(k, _)| k.clone())
            .filter(|k| !k.starts_with("shard_worker_info") && !k.starts_with("shard_old_worker"))
            .collect();
        v.sort();
        v
    };
    let first = scrape(&s);
    let mut last_stub = stub_numbers(&s);
    let mut last: HashMap<String, f64> = first.iter().cloned().collect();
    let mut pids = std::collections::HashSet::new();
    for g in 2..=11u64 {
        let old = s.workers();
        s.signal(libc::SIGHUP);
        wait_for(TIMEOUT, &format!("generation {g}"), || {
            let now = s.workers();
            (now.len() == 2 && now.iter().all(|w| old.iter().all(|o| o.pid != w.pid))).then_some(())
        });
        send(&s, "w", 5);
        let stub = stub_numbers(&s);
        for i in 0..3 {
            assert!(
                stub[i] >= last_stub[i],
                "stub_status went back: {last_stub:?} -> {stub:?}"
            );
        }
        last_stub = stub;
        let now = scrape(&s);
        assert_eq!(series(&now), series(&first), "series changed at reload {g}");
        for (k, v) in &now {
            if k.contains("_total") {
                assert!(
                    *v >= last[k],
                    "{k} went back at reload {g}: {} -> {v}",
                    last[k]
                );
            }
        }
        for (k, _) in now
            .iter()
            .filter(|(k, _)| k.starts_with("shard_worker_info"))
        {
            pids.insert(k.clone());
        }
        last = now.into_iter().collect();
    }
    // 20 + 10 x 5 requests of ours, plus the status reads: all counted.
    assert!(last_stub[2] >= 70, "{last_stub:?}");
    assert!(last["shard_requests_total{}"] >= 70.0);
    // The info metric followed the processes.
    assert!(pids.len() >= 20, "{pids:?}");
}

#[test]
fn a_master_whose_workers_cannot_run_exits_non_zero_and_releases_the_port() {
    for (how, says) in [
        ("1", "no worker process of generation 1 could run: exiting"),
        // Workers that crash before they start are retried with a growing delay (about 11 s
        // up to 5 s apart), then the master gives up too.
        (
            "crash",
            "no worker process of generation 1 could start: exiting",
        ),
    ] {
        master_gives_up(how, says);
    }
}

fn master_gives_up(how: &str, says: &str) {
    let dir = temp_dir("ops-fatal");
    let port = free_port();
    std::fs::write(
        dir.join("conf/shard.conf"),
        conf(2).replace("{port}", &port.to_string()),
    )
    .unwrap();
    let mut child = std::process::Command::new(BIN)
        .args(["-g", "daemon off;"])
        .arg("-p")
        .arg(&*dir)
        .args(["-c", "conf/shard.conf"])
        .env("SHARD_TEST_FAIL_WORKER_START", how)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let status = wait_for(Duration::from_secs(30), "the master to give up", || {
        child.try_wait().unwrap()
    });
    assert_eq!(status.code(), Some(1));
    let log = read(&dir.join("logs/error.log"));
    assert!(log.contains(says), "{log}");
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
        "nobody holds the port any more"
    );
}

fn cmdline(pid: i32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| {
            String::from_utf8_lossy(&b)
                .trim_end_matches('\0')
                .replace('\0', " ")
        })
        .unwrap_or_default()
}

fn ppid(pid: i32) -> i32 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    stat.rsplit(')')
        .next()
        .and_then(|r| r.split_whitespace().nth(1))
        .and_then(|p| p.parse().ok())
        .unwrap_or(0)
}

#[test]
fn daemon_by_default_with_the_default_pid_file_and_nginx_process_titles() {
    let dir = temp_dir("ops-daemon");
    let port = free_port();
    // No `daemon`, no `pid`: nginx's defaults, `daemon on` and `logs/<name>.pid`.
    let text = conf(2)
        .replace("pid logs/shard.pid;\n", "")
        .replace("{port}", &port.to_string());
    std::fs::write(dir.join("conf/shard.conf"), text).unwrap();
    let conf_path = dir.join("conf/shard.conf");
    let args = [
        "-p",
        dir.to_str().unwrap(),
        "-c",
        conf_path.to_str().unwrap(),
    ];
    let out = std::process::Command::new(BIN)
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    // The command returns once the daemon runs, as nginx's.
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let pid_file = dir.join("logs/shard.pid");
    let master: i32 = wait_for(TIMEOUT, "the default pid file", || {
        read(&pid_file).trim().parse().ok()
    });
    assert!(pid_alive(master));
    assert_ne!(
        ppid(master),
        std::process::id() as i32,
        "detached from its starter"
    );
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let ws = wait_for(TIMEOUT, "the workers", || {
        let ws = parse_workers(&try_get(addr, "/status").ok()?.body_str());
        (ws.len() == 2 && ws.iter().all(|w| w.pid > 0)).then_some(ws)
    });
    // `ps` tells them apart, as nginx's titles.
    let title = cmdline(master);
    assert!(
        title.starts_with("shard: master process ") && title.contains("-c "),
        "{title:?}"
    );
    for w in &ws {
        assert_eq!(cmdline(w.pid as i32), "shard: worker process");
    }
    // `-s reload` and `-s quit` find it through the default pid file.
    let (code, err) = run_cli(&[args[0], args[1], args[2], args[3], "-s", "reload"]);
    assert_eq!(code, 0, "{err}");
    wait_for(TIMEOUT, "new workers", || {
        let now = parse_workers(&try_get(addr, "/status").ok()?.body_str());
        (now.len() == 2 && now.iter().all(|n| ws.iter().all(|o| o.pid != n.pid))).then_some(())
    });
    let (code, err) = run_cli(&[args[0], args[1], args[2], args[3], "-s", "quit"]);
    assert_eq!(code, 0, "{err}");
    wait_for(TIMEOUT, "the daemon to exit", || {
        (!pid_alive(master)).then_some(())
    });
    assert!(!pid_file.exists(), "the pid file is removed at exit");
}

#[test]
fn master_process_off_serves_from_the_one_process() {
    let dir = temp_dir("ops-single");
    let port = free_port();
    std::fs::write(
        dir.join("conf/shard.conf"),
        conf(4).replace("{port}", &port.to_string()),
    )
    .unwrap();
    // Both directives from the command line, as Docker users type them.
    let mut child = std::process::Command::new(BIN)
        .args(["-g", "daemon off; master_process off;"])
        .arg("-p")
        .arg(&*dir)
        .args(["-c", "conf/shard.conf"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let r = wait_for(TIMEOUT, "the single process to answer", || {
        try_get(addr, "/x").ok()
    });
    assert_eq!((r.status, r.body_str().as_str()), (200, "ok"));
    let pid = child.id() as i32;
    let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap();
    assert!(
        children.trim().is_empty(),
        "no worker processes: {children:?}"
    );
    // One worker, whatever `worker_processes` says.
    assert_eq!(parse_workers(&get(addr, "/status").body_str()).len(), 1);
    unsafe { libc::kill(pid, libc::SIGQUIT) };
    let st = wait_for(TIMEOUT, "the process to exit", || child.try_wait().unwrap());
    assert_eq!(st.code(), Some(0));
}

#[test]
fn counters_go_on_across_a_binary_upgrade() {
    let mut s = Server::start("ops-upgrade-counters", &conf(2), 2);
    send(&s, "u", 30);
    let before = stub_numbers(&s);
    let old = s.pid();
    let pid_file = s.dir.join("logs/shard.pid");
    unsafe { libc::kill(old, libc::SIGUSR2) };
    let new: i32 = wait_for(TIMEOUT, "the new master", || {
        let p: i32 = read(&pid_file).trim().parse().ok()?;
        (p != old && pid_alive(p)).then_some(p)
    });
    unsafe { libc::kill(old, libc::SIGWINCH) };
    unsafe { libc::kill(old, libc::SIGQUIT) };
    assert_eq!(s.wait_exit(TIMEOUT), 0);
    // Only the new master's workers answer now; its counters start from the old totals.
    let after = stub_numbers(&s);
    for i in 0..3 {
        assert!(after[i] >= before[i], "{before:?} -> {after:?}");
    }
    unsafe { libc::kill(new, libc::SIGQUIT) };
    wait_for(TIMEOUT, "the new master to exit", || {
        (!pid_alive(new)).then_some(())
    });
}

/// A line of `/proc/PID/FILE` that starts with `key`, the rest trimmed.
fn proc_field(pid: u64, file: &str, key: &str) -> String {
    let text = std::fs::read_to_string(format!("/proc/{pid}/{file}")).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(key))
        .unwrap_or_else(|| panic!("no {key} in /proc/{pid}/{file}: {text}"))
        .trim()
        .to_string()
}

#[test]
fn worker_priority_affinity_core_limit_and_working_directory_reach_the_workers() {
    let online = std::thread::available_parallelism().map_or(1, |n| n.get());
    let conf = conf(2).replace(
        "pid logs/shard.pid;\n",
        "pid logs/shard.pid;\n\
         worker_priority 5;\n\
         worker_cpu_affinity auto;\n\
         worker_rlimit_core 10m;\n\
         working_directory {dir}/logs;\n\
         timer_resolution 100ms;\n\
         lock_file logs/shard.lock;\n",
    );
    let mut s = Server::start("ops-worker-settings", &conf, 2);
    let ws = s.wait_workers(2);
    let mut cpus = Vec::new();
    for w in &ws {
        // Field 19 of /proc/PID/stat is the nice value (after the parenthesised name).
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", w.pid)).unwrap();
        let after = &stat[stat.rfind(')').unwrap() + 2..];
        let nice: i32 = after.split(' ').nth(16).unwrap().parse().unwrap();
        assert_eq!(nice, 5, "worker {} nice", w.idx);
        let core = proc_field(w.pid, "limits", "Max core file size");
        assert!(
            core.starts_with("10485760"),
            "worker {} core limit {core}",
            w.idx
        );
        let cwd = std::fs::read_link(format!("/proc/{}/cwd", w.pid)).unwrap();
        assert!(
            cwd.ends_with("logs"),
            "worker {} cwd {}",
            w.idx,
            cwd.display()
        );
        cpus.push((w.idx, proc_field(w.pid, "status", "Cpus_allowed_list:")));
    }
    cpus.sort();
    // `auto`: worker N on the Nth CPU, wrapping.
    for (idx, list) in cpus {
        assert_eq!(list, (idx % online).to_string(), "worker {idx} cpus");
    }
    // The master keeps its own.
    let master_nice = std::fs::read_to_string(format!("/proc/{}/stat", s.pid())).unwrap();
    let after = &master_nice[master_nice.rfind(')').unwrap() + 2..];
    assert_eq!(after.split(' ').nth(16).unwrap(), "0");
    s.signal(libc::SIGQUIT);
    assert_eq!(s.wait_exit(TIMEOUT), 0);
}

/// `syslog:` for both logs: one RFC 3164 datagram per line to a loopback receiver, with
/// nginx's priorities (facility `local7` by default, the error line's level as severity, the
/// access log's `info` unless `severity=`), tag and host name.
#[test]
fn syslog_receives_error_and_access_lines() {
    let rx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    rx.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let port = rx.local_addr().unwrap().port();
    let conf = format!(
        "worker_processes 1;\n\
         error_log syslog:server=127.0.0.1:{port},tag=shardtest,severity=alert notice;\n\
         events {{}}\nhttp {{\n \
         log_format tiny \"$request_method $uri $status\";\n \
         server {{\n  listen 127.0.0.1:{{port}};\n  \
         location = /status {{ shard_status; }}\n  \
         location / {{ access_log syslog:server=127.0.0.1:{port},facility=local0,severity=notice,nohostname tiny; \
         return 200 ok; }}\n }}\n}}\n"
    );
    let mut s = Server::start("syslog", &conf, 1);
    assert_eq!(get(s.addr(), "/hello").status, 200);
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .unwrap_or_default()
        .trim()
        .to_string();
    let mut got = Vec::new();
    let mut buf = [0u8; 2048];
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !got.iter().any(|m: &String| m.contains("GET /hello 200")) {
        assert!(
            std::time::Instant::now() < deadline,
            "no access line: {got:#?}"
        );
        let n = rx.recv(&mut buf).expect("a syslog datagram");
        got.push(String::from_utf8_lossy(&buf[..n]).into_owned());
    }
    // local0 (16) * 8 + notice (5) = 133; no host name.
    let access = got.iter().find(|m| m.contains("GET /hello 200")).unwrap();
    assert!(access.starts_with("<133>"), "{access}");
    assert!(access.ends_with(" nginx: GET /hello 200"), "{access}");
    assert!(
        !access.contains(&format!(" {host} ")) || host.is_empty(),
        "{access}"
    );
    // The master's notice lines: local7 (23) * 8 + notice (5) = 189, host and tag (an
    // error log's `severity=` is not read, as nginx).
    let notice = got
        .iter()
        .find(|m| m.contains("[notice]"))
        .unwrap_or_else(|| panic!("no error log line: {got:#?}"));
    assert!(notice.starts_with("<189>"), "{notice}");
    assert!(notice.contains(&format!(" {host} shardtest: ")), "{notice}");
    s.signal(libc::SIGQUIT);
    assert_eq!(s.wait_exit(TIMEOUT), 0);
}

/// `access_log ... gzip`: the file is gzip members `zcat` reads whole, written when the
/// buffer fills, at the periodic flush, and at exit.
#[test]
fn access_log_gzip_writes_gzip_members() {
    let conf = "worker_processes 1;\nevents {}\nhttp {\n \
         server {\n  listen 127.0.0.1:{port};\n  \
         location = /status { shard_status; }\n  \
         location / { access_log logs/access.log.gz combined gzip=6 flush=1s; return 200 ok; }\n }\n}\n";
    let mut s = Server::start("access-gzip", conf, 1);
    for i in 0..50 {
        assert_eq!(get(s.addr(), &format!("/line-{i}")).status, 200);
    }
    s.signal(libc::SIGQUIT);
    assert_eq!(s.wait_exit(TIMEOUT), 0);
    let gz = std::fs::read(s.dir.join("logs/access.log.gz")).unwrap();
    assert_eq!(&gz[..2], &[0x1f, 0x8b], "a gzip stream");
    let mut text = String::new();
    flate2::read::MultiGzDecoder::new(&gz[..])
        .read_to_string(&mut text)
        .unwrap();
    for i in 0..50 {
        assert!(
            text.contains(&format!("GET /line-{i} HTTP/1.1\" 200")),
            "{text}"
        );
    }
    assert_eq!(text.lines().count(), 50);
}

/// Several `error_log`s in the main context: each is written at its own level, as nginx
/// writes every one of them, and each is reopened by `SIGUSR1`.
#[test]
fn every_main_error_log_is_written_at_its_level() {
    let conf = "worker_processes 1;\n\
         error_log logs/error.log info;\n\
         error_log logs/errors-only.log error;\n\
         events {}\nhttp {\n server {\n  listen 127.0.0.1:{port};\n  \
         location = /status { shard_status; }\n }\n}\n";
    let mut s = Server::start("several-error-logs", conf, 1);
    assert_eq!(get(s.addr(), "/no-such-file").status, 404);
    let only = s.dir.join("logs/errors-only.log");
    let text = wait_for(TIMEOUT, "the 404 in errors-only.log", || {
        let t = read(&only);
        t.contains("No such file or directory").then_some(t)
    });
    assert!(
        !text.contains("[notice]") && !text.contains("[info]"),
        "{text}"
    );
    let all = read(&s.dir.join("logs/error.log"));
    assert!(
        all.contains("[notice]") && all.contains("No such file or directory"),
        "{all}"
    );
    // Rotation: both files are opened anew.
    std::fs::rename(&only, s.dir.join("logs/errors-only.log.1")).unwrap();
    s.signal(libc::SIGUSR1);
    wait_for(TIMEOUT, "errors-only.log reopened", || {
        only.exists().then_some(())
    });
    let _ = get(s.addr(), "/still-missing");
    wait_for(TIMEOUT, "the next 404 in the new file", || {
        read(&only).contains("still-missing").then_some(())
    });
    s.signal(libc::SIGQUIT);
    assert_eq!(s.wait_exit(TIMEOUT), 0);
}

/// `debug_connection`: a listed client's connection writes debug lines to every error log
/// whatever its level (two `alert` logs get the same lines), others none; a log at `debug`
/// gets them for everyone; a stream session too.
#[test]
fn debug_connection_logs_one_client_at_the_debug_level() {
    let conf = "worker_processes 1;\nevents { debug_connection 127.0.0.2; }\nhttp {\n \
         error_log logs/d1.log alert;\n error_log logs/d2.log alert;\n \
         server {\n  listen 127.0.0.1:{port};\n  location = /status { shard_status; }\n  \
         location /all/ { error_log logs/all.log debug; return 204; }\n  \
         location / { return 200 \"ok\"; }\n }\n}\n\
         stream {\n server { listen 127.0.0.1:{port1}; proxy_pass 127.0.0.1:{port}; \
         error_log logs/s.log alert; }\n}\n";
    let s = Server::start_ports("debug-connection", conf, 1, 1);
    let logs = s.dir.join("logs");
    let from = |ip: [u8; 4], port: u16, req: &[u8]| {
        let sock =
            socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        sock.bind(&std::net::SocketAddr::from((ip, 0)).into())
            .unwrap();
        sock.connect(&std::net::SocketAddr::from(([127, 0, 0, 1], port)).into())
            .unwrap();
        let mut c: std::net::TcpStream = sock.into();
        c.set_read_timeout(Some(TIMEOUT)).unwrap();
        c.write_all(req).unwrap();
        let mut v = Vec::new();
        let _ = std::io::Read::read_to_end(&mut c, &mut v);
        String::from_utf8_lossy(&v).into_owned()
    };
    let req = b"GET /x HTTP/1.0\r\nHost: x\r\n\r\n";
    assert!(from([127, 0, 0, 1], s.port, req).ends_with("ok"));
    let all = wait_for(TIMEOUT, "a debug log's lines for anyone", || {
        from(
            [127, 0, 0, 1],
            s.port,
            b"GET /all/ HTTP/1.0\r\nHost: x\r\n\r\n",
        );
        let t = read(&logs.join("all.log"));
        t.contains("[debug]").then_some(t)
    });
    assert!(all.contains("http finalize request: 204"), "{all}");
    assert!(read(&logs.join("d1.log")).is_empty(), "not a listed client");
    assert!(from([127, 0, 0, 2], s.port, req).ends_with("ok"));
    let d1 = wait_for(TIMEOUT, "the listed client's debug lines", || {
        let t = read(&logs.join("d1.log"));
        t.contains("close http connection").then_some(t)
    });
    assert!(
        d1.contains("[debug]") && d1.contains("http finalize request: 200, \"/x\""),
        "{d1}"
    );
    assert_eq!(read(&logs.join("d2.log")), d1, "every log, the same lines");
    // A stream session of the listed client.
    assert!(from([127, 0, 0, 2], s.ports[0], req).ends_with("ok"));
    wait_for(TIMEOUT, "the stream session's debug lines", || {
        read(&logs.join("s.log"))
            .contains("stream session: 127.0.0.2")
            .then_some(())
    });
}

/// `error_log` in http, server, location and a stream server, as nginx's: a request's (or
/// session's) messages go to its level's logs only, each at its own level; the main log keeps
/// the rest; `SIGUSR1` reopens them.
#[test]
fn error_logs_below_main_take_their_requests_messages() {
    let dead = support::upstream::refusing_port();
    let conf = format!(
        "worker_processes 1;\n\
         error_log logs/error.log info;\n\
         events {{}}\nhttp {{\n server {{\n  listen 127.0.0.1:{{port}};\n  \
         error_log logs/server.log;\n  \
         location = /status {{ shard_status; }}\n  \
         location /loc/ {{ error_log logs/loc.log info; error_log logs/loc-crit.log crit; }}\n }}\n}}\n\
         stream {{\n server {{ listen 127.0.0.1:{{port1}}; proxy_pass 127.0.0.1:{dead};\n  \
         error_log logs/stream.log info; }}\n}}\n"
    );
    let s = Server::start_ports("context-error-logs", &conf, 1, 1);
    assert_eq!(get(s.addr(), "/loc/missing-a").status, 404);
    assert_eq!(get(s.addr(), "/elsewhere-b").status, 404);
    let logs = s.dir.join("logs");
    let loc = wait_for(TIMEOUT, "the location's log", || {
        let t = read(&logs.join("loc.log"));
        t.contains("missing-a").then_some(t)
    });
    assert!(!loc.contains("elsewhere-b"), "{loc}");
    let server = wait_for(TIMEOUT, "the server's log", || {
        let t = read(&logs.join("server.log"));
        t.contains("elsewhere-b").then_some(t)
    });
    assert!(!server.contains("missing-a"), "{server}");
    assert!(read(&logs.join("loc-crit.log")).is_empty(), "below crit");
    let main = read(&logs.join("error.log"));
    assert!(
        !main.contains("missing-a") && !main.contains("elsewhere-b"),
        "{main}"
    );
    // A stream session: nginx's info lines and the connect error, in its server's log.
    let mut c = std::net::TcpStream::connect(("127.0.0.1", s.ports[0])).unwrap();
    c.set_read_timeout(Some(TIMEOUT)).unwrap();
    let mut v = Vec::new();
    let _ = std::io::Read::read_to_end(&mut c, &mut v);
    let stream = wait_for(TIMEOUT, "the stream server's log", || {
        let t = read(&logs.join("stream.log"));
        t.contains("disconnected").then_some(t)
    });
    assert!(
        stream.contains("[info]") && stream.contains(" connected to 127.0.0.1:"),
        "{stream}"
    );
    assert!(
        stream.contains("connect() failed (111: Connection refused)"),
        "{stream}"
    );
    assert!(!read(&logs.join("error.log")).contains("Connection refused"));
    // Rotation reaches these too.
    std::fs::rename(logs.join("loc.log"), logs.join("loc.log.1")).unwrap();
    s.signal(libc::SIGUSR1);
    wait_for(TIMEOUT, "loc.log reopened", || {
        logs.join("loc.log").exists().then_some(())
    });
    // The master makes the new file before the worker has reopened it: a request until
    // the worker writes into the new one (a worker that never reopens fails this).
    let mut n = 0;
    wait_for(TIMEOUT, "a line in the new file", || {
        n += 1;
        let _ = get(s.addr(), &format!("/loc/missing-c{n}"));
        read(&logs.join("loc.log"))
            .contains("missing-c")
            .then_some(())
    });
}
