//! Request bodies as a client, an upstream and the file system see them: bodies below and above
//! `client_body_buffer_size` reach the upstream byte-exact, the larger ones through a temporary
//! file that never has a name on disk (not during the request, not after a `kill -9`), worker
//! memory stays bounded with many stalled uploads, a body over `client_max_body_size` is
//! refused before it is read, a slow body is cut at `client_body_timeout`, a body nobody needs
//! is discarded under `lingering_timeout`/`lingering_time`, and `proxy_request_buffering off`
//! streams a body to the upstream while it arrives.
//!
//! `worker_processes 1` everywhere: the status counters read are that worker's.

mod support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::time::{Duration, Instant};

use support::upstream::{pattern, Reply, Upstream};
use support::*;

fn conf(http_extra: &str, server_extra: &str) -> String {
    format!(
        "worker_processes 1;\n\
         error_log logs/error.log info;\n\
         events {{ worker_connections 1024; }}\n\
         http {{\n\
         access_log off;\n\
         proxy_connect_timeout 2s; proxy_read_timeout 5s; proxy_send_timeout 5s;\n\
         {http_extra}\n\
         server {{\n\
         listen 127.0.0.1:{{port}};\n\
         location = /status {{ shard_status; }}\n\
         {server_extra}\n\
         }}\n\
         }}\n"
    )
}

/// No request-body file is left anywhere under the prefix.
fn assert_no_body_files(s: &Server) {
    for d in ["client_body_temp", "body_temp", "var/spool"] {
        let left = files_under(&s.dir.join(d));
        assert!(left.is_empty(), "temporary files left: {left:?}");
    }
}

fn worker(s: &Server) -> Worker {
    let r = get(s.addr(), "/status");
    let mut ws = parse_workers(&r.body_str());
    assert_eq!(ws.len(), 1, "{}", r.body_str());
    ws.remove(0)
}

/// Every file under `dir`, recursively (directories themselves are not listed).
fn files_under(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in rd.flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(files_under(&p));
        } else {
            out.push(p.display().to_string());
        }
    }
    out
}

fn chunked(data: &[u8], piece: usize) -> Vec<u8> {
    let mut out = Vec::new();
    for c in data.chunks(piece.max(1)) {
        out.extend_from_slice(format!("{:x}\r\n", c.len()).as_bytes());
        out.extend_from_slice(c);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"0\r\n\r\n");
    out
}

fn client(addr: SocketAddr) -> TcpStream {
    let c = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).expect("connect");
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    c.set_write_timeout(Some(Duration::from_secs(10))).unwrap();
    c
}

fn rss_kib(pid: u64) -> u64 {
    let st = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    st.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("VmRSS")
}

#[test]
fn bodies_below_and_above_the_buffer_reach_the_upstream_byte_exact() {
    let up = Upstream::start(|_| Reply::Echo);
    let s = Server::start(
        "body-sizes",
        &conf(
            "client_max_body_size 10m; client_body_buffer_size 8k;",
            &format!("location / {{ proxy_pass http://127.0.0.1:{}; }}", up.port),
        ),
        1,
    );
    let mut spooled_before = worker(&s).body_spooled_bytes;
    for (i, &len) in [1usize, 8191, 8192, 8193, 65_537, 3_000_001]
        .iter()
        .enumerate()
    {
        for chunk in [false, true] {
            let data = pattern(len, i as u64 + 1);
            let mut c = client(s.addr());
            if chunk {
                c.write_all(b"POST /b HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
                    .unwrap();
                c.write_all(&chunked(&data, 5000)).unwrap();
            } else {
                c.write_all(
                    format!("POST /b HTTP/1.1\r\nHost: x\r\nContent-Length: {len}\r\n\r\n")
                        .as_bytes(),
                )
                .unwrap();
                c.write_all(&data).unwrap();
            }
            let r = read_response(&mut c, false).expect("response");
            assert_eq!(r.status, 200, "{len} bytes, chunked {chunk}");
            assert!(r.body == data, "{len} bytes (chunked {chunk}) echoed wrong");
            let u = up.last();
            assert!(
                u.body == data,
                "{len} bytes (chunked {chunk}) reached the upstream wrong"
            );
            assert_eq!(u.header("content-length"), Some(len.to_string().as_str()));
            let w = worker(&s);
            let spooled = w.body_spooled_bytes - spooled_before;
            spooled_before = w.body_spooled_bytes;
            if len > 8192 {
                assert_eq!(spooled, len as u64, "{len} bytes were not spooled whole");
            } else {
                assert_eq!(spooled, 0, "{len} bytes went to a file");
            }
            assert_eq!(w.body_temp_files, 0, "a body file stays open");
            assert_eq!(w.body_mem_bytes, 0, "body memory stays charged");
        }
    }
    let left = files_under(&s.dir.join("client_body_temp"));
    assert!(left.is_empty(), "temporary files left: {left:?}");
    assert_no_body_files(&s);
}

/// The body file of an upload in progress: the descriptor the worker holds, its name, and
/// whether that name still exists.
fn body_fds(pid: u64) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
    {
        if let Ok(t) = std::fs::read_link(e.path()) {
            let t = t.display().to_string();
            if t.contains("body_temp") {
                out.push(t);
            }
        }
    }
    out
}

