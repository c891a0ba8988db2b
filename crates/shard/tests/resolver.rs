//! Run-time DNS (`resolver`, `proxy_pass` with variables) against a DNS server of the test's
//! own on loopback (never the system's resolver): names that change address are followed
//! without a reload, truncated answers are asked again over TCP, and a silent or failing
//! resolver gives nginx's 502 and log line.

mod support;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, UdpSocket};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use shard_server::dns;
use support::*;

/// Per name and question type: an alias alone (`Ok`) or an error code (`Err`).
type Typed = HashMap<(String, u16), Result<String, u8>>;

/// A DNS server on 127.0.0.1 (UDP and TCP on one port): names to addresses, changeable;
/// names in `truncate` are answered over UDP with TC set only; `silent` names get no answer;
/// unknown names get NXDOMAIN.
#[derive(Clone, Default)]
struct Zone {
    names: Arc<Mutex<HashMap<String, Vec<IpAddr>>>>,
    /// Names answered with a CNAME alone.
    cnames: Arc<Mutex<HashMap<String, String>>>,
    truncate: Arc<Mutex<Vec<String>>>,
    silent: Arc<Mutex<Vec<String>>>,
    /// Per name and question type: an alias alone (`Ok`) or an error code (`Err`).
    typed: Arc<Mutex<Typed>>,
    /// Names whose next N questions get SERVFAIL.
    fail_next: Arc<Mutex<HashMap<String, usize>>>,
    udp_queries: Arc<AtomicUsize>,
    tcp_queries: Arc<AtomicUsize>,
}

fn question_name(q: &[u8]) -> String {
    let mut name = String::new();
    let mut i = 12;
    while let Some(&len) = q.get(i) {
        if len == 0 {
            break;
        }
        if !name.is_empty() {
            name.push('.');
        }
        let end = (i + 1 + len as usize).min(q.len());
        name.push_str(&String::from_utf8_lossy(&q[i + 1..end]).to_lowercase());
        i += 1 + len as usize;
    }
    name
}

impl Zone {
    fn set(&self, name: &str, addrs: &[&str]) {
        self.names.lock().unwrap().insert(
            name.to_string(),
            addrs.iter().map(|a| a.parse().unwrap()).collect(),
        );
    }

    fn answer(&self, q: &[u8], tcp: bool) -> Option<Vec<u8>> {
        let name = question_name(q);
        if self.silent.lock().unwrap().contains(&name) {
            return None;
        }
        if let Some(target) = self.cnames.lock().unwrap().get(&name) {
            return Some(dns::answer_cname(q, target, 60));
        }
        let mut pos = 12;
        while pos < q.len() && q[pos] != 0 {
            pos += 1 + q[pos] as usize;
        }
        let qtype = q
            .get(pos + 1..pos + 3)
            .map_or(1, |b| u16::from_be_bytes([b[0], b[1]]));
        match self.typed.lock().unwrap().get(&(name.clone(), qtype)) {
            Some(Ok(target)) => return Some(dns::answer_cname(q, target, 60)),
            Some(Err(rcode)) => return Some(dns::answer_for(q, &[], 0, *rcode, false)),
            None => {}
        }
        if let Some(n) = self
            .fail_next
            .lock()
            .unwrap()
            .get_mut(&name)
            .filter(|n| **n > 0)
        {
            *n -= 1;
            return Some(dns::answer_for(q, &[], 0, 2, false));
        }
        let tc = !tcp && self.truncate.lock().unwrap().contains(&name);
        Some(match self.names.lock().unwrap().get(&name) {
            Some(a) if tc => dns::answer_for(q, &a[..0], 1, 0, true),
            Some(a) => dns::answer_for(q, a, 1, 0, false),
            None => dns::answer_for(q, &[], 0, 3, false),
        })
    }

