//! WebSocket (and any `101 Switching Protocols`) through the HTTP proxy, as a client and a real
//! echo upstream see it: messages both ways, large and many; the upgrade only where the
//! configuration forwards `Upgrade` over HTTP/1.1; a `101` nobody asked for refused; the
//! tunnel's `proxy_read_timeout`; half-closes both ways; and a client that stops reading
//! costing the worker a bounded amount of memory.
//!
//! The codec and the echo upstream are `shard-bench`'s (`src/ws.rs`, included by path): the
//! reload experiment drives the same code.

mod support;

#[path = "../../shard-bench/src/ws.rs"]
mod ws;

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener};
use std::time::{Duration, Instant};

use support::*;

const TIMEOUT: Duration = Duration::from_secs(10);

/// The configuration nginx documents for WebSocket proxying, with the `map` idiom, in
/// `location /ws/`; `location /plain/` proxies without forwarding the upgrade, and
/// `location /old/` forwards it over HTTP/1.0.
fn conf(upstream: SocketAddr, extra: &str) -> String {
    format!(
        "worker_processes 1;\n\
         error_log logs/error.log info;\n\
         events {{ worker_connections 64; }}\n\
         http {{\n\
         log_format ws '$status $body_bytes_sent $request_time \"$request\"';\n\
         access_log logs/access.log ws;\n\
         map $http_upgrade $connection_upgrade {{ default upgrade; '' close; }}\n\
         {extra}\n\
         server {{\n\
         listen 127.0.0.1:{{port}};\n\
         location = /status {{ shard_status; }}\n\
         location /ws/ {{\n\
           proxy_pass http://{upstream};\n\
           proxy_http_version 1.1;\n\
           proxy_set_header Upgrade $http_upgrade;\n\
           proxy_set_header Connection $connection_upgrade;\n\
         }}\n\
         location /plain/ {{ proxy_pass http://{upstream}; proxy_http_version 1.1; }}\n\
         location /old/ {{\n\
           proxy_pass http://{upstream};\n\
           proxy_set_header Upgrade $http_upgrade;\n\
           proxy_set_header Connection \"upgrade\";\n\
         }}\n\
         }}\n\
         }}\n"
    )
}

fn file(s: &Server, name: &str) -> String {
    std::fs::read_to_string(s.dir.join("logs").join(name)).unwrap_or_default()
}

fn open(s: &Server, path: &str) -> ws::Conn {
    let (hs, c) = ws::connect(s.addr(), path, "", TIMEOUT).expect("handshake");
    assert_eq!(hs.status, 101, "handshake through shard");
    assert_eq!(hs.header("upgrade"), Some("websocket"));
    assert_eq!(hs.header("connection"), Some("upgrade"));
    c.expect("a 101 gives a connection")
}

#[test]
fn messages_flow_both_ways_small_many_and_large() {
    let up = ws::echo_server(false).unwrap();
    let s = Server::start("ws-echo", &conf(up, ""), 1);
    let mut c = open(&s, "/ws/chat");
    c.send(ws::OP_TEXT, b"hello").unwrap();
    let f = c.recv().unwrap();
    assert_eq!(
        (f.opcode, f.payload.as_slice()),
        (ws::OP_TEXT, &b"hello"[..])
    );

    // Many small messages, all written before any is read: they queue in the pipes.
    let n = 2000;
    let mut batch = Vec::new();
    for i in 0..n {
        ws::encode(
            &mut batch,
            ws::OP_TEXT,
            format!("m{i}").as_bytes(),
            Some([9, 8, 7, 6]),
        );
    }
    c.stream.write_all(&batch).unwrap();
    for i in 0..n {
        let f = c.recv().unwrap();
        assert_eq!(f.payload, format!("m{i}").as_bytes(), "message {i}");
    }

    // Large messages, larger than every buffer on the way, in both directions at once.
    for len in [70_000usize, 3 << 20] {
        let payload: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
        let mut writer = c.stream.try_clone().unwrap();
        let mut frame = Vec::new();
        ws::encode(&mut frame, ws::OP_BINARY, &payload, Some([1, 2, 3, 4]));
        let t = std::thread::spawn(move || writer.write_all(&frame));
        let f = c.recv().unwrap();
        t.join().unwrap().unwrap();
        assert_eq!(f.opcode, ws::OP_BINARY);
        assert!(f.payload == payload, "{len}-byte message came back intact");
    }
    c.close().unwrap();

    // The access log has the tunnel's line once it ended: 101 and the bytes it carried.
    let line = wait_for(TIMEOUT, "the tunnel's access-log line", || {
        let log = file(&s, "access.log");
        log.lines()
            .find(|l| l.starts_with("101 "))
            .map(str::to_string)
    });
    let bytes: u64 = line.split(' ').nth(1).unwrap().parse().unwrap();
    assert!(bytes > (3 << 20), "{line}");
    assert!(line.ends_with("\"GET /ws/chat HTTP/1.1\""), "{line}");
    // The connection is gone from the worker.
    wait_for(TIMEOUT, "the tunnel to close", || {
        (status_field(&s, "active") == 1).then_some(())
    });
}