#[test]
fn a_body_file_has_no_name_on_disk_during_the_upload_nor_after_kill_9() {
    let up = Upstream::text("ok");
    let mut s = Server::start(
        "body-nofile",
        &conf(
            "client_max_body_size 10m; client_body_temp_path body_temp 1 2;",
            &format!("location / {{ proxy_pass http://127.0.0.1:{}; }}", up.port),
        ),
        1,
    );
    let pid = worker(&s).pid;
    let mut c = client(s.addr());
    c.write_all(b"POST /u HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n")
        .unwrap();
    c.write_all(&pattern(900_000, 3)).unwrap();
    wait_for(Duration::from_secs(5), "the body to be spooled", || {
        let w = worker(&s);
        (w.body_temp_files == 1 && w.body_spooled_bytes >= 880_000).then_some(())
    });
    let fds = body_fds(pid);
    assert_eq!(fds.len(), 1, "{fds:?}");
    assert!(
        fds[0].ends_with("(deleted)"),
        "the body file has a name: {fds:?}"
    );
    let dir = s.dir.join("body_temp");
    assert!(files_under(&dir).is_empty(), "{:?}", files_under(&dir));
    // A crash leaves nothing behind either; the respawned worker starts from zero.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGKILL) }, 0);
    let ws = wait_for(Duration::from_secs(10), "a respawned worker", || {
        let ws = s.workers();
        (ws.len() == 1 && ws[0].pid != pid && ws[0].pid > 0).then_some(ws)
    });
    let w = worker(&s);
    assert_eq!((w.body_temp_files, w.body_mem_bytes), (0, 0), "{ws:?}");
    assert!(files_under(&dir).is_empty(), "{:?}", files_under(&dir));
    drop(c);
    let _ = s.wait_workers(1);
    assert_no_body_files(&s);
}

#[test]
fn stalled_uploads_hold_little_worker_memory() {
    const CLIENTS: usize = 50;
    let up = Upstream::text("ok");
    let s = Server::start(
        "body-stalled",
        &conf(
            "client_max_body_size 10m;",
            &format!("location / {{ proxy_pass http://127.0.0.1:{}; }}", up.port),
        ),
        1,
    );
    let pid = worker(&s).pid;
    // Warm the worker's allocator and buffers with one complete upload.
    let mut c = client(s.addr());
    c.write_all(b"POST /u HTTP/1.1\r\nHost: x\r\nContent-Length: 900000\r\n\r\n")
        .unwrap();
    c.write_all(&pattern(900_000, 1)).unwrap();
    assert_eq!(read_response(&mut c, false).unwrap().status, 200);
    drop(c);
    let before = rss_kib(pid);
    let data = pattern(900_000, 2);
    let mut held = Vec::new();
    for _ in 0..CLIENTS {
        let mut c = client(s.addr());
        c.write_all(b"POST /u HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n")
            .unwrap();
        c.write_all(&data).unwrap();
        held.push(c);
    }
    let w = wait_for(Duration::from_secs(20), "every upload to be read", || {
        let w = worker(&s);
        (w.body_temp_files == CLIENTS as u64
            && w.body_spooled_bytes >= 900_000 + (CLIENTS as u64) * 880_000)
            .then_some(w)
    });
    let after = rss_kib(pid);
    let per_conn = (after.saturating_sub(before)) * 1024 / CLIENTS as u64;
    eprintln!(
        "{CLIENTS} stalled 900 KB uploads: worker RSS {before} -> {after} KiB, {per_conn} B per \
         connection, body memory {} B",
        w.body_mem_bytes
    );
    assert!(
        per_conn <= 64 * 1024,
        "{per_conn} bytes of worker memory per stalled upload"
    );
    assert!(
        w.body_mem_bytes <= (CLIENTS as u64) * 16 * 1024,
        "body memory {}",
        w.body_mem_bytes
    );
    drop(held);
    assert_no_body_files(&s);
}

