//! HTTP/2 (`http2 on`, `listen ... http2`) as clients see it: curl with prior knowledge
//! (`h2c`) and over TLS (ALPN `h2`), nghttp for many streams on one connection, and a client
//! on Python's `h2` (`h2client.py`) that writes frames one by one: flow control with a tiny
//! window, request bodies with and without `content-length`, and hostile clients (rapid
//! reset, a CONTINUATION flood, a PING flood, a stream id that goes backwards). Each tool
//! missing makes its part say SKIPPED.

mod support;

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use support::*;

const CLIENT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/h2client.py");

fn conf(listen_opts: &str, server_extra: &str, http_extra: &str) -> String {
    format!(
        "worker_processes 1;\n\
         error_log logs/error.log info;\n\
         pid logs/shard.pid;\n\
         events {{ worker_connections 512; }}\n\
         http {{\n\
         {http_extra}\n\
         log_format h2 '$request|$server_protocol|$http2|$status|$body_bytes_sent|$connection_requests|$connection';\n\
         server {{\n\
           listen 127.0.0.1:{{port}};\n\
           location = /status {{ shard_status; }}\n\
         }}\n\
         server {{\n\
           listen 127.0.0.1:{{port1}} {listen_opts};\n\
           access_log logs/h2.log h2;\n\
           root {{dir}}/html;\n\
           {server_extra}\n\
           location = /ok {{ return 200 \"OK\\n\"; }}\n\
           location /up/ {{ proxy_pass http://127.0.0.1:{{port2}}/; }}\n\
         }}\n\
         server {{\n\
           listen 127.0.0.1:{{port2}};\n\
           access_log off;\n\
           location / {{ return 200 \"up $request_method $uri len=$content_length\"; }}\n\
         }}\n\
         }}\n"
    )
}

fn start(tag: &str, listen_opts: &str, server_extra: &str) -> Server {
    start_http(tag, listen_opts, server_extra, "")
}

fn start_http(tag: &str, listen_opts: &str, server_extra: &str, http_extra: &str) -> Server {
    let s = Server::start_ports(tag, &conf(listen_opts, server_extra, http_extra), 1, 2);
    write_file(&s.dir, "html/a.txt", b"hello file\n");
    let big: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
    write_file(&s.dir, "html/big.bin", &big);
    s
}

/// `http2 on` and a self-signed certificate for `a.test` (written under a directory named
/// after `tag`), for a server that listens with `ssl`.
fn tls_server(tag: &str) -> String {
    let dir = temp_dir(tag).keep();
    let cert = rcgen::generate_simple_self_signed(vec!["a.test".to_string()]).unwrap();
    let (crt, key) = (dir.join("a.pem"), dir.join("a.key"));
    std::fs::write(&crt, cert.cert.pem()).unwrap();
    std::fs::write(&key, cert.key_pair.serialize_pem()).unwrap();
    format!(
        "http2 on; ssl_certificate {}; ssl_certificate_key {};",
        crt.display(),
        key.display()
    )
}

fn h2_addr(s: &Server) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], s.ports[0]))
}

fn have(tool: &str) -> bool {
    Command::new(tool)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success() || !o.stdout.is_empty())
}

/// curl built with HTTP/2 (Debian's is).
fn curl_h2() -> bool {
    Command::new("curl")
        .arg("-V")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("HTTP2"))
}

/// A Python that has the `h2` package (Debian's `python3-h2` is for /usr/bin/python3); when
/// there is none, the part of the test named `what` says SKIPPED.
fn python_h2(what: &str) -> Option<&'static str> {
    python_with(
        "h2",
        what,
        "python3-h2 is not installed (apt-get install python3-h2)",
    )
}

fn h2client(py: &str, port: u16, args: &[&str]) -> String {
    run_client(py, CLIENT, 30, port, args)
}

