//! The lookup structures a configuration builds once, so that choosing a server, a location or
//! a `map` value never walks the whole configuration (nginx's server-name and map hashes and
//! its static location tree, in shard's own shapes).
//!
//! - [`Wildcards`]: names with a leading wildcard (`*.example.com`, `.example.com`) and with a
//!   trailing one (`www.example.*`), found longest first by looking up the name's suffixes and
//!   prefixes at its dots: time linear in the name's length, whatever the number of names.
//! - [`ServerIndex`]: per listening address, exact names in a hash, then [`Wildcards`], then
//!   the regular expressions in order.
//! - [`PrefixTree`]: a radix tree of prefix locations that finds the longest prefix of a URI
//!   in time proportional to the URI's length.
//! - [`LocationIndex`]: per server, exact locations in a hash, the [`PrefixTree`], the regular
//!   expression locations of each nesting level in order, and named locations in a hash.
//! - [`MapIndex`]: per `map`, exact keys in a hash and, with `hostnames`, [`Wildcards`].
//!
//! This module owns the structures and their primitive lookups. The precedence rules that
//! combine them (nginx's order, the default server, `^~`, nested regexes) live in
//! `shard_http::route` and `shard_http::vars::map_lookup`, which keep the linear scans they
//! replace as test oracles. Everything here is built in the master before the workers fork,
//! so its pages are shared.

use std::collections::HashMap;

use crate::{LocationConf, LocationKind, NameRegex, ServerConf, ServerName};

type Map<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// A value found by a wildcard, with the order it was added in: among names of the same
/// length the first added wins, as a first-come scan would choose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Hit {
    order: u32,
    value: u32,
}

/// Leading and trailing wildcard names, each found longest first.
#[derive(Debug, Clone, Default)]
pub struct Wildcards {
    /// `*.example.com`, under `.example.com`: matches a longer name with that suffix.
    star: Map<Box<str>, Hit>,
    /// `.example.com`, under `.example.com`: matches a name with that suffix (any length).
    dot: Map<Box<str>, Hit>,
    /// `.example.com`, under `example.com`: matches `example.com` itself, measured as long
    /// as `.example.com`.
    dot_whole: Map<Box<str>, Hit>,
    /// `www.example.*`, under `www.example.`: matches a longer name with that prefix.
    tail: Map<Box<str>, Hit>,
    added: u32,
}

impl Wildcards {
    fn next(&mut self, value: usize) -> Hit {
        self.added += 1;
        Hit {
            order: self.added,
            value: value as u32,
        }
    }

    /// `*.example.com`, given as its suffix `.example.com`.
    pub fn add_star(&mut self, suffix: &str, value: usize) {
        let h = self.next(value);
        self.star.entry(suffix.into()).or_insert(h);
    }

    /// `.example.com`, given as `example.com`.
    pub fn add_dot(&mut self, name: &str, value: usize) {
        let h = self.next(value);
        self.dot.entry(format!(".{name}").into()).or_insert(h);
        self.dot_whole.entry(name.into()).or_insert(h);
    }

    /// `www.example.*`, given as its prefix `www.example.`.
    pub fn add_tail(&mut self, prefix: &str, value: usize) {
        let h = self.next(value);
        self.tail.entry(prefix.into()).or_insert(h);
    }

    pub fn is_empty(&self) -> bool {
        self.added == 0
    }

    /// Adds `key` when it is written as a wildcard (`*.name`, `.name`, `name.*`); false for
    /// any other key, which the caller keeps as an exact one.
    pub fn add_written(&mut self, key: &str, value: usize) -> bool {
        if let Some(suffix) = key.strip_prefix('*') {
            self.add_star(suffix, value);
        } else if let Some(name) = key.strip_prefix('.') {
            self.add_dot(name, value);
        } else if let Some(prefix) = key.strip_suffix('*') {
            self.add_tail(prefix, value);
        } else {
            return false;
        }
        true
    }