#[test]
fn a_body_over_client_max_body_size_gets_413_before_it_is_read_and_no_100_continue() {
    let up = Upstream::text("ok");
    let s = Server::start(
        "body-413",
        &conf(
            "client_max_body_size 1k;",
            &format!(
                "location / {{ proxy_pass http://127.0.0.1:{}; }}\n\
                 location /static/ {{ root html; }}",
                up.port
            ),
        ),
        1,
    );
    for path in ["/p", "/static/x"] {
        let mut c = client(s.addr());
        c.write_all(
            format!(
                "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\
                 Expect: 100-continue\r\n\r\n"
            )
            .as_bytes(),
        )
        .unwrap();
        // Nothing of the body was sent: the answer comes anyway, and it is the final one.
        let r = read_response(&mut c, false).expect("response");
        assert_eq!(r.status, 413, "{path}");
        assert_eq!(r.header("connection"), Some("close"), "{path}");
    }
    assert_eq!(up.requests(), 0);
    assert!(error_log(&s).contains("client intended to send too large body: 5000 bytes"));
    assert_no_body_files(&s);
}

#[test]
fn a_failed_attempt_resends_a_spooled_body_to_the_next_peer() {
    // The first peer answers 502 to everything; the second echoes. The body (on file) must
    // reach the second one whole.
    let bad = Upstream::start(|_| Reply::text(502, "bad"));
    let good = Upstream::start(|_| Reply::Echo);
    let s = Server::start(
        "body-retry",
        &conf(
            &format!(
                "client_max_body_size 10m;\n\
                 upstream pair {{ server 127.0.0.1:{}; server 127.0.0.1:{}; }}",
                bad.port, good.port
            ),
            "location / { proxy_pass http://pair; \
             proxy_next_upstream error timeout http_502 non_idempotent; }",
        ),
        1,
    );
    for i in 0..2 {
        let data = pattern(200_000 + i, 9);
        let mut c = client(s.addr());
        c.write_all(
            format!(
                "POST /r HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n",
                data.len()
            )
            .as_bytes(),
        )
        .unwrap();
        c.write_all(&data).unwrap();
        let r = read_response(&mut c, false).expect("response");
        assert_eq!(r.status, 200);
        assert!(
            r.body == data,
            "attempt {i}: the body reached the next peer wrong"
        );
    }
    assert!(bad.requests() >= 1 && good.requests() == 2);
    assert!(bad.received().iter().all(|u| u.body.len() >= 200_000));
    assert_no_body_files(&s);
}

/// Reads until `n` bytes arrived or the deadline passed.
fn read_at_least(s: &mut TcpStream, n: usize, within: Duration) -> Vec<u8> {
    let deadline = Instant::now() + within;
    let mut got = Vec::new();
    let mut buf = [0u8; 65536];
    while got.len() < n && Instant::now() < deadline {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(k) => got.extend_from_slice(&buf[..k]),
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::TimedOut => {}
            Err(e) => panic!("read: {e}"),
        }
    }
    got
}

fn raw_upstream() -> (TcpListener, u16) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    (l, port)
}

/// Reads until end of stream (or a reset); how long that took.
fn time_to_close(c: &mut TcpStream, limit: Duration) -> Duration {
    let t = Instant::now();
    c.set_read_timeout(Some(limit)).unwrap();
    let mut buf = [0u8; 4096];
    loop {
        match c.read(&mut buf) {
            Ok(0) => return t.elapsed(),
            Ok(_) => {}
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::TimedOut =>
            {
                panic!("still open after {limit:?}")
            }
            Err(_) => return t.elapsed(),
        }
    }
}

