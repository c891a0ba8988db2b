//! `proxy_cache` as a client and a counting upstream see it: hits and misses, what is and is
//! not stored (headers, `proxy_no_cache`, `proxy_cache_bypass`, `min_uses`), HEAD converted
//! to GET, ranges served from an entry, `Vary` variants, stale entries on errors, one request
//! filling a cold key under `proxy_cache_lock`, revalidation with `304`, entries kept across
//! a restart, a response cut mid-body never stored, and the configuration errors nginx gives.
//!
//! Every upstream is `support::upstream::Upstream`, which counts the requests it answers.
//! Freshness runs on whole seconds, as nginx's: the tests that wait for an entry to expire
//! poll with a deadline until the status says so.

mod support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use support::upstream::{Gate, Reply, Upstream};
use support::*;

/// One worker, a cache at `{dir}/cache` (or `cache_dir`), `location /` proxied to `port`
/// with `loc_extra`, the cache status in `X-Cache`.
fn conf(cache_dir: &str, port: u16, http_extra: &str, loc_extra: &str) -> String {
    format!(
        "worker_processes 1;\n\
         error_log logs/error.log info;\n\
         events {{ worker_connections 256; }}\n\
         http {{\n\
         access_log logs/access.log combined;\n\
         proxy_connect_timeout 1s; proxy_read_timeout 3s;\n\
         proxy_cache_path {cache_dir} levels=1:2 keys_zone=one:1m;\n\
         {http_extra}\n\
         server {{\n\
         listen 127.0.0.1:{{port}};\n\
         location = /status {{ shard_status; }}\n\
         location / {{\n\
         proxy_pass http://127.0.0.1:{port};\n\
         proxy_cache one;\n\
         add_header X-Cache $upstream_cache_status always;\n\
         {loc_extra}\n\
         }}\n\
         }}\n\
         }}\n"
    )
}

/// An upstream that numbers its answers: `n:PATH` (so a served copy is told from a new one).
fn numbered(extra: Vec<(String, String)>) -> (Upstream, Arc<AtomicUsize>) {
    let n = Arc::new(AtomicUsize::new(0));
    let m = n.clone();
    let up = Upstream::start(move |r| {
        let i = m.fetch_add(1, Ordering::SeqCst) + 1;
        Reply::Fixed {
            status: 200,
            headers: extra.clone(),
            body: format!("{i}:{}", r.target).into_bytes(),
        }
    });
    (up, n)
}

fn req(addr: SocketAddr, head: &str) -> Response {
    let mut s = connect(addr);
    write!(s, "{head}\r\nHost: localhost\r\nConnection: close\r\n\r\n").unwrap();
    read_response(&mut s, head.starts_with("HEAD")).expect("response")
}

fn cache_status(r: &Response) -> &str {
    r.header("x-cache").unwrap_or("")
}

/// Files under `dir` whose names start with `prefix` (`""`: all).
fn files_under(dir: &Path, prefix: &str) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if e.file_name().to_string_lossy().starts_with(prefix) {
                out.push(p);
            }
        }
    }
    out
}

#[test]
fn a_response_is_stored_once_and_served_from_the_entry() {
    let (up, n) = numbered(vec![
        ("Content-Type".into(), "text/plain".into()),
        ("Content-Range".into(), "stub".into()),
    ]);
    let s = Server::start(
        "cache-hit",
        &conf("{dir}/cache", up.port, "", "proxy_cache_valid 200 10m;"),
        1,
    );
    let a = s.addr();
    let r = get(a, "/t");
    assert_eq!((r.status, cache_status(&r)), (200, "MISS"), "{r:?}");
    assert_eq!(r.body_str(), "1:/t");
    let r = get(a, "/t");
    assert_eq!((r.status, cache_status(&r)), (200, "HIT"), "{r:?}");
    assert_eq!(r.body_str(), "1:/t");
    assert_eq!(r.header("content-type"), Some("text/plain"));
    assert_eq!(n.load(Ordering::SeqCst), 1, "one upstream request");
    // nginx's layout: levels=1:2 from the end of the key's MD5.
    let files = files_under(&s.dir.join("cache"), "");
    assert_eq!(files.len(), 1, "{files:?}");
    let name = files[0].file_name().unwrap().to_string_lossy().into_owned();
    assert_eq!(name.len(), 32);
    let l1 = files[0].parent().unwrap();
    assert_eq!(l1.file_name().unwrap().to_string_lossy(), &name[29..31]);
    assert_eq!(
        l1.parent().unwrap().file_name().unwrap().to_string_lossy(),
        &name[31..]
    );
    // Another key is another entry.
    assert_eq!(get(a, "/u").body_str(), "2:/u");
    // HEAD: asked upstream as GET, stored, and answered without a body; then a hit.
    let r = req(a, "HEAD /h HTTP/1.1");
    assert_eq!((r.status, cache_status(&r)), (200, "MISS"));
    assert!(r.body.is_empty());
    assert_eq!(up.last().method, "GET", "HEAD converted to GET");
    // The client has its head before the body is read and stored: the entry follows.
    wait_for(Duration::from_secs(5), "the HEAD's entry", || {
        (cache_status(&req(a, "HEAD /h HTTP/1.1")) == "HIT").then_some(())
    });
    // (A HEAD that came before the entry was whole asked again: which answer is stored
    // depends on the timing, not that it is one of them.)
    let asked = n.load(Ordering::SeqCst);
    let r = get(a, "/h");
    assert_eq!(cache_status(&r), "HIT");
    assert!(r.body_str().ends_with(":/h"), "{r:?}");
    assert_eq!(n.load(Ordering::SeqCst), asked, "served from the entry");
    // Ranges of a stored 200, one and several.
    let r = req(a, "GET /t HTTP/1.1\r\nRange: bytes=2-");
    assert_eq!((r.status, r.body_str().as_str()), (206, "/t"), "{r:?}");
    assert_eq!(r.header("content-range"), Some("bytes 2-3/4"));
    let r = req(a, "GET /t HTTP/1.1\r\nRange: bytes=0-0,2-3");
    assert_eq!(r.status, 206);
    let body = r.body_str();
    assert!(
        r.header("content-type")
            .unwrap()
            .starts_with("multipart/byteranges"),
        "{r:?}"
    );
    assert!(
        body.contains("Content-Range: bytes 0-0/4\r\n\r\n1"),
        "{body}"
    );
    assert!(
        body.contains("Content-Range: bytes 2-3/4\r\n\r\n/t"),
        "{body}"
    );
    // An upstream's own `Content-Range` gives way to the range filter's.
    let _ = get(a, "/cr");
    let r = req(a, "GET /cr HTTP/1.1\r\nRange: bytes=0-1");
    let ranges: Vec<_> = r
        .headers
        .iter()
        .filter(|(n, _)| n.eq_ignore_ascii_case("content-range"))
        .collect();
    assert_eq!(ranges.len(), 1, "{r:?}");
    assert!(ranges[0].1.starts_with("bytes 0-1/"), "{r:?}");
    // One range on the first request: cut from the live answer, which is stored whole.
    let r = req(a, "GET /r HTTP/1.1\r\nRange: bytes=2-");
    assert_eq!(
        (r.status, cache_status(&r), r.body_str().as_str()),
        (206, "MISS", "/r"),
        "{r:?}"
    );
    let whole = get(a, "/r");
    assert_eq!(cache_status(&whole), "HIT");
    assert!(
        whole.body_str().ends_with(":/r") && whole.body.len() == 4,
        "{whole:?}"
    );
    // The client's validators and ranges do not reach the upstream of a cached location.
    let _ = req(
        a,
        "GET /v HTTP/1.1\r\nRange: bytes=0-1\r\nIf-None-Match: \"x\"",
    );
    let last = up.last();
    assert_eq!(last.header("range"), None);
    assert_eq!(last.header("if-none-match"), None);
    assert_eq!(n.load(Ordering::SeqCst), asked + 3);
}

