//! `scgi_pass` and `uwsgi_pass`: the params block and the body on the wire, both answer
//! shapes (CGI-style and a status line), bodies to `Content-Length` or to the close, failures
//! and their log lines. The application is a small server in the test that records what it
//! read, so every byte shard sends is checked.

mod support;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use support::*;

/// A request as the application read it: the params in order and the body.
#[derive(Debug, Clone, Default)]
struct Seen {
    params: Vec<(String, String)>,
    body: Vec<u8>,
    /// uwsgi's modifier1 and modifier2.
    modifiers: (u8, u8),
}

impl Seen {
    fn param(&self, name: &str) -> Option<&str> {
        self.params
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// A SCGI or uwsgi application on a loopback port: it records each request and answers with
/// what `answer` makes of it, then closes.
struct App {
    port: u16,
    seen: Arc<Mutex<Vec<Seen>>>,
}

fn read_more(c: &mut TcpStream, buf: &mut Vec<u8>, want: usize) {
    let mut chunk = [0u8; 16384];
    while buf.len() < want {
        match c.read(&mut chunk) {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

fn read_scgi(c: &mut TcpStream) -> Seen {
    let mut buf = Vec::new();
    while !buf.contains(&b':') {
        let before = buf.len();
        read_more(c, &mut buf, before + 1);
        if buf.len() == before {
            return Seen::default();
        }
    }
    let colon = buf.iter().position(|&b| b == b':').unwrap();
    let n: usize = std::str::from_utf8(&buf[..colon]).unwrap().parse().unwrap();
    read_more(c, &mut buf, colon + 1 + n + 1);
    let block = &buf[colon + 1..colon + 1 + n];
    assert_eq!(buf[colon + 1 + n], b',', "the netstring ends with a comma");
    let items: Vec<String> = block
        .split(|&b| b == 0)
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect();
    // NAME\0VALUE\0 ... ends with a NUL: the split leaves one empty item at the end.
    assert_eq!(items.last().map(String::as_str), Some(""));
    let params: Vec<(String, String)> = items[..items.len() - 1]
        .chunks(2)
        .map(|p| (p[0].clone(), p[1].clone()))
        .collect();
    let mut body = buf[colon + 2 + n..].to_vec();
    let len: usize = params[0].1.parse().unwrap();
    read_more(c, &mut body, len);
    Seen {
        params,
        body,
        modifiers: (0, 0),
    }
}

fn read_uwsgi(c: &mut TcpStream) -> Seen {
    let mut buf = Vec::new();
    read_more(c, &mut buf, 4);
    if buf.len() < 4 {
        return Seen::default();
    }
    let n = u16::from_le_bytes([buf[1], buf[2]]) as usize;
    read_more(c, &mut buf, 4 + n);
    let block = buf[4..4 + n].to_vec();
    let mut params = Vec::new();
    let mut i = 0;
    let take = |i: &mut usize| {
        let l = u16::from_le_bytes([block[*i], block[*i + 1]]) as usize;
        let s = String::from_utf8_lossy(&block[*i + 2..*i + 2 + l]).into_owned();
        *i += 2 + l;
        s
    };
    while i < block.len() {
        let k = take(&mut i);
        let v = take(&mut i);
        params.push((k, v));
    }
    let mut body = buf[4 + n..].to_vec();
    let len: usize = params
        .iter()
        .find(|(k, _)| k == "CONTENT_LENGTH")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    read_more(c, &mut body, len);
    Seen {
        params,
        body,
        modifiers: (buf[0], buf[3]),
    }
}

impl App {
    fn start(uwsgi: bool, answer: fn(&Seen) -> Vec<u8>) -> App {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        std::thread::spawn(move || {
            for c in l.incoming() {
                let Ok(mut c) = c else { return };
                c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                let s = if uwsgi {
                    read_uwsgi(&mut c)
                } else {
                    read_scgi(&mut c)
                };
                let out = answer(&s);
                log.lock().unwrap().push(s);
                let _ = c.write_all(&out);
            }
        });
        App { port, seen }
    }

    fn last(&self) -> Seen {
        self.seen.lock().unwrap().last().cloned().unwrap()
    }

    fn count(&self) -> usize {
        self.seen.lock().unwrap().len()
    }
}

/// The application's answers, by `REQUEST_URI`.
fn answer(s: &Seen) -> Vec<u8> {
    let uri = s.param("REQUEST_URI").unwrap_or("");
    let body = format!(
        "uri={uri} len={} body={}",
        s.body.len(),
        String::from_utf8_lossy(&s.body)
    );
    if uri.contains("line") {
        format!("HTTP/1.1 404 Not Found\r\nX-App: line\r\n\r\n{body}").into_bytes()
    } else if uri.contains("moved") {
        b"Location: http://example.com/x\r\n\r\n".to_vec()
    } else if uri.contains("length") {
        // Content-Length shorter than what follows: the body ends at the length.
        format!("Status: 201 Made\nContent-Length: 4\nX-App: cgi\n\n{body}",).into_bytes()
    } else {
        format!("Status: 200 OK\r\nContent-Type: text/plain\r\nX-App: cgi\r\n\r\n{body}")
            .into_bytes()
    }
}

fn conf(scgi: u16, uwsgi: u16, down: u16) -> String {
    format!(
        "worker_processes 1;\nerror_log {{dir}}/logs/error.log info;\nevents {{}}\nhttp {{\n \
         server {{\n  listen 127.0.0.1:{{port}};\n  add_header X-Srv yes always;\n  \
         location = /status {{ shard_status; }}\n  \
         location /s/ {{ include scgi_params; scgi_param X_EXTRA \"$request_method-$arg_a\"; \
         scgi_pass 127.0.0.1:{scgi}; }}\n  \
         location /sh/ {{ scgi_param REQUEST_URI $request_uri; scgi_pass_request_headers off; \
         scgi_pass 127.0.0.1:{scgi}; }}\n  \
         location /u/ {{ include uwsgi_params; uwsgi_modifier1 5; uwsgi_modifier2 9; \
         uwsgi_pass uwsgi://127.0.0.1:{uwsgi}; }}\n  \
         location /ubig/ {{ uwsgi_param REQUEST_URI $request_uri; uwsgi_param BIG $http_x_big; \
         uwsgi_pass 127.0.0.1:{uwsgi}; }}\n  \
         location /down/ {{ include scgi_params; scgi_pass 127.0.0.1:{down}; }}\n  \
         location /udown/ {{ include uwsgi_params; uwsgi_pass 127.0.0.1:{down}; \
         uwsgi_intercept_errors on; error_page 502 = /fallback; }}\n  \
         location = /fallback {{ return 200 \"fallback\\n\"; }}\n }}\n}}\n"
    )
}

/// Sends `text` (a request head, then after an empty line its body, if any) with
/// `Connection: close`, and reads the answer: status, header lines (names lowercase), body.
fn ask(addr: std::net::SocketAddr, text: &str) -> (u16, Vec<(String, String)>, Vec<u8>) {
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((text, ""));
    let req = format!("{head}\r\nConnection: close\r\n\r\n{body}");
    let r = raw(addr, req.as_bytes());
    let hs = r
        .headers
        .iter()
        .map(|(k, v)| (k.to_ascii_lowercase(), v.clone()))
        .collect();
    (r.status, hs, r.body)
}

fn closed_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// SCGI: the netstring starts with `CONTENT_LENGTH`, carries `scgi_params` and the client's
/// headers as `HTTP_*`, then the body; both answer shapes reach the client.
#[test]
fn scgi_sends_params_and_body_and_takes_both_answer_shapes() {
    let scgi = App::start(false, answer);
    let uwsgi = App::start(true, answer);
    let s = Server::start("gw-scgi", &conf(scgi.port, uwsgi.port, closed_port()), 1);
    let (status, hs, body) = ask(
        s.addr(),
        "POST /s/a?a=7 HTTP/1.1\r\nHost: h:81\r\nX-Foo: bar\r\nCookie: a=1\r\nCookie: b=2\r\n\
         Content-Length: 5\r\n\r\nhello",
    );
    assert_eq!(status, 200);
    assert!(
        hs.contains(&("x-app".to_string(), "cgi".to_string())),
        "{hs:?}"
    );
    assert_eq!(
        String::from_utf8_lossy(&body),
        "uri=/s/a?a=7 len=5 body=hello"
    );
    let seen = scgi.last();
    assert_eq!(seen.params[0], ("CONTENT_LENGTH".into(), "5".into()));
    assert_eq!(seen.param("SCGI"), Some("1"));
    assert_eq!(seen.param("REQUEST_METHOD"), Some("POST"));
    assert_eq!(seen.param("QUERY_STRING"), Some("a=7"));
    assert_eq!(seen.param("X_EXTRA"), Some("POST-7"));
    assert_eq!(seen.param("HTTP_X_FOO"), Some("bar"));
    assert_eq!(seen.param("HTTP_HOST"), Some("h:81"));
    assert_eq!(seen.param("HTTP_COOKIE"), Some("a=1; b=2"));
    assert_eq!(seen.body, b"hello");

    // A status line, a redirect by `Location`, and a body cut at `Content-Length`.
    let (status, hs, body) = ask(s.addr(), "GET /s/line HTTP/1.1\r\nHost: h");
    assert_eq!(status, 404);
    assert!(
        hs.contains(&("x-app".to_string(), "line".to_string())),
        "{hs:?}"
    );
    assert_eq!(String::from_utf8_lossy(&body), "uri=/s/line len=0 body=");
    assert_eq!(scgi.last().params[0].1, "0");
    let (status, hs, _) = ask(s.addr(), "GET /s/moved HTTP/1.1\r\nHost: h");
    assert_eq!(status, 302);
    assert!(hs.contains(&("location".to_string(), "http://example.com/x".to_string())));
    let (status, hs, body) = ask(s.addr(), "GET /s/length HTTP/1.1\r\nHost: h");
    assert_eq!((status, &body[..]), (201, &b"uri="[..]));
    let lengths: Vec<_> = hs.iter().filter(|(k, _)| k == "content-length").collect();
    assert_eq!(lengths, [&("content-length".to_string(), "4".to_string())]);

    // `scgi_pass_request_headers off`: the params alone.
    let before = scgi.count();
    let (status, _, _) = ask(s.addr(), "GET /sh/x HTTP/1.1\r\nHost: h\r\nX-Foo: bar");
    assert_eq!(status, 200);
    let seen = scgi.last();
    assert_eq!(
        seen.params,
        vec![
            ("CONTENT_LENGTH".to_string(), "0".to_string()),
            ("REQUEST_URI".to_string(), "/sh/x".to_string())
        ]
    );
    // Every request on a connection of its own: SCGI connections are not kept.
    assert_eq!(scgi.count(), before + 1);
}

/// uwsgi: the 4-byte header with both modifiers, length-prefixed params, the body; a
/// chunked request body is read whole first, so `CONTENT_LENGTH` is its length.
#[test]
fn uwsgi_sends_its_header_params_and_a_dechunked_body() {
    let scgi = App::start(false, answer);
    let uwsgi = App::start(true, answer);
    let s = Server::start("gw-uwsgi", &conf(scgi.port, uwsgi.port, closed_port()), 1);
    let (status, _, body) = ask(
        s.addr(),
        "POST /u/p HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n\
         3\r\nabc\r\n4\r\ndefg\r\n0\r\n\r\n",
    );
    assert_eq!(status, 200);
    assert_eq!(
        String::from_utf8_lossy(&body),
        "uri=/u/p len=7 body=abcdefg"
    );
    let seen = uwsgi.last();
    assert_eq!(seen.modifiers, (5, 9));
    assert_eq!(seen.param("CONTENT_LENGTH"), Some("7"));
    assert_eq!(seen.param("PATH_INFO"), Some("/u/p"));
    assert_eq!(seen.param("REQUEST_SCHEME"), Some("http"));

    // A status line from the application.
    let (status, _, body) = ask(s.addr(), "GET /u/line HTTP/1.1\r\nHost: h");
    assert_eq!(status, 404);
    assert_eq!(String::from_utf8_lossy(&body), "uri=/u/line len=0 body=");
}

/// Params that do not fit in uwsgi's 16-bit length fail the request with 500 and nginx's
/// log line, without reaching the application.
#[test]
fn uwsgi_params_over_64k_fail_with_500() {
    let scgi = App::start(false, answer);
    let uwsgi = App::start(true, answer);
    let conf = conf(scgi.port, uwsgi.port, closed_port())
        .replace("http {\n", "http {\n large_client_header_buffers 4 128k;\n");
    let s = Server::start("gw-ubig", &conf, 1);
    let big = "x".repeat(70_000);
    let (status, _, _) = ask(
        s.addr(),
        &format!("GET /ubig/ HTTP/1.1\r\nHost: h\r\nX-Big: {big}"),
    );
    assert_eq!(status, 500);
    assert_eq!(uwsgi.count(), 0);
    wait_for(Duration::from_secs(5), "the log line", || {
        error_log(&s)
            .contains("uwsgi request is too big")
            .then_some(())
    });
    // A small one passes.
    let (status, _, body) = ask(s.addr(), "GET /ubig/ok HTTP/1.1\r\nHost: h\r\nX-Big: 1");
    assert_eq!(status, 200);
    assert_eq!(String::from_utf8_lossy(&body), "uri=/ubig/ok len=0 body=");
    assert_eq!(uwsgi.last().param("BIG"), Some("1"));
}

/// An application that is not there: 502 with nginx's log line (`scgi://` upstream, the
/// `Host` as sent); `uwsgi_intercept_errors` and `error_page` take over.
#[test]
fn a_missing_application_is_502_with_its_scheme_in_the_log() {
    let scgi = App::start(false, answer);
    let uwsgi = App::start(true, answer);
    let down = closed_port();
    let s = Server::start("gw-down", &conf(scgi.port, uwsgi.port, down), 1);
    let (status, _, _) = ask(s.addr(), "GET /down/x HTTP/1.1\r\nHost: h:8080");
    assert_eq!(status, 502);
    let want = format!(
        "connect() failed (111: Connection refused) while connecting to upstream, client: \
         127.0.0.1, server: , request: \"GET /down/x HTTP/1.1\", upstream: \
         \"scgi://127.0.0.1:{down}\", host: \"h:8080\""
    );
    wait_for(Duration::from_secs(5), "the 502's log line", || {
        error_log(&s).contains(&want).then_some(())
    });
    let (status, _, body) = ask(s.addr(), "GET /udown/x HTTP/1.1\r\nHost: h");
    assert_eq!((status, &body[..]), (200, &b"fallback\n"[..]));
    // A request that cannot be read gets its 400 with the server's `add_header ... always`,
    // as nginx (what an application behind SCGI or uwsgi answers a wrong wire format with).
    let r = raw(s.addr(), b"\x01\x02 nonsense\r\n\r\n");
    assert_eq!((r.status, r.header("X-Srv")), (400, Some("yes")));
}

/// `-t` knows the directives, refuses what nginx refuses, and says what shard does not do.
#[test]
fn the_configuration_is_checked_as_nginx_checks_it() {
    let dir = temp_dir("gw-t");
    let check = |body: &str| {
        let path = dir.join("t.conf");
        std::fs::write(
            &path,
            format!("events {{}}\nhttp {{ server {{ listen 127.0.0.1:1; {body} }} }}\n"),
        )
        .unwrap();
        run_cli(&["-t", "-c", path.to_str().unwrap()])
    };
    let (code, out) = check(
        "location / { scgi_pass 127.0.0.1:9; scgi_read_timeout 5s; scgi_buffering off; \
         scgi_next_upstream error timeout; scgi_hide_header X-A; scgi_pass_header Server; }",
    );
    assert_eq!(code, 0, "{out}");
    let (code, out) = check("location / { uwsgi_pass unix:/run/app.sock; uwsgi_modifier1 30; }");
    assert_eq!(code, 0, "{out}");
    let (code, out) = check("location / { uwsgi_pass 127.0.0.1:9; uwsgi_modifier1 256; }");
    assert_ne!(code, 0);
    assert!(out.contains("invalid value \"256\""), "{out}");
    let (code, out) = check("location / { scgi_pass 127.0.0.1:9; proxy_pass http://x; }");
    assert_ne!(code, 0);
    assert!(
        out.contains("\"proxy_pass\" directive is duplicate"),
        "{out}"
    );
    let (code, out) = check(
        "location / { uwsgi_pass suwsgi://127.0.0.1:9; uwsgi_ssl_protocols TLSv1.3; \
         uwsgi_ssl_session_reuse off; uwsgi_ssl_server_name on; }",
    );
    assert_eq!(code, 0, "{out}");
    let (code, out) = check("location / { uwsgi_pass suwsgi://127.0.0.1:9; uwsgi_ssl_verify on; }");
    assert_ne!(code, 0);
    assert!(
        out.contains("no uwsgi_ssl_trusted_certificate for uwsgi_ssl_verify"),
        "{out}"
    );
    let (code, out) = check("location / { uwsgi_pass suwsgi://127.0.0.1:9; uwsgi_ssl_verify x; }");
    assert_ne!(code, 0);
    assert!(out.contains("in \"uwsgi_ssl_verify\" directive"), "{out}");
    let (code, out) = check("location / { scgi_pass 127.0.0.1:9; scgi_cache one; }");
    assert_ne!(code, 0);
    assert!(
        out.contains("\"scgi_cache\" zone \"one\" is unknown"),
        "{out}"
    );
}

/// A fake memcached on a loopback port: each `get KEY` is answered from `answer`, and the
/// keys asked are recorded.
fn memcached(answer: fn(&str) -> Vec<u8>) -> (u16, Arc<Mutex<Vec<String>>>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let keys = Arc::new(Mutex::new(Vec::new()));
    let log = keys.clone();
    std::thread::spawn(move || {
        for c in l.incoming() {
            let Ok(mut c) = c else { return };
            c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let mut buf = Vec::new();
            while !buf.ends_with(b"\r\n") {
                let before = buf.len();
                read_more(&mut c, &mut buf, before + 1);
                if buf.len() == before {
                    break;
                }
            }
            let line = String::from_utf8_lossy(&buf).into_owned();
            let key = line
                .strip_prefix("get ")
                .and_then(|k| k.strip_suffix("\r\n"))
                .unwrap_or("")
                .to_string();
            log.lock().unwrap().push(key.clone());
            let _ = c.write_all(&answer(&key));
        }
    });
    (port, keys)
}

/// `memcached_pass`: `get $memcached_key` (escaped), a `VALUE` served with the location's
/// type and `memcached_gzip_flag`, a miss is nginx's 404 (and its `error_page`), a bad
/// answer 502; only GET and HEAD.
#[test]
fn memcached_pass_serves_values_and_misses() {
    let (port, keys) = memcached(|k| match k {
        "/a.html" => b"VALUE /a.html 0 5\r\nhello\r\nEND\r\n".to_vec(),
        "/z.txt" => b"VALUE /z.txt 2 3\r\nzzz\r\nEND\r\n".to_vec(),
        "/bad" => b"SERVER_ERROR out of memory\r\n".to_vec(),
        _ => b"END\r\n".to_vec(),
    });
    let conf = format!(
        "worker_processes 1;\nerror_log {{dir}}/logs/error.log info;\nevents {{}}\nhttp {{\n \
         server {{\n  listen 127.0.0.1:{{port}};\n  location = /status {{ shard_status; }}\n  \
         location / {{ set $memcached_key $uri; memcached_gzip_flag 2; \
         memcached_pass 127.0.0.1:{port}; error_page 404 = /fallback; }}\n  \
         location = /fallback {{ return 200 \"fallback\\n\"; }}\n  \
         location /nokey/ {{ memcached_pass 127.0.0.1:{port}; }}\n }}\n}}\n"
    );
    let s = Server::start("gw-memcached", &conf, 1);
    let (status, hs, body) = ask(s.addr(), "GET /a.html HTTP/1.1\r\nHost: h");
    assert_eq!((status, &body[..]), (200, &b"hello"[..]));
    assert!(
        hs.contains(&("content-type".to_string(), "text/html".to_string())),
        "{hs:?}"
    );
    let (status, hs, body) = ask(s.addr(), "GET /z.txt HTTP/1.1\r\nHost: h");
    assert_eq!((status, &body[..]), (200, &b"zzz"[..]));
    assert!(
        hs.contains(&("content-encoding".to_string(), "gzip".to_string())),
        "{hs:?}"
    );
    // A miss: the 404 goes to `error_page 404`.
    let (status, _, body) = ask(s.addr(), "GET /missing%20key HTTP/1.1\r\nHost: h");
    assert_eq!((status, &body[..]), (200, &b"fallback\n"[..]));
    assert_eq!(keys.lock().unwrap().last().unwrap(), "/missing%20key");
    let (status, _, _) = ask(s.addr(), "GET /bad HTTP/1.1\r\nHost: h");
    assert_eq!(status, 502);
    let (status, _, _) = ask(
        s.addr(),
        "POST /a.html HTTP/1.1\r\nHost: h\r\nContent-Length: 1\r\n\r\nx",
    );
    assert_eq!(status, 405);
    // No `$memcached_key`: 500, nothing asked.
    let asked = keys.lock().unwrap().len();
    let (status, _, _) = ask(s.addr(), "GET /nokey/x HTTP/1.1\r\nHost: h");
    assert_eq!(status, 500);
    assert_eq!(keys.lock().unwrap().len(), asked);
    let log = error_log(&s);
    assert!(
        log.contains("key: \"/missing%20key\" was not found by memcached"),
        "{log}"
    );
    assert!(log.contains("memcached sent invalid response"), "{log}");
    assert!(
        log.contains("the \"$memcached_key\" variable is not set"),
        "{log}"
    );
    assert!(log.contains("upstream: \"memcached://127.0.0.1:"), "{log}");
}