#[test]
fn a_slow_body_is_cut_at_client_body_timeout_with_408_while_others_are_served() {
    let up = Upstream::text("ok");
    let s = Server::start(
        "body-timeout",
        &conf(
            "client_body_timeout 1s;",
            &format!("location / {{ proxy_pass http://127.0.0.1:{}; }}", up.port),
        ),
        1,
    );
    let mut c = client(s.addr());
    // Before the write: the server's timer cannot start earlier, however late this thread runs.
    let t = Instant::now();
    c.write_all(b"POST /slow HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n0123456789")
        .unwrap();
    // Others are served meanwhile.
    for _ in 0..5 {
        assert_eq!(get(s.addr(), "/status").status, 200);
    }
    let r = read_response(&mut c, false).expect("a 408");
    let took = t.elapsed();
    assert_eq!(r.status, 408);
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_millis(2500),
        "408 after {took:?}"
    );
    assert!(time_to_close(&mut c, Duration::from_secs(3)) < Duration::from_secs(3));
    assert_eq!(up.requests(), 0);
    let log = error_log(&s);
    assert!(
        log.contains(
            "client timed out (110: Connection timed out) while reading client request body"
        ),
        "{log}"
    );
    assert_no_body_files(&s);
}

#[test]
fn an_unneeded_body_is_discarded_under_lingering_timeout_and_lingering_time() {
    let s = Server::start(
        "body-linger",
        &conf(
            "lingering_timeout 1s; lingering_time 3s;",
            "location /static/ { root html; }",
        ),
        1,
    );
    write_file(&s.dir, "html/static/x", b"a static file");
    // Silence after part of the body: closed lingering_timeout after the last byte.
    let mut c = client(s.addr());
    c.write_all(b"POST /static/x HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n")
        .unwrap();
    c.write_all(&pattern(100_000, 1)).unwrap();
    let r = read_response(&mut c, false).expect("a 405");
    assert_eq!(r.status, 405);
    let took = time_to_close(&mut c, Duration::from_secs(10));
    assert!(
        took >= Duration::from_millis(700) && took < Duration::from_millis(2500),
        "closed {took:?} after the response"
    );

    // A trickle that never ends: closed at lingering_time.
    let mut c = client(s.addr());
    c.write_all(b"POST /static/x HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\nab")
        .unwrap();
    let r = read_response(&mut c, false).expect("a 405");
    assert_eq!(r.status, 405);
    let t = Instant::now();
    let mut w = c.try_clone().unwrap();
    let trickle = std::thread::spawn(move || {
        for _ in 0..40 {
            std::thread::sleep(Duration::from_millis(250));
            if w.write_all(b"x").is_err() {
                return;
            }
        }
    });
    let took = time_to_close(&mut c, Duration::from_secs(10));
    let _ = t;
    assert!(
        took >= Duration::from_millis(2500) && took < Duration::from_millis(4500),
        "closed {took:?} after the response"
    );
    trickle.join().unwrap();

    // A whole body is discarded and the connection goes on.
    let mut c = client(s.addr());
    c.write_all(b"POST /static/x HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello")
        .unwrap();
    assert_eq!(read_response(&mut c, false).unwrap().status, 405);
    c.write_all(b"GET /status HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    assert_eq!(read_response(&mut c, false).unwrap().status, 200);
    assert_no_body_files(&s);
}

#[test]
fn a_streamed_body_reaches_the_upstream_before_the_client_finished_with_back_pressure() {
    let (l, port) = raw_upstream();
    let s = Server::start(
        "body-stream",
        &conf(
            "client_max_body_size 100m;",
            &format!(
                "location / {{ proxy_pass http://127.0.0.1:{port}; proxy_request_buffering off; }}"
            ),
        ),
        1,
    );
    const LEN: usize = 8_000_000;
    let data = pattern(LEN, 4);
    let mut c = client(s.addr());
    c.write_all(format!("POST /s HTTP/1.1\r\nHost: x\r\nContent-Length: {LEN}\r\n\r\n").as_bytes())
        .unwrap();
    c.write_all(&data[..300_000]).unwrap();
    // The upstream sees the head and the first part while the client holds the rest.
    l.set_nonblocking(false).unwrap();
    let (mut up, _) = l.accept().unwrap();
    up.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let first = read_at_least(&mut up, 250_000, Duration::from_secs(5));
    let head_end = first
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a request head")
        + 4;
    let head = String::from_utf8_lossy(&first[..head_end]).to_string();
    assert!(head.contains(&format!("Content-Length: {LEN}")), "{head}");
    assert!(
        first.len() - head_end >= 200_000,
        "only {} body bytes",
        first.len() - head_end
    );
    // The rest, while the upstream reads nothing: the client blocks, the worker holds a
    // bounded buffer.
    let mut w = c.try_clone().unwrap();
    let rest = data[300_000..].to_vec();
    let writer = std::thread::spawn(move || w.write_all(&rest).is_ok());
    let mut peak = 0;
    for _ in 0..20 {
        std::thread::sleep(Duration::from_millis(25));
        peak = peak.max(worker(&s).body_mem_bytes);
    }
    assert!(
        peak <= 64 * 1024,
        "{peak} bytes of body memory while the upstream stalls"
    );
    up.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut got = first[head_end..].to_vec();
    got.extend(read_at_least(
        &mut up,
        LEN - got.len(),
        Duration::from_secs(20),
    ));
    assert!(writer.join().unwrap(), "the client could not send its body");
    assert_eq!(got.len(), LEN);
    assert!(got == data, "the streamed body differs");
    up.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
        .unwrap();
    let r = read_response(&mut c, false).expect("response");
    assert_eq!((r.status, r.body_str().as_str()), (200, "ok"));
    assert_no_body_files(&s);
}

#[test]
fn a_chunked_body_streams_chunked_to_http_1_1_and_is_buffered_for_http_1_0() {
    let up = Upstream::start(|_| Reply::Echo);
    let s = Server::start(
        "body-stream-chunked",
        &conf(
            "client_max_body_size 100m;",
            &format!(
                "location /v11 {{ proxy_pass http://127.0.0.1:{0}; proxy_request_buffering off;\n\
                     proxy_http_version 1.1; }}\n\
                 location /v10 {{ proxy_pass http://127.0.0.1:{0}; proxy_request_buffering off; }}",
                up.port
            ),
        ),
        1,
    );
    for (path, streamed) in [("/v11", true), ("/v10", false)] {
        let data = pattern(500_003, 6);
        let mut c = client(s.addr());
        c.write_all(
            format!("POST {path} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
                .as_bytes(),
        )
        .unwrap();
        c.write_all(&chunked(&data, 7000)).unwrap();
        let r = read_response(&mut c, false).expect("response");
        assert_eq!(r.status, 200, "{path}");
        assert!(r.body == data, "{path}: echoed body differs");
        let u = up.last();
        assert!(u.body == data, "{path}: the upstream got another body");
        assert_eq!(u.chunked, streamed, "{path}");
        if !streamed {
            assert_eq!(u.header("content-length"), Some("500003"));
        }
        // The connection goes on.
        c.write_all(b"GET /status HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        assert_eq!(read_response(&mut c, false).unwrap().status, 200);
    }
    let w = worker(&s);
    assert_eq!((w.body_mem_bytes, w.body_temp_files), (0, 0));
    assert_no_body_files(&s);
}

#[test]
fn an_upstream_answering_before_the_streamed_body_ends_is_passed_on_and_the_rest_discarded() {
    let (l, port) = raw_upstream();
    let s = Server::start(
        "body-stream-early",
        &conf(
            "client_max_body_size 100m;",
            &format!(
                "location / {{ proxy_pass http://127.0.0.1:{port}; proxy_request_buffering off; }}"
            ),
        ),
        1,
    );
    let upstream = std::thread::spawn(move || {
        let (mut up, _) = l.accept().unwrap();
        up.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let head = read_at_least(&mut up, 1, Duration::from_secs(5));
        assert!(head.starts_with(b"POST /s HTTP/1.0\r\n"), "{head:?}");
        up.write_all(b"HTTP/1.1 413 Request Entity Too Large\r\nContent-Length: 4\r\nConnection: close\r\n\r\nbig!")
            .unwrap();
        up.shutdown(std::net::Shutdown::Write).unwrap();
        // Reads what still comes, until shard closes its side.
        let mut buf = [0u8; 65536];
        while matches!(up.read(&mut buf), Ok(n) if n > 0) {}
    });
    const LEN: usize = 2_000_000;
    let data = pattern(LEN, 8);
    let mut c = client(s.addr());
    c.write_all(format!("POST /s HTTP/1.1\r\nHost: x\r\nContent-Length: {LEN}\r\n\r\n").as_bytes())
        .unwrap();
    c.write_all(&data[..100_000]).unwrap();
    let r = read_response(&mut c, false).expect("the upstream's answer");
    assert_eq!((r.status, r.body_str().as_str()), (413, "big!"));
    // The rest of the body is read and dropped; the connection then serves the next request.
    c.write_all(&data[100_000..]).unwrap();
    c.write_all(b"GET /status HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    assert_eq!(read_response(&mut c, false).unwrap().status, 200);
    upstream.join().unwrap();
    assert_eq!(worker(&s).body_mem_bytes, 0);
    assert_no_body_files(&s);
}

#[test]
fn workers_running_as_nobody_can_write_body_files() {
    if unsafe { libc::geteuid() } != 0 {
        skipped(
            "workers_running_as_nobody_can_write_body_files",
            "needs root to run workers as another user",
        );
        return;
    }
    let up = Upstream::start(|_| Reply::Echo);
    let s = Server::start(
        "body-nobody",
        &format!(
            "user nobody nogroup;\n{}",
            conf(
                "client_max_body_size 10m; client_body_temp_path var/spool 2;",
                &format!("location / {{ proxy_pass http://127.0.0.1:{}; }}", up.port),
            )
        ),
        1,
    );
    let meta = std::fs::metadata(s.dir.join("var/spool")).unwrap();
    assert_eq!(
        std::os::unix::fs::MetadataExt::mode(&meta) & 0o777,
        0o700,
        "the temporary directory's mode"
    );
    let data = pattern(100_000, 5);
    let mut c = client(s.addr());
    c.write_all(b"POST /n HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n")
        .unwrap();
    c.write_all(&data).unwrap();
    let r = read_response(&mut c, false).expect("response");
    assert_eq!(r.status, 200, "{}", error_log(&s));
    assert!(r.body == data);
    assert_eq!(worker(&s).body_spooled_bytes, 100_000);
    assert_no_body_files(&s);
}

#[test]
fn proxy_send_timeout_is_between_two_writes_not_the_whole_upload() {
    let (l, port) = raw_upstream();
    // A small receive buffer, so the upload waits on the upstream's reading.
    let small: libc::c_int = 32 * 1024;
    // SAFETY: setsockopt on a valid socket with a valid int.
    unsafe {
        libc::setsockopt(
            std::os::fd::AsRawFd::as_raw_fd(&l),
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            &small as *const libc::c_int as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
    let s = Server::start(
        "body-send-timeout",
        &conf(
            "client_max_body_size 100m;",
            &format!("location / {{ proxy_pass http://127.0.0.1:{port}; proxy_send_timeout 1s; }}"),
        ),
        1,
    );
    const LEN: usize = 6_000_000;
    let upstream = std::thread::spawn(move || {
        let (mut up, _) = l.accept().unwrap();
        up.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        // About 2 MB/s: the whole body takes 3 s, each wait far less than 1 s.
        let mut got = 0;
        let mut buf = [0u8; 40_000];
        let t = Instant::now();
        while got < LEN {
            match up.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => got += n,
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ =
            up.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok");
        (got, t.elapsed())
    });
    let mut c = client(s.addr());
    c.write_all(
        format!("POST /slow HTTP/1.1\r\nHost: x\r\nContent-Length: {LEN}\r\n\r\n").as_bytes(),
    )
    .unwrap();
    c.write_all(&pattern(LEN, 3)).unwrap();
    let r = read_response(&mut c, false).expect("response");
    let (got, took) = upstream.join().unwrap();
    assert!(
        took > Duration::from_millis(1500),
        "the upstream read it all in {took:?}"
    );
    assert_eq!(
        (r.status, got > LEN - 1000),
        (200, true),
        "{}",
        error_log(&s)
    );
    assert_no_body_files(&s);
}

#[test]
fn a_streamed_request_passes_the_upstreams_error_on_rather_than_retrying() {
    let bad = Upstream::start(|_| Reply::text(500, "mine"));
    let good = Upstream::start(|_| Reply::Echo);
    let s = Server::start(
        "body-stream-500",
        &conf(
            &format!(
                "upstream pair {{ server 127.0.0.1:{}; server 127.0.0.1:{}; }}",
                bad.port, good.port
            ),
            "location / { proxy_pass http://pair; proxy_request_buffering off;\n\
                 proxy_next_upstream error timeout http_500; }",
        ),
        1,
    );
    let mut c = client(s.addr());
    c.write_all(b"PUT /p HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello")
        .unwrap();
    let r = read_response(&mut c, false).expect("response");
    assert_eq!((r.status, r.body_str().as_str()), (500, "mine"));
    assert_eq!(
        good.requests(),
        0,
        "the streamed body went to a second peer"
    );
    assert_no_body_files(&s);
}

#[test]
fn after_a_discarded_body_the_next_head_has_client_header_timeout() {
    let s = Server::start(
        "body-linger-next",
        &conf(
            "lingering_timeout 500ms; lingering_time 1s; client_header_timeout 30s;",
            "location /static/ { root html; }",
        ),
        1,
    );
    write_file(&s.dir, "html/static/x", b"a static file");
    let mut c = client(s.addr());
    c.write_all(b"POST /static/x HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhelloGET /status HTTP/1.1\r\nHo")
        .unwrap();
    assert_eq!(read_response(&mut c, false).unwrap().status, 405);
    // A pause past both lingering limits, inside the header timeout.
    std::thread::sleep(Duration::from_millis(1300));
    c.write_all(b"st: x\r\n\r\n").unwrap();
    assert_eq!(read_response(&mut c, false).unwrap().status, 200);
    assert_no_body_files(&s);
}

#[test]
fn a_chunked_body_to_a_location_that_does_not_read_it_is_not_refused() {
    let s = Server::start(
        "body-chunked-return",
        &conf(
            "client_max_body_size 1k;",
            "location /r { return 200 \"answered\"; }",
        ),
        1,
    );
    // The length is not known in advance: `return` answers, as nginx, without reading the
    // body for the location (its size never reaches a check that would give 413).
    let mut c = client(s.addr());
    c.write_all(b"POST /r HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
        .unwrap();
    c.write_all(&chunked(&pattern(5000, 1), 1000)).unwrap();
    let r = read_response(&mut c, false).expect("response");
    assert_eq!((r.status, r.body_str().as_str()), (200, "answered"));
    // A Content-Length above the limit is refused before anything is read, in any location.
    let mut c = client(s.addr());
    c.write_all(b"POST /r HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\n")
        .unwrap();
    assert_eq!(read_response(&mut c, false).unwrap().status, 413);
    assert_no_body_files(&s);
}

#[test]
fn the_workers_a_reload_starts_begin_with_every_counter_at_zero() {
    let up = Upstream::text("ok");
    let s = Server::start(
        "body-reload-counters",
        &conf(
            "client_max_body_size 10m;",
            &format!("location / {{ proxy_pass http://127.0.0.1:{}; }}", up.port),
        ),
        1,
    );
    let mut c = client(s.addr());
    c.write_all(b"POST /u HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n")
        .unwrap();
    c.write_all(&pattern(100_000, 1)).unwrap();
    assert_eq!(read_response(&mut c, false).unwrap().status, 200);
    drop(c);
    let old = worker(&s);
    assert_eq!(old.body_spooled_bytes, 100_000);
    s.signal(libc::SIGHUP);
    let new = wait_for(Duration::from_secs(10), "the new generation", || {
        let w = worker(&s);
        (w.pid != old.pid && w.pid > 0).then_some(w)
    });
    assert_eq!(new.body_spooled_bytes, 0, "{new:?}");
    assert!(new.requests <= 2 && new.accepted <= 2, "{new:?}");
    assert_no_body_files(&s);
}

/// `client_body_in_file_only on|clean` and `$request_body_file`: the body is in a file with
/// that name while the upstream is asked (a local upstream can read it, the point of the
/// directive); `on` keeps it, `clean` removes it. An unnamed file (a body larger than the
/// buffer) is given its name only when the variable is used, and loses it afterwards.
#[test]
fn client_body_in_file_only_and_request_body_file() {
    // The upstream answers with what it found at the path it was given.
    let up = Upstream::start(|r| {
        let path = r.header("x-file").unwrap_or("").to_string();
        match std::fs::read(&path) {
            Ok(b) if b == r.body || r.body.is_empty() => {
                Reply::text(200, &format!("same {}", b.len()))
            }
            Ok(_) => Reply::text(200, "differs"),
            Err(e) => Reply::text(200, &format!("unreadable {path:?}: {e}")),
        }
    });
    let p = up.port;
    let s = Server::start(
        "body-file-only",
        &conf(
            "client_body_temp_path body_temp 1;",
            &format!(
                "location /keep {{ client_body_in_file_only on;\n\
                 proxy_set_header X-File $request_body_file; proxy_pass http://127.0.0.1:{p}; }}\n\
                 location /clean {{ client_body_in_file_only clean;\n\
                 proxy_set_header X-File $request_body_file; proxy_pass http://127.0.0.1:{p}; }}\n\
                 location /big {{ client_body_buffer_size 1k;\n\
                 proxy_set_header X-File $request_body_file; proxy_pass http://127.0.0.1:{p}; }}\n\
                 location /small {{ proxy_set_header X-File $request_body_file; proxy_pass http://127.0.0.1:{p}; }}"
            ),
        ),
        1,
    );
    let post = |path: &str, body: &[u8]| {
        let mut req = format!(
            "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        )
        .into_bytes();
        req.extend_from_slice(body);
        raw(s.addr(), &req)
    };
    let dir = s.dir.join("body_temp");
    let r = post("/keep", b"kept body");
    assert_eq!(r.body_str(), "same 9", "{r:?}");
    let kept = up.last().header("x-file").unwrap().to_string();
    assert!(kept.starts_with(&dir.display().to_string()), "{kept}");
    assert_eq!(std::fs::read(&kept).unwrap(), b"kept body");
    // An empty body is in an (empty) file too.
    assert_eq!(post("/keep", b"").body_str(), "same 0");
    assert_eq!(files_under(&dir).len(), 2, "{:?}", files_under(&dir));
    for f in files_under(&dir) {
        std::fs::remove_file(dir.join(f)).unwrap();
    }

    assert_eq!(post("/clean", b"cleaned").body_str(), "same 7");
    let big = pattern(5000, 7);
    assert_eq!(post("/big", &big).body_str(), "same 5000");
    let named = up.last().header("x-file").unwrap().to_string();
    assert!(!named.is_empty());
    wait_for(Duration::from_secs(5), "the body files to go", || {
        files_under(&dir).is_empty().then_some(())
    });
    // A body in memory has no file: the header is not sent at all.
    let r = post("/small", b"in memory");
    assert!(r.body_str().starts_with("unreadable \"\""), "{r:?}");
    assert_eq!(up.last().header("x-file"), None);
    assert_no_body_files(&s);
}

/// `$request_body` of a streamed body (`proxy_request_buffering off`) that fits in
/// `client_body_buffer_size`, in the answer's `add_header` and in an `error_page` the
/// upstream's status led to.
#[test]
fn request_body_of_a_streamed_body_and_in_an_error_page() {
    let up = Upstream::start(|r| {
        if r.target == "/404" {
            Reply::text(404, "not here")
        } else {
            Reply::text(200, "ok")
        }
    });
    let p = up.port;
    let s = Server::start(
        "body-var-stream",
        &conf(
            "",
            &format!(
                "proxy_request_buffering off; client_body_buffer_size 1k;\n\
                 location / {{ add_header X-Body $request_body; proxy_pass http://127.0.0.1:{p}; }}\n\
                 location /err {{ proxy_pass http://127.0.0.1:{p}/404; proxy_intercept_errors on;\n\
                 error_page 404 /show; }}\n\
                 location /show {{ return 200 \"[$request_body]\"; }}"
            ),
        ),
        1,
    );
    let post = |path: &str, body: &[u8], te: bool| {
        let mut req = if te {
            format!("POST {path} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n")
                .into_bytes()
        } else {
            format!(
                "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            )
            .into_bytes()
        };
        if te {
            req.extend_from_slice(&chunked(body, 4));
        } else {
            req.extend_from_slice(body);
        }
        raw(s.addr(), &req)
    };
    let r = post("/a", b"0123456789", false);
    assert_eq!(r.header("x-body"), Some("0123456789"), "{r:?}");
    assert_eq!(up.last().body, b"0123456789");
    let r = post("/a", b"0123456789", true);
    assert_eq!(r.header("x-body"), Some("0123456789"), "{r:?}");
    // Larger than the buffer: no value (nginx's body is not in one buffer then).
    let r = post("/a", &[b'x'; 3000], false);
    assert_eq!((r.status, r.header("x-body")), (200, None), "{r:?}");
    assert_eq!(up.last().body.len(), 3000);
    assert_eq!(post("/err", b"abc", false).body_str(), "[abc]");
}
