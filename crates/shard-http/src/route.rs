//! Choosing the virtual server and the location for a request, by nginx's rules.
//!
//! Server: among the servers on the connection's listening address, an exact name wins, then
//! the longest wildcard starting with `*` (or `.name`), then the longest wildcard ending with
//! `*`, then the first regular expression that matches, else the address's default server. Location: nginx's search (see
//! [`find_location_index`]): exact, then the longest prefix, then regexes, else the server's
//! own settings. This module does not look at methods, files or the network.

use shard_config::{Listener, LocationConf, LocationKind, ServerConf};

/// Index into `http.servers` of the server for `host` (lowercase, without port) on `listener`:
/// an exact name, the longest leading wildcard, the longest trailing one, the first regular
/// expression, else the address's default server (`Listener::names`, built with the
/// configuration: no scan of the servers). A request without a host matches only
/// `server_name ""`.
pub fn select_server(listener: &Listener, host: Option<&str>) -> usize {
    let host = host.unwrap_or("");
    let ix = &listener.names;
    if let Some(i) = ix.exact(host) {
        return i;
    }
    if host.is_empty() {
        return listener.default_server;
    }
    ix.wildcard(host)
        .or_else(|| ix.regex(host))
        .unwrap_or(listener.default_server)
}

/// `$server_name`: the server's first exact name, or "".
pub fn server_name(srv: &ServerConf) -> &str {
    &srv.name
}

/// Byte ranges in the matched path of a regex location's groups (`$0` the whole match, `$1`
/// ...), `None` for a group that did not take part.
pub type Captures = Vec<Option<(usize, usize)>>;

/// The location of `server` for the normalized `path`, or `server.base` when none matches.
pub fn find_location<'a>(server: &'a ServerConf, path: &str) -> &'a LocationConf {
    let mut caps = Captures::new();
    find_location_index(server, path, &mut caps).map_or(&server.base, |i| &server.locations[i])
}

/// nginx's search, as an index into `server.locations` (`None`: the server's own settings),
/// with the captures of the regex that chose it in `caps` (cleared otherwise):
///
/// an exact location equal to `path` wins at once; else the longest prefix is remembered, and
/// wins at once when it is `^~`; else the regex locations are tried in file order, those
/// nested in the remembered prefix first, then outward level by level; the first that
/// matches wins (and a regex nested in it that matches wins over it); else the prefix.
/// Named locations are never found here. Exact and prefix locations are found through
/// `ServerConf::index` in time proportional to the path's length, whatever their number.
pub fn find_location_index(server: &ServerConf, path: &str, caps: &mut Captures) -> Option<usize> {
    caps.clear();
    let locs = &server.locations;
    let ix = &server.index;
    if let Some(i) = ix.exact(path) {
        return Some(i);
    }
    let best = ix.longest_prefix(path);
    if let Some(b) = best {
        if locs[b].kind == LocationKind::PrefixNoRegex {
            return best;
        }
    }
    // Levels from the remembered prefix outward to the server.
    let mut level = best;
    loop {
        if let Some(i) = first_regex(server, level, path, caps) {
            // A regex nested in the one that matched is searched too.
            let mut inner = Captures::new();
            if let Some(j) = first_regex(server, Some(i), path, &mut inner) {
                *caps = inner;
                return Some(j);
            }
            return Some(i);
        }
        match level {
            Some(l) => level = locs[l].parent,
            None => break,
        }
    }
    best
}

/// The first regex location whose parent is `parent` and that matches `path`.
fn first_regex(
    server: &ServerConf,
    parent: Option<usize>,
    path: &str,
    caps: &mut Captures,
) -> Option<usize> {
    for &i in server.index.regexes_in(parent) {
        let i = i as usize;
        let Some(re) = &server.locations[i].regex else {
            continue;
        };
        if re.captures_into(path, caps) {
            return Some(i);
        }
    }
    None
}

