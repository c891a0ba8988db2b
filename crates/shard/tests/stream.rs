//! The `stream` module as a TCP client and a test upstream see it: byte-exact relaying,
//! half-close, failover, backup and down peers, max_fails, proxy_timeout, status listing.
//!
//! Every upstream is a std `TcpListener` with a thread in this process; a refusing upstream is
//! a port nothing listens on.

mod support;

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use support::upstream::refusing_port;
use support::*;

/// An upstream on a free loopback port; `serve` runs on its own thread for each connection.
/// Returns the port and the number of connections accepted so far.
fn upstream(serve: fn(TcpStream)) -> (u16, Arc<AtomicUsize>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let n = Arc::new(AtomicUsize::new(0));
    let count = n.clone();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(s) = s else { continue };
            count.fetch_add(1, Ordering::SeqCst);
            std::thread::spawn(move || serve(s));
        }
    });
    (port, n)
}

/// Echoes until end of stream, then sends FIN.
fn echo(mut s: TcpStream) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if s.write_all(&buf[..n]).is_err() {
                    return;
                }
            }
        }
    }
    let _ = s.shutdown(Shutdown::Write);
}

/// Reads to end of stream, then answers `got N` and closes.
fn count_then_reply(mut s: TcpStream) {
    let mut v = Vec::new();
    let _ = s.read_to_end(&mut v);
    let _ = s.write_all(format!("got {}", v.len()).as_bytes());
}

fn says_p(mut s: TcpStream) {
    let _ = s.write_all(b"P");
}
fn says_q(mut s: TcpStream) {
    let _ = s.write_all(b"Q");
}
fn says_b(mut s: TcpStream) {
    let _ = s.write_all(b"B");
}

