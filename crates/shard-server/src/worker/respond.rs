//! Turning a routed request into bytes: status pages, `return`, and static files.
//!
//! `shard-http` decides (status, headers, byte ranges); this module does the I/O those decisions
//! need (`open`, `fstat`, reading the shared counters and `TCP_INFO`) and fills the
//! connection's output buffer or file body.

use std::ffi::CString;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use shard_config::{
    LocationConf, StatusHandler, SymlinkCheck, SymlinksFrom, CLOSE_WITHOUT_RESPONSE,
};
use shard_http::gzip;
use shard_http::request::{Method, Request};
use shard_http::response::{write_head, Head};
use shard_http::static_file::{FileMeta, Plan};

use super::files::{FileCache, Opened};
use super::step::Reply;
use super::Worker;
use crate::shm::WorkerSlot;
use crate::shm::{STEER_AWAY, STEER_STALLED};
use crate::status::{self, ListenerRow};

pub(super) fn respond(
    w: &mut Worker<'_>,
    key: usize,
    loc: &LocationConf,
    req: &Request,
    keep_alive: bool,
    head: &[u8],
) -> Reply {
    if let Some(h) = loc.handler {
        return status_page(w, key, h, loc, req, keep_alive, head);
    }
    if let Some(ret) = &loc.ret {
        let text = ret.text.as_ref().map(|_| {
            let mut storage = shard_http::vars::header_storage();
            let headers = shard_http::vars::request_headers(head, &mut storage);
            let ctx = w.var_ctx(key, req, headers, loc);
            shard_http::vars::render(&ret.parts, &ctx)
        });
        return returned(w, key, loc, req, keep_alive, head, ret.code, text);
    }
    static_file(w, key, loc, req, keep_alive, head)
}

/// nginx's `return CODE [TEXT]`, its text already expanded (`444` closes the connection).
#[allow(clippy::too_many_arguments)]
pub(super) fn returned(
    w: &mut Worker<'_>,
    key: usize,
    loc: &LocationConf,
    req: &Request,
    keep_alive: bool,
    head: &[u8],
    code: u16,
    text: Option<String>,
) -> Reply {
    // nginx's `return` discards the body first, reading what has come: a malformed chunked
    // body found there is its 400, not the returned answer (a body over
    // `client_max_body_size` is no error when discarded).
    if code != 444 && w.conns[key].body_pending() && !w.conns[key].close_after {
        w.consume_body(key, None);
        let r = w.conns[key].rd();
        let too_large = r.body_bytes_max > 0 && r.body_bytes > r.body_bytes_max;
        if w.conns[key].close_after && !too_large {
            return status(w, key, loc, req, keep_alive, head, 400);
        }
    }
    if code == CLOSE_WITHOUT_RESPONSE {
        w.close_without_response(key);
        return Reply {
            status: CLOSE_WITHOUT_RESPONSE,
            body_bytes: 0,
            error_page: None,
            redirect: None,
        };
    }
    // The type of a text is the URI's (its extension in `types`), else `default_type`: nginx's
    // `ngx_http_set_content_type` in `ngx_http_send_response`.
    let ct = shard_http::static_file::content_type(loc, std::path::Path::new(&req.path));
    let r = shard_http::response::return_reply(code, text, ct);
    simple(w, key, req, keep_alive, loc, head, r)
}

/// A response built by the caller (an `error_page` redirect), sent as `return` sends one.
pub(super) fn simple_reply(
    w: &mut Worker<'_>,
    key: usize,
    loc: &LocationConf,
    req: &Request,
    keep_alive: bool,
    head: &[u8],
    r: shard_http::response::Simple,
) -> Reply {
    simple(w, key, req, keep_alive, loc, head, r)
}

/// An error status decided before the content (`deny` gives 403): its page, in `loc`.
pub(super) fn status(
    w: &mut Worker<'_>,
    key: usize,
    loc: &LocationConf,
    req: &Request,
    keep_alive: bool,
    head: &[u8],
    status: u16,
) -> Reply {
    let reply = shard_http::response::error_simple(status);
    simple(w, key, req, keep_alive, loc, head, reply)
}

