//! Real-world-shaped nginx configurations (issue 12) under `tests/corpus/`: Debian's stock
//! layout, h5bp's include tree, a reverse proxy in front of an application, a static SPA and
//! an API gateway with limits. Each must pass `shard -t` as written (only `{dir}` and the
//! ports are filled in), then serve nginx's answers; where nginx is installed, the same
//! requests go through nginx with the same files and the answers are compared.

mod support;

use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use support::*;

const BIN: &str = env!("CARGO_BIN_EXE_shard");

/// Copies `tests/corpus/NAME` into `dir`, filling in `{dir}`, `{port}` and `{port1}`.
fn copy_tree(from: &Path, to: &Path, dir: &Path, ports: [u16; 2]) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dst = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_tree(&e.path(), &dst, dir, ports);
        } else {
            let text = std::fs::read_to_string(e.path()).unwrap();
            let text = text
                .replace("{dir}", dir.to_str().unwrap())
                .replace("{port1}", &ports[1].to_string())
                .replace("{port}", &ports[0].to_string());
            std::fs::write(dst, text).unwrap();
        }
    }
}

/// A prefix holding the corpus configuration `name` and the site's files.
fn prepare(name: &str, tag: &str, ports: [u16; 2], site: &dyn Fn(&Path)) -> TempDir {
    let dir = temp_dir(tag);
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/corpus")
        .join(name);
    copy_tree(&src, &dir, &dir, ports);
    keep_user_line_only_if_it_exists(&dir.join("nginx.conf"));
    site(&dir);
    dir
}

/// The corpus names Debian's users (`www-data`, `nogroup`). On a machine without them, a root
/// test run would fail `-t` on the machine, not on shard: the `user` line is then dropped
/// (shard's default, `nobody`, applies) and the test says so.
fn keep_user_line_only_if_it_exists(conf: &Path) {
    let text = std::fs::read_to_string(conf).unwrap();
    let Some(line) = text.lines().find(|l| l.trim_start().starts_with("user ")) else {
        return;
    };
    let names: Vec<&str> = line
        .trim()
        .trim_start_matches("user")
        .trim_end_matches(';')
        .split_whitespace()
        .collect();
    let cstr = |n: &str| std::ffi::CString::new(n).unwrap();
    // SAFETY: getpwnam/getgrnam with valid C strings; only the null-ness is read.
    let user_ok = unsafe { !libc::getpwnam(cstr(names[0]).as_ptr()).is_null() };
    let group = names.get(1).copied().unwrap_or(names[0]);
    let group_ok = unsafe { !libc::getgrnam(cstr(group).as_ptr()).is_null() };
    if !(user_ok && group_ok) {
        eprintln!(
            "NOTE: this machine has no user/group \"{}\": the corpus runs without its `user` line",
            names.join(" ")
        );
        std::fs::write(conf, text.replace(line, "")).unwrap();
    }
}

struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        // SAFETY: plain kill(2) on our child.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
        let _ = self.0.wait();
    }
}

fn shard_test(dir: &Path) -> (i32, String) {
    let out = Command::new(BIN)
        .arg("-t")
        .arg("-p")
        .arg(dir)
        .arg("-c")
        .arg(dir.join("nginx.conf"))
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn start_shard(dir: &Path, port: u16) -> Running {
    let child = Command::new(BIN)
        .args(["-g", "daemon off;"])
        .arg("-p")
        .arg(dir)
        .arg("-c")
        .arg(dir.join("nginx.conf"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(
            std::fs::File::create(dir.join("logs/stderr.log")).unwrap(),
        ))
        .spawn()
        .unwrap();
    let mut r = Running(child);
    wait_for(Duration::from_secs(10), "shard listening", || {
        if let Ok(Some(st)) = r.0.try_wait() {
            panic!(
                "shard exited ({st}): {}",
                std::fs::read_to_string(dir.join("logs/stderr.log")).unwrap_or_default()
            );
        }
        TcpStream::connect(("127.0.0.1", port)).ok()
    });
    r
}

/// Status, headers, and the body of `head` (plus `Connection: close`).
fn ask(port: u16, head: &str) -> (u16, Vec<(String, String)>, String) {
    let (status, hs, body) = exchange(([127, 0, 0, 1], port).into(), head);
    (status, hs, String::from_utf8_lossy(&body).into_owned())
}

fn header<'a>(hs: &'a [(String, String)], name: &str) -> Option<&'a str> {
    hs.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
}

