//! The HTTP reverse proxy as a client and a test upstream see it: what is sent upstream (request
//! line, `Host`, `Connection`, `X-Forwarded-For`, hop-by-hop headers, URI replacement, bodies
//! with `Content-Length`), what comes back (statuses, headers, bodies byte for byte, chunked and
//! close-delimited framing, buffering on and off), failures (502, 504, truncation), failover,
//! `max_fails`, `backup`, non-idempotent requests, upstream keep-alive pools, client keep-alive,
//! and the refusals that keep a request from being smuggled upstream.
//!
//! Every upstream is `support::upstream::Upstream`, a thread-per-connection HTTP server in this
//! process that records what it receives; a refusing upstream is a port nothing listens on, a
//! silent one (connect timeout) a zero-backlog listener whose accept queue is full.
//! `worker_processes 1` everywhere: counts and round-robin order are per worker.

mod support;

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use support::upstream::{
    checksum, pattern, refusing_port, Blackhole, Gate, Received, Reply, Upstream,
};
use support::*;

/// A client socket's read timeout: a hang fails the test instead of stalling it.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(5);

/// The configuration: one worker, one server on `{port}` with `/status`, `http_extra` in `http`
/// (upstream blocks, settings) and `server_extra` in the server (locations, settings). The
/// proxy timeouts are short so that a failure is quick; tests that need others set them.
fn conf(http_extra: &str, server_extra: &str) -> String {
    format!(
        "worker_processes 1;\n\
         error_log logs/error.log info;\n\
         events {{ worker_connections 256; }}\n\
         http {{\n\
         access_log logs/access.log combined;\n\
         proxy_connect_timeout 1s; proxy_read_timeout 3s; proxy_send_timeout 3s;\n\
         {http_extra}\n\
         server {{\n\
         listen 127.0.0.1:{{port}};\n\
         location = /status {{ shard_status; }}\n\
         {server_extra}\n\
         }}\n\
         }}\n"
    )
}

/// `upstream NAME { server 127.0.0.1:PORT PARAMS; ... }`.
fn upstream_block(name: &str, servers: &[(u16, &str)], extra: &str) -> String {
    let mut b = format!("upstream {name} {{ ");
    for (port, params) in servers {
        b.push_str(&format!("server 127.0.0.1:{port} {params}; "));
    }
    b.push_str(extra);
    b.push_str(" }\n");
    b
}

// ---------------------------------------------------------------------------------------------
// A client that keeps its read buffer across responses (keep-alive, pipelining) and understands
// every framing the proxy may use towards it.

struct Resp {
    version: String,
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl std::fmt::Debug for Resp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let body = String::from_utf8_lossy(&self.body[..self.body.len().min(200)]);
        write!(
            f,
            "{} {} {:?} body[{}]={body:?}",
            self.version,
            self.status,
            self.headers,
            self.body.len()
        )
    }
}

impl Resp {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
    fn header_all(&self, name: &str) -> Vec<&str> {
        self.headers
            .iter()
            .filter(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
            .collect()
    }
    fn chunked(&self) -> bool {
        self.header("transfer-encoding")
            .is_some_and(|v| v.to_ascii_lowercase().contains("chunked"))
    }
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

struct Client {
    s: TcpStream,
    buf: Vec<u8>,
}

fn eof_err(what: &str) -> std::io::Error {
    std::io::Error::new(ErrorKind::UnexpectedEof, what.to_string())
}

impl Client {
    fn new(addr: SocketAddr) -> Client {
        let s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).expect("connect");
        s.set_read_timeout(Some(CLIENT_TIMEOUT)).unwrap();
        s.set_write_timeout(Some(CLIENT_TIMEOUT)).unwrap();
        Client { s, buf: Vec::new() }
    }

    fn send(&mut self, bytes: &[u8]) {
        self.s.write_all(bytes).expect("send the request");
    }

    /// `GET path HTTP/1.1` on this connection (kept alive), and its response.
    fn get(&mut self, path: &str) -> Resp {
        self.send(format!("GET {path} HTTP/1.1\r\nHost: client.test\r\n\r\n").as_bytes());
        self.read(false)
            .unwrap_or_else(|e| panic!("GET {path}: {e}"))
    }

    /// Reads more; the number of bytes, 0 at end of stream.
    fn fill(&mut self) -> std::io::Result<usize> {
        let mut tmp = [0u8; 65536];
        let n = self.s.read(&mut tmp)?;
        self.buf.extend_from_slice(&tmp[..n]);
        Ok(n)
    }

    fn take_line(&mut self) -> std::io::Result<String> {
        loop {
            if let Some(i) = find(&self.buf, b"\r\n") {
                let line = String::from_utf8_lossy(&self.buf[..i]).into_owned();
                self.buf.drain(..i + 2);
                return Ok(line);
            }
            if self.fill()? == 0 {
                return Err(eof_err("eof in a chunked body"));
            }
        }
    }

    fn take_exact(&mut self, n: usize) -> std::io::Result<Vec<u8>> {
        while self.buf.len() < n {
            if self.fill()? == 0 {
                return Err(eof_err(&format!(
                    "eof in body after {} of {n} bytes",
                    self.buf.len()
                )));
            }
        }
        Ok(self.buf.drain(..n).collect())
    }

    /// Reads a response head; the body's bytes stay in the buffer.
    fn read_head(&mut self) -> std::io::Result<Resp> {
        let end = loop {
            if let Some(i) = find(&self.buf, b"\r\n\r\n") {
                break i + 4;
            }
            if self.fill()? == 0 {
                return Err(eof_err(&format!(
                    "eof before a response head ({} bytes: {:?})",
                    self.buf.len(),
                    String::from_utf8_lossy(&self.buf)
                )));
            }
        };
        let head = String::from_utf8_lossy(&self.buf[..end]).into_owned();
        self.buf.drain(..end);
        let mut lines = head.split("\r\n");
        let status_line = lines.next().unwrap_or("");
        let mut parts = status_line.split(' ');
        let version = parts.next().unwrap_or("").to_string();
        let status = parts.next().and_then(|s| s.parse().ok()).unwrap_or(0);
        let headers = lines
            .filter(|l| !l.is_empty())
            .filter_map(|l| {
                l.split_once(':')
                    .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
            })
            .collect();
        Ok(Resp {
            version,
            status,
            headers,
            body: Vec::new(),
        })
    }

    /// Reads one response, by whatever framing it has. `head_request` for HEAD (no body).
    fn read(&mut self, head_request: bool) -> std::io::Result<Resp> {
        let mut r = self.read_head()?;
        if head_request || r.status < 200 || r.status == 204 || r.status == 304 {
            return Ok(r);
        }
        if r.chunked() {
            loop {
                let line = self.take_line()?;
                let size = usize::from_str_radix(line.split(';').next().unwrap().trim(), 16)
                    .map_err(|_| eof_err(&format!("bad chunk size line {line:?}")))?;
                if size == 0 {
                    while !self.take_line()?.is_empty() {}
                    break;
                }
                let data = self.take_exact(size)?;
                r.body.extend_from_slice(&data);
                let crlf = self.take_line()?;
                if !crlf.is_empty() {
                    return Err(eof_err("no CRLF after chunk data"));
                }
            }
        } else if let Some(len) = r.header("content-length") {
            let len: usize = len.parse().expect("numeric content-length");
            r.body = self.take_exact(len)?;
        } else {
            let (rest, end) = self.rest();
            end?;
            r.body = rest;
        }
        Ok(r)
    }

    /// Everything until the connection ends; `Ok` when it ended by FIN or reset, `Err` when it
    /// did not end within the read timeout.
    fn rest(&mut self) -> (Vec<u8>, std::io::Result<()>) {
        loop {
            match self.fill() {
                Ok(0) => return (std::mem::take(&mut self.buf), Ok(())),
                Ok(_) => {}
                Err(e) if e.kind() == ErrorKind::ConnectionReset => {
                    return (std::mem::take(&mut self.buf), Ok(()))
                }
                Err(e) => return (std::mem::take(&mut self.buf), Err(e)),
            }
        }
    }

    /// True when the connection is closed (FIN or reset) with nothing more to read.
    fn closed(&mut self) -> bool {
        let (rest, end) = self.rest();
        rest.is_empty() && end.is_ok()
    }
}

/// One request on a new connection, one response.
fn exchange(addr: SocketAddr, req: &[u8]) -> Resp {
    let mut c = Client::new(addr);
    c.send(req);
    c.read(req.starts_with(b"HEAD ")).unwrap_or_else(|e| {
        panic!(
            "{:?}: {e}",
            String::from_utf8_lossy(&req[..req.len().min(80)])
        )
    })
}

/// `GET path HTTP/1.1` with `Connection: close` on a new connection.
fn get_once(addr: SocketAddr, path: &str) -> Resp {
    exchange(
        addr,
        format!("GET {path} HTTP/1.1\r\nHost: client.test\r\nConnection: close\r\n\r\n").as_bytes(),
    )
}

/// Encodes `data` in chunks of the given sizes (the last one takes the rest).
fn chunked(data: &[u8], sizes: &[usize]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut at = 0;
    for (i, &n) in sizes.iter().enumerate() {
        let n = if i + 1 == sizes.len() {
            data.len() - at
        } else {
            n.min(data.len() - at)
        };
        if n == 0 {
            continue;
        }
        // A chunk extension on one of them: it must be ignored.
        let ext = if i == 1 { ";ext=1" } else { "" };
        out.extend_from_slice(format!("{n:x}{ext}\r\n").as_bytes());
        out.extend_from_slice(&data[at..at + n]);
        out.extend_from_slice(b"\r\n");
        at += n;
    }
    out.extend_from_slice(b"0\r\n\r\n");
    out
}

fn assert_same_bytes(got: &[u8], want: &[u8], what: &str) {
    assert!(
        got == want,
        "{what}: got {} bytes (fnv {:x}), want {} bytes (fnv {:x})",
        got.len(),
        checksum(got),
        want.len(),
        checksum(want)
    );
}

// ---------------------------------------------------------------------------------------------
// What the upstream receives, what the client gets back.

#[test]
fn get_is_proxied_with_nginx_default_headers() {
    let up = Upstream::start(|r| {
        if r.target.starts_with("/missing") {
            Reply::text(404, "nope")
        } else {
            Reply::Fixed {
                status: 200,
                headers: vec![
                    ("X-Custom".into(), "yes".into()),
                    ("Content-Type".into(), "text/x-test".into()),
                    ("Set-Cookie".into(), "a=1".into()),
                    ("Set-Cookie".into(), "b=2".into()),
                ],
                body: b"hello".to_vec(),
            }
        }
    });
    let s = Server::start(
        "proxy-get",
        &conf(
            &upstream_block("backend", &[(up.port, "")], ""),
            "proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;\n\
             proxy_set_header X-Real-IP $remote_addr;\n\
             location / { proxy_pass http://backend; }",
        ),
        1,
    );
    let mut c = Client::new(s.addr());
    c.send(
        b"GET /path/page.html?x=1&y=2 HTTP/1.1\r\n\
          Host: client.test\r\n\
          User-Agent: proxy-test\r\n\
          Accept: */*\r\n\
          X-Forwarded-For: 1.2.3.4\r\n\
          X-Custom-Req: kept\r\n\
          Keep-Alive: 300\r\n\
          TE: trailers\r\n\
          Upgrade: websocket\r\n\
          Connection: keep-alive\r\n\
          \r\n",
    );
    let r = c.read(false).expect("response");
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.text(), "hello");
    assert_eq!(r.header("x-custom"), Some("yes"));
    assert_eq!(r.header("content-type"), Some("text/x-test"));
    assert_eq!(r.header_all("set-cookie"), ["a=1", "b=2"]);
    assert_eq!(r.header_all("content-length"), ["5"], "{r:?}");
    assert!(!r.chunked(), "{r:?}");