/// A complete in-memory response, gzipped when `gz` says so (only 200s ever are).
#[allow(clippy::too_many_arguments)]
fn simple(
    w: &mut Worker<'_>,
    key: usize,
    req: &Request,
    keep_alive: bool,
    loc: &LocationConf,
    head: &[u8],
    mut r: shard_http::response::Simple,
) -> Reply {
    let c = &w.conns[key];
    // An error page of shard's own may be replaced by the location's `error_page` (once: a
    // second error while serving one is sent as it is, nginx's `recursive_error_pages off`).
    if r.status >= 300
        && !c.rd().in_error_page
        && !r.body.is_empty()
        && r.body.as_slice() == shard_http::response::error_body(r.status)
    {
        if let Some(i) = loc
            .error_pages
            .iter()
            .position(|e| e.codes.contains(&r.status))
        {
            if let Some(l) = r.location.take() {
                w.conns[key].rq().kept_location = Some(l.into());
            }
            return Reply {
                status: r.status,
                body_bytes: 0,
                error_page: Some(i),
                redirect: None,
            };
        }
    }
    if let Some(code) = c
        .rd()
        .status_override
        .filter(|_| (200..300).contains(&r.status))
    {
        r.status = code;
    }
    // nginx's 497 (plain HTTP to an HTTPS port), 495 (a client certificate that does not
    // verify) and 496 (none sent) go out as 400 when no `error_page` took them.
    if matches!(r.status, 495..=497) {
        r.status = 400;
    }
    if r.location.is_none() {
        r.location = w.conns[key].rq().kept_location.take().map(String::from);
    }
    // `msie_refresh`: MSIE gets a page that refreshes to the location, as written (before
    // the filters, as nginx sends it through them).
    if loc.msie_refresh
        && matches!(r.status, 301 | 302)
        && r.location.is_some()
        && shard_http::response::is_msie(req)
    {
        let to = r.location.take().unwrap_or_default();
        r.status = 200;
        r.content_type = Some("text/html".to_string());
        r.body = shard_http::response::msie_refresh_page(&to);
    }
    // After an `X-Accel-Redirect`, a successful answer keeps the upstream's type (nginx's
    // error pages set their own).
    if r.status < 300 && r.content_type.is_some() {
        if let Some(ct) = accel_content_type(w, key) {
            r.content_type = Some(ct);
        }
    }
    // `sub_filter`, before gzip as in nginx's filter chain.
    if let Some(mut f) = r
        .content_type
        .as_deref()
        .and_then(|ct| w.sub_filter_for(key, req, head, loc, ct))
    {
        let mut out = Vec::with_capacity(r.body.len());
        f.feed(&r.body, &mut out);
        f.finish(&mut out);
        r.body = out;
    }
    // `ssi`: the body is processed as it is written (and not compressed: the pipe reads it).
    let ssi = !r.body.is_empty()
        && super::ssi::may_filter(loc)
        && w.filter_begin(key, req, head, loc, r.content_type.as_deref(), r.status);
    let gz = &loc.gzip;
    // A response of shard's own making has no validators; `expires` may make it uncacheable.
    let neg = matches!(
        &loc.expires,
        Some(shard_config::Expires::Epoch)
            | Some(shard_config::Expires::After {
                secs: i64::MIN..=-1,
                ..
            })
    );
    let traits = gzip::ResponseTraits {
        expired: neg,
        no_cache: neg,
        ..Default::default()
    };
    let g = gzip::decide_for(
        gz,
        req,
        r.status,
        r.content_type.as_deref(),
        r.body.len() as u64,
        &traits,
    );
    let g = if ssi { gzip::Decision::default() } else { g };
    if g.compress {
        r.body = gzip::compress(gz.comp_level, &r.body);
    }
    if let Some(abs) = r
        .location
        .as_deref()
        .and_then(|l| w.absolute_redirect(key, loc, req, l))
    {
        r.location = Some(abs);
    }
    let mut extra = extra_headers(
        w,
        key,
        req,
        loc,
        head,
        r.status,
        None,
        r.content_type.as_deref(),
    );
    // `auth_basic`'s 401 names its realm (quotes and control bytes dropped).
    if let Some(realm) = w.conns[key]
        .rq()
        .www_authenticate
        .take()
        .filter(|_| r.status == 401)
    {
        extra.extend_from_slice(b"WWW-Authenticate: Basic realm=\"");
        extra.extend(
            realm
                .bytes()
                .filter(|&b| b != b'"' && b != b'\\' && b >= 0x20 && b != 0x7f),
        );
        extra.extend_from_slice(b"\"\r\n");
    }
    let date = std::mem::take(&mut w.cx.date);
    let out = w.out_buf(key);
    write_head(
        out,
        &Head {
            status: r.status,
            date: &date,
            content_type: r.content_type.as_deref(),
            content_length: Some(r.body.len() as u64),
            keep_alive,
            location: r.location.as_deref(),
            content_encoding: g.compress.then_some(gzip::ENCODING),
            vary: g.vary.then_some(gzip::VARY),
            server: shard_http::response::server_value(loc),
            extra: &extra,
            // nginx's charset filter leaves 301 and 302 alone.
            charset: r
                .content_type
                .as_deref()
                .filter(|_| !matches!(r.status, 301 | 302))
                .and_then(|ct| shard_http::response::charset_for(loc, ct)),
            ..Default::default()
        },
    );
    let sent = if req.method == Method::Head {
        0
    } else {
        out.extend_from_slice(&r.body);
        r.body.len() as u64
    };
    w.cx.date = date;
    Reply {
        status: r.status,
        body_bytes: sent,
        error_page: None,
        redirect: None,
    }
}

/// `expires` and `add_header` of `loc` for a response with `status` (empty, with no
/// allocation, when the location has neither).
#[allow(clippy::too_many_arguments)]
pub(super) fn extra_headers(
    w: &Worker<'_>,
    key: usize,
    req: &Request,
    loc: &LocationConf,
    head: &[u8],
    status: u16,
    mtime: Option<i64>,
    content_type: Option<&str>,
) -> Vec<u8> {
    let mut extra = Vec::new();
    if let Some(a) = &w.conns[key].rd().accel_headers {
        // The upstream's `Content-Type` is the response's own (`accel_content_type`); a
        // file says its own `Accept-Ranges`.
        for line in a.split_inclusive(|&b| b == b'\n') {
            let name = line.split(|&b| b == b':').next().unwrap_or(b"");
            if name.eq_ignore_ascii_case(b"content-type")
                || (mtime.is_some() && name.eq_ignore_ascii_case(b"accept-ranges"))
            {
                continue;
            }
            extra.extend_from_slice(line);
        }
    }
    // The userid module's cookie (its filter runs before `add_header`'s).
    if let Some(u) = w.conns[key].rd().uid_header.as_deref() {
        extra.extend_from_slice(u);
    }
    let if_headers = w.conns[key].rd().if_headers.as_deref();
    if loc.expires.is_none() && loc.add_headers.is_empty() && if_headers.is_none() {
        return extra;
    }
    let mut storage = shard_http::vars::header_storage();
    let headers = shard_http::vars::request_headers(head, &mut storage);
    let mut ctx = w.var_ctx(key, req, headers, loc);
    ctx.done = Some(shard_http::vars::Done {
        status,
        content_type,
        ..Default::default()
    });
    shard_http::response::write_extra(
        &mut extra,
        loc,
        if_headers,
        status,
        w.cx.now_secs,
        mtime,
        Some(&ctx),
    );
    extra
}

fn listener_rows(w: &Worker<'_>) -> Vec<ListenerRow> {
    let mut rows = Vec::new();
    for l in w.listeners_open {
        for (k, &fd) in l.fds.iter().enumerate() {
            let (queue, backlog) =
                shard_event::sock::listen_queue(fd).unwrap_or((0, l.backlog.max(0) as u32));
            // A per-worker shard's steering bits are its worker's (see `steer.rs`).
            let bits = if l.owned_by_one() && k < l.active {
                w.region.steer_bits(k)
            } else {
                0
            };
            let address =
                shard_event::sock::local_addr(fd).map_or(l.addr.to_string(), |a| a.to_string());
            rows.push(ListenerRow {
                address,
                shard: l.reuseport.then_some(k),
                worker: l.owned_by_one().then_some(k),
                workers: l.pollers(k),
                queue,
                backlog,
                stalled: bits & STEER_STALLED != 0,
                steered_away: bits & STEER_AWAY != 0,
            });
        }
    }
    rows
}

/// `empty_gif`: a 1x1 transparent GIF, as nginx serves it.
const EMPTY_GIF: &[u8] = &[
    b'G', b'I', b'F', b'8', b'9', b'a', // header
    0x01, 0x00, 0x01, 0x00, // 1x1
    0x80, 0x01, 0x00, // a 2-colour global table, background #1, no aspect ratio
    0x00, 0x00, 0x00, 0xff, 0xff, 0xff, // black, white
    0x21, 0xf9, 0x04, 0x01, 0x00, 0x00, 0x01, 0x00, // graphic control: #1 transparent
    0x2c, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x01, 0x00, 0x00, // image descriptor
    // LZW: minimum code size 2, one 2-byte block (clear, 1, end of information), as nginx's.
    0x02, 0x02, 0x4c, 0x01, 0x00, 0x3b, // trailer
];