/// One corpus configuration: its site, the requests, and what shard must answer.
struct Case {
    name: &'static str,
    site: fn(&Path),
    /// Requests compared with nginx (when installed), and checked by `check`.
    requests: &'static [&'static str],
    check: fn(u16, &Path),
}

fn run_case(c: &Case) {
    let ports = [free_port(), free_port()];
    let dir = prepare(c.name, &format!("corpus-{}", c.name), ports, &c.site);
    let (code, err) = shard_test(&dir);
    assert_eq!(code, 0, "shard -t on the {} corpus: {err}", c.name);
    let shard = start_shard(&dir, ports[0]);
    (c.check)(ports[0], &dir);
    let Some(nginx) = nginx_binary() else {
        skipped(
            &format!("corpus {}: comparison with nginx", c.name),
            "nginx is not installed (apt-get install nginx-light)",
        );
        return;
    };
    let nports = [free_port(), free_port()];
    let ndir = prepare(c.name, &format!("corpus-{}-nginx", c.name), nports, &c.site);
    let types = std::fs::read("/etc/nginx/mime.types")
        .unwrap_or_else(|_| shard_config::MIME_TYPES.as_bytes().to_vec());
    std::fs::write(ndir.join("mime.types"), types).unwrap();
    let conf = std::fs::read_to_string(ndir.join("nginx.conf")).unwrap();
    let _n = start_nginx(nginx, &ndir, &format!("daemon off;\n{conf}"), nports[0]);
    let mut differences = Vec::new();
    for r in c.requests {
        let norm = |(st, hs, body): (u16, Vec<(String, String)>, String), p: [u16; 2]| {
            let fix = |s: &str| {
                s.replace(&format!(":{}", p[0]), ":PORT")
                    .replace(&format!(":{}", p[1]), ":PORT1")
                    .replace(
                        "<hr><center>nginx/1.22.1</center>",
                        "<hr><center>S</center>",
                    )
                    .replace("<hr><center>nginx</center>", "<hr><center>S</center>")
                    .replace("<hr><center>shard</center>", "<hr><center>S</center>")
            };
            let keep = [
                "location",
                "content-type",
                "cache-control",
                "x-frame-options",
            ];
            let hs: Vec<(String, String)> = hs
                .into_iter()
                .filter(|(k, _)| keep.contains(&k.as_str()))
                .map(|(k, v)| (k, fix(&v)))
                .collect();
            (st, hs, fix(&body))
        };
        let want = norm(ask(nports[0], r), nports);
        let got = norm(ask(ports[0], r), ports);
        if want != got {
            differences.push(format!("{r:?}\n  nginx: {want:?}\n  shard: {got:?}"));
        }
    }
    drop(shard);
    eprintln!(
        "corpus {}: {} requests compared with nginx, {} differences",
        c.name,
        c.requests.len(),
        differences.len()
    );
    assert!(differences.is_empty(), "{}", differences.join("\n"));
}

fn debian_site(d: &Path) {
    write_file(
        d,
        "www/html/index.nginx-debian.html",
        b"<h1>Welcome to nginx!</h1>",
    );
    write_file(d, "www/html/.htaccess", b"secret");
    write_file(d, "www/html/50x.html", b"oops\n");
    write_file(d, "www/example/index.html", b"example home");
    write_file(d, "www/example/404.html", b"example 404\n");
    write_file(d, "www/example/.env", b"SECRET=1");
    write_file(d, "www/example/blog/post.html", b"a post");
}

