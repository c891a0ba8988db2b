//! A client that closes before the upstream answers (`proxy_ignore_client_abort`): nginx
//! closes the upstream's connection too and logs 499; with `on` the upstream's request runs
//! to its end.

mod support;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use support::*;

/// An upstream that reads a request, waits until the test says go, then notes whether
/// shard still holds the connection (a read that does not see the end) and answers.
struct Up {
    port: u16,
    accepted: Arc<AtomicUsize>,
    go: Arc<Mutex<bool>>,
    /// Per request: shard had closed the connection before the answer.
    closed_early: Arc<Mutex<Vec<bool>>>,
}

impl Up {
    fn start() -> Up {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let up = Up {
            port,
            accepted: Arc::new(AtomicUsize::new(0)),
            go: Arc::new(Mutex::new(false)),
            closed_early: Arc::new(Mutex::new(Vec::new())),
        };
        let (accepted, go, closed) = (up.accepted.clone(), up.go.clone(), up.closed_early.clone());
        std::thread::spawn(move || {
            for c in l.incoming() {
                let Ok(mut c) = c else { return };
                let mut buf = [0u8; 4096];
                let _ = c.read(&mut buf);
                accepted.fetch_add(1, Ordering::SeqCst);
                wait_for(Duration::from_secs(10), "the test's go", || {
                    (*go.lock().unwrap()).then_some(())
                });
                c.set_read_timeout(Some(Duration::from_millis(300)))
                    .unwrap();
                let early = matches!(c.read(&mut buf), Ok(0));
                closed.lock().unwrap().push(early);
                let _ = c.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok");
            }
        });
        up
    }
}

fn conf(port: u16) -> String {
    format!(
        "worker_processes 1;\nerror_log {{dir}}/logs/error.log info;\nevents {{}}\nhttp {{\n \
         log_format st '$uri $status';\n \
         server {{\n  listen 127.0.0.1:{{port}};\n  access_log {{dir}}/logs/st.log st;\n  \
         location = /status {{ shard_status; }}\n  \
         location /off/ {{ proxy_pass http://127.0.0.1:{port}; }}\n  \
         location /on/ {{ proxy_ignore_client_abort on; proxy_pass http://127.0.0.1:{port}; }}\n \
         }}\n}}\n"
    )
}

/// Sends a request and closes once the upstream has it.
fn abandon(s: &Server, up: &Up, path: &str) {
    let before = up.accepted.load(Ordering::SeqCst);
    let mut c = TcpStream::connect(s.addr()).unwrap();
    write!(c, "GET {path} HTTP/1.1\r\nHost: h\r\n\r\n").unwrap();
    wait_for(Duration::from_secs(5), "the upstream's request", || {
        (up.accepted.load(Ordering::SeqCst) > before).then_some(())
    });
    drop(c);
}

fn log_line(s: &Server, path: &str) -> String {
    wait_for(Duration::from_secs(10), "the access log line", || {
        std::fs::read_to_string(s.dir.join("logs/st.log"))
            .ok()?
            .lines()
            .find(|l| l.starts_with(path))
            .map(str::to_string)
    })
}

#[test]
fn a_client_that_leaves_ends_the_upstream_request_unless_ignored() {
    let up = Up::start();
    let s = Server::start("client-abort", &conf(up.port), 1);
    // Off (the default): 499, and the upstream's connection is closed before its answer.
    abandon(&s, &up, "/off/a");
    assert_eq!(log_line(&s, "/off/a"), "/off/a 499");
    let log = error_log(&s);
    assert!(
        log.contains(
            "epoll_wait() reported that client prematurely closed connection, so upstream \
             connection is closed too while reading response header from upstream"
        ),
        "{log}"
    );
    // With the upstream it was talking to, as nginx's line.
    assert!(
        log.contains(&format!("upstream: \"http://127.0.0.1:{}/off/a\"", up.port)),
        "{log}"
    );
    *up.go.lock().unwrap() = true;
    wait_for(Duration::from_secs(5), "the upstream's check", || {
        (up.closed_early.lock().unwrap().len() == 1).then_some(())
    });
    assert_eq!(*up.closed_early.lock().unwrap(), [true]);

    // On: the upstream's request runs to its answer, logged as its status.
    *up.go.lock().unwrap() = false;
    abandon(&s, &up, "/on/b");
    // The client is gone before the answer: give shard the moment a close would take.
    std::thread::sleep(Duration::from_millis(200));
    *up.go.lock().unwrap() = true;
    assert_eq!(log_line(&s, "/on/b"), "/on/b 200");
    assert_eq!(*up.closed_early.lock().unwrap(), [true, false]);
}