fn status_page(
    w: &mut Worker<'_>,
    key: usize,
    h: StatusHandler,
    loc: &LocationConf,
    req: &Request,
    keep_alive: bool,
    head: &[u8],
) -> Reply {
    if !matches!(req.method, Method::Get | Method::Head) {
        return simple(
            w,
            key,
            req,
            keep_alive,
            loc,
            head,
            shard_http::response::error_simple(405),
        );
    }
    let mut body = Vec::with_capacity(1024);
    let content_type = match h {
        StatusHandler::EmptyGif => {
            body.extend_from_slice(EMPTY_GIF);
            "image/gif"
        }
        StatusHandler::Stub => {
            status::stub(w.region, &mut body);
            "text/plain"
        }
        StatusHandler::Shard => {
            // Refresh our own CPU time so the page is current for at least the answering worker.
            w.publish_cpu();
            let rows = listener_rows(w);
            let prom = req
                .query
                .as_deref()
                .is_some_and(|q| q.split('&').any(|kv| kv == "format=prometheus"));
            if prom {
                status::prometheus(w.region, &rows, w.cx.now_ms, &mut body);
                "text/plain; version=0.0.4"
            } else {
                status::json(w.region, &rows, w.cx.now_ms, &mut body);
                "application/json"
            }
        }
    };
    simple(
        w,
        key,
        req,
        keep_alive,
        loc,
        head,
        shard_http::response::Simple {
            status: 200,
            content_type: Some(content_type.to_string()),
            location: None,
            body,
        },
    )
}

fn open_file(path: &Path, loc: &LocationConf) -> Opened {
    open_file_id(path, loc).0
}

fn file_meta(st: &shard_event::fs::Stat) -> FileMeta {
    FileMeta {
        size: st.size,
        mtime_secs: st.mtime_secs,
        is_dir: st.is_dir,
        is_file: st.is_file,
    }
}

/// Opens `path` for a static response (under `disable_symlinks`, checked component by
/// component); with what the open descriptor is, for [`Reuse`](super::files::Reuse).
/// On failure, the `errno` (0 if none).
fn open_file_id(path: &Path, loc: &LocationConf) -> (Opened, Result<shard_event::fs::FileId, i32>) {
    let res = match symlink_check(path, loc) {
        None => CString::new(path.as_os_str().as_bytes())
            .map_err(|_| std::io::Error::from_raw_os_error(libc::ENOENT))
            .and_then(|c| shard_event::fs::open_stat(&c)),
        Some((base, rest, mode)) => CString::new(base.as_os_str().as_bytes())
            .map_err(|_| std::io::Error::from_raw_os_error(libc::ENOENT))
            .and_then(|b| shard_event::fs::open_stat_checked(&b, rest, mode)),
    };
    let opened = match res {
        Ok((fd, st)) => {
            return (
                Opened::File(super::files::OpenFile::new(fd), file_meta(&st)),
                Ok(st.id),
            )
        }
        Err(ref e) => match e.raw_os_error() {
            Some(libc::EACCES) | Some(libc::EPERM) => Opened::Forbidden,
            Some(libc::ELOOP) => {
                crate::log!(
                    Error,
                    "open() \"{}\" failed ({})",
                    path.display(),
                    shard_event::os_error_text(e)
                );
                Opened::Forbidden
            }
            _ => Opened::Missing,
        },
    };
    (
        opened,
        Err(res.err().and_then(|e| e.raw_os_error()).unwrap_or(0)),
    )
}

/// Under `disable_symlinks`: the part of `path` opened as usual (the `from=` part when `path`
/// lies under it, else `/`), the rest to check component by component, and how.
fn symlink_check<'p>(
    path: &'p Path,
    loc: &LocationConf,
) -> Option<(&'p Path, &'p [u8], shard_event::fs::Symlinks)> {
    let mode = match loc.disable_symlinks.check {
        SymlinkCheck::Off => return None,
        SymlinkCheck::On => shard_event::fs::Symlinks::Refuse,
        SymlinkCheck::IfNotOwner => shard_event::fs::Symlinks::SameOwner,
    };
    let from = match &loc.disable_symlinks.from {
        Some(SymlinksFrom::DocumentRoot) => Some(loc.alias.as_deref().unwrap_or(&loc.root)),
        Some(SymlinksFrom::Path(p)) => Some(p.as_path()),
        None => None,
    };
    let root = Path::new("/");
    let base = from
        .filter(|f| path.starts_with(f))
        .and_then(|f| path.ancestors().find(|a| *a == f))
        .unwrap_or(root);
    let rest = path.strip_prefix(base).unwrap_or(path);
    Some((base, rest.as_os_str().as_bytes(), mode))
}

/// `open_file` through the location's `open_file_cache`, when it has one, else through the
/// worker's [`Reuse`](super::files::Reuse). Paths checked for symbolic links
/// (`disable_symlinks`) are neither: the check is made on every open.
fn open_cached(w: &mut Worker<'_>, path: &Path, loc: &LocationConf) -> Opened {
    if loc.disable_symlinks.check != SymlinkCheck::Off {
        return open_file(path, loc);
    }
    let ofc = &loc.open_file_cache;
    let Some(max) = ofc.max else {
        return open_reused(w, path, loc);
    };
    // One cache per location, as nginx keeps one per configuration that sets it; the
    // configuration outlives the worker's loop, so its address names the location.
    let id = loc as *const LocationConf as usize;
    let now = w.cx.now_ms;
    let cache = w
        .file_caches
        .entry(id)
        .or_insert_with(|| (FileCache::new(max), ofc.inactive_ms));
    if let Some(hit) = cache.0.get(path, now, ofc) {
        WorkerSlot::bump(&w.cx.slot.file_cache_hits, 1);
        return hit;
    }
    WorkerSlot::bump(&w.cx.slot.file_cache_misses, 1);
    let opened = open_file(path, loc);
    if let Opened::File(fd, _) = &opened {
        fd.size_checked(w.request_seq);
    }
    let before = cache.0.len();
    cache.0.put(path, &opened, now, ofc);
    let after = cache.0.len();
    w.file_cache_entries = w.file_cache_entries + after - before;
    w.cx.slot.file_cache_entries.store(
        w.file_cache_entries as u64,
        std::sync::atomic::Ordering::Relaxed,
    );
    opened
}

