//! Reload, binary upgrade and respawn under load: nothing lost.

mod support;

use std::io::{Read, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use support::*;

fn conf(workers: usize, listen_opts: &str, text: &str) -> String {
    format!(
        r#"
worker_processes {workers};
error_log logs/error.log info;
pid logs/shard.pid;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    server {{
        listen 127.0.0.1:{{port}} {listen_opts};
        root {{dir}}/html;
        sendfile on;
        location = /status {{ shard_status; }}
        location = /ok {{ return 200 "{text}"; }}
        location / {{ }}
    }}
}}
"#
    )
}

/// Writes the configuration and sends SIGHUP; waits until `generation` runs `workers` live
/// workers.
fn reload(s: &Server, text: String, generation: u64, workers: usize) {
    reload_pid(s, s.pid(), text, generation, workers);
}

/// `reload` for a master that is not the test's child (after a binary upgrade).
fn reload_pid(s: &Server, master: i32, text: String, generation: u64, workers: usize) {
    std::fs::write(
        s.dir.join("conf/shard.conf"),
        text.replace("{port}", &s.port.to_string())
            .replace("{dir}", s.dir.to_str().unwrap()),
    )
    .unwrap();
    let old: Vec<u64> = parse_workers(&get(s.addr(), "/status").body_str())
        .iter()
        .map(|w| w.pid)
        .collect();
    unsafe { libc::kill(master, libc::SIGHUP) };
    wait_generation(s, generation, workers);
    wait_stopped_accepting(s, &old);
}

/// Kills whatever masters the pid files name when a test ends (a failed test must not leave
/// an upgraded master, which is not the test's child, running).
struct ReapMasters(std::path::PathBuf);

impl Drop for ReapMasters {
    fn drop(&mut self) {
        for name in ["logs/shard.pid", "logs/shard.pid.oldbin"] {
            if let Some(pid) = std::fs::read_to_string(self.0.join(name))
                .ok()
                .and_then(|t| t.trim().parse::<i32>().ok())
            {
                // SAFETY: plain kill(2); workers follow their master (parent-death signal).
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
    }
}

/// Clients that open a new connection per request until stopped, checking every answer.
struct Load {
    stop: Arc<AtomicBool>,
    ok: Arc<AtomicU64>,
    failures: Arc<Mutex<Vec<String>>>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Load {
    fn start(addr: std::net::SocketAddr, n: usize, bodies: &'static [&'static str]) -> Load {
        Self::start_mode(addr, n, bodies, false)
    }

    /// Clients that keep their connection and send the next request as soon as the answer
    /// came, in a tight loop; a new connection only after `Connection: close` (or a failure).
    /// A request written on a connection the server then closed without answering it counts
    /// as failed, as it does for wrk.
    fn start_keepalive(
        addr: std::net::SocketAddr,
        n: usize,
        bodies: &'static [&'static str],
    ) -> Load {
        Self::start_mode(addr, n, bodies, true)
    }

    fn start_mode(
        addr: std::net::SocketAddr,
        n: usize,
        bodies: &'static [&'static str],
        keepalive: bool,
    ) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let ok = Arc::new(AtomicU64::new(0));
        let failures = Arc::new(Mutex::new(Vec::new()));
        let threads = (0..n)
            .map(|_| {
                let (stop, ok, failures) = (stop.clone(), ok.clone(), failures.clone());
                std::thread::spawn(move || {
                    let mut conn: Option<std::net::TcpStream> = None;
                    while !stop.load(Ordering::Relaxed) {
                        let res = if keepalive {
                            let c = conn.get_or_insert_with(|| connect(addr));
                            c.write_all(b"GET /ok HTTP/1.1\r\nHost: a\r\n\r\n")
                                .and_then(|()| read_response(c, false))
                        } else {
                            try_get(addr, "/ok")
                        };
                        match res {
                            Ok(r) if r.status == 200 && bodies.contains(&r.body_str().as_str()) => {
                                ok.fetch_add(1, Ordering::Relaxed);
                                if r.header("connection") == Some("close") {
                                    conn = None;
                                }
                            }
                            Ok(r) => {
                                conn = None;
                                failures.lock().unwrap().push(format!(
                                    "status {} body {:?}",
                                    r.status,
                                    r.body_str()
                                ))
                            }
                            Err(e) => {
                                conn = None;
                                failures.lock().unwrap().push(format!("{e}"))
                            }
                        }
                    }
                })
            })
            .collect();
        Load {
            stop,
            ok,
            failures,
            threads,
        }
    }

    fn ok(&self) -> u64 {
        self.ok.load(Ordering::Relaxed)
    }

    fn wait_progress(&self, more: u64) {
        let at = self.ok();
        wait_for(Duration::from_secs(10), "client progress", || {
            (self.ok() >= at + more).then_some(())
        });
    }

    fn finish(self) -> (u64, Vec<String>) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            t.join().unwrap();
        }
        let f = self.failures.lock().unwrap().clone();
        (self.ok.load(Ordering::Relaxed), f)
    }
}

