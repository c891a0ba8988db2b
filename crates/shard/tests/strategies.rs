//! Every accept strategy serves, and reuseport spreads new connections over every worker.

mod support;

use std::io::Write;
use std::time::Duration;

use support::*;

/// Sends `n` requests for `/ok`, each on a new connection, and checks every answer.
fn hammer(s: &Server, n: usize) {
    for i in 0..n {
        let r = get(s.addr(), "/ok");
        assert_eq!(r.status, 200, "request {i}");
        assert_eq!(r.body_str(), "OK");
    }
}

fn listener_rows(s: &Server) -> String {
    get(s.addr(), "/status").body_str()
}

#[test]
fn reuseport_serves_and_lists_one_shard_per_worker() {
    let s = Server::start("reuseport", &base_conf(2, "reuseport", ""), 2);
    hammer(&s, 50);
    let status = listener_rows(&s);
    assert!(status.contains("\"shard\":0,\"worker\":0"), "{status}");
    assert!(status.contains("\"shard\":1,\"worker\":1"), "{status}");
    assert!(total_accepted(&s.workers()) >= 50);
}

#[test]
fn the_accept_mutex_is_ignored_for_reuseport_listeners() {
    // As nginx: a reuseport socket belongs to one worker, so there is nothing to lock.
    let s = Server::start(
        "reuseport-mutex",
        &base_conf(2, "reuseport", "accept_mutex on;"),
        2,
    );
    hammer(&s, 50);
    let status = listener_rows(&s);
    assert!(status.contains("\"shard\":0,\"worker\":0"), "{status}");
    assert!(status.contains("\"shard\":1,\"worker\":1"), "{status}");
}

#[test]
fn epollexclusive_rearms_so_one_worker_does_not_take_every_connection() {
    // EPOLLEXCLUSIVE wakes the last worker to wait; re-adding the listener every 16 accepts
    // (nginx 1.21.6) moves it to the back. 400 sequential connections: each worker takes a
    // real share.
    let s = Server::start("exclusive-rearm", &base_conf(2, "", "accept_mutex off;"), 2);
    hammer(&s, 400);
    let ws = s.workers();
    let total: u64 = ws.iter().map(|w| w.accepted).sum();
    for w in &ws {
        assert!(
            w.accepted * 10 >= total,
            "worker {} accepted {} of {total}: {ws:?}",
            w.idx,
            w.accepted
        );
    }
}

#[test]
fn shared_socket_with_epollexclusive_serves() {
    let s = Server::start("exclusive", &base_conf(2, "", "accept_mutex off;"), 2);
    hammer(&s, 50);
    let status = listener_rows(&s);
    assert!(
        status.contains("\"shard\":null,\"worker\":null"),
        "{status}"
    );
    assert!(total_accepted(&s.workers()) >= 50);
}

#[test]
fn shared_socket_with_accept_mutex_serves() {
    let s = Server::start(
        "mutex",
        &base_conf(2, "", "accept_mutex on; accept_mutex_delay 20ms;"),
        2,
    );
    hammer(&s, 50);
    assert!(total_accepted(&s.workers()) >= 50);
}

#[test]
fn multi_accept_and_deferred_serve() {
    let s = Server::start(
        "multi",
        &base_conf(2, "reuseport deferred backlog=64", "multi_accept on;"),
        2,
    );
    hammer(&s, 30);
    let status = listener_rows(&s);
    assert!(status.contains("\"backlog\":64"), "{status}");
}

#[test]
fn reuseport_spreads_400_connections_over_4_workers() {
    let s = Server::start("spread", &base_conf(4, "reuseport", ""), 4);
    let before = s.workers();
    hammer(&s, 400);
    let after = s.workers();
    for (b, a) in before.iter().zip(&after) {
        let got = a.accepted - b.accepted;
        assert!(
            got >= 40,
            "worker {} accepted {got} of 400 connections (< 10%): {after:?}",
            a.idx
        );
    }
}

#[test]
fn refused_reuseport_falls_back_to_a_shared_socket_and_says_so_once() {
    let s = Server::start_env(
        "noreuse",
        &base_conf(2, "reuseport", ""),
        2,
        &[("SHARD_TEST_NO_REUSEPORT", "1")],
    );
    hammer(&s, 20);
    let status = listener_rows(&s);
    assert!(status.contains("\"shard\":null"), "{status}");
    let log = std::fs::read_to_string(s.dir.join("logs/error.log")).unwrap();
    assert_eq!(log.matches("SO_REUSEPORT").count(), 1, "{log}");
}