fn local(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// The common head: an http server for `/status` on `{port}`, then `stream` as given, with
/// `proxy_half_close on` (the tests' clients end their side first and wait for the answer;
/// nginx's default, off, is tested on its own).
fn conf(workers: usize, stream: &str) -> String {
    format!(
        "worker_processes {workers};\nerror_log logs/error.log info;\n\
         events {{ worker_connections 256; }}\n\
         http {{ access_log off; server {{ listen 127.0.0.1:{{port}}; \
         location = /status {{ shard_status; }} }} }}\n\
         stream {{\nproxy_half_close on;\n{stream}\n}}\n"
    )
}

/// Connects, sends nothing, reads everything until end of stream.
fn read_all(port: u16) -> String {
    let mut s = TcpStream::connect(local(port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut v = Vec::new();
    s.read_to_end(&mut v).unwrap();
    String::from_utf8_lossy(&v).into_owned()
}

fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

#[test]
fn relays_8mib_both_ways_through_reuseport_shards() {
    let (echo_port, _) = upstream(echo);
    let s = Server::start_ports(
        "stream-echo",
        &conf(
            2,
            &format!(
                "upstream echo {{ server 127.0.0.1:{echo_port}; }}\n\
                 server {{ listen 127.0.0.1:{{port1}} reuseport backlog=128; proxy_pass echo; \
                 proxy_buffer_size 8k; }}"
            ),
        ),
        2,
        1,
    );
    let sp = s.ports[0];
    let clients: Vec<_> = (0..3u64)
        .map(|i| {
            std::thread::spawn(move || {
                let data = pattern(8 << 20, 0x9e37_79b9 + i);
                let mut c = TcpStream::connect(local(sp)).unwrap();
                c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
                let mut w = c.try_clone().unwrap();
                let sent = data.clone();
                let writer = std::thread::spawn(move || {
                    w.write_all(&sent).unwrap();
                    w.shutdown(Shutdown::Write).unwrap();
                });
                let mut got = Vec::with_capacity(data.len());
                c.read_to_end(&mut got).unwrap();
                writer.join().unwrap();
                assert_eq!(got.len(), data.len());
                assert!(got == data, "relayed bytes differ");
            })
        })
        .collect();
    for c in clients {
        c.join().unwrap();
    }
    // The stream listener is one of the master's listeners: two shards in shard_status.
    let body = get(s.addr(), "/status").body_str();
    let needle = format!("\"address\":\"127.0.0.1:{sp}\"");
    assert_eq!(body.matches(&needle).count(), 2, "{body}");
    // The relays were counted, and are gone.
    let ws = wait_for(Duration::from_secs(5), "relays to close", || {
        let ws = s.workers();
        (ws.iter().map(|w| w.active).sum::<u64>() <= 1).then_some(ws)
    });
    assert!(
        total_accepted(&ws) >= 4,
        "accepted: {}",
        total_accepted(&ws)
    );
}

#[test]
fn half_close_reaches_upstream_and_reply_comes_back() {
    let (up, _) = upstream(count_then_reply);
    let _s = Server::start_ports(
        "stream-half",
        &conf(
            1,
            &format!("server {{ listen 127.0.0.1:{{port1}}; proxy_pass 127.0.0.1:{up}; }}"),
        ),
        1,
        1,
    );
    let sp = _s.ports[0];
    let mut c = TcpStream::connect(local(sp)).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    c.write_all(&[7u8; 100_000]).unwrap();
    c.shutdown(Shutdown::Write).unwrap();
    let mut v = Vec::new();
    c.read_to_end(&mut v).unwrap();
    assert_eq!(String::from_utf8_lossy(&v), "got 100000");
}

/// nginx's default, `proxy_half_close off`: the session ends once either side has ended and
/// what it sent is delivered: an upstream that answers and closes ends it though the client
/// keeps its side open, and a client that ends its side first gets no answer.
#[test]
fn without_half_close_either_end_ends_the_session() {
    let (says, _) = upstream(says_p);
    let (counter, _) = upstream(count_then_reply);
    let s = Server::start_ports(
        "stream-no-half",
        &format!(
            "worker_processes 1;\nerror_log logs/error.log info;\n\
             events {{ worker_connections 64; }}\n\
             http {{ access_log off; server {{ listen 127.0.0.1:{{port}}; \
             location = /status {{ shard_status; }} }} }}\n\
             stream {{\n server {{ listen 127.0.0.1:{{port1}}; proxy_pass 127.0.0.1:{says}; }}\n\
             server {{ listen 127.0.0.1:{{port2}}; proxy_pass 127.0.0.1:{counter}; }}\n\
             server {{ listen 127.0.0.1:{{port3}}; proxy_pass 127.0.0.1:{counter}; proxy_half_close on; }}\n}}\n"
        ),
        1,
        3,
    );
    // The client never ends its side: the upstream's close ends the session.
    let mut c = TcpStream::connect(local(s.ports[0])).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut v = Vec::new();
    c.read_to_end(&mut v).unwrap();
    assert_eq!(v, b"P");
    // The client ends first: its bytes are delivered, then the session ends (the upstream's
    // answer comes too late), as nginx's.
    assert_eq!(send_all(s.ports[1], &[1u8; 1000]), "");
    // With `proxy_half_close on` the answer comes back.
    assert_eq!(send_all(s.ports[2], &[1u8; 1000]), "got 1000");
}

#[test]
fn failover_to_the_next_upstream() {
    let (good, n) = upstream(says_p);
    let bad = refusing_port();
    let s = Server::start_ports(
        "stream-failover",
        &conf(
            1,
            &format!(
                "upstream u {{ server 127.0.0.1:{bad}; server 127.0.0.1:{good}; }}\n\
                 server {{ listen 127.0.0.1:{{port1}}; proxy_pass u; }}"
            ),
        ),
        1,
        1,
    );
    let sp = s.ports[0];
    for _ in 0..10 {
        assert_eq!(read_all(sp), "P");
    }
    assert_eq!(n.load(Ordering::SeqCst), 10);
    let line = format!(
        "connect() failed (111: Connection refused) while connecting to upstream, \
         client: 127.0.0.1, server: 127.0.0.1:{sp}, upstream: \"127.0.0.1:{bad}\""
    );
    wait_for(Duration::from_secs(5), "the connect() failed line", || {
        error_log(&s).contains(&line).then_some(())
    });
}

#[test]
fn all_upstreams_refusing_closes_the_client() {
    let (a, b) = (refusing_port(), refusing_port());
    let s = Server::start_ports(
        "stream-refused",
        &conf(
            1,
            &format!(
                "upstream u {{ server 127.0.0.1:{a}; server 127.0.0.1:{b}; }}\n\
                 server {{ listen 127.0.0.1:{{port1}}; proxy_pass u; }}"
            ),
        ),
        1,
        1,
    );
    let sp = s.ports[0];
    let start = Instant::now();
    let mut c = TcpStream::connect(local(sp)).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut buf = [0u8; 16];
    match c.read(&mut buf) {
        Ok(0) => {}
        Ok(n) => panic!("unexpected {n} bytes"),
        Err(e) => assert!(
            !matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ),
            "hung: {e}"
        ),
    }
    assert!(start.elapsed() < Duration::from_secs(5));
    wait_for(Duration::from_secs(5), "connect() failed lines", || {
        let log = error_log(&s);
        (log.contains(&format!(
            "connect() failed (111: Connection refused) while connecting to upstream, \
             client: 127.0.0.1, server: 127.0.0.1:{sp}, upstream: \"127.0.0.1:{a}\""
        )) && log.contains(&format!("upstream: \"127.0.0.1:{b}\"")))
        .then_some(())
    });
    // The relay is gone: only the status request itself is active.
    wait_for(Duration::from_secs(5), "the relay to close", || {
        (s.workers().iter().map(|w| w.active).sum::<u64>() <= 1).then_some(())
    });
}

#[test]
fn backup_only_when_primaries_are_unavailable_and_down_is_skipped() {
    let (p, np) = upstream(says_p);
    let (q, nq) = upstream(says_q);
    let (b, nb) = upstream(says_b);
    let bad = refusing_port();
    let _s = Server::start_ports(
        "stream-backup",
        &conf(
            1,
            &format!(
                "upstream healthy {{ server 127.0.0.1:{p}; server 127.0.0.1:{b} backup; }}\n\
                 upstream broken {{ server 127.0.0.1:{bad}; server 127.0.0.1:{b} backup; }}\n\
                 upstream withdown {{ server 127.0.0.1:{p} down; server 127.0.0.1:{q}; \
                 server 127.0.0.1:{b} backup; }}\n\
                 server {{ listen 127.0.0.1:{{port1}}; proxy_pass healthy; }}\n\
                 server {{ listen 127.0.0.1:{{port2}}; proxy_pass broken; }}\n\
                 server {{ listen 127.0.0.1:{{port3}}; proxy_pass withdown; }}"
            ),
        ),
        1,
        3,
    );
    let s1 = _s.ports[0];
    let s2 = _s.ports[1];
    let s3 = _s.ports[2];
    for _ in 0..5 {
        assert_eq!(read_all(s1), "P");
    }
    assert_eq!(
        nb.load(Ordering::SeqCst),
        0,
        "backup used while the primary is up"
    );
    for _ in 0..5 {
        assert_eq!(read_all(s2), "B");
    }
    assert_eq!(nb.load(Ordering::SeqCst), 5);
    for _ in 0..5 {
        assert_eq!(read_all(s3), "Q");
    }
    assert_eq!(np.load(Ordering::SeqCst), 5, "a down peer was used");
    assert_eq!(nq.load(Ordering::SeqCst), 5);
}

#[test]
fn max_fails_skips_a_failed_peer_for_fail_timeout() {
    let (good, n) = upstream(says_p);
    let (bad1, bad2) = (refusing_port(), refusing_port());
    let s = Server::start_ports(
        "stream-maxfails",
        &conf(
            1,
            &format!(
                "upstream skip {{ server 127.0.0.1:{bad1} max_fails=1 fail_timeout=60s; \
                 server 127.0.0.1:{good}; }}\n\
                 upstream noskip {{ server 127.0.0.1:{bad2} max_fails=0; \
                 server 127.0.0.1:{good}; }}\n\
                 server {{ listen 127.0.0.1:{{port1}}; proxy_pass skip; }}\n\
                 server {{ listen 127.0.0.1:{{port2}}; proxy_pass noskip; }}"
            ),
        ),
        1,
        2,
    );
    let s1 = s.ports[0];
    let s2 = s.ports[1];
    for _ in 0..10 {
        assert_eq!(read_all(s1), "P");
    }
    for _ in 0..10 {
        assert_eq!(read_all(s2), "P");
    }
    assert_eq!(n.load(Ordering::SeqCst), 20);
    let failures = |port: u16| {
        let needle = format!("upstream: \"127.0.0.1:{port}\"");
        error_log(&s)
            .lines()
            .filter(|l| l.contains("connect() failed") && l.contains(&needle))
            .count()
    };
    // One failure takes the peer out for 60 s; without max_fails it is tried every round.
    assert_eq!(failures(bad1), 1, "{}", error_log(&s));
    assert!(failures(bad2) >= 4, "{}", error_log(&s));
}

#[test]
fn proxy_timeout_closes_an_idle_relay() {
    let (up, _) = upstream(echo);
    let _s = Server::start_ports(
        "stream-timeout",
        &conf(
            1,
            &format!(
                "proxy_timeout 500ms;\n\
                 server {{ listen 127.0.0.1:{{port1}}; proxy_pass 127.0.0.1:{up}; }}"
            ),
        ),
        1,
        1,
    );
    let sp = _s.ports[0];
    let mut c = TcpStream::connect(local(sp)).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    // Activity keeps it open past one timeout.
    for _ in 0..3 {
        std::thread::sleep(Duration::from_millis(250));
        c.write_all(b"ping").unwrap();
        let mut b = [0u8; 4];
        c.read_exact(&mut b).unwrap();
        assert_eq!(&b, b"ping");
    }
    let start = Instant::now();
    let mut b = [0u8; 4];
    let r = c.read(&mut b);
    assert!(matches!(r, Ok(0)), "{r:?}");
    let t = start.elapsed();
    assert!(
        t >= Duration::from_millis(300) && t < Duration::from_secs(5),
        "{t:?}"
    );
}

#[test]
fn a_relay_counts_once_in_accepted_and_active_and_in_no_http_phase() {
    let (up, _) = upstream(echo);
    let s = Server::start_ports(
        "stream-count",
        &conf(
            1,
            &format!("server {{ listen 127.0.0.1:{{port1}}; proxy_pass 127.0.0.1:{up}; }}"),
        ),
        1,
        1,
    );
    let field = |body: &str, key: &str| -> u64 {
        let pat = format!("\"{key}\":");
        let i = body.find(&pat).unwrap() + pat.len();
        body[i..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect::<String>()
            .parse()
            .unwrap()
    };
    let before = get(s.addr(), "/status").body_str();
    let mut c = TcpStream::connect(local(s.ports[0])).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    c.write_all(b"ping").unwrap();
    let mut b = [0u8; 4];
    c.read_exact(&mut b).unwrap();
    // The relay is open; the status request itself is the other active connection.
    let during = get(s.addr(), "/status").body_str();
    assert_eq!(field(&during, "active"), 2, "{during}");
    assert_eq!(
        field(&during, "accepted"),
        field(&before, "accepted") + 2,
        "{before} / {during}"
    );
    // The status request is the only one in an HTTP phase (writing its own answer).
    let phases = field(&during, "reading") + field(&during, "writing") + field(&during, "waiting");
    assert_eq!(phases, 1, "{during}");
}

#[test]
fn stream_only_configuration_runs() {
    let (up, _) = upstream(says_p);
    let sp = free_port();
    let dir = temp_dir("stream-only");
    std::fs::write(
        dir.join("conf/shard.conf"),
        format!(
            "error_log logs/error.log info;\nevents {{ }}\n\
             stream {{ server {{ listen 127.0.0.1:{sp}; proxy_pass 127.0.0.1:{up}; }} }}\n"
        ),
    )
    .unwrap();
    let mut child = std::process::Command::new(BIN)
        .args(["-g", "daemon off;"])
        .arg("-p")
        .arg(&dir)
        .arg("-c")
        .arg("conf/shard.conf")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let got = wait_for(Duration::from_secs(10), "the stream listener", || {
        let mut c = TcpStream::connect(local(sp)).ok()?;
        c.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        let mut v = Vec::new();
        c.read_to_end(&mut v).ok()?;
        (!v.is_empty()).then_some(v)
    });
    assert_eq!(got, b"P");
    // SAFETY: plain kill(2) on our child.
    unsafe { libc::kill(child.id() as i32, libc::SIGQUIT) };
    let st = wait_for(Duration::from_secs(10), "shard to exit", || {
        child.try_wait().unwrap()
    });
    assert_eq!(st.code(), Some(0));
}

#[test]
fn graceful_stop_lets_an_open_relay_finish() {
    let (up, _) = upstream(echo);
    let mut s = Server::start_ports(
        "stream-quit",
        &conf(
            1,
            &format!("server {{ listen 127.0.0.1:{{port1}}; proxy_pass 127.0.0.1:{up}; }}"),
        ),
        1,
        1,
    );
    let sp = s.ports[0];
    let mut c = TcpStream::connect(local(sp)).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    c.write_all(b"one").unwrap();
    let mut b = [0u8; 3];
    c.read_exact(&mut b).unwrap();
    s.signal(libc::SIGQUIT);
    // The worker stops accepting but keeps relaying.
    wait_for(Duration::from_secs(5), "the graceful stop", || {
        error_log(&s)
            .contains("gracefully shutting down")
            .then_some(())
    });
    c.write_all(b"two").unwrap();
    c.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"two");
    c.shutdown(Shutdown::Write).unwrap();
    let mut rest = Vec::new();
    c.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty());
    assert_eq!(s.wait_exit(Duration::from_secs(10)), 0);
}

#[test]
fn a_lone_peer_is_tried_every_time() {
    let bad = refusing_port();
    let s = Server::start_ports(
        "stream-lone",
        &conf(
            1,
            &format!("server {{ listen 127.0.0.1:{{port1}}; proxy_pass 127.0.0.1:{bad}; }}"),
        ),
        1,
        1,
    );
    let sp = s.ports[0];
    for _ in 0..3 {
        assert_eq!(read_all(sp), "");
    }
    wait_for(
        Duration::from_secs(5),
        "three connect() failed lines",
        || {
            (error_log(&s)
                .matches(&format!("upstream: \"127.0.0.1:{bad}\""))
                .count()
                == 3)
                .then_some(())
        },
    );
}

#[test]
fn relays_outlive_reloads_in_the_old_worker_and_status_lists_it() {
    let (up, _) = upstream(echo);
    let s = Server::start_ports(
        "stream-reload",
        &conf(
            1,
            &format!("server {{ listen 127.0.0.1:{{port1}}; proxy_pass 127.0.0.1:{up}; }}"),
        ),
        1,
        1,
    );
    let old = s.workers()[0].pid;
    let mut c = TcpStream::connect(local(s.ports[0])).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut b = [0u8; 64];
    // Relayed once before the first reload: until then the connection may still wait in the
    // queue, where generation 2's worker would take it.
    c.write_all(b"before").unwrap();
    c.read_exact(&mut b[..6]).unwrap();
    assert_eq!(&b[..6], b"before");
    for g in 2..=4u64 {
        // The same configuration again.
        let path = s.dir.join("conf/shard.conf");
        std::fs::write(&path, std::fs::read(&path).unwrap()).unwrap();
        s.signal(libc::SIGHUP);
        wait_for(Duration::from_secs(10), &format!("generation {g}"), || {
            let body = get(s.addr(), "/status").body_str();
            body.contains(&format!("{{\"generation\":{g},"))
                .then_some(())
                .filter(|()| s.workers().iter().all(|w| w.pid != old))
        });
        let m = format!("still relayed after reload {g}");
        c.write_all(m.as_bytes()).unwrap();
        c.read_exact(&mut b[..m.len()]).unwrap();
        assert_eq!(&b[..m.len()], m.as_bytes());
    }
    let body = get(s.addr(), "/status").body_str();
    assert!(
        body.contains(&format!("\"old_workers\":[{{\"pid\":{old},")) && pid_alive(old as i32),
        "{body}"
    );
    drop(c);
    wait_for(Duration::from_secs(10), "the old worker to exit", || {
        (!pid_alive(old as i32)).then_some(())
    });
}

/// `return` (`ngx_stream_return_module`) with variables, stream `allow`/`deny`, and
/// `proxy_next_upstream off` (one attempt only).
#[test]
fn stream_return_access_and_next_upstream_off() {
    let dead = support::upstream::refusing_port();
    let good = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let good_port = good.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for c in good.incoming() {
            let Ok(mut c) = c else { return };
            let _ = c.write_all(b"good");
        }
    });
    let conf = format!(
        "worker_processes 1;\nevents {{}}\nhttp {{\n server {{\n  listen 127.0.0.1:{{port}};\n  \
         location = /status {{ shard_status; }}\n }}\n}}\nstream {{\n \
         upstream two {{ server 127.0.0.1:{dead}; server 127.0.0.1:{good_port}; }}\n \
         server {{ listen 127.0.0.1:{{port1}}; return \"hi $remote_addr $server_port\\n\"; }}\n \
         server {{ listen 127.0.0.1:{{port7}}; return \"$connection\"; }}\n \
         server {{ listen 127.0.0.1:{{port2}}; deny 127.0.0.1; return x; }}\n \
         server {{ listen 127.0.0.1:{{port3}}; proxy_next_upstream off; proxy_pass two; }}\n \
         server {{ listen 127.0.0.1:{{port4}}; proxy_pass two; }}\n \
         upstream dead2 {{ server 127.0.0.1:{dead}; server 127.0.0.1:{dead}; server 127.0.0.1:{good_port}; }}\n \
         server {{ listen 127.0.0.1:{{port5}}; proxy_next_upstream_tries 2; proxy_pass dead2; }}\n \
         server {{ listen 127.0.0.1:{{port6}}; proxy_next_upstream_tries 3; proxy_pass dead2; }}\n}}\n"
    );
    let s = Server::start_ports("stream-return", &conf, 1, 7);
    let read_all = |port: u16| {
        let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut out = Vec::new();
        let _ = c.read_to_end(&mut out);
        String::from_utf8_lossy(&out).into_owned()
    };
    assert_eq!(
        read_all(s.ports[0]),
        format!("hi 127.0.0.1 {}\n", s.ports[0])
    );
    assert_eq!(read_all(s.ports[1]), "", "denied");
    // `return` sees the connection's number (taken at accept), one more each time.
    let n1: u64 = read_all(s.ports[6]).parse().unwrap();
    let n2: u64 = read_all(s.ports[6]).parse().unwrap();
    assert!(n1 > 0 && n2 > n1, "{n1} {n2}");
    // Round robin starts at the refusing peer: off gives up, on goes to the next.
    assert_eq!(read_all(s.ports[2]), "");
    assert_eq!(read_all(s.ports[3]), "good");
    // `proxy_next_upstream_tries`: two dead peers first, so 2 tries give up, 3 reach it.
    assert_eq!(read_all(s.ports[4]), "");
    assert_eq!(read_all(s.ports[5]), "good");
    let log = wait_for(Duration::from_secs(5), "the access line", || {
        let l = error_log(&s);
        l.contains("access forbidden by rule").then_some(l)
    });
    assert!(
        log.contains("client: 127.0.0.1, server: 127.0.0.1:"),
        "{log}"
    );
}