/// `open_file` that keeps the descriptor of a regular file for the next request of the same
/// path, which `stat`s the path and uses it only if it is still that file (see `files.rs`).
fn open_reused(w: &mut Worker<'_>, path: &Path, loc: &LocationConf) -> Opened {
    let now = w.cx.now_ms;
    let stat = || {
        CString::new(path.as_os_str().as_bytes())
            .ok()
            .and_then(|c| shard_event::fs::stat_path(&c).ok())
    };
    if let Some((fd, st)) = w.reuse.get(path, now, stat) {
        fd.size_checked(w.request_seq);
        return Opened::File(fd, file_meta(&st));
    }
    let (mut opened, mut id) = open_file_id(path, loc);
    // Out of descriptors: the held ones go first, then the open is tried again.
    if matches!(id, Err(libc::EMFILE) | Err(libc::ENFILE)) && w.release_held_files() {
        (opened, id) = open_file_id(path, loc);
    }
    if let (Opened::File(fd, meta), Ok(id)) = (&opened, id) {
        fd.size_checked(w.request_seq);
        if meta.is_file {
            w.reuse.put(path, fd, id, now);
        }
    }
    opened
}

fn static_file(
    w: &mut Worker<'_>,
    key: usize,
    loc: &LocationConf,
    req: &Request,
    keep_alive: bool,
    head: &[u8],
) -> Reply {
    let root = w.doc_root(key, req, loc, head);
    let path = if req.add_uri_to_alias {
        shard_http::static_file::map_try_path_with(loc, &req.path, root.as_deref())
    } else {
        shard_http::static_file::map_path_with(loc, &req.path, root.as_deref())
    };
    let opened = if req.path.ends_with('/') {
        // nginx's index module (GET, HEAD and POST): the index files in order; an absolute
        // name is an internal redirect at its turn, a relative one that exists is an
        // internal redirect to the URI with its name (arguments kept), so another location
        // may serve it. The directory is looked at only when a name is missing: a missing
        // directory is 404, one with no index file 403.
        let rendered;
        let names: &[String] = match &loc.index_vars {
            Some(t) => {
                let mut storage = shard_http::vars::header_storage();
                let hs = shard_http::vars::request_headers(head, &mut storage);
                let ctx = w.var_ctx(key, req, hs, loc);
                rendered = t
                    .iter()
                    .map(|p| shard_http::vars::render(p, &ctx))
                    .collect::<Vec<_>>();
                &rendered
            }
            None => &loc.index,
        };
        // `random_index on` (nginx's random index module, before the index module): a
        // random regular file of the directory, names starting with `.` excepted.
        if loc.random_index && matches!(req.method, Method::Get | Method::Head | Method::Post) {
            if let Ok(dir) = std::fs::read_dir(&path) {
                let mut files: Vec<String> = dir
                    .flatten()
                    // A symbolic link counts by what it points to, as nginx's stat.
                    .filter(|e| match e.file_type() {
                        Ok(t) if t.is_symlink() => {
                            std::fs::metadata(e.path()).is_ok_and(|m| m.is_file())
                        }
                        Ok(t) => t.is_file(),
                        Err(_) => false,
                    })
                    .filter_map(|e| e.file_name().into_string().ok())
                    .filter(|n| !n.starts_with('.'))
                    .collect();
                if !files.is_empty() {
                    // The request id is random enough to choose a file.
                    let pick = (w.request_id(key) % files.len() as u128) as usize;
                    let name = files.swap_remove(pick);
                    return internal_redirect(format!("{}{name}", req.path));
                }
            }
        }
        if matches!(req.method, Method::Get | Method::Head | Method::Post) {
            let mut dir_tested = false;
            for name in names.iter().filter(|n| !n.is_empty()) {
                if name.starts_with('/') {
                    return internal_redirect(name.clone());
                }
                let cand = path.join(name);
                match open_cached(w, &cand, loc) {
                    Opened::File(..) => return internal_redirect(format!("{}{name}", req.path)),
                    Opened::Forbidden => {
                        let reply = shard_http::response::error_simple(403);
                        return simple(w, key, req, keep_alive, loc, head, reply);
                    }
                    Opened::Missing if !dir_tested => {
                        dir_tested = true;
                        if !matches!(open_cached(w, &path, loc), Opened::File(_, m) if m.is_dir) {
                            break;
                        }
                    }
                    Opened::Missing => {}
                }
            }
        }
        // No index file: the directory decides: its listing with `autoindex on` (GET and
        // HEAD), 403 where it exists, else 404. A method no content handler takes is
        // nginx's "directory index ... is forbidden", 403, whether it exists or not.
        if !matches!(req.method, Method::Get | Method::Head | Method::Post) {
            crate::log!(
                Error,
                "directory index of \"{}\" is forbidden{}",
                path.display(),
                w.log_context(key, Some(req))
            );
            let reply = shard_http::response::error_simple(403);
            return simple(w, key, req, keep_alive, loc, head, reply);
        }
        match open_cached(w, &path, loc) {
            Opened::File(_, meta)
                if meta.is_dir
                    && loc.autoindex.on == Some(true)
                    && matches!(req.method, Method::Get | Method::Head) =>
            {
                let reply = autoindex(loc, req, &path);
                return simple(w, key, req, keep_alive, loc, head, reply);
            }
            Opened::File(_, meta) if meta.is_dir => Opened::Forbidden,
            other => other,
        }
    } else if !matches!(req.method, Method::Get | Method::Head | Method::Post) {
        // nginx's static handler refuses other methods before it looks for the file.
        let reply = shard_http::response::error_simple(405);
        return simple(w, key, req, keep_alive, loc, head, reply);
    } else {
        // `gzip_static`: FILE.gz in its place when it exists (and, with `on`, the client takes
        // gzip), sent as it is with `Content-Encoding: gzip`, whether FILE exists or not (as
        // nginx's gzip_static handler, which runs before the static one).
        if gzip_static_wanted(loc, req) {
            let mut gz = path.clone().into_os_string();
            gz.push(".gz");
            if let Opened::File(gfd, gmeta) = open_cached(w, std::path::Path::new(&gz), loc) {
                if gmeta.is_file {
                    // `gunzip on`: decompressed for a client that does not take gzip.
                    if loc.gzip.gunzip && !gzip_ok(loc, req) {
                        return gunzip_file(w, key, loc, req, keep_alive, head, &path, gfd, gmeta);
                    }
                    return send_file(w, key, loc, req, keep_alive, head, path, gfd, gmeta, true);
                }
            }
        }
        open_cached(w, &path, loc)
    };
    let (fd, meta) = match opened {
        Opened::File(fd, m) => (fd, m),
        Opened::Missing | Opened::Forbidden => {
            let status = if matches!(opened, Opened::Missing) {
                404
            } else {
                403
            };
            if status == 404 && loc.log_not_found {
                crate::log!(
                    Error,
                    "open() \"{}\" failed (2: No such file or directory){}",
                    path.display(),
                    w.log_context(key, Some(req))
                );
            }
            let reply = shard_http::response::error_simple(status);
            return simple(w, key, req, keep_alive, loc, head, reply);
        }
    };
    send_file(w, key, loc, req, keep_alive, head, path, fd, meta, false)
}