/// The names of `re`'s groups (`(?<lang>...)`) by index into `out`; none without a regex.
pub fn capture_names_into(out: &mut Vec<Option<String>>, re: Option<&shard_config::Regex>) {
    out.clear();
    if let Some(re) = re {
        out.extend(re.capture_names().iter().cloned());
    }
}

/// The named location `name` (with its `@`) of `server`.
pub fn named_location<'a>(server: &'a ServerConf, name: &str) -> Option<&'a LocationConf> {
    server.index.named(name).map(|i| &server.locations[i])
}

/// The linear scans the indexes replaced, kept as the oracle of the property tests: what they
/// choose is the specification the indexes must meet.
#[cfg(test)]
pub(crate) mod oracle {
    use super::*;
    use shard_config::{HttpConf, ServerName};

    /// Index into `http.servers` of the server for `host` (lowercase, without port) on `listener`.
    /// A request without a host matches only `server_name ""`.
    pub fn select_server_scan(http: &HttpConf, listener: &Listener, host: Option<&str>) -> usize {
        let host = host.unwrap_or("");
        let candidates = || {
            listener
                .servers
                .iter()
                .copied()
                .filter_map(|i| http.servers.get(i).map(|s| (i, s)))
        };
        for (i, s) in candidates() {
            if s.server_names
                .iter()
                .any(|n| matches!(n, ServerName::Exact(e) if e == host))
            {
                return i;
            }
        }
        if host.is_empty() {
            return listener.default_server;
        }
        // Longest wildcard starting with '*' (or a '.name' form), measured as "*.name" would be.
        let mut best: Option<(usize, usize)> = None;
        for (i, s) in candidates() {
            for n in &s.server_names {
                let len = match n {
                    ServerName::WildcardPrefix(suffix)
                        if host.len() > suffix.len() && host.ends_with(suffix.as_str()) =>
                    {
                        suffix.len()
                    }
                    ServerName::Dot(name)
                        if host == name
                            || (host.len() > name.len()
                                && host.ends_with(name.as_str())
                                && host.as_bytes()[host.len() - name.len() - 1] == b'.') =>
                    {
                        name.len() + 1
                    }
                    _ => continue,
                };
                if best.map(|(_, l)| l) < Some(len) {
                    best = Some((i, len));
                }
            }
        }
        if let Some((i, _)) = best {
            return i;
        }
        for (i, s) in candidates() {
            for n in &s.server_names {
                if let ServerName::WildcardSuffix(prefix) = n {
                    if host.len() > prefix.len() && host.starts_with(prefix.as_str()) {
                        let len = prefix.len();
                        if best.map(|(_, l)| l) < Some(len) {
                            best = Some((i, len));
                        }
                    }
                }
            }
        }
        if let Some((i, _)) = best {
            return i;
        }
        // Regular expressions, in the order written.
        for (i, s) in candidates() {
            for n in &s.server_names {
                if let ServerName::Regex(r) = n {
                    if r.0.is_match(host) {
                        return i;
                    }
                }
            }
        }
        listener.default_server
    }

    /// nginx's search, as an index into `server.locations` (`None`: the server's own settings),
    /// with the captures of the regex that chose it in `caps` (cleared otherwise):
    ///
    /// an exact location equal to `path` wins at once; else the longest prefix is remembered, and
    /// wins at once when it is `^~`; else the regex locations are tried in file order, those
    /// nested in the remembered prefix first, then outward level by level; the first that
    /// matches wins (and a regex nested in it that matches wins over it); else the prefix.
    /// Named locations are never found here.
    pub fn find_location_index_scan(
        server: &ServerConf,
        path: &str,
        caps: &mut Captures,
    ) -> Option<usize> {
        caps.clear();
        let locs = &server.locations;
        let mut best: Option<usize> = None;
        for (i, loc) in locs.iter().enumerate() {
            match loc.kind {
                LocationKind::Exact => {
                    if loc.path == path {
                        return Some(i);
                    }
                }
                LocationKind::Prefix | LocationKind::PrefixNoRegex => {
                    if path.starts_with(loc.path.as_str())
                        && best.map(|b| locs[b].path.len()) < Some(loc.path.len())
                    {
                        best = Some(i);
                    }
                }
                LocationKind::Regex | LocationKind::Named => {}
            }
        }
        if let Some(b) = best {
            if locs[b].kind == LocationKind::PrefixNoRegex {
                return best;
            }
        }
        // Levels from the remembered prefix outward to the server.
        let mut level = best;
        loop {
            if let Some(i) = first_regex_scan(locs, level, path, caps) {
                // A regex nested in the one that matched is searched too.
                let mut inner = Captures::new();
                if let Some(j) = first_regex_scan(locs, Some(i), path, &mut inner) {
                    *caps = inner;
                    return Some(j);
                }
                return Some(i);
            }
            match level {
                Some(l) => level = locs[l].parent,
                None => break,
            }
        }
        best
    }

