//! TLS termination as clients see it: certificates made at run time by `rcgen` (a test CA and
//! leaves for `a.test` and `b.test`), a rustls client in the test for exact checks (SNI,
//! ALPN, protocol versions, session resumption), and `curl`/`openssl s_client` where they are
//! installed (SKIPPED otherwise). Also: nginx's 400 for plain HTTP on the TLS port and
//! `error_page 497`, `-t` and reload with bad certificates, WebSocket over TLS, and hostile
//! handshakes that must not hurt a worker.

mod support;

use support::upstream::{Gate, Reply, Upstream};

#[path = "../../shard-bench/src/ws.rs"]
mod ws;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::{CertificateDer, ServerName};
use support::*;

const TIMEOUT: Duration = Duration::from_secs(10);

/// A CA and leaf certificates signed by it, written as PEM files into `dir`.
struct Pki {
    /// Where the PEM files are (`conf/NAME.pem`, `conf/NAME.key`).
    dir: std::path::PathBuf,
    ca: CertificateDer<'static>,
    leaves: Vec<(String, CertificateDer<'static>)>,
}

fn pki(dir: &Path, names: &[&str]) -> Pki {
    let ca_key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "shard test CA");
    let ca = ca_params.self_signed(&ca_key).unwrap();
    std::fs::write(dir.join("conf/ca.pem"), ca.pem()).unwrap();
    let mut leaves = Vec::new();
    for name in names {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let params = rcgen::CertificateParams::new(vec![name.to_string()]).unwrap();
        let cert = params.signed_by(&key, &ca, &ca_key).unwrap();
        std::fs::write(dir.join(format!("conf/{name}.pem")), cert.pem()).unwrap();
        std::fs::write(dir.join(format!("conf/{name}.key")), key.serialize_pem()).unwrap();
        leaves.push((name.to_string(), cert.der().clone()));
    }
    Pki {
        dir: dir.to_path_buf(),
        ca: ca.der().clone(),
        leaves,
    }
}

fn client_config(
    ca: &CertificateDer<'static>,
    versions: &[&'static rustls::SupportedProtocolVersion],
) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.clone()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut c = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(versions)
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    c.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Arc::new(c)
}

type Tls = rustls::StreamOwned<rustls::ClientConnection, TcpStream>;

fn connect_tls(
    addr: SocketAddr,
    sni: &str,
    config: &Arc<rustls::ClientConfig>,
) -> std::io::Result<Tls> {
    let sock = TcpStream::connect_timeout(&addr, TIMEOUT)?;
    sock.set_read_timeout(Some(TIMEOUT))?;
    let name = ServerName::try_from(sni.to_string()).unwrap();
    let conn = rustls::ClientConnection::new(config.clone(), name).unwrap();
    let mut s = rustls::StreamOwned::new(conn, sock);
    // Complete the handshake now, so failures show here.
    while s.conn.is_handshaking() {
        s.conn.complete_io(&mut s.sock)?;
    }
    Ok(s)
}

/// One request on `s`; the status, headers and body.
fn request(s: &mut Tls, host: &str, path: &str) -> (u16, String, Vec<u8>) {
    write!(s, "GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n").unwrap();
    read_one(s)
}

fn read_one(s: &mut impl Read) -> (u16, String, Vec<u8>) {
    let mut buf = Vec::new();
    let mut b = [0u8; 16384];
    let end = loop {
        if let Some(i) = find(&buf, b"\r\n\r\n") {
            break i + 4;
        }
        let n = s.read(&mut b).unwrap();
        assert!(
            n > 0,
            "end of stream before the head: {:?}",
            String::from_utf8_lossy(&buf)
        );
        buf.extend_from_slice(&b[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    let len: usize = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-length:")
                .map(|v| v.trim().to_string())
        })
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let mut body = buf[end..].to_vec();
    while body.len() < len {
        let n = s.read(&mut b).unwrap();
        assert!(n > 0);
        body.extend_from_slice(&b[..n]);
    }
    (status, head, body)
}

/// Two servers on one TLS address (`a.test` the default), `/status`, static files, and a log
/// with the TLS variables.
fn conf(workers: usize, extra_a: &str, http_extra: &str) -> String {
    format!(
        "worker_processes {workers};\n\
         error_log logs/error.log info;\n\
         pid logs/shard.pid;\n\
         events {{ worker_connections 256; }}\n\
         http {{\n\
         log_format tls '$ssl_session_reused $scheme $https $ssl_protocol $ssl_cipher $ssl_server_name $request';\n\
         access_log logs/access.log tls;\n\
         {http_extra}\n\
         server {{\n\
           listen 127.0.0.1:{{port}};\n\
           location = /status {{ shard_status; }}\n\
         }}\n\
         server {{\n\
           listen 127.0.0.1:{{port1}} ssl reuseport;\n\
           server_name a.test;\n\
           ssl_certificate a.test.pem; ssl_certificate_key a.test.key;\n\
           root {{dir}}/html;\n\
           {extra_a}\n\
         }}\n\
         server {{\n\
           listen 127.0.0.1:{{port1}} ssl;\n\
           server_name b.test;\n\
           ssl_certificate b.test.pem; ssl_certificate_key b.test.key;\n\
           location / {{ return 200 \"b\"; }}\n\
         }}\n\
         }}\n"
    )
}

/// Starts shard with the test PKI written first.
fn start(tag: &str, workers: usize, extra_a: &str, http_extra: &str) -> (Server, Pki) {
    // The server's prefix is made by `Server::start`; the PKI must exist before: write both
    // into a directory of our own and point the configuration at it.
    let dir = temp_dir(tag).keep();
    let p = pki(&dir, &["a.test", "b.test"]);
    let text = conf(workers, extra_a, http_extra)
        .replace("a.test.pem", dir.join("conf/a.test.pem").to_str().unwrap());
    let text = text
        .replace("a.test.key", dir.join("conf/a.test.key").to_str().unwrap())
        .replace("b.test.pem", dir.join("conf/b.test.pem").to_str().unwrap())
        .replace("b.test.key", dir.join("conf/b.test.key").to_str().unwrap());
    let s = Server::start_ports(tag, &text, workers, 1);
    (s, p)
}

fn tls_addr(s: &Server) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], s.ports[0]))
}

#[test]
fn serves_over_tls_with_sni_alpn_keepalive_and_the_tls_variables() {
    let (s, p) = start("tls-basic", 2, "", "");
    write_file(&s.dir, "html/index.html", b"hello over tls\n");
    let big: Vec<u8> = (0..3 << 20).map(|i: u32| (i * 31 % 251) as u8).collect();
    write_file(&s.dir, "html/big.bin", &big);
    let cfg = client_config(&p.ca, &[&rustls::version::TLS13, &rustls::version::TLS12]);

    let mut c = connect_tls(tls_addr(&s), "a.test", &cfg).unwrap();
    assert_eq!(
        c.conn.alpn_protocol(),
        Some(&b"http/1.1"[..]),
        "h2 is not offered back"
    );
    assert_eq!(
        c.conn.protocol_version(),
        Some(rustls::ProtocolVersion::TLSv1_3)
    );
    let (st, _, body) = request(&mut c, "a.test", "/index.html");
    assert_eq!((st, body.as_slice()), (200, &b"hello over tls\n"[..]));
    // Kept alive: a 3 MiB file on the same connection, byte for byte.
    let (st, head, body) = request(&mut c, "a.test", "/big.bin");
    assert_eq!(st, 200, "{head}");
    assert!(body == big, "3 MiB through TLS intact");

    // SNI chooses the certificate (and the server by Host as ever).
    let mut b = connect_tls(tls_addr(&s), "b.test", &cfg).unwrap();
    let presented = b.conn.peer_certificates().unwrap()[0].clone();
    assert_eq!(presented, p.leaves[1].1);
    let (_, _, body) = request(&mut b, "b.test", "/");
    assert_eq!(body, b"b");

    // A name no server has: the default server's certificate (which the client then
    // refuses, as it would refuse nginx's).
    let err = connect_tls(tls_addr(&s), "c.test", &cfg)
        .map(|_| ())
        .expect_err("name mismatch");
    assert!(
        err.to_string().contains("NotValidForName") || err.to_string().contains("certificate"),
        "{err}"
    );

    let line = wait_for(TIMEOUT, "the TLS access-log line", || {
        std::fs::read_to_string(s.dir.join("logs/access.log"))
            .ok()?
            .lines()
            .find(|l| l.ends_with("GET /index.html HTTP/1.1"))
            .map(str::to_string)
    });
    assert!(
        line.starts_with(". https on TLSv1.3 TLS_") && line.contains(" a.test GET"),
        "{line}"
    );
    // Counted per worker.
    let status = get(s.addr(), "/status").body_str();
    let handshakes: u64 = status
        .split("\"tls_handshakes\":")
        .skip(1)
        .map(|v| v.split(',').next().unwrap().parse::<u64>().unwrap())
        .sum();
    assert!(handshakes >= 2, "{status}");
    // How records are encrypted is said once at start.
    let log = std::fs::read_to_string(s.dir.join("logs/error.log")).unwrap();
    assert_eq!(
        log.matches("TLS records are encrypted in user space (rustls)")
            .count(),
        1,
        "{log}"
    );
}

/// A burst of new TLS clients ready at once (their ClientHellos wait while the worker is
/// stopped): the worker processes at most `TLS_HANDSHAKES_PER_TURN` (4) handshake messages
/// per loop turn and puts the others off to a later one (counted), and every handshake
/// completes.
#[test]
fn a_burst_of_handshakes_is_spread_over_loop_turns() {
    struct Cont(i32);
    impl Drop for Cont {
        fn drop(&mut self) {
            unsafe { libc::kill(self.0, libc::SIGCONT) };
        }
    }
    let (s, p) = start("tls-burst", 1, "", "");
    let cfg = client_config(&p.ca, &[&rustls::version::TLS13]);
    let cont = Cont(s.workers()[0].pid as i32);
    unsafe { libc::kill(cont.0, libc::SIGSTOP) };
    let clients: Vec<Tls> = (0..24)
        .map(|_| {
            let sock = TcpStream::connect_timeout(&tls_addr(&s), TIMEOUT).unwrap();
            sock.set_read_timeout(Some(TIMEOUT)).unwrap();
            let name = ServerName::try_from("b.test").unwrap();
            let mut conn = rustls::ClientConnection::new(cfg.clone(), name).unwrap();
            while conn.wants_write() {
                conn.write_tls(&mut &sock).unwrap();
            }
            rustls::StreamOwned::new(conn, sock)
        })
        .collect();
    drop(cont);
    for mut c in clients {
        assert_eq!(request(&mut c, "b.test", "/").2, b"b");
    }
    assert_eq!(status_field(&s, "tls_handshakes"), 24);
    assert!(status_field(&s, "tls_handshakes_deferred") > 0);
}

#[test]
fn plain_http_on_the_tls_port_gets_nginx_400_or_error_page_497() {
    let (s, _) = start("tls-plain", 1, "", "");
    let mut c = connect(tls_addr(&s));
    c.write_all(b"GET /x HTTP/1.1\r\nHost: a.test\r\n\r\n")
        .unwrap();
    let r = read_response(&mut c, false).unwrap();
    assert_eq!(r.status, 400);
    assert!(r
        .body_str()
        .contains("The plain HTTP request was sent to HTTPS port"));
    assert_eq!(r.header("connection"), Some("close"));

    // The common redirect: `error_page 497 https://$host:$server_port$request_uri;`.
    let (s2, _) = start(
        "tls-497",
        1,
        "error_page 497 https://$host:$server_port$request_uri;",
        "",
    );
    let mut c = connect(tls_addr(&s2));
    c.write_all(b"GET /y?z=1 HTTP/1.1\r\nHost: a.test\r\n\r\n")
        .unwrap();
    let r = read_response(&mut c, false).unwrap();
    assert_eq!(r.status, 302);
    assert_eq!(
        r.header("location").unwrap(),
        format!("https://a.test:{}/y?z=1", s2.ports[0])
    );
}

#[test]
fn tickets_resume_on_any_worker_and_protocols_are_honoured() {
    let (s, p) = start("tls-resume", 2, "", "");
    for versions in [&rustls::version::TLS13, &rustls::version::TLS12] {
        let cfg = client_config(&p.ca, &[versions]);
        let mut resumed = 0;
        for _ in 0..8 {
            let mut c = connect_tls(tls_addr(&s), "b.test", &cfg).unwrap();
            let (st, _, _) = request(&mut c, "b.test", "/");
            assert_eq!(st, 200);
            if c.conn.handshake_kind() == Some(rustls::HandshakeKind::Resumed) {
                resumed += 1;
            }
        }
        // Every connection after the first resumes, whichever worker took it.
        assert!(resumed >= 7, "{versions:?}: {resumed} of 7 resumed");
    }
    // `$ssl_session_reused` says which: `r` for 14 of the 16 lines.
    let reused = wait_for(TIMEOUT, "16 access-log lines", || {
        let log = std::fs::read_to_string(s.dir.join("logs/access.log")).ok()?;
        let lines: Vec<&str> = log.lines().collect();
        (lines.len() >= 16).then(|| lines.iter().filter(|l| l.starts_with("r https")).count())
    });
    assert!(reused >= 14, "{reused} lines say r");
    // `ssl_protocols TLSv1.3`: a TLS 1.2-only client is refused.
    let (s13, p13) = start("tls-13only", 1, "", "ssl_protocols TLSv1.3;");
    let only12 = client_config(&p13.ca, &[&rustls::version::TLS12]);
    assert!(connect_tls(tls_addr(&s13), "a.test", &only12).is_err());
    let only13 = client_config(&p13.ca, &[&rustls::version::TLS13]);
    assert!(connect_tls(tls_addr(&s13), "a.test", &only13).is_ok());
}

/// `$ssl_session_id` is the session's (a resumption has the id its session was given),
/// `$ssl_ciphers` and `$ssl_curves` list what the client offered in OpenSSL's names, and a
/// session older than `ssl_session_timeout` does not resume, ticket or cache.
#[test]
fn session_ids_offers_and_the_session_timeout() {
    for (tag, cache) in [
        ("tls-ids-tickets", ""),
        (
            "tls-ids-cache",
            "ssl_session_tickets off; ssl_session_cache shared:S:1m;",
        ),
    ] {
        let extra = format!(
            "ssl_session_timeout 1; {cache}\n\
             location /v {{ return 200 \"$ssl_session_id|$ssl_ciphers|$ssl_curves|$ssl_session_reused\"; }}"
        );
        let (s, p) = start(tag, 1, &extra, "");
        for versions in [&rustls::version::TLS13, &rustls::version::TLS12] {
            let cfg = client_config(&p.ca, &[versions]);
            let ask = || {
                let mut c = connect_tls(tls_addr(&s), "a.test", &cfg).unwrap();
                let (st, _, body) = request(&mut c, "a.test", "/v");
                assert_eq!(st, 200);
                let body = String::from_utf8(body).unwrap();
                let f: Vec<String> = body.split('|').map(str::to_string).collect();
                assert_eq!(f.len(), 4, "{body}");
                f
            };
            let first = ask();
            let what = format!("{tag} {versions:?}: {first:?}");
            assert_eq!(first[0].len(), 64, "{what}");
            assert!(first[0].bytes().all(|b| b.is_ascii_hexdigit()), "{what}");
            assert_eq!(first[3], ".", "{what}");
            // rustls offers these; the names are OpenSSL's.
            assert!(
                first[1]
                    .split(':')
                    .any(|c| c == "TLS_AES_128_GCM_SHA256" || c == "ECDHE-RSA-AES128-GCM-SHA256"),
                "{what}"
            );
            assert!(first[2].split(':').any(|c| c == "X25519"), "{what}");
            let again = ask();
            assert_eq!(again[3], "r", "{what} then {again:?}");
            assert_eq!(again[0], first[0], "{what} then {again:?}");
            // Past the timeout: a new session with a new id.
            std::thread::sleep(Duration::from_millis(2100));
            let late = ask();
            assert_eq!(late[3], ".", "{what} then {late:?}");
            assert_ne!(late[0], first[0], "{what} then {late:?}");
        }
    }
}