/// `log_format`/`access_log` in `stream`: one line per session when it ends, with the
/// stream's variables, for relayed, refused (502), denied (403) and `return` sessions;
/// `if=` and `off`.
#[test]
fn stream_access_log_lines() {
    let (echo_port, _) = upstream(echo);
    let dead = refusing_port();
    let conf = conf(
        1,
        &format!(
            "log_format s '$remote_addr $protocol $status $bytes_sent $bytes_received \
             \"$upstream_addr\" $upstream_bytes_sent $upstream_bytes_received $server_port \
             $session_time $upstream_connect_time';\n\
             access_log logs/stream.log s;\n\
             server {{ listen 127.0.0.1:{{port1}}; proxy_pass 127.0.0.1:{echo_port}; }}\n\
             server {{ listen 127.0.0.1:{{port2}}; proxy_pass 127.0.0.1:{dead}; }}\n\
             server {{ listen 127.0.0.1:{{port3}}; deny all; return x; }}\n\
             server {{ listen 127.0.0.1:{{port4}}; return \"hello $remote_port\"; \
               access_log logs/only.log s if=$upstream_addr; }}\n\
             server {{ listen 127.0.0.1:{{port5}}; return quiet; access_log off; }}"
        ),
    );
    let s = Server::start_ports("stream-log", &conf, 1, 5);
    let mut c = TcpStream::connect(local(s.ports[0])).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    c.write_all(b"hello world").unwrap();
    c.shutdown(Shutdown::Write).unwrap();
    let mut back = Vec::new();
    c.read_to_end(&mut back).unwrap();
    assert_eq!(back, b"hello world");
    assert_eq!(read_all(s.ports[1]), "");
    assert_eq!(read_all(s.ports[2]), "");
    assert!(read_all(s.ports[3]).starts_with("hello "));
    assert_eq!(read_all(s.ports[4]), "quiet");
    let path = s.dir.join("logs/stream.log");
    let log = wait_for(Duration::from_secs(10), "three stream log lines", || {
        let l = std::fs::read_to_string(&path).unwrap_or_default();
        (l.lines().count() >= 3).then_some(l)
    });
    let lines: Vec<&str> = log.lines().collect();
    assert_eq!(lines.len(), 3, "{log}");
    let relayed = lines
        .iter()
        .find(|l| l.contains(&format!(" {} ", s.ports[0])))
        .unwrap_or_else(|| panic!("{log}"));
    let f: Vec<&str> = relayed.split(' ').collect();
    assert_eq!(
        &f[..5],
        ["127.0.0.1", "TCP", "200", "11", "11"],
        "{relayed}"
    );
    assert_eq!(f[5], format!("\"127.0.0.1:{echo_port}\""), "{relayed}");
    assert_eq!(&f[6..8], ["11", "11"], "{relayed}");
    assert!(f[9].contains('.') && f[10].contains('.'), "{relayed}");
    let refused = lines
        .iter()
        .find(|l| l.contains(&format!(" {} ", s.ports[1])))
        .unwrap_or_else(|| panic!("{log}"));
    assert!(
        refused.starts_with(&format!(
            "127.0.0.1 TCP 502 0 0 \"127.0.0.1:{dead}\" 0 0 {} ",
            s.ports[1]
        )),
        "{refused}"
    );
    let denied = lines
        .iter()
        .find(|l| l.contains(&format!(" {} ", s.ports[2])))
        .unwrap_or_else(|| panic!("{log}"));
    assert!(
        denied.starts_with("127.0.0.1 TCP 403 0 0 \"-\" - - "),
        "{denied}"
    );
    // port4's own log replaces the stream's, and its `if=` held back the line (no upstream).
    assert!(!log.contains(&format!(" {} ", s.ports[3])), "{log}");
    assert!(!log.contains(&format!(" {} ", s.ports[4])), "{log}");
    let only = std::fs::read_to_string(s.dir.join("logs/only.log")).unwrap_or_default();
    assert_eq!(only, "", "if= with an empty value writes nothing");
}