    /// The first regex location whose parent is `parent` and that matches `path`.
    fn first_regex_scan(
        locs: &[LocationConf],
        parent: Option<usize>,
        path: &str,
        caps: &mut Captures,
    ) -> Option<usize> {
        for (i, loc) in locs.iter().enumerate() {
            if loc.kind != LocationKind::Regex || loc.parent != parent {
                continue;
            }
            let Some(re) = &loc.regex else { continue };
            if re.captures_into(path, caps) {
                return Some(i);
            }
        }
        None
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use shard_config::{HttpConf, ListenOpts, Place, ServerName};
    use std::path::PathBuf;
    use std::sync::Arc;

    pub(crate) fn loc(kind: LocationKind, path: &str) -> LocationConf {
        let mut types = shard_config::MimeTypes::default();
        types.insert("html".to_string(), "text/html".to_string());
        types.insert("css".to_string(), "text/css".to_string());
        LocationConf {
            flv: false,
            msie_refresh: false,
            kind,
            path: path.to_string(),
            regex: None,
            parent: None,
            place: Place {
                file: "t.conf".into(),
                line: 1,
            },
            ret: None,
            handler: None,
            root: PathBuf::from("/srv/html"),
            alias: None,
            alias_from: None,
            geoip: None,
            userid: None,
            doc_root_vars: None,
            index: vec!["index.html".into()],
            index_vars: None,
            default_type: "text/plain".into(),
            types: Arc::new(types),
            keepalive_timeout_ms: 75_000,
            keepalive_header: None,
            keepalive_requests: 1000,
            keepalive_time_ms: 3_600_000,
            keepalive_disable: shard_config::KeepaliveDisable {
                msie6: true,
                safari: false,
            },
            client_max_body_size: 1 << 20,
            send_timeout_ms: 60_000,
            auth_delay_ms: 0,
            client_body_timeout_ms: 60_000,
            http2_chunk_size: 8 * 1024,
            body: shard_config::BodyConf {
                buffer_size: 8192,
                temp_path: shard_config::TempPath {
                    path: PathBuf::from("/tmp"),
                    levels: Vec::new(),
                },
                in_file_only: shard_config::InFileOnly::Off,
                in_single_buffer: false,
            },
            lingering: shard_config::Lingering {
                close: shard_config::LingeringClose::On,
                time_ms: 30_000,
                timeout_ms: 5_000,
            },
            disable_symlinks: Default::default(),
            sendfile: false,
            open_file_cache: Default::default(),
            tcp_nodelay: true,
            access_logs: Vec::new(),
            gzip: Default::default(),
            add_headers: Vec::new(),
            add_trailers: Vec::new(),
            sub_filter: Default::default(),
            ssi: Default::default(),
            addition: Default::default(),
            post_action: None,
            dav: Default::default(),
            mirrors: Vec::new(),
            mirror_request_body: true,
            log_subrequest: false,
            auth_request: None,
            auth_request_set: Vec::new(),
            source_charset: None,
            override_charset: false,
            recode: None,
            expires: None,
            server_tokens: true,
            access_rules: Vec::new(),
            referers: None,
            secure_link: None,
            error_pages: Vec::new(),
            try_files: None,
            needs_head: false,
            upstream_vars: false,
            internal: false,
            log_not_found: true,
            rewrite_log: false,
            chunked_transfer_encoding: true,
            max_ranges: None,
            random_index: false,
            slice_size: 0,
            recursive_error_pages: false,
            autoindex: Default::default(),
            if_modified_since: shard_config::IfModifiedSince::Exact,
            etag: true,
            open_log_file_cache: None,
            error_logs: None,
            auth_basic: None,
            limit_except: None,
            satisfy_any: false,
            limit_rate: shard_config::SizeValue::Fixed(0),
            limit_rate_after: shard_config::SizeValue::Fixed(0),
            absolute_redirect: true,
            port_in_redirect: true,
            server_name_in_redirect: false,
            charset: None,
            charset_types: vec!["text/html".into()],
            real_ip: Default::default(),
            limit_req: Vec::new(),
            limit_req_status: 503,
            limit_req_dry_run: false,
            limit_conn_dry_run: false,
            limit_req_log_level: shard_config::LogLevel::Error,
            limit_conn: Vec::new(),
            limit_conn_status: 503,
            limit_conn_log_level: shard_config::LogLevel::Error,
            script: Vec::new(),
            proxy_pass: None,
            proxy: Default::default(),
            fastcgi: None,
            grpc: false,
            gateway: None,
            resolver: None,
        }
    }

    fn server(names: Vec<ServerName>, locations: Vec<LocationConf>) -> ServerConf {
        ServerConf {
            place: Place {
                file: "t.conf".into(),
                line: 1,
            },
            listen: vec![],
            ssl: Default::default(),
            server_names: names,
            name: String::new(),
            client_header_timeout_ms: 60_000,
            client_header_buffer_size: 1024,
            large_client_header_buffers: (4, 8192),
            underscores_in_headers: false,
            merge_slashes: true,
            http2: shard_config::Http2Conf::default(),
            http3: shard_config::Http3Conf::default(),
            ignore_invalid_headers: true,
            base: loc(LocationKind::Prefix, ""),
            index: shard_config::index::LocationIndex::build(&locations),
            locations,
            script: Vec::new(),
        }
    }

    pub(crate) fn listener(
        http: &HttpConf,
        servers: Vec<usize>,
        default_server: usize,
    ) -> Listener {
        Listener {
            kind: shard_config::ListenerKind::Http,
            addr: "127.0.0.1:80".parse().unwrap(),
            opts: ListenOpts::default(),
            names: Arc::new(shard_config::index::ServerIndex::build(
                &http.servers,
                &servers,
            )),
            servers,
            default_server,
            place: Place {
                file: "t.conf".into(),
                line: 1,
            },
        }
    }

    fn setup() -> (HttpConf, Listener) {
        use ServerName::*;
        let http = HttpConf {
            charset_maps: Vec::new(),
            maps: vec![],
            limit_zones: vec![],
            cache_paths: vec![],
            servers: vec![
                server(vec![Exact("default.test".into())], vec![]),
                server(vec![WildcardPrefix(".example.com".into())], vec![]),
                server(vec![Exact("exact.example.com".into())], vec![]),
                server(vec![WildcardPrefix(".deep.example.com".into())], vec![]),
                server(vec![WildcardSuffix("www.example.".into())], vec![]),
                server(vec![Dot("dot.test".into())], vec![]),
                server(vec![Exact("".into())], vec![]),
                server(vec![Exact("elsewhere.test".into())], vec![]),
            ],
            upstreams: vec![],
        };
        let listener = listener(&http, vec![0, 1, 2, 3, 4, 5, 6], 0);
        (http, listener)
    }

    #[test]
    fn server_selection() {
        let (http, l) = setup();
        let s = |h: Option<&str>| select_server(&l, h);
        assert_eq!(s(Some("exact.example.com")), 2);
        assert_eq!(s(Some("other.example.com")), 1);
        assert_eq!(s(Some("a.deep.example.com")), 3, "longest leading wildcard");
        assert_eq!(
            s(Some("example.com")),
            0,
            "*.example.com does not match example.com"
        );
        assert_eq!(s(Some("www.example.org")), 4);
        assert_eq!(
            s(Some("www.example.com")),
            1,
            "leading wildcards before trailing ones"
        );
        assert_eq!(s(Some("dot.test")), 5);
        assert_eq!(s(Some("a.dot.test")), 5);
        assert_eq!(s(Some("adot.test")), 0);
        assert_eq!(s(Some("unknown.test")), 0);
        assert_eq!(s(Some("elsewhere.test")), 0, "server not on this listener");
        assert_eq!(s(None), 6, "server_name \"\" takes requests without Host");
        let l2 = listener(&http, vec![0, 1], 1);
        assert_eq!(select_server(&l2, None), 1);
        assert_eq!(select_server(&l2, Some("zzz")), 1);
    }

    #[test]
    fn location_selection() {
        use LocationKind::*;
        let srv = server(
            vec![],
            vec![
                loc(Exact, "/status"),
                loc(Prefix, "/"),
                loc(PrefixNoRegex, "/static/"),
                loc(Prefix, "/static/deeper/"),
                loc(Prefix, "/files/"),
                loc(Prefix, "/status"),
            ],
        );
        let f = |p: &str| {
            let l = find_location(&srv, p);
            (l.kind, l.path.clone())
        };
        assert_eq!(f("/status"), (Exact, "/status".into()));
        assert_eq!(f("/status/x"), (Prefix, "/status".into()));
        assert_eq!(f("/static/a"), (PrefixNoRegex, "/static/".into()));
        assert_eq!(f("/static/deeper/a"), (Prefix, "/static/deeper/".into()));
        assert_eq!(f("/files/x"), (Prefix, "/files/".into()));
        assert_eq!(f("/other"), (Prefix, "/".into()));
        let none = server(vec![], vec![loc(Prefix, "/only/")]);
        assert_eq!(find_location(&none, "/x").path, "");
    }

    /// A small deterministic generator for the property tests (xorshift64*).
    pub(crate) struct Rng(pub u64);

    impl Rng {
        pub fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }
        pub fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
        pub fn pick<'a>(&mut self, xs: &[&'a str]) -> &'a str {
            xs[self.below(xs.len())]
        }
    }

    /// A name of 1 to 3 labels from a few, so that names, wildcards and hosts collide often.
    fn labels(r: &mut Rng, max: usize) -> String {
        let n = 1 + r.below(max);
        (0..n)
            .map(|_| r.pick(&["a", "b", "ex", "www", "com", "x1"]))
            .collect::<Vec<_>>()
            .join(".")
    }

    fn random_name(r: &mut Rng) -> ServerName {
        use ServerName::*;
        match r.below(7) {
            0 | 1 => Exact(labels(r, 3)),
            2 => WildcardPrefix(format!(".{}", labels(r, 3))),
            3 => WildcardSuffix(format!("{}.", labels(r, 2))),
            4 => Dot(labels(r, 3)),
            5 => Exact(String::new()),
            _ => {
                let re = r.pick(&[r"^a\.", r"com$", r"^www\.(.+)$", r"b", r"^x1\.a$"]);
                Regex(shard_config::NameRegex(
                    shard_config::Regex::build(re, true).unwrap(),
                ))
            }
        }
    }

    /// Random servers, addresses and hosts: the index chooses what the scan chooses.
    #[test]
    fn server_index_chooses_what_the_scan_chooses() {
        let mut r = Rng(0x5eed_1234_abcd_0001);
        for _ in 0..3000 {
            let servers: Vec<ServerConf> = (0..1 + r.below(10))
                .map(|_| {
                    let names = (0..1 + r.below(4)).map(|_| random_name(&mut r)).collect();
                    server(names, vec![])
                })
                .collect();
            let http = HttpConf {
                charset_maps: Vec::new(),
                maps: vec![],
                limit_zones: vec![],
                cache_paths: vec![],
                servers,
                upstreams: vec![],
            };
            let on: Vec<usize> = (0..http.servers.len())
                .filter(|_| r.below(4) != 0)
                .collect();
            if on.is_empty() {
                continue;
            }
            let default = on[r.below(on.len())];
            let l = listener(&http, on, default);
            for _ in 0..40 {
                let host = match r.below(8) {
                    0 => None,
                    1 => Some(String::new()),
                    _ => Some(labels(&mut r, 4)),
                };
                let h = host.as_deref();
                assert_eq!(
                    select_server(&l, h),
                    oracle::select_server_scan(&http, &l, h),
                    "host {h:?} on {:?}",
                    l.servers
                        .iter()
                        .map(|&i| &http.servers[i].server_names)
                        .collect::<Vec<_>>()
                );
            }
        }
    }

    /// Random locations (exact, prefix, `^~`, regex, named, nested) and paths: the index
    /// chooses what the scan chooses, with the same captures.
    #[test]
    fn location_index_chooses_what_the_scan_chooses() {
        use LocationKind::*;
        let mut r = Rng(0x10c4_7105_0000_0001);
        let segs = ["/", "a", "b", "ab", "/", "c.css", "x"];
        let path = |r: &mut Rng| -> String {
            let mut p = String::from("/");
            for _ in 0..r.below(6) {
                p.push_str(r.pick(&segs));
            }
            p
        };
        for _ in 0..2000 {
            let mut locs: Vec<LocationConf> = Vec::new();
            for _ in 0..r.below(14) {
                // A parent among the prefix and regex locations so far, or none.
                let parents: Vec<usize> = (0..locs.len())
                    .filter(|&i| matches!(locs[i].kind, Prefix | PrefixNoRegex | Regex))
                    .collect();
                let parent = (!parents.is_empty() && r.below(3) == 0)
                    .then(|| parents[r.below(parents.len())]);
                let base = parent
                    .filter(|&p| locs[p].kind != Regex)
                    .map_or(String::new(), |p| locs[p].path.clone());
                let own = |r: &mut Rng| {
                    if base.is_empty() {
                        path(r)
                    } else {
                        format!("{base}{}", r.pick(&segs))
                    }
                };
                let mut l = match r.below(6) {
                    0 => loc(Exact, &own(&mut r)),
                    1 | 2 => loc(Prefix, &own(&mut r)),
                    3 => loc(PrefixNoRegex, &own(&mut r)),
                    4 => {
                        let re =
                            r.pick(&[r"\.css$", r"^/a", r"/(b)/", r"^/(?<n>[ab]+)", r"x$", r"a"]);
                        let mut l = loc(Regex, re);
                        l.regex = Some(shard_config::Regex::new(re).unwrap());
                        l
                    }
                    _ => loc(Named, r.pick(&["@a", "@b", "@a"])),
                };
                if l.kind != Named {
                    l.parent = parent;
                }
                locs.push(l);
            }
            let srv = server(vec![], locs);
            for _ in 0..30 {
                let p = path(&mut r);
                let (mut a, mut b) = (Captures::new(), Captures::new());
                let got = find_location_index(&srv, &p, &mut a);
                let want = oracle::find_location_index_scan(&srv, &p, &mut b);
                assert_eq!(
                    (got, &a),
                    (want, &b),
                    "{p} in {:?}",
                    srv.locations
                        .iter()
                        .map(|l| (l.kind, &l.path, l.parent))
                        .collect::<Vec<_>>()
                );
            }
            for name in ["@a", "@b", "@c"] {
                let scan = srv
                    .locations
                    .iter()
                    .position(|l| l.kind == Named && l.path == name);
                assert_eq!(
                    named_location(&srv, name).map(|l| l as *const LocationConf),
                    scan.map(|i| &srv.locations[i] as *const LocationConf)
                );
            }
        }
    }
}
