//! `open_file_cache`: correct after a file is replaced, truncated or deleted once
//! `open_file_cache_valid` has passed (and at once without the cache), errors cached only with
//! `open_file_cache_errors on`, never more than `max` entries, and the same bytes on the wire
//! with and without it; pipelined static responses complete and in order. Without the cache,
//! the descriptors a worker keeps between requests (`files::Reuse`) never show a changed file.

mod support;

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use support::*;

fn conf(cache: &str) -> String {
    format!(
        r#"
worker_processes 1;
error_log logs/error.log info;
events {{ }}
http {{
    access_log off;
    {cache}
    server {{
        listen 127.0.0.1:{{port}};
        root {{dir}}/html;
        location = /status {{ shard_status; }}
    }}
}}
"#
    )
}

const CACHE: &str = "open_file_cache max=2 inactive=20s; open_file_cache_valid 1s;";

fn body(s: &Server, path: &str) -> (u16, String) {
    let r = get(s.addr(), path);
    (r.status, r.body_str())
}

/// Polls until `path` answers `want`; returns how long that took.
fn until(s: &Server, path: &str, want: (u16, &str)) -> Duration {
    let t0 = Instant::now();
    wait_for(Duration::from_secs(5), "the file's new state", || {
        // Within the validity a truncated file's cached size is more than it holds: that
        // response ends early (the connection closes), which is not the new state yet.
        let r = try_get(s.addr(), path).ok()?;
        (r.status == want.0 && r.body_str() == want.1).then_some(())
    });
    t0.elapsed()
}

#[test]
fn a_file_replaced_by_rename_is_served_new_once_valid_passed() {
    let s = Server::start("ofc-rename", &conf(CACHE), 1);
    let html = s.dir.join("html");
    std::fs::write(html.join("a.txt"), "one").unwrap();
    assert_eq!(body(&s, "/a.txt"), (200, "one".into()));
    std::fs::write(html.join("a.new"), "two-two").unwrap();
    std::fs::rename(html.join("a.new"), html.join("a.txt")).unwrap();
    // Within the validity the cached descriptor (the old file) answers.
    assert_eq!(body(&s, "/a.txt"), (200, "one".into()));
    let took = until(&s, "/a.txt", (200, "two-two"));
    assert!(took < Duration::from_secs(3), "{took:?}");
    assert!(status_field(&s, "file_cache_hits") >= 1);
    assert!(status_field(&s, "file_cache_misses") >= 2);

    // Without the cache, at once.
    let s = Server::start("ofc-rename-off", &conf(""), 1);
    let html = s.dir.join("html");
    std::fs::write(html.join("a.txt"), "one").unwrap();
    assert_eq!(body(&s, "/a.txt"), (200, "one".into()));
    std::fs::write(html.join("a.new"), "two-two").unwrap();
    std::fs::rename(html.join("a.new"), html.join("a.txt")).unwrap();
    assert_eq!(body(&s, "/a.txt"), (200, "two-two".into()));
    assert_eq!(status_field(&s, "file_cache_hits"), 0);
}

#[test]
fn truncated_and_deleted_files_are_served_as_they_are_once_valid_passed() {
    let s = Server::start("ofc-trunc", &conf(CACHE), 1);
    let html = s.dir.join("html");
    std::fs::write(html.join("t.txt"), "abcdefgh").unwrap();
    assert_eq!(body(&s, "/t.txt"), (200, "abcdefgh".into()));
    std::fs::write(html.join("t.txt"), "abc").unwrap();
    until(&s, "/t.txt", (200, "abc"));
    std::fs::remove_file(html.join("t.txt")).unwrap();
    // The cached descriptor still reads the deleted file's bytes for at most the validity.
    wait_for(Duration::from_secs(5), "404 after the delete", || {
        (try_get(s.addr(), "/t.txt").ok()?.status == 404).then_some(())
    });
}