#[test]
fn what_may_not_be_stored_is_not() {
    let n = Arc::new(AtomicUsize::new(0));
    let m = n.clone();
    let up = Upstream::start(move |r| {
        let i = m.fetch_add(1, Ordering::SeqCst) + 1;
        let h: &[(&str, &str)] = match r.target.as_str() {
            "/nostore" => &[("Cache-Control", "no-store")],
            "/private" => &[("Cache-Control", "private, max-age=60")],
            "/cookie" => &[("Set-Cookie", "a=b")],
            "/accel0" => &[("X-Accel-Expires", "0")],
            "/maxage" => &[("Cache-Control", "max-age=60")],
            _ => &[],
        };
        let status = if r.target == "/missing" { 404 } else { 200 };
        Reply::Fixed {
            status,
            headers: h
                .iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect(),
            body: format!("{i}").into_bytes(),
        }
    });
    let s = Server::start(
        "cache-nostore",
        &conf(
            "{dir}/cache",
            up.port,
            "",
            // 200 only: a 404 is not stored, `max-age` stores what proxy_cache_valid does not.
            "proxy_cache_valid 200 10m;\n\
             proxy_no_cache $arg_nocache;\n\
             proxy_cache_bypass $http_x_bypass;",
        ),
        1,
    );
    let a = s.addr();
    for path in [
        "/nostore",
        "/private",
        "/cookie",
        "/accel0",
        "/missing",
        "/x?nocache=1",
    ] {
        let first = get(a, path);
        let second = get(a, path);
        assert_eq!(cache_status(&second), "MISS", "{path}: {second:?}");
        assert_ne!(first.body, second.body, "{path}: asked again");
    }
    // `max-age` from the upstream stores a status proxy_cache_valid does not name as well.
    let one = get(a, "/maxage");
    let two = get(a, "/maxage");
    assert_eq!((cache_status(&two), &two.body), ("HIT", &one.body));
    // Bypass: asked upstream, and the new answer replaces the entry.
    let r = req(a, "GET /maxage HTTP/1.1\r\nX-Bypass: 1");
    assert_eq!(cache_status(&r), "BYPASS");
    let after = get(a, "/maxage");
    assert_eq!((cache_status(&after), &after.body), ("HIT", &r.body));
}

#[test]
fn min_uses_and_a_cache_chosen_by_a_variable() {
    let (up, n) = numbered(Vec::new());
    let s = Server::start(
        "cache-minuses",
        &conf(
            "{dir}/cache",
            up.port,
            "proxy_cache_path {dir}/two keys_zone=two:1m;",
            "proxy_cache_valid any 10m; proxy_cache_min_uses 2;\n\
             location /v/ { proxy_pass http://127.0.0.1:PORT; proxy_cache $arg_c;\n\
             proxy_cache_valid any 10m; proxy_cache_min_uses 1; add_header X-Cache $upstream_cache_status; }"
                .replace("PORT", &up.port.to_string())
                .as_str(),
        ),
        1,
    );
    let a = s.addr();
    assert_eq!(cache_status(&get(a, "/m")), "MISS");
    assert_eq!(cache_status(&get(a, "/m")), "MISS");
    let r = get(a, "/m");
    assert_eq!((cache_status(&r), r.body_str().as_str()), ("HIT", "2:/m"));
    assert_eq!(n.load(Ordering::SeqCst), 2);
    // `proxy_cache $arg_c`: the zone by name; none without a value; an unknown one is a 500.
    assert_eq!(cache_status(&get(a, "/v/1?c=two")), "MISS");
    assert_eq!(cache_status(&get(a, "/v/1?c=two")), "HIT");
    let r = get(a, "/v/2");
    assert_eq!((r.status, r.header("x-cache")), (200, None));
    assert_eq!(get(a, "/v/3?c=nosuch").status, 500);
    assert_eq!(files_under(&s.dir.join("two"), "").len(), 1);
}