    fn start(&self) -> u16 {
        let (udp, tcp) = loop {
            let u = UdpSocket::bind("127.0.0.1:0").unwrap();
            let port = u.local_addr().unwrap().port();
            if let Ok(t) = TcpListener::bind(("127.0.0.1", port)) {
                break (u, t);
            }
        };
        let port = udp.local_addr().unwrap().port();
        let z = self.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 512];
            loop {
                let Ok((n, from)) = udp.recv_from(&mut buf) else {
                    return;
                };
                z.udp_queries.fetch_add(1, Ordering::SeqCst);
                if let Some(a) = z.answer(&buf[..n], false) {
                    let _ = udp.send_to(&a, from);
                }
            }
        });
        let z = self.clone();
        std::thread::spawn(move || {
            for c in tcp.incoming() {
                let Ok(mut c) = c else { return };
                z.tcp_queries.fetch_add(1, Ordering::SeqCst);
                let mut len = [0u8; 2];
                if c.read_exact(&mut len).is_err() {
                    continue;
                }
                let mut q = vec![0u8; u16::from_be_bytes(len) as usize];
                if c.read_exact(&mut q).is_err() {
                    continue;
                }
                if let Some(a) = z.answer(&q, true) {
                    let mut out = (a.len() as u16).to_be_bytes().to_vec();
                    out.extend_from_slice(&a);
                    let _ = c.write_all(&out);
                }
            }
        });
        port
    }
}

/// An HTTP server answering `body` on `ip:port` (port 0: any).
fn http_on(ip: &str, port: u16, body: &'static str) -> Option<u16> {
    let l = TcpListener::bind((ip, port)).ok()?;
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for c in l.incoming() {
            let Ok(mut c) = c else { return };
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                let mut got = Vec::new();
                while find(&got, b"\r\n\r\n").is_none() {
                    match c.read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                    }
                }
                let line = String::from_utf8_lossy(&got)
                    .lines()
                    .next()
                    .unwrap_or("")
                    .to_string();
                let text = format!("{body} {line}");
                let _ = write!(
                    c,
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{text}",
                    text.len()
                );
            });
        }
    });
    Some(port)
}

/// Two HTTP servers on one port, at 127.0.0.1 ("one") and 127.0.0.2 ("two").
fn two_servers() -> u16 {
    loop {
        let Some(port) = http_on("127.0.0.2", 0, "two") else {
            continue;
        };
        if http_on("127.0.0.1", port, "one").is_some() {
            return port;
        }
    }
}

fn body_of(s: &Server, path: &str) -> (u16, String) {
    let (st, _, b) = exchange(s.addr(), &format!("GET {path} HTTP/1.1\r\nHost: x"));
    (st, String::from_utf8_lossy(&b).into_owned())
}

#[test]
fn a_name_that_changes_address_is_followed_without_a_reload() {
    let zone = Zone::default();
    zone.set("app.test", &["127.0.0.1"]);
    let dns_port = zone.start();
    let up = two_servers();
    let conf = format!(
        "worker_processes 1;\nevents {{}}\nhttp {{\n upstream named {{ server 127.0.0.2:{up}; }}\n \
         server {{\n  listen 127.0.0.1:{{port}};\n  resolver 127.0.0.1:{dns_port} ipv6=off;\n  \
         resolver_timeout 2s;\n  location = /status {{ shard_status; }}\n  \
         location /app {{ set $backend app.test; proxy_pass http://$backend:{up}; }}\n  \
         location /named {{ set $u named; proxy_pass http://$u; }}\n  \
         location /alias {{ set $backend www.test; proxy_pass http://$backend:{up}; }}\n  \
         location /asis {{ proxy_pass http://127.0.0.2:{up}/fixed$is_args$args; }}\n }}\n}}\n"
    );
    let s = Server::start("dns-follow", &conf, 1);
    let (st, b) = body_of(&s, "/app/x");
    assert_eq!(
        (st, b.as_str()),
        (200, "one GET /app/x HTTP/1.0"),
        "{}",
        s.stderr()
    );
    // Cached for the TTL (1 s): one query so far (A only, ipv6=off).
    let _ = body_of(&s, "/app/y");
    assert_eq!(zone.udp_queries.load(Ordering::SeqCst), 1);
    // A name answered with a CNAME alone: its target is asked (nginx's resolver), and the
    // name's answer is cached (for the target's 1 s TTL).
    zone.cnames
        .lock()
        .unwrap()
        .insert("www.test".into(), "app.test".into());
    let (st, b) = body_of(&s, "/alias/x");
    assert_eq!((st, b.as_str()), (200, "one GET /alias/x HTTP/1.0"));
    let before = zone.udp_queries.load(Ordering::SeqCst);
    let _ = body_of(&s, "/alias/y");
    assert_eq!(zone.udp_queries.load(Ordering::SeqCst), before);
    // The name moves; after its TTL the next request follows it, with no reload.
    zone.set("app.test", &["127.0.0.2"]);
    let b = wait_for(Duration::from_secs(5), "the new address", || {
        let (_, b) = body_of(&s, "/app/z");
        b.starts_with("two").then_some(b)
    });
    assert_eq!(b, "two GET /app/z HTTP/1.0");
    // A variable naming an upstream block; an address with a URI sent as it is.
    assert_eq!(body_of(&s, "/named/q").1, "two GET /named/q HTTP/1.0");
    assert_eq!(body_of(&s, "/asis/q?a=1").1, "two GET /fixed?a=1 HTTP/1.0");
}

