//! FastCGI (`fastcgi_pass`) against a real PHP-FPM: Debian's `php-fpm`, started by each test
//! with its own configuration and socket, in the foreground, and stopped at the end. Without
//! php-fpm the tests say SKIPPED (`.ci/run` installs it where it can).

mod support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use support::*;

/// The php-fpm binary: `php-fpm` on the PATH or Debian's versioned `/usr/sbin/php-fpmX.Y`.
fn php_fpm() -> Option<PathBuf> {
    if let Ok(out) = Command::new("sh")
        .args(["-c", "command -v php-fpm"])
        .output()
    {
        let p = String::from_utf8_lossy(&out.stdout).trim().to_string();
        if !p.is_empty() {
            return Some(PathBuf::from(p));
        }
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/sbin")
        .ok()?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("php-fpm"))
        })
        .collect();
    found.sort();
    found.pop()
}

/// A running PHP-FPM pool, killed when dropped.
struct Fpm {
    child: Child,
    /// What shard's `fastcgi_pass` names: `unix:/path` or `127.0.0.1:port`.
    pass: String,
    dir: PathBuf,
}

impl Drop for Fpm {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Fpm {
    /// Starts a pool in `dir` listening on a unix socket there (`tcp`: on a loopback port).
    fn start(bin: &Path, dir: &Path, tcp: bool) -> Fpm {
        let listen = if tcp {
            format!("127.0.0.1:{}", free_port())
        } else {
            dir.join("fpm.sock").display().to_string()
        };
        let conf = format!(
            "[global]\npid = {d}/fpm.pid\nerror_log = {d}/fpm.log\ndaemonize = no\n\
             [www]\nlisten = {listen}\nlisten.mode = 0666\npm = static\npm.max_children = 4\n\
             php_admin_value[log_errors] = on\nphp_admin_value[display_errors] = off\n\
             php_admin_value[post_max_size] = 16M\n\
             php_admin_value[max_execution_time] = 30\n",
            d = dir.display()
        );
        std::fs::write(dir.join("fpm.conf"), conf).unwrap();
        let child = Command::new(bin)
            .args(["-F", "-R", "-n", "-y"])
            .arg(dir.join("fpm.conf"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(
                std::fs::File::create(dir.join("fpm.stderr")).unwrap(),
            ))
            .spawn()
            .expect("spawn php-fpm");
        let mut fpm = Fpm {
            child,
            pass: if tcp {
                listen.clone()
            } else {
                format!("unix:{listen}")
            },
            dir: dir.to_path_buf(),
        };
        wait_for(Duration::from_secs(10), "php-fpm listening", || {
            if let Ok(Some(st)) = fpm.child.try_wait() {
                panic!(
                    "php-fpm exited ({st}): {}",
                    std::fs::read_to_string(dir.join("fpm.stderr")).unwrap_or_default()
                        + &std::fs::read_to_string(dir.join("fpm.log")).unwrap_or_default()
                );
            }
            let up = if tcp {
                TcpStream::connect(&listen).is_ok()
            } else {
                std::os::unix::net::UnixStream::connect(&listen).is_ok()
            };
            up.then_some(())
        });
        fpm
    }
}

/// The PHP scripts the tests call, under `dir/html`.
fn write_scripts(dir: &Path) {
    write_file(
        dir,
        "html/info.php",
        b"<?php header('Content-Type: text/plain');\n\
          foreach (['SCRIPT_FILENAME','SCRIPT_NAME','REQUEST_METHOD','QUERY_STRING',\
          'REQUEST_URI','DOCUMENT_URI','PATH_INFO','HTTP_X_TEST','HTTP_COOKIE','SERVER_PROTOCOL',\
          'GATEWAY_INTERFACE','REDIRECT_STATUS','CONTENT_LENGTH','HTTPS','HTTP_IF_MODIFIED_SINCE',\
          'HTTP_IF_NONE_MATCH','HTTP_RANGE'] as $k) {\n\
          echo $k, '=', $_SERVER[$k] ?? '(unset)', \"\\n\"; }\n",
    );
    write_file(
        dir,
        "html/hash.php",
        b"<?php $b = file_get_contents('php://input');\n\
          echo strlen($b), ' ', hash('crc32b', $b);\n",
    );
    write_file(
        dir,
        "html/warn.php",
        b"<?php error_log('boom from php'); echo 'after the warning';\n",
    );
    write_file(
        dir,
        "html/missing.php",
        b"<?php http_response_code(404); echo 'php says not found';\n",
    );
    write_file(
        dir,
        "html/redirect.php",
        b"<?php header('Location: /elsewhere'); \n",
    );
    write_file(dir, "html/slow.php", b"<?php sleep(3); echo 'late';\n");
    write_file(
        dir,
        "html/pid.php",
        b"<?php header('Content-Length: 3'); echo 'pid';\n",
    );
    write_file(dir, "html/404.html", b"the 404 page\n");
}

/// `head` sent as HTTP/1.0 (so the body is not chunked), with `body`; the status, headers
/// and body.
fn ask(addr: std::net::SocketAddr, head: &str, body: &[u8]) -> (u16, String, Vec<u8>) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut req = format!("{head}\r\n").into_bytes();
    if !body.is_empty() {
        req.extend_from_slice(format!("Content-Length: {}\r\n", body.len()).as_bytes());
    }
    req.extend_from_slice(b"\r\n");
    req.extend_from_slice(body);
    s.write_all(&req).unwrap();
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    let end = find(&raw, b"\r\n\r\n").map_or(raw.len(), |i| i + 4);
    let head = String::from_utf8_lossy(&raw[..end]).into_owned();
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (status, head, raw[end..].to_vec())
}

fn conf(pass: &str, extra_http: &str, extra_server: &str) -> String {
    format!(
        "worker_processes 1;\nevents {{}}\nhttp {{\n{extra_http}\n server {{\n  \
         listen 127.0.0.1:{{port}};\n  root {{dir}}/html;\n  index index.php;\n  \
         client_max_body_size 16m;\n  location = /status {{ shard_status; }}\n{extra_server}\n  \
         location ~ [^/]\\.php(/|$) {{\n   fastcgi_split_path_info ^(.+?\\.php)(/.*)$;\n   \
         fastcgi_pass {pass};\n   fastcgi_index index.php;\n   include fastcgi_params;\n   \
         fastcgi_param SCRIPT_FILENAME $document_root$fastcgi_script_name;\n   \
         fastcgi_param PATH_INFO $fastcgi_path_info;\n  }}\n }}\n}}\n"
    )
}

/// Starts shard with `conf` whose `{fpm}` is the pool's address, and the pool (unix or tcp),
/// sharing one directory for the scripts. `None` (SKIPPED) without php-fpm.
fn setup(test: &str, tcp: bool, conf_text: &dyn Fn(&str) -> String) -> Option<(Server, Fpm)> {
    let Some(bin) = php_fpm() else {
        skipped(
            test,
            "php-fpm is not installed (apt-get install php-fpm; .ci/run installs it)",
        );
        return None;
    };
    let fdir = temp_dir(&format!("fpm-{test}")).keep();
    let fpm = Fpm::start(&bin, &fdir, tcp);
    write_scripts(&fdir);
    let text = conf_text(&fpm.pass).replace("{dir}/html", &fdir.join("html").display().to_string());
    let s = Server::start(test, &text, 1);
    Some((s, fpm))
}

#[test]
fn php_through_unix_and_tcp_with_params_and_path_info() {
    for tcp in [false, true] {
        let Some((s, _fpm)) = setup("fastcgi-info", tcp, &|pass| conf(pass, "", "")) else {
            return;
        };
        let (st, head, body) = ask(
            s.addr(),
            "GET /info.php?a=1&b=2 HTTP/1.0\r\nHost: x\r\nX-Test: hello\r\nCookie: a=1\r\nCookie: b=2",
            b"",
        );
        let body = String::from_utf8_lossy(&body).into_owned();
        assert_eq!(st, 200, "{head}{body}\n{}", s.stderr());
        assert!(
            head.to_ascii_lowercase()
                .contains("content-type: text/plain"),
            "{head}"
        );
        assert!(!head.to_ascii_lowercase().contains("\nstatus:"), "{head}");
        for want in [
            "SCRIPT_NAME=/info.php\n",
            "REQUEST_METHOD=GET\n",
            "QUERY_STRING=a=1&b=2\n",
            "REQUEST_URI=/info.php?a=1&b=2\n",
            "DOCUMENT_URI=/info.php\n",
            "PATH_INFO=\n",
            "HTTP_X_TEST=hello\n",
            "HTTP_COOKIE=a=1; b=2\n",
            "SERVER_PROTOCOL=HTTP/1.0\n",
            "GATEWAY_INTERFACE=CGI/1.1\n",
            "REDIRECT_STATUS=200\n",
            "HTTPS=(unset)\n",
        ] {
            assert!(body.contains(want), "tcp={tcp}: {want:?} not in\n{body}");
        }
        assert!(
            body.contains("SCRIPT_FILENAME=/") && body.contains("/html/info.php\n"),
            "{body}"
        );
        // fastcgi_split_path_info: the script and the path after it.
        let (st, _, body) = ask(s.addr(), "GET /info.php/some/path HTTP/1.0\r\nHost: x", b"");
        let body = String::from_utf8_lossy(&body).into_owned();
        assert_eq!(st, 200, "{body}");
        assert!(body.contains("SCRIPT_NAME=/info.php\n"), "{body}");
        assert!(body.contains("PATH_INFO=/some/path\n"), "{body}");
        // HTTP/1.1 without Content-Length from PHP: chunked to the client, kept alive.
        let mut c = TcpStream::connect(s.addr()).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        for _ in 0..2 {
            c.write_all(b"GET /info.php HTTP/1.1\r\nHost: x\r\n\r\n")
                .unwrap();
            let r = read_response(&mut c, false).unwrap();
            assert_eq!(r.status, 200);
            assert!(r.body_str().contains("SCRIPT_NAME=/info.php"));
        }
        // A Location without Status is a 302, passed as the application wrote it (nginx
        // makes only a `proxy_redirect`-rewritten one absolute).
        let (st, head, _) = ask(s.addr(), "GET /redirect.php HTTP/1.0\r\nHost: x", b"");
        assert_eq!(st, 302, "{head}");
        assert!(head.contains("Location: /elsewhere\r\n"), "{head}");
    }
}

/// A location with `fastcgi_cache` asks for whole responses: the client's validators and
/// `Range` do not reach the application (nginx's `params_cache`); with `fastcgi_cache off`
/// they do.
#[test]
fn a_cached_location_does_not_pass_the_clients_validators() {
    let Some((s, _fpm)) = setup("fastcgi-cache-params", false, &|pass| {
        conf(
            pass,
            "fastcgi_cache_path {dir}/fcache keys_zone=fc:1m;\nfastcgi_cache_key $request_uri;",
            "fastcgi_cache fc;\n location = /no/info.php { fastcgi_pass PASS; fastcgi_cache off; \
             include fastcgi_params; fastcgi_param SCRIPT_FILENAME $document_root/info.php; }"
                .replace("PASS", pass)
                .as_str(),
        )
    }) else {
        return;
    };
    let ask_with = |uri: &str| {
        let (st, _, body) = ask(
            s.addr(),
            &format!(
                "GET {uri} HTTP/1.0\r\nHost: x\r\nIf-Modified-Since: blah\r\n\
                 If-None-Match: \"e\"\r\nRange: bytes=0-1"
            ),
            b"",
        );
        assert_eq!(st, 200, "{}", s.stderr());
        String::from_utf8_lossy(&body).into_owned()
    };
    let cached = ask_with("/info.php?1");
    for unset in [
        "HTTP_IF_MODIFIED_SINCE=(unset)\n",
        "HTTP_IF_NONE_MATCH=(unset)\n",
        "HTTP_RANGE=(unset)\n",
    ] {
        assert!(cached.contains(unset), "{unset:?} not in\n{cached}");
    }
    let passed = ask_with("/no/info.php");
    for set in [
        "HTTP_IF_MODIFIED_SINCE=blah\n",
        "HTTP_IF_NONE_MATCH=\"e\"\n",
        "HTTP_RANGE=bytes=0-1\n",
    ] {
        assert!(passed.contains(set), "{set:?} not in\n{passed}");
    }
}

fn crc32(data: &[u8]) -> u32 {
    let mut h = flate2::Crc::new();
    h.update(data);
    h.sum()
}

#[test]
fn a_large_post_body_reaches_php_whole() {
    let Some((s, _fpm)) = setup("fastcgi-post", false, &|pass| conf(pass, "", "")) else {
        return;
    };
    // 5 MB: larger than client_body_buffer_size, so it goes through the body file.
    let body: Vec<u8> = (0..5 * 1024 * 1024u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect();
    let (st, _, got) = ask(
        s.addr(),
        "POST /hash.php HTTP/1.0\r\nHost: x\r\nContent-Type: application/octet-stream",
        &body,
    );
    assert_eq!(st, 200, "{}", s.stderr());
    assert_eq!(
        String::from_utf8_lossy(&got),
        format!("{} {:08x}", body.len(), crc32(&body))
    );
    // A small body goes with the params.
    let (st, _, got) = ask(s.addr(), "POST /hash.php HTTP/1.0\r\nHost: x", b"hello");
    assert_eq!(st, 200);
    assert_eq!(
        String::from_utf8_lossy(&got),
        format!("5 {:08x}", crc32(b"hello"))
    );
}

#[test]
fn php_stderr_is_in_the_error_log_and_errors_can_be_intercepted() {
    let Some((s, _fpm)) = setup("fastcgi-stderr", false, &|pass| {
        conf(
            pass,
            "",
            &format!(
                "  error_page 404 /404.html;\n  fastcgi_intercept_errors on;\n  \
                 location ^~ /var/ {{\n   set $sock {pass};\n   \
                 include fastcgi_params;\n   fastcgi_param SCRIPT_FILENAME {{dir}}/html/warn.php;\n   \
                 fastcgi_pass $sock;\n  }}"
            ),
        )
    }) else {
        return;
    };
    let (st, _, body) = ask(s.addr(), "GET /warn.php HTTP/1.0\r\nHost: x", b"");
    assert_eq!((st, body.as_slice()), (200, &b"after the warning"[..]));
    let log = wait_for(Duration::from_secs(5), "the stderr line", || {
        let log = error_log(&s);
        log.contains("FastCGI sent in stderr").then_some(log)
    });
    assert!(
        log.contains("[error]")
            && log.contains("FastCGI sent in stderr: \"PHP message: boom from php\"")
            && log.contains("upstream: \"fastcgi://unix:")
            && log.contains("request: \"GET /warn.php HTTP/1.0\""),
        "{log}"
    );
    // fastcgi_pass with a variable naming the same socket.
    let (st, _, body) = ask(s.addr(), "GET /var/warn.php HTTP/1.0\r\nHost: x", b"");
    assert_eq!(
        (st, body.as_slice()),
        (200, &b"after the warning"[..]),
        "{}",
        s.stderr()
    );
    // fastcgi_intercept_errors on + error_page 404: the page replaces PHP's answer.
    let (st, _, body) = ask(s.addr(), "GET /missing.php HTTP/1.0\r\nHost: x", b"");
    assert_eq!(
        (st, String::from_utf8_lossy(&body).as_ref()),
        (404, "the 404 page\n")
    );
}

/// A relay between shard and the pool that counts the connections shard opens.
fn counting_relay(to: String) -> (u16, Arc<AtomicUsize>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let n = Arc::new(AtomicUsize::new(0));
    let count = n.clone();
    std::thread::spawn(move || {
        for c in l.incoming() {
            let Ok(c) = c else { return };
            count.fetch_add(1, Ordering::SeqCst);
            let Ok(u) = TcpStream::connect(&to) else {
                return;
            };
            let (mut c2, mut u2) = (c.try_clone().unwrap(), u.try_clone().unwrap());
            let (mut c, mut u) = (c, u);
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut c2, &mut u2);
                let _ = u2.shutdown(std::net::Shutdown::Write);
            });
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut u, &mut c);
                let _ = c.shutdown(std::net::Shutdown::Write);
            });
        }
    });
    (port, n)
}

