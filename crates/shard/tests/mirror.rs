//! `mirror` and `mirror_request_body` (`ngx_http_mirror_module`): background subrequests
//! that copy each request (method, arguments, headers, body) to other locations, whose
//! answers nobody waits for; `log_subrequest`; `$request_body` in the access log of a proxied
//! request. The upstreams are small servers in the test that record what they read.

mod support;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use support::*;

/// What an upstream read: the request line, the header lines, the body.
#[derive(Debug, Clone)]
struct Got {
    line: String,
    headers: String,
    body: Vec<u8>,
}

/// An HTTP upstream on a loopback port that records each request and answers `200 ok`
/// (after `delay`), closing the connection.
struct Up {
    port: u16,
    got: Arc<Mutex<Vec<Got>>>,
    /// Requests read whole (before any delay).
    read: Arc<std::sync::atomic::AtomicUsize>,
}

impl Up {
    fn start(delay: Duration) -> Up {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let got = Arc::new(Mutex::new(Vec::new()));
        let log = got.clone();
        let read = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let reads = read.clone();
        std::thread::spawn(move || {
            for c in l.incoming() {
                let Ok(mut c) = c else { return };
                let log = log.clone();
                let reads = reads.clone();
                std::thread::spawn(move || {
                    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 4096];
                    let end = loop {
                        if let Some(i) = find(&buf, b"\r\n\r\n") {
                            break i + 4;
                        }
                        match c.read(&mut chunk) {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    };
                    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
                    let len: usize = head
                        .lines()
                        .filter_map(|l| l.split_once(':'))
                        .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
                        .and_then(|(_, v)| v.trim().parse().ok())
                        .unwrap_or(0);
                    while buf.len() < end + len {
                        match c.read(&mut chunk) {
                            Ok(0) | Err(_) => break,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    let (line, headers) = head.split_once("\r\n").unwrap_or((&head, ""));
                    reads.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    std::thread::sleep(delay);
                    log.lock().unwrap().push(Got {
                        line: line.to_string(),
                        headers: headers.to_string(),
                        body: buf[end..].to_vec(),
                    });
                    let _ = c.write_all(
                        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok",
                    );
                });
            }
        });
        Up { port, got, read }
    }

    fn wait(&self, n: usize) -> Vec<Got> {
        wait_for(Duration::from_secs(10), "the upstream's requests", || {
            let g = self.got.lock().unwrap();
            (g.len() >= n).then(|| g.clone())
        })
    }

    fn count(&self) -> usize {
        self.got.lock().unwrap().len()
    }
}

fn conf(main: u16, mirror: u16, slow: u16) -> String {
    format!(
        "worker_processes 1;\nerror_log {{dir}}/logs/error.log info;\nevents {{}}\nhttp {{\n \
         log_format body '$uri $request_body';\n \
         server {{\n  listen 127.0.0.1:{{port}};\n  location = /status {{ shard_status; }}\n  \
         location / {{\n   mirror /m;\n   mirror /m2;\n   proxy_pass http://127.0.0.1:{main};\n   \
         access_log {{dir}}/logs/main.log body;\n   \
         location /quiet/ {{ mirror off; proxy_pass http://127.0.0.1:{main}; }}\n  }}\n  \
         location /nobody/ {{ mirror /m; mirror_request_body off; \
         proxy_pass http://127.0.0.1:{main}; }}\n  \
         location /slow/ {{ mirror /s; proxy_pass http://127.0.0.1:{main}; }}\n  \
         location /m {{ internal; proxy_pass http://127.0.0.1:{mirror}; \
         log_subrequest on; access_log {{dir}}/logs/mirror.log body; }}\n  \
         location /s {{ internal; proxy_pass http://127.0.0.1:{slow}; }}\n }}\n}}\n"
    )
}

fn post(s: &Server, target: &str, body: &str) -> Response {
    let req = format!(
        "POST {target} HTTP/1.1\r\nHost: h\r\nX-Tag: t1\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    );
    raw(s.addr(), req.as_bytes())
}

/// Each mirror gets the request's method, arguments, headers and body; the client gets the
/// main location's answer; `mirror off` stops the inherited list.
#[test]
fn mirrors_copy_method_args_headers_and_body() {
    let main = Up::start(Duration::ZERO);
    let mirror = Up::start(Duration::ZERO);
    let slow = Up::start(Duration::ZERO);
    let s = Server::start("mirror-copy", &conf(main.port, mirror.port, slow.port), 1);
    let r = post(&s, "/a?x=1", "hello");
    assert_eq!((r.status, r.body_str().as_str()), (200, "ok"));
    let got = main.wait(1);
    assert_eq!(got[0].line, "POST /a?x=1 HTTP/1.0");
    assert_eq!(got[0].body, b"hello");
    let mut got = mirror.wait(2);
    got.sort_by(|a, b| a.line.cmp(&b.line));
    assert_eq!(got[0].line, "POST /m2?x=1 HTTP/1.0");
    assert_eq!(got[1].line, "POST /m?x=1 HTTP/1.0");
    for g in &got {
        assert_eq!(g.body, b"hello", "{g:?}");
        assert!(g.headers.contains("X-Tag: t1"), "{g:?}");
    }
    // A chunked body is mirrored decoded.
    let req =
        b"POST /c HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n\
                3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n";
    let r = raw(s.addr(), req);
    assert_eq!(r.status, 200);
    let got = mirror.wait(4);
    assert!(got[2..].iter().all(|g| g.body == b"abcde"), "{got:?}");
    // `mirror off` in the nested location: nothing more reaches the mirror.
    let before = mirror.count();
    let r = post(&s, "/quiet/q", "x");
    assert_eq!(r.status, 200);
    main.wait(3);
    // The mirror upstream would have its request by the time the main one's answer is read
    // back and logged: wait for the main request's log line, then count.
    wait_for(Duration::from_secs(5), "the main log line", || {
        std::fs::read_to_string(s.dir.join("logs/main.log"))
            .ok()
            .filter(|l| l.contains("/quiet/q"))
    });
    assert_eq!(mirror.count(), before);
}

/// `mirror_request_body off`: the mirror gets the head alone. `log_subrequest on` logs the
/// mirror's own line; `$request_body` is in the proxied request's log line.
#[test]
fn mirror_request_body_off_and_the_logs() {
    let main = Up::start(Duration::ZERO);
    let mirror = Up::start(Duration::ZERO);
    let slow = Up::start(Duration::ZERO);
    let s = Server::start("mirror-logs", &conf(main.port, mirror.port, slow.port), 1);
    let r = post(&s, "/nobody/n", "payload");
    assert_eq!(r.status, 200);
    let got = mirror.wait(1);
    assert_eq!(got[0].line, "POST /m HTTP/1.0");
    assert!(got[0].body.is_empty(), "{got:?}");
    assert_eq!(main.wait(1)[0].body, b"payload");
    let r = post(&s, "/logged", "abc");
    assert_eq!(r.status, 200);
    let log = wait_for(Duration::from_secs(5), "the mirror's log lines", || {
        std::fs::read_to_string(s.dir.join("logs/mirror.log"))
            .ok()
            .filter(|l| l.lines().count() >= 3)
    });
    assert!(log.contains("/m -\n"), "{log}");
    assert!(log.contains("/m abc\n"), "{log}");
    assert!(log.contains("/m2 abc\n"), "{log}");
    let main_log = wait_for(Duration::from_secs(5), "the main log line", || {
        std::fs::read_to_string(s.dir.join("logs/main.log"))
            .ok()
            .filter(|l| l.contains("/logged"))
    });
    assert!(main_log.contains("/logged abc\n"), "{main_log}");
}

/// A mirror whose upstream is slow does not hold the client's answer back.
#[test]
fn a_slow_mirror_does_not_delay_the_answer() {
    let main = Up::start(Duration::ZERO);
    let mirror = Up::start(Duration::ZERO);
    let slow = Up::start(Duration::from_secs(3));
    let s = Server::start("mirror-slow", &conf(main.port, mirror.port, slow.port), 1);
    let t = Instant::now();
    let r = post(&s, "/slow/x", "b");
    assert_eq!((r.status, r.body_str().as_str()), (200, "ok"));
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "the answer waited for the mirror: {:?}",
        t.elapsed()
    );
    // The mirror still gets there.
    assert_eq!(slow.wait(1)[0].line, "POST /s HTTP/1.0");
}

/// A stopping worker does not wait for mirrors nobody reads (nginx does not): one whose
/// upstream has not answered is ended once nothing else is left, and the worker exits.
#[test]
fn a_graceful_stop_does_not_wait_for_a_mirror() {
    let main = Up::start(Duration::ZERO);
    let mirror = Up::start(Duration::ZERO);
    let slow = Up::start(Duration::from_secs(30));
    let mut s = Server::start("mirror-stop", &conf(main.port, mirror.port, slow.port), 1);
    let r = post(&s, "/slow/x", "b");
    assert_eq!(r.status, 200);
    // The mirror's request is at its upstream, which holds it for 30 s.
    wait_for(Duration::from_secs(5), "the mirror at its upstream", || {
        (slow.read.load(std::sync::atomic::Ordering::SeqCst) == 1).then_some(())
    });
    let t = Instant::now();
    s.signal(libc::SIGQUIT);
    assert_eq!(s.wait_exit(Duration::from_secs(20)), 0);
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "the stop waited for the mirror: {:?}",
        t.elapsed()
    );
    assert!(
        error_log(&s).contains("background subrequests to exit"),
        "{}",
        error_log(&s)
    );
}