#[test]
fn stale_entries_answer_for_a_failed_upstream() {
    let fail = Arc::new(AtomicUsize::new(0));
    let f = fail.clone();
    let up = Upstream::start(move |_| match f.load(Ordering::SeqCst) {
        0 => Reply::text(200, "fresh"),
        1 => Reply::text(500, "broken"),
        _ => Reply::CloseNow,
    });
    let s = Server::start(
        "cache-stale",
        &conf(
            "{dir}/cache",
            up.port,
            "",
            "proxy_cache_valid 200 1s; proxy_cache_use_stale error timeout http_500;",
        ),
        1,
    );
    let a = s.addr();
    assert_eq!(get(a, "/s").body_str(), "fresh");
    fail.store(1, Ordering::SeqCst);
    // Fresh for one second: hits until it expires, then the 500 is answered by the entry.
    let r = wait_for(Duration::from_secs(5), "the entry to expire", || {
        let r = get(a, "/s");
        (cache_status(&r) != "HIT").then_some(r)
    });
    assert_eq!(
        (r.status, cache_status(&r), r.body_str().as_str()),
        (200, "STALE", "fresh")
    );
    fail.store(2, Ordering::SeqCst);
    let r = get(a, "/s");
    assert_eq!(
        (r.status, cache_status(&r), r.body_str().as_str()),
        (200, "STALE", "fresh")
    );
    // Without use_stale for it, the failure is the client's.
    let (up2, _) = numbered(Vec::new());
    drop(up2);
}

#[test]
fn one_request_fills_a_cold_key_under_the_lock() {
    let n = Arc::new(AtomicUsize::new(0));
    let m = n.clone();
    let up = Upstream::start(move |_| {
        m.fetch_add(1, Ordering::SeqCst);
        Reply::Delayed(
            Duration::from_millis(400),
            Box::new(Reply::text(200, "filled")),
        )
    });
    let s = Server::start(
        "cache-lock",
        &conf(
            "{dir}/cache",
            up.port,
            "",
            "proxy_cache_valid 200 10m; proxy_cache_lock on; proxy_cache_lock_timeout 5s;",
        ),
        1,
    );
    let a = s.addr();
    let clients: Vec<_> = (0..8)
        .map(|_| std::thread::spawn(move || get(a, "/cold")))
        .collect();
    let rs: Vec<Response> = clients.into_iter().map(|t| t.join().unwrap()).collect();
    for r in &rs {
        assert_eq!((r.status, r.body_str().as_str()), (200, "filled"), "{r:?}");
    }
    assert_eq!(
        n.load(Ordering::SeqCst),
        1,
        "one request reached the upstream"
    );
    let misses = rs.iter().filter(|r| cache_status(r) == "MISS").count();
    assert_eq!(misses, 1, "the others were served the entry");
}

#[test]
fn an_expired_entry_is_revalidated_with_its_validators() {
    let up = Upstream::start(|r| {
        if r.header("if-modified-since").is_some() {
            return Reply::Fixed {
                status: 304,
                headers: vec![],
                body: Vec::new(),
            };
        }
        Reply::Fixed {
            status: 200,
            headers: vec![
                (
                    "Last-Modified".into(),
                    "Mon, 02 Jan 2006 15:04:05 GMT".into(),
                ),
                ("ETag".into(), "\"v1\"".into()),
            ],
            body: b"original".to_vec(),
        }
    });
    let s = Server::start(
        "cache-revalidate",
        &conf(
            "{dir}/cache",
            up.port,
            "",
            "proxy_cache_valid 200 1s; proxy_cache_revalidate on;",
        ),
        1,
    );
    let a = s.addr();
    assert_eq!(get(a, "/r").body_str(), "original");
    let r = wait_for(Duration::from_secs(5), "the entry to expire", || {
        let r = get(a, "/r");
        (cache_status(&r) != "HIT").then_some(r)
    });
    assert_eq!(
        (r.status, cache_status(&r), r.body_str().as_str()),
        (200, "REVALIDATED", "original"),
        "{r:?}"
    );
    let last = up.last();
    assert_eq!(
        last.header("if-modified-since"),
        Some("Mon, 02 Jan 2006 15:04:05 GMT")
    );
    assert_eq!(last.header("if-none-match"), Some("\"v1\""));
    // Fresh again.
    assert_eq!(cache_status(&get(a, "/r")), "HIT");
}