#[test]
fn keepalive_with_keep_conn_uses_one_connection() {
    let Some(bin) = php_fpm() else {
        skipped(
            "keepalive_with_keep_conn_uses_one_connection",
            "php-fpm is not installed (apt-get install php-fpm; .ci/run installs it)",
        );
        return;
    };
    let fdir = temp_dir("fpm-keep").keep();
    let fpm = Fpm::start(&bin, &fdir, true);
    write_scripts(&fdir);
    for (keep_conn, want_max) in [(true, 1usize), (false, 100)] {
        let (port, opened) = counting_relay(fpm.pass.clone());
        let text = conf(
            "php",
            &format!("upstream php {{ server 127.0.0.1:{port}; keepalive 4; }}"),
            "",
        )
        .replace("{dir}/html", &fdir.join("html").display().to_string())
        .replace(
            "fastcgi_index index.php;",
            &format!(
                "fastcgi_index index.php; fastcgi_keep_conn {};",
                if keep_conn { "on" } else { "off" }
            ),
        );
        let s = Server::start("fastcgi-keep", &text, 1);
        let mut c = TcpStream::connect(s.addr()).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        for path in ["/info.php", "/pid.php"] {
            for _ in 0..50 {
                write!(c, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
                let r = read_response(&mut c, false).unwrap();
                assert_eq!(r.status, 200, "{}", s.stderr());
            }
        }
        let n = opened.load(Ordering::SeqCst);
        if keep_conn {
            assert_eq!(n, want_max, "100 requests over keep_conn connections");
        } else {
            assert_eq!(
                n, want_max,
                "without keep_conn the pool closes each connection"
            );
        }
    }
    drop(fpm);
    let _ = fdir;
}

#[test]
fn a_stopped_pool_is_502_and_a_slow_one_504() {
    let Some((s, mut fpm)) = setup("fastcgi-fail", false, &|pass| {
        conf(pass, "", "  fastcgi_read_timeout 1s;")
    }) else {
        return;
    };
    let (st, _, body) = ask(s.addr(), "GET /slow.php HTTP/1.0\r\nHost: x", b"");
    assert_eq!(st, 504, "{}", String::from_utf8_lossy(&body));
    let log = wait_for(Duration::from_secs(5), "the timeout line", || {
        let log = error_log(&s);
        log.contains("upstream timed out").then_some(log)
    });
    assert!(log.contains("fastcgi://unix:"), "{log}");
    let _ = fpm.child.kill();
    let _ = fpm.child.wait();
    let _ = std::fs::remove_file(fpm.dir.join("fpm.sock"));
    let (st, _, _) = ask(s.addr(), "GET /info.php HTTP/1.0\r\nHost: x", b"");
    assert_eq!(st, 502);
}

#[test]
fn fastcgi_directives_are_checked_as_nginx_checks_them() {
    let dir = temp_dir("fastcgi-t");
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
    // Debian's snippets/fastcgi-php.conf, with the bundled fastcgi.conf.
    let (code, err) = t("  location ~ \\.php$ {\n   fastcgi_split_path_info ^(.+?\\.php)(/.*)$;\n   \
         try_files $fastcgi_script_name =404;\n   set $path_info $fastcgi_path_info;\n   \
         fastcgi_param PATH_INFO $path_info;\n   fastcgi_index index.php;\n   include fastcgi.conf;\n   \
         fastcgi_pass unix:/run/php/php8.2-fpm.sock;\n  }");
    assert_eq!(code, 0, "{err}");
    let (code, err) =
        t("  location / { fastcgi_pass 127.0.0.1:9000; proxy_pass http://127.0.0.1:1; }");
    assert_eq!(code, 1);
    assert!(err.contains("is duplicate"), "{err}");
    let (code, err) = t("  location / { fastcgi_pass http://127.0.0.1:9000; }");
    assert_eq!(code, 1);
    assert!(err.contains("invalid URL prefix"), "{err}");
    let (code, err) = t("  fastcgi_param A b c;");
    assert_eq!(code, 1);
    assert!(err.contains("invalid parameter \"c\""), "{err}");
}

/// The same FastCGI configuration under nginx (where installed) and shard, the same pool and
/// requests: the same statuses, `Location`s and bodies.
#[test]
fn differential_against_nginx() {
    let Some(nginx) = nginx_binary() else {
        skipped(
            "fastcgi differential_against_nginx",
            "nginx is not installed (apt-get install nginx-light)",
        );
        return;
    };
    let Some(bin) = php_fpm() else {
        skipped(
            "fastcgi differential_against_nginx",
            "php-fpm is not installed (apt-get install php-fpm; .ci/run installs it)",
        );
        return;
    };
    let fdir = temp_dir("fpm-diff").keep();
    let fpm = Fpm::start(&bin, &fdir, false);
    write_scripts(&fdir);
    let html = fdir.join("html").display().to_string();
    // The same server block for both (nginx reads shard's conf/fastcgi_params copy).
    let server = |port: u16| {
        format!(
            " server {{\n  listen 127.0.0.1:{port};\n  root {html};\n  error_page 404 /404.html;\n  \
             location ~ [^/]\\.php(/|$) {{\n   fastcgi_split_path_info ^(.+?\\.php)(/.*)$;\n   \
             fastcgi_pass {};\n   fastcgi_index index.php;\n   include fastcgi_params;\n   \
             fastcgi_param SCRIPT_FILENAME $document_root$fastcgi_script_name;\n   \
             fastcgi_param PATH_INFO $fastcgi_path_info;\n  }}\n  \
             location /intercept/ {{\n   fastcgi_intercept_errors on;\n   include fastcgi_params;\n   \
             fastcgi_param SCRIPT_FILENAME {html}/missing.php;\n   fastcgi_pass {};\n  }}\n }}\n",
            fpm.pass, fpm.pass
        )
    };
    let shard_conf = format!(
        "worker_processes 1;\nevents {{}}\nhttp {{\n server {{ listen 127.0.0.1:{{port}}; location = /status {{ shard_status; }} }}\n{}}}\n",
        server(0).replace("127.0.0.1:0", "127.0.0.1:{port1}")
    );
    let s = Server::start_ports("fastcgi-diff", &shard_conf, 1, 1);
    let ndir = temp_dir("fastcgi-diff-nginx");
    let params = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../conf/fastcgi_params"),
    )
    .unwrap();
    std::fs::write(ndir.join("fastcgi_params"), params).unwrap();
    let nport = free_port();
    let nconf = format!(
        "worker_processes 1;\ndaemon off;\npid {d}/nginx.pid;\nevents {{}}\nhttp {{\n \
         access_log off;\n client_body_temp_path {d}/body;\n fastcgi_temp_path {d}/fcgi;\n{}}}\n",
        server(nport),
        d = ndir.display()
    );
    let _n = start_nginx(nginx, &ndir, &nconf, nport);
    let requests: [(&str, &[u8]); 7] = [
        // One Cookie line: nginx 1.23.0 joins repeated ones as shard does, 1.22 passes the last.
        (
            "GET /info.php?a=1&b=2 HTTP/1.0\r\nHost: x\r\nX-Test: t\r\nCookie: a=1",
            b"",
        ),
        ("GET /info.php/p/q HTTP/1.0\r\nHost: x", b""),
        (
            "POST /hash.php HTTP/1.0\r\nHost: x\r\nContent-Type: text/plain",
            b"hello world",
        ),
        ("GET /redirect.php HTTP/1.0\r\nHost: x", b""),
        ("GET /missing.php HTTP/1.0\r\nHost: x", b""),
        ("GET /intercept/x HTTP/1.0\r\nHost: x", b""),
        ("HEAD /info.php HTTP/1.0\r\nHost: x", b""),
    ];
    let norm = |(st, head, body): (u16, String, Vec<u8>), port: u16| {
        let location = head
            .lines()
            .find(|l| l.to_ascii_lowercase().starts_with("location:"))
            .map(|l| l.replace(&format!(":{port}"), ":PORT"));
        (st, location, String::from_utf8_lossy(&body).into_owned())
    };
    let mut differences = Vec::new();
    let shard_addr = SocketAddr::from(([127, 0, 0, 1], s.ports[0]));
    let nginx_addr = SocketAddr::from(([127, 0, 0, 1], nport));
    for (head, body) in requests {
        let want = norm(ask(nginx_addr, head, body), nport);
        let got = norm(ask(shard_addr, head, body), s.ports[0]);
        if want != got {
            differences.push(format!("{head:?}\n  nginx: {want:?}\n  shard: {got:?}"));
        }
    }
    assert!(differences.is_empty(), "{}", differences.join("\n"));
    drop(fpm);
}

