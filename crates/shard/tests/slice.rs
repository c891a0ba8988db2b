//! `slice` (nginx's `ngx_http_slice_filter_module`): a proxied file asked for in ranges of
//! the slice size (`$slice_range`), joined into the answer, the client's own range applied,
//! each slice its own cache entry. The upstream is shard serving a static file, whose access
//! log shows which slices were asked for.

mod support;

use std::time::Duration;

use support::*;

const FILE: &[u8] = b"0123456789abcdefghij";

fn start(tag: &str) -> Server {
    let conf = "worker_processes 1;\nevents {}\nhttp {\n    access_log off;\n    \
                log_format r '$uri $http_range';\n    \
                proxy_cache_path {dir}/cache keys_zone=s:1m;\n    \
                server {\n        listen 127.0.0.1:{port};\n        \
                location = /status { shard_status; }\n        \
                location /p/ { slice 4; proxy_pass http://127.0.0.1:{port1}/;\n            \
                proxy_set_header Range $slice_range; }\n        \
                location /s/ { slice 4; proxy_pass http://127.0.0.1:{port1}/;\n            \
                proxy_set_header Range $slice_range; proxy_cache s;\n            \
                proxy_cache_key $uri$is_args$args$slice_range;\n            \
                proxy_cache_valid 200 206 1h; add_header X-Cache $upstream_cache_status; }\n        \
                location = /n { slice 4; proxy_pass http://127.0.0.1:{port1}/whole;\n            \
                proxy_set_header Range $slice_range; }\n    }\n    \
                server {\n        listen 127.0.0.1:{port1};\n        root {dir}/html;\n        \
                access_log {dir}/logs/up.log r;\n        \
                location = /whole { return 200 \"not sliced\"; }\n    }\n}\n";
    let s = Server::start_ports(tag, conf, 1, 1);
    write_file(&s.dir, "html/f.txt", FILE);
    s
}

/// The upstream's log once it has `n` lines.
fn upstream_log(s: &Server, n: usize) -> Vec<String> {
    wait_for(Duration::from_secs(5), "the upstream's log lines", || {
        let t = std::fs::read_to_string(s.dir.join("logs/up.log")).ok()?;
        let lines: Vec<String> = t.lines().map(str::to_string).collect();
        (lines.len() >= n).then_some(lines)
    })
}

fn ranged(s: &Server, path: &str, range: &str) -> Response {
    let req =
        format!("GET {path} HTTP/1.1\r\nHost: a\r\nRange: {range}\r\nConnection: close\r\n\r\n");
    raw(s.addr(), req.as_bytes())
}

#[test]
fn a_file_is_fetched_in_slices_and_joined() {
    let s = start("slice-join");
    let r = get(s.addr(), "/p/f.txt");
    assert_eq!(r.status, 200);
    assert_eq!(r.body, FILE);
    assert_eq!(r.header("content-length"), Some("20"));
    assert_eq!(r.header("content-range"), None);
    assert_eq!(
        upstream_log(&s, 5),
        [
            "/f.txt bytes=0-3",
            "/f.txt bytes=4-7",
            "/f.txt bytes=8-11",
            "/f.txt bytes=12-15",
            "/f.txt bytes=16-19",
        ]
    );
    // The client's range: only the slices it spans are asked for.
    let r = ranged(&s, "/p/f.txt", "bytes=5-9");
    assert_eq!(r.status, 206);
    assert_eq!(r.body_str(), "56789");
    assert_eq!(r.header("content-range"), Some("bytes 5-9/20"));
    assert_eq!(
        upstream_log(&s, 7)[5..],
        ["/f.txt bytes=4-7", "/f.txt bytes=8-11"]
    );
    // An upstream that ignores ranges: its answer as it is.
    let r = get(s.addr(), "/n");
    assert_eq!((r.status, r.body_str().as_str()), (200, "not sliced"));
}

#[test]
fn each_slice_is_its_own_cache_entry() {
    let s = start("slice-cache");
    let r = ranged(&s, "/s/f.txt", "bytes=5-9");
    assert_eq!((r.status, r.body_str().as_str()), (206, "56789"));
    assert_eq!(r.header("x-cache"), Some("MISS"));
    upstream_log(&s, 2);
    // The same range again: both slices from the cache.
    let r = ranged(&s, "/s/f.txt", "bytes=5-9");
    assert_eq!((r.status, r.body_str().as_str()), (206, "56789"));
    assert_eq!(r.header("x-cache"), Some("HIT"));
    // A range in the second slice alone: a hit too; one reaching the third asks for it only.
    let r = ranged(&s, "/s/f.txt", "bytes=8-9");
    assert_eq!((r.status, r.body_str().as_str()), (206, "89"));
    assert_eq!(r.header("x-cache"), Some("HIT"));
    let r = ranged(&s, "/s/f.txt", "bytes=6-13");
    assert_eq!((r.status, r.body_str().as_str()), (206, "6789abcd"));
    let log = upstream_log(&s, 3);
    assert_eq!(
        log,
        [
            "/f.txt bytes=4-7",
            "/f.txt bytes=8-11",
            "/f.txt bytes=12-15"
        ],
        "only the slice not cached was asked for"
    );
}