#[test]
fn vary_keeps_one_entry_per_variant() {
    let n = Arc::new(AtomicUsize::new(0));
    let m = n.clone();
    let up = Upstream::start(move |r| {
        let i = m.fetch_add(1, Ordering::SeqCst) + 1;
        if r.header("x-lang") == Some("de") {
            return Reply::text(200, &format!("{i}:novary"));
        }
        Reply::Fixed {
            status: 200,
            headers: vec![("Vary".into(), "X-Lang".into())],
            body: format!("{i}:{}", r.header("x-lang").unwrap_or("-")).into_bytes(),
        }
    });
    let s = Server::start(
        "cache-vary",
        &conf("{dir}/cache", up.port, "", "proxy_cache_valid 200 10m;"),
        1,
    );
    let a = s.addr();
    let en = |a| req(a, "GET /p HTTP/1.1\r\nX-Lang: en");
    let fr = |a| req(a, "GET /p HTTP/1.1\r\nX-Lang: fr");
    assert_eq!(en(a).body_str(), "1:en");
    assert_eq!(fr(a).body_str(), "2:fr");
    let (e, f) = (en(a), fr(a));
    assert_eq!((cache_status(&e), e.body_str().as_str()), ("HIT", "1:en"));
    assert_eq!((cache_status(&f), f.body_str().as_str()), ("HIT", "2:fr"));
    assert_eq!(n.load(Ordering::SeqCst), 2);
    // An answer without `Vary` (the upstream changed its mind) replaces every variant.
    let r = req(a, "GET /p HTTP/1.1\r\nX-Lang: de");
    assert_eq!(cache_status(&r), "MISS");
    let (e, f) = (en(a), fr(a));
    assert_eq!(
        (cache_status(&e), e.body_str().as_str()),
        ("HIT", "3:novary")
    );
    assert_eq!(
        (cache_status(&f), f.body_str().as_str()),
        ("HIT", "3:novary")
    );
}

#[test]
fn entries_survive_a_restart_and_a_cut_response_is_never_stored() {
    let (up, n) = numbered(Vec::new());
    let cache = temp_dir("cache-keep");
    let dir = cache.join("c").display().to_string();
    let c = conf(&dir, up.port, "", "proxy_cache_valid 200 10m;");
    {
        let s = Server::start("cache-restart-1", &c, 1);
        assert_eq!(get(s.addr(), "/k").body_str(), "1:/k");
    }
    // A new server on the same directory: the entry is found on disk, and the cache loader
    // process indexes it.
    let s = Server::start("cache-restart-2", &c, 1);
    wait_for(Duration::from_secs(5), "the loader's line", || {
        error_log(&s)
            .contains("http file cache: 1 entries indexed")
            .then_some(())
    });
    let r = get(s.addr(), "/k");
    assert_eq!((cache_status(&r), r.body_str().as_str()), ("HIT", "1:/k"));
    assert_eq!(n.load(Ordering::SeqCst), 1);
    drop(s);

    // An upstream that resets the connection after half the body: the client sees a cut
    // response, nothing is stored, and no temporary file is left.
    let gate = Gate::new();
    let g = gate.clone();
    let cut = Upstream::start(move |_| Reply::ResetMid {
        len: 100_000,
        sent: 50_000,
        gate: g.clone(),
    });
    let s = Server::start(
        "cache-cut",
        &conf("{dir}/cache", cut.port, "", "proxy_cache_valid 200 10m;"),
        1,
    );
    let mut c = TcpStream::connect(s.addr()).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    c.write_all(b"GET /cut HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 65536];
    while got.len() < 50_000 {
        match c.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(k) => got.extend_from_slice(&buf[..k]),
        }
    }
    gate.open();
    let _ = c.read_to_end(&mut got);
    assert!(got.len() < 100_000, "the response was cut");
    wait_for(Duration::from_secs(5), "the temporary entry to go", || {
        files_under(&s.dir.join("cache"), "")
            .is_empty()
            .then_some(())
    });
}

#[test]
fn the_configuration_is_checked_as_nginx_does() {
    let dir = temp_dir("cache-conf");
    let cases = [
        (
            "proxy_cache_path {d}/c keys_zone=a:1m; server { listen 127.0.0.1:1; location / { proxy_pass http://127.0.0.1:2; proxy_cache b; } }",
            "\"proxy_cache\" zone \"b\" is unknown",
        ),
        (
            "proxy_cache_path {d}/c levels=3 keys_zone=a:1m;",
            "invalid \"levels\" \"3\"",
        ),
        (
            "proxy_cache_path {d}/c levels=1:2;",
            "\"proxy_cache_path\" must have \"keys_zone\" parameter",
        ),
        (
            "proxy_cache_path {d}/c keys_zone=a:1m; proxy_cache_path {d}/d keys_zone=a:1m;",
            "duplicate zone \"a\"",
        ),
        (
            "proxy_cache_path {d}/c keys_zone=a:1m; server { listen 127.0.0.1:1; location / { fastcgi_pass 127.0.0.1:2; fastcgi_cache a; } }",
            "no \"fastcgi_cache_key\" for \"fastcgi_cache\"",
        ),
        ("proxy_cache_valid 200 abc;", "invalid value \"abc\""),
        ("proxy_cache_use_stale sometimes;", "invalid value \"sometimes\""),
    ];
    for (http, want) in cases {
        let d = dir.display().to_string();
        let text = format!("events {{}}\nhttp {{\n{}\n}}\n", http.replace("{d}", &d));
        let path = dir.join("conf/t.conf");
        std::fs::write(&path, text).unwrap();
        let (code, out) = run_cli(&["-t", "-c", path.to_str().unwrap()]);
        assert_ne!(code, 0, "{http}: {out}");
        assert!(out.contains(want), "{http}: wanted {want:?} in {out}");
        assert!(out.contains("t.conf:"), "names the file and line: {out}");
    }
}

/// The pid of the master's cache manager process, if one runs.
fn cache_manager(master: i32) -> Option<i32> {
    for e in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let ppid = stat
            .rsplit(')')
            .next()
            .and_then(|r| r.split_whitespace().nth(1))
            .and_then(|p| p.parse::<i32>().ok());
        let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if ppid == Some(master) && cmd.starts_with(b"shard: cache manager process") {
            return Some(pid);
        }
    }
    None
}

fn bytes_under(dir: &Path) -> u64 {
    files_under(dir, "")
        .iter()
        .filter_map(|p| std::fs::metadata(p).ok())
        .map(|m| m.len())
        .sum()
}

