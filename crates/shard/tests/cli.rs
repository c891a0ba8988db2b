//! The command line: `-t`, `-g`, `-v`, configuration errors with their exact messages.

mod support;

use support::*;

/// Writes `conf` into a fresh prefix and runs `shard -p PREFIX -c conf/shard.conf ARGS`.
fn with_conf(tag: &str, conf: &str, args: &[&str]) -> (i32, String) {
    let dir = temp_dir(tag);
    std::fs::write(dir.join("conf/shard.conf"), conf).unwrap();
    let prefix = dir.to_str().unwrap().to_string();
    let mut all = vec!["-p", prefix.as_str(), "-c", "conf/shard.conf"];
    all.extend_from_slice(args);
    run_cli(&all)
}

const GOOD: &str = "events {}\nhttp {\n    server {\n        listen 127.0.0.1:{port};\n        location / { return 200 \"hi\"; }\n    }\n}\n";

#[test]
fn test_flag_accepts_a_good_config_without_binding() {
    // Hold the port: `-t` must not try to bind it.
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let (code, err) = with_conf("tok", &GOOD.replace("{port}", &port.to_string()), &["-t"]);
    assert_eq!(code, 0, "{err}");
    // The file is named as the error messages name it: by the path that was read.
    let full = format!("{prefix}/conf/shard.conf", prefix = err_prefix(&err));
    assert!(
        err.contains(&format!(
            "shard: the configuration file {full} syntax is ok"
        )),
        "{err}"
    );
    assert!(
        err.contains(&format!(
            "shard: configuration file {full} test is successful"
        )),
        "{err}"
    );
}

#[test]
fn test_flag_with_no_config_checks_the_embedded_default() {
    let dir = temp_dir("tdefault");
    let (code, err) = run_cli(&["-p", dir.to_str().unwrap(), "-t"]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("(embedded default) syntax is ok"), "{err}");
}

/// The prefix directory named in `-t`'s output (the temp dir of the test).
fn err_prefix(err: &str) -> String {
    let i = err.find("file /").expect("an absolute path") + 5;
    let rest = &err[i..];
    rest[..rest.find("/conf/shard.conf").expect("conf/shard.conf")].to_string()
}

/// Runs `-t` on `conf` and returns the `[emerg]` line.
fn emerg(tag: &str, conf: &str) -> String {
    let (code, err) = with_conf(tag, conf, &["-t"]);
    assert_eq!(code, 1, "{err}");
    // The same absolute path in the error and in the last line.
    let last = err.lines().last().unwrap_or("");
    let path = last
        .strip_prefix("shard: configuration file ")
        .and_then(|l| l.strip_suffix(" test failed"))
        .unwrap_or_else(|| panic!("{err}"));
    assert!(
        path.starts_with('/') && path.ends_with("/conf/shard.conf"),
        "{err}"
    );
    err.lines()
        .find(|l| l.starts_with("shard: [emerg] "))
        .unwrap_or_else(|| panic!("no emerg line in {err}"))
        .to_string()
}

#[test]
fn config_errors_have_nginx_shape_and_name_the_place() {
    let cases: Vec<(&str, String, &str, &str)> = vec![
        (
            "unknown",
            "events {}\nhttp {\n    server {\n        lisen 80;\n    }\n}\n".to_string(),
            "unknown directive \"lisen\" in ",
            "conf/shard.conf:4",
        ),
        (
            "notallowed",
            "events {}\nlisten 80;\n".to_string(),
            "\"listen\" directive is not allowed here in ",
            "conf/shard.conf:2",
        ),
        (
            "nargs",
            "events {}\nhttp {\n server {\n  location / {\n   return;\n  }\n }\n}\n".to_string(),
            "invalid number of arguments in \"return\" directive in ",
            "conf/shard.conf:5",
        ),
        (
            "duplistenopts",
            "events {}\nhttp {\n server { listen 127.0.0.1:8080 reuseport; }\n server { listen 127.0.0.1:8080 backlog=10; }\n}\n"
                .to_string(),
            "duplicate listen options for 127.0.0.1:8080 in ",
            "conf/shard.conf:4 (first given in ",
        ),
        (
            "dupdefault",
            "events {}\nhttp {\n server { listen 8081 default_server; }\n server { listen 8081 default_server; }\n}\n".to_string(),
            "a duplicate default server for 0.0.0.0:8081 in ",
            "conf/shard.conf:4",
        ),
        (
            "unclosed",
            "events {}\nhttp {\n server {\n".to_string(),
            "unexpected end of file, expecting \";\" or \"}\" in ",
            "conf/shard.conf:4",
        ),
        (
            "badflag",
            "events { accept_mutex maybe; }\n".to_string(),
            "invalid value \"maybe\" in \"accept_mutex\" directive, it must be \"on\" or \"off\" in ",
            "conf/shard.conf:1",
        ),
    ];
    for (tag, conf, starts, ends) in cases {
        let line = emerg(tag, &conf);
        let msg = line.trim_start_matches("shard: [emerg] ");
        assert!(msg.starts_with(starts), "{tag}: {msg}");
        assert!(msg.contains(ends), "{tag}: {msg}");
    }
}