/// A FastCGI application on a free port that answers every request with `stdout` in one
/// `STDOUT` record, the end of stdout and `END_REQUEST`, counting requests.
fn raw_fastcgi_app(stdout: &'static [u8]) -> (u16, Arc<AtomicUsize>) {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let count = Arc::new(AtomicUsize::new(0));
    let seen = count.clone();
    std::thread::spawn(move || {
        for c in l.incoming() {
            let Ok(mut c) = c else { return };
            seen.fetch_add(1, Ordering::SeqCst);
            c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            // Read records until the empty STDIN that ends the request.
            let mut buf = Vec::new();
            let mut chunk = [0u8; 4096];
            'read: loop {
                let mut at = 0;
                while buf.len() >= at + 8 {
                    let len = u16::from_be_bytes([buf[at + 4], buf[at + 5]]) as usize;
                    let (kind, pad) = (buf[at + 1], buf[at + 6] as usize);
                    if kind == 5 && len == 0 {
                        break 'read;
                    }
                    at += 8 + len + pad;
                }
                match c.read(&mut chunk) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            }
            let record = |kind: u8, content: &[u8]| {
                let mut r = vec![1, kind, 0, 1];
                r.extend_from_slice(&(content.len() as u16).to_be_bytes());
                r.extend_from_slice(&[0, 0]);
                r.extend_from_slice(content);
                r
            };
            let mut out = record(6, stdout);
            out.extend(record(6, b""));
            out.extend(record(3, &[0; 8]));
            let _ = c.write_all(&out);
        }
    });
    (port, count)
}