/// Whether `gzip_static` serves this request the `.gz` file: `always`, or `on` and the
/// client takes gzip as `gzip` would (HTTP version, `Via` and `gzip_proxied`, the header).
fn gzip_static_wanted(loc: &LocationConf, req: &Request) -> bool {
    match loc.gzip.static_mode {
        shard_config::GzipStatic::Off => false,
        shard_config::GzipStatic::Always => true,
        shard_config::GzipStatic::On => gzip_ok(loc, req),
    }
}

/// Whether the client takes gzip as `gzip` would send it (nginx's `ngx_http_gzip_ok`: the
/// HTTP version, `Via` and `gzip_proxied`, the header).
pub(super) fn gzip_ok(loc: &LocationConf, req: &Request) -> bool {
    let g = &loc.gzip;
    req.minor_version >= g.http_version_minor
        && (!req.via || gzip::proxied_allows(g, req, &gzip::ResponseTraits::STATIC))
        && req
            .accept_encoding
            .as_deref()
            .is_some_and(gzip::accepts_gzip)
}

/// The most bytes `gunzip` makes of one static file (in memory, as its response body):
/// past it the request fails (500) rather than hold an unbounded body.
const GUNZIP_STATIC_MAX_BYTES: u64 = 32 << 20;

/// `gzip_static` with `gunzip on` for a client that does not take gzip: `FILE.gz`
/// decompressed (every member), sent with `FILE`'s type and a `Vary` as `gzip_vary` says.
#[allow(clippy::too_many_arguments)]
fn gunzip_file(
    w: &mut Worker<'_>,
    key: usize,
    loc: &LocationConf,
    req: &Request,
    keep_alive: bool,
    head: &[u8],
    path: &Path,
    fd: super::files::FileRef,
    meta: FileMeta,
) -> Reply {
    use std::io::Read;
    let Some(raw) = read_whole(&fd, meta.size) else {
        return file_failed(w, key, loc, req, keep_alive, head, path);
    };
    drop(fd);
    let mut body = Vec::new();
    let res = flate2::read::MultiGzDecoder::new(&raw[..])
        .take(GUNZIP_STATIC_MAX_BYTES + 1)
        .read_to_end(&mut body);
    if res.is_err() || body.len() as u64 > GUNZIP_STATIC_MAX_BYTES {
        crate::log!(
            Error,
            "inflate() failed: \"{}.gz\" is not a gzip file of at most {} bytes{}",
            path.display(),
            GUNZIP_STATIC_MAX_BYTES,
            w.log_context(key, Some(req))
        );
        let reply = shard_http::response::error_simple(500);
        return simple(w, key, req, keep_alive, loc, head, reply);
    }
    let vary = loc.gzip.vary;
    in_memory_file(
        w, key, loc, req, keep_alive, head, path, &meta, body, vary, true,
    )
}

/// A static file whose body `sub_filter` changes: read whole (at most
/// `GUNZIP_STATIC_MAX_BYTES`), filtered, sent from memory; `Last-Modified` and `ETag` only
/// with `sub_filter_last_modified on` (the tag then weak), as nginx.
#[allow(clippy::too_many_arguments)]
fn transformed_file(
    w: &mut Worker<'_>,
    key: usize,
    loc: &LocationConf,
    req: &Request,
    keep_alive: bool,
    head: &[u8],
    path: &Path,
    fd: super::files::FileRef,
    meta: FileMeta,
) -> Reply {
    if meta.size > GUNZIP_STATIC_MAX_BYTES {
        crate::log!(
            Error,
            "\"{}\" is larger than the {} bytes a filtered file may take in memory{}",
            path.display(),
            GUNZIP_STATIC_MAX_BYTES,
            w.log_context(key, Some(req))
        );
        let reply = shard_http::response::error_simple(500);
        return simple(w, key, req, keep_alive, loc, head, reply);
    }
    let Some(mut raw) = read_whole(&fd, meta.size) else {
        return file_failed(w, key, loc, req, keep_alive, head, path);
    };
    drop(fd);
    let content_type = shard_http::static_file::content_type(loc, path).to_string();
    if let Some(t) = file_recode(loc, &content_type, false).as_deref() {
        super::conn::recode(&mut raw, t);
    }
    let body = match w.sub_filter_for(key, req, head, loc, &content_type) {
        Some(mut f) => {
            let mut out = Vec::with_capacity(raw.len());
            f.feed(&raw, &mut out);
            f.finish(&mut out);
            out
        }
        None => raw,
    };
    let validators = if loc.sub_filter.applies_to(&content_type) {
        loc.sub_filter.last_modified
    } else {
        loc.ssi.last_modified
    };
    in_memory_file(
        w, key, loc, req, keep_alive, head, path, &meta, body, false, validators,
    )
}

/// The recoding table a file's bytes go through: `charset` from `source_charset` by a
/// `charset_map`, for a type `charset_types` names, never for a file sent compressed.
fn file_recode(
    loc: &LocationConf,
    content_type: &str,
    encoded: bool,
) -> Option<std::sync::Arc<[u8; 256]>> {
    loc.recode
        .clone()
        .filter(|_| !encoded && shard_http::response::charset_for(loc, content_type).is_some())
}

/// The `Content-Type` an upstream's `X-Accel-Redirect` answer gave, which the response it
/// leads to keeps.
fn accel_content_type(w: &Worker<'_>, key: usize) -> Option<String> {
    let a = w.conns[key].rd().accel_headers.as_deref()?;
    a.split(|&b| b == b'\n').find_map(|line| {
        let (name, v) = line.split_at(line.iter().position(|&b| b == b':')?);
        name.eq_ignore_ascii_case(b"content-type")
            .then(|| String::from_utf8_lossy(&v[1..]).trim().to_string())
    })
}