/// `map`, `geo` and `split_clients` in `stream`, in `return` values and log lines.
#[test]
fn stream_map_geo_split_clients_values() {
    let conf = conf(
        1,
        "map $server_port $which { default other; {port1} first; }\n\
         map $which $shout { first FIRST; default -; }\n\
         map $server_port $digits { ~^(\\d)(?<rest>\\d+)$ $1-$rest; }\n\
         geo $net { default far; 127.0.0.0/8 loopback; }\n\
         split_clients $remote_addr$remote_port $half { 100% all; }\n\
         log_format m '$which $net';\n\
         server { listen 127.0.0.1:{port1}; return \"$which $shout $net $half\"; \
           access_log logs/m.log m; }\n\
         server { listen 127.0.0.1:{port2}; return \"$which $shout $digits\"; }",
    );
    let s = Server::start_ports("stream-map", &conf, 1, 2);
    assert_eq!(read_all(s.ports[0]), "first FIRST loopback all");
    // A `map` expression's groups, by number and by name, in its value.
    let p = s.ports[1].to_string();
    assert_eq!(
        read_all(s.ports[1]),
        format!("other - {}-{}", &p[..1], &p[1..])
    );
    let path = s.dir.join("logs/m.log");
    let log = wait_for(Duration::from_secs(10), "the map log line", || {
        std::fs::read_to_string(&path)
            .ok()
            .filter(|l| !l.is_empty())
    });
    assert_eq!(log, "first loopback\n");
}