    let u = up.last();
    assert_eq!(u.method, "GET");
    assert_eq!(u.target, "/path/page.html?x=1&y=2");
    assert_eq!(u.version, "HTTP/1.0", "proxy_http_version defaults to 1.0");
    assert_eq!(
        u.header_all("host"),
        ["backend"],
        "Host is $proxy_host: {u:?}"
    );
    assert_eq!(u.header_all("connection"), ["close"], "{u:?}");
    assert_eq!(
        u.header_all("x-forwarded-for"),
        ["1.2.3.4, 127.0.0.1"],
        "{u:?}"
    );
    assert_eq!(u.header_all("x-real-ip"), ["127.0.0.1"], "{u:?}");
    assert_eq!(u.header("user-agent"), Some("proxy-test"));
    assert_eq!(u.header("accept"), Some("*/*"));
    assert_eq!(u.header("x-custom-req"), Some("kept"));
    for hop in [
        "keep-alive",
        "te",
        "upgrade",
        "content-length",
        "transfer-encoding",
    ] {
        assert!(u.header(hop).is_none(), "{hop} was forwarded: {u:?}");
    }

    // Another status passes through too, on the same (kept-alive) client connection.
    let r = c.get("/missing");
    assert_eq!(r.status, 404, "{r:?}");
    assert_eq!(r.text(), "nope");
    // Without a client X-Forwarded-For, $proxy_add_x_forwarded_for is the client address.
    assert_eq!(up.last().header_all("x-forwarded-for"), ["127.0.0.1"]);
    assert_eq!(up.requests(), 2);
}

/// RFC 9110 7.6.1: a proxy removes the headers named in `Connection`. (nginx itself does not;
/// the project's brief asks for it.)
#[test]
fn headers_named_in_connection_are_not_forwarded() {
    let up = Upstream::text("ok");
    let s = Server::start(
        "proxy-conn-hop",
        &conf(
            "",
            &format!("location / {{ proxy_pass http://127.0.0.1:{}; }}", up.port),
        ),
        1,
    );
    let r = exchange(
        s.addr(),
        b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close, X-Hop\r\nX-Hop: secret\r\nX-End: kept\r\n\r\n",
    );
    assert_eq!(r.status, 200);
    let u = up.last();
    assert!(u.header("x-hop").is_none(), "X-Hop was forwarded: {u:?}");
    assert_eq!(u.header("x-end"), Some("kept"));
    assert_eq!(u.header_all("connection"), ["close"]);
    // An implicit upstream's $proxy_host is HOST:PORT as written.
    assert_eq!(u.header_all("host"), [format!("127.0.0.1:{}", up.port)]);
}

#[test]
fn uri_is_passed_as_sent_without_a_uri_and_replaced_with_one() {
    let up = Upstream::text("ok");
    let p = up.port;
    let s = Server::start(
        "proxy-uri",
        &conf(
            &upstream_block("backend", &[(p, "")], ""),
            &format!(
                "location / {{ proxy_pass http://backend; }}\n\
                 location /api/ {{ proxy_pass http://127.0.0.1:{p}/v1/; }}\n\
                 location /strip/ {{ proxy_pass http://backend/; }}"
            ),
        ),
        1,
    );
    let host_api = format!("127.0.0.1:{p}");
    let cases: &[(&str, &str, &str)] = &[
        // No URI in proxy_pass: the target exactly as the client sent it.
        ("/plain", "/plain", "backend"),
        ("/a/b%20c/d?q=%41&x=1", "/a/b%20c/d?q=%41&x=1", "backend"),
        ("/x%2Fy/z?", "/x%2Fy/z?", "backend"),
        ("/a/./b/../c?k=v", "/a/./b/../c?k=v", "backend"),
        // With a URI: the matched prefix is replaced, the arguments kept.
        ("/api/x?q=1", "/v1/x?q=1", &host_api),
        ("/api/", "/v1/", &host_api),
        ("/api/deep/er/path", "/v1/deep/er/path", &host_api),
        ("/api/a%20b?z=%41", "/v1/a%20b?z=%41", &host_api),
        ("/strip/a?b", "/a?b", "backend"),
    ];
    for (sent, want, host) in cases {
        let r = get_once(s.addr(), sent);
        assert_eq!(r.status, 200, "{sent}: {r:?}");
        let u = up.last();
        assert_eq!(&u.target, want, "{sent} was passed as {}", u.target);
        assert_eq!(u.header("host"), Some(*host), "{sent}");
    }
    assert_eq!(up.requests(), cases.len());
}

// ---------------------------------------------------------------------------------------------
// Bodies, both ways, byte for byte.

#[test]
fn post_5mib_with_content_length_reaches_the_upstream_byte_exact() {
    let up = Upstream::text("stored");
    let s = Server::start(
        "proxy-post-big",
        &conf(
            "client_max_body_size 20m;",
            &format!("location / {{ proxy_pass http://127.0.0.1:{}; }}", up.port),
        ),
        1,
    );
    let data = pattern(5 << 20, 5);
    let mut c = Client::new(s.addr());
    c.s.set_write_timeout(Some(Duration::from_secs(8))).unwrap();
    c.send(
        format!(
            "POST /upload HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\n\
             Content-Length: {}\r\n\r\n",
            data.len()
        )
        .as_bytes(),
    );
    c.send(&data);
    let r = c.read(false).expect("response");
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.text(), "stored");
    let u = up.last();
    assert_eq!(u.method, "POST");
    assert_eq!(u.header_all("content-length"), [data.len().to_string()]);
    assert!(!u.chunked, "the body went up chunked");
    assert_eq!(u.header("content-type"), Some("application/octet-stream"));
    assert_same_bytes(&u.body, &data, "upstream body");
}

