//! `listen ... reuseport shards=N|auto`: fewer shards than workers.

mod support;

use support::*;

/// Listening sockets on `port` in the kernel's table (`/proc/net/tcp`, state 0A = LISTEN).
fn kernel_listeners(port: u16) -> usize {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
    let needle = format!(":{port:04X} ");
    table
        .lines()
        .skip(1)
        .filter(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() > 3 && format!("{} ", f[1]).ends_with(&needle) && f[3] == "0A"
        })
        .count()
}

fn shard_rows(status: &str) -> Vec<String> {
    let start = status.find("\"listeners\":[").unwrap() + 13;
    status[start..]
        .split("},")
        .filter(|r| r.contains("\"address\""))
        .map(str::to_string)
        .collect()
}

#[test]
fn two_shards_for_four_workers_are_two_kernel_sockets_each_polled_by_two_workers() {
    let s = Server::start("shards2", &base_conf(4, "reuseport shards=2", ""), 4);
    assert_eq!(
        kernel_listeners(s.port),
        2,
        "two sockets in the reuseport group"
    );
    let status = get(s.addr(), "/status").body_str();
    let rows = shard_rows(&status);
    assert_eq!(rows.len(), 2, "{status}");
    assert!(
        rows[0].contains("\"shard\":0,\"worker\":null,\"workers\":[0,2]"),
        "{status}"
    );
    assert!(
        rows[1].contains("\"shard\":1,\"worker\":null,\"workers\":[1,3]"),
        "{status}"
    );

    let before = s.workers();
    for _ in 0..400 {
        assert_eq!(get(s.addr(), "/ok").status, 200);
    }
    let after = s.workers();
    let got: Vec<u64> = before
        .iter()
        .zip(&after)
        .map(|(b, a)| a.accepted - b.accepted)
        .collect();
    assert!(got.iter().all(|&n| n > 0), "every worker accepts: {got:?}");
    let (shard0, shard1) = (got[0] + got[2], got[1] + got[3]);
    assert!(
        shard0 >= 80 && shard1 >= 80,
        "connections spread over the shards: {got:?}"
    );
}

#[test]
fn shared_shards_work_with_the_accept_mutex() {
    let s = Server::start(
        "shardsmutex",
        &base_conf(
            4,
            "reuseport shards=2",
            "accept_mutex on; accept_mutex_delay 10ms;",
        ),
        4,
    );
    for _ in 0..100 {
        assert_eq!(get(s.addr(), "/ok").status, 200);
    }
    assert!(total_accepted(&s.workers()) >= 100);
}

#[test]
fn one_shard_behaves_as_a_shared_socket() {
    let s = Server::start("shards1", &base_conf(2, "reuseport shards=1", ""), 2);
    assert_eq!(kernel_listeners(s.port), 1);
    let rows = shard_rows(&get(s.addr(), "/status").body_str());
    assert_eq!(rows.len(), 1);
    assert!(
        rows[0].contains("\"shard\":0,\"worker\":null,\"workers\":[0,1]"),
        "{rows:?}"
    );
    for _ in 0..50 {
        assert_eq!(get(s.addr(), "/ok").status, 200);
    }
    // The start-up line says what /status says: one shard, shared by the workers.
    let log = std::fs::read_to_string(s.dir.join("logs/error.log")).unwrap();
    assert!(
        log.contains(&format!("127.0.0.1:{} (reuseport, 1 shared shard)", s.port)),
        "{log}"
    );
}

#[test]
fn shards_auto_is_one_per_eight_cpus() {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let s = Server::start("shardsauto", &base_conf(2, "reuseport shards=auto", ""), 2);
    let want = (cpus / 8).clamp(1, 2);
    assert_eq!(kernel_listeners(s.port), want, "{cpus} CPUs");
    assert_eq!(get(s.addr(), "/ok").status, 200);
}

#[test]
fn shard_configuration_errors_name_the_place() {
    let dir = temp_dir("shardserr");
    let conf = |listen: &str| {
        format!("worker_processes 2;\nevents {{}}\nhttp {{\n  server {{\n    listen {listen};\n  }}\n}}\n")
    };
    let cases = [
        (
            "127.0.0.1:8080 reuseport shards=3",
            "\"shards=3\" of 127.0.0.1:8080 is more than the 2 worker processes in ",
        ),
        (
            "127.0.0.1:8080 shards=2",
            "the \"shards\" parameter requires \"reuseport\" in ",
        ),
        (
            "127.0.0.1:8080 reuseport shards=0",
            "invalid shards \"0\" in ",
        ),
    ];
    for (listen, want) in cases {
        std::fs::write(dir.join("conf/shard.conf"), conf(listen)).unwrap();
        let (code, err) = run_cli(&["-p", dir.to_str().unwrap(), "-t"]);
        assert_eq!(code, 1, "{listen}: {err}");
        assert!(
            err.contains(want) && err.contains("shard.conf:5"),
            "{listen}: {err}"
        );
    }
}
