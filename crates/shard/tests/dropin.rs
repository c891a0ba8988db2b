//! nginx configurations that run as they do under nginx (issue 12): variables in `return`,
//! `return 444`, absolute redirects, and the other directives real site configurations use.

mod support;

use std::io::{Read, Write};
use std::time::Duration;

use support::*;

const CONF: &str = r#"
worker_processes 1;
error_log logs/error.log info;
events { worker_connections 64; }
http {
    access_log logs/access.log;
    server {
        listen 127.0.0.1:{port};
        server_name default.test;
        location = /status { shard_status; }
        location = /to-https { return 301 https://$host$request_uri; }
        location = /vars {
            return 200 "$request_method $uri ?$args $arg_b [$http_x_thing] $cookie_sid $server_port $scheme $server_protocol ${host}!";
        }
        location = /id { return 200 $request_id; }
        location = /close { return 444; }
        location = /rel { return 302 /elsewhere?x=1; }
        location = /dollar { return 200 "cost: $ 5"; }
    }
}
"#;

#[test]
fn return_expands_variables() {
    let s = Server::start("retvars", CONF, 1);
    let a = s.addr();
    let r = raw(
        a,
        b"GET /to-https?a=1&b=2 HTTP/1.1\r\nHost: Example.COM:8443\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(r.status, 301);
    assert_eq!(
        r.header("Location"),
        Some("https://example.com/to-https?a=1&b=2")
    );
    let r = raw(
        a,
        b"GET /vars?a=1&B=two HTTP/1.1\r\nHost: h.test\r\nX-Thing: one\r\nX-Thing: two\r\n\
          Cookie: a=1; sid=s3cr3t; z=9\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(r.status, 200);
    assert_eq!(
        r.body_str(),
        format!(
            "GET /vars ?a=1&B=two two [one, two] s3cr3t {} http HTTP/1.1 h.test!",
            a.port()
        )
    );
    assert_eq!(get(a, "/dollar").body_str(), "cost: $ 5");
    let id1 = get(a, "/id").body_str();
    let id2 = get(a, "/id").body_str();
    assert_eq!(id1.len(), 32, "{id1}");
    assert!(id1.bytes().all(|b| b.is_ascii_hexdigit()), "{id1}");
    assert_ne!(id1, id2);
}

#[test]
fn return_444_closes_without_a_response() {
    let s = Server::start("ret444", CONF, 1);
    let mut c = connect(s.addr());
    c.write_all(b"GET /close HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut buf = Vec::new();
    let n = c.read_to_end(&mut buf);
    assert!(
        matches!(n, Ok(0)) || n.is_err(),
        "expected a close with nothing sent, got {n:?} {:?}",
        String::from_utf8_lossy(&buf)
    );
    assert!(buf.is_empty());
    let log = s.dir.join("logs/access.log");
    wait_for(Duration::from_secs(5), "the 444 in the access log", || {
        std::fs::read_to_string(&log)
            .ok()
            .filter(|l| l.contains("\"GET /close HTTP/1.1\" 444 0"))
    });
}

#[test]
fn relative_redirects_become_absolute_as_in_nginx() {
    let s = Server::start("absredir", CONF, 1);
    let a = s.addr();
    let r = raw(
        a,
        b"GET /rel HTTP/1.1\r\nHost: site.test\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(r.status, 302);
    assert_eq!(
        r.header("Location").map(str::to_string),
        Some(format!("http://site.test:{}/elsewhere?x=1", a.port()))
    );
    // No Host (HTTP/1.0): the server's name.
    let r = raw(a, b"GET /rel HTTP/1.0\r\n\r\n");
    assert_eq!(
        r.header("Location").map(str::to_string),
        Some(format!("http://default.test:{}/elsewhere?x=1", a.port()))
    );
}