#[test]
fn chunked_request_body_is_forwarded_dechunked_with_content_length() {
    let up = Upstream::start(|_| Reply::Echo);
    let s = Server::start(
        "proxy-post-chunked",
        &conf(
            "client_max_body_size 20m;",
            &format!("location / {{ proxy_pass http://127.0.0.1:{}; }}", up.port),
        ),
        1,
    );
    let data = pattern(300_000 + 17, 7);
    let mut c = Client::new(s.addr());
    c.send(b"POST /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n");
    c.send(&chunked(&data, &[1, 100, 65536, 3, 200_000, 0]));
    let r = c.read(false).expect("response");
    assert_eq!(r.status, 200, "{r:?}");
    assert_same_bytes(&r.body, &data, "echoed body");
    let u = up.last();
    assert!(!u.chunked, "the body went up chunked: {u:?}");
    assert!(u.header("transfer-encoding").is_none());
    assert_eq!(u.header_all("content-length"), [data.len().to_string()]);
    assert_same_bytes(&u.body, &data, "upstream body");
    // The client connection is still in step: a second request on it.
    let r = c.get("/after");
    assert_eq!(r.status, 200);
    assert_eq!(up.requests(), 2);
}

/// An 8 MiB `Content-Length` response, twice on one client connection.
fn large_response(tag: &str, buffering: &str) {
    const N: usize = 8 << 20;
    let up = Upstream::start(|_| Reply::Large(N));
    let s = Server::start(
        tag,
        &conf(
            "",
            &format!(
                "proxy_buffering {buffering};\n\
                 location / {{ proxy_pass http://127.0.0.1:{}; }}",
                up.port
            ),
        ),
        1,
    );
    let want = pattern(N, N as u64);
    let mut c = Client::new(s.addr());
    for i in 0..2 {
        let r = c.get(&format!("/big{i}"));
        assert_eq!(r.status, 200, "{:?}", r.headers);
        assert_eq!(r.header("content-length"), Some(N.to_string().as_str()));
        assert_same_bytes(&r.body, &want, "response body");
    }
    assert_eq!(up.requests(), 2);
}

#[test]
fn large_upstream_response_is_byte_exact_with_buffering_on() {
    large_response("proxy-large-on", "on");
}

#[test]
fn large_upstream_response_is_byte_exact_with_buffering_off() {
    large_response("proxy-large-off", "off");
}

#[test]
fn chunked_upstream_response_is_rechunked_for_http11_and_close_delimited_for_http10() {
    let payload: Vec<u8> = pattern(404_114, 11);
    let sizes = [1usize, 10, 4096, 100_000, 5, 300_000, 2];
    let pieces: Vec<Vec<u8>> = {
        let mut at = 0;
        sizes
            .iter()
            .map(|&n| {
                let p = payload[at..at + n].to_vec();
                at += n;
                p
            })
            .collect()
    };
    assert_eq!(pieces.iter().map(Vec::len).sum::<usize>(), payload.len());
    let up = Upstream::start(move |_| Reply::Chunked(pieces.clone()));
    let s = Server::start(
        "proxy-chunked-resp",
        &conf(
            "",
            &format!(
                "location / {{ proxy_pass http://127.0.0.1:{}; proxy_http_version 1.1; }}",
                up.port
            ),
        ),
        1,
    );
    // HTTP/1.1 client: chunked, and the connection stays usable.
    let mut c = Client::new(s.addr());
    for _ in 0..2 {
        let r = c.get("/c");
        assert_eq!(r.status, 200, "{r:?}");
        assert!(
            r.chunked(),
            "an HTTP/1.1 client should get chunked: {:?}",
            r.headers
        );
        assert!(r.header("content-length").is_none());
        assert_same_bytes(&r.body, &payload, "chunked body");
    }
    assert_eq!(up.last().version, "HTTP/1.1");
    // HTTP/1.0 client: no chunked encoding; the end of the body is the end of the connection.
    let mut c = Client::new(s.addr());
    c.send(b"GET /c HTTP/1.0\r\nHost: x\r\n\r\n");
    let r = c.read(false).expect("response");
    assert_eq!(r.status, 200, "{r:?}");
    assert!(
        !r.chunked(),
        "an HTTP/1.0 client got chunked: {:?}",
        r.headers
    );
    assert_same_bytes(&r.body, &payload, "HTTP/1.0 body");
    assert!(c.closed(), "the HTTP/1.0 connection should be closed");
}

#[test]
fn close_delimited_upstream_response_is_relayed_exactly() {
    let large = pattern((1 << 20) + 3, 13);
    let body = large.clone();
    let up = Upstream::start(move |r| {
        if r.target == "/small" {
            Reply::CloseDelimited(b"close-delimited".to_vec())
        } else {
            Reply::CloseDelimited(body.clone())
        }
    });
    let s = Server::start(
        "proxy-close-delim",
        &conf(
            "",
            &format!("location / {{ proxy_pass http://127.0.0.1:{}; }}", up.port),
        ),
        1,
    );
    for (path, payload) in [("/small", &b"close-delimited"[..]), ("/large", &large[..])] {
        // HTTP/1.1 client: chunked or close-delimited, the payload must be exact either way.
        // The upstream's close ends the body at once, not proxy_read_timeout (3 s) later.
        for _ in 0..3 {
            let start = Instant::now();
            let mut c = Client::new(s.addr());
            let r = c.get(path);
            assert_eq!(r.status, 200, "{r:?}");
            assert_same_bytes(&r.body, payload, &format!("HTTP/1.1 {path}"));
            let t = start.elapsed();
            assert!(t < Duration::from_secs(2), "HTTP/1.1 {path} took {t:?}");
        }
        // HTTP/1.0 client.
        let start = Instant::now();
        let r = exchange(s.addr(), format!("GET {path} HTTP/1.0\r\n\r\n").as_bytes());
        assert_eq!(r.status, 200);
        assert!(!r.chunked());
        assert_same_bytes(&r.body, payload, &format!("HTTP/1.0 {path}"));
        let t = start.elapsed();
        assert!(t < Duration::from_secs(2), "HTTP/1.0 {path} took {t:?}");
    }
}

/// A client that half-closes after its request: with `proxy_ignore_client_abort on` it still
/// gets the whole response. (By default its end of stream is a client that left, as nginx
/// takes it: the upstream's request ends and the log says 499; see `client_abort.rs`.)
#[test]
fn half_closed_client_still_gets_the_whole_response() {
    const N: usize = 1 << 20;
    let up = Upstream::start(|r| {
        // Slow enough that shard sees the client's end of stream before the answer.
        let reply = if r.method == "POST" {
            Reply::Echo
        } else {
            Reply::Large(N)
        };
        Reply::Delayed(Duration::from_millis(200), Box::new(reply))
    });
    let s = Server::start(
        "proxy-half-close",
        &conf(
            "",
            &format!(
                "location / {{ proxy_ignore_client_abort on; proxy_pass http://127.0.0.1:{}; }}",
                up.port
            ),
        ),
        1,
    );
    for req in [
        &b"GET /big HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"[..],
        &b"GET /big HTTP/1.0\r\n\r\n"[..],
    ] {
        let mut c = Client::new(s.addr());
        c.send(req);
        c.s.shutdown(Shutdown::Write).unwrap();
        let r = c.read(false).expect("the response after a half-close");
        assert_eq!(r.status, 200, "{r:?}");
        assert_same_bytes(&r.body, &pattern(N, N as u64), "body after half-close");
    }
    let body = pattern(70_000, 3);
    let mut c = Client::new(s.addr());
    c.send(
        format!(
            "POST /echo HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {}\r\n\r\n",
            body.len()
        )
        .as_bytes(),
    );
    c.send(&body);
    c.s.shutdown(Shutdown::Write).unwrap();
    let r = c.read(false).expect("the POST response after a half-close");
    assert_eq!(r.status, 200);
    assert_same_bytes(&r.body, &body, "echoed body after half-close");
}

// ---------------------------------------------------------------------------------------------
// Failures: 502, 504, truncation.