#[test]
fn bad_certificates_fail_the_test_and_a_reload_keeps_the_old_generation() {
    let (s, p) = start("tls-bad", 1, "", "");
    let conf_path = s.dir.join("conf/shard.conf");
    let good = std::fs::read_to_string(&conf_path).unwrap();
    let test = |text: &str| {
        std::fs::write(&conf_path, text).unwrap();
        run_cli(&[
            "-t",
            "-p",
            s.dir.to_str().unwrap(),
            "-c",
            conf_path.to_str().unwrap(),
        ])
    };
    // A missing key file, a key of another certificate, an ssl listener without certificate.
    let a_key = p.dir.join("conf/a.test.key");
    let b_key = p.dir.join("conf/b.test.key");
    let (code, err) = test(&good.replace(a_key.to_str().unwrap(), "/nonexistent/a.key"));
    assert_eq!(code, 1);
    assert!(
        err.contains("cannot load certificate key \"/nonexistent/a.key\""),
        "{err}"
    );
    let (code, err) = test(&good.replacen(a_key.to_str().unwrap(), b_key.to_str().unwrap(), 1));
    assert_eq!(code, 1);
    assert!(err.contains("does not match certificate"), "{err}");
    let no_cert = good.replacen(
        &format!(
            "ssl_certificate {}; ssl_certificate_key {};",
            p.dir.join("conf/a.test.pem").display(),
            a_key.display()
        ),
        "",
        1,
    );
    let (code, err) = test(&no_cert);
    assert_eq!(code, 1);
    assert!(
        err.contains("no \"ssl_certificate\" is defined for the \"listen ... ssl\" directive"),
        "{err}"
    );

    // A "must-staple" certificate: shard staples nothing, so it is refused.
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let mut params = rcgen::CertificateParams::new(vec!["a.test".to_string()]).unwrap();
    params
        .custom_extensions
        .push(rcgen::CustomExtension::from_oid_content(
            &[1, 3, 6, 1, 5, 5, 7, 1, 24],
            vec![0x30, 0x03, 0x02, 0x01, 0x05],
        ));
    let staple = params.self_signed(&key).unwrap();
    std::fs::write(p.dir.join("conf/staple.pem"), staple.pem()).unwrap();
    std::fs::write(p.dir.join("conf/staple.key"), key.serialize_pem()).unwrap();
    let (code, err) = test(
        &good
            .replace(
                p.dir.join("conf/a.test.pem").to_str().unwrap(),
                p.dir.join("conf/staple.pem").to_str().unwrap(),
            )
            .replace(
                a_key.to_str().unwrap(),
                p.dir.join("conf/staple.key").to_str().unwrap(),
            ),
    );
    assert_eq!(code, 1);
    assert!(
        err.contains("requires OCSP stapling (\"must-staple\")"),
        "{err}"
    );

    // A reload with the broken key keeps serving with the running configuration.
    std::fs::write(
        &conf_path,
        good.replace(a_key.to_str().unwrap(), "/nonexistent/a.key"),
    )
    .unwrap();
    let before = s.workers();
    s.signal(libc::SIGHUP);
    wait_for(TIMEOUT, "the reload to fail", || {
        std::fs::read_to_string(s.dir.join("logs/error.log"))
            .ok()?
            .contains("reload failed: keeping the running configuration")
            .then_some(())
    });
    assert_eq!(s.workers()[0].pid, before[0].pid);
    let cfg = client_config(&p.ca, &[&rustls::version::TLS13]);
    let mut c = connect_tls(tls_addr(&s), "b.test", &cfg).unwrap();
    assert_eq!(request(&mut c, "b.test", "/").0, 200);
}

#[test]
fn hostile_handshakes_are_closed_and_no_worker_dies() {
    let (s, p) = start("tls-hostile", 1, "", "client_header_timeout 1s;");
    let pid = s.workers()[0].pid;
    // A truncated ClientHello, then silence: closed at client_header_timeout.
    let mut c = connect(tls_addr(&s));
    c.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01])
        .unwrap();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let t0 = std::time::Instant::now();
    let mut b = [0u8; 64];
    assert_eq!(c.read(&mut b).unwrap_or(0), 0);
    assert!(t0.elapsed() < Duration::from_secs(4), "{:?}", t0.elapsed());
    // A record of garbage: an alert or a close, never a hang.
    let mut c = connect(tls_addr(&s));
    c.write_all(&[0x16, 0x03, 0x03, 0x00, 0x05, 1, 2, 3, 4, 5])
        .unwrap();
    let mut got = Vec::new();
    let _ = c.read_to_end(&mut got);
    assert!(got.len() < 64, "at most an alert: {got:?}");
    // Garbage after a good handshake.
    let cfg = client_config(&p.ca, &[&rustls::version::TLS13]);
    let mut t = connect_tls(tls_addr(&s), "b.test", &cfg).unwrap();
    t.sock.write_all(&[0x17, 0x03, 0x03, 0x00, 0x10]).unwrap();
    t.sock.write_all(&[0xAB; 16]).unwrap();
    let mut rest = Vec::new();
    let _ = t.sock.read_to_end(&mut rest);
    // The worker lives and serves.
    let mut t = connect_tls(tls_addr(&s), "b.test", &cfg).unwrap();
    assert_eq!(request(&mut t, "b.test", "/").0, 200);
    assert_eq!(s.workers()[0].pid, pid);
}

#[test]
fn websocket_through_a_tls_front() {
    let up = ws::echo_server(false).unwrap();
    let extra = format!(
        "location /ws/ {{ proxy_pass http://{up}; proxy_http_version 1.1; \
         proxy_set_header Upgrade $http_upgrade; proxy_set_header Connection \"upgrade\"; }}"
    );
    let (s, p) = start("tls-ws", 1, &extra, "");
    let cfg = client_config(&p.ca, &[&rustls::version::TLS13]);
    let mut c = connect_tls(tls_addr(&s), "a.test", &cfg).unwrap();
    websocket_echoes(&mut c);
}

/// Upgrades `c` at `/ws/x` and sends two messages (a small one, a 200 KB one) through an
/// echo server behind it.
fn websocket_echoes(c: &mut (impl Read + Write)) {
    c.write_all(
        b"GET /ws/x HTTP/1.1\r\nHost: a.test\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
          Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
    )
    .unwrap();
    let (st, head, _) = read_one(c);
    assert_eq!(st, 101, "{head}");
    for msg in [&b"over tls"[..], &vec![7u8; 200_000][..]] {
        let mut frame = Vec::new();
        ws::encode(&mut frame, ws::OP_BINARY, msg, Some([1, 2, 3, 4]));
        c.write_all(&frame).unwrap();
        let mut buf = Vec::new();
        let f = loop {
            if let Some((f, _)) = ws::decode(&buf).unwrap() {
                break f;
            }
            let mut b = [0u8; 16384];
            let n = c.read(&mut b).unwrap();
            assert!(n > 0);
            buf.extend_from_slice(&b[..n]);
        };
        assert_eq!(f.payload, msg);
    }
}

/// A WebSocket from a plain front to an `https://` upstream (shard's own TLS server, in
/// front of the echo server): the tunnel's upstream side is TLS.
#[test]
fn websocket_to_an_https_upstream() {
    let up = ws::echo_server(false).unwrap();
    let dir = temp_dir("tls-ws-up").keep();
    pki(&dir, &["a.test"]);
    let ws_loc = |to: String| {
        format!(
            "location /ws/ {{ proxy_pass {to}; proxy_http_version 1.1; \
             proxy_set_header Upgrade $http_upgrade; proxy_set_header Connection \"upgrade\"; }}"
        )
    };
    let text = format!(
        "worker_processes 1;\nerror_log logs/error.log info;\npid logs/shard.pid;\nevents {{}}\n\
         http {{\n\
         server {{ listen 127.0.0.1:{{port}}; location = /status {{ shard_status; }} {front} }}\n\
         server {{ listen 127.0.0.1:{{port1}} ssl; ssl_certificate {cert}; \
         ssl_certificate_key {key}; {back} }}\n\
         }}\n",
        front = ws_loc("https://127.0.0.1:{port1}".to_string()),
        back = ws_loc(format!("http://{up}")),
        cert = dir.join("conf/a.test.pem").display(),
        key = dir.join("conf/a.test.key").display(),
    );
    let s = Server::start_ports("tls-ws-up", &text, 1, 1);
    let mut c = connect(s.addr());
    c.set_read_timeout(Some(TIMEOUT)).unwrap();
    websocket_echoes(&mut c);
}

/// `openssl s_client -connect 127.0.0.1:PORT ARGS` sending one `GET /` to `host` with
/// `Connection: close`; its standard output and error.
fn s_client(port: u16, args: &[&str], host: &str) -> (String, String) {
    let mut child = std::process::Command::new("openssl")
        .args(["s_client", "-connect"])
        .arg(format!("127.0.0.1:{port}"))
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let request = format!("GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(request.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn have(tool: &str) -> bool {
    std::process::Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

#[test]
fn curl_and_openssl_interoperate() {
    let (s, _) = start("tls-interop", 1, "", "");
    let ca_pem = s.dir.join("ca.pem");
    // The CA is not written by `pki`: trust the leaves' issuer through curl's -k and check
    // negotiation only.
    let _ = ca_pem;
    write_file(&s.dir, "html/index.html", b"curl ok\n");
    let port = s.ports[0];
    if have("curl") {
        let out = std::process::Command::new("curl")
            .args(["-sk", "--http1.1", "--resolve"])
            .arg(format!("a.test:{port}:127.0.0.1"))
            .arg(format!("https://a.test:{port}/index.html"))
            .args(["-w", "\n%{http_code} %{ssl_verify_result}"])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.starts_with("curl ok\n\n200"), "{text}");
        let out = std::process::Command::new("curl")
            .args(["-sk", "--tlsv1.2", "--tls-max", "1.2", "--resolve"])
            .arg(format!("a.test:{port}:127.0.0.1"))
            .arg(format!("https://a.test:{port}/index.html"))
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout), "curl ok\n");
    } else {
        skipped(
            "curl over TLS",
            "curl is not installed (apt-get install curl)",
        );
    }
    if have("openssl") {
        let (text, _) = s_client(
            port,
            &["-servername", "b.test", "-tls1_2", "-alpn", "http/1.1"],
            "b.test",
        );
        assert!(
            text.contains("Protocol  : TLSv1.2") || text.contains("TLSv1.2"),
            "{text}"
        );
        assert!(text.contains("ALPN protocol: http/1.1"), "{text}");
        assert!(
            text.contains("subject=CN = rcgen self signed cert")
                || text.contains("b.test")
                || text.contains("Certificate chain"),
            "{text}"
        );
    } else {
        skipped(
            "openssl s_client",
            "openssl is not installed (apt-get install openssl)",
        );
    }
}

/// Python's `ssl` (OpenSSL 3) as a strict client: certificate and host name checked against
/// the test CA, SNI, resumption on both protocols (across 2 workers), and no end of stream
/// without close_notify (`suppress_ragged_eofs=False` turns that into an error).
const PYTHON_CLIENT: &str = r#"
import socket, ssl, sys
port, ca = int(sys.argv[1]), sys.argv[2]
def get(ctx, host, sess=None):
    s = ctx.wrap_socket(socket.create_connection(("127.0.0.1", port)), server_hostname=host,
                        session=sess, suppress_ragged_eofs=False)
    s.sendall(b"GET / HTTP/1.1\r\nHost: " + host.encode() + b"\r\nConnection: close\r\n\r\n")
    d = b""
    while True:
        x = s.recv(65536)
        if not x:
            break
        d += x
    head, body = d.split(b"\r\n\r\n", 1)
    print(host, s.version(), s.session_reused, head.split(b"\r\n")[0].decode(), body.decode().strip())
    sess = s.session
    s.close()
    return sess
ctx = ssl.create_default_context(cafile=ca)
get(ctx, "b.test", get(ctx, "b.test"))
ctx12 = ssl.create_default_context(cafile=ca)
ctx12.maximum_version = ssl.TLSVersion.TLSv1_2
get(ctx12, "a.test", get(ctx12, "a.test"))
"#;

#[test]
fn python_ssl_and_openssl_resume_verify_and_see_close_notify() {
    let (s, p) = start("tls-python", 2, "", "");
    write_file(&s.dir, "html/index.html", b"a index\n");
    let port = s.ports[0];
    let ca = p.dir.join("conf/ca.pem");
    if have("python3") {
        let out = std::process::Command::new("python3")
            .arg("-c")
            .arg(PYTHON_CLIENT)
            .arg(port.to_string())
            .arg(&ca)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            text,
            "b.test TLSv1.3 False HTTP/1.1 200 OK b\n\
             b.test TLSv1.3 True HTTP/1.1 200 OK b\n\
             a.test TLSv1.2 False HTTP/1.1 200 OK a index\n\
             a.test TLSv1.2 True HTTP/1.1 200 OK a index\n"
        );
    } else {
        skipped(
            "Python's ssl",
            "python3 is not installed (apt-get install python3)",
        );
    }
    if !have("openssl") {
        skipped(
            "openssl s_client resumption",
            "openssl is not installed (apt-get install openssl)",
        );
        return;
    }
    // `-sess_out` then `-sess_in`, on each protocol: the second connection is resumed.
    let sess = s.dir.join("sess.pem");
    for (flag, proto) in [("-tls1_3", "TLSv1.3"), ("-tls1_2", "TLSv1.2")] {
        for (arg, want) in [("-sess_out", "New, "), ("-sess_in", "Reused, ")] {
            let (text, err) = s_client(
                port,
                &[
                    "-servername",
                    "a.test",
                    "-CAfile",
                    ca.to_str().unwrap(),
                    flag,
                    "-ign_eof",
                    arg,
                    sess.to_str().unwrap(),
                ],
                "a.test",
            );
            assert!(text.contains(&format!("{want}{proto}")), "{arg}: {text}");
            assert!(text.contains("Verify return code: 0 (ok)"), "{text}");
            assert!(text.contains("a index"), "{text}");
            assert!(!err.contains("unexpected eof"), "no close_notify: {err}");
        }
    }
}

#[test]
fn pipelined_requests_and_proxied_bodies_cross_tls() {
    let up = Upstream::start(|r| Reply::text(200, &format!("got {} bytes", r.body.len())));
    let extra = format!(
        "location /up/ {{ proxy_pass http://127.0.0.1:{}; client_max_body_size 8m; }}\n\
         location /stream/ {{ proxy_pass http://127.0.0.1:{}; client_max_body_size 8m; \
         proxy_request_buffering off; }}",
        up.port, up.port
    );
    let (s, p) = start("tls-bodies", 1, &extra, "");
    write_file(&s.dir, "html/p.txt", b"pipelined\n");
    let cfg = client_config(&p.ca, &[&rustls::version::TLS13]);
    let mut c = connect_tls(tls_addr(&s), "a.test", &cfg).unwrap();
    // Three requests in one write: three answers, in order.
    c.write_all(
        b"GET /p.txt HTTP/1.1\r\nHost: a.test\r\n\r\nGET /p.txt HTTP/1.1\r\nHost: a.test\r\n\r\n\
          GET /p.txt HTTP/1.1\r\nHost: a.test\r\n\r\n",
    )
    .unwrap();
    let mut buf = Vec::new();
    let mut b = [0u8; 16384];
    while parse_responses(&buf).len() < 3 {
        let n = c.read(&mut b).unwrap();
        assert!(n > 0);
        buf.extend_from_slice(&b[..n]);
    }
    for r in parse_responses(&buf) {
        assert_eq!((r.status, r.body.as_slice()), (200, &b"pipelined\n"[..]));
    }
    // Request bodies through TLS to the upstream, buffered (past the memory buffer, so
    // spooled) and streamed, on the same kept-alive connection.
    let body = vec![b'q'; 3 << 20];
    for path in ["/up/x", "/stream/x"] {
        write!(
            c,
            "POST {path} HTTP/1.1\r\nHost: a.test\r\nContent-Length: {}\r\n\r\n",
            body.len()
        )
        .unwrap();
        c.write_all(&body).unwrap();
        let (st, head, got) = read_one(&mut c);
        assert_eq!(st, 200, "{path}: {head}");
        assert_eq!(
            got,
            format!("got {} bytes", body.len()).as_bytes(),
            "{path}"
        );
    }
}

#[test]
fn stream_terminates_tls_in_front_of_a_tcp_upstream() {
    // A TCP echo upstream.
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let up = l.local_addr().unwrap();
    let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = accepted.clone();
    std::thread::spawn(move || {
        for mut s in l.incoming().flatten() {
            count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            std::thread::spawn(move || {
                let mut b = vec![0u8; 65536];
                loop {
                    match s.read(&mut b) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            if s.write_all(&b[..n]).is_err() {
                                return;
                            }
                        }
                    }
                }
                let _ = s.shutdown(std::net::Shutdown::Write);
            });
        }
    });
    let dir = temp_dir("tls-stream-pki").keep();
    let p = pki(&dir, &["s.test"]);
    let conf = format!(
        "worker_processes 1;\nerror_log logs/error.log info;\nevents {{}}\n\
         http {{ access_log off; server {{ listen 127.0.0.1:{{port}}; \
         location = /status {{ shard_status; }} }} }}\n\
         stream {{ server {{ listen 127.0.0.1:{{port1}} ssl; \
         ssl_certificate {}; ssl_certificate_key {}; proxy_pass {up}; }} }}\n",
        dir.join("conf/s.test.pem").display(),
        dir.join("conf/s.test.key").display()
    );
    let s = Server::start_ports("tls-stream", &conf, 1, 1);
    // A client that never finishes a handshake costs the upstream nothing: it is contacted
    // after the handshake, as nginx does.
    let mut idle = connect(tls_addr(&s));
    idle.write_all(&[0x16, 0x03, 0x01]).unwrap();
    let cfg = client_config(&p.ca, &[&rustls::version::TLS13, &rustls::version::TLS12]);
    let mut c = connect_tls(tls_addr(&s), "s.test", &cfg).unwrap();
    // No ALPN on a TCP relay; bytes both ways, then the client's close_notify and FIN end it.
    assert_eq!(c.conn.alpn_protocol(), None);
    let data: Vec<u8> = (0..1 << 20).map(|i: u32| (i % 253) as u8).collect();
    c.write_all(&data).unwrap();
    let mut got = vec![0u8; data.len()];
    c.read_exact(&mut got).unwrap();
    assert!(got == data, "1 MiB echoed through TLS and the relay");
    assert_eq!(
        accepted.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "the unfinished handshake opened no upstream connection"
    );
    drop(idle);
    c.conn.send_close_notify();
    c.flush().unwrap();
    c.sock.shutdown(std::net::Shutdown::Write).unwrap();
    let mut rest = Vec::new();
    let _ = c.read_to_end(&mut rest);
    assert!(rest.is_empty());
}