fn curl(args: &[&str]) -> String {
    let out = Command::new("curl")
        .args(["-s", "--max-time", "10"])
        .args(args)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn log_lines(dir: &Path, n: usize) -> Vec<String> {
    wait_for(Duration::from_secs(10), "access log lines", || {
        let text = std::fs::read_to_string(dir.join("logs/h2.log")).unwrap_or_default();
        let lines: Vec<String> = text.lines().map(str::to_string).collect();
        (lines.len() >= n).then_some(lines)
    })
}

/// `h2c` with prior knowledge: `return`, a static file larger than every initial window,
/// the proxy, and HTTP/1.1 on the same address; the access log says what was spoken.
#[test]
fn h2c_prior_knowledge_serves_return_files_and_the_proxy() {
    if !curl_h2() {
        skipped(
            "h2c with curl",
            "curl with HTTP/2 is not installed (apt-get install curl)",
        );
        return;
    }
    let s = start("h2-h2c", "", "http2 on;");
    let base = format!("http://{}", h2_addr(&s));
    let v = curl(&[
        "--http2-prior-knowledge",
        "-w",
        "|%{http_version}",
        &format!("{base}/ok"),
    ]);
    assert_eq!(v, "OK\n|2");
    let v = curl(&["--http2-prior-knowledge", &format!("{base}/a.txt")]);
    assert_eq!(v, "hello file\n");
    let out = Command::new("curl")
        .args(["-s", "--max-time", "10", "--http2-prior-knowledge"])
        .arg(format!("{base}/big.bin"))
        .output()
        .unwrap();
    assert_eq!(
        out.stdout,
        std::fs::read(s.dir.join("html/big.bin")).unwrap()
    );
    let v = curl(&[
        "--http2-prior-knowledge",
        "-d",
        "a=1",
        &format!("{base}/up/x?y"),
    ]);
    assert_eq!(v, "up POST /x len=3");
    let v = curl(&["--http2-prior-knowledge", "-I", &format!("{base}/a.txt")]);
    assert!(v.starts_with("HTTP/2 200"), "{v}");
    assert!(v.contains("content-length: 11"), "{v}");
    // HTTP/1.1 still on the same address.
    assert_eq!(get(h2_addr(&s), "/ok").body_str(), "OK\n");
    let lines = log_lines(&s.dir, 6);
    assert!(
        lines[0].starts_with("GET /ok HTTP/2.0|HTTP/2.0|h2c|200|3|"),
        "{lines:?}"
    );
    assert!(lines[2].contains("|h2c|200|300000|"), "{lines:?}");
    assert!(
        lines[4].starts_with("HEAD /a.txt HTTP/2.0|HTTP/2.0|h2c|200|0|"),
        "{lines:?}"
    );
    // An empty `$http2` is logged as nginx logs empty values.
    assert!(
        lines[5].starts_with("GET /ok HTTP/1.1|HTTP/1.1|-|200|3|"),
        "{lines:?}"
    );
}

/// Without `http2`, the preface is a request line whose `*` target nginx 1.22 refuses
/// before it reads the version: 400 (checked against nginx 1.22.1);
/// `listen ... http2`
/// (the form before 1.25.1) turns it on for the address.
#[test]
fn http2_is_off_unless_asked_for_and_listen_http2_turns_it_on() {
    let s = start("h2-off", "", "");
    let r = raw(h2_addr(&s), b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n");
    assert_eq!(r.status, 400);
    drop(s);
    let Some(py) = python_h2("listen http2") else {
        return;
    };
    let s = start("h2-listen", "http2", "");
    let out = h2client(py, s.ports[0], &["get", "3", "/ok"]);
    assert_eq!(
        out,
        "stream 1 200 3\nstream 3 200 3\nstream 5 200 3\nend done\n"
    );
}

/// Many streams at once on one connection (nghttp and the Python client): every one is
/// answered, and the access log shows one connection carried them.
#[test]
fn many_streams_share_one_connection() {
    let s = start("h2-multi", "", "http2 on;");
    let Some(py) = python_h2("HTTP/2 streams") else {
        return;
    };
    let out = h2client(py, s.ports[0], &["get", "50", "/a.txt"]);
    let answered = out.lines().filter(|l| l.ends_with(" 200 11")).count();
    assert_eq!(answered, 50, "{out}");
    assert!(out.ends_with("end done\n"), "{out}");
    let lines = log_lines(&s.dir, 50);
    let conns: std::collections::BTreeSet<&str> = lines
        .iter()
        .map(|l| l.rsplit('|').next().unwrap())
        .collect();
    assert_eq!(conns.len(), 1, "{lines:?}");
    // `$connection_requests` counts the connection's streams, 1 to 50.
    let mut counts: Vec<u32> = lines
        .iter()
        .map(|l| l.rsplit('|').nth(1).unwrap().parse().unwrap())
        .collect();
    counts.sort();
    assert_eq!(counts, (1..=50).collect::<Vec<u32>>(), "{lines:?}");
    if have("nghttp") {
        let out = Command::new("nghttp")
            .args(["-n", "-s", "-t", "10"])
            .args((0..20).map(|i| format!("http://{}/a.txt?{i}", h2_addr(&s))))
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{text}");
        let answered = text
            .lines()
            .filter(|l| l.contains("  200   11 /a.txt?"))
            .count();
        assert_eq!(answered, 20, "{text}");
    } else {
        skipped(
            "nghttp",
            "nghttp2-client is not installed (apt-get install nghttp2-client)",
        );
    }
}

/// A client window of 1000 bytes: a 300,000-byte file arrives in frames no larger than the
/// window, as the client gives it back, without the worker spinning meanwhile.
#[test]
fn responses_wait_for_the_clients_window() {
    let Some(py) = python_h2("HTTP/2 flow control") else {
        return;
    };
    let s = start("h2-window", "", "http2 on;");
    let out = h2client(py, s.ports[0], &["window", "/big.bin", "1000"]);
    assert_eq!(out, "status 200 bytes 300000 end done\n");
    let out = h2client(py, s.ports[0], &["window", "/up/w", "7"]);
    assert_eq!(out, "status 200 bytes 14 end done\n");
}

/// Request bodies in DATA frames reach the upstream, with and without `content-length`.
#[test]
fn request_bodies_are_proxied() {
    let Some(py) = python_h2("HTTP/2 bodies") else {
        return;
    };
    let s = start("h2-body", "", "http2 on;");
    let out = h2client(py, s.ports[0], &["post", "/up/b", "100000", "length"]);
    assert_eq!(out, "up POST /b len=100000 end done\n");
    let out = h2client(py, s.ports[0], &["post", "/up/b", "70000", "none"]);
    assert_eq!(out, "up POST /b len=70000 end done\n");
}

/// Hostile clients get a GOAWAY or a closed connection, and the worker goes on serving
/// everyone else: the same worker pid answers afterwards.
#[test]
fn hostile_clients_are_cut_off_and_the_worker_serves_on() {
    let Some(py) = python_h2("hostile HTTP/2 clients") else {
        return;
    };
    // send_timeout is short for the zero-window case, yet long enough that a flooding
    // client busy with its own frames is not taken for one that stopped reading.
    let mut s = start("h2-hostile", "", "http2 on; send_timeout 3s;");
    let before = s.wait_workers(1)[0].pid;
    // Rapid reset: the connection ends (ENHANCE_YOUR_CALM or a reset) long before 5000.
    let out = h2client(py, s.ports[0], &["rapid", "5000"]);
    assert!(
        out.starts_with("end reset after") || out.contains("goaway 11") || out == "end closed\n",
        "{out}"
    );
    // A header block continued forever: GOAWAY (protocol error or too large).
    let out = h2client(py, s.ports[0], &["raw", "continuation"]);
    assert!(
        out == "goaway 1\n" || out == "goaway 11\n" || out == "goaway None\n",
        "{out}"
    );
    // Stream ids must grow: PROTOCOL_ERROR.
    let out = h2client(py, s.ports[0], &["raw", "stream-id"]);
    assert_eq!(out, "goaway 1\n");
    // 10 MB of PINGs from a client that reads the answers: nginx's flood rule (more than
    // 8 times the bytes of its requests, past 1 MiB) ends it with GOAWAY NO_ERROR.
    let out = h2client(py, s.ports[0], &["raw", "ping"]);
    assert_eq!(out, "goaway 0\n");
    wait_for(Duration::from_secs(5), "the flood in the log", || {
        error_log(&s).contains("http2 flood detected").then_some(())
    });
    // Empty DATA frames in bulk: h2's limit, ENHANCE_YOUR_CALM.
    let out = h2client(py, s.ports[0], &["raw", "empty-data"]);
    assert_eq!(out, "goaway 11\n");
    // 20,000 SETTINGS, PRIORITY or WINDOW_UPDATE frames are answered or taken (a few hundred
    // KB, under the flood rule); what matters is that nothing grows and nobody else waits.
    for kind in ["settings", "priority", "window-update"] {
        let _ = h2client(py, s.ports[0], &["raw", kind]);
    }
    // A window of 0 held forever: the stream's response cannot move, and `send_timeout`
    // ends it (the connection stays for other streams).
    let _ = h2client(py, s.ports[0], &["raw", "zero-window"]);
    wait_for(
        Duration::from_secs(5),
        "the stalled stream's timeout",
        || {
            error_log(&s)
                .contains(
                    "client timed out (110: Connection timed out) while sending response to client",
                )
                .then_some(())
        },
    );
    let out = h2client(py, s.ports[0], &["get", "2", "/ok"]);
    assert_eq!(out, "stream 1 200 3\nstream 3 200 3\nend done\n");
    assert_eq!(s.wait_workers(1)[0].pid, before, "the worker was replaced");
    let log = error_log(&s);
    assert!(!log.contains("panicked"), "{log}");
}

/// A graceful stop sends GOAWAY to an HTTP/2 connection, lets its stream finish and then
/// closes it; the worker exits.
#[test]
fn a_graceful_stop_finishes_streams_and_closes_sessions() {
    let Some(py) = python_h2("HTTP/2 stop") else {
        return;
    };
    let mut s = start("h2-stop", "", "http2 on;");
    let out = h2client(py, s.ports[0], &["get", "1", "/ok"]);
    assert_eq!(out, "stream 1 200 3\nend done\n");
    s.signal(libc::SIGQUIT);
    assert_eq!(s.wait_exit(Duration::from_secs(15)), 0);
}

/// Over TLS, ALPN chooses `h2` where a server of the address has `http2 on`, and the TLS
/// variables of a stream are its connection's; a client that offers only http/1.1 gets it.
#[test]
fn tls_alpn_negotiates_h2_and_streams_see_the_tls_variables() {
    if !curl_h2() {
        skipped(
            "h2 over TLS",
            "curl with HTTP/2 is not installed (apt-get install curl)",
        );
        return;
    }
    let extra = format!(
        "{}\nlocation = /v {{ return 200 \"$http2 $https $ssl_protocol $server_protocol\"; }}",
        tls_server("h2-tls-pki")
    );
    let s = start("h2-tls", "ssl", &extra);
    let url = format!("https://a.test:{}/v", s.ports[0]);
    let resolve = format!("a.test:{}:127.0.0.1", s.ports[0]);
    let v = curl(&[
        "-k",
        "--http2",
        "--resolve",
        &resolve,
        "-w",
        "|%{http_version}",
        &url,
    ]);
    assert_eq!(v, "h2 on TLSv1.3 HTTP/2.0|2");
    let v = curl(&[
        "-k",
        "--http1.1",
        "--resolve",
        &resolve,
        "-w",
        "|%{http_version}",
        &url,
    ]);
    assert_eq!(v, " on TLSv1.3 HTTP/1.1|1.1");
    // The h2c preface in plain text to the TLS address is a bad HTTP/1.x request (nginx's
    // h2_ssl.t), not an HTTP/2 session.
    let r = raw(h2_addr(&s), b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n");
    assert_eq!(r.status, 400);
    let big = format!("https://a.test:{}/big.bin", s.ports[0]);
    let out = Command::new("curl")
        .args([
            "-s",
            "-k",
            "--max-time",
            "10",
            "--http2",
            "--resolve",
            &resolve,
            &big,
        ])
        .output()
        .unwrap();
    assert_eq!(
        out.stdout,
        std::fs::read(s.dir.join("html/big.bin")).unwrap()
    );
}

/// `ssl_verify_client` judges an HTTP/2 stream's certificate (the session's) for the
/// stream's server, and a stream whose `:authority` is not the negotiated name is 421 there,
/// as nginx's `h2_ssl_verify_client.t`.
#[test]
fn streams_are_judged_by_the_sessions_client_certificate() {
    if !curl_h2() {
        skipped(
            "h2 client certificates",
            "curl with HTTP/2 is not installed (apt-get install curl)",
        );
        return;
    }
    let dir = temp_dir("h2-mtls-client").keep();
    let client = rcgen::generate_simple_self_signed(vec!["client".to_string()]).unwrap();
    let (crt, key) = (dir.join("c.pem"), dir.join("c.key"));
    std::fs::write(&crt, client.cert.pem()).unwrap();
    std::fs::write(&key, client.key_pair.serialize_pem()).unwrap();
    let extra = format!(
        "{}\nssl_verify_client optional_no_ca;\n\
         location = /cv {{ return 200 \"$ssl_client_verify\"; }}",
        tls_server("h2-mtls-pki")
    );
    let s = start("h2-mtls", "ssl", &extra);
    let url = format!("https://a.test:{}/cv", s.ports[0]);
    let resolve = format!("a.test:{}:127.0.0.1", s.ports[0]);
    let base = [
        "-k",
        "--http2",
        "--resolve",
        &resolve,
        "-w",
        "|%{http_code}|%{http_version}",
    ];
    let with_cert = |more: &[&str]| {
        let mut args: Vec<&str> = base.to_vec();
        args.extend_from_slice(&[
            "--cert",
            crt.to_str().unwrap(),
            "--key",
            key.to_str().unwrap(),
        ]);
        args.extend_from_slice(more);
        args.push(&url);
        curl(&args)
    };
    assert_eq!(
        with_cert(&[]),
        "FAILED:self-signed certificate|200|2",
        "the certificate is judged for the stream"
    );
    let mut args: Vec<&str> = base.to_vec();
    args.push(&url);
    assert_eq!(curl(&args), "NONE|200|2");
    let misdirected = with_cert(&["-H", "Host: other.test"]);
    assert!(misdirected.ends_with("|421|2"), "{misdirected}");
}

/// `keepalive_requests` counts streams: after the third, GOAWAY, and the client goes on on a
/// new connection (nginx's HTTP/2 behaviour since 1.19.7).
#[test]
fn keepalive_requests_ends_a_connection_after_its_streams() {
    let Some(py) = python_h2("HTTP/2 keepalive_requests") else {
        return;
    };
    let s = start("h2-kareq", "", "http2 on; keepalive_requests 3;");
    let out = h2client(py, s.ports[0], &["seq", "5", "/ok"]);
    // The GOAWAY comes as the third stream is taken; Python's `h2` stops reading there, so
    // the third answer is seen in the access log, and no fourth stream was ever served.
    assert!(
        out.starts_with("stream 1 200\nstream 3 200\nstream 5 reset None\nend goaway 0\n"),
        "{out}"
    );
    let lines = log_lines(&s.dir, 3);
    assert_eq!(lines.len(), 3, "{lines:?}");
    assert!(
        lines[2].starts_with("GET /ok HTTP/2.0|HTTP/2.0|h2c|200|3|"),
        "{lines:?}"
    );
}

/// A reload sends GOAWAY to the old worker's HTTP/2 connections: a stream in flight (a file
/// under `limit_rate`, written from its timer, outside any socket event of the connection)
/// finishes whole, and new connections go to the new worker.
#[test]
fn a_stream_in_flight_finishes_across_a_reload() {
    if !have("nghttp") {
        skipped(
            "HTTP/2 reload",
            "nghttp2-client is not installed (apt-get install nghttp2-client)",
        );
        return;
    }
    let mut s = start(
        "h2-reload",
        "",
        "http2 on; location /slow/ { alias {dir}/html/; limit_rate 200k; }",
    );
    let old = s.wait_workers(1)[0].pid;
    let url = format!("http://{}/slow/big.bin", h2_addr(&s));
    let client = std::thread::spawn(move || {
        Command::new("timeout")
            .args(["30", "nghttp", &url])
            .output()
            .unwrap()
    });
    // The download takes about 1.5 s; reload once it is under way.
    // (The status request is one writer; the stream is the other.)
    wait_for(Duration::from_secs(10), "the download to start", || {
        (try_status_field(&s, "writing")? >= 2).then_some(())
    });
    s.signal(libc::SIGHUP);
    wait_for(Duration::from_secs(10), "a new worker", || {
        let w = s.workers();
        w.iter().any(|w| w.pid != old).then_some(())
    });
    let out = client.join().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        out.stdout,
        std::fs::read(s.dir.join("html/big.bin")).unwrap()
    );
    // The new generation speaks HTTP/2 too.
    if curl_h2() {
        let v = curl(&[
            "--http2-prior-knowledge",
            &format!("http://{}/ok", h2_addr(&s)),
        ]);
        assert_eq!(v, "OK\n");
    }
}

/// A browser: headless Chromium loads a page with 50 assets over https, and shard's access
/// log shows one connection carried them all, with `$http2` = `h2`.
#[test]
fn a_browser_loads_a_page_and_its_fifty_assets_on_one_connection() {
    let Some(chromium) = ["chromium", "chromium-browser", "google-chrome"]
        .into_iter()
        .find(|b| have(b))
    else {
        skipped(
            "HTTP/2 with a browser",
            "chromium is not installed (apt-get install chromium)",
        );
        return;
    };
    let extra = tls_server("h2-browser-pki");
    let s = start("h2-browser", "ssl", &extra);
    let mut page = String::from("<html><body>\n");
    for i in 0..50 {
        write_file(
            &s.dir,
            &format!("html/asset/{i}.txt"),
            format!("asset {i}").as_bytes(),
        );
        page.push_str(&format!("<iframe src=\"/asset/{i}.txt\"></iframe>\n"));
    }
    page.push_str("</body></html>\n");
    write_file(&s.dir, "html/index.html", page.as_bytes());
    let profile = temp_dir("h2-browser-profile");
    let out = Command::new("timeout")
        .arg("60")
        .arg(chromium)
        .args([
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--ignore-certificate-errors",
            "--host-resolver-rules=MAP a.test 127.0.0.1",
        ])
        .arg(format!("--user-data-dir={}", profile.keep().display()))
        .arg("--dump-dom")
        .arg(format!("https://a.test:{}/", s.ports[0]))
        .output()
        .unwrap();
    let dom = String::from_utf8_lossy(&out.stdout);
    assert!(
        dom.contains("asset/49.txt"),
        "{dom}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines = log_lines(&s.dir, 51);
    let assets: Vec<&String> = lines
        .iter()
        .filter(|l| l.starts_with("GET /asset/"))
        .collect();
    assert_eq!(assets.len(), 50, "{lines:?}");
    let conns: std::collections::BTreeSet<&str> = lines
        .iter()
        .filter(|l| l.starts_with("GET /asset/") || l.starts_with("GET / "))
        .map(|l| l.rsplit('|').next().unwrap())
        .collect();
    assert_eq!(
        conns.len(),
        1,
        "one connection for the page and its assets: {lines:?}"
    );
    assert!(
        assets.iter().all(|l| l.contains("|HTTP/2.0|h2|200|")),
        "{lines:?}"
    );
}

/// `limit_req` judges each stream as a request: three streams at once against a zone of one
/// request a minute get one 200 and two 503s.
#[test]
fn limits_judge_each_stream() {
    let Some(py) = python_h2("HTTP/2 limits") else {
        return;
    };
    let s = start_http(
        "h2-limits",
        "",
        "http2 on;\n\
         location /lim/ { limit_req zone=one; alias {dir}/html/; }",
        "limit_req_zone $binary_remote_addr zone=one:1m rate=1r/m;",
    );
    let out = h2client(py, s.ports[0], &["get", "3", "/lim/a.txt"]);
    let mut codes: Vec<&str> = out
        .lines()
        .filter_map(|l| l.strip_prefix("stream "))
        .map(|l| l.split(' ').nth(1).unwrap())
        .collect();
    codes.sort();
    assert_eq!(codes, ["200", "503", "503"], "{out}");
}

/// A minimal HTTP/2 client on shard's own frames and HPACK (`shard_http::h2frame`,
/// `shard_http::hpack`): one request at a time on a kept connection, and `GOAWAY` read as
/// RFC 9113 says (a stream at or under the last stream id is answered; one above it was not
/// processed and is retried on a new connection).
use support::h2client as client;

/// Issue 34's reload criterion: HTTP/2 clients on kept connections through 10 reloads lose
/// no request. Each reload sends the old worker's sessions `GOAWAY` with their last stream
/// id; a stream under it is answered, one above it was not processed and goes again on a new
/// connection, as RFC 9113 allows.
#[test]
fn ten_reloads_under_http2_load_fail_no_request() {
    let mut s = start("h2-reloads", "", "http2 on;");
    s.wait_workers(1);
    let addr = h2_addr(&s);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let answered = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let clients: Vec<_> = (0..4)
        .map(|_| {
            let stop = stop.clone();
            let answered = answered.clone();
            std::thread::spawn(move || {
                let (mut ok, mut retried, mut failed) = (0u64, 0u64, Vec::new());
                let mut conn = client::Conn::open(addr).unwrap();
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    match conn.get("/a.txt") {
                        client::Outcome::Answered(200, 11) => {
                            ok += 1;
                            answered.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                        client::Outcome::Answered(st, len) => failed.push(format!("{st} {len}")),
                        client::Outcome::Retry => {
                            retried += 1;
                            conn = client::Conn::open(addr).unwrap();
                        }
                        client::Outcome::Failed(why) => {
                            failed.push(why);
                            conn = client::Conn::open(addr).unwrap();
                        }
                    }
                    if conn.goaway.is_some() {
                        conn = client::Conn::open(addr).unwrap();
                    }
                }
                (ok, retried, failed)
            })
        })
        .collect();
    for generation in 2..=11 {
        // Each reload lands on clients in the middle of their work.
        let before = answered.load(std::sync::atomic::Ordering::Relaxed);
        wait_for(Duration::from_secs(10), "requests between reloads", || {
            (answered.load(std::sync::atomic::Ordering::Relaxed) >= before + 50).then_some(())
        });
        s.signal(libc::SIGHUP);
        wait_generation(&s, generation, 1);
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (mut ok, mut failed) = (0, Vec::new());
    for c in clients {
        let (o, _, f) = c.join().unwrap();
        ok += o;
        failed.extend(f);
    }
    assert!(
        failed.is_empty(),
        "{} failed: {:?}",
        failed.len(),
        &failed[..failed.len().min(5)]
    );
    assert!(ok >= 500, "only {ok} requests answered");
}

/// Requests HTTP/2 calls malformed are reset on their stream, and the connection serves on; a
/// header block that decodes past `large_client_header_buffers` (an HPACK bomb: one entry of
/// the dynamic table referred to again and again) is answered 431.
#[test]
fn malformed_requests_are_reset_or_refused_and_bombs_end_the_connection() {
    let s = start("h2-malformed", "", "http2 on;");
    let mut c = client::Conn::open(h2_addr(&s)).unwrap();
    let e = shard_http::hpack::Encoder;
    let base = |extra: &[(&[u8], &[u8])]| {
        let mut b = Vec::new();
        e.field(b":method", b"GET", &mut b);
        e.field(b":scheme", b"http", &mut b);
        e.field(b":path", b"/ok", &mut b);
        for (n, v) in extra {
            e.field(n, v, &mut b);
        }
        b
    };
    for (what, block) in [
        (
            "a connection field",
            base(&[(b"connection", b"keep-alive")]),
        ),
        ("te other than trailers", base(&[(b"te", b"gzip")])),
    ] {
        match c.send(&block) {
            client::Outcome::Failed(why) => assert_eq!(why, "reset 1", "{what}"),
            _ => panic!("{what}: not reset"),
        }
    }
    // What nginx answers with 400 rather than a reset (`ngx_http_v2_validate_header`, its
    // pseudo-header checks): bad names and values, missing or repeated pseudo-headers.
    for (what, block) in [
        ("an uppercase name", base(&[(b"X-Upper", b"1")])),
        ("a colon in a name", base(&[(b"x:foo", b"1")])),
        ("a control byte in a name", base(&[(b"foo\x02", b"1")])),
        ("a newline in a value", base(&[(b"x-foo", b"a\r\nb: c")])),
        ("no :path", {
            let mut b = Vec::new();
            e.field(b":method", b"GET", &mut b);
            e.field(b":scheme", b"http", &mut b);
            b
        }),
        ("no :scheme", {
            let mut b = Vec::new();
            e.field(b":method", b"GET", &mut b);
            e.field(b":path", b"/ok", &mut b);
            b
        }),
        ("a pseudo-header after a field", {
            let mut b = base(&[(b"x-foo", b"1")]);
            e.field(b":authority", b"localhost", &mut b);
            b
        }),
    ] {
        match c.send(&block) {
            client::Outcome::Answered(status, _) => assert_eq!(status, 400, "{what}"),
            other => panic!("{what}: {}", matches!(other, client::Outcome::Failed(_))),
        }
    }
    // Still serving on the same connection.
    assert!(matches!(c.get("/ok"), client::Outcome::Answered(200, 3)));
    // 4,000 bytes put in the dynamic table once (literal with indexing), then referred to
    // 20 times: 80 KB decoded from about 4 KB, past the 32 KB of
    // `large_client_header_buffers 4 8k`: abuse, as nginx 1.22 takes it (GOAWAY
    // ENHANCE_YOUR_CALM naming the stream).
    let mut bomb = base(&[]);
    bomb.extend_from_slice(&[0x40, 0x01, b'x', 0x7f, 0xa1, 0x1e]);
    bomb.extend(std::iter::repeat_n(b'v', 4000));
    bomb.extend(std::iter::repeat_n(0xbe, 20));
    let _ = c.send(&bomb);
    assert!(c.goaway.is_some() || c.wait_goaway(Duration::from_secs(10)));
    assert_eq!(c.goaway_code, Some(0xb));
    // One field longer than a buffer (8k) as sent is abuse too, on a new connection ('{'
    // has a 15-bit Huffman code: 9,000 of them stay over 8k encoded).
    let mut c = client::Conn::open(h2_addr(&s)).unwrap();
    let long = vec![b'{'; 9000];
    let _ = c.send(&base(&[(b"x-long", &long)]));
    assert!(c.goaway.is_some() || c.wait_goaway(Duration::from_secs(10)));
    assert_eq!(c.goaway_code, Some(0xb));
    let mut c = client::Conn::open(h2_addr(&s)).unwrap();
    assert!(matches!(c.get("/ok"), client::Outcome::Answered(200, 3)));
}

/// The worker process holding the server side of the connection whose client port is
/// `client_port` to `server_port` (by `/proc/net/tcp` and the workers' descriptors).
fn holder(pids: &[i32], server_port: u16, client_port: u16) -> Option<i32> {
    let table = std::fs::read_to_string("/proc/net/tcp").ok()?;
    let (local, remote) = (format!(":{server_port:04X}"), format!(":{client_port:04X}"));
    let inode: u64 = table.lines().skip(1).find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        (f.get(1)?.ends_with(&local) && f.get(2)?.ends_with(&remote))
            .then(|| f.get(9)?.parse().ok())?
    })?;
    let want = format!("socket:[{inode}]");
    pids.iter().copied().find(|pid| {
        std::fs::read_dir(format!("/proc/{pid}/fd")).is_ok_and(|d| {
            d.filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
                .any(|l| l.to_str() == Some(&want))
        })
    })
}

/// `http2_rebalance on`: a worker serving well more requests a second than its sibling
/// sends `GOAWAY` to connections that carried them, and only once the master's steering
/// sends new connections to the sibling: the client's reconnection lands there. Neither an
/// idle connection of the loaded worker nor any connection of the cool one is touched.
#[test]
fn rebalancing_moves_a_busy_connection_to_the_cooler_worker() {
    let conf = conf("reuseport", "http2 on; http2_rebalance on;", "")
        .replace("worker_processes 1;", "worker_processes 2;");
    let mut s = Server::start_ports("h2-rebalance", &conf, 2, 2);
    let pids: Vec<i32> = s.wait_workers(2).iter().map(|w| w.pid as i32).collect();
    let addr = h2_addr(&s);
    // Connections, sorted by the worker that holds them, until one worker has 4 (3 to load,
    // 1 to leave idle) and the other 1.
    let mut by_worker: std::collections::HashMap<i32, Vec<client::Conn>> = Default::default();
    let (hot, cool) = 'found: {
        for _ in 0..400 {
            let mut c = client::Conn::open(addr).unwrap();
            // One request first: the connection is a session, and held by its worker.
            assert!(matches!(c.get("/ok"), client::Outcome::Answered(200, 3)));
            let Some(pid) = holder(&pids, s.ports[0], c.port()) else {
                continue;
            };
            by_worker.entry(pid).or_default().push(c);
            let hot = pids
                .iter()
                .find(|p| by_worker.get(p).is_some_and(|l| l.len() >= 4));
            let cool = pids
                .iter()
                .find(|p| Some(*p) != hot && by_worker.contains_key(p));
            if let (Some(&h), Some(&c)) = (hot, cool) {
                break 'found (h, c);
            }
        }
        panic!("no worker took 4 of 400 connections");
    };
    let mut loaded = by_worker.remove(&hot).unwrap();
    let mut idle = loaded.pop().unwrap();
    let mut other = by_worker.remove(&cool).unwrap().pop().unwrap();
    let port = s.ports[0];
    let deadline = Instant::now() + Duration::from_secs(15);
    // The first connection shed ends the load: the others stop asking.
    let over = std::sync::atomic::AtomicBool::new(false);
    // Each loaded connection asks as fast as it is answered until it is told to go away;
    // then it reconnects, as every client does, and says which worker took it.
    let moved: Vec<Option<i32>> = std::thread::scope(|sc| {
        let (pids, over) = (&pids, &over);
        let workers: Vec<_> = loaded
            .drain(..)
            .map(|mut c| {
                sc.spawn(move || {
                    use std::sync::atomic::Ordering::Relaxed;
                    while Instant::now() < deadline && !over.load(Relaxed) {
                        match c.get("/ok") {
                            client::Outcome::Answered(200, 3) if c.goaway.is_none() => {}
                            client::Outcome::Answered(200, 3) | client::Outcome::Retry => {
                                over.store(true, Relaxed);
                                // The reconnection, and three more connections while the
                                // loaded worker is steered around: all on the sibling.
                                let mut took = Vec::new();
                                for _ in 0..4 {
                                    let mut again = client::Conn::open(addr).unwrap();
                                    assert!(matches!(
                                        again.get("/ok"),
                                        client::Outcome::Answered(200, 3)
                                    ));
                                    took.push(holder(pids, port, again.port()));
                                }
                                return took;
                            }
                            _ => panic!("a request failed"),
                        }
                    }
                    Vec::new()
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|t| t.join().unwrap())
            .collect()
    });
    let shed: Vec<i32> = moved.into_iter().flatten().collect();
    assert!(
        !shed.is_empty(),
        "no connection of the loaded worker was sent GOAWAY"
    );
    // Steered: all of them on the sibling (dealt in turn or drawn, half would land on each).
    // A machine loaded enough that the sibling is judged stalled too steers to both, so
    // one may land back.
    assert!(
        shed.iter().filter(|&&p| p == cool).count() * 4 >= shed.len() * 3,
        "reconnections landed on the worker that shed them: {shed:?} (hot {hot}, cool {cool})"
    );
    assert!(
        !idle.wait_goaway(Duration::from_millis(300)),
        "an idle connection was shed"
    );
    assert!(
        !other.wait_goaway(Duration::from_millis(300)),
        "the cool worker shed"
    );
    assert!(
        error_log(&s).contains("http2_rebalance: "),
        "{}",
        error_log(&s)
    );
    assert!(status_field(&s, "h2_rebalanced") >= 1);
    s.signal(libc::SIGTERM);
}

/// A header block left open (HEADERS without END_HEADERS, and no CONTINUATION after it)
/// ends the connection after `client_header_timeout` with `GOAWAY`, as nginx since 1.19.7,
/// not after `keepalive_timeout` (75 s here), and not never while another stream is open.
#[test]
fn a_header_block_left_open_ends_after_client_header_timeout() {
    let s = start(
        "h2-header-timeout",
        "",
        "http2 on; client_header_timeout 1s;\n\
         location /slow/ { alias {dir}/html/; limit_rate 1k; }",
    );
    write_file(&s.dir, "html/big.bin", &vec![b'x'; 100_000]);
    let mut c = client::Conn::open(h2_addr(&s)).unwrap();
    assert!(matches!(c.get("/ok"), client::Outcome::Answered(200, 3)));
    // A stream that stays open (its answer trickles at 1 KB/s), then a header block that
    // never ends.
    let block = client::request_block("GET", "/slow/big.bin");
    let mut out = Vec::new();
    shard_http::h2frame::push_headers(&mut out, 3, &block, true, 16_384);
    // HEADERS, END_STREAM without END_HEADERS, on stream 5.
    shard_http::h2frame::push_header(&mut out, block.len(), 0x1, 0x1, 5);
    out.extend_from_slice(&block);
    let t0 = std::time::Instant::now();
    c.raw(&out);
    assert!(
        c.wait_goaway(Duration::from_secs(10)),
        "no GOAWAY for a header block left open"
    );
    let waited = t0.elapsed();
    assert!(
        waited >= Duration::from_millis(900) && waited < Duration::from_secs(8),
        "{waited:?}"
    );
    wait_for(Duration::from_secs(5), "the timeout's log line", || {
        error_log(&s)
            .contains(
                "client timed out (110: Connection timed out) while reading client request headers",
            )
            .then_some(())
    });
}

/// A client that opens its windows and then reads nothing: after `send_timeout` without
/// progress the connection ends, as nginx's HTTP/2 write timer ends it (nginx's
/// h2_ssl_proxy_cache.t waited forever at the stop otherwise).
#[test]
fn a_client_that_stops_reading_is_cut_off_after_send_timeout() {
    use std::io::{Read, Write};
    let s = start("h2-send-timeout", "", "http2 on; send_timeout 1s;");
    const LEN: usize = 16 << 20;
    write_file(&s.dir, "html/huge.bin", &vec![b'x'; LEN]);
    let mut c = std::net::TcpStream::connect(h2_addr(&s)).unwrap();
    let mut out = shard_http::h2frame::PREFACE.to_vec();
    shard_http::h2frame::push_settings(&mut out, &[(0x4, 1 << 30)]);
    shard_http::h2frame::push_window_update(&mut out, 0, 1 << 30);
    let block = client::request_block("GET", "/huge.bin");
    shard_http::h2frame::push_headers(&mut out, 1, &block, true, 16_384);
    c.write_all(&out).unwrap();
    // The connection is counted while it is open; it goes once the timer ends it.
    wait_for(Duration::from_secs(5), "the session to be open", || {
        (status_field(&s, "active") >= 2).then_some(())
    });
    let t0 = std::time::Instant::now();
    wait_for(
        Duration::from_secs(15),
        "the stalled session to end",
        || (status_field(&s, "active") == 1).then_some(()),
    );
    assert!(t0.elapsed() < Duration::from_secs(12));
    // What the client then reads ends early: the response was cut, not finished.
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut got = Vec::new();
    let _ = c.read_to_end(&mut got);
    assert!(got.len() < LEN, "{} bytes", got.len());
}

/// `http2_chunk_size` of the location caps a response's DATA frames (nginx's h2.t: size 1
/// gives one frame per byte; the default 8k splits a larger file at 8192).
#[test]
fn http2_chunk_size_caps_data_frames() {
    let s = start(
        "h2-chunk-size",
        "",
        "http2 on;\n location = /one { http2_chunk_size 1; return 200 'body'; }",
    );
    write_file(&s.dir, "html/20k.bin", &vec![b'x'; 20_000]);
    let mut c = client::Conn::open(h2_addr(&s)).unwrap();
    assert!(matches!(c.get("/one"), client::Outcome::Answered(200, 4)));
    assert_eq!(c.data_frames, [1, 1, 1, 1]);
    assert!(matches!(
        c.get("/20k.bin"),
        client::Outcome::Answered(200, 20_000)
    ));
    assert_eq!(c.data_frames, [8192, 8192, 3616]);
}

/// `add_trailer` over HTTP/2: the trailers come as a last HEADERS frame with END_STREAM
/// after the DATA (nginx's h2_trailers.t); before, shard sent none over HTTP/2.
#[test]
fn add_trailer_goes_as_a_last_headers_frame() {
    let s = start(
        "h2-trailers",
        "",
        "http2 on;\n location = /t.txt { add_trailer X-Var $host; add_trailer X-Two two; }\n \
         location = /r { add_trailer X-Var r; return 200 'body'; }",
    );
    write_file(&s.dir, "html/t.txt", b"SEE-THIS");
    let mut c = client::Conn::open(h2_addr(&s)).unwrap();
    assert!(matches!(c.get("/t.txt"), client::Outcome::Answered(200, 8)));
    assert_eq!(
        c.trailers,
        [
            ("x-var".to_string(), "localhost".to_string()),
            ("x-two".to_string(), "two".to_string())
        ]
    );
    assert!(matches!(c.get("/r"), client::Outcome::Answered(200, 4)));
    assert_eq!(c.trailers, [("x-var".to_string(), "r".to_string())]);
    // Without add_trailer: none.
    assert!(matches!(c.get("/ok"), client::Outcome::Answered(200, 3)));
    assert!(c.trailers.is_empty());
}

/// `http2_body_preread_size` below HTTP/2's default window, as nginx: a stream with a body
/// sent before the client acknowledged our SETTINGS is refused (`REFUSED_STREAM`); after the
/// acknowledgement, DATA past the 10-byte window resets the stream (`FLOW_CONTROL_ERROR`),
/// and a body within it is answered.
#[test]
fn a_small_preread_window_is_announced_and_kept() {
    use client::Raw;
    use shard_http::h2frame::{self, code, Frame};
    let s = start("h2-preread", "http2", "http2_body_preread_size 10;");
    let block = client::request_block("POST", "/up/x");
    // Sends the request with `body`; stream 1's RST_STREAM code, or None at its end.
    let outcome = |ack: bool, body: &[u8]| -> Option<u32> {
        let mut c = Raw::open(h2_addr(&s), ack);
        let mut out = Vec::new();
        h2frame::push_headers(&mut out, 1, &block, false, 16_384);
        h2frame::push_data(&mut out, 1, body, true);
        c.write(&out);
        c.read_until(|f, _| match f {
            Frame::RstStream { stream: 1, code } => Some(Some(code)),
            Frame::Data {
                stream: 1,
                end_stream: true,
                ..
            } => Some(None),
            _ => None,
        })
    };
    assert_eq!(outcome(false, b"TEST"), Some(code::REFUSED_STREAM));
    assert_eq!(outcome(true, &[b'x'; 40]), Some(code::FLOW_CONTROL_ERROR));
    assert_eq!(
        outcome(true, b"0123456789"),
        None,
        "a body within the window is answered"
    );
}

/// A body that breaks its `content-length` (shorter at END_STREAM, or longer) is a bad
/// request, as nginx: 400, and the upstream is never asked.
#[test]
fn a_body_that_breaks_its_content_length_is_400() {
    use client::Raw;
    use shard_http::h2frame::{self, Frame};
    let s = start("h2-body-length", "http2", "");
    for (declared, body) in [("5", &b"TEST"[..]), ("3", &b"TEST"[..])] {
        let mut block = client::request_block("POST", "/up/x");
        shard_http::hpack::Encoder.field(b"content-length", declared.as_bytes(), &mut block);
        let mut c = Raw::open(h2_addr(&s), true);
        let mut out = Vec::new();
        h2frame::push_headers(&mut out, 1, &block, false, 16_384);
        h2frame::push_data(&mut out, 1, body, true);
        c.write(&out);
        let mut decoder = shard_http::hpack::Decoder::new(4096);
        let status = c.read_until(|f, _| {
            let Frame::Headers {
                stream: 1, block, ..
            } = f
            else {
                return None;
            };
            let mut st = String::new();
            decoder
                .decode(block, 1 << 20, |n, v| {
                    if n == b":status" {
                        st = String::from_utf8_lossy(v).into_owned();
                    }
                })
                .unwrap();
            Some(st)
        });
        assert_eq!(status, "400", "content-length {declared}, 4 bytes sent");
    }
}

/// `$request_length` of an HTTP/2 request counts its header block as sent (nginx: the
/// HEADERS payload), not the HTTP/1.1 head shard hands the stream.
#[test]
fn request_length_is_the_header_blocks() {
    let s = start(
        "h2-request-length",
        "http2",
        "location = /rl { return 200 $request_length; }",
    );
    let e = shard_http::hpack::Encoder;
    let mut block = Vec::new();
    e.field(b":method", b"GET", &mut block);
    e.field(b":scheme", b"http", &mut block);
    e.field(b":authority", b"localhost", &mut block);
    e.field(b":path", b"/rl", &mut block);
    let mut c = client::Conn::open(h2_addr(&s)).unwrap();
    assert!(matches!(c.send(&block), client::Outcome::Answered(200, _)));
    assert_eq!(String::from_utf8_lossy(&c.body), block.len().to_string());
}

/// `keepalive_timeout 0` over HTTP/2, as nginx: the request is answered, then GOAWAY (the
/// connection is not kept between requests).
#[test]
fn keepalive_timeout_0_answers_then_goes_away() {
    let s = start("h2-keepalive-0", "http2", "keepalive_timeout 0;");
    let mut c = client::Conn::open(h2_addr(&s)).unwrap();
    assert!(matches!(c.get("/ok"), client::Outcome::Answered(200, 3)));
    assert!(
        c.wait_goaway(Duration::from_secs(5)),
        "GOAWAY after the answer"
    );
    assert_eq!(c.goaway_code, Some(0));
}

/// RFC 7540 priorities, as nginx orders its frames: two streams wait for the connection's
/// window; once it opens, the heavier stream's DATA goes first, whichever asked first, and
/// a stream that depends on another goes after it.
#[test]
fn streams_waiting_for_window_go_on_by_priority() {
    use shard_http::h2frame::{self, Frame};
    let s = start("h2-priority", "http2", "");
    let block = |path: &str| client::request_block("GET", path);
    let priority = |out: &mut Vec<u8>, stream: u32, dep: u32, weight: u8| {
        h2frame::push_header(out, 5, h2frame::kind::PRIORITY, 0, stream);
        out.extend_from_slice(&dep.to_be_bytes());
        out.push(weight);
    };
    // (weights of streams 1 and 3, stream 1's dependency) -> the stream whose DATA comes first.
    for (w1, w3, dep1, first) in [(0u8, 255u8, 0u32, 3u32), (255, 0, 0, 1), (16, 16, 3, 3)] {
        let mut c = client::Raw::open(h2_addr(&s), true);
        let mut out = Vec::new();
        h2frame::push_headers(&mut out, 1, &block("/big.bin"), true, 16_384);
        c.write(&out);
        // Stream 1 takes the whole connection window.
        let mut got = 0;
        c.read_until(|f, _| {
            if let Frame::Data {
                stream: 1, data, ..
            } = f
            {
                got += data.len();
            }
            (got >= 65_535).then_some(())
        });
        let mut out = Vec::new();
        h2frame::push_headers(&mut out, 3, &block("/a.txt"), true, 16_384);
        c.write(&out);
        c.read_until(|f, _| matches!(f, Frame::Headers { stream: 3, .. }).then_some(()));
        let mut out = Vec::new();
        priority(&mut out, 1, dep1, w1);
        priority(&mut out, 3, 0, w3);
        h2frame::push_window_update(&mut out, 1, 1 << 17);
        h2frame::push_window_update(&mut out, 0, 1 << 17);
        c.write(&out);
        let seen = c.read_until(|f, _| match f {
            Frame::Data { stream, .. } => Some(stream),
            _ => None,
        });
        assert_eq!(seen, first, "weights {w1}/{w3}, stream 1 depends on {dep1}");
    }
}