#[test]
fn the_manager_keeps_the_cache_within_its_bounds_and_is_respawned() {
    let up = Upstream::start(|_| Reply::Large(1000));
    let s = Server::start(
        "cache-manager",
        &format!(
            "worker_processes 1;\n\
             error_log logs/error.log info;\n\
             events {{}}\n\
             http {{\n\
             proxy_cache_path {{dir}}/big levels=1:2 keys_zone=big:1m max_size=3500;\n\
             proxy_cache_path {{dir}}/old keys_zone=old:1m inactive=1s;\n\
             server {{\n\
             listen 127.0.0.1:{{port}};\n\
             location = /status {{ shard_status; }}\n\
             location /big/ {{ proxy_pass http://127.0.0.1:{p}; proxy_cache big; proxy_cache_valid 200 1h; }}\n\
             location /old/ {{ proxy_pass http://127.0.0.1:{p}; proxy_cache old; proxy_cache_valid 200 1h; }}\n\
             }}\n\
             }}\n",
            p = up.port
        ),
        1,
    );
    let a = s.addr();
    let manager = wait_for(Duration::from_secs(5), "the cache manager", || {
        cache_manager(s.pid())
    });
    for i in 0..6 {
        assert_eq!(get(a, &format!("/big/{i}")).body.len(), 1000);
    }
    get(a, "/old/x");
    assert_eq!(files_under(&s.dir.join("old"), "").len(), 1);
    // Six entries of about 1.1 KB each, at most 3500 bytes: the least recently used go.
    wait_for(Duration::from_secs(10), "the cache under max_size", || {
        (bytes_under(&s.dir.join("big")) <= 3500).then_some(())
    });
    let left = files_under(&s.dir.join("big"), "").len();
    assert!((2..=3).contains(&left), "{left} entries left");
    // The newest stays and is still served from the cache.
    let before = up.requests();
    get(a, "/big/5");
    assert_eq!(up.requests(), before, "/big/5 was kept");
    // Unused for `inactive`: removed.
    wait_for(Duration::from_secs(10), "the inactive entry to go", || {
        files_under(&s.dir.join("old"), "").is_empty().then_some(())
    });
    // A manager killed is started again.
    unsafe { libc::kill(manager, libc::SIGKILL) };
    let again = wait_for(Duration::from_secs(5), "a new cache manager", || {
        cache_manager(s.pid()).filter(|&p| p != manager)
    });
    assert!(pid_alive(again));
    assert!(error_log(&s).contains("respawning"), "{}", error_log(&s));
}

#[test]
fn a_cached_response_answers_preconditions_and_header_rules_hold() {
    let fail = Arc::new(AtomicUsize::new(0));
    let f = fail.clone();
    let up = Upstream::start(move |r| {
        let h = |list: &[(&str, &str)]| -> Vec<(String, String)> {
            list.iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect()
        };
        match r.target.as_str() {
            "/past" => Reply::Fixed {
                status: 200,
                headers: h(&[("X-Accel-Expires", "@1")]),
                body: b"past".to_vec(),
            },
            "/sie" if f.load(Ordering::SeqCst) == 1 => Reply::CloseNow,
            "/sie" if f.load(Ordering::SeqCst) == 2 => Reply::text(500, "broken"),
            "/sie" => Reply::Fixed {
                status: 200,
                headers: h(&[("Cache-Control", "max-age=1, stale-if-error=60")]),
                body: b"kept".to_vec(),
            },
            _ => Reply::Fixed {
                status: 200,
                headers: h(&[
                    ("Last-Modified", "Mon, 02 Jan 2006 15:04:05 GMT"),
                    ("ETag", "\"v1\""),
                ]),
                body: b"validated".to_vec(),
            },
        }
    });
    let s = Server::start(
        "cache-cond",
        &conf("{dir}/cache", up.port, "", "proxy_cache_valid 200 10m;"),
        1,
    );
    let a = s.addr();
    assert_eq!(get(a, "/c").body_str(), "validated");
    let r = req(
        a,
        "GET /c HTTP/1.1\r\nIf-Modified-Since: Mon, 02 Jan 2006 15:04:05 GMT",
    );
    assert_eq!((r.status, cache_status(&r)), (304, "HIT"), "{r:?}");
    assert!(r.body.is_empty());
    let r = req(a, "GET /c HTTP/1.1\r\nIf-None-Match: \"v1\"");
    assert_eq!(r.status, 304, "{r:?}");
    let r = req(
        a,
        "GET /c HTTP/1.1\r\nIf-Unmodified-Since: Fri, 05 Jul 1985 14:30:52 GMT",
    );
    assert_eq!(r.status, 412, "{r:?}");
    let r = req(a, "GET /c HTTP/1.1\r\nIf-None-Match: \"v2\"");
    assert_eq!((r.status, r.body_str().as_str()), (200, "validated"));
    // `X-Accel-Expires: @1` is stored already expired: the next request finds it so.
    assert_eq!(get(a, "/past").body_str(), "past");
    assert_eq!(cache_status(&get(a, "/past")), "EXPIRED");
    // `stale-if-error` answers an error with the entry, without `proxy_cache_use_stale`;
    // not an answer with a 5xx status (nginx 1.19.3+).
    assert_eq!(get(a, "/sie").body_str(), "kept");
    fail.store(1, Ordering::SeqCst);
    let r = wait_for(Duration::from_secs(5), "the entry to expire", || {
        let r = get(a, "/sie");
        (cache_status(&r) != "HIT").then_some(r)
    });
    assert_eq!(
        (r.status, cache_status(&r), r.body_str().as_str()),
        (200, "STALE", "kept")
    );
    fail.store(2, Ordering::SeqCst);
    let r = get(a, "/sie");
    assert_eq!((r.status, r.body_str().as_str()), (500, "broken"));
}