fn debian_check(p: u16, _: &Path) {
    let (st, _, body) = ask(p, "GET / HTTP/1.1\r\nHost: unknown.test");
    assert_eq!((st, body.as_str()), (200, "<h1>Welcome to nginx!</h1>"));
    assert_eq!(ask(p, "GET /nope HTTP/1.1\r\nHost: x").0, 404);
    assert_eq!(ask(p, "GET /.htaccess HTTP/1.1\r\nHost: x").0, 403);
    let (st, hs, _) = ask(p, "GET /a?b=1 HTTP/1.1\r\nHost: www.example.org");
    assert_eq!(st, 301);
    assert_eq!(header(&hs, "location"), Some("http://example.org/a?b=1"));
    let (st, hs, body) = ask(p, "GET /some/route HTTP/1.1\r\nHost: example.org");
    assert_eq!((st, body.as_str()), (200, "example home"));
    assert_eq!(header(&hs, "x-frame-options"), Some("SAMEORIGIN"));
    assert_eq!(ask(p, "GET /.env HTTP/1.1\r\nHost: example.org").0, 403);
    let (st, hs, _) = ask(p, "GET /old-blog/post.html HTTP/1.1\r\nHost: example.org");
    assert_eq!(st, 301);
    assert!(header(&hs, "location")
        .unwrap()
        .ends_with("/blog/post.html"));
}

fn h5bp_site(d: &Path) {
    write_file(
        d,
        "public/index.html",
        b"<!doctype html><title>h5bp</title>",
    );
    write_file(d, "public/404.html", b"h5bp 404\n");
    write_file(d, "public/css/site.css", b"body{color:red}");
    write_file(d, "public/.well-known/security.txt", b"Contact: x");
    write_file(d, "public/.git/config", b"[core]");
    write_file(d, "public/backup.sql", b"dump");
}

fn h5bp_check(p: u16, dir: &Path) {
    // The default server answers unknown hosts with a closed connection (444).
    assert_eq!(ask(p, "GET / HTTP/1.1\r\nHost: unknown.test").0, 0);
    let (st, hs, _) = ask(p, "GET /x HTTP/1.1\r\nHost: www.example.com");
    assert_eq!(st, 301);
    assert_eq!(header(&hs, "location"), Some("http://example.com/x"));
    let (st, hs, body) = ask(p, "GET / HTTP/1.1\r\nHost: example.com");
    assert_eq!(
        (st, body.as_str()),
        (200, "<!doctype html><title>h5bp</title>")
    );
    assert_eq!(
        header(&hs, "content-type"),
        Some("text/html; charset=utf-8")
    );
    assert_eq!(header(&hs, "x-content-type-options"), Some("nosniff"));
    assert_eq!(
        header(&hs, "referrer-policy"),
        Some("strict-origin-when-cross-origin")
    );
    assert_eq!(
        header(&hs, "cache-control"),
        Some("max-age=0"),
        "expires $expires: 0"
    );
    assert_eq!(header(&hs, "server"), Some("shard"), "server_tokens off");
    let (st, hs, _) = ask(p, "GET /css/site.css HTTP/1.1\r\nHost: example.com");
    assert_eq!(st, 200);
    assert_eq!(header(&hs, "cache-control"), Some("max-age=31536000"));
    assert_eq!(header(&hs, "content-type"), Some("text/css; charset=utf-8"));
    assert_eq!(
        ask(
            p,
            "GET /.well-known/security.txt HTTP/1.1\r\nHost: example.com"
        )
        .0,
        200
    );
    assert_eq!(
        ask(p, "GET /.git/config HTTP/1.1\r\nHost: example.com").0,
        403
    );
    assert_eq!(
        ask(p, "GET /backup.sql HTTP/1.1\r\nHost: example.com").0,
        403
    );
    let (st, _, body) = ask(p, "GET /missing HTTP/1.1\r\nHost: example.com");
    assert_eq!((st, body.as_str()), (404, "h5bp 404\n"));
    // The disabled `.default.conf` was not read.
    let log = std::fs::read_to_string(dir.join("logs/stderr.log")).unwrap_or_default();
    assert!(!log.contains("disabled.example"), "{log}");
}

fn proxy_site(d: &Path) {
    write_file(d, "static/robots.txt", b"User-agent: *\n");
    write_file(d, "static/500.html", b"app is down\n");
}