#[test]
fn no_upgrade_without_the_explicit_headers_or_over_http_1_0() {
    let up = ws::echo_server(false).unwrap();
    let s = Server::start("ws-plain", &conf(up, ""), 1);
    // Without `proxy_set_header Upgrade`, the upstream never sees one and answers as HTTP.
    let (hs, c) = ws::connect(s.addr(), "/plain/x", "", TIMEOUT).unwrap();
    assert_eq!(hs.status, 426);
    assert!(c.is_none());

    // An upstream that switches anyway is refused: the client never asked it to.
    let rogue = ws::echo_server(true).unwrap();
    let s2 = Server::start("ws-rogue", &conf(rogue, ""), 1);
    for path in ["/plain/x", "/old/x"] {
        let (hs, c) = ws::connect(s2.addr(), path, "", TIMEOUT).unwrap();
        assert_eq!(hs.status, 502, "{path}: a 101 not asked for");
        assert!(c.is_none());
    }
    // A plain request (no Upgrade) to the upgrading location is not upgraded either.
    let r = raw(
        s2.addr(),
        b"GET /ws/x HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(r.status, 502);
    let log = file(&s2, "error.log");
    assert_eq!(
        log.matches("upstream sent unexpected 101").count(),
        3,
        "{log}"
    );
}

#[test]
fn idle_tunnel_closes_after_proxy_read_timeout() {
    let up = ws::echo_server(false).unwrap();
    let s = Server::start("ws-idle", &conf(up, "proxy_read_timeout 1s;"), 1);
    let mut c = open(&s, "/ws/idle");
    c.send(ws::OP_TEXT, b"x").unwrap();
    assert_eq!(c.recv().unwrap().payload, b"x");
    let t0 = Instant::now();
    let mut b = [0u8; 16];
    c.stream
        .set_read_timeout(Some(Duration::from_secs(8)))
        .unwrap();
    assert_eq!(
        c.stream.read(&mut b).unwrap_or(0),
        0,
        "closed, nothing sent"
    );
    let waited = t0.elapsed();
    assert!(
        waited >= Duration::from_millis(900) && waited < Duration::from_secs(5),
        "{waited:?}"
    );
    let log = wait_for(TIMEOUT, "the timeout's error-log line", || {
        let l = file(&s, "error.log");
        l.contains(
            "upstream timed out (110: Connection timed out) while proxying upgraded connection",
        )
        .then_some(l)
    });
    assert!(log.contains("client: 127.0.0.1"), "{log}");
}

/// An upstream that completes the handshake, then reads until the client's end of stream,
/// answers `bye` after it (the half-closed direction still carries bytes) and closes.
fn half_close_upstream() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for mut s in l.incoming().flatten() {
            std::thread::spawn(move || {
                s.set_read_timeout(Some(TIMEOUT)).unwrap();
                let mut head = Vec::new();
                let mut b = [0u8; 4096];
                while find(&head, b"\r\n\r\n").is_none() {
                    let n = s.read(&mut b).unwrap();
                    assert!(n > 0);
                    head.extend_from_slice(&b[..n]);
                }
                let text = String::from_utf8_lossy(&head).into_owned();
                let key = text
                    .lines()
                    .find_map(|l| l.strip_prefix("Sec-WebSocket-Key: "))
                    .unwrap_or("");
                let resp = format!(
                    "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\
                     Connection: Upgrade\r\nSec-WebSocket-Accept: {}\r\n\r\n",
                    ws::accept_key(key)
                );
                s.write_all(resp.as_bytes()).unwrap();
                let mut got = head.len() - find(&head, b"\r\n\r\n").unwrap() - 4;
                loop {
                    match s.read(&mut b) {
                        Ok(0) => break,
                        Ok(n) => got += n,
                        Err(_) => return,
                    }
                }
                let _ = s.write_all(format!("bye after {got}").as_bytes());
            });
        }
    });
    addr
}