#[test]
fn failures_are_502_with_nginx_log_lines_and_tc_falls_back_to_tcp() {
    let zone = Zone::default();
    zone.set("big.test", &["127.0.0.1"]);
    zone.truncate.lock().unwrap().push("big.test".into());
    zone.silent.lock().unwrap().push("silent.test".into());
    let dns_port = zone.start();
    let up = http_on("127.0.0.1", 0, "up").unwrap();
    let conf = format!(
        "worker_processes 1;\nevents {{}}\nhttp {{\n server {{\n  listen 127.0.0.1:{{port}};\n  \
         resolver 127.0.0.1:{dns_port} valid=30s ipv6=off;\n  resolver_timeout 1s;\n  \
         location = /status {{ shard_status; }}\n  \
         location / {{ proxy_pass http://$arg_h:{up}; }}\n  \
         location /nores {{ resolver off_by_default_is_not_a_thing; }}\n }}\n \
         server {{\n  listen 127.0.0.1:{{port1}};\n  location / {{ proxy_pass http://$arg_h:{up}; }}\n }}\n}}\n"
    )
    .replace(
        "  location /nores { resolver off_by_default_is_not_a_thing; }\n",
        "",
    );
    let s = Server::start_ports("dns-fail", &conf, 1, 1);
    // Truncated over UDP: asked again over TCP.
    let (st, b) = body_of(&s, "/?h=big.test");
    assert_eq!((st, b.as_str()), (200, "up GET /?h=big.test HTTP/1.0"));
    assert_eq!(zone.tcp_queries.load(Ordering::SeqCst), 1);
    // NXDOMAIN.
    assert_eq!(body_of(&s, "/?h=nowhere.test").0, 502);
    // No answer at all: resolver_timeout (1 s), then 502.
    let t = std::time::Instant::now();
    assert_eq!(body_of(&s, "/?h=silent.test").0, 502);
    assert!(
        t.elapsed() >= Duration::from_millis(900),
        "{:?}",
        t.elapsed()
    );
    // A server without `resolver`.
    let other = SocketAddr::from(([127, 0, 0, 1], s.ports[0]));
    let (st, _, _) = exchange(other, "GET /?h=big.test HTTP/1.1\r\nHost: x");
    assert_eq!(st, 502);
    let log = wait_for(Duration::from_secs(5), "the log lines", || {
        let l = error_log(&s);
        l.contains("no resolver defined").then_some(l)
    });
    for want in [
        "nowhere.test could not be resolved (3: Host not found)",
        "silent.test could not be resolved (110: Operation timed out)",
        "no resolver defined to resolve big.test",
    ] {
        assert!(log.contains(want), "{want:?} not in\n{log}");
    }
}

#[test]
fn resolver_directives_are_checked() {
    let dir = temp_dir("dns-t");
    let t = |body: &str| -> (i32, String) {
        std::fs::write(
            dir.join("conf/t.conf"),
            format!("events {{}}\nhttp {{\n server {{\n  listen 127.0.0.1:1;\n{body}\n }}\n}}\n"),
        )
        .unwrap();
        run_cli(&[
            "-t",
            "-p",
            dir.to_str().unwrap(),
            "-c",
            dir.join("conf/t.conf").to_str().unwrap(),
        ])
    };
    assert_eq!(
        t("  resolver 127.0.0.1 [::1]:5353 valid=10s ipv6=off;").0,
        0
    );
    let (code, err) = t("  resolver 127.0.0.1 ipv4=off ipv6=off;");
    assert_eq!(code, 1);
    assert!(err.contains("cannot both be \"off\""), "{err}");
    let (code, err) = t("  resolver 127.0.0.1 valid=x;");
    assert_eq!(code, 1);
    assert!(err.contains("invalid parameter \"valid=x\""), "{err}");
    assert_eq!(
        t("  location / { proxy_pass http://$host$request_uri; }").0,
        0
    );
}

