//! The status pages: `stub_status` (nginx's exact text) and `shard_status` (JSON or Prometheus).
//!
//! Rendering only: the numbers come from the shared region and from `TCP_INFO` on the listening
//! sockets, read by the caller. Any worker can answer for all workers because the counters live
//! in shared memory.

use std::fmt::Write;
use std::sync::atomic::Ordering::Relaxed;

use crate::shm::{Region, STEER_STALLED};

/// One listening socket as the status pages show it.
pub struct ListenerRow {
    pub address: String,
    /// Shard index, or `None` for a shared socket.
    pub shard: Option<usize>,
    /// Owning worker: `Some` only when exactly one worker polls the socket (a per-worker shard).
    pub worker: Option<usize>,
    /// Every worker that polls the socket (all of them for a shared socket; `k mod N` for a
    /// shard of `shards=N`).
    pub workers: Vec<usize>,
    pub queue: u32,
    pub backlog: u32,
    /// The owning worker is stalled (`reuseport_steering`).
    pub stalled: bool,
    /// The group's program sends this shard no new connection: its worker is stalled, or its
    /// queue is longer than the others'.
    pub steered_away: bool,
}

#[derive(Default, Clone, Copy)]
struct Totals {
    accepted: u64,
    handled: u64,
    requests: u64,
    active: u64,
    reading: u64,
    writing: u64,
    waiting: u64,
}

/// Indices into `WorkerSlot::counters`.
const C_ACCEPTED: usize = 0;
const C_HANDLED: usize = 1;
const C_REQUESTS: usize = 2;
const C_CPU_MS: usize = 3;
const C_TLS_US: usize = 13;

/// stub_status's numbers: the counters over every worker of every generation (they survive
/// reloads, as nginx's), the gauges over every live worker, old generations' included (nginx
/// counts their connections too).
fn totals(region: &Region) -> Totals {
    let mut t = region.read_consistent(|r| Totals {
        accepted: r.counter_total(C_ACCEPTED),
        handled: r.counter_total(C_HANDLED),
        requests: r.counter_total(C_REQUESTS),
        ..Totals::default()
    });
    for w in region.workers.iter().filter(|w| w.pid.load(Relaxed) != 0) {
        t.active += w.active.load(Relaxed);
        t.reading += w.reading.load(Relaxed);
        t.writing += w.writing.load(Relaxed);
        t.waiting += w.waiting.load(Relaxed);
    }
    t
}

impl shard_http::vars::Connections for Region {
    fn connections(&self) -> [u64; 4] {
        let t = totals(self);
        [t.active, t.reading, t.writing, t.waiting]
    }
}

/// nginx's `stub_status` text, byte for byte (including its trailing spaces), so that existing
/// scrapers such as the Prometheus nginx exporter parse it.
pub fn stub(region: &Region, out: &mut Vec<u8>) {
    let t = totals(region);
    let mut s = String::with_capacity(128);
    let _ = write!(
        s,
        "Active connections: {} \nserver accepts handled requests\n {} {} {} \nReading: {} Writing: {} Waiting: {} \n",
        t.active, t.accepted, t.handled, t.requests, t.reading, t.writing, t.waiting
    );
    out.extend_from_slice(s.as_bytes());
}

fn opt(v: Option<usize>) -> String {
    v.map_or_else(|| "null".to_string(), |v| v.to_string())
}