#[test]
fn a_response_that_closes_the_connection_ends_whole_over_tls() {
    // HTTP/1.0: the connection closes after the response; the last records rustls holds
    // when the socket is full must still go out before it does.
    // Without lingering, nothing else flushes before the close.
    let (s, p) = start("tls-close", 1, "lingering_close off;", "");
    let big: Vec<u8> = (0..16u32 << 20).map(|i| (i % 241) as u8).collect();
    write_file(&s.dir, "html/big.bin", &big);
    let cfg = client_config(&p.ca, &[&rustls::version::TLS13]);
    for _ in 0..3 {
        let mut c = connect_tls(tls_addr(&s), "a.test", &cfg).unwrap();
        c.write_all(b"GET /big.bin HTTP/1.0\r\nHost: a.test\r\n\r\n")
            .unwrap();
        let mut all = Vec::new();
        let mut b = vec![0u8; 4096];
        loop {
            match c.read(&mut b) {
                Ok(0) => break,
                Ok(n) => all.extend_from_slice(&b[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => break,
                Err(e) => panic!("{e}"),
            }
        }
        let end = find(&all, b"\r\n\r\n").unwrap() + 4;
        assert_eq!(
            all.len() - end,
            big.len(),
            "the whole body before the close"
        );
        assert!(all[end..] == big[..]);
    }
}

#[test]
fn a_shared_ticket_key_file_resumes_across_servers() {
    // Two shard instances (two machines behind a balancer) given the same key file.
    let key_dir = temp_dir("tls-ticket-key").keep();
    let key = key_dir.join("ticket.key");
    std::fs::write(&key, (0..80u8).collect::<Vec<u8>>()).unwrap();
    let extra = format!("ssl_session_ticket_key {};", key.display());
    let (s1, p1) = start("tls-key-1", 1, "", &extra);
    // The second machine has the same certificates (a session resumes only under the
    // certificates it was made with, as nginx's session ID context), on its own ports.
    let text = std::fs::read_to_string(s1.dir.join("conf/shard.conf"))
        .unwrap()
        .replace(&s1.ports[0].to_string(), "{port1}")
        .replace(&s1.port.to_string(), "{port}")
        .replace(s1.dir.to_str().unwrap(), "{dir}");
    let s2 = Server::start_ports("tls-key-2", &text, 1, 1);
    let cfg = client_config(&p1.ca, &[&rustls::version::TLS13]);
    let mut c = connect_tls(tls_addr(&s1), "b.test", &cfg).unwrap();
    assert_eq!(request(&mut c, "b.test", "/").0, 200);
    let mut c2 = connect_tls(tls_addr(&s2), "b.test", &cfg).expect("resumed on the other server");
    assert_eq!(
        c2.conn.handshake_kind(),
        Some(rustls::HandshakeKind::Resumed)
    );
    assert_eq!(request(&mut c2, "b.test", "/").0, 200);
    let _ = std::fs::remove_dir_all(&key_dir);
}

/// `proxy_pass https://`: shard's own TLS server (`a.test`, in front of an echo upstream) as
/// the upstream of a plain front. nginx's defaults (no verification, no SNI), pooled
/// connections that keep their session, SNI and `proxy_ssl_name`, verification against
/// `proxy_ssl_trusted_certificate` (and its failure), TLS 1.2 only, and request bodies in
/// memory and from a temporary file.
#[test]
fn proxy_pass_https_speaks_tls_to_the_upstream() {
    let echo = Upstream::start(|_| Reply::Echo);
    let dir = temp_dir("tls-upstream").keep();
    let p = pki(&dir, &["a.test"]);
    let ca = p.dir.join("conf/ca.pem");
    let text = format!(
        "worker_processes 1;\n\
         error_log logs/error.log info;\n\
         pid logs/shard.pid;\n\
         events {{}}\n\
         http {{\n\
         upstream tls_up {{ server 127.0.0.1:{{port1}}; keepalive 4; }}\n\
         server {{\n\
           listen 127.0.0.1:{{port1}} ssl;\n\
           server_name a.test;\n\
           ssl_certificate {cert}; ssl_certificate_key {key};\n\
           location = /sni {{ return 200 \"sni=$ssl_server_name $ssl_protocol\"; }}\n\
           location / {{ proxy_pass http://{echo}; }}\n\
         }}\n\
         server {{\n\
           listen 127.0.0.1:{{port}};\n\
           client_body_buffer_size 8k;\n\
           location = /status {{ shard_status; }}\n\
           location /plain/ {{ proxy_pass https://127.0.0.1:{{port1}}/; }}\n\
           location /pool/ {{ proxy_pass https://tls_up/; proxy_http_version 1.1;\n\
                             proxy_set_header Connection \"\"; }}\n\
           location /pool-wrong/ {{ proxy_pass https://tls_up/; proxy_http_version 1.1;\n\
                                   proxy_set_header Connection \"\"; proxy_ssl_verify on;\n\
                                   proxy_ssl_trusted_certificate {ca}; proxy_ssl_name b.test; }}\n\
           location /sni-on/ {{ proxy_pass https://127.0.0.1:{{port1}}/;\n\
                               proxy_ssl_server_name on; proxy_ssl_name a.test; }}\n\
           location /verified/ {{ proxy_pass https://127.0.0.1:{{port1}}/; proxy_ssl_verify on;\n\
                                 proxy_ssl_trusted_certificate {ca}; proxy_ssl_name a.test; }}\n\
           location /wrong-name/ {{ proxy_pass https://127.0.0.1:{{port1}}/; proxy_ssl_verify on;\n\
                                   proxy_ssl_trusted_certificate {ca}; proxy_ssl_name b.test; }}\n\
           location /streamed/ {{ proxy_pass https://127.0.0.1:{{port1}}/;\n\
                                 proxy_request_buffering off; proxy_http_version 1.1; }}\n\
           location /tls12/ {{ proxy_pass https://127.0.0.1:{{port1}}/;\n\
                              proxy_ssl_protocols TLSv1.2; }}\n\
         }}\n\
         }}\n",
        cert = dir.join("conf/a.test.pem").display(),
        key = dir.join("conf/a.test.key").display(),
        ca = ca.display(),
        echo = echo.addr(),
    );
    let s = Server::start_ports("tls-upstream", &text, 1, 1);
    let front = s.addr();
    // nginx's defaults: no SNI, no verification (the test CA is nobody's).
    let r = get(front, "/plain/sni");
    assert_eq!((r.status, r.body_str().as_str()), (200, "sni= TLSv1.3"));
    let r = get(front, "/sni-on/sni");
    assert_eq!(r.body_str(), "sni=a.test TLSv1.3");
    let r = get(front, "/tls12/sni");
    assert_eq!(r.body_str(), "sni= TLSv1.2");
    let r = get(front, "/verified/sni");
    assert_eq!(r.status, 200);
    let r = get(front, "/wrong-name/sni");
    assert_eq!(r.status, 502);
    let log = std::fs::read_to_string(s.dir.join("logs/error.log")).unwrap();
    assert!(
        log.contains("SSL_do_handshake() failed")
            && log.contains("while SSL handshaking to upstream"),
        "{log}"
    );
    // Bodies: in memory, from a temporary file (over client_body_buffer_size), and streamed
    // as they arrive (where the upstream's session ticket must not pass for its answer).
    for (loc, len) in [
        ("plain", 100usize),
        ("plain", 300 * 1024),
        ("streamed", 100),
        ("streamed", 300 * 1024),
    ] {
        let body: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        let mut req = format!(
            "POST /{loc}/echo HTTP/1.1\r\nHost: x\r\nContent-Length: {len}\r\nConnection: close\r\n\r\n"
        )
        .into_bytes();
        req.extend_from_slice(&body);
        let r = raw(front, &req);
        assert_eq!(r.status, 200);
        assert!(r.body == body, "{loc}: {len} bytes echoed through TLS");
    }
    // Pooled connections: 20 requests, far fewer handshakes.
    let before = status_field(&s, "tls_handshakes");
    for _ in 0..20 {
        let r = get(front, "/pool/sni");
        assert_eq!(r.body_str(), "sni= TLSv1.3");
    }
    let made = status_field(&s, "tls_handshakes") - before;
    assert!(made <= 4, "{made} handshakes for 20 pooled requests");
    // A location that verifies never takes a pooled connection that was not verified.
    assert_eq!(get(front, "/pool-wrong/sni").status, 502);
}

/// `proxy_ssl_*` mistakes fail `-t` in nginx's words.
#[test]
fn proxy_ssl_mistakes_fail_the_test_as_nginx() {
    let dir = temp_dir("tls-proxy-t");
    let cases = [
        (
            "proxy_ssl_verify on;",
            "no proxy_ssl_trusted_certificate for proxy_ssl_verify in",
        ),
        (
            "proxy_ssl_certificate /nonexistent/c.pem;",
            "no \"proxy_ssl_certificate_key\" is defined for certificate \"/nonexistent/c.pem\" in",
        ),
        (
            "proxy_ssl_verify on; proxy_ssl_trusted_certificate /nonexistent/ca.pem;",
            "cannot load certificate \"/nonexistent/ca.pem\"",
        ),
        (
            "proxy_ssl_protocols TLSv1;",
            "names no protocol shard speaks",
        ),
        ("proxy_ssl_name $nx_var;", "unknown \"nx_var\" variable"),
        (
            "} ssl_session_cache shared:Z:2m; } server { listen 127.0.0.1:2; \
             ssl_session_cache shared:Z:1m; location /a {",
            "the size 1048576 of shared memory zone \"Z\" conflicts with already declared size 2097152",
        ),
        (
            // A server with certificates (one without is not checked further, as nginx).
            "} ssl_certificate /nonexistent/c.pem; ssl_certificate_key /nonexistent/c.key; \
             ssl_verify_client on; location /y {",
            "no ssl_client_certificate for ssl_verify_client in",
        ),
        (
            "} location /x { ssl_verify_client on;",
            "\"ssl_verify_client\" directive is not allowed here",
        ),
    ];
    for (extra, want) in cases {
        let conf = dir.join("t.conf");
        std::fs::write(
            &conf,
            format!(
                "events {{}}\nhttp {{ server {{ listen 127.0.0.1:1;\n\
                 location / {{ proxy_pass https://127.0.0.1:8443; {extra} }} }} }}\n"
            ),
        )
        .unwrap();
        let (code, out) = run_cli(&["-t", "-c", conf.to_str().unwrap()]);
        assert_ne!(code, 0, "{extra}: {out}");
        assert!(out.contains(want), "{extra}: {out}");
    }
}

/// stream's `proxy_ssl on`: plain TCP in, TLS to the upstream (shard's own TLS server in
/// front of an echo upstream). No SNI by default, SNI with `proxy_ssl_name`, a 1 MiB body
/// both ways with the client's half-close passed on, and a failed verification closing the
/// client with nginx's log words.
#[test]
fn stream_proxy_ssl_speaks_tls_to_the_upstream() {
    let echo = Upstream::start(|_| Reply::Echo);
    let dir = temp_dir("tls-stream-up").keep();
    let p = pki(&dir, &["a.test"]);
    let ca = p.dir.join("conf/ca.pem");
    let text = format!(
        "worker_processes 1;\n\
         error_log logs/error.log info;\n\
         pid logs/shard.pid;\n\
         events {{}}\n\
         http {{\n\
         server {{ listen 127.0.0.1:{{port}}; location = /status {{ shard_status; }} }}\n\
         server {{\n\
           listen 127.0.0.1:{{port1}} ssl;\n\
           ssl_certificate {cert}; ssl_certificate_key {key};\n\
           location = /sni {{ return 200 \"sni=$ssl_server_name\"; }}\n\
           location / {{ proxy_ignore_client_abort on; proxy_pass http://{echo}; }}\n\
         }}\n\
         server {{\n\
           listen 127.0.0.1:{{port5}} ssl proxy_protocol;\n\
           ssl_certificate {cert}; ssl_certificate_key {key};\n\
           location / {{ return 200 \"pp=$proxy_protocol_addr\"; }}\n\
         }}\n\
         }}\n\
         stream {{\n\
         proxy_ssl on;\n\
         proxy_half_close on;\n\
         server {{ listen 127.0.0.1:{{port6}}; proxy_pass 127.0.0.1:{{port5}}; proxy_protocol on; }}\n\
         server {{ listen 127.0.0.1:{{port2}}; proxy_pass 127.0.0.1:{{port1}}; }}\n\
         server {{ listen 127.0.0.1:{{port7}}; proxy_pass 127.0.0.1:{{port1}};\n\
                  proxy_ssl_server_name on; proxy_ssl_name x${{server_port}}x; }}\n\
         server {{ listen 127.0.0.1:{{port8}}; proxy_pass 127.0.0.1:{{port1}};\n\
                  proxy_ssl_server_name on; proxy_ssl_name a.test:123; }}\n\
         server {{ listen 127.0.0.1:{{port3}}; proxy_pass 127.0.0.1:{{port1}};\n\
                  proxy_ssl_server_name on; proxy_ssl_name a.test; }}\n\
         server {{ listen 127.0.0.1:{{port4}}; proxy_pass 127.0.0.1:{{port1}};\n\
                  proxy_ssl_verify on; proxy_ssl_trusted_certificate {ca};\n\
                  proxy_ssl_name b.test; }}\n\
         }}\n",
        cert = dir.join("conf/a.test.pem").display(),
        key = dir.join("conf/a.test.key").display(),
        ca = ca.display(),
        echo = echo.addr(),
    );
    let s = Server::start_ports("tls-stream-up", &text, 1, 8);
    let at = |i: usize| SocketAddr::from(([127, 0, 0, 1], s.ports[i]));
    let sni = |addr| {
        raw(
            addr,
            b"GET /sni HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        )
        .body_str()
    };
    assert_eq!(sni(at(1)), "sni=");
    // `proxy_protocol on` with `proxy_ssl on`: the header goes in plain text before the
    // handshake (nginx's stream_proxy_protocol_ssl.t).
    assert_eq!(sni(at(5)), "pp=127.0.0.1");
    assert_eq!(sni(at(2)), "sni=a.test");
    // `proxy_ssl_name` with variables, rendered per session; a port in the name is dropped.
    assert_eq!(sni(at(6)), format!("sni=x{}x", s.ports[6]));
    assert_eq!(sni(at(7)), "sni=a.test");
    // 1 MiB up and back; the client's FIN after the request reaches the upstream as
    // close_notify and FIN, and the answer still comes back (the HTTP side has
    // `proxy_ignore_client_abort on`: by default it would take the FIN as a client that left,
    // as nginx).
    let body: Vec<u8> = (0..1 << 20).map(|i: u32| (i % 253) as u8).collect();
    let mut c = connect(at(1));
    c.set_read_timeout(Some(TIMEOUT)).unwrap();
    let mut req = format!(
        "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    req.extend_from_slice(&body);
    let writer = {
        let mut w = c.try_clone().unwrap();
        std::thread::spawn(move || {
            w.write_all(&req).unwrap();
            w.shutdown(std::net::Shutdown::Write).unwrap();
        })
    };
    let (status, _, got) = read_one(&mut c);
    writer.join().unwrap();
    assert_eq!(status, 200);
    assert!(got == body, "1 MiB echoed through the relay's TLS");
    // Verification fails: the client is closed, nothing relayed.
    let mut c = connect(at(3));
    c.set_read_timeout(Some(TIMEOUT)).unwrap();
    let _ = c.write_all(b"GET /sni HTTP/1.1\r\nHost: x\r\n\r\n");
    let mut got = Vec::new();
    let _ = c.read_to_end(&mut got);
    assert!(got.is_empty(), "{}", String::from_utf8_lossy(&got));
    let line = wait_for(TIMEOUT, "the handshake failure", || {
        std::fs::read_to_string(s.dir.join("logs/error.log"))
            .ok()?
            .lines()
            .find(|l| l.contains("SSL_do_handshake() failed"))
            .map(str::to_string)
    });
    assert!(
        line.contains("while SSL handshaking to upstream, client: 127.0.0.1"),
        "{line}"
    );
}

/// A CA for client certificates (written to `conf/clients.pem`) and the clients it signs.
struct ClientCa {
    ca: rcgen::Certificate,
    key: rcgen::KeyPair,
}

impl ClientCa {
    fn new(dir: &Path) -> ClientCa {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "clients CA");
        let ca = params.self_signed(&key).unwrap();
        std::fs::write(dir.join("conf/clients.pem"), ca.pem()).unwrap();
        ClientCa { ca, key }
    }

    /// A client trusting `server_ca` with the certificate `O=shard tests, CN=client one`
    /// (serial 019A), signed by this CA or by itself.
    fn client(
        &self,
        server_ca: &CertificateDer<'static>,
        signed_by_ca: bool,
    ) -> Arc<rustls::ClientConfig> {
        let how = if signed_by_ca {
            Signed::ByCa
        } else {
            Signed::BySelf
        };
        self.client_as(server_ca, how)
    }

    fn client_as(
        &self,
        server_ca: &CertificateDer<'static>,
        how: Signed,
    ) -> Arc<rustls::ClientConfig> {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, "shard tests");
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "client one");
        params.serial_number = Some(rcgen::SerialNumber::from(vec![0x01, 0x9a]));
        let mut chain = Vec::new();
        let cert = match how {
            Signed::ByCa => params.signed_by(&key, &self.ca, &self.key).unwrap(),
            Signed::BySelf => params.self_signed(&key).unwrap(),
            Signed::Expired => {
                params.not_before = rcgen::date_time_ymd(2020, 1, 1);
                params.not_after = rcgen::date_time_ymd(2021, 1, 1);
                params.signed_by(&key, &self.ca, &self.key).unwrap()
            }
            Signed::ViaIntermediate => {
                let ikey = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
                let mut ip = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
                ip.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
                ip.distinguished_name = rcgen::DistinguishedName::new();
                ip.distinguished_name
                    .push(rcgen::DnType::CommonName, "clients intermediate");
                let inter = ip.signed_by(&ikey, &self.ca, &self.key).unwrap();
                let cert = params.signed_by(&key, &inter, &ikey).unwrap();
                chain.push(inter.der().clone());
                cert
            }
        };
        chain.insert(0, cert.der().clone());
        let der = rustls::pki_types::PrivateKeyDer::try_from(key.serialize_der()).unwrap();
        let mut roots = rustls::RootCertStore::empty();
        roots.add(server_ca.clone()).unwrap();
        let c = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, der)
        .unwrap();
        Arc::new(c)
    }
}

