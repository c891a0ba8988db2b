//! HTTP/3 over QUIC (`listen ... quic`) as clients see it, with an independent peer: a client
//! on Python's `aioquic` (`h3client.py`). Static files, `return`, the proxy with a large
//! body, 100 streams at once, `Alt-Svc`, the access log's view, a client that changes its
//! port, hostile datagrams, a reload, and the configuration errors nginx gives. Without
//! `aioquic` the tests say SKIPPED (`.ci/run` installs it).

mod support;

use std::net::UdpSocket;
use std::process::Command;
use std::time::Duration;

use support::*;

const CLIENT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/h3client.py");

/// A Python with `aioquic`, or SKIPPED for `what`.
fn python_aioquic(what: &str) -> Option<&'static str> {
    python_with(
        "aioquic",
        what,
        "Python's aioquic is not installed (python3 -m pip install aioquic)",
    )
}

fn h3client(py: &str, port: u16, args: &[&str]) -> String {
    run_client(py, CLIENT, 40, port, args)
}

/// A server with a `quic` address and a TCP one on the same port (`{port1}`), and an
/// upstream (`{port2}`) that says what it got.
fn start(tag: &str, workers: usize, quic_extra: &str) -> Server {
    start_with_cert(tag, workers, quic_extra).0
}

/// `start`, and the base64 SHA-256 of the certificate's public key (what Chromium's
/// `--ignore-certificate-errors-spki-list` takes).
fn start_with_cert(tag: &str, workers: usize, quic_extra: &str) -> (Server, String) {
    let dir = temp_dir(&format!("{tag}-cert")).keep();
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let spki = {
        let suite = rustls::crypto::ring::cipher_suite::TLS13_AES_128_GCM_SHA256;
        let hash = suite
            .tls13()
            .unwrap()
            .common
            .hash_provider
            .hash(&cert.key_pair.public_key_der());
        base64(hash.as_ref())
    };
    let (crt, key) = (dir.join("a.pem"), dir.join("a.key"));
    std::fs::write(&crt, cert.cert.pem()).unwrap();
    std::fs::write(&key, cert.key_pair.serialize_pem()).unwrap();
    let conf = format!(
        "worker_processes {workers};\n\
         error_log logs/error.log info;\n\
         pid logs/shard.pid;\n\
         events {{ worker_connections 512; }}\n\
         http {{\n\
         client_max_body_size 20m;\n\
         log_format h3 '$request|$server_protocol|$http3|$status|$body_bytes_sent|$scheme|$https|$ssl_protocol|$ssl_server_name|$ssl_alpn_protocol';\n\
         server {{\n\
           listen 127.0.0.1:{{port}};\n\
           location = /status {{ shard_status; }}\n\
         }}\n\
         server {{\n\
           listen 127.0.0.1:{{port1}} quic reuseport{quic_extra};\n\
           listen 127.0.0.1:{{port1}} ssl;\n\
           ssl_certificate {crt};\n\
           ssl_certificate_key {key};\n\
           access_log logs/h3.log h3;\n\
           root {{dir}}/html;\n\
           add_header Alt-Svc 'h3=\":{{port1}}\"; ma=86400';\n\
           location = /ok {{ return 200 \"OK\\n\"; }}\n\
           location = /redirect {{ return 301 /ok; }}\n\
           location /up/ {{ proxy_pass http://127.0.0.1:{{port2}}/; }}\n\
         }}\n\
         server {{\n\
           listen 127.0.0.1:{{port2}};\n\
           access_log off;\n\
           location / {{ return 200 \"up $request_method $uri len=$content_length\"; }}\n\
         }}\n\
         }}\n",
        crt = crt.display(),
        key = key.display(),
    );
    let s = Server::start_ports(tag, &conf, workers, 2);
    write_file(&s.dir, "html/a.txt", b"hello file\n");
    let big: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
    write_file(&s.dir, "html/big.bin", &big);
    (s, spki)
}

