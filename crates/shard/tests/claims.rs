//! Claims of docs/directives.md and docs/metrics.md that no other test held: what
//! `lingering_close on` and `off` do with what a client sends after a close, the 500 of a
//! proxied request with no room for its upstream connection, the access log flushed at a
//! graceful stop, the `reading` gauge, and `heartbeat_age_ms` growing while a worker is
//! stopped.

mod support;

use std::io::{Read, Write};
use std::time::Duration;

use support::upstream::Upstream;
use support::*;

fn conf(events: &str, http_extra: &str, server_extra: &str, workers: usize) -> String {
    format!(
        "worker_processes {workers};\n\
         error_log logs/error.log info;\n\
         events {{ {events} }}\n\
         http {{\n\
         access_log logs/access.log;\n\
         {http_extra}\n\
         server {{\n\
         listen 127.0.0.1:{{port}};\n\
         location = /status {{ shard_status; }}\n\
         location = /ok {{ return 200 \"OK\"; }}\n\
         {server_extra}\n\
         }}\n\
         }}\n"
    )
}

/// Sends a request that gets a 400 with more input behind it and reads the response; then,
/// after the server's FIN, writes more: a lingering server reads and drops it (the client then
/// still reads end of stream), a closed one answers it with a reset. True when reset.
fn reset_after_400(addr: std::net::SocketAddr) -> bool {
    let mut c = connect(addr);
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    c.write_all(
        b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\nabcEXTRA",
    )
    .unwrap();
    let r = read_response(&mut c, false).expect("a 400");
    assert_eq!(r.status, 400);
    // The pause is the scenario (a client still sending after the response), not a wait
    // for the server.
    std::thread::sleep(Duration::from_millis(200));
    let _ = c.write_all(b"more bytes the server never asked for");
    std::thread::sleep(Duration::from_millis(200));
    // A second write sees the reset of the first, if there was one.
    if let Err(e) = c.write_all(b"and more") {
        return matches!(
            e.kind(),
            std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe
        );
    }
    let mut buf = [0u8; 256];
    loop {
        match c.read(&mut buf) {
            Ok(0) => return false,
            Ok(_) => {}
            Err(e) => {
                return matches!(
                    e.kind(),
                    std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe
                )
            }
        }
    }
}

#[test]
fn lingering_close_on_reads_what_still_comes_and_off_resets_it() {
    let on = Server::start(
        "claims-linger-on",
        &conf("", "lingering_close on; lingering_timeout 5s;", "", 1),
        1,
    );
    assert!(
        !reset_after_400(on.addr()),
        "on: the late bytes were answered with a reset"
    );
    let off = Server::start(
        "claims-linger-off",
        &conf("", "lingering_close off;", "", 1),
        1,
    );
    assert!(reset_after_400(off.addr()), "off: the connection lingered");
}

#[test]
fn a_proxied_request_with_no_room_for_its_upstream_connection_gets_500() {
    let up = Upstream::text("up");
    let s = Server::start(
        "claims-500",
        &conf(
            "worker_connections 1;",
            "",
            &format!("location /p {{ proxy_pass http://127.0.0.1:{}; }}", up.port),
            1,
        ),
        1,
    );
    assert_eq!(get(s.addr(), "/p").status, 500);
    assert_eq!(up.accepted(), 0);
    let log = std::fs::read_to_string(s.dir.join("logs/error.log")).unwrap();
    assert!(
        log.contains("1 worker_connections are not enough while connecting to upstream"),
        "{log}"
    );
}

#[test]
fn the_access_log_is_flushed_when_the_server_stops() {
    let mut s = Server::start("claims-flush", &conf("", "", "", 1), 1);
    assert_eq!(get(s.addr(), "/ok").status, 200);
    // At once: the 64k buffer and the one-second flush have not written it yet.
    s.signal(libc::SIGQUIT);
    assert_eq!(s.wait_exit(Duration::from_secs(10)), 0);
    let log = std::fs::read_to_string(s.dir.join("logs/access.log")).unwrap();
    assert!(log.contains("\"GET /ok HTTP/1.1\" 200"), "{log:?}");
}

