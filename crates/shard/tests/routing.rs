//! Routing at configuration sizes hosting providers and ingress controllers reach (issue 38):
//! 10,000 server blocks, 5,000 prefix locations in one server and a 10,000-key `map`, through
//! the real binary. Which entry answers is checked at the first, the middle and the last
//! entry and for unknown ones; how fast is `shard-bench routing`'s business, not a test's.

mod support;

use std::fmt::Write;

use support::*;

const SERVERS: usize = 10_000;
const LOCATIONS: usize = 5_000;
const KEYS: usize = 10_000;

fn big_conf() -> String {
    let mut c = String::from(
        "worker_processes 1;\nerror_log logs/error.log;\nevents { worker_connections 64; }\n\
         http {\n    access_log off;\n    map $uri $m {\n        default none;\n",
    );
    for i in 0..KEYS {
        writeln!(c, "        /k{i} v{i};").unwrap();
    }
    c.push_str("    }\n    map $host $zone {\n        hostnames;\n        default none;\n");
    for i in 0..KEYS {
        writeln!(c, "        .z{i}.test z{i};").unwrap();
    }
    c.push_str(
        "    }\n    server {\n        listen 127.0.0.1:{port} default_server;\n\
         \x20       location = /status { shard_status; }\n\
         \x20       location /k { return 200 \"m=$m zone=$zone\"; }\n",
    );
    for i in 0..LOCATIONS {
        if i == 7 {
            c.push_str("        location ^~ /p7/ { return 200 \"stop p7\"; }\n");
        } else {
            writeln!(c, "        location /p{i}/ {{ return 200 \"p{i}\"; }}").unwrap();
        }
    }
    c.push_str("        location ~ ^/p(\\d+)/x\\.css$ { return 200 \"css $1\"; }\n");
    c.push_str("    }\n");
    for i in 0..SERVERS {
        writeln!(
            c,
            "    server {{ listen 127.0.0.1:{{port}}; server_name s{i}.test *.w{i}.test; \
             return 200 \"s{i} $server_name\"; }}"
        )
        .unwrap();
    }
    c.push_str("}\n");
    c
}

fn ask(s: &Server, host: &str, path: &str) -> String {
    let head = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    let r = raw(s.addr(), head.as_bytes());
    assert_eq!(r.status, 200, "{host} {path}");
    r.body_str()
}

#[test]
fn ten_thousand_servers_five_thousand_locations_and_big_maps() {
    let s = Server::start("routing", &big_conf(), 1);
    // Servers: exact names and leading wildcards, first, middle, last; case and a trailing
    // dot do not matter; an unknown name gets the default server.
    for i in [0, SERVERS / 2, SERVERS - 1] {
        assert_eq!(
            ask(&s, &format!("s{i}.test"), "/"),
            format!("s{i} s{i}.test")
        );
        assert_eq!(
            ask(&s, &format!("S{i}.Test."), "/"),
            format!("s{i} s{i}.test")
        );
        assert_eq!(
            ask(&s, &format!("a.b.w{i}.test"), "/"),
            format!("s{i} s{i}.test")
        );
    }
    assert_eq!(ask(&s, "unknown.test", "/p0/"), "p0");
    assert_eq!(ask(&s, "w1.test", "/p0/"), "p0", "*.w1.test is not w1.test");
    // Locations: the longest prefix among 5,000, the regex after it, `^~` before it.
    for i in [0, LOCATIONS / 2, LOCATIONS - 1] {
        assert_eq!(ask(&s, "h", &format!("/p{i}/a/b")), format!("p{i}"));
        assert_eq!(ask(&s, "h", &format!("/p{i}/x.css")), format!("css {i}"));
    }
    assert_eq!(ask(&s, "h", "/p7/x.css"), "stop p7");
    assert_eq!(ask(&s, "h", "/p77/x.css"), "css 77");
    // Maps: exact keys and, with `hostnames`, `.name` keys.
    for i in [0, KEYS / 2, KEYS - 1] {
        assert_eq!(
            ask(&s, &format!("www.z{i}.test"), &format!("/k{i}")),
            format!("m=v{i} zone=z{i}")
        );
    }
    assert_eq!(ask(&s, "z.test", "/k"), "m=none zone=none");
}

#[test]
fn server_name_is_the_first_name_as_nginx_keeps_it_and_regex_captures_are_variables() {
    let s = Server::start(
        "server-name-var",
        "worker_processes 1;\nevents {}\nhttp {\n\
         server { listen 127.0.0.1:{port}; server_name localhost;\n\
           location = /status { shard_status; }\n\
           location / { return 200 \"[$server_name]\"; } }\n\
         server { listen 127.0.0.1:{port}; server_name ~^(?P<name>[a-z]+)\\.example\\.com$;\n\
           location / { return 200 \"[$server_name][$name]\"; } }\n\
         server { listen 127.0.0.1:{port}; server_name *.wc.example.org wc.example.org;\n\
           location / { return 200 \"[$server_name]\"; } }\n\
         server { listen 127.0.0.1:{port}; server_name .dot.example.net;\n\
           location / { return 200 \"[$server_name]\"; } }\n\
         }\n",
        1,
    );
    let body = |host: &str| {
        raw(
            s.addr(),
            format!("GET / HTTP/1.0\r\nHost: {host}\r\n\r\n").as_bytes(),
        )
        .body_str()
    };
    assert_eq!(body("localhost"), "[localhost]");
    assert_eq!(
        body("BLAH.example.com"),
        "[~^(?P<name>[a-z]+)\\.example\\.com$][blah]"
    );
    assert_eq!(body("www.wc.example.org"), "[*.wc.example.org]");
    assert_eq!(body("wc.example.org"), "[*.wc.example.org]");
    assert_eq!(body("a.dot.example.net"), "[dot.example.net]");
}