/// The whole of a file (`None`: it could not be read, or shrank).
fn read_whole(fd: &super::files::FileRef, size: u64) -> Option<Vec<u8>> {
    let mut raw = vec![0u8; size as usize];
    let mut got = 0;
    while got < raw.len() {
        match shard_event::sock::pread(fd.as_raw_fd(), &mut raw[got..], got as u64) {
            Ok(0) => return None,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
    Some(raw)
}

/// A file that could not be read whole: 500, with nginx's words.
fn file_failed(
    w: &mut Worker<'_>,
    key: usize,
    loc: &LocationConf,
    req: &Request,
    keep_alive: bool,
    head: &[u8],
    path: &Path,
) -> Reply {
    crate::log!(Crit, "pread() \"{}\" failed (short read)", path.display());
    let reply = shard_http::response::error_simple(500);
    simple(w, key, req, keep_alive, loc, head, reply)
}

/// A file's response with `body` made in memory: `FILE`'s type, `Vary` when asked,
/// `Last-Modified` (and a weak `ETag`) when `validators`.
#[allow(clippy::too_many_arguments)]
fn in_memory_file(
    w: &mut Worker<'_>,
    key: usize,
    loc: &LocationConf,
    req: &Request,
    keep_alive: bool,
    head: &[u8],
    path: &Path,
    meta: &FileMeta,
    body: Vec<u8>,
    vary: bool,
    validators: bool,
) -> Reply {
    let content_type = shard_http::static_file::content_type(loc, path).to_string();
    let status = w.conns[key].rq().status_override.unwrap_or(200);
    let last_modified = validators.then(|| shard_http::http_date(meta.mtime_secs.max(0) as u64));
    let etag =
        (validators && loc.etag).then(|| gzip::weak_etag(&shard_http::static_file::etag(meta)));
    let (last_modified_field, etag_field) = file_validators(
        w,
        key,
        loc,
        status,
        last_modified.as_deref(),
        etag.as_deref(),
    );
    let extra = extra_headers(
        w,
        key,
        req,
        loc,
        head,
        status,
        Some(meta.mtime_secs),
        Some(&content_type),
    );
    let date = std::mem::take(&mut w.cx.date);
    let out = w.out_buf(key);
    write_head(
        out,
        &Head {
            status,
            date: &date,
            content_type: Some(&content_type),
            content_length: Some(body.len() as u64),
            keep_alive,
            last_modified: last_modified_field,
            etag: etag_field,
            vary: vary.then_some(gzip::VARY),
            server: shard_http::response::server_value(loc),
            extra: &extra,
            charset: shard_http::response::charset_for(loc, &content_type),
            ..Default::default()
        },
    );
    let sent = if req.method == Method::Head {
        0
    } else {
        out.extend_from_slice(&body);
        body.len() as u64
    };
    w.cx.date = date;
    Reply {
        status,
        body_bytes: sent,
        error_page: None,
        redirect: None,
    }
}

/// nginx's autoindex module: the listing of the directory `dir` (names starting with `.`
/// left out; a symbolic link shown as what it points to, or as itself when that is gone),
/// or 403 when it cannot be read.
fn autoindex(
    loc: &LocationConf,
    req: &Request,
    dir: &std::path::Path,
) -> shard_http::response::Simple {
    use shard_http::autoindex::{Entry, Format};
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::MetadataExt;
    let Ok(rd) = std::fs::read_dir(dir) else {
        return shard_http::response::error_simple(403);
    };
    let mut entries: Vec<Entry> = rd
        .flatten()
        .filter(|e| !e.file_name().as_bytes().starts_with(b"."))
        .filter_map(|e| {
            let p = e.path();
            let m = std::fs::metadata(&p)
                .or_else(|_| std::fs::symlink_metadata(&p))
                .ok()?;
            Some(Entry {
                name: e.file_name().as_bytes().to_vec(),
                dir: m.is_dir(),
                file: m.is_file(),
                size: m.len(),
                mtime: m.mtime(),
            })
        })
        .collect();
    shard_http::autoindex::sort(&mut entries);
    let a = loc.autoindex;
    let (format, content_type) = match a.format {
        Some(shard_config::AutoindexFormat::Json) => (Format::Json, "application/json"),
        Some(shard_config::AutoindexFormat::Jsonp) => (Format::Json, "application/javascript"),
        Some(shard_config::AutoindexFormat::Xml) => (Format::Xml, "text/xml; charset=utf-8"),
        _ => (Format::Html, "text/html"),
    };
    let utf8 = shard_http::response::charset_for(loc, "text/html")
        .is_some_and(|c| c.eq_ignore_ascii_case("utf-8"));
    let mut body = shard_http::autoindex::render(
        format,
        &req.path,
        &entries,
        utf8,
        a.exact_size.unwrap_or(true),
    );
    // nginx's jsonp: the `callback` argument names the function; without one, plain JSON.
    let cb = req
        .query
        .as_deref()
        .and_then(|q| q.split('&').find_map(|kv| kv.strip_prefix("callback=")))
        .filter(|cb| !cb.is_empty());
    let mut content_type = content_type;
    if a.format == Some(shard_config::AutoindexFormat::Jsonp) {
        match cb {
            Some(cb) => body = format!("/* callback */\r\n{cb}({body});"),
            None => content_type = "application/json",
        }
    }
    shard_http::response::Simple {
        status: 200,
        content_type: Some(content_type.to_string()),
        location: None,
        body: body.into_bytes(),
    }
}

/// An internal redirect to `uri` (the request's arguments kept): the caller searches the
/// location anew, as nginx's index module redirects to the index file it found.
fn internal_redirect(uri: String) -> Reply {
    Reply {
        status: 0,
        body_bytes: 0,
        error_page: None,
        redirect: Some(uri),
    }
}

/// A file's own `Last-Modified` and `ETag` for a response with `status`, less those an
/// `add_header ETag ...` or `add_header Last-Modified ...` (the location's, or the request's
/// `if`'s) sets instead: nginx's header filter puts the added value in place of the file's
/// field, and an empty one removes it. Every head of a file goes through here.
fn file_validators<'v>(
    w: &Worker<'_>,
    key: usize,
    loc: &LocationConf,
    status: u16,
    last_modified: Option<&'v str>,
    etag: Option<&'v str>,
) -> (Option<&'v str>, Option<&'v str>) {
    let list = w.conns[key]
        .rd()
        .if_headers
        .as_deref()
        .unwrap_or(&loc.add_headers);
    let applies = shard_http::response::headers_apply(status);
    let added = |name: &str| {
        list.iter()
            .any(|h| h.name.eq_ignore_ascii_case(name) && (h.always || applies))
    };
    (
        last_modified.filter(|_| !added("last-modified")),
        etag.filter(|_| !added("etag")),
    )
}

/// The response for the open file at `path`: its head, and its body, ranges or 304 as the
/// request asks. `encoded`: `fd` is `path`'s `.gz` (`gzip_static`), sent with
/// `Content-Encoding: gzip` and `path`'s type.
#[allow(clippy::too_many_arguments)]
fn send_file(
    w: &mut Worker<'_>,
    key: usize,
    loc: &LocationConf,
    req: &Request,
    keep_alive: bool,
    head: &[u8],
    path: std::path::PathBuf,
    fd: super::files::FileRef,
    meta: FileMeta,
    encoded: bool,
) -> Reply {
    // After an `X-Accel-Redirect`, the upstream's type stays (nginx sets a type only where
    // none is).
    let content_type = accel_content_type(w, key)
        .unwrap_or_else(|| shard_http::static_file::content_type(loc, &path).to_string());
    // `max_ranges`: more ranges than it allows (any, for 0) and the file is sent whole, as
    // nginx's range filter declines them.
    let ranges_off = loc.max_ranges == Some(0);
    let unranged;
    // Only the ranges the file can satisfy count, as nginx's range parser counts them.
    let satisfiable = |r: &str| match shard_http::static_file::ranges(r, meta.size) {
        Some(Ok(parts)) => parts.len(),
        _ => 0,
    };
    let req = match (loc.max_ranges, req.range.as_deref()) {
        (Some(max), Some(r)) if satisfiable(r) as u64 > u64::from(max) => {
            unranged = Request {
                range: None,
                ..req.clone()
            };
            &unranged
        }
        _ => req,
    };
    let recoded = file_recode(loc, &content_type, encoded);
    // `flv` with `start=N`: the body is the FLV header and the file from N, and its length,
    // ranges and `ETag` are that body's, as nginx's flv module answers.
    let flv = if loc.flv && !encoded {
        shard_http::static_file::flv_start(req.query.as_deref(), meta.size)
    } else {
        None
    };
    let body_meta = match flv {
        Some(start) => FileMeta {
            size: shard_http::static_file::FLV_HEADER.len() as u64 + meta.size - start,
            ..meta
        },
        None => meta,
    };
    match shard_http::static_file::plan_full(req, &body_meta, loc.if_modified_since, loc.etag) {
        Plan::Send {
            mut status,
            offset,
            len,
            headers,
        } => {
            if let Some(code) = w.conns[key].rq().status_override.filter(|_| status == 200) {
                status = code;
            }
            if status == 416
                && !gzip::decide(&loc.gzip, req, 200, Some(&content_type), meta.size).compress
            {
                // nginx's range filter: the 416 page, with `Content-Range: bytes */SIZE`.
                drop(fd);
                let body = shard_http::response::error_body(416);
                let mut extra = extra_headers(w, key, req, loc, head, 416, None, Some("text/html"));
                if let Some(cr) = headers.content_range.as_deref() {
                    extra.extend_from_slice(b"Content-Range: ");
                    extra.extend_from_slice(cr.as_bytes());
                    extra.extend_from_slice(b"\r\n");
                }
                let date = std::mem::take(&mut w.cx.date);
                let out = w.out_buf(key);
                write_head(
                    out,
                    &Head {
                        status: 416,
                        date: &date,
                        content_type: Some("text/html"),
                        content_length: Some(body.len() as u64),
                        keep_alive,
                        server: shard_http::response::server_value(loc),
                        extra: &extra,
                        charset: shard_http::response::charset_for(loc, "text/html"),
                        ..Default::default()
                    },
                );
                let sent = if req.method == Method::Head {
                    0
                } else {
                    out.extend_from_slice(body);
                    body.len() as u64
                };
                w.cx.date = date;
                return Reply {
                    status: 416,
                    body_bytes: sent,
                    error_page: None,
                    redirect: None,
                };
            }
            // `ssi`: the file read whole (no ranges) and processed as it is written.
            if !encoded
                && flv.is_none()
                && meta.size > 0
                && super::ssi::may_filter(loc)
                && w.filter_begin(key, req, head, loc, Some(&content_type), 200)
            {
                return transformed_file(w, key, loc, req, keep_alive, head, &path, fd, meta);
            }
            // `sub_filter`: the file read and filtered in memory (whole: no ranges), as
            // `gunzip` does.
            if !encoded
                && flv.is_none()
                && loc.sub_filter.applies_to(&content_type)
                && meta.size > 0
            {
                return transformed_file(w, key, loc, req, keep_alive, head, &path, fd, meta);
            }
            // gzip sees the full file as a 200: a compressed answer ignores `Range`.
            let g = if encoded {
                // Already compressed: only `Vary`, as nginx's gzip_static with `gzip_vary`.
                gzip::Decision {
                    vary: loc.gzip.vary,
                    compress: false,
                }
            } else if matches!(status, 200 | 206 | 416) && flv.is_none() {
                gzip::decide(&loc.gzip, req, 200, Some(&content_type), meta.size)
            } else {
                gzip::Decision::default()
            };
            if g.compress {
                return gzip_file(
                    w,
                    key,
                    loc,
                    req,
                    keep_alive,
                    head,
                    fd,
                    &path,
                    &meta,
                    &content_type,
                    g,
                );
            }
            let extra = extra_headers(
                w,
                key,
                req,
                loc,
                head,
                status,
                Some(meta.mtime_secs),
                Some(&content_type),
            );
            let (last_modified, etag) = file_validators(
                w,
                key,
                loc,
                status,
                headers.last_modified.as_deref(),
                headers.etag.as_deref(),
            );
            let date = std::mem::take(&mut w.cx.date);
            let out = w.out_buf(key);
            write_head(
                out,
                &Head {
                    status,
                    date: &date,
                    content_type: Some(&content_type),
                    content_length: Some(len),
                    keep_alive,
                    last_modified,
                    etag,
                    accept_ranges: !ranges_off,
                    content_range: headers.content_range.as_deref(),
                    vary: g.vary.then_some(gzip::VARY),
                    content_encoding: encoded.then_some(gzip::ENCODING),
                    server: shard_http::response::server_value(loc),
                    extra: &extra,
                    charset: shard_http::response::charset_for(loc, &content_type),
                    ..Default::default()
                },
            );
            w.cx.date = date;
            if req.method == Method::Head {
                return Reply {
                    status,
                    body_bytes: 0,
                    error_page: None,
                    redirect: None,
                };
            }
            let (offset, file_len) = match flv {
                Some(start) => {
                    // The header's part of the range goes with the head.
                    let mut pre = [0u8; 13];
                    let room = (len as usize).min(pre.len());
                    let (n, at) =
                        shard_http::static_file::flv_split(&mut pre[..room], offset, start);
                    w.out_buf(key).extend_from_slice(&pre[..n]);
                    (at, len - n as u64)
                }
                None => (offset, len),
            };
            if file_len > 0 || flv.is_none() {
                w.set_file_body(key, fd, offset, file_len, loc.sendfile, meta.size, recoded);
            }
            Reply {
                status,
                body_bytes: len,
                error_page: None,
                redirect: None,
            }
        }
        Plan::Multipart {
            ranges,
            size,
            headers,
        } => {
            let g = gzip::decide(&loc.gzip, req, 200, Some(&content_type), meta.size);
            if g.compress && flv.is_none() {
                return gzip_file(
                    w,
                    key,
                    loc,
                    req,
                    keep_alive,
                    head,
                    fd,
                    &path,
                    &meta,
                    &content_type,
                    g,
                );
            }
            let ct = match shard_http::response::charset_for(loc, &content_type) {
                Some(cs) => format!("{content_type}; charset={cs}"),
                None => content_type.clone(),
            };
            let mut body = Vec::new();
            for &(a, b) in &ranges {
                shard_http::static_file::part_head(&mut body, &ct, a, b, size);
                let want = (b - a + 1) as usize;
                let start = body.len();
                body.resize(start + want, 0);
                // `flv`: the header's bytes first, the file's from its offset.
                let (mut got, file_at) = match flv {
                    Some(s) => shard_http::static_file::flv_split(&mut body[start..], a, s),
                    None => (0, a),
                };
                let file_from = got;
                while got < want {
                    match shard_event::sock::pread(
                        fd.as_raw_fd(),
                        &mut body[start + got..],
                        file_at + (got - file_from) as u64,
                    ) {
                        Ok(0) => break,
                        Ok(n) => got += n,
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                        Err(_) => break,
                    }
                }
                if let Some(t) = recoded.as_deref() {
                    super::conn::recode(&mut body[start..start + got], t);
                }
                if got < want {
                    // The file shrank under us: as a failed read of a file, a 500.
                    crate::log!(Crit, "pread() \"{}\" failed (short read)", path.display());
                    let reply = shard_http::response::error_simple(500);
                    return simple(w, key, req, keep_alive, loc, head, reply);
                }
            }
            shard_http::static_file::part_end(&mut body);
            let boundary_type = format!(
                "multipart/byteranges; boundary={}",
                shard_http::static_file::BOUNDARY
            );
            let extra = extra_headers(
                w,
                key,
                req,
                loc,
                head,
                206,
                Some(meta.mtime_secs),
                Some(&boundary_type),
            );
            let (last_modified, etag) = file_validators(
                w,
                key,
                loc,
                206,
                headers.last_modified.as_deref(),
                headers.etag.as_deref(),
            );
            let date = std::mem::take(&mut w.cx.date);
            let out = w.out_buf(key);
            write_head(
                out,
                &Head {
                    status: 206,
                    date: &date,
                    content_type: Some(&boundary_type),
                    content_length: Some(body.len() as u64),
                    keep_alive,
                    last_modified,
                    etag,
                    accept_ranges: true,
                    vary: g.vary.then_some(gzip::VARY),
                    server: shard_http::response::server_value(loc),
                    extra: &extra,
                    ..Default::default()
                },
            );
            let sent = if req.method == Method::Head {
                0
            } else {
                out.extend_from_slice(&body);
                body.len() as u64
            };
            w.cx.date = date;
            Reply {
                status: 206,
                body_bytes: sent,
                error_page: None,
                redirect: None,
            }
        }
        Plan::Reply(s) => {
            drop(fd);
            simple(w, key, req, keep_alive, loc, head, s)
        }
    }
}

/// A whole file, read with `pread` and gzipped in memory (at most
/// [`gzip::GZIP_MAX_FILE_BYTES`] of input), sent as a 200 with the compressed length.
#[allow(clippy::too_many_arguments)]
fn gzip_file(
    w: &mut Worker<'_>,
    key: usize,
    loc: &LocationConf,
    req: &Request,
    keep_alive: bool,
    head: &[u8],
    fd: super::files::FileRef,
    path: &Path,
    meta: &FileMeta,
    content_type: &str,
    g: gzip::Decision,
) -> Reply {
    let body = gzip::compress_with(loc.gzip.comp_level, meta.size, |buf, off| {
        shard_event::sock::pread(fd.as_raw_fd(), buf, off)
    });
    drop(fd);
    let body = match body {
        Ok(b) => b,
        Err(e) => {
            crate::log!(
                Crit,
                "pread() \"{}\" failed ({})",
                path.display(),
                shard_event::os_error_text(&e)
            );
            let reply = shard_http::response::error_simple(500);
            return simple(w, key, req, keep_alive, loc, head, reply);
        }
    };
    let etag = gzip::weak_etag(&shard_http::static_file::etag(meta));
    let last_modified = shard_http::http_date(meta.mtime_secs.max(0) as u64);
    let (last_modified_field, etag_field) =
        file_validators(w, key, loc, 200, Some(&last_modified), Some(&etag));
    let extra = extra_headers(
        w,
        key,
        req,
        loc,
        head,
        200,
        Some(meta.mtime_secs),
        Some(content_type),
    );
    let date = std::mem::take(&mut w.cx.date);
    let out = w.out_buf(key);
    write_head(
        out,
        &Head {
            status: 200,
            date: &date,
            content_type: Some(content_type),
            content_length: Some(body.len() as u64),
            keep_alive,
            last_modified: last_modified_field,
            etag: etag_field,
            content_encoding: Some(gzip::ENCODING),
            vary: g.vary.then_some(gzip::VARY),
            server: shard_http::response::server_value(loc),
            extra: &extra,
            charset: shard_http::response::charset_for(loc, content_type),
            ..Default::default()
        },
    );
    // A HEAD gets the head a GET gets (compressed length, `Vary`), without the body.
    let sent = if req.method == Method::Head {
        0
    } else {
        out.extend_from_slice(&body);
        body.len() as u64
    };
    w.cx.date = date;
    Reply {
        status: 200,
        body_bytes: sent,
        error_page: None,
        redirect: None,
    }
}
