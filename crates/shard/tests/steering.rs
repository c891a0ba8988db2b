//! `reuseport_steering`: a stopped worker's shard gets no new connection and its queue is
//! drained by its siblings; `off` is nginx's behaviour (connections wait for the stopped
//! worker); the spread comes back when the worker does; reload and respawn keep all of it.

mod support;

use std::io::Write;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use support::*;

fn conf(workers: usize, events: &str) -> String {
    format!(
        r#"
worker_processes {workers};
error_log logs/error.log info;
pid logs/shard.pid;
events {{ {events} }}
http {{
    keepalive_timeout 0;
    server {{
        listen 127.0.0.1:{{port}} reuseport;
        location = /status {{ shard_status; }}
        location = /metrics {{ shard_status; }}
        location = /ok {{ return 200 "OK"; }}
    }}
}}
"#
    )
}

/// Resumes a stopped process when the test ends, however it ends.
struct Cont(i32);
impl Drop for Cont {
    fn drop(&mut self) {
        unsafe { libc::kill(self.0, libc::SIGCONT) };
    }
}

fn stop(pid: u64) -> Cont {
    unsafe { libc::kill(pid as i32, libc::SIGSTOP) };
    Cont(pid as i32)
}

/// One new connection, one request: how long the answer took, or `None` past `limit`.
fn one(addr: SocketAddr, limit: Duration) -> Option<Duration> {
    let t0 = Instant::now();
    let mut c = std::net::TcpStream::connect_timeout(&addr, limit).ok()?;
    c.set_read_timeout(Some(limit)).unwrap();
    c.write_all(b"GET /ok HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .ok()?;
    let r = read_response(&mut c, false).ok()?;
    (r.status == 200).then(|| t0.elapsed())
}

/// `n` new connections from `threads` clients at once; each one's answer time (`None`: no
/// answer within `limit`).
fn burst(addr: SocketAddr, n: usize, threads: usize, limit: Duration) -> Vec<Option<Duration>> {
    let per = n / threads;
    let hs: Vec<_> = (0..threads)
        .map(|_| std::thread::spawn(move || (0..per).map(|_| one(addr, limit)).collect::<Vec<_>>()))
        .collect();
    hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
}

fn status(s: &Server) -> String {
    get(s.addr(), "/status").body_str()
}

/// Polls `/status` until worker `idx` reads stalled (`true`) or not.
fn wait_stalled(s: &Server, idx: usize, want: bool) {
    let pat = format!("\"stalled\":{want}");
    wait_for(Duration::from_secs(10), "the master's verdict", || {
        let st = try_get(s.addr(), "/status").ok()?.body_str();
        let w = st.split("{\"idx\":").nth(idx + 1)?;
        let w = &w[..w.find('}')?];
        w.contains(&pat).then_some(())
    });
}

#[test]
fn a_stopped_workers_shard_gets_no_new_connection() {
    let mut s = Server::start("steer-on", &conf(2, ""), 2);
    let ws = s.wait_workers(2);
    let _cont = stop(ws[1].pid);
    let t0 = Instant::now();
    let took = burst(s.addr(), 200, 10, Duration::from_secs(1));
    let late = took.iter().filter(|t| t.is_none()).count();
    assert_eq!(
        late,
        0,
        "{late} of 200 new connections got no answer within 1 s ({:?} in all)",
        t0.elapsed()
    );
    let worst = took.iter().flatten().max().unwrap();
    // The stalled worker is noticed within about 25 ms; what the kernel queued on its shard
    // before that is drained by its sibling.
    assert!(*worst < Duration::from_secs(1), "{worst:?}");
    let st = status(&s);
    assert!(st.contains("\"stalled\":true"), "{st}");
    assert!(st.contains("\"steered_away\":true"), "{st}");
    let m = get(s.addr(), "/metrics?format=prometheus").body_str();
    assert!(
        m.lines()
            .any(|l| l.starts_with("shard_worker_stalled{worker=\"1\"") && l.ends_with(" 1")),
        "{m}"
    );
    assert!(
        m.lines()
            .any(|l| l.starts_with("shard_listener_steered_away{")
                && l.contains("shard=\"1\"")
                && l.ends_with(" 1")),
        "{m}"
    );
    let w = parse_workers(&st);
    assert_eq!(w[1].stalls, 1, "{st}");
    assert!(
        error_log(&s).contains("worker 1 (pid "),
        "{}",
        error_log(&s)
    );
}

/// The same test with `reuseport_steering off` shows what it prevents: connections the kernel
/// hashed to the stopped worker wait for it (or, after 3 s, for a sibling's adoption).
#[test]
fn with_steering_off_connections_wait_for_the_stopped_worker() {
    let mut s = Server::start("steer-off", &conf(2, "reuseport_steering off;"), 2);
    let ws = s.wait_workers(2);
    let cont = stop(ws[1].pid);
    let took = burst(s.addr(), 200, 10, Duration::from_secs(1));
    let late = took.iter().filter(|t| t.is_none()).count();
    drop(cont);
    assert!(
        late > 0,
        "every connection was answered within 1 s with steering off: the steering test proves nothing"
    );
    assert!(!error_log(&s).contains("stalled"));
}

/// Connections the kernel queued on the shard before the stall was noticed (a long threshold
/// makes that window wide) are served by the sibling, which counts them as `stolen`.
#[test]
fn a_stopped_workers_queue_is_drained_by_its_sibling() {
    let mut s = Server::start(
        "steer-drain",
        &conf(2, "reuseport_stall_threshold 300ms;"),
        2,
    );
    let ws = s.wait_workers(2);
    let _cont = stop(ws[1].pid);
    let addr = s.addr();
    // All connected and sent at once, well within the 300 ms: about half land on shard 1,
    // fewer than the queue that makes siblings help a live worker (`STEAL_QUEUE_MIN`), so
    // only the stall verdict frees them.
    let mut conns: Vec<_> = (0..12)
        .map(|_| {
            let mut c = connect(addr);
            c.write_all(b"GET /ok HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                .unwrap();
            c
        })
        .collect();
    let t0 = Instant::now();
    for c in &mut conns {
        c.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        let r = read_response(c, false).expect("a queued connection was not served");
        assert_eq!(r.status, 200);
    }
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    let w = parse_workers(&status(&s));
    assert!(w[0].stolen > 0, "{w:?}");
    // Stopped while it waited ("connections wait in its queue") or, when the stop caught the
    // end of its last turn, mid-turn ("its loop has not turned").
    let log = error_log(&s);
    assert!(log.contains(") stalled: "), "{log}");
}

/// After `SIGCONT` the worker is live again and takes its share of new connections.
#[test]
fn recovery_restores_the_spread() {
    let mut s = Server::start("steer-back", &conf(2, ""), 2);
    let ws = s.wait_workers(2);
    let cont = stop(ws[1].pid);
    let took = burst(s.addr(), 40, 4, Duration::from_secs(2));
    assert!(took.iter().all(Option::is_some));
    wait_stalled(&s, 1, true);
    drop(cont);
    wait_stalled(&s, 1, false);
    let st = status(&s);
    assert!(!st.contains("\"steered_away\":true"), "{st}");
    let before = parse_workers(&st);
    for _ in 0..400 {
        assert!(one(s.addr(), Duration::from_secs(2)).is_some());
    }
    let after = parse_workers(&status(&s));
    for i in 0..2 {
        // The status requests themselves count too: a handful.
        let share = (after[i].accepted - before[i].accepted) as f64 / 402.0;
        assert!(
            share >= 0.30,
            "worker {i} took {share:.2} of 400: {after:?}"
        );
    }
    assert!(error_log(&s).contains("worker 1 is live again after"));
}

/// A reload while a worker is stopped: the new generation serves every shard (the stopped old
/// worker holds only what it had accepted), and a stall in the new generation is steered too.
#[test]
fn reload_while_a_worker_is_stopped_loses_nothing() {
    let mut s = Server::start("steer-reload", &conf(2, ""), 2);
    let ws = s.wait_workers(2);
    let _old = stop(ws[1].pid);
    s.signal(libc::SIGHUP);
    let fresh = wait_for(Duration::from_secs(10), "the new generation", || {
        let w = parse_workers(&try_get(s.addr(), "/status").ok()?.body_str());
        (w.len() == 2
            && w.iter()
                .all(|w| w.pid != 0 && w.pid != ws[0].pid && w.pid != ws[1].pid))
        .then_some(w)
    });
    let took = burst(s.addr(), 200, 10, Duration::from_secs(1));
    assert!(took.iter().all(Option::is_some), "{took:?}");
    let _new = stop(fresh[0].pid);
    let took = burst(s.addr(), 200, 10, Duration::from_secs(1));
    assert_eq!(took.iter().filter(|t| t.is_none()).count(), 0);
    wait_stalled(&s, 0, true);
}

/// A worker killed while its sibling is stopped: for a moment nobody serves, then the
/// respawned worker takes every new connection and drains the stopped one's shard.
#[test]
fn respawn_while_a_worker_is_stopped_loses_nothing() {
    let mut s = Server::start("steer-respawn", &conf(2, ""), 2);
    let ws = s.wait_workers(2);
    let _cont = stop(ws[1].pid);
    unsafe { libc::kill(ws[0].pid as i32, libc::SIGKILL) };
    wait_for(Duration::from_secs(10), "the respawned worker", || {
        let w = parse_workers(&try_get(s.addr(), "/status").ok()?.body_str());
        (w.len() == 2 && w[0].pid != ws[0].pid && w[0].pid != 0).then_some(())
    });
    let took = burst(s.addr(), 200, 10, Duration::from_secs(1));
    assert_eq!(took.iter().filter(|t| t.is_none()).count(), 0);
}

/// Two workers with `env` set to 1, worker 1 stopped: 200 new connections are all answered
/// within 1 s, and the master has judged worker 1 stalled. The stopped worker resumes when the
/// returned guard drops.
fn stopped_and_served(name: &str, env: &str) -> (Server, Cont) {
    let mut s = Server::start_env(name, &conf(2, ""), 2, &[(env, "1")]);
    let ws = s.wait_workers(2);
    let cont = stop(ws[1].pid);
    let took = burst(s.addr(), 200, 10, Duration::from_secs(1));
    assert_eq!(took.iter().filter(|t| t.is_none()).count(), 0);
    wait_stalled(&s, 1, true);
    (s, cont)
}

/// A kernel that refuses reuseport programs: the master says so once, new connections keep
/// reaching the stopped worker's shard, and its sibling still drains it.
#[test]
fn without_cbpf_the_sibling_still_drains_a_stopped_workers_shard() {
    let (s, _cont) = stopped_and_served("steer-nocbpf", "SHARD_TEST_NO_CBPF");
    let st = status(&s);
    assert!(!st.contains("\"steered_away\":true"), "{st}");
    let log = error_log(&s);
    assert_eq!(
        log.matches("setsockopt(SO_ATTACH_REUSEPORT_CBPF) for")
            .count(),
        1,
        "{log}"
    );
    assert!(parse_workers(&st)[0].stolen > 0);
}

/// Busy, not stalled yet (a threshold of 10 s): a worker whose queue grows past the others' is
/// steered away for as long as it is longer, so new connections do not join it.
#[test]
fn a_backlogged_worker_gets_no_new_connection_before_it_counts_as_stalled() {
    // The busy-worker rule alone: a tick that sees both queues long (the live worker's
    // briefly, under the burst) could start the funnel, which is tested on its own below.
    let mut s = Server::start_env(
        "steer-backlog",
        &conf(2, "reuseport_stall_threshold 10s;"),
        2,
        &[("SHARD_STEER_FUNNEL", "off")],
    );
    let ws = s.wait_workers(2);
    let _cont = stop(ws[1].pid);
    let addr = s.addr();
    // About half of these queue on the stopped worker's shard (the kernel's hash of the
    // 4-tuple). It counts as backlogged at 8 (its queue is then the mean of 0 and 8, plus
    // BACKLOG_GAP_MIN), which 64 connections reach but for a chance of about 1e-11 (24 missed
    // it about once in 30 runs).
    let _held: Vec<_> = (0..64)
        .map(|_| {
            let mut c = connect(addr);
            c.write_all(b"GET /ok HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                .unwrap();
            c
        })
        .collect();
    // A status request the kernel hashes to the stopped worker's shard before the master's
    // next look (up to 50 ms while every worker seemed idle) waits there: give up on it
    // quickly and ask again.
    wait_for(Duration::from_secs(5), "worker 1 steered away", || {
        let mut c = std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(300)).ok()?;
        c.set_read_timeout(Some(Duration::from_millis(300))).ok()?;
        c.write_all(b"GET /status HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .ok()?;
        let st = read_response(&mut c, false).ok()?.body_str();
        st.contains("\"steered_away\":true").then_some(())
    });
    // One client at a time: the live worker's queue stays near empty, so the stopped one's
    // stays above the mean (a burst that queues more on the live worker than the stopped one
    // holds would end the backlog, by design, and send it connections again).
    let took = burst(addr, 100, 1, Duration::from_secs(1));
    assert_eq!(took.iter().filter(|t| t.is_none()).count(), 0);
    let st = status(&s);
    assert!(!st.contains("\"stalled\":true"), "{st}");
    assert_eq!(parse_workers(&st)[1].stalls, 0);
}

/// Each listening socket's accept queue on `port` (`/proc/net/tcp`'s `rx_queue` of a socket in
/// `LISTEN`): one entry per shard.
fn listen_queues(port: u16) -> Vec<u32> {
    let want = format!(":{port:04X}");
    std::fs::read_to_string("/proc/net/tcp")
        .unwrap_or_default()
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let listening = f.get(3) == Some(&"0A") && f.get(1)?.ends_with(&want);
            let rx = f.get(4)?.split(':').nth(1)?;
            listening
                .then(|| u32::from_str_radix(rx, 16).ok())
                .flatten()
        })
        .collect()
}

/// Saturated, every worker with connections queued: new connections go to one shard, which
/// every worker of the group polls, so the group serves one queue in order (E3 in
/// docs/bench.md). Both workers stopped (not stalled before 10 s) while 64 connections queue:
/// the next ones join one shard only; resumed, the workers answer every connection, and once
/// the queues drained each shard takes new connections again.
#[test]
fn a_saturated_server_serves_one_queue_and_comes_back_to_per_worker_queues() {
    let mut s = Server::start(
        "steer-funnel",
        &conf(2, "reuseport_stall_threshold 10s;"),
        2,
    );
    let ws = s.wait_workers(2);
    let addr = s.addr();
    let stopped = Instant::now();
    let cont0 = stop(ws[0].pid);
    let cont1 = stop(ws[1].pid);
    let send = |n: usize| -> Vec<std::net::TcpStream> {
        (0..n)
            .map(|_| {
                let mut c = connect(addr);
                c.write_all(b"GET /ok HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                    .unwrap();
                c
            })
            .collect()
    };
    // About half on each shard: both well past FUNNEL_ENTER_QUEUE (4).
    let mut held = send(64);
    wait_for(Duration::from_secs(5), "the funnel", || {
        error_log(&s)
            .contains("new connections go to the shards of workers [0]")
            .then_some(())
    });
    let before = listen_queues(addr.port());
    assert_eq!(before.len(), 2, "{before:?}");
    held.extend(send(20));
    let after = wait_for(Duration::from_secs(5), "20 more queued", || {
        let q = listen_queues(addr.port());
        (q.iter().sum::<u32>() == before.iter().sum::<u32>() + 20).then_some(q)
    });
    let grew: Vec<u32> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
    assert!(
        grew.contains(&20) && grew.contains(&0),
        "{before:?} -> {after:?}"
    );
    // Worker 1 alone resumed: it answers every connection, those queued on worker 0's shard
    // too, which only the funnel's bit has it poll before 3 s (worker 0 is not stalled before
    // 10 s; a shard whose worker has had no heartbeat for 3 s is adopted anyway).
    drop(cont1);
    for mut c in held {
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        assert_eq!(read_response(&mut c, false).unwrap().status, 200);
    }
    assert!(
        stopped.elapsed() < Duration::from_millis(2500),
        "answered only after {:?}, by the 3 s fallback",
        stopped.elapsed()
    );
    drop(cont0);
    wait_for(Duration::from_secs(5), "the funnel's end", || {
        error_log(&s).contains("the queues drained").then_some(())
    });
    let st = wait_for(Duration::from_secs(5), "no shard steered away", || {
        let st = try_get(addr, "/status").ok()?.body_str();
        (!st.contains("\"steered_away\":true")).then_some(st)
    });
    assert!(parse_workers(&st)[1].stolen > 0, "{st}");
    // Per-worker queues again: both workers take new connections.
    let before: Vec<u64> = parse_workers(&st).iter().map(|w| w.accepted).collect();
    let took = burst(addr, 200, 4, Duration::from_secs(2));
    assert!(took.iter().all(Option::is_some));
    let st = status(&s);
    for (w, b) in parse_workers(&st).iter().zip(&before) {
        assert!(w.accepted - b >= 30, "{st}");
    }
}

/// `reuseport_steering on` deals new connections in turn (an eBPF program): 40 connections
/// one after the other over 4 workers give each 10, where the kernel's hash (or a random draw)
/// gives a binomial spread. Needs a master that may load eBPF (root here); says SKIPPED where
/// `bpf(2)` is refused.
#[test]
fn new_connections_are_dealt_to_the_workers_in_turn() {
    // A long stall threshold: no verdict may re-deal the 40 connections counted below.
    let mut s = Server::start("steer-deal", &conf(4, "reuseport_stall_threshold 10s;"), 4);
    s.wait_workers(4);
    if !wait_dealt(&s.dir, 1) {
        return;
    }
    wait_for(Duration::from_secs(10), "round_robin in /status", || {
        status(&s)
            .contains("\"steering_program\":\"round_robin\"")
            .then_some(())
    });
    assert_dealt_in_turn(&s);
    // A reload keeps the groups dealt: the program is not replaced (nor logged again).
    let old: Vec<u64> = s.workers().iter().map(|w| w.pid).collect();
    s.signal(libc::SIGHUP);
    wait_generation(&s, 2, 4);
    wait_stopped_accepting(&s, &old);
    assert_dealt_in_turn(&s);
    let log = error_log(&s);
    assert_eq!(log.matches(DEALT_LINE).count(), 1, "{log}");
    let metrics = get(s.addr(), "/metrics?format=prometheus").body_str();
    assert!(
        metrics.contains("shard_steering_program{program=\"round_robin\"} 1"),
        "{metrics}"
    );
}

/// A master that may not load eBPF says so once and steers with the classic program: a
/// stopped worker's shard still gets no new connection.
#[test]
fn without_ebpf_a_stopped_worker_is_still_steered_around() {
    let (s, _cont) = stopped_and_served("steer-noebpf", "SHARD_TEST_NO_EBPF");
    let st = status(&s);
    assert!(st.contains("\"steered_away\":true"), "{st}");
    assert!(st.contains("\"steering_program\":\"random\""), "{st}");
    let log = error_log(&s);
    assert_eq!(log.matches("bpf(2) refused").count(), 1, "{log}");
    assert!(!log.contains("are dealt in turn"), "{log}");
}