/// `hash KEY [consistent]` in a stream upstream: one client address always reaches the same
/// peer; a key that varies (the client port) spreads over them.
#[test]
fn stream_upstream_hash() {
    let (p, _) = upstream(says_p);
    let (q, _) = upstream(says_q);
    let (b, _) = upstream(says_b);
    let peers = format!("server 127.0.0.1:{p}; server 127.0.0.1:{q}; server 127.0.0.1:{b};");
    let conf = conf(
        1,
        &format!(
            "upstream by_addr {{ hash $remote_addr; {peers} }}\n\
             upstream ring {{ hash $remote_addr consistent; {peers} }}\n\
             upstream by_port {{ hash $remote_port; {peers} }}\n\
             server {{ listen 127.0.0.1:{{port1}}; proxy_pass by_addr; }}\n\
             server {{ listen 127.0.0.1:{{port2}}; proxy_pass ring; }}\n\
             server {{ listen 127.0.0.1:{{port3}}; proxy_pass by_port; }}"
        ),
    );
    let s = Server::start_ports("stream-hash", &conf, 1, 3);
    for port in [s.ports[0], s.ports[1]] {
        let first = read_all(port);
        assert!(["P", "Q", "B"].contains(&first.as_str()), "{first}");
        for _ in 0..10 {
            assert_eq!(read_all(port), first, "the same address, the same peer");
        }
    }
    let mut seen = std::collections::HashSet::new();
    for _ in 0..30 {
        seen.insert(read_all(s.ports[2]));
    }
    assert_eq!(seen.len(), 3, "ports spread over every peer: {seen:?}");
}

/// The first flight of a TLS client (rustls) naming `sni` and offering `alpn`.
fn client_hello(sni: &str, alpn: &[&[u8]]) -> Vec<u8> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
    cfg.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    let name = rustls::pki_types::ServerName::try_from(sni.to_string()).unwrap();
    let mut c = rustls::ClientConnection::new(Arc::new(cfg), name).unwrap();
    let mut out = Vec::new();
    c.write_tls(&mut out).unwrap();
    out
}