/// `shard_status` as JSON.
pub fn json(region: &Region, listeners: &[ListenerRow], now_ms: u64, out: &mut Vec<u8>) {
    let mut s = String::with_capacity(
        256 + 200 * region.n_workers.load(Relaxed) as usize + 120 * listeners.len(),
    );
    let _ = write!(
        s,
        "{{\"generation\":{},\"steering_program\":\"{}\",\"workers\":[",
        region.generation.load(Relaxed),
        crate::shm::program_name(region.steer_program.load(Relaxed))
    );
    for (i, w) in region.current().enumerate() {
        if i > 0 {
            s.push(',');
        }
        let _ = write!(
            s,
            "{{\"idx\":{i},\"pid\":{},\"accepted\":{},\"handled\":{},\"requests\":{},\"active\":{},\
             \"reading\":{},\"writing\":{},\"waiting\":{},\"cpu_ms\":{},\"heartbeat_age_ms\":{},\
             \"budget_yields\":{},\"adopted\":{},\"accept_pauses\":{},\"body_mem_bytes\":{},\
             \"body_spooled_bytes\":{},\"body_temp_files\":{},\"stolen\":{},\"stalls\":{},\
             \"stalled\":{},\"file_cache_hits\":{},\"file_cache_misses\":{},\"file_cache_entries\":{},\
             \"tls_handshakes\":{},\"tls_handshake_cpu_ms\":{},\"tls_handshakes_deferred\":{},\"h2_rebalanced\":{},\
             \"quic_connections\":{},\"quic_datagrams\":{},\"quic_strays\":{},\"quic_retries\":{},\
             \"quic_0rtt\":{},\"quic_by_cid\":{},\"quic_by_hash\":{}}}",
            w.pid.load(Relaxed),
            w.accepted.load(Relaxed),
            w.handled.load(Relaxed),
            w.requests.load(Relaxed),
            w.active.load(Relaxed),
            w.reading.load(Relaxed),
            w.writing.load(Relaxed),
            w.waiting.load(Relaxed),
            w.cpu_ms.load(Relaxed),
            now_ms.saturating_sub(w.heartbeat_ms.load(Relaxed)),
            w.budget_yields.load(Relaxed),
            w.adopted.load(Relaxed),
            w.accept_pauses.load(Relaxed),
            w.body_mem_bytes.load(Relaxed),
            w.body_spooled_bytes.load(Relaxed),
            w.body_temp_files.load(Relaxed),
            w.stolen.load(Relaxed),
            w.stalls.load(Relaxed),
            region.steer_bits(i) & STEER_STALLED != 0,
            w.file_cache_hits.load(Relaxed),
            w.file_cache_misses.load(Relaxed),
            w.file_cache_entries.load(Relaxed),
            w.tls_handshakes.load(Relaxed),
            w.tls_handshake_us.load(Relaxed) / 1000,
            w.tls_handshakes_deferred.load(Relaxed),
            w.h2_rebalanced.load(Relaxed),
            w.quic_connections.load(Relaxed),
            w.quic_datagrams.load(Relaxed),
            w.quic_strays.load(Relaxed),
            w.quic_retries.load(Relaxed),
            w.quic_0rtt.load(Relaxed),
            w.quic_by_cid.load(Relaxed),
            w.quic_by_hash.load(Relaxed),
        );
    }
    // Workers of older generations still finishing their connections (tunnels, relays,
    // requests, idle keep-alive connections in their drain window).
    s.push_str("],\"old_workers\":[");
    for (i, w) in region.stopping().enumerate() {
        if i > 0 {
            s.push(',');
        }
        let _ = write!(
            s,
            "{{\"pid\":{},\"generation\":{},\"active\":{},\"reading\":{},\"writing\":{},\
             \"waiting\":{}}}",
            w.pid.load(Relaxed),
            w.generation.load(Relaxed),
            w.active.load(Relaxed),
            w.reading.load(Relaxed),
            w.writing.load(Relaxed),
            w.waiting.load(Relaxed),
        );
    }
    s.push_str("],\"listeners\":[");
    for (i, l) in listeners.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        let _ = write!(
            s,
            "{{\"address\":\"{}\",\"shard\":{},\"worker\":{},\"workers\":[{}],\"queue\":{},\"backlog\":{},\
             \"stalled\":{},\"steered_away\":{}}}",
            l.address,
            opt(l.shard),
            opt(l.worker),
            join(&l.workers),
            l.queue,
            l.backlog,
            l.stalled,
            l.steered_away
        );
    }
    s.push_str("]}\n");
    out.extend_from_slice(s.as_bytes());
}