    /// The longest leading wildcard that matches `name`: `.example.com` for `example.com`
    /// itself first (the longest there can be), then `name`'s suffixes from each dot, the
    /// longest first. Of one length, the first added.
    pub fn leading(&self, name: &str) -> Option<usize> {
        if self.star.is_empty() && self.dot.is_empty() {
            return None;
        }
        if let Some(h) = self.dot_whole.get(name) {
            return Some(h.value as usize);
        }
        let b = name.as_bytes();
        for i in memchr_iter(b'.', b) {
            let suffix = &name[i..];
            let star = (i > 0).then(|| self.star.get(suffix)).flatten();
            let dot = self.dot.get(suffix);
            let best = match (star, dot) {
                (Some(a), Some(b)) => Some(if a.order < b.order { a } else { b }),
                (a, b) => a.or(b),
            };
            if let Some(h) = best {
                return Some(h.value as usize);
            }
        }
        None
    }

    /// The longest trailing wildcard that matches `name`: its prefixes up to each dot, the
    /// longest first, each shorter than `name`.
    pub fn trailing(&self, name: &str) -> Option<usize> {
        if self.tail.is_empty() {
            return None;
        }
        let b = name.as_bytes();
        let mut end = b.len();
        while let Some(i) = b[..end].iter().rposition(|&c| c == b'.') {
            if i + 1 < b.len() {
                if let Some(h) = self.tail.get(&name[..=i]) {
                    return Some(h.value as usize);
                }
            }
            end = i;
        }
        None
    }
}

/// The positions of `c` in `hay`, left to right.
fn memchr_iter(c: u8, hay: &[u8]) -> impl Iterator<Item = usize> + '_ {
    hay.iter()
        .enumerate()
        .filter_map(move |(i, &b)| (b == c).then_some(i))
}

/// The server names of one listening address, by nginx's precedence.
#[derive(Debug, Clone, Default)]
pub struct ServerIndex {
    /// Exact names (lowercase), to the first server (in file order) that has each.
    exact: Map<Box<str>, u32>,
    wild: Wildcards,
    /// `(server, regex)` in file order.
    regexes: Vec<(u32, NameRegex)>,
}

impl ServerIndex {
    /// The index of `on` (indices into `servers`, in file order).
    pub fn build(servers: &[ServerConf], on: &[usize]) -> ServerIndex {
        let mut ix = ServerIndex::default();
        for &i in on {
            for n in &servers[i].server_names {
                match n {
                    ServerName::Exact(e) => {
                        ix.exact.entry(e.as_str().into()).or_insert(i as u32);
                    }
                    ServerName::WildcardPrefix(s) => ix.wild.add_star(s, i),
                    ServerName::Dot(d) => ix.wild.add_dot(d, i),
                    ServerName::WildcardSuffix(p) => ix.wild.add_tail(p, i),
                    ServerName::Regex(r) => ix.regexes.push((i as u32, r.clone())),
                }
            }
        }
        ix
    }

    /// The server with the exact name `host`.
    pub fn exact(&self, host: &str) -> Option<usize> {
        self.exact.get(host).map(|&i| i as usize)
    }

    /// The server with the longest leading wildcard that matches `host`, else the longest
    /// trailing one.
    pub fn wildcard(&self, host: &str) -> Option<usize> {
        self.wild.leading(host).or_else(|| self.wild.trailing(host))
    }

    /// The first server (in file order) whose regular expression matches `host`.
    pub fn regex(&self, host: &str) -> Option<usize> {
        self.regexes
            .iter()
            .find(|(_, r)| r.0.is_match(host))
            .map(|&(i, _)| i as usize)
    }
}

/// A radix tree of byte strings to values: the longest stored prefix of a key in time
/// proportional to the key's length.
#[derive(Debug, Clone)]
pub struct PrefixTree {
    /// Node 0 is the root, with an empty label.
    nodes: Vec<Node>,
}