/// Sends `bytes`, ends the sending side, reads everything.
fn send_all(port: u16, bytes: &[u8]) -> String {
    let mut s = TcpStream::connect(local(port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(bytes).unwrap();
    s.shutdown(Shutdown::Write).unwrap();
    let mut v = Vec::new();
    let _ = s.read_to_end(&mut v);
    String::from_utf8_lossy(&v).into_owned()
}

/// `ssl_preread on` with `proxy_pass $variable`: SNI routing as nginx users write it (a
/// `map` of `$ssl_preread_server_name` to an upstream name or an address); the ClientHello
/// reaches the upstream whole; a client that is not TLS, or too slow, goes to the default.
#[test]
fn ssl_preread_routes_by_server_name() {
    let (counter, _) = upstream(count_then_reply);
    let (q, _) = upstream(says_q);
    let conf = conf(
        1,
        &format!(
            "upstream by_name {{ server 127.0.0.1:{counter}; }}\n\
             map $ssl_preread_server_name $be {{ a.test by_name; default 127.0.0.1:{q}; }}\n\
             log_format pre '$ssl_preread_server_name|$ssl_preread_protocol|\
             $ssl_preread_alpn_protocols|$upstream_addr|$status';\n\
             server {{ listen 127.0.0.1:{{port1}}; ssl_preread on; preread_timeout 300ms; \
               proxy_pass $be; access_log logs/pre.log pre; }}\n\
             server {{ listen 127.0.0.1:{{port2}}; ssl_preread on; \
               return \"$ssl_preread_server_name|$ssl_preread_protocol|$ssl_preread_alpn_protocols\"; }}\n\
             server {{ listen 127.0.0.1:{{port3}}; ssl_preread on; \
               proxy_pass $ssl_preread_server_name:443; }}"
        ),
    );
    let s = Server::start_ports("stream-preread", &conf, 1, 3);
    let hello = client_hello("a.test", &[b"h2", b"http/1.1"]);
    assert_eq!(send_all(s.ports[0], &hello), format!("got {}", hello.len()));
    assert_eq!(send_all(s.ports[0], &client_hello("b.test", &[])), "Q");
    assert_eq!(send_all(s.ports[0], b"SSH-2.0-client\r\n"), "Q");
    assert_eq!(send_all(s.ports[1], &hello), "a.test|TLSv1.3|h2,http/1.1");
    // A hello that stops half-way: after preread_timeout, the session goes on.
    let mut c = TcpStream::connect(local(s.ports[0])).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    c.write_all(&hello[..20]).unwrap();
    let t = Instant::now();
    let mut v = Vec::new();
    let _ = c.read_to_end(&mut v);
    assert_eq!(v, b"Q");
    assert!(
        t.elapsed() >= Duration::from_millis(250),
        "{:?}",
        t.elapsed()
    );
    // A name, not an address, without a resolver: closed, logged as nginx.
    assert_eq!(send_all(s.ports[2], &hello), "");
    let log = wait_for(Duration::from_secs(10), "the resolver line", || {
        let l = error_log(&s);
        l.contains("no resolver defined to resolve a.test")
            .then_some(l)
    });
    assert!(log.contains("no resolver defined"), "{log}");
    let path = s.dir.join("logs/pre.log");
    let lines = wait_for(Duration::from_secs(10), "four log lines", || {
        let l = std::fs::read_to_string(&path).unwrap_or_default();
        (l.lines().count() >= 4).then_some(l)
    });
    let lines: Vec<&str> = lines.lines().collect();
    assert_eq!(
        lines[0],
        format!("a.test|TLSv1.3|h2,http/1.1|127.0.0.1:{counter}|200")
    );
    assert_eq!(lines[1], format!("b.test|TLSv1.3|-|127.0.0.1:{q}|200"));
    assert_eq!(lines[2], format!("-|-|-|127.0.0.1:{q}|200"));
}

/// `limit_conn_zone`/`limit_conn` in stream: one session per client address at a time; the
/// second is closed (logged, `$status` 503) and the count is given back when the first ends.
#[test]
fn stream_limit_conn_one_per_address() {
    let (echo_port, _) = upstream(echo);
    let conf = conf(
        2,
        &format!(
            "limit_conn_zone $binary_remote_addr zone=per_ip:1m;\n\
             log_format st '$status $limit_conn_status';\n\
             server {{ listen 127.0.0.1:{{port1}}; limit_conn per_ip 1; \
               proxy_pass 127.0.0.1:{echo_port}; access_log logs/st.log st; }}"
        ),
    );
    let s = Server::start_ports("stream-limit-conn", &conf, 2, 1);
    let echo_once = |c: &mut TcpStream| -> bool {
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        if c.write_all(b"ping").is_err() {
            return false;
        }
        let mut b = [0u8; 4];
        c.read_exact(&mut b).is_ok() && &b == b"ping"
    };
    let mut first = TcpStream::connect(local(s.ports[0])).unwrap();
    assert!(echo_once(&mut first), "the first session relays");
    let mut second = TcpStream::connect(local(s.ports[0])).unwrap();
    assert!(
        !echo_once(&mut second),
        "a second one from the same address is refused"
    );
    drop(first);
    wait_for(Duration::from_secs(10), "the count given back", || {
        let mut c = TcpStream::connect(local(s.ports[0])).ok()?;
        echo_once(&mut c).then_some(())
    });
    let log = wait_for(Duration::from_secs(10), "the refusal in the logs", || {
        let l = std::fs::read_to_string(s.dir.join("logs/st.log")).unwrap_or_default();
        l.contains("503").then_some(l)
    });
    assert!(log.lines().any(|l| l == "503 REJECTED"), "{log}");
    assert!(log.lines().any(|l| l == "200 PASSED"), "{log}");
    assert!(
        error_log(&s).contains("limiting connections by zone \"per_ip\""),
        "{}",
        error_log(&s)
    );
}

/// Says the address the connection came from, then closes.
fn says_peer(mut s: TcpStream) {
    let peer = s.peer_addr().unwrap().ip().to_string();
    let _ = s.write_all(peer.as_bytes());
}

/// Sends 2000 bytes, then closes.
fn sends_2000(mut s: TcpStream) {
    let _ = s.write_all(&[b'd'; 2000]);
}

/// `proxy_bind` in stream: upstream connections come from the address (a variable's too);
/// `proxy_download_rate`/`proxy_upload_rate` hold a session to its rate by nginx's formula
/// (one second's share at once, then a share per second), so 2000 bytes at 1000 bytes/s
/// cannot arrive before the session is a second old.
#[test]
fn stream_proxy_bind_and_rates() {
    let (peer_port, _) = upstream(says_peer);
    let (down_port, _) = upstream(sends_2000);
    let (count_port, _) = upstream(count_then_reply);
    let stream = format!(
        "map $server_port $src {{ default 127.0.0.3; }}\n \
         map $server_port $rate {{ default 1000; }}\n \
         server {{ listen 127.0.0.1:{{port1}}; proxy_bind 127.0.0.2; proxy_pass 127.0.0.1:{peer_port}; }}\n \
         server {{ listen 127.0.0.1:{{port2}}; proxy_bind $src; proxy_pass 127.0.0.1:{peer_port}; }}\n \
         server {{ listen 127.0.0.1:{{port3}}; proxy_download_rate $rate; proxy_pass 127.0.0.1:{down_port}; }}\n \
         server {{ listen 127.0.0.1:{{port4}}; proxy_upload_rate 1000; proxy_pass 127.0.0.1:{count_port}; }}\n \
         server {{ listen 127.0.0.1:{{port5}}; proxy_pass 127.0.0.1:{down_port}; }}"
    );
    let s = Server::start_ports("stream-bind-rate", &conf(1, &stream), 1, 5);
    assert_eq!(read_all(s.ports[0]), "127.0.0.2");
    assert_eq!(read_all(s.ports[1]), "127.0.0.3");
    // Unlimited: at once.
    let t = std::time::Instant::now();
    assert_eq!(read_all(s.ports[4]).len(), 2000);
    let unlimited = t.elapsed();
    let down_port = s.ports[2];
    let down = std::thread::spawn(move || {
        let t = std::time::Instant::now();
        let got = read_all(down_port);
        (got.len(), t.elapsed())
    });
    let t = std::time::Instant::now();
    let mut c = TcpStream::connect(local(s.ports[3])).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    c.write_all(&[b'u'; 2000]).unwrap();
    c.shutdown(Shutdown::Write).unwrap();
    let mut reply = String::new();
    c.read_to_string(&mut reply).unwrap();
    let up_took = t.elapsed();
    assert_eq!(reply, "got 2000");
    let (n, down_took) = down.join().unwrap();
    assert_eq!(n, 2000);
    for (what, took) in [("download", down_took), ("upload", up_took)] {
        assert!(
            took >= Duration::from_millis(950) && took < Duration::from_secs(8),
            "{what} took {took:?} (unlimited: {unlimited:?})"
        );
    }
}

/// A UDP echo peer: each datagram comes back `n` times (`n` from its first byte when it is a
/// digit, else once), for the tests' lifetime.
fn udp_echo() -> u16 {
    let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let port = s.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let mut buf = [0u8; 2048];
        while let Ok((n, from)) = s.recv_from(&mut buf) {
            let times = match buf.first() {
                Some(d) if n > 0 && d.is_ascii_digit() => usize::from(d - b'0'),
                _ => 1,
            };
            for _ in 0..times {
                let _ = s.send_to(&buf[..n], from);
            }
        }
    });
    port
}