fn proxy_check(p: u16, _: &Path) {
    let (st, _, body) = ask(p, "GET /robots.txt HTTP/1.1\r\nHost: example.com");
    assert_eq!((st, body.as_str()), (200, "User-agent: *\n"));
    let (st, _, body) = ask(
        p,
        "GET /app/x?y=1 HTTP/1.1\r\nHost: example.com:8080\r\nX-Request-Id: ignored",
    );
    assert_eq!(st, 200);
    assert!(
        body.starts_with("app saw /app/x?y=1 host=example.com:8080 proto=http id="),
        "{body}"
    );
    let id = body.rsplit("id=").next().unwrap();
    assert_eq!(id.len(), 32, "$request_id: {id}");
    // The application's own 502 passes through (no proxy_intercept_errors), as in nginx.
    let (st, _, body) = ask(p, "GET /boom HTTP/1.1\r\nHost: example.com");
    assert_eq!(st, 502);
    assert!(body.contains("502 Bad Gateway"), "{body}");
}

fn spa_site(d: &Path) {
    write_file(d, "dist/index.html", b"<div id=app></div>");
    let css: String = (0..100)
        .map(|i| format!(".c{i}{{margin:{i}px}}\n"))
        .collect();
    write_file(d, "dist/assets/app.css", css.as_bytes());
}

fn spa_check(p: u16, _: &Path) {
    let (st, hs, body) = ask(p, "GET /users/42 HTTP/1.1\r\nHost: spa");
    assert_eq!((st, body.as_str()), (200, "<div id=app></div>"));
    assert_eq!(header(&hs, "cache-control"), Some("no-cache"));
    let (st, hs, _) = ask(
        p,
        "GET /assets/app.css HTTP/1.1\r\nHost: spa\r\nAccept-Encoding: gzip",
    );
    assert_eq!(st, 200);
    assert_eq!(header(&hs, "content-encoding"), Some("gzip"));
    let cc: Vec<&str> = hs
        .iter()
        .filter(|(k, _)| k == "cache-control")
        .map(|(_, v)| v.as_str())
        .collect();
    assert_eq!(
        cc,
        ["max-age=31536000", "public, immutable"],
        "expires, then add_header"
    );
    assert_eq!(
        ask(p, "GET /assets/missing.js HTTP/1.1\r\nHost: spa").0,
        404
    );
    assert_eq!(ask(p, "GET /healthz HTTP/1.1\r\nHost: spa").2, "ok\n");
}

fn api_site(_: &Path) {}

