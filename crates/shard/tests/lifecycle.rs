//! Worker respawn, graceful and fast stops, the pid file and `-s`.

mod support;

use std::io::{Read, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use support::*;

#[test]
fn killed_worker_is_respawned_with_its_index_and_no_waiting_connection_is_lost() {
    let mut s = Server::start("respawn", &base_conf(2, "reuseport", ""), 2);
    let before = s.wait_workers(2);
    let victim = before.iter().find(|w| w.idx == 1).unwrap().pid as i32;

    // A client that keeps opening connections while the worker dies and comes back.
    let stop = Arc::new(AtomicBool::new(false));
    let ok = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let client = {
        let (stop, ok, failed, addr) = (stop.clone(), ok.clone(), failed.clone(), s.addr());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                match try_get(addr, "/ok") {
                    Ok(r) if r.status == 200 => ok.fetch_add(1, Ordering::Relaxed),
                    _ => failed.fetch_add(1, Ordering::Relaxed),
                };
            }
        })
    };
    wait_for(Duration::from_secs(5), "client traffic", || {
        (ok.load(Ordering::Relaxed) > 50).then_some(())
    });
    // SAFETY: plain kill(2).
    unsafe { libc::kill(victim, libc::SIGKILL) };
    let after = wait_for(Duration::from_secs(10), "worker 1 respawned", || {
        let ws = parse_workers(&try_get(s.addr(), "/status").ok()?.body_str());
        let w1 = ws.iter().find(|w| w.idx == 1)?;
        (w1.pid as i32 != victim && w1.pid > 0 && pid_alive(w1.pid as i32)).then_some(ws)
    });
    let ok_at_respawn = ok.load(Ordering::Relaxed);
    wait_for(Duration::from_secs(5), "traffic after respawn", || {
        (ok.load(Ordering::Relaxed) > ok_at_respawn + 100).then_some(())
    });
    stop.store(true, Ordering::Relaxed);
    client.join().unwrap();

    assert_eq!(after.len(), 2);
    assert_eq!(after[0].pid, before[0].pid, "the other worker is untouched");
    // The client is sequential: only the one request inside the killed worker may fail.
    let failed = failed.load(Ordering::Relaxed);
    assert!(
        failed <= 1,
        "{failed} requests failed ({} ok)",
        ok.load(Ordering::Relaxed)
    );
    let log = std::fs::read_to_string(s.dir.join("logs/error.log")).unwrap();
    assert!(
        log.contains(&format!(
            "[alert] {}#0: worker process {victim} (worker 1) exited on signal 9, respawning",
            s.pid()
        )),
        "{log}"
    );
    // A worker told to stop directly (SIGTERM) exits with code 0: respawned, and logged as
    // nginx logs it, at notice (nginx-tests count alerts).
    let w0 = after[0].pid as i32;
    // SAFETY: plain kill(2).
    unsafe { libc::kill(w0, libc::SIGTERM) };
    let log = wait_for(Duration::from_secs(10), "worker 0 respawned", || {
        let l = std::fs::read_to_string(s.dir.join("logs/error.log")).ok()?;
        l.contains(&format!(
            "worker process {w0} (worker 0) exited with code 0, respawning"
        ))
        .then_some(l)
    });
    assert!(
        log.contains(&format!(
            "[notice] {}#0: worker process {w0} (worker 0) exited with code 0",
            s.pid()
        )),
        "{log}"
    );
    s.signal(libc::SIGQUIT);
    assert_eq!(s.wait_exit(Duration::from_secs(10)), 0);
}