/// `listen ... udp` as nginx's stream UDP proxy: a session per client address, answers back
/// through the listening socket, `proxy_responses` ending it (0: none expected), `return`,
/// `$protocol` `UDP` and one access line per session, `allow`/`deny`, `limit_conn`, and a
/// peer that refuses (ICMP) counted as failed so the next sessions go elsewhere.
#[test]
fn udp_sessions_as_nginx() {
    let echo = udp_echo();
    // A port with no socket: datagrams sent there come back as ICMP errors.
    let dead = {
        let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        s.local_addr().unwrap().port()
    };
    let stream = format!(
        "log_format u '$protocol $status $bytes_received $bytes_sent $upstream_addr';\n\
         limit_conn_zone $binary_remote_addr zone=one:1m;\n\
         proxy_timeout 1s;\n\
         upstream flaky {{ server 127.0.0.1:{dead}; server 127.0.0.1:{echo}; }}\n\
         server {{ listen 127.0.0.1:{{port1}} udp; proxy_pass 127.0.0.1:{echo}; proxy_responses 1;\n\
           access_log logs/udp.log u; }}\n\
         server {{ listen 127.0.0.1:{{port2}} udp; proxy_pass 127.0.0.1:{echo}; proxy_responses 0; }}\n\
         server {{ listen 127.0.0.1:{{port3}} udp; return \"hi $protocol $remote_addr\"; }}\n\
         server {{ listen 127.0.0.1:{{port4}} udp; deny 127.0.0.1; return x; }}\n\
         server {{ listen 127.0.0.1:{{port5}} udp; proxy_pass flaky; proxy_responses 1; }}\n\
         server {{ listen 127.0.0.1:{{port6}} udp; proxy_pass 127.0.0.1:{echo}; limit_conn one 1; }}"
    );
    let s = Server::start_ports("stream-udp", &conf(1, &stream), 1, 6);
    let client = || {
        let c = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        c.set_read_timeout(Some(Duration::from_millis(600)))
            .unwrap();
        c
    };
    // Only answers from the port asked count: a fresh client socket may get the port of one
    // dropped before it, and a late datagram meant for that one.
    let ask = |c: &std::net::UdpSocket, port: u16, what: &[u8], answers: usize| {
        c.send_to(what, ("127.0.0.1", port)).unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 2048];
        while got.len() < answers {
            match c.recv_from(&mut buf) {
                Ok((n, from)) if from.port() == port => {
                    got.push(String::from_utf8_lossy(&buf[..n]).into_owned())
                }
                Ok(_) => {}
                Err(_) => break,
            }
        }
        got
    };
    let c = client();
    assert_eq!(ask(&c, s.ports[0], b"ping", 1), vec!["ping"]);
    // The session ended with its answer: the next datagram is a new session, answered too.
    assert_eq!(
        ask(&c, s.ports[0], b"2x", 2),
        vec!["2x"],
        "proxy_responses 1: one answer"
    );
    assert!(ask(&c, s.ports[1], b"nothing back", 1).is_empty());
    assert_eq!(ask(&c, s.ports[2], b"?", 1), vec!["hi UDP 127.0.0.1"]);
    assert!(ask(&c, s.ports[3], b"?", 1).is_empty(), "denied");
    // The first session meets the refusing peer (no answer); it is then failed, and the
    // next sessions all reach the echo.
    let _ = ask(&client(), s.ports[4], b"first", 1);
    for i in 0..4 {
        let msg = format!("n{i}");
        assert_eq!(ask(&client(), s.ports[4], msg.as_bytes(), 1), vec![msg]);
    }
    // limit_conn: one live session per address; the second client from 127.0.0.1 is
    // refused while the first (no proxy_responses: it lasts until proxy_timeout) lives.
    assert_eq!(ask(&c, s.ports[5], b"a", 1), vec!["a"]);
    assert!(ask(&client(), s.ports[5], b"b", 1).is_empty());
    let log = wait_for(Duration::from_secs(5), "the UDP access lines", || {
        let t = std::fs::read_to_string(s.dir.join("logs/udp.log")).unwrap_or_default();
        (t.lines().count() >= 2).then_some(t)
    });
    let first = log.lines().next().unwrap();
    assert_eq!(first, format!("UDP 200 4 4 127.0.0.1:{echo}"), "{log}");
    let e = error_log(&s);
    assert!(e.contains("limiting connections by zone \"one\""), "{e}");
}

