//! `listen ... proxy_protocol`: the PROXY protocol header (v1 and v2) before the request and
//! before a TLS handshake, its variables, `real_ip_header proxy_protocol`, and hostile headers.

mod support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use support::*;

const CONF: &str = "worker_processes 1;\nevents {}\nhttp {\n log_format pp '$remote_addr $realip_remote_addr $proxy_protocol_addr';\n \
    server {\n  listen 127.0.0.1:{port};\n  location = /status { shard_status; }\n }\n \
    server {\n  listen 127.0.0.1:{port1} proxy_protocol;\n  client_header_timeout 1s;\n  \
    access_log {dir}/logs/pp.log pp;\n  \
    location /vars { return 200 \"$proxy_protocol_addr:$proxy_protocol_port $proxy_protocol_server_addr:$proxy_protocol_server_port $remote_addr alpn=$proxy_protocol_tlv_alpn authority=$proxy_protocol_tlv_authority\"; }\n  \
    location /real {\n   set_real_ip_from 127.0.0.1;\n   real_ip_header proxy_protocol;\n   \
    location /real/denied { deny 192.0.2.66; }\n   \
    return 200 \"real $remote_addr $realip_remote_addr $remote_port\";\n  }\n }\n}\n";

fn pp_addr(s: &Server) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], s.ports[0]))
}

