//! `proxy_cache` in the proxy's request: when a proxied request looks in the cache, waits
//! for another request filling it (`proxy_cache_lock`), serves an entry, asks the upstream
//! to revalidate one, falls back to a stale one, and stores a response.
//!
//! A served entry replays through the proxy's own response path: its stored head is parsed
//! as an upstream's would be (so `proxy_hide_header`, `add_header`, `sub_filter`, `charset`
//! apply per request, as nginx re-reads a cached header), and its body is read from the file
//! where a socket would be read (`read_upstream`), or, when no filter reads it, handed to the
//! connection as a static file's body is. The entries a worker served last stay open in its
//! `files::CacheMemo` (used while the keys zone says the key's file has not changed), so a
//! hit costs no `open`, `pread` or `close`. The entry files and the shared keys zone are
//! `crate::cache`'s. A child module of `proxy.rs`: it works on the `Proxy` state.

use std::path::PathBuf;

use shard_config::{stale, CacheSel, LocationConf, Part, Var};
use shard_http::proxy::{Failure, ResponseHead};
use shard_http::request::Method;

use super::super::files::{FileRef, OpenFile};
use super::{Flow, Proxy, State, Worker};
use crate::cache;

/// `proxy_cache_key`'s default: `$scheme$proxy_host$request_uri`.
const DEFAULT_KEY: [Part; 3] = [
    Part::Var(Var::Scheme),
    Part::Var(Var::ProxyHost),
    Part::Var(Var::RequestUri),
];

/// How often a request waiting on `proxy_cache_lock` looks again.
const LOCK_POLL_MS: u64 = 50;

/// `$upstream_cache_status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Status {
    Miss,
    Bypass,
    Expired,
    Stale,
    Updating,
    Revalidated,
    Hit,
}

impl Status {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Status::Miss => "MISS",
            Status::Bypass => "BYPASS",
            Status::Expired => "EXPIRED",
            Status::Stale => "STALE",
            Status::Updating => "UPDATING",
            Status::Revalidated => "REVALIDATED",
            Status::Hit => "HIT",
        }
    }
}

/// A stored entry a request reads: the file (shared with the worker's `CacheMemo` when kept
/// there), its fixed header and its response head.
pub(super) struct Entry {
    file: FileRef,
    header: cache::Header,
    head: Vec<u8>,
}

/// One request's part in a cache.
pub(super) struct CacheReq {
    /// Index into `HttpConf::cache_paths` and the worker's zones, and that zone.
    zone: usize,
    z: cache::Zone,
    /// The key as rendered, its MD5 (the variant's, once `Vary` sent us there), the zone's
    /// key for it, and the entry's file.
    key: Vec<u8>,
    md5: [u8; 16],
    zkey: u128,
    path: PathBuf,
    pub(super) status: Status,
    /// Uses of the key counted so far (`proxy_cache_min_uses`).
    uses: u64,
    /// The file version the zone gave the key when the request looked (0: none, or looked
    /// at already): a kept entry of this version is the file at `path`.
    version: u64,
    /// The stored entry: being served, or kept for `proxy_cache_use_stale` and revalidation.
    entry: Option<Entry>,
    /// The response comes from `entry`: its body is read from the file, from `pos` to `end`.
    pub(super) serving: bool,
    pos: u64,
    end: u64,
    /// Bytes served from memory before the file (a multipart range body).
    mem: Vec<u8>,
    /// The response may be stored (not after a lock timeout, nor for a method that is not
    /// cached as itself).
    may_store: bool,
    /// nginx's `u->cacheable`: the response could go to the cache, so the upstream is asked
    /// for all of it (no client validators or `Range`, HEAD as GET). Not below
    /// `proxy_cache_min_uses`, nor for a range beyond `proxy_cache_max_range_offset`.
    pub(super) cacheable: bool,
    writer: Option<cache::Writer>,
    /// This request holds the key's update in the zone (ended when the request ends), as
    /// `owner`.
    updating: bool,
    owner: u64,
    /// `proxy_cache_lock`: the request waits for another one until then (ms, 0: not yet).
    lock_until_ms: u64,
    /// The upstream was asked with the entry's validators (`proxy_cache_revalidate`).
    revalidating: bool,
    /// The request's `Vary` variant was looked for (one step, as nginx).
    variant_tried: bool,
    /// The zone knew the entry's file when the request looked.
    known: bool,
    /// `proxy_cache_background_update`: the stale entry is served, then this request updates
    /// it from the upstream.
    update_after: bool,
}

impl CacheReq {
    /// The entry's `Last-Modified` and `ETag` to revalidate it with (`proxy_cache_revalidate`
    /// on an expired entry; only a 200 or 206 entry keeps them, as nginx), and whether the
    /// upstream is asked with them (`revalidating`).
    fn revalidation_validators(&mut self, revalidate: bool) -> (Option<Vec<u8>>, Option<Vec<u8>>) {
        self.revalidating = false;
        let (mut last_modified, mut etag) = (None, None);
        let validated = |e: &&Entry| matches!(status_of(&e.head), 200 | 206);
        if let Some(e) = self
            .entry
            .as_ref()
            .filter(|_| revalidate && self.status == Status::Expired)
            .filter(validated)
        {
            for (n, v) in shard_http::proxy::header_lines(&e.head) {
                if n.eq_ignore_ascii_case("last-modified") {
                    last_modified = Some(v.to_vec());
                } else if n.eq_ignore_ascii_case("etag") {
                    etag = Some(v.to_vec());
                } else {
                    continue;
                }
                self.revalidating = true;
            }
        }
        (last_modified, etag)
    }
}