/// How [`ClientCa::client_as`] makes the client's certificate.
enum Signed {
    ByCa,
    BySelf,
    /// By the CA, valid in 2020 only.
    Expired,
    /// By an intermediate the CA signed, sent along.
    ViaIntermediate,
}

/// `ssl_verify_client`: a client certificate from the CA passes with the `$ssl_client_*`
/// variables; none is nginx's 496 and one from elsewhere 495 (both a 400 page, then a
/// close); `optional_no_ca` lets an unknown issuer through and says so; a server that asks
/// for none sees `NONE` on the same address.
#[test]
fn client_certificates_are_verified_as_nginx() {
    let dir = temp_dir("tls-mtls").keep();
    let p = pki(&dir, &["a.test", "b.test", "c.test", "d.test"]);
    let clients = ClientCa::new(&dir);
    let client = |signed_by_ca: bool| clients.client(&p.ca, signed_by_ca);
    let vars = "$ssl_client_verify|$ssl_client_s_dn|$ssl_client_i_dn|$ssl_client_serial|\
                $ssl_client_fingerprint";
    let pair = |n: &str| {
        format!(
            "ssl_certificate {d}/conf/{n}.pem; ssl_certificate_key {d}/conf/{n}.key;",
            d = dir.display()
        )
    };
    let text = format!(
        "worker_processes 1;\nerror_log logs/error.log info;\npid logs/shard.pid;\nevents {{}}\n\
         http {{\n\
         server {{ listen 127.0.0.1:{{port}}; location = /status {{ shard_status; }} }}\n\
         server {{ listen 127.0.0.1:{{port1}} ssl; server_name a.test; {a}\n\
           ssl_verify_client on; ssl_client_certificate {d}/conf/clients.pem;\n\
           location = /more {{ return 200 \"{more}\"; }}\n\
           location = /pem {{ return 200 \"$ssl_client_raw_cert\"; }}\n\
           location = /tabbed {{ return 200 \"$ssl_client_cert\"; }}\n\
           location = /escaped {{ return 200 \"$ssl_client_escaped_cert\"; }}\n\
           location / {{ return 200 \"{vars}\"; }} }}\n\
         server {{ listen 127.0.0.1:{{port1}} ssl; server_name b.test; {b}\n\
           location / {{ return 200 \"b $ssl_client_verify\"; }} }}\n\
         server {{ listen 127.0.0.1:{{port1}} ssl; server_name c.test; {c}\n\
           ssl_verify_client optional_no_ca;\n\
           location / {{ return 200 \"c $ssl_client_verify|$ssl_client_s_dn\"; }} }}\n\
         server {{ listen 127.0.0.1:{{port1}} ssl; server_name d.test; {dd}\n\
           ssl_verify_client on; ssl_verify_depth 2; ssl_client_certificate {d}/conf/clients.pem;\n\
           location / {{ return 200 \"{vars}\"; }} }}\n\
         }}\n",
        a = pair("a.test"),
        b = pair("b.test"),
        c = pair("c.test"),
        dd = pair("d.test"),
        more = "$ssl_session_reused|$ssl_alpn_protocol|$ssl_curve|$ssl_early_data|\
                $ssl_client_s_dn_legacy|$ssl_client_i_dn_legacy|$ssl_client_v_start|\
                $ssl_client_v_end|$ssl_client_v_remain",
        d = dir.display(),
    );
    let s = Server::start_ports("tls-mtls", &text, 1, 1);
    let good = client(true);
    let stranger = client(false);
    let anonymous = client_config(&p.ca, &[&rustls::version::TLS13]);

    let mut t = connect_tls(tls_addr(&s), "a.test", &good).unwrap();
    let (st, _, body) = request(&mut t, "a.test", "/");
    let body = String::from_utf8(body).unwrap();
    let f: Vec<&str> = body.split('|').collect();
    assert_eq!(st, 200, "{body}");
    assert_eq!(
        f[..4],
        [
            "SUCCESS",
            "CN=client one,O=shard tests",
            "CN=clients CA",
            "019A"
        ],
        "{body}"
    );
    assert!(
        f[4].len() == 40
            && f[4]
                .bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()),
        "{body}"
    );
    // Kept alive: a second request on the same connection.
    assert_eq!(request(&mut t, "a.test", "/").0, 200);
    // The other `$ssl_*` variables nginx has for a connection and its certificate (this
    // client offers no ALPN; rcgen's default validity: 1975 to 4096).
    let more = String::from_utf8(request(&mut t, "a.test", "/more").2).unwrap();
    assert_eq!(
        more,
        ".||X25519||/O=shard tests/CN=client one|/CN=clients CA|\
         Jan  1 00:00:00 1975 GMT|Jan  1 00:00:00 4096 GMT|"
            .to_string()
            + more.rsplit('|').next().unwrap(),
    );
    let days: u64 = more.rsplit('|').next().unwrap().parse().unwrap();
    assert!((750_000..760_000).contains(&days), "{more}");
    let pem = String::from_utf8(request(&mut t, "a.test", "/pem").2).unwrap();
    assert!(
        pem.starts_with("-----BEGIN CERTIFICATE-----\nMII")
            && pem.ends_with("\n-----END CERTIFICATE-----\n"),
        "{pem}"
    );
    let tabbed = String::from_utf8(request(&mut t, "a.test", "/tabbed").2).unwrap();
    assert_eq!(tabbed, pem.replace('\n', "\n\t").trim_end_matches('\t'));
    let escaped = String::from_utf8(request(&mut t, "a.test", "/escaped").2).unwrap();
    assert!(
        escaped.starts_with("-----BEGIN%20CERTIFICATE-----%0AMII") && !escaped.contains('/'),
        "{escaped}"
    );

    for (cfg, page, log) in [
        (
            &anonymous,
            "No required SSL certificate was sent",
            "client sent no required SSL certificate while reading client request headers",
        ),
        (
            &stranger,
            "The SSL certificate error",
            "client SSL certificate verify error: (18:self-signed certificate)",
        ),
    ] {
        let mut t = connect_tls(tls_addr(&s), "a.test", cfg).unwrap();
        write!(t, "GET / HTTP/1.1\r\nHost: a.test\r\n\r\n").unwrap();
        let mut all = Vec::new();
        let _ = t.read_to_end(&mut all);
        let all = String::from_utf8_lossy(&all);
        assert!(all.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{all}");
        assert!(
            all.contains(page) && all.contains("Connection: close"),
            "{all}"
        );
        let text = std::fs::read_to_string(s.dir.join("logs/error.log")).unwrap();
        assert!(text.contains(log), "{text}");
    }
    // A server on the same address that asks for nothing.
    let mut t = connect_tls(tls_addr(&s), "b.test", &good).unwrap();
    assert_eq!(request(&mut t, "b.test", "/").2, b"b NONE");
    // A Host other than the negotiated name, for a server that verifies certificates, is
    // 421 (nginx's `ngx_http_set_virtual_server`): SNI b.test, Host a.test.
    let mut t = connect_tls(tls_addr(&s), "b.test", &good).unwrap();
    let (st, _, body) = request(&mut t, "a.test", "/");
    assert_eq!(st, 421, "{}", String::from_utf8_lossy(&body));
    let text = std::fs::read_to_string(s.dir.join("logs/error.log")).unwrap();
    assert!(
        text.contains("client attempted to request the server name different from the one that was negotiated"),
        "{text}"
    );
    // The other way round is fine: b.test verifies nothing.
    let mut t = connect_tls(tls_addr(&s), "a.test", &good).unwrap();
    assert_eq!(request(&mut t, "b.test", "/").2, b"b NONE");
    // optional_no_ca: an unknown issuer passes, and says so.
    let mut t = connect_tls(tls_addr(&s), "c.test", &stranger).unwrap();
    let (st, _, body) = request(&mut t, "c.test", "/");
    assert_eq!(
        (st, String::from_utf8(body).unwrap().as_str()),
        (
            200,
            "c FAILED:self-signed certificate|CN=client one,O=shard tests"
        )
    );
    let mut t = connect_tls(tls_addr(&s), "c.test", &anonymous).unwrap();
    assert_eq!(request(&mut t, "c.test", "/").2, b"c NONE|");
    // An expired certificate is 495 even where the issuer does not matter; a chain through
    // an intermediate is too long for `ssl_verify_depth 1` (nginx's default) and fine with 2.
    let status = |sni: &str, cfg: &Arc<rustls::ClientConfig>| {
        let mut t = connect_tls(tls_addr(&s), sni, cfg).unwrap();
        let (st, _, body) = request(&mut t, sni, "/");
        (st, String::from_utf8_lossy(&body).into_owned())
    };
    let expired = clients.client_as(&p.ca, Signed::Expired);
    assert_eq!(status("a.test", &expired).0, 400);
    assert_eq!(status("c.test", &expired).0, 400);
    let via = clients.client_as(&p.ca, Signed::ViaIntermediate);
    assert_eq!(status("a.test", &via).0, 400);
    let (st, body) = status("d.test", &via);
    assert_eq!(
        (st, body.split('|').next()),
        (200, Some("SUCCESS")),
        "{body}"
    );
    let text = std::fs::read_to_string(s.dir.join("logs/error.log")).unwrap();
    assert!(text.contains("(10:certificate has expired)"), "{text}");
    assert!(text.contains("(22:certificate chain too long)"), "{text}");
}

/// Accepts any server certificate (the test checks which one it was), and records the CA
/// names a server asks client certificates of.
#[derive(Debug, Default)]
struct Recorder {
    hints: std::sync::Mutex<Vec<Vec<u8>>>,
}

impl rustls::client::danger::ServerCertVerifier for Recorder {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        let algs = rustls::crypto::ring::default_provider().signature_verification_algorithms;
        rustls::crypto::verify_tls12_signature(message, cert, dss, &algs)
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        let algs = rustls::crypto::ring::default_provider().signature_verification_algorithms;
        rustls::crypto::verify_tls13_signature(message, cert, dss, &algs)
    }
    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        rustls::crypto::ring::default_provider()
            .signature_verification_algorithms
            .supported_schemes()
    }
}

impl rustls::client::ResolvesClientCert for Recorder {
    fn resolve(
        &self,
        hints: &[&[u8]],
        _: &[rustls::SignatureScheme],
    ) -> Option<Arc<rustls::sign::CertifiedKey>> {
        *self.hints.lock().unwrap() = hints.iter().map(|h| h.to_vec()).collect();
        None
    }
    fn has_certs(&self) -> bool {
        true
    }
}

/// A name whose server has no certificate handshakes with the default server's, and its
/// `ssl_verify_client` needs no CA there (nginx checks no further); the CAs asked for are
/// each named once however many servers and files list them; `ssl_reject_handshake`
/// answers with nginx's `unrecognized_name` alert.
#[test]
fn names_without_certificates_ca_names_once_and_the_reject_alert() {
    let dir = temp_dir("tls-nocert").keep();
    let p = pki(&dir, &["a.test", "b.test"]);
    let _clients = ClientCa::new(&dir);
    let d = dir.display();
    let text = format!(
        "worker_processes 1;\nerror_log logs/error.log info;\npid logs/shard.pid;\nevents {{}}\n\
         http {{\n\
         server {{ listen 127.0.0.1:{{port}}; location = /status {{ shard_status; }} }}\n\
         server {{ listen 127.0.0.1:{{port1}} ssl; server_name a.test;\n\
           ssl_certificate {d}/conf/a.test.pem; ssl_certificate_key {d}/conf/a.test.key;\n\
           ssl_verify_client optional; ssl_client_certificate {d}/conf/clients.pem;\n\
           ssl_trusted_certificate {d}/conf/clients.pem;\n\
           location / {{ return 200 \"a $ssl_client_verify\"; }} }}\n\
         server {{ listen 127.0.0.1:{{port1}} ssl; server_name b.test;\n\
           ssl_certificate {d}/conf/b.test.pem; ssl_certificate_key {d}/conf/b.test.key;\n\
           ssl_verify_client on; ssl_client_certificate {d}/conf/clients.pem;\n\
           location / {{ return 200 \"b\"; }} }}\n\
         server {{ listen 127.0.0.1:{{port1}} ssl; server_name e.test; ssl_verify_client on;\n\
           location / {{ return 200 \"e\"; }} }}\n\
         server {{ listen 127.0.0.1:{{port1}} ssl; server_name r.test; ssl_reject_handshake on; }}\n\
         }}\n"
    );
    let s = Server::start_ports("tls-nocert", &text, 1, 1);
    let recorder = Arc::new(Recorder::default());
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let cfg = Arc::new(
        rustls::ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .dangerous()
            .with_custom_certificate_verifier(recorder.clone())
            .with_client_cert_resolver(recorder.clone()),
    );
    // e.test: a.test's certificate (the default server's), and a request without a
    // certificate is refused as `ssl_verify_client on` says.
    let mut t = connect_tls(tls_addr(&s), "e.test", &cfg).unwrap();
    let a_cert = &p.leaves.iter().find(|(n, _)| n == "a.test").unwrap().1;
    assert_eq!(&t.conn.peer_certificates().unwrap()[0], a_cert);
    let (st, _, body) = request(&mut t, "e.test", "/");
    let body = String::from_utf8_lossy(&body).into_owned();
    assert_eq!(st, 400, "{body}");
    assert!(
        body.contains("No required SSL certificate was sent"),
        "{body}"
    );
    // One CA name, though two servers and two directives list the same file.
    assert_eq!(recorder.hints.lock().unwrap().len(), 1);
    let mut t = connect_tls(tls_addr(&s), "a.test", &cfg).unwrap();
    assert_eq!(request(&mut t, "a.test", "/").2, b"a NONE");
    // ssl_reject_handshake: the alert nginx sends.
    match connect_tls(tls_addr(&s), "r.test", &cfg) {
        Err(e) => assert!(e.to_string().contains("UnrecognisedName"), "{e}"),
        Ok(_) => panic!("r.test handshaked"),
    }
}