/// An upstream that answers `/k/N` with `pattern(LEN, N)`, writing the first half at once and
/// the rest when `gate` opens; it counts the requests it began.
fn gated_upstream(len: usize, gate: Gate) -> (u16, Arc<AtomicUsize>) {
    use support::upstream::pattern;
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let begun = Arc::new(AtomicUsize::new(0));
    let b = begun.clone();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { continue };
            let (b, gate) = (b.clone(), gate.clone());
            std::thread::spawn(move || {
                s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
                let mut buf = Vec::new();
                let mut tmp = [0u8; 4096];
                loop {
                    while let Some(end) = find(&buf, b"\r\n\r\n") {
                        let head = String::from_utf8_lossy(&buf[..end]).into_owned();
                        buf.drain(..end + 4);
                        let n: u64 = head
                            .split_whitespace()
                            .nth(1)
                            .and_then(|t| t.strip_prefix("/k/"))
                            .and_then(|n| n.parse().ok())
                            .unwrap_or(0);
                        let body = pattern(len, n);
                        let h = format!("HTTP/1.1 200 OK\r\nContent-Length: {len}\r\n\r\n");
                        if s.write_all(h.as_bytes()).is_err()
                            || s.write_all(&body[..len / 2]).is_err()
                        {
                            return;
                        }
                        b.fetch_add(1, Ordering::SeqCst);
                        gate.wait(Duration::from_secs(20));
                        if s.write_all(&body[len / 2..]).is_err() {
                            return;
                        }
                    }
                    match s.read(&mut tmp) {
                        Ok(0) | Err(_) => return,
                        Ok(k) => buf.extend_from_slice(&tmp[..k]),
                    }
                }
            });
        }
    });
    (port, begun)
}

#[test]
fn a_worker_killed_mid_write_leaves_no_entry_that_is_served() {
    use support::upstream::{checksum, pattern};
    const LEN: usize = 300_000;
    const KEYS: u64 = 6;
    let gate = Gate::new();
    let (port, begun) = gated_upstream(LEN, gate.clone());
    let mut s = Server::start(
        "cache-kill",
        &conf("{dir}/cache", port, "", "proxy_cache_valid 200 10m;"),
        1,
    );
    let a = s.addr();
    let victim = s.wait_workers(1)[0].pid as i32;
    // Six responses half written to their entries, then the worker dies.
    let clients: Vec<_> = (0..KEYS)
        .map(|i| {
            std::thread::spawn(move || {
                let mut c = connect(a);
                let _ = write!(
                    c,
                    "GET /k/{i} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
                );
                let mut sink = Vec::new();
                let _ = c.read_to_end(&mut sink);
            })
        })
        .collect();
    wait_for(Duration::from_secs(10), "six responses under way", || {
        (begun.load(Ordering::SeqCst) == KEYS as usize).then_some(())
    });
    wait_for(Duration::from_secs(10), "their entries begun", || {
        (files_under(&s.dir.join("cache"), ".shard-tmp-").len() == KEYS as usize).then_some(())
    });
    unsafe { libc::kill(victim, libc::SIGKILL) };
    gate.open();
    for c in clients {
        c.join().unwrap();
    }
    wait_for(Duration::from_secs(10), "a new worker", || {
        s.workers()
            .first()
            .filter(|w| w.pid as i32 != victim && pid_alive(w.pid as i32))
            .map(|_| ())
    });
    // Every key: a whole body, first from the upstream (nothing half-stored was served),
    // then from the entry.
    for i in 0..KEYS {
        let want = checksum(&pattern(LEN, i));
        let r = get(a, &format!("/k/{i}"));
        assert_eq!((r.status, cache_status(&r)), (200, "MISS"), "key {i}");
        assert_eq!(checksum(&r.body), want, "key {i}");
        let r = get(a, &format!("/k/{i}"));
        assert_eq!(
            (cache_status(&r), checksum(&r.body)),
            ("HIT", want),
            "key {i}"
        );
    }
    // The dead writer's temporary files go with the manager's next pass.
    wait_for(
        Duration::from_secs(10),
        "the leaked temporary files to go",
        || {
            files_under(&s.dir.join("cache"), ".shard-tmp-")
                .is_empty()
                .then_some(())
        },
    );
    assert_eq!(files_under(&s.dir.join("cache"), "").len(), KEYS as usize);
}