/// Body bytes of the response being stored (a failed write stops storing, and says why).
pub(super) fn store(c: &mut Option<Box<CacheReq>>, data: &[u8]) {
    let Some(c) = c.as_mut() else {
        return;
    };
    if let Some(w) = c.writer.as_mut() {
        if let Err(e) = w.write(data) {
            crate::log!(
                Crit,
                "pwrite() to cache \"{}\" failed ({e})",
                c.path.display()
            );
            c.writer = None;
        }
    }
}

impl CacheReq {
    /// The response is being written to an entry.
    pub(super) fn storing(&self) -> bool {
        self.writer.is_some()
    }

    /// Ends this request's update of the key, if it holds it.
    fn end_update(&mut self) {
        if self.updating {
            self.updating = false;
            self.z.end_update(self.zkey, self.owner);
        }
    }
}

impl Drop for CacheReq {
    /// However the request ends (finished, failed, its client gone), its update ends.
    fn drop(&mut self) {
        self.end_update();
    }
}

/// The values of `parts` say yes: any not empty and not `0` (`proxy_cache_bypass`,
/// `proxy_no_cache`).
fn any_true(values: &[String]) -> bool {
    values.iter().any(|v| !v.is_empty() && v != "0")
}

/// The field names a stored head's `Vary` lists.
fn vary_fields(head: &[u8]) -> Vec<String> {
    shard_http::proxy::header_lines(head)
        .iter()
        .filter(|(n, _)| n.eq_ignore_ascii_case("vary"))
        .flat_map(|(_, v)| {
            String::from_utf8_lossy(v)
                .split(',')
                .map(|f| f.trim().to_ascii_lowercase())
                .filter(|f| !f.is_empty())
                .collect::<Vec<_>>()
        })
        .collect()
}

