//! The same configuration and the same requests through shard and through a real nginx
//! (issue 12): statuses, the headers nginx users rely on, and bodies must agree. Needs
//! `nginx` on the machine (`apt-get install nginx-light`; `.ci/run` installs it); without it
//! the test says SKIPPED and checks nothing.

mod support;

use std::io::Read;
use std::net::SocketAddr;
use std::path::Path;

use support::*;

/// One configuration body (inside `http { }`), the same for both servers but for `{STATUS}`
/// (`shard_status` or `stub_status`), `{port}` and `{dir}`.
const HTTP: &str = r#"
    include mime.types;
    default_type application/octet-stream;
    access_log logs/access.log;
    log_format main '$remote_addr "$request" $status';
    map $http_user_agent $kind {
        default browser;
        ~*bot   robot;
    }
    map $host $site {
        hostnames;
        default other;
        .example.com example;
    }
    split_clients "${arg_u}x" $variant {
        10%    a;
        20.5%  b;
        *      c;
    }
    map $http_x_tier $tier {
        default std;
        ~^gold  gold;
    }
    set_real_ip_from 127.0.0.1;
    server {
        listen 127.0.0.1:{port};
        server_name diff.test;
        root {dir}/html;
        error_page 404 /errors/404.html;
        location = /status { {STATUS}; }
        location /errors/ { internal; }
        location = /ret { return 200 "m=$request_method u=$uri a=$args q=$arg_q h=$http_x_h k=$kind s=$site r=$remote_addr"; }
        location = /https { return 301 https://$host$request_uri; }
        location = /rel { return 302 /elsewhere?x=1; }
        location = /teapot { return 418; }
        location /spa/ { try_files $uri $uri/ /spa/index.html; }
        location /strict/ { try_files $uri =404; }
        location /named/ { error_page 404 = @fallback; }
        location @fallback { return 200 "fallback $uri"; }
        location /soft/ { error_page 404 =200 /errors/empty.txt; }
        location ~* \.(png|css)$ { expires 1h; add_header X-Asset yes; }
        location ~ ^/user/(\d+)/(\w+)$ { return 200 "user $1 $2"; }
        location ^~ /static/ { add_header X-Static 1 always; }
        location /old/ { rewrite ^/old/(.*)$ /new/$1 permanent; }
        location /moved/ { rewrite ^/moved/(\w+)$ /target/$1?from=moved last; }
        location /target/ { return 200 "target $uri $args"; }
        location /vars/ {
            set $who $arg_who;
            if ($who = "") { set $who world; }
            if ($request_method = POST) { return 405; }
            return 200 "hello $who";
        }
        location /admin/ { allow 10.0.0.0/8; deny all; }
        location /text/ { charset utf-8; }
        location /gz/ { gzip on; gzip_min_length 1; gzip_types text/plain; gzip_vary on; }
        location /hdr/ { add_header X-Frame-Options SAMEORIGIN; add_header X-Always a always; }
        location = /close { return 444; }
        location /app/ { try_files $uri @app; }
        location @app { return 200 "app $uri $request_method"; }
        location /deb/ { try_files $uri $uri/ =404; }
        location = /tier { return 200 "tier=$tier"; }
        location = /split { return 200 "$variant"; }
        location /gate/ { deny all; return 301 https://$host$request_uri; }
        location /cs/ { charset utf-8; client_max_body_size 1; }
        location /cors/ {
            add_header X-Location loc;
            if ($request_method = OPTIONS) {
                add_header Access-Control-Allow-Origin *;
                return 204;
            }
            return 200 "cors";
        }
        location /p/ {
            proxy_pass http://127.0.0.1:{port1};
            proxy_hide_header X-Secret;
            proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
        }
        location /q/ { proxy_pass http://127.0.0.1:{port1}/inner/; }
    }
    server {
        listen 127.0.0.1:{port1};
        location / {
            add_header X-Secret s;
            add_header X-Static backend;
            return 200 "backend $request_uri xff=$http_x_forwarded_for host=$http_host";
        }
        location /p/go { return 302 /p/there; }
        location /inner/go { return 301 /inner/there?x=1; }
    }
"#;

fn files(dir: &Path) {
    // nginx's own types where it installed them, else shard's bundled copy of them.
    let types = std::fs::read("/etc/nginx/mime.types")
        .unwrap_or_else(|_| shard_config::MIME_TYPES.as_bytes().to_vec());
    write_file(dir, "mime.types", &types);
    write_file(dir, "html/index.html", b"<h1>index</h1>");
    write_file(dir, "html/ten.txt", b"0123456789");
    write_file(dir, "html/errors/404.html", b"custom 404\n");
    write_file(dir, "html/errors/empty.txt", b"");
    write_file(dir, "html/spa/index.html", b"spa shell");
    write_file(dir, "html/spa/app.js", b"js");
    write_file(dir, "html/strict/here.txt", b"here");
    write_file(dir, "html/a.css", b"body{}");
    write_file(dir, "html/static/s.txt", b"static");
    write_file(dir, "html/admin/x.txt", b"admin");
    write_file(dir, "html/text/t.txt", b"text");
    write_file(dir, "html/text/t.json", b"{}");
    let big: String = (0..2000)
        .map(|i| format!("line {i} of a compressible text file\n"))
        .collect();
    write_file(dir, "html/gz/big.txt", big.as_bytes());
    write_file(dir, "html/hdr/h.txt", b"h");
    write_file(dir, "html/app/index.html", b"app index");
    write_file(dir, "html/app/f.txt", b"app file");
    write_file(dir, "html/deb/sub/index.html", b"deb sub");
    // One modification time for both servers' copies: files written on either side of a
    // second's edge would otherwise differ in `ETag` and `Last-Modified`.
    fn same_mtime(p: &Path) {
        for e in std::fs::read_dir(p).unwrap().flatten() {
            let path = e.path();
            if path.is_dir() {
                same_mtime(&path);
            } else {
                let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_790_000_000);
                std::fs::File::options()
                    .write(true)
                    .open(&path)
                    .and_then(|f| f.set_modified(t))
                    .unwrap();
            }
        }
    }
    same_mtime(&dir.join("html"));
}

/// The requests, as raw heads (`Connection: close` is added).
const REQUESTS: &[&str] = &[
    "GET / HTTP/1.1\r\nHost: diff.test",
    "GET /ret?q=1&z=2 HTTP/1.1\r\nHost: a.example.com\r\nX-H: one\r\nUser-Agent: SomeBot/1",
    "GET /ret HTTP/1.1\r\nHost: h\r\nX-Real-IP: 198.51.100.7",
    "HEAD /ret HTTP/1.1\r\nHost: h",
    "GET /https?a=b HTTP/1.1\r\nHost: Site.Test:8443",
    "GET /rel HTTP/1.1\r\nHost: site.test",
    "GET /teapot HTTP/1.1\r\nHost: h",
    "GET /missing.html HTTP/1.1\r\nHost: h",
    "GET /errors/404.html HTTP/1.1\r\nHost: h",
    "GET /spa/app.js HTTP/1.1\r\nHost: h",
    "GET /spa/deep/route?x=1 HTTP/1.1\r\nHost: h",
    "GET /strict/here.txt HTTP/1.1\r\nHost: h",
    "GET /strict/gone.txt HTTP/1.1\r\nHost: h",
    "GET /named/x HTTP/1.1\r\nHost: h",
    "GET /soft/x HTTP/1.1\r\nHost: h",
    "GET /a.css HTTP/1.1\r\nHost: h",
    "GET /static/s.txt HTTP/1.1\r\nHost: h",
    "GET /static/none.txt HTTP/1.1\r\nHost: h",
    "GET /user/42/edit HTTP/1.1\r\nHost: h",
    "GET /old/page?x=1 HTTP/1.1\r\nHost: h",
    "GET /moved/abc?q=2 HTTP/1.1\r\nHost: h",
    "GET /vars/ HTTP/1.1\r\nHost: h",
    "GET /vars/?who=you HTTP/1.1\r\nHost: h",
    "POST /vars/ HTTP/1.1\r\nHost: h\r\nContent-Length: 0",
    "GET /admin/x.txt HTTP/1.1\r\nHost: h",
    "GET /text/t.txt HTTP/1.1\r\nHost: h",
    "GET /text/t.json HTTP/1.1\r\nHost: h",
    "GET /ten.txt HTTP/1.1\r\nHost: h\r\nRange: bytes=2-4",
    "GET /ten.txt HTTP/1.1\r\nHost: h\r\nRange: bytes=0-1,5-6",
    "GET /ten.txt HTTP/1.1\r\nHost: h\r\nRange: bytes=20-30",
    "GET /gz/big.txt HTTP/1.1\r\nHost: h\r\nAccept-Encoding: gzip",
    "HEAD /gz/big.txt HTTP/1.1\r\nHost: h\r\nAccept-Encoding: gzip",
    "GET /gz/big.txt HTTP/1.1\r\nHost: h\r\nAccept-Encoding: gzip\r\nVia: 1.1 cache",
    "GET /hdr/h.txt HTTP/1.1\r\nHost: h",
    "GET /hdr/none.txt HTTP/1.1\r\nHost: h",
    "GET /close HTTP/1.1\r\nHost: h",
    "OPTIONS /cors/x HTTP/1.1\r\nHost: h",
    "GET /cors/x HTTP/1.1\r\nHost: h",
    "GET /spa HTTP/1.1\r\nHost: h",
    "POST /ten.txt HTTP/1.1\r\nHost: h\r\nContent-Length: 0",
    "HEAD /ten.txt HTTP/1.1\r\nHost: h",
    "GET /ten.txt HTTP/1.1\r\nHost: h\r\nIf-None-Match: \"ETAG\"",
    "GET /p/x?y=1 HTTP/1.1\r\nHost: h\r\nX-Forwarded-For: 203.0.113.1",
    "GET /p/go HTTP/1.1\r\nHost: h",
    "GET /q/go HTTP/1.1\r\nHost: h",
    "GET /q/a%20b HTTP/1.1\r\nHost: h",
    "GET /app/ HTTP/1.1\r\nHost: h",
    "GET /app/f.txt HTTP/1.1\r\nHost: h",
    "POST /app/ HTTP/1.1\r\nHost: h\r\nContent-Length: 0",
    "GET /deb/sub?a=1 HTTP/1.1\r\nHost: h",
    "GET /deb/sub/ HTTP/1.1\r\nHost: h",
    "GET /tier HTTP/1.1\r\nHost: h\r\nX-Tier: golden",
    "GET /tier HTTP/1.1\r\nHost: h",
    "GET /gate/x?y HTTP/1.1\r\nHost: h",
    "POST /cs/x HTTP/1.1\r\nHost: h\r\nContent-Length: 10",
    "GET /cs/none HTTP/1.1\r\nHost: h",
    "GET / HTTP/1.1\r\nHost: localhost: evil",
    "GET / HTTP/1.1\r\nHost: localhost:a b",
    "GET / HTTP/1.1\r\nHost: localhost:80/../x",
    "GET http://h/ HTTP/1.1",
    "GET /split?u=1 HTTP/1.1\r\nHost: h",
    "GET /split?u=7 HTTP/1.1\r\nHost: h",
    "GET /split?u=42 HTTP/1.1\r\nHost: h",
    "GET /split?u=alpha HTTP/1.1\r\nHost: h",
    "GET /split?u=bravo HTTP/1.1\r\nHost: h",
    "GET /split?u=charlie HTTP/1.1\r\nHost: h",
    "GET /split?u=delta HTTP/1.1\r\nHost: h",
    "GET /split?u=echo HTTP/1.1\r\nHost: h",
    "GET /split?u=foxtrot HTTP/1.1\r\nHost: h",
    "GET /split?u=0 HTTP/1.1\r\nHost: h",
];

/// The headers compared (besides the status and the body).
const HEADERS: &[&str] = &[
    "location",
    "content-type",
    "content-range",
    "content-encoding",
    "vary",
    "cache-control",
    "x-asset",
    "x-static",
    "x-frame-options",
    "x-always",
    "etag",
    "last-modified",
    "accept-ranges",
    "access-control-allow-origin",
    "x-location",
];

#[derive(PartialEq)]
struct Answer {
    status: u16,
    headers: Vec<(String, Option<String>)>,
    body: Vec<u8>,
    /// `Expires` was sent (its value depends on the second it was sent).
    expires: bool,
}

fn ask(addr: SocketAddr, head: &str) -> Answer {
    // `return 444` closes: the status is then 0 and the body empty.
    let (status, hs, body) = exchange(addr, head);
    let get = |n: &str| hs.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone());
    let mut body = body;
    if get("transfer-encoding").is_some_and(|t| t.contains("chunked")) {
        body = dechunk(&body);
    }
    if get("content-encoding").as_deref() == Some("gzip") && !body.is_empty() {
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(&body[..])
            .read_to_end(&mut out)
            .expect("gzip body");
        body = out;
    }
    Answer {
        status,
        headers: HEADERS.iter().map(|h| (h.to_string(), get(h))).collect(),
        body,
        expires: get("expires").is_some(),
    }
}

impl std::fmt::Debug for Answer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let body = String::from_utf8_lossy(&self.body);
        let body: String = body.chars().take(160).collect();
        let hs: Vec<String> = self
            .headers
            .iter()
            .filter_map(|(k, v)| v.as_ref().map(|v| format!("{k}: {v}")))
            .collect();
        write!(
            f,
            "{} [{}] expires={} body({} bytes)={body:?}",
            self.status,
            hs.join("; "),
            self.expires,
            self.body.len()
        )
    }
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(i) = find(b, b"\r\n") {
        let n = usize::from_str_radix(String::from_utf8_lossy(&b[..i]).trim(), 16).unwrap_or(0);
        if n == 0 {
            break;
        }
        out.extend_from_slice(&b[i + 2..i + 2 + n]);
        b = &b[i + 2 + n + 2..];
    }
    out
}