/// Client certificates that are CA certificates themselves (`basicConstraints CA:TRUE`, as
/// `openssl req -x509` and many private PKIs make them), which webpki refuses as a leaf:
/// accepted as OpenSSL does, with `ssl_verify_depth` counting the issuers up to the root
/// (nginx's ssl_verify_depth.t).
#[test]
fn ca_certificates_as_client_certificates_and_the_verify_depth() {
    let dir = temp_dir("tls-ca-leaf").keep();
    let p = pki(&dir, &["d0.test", "d1.test", "d2.test"]);
    let ca = |name: &str| {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        (params, key)
    };
    let (rp, rkey) = ca("root");
    let root = rp.self_signed(&rkey).unwrap();
    let (ip, ikey) = ca("int");
    let int = ip.signed_by(&ikey, &root, &rkey).unwrap();
    let (ep, ekey) = ca("end");
    let end = ep.signed_by(&ekey, &int, &ikey).unwrap();
    std::fs::write(dir.join("conf/root-int.pem"), root.pem() + &int.pem()).unwrap();
    let client = |cert: &rcgen::Certificate, key: &rcgen::KeyPair| {
        let der = rustls::pki_types::PrivateKeyDer::try_from(key.serialize_der()).unwrap();
        let mut roots = rustls::RootCertStore::empty();
        roots.add(p.ca.clone()).unwrap();
        Arc::new(
            rustls::ClientConfig::builder_with_provider(Arc::new(
                rustls::crypto::ring::default_provider(),
            ))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_client_auth_cert(vec![cert.der().clone()], der)
            .unwrap(),
        )
    };
    let d = dir.display();
    let server = |n: u32| {
        format!(
            "server {{ listen 127.0.0.1:{{port1}} ssl; server_name d{n}.test;\n\
             ssl_certificate {d}/conf/d{n}.test.pem; ssl_certificate_key {d}/conf/d{n}.test.key;\n\
             ssl_verify_client optional; ssl_verify_depth {n};\n\
             ssl_client_certificate {d}/conf/root-int.pem;\n\
             location / {{ return 200 \"$ssl_client_verify\"; }} }}\n"
        )
    };
    let text = format!(
        "worker_processes 1;\nerror_log logs/error.log info;\npid logs/shard.pid;\nevents {{}}\n\
         http {{\nserver {{ listen 127.0.0.1:{{port}}; location = /status {{ shard_status; }} }}\n\
         {}{}{}}}\n",
        server(0),
        server(1),
        server(2)
    );
    let s = Server::start_ports("tls-ca-leaf", &text, 1, 1);
    let verify = |depth: u32, cfg: &Arc<rustls::ClientConfig>| {
        let sni = format!("d{depth}.test");
        let mut t = connect_tls(tls_addr(&s), &sni, cfg).unwrap();
        let (st, _, body) = request(&mut t, &sni, "/");
        (st, String::from_utf8_lossy(&body).into_owned())
    };
    let (root_c, int_c, end_c) = (
        client(&root, &rkey),
        client(&int, &ikey),
        client(&end, &ekey),
    );
    // The root itself: no issuer above it, any depth.
    for depth in 0..3 {
        assert_eq!(
            verify(depth, &root_c),
            (200, "SUCCESS".into()),
            "root at {depth}"
        );
    }
    // int: one issuer above; end: two (int is trusted too, but counts, as in OpenSSL).
    assert_eq!(verify(0, &int_c).0, 400);
    assert_eq!(verify(1, &int_c), (200, "SUCCESS".into()));
    assert_eq!(verify(1, &end_c).0, 400);
    assert_eq!(verify(2, &end_c), (200, "SUCCESS".into()));
    let log = std::fs::read_to_string(s.dir.join("logs/error.log")).unwrap();
    assert!(log.contains("(22:certificate chain too long)"), "{log}");
}

/// `ssl_crl` with the lists `openssl ca -gencrl` writes (version 1, which webpki does not
/// read), over a chain root > int > end of CA certificates: every certificate but the root
/// needs a list from its issuer, and the error that stands is the last found from the
/// client's certificate up, as nginx's OpenSSL reports it (nginx's ssl_crl.t).
#[test]
fn version_1_revocation_lists_as_openssl_writes_them() {
    if !have("openssl") {
        skipped("version_1_revocation_lists", "openssl is not installed");
        return;
    }
    let dir = temp_dir("tls-crl-v1").keep();
    let conf_dir = dir.join("conf");
    let _p = pki(&dir, &["a.test", "b.test", "c.test", "d.test", "e.test"]);
    let d = conf_dir.display().to_string();
    std::fs::write(
        conf_dir.join("ca.conf"),
        format!(
            "[ ca ]\ndefault_ca = myca\n[ myca ]\nnew_certs_dir = {d}\ndatabase = {d}/certindex\n\
             default_md = sha256\npolicy = myca_policy\nserial = {d}/certserial\n\
             default_days = 1\ndefault_crl_days = 1\nx509_extensions = myca_extensions\n\
             [ myca_policy ]\ncommonName = supplied\n\
             [ myca_extensions ]\nbasicConstraints = critical,CA:TRUE\n"
        ),
    )
    .unwrap();
    std::fs::write(conf_dir.join("certserial"), "1000").unwrap();
    std::fs::write(conf_dir.join("certindex"), "").unwrap();
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
    ];
    let mut args = vec![
        "req",
        "-x509",
        "-subj",
        "/CN=root/",
        "-out",
        "root.crt",
        "-keyout",
        "root.key",
    ];
    args.extend(ec);
    args.extend(["-addext", "basicConstraints=critical,CA:TRUE"]);
    openssl_in(&conf_dir, &args);
    for name in ["int", "end"] {
        let (csr, key, subj) = (
            format!("{name}.csr"),
            format!("{name}.key"),
            format!("/CN={name}/"),
        );
        let mut args = vec!["req", "-new", "-subj", &subj, "-out", &csr, "-keyout", &key];
        args.extend(ec);
        openssl_in(&conf_dir, &args);
    }
    let sign = |issuer: &str, name: &str| {
        let (key, cert, csr, out, subj) = (
            format!("{issuer}.key"),
            format!("{issuer}.crt"),
            format!("{name}.csr"),
            format!("{name}.crt"),
            format!("/CN={name}/"),
        );
        openssl_in(
            &conf_dir,
            &[
                "ca", "-batch", "-config", "ca.conf", "-keyfile", &key, "-cert", &cert, "-subj",
                &subj, "-in", &csr, "-out", &out,
            ],
        );
    };
    sign("root", "int");
    sign("int", "end");
    let gencrl = |issuer: &str, out: &str| {
        let (key, cert) = (format!("{issuer}.key"), format!("{issuer}.crt"));
        openssl_in(
            &conf_dir,
            &[
                "ca", "-gencrl", "-config", "ca.conf", "-keyfile", &key, "-cert", &cert, "-out",
                out,
            ],
        );
    };
    gencrl("root", "empty.crl");
    gencrl("int", "int.crl");
    let read = |f: &str| std::fs::read_to_string(conf_dir.join(f)).unwrap();
    std::fs::write(
        conf_dir.join("empty-chain.crl"),
        read("empty.crl") + &read("int.crl"),
    )
    .unwrap();
    openssl_in(
        &conf_dir,
        &[
            "ca", "-config", "ca.conf", "-revoke", "int.crt", "-keyfile", "root.key", "-cert",
            "root.crt",
        ],
    );
    gencrl("root", "root.crl");
    assert!(!read("root.crl").is_empty());
    std::fs::write(
        conf_dir.join("int-root.crt"),
        read("int.crt") + &read("root.crt"),
    )
    .unwrap();
    let server = |name: &str, extra: &str| {
        format!(
            "server {{ listen 127.0.0.1:{{port1}} ssl; server_name {name}.test; \
             ssl_certificate {d}/{name}.test.pem; ssl_certificate_key {d}/{name}.test.key; \
             ssl_verify_client on; {extra} location / {{ return 200 \"$ssl_client_verify\"; }} }}\n"
        )
    };
    let text = format!(
        "worker_processes 1;\nerror_log logs/error.log info;\npid logs/shard.pid;\nevents {{}}\n\
         http {{\nadd_header X-Verify $ssl_client_verify always;\n\
         server {{ listen 127.0.0.1:{{port}}; location = /status {{ shard_status; }} }}\n{}{}{}{}{}}}\n",
        server("a", &format!("ssl_client_certificate {d}/root.crt; ssl_crl {d}/empty.crl;")),
        server("b", &format!("ssl_client_certificate {d}/root.crt; ssl_crl {d}/root.crl;")),
        server("c", &format!("ssl_client_certificate {d}/int-root.crt; ssl_verify_depth 2; ssl_crl {d}/root.crl;")),
        server("d", &format!("ssl_client_certificate {d}/int-root.crt; ssl_verify_depth 2; ssl_crl {d}/empty.crl;")),
        server("e", &format!("ssl_client_certificate {d}/int-root.crt; ssl_verify_depth 2; ssl_crl {d}/empty-chain.crl;")),
    );
    let s = Server::start_ports("tls-crl-v1", &text, 1, 1);
    use rustls::pki_types::pem::PemObject;
    let client = |name: &str| {
        let cert = CertificateDer::from_pem_file(conf_dir.join(format!("{name}.crt"))).unwrap();
        let key =
            rustls::pki_types::PrivateKeyDer::from_pem_file(conf_dir.join(format!("{name}.key")))
                .unwrap();
        let mut roots = rustls::RootCertStore::empty();
        roots.add(_p.ca.clone()).unwrap();
        Arc::new(
            rustls::ClientConfig::builder_with_provider(Arc::new(
                rustls::crypto::ring::default_provider(),
            ))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_client_auth_cert(vec![cert], key)
            .unwrap(),
        )
    };
    let verify = |server: &str, cfg: &Arc<rustls::ClientConfig>| {
        let sni = format!("{server}.test");
        let mut t = connect_tls(tls_addr(&s), &sni, cfg).unwrap();
        let (_, head, _) = request(&mut t, &sni, "/");
        head.lines()
            .find_map(|l| l.strip_prefix("X-Verify: "))
            .unwrap_or("")
            .to_string()
    };
    let (int, end) = (client("int"), client("end"));
    assert_eq!(verify("a", &int), "SUCCESS");
    assert_eq!(verify("b", &int), "FAILED:certificate revoked");
    assert_eq!(verify("c", &end), "FAILED:certificate revoked");
    assert_eq!(verify("d", &end), "FAILED:unable to get certificate CRL");
    assert_eq!(verify("e", &end), "SUCCESS");
}

/// An upstream that resets mid-response: the TLS client sees the end of stream without
/// close_notify, so it can tell the truncation (nginx's quiet shutdown); a whole response
/// that ends with the connection ends with close_notify.
#[test]
fn a_truncated_response_ends_without_close_notify() {
    const LEN: usize = 1 << 20;
    let gate = Gate::new();
    let g = gate.clone();
    let up = Upstream::start(move |r| {
        if r.target.contains("/whole") {
            Reply::CloseDelimited(b"all of it".to_vec())
        } else {
            Reply::ResetMid {
                len: LEN,
                sent: 64 * 1024,
                gate: g.clone(),
            }
        }
    });
    let extra = format!("location / {{ proxy_pass http://{}; }}", up.addr());
    let (s, p) = start("tls-quiet", 1, &extra, "");
    let cfg = client_config(&p.ca, &[&rustls::version::TLS13]);
    let mut t = connect_tls(tls_addr(&s), "a.test", &cfg).unwrap();
    write!(t, "GET /cut HTTP/1.1\r\nHost: a.test\r\n\r\n").unwrap();
    let mut got = vec![0u8; 16384];
    let n = t.read(&mut got).unwrap();
    assert!(n > 0);
    gate.open();
    let end = loop {
        match t.read(&mut got) {
            Ok(0) => break Ok(()),
            Ok(_) => {}
            Err(e) => break Err(e),
        }
    };
    assert_eq!(
        end.map_err(|e| e.kind()),
        Err(std::io::ErrorKind::UnexpectedEof),
        "a truncated response must not end with close_notify"
    );
    let mut t = connect_tls(tls_addr(&s), "a.test", &cfg).unwrap();
    write!(t, "GET /whole HTTP/1.0\r\nHost: a.test\r\n\r\n").unwrap();
    let mut all = Vec::new();
    t.read_to_end(&mut all)
        .expect("close_notify after a whole response");
    assert!(
        all.ends_with(b"all of it"),
        "{}",
        String::from_utf8_lossy(&all)
    );
}