impl<'a> Worker<'a> {
    /// The cache settings of the request's location.
    fn cache_conf(&self, p: &Proxy) -> &'a shard_config::CacheConf {
        &self.proxy_location(p).proxy.cache
    }

    fn render_all(
        &self,
        key: usize,
        p: &Proxy,
        loc: &LocationConf,
        list: &[impl AsRef<[Part]>],
    ) -> Vec<String> {
        if list.is_empty() {
            return Vec::new();
        }
        // The request's fields are parsed only when a value reads them.
        let mut storage = shard_http::vars::header_storage();
        let hs = if loc.proxy.cache.reads_head {
            shard_http::vars::request_headers(&p.head, &mut storage)
        } else {
            &[]
        };
        let ctx = self.var_ctx(key, &p.req, hs, loc);
        list.iter()
            .map(|parts| shard_http::vars::render(parts.as_ref(), &ctx))
            .collect()
    }

    /// Looks in the cache before the upstream is asked. `None`: go on to the upstream;
    /// `Some(flow)`: an entry is served (`Next`), the request waits on the lock (`Wait`), or
    /// the cache named is unknown (`Fail(500)`).
    pub(super) fn cache_lookup(&mut self, key: usize, p: &mut Proxy) -> Option<Flow> {
        if p.cache.is_none() {
            let loc = self.proxy_location(p);
            let cc = &loc.proxy.cache;
            let zone = match &cc.sel {
                CacheSel::Off | CacheSel::Named(..) => return None,
                CacheSel::Zone(i) => *i,
                CacheSel::Var(parts) => {
                    let name = self.render_all(key, p, loc, std::slice::from_ref(parts));
                    let name = &name[0];
                    if name.is_empty() {
                        return None;
                    }
                    match self.http().cache_paths.iter().position(|c| c.name == *name) {
                        Some(i) => i,
                        None => {
                            self.log_proxy_error(
                                key,
                                p,
                                &format!("cache \"{name}\" not found"),
                                None,
                            );
                            return Some(Flow::Fail(500));
                        }
                    }
                }
            };
            let cached_method = matches!(p.req.method, Method::Get | Method::Head)
                || cc.methods.iter().any(|m| m == p.req.method.as_str());
            if !cached_method || zone >= self.cache_zones.len() {
                return None;
            }
            let key_parts = cc.key.as_deref().unwrap_or(&DEFAULT_KEY);
            let rendered = self.render_all(key, p, loc, &[key_parts]);
            let k = rendered.into_iter().next().unwrap_or_default().into_bytes();
            let bypass = any_true(&self.render_all(key, p, loc, &cc.bypass));
            let md5 = cache::key_md5(&k);
            let cp = &self.http().cache_paths[zone];
            let path = cache::entry_path(&cp.path, &cp.levels, &md5);
            // A HEAD is asked upstream as GET (`proxy_cache_convert_head`), so that what is
            // stored is the whole response; with `off` the HEAD's answer is stored as it is
            // (nginx: then the key should hold `$request_method`). SCGI and uwsgi ask a HEAD
            // as it is, and their answer's body, when the application sends one, is read
            // to be stored (not sent), as nginx reads it: an entry is never a head alone.
            p.upstream_get =
                p.req.method == Method::Head && (cc.convert_head || loc.gateway.is_some());
            let may_store = true;
            let mut c = CacheReq {
                zone,
                z: self.cache_zones[zone],
                key: k,
                md5,
                zkey: cache::zone_key(&md5),
                path,
                status: Status::Miss,
                uses: 0,
                version: 0,
                entry: None,
                serving: false,
                pos: 0,
                end: 0,
                mem: Vec::new(),
                may_store,
                cacheable: true,
                writer: None,
                updating: false,
                owner: {
                    self.cache_serial += 1;
                    cache::owner(self.cache_serial)
                },
                lock_until_ms: 0,
                revalidating: false,
                variant_tried: false,
                known: false,
                update_after: false,
            };
            if bypass {
                // Not taken from the cache; stored as any response (`proxy_no_cache` says not).
                c.status = Status::Bypass;
                c.uses = u64::MAX;
                p.cache = Some(Box::new(c));
                return None;
            }
            // A range starting at or beyond `proxy_cache_max_range_offset` (any range with
            // `0`; a suffix range's start is not known) goes to the upstream as asked, not
            // cached (nginx's `ngx_http_upstream_cache_check_range`).
            if let (Some(max), Some(r)) = (cc.max_range_offset, p.req.range.as_deref()) {
                let t = r.trim_start();
                let bytes = t.len() >= 7 && t.as_bytes()[..6].eq_ignore_ascii_case(b"bytes=");
                if max == 0 || (bytes && range_start(r).is_none_or(|start| start >= max)) {
                    c.cacheable = false;
                    c.may_store = false;
                    p.upstream_get = false;
                }
            }
            let seen = self.cache_zones[zone].look(
                c.zkey,
                self.cx.now_ms,
                cache::unix_ms(),
                cc.lock_age_ms,
            );
            c.uses = seen.uses;
            c.known = seen.exists;
            c.version = seen.version;
            if c.uses < cc.min_uses {
                c.cacheable = false;
                p.upstream_get = false;
            }
            p.cache = Some(Box::new(c));
        }
        let mut c = p.cache.take().expect("set above");
        let flow = self.cache_look(key, p, &mut c);
        p.cache = Some(c);
        if matches!(flow, Some(Flow::Next)) {
            p.state = State::ReadingHead;
        }
        flow
    }

    /// One look at the entry (again after each wait on the lock).
    fn cache_look(&mut self, key: usize, p: &mut Proxy, c: &mut CacheReq) -> Option<Flow> {
        if c.status == Status::Bypass {
            return None;
        }
        let cc = self.cache_conf(p);
        let zone = c.z;
        let now = self.cx.now_secs;
        let mut entry = self.open_entry(c, c.version);
        // Looked again after a wait, the version may be old: only this look may keep it.
        c.version = 0;
        // `Vary`: the entry holds another variant; this request's is its own file.
        if let Some(e) = entry.as_ref().filter(|e| e.header.variant != [0; 16]) {
            let v = self.request_variant(p, c, &e.head);
            if v != e.header.variant && !c.variant_tried {
                c.variant_tried = true;
                c.md5 = v;
                c.zkey = cache::zone_key(&v);
                let cp = &self.http().cache_paths[c.zone];
                c.path = cache::entry_path(&cp.path, &cp.levels, &v);
                entry = self.open_entry(c, 0);
                // The variant's own file may hold an answer that varies on other fields:
                // when this request is not its variant either, it is a miss (one step only,
                // as nginx), and the answer it gets replaces that file.
                if let Some(e) = entry.as_ref().filter(|e| e.header.variant != [0; 16]) {
                    if self.request_variant(p, c, &e.head) != e.header.variant {
                        entry = None;
                    }
                }
            }
        }
        let Some(e) = entry else {
            c.status = Status::Miss;
            if cc.lock {
                if zone.try_update(c.zkey, self.cx.now_ms, cc.lock_age_ms, c.owner) {
                    c.updating = true;
                    return None;
                }
                if c.lock_until_ms == 0 {
                    c.lock_until_ms = self.cx.now_ms + cc.lock_timeout_ms;
                }
                if self.cx.now_ms >= c.lock_until_ms {
                    // nginx: past `proxy_cache_lock_timeout` the request goes to the
                    // upstream, and its response is not stored.
                    c.may_store = false;
                    return None;
                }
                let wait = LOCK_POLL_MS.min(c.lock_until_ms - self.cx.now_ms);
                self.set_conn_deadline(key, self.cx.now_ms + wait.max(1));
                return Some(Flow::Wait);
            }
            c.updating = zone.try_update(c.zkey, self.cx.now_ms, cc.lock_age_ms, c.owner);
            return None;
        };
        if !c.known || c.variant_tried {
            // Found on disk (a run before this one, or a variant): the zone learns it.
            let size = e.header.body_start() + e.header.body_len;
            zone.stored(c.zkey, size, cache::unix_ms());
        }
        if e.header.valid_until > now {
            c.status = Status::Hit;
            if e.header.error_status != 0 {
                // A stored intercepted error: its `error_page` again, as nginx.
                return Some(Flow::Fail(e.header.error_status));
            }
            return Some(self.cache_serve(p, c, e, true));
        }
        if e.header.error_status != 0 {
            // An expired error is asked for again, never served stale.
            c.status = Status::Expired;
            c.updating = zone.try_update(c.zkey, self.cx.now_ms, cc.lock_age_ms, c.owner);
            return None;
        }
        // Expired: another request updating it lets this one take the stale entry
        // (`use_stale updating`, or within the entry's `stale-while-revalidate`).
        let swr = now < e.header.valid_until + u64::from(e.header.updating_secs);
        let stale_ok = cc.use_stale & stale::UPDATING != 0 || swr;
        if !zone.try_update(c.zkey, self.cx.now_ms, cc.lock_age_ms, c.owner) {
            if stale_ok {
                c.status = Status::Updating;
                return Some(self.cache_serve(p, c, e, true));
            }
        } else {
            c.updating = true;
            if stale_ok && cc.background_update {
                // The client has the stale entry at once; the update follows it.
                c.status = Status::Stale;
                c.update_after = true;
                return Some(self.cache_serve(p, c, e, true));
            }
        }
        c.status = Status::Expired;
        c.entry = Some(e);
        None
    }

    /// The entry at `c.path` for `c.key`: the one the worker keeps when the zone's `version`
    /// (0: none known) says it is still the file there, else the file opened (and kept).
    fn open_entry(&mut self, c: &CacheReq, version: u64) -> Option<Entry> {
        let now = self.cx.now_ms;
        if let Some(m) = self.cache_memo.get(c.zone, c.zkey, version, &c.key, now) {
            return Some(Entry {
                file: m.file.clone(),
                header: m.header.clone(),
                head: m.head.to_vec(),
            });
        }
        let mut opened = cache::open(&c.path, &c.key);
        // Out of descriptors: the held ones go first, then the open is tried again (as a
        // static file's).
        if matches!(&opened, Err(e) if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)))
            && self.release_held_files()
        {
            opened = cache::open(&c.path, &c.key);
        }
        let e = match opened {
            Ok(e) => e?,
            Err(e) => {
                crate::log!(Crit, "open() \"{}\" failed ({e})", c.path.display());
                return None;
            }
        };
        // `cache::open` compared the file's size with its header, and an entry file is
        // never written again but for its fixed header (see `CacheMemo`).
        let file = OpenFile::new(e.file.into());
        file.seal();
        self.cache_memo.put(
            c.zone, c.zkey, version, &c.key, &file, &e.header, &e.head, now,
        );
        Some(Entry {
            file,
            header: e.header,
            head: e.head,
        })
    }

    /// The request's variant of an entry whose stored head has `Vary`.
    fn request_variant(&self, p: &Proxy, c: &CacheReq, stored_head: &[u8]) -> [u8; 16] {
        let main = cache::key_md5(&c.key);
        let fields = vary_fields(stored_head);
        let mut storage = shard_http::vars::header_storage();
        let hs = shard_http::vars::request_headers(&p.head, &mut storage);
        // Every line of a field, joined, with nginx's whitespace normalization: list
        // elements trimmed, empty ones dropped (`foo, bar` and `foo,,bar ,` are one variant).
        let normalized: Vec<Option<Vec<u8>>> = fields
            .iter()
            .map(|f| {
                let mut out: Option<Vec<u8>> = None;
                for h in hs.iter().filter(|h| h.name.eq_ignore_ascii_case(f)) {
                    let o = out.get_or_insert_with(Vec::new);
                    for e in h.value.split(|&b| b == b',') {
                        let e = e.trim_ascii();
                        if !e.is_empty() {
                            if !o.is_empty() {
                                o.push(b',');
                            }
                            o.extend_from_slice(e);
                        }
                    }
                }
                out
            })
            .collect();
        let values: Vec<(&str, Option<&[u8]>)> = fields
            .iter()
            .zip(&normalized)
            .map(|(f, v)| (f.as_str(), v.as_deref()))
            .collect();
        cache::variant_md5(&main, &values)
    }

    /// The response will come from entry `e`: its head goes to `rbuf` as an upstream's would,
    /// and the body is read from the file (a `Range` on a whole 200 picks its part, as
    /// nginx's range filter does for cached responses).
    /// `Flow::Next`, or `Flow::Fail(412)` when the request's preconditions fail (nginx's
    /// not-modified filter judges a cached response, with `conditionals`).
    fn cache_serve(
        &mut self,
        p: &mut Proxy,
        c: &mut CacheReq,
        mut e: Entry,
        conditionals: bool,
    ) -> Flow {
        let body_len = e.header.body_len;
        let start = e.header.body_start();
        let mut head = std::mem::take(&mut e.head);
        c.pos = start;
        c.end = start + body_len;
        c.mem.clear();
        let ok_200 = head.starts_with(b"HTTP/1.1 200") || head.starts_with(b"HTTP/1.0 200");
        let mut length = body_len;
        let asks = p.req.if_modified_since.is_some()
            || p.req.if_none_match.is_some()
            || p.req.if_unmodified_since.is_some()
            || p.req.if_match.is_some();
        if ok_200 && conditionals && asks {
            let lines = shard_http::proxy::header_lines(&head);
            let field = |name: &str| {
                lines
                    .iter()
                    .find(|(n, _)| n.eq_ignore_ascii_case(name))
                    .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
            };
            let (lm, etag) = (field("last-modified"), field("etag"));
            let mode = self.proxy_location(p).if_modified_since;
            match cache::conditional(&p.req, lm.as_deref(), etag.as_deref(), mode) {
                Some(412) => return Flow::Fail(412),
                Some(_) => {
                    set_status(&mut head, "304 Not Modified");
                    c.pos = c.end;
                    length = 0;
                }
                None => {}
            }
        }
        let ok_200 = ok_200 && length == body_len;
        // The range filter's own `Content-Range` replaces any the upstream sent.
        let ranged = ok_200
            && p.req.method != Method::Head
            && p.req
                .range
                .as_deref()
                .is_some_and(|r| shard_http::static_file::ranges(r, body_len).is_some());
        if ranged {
            remove_field(&mut head, "content-range");
        }
        let range = p
            .req
            .range
            .as_deref()
            .filter(|_| ok_200 && p.req.method != Method::Head);
        match range.and_then(|r| shard_http::static_file::ranges(r, body_len)) {
            Some(Ok(parts)) if parts.len() == 1 => {
                let (a, b) = parts[0];
                set_status(&mut head, "206 Partial Content");
                insert_field(
                    &mut head,
                    &format!("Content-Range: bytes {a}-{b}/{body_len}"),
                );
                c.pos = start + a;
                c.end = start + b + 1;
                length = b - a + 1;
            }
            Some(Ok(parts))
                if parts.iter().map(|(a, b)| b - a + 1).sum::<u64>()
                    <= shard_http::static_file::MULTIPART_MAX_BYTES =>
            {
                let lines = shard_http::proxy::header_lines(&head);
                let field = |name: &str| {
                    lines
                        .iter()
                        .find(|(n, _)| n.eq_ignore_ascii_case(name))
                        .map(|(_, v)| String::from_utf8_lossy(v).trim().to_string())
                };
                let mut ct = field("content-type");
                // `X-Accel-Charset` applies to each part, before the ranges are cut (nginx's
                // charset filter runs before its range filter), and not again to the whole.
                let mut recode = None;
                let loc = self.proxy_location(p);
                let maps = &self.http().charset_maps;
                if let (Some(dst), Some(t)) = (
                    field("x-accel-charset")
                        .filter(|d| !d.is_empty())
                        .filter(|_| {
                            loc.proxy.ignore_headers & shard_config::ignore::X_ACCEL_CHARSET == 0
                        })
                        .filter(|d| super::charset_known(d, maps, loc)),
                    ct.clone(),
                ) {
                    let encoded = field("content-encoding").is_some();
                    let (new_ct, table, _) = super::charset_override(&t, &dst, maps, encoded);
                    if let Some(v) = new_ct {
                        ct = Some(v);
                    }
                    recode = table;
                    remove_field(&mut head, "x-accel-charset");
                }
                let mut body = Vec::new();
                for &(a, b) in &parts {
                    match ct.as_deref() {
                        Some(ct) => {
                            shard_http::static_file::part_head(&mut body, ct, a, b, body_len)
                        }
                        None => {
                            body.extend_from_slice(
                                format!(
                                    "\r\n--{}\r\nContent-Range: bytes {a}-{b}/{body_len}\r\n\r\n",
                                    shard_http::static_file::BOUNDARY
                                )
                                .as_bytes(),
                            );
                        }
                    }
                    let at = body.len();
                    body.resize(at + (b - a + 1) as usize, 0);
                    if e.file.read_exact_at(&mut body[at..], start + a).is_err() {
                        body.truncate(at);
                    }
                    if let Some(t) = &recode {
                        crate::worker::conn::recode(&mut body[at..], t);
                    }
                }
                shard_http::static_file::part_end(&mut body);
                set_status(&mut head, "206 Partial Content");
                remove_field(&mut head, "content-type");
                insert_field(
                    &mut head,
                    &format!(
                        "Content-Type: multipart/byteranges; boundary={}",
                        shard_http::static_file::BOUNDARY
                    ),
                );
                length = body.len() as u64;
                c.mem = body;
                c.pos = c.end;
            }
            Some(Err(())) => {
                set_status(&mut head, "416 Requested Range Not Satisfiable");
                insert_field(&mut head, &format!("Content-Range: bytes */{body_len}"));
                c.pos = c.end;
                length = 0;
            }
            _ => {}
        }
        p.rbuf.clear();
        cache::served_head_into(&mut p.rbuf, &head, length);
        p.rbuf.extend_from_slice(&c.mem);
        c.mem = Vec::new();
        c.entry = Some(e);
        c.serving = true;
        if let Some(u) = p.up.take() {
            self.close_upconn(u);
        }
        p.state = State::ReadingHead;
        Flow::Next
    }

    /// A served entry's body as a file body of the connection, as a static file's (one
    /// `writev` with the head, `sendfile` where allowed), when nothing has to pass through
    /// the proxy's filters. `Some(Flow::Finished)`: handed over.
    pub(super) fn cache_send_file(&mut self, key: usize, p: &mut Proxy) -> Option<Flow> {
        let sendfile = self.proxy_location(p).sendfile;
        let c = p.cache.as_mut().filter(|c| c.serving)?;
        let super::UpBody::Length(left) = p.upbody else {
            return None;
        };
        if left != c.end - c.pos
            || left == 0
            || !p.rbuf.is_empty()
            || p.client_chunked
            || p.trailers
            || p.window.is_some()
            || p.recode.is_some()
            || p.gunzip.is_some()
            || p.sub.is_some()
            || p.gzip.is_some()
        {
            return None;
        }
        let e = c.entry.take()?;
        let size = e.header.body_start() + e.header.body_len;
        self.set_file_body(key, e.file, c.pos, left, sendfile, size, None);
        c.pos = c.end;
        // (A slice's adds to the slices before it.)
        p.body_sent += left;
        p.upbody = super::UpBody::Length(0);
        Some(Flow::Finished)
    }

    /// A live 200 of a cached location with one satisfiable `Range` on a body of known
    /// length: the range (inclusive) and the length.
    pub(super) fn cache_live_range(
        &self,
        p: &Proxy,
        head: &ResponseHead,
        framing: shard_http::proxy::Framing,
    ) -> Option<(u64, u64, u64)> {
        // A cached location's live answer, or any with `proxy_force_ranges on`; an entry
        // being served has its own ranges.
        let force = self.proxy_location(p).proxy.force_ranges;
        // A sliced answer is whole only here: its range is the client's (nginx's
        // `allow_ranges`).
        let slice = p.slice.is_some();
        let cached = p.cache.as_ref().is_some_and(|c| c.cacheable) || slice;
        if (p.cache.as_ref().is_some_and(|c| c.serving) && !slice)
            || !(cached || force)
            || p.background
            || head.status != 200
            || p.req.method != Method::Get
        {
            return None;
        }
        // `If-Range`: the whole answer unless it names this one (a strong tag, or the exact
        // date), as nginx's range filter.
        if let Some(ir) = p.req.if_range.as_deref() {
            let field = |name: &str| {
                head.headers
                    .iter()
                    .find(|(n, _)| n.eq_ignore_ascii_case(name))
                    .map(|(_, v)| String::from_utf8_lossy(v).trim().to_string())
            };
            let ir = ir.trim();
            let same = if ir.starts_with('"') || ir.starts_with("W/") {
                !ir.starts_with("W/") && field("etag").as_deref() == Some(ir)
            } else {
                field("last-modified").as_deref() == Some(ir)
            };
            if !same {
                return None;
            }
        }
        let shard_http::proxy::Framing::Length(n) = framing else {
            return None;
        };
        if p.gunzip.is_some() || p.sub.is_some() || p.recode.is_some() || p.gzip.is_some() {
            return None;
        }
        match shard_http::static_file::ranges(p.req.range.as_deref()?, n)? {
            Ok(parts) if parts.len() == 1 => Some((parts[0].0, parts[0].1, n)),
            _ => None,
        }
    }

    /// The stale answer of a request with `proxy_cache_background_update` is complete: the
    /// request is logged and goes on as the update, to the upstream, its answer stored and
    /// not sent (the connection's next request waits for it, as nginx's background
    /// subrequest holds its main request). `true`: the update starts.
    pub(super) fn cache_background(&mut self, key: usize, p: &mut Proxy) -> bool {
        if !p.cache.as_ref().is_some_and(|c| c.update_after) {
            return false;
        }
        self.log_proxy_access(key, p, p.status, p.body_sent);
        if let Some(c) = p.cache.as_mut() {
            c.update_after = false;
            c.serving = false;
            // (Served, the entry's file went to the connection: it is opened again.)
            c.entry = self.open_entry(c, 0);
            // The stale entry stays for its validators: with `proxy_cache_revalidate` the
            // update asks the upstream whether it changed (nginx's background subrequest
            // revalidates as any expired request does).
            c.status = Status::Expired;
        }
        p.background = true;
        p.head_sent = false;
        p.status = 0;
        p.body_sent = 0;
        p.rbuf.clear();
        p.upbody = super::UpBody::None;
        p.client_chunked = false;
        p.trailers = false;
        p.recode = None;
        p.gunzip = None;
        p.sub = None;
        p.gzip = None;
        p.state = State::Connect;
        if self.conns[key].has_output() {
            let _ = self.flush(key);
        }
        true
    }

    /// A served entry's next bytes into `buf` (at most `room`); `Some(0)` at its end.
    pub(super) fn cache_read(
        c: &mut CacheReq,
        buf: &mut Vec<u8>,
        room: usize,
    ) -> std::io::Result<Option<usize>> {
        let Some(e) = c.entry.as_ref() else {
            return Ok(Some(0));
        };
        let want = (c.end - c.pos).min(room.max(1) as u64) as usize;
        if want == 0 {
            return Ok(Some(0));
        }
        let at = buf.len();
        buf.resize(at + want, 0);
        match e.file.read_at(&mut buf[at..], c.pos) {
            Ok(0) => {
                buf.truncate(at);
                Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "cache file shrank",
                ))
            }
            Ok(n) => {
                buf.truncate(at + n);
                c.pos += n as u64;
                Ok(Some(n))
            }
            Err(e) => {
                buf.truncate(at);
                Err(e)
            }
        }
    }

    /// The upstream request of a cached location: the client's validators and `Range` are
    /// not passed (the whole response is what gets stored), a revalidation asks with the
    /// entry's, and a converted HEAD is a GET (nginx's `ngx_http_proxy_cache_headers`).
    pub(super) fn cache_request(&self, p: &mut Proxy, out: &mut Vec<u8>) {
        let revalidate = self.cache_conf(p).revalidate;
        // nginx's cache defaults drop these; a `proxy_set_header` of one overrides that
        // (`proxy_set_header Range $slice_range`).
        let set = &self.proxy_location(p).proxy.set_headers;
        let Some(c) = p.cache.as_mut().filter(|c| c.cacheable) else {
            return;
        };
        let Some(end) = memchr::memmem::find(out, b"\r\n\r\n") else {
            return;
        };
        let (head, body) = out.split_at(end + 2);
        let mut new = Vec::with_capacity(out.len() + 96);
        for (i, line) in head.split_inclusive(|&b| b == b'\n').enumerate() {
            if i == 0 {
                match line.strip_prefix(b"HEAD ").filter(|_| p.upstream_get) {
                    Some(rest) => {
                        new.extend_from_slice(b"GET ");
                        new.extend_from_slice(rest);
                    }
                    None => new.extend_from_slice(line),
                }
                continue;
            }
            let name = line.split(|&b| b == b':').next().unwrap_or(b"");
            let dropped = [
                &b"if-modified-since"[..],
                b"if-unmodified-since",
                b"if-none-match",
                b"if-match",
                b"range",
                b"if-range",
            ]
            .iter()
            .any(|f| name.eq_ignore_ascii_case(f))
                && !set
                    .iter()
                    .any(|(n, _)| n.as_bytes().eq_ignore_ascii_case(name));
            if !dropped {
                new.extend_from_slice(line);
            }
        }
        let (last_modified, etag) = c.revalidation_validators(revalidate);
        for (ask, v) in [
            ("If-Modified-Since", last_modified),
            ("If-None-Match", etag),
        ] {
            if let Some(v) = v {
                new.extend_from_slice(ask.as_bytes());
                new.extend_from_slice(b": ");
                new.extend_from_slice(&v);
                new.extend_from_slice(b"\r\n");
            }
        }
        new.extend_from_slice(body);
        *out = new;
    }

    /// A FastCGI request of a cached location: `Some` when the response could be stored,
    /// with the values of `HTTP_IF_MODIFIED_SINCE` and `HTTP_IF_NONE_MATCH` (the entry's
    /// validators when revalidating, else empty): the client's validators and `Range` are
    /// not passed then (nginx's `ngx_http_fastcgi_cache_headers`, its `params_cache`).
    pub(super) fn fcgi_cache_params(&self, p: &mut Proxy) -> Option<(Vec<u8>, Vec<u8>)> {
        let revalidate = self.cache_conf(p).revalidate;
        let c = p.cache.as_mut().filter(|c| c.cacheable)?;
        let (lm, etag) = c.revalidation_validators(revalidate);
        Some((lm.unwrap_or_default(), etag.unwrap_or_default()))
    }

    /// The upstream's head is in: a `304` to a revalidation serves the entry again, a
    /// failure `proxy_cache_use_stale` names serves the stale one, and a response that may
    /// be stored starts its entry. `Some(flow)`: the upstream's response is dropped.
    pub(super) fn cache_on_head(
        &mut self,
        key: usize,
        p: &mut Proxy,
        head: &ResponseHead,
        head_len: usize,
    ) -> Option<Flow> {
        let mut c = p.cache.take()?;
        if c.serving {
            p.cache = Some(c);
            return None;
        }
        let loc = self.proxy_location(p);
        let cc = &loc.proxy.cache;
        let now = self.cx.now_secs;
        if c.revalidating && head.status == 304 {
            if let Some(e) = c.entry.take() {
                let stored_status = status_of(&e.head);
                // Freshness from the 304's own fields, else (nginx re-reads the entry's
                // head) from the stored answer's fields, else `proxy_cache_valid`.
                let raw = shard_http::proxy::header_lines(&p.rbuf[..head_len]);
                let stored = shard_http::proxy::header_lines(&e.head);
                let ignore = loc.proxy.ignore_headers;
                let until = match cache::validity(stored_status, &raw, &[], ignore, now) {
                    cache::Validity::Until(t) => t,
                    cache::Validity::No => {
                        match cache::validity(stored_status, &stored, &cc.valid, ignore, now) {
                            cache::Validity::Until(t) => t,
                            cache::Validity::No => now,
                        }
                    }
                };
                match cache::refresh(&c.path, &e.header, until, now) {
                    // The zone gives the entry a new version: kept copies of its old
                    // header are not used again.
                    Ok(()) => {
                        let size = e.header.body_start() + e.header.body_len;
                        c.z.stored(c.zkey, size, cache::unix_ms());
                    }
                    Err(err) => {
                        crate::log!(Crit, "pwrite() \"{}\" failed ({err})", c.path.display())
                    }
                }
                self.release_upstream_after_head(p, head);
                c.status = Status::Revalidated;
                c.end_update();
                if p.background {
                    // The update is done: the client had its answer already.
                    p.cache = Some(c);
                    return Some(Flow::Finished);
                }
                let flow = self.cache_serve(p, &mut c, e, true);
                p.cache = Some(c);
                return Some(flow);
            }
        }
        // An answer with a status `proxy_cache_use_stale` names (`http_500` ...) is replaced
        // by the stale entry; `stale-if-error` does not cover answers (nginx 1.19.3+).
        let bit = stale::of_status(head.status);
        if c.entry.is_some() && bit != 0 && cc.use_stale & bit != 0 {
            let e = c.entry.take().expect("checked");
            if let Some(u) = p.up.take() {
                self.close_upconn(u);
            }
            c.status = Status::Stale;
            let flow = self.cache_serve(p, &mut c, e, true);
            p.cache = Some(c);
            return Some(flow);
        }
        c.entry = None;
        let no_cache = any_true(&self.render_all(key, p, loc, &cc.no_cache));
        // The fields as received (`X-Accel-Expires` is hidden from the client's head).
        let raw = shard_http::proxy::header_lines(&p.rbuf[..head_len]);
        let store = c.may_store && !no_cache && c.uses >= cc.min_uses;
        if store {
            if let cache::Validity::Until(until) =
                cache::validity(head.status, &raw, &cc.valid, loc.proxy.ignore_headers, now)
            {
                let stored = cache::stored_head(&p.rbuf[..head_len]);
                let vary = loc.proxy.ignore_headers & shard_config::ignore::VARY == 0
                    && head
                        .headers
                        .iter()
                        .any(|(n, _)| n.eq_ignore_ascii_case("vary"));
                let variant = if vary {
                    self.request_variant(p, &c, &stored)
                } else {
                    [0; 16]
                };
                // Stored as the variant it was looked up as only when it is that variant
                // (nginx's `ngx_http_file_cache_update_variant`); otherwise, an answer without
                // `Vary` or varying on other fields included, it becomes the key's own entry,
                // which every request reads first.
                let main = cache::key_md5(&c.key);
                if c.md5 != main && !(vary && variant == c.md5) {
                    let md5 = main;
                    let cp = &self.http().cache_paths[c.zone];
                    c.path = cache::entry_path(&cp.path, &cp.levels, &md5);
                    c.end_update();
                    c.md5 = md5;
                    c.zkey = cache::zone_key(&md5);
                }
                let (updating_secs, error_secs) =
                    cache::stale_extensions(&raw, loc.proxy.ignore_headers);
                let header = cache::Header {
                    valid_until: until,
                    stored_at: now,
                    variant,
                    updating_secs,
                    error_secs,
                    ..Default::default()
                };
                let dir = self.http().cache_paths[c.zone].path.clone();
                // `proxy_intercept_errors` will answer with the location's `error_page`: the
                // entry records the status alone (nginx's cached error).
                let intercepted = loc.proxy.intercept_errors
                    && head.status >= 300
                    && loc
                        .error_pages
                        .iter()
                        .any(|e| e.codes.contains(&head.status));
                let header = cache::Header {
                    error_status: if intercepted { head.status } else { 0 },
                    ..header
                };
                match cache::Writer::create(&dir, &c.key, &stored, header) {
                    Ok(w) if intercepted => match w.commit(&c.path) {
                        Ok(size) => c.z.stored(c.zkey, size, cache::unix_ms()),
                        Err(e) => {
                            crate::log!(Crit, "rename() to \"{}\" failed ({e})", c.path.display())
                        }
                    },
                    Ok(w) => c.writer = Some(w),
                    Err(e) => {
                        crate::log!(Crit, "open() \"{}\" failed ({e})", dir.display());
                    }
                }
            }
        }
        p.cache = Some(c);
        None
    }

    /// A `304` answered a revalidation: its connection goes back to the pool when it may.
    fn release_upstream_after_head(&mut self, p: &mut Proxy, head: &ResponseHead) {
        if let Some(u) = p.up.take() {
            if head.reusable && p.fcgi.is_none() {
                self.pool_upconn(u);
            } else {
                self.close_upconn(u);
            }
        }
    }

    /// A failed attempt with nothing sent to the client: the stale entry instead, when
    /// `proxy_cache_use_stale` names the failure. `true`: the request now serves it.
    pub(super) fn cache_stale_on_failure(&mut self, p: &mut Proxy) -> bool {
        let Some(mut c) = p.cache.take() else {
            return false;
        };
        let bit = match p.last_failure {
            Some(Failure::Error) => stale::ERROR,
            Some(Failure::Timeout) => stale::TIMEOUT,
            Some(Failure::InvalidHeader) => stale::INVALID_HEADER,
            Some(Failure::Status(s)) => stale::of_status(s),
            None => 0,
        };
        // `stale-if-error` lets an error, a timeout or an invalid header have the entry,
        // within its seconds; not an answer with a 5xx status (nginx 1.19.3+: only
        // `proxy_cache_use_stale http_500 ...` serves stale for those).
        let now = self.cx.now_secs;
        let if_error = !matches!(p.last_failure, Some(Failure::Status(_)))
            && c.entry
                .as_ref()
                .is_some_and(|e| now < e.header.valid_until + u64::from(e.header.error_secs));
        let allowed = self.cache_conf(p).use_stale & bit != 0 || (bit != 0 && if_error);
        if c.serving || !allowed || c.entry.is_none() {
            p.cache = Some(c);
            return false;
        }
        let e = c.entry.take().expect("checked");
        c.status = Status::Stale;
        let _ = self.cache_serve(p, &mut c, e, false);
        p.cache = Some(c);
        true
    }

    /// The response is complete: its entry goes in place and the zone learns it.
    pub(super) fn cache_commit(&mut self, p: &mut Proxy) {
        let Some(c) = p.cache.as_mut() else {
            return;
        };
        if let Some(w) = c.writer.take() {
            match w.commit(&c.path) {
                Ok(size) => c.z.stored(c.zkey, size, cache::unix_ms()),
                Err(e) => crate::log!(Crit, "rename() to \"{}\" failed ({e})", c.path.display()),
            }
        }
    }
}