#[test]
fn background_update_answers_at_once_and_refreshes_the_entry() {
    const SLOW: Duration = Duration::from_millis(1500);
    let n = Arc::new(AtomicUsize::new(0));
    let m = n.clone();
    let up = Upstream::start(move |_| {
        let i = m.fetch_add(1, Ordering::SeqCst) + 1;
        let r = Reply::text(200, &format!("v{i}"));
        // Every answer after the first is slow: a client that waited for it would see.
        if i == 1 {
            r
        } else {
            Reply::Delayed(SLOW, Box::new(r))
        }
    });
    let s = Server::start(
        "cache-background",
        &conf(
            "{dir}/cache",
            up.port,
            "",
            "proxy_cache_valid 200 1s; proxy_cache_use_stale updating;\n\
             proxy_cache_background_update on;",
        ),
        1,
    );
    let a = s.addr();
    assert_eq!(get(a, "/b").body_str(), "v1");
    // Once expired: the stale entry at once, while the update asks the slow upstream.
    let (r, took) = wait_for(Duration::from_secs(5), "the entry to expire", || {
        let t = std::time::Instant::now();
        let mut c = connect(a);
        write!(c, "GET /b HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let r = read_response(&mut c, false).unwrap();
        (cache_status(&r) != "HIT").then(|| (r, t.elapsed()))
    });
    assert_eq!(
        (r.status, cache_status(&r), r.body_str().as_str()),
        (200, "STALE", "v1"),
        "{r:?}"
    );
    assert!(took < SLOW, "the client waited {took:?} for the upstream");
    // The update lands: the next requests get its answer from the entry.
    let r = wait_for(Duration::from_secs(10), "the updated entry", || {
        let r = get(a, "/b");
        (r.body_str() == "v2").then_some(r)
    });
    assert_eq!(cache_status(&r), "HIT");
    assert_eq!(n.load(Ordering::SeqCst), 2, "one update");
}

#[test]
fn an_intercepted_error_is_stored_as_nginx_stores_it() {
    let fail = Arc::new(AtomicUsize::new(1));
    let f = fail.clone();
    let up = Upstream::start(move |r| {
        if f.load(Ordering::SeqCst) == 0 {
            return Reply::text(200, "fine");
        }
        let cc = if r.target == "/nocache" {
            "no-cache"
        } else {
            "max-age=60"
        };
        Reply::Fixed {
            status: 404,
            headers: vec![("Cache-Control".into(), cc.into())],
            body: b"nope".to_vec(),
        }
    });
    let s = Server::start(
        "cache-intercept",
        &conf(
            "{dir}/cache",
            up.port,
            "",
            "proxy_intercept_errors on; error_page 404 = @fallback;\n\
             }\n\
             location @fallback { return 403;",
        ),
        1,
    );
    let a = s.addr();
    assert_eq!(get(a, "/e").status, 403);
    assert_eq!(get(a, "/nocache").status, 403);
    fail.store(0, Ordering::SeqCst);
    let before = up.requests();
    // The error was stored (max-age): its page again, without asking the upstream.
    assert_eq!(get(a, "/e").status, 403);
    assert_eq!(up.requests(), before);
    // `no-cache`: nothing was stored, and the upstream's new answer comes through.
    let r = get(a, "/nocache");
    assert_eq!((r.status, r.body_str().as_str()), (200, "fine"));
}

#[test]
fn a_full_disk_makes_the_cache_a_pass_through_and_says_why() {
    use support::upstream::{checksum, pattern};
    let dir = temp_dir("cache-full");
    let small = dir.join("small");
    std::fs::create_dir_all(&small).unwrap();
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=256k", "tmpfs"])
        .arg(&small)
        .status()
        .is_ok_and(|s| s.success());
    if !mounted {
        skipped(
            "a_full_disk_makes_the_cache_a_pass_through_and_says_why",
            "cannot mount a small tmpfs (needs root and mount(8))",
        );
        return;
    }
    struct Unmount(std::path::PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount").arg(&self.0).status();
        }
    }
    let _unmount = Unmount(small.clone());
    let up = Upstream::start(|r| {
        let big = r.target.starts_with("/big");
        Reply::Fixed {
            status: 200,
            headers: vec![],
            body: pattern(if big { 600_000 } else { 1000 }, 7),
        }
    });
    let cache = small.join("c").display().to_string();
    let s = Server::start(
        "cache-full-disk",
        &conf(&cache, up.port, "", "proxy_cache_valid 200 10m;"),
        1,
    );
    let a = s.addr();
    // Larger than the file system: answered whole every time, never stored.
    for _ in 0..2 {
        let r = get(a, "/big");
        assert_eq!((r.status, cache_status(&r)), (200, "MISS"));
        assert_eq!(checksum(&r.body), checksum(&pattern(600_000, 7)));
    }
    assert!(
        error_log(&s).contains("No space left on device"),
        "{}",
        error_log(&s)
    );
    // What fits is still cached, and nothing half-written is left behind.
    get(a, "/small");
    assert_eq!(cache_status(&get(a, "/small")), "HIT");
    assert!(files_under(Path::new(&cache), ".shard-tmp-").is_empty());
    drop(s);
}

#[test]
fn ranges_the_cache_will_not_store_reach_the_upstream_as_asked() {
    let up = Upstream::start(|r| Reply::Fixed {
        status: 200,
        headers: vec![(
            "X-Range".into(),
            r.header("range").unwrap_or("none").to_string(),
        )],
        body: b"SEE-THIS".to_vec(),
    });
    let s = Server::start(
        "cache-range-offset",
        &conf(
            "{dir}/cache",
            up.port,
            "",
            "proxy_cache_valid 200 1m; proxy_cache_max_range_offset 2;\n\
             location /min/ { proxy_pass http://127.0.0.1:PORT; proxy_cache one;\n\
             proxy_cache_valid 200 1m; proxy_cache_min_uses 2; }"
                .replace("PORT", &up.port.to_string())
                .as_str(),
        ),
        1,
    );
    let a = s.addr();
    let x = |path: &str, range: &str| {
        let r = req(a, &format!("GET {path} HTTP/1.1\r\nRange: {range}"));
        r.header("x-range").unwrap_or("").to_string()
    };
    // Within the offset: the whole answer is asked for (and cut here).
    assert_eq!(x("/t?1", "bytes=1-"), "none");
    // Beyond it, a suffix range, or below min_uses: the client's Range goes upstream.
    assert_eq!(x("/t?2", "bytes=3-"), "bytes=3-");
    assert_eq!(x("/t?3", "bytes=-1"), "bytes=-1");
    assert_eq!(x("/min/t?4", "bytes=1-"), "bytes=1-");
    // The one within the offset was stored whole.
    let r = get(a, "/t?1");
    assert_eq!(
        (cache_status(&r), r.body_str().as_str()),
        ("HIT", "SEE-THIS")
    );
}