/// Mozilla's recommended nginx TLS configuration ("intermediate", ssl-config.mozilla.org),
/// as generated, with only paths and ports filled in: it passes `-t` (with warnings for what
/// shard does not do: OCSP stapling, `http2`, `ssl_dhparam`, `resolver`), redirects plain HTTP
/// to https, and serves TLS 1.2 and 1.3 with its HSTS header.
#[test]
fn mozillas_recommended_configuration_runs() {
    let dir = temp_dir("tls-mozilla").keep();
    let p = pki(&dir, &["a.test"]);
    std::fs::write(dir.join("conf/dhparam"), b"not read by shard").unwrap();
    let text = format!(
        "worker_processes 1;\nerror_log logs/error.log info;\npid logs/shard.pid;\nevents {{}}\n\
         http {{\n\
         server {{ listen 127.0.0.1:{{port}}; location = /status {{ shard_status; }} }}\n\
         server {{\n\
             listen 127.0.0.1:{{port1}} default_server;\n\
             return 301 https://$host$request_uri;\n\
         }}\n\
         server {{\n\
             listen 127.0.0.1:{{port2}} ssl;\n\
             http2 on;\n\
             ssl_certificate {d}/conf/a.test.pem;\n\
             ssl_certificate_key {d}/conf/a.test.key;\n\
             ssl_session_timeout 1d;\n\
             ssl_session_cache shared:MozSSL:10m;  # about 40000 sessions\n\
             ssl_session_tickets off;\n\
             ssl_dhparam {d}/conf/dhparam;\n\
             ssl_protocols TLSv1.2 TLSv1.3;\n\
             ssl_ciphers ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:ECDHE-ECDSA-AES256-GCM-SHA384:ECDHE-RSA-AES256-GCM-SHA384:ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305:DHE-RSA-AES128-GCM-SHA256:DHE-RSA-CHACHA20-POLY1305;\n\
             ssl_prefer_server_ciphers off;\n\
             add_header Strict-Transport-Security \"max-age=63072000\" always;\n\
             ssl_stapling on;\n\
             ssl_stapling_verify on;\n\
             ssl_trusted_certificate {d}/conf/ca.pem;\n\
             resolver 127.0.0.1;\n\
             location / {{ return 200 \"secure\"; }}\n\
         }}\n\
         }}\n",
        d = dir.display()
    );
    let s = Server::start_ports("tls-mozilla", &text, 1, 2);
    let (code, out) = run_cli(&[
        "-t",
        "-p",
        s.dir.to_str().unwrap(),
        "-c",
        s.dir.join("conf/shard.conf").to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("\"ssl_stapling\" staples only an \"ssl_stapling_file\" in shard"),
        "{out}"
    );
    let plain = SocketAddr::from(([127, 0, 0, 1], s.ports[0]));
    let r = raw(
        plain,
        b"GET /a?b=c HTTP/1.1\r\nHost: site.test\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(
        (r.status, r.header("location")),
        (301, Some("https://site.test/a?b=c"))
    );
    let tls = SocketAddr::from(([127, 0, 0, 1], s.ports[1]));
    // `http2 on` is spoken: a client offering h2 gets it.
    let cfg = client_config(&p.ca, &[&rustls::version::TLS13]);
    let t = connect_tls(tls, "a.test", &cfg).unwrap();
    assert_eq!(t.conn.alpn_protocol(), Some(&b"h2"[..]));
    for v in [&rustls::version::TLS13, &rustls::version::TLS12] {
        let mut cfg = (*client_config(&p.ca, &[v])).clone();
        cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
        let mut t = connect_tls(tls, "a.test", &Arc::new(cfg)).unwrap();
        let (st, head, body) = request(&mut t, "a.test", "/");
        assert_eq!((st, body.as_slice()), (200, &b"secure"[..]));
        assert!(
            head.contains("Strict-Transport-Security: max-age=63072000"),
            "{head}"
        );
    }
}

/// `ssl_session_tickets off` with `ssl_session_cache shared:` (Mozilla's configuration):
/// sessions live in shared memory, so both protocols resume on either worker.
#[test]
fn a_shared_session_cache_resumes_on_any_worker_without_tickets() {
    let (s, p) = start(
        "tls-shared-cache",
        2,
        "",
        "ssl_session_tickets off; ssl_session_cache shared:S:1m;",
    );
    for versions in [&rustls::version::TLS13, &rustls::version::TLS12] {
        let cfg = client_config(&p.ca, &[versions]);
        let mut resumed = 0;
        for _ in 0..16 {
            let mut c = connect_tls(tls_addr(&s), "b.test", &cfg).unwrap();
            assert_eq!(request(&mut c, "b.test", "/").0, 200);
            if c.conn.handshake_kind() == Some(rustls::HandshakeKind::Resumed) {
                resumed += 1;
            }
        }
        assert!(resumed >= 15, "{versions:?}: {resumed} of 15 resumed");
    }
    // Both workers took part (each made handshakes), so resumptions crossed workers.
    let st = get(s.addr(), "/status").body_str();
    let per_worker: Vec<u64> = st
        .split("\"tls_handshakes\":")
        .skip(1)
        .map(|v| v.split(',').next().unwrap().parse().unwrap())
        .collect();
    assert!(per_worker.iter().filter(|&&n| n > 0).count() == 2, "{st}");
}

/// A session made where no certificate was asked for does not resume once a reload turned
/// `ssl_verify_client on` (nginx's session ID context): the client makes a full handshake,
/// sends its certificate, and is served.
#[test]
fn a_reload_that_asks_for_certificates_does_not_resume_old_sessions() {
    let (s, p) = start(
        "tls-mtls-reload",
        1,
        "location / { return 200 \"$ssl_client_verify\"; }",
        "",
    );
    let clients = ClientCa::new(&p.dir);
    let good = clients.client(&p.ca, true);
    for _ in 0..2 {
        let mut t = connect_tls(tls_addr(&s), "a.test", &good).unwrap();
        assert_eq!(request(&mut t, "a.test", "/").2, b"NONE");
    }
    let conf_path = s.dir.join("conf/shard.conf");
    let text = std::fs::read_to_string(&conf_path).unwrap().replace(
        "location / { return 200",
        &format!(
            "ssl_verify_client on; ssl_client_certificate {}; location / {{ return 200",
            p.dir.join("conf/clients.pem").display()
        ),
    );
    std::fs::write(&conf_path, text).unwrap();
    let before = s.workers()[0].pid;
    s.signal(libc::SIGHUP);
    wait_for(TIMEOUT, "the new generation", || {
        let w = s.workers();
        (w.len() == 1 && w[0].pid != before && w[0].pid != 0).then_some(())
    });
    wait_stopped_accepting(&s, &[before]);
    let mut t = connect_tls(tls_addr(&s), "a.test", &good).unwrap();
    assert_ne!(
        t.conn.handshake_kind(),
        Some(rustls::HandshakeKind::Resumed),
        "a session from before the reload resumed"
    );
    let (st, _, body) = request(&mut t, "a.test", "/");
    assert_eq!((st, body.as_slice()), (200, &b"SUCCESS"[..]));
}

/// `ssl_crl`: a client certificate its CA revoked is 495 (`23:certificate revoked`); with a
/// list that does not name it, the same certificate passes.
#[test]
fn a_revoked_client_certificate_is_refused() {
    let (s, p) = start(
        "tls-crl",
        1,
        "location / { return 200 \"$ssl_client_verify\"; }",
        "",
    );
    let clients = ClientCa::new(&p.dir);
    let crl = |revoked: bool| {
        let params = rcgen::CertificateRevocationListParams {
            this_update: rcgen::date_time_ymd(2024, 1, 1),
            next_update: rcgen::date_time_ymd(2099, 1, 1),
            crl_number: rcgen::SerialNumber::from(1u64),
            issuing_distribution_point: None,
            revoked_certs: if revoked {
                vec![rcgen::RevokedCertParams {
                    serial_number: rcgen::SerialNumber::from(vec![0x01, 0x9a]),
                    revocation_time: rcgen::date_time_ymd(2024, 6, 1),
                    reason_code: Some(rcgen::RevocationReason::KeyCompromise),
                    invalidity_date: None,
                }]
            } else {
                Vec::new()
            },
            key_identifier_method: rcgen::KeyIdMethod::Sha256,
        };
        params
            .signed_by(&clients.ca, &clients.key)
            .unwrap()
            .pem()
            .unwrap()
    };
    std::fs::write(p.dir.join("conf/revoked.crl"), crl(true)).unwrap();
    std::fs::write(p.dir.join("conf/clean.crl"), crl(false)).unwrap();
    let good = clients.client(&p.ca, true);
    let conf_path = s.dir.join("conf/shard.conf");
    let original = std::fs::read_to_string(&conf_path).unwrap();
    let mut generation_pid = s.workers()[0].pid;
    for (list, status, body) in [
        ("revoked.crl", 400, None),
        ("clean.crl", 200, Some("SUCCESS")),
    ] {
        let text = original.replace(
            "location / { return 200",
            &format!(
                "ssl_verify_client on; ssl_client_certificate {}; ssl_crl {}; \
                 location / {{ return 200",
                p.dir.join("conf/clients.pem").display(),
                p.dir.join("conf").join(list).display()
            ),
        );
        std::fs::write(&conf_path, text).unwrap();
        s.signal(libc::SIGHUP);
        wait_for(TIMEOUT, "the new generation", || {
            let w = s.workers();
            (w.len() == 1 && w[0].pid != generation_pid && w[0].pid != 0).then_some(())
        });
        wait_stopped_accepting(&s, &[generation_pid]);
        generation_pid = s.workers()[0].pid;
        let mut t = connect_tls(tls_addr(&s), "a.test", &good).unwrap();
        let (st, _, b) = request(&mut t, "a.test", "/");
        assert_eq!(st, status, "{list}: {}", String::from_utf8_lossy(&b));
        if let Some(want) = body {
            assert_eq!(b, want.as_bytes());
        }
    }
    let log = std::fs::read_to_string(s.dir.join("logs/error.log")).unwrap();
    assert!(log.contains("(23:certificate revoked)"), "{log}");
}

/// `proxy_ssl_crl`, as nginx's proxy_ssl_crl.t: an upstream whose certificate its CA
/// revoked is a 502; a list from its CA that does not name it lets it through; a list only
/// from another CA leaves its status unknown, which fails as with OpenSSL's CRL checks.
#[test]
fn proxy_ssl_crl_checks_the_upstreams_certificate() {
    let dir = temp_dir("tls-proxy-crl").keep();
    let new_ca = |cn: &str| {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::CrlSign,
            rcgen::KeyUsagePurpose::DigitalSignature,
        ];
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, cn);
        let cert = params.self_signed(&key).unwrap();
        (cert, key)
    };
    let (ca, ca_key) = new_ca("upstream CA");
    let (other, other_key) = new_ca("another CA");
    std::fs::write(dir.join("conf/ca.pem"), ca.pem()).unwrap();
    let leaf_key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let mut leaf = rcgen::CertificateParams::new(vec!["a.test".to_string()]).unwrap();
    leaf.serial_number = Some(rcgen::SerialNumber::from(vec![0x01, 0x9b]));
    let leaf = leaf.signed_by(&leaf_key, &ca, &ca_key).unwrap();
    std::fs::write(dir.join("conf/up.pem"), leaf.pem()).unwrap();
    std::fs::write(dir.join("conf/up.key"), leaf_key.serialize_pem()).unwrap();
    let crl = |issuer: &rcgen::Certificate, key: &rcgen::KeyPair, revoked: bool| {
        rcgen::CertificateRevocationListParams {
            this_update: rcgen::date_time_ymd(2024, 1, 1),
            next_update: rcgen::date_time_ymd(2099, 1, 1),
            crl_number: rcgen::SerialNumber::from(1u64),
            issuing_distribution_point: None,
            revoked_certs: if revoked {
                vec![rcgen::RevokedCertParams {
                    serial_number: rcgen::SerialNumber::from(vec![0x01, 0x9b]),
                    revocation_time: rcgen::date_time_ymd(2024, 6, 1),
                    reason_code: Some(rcgen::RevocationReason::KeyCompromise),
                    invalidity_date: None,
                }]
            } else {
                Vec::new()
            },
            key_identifier_method: rcgen::KeyIdMethod::Sha256,
        }
        .signed_by(issuer, key)
        .unwrap()
        .pem()
        .unwrap()
    };
    std::fs::write(dir.join("conf/clean.crl"), crl(&ca, &ca_key, false)).unwrap();
    std::fs::write(dir.join("conf/revoked.crl"), crl(&ca, &ca_key, true)).unwrap();
    std::fs::write(dir.join("conf/other.crl"), crl(&other, &other_key, false)).unwrap();
    let d = dir.join("conf");
    let loc = |name: &str| {
        format!(
            "location /{name}/ {{ proxy_pass https://127.0.0.1:{{port1}}/; proxy_ssl_verify on;\n\
               proxy_ssl_trusted_certificate {ca}; proxy_ssl_name a.test;\n\
               proxy_ssl_crl {crl}; }}\n",
            ca = d.join("ca.pem").display(),
            crl = d.join(format!("{name}.crl")).display(),
        )
    };
    let text = format!(
        "worker_processes 1;\nerror_log logs/error.log info;\nevents {{}}\nhttp {{\n\
         server {{ listen 127.0.0.1:{{port1}} ssl; server_name a.test;\n\
           ssl_certificate {cert}; ssl_certificate_key {key};\n\
           location / {{ return 200 \"up\"; }} }}\n\
         server {{ listen 127.0.0.1:{{port}};\n\
           location = /status {{ shard_status; }}\n{clean}{revoked}{other} }}\n}}\n",
        cert = d.join("up.pem").display(),
        key = d.join("up.key").display(),
        clean = loc("clean"),
        revoked = loc("revoked"),
        other = loc("other"),
    );
    let s = Server::start_ports("tls-proxy-crl", &text, 1, 1);
    let r = get(s.addr(), "/clean/");
    assert_eq!((r.status, r.body_str().as_str()), (200, "up"));
    assert_eq!(get(s.addr(), "/revoked/").status, 502);
    assert_eq!(get(s.addr(), "/other/").status, 502);
}