#[test]
fn refused_upstream_gives_502() {
    let bad = refusing_port();
    let s = Server::start(
        "proxy-refused",
        &conf(
            "",
            &format!("location / {{ proxy_pass http://127.0.0.1:{bad}; }}"),
        ),
        1,
    );
    for _ in 0..2 {
        let r = get_once(s.addr(), "/");
        assert_eq!(r.status, 502, "{r:?}");
        assert!(r.text().contains("502 Bad Gateway"), "{}", r.text());
    }
}

/// nginx keeps the client connection open after a 502 or a 504 (only 400, 413, 414, 500 and
/// 501 end keep-alive in `ngx_http_special_response_handler`).
#[test]
fn client_connection_stays_open_after_502_and_504() {
    let bad = refusing_port();
    let up = Upstream::start(|_| Reply::Stall);
    let s = Server::start(
        "proxy-ka-after-error",
        &conf(
            "",
            &format!(
                "location /refused/ {{ proxy_pass http://127.0.0.1:{bad}; }}\n\
                 location /stall/ {{ proxy_pass http://127.0.0.1:{}; proxy_read_timeout 300ms; }}\n\
                 location = /ok {{ return 200 \"ok\"; }}",
                up.port
            ),
        ),
        1,
    );
    let mut c = Client::new(s.addr());
    let r = c.get("/refused/");
    assert_eq!(r.status, 502, "{r:?}");
    let r = c.get("/ok");
    assert_eq!((r.status, r.text().as_str()), (200, "ok"), "after a 502");
    let r = c.get("/stall/");
    assert!(r.status == 504, "{r:?}");
    let r = c.get("/ok");
    assert_eq!((r.status, r.text().as_str()), (200, "ok"), "after a 504");
}

/// The error log lines of failed upstream attempts, in nginx's words.
#[test]
fn upstream_errors_are_logged_as_nginx_does() {
    let bad = refusing_port();
    let up = Upstream::start(|_| Reply::Stall);
    let s = Server::start(
        "proxy-error-log",
        &conf(
            "",
            &format!(
                "location /refused/ {{ proxy_pass http://127.0.0.1:{bad}; }}\n\
                 location /stall/ {{ proxy_pass http://127.0.0.1:{}; proxy_read_timeout 300ms; }}",
                up.port
            ),
        ),
        1,
    );
    assert_eq!(get_once(s.addr(), "/refused/x").status, 502);
    get_once(s.addr(), "/stall/y");
    let lines = [
        "connect() failed (111: Connection refused) while connecting to upstream, \
         client: 127.0.0.1, server: "
            .to_string(),
        format!("request: \"GET /refused/x HTTP/1.1\", upstream: \"http://127.0.0.1:{bad}/refused/x\""),
        "upstream timed out (110: Connection timed out) while reading response header from upstream, \
         client: 127.0.0.1, server: "
            .to_string(),
        format!(
            "request: \"GET /stall/y HTTP/1.1\", upstream: \"http://127.0.0.1:{}/stall/y\"",
            up.port
        ),
    ];
    // Both failures are logged by the time the second one is.
    wait_for(
        Duration::from_secs(5),
        "the upstream timed out line",
        || error_log(&s).contains("upstream timed out").then_some(()),
    );
    let log = error_log(&s);
    let missing: Vec<&String> = lines.iter().filter(|l| !log.contains(l.as_str())).collect();
    assert!(
        missing.is_empty(),
        "missing from the error log: {missing:#?}\nlog:\n{log}"
    );
}