fn join(v: &[usize]) -> String {
    v.iter().map(usize::to_string).collect::<Vec<_>>().join(",")
}

fn label(v: Option<usize>) -> String {
    v.map_or_else(String::new, |v| v.to_string())
}

/// `shard_status?format=prometheus`: the same numbers in Prometheus text exposition format.
///
/// Series are labelled by `worker` (the index), never by pid, so a reload or a respawn makes
/// no new series: `shard_worker_info{worker,pid,generation}` says which process serves an
/// index. Counters (`_total`) of an index keep what its exited workers counted, so they only
/// grow across reloads, as nginx's shared counters.
pub fn prometheus(region: &Region, listeners: &[ListenerRow], now_ms: u64, out: &mut Vec<u8>) {
    let mut s = String::with_capacity(2048 + 600 * region.n_workers.load(Relaxed) as usize);
    let _ = writeln!(
        s,
        "# HELP shard_generation Configuration generation (1 at start, +1 per reload)."
    );
    let _ = writeln!(s, "# TYPE shard_generation gauge");
    let _ = writeln!(s, "shard_generation {}", region.generation.load(Relaxed));
    let _ = writeln!(
        s,
        "# HELP shard_steering_program The program that places new connections on the shards of \
         per-worker reuseport groups: round_robin (dealt in turn, eBPF) or random (the kernel's hash or a cBPF draw)."
    );
    let _ = writeln!(s, "# TYPE shard_steering_program gauge");
    let _ = writeln!(
        s,
        "shard_steering_program{{program=\"{}\"}} 1",
        crate::shm::program_name(region.steer_program.load(Relaxed))
    );
    // Totals over every worker of every generation (stub_status's three numbers).
    let totals = region.read_consistent(|r| {
        [
            r.counter_total(C_ACCEPTED),
            r.counter_total(C_HANDLED),
            r.counter_total(C_REQUESTS),
        ]
    });
    for (name, help, v) in [
        (
            "shard_connections_accepted_total",
            "Client connections accepted.",
            totals[0],
        ),
        (
            "shard_connections_handled_total",
            "Client connections handled.",
            totals[1],
        ),
        ("shard_requests_total", "Client requests.", totals[2]),
    ] {
        let _ = writeln!(s, "# HELP {name} {help}");
        let _ = writeln!(s, "# TYPE {name} counter");
        let _ = writeln!(s, "{name} {v}");
    }
    let _ = writeln!(
        s,
        "# HELP shard_worker_info The process serving each worker index (value always 1)."
    );
    let _ = writeln!(s, "# TYPE shard_worker_info gauge");
    for (i, w) in region.current().enumerate() {
        let _ = writeln!(
            s,
            "shard_worker_info{{worker=\"{i}\",pid=\"{}\",generation=\"{}\"}} 1",
            w.pid.load(Relaxed),
            w.generation.load(Relaxed)
        );
    }
    let n = region.current().count();
    let counters: Vec<Vec<u64>> = region.read_consistent(|r| {
        (0..n)
            .map(|i| {
                (0..crate::shm::COUNTERS)
                    .map(|c| r.counter_of(i, c))
                    .collect()
            })
            .collect()
    });
    // (name, help, counter index): what `WorkerSlot::counters` lists.
    let counter_rows: [(&str, &str, usize); 22] = [
        ("shard_worker_accepted_total", "Connections accepted by the worker.", 0),
        ("shard_worker_handled_total", "Connections handled by the worker.", 1),
        ("shard_worker_requests_total", "Requests served by the worker.", 2),
        (
            "shard_worker_cpu_seconds_total",
            "Worker CPU time (user + system).",
            3,
        ),
        (
            "shard_worker_budget_yields_total",
            "Turns a connection ended because it used up its budget of rounds per wake-up.",
            4,
        ),
        (
            "shard_worker_adopted_total",
            "Connections accepted from a sibling's shard while its worker was not serving.",
            5,
        ),
        (
            "shard_worker_accept_pauses_total",
            "Times accepting paused at worker_connections or the descriptor limit.",
            6,
        ),
        (
            "shard_worker_body_spooled_bytes_total",
            "Request-body bytes written to temporary files.",
            7,
        ),
        (
            "shard_worker_stolen_total",
            "Connections accepted from a sibling's shard (stalled, backlogged or without a worker).",
            8,
        ),
        (
            "shard_worker_stalls_total",
            "Times the master found the worker stalled (reuseport_steering).",
            9,
        ),
        (
            "shard_worker_file_cache_hits_total",
            "open_file_cache lookups answered from the cache.",
            10,
        ),
        (
            "shard_worker_file_cache_misses_total",
            "open_file_cache lookups that opened the file.",
            11,
        ),
        (
            "shard_worker_tls_handshakes_total",
            "TLS handshakes completed.",
            12,
        ),
        (
            "shard_worker_tls_handshake_seconds_total",
            "Time spent processing TLS handshake messages.",
            13,
        ),
        (
            "shard_worker_tls_handshakes_deferred_total",
            "TLS handshake messages put off to a later loop turn (more than 4 ready in one).",
            14,
        ),
        (
            "shard_worker_h2_rebalanced_total",
            "HTTP/2 connections sent GOAWAY by http2_rebalance.",
            15,
        ),
        (
            "shard_worker_quic_datagrams_total",
            "Datagrams read from the worker's quic sockets.",
            16,
        ),
        (
            "shard_worker_quic_strays_total",
            "Datagrams for a QUIC connection the worker does not hold (dropped).",
            17,
        ),
        (
            "shard_worker_quic_retries_total",
            "Retry packets sent (quic_retry).",
            18,
        ),
        (
            "shard_worker_quic_0rtt_total",
            "HTTP/3 requests that came in 0-RTT data (ssl_early_data).",
            19,
        ),
        (
            "shard_worker_quic_by_cid_total",
            "Datagrams whose connection ID carried the worker's key (steered by connection ID).",
            20,
        ),
        (
            "shard_worker_quic_by_hash_total",
            "Datagrams whose connection ID the client chose (Initial, 0-RTT: placed by address hash).",
            21,
        ),
    ];
    for (name, help, c) in counter_rows {
        let _ = writeln!(s, "# HELP {name} {help}");
        let _ = writeln!(s, "# TYPE {name} counter");
        for (i, row) in counters.iter().enumerate() {
            if c == C_TLS_US {
                let _ = writeln!(s, "{name}{{worker=\"{i}\"}} {:.6}", row[c] as f64 / 1e6);
            } else if c == C_CPU_MS {
                let _ = writeln!(s, "{name}{{worker=\"{i}\"}} {:.3}", row[c] as f64 / 1000.0);
            } else {
                let _ = writeln!(s, "{name}{{worker=\"{i}\"}} {}", row[c]);
            }
        }
    }
    type Gauge = fn(&crate::shm::WorkerSlot) -> u64;
    let gauges: [(&str, &str, Gauge); 9] = [
        (
            "shard_worker_quic_connections",
            "QUIC connections of the worker.",
            |w| w.quic_connections.load(Relaxed),
        ),
        (
            "shard_worker_active",
            "Open client connections of the worker.",
            |w| w.active.load(Relaxed),
        ),
        (
            "shard_worker_reading",
            "Connections reading a request.",
            |w| w.reading.load(Relaxed),
        ),
        (
            "shard_worker_writing",
            "Connections writing a response.",
            |w| w.writing.load(Relaxed),
        ),
        (
            "shard_worker_waiting",
            "Idle keep-alive connections.",
            |w| w.waiting.load(Relaxed),
        ),
        (
            "shard_worker_file_cache_entries",
            "Entries in the worker's open_file_caches.",
            |w| w.file_cache_entries.load(Relaxed),
        ),
        (
            "shard_worker_body_memory_bytes",
            "Request-body bytes held in memory.",
            |w| w.body_mem_bytes.load(Relaxed),
        ),
        (
            "shard_worker_body_temp_files",
            "Request-body temporary files open.",
            |w| w.body_temp_files.load(Relaxed),
        ),
        (
            "shard_worker_heartbeat_age_seconds",
            "Time since the worker's loop last ran.",
            |w| w.heartbeat_ms.load(Relaxed),
        ),
    ];
    for (name, help, f) in gauges {
        let _ = writeln!(s, "# HELP {name} {help}");
        let _ = writeln!(s, "# TYPE {name} gauge");
        for (i, w) in region.current().enumerate() {
            let v = f(w);
            if name.ends_with("heartbeat_age_seconds") {
                let age = now_ms.saturating_sub(v);
                let _ = writeln!(s, "{name}{{worker=\"{i}\"}} {:.3}", age as f64 / 1000.0);
            } else {
                let _ = writeln!(s, "{name}{{worker=\"{i}\"}} {v}");
            }
        }
    }
    let _ = writeln!(
        s,
        "# HELP shard_worker_stalled Whether the master finds the worker stalled now (reuseport_steering)."
    );
    let _ = writeln!(s, "# TYPE shard_worker_stalled gauge");
    for i in 0..n {
        let _ = writeln!(
            s,
            "shard_worker_stalled{{worker=\"{i}\"}} {}",
            u8::from(region.steer_bits(i) & STEER_STALLED != 0)
        );
    }
    let _ = writeln!(
        s,
        "# HELP shard_old_worker_active Open connections of workers of older generations that are still stopping."
    );
    let _ = writeln!(s, "# TYPE shard_old_worker_active gauge");
    let mut old: std::collections::BTreeMap<u64, u64> = std::collections::BTreeMap::new();
    for w in region.stopping() {
        *old.entry(w.generation.load(Relaxed)).or_insert(0) += w.active.load(Relaxed);
    }
    for (generation, active) in old {
        let _ = writeln!(
            s,
            "shard_old_worker_active{{generation=\"{generation}\"}} {active}"
        );
    }
    type Pick = fn(&ListenerRow) -> u32;
    let rows: [(&str, &str, Pick); 4] = [
        (
            "shard_listener_queue",
            "Connections waiting in the kernel accept queue of the socket.",
            |l| l.queue,
        ),
        (
            "shard_listener_backlog",
            "Accept queue limit of the socket.",
            |l| l.backlog,
        ),
        (
            "shard_listener_stalled",
            "Whether the shard's worker is stalled (reuseport_steering).",
            |l| u32::from(l.stalled),
        ),
        (
            "shard_listener_steered_away",
            "Whether the reuseport program sends the shard no new connection (stalled or backlogged worker).",
            |l| u32::from(l.steered_away),
        ),
    ];
    for (name, help, pick) in rows {
        let _ = writeln!(s, "# HELP {name} {help}");
        let _ = writeln!(s, "# TYPE {name} gauge");
        for l in listeners {
            let _ = writeln!(
                s,
                "{name}{{address=\"{}\",shard=\"{}\",worker=\"{}\",workers=\"{}\"}} {}",
                l.address,
                label(l.shard),
                label(l.worker),
                join(&l.workers),
                pick(l)
            );
        }
    }
    out.extend_from_slice(s.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn region() -> crate::shm::SharedRegion {
        let r = crate::shm::create().unwrap();
        r.n_workers.store(2, Relaxed);
        r.slot_of[1].store(1, Relaxed);
        r.workers[0].pid.store(100, Relaxed);
        r.workers[1].pid.store(101, Relaxed);
        r.workers[1].idx.store(1, Relaxed);
        r.workers[0].accepted.store(3, Relaxed);
        r.workers[1].accepted.store(4, Relaxed);
        r.workers[0].handled.store(3, Relaxed);
        r.workers[1].handled.store(4, Relaxed);
        r.workers[0].requests.store(10, Relaxed);
        r.workers[1].active.store(2, Relaxed);
        r.workers[1].waiting.store(1, Relaxed);
        r.workers[1].writing.store(1, Relaxed);
        r
    }

    #[test]
    fn totals_survive_a_worker_folded_into_retired() {
        let r = region();
        // Worker 1 of an old generation exits: its counts move to index 1's retired totals,
        // and a new worker takes the slot from zero.
        r.fold(1, 1);
        r.workers[1].pid.store(102, Relaxed);
        r.workers[1].accepted.store(5, Relaxed);
        let mut out = Vec::new();
        stub(&r, &mut out);
        let text = String::from_utf8(out).unwrap();
        assert!(text.contains("\n 12 7 10 \n"), "{text}");
        assert_eq!(r.counter_of(1, C_ACCEPTED), 9);
        assert_eq!(r.counter_of(0, C_ACCEPTED), 3);
    }

    #[test]
    fn stub_matches_nginx_format() {
        let r = region();
        let mut out = Vec::new();
        stub(&r, &mut out);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "Active connections: 2 \nserver accepts handled requests\n 7 7 10 \nReading: 0 Writing: 1 Waiting: 1 \n"
        );
    }

    #[test]
    fn json_has_workers_and_listeners() {
        let r = region();
        let rows = [
            ListenerRow {
                address: "127.0.0.1:80".into(),
                shard: Some(1),
                worker: Some(1),
                workers: vec![1],
                queue: 0,
                backlog: 511,
                stalled: false,
                steered_away: false,
            },
            ListenerRow {
                address: "127.0.0.1:81".into(),
                shard: None,
                worker: None,
                workers: vec![0, 1],
                queue: 2,
                backlog: 511,
                stalled: false,
                steered_away: false,
            },
        ];
        let mut out = Vec::new();
        json(&r, &rows, 0, &mut out);
        let s = String::from_utf8(out).unwrap();
        assert!(
            s.starts_with(
                "{\"generation\":1,\"steering_program\":\"random\",\"workers\":[{\"idx\":0,"
            ),
            "{s}"
        );
        assert!(s.contains("{\"address\":\"127.0.0.1:80\",\"shard\":1,\"worker\":1,\"workers\":[1],\"queue\":0,\"backlog\":511,\"stalled\":false,\"steered_away\":false}"), "{s}");
        assert!(
            s.contains("\"shard\":null,\"worker\":null,\"workers\":[0,1],\"queue\":2"),
            "{s}"
        );
    }

    #[test]
    fn prometheus_labels() {
        let r = region();
        let rows = [ListenerRow {
            address: "127.0.0.1:80".into(),
            shard: Some(0),
            worker: None,
            workers: vec![0, 2],
            queue: 5,
            backlog: 511,
            stalled: false,
            steered_away: false,
        }];
        let mut out = Vec::new();
        prometheus(&r, &rows, 0, &mut out);
        let s = String::from_utf8(out).unwrap();
        assert!(
            s.contains("shard_worker_accepted_total{worker=\"1\"} 4\n"),
            "{s}"
        );
        assert!(
            s.contains("shard_worker_info{worker=\"1\",pid=\"101\",generation=\"0\"} 1\n"),
            "{s}"
        );
        assert!(
            !s.contains("pid=\"100\"}"),
            "no series is labelled by pid: {s}"
        );
        assert!(
            s.contains(
                "shard_listener_queue{address=\"127.0.0.1:80\",shard=\"0\",worker=\"\",workers=\"0,2\"} 5\n"
            ),
            "{s}"
        );
    }
}