#[test]
fn stub_status_has_nginx_format() {
    let s = Server::start("stub", &base_conf(1, "reuseport", ""), 1);
    // One idle keep-alive connection shows as waiting.
    let mut idle = connect(s.addr());
    idle.write_all(b"GET /ok HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    read_response(&mut idle, false).unwrap();
    let body = get(s.addr(), "/stub").body_str();
    let lines: Vec<&str> = body.lines().collect();
    assert_eq!(lines.len(), 4, "{body}");
    assert!(lines[0].starts_with("Active connections: "), "{body}");
    assert_eq!(lines[1], "server accepts handled requests");
    let nums: Vec<u64> = lines[2]
        .split_whitespace()
        .map(|n| n.parse().unwrap())
        .collect();
    assert_eq!(nums.len(), 3);
    assert!(nums[0] >= 2 && nums[1] == nums[0] && nums[2] >= 2, "{body}");
    assert!(
        lines[3].starts_with("Reading: ")
            && lines[3].contains(" Writing: ")
            && lines[3].contains(" Waiting: 1"),
        "{body}"
    );
    let prom = get(s.addr(), "/status?format=prometheus").body_str();
    assert!(
        prom.contains("shard_worker_accepted_total{worker=\"0\""),
        "{prom}"
    );
    // Every name docs/metrics.md lists, with its TYPE line.
    for (name, kind) in [
        ("shard_worker_accepted_total", "counter"),
        ("shard_worker_requests_total", "counter"),
        ("shard_worker_active", "gauge"),
        ("shard_worker_cpu_seconds_total", "counter"),
        ("shard_worker_heartbeat_age_seconds", "gauge"),
        ("shard_worker_budget_yields_total", "counter"),
        ("shard_worker_adopted_total", "counter"),
        ("shard_worker_accept_pauses_total", "counter"),
        ("shard_worker_body_memory_bytes", "gauge"),
        ("shard_worker_body_spooled_bytes_total", "counter"),
        ("shard_worker_body_temp_files", "gauge"),
        ("shard_listener_queue", "gauge"),
        ("shard_listener_backlog", "gauge"),
    ] {
        assert!(
            prom.contains(&format!("# TYPE {name} {kind}\n")),
            "{name}: {prom}"
        );
        assert!(
            prom.contains(&format!("\n{name}{{")),
            "{name} has no sample: {prom}"
        );
    }
    drop(idle);
}

/// A connection that has sent nothing yet counts as waiting (as nginx's), and the numbers are
/// `$connections_active`, `_reading`, `_writing`, `_waiting` too.
#[test]
fn connections_variables_and_a_silent_connection_waits() {
    let s = Server::start(
        "stub-vars",
        "worker_processes 1;\nevents { worker_connections 64; }\nhttp {\n access_log off;\n\
         server {\n listen 127.0.0.1:{port};\n location = /stub { stub_status; }\n location = /status { shard_status; }\n\
         location / { return 200 \"$connections_active $connections_reading $connections_writing $connections_waiting\"; }\n }\n}\n",
        1,
    );
    let silent = connect(s.addr());
    wait_for(
        Duration::from_secs(5),
        "the silent connection counted",
        || {
            let body = get(s.addr(), "/").body_str();
            // This request's connection writes; the silent one waits.
            (body == "2 0 1 1").then_some(())
        },
    );
    let stub = get(s.addr(), "/stub").body_str();
    assert!(stub.contains("Reading: 0 Writing: 1 Waiting: 1 "), "{stub}");
    // Its first byte makes it a reading one.
    let mut silent = silent;
    silent.write_all(b"GET / HTTP/1.1\r\n").unwrap();
    wait_for(Duration::from_secs(5), "the connection reading", || {
        (get(s.addr(), "/").body_str() == "2 1 1 0").then_some(())
    });
    drop(silent);
    wait_for(Duration::from_secs(5), "the connection gone", || {
        (get(s.addr(), "/").body_str() == "1 0 1 0").then_some(())
    });
}