#[test]
fn half_closes_cross_the_tunnel_both_ways() {
    // Client's FIN → upstream; upstream's bytes after it → client; upstream's FIN → client.
    let s = Server::start("ws-half", &conf(half_close_upstream(), ""), 1);
    let mut c = open(&s, "/ws/half");
    c.stream.write_all(b"12345").unwrap();
    c.stream.shutdown(Shutdown::Write).unwrap();
    let mut rest = c.buf.clone();
    c.stream.read_to_end(&mut rest).unwrap();
    assert_eq!(String::from_utf8_lossy(&rest), "bye after 5");
    drop(c);

    // The echo upstream closing (after answering a close) closes the client's side.
    let up = ws::echo_server(false).unwrap();
    let s2 = Server::start("ws-upclose", &conf(up, ""), 1);
    let mut c = open(&s2, "/ws/x");
    c.send(ws::OP_CLOSE, &1000u16.to_be_bytes()).unwrap();
    assert_eq!(c.recv().unwrap().opcode, ws::OP_CLOSE);
    let mut rest = Vec::new();
    c.stream.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty() && c.buf.is_empty());
    // The tunnel ends when the client's direction ends too.
    drop(c);
    wait_for(TIMEOUT, "both tunnels' access-log lines", || {
        let a = file(&s, "access.log")
            .lines()
            .filter(|l| l.starts_with("101 "))
            .count();
        let b = file(&s2, "access.log")
            .lines()
            .filter(|l| l.starts_with("101 "))
            .count();
        (a == 1 && b == 1).then_some(())
    });
}

fn rss_kib(pid: u64) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

/// An upstream that completes the handshake and then writes `total` bytes as fast as the
/// connection takes them; reports how many it managed before a write blocked for 2 s.
fn firehose_upstream(total: usize) -> (SocketAddr, std::sync::mpsc::Receiver<usize>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let Some(Ok(mut s)) = l.incoming().next() else {
            return;
        };
        let mut head = Vec::new();
        let mut b = [0u8; 4096];
        while find(&head, b"\r\n\r\n").is_none() {
            let n = s.read(&mut b).unwrap();
            head.extend_from_slice(&b[..n]);
        }
        s.write_all(
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\nConnection: Upgrade\r\n\r\n",
        )
        .unwrap();
        s.set_write_timeout(Some(Duration::from_secs(2))).unwrap();
        let chunk = vec![b'z'; 64 * 1024];
        let mut sent = 0;
        while sent < total {
            match s.write(&chunk) {
                Ok(n) => sent += n,
                Err(_) => break,
            }
        }
        let _ = tx.send(sent);
    });
    (addr, rx)
}