/// The upstream variables keep one value per attempt, as nginx's states (a failed attempt
/// sent and received nothing, its times are `-`); with peers left but none live, the attempt
/// is the upstream's name; an evaluation error of `proxy_pass $var` is status 500.
#[test]
fn stream_upstream_variables_per_attempt_and_no_live_upstreams() {
    let (echo_port, _) = upstream(echo);
    let (dead, dead2, dead3) = (refusing_port(), refusing_port(), refusing_port());
    let conf = conf(
        1,
        &format!(
            "log_format a '$server_port|$status|$upstream_addr|$upstream_bytes_sent|\
             $upstream_bytes_received|$upstream_connect_time';\n\
             access_log logs/a.log a;\n\
             upstream two {{ server 127.0.0.1:{dead}; server 127.0.0.1:{echo_port}; }}\n\
             upstream nl {{ server 127.0.0.1:{dead2}; server 127.0.0.1:{dead3}; }}\n\
             server {{ listen 127.0.0.1:{{port1}}; proxy_pass two; }}\n\
             server {{ listen 127.0.0.1:{{port2}}; proxy_pass nl; }}\n\
             server {{ listen 127.0.0.1:{{port3}}; proxy_pass nowhere.test:$remote_port; }}"
        ),
    );
    let s = Server::start_ports("stream-attempts", &conf, 1, 3);
    let mut c = TcpStream::connect(local(s.ports[0])).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    c.write_all(b"hello").unwrap();
    c.shutdown(Shutdown::Write).unwrap();
    let mut back = Vec::new();
    c.read_to_end(&mut back).unwrap();
    assert_eq!(back, b"hello");
    assert_eq!(read_all(s.ports[1]), "");
    assert_eq!(read_all(s.ports[1]), "");
    assert_eq!(read_all(s.ports[2]), "");
    let path = s.dir.join("logs/a.log");
    let log = wait_for(Duration::from_secs(10), "four log lines", || {
        let l = std::fs::read_to_string(&path).unwrap_or_default();
        (l.lines().count() >= 4).then_some(l)
    });
    let lines: Vec<&str> = log.lines().collect();
    let of = |port: u16| -> Vec<&str> {
        lines
            .iter()
            .filter(|l| l.starts_with(&format!("{port}|")))
            .copied()
            .collect()
    };
    let two = of(s.ports[0]);
    assert_eq!(two.len(), 1, "{log}");
    let f: Vec<&str> = two[0].split('|').collect();
    assert_eq!(f[1], "200", "{log}");
    assert_eq!(f[2], format!("127.0.0.1:{dead}, 127.0.0.1:{echo_port}"));
    assert_eq!((f[3], f[4]), ("0, 5", "0, 5"), "{log}");
    assert!(f[5].starts_with("-, 0."), "{log}");
    let nl = of(s.ports[1]);
    assert_eq!(
        nl,
        [
            format!(
                "{}|502|127.0.0.1:{dead2}, 127.0.0.1:{dead3}|0, 0|0, 0|-, -",
                s.ports[1]
            ),
            format!("{}|502|nl|0|0|-", s.ports[1]),
        ],
        "{log}"
    );
    let bad = of(s.ports[2]);
    assert!(bad.len() == 1 && bad[0].contains("|500|"), "{log}");
    assert!(error_log(&s).contains("no live upstreams while connecting to upstream"));
}

/// `proxy_upload_rate` and `proxy_download_rate` on UDP sessions, as nginx's allowance (the
/// rate for each second begun, less what went): a second 1000-byte datagram at 500 bytes a
/// second waits about a second each way, whole (a datagram is never split), and arrives.
#[test]
fn udp_rates_delay_datagrams_whole() {
    let echo = udp_echo();
    let stream = format!(
        "proxy_timeout 5s;\n\
         server {{ listen 127.0.0.1:{{port1}} udp; proxy_pass 127.0.0.1:{echo};\n\
           proxy_upload_rate 500; }}\n\
         server {{ listen 127.0.0.1:{{port2}} udp; proxy_pass 127.0.0.1:{echo};\n\
           proxy_download_rate 500; }}"
    );
    let s = Server::start_ports("stream-udp-rate", &conf(1, &stream), 1, 2);
    let data = "1234567890".repeat(100);
    for port in [s.ports[0], s.ports[1]] {
        let c = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut buf = [0u8; 2048];
        c.send_to(data.as_bytes(), ("127.0.0.1", port)).unwrap();
        let (n, _) = c.recv_from(&mut buf).unwrap();
        assert_eq!(&buf[..n], data.as_bytes(), "the first goes at once");
        let t = std::time::Instant::now();
        c.send_to(data.as_bytes(), ("127.0.0.1", port)).unwrap();
        let (n, _) = c.recv_from(&mut buf).unwrap();
        assert_eq!(&buf[..n], data.as_bytes(), "whole");
        assert!(
            t.elapsed() >= Duration::from_millis(700),
            "port {port}: {:?}",
            t.elapsed()
        );
    }
}