/// nginx's fastcgi_split.t: records that end before the head does are an invalid header,
/// so `fastcgi_next_upstream invalid_header` tries the next server.
#[test]
fn stdout_that_ends_inside_the_head_is_an_invalid_header() {
    let (bad, bad_n) = raw_fastcgi_app(b"BAD");
    let (good, good_n) = raw_fastcgi_app(b"Good: header\r\n\r\n");
    let conf = format!(
        "worker_processes 1;\nerror_log logs/error.log info;\nevents {{}}\nhttp {{\n\
         upstream u {{ server 127.0.0.1:{bad}; server 127.0.0.1:{good}; }}\n\
         server {{ listen 127.0.0.1:{{port}}; location = /status {{ shard_status; }}\n\
         location / {{ fastcgi_pass u; fastcgi_next_upstream invalid_header; }}\n\
         location /one/ {{ fastcgi_pass 127.0.0.1:{bad}; }} }} }}\n"
    );
    let s = Server::start("fastcgi-split", &conf, 1);
    // Round robin starts anywhere: ask twice, so one request meets the bad server first.
    for _ in 0..2 {
        let (st, head, _) = ask(s.addr(), "GET / HTTP/1.0\r\nHost: x", b"");
        assert_eq!(st, 200, "{head}");
        assert!(head.contains("\r\nGood: header\r\n"), "{head}");
    }
    assert!(bad_n.load(Ordering::SeqCst) >= 1 && good_n.load(Ordering::SeqCst) == 2);
    let (st, _, _) = ask(s.addr(), "GET /one/ HTTP/1.0\r\nHost: x", b"");
    assert_eq!(st, 502);
    wait_for(Duration::from_secs(10), "the log line", || {
        error_log(&s)
            .contains("upstream prematurely closed FastCGI stdout")
            .then_some(())
    });
}