#[derive(Debug, Clone, Default)]
struct Node {
    /// The bytes on the edge into this node.
    label: Box<[u8]>,
    value: Option<u32>,
    /// The first byte of each child's label, sorted, beside `children`.
    first: Vec<u8>,
    children: Vec<u32>,
}

impl Default for PrefixTree {
    fn default() -> Self {
        PrefixTree {
            nodes: vec![Node::default()],
        }
    }
}

impl PrefixTree {
    /// Stores `key`; a key stored before keeps its first value.
    pub fn insert(&mut self, key: &[u8], value: usize) {
        let mut n = 0;
        let mut rest = key;
        loop {
            if rest.is_empty() {
                self.nodes[n].value.get_or_insert(value as u32);
                return;
            }
            match self.nodes[n].first.binary_search(&rest[0]) {
                Err(pos) => {
                    let child = self.nodes.len() as u32;
                    self.nodes.push(Node {
                        label: rest.into(),
                        value: Some(value as u32),
                        ..Node::default()
                    });
                    self.nodes[n].first.insert(pos, rest[0]);
                    self.nodes[n].children.insert(pos, child);
                    return;
                }
                Ok(pos) => {
                    let c = self.nodes[n].children[pos] as usize;
                    let label = &self.nodes[c].label;
                    let common = label.iter().zip(rest).take_while(|(a, b)| a == b).count();
                    if common < label.len() {
                        // Split the edge: a new node holds the common part.
                        let head: Box<[u8]> = label[..common].into();
                        let tail: Box<[u8]> = label[common..].into();
                        let mid = self.nodes.len() as u32;
                        self.nodes.push(Node {
                            first: vec![tail[0]],
                            children: vec![c as u32],
                            label: head,
                            value: None,
                        });
                        self.nodes[c].label = tail;
                        self.nodes[n].children[pos] = mid;
                        n = mid as usize;
                    } else {
                        n = c;
                    }
                    rest = &rest[common..];
                }
            }
        }
    }

    /// The value of the longest stored key that is a prefix of `key`.
    pub fn longest(&self, key: &[u8]) -> Option<usize> {
        let mut best = self.nodes[0].value;
        let mut n = 0;
        let mut rest = key;
        while let Some(&b) = rest.first() {
            let node = &self.nodes[n];
            let Ok(pos) = node.first.binary_search(&b) else {
                break;
            };
            let c = node.children[pos] as usize;
            let label = &self.nodes[c].label;
            if !rest.starts_with(label) {
                break;
            }
            rest = &rest[label.len()..];
            n = c;
            if let Some(v) = self.nodes[c].value {
                best = Some(v);
            }
        }
        best.map(|v| v as usize)
    }
}

/// The locations of one server, for nginx's search.
#[derive(Debug, Clone, Default)]
pub struct LocationIndex {
    /// `location = PATH`, to the first such location in file order (nested ones too).
    exact: Map<Box<str>, u32>,
    /// Prefix locations (`^~` too), by path.
    prefixes: PrefixTree,
    /// Regular-expression locations by the location they are nested in (`u32::MAX`: at the
    /// server level), each list in file order.
    regexes: Map<u32, Vec<u32>>,
    /// `location @NAME`, by name with its `@`.
    named: Map<Box<str>, u32>,
    /// Locations whose path ends in `/` and that pass to an upstream (`proxy_pass`), by
    /// their path less that `/`: nginx's `auto_redirect`.
    auto: Map<Box<str>, u32>,
}

/// The key of the server level in [`LocationIndex::regexes`].
const TOP: u32 = u32::MAX;