fn field(body: &str, key: &str) -> Vec<u64> {
    let pat = format!("\"{key}\":");
    body.match_indices(&pat)
        .map(|(i, _)| {
            body[i + pat.len()..]
                .chars()
                .take_while(char::is_ascii_digit)
                .collect::<String>()
                .parse()
                .unwrap_or(0)
        })
        .collect()
}

#[test]
fn reading_counts_a_half_sent_head_and_heartbeat_age_grows_while_a_worker_is_stopped() {
    // Two workers on a shared socket: the one left running answers /status.
    let s = Server::start("claims-gauges", &conf("", "", "", 2), 2);
    let mut half = connect(s.addr());
    half.write_all(b"GET /ok HTTP/1.1\r\nHo").unwrap();
    wait_for(Duration::from_secs(5), "reading 1", || {
        let body = get(s.addr(), "/status").body_str();
        (field(&body, "reading").iter().sum::<u64>() == 1).then_some(())
    });
    drop(half);
    let ws = s.workers();
    let victim = ws[0].pid as i32;
    // SAFETY: plain kill(2).
    unsafe { libc::kill(victim, libc::SIGSTOP) };
    let aged = wait_for(Duration::from_secs(10), "a growing heartbeat age", || {
        let body = try_get(s.addr(), "/status").ok()?.body_str();
        let ages = field(&body, "heartbeat_age_ms");
        (ages.first().copied().unwrap_or(0) >= 1500).then_some(ages)
    });
    // SAFETY: plain kill(2).
    unsafe { libc::kill(victim, libc::SIGCONT) };
    assert!(aged[1] < 1500, "the running worker's age: {aged:?}");
}