/// Reads FastCGI records from `c` until `want` is true of the `STDIN` content gathered (or
/// the stream ends); the content and whether the empty `STDIN` record came.
fn read_stdin(
    c: &mut TcpStream,
    buf: &mut Vec<u8>,
    want: impl Fn(&[u8], bool) -> bool,
) -> (Vec<u8>, bool) {
    let mut chunk = [0u8; 4096];
    loop {
        let (mut at, mut stdin, mut ended) = (0, Vec::new(), false);
        while buf.len() >= at + 8 {
            let len = u16::from_be_bytes([buf[at + 4], buf[at + 5]]) as usize;
            let (kind, pad) = (buf[at + 1], buf[at + 6] as usize);
            if buf.len() < at + 8 + len + pad {
                break;
            }
            if kind == 5 {
                stdin.extend_from_slice(&buf[at + 8..at + 8 + len]);
                ended |= len == 0;
            }
            at += 8 + len + pad;
        }
        if want(&stdin, ended) {
            return (stdin, ended);
        }
        match c.read(&mut chunk) {
            Ok(0) | Err(_) => return (stdin, ended),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// `fastcgi_request_buffering off`: the application gets the params and what the client
/// sent at once, the rest as it arrives (lengths and chunked bodies alike), and the
/// response comes back (nginx's fastcgi_request_buffering*.t).
#[test]
fn fastcgi_request_buffering_off_streams_the_body() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let app = l.local_addr().unwrap().port();
    let conf = format!(
        "worker_processes 1;\nevents {{}}\nhttp {{\n\
         server {{ listen 127.0.0.1:{{port}}; location = /status {{ shard_status; }}\n\
         location / {{ fastcgi_pass 127.0.0.1:{app}; fastcgi_request_buffering off;\n\
         fastcgi_param CONTENT_LENGTH $content_length; }} }} }}\n"
    );
    let s = Server::start("fastcgi-unbuffered", &conf, 1);
    for (head, first, rest) in [
        ("Content-Length: 10", &b"01234"[..], &b"56789"[..]),
        (
            "Transfer-Encoding: chunked",
            &b"5\r\n01234\r\n"[..],
            &b"5\r\n56789\r\n0\r\n\r\n"[..],
        ),
    ] {
        let mut client = TcpStream::connect(s.addr()).unwrap();
        client
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut req = format!("POST /x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{head}\r\n\r\n")
            .into_bytes();
        req.extend_from_slice(first);
        client.write_all(&req).unwrap();
        let (mut up, _) = l.accept().unwrap();
        up.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut buf = Vec::new();
        // The first part arrives before the client sends the rest.
        let (got, ended) = read_stdin(&mut up, &mut buf, |b, _| b.len() >= 5);
        assert_eq!((&got[..], ended), (&b"01234"[..], false), "{head}");
        client.write_all(rest).unwrap();
        let (got, ended) = read_stdin(&mut up, &mut buf, |_, e| e);
        assert_eq!((&got[..], ended), (&b"0123456789"[..], true), "{head}");
        let record = |kind: u8, content: &[u8]| {
            let mut r = vec![1, kind, 0, 1];
            r.extend_from_slice(&(content.len() as u16).to_be_bytes());
            r.extend_from_slice(&[0, 0]);
            r.extend_from_slice(content);
            r
        };
        let mut out = record(6, b"Content-Type: text/plain\r\n\r\ngot it");
        out.extend(record(6, b""));
        out.extend(record(3, &[0; 8]));
        up.write_all(&out).unwrap();
        drop(up);
        let r = read_response(&mut client, false).unwrap();
        assert_eq!(
            (r.status, r.body_str()),
            (200, "got it".to_string()),
            "{head}"
        );
    }
}
