//! `gzip`: compressed static files and `return` bodies as a client sees them.

mod support;

use std::io::{Read, Write};

use support::*;

const CONF: &str = r#"
worker_processes 1;
error_log logs/error.log info;
events { worker_connections 64; }
http {
    access_log logs/access.log;
    gzip on;
    gzip_types text/plain application/json;
    server {
        listen 127.0.0.1:{port};
        root {dir}/html;
        location = /status { shard_status; }
        location = /ret { default_type text/plain; return 200 "hello hello hello hello hello hello"; }
        location = /ret-css { default_type text/css; return 200 "body{} body{} body{} body{} body{}"; }
        location = /ret-short { default_type text/plain; return 200 "short"; }
        location /vary/ { gzip_vary on; }
        location /min/ { gzip_min_length 100; }
        location /off/ { gzip off; }
        location /level9/ { gzip_comp_level 9; }
        location /old/ { gzip_http_version 1.0; }
        location /proxied/ { proxy_pass http://127.0.0.1:{port}/; gzip_vary on; }
        location / { }
    }
}
"#;

/// About 1 MiB of compressible text.
fn big_text() -> Vec<u8> {
    let mut v = Vec::with_capacity(1 << 20);
    let mut i = 0u64;
    while v.len() < 1 << 20 {
        v.extend_from_slice(
            format!(
                "{i:08} the quick brown fox jumps over the lazy dog {}\n",
                i % 97
            )
            .as_bytes(),
        );
        i += 1;
    }
    v
}

fn start(tag: &str) -> Server {
    let s = Server::start(tag, CONF, 1);
    let big = big_text();
    for dir in [
        "html",
        "html/vary",
        "html/min",
        "html/off",
        "html/level9",
        "html/old",
    ] {
        write_file(&s.dir, &format!("{dir}/big.txt"), &big);
    }
    write_file(&s.dir, "html/index.html", &big[..1000]);
    write_file(&s.dir, "html/style.css", &big[..1000]);
    write_file(&s.dir, "html/data.json", &big[..5000]);
    write_file(&s.dir, "html/tiny.txt", b"0123456789");
    write_file(&s.dir, "html/min/small.txt", &big[..99]);
    write_file(&s.dir, "html/min/enough.txt", &big[..100]);
    write_file(&s.dir, "html/vary/style.css", &big[..1000]);
    s
}

/// One request with `headers` (each ending in CRLF) on a new connection.
fn req(s: &Server, method: &str, path: &str, headers: &str) -> Response {
    raw(
        s.addr(),
        format!("{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{headers}\r\n")
            .as_bytes(),
    )
}

fn gz(s: &Server, path: &str) -> Response {
    req(s, "GET", path, "Accept-Encoding: gzip, deflate, br\r\n")
}

fn gunzip(b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(b)
        .read_to_end(&mut out)
        .expect("a valid gzip body");
    out
}

fn assert_compressed(r: &Response, want: &[u8]) {
    assert_eq!(r.status, 200);
    assert_eq!(
        r.header("content-encoding"),
        Some("gzip"),
        "{:?}",
        r.headers
    );
    assert_eq!(
        r.header("content-length"),
        Some(r.body.len().to_string().as_str())
    );
    assert!(
        r.body.len() < want.len(),
        "{} >= {}",
        r.body.len(),
        want.len()
    );
    assert_eq!(gunzip(&r.body), want);
}

fn assert_plain(r: &Response, want: &[u8]) {
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-encoding"), None, "{:?}", r.headers);
    assert_eq!(
        r.header("content-length"),
        Some(want.len().to_string().as_str())
    );
    assert_eq!(r.body, want);
}

#[test]
fn static_text_file_is_gzipped_and_round_trips() {
    let s = start("gzfile");
    let big = big_text();
    let r = gz(&s, "/big.txt");
    assert_compressed(&r, &big);
    assert!(r.body.len() < big.len() / 4, "{}", r.body.len());
    assert_eq!(r.header("content-type"), Some("text/plain"));
    assert!(r.header("last-modified").is_some());
    assert_eq!(r.header("accept-ranges"), None);
    assert_eq!(r.header("vary"), None);
    let etag = r.header("etag").expect("etag").to_string();
    assert!(etag.starts_with("W/\""), "{etag}");

    // A request through a proxy (`Via`) is not compressed: `gzip_proxied off`, nginx's
    // default.
    let v = req(
        &s,
        "GET",
        "/big.txt",
        "Accept-Encoding: gzip\r\nVia: 1.1 cache\r\n",
    );
    assert_plain(&v, &big);

    // The uncompressed answer carries the strong validator of the same file.
    let p = req(&s, "GET", "/big.txt", "");
    assert_plain(&p, &big);
    assert_eq!(p.header("accept-ranges"), Some("bytes"));
    assert_eq!(Some(etag.trim_start_matches("W/")), p.header("etag"));

    // The weak validator still revalidates.
    let nm = req(
        &s,
        "GET",
        "/big.txt",
        &format!("Accept-Encoding: gzip\r\nIf-None-Match: {etag}\r\n"),
    );
    assert_eq!(nm.status, 304);

    // text/html is always in gzip_types; a higher level is no larger.
    assert_compressed(&gz(&s, "/index.html"), &big[..1000]);
    assert_compressed(&gz(&s, "/data.json"), &big[..5000]);
    let l9 = gz(&s, "/level9/big.txt");
    assert_compressed(&l9, &big);
    assert!(
        l9.body.len() <= r.body.len(),
        "{} > {}",
        l9.body.len(),
        r.body.len()
    );

    // Several compressed responses on one keep-alive connection.
    let mut c = connect(s.addr());
    for _ in 0..3 {
        c.write_all(b"GET /big.txt HTTP/1.1\r\nHost: x\r\nAccept-Encoding: gzip\r\n\r\n")
            .unwrap();
        let r = read_response(&mut c, false).unwrap();
        assert_compressed(&r, &big);
        assert_eq!(r.header("connection"), Some("keep-alive"));
    }

    // The access log counts the compressed bytes.
    drop(c);
    let len = r.body.len().to_string();
    wait_for(std::time::Duration::from_secs(5), "access log", || {
        let log = std::fs::read_to_string(s.dir.join("logs/access.log")).unwrap_or_default();
        log.lines()
            .any(|l| l.contains("\"GET /big.txt HTTP/1.1\" 200 ") && l.contains(&len))
            .then_some(())
    });
}

#[test]
fn not_gzipped_without_accept_encoding_or_when_refused() {
    let s = start("gzae");
    let big = big_text();
    assert_plain(&req(&s, "GET", "/big.txt", ""), &big);
    for ae in ["identity", "deflate, br", "gzip;q=0", "x-gzip"] {
        let r = req(&s, "GET", "/big.txt", &format!("Accept-Encoding: {ae}\r\n"));
        assert_plain(&r, &big);
    }
    // HEAD gets the head of the GET (compressed length, Content-Encoding, Vary), no body.
    let g = req(&s, "GET", "/big.txt", "Accept-Encoding: gzip\r\n");
    let h = req(&s, "HEAD", "/big.txt", "Accept-Encoding: gzip\r\n");
    assert_eq!(h.status, 200);
    assert!(h.body.is_empty());
    for name in [
        "content-encoding",
        "content-length",
        "vary",
        "etag",
        "content-type",
    ] {
        assert_eq!(h.header(name), g.header(name), "{name}");
    }
    assert_eq!(h.header("content-encoding"), Some("gzip"));
    // HTTP/1.0 is not compressed unless gzip_http_version 1.0.
    let old = |path: &str| {
        raw(
            s.addr(),
            format!("GET {path} HTTP/1.0\r\nAccept-Encoding: gzip\r\n\r\n").as_bytes(),
        )
    };
    assert_plain(&old("/big.txt"), &big);
    assert_compressed(&old("/old/big.txt"), &big);
    // gzip off in a location.
    assert_plain(&gz(&s, "/off/big.txt"), &big);
}

#[test]
fn only_listed_types_and_long_enough_bodies() {
    let s = start("gztypes");
    let big = big_text();
    let css = gz(&s, "/style.css");
    assert_plain(&css, &big[..1000]);
    assert_eq!(css.header("content-type"), Some("text/css"));
    // Default gzip_min_length 20.
    assert_plain(&gz(&s, "/tiny.txt"), b"0123456789");
    // gzip_min_length 100: 99 bytes are sent as they are, 100 are compressed.
    assert_plain(&gz(&s, "/min/small.txt"), &big[..99]);
    assert_compressed(&gz(&s, "/min/enough.txt"), &big[..100]);
    // Error pages are not compressed.
    let nf = gz(&s, "/missing.txt");
    assert_eq!(nf.status, 404);
    assert_eq!(nf.header("content-encoding"), None);
}

#[test]
fn range_is_ignored_when_compressing() {
    let s = start("gzrange");
    let big = big_text();
    let r = req(
        &s,
        "GET",
        "/big.txt",
        "Accept-Encoding: gzip\r\nRange: bytes=0-9\r\n",
    );
    assert_compressed(&r, &big);
    assert_eq!(r.header("content-range"), None);
    let r = req(&s, "GET", "/big.txt", "Range: bytes=0-9\r\n");
    assert_eq!(r.status, 206);
    assert_eq!(r.body, &big[..10]);
}

#[test]
fn vary_on_eligible_responses() {
    let s = start("gzvary");
    let big = big_text();
    let r = gz(&s, "/vary/big.txt");
    assert_compressed(&r, &big);
    assert_eq!(r.header("vary"), Some("Accept-Encoding"));
    // Eligible but not compressed: Vary all the same.
    let r = req(&s, "GET", "/vary/big.txt", "");
    assert_plain(&r, &big);
    assert_eq!(r.header("vary"), Some("Accept-Encoding"));
    // Not eligible (type): no Vary.
    let r = gz(&s, "/vary/style.css");
    assert_plain(&r, &big[..1000]);
    assert_eq!(r.header("vary"), None);
    // gzip_vary is off elsewhere.
    assert_eq!(gz(&s, "/big.txt").header("vary"), None);
}

#[test]
fn return_bodies_are_gzipped_when_the_type_matches() {
    let s = start("gzreturn");
    let text = b"hello hello hello hello hello hello";
    let r = gz(&s, "/ret");
    assert_eq!(
        r.header("content-encoding"),
        Some("gzip"),
        "{:?}",
        r.headers
    );
    assert_eq!(r.header("content-type"), Some("text/plain"));
    assert_eq!(gunzip(&r.body), text);
    assert_eq!(
        r.header("content-length"),
        Some(r.body.len().to_string().as_str())
    );
    assert_plain(&req(&s, "GET", "/ret", ""), text);
    assert_plain(&gz(&s, "/ret-css"), b"body{} body{} body{} body{} body{}");
    assert_plain(&gz(&s, "/ret-short"), b"short");
}

#[test]
fn proxied_answers_are_gzipped_as_they_stream() {
    let s = start("gzip-proxied");
    let big = big_text();
    let r = gz(&s, "/proxied/big.txt");
    assert_eq!(r.status, 200);
    assert_eq!(
        r.header("content-encoding"),
        Some("gzip"),
        "{:?}",
        r.headers
    );
    // Length unknown once compressed: chunked to an HTTP/1.1 client.
    assert_eq!(r.header("transfer-encoding"), Some("chunked"));
    assert_eq!(r.header("content-length"), None);
    assert_eq!(r.header("vary"), Some("Accept-Encoding"));
    assert!(
        r.header("etag").unwrap().starts_with("W/"),
        "{:?}",
        r.headers
    );
    assert!(r.body.len() < big.len() / 4);
    assert_eq!(gunzip(&r.body), big);
    // Not to a client that does not take it, nor a type gzip_types does not list.
    let r = req(&s, "GET", "/proxied/big.txt", "");
    assert_eq!(
        (r.header("content-encoding"), r.body.len()),
        (None, big.len())
    );
    let r = gz(&s, "/proxied/style.css");
    assert_eq!(r.header("content-encoding"), None);
}