#[test]
fn quit_lets_an_in_flight_download_finish_with_every_byte() {
    let conf = base_conf(1, "reuseport", "").replace("root ", "sendfile on; root ");
    let mut s = Server::start("quit", &conf, 1);
    let size = 48 << 20;
    let data: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
    write_file(&s.dir, "html/big.bin", &data);

    let mut c = connect(s.addr());
    c.write_all(b"GET /big.bin HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    // Read only the start, so the rest is still in flight when the stop begins.
    let mut first = vec![0u8; 64 * 1024];
    c.read_exact(&mut first).unwrap();

    s.signal(libc::SIGQUIT);
    // The listener closes: new connections are refused (or reset) once the stop has begun.
    let log_path = s.dir.join("logs/error.log");
    wait_for(Duration::from_secs(5), "graceful stop logged", || {
        std::fs::read_to_string(&log_path)
            .ok()?
            .contains("gracefully shutting down")
            .then_some(())
    });

    let mut rest = Vec::new();
    c.read_to_end(&mut rest).unwrap();
    let mut all = first;
    all.extend_from_slice(&rest);
    let head_end = find(&all, b"\r\n\r\n").unwrap() + 4;
    let head = String::from_utf8_lossy(&all[..head_end]).to_string();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert_eq!(all.len() - head_end, size, "every byte arrives");
    assert!(all[head_end..] == data[..], "bytes arrive intact");
    assert_eq!(s.wait_exit(Duration::from_secs(10)), 0);
}

#[test]
fn quit_closes_idle_keepalive_connections() {
    let mut s = Server::start("quitidle", &base_conf(1, "reuseport", ""), 1);
    let mut c = connect(s.addr());
    c.write_all(b"GET /ok HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    assert_eq!(read_response(&mut c, false).unwrap().status, 200);
    s.signal(libc::SIGQUIT);
    let mut buf = [0u8; 16];
    assert_eq!(c.read(&mut buf).unwrap(), 0, "idle connection closed");
    assert_eq!(s.wait_exit(Duration::from_secs(10)), 0);
}

#[test]
fn term_stops_fast_and_removes_the_pid_file() {
    let mut s = Server::start("term", &base_conf(2, "reuseport", ""), 2);
    let pid_file = s.dir.join("logs/shard.pid");
    let text = std::fs::read_to_string(&pid_file).unwrap();
    assert_eq!(text.trim().parse::<i32>().unwrap(), s.pid());
    s.signal(libc::SIGTERM);
    assert_eq!(s.wait_exit(Duration::from_secs(10)), 0);
    assert!(!pid_file.exists());
}

#[test]
fn dash_s_quit_signals_the_master_named_in_the_pid_file() {
    let mut s = Server::start("dashs", &base_conf(1, "reuseport", ""), 1);
    let prefix = s.dir.to_str().unwrap().to_string();
    let (code, err) = run_cli(&["-p", &prefix, "-c", "conf/shard.conf", "-s", "quit"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(s.wait_exit(Duration::from_secs(10)), 0);
    let (code, err) = run_cli(&["-p", &prefix, "-c", "conf/shard.conf", "-s", "quit"]);
    assert_eq!(code, 1);
    assert!(err.contains("shard.pid\" failed"), "{err}");
}

#[test]
fn usr1_reopens_the_access_log() {
    let s = Server::start("reopen", &base_conf(1, "reuseport", ""), 1);
    let log = s.dir.join("logs/access.log");
    let moved = s.dir.join("logs/access.log.1");
    std::fs::rename(&log, &moved).unwrap();
    s.signal(libc::SIGUSR1);
    wait_for(
        Duration::from_secs(10),
        "access.log reopened and written",
        || {
            let _ = try_get(s.addr(), "/ok");
            std::fs::read_to_string(&log)
                .ok()?
                .contains("GET /ok HTTP/1.1")
                .then_some(())
        },
    );
}

#[test]
fn a_request_finished_during_a_graceful_stop_is_answered_with_connection_close() {
    let mut s = Server::start("quitclose", &base_conf(1, "reuseport", ""), 1);
    let mut c = connect(s.addr());
    // Half of the request head before the stop, the rest after it.
    c.write_all(b"GET /ok HTTP/1.1\r\nHo").unwrap();
    let log = s.dir.join("logs/error.log");
    wait_for(Duration::from_secs(5), "connection accepted", || {
        let ws = parse_workers(&try_get(s.addr(), "/status").ok()?.body_str());
        (ws[0].active >= 2).then_some(())
    });
    s.signal(libc::SIGQUIT);
    wait_for(Duration::from_secs(5), "graceful stop logged", || {
        std::fs::read_to_string(&log)
            .ok()?
            .contains("gracefully shutting down")
            .then_some(())
    });
    c.write_all(b"st: x\r\n\r\n").unwrap();
    let mut all = Vec::new();
    c.read_to_end(&mut all).unwrap();
    let text = String::from_utf8_lossy(&all);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(text.contains("Connection: close\r\n"), "{text}");
    assert!(text.ends_with("OK"), "{text}");
    assert_eq!(s.wait_exit(Duration::from_secs(10)), 0);
}

#[test]
fn a_respawned_worker_continues_its_slots_counters_cpu_included() {
    let s = Server::start("respawn-counters", &base_conf(1, "reuseport", ""), 1);
    // Some CPU time on the worker's clock (status refreshes the answering worker's own).
    let before = wait_for(Duration::from_secs(20), "20 ms of worker CPU", || {
        for _ in 0..200 {
            get(s.addr(), "/ok");
        }
        let w = parse_workers(&get(s.addr(), "/status").body_str()).remove(0);
        (w.cpu_ms >= 20).then_some(w)
    });
    // SAFETY: plain kill(2).
    unsafe { libc::kill(before.pid as i32, libc::SIGKILL) };
    let after = wait_for(Duration::from_secs(10), "the worker respawned", || {
        let w = parse_workers(&try_get(s.addr(), "/status").ok()?.body_str()).remove(0);
        (w.pid != before.pid && w.pid > 0).then_some(w)
    });
    assert!(
        after.accepted > before.accepted,
        "{after:?} after {before:?}"
    );
    assert!(
        after.requests > before.requests,
        "{after:?} after {before:?}"
    );
    assert!(
        after.cpu_ms >= before.cpu_ms,
        "cpu_ms restarted: {after:?} after {before:?}"
    );
}

#[test]
fn dash_s_reload_reopen_and_stop_signal_the_master() {
    let mut s = Server::start("dashs-all", &base_conf(1, "reuseport", ""), 1);
    let prefix = s.dir.to_str().unwrap().to_string();
    let cli = |sig: &str| run_cli(&["-p", &prefix, "-c", "conf/shard.conf", "-s", sig]);
    // reload: a changed `return` text is served by generation 2.
    let conf = std::fs::read_to_string(s.dir.join("conf/shard.conf")).unwrap();
    std::fs::write(
        s.dir.join("conf/shard.conf"),
        conf.replace("return 200 \"OK\";", "return 200 \"reloaded\";"),
    )
    .unwrap();
    let (code, err) = cli("reload");
    assert_eq!(code, 0, "{err}");
    wait_for(Duration::from_secs(10), "the reloaded text", || {
        (try_get(s.addr(), "/ok").ok()?.body_str() == "reloaded").then_some(())
    });
    // reopen: a rotated error log is created again, and what follows is written there.
    std::fs::rename(s.dir.join("logs/error.log"), s.dir.join("logs/error.log.1")).unwrap();
    let (code, err) = cli("reopen");
    assert_eq!(code, 0, "{err}");
    wait_for(Duration::from_secs(10), "error.log reopened", || {
        s.dir.join("logs/error.log").exists().then_some(())
    });
    // stop: a fast stop, the pid file removed, its lines in the new error log.
    let (code, err) = cli("stop");
    assert_eq!(code, 0, "{err}");
    assert_eq!(s.wait_exit(Duration::from_secs(10)), 0);
    assert!(!s.dir.join("logs/shard.pid").exists());
    let log = std::fs::read_to_string(s.dir.join("logs/error.log")).unwrap();
    assert!(log.contains("(SIGTERM) received, exiting"), "{log}");
}

#[test]
fn int_stops_fast_as_term_does() {
    let mut s = Server::start("int-stop", &base_conf(1, "reuseport", ""), 1);
    let t = std::time::Instant::now();
    s.signal(libc::SIGINT);
    assert_eq!(s.wait_exit(Duration::from_secs(10)), 0);
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    let log = std::fs::read_to_string(s.dir.join("logs/error.log")).unwrap();
    assert!(log.contains("(SIGINT) received, exiting"), "{log}");
}