#[test]
fn reload_applies_a_new_configuration_and_keeps_the_old_one_when_invalid() {
    let s = Server::start("reloadbasic", &conf(2, "reuseport", "one"), 2);
    assert_eq!(get(s.addr(), "/ok").body_str(), "one");
    reload(&s, conf(3, "reuseport", "two"), 2, 3);
    assert_eq!(get(s.addr(), "/ok").body_str(), "two");

    std::fs::write(
        s.dir.join("conf/shard.conf"),
        "events {}\nhttp { server { lisen 1; } }\n",
    )
    .unwrap();
    s.signal(libc::SIGHUP);
    let log = s.dir.join("logs/error.log");
    wait_for(Duration::from_secs(10), "reload failure logged", || {
        std::fs::read_to_string(&log)
            .ok()?
            .contains("reload failed: keeping the running configuration")
            .then_some(())
    });
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("unknown directive \"lisen\" in "), "{text}");
    assert_eq!(get(s.addr(), "/ok").body_str(), "two");
    let body = get(s.addr(), "/status").body_str();
    assert!(body.contains("\"generation\":2"), "{body}");
}

#[test]
fn reloads_that_change_workers_and_reuseport_lose_no_connection() {
    let s = Server::start("reloadload", &conf(2, "reuseport", "a"), 2);
    let size = 16 << 20;
    let data: Vec<u8> = (0..size).map(|i| (i % 253) as u8).collect();
    write_file(&s.dir, "html/big.bin", &data);
    // A slow download started before the reloads must finish with every byte.
    let mut slow = connect(s.addr());
    slow.write_all(b"GET /big.bin HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut first = vec![0u8; 4096];
    slow.read_exact(&mut first).unwrap();

    let load = Load::start(s.addr(), 2, &["a", "b"]);
    load.wait_progress(100);
    let plans: [(usize, &str); 10] = [
        (4, "reuseport"),
        (1, "reuseport"),
        (3, ""),
        (2, "reuseport"),
        (4, "reuseport shards=2"),
        (2, ""),
        (3, "reuseport"),
        (1, ""),
        (4, "reuseport"),
        (2, "reuseport"),
    ];
    for (i, (workers, opts)) in plans.iter().enumerate() {
        let text = if i % 2 == 0 { "b" } else { "a" };
        reload(&s, conf(*workers, opts, text), i as u64 + 2, *workers);
        load.wait_progress(50);
    }
    let (ok, failures) = load.finish();
    assert!(
        failures.is_empty(),
        "{} failed of {}: {:?}",
        failures.len(),
        ok + failures.len() as u64,
        &failures[..failures.len().min(10)]
    );
    assert_eq!(
        get(s.addr(), "/ok").body_str(),
        "a",
        "the last configuration serves"
    );

    let mut rest = Vec::new();
    slow.read_to_end(&mut rest).unwrap();
    let mut all = first;
    all.extend_from_slice(&rest);
    let head_end = find(&all, b"\r\n\r\n").unwrap() + 4;
    assert_eq!(all.len() - head_end, size);
    assert!(all[head_end..] == data[..]);
}

#[test]
fn binary_upgrade_hands_every_socket_to_the_new_master() {
    let mut s = Server::start("upgrade", &conf(2, "reuseport", "a"), 2);
    let _reap = ReapMasters(s.dir.clone());
    let pid_file = s.dir.join("logs/shard.pid");
    let load = Load::start(s.addr(), 2, &["a"]);
    load.wait_progress(100);
    let old = s.pid();
    s.signal(libc::SIGUSR2);
    let new: i32 = wait_for(Duration::from_secs(10), "new master's pid file", || {
        let p: i32 = std::fs::read_to_string(&pid_file)
            .ok()?
            .trim()
            .parse()
            .ok()?;
        (p != old && pid_alive(p)).then_some(p)
    });
    assert!(s.dir.join("logs/shard.pid.oldbin").exists());
    load.wait_progress(100);
    // Old workers stop, then the old master.
    s.signal(libc::SIGWINCH);
    load.wait_progress(100);
    s.signal(libc::SIGQUIT);
    assert_eq!(s.wait_exit(Duration::from_secs(10)), 0);
    load.wait_progress(200);
    let (ok, failures) = load.finish();
    assert!(
        failures.is_empty(),
        "{} failed of {}: {:?}",
        failures.len(),
        ok,
        &failures[..failures.len().min(10)]
    );
    // The new master serves alone; stop it.
    unsafe { libc::kill(new, libc::SIGQUIT) };
    wait_for(Duration::from_secs(10), "new master exit", || {
        (!pid_alive(new)).then_some(())
    });
}

/// Sends USR2 to `master` and waits for the new master's pid file; returns its pid.
fn start_new_binary(s: &Server, master: i32) -> i32 {
    let pid_file = s.dir.join("logs/shard.pid");
    unsafe { libc::kill(master, libc::SIGUSR2) };
    wait_for(Duration::from_secs(10), "new master's pid file", || {
        let p: i32 = std::fs::read_to_string(&pid_file)
            .ok()?
            .trim()
            .parse()
            .ok()?;
        (p != master && pid_alive(p)).then_some(p)
    })
}

/// Sends USR2 to `master`, waits for the new master and its generation 1 of `workers`, then
/// WINCH, `between` (while only the new workers serve), and QUIT to the old one; waits for it
/// to exit and returns the new master's pid.
fn binary_upgrade(s: &mut Server, master: i32, workers: usize, between: impl FnOnce()) -> i32 {
    let new = start_new_binary(s, master);
    wait_generation(s, 1, workers);
    unsafe { libc::kill(master, libc::SIGWINCH) };
    between();
    unsafe { libc::kill(master, libc::SIGQUIT) };
    if s.child.is_some() && master == s.pid() {
        assert_eq!(s.wait_exit(Duration::from_secs(10)), 0);
    } else {
        wait_for(Duration::from_secs(10), "old master exit", || {
            (!pid_alive(master)).then_some(())
        });
    }
    new
}

/// The lifecycle issue's proof, bounded: a client opening a new connection per request the
/// whole time while 50 reloads (workers up and down, reuseport toggled, shards changed) and 5
/// binary upgrades happen: no request fails. Then 20 `kill -9` of random workers: only the
/// requests inside a killed worker may fail (one client, so at most one per kill).

#[test]
fn reloads_and_an_upgrade_fail_no_request_on_kept_alive_connections() {
    // Clients that reuse their connection in a tight loop: nginx's reload closes idle
    // kept-alive connections at once and fails the request a client sends at that moment;
    // shard's drain answers it with `Connection: close` instead.
    let mut s = Server::start("ka-reload", &conf(2, "reuseport", "a"), 2);
    let _reap = ReapMasters(s.dir.clone());
    let load = Load::start_keepalive(s.addr(), 4, &["a", "b"]);
    load.wait_progress(200);
    for i in 0..5u64 {
        let text = if i % 2 == 0 { "b" } else { "a" };
        reload(&s, conf(2, "reuseport", text), i + 2, 2);
        load.wait_progress(200);
    }
    let first = s.pid();
    let master = binary_upgrade(&mut s, first, 2, || {});
    load.wait_progress(200);
    let (ok, failures) = load.finish();
    assert!(
        failures.is_empty(),
        "{} of {} kept-alive requests failed across 5 reloads and an upgrade: {:?}",
        failures.len(),
        ok + failures.len() as u64,
        &failures[..failures.len().min(10)]
    );
    unsafe { libc::kill(master, libc::SIGQUIT) };
    wait_for(Duration::from_secs(15), "master exit", || {
        (!pid_alive(master)).then_some(())
    });
}

#[test]
fn the_drain_window_closes_idle_connections_and_serves_late_requests_with_close() {
    let s = Server::start(
        "ka-window",
        // A window long enough that the late request below lands in it on a loaded machine.
        &conf(1, "", "a").replace("pid logs", "worker_shutdown_drain 3s;\npid logs"),
        1,
    );
    let old = s.workers()[0].pid;
    // Two idle kept-alive connections on the old worker.
    let mut late = connect(s.addr());
    let mut idle = connect(s.addr());
    for c in [&mut late, &mut idle] {
        c.write_all(b"GET /ok HTTP/1.1\r\nHost: a\r\n\r\n").unwrap();
        let r = read_response(c, false).unwrap();
        assert_eq!(r.header("connection"), Some("keep-alive"));
    }
    reload(&s, conf(1, "", "b"), 2, 1);
    assert!(pid_alive(old as i32), "the old worker waits out its window");
    // A request inside the window is served by the old worker, then the connection closes.
    late.write_all(b"GET /ok HTTP/1.1\r\nHost: a\r\n\r\n")
        .unwrap();
    let r = read_response(&mut late, false).unwrap();
    assert_eq!((r.status, r.body_str().as_str()), (200, "a"));
    assert_eq!(r.header("connection"), Some("close"));
    let mut b = [0u8; 1];
    assert_eq!(late.read(&mut b).unwrap(), 0);
    // The idle one is closed when the window ends, and the old worker exits.
    let t0 = std::time::Instant::now();
    idle.set_read_timeout(Some(Duration::from_secs(8))).unwrap();
    assert_eq!(
        idle.read(&mut b).unwrap_or(1),
        0,
        "closed at the window's end"
    );
    assert!(
        t0.elapsed() < Duration::from_millis(4000),
        "{:?}",
        t0.elapsed()
    );
    wait_for(Duration::from_secs(5), "the old worker to exit", || {
        (!pid_alive(old as i32)).then_some(())
    });
    let log = std::fs::read_to_string(s.dir.join("logs/error.log")).unwrap();
    assert!(
        log.contains("closing 1 idle keep-alive connections"),
        "{log}"
    );
}

#[test]
fn fifty_reloads_five_upgrades_and_twenty_kills_under_load() {
    let mut s = Server::start("stress", &conf(2, "reuseport", "a"), 2);
    let _reap = ReapMasters(s.dir.clone());
    let load = Load::start(s.addr(), 2, &["a", "b"]);
    load.wait_progress(50);
    let shapes: [(usize, &str); 6] = [
        (3, "reuseport"),
        (1, ""),
        (4, "reuseport shards=2"),
        (2, ""),
        (4, "reuseport"),
        (2, "reuseport"),
    ];
    let mut master = s.pid();
    let mut generation = 1;
    let mut upgrades = 0;
    for i in 0..50 {
        let (workers, opts) = shapes[i % shapes.len()];
        generation += 1;
        reload_pid(
            &s,
            master,
            conf(workers, opts, if i % 2 == 0 { "b" } else { "a" }),
            generation,
            workers,
        );
        load.wait_progress(20);
        if i % 10 == 9 {
            // Binary upgrade: USR2, then WINCH, progress on the new workers alone, and QUIT.
            let new = binary_upgrade(&mut s, master, workers, || load.wait_progress(20));
            generation = 1;
            master = new;
            upgrades += 1;
            load.wait_progress(20);
        }
    }
    let (ok, failures) = load.finish();
    assert_eq!(upgrades, 5);
    assert!(
        failures.is_empty(),
        "{} of {} requests failed during reloads and upgrades: {:?}",
        failures.len(),
        ok + failures.len() as u64,
        &failures[..failures.len().min(10)]
    );

    let load = Load::start(s.addr(), 1, &["a", "b"]);
    load.wait_progress(20);
    let mut seed = 0x9e37_79b9_u64;
    for _ in 0..20 {
        let ws = wait_for(Duration::from_secs(10), "workers", || {
            let ws = parse_workers(&try_get(s.addr(), "/status").ok()?.body_str());
            (!ws.is_empty() && ws.iter().all(|w| w.pid > 0 && pid_alive(w.pid as i32)))
                .then_some(ws)
        });
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let victim = ws[(seed % ws.len() as u64) as usize].pid as i32;
        unsafe { libc::kill(victim, libc::SIGKILL) };
        wait_for(Duration::from_secs(10), "respawn", || {
            (!pid_alive(victim)).then_some(())
        });
        load.wait_progress(10);
    }
    let (ok, failures) = load.finish();
    assert!(
        failures.len() <= 20,
        "{} of {} failed across 20 kills: {:?}",
        failures.len(),
        ok,
        failures
    );
    eprintln!(
        "kill -9 phase: {} ok, {} failed (requests inside killed workers)",
        ok,
        failures.len()
    );
    unsafe { libc::kill(master, libc::SIGQUIT) };
    wait_for(Duration::from_secs(10), "master exit", || {
        (!pid_alive(master)).then_some(())
    });
}

#[test]
fn a_new_binary_that_fails_leaves_the_old_master_serving_and_winch_then_hup_restarts_workers() {
    let mut s = Server::start("upgradefail", &conf(2, "reuseport", "a"), 2);
    let _reap = ReapMasters(s.dir.clone());
    let pid_file = s.dir.join("logs/shard.pid");
    let log = s.dir.join("logs/error.log");
    let good = std::fs::read_to_string(s.dir.join("conf/shard.conf")).unwrap();
    // The new binary reads the configuration at start: a broken one makes it exit.
    std::fs::write(
        s.dir.join("conf/shard.conf"),
        "events {}\nhttp { server { lisen 1; } }\n",
    )
    .unwrap();
    s.signal(libc::SIGUSR2);
    wait_for(Duration::from_secs(10), "failed upgrade logged", || {
        std::fs::read_to_string(&log)
            .ok()?
            .contains("keeping serving with this one")
            .then_some(())
    });
    let pid: i32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert_eq!(pid, s.pid(), "the pid file is back");
    assert!(!s.dir.join("logs/shard.pid.oldbin").exists());
    assert_eq!(get(s.addr(), "/ok").body_str(), "a");

    // WINCH stops the workers (the sockets stay open in the master); HUP brings them back.
    std::fs::write(s.dir.join("conf/shard.conf"), good).unwrap();
    let before = s.workers();
    s.signal(libc::SIGWINCH);
    for w in &before {
        let pid = w.pid as i32;
        wait_for(Duration::from_secs(10), "old workers gone", || {
            (!pid_alive(pid)).then_some(())
        });
    }
    s.signal(libc::SIGHUP);
    wait_generation(&s, 2, 2);
    assert_eq!(get(s.addr(), "/ok").body_str(), "a");
    s.signal(libc::SIGQUIT);
    assert_eq!(s.wait_exit(Duration::from_secs(10)), 0);
}

#[test]
fn worker_shutdown_timeout_bounds_a_graceful_stop() {
    let text =
        conf(1, "reuseport", "a").replace("events {", "worker_shutdown_timeout 500ms;\nevents {");
    let mut s = Server::start("shutdowntimeout", &text, 1);
    write_file(&s.dir, "html/big.bin", &vec![7u8; 32 << 20]);
    // A client that never reads: the download cannot finish.
    let mut c = connect(s.addr());
    c.write_all(b"GET /big.bin HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut head = [0u8; 1024];
    let _ = c.read(&mut head).unwrap();
    let t0 = std::time::Instant::now();
    s.signal(libc::SIGQUIT);
    assert_eq!(s.wait_exit(Duration::from_secs(10)), 0);
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    let log = std::fs::read_to_string(s.dir.join("logs/error.log")).unwrap();
    assert!(
        log.contains("worker_shutdown_timeout expired, closing 1 connections"),
        "{log}"
    );
}

#[test]
fn systemd_socket_activation_is_adopted() {
    use std::os::unix::process::CommandExt;
    let dir = temp_dir("systemd");
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let text = conf(1, "", "socket-activated")
        .replace("{port}", &port.to_string())
        .replace("{dir}", dir.to_str().unwrap());
    std::fs::write(dir.join("conf/shard.conf"), text).unwrap();
    let fd = std::os::fd::AsRawFd::as_raw_fd(&l);
    // The `.socket` unit's `Backlog=`: kept, since the configuration sets no `backlog=`.
    assert_eq!(unsafe { libc::listen(fd, 77) }, 0);
    let mut cmd = std::process::Command::new("/bin/sh");
    cmd.args([
        "-c",
        "export LISTEN_PID=$$ LISTEN_FDS=1; exec \"$0\" \"$@\"",
        BIN,
        "-g",
        "daemon off;",
        "-p",
        dir.to_str().unwrap(),
        "-c",
        "conf/shard.conf",
    ]);
    cmd.stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(dir.join("logs/stderr.log")).unwrap());
    // SAFETY: dup2 and fcntl are async-signal-safe; they make the listener descriptor 3
    // without FD_CLOEXEC, as systemd passes it.
    unsafe {
        cmd.pre_exec(move || {
            // dup2 onto itself would keep FD_CLOEXEC: clear it instead.
            let r = if fd == 3 {
                libc::fcntl(3, libc::F_SETFD, 0)
            } else {
                libc::dup2(fd, 3)
            };
            if r == -1 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd.spawn().unwrap();
    let mut s = Server {
        child: Some(child),
        dir: dir.clone(),
        port,
        ports: Vec::new(),
    };
    // The socket was bound by us, not by shard: the port cannot have been bound twice.
    s.wait_workers(1);
    assert_eq!(get(s.addr(), "/ok").body_str(), "socket-activated");
    let log = std::fs::read_to_string(dir.join("logs/error.log")).unwrap();
    assert!(log.contains("using inherited sockets"), "{log}");
    let status = get(s.addr(), "/status").body_str();
    assert!(status.contains("\"backlog\":77"), "{status}");
    drop(l);
    s.signal(libc::SIGQUIT);
    assert_eq!(s.wait_exit(Duration::from_secs(10)), 0);
}

/// The new master of a binary upgrade deals new connections in turn as the old one did: the
/// old master leaves the groups' program to it, even when it is reloaded meanwhile (it used to
/// detach whatever program the group ran, the new master's included, while the new master went
/// on believing its program was attached).
#[test]
fn after_a_binary_upgrade_new_connections_are_still_dealt_in_turn() {
    // A long stall threshold: no verdict may re-deal the 40 connections counted below.
    let text = conf(4, "reuseport", "a").replace(
        "events { worker_connections 1024; }",
        "events { worker_connections 1024; reuseport_stall_threshold 10s; }",
    );
    let mut s = Server::start("upgrade-deal", &text, 4);
    let _reap = ReapMasters(s.dir.clone());
    if !wait_dealt(&s.dir, 1) {
        return;
    }
    let old = s.pid();
    let new = start_new_binary(&s, old);
    assert!(wait_dealt(&s.dir, 2), "the new master's program");
    // The old master reloads while the new one steers; then it stops.
    unsafe { libc::kill(old, libc::SIGHUP) };
    let log_path = s.dir.join("logs/error.log");
    wait_for(Duration::from_secs(10), "the old master's reload", || {
        std::fs::read_to_string(&log_path)
            .ok()?
            .contains("(SIGHUP) received, reconfiguring")
            .then_some(())
    });
    // Read after the reload (one signal at a time, in the master's one thread).
    unsafe { libc::kill(old, libc::SIGWINCH) };
    unsafe { libc::kill(old, libc::SIGQUIT) };
    assert_eq!(s.wait_exit(Duration::from_secs(10)), 0);
    wait_generation(&s, 1, 4);
    assert_dealt_in_turn(&s);
    unsafe { libc::kill(new, libc::SIGQUIT) };
    wait_for(Duration::from_secs(10), "new master exit", || {
        (!pid_alive(new)).then_some(())
    });
}