/// Runs `openssl ARGS` in `dir`; panics with its output when it fails.
fn openssl_in(dir: &Path, args: &[&str]) {
    let out = std::process::Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// X.509 version 1 certificates, which `openssl req -x509` and `openssl x509 -req` make
/// without extensions and OpenSSL (so nginx) takes: a v1 server certificate loads (its key
/// matched by the public key), and a v1 client certificate issued by the trusted CA
/// verifies, over TLS 1.3 and 1.2, with its `$ssl_client_*` variables; a v1 certificate that
/// signed itself is a self-signed one, not a failed handshake.
#[test]
fn version_1_certificates_as_openssl_takes_them() {
    if !have("openssl") || !have("curl") {
        println!("SKIPPED: version_1_certificates_as_openssl_takes_them needs openssl and curl (apt-get install openssl curl)");
        return;
    }
    let dir = temp_dir("tls-v1").keep();
    let conf = dir.join("conf");
    std::fs::create_dir_all(&conf).unwrap();
    // A configuration without `x509_extensions`: `req -x509` then makes a v1 certificate.
    std::fs::write(
        conf.join("v1.cnf"),
        "[req]\ndistinguished_name = dn\nprompt = no\n[dn]\nCN = v1.test\n",
    )
    .unwrap();
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
    ];
    let mut args = vec!["req", "-x509", "-config", "v1.cnf", "-days", "3650"];
    args.extend(ec);
    args.extend(["-keyout", "server.key", "-out", "server.pem"]);
    openssl_in(&conf, &args);
    let mut args = vec!["req", "-x509", "-days", "3650", "-subj", "/CN=v1 CA"];
    args.extend(ec);
    args.extend(["-addext", "basicConstraints=critical,CA:TRUE"]);
    args.extend(["-keyout", "ca.key", "-out", "ca.pem"]);
    openssl_in(&conf, &args);
    for (name, cn) in [
        ("client", "/O=shard tests/CN=client v1"),
        ("stranger", "/CN=stranger"),
    ] {
        let mut args = vec!["req", "-new", "-subj", cn];
        args.extend(ec);
        let (key, csr) = (format!("{name}.key"), format!("{name}.csr"));
        args.extend(["-keyout", &key, "-out", &csr]);
        openssl_in(&conf, &args);
    }
    openssl_in(
        &conf,
        &[
            "x509",
            "-req",
            "-in",
            "client.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-set_serial",
            "0x1a2b",
            "-days",
            "3650",
            "-out",
            "client.pem",
        ],
    );
    openssl_in(
        &conf,
        &[
            "x509",
            "-req",
            "-in",
            "stranger.csr",
            "-signkey",
            "stranger.key",
            "-days",
            "3650",
            "-out",
            "stranger.pem",
        ],
    );
    let text = format!(
        "worker_processes 1;\nerror_log logs/error.log info;\nevents {{}}\nhttp {{\n\
         server {{ listen 127.0.0.1:{{port}}; location = /status {{ shard_status; }}\n\
           location /up/ {{ proxy_pass https://127.0.0.1:{{port1}}/; proxy_ssl_name v1.test;\n\
             proxy_set_header Host v1.test;\n\
             proxy_ssl_server_name on; proxy_ssl_certificate {d}/client.pem;\n\
             proxy_ssl_certificate_key {d}/client.key; }}\n\
           location /vars/ {{ proxy_pass https://127.0.0.1:{{port1}}/; proxy_ssl_name v1.test;\n\
             proxy_set_header Host v1.test; proxy_ssl_server_name on;\n\
             proxy_ssl_certificate {d}/$arg_c.pem; proxy_ssl_certificate_key {d}/$arg_c.key; }}\n\
           location /none/ {{ proxy_pass https://127.0.0.1:{{port1}}/; proxy_ssl_name v1.test;\n\
             proxy_set_header Host v1.test; proxy_ssl_server_name on;\n\
             proxy_ssl_certificate $arg_c; proxy_ssl_certificate_key $arg_c; }} }}\n\
         server {{ listen 127.0.0.1:{{port1}} ssl; server_name v1.test;\n\
           ssl_certificate {d}/server.pem; ssl_certificate_key {d}/server.key;\n\
           ssl_verify_client optional_no_ca; ssl_client_certificate {d}/ca.pem;\n\
           location / {{ return 200 \"$ssl_client_verify|$ssl_client_s_dn|$ssl_client_i_dn|$ssl_client_serial\"; }} }}\n\
         }}\n\
         stream {{ map $server_port $c {{ default client; }}\n\
           server {{ listen 127.0.0.1:{{port2}}; proxy_pass 127.0.0.1:{{port1}}; proxy_ssl on;\n\
             proxy_ssl_server_name on; proxy_ssl_name v1.test:443;\n\
             proxy_ssl_certificate {d}/$c.pem; proxy_ssl_certificate_key {d}/$c.key; }} }}\n",
        d = conf.display()
    );
    let s = Server::start_ports("tls-v1", &text, 1, 2);
    let port = s.ports[0];
    let curl = |cert: &str, tls: &str| {
        let out = std::process::Command::new("curl")
            .args(["-s", "--http1.1", "--cacert"])
            .arg(conf.join("server.pem"))
            .arg("--cert")
            .arg(conf.join(format!("{cert}.pem")))
            .arg("--key")
            .arg(conf.join(format!("{cert}.key")))
            .args(["--tls-max", tls, "--resolve"])
            .arg(format!("v1.test:{port}:127.0.0.1"))
            .arg(format!("https://v1.test:{port}/"))
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    for tls in ["1.3", "1.2"] {
        assert_eq!(
            curl("client", tls),
            "SUCCESS|CN=client v1,O=shard tests|CN=v1 CA|1A2B",
            "TLS {tls}"
        );
    }
    assert_eq!(
        curl("stranger", "1.3").split('|').next(),
        Some("FAILED:self-signed certificate")
    );
    // `proxy_ssl_certificate` offers a v1 certificate to an upstream too (nginx's
    // proxy_ssl_certificate.t; rustls's own loader refuses it).
    let r = get(s.addr(), "/up/");
    assert_eq!(
        (r.status, r.body_str()),
        (
            200,
            "SUCCESS|CN=client v1,O=shard tests|CN=v1 CA|1A2B".to_string()
        )
    );
    // Named by variables (nginx 1.21.0+): loaded per request, by the workers (who must be
    // able to read the keys); none when the name is empty; a file that cannot be loaded is a
    // 500 with nginx's words.
    for k in ["client.key", "stranger.key"] {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(conf.join(k), std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    let r = get(s.addr(), "/vars/?c=client");
    assert!(
        r.body_str().starts_with("SUCCESS|CN=client v1"),
        "{}",
        r.body_str()
    );
    let r = get(s.addr(), "/vars/?c=stranger");
    assert!(r.body_str().starts_with("FAILED"), "{}", r.body_str());
    assert_eq!(get(s.addr(), "/none/").body_str(), "NONE|||");
    // In stream too, rendered per session with the session's variables.
    let r = raw(
        SocketAddr::from(([127, 0, 0, 1], s.ports[1])),
        b"GET / HTTP/1.0\r\nHost: v1.test\r\n\r\n",
    );
    assert!(
        r.body_str().starts_with("SUCCESS|CN=client v1"),
        "{}",
        r.body_str()
    );
    assert_eq!(get(s.addr(), "/vars/?c=missing").status, 500);
    let log = error_log(&s);
    assert!(log.contains("cannot load certificate"), "{log}");
    // The line names the upstream as nginx does, with its scheme.
    assert!(log.contains("upstream: \"https://127.0.0.1:"), "{log}");
}

/// `ssl_reject_handshake on` on the default server: names no server takes are refused in
/// the handshake; the named servers answer as before.
#[test]
fn ssl_reject_handshake_refuses_unknown_names() {
    let (s, p) = start(
        "tls-reject",
        1,
        "",
        "server { listen 127.0.0.1:{port1} ssl default_server; ssl_reject_handshake on; }",
    );
    let config = client_config(&p.ca, &[&rustls::version::TLS13, &rustls::version::TLS12]);
    let mut a = connect_tls(tls_addr(&s), "a.test", &config).expect("a.test is served");
    let (st, _, _) = request(&mut a, "a.test", "/");
    assert!(st == 200 || st == 403 || st == 404, "{st}");
    let mut b = connect_tls(tls_addr(&s), "b.test", &config).expect("b.test is served");
    assert_eq!(request(&mut b, "b.test", "/").2, b"b");
    assert!(
        connect_tls(tls_addr(&s), "unknown.test", &config).is_err(),
        "an unknown name gets no certificate"
    );
    // OpenSSL's client says why: no certificate at all (not one for another name).
    if !have("openssl") {
        skipped(
            "ssl_reject_handshake_refuses_unknown_names (s_client part)",
            "openssl is not installed",
        );
        return;
    }
    let (out, _) = s_client(s.ports[0], &["-servername", "unknown.test"], "unknown.test");
    assert!(out.contains("no peer certificate available"), "{out}");
    let (out, _) = s_client(s.ports[0], &["-servername", "b.test"], "b.test");
    assert!(
        out.contains("subject=CN") || out.contains("subject="),
        "{out}"
    );
    assert!(!out.contains("no peer certificate available"), "{out}");
}

/// A stream `return` on a `listen ... ssl`: the value goes through TLS after the handshake
/// (as nginx's ssl phase comes before content), with the session logged.
#[test]
fn stream_return_over_tls() {
    let dir = temp_dir("tls-stream-return-pki").keep();
    let p = pki(&dir, &["r.test"]);
    let conf = format!(
        "worker_processes 1;\nerror_log logs/error.log info;\nevents {{}}\n\
         http {{ access_log off; server {{ listen 127.0.0.1:{{port}}; \
         location = /status {{ shard_status; }} }} }}\n\
         stream {{ log_format t '$status $bytes_sent'; server {{ listen 127.0.0.1:{{port1}} ssl; \
         ssl_certificate {}; ssl_certificate_key {}; set $who \"$remote_addr\"; \
         return \"hello $who $ssl_protocol $ssl_server_name $ssl_session_reused\"; \
         access_log logs/t.log t; }} }}\n",
        dir.join("conf/r.test.pem").display(),
        dir.join("conf/r.test.key").display()
    );
    let s = Server::start_ports("tls-stream-return", &conf, 1, 1);
    let cfg = client_config(&p.ca, &[&rustls::version::TLS13, &rustls::version::TLS12]);
    let mut c = connect_tls(tls_addr(&s), "r.test", &cfg).unwrap();
    let mut got = Vec::new();
    let _ = c.read_to_end(&mut got);
    assert_eq!(
        String::from_utf8_lossy(&got),
        "hello 127.0.0.1 TLSv1.3 r.test ."
    );
    let path = s.dir.join("logs/t.log");
    let log = wait_for(Duration::from_secs(10), "the log line", || {
        std::fs::read_to_string(&path)
            .ok()
            .filter(|l| !l.is_empty())
    });
    assert_eq!(log, format!("200 {}\n", got.len()));
}

/// `ssl_handshake_timeout` in stream: a client that does not finish its handshake in time is
/// closed, and the log says so at info.
#[test]
fn stream_ssl_handshake_timeout_closes_a_slow_client() {
    let dir = temp_dir("tls-stream-hs-timeout").keep();
    let _p = pki(&dir, &["s.test"]);
    let conf = format!(
        "worker_processes 1;\nerror_log logs/error.log info;\nevents {{}}\n\
         http {{ access_log off; server {{ listen 127.0.0.1:{{port}}; \
         location = /status {{ shard_status; }} }} }}\n\
         stream {{ ssl_handshake_timeout 300ms; server {{ listen 127.0.0.1:{{port1}} ssl; \
         ssl_certificate {}; ssl_certificate_key {}; proxy_pass 127.0.0.1:9; }} }}\n",
        dir.join("conf/s.test.pem").display(),
        dir.join("conf/s.test.key").display()
    );
    let s = Server::start_ports("tls-stream-hs-timeout", &conf, 1, 1);
    let t = std::time::Instant::now();
    let mut idle = connect(tls_addr(&s));
    idle.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    idle.write_all(&[0x16, 0x03, 0x01]).unwrap();
    let mut rest = Vec::new();
    let _ = idle.read_to_end(&mut rest);
    let took = t.elapsed();
    assert!(
        took >= Duration::from_millis(250) && took < Duration::from_secs(5),
        "closed after {took:?}"
    );
    wait_for(Duration::from_secs(5), "the timeout logged", || {
        error_log(&s)
            .contains("SSL handshaking timed out")
            .then_some(())
    });
}

/// `ssl_password_file`: encrypted keys as OpenSSL writes them (PKCS#8 `ENCRYPTED PRIVATE
/// KEY` and the traditional `Proc-Type: 4,ENCRYPTED` form) are opened with the first
/// passphrase of the file that fits, in http and stream; without the file, or with none
/// that fits, `-t` fails naming the key.
#[test]
fn ssl_password_file_opens_encrypted_keys() {
    if !have("openssl") {
        skipped(
            "ssl_password_file_opens_encrypted_keys",
            "openssl is not installed",
        );
        return;
    }
    let dir = temp_dir("tls-password-file").keep();
    let conf_dir = dir.join("conf");
    openssl_in(
        &conf_dir,
        &[
            "genpkey",
            "-algorithm",
            "EC",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-aes256",
            "-pass",
            "pass:first-secret",
            "-out",
            "p8.key",
        ],
    );
    openssl_in(
        &conf_dir,
        &[
            "genrsa",
            "-traditional",
            "-aes128",
            "-passout",
            "pass:second-secret",
            "-out",
            "legacy.key",
            "2048",
        ],
    );
    for (key, pass) in [("p8", "first-secret"), ("legacy", "second-secret")] {
        openssl_in(
            &conf_dir,
            &[
                "req",
                "-x509",
                "-new",
                "-key",
                &format!("{key}.key"),
                "-passin",
                &format!("pass:{pass}"),
                "-subj",
                "/CN=localhost",
                "-days",
                "2",
                "-out",
                &format!("{key}.crt"),
            ],
        );
    }
    let p8 = std::fs::read_to_string(conf_dir.join("p8.key")).unwrap();
    assert!(p8.contains("BEGIN ENCRYPTED PRIVATE KEY"), "{p8}");
    let legacy = std::fs::read_to_string(conf_dir.join("legacy.key")).unwrap();
    assert!(legacy.contains("Proc-Type: 4,ENCRYPTED"), "{legacy}");
    std::fs::write(
        conf_dir.join("pw"),
        "wrong\nfirst-secret\r\nsecond-secret\n",
    )
    .unwrap();
    let cd = conf_dir.display().to_string();
    let conf = "worker_processes 1;\nevents {}\n\
         http { access_log off; ssl_password_file CD/pw;\n \
         server { listen 127.0.0.1:{port}; location = /status { shard_status; } }\n \
         server { listen 127.0.0.1:{port1} ssl; ssl_certificate CD/p8.crt; \
         ssl_certificate_key CD/p8.key; location / { return 200 \"p8 ok\"; } } }\n\
         stream { server { listen 127.0.0.1:{port2} ssl; ssl_password_file CD/pw; \
         ssl_certificate CD/legacy.crt; ssl_certificate_key CD/legacy.key; \
         return \"legacy ok\"; } }\n"
        .replace("CD", &cd);
    let text = conf
        .replace("{port}", &free_port().to_string())
        .replace("{port1}", &free_port().to_string())
        .replace("{port2}", &free_port().to_string());
    std::fs::write(conf_dir.join("shard.conf"), &text).unwrap();
    let (code, out) = run_cli(&["-t", "-p", dir.to_str().unwrap(), "-c", "conf/shard.conf"]);
    assert_eq!(code, 0, "{out}");
    let s = Server::start_ports("tls-password-file-run", &conf, 1, 2);
    let (out, err) = s_client(
        s.ports[0],
        &["-servername", "localhost", "-ign_eof"],
        "localhost",
    );
    assert!(out.contains("p8 ok"), "{out}\n{err}");
    let (out, err) = s_client(s.ports[1], &["-ign_eof"], "localhost");
    assert!(out.contains("legacy ok"), "{out}\n{err}");
    // No passphrase fits: -t names the key.
    std::fs::write(conf_dir.join("pw"), "wrong\n").unwrap();
    let (code, out) = run_cli(&["-t", "-p", dir.to_str().unwrap(), "-c", "conf/shard.conf"]);
    assert_ne!(code, 0);
    assert!(
        out.contains("cannot load certificate key") && out.contains("bad decrypt"),
        "{out}"
    );
    // No password file at all.
    std::fs::write(
        conf_dir.join("shard.conf"),
        text.replace(&format!("ssl_password_file {cd}/pw;"), ""),
    )
    .unwrap();
    let (code, out) = run_cli(&["-t", "-p", dir.to_str().unwrap(), "-c", "conf/shard.conf"]);
    assert_ne!(code, 0);
    assert!(out.contains("the key is encrypted"), "{out}");
    // A FIFO that is written to once (nginx's ssl_password_file.t): read once, though two
    // servers use it and one of them is on no `ssl` address (its key is checked all the
    // same, as nginx checks it).
    let fifo = conf_dir.join("fifo");
    let c_path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
    let writer = {
        let fifo = fifo.clone();
        std::thread::spawn(move || std::fs::write(&fifo, "first-secret\n"))
    };
    let once = "worker_processes 1;\nevents {}\n\
         http { ssl_password_file CD/fifo; ssl_certificate CD/p8.crt; ssl_certificate_key CD/p8.key;\n \
         server { listen 127.0.0.1:PORT1 ssl; return 200; }\n \
         server { listen 127.0.0.1:PORT2; server_name other; } }\n"
        .replace("CD", &cd)
        .replace("PORT1", &free_port().to_string())
        .replace("PORT2", &free_port().to_string());
    std::fs::write(conf_dir.join("once.conf"), &once).unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_shard"))
        .args(["-t", "-p", dir.to_str().unwrap(), "-c", "conf/once.conf"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let status = wait_for_or_kill(&mut child, TIMEOUT);
    assert!(
        status.is_some_and(|s| s.success()),
        "-t with a FIFO: {status:?}"
    );
    writer.join().unwrap().unwrap();
    // The server on no `ssl` address with a key no passphrase opens: -t fails on it.
    std::fs::write(conf_dir.join("pw"), "first-secret\n").unwrap();
    std::fs::write(
        conf_dir.join("plain.conf"),
        once.replace(&format!("{cd}/fifo"), &format!("{cd}/pw")).replace(
            "server_name other;",
            &format!("server_name other; ssl_certificate {cd}/legacy.crt; ssl_certificate_key {cd}/legacy.key;"),
        ),
    )
    .unwrap();
    let (code, out) = run_cli(&["-t", "-p", dir.to_str().unwrap(), "-c", "conf/plain.conf"]);
    assert_ne!(code, 0, "{out}");
    assert!(
        out.contains("legacy.key") && out.contains("bad decrypt"),
        "{out}"
    );
}

/// Waits for `child` up to `limit`; kills it and says `None` when it did not end.
fn wait_for_or_kill(
    child: &mut std::process::Child,
    limit: Duration,
) -> Option<std::process::ExitStatus> {
    let deadline = std::time::Instant::now() + limit;
    loop {
        if let Ok(Some(st)) = child.try_wait() {
            return Some(st);
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `ssl_stapling on` with `ssl_stapling_file`: the file's OCSP response is stapled to the
/// handshake (`openssl s_client -status` reads it back); without the file nothing is.
#[test]
fn ssl_stapling_file_is_stapled() {
    if !have("openssl") {
        skipped("ssl_stapling_file_is_stapled", "openssl is not installed");
        return;
    }
    let dir = temp_dir("tls-stapling").keep();
    let _p = pki(&dir, &["s.test"]);
    // The smallest OCSP response: status malformedRequest (1), no response bytes.
    std::fs::write(dir.join("conf/resp.der"), [0x30, 0x03, 0x0a, 0x01, 0x01]).unwrap();
    let conf = format!(
        "worker_processes 1;\nevents {{}}\nhttp {{ access_log off;\n \
         server {{ listen 127.0.0.1:{{port}}; location = /status {{ shard_status; }} }}\n \
         server {{ listen 127.0.0.1:{{port1}} ssl; ssl_certificate {d}/conf/s.test.pem; \
         ssl_certificate_key {d}/conf/s.test.key; ssl_stapling on; \
         ssl_stapling_file {d}/conf/resp.der; return 200 stapled; }}\n \
         server {{ listen 127.0.0.1:{{port2}} ssl; ssl_certificate {d}/conf/s.test.pem; \
         ssl_certificate_key {d}/conf/s.test.key; return 200 plain; }} }}\n",
        d = dir.display()
    );
    let s = Server::start_ports("tls-stapling-run", &conf, 1, 2);
    let (out, err) = s_client(
        s.ports[0],
        &["-status", "-servername", "s.test", "-ign_eof"],
        "s.test",
    );
    assert!(out.contains("stapled"), "{out}\n{err}");
    assert!(
        out.to_ascii_lowercase()
            .contains("ocsp response status: malformedrequest"),
        "{out}\n{err}"
    );
    let (out, err) = s_client(
        s.ports[1],
        &["-status", "-servername", "s.test", "-ign_eof"],
        "s.test",
    );
    assert!(
        out.contains("OCSP response: no response sent"),
        "{out}\n{err}"
    );
}

/// `ssl_conf_command`: `Ciphersuites` narrows TLS 1.3's suites and `MaxProtocol` the
/// versions, seen by `openssl s_client`; a command shard cannot apply fails `-t` with its
/// line.
#[test]
fn ssl_conf_command_shapes_the_handshake() {
    if !have("openssl") {
        skipped(
            "ssl_conf_command_shapes_the_handshake",
            "openssl is not installed",
        );
        return;
    }
    let dir = temp_dir("tls-conf-command").keep();
    let _p = pki(&dir, &["s.test", "o.test"]);
    let d = dir.display();
    let cert =
        format!("ssl_certificate {d}/conf/s.test.pem; ssl_certificate_key {d}/conf/s.test.key;");
    // Port 3: `Certificate` and `PrivateKey` replace the pair `ssl_certificate` named.
    // Port 4: the default server's certificate has variables, and a server of the same
    // address without one handshakes with it (nginx keeps the default's context).
    let conf = format!(
        "worker_processes 1;\nevents {{}}\nhttp {{ access_log off;\n \
         geo $crt {{ default s.test; }}\n \
         server {{ listen 127.0.0.1:{{port}}; location = /status {{ shard_status; }} }}\n \
         server {{ listen 127.0.0.1:{{port1}} ssl; {cert} \
         ssl_conf_command Ciphersuites TLS_CHACHA20_POLY1305_SHA256; return 200 chacha; }}\n \
         server {{ listen 127.0.0.1:{{port2}} ssl; {cert} \
         ssl_conf_command MaxProtocol TLSv1.2; ssl_conf_command Options -SessionTicket; \
         return 200 twelve; }}\n \
         server {{ listen 127.0.0.1:{{port3}} ssl; {cert} \
         ssl_conf_command Certificate {d}/conf/o.test.pem; \
         ssl_conf_command PrivateKey {d}/conf/o.test.key; return 200 other; }}\n \
         server {{ listen 127.0.0.1:{{port4}} ssl; server_name default; \
         ssl_certificate {d}/conf/$crt.pem; ssl_certificate_key {d}/conf/$crt.key; \
         return 200 \"default $ssl_server_name\"; }}\n \
         server {{ listen 127.0.0.1:{{port4}} ssl; server_name nocert; \
         return 200 \"nocert $ssl_server_name\"; }} }}\n"
    );
    let s = Server::start_ports("tls-conf-command-run", &conf, 1, 4);
    // The certificate presented, as PEM, and the first of a file's.
    let pem = |text: &str| {
        let begin = text.find("-----BEGIN CERTIFICATE-----").unwrap_or(0);
        let end = text[begin..]
            .find("-----END CERTIFICATE-----")
            .map_or(begin, |e| begin + e);
        text[begin..end].replace(['\r', '\n'], "")
    };
    let file = |name: &str| pem(&std::fs::read_to_string(dir.join("conf").join(name)).unwrap());
    let subject = |out: &str| {
        let shown = pem(out);
        ["o.test.pem", "s.test.pem"]
            .into_iter()
            .find(|f| file(f) == shown)
            .map_or("none", |f| f.trim_end_matches(".pem"))
    };
    let (out, err) = s_client(s.ports[2], &["-ign_eof"], "s.test");
    assert!(out.contains("other"), "{out}\n{err}");
    assert!(subject(&out).contains("o.test"), "{out}\n{err}");
    let (out, err) = s_client(s.ports[3], &["-ign_eof", "-servername", "nocert"], "nocert");
    assert!(out.contains("nocert nocert"), "{out}\n{err}");
    assert!(subject(&out).contains("s.test"), "{out}\n{err}");
    let (out, err) = s_client(s.ports[0], &["-tls1_3", "-ign_eof"], "s.test");
    assert!(out.contains("chacha"), "{out}\n{err}");
    assert!(out.contains("TLS_CHACHA20_POLY1305_SHA256"), "{out}\n{err}");
    let (out, err) = s_client(s.ports[1], &["-ign_eof"], "s.test");
    assert!(out.contains("twelve"), "{out}\n{err}");
    assert!(out.contains("TLSv1.2"), "{out}\n{err}");
    assert!(!out.contains("TLSv1.3"), "{out}\n{err}");
    // A command shard has no meaning for.
    let bad = temp_dir("tls-conf-command-bad");
    std::fs::write(
        bad.join("conf/shard.conf"),
        "events {}\nhttp { server { listen 127.0.0.1:1;\n ssl_conf_command SignatureAlgorithms RSA+SHA256; } }\n",
    )
    .unwrap();
    let (code, out) = run_cli(&["-t", "-p", bad.to_str().unwrap(), "-c", "conf/shard.conf"]);
    assert_ne!(code, 0);
    assert!(
        out.contains("\"ssl_conf_command SignatureAlgorithms\" is not supported by shard")
            && out.contains("shard.conf:3"),
        "{out}"
    );
}

/// stream `ssl_alpn`: the protocol both sides list is chosen (`$ssl_alpn_protocol`); a
/// client offering none of them fails its handshake, as nginx's OpenSSL refuses it.
#[test]
fn stream_ssl_alpn_negotiates_or_refuses() {
    let dir = temp_dir("tls-stream-alpn").keep();
    let p = pki(&dir, &["s.test"]);
    let conf = format!(
        "worker_processes 1;\nevents {{}}\n\
         http {{ access_log off; server {{ listen 127.0.0.1:{{port}}; \
         location = /status {{ shard_status; }} }} }}\n\
         stream {{ log_format st $status; access_log {d}/stream.log st; \
         server {{ listen 127.0.0.1:{{port1}} ssl; ssl_alpn foo bar; \
         ssl_certificate {d}/conf/s.test.pem; ssl_certificate_key {d}/conf/s.test.key; \
         return \"alpn=$ssl_alpn_protocol\"; }} }}\n",
        d = dir.display()
    );
    let s = Server::start_ports("tls-stream-alpn-run", &conf, 1, 1);
    let with = |protos: &[&[u8]]| {
        let base = client_config(&p.ca, &[&rustls::version::TLS13]);
        let mut c = (*base).clone();
        c.alpn_protocols = protos.iter().map(|p| p.to_vec()).collect();
        Arc::new(c)
    };
    let mut c = connect_tls(tls_addr(&s), "s.test", &with(&[b"baz", b"bar"])).unwrap();
    assert_eq!(c.conn.alpn_protocol(), Some(&b"bar"[..]));
    let mut got = String::new();
    let _ = c.read_to_string(&mut got);
    assert_eq!(got, "alpn=bar");
    assert!(
        connect_tls(tls_addr(&s), "s.test", &with(&[b"baz"])).is_err(),
        "no common protocol: the handshake fails"
    );
    // A client without ALPN is served.
    let mut c = connect_tls(tls_addr(&s), "s.test", &with(&[])).unwrap();
    let mut got = String::new();
    let _ = c.read_to_string(&mut got);
    assert_eq!(got, "alpn=");
    // The failed handshake is logged as nginx's stream logs it: 500.
    wait_for(TIMEOUT, "three sessions logged", || {
        let log = std::fs::read_to_string(dir.join("stream.log")).ok()?;
        (log.lines().count() >= 3).then_some(log)
    });
    let log = std::fs::read_to_string(dir.join("stream.log")).unwrap();
    assert_eq!(log.lines().filter(|l| *l == "500").count(), 1, "{log}");
}

/// `ssl_ecdh_curve`: the key exchange group comes from its list (`s_client` names it).
#[test]
fn ssl_ecdh_curve_chooses_the_group() {
    if !have("openssl") {
        skipped(
            "ssl_ecdh_curve_chooses_the_group",
            "openssl is not installed",
        );
        return;
    }
    let dir = temp_dir("tls-ecdh-curve").keep();
    let _p = pki(&dir, &["s.test"]);
    let conf = format!(
        "worker_processes 1;\nevents {{}}\nhttp {{ access_log off;\n \
         server {{ listen 127.0.0.1:{{port}}; location = /status {{ shard_status; }} }}\n \
         server {{ listen 127.0.0.1:{{port1}} ssl; ssl_ecdh_curve secp384r1; \
         ssl_certificate {d}/conf/s.test.pem; ssl_certificate_key {d}/conf/s.test.key; \
         return 200 p384; }} }}\n",
        d = dir.display()
    );
    let s = Server::start_ports("tls-ecdh-curve-run", &conf, 1, 1);
    for version in ["-tls1_3", "-tls1_2"] {
        let (out, err) = s_client(s.ports[0], &[version, "-ign_eof"], "s.test");
        assert!(out.contains("p384"), "{out}\n{err}");
        assert!(
            out.contains("secp384r1") || out.contains("P-384"),
            "{version}: {out}\n{err}"
        );
    }
}

/// `proxy_ssl_conf_command`: the commands shape the TLS connection to an `https://`
/// upstream (here shard itself, saying which protocol it was reached with).
#[test]
fn proxy_ssl_conf_command_shapes_the_upstream_handshake() {
    let dir = temp_dir("tls-proxy-conf-command").keep();
    let _p = pki(&dir, &["s.test"]);
    let conf = format!(
        "worker_processes 1;\nevents {{}}\nhttp {{ access_log off;\n \
         server {{ listen 127.0.0.1:{{port}}; location = /status {{ shard_status; }}\n  \
         location /twelve {{ proxy_ssl_conf_command MaxProtocol TLSv1.2; \
         proxy_pass https://127.0.0.1:{{port1}}; }}\n  \
         location / {{ proxy_pass https://127.0.0.1:{{port1}}; }} }}\n \
         server {{ listen 127.0.0.1:{{port1}} ssl; ssl_certificate {d}/conf/s.test.pem; \
         ssl_certificate_key {d}/conf/s.test.key; return 200 \"$ssl_protocol\"; }} }}\n",
        d = dir.display()
    );
    let s = Server::start_ports("tls-proxy-conf-command-run", &conf, 1, 1);
    assert_eq!(get(s.addr(), "/x").body_str(), "TLSv1.3");
    assert_eq!(get(s.addr(), "/twelve").body_str(), "TLSv1.2");
}

/// stream `ssl_verify_client`: a certificate from the trusted CA is relayed; none (with
/// `on`) or one from elsewhere ends the session after the handshake with nginx's `info`
/// line; `optional` lets a client without one through.
#[test]
fn stream_ssl_verify_client_judges_the_certificate() {
    let dir = temp_dir("tls-stream-verify").keep();
    let p = pki(&dir, &["s.test"]);
    let cas = ClientCa::new(&dir);
    let conf = format!(
        "worker_processes 1;\nerror_log logs/error.log info;\nevents {{}}\n\
         http {{ access_log off; server {{ listen 127.0.0.1:{{port}}; \
         location = /status {{ shard_status; }} }} }}\n\
         stream {{ ssl_certificate {d}/conf/s.test.pem; ssl_certificate_key {d}/conf/s.test.key;\n \
         ssl_client_certificate {d}/conf/clients.pem;\n \
         server {{ listen 127.0.0.1:{{port1}} ssl; ssl_verify_client on; \
         return \"on ok $ssl_client_verify $ssl_client_s_dn\"; }}\n \
         server {{ listen 127.0.0.1:{{port2}} ssl; ssl_verify_client optional; \
         return \"optional ok $ssl_client_verify\"; }} }}\n",
        d = dir.display()
    );
    let s = Server::start_ports("tls-stream-verify-run", &conf, 1, 2);
    let addr = |i: usize| SocketAddr::from(([127, 0, 0, 1], s.ports[i]));
    let read = |cfg: &Arc<rustls::ClientConfig>, i: usize| -> String {
        let Ok(mut c) = connect_tls(addr(i), "s.test", cfg) else {
            return String::new();
        };
        let mut got = String::new();
        let _ = c.read_to_string(&mut got);
        got
    };
    assert_eq!(
        read(&cas.client(&p.ca, true), 0),
        "on ok SUCCESS CN=client one,O=shard tests"
    );
    let none = client_config(&p.ca, &[&rustls::version::TLS13, &rustls::version::TLS12]);
    assert_eq!(read(&none, 0), "", "no certificate with on");
    assert_eq!(read(&cas.client(&p.ca, false), 0), "", "a self-signed one");
    assert_eq!(read(&none, 1), "optional ok NONE");
    let log = wait_for(TIMEOUT, "both refusals logged", || {
        let l = error_log(&s);
        (l.contains("client sent no required SSL certificate")
            && l.contains("client SSL certificate verify error: (18:self-signed certificate)"))
        .then_some(l)
    });
    assert!(log.contains("[info]"), "{log}");
}

/// `ssl_certificate` with variables (nginx 1.15.9+): the pair is rendered and loaded at each
/// handshake, with `$ssl_server_name`, maps and geo; a pair that cannot be loaded fails the
/// handshake with nginx's log line; servers with the same templates share sessions. In http
/// and in stream.
#[test]
fn certificates_with_variables_are_loaded_per_handshake() {
    let dir = temp_dir("tls-cert-vars").keep();
    let p = pki(&dir, &["a.test", "b.test", "c.test"]);
    let d = dir.join("conf");
    let conf = format!(
        "error_log logs/error.log info;\n\
         events {{ }}\n\
         http {{\n\
         map $ssl_server_name $pair {{ default a.test; c.test c.test; }}\n\
         server {{ listen 127.0.0.1:{{port}}; location = /status {{ shard_status; }} }}\n\
         server {{\n\
           listen 127.0.0.1:{{port1}} ssl;\n\
           ssl_certificate {d}/$ssl_server_name.pem;\n\
           ssl_certificate_key {d}/$ssl_server_name.key;\n\
           location / {{ return 200 \"sni=$ssl_server_name reused=$ssl_session_reused\"; }}\n\
         }}\n\
         server {{\n\
           listen 127.0.0.1:{{port2}} ssl;\n\
           ssl_certificate {d}/$pair.pem;\n\
           ssl_certificate_key {d}/$pair.key;\n\
           location / {{ return 200 \"map=$pair\"; }}\n\
         }}\n\
         }}\n\
         stream {{\n\
         geo $one {{ default a.test; }}\n\
         server {{ listen 127.0.0.1:{{port3}} ssl;\n\
           ssl_certificate {d}/$one.pem; ssl_certificate_key {d}/$one.key;\n\
           return \"stream $ssl_server_name $ssl_session_reused\"; }}\n\
         server {{ listen 127.0.0.1:{{port4}} ssl;\n\
           ssl_certificate {d}/$ssl_server_name.pem; ssl_certificate_key {d}/$ssl_server_name.key;\n\
           return \"stream sni $ssl_server_name\"; }}\n\
         }}\n",
        d = d.display()
    );
    let s = Server::start_ports("tls-cert-vars-run", &conf, 1, 4);
    let addr = |i: usize| SocketAddr::from(([127, 0, 0, 1], s.ports[i]));
    let cfg = client_config(&p.ca, &[&rustls::version::TLS13, &rustls::version::TLS12]);
    let leaf = |name: &str| p.leaves.iter().find(|(n, _)| n == name).unwrap().1.clone();
    // Each name gets its own pair: the client verifies the name against the certificate.
    for name in ["a.test", "b.test"] {
        let mut c = connect_tls(addr(0), name, &cfg).unwrap();
        assert_eq!(c.conn.peer_certificates().unwrap()[0], leaf(name));
        let (status, _, body) = request(&mut c, name, "/");
        assert_eq!(status, 200);
        assert_eq!(body, format!("sni={name} reused=.").as_bytes());
    }
    // A name with no files: the handshake fails, and the log says why.
    assert!(connect_tls(addr(0), "nx.test", &cfg).is_err());
    wait_for(TIMEOUT, "the load failure logged", || {
        error_log(&s)
            .contains(&format!(
                "cannot load certificate key \"{}/nx.test.key\"",
                d.display()
            ))
            .then_some(())
    });
    // Through a map.
    let mut c = connect_tls(addr(1), "c.test", &cfg).unwrap();
    assert_eq!(c.conn.peer_certificates().unwrap()[0], leaf("c.test"));
    assert_eq!(request(&mut c, "c.test", "/").2, b"map=c.test");
    let c = connect_tls(addr(1), "a.test", &cfg).unwrap();
    assert_eq!(c.conn.peer_certificates().unwrap()[0], leaf("a.test"));
    // A session resumes on the same templates.
    let mut c = connect_tls(addr(0), "a.test", &cfg).unwrap();
    let _ = request(&mut c, "a.test", "/");
    let mut c = connect_tls(addr(0), "a.test", &cfg).unwrap();
    assert_eq!(request(&mut c, "a.test", "/").2, b"sni=a.test reused=r");
    // Stream: geo, and the SNI.
    let read = |i: usize, name: &str| -> String {
        let Ok(mut c) = connect_tls(addr(i), name, &cfg) else {
            return String::new();
        };
        let mut got = String::new();
        let _ = c.read_to_string(&mut got);
        got
    };
    assert_eq!(read(2, "a.test"), "stream a.test .");
    assert_eq!(read(3, "b.test"), "stream sni b.test");
    assert_eq!(read(3, "nx.test"), "");
    let log = error_log(&s);
    assert!(!log.contains("panicked"), "{log}");
}

/// `proxy_ssl_verify on` with an upstream whose certificate has no DNS `subjectAltName`:
/// its common name is the name checked, as OpenSSL's `X509_check_host` does for nginx.
#[test]
fn proxy_ssl_verify_falls_back_to_the_common_name() {
    let dir = temp_dir("tls-cn").keep();
    let p = pki(&dir, &["unused.test"]);
    let ca_key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "cn test CA");
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "cn.test");
    let cert = params.signed_by(&key, &ca, &ca_key).unwrap();
    let d = p.dir.join("conf");
    std::fs::write(d.join("cnca.pem"), ca.pem()).unwrap();
    std::fs::write(d.join("cn.pem"), cert.pem()).unwrap();
    std::fs::write(d.join("cn.key"), key.serialize_pem()).unwrap();
    let conf = format!(
        "error_log logs/error.log info;\nevents {{ }}\nhttp {{\n\
         server {{ listen 127.0.0.1:{{port}}; location = /status {{ shard_status; }}\n\
           location /good {{ proxy_pass https://127.0.0.1:{{port1}}/; proxy_ssl_verify on;\n\
             proxy_ssl_trusted_certificate {d}/cnca.pem; proxy_ssl_name cn.test; }}\n\
           location /bad {{ proxy_pass https://127.0.0.1:{{port1}}/; proxy_ssl_verify on;\n\
             proxy_ssl_trusted_certificate {d}/cnca.pem; proxy_ssl_name other.test; }} }}\n\
         server {{ listen 127.0.0.1:{{port1}} ssl; ssl_certificate {d}/cn.pem;\n\
           ssl_certificate_key {d}/cn.key; location / {{ return 200 \"up\"; }} }}\n\
         }}\n",
        d = d.display()
    );
    let s = Server::start_ports("tls-cn-run", &conf, 1, 1);
    let r = get(s.addr(), "/good");
    assert_eq!((r.status, r.body_str().as_str()), (200, "up"));
    assert_eq!(get(s.addr(), "/bad").status, 502);
    let log = wait_for(TIMEOUT, "the mismatch logged", || {
        let l = error_log(&s);
        l.contains("SSL_do_handshake() failed").then_some(l)
    });
    assert!(log.contains("not valid for name"), "{log}");
}

/// `uwsgi_pass suwsgi://` speaks uwsgi over TLS with the `uwsgi_ssl_*` settings (here a
/// client certificate). The TLS side is shard's own listener, which cannot read the uwsgi
/// bytes and answers 400, carrying its server's `add_header ... always` with the certificate
/// as judged for that server, as nginx does for a request it could not read.
#[test]
fn uwsgi_over_tls_presents_its_client_certificate() {
    let tag = "tls-suwsgi";
    let dir = temp_dir(tag).keep();
    pki(&dir, &["a.test", "b.test"]);
    let path = |f: &str| dir.join("conf").join(f).to_str().unwrap().to_string();
    let extra_a = format!(
        "ssl_verify_client optional; ssl_client_certificate {};\n\
         add_header X-Verify $ssl_client_verify always;",
        path("ca.pem")
    );
    let front = String::from(
        "server { listen 127.0.0.1:{port2};\n\
         location / { uwsgi_pass suwsgi://127.0.0.1:{port1};\n\
         uwsgi_ssl_certificate b.test.pem; uwsgi_ssl_certificate_key b.test.key; }\n\
         location /anon/ { uwsgi_pass suwsgi://127.0.0.1:{port1}; } }",
    );
    let text = conf(1, &extra_a, &front)
        .replace("a.test.pem", &path("a.test.pem"))
        .replace("a.test.key", &path("a.test.key"))
        .replace("b.test.pem;", &format!("{};", path("b.test.pem")))
        .replace("b.test.key;", &format!("{};", path("b.test.key")));
    let s = Server::start_ports(tag, &text, 1, 2);
    let front = SocketAddr::from(([127, 0, 0, 1], s.ports[1]));
    let r = raw(
        front,
        b"GET /x HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(r.status, 400, "{}", r.body_str());
    assert_eq!(r.header("X-Verify"), Some("SUCCESS"), "{:?}", r.headers);
    let r = raw(
        front,
        b"GET /anon/x HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(r.status, 400, "{}", r.body_str());
    assert_eq!(r.header("X-Verify"), Some("NONE"), "{:?}", r.headers);
}