#[test]
fn errors_are_cached_only_with_open_file_cache_errors_on() {
    let on = Server::start(
        "ofc-errors-on",
        &conf(&format!("{CACHE} open_file_cache_errors on;")),
        1,
    );
    assert_eq!(get(on.addr(), "/late.txt").status, 404);
    std::fs::write(on.dir.join("html/late.txt"), "here").unwrap();
    // The cached 404 holds for the validity, then the file is found.
    assert_eq!(get(on.addr(), "/late.txt").status, 404);
    let took = until(&on, "/late.txt", (200, "here"));
    assert!(took < Duration::from_secs(3), "{took:?}");

    let off = Server::start("ofc-errors-off", &conf(CACHE), 1);
    assert_eq!(get(off.addr(), "/late.txt").status, 404);
    std::fs::write(off.dir.join("html/late.txt"), "here").unwrap();
    assert_eq!(body(&off, "/late.txt"), (200, "here".into()));
}

#[test]
fn the_cache_never_holds_more_than_max_entries() {
    let s = Server::start("ofc-max", &conf(CACHE), 1);
    for i in 0..6 {
        std::fs::write(s.dir.join(format!("html/f{i}.txt")), format!("{i}")).unwrap();
    }
    for round in 0..3 {
        for i in 0..6 {
            assert_eq!(
                body(&s, &format!("/f{i}.txt")),
                (200, i.to_string()),
                "round {round}"
            );
            assert!(status_field(&s, "file_cache_entries") <= 2);
        }
    }
    assert_eq!(status_field(&s, "file_cache_entries"), 2);
}

/// Everything the server sends for `req` on a new connection until it closes it (10 s at
/// most per read).
fn until_close(addr: std::net::SocketAddr, req: &[u8]) -> Vec<u8> {
    let mut c = connect(addr);
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    c.write_all(req).unwrap();
    let mut out = Vec::new();
    c.read_to_end(&mut out).expect("the connection closes");
    out
}

/// The bytes of a response, its `Date` line blanked.
fn wire(addr: std::net::SocketAddr, req: &[u8]) -> Vec<u8> {
    let out = until_close(addr, req);
    let text = String::from_utf8_lossy(&out).into_owned();
    text.lines()
        .map(|l| {
            if l.starts_with("Date: ") {
                "Date: -"
            } else {
                l
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
        .into_bytes()
}

#[test]
fn the_bytes_on_the_wire_are_the_same_with_and_without_the_cache() {
    let on = Server::start("ofc-wire-on", &conf(CACHE), 1);
    let off = Server::start("ofc-wire-off", &conf(""), 1);
    let big: Vec<u8> = (0..100_000u32).map(|i| b'a' + (i % 26) as u8).collect();
    for s in [&on, &off] {
        std::fs::write(s.dir.join("html/small.txt"), "small body\n").unwrap();
        std::fs::write(s.dir.join("html/big.txt"), &big).unwrap();
    }
    for req in [
        &b"GET /small.txt HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"[..],
        b"GET /big.txt HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        b"GET /big.txt HTTP/1.1\r\nHost: x\r\nRange: bytes=10-20\r\nConnection: close\r\n\r\n",
        b"HEAD /small.txt HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        b"GET /nope.txt HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    ] {
        // Twice: a miss, then a hit.
        for _ in 0..2 {
            assert_eq!(
                wire(on.addr(), req),
                wire(off.addr(), req),
                "{}",
                String::from_utf8_lossy(req)
            );
        }
    }
    assert!(status_field(&on, "file_cache_hits") > 0);
}

#[test]
fn pipelined_static_responses_arrive_complete_and_in_order() {
    for cache in [CACHE, ""] {
        let s = Server::start("ofc-pipeline", &conf(cache), 1);
        std::fs::write(s.dir.join("html/a.txt"), "aaa").unwrap();
        std::fs::write(s.dir.join("html/b.txt"), "bbbb").unwrap();
        let mut c = connect(s.addr());
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let reqs = "GET /a.txt HTTP/1.1\r\nHost: x\r\n\r\n\
                    HEAD /b.txt HTTP/1.1\r\nHost: x\r\n\r\n\
                    GET /missing.txt HTTP/1.1\r\nHost: x\r\n\r\n\
                    GET /b.txt HTTP/1.1\r\nHost: x\r\n\r\n\
                    GET /a.txt HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
        c.write_all(reqs.as_bytes()).unwrap();
        let mut buf = Vec::new();
        c.read_to_end(&mut buf).unwrap();
        // Read in order, the HEAD response without its body.
        let mut at = 0;
        let mut got = Vec::new();
        for head_only in [false, true, false, false, false] {
            let end = find(&buf[at..], b"\r\n\r\n").expect("a complete head") + at;
            let head = String::from_utf8_lossy(&buf[at..end]).into_owned();
            let status: u16 = head.split(' ').nth(1).unwrap().parse().unwrap();
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("Content-Length: "))
                .unwrap()
                .trim()
                .parse()
                .unwrap();
            let body_len = if head_only { 0 } else { len };
            got.push((
                status,
                String::from_utf8_lossy(&buf[end + 4..end + 4 + body_len]).into_owned(),
            ));
            at = end + 4 + body_len;
        }
        assert_eq!(at, buf.len(), "bytes after the last response");
        assert_eq!(got[0], (200, "aaa".into()));
        assert_eq!(got[1], (200, String::new()));
        assert_eq!(got[2].0, 404);
        assert_eq!(got[3], (200, "bbbb".into()));
        assert_eq!(got[4], (200, "aaa".into()));
    }
}

/// The worker `pid`'s descriptors: each number and the path `/proc/PID/fd` gives for it.
fn fd_links(pid: u64) -> Vec<(String, String)> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.filter_map(|e| {
                let e = e.ok()?;
                let target = std::fs::read_link(e.path()).ok()?;
                Some((
                    e.file_name().to_string_lossy().into_owned(),
                    target.to_string_lossy().into_owned(),
                ))
            })
            .collect()
        })
        .unwrap_or_default()
}

