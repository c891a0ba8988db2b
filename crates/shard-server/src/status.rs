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

fn totals(region: &Region) -> Totals {
    let mut t = Totals::default();
    for w in region.current() {
        t.accepted += w.accepted.load(Relaxed);
        t.handled += w.handled.load(Relaxed);
        t.requests += w.requests.load(Relaxed);
        t.active += w.active.load(Relaxed);
        t.reading += w.reading.load(Relaxed);
        t.writing += w.writing.load(Relaxed);
        t.waiting += w.waiting.load(Relaxed);
    }
    t
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
        "{{\"generation\":{},\"workers\":[",
        region.generation.load(Relaxed)
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
             \"stalled\":{},\"file_cache_hits\":{},\"file_cache_misses\":{},\"file_cache_entries\":{}}}",
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
pub fn prometheus(region: &Region, listeners: &[ListenerRow], now_ms: u64, out: &mut Vec<u8>) {
    let mut s = String::with_capacity(2048 + 600 * region.n_workers.load(Relaxed) as usize);
    let _ = writeln!(
        s,
        "# HELP shard_generation Configuration generation (1 at start, +1 per reload)."
    );
    let _ = writeln!(s, "# TYPE shard_generation gauge");
    let _ = writeln!(s, "shard_generation {}", region.generation.load(Relaxed));
    type Field = fn(&crate::shm::WorkerSlot) -> u64;
    let metrics: [(&str, &str, &str, Field); 20] = [
        (
            "shard_worker_accepted_total",
            "counter",
            "Connections accepted by the worker.",
            |w| w.accepted.load(Relaxed),
        ),
        (
            "shard_worker_handled_total",
            "counter",
            "Connections handled by the worker.",
            |w| w.handled.load(Relaxed),
        ),
        (
            "shard_worker_requests_total",
            "counter",
            "Requests served by the worker.",
            |w| w.requests.load(Relaxed),
        ),
        (
            "shard_worker_active",
            "gauge",
            "Open client connections of the worker.",
            |w| w.active.load(Relaxed),
        ),
        (
            "shard_worker_reading",
            "gauge",
            "Connections reading a request.",
            |w| w.reading.load(Relaxed),
        ),
        (
            "shard_worker_writing",
            "gauge",
            "Connections writing a response.",
            |w| w.writing.load(Relaxed),
        ),
        (
            "shard_worker_waiting",
            "gauge",
            "Idle keep-alive connections.",
            |w| w.waiting.load(Relaxed),
        ),
        (
            "shard_worker_cpu_seconds_total",
            "counter",
            "Worker CPU time (user + system), milliseconds / 1000.",
            |w| w.cpu_ms.load(Relaxed),
        ),
        (
            "shard_worker_budget_yields_total",
            "counter",
            "Turns a connection ended because it used up its budget of rounds per wake-up.",
            |w| w.budget_yields.load(Relaxed),
        ),
        (
            "shard_worker_adopted_total",
            "counter",
            "Connections accepted from a sibling's shard while its worker was not serving.",
            |w| w.adopted.load(Relaxed),
        ),
        (
            "shard_worker_stolen_total",
            "counter",
            "Connections accepted from a sibling's shard (stalled, backlogged or without a worker).",
            |w| w.stolen.load(Relaxed),
        ),
        (
            "shard_worker_stalls_total",
            "counter",
            "Times the master found the worker stalled (reuseport_steering).",
            |w| w.stalls.load(Relaxed),
        ),
        (
            "shard_worker_file_cache_hits_total",
            "counter",
            "open_file_cache lookups answered from the cache.",
            |w| w.file_cache_hits.load(Relaxed),
        ),
        (
            "shard_worker_file_cache_misses_total",
            "counter",
            "open_file_cache lookups that opened the file.",
            |w| w.file_cache_misses.load(Relaxed),
        ),
        (
            "shard_worker_file_cache_entries",
            "gauge",
            "Entries in the worker's open_file_caches.",
            |w| w.file_cache_entries.load(Relaxed),
        ),
        (
            "shard_worker_accept_pauses_total",
            "counter",
            "Times accepting paused at worker_connections or the descriptor limit.",
            |w| w.accept_pauses.load(Relaxed),
        ),
        (
            "shard_worker_body_memory_bytes",
            "gauge",
            "Request-body bytes held in memory.",
            |w| w.body_mem_bytes.load(Relaxed),
        ),
        (
            "shard_worker_body_spooled_bytes_total",
            "counter",
            "Request-body bytes written to temporary files.",
            |w| w.body_spooled_bytes.load(Relaxed),
        ),
        (
            "shard_worker_body_temp_files",
            "gauge",
            "Request-body temporary files open.",
            |w| w.body_temp_files.load(Relaxed),
        ),
        (
            "shard_worker_heartbeat_age_seconds",
            "gauge",
            "Time since the worker's loop last ran, milliseconds / 1000.",
            |w| w.heartbeat_ms.load(Relaxed),
        ),
    ];
    for (name, kind, help, f) in metrics {
        let _ = writeln!(s, "# HELP {name} {help}");
        let _ = writeln!(s, "# TYPE {name} {kind}");
        for (i, w) in region.current().enumerate() {
            let pid = w.pid.load(Relaxed);
            let v = f(w);
            if name.ends_with("cpu_seconds_total") {
                let _ = writeln!(
                    s,
                    "{name}{{worker=\"{i}\",pid=\"{pid}\"}} {:.3}",
                    v as f64 / 1000.0
                );
            } else if name.ends_with("heartbeat_age_seconds") {
                let age = now_ms.saturating_sub(v);
                let _ = writeln!(
                    s,
                    "{name}{{worker=\"{i}\",pid=\"{pid}\"}} {:.3}",
                    age as f64 / 1000.0
                );
            } else {
                let _ = writeln!(s, "{name}{{worker=\"{i}\",pid=\"{pid}\"}} {v}");
            }
        }
    }
    let _ = writeln!(
        s,
        "# HELP shard_worker_stalled Whether the master finds the worker stalled now (reuseport_steering)."
    );
    let _ = writeln!(s, "# TYPE shard_worker_stalled gauge");
    for (i, w) in region.current().enumerate() {
        let _ = writeln!(
            s,
            "shard_worker_stalled{{worker=\"{i}\",pid=\"{}\"}} {}",
            w.pid.load(Relaxed),
            u8::from(region.steer_bits(i) & STEER_STALLED != 0)
        );
    }
    let _ = writeln!(
        s,
        "# HELP shard_old_worker_active Open connections of a worker of an older generation that is still stopping."
    );
    let _ = writeln!(s, "# TYPE shard_old_worker_active gauge");
    for w in region.stopping() {
        let _ = writeln!(
            s,
            "shard_old_worker_active{{pid=\"{}\",generation=\"{}\"}} {}",
            w.pid.load(Relaxed),
            w.generation.load(Relaxed),
            w.active.load(Relaxed)
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
            s.starts_with("{\"generation\":1,\"workers\":[{\"idx\":0,"),
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
            s.contains("shard_worker_accepted_total{worker=\"1\",pid=\"0\"} 4\n"),
            "{s}"
        );
        assert!(
            s.contains(
                "shard_listener_queue{address=\"127.0.0.1:80\",shard=\"0\",worker=\"\",workers=\"0,2\"} 5\n"
            ),
            "{s}"
        );
    }
}