impl LocationIndex {
    pub fn build(locations: &[LocationConf]) -> LocationIndex {
        let mut ix = LocationIndex::default();
        for (i, l) in locations.iter().enumerate() {
            match l.kind {
                LocationKind::Exact => {
                    ix.exact.entry(l.path.as_str().into()).or_insert(i as u32);
                }
                LocationKind::Prefix | LocationKind::PrefixNoRegex
                    if l.proxy_pass.is_some() && l.path.len() > 1 && l.path.ends_with('/') =>
                {
                    ix.prefixes.insert(l.path.as_bytes(), i);
                    let short = &l.path[..l.path.len() - 1];
                    ix.auto.entry(short.into()).or_insert(i as u32);
                }
                LocationKind::Prefix | LocationKind::PrefixNoRegex => {
                    ix.prefixes.insert(l.path.as_bytes(), i);
                }
                LocationKind::Regex => ix
                    .regexes
                    .entry(l.parent.map_or(TOP, |p| p as u32))
                    .or_default()
                    .push(i as u32),
                LocationKind::Named => {
                    ix.named.entry(l.path.as_str().into()).or_insert(i as u32);
                }
            }
        }
        ix
    }

    /// The exact location for `path`.
    pub fn exact(&self, path: &str) -> Option<usize> {
        self.exact.get(path).map(|&i| i as usize)
    }

    /// The prefix location with the longest path that starts `path` (the first of equal
    /// paths).
    pub fn longest_prefix(&self, path: &str) -> Option<usize> {
        self.prefixes.longest(path.as_bytes())
    }

    /// The regular-expression locations nested in `parent` (`None`: the server level), in
    /// file order.
    pub fn regexes_in(&self, parent: Option<usize>) -> &[u32] {
        self.regexes
            .get(&parent.map_or(TOP, |p| p as u32))
            .map_or(&[], Vec::as_slice)
    }

    /// `location @NAME` (`name` with its `@`).
    pub fn named(&self, name: &str) -> Option<usize> {
        self.named.get(name).map(|&i| i as usize)
    }

    /// nginx's `auto_redirect`: the location whose path is `path` with a `/` added and that
    /// passes to an upstream, when no exact location is `path` itself.
    pub fn auto_redirect(&self, path: &str) -> Option<usize> {
        if self.auto.is_empty() || self.exact.contains_key(path) {
            return None;
        }
        self.auto.get(path).map(|&i| i as usize)
    }
}

/// The keys of one `map`: exact ones in a hash and, with `hostnames`, the wildcards.
#[derive(Debug, Clone, Default)]
pub struct MapIndex {
    /// Exact keys, to their index in `MapConf::exact`.
    exact: Map<Box<str>, u32>,
    wild: Wildcards,
}

impl MapIndex {
    /// The index of `keys` (`MapConf::exact`, in file order). With `hostnames`, keys of the
    /// forms `*.name`, `.name` and `name.*` are wildcards, not exact keys.
    pub fn build(keys: &[(String, Vec<crate::Part>)], hostnames: bool) -> MapIndex {
        let mut ix = MapIndex::default();
        for (i, (k, _)) in keys.iter().enumerate() {
            if hostnames && ix.wild.add_written(k, i) {
                continue;
            }
            ix.exact.entry(k.as_str().into()).or_insert(i as u32);
        }
        ix
    }