/// `server NAME resolve` in an `upstream` (nginx 1.27.3): the workers resolve the name again
/// when its answer expires and follow it without a reload; a name unknown at load waits,
/// down, for its first answer.
#[test]
fn upstream_servers_with_resolve_follow_their_names() {
    let zone = Zone::default();
    zone.set("pool.test", &["127.0.0.1"]);
    let dns_port = zone.start();
    let up = two_servers();
    let conf = format!(
        "worker_processes 1;\nevents {{}}\nhttp {{\n resolver 127.0.0.1:{dns_port} ipv6=off;\n \
         upstream pool {{ zone pool 64k; server pool.test:{up} resolve; }}\n \
         server {{\n  listen 127.0.0.1:{{port}};\n  location = /status {{ shard_status; }}\n  \
         location / {{ proxy_pass http://pool; }}\n }}\n}}\n"
    );
    let s = Server::start("dns-resolve", &conf, 1);
    // pool.test is unknown to the system's resolver: the first answer comes from ours.
    let b = wait_for(Duration::from_secs(5), "the first address", || {
        let (st, b) = body_of(&s, "/a");
        (st == 200).then_some(b)
    });
    assert_eq!(b, "one GET /a HTTP/1.0");
    zone.set("pool.test", &["127.0.0.2"]);
    let b = wait_for(Duration::from_secs(6), "the new address", || {
        let (_, b) = body_of(&s, "/b");
        b.starts_with("two").then_some(b)
    });
    assert_eq!(b, "two GET /b HTTP/1.0");
    // Without a resolver the configuration is refused, as nginx.
    let dir = temp_dir("dns-resolve-t");
    std::fs::write(
        dir.join("conf/t.conf"),
        "events {}\nhttp {\n upstream u { server a.test:80 resolve; }\n server { listen 127.0.0.1:1; location / { proxy_pass http://u; } }\n}\n",
    )
    .unwrap();
    let (code, err) = run_cli(&[
        "-t",
        "-p",
        dir.to_str().unwrap(),
        "-c",
        dir.join("conf/t.conf").to_str().unwrap(),
    ]);
    assert_eq!(code, 1);
    assert!(
        err.contains("no resolver defined to resolve \"a.test:80\""),
        "{err}"
    );
}

/// stream's `resolver`: `proxy_pass $var` naming a host is resolved per session (every
/// address a peer, tried in turn); a name without a port, an unknown name and a silent
/// resolver end the session with nginx's log lines.
#[test]
fn stream_proxy_pass_resolves_names_with_the_resolver() {
    let zone = Zone::default();
    zone.set("a.test", &["127.0.0.2"]);
    // Nothing listens on 127.0.0.3: the next address is tried.
    zone.set("many.test", &["127.0.0.3", "127.0.0.1"]);
    zone.silent.lock().unwrap().push("silent.test".into());
    let dns_port = zone.start();
    let up = two_servers();
    let conf = format!(
        "worker_processes 1;\nerror_log logs/error.log info;\nevents {{}}\n\
         http {{ server {{ listen 127.0.0.1:{{port}}; location = /status {{ shard_status; }} }} }}\n\
         stream {{\n\
          resolver 127.0.0.1:{dns_port} ipv6=off; resolver_timeout 1s;\n\
          map $server_port $t {{ {{port1}} a.test:{up}; {{port2}} a.test; {{port3}} nx.test:{up};\n\
            {{port4}} silent.test:{up}; {{port5}} many.test:{up}; }}\n\
          server {{ listen 127.0.0.1:{{port1}}; listen 127.0.0.1:{{port2}}; listen 127.0.0.1:{{port3}};\n\
            listen 127.0.0.1:{{port4}}; listen 127.0.0.1:{{port5}}; proxy_pass $t; }}\n\
         }}\n"
    );
    let s = Server::start_ports("dns-stream", &conf, 1, 5);
    let ask = |i: usize| {
        let mut c = connect(SocketAddr::from(([127, 0, 0, 1], s.ports[i])));
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        c.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
        let mut got = Vec::new();
        let _ = c.read_to_end(&mut got);
        let text = String::from_utf8_lossy(&got).into_owned();
        text.split("\r\n\r\n").nth(1).unwrap_or("").to_string()
    };
    assert_eq!(ask(0), "two GET / HTTP/1.0");
    assert_eq!(ask(0), "two GET / HTTP/1.0", "from the worker's cache");
    assert_eq!(ask(4), "one GET / HTTP/1.0");
    assert_eq!(ask(1), "");
    assert_eq!(ask(2), "");
    let t = std::time::Instant::now();
    assert_eq!(ask(3), "");
    assert!(
        t.elapsed() >= Duration::from_millis(900),
        "{:?}",
        t.elapsed()
    );
    let log = wait_for(Duration::from_secs(5), "the log lines", || {
        let l = error_log(&s);
        l.contains("silent.test could not be resolved").then_some(l)
    });
    for want in [
        "no port in upstream \"a.test\"",
        "nx.test could not be resolved (3: Host not found)",
        "silent.test could not be resolved (110: Operation timed out)",
    ] {
        assert!(log.contains(want), "{want:?} not in\n{log}");
    }
}