fn base64(b: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for c in b.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for i in 0..4 {
            if i <= c.len() {
                out.push(A[(n >> (18 - 6 * i)) as usize & 63] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// The access log line of the test servers' QUIC server, where directives are added.
const LOG: &str = "access_log logs/h3.log h3;";
/// A location that sends `/slow.bin` at 200 KB/s, before `/ok`'s.
const SLOW_LOCATION: &str = "location = /slow.bin { limit_rate 200k; }\n location = /ok {";

/// Edits the running configuration (each `from` must be in it) and reloads; returns once
/// generation `generation` serves with `workers` workers.
fn reconfigure(s: &Server, edits: &[(&str, &str)], generation: u64, workers: usize) {
    let path = s.dir.join("conf/shard.conf");
    let mut conf = std::fs::read_to_string(&path).unwrap();
    for (from, to) in edits {
        assert!(conf.contains(from), "{from:?} not in the configuration");
        conf = conf.replace(from, to);
    }
    std::fs::write(&path, conf).unwrap();
    s.signal(libc::SIGHUP);
    wait_generation(s, generation, workers);
}

/// Starts a slow download of `path` (`h3client.py long`) and returns once its response
/// began: the client and its output, which says `STATUS LEN` when it ends.
fn start_download(
    py: &str,
    port: u16,
    path: &str,
) -> (
    std::process::Child,
    std::io::BufReader<std::process::ChildStdout>,
) {
    use std::io::BufRead;
    let mut child = Command::new("timeout")
        .arg("40")
        .arg(py)
        .arg(CLIENT)
        .arg(port.to_string())
        .args(["long", path])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "headers");
    (child, out)
}

fn log_lines(s: &Server, n: usize) -> Vec<String> {
    let path = s.dir.join("logs/h3.log");
    wait_for(Duration::from_secs(10), "access log lines", || {
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        let lines: Vec<String> = text.lines().map(str::to_string).collect();
        (lines.len() >= n).then_some(lines)
    })
}

#[test]
fn static_files_return_and_the_proxy_over_http3() {
    let Some(py) = python_aioquic("static_files_return_and_the_proxy_over_http3") else {
        return;
    };
    let s = start("h3-basic", 2, "");
    let port = s.ports[0];
    let out = h3client(
        py,
        port,
        &["get", "/ok", "/a.txt", "/big.bin", "/up/x?y=1", "/missing"],
    );
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "200 3 OK", "{out}");
    assert_eq!(lines[1], "200 11 hello file", "{out}");
    assert_eq!(lines[2], "200 300000 ", "{out}");
    assert_eq!(lines[3], "200 14 up GET /x len=", "{out}");
    assert!(lines[4].starts_with("404 "), "{out}");
    // The response fields an operator adds (`Alt-Svc`) go out on HTTP/3 too.
    let alt = h3client(py, port, &["head", "alt-svc", "/ok"]);
    assert_eq!(alt.trim(), format!("h3=\":{port}\"; ma=86400"));
    // A redirect names the https scheme (the request came over QUIC's TLS).
    let loc = h3client(py, port, &["head", "location", "/redirect"]);
    assert_eq!(loc.trim(), format!("https://localhost:{port}/ok"));
    let log = log_lines(&s, 7);
    assert_eq!(
        log[0],
        "GET /ok HTTP/3.0|HTTP/3.0|h3|200|3|https|on|TLSv1.3|localhost|h3"
    );
    assert!(log[2].starts_with("GET /big.bin HTTP/3.0|HTTP/3.0|h3|200|300000|"));
    // The same address over TCP still speaks HTTP/1.1 with TLS.
    assert!(!log.iter().any(|l| l.contains("HTTP/1.1")));
}

#[test]
fn many_streams_and_a_large_body_under_flow_control() {
    let Some(py) = python_aioquic("many_streams_and_a_large_body_under_flow_control") else {
        return;
    };
    let s = start("h3-many", 2, "");
    let port = s.ports[0];
    let out = h3client(py, port, &["many", "100", "/ok"]);
    assert_eq!(out.trim(), "ok 100");
    // 5 MB through a 64 KiB stream window, to the upstream and its answer back.
    let out = h3client(py, port, &["post", "/up/echo", "5000000"]);
    assert_eq!(out.trim(), "200 up POST /echo len=5000000");
    // Over the limit: nginx's 413, the connection still usable.
    let out = h3client(py, port, &["post", "/up/echo", "30000000"]);
    assert!(out.starts_with("413 "), "{out}");
    let log = log_lines(&s, 102);
    assert_eq!(
        log.iter()
            .filter(|l| l.starts_with("GET /ok HTTP/3.0"))
            .count(),
        100
    );
}

#[test]
fn a_client_that_changes_its_port_is_still_served() {
    let Some(py) = python_aioquic("a_client_that_changes_its_port_is_still_served") else {
        return;
    };
    // Two workers: the kernel's hash of the new address chooses either socket; the steering
    // plane sends the datagrams by connection ID to the worker holding the connection.
    let s = start("h3-migrate", 2, "");
    if !error_log(&s).contains("are steered by connection ID") {
        skipped(
            "a_client_that_changes_its_port_is_still_served",
            "bpf(2) is refused here (needs CAP_BPF): QUIC keeps the kernel's hash",
        );
        return;
    }
    for _ in 0..6 {
        let out = h3client(py, s.ports[0], &["migrate", "/ok"]);
        assert_eq!(out.trim(), "200 200");
    }
    // No datagram reached a worker that did not hold its connection; each was placed by its
    // connection ID or, for a new connection, by the hash of its addresses.
    assert_eq!(status_field(&s, "quic_strays"), 0);
    assert!(status_field(&s, "quic_datagrams") > 0);
    assert!(status_field(&s, "quic_by_cid") > 0);
    assert!(status_field(&s, "quic_by_hash") >= 6);
}

#[test]
fn a_reload_in_the_middle_of_a_download_loses_nothing() {
    use std::io::BufRead;
    let Some(py) = python_aioquic("a_reload_in_the_middle_of_a_download_loses_nothing") else {
        return;
    };
    let mut s = start("h3-reload-long", 2, "");
    if !error_log(&s).contains("are steered by connection ID") {
        skipped(
            "a_reload_in_the_middle_of_a_download_loses_nothing",
            "bpf(2) is refused here (needs CAP_BPF): QUIC keeps the kernel's hash",
        );
        return;
    }
    s.wait_workers(2);
    reconfigure(&s, &[("location = /ok {", SLOW_LOCATION)], 2, 2);
    let body: Vec<u8> = (0..600_000u32).map(|i| (i % 253) as u8).collect();
    write_file(&s.dir, "html/slow.bin", &body);
    // Three seconds of download; a reload once it began.
    let (mut child, mut out) = start_download(py, s.ports[0], "/slow.bin");
    let mut line = String::new();
    reconfigure(&s, &[("limit_rate 200k;", "limit_rate 201k;")], 3, 2);
    // New connections meanwhile go to the new generation.
    for _ in 0..4 {
        assert_eq!(h3client(py, s.ports[0], &["get", "/ok"]).trim(), "200 3 OK");
    }
    line.clear();
    out.read_line(&mut line).unwrap();
    assert_eq!(
        line.trim(),
        "200 600000",
        "the download survived the reload"
    );
    assert!(child.wait().unwrap().success());
    // The old generation ends once its download did; its sockets go with it.
    wait_for(Duration::from_secs(10), "generation 2 gone", || {
        error_log(&s)
            .contains("(worker 1, generation 2) exited with code 0")
            .then_some(())
    });
}

#[test]
fn hostile_datagrams_leave_the_worker_serving() {
    let Some(py) = python_aioquic("hostile_datagrams_leave_the_worker_serving") else {
        return;
    };
    let mut s = start("h3-hostile", 1, "");
    let pid = s.wait_workers(1)[0].pid;
    let port = s.ports[0];
    let u = UdpSocket::bind("127.0.0.1:0").unwrap();
    let to = ("127.0.0.1", port);
    let mut long = vec![0xc0u8, 0, 0, 0, 1, 20];
    long.extend_from_slice(&[0xaa; 20]);
    long.push(20);
    long.extend_from_slice(&[0xbb; 20]);
    long.extend_from_slice(&[0xff; 8]);
    let packets: Vec<Vec<u8>> = vec![
        vec![],
        vec![0x00],
        vec![0xc0],
        vec![0xc0, 0, 0, 0, 1],
        long.clone(),
        // An Initial of the right version padded to 1200 bytes, full of garbage.
        {
            let mut p = long.clone();
            p.resize(1200, 0x5a);
            p
        },
        // An unknown version: a version negotiation answer.
        {
            let mut p = vec![0xc0u8, 0x1a, 0x2a, 0x3a, 0x4a, 8];
            p.extend_from_slice(&[1; 8]);
            p.push(8);
            p.extend_from_slice(&[2; 8]);
            p.resize(1200, 0);
            p
        },
        // A short header for no connection.
        {
            let mut p = vec![0x40u8];
            p.extend_from_slice(&[7; 40]);
            p
        },
        vec![0x5a; 65_000],
    ];
    for _ in 0..20 {
        for p in &packets {
            let _ = u.send_to(p, to);
        }
    }
    // The unknown version is answered with the versions shard speaks (among stateless
    // resets for the short headers, where the group is steered).
    u.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut buf = [0u8; 2048];
    loop {
        let (n, _) = u.recv_from(&mut buf).expect("a version negotiation packet");
        if buf[0] & 0x80 != 0 {
            assert!(n > 7 && buf[1..5] == [0, 0, 0, 0], "{:?}", &buf[..n]);
            break;
        }
        assert!(buf[0] & 0xc0 == 0x40, "a stateless reset: {:?}", &buf[..n]);
    }
    let out = h3client(py, port, &["get", "/ok"]);
    assert_eq!(out.trim(), "200 3 OK");
    assert_eq!(s.wait_workers(1)[0].pid, pid, "the worker survived");
    // Counted, and no connection left behind by the garbage or the client.
    assert!(status_field(&s, "quic_datagrams") >= 20);
    wait_for(Duration::from_secs(10), "QUIC connections closed", || {
        (status_field(&s, "quic_connections") == 0).then_some(())
    });
}

#[test]
fn a_reload_keeps_serving_http3_and_quic_retry_validates_clients() {
    let Some(py) = python_aioquic("a_reload_keeps_serving_http3_and_quic_retry_validates_clients")
    else {
        return;
    };
    let mut s = start("h3-reload", 2, "");
    let port = s.ports[0];
    assert_eq!(h3client(py, port, &["get", "/ok"]).trim(), "200 3 OK");
    s.wait_workers(2);
    // `quic_retry on` through a reload: the new generation serves, through a Retry.
    reconfigure(
        &s,
        &[(LOG, "access_log logs/h3.log h3; quic_retry on;")],
        2,
        2,
    );
    for _ in 0..5 {
        assert_eq!(h3client(py, port, &["get", "/ok"]).trim(), "200 3 OK");
    }
    let log = log_lines(&s, 6);
    assert!(log.iter().all(|l| l.starts_with("GET /ok HTTP/3.0|")));
}

#[test]
fn quic_listen_errors_are_nginx_s() {
    let dir = temp_dir("h3-conf").keep();
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let (crt, key) = (dir.join("a.pem"), dir.join("a.key"));
    std::fs::write(&crt, cert.cert.pem()).unwrap();
    std::fs::write(&key, cert.key_pair.serialize_pem()).unwrap();
    let certs = format!(
        "ssl_certificate {}; ssl_certificate_key {};",
        crt.display(),
        key.display()
    );
    let check = |body: &str| -> (i32, String) {
        let path = dir.join("conf/t.conf");
        std::fs::write(&path, format!("events {{}}\n{body}\n")).unwrap();
        run_cli(&["-t", "-c", path.to_str().unwrap()])
    };
    let (rc, out) = check(&format!(
        "http {{ server {{ listen 127.0.0.1:8443 quic ssl; {certs} }} }}"
    ));
    assert_ne!(rc, 0);
    assert!(
        out.contains("\"ssl\" parameter is incompatible with \"quic\""),
        "{out}"
    );
    let (rc, out) = check(&format!(
        "http {{ server {{ listen 127.0.0.1:8443 quic http2; {certs} }} }}"
    ));
    assert_ne!(rc, 0);
    assert!(
        out.contains("\"http2\" parameter is incompatible with \"quic\""),
        "{out}"
    );
    let (rc, out) = check("http { server { listen 127.0.0.1:8443 quic; } }");
    assert_ne!(rc, 0);
    assert!(
        out.contains("no \"ssl_certificate\" is defined for the \"listen ... quic\" directive"),
        "{out}"
    );
    let (rc, out) =
        check("stream { server { listen 127.0.0.1:8443 quic; proxy_pass 127.0.0.1:1; } }");
    assert_ne!(rc, 0);
    assert!(out.contains("invalid parameter \"quic\""), "{out}");
    // The same address and port over TCP and QUIC, with every HTTP/3 directive.
    let (rc, out) = check(&format!(
        "quic_bpf on;\n http {{ http3 on; http3_hq off; http3_max_concurrent_streams 64; \
         http3_stream_buffer_size 128k; quic_retry on; quic_gso on; \
         quic_active_connection_id_limit 4; server {{ listen 127.0.0.1:8443 quic reuseport; \
         listen 127.0.0.1:8443 ssl; {certs} }} }}"
    ));
    assert_eq!(rc, 0, "{out}");
}

#[test]
fn a_binary_upgrade_in_the_middle_of_a_download_loses_nothing() {
    use std::io::BufRead;
    let Some(py) = python_aioquic("a_binary_upgrade_in_the_middle_of_a_download_loses_nothing")
    else {
        return;
    };
    let mut s = start("h3-upgrade", 2, "");
    if !error_log(&s).contains("are steered by connection ID") {
        skipped(
            "a_binary_upgrade_in_the_middle_of_a_download_loses_nothing",
            "bpf(2) is refused here (needs CAP_BPF): QUIC keeps the kernel's hash",
        );
        return;
    }
    s.wait_workers(2);
    reconfigure(&s, &[("location = /ok {", SLOW_LOCATION)], 2, 2);
    let body: Vec<u8> = (0..600_000u32).map(|i| (i % 253) as u8).collect();
    write_file(&s.dir, "html/slow.bin", &body);
    let (mut child, mut out) = start_download(py, s.ports[0], "/slow.bin");
    let mut line = String::new();
    // USR2: a new master with its own workers; WINCH and QUIT the old one while the
    // download goes on in its worker.
    let old = s.pid();
    let pid_file = s.dir.join("logs/shard.pid");
    s.signal(libc::SIGUSR2);
    let new: i32 = wait_for(Duration::from_secs(10), "new master's pid file", || {
        let p: i32 = std::fs::read_to_string(&pid_file)
            .ok()?
            .trim()
            .parse()
            .ok()?;
        (p != old && pid_alive(p)).then_some(p)
    });
    wait_for(Duration::from_secs(10), "the new master's workers", || {
        error_log(&s)
            .matches("start worker process")
            .count()
            .ge(&6)
            .then_some(())
    });
    s.signal(libc::SIGWINCH);
    // New connections go to the new master's workers.
    for _ in 0..3 {
        assert_eq!(h3client(py, s.ports[0], &["get", "/ok"]).trim(), "200 3 OK");
    }
    line.clear();
    out.read_line(&mut line).unwrap();
    assert_eq!(
        line.trim(),
        "200 600000",
        "the download survived the upgrade"
    );
    assert!(child.wait().unwrap().success());
    s.signal(libc::SIGQUIT);
    assert_eq!(s.wait_exit(Duration::from_secs(10)), 0);
    assert_eq!(h3client(py, s.ports[0], &["get", "/ok"]).trim(), "200 3 OK");
    unsafe { libc::kill(new, libc::SIGQUIT) };
    wait_for(Duration::from_secs(10), "new master exit", || {
        (!pid_alive(new)).then_some(())
    });
}

/// A worker that dies leaves its clients' datagrams to its respawn, which does not know
/// their connections and ends them at once with a stateless reset (with the master's reset
/// secret, so the token is the one the dead worker gave out). aioquic does not act on a
/// stateless reset (it never checks one), so the test writes the client's datagram itself:
/// a short header whose connection ID carries the dead worker's key.
#[test]
fn a_worker_that_dies_ends_its_connections_with_a_stateless_reset() {
    if python_aioquic("a_worker_that_dies_ends_its_connections_with_a_stateless_reset").is_none() {
        return;
    }
    let mut s = start("h3-reset", 2, "");
    if !error_log(&s).contains("are steered by connection ID") {
        skipped(
            "a_worker_that_dies_ends_its_connections_with_a_stateless_reset",
            "bpf(2) is refused here (needs CAP_BPF): strays are dropped, not reset",
        );
        return;
    }
    let ws = s.wait_workers(2);
    // Generation 1's keys are the workers' indices.
    let victim = ws.iter().find(|w| w.idx == 1).unwrap().pid as i32;
    unsafe { libc::kill(victim, libc::SIGKILL) };
    wait_for(Duration::from_secs(10), "the respawn", || {
        let ws = s.wait_workers(2);
        ws.iter().all(|w| w.pid as i32 != victim).then_some(())
    });
    let u = UdpSocket::bind("127.0.0.1:0").unwrap();
    u.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let mut pkt = vec![0x41u8, 0x00, 0x01];
    pkt.extend_from_slice(&[0x5c; 6]);
    pkt.extend_from_slice(&[0xa7; 51]);
    u.send_to(&pkt, ("127.0.0.1", s.ports[0])).unwrap();
    let mut buf = [0u8; 2048];
    let (n, _) = u.recv_from(&mut buf).expect("a stateless reset");
    // RFC 9000, 10.3: a short header's first bits, shorter than what caused it, at least
    // 21 bytes (5 unpredictable, the 16-byte token at the end).
    assert!(
        buf[0] & 0xc0 == 0x40 && n < pkt.len() && n >= 21,
        "{:?}",
        &buf[..n]
    );
    assert!(status_field(&s, "quic_strays") >= 1);
}

/// An Initial flood from many ports (valid first flights nobody finishes): with `quic_retry
/// on` each gets a Retry and the server keeps no state for any; without, each gets a
/// handshake and holds a connection until the handshake times out.
#[test]
fn an_initial_flood_under_quic_retry_costs_no_state() {
    let Some(py) = python_aioquic("an_initial_flood_under_quic_retry_costs_no_state") else {
        return;
    };
    let s = start("h3-flood", 1, "");
    reconfigure(
        &s,
        &[(LOG, "access_log logs/h3.log h3; quic_retry on;")],
        2,
        1,
    );
    let out = h3client(py, s.ports[0], &["flood", "200"]);
    let n: Vec<u64> = out
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    assert!(n[0] >= 150 && n[1] == 0, "{out}");
    assert_eq!(status_field(&s, "quic_connections"), 0);
    assert!(status_field(&s, "quic_retries") >= 150);
    // A real client still gets through (it answers the Retry).
    assert_eq!(h3client(py, s.ports[0], &["get", "/ok"]).trim(), "200 3 OK");
}

/// `ssl_early_data on`: a resumed client sends its request with the handshake (0-RTT), and
/// `$ssl_early_data` says so (for an upstream to refuse what must not be replayed). Off (the
/// default), the same client waits for the handshake.
#[test]
fn zero_rtt_requests_with_ssl_early_data_on() {
    let Some(py) = python_aioquic("zero_rtt_requests_with_ssl_early_data_on") else {
        return;
    };
    let s = start("h3-0rtt", 1, "");
    let out = h3client(py, s.ports[0], &["zerortt", "/ok"]);
    assert_eq!(out.lines().next(), Some("first 200"), "{out}");
    assert!(out.contains("early 200 -"), "no 0-RTT by default: {out}");
    assert_eq!(status_field(&s, "quic_0rtt"), 0);
    reconfigure(
        &s,
        &[(
            LOG,
            "access_log logs/h3.log h3; ssl_early_data on; add_header X-Early $ssl_early_data;",
        )],
        2,
        1,
    );
    let out = h3client(py, s.ports[0], &["zerortt", "/ok"]);
    assert_eq!(out.lines().next(), Some("first 200"), "{out}");
    assert!(
        out.contains("early 200 1"),
        "the request came in 0-RTT data: {out}"
    );
    assert!(status_field(&s, "quic_0rtt") >= 1);
}

/// A browser over HTTP/3: headless Chromium, QUIC forced for the origin, loads a page and
/// its 20 assets; shard's access log shows HTTP/3 for all of them.
#[test]
fn a_browser_loads_a_page_and_its_assets_over_http3() {
    let Some(chromium) = ["chromium", "chromium-browser", "google-chrome"]
        .into_iter()
        .find(|b| {
            Command::new(b)
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success())
        })
    else {
        skipped(
            "a_browser_loads_a_page_and_its_assets_over_http3",
            "chromium is not installed (apt-get install chromium)",
        );
        return;
    };
    let (s, spki) = start_with_cert("h3-browser", 2, "");
    let mut page = String::from("<html><body>\n");
    for i in 0..20 {
        write_file(
            &s.dir,
            &format!("html/asset/{i}.txt"),
            format!("asset {i}").as_bytes(),
        );
        page.push_str(&format!("<iframe src=\"/asset/{i}.txt\"></iframe>\n"));
    }
    page.push_str("</body></html>\n");
    write_file(&s.dir, "html/index.html", page.as_bytes());
    let profile = temp_dir("h3-browser-profile");
    let port = s.ports[0];
    let out = Command::new("timeout")
        .arg("60")
        .arg(chromium)
        .args([
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--enable-quic",
            "--ignore-certificate-errors",
            "--host-resolver-rules=MAP localhost 127.0.0.1",
        ])
        .arg(format!("--origin-to-force-quic-on=localhost:{port}"))
        .arg(format!("--ignore-certificate-errors-spki-list={spki}"))
        .arg(format!("--user-data-dir={}", profile.keep().display()))
        .arg("--dump-dom")
        .arg(format!("https://localhost:{port}/"))
        .output()
        .unwrap();
    let dom = String::from_utf8_lossy(&out.stdout);
    assert!(
        dom.contains("asset/19.txt"),
        "{dom}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let log = log_lines(&s, 21);
    let assets: Vec<&String> = log
        .iter()
        .filter(|l| l.starts_with("GET /asset/"))
        .collect();
    assert_eq!(assets.len(), 20, "{log:?}");
    assert!(
        log.iter()
            .filter(|l| l.starts_with("GET /"))
            .all(|l| l.contains(" HTTP/3.0|HTTP/3.0|h3|")),
        "{log:?}"
    );
}

/// `quic_gso on`: a connection's datagrams leave in one `sendmsg` each burst, cut by the
/// kernel (`UDP_SEGMENT`); the client sees ordinary datagrams and gets every byte.
#[test]
fn quic_gso_sends_large_responses_whole() {
    let Some(py) = python_aioquic("quic_gso_sends_large_responses_whole") else {
        return;
    };
    let s = start("h3-gso", 1, "");
    reconfigure(
        &s,
        &[(LOG, "access_log logs/h3.log h3; quic_gso on;")],
        2,
        1,
    );
    let body: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    write_file(&s.dir, "html/large.bin", &body);
    let out = h3client(py, s.ports[0], &["get", "/large.bin", "/big.bin", "/ok"]);
    assert_eq!(
        out.lines().collect::<Vec<_>>(),
        ["200 3000000 ", "200 300000 ", "200 3 OK"],
        "{out}"
    );
    assert!(!error_log(&s).contains("UDP_SEGMENT refused"));
}

/// `limit_req` judges each HTTP/3 stream as a request: three at once against a zone of one
/// request a minute get one 200 (and two 503s).
#[test]
fn limits_judge_each_http3_stream() {
    let Some(py) = python_aioquic("limits_judge_each_http3_stream") else {
        return;
    };
    let s = start("h3-limits", 1, "");
    reconfigure(
        &s,
        &[
            (
                "client_max_body_size 20m;",
                "client_max_body_size 20m; limit_req_zone $binary_remote_addr zone=one:1m rate=1r/m;",
            ),
            (
                "location = /ok {",
                "location = /limited { limit_req zone=one; }\n location = /ok {",
            ),
        ],
        2,
        1,
    );
    // A file: `return` runs in the rewrite phase, before limits, as in nginx.
    write_file(&s.dir, "html/limited", b"in");
    assert_eq!(
        h3client(py, s.ports[0], &["many", "3", "/limited"]).trim(),
        "ok 1"
    );
    let log = log_lines(&s, 3);
    let limited: Vec<&String> = log
        .iter()
        .filter(|l| l.starts_with("GET /limited"))
        .collect();
    assert_eq!(limited.len(), 3, "{log:?}");
    assert_eq!(
        limited.iter().filter(|l| l.contains("|503|")).count(),
        2,
        "{log:?}"
    );
}