fn api_check(p: u16, dir: &Path) {
    let (st, _, body) = ask(
        p,
        "GET /v1/items HTTP/1.1\r\nHost: api.example.com\r\nX-Forwarded-For: 198.51.100.4",
    );
    assert_eq!(st, 200);
    assert_eq!(body, r#"{"path":"/v1/items","real":"198.51.100.4"}"#);
    assert_eq!(
        ask(
            p,
            "GET /admin/x HTTP/1.1\r\nHost: api.example.com\r\nX-Forwarded-For: 198.51.100.4"
        )
        .0,
        403
    );
    assert_eq!(
        ask(
            p,
            "GET /admin/x HTTP/1.1\r\nHost: api.example.com\r\nX-Forwarded-For: 10.1.2.3"
        )
        .0,
        200
    );
    let (st, _, body) = ask(p, "GET /nothing HTTP/1.1\r\nHost: api.example.com");
    assert_eq!((st, body.as_str()), (404, r#"{"error":"not found"}"#));
    // A burst from one client: 30 r/m with burst=3 nodelay lets 4 through, then 429 (another
    // would pass only after two seconds).
    let codes: Vec<u16> = (0..6)
        .map(|_| {
            ask(
                p,
                "GET /v1/b HTTP/1.1\r\nHost: api.example.com\r\nX-Forwarded-For: 203.0.113.9",
            )
            .0
        })
        .collect();
    assert_eq!(&codes[..4], &[200, 200, 200, 200], "{codes:?}");
    assert_eq!(&codes[4..], &[429, 429], "{codes:?}");
    let log = dir.join("logs/api.log");
    let line = wait_for(Duration::from_secs(5), "the JSON access log", || {
        std::fs::read_to_string(&log).ok().and_then(|t| {
            t.lines()
                .find(|l| l.contains("198.51.100.4") && l.contains("/v1/items"))
                .map(str::to_string)
        })
    });
    assert!(
        line.starts_with(
            r#"{"ip":"198.51.100.4","req":"GET /v1/items HTTP/1.1","status":200,"rt":"#
        ),
        "{line}"
    );
}

#[test]
fn debian_stock_layout() {
    run_case(&Case {
        name: "debian",
        site: debian_site,
        requests: &[
            "GET / HTTP/1.1\r\nHost: unknown.test",
            "GET /nope HTTP/1.1\r\nHost: x",
            "GET /.htaccess HTTP/1.1\r\nHost: x",
            "GET /a?b=1 HTTP/1.1\r\nHost: www.example.org",
            "GET /some/route HTTP/1.1\r\nHost: example.org",
            "GET /.env HTTP/1.1\r\nHost: example.org",
            "GET /old-blog/post.html HTTP/1.1\r\nHost: example.org",
            "GET /blog/missing HTTP/1.1\r\nHost: example.org",
        ],
        check: debian_check,
    });
}

#[test]
fn h5bp_include_tree() {
    run_case(&Case {
        name: "h5bp",
        site: h5bp_site,
        requests: &[
            "GET / HTTP/1.1\r\nHost: unknown.test",
            "GET /x HTTP/1.1\r\nHost: www.example.com",
            "GET / HTTP/1.1\r\nHost: example.com",
            "GET /css/site.css HTTP/1.1\r\nHost: example.com",
            "GET /.well-known/security.txt HTTP/1.1\r\nHost: example.com",
            "GET /.git/config HTTP/1.1\r\nHost: example.com",
            "GET /backup.sql HTTP/1.1\r\nHost: example.com",
            "GET /missing HTTP/1.1\r\nHost: example.com",
        ],
        check: h5bp_check,
    });
}

#[test]
fn reverse_proxy_in_front_of_an_app() {
    run_case(&Case {
        name: "proxy",
        site: proxy_site,
        requests: &[
            "GET /robots.txt HTTP/1.1\r\nHost: example.com",
            "GET /boom HTTP/1.1\r\nHost: example.com",
        ],
        check: proxy_check,
    });
}

#[test]
fn static_single_page_application() {
    run_case(&Case {
        name: "spa",
        site: spa_site,
        requests: &[
            "GET /users/42 HTTP/1.1\r\nHost: spa",
            "GET /assets/app.css HTTP/1.1\r\nHost: spa",
            "GET /assets/missing.js HTTP/1.1\r\nHost: spa",
            "GET /healthz HTTP/1.1\r\nHost: spa",
            "GET / HTTP/1.1\r\nHost: spa",
        ],
        check: spa_check,
    });
}

#[test]
fn api_gateway_with_limits() {
    run_case(&Case {
        name: "api",
        site: api_site,
        requests: &[
            "GET /admin/x HTTP/1.1\r\nHost: api.example.com\r\nX-Forwarded-For: 198.51.100.5",
            "GET /nothing HTTP/1.1\r\nHost: api.example.com",
            "GET /health HTTP/1.1\r\nHost: api.example.com",
        ],
        check: api_check,
    });
}

#[test]
fn h5bp_look_ahead_is_served_as_pcre_matches_it() {
    let dir = temp_dir("corpus-lookahead");
    let port = free_port();
    std::fs::create_dir_all(dir.join("logs")).unwrap();
    write_file(&dir, "html/.well-known/security.txt", b"Contact: x");
    write_file(&dir, "html/.env", b"SECRET=1");
    write_file(&dir, "html/a/.hidden", b"x");
    std::fs::write(
        dir.join("nginx.conf"),
        format!(
            "events {{}}\nhttp {{\n server {{\n  listen 127.0.0.1:{port};\n  \
             location ~* /\\.(?!well-known\\/) {{\n   deny all;\n  }}\n  \
             location ~ ^/(?<first>\\w)(\\w)\\2 {{\n   return 200 \"$first\";\n  }}\n }}\n}}\n"
        ),
    )
    .unwrap();
    let (code, err) = shard_test(&dir);
    assert_eq!(code, 0, "{err}");
    let _s = start_shard(&dir, port);
    let get = |path: &str| ask(port, &format!("GET {path} HTTP/1.1\r\nHost: x"));
    assert_eq!(get("/.well-known/security.txt").0, 200);
    assert_eq!(get("/.env").0, 403);
    assert_eq!(get("/a/.hidden").0, 403);
    // A backreference and a named group (PCRE syntax) in a location.
    assert_eq!(get("/xyy").2, "x");
    assert_eq!(get("/xyz").0, 404);
}

/// WordPress's documented nginx configuration (the nginx wiki's WordPress recipe) and
/// MediaWiki's (mediawiki.org, Manual:Short URL/Nginx), as written: both pass `-t`.
#[test]
fn wordpress_and_mediawiki_configurations_pass_the_test() {
    let wordpress = "events {}\nhttp {\n include mime.types;\n \
        upstream php {\n  server unix:/tmp/php-cgi.socket;\n  server 127.0.0.1:9000;\n }\n \
        server {\n  listen 127.0.0.1:1;\n  server_name example.com;\n  root /var/www/wordpress;\n  \
        index index.php;\n  location = /favicon.ico {\n   log_not_found off;\n   access_log off;\n  }\n  \
        location = /robots.txt {\n   allow all;\n   log_not_found off;\n   access_log off;\n  }\n  \
        location / {\n   try_files $uri $uri/ /index.php?$args;\n  }\n  \
        location ~ \\.php$ {\n   include fastcgi_params;\n   fastcgi_intercept_errors on;\n   \
        fastcgi_pass php;\n   fastcgi_param SCRIPT_FILENAME $document_root$fastcgi_script_name;\n  }\n  \
        location ~* \\.(js|css|png|jpg|jpeg|gif|ico)$ {\n   expires max;\n   log_not_found off;\n  }\n }\n}\n";
    let mediawiki = "events {}\nhttp {\n server {\n  listen 127.0.0.1:1;\n  root /var/www/mediawiki;\n  \
        location ~ ^/w/(index|load|api|thumb|opensearch_desc|rest|img_auth)\\.php$ {\n   \
        include fastcgi_params;\n   fastcgi_param SCRIPT_FILENAME $document_root$fastcgi_script_name;\n   \
        fastcgi_pass 127.0.0.1:9000;\n  }\n  location /w/images {\n  }\n  \
        location /w/images/deleted {\n   deny all;\n  }\n  \
        location ~ ^/w/resources/(assets|lib|src) {\n   try_files $uri 404;\n   \
        add_header Cache-Control \"public\";\n   expires 7d;\n  }\n  \
        location ~ ^/w/(skins|extensions)/.+\\.(css|js|gif|jpg|jpeg|png|svg|wasm|ttf|woff|woff2)$ {\n   \
        try_files $uri 404;\n   add_header Cache-Control \"public\";\n   expires 7d;\n  }\n  \
        location = /favicon.ico {\n   alias /w/images/6/64/Favicon.ico;\n   \
        add_header Cache-Control \"public\";\n   expires 7d;\n  }\n  \
        location ~ ^/w/(COPYING|CREDITS)$ {\n   default_type text/plain;\n  }\n  \
        location /w/rest.php/ {\n   try_files $uri $uri/ /w/rest.php?$query_string;\n  }\n  \
        location /wiki/ {\n   rewrite ^/wiki/(?<pagename>.*)$ /w/index.php;\n  }\n  \
        location = /robots.txt {\n  }\n  location = / {\n   return 301 /wiki/Main_Page;\n  }\n  \
        location / {\n   return 404;\n  }\n }\n}\n";
    for (name, conf) in [("wordpress", wordpress), ("mediawiki", mediawiki)] {
        let dir = temp_dir(&format!("corpus-{name}"));
        std::fs::write(dir.join("nginx.conf"), conf).unwrap();
        let (code, err) = shard_test(&dir);
        assert_eq!(code, 0, "{name}: {err}");
    }
}
