//! HTTP/1.1 as a client sees it: bad input and its statuses, static files, routing.

mod support;

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use support::*;

const CONF: &str = r#"
worker_processes 1;
error_log logs/error.log info;
events { worker_connections 256; }
http {
    access_log logs/access.log;
    client_max_body_size 1k;
    client_header_timeout 1s;
    large_client_header_buffers 4 2k;
    server {
        listen 127.0.0.1:{port} reuseport;
        server_name default.test;
        root {dir}/html;
        location = /status { shard_status; }
        location = /ok { return 200 "OK"; }
        location = /moved { return 301 /ok; }
        location /files/ { alias {dir}/other/; }
        location ^~ /static/ { return 200 "static"; }
        location /static/deeper/ { return 200 "deeper"; }
        location / { }
    }
    server {
        listen 127.0.0.1:{port};
        server_name *.example.com;
        location / { return 200 "wildcard"; }
    }
    server {
        listen 127.0.0.1:{port};
        server_name exact.example.com;
        location / { return 200 "exact"; }
    }
}
"#;

fn start(tag: &str) -> Server {
    let s = Server::start(tag, CONF, 1);
    write_file(&s.dir, "html/index.html", b"<h1>index</h1>");
    write_file(&s.dir, "html/a.txt", b"0123456789");
    write_file(&s.dir, "html/style.css", b"body{}");
    write_file(&s.dir, "html/dir/index.html", b"dir index");
    std::fs::create_dir_all(s.dir.join("html/noindex")).unwrap();
    write_file(&s.dir, "other/x.json", b"{}");
    write_file(&s.dir, "secret.txt", b"secret");
    s
}