/// Paths the worker `pid` holds open.
fn held_files(pid: u64) -> Vec<String> {
    fd_links(pid).into_iter().map(|(_, p)| p).collect()
}

#[test]
fn without_the_cache_every_change_of_a_file_is_seen_at_once() {
    use std::os::unix::fs::PermissionsExt;
    let mut s = Server::start("reuse-changes", &conf(""), 1);
    let pid = s.wait_workers(1)[0].pid;
    let html = s.dir.join("html");
    let a = html.join("a.txt");
    std::fs::write(&a, "one").unwrap();
    assert_eq!(body(&s, "/a.txt"), (200, "one".into()));
    // The worker keeps the descriptor for the next request (so what follows tests it).
    let name = a.to_string_lossy().into_owned();
    assert!(held_files(pid).contains(&name), "{:?}", held_files(pid));
    // Rewritten in place, same size and shorter.
    std::fs::write(&a, "two").unwrap();
    assert_eq!(body(&s, "/a.txt"), (200, "two".into()));
    std::fs::write(&a, "ab").unwrap();
    assert_eq!(body(&s, "/a.txt"), (200, "ab".into()));
    // Replaced by rename.
    std::fs::write(html.join("a.new"), "three").unwrap();
    std::fs::rename(html.join("a.new"), &a).unwrap();
    assert_eq!(body(&s, "/a.txt"), (200, "three".into()));
    // Made unreadable, then readable again (workers never run with root's privileges).
    std::fs::set_permissions(&a, std::fs::Permissions::from_mode(0o000)).unwrap();
    assert_eq!(get(s.addr(), "/a.txt").status, 403);
    std::fs::set_permissions(&a, std::fs::Permissions::from_mode(0o644)).unwrap();
    assert_eq!(body(&s, "/a.txt"), (200, "three".into()));
    // Deleted, then created again.
    std::fs::remove_file(&a).unwrap();
    assert_eq!(get(s.addr(), "/a.txt").status, 404);
    std::fs::write(&a, "four").unwrap();
    assert_eq!(body(&s, "/a.txt"), (200, "four".into()));
    assert_eq!(status_field(&s, "file_cache_hits"), 0);
}