/// What is allowed to differ: the server's name in error pages, the ports in absolute URLs,
/// and the multipart boundary.
fn normalize(mut a: Answer, ports: &[u16]) -> Answer {
    let mut body = String::from_utf8_lossy(&a.body)
        .replace(
            "<hr><center>nginx/1.22.1</center>",
            "<hr><center>SERVER</center>",
        )
        .replace("<hr><center>nginx</center>", "<hr><center>SERVER</center>")
        .replace("<hr><center>shard</center>", "<hr><center>SERVER</center>");
    for (i, p) in ports.iter().enumerate() {
        body = body.replace(&format!(":{p}"), &format!(":PORT{i}"));
    }
    let boundary = a.headers.iter().find_map(|(k, v)| {
        (k == "content-type")
            .then_some(v.as_deref())
            .flatten()
            .and_then(|v| v.strip_prefix("multipart/byteranges; boundary="))
            .map(str::to_string)
    });
    let body = match &boundary {
        Some(b) => body.replace(b.as_str(), "BOUNDARY"),
        None => body,
    };
    a.body = body.into_bytes();
    for (_, v) in &mut a.headers {
        if let Some(s) = v {
            for (i, p) in ports.iter().enumerate() {
                *s = s.replace(&format!(":{p}"), &format!(":PORT{i}"));
            }
            if let Some(b) = &boundary {
                *s = s.replace(b.as_str(), "BOUNDARY");
            }
        }
    }
    a
}