#[test]
fn identical_listen_options_may_repeat() {
    let conf = "events {}\nhttp {\n server { listen 127.0.0.1:8080 reuseport; server_name a; }\n server { listen 127.0.0.1:8080 reuseport; server_name b; }\n}\n";
    let (code, err) = with_conf("samelisten", conf, &["-t"]);
    assert_eq!(code, 0, "{err}");
}

#[test]
fn dash_g_adds_main_directives_and_its_errors_say_command_line() {
    let port = free_port().to_string();
    let conf = GOOD.replace("{port}", &port);
    let (code, err) = with_conf("g1", &conf, &["-t", "-g", "worker_processes 3;"]);
    assert_eq!(code, 0, "{err}");
    let (code, err) = with_conf("g2", &conf, &["-t", "-g", "lisen 1;"]);
    assert_eq!(code, 1);
    assert!(
        err.contains("unknown directive \"lisen\" in command line"),
        "{err}"
    );
}

#[test]
fn version_and_bad_signal() {
    let (code, err) = run_cli(&["-v"]);
    assert_eq!(code, 0);
    assert!(err.starts_with("shard version: shard/"), "{err}");
    let dir = temp_dir("badsig");
    let (code, err) = run_cli(&["-p", dir.to_str().unwrap(), "-s", "explode"]);
    assert_eq!(code, 1);
    assert!(err.contains("invalid option: \"-s explode\""), "{err}");
}

#[test]
fn a_port_in_use_is_a_clear_startup_error() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let conf = format!(
        "error_log stderr;\n{}",
        GOOD.replace("{port}", &port.to_string())
    );
    let (code, err) = with_conf("inuse", &conf, &[]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains(&format!(
            "bind() to 127.0.0.1:{port} failed (98: Address already in use)"
        )),
        "{err}"
    );
}

/// Every configuration shipped under `conf/examples/` passes `shard -t`, so the examples the
/// docs point at never rot.
#[test]
fn every_example_configuration_passes_the_test_flag() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let dir = root.join("conf/examples");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).expect("conf/examples") {
        let path = entry.expect("entry").path();
        if path.extension().and_then(|e| e.to_str()) != Some("conf") {
            continue;
        }
        let (code, err) = run_cli(&[
            "-p",
            root.to_str().unwrap(),
            "-t",
            "-c",
            path.to_str().unwrap(),
        ]);
        assert_eq!(code, 0, "{}: {err}", path.display());
        seen += 1;
    }
    assert!(seen >= 4, "only {seen} examples found in {}", dir.display());
}

#[test]
fn quiet_test_prints_only_errors_and_capital_v_prints_build_information() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let (code, err) = with_conf(
        "tq",
        &GOOD.replace("{port}", &port.to_string()),
        &["-t", "-q"],
    );
    assert_eq!(code, 0, "{err}");
    assert!(err.trim().is_empty(), "-q printed: {err}");
    let (code, err) = run_cli(&["-V"]);
    assert_eq!(code, 0);
    assert!(err.contains("shard version: shard/"), "{err}");
    assert!(err.contains("default configuration path:"), "{err}");
    // The TLS library line in the form scripts parse (certbot: ` with OpenSSL ([^ ]+) `,
    // nginx's suite: `with openssl ([0-9.]+)`), naming the library it really is.
    assert!(
        err.contains("built with OpenSSL 3.0.0 (compatible; rustls"),
        "{err}"
    );
    // What nginx's test suite and scripts read from `nginx -V`: the modules shard has, the
    // default ones it lacks, and nothing it does not have (HTTP/3).
    for m in [
        "--with-http_v2_module",
        "--with-stream ",
        "--with-http_sub_module",
    ] {
        assert!(err.contains(m), "{m}: {err}");
    }
    // SSI is built in: nginx's suite asks for `ssi` by the absence of this.
    assert!(!err.contains("--without-http_ssi_module"), "{err}");
    // userid, geoip and mirror are built in too.
    assert!(!err.contains("--without-http_userid_module"), "{err}");
    assert!(err.contains("--with-http_geoip_module"), "{err}");
    assert!(!err.contains("--without-http_mirror_module"), "{err}");
    // SCGI and uwsgi are built in.
    assert!(!err.contains("--without-http_scgi_module"), "{err}");
    assert!(!err.contains("--without-http_uwsgi_module"), "{err}");
    assert!(err.contains("TLS SNI support enabled"), "{err}");
    assert!(!err.contains("http_v3"), "{err}");
}