#[test]
fn invalid_or_failed_upstream_responses_give_502() {
    let up = Upstream::start(|r| match r.target.as_str() {
        "/garbage" => Reply::garbage(),
        "/toobig" => Reply::Fixed {
            status: 200,
            headers: vec![("X-Big".into(), "b".repeat(10_000))],
            body: b"x".to_vec(),
        },
        "/clte" => Reply::Raw(
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n\
              5\r\nhello\r\n0\r\n\r\n"
                .to_vec(),
        ),
        "/twocl" => Reply::Raw(
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!".to_vec(),
        ),
        "/badte" => Reply::Raw(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\nhello".to_vec()),
        "/badstatus" => Reply::Raw(b"HTTP/1.1 abc OK\r\nContent-Length: 2\r\n\r\nok".to_vec()),
        "/reset" => Reply::ResetNow,
        "/close" => Reply::CloseNow,
        _ => Reply::text(200, "fine"),
    });
    let s = Server::start(
        "proxy-invalid",
        &conf(
            &upstream_block("u", &[(up.port, "max_fails=0")], ""),
            "location / { proxy_pass http://u; }",
        ),
        1,
    );
    for path in [
        "/garbage",
        "/toobig",
        "/clte",
        "/twocl",
        "/badte",
        "/badstatus",
        "/reset",
        "/close",
    ] {
        let r = get_once(s.addr(), path);
        assert_eq!(r.status, 502, "{path}: {r:?}");
        assert!(
            r.header("x-big").is_none() && !r.text().contains("hello"),
            "{path}: upstream bytes leaked: {r:?}"
        );
    }
    // The upstream itself is fine.
    assert_eq!(get_once(s.addr(), "/fine").text(), "fine");
}

fn reset_mid_response(tag: &str, buffering: &str) {
    const LEN: usize = 1 << 20;
    const SENT: usize = 64 * 1024;
    let gate = Gate::new();
    let g = gate.clone();
    let up = Upstream::start(move |_| Reply::ResetMid {
        len: LEN,
        sent: SENT,
        gate: g.clone(),
    });
    let s = Server::start(
        tag,
        &conf(
            "",
            &format!(
                "proxy_buffering {buffering};\n\
                 location / {{ proxy_pass http://127.0.0.1:{}; }}",
                up.port
            ),
        ),
        1,
    );
    let mut c = Client::new(s.addr());
    c.send(b"GET /r HTTP/1.1\r\nHost: x\r\n\r\n");
    let head = c.read_head().expect("the response head before the reset");
    assert_eq!(head.status, 200, "{head:?}");
    assert_eq!(
        head.header("content-length"),
        Some(LEN.to_string().as_str())
    );
    // The head reached the client, so shard has the upstream's head: now reset the upstream.
    gate.open();
    let start = Instant::now();
    let (body, end) = c.rest();
    end.expect("the client connection should be closed after the upstream reset");
    assert!(start.elapsed() < Duration::from_secs(4));
    assert!(body.len() < LEN, "a complete body after a reset?");
    let want = pattern(LEN, LEN as u64);
    assert_same_bytes(
        &body,
        &want[..body.len()],
        "the truncated body (no error page after it)",
    );
}

#[test]
fn upstream_reset_mid_response_truncates_and_closes_with_buffering_on() {
    reset_mid_response("proxy-reset-mid-on", "on");
}

#[test]
fn upstream_reset_mid_response_truncates_and_closes_with_buffering_off() {
    reset_mid_response("proxy-reset-mid-off", "off");
}

#[test]
fn stalled_upstream_gives_504_after_proxy_read_timeout() {
    let up = Upstream::start(|_| Reply::Stall);
    let s = Server::start(
        "proxy-stall",
        &conf(
            "",
            &format!(
                "location / {{ proxy_pass http://127.0.0.1:{}; proxy_read_timeout 500ms; }}",
                up.port
            ),
        ),
        1,
    );
    let mut c = Client::new(s.addr());
    let start = Instant::now();
    let r = c.get("/slow");
    let t = start.elapsed();
    assert_eq!(r.status, 504, "{r:?}");
    assert!(
        t >= Duration::from_millis(400) && t < Duration::from_secs(3),
        "504 after {t:?}"
    );
    assert_eq!(
        up.requests(),
        1,
        "a timed-out GET is not retried on the lone peer"
    );
    wait_for(Duration::from_secs(5), "the timed out line", || {
        error_log(&s)
            .contains("upstream timed out (110: Connection timed out) while reading response header from upstream")
            .then_some(())
    });
}

// ---------------------------------------------------------------------------------------------
// Failover, max_fails, backup, non-idempotent requests.

#[test]
fn failover_from_a_refusing_peer_to_a_good_one() {
    let good = Upstream::text("P");
    let bad = refusing_port();
    let s = Server::start(
        "proxy-failover",
        &conf(
            &upstream_block("u", &[(bad, ""), (good.port, "")], ""),
            "location / { proxy_pass http://u; }",
        ),
        1,
    );
    for i in 0..10 {
        let r = get_once(s.addr(), "/");
        assert_eq!(r.status, 200, "request {i}: {r:?}");
        assert_eq!(r.text(), "P");
    }
    assert_eq!(good.requests(), 10);
}

#[test]
fn without_next_upstream_a_failing_peer_gives_502s() {
    let good = Upstream::text("P");
    let (bad1, bad2) = (refusing_port(), refusing_port());
    let s = Server::start(
        "proxy-next-off",
        &conf(
            &(upstream_block("off", &[(bad1, "max_fails=0"), (good.port, "")], "")
                + &upstream_block("one", &[(bad2, "max_fails=0"), (good.port, "")], "")),
            "location /off/ { proxy_pass http://off; proxy_next_upstream off; }\n\
             location /one/ { proxy_pass http://one; proxy_next_upstream_tries 1; }",
        ),
        1,
    );
    for prefix in ["/off/", "/one/"] {
        let before = good.requests();
        let statuses: Vec<u16> = (0..10).map(|_| get_once(s.addr(), prefix).status).collect();
        let ok = statuses.iter().filter(|&&st| st == 200).count();
        let bad = statuses.iter().filter(|&&st| st == 502).count();
        assert_eq!(ok + bad, 10, "{prefix}: {statuses:?}");
        assert!(
            ok >= 3 && bad >= 3,
            "{prefix}: round robin over both: {statuses:?}"
        );
        assert_eq!(good.requests() - before, ok);
    }
}

#[test]
fn max_fails_takes_a_failing_peer_out_for_fail_timeout() {
    let good = Upstream::text("P");
    let skipped = Upstream::closer();
    let retried = Upstream::closer();
    let s = Server::start(
        "proxy-max-fails",
        &conf(
            &(upstream_block(
                "skip",
                &[
                    (skipped.port, "max_fails=1 fail_timeout=10s"),
                    (good.port, ""),
                ],
                "",
            ) + &upstream_block(
                "noskip",
                &[(retried.port, "max_fails=0"), (good.port, "")],
                "",
            )),
            "location /skip/ { proxy_pass http://skip; }\n\
             location /noskip/ { proxy_pass http://noskip; }",
        ),
        1,
    );
    for prefix in ["/skip/", "/noskip/"] {
        for i in 0..10 {
            let r = get_once(s.addr(), prefix);
            assert_eq!(r.status, 200, "{prefix} request {i}: {r:?}");
        }
    }
    assert_eq!(good.requests(), 20);
    // One failure takes the peer out for 10 s; without max_fails it stays in the rotation.
    assert_eq!(
        skipped.accepted(),
        1,
        "a peer marked failed was tried again"
    );
    assert!(
        retried.accepted() >= 4,
        "max_fails=0: {}",
        retried.accepted()
    );
}

#[test]
fn backup_only_when_primaries_fail_and_down_is_skipped() {
    let p = Upstream::text("P");
    let q = Upstream::text("Q");
    let b = Upstream::text("B");
    let bad = refusing_port();
    let s = Server::start(
        "proxy-backup",
        &conf(
            &(upstream_block("healthy", &[(p.port, ""), (b.port, "backup")], "")
                + &upstream_block("broken", &[(bad, ""), (b.port, "backup")], "")
                + &upstream_block(
                    "withdown",
                    &[(p.port, "down"), (q.port, ""), (b.port, "backup")],
                    "",
                )),
            "location /healthy/ { proxy_pass http://healthy; }\n\
             location /broken/ { proxy_pass http://broken; }\n\
             location /withdown/ { proxy_pass http://withdown; }",
        ),
        1,
    );
    for _ in 0..5 {
        assert_eq!(get_once(s.addr(), "/healthy/").text(), "P");
    }
    assert_eq!(b.requests(), 0, "backup used while the primary is up");
    for _ in 0..5 {
        let r = get_once(s.addr(), "/broken/");
        assert_eq!((r.status, r.text().as_str()), (200, "B"), "{r:?}");
    }
    assert_eq!(b.requests(), 5);
    for _ in 0..5 {
        assert_eq!(get_once(s.addr(), "/withdown/").text(), "Q");
    }
    assert_eq!(p.requests(), 5, "a down peer was used");
    assert_eq!(q.requests(), 5);
}

#[test]
fn post_is_not_retried_after_it_was_sent_but_get_is() {
    // `eater` reads the whole request and closes without answering.
    let eater = Upstream::start(|_| Reply::CloseNow);
    let good = Upstream::text("P");
    let s = Server::start(
        "proxy-non-idempotent",
        &conf(
            &upstream_block("u", &[(eater.port, "max_fails=0"), (good.port, "")], ""),
            "location / { proxy_pass http://u; }",
        ),
        1,
    );
    let post = b"POST /p HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 3\r\n\r\nabc";
    // Round robin sends one of two POSTs to each peer; the one the eater took is not retried.
    let mut statuses = vec![
        exchange(s.addr(), post).status,
        exchange(s.addr(), post).status,
    ];
    statuses.sort();
    assert_eq!(statuses, [200, 502], "POST statuses");
    assert_eq!(eater.requests(), 1);
    assert_eq!(good.requests(), 1, "a POST was retried on the next peer");
    // GETs that reach the eater are retried on the good peer.
    for i in 0..4 {
        let r = get_once(s.addr(), "/g");
        assert_eq!(r.status, 200, "GET {i}: {r:?}");
    }
    assert_eq!(good.requests(), 5);
    assert!(eater.requests() >= 2, "no GET reached the eater");
}

#[test]
fn next_upstream_http_502_retries_an_upstream_502() {
    let sick = Upstream::start(|_| Reply::text(502, "sick"));
    let good = Upstream::text("P");
    let s = Server::start(
        "proxy-next-502",
        &conf(
            &(upstream_block("retry", &[(sick.port, "max_fails=0"), (good.port, "")], "")
                + &upstream_block("pass", &[(sick.port, "max_fails=0"), (good.port, "")], "")),
            "location /retry/ { proxy_pass http://retry; \
             proxy_next_upstream error timeout http_502; }\n\
             location /pass/ { proxy_pass http://pass; }",
        ),
        1,
    );
    for i in 0..6 {
        let r = get_once(s.addr(), "/retry/");
        assert_eq!(
            (r.status, r.text().as_str()),
            (200, "P"),
            "request {i}: {r:?}"
        );
    }
    assert!(sick.requests() >= 2, "the sick peer was never tried");
    // Without http_502 the upstream's own 502 is passed on as it is.
    let texts: Vec<String> = (0..6)
        .map(|_| get_once(s.addr(), "/pass/").text())
        .collect();
    assert!(texts.iter().any(|t| t == "sick"), "{texts:?}");
    assert!(texts.iter().any(|t| t == "P"), "{texts:?}");
}

#[test]
fn connect_timeout_gives_504_or_goes_to_the_next_peer() {
    let hole = Blackhole::new();
    let good = Upstream::text("P");
    let s = Server::start(
        "proxy-connect-timeout",
        &conf(
            &upstream_block("u", &[(hole.port, "max_fails=0"), (good.port, "")], ""),
            &format!(
                "proxy_connect_timeout 300ms;\n\
                 location /lone/ {{ proxy_pass http://127.0.0.1:{}; }}\n\
                 location /two/ {{ proxy_pass http://u; }}",
                hole.port
            ),
        ),
        1,
    );
    let start = Instant::now();
    let r = get_once(s.addr(), "/lone/");
    let t = start.elapsed();
    assert_eq!(r.status, 504, "{r:?}");
    assert!(
        t >= Duration::from_millis(250) && t < Duration::from_secs(3),
        "504 after {t:?}"
    );
    for i in 0..4 {
        let r = get_once(s.addr(), "/two/");
        assert_eq!(
            (r.status, r.text().as_str()),
            (200, "P"),
            "request {i}: {r:?}"
        );
    }
    assert_eq!(good.requests(), 4);
}

// ---------------------------------------------------------------------------------------------
// Keep-alive to upstreams and to clients.

#[test]
fn keepalive_pool_reuses_upstream_connections() {
    let up = Upstream::text("ka");
    let s = Server::start(
        "proxy-keepalive",
        &conf(
            &upstream_block("backend", &[(up.port, "")], "keepalive 4;"),
            "location / { proxy_pass http://backend; proxy_http_version 1.1; \
             proxy_set_header Connection \"\"; }",
        ),
        1,
    );
    // 50 sequential requests over 5 client connections.
    for _ in 0..5 {
        let mut c = Client::new(s.addr());
        for _ in 0..10 {
            let r = c.get("/k");
            assert_eq!((r.status, r.text().as_str()), (200, "ka"), "{r:?}");
        }
    }
    assert_eq!(up.requests(), 50);
    assert!(
        up.accepted() <= 2,
        "{} upstream connections for 50 requests",
        up.accepted()
    );
    for u in up.received() {
        assert_eq!(u.version, "HTTP/1.1");
        assert!(u.header("connection").is_none(), "{u:?}");
    }
}

#[test]
fn without_keepalive_every_request_opens_a_connection() {
    let up = Upstream::text("nk");
    let s = Server::start(
        "proxy-no-keepalive",
        &conf(
            &upstream_block("backend", &[(up.port, "")], ""),
            "location /plain/ { proxy_pass http://backend; }\n\
             location /v11/ { proxy_pass http://backend; proxy_http_version 1.1; \
             proxy_set_header Connection \"\"; }",
        ),
        1,
    );
    let mut c = Client::new(s.addr());
    for _ in 0..25 {
        assert_eq!(c.get("/plain/").status, 200);
    }
    assert_eq!(up.accepted(), 25);
    // HTTP/1.1 upstream requests without `Connection: close`, but no pool: still one each.
    for _ in 0..25 {
        assert_eq!(c.get("/v11/").status, 200);
    }
    assert_eq!(up.requests(), 50);
    assert_eq!(up.accepted(), 50);
}

/// A pooled upstream connection that the upstream closes: the next request still succeeds.
fn pooled_connection_closed(tag: &str, decide: fn(&Received) -> Reply) -> Upstream {
    let up = Upstream::start(decide);
    let s = Server::start(
        tag,
        &conf(
            &upstream_block("backend", &[(up.port, "")], "keepalive 4;"),
            "location / { proxy_pass http://backend; proxy_http_version 1.1; \
             proxy_set_header Connection \"\"; }",
        ),
        1,
    );
    let mut c = Client::new(s.addr());
    for i in 0..20 {
        let r = c.get(&format!("/n{i}"));
        assert_eq!(
            (r.status, r.text().as_str()),
            (200, "x"),
            "request {i}: {r:?}"
        );
    }
    up
}

#[test]
fn upstream_closing_after_a_response_is_survived() {
    // Every third response on a connection is the last, without saying so.
    let up = pooled_connection_closed("proxy-ka-close-silent", |r| {
        if r.nth == 3 {
            Reply::ThenClose(Box::new(Reply::text(200, "x")))
        } else {
            Reply::text(200, "x")
        }
    });
    assert_eq!(up.requests(), 20);
    assert!(
        (7..=10).contains(&up.accepted()),
        "{} connections (3 requests each expected)",
        up.accepted()
    );
}

#[test]
fn upstream_saying_connection_close_is_not_reused() {
    let up = pooled_connection_closed("proxy-ka-close-said", |r| {
        if r.nth == 3 {
            Reply::Fixed {
                status: 200,
                headers: vec![("Connection".into(), "close".into())],
                body: b"x".to_vec(),
            }
        } else {
            Reply::text(200, "x")
        }
    });
    assert_eq!(up.requests(), 20);
    assert_eq!(up.accepted(), 7, "connections (3 requests each expected)");
}

#[test]
fn request_on_a_stale_pooled_connection_is_retried_on_a_new_one() {
    // The fourth request on each connection is read and dropped: the race of an upstream
    // closing an idle connection just as a request arrives. nginx retries a request that
    // failed on a cached connection.
    let up = pooled_connection_closed("proxy-ka-stale", |r| {
        if r.nth == 4 {
            Reply::CloseNow
        } else {
            Reply::text(200, "x")
        }
    });
    assert!(up.accepted() >= 6, "{}", up.accepted());
}

#[test]
fn client_keep_alive_through_the_proxy_after_every_framing() {
    let up = Upstream::start(|r| match r.target.as_str() {
        "/cl" => Reply::text(200, "cl"),
        "/chunked" => Reply::Chunked(vec![b"ch".to_vec(), b"unk".to_vec(), b"ed".to_vec()]),
        "/large" => Reply::Large(200_000),
        "/close" => Reply::CloseDelimited(b"close-delimited".to_vec()),
        _ => Reply::text(404, "?"),
    });
    let s = Server::start(
        "proxy-client-ka",
        &conf(
            &upstream_block("backend", &[(up.port, "")], "keepalive 2;"),
            "location / { proxy_pass http://backend; proxy_http_version 1.1; \
             proxy_set_header Connection \"\"; }",
        ),
        1,
    );
    let mut c = Client::new(s.addr());
    let steps: &[(&str, &[u8])] = &[
        ("/cl", b"cl"),
        ("/chunked", b"chunked"),
        ("/cl", b"cl"),
        ("/large", &pattern(200_000, 200_000)),
        ("/chunked", b"chunked"),
        ("/cl", b"cl"),
        // Close-delimited upstream: shard must chunk it (or close) for the client.
        ("/close", b"close-delimited"),
        ("/cl", b"cl"),
    ];
    for (i, (path, want)) in steps.iter().enumerate() {
        let r = c.get(path);
        assert_eq!(r.status, 200, "step {i} {path}: {r:?}");
        assert_same_bytes(&r.body, want, &format!("step {i} {path}"));
        assert_eq!(r.version, "HTTP/1.1");
    }
    assert_eq!(up.requests(), steps.len());
}

#[test]
fn pipelined_requests_are_answered_in_order() {
    let up = Upstream::start(|r| Reply::text(200, &r.target.clone()));
    let s = Server::start(
        "proxy-pipeline",
        &conf(
            "",
            &format!("location / {{ proxy_pass http://127.0.0.1:{}; }}", up.port),
        ),
        1,
    );
    let mut c = Client::new(s.addr());
    c.send(
        b"GET /one HTTP/1.1\r\nHost: x\r\n\r\n\
          POST /two HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc\
          GET /three HTTP/1.1\r\nHost: x\r\n\r\n",
    );
    for want in ["/one", "/two", "/three"] {
        let r = c.read(false).expect("pipelined response");
        assert_eq!((r.status, r.text().as_str()), (200, want));
    }
    let got: Vec<String> = up.received().iter().map(|u| u.target.clone()).collect();
    assert_eq!(got, ["/one", "/two", "/three"]);
    assert_eq!(up.received()[1].body, b"abc");
}

#[test]
fn bodiless_responses_keep_the_client_connection_in_step() {
    let up = Upstream::start(|r| match r.target.as_str() {
        "/204" => Reply::Fixed {
            status: 204,
            headers: vec![],
            body: vec![],
        },
        "/304" => Reply::Fixed {
            status: 304,
            headers: vec![("ETag".into(), "\"e\"".into())],
            body: vec![],
        },
        _ => Reply::Fixed {
            status: 200,
            headers: vec![],
            body: vec![b'h'; 100],
        },
    });
    let s = Server::start(
        "proxy-bodiless",
        &conf(
            &upstream_block("backend", &[(up.port, "")], "keepalive 2;"),
            "location / { proxy_pass http://backend; proxy_http_version 1.1; \
             proxy_set_header Connection \"\"; }",
        ),
        1,
    );
    let mut c = Client::new(s.addr());
    c.send(b"HEAD /h HTTP/1.1\r\nHost: x\r\n\r\n");
    let r = c.read(true).expect("HEAD response");
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-length"), Some("100"), "{r:?}");
    assert_eq!(up.last().method, "HEAD", "HEAD is passed as HEAD");
    assert_eq!(c.get("/204").status, 204);
    let r = c.get("/304");
    assert_eq!(r.status, 304);
    assert_eq!(r.header("etag"), Some("\"e\""));
    // Had any of them left body bytes behind, this would read garbage.
    let r = c.get("/h");
    assert_eq!((r.status, r.body.len()), (200, 100));
    assert_eq!(up.requests(), 4);
}

#[test]
fn expect_100_continue_is_answered_by_shard_and_not_forwarded() {
    let up = Upstream::start(|_| Reply::Echo);
    let s = Server::start(
        "proxy-expect",
        &conf(
            "",
            &format!("location / {{ proxy_pass http://127.0.0.1:{}; }}", up.port),
        ),
        1,
    );
    let mut c = Client::new(s.addr());
    c.send(b"POST /e HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n");
    let interim = c.read_head().expect("100 Continue before the body is sent");
    assert_eq!(interim.status, 100, "{interim:?}");
    c.send(b"hello");
    let r = c.read(false).expect("final response");
    assert_eq!((r.status, r.text().as_str()), (200, "hello"));
    let u = up.last();
    assert!(u.header("expect").is_none(), "Expect was forwarded: {u:?}");
    assert_eq!(u.body, b"hello");
}

#[test]
fn upstream_interim_100_response_is_not_passed_on() {
    let up = Upstream::start(|_| {
        Reply::Raw(
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\
              Connection: close\r\n\r\nok"
                .to_vec(),
        )
    });
    let s = Server::start(
        "proxy-interim",
        &conf(
            "",
            &format!(
                "location / {{ proxy_pass http://127.0.0.1:{}; proxy_http_version 1.1; }}",
                up.port
            ),
        ),
        1,
    );
    let mut c = Client::new(s.addr());
    let r = c.get("/i");
    assert_eq!((r.status, r.text().as_str()), (200, "ok"), "{r:?}");
    // And nothing else follows on the connection.
    assert_eq!(c.get("/i").status, 200);
}

// ---------------------------------------------------------------------------------------------
// Refusals: nothing reaches the upstream.

#[test]
fn smuggling_attempts_are_refused_and_nothing_is_forwarded() {
    let up = Upstream::start(|_| Reply::Echo);
    let s = Server::start(
        "proxy-smuggling",
        &conf(
            "",
            &format!("location / {{ proxy_pass http://127.0.0.1:{}; }}", up.port),
        ),
        1,
    );
    let table: &[(&str, &[u8], &[u16])] = &[
        (
            "CL and TE",
            b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            &[400],
        ),
        (
            "TE and CL",
            b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n",
            &[400],
        ),
        (
            "two differing CL",
            b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd",
            &[400],
        ),
        (
            "CL list",
            b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3, 4\r\n\r\nabcd",
            &[400],
        ),
        (
            "CL with a sign",
            b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: +3\r\n\r\nabc",
            &[400],
        ),
        (
            "TE chunked, identity",
            b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n",
            &[400, 501],
        ),
        (
            "TE xchunked",
            b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding:  xchunked\r\n\r\n0\r\n\r\n",
            &[400, 501],
        ),
        (
            "TE identity",
            b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: identity\r\n\r\n",
            &[400, 501],
        ),
        (
            "TE twice",
            b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            &[400, 501],
        ),
        (
            "TE in HTTP/1.0",
            b"POST / HTTP/1.0\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
            &[400],
        ),
        (
            "bad chunk size",
            b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n",
            &[400],
        ),
        (
            "chunk size overflow",
            b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nfffffffffffffffff1\r\nabc\r\n0\r\n\r\n",
            &[400, 413],
        ),
        (
            "no CRLF after chunk data",
            b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcGET / HTTP/1.1\r\n\r\n",
            &[400],
        ),
    ];
    for (what, req, statuses) in table {
        let mut c = Client::new(s.addr());
        c.send(req);
        let r = c
            .read(false)
            .unwrap_or_else(|e| panic!("{what}: no response: {e}"));
        assert!(statuses.contains(&r.status), "{what}: {} {r:?}", r.status);
        assert!(
            c.closed(),
            "{what}: the connection should close after the refusal"
        );
        assert_eq!(up.accepted(), 0, "{what}: something reached the upstream");
    }
    // The same location does proxy a well-formed chunked request.
    let r = exchange(
        s.addr(),
        b"POST / HTTP/1.1\r\nHost: x\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
    );
    assert_eq!((r.status, r.text().as_str()), (200, "abc"));
    assert_eq!(up.requests(), 1);
}

#[test]
fn body_above_client_max_body_size_gets_413_and_is_not_forwarded() {
    let up = Upstream::start(|_| Reply::Echo);
    let s = Server::start(
        "proxy-413",
        &conf(
            "client_max_body_size 1k;",
            &format!("location / {{ proxy_pass http://127.0.0.1:{}; }}", up.port),
        ),
        1,
    );
    let body = vec![b'a'; 2000];
    let mut by_length = format!(
        "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    by_length.extend_from_slice(&body);
    let mut by_chunks =
        b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
    by_chunks.extend_from_slice(&chunked(&body, &[1000, 1000]));
    for (what, req) in [("Content-Length", by_length), ("chunked", by_chunks)] {
        let mut c = Client::new(s.addr());
        // shard may answer before reading the whole body; a failed write is not the point.
        let _ = c.s.write_all(&req);
        let r = c.read(false).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(r.status, 413, "{what}: {r:?}");
    }
    assert_eq!(
        up.accepted(),
        0,
        "a body over the limit reached the upstream"
    );
    // At the limit it passes.
    let mut ok =
        b"POST / HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 1024\r\n\r\n".to_vec();
    ok.extend_from_slice(&[b'b'; 1024]);
    let r = exchange(s.addr(), &ok);
    assert_eq!((r.status, r.body.len()), (200, 1024));
}

#[test]
fn shard_status_counts_proxied_requests() {
    let up = Upstream::text("ok");
    let s = Server::start(
        "proxy-status",
        &conf(
            "",
            &format!(
                "location /p/ {{ proxy_pass http://127.0.0.1:{}; }}",
                up.port
            ),
        ),
        1,
    );
    let before: u64 = s.workers().iter().map(|w| w.requests).sum();
    let mut c = Client::new(s.addr());
    for _ in 0..5 {
        assert_eq!(c.get("/p/x").status, 200);
    }
    drop(c);
    let after: u64 = s.workers().iter().map(|w| w.requests).sum();
    // The five proxied requests and the status request itself.
    assert!(after >= before + 5, "requests {before} -> {after}");
    assert_eq!(up.requests(), 5);
}

/// nginx as the upstream, when it is installed (the bench's peer; `apt-get install
/// nginx-light`): a 3 MiB static file and a small `return` through a keep-alive pool arrive
/// byte for byte, and nginx's access log (`$connection`) shows the pool reusing connections.
/// Without nginx the test says so and checks nothing else.
#[test]
fn nginx_as_the_upstream_when_installed() {
    let Some(nginx) = nginx_binary() else {
        skipped(
            "nginx_as_the_upstream_when_installed",
            "nginx is not installed (apt-get install nginx-light; .ci/run does when root)",
        );
        return;
    };
    let dir = temp_dir("proxy-nginx-upstream");
    std::fs::create_dir_all(dir.join("logs")).unwrap();
    let big = pattern(3 << 20, 7);
    write_file(&dir, "html/big.bin", &big);
    let port = free_port();
    let nconf = format!(
        "daemon off;\nmaster_process on;\nworker_processes 1;\npid {d}/logs/nginx.pid;\n\
         error_log {d}/logs/nginx-error.log;\nevents {{ worker_connections 64; }}\n\
         http {{\n  log_format conn '$connection $request';\n\
         access_log {d}/logs/nginx-access.log conn;\n\
         server {{ listen 127.0.0.1:{port}; root {d}/html;\n\
         location = /hello {{ return 200 \"hello from nginx\"; }} }}\n}}\n",
        d = dir.display()
    );
    let _nginx = start_nginx(nginx, &dir, &nconf, port);

    let s = Server::start(
        "proxy-nginx-front",
        &conf(
            &upstream_block("ngx", &[(port, "")], "keepalive 2;"),
            "location / { proxy_pass http://ngx; proxy_http_version 1.1; \
             proxy_set_header Connection \"\"; }",
        ),
        1,
    );
    let mut c = Client::new(s.addr());
    for i in 0..10 {
        let r = c.get("/hello");
        assert_eq!(
            (r.status, r.text().as_str()),
            (200, "hello from nginx"),
            "request {i}"
        );
        let r = c.get("/big.bin");
        assert_eq!(r.status, 200);
        assert_eq!(r.body.len(), big.len());
        assert_eq!(checksum(&r.body), checksum(&big), "big body {i}");
    }
    let log = wait_for(Duration::from_secs(5), "nginx access log", || {
        let l = std::fs::read_to_string(dir.join("logs/nginx-access.log")).ok()?;
        (l.lines().count() >= 20).then_some(l)
    });
    let conns: std::collections::HashSet<&str> =
        log.lines().filter_map(|l| l.split(' ').next()).collect();
    assert!(
        conns.len() <= 2,
        "20 requests over {} nginx connections: {log}",
        conns.len()
    );
}

#[test]
fn passed_date_and_server_are_the_upstreams_or_none() {
    let up = Upstream::start(|r| {
        if r.target.starts_with("/none") {
            Reply::Raw(b"HTTP/1.0 200 OK\r\n\r\n".to_vec())
        } else {
            Reply::Raw(b"HTTP/1.0 200 OK\r\nDate: passed\r\nServer: passed\r\n\r\n".to_vec())
        }
    });
    let s = Server::start(
        "proxy-pass-date",
        &conf(
            "",
            &format!(
                "location / {{ proxy_pass http://127.0.0.1:{p}; proxy_pass_header Date;\n\
                 proxy_pass_header Server; }}\n\
                 location /own/ {{ proxy_pass http://127.0.0.1:{p}; }}",
                p = up.port
            ),
        ),
        1,
    );
    let a = s.addr();
    let r = get(a, "/x");
    assert_eq!(
        (r.header("date"), r.header("server")),
        (Some("passed"), Some("passed"))
    );
    // The upstream sent none: nginx then sends none either.
    let r = get(a, "/none");
    assert_eq!(
        (r.header("date"), r.header("server")),
        (None, None),
        "{r:?}"
    );
    // Not passed: shard's own.
    let r = get(a, "/own/none");
    assert!(
        r.header("date").is_some() && r.header("server").is_some(),
        "{r:?}"
    );
}

#[test]
fn an_intercepted_error_page_sees_the_tries_and_the_challenges() {
    let up = Upstream::start(|r| {
        if r.target.starts_with("/auth") {
            Reply::Fixed {
                status: 401,
                headers: vec![
                    ("WWW-Authenticate".into(), "Basic realm=\"a\"".into()),
                    ("WWW-Authenticate".into(), "Bearer".into()),
                ],
                body: b"no".to_vec(),
            }
        } else {
            Reply::text(404, "nope")
        }
    });
    let s = Server::start(
        "proxy-intercept-vars",
        &conf(
            &upstream_block("u", &[(up.port, ""), (up.port, "")], ""),
            "proxy_next_upstream http_404; proxy_intercept_errors on;\n\
             error_page 404 /404; error_page 401 /401;\n\
             location / { proxy_pass http://u; }\n\
             location = /404 { return 200 \"x${upstream_status}x\"; }\n\
             location = /401 { return 401 \"intercepted\"; }",
        ),
        1,
    );
    let a = s.addr();
    // Both peers answered 404: the error page's `$upstream_status` lists both tries.
    let r = get(a, "/x");
    assert_eq!(r.body_str(), "x404, 404x", "{r:?}");
    // The 401's challenges go with the page that replaces it.
    let r = get(a, "/auth");
    assert_eq!(r.status, 401);
    let ch: Vec<&str> = r
        .headers
        .iter()
        .filter(|(n, _)| n.eq_ignore_ascii_case("www-authenticate"))
        .map(|(_, v)| v.as_str())
        .collect();
    assert_eq!(ch, vec!["Basic realm=\"a\"", "Bearer"], "{r:?}");
}

#[test]
fn x_accel_redirect_targets_are_unescaped_judged_and_named_ones_skip_server_rewrites() {
    let up = Upstream::start(|r| {
        let target = r
            .target
            .split_once("xar=")
            .map_or("", |(_, t)| t)
            .to_string();
        Reply::Fixed {
            status: 204,
            headers: vec![("X-Accel-Redirect".into(), target)],
            body: Vec::new(),
        }
    });
    let s = Server::start(
        "proxy-xar-targets",
        &conf(
            "",
            &format!(
                "if ($upstream_http_x_accel_redirect) {{\n\
                   return 200 \"server if: $upstream_http_x_accel_redirect uri: $uri\";\n\
                 }}\n\
                 location /proxy {{ proxy_pass http://127.0.0.1:{p}; }}\n\
                 location @named {{ return 200 \"named: $upstream_http_x_accel_redirect\"; }}",
                p = up.port
            ),
        ),
        1,
    );
    let a = s.addr();
    // The redirected request still sees the answer that sent it; its path is unescaped.
    let r = get(a, "/proxy?xar=/foo%20bar");
    assert_eq!(r.body_str(), "server if: /foo%20bar uri: /foo bar", "{r:?}");
    // `..` segments, escaped or not, are refused with nginx's 404.
    for bad in ["..", "../foo", "/foo/..", "/foo/.%2e"] {
        let r = get(a, &format!("/proxy?xar={bad}"));
        assert_eq!(r.status, 404, "{bad}: {r:?}");
    }
    // A named location is entered past the server's rewrite phase.
    assert_eq!(get(a, "/proxy?xar=@named").body_str(), "named: @named");
}

#[test]
fn an_empty_hash_key_falls_back_to_round_robin() {
    let ups: Vec<Upstream> = (0..3).map(|_| Upstream::text("x")).collect();
    let peers: Vec<(u16, &str)> = ups.iter().map(|u| (u.port, "")).collect();
    let s = Server::start(
        "proxy-hash-empty",
        &conf(
            &upstream_block("u", &peers, "hash $arg_a;"),
            "location / { proxy_pass http://u; }",
        ),
        1,
    );
    for _ in 0..6 {
        assert_eq!(get(s.addr(), "/?a=").status, 200);
    }
    let counts: Vec<usize> = ups.iter().map(|u| u.requests()).collect();
    assert_eq!(counts, vec![2, 2, 2], "round robin over every peer");
    // A key still picks one peer every time.
    for _ in 0..3 {
        get(s.addr(), "/?a=k");
    }
    let after: Vec<usize> = ups.iter().map(|u| u.requests()).collect();
    assert_eq!(after.iter().filter(|&&n| n == 5).count(), 1, "{after:?}");
}

#[test]
fn bytes_to_and_from_each_peer_and_headers_on_a_failed_proxys_page() {
    let up = Upstream::start(|_| Reply::text(200, "SEE-THIS"));
    // Answers once, then closes every connection without an answer.
    let served = std::sync::atomic::AtomicUsize::new(0);
    let closer = Upstream::start(move |_| {
        if served.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0 {
            Reply::text(200, "first")
        } else {
            Reply::CloseNow
        }
    });
    let dead = support::upstream::refusing_port();
    let s = Server::start(
        "proxy-bytes-vars",
        &conf(
            &format!(
                "log_format b \"$upstream_response_length:$upstream_bytes_received:$upstream_bytes_sent\";\n\
                 upstream pair {{ server 127.0.0.1:{dead}; server 127.0.0.1:{c}; }}",
                c = closer.port
            ),
            &format!(
                "add_header X-IP $upstream_addr always;\n\
                 location / {{ proxy_pass http://127.0.0.1:{p}; access_log logs/b.log b; }}\n\
                 location /dead {{ proxy_pass http://127.0.0.1:{dead}; }}\n\
                 location /pair {{ proxy_pass http://pair; }}",
                p = up.port
            ),
        ),
        1,
    );
    let r = get(s.addr(), "/x");
    assert_eq!(r.body_str(), "SEE-THIS");
    let line = wait_for(Duration::from_secs(5), "the log line", || {
        std::fs::read_to_string(s.dir.join("logs/b.log"))
            .ok()
            .filter(|l| l.ends_with('\n'))
    });
    let f: Vec<u64> = line.trim().split(':').map(|n| n.parse().unwrap()).collect();
    // The body, the whole answer (head and body), the request as sent.
    assert_eq!(f[0], 8, "{line}");
    assert!(f[1] > f[0] + 20, "{line}");
    assert!(f[2] > 20, "{line}");
    // The 502 page of a peer that refused carries `add_header ... always`.
    let r = get(s.addr(), "/dead");
    assert_eq!(r.status, 502);
    assert_eq!(
        r.header("x-ip").map(str::to_string),
        Some(format!("127.0.0.1:{dead}"))
    );
    // The refusing peer fails and is down (max_fails=1); the other answers. When it fails
    // next time, no live peer is left: nginx's attempt named by the upstream.
    let r = get(s.addr(), "/pair");
    assert_eq!(r.status, 200);
    assert_eq!(
        r.header("x-ip").map(str::to_string),
        Some(format!("127.0.0.1:{dead}, 127.0.0.1:{}", closer.port))
    );
    let r = get(s.addr(), "/pair");
    assert_eq!(r.status, 502);
    assert_eq!(
        r.header("x-ip").map(str::to_string),
        Some(format!("127.0.0.1:{}, pair", closer.port))
    );
    assert!(error_log(&s)
        .contains("no live upstreams while connecting to upstream, upstream: \"pair\""));
}

#[test]
fn request_body_variable_for_the_upstream_request_and_the_answer() {
    let up = Upstream::start(|_| Reply::Echo);
    let s = Server::start(
        "proxy-request-body-var",
        &conf(
            "",
            &format!(
                "location / {{ proxy_pass http://127.0.0.1:{p}; add_header X-Body \"$request_body\";\n\
                 proxy_set_header X-Sent \"$request_body\"; }}\n\
                 location /set {{ proxy_pass http://127.0.0.1:{p}; proxy_set_body \"[$request_body]\"; }}",
                p = up.port
            ),
        ),
        1,
    );
    let body = |path: &str| {
        raw(
            s.addr(),
            format!(
                "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\nConnection: close\r\n\r\n0123456789"
            )
            .as_bytes(),
        )
    };
    let r = body("/");
    assert_eq!(r.header("x-body"), Some("0123456789"), "{r:?}");
    assert_eq!(up.last().header("x-sent"), Some("0123456789"));
    assert_eq!(body("/set").body_str(), "[0123456789]");
}