#[test]
fn malformed_requests_get_nginx_statuses_and_a_close() {
    let s = start("malformed");
    let long_uri = format!("GET /{} HTTP/1.1\r\nHost: x\r\n\r\n", "a".repeat(3000));
    let big_header = format!(
        "GET / HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n",
        "b".repeat(3000)
    );
    let many_headers = format!(
        "GET / HTTP/1.1\r\nHost: x\r\n{}\r\n",
        (0..200)
            .map(|i| format!("X-H{i}: {}\r\n", "v".repeat(60)))
            .collect::<String>()
    );
    let table: Vec<(&str, Vec<u8>, u16)> = vec![
        ("garbage", b"\x16\x03\x01\x02\x00\r\n\r\n".to_vec(), 400),
        ("HTTP/0.9", b"GET /\r\n\r\n".to_vec(), 505),
        ("space in target", b"GET /a b HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(), 400),
        ("bad header", b"GET / HTTP/1.1\r\nHost x\r\n\r\n".to_vec(), 400),
        ("no host in 1.1", b"GET / HTTP/1.1\r\n\r\n".to_vec(), 400),
        ("CL and TE", b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec(), 400),
        ("two CL", b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd".to_vec(), 400),
        ("bad CL", b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n".to_vec(), 400),
        ("unknown TE", b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n".to_vec(), 501),
        ("HTTP/2.0", b"GET / HTTP/2.0\r\nHost: x\r\n\r\n".to_vec(), 505),
        ("HTTP/3.1", b"GET / HTTP/3.1\r\nHost: x\r\n\r\n".to_vec(), 505),
        ("request line too long", long_uri.into_bytes(), 414),
        ("header too large", big_header.into_bytes(), 431),
        ("too many headers", many_headers.into_bytes(), 431),
        ("dotdot escape", b"GET /../secret.txt HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(), 400),
        ("encoded dotdot", b"GET /%2e%2e/secret.txt HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(), 400),
        ("encoded slash dotdot", b"GET /dir%2f..%2f..%2fsecret.txt HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(), 400),
        ("nul byte", b"GET /a.txt%00.html HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(), 400),
        ("bad escape", b"GET /%zz HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(), 400),
        ("body too large", b"POST /ok HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\n".to_vec(), 413),
    ];
    for (name, req, want) in table {
        let mut c = connect(s.addr());
        c.write_all(&req).unwrap();
        let r = read_response(&mut c, false).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(r.status, want, "{name}");
        assert_eq!(r.header("Connection"), Some("close"), "{name}");
        // And the connection is closed after the error page.
        let mut b = [0u8; 64];
        assert!(
            matches!(c.read(&mut b), Ok(0) | Err(_)),
            "{name}: connection left open"
        );
    }
    // The worker survived all of it.
    assert_eq!(get(s.addr(), "/ok").status, 200);
    let log = std::fs::read_to_string(s.dir.join("logs/error.log")).unwrap();
    assert!(log.contains("client sent invalid"), "{log}");
}

#[test]
fn slow_request_head_gets_408_after_client_header_timeout() {
    let s = start("timeout408");
    let mut c = connect(s.addr());
    let t0 = Instant::now();
    c.write_all(b"GET / HTTP/1.1\r\nHo").unwrap();
    let r = read_response(&mut c, false).unwrap();
    assert_eq!(r.status, 408);
    assert!(
        t0.elapsed() >= Duration::from_millis(900),
        "{:?}",
        t0.elapsed()
    );
}

#[test]
fn static_files_types_validators_and_ranges() {
    let s = start("static");
    let a = s.addr();
    let r = get(a, "/a.txt");
    assert_eq!(r.status, 200);
    assert_eq!(r.body_str(), "0123456789");
    assert_eq!(r.header("Content-Type"), Some("text/plain"));
    assert_eq!(r.header("Accept-Ranges"), Some("bytes"));
    let etag = r.header("ETag").unwrap().to_string();
    let lm = r.header("Last-Modified").unwrap().to_string();
    assert!(etag.starts_with('"') && etag.ends_with("-a\""), "{etag}");
    assert_eq!(
        get(a, "/style.css").header("Content-Type"),
        Some("text/css")
    );
    assert_eq!(
        get(a, "/files/x.json").header("Content-Type"),
        Some("application/json")
    );

    let req = |extra: &str| {
        raw(
            a,
            format!("GET /a.txt HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{extra}\r\n")
                .as_bytes(),
        )
    };
    assert_eq!(req(&format!("If-None-Match: {etag}\r\n")).status, 304);
    assert_eq!(req("If-None-Match: \"other\"\r\n").status, 200);
    assert_eq!(req(&format!("If-Modified-Since: {lm}\r\n")).status, 304);
    assert_eq!(
        req("If-Modified-Since: Mon, 01 Jan 2001 00:00:00 GMT\r\n").status,
        200
    );
    let r = req("Range: bytes=2-4\r\n");
    assert_eq!(r.status, 206);
    assert_eq!(r.body_str(), "234");
    assert_eq!(r.header("Content-Range"), Some("bytes 2-4/10"));
    let r = req("Range: bytes=-3\r\n");
    assert_eq!((r.status, r.body_str().as_str()), (206, "789"));
    let r = req("Range: bytes=7-\r\n");
    assert_eq!((r.status, r.body_str().as_str()), (206, "789"));
    let r = req("Range: bytes=20-30\r\n");
    assert_eq!(r.status, 416);
    assert_eq!(r.header("Content-Range"), Some("bytes */10"));

    let r = raw(
        a,
        b"HEAD /a.txt HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert_eq!((r.status, r.header("Content-Length")), (200, Some("10")));
    assert!(r.body.is_empty());
}

#[test]
fn static_paths_directories_and_methods() {
    let s = start("paths");
    let a = s.addr();
    assert_eq!(get(a, "/").body_str(), "<h1>index</h1>");
    assert_eq!(get(a, "/dir/").body_str(), "dir index");
    let r = get(a, "/dir");
    assert_eq!(r.status, 301);
    assert!(
        r.header("Location").unwrap().ends_with("/dir/"),
        "{:?}",
        r.headers
    );
    assert_eq!(get(a, "/noindex/").status, 403);
    assert_eq!(get(a, "/missing/").status, 404, "no such directory");
    assert_eq!(get(a, "/a.txt/").status, 404, "a file is not a directory");
    assert_eq!(get(a, "/missing.txt").status, 404);
    assert_eq!(
        get(a, "/dir/../a.txt").body_str(),
        "0123456789",
        "dot segments inside the root are fine"
    );
    assert_eq!(
        get(a, "/%61.txt").body_str(),
        "0123456789",
        "percent-decoded"
    );
    let r = raw(
        a,
        b"POST /a.txt HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nConnection: close\r\n\r\nhi",
    );
    assert_eq!(r.status, 405);
    let r = raw(
        a,
        b"DELETE /a.txt HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(r.status, 405);
    let r = get(a, "/missing.txt");
    assert!(
        r.body_str().contains("<center>shard</center>"),
        "{}",
        r.body_str()
    );
}

#[test]
fn routing_by_host_and_location() {
    let s = start("routing");
    let a = s.addr();
    let host = |h: &str, path: &str| {
        raw(
            a,
            format!("GET {path} HTTP/1.1\r\nHost: {h}\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .body_str()
    };
    assert_eq!(host("exact.example.com", "/"), "exact");
    assert_eq!(host("EXACT.example.com:80", "/"), "exact");
    assert_eq!(host("other.example.com", "/"), "wildcard");
    assert_eq!(host("unknown.test", "/ok"), "OK", "default server");
    assert_eq!(host("x", "/static/a"), "static");
    assert_eq!(
        host("x", "/static/deeper/a"),
        "deeper",
        "the longest prefix wins, ^~ or not"
    );
    let r = get(a, "/moved");
    assert_eq!(r.status, 301);
    assert!(r.header("Location").unwrap().ends_with("/ok"));
}

#[test]
fn keepalive_pipelining_bodies_and_http10() {
    let s = start("pipeline");
    let mut c = connect(s.addr());
    // Three pipelined requests, the middle one with a body to discard (chunked).
    c.write_all(
        b"GET /ok HTTP/1.1\r\nHost: x\r\n\r\n\
          POST /ok HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n\
          GET /a.txt HTTP/1.1\r\nHost: x\r\n\r\n",
    )
    .unwrap();
    let rs = read_responses(&mut c, 3);
    let got: Vec<(u16, String)> = rs.iter().map(|r| (r.status, r.body_str())).collect();
    assert_eq!(
        got,
        vec![
            (200, "OK".to_string()),
            (200, "OK".to_string()),
            (200, "0123456789".to_string())
        ]
    );
    // The connection stays usable after a discarded body.
    c.write_all(b"POST /ok HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc")
        .unwrap();
    let r = read_responses(&mut c, 1);
    assert_eq!(r[0].body_str(), "OK");

    // HTTP/1.0 closes unless asked to keep alive.
    let mut c = connect(s.addr());
    c.write_all(b"GET /ok HTTP/1.0\r\n\r\n").unwrap();
    let mut all = Vec::new();
    c.read_to_end(&mut all).unwrap();
    let text = String::from_utf8_lossy(&all);
    assert!(
        text.starts_with("HTTP/1.1 200") && text.ends_with("OK"),
        "{text}"
    );
}

#[test]
fn access_log_is_combined_format() {
    let s = start("access");
    raw(s.addr(), b"GET /ok?x=1 HTTP/1.1\r\nHost: x\r\nUser-Agent: test \"agent\"\r\nConnection: close\r\n\r\n");
    let path = s.dir.join("logs/access.log");
    let line = wait_for(Duration::from_secs(5), "access log flush", || {
        let t = std::fs::read_to_string(&path).ok()?;
        t.lines()
            .find(|l| l.contains("/ok?x=1"))
            .map(str::to_string)
    });
    assert!(line.starts_with("127.0.0.1 - - ["), "{line}");
    assert!(
        line.ends_with("\"GET /ok?x=1 HTTP/1.1\" 200 2 \"-\" \"test \\x22agent\\x22\""),
        "{line}"
    );
}

#[test]
fn pipe_says_which_requests_were_pipelined() {
    let s = Server::start(
        "pipe-var",
        "worker_processes 1;\nevents {}\nhttp {\n\
         log_format pipe '$uri $pipe';\n\
         server { listen 127.0.0.1:{port}; location = /status { shard_status; }\n\
           location / { access_log logs/pipe.log pipe; return 200 ok; } }\n}\n",
        1,
    );
    let mut c = std::net::TcpStream::connect(s.addr()).unwrap();
    c.set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .unwrap();
    std::io::Write::write_all(
        &mut c,
        b"GET /a HTTP/1.1\r\nHost: x\r\n\r\nGET /b HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .unwrap();
    let mut all = Vec::new();
    let _ = std::io::Read::read_to_end(&mut c, &mut all);
    let log = wait_for(std::time::Duration::from_secs(5), "two lines", || {
        std::fs::read_to_string(s.dir.join("logs/pipe.log"))
            .ok()
            .filter(|l| l.lines().count() == 2)
    });
    assert_eq!(log, "/a .\n/b p\n");
}

#[test]
fn add_header_sets_etag_and_last_modified_in_place_of_the_files() {
    let s = Server::start(
        "add-header-etag",
        "worker_processes 1;\nevents {}\nhttp {\n\
         server { listen 127.0.0.1:{port}; root {dir}/html; location = /status { shard_status; }\n\
           location /one/ { add_header ETag foo; add_header Last-Modified \"Mon, 28 Sep 1970 06:00:00 GMT\"; }\n\
           location /none/ { add_header ETag foo always; add_header ETag '' always; }\n\
           location /gz/ { gzip on; gzip_min_length 1; gzip_types text/plain; add_header ETag foo; } }\n}\n",
        1,
    );
    write_file(&s.dir, "html/one/f.txt", b"file");
    write_file(&s.dir, "html/none/f.txt", b"file");
    write_file(&s.dir, "html/gz/f.txt", &b"compressible ".repeat(50));
    let fields = |path: &str, name: &str| -> Vec<String> {
        get(s.addr(), path)
            .headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.clone())
            .collect()
    };
    assert_eq!(fields("/one/f.txt", "etag"), vec!["foo"]);
    assert_eq!(
        fields("/one/f.txt", "last-modified"),
        vec!["Mon, 28 Sep 1970 06:00:00 GMT"]
    );
    // The last one wins; an empty one leaves none.
    assert!(fields("/none/f.txt", "etag").is_empty());
    assert_eq!(fields("/none/f.txt", "last-modified").len(), 1);
    // A file compressed on the fly, the same.
    let r = raw(
        s.addr(),
        b"GET /gz/f.txt HTTP/1.1\r\nHost: x\r\nAccept-Encoding: gzip\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(r.header("content-encoding"), Some("gzip"));
    let tags: Vec<&str> = r
        .headers
        .iter()
        .filter(|(n, _)| n.eq_ignore_ascii_case("etag"))
        .map(|(_, v)| v.as_str())
        .collect();
    assert_eq!(tags, vec!["foo"]);
}

/// Answers checked against nginx 1.22.1 (its h2.t 'charset' and a hand run): `return 200`
/// without text has the `default_type` (with `charset`), a 204 none; a redirect made
/// absolute for a request without `Host` names the address the connection came in on.
#[test]
fn empty_returns_have_a_type_and_redirects_without_host_name_the_address() {
    let conf = "worker_processes 1;\nevents {}\nhttp {\n server {\n  listen 127.0.0.1:{port};\n  \
                location = /status { shard_status; }\n  location /a { return 200; }\n  \
                location /b { return 204; }\n  location /c { charset utf-8; return 200; }\n  \
                location /e { return 302 /x; }\n }\n}\n";
    let s = Server::start("http-empty-returns", conf, 1);
    let ask = |path: &str| raw(s.addr(), format!("GET {path} HTTP/1.0\r\n\r\n").as_bytes());
    let a = ask("/a");
    assert_eq!(
        (a.status, a.header("content-type")),
        (200, Some("text/plain"))
    );
    let b = ask("/b");
    assert_eq!((b.status, b.header("content-type")), (204, None));
    let c = ask("/c");
    assert_eq!(c.header("content-type"), Some("text/plain; charset=utf-8"));
    let e = ask("/e");
    assert_eq!(e.status, 302);
    assert_eq!(
        e.header("location"),
        Some(format!("http://127.0.0.1:{}/x", s.addr().port()).as_str())
    );
}

/// nginx's `return` discards the request body first, reading what has come: a malformed
/// chunked body found there is its 400, not the returned answer (nginx's body_chunked.t).
#[test]
fn return_reads_the_body_it_discards_and_a_bad_chunk_is_400() {
    let conf = "worker_processes 1;\nevents {}\nhttp {\n server {\n  listen 127.0.0.1:{port};\n  \
                location = /status { shard_status; }\n  location /discard { return 200 \"TEST\\n\"; }\n }\n}\n";
    let s = Server::start("http-return-discard", conf, 1);
    let bad = raw(
        s.addr(),
        b"GET /discard HTTP/1.1\r\nHost: x\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nSEE-THIS\r\n0\r\n\r\n",
    );
    assert_eq!(bad.status, 400);
    let good = raw(
        s.addr(),
        b"GET /discard HTTP/1.1\r\nHost: x\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nSEE-\r\n0\r\n\r\n",
    );
    assert_eq!((good.status, good.body_str()), (200, "TEST\n".to_string()));
}