#[test]
fn a_client_that_stops_reading_costs_a_bounded_amount() {
    let total = 256 << 20;
    let (up, sent) = firehose_upstream(total);
    let s = Server::start("ws-slow", &conf(up, "proxy_buffer_size 16k;"), 1);
    let pid = s.workers()[0].pid;
    let before = rss_kib(pid);
    let mut c = support::connect(s.addr());
    c.write_all(b"GET /ws/slow HTTP/1.1\r\nHost: a\r\nUpgrade: x\r\nConnection: upgrade\r\n\r\n")
        .unwrap();
    // The client reads nothing: the upstream soon cannot write.
    let sent = sent
        .recv_timeout(Duration::from_secs(30))
        .expect("the upstream's writes blocked");
    assert!(
        sent < total,
        "back-pressure reached the upstream ({sent} bytes)"
    );
    let after = rss_kib(pid);
    assert!(
        after < before + 8 * 1024,
        "worker RSS grew from {before} to {after} KiB while {sent} bytes waited"
    );
    // Reading again drains it all, in order.
    c.set_read_timeout(Some(TIMEOUT)).unwrap();
    let mut got = 0usize;
    let mut b = vec![0u8; 1 << 20];
    let mut head_seen = false;
    let mut acc = Vec::new();
    while got < sent {
        let n = c.read(&mut b).unwrap();
        assert!(n > 0, "closed after {got} of {sent}");
        if head_seen {
            got += n;
        } else {
            acc.extend_from_slice(&b[..n]);
            if let Some(i) = find(&acc, b"\r\n\r\n") {
                head_seen = true;
                got += acc.len() - i - 4;
            }
        }
    }
    assert_eq!(got, sent);
}

/// The status page's `generation` and its `old_workers` rows as `(pid, active)`.
fn generations(s: &Server) -> (u64, Vec<(u64, u64)>) {
    let body = get(s.addr(), "/status").body_str();
    let num = |obj: &str, key: &str| -> u64 {
        let i = obj.find(&format!("\"{key}\":")).unwrap() + key.len() + 3;
        obj[i..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect::<String>()
            .parse()
            .unwrap()
    };
    let generation = num(&body, "generation");
    let old = body.split("\"old_workers\":[").nth(1).unwrap();
    let old = &old[..old.find(']').unwrap()];
    let rows = old
        .split("},")
        .filter(|o| o.contains("pid"))
        .map(|o| (num(o, "pid"), num(o, "active")))
        .collect();
    (generation, rows)
}

#[test]
fn tunnels_outlive_ten_reloads_and_status_shows_the_old_worker_holding_them() {
    let up = ws::echo_server(false).unwrap();
    let s = Server::start("ws-reload", &conf(up, ""), 1);
    let old = s.workers()[0].pid;
    let mut conns: Vec<ws::Conn> = (0..3).map(|_| open(&s, "/ws/r")).collect();
    let path = s.dir.join("conf/shard.conf");
    for g in 2..=11u64 {
        // The same configuration again: a reload is a reload.
        std::fs::write(&path, std::fs::read(&path).unwrap()).unwrap();
        s.signal(libc::SIGHUP);
        wait_for(TIMEOUT, &format!("generation {g}"), || {
            (generations(&s).0 == g && s.workers().iter().all(|w| w.pid != old)).then_some(())
        });
        for (i, c) in conns.iter_mut().enumerate() {
            let m = format!("after reload {g} on tunnel {i}");
            c.send(ws::OP_TEXT, m.as_bytes()).unwrap();
            assert_eq!(c.recv().unwrap().payload, m.as_bytes());
        }
    }
    let (_, rows) = generations(&s);
    assert!(
        rows.contains(&(old, 3)),
        "the old worker holds the 3 tunnels: {rows:?}"
    );
    assert!(support::pid_alive(old as i32));
    for c in conns {
        c.close().unwrap();
    }
    wait_for(
        TIMEOUT,
        "the old worker to exit once its tunnels closed",
        || (!support::pid_alive(old as i32) && generations(&s).1.is_empty()).then_some(()),
    );
    let log = file(&s, "access.log");
    assert_eq!(
        log.lines().filter(|l| l.starts_with("101 ")).count(),
        3,
        "{log}"
    );
}