    /// nginx's order for a `map`'s keys: the exact key, else the longest leading wildcard,
    /// else the longest trailing one (with `hostnames`). `None`: the regular expressions and
    /// `default` decide.
    pub fn find(&self, value: &str) -> Option<usize> {
        if let Some(&i) = self.exact.get(value) {
            return Some(i as usize);
        }
        if self.wild.is_empty() {
            return None;
        }
        self.wild
            .leading(value)
            .or_else(|| self.wild.trailing(value))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_tree_finds_the_longest_stored_prefix() {
        let mut t = PrefixTree::default();
        for (i, k) in ["/", "/a/", "/ab", "/a/b/c", "/abc/", "/b"]
            .iter()
            .enumerate()
        {
            t.insert(k.as_bytes(), i);
        }
        t.insert(b"/a/", 99); // a second equal key keeps the first value
        let want = [
            ("/", Some(0)),
            ("/a", Some(0)),
            ("/a/", Some(1)),
            ("/a/b/", Some(1)),
            ("/a/b/c/d", Some(3)),
            ("/ab", Some(2)),
            ("/abc", Some(2)),
            ("/abc/x", Some(4)),
            ("/bz", Some(5)),
            ("x", None),
            ("", None),
        ];
        for (k, v) in want {
            assert_eq!(t.longest(k.as_bytes()), v, "{k}");
        }
    }

    #[test]
    fn wildcards_longest_first_and_first_added_of_a_length() {
        let mut w = Wildcards::default();
        w.add_star(".example.com", 1);
        w.add_dot("example.com", 2);
        w.add_star(".b.example.com", 3);
        w.add_tail("www.", 4);
        w.add_tail("www.example.", 5);
        assert_eq!(
            w.leading("a.example.com"),
            Some(1),
            "first added of a length"
        );
        assert_eq!(w.leading("example.com"), Some(2));
        assert_eq!(w.leading("a.b.example.com"), Some(3));
        assert_eq!(w.leading("example.org"), None);
        assert_eq!(w.trailing("www.example.org"), Some(5));
        assert_eq!(w.trailing("www.other.org"), Some(4));
        assert_eq!(
            w.trailing("www.example."),
            Some(4),
            "shorter than the name only"
        );
        assert_eq!(w.trailing("www."), None);
    }
}

/// `geo`: networks (longest prefix first) or, with `ranges`, address ranges, each to a value.
#[derive(Debug, Clone, Default)]
pub struct GeoTable {
    /// CIDR mode: per prefix length present, longest first, the masked networks.
    v4: Vec<(u8, Map<u32, u32>)>,
    v6: Vec<(u8, Map<u128, u32>)>,
    /// `ranges` mode: sorted, non-overlapping `(first, last, value)`.
    ranges: Option<Vec<(u32, u32, u32)>>,
    /// `default`, else empty.
    pub default: Option<u32>,
    /// `proxy` networks and `proxy_recursive`: a client in them is replaced by the address
    /// `X-Forwarded-For` names.
    pub proxies: Vec<crate::AccessRule>,
    pub proxy_recursive: bool,
}

/// A `geo` block while it is read: later entries override earlier ones, `delete` removes.
#[derive(Debug, Default)]
pub struct GeoBuilder {
    v4: std::collections::BTreeMap<(u8, u32), u32>,
    v6: std::collections::BTreeMap<(u8, u128), u32>,
    /// `ranges`: start to `(last, value)`, non-overlapping.
    ranges: Option<std::collections::BTreeMap<u32, (u32, u32)>>,
    pub default: Option<u32>,
    pub proxies: Vec<crate::AccessRule>,
    pub proxy_recursive: bool,
}

impl GeoBuilder {
    pub fn set_ranges(&mut self) {
        self.ranges.get_or_insert_with(Default::default);
    }

    pub fn is_ranges(&self) -> bool {
        self.ranges.is_some()
    }

    /// `NET VALUE` (`value` an index) or `delete NET` (`None`), NET already masked.
    pub fn net(&mut self, net: std::net::IpAddr, bits: u8, value: Option<u32>) {
        match net {
            std::net::IpAddr::V4(a) => {
                let k = (bits, u32::from(a));
                match value {
                    Some(v) => {
                        self.v4.insert(k, v);
                    }
                    None => {
                        self.v4.remove(&k);
                    }
                }
            }
            std::net::IpAddr::V6(a) => {
                let k = (bits, u128::from(a));
                match value {
                    Some(v) => {
                        self.v6.insert(k, v);
                    }
                    None => {
                        self.v6.remove(&k);
                    }
                }
            }
        }
    }

    /// `FIRST-LAST VALUE` over what was there (`None`: `delete FIRST-LAST`).
    pub fn range(&mut self, first: u32, last: u32, value: Option<u32>) {
        let map = self.ranges.get_or_insert_with(Default::default);
        let hit: Vec<(u32, u32, u32)> = map
            .range(..=last)
            .rev()
            .take_while(|(_, &(end, _))| end >= first)
            .map(|(&s, &(e, v))| (s, e, v))
            .collect();
        for (s, e, v) in hit {
            map.remove(&s);
            if s < first {
                map.insert(s, (first - 1, v));
            }
            if e > last {
                map.insert(last + 1, (e, v));
            }
        }
        if let Some(v) = value {
            map.insert(first, (last, v));
        }
    }