#[test]
fn a_deleted_file_is_not_held_open_for_long() {
    let mut s = Server::start("reuse-deleted", &conf(""), 1);
    let pid = s.wait_workers(1)[0].pid;
    let a = s.dir.join("html/gone.txt");
    std::fs::write(&a, "bytes").unwrap();
    assert_eq!(body(&s, "/gone.txt"), (200, "bytes".into()));
    let name = a.to_string_lossy().into_owned();
    assert!(held_files(pid).contains(&name));
    // Deleted and never asked for again: closed once unused for a few seconds.
    std::fs::remove_file(&a).unwrap();
    let t0 = Instant::now();
    wait_for(Duration::from_secs(10), "the deleted file closed", || {
        (!held_files(pid).iter().any(|p| p.starts_with(&name))).then_some(())
    });
    assert!(t0.elapsed() < Duration::from_secs(8), "{:?}", t0.elapsed());
}

/// The descriptor numbers of `pid` that name `file`.
fn fds_of(pid: u64, file: &str) -> Vec<String> {
    fd_links(pid)
        .into_iter()
        .filter(|(_, p)| p == file)
        .map(|(n, _)| n)
        .collect()
}

#[test]
fn an_unchanged_file_is_served_from_the_same_descriptor() {
    let mut s = Server::start("reuse-same", &conf(""), 1);
    let pid = s.wait_workers(1)[0].pid;
    let a = s.dir.join("html/same.txt");
    std::fs::write(&a, "same").unwrap();
    let name = a.to_string_lossy().into_owned();
    assert_eq!(body(&s, "/same.txt"), (200, "same".into()));
    let first = fds_of(pid, &name);
    assert_eq!(first.len(), 1, "{first:?}");
    for _ in 0..3 {
        assert_eq!(body(&s, "/same.txt"), (200, "same".into()));
        assert_eq!(fds_of(pid, &name), first, "opened again");
    }
}

#[test]
fn an_index_file_is_served_from_a_directory_that_cannot_be_listed() {
    use std::os::unix::fs::PermissionsExt;
    let s = Server::start("index-noread", &conf(""), 1);
    let html = s.dir.join("html");
    for d in ["locked", "empty"] {
        std::fs::create_dir(html.join(d)).unwrap();
    }
    std::fs::write(html.join("locked/index.html"), "inside").unwrap();
    // Search permission only, for everyone the worker could be (nginx serves this too).
    for d in ["locked", "empty"] {
        std::fs::set_permissions(html.join(d), std::fs::Permissions::from_mode(0o311)).unwrap();
    }
    assert_eq!(body(&s, "/locked/"), (200, "inside".into()));
    assert_eq!(get(s.addr(), "/empty/").status, 403, "no index file");
    assert_eq!(get(s.addr(), "/nothere/").status, 404);
}

/// Files the worker `pid` has mapped (`/proc/PID/maps`).
fn mapped_files(pid: u64) -> Vec<String> {
    std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5).map(str::to_string))
        .collect()
}

/// Checks a response read to its end: a head with `Content-Length: len`, then a body that is a
/// prefix of `data` (never padded with anything else); returns the body's length.
fn short_or_whole(buf: &[u8], data: &[u8]) -> usize {
    let end = find(buf, b"\r\n\r\n").expect("a head, not an empty reply") + 4;
    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let body = &buf[end..];
    assert!(body.len() <= data.len(), "{head}");
    if let Some(i) = (0..body.len()).find(|&i| body[i] != data[i]) {
        panic!(
            "the body is the file's bytes, no padding: {} bytes, byte {i} is {:?}, not {:?} \
             ({head})",
            body.len(),
            &body[i..body.len().min(i + 16)],
            &data[i..body.len().min(i + 16)]
        );
    }
    body.len()
}

