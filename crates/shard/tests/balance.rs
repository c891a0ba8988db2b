//! Load balancing over an `upstream` with a `keepalive` pool, as nginx does it: the balancer
//! chooses the peer (round robin, weights, `backup`, `down`) and the pool only saves the
//! connect to that peer; and with `proxy_next_upstream http_*`, the last peer's own answer
//! reaches the client when no peer is left. Where nginx is installed, the same `upstream`
//! blocks in front of the same test upstreams give the same splits in nginx.

mod support;

use std::net::SocketAddr;

use support::upstream::{Reply, Upstream};
use support::*;

/// The four peers: A, B, C (a backup) and D (down); each answers with its letter.
struct Peers {
    a: Upstream,
    b: Upstream,
    c: Upstream,
    d: Upstream,
}

impl Peers {
    fn start() -> Peers {
        Peers {
            a: Upstream::text("A"),
            b: Upstream::text("B"),
            c: Upstream::text("C"),
            d: Upstream::text("D"),
        }
    }
    fn counts(&self) -> [usize; 4] {
        [
            self.a.requests(),
            self.b.requests(),
            self.c.requests(),
            self.d.requests(),
        ]
    }
}

/// The `http` block's upstreams and the server's locations, for shard and nginx alike.
fn blocks(p: &Peers) -> (String, String) {
    let (a, b, c, d) = (p.a.port, p.b.port, p.c.port, p.d.port);
    let ups = format!(
        "upstream even {{ server 127.0.0.1:{a}; server 127.0.0.1:{b}; keepalive 4; }}\n\
         upstream weighted {{ server 127.0.0.1:{a} weight=3; server 127.0.0.1:{b}; keepalive 4; }}\n\
         upstream spare {{ server 127.0.0.1:{a}; server 127.0.0.1:{b}; server 127.0.0.1:{c} backup;\n\
             server 127.0.0.1:{d} down; keepalive 4; }}\n\
         proxy_http_version 1.1;\n\
         proxy_set_header Connection \"\";\n"
    );
    let locs = "location /even { proxy_pass http://even; }\n\
         location /weighted { proxy_pass http://weighted; }\n\
         location /spare { proxy_pass http://spare; }\n"
        .to_string();
    (ups, locs)
}

/// Requests `n` times `path` through `front`; the split over A, B, C, D.
fn split(front: SocketAddr, p: &Peers, path: &str, n: usize) -> [usize; 4] {
    let before = p.counts();
    for _ in 0..n {
        let r = get(front, path);
        assert_eq!(r.status, 200, "{path}");
    }
    let after = p.counts();
    [0, 1, 2, 3].map(|i| after[i] - before[i])
}

/// The splits of the three scenarios the issue names: 12 even, 100 weighted 3:1, 12 with a
/// backup and a down peer.
fn scenarios(front: SocketAddr, p: &Peers) -> Vec<[usize; 4]> {
    vec![
        split(front, p, "/even", 12),
        split(front, p, "/weighted", 100),
        split(front, p, "/spare", 12),
    ]
}

const WANT: [[usize; 4]; 3] = [[6, 6, 0, 0], [75, 25, 0, 0], [6, 6, 0, 0]];

#[test]
fn a_keepalive_pool_never_changes_which_peer_the_balancer_chooses() {
    let peers = Peers::start();
    let (ups, locs) = blocks(&peers);
    let conf = format!(
        "worker_processes 1;\nerror_log logs/error.log info;\nevents {{}}\nhttp {{\n\
         access_log off;\n{ups}server {{ listen 127.0.0.1:{{port}};\n\
         location = /status {{ shard_status; }}\n{locs}}}\n}}\n"
    );
    let s = Server::start("balance", &conf, 1);
    assert_eq!(scenarios(s.addr(), &peers), WANT);
    // And the pool did its part: a handful of connections for 124 requests.
    let opened = peers.a.accepted() + peers.b.accepted();
    assert!(
        opened <= 8,
        "{opened} upstream connections for 124 requests"
    );
}

#[test]
fn nginx_splits_the_same_upstream_blocks_the_same_way() {
    let Some(nginx) = nginx_binary() else {
        skipped(
            "nginx_splits_the_same_upstream_blocks_the_same_way",
            "nginx is not installed (apt-get install nginx-light; .ci/run does when root)",
        );
        return;
    };
    let peers = Peers::start();
    let (ups, locs) = blocks(&peers);
    let dir = temp_dir("balance-nginx");
    let port = free_port();
    let conf = format!(
        "daemon off;\nmaster_process on;\nworker_processes 1;\npid {d}/logs/nginx.pid;\n\
         error_log {d}/logs/nginx-error.log;\nevents {{ worker_connections 64; }}\n\
         http {{\n access_log off;\n{ups}server {{ listen 127.0.0.1:{port};\n{locs}}}\n}}\n",
        d = dir.display()
    );
    let _nginx = start_nginx(nginx, &dir, &conf, port);
    let front = SocketAddr::from(([127, 0, 0, 1], port));
    assert_eq!(scenarios(front, &peers), WANT, "nginx");
}

#[test]
fn with_no_peer_left_the_last_peers_own_answer_reaches_the_client() {
    let a = Upstream::start(|_| Reply::text(500, "from A"));
    let b = Upstream::start(|_| Reply::text(500, "from B"));
    let conf = format!(
        "worker_processes 1;\nerror_log logs/error.log info;\nevents {{}}\nhttp {{\n\
         access_log off;\n\
         upstream pair {{ server 127.0.0.1:{}; server 127.0.0.1:{}; }}\n\
         server {{ listen 127.0.0.1:{{port}};\n\
         location = /status {{ shard_status; }}\n\
         location / {{ proxy_pass http://pair; proxy_next_upstream error timeout http_500; }}\n\
         location /one {{ proxy_pass http://pair; proxy_next_upstream error timeout http_500;\n\
             proxy_next_upstream_tries 1; }}\n\
         }}\n}}\n",
        a.port, b.port
    );
    let s = Server::start("balance-last", &conf, 1);
    // Both peers answer 500: the first is retried, the second's answer is passed on.
    let r = get(s.addr(), "/x");
    assert_eq!(r.status, 500);
    let body = r.body_str();
    assert!(
        body == "from A" || body == "from B",
        "shard's own page: {body}"
    );
    assert_eq!(a.requests() + b.requests(), 2);
    // With one try allowed, the first answer is the last one.
    let r = get(s.addr(), "/one");
    assert_eq!(r.status, 500);
    assert!(r.body_str().starts_with("from "), "{}", r.body_str());
    assert_eq!(a.requests() + b.requests(), 3);
}