#[test]
fn convert_head_off_stores_the_heads_answer_as_nginx_does() {
    let up = Upstream::start(|r| Reply::Fixed {
        status: 200,
        headers: vec![("X-Method".into(), r.method.clone())],
        body: b"SEE-THIS".to_vec(),
    });
    let s = Server::start(
        "cache-convert-head",
        &conf(
            "{dir}/cache",
            up.port,
            "",
            "proxy_cache_valid 200 1m; proxy_cache_convert_head off;",
        ),
        1,
    );
    let a = s.addr();
    let r = req(a, "HEAD /h HTTP/1.1");
    assert_eq!(
        (r.header("x-method"), cache_status(&r)),
        (Some("HEAD"), "MISS")
    );
    let r = req(a, "HEAD /h HTTP/1.1");
    assert_eq!(cache_status(&r), "HIT");
    // The key has no method: a GET gets the stored HEAD answer, without a body.
    let r = get(a, "/h");
    assert_eq!((cache_status(&r), r.body.len()), ("HIT", 0), "{r:?}");
}

/// `proxy_cache_background_update` with `proxy_cache_revalidate`: the update after a stale
/// answer asks with the entry's validators, and a `304` without freshness of its own keeps
/// the entry fresh for the stored answer's `max-age` again (nginx re-reads the stored head),
/// so the next request is a HIT.
#[test]
fn a_background_update_revalidates_and_a_bare_304_refreshes_the_entry() {
    let asked = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let log = asked.clone();
    let up = Upstream::start(move |r| {
        let inm = r.header("if-none-match").unwrap_or("-").to_string();
        log.lock().unwrap().push(inm.clone());
        if inm == "\"v1\"" {
            return Reply::Fixed {
                status: 304,
                headers: vec![("ETag".into(), "\"v1\"".into())],
                body: Vec::new(),
            };
        }
        Reply::Fixed {
            status: 200,
            headers: vec![
                ("ETag".into(), "\"v1\"".into()),
                (
                    "Cache-Control".into(),
                    "max-age=1, stale-while-revalidate=30".into(),
                ),
            ],
            body: b"body".to_vec(),
        }
    });
    let s = Server::start(
        "cache-bg-reval",
        &conf(
            "{dir}/cache",
            up.port,
            "",
            "proxy_cache_revalidate on; proxy_cache_background_update on;",
        ),
        1,
    );
    let a = s.addr();
    assert_eq!(cache_status(&get(a, "/r")), "MISS");
    let r = wait_for(Duration::from_secs(5), "the entry to expire", || {
        let r = get(a, "/r");
        (cache_status(&r) != "HIT").then_some(r)
    });
    assert_eq!((cache_status(&r), r.body_str().as_str()), ("STALE", "body"));
    let r = wait_for(Duration::from_secs(5), "the update", || {
        let r = get(a, "/r");
        (cache_status(&r) == "HIT").then_some(r)
    });
    assert_eq!(r.body_str(), "body");
    let asked = asked.lock().unwrap().clone();
    assert_eq!(
        asked,
        ["-", "\"v1\""],
        "one plain request, one revalidation"
    );
}

/// A worker keeps the entries it served open (`CacheMemo`). An entry stored again while
/// fresh (here by `proxy_cache_bypass` requests, whose answers replace it), by whichever
/// worker, is served new by every worker from then on, never from an old kept copy.
#[test]
fn an_entry_stored_again_is_served_new_by_every_worker() {
    let (up, n) = numbered(vec![]);
    let conf = conf(
        "{dir}/cache",
        up.port,
        "",
        "proxy_cache_valid 200 10m; proxy_cache_bypass $http_x_refresh;",
    )
    .replace("worker_processes 1;", "worker_processes 2;")
    .replace(
        "listen 127.0.0.1:{port};",
        "listen 127.0.0.1:{port} reuseport;",
    );
    let s = Server::start("cache-memo", &conf, 2);
    let a = s.addr();
    assert_eq!(get(a, "/m").body_str(), "1:/m");
    // Fresh connections spread over both workers' sockets: each keeps the entry.
    for _ in 0..20 {
        let r = get(a, "/m");
        assert_eq!((cache_status(&r), r.body_str().as_str()), ("HIT", "1:/m"));
    }
    for round in 2..5 {
        let r = req(a, "GET /m HTTP/1.1\r\nX-Refresh: 1");
        let new = format!("{round}:/m");
        assert_eq!((cache_status(&r), r.body_str()), ("BYPASS", new.clone()));
        // The entry goes in place once the answer is complete; then every worker has it.
        wait_for(Duration::from_secs(5), "the new entry", || {
            (get(a, "/m").body_str() == new).then_some(())
        });
        for _ in 0..20 {
            let r = get(a, "/m");
            assert_eq!((cache_status(&r), r.body_str()), ("HIT", new.clone()));
        }
    }
    assert_eq!(n.load(Ordering::SeqCst), 4);
}

/// An entry file an operator removes by hand (as nginx caches are purged with `rm`) stops
/// being served within a second, however hot: a worker's kept copy is opened again.
#[test]
fn an_entry_removed_by_hand_stops_being_served() {
    let (up, n) = numbered(vec![]);
    let s = Server::start(
        "cache-rm",
        &conf("{dir}/cache", up.port, "", "proxy_cache_valid 200 10m;"),
        1,
    );
    let a = s.addr();
    assert_eq!(get(a, "/r").body_str(), "1:/r");
    assert_eq!(cache_status(&get(a, "/r")), "HIT");
    let files = files_under(&s.dir.join("cache"), "");
    assert_eq!(files.len(), 1, "{files:?}");
    std::fs::remove_file(&files[0]).unwrap();
    // Kept hot: asked without a pause until the file's removal is seen.
    wait_for(Duration::from_secs(5), "the removal seen", || {
        (get(a, "/r").body_str() == "2:/r").then_some(())
    });
    assert_eq!(n.load(Ordering::SeqCst), 2);
    assert_eq!(cache_status(&get(a, "/r")), "HIT");
}