/// A kept file asked for again is sent from its mapping (`files::OpenFile::mapping`).
/// Truncated while a response is being sent from it, the response stops: the connection closes
/// at once (not at `send_timeout`), the worker survives (the kernel's copy from the lost pages
/// fails, no `SIGBUS`), and the file's new state is served next.
#[test]
fn a_file_truncated_while_sent_from_its_mapping_ends_that_response_only() {
    for cache in [CACHE, ""] {
        // A small send buffer: most of the file still waits in the worker when it shrinks,
        // whatever the machine's `tcp_wmem`.
        let conf = conf(cache).replace(
            "listen 127.0.0.1:{port};",
            "listen 127.0.0.1:{port} sndbuf=64k;",
        );
        let mut s = Server::start("map-truncate", &conf, 1);
        let pid = s.wait_workers(1)[0].pid;
        let big: Vec<u8> = (0..4_000_000u32).map(|i| b'a' + (i % 26) as u8).collect();
        let path = s.dir.join("html/big.bin");
        std::fs::write(&path, &big).unwrap();
        // Served whole twice: kept, then asked again and mapped.
        for _ in 0..2 {
            let r = get(s.addr(), "/big.bin");
            assert_eq!(r.status, 200);
            assert!(r.body == big, "a whole file, byte for byte");
        }
        let name = path.to_string_lossy().into_owned();
        assert!(mapped_files(pid).contains(&name), "{:?}", mapped_files(pid));
        // A client that reads slowly: most of the file waits behind a full socket.
        let sock =
            socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        sock.set_recv_buffer_size(16 * 1024).unwrap();
        sock.connect(&s.addr().into()).unwrap();
        let mut c: std::net::TcpStream = sock.into();
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        c.write_all(b"GET /big.bin HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        let mut got = vec![0u8; 64 * 1024];
        let mut n = 0;
        while n < got.len() {
            let k = c.read(&mut got[n..]).unwrap();
            assert!(k > 0, "closed after {n} bytes, before the file shrank");
            n += k;
        }
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(1000)
            .unwrap();
        let t0 = Instant::now();
        c.read_to_end(&mut got)
            .expect("the connection closes, it does not hang");
        assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
        let body = short_or_whole(&got, &big);
        assert!(body < big.len(), "the response ends early");
        // A new request: the cache's entry (while valid) still says 4 MB, and the response
        // ends short after its head, as a short `pread` ends it; without the cache, or once
        // the entry is no longer valid, the file as it is now.
        let buf = until_close(
            s.addr(),
            b"GET /big.bin HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        );
        assert!(short_or_whole(&buf, &big) <= 1000);
        // The same worker serves the file as it now is (with the cache, once valid passed).
        let now = String::from_utf8(big[..1000].to_vec()).unwrap();
        until(&s, "/big.bin", (200, &now));
        assert!(pid_alive(pid as i32), "the worker survived");
        assert_eq!(s.workers()[0].pid, pid);
    }
}

/// A file rewritten shorter in place, while `open_file_cache` still gives its old size: the
/// rest of the page that holds the new end reads as zeros through a mapping, without a fault,
/// so the response must not take it from there. It ends short, as nginx's does ("read only
/// N of M"), never padded.
#[test]
fn a_file_shrunk_in_place_is_never_padded_from_its_mapping() {
    let long = "open_file_cache max=10 inactive=60s; open_file_cache_valid 60s;";
    let mut s = Server::start("map-shrink", &conf(long), 1);
    let pid = s.wait_workers(1)[0].pid;
    let data: Vec<u8> = (0..3000u32).map(|i| b'a' + (i % 26) as u8).collect();
    let path = s.dir.join("html/s.txt");
    std::fs::write(&path, &data).unwrap();
    for _ in 0..2 {
        assert_eq!(get(s.addr(), "/s.txt").body, data);
    }
    let name = path.to_string_lossy().into_owned();
    assert!(mapped_files(pid).contains(&name), "{:?}", mapped_files(pid));
    std::fs::write(&path, &data[..2000]).unwrap();
    let buf = until_close(
        s.addr(),
        b"GET /s.txt HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert!(
        String::from_utf8_lossy(&buf).contains("Content-Length: 3000"),
        "the cached size"
    );
    assert_eq!(
        short_or_whole(&buf, &data),
        2000,
        "what the file holds, then the close"
    );
}