    pub fn build(self) -> GeoTable {
        fn by_len<K: Copy + Eq + std::hash::Hash>(
            entries: impl Iterator<Item = ((u8, K), u32)>,
        ) -> Vec<(u8, Map<K, u32>)> {
            let mut out: Vec<(u8, Map<K, u32>)> = Vec::new();
            for ((len, k), v) in entries {
                match out.iter_mut().find(|(l, _)| *l == len) {
                    Some((_, m)) => {
                        m.insert(k, v);
                    }
                    None => {
                        let mut m = Map::default();
                        m.insert(k, v);
                        out.push((len, m));
                    }
                }
            }
            out.sort_by_key(|e| std::cmp::Reverse(e.0));
            out
        }
        GeoTable {
            v4: by_len(self.v4.into_iter()),
            v6: by_len(self.v6.into_iter()),
            ranges: self
                .ranges
                .map(|m| m.into_iter().map(|(s, (e, v))| (s, e, v)).collect()),
            default: self.default,
            proxies: self.proxies,
            proxy_recursive: self.proxy_recursive,
        }
    }
}

impl GeoTable {
    /// The value index for `addr` (an IPv4-mapped IPv6 address counts as IPv4): the longest
    /// network that holds it, or the range, else `default`.
    pub fn find(&self, addr: std::net::IpAddr) -> Option<u32> {
        use std::net::IpAddr;
        let addr = match addr {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(addr, IpAddr::V4),
            v4 => v4,
        };
        let hit = match (addr, &self.ranges) {
            (IpAddr::V4(a), Some(r)) => {
                let a = u32::from(a);
                let i = r.partition_point(|&(s, _, _)| s <= a);
                i.checked_sub(1)
                    .map(|i| r[i])
                    .filter(|&(_, e, _)| a <= e)
                    .map(|(_, _, v)| v)
            }
            (IpAddr::V6(_), Some(_)) => None,
            (IpAddr::V4(a), None) => {
                let a = u32::from(a);
                self.v4.iter().find_map(|(len, m)| {
                    let mask = u32::MAX.checked_shl(32 - u32::from(*len)).unwrap_or(0);
                    m.get(&(a & mask)).copied()
                })
            }
            (IpAddr::V6(a), None) => {
                let a = u128::from(a);
                self.v6.iter().find_map(|(len, m)| {
                    let mask = u128::MAX.checked_shl(128 - u32::from(*len)).unwrap_or(0);
                    m.get(&(a & mask)).copied()
                })
            }
        };
        hit.or(self.default)
    }

    /// The address `geo` judges: `client`, or, when it is one of the `proxy` networks, the
    /// last address of `X-Forwarded-For` (with `proxy_recursive`, the last one that is not a
    /// proxy). Not an address: 255.255.255.255, as nginx.
    pub fn address(&self, client: &str, forwarded: Option<&str>) -> std::net::IpAddr {
        let none = std::net::IpAddr::V4(std::net::Ipv4Addr::BROADCAST);
        let Ok(mut addr) = client.trim().parse::<std::net::IpAddr>() else {
            return none;
        };
        let proxy = |a: std::net::IpAddr| self.proxies.iter().any(|p| p.matches(a));
        if !self.proxies.is_empty() && proxy(addr) {
            if let Some(xff) = forwarded {
                for part in xff.rsplit(',') {
                    let Ok(a) = part.trim().parse::<std::net::IpAddr>() else {
                        break;
                    };
                    addr = a;
                    if !self.proxy_recursive || !proxy(a) {
                        break;
                    }
                }
            }
        }
        addr
    }
}
