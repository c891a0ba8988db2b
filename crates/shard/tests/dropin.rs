//! nginx configurations that run as they do under nginx (issue 12): variables in `return`,
//! `return 444`, absolute redirects, and the other directives real site configurations use.

mod support;

use std::io::{Read, Write};
use std::time::Duration;

use support::*;

const CONF: &str = r#"
worker_processes 1;
error_log logs/error.log info;
events { worker_connections 64; }
http {
    access_log logs/access.log;
    server {
        listen 127.0.0.1:{port};
        server_name default.test;
        location = /status { shard_status; }
        location = /to-https { return 301 https://$host$request_uri; }
        location = /vars {
            return 200 "$request_method $uri ?$args $arg_b [$http_x_thing] $cookie_sid $server_port $scheme $server_protocol ${host}!";
        }
        location = /id { return 200 $request_id; }
        location = /close { return 444; }
        location = /rel { return 302 /elsewhere?x=1; }
        location = /dollar { return 200 "cost: $ 5"; }
    }
}
"#;

#[test]
fn return_expands_variables() {
    let s = Server::start("retvars", CONF, 1);
    let a = s.addr();
    let r = raw(
        a,
        b"GET /to-https?a=1&b=2 HTTP/1.1\r\nHost: Example.COM:8443\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(r.status, 301);
    assert_eq!(
        r.header("Location"),
        Some("https://example.com/to-https?a=1&b=2")
    );
    let r = raw(
        a,
        b"GET /vars?a=1&B=two HTTP/1.1\r\nHost: h.test\r\nX-Thing: one\r\nX-Thing: two\r\n\
          Cookie: a=1; sid=s3cr3t; z=9\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(r.status, 200);
    assert_eq!(
        r.body_str(),
        format!(
            "GET /vars ?a=1&B=two two [one, two] s3cr3t {} http HTTP/1.1 h.test!",
            a.port()
        )
    );
    assert_eq!(get(a, "/dollar").body_str(), "cost: $ 5");
    let id1 = get(a, "/id").body_str();
    let id2 = get(a, "/id").body_str();
    assert_eq!(id1.len(), 32, "{id1}");
    assert!(id1.bytes().all(|b| b.is_ascii_hexdigit()), "{id1}");
    assert_ne!(id1, id2);
}

#[test]
fn return_444_closes_without_a_response() {
    let s = Server::start("ret444", CONF, 1);
    let mut c = connect(s.addr());
    c.write_all(b"GET /close HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut buf = Vec::new();
    let n = c.read_to_end(&mut buf);
    assert!(
        matches!(n, Ok(0)) || n.is_err(),
        "expected a close with nothing sent, got {n:?} {:?}",
        String::from_utf8_lossy(&buf)
    );
    assert!(buf.is_empty());
    let log = s.dir.join("logs/access.log");
    wait_for(Duration::from_secs(5), "the 444 in the access log", || {
        std::fs::read_to_string(&log)
            .ok()
            .filter(|l| l.contains("\"GET /close HTTP/1.1\" 444 0"))
    });
}

#[test]
fn relative_redirects_become_absolute_as_in_nginx() {
    let s = Server::start("absredir", CONF, 1);
    let a = s.addr();
    let r = raw(
        a,
        b"GET /rel HTTP/1.1\r\nHost: site.test\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(r.status, 302);
    assert_eq!(
        r.header("Location").map(str::to_string),
        Some(format!("http://site.test:{}/elsewhere?x=1", a.port()))
    );
    // No Host (HTTP/1.0): the address the connection came in on, not the server's name
    // (checked against nginx 1.22.1).
    let r = raw(a, b"GET /rel HTTP/1.0\r\n\r\n");
    assert_eq!(
        r.header("Location").map(str::to_string),
        Some(format!("http://127.0.0.1:{}/elsewhere?x=1", a.port()))
    );
}

const LOG_CONF: &str = r#"
worker_processes 1;
events { worker_connections 64; }
http {
    log_format main '$remote_addr "$request" $status $body_bytes_sent "$http_x_trace" $request_time';
    log_format js escape=json '{"uri":"$uri","ua":"$http_user_agent","q":"$arg_q"}';
    log_format bare escape=none '$uri:$arg_q:$http_x_trace';
    log_format sizes '$uri $request_length $bytes_sent $body_bytes_sent';
    access_log logs/access.log;
    access_log logs/bare.log bare;
    access_log logs/sizes.log sizes;
    access_log logs/main.log main;
    access_log logs/json.log js if=$arg_log;
    server {
        listen 127.0.0.1:{port};
        location = /status { shard_status; }
        location / { return 200 "hi"; }
        location /quiet/ { access_log off; return 204; }
    }
}
"#;

#[test]
fn log_formats_and_several_access_logs_are_all_written() {
    let s = Server::start("logfmt", LOG_CONF, 1);
    let a = s.addr();
    let r = raw(
        a,
        b"GET /a?log=1&q=x%22y HTTP/1.1\r\nHost: h\r\nX-Trace: t-1\r\nUser-Agent: ua \"quoted\"\r\n\
          Connection: close\r\n\r\n",
    );
    assert_eq!(r.status, 200);
    assert_eq!(get(a, "/b?log=0").status, 200);
    assert_eq!(get(a, "/quiet/x?log=1").status, 204);
    let read = |name: &str, lines: usize| {
        let p = s.dir.join("logs").join(name);
        wait_for(Duration::from_secs(5), name, || {
            std::fs::read_to_string(&p)
                .ok()
                .filter(|t| t.lines().filter(|l| !l.contains("/status")).count() >= lines)
        })
        .lines()
        .filter(|l| !l.contains("/status"))
        .map(str::to_string)
        .collect::<Vec<_>>()
    };
    let combined = read("access.log", 2);
    assert!(
        combined[0]
            .contains("\"GET /a?log=1&q=x%22y HTTP/1.1\" 200 2 \"-\" \"ua \\x22quoted\\x22\""),
        "{combined:?}"
    );
    let main = read("main.log", 2);
    assert!(
        main[0].starts_with("127.0.0.1 \"GET /a?log=1&q=x%22y HTTP/1.1\" 200 2 \"t-1\" 0."),
        "{main:?}"
    );
    assert!(
        main[1].contains(" 200 2 \"-\" "),
        "an empty value is '-': {main:?}"
    );
    // $request_length is the head as sent (bare LF line ends count one byte each), and
    // $bytes_sent counts the response head as well as the body.
    let lf = raw(a, b"GET /lf HTTP/1.0\nHost: h\n\n");
    assert_eq!(lf.status, 200);
    let sizes = read("sizes.log", 3);
    let line = sizes.iter().find(|l| l.starts_with("/lf ")).unwrap();
    let f: Vec<u64> = line
        .split(' ')
        .skip(1)
        .map(|n| n.parse().unwrap())
        .collect();
    assert_eq!(f[0], 26, "{line}");
    assert!(f[1] > f[2] + 40 && f[2] == 2, "{line}");
    // escape=none: as is, and a value not found is empty (not `-`), as nginx writes it.
    let bare = read("bare.log", 2);
    assert_eq!(bare[0], "/a:x%22y:t-1", "{bare:?}");
    assert_eq!(bare[1], "/b::", "{bare:?}");
    let json = read("json.log", 1);
    assert_eq!(
        json.len(),
        1,
        "if=$arg_log drops log=0 and no log: {json:?}"
    );
    assert_eq!(json[0], r#"{"uri":"/a","ua":"ua \"quoted\"","q":"x%22y"}"#);
    assert!(!std::fs::read_to_string(s.dir.join("logs/access.log"))
        .unwrap()
        .contains("/quiet/"));
}

const HEADERS_CONF: &str = r#"
worker_processes 1;
events { worker_connections 64; }
http {
    access_log off;
    add_header X-Frame-Options SAMEORIGIN;
    add_header X-Served-By $hostname-$server_port always;
    server {
        listen 127.0.0.1:{port};
        root {dir}/html;
        location = /status { shard_status; }
        location /static/ { expires 1h; }
        location /epoch/ { expires epoch; }
        location /max/ { expires max; }
        location /own/ {
            server_tokens off;
            add_header Cache-Control "public" always;
            add_header X-Empty "$http_x_none";
            return 200 "own";
        }
        location / { }
    }
}
"#;

#[test]
fn add_header_expires_and_server_tokens_as_nginx() {
    let s = Server::start("headers", HEADERS_CONF, 1);
    write_file(&s.dir, "html/static/a.css", b"body{}");
    write_file(&s.dir, "html/epoch/a.txt", b"x");
    write_file(&s.dir, "html/max/a.txt", b"x");
    let a = s.addr();
    let r = get(a, "/static/a.css");
    assert_eq!(r.status, 200);
    assert_eq!(r.header("X-Frame-Options"), Some("SAMEORIGIN"), "inherited");
    assert_eq!(r.header("Cache-Control"), Some("max-age=3600"));
    let exp = r.header("Expires").expect("Expires");
    assert!(exp.ends_with(" GMT"), "{exp}");
    assert!(
        r.header("Server").unwrap().starts_with("shard/"),
        "server_tokens on by default"
    );
    assert!(r
        .header("X-Served-By")
        .unwrap()
        .ends_with(&format!("-{}", a.port())));
    // Not on a 404 without `always`; with it, yes.
    let r = get(a, "/static/missing.css");
    assert_eq!(r.status, 404);
    assert_eq!(r.header("X-Frame-Options"), None);
    assert_eq!(r.header("Expires"), None);
    assert!(r.header("X-Served-By").is_some());
    let r = get(a, "/epoch/a.txt");
    assert_eq!(r.header("Expires"), Some("Thu, 01 Jan 1970 00:00:01 GMT"));
    assert_eq!(r.header("Cache-Control"), Some("no-cache"));
    let r = get(a, "/max/a.txt");
    assert_eq!(r.header("Expires"), Some("Thu, 31 Dec 2037 23:55:55 GMT"));
    assert_eq!(r.header("Cache-Control"), Some("max-age=315360000"));
    // A level with its own add_header inherits none; an empty value adds nothing.
    let r = get(a, "/own/x");
    assert_eq!(r.body_str(), "own");
    assert_eq!(r.header("Server"), Some("shard"));
    assert_eq!(r.header("Cache-Control"), Some("public"));
    assert_eq!(r.header("X-Frame-Options"), None);
    assert_eq!(r.header("X-Served-By"), None);
    assert_eq!(r.header("X-Empty"), None);
}

const ACCESS_CONF: &str = r#"
worker_processes 1;
error_log logs/error.log;
events { worker_connections 64; }
http {
    access_log off;
    deny 192.0.2.1;
    allow 127.0.0.0/8;
    deny all;
    server {
        listen 127.0.0.1:{port};
        location = /status { shard_status; }
        location / { return 200 "in"; }
        # No `return` here: nginx's rewrite phase comes before access, so a `return` would
        # answer whatever the rules say.
        location /admin/ { allow 10.0.0.0/8; allow ::1; deny all; }
        location /open/ { allow all; return 200 "open"; }
    }
}
"#;

#[test]
fn allow_and_deny_in_order_with_nginx_inheritance() {
    let s = Server::start("access", ACCESS_CONF, 1);
    let a = s.addr();
    assert_eq!(get(a, "/x").body_str(), "in");
    let r = raw(a, b"GET /admin/x HTTP/1.1\r\nHost: h\r\n\r\n");
    assert_eq!(r.status, 403, "a level with rules replaces its parent's");
    assert!(r.body_str().contains("403 Forbidden"));
    assert_eq!(r.header("Connection"), Some("keep-alive"));
    assert_eq!(get(a, "/open/x").body_str(), "open");
    let log = s.dir.join("logs/error.log");
    wait_for(
        Duration::from_secs(5),
        "the refusal in the error log",
        || {
            std::fs::read_to_string(&log)
                .ok()
                .filter(|l| l.contains("access forbidden by rule, client: 127.0.0.1"))
        },
    );
}

const REGEX_CONF: &str = r#"
worker_processes 1;
events { worker_connections 64; }
http {
    access_log off;
    server {
        listen 127.0.0.1:{port};
        location = /status { shard_status; }
        location / { return 200 "root"; }
        location = /exact.php { return 200 "exact"; }
        location ^~ /static/ { return 200 "static"; }
        location /images/ {
            location ~ \.png$ { return 200 "nested png"; }
            return 200 "images";
        }
        location ~ \.(php|cgi)$ { return 200 "script $1"; }
        location ~* \.PNG$ { return 200 "any png"; }
        location ~ ^/user/(?:id-)?(\d+)/(\w+)$ { return 200 "user $1 does $2 ($0)"; }
    }
}
"#;

#[test]
fn regex_locations_in_nginx_order_with_captures() {
    let s = Server::start("regexloc", REGEX_CONF, 1);
    let a = s.addr();
    let body = |p: &str| get(a, p).body_str();
    assert_eq!(body("/x/index.php"), "script php");
    assert_eq!(body("/exact.php"), "exact", "= beats a regex");
    assert_eq!(body("/static/a.php"), "static", "^~ stops the regex search");
    assert_eq!(body("/images/a.png"), "nested png", "nested regexes first");
    assert_eq!(body("/images/a.gif"), "images");
    assert_eq!(body("/other/A.Png"), "any png", "~* ignores case");
    assert_eq!(body("/other/a.PNG"), "any png");
    assert_eq!(
        body("/user/id-42/edit"),
        "user 42 does edit (/user/id-42/edit)"
    );
    assert_eq!(body("/user/x/edit"), "root");
}

const TRY_CONF: &str = r#"
worker_processes 1;
error_log logs/error.log;
events { worker_connections 64; }
http {
    access_log logs/access.log;
    server {
        listen 127.0.0.1:{port};
        root {dir}/html;
        location = /status { shard_status; }
        error_page 404 /errors/404.html;
        error_page 500 502 503 504 /errors/50x.html;
        location /errors/ { internal; }
        location /spa/ { try_files $uri $uri/ /spa/index.html; }
        location /strict/ { try_files $uri =404; }
        location /app/ { try_files $uri @backend; }
        location @backend { proxy_pass http://127.0.0.1:{port1}; }
        location /gone/ { error_page 404 =301 https://new.example/; }
        location /soft/ { error_page 404 =200 /errors/empty.txt; }
        location /named/ { error_page 404 = @fallback; }
        location @fallback { return 200 "fallback for $uri"; }
        location /fail/ { return 503; }
        location /loop/ { try_files $uri /loop/again; }
    }
    server {
        listen 127.0.0.1:{port1};
        location / { return 200 "backend saw $request_uri"; }
    }
}
"#;

#[test]
fn try_files_error_page_named_and_internal_locations() {
    let s = Server::start_ports("tryfiles", TRY_CONF, 1, 1);
    write_file(&s.dir, "html/errors/404.html", b"custom 404");
    write_file(&s.dir, "html/errors/50x.html", b"custom 50x");
    write_file(&s.dir, "html/errors/empty.txt", b"");
    write_file(&s.dir, "html/spa/index.html", b"spa shell");
    write_file(&s.dir, "html/spa/app.js", b"js");
    write_file(&s.dir, "html/spa/sub/index.html", b"sub index");
    write_file(&s.dir, "html/strict/here.txt", b"here");
    write_file(&s.dir, "html/app/static.txt", b"static");
    let a = s.addr();
    // SPA fallback.
    assert_eq!(get(a, "/spa/app.js").body_str(), "js");
    assert_eq!(get(a, "/spa/sub/").body_str(), "sub index");
    let r = get(a, "/spa/some/route?x=1");
    assert_eq!((r.status, r.body_str().as_str()), (200, "spa shell"));
    // =404 goes through error_page, with the original status.
    assert_eq!(get(a, "/strict/here.txt").body_str(), "here");
    let r = get(a, "/strict/nothere.txt");
    assert_eq!((r.status, r.body_str().as_str()), (404, "custom 404"));
    // Plain missing files too; the error location is internal.
    let r = get(a, "/nothing.html");
    assert_eq!((r.status, r.body_str().as_str()), (404, "custom 404"));
    let r = get(a, "/errors/404.html");
    assert_eq!(
        (r.status, r.body_str().as_str()),
        (404, "custom 404"),
        "internal: 404"
    );
    // Named location that proxies; the upstream sees the changed URI.
    assert_eq!(get(a, "/app/static.txt").body_str(), "static");
    let r = get(a, "/app/dynamic?q=1");
    assert_eq!(r.body_str(), "backend saw /app/dynamic?q=1");
    // =301 URL, =200, = @named.
    let r = get(a, "/gone/x");
    assert_eq!(r.status, 301);
    assert_eq!(r.header("Location"), Some("https://new.example/"));
    let r = get(a, "/soft/x");
    assert_eq!((r.status, r.body_str().as_str()), (200, ""));
    let r = get(a, "/named/x");
    assert_eq!(
        (r.status, r.body_str().as_str()),
        (200, "fallback for /named/x")
    );
    // return 503 -> error_page 50x.
    let r = get(a, "/fail/x");
    assert_eq!((r.status, r.body_str().as_str()), (503, "custom 50x"));
    // A redirect cycle ends in 500 (whose own error page is not used again).
    let r = get(a, "/loop/x");
    assert_eq!(r.status, 500);
    let log = s.dir.join("logs/error.log");
    wait_for(Duration::from_secs(5), "the cycle in the error log", || {
        std::fs::read_to_string(&log)
            .ok()
            .filter(|l| l.contains("rewrite or internal redirection cycle"))
    });
}

const REWRITE_CONF: &str = r#"
worker_processes 1;
events { worker_connections 64; }
http {
    access_log off;
    map $http_user_agent $kind {
        default        browser;
        ~*bot          robot;
        curl/8.0       exact-curl;
    }
    map $host $site {
        hostnames;
        default        other;
        .example.com   example;
        *.test.org     test-wild;
    }
    server {
        listen 127.0.0.1:{port};
        server_name rw.test;
        rewrite ^/old/(.*)$ /new/$1 permanent;
        if ($http_x_block) { return 403; }
        location = /status { shard_status; }
        location /new/ { return 200 "new $uri"; }
        location /moved/ {
            rewrite ^/moved/(\w+)/(\w+)$ /target/$2/$1?from=moved last;
        }
        location /target/ { return 200 "target $uri args=$args"; }
        location /brk/ {
            rewrite ^/brk/(.*)$ /other/$1 break;
            return 200 "not reached";
        }
        location /other/ { return 200 "wrong location"; }
        location /vars/ {
            set $greeting "hello";
            set $who $arg_who;
            if ($who = "") { set $who world; }
            if ($request_method = POST) { return 405; }
            if ($uri ~ ^/vars/(\d+)$) { return 200 "$greeting $who #$1 $kind $site"; }
            return 200 "$greeting $who $kind $site";
        }
        location /exec/ {
            if (-x {dir}/html/files/$arg_c) { return 200 "executable"; }
            return 200 "not";
        }
        location /files/ {
            if (-d $request_filename) { return 200 "a directory"; }
            if (!-f $request_filename) { return 404; }
        }
        location /ext/ { rewrite ^ https://elsewhere.example$uri redirect; }
        location /extq/ { rewrite ^ http://example.com/?c=d redirect; }
        location /extnoq/ { rewrite ^ http://example.com/? redirect; }
        location /args/ { rewrite ^ /target/x?only=1? last; }
    }
}
"#;

#[test]
fn rewrite_if_set_and_map_as_nginx() {
    let s = Server::start("rewrite", REWRITE_CONF, 1);
    write_file(&s.dir, "html/files/a.txt", b"a file");
    std::fs::create_dir_all(s.dir.join("html/files/d")).unwrap();
    let a = s.addr();
    let body = |p: &str| get(a, p).body_str();
    let r = get(a, "/old/page?x=1");
    assert_eq!(r.status, 301);
    assert_eq!(
        r.header("Location").map(str::to_string),
        Some(format!("http://localhost:{}/new/page?x=1", a.port()))
    );
    assert_eq!(
        body("/moved/a/b?q=2"),
        "target /target/b/a args=from=moved&q=2"
    );
    assert_eq!(body("/args/z?q=2"), "target /target/x args=only=1");
    // A redirect's own arguments come first, the request's after `&`; a final `?` drops them.
    let loc = |p: &str| get(a, p).header("Location").map(str::to_string);
    assert_eq!(
        loc("/extq/?a=b").as_deref(),
        Some("http://example.com/?c=d&a=b")
    );
    assert_eq!(loc("/extq/").as_deref(), Some("http://example.com/?c=d"));
    assert_eq!(loc("/extnoq/?a=b").as_deref(), Some("http://example.com/"));
    let r = get(a, "/brk/zz");
    assert_eq!(r.status, 404, "break: served as a file in this location");
    assert_eq!(body("/vars/"), "hello world browser other");
    assert_eq!(body("/vars/?who=you"), "hello you browser other");
    assert_eq!(body("/vars/42"), "hello world #42 browser other");
    let r = raw(
        a,
        b"GET /vars/ HTTP/1.1\r\nHost: a.b.example.com\r\nUser-Agent: GoogleBOT/2\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(r.body_str(), "hello world robot example");
    let r = raw(
        a,
        b"GET /vars/ HTTP/1.1\r\nHost: x.test.org\r\nUser-Agent: curl/8.0\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(r.body_str(), "hello world exact-curl test-wild");
    let r = raw(
        a,
        b"POST /vars/ HTTP/1.1\r\nHost: h\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(r.status, 405);
    let r = raw(
        a,
        b"GET /new/x HTTP/1.1\r\nHost: h\r\nX-Block: 1\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(r.status, 403, "server-level if runs before the location");
    assert_eq!(body("/files/a.txt"), "a file");
    assert_eq!(get(a, "/files/nope.txt").status, 404);
    assert_eq!(body("/files/d"), "a directory");
    // `-x` is the owner's execute bit, as nginx's `ngx_is_exec`: a directory has it.
    assert_eq!(body("/exec/?c=d"), "executable");
    assert_eq!(body("/exec/?c=a.txt"), "not");
    let r = get(a, "/ext/p?k=v");
    assert_eq!(r.status, 302);
    assert_eq!(
        r.header("Location"),
        Some("https://elsewhere.example/ext/p?k=v")
    );
}

const PROXY_HEADERS_CONF: &str = r#"
worker_processes 1;
events { worker_connections 64; }
http {
    access_log off;
    server {
        listen 127.0.0.1:{port};
        location = /status { shard_status; }
        location /plain/ {
            proxy_pass http://127.0.0.1:{port1};
            proxy_hide_header X-Secret;
            proxy_pass_header Server;
        }
        location /app/ {
            proxy_pass http://127.0.0.1:{port1}/backend/;
        }
        location /noredir/ {
            proxy_pass http://127.0.0.1:{port1};
            proxy_redirect off;
        }
        location /pairs/ {
            proxy_pass http://127.0.0.1:{port1};
            proxy_redirect http://127.0.0.1:{port1}/moved/ http://$host/elsewhere/;
        }
        location /regex/ {
            proxy_pass http://127.0.0.1:{port1};
            proxy_redirect ~^http://[^/]+/moved/(.+)$ /got/$1;
            proxy_redirect $scheme://$server_addr:{port1}/ /;
            proxy_redirect ~*^/MOV/(.+)$ /refreshed/$1;
        }
        location /text.txt { charset utf-8; root {dir}/html; }
        location /typed { charset utf-8; default_type application/json; return 200 "{}"; }
        location /gz/ { gzip on; gzip_min_length 1; default_type text/html; return 200 "compressible compressible compressible"; }
        location /gzany/ { gzip on; gzip_proxied any; gzip_min_length 1; default_type text/html; return 200 "compressible compressible compressible"; }
    }
    server {
        listen 127.0.0.1:{port1};
        server_tokens off;
        location / {
            add_header X-Secret s;
            add_header X-Accel-Expires 10;
            add_header X-Kept k;
            return 200 "backend $uri";
        }
        location /backend/go { return 302 /backend/there; }
        location /noredir/go { return 302 /noredir/there; }
        location /pairs/go { return 301 /moved/x; }
        location /regex/go { add_header Refresh "5; url=/mov/y"; return 301 /moved/x; }
        location /regex/abs { return 301 http://127.0.0.1:{port1}/abs/z; }
    }
}
"#;

#[test]
fn proxy_headers_redirects_charset_and_gzip_proxied() {
    let s = Server::start_ports("proxyhdr", PROXY_HEADERS_CONF, 1, 1);
    write_file(&s.dir, "html/text.txt", b"text");
    let a = s.addr();
    let r = get(a, "/plain/x");
    assert_eq!(r.body_str(), "backend /plain/x");
    assert_eq!(r.header("X-Secret"), None, "proxy_hide_header");
    assert_eq!(r.header("X-Accel-Expires"), None, "hidden by default");
    assert_eq!(r.header("X-Kept"), Some("k"));
    assert_eq!(r.header("Server"), Some("shard"), "the upstream's, passed");
    // proxy_redirect default: the upstream's URL of proxy_pass becomes the location.
    let r = get(a, "/app/go");
    assert_eq!(r.status, 302);
    assert_eq!(
        r.header("Location").map(str::to_string),
        Some(format!("http://localhost:{}/app/there", a.port()))
    );
    let port1 = s.ports[0];
    let r = get(a, "/noredir/go");
    assert_eq!(
        r.header("Location").map(str::to_string),
        Some(format!("http://127.0.0.1:{port1}/noredir/there"))
    );
    let r = get(a, "/pairs/go");
    assert_eq!(r.header("Location"), Some("http://localhost/elsewhere/x"));
    // A regular expression's groups in the replacement, `Refresh` from its `url=`; a rule
    // with variables in what it matches.
    let r = get(a, "/regex/go");
    assert_eq!(
        r.header("Location").map(str::to_string),
        Some(format!("http://localhost:{}/got/x", a.port()))
    );
    assert_eq!(r.header("Refresh"), Some("5; url=/refreshed/y"));
    let r = get(a, "/regex/abs");
    assert_eq!(
        r.header("Location").map(str::to_string),
        Some(format!("http://localhost:{}/abs/z", a.port()))
    );
    // charset on the types of charset_types only.
    let r = get(a, "/text.txt");
    assert_eq!(r.header("Content-Type"), Some("text/plain; charset=utf-8"));
    assert_eq!(
        get(a, "/typed").header("Content-Type"),
        Some("application/json")
    );
    // gzip_proxied off (the default): a request with Via is not compressed.
    let gz = |path: &str, via: bool| {
        let extra = if via { "Via: 1.1 cache\r\n" } else { "" };
        raw(
            a,
            format!(
                "GET {path} HTTP/1.1\r\nHost: h\r\nAccept-Encoding: gzip\r\n{extra}Connection: close\r\n\r\n"
            )
            .as_bytes(),
        )
        .header("Content-Encoding")
        .map(str::to_string)
    };
    assert_eq!(gz("/gz/x", false).as_deref(), Some("gzip"));
    assert_eq!(gz("/gz/x", true), None);
    assert_eq!(gz("/gzany/x", true).as_deref(), Some("gzip"));
}

const REALIP_CONF: &str = r#"
worker_processes 1;
events { worker_connections 64; }
http {
    access_log logs/access.log;
    set_real_ip_from 127.0.0.0/8;
    server {
        listen 127.0.0.1:{port};
        location = /status { shard_status; }
        location / { return 200 "$remote_addr"; }
        location /peer/ { return 200 "$remote_addr $realip_remote_addr [$remote_port]"; }
        location /xff/ {
            real_ip_header X-Forwarded-For;
            real_ip_recursive on;
            set_real_ip_from 10.0.0.0/8;
            set_real_ip_from 127.0.0.1;
            return 200 "$remote_addr";
        }
        location /last/ { real_ip_header X-Forwarded-For; return 200 "$remote_addr"; }
        location /deny/ { deny 203.0.113.7; }
    }
}
"#;

#[test]
fn real_ip_from_trusted_proxies() {
    let s = Server::start("realip", REALIP_CONF, 1);
    let a = s.addr();
    let ask = |path: &str, hdr: &str| {
        raw(
            a,
            format!("GET {path} HTTP/1.1\r\nHost: h\r\n{hdr}Connection: close\r\n\r\n").as_bytes(),
        )
    };
    assert_eq!(ask("/", "").body_str(), "127.0.0.1");
    assert_eq!(
        ask("/", "X-Real-IP: 198.51.100.9\r\n").body_str(),
        "198.51.100.9"
    );
    assert_eq!(ask("/", "X-Real-IP: garbage\r\n").body_str(), "127.0.0.1");
    // `$realip_remote_addr`: the socket's own peer, before the replacement.
    assert_eq!(
        ask("/peer/", "X-Real-IP: 198.51.100.9\r\n").body_str(),
        // A header gives no port: `$remote_port` is empty (nginx).
        "198.51.100.9 127.0.0.1 []"
    );
    let xff = "X-Forwarded-For: 203.0.113.5, 198.51.100.1, 10.1.1.1\r\n";
    assert_eq!(
        ask("/xff/", xff).body_str(),
        "198.51.100.1",
        "recursive skips trusted"
    );
    assert_eq!(
        ask("/last/", xff).body_str(),
        "10.1.1.1",
        "not recursive: the last"
    );
    assert_eq!(
        ask("/deny/", "X-Real-IP: 203.0.113.7\r\n").status,
        403,
        "deny sees it"
    );
    let log = s.dir.join("logs/access.log");
    wait_for(
        Duration::from_secs(5),
        "the real address in the log",
        || {
            std::fs::read_to_string(&log)
                .ok()
                .filter(|l| l.lines().any(|l| l.starts_with("198.51.100.9 - - [")))
        },
    );
}

#[test]
fn several_ranges_get_multipart_byteranges() {
    let s = Server::start("multirange", CONF, 1);
    write_file(&s.dir, "html/ten.txt", b"0123456789");
    let r = raw(
        s.addr(),
        b"GET /ten.txt HTTP/1.1\r\nHost: h\r\nRange: bytes=0-1,5-6,40-50\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(r.status, 206);
    let ct = r.header("Content-Type").unwrap().to_string();
    let boundary = ct
        .strip_prefix("multipart/byteranges; boundary=")
        .unwrap_or_else(|| panic!("{ct}"));
    let want = format!(
        "\r\n--{boundary}\r\nContent-Type: text/plain\r\nContent-Range: bytes 0-1/10\r\n\r\n01\
         \r\n--{boundary}\r\nContent-Type: text/plain\r\nContent-Range: bytes 5-6/10\r\n\r\n56\
         \r\n--{boundary}--\r\n"
    );
    assert_eq!(r.body_str(), want);
    assert_eq!(
        r.header("Content-Length").map(str::to_string),
        Some(want.len().to_string())
    );
    let h = raw(
        s.addr(),
        b"HEAD /ten.txt HTTP/1.1\r\nHost: h\r\nRange: bytes=0-1,5-6\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(h.status, 206);
    assert_eq!(h.header("Content-Type").map(str::to_string), Some(ct));
}

const LIMITS_CONF: &str = r#"
worker_processes 2;
error_log logs/error.log;
events { worker_connections 64; }
http {
    access_log off;
    limit_req_zone $binary_remote_addr zone=burst:1m rate=1r/s;
    limit_req_zone $arg_k zone=slow:1m rate=10r/s;
    limit_req_zone $arg_k zone=drain:1m rate=2r/s;
    limit_conn_zone $remote_addr zone=perip:1m;
    server {
        listen 127.0.0.1:{port};
        root {dir}/html;
        location = /status { shard_status; }
        location /api/ { limit_req zone=burst burst=2 nodelay; limit_req_status 429; }
        location /strict/ { limit_req zone=burst; }
        location /delay/ { limit_req zone=slow burst=5; }
        location /drain/ { limit_req zone=drain burst=2; }
        location /big/ { limit_conn perip 1; sendfile on; }
        # nginx's rewrite phase runs before its preaccess and access phases: this `return`
        # is never limited or denied.
        location /ret/ { limit_req zone=burst; deny all; return 200 "ret"; }
    }
}
"#;

#[test]
fn limit_req_and_limit_conn_shared_by_all_workers() {
    let s = Server::start("limits", LIMITS_CONF, 2);
    let a = s.addr();
    for f in ["api/x", "strict/x", "delay/x", "drain/x"] {
        write_file(&s.dir, &format!("html/{f}"), b"ok");
    }
    // 1 r/s with burst=2 nodelay: three pass at once, the fourth is refused, on whichever
    // worker each connection lands.
    let codes: Vec<u16> = (0..5).map(|_| get(a, "/api/x").status).collect();
    assert_eq!(codes, [200, 200, 200, 429, 429], "{codes:?}");
    let log = s.dir.join("logs/error.log");
    wait_for(
        Duration::from_secs(5),
        "the refusal in the error log",
        || {
            std::fs::read_to_string(&log)
                .ok()
                // The excess is 3.000 less what drained between the requests.
                .filter(|l| {
                    l.contains("limiting requests, excess: ") && l.contains(" by zone \"burst\"")
                })
        },
    );
    // Another location sharing the zone, without burst: refused at once (503).
    assert_eq!(get(a, "/strict/x").status, 503);
    // The same zone, spent, before a `return` and a `deny all`: the return answers.
    for _ in 0..3 {
        let r = get(a, "/ret/x");
        assert_eq!((r.status, r.body_str().as_str()), (200, "ret"));
    }
    // Without nodelay the excess waits: 10 r/s, the 4th request ~300 ms after the first.
    let t = std::time::Instant::now();
    for _ in 0..4 {
        assert_eq!(get(a, "/delay/x?k=1").status, 200);
    }
    let took = t.elapsed();
    assert!(
        took >= Duration::from_millis(250) && took < Duration::from_secs(3),
        "{took:?}"
    );
    // A bucket that drained passes its next request at once (nginx: the excess is
    // `excess - drained + 1000`, floored at 0): after one request and 600 ms at 2 r/s, four
    // parallel requests with burst=2 are one at once, two delayed, one refused, not two
    // refused.
    assert_eq!(get(a, "/drain/x?k=d").status, 200);
    std::thread::sleep(Duration::from_millis(600)); // the drain under test, not a wait
    let t = std::time::Instant::now();
    let answers: Vec<(u16, Duration)> = (0..4)
        .map(|_| {
            std::thread::spawn(move || {
                let r = get(a, "/drain/x?k=d");
                (r.status, t.elapsed())
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|h| h.join().unwrap())
        .collect();
    let ok = answers.iter().filter(|(c, _)| *c == 200).count();
    assert_eq!(ok, 3, "{answers:?}");
    let fast = answers
        .iter()
        .filter(|(c, d)| *c == 200 && *d < Duration::from_millis(400))
        .count();
    assert_eq!(fast, 1, "one passes at once: {answers:?}");
    // limit_conn 1: a response in flight (unread) holds the count.
    write_file(&s.dir, "html/big/f.bin", &vec![7u8; 32 << 20]);
    let mut hog = connect(a);
    hog.write_all(b"GET /big/f.bin HTTP/1.1\r\nHost: h\r\n\r\n")
        .unwrap();
    let mut first = [0u8; 12];
    hog.read_exact(&mut first).unwrap();
    assert_eq!(&first, b"HTTP/1.1 200");
    let r = wait_for(Duration::from_secs(5), "a second transfer refused", || {
        let r = get(a, "/big/f.bin");
        (r.status == 503).then_some(r)
    });
    assert_eq!(r.status, 503);
    drop(hog);
    wait_for(Duration::from_secs(5), "the count given back", || {
        let r = raw(
            a,
            b"HEAD /big/f.bin HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n",
        );
        (r.status == 200).then_some(())
    });
}

const BALANCE_CONF: &str = r#"
worker_processes 1;
events { worker_connections 64; }
http {
    access_log off;
    upstream by_key { hash $arg_k; server 127.0.0.1:{port1}; server 127.0.0.1:{port2}; }
    upstream by_ring { hash $arg_k consistent; server 127.0.0.1:{port1}; server 127.0.0.1:{port2}; }
    upstream by_ip { ip_hash; server 127.0.0.1:{port1}; server 127.0.0.1:{port2}; }
    upstream fewest { least_conn; server 127.0.0.1:{port1}; server 127.0.0.1:{port2}; }
    server {
        listen 127.0.0.1:{port};
        location = /status { shard_status; }
        location /k/ { proxy_pass http://by_key; }
        location /r/ { proxy_pass http://by_ring; }
        location /ip/ { proxy_pass http://by_ip; }
        location /lc/ { proxy_pass http://fewest; }
    }
    server { listen 127.0.0.1:{port1}; location / { return 200 "one"; } }
    server { listen 127.0.0.1:{port2}; location / { return 200 "two"; } }
}
"#;

#[test]
fn hash_ip_hash_and_least_conn_upstreams() {
    let s = Server::start_ports("balance", BALANCE_CONF, 1, 2);
    let a = s.addr();
    for prefix in ["/k/", "/r/"] {
        let mut seen = std::collections::HashSet::new();
        for k in 0..40 {
            let first = get(a, &format!("{prefix}x?k=user{k}")).body_str();
            for _ in 0..3 {
                assert_eq!(get(a, &format!("{prefix}x?k=user{k}")).body_str(), first);
            }
            seen.insert(first);
        }
        assert_eq!(seen.len(), 2, "{prefix}: keys spread over both peers");
    }
    let first = get(a, "/ip/x").body_str();
    for _ in 0..5 {
        assert_eq!(get(a, "/ip/x").body_str(), first, "one client, one peer");
    }
    let mut seen = std::collections::HashSet::new();
    for _ in 0..6 {
        seen.insert(get(a, "/lc/x").body_str());
    }
    assert_eq!(seen.len(), 2, "least_conn with nothing in flight rotates");
}

const UPSTREAM_VARS_CONF: &str = r#"
worker_processes 1;
events { worker_connections 64; }
http {
    log_format up '$request_uri $status up=$upstream_addr st=$upstream_status rt=$upstream_response_time ct=$upstream_connect_time';
    access_log logs/up.log up;
    upstream pair { server 127.0.0.1:{port2}; server 127.0.0.1:{port1}; }
    server {
        listen 127.0.0.1:{port};
        location = /status { shard_status; access_log off; }
        location / { proxy_pass http://pair; }
    }
    server { listen 127.0.0.1:{port1}; access_log off; location / { return 200 "live"; } }
}
"#;

#[test]
fn upstream_variables_in_the_access_log() {
    // {port2} is a free port nothing listens on: the first try is refused.
    let s = Server::start_ports("upvars", UPSTREAM_VARS_CONF, 1, 2);
    let a = s.addr();
    let (live, dead) = (s.ports[0], s.ports[1]);
    for _ in 0..2 {
        assert_eq!(get(a, "/x").body_str(), "live");
    }
    let log = s.dir.join("logs/up.log");
    let text = wait_for(Duration::from_secs(5), "two proxied lines", || {
        std::fs::read_to_string(&log)
            .ok()
            .filter(|t| t.lines().count() >= 2)
    });
    // The first request tried the refused peer, then the live one; the second only the live
    // one (the refused peer is out for fail_timeout). Times are seconds with milliseconds; a
    // refused connect has no connect time.
    let lines: Vec<&str> = text.lines().collect();
    let first = format!("/x 200 up=127.0.0.1:{dead}, 127.0.0.1:{live} st=502, 200 rt=");
    assert!(lines[0].starts_with(&first), "{text}");
    let rt = lines[0]
        .split("rt=")
        .nth(1)
        .unwrap()
        .split(" ct=")
        .next()
        .unwrap();
    assert!(
        rt.split(", ").count() == 2 && rt.split(", ").all(|t| t.len() == 5 && t.contains('.')),
        "{text}"
    );
    assert!(lines[0].contains(" ct=-, 0."), "{text}");
    let second = format!("/x 200 up=127.0.0.1:{live} st=200 rt=");
    assert!(lines[1].starts_with(&second), "{text}");
}

const UNIX_CONF: &str = r#"
worker_processes 1;
events { worker_connections 64; }
http {
    access_log off;
    upstream app { server unix:{dir}/app.sock; }
    server {
        listen 127.0.0.1:{port};
        location = /status { shard_status; }
        location / { proxy_pass http://app; }
        location /direct/ { proxy_pass http://unix:{dir}/app.sock:/in/; }
        location /var { proxy_pass http://$arg_t; }
    }
}
"#;

#[test]
fn upstream_servers_on_unix_sockets() {
    let s = Server::start("unixup", UNIX_CONF, 1);
    let l = std::os::unix::net::UnixListener::bind(s.dir.join("app.sock")).unwrap();
    // Worker processes run as `nobody` under a root master: the socket must let them in.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(
        s.dir.join("app.sock"),
        std::fs::Permissions::from_mode(0o777),
    )
    .unwrap();
    let backend = std::thread::spawn(move || {
        let mut heads = Vec::new();
        for _ in 0..3 {
            let (mut c, _) = l.accept().unwrap();
            let mut buf = Vec::new();
            let mut tmp = [0u8; 1024];
            while find(&buf, b"\r\n\r\n").is_none() {
                let n = c.read(&mut tmp).unwrap();
                if n == 0 {
                    break;
                }
                buf.extend_from_slice(&tmp[..n]);
            }
            c.write_all(
                b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\nConnection: close\r\n\r\nvia unix!",
            )
            .unwrap();
            heads.push(String::from_utf8_lossy(&buf).into_owned());
        }
        heads
    });
    let r = get(s.addr(), "/hello?x=1");
    assert_eq!((r.status, r.body_str().as_str()), (200, "via unix!"));
    // nginx's `http://unix:PATH:URI` form, literal and rendered from a variable.
    let r = get(s.addr(), "/direct/a");
    assert_eq!((r.status, r.body_str().as_str()), (200, "via unix!"));
    let sock = s.dir.join("app.sock");
    let r = get(s.addr(), &format!("/var?t=unix:{}:/v", sock.display()));
    assert_eq!((r.status, r.body_str().as_str()), (200, "via unix!"));
    let seen = backend.join().unwrap();
    assert!(
        seen[0].starts_with("GET /hello?x=1 HTTP/1.0\r\n"),
        "{}",
        seen[0]
    );
    assert!(seen[0].contains("Host: app\r\n"), "{}", seen[0]);
    assert!(seen[1].starts_with("GET /in/a HTTP/1.0\r\n"), "{}", seen[1]);
    assert!(seen[1].contains("Host: localhost\r\n"), "{}", seen[1]);
    assert!(seen[2].starts_with("GET /v HTTP/1.0\r\n"), "{}", seen[2]);
}

const VARLOG_CONF: &str = r#"
worker_processes 1;
events { worker_connections 64; }
http {
    log_format bare escape=none '$uri $arg_n';
    access_log off;
    server {
        listen 127.0.0.1:{port};
        location = /status { shard_status; }
        location /v { access_log {dir}/html/v_$arg_n.log bare; return 204; }
        location /c {
            open_log_file_cache max=2 min_uses=2;
            access_log {dir}/html/c_$arg_n.log bare;
            return 204;
        }
        location /buf { access_log {dir}/logs/buf.log bare buffer=32k flush=100ms; return 204; }
    }
}
"#;

/// `access_log` paths with variables (opened by the worker per line), `open_log_file_cache`
/// (a path used `min_uses` times keeps its descriptor: lines still reach it after its
/// directory was renamed), and `flush=` shorter than a second.
#[test]
fn access_log_paths_with_variables_and_open_log_file_cache() {
    use std::os::unix::fs::PermissionsExt;
    let s = Server::start("varlog", VARLOG_CONF, 1);
    // The directory exists at start (a sandboxed worker is granted what exists then); the
    // workers' user creates the files.
    let dir = s.dir.join("html");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let a = s.addr();
    for n in ["a", "b", "a"] {
        assert_eq!(get(a, &format!("/v?n={n}")).status, 204);
    }
    let read = |name: &str| std::fs::read_to_string(dir.join(name)).unwrap_or_default();
    assert_eq!(read("v_a.log"), "/v a\n/v a\n");
    assert_eq!(read("v_b.log"), "/v b\n");
    for n in ["k", "k", "once"] {
        assert_eq!(get(a, &format!("/c?n={n}")).status, 204);
    }
    let moved = s.dir.join("html-moved");
    std::fs::rename(&dir, &moved).unwrap();
    for n in ["k", "once"] {
        assert_eq!(get(a, &format!("/c?n={n}")).status, 204);
    }
    std::fs::rename(&moved, &dir).unwrap();
    assert_eq!(read("c_k.log"), "/c k\n/c k\n/c k\n", "the kept descriptor");
    assert_eq!(read("c_once.log"), "/c once\n", "not kept below min_uses");
    let log = std::fs::read_to_string(s.dir.join("logs/error.log")).unwrap();
    assert!(
        log.contains("c_once.log\" failed (2: No such file or directory)"),
        "{log}"
    );
    let t = std::time::Instant::now();
    assert_eq!(get(a, "/buf").status, 204);
    let buf = s.dir.join("logs/buf.log");
    wait_for(Duration::from_secs(3), "the buffered line", || {
        (std::fs::read_to_string(&buf).unwrap_or_default() == "/buf \n").then_some(())
    });
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
}

const DOCROOT_CONF: &str = r#"
worker_processes 1;
events { worker_connections 64; }
http {
    access_log off;
    server {
        listen 127.0.0.1:{port};
        # The literal part of each path exists when the server starts (a sandboxed worker is
        # granted what exists then).
        root {dir}/html/$host;
        location = /status { shard_status; }
        location ~ ^/u/(\w+)/(.+)$ { alias {dir}/html/user-$1/public/$2; }
        location /files/ { alias {dir}/html/shared-$arg_v/; }
        location = /where { return 200 "$document_root|$request_filename"; }
    }
}
"#;

#[test]
fn root_and_alias_with_variables_and_captures() {
    let s = Server::start("docroot", DOCROOT_CONF, 1);
    write_file(&s.dir, "html/a.test/index.html", b"site a");
    write_file(&s.dir, "html/b.test/index.html", b"site b");
    write_file(&s.dir, "html/user-ann/public/p.txt", b"ann's page");
    write_file(&s.dir, "html/shared-v2/f.txt", b"v2 file");
    let a = s.addr();
    let host = |h: &str, p: &str| {
        raw(
            a,
            format!("GET {p} HTTP/1.1\r\nHost: {h}\r\nConnection: close\r\n\r\n").as_bytes(),
        )
    };
    assert_eq!(host("a.test", "/").body_str(), "site a");
    assert_eq!(host("b.test", "/").body_str(), "site b");
    assert_eq!(host("c.test", "/").status, 404);
    assert_eq!(get(a, "/u/ann/p.txt").body_str(), "ann's page");
    assert_eq!(get(a, "/u/bob/p.txt").status, 404);
    assert_eq!(get(a, "/files/f.txt?v=v2").body_str(), "v2 file");
    let d = s.dir.display();
    assert_eq!(
        host("a.test", "/where").body_str(),
        format!("{d}/html/a.test|{d}/html/a.test/where")
    );
}

const CORS_CONF: &str = r#"
worker_processes 1;
events { worker_connections 64; }
http {
    access_log off;
    server {
        listen 127.0.0.1:{port};
        location = /status { shard_status; }
        location /api/ {
            add_header X-Location loc;
            if ($request_method = OPTIONS) {
                add_header Access-Control-Allow-Origin *;
                add_header Access-Control-Allow-Methods "GET, POST, OPTIONS";
                return 204;
            }
            return 200 "api";
        }
    }
}
"#;

#[test]
fn add_header_inside_if_replaces_the_locations_headers() {
    let s = Server::start("ifheaders", CORS_CONF, 1);
    let a = s.addr();
    let r = raw(
        a,
        b"OPTIONS /api/x HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(r.status, 204);
    assert_eq!(r.header("Access-Control-Allow-Origin"), Some("*"));
    assert_eq!(
        r.header("Access-Control-Allow-Methods"),
        Some("GET, POST, OPTIONS")
    );
    assert_eq!(
        r.header("X-Location"),
        None,
        "the if's headers replace the location's"
    );
    let r = get(a, "/api/x");
    assert_eq!((r.status, r.body_str().as_str()), (200, "api"));
    assert_eq!(r.header("X-Location"), Some("loc"));
    assert_eq!(r.header("Access-Control-Allow-Origin"), None);
}

const REGEX_NAMES_CONF: &str = r#"
worker_processes 1;
events { worker_connections 64; }
http {
    access_log off;
    server { listen 127.0.0.1:{port}; location = /status { shard_status; } location / { return 200 "default"; } }
    server { listen 127.0.0.1:{port}; server_name ~^(www\.)?(?<d>shop)\.test$; return 200 "regex"; }
    server { listen 127.0.0.1:{port}; server_name *.shop.test; return 200 "wildcard"; }
}
"#;

#[test]
fn regex_server_names_come_after_wildcards() {
    let s = Server::start("regexnames", REGEX_NAMES_CONF, 1);
    let a = s.addr();
    let host = |h: &str| {
        raw(
            a,
            format!("GET / HTTP/1.1\r\nHost: {h}\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .body_str()
    };
    assert_eq!(host("shop.test"), "regex");
    assert_eq!(host("api.shop.test"), "wildcard");
    assert_eq!(
        host("www.shop.test"),
        "wildcard",
        "a wildcard wins over a regex"
    );
    assert_eq!(host("WWW2.Shop.Test"), "wildcard");
    assert_eq!(host("other.test"), "default");
}

const NAMED_CAPTURES_CONF: &str = r#"
worker_processes 1;
events { worker_connections 64; }
http {
    access_log off;
    server {
        listen 127.0.0.1:{port};
        location = /status { shard_status; }
        location ~ ^/(?<lang>en|fr)/(?<page>\w+)$ { return 200 "lang=$lang page=$page"; }
        location /r/ {
            rewrite ^/r/(?<id>\d+)$ /item?id=$id last;
        }
        location = /item { return 200 "item $arg_id"; }
        location /h/ {
            if ($http_x_v ~ ^v(?<major>\d+)) { return 200 "major $major"; }
            return 200 "none";
        }
    }
}
"#;

#[test]
fn named_captures_are_variables() {
    let s = Server::start("namedcaps", NAMED_CAPTURES_CONF, 1);
    let a = s.addr();
    assert_eq!(get(a, "/fr/accueil").body_str(), "lang=fr page=accueil");
    assert_eq!(get(a, "/r/42").body_str(), "item 42");
    let r = raw(
        a,
        b"GET /h/x HTTP/1.1\r\nHost: h\r\nX-V: v3.1\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(r.body_str(), "major 3");
    assert_eq!(get(a, "/h/x").body_str(), "none");
}

const PHASES_CONF: &str = r#"
worker_processes 1;
error_log logs/error.log info;
events { worker_connections 64; }
http {
    access_log off;
    charset utf-8;
    server_tokens off;
    map $http_x_tier $tier { default std; ~^gold gold; }
    map $cookie_plan $plan { default free; pro paid; }
    map $tier $level { default 0; gold 9; }
    server {
        listen 127.0.0.1:{port};
        root {dir}/html;
        client_max_body_size 1;
        location = /status { shard_status; }
        location / { try_files $uri @app; }
        location @app { return 200 "app $uri $request_method"; }
        location /deb/ { try_files $uri $uri/ =404; }
        location ~ /alias-re.txt { alias {dir}/html/aliased; try_files $uri =404; }
        location /nest/ { alias {dir}/html/aliased/; location ~ txt { try_files $uri =404; } }
        location = /err302 { error_page 302 /autoloc; return 302 "first"; }
        location /autoloc/ { proxy_pass http://127.0.0.1:1; }
        location = /sent { add_header Cache-Control foo; add_header Cache-Control bar;
            add_header X-Sent $sent_http_cache_control; return 204; }
        location = /tier { return 200 "$tier $plan $level"; }
        location = /hdr { add_header X-Level $level; }
    }
}
"#;

/// What shard did unlike nginx until issue 35: `try_files` entries match files or (written
/// with `/`) directories by their text, a directory without its slash is redirected, `map`s
/// of request headers see the headers, and shard's own error pages carry the settings of the
/// server they are answered in.
#[test]
fn try_files_maps_and_error_pages_as_nginx() {
    let s = Server::start("phases", PHASES_CONF, 1);
    let a = s.addr();
    write_file(&s.dir, "html/index.html", b"index");
    write_file(&s.dir, "html/sub/index.html", b"sub");
    write_file(&s.dir, "html/f.txt", b"file");
    write_file(&s.dir, "html/hdr", b"hdr");
    write_file(&s.dir, "html/deb/sub/index.html", b"deb sub");
    // `try_files $uri @app`: a directory is not a file, so `/` and `/sub/` go to the app.
    assert_eq!(get(a, "/").body_str(), "app / GET");
    assert_eq!(get(a, "/sub/").body_str(), "app /sub/ GET");
    assert_eq!(get(a, "/f.txt").body_str(), "file");
    let r = raw(
        a,
        b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
    );
    assert_eq!((r.status, r.body_str().as_str()), (200, "app / POST"));
    // `try_files $uri $uri/ =404` of a directory without its slash: nginx's 301.
    let r = raw(
        a,
        b"GET /deb/sub?x=1 HTTP/1.1\r\nHost: h.test\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(r.status, 301);
    let want = format!("http://h.test:{}/deb/sub/?x=1", a.port());
    assert_eq!(r.header("Location"), Some(want.as_str()));
    assert_eq!(get(a, "/deb/sub/").body_str(), "deb sub");
    assert_eq!(get(a, "/deb/none").status, 404);
    // `alias` with `try_files`: a regex location's alias is a directory the URI goes under;
    // a nested location without `root` inherits its parent's alias and prefix (nginx).
    write_file(&s.dir, "html/aliased/alias-re.txt", b"re");
    write_file(&s.dir, "html/aliased/n.txt", b"nested");
    assert_eq!(get(a, "/alias-re.txt").body_str(), "re");
    assert_eq!(get(a, "/nest/n.txt").body_str(), "nested");
    assert_eq!(get(a, "/nest/none.txt").status, 404);
    // An `error_page` URI is searched anew, `auto_redirect` included: 301 to `/autoloc/`,
    // the first answer's Location gone.
    let r = get(a, "/err302");
    assert_eq!(r.status, 301);
    assert!(
        r.header("Location")
            .is_some_and(|l| l.ends_with("/autoloc/")),
        "{:?}",
        r.header("Location")
    );
    // `$sent_http_NAME` in `add_header` reads the lines added before it.
    assert_eq!(get(a, "/sent").header("X-Sent"), Some("foo, bar"));
    // Maps of headers and cookies, directly and through another map.
    let r = raw(
        a,
        b"GET /tier HTTP/1.1\r\nHost: h\r\nX-Tier: golden\r\nCookie: a=1; plan=pro\r\n\
          Connection: close\r\n\r\n",
    );
    assert_eq!(r.body_str(), "gold paid 9");
    assert_eq!(get(a, "/tier").body_str(), "std free 0");
    let r = raw(
        a,
        b"GET /hdr HTTP/1.1\r\nHost: h\r\nX-Tier: gold\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(r.header("X-Level"), Some("9"));
    // shard's own error pages: `charset` and `server_tokens` of their server, before the
    // phases (413, a bad Host) as after them.
    let r = raw(
        a,
        b"POST /f.txt HTTP/1.1\r\nHost: Big.Test:8080\r\nContent-Length: 10\r\n\
          Connection: close\r\n\r\n",
    );
    assert_eq!(r.status, 413);
    assert_eq!(r.header("Content-Type"), Some("text/html; charset=utf-8"));
    assert_eq!(r.header("Server"), Some("shard"));
    for host in ["a b", "localhost: evil", "localhost:80/../x"] {
        let head = format!("GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
        let r = raw(a, head.as_bytes());
        assert_eq!(r.status, 400, "Host: {host}");
        assert_eq!(r.header("Content-Type"), Some("text/html; charset=utf-8"));
        assert_eq!(r.header("Server"), Some("shard"));
    }
    assert_eq!(raw(a, b"GET http://h/ HTTP/1.1\r\n\r\n").status, 400);
    // The error log writes the Host header as sent, port and capitals kept.
    wait_for(Duration::from_secs(5), "the 413 in the error log", || {
        error_log(&s)
            .lines()
            .find(|l| l.contains("client intended to send too large body"))
            .map(|l| assert!(l.contains(r#"host: "Big.Test:8080""#), "{l}"))
    });
}

/// `env` is accepted as nginx takes it (`NAME`, `NAME=VALUE`, any number); an empty name is
/// refused. (What it does to a worker's environment is `shard_event::process`'s unit test: a
/// worker's title overwrites its `/proc/PID/environ`.)
#[test]
fn env_is_accepted_as_nginx_takes_it() {
    let conf = "env KEEP_ME;\nenv NEW_ONE=three;\nenv TZ;\nworker_processes 1;\nevents {}\n\
                http {\n    server { listen 127.0.0.1:{port}; location = /status { shard_status; } }\n}\n";
    let s = Server::start("env", conf, 1);
    assert_eq!(get(s.addr(), "/status").status, 200);
    let (code, err) = run_cli(&["-t", "-g", "env =x;"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("invalid value \"=x\""), "{err}");
}

const INDEX_CONF: &str = r#"
worker_processes 1;
error_log logs/error.log info;
events { worker_connections 64; }
http {
    access_log off;
    split_clients "${arg_u}" $variant {
        51.2%  one;
        10%    two;
        *      three;
    }
    map $arg_k $mapped {
        default none;
        include {mapdir}/conf/keys.map;
        ~^x(?<tail>.+)$ got-$1-$tail;
    }
    server {
        listen 127.0.0.1:{port};
        server_name localhost;
        root {dir}/html;
        add_header X-URI $uri;
        location = /status { shard_status; }
        location / { }
        location /php/ { index index.php index.html; }
        location ~ \.php$ { return 200 "php $uri $args"; }
        location /abs/ { index missing.html /target.html; }
        location /loop/ { index /loop/; }
        location /var/ { index $server_name.html; }
        location = /split { return 200 "$variant"; }
        location = /map { return 200 "$mapped"; }
    }
}
"#;

/// nginx's index module: a found index file is an internal redirect to the URI with its
/// name (another location may serve it, `$uri` names it), an absolute name is one at its
/// turn, names may hold variables, and a redirect cycle is a 500. `split_clients` draws as
/// nginx's MurmurHash2 does, and a `map` may `include` its keys.
#[test]
fn index_redirects_split_clients_and_map_include_as_nginx() {
    let dir = temp_dir("index-conf").keep();
    std::fs::write(dir.join("conf/keys.map"), "a 1;\nb 2;\n").unwrap();
    let s = Server::start(
        "index",
        &INDEX_CONF.replace("{mapdir}", dir.to_str().unwrap()),
        1,
    );
    let a = s.addr();
    for (f, body) in [
        ("html/index.html", "root index"),
        ("html/php/index.php", "source"),
        ("html/target.html", "target"),
        ("html/var/localhost.html", "by name"),
        ("html/abs/other.txt", "other"),
    ] {
        write_file(&s.dir, f, body.as_bytes());
    }
    let r = get(a, "/");
    assert_eq!((r.status, r.body_str().as_str()), (200, "root index"));
    assert_eq!(r.header("X-URI"), Some("/index.html"));
    let r = get(a, "/php/?x=1");
    assert_eq!(r.body_str(), "php /php/index.php x=1");
    // An absolute name once the relative one before it is missing from a directory that
    // exists; where the directory is missing, 404.
    let r = get(a, "/abs/");
    assert_eq!(
        (r.body_str().as_str(), r.header("X-URI")),
        ("target", Some("/target.html"))
    );
    assert_eq!(get(a, "/abs/none/").status, 404);
    assert_eq!(get(a, "/loop/").status, 500);
    let r = get(a, "/var/");
    assert_eq!(
        (r.body_str().as_str(), r.header("X-URI")),
        ("by name", Some("/var/localhost.html"))
    );
    // nginx's draw for these values (the shares of MurmurHash2 over `u`): the same values
    // always land in the same share.
    let draws: Vec<String> = (1..=20)
        .map(|u| get(a, &format!("/split?u={u}")).body_str())
        .collect();
    let count = |v: &str| draws.iter().filter(|d| *d == v).count();
    assert_eq!(
        (count("one"), count("two"), count("three")),
        (12, 2, 6),
        "{draws:?}"
    );
    assert_eq!(get(a, "/map?k=b").body_str(), "2");
    assert_eq!(get(a, "/map?k=c").body_str(), "none");
    // A map expression's groups in its value, by number and by name.
    assert_eq!(get(a, "/map?k=xyz").body_str(), "got-yz-yz");
}

const KEEPALIVE_CONF: &str = r#"
worker_processes 1;
events { worker_connections 64; }
http {
    access_log off;
    server {
        listen 127.0.0.1:{port};
        location = /status { shard_status; }
        location /short/ { keepalive_time 300ms; return 200 "t=$connection_time r=$connection_requests"; }
        location /safari/ { keepalive_disable safari; return 200 "s"; }
        location /header/ { keepalive_timeout 30s 9; return 200 "h"; }
        location / { return 200 "ok"; }
    }
}
"#;

/// `keepalive_time` closes a connection that has lived too long after its request under way,
/// `keepalive_disable` turns keep-alive off for nginx's browser list (MSIE 6 after a POST by
/// default, Safari when asked), `$connection_time` counts from the accept.
#[test]
fn keepalive_time_and_keepalive_disable_as_nginx() {
    let s = Server::start("keepalive-time", KEEPALIVE_CONF, 1);
    let mut c = connect(s.addr());
    c.write_all(b"GET /short/ HTTP/1.1\r\nHost: h\r\n\r\n")
        .unwrap();
    let r = read_response(&mut c, false).unwrap();
    assert_eq!(r.header("Connection"), Some("keep-alive"));
    assert!(r.body_str().starts_with("t=0.0"), "{}", r.body_str());
    // The time under test passing, not a wait for the server.
    std::thread::sleep(Duration::from_millis(400));
    c.write_all(b"GET /short/ HTTP/1.1\r\nHost: h\r\n\r\n")
        .unwrap();
    let r = read_response(&mut c, false).unwrap();
    assert_eq!(r.header("Connection"), Some("close"));
    let t: f64 = r.body_str()[2..7].parse().unwrap();
    assert!(t >= 0.4, "{}", r.body_str());
    let ask = |head: &str| {
        let mut c = connect(s.addr());
        c.write_all(head.as_bytes()).unwrap();
        read_response(&mut c, false).unwrap()
    };
    let msie6 = "User-Agent: Mozilla/4.0 (compatible; MSIE 6.0; Windows NT 5.1)\r\n";
    let safari = "User-Agent: Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) \
                  AppleWebKit/605.1.15 (KHTML, like Gecko) Version/16.1 Safari/605.1.15\r\n";
    let post = format!("POST / HTTP/1.1\r\nHost: h\r\n{msie6}Content-Length: 0\r\n\r\n");
    assert_eq!(ask(&post).header("Connection"), Some("close"));
    let get = format!("GET / HTTP/1.1\r\nHost: h\r\n{msie6}\r\n");
    assert_eq!(ask(&get).header("Connection"), Some("keep-alive"));
    let get = format!("GET /safari/ HTTP/1.1\r\nHost: h\r\n{safari}\r\n");
    assert_eq!(ask(&get).header("Connection"), Some("close"));
    let get = format!("GET / HTTP/1.1\r\nHost: h\r\n{safari}\r\n");
    assert_eq!(ask(&get).header("Connection"), Some("keep-alive"));
    // `keepalive_timeout 30s 9`: a kept-alive answer says so; one that closes does not.
    let r = ask("GET /header/ HTTP/1.1\r\nHost: h\r\n\r\n");
    assert_eq!(r.header("Keep-Alive"), Some("timeout=9"));
    assert_eq!(r.body_str(), "h");
    let r = ask("GET /header/ HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n");
    assert_eq!(r.header("Keep-Alive"), None);
}

const GEO_CONF: &str = r#"
worker_processes 1;
events { worker_connections 64; }
http {
    access_log off;
    geo $geo { default world; 127.0.0.0/8 loopback; 127.0.0.2/32 two; ::1 six; }
    geo $arg_ip $from_arg {
        ranges;
        default                 none;
        10.0.0.0-10.0.0.255     ten;
        10.0.0.100-10.0.0.100   hundred;
        delete                  10.0.0.200-10.0.0.255;
    }
    geo $proxied { default none; proxy 127.0.0.1; 192.0.2.0/24 test; 127.0.0.0/8 local; }
    server {
        listen 127.0.0.1:{port};
        location = /status { shard_status; }
        location / { return 200 "$geo $from_arg $proxied"; }
    }
}
"#;

/// `geo`: the longest network, ranges where a later one overrides an earlier one and
/// `delete` cuts, an address variable (not an address: 255.255.255.255), and `proxy` taking
/// the address from `X-Forwarded-For`.
#[test]
fn geo_as_nginx() {
    let s = Server::start("geo", GEO_CONF, 1);
    let ask = |q: &str, xff: &str| {
        let head = format!("GET /?{q} HTTP/1.1\r\nHost: h\r\n{xff}Connection: close\r\n\r\n");
        raw(s.addr(), head.as_bytes()).body_str()
    };
    assert_eq!(ask("ip=10.0.0.1", ""), "loopback ten local");
    assert_eq!(ask("ip=10.0.0.100", ""), "loopback hundred local");
    assert_eq!(ask("ip=10.0.0.201", ""), "loopback none local");
    assert_eq!(ask("ip=nonsense", ""), "loopback none local");
    assert_eq!(
        ask("ip=10.0.1.0", "X-Forwarded-For: 10.1.1.1, 192.0.2.7\r\n"),
        "loopback none test"
    );
}

const REFERER_CONF: &str = r#"
worker_processes 1;
events { worker_connections 64; }
http {
    access_log off;
    server {
        listen 127.0.0.1:{port};
        server_name site.test *.site.test;
        location = /status { shard_status; }
        valid_referers none blocked server_names example.com/pics/ *.friend.test ~\.search\.;
        location / { return 200 "[$invalid_referer]"; }
    }
}
"#;

/// `valid_referers` and `$invalid_referer`, as nginx's referer module.
#[test]
fn valid_referers_as_nginx() {
    let s = Server::start("referer", REFERER_CONF, 1);
    let ask = |referer: &str| {
        let head = format!("GET / HTTP/1.1\r\nHost: h\r\n{referer}Connection: close\r\n\r\n");
        raw(s.addr(), head.as_bytes()).body_str()
    };
    for (r, want) in [
        ("", "[]"),
        ("Referer: no-scheme.test\r\n", "[]"),
        ("Referer: http://site.test/a\r\n", "[]"),
        ("Referer: https://www.site.test:8443/x\r\n", "[]"),
        ("Referer: http://EXAMPLE.com/pics/cat.png\r\n", "[]"),
        ("Referer: http://example.com/other\r\n", "[1]"),
        ("Referer: http://a.b.friend.test/\r\n", "[]"),
        ("Referer: http://friend.test/\r\n", "[1]"),
        ("Referer: https://www.search.engine/?q=1\r\n", "[]"),
        ("Referer: http://evil.test/\r\n", "[1]"),
    ] {
        assert_eq!(ask(r), want, "{r:?}");
    }
}

const REDIRECT_CONF: &str = r#"
worker_processes 1;
events { worker_connections 64; }
http {
    access_log off;
    server {
        listen 127.0.0.1:{port};
        server_name main.test;
        location = /status { shard_status; }
        location /plain { return 301 /to; }
        location /relative { absolute_redirect off; return 301 /to; }
        location /noport { port_in_redirect off; return 301 /to; }
        location /named { server_name_in_redirect on; return 301 /to; }
        location /up/ { proxy_pass http://127.0.0.1:{port1}; }
        location = /up2 { return 200 "exact wins"; }
        location /up2/ { proxy_pass http://127.0.0.1:{port1}; }
    }
    server { listen 127.0.0.1:{port1}; location / { return 200 "upstream $uri"; } }
}
"#;

/// How a redirect to a relative URL is written (`absolute_redirect`, `port_in_redirect`,
/// `server_name_in_redirect`), and nginx's automatic 301 from `/dir` to a `location /dir/`
/// that passes to an upstream.
#[test]
fn redirect_forms_and_auto_redirect_as_nginx() {
    let s = Server::start_ports("redirect-forms", REDIRECT_CONF, 1, 1);
    let a = s.addr();
    let loc = |path: &str| {
        let head = format!("GET {path} HTTP/1.1\r\nHost: Asked.Test\r\nConnection: close\r\n\r\n");
        let r = raw(a, head.as_bytes());
        (r.status, r.header("Location").map(str::to_string))
    };
    let port = a.port();
    assert_eq!(
        loc("/plain").1,
        Some(format!("http://asked.test:{port}/to"))
    );
    assert_eq!(loc("/relative").1.as_deref(), Some("/to"));
    assert_eq!(loc("/noport").1.as_deref(), Some("http://asked.test/to"));
    assert_eq!(loc("/named").1, Some(format!("http://main.test:{port}/to")));
    assert_eq!(
        loc("/up?a=b"),
        (301, Some(format!("http://asked.test:{port}/up/?a=b")))
    );
    assert_eq!(get(a, "/up/x").body_str(), "upstream /up/x");
    assert_eq!(get(a, "/up2").body_str(), "exact wins");
}

const CONDITIONS_CONF: &str = r#"
worker_processes 1;
events { worker_connections 64; }
http {
    access_log off;
    server {
        listen 127.0.0.1:{port};
        root {dir}/html;
        location = /status { shard_status; }
        location /exact/ { }
        location /before/ { if_modified_since before; }
        location /off/ { if_modified_since off; }
        location /daily/ { expires @23h59m; }
    }
}
"#;

/// `if_modified_since`, nginx's 412 preconditions and `expires @TIME`.
#[test]
fn conditional_requests_and_daily_expiry_as_nginx() {
    let s = Server::start("conditions", CONDITIONS_CONF, 1);
    for d in ["exact", "before", "off", "daily"] {
        write_file(&s.dir, &format!("html/{d}/f.txt"), b"x");
    }
    let ask = |path: &str, hdr: &str| {
        let head = format!("GET {path} HTTP/1.1\r\nHost: h\r\n{hdr}Connection: close\r\n\r\n");
        raw(s.addr(), head.as_bytes())
    };
    let r = ask("/exact/f.txt", "");
    let lm = r.header("Last-Modified").unwrap().to_string();
    let etag = r.header("ETag").unwrap().to_string();
    let later = "If-Modified-Since: Fri, 01 Jan 2100 00:00:00 GMT\r\n";
    assert_eq!(
        ask("/exact/f.txt", &format!("If-Modified-Since: {lm}\r\n")).status,
        304
    );
    assert_eq!(ask("/exact/f.txt", later).status, 200);
    assert_eq!(ask("/before/f.txt", later).status, 304);
    assert_eq!(
        ask("/off/f.txt", &format!("If-Modified-Since: {lm}\r\n")).status,
        200
    );
    // Both headers: both must say "not modified".
    let both = format!("If-Modified-Since: {lm}\r\nIf-None-Match: \"other\"\r\n");
    assert_eq!(ask("/exact/f.txt", &both).status, 200);
    assert_eq!(
        ask("/exact/f.txt", &format!("If-Match: {etag}\r\n")).status,
        200
    );
    assert_eq!(ask("/exact/f.txt", "If-Match: \"other\"\r\n").status, 412);
    assert_eq!(
        ask("/exact/f.txt", &format!("If-Match: W/{etag}\r\n")).status,
        412
    );
    let early = "If-Unmodified-Since: Thu, 01 Jan 1970 00:00:01 GMT\r\n";
    assert_eq!(ask("/exact/f.txt", early).status, 412);
    let r = ask("/daily/f.txt", "");
    let max_age: u64 = r
        .header("Cache-Control")
        .and_then(|v| v.strip_prefix("max-age="))
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=86_400).contains(&max_age), "{max_age}");
    assert!(r.header("Expires").unwrap().ends_with(" 23:59:00 GMT"));
}

const AUTOINDEX_CONF: &str = r#"
worker_processes 1;
events { worker_connections 64; }
http {
    access_log off;
    server {
        listen 127.0.0.1:{port};
        root {dir}/html;
        location = /status { shard_status; }
        location /list/ { autoindex on; }
        location /json/ { alias {dir}/html/list/; autoindex on; autoindex_format json; }
        location /closed/ { alias {dir}/html/list/; }
    }
}
"#;

/// `autoindex`: nginx's listing page (directories first, hidden names left out, escaped
/// links) and its JSON form; without it a directory with no index file is 403.
#[test]
fn autoindex_lists_a_directory_as_nginx() {
    let s = Server::start("autoindex", AUTOINDEX_CONF, 1);
    write_file(&s.dir, "html/list/z.txt", b"12345");
    write_file(&s.dir, "html/list/a b/inner.txt", b"x");
    write_file(&s.dir, "html/list/.hidden", b"x");
    let r = get(s.addr(), "/list/");
    assert_eq!(r.status, 200);
    assert_eq!(r.header("Content-Type"), Some("text/html"));
    let body = r.body_str();
    assert!(body.starts_with("<html>\r\n<head><title>Index of /list/</title></head>"));
    let dir = body
        .find("<a href=\"a%20b/\">a b/</a>")
        .expect("the directory");
    let file = body.find("<a href=\"z.txt\">z.txt</a>").expect("the file");
    assert!(dir < file, "directories first: {body}");
    assert!(!body.contains("hidden"), "{body}");
    let j = get(s.addr(), "/json/").body_str();
    assert!(
        j.starts_with("[\r\n{ \"name\":\"a b\", \"type\":\"directory\""),
        "{j}"
    );
    assert!(j.contains("\"name\":\"z.txt\", \"type\":\"file\"") && j.contains("\"size\":5 }"));
    assert_eq!(get(s.addr(), "/closed/").status, 403);
}

const DRY_RUN_CONF: &str = r#"
worker_processes 1;
error_log logs/error.log info;
events { worker_connections 64; }
http {
    log_format st '$uri $limit_req_status $limit_conn_status';
    limit_req_zone $binary_remote_addr zone=one:1m rate=1r/m;
    limit_conn_zone $binary_remote_addr zone=c:1m;
    server {
        listen 127.0.0.1:{port};
        root {dir}/html;
        location = /status { shard_status; access_log off; }
        location /dry/ {
            access_log logs/st.log st;
            limit_req zone=one;
            limit_req_dry_run on;
            limit_conn c 5;
        }
    }
}
"#;

/// `limit_req_dry_run`: nothing is refused or delayed, the log and `$limit_req_status` say
/// what would have been.
#[test]
fn limit_dry_run_counts_without_refusing() {
    let s = Server::start("dry-run", DRY_RUN_CONF, 1);
    write_file(&s.dir, "html/dry/f", b"x");
    for _ in 0..3 {
        assert_eq!(get(s.addr(), "/dry/f").status, 200);
    }
    let log = wait_for(Duration::from_secs(5), "three log lines", || {
        std::fs::read_to_string(s.dir.join("logs/st.log"))
            .ok()
            .filter(|t| t.lines().count() == 3)
    });
    let lines: Vec<&str> = log.lines().collect();
    assert_eq!(lines[0], "/dry/f PASSED PASSED");
    assert_eq!(lines[1], "/dry/f REJECTED_DRY_RUN PASSED");
    assert!(error_log(&s).contains("limiting requests, dry run, excess: 1.000 by zone \"one\""));
}

/// A request `limit_req` delays whose client goes away is let go at once (nginx's
/// `ngx_http_test_reading`), not at the end of its delay (here a minute).
#[test]
fn a_delayed_request_whose_client_left_is_let_go() {
    let conf = "worker_processes 1;\nerror_log logs/error.log info;\nevents {}\nhttp {\n \
         limit_req_zone $binary_remote_addr zone=one:1m rate=1r/m;\n server {\n  \
         listen 127.0.0.1:{port};\n  location = /status { shard_status; }\n  \
         location /slow { root {dir}/html; limit_req zone=one burst=5; }\n }\n}\n";
    let s = Server::start("delayed-gone", conf, 1);
    write_file(&s.dir, "html/slow", b"s");
    assert_eq!(get(s.addr(), "/slow").status, 200);
    let mut c = connect(s.addr());
    c.write_all(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    wait_for(Duration::from_secs(5), "the delay", || {
        error_log(&s).contains("delaying request").then_some(())
    });
    let_go_when_it_closes(&s, c, Duration::from_secs(2), "the delayed request");
    assert!(error_log(&s).contains("client prematurely closed connection while limiting requests"));
}

/// nginx writes each access-log line at once unless `buffer=` is given: the line is in the
/// file as soon as the response is, and a buffered log keeps it until it flushes.
#[test]
fn access_log_lines_are_written_at_once_unless_buffered() {
    let conf = "worker_processes 1;\nevents {}\nhttp {\n    server {\n        \
                listen 127.0.0.1:{port};\n        location = /status { shard_status; access_log off; }\n        \
                location /now { access_log logs/now.log; return 200 \"n\"; }\n        \
                location /later { access_log logs/later.log combined buffer=32k; return 200 \"l\"; }\n    }\n}\n";
    let s = Server::start("log-at-once", conf, 1);
    assert_eq!(get(s.addr(), "/now").body_str(), "n");
    // The response has arrived, so its log line is already written: no wait.
    let now = std::fs::read_to_string(s.dir.join("logs/now.log")).unwrap_or_default();
    assert!(now.contains("\"GET /now HTTP/1.1\" 200"), "{now:?}");
    assert_eq!(get(s.addr(), "/later").body_str(), "l");
    wait_for(Duration::from_secs(5), "the buffered line, flushed", || {
        std::fs::read_to_string(s.dir.join("logs/later.log"))
            .ok()
            .filter(|t| t.contains("/later"))
    });
}

/// `error_page` for a failed upstream, the most common nginx pair there is (`proxy_pass` with
/// `error_page 502 504 /50x.html`): the page is served with the upstream's status, or the
/// status `=CODE` names, through a named location too.
#[test]
fn error_page_answers_a_failed_upstream() {
    let dead = support::upstream::refusing_port();
    let conf = format!(
        "worker_processes 1;\nerror_log logs/error.log info;\nevents {{}}\nhttp {{\n    \
         access_log logs/access.log;\n    server {{\n        listen 127.0.0.1:{{port}};\n        \
         root {{dir}}/html;\n        location = /status {{ shard_status; }}\n        \
         error_page 502 504 /50x.html;\n        location = /50x.html {{ }}\n        \
         location /app/ {{ proxy_pass http://127.0.0.1:{dead}; }}\n        \
         location /soft/ {{ proxy_pass http://127.0.0.1:{dead}; error_page 502 =200 @fallback; }}\n        \
         location @fallback {{ return 200 \"fallback\"; }}\n    }}\n}}\n"
    );
    let s = Server::start("proxy-error-page", &conf, 1);
    write_file(&s.dir, "html/50x.html", b"sorry, we are down");
    let r = get(s.addr(), "/app/x");
    assert_eq!(
        (r.status, r.body_str().as_str()),
        (502, "sorry, we are down")
    );
    let r = get(s.addr(), "/soft/x");
    assert_eq!((r.status, r.body_str().as_str()), (200, "fallback"));
    let log = wait_for(Duration::from_secs(5), "the access log lines", || {
        std::fs::read_to_string(s.dir.join("logs/access.log"))
            .ok()
            .filter(|t| t.contains("/soft/x"))
    });
    assert!(log.contains("\"GET /app/x HTTP/1.1\" 502"), "{log}");
}

/// `proxy_intercept_errors on`: an upstream's 404 for which the location has an `error_page`
/// is replaced by the page; one without an `error_page` passes as it is.
#[test]
fn proxy_intercept_errors_as_nginx() {
    let conf = "worker_processes 1;\nevents {}\nhttp {\n    access_log off;\n    server {\n        \
                listen 127.0.0.1:{port};\n        location = /status { shard_status; }\n        \
                location /i/ { proxy_pass http://127.0.0.1:{port1}; proxy_intercept_errors on;\n            \
                error_page 404 @nf; }\n        location /p/ { proxy_pass http://127.0.0.1:{port1}; error_page 404 @nf; }\n        \
                location @nf { return 404 \"ours\"; }\n    }\n    server { listen 127.0.0.1:{port1};\n        \
                location / { return 404 \"theirs\"; }\n        location /i/ok { return 200 \"fine\"; }\n        \
                location /i/gone { return 410 \"gone\"; } }\n}\n";
    let s = Server::start_ports("intercept", conf, 1, 1);
    let r = get(s.addr(), "/i/x");
    assert_eq!((r.status, r.body_str().as_str()), (404, "ours"));
    assert_eq!(get(s.addr(), "/i/ok").body_str(), "fine");
    let r = get(s.addr(), "/i/gone");
    assert_eq!(
        (r.status, r.body_str().as_str()),
        (410, "gone"),
        "no error_page for 410"
    );
    let r = get(s.addr(), "/p/x");
    assert_eq!(
        (r.status, r.body_str().as_str()),
        (404, "theirs"),
        "off: passed as it is"
    );
}

/// The common fallback pair: `proxy_intercept_errors on; error_page 404 = @fallback;` (or a
/// dead upstream's 502) with a proxied `@fallback`. As nginx, the request goes to the second
/// upstream with its method and the body the first one read (in memory, or in its file),
/// and the answer's status is the fallback's with `=`, the error's without.
#[test]
fn an_error_page_leads_to_another_upstream_with_the_body() {
    let dead = support::upstream::refusing_port();
    let conf = format!(
        "worker_processes 1;\nevents {{}}\nhttp {{\n    access_log off;\n    \
         client_body_buffer_size 1k;\n    server {{\n        listen 127.0.0.1:{{port}};\n        \
         location = /status {{ shard_status; }}\n        \
         location /nf/ {{ proxy_pass http://127.0.0.1:{{port1}}; proxy_intercept_errors on;\n            \
         error_page 404 = @fallback; }}\n        \
         location /down/ {{ proxy_pass http://127.0.0.1:{dead}; error_page 502 @fallback; }}\n        \
         location @fallback {{ rewrite ^ /echo break; proxy_pass http://127.0.0.1:{{port1}}; }}\n    }}\n    \
         server {{ listen 127.0.0.1:{{port1}};\n        location / {{ return 404 \"theirs\"; }}\n        \
         location = /echo {{ proxy_pass http://127.0.0.1:{{port2}};\n            \
         add_header X-Body $request_body; }} }}\n    \
         server {{ listen 127.0.0.1:{{port2}};\n        \
         location / {{ return 200 \"$request_method $content_length\"; }} }}\n}}\n"
    );
    let s = Server::start_ports("error-page-upstream", &conf, 1, 2);
    let r = get(s.addr(), "/nf/x");
    assert_eq!((r.status, r.body_str().as_str()), (200, "GET "));
    // A body in memory, then one in a file (over client_body_buffer_size).
    for len in [5usize, 5000] {
        let body = "b".repeat(len);
        let req = format!(
            "POST /nf/x HTTP/1.1\r\nHost: a\r\nContent-Length: {len}\r\nConnection: close\r\n\r\n{body}"
        );
        let r = raw(s.addr(), req.as_bytes());
        assert_eq!(r.status, 200, "{len}: {}", r.body_str());
        assert_eq!(r.body_str(), format!("POST {len}"));
        if len < 1024 {
            assert_eq!(r.header("x-body"), Some(body.as_str()));
        }
    }
    // Without `=`: the fallback's page with the error's status.
    let r = raw(
        s.addr(),
        b"POST /down/x HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nConnection: close\r\n\r\nabc",
    );
    assert_eq!((r.status, r.body_str().as_str()), (502, "POST 3"));
    assert_eq!(r.header("x-body"), Some("abc"));
}

/// `$upstream_http_NAME` (hidden headers too) and `$upstream_cookie_NAME`, in `add_header`
/// and in the access log.
#[test]
fn upstream_header_and_cookie_variables() {
    let conf = "worker_processes 1;\nevents {}\nhttp {\n    \
                log_format up '$uri x=$upstream_http_x_accel_foo c=$upstream_cookie_sid';\n    \
                server {\n        listen 127.0.0.1:{port};\n        \
                location = /status { shard_status; }\n        \
                location /p/ { proxy_pass http://127.0.0.1:{port1};\n            \
                access_log logs/up.log up;\n            \
                add_header X-Got \"$upstream_http_x_thing|$upstream_cookie_sid\"; }\n    }\n    \
                server { listen 127.0.0.1:{port1}; location / {\n        \
                add_header X-Thing one; add_header X-Accel-Foo hidden;\n        \
                add_header Set-Cookie \"sid=abc; Path=/\"; return 200 \"up\"; }\n        \
                location /p/tab { add_header Set-Cookie \"sid\t=\tx ;\"; return 200 \"up\"; }\n        \
                location /p/sp { add_header Set-Cookie \"sid = x  ;\"; return 200 \"up\"; } }\n}\n";
    let s = Server::start_ports("upstream-vars", conf, 1, 1);
    let r = get(s.addr(), "/p/x");
    assert_eq!(r.body_str(), "up");
    assert_eq!(r.header("X-Got"), Some("one|abc"));
    assert_eq!(r.header("X-Accel-Foo"), None, "hidden from the client");
    let log = std::fs::read_to_string(s.dir.join("logs/up.log")).unwrap_or_default();
    assert_eq!(log.trim_end(), "/p/x x=hidden c=abc");
    // Spaces around the name and the value are skipped, tabs are not (nginx's parser).
    assert_eq!(get(s.addr(), "/p/sp").header("X-Got"), Some("|x"));
    assert_eq!(get(s.addr(), "/p/tab").header("X-Got"), Some("|"));
}

/// `proxy_method` (variables allowed) and `proxy_pass_request_headers off`.
#[test]
fn proxy_method_and_pass_request_headers() {
    let conf = "worker_processes 1;\nevents {}\nhttp {\n    access_log off;\n    server {\n        \
                listen 127.0.0.1:{port};\n        location = /status { shard_status; }\n        \
                location /m/ { proxy_pass http://127.0.0.1:{port1}; proxy_method $arg_m; }\n        \
                location /h/ { proxy_pass http://127.0.0.1:{port1}; proxy_pass_request_headers off;\n            \
                proxy_set_header X-Set yes; }\n    }\n    server { listen 127.0.0.1:{port1};\n        \
                location / { return 200 \"$request_method [$http_x_client] [$http_x_set]\"; } }\n}\n";
    let s = Server::start_ports("proxy-method", conf, 1, 1);
    let ask = |path: &str| {
        let head =
            format!("GET {path} HTTP/1.1\r\nHost: h\r\nX-Client: c\r\nConnection: close\r\n\r\n");
        raw(s.addr(), head.as_bytes()).body_str()
    };
    assert_eq!(ask("/m/x?m=PUT"), "PUT [c] []");
    assert_eq!(
        ask("/m/x"),
        "GET [c] []",
        "an empty method keeps the client's"
    );
    assert_eq!(ask("/h/x"), "GET [] [yes]");
}

/// `etag off` (no `ETag`; `If-None-Match` never 304, `If-Match` 412) and `empty_gif`.
#[test]
fn etag_off_and_empty_gif_as_nginx() {
    let s = Server::start(
        "etag-gif",
        "worker_processes 1;\nevents {}\nhttp {\n server {\n  listen 127.0.0.1:{port};\n  \
         root {dir}/html;\n  location = /status { shard_status; }\n  \
         location /off/ { etag off; }\n  location = /pixel.gif { empty_gif; }\n }\n}\n",
        1,
    );
    write_file(&s.dir, "html/on.txt", b"on");
    write_file(&s.dir, "html/off/x.txt", b"off");
    let r = get(s.addr(), "/on.txt");
    let tag = r.header("etag").expect("etag on by default").to_string();
    let (st, hs, _) = exchange(
        s.addr(),
        &format!("GET /on.txt HTTP/1.1\r\nHost: x\r\nIf-None-Match: {tag}"),
    );
    assert_eq!(st, 304, "{hs:?}");
    let r = get(s.addr(), "/off/x.txt");
    assert_eq!(r.status, 200);
    assert_eq!(r.header("etag"), None);
    assert!(r.header("last-modified").is_some());
    let (st, _, _) = exchange(
        s.addr(),
        "GET /off/x.txt HTTP/1.1\r\nHost: x\r\nIf-None-Match: \"anything\"",
    );
    assert_eq!(st, 200);
    let (st, _, _) = exchange(
        s.addr(),
        "GET /off/x.txt HTTP/1.1\r\nHost: x\r\nIf-Match: \"x\"",
    );
    assert_eq!(st, 412);
    let (st, _, _) = exchange(
        s.addr(),
        "GET /off/x.txt HTTP/1.1\r\nHost: x\r\nIf-Match: *",
    );
    assert_eq!(st, 200);
    let r = get(s.addr(), "/pixel.gif");
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("image/gif"));
    assert!(r.body.starts_with(b"GIF89a\x01\x00\x01\x00") && r.body.ends_with(b";"));
    // nginx's 43 bytes exactly (its LZW block included).
    assert_eq!(r.body.len(), 43);
    assert!(r.body.ends_with(b"\x02\x02\x4c\x01\x00\x3b"));
    let (st, _, _) = exchange(
        s.addr(),
        "POST /pixel.gif HTTP/1.1\r\nHost: x\r\nContent-Length: 0",
    );
    assert_eq!(st, 405);
}

/// `flv`: `start=N` answers the FLV header and the file from byte N, and ranges apply to
/// that body (its length, `Content-Range` and `ETag` are the body's), as nginx's module.
#[test]
fn flv_starts_a_file_after_its_header() {
    let s = Server::start(
        "flv",
        "worker_processes 1;\nevents {}\nhttp {\n server {\n  listen 127.0.0.1:{port};\n  \
         root {dir}/html;\n  location = /status { shard_status; }\n  \
         location /v/ { flv; }\n }\n}\n",
        1,
    );
    let file: Vec<u8> = (0..100)
        .flat_map(|i| format!("X{i:03}XXXXXX").into_bytes())
        .collect();
    write_file(&s.dir, "html/v/t.flv", &file);
    let header = b"FLV\x01\x05\x00\x00\x00\x09\x00\x00\x00\x00";
    // Without `start` (or with 0, a bad number, or one past the end): the file as it is.
    for q in ["", "?start=0", "?start=1x", "?start=1000", "?a=1"] {
        let r = get(s.addr(), &format!("/v/t.flv{q}"));
        assert_eq!(r.status, 200, "{q}");
        assert_eq!(r.body, file, "{q}");
    }
    let r = get(s.addr(), "/v/t.flv?start=100");
    assert_eq!(r.status, 200);
    assert_eq!(r.body, [&header[..], &file[100..]].concat());
    assert_eq!(r.header("content-length"), Some("913"));
    let tag = r.header("etag").unwrap().to_string();
    assert!(
        tag.ends_with("-391\""),
        "the body's length in the ETag: {tag}"
    );
    let range = |spec: &str| {
        exchange(
            s.addr(),
            &format!("GET /v/t.flv?start=100 HTTP/1.1\r\nHost: x\r\nRange: bytes={spec}"),
        )
    };
    let field = |hs: &[(String, String)], n: &str| {
        hs.iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(n))
            .map(|(_, v)| v.clone())
    };
    let (st, hs, body) = range("0-9");
    assert_eq!(st, 206);
    assert_eq!(
        field(&hs, "content-range").as_deref(),
        Some("bytes 0-9/913")
    );
    assert_eq!(body, &header[..10]);
    let (st, hs, body) = range("-10");
    assert_eq!(
        (st, field(&hs, "content-range").as_deref()),
        (206, Some("bytes 903-912/913"))
    );
    assert_eq!(body, b"X099XXXXXX");
    // Across the header and the file.
    let (st, _, body) = range("0-99");
    assert_eq!(st, 206);
    assert_eq!(body, [&header[..], &file[100..187]].concat());
    // Two ranges, one in each part: multipart, each part from its own place.
    let (st, hs, body) = range("1-3,13-22");
    assert_eq!(st, 206);
    assert!(field(&hs, "content-type")
        .unwrap()
        .starts_with("multipart/byteranges"));
    let text = String::from_utf8_lossy(&body);
    assert!(text.contains("\r\n\r\nLV\x01\r\n"), "{text}");
    assert!(text.contains("\r\n\r\nX010XXXXXX\r\n"), "{text}");
    // Not in a location with `flv`: `start` means nothing.
    write_file(&s.dir, "html/t.flv", &file);
    assert_eq!(get(s.addr(), "/t.flv?start=100").body, file);
}

/// `msie_refresh on`: MSIE gets a 200 page that refreshes to the location as written
/// (escaped as nginx's), for `return` and for an `error_page` redirect; others the 301.
#[test]
fn msie_refresh_answers_msie_with_a_page() {
    let s = Server::start(
        "msie-refresh",
        "worker_processes 1;\nevents {}\nhttp {\n server {\n  listen 127.0.0.1:{port};\n  \
         msie_refresh on; gzip on; gzip_min_length 1; gzip_types *;\n  \
         location = /status { shard_status; }\n  \
         location / { return 301 \"te xt\"; }\n  \
         location /ep { return 301; error_page 301 elsewhere; }\n  \
         location /off { msie_refresh off; return 301 text; }\n }\n}\n",
        1,
    );
    let ask = |path: &str, ua: &str| {
        exchange(
            s.addr(),
            &format!("GET {path} HTTP/1.1\r\nHost: x\r\nUser-Agent: {ua}\r\nAccept-Encoding: gzip"),
        )
    };
    let field = |hs: &[(String, String)], n: &str| {
        hs.iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(n))
            .map(|(_, v)| v.clone())
    };
    let (st, hs, body) = ask("/", "Mozilla/4.0 (compatible; MSIE 6.0; Windows NT 5.1)");
    assert_eq!(st, 200);
    assert_eq!(field(&hs, "location"), None);
    assert_eq!(field(&hs, "content-type").as_deref(), Some("text/html"));
    assert_eq!(
        field(&hs, "content-encoding").as_deref(),
        Some("gzip"),
        "the page is filtered"
    );
    let mut page = String::new();
    flate2::read::GzDecoder::new(&body[..])
        .read_to_string(&mut page)
        .unwrap();
    assert_eq!(
        page,
        "<html><head><meta http-equiv=\"Refresh\" content=\"0; URL=te%20xt\"></head>\
         <body></body></html>\r\n"
    );
    let (st, _, _) = ask("/ep", "MSIE 7.0; x");
    assert_eq!(st, 200);
    // Not MSIE (Opera says MSIE too), or `msie_refresh off`: the redirect.
    for (path, ua) in [
        ("/", "Opera/9.80 (MSIE 6.0)"),
        ("/", "curl/8"),
        ("/off", "MSIE 6.0"),
    ] {
        let (st, hs, _) = ask(path, ua);
        assert_eq!(st, 301, "{path} {ua}");
        assert!(field(&hs, "location").is_some());
    }
}

/// nginx's script engine, where it escapes and unescapes: a capture in a `rewrite`'s new
/// arguments is escaped again when the URI came escaped; a redirect's URL is unescaped up to
/// its `?` (printable bytes only); `break` after a rewrite makes `proxy_pass` with a URI
/// send the changed URI whole; an `error_page` after `return 302 URL` keeps the `Location`.
#[test]
fn rewrite_escapes_and_break_as_nginx() {
    let s = Server::start(
        "rewrite-escape",
        "worker_processes 1;\nevents {}\nhttp {\n server {\n  listen 127.0.0.1:{port};\n  \
         location = /status { shard_status; }\n  \
         location /cap { rewrite ^(.*) $1?c=$1; return 200 \"uri:$uri args:$args\"; }\n  \
         location /to { rewrite ^ $arg_r? redirect; }\n  \
         location /break { rewrite ^ /echo; break; proxy_pass http://127.0.0.1:{port}/ignored; }\n  \
         location /echo { return 200 \"uri:$uri\"; }\n  \
         location /ignored { return 200 \"ignored\"; }\n  \
         location /kept { error_page 302 /page; return 302 \"http://x.test/\"; }\n  \
         location = /page { return 200 \"page\"; }\n }\n}\n",
        1,
    );
    let r = get(s.addr(), "/cap/%25?a=b");
    assert_eq!(r.body_str(), "uri:/cap/% args:c=/cap/%25&a=b");
    let r = get(s.addr(), "/cap/x?a=b");
    assert_eq!(
        r.body_str(),
        "uri:/cap/x args:c=/cap/x&a=b",
        "not escaped: not quoted"
    );
    let r = get(s.addr(), "/to?r=http%3A%2F%2Fx.test%2Fa%20b%0D%0Asplit");
    assert_eq!(r.status, 302);
    assert_eq!(r.header("location"), Some("http://x.test/a%20b%0D%0Asplit"));
    let r = get(s.addr(), "/to?r=http%3A%2F%2Fx.test%2F%3Fq%3D1");
    assert_eq!(
        r.header("location"),
        Some("http://x.test/?q%3D1"),
        "nothing after the ?"
    );
    let r = get(s.addr(), "/break");
    assert_eq!(r.body_str(), "uri:/echo");
    let r = get(s.addr(), "/kept");
    assert_eq!(r.status, 302);
    assert_eq!(r.header("location"), Some("http://x.test/"));
    assert_eq!(r.body_str(), "page");
}

/// An upstream's `X-Accel-Charset`: the client gets that charset, the body recoded by a
/// `charset_map` (nginx's `override_charset` header); the header is not passed on, and
/// `proxy_ignore_headers X-Accel-Charset` leaves the answer as it came.
#[test]
fn x_accel_charset_recodes_a_proxied_answer() {
    let s = Server::start(
        "accel-charset",
        "worker_processes 1;\nevents {}\nhttp {\n charset_map B A { 58 59; }\n \
         server {\n  listen 127.0.0.1:{port};\n  root {dir}/html;\n  \
         location = /status { shard_status; }\n  \
         location /front/ { proxy_pass http://127.0.0.1:{port}/b/; }\n  \
         location /plain/ { proxy_pass http://127.0.0.1:{port}/b/; \
         proxy_ignore_headers X-Accel-Charset; }\n  \
         location /b/ { charset B; add_header X-Accel-Charset A; }\n }\n}\n",
        1,
    );
    write_file(&s.dir, "html/b/t.html", b"aXXb");
    let r = get(s.addr(), "/front/t.html");
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("text/html; charset=A"));
    assert_eq!(r.body_str(), "aYYb");
    assert_eq!(r.header("x-accel-charset"), None);
    let r = get(s.addr(), "/plain/t.html");
    assert_eq!(r.header("content-type"), Some("text/html; charset=B"));
    assert_eq!(r.body_str(), "aXXb");
}

/// `proxy_next_upstream_timeout`: no second attempt once it has passed since the first began.
#[test]
fn proxy_next_upstream_timeout_bounds_the_retries() {
    let dead = support::upstream::Blackhole::new();
    let good = support::upstream::Upstream::text("good");
    let conf = format!(
        "worker_processes 1;\nevents {{}}\nhttp {{\n upstream u {{ server 127.0.0.1:{}; server 127.0.0.1:{}; }}\n \
         server {{\n  listen 127.0.0.1:{{port}};\n  location = /status {{ shard_status; }}\n  \
         proxy_connect_timeout 400ms;\n  proxy_socket_keepalive on;\n  \
         location /bounded {{ proxy_next_upstream_timeout 100ms; proxy_pass http://u; }}\n  \
         location /free {{ proxy_pass http://u; }}\n }}\n}}\n",
        dead.port, good.port
    );
    let s = Server::start("nu-timeout", &conf, 1);
    // Round robin starts at the dead peer in both locations' first request.
    let (st, _, _) = exchange(s.addr(), "GET /bounded HTTP/1.1\r\nHost: x");
    assert_eq!(st, 504);
    let (st, _, body) = exchange(s.addr(), "GET /free HTTP/1.1\r\nHost: x");
    assert_eq!(st, 200, "{}", String::from_utf8_lossy(&body));
}

/// `auth_basic` with every htpasswd format nginx reads, `off` in a nested location,
/// `$remote_user`, and nginx's log lines.
#[test]
fn auth_basic_as_nginx() {
    let conf = "worker_processes 1;\nevents {}\nhttp {\n log_format u '$remote_user $status';\n \
        server {\n  listen 127.0.0.1:{port};\n  root {dir}/html;\n  access_log {dir}/logs/u.log u;\n  \
        location = /status { shard_status; }\n  location /private/ {\n   auth_basic \"Staff \\\"only\\\"\";\n   \
        auth_basic_user_file {dir}/htpasswd;\n   location /private/open/ { auth_basic off; }\n  }\n  \
        location /broken/ { auth_basic x; auth_basic_user_file {dir}/missing; }\n  \
        location /var/ { auth_basic v; auth_basic_user_file $arg_f; }\n }\n}\n";
    let s = Server::start("auth-basic", conf, 1);
    std::fs::write(
        s.dir.join("htpasswd"),
        "# comment\nplain:{PLAIN}secret\nsha:{SHA}5en6G6MezRroT3XKqkdPOmY/BfQ=\n\
         ssha:{SSHA}gVK8WC9YyFT1gMsQHTGCgT3sSv5zYWx0\napr:$apr1$xyz$HXgo9gtz4gpj4JWTLYmjB0\n\
         md5:$1$abc$iCQ2D3nhptRYi27fDYv2s1:a comment field\n\
         sha512:$6$saltsalt$TVLlQcbpFVof5W3Yz4DTP6gRstiNuHwwTt6GLc1E5n0U0aDehy0S5knV8wiOQSpT0Y77vwPZN.Pq.H91p5hVO1\n",
    )
    .unwrap();
    // The file is read with the configuration: reload to read it.
    s.signal(libc::SIGHUP);
    write_file(&s.dir, "html/private/x.txt", b"in");
    write_file(&s.dir, "html/private/open/y.txt", b"open");
    let b64 = |t: &str| {
        // A small encoder for the test (the server's decoder is what is tested).
        const A: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        let mut out = String::new();
        for c in t.as_bytes().chunks(3) {
            let n = (u32::from(c[0]) << 16)
                | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
                | u32::from(*c.get(2).unwrap_or(&0));
            for i in 0..4 {
                if i <= c.len() {
                    out.push(A[((n >> (18 - 6 * i)) & 63) as usize] as char);
                } else {
                    out.push('=');
                }
            }
        }
        out
    };
    let ask = |path: &str, cred: Option<&str>| {
        let auth = cred.map_or(String::new(), |c| {
            format!("\r\nAuthorization: Basic {}", b64(c))
        });
        exchange(s.addr(), &format!("GET {path} HTTP/1.1\r\nHost: x{auth}"))
    };
    let (st, hs, _) = wait_for(Duration::from_secs(5), "the reloaded user file", || {
        let r = ask("/private/x.txt", Some("plain:secret"));
        (r.0 == 200).then_some(r)
    });
    assert_eq!(st, 200, "{hs:?}");
    for user in ["sha", "ssha", "apr", "md5", "sha512"] {
        let (st, _, body) = ask("/private/x.txt", Some(&format!("{user}:secret")));
        assert_eq!((st, body.as_slice()), (200, &b"in"[..]), "{user}");
        assert_eq!(
            ask("/private/x.txt", Some(&format!("{user}:wrong"))).0,
            401,
            "{user}"
        );
    }
    let (st, hs, _) = ask("/private/x.txt", None);
    assert_eq!(st, 401);
    let www = hs
        .iter()
        .find(|(k, _)| k == "www-authenticate")
        .map(|(_, v)| v.as_str());
    assert_eq!(www, Some("Basic realm=\"Staff only\""));
    assert_eq!(ask("/private/x.txt", Some("nobody:secret")).0, 401);
    assert_eq!(ask("/private/open/y.txt", None).0, 200);
    assert_eq!(ask("/broken/z", Some("plain:secret")).0, 500);
    // A user file named by variables is read per request, a relative name from the
    // configuration's directory (`conf/`), as nginx (a sandboxed worker may read there).
    write_file(&s.dir, "html/var/v.txt", b"var");
    std::fs::write(s.dir.join("conf/other"), "who:{PLAIN}pw\n").unwrap();
    std::fs::copy(s.dir.join("htpasswd"), s.dir.join("conf/users")).unwrap();
    let (st, _, body) = ask("/var/v.txt?f=users", Some("plain:secret"));
    assert_eq!((st, body.as_slice()), (200, &b"var"[..]));
    assert_eq!(ask("/var/v.txt?f=other", Some("who:pw")).0, 200);
    assert_eq!(ask("/var/v.txt?f=other", Some("plain:secret")).0, 401);
    assert_eq!(ask("/var/v.txt?f=nx", Some("who:pw")).0, 500);
    let log = wait_for(Duration::from_secs(5), "the error lines", || {
        let l = error_log(&s);
        (l.contains("password mismatch") && l.contains("was not found")).then_some(l)
    });
    assert!(log.contains("user \"sha\": password mismatch"), "{log}");
    assert!(log.contains("user \"nobody\" was not found in \""), "{log}");
    let access = wait_for(Duration::from_secs(5), "the access log", || {
        let t = std::fs::read_to_string(s.dir.join("logs/u.log")).unwrap_or_default();
        t.contains("nobody 401").then_some(t)
    });
    assert!(access.contains("plain 200"), "{access}");
}

/// `proxy_cookie_domain` and `proxy_cookie_path` rewrite the upstream's `Set-Cookie`s.
#[test]
fn proxy_cookie_domain_and_path() {
    let up = support::upstream::Upstream::start(|_| support::upstream::Reply::Fixed {
        status: 200,
        headers: vec![
            (
                "Set-Cookie".into(),
                "a=1; Domain=.LOCALHOST; Path=/two/x; HttpOnly".into(),
            ),
            (
                "Set-Cookie".into(),
                "b=2; domain=other.test; path=/one/".into(),
            ),
        ],
        body: b"ok".to_vec(),
    });
    let conf = format!(
        "worker_processes 1;\nevents {{}}\nhttp {{\n server {{\n  listen 127.0.0.1:{{port}};\n  \
         location = /status {{ shard_status; }}\n  \
         location / {{\n   proxy_pass http://127.0.0.1:{};\n   \
         proxy_cookie_domain localhost $host;\n   proxy_cookie_path /two/ /;\n  }}\n  \
         location /off/ {{ proxy_cookie_path off; proxy_cookie_domain off; proxy_pass http://127.0.0.1:{}; }}\n  \
         location /re/ {{ proxy_pass http://127.0.0.1:{};\n   \
         proxy_cookie_domain ~^(.+)\\.test$ $1.org;\n   proxy_cookie_path ~^/(\\w+)/x$ /$1/y;\n   \
         proxy_cookie_flags ~^B secure;\n   proxy_cookie_flags a $arg_f; }}\n }}\n}}\n",
        up.port, up.port, up.port
    );
    let s = Server::start("cookie-rewrite", &conf, 1);
    let (st, hs, _) = exchange(s.addr(), "GET / HTTP/1.1\r\nHost: www.example.org");
    assert_eq!(st, 200);
    let cookies: Vec<&str> = hs
        .iter()
        .filter(|(k, _)| k == "set-cookie")
        .map(|(_, v)| v.as_str())
        .collect();
    assert_eq!(
        cookies,
        vec![
            "a=1; Domain=.www.example.org; Path=/x; HttpOnly",
            "b=2; domain=other.test; path=/one/"
        ]
    );
    // Regular expressions (a domain's without case), their groups; flags by a caseless
    // expression and from a variable.
    let (_, hs, _) = exchange(s.addr(), "GET /re/?f=nohttponly HTTP/1.1\r\nHost: h");
    let cookies: Vec<&str> = hs
        .iter()
        .filter(|(k, _)| k == "set-cookie")
        .map(|(_, v)| v.as_str())
        .collect();
    assert_eq!(
        cookies,
        vec![
            "a=1; Domain=.LOCALHOST; Path=/two/y",
            "b=2; domain=other.org; path=/one/; Secure"
        ]
    );
    let (_, hs, _) = exchange(s.addr(), "GET /off/ HTTP/1.1\r\nHost: www.example.org");
    assert!(hs
        .iter()
        .any(|(k, v)| k == "set-cookie" && v == "a=1; Domain=.LOCALHOST; Path=/two/x; HttpOnly"));
}

/// `add_trailer`, as nginx's trailers.t: an HTTP/1.1 response is sent chunked with the
/// trailers after its last chunk (files, `return`, error pages and proxied answers);
/// `always` ones on any status; empty values not sent; `$sent_trailer_*` sees the trailers
/// before it; a location's own list replaces the server's; none for HTTP/1.0, `HEAD` or
/// `chunked_transfer_encoding off`.
#[test]
fn add_trailer_as_nginx() {
    // The trailers on a server of their own: the harness reads `/status` on `{port}`.
    let conf = "worker_processes 1;\nevents {}\nhttp {\n server {\n  \
        listen 127.0.0.1:{port};\n  location = /status { shard_status; }\n }\n server {\n  \
        listen 127.0.0.1:{port1};\n  server_name localhost;\n  root {dir}/html;\n  \
        add_trailer X-Var $host;\n  add_trailer X-Always $host always;\n  \
        add_trailer X-Empty '';\n  add_trailer X-Sent-HTTP $sent_http_accept_ranges;\n  \
        add_trailer X-Sent-Trailer $sent_trailer_x_var;\n  \
        add_trailer X-Complex $host:$host;\n  \
        location /t1 { }\n  location /nx { }\n  \
        location /empty { add_trailer X-Var $host; }\n  \
        location /not_chunked { chunked_transfer_encoding off; }\n  \
        location /ret { return 200 \"returned\"; }\n  \
        location /proxy { proxy_pass http://127.0.0.1:{port1}/t1; \
        add_trailer X-Length $upstream_response_length; }\n \
        }\n}\n";
    let s = Server::start_ports("add-trailer", conf, 1, 1);
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], s.ports[0]));
    write_file(&s.dir, "html/t1", b"SEE-THIS");
    write_file(&s.dir, "html/not_chunked", b"SEE-THIS");
    let get = |path: &str, version: &str| {
        let (status, hs, body) = exchange(
            addr,
            &format!("GET {path} HTTP/{version}\r\nHost: localhost"),
        );
        let te = hs
            .iter()
            .any(|(k, v)| k == "transfer-encoding" && v == "chunked");
        let cl = hs.iter().any(|(k, _)| k == "content-length");
        (status, te, cl, String::from_utf8_lossy(&body).into_owned())
    };
    let (status, te, cl, body) = get("/t1", "1.1");
    assert_eq!((status, te, cl), (200, true, false), "{body}");
    assert_eq!(
        body,
        "8\r\nSEE-THIS\r\n0\r\nX-Var: localhost\r\nX-Always: localhost\r\n\
         X-Sent-HTTP: bytes\r\nX-Sent-Trailer: localhost\r\nX-Complex: localhost:localhost\r\n\r\n"
    );
    // An error page: only the `always` one.
    let (status, te, _, body) = get("/nx", "1.1");
    assert_eq!((status, te), (404, true));
    assert!(
        body.contains("\r\n0\r\nX-Always: localhost\r\n\r\n"),
        "{body}"
    );
    assert!(!body.contains("X-Var"), "{body}");
    // `return`.
    let (_, te, _, body) = get("/ret", "1.1");
    assert!(
        te && body.starts_with("8\r\nreturned\r\n0\r\nX-Var: localhost\r\n"),
        "{body}"
    );
    // Not chunked: HTTP/1.0, `chunked_transfer_encoding off`, HEAD.
    let (_, te, cl, body) = get("/t1", "1.0");
    assert!(!te && cl && body == "SEE-THIS", "{body}");
    let (_, te, cl, body) = get("/not_chunked", "1.1");
    assert!(!te && cl && body == "SEE-THIS", "{body}");
    let (status, hs, body) = exchange(addr, "HEAD /t1 HTTP/1.1\r\nHost: localhost");
    assert!(status == 200 && body.is_empty());
    assert!(!hs.iter().any(|(k, _)| k == "transfer-encoding"), "{hs:?}");
    // The location's own list: X-Var only, not on a 404.
    let (status, _, _, body) = get("/empty", "1.1");
    assert_eq!(status, 404);
    assert!(
        !body.contains("X-Var") && !body.contains("X-Always"),
        "{body}"
    );
    // Proxied (a known length upstream), the trailer made at the end.
    let (status, te, cl, body) = get("/proxy", "1.1");
    assert_eq!((status, te, cl), (200, true, false), "{body}");
    assert_eq!(body, "8\r\nSEE-THIS\r\n0\r\nX-Length: 8\r\n\r\n");
    // A large file (sendfile, then the same with the file kept open and mapped): one
    // chunk of its length, the trailers after it.
    let big: Vec<u8> = (0..300_000u32).map(|i| b'a' + (i % 26) as u8).collect();
    write_file(&s.dir, "html/t1big", &big);
    for _ in 0..3 {
        let (status, hs, body) = exchange(addr, "GET /t1big HTTP/1.1\r\nHost: localhost");
        assert_eq!(status, 200);
        assert!(hs
            .iter()
            .any(|(k, v)| k == "transfer-encoding" && v == "chunked"));
        let head = format!("{:x}\r\n", big.len());
        assert!(body.starts_with(head.as_bytes()), "chunk size");
        let rest = &body[head.len()..];
        assert!(rest[..big.len()] == big[..], "the file intact");
        assert!(
            rest[big.len()..].starts_with(b"\r\n0\r\nX-Var: localhost\r\n"),
            "{:?}",
            String::from_utf8_lossy(&rest[big.len()..])
        );
    }
    // Kept alive: two responses in a row on one connection, each framed.
    let mut c = connect(addr);
    c.write_all(b"GET /t1 HTTP/1.1\r\nHost: localhost\r\n\r\nGET /ret HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut raw = Vec::new();
    let _ = c.read_to_end(&mut raw);
    let text = String::from_utf8_lossy(&raw);
    assert_eq!(text.matches("HTTP/1.1 200 OK").count(), 2, "{text}");
    assert!(
        text.contains("X-Complex: localhost:localhost\r\n\r\nHTTP/1.1 200 OK"),
        "{text}"
    );
}

/// `charset_map` with `source_charset` (as nginx's charset.t and range.t): a file in one
/// single-byte charset is sent in another, ranges included; a proxied answer is recoded
/// back with `override_charset on`.
#[test]
fn charset_map_recodes_as_nginx() {
    let conf =
        "worker_processes 1;\nevents {}\nhttp {\n charset_map B A {\n  58 59; # X -> Y\n }\n \
        server {\n  listen 127.0.0.1:{port};\n  location = /status { shard_status; }\n }\n \
        server {\n  listen 127.0.0.1:{port1};\n  server_name localhost;\n  root {dir}/html;\n  \
        location /t { charset A; source_charset B; }\n  \
        location /plain { charset A; source_charset A; }\n  \
        location /proxy/ { charset B; override_charset on; \
        proxy_pass http://127.0.0.1:{port1}/; }\n }\n}\n";
    let s = Server::start_ports("charset-map", conf, 1, 1);
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], s.ports[0]));
    write_file(&s.dir, "html/t.html", "X".repeat(99).as_bytes());
    let numbered: String = (0..100).map(|i| format!("X{i:03}XXXXXX")).collect();
    write_file(&s.dir, "html/t2.html", numbered.as_bytes());
    write_file(&s.dir, "html/plain.html", b"XXX");
    write_file(&s.dir, "html/tbig.html", &vec![b'X'; 300_000]);
    let get = |head: &str| exchange(addr, &format!("{head}\r\nHost: localhost"));
    let (status, hs, body) = get("GET /t.html HTTP/1.1");
    assert_eq!(status, 200);
    assert_eq!(body, "Y".repeat(99).as_bytes());
    assert!(hs
        .iter()
        .any(|(k, v)| k == "content-type" && v == "text/html; charset=A"));
    // A range of a recoded file: the same bytes, recoded.
    let (status, hs, body) = get("GET /t2.html HTTP/1.1\r\nRange: bytes=990-1990");
    assert_eq!(status, 206);
    assert!(hs.iter().any(|(k, v)| k == "content-length" && v == "10"));
    assert!(hs
        .iter()
        .any(|(k, v)| k == "content-range" && v == "bytes 990-999/1000"));
    assert_eq!(body, b"Y099YYYYYY");
    let (status, _, body) = get("GET /t2.html HTTP/1.1\r\nRange: bytes=0-9, -10");
    let text = String::from_utf8_lossy(&body);
    assert_eq!(status, 206);
    assert!(
        text.contains("Y000YYYYYY") && text.contains("Y099YYYYYY"),
        "{text}"
    );
    // Read in pieces, each recoded.
    let (_, _, body) = get("GET /tbig.html HTTP/1.1");
    assert!(body.len() == 300_000 && body.iter().all(|&b| b == b'Y'));
    // The same charset: nothing to do.
    assert_eq!(get("GET /plain.html HTTP/1.1").2, b"XXX");
    // Proxied, named A by the upstream (this server's /t.html), recoded to B.
    let (status, hs, body) = get("GET /proxy/t.html HTTP/1.1");
    assert_eq!(status, 200);
    assert_eq!(body, "X".repeat(99).as_bytes());
    assert!(
        hs.iter()
            .any(|(k, v)| k == "content-type" && v == "text/html; charset=B"),
        "{hs:?}"
    );
    // A map nginx refuses.
    let dir = temp_dir("charset-map-t");
    std::fs::write(
        dir.join("conf/t.conf"),
        "events {}\nhttp { charset_map a b { 5G 59; } }\n",
    )
    .unwrap();
    let (code, err) = run_cli(&[
        "-t",
        "-p",
        dir.to_str().unwrap(),
        "-c",
        dir.join("conf/t.conf").to_str().unwrap(),
    ]);
    assert_ne!(code, 0);
    assert!(err.contains("invalid value \"5G 59\""), "{err}");
}

/// `gunzip on`, as nginx's gunzip.t and gunzip_static.t: a gzip-encoded answer (proxied,
/// or a `gzip_static` file, which is served even when the plain file does not exist) is
/// decompressed, every member, for a client that does not take gzip, and passed as it is to
/// one that does; `gzip_vary` names `Accept-Encoding` on both, for GET and HEAD.
#[test]
fn gunzip_as_nginx() {
    use std::io::Write as _;
    let conf = "worker_processes 1;\nevents {}\nhttp {\n server {\n  listen 127.0.0.1:{port};\n  \
        location = /status { shard_status; }\n  \
        location /p/ { gunzip on; gzip_vary on; proxy_pass http://127.0.0.1:{port1}/; \
        proxy_set_header Accept-Encoding gzip; }\n  \
        location /s/ { gunzip on; gzip_vary on; gzip_static always; alias {dir}/html/; }\n  \
        location /error { error_page 500 /s/t1; return 500; }\n }\n \
        server {\n  listen 127.0.0.1:{port1};\n  root {dir}/html;\n  \
        location / { default_type text/plain; gzip_static on; gzip_http_version 1.0; \
        gzip_types text/plain; }\n }\n}\n";
    let s = Server::start_ports("gunzip", conf, 1, 1);
    let plain: String = (0..100).map(|i| format!("X{i:03}XXXXXX")).collect();
    let gz = |data: &[u8]| {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    };
    let one = gz(plain.as_bytes());
    write_file(&s.dir, "html/t1.gz", &one);
    write_file(&s.dir, "html/t2.gz", &[one.clone(), one.clone()].concat());
    write_file(&s.dir, "html/t3", b"not compressed");
    write_file(&s.dir, "html/empty.gz", &gz(b""));
    let vary = |hs: &[(String, String)]| hs.iter().any(|(k, _)| k == "vary");
    let encoded = |hs: &[(String, String)]| hs.iter().any(|(k, _)| k == "content-encoding");
    for base in ["/p/", "/s/"] {
        let get = |path: &str, extra: &str| {
            exchange(
                s.addr(),
                &format!("GET {base}{path} HTTP/1.0\r\nHost: localhost{extra}"),
            )
        };
        let (status, hs, body) = get("t1", "");
        assert_eq!(status, 200, "{base}");
        assert!(!encoded(&hs) && vary(&hs), "{base} {hs:?}");
        assert_eq!(body, plain.as_bytes(), "{base}");
        // A client that takes gzip gets it as it is.
        let (_, hs, body) = exchange(
            s.addr(),
            &format!("GET {base}t1 HTTP/1.1\r\nHost: localhost\r\nAccept-Encoding: gzip"),
        );
        assert!(encoded(&hs), "{base} {hs:?}");
        assert_eq!(body, one, "{base}");
        let (_, _, body) = get("t2", "");
        assert_eq!(body, plain.repeat(2).as_bytes(), "{base}: every member");
        let (status, _, body) = get("empty", "");
        assert!(status == 200 && body.is_empty(), "{base}");
        let (_, hs, _) = get("t3", "");
        assert!(!vary(&hs), "{base}: nothing gzipped, no Vary");
        let (_, hs, body) = exchange(
            s.addr(),
            &format!("HEAD {base}t1 HTTP/1.0\r\nHost: localhost"),
        );
        assert!(
            !encoded(&hs) && vary(&hs) && body.is_empty(),
            "{base} {hs:?}"
        );
    }
    let (status, _, body) = exchange(s.addr(), "GET /error HTTP/1.0\r\nHost: localhost");
    assert_eq!(status, 500);
    assert_eq!(body, plain.as_bytes(), "errors gunzipped");
    // HTTP/1.1: decompressed into chunks (the length is not the upstream's).
    let (status, hs, body) = exchange(s.addr(), "GET /p/t2 HTTP/1.1\r\nHost: localhost");
    assert_eq!(status, 200);
    assert!(hs
        .iter()
        .any(|(k, v)| k == "transfer-encoding" && v == "chunked"));
    let mut rest = &body[..];
    let mut got = Vec::new();
    loop {
        let nl = rest.windows(2).position(|w| w == b"\r\n").unwrap();
        let n = usize::from_str_radix(std::str::from_utf8(&rest[..nl]).unwrap(), 16).unwrap();
        if n == 0 {
            break;
        }
        got.extend_from_slice(&rest[nl + 2..nl + 2 + n]);
        rest = &rest[nl + 2 + n + 2..];
    }
    assert_eq!(got, plain.repeat(2).as_bytes());
}

/// `sub_filter`, as nginx's sub_filter.t and sub_filter_merge.t: strings replaced without
/// case in files, `return` bodies and proxied answers (split across reads), once or every
/// time, with variables on both sides; the validators go unless `sub_filter_last_modified`.
#[test]
fn sub_filter_as_nginx() {
    let conf = "worker_processes 1;\nevents {}\nhttp {\n sub_filter foo bar;\n \
        server {\n  listen 127.0.0.1:{port};\n  location = /status { shard_status; }\n }\n \
        server {\n  listen 127.0.0.1:{port1};\n  root {dir}/html;\n  sub_filter_types *;\n  \
        location / { }\n  \
        location /once { return 200 $arg_b; }\n  \
        location /many { sub_filter_once off; return 200 $arg_b; }\n  \
        location /complex { sub_filter abac _replaced; return 200 $arg_b; }\n  \
        location /var/string { sub_filter X$arg_a _replaced; return 200 $arg_b; }\n  \
        location /var/replacement { sub_filter aab '${arg_a}_replaced'; return 200 $arg_b; }\n  \
        location /lm/ { sub_filter_last_modified on; alias {dir}/html/; }\n  \
        location /up/ { sub_filter_once off; proxy_pass http://127.0.0.1:{port1}/raw/; }\n  \
        location /raw/ { sub_filter_types text/nothing; alias {dir}/html/; }\n  \
        location /notype { proxy_pass http://127.0.0.1:{up}; }\n \
        }\n}\n";
    // An answer without a Content-Type: `sub_filter_types *` filters it too (nginx).
    let up = support::upstream::Upstream::start(|_| support::upstream::Reply::Fixed {
        status: 200,
        headers: vec![],
        body: b"a foo".to_vec(),
    });
    let conf = conf.replace("{up}", &up.port.to_string());
    let s = Server::start_ports("sub-filter", &conf, 1, 1);
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], s.ports[0]));
    write_file(&s.dir, "html/foo.html", b"foo");
    write_file(&s.dir, "html/foo_uc.html", b"FOO");
    write_file(&s.dir, "html/foofoo.html", b"foofoo");
    let big = "xfoo".repeat(100_000);
    write_file(&s.dir, "html/big.txt", big.as_bytes());
    let get = |path: &str| {
        let (status, hs, body) = exchange(addr, &format!("GET {path} HTTP/1.0\r\nHost: x"));
        (status, hs, String::from_utf8_lossy(&body).into_owned())
    };
    for (path, want) in [
        ("/foo.html", "bar"),
        ("/foo_uc.html", "bar"),
        ("/foofoo.html", "barfoo"),
        ("/once?b=foofoo", "barfoo"),
        ("/many?b=foofoo", "barbar"),
        ("/many?b=foofo", "barfo"),
        ("/complex?b=abaabac", "aba_replaced"),
        ("/var/string?a=foo&b=XFOO", "_replaced"),
        ("/var/replacement?a=ee&b=aaab", "aee_replaced"),
    ] {
        assert_eq!(get(path).2, want, "{path}");
    }
    // The validators: gone, or a weak tag with sub_filter_last_modified on.
    let (_, hs, _) = get("/foo.html");
    assert!(
        !hs.iter().any(|(k, _)| k == "last-modified" || k == "etag"),
        "{hs:?}"
    );
    let (_, hs, body) = get("/lm/foo.html");
    assert_eq!(body, "bar");
    assert!(hs.iter().any(|(k, _)| k == "last-modified"), "{hs:?}");
    assert!(
        hs.iter().any(|(k, v)| k == "etag" && v.starts_with("W/")),
        "{hs:?}"
    );
    // Proxied, 400 KB read in pieces, every match replaced (the upstream side untouched).
    let (status, hs, body) = get("/up/big.txt");
    assert_eq!(status, 200);
    assert!(!hs.iter().any(|(k, _)| k == "content-length"), "{hs:?}");
    assert_eq!(body, "xbar".repeat(100_000));
    assert_eq!(get("/raw/big.txt").2, big, "the type not listed: untouched");
    assert_eq!(get("/notype").2, "a bar");
}

/// `ssi on`, as nginx's ssi.t and ssi_if.t: commands, variables, includes as subrequests
/// (virtual, with `set=` and `stub=`), conditions, a proxied document, chunked output on a
/// kept-alive connection, a pipelined pair, errors, a self-inclusion that ends, and a large
/// include that streams through the bounded buffers.
#[test]
fn ssi_as_nginx() {
    let conf = "worker_processes 1;\nevents {}\nhttp {\n \
        server {\n  listen 127.0.0.1:{port};\n  location = /status { shard_status; }\n }\n \
        server {\n  listen 127.0.0.1:{port1};\n  server_name localhost;\n  root {dir}/html;\n  \
        if ($args = found) { return 204; }\n  \
        location / { ssi on; }\n  \
        location /proxy/ { ssi on; proxy_pass http://127.0.0.1:{port1}/local/; }\n  \
        location /local/ { ssi off; alias {dir}/html/; }\n  \
        location /silent/ { ssi on; ssi_silent_errors on; alias {dir}/html/; }\n  \
        location /ret { ssi on; default_type text/html; return 200 'R<!--#echo var=\"arg_a\" -->R'; }\n  \
        location /txt/ { ssi on; alias {dir}/html/; }\n \
        }\n}\n";
    let s = Server::start_ports("ssi", conf, 1, 1);
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], s.ports[0]));
    let files: &[(&str, &str)] = &[
        ("echo.html", "X<!--#echo var=\"arg_test\" -->X"),
        ("inc.html", "X<!--#include virtual=\"/echo.html?test=test\" -->X"),
        ("set.html", "X<!--#set var=\"blah\" value=\"<$arg_v>\" --><!--#echo var=\"blah\" -->|<!--#echo var=\"blah\" encoding=\"none\" -->|<!--#echo var=\"blah\" encoding=\"url\" -->X"),
        ("args.html", "X<!--#include virtual=\"/check?found\" -->X"),
        ("setinc.html", "<!--#include virtual=\"/echo.html?test=in\" set=\"one\" -->[<!--#echo var=\"one\" -->]"),
        ("if.html", "x<!--#if expr=\"$arg_if\" -->IF<!--#elif expr=\"$arg_v = /(CAP\\d).*(CAP\\d)/\" --><!--#echo var=\"2\" --><!--#elif expr=\"$arg_v != yes\" -->NE<!--#else -->ELSE<!--#endif -->x"),
        ("stub.html", "<!--#block name=\"one\" -->S<!--#echo var=\"arg_s\" --><!--#endblock -->x<!--#include virtual=\"/404?$args\" stub=\"one\" -->x"),
        ("bad.html", "a<!--#nosuch -->b<!--#echo -->c<!--#config errmsg=\"E\" --><!--#echo var=x -->d"),
        ("self.html", "s<!--#include virtual=\"/self.html\" -->"),
        ("rel/doc.html", "<!--#include file=\"part.html\" -->"),
        ("rel/part.html", "PART"),
        ("date.html", "<!--#config timefmt=\"%Y\" --><!--#echo var=\"date_gmt\" -->"),
        ("plain.txt", "<!--#echo var=\"arg_a\" -->"),
    ];
    for (name, body) in files {
        write_file(&s.dir, &format!("html/{name}"), body.as_bytes());
    }
    let big = "0123456789abcdef".repeat(64 * 1024);
    write_file(&s.dir, "html/big.txt", big.as_bytes());
    write_file(
        &s.dir,
        "html/big.html",
        b"<<!--#include virtual=\"/big.txt\" -->>",
    );
    let get = |path: &str| {
        let (status, hs, body) = exchange(addr, &format!("GET {path} HTTP/1.0\r\nHost: localhost"));
        (status, hs, String::from_utf8_lossy(&body).into_owned())
    };
    let year = 1970
        + std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
            / 31_556_952;
    for (path, want) in [
        ("/echo.html", "X(none)X".to_string()),
        ("/echo.html?test=", "XX".into()),
        // A name without `=` is no argument (nginx's `ngx_http_arg`).
        ("/echo.html?test", "X(none)X".into()),
        ("/echo.html?a=b&test=t&c=d", "XtX".into()),
        ("/inc.html", "XXtestXX".into()),
        (
            "/set.html?v=a%20b",
            "X&lt;a%20b&gt;|<a%20b>|%3Ca%2520b%3EX".into(),
        ),
        ("/args.html", "XX".into()),
        ("/args.html?wasargs", "XX".into()),
        ("/setinc.html", "[XinX]".into()),
        ("/if.html?if=1&v=no", "xIFx".into()),
        ("/if.html?v=hereCAP1andCAP2", "xCAP2x".into()),
        ("/if.html?v=no", "xNEx".into()),
        ("/if.html?v=yes", "xELSEx".into()),
        ("/stub.html?s=T", "xSTx".into()),
        ("/proxy/echo.html?test=P", "XPX".into()),
        (
            "/local/echo.html?test=P",
            "X<!--#echo var=\"arg_test\" -->X".into(),
        ),
        ("/ret?a=Q", "RQR".into()),
        ("/rel/doc.html", "PART".into()),
        ("/date.html", year.to_string()),
        ("/plain.txt?a=1", "<!--#echo var=\"arg_a\" -->".into()),
        ("/txt/plain.txt?a=1", "<!--#echo var=\"arg_a\" -->".into()),
    ] {
        let (status, hs, body) = get(path);
        assert_eq!(
            (status, body.as_str()),
            (200, want.as_str()),
            "{path}: {hs:?}"
        );
    }
    // Errors: nginx's message where each failed command was, or nothing when silent.
    let e = "[an error occurred while processing the directive]";
    assert_eq!(get("/bad.html").2, format!("a{e}b{e}cEd"));
    assert_eq!(get("/silent/bad.html").2, "abcd");
    let log = error_log(&s);
    assert!(log.contains("invalid SSI command: \"nosuch\""), "{log}");
    assert!(
        log.contains("mandatory \"var\" parameter is absent in \"echo\" SSI command"),
        "{log}"
    );
    // A document that includes itself ends (nginx's subrequest limit) rather than looping.
    let (status, _, body) = get("/self.html");
    assert_eq!(status, 200);
    assert!(body.starts_with("sss") && body.contains(e), "{body}");
    // The headers: no length, ranges or validators; HTTP/1.0 gets the body until the close.
    let (_, hs, _) = get("/echo.html");
    for h in ["content-length", "accept-ranges", "last-modified", "etag"] {
        assert!(!hs.iter().any(|(k, _)| k == h), "{h}: {hs:?}");
    }
    assert!(
        hs.iter().any(|(k, v)| k == "connection" && v == "close"),
        "{hs:?}"
    );
    // HTTP/1.1: chunked, the connection kept, and two SSI requests pipelined come back in
    // order.
    let mut c = connect(addr);
    c.write_all(
        b"GET /inc.html HTTP/1.1\r\nHost: localhost\r\n\r\nGET /echo.html?test=2 HTTP/1.1\r\nHost: localhost\r\n\r\n",
    )
    .unwrap();
    // Both may come in one read: the bytes are read until the second's last chunk, then cut.
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while got.windows(5).filter(|w| w == b"0\r\n\r\n").count() < 2 {
        let n = c.read(&mut buf).expect("the pipelined answers");
        assert!(n > 0, "closed after {}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&got).into_owned();
    let bodies: Vec<String> = text
        .split("HTTP/1.1 200 OK\r\n")
        .skip(1)
        .map(|r| {
            assert!(r.contains("Transfer-Encoding: chunked\r\n"), "{r}");
            let (_, mut rest) = r.split_once("\r\n\r\n").unwrap();
            let mut body = String::new();
            loop {
                let (size, after) = rest.split_once("\r\n").unwrap();
                let n = usize::from_str_radix(size, 16).unwrap();
                if n == 0 {
                    break;
                }
                body.push_str(&after[..n]);
                rest = &after[n + 2..];
            }
            body
        })
        .collect();
    assert_eq!(bodies, ["XXtestXX", "X2X"]);
    c.write_all(b"GET /big.html HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .unwrap();
    let r3 = read_response(&mut c, false).unwrap();
    assert_eq!(r3.body.len(), big.len() + 2);
    assert!(
        r3.body_str() == format!("<{big}>"),
        "the large include whole and in order"
    );
    // HEAD: the head alone.
    let r = raw(
        addr,
        b"HEAD /inc.html HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(r.status, 200);
    assert!(r.body.is_empty());
}

/// `add_before_body` and `add_after_body`, as nginx's addition.t and proxy_extra_data.t:
/// 200 answers of the listed types get the subrequests' bodies around theirs (not other
/// statuses, other types, or subrequests), proxied answers too, unless the upstream's
/// answer was cut short.
#[test]
fn addition_as_nginx() {
    let conf = "worker_processes 1;\nevents {}\nhttp {\n \
        server {\n  listen 127.0.0.1:{port};\n  location = /status { shard_status; }\n }\n \
        server {\n  listen 127.0.0.1:{port1};\n  root {dir}/html;\n  \
        location /regular { return 200 body; }\n  \
        location /b.html { add_before_body /add_before; return 200 body; }\n  \
        location /a.html { add_after_body /add_after; return 200 body; }\n  \
        location /ba.html { add_before_body /add_before; add_after_body /add_after; return 200 body; }\n  \
        location /notype { add_before_body /add_before; return 200 body; }\n  \
        location /notype2 { addition_types text/plain; add_after_body /add_after; return 200 body; }\n  \
        location /add_before { return 200 before; }\n  \
        location /add_after { return 200 after; }\n  \
        location /self.html { add_after_body /self.html; return 200 self; }\n  \
        location /r202.html { add_after_body /add_after; return 202 body; }\n  \
        location /files/ { add_after_body /add_after; alias {dir}/html/; }\n  \
        location /up/ { add_after_body /add_after; proxy_pass http://127.0.0.1:{port2}/; }\n \
        }\n}\n";
    let s = Server::start_ports("addition", conf, 1, 2);
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], s.ports[0]));
    write_file(&s.dir, "html/f.html", b"file");
    // The upstream: a whole answer without a length, then one cut short of its length.
    let up = std::net::TcpListener::bind(("127.0.0.1", s.ports[1])).unwrap();
    let upstream = std::thread::spawn(move || {
        for answer in [
            &b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nConnection: close\r\n\r\nSEE-THIS"[..],
            &b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: 100\r\n\r\nSHORT"[..],
        ] {
            let (mut c, _) = up.accept().unwrap();
            let mut buf = [0u8; 4096];
            let _ = c.read(&mut buf);
            c.write_all(answer).unwrap();
        }
    });
    let get = |path: &str, version: &str| {
        let (status, _, body) = exchange(
            addr,
            &format!("GET {path} HTTP/{version}\r\nHost: localhost"),
        );
        (status, String::from_utf8_lossy(&body).into_owned())
    };
    for (path, want) in [
        ("/regular", (200, "body")),
        ("/b.html", (200, "beforebody")),
        ("/a.html", (200, "bodyafter")),
        ("/ba.html", (200, "beforebodyafter")),
        ("/notype", (200, "body")),
        ("/notype2", (200, "bodyafter")),
        ("/self.html", (200, "selfself")),
        ("/r202.html", (202, "body")),
        ("/files/f.html", (200, "fileafter")),
    ] {
        let (status, body) = get(path, "1.0");
        assert_eq!((status, body.as_str()), want, "{path}");
    }
    // HTTP/1.1: chunked, and the same bytes.
    let (_, body) = get("/ba.html", "1.1");
    assert_eq!(body, "6\r\nbefore\r\n4\r\nbody\r\n5\r\nafter\r\n0\r\n\r\n");
    // Proxied: an answer that ends with its connection gets the addition; one cut short
    // does not.
    assert_eq!(get("/up/x.html", "1.0"), (200, "SEE-THISafter".to_string()));
    let (status, body) = get("/up/short.html", "1.0");
    assert_eq!(status, 200);
    assert!(
        body.starts_with("SHORT") && !body.contains("after"),
        "{body}"
    );
    upstream.join().unwrap();
}

/// `proxy_pass` inside `if` and inside `limit_except`, as nginx's proxy_if.t: a block with a
/// `proxy_pass` is a location of its own (the last `if` that holds decides; one without a
/// `proxy_pass` is its location's), nested locations keep their own, and a URI part there is
/// refused as nginx refuses it.
#[test]
fn proxy_pass_in_if_and_limit_except() {
    let conf = "worker_processes 1;\nevents {}\nhttp {\n \
        server {\n  listen 127.0.0.1:{port};\n  location = /status { shard_status; }\n }\n \
        server {\n  listen 127.0.0.1:{port1};\n  root {dir}/html;\n  \
        location /uri { proxy_pass http://127.0.0.1:{port2}/replacement;\n   \
        if ($arg_if) { set $x 1; }\n   \
        location /uri/inner { if ($arg_if) { set $y 1; } }\n  }\n  \
        location /vars { proxy_pass http://127.0.0.1:{port2}/outer/$host;\n   \
        if ($arg_if) { proxy_pass http://127.0.0.1:{port2}; }\n   \
        if ($arg_other) { set $z 1; }\n   \
        location /vars/inner { proxy_pass http://127.0.0.1:{port2}; }\n  }\n  \
        location /lmt { proxy_pass http://127.0.0.1:{port2}/replacement;\n   \
        limit_except POST { proxy_pass http://127.0.0.1:{port2}; }\n  }\n \
        }\n \
        server {\n  listen 127.0.0.1:{port2};\n  return 200 \"uri:$uri\";\n }\n}\n";
    let s = Server::start_ports("proxy-if", conf, 1, 2);
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], s.ports[0]));
    let ask = |method: &str, path: &str| {
        let (status, _, body) = exchange(
            addr,
            &format!("{method} {path} HTTP/1.0\r\nHost: localhost\r\nContent-Length: 0"),
        );
        (status, String::from_utf8_lossy(&body).into_owned())
    };
    for (method, path, want) in [
        ("GET", "/uri", (200, "uri:/replacement")),
        ("GET", "/uri?if=1", (200, "uri:/replacement")),
        ("GET", "/uri/inner", (404, "")),
        ("GET", "/uri/inner?if=1", (404, "")),
        ("GET", "/vars", (200, "uri:/outer/localhost")),
        ("GET", "/vars?if=1", (200, "uri:/vars")),
        // The last `if` that holds decides: this one has no proxy_pass of its own.
        ("GET", "/vars?if=1&other=1", (200, "uri:/outer/localhost")),
        ("GET", "/vars/inner?if=1", (200, "uri:/vars/inner")),
        ("GET", "/lmt", (200, "uri:/lmt")),
        ("POST", "/lmt", (200, "uri:/replacement")),
    ] {
        let (status, body) = ask(method, path);
        if want.0 == 404 {
            assert_eq!(status, 404, "{method} {path}");
        } else {
            assert_eq!((status, body.as_str()), want, "{method} {path}");
        }
    }
    // A URI part inside `if` is refused at -t, in nginx's words.
    let dir = temp_dir("proxy-if-uri");
    let bad = dir.join("bad.conf");
    std::fs::write(
        &bad,
        "events {}\nhttp {\n server {\n  listen 127.0.0.1:1;\n  location / {\n   \
         if ($arg_a) { proxy_pass http://127.0.0.1:2/x; }\n  }\n }\n}\n",
    )
    .unwrap();
    let (code, out) = run_cli(&["-t", "-c", bad.to_str().unwrap()]);
    assert_ne!(code, 0);
    assert!(out.contains("\"proxy_pass\" cannot have URI part"), "{out}");
}

/// `proxy_store`, as nginx's proxy_store.t: a 200 answer to `GET` is saved where `root`
/// maps its URI (`on`) or at a path with variables, with `proxy_store_access`'s mode and the
/// upstream's `Last-Modified`; not for `HEAD`, and an answer cut short leaves no file and no
/// temporary one.
#[test]
fn proxy_store_as_nginx() {
    let conf = "worker_processes 1;\nevents {}\nhttp {\n \
        server {\n  listen 127.0.0.1:{port};\n  location = /status { shard_status; }\n }\n \
        server {\n  listen 127.0.0.1:{port1};\n  \
        location /on/ { root {dir}/mapped; proxy_pass http://127.0.0.1:{port2}/; proxy_store on; }\n  \
        location /path/ { proxy_pass http://127.0.0.1:{port2}/;\n   \
        proxy_store {dir}/custom$uri; proxy_store_access user:rw group:r all:r; }\n  \
        location /cut/ { root {dir}/cut; proxy_pass http://127.0.0.1:{port3}/; proxy_store on; }\n \
        }\n \
        server {\n  listen 127.0.0.1:{port2};\n  root {dir}/html;\n }\n}\n";
    let s = Server::start_ports("proxy-store", conf, 1, 3);
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], s.ports[0]));
    // The workers (`nobody` under a root test) make the directories below these.
    for d in ["mapped", "custom", "cut"] {
        use std::os::unix::fs::PermissionsExt;
        let d = s.dir.join(d);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o777)).unwrap();
    }
    write_file(&s.dir, "html/a.html", b"SEE-THIS");
    write_file(&s.dir, "html/b.html", b"NOT-STORED");
    let up = std::net::TcpListener::bind(("127.0.0.1", s.ports[2])).unwrap();
    let cut = std::thread::spawn(move || {
        let (mut c, _) = up.accept().unwrap();
        let mut buf = [0u8; 4096];
        let _ = c.read(&mut buf);
        c.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nSHORT")
            .unwrap();
    });
    let get =
        |m: &str, path: &str| exchange(addr, &format!("{m} {path} HTTP/1.0\r\nHost: localhost")).0;
    assert_eq!(get("GET", "/on/a.html"), 200);
    let stored = s.dir.join("mapped/on/a.html");
    assert_eq!(std::fs::read(&stored).unwrap(), b"SEE-THIS");
    // The file's time is the upstream's Last-Modified (the source file's).
    let src = std::fs::metadata(s.dir.join("html/a.html")).unwrap();
    let got = std::fs::metadata(&stored).unwrap();
    let secs = |m: &std::fs::Metadata| {
        m.modified()
            .unwrap()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
    };
    assert_eq!(secs(&got), secs(&src));
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(got.permissions().mode() & 0o777, 0o600);
    assert_eq!(get("GET", "/path/a.html"), 200);
    let custom = std::fs::metadata(s.dir.join("custom/path/a.html")).unwrap();
    assert_eq!(custom.permissions().mode() & 0o777, 0o644);
    // HEAD is not stored.
    assert_eq!(get("HEAD", "/on/b.html"), 200);
    assert!(!s.dir.join("mapped/on/b.html").exists());
    // Cut short: no file, and no temporary one left beside it.
    let _ = get("GET", "/cut/x.html");
    cut.join().unwrap();
    wait_for(Duration::from_secs(5), "no file left", || {
        let left = std::fs::read_dir(s.dir.join("cut/cut"))
            .map(|d| d.flatten().count())
            .unwrap_or(0);
        (left == 0).then_some(())
    });
}

/// `post_action`, as nginx's post_action.t: once the request is answered, a request to the
/// URI runs beside it (here proxied, so that another server logs it), its answer unread.
#[test]
fn post_action_as_nginx() {
    let conf = "worker_processes 1;\nevents {}\nhttp {\n \
        server {\n  listen 127.0.0.1:{port};\n  location = /status { shard_status; }\n }\n \
        server {\n  listen 127.0.0.1:{port1};\n  \
        location / { post_action /post; return 200 SEE-THIS; }\n  \
        location /none { post_action off; return 200 NONE; }\n  \
        location /post { proxy_pass http://127.0.0.1:{port2}/hit; }\n \
        }\n \
        server {\n  listen 127.0.0.1:{port2};\n  access_log {dir}/logs/post.log;\n  \
        return 200 HIDDEN;\n }\n}\n";
    let s = Server::start_ports("post-action", conf, 1, 2);
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], s.ports[0]));
    let (status, _, body) = exchange(addr, "GET /x?a=1 HTTP/1.0\r\nHost: localhost");
    assert_eq!(
        (status, String::from_utf8_lossy(&body).as_ref()),
        (200, "SEE-THIS")
    );
    let log = wait_for(Duration::from_secs(5), "the post action", || {
        let l = std::fs::read_to_string(s.dir.join("logs/post.log")).unwrap_or_default();
        l.contains("GET /hit ").then_some(l)
    });
    assert_eq!(log.lines().count(), 1, "{log}");
    let (_, _, body) = exchange(addr, "GET /none HTTP/1.0\r\nHost: localhost");
    assert_eq!(body, b"NONE");
    // A named location there is refused at -t, in words that say so.
    let dir = temp_dir("post-action-named");
    let bad = dir.join("bad.conf");
    std::fs::write(
        &bad,
        "events {}\nhttp {\n server {\n  listen 127.0.0.1:1;\n  post_action @x;\n }\n}\n",
    )
    .unwrap();
    let (code, out) = run_cli(&["-t", "-c", bad.to_str().unwrap()]);
    assert_ne!(code, 0);
    assert!(out.contains("\"post_action\" to a named location"), "{out}");
}

/// `proxy_force_ranges`, as nginx's proxy_force_ranges.t: an uncached proxied 200 serves one
/// byte range (the upstream here ignores ranges, `max_ranges 0`), unless `If-Range` names
/// another answer; without it, the whole answer.
#[test]
fn proxy_force_ranges_as_nginx() {
    let conf = "worker_processes 1;\nevents {}\nhttp {\n \
        server {\n  listen 127.0.0.1:{port};\n  location = /status { shard_status; }\n }\n \
        server {\n  listen 127.0.0.1:{port1};\n  \
        location /force/ { proxy_pass http://127.0.0.1:{port2}/; proxy_force_ranges on; }\n  \
        location /plain/ { proxy_pass http://127.0.0.1:{port2}/; }\n \
        }\n \
        server {\n  listen 127.0.0.1:{port2};\n  root {dir}/html;\n  max_ranges 0;\n }\n}\n";
    let s = Server::start_ports("force-ranges", conf, 1, 2);
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], s.ports[0]));
    write_file(&s.dir, "html/t.html", b"SEE-THIS");
    let ask = |path: &str, extra: &str| {
        let mut head = format!("GET {path} HTTP/1.0\r\nHost: localhost");
        if !extra.is_empty() {
            head.push_str("\r\n");
            head.push_str(extra);
        }
        let (status, hs, body) = exchange(addr, &head);
        (status, hs, String::from_utf8_lossy(&body).into_owned())
    };
    let (status, hs, body) = ask("/force/t.html", "Range: bytes=4-");
    assert_eq!((status, body.as_str()), (206, "THIS"));
    assert!(
        hs.iter()
            .any(|(k, v)| k == "content-range" && v == "bytes 4-7/8"),
        "{hs:?}"
    );
    assert_eq!(ask("/plain/t.html", "Range: bytes=4-").2, "SEE-THIS");
    // If-Range: the answer's own date gives the range, another date the whole.
    let lm = ask("/plain/t.html", "").1;
    let lm = lm
        .iter()
        .find(|(k, _)| k == "last-modified")
        .map(|(_, v)| v.clone())
        .unwrap();
    assert_eq!(
        ask(
            "/force/t.html",
            &format!("Range: bytes=4-\r\nIf-Range: {lm}")
        )
        .2,
        "THIS"
    );
    let (status, _, body) = ask(
        "/force/t.html",
        "Range: bytes=4-\r\nIf-Range: Mon, 28 Sep 1970 06:00:00 GMT",
    );
    assert_eq!((status, body.as_str()), (200, "SEE-THIS"));
}

/// `auth_request` and `auth_request_set`, as nginx's auth_request_satisfy.t: the
/// subrequest's 2xx lets the request
/// through, 401/403 refuse it, anything else is a 500; with `satisfy all` the first refusal
/// wins, with `satisfy any` one pass is enough (a 401 met on the way is kept). A proxied
/// subrequest waits for its upstream (here a server of the same process), and a body sent
/// with the main request still reaches the main location.
#[test]
fn auth_request_as_nginx() {
    let conf = "worker_processes 1;\nevents {}\nhttp {\n server {\n  listen 127.0.0.1:{port};\n  \
        location = /status { shard_status; }\n  location / { return 444; }\n  \
        location /all/allow { satisfy all; allow all; auth_request /auth; }\n  \
        location /all/deny { satisfy all; deny all; auth_request /auth; }\n  \
        location /all/basic { satisfy all; auth_basic \"r\"; \
        auth_basic_user_file {dir}/htpasswd; auth_request /auth; }\n  \
        location /any/allow { satisfy any; allow all; auth_request /auth; }\n  \
        location /any/deny { satisfy any; deny all; auth_request /auth; }\n  \
        location /any/basic { satisfy any; auth_basic \"r\"; \
        auth_basic_user_file {dir}/htpasswd; auth_request /auth; }\n  \
        location = /auth {\n   if ($request_uri ~ \"open$\") { return 204; }\n   \
        if ($request_uri ~ \"unauthorized$\") { return 401; }\n   \
        if ($request_uri ~ \"forbidden$\") { return 403; }\n  }\n  \
        location /up/ { auth_request /auth-up; auth_request_set $auth_user $upstream_http_x_user; \
        proxy_set_header X-User $auth_user; proxy_pass http://127.0.0.1:{port1}/echo/; }\n  \
        location = /auth-up { proxy_pass http://127.0.0.1:{port1}/check; \
        proxy_pass_request_body off; proxy_set_header Content-Length \"\"; }\n  \
        location = /args { auth_request /auth-up; auth_request_set $args \"set=1\"; \
        proxy_pass http://127.0.0.1:{port1}/echo-args; }\n  \
        location /twice/ { auth_request /auth-up; error_page 404 = /second; }\n  \
        location /static/ { auth_request /auth-up; }\n  \
        location = /second { auth_request /auth-up; auth_request_set $u2 $upstream_http_x_user; \
        proxy_set_header X-User $u2; proxy_pass http://127.0.0.1:{port1}/echo/; }\n }\n \
        server {\n  listen 127.0.0.1:{port1};\n  \
        location = /check {\n   add_header X-User alice;\n   if ($http_x_token = good) { return 204; }\n   \
        if ($http_x_token = bad) { return 403; }\n   \
        add_header WWW-Authenticate 'Bearer realm=\"up\"' always;\n   return 401;\n  }\n  \
        location /echo/ { return 200 \"in $request_method $uri $content_length $http_x_user\"; }\n  \
        location = /echo-args { return 200 \"args $args\"; }\n }\n}\n";
    let s = Server::start_ports("auth-request", conf, 1, 1);
    std::fs::write(s.dir.join("htpasswd"), "user:{PLAIN}secret\n").unwrap();
    s.signal(libc::SIGHUP);
    let st = |path: &str| exchange(s.addr(), &format!("GET {path} HTTP/1.0\r\nHost: x")).0;
    wait_for(Duration::from_secs(5), "the user file", || {
        (st("/all/basic+open") == 401).then_some(())
    });
    for (path, want) in [
        ("/all/allow+open", 404),
        ("/all/allow+unauthorized", 401),
        ("/all/allow+forbidden", 403),
        ("/all/deny+open", 403),
        ("/all/deny+unauthorized", 403),
        ("/all/basic+open", 401),
        ("/all/basic+forbidden", 401),
        ("/any/allow+unauthorized", 404),
        ("/any/deny+open", 404),
        ("/any/deny+unauthorized", 401),
        ("/any/deny+forbidden", 403),
        ("/any/basic+open", 404),
        ("/any/basic+unauthorized", 401),
        ("/any/basic+forbidden", 401),
    ] {
        assert_eq!(st(path), want, "{path}");
    }
    // Proxied: the upstream's answer decides; the main request's body goes on.
    let mut c = connect(s.addr());
    c.write_all(
        b"POST /up/x HTTP/1.1\r\nHost: x\r\nX-Token: good\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello",
    )
    .unwrap();
    let mut raw = Vec::new();
    let _ = c.read_to_end(&mut raw);
    let text = String::from_utf8_lossy(&raw);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    // `auth_request_set` took the upstream's X-User for the main request's header.
    assert!(text.ends_with("in POST /echo/x 5 alice"), "{text}");
    // A main request that is not proxied still sends its headers with the proxied
    // subrequest (the token decides: a good one reaches the missing file).
    for (token, want) in [("good", 404), ("bad", 403)] {
        let (status, _, _) = exchange(
            s.addr(),
            &format!("GET /static/f HTTP/1.1\r\nHost: x\r\nX-Token: {token}"),
        );
        assert_eq!(status, want, "{token}");
    }
    // `auth_request_set $args`: the arguments of the request that goes on.
    let (status, _, body) = exchange(
        s.addr(),
        "GET /args?old=1 HTTP/1.1\r\nHost: x\r\nX-Token: good",
    );
    assert_eq!(
        (status, String::from_utf8_lossy(&body).as_ref()),
        (200, "args set=1")
    );
    // An error_page's location asks its own auth_request (an internal redirect starts the
    // modules afresh): a bad token is refused there too, a good one gets its variables.
    let (status, _, body) = exchange(
        s.addr(),
        "GET /twice/missing HTTP/1.1\r\nHost: x\r\nX-Token: good",
    );
    assert_eq!(
        (status, String::from_utf8_lossy(&body).as_ref()),
        (200, "in GET /echo/  alice")
    );
    for (token, want) in [("bad", 403), ("none", 401)] {
        let (status, hs, _) = exchange(
            s.addr(),
            &format!("GET /up/x HTTP/1.1\r\nHost: x\r\nX-Token: {token}"),
        );
        assert_eq!(status, want, "{token}");
        if want == 401 {
            assert!(
                hs.iter()
                    .any(|(k, v)| k == "www-authenticate" && v == "Bearer realm=\"up\""),
                "the upstream's challenge passed: {hs:?}"
            );
        }
    }
}

/// `auth_delay`: a refused password (or none) is answered 401 only after the delay, with
/// nginx's log line; a good one is not delayed.
#[test]
fn auth_delay_holds_a_refused_password() {
    let conf = "worker_processes 1;\nerror_log logs/error.log info;\nevents {}\nhttp {\n \
        server {\n  listen 127.0.0.1:{port};\n  root {dir}/html;\n  \
        location = /status { shard_status; }\n  \
        location /p/ {\n   auth_delay 1s;\n   auth_basic \"closed site\";\n   \
        auth_basic_user_file {dir}/htpasswd;\n  }\n }\n}\n";
    let s = Server::start("auth-delay", conf, 1);
    std::fs::write(s.dir.join("htpasswd"), "user:{PLAIN}good\n").unwrap();
    s.signal(libc::SIGHUP);
    write_file(&s.dir, "html/p/index.html", b"in");
    let timed = |auth: &str| {
        let t0 = std::time::Instant::now();
        let (status, _, _) = exchange(s.addr(), &format!("GET /p/ HTTP/1.1\r\nHost: x{auth}"));
        (status, t0.elapsed())
    };
    // "user:good" and "user:bad".
    wait_for(Duration::from_secs(5), "the reloaded user file", || {
        (timed("\r\nAuthorization: Basic dXNlcjpnb29k").0 == 200).then_some(())
    });
    let (status, took) = timed("\r\nAuthorization: Basic dXNlcjpiYWQ=");
    assert_eq!(status, 401);
    assert!(took >= Duration::from_millis(950), "not delayed: {took:?}");
    let (status, took) = timed("");
    assert_eq!(status, 401);
    assert!(
        took >= Duration::from_millis(950),
        "no credentials, not delayed: {took:?}"
    );
    let (status, took) = timed("\r\nAuthorization: Basic dXNlcjpnb29k");
    assert_eq!(status, 200);
    assert!(
        took < Duration::from_millis(900),
        "a good password delayed: {took:?}"
    );
    assert!(error_log(&s).contains("delaying unauthorized request"));
}

/// `limit_except`: methods not listed get the block's `allow`/`deny` and `auth_basic`.
#[test]
fn limit_except_as_nginx() {
    let conf = "worker_processes 1;\nevents {}\nhttp {\n server {\n  listen 127.0.0.1:{port};\n  \
        root {dir}/html;\n  location = /status { shard_status; }\n  \
        location /ro/ {\n   limit_except GET { deny all; }\n  }\n  \
        location /auth/ {\n   limit_except GET POST {\n    auth_basic \"w\";\n    \
        auth_basic_user_file {dir}/htpasswd;\n   }\n  }\n }\n}\n";
    let s = Server::start("limit-except", conf, 1);
    std::fs::write(s.dir.join("htpasswd"), "u:{PLAIN}p\n").unwrap();
    s.signal(libc::SIGHUP);
    write_file(&s.dir, "html/ro/a.txt", b"a");
    write_file(&s.dir, "html/auth/b.txt", b"b");
    let st = |req: &str| exchange(s.addr(), req).0;
    assert_eq!(st("GET /ro/a.txt HTTP/1.1\r\nHost: x"), 200);
    assert_eq!(
        st("HEAD /ro/a.txt HTTP/1.1\r\nHost: x"),
        200,
        "GET brings HEAD"
    );
    assert_eq!(st("DELETE /ro/a.txt HTTP/1.1\r\nHost: x"), 403);
    assert_eq!(
        st("PUT /ro/a.txt HTTP/1.1\r\nHost: x\r\nContent-Length: 0"),
        403
    );
    // POST is listed: not refused by the block (the static handler's 405 answers it).
    assert_eq!(st("GET /auth/b.txt HTTP/1.1\r\nHost: x"), 200);
    assert_eq!(
        st("POST /auth/b.txt HTTP/1.1\r\nHost: x\r\nContent-Length: 0"),
        405
    );
    wait_for(Duration::from_secs(5), "the reloaded user file", || {
        (st("DELETE /auth/b.txt HTTP/1.1\r\nHost: x\r\nAuthorization: Basic dTpw") == 405)
            .then_some(())
    });
    assert_eq!(st("DELETE /auth/b.txt HTTP/1.1\r\nHost: x"), 401);
    let dir = temp_dir("limit-except-t");
    std::fs::write(
        dir.join("conf/t.conf"),
        "events {}\nhttp { server { listen 127.0.0.1:1; location / { limit_except FETCH { deny all; } } } }\n",
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
    assert!(err.contains("invalid method \"FETCH\""), "{err}");
}

/// `proxy_pass_request_body off` sends no body (and no length); `proxy_set_body` sends its
/// own, the client's body read and dropped either way.
#[test]
fn proxy_pass_request_body_and_proxy_set_body() {
    let up = support::upstream::Upstream::start(|_| support::upstream::Reply::Echo);
    let conf = format!(
        "worker_processes 1;\nevents {{}}\nhttp {{\n server {{\n  listen 127.0.0.1:{{port}};\n  \
         location = /status {{ shard_status; }}\n  \
         location /none {{ proxy_pass_request_body off; proxy_pass http://127.0.0.1:{p}; }}\n  \
         location /own {{ proxy_set_body \"a=$arg_a\"; proxy_pass http://127.0.0.1:{p}; }}\n  \
         location /big {{ client_body_buffer_size 1k; proxy_pass_request_body off; proxy_pass http://127.0.0.1:{p}; }}\n }}\n}}\n",
        p = up.port
    );
    let s = Server::start("pass-body", &conf, 1);
    let post = |path: &str, body: &str| {
        let r = raw(
            s.addr(),
            format!(
                "POST {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            )
            .as_bytes(),
        );
        (r.status, r.body)
    };
    let (st, body) = post("/none", "hello");
    assert_eq!((st, body.as_slice()), (200, &b""[..]));
    let r = up.last();
    assert_eq!(r.header("content-length"), None);
    let (st, body) = post("/own?a=1", "hello");
    assert_eq!((st, body.as_slice()), (200, &b"a=1"[..]));
    assert_eq!(up.last().header("content-length"), Some("3"));
    // A body that went to a file is not sent either.
    let (st, body) = post("/big", &"x".repeat(8192));
    assert_eq!((st, body.as_slice()), (200, &b""[..]));
}

/// `gzip_static on|always`: `FILE.gz` sent as it is, with the file's type and
/// `Content-Encoding: gzip`.
#[test]
fn gzip_static_serves_the_precompressed_file() {
    let s = Server::start(
        "gzip-static",
        "worker_processes 1;\nevents {}\nhttp {\n include mime.types;\n server {\n  listen 127.0.0.1:{port};\n  \
         root {dir}/html;\n  location = /status { shard_status; }\n  \
         location /on/ { gzip_static on; gzip_vary on; }\n  location /always/ { gzip_static always; }\n }\n}\n",
        1,
    );
    let gz = |t: &[u8]| {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(t).unwrap();
        e.finish().unwrap()
    };
    for dir in ["on", "always"] {
        write_file(&s.dir, &format!("html/{dir}/app.js"), b"plain();");
        write_file(&s.dir, &format!("html/{dir}/app.js.gz"), &gz(b"zipped();"));
        write_file(&s.dir, &format!("html/{dir}/only.js"), b"only();");
    }
    let ask = |path: &str, ae: bool| {
        let mut st = std::net::TcpStream::connect(s.addr()).unwrap();
        let ae = if ae {
            "Accept-Encoding: gzip, br\r\n"
        } else {
            ""
        };
        write!(
            st,
            "GET {path} HTTP/1.1\r\nHost: x\r\n{ae}Connection: close\r\n\r\n"
        )
        .unwrap();
        read_response(&mut st, false).unwrap()
    };
    let r = ask("/on/app.js", true);
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-encoding"), Some("gzip"));
    assert_eq!(r.header("content-type"), Some("application/javascript"));
    assert_eq!(r.header("vary"), Some("Accept-Encoding"));
    let mut plain = Vec::new();
    flate2::read::GzDecoder::new(&r.body[..])
        .read_to_end(&mut plain)
        .unwrap();
    assert_eq!(plain, b"zipped();");
    let r = ask("/on/app.js", false);
    assert_eq!(
        (r.header("content-encoding"), r.body.as_slice()),
        (None, &b"plain();"[..])
    );
    let r = ask("/on/only.js", true);
    assert_eq!(
        (r.header("content-encoding"), r.body.as_slice()),
        (None, &b"only();"[..])
    );
    let r = ask("/always/app.js", false);
    assert_eq!(r.header("content-encoding"), Some("gzip"));
}

/// `merge_slashes off`: `//` reaches location matching and `$uri` as it was sent.
#[test]
fn merge_slashes_off_keeps_double_slashes() {
    let s = Server::start_ports(
        "merge-slashes",
        "worker_processes 1;\nevents {}\nhttp {\n server {\n  listen 127.0.0.1:{port};\n  \
         location = /status { shard_status; }\n  location / { return 200 \"$uri\"; }\n }\n \
         server {\n  listen 127.0.0.1:{port1};\n  merge_slashes off;\n  \
         location ~ ^/a//b { return 200 \"kept $uri\"; }\n  location / { return 200 \"$uri\"; }\n }\n}\n",
        1,
        1,
    );
    let (_, _, b) = exchange(s.addr(), "GET /a//b HTTP/1.1\r\nHost: x");
    assert_eq!(b, b"/a/b");
    let off = std::net::SocketAddr::from(([127, 0, 0, 1], s.ports[0]));
    let (_, _, b) = exchange(off, "GET /a//b HTTP/1.1\r\nHost: x");
    assert_eq!(b, b"kept /a//b");
    let (_, _, b) = exchange(off, "GET /x//../y HTTP/1.1\r\nHost: x");
    assert_eq!(b, b"/x/y");
}

/// `satisfy any`: the address rule or the password is enough; `all` needs both.
#[test]
fn satisfy_any_and_all() {
    let conf = "worker_processes 1;\nevents {}\nhttp {\n server {\n  listen 127.0.0.1:{port};\n  \
        location = /status { shard_status; }\n  \
        location /any/ {\n   satisfy any;\n   allow 192.0.2.1;\n   deny all;\n   \
        auth_basic r;\n   auth_basic_user_file {dir}/htpasswd;\n   root {dir}/html;\n  }\n  \
        location /local/ {\n   satisfy any;\n   allow 127.0.0.1;\n   deny all;\n   \
        auth_basic r;\n   auth_basic_user_file {dir}/htpasswd;\n   root {dir}/html;\n  }\n  \
        location /all/ {\n   allow 127.0.0.1;\n   deny all;\n   auth_basic r;\n   \
        auth_basic_user_file {dir}/htpasswd;\n   root {dir}/html;\n  }\n }\n}\n";
    let s = Server::start("satisfy", conf, 1);
    std::fs::write(s.dir.join("htpasswd"), "u:{PLAIN}p\n").unwrap();
    s.signal(libc::SIGHUP);
    write_file(&s.dir, "html/any/f", b"f");
    write_file(&s.dir, "html/local/f", b"f");
    write_file(&s.dir, "html/all/f", b"f");
    let st = |path: &str, auth: bool| {
        let a = if auth {
            "\r\nAuthorization: Basic dTpw"
        } else {
            ""
        };
        exchange(s.addr(), &format!("GET {path} HTTP/1.1\r\nHost: x{a}")).0
    };
    wait_for(Duration::from_secs(5), "the reloaded user file", || {
        (st("/all/f", true) == 200).then_some(())
    });
    // Denied by address, no password: the prompt.
    assert_eq!(st("/any/f", false), 401);
    assert_eq!(st("/any/f", true), 200, "the password is enough");
    assert_eq!(st("/local/f", false), 200, "the address is enough");
    assert_eq!(st("/all/f", false), 401, "satisfy all: the password too");
}

/// `limit_rate` and `limit_rate_after`: a 30,000-byte file at 10k/s takes two seconds (each
/// second begun brings its share, as nginx counts), with its first 10k free one.
#[test]
fn limit_rate_paces_the_response() {
    let s = Server::start(
        "limit-rate",
        "worker_processes 1;\nevents {}\nhttp {\n server {\n  listen 127.0.0.1:{port};\n  \
         root {dir}/html;\n  location = /status { shard_status; }\n  \
         location /slow/ { limit_rate 10k; }\n  \
         location /after/ { limit_rate 10k; limit_rate_after 10k; sendfile on; }\n }\n}\n",
        1,
    );
    let body: Vec<u8> = (0..30_000u32).map(|i| b'a' + (i % 26) as u8).collect();
    write_file(&s.dir, "html/slow/f", &body);
    write_file(&s.dir, "html/after/f", &body);
    write_file(&s.dir, "html/free", &body);
    let timed = |path: &str| {
        let t = std::time::Instant::now();
        let r = get(s.addr(), path);
        assert_eq!(r.status, 200);
        assert_eq!(r.body, body, "{path}");
        t.elapsed()
    };
    let free = timed("/free");
    assert!(free < Duration::from_millis(900), "{free:?}");
    let slow = timed("/slow/f");
    assert!(
        slow >= Duration::from_millis(1900) && slow < Duration::from_secs(4),
        "{slow:?}"
    );
    let after = timed("/after/f");
    assert!(
        after >= Duration::from_millis(900) && after < Duration::from_millis(1900),
        "{after:?}"
    );
    // A client that closes while its answer waits for the next share is let go at once
    // (nginx's `ngx_http_test_reading`), not at the next share's failed write (2 s).
    let mut c = std::net::TcpStream::connect(s.addr()).unwrap();
    c.write_all(b"GET /slow/f HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut first = vec![0u8; 4096];
    let n = c.read(&mut first).unwrap();
    assert!(n > 0);
    let_go_when_it_closes(&s, c, Duration::from_millis(800), "the paced answer");
}

/// `c` is open beside the status request; closed, its connection must be gone within
/// `bound` (the server noticed the end of its input rather than waiting on a timer).
fn let_go_when_it_closes(s: &Server, c: std::net::TcpStream, bound: Duration, what: &str) {
    assert_eq!(
        status_field(s, "active"),
        2,
        "{what} and the status request"
    );
    let closed = std::time::Instant::now();
    drop(c);
    wait_for(bound, &format!("{what} let go"), || {
        (status_field(s, "active") == 1).then_some(())
    });
    assert!(closed.elapsed() < bound, "{what}");
}

/// `limit_rate` and `limit_rate_after` with variables (rendered when the response starts; an
/// empty value is no limit), `set $limit_rate` over the location's, `$limit_rate` read back,
/// an upstream's `X-Accel-Limit-Rate`, and `set $args`.
#[test]
fn limit_rate_from_variables_set_and_the_upstream() {
    let body = support::upstream::pattern(20_000, 5);
    let up_body = body.clone();
    let up = support::upstream::Upstream::start(move |r| support::upstream::Reply::Fixed {
        status: 200,
        headers: if r.target.contains("xal") {
            vec![("X-Accel-Limit-Rate".to_string(), "10240".to_string())]
        } else {
            Vec::new()
        },
        body: up_body.clone(),
    });
    let conf = format!(
        "worker_processes 1;\nevents {{}}\nhttp {{\n server {{\n  listen 127.0.0.1:{{port}};\n  \
         root {{dir}}/html;\n  location = /status {{ shard_status; }}\n  \
         location /var/ {{ limit_rate $arg_l; limit_rate_after $arg_a; }}\n  \
         location /set/ {{ set $limit_rate 10k; }}\n  \
         location = /show {{ set $limit_rate 5k; return 200 \"$limit_rate\"; }}\n  \
         location = /args {{ set $args \"a=1&b=2\"; return 200 \"$args|$arg_b|$is_args\"; }}\n  \
         location /up/ {{ proxy_pass http://127.0.0.1:{}; }}\n }}\n}}\n",
        up.port
    );
    let s = Server::start("limit-rate-vars", &conf, 1);
    write_file(&s.dir, "html/var/f", &body);
    write_file(&s.dir, "html/set/f", &body);
    let timed = |path: &str| {
        let t = std::time::Instant::now();
        let r = get(s.addr(), path);
        assert_eq!(r.status, 200, "{path}");
        assert_eq!(r.body, body, "{path}");
        t.elapsed()
    };
    let paced = |d: Duration| d >= Duration::from_millis(900) && d < Duration::from_secs(3);
    let fast = |d: Duration| d < Duration::from_millis(800);
    let d = timed("/var/f?l=10k");
    assert!(paced(d), "{d:?}");
    let d = timed("/var/f?l=10k&a=20000");
    assert!(fast(d), "after: {d:?}");
    let d = timed("/var/f");
    assert!(fast(d), "unset: {d:?}");
    let d = timed("/set/f");
    assert!(paced(d), "set: {d:?}");
    assert_eq!(get(s.addr(), "/show").body_str(), "5120");
    assert_eq!(get(s.addr(), "/args").body_str(), "a=1&b=2|2|?");
    let d = timed("/up/plain");
    assert!(fast(d), "{d:?}");
    let d = timed("/up/xal");
    assert!(paced(d), "X-Accel-Limit-Rate: {d:?}");
}

/// `limit_rate` on a proxied response: paced the same way, and complete.
#[test]
fn limit_rate_paces_a_proxied_response() {
    let up = support::upstream::Upstream::start(|_| support::upstream::Reply::Large(30_000));
    let conf = format!(
        "worker_processes 1;\nevents {{}}\nhttp {{\n server {{\n  listen 127.0.0.1:{{port}};\n  \
         location = /status {{ shard_status; }}\n  \
         location / {{ limit_rate 10k; proxy_pass http://127.0.0.1:{}; }}\n }}\n}}\n",
        up.port
    );
    let s = Server::start("limit-rate-proxy", &conf, 1);
    let t = std::time::Instant::now();
    let r = get(s.addr(), "/x");
    let took = t.elapsed();
    assert_eq!((r.status, r.body.len()), (200, 30_000));
    assert!(
        took >= Duration::from_millis(1900) && took < Duration::from_secs(4),
        "{took:?}"
    );
}

/// `proxy_limit_rate`: the upstream's response is read at most at the rate (each second
/// begun brings its share), so 30,000 bytes at 10k/s take about two seconds; the client
/// gets them whole. With buffering off the rate does not apply, as nginx documents.
#[test]
fn proxy_limit_rate_paces_reading_the_upstream() {
    let up = support::upstream::Upstream::start(|_| support::upstream::Reply::Large(30_000));
    let conf = format!(
        "worker_processes 1;\nevents {{}}\nhttp {{\n server {{\n  listen 127.0.0.1:{{port}};\n  \
         location = /status {{ shard_status; }}\n  \
         location /r/ {{ proxy_limit_rate 10k; proxy_pass http://127.0.0.1:{0}; }}\n  \
         location /u/ {{ proxy_limit_rate 10k; proxy_buffering off; proxy_pass http://127.0.0.1:{0}; }}\n }}\n}}\n",
        up.port
    );
    let s = Server::start("proxy-limit-rate", &conf, 1);
    let t = std::time::Instant::now();
    let r = get(s.addr(), "/r/x");
    let took = t.elapsed();
    assert_eq!((r.status, r.body.len()), (200, 30_000));
    assert!(
        took >= Duration::from_millis(1900) && took < Duration::from_secs(4),
        "{took:?}"
    );
    let t = std::time::Instant::now();
    let r = get(s.addr(), "/u/x");
    assert_eq!((r.status, r.body.len()), (200, 30_000));
    assert!(
        t.elapsed() < Duration::from_millis(1500),
        "{:?}",
        t.elapsed()
    );
}

/// `X-Accel-Redirect` from an upstream: the request goes on at that URI (an `internal`
/// location serving a file) or named location, as GET, with the upstream's
/// `Content-Disposition`, `Set-Cookie` and `Content-Type`; the upstream's body is not sent. With
/// `proxy_ignore_headers X-Accel-Redirect` the upstream's answer passes as it is.
#[test]
fn x_accel_redirect_serves_the_target() {
    use support::upstream::{Reply, Upstream};
    let up = Upstream::start(|r| {
        let to = match r.target.as_str() {
            "/named" => "@fallback",
            "/args" => "/files/report.txt?x=1",
            _ => "/files/report.txt",
        };
        Reply::Fixed {
            status: 200,
            headers: vec![
                ("X-Accel-Redirect".into(), to.into()),
                (
                    "Content-Disposition".into(),
                    "attachment; filename=\"r.txt\"".into(),
                ),
                ("Set-Cookie".into(), "dl=1".into()),
                ("Content-Type".into(), "application/x-report".into()),
            ],
            body: b"app body".to_vec(),
        }
    });
    let conf = format!(
        "worker_processes 1;\nevents {{}}\nhttp {{\n server {{\n  listen 127.0.0.1:{{port}};\n  \
         location = /status {{ shard_status; }}\n  \
         location /files/ {{ internal; }}\n  \
         location @fallback {{ return 200 \"named $request_method\"; }}\n  \
         location /plain/ {{ proxy_ignore_headers X-Accel-Redirect; proxy_pass http://127.0.0.1:{0}; }}\n  \
         location / {{ proxy_pass http://127.0.0.1:{0}; }}\n }}\n}}\n",
        up.port
    );
    let s = Server::start("x-accel-redirect", &conf, 1);
    write_file(&s.dir, "html/files/report.txt", b"the report\n");
    // The protected file cannot be asked for directly.
    assert_eq!(get(s.addr(), "/files/report.txt").status, 404);
    let r = get(s.addr(), "/download");
    assert_eq!((r.status, r.body_str().as_str()), (200, "the report\n"));
    assert_eq!(
        r.header("content-disposition"),
        Some("attachment; filename=\"r.txt\"")
    );
    assert_eq!(r.header("set-cookie"), Some("dl=1"));
    assert_eq!(r.header("x-accel-redirect"), None);
    // The upstream's type stays (nginx sets a file's type only where none is), once.
    assert_eq!(r.header("content-type"), Some("application/x-report"));
    assert_eq!(
        r.headers
            .iter()
            .filter(|(k, _)| k.eq_ignore_ascii_case("content-type"))
            .count(),
        1
    );
    assert_eq!(get(s.addr(), "/args").body_str(), "the report\n");
    let r = raw(
        s.addr(),
        b"POST /named HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nConnection: close\r\n\r\nabc",
    );
    assert_eq!((r.status, r.body_str().as_str()), (200, "named GET"));
    assert_eq!(r.header("content-type"), Some("application/x-report"));
    let r = get(s.addr(), "/plain/x");
    assert_eq!((r.status, r.body_str().as_str()), (200, "app body"));
    assert_eq!(r.header("x-accel-redirect"), None, "hidden, as nginx");
}

/// `proxy_bind`: connections to the upstream come from the given local address (a
/// variable's too); `off` in a location cancels it; an address that cannot be bound logs
/// nginx's `bind(...) failed` and answers 500.
#[test]
fn proxy_bind_sets_the_upstream_connection_source() {
    let conf = "worker_processes 1;\nevents {}\nhttp {\n \
         proxy_bind 127.0.0.2;\n \
         server {\n  listen 127.0.0.1:{port};\n  \
         location = /status { shard_status; }\n  \
         location /var/ { proxy_bind $arg_from; proxy_pass http://127.0.0.1:{port1}; }\n  \
         location /off/ { proxy_bind off; proxy_pass http://127.0.0.1:{port1}; }\n  \
         location /bad/ { proxy_bind 192.0.2.1; proxy_pass http://127.0.0.1:{port1}; }\n  \
         location /tp/ { proxy_bind 127.0.0.4 transparent; proxy_pass http://127.0.0.1:{port1}; }\n  \
         location / { proxy_pass http://127.0.0.1:{port1}; }\n }\n \
         server { listen 127.0.0.1:{port1}; return 200 \"from $remote_addr\"; }\n}\n";
    let s = Server::start_ports("proxy-bind", conf, 1, 1);
    assert_eq!(get(s.addr(), "/x").body_str(), "from 127.0.0.2");
    assert_eq!(get(s.addr(), "/off/x").body_str(), "from 127.0.0.1");
    assert_eq!(
        get(s.addr(), "/var/x?from=127.0.0.3").body_str(),
        "from 127.0.0.3"
    );
    // An empty value binds nothing.
    assert_eq!(get(s.addr(), "/var/x").body_str(), "from 127.0.0.1");
    assert_eq!(get(s.addr(), "/bad/x").status, 500);
    let log = wait_for(Duration::from_secs(5), "the bind error logged", || {
        let l = error_log(&s);
        l.contains("bind(192.0.2.1) failed").then_some(l)
    });
    assert!(log.contains("[crit]"), "{log}");
    // `transparent`: the workers (running as nobody here) keep CAP_NET_RAW for
    // IP_TRANSPARENT, as nginx's; the connection comes from the address given.
    assert_eq!(get(s.addr(), "/tp/x").body_str(), "from 127.0.0.4");
    // An unknown parameter is refused at -t.
    let dir = temp_dir("proxy-bind-param");
    std::fs::write(
        dir.join("conf/shard.conf"),
        "events {}\nhttp { server { listen 127.0.0.1:1; location / { proxy_bind $remote_addr maybe; proxy_pass http://127.0.0.1:2; } } }\n",
    )
    .unwrap();
    let (code, out) = run_cli(&["-t", "-p", dir.to_str().unwrap(), "-c", "conf/shard.conf"]);
    assert_ne!(code, 0);
    assert!(out.contains("invalid parameter \"maybe\""), "{out}");
    assert!(out.contains("shard.conf:2"), "{out}");
}

/// `rewrite_log`, `recursive_error_pages`, `max_ranges`, `gzip_disable`, `random_index` and
/// `chunked_transfer_encoding off`, each as nginx's documentation has it.
#[test]
fn small_http_switches_behave_as_nginx() {
    use support::upstream::{Reply, Upstream};
    // An upstream whose body ends with its connection (no length, not chunked).
    let up = Upstream::start(|_| Reply::CloseDelimited(b"to the end".to_vec()));
    let conf = format!(
        "worker_processes 1;\nerror_log logs/error.log notice;\nevents {{}}\nhttp {{\n \
         server {{\n  listen 127.0.0.1:{{port}};\n  \
         location = /status {{ shard_status; }}\n  \
         location /old/ {{ rewrite_log on; rewrite ^/old/(.*)$ /new/$1?from=old; rewrite ^/never /x; }}\n  \
         location /new/ {{ return 200 \"new $uri $args\"; }}\n  \
         location /rec/ {{ recursive_error_pages on; error_page 404 /rec/nf; error_page 403 /forb; \
         location = /rec/nf {{ return 403; }} }}\n  \
         location /flat/ {{ error_page 404 /flat/nf; error_page 403 /forb; \
         location = /flat/nf {{ return 403; }} }}\n  \
         location = /forb {{ return 200 \"forbidden page\"; }}\n  \
         location /one/ {{ max_ranges 1; }}\n  \
         location /none/ {{ max_ranges 0; }}\n  \
         location /gz/ {{ gzip on; gzip_min_length 1; gzip_types text/plain; gzip_disable msie6 \"~*curl/7\"; }}\n  \
         location /rand/ {{ random_index on; }}\n  \
         location /close/ {{ chunked_transfer_encoding off; proxy_pass http://127.0.0.1:{0}; }}\n  \
         location /chunk/ {{ proxy_pass http://127.0.0.1:{0}; }}\n }}\n}}\n",
        up.port
    );
    let s = Server::start("small-switches", &conf, 1);
    // rewrite_log: nginx's notice lines, matches and the rewritten data.
    let r = get(s.addr(), "/old/page");
    assert_eq!(r.body_str(), "new /new/page from=old");
    let log = wait_for(Duration::from_secs(5), "the rewrite log lines", || {
        let l = error_log(&s);
        l.contains("rewritten data").then_some(l)
    });
    assert!(
        log.contains("[notice]") && log.contains("\"^/old/(.*)$\" matches \"/old/page\""),
        "{log}"
    );
    assert!(
        log.contains("rewritten data: \"/new/page\", args: \"from=old\""),
        "{log}"
    );
    // recursive_error_pages: the error page's own 403 takes the 403 page only when on.
    let r = get(s.addr(), "/rec/missing");
    assert_eq!((r.status, r.body_str().as_str()), (403, "forbidden page"));
    let r = get(s.addr(), "/flat/missing");
    assert_eq!(r.status, 403);
    assert_ne!(r.body_str(), "forbidden page");
    // max_ranges.
    write_file(&s.dir, "html/one/f.txt", b"0123456789");
    write_file(&s.dir, "html/none/f.txt", b"0123456789");
    let ranged = |path: &str, range: &str| {
        raw(
            s.addr(),
            format!(
                "GET {path} HTTP/1.1\r\nHost: x\r\nRange: {range}\r\nConnection: close\r\n\r\n"
            )
            .as_bytes(),
        )
    };
    let r = ranged("/one/f.txt", "bytes=0-1");
    assert_eq!((r.status, r.body_str().as_str()), (206, "01"));
    let r = ranged("/one/f.txt", "bytes=0-1,4-5");
    assert_eq!((r.status, r.body_str().as_str()), (200, "0123456789"));
    // A range past the end does not count against it, as nginx's parser counts.
    let r = ranged("/one/f.txt", "bytes=0-1,100-");
    assert_eq!((r.status, r.body_str().as_str()), (206, "01"));
    let r = ranged("/none/f.txt", "bytes=0-1");
    assert_eq!((r.status, r.header("accept-ranges")), (200, None));
    assert_eq!(
        get(s.addr(), "/one/f.txt").header("accept-ranges"),
        Some("bytes")
    );
    // gzip_disable.
    write_file(&s.dir, "html/gz/t.txt", &[b'a'; 500]);
    let gz = |ua: &str| {
        raw(
            s.addr(),
            format!("GET /gz/t.txt HTTP/1.1\r\nHost: x\r\nAccept-Encoding: gzip\r\nUser-Agent: {ua}\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .header("content-encoding")
        .map(str::to_string)
    };
    assert_eq!(gz("Mozilla/5.0 Firefox/120.0").as_deref(), Some("gzip"));
    assert_eq!(
        gz("Mozilla/4.0 (compatible; MSIE 6.0; Windows NT 5.0)"),
        None
    );
    assert_eq!(
        gz("Mozilla/4.0 (compatible; MSIE 6.0; Windows NT 5.1; SV1)").as_deref(),
        Some("gzip")
    );
    assert_eq!(gz("curl/7.88.1"), None);
    assert_eq!(gz("curl/8.5.0").as_deref(), Some("gzip"));
    // random_index: one of the files, never a dot file or a directory.
    write_file(&s.dir, "html/rand/a.txt", b"A");
    write_file(&s.dir, "html/rand/b.txt", b"B");
    write_file(&s.dir, "html/rand/.hidden", b"H");
    std::fs::create_dir_all(s.dir.join("html/rand/sub")).unwrap();
    // A link counts as what it points to (a file, not a directory), as nginx's stat.
    write_file(&s.dir, "html/c-target.txt", b"C");
    std::os::unix::fs::symlink(
        s.dir.join("html/c-target.txt"),
        s.dir.join("html/rand/c.txt"),
    )
    .unwrap();
    std::os::unix::fs::symlink(
        s.dir.join("html/rand/sub"),
        s.dir.join("html/rand/sub-link"),
    )
    .unwrap();
    let mut seen = std::collections::HashSet::new();
    for _ in 0..60 {
        let r = get(s.addr(), "/rand/");
        assert_eq!(r.status, 200);
        seen.insert(r.body_str());
    }
    assert_eq!(
        seen,
        ["A", "B", "C"].iter().map(|s| s.to_string()).collect(),
        "the files and the link to one, nothing else"
    );
    // chunked_transfer_encoding off: an HTTP/1.1 client gets the body delimited by the close.
    let r = raw(s.addr(), b"GET /close/ HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_eq!(r.body_str(), "to the end");
    assert_eq!(r.header("transfer-encoding"), None);
    assert_eq!(r.header("connection"), Some("close"));
    let r = raw(
        s.addr(),
        b"GET /chunk/ HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(r.header("transfer-encoding"), Some("chunked"));
    assert_eq!(r.body_str(), "to the end");
}

/// `secure_link`/`secure_link_md5` (`$secure_link` is `1`, `0` once expired, empty for a
/// wrong hash; `$secure_link_expires`) and the older `secure_link_secret` form, as nginx's
/// documentation writes them.
#[test]
fn secure_link_checks_hashes_and_expiry() {
    use md5::{Digest, Md5};
    let b64url = |d: &[u8]| {
        const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
        let mut s = String::new();
        for c in d.chunks(3) {
            let n = (u32::from(c[0]) << 16)
                | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
                | u32::from(*c.get(2).unwrap_or(&0));
            for i in 0..=c.len() {
                s.push(T[(n >> (18 - 6 * i) & 63) as usize] as char);
            }
        }
        s
    };
    let conf = "worker_processes 1;\nevents {}\nhttp {\n server {\n  listen 127.0.0.1:{port};\n  \
         location = /status { shard_status; }\n  \
         location /s/ {\n   secure_link $arg_md5,$arg_expires;\n   \
         secure_link_md5 \"$secure_link_expires$uri secret\";\n   \
         if ($secure_link = \"\") { return 403; }\n   \
         if ($secure_link = \"0\") { return 410; }\n   \
         return 200 \"ok $secure_link_expires\";\n  }\n  \
         location /p/ { secure_link_secret word; if ($secure_link = \"\") { return 403; } \
         rewrite ^ /files/$secure_link; }\n  \
         location /files/ { internal; return 200 \"file $uri\"; }\n  \
         location /inh/ { secure_link_secret word;\n   \
         location = /inh/t { secure_link $arg_h; secure_link_md5 \"$uri word\";\n    \
         if ($secure_link = \"1\") { return 200 \"md5 form\"; } return 403; } }\n }\n}\n";
    let s = Server::start("secure-link", conf, 1);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let link = |uri: &str, expires: u64| {
        let h = Md5::digest(format!("{expires}{uri} secret").as_bytes());
        format!("{uri}?md5={}&expires={expires}", b64url(&h))
    };
    let r = get(s.addr(), &link("/s/doc.pdf", now + 3600));
    assert_eq!(
        (r.status, r.body_str()),
        (200, format!("ok {}", now + 3600))
    );
    assert_eq!(get(s.addr(), &link("/s/doc.pdf", now - 10)).status, 410);
    // The hash of another URI, or none at all.
    let other = link("/s/other.pdf", now + 3600).replace("/s/other.pdf", "/s/doc.pdf");
    assert_eq!(get(s.addr(), &other).status, 403);
    assert_eq!(get(s.addr(), "/s/doc.pdf").status, 403);
    // secure_link_secret: /p/HEX(MD5(link + secret))/link.
    let hex: String = Md5::digest(b"top/secret.txtword")
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let r = get(s.addr(), &format!("/p/{hex}/top/secret.txt"));
    assert_eq!(
        (r.status, r.body_str().as_str()),
        (200, "file /files/top/secret.txt")
    );
    assert_eq!(
        get(
            s.addr(),
            "/p/00000000000000000000000000000000/top/secret.txt"
        )
        .status,
        403
    );
    // A nested location with the md5 form does not inherit its parent's secret (nginx's
    // merge): the md5 form is what it checks.
    let h = b64url(&Md5::digest(b"/inh/t word"));
    let r = get(s.addr(), &format!("/inh/t?h={h}"));
    assert_eq!((r.status, r.body_str().as_str()), (200, "md5 form"));
    // Both forms in one level: nginx's error.
    let bad = temp_dir("secure-link-mixed");
    std::fs::write(
        bad.join("conf/shard.conf"),
        "events {}\nhttp { server { listen 127.0.0.1:1; location / {\n \
         secure_link_secret s; secure_link $arg_a; } } }\n",
    )
    .unwrap();
    let (code, out) = run_cli(&["-t", "-p", bad.to_str().unwrap(), "-c", "conf/shard.conf"]);
    assert_ne!(code, 0);
    assert!(
        out.contains("\"secure_link_secret\" cannot be mixed with") && out.contains("shard.conf:3"),
        "{out}"
    );
}

/// `proxy_cookie_flags`: the first rule whose cookie matches adds or removes `Secure`,
/// `HttpOnly` and `SameSite` on the upstream's `Set-Cookie`; other cookies pass unchanged.
#[test]
fn proxy_cookie_flags_edit_set_cookie() {
    use support::upstream::{Reply, Upstream};
    let up = Upstream::start(|_| Reply::Fixed {
        status: 200,
        headers: vec![
            ("Set-Cookie".into(), "one=1; Path=/".into()),
            (
                "Set-Cookie".into(),
                "two=2; Secure; HttpOnly; SameSite=Lax".into(),
            ),
            ("Set-Cookie".into(), "other=3".into()),
        ],
        body: b"ok".to_vec(),
    });
    let conf = format!(
        "worker_processes 1;\nevents {{}}\nhttp {{\n server {{\n  listen 127.0.0.1:{{port}};\n  \
         location = /status {{ shard_status; }}\n  \
         location / {{ proxy_cookie_flags ONE secure httponly samesite=strict; \
         proxy_cookie_flags ~^t nosecure samesite=none; proxy_pass http://127.0.0.1:{0}; }}\n  \
         location /off/ {{ proxy_cookie_flags off; proxy_pass http://127.0.0.1:{0}; }}\n }}\n}}\n",
        up.port
    );
    let s = Server::start("cookie-flags", &conf, 1);
    let r = get(s.addr(), "/x");
    let cookies: Vec<&str> = r
        .headers
        .iter()
        .filter(|(k, _)| k.eq_ignore_ascii_case("set-cookie"))
        .map(|(_, v)| v.as_str())
        .collect();
    assert_eq!(
        cookies,
        [
            "one=1; Path=/; Secure; HttpOnly; SameSite=Strict",
            "two=2; HttpOnly; SameSite=None",
            "other=3"
        ]
    );
    let r = get(s.addr(), "/off/x");
    assert!(r.headers.iter().any(|(_, v)| v == "one=1; Path=/"));
}

/// `listen unix:PATH` (http and stream) as nginx's: the socket made `0666`, `$remote_addr`
/// `unix:`, `allow`/`deny unix:`, `set_real_ip_from unix:`, a stream `proxy_pass unix:` and
/// stream upstream servers on Unix-domain sockets; the master removes the files at exit.
#[test]
fn unix_domain_listeners_as_nginx() {
    use std::os::unix::net::UnixStream;
    let conf = "worker_processes 1;\nevents { worker_connections 64; }\nhttp {\n access_log off;\n \
        server {\n  listen 127.0.0.1:{port};\n  location = /status { shard_status; }\n  \
        location /via/ { proxy_pass http://unix:{dir}/front.sock:/; }\n }\n \
        server {\n  listen unix:{dir}/front.sock;\n  \
        location / { return 200 \"[$remote_addr|$server_addr|$server_port]\"; }\n  \
        location /deny/ { deny unix:; }\n  \
        location /realip/ { set_real_ip_from unix:; real_ip_header X-Real-IP; return 200 \"$remote_addr\"; }\n }\n}\n\
        stream {\n upstream socks { server unix:{dir}/front.sock; }\n \
        server { listen unix:{dir}/relay.sock; proxy_pass unix:{dir}/front.sock; }\n \
        server { listen 127.0.0.1:{port1}; proxy_pass socks; }\n}\n";
    let mut s = Server::start_ports("unix-listen", conf, 1, 1);
    let front = s.dir.join("front.sock");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&front).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o666);
    let ask = |sock: &std::path::Path, req: &str| {
        let mut c = UnixStream::connect(sock).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        c.write_all(req.as_bytes()).unwrap();
        let mut v = Vec::new();
        let _ = c.read_to_end(&mut v);
        String::from_utf8_lossy(&v).into_owned()
    };
    let get_unix = |sock: &std::path::Path, path: &str, extra: &str| {
        let r = ask(
            sock,
            &format!("GET {path} HTTP/1.1\r\nHost: x\r\n{extra}Connection: close\r\n\r\n"),
        );
        let status: u16 = r.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0);
        let body = r.split_once("\r\n\r\n").map_or("", |(_, b)| b).to_string();
        (status, body)
    };
    assert_eq!(
        get_unix(&front, "/", ""),
        (200, "[unix:|unix:|]".to_string())
    );
    assert_eq!(get_unix(&front, "/deny/", "").0, 403);
    assert_eq!(
        get_unix(&front, "/realip/", "X-Real-IP: 192.0.2.7\r\n"),
        (200, "192.0.2.7".to_string())
    );
    // Through the proxy and the stream relays, all on Unix-domain sockets.
    assert_eq!(get(s.addr(), "/via/x").body_str(), "[unix:|unix:|]");
    assert_eq!(
        get_unix(&s.dir.join("relay.sock"), "/", ""),
        (200, "[unix:|unix:|]".to_string())
    );
    let r = raw(
        std::net::SocketAddr::from(([127, 0, 0, 1], s.ports[0])),
        b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(r.body_str(), "[unix:|unix:|]");
    s.signal(libc::SIGQUIT);
    assert_eq!(s.wait_exit(Duration::from_secs(10)), 0);
    assert!(!front.exists(), "the socket file goes with the master");
    assert!(!s.dir.join("relay.sock").exists());
}

/// `$sent_http_NAME` of any header in the access log (repeated lines joined with `, `), for
/// answers of its own and proxied ones; `expires` replacing a proxied answer's
/// `Cache-Control`/`Expires`, and `expires modified` taking its `Last-Modified`, as nginx.
#[test]
fn sent_http_variables_and_expires_on_proxied_answers() {
    let conf = "worker_processes 1;\nevents {}\nhttp {\n \
        log_format cc '$uri: $sent_http_cache_control|$sent_http_x_one';\n \
        server {\n  listen 127.0.0.1:{port};\n  location = /status { shard_status; }\n  \
        access_log {dir}/logs/cc.log cc;\n  \
        location /set { add_header Cache-Control max-age=3600; add_header Cache-Control private; \
        add_header X-One 1; return 200 OK; }\n  \
        location /redefine { expires epoch; proxy_pass http://127.0.0.1:{port}/set; }\n  \
        location /modified { expires modified 2048; proxy_pass http://127.0.0.1:{port1}/file; }\n  \
        location = /ck { return 200 \"$http_cookie|$cookie_bar\"; }\n }\n \
        server {\n  listen 127.0.0.1:{port1};\n  root {dir}/html;\n  access_log off;\n }\n}\n";
    let s = Server::start_ports("sent-http", conf, 1, 1);
    write_file(&s.dir, "html/file", b"f");
    let mtime = std::time::UNIX_EPOCH + Duration::from_secs(23_000_000);
    std::fs::File::options()
        .write(true)
        .open(s.dir.join("html/file"))
        .unwrap()
        .set_modified(mtime)
        .unwrap();
    let r = get(s.addr(), "/redefine");
    let cc: Vec<&str> = r
        .headers
        .iter()
        .filter(|(k, _)| k.eq_ignore_ascii_case("cache-control"))
        .map(|(_, v)| v.as_str())
        .collect();
    assert_eq!(cc, vec!["no-cache"], "{r:?}");
    let r = get(s.addr(), "/modified");
    // 23,000,000 + 2048 seconds after the epoch.
    assert_eq!(
        r.header("expires"),
        Some("Thu, 24 Sep 1970 05:27:28 GMT"),
        "{r:?}"
    );
    let log = wait_for(Duration::from_secs(5), "the log lines", || {
        let t = std::fs::read_to_string(s.dir.join("logs/cc.log")).unwrap_or_default();
        (t.lines().count() >= 3).then_some(t)
    });
    assert!(log.contains("/set: max-age=3600, private|1\n"), "{log}");
    assert!(log.contains("/redefine: no-cache|1\n"), "{log}");
    // Several `Cookie` lines are one list, joined with `; ` as nginx joins them.
    let r = raw(
        s.addr(),
        b"GET /ck HTTP/1.1\r\nHost: x\r\nCookie: foo=1, qux=0\r\nCookie: bar=2\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(r.body_str(), "foo=1, qux=0; bar=2|2");
}

/// A `proxy_pass` with variables that names the host and port of another `proxy_pass`'s
/// implicit upstream uses it (no resolver needed), as nginx finds its upstreams; another
/// name still needs a resolver (502).
#[test]
fn a_variable_proxy_pass_finds_an_implicit_upstream() {
    let conf = "worker_processes 1;\nevents {}\nhttp {\n access_log off;\n server {\n  \
        listen 127.0.0.1:{port};\n  location = /status { shard_status; }\n  \
        location /lit { proxy_pass http://localhost:{port1}/x; }\n  \
        location /var { proxy_pass http://$arg_h/x; }\n }\n server {\n  \
        listen 127.0.0.1:{port1};\n  location /x { return 200 \"b $host\"; }\n }\n}\n";
    let s = Server::start_ports("implicit-var", conf, 1, 1);
    let p1 = s.ports[0];
    assert_eq!(get(s.addr(), "/lit").body_str(), "b localhost");
    let r = get(s.addr(), &format!("/var?h=localhost:{p1}"));
    assert_eq!((r.status, r.body_str()), (200, "b localhost".to_string()));
    assert_eq!(get(s.addr(), &format!("/var?h=elsewhere:{p1}")).status, 502);
}

/// Legacy GeoIP databases of the test's own making (the `.dat` layout: a bit tree over the
/// address, then the records, then the structure info), 10.0.0.1 in each.
fn geoip_dbs(dir: &std::path::Path) {
    let node = |v: u32, len: usize| v.to_le_bytes()[..len].to_vec();
    // The tree for 10.0.0.1 over 32 bits: each level's branch goes on, the other ends at
    // `miss`; the last level ends at `hit`.
    let tree = |hit: u32, miss: u32, len: usize| {
        let ip = u32::from(std::net::Ipv4Addr::new(10, 0, 0, 1));
        let mut d = Vec::new();
        for depth in (0..32u32).rev() {
            let i = 31 - depth;
            let next = if depth == 0 { hit } else { i + 1 };
            let (l, r) = if ip >> depth & 1 == 1 {
                (miss, next)
            } else {
                (next, miss)
            };
            d.extend(node(l, len));
            d.extend(node(r, len));
        }
        d
    };
    // Country (edition 1): leaves are 16776960 + id; 185 is RU.
    let mut country = tree(16_776_960 + 185, 16_776_960, 3);
    country.extend([0, 0, 0, 0xFF, 0xFF, 0xFF, 1]);
    std::fs::write(dir.join("country.dat"), country).unwrap();
    // City (edition 2, 32 segments): leaf 33 is the record at 33 + 5 * 32.
    let mut city = tree(33, 32, 3);
    city.push(0);
    city.push(185);
    for s in ["48", "Moscow", "119034"] {
        city.extend(s.as_bytes());
        city.push(0);
    }
    city.extend(node(((55.7543 + 180.0) * 10000.0) as u32, 3));
    city.extend(node(((37.6202 + 180.0) * 10000.0) as u32, 3));
    city.extend([0, 0, 0, 0xFF, 0xFF, 0xFF, 2, 32, 0, 0]);
    std::fs::write(dir.join("city.dat"), city).unwrap();
    // Organization (edition 5, 4-byte records): leaf 33 is the name at 33 + 7 * 32.
    let mut org = tree(33, 32, 4);
    org.push(0);
    org.extend(b"Nginx\0");
    org.extend([0xFF, 0xFF, 0xFF, 5, 32, 0, 0]);
    std::fs::write(dir.join("org.dat"), org).unwrap();
}

/// `geoip_country`, `geoip_city`, `geoip_org` (http and stream) and `geoip_proxy`: the
/// variables of an address, as nginx's geoip modules show them; a database of the wrong
/// edition fails `-t` in nginx's words.
#[test]
fn geoip_databases_name_countries_cities_and_organizations() {
    let dir = temp_dir("geoip-dbs").keep();
    geoip_dbs(&dir);
    let d = dir.display();
    let conf = format!(
        "worker_processes 1;\nevents {{}}\n\
         http {{\n geoip_country {d}/country.dat; geoip_city {d}/city.dat utf8;\n \
         geoip_org {d}/org.dat; geoip_proxy 127.0.0.1/32;\n \
         server {{\n  listen 127.0.0.1:{{port}};\n  location = /status {{ shard_status; }}\n  \
         location / {{ return 200 \"$geoip_country_code $geoip_country_code3 $geoip_country_name|\
         $geoip_city_continent_code $geoip_city_country_code $geoip_city $geoip_region \
         $geoip_region_name $geoip_postal_code $geoip_latitude $geoip_longitude \
         $geoip_area_code $geoip_dma_code|$geoip_org\"; }}\n }}\n}}\n\
         stream {{\n geoip_country {d}/country.dat; geoip_org {d}/org.dat;\n \
         set_real_ip_from 127.0.0.1;\n \
         server {{ listen 127.0.0.1:{{port1}} proxy_protocol; \
         return \"$geoip_country_code $geoip_org\"; }}\n}}\n"
    );
    let s = Server::start_ports("geoip", &conf, 1, 1);
    let ask = |xff: &str| {
        let head = format!(
            "GET / HTTP/1.1\r\nHost: h\r\nX-Forwarded-For: {xff}\r\nConnection: close\r\n\r\n"
        );
        raw(s.addr(), head.as_bytes()).body_str()
    };
    assert_eq!(
        ask("10.0.0.1"),
        "RU RUS Russian Federation|EU RU Moscow 48 Moscow City 119034 55.7543 37.6202 0 0|Nginx"
    );
    assert_eq!(ask("::ffff:10.0.0.1").split('|').nth(2), Some("Nginx"));
    assert_eq!(
        ask("10.0.0.2"),
        "  |         |",
        "not in the databases: empty"
    );
    // Stream: the PROXY header's source (trusted by set_real_ip_from).
    let mut c = connect(std::net::SocketAddr::from(([127, 0, 0, 1], s.ports[0])));
    c.write_all(b"PROXY TCP4 10.0.0.1 127.0.0.1 1 2\r\n")
        .unwrap();
    let mut got = String::new();
    c.read_to_string(&mut got).unwrap();
    assert_eq!(got, "RU Nginx");
    // The wrong edition for the directive.
    let bad = temp_dir("geoip-bad");
    std::fs::write(
        bad.join("conf/shard.conf"),
        format!("events {{}}\nhttp {{ geoip_city {d}/country.dat; }}\n"),
    )
    .unwrap();
    let (code, out) = run_cli(&["-t", "-p", bad.to_str().unwrap(), "-c", "conf/shard.conf"]);
    assert_ne!(code, 0);
    assert!(out.contains("invalid GeoIP database"), "{out}");
    assert!(out.contains("shard.conf:2"), "{out}");
}

/// `userid` (nginx's userid module): a new visitor gets a cookie of 16 bytes in base64
/// (`$uid_set`), a returning one is read (`$uid_got`) and not given another; `$uid_reset`
/// renews it; the cookie's attributes follow `userid_*`.
#[test]
fn userid_sets_and_reads_the_visitor_cookie() {
    let conf = "worker_processes 1;\nerror_log logs/error.log info;\nevents {}\nhttp {\n \
        map $arg_r $uid_reset { default 0; 1 1; log log; }\n \
        server {\n  listen 127.0.0.1:{port};\n  location = /status { shard_status; }\n  \
        userid on; userid_path /p; userid_domain example.test; userid_expires 1h;\n  \
        userid_mark t; userid_flags secure samesite=lax; userid_p3p 'CP=\"x\"';\n  \
        location / { add_header X-Got $uid_got; add_header X-Set $uid_set; return 204; }\n  \
        location /log { userid log; add_header X-Got $uid_got; return 204; }\n }\n}\n";
    let s = Server::start("userid", conf, 1);
    let ask = |path: &str, cookie: Option<&str>| {
        let c = cookie.map_or(String::new(), |c| format!("Cookie: {c}\r\n"));
        raw(
            s.addr(),
            format!("GET {path} HTTP/1.1\r\nHost: h\r\n{c}Connection: close\r\n\r\n").as_bytes(),
        )
    };
    let r = ask("/", None);
    let set = r.header("Set-Cookie").unwrap().to_string();
    let uid = set
        .strip_prefix("uid=")
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_string();
    assert_eq!(uid.len(), 24, "{set}");
    assert!(uid.ends_with("t="), "the mark: {set}");
    assert!(
        set.ends_with("; domain=example.test; path=/p; secure; samesite=lax"),
        "{set}"
    );
    assert!(set.contains("; expires="), "{set}");
    assert_eq!(r.header("P3P"), Some("CP=\"x\""));
    let x_set = r.header("X-Set").unwrap().to_string();
    assert!(x_set.starts_with("uid=") && x_set.len() == 36, "{x_set}");
    // Returning: read, not set again; the same identifier.
    let r = ask("/", Some(&format!("uid={uid}")));
    assert_eq!(r.header("Set-Cookie"), None);
    assert_eq!(r.header("X-Got"), Some(x_set.as_str()));
    // `$uid_reset`: a new one; `log` says so in the error log.
    assert!(ask("/?r=1", Some(&format!("uid={uid}")))
        .header("Set-Cookie")
        .is_some());
    assert!(ask("/?r=log", Some(&format!("uid={uid}")))
        .header("Set-Cookie")
        .is_some());
    wait_for(Duration::from_secs(5), "the reset logged", || {
        error_log(&s).contains("userid cookie \"uid=").then_some(())
    });
    // `userid log`: read, never set.
    let r = ask("/log", None);
    assert_eq!(r.header("Set-Cookie"), None);
    assert_eq!(
        ask("/log", Some(&format!("uid={uid}"))).header("X-Got"),
        Some(x_set.as_str())
    );
}

/// A request refused while its head is read (a bad `Host`, a bad request line) takes the
/// default server's `error_page`, as nginx's special response handler does: the page is
/// requested anew with GET and sent with the original status (or `=CODE`'s), the connection
/// closes after it, and the access log keeps the line the client sent.
#[test]
fn error_page_takes_requests_refused_while_their_head_is_read() {
    const EP_CONF: &str = r#"
worker_processes 1;
events { worker_connections 64; }
http {
    log_format st '$status "$request" $uri';
    access_log logs/access.log st;
    server {
        listen 127.0.0.1:{port};
        root {dir}/html;
        error_page 400 /bad.html;
        error_page 414 =200 /long.html;
        location = /status { shard_status; }
        location = /redirect-me { return 301 /elsewhere; }
    }
    server {
        listen 127.0.0.1:{port1};
        error_page 400 /redirect-me;
        location = /redirect-me { return 301 /elsewhere; }
    }
}
"#;
    let s = Server::start_ports("headerror", EP_CONF, 1, 1);
    write_file(&s.dir, "html/bad.html", b"our own 400 page\n");
    write_file(&s.dir, "html/long.html", b"too long, but fine\n");
    let a = s.addr();
    let r = raw(a, b"GET /x HTTP/1.1\r\nHost: a b\r\n\r\n");
    assert_eq!(r.status, 400);
    assert_eq!(r.body_str(), "our own 400 page\n");
    assert_eq!(r.header("Connection"), Some("close"));
    // A malformed request line too.
    let r = raw(a, b"GET /x HTTP/1.1 junk\r\nHost: ok\r\n\r\n");
    assert_eq!(
        (r.status, r.body_str().as_str()),
        (400, "our own 400 page\n")
    );
    // `=200`.
    let long = format!("GET /{} HTTP/1.1\r\nHost: ok\r\n\r\n", "a".repeat(20_000));
    let r = raw(a, long.as_bytes());
    assert_eq!(
        (r.status, r.body_str().as_str()),
        (200, "too long, but fine\n")
    );
    // The page's location redirects: its answer is sent (nginx 1.22: http_absolute_redirect.t),
    // named by the local address since the request had no valid host.
    let b = std::net::SocketAddr::from(([127, 0, 0, 1], s.ports[0]));
    let r = raw(b, b"GET /x HTTP/1.0\r\nHost: .\r\n\r\n");
    assert_eq!(r.status, 301);
    assert_eq!(
        r.header("Location").map(str::to_string),
        Some(format!("http://127.0.0.1:{}/elsewhere", b.port()))
    );
    let log = wait_for(Duration::from_secs(5), "access log", || {
        let t = std::fs::read_to_string(s.dir.join("logs/access.log")).unwrap_or_default();
        (t.lines().count() >= 4).then_some(t)
    });
    assert!(log.contains("400 \"GET /x HTTP/1.1\" /bad.html"), "{log}");
}
