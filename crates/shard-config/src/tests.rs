use super::*;
use std::net::SocketAddr;
use std::path::PathBuf;

const EV: &str = "events {}\n";

fn parse(text: &str) -> Config {
    match parse_str(
        text,
        "t.conf",
        Path::new("/nonexistent-conf"),
        Path::new("/pfx"),
        None,
    ) {
        Ok(c) => c,
        Err(e) => panic!("unexpected error: {e}"),
    }
}

fn error(text: &str) -> String {
    parse_str(
        text,
        "t.conf",
        Path::new("/nonexistent-conf"),
        Path::new("/pfx"),
        None,
    )
    .expect_err("expected an error")
    .message
}

fn http(body: &str) -> Config {
    parse(&format!("{EV}http {{\n{body}\n}}\n"))
}

fn sa(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let p = std::env::temp_dir().join(format!(
            "shard-config-test-{tag}-{}-{:?}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        ));
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
    fn write(&self, rel: &str, text: &str) -> PathBuf {
        let p = self.0.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, text).unwrap();
        p
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

// ---------------------------------------------------------------------------------------
// The embedded default.

#[test]
fn default_conf_parses() {
    let c = parse_str(
        DEFAULT_CONFIG,
        "(embedded default)",
        Path::new("/p"),
        Path::new("/p"),
        None,
    )
    .unwrap();
    assert_eq!(c.main.worker_processes, WorkerProcesses::Auto);
    assert_eq!(c.main.error_log.target, LogTarget::Stderr);
    assert_eq!(c.main.error_log.level, LogLevel::Notice);
    assert_eq!(c.events.worker_connections, 1024);
    let h = c.http.as_ref().unwrap();
    assert_eq!(h.servers.len(), 1);
    let s = &h.servers[0];
    assert_eq!(s.listen, vec![sa("127.0.0.1:8080")]);
    assert_eq!(s.locations.len(), 4);
    assert_eq!(s.locations[0].kind, LocationKind::Exact);
    assert_eq!(s.locations[0].path, "/");
    let r = s.locations[0].ret.as_ref().unwrap();
    assert_eq!(r.code, 200);
    assert!(r
        .text
        .as_ref()
        .unwrap()
        .starts_with("shard is running.\nSee /status"));
    assert_eq!(s.locations[1].handler, Some(StatusHandler::Shard));
    assert_eq!(s.locations[2].handler, Some(StatusHandler::Stub));
    assert_eq!(s.locations[3].kind, LocationKind::Prefix);
    let r = s.locations[3].ret.as_ref().unwrap();
    assert_eq!((r.code, r.text.as_deref()), (404, None));
    assert!(s.locations.iter().all(|l| l.access_logs.is_empty()));
    assert_eq!(c.listeners.len(), 1);
    assert_eq!(c.listeners[0].addr, sa("127.0.0.1:8080"));
    assert!(c.listeners[0].opts.reuseport);
    assert_eq!(c.listeners[0].default_server, 0);
    assert_eq!(
        c.listeners[0].place,
        Place {
            file: "(embedded default)".into(),
            line: 16
        }
    );
}

#[test]
fn defaults() {
    let c = http("server {}");
    assert_eq!(c.main.worker_processes, WorkerProcesses::Fixed(1));
    assert_eq!(c.main.pid, Some("/pfx/logs/shard.pid".into()));
    assert_eq!(
        c.main.error_log.target,
        LogTarget::File("/pfx/logs/error.log".into())
    );
    assert_eq!(c.main.error_log.level, LogLevel::Error);
    assert_eq!(c.events.worker_connections, 512);
    assert!(!c.events.accept_mutex);
    assert_eq!(c.events.accept_mutex_delay_ms, 500);
    assert!(!c.events.multi_accept);
    assert!(c.events.reuseport_steering);
    assert_eq!(c.events.reuseport_stall_threshold_ms, 20);
    let s = &c.http.as_ref().unwrap().servers[0];
    assert_eq!(s.listen, vec![sa("0.0.0.0:80")]);
    assert_eq!(s.server_names, vec![ServerName::Exact(String::new())]);
    assert_eq!(s.client_header_timeout_ms, 60_000);
    assert_eq!(s.client_header_buffer_size, 1024);
    assert_eq!(s.large_client_header_buffers, (4, 8192));
    let b = &s.base;
    assert_eq!(b.root, PathBuf::from("/pfx/html"));
    assert_eq!(b.index, vec!["index.html".to_string()]);
    assert_eq!(b.default_type, "text/plain");
    assert_eq!(b.keepalive_timeout_ms, 75_000);
    assert_eq!(b.keepalive_requests, 1000);
    assert_eq!(b.client_max_body_size, 1 << 20);
    assert_eq!(b.send_timeout_ms, 60_000);
    assert!(!b.sendfile);
    assert!(b.tcp_nodelay);
    assert_eq!(b.access_logs.len(), 1);
    assert_eq!(b.access_logs[0].path, PathBuf::from("/pfx/logs/access.log"));
    assert_eq!(b.access_logs[0].format.name, "combined");
    // The bundled MIME types apply with no include.
    assert_eq!(b.types.get("html").map(String::as_str), Some("text/html"));
    assert_eq!(b.types.get("css").map(String::as_str), Some("text/css"));
    assert_eq!(b.types.get("png").map(String::as_str), Some("image/png"));
    assert_eq!(
        b.types.get("wasm").map(String::as_str),
        Some("application/wasm")
    );
    assert_eq!(b.types.get("woff2").map(String::as_str), Some("font/woff2"));
    assert_eq!(
        b.types.get("bin").map(String::as_str),
        Some("application/octet-stream")
    );
    assert!(b.types.len() >= 60);
    assert_eq!(c.listeners.len(), 1);
    assert_eq!(c.listeners[0].opts, ListenOpts::default());
    assert_eq!(
        c.listeners[0].place,
        Place {
            file: "t.conf".into(),
            line: 3
        }
    );
}

#[test]
fn no_http_block() {
    let c = parse("events {}");
    assert!(c.http.is_none());
    assert!(c.listeners.is_empty());
}

#[test]
fn main_and_events_directives() {
    let c = parse(
        "worker_processes 4;\npid run/shard.pid;\nerror_log /var/log/e.log warn;\n\
         worker_rlimit_nofile 65536;\n\
         events { worker_connections 2048; accept_mutex on; accept_mutex_delay 100ms; multi_accept on; }",
    );
    assert_eq!(c.main.worker_processes, WorkerProcesses::Fixed(4));
    assert_eq!(c.main.pid, Some("/pfx/run/shard.pid".into()));
    assert_eq!(
        c.main.error_log.target,
        LogTarget::File("/var/log/e.log".into())
    );
    assert_eq!(c.main.error_log.level, LogLevel::Warn);
    assert_eq!(c.main.worker_rlimit_nofile, Some(65536));
    assert_eq!(c.events.worker_connections, 2048);
    assert!(c.events.accept_mutex);
    assert_eq!(c.events.accept_mutex_delay_ms, 100);
    assert!(c.events.multi_accept);
    assert_eq!(
        parse("worker_processes 1024; events{}")
            .main
            .worker_processes,
        WorkerProcesses::Fixed(1024)
    );
}

#[test]
fn syslog_destinations() {
    let c = parse(
        "error_log syslog:server=127.0.0.1:5140,facility=daemon,tag=web,nohostname warn;\n\
         events {}\nhttp { server { listen 80; access_log syslog:server=unix:/dev/log; } }",
    );
    let LogTarget::Syslog(s) = &c.main.error_log.target else {
        panic!("{:?}", c.main.error_log.target)
    };
    assert_eq!(
        s.server,
        SyslogServer::Udp("127.0.0.1:5140".parse().unwrap())
    );
    assert_eq!((s.facility, s.tag.as_str(), s.nohostname), (3, "web", true));
    assert_eq!(c.main.error_log.level, LogLevel::Warn);
    let al = &c.http.as_ref().unwrap().servers[0].base.access_logs[0];
    let sl = al.syslog.as_ref().unwrap();
    assert_eq!(sl.server, SyslogServer::Unix("/dev/log".into()));
    assert_eq!((sl.facility, sl.tag.as_str()), (23, "nginx"));
    // 2026-11-27 03:04:05 UTC, local7.info: nginx's header.
    assert_eq!(
        sl.header(6, 1_795_748_645, "h"),
        "<190>Nov 27 03:04:05 h nginx: "
    );
    let sp = Syslog::parse("syslog:server=127.0.0.1,severity=debug").unwrap();
    assert_eq!(
        sp.server,
        SyslogServer::Udp("127.0.0.1:514".parse().unwrap())
    );
    assert_eq!(
        sp.header(7, 86_400 * 31, "x"),
        "<191>Feb  1 00:00:00 x nginx: "
    );
    for (conf, want) in [
        (
            "error_log syslog:facility=local0;",
            "no syslog server specified",
        ),
        (
            "error_log syslog:server=127.0.0.1,facility=nope;",
            "unknown syslog facility \"nope\"",
        ),
        (
            "error_log syslog:server=127.0.0.1,tag=a-b;",
            "only allows alphanumeric",
        ),
        (
            "http { server { listen 80; access_log syslog:server=127.0.0.1 combined buffer=4k; } }",
            "logs to syslog cannot be buffered",
        ),
        (
            "http { server { listen 80; access_log logs/a.gz combined gzip=10; } }",
            "invalid compression level \"10\"",
        ),
    ] {
        let e = error(&format!("{conf} events {{}}"));
        assert!(e.contains(want), "{conf}: {e}");
    }
}

#[test]
fn ssl_conf_commands_are_checked() {
    let c = parse(
        "events {}\nhttp { ssl_conf_command Options -SessionTicket,ServerPreference;\n\
         server { listen 443 ssl; ssl_conf_command Groups X25519:prime256v1; } }",
    );
    let s = &c.http.as_ref().unwrap().servers[0];
    // A level with any replaces its parent's list.
    assert_eq!(
        s.ssl.conf_commands,
        [("Groups".to_string(), "X25519:prime256v1".to_string())]
    );
    for (cmd, want) in [
        (
            "MinProtocol TLSv9",
            "SSL_CONF_cmd(\"MinProtocol\", \"TLSv9\") failed",
        ),
        (
            "Options Bogus",
            "SSL_CONF_cmd(\"Options\", \"Bogus\") failed",
        ),
        ("Groups X448", "no group shard has"),
        (
            "Ciphersuites TLS_AES_128_CCM_SHA256",
            "no TLS 1.3 suite shard has",
        ),
        (
            "VerifyMode Peer",
            "\"ssl_conf_command VerifyMode\" is not supported by shard",
        ),
    ] {
        let e = error(&format!("events {{}} http {{ ssl_conf_command {cmd}; }}"));
        assert!(e.contains(want), "{cmd}: {e}");
    }
}

#[test]
fn tls_variables_are_one_list_for_http_and_stream() {
    for name in [
        "ssl_protocol",
        "ssl_client_verify",
        "ssl_client_v_remain",
        "ssl_curve",
        "ssl_session_id",
        "ssl_ciphers",
        "ssl_curves",
    ] {
        let v = Var::tls(name).unwrap_or_else(|| panic!("{name}"));
        assert!(v.is_tls(), "{name}");
    }
    assert!(Var::tls("ssl_preread_server_name").is_none());
    assert!(!Var::Host.is_tls());
    // Both namespaces take them.
    parse("events {} http { server { listen 80; return 200 \"$ssl_client_s_dn\"; } }");
    parse("events {} stream { server { listen 81; return \"$ssl_client_s_dn\"; } }");
}

#[test]
fn worker_process_settings() {
    let c = parse(
        "worker_priority -5; worker_cpu_affinity 0001 0010 0100; worker_rlimit_core 500m;\n\
         working_directory cores; timer_resolution 100ms; lock_file logs/x.lock; events {}",
    );
    assert_eq!(c.main.worker_priority, -5);
    assert_eq!(c.main.worker_rlimit_core, Some(500 << 20));
    assert_eq!(c.main.working_directory, Some("/pfx/cores".into()));
    let aff = c.main.worker_cpu_affinity.unwrap();
    assert_eq!(aff, CpuAffinity::Masks(vec![1, 2, 4]));
    // The last mask serves the workers beyond the list.
    assert_eq!(aff.for_worker(1, 0b11), Some(2));
    assert_eq!(aff.for_worker(7, 0b11), Some(4));
    let auto = parse("worker_cpu_affinity auto; events {}")
        .main
        .worker_cpu_affinity
        .unwrap();
    assert_eq!(auto.for_worker(0, 0b1010), Some(0b10));
    assert_eq!(auto.for_worker(1, 0b1010), Some(0b1000));
    assert_eq!(auto.for_worker(2, 0b1010), Some(0b10));
    let masked = parse("worker_cpu_affinity auto 1100; events {}")
        .main
        .worker_cpu_affinity
        .unwrap();
    assert_eq!(masked.for_worker(1, 0b1111), Some(0b1000));
    assert!(error("worker_cpu_affinity 01x1; events {}")
        .contains("invalid character \"x\" in \"worker_cpu_affinity\""));
    assert!(error("worker_priority 21; events {}").contains("invalid value \"21\""));
    assert!(error("worker_priority -21; events {}").contains("invalid value \"-21\""));
    assert!(error("debug_points crash; events {}").contains("invalid value \"crash\""));
}

// ---------------------------------------------------------------------------------------
// Lexer.

#[test]
fn quotes_escapes_comments() {
    let c = http(
        r#"# a comment line
        server { # trailing comment
            server_name 'single quoted' "double \"quoted\"" plain\"x;
            location = "/a b" { return 200 "line\n\ttab\r\\ 'it\'s' $uri #not-a-comment"; }
            location = /c#d { return 200 'x\y'; }
            location = /v { return 200 ${host}x; }
        }"#,
    );
    let s = &c.http.unwrap().servers[0];
    assert_eq!(
        s.server_names,
        vec![
            ServerName::Exact("single quoted".into()),
            ServerName::Exact("double \"quoted\"".into()),
            ServerName::Exact("plain\"x".into()),
        ]
    );
    assert_eq!(s.locations[0].path, "/a b");
    assert_eq!(
        s.locations[0].ret.as_ref().unwrap().text.as_deref(),
        Some("line\n\ttab\r\\ 'it's' $uri #not-a-comment")
    );
    assert_eq!(s.locations[1].path, "/c#d");
    assert_eq!(
        s.locations[1].ret.as_ref().unwrap().text.as_deref(),
        Some("x\\y")
    );
    assert_eq!(
        s.locations[2].ret.as_ref().unwrap().text.as_deref(),
        Some("${host}x")
    );
    // Places track lines.
    assert_eq!(s.place.line, 4);
    assert_eq!(s.locations[0].place.line, 6);
    assert_eq!(s.locations[2].place.line, 8);
}

#[test]
fn syntax_errors() {
    assert_eq!(error("events {}\n}\n"), r#"unexpected "}" in t.conf:2"#);
    assert_eq!(
        error("events {}\nhttp {\n server {\n"),
        r#"unexpected end of file, expecting ";" or "}" in t.conf:4"#
    );
    assert_eq!(
        error("events {}\nworker_processes 2"),
        r#"unexpected end of file, expecting ";" or "}" in t.conf:2"#
    );
    assert_eq!(
        error("events {}\nworker_processes \"2;\n"),
        r#"unexpected end of file, expecting ";" or "}" in t.conf:3"#
    );
    assert_eq!(error("events {}\n{\n}"), r#"unexpected "{" in t.conf:2"#);
    assert_eq!(error("events {}\n;"), r#"unexpected ";" in t.conf:2"#);
    assert_eq!(
        error("events {}\nworker_processes \"2\"x;"),
        r#"unexpected "x" in t.conf:2"#
    );
    assert_eq!(
        error("events {}\nhttp { server { listen 80 }"),
        r#"unexpected "}" in t.conf:2"#
    );
    // Errors come in file order: a directive error before a later syntax error wins.
    assert_eq!(
        error("lisen 80;\n}"),
        r#"unknown directive "lisen" in t.conf:1"#
    );
}

// ---------------------------------------------------------------------------------------
// Directive errors, exact text.

#[test]
fn directive_errors() {
    assert_eq!(
        error("events {}\nhttp {\n server {\n  lisen 80;\n }\n}"),
        r#"unknown directive "lisen" in t.conf:4"#
    );
    assert_eq!(
        error("events {}\nlisten 80;"),
        r#""listen" directive is not allowed here in t.conf:2"#
    );
    assert_eq!(
        error("events {}\nhttp { listen 80; }"),
        r#""listen" directive is not allowed here in t.conf:2"#
    );
    assert_eq!(
        error("events {}\nhttp { server { alias /x; } }"),
        r#""alias" directive is not allowed here in t.conf:2"#
    );
    assert_eq!(
        error("events {}\nhttp { server { stub_status; } }"),
        r#""stub_status" directive is not allowed here in t.conf:2"#
    );
    assert_eq!(
        error("events {}\nhttp { server { location / { return 200 a b; } } }"),
        r#"invalid number of arguments in "return" directive in t.conf:2"#
    );
    assert_eq!(
        error("events {}\nhttp { server { location / { return; } } }"),
        r#"invalid number of arguments in "return" directive in t.conf:2"#
    );
    assert_eq!(
        error("worker_processes 2;\nworker_processes 3;\nevents {}"),
        r#""worker_processes" directive is duplicate in t.conf:2"#
    );
    assert_eq!(
        error("events { worker_connections 1; worker_connections 2; }"),
        r#""worker_connections" directive is duplicate in t.conf:1"#
    );
    assert_eq!(
        error("events {}\nevents {}"),
        r#""events" directive is duplicate in t.conf:2"#
    );
    assert_eq!(
        error("events {}\nhttp { root /a; root /b; }"),
        r#""root" directive is duplicate in t.conf:2"#
    );
    assert_eq!(
        error("events {\n worker_connections xyz;\n}"),
        r#"invalid value "xyz" in "worker_connections" directive in t.conf:2"#
    );
    assert_eq!(
        error("worker_processes 0;\nevents {}"),
        r#"invalid value "0" in "worker_processes" directive in t.conf:1"#
    );
    assert_eq!(
        error("worker_processes 1025;\nevents {}"),
        r#"invalid value "1025" in "worker_processes" directive in t.conf:1"#
    );
    assert_eq!(
        error("events { accept_mutex maybe; }"),
        r#"invalid value "maybe" in "accept_mutex" directive, it must be "on" or "off" in t.conf:1"#
    );
    assert_eq!(
        error("events { accept_mutex_delay 5x; }"),
        r#"invalid value "5x" in "accept_mutex_delay" directive in t.conf:1"#
    );
    assert_eq!(
        error("events { reuseport_steering sometimes; }"),
        r#"invalid value "sometimes" in "reuseport_steering" directive, it must be "on" or "off" in t.conf:1"#
    );
    assert_eq!(
        error("events { reuseport_stall_threshold 0; }"),
        r#"invalid value "0" in "reuseport_stall_threshold" directive in t.conf:1"#
    );
    assert_eq!(
        error("events { reuseport_stall_threshold 20ms 30ms; }"),
        r#"invalid number of arguments in "reuseport_stall_threshold" directive in t.conf:1"#
    );
    assert_eq!(
        error("events { reuseport_steering on; reuseport_steering off; }"),
        r#""reuseport_steering" directive is duplicate in t.conf:1"#
    );
    assert_eq!(
        error("http { reuseport_steering on; }"),
        r#""reuseport_steering" directive is not allowed here in t.conf:1"#
    );
    let c = parse("events { reuseport_steering off; reuseport_stall_threshold 1s; }");
    assert!(!c.events.reuseport_steering);
    assert_eq!(c.events.reuseport_stall_threshold_ms, 1000);
    assert_eq!(
        error("events {}\nhttp { client_max_body_size 10q; }"),
        r#"invalid value "10q" in "client_max_body_size" directive in t.conf:2"#
    );
    assert_eq!(error("http {}"), r#"no "events" section in configuration"#);
    assert_eq!(error(""), r#"no "events" section in configuration"#);
    assert_eq!(
        error("events {}\nhttp { server { location / { root /a; alias /b; } } }"),
        r#""alias" directive is duplicate, "root" directive was specified earlier in t.conf:2"#
    );
    assert_eq!(
        error("events {}\nhttp { server { return abc; } }"),
        r#"invalid return code "abc" in t.conf:2"#
    );
    assert_eq!(
        error("events;"),
        r#"directive "events" has no opening "{" in t.conf:1"#
    );
    assert_eq!(
        error("events {}\nhttp { sendfile on { } }"),
        r#"directive "sendfile" is not terminated by ";" in t.conf:2"#
    );
    assert_eq!(
        error("error_log x.log loud;\nevents {}"),
        r#"invalid log level "loud" in t.conf:1"#
    );
}

#[test]
fn listen_errors() {
    let srv = |l: &str| {
        error(&format!(
            "events {{}}\nhttp {{\nserver {{\nlisten {l};\n}}\n}}"
        ))
    };
    assert_eq!(
        srv("foo:80"),
        r#"host not found in "foo:80" of the "listen" directive in t.conf:4"#
    );
    assert_eq!(
        srv("[::zz]:80"),
        r#"host not found in "[::zz]:80" of the "listen" directive in t.conf:4"#
    );
    assert_eq!(
        srv("1.2.3.4:99999"),
        r#"invalid port in "1.2.3.4:99999" of the "listen" directive in t.conf:4"#
    );
    // `ssl on` (nginx 1.22's deprecated form): the server's addresses speak TLS.
    let c = parse(
        "events {}\nhttp {\nserver {\nlisten 127.0.0.1:8081;\nssl on;\n}\n\
         server {\nlisten 127.0.0.1:8082;\n}\n}",
    );
    let ssl: Vec<(u16, bool)> = c
        .listeners
        .iter()
        .map(|l| (l.addr.port(), l.opts.ssl))
        .collect();
    assert!(
        ssl.contains(&(8081, true)) && ssl.contains(&(8082, false)),
        "{ssl:?}"
    );
    // Port ranges (nginx's `listen 127.0.0.1:8080-8089`): low to high, each port valid.
    assert_eq!(
        srv("1.2.3.4:8082-8081"),
        r#"invalid port in "1.2.3.4:8082-8081" of the "listen" directive in t.conf:4"#
    );
    assert_eq!(
        srv("1.2.3.4:8082-x"),
        r#"invalid port in "1.2.3.4:8082-x" of the "listen" directive in t.conf:4"#
    );
    let c = parse(
        "events {}\nhttp {\nserver {\nlisten 127.0.0.1:8082-8084;\nlisten [::1]:9000-9001;\n}\n}",
    );
    let mut ports: Vec<String> = c.listeners.iter().map(|l| l.addr.to_string()).collect();
    ports.sort();
    assert_eq!(
        ports,
        [
            "127.0.0.1:8082",
            "127.0.0.1:8083",
            "127.0.0.1:8084",
            "[::1]:9000",
            "[::1]:9001"
        ]
    );
    assert_eq!(srv("80 ssl foo"), r#"invalid parameter "foo" in t.conf:4"#);
    assert_eq!(srv("80 backlog=x"), r#"invalid backlog "x" in t.conf:4"#);
    assert_eq!(srv("80 rcvbuf=1q"), r#"invalid rcvbuf "1q" in t.conf:4"#);
    assert_eq!(
        srv("80 ipv6only=maybe"),
        r#"invalid ipv6only flags "maybe" in t.conf:4"#
    );
}

// ---------------------------------------------------------------------------------------
// listen.

#[test]
fn listen_variants() {
    let c = http(
        "server { listen 8080; listen 127.0.0.1; listen 10.0.0.1:81; listen *:82; \
         listen [::1]:83; listen [::]; listen localhost:84; listen *; }\n\
         server { listen localhost; }",
    );
    let h = c.http.as_ref().unwrap();
    assert_eq!(
        h.servers[0].listen,
        vec![
            sa("0.0.0.0:8080"),
            sa("127.0.0.1:80"),
            sa("10.0.0.1:81"),
            sa("0.0.0.0:82"),
            sa("[::1]:83"),
            sa("[::]:80"),
            sa("127.0.0.1:84"),
            sa("0.0.0.0:80"),
        ]
    );
    assert_eq!(h.servers[1].listen, vec![sa("127.0.0.1:80")]);
    assert_eq!(c.listeners.len(), 8);
    assert_eq!(c.listeners[1].servers, vec![0, 1]);
}

#[test]
fn listen_options() {
    let c = http(
        "server { listen 127.0.0.1:8080 default_server reuseport backlog=1024 rcvbuf=64k \
         sndbuf=1m deferred bind so_keepalive=on shards=2; listen [::]:8080 ipv6only=off so_keepalive=off; }",
    );
    let l = &c.listeners[0];
    assert_eq!(
        l.opts,
        ListenOpts {
            reuseport: true,
            backlog: 1024,
            backlog_set: true,
            ssl: false,
            proxy_protocol: false,
            http2: false,
            rcvbuf: Some(65536),
            sndbuf: Some(1 << 20),
            deferred: true,
            bind: true,
            ipv6only: true,
            so_keepalive: Some(SoKeepalive::On),
            shards: Some(Shards::Count(2)),
            unix: None,
            udp: false,
            quic: false,
        }
    );
    assert!(!c.listeners[1].opts.ipv6only);
    assert_eq!(c.listeners[1].opts.so_keepalive, Some(SoKeepalive::Off));
    // `unix:PATH`: the path in the options, a stand-in address no inet listen can have.
    let c = http("server { listen unix:/run/a.sock; listen unix:/run/b.sock; }");
    let (a, b) = (&c.listeners[0], &c.listeners[1]);
    assert_eq!(a.opts.unix.as_deref(), Some(Path::new("/run/a.sock")));
    assert!(is_unix_stand_in(&a.addr) && is_unix_stand_in(&b.addr));
    assert_ne!(a.addr, b.addr);
    assert!(!is_unix_stand_in(&"[::1]:80".parse().unwrap()));
}

#[test]
fn listeners_group_servers_and_default() {
    let c = http(
        "server { listen 8080; server_name a; }\n\
         server { listen 8080 default_server; listen 9090; server_name b; }\n\
         server { listen 9090; server_name c; }\n\
         server { server_name d; }",
    );
    assert_eq!(c.listeners.len(), 3);
    assert_eq!(c.listeners[0].addr, sa("0.0.0.0:8080"));
    assert_eq!(c.listeners[0].servers, vec![0, 1]);
    assert_eq!(c.listeners[0].default_server, 1);
    assert_eq!(c.listeners[1].addr, sa("0.0.0.0:9090"));
    assert_eq!(c.listeners[1].servers, vec![1, 2]);
    assert_eq!(c.listeners[1].default_server, 1);
    assert_eq!(c.listeners[2].addr, sa("0.0.0.0:80"));
    assert_eq!(c.listeners[2].servers, vec![3]);
    assert_eq!(c.listeners[0].place.line, 3);
}

#[test]
fn duplicate_listen_options() {
    // Identical options on two listens: accepted.
    let c = http(
        "server { listen 127.0.0.1:8080 reuseport backlog=100; }\n\
         server { listen 127.0.0.1:8080 reuseport backlog=100; }",
    );
    assert_eq!(c.listeners.len(), 1);
    assert!(c.listeners[0].opts.reuseport);
    assert_eq!(c.listeners[0].place.line, 3);
    // Options on only one of them: they apply to the address.
    let c = http(
        "server { listen 127.0.0.1:8080; }\n\
         server { listen 127.0.0.1:8080 reuseport; }",
    );
    assert!(c.listeners[0].opts.reuseport);
    assert_eq!(c.listeners[0].place.line, 4);
    // Conflicting: both places named.
    assert_eq!(
        error(
            "events {}\nhttp {\nserver { listen 127.0.0.1:8080 reuseport; }\n\
             server { listen 127.0.0.1:8080 backlog=10; }\n}"
        ),
        "duplicate listen options for 127.0.0.1:8080 in t.conf:4 (first given in t.conf:3)"
    );
    assert_eq!(
        error(
            "events {}\nhttp {\nserver { listen 127.0.0.1:8080 default_server; }\n\
             server { listen 127.0.0.1:8080 default_server; }\n}"
        ),
        "a duplicate default server for 127.0.0.1:8080 in t.conf:4"
    );
    assert_eq!(
        error("events {}\nhttp {\nserver { listen 80; listen 80; }\n}"),
        "a duplicate listen 0.0.0.0:80 in t.conf:3"
    );
}

// ---------------------------------------------------------------------------------------
// server_name, location, return.

#[test]
fn server_names() {
    let c = http(
        r#"server { server_name Example.COM *.example.com .example.org www.example.* "" _; }"#,
    );
    assert_eq!(
        c.http.unwrap().servers[0].server_names,
        vec![
            ServerName::Exact("example.com".into()),
            ServerName::WildcardPrefix(".example.com".into()),
            ServerName::Dot("example.org".into()),
            ServerName::WildcardSuffix("www.example.".into()),
            ServerName::Exact(String::new()),
            ServerName::Exact("_".into()),
        ]
    );
    assert_eq!(
        error("events {}\nhttp { server { server_name a.*.b; } }"),
        r#"invalid server name or wildcard "a.*.b" in t.conf:2"#
    );
}

#[test]
fn locations_and_returns() {
    let c = http(
        "server {\n\
           location = /exact { return 301 https://example.com/; }\n\
           location ^~ /static/ { root /srv; }\n\
           location /p { return https://elsewhere/; }\n\
           location /t { return 403 \"no\"; }\n\
           location /a { alias data/; }\n\
           location =/b { }\n\
           location /outer/ { index o.html; location /outer/inner/ { sendfile on; } }\n\
         }",
    );
    let s = &c.http.unwrap().servers[0];
    let l = &s.locations;
    assert_eq!(
        (l[0].kind, l[0].path.as_str()),
        (LocationKind::Exact, "/exact")
    );
    let r = l[0].ret.as_ref().unwrap();
    assert_eq!(
        (r.code, r.text.as_deref()),
        (301, Some("https://example.com/"))
    );
    assert_eq!(
        (l[1].kind, l[1].path.as_str()),
        (LocationKind::PrefixNoRegex, "/static/")
    );
    assert_eq!(l[1].root, PathBuf::from("/srv"));
    assert_eq!(
        l[2].ret,
        Some(Return {
            code: 302,
            text: Some("https://elsewhere/".into()),
            parts: vec![Part::Lit("https://elsewhere/".into())],
        })
    );
    assert_eq!(
        l[3].ret,
        Some(Return {
            code: 403,
            text: Some("no".into()),
            parts: vec![Part::Lit("no".into())],
        })
    );
    assert_eq!(l[4].alias, Some(PathBuf::from("/pfx/data/")));
    assert_eq!((l[5].kind, l[5].path.as_str()), (LocationKind::Exact, "/b"));
    assert_eq!(l[6].path, "/outer/");
    assert_eq!(l[7].path, "/outer/inner/");
    assert_eq!(l[7].index, vec!["o.html".to_string()]);
    assert!(l[7].sendfile);
    assert!(!l[6].sendfile);
    assert_eq!(
        error("events {}\nhttp { server { location /a { location /b { } } } }"),
        r#"location "/b" is outside location "/a" in t.conf:2"#
    );
}

#[test]
fn server_level_return_applies_to_locations() {
    let c = http("server { return 301 https://x/; location /s { stub_status; } }");
    let s = &c.http.unwrap().servers[0];
    let r = Some(Return {
        code: 301,
        text: Some("https://x/".into()),
        parts: vec![Part::Lit("https://x/".into())],
    });
    assert_eq!(s.base.ret, r);
    assert_eq!(s.locations[0].ret, r);
    assert_eq!(s.locations[0].handler, None);
}

// ---------------------------------------------------------------------------------------
// Inheritance.

#[test]
fn inheritance_http_server_location() {
    let c = http(
        "root www;\n\
         index a.html b.html;\n\
         keepalive_timeout 10s;\n\
         client_max_body_size 0;\n\
         sendfile on;\n\
         access_log logs/h.log combined;\n\
         default_type application/octet-stream;\n\
         client_header_timeout 5s;\n\
         large_client_header_buffers 8 16k;\n\
         underscores_in_headers on;\n\
         server {\n\
           keepalive_timeout 20s;\n\
           ignore_invalid_headers off;\n\
           tcp_nodelay off;\n\
           client_header_buffer_size 2k;\n\
           location /x { keepalive_timeout 30; access_log off; root /abs; }\n\
           location /y { index y.html; send_timeout 1m30s; types { text/x-y y; } }\n\
         }\n\
         server { listen 81; sendfile off; keepalive_requests 5; }",
    );
    let h = c.http.unwrap();
    let s0 = &h.servers[0];
    assert_eq!(s0.client_header_timeout_ms, 5000);
    assert_eq!(s0.client_header_buffer_size, 2048);
    assert_eq!(s0.large_client_header_buffers, (8, 16384));
    assert!(s0.underscores_in_headers && !s0.ignore_invalid_headers);
    assert!(h.servers[1].underscores_in_headers && h.servers[1].ignore_invalid_headers);
    assert_eq!(s0.base.root, PathBuf::from("/pfx/www"));
    assert_eq!(s0.base.keepalive_timeout_ms, 20_000);
    assert!(!s0.base.tcp_nodelay);
    assert!(s0.base.sendfile);
    assert_eq!(s0.base.client_max_body_size, 0);
    assert_eq!(s0.base.default_type, "application/octet-stream");
    let x = &s0.locations[0];
    assert_eq!(x.keepalive_timeout_ms, 30_000);
    assert!(x.access_logs.is_empty());
    assert_eq!(x.root, PathBuf::from("/abs"));
    assert!(!x.tcp_nodelay);
    assert_eq!(x.index, vec!["a.html".to_string(), "b.html".to_string()]);
    assert_eq!(
        s0.base.access_logs[0].path,
        PathBuf::from("/pfx/logs/h.log")
    );
    let y = &s0.locations[1];
    assert_eq!(y.keepalive_timeout_ms, 20_000);
    assert_eq!(y.index, vec!["y.html".to_string()]);
    assert_eq!(y.send_timeout_ms, 90_000);
    // A types block replaces the inherited map.
    assert_eq!(y.types.get("y").map(String::as_str), Some("text/x-y"));
    assert_eq!(y.types.get("html"), None);
    assert_eq!(x.types.get("html").map(String::as_str), Some("text/html"));
    let s1 = &h.servers[1];
    assert!(!s1.base.sendfile);
    assert_eq!(s1.base.keepalive_requests, 5);
    assert_eq!(s1.base.keepalive_timeout_ms, 10_000);
    assert!(s1.base.tcp_nodelay);
}

#[test]
fn http_level_types_replace_bundled() {
    let c = http("types { text/html html; image/png PNG; }\nserver { }");
    let b = &c.http.unwrap().servers[0].base;
    assert_eq!(b.types.len(), 2);
    assert_eq!(b.types.get("png").map(String::as_str), Some("image/png"));
}

// ---------------------------------------------------------------------------------------
// include and -g.

#[test]
fn include_glob_and_errors() {
    let t = TempDir::new("inc");
    t.write("conf.d/b.conf", "server { listen 8082; }\n");
    t.write("conf.d/a.conf", "server { listen 8081; }\n");
    t.write("conf.d/ignored.txt", "garbage");
    t.write("events.conf", "worker_connections 77;\n");
    let main = t.write(
        "shard.conf",
        "events { include events.conf; }\nhttp {\n include conf.d/*.conf;\n include none.d/*.conf;\n}\n",
    );
    let c = load(&main, Path::new("/pfx"), None).unwrap();
    assert_eq!(c.events.worker_connections, 77);
    let h = c.http.unwrap();
    assert_eq!(h.servers.len(), 2);
    assert_eq!(h.servers[0].listen, vec![sa("0.0.0.0:8081")]);
    assert_eq!(h.servers[1].listen, vec![sa("0.0.0.0:8082")]);
    let a = t.0.join("conf.d/a.conf").display().to_string();
    assert_eq!(h.servers[0].place, Place { file: a, line: 1 });

    // A missing file without wildcards is an error naming the including file.
    let bad = t.write("bad.conf", "events {}\ninclude missing.conf;\n");
    let e = load(&bad, Path::new("/pfx"), None).unwrap_err();
    assert_eq!(
        e.message,
        format!(
            "open() \"{}\" failed (2: No such file or directory) in {}:2",
            t.0.join("missing.conf").display(),
            bad.display()
        )
    );

    // Errors inside an included file name that file.
    t.write("broken.d/x.conf", "\n\nlisen 80;\n");
    let inc = t.write(
        "inc-broken.conf",
        "events {}\nhttp { server { include broken.d/*.conf; } }\n",
    );
    let e = load(&inc, Path::new("/pfx"), None).unwrap_err();
    assert_eq!(
        e.message,
        format!(
            "unknown directive \"lisen\" in {}:3",
            t.0.join("broken.d/x.conf").display()
        )
    );
}

#[test]
fn include_mime_types_falls_back_to_bundled() {
    let t = TempDir::new("mime");
    let main = t.write(
        "shard.conf",
        "events {}\nhttp { include mime.types; server {} }\n",
    );
    let c = load(&main, Path::new("/pfx"), None).unwrap();
    let b = &c.http.unwrap().servers[0].base;
    assert_eq!(
        b.types.get("js").map(String::as_str),
        Some("application/javascript")
    );
    // A local mime.types wins.
    t.write("mime.types", "types { text/x-local loc; }\n");
    let c = load(&main, Path::new("/pfx"), None).unwrap();
    let b = &c.http.unwrap().servers[0].base;
    assert_eq!(b.types.len(), 1);
    assert_eq!(b.types.get("loc").map(String::as_str), Some("text/x-local"));
}

#[test]
fn load_missing_file() {
    let e = load(
        Path::new("/nonexistent-dir/shard.conf"),
        Path::new("/pfx"),
        None,
    )
    .unwrap_err();
    assert_eq!(
        e.message,
        "open() \"/nonexistent-dir/shard.conf\" failed (2: No such file or directory)"
    );
}

#[test]
fn command_line_directives() {
    let c = parse_str(
        "events {}",
        "t.conf",
        Path::new("/x"),
        Path::new("/pfx"),
        Some("worker_processes 3; pid /run/s.pid;"),
    )
    .unwrap();
    assert_eq!(c.main.worker_processes, WorkerProcesses::Fixed(3));
    assert_eq!(c.main.pid, Some("/run/s.pid".into()));
    let e = |conf: &str, g: &str| {
        parse_str(conf, "t.conf", Path::new("/x"), Path::new("/pfx"), Some(g))
            .unwrap_err()
            .message
    };
    assert_eq!(
        e("events {}\nworker_processes 2;", "worker_processes 3;"),
        r#""worker_processes" directive is duplicate in command line"#
    );
    assert_eq!(
        e("events {}", "lisen 1;"),
        r#"unknown directive "lisen" in command line"#
    );
    assert_eq!(
        e("events {}", "worker_processes 3"),
        r#"unexpected end of parameter, expecting ";" in command line"#
    );
}

#[test]
fn bundled_files_match_conf_copies() {
    for (name, bundled) in crate::BUNDLED_FILES {
        let copy = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../conf")
            .join(name);
        let text = std::fs::read_to_string(&copy).unwrap_or_else(|e| panic!("{copy:?}: {e}"));
        assert_eq!(text, bundled, "{name}");
    }
}

// ---------------------------------------------------------------------------------------
// gzip

#[test]
fn gzip_defaults() {
    let c = http("server { location /a {} }");
    let s = &c.http.as_ref().unwrap().servers[0];
    for g in [&s.base.gzip, &s.locations[0].gzip] {
        assert_eq!(*g, GzipConf::default());
        assert!(!g.enabled);
        assert_eq!(g.comp_level, 1);
        assert_eq!(g.types, vec!["text/html".to_string()]);
        assert!(!g.any_type);
        assert_eq!(g.min_length, 20);
        assert!(!g.vary);
        assert_eq!(g.http_version_minor, 1);
    }
}

#[test]
fn gzip_inheritance() {
    let c = http(
        "gzip on; gzip_comp_level 6; gzip_types text/plain Application/JSON;\n\
         gzip_min_length 1k; gzip_vary on;\n\
         server {\n\
           gzip_comp_level 9;\n\
           location /a { }\n\
           location /b { gzip off; gzip_types *; gzip_http_version 1.0;\n\
             location /b/c { gzip on; gzip_min_length 0; gzip_types text/css; gzip_types text/xml; }\n\
           }\n\
         }\n\
         server { listen 81; }",
    );
    let h = c.http.as_ref().unwrap();
    let s = &h.servers[0];
    let want = GzipConf {
        enabled: true,
        comp_level: 9,
        types: vec![
            "text/html".to_string(),
            "text/plain".to_string(),
            "application/json".to_string(),
        ],
        any_type: false,
        min_length: 1024,
        vary: true,
        http_version_minor: 1,
        proxied: GzipProxied::default(),
        static_mode: GzipStatic::Off,
        disable: GzipDisable::default(),
        gunzip: false,
    };
    assert_eq!(s.base.gzip, want);
    assert_eq!(s.locations[0].gzip, want);
    let b = &s.locations[1].gzip;
    assert!(!b.enabled && b.any_type && b.comp_level == 9 && b.http_version_minor == 0);
    assert_eq!(b.types, vec!["text/html".to_string()]);
    let bc = &s.locations[2];
    assert_eq!(bc.path, "/b/c");
    assert!(bc.gzip.enabled && !bc.gzip.any_type);
    assert_eq!(bc.gzip.min_length, 0);
    assert_eq!(bc.gzip.http_version_minor, 0);
    assert_eq!(
        bc.gzip.types,
        vec![
            "text/html".to_string(),
            "text/css".to_string(),
            "text/xml".to_string()
        ]
    );
    // The other server inherits from http only.
    assert_eq!(h.servers[1].base.gzip.comp_level, 6);
    assert!(h.servers[1].base.gzip.enabled);
}

#[test]
fn gzip_errors() {
    let e = |body: &str| error(&format!("{EV}http {{\n{body}\n}}\n"));
    assert_eq!(
        e("gzip_comp_level 12;"),
        "value must be between 1 and 9 in t.conf:3"
    );
    assert_eq!(
        e("gzip_comp_level 0;"),
        "value must be between 1 and 9 in t.conf:3"
    );
    assert_eq!(
        e("gzip_comp_level x;"),
        r#"invalid value "x" in "gzip_comp_level" directive in t.conf:3"#
    );
    assert_eq!(
        e("gzip maybe;"),
        r#"invalid value "maybe" in "gzip" directive, it must be "on" or "off" in t.conf:3"#
    );
    assert_eq!(
        e("gzip_vary yes;"),
        r#"invalid value "yes" in "gzip_vary" directive, it must be "on" or "off" in t.conf:3"#
    );
    assert_eq!(
        e("gzip_min_length 1q;"),
        r#"invalid value "1q" in "gzip_min_length" directive in t.conf:3"#
    );
    assert_eq!(
        e("gzip_http_version 2.0;"),
        r#"invalid value "2.0" in "gzip_http_version" directive in t.conf:3"#
    );
    assert_eq!(
        e("gzip on; gzip off;"),
        r#""gzip" directive is duplicate in t.conf:3"#
    );
    assert_eq!(
        e("gzip on off;"),
        r#"invalid number of arguments in "gzip" directive in t.conf:3"#
    );
    assert_eq!(
        e("gzip_types;"),
        r#"invalid number of arguments in "gzip_types" directive in t.conf:3"#
    );
    assert_eq!(
        error("gzip on;\nevents {}\n"),
        r#""gzip" directive is not allowed here in t.conf:1"#
    );
}

// ---------------------------------------------------------------------------------------
// stream.

fn stream(body: &str) -> Config {
    parse(&format!("{EV}stream {{\n{body}\n}}\n"))
}

fn stream_error(body: &str) -> String {
    error(&format!("{EV}stream {{\n{body}\n}}\n"))
}

#[test]
fn stream_upstreams_servers_and_defaults() {
    let c = stream(
        "upstream be {\n\
         server 10.0.0.1:5432 weight=3 max_fails=2 fail_timeout=5s;\n\
         server [::1]:5433 backup;\n\
         server 10.0.0.2:5432 down;\n\
         }\n\
         proxy_timeout 1m;\n\
         server { listen 127.0.0.1:9000 reuseport backlog=64 shards=2; proxy_pass be; proxy_buffer_size 4k; }\n\
         server { listen 9001; proxy_pass 10.0.0.9:80; proxy_connect_timeout 3s; proxy_timeout 7s; }",
    );
    assert!(c.http.is_none());
    let s = c.stream.as_ref().unwrap();
    assert_eq!(s.upstreams.len(), 2);
    let be = &s.upstreams[0];
    assert_eq!(be.name, "be");
    assert_eq!(be.peers.len(), 3);
    assert_eq!(be.peers[0].addr, sa("10.0.0.1:5432"));
    assert_eq!(
        (
            be.peers[0].weight,
            be.peers[0].max_fails,
            be.peers[0].fail_timeout_ms
        ),
        (3, 2, 5000)
    );
    assert!(!be.peers[0].backup && !be.peers[0].down);
    assert_eq!(be.peers[1].addr, sa("[::1]:5433"));
    assert!(be.peers[1].backup);
    assert_eq!(
        (
            be.peers[1].weight,
            be.peers[1].max_fails,
            be.peers[1].fail_timeout_ms
        ),
        (1, 1, 10_000)
    );
    assert!(be.peers[2].down);
    // The implicit upstream of `proxy_pass ADDR`.
    assert_eq!(s.upstreams[1].name, "10.0.0.9:80");
    assert_eq!(s.upstreams[1].peers[0].addr, sa("10.0.0.9:80"));

    let a = &s.servers[0];
    assert_eq!(a.upstream, 0);
    assert_eq!(
        (a.connect_timeout_ms, a.timeout_ms, a.buffer_size),
        (60_000, 60_000, 4096)
    );
    let b = &s.servers[1];
    assert_eq!(b.upstream, 1);
    assert_eq!(
        (b.connect_timeout_ms, b.timeout_ms, b.buffer_size),
        (3000, 7000, 16 * 1024)
    );

    assert_eq!(c.listeners.len(), 2);
    let l = &c.listeners[0];
    assert_eq!(l.addr, sa("127.0.0.1:9000"));
    assert_eq!(l.kind, ListenerKind::Stream { server: 0 });
    assert!(l.opts.reuseport);
    assert_eq!(l.opts.backlog, 64);
    assert_eq!(l.opts.shards, Some(Shards::Count(2)));
    assert_eq!(c.listeners[1].addr, sa("0.0.0.0:9001"));
    assert_eq!(c.listeners[1].kind, ListenerKind::Stream { server: 1 });
}

#[test]
fn stream_defaults_and_upstream_defined_after_use() {
    let c =
        stream("server { listen 9000; proxy_pass later; }\nupstream later { server 127.0.0.1:1; }");
    let s = c.stream.unwrap();
    assert_eq!(s.upstreams.len(), 1);
    let srv = &s.servers[0];
    assert_eq!(srv.upstream, 0);
    assert_eq!(
        (srv.connect_timeout_ms, srv.timeout_ms, srv.buffer_size),
        (60_000, 600_000, 16 * 1024)
    );
    let c = stream("upstream l { server localhost:7; }\nserver { listen 9000; proxy_pass l; }");
    let peers = &c.stream.unwrap().upstreams[0].peers;
    assert!(
        peers.iter().any(|p| p.addr == sa("127.0.0.1:7")),
        "{peers:?}"
    );
}

#[test]
fn stream_and_http_listeners_together() {
    let c = parse(&format!(
        "{EV}http {{ server {{ listen 8080; }} }}\nstream {{ server {{ listen 8081; proxy_pass 127.0.0.1:1; }} }}\n"
    ));
    assert_eq!(c.listeners.len(), 2);
    assert_eq!(c.listeners[0].kind, ListenerKind::Http);
    assert_eq!(c.listeners[1].kind, ListenerKind::Stream { server: 0 });
    assert_eq!(
        error(&format!(
            "{EV}http {{ server {{ listen 8080; }} }}\nstream {{\nserver {{\nlisten 8080;\nproxy_pass 127.0.0.1:1; }} }}\n"
        )),
        "a duplicate listen 0.0.0.0:8080 (already used by http) in t.conf:5"
    );
}

#[test]
fn stream_errors() {
    assert_eq!(
        stream_error("upstream u { server 10.0.0.1; }"),
        r#"no port in upstream "10.0.0.1" in t.conf:3"#
    );
    assert_eq!(
        stream_error("upstream u { server bad/host:80; }"),
        r#"host not found in upstream "bad/host:80" in t.conf:3"#
    );
    assert_eq!(
        stream_error("upstream u { server 10.0.0.1:0; }"),
        r#"invalid port in upstream "10.0.0.1:0" in t.conf:3"#
    );
    assert_eq!(
        stream_error("upstream u { server 10.0.0.1:1 weight=0; }"),
        r#"invalid parameter "weight=0" in t.conf:3"#
    );
    assert_eq!(
        stream_error("upstream u { server 10.0.0.1:1 slow_start=1s; }"),
        r#"invalid parameter "slow_start=1s" in t.conf:3"#
    );
    assert_eq!(
        stream_error("upstream u { }"),
        "no servers are inside upstream in t.conf:3"
    );
    assert_eq!(
        stream_error("upstream u { server 10.0.0.1:1; }\nupstream u { server 10.0.0.1:2; }"),
        r#"duplicate upstream "u" in t.conf:4"#
    );
    assert_eq!(
        stream_error("upstream u { listen 80; }"),
        r#""listen" directive is not allowed here in t.conf:3"#
    );
    assert_eq!(
        stream_error("upstream u { server 10.0.0.1:1; ntlm; }"),
        r#""ntlm" is an nginx directive that shard does not support in t.conf:3"#
    );
    assert_eq!(
        stream_error("server {\nlisten 9000;\nproxy_pass nowhere;\n}"),
        r#"no port in upstream "nowhere" in t.conf:5"#
    );
    assert_eq!(
        stream_error("server {\nlisten 9000;\n}"),
        "no handler for server in t.conf:3"
    );
    assert_eq!(
        stream_error("server {\nproxy_pass 127.0.0.1:1;\n}"),
        r#"no "listen" is defined for server in t.conf:3"#
    );
    assert_eq!(
        stream_error("server {\nlisten 9000 default_server;\nproxy_pass 127.0.0.1:1;\n}"),
        r#"invalid parameter "default_server" in t.conf:4"#
    );
    assert_eq!(
        stream_error(
            "server { listen 9000; proxy_pass 127.0.0.1:1; }\nserver { listen 9000; proxy_pass 127.0.0.1:2; }"
        ),
        "a duplicate listen 0.0.0.0:9000 in t.conf:4"
    );
    assert_eq!(
        stream_error("server { listen 9000; proxy_pass 127.0.0.1:1; proxy_pass 127.0.0.1:2; }"),
        r#""proxy_pass" directive is duplicate in t.conf:3"#
    );
    assert_eq!(
        stream_error("proxy_timeout forever;"),
        r#"invalid value "forever" in "proxy_timeout" directive in t.conf:3"#
    );
    assert_eq!(
        stream_error("proxy_buffer_size 0;"),
        r#"invalid value "0" in "proxy_buffer_size" directive in t.conf:3"#
    );
    assert_eq!(
        stream_error("proxy_pass 127.0.0.1:1;"),
        r#""proxy_pass" directive is not allowed here in t.conf:3"#
    );
    assert_eq!(
        stream_error("location / { }"),
        r#""location" directive is not allowed here in t.conf:3"#
    );
    assert_eq!(
        error(&format!(
            "{EV}http {{\nserver {{\nlisten 80;\nproxy_pass 127.0.0.1:1;\n}}\n}}"
        )),
        r#""proxy_pass" directive is not allowed here in t.conf:5"#
    );
    assert_eq!(
        error(&format!(
            "{EV}http {{\nserver {{\nupstream u {{ server 127.0.0.1:1; }}\n}}\n}}"
        )),
        r#""upstream" directive is not allowed here in t.conf:4"#
    );
    assert_eq!(
        error(&format!("{EV}stream {{ }}\nstream {{ }}")),
        r#""stream" directive is duplicate in t.conf:3"#
    );
    assert_eq!(
        stream_error("server { listen 9000 shards=2; proxy_pass 127.0.0.1:1; }"),
        r#"the "shards" parameter requires "reuseport" in t.conf:3"#
    );
}

// ---------------------------------------------------------------------------------------
// http proxy.

fn http_error(body: &str) -> String {
    error(&format!("{EV}http {{\n{body}\n}}\n"))
}

/// The single location of the first server.
fn only_loc(c: &Config) -> &LocationConf {
    &c.http.as_ref().unwrap().servers[0].locations[0]
}

fn hdr(name: &str, parts: Vec<Part>) -> (String, Vec<Part>) {
    (name.to_string(), parts)
}

fn lit(s: &str) -> Part {
    Part::Lit(s.to_string())
}

fn defaults_headers() -> Vec<(String, Vec<Part>)> {
    vec![
        hdr("Host", vec![Part::Var(Var::ProxyHost)]),
        hdr("Connection", vec![lit("close")]),
    ]
}

#[test]
fn proxy_full_config() {
    let c = http(
        "upstream backend {\n\
             server 127.0.0.1:8081 weight=2 max_fails=3 fail_timeout=5s;\n\
             server 127.0.0.1:8082 backup;\n\
             server 127.0.0.1 down;\n\
             keepalive 16;\n\
             keepalive_timeout 30s;\n\
             keepalive_requests 500;\n\
         }\n\
         proxy_http_version 1.1;\n\
         proxy_set_header Host $host;\n\
         proxy_set_header X-Real-IP $remote_addr;\n\
         proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;\n\
         proxy_set_header Connection \"\";\n\
         proxy_read_timeout 30s;\n\
         server {\n\
             listen 8080;\n\
             location /api/ {\n\
                 proxy_pass http://backend/v1/;\n\
                 proxy_next_upstream error timeout http_503 http_502 non_idempotent;\n\
                 proxy_next_upstream_tries 3;\n\
             }\n\
             location / {\n\
                 proxy_pass http://backend;\n\
                 proxy_buffering off;\n\
                 proxy_buffer_size 8k;\n\
                 proxy_buffers 4 16k;\n\
                 proxy_connect_timeout 2s;\n\
                 proxy_send_timeout 5s;\n\
             }\n\
         }",
    );
    let h = c.http.as_ref().unwrap();
    assert_eq!(h.upstreams.len(), 1);
    let u = &h.upstreams[0];
    assert_eq!(u.name, "backend");
    assert_eq!(u.place.line, 3);
    assert_eq!(
        (u.keepalive, u.keepalive_timeout_ms, u.keepalive_requests),
        (16, 30_000, 500)
    );
    assert_eq!(u.peers.len(), 3);
    assert_eq!(u.peers[0].addr, sa("127.0.0.1:8081"));
    assert_eq!(
        (
            u.peers[0].weight,
            u.peers[0].max_fails,
            u.peers[0].fail_timeout_ms
        ),
        (2, 3, 5000)
    );
    assert!(u.peers[1].backup);
    // A `server` without a port gets 80 in http.
    assert_eq!(u.peers[2].addr, sa("127.0.0.1:80"));
    assert!(u.peers[2].down);

    let s = &h.servers[0];
    let api = &s.locations[0];
    assert_eq!(
        api.proxy_pass,
        Some(ProxyPass {
            upstream: 0,
            uri: Some("/v1/".into()),
            proxy_host: "backend".into(),
            proxy_port: 80,
            tls: false,
            dynamic: None,
        })
    );
    let user_headers = vec![
        hdr("Host", vec![Part::Var(Var::Host)]),
        hdr("X-Real-IP", vec![Part::Var(Var::RemoteAddr)]),
        hdr(
            "X-Forwarded-For",
            vec![Part::Var(Var::ProxyAddXForwardedFor)],
        ),
        hdr("Connection", vec![]),
    ];
    let p = &api.proxy;
    assert_eq!(p.set_headers, user_headers);
    assert_eq!(p.http_version_minor, 1);
    assert_eq!(
        (p.connect_timeout_ms, p.read_timeout_ms, p.send_timeout_ms),
        (60_000, 30_000, 60_000)
    );
    assert_eq!(
        p.next_upstream,
        NextUpstream {
            error: true,
            timeout: true,
            invalid_header: false,
            statuses: &[502, 503],
            non_idempotent: true,
        }
    );
    assert!(p.next_upstream.retries_status(502));
    assert!(!p.next_upstream.retries_status(500));
    assert_eq!(p.next_upstream_tries, 3);
    assert!(p.buffering);
    assert_eq!((p.buffer_size, p.buffers), (4096, (8, 4096)));

    let root = &s.locations[1];
    assert_eq!(
        root.proxy_pass,
        Some(ProxyPass {
            upstream: 0,
            uri: None,
            proxy_host: "backend".into(),
            proxy_port: 80,
            tls: false,
            dynamic: None,
        })
    );
    let p = &root.proxy;
    assert_eq!(p.set_headers, user_headers);
    assert_eq!(p.next_upstream, NextUpstream::DEFAULT);
    assert!(!p.buffering);
    assert_eq!((p.buffer_size, p.buffers), (8192, (4, 16 * 1024)));
    assert_eq!(
        (p.connect_timeout_ms, p.read_timeout_ms, p.send_timeout_ms),
        (2000, 30_000, 5000)
    );
    // The server's base location inherits the proxy settings but has no proxy_pass.
    assert_eq!(s.base.proxy_pass, None);
    assert_eq!(s.base.proxy.set_headers, user_headers);
    assert_eq!(s.base.proxy.http_version_minor, 1);
}

#[test]
fn proxy_defaults_and_default_headers() {
    let c = http("server { location / { proxy_pass http://127.0.0.1:8081; } }");
    let l = only_loc(&c);
    let want = ProxyConf {
        set_headers: defaults_headers(),
        ..ProxyConf::default()
    };
    assert_eq!(l.proxy, want);
    assert_eq!(l.proxy.http_version_minor, 0);
    assert_eq!(l.proxy.next_upstream, NextUpstream::DEFAULT);
    assert_eq!(l.proxy.next_upstream_tries, 0);
    assert!(l.proxy.buffering);
    // Locations without proxy_pass carry the same defaults.
    let c = http("server { location / { } }");
    assert_eq!(only_loc(&c).proxy, want);
    assert_eq!(c.http.as_ref().unwrap().servers[0].base.proxy, want);
    assert!(c.http.as_ref().unwrap().upstreams.is_empty());

    // A user `host` (any case) replaces the default Host; Connection is still added, after
    // the user's entries.
    let c = http(
        "proxy_set_header host $http_host;\n\
         proxy_set_header X-A a;\n\
         server { location / { proxy_pass http://127.0.0.1:8081; } }",
    );
    assert_eq!(
        only_loc(&c).proxy.set_headers,
        vec![
            hdr("host", vec![Part::Var(Var::Http("host".into()))]),
            hdr("X-A", vec![lit("a")]),
            hdr("Connection", vec![lit("close")]),
        ]
    );
    let c = http(
        "server { location / { proxy_set_header CONNECTION upgrade; proxy_pass http://127.0.0.1:1; } }",
    );
    assert_eq!(
        only_loc(&c).proxy.set_headers,
        vec![
            hdr("CONNECTION", vec![lit("upgrade")]),
            hdr("Host", vec![Part::Var(Var::ProxyHost)]),
        ]
    );
}

#[test]
fn proxy_upstream_keepalive_defaults() {
    let c = http(
        "upstream a { server 127.0.0.1:1; }\n\
         upstream b { server 127.0.0.1:2; keepalive 4; }\n\
         server { location / { proxy_pass http://a; } location /b { proxy_pass http://b; } }",
    );
    let ups = &c.http.as_ref().unwrap().upstreams;
    assert_eq!(ups.len(), 2);
    assert_eq!(
        (
            ups[0].keepalive,
            ups[0].keepalive_timeout_ms,
            ups[0].keepalive_requests
        ),
        (0, 60_000, 1000)
    );
    assert_eq!(
        (
            ups[1].keepalive,
            ups[1].keepalive_timeout_ms,
            ups[1].keepalive_requests
        ),
        (4, 60_000, 1000)
    );
    // An upstream nobody uses is kept.
    let c = http("upstream idle { server 127.0.0.1:1; }\nserver { }");
    assert_eq!(c.http.unwrap().upstreams[0].name, "idle");
}

#[test]
fn proxy_pass_uri_host_and_port() {
    let pass = |url: &str| -> ProxyPass {
        let c = http(&format!("server {{ location / {{ proxy_pass {url}; }} }}"));
        only_loc(&c).proxy_pass.clone().unwrap()
    };
    let p = pass("http://127.0.0.1:8081");
    assert_eq!(p.uri, None);
    assert_eq!(
        (p.proxy_host.as_str(), p.proxy_port),
        ("127.0.0.1:8081", 8081)
    );
    assert_eq!(pass("http://127.0.0.1:8081/").uri, Some("/".into()));
    assert_eq!(pass("http://127.0.0.1:8081/x/y").uri, Some("/x/y".into()));
    assert_eq!(pass("http://127.0.0.1:8081?a=1").uri, Some("?a=1".into()));
    // The scheme compares without case.
    assert_eq!(pass("HTTP://127.0.0.1:8081/a").uri, Some("/a".into()));
    // Port 80, written or not, is left out of $proxy_host.
    let p = pass("http://127.0.0.1");
    assert_eq!(
        (p.proxy_host.as_str(), p.proxy_port, p.uri),
        ("127.0.0.1", 80, None)
    );
    let p = pass("http://127.0.0.1:80/");
    assert_eq!((p.proxy_host.as_str(), p.proxy_port), ("127.0.0.1", 80));
    let p = pass("http://[::1]:8081/");
    assert_eq!((p.proxy_host.as_str(), p.proxy_port), ("[::1]:8081", 8081));
    let p = pass("http://[::1]");
    assert_eq!((p.proxy_host.as_str(), p.proxy_port), ("[::1]", 80));

    let c = http("server { location / { proxy_pass http://[::1]:8081/; } }");
    let u = &c.http.as_ref().unwrap().upstreams[0];
    assert_eq!(u.name, "[::1]:8081");
    assert_eq!(u.peers[0].addr, sa("[::1]:8081"));
    let c = http("server { location / { proxy_pass http://localhost:8081; } }");
    let h = c.http.as_ref().unwrap();
    assert_eq!(h.upstreams[0].name, "localhost:8081");
    assert!(
        h.upstreams[0]
            .peers
            .iter()
            .any(|p| p.addr == sa("127.0.0.1:8081")),
        "{:?}",
        h.upstreams[0].peers
    );
    assert_eq!(
        only_loc(&c).proxy_pass.as_ref().unwrap().proxy_host,
        "localhost:8081"
    );
}

#[test]
fn proxy_implicit_upstreams_are_shared_and_follow_named_ones() {
    let c = http(
        "server {\n\
             location /a { proxy_pass http://127.0.0.1:9000/a; }\n\
             location /b { proxy_pass http://127.0.0.1:9000/b; }\n\
             location /c { proxy_pass http://127.0.0.1; }\n\
             location /d { proxy_pass http://127.0.0.1:80/d; }\n\
             location /e { proxy_pass http://named; }\n\
         }\n\
         server { listen 81; location / { proxy_pass http://127.0.0.1:9000; } }\n\
         upstream named { server 127.0.0.1:7000; }",
    );
    let h = c.http.as_ref().unwrap();
    let names: Vec<&str> = h.upstreams.iter().map(|u| u.name.as_str()).collect();
    assert_eq!(names, ["named", "127.0.0.1:9000", "127.0.0.1:80"]);
    let implicit = &h.upstreams[1];
    assert_eq!(implicit.place.line, 4);
    assert_eq!(
        implicit.peers,
        vec![PeerConf {
            unix: None,
            addr: sa("127.0.0.1:9000"),
            name: "127.0.0.1:9000".into(),
            weight: 1,
            max_fails: 1,
            fail_timeout_ms: 10_000,
            max_conns: 0,
            backup: false,
            down: false,
            resolve: None,
        }]
    );
    assert_eq!(
        (
            implicit.keepalive,
            implicit.keepalive_timeout_ms,
            implicit.keepalive_requests
        ),
        (0, 60_000, 1000)
    );
    let up = |s: usize, l: usize| {
        h.servers[s].locations[l]
            .proxy_pass
            .as_ref()
            .unwrap()
            .upstream
    };
    assert_eq!(
        [up(0, 0), up(0, 1), up(0, 2), up(0, 3), up(0, 4), up(1, 0)],
        [1, 1, 2, 2, 0, 1]
    );
}

#[test]
fn proxy_upstream_defined_after_use() {
    let c = http(
        "server { location / { proxy_pass http://Later/x; } }\n\
         upstream later { server 127.0.0.1:1; }",
    );
    let h = c.http.as_ref().unwrap();
    assert_eq!(h.upstreams.len(), 1);
    let p = only_loc(&c).proxy_pass.as_ref().unwrap();
    assert_eq!(p.upstream, 0);
    // $proxy_host is the name as proxy_pass writes it.
    assert_eq!(p.proxy_host, "Later");
    assert_eq!(p.uri, Some("/x".into()));
}

#[test]
fn proxy_pass_is_not_inherited_by_nested_locations() {
    let c = http("server { location /a/ { proxy_pass http://127.0.0.1:1; location /a/b/ { } } }");
    let s = &c.http.as_ref().unwrap().servers[0];
    assert_eq!(s.locations[0].path, "/a/");
    assert!(s.locations[0].proxy_pass.is_some());
    assert_eq!(s.locations[1].path, "/a/b/");
    assert_eq!(s.locations[1].proxy_pass, None);
    // With return, both are kept; the request decides.
    let c = http("server { location / { return 204; proxy_pass http://127.0.0.1:1; } }");
    assert!(only_loc(&c).proxy_pass.is_some());
    assert_eq!(only_loc(&c).ret.as_ref().unwrap().code, 204);
}

#[test]
fn proxy_unknown_upstream_host() {
    assert_eq!(
        http_error("server {\nlocation / {\nproxy_pass http://nosuch.invalid;\n}\n}"),
        r#"host not found in upstream "nosuch.invalid" in t.conf:5"#
    );
    assert_eq!(
        http_error("server { location / { proxy_pass http://nosuch.invalid:8080/x; } }"),
        r#"host not found in upstream "nosuch.invalid" in t.conf:3"#
    );
    assert_eq!(
        http_error("upstream u {\nserver nosuch.invalid;\n}"),
        r#"host not found in upstream "nosuch.invalid" in t.conf:4"#
    );
    // A named upstream takes no port.
    assert_eq!(
        http_error(
            "upstream backend { server 127.0.0.1:1; }\nserver { location / {\nproxy_pass http://backend:8080; } }"
        ),
        r#"upstream "backend" may not have port 8080 in t.conf:5"#
    );
}

#[test]
fn proxy_set_header_variables() {
    let value = |v: &str| -> Vec<Part> {
        let c = http(&format!(
            "server {{ location / {{ proxy_set_header X '{v}'; }} }}"
        ));
        only_loc(&c).proxy.set_headers[0].1.clone()
    };
    use Var::*;
    assert_eq!(
        value("a $host b ${uri}c $ d$"),
        vec![
            lit("a "),
            Part::Var(Host),
            lit(" b "),
            Part::Var(Uri),
            lit("c $ d$"),
        ]
    );
    assert_eq!(value(""), vec![]);
    assert_eq!(value("plain"), vec![lit("plain")]);
    assert_eq!(value("${}"), vec![lit("${}")]);
    assert_eq!(value("$-x"), vec![lit("$-x")]);
    assert_eq!(
        value("$request_method$args$is_args"),
        vec![Part::Var(RequestMethod), Part::Var(Args), Part::Var(IsArgs)]
    );
    assert_eq!(
        value("$HTTP_X_Forwarded_Proto"),
        vec![Part::Var(Http("x-forwarded-proto".into()))]
    );
    assert_eq!(
        value("$remote_addr:$remote_port $server_addr:$server_port $server_name"),
        vec![
            Part::Var(RemoteAddr),
            lit(":"),
            Part::Var(RemotePort),
            lit(" "),
            Part::Var(ServerAddr),
            lit(":"),
            Part::Var(ServerPort),
            lit(" "),
            Part::Var(ServerName),
        ]
    );
    assert_eq!(
        value("$scheme://$proxy_host:$proxy_port$request_uri"),
        vec![
            Part::Var(Scheme),
            lit("://"),
            Part::Var(ProxyHost),
            lit(":"),
            Part::Var(ProxyPort),
            Part::Var(RequestUri),
        ]
    );
    assert_eq!(value("é$uri é"), vec![lit("é"), Part::Var(Uri), lit(" é")]);
    assert_eq!(
        http_error("server {\nlocation / {\nproxy_set_header X \"a $foo\";\n}\n}"),
        r#"unknown "foo" variable in t.conf:5"#
    );
    assert_eq!(
        http_error("proxy_set_header X $Bar_Baz;"),
        r#"unknown "bar_baz" variable in t.conf:3"#
    );
    assert_eq!(
        http_error("proxy_set_header X ${uri;"),
        r#"the closing bracket in "uri" variable is missing in t.conf:3"#
    );
}

#[test]
fn proxy_inheritance() {
    let c = http(
        "proxy_set_header X-Http 1;\n\
         proxy_read_timeout 11s;\n\
         proxy_http_version 1.1;\n\
         server {\n\
             proxy_set_header X-Server 2;\n\
             proxy_set_header X-Server2 2;\n\
             proxy_connect_timeout 12s;\n\
             location /a/ {\n\
                 proxy_send_timeout 13s;\n\
                 location /a/b/ { proxy_set_header X-Loc 3; proxy_read_timeout 14s; }\n\
             }\n\
         }\n\
         server { listen 81; location / { proxy_buffering off; } }",
    );
    let h = c.http.as_ref().unwrap();
    let s0 = &h.servers[0];
    let with_defaults = |mut v: Vec<(String, Vec<Part>)>| {
        v.extend(defaults_headers());
        v
    };
    let server_headers = with_defaults(vec![
        hdr("X-Server", vec![lit("2")]),
        hdr("X-Server2", vec![lit("2")]),
    ]);
    // The server's list replaces the http one (not merged).
    assert_eq!(s0.base.proxy.set_headers, server_headers);
    let a = &s0.locations[0].proxy;
    assert_eq!(a.set_headers, server_headers);
    assert_eq!(
        (a.connect_timeout_ms, a.read_timeout_ms, a.send_timeout_ms),
        (12_000, 11_000, 13_000)
    );
    assert_eq!(a.http_version_minor, 1);
    let b = &s0.locations[1].proxy;
    assert_eq!(
        b.set_headers,
        with_defaults(vec![hdr("X-Loc", vec![lit("3")])])
    );
    assert_eq!(
        (b.connect_timeout_ms, b.read_timeout_ms, b.send_timeout_ms),
        (12_000, 14_000, 13_000)
    );
    assert_eq!(b.http_version_minor, 1);
    // The other server inherits from http only.
    let s1 = &h.servers[1];
    let p = &s1.locations[0].proxy;
    assert_eq!(
        p.set_headers,
        with_defaults(vec![hdr("X-Http", vec![lit("1")])])
    );
    assert_eq!(
        (p.connect_timeout_ms, p.read_timeout_ms, p.send_timeout_ms),
        (60_000, 11_000, 60_000)
    );
    assert!(!p.buffering);
    assert!(s1.base.proxy.buffering);
}

#[test]
fn proxy_next_upstream_values() {
    let nu = |v: &str| {
        let c = http(&format!("proxy_next_upstream {v};\nserver {{ }}"));
        c.http.unwrap().servers[0].base.proxy.next_upstream
    };
    assert_eq!(nu("off"), NextUpstream::OFF);
    assert_eq!(nu("error timeout"), NextUpstream::DEFAULT);
    let n = nu("HTTP_504 http_500 http_403 http_404 http_429 http_502 http_503 invalid_header");
    assert_eq!(n.statuses, &[403, 404, 429, 500, 502, 503, 504]);
    assert!(n.invalid_header && !n.error && !n.timeout && !n.non_idempotent);
    // Repeated values are accepted.
    assert_eq!(nu("http_500 http_500").statuses, &[500]);
}

#[test]
fn proxy_errors() {
    let loc = |d: &str| http_error(&format!("server {{\nlocation / {{\n{d}\n}}\n}}"));
    let cases: &[(&str, &str)] = &[
        ("proxy_pass https://;", r#"no host in upstream """#),
        ("proxy_pass ftp://x;", r#"invalid URL prefix in "ftp://x""#),
        ("proxy_pass backend;", r#"invalid URL prefix in "backend""#),
        ("proxy_pass http://;", r#"no host in upstream """#),
        ("proxy_pass http:///x;", r#"no host in upstream "/x""#),
        (
            "proxy_pass http://a:0/;",
            r#"invalid port in upstream "a:0/""#,
        ),
        (
            "proxy_pass http://a:/;",
            r#"invalid port in upstream "a:/""#,
        ),
        (
            "proxy_pass http://a:70000;",
            r#"invalid port in upstream "a:70000""#,
        ),
        (
            "proxy_pass http://[::1;",
            r#"invalid host in upstream "[::1""#,
        ),
        (
            "proxy_pass http://[zz]:1;",
            r#"invalid IPv6 address in upstream "[zz]:1""#,
        ),
        (
            "proxy_pass ftp://backend;",
            r#"invalid URL prefix in "ftp://backend""#,
        ),
        (
            "proxy_pass http://127.0.0.1:1; proxy_pass http://127.0.0.1:2;",
            r#""proxy_pass" directive is duplicate"#,
        ),
        (
            "proxy_pass http://127.0.0.1:1 x;",
            r#"invalid number of arguments in "proxy_pass" directive"#,
        ),
        (
            "proxy_http_version 2.0;",
            r#"invalid value "2.0" in "proxy_http_version" directive"#,
        ),
        (
            "proxy_http_version 1.1; proxy_http_version 1.1;",
            r#""proxy_http_version" directive is duplicate"#,
        ),
        (
            "proxy_connect_timeout soon;",
            r#"invalid value "soon" in "proxy_connect_timeout" directive"#,
        ),
        (
            "proxy_read_timeout 1s; proxy_read_timeout 2s;",
            r#""proxy_read_timeout" directive is duplicate"#,
        ),
        (
            "proxy_send_timeout -1;",
            r#"invalid value "-1" in "proxy_send_timeout" directive"#,
        ),
        (
            "proxy_next_upstream error foo;",
            r#"invalid value "foo" in "proxy_next_upstream" directive"#,
        ),
        (
            "proxy_next_upstream http_501;",
            r#"invalid value "http_501" in "proxy_next_upstream" directive"#,
        ),
        (
            "proxy_next_upstream off error;",
            r#"invalid value "off" in "proxy_next_upstream" directive"#,
        ),
        (
            "proxy_next_upstream error; proxy_next_upstream timeout;",
            r#""proxy_next_upstream" directive is duplicate"#,
        ),
        (
            "proxy_next_upstream_tries many;",
            r#"invalid value "many" in "proxy_next_upstream_tries" directive"#,
        ),
        (
            "proxy_buffering maybe;",
            r#"invalid value "maybe" in "proxy_buffering" directive, it must be "on" or "off""#,
        ),
        (
            "proxy_buffer_size 0;",
            r#"invalid value "0" in "proxy_buffer_size" directive"#,
        ),
        (
            "proxy_buffer_size 2g;",
            r#"invalid value "2g" in "proxy_buffer_size" directive"#,
        ),
        (
            "proxy_buffers 1 4k;",
            r#"there must be at least 2 "proxy_buffers""#,
        ),
        (
            "proxy_buffers 0 4k;",
            r#"invalid value "0" in "proxy_buffers" directive"#,
        ),
        (
            "proxy_buffers 4 0;",
            r#"invalid value "0" in "proxy_buffers" directive"#,
        ),
        (
            "proxy_buffers 4 4x;",
            r#"invalid value "4x" in "proxy_buffers" directive"#,
        ),
        (
            "proxy_buffers 4096 1m;",
            r#"invalid value "4096" in "proxy_buffers" directive"#,
        ),
        (
            "proxy_set_header X;",
            r#"invalid number of arguments in "proxy_set_header" directive"#,
        ),
        (
            "upstream u { server 127.0.0.1:1; }",
            r#""upstream" directive is not allowed here"#,
        ),
        (
            "keepalive 4;",
            r#""keepalive" directive is not allowed here"#,
        ),
        (
            "proxy_timeout 1s;",
            r#""proxy_timeout" directive is not allowed here"#,
        ),
    ];
    for (d, want) in cases {
        assert_eq!(loc(d), format!("{want} in t.conf:5"), "{d}");
    }
}

#[test]
fn proxy_upstream_errors() {
    assert_eq!(
        http_error("upstream u { server 127.0.0.1:1; }\nupstream U { server 127.0.0.1:2; }"),
        r#"duplicate upstream "U" in t.conf:4"#
    );
    assert_eq!(
        http_error("upstream u {\n}"),
        "no servers are inside upstream in t.conf:3"
    );
    let up = |d: &str| http_error(&format!("upstream u {{\nserver 127.0.0.1:1;\n{d}\n}}"));
    let cases: &[(&str, &str)] = &[
        (
            "keepalive 0;",
            r#"invalid value "0" in "keepalive" directive"#,
        ),
        (
            "keepalive 1; keepalive 2;",
            r#""keepalive" directive is duplicate"#,
        ),
        (
            "keepalive_timeout 1s 2s;",
            r#"invalid number of arguments in "keepalive_timeout" directive"#,
        ),
        (
            "keepalive_timeout x;",
            r#"invalid value "x" in "keepalive_timeout" directive"#,
        ),
        (
            "keepalive_requests 1; keepalive_requests 2;",
            r#""keepalive_requests" directive is duplicate"#,
        ),
        (
            "keepalive_requests -1;",
            r#"invalid value "-1" in "keepalive_requests" directive"#,
        ),
        (
            "server 127.0.0.1:2 slow_start=1s;",
            r#"invalid parameter "slow_start=1s""#,
        ),
        (
            "proxy_pass http://127.0.0.1:1;",
            r#""proxy_pass" directive is not allowed here"#,
        ),
        (
            "location / { }",
            r#""location" directive is not allowed here"#,
        ),
    ];
    for (d, want) in cases {
        assert_eq!(up(d), format!("{want} in t.conf:5"), "{d}");
    }
}

#[test]
fn proxy_pass_outside_location() {
    assert_eq!(
        http_error("server {\nproxy_pass http://127.0.0.1:1;\n}"),
        r#""proxy_pass" directive is not allowed here in t.conf:4"#
    );
    assert_eq!(
        http_error("proxy_pass http://127.0.0.1:1;"),
        r#""proxy_pass" directive is not allowed here in t.conf:3"#
    );
}

#[test]
fn keepalive_in_stream_upstream_is_rejected() {
    for d in [
        "keepalive 4;",
        "keepalive_timeout 10s;",
        "keepalive_requests 10;",
    ] {
        let name = d.split(' ').next().unwrap();
        assert_eq!(
            stream_error(&format!("upstream u {{\nserver 127.0.0.1:1;\n{d}\n}}")),
            format!("\"{name}\" directive is not allowed here in t.conf:5")
        );
    }
    // The http-only proxy directives are not stream ones.
    assert_eq!(
        stream_error("proxy_set_header X y;"),
        r#""proxy_set_header" directive is not allowed here in t.conf:3"#
    );
    // A stream `server` still needs its port.
    assert_eq!(
        stream_error("upstream u { server 127.0.0.1; }"),
        r#"no port in upstream "127.0.0.1" in t.conf:3"#
    );
}

#[test]
fn request_body_and_lingering_directives() {
    let c = http(
        "client_body_buffer_size 16k;\n\
         client_body_temp_path /var/spool/body 1 2;\n\
         lingering_timeout 2s;\n\
         server {\n\
             listen 8080;\n\
             lingering_close always;\n\
             location /up { proxy_pass http://127.0.0.1:8081; proxy_request_buffering off;\n\
                 client_body_in_file_only clean; client_body_in_single_buffer on;\n\
                 lingering_time 10s; client_body_temp_path tmp; }\n\
             location / { }\n\
         }",
    );
    let s = &c.http.as_ref().unwrap().servers[0];
    let (up, root) = (&s.locations[0], &s.locations[1]);
    assert_eq!(root.body.buffer_size, 16384);
    assert_eq!(root.body.temp_path.path, PathBuf::from("/var/spool/body"));
    assert_eq!(root.body.temp_path.levels, vec![1, 2]);
    assert_eq!(
        root.body.temp_path.file(12345),
        PathBuf::from("/var/spool/body/5/34/0000012345")
    );
    assert!(!root.body.in_file_only.any() && !root.body.in_single_buffer);
    assert!(root.proxy.request_buffering);
    assert_eq!(
        root.lingering,
        Lingering {
            close: LingeringClose::Always,
            time_ms: 30_000,
            timeout_ms: 2_000
        }
    );
    assert!(!up.proxy.request_buffering);
    assert_eq!(up.body.in_file_only, InFileOnly::Clean);
    assert!(up.body.in_single_buffer);
    assert_eq!(up.lingering.time_ms, 10_000);
    assert_eq!(up.body.temp_path.path, PathBuf::from("/pfx/tmp"));
    assert!(up.body.temp_path.levels.is_empty());
    let paths = c.http.as_ref().unwrap().client_body_temp_paths();
    assert_eq!(paths.len(), 2);

    // Defaults, as nginx on x86-64.
    let d = http("server { listen 8080; }");
    let b = &d.http.as_ref().unwrap().servers[0].base;
    assert_eq!(b.body.buffer_size, 8192);
    assert_eq!(
        b.body.temp_path.path,
        PathBuf::from("/pfx/client_body_temp")
    );
    assert_eq!(b.lingering.close, LingeringClose::On);
    assert_eq!(
        (b.lingering.time_ms, b.lingering.timeout_ms),
        (30_000, 5_000)
    );

    let e = |t: &str| error(&format!("{EV}http {{\nserver {{\n{t}\n}}\n}}\n"));
    assert_eq!(
        e("client_body_temp_path /x 3;"),
        r#"invalid value "3" in "client_body_temp_path" directive in t.conf:4"#
    );
    assert_eq!(
        e("client_body_temp_path /x 1 1 1 1;"),
        r#"invalid number of arguments in "client_body_temp_path" directive in t.conf:4"#
    );
    assert_eq!(
        e("lingering_close sometimes;"),
        r#"invalid value "sometimes" in "lingering_close" directive in t.conf:4"#
    );
    assert!(e("client_body_in_file_only yes;").contains("invalid value"));
    assert_eq!(
        e("proxy_request_buffering maybe;"),
        r#"invalid value "maybe" in "proxy_request_buffering" directive, it must be "on" or "off" in t.conf:4"#
    );
}

#[test]
fn disable_symlinks_parses_as_nginx() {
    let c = http(
        "disable_symlinks on;\n\
         server { listen 8080;\n\
             location /a { disable_symlinks if_not_owner from=$document_root; }\n\
             location /b { disable_symlinks on from=/srv; }\n\
             location /c { disable_symlinks off; }\n\
             location /d { }\n\
         }",
    );
    let l = &c.http.as_ref().unwrap().servers[0].locations;
    assert_eq!(
        l[0].disable_symlinks,
        DisableSymlinks {
            check: SymlinkCheck::IfNotOwner,
            from: Some(SymlinksFrom::DocumentRoot)
        }
    );
    assert_eq!(
        l[1].disable_symlinks.from,
        Some(SymlinksFrom::Path(PathBuf::from("/srv")))
    );
    assert_eq!(l[2].disable_symlinks.check, SymlinkCheck::Off);
    assert_eq!(l[3].disable_symlinks.check, SymlinkCheck::On);
    let e = |t: &str| error(&format!("{EV}http {{\nserver {{\n{t}\n}}\n}}\n"));
    assert_eq!(
        e("disable_symlinks off from=/x;"),
        r#""from=" cannot be used with "off" parameter in t.conf:4"#
    );
    assert_eq!(
        e("disable_symlinks sometimes;"),
        r#"invalid parameter "sometimes" in t.conf:4"#
    );
    assert!(e("disable_symlinks on from=$realpath_root;").contains("not supported"));
}

#[test]
fn defaults_the_directive_reference_states() {
    let c = http("server { listen 127.0.0.1:8080; }");
    let b = &c.http.as_ref().unwrap().servers[0].base;
    assert_eq!(b.client_body_timeout_ms, 60_000);
    assert!(!c.main.worker_sandbox);
    assert_eq!(c.main.worker_shutdown_timeout_ms, None);
    assert_eq!(c.main.worker_shutdown_drain_ms, 5000);
    assert_eq!(c.listeners[0].opts.backlog, 511);
}

#[test]
fn ssl_listens_and_directives_as_nginx() {
    let c = http(
        "ssl_protocols TLSv1.2 TLSv1.3; ssl_certificate a.pem; ssl_certificate_key a.key;\n\
         server { listen 127.0.0.1:443 ssl http2; server_name a.test; \
         ssl_certificate b.pem; ssl_certificate_key b.key; ssl_certificate c.pem; \
         ssl_certificate_key c.key; ssl_session_cache shared:SSL:10m; ssl_session_timeout 1h; }\n\
         server { listen 127.0.0.1:443; server_name b.test; ssl_session_tickets off; }",
    );
    // `ssl` on one `listen` makes the address TLS; `http2` is accepted.
    assert!(c.listeners[0].opts.ssl);
    let h = c.http.as_ref().unwrap();
    let a = &h.servers[0].ssl;
    assert_eq!(a.certificates.len(), 2);
    assert_eq!(
        a.certificates[0].certificate,
        Path::new("/nonexistent-conf/b.pem")
    );
    assert_eq!(a.certificates[1].key, Path::new("/nonexistent-conf/c.key"));
    assert_eq!(
        a.session_cache,
        SessionCache::Shared {
            name: "SSL".into(),
            bytes: 10 << 20
        }
    );
    assert_eq!(a.session_timeout_ms, 3_600_000);
    assert_eq!(a.protocols, ["TLSv1.2", "TLSv1.3"]);
    // The http level's pair where the server names none.
    let b = &h.servers[1].ssl;
    assert_eq!(
        b.certificates[0].certificate,
        Path::new("/nonexistent-conf/a.pem")
    );
    assert!(!b.session_tickets && a.session_tickets);
    assert_eq!(
        error(&format!("{EV}http {{ server {{ ssl_certificate a.pem; }} }}")),
        "no \"ssl_certificate_key\" is defined for certificate \"/nonexistent-conf/a.pem\" in t.conf:2"
    );
    assert!(
        error(&format!("{EV}http {{ ssl_protocols TLSv9; }}")).contains("invalid value \"TLSv9\"")
    );
    // `ssl_stapling on` is ignored with a warning, as nginx when it cannot staple.
    assert_eq!(
        parse(&format!("{EV}http {{ ssl_stapling on; }}")).warnings,
        ["\"ssl_stapling\" staples only an \"ssl_stapling_file\" in shard (OCSP responses are not fetched) in t.conf:2"]
    );
    // With variables: every pair of the server is rendered at the handshake (a plain path as
    // a literal), relative to the configuration's directory; an unknown variable is an error.
    let c = parse(&format!(
        "{EV}http {{ server {{ ssl_certificate $ssl_server_name.pem; \
         ssl_certificate_key k.key; }} }}"
    ));
    let pair = &c.http.as_ref().unwrap().servers[0].ssl.certificates[0];
    let v = pair.vars.as_ref().unwrap();
    assert_eq!(v.raw.0, "$ssl_server_name.pem");
    assert_eq!(v.raw.1, "/nonexistent-conf/k.key");
    assert_eq!(v.dir, Path::new("/nonexistent-conf/"));
    assert!(error(&format!(
        "{EV}http {{ server {{ ssl_certificate $nx.pem; ssl_certificate_key k; }} }}"
    ))
    .contains("unknown \"nx\" variable"));
    // stream: TLS termination in front of a TCP upstream.
    let c = parse(&format!(
        "{EV}stream {{ ssl_protocols TLSv1.3; server {{ listen 127.0.0.1:7443 ssl; \
         ssl_certificate s.pem; ssl_certificate_key s.key; proxy_pass 127.0.0.1:7000; }} }}"
    ));
    let st = c.stream.as_ref().unwrap();
    assert!(c.listeners[0].opts.ssl);
    assert_eq!(st.servers[0].ssl.certificates.len(), 1);
    assert_eq!(st.servers[0].ssl.protocols, ["TLSv1.3"]);
}

#[test]
fn worker_shutdown_drain_takes_a_time_or_off() {
    assert_eq!(
        parse(&format!("worker_shutdown_drain 2s;\n{EV}"))
            .main
            .worker_shutdown_drain_ms,
        2000
    );
    assert_eq!(
        parse(&format!("worker_shutdown_drain off;\n{EV}"))
            .main
            .worker_shutdown_drain_ms,
        0
    );
    assert_eq!(
        error(&format!("worker_shutdown_drain soon;\n{EV}")),
        r#"invalid value "soon" in "worker_shutdown_drain" directive in t.conf:1"#
    );
    assert!(error("events { worker_shutdown_drain 1s; }").contains("not allowed here"));
}

#[test]
fn open_file_cache_directives_follow_nginx() {
    let c = http("server { location / { } }");
    let l = &c.http.as_ref().unwrap().servers[0].locations[0];
    assert_eq!(l.open_file_cache, OpenFileCache::default());
    assert_eq!(l.open_file_cache.max, None);
    let c = http(
        "open_file_cache max=100 inactive=20s; open_file_cache_valid 30s; open_file_cache_min_uses 2; \
         open_file_cache_errors on; server { location / { } location /off { open_file_cache off; } }",
    );
    let s = &c.http.as_ref().unwrap().servers[0];
    let on = s.locations.iter().find(|l| l.path == "/").unwrap();
    assert_eq!(
        on.open_file_cache,
        OpenFileCache {
            max: Some(100),
            inactive_ms: 20_000,
            valid_ms: 30_000,
            min_uses: 2,
            errors: true
        }
    );
    let off = s.locations.iter().find(|l| l.path == "/off").unwrap();
    assert_eq!(off.open_file_cache.max, None);
    assert_eq!(off.open_file_cache.valid_ms, 30_000);
    assert_eq!(
        error("events {}\nhttp { open_file_cache inactive=10s; }"),
        r#""open_file_cache" must have the "max" parameter in t.conf:2"#
    );
    assert_eq!(
        error("events {}\nhttp { open_file_cache max=x; }"),
        r#"invalid "open_file_cache" parameter "max=x" in t.conf:2"#
    );
    assert_eq!(
        error("events {}\nhttp { open_file_cache max=10 size=3; }"),
        r#"invalid "open_file_cache" parameter "size=3" in t.conf:2"#
    );
    assert_eq!(
        error("events {}\nhttp { open_file_cache_errors maybe; }"),
        r#"invalid value "maybe" in "open_file_cache_errors" directive, it must be "on" or "off" in t.conf:2"#
    );
}

#[test]
fn an_empty_index_name_is_refused_as_nginx_does() {
    assert_eq!(
        error("events {}\nhttp { index \"\" /abs.html; }"),
        r#"index "" in "index" directive is invalid in t.conf:2"#
    );
}

#[test]
fn every_error_in_one_run() {
    let e = parse_str(
        "events {}\nhttp {\n lisen 80;\n server { listen 80; xslt_stylesheet x; \
         keepalive_timeout x; }\n}\nworker_processes none;\n",
        "t.conf",
        Path::new("/nonexistent-conf"),
        Path::new("/pfx"),
        None,
    )
    .expect_err("expected errors");
    let all: Vec<&str> = e.all().collect();
    assert_eq!(
        all,
        [
            "unknown directive \"lisen\" in t.conf:3",
            "\"xslt_stylesheet\" is an nginx directive that shard does not support in t.conf:4",
            "invalid value \"x\" in \"keepalive_timeout\" directive in t.conf:4",
            "invalid value \"none\" in \"worker_processes\" directive in t.conf:6",
        ],
        "{all:?}"
    );
    assert_eq!(
        e.to_string(),
        all[0],
        "Display is the first error, as nginx"
    );
    // A syntax error ends its file: nothing after it is reported.
    let e = parse_str(
        "events {}\nfoo;\nhttp { server { listen 80 } \nbar;\n",
        "t.conf",
        Path::new("/nonexistent-conf"),
        Path::new("/pfx"),
        None,
    )
    .expect_err("expected errors");
    assert_eq!(e.all().count(), 2, "{:?}", e.all().collect::<Vec<_>>());
}

#[test]
fn nginx_directives_shard_lacks_say_so() {
    assert!(parse::NGINX_ONLY_IS_SORTED());
    assert_eq!(
        error(&format!(
            "{EV}http {{ server {{ location / {{ xslt_stylesheet a.xsl; }} }} }}"
        )),
        "\"xslt_stylesheet\" is an nginx directive that shard does not support in t.conf:2"
    );
    assert_eq!(
        error(&format!("{EV}http {{ sever {{ }} }}")),
        "unknown directive \"sever\" in t.conf:2"
    );
}

#[test]
fn tuning_directives_warn() {
    let c = parse(&format!(
        "daemon off;\nmaster_process on;\n{EV}http {{\n tcp_nopush on;\n \
         types_hash_max_size 2048;\n server_names_hash_bucket_size 64;\n \
         output_buffers 2 32k;\n gzip_buffers 16 8k;\n proxy_temp_path /tmp/p 1 2;\n \
         server {{ listen 80; postpone_output 1460; location / {{ send_lowat 0; }} }}\n}}\n"
    ));
    // `daemon` and `master_process` are real directives now: no warning.
    assert_eq!(c.warnings.len(), 8, "{:?}", c.warnings);
    assert!(!c.main.daemon && c.main.master_process);
    assert_eq!(
        c.warnings[0],
        "\"tcp_nopush\" is accepted and has no effect in shard in t.conf:5"
    );
    // Their values are still checked, as nginx checks them.
    assert_eq!(
        error(&format!("{EV}http {{ tcp_nopush maybe; }}")),
        "invalid value \"maybe\" in \"tcp_nopush\" directive, it must be \"on\" or \"off\" in t.conf:2"
    );
    assert_eq!(
        error(&format!("{EV}http {{ types_hash_max_size lots; }}")),
        "invalid value \"lots\" in \"types_hash_max_size\" directive in t.conf:2"
    );
    assert_eq!(
        error(&format!("{EV}tcp_nopush on;")),
        "\"tcp_nopush\" directive is not allowed here in t.conf:2"
    );
}

#[test]
fn duplicate_locations() {
    assert_eq!(
        error(&format!(
            "{EV}http {{ server {{\nlocation /a {{ }}\nlocation ^~ /a {{ }}\n}} }}"
        )),
        "duplicate location \"/a\" in t.conf:4"
    );
    assert_eq!(
        error(&format!(
            "{EV}http {{ server {{\nlocation = /a {{ }}\nlocation /b {{ location = /b/c {{ }} location = /b/c {{ }} }}\n}} }}"
        )),
        "duplicate location \"/b/c\" in t.conf:4"
    );
    // An exact and a prefix location of one path are two locations, as in nginx.
    let c = http("server { location = /a { } location /a { } }");
    assert_eq!(c.http.unwrap().servers[0].locations.len(), 2);
}

#[test]
fn include_glob_skips_dot_files() {
    let t = TempDir::new("dotfiles");
    t.write("conf.d/a.conf", "server { listen 8081; }\n");
    t.write("conf.d/.disabled.conf", "this is not a configuration\n");
    let main = t.write("nginx.conf", "events {}\nhttp { include conf.d/*.conf; }\n");
    let c = load(&main, &t.0, None).unwrap();
    assert_eq!(c.http.unwrap().servers.len(), 1);
    assert_eq!(c.included.len(), 1);
    // Named explicitly, a dot-file is read.
    t.write(
        "nginx2.conf",
        "events {}\nhttp { include conf.d/.*.conf; }\n",
    );
    let e = load(&t.0.join("nginx2.conf"), &t.0, None).unwrap_err();
    assert!(e.message.contains(".disabled.conf:"), "{}", e.message);
}

#[test]
fn log_formats_and_several_access_logs() {
    let c = http(
        "log_format main '$remote_addr \"$request\" $status'\n  ' $request_time';\n\
         log_format js escape=json '{\"u\":\"$uri\"}';\n\
         access_log logs/a.log main buffer=32k flush=5s;\n\
         access_log logs/b.log js if=$arg_log;\n\
         access_log logs/c.log;\n\
         server { location /q { access_log off; access_log logs/x.log; } location /r { } }",
    );
    let s = &c.http.unwrap().servers[0];
    let logs = &s.base.access_logs;
    assert_eq!(logs.len(), 3);
    assert_eq!(logs[0].format.name, "main");
    assert_eq!(
        logs[0].format.parts.last(),
        Some(&Part::Var(Var::RequestTime))
    );
    assert_eq!(logs[1].format.escape, LogEscape::Json);
    assert_eq!(
        logs[1].condition,
        Some(vec![Part::Var(Var::Arg("log".into()))])
    );
    assert_eq!(logs[2].format.name, "combined");
    assert!(
        s.locations[0].access_logs.is_empty(),
        "off wins at its level"
    );
    assert_eq!(s.locations[1].access_logs.len(), 3, "inherited");
    assert_eq!(
        error(&format!(
            "{EV}http {{ access_log logs/a.log main; log_format main x; }}"
        )),
        "unknown log format \"main\" in t.conf:2"
    );
    assert_eq!(
        error(&format!("{EV}http {{ log_format combined x; }}")),
        "duplicate \"log_format\" name \"combined\" in t.conf:2"
    );
    assert_eq!(
        error(&format!("{EV}http {{ log_format m escape=xml x; }}")),
        "unknown log format escaping \"xml\" in t.conf:2"
    );
    // syslog is accepted (`syslog_destinations`); memory: is not.
    assert!(error(&format!("{EV}error_log memory:32m debug;")).contains("memory:"));
}

#[test]
fn allow_deny_rules() {
    let c = http(
        "allow 10.1.2.3/8; deny 2001:db8::/32; allow 192.168.1.1; deny all;\n\
         server { location /a { deny 127.0.0.1; } location /b { } }",
    );
    let s = &c.http.unwrap().servers[0];
    let r = &s.locations[1].access_rules;
    assert_eq!(r.len(), 4);
    assert_eq!(
        r[0].net,
        Some(("10.0.0.0".parse().unwrap(), 8)),
        "host bits dropped"
    );
    assert!(r[0].matches("10.200.0.1".parse().unwrap()));
    assert!(
        r[0].matches("::ffff:10.0.0.9".parse().unwrap()),
        "v4-mapped"
    );
    assert!(!r[0].matches("11.0.0.1".parse().unwrap()));
    assert!(r[1].matches("2001:db8:1::5".parse().unwrap()));
    assert!(!r[1].matches("10.0.0.1".parse().unwrap()));
    assert!(r[3].matches("1.2.3.4".parse().unwrap()));
    assert_eq!(s.locations[0].access_rules.len(), 1, "own rules replace");
    assert_eq!(
        c.warnings,
        ["low address bits of 10.1.2.3/8 are meaningless in t.conf:3"]
    );
    assert_eq!(
        error(&format!("{EV}http {{ allow 10.0.0.0/33; }}")),
        "invalid value \"10.0.0.0/33\" in \"allow\" directive in t.conf:2"
    );
    assert_eq!(
        error(&format!("{EV}http {{ deny nobody; }}")),
        "invalid value \"nobody\" in \"deny\" directive in t.conf:2"
    );
}

#[test]
fn regex_and_named_locations() {
    let c = http(
        "server { location ~ \\.php$ { } location ~* ^/A { location ~ b { } } location @fallback { } }",
    );
    let s = &c.http.unwrap().servers[0];
    assert_eq!(s.locations[0].kind, LocationKind::Regex);
    assert!(s.locations[0].regex.as_ref().unwrap().is_match("/x.php"));
    assert!(
        s.locations[1].regex.as_ref().unwrap().is_match("/abc"),
        "~* ignores case"
    );
    assert_eq!(s.locations[2].parent, Some(1));
    assert_eq!(s.locations[3].kind, LocationKind::Named);
    assert_eq!(s.locations[3].path, "@fallback");
    // PCRE: look-around is fine; a broken expression is nginx's pcre2_compile() error.
    let c = parse(&format!(
        "{EV}http {{ server {{ location ~ /\\.(?!well-known) {{ }} }} }}"
    ));
    let re = c.http.unwrap().servers[0].locations[0]
        .regex
        .clone()
        .unwrap();
    assert!(re.is_match("/.git") && !re.is_match("/.well-known/x"));
    assert_eq!(
        error(&format!("{EV}http {{ server {{ location ~ ^(a {{ }} }} }}")),
        "pcre2_compile() failed: missing closing parenthesis in \"^(a\" at \"\" in t.conf:2"
    );
    assert_eq!(
        error(&format!(
            "{EV}http {{ server {{ location ~ /a {{ proxy_pass http://127.0.0.1:1/x; }} }} }}"
        )),
        "\"proxy_pass\" cannot have URI part in location given by regular expression, or inside \
         named location, or inside \"if\" statement, or inside \"limit_except\" block in t.conf:2"
    );
    assert_eq!(
        error(&format!(
            "{EV}http {{ server {{ location /a {{ location @n {{ }} }} }} }}"
        )),
        "named location \"@n\" can be on the server level only in t.conf:2"
    );
}

#[test]
fn upstream_balancing_methods() {
    let c = http(
        "upstream a { least_conn; server 127.0.0.1:1; }\n\
         upstream b { hash $request_uri consistent; server 127.0.0.1:1; }\n\
         upstream c { ip_hash; server 127.0.0.1:1; }\n\
         server { location / { proxy_pass http://a; } }",
    );
    let h = c.http.unwrap();
    assert_eq!(h.upstreams[0].balance, Balance::LeastConn);
    assert_eq!(
        h.upstreams[1].balance,
        Balance::Hash {
            key: vec![Part::Var(Var::RequestUri)],
            consistent: true
        }
    );
    assert_eq!(h.upstreams[2].balance, Balance::IpHash);
    assert_eq!(
        error(&format!(
            "{EV}http {{ upstream a {{ least_conn; ip_hash; server 127.0.0.1:1; }} }}"
        )),
        "load balancing method redefined in t.conf:2"
    );
    // In a stream upstream the key has the stream's variables.
    let c = parse(&format!(
        "{EV}stream {{ upstream a {{ hash $remote_addr$session_time consistent; server 127.0.0.1:1; }} }}"
    ));
    assert_eq!(
        c.stream.unwrap().upstreams[0].balance,
        Balance::Hash {
            key: vec![Part::Var(Var::RemoteAddr), Part::Var(Var::SessionTime)],
            consistent: true
        }
    );
    let e = error(&format!(
        "{EV}stream {{ upstream a {{ hash $uri; server 127.0.0.1:1; }} }}"
    ));
    assert!(e.contains("unknown \"uri\" variable"), "{e}");
}

#[test]
fn access_log_paths_with_variables() {
    let c = http("server { access_log logs/$host.log; access_log /var/log/plain.log; }");
    let logs = &c.http.as_ref().unwrap().servers[0].base.access_logs;
    assert_eq!(
        logs[0].path_vars,
        Some(vec![
            Part::Lit("/pfx/logs/".into()),
            Part::Var(Var::Host),
            Part::Lit(".log".into())
        ])
    );
    assert_eq!(logs[1].path_vars, None);
    // Files nginx creates at start: the plain ones, and the default one nothing uses.
    assert!(c
        .declared_logs
        .contains(&PathBuf::from("/var/log/plain.log")));
    assert_eq!(
        error(&format!(
            "{EV}http {{ server {{ access_log logs/$host.log combined buffer=4k; }} }}"
        )),
        "buffered logs cannot have variables in name in t.conf:2"
    );
}

#[test]
fn root_and_alias_with_variables() {
    let c = http("server { root /srv/$host/www; location ~ ^/u/(.+)$ { alias data/$1; } }");
    let s = &c.http.unwrap().servers[0];
    assert_eq!(
        s.base.root,
        PathBuf::from("/srv/"),
        "the part a sandbox may open"
    );
    assert_eq!(
        s.base.doc_root_vars,
        Some(vec![
            Part::Lit("/srv/".into()),
            Part::Var(Var::Host),
            Part::Lit("/www".into())
        ])
    );
    let l = &s.locations[0];
    assert_eq!(l.alias, Some(PathBuf::from("/pfx/data/")));
    assert_eq!(
        l.doc_root_vars,
        Some(vec![
            Part::Lit("/pfx/data/".into()),
            Part::Var(Var::Capture(1))
        ])
    );
    assert_eq!(
        error(&format!(
            "{EV}http {{ server {{ root $document_root/x; }} }}"
        )),
        "\"root\" cannot use $document_root, $realpath_root or $request_filename in t.conf:2"
    );
}

/// `docs/nginx-directives.md` says what the table says (`SHARD_BLESS=1` rewrites it).
#[test]
fn nginx_directive_index_doc_is_current() {
    let want = parse::directive_index_doc();
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/nginx-directives.md");
    if std::env::var_os("SHARD_BLESS").is_some() {
        std::fs::write(&path, &want).unwrap();
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        have == want,
        "docs/nginx-directives.md is out of date: run `SHARD_BLESS=1 cargo test -p shard-config nginx_directive_index`"
    );
}

#[test]
fn stream_log_format_and_access_log() {
    let c = stream(
        "log_format basic '$remote_addr [$time_local] $protocol $status $bytes_sent \
         $bytes_received $session_time \"$upstream_addr\"';\n\
         access_log /tmp/s.log basic;\n\
         server { listen 8081; proxy_pass 127.0.0.1:1; }\n\
         server { listen 8082; proxy_pass 127.0.0.1:1; access_log off; }\n\
         server { listen 8083; proxy_pass 127.0.0.1:1; access_log /tmp/t.log basic if=$status; }",
    );
    let s = &c.stream.as_ref().unwrap().servers;
    assert_eq!(s[0].access_logs.len(), 1);
    assert_eq!(s[0].access_logs[0].format.name, "basic");
    assert!(s[0].access_logs[0]
        .format
        .parts
        .contains(&Part::Var(Var::SessionTime)));
    assert!(s[1].access_logs.is_empty(), "off");
    assert_eq!(s[2].access_logs.len(), 1, "a level with its own replaces");
    assert!(s[2].access_logs[0].condition.is_some());
    // The stream's formats are its own; the format is required; only stream variables.
    let e = stream_error("access_log /tmp/s.log;");
    assert!(
        e.contains("invalid number of arguments in \"access_log\""),
        "{e}"
    );
    let e = stream_error("access_log /tmp/s.log combined;");
    assert!(e.contains("unknown log format \"combined\""), "{e}");
    let e = stream_error("log_format x '$request';");
    assert!(e.contains("unknown \"request\" variable"), "{e}");
    let e = error(&format!(
        "{EV}http {{ log_format h '$status'; }}\nstream {{ access_log /tmp/s.log h; }}\n"
    ));
    assert!(e.contains("unknown log format \"h\""), "{e}");
    let e = stream_error("server { listen 8081; return $uri; }");
    assert!(e.contains("unknown \"uri\" variable"), "{e}");
}

#[test]
fn stream_map_geo_split_clients() {
    let c = stream(
        "map $remote_addr $m { default d; 10.0.0.1 ten; }\n\
         geo $g { default far; 127.0.0.0/8 loop; }\n\
         geo $remote_addr $g2 { ranges; default x; 10.0.0.1-10.0.0.9 low; }\n\
         split_clients $remote_port $s { 50% a; * b; }\n\
         server { listen 8081; return \"$m $g $g2 $s $later\"; }\n\
         map $m $later { d dd; }",
    );
    let st = c.stream.as_ref().unwrap();
    assert_eq!(st.maps.len(), 5);
    assert!(st.servers[0]
        .ret
        .as_ref()
        .unwrap()
        .contains(&Part::Var(Var::User("later".into()))));
    // Names no stream block defines; http's are not the stream's; `proxy` is http's.
    let e = stream_error("server { listen 8081; return $nope; }");
    assert!(e.contains("unknown \"nope\" variable"), "{e}");
    let e = error(&format!(
        "{EV}http {{ map $uri $hm {{ default 1; }} }}\n\
         stream {{ server {{ listen 8081; return $hm; }} }}\n"
    ));
    assert!(e.contains("unknown \"hm\" variable"), "{e}");
    let e = stream_error("geo $g { proxy 10.0.0.0/8; }");
    assert!(e.contains("invalid parameter \"proxy\""), "{e}");
    let e = stream_error("map $remote_addr $m { default a; }\nmap $server_port $m { default b; }");
    assert!(e.contains("duplicate \"map\" variable"), "{e}");
}

#[test]
fn stream_ssl_preread_and_variable_proxy_pass() {
    let c = stream(
        "map $ssl_preread_server_name $be { default 127.0.0.1:1; }\n\
         ssl_preread on;\n\
         server { listen 8081; proxy_pass $be; preread_buffer_size 4k; preread_timeout 5s; }\n\
         server { listen 8082; ssl_preread off; proxy_pass 127.0.0.1:2; }",
    );
    let s = &c.stream.as_ref().unwrap().servers;
    assert!(s[0].ssl_preread && !s[1].ssl_preread);
    assert_eq!(s[0].upstream, usize::MAX);
    assert_eq!(
        s[0].pass_vars.as_deref(),
        Some(&[Part::Var(Var::User("be".into()))][..])
    );
    assert_eq!(
        (s[0].preread_buffer_size, s[0].preread_timeout_ms),
        (4096, 5000)
    );
    assert_eq!(
        (s[1].preread_buffer_size, s[1].preread_timeout_ms),
        (16384, 30_000)
    );
    assert!(s[1].pass_vars.is_none());
    let e = stream_error("server { listen 8081; proxy_pass $nope; }");
    assert!(e.contains("unknown \"nope\" variable"), "{e}");
    let e = stream_error("ssl_preread maybe;");
    assert!(e.contains("ssl_preread"), "{e}");
}

#[test]
fn stream_limit_conn_zones() {
    let c = stream(
        "limit_conn_zone $binary_remote_addr zone=a:1m;\n\
         limit_conn a 2;\n\
         server { listen 8081; proxy_pass 127.0.0.1:1; }\n\
         server { listen 8082; proxy_pass 127.0.0.1:1; limit_conn a 1; limit_conn_dry_run on; }",
    );
    let st = c.stream.as_ref().unwrap();
    assert_eq!(st.limit_zones[0].size, 1 << 20);
    assert_eq!(
        st.servers[0].limit_conn,
        vec![LimitConn { zone: 0, max: 2 }]
    );
    assert_eq!(
        st.servers[1].limit_conn,
        vec![LimitConn { zone: 0, max: 1 }]
    );
    assert!(st.servers[1].limit_conn_dry_run && !st.servers[0].limit_conn_dry_run);
    let e = stream_error("server { listen 8081; proxy_pass 127.0.0.1:1; limit_conn b 1; }");
    assert!(e.contains("zero size shared memory zone \"b\""), "{e}");
    let e = stream_error("limit_conn_zone $uri zone=a:1m;");
    assert!(e.contains("unknown \"uri\" variable"), "{e}");
}

#[test]
fn cache_directives_merge_as_nginx() {
    let c = http(
        "proxy_cache_path /var/cache/a levels=1:2 keys_zone=one:10m inactive=1h max_size=1g;\n\
         proxy_cache_path /var/cache/b keys_zone=two:1m use_temp_path=off;\n\
         proxy_cache one;\n\
         proxy_cache_valid 200 302 10m;\n\
         proxy_cache_valid 404 1m;\n\
         proxy_ignore_headers Expires;\n\
         proxy_ignore_headers Set-Cookie X-Accel-Redirect;\n\
         server { listen 127.0.0.1:8080;\n\
           location / { proxy_pass http://127.0.0.1:1; }\n\
           location /v { proxy_pass http://127.0.0.1:1; proxy_cache $arg_c;\n\
             proxy_cache_valid 1h; proxy_cache_use_stale error updating;\n\
             proxy_cache_methods POST; proxy_no_cache $arg_x $cookie_y; }\n\
           location /off { proxy_pass http://127.0.0.1:1; proxy_cache off; } }",
    );
    let h = c.http.as_ref().unwrap();
    assert_eq!(h.cache_paths.len(), 2);
    let a = &h.cache_paths[0];
    assert_eq!(
        (
            a.name.as_str(),
            a.levels.clone(),
            a.inactive_secs,
            a.max_size
        ),
        ("one", vec![1, 2], 3600, 1 << 30)
    );
    assert!(!h.cache_paths[1].use_temp_path);
    let locs = &h.servers[0].locations;
    let (root, v, off) = (&locs[0].proxy, &locs[1].proxy, &locs[2].proxy);
    assert_eq!(root.cache.sel, CacheSel::Zone(0));
    assert_eq!(root.cache.valid.len(), 2);
    assert_eq!(root.cache.valid[0].codes, vec![200, 302]);
    assert_eq!(root.cache.valid[1].secs, 60);
    // Repeated `proxy_ignore_headers` add up.
    assert_eq!(
        root.ignore_headers,
        ignore::EXPIRES | ignore::SET_COOKIE | ignore::X_ACCEL_REDIRECT
    );
    assert!(root.ignore_accel_redirect);
    assert!(matches!(v.cache.sel, CacheSel::Var(_)));
    // A level's valid list replaces its parent's; without codes: 200 301 302.
    assert_eq!(v.cache.valid.len(), 1);
    assert_eq!(v.cache.valid[0].codes, vec![200, 301, 302]);
    assert_eq!(v.cache.use_stale, stale::ERROR | stale::UPDATING);
    assert_eq!(v.cache.methods, vec!["POST".to_string()]);
    assert_eq!(v.cache.no_cache.len(), 2);
    assert!(v.cache.reads_head, "$cookie_y reads the request's fields");
    assert!(!root.cache.reads_head);
    assert_eq!(off.cache.sel, CacheSel::Off);
    assert_eq!(root.cache.lock_timeout_ms, 5000);
    assert!(root.cache.convert_head);
}