#[test]
fn shard_and_nginx_answer_the_same() {
    let Some(nginx) = nginx_binary() else {
        skipped(
            "shard_and_nginx_answer_the_same",
            "nginx is not installed (apt-get install nginx-light)",
        );
        return;
    };
    let conf = |status: &str, port: u16, port1: u16, dir: &Path, nginx: bool| {
        let head = if nginx {
            format!(
                "daemon off;\npid {}/nginx.pid;\nevents {{ worker_connections 64; }}\n",
                dir.display()
            )
        } else {
            "events { worker_connections 64; }\n".to_string()
        };
        format!(
            "worker_processes 1;\n{head}http {{\n{}\n}}\n",
            HTTP.replace("{STATUS}", status)
                .replace("{port}", &port.to_string())
                .replace("{port1}", &port1.to_string())
                .replace("{dir}", dir.to_str().unwrap())
        )
    };
    // shard: `Server::start` fills `{port}` and `{dir}` itself.
    let shard_conf = format!(
        "worker_processes 1;\nevents {{ worker_connections 64; }}\nhttp {{\n{}\n}}\n",
        HTTP.replace("{STATUS}", "shard_status")
    );
    let s = Server::start_ports("differential", &shard_conf, 1, 1);
    files(&s.dir);
    let ndir = temp_dir("differential-nginx");
    files(&ndir);
    let nport = free_port();
    let nport1 = free_port();
    let _n = start_nginx(
        nginx,
        &ndir,
        &conf("stub_status", nport, nport1, &ndir, true),
        nport,
    );
    let naddr: SocketAddr = ([127, 0, 0, 1], nport).into();
    let mut differences = Vec::new();
    let etag = ask(naddr, "GET /ten.txt HTTP/1.1\r\nHost: h").headers[10]
        .1
        .clone()
        .unwrap_or_default();
    for r in REQUESTS {
        let r = &r.replace("\"ETAG\"", &etag);
        let want = normalize(ask(naddr, r), &[nport, nport1]);
        let got = normalize(ask(s.addr(), r), &[s.port, s.ports[0]]);
        if std::env::var_os("DIFF_SHOW").is_some() {
            eprintln!("{r:?} => {got:?}");
        }
        if want != got {
            differences.push(format!("{r:?}\n  nginx: {want:?}\n  shard: {got:?}"));
        }
    }
    eprintln!(
        "differential: {} requests, {} differences",
        REQUESTS.len(),
        differences.len()
    );
    assert!(differences.is_empty(), "{}", differences.join("\n"));
}