/// Where the first range of `Range: bytes=...` starts (`None`: a suffix range, or not one).
fn range_start(h: &str) -> Option<u64> {
    let h = h.trim();
    let spec = h
        .get(6..)
        .filter(|_| h[..6].eq_ignore_ascii_case("bytes="))?;
    let digits: String = spec
        .trim_start()
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

/// The status of a stored head's status line.
fn status_of(head: &[u8]) -> u16 {
    head.get(9..12)
        .and_then(|s| std::str::from_utf8(s).ok())
        .and_then(|s| s.parse().ok())
        .unwrap_or(200)
}

/// Replaces a head's status code and reason.
fn set_status(head: &mut Vec<u8>, status: &str) {
    let Some(eol) = memchr::memchr(b'\n', head) else {
        return;
    };
    let version = head[..8.min(head.len())].to_vec();
    let mut line = version;
    line.push(b' ');
    line.extend_from_slice(status.as_bytes());
    line.extend_from_slice(b"\r\n");
    head.splice(..=eol, line);
}

/// Adds a field before the head's empty line.
fn insert_field(head: &mut Vec<u8>, field: &str) {
    let end = head.len().saturating_sub(2);
    let mut f = field.as_bytes().to_vec();
    f.extend_from_slice(b"\r\n");
    head.splice(end..end, f);
}

/// Removes every line of field `name` (lowercase).
fn remove_field(head: &mut Vec<u8>, name: &str) {
    let mut out = Vec::with_capacity(head.len());
    for (i, line) in head.split_inclusive(|&b| b == b'\n').enumerate() {
        let n = line.split(|&b| b == b':').next().unwrap_or(b"");
        if i > 0 && n.eq_ignore_ascii_case(name.as_bytes()) {
            continue;
        }
        out.extend_from_slice(line);
    }
    *head = out;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_range_window_cuts_the_body_across_reads() {
        use super::super::window_of;
        // Bytes 3..7 of a body read as 4 + 4 + 2.
        let mut w = Some((3, 7, 0));
        assert_eq!(window_of(&mut w, 4), 3..4);
        assert_eq!(window_of(&mut w, 4), 0..3);
        assert_eq!(window_of(&mut w, 2), 0..0);
        assert_eq!(window_of(&mut None, 5), 0..5);
    }

    #[test]
    fn heads_are_edited_in_place() {
        let mut h = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\n".to_vec();
        set_status(&mut h, "206 Partial Content");
        insert_field(&mut h, "Content-Range: bytes 0-1/5");
        remove_field(&mut h, "content-type");
        assert_eq!(
            h,
            b"HTTP/1.1 206 Partial Content\r\nContent-Range: bytes 0-1/5\r\n\r\n"
        );
        assert_eq!(status_of(b"HTTP/1.1 404 Not Found\r\n\r\n"), 404);
        assert_eq!(
            vary_fields(b"HTTP/1.1 200 OK\r\nVary: Accept-Encoding, X-A\r\n\r\n"),
            vec!["accept-encoding", "x-a"]
        );
        assert_eq!(range_start("bytes=3-"), Some(3));
        assert_eq!(range_start("bytes=1-1,3-"), Some(1));
        assert_eq!(range_start("bytes=-1"), None);
        assert!(any_true(&["".into(), "1".into()]));
        assert!(!any_true(&["".into(), "0".into()]));
    }
}