#[test]
fn test_flag_lists_every_error_and_warns_about_tuning_directives() {
    let conf = "events {}\nhttp {\n    tcp_nopush on;\n    server {\n        lisen 80;\n        \
                location / { xslt_stylesheet a.xsl; }\n    }\n}\n";
    let (code, err) = with_conf("allerrs", conf, &["-t"]);
    assert_eq!(code, 1, "{err}");
    let emerg: Vec<&str> = err.lines().filter(|l| l.contains("[emerg]")).collect();
    assert_eq!(emerg.len(), 2, "{err}");
    assert!(
        emerg[0].contains("unknown directive \"lisen\" in /"),
        "{err}"
    );
    assert!(
        emerg[1]
            .contains("\"xslt_stylesheet\" is an nginx directive that shard does not support in /"),
        "{err}"
    );
    // Fixed, the configuration passes with one warning per tuning directive.
    let conf = "events {}\nhttp {\n    tcp_nopush on;\n    server {\n        listen 127.0.0.1:1;\n    }\n}\n";
    let (code, err) = with_conf("warns", conf, &["-t"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("shard: [warn] \"tcp_nopush\" is accepted and has no effect in shard in /"),
        "{err}"
    );
    // As nginx's `-q`: the "syntax is ok" lines go, warnings stay.
    let (code, err) = with_conf("warnsq", conf, &["-t", "-q"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
}

#[test]
fn test_flag_fails_where_start_would_on_a_log_it_cannot_open() {
    let conf =
        "error_log logs/error.log;\nevents {}\nhttp {\n    access_log nodir/sub/a.log;\n    \
                server { listen 127.0.0.1:1; }\n}\n";
    let (code, err) = with_conf("logdir", conf, &["-t"]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("[emerg] open() \"")
            && err.contains("/nodir/sub/a.log\" failed (2: No such file or directory)"),
        "{err}"
    );
}

/// nginx's `-e FILE`: the error log where the configuration's main level names none (so a
/// log that cannot be opened fails `-t`), and nothing where it names one.
#[test]
fn dash_e_names_the_error_log_unless_the_configuration_does() {
    let good = GOOD.replace("{port}", "1");
    let (code, err) = with_conf("dash-e", &good, &["-t", "-e", "nodir/e.log"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("/nodir/e.log\" failed"), "{err}");
    let conf = format!("error_log logs/error.log;\n{good}");
    let (code, err) = with_conf("dash-e-conf", &conf, &["-t", "-e", "nodir/e.log"]);
    assert_eq!(code, 0, "{err}");
    let (code, err) = with_conf("dash-e-stderr", &good, &["-t", "-e", "stderr"]);
    assert_eq!(code, 0, "{err}");
}

/// `-t` says what nginx only finds at run time: a root the workers' user cannot reach.
#[test]
fn test_flag_warns_about_directories_the_workers_cannot_reach() {
    if unsafe { libc::geteuid() } != 0 {
        skipped(
            "test_flag_warns_about_directories_the_workers_cannot_reach",
            "needs root (workers switch user only under a root master)",
        );
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let dir = temp_dir("unreachable");
    let site = dir.join("site");
    std::fs::create_dir_all(site.join("html")).unwrap();
    std::fs::set_permissions(&site, std::fs::Permissions::from_mode(0o700)).unwrap();
    let conf = format!(
        "events {{}}\nhttp {{\n server {{\n  listen 127.0.0.1:1;\n  root {}/html;\n  \
         location /ok {{ root {}/html; }}\n }}\n}}\n",
        site.display(),
        dir.display()
    );
    std::fs::write(dir.join("conf/shard.conf"), &conf).unwrap();
    let prefix = dir.to_str().unwrap().to_string();
    let (code, err) = run_cli(&["-t", "-p", &prefix, "-c", "conf/shard.conf"]);
    assert_eq!(code, 0, "a warning, not an error: {err}");
    let want = format!(
        "[warn] workers run as \"nobody\", which cannot reach \"{}/html\" (\"{}\" does not let them through)",
        site.display(),
        site.display()
    );
    assert!(err.contains(&want), "{want}\n{err}");
    assert_eq!(err.matches("cannot reach").count(), 1, "{err}");
    // Opened up: no warning.
    std::fs::set_permissions(&site, std::fs::Permissions::from_mode(0o755)).unwrap();
    let (_, err) = run_cli(&["-t", "-p", &prefix, "-c", "conf/shard.conf"]);
    assert!(!err.contains("cannot reach"), "{err}");
}