/// Sends `bytes` in pieces (each `pieces` long, with a pause between them), then reads the
/// whole answer.
fn send(addr: SocketAddr, bytes: &[u8], piece: usize) -> Vec<u8> {
    let mut c = TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    c.set_nodelay(true).unwrap();
    for p in bytes.chunks(piece) {
        c.write_all(p).unwrap();
        if piece < bytes.len() {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let mut out = Vec::new();
    let _ = c.read_to_end(&mut out);
    out
}

fn body(resp: &[u8]) -> String {
    let text = String::from_utf8_lossy(resp).into_owned();
    text.split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default()
}

fn v2(src: [u8; 4], sport: u16, dst: [u8; 4], dport: u16, tlvs: &[(u8, &[u8])]) -> Vec<u8> {
    let mut t = Vec::new();
    for (k, v) in tlvs {
        t.push(*k);
        t.extend_from_slice(&(v.len() as u16).to_be_bytes());
        t.extend_from_slice(v);
    }
    let mut b = b"\r\n\r\n\0\r\nQUIT\n".to_vec();
    b.push(0x21);
    b.push(0x11);
    b.extend_from_slice(&(12 + t.len() as u16).to_be_bytes());
    b.extend_from_slice(&src);
    b.extend_from_slice(&dst);
    b.extend_from_slice(&sport.to_be_bytes());
    b.extend_from_slice(&dport.to_be_bytes());
    b.extend_from_slice(&t);
    b
}

#[test]
fn v1_and_v2_headers_give_the_client_address() {
    let s = Server::start_ports("pp-vars", CONF, 1, 1);
    let req = b"GET /vars HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    let v1 = [
        b"PROXY TCP4 192.0.2.1 198.51.100.2 56324 443\r\n".as_slice(),
        req,
    ]
    .concat();
    // Whole, and dripped a few bytes at a time (the header arrives in pieces).
    for piece in [v1.len(), 7] {
        let r = send(pp_addr(&s), &v1, piece);
        assert_eq!(
            body(&r),
            "192.0.2.1:56324 198.51.100.2:443 127.0.0.1 alpn= authority=",
            "piece {piece}: {}",
            String::from_utf8_lossy(&r)
        );
    }
    let h = v2(
        [10, 1, 2, 3],
        4000,
        [10, 9, 9, 9],
        8443,
        &[(0x01, b"h2"), (0x02, b"example.com")],
    );
    let r = send(pp_addr(&s), &[h.as_slice(), req].concat(), 5);
    assert_eq!(
        body(&r),
        "10.1.2.3:4000 10.9.9.9:8443 127.0.0.1 alpn=h2 authority=example.com"
    );
    // v1 UNKNOWN: no addresses, the connection's stand.
    let r = send(
        pp_addr(&s),
        &[b"PROXY UNKNOWN\r\n".as_slice(), req].concat(),
        100,
    );
    assert_eq!(body(&r), ": : 127.0.0.1 alpn= authority=");
    // Keep-alive: the header is read once, then requests follow.
    let mut c = TcpStream::connect(pp_addr(&s)).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    c.write_all(b"PROXY TCP4 192.0.2.9 127.0.0.1 1 2\r\n")
        .unwrap();
    for _ in 0..3 {
        c.write_all(b"GET /vars HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        let r = read_response(&mut c, false).unwrap();
        assert!(r.body_str().starts_with("192.0.2.9:1 "), "{}", r.body_str());
    }
}

#[test]
fn real_ip_header_proxy_protocol_makes_it_the_remote_address() {
    let s = Server::start_ports("pp-realip", CONF, 1, 1);
    let ask = |src: &str, path: &str| {
        let head = format!(
            "PROXY TCP4 {src} 127.0.0.1 5555 80\r\nGET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        );
        send(pp_addr(&s), head.as_bytes(), 1000)
    };
    assert_eq!(
        body(&ask("192.0.2.50", "/real")),
        // The port is the header's too, as nginx's realip.
        "real 192.0.2.50 127.0.0.1 5555"
    );
    // allow/deny see the real client (access phase; a file that does not exist is 404 for
    // everyone else).
    let r = ask("192.0.2.66", "/real/denied");
    assert!(String::from_utf8_lossy(&r).starts_with("HTTP/1.1 403"));
    let r = ask("192.0.2.67", "/real/denied");
    assert!(String::from_utf8_lossy(&r).starts_with("HTTP/1.1 404"));
    // And the access log.
    let log = wait_for(Duration::from_secs(5), "the access log", || {
        let t = std::fs::read_to_string(s.dir.join("logs/pp.log")).unwrap_or_default();
        (t.lines().count() >= 3).then_some(t)
    });
    assert!(
        log.lines().any(|l| l == "192.0.2.50 127.0.0.1 192.0.2.50"),
        "{log}"
    );
}

#[test]
fn broken_missing_and_slow_headers_close_the_connection() {
    let s = Server::start_ports("pp-hostile", CONF, 1, 1);
    let hostile: [&[u8]; 5] = [
        b"GET /vars HTTP/1.1\r\nHost: x\r\n\r\n",
        b"PROXY TCP4 1.2.3.4 5.6.7.8 99999 1\r\nGET /vars HTTP/1.1\r\n\r\n",
        b"PROXY TCP4 1.2.3.4\r\n\r\n",
        b"\r\n\r\n\0\r\nQUIT\n\x31\x11\x00\x0c",
        &[b'P'; 200],
    ];
    for h in hostile {
        let r = send(pp_addr(&s), h, h.len());
        assert!(r.is_empty(), "{:?}: {}", h, String::from_utf8_lossy(&r));
    }
    let log = wait_for(Duration::from_secs(5), "the broken header lines", || {
        let log = error_log(&s);
        (log.matches("while reading PROXY protocol").count() >= 4).then_some(log)
    });
    assert!(
        log.contains("broken header: \"GET /vars HTTP/1.1\\r\\nHost: x")
            && log.contains("client: 127.0.0.1, server: 127.0.0.1:"),
        "{log}"
    );
    // A v2 length larger than shard reads: refused, not waited for.
    let mut big = v2([1, 1, 1, 1], 1, [2, 2, 2, 2], 2, &[]);
    big[14..16].copy_from_slice(&0xffffu16.to_be_bytes());
    let t = Instant::now();
    assert!(send(pp_addr(&s), &big, big.len()).is_empty());
    assert!(
        t.elapsed() < Duration::from_millis(900),
        "{:?}",
        t.elapsed()
    );
    // Half a header, then nothing: client_header_timeout (1s) closes it.
    let mut c = TcpStream::connect(pp_addr(&s)).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    c.write_all(b"PROXY TCP4 1.2.3.4 ").unwrap();
    let t = Instant::now();
    let mut buf = [0u8; 16];
    let n = c.read(&mut buf).unwrap_or(0);
    assert_eq!(n, 0);
    assert!(
        t.elapsed() >= Duration::from_millis(800),
        "{:?}",
        t.elapsed()
    );
    // The worker still serves everyone else.
    let r = send(
        pp_addr(&s),
        b"PROXY TCP4 192.0.2.1 127.0.0.1 1 2\r\nGET /vars HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        1000,
    );
    assert!(body(&r).starts_with("192.0.2.1:1 "));
}

/// curl's `--haproxy-protocol` (a real PROXY v1 writer) in front of a TLS listener: the header
/// comes before the handshake.
#[test]
fn tls_behind_the_header_with_curl() {
    if std::process::Command::new("curl")
        .arg("--version")
        .output()
        .is_err()
    {
        skipped("tls_behind_the_header_with_curl", "curl is not installed");
        return;
    }
    let dir = temp_dir("pp-tls-cert").keep();
    let (cert, key) = write_self_signed(&dir);
    let conf = format!(
        "worker_processes 1;\nevents {{}}\nhttp {{\n server {{\n  listen 127.0.0.1:{{port}};\n  \
         location = /status {{ shard_status; }}\n }}\n server {{\n  \
         listen 127.0.0.1:{{port1}} ssl proxy_protocol;\n  ssl_certificate {};\n  \
         ssl_certificate_key {};\n  location / {{ return 200 \"tls $proxy_protocol_addr $scheme\"; }}\n }}\n}}\n",
        cert.display(),
        key.display()
    );
    let s = Server::start_ports("pp-tls", &conf, 1, 1);
    let out = std::process::Command::new("curl")
        .args(["-sk", "--max-time", "10", "--haproxy-protocol"])
        .arg(format!("https://127.0.0.1:{}/", s.ports[0]))
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "tls 127.0.0.1 https",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A self-signed certificate for 127.0.0.1 and its key, as PEM files in `dir`.
fn write_self_signed(dir: &std::path::Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let params = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()]).unwrap();
    let cert = params.self_signed(&key).unwrap();
    let (c, k) = (dir.join("cert.pem"), dir.join("key.pem"));
    std::fs::write(&c, cert.pem()).unwrap();
    std::fs::write(&k, key.serialize_pem()).unwrap();
    (c, k)
}

/// A stream server behind a PROXY header, passing one (v1) to its upstream: the upstream
/// sees the original client's addresses, then the client's bytes.
#[test]
fn stream_reads_a_header_and_sends_one_upstream() {
    let up = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let up_port = up.local_addr().unwrap().port();
    let seen = std::thread::spawn(move || {
        let mut got = Vec::new();
        for _ in 0..2 {
            let (mut c, _) = up.accept().unwrap();
            c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let mut buf = vec![0u8; 256];
            let mut all = Vec::new();
            while !all.ends_with(b"hello") {
                match c.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => all.extend_from_slice(&buf[..n]),
                }
            }
            c.write_all(b"bye").unwrap();
            got.push(all);
        }
        got
    });
    let conf = format!(
        "worker_processes 1;\nevents {{}}\nhttp {{\n server {{\n  listen 127.0.0.1:{{port}};\n  \
         location = /status {{ shard_status; }}\n }}\n}}\nstream {{\n server {{\n  \
         listen 127.0.0.1:{{port1}} proxy_protocol;\n  proxy_protocol on;\n  \
         proxy_protocol_timeout 1s;\n  proxy_pass 127.0.0.1:{up_port};\n }}\n}}\n"
    );
    let s = Server::start_ports("pp-stream", &conf, 1, 1);
    let addr = SocketAddr::from(([127, 0, 0, 1], s.ports[0]));
    let h = v2([10, 1, 2, 3], 4000, [10, 9, 9, 9], 8443, &[]);
    assert_eq!(send(addr, &[h.as_slice(), b"hello"].concat(), 6), b"bye");
    assert_eq!(
        send(addr, b"PROXY TCP4 192.0.2.7 192.0.2.8 1 2\r\nhello", 100),
        b"bye"
    );
    let got = seen.join().unwrap();
    assert_eq!(
        String::from_utf8_lossy(&got[0]),
        "PROXY TCP4 10.1.2.3 10.9.9.9 4000 8443\r\nhello"
    );
    assert_eq!(
        String::from_utf8_lossy(&got[1]),
        "PROXY TCP4 192.0.2.7 192.0.2.8 1 2\r\nhello"
    );
    // Broken and slow headers close the connection; nothing reaches the upstream.
    assert!(send(addr, b"hello there, no header\r\n", 100).is_empty());
    let mut c = TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    c.write_all(b"PROXY TCP4").unwrap();
    let t = Instant::now();
    let mut b = [0u8; 8];
    assert_eq!(c.read(&mut b).unwrap_or(0), 0);
    assert!(t.elapsed() >= Duration::from_millis(800));
    let log = wait_for(Duration::from_secs(5), "the log lines", || {
        let l = error_log(&s);
        l.contains("broken header").then_some(l)
    });
    assert!(log.contains("while reading PROXY protocol"), "{log}");
}

/// HAProxy (a real PROXY protocol writer) in front of shard with `send-proxy` and
/// `send-proxy-v2`: shard sees the address HAProxy's client came from.
#[test]
fn behind_haproxy_send_proxy_and_send_proxy_v2() {
    let haproxy = [
        "/usr/sbin/haproxy",
        "/usr/bin/haproxy",
        "/usr/local/sbin/haproxy",
    ]
    .iter()
    .map(std::path::Path::new)
    .find(|p| p.is_file());
    let Some(haproxy) = haproxy else {
        skipped(
            "behind_haproxy_send_proxy_and_send_proxy_v2",
            "haproxy is not installed (apt-get install haproxy; .ci/run installs it)",
        );
        return;
    };
    let s = Server::start_ports("pp-haproxy", CONF, 1, 1);
    let dir = temp_dir("pp-haproxy-conf").keep();
    let (f1, f2) = (free_port(), free_port());
    let conf = format!(
        "global\n  maxconn 100\ndefaults\n  mode tcp\n  timeout connect 5s\n  timeout client 10s\n  timeout server 10s\n\
         frontend v1\n  bind 127.0.0.1:{f1}\n  default_backend b1\n\
         frontend v2\n  bind 127.0.0.1:{f2}\n  default_backend b2\n\
         backend b1\n  server s 127.0.0.1:{p} send-proxy\n\
         backend b2\n  server s 127.0.0.1:{p} send-proxy-v2\n",
        p = s.ports[0]
    );
    std::fs::write(dir.join("haproxy.cfg"), conf).unwrap();
    let mut child = std::process::Command::new(haproxy)
        .arg("-db")
        .arg("-f")
        .arg(dir.join("haproxy.cfg"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::from(
            std::fs::File::create(dir.join("haproxy.log")).unwrap(),
        ))
        .spawn()
        .expect("start haproxy");
    for port in [f1, f2] {
        wait_for(Duration::from_secs(10), "haproxy listening", || {
            TcpStream::connect(("127.0.0.1", port)).ok()
        });
    }
    for port in [f1, f2] {
        // The client's own address and port, as HAProxy saw them.
        let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
        let local = c.local_addr().unwrap();
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        c.write_all(b"GET /vars HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .unwrap();
        let mut out = Vec::new();
        let _ = c.read_to_end(&mut out);
        let b = body(&out);
        assert!(
            b.starts_with(&format!("127.0.0.1:{} 127.0.0.1:{port} ", local.port())),
            "port {port}: {b:?}\n{}",
            std::fs::read_to_string(dir.join("haproxy.log")).unwrap_or_default()
        );
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// A stream `return` and `deny` behind a PROXY header: both wait for the header (its
/// variables in the value, `set` evaluated after it); `deny` judges the connection's address.
#[test]
fn stream_return_and_deny_after_the_header() {
    let conf = "worker_processes 1;\nevents {}\nhttp {\n server {\n  listen 127.0.0.1:{port};\n  \
         location = /status { shard_status; }\n }\n}\nstream {\n log_format s '$status $proxy_protocol_addr';\n \
         server {\n  listen 127.0.0.1:{port1} proxy_protocol;\n  \
         set $from \"$proxy_protocol_addr:$proxy_protocol_port\";\n  \
         return \"$from $remote_addr\";\n  access_log logs/s.log s;\n }\n \
         server {\n  listen 127.0.0.1:{port2} proxy_protocol;\n  deny 127.0.0.1;\n  return x;\n  \
         access_log logs/s.log s;\n }\n}\n";
    let s = Server::start_ports("pp-stream-return", conf, 1, 2);
    let a = SocketAddr::from(([127, 0, 0, 1], s.ports[0]));
    let b = SocketAddr::from(([127, 0, 0, 1], s.ports[1]));
    assert_eq!(
        String::from_utf8_lossy(&send(a, b"PROXY TCP4 192.0.2.7 192.0.2.8 1111 2\r\n", 10)),
        "192.0.2.7:1111 127.0.0.1"
    );
    assert!(send(b, b"PROXY TCP4 192.0.2.9 192.0.2.8 1 2\r\n", 100).is_empty());
    let path = s.dir.join("logs/s.log");
    let log = wait_for(Duration::from_secs(10), "two log lines", || {
        let l = std::fs::read_to_string(&path).unwrap_or_default();
        (l.lines().count() >= 2).then_some(l)
    });
    assert_eq!(log, "200 192.0.2.7\n403 192.0.2.9\n");
}

/// `set_real_ip_from` in stream (`ngx_stream_realip_module`): a trusted peer's PROXY header
/// becomes `$remote_addr`/`$remote_port` (and what `allow`/`deny` judge); an untrusted
/// one's does not.
#[test]
fn stream_realip_from_the_header() {
    let conf = "worker_processes 1;\nevents {}\nhttp {\n server {\n  listen 127.0.0.1:{port};\n  \
         location = /status { shard_status; }\n }\n}\nstream {\n \
         server {\n  listen 127.0.0.1:{port1} proxy_protocol;\n  set_real_ip_from 127.0.0.0/8;\n  \
         deny 192.0.2.9;\n  return \"$remote_addr:$remote_port $realip_remote_addr:$realip_remote_port\";\n }\n \
         server {\n  listen 127.0.0.1:{port2} proxy_protocol;\n  set_real_ip_from 10.0.0.0/8;\n  \
         return \"$remote_addr $realip_remote_addr\";\n }\n}\n";
    let s = Server::start_ports("pp-stream-realip", conf, 1, 2);
    let a = SocketAddr::from(([127, 0, 0, 1], s.ports[0]));
    let b = SocketAddr::from(([127, 0, 0, 1], s.ports[1]));
    let got = String::from_utf8_lossy(&send(a, b"PROXY TCP4 192.0.2.7 192.0.2.8 1111 2\r\n", 100))
        .into_owned();
    assert!(got.starts_with("192.0.2.7:1111 127.0.0.1:"), "{got}");
    assert!(send(a, b"PROXY TCP4 192.0.2.9 192.0.2.8 1 2\r\n", 100).is_empty());
    assert_eq!(
        String::from_utf8_lossy(&send(b, b"PROXY TCP4 192.0.2.7 192.0.2.8 1111 2\r\n", 100)),
        "127.0.0.1 127.0.0.1"
    );
}