/// nginx's resolver rules: the A and AAAA answers of a name are one result (an error in
/// either fails it; an alias alone is followed when no address came), failures are not
/// kept (the next request asks again), and a server that cannot be reached is asked again,
/// of the next server, after 5 seconds, within `resolver_timeout`.
#[test]
fn a_and_aaaa_answers_combine_failures_are_not_kept_and_queries_are_resent() {
    let zone = Zone::default();
    // A 127.0.0.1, AAAA SERVFAIL: fails.
    zone.set("ne.test", &["127.0.0.1"]);
    zone.typed
        .lock()
        .unwrap()
        .insert(("ne.test".into(), 28), Err(2));
    // A none, AAAA an alias alone: the alias is resolved.
    zone.set("zc.test", &[]);
    zone.typed
        .lock()
        .unwrap()
        .insert(("zc.test".into(), 28), Ok("alias.test".into()));
    zone.set("alias.test", &["127.0.0.1"]);
    // SERVFAIL once, then an answer.
    zone.set("flaky.test", &["127.0.0.1"]);
    zone.fail_next
        .lock()
        .unwrap()
        .insert("flaky.test".into(), 1);
    let dns_port = zone.start();
    // A UDP port nobody listens on (ICMP port unreachable).
    let dead = UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let up = http_on("127.0.0.1", 0, "up").unwrap();
    let conf = format!(
        "worker_processes 1;\nerror_log logs/error.log info;\nevents {{}}\nhttp {{\n\
         server {{ listen 127.0.0.1:{{port}};\n\
           location = /status {{ shard_status; }}\n\
           location / {{ resolver 127.0.0.1:{dns_port}; proxy_pass http://$arg_h:{up}; }}\n\
           location /v4 {{ resolver 127.0.0.1:{dns_port} ipv6=off; proxy_pass http://$arg_h:{up}; }}\n\
           location /ua {{ resolver 127.0.0.1:{dns_port} ipv6=off; proxy_pass http://$arg_h:{up};\n\
             add_header X-Up $upstream_addr always; }}\n\
           location /resend {{ resolver 127.0.0.1:{dead} 127.0.0.1:{dns_port} ipv6=off;\n\
             resolver_timeout 8s; proxy_pass http://$arg_h:{up}; }}\n\
         }} }}\n"
    );
    let s = Server::start_ports("dns-rules", &conf, 1, 0);
    assert_eq!(body_of(&s, "/?h=ne.test").0, 502);
    let (st, b) = body_of(&s, "/?h=zc.test");
    assert_eq!((st, b.as_str()), (200, "up GET /?h=zc.test HTTP/1.0"));
    assert_eq!(body_of(&s, "/v4?h=flaky.test").0, 502);
    assert_eq!(
        body_of(&s, "/v4?h=flaky.test").0,
        200,
        "the failure was kept"
    );
    // A resolved name's peers are each request's own (nginx makes them per request): two
    // that refuse are both tried again by the next request, not "no live upstreams".
    zone.set("refusing.test", &["127.0.0.3", "127.0.0.4"]);
    for _ in 0..2 {
        let (st, hs, _) = exchange(s.addr(), "GET /ua?h=refusing.test HTTP/1.1\r\nHost: x");
        assert_eq!(st, 502);
        let up = hs
            .iter()
            .find(|(k, _)| k == "x-up")
            .map(|(_, v)| v.clone())
            .unwrap_or_default();
        assert_eq!(up.matches(", ").count(), 1, "both peers tried: {up}");
        assert!(!up.contains("refusing"), "{up}");
    }
    // The first server cannot be reached: asked again of the second after 5 s. (The
    // client waits longer than `exchange`'s 5 s: the answer comes just after them.)
    let t = std::time::Instant::now();
    let mut c = connect(s.addr());
    c.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    write!(
        c,
        "GET /resend?h=alias.test HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let r = read_response(&mut c, false).expect("the resent query's answer");
    assert_eq!(r.status, 200, "{r:?}");
    assert!(t.elapsed() >= Duration::from_secs(4), "{:?}", t.elapsed());
}