#[test]
fn a_dropped_invalid_header_is_logged_at_info() {
    let s = Server::start("claims-invalid-header", &conf("", "", "", 1), 1);
    let r = raw(
        s.addr(),
        b"GET /ok HTTP/1.1\r\nHost: x\r\nX_Under: 1\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(r.status, 200);
    let log = std::fs::read_to_string(s.dir.join("logs/error.log")).unwrap();
    assert!(
        log.contains("[info]") && log.contains("client sent 1 invalid header line(s) (ignored)"),
        "{log}"
    );
}

#[test]
fn a_reload_to_fewer_workers_says_which_shards_are_steered() {
    let four = conf("", "", "", 4).replace(
        "listen 127.0.0.1:{port};",
        "listen 127.0.0.1:{port} reuseport;",
    );
    let s = Server::start("claims-steer", &four, 4);
    let two = four
        .replace("worker_processes 4;", "worker_processes 2;")
        .replace("{port}", &s.port.to_string());
    std::fs::write(s.dir.join("conf/shard.conf"), two).unwrap();
    s.signal(libc::SIGHUP);
    wait_for(Duration::from_secs(10), "the steering notice", || {
        std::fs::read_to_string(s.dir.join("logs/error.log"))
            .ok()?
            .contains("2 of 4 shards take new connections")
            .then_some(())
    });
    assert_eq!(get(s.addr(), "/ok").status, 200);
}

#[test]
fn a_worker_that_exits_with_code_2_is_not_respawned() {
    // `worker_rlimit_nofile 4` leaves a new worker no descriptor for its epoll: it cannot
    // start, and says so with exit code 2, which the master never respawns (nginx's rule).
    let dir = temp_dir("claims-exit2");
    let port = free_port();
    std::fs::write(
        dir.join("conf/shard.conf"),
        format!(
            "worker_processes 1;\nworker_rlimit_nofile 4;\nerror_log logs/error.log info;\n\
             events {{}}\nhttp {{ access_log off; server {{ listen 127.0.0.1:{port}; return 200; }} }}\n"
        ),
    )
    .unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_shard"))
        .args(["-g", "daemon off;"])
        .arg("-p")
        .arg(&*dir)
        .arg("-c")
        .arg("conf/shard.conf")
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let log = dir.join("logs/error.log");
    wait_for(Duration::from_secs(10), "the worker's exit with 2", || {
        std::fs::read_to_string(&log)
            .ok()?
            .contains("exited with code 2: fatal, not respawning")
            .then_some(())
    });
    // A window in which a respawn (at once, or after 100 ms of back-off) would show.
    std::thread::sleep(Duration::from_millis(600));
    let text = std::fs::read_to_string(&log).unwrap();
    // SAFETY: plain kill(2) on our child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let _ = child.wait();
    assert_eq!(text.matches("start worker process").count(), 1, "{text}");
}

#[test]
fn a_reload_that_removes_an_address_closes_it_and_keeps_the_others() {
    let text = "worker_processes 1;\nerror_log logs/error.log info;\nevents {}\n\
         http { access_log off;\n\
         server { listen 127.0.0.1:{port}; location = /status { shard_status; }\n\
             location = /ok { return 200 \"OK\"; } }\n\
         server { listen 127.0.0.1:{port1}; return 200 \"second\"; }\n}\n";
    let s = Server::start_ports("claims-remove-addr", text, 1, 1);
    let second = std::net::SocketAddr::from(([127, 0, 0, 1], s.ports[0]));
    assert_eq!(get(second, "/").body_str(), "second");
    let without: String = text
        .lines()
        .filter(|l| !l.contains("{port1}"))
        .collect::<Vec<_>>()
        .join("\n")
        .replace("{port}", &s.port.to_string());
    std::fs::write(s.dir.join("conf/shard.conf"), without).unwrap();
    s.signal(libc::SIGHUP);
    wait_for(Duration::from_secs(10), "the address closed", || {
        std::net::TcpStream::connect(second).is_err().then_some(())
    });
    assert_eq!(get(s.addr(), "/ok").status, 200);
    let log = std::fs::read_to_string(s.dir.join("logs/error.log")).unwrap();
    assert!(log.contains("no longer configured"), "{log}");
}

#[test]
fn queue_shows_connections_waiting_on_a_stopped_workers_shard() {
    // Two reuseport shards; worker 0 stopped. Connections the kernel hashes to shard 0 wait in
    // its queue, and /status (answered by worker 1, on a connection hashed to shard 1) shows
    // them, before the 3 s after which worker 1 adopts the shard. Steering off: it would
    // drain them within a few tens of milliseconds (tests/steering.rs).
    let s = Server::start(
        "claims-queue",
        &conf("reuseport_steering off;", "", "", 2).replace(
            "listen 127.0.0.1:{port};",
            "listen 127.0.0.1:{port} reuseport;",
        ),
        2,
    );
    let w0 = s.workers().into_iter().find(|w| w.idx == 0).unwrap().pid as i32;
    // SAFETY: plain kill(2).
    unsafe { libc::kill(w0, libc::SIGSTOP) };
    let held: Vec<std::net::TcpStream> = (0..16).map(|_| connect(s.addr())).collect();
    let queued = wait_for(Duration::from_secs(3), "a status answer", || {
        // A connection hashed to the stopped shard gets no answer: try another.
        let mut c = connect(s.addr());
        c.set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        c.write_all(b"GET /status HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .ok()?;
        let body = read_response(&mut c, false).ok()?.body_str();
        let shard0 = body.split("\"shard\":0,").nth(1)?;
        field(shard0, "queue").first().copied()
    });
    // SAFETY: plain kill(2).
    unsafe { libc::kill(w0, libc::SIGCONT) };
    drop(held);
    assert!(queued >= 1, "shard 0's queue: {queued}");
}

#[test]
fn no_100_continue_for_a_body_that_is_only_discarded() {
    let s = Server::start(
        "claims-no-continue",
        &conf("", "", "location = /r { return 204; }", 1),
        1,
    );
    let mut c = connect(s.addr());
    c.write_all(
        b"POST /r HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n",
    )
    .unwrap();
    // The final answer comes first, not an interim 100.
    let r = read_response(&mut c, false).expect("an answer");
    assert_eq!(r.status, 204);
}

#[test]
fn upstream_names_compare_without_case_and_http_404_is_retried_at_runtime() {
    let missing = Upstream::start(|_| support::upstream::Reply::text(404, "not here"));
    let found = Upstream::text("found");
    let s = Server::start(
        "claims-upstream-case",
        &conf(
            "",
            &format!(
                "upstream Backend {{ server 127.0.0.1:{}; server 127.0.0.1:{}; }}",
                missing.port, found.port
            ),
            "location /p { proxy_pass http://backend; proxy_next_upstream error http_404; }",
            1,
        ),
        1,
    );
    // Both peers are used through the block named with another case; a 404 goes on to the
    // next peer, and the client sees the found page each time.
    for _ in 0..4 {
        let r = get(s.addr(), "/p");
        assert_eq!((r.status, r.body_str().as_str()), (200, "found"));
    }
    assert!(missing.requests() >= 2 && found.requests() == 4);
}

#[test]
fn patch_is_retried_only_with_non_idempotent() {
    // The first peer resets every request after reading it; only `non_idempotent` lets a
    // PATCH go on to the second.
    let reset = Upstream::start(|_| support::upstream::Reply::ResetNow);
    let good = Upstream::text("patched");
    // One block per location: a failure marks the peer down in its own block only.
    let block = format!(
        "upstream plain {{ server 127.0.0.1:{0}; server 127.0.0.1:{1}; }}\n\
         upstream nonid {{ server 127.0.0.1:{0}; server 127.0.0.1:{1}; }}",
        reset.port, good.port
    );
    let s = Server::start(
        "claims-patch",
        &conf(
            "",
            &block,
            "location /plain { proxy_pass http://plain; proxy_next_upstream error; }\n\
             location /nonid { proxy_pass http://nonid; proxy_next_upstream error non_idempotent; }",
            1,
        ),
        1,
    );
    let patch = |path: &str| {
        let mut c = connect(s.addr());
        c.write_all(
            format!("PATCH {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nab").as_bytes(),
        )
        .unwrap();
        read_response(&mut c, false).expect("an answer")
    };
    // Round robin starts at the first peer for the first request of each location.
    let mut statuses = Vec::new();
    for _ in 0..2 {
        statuses.push(patch("/plain").status);
    }
    assert!(
        statuses.contains(&502),
        "a PATCH was retried without non_idempotent: {statuses:?}"
    );
    for _ in 0..2 {
        let r = patch("/nonid");
        assert_eq!((r.status, r.body_str().as_str()), (200, "patched"));
    }
}

#[test]
fn the_access_log_is_written_within_a_second_or_so_while_running() {
    let s = Server::start("claims-log-second", &conf("", "", "", 1), 1);
    assert_eq!(get(s.addr(), "/ok").status, 200);
    wait_for(Duration::from_secs(3), "the buffered line written", || {
        std::fs::read_to_string(s.dir.join("logs/access.log"))
            .ok()?
            .contains("\"GET /ok HTTP/1.1\" 200")
            .then_some(())
    });
}

#[test]
fn client_body_in_file_only_clean_spools_even_a_small_body() {
    let up = Upstream::text("ok");
    let s = Server::start(
        "claims-file-only",
        &conf(
            "",
            "client_body_in_file_only clean;",
            &format!("location /p {{ proxy_pass http://127.0.0.1:{}; }}", up.port),
            1,
        ),
        1,
    );
    let mut c = connect(s.addr());
    c.write_all(b"POST /p HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n0123456789")
        .unwrap();
    assert_eq!(read_response(&mut c, false).unwrap().status, 200);
    let body = get(s.addr(), "/status").body_str();
    assert_eq!(field(&body, "body_spooled_bytes"), vec![10], "{body}");
    assert_eq!(up.last().body, b"0123456789");
}

/// Starts shard with `conf` in `dir` through `pre_exec` (run in the child before exec), and
/// waits until `port` accepts.
fn spawn_with(
    dir: &std::path::Path,
    conf: &str,
    port: u16,
    pre: impl FnMut() -> std::io::Result<()> + Send + Sync + 'static,
) -> support::Nginx {
    use std::os::unix::process::CommandExt;
    std::fs::write(dir.join("conf/shard.conf"), conf).unwrap();
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_shard"));
    cmd.args(["-g", "daemon off;"]);
    cmd.arg("-p").arg(dir).arg("-c").arg("conf/shard.conf");
    cmd.stderr(std::process::Stdio::null());
    // SAFETY: the closures passed here only make async-signal-safe system calls.
    unsafe { cmd.pre_exec(pre) };
    let child = cmd.spawn().unwrap();
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    wait_for(Duration::from_secs(10), "shard listening", || {
        std::net::TcpStream::connect(addr).ok()
    });
    // The same QUIT-and-wait guard the nginx tests use.
    support::Nginx(child)
}

fn worker_pids(master: u32) -> Vec<u64> {
    wait_for(Duration::from_secs(10), "the workers", || {
        let v: Vec<u64> = std::fs::read_to_string(format!("/proc/{master}/task/{master}/children"))
            .ok()?
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect();
        (!v.is_empty()).then_some(v)
    })
}

#[test]
fn worker_processes_auto_counts_the_cpus_of_the_affinity_mask() {
    let dir = temp_dir("claims-auto");
    let port = free_port();
    let conf = format!(
        "worker_processes auto;\nerror_log logs/error.log info;\nevents {{}}\n\
         http {{ access_log off; server {{ listen 127.0.0.1:{port}; return 200; }} }}\n"
    );
    // One CPU in the mask: one worker, whatever the machine has.
    let s = spawn_with(&dir, &conf, port, || {
        // SAFETY: a zeroed cpu_set_t with one bit set, passed by pointer.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(0, &mut set);
            if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        Ok(())
    });
    let log = wait_for(Duration::from_secs(10), "the start-up line", || {
        std::fs::read_to_string(dir.join("logs/error.log"))
            .ok()
            .filter(|t| t.contains(" worker processes, listening on"))
    });
    assert!(log.contains(": 1 worker processes, listening on"), "{log}");
    assert_eq!(worker_pids(s.0.id()).len(), 1);
}

#[test]
fn a_user_line_under_a_non_root_master_is_ignored_with_nginxs_warning() {
    if unsafe { libc::geteuid() } != 0 {
        skipped(
            "a_user_line_under_a_non_root_master_is_ignored_with_nginxs_warning",
            "needs root to start the master as another user",
        );
        return;
    }
    let dir = temp_dir("claims-nonroot");
    // The master runs as nobody: it must be able to write its logs and temp directory.
    for d in ["", "conf", "logs", "html"] {
        let p = dir.join(d);
        std::os::unix::fs::chown(&p, Some(65534), None).unwrap();
    }
    let port = free_port();
    let conf = format!(
        "user www-data;\nworker_processes 1;\nerror_log logs/error.log info;\nevents {{}}\n\
         http {{ access_log off; server {{ listen 127.0.0.1:{port}; return 200; }} }}\n"
    );
    std::fs::write(dir.join("conf/shard.conf"), &conf).unwrap();
    std::os::unix::fs::chown(dir.join("conf/shard.conf"), Some(65534), None).unwrap();
    let s = spawn_with(&dir, &conf, port, || {
        // SAFETY: plain system calls with integer arguments, before exec.
        unsafe {
            if libc::setgroups(0, std::ptr::null()) != 0
                || libc::setgid(65534) != 0
                || libc::setuid(65534) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
        }
        Ok(())
    });
    let worker = worker_pids(s.0.id())[0];
    let st = std::fs::read_to_string(format!("/proc/{worker}/status")).unwrap();
    let uid = st.lines().find(|l| l.starts_with("Uid:")).unwrap();
    assert!(uid.split_whitespace().nth(1) == Some("65534"), "{uid}");
    let log = std::fs::read_to_string(dir.join("logs/error.log")).unwrap();
    assert!(
        log.contains("the \"user\" directive makes sense only if the master process runs with super-user privileges, ignored"),
        "{log}"
    );
}

#[test]
fn underscores_in_headers_is_the_listener_default_servers_as_in_nginx() {
    let up = Upstream::text("ok");
    // The head is read before Host picks a server: the default server's rule applies.
    let text = |default_on: bool| {
        let (a, b) = if default_on {
            ("on", "off")
        } else {
            ("off", "on")
        };
        format!(
            "worker_processes 1;\nerror_log logs/error.log info;\nevents {{}}\n\
             http {{ access_log off;\n\
             server {{ listen 127.0.0.1:{{port}} default_server; underscores_in_headers {a};\n\
                 location = /status {{ shard_status; }} }}\n\
             server {{ listen 127.0.0.1:{{port}}; server_name b.test; underscores_in_headers {b};\n\
                 location / {{ add_header X-Sent-Foo $http_x_foo; proxy_pass http://127.0.0.1:{}; }} }}\n}}\n",
            up.port
        )
    };
    for default_on in [true, false] {
        let s = Server::start("claims-underscores", &text(default_on), 1);
        let r = raw(
            s.addr(),
            b"GET /h HTTP/1.1\r\nHost: b.test\r\nX_Foo: 1\r\nConnection: close\r\n\r\n",
        );
        assert_eq!(r.status, 200);
        assert_eq!(
            up.last().header("x_foo").is_some(),
            default_on,
            "default server's underscores_in_headers {default_on}"
        );
        // A header taken with its underscore is `$http_x_foo`, as nginx names it.
        assert_eq!(
            r.header("x-sent-foo"),
            default_on.then_some("1"),
            "{default_on}"
        );
    }
}

#[test]
fn at_the_cap_an_eighth_of_the_idle_connections_close_the_oldest_first() {
    let s = Server::start(
        "claims-drain",
        &conf("worker_connections 64;", "keepalive_timeout 75s;", "", 1),
        1,
    );
    // 64 idle keep-alive connections, oldest first, fill the cap.
    let mut idle: Vec<std::net::TcpStream> = Vec::new();
    for _ in 0..64 {
        let mut c = connect(s.addr());
        c.write_all(b"GET /ok HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        assert_eq!(read_response(&mut c, false).unwrap().status, 200);
        idle.push(c);
    }
    // One more: the worker makes room by closing 64/8 = 8 idle ones, the longest idle.
    let r = get(s.addr(), "/ok");
    assert_eq!(r.status, 200);
    // A non-blocking read tells closed (end of stream) from open; the FINs may take a moment.
    for c in &idle {
        c.set_nonblocking(true).unwrap();
    }
    let mut closed = vec![false; idle.len()];
    let _ = wait_for_or_none(Duration::from_secs(2), || {
        for (i, c) in idle.iter_mut().enumerate() {
            let mut b = [0u8; 1];
            if matches!(c.read(&mut b), Ok(0)) {
                closed[i] = true;
            }
        }
        (closed.iter().filter(|&&x| x).count() >= 7).then_some(())
    });
    let n = closed.iter().filter(|&&x| x).count();
    // An eighth of the idle ones, as nginx's ngx_drain_connections: 8 of 64, or 7 when the
    // newest was still finishing its response and not yet idle.
    assert!((7..=8).contains(&n), "{n} closed: {closed:?}");
    assert!(closed[..n].iter().all(|&x| x), "not the oldest: {closed:?}");
}

/// Polls `f` until it gives a value or `limit` passes (then `None`: the caller asserts).
fn wait_for_or_none<T>(limit: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = std::time::Instant::now() + limit;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if std::time::Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_worker_that_dies_while_starting_is_respawned_after_a_growing_delay() {
    // Every worker is killed (SIGSYS) by its first system call after fork, the parent-death
    // signal it sets before anything else: a seccomp filter installed before exec, which the
    // master never trips. Respawned at once, that would be thousands of starts a second; with
    // the back-off doubling from 100 ms, a handful in two and a half seconds.
    fn kill_on_pdeathsig() -> std::io::Result<()> {
        let f = |code: u32, jt: u8, jf: u8, k: u32| libc::sock_filter {
            code: code as u16,
            jt,
            jf,
            k,
        };
        let (ld, jeq, ret) = (
            libc::BPF_LD | libc::BPF_W | libc::BPF_ABS,
            libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K,
            libc::BPF_RET | libc::BPF_K,
        );
        let mut prog = [
            f(ld, 0, 0, 0),
            f(jeq, 0, 3, libc::SYS_prctl as u32),
            f(ld, 0, 0, 16), // args[0], low half
            f(jeq, 0, 1, libc::PR_SET_PDEATHSIG as u32),
            f(ret, 0, 0, libc::SECCOMP_RET_KILL_PROCESS),
            f(ret, 0, 0, libc::SECCOMP_RET_ALLOW),
        ];
        let p = libc::sock_fprog {
            len: prog.len() as u16,
            filter: prog.as_mut_ptr(),
        };
        // SAFETY: prctl and seccomp with a valid program, in the child before exec.
        unsafe {
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
                || libc::syscall(libc::SYS_seccomp, 1u32, 0u32, &p as *const libc::sock_fprog) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
        }
        Ok(())
    }
    let dir = temp_dir("claims-backoff");
    let port = free_port();
    let conf = format!(
        "worker_processes 1;\nerror_log logs/error.log info;\nevents {{}}\n\
         http {{ access_log off; server {{ listen 127.0.0.1:{port}; return 200; }} }}\n"
    );
    let s = spawn_with(&dir, &conf, port, kill_on_pdeathsig);
    std::thread::sleep(Duration::from_millis(2500)); // the window measured, not a wait
    let log = std::fs::read_to_string(dir.join("logs/error.log")).unwrap();
    drop(s);
    let starts = log.matches("start worker process").count();
    // 0, 0.1, 0.3, 0.7, 1.5 s (and 3.1 s, outside the window): about 5.
    assert!((3..=8).contains(&starts), "{starts} starts in 2.5 s: {log}");
}

#[test]
fn an_invalid_upstream_header_goes_to_the_next_peer_with_invalid_header() {
    let bad = Upstream::start(|_| {
        support::upstream::Reply::Raw(
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\nok"
                .to_vec(),
        )
    });
    let good = Upstream::text("good");
    let s = Server::start(
        "claims-invalid-header-next",
        &conf(
            "",
            &format!(
                "upstream a {{ server 127.0.0.1:{0}; server 127.0.0.1:{1}; }}\n\
                 upstream b {{ server 127.0.0.1:{0}; server 127.0.0.1:{1}; }}",
                bad.port, good.port
            ),
            "location /next { proxy_pass http://a; proxy_next_upstream error invalid_header; }\n\
             location /stop { proxy_pass http://b; proxy_next_upstream error; }",
            1,
        ),
        1,
    );
    // Each block starts with the bad peer.
    let r = get(s.addr(), "/next");
    assert_eq!((r.status, r.body_str().as_str()), (200, "good"));
    assert_eq!(get(s.addr(), "/stop").status, 502);
}

#[test]
fn lingering_close_always_lingers_even_with_nothing_unread() {
    // A `Connection: close` request with nothing behind it: `on` closes at once (late bytes
    // then meet a reset), `always` still reads what comes.
    let late_bytes_reset = |addr: std::net::SocketAddr| -> bool {
        let mut c = connect(addr);
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        c.write_all(b"GET /ok HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .unwrap();
        assert_eq!(read_response(&mut c, false).unwrap().status, 200);
        // The pause is the scenario: a client still sending after the response.
        std::thread::sleep(Duration::from_millis(200));
        let _ = c.write_all(b"late");
        std::thread::sleep(Duration::from_millis(200));
        c.write_all(b"later").is_err()
    };
    let always = Server::start(
        "claims-linger-always",
        &conf("", "lingering_close always; lingering_timeout 5s;", "", 1),
        1,
    );
    assert!(
        !late_bytes_reset(always.addr()),
        "always: the late bytes met a reset"
    );
    let on = Server::start(
        "claims-linger-on2",
        &conf("", "lingering_close on;", "", 1),
        1,
    );
    assert!(
        late_bytes_reset(on.addr()),
        "on: it lingered with nothing unread"
    );
}
