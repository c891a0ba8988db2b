//! Static files: mapping a URI to a filesystem path and deciding what to send for a file.
//!
//! This module owns `root`/`alias` mapping, index candidates, MIME types, validators
//! (`Last-Modified`, nginx-style `ETag`), conditional requests (`If-None-Match`, nginx's exact
//! `If-Modified-Since`), byte ranges (one, or several as `multipart/byteranges`), the redirect of a directory requested without its
//! trailing slash, and the 405 for methods other than GET and HEAD. It performs no I/O: the
//! caller opens and `fstat`s the file, passes a [`FileMeta`], and sends the bytes a [`Plan`]
//! names.

use shard_config::IfModifiedSince;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use shard_config::LocationConf;

use crate::request::{Method, Request};
use crate::response::{error_body, error_simple, Simple};

/// What nginx's flv module sends before the file when a request starts it at `start=N`:
/// an FLV header (audio and video) and an empty first tag size.
pub const FLV_HEADER: &[u8; 13] = b"FLV\x01\x05\x00\x00\x00\x09\x00\x00\x00\x00";

/// `flv`: where a request's `start=N` argument starts the file, as nginx's flv module reads
/// it (digits only; 0, a bad number or one past the file's last byte: the whole file).
pub fn flv_start(query: Option<&str>, size: u64) -> Option<u64> {
    let v = crate::vars::arg(query?, "start")?;
    if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = v.parse().ok()?;
    (n > 0 && n < size).then_some(n)
}

/// Bytes `pos..pos + out.len()` of a flv body started at `start` (the header, then the
/// file from `start`) that come from the header: copied into `out`. Returns how many, and
/// the file offset the rest begins at.
pub fn flv_split(out: &mut [u8], pos: u64, start: u64) -> (usize, u64) {
    let head = FLV_HEADER.len() as u64;
    if pos >= head {
        return (0, start + pos - head);
    }
    let n = ((head - pos) as usize).min(out.len());
    out[..n].copy_from_slice(&FLV_HEADER[pos as usize..pos as usize + n]);
    (n, start)
}

/// What `fstat` said about an opened path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileMeta {
    pub size: u64,
    pub mtime_secs: i64,
    pub is_dir: bool,
    pub is_file: bool,
}

/// Headers a file response carries beyond the common ones.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StaticHeaders {
    pub last_modified: Option<crate::InlineStr>,
    pub etag: Option<crate::InlineStr>,
    pub content_range: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// Send `len` bytes of the file from `offset` after a head with `status` (200, 206; also
    /// 304 and 416 with `len == 0`, which carry validators or `Content-Range` and no body).
    Send {
        status: u16,
        offset: u64,
        len: u64,
        headers: StaticHeaders,
    },
    /// Answer with an in-memory response instead of the file (redirect, 404, 405).
    Reply(Simple),
    /// A 206 `multipart/byteranges` of these ranges (inclusive) of a file of `size` bytes.
    Multipart {
        ranges: Vec<(u64, u64)>,
        size: u64,
        headers: StaticHeaders,
    },
}

/// The filesystem path for the normalized URI `path`: `root` + path, or with `alias`, the
/// location's prefix replaced by the alias (plain string replacement, as nginx).
pub fn map_path(loc: &LocationConf, path: &str) -> PathBuf {
    map_path_with(loc, path, None)
}

/// [`map_path`] with the root (or alias) a template with variables gave for this request.
/// In a regex location an alias is the whole path (it refers to the location's captures), as
/// nginx.
pub fn map_path_with(loc: &LocationConf, path: &str, doc_root: Option<&Path>) -> PathBuf {
    let mut s: OsString;
    match (&loc.alias, doc_root) {
        (Some(alias), _)
            if loc.kind == shard_config::LocationKind::Regex && loc.alias_from.is_none() =>
        {
            return doc_root.unwrap_or(alias).to_path_buf();
        }
        (Some(alias), _) => {
            let prefix = loc.alias_from.as_deref().unwrap_or(loc.path.as_str());
            let rest = path.strip_prefix(prefix).unwrap_or(path);
            s = doc_root.unwrap_or(alias).as_os_str().to_owned();
            s.push(rest);
        }
        (None, _) => {
            s = doc_root.unwrap_or(&loc.root).as_os_str().to_owned();
            s.push(path);
        }
    }
    PathBuf::from(s)
}

/// The file a `try_files` entry `uri` names: as [`map_path_with`], except that a regex
/// location's own `alias` is a directory the whole URI is appended to (nginx's `try_files`
/// strips no prefix there), rather than the file itself.
pub fn map_try_path_with(loc: &LocationConf, uri: &str, doc_root: Option<&Path>) -> PathBuf {
    match &loc.alias {
        Some(alias)
            if loc.kind == shard_config::LocationKind::Regex && loc.alias_from.is_none() =>
        {
            let mut s = doc_root.unwrap_or(alias).as_os_str().to_owned();
            s.push(uri);
            PathBuf::from(s)
        }
        _ => map_path_with(loc, uri, doc_root),
    }
}

/// The MIME type for `path` by its (case-insensitive) extension, else `default_type`.
pub fn content_type<'a>(loc: &'a LocationConf, path: &Path) -> &'a str {
    let Some(ext) = path.extension().and_then(|e| e.to_str()) else {
        return &loc.default_type;
    };
    if let Some(t) = loc.types.get(ext) {
        return t;
    }
    if ext.bytes().any(|b| b.is_ascii_uppercase()) {
        if let Some(t) = loc.types.get(&ext.to_ascii_lowercase()) {
            return t;
        }
    }
    &loc.default_type
}

/// The files to try, in order, for the directory `dir` (a path from [`map_path`] ending in
/// `/`). An index starting with `/` is taken from the location's root.
pub fn index_candidates(loc: &LocationConf, dir: &Path) -> std::vec::IntoIter<PathBuf> {
    index_candidates_of(loc, &loc.index, dir)
}

/// [`index_candidates`] of `names` (the location's `index`, rendered when it has variables).
pub fn index_candidates_of(
    loc: &LocationConf,
    names: &[String],
    dir: &Path,
) -> std::vec::IntoIter<PathBuf> {
    names
        .iter()
        .filter(|i| !i.is_empty())
        .map(|i| {
            if i.starts_with('/') {
                let mut s = loc.root.as_os_str().to_owned();
                s.push(i);
                PathBuf::from(s)
            } else {
                dir.join(i)
            }
        })
        .collect::<Vec<_>>()
        .into_iter()
}

/// nginx's ETag: `"<mtime hex>-<size hex>"`.
pub fn etag(meta: &FileMeta) -> String {
    etag_inline(meta).as_str().to_string()
}

/// [`etag`] without an allocation (once per static response).
pub fn etag_inline(meta: &FileMeta) -> crate::InlineStr {
    // nginx's `"%xT-%xO"`.
    let mut e = crate::InlineStr::new();
    e.push_bytes(b"\"");
    push_hex(&mut e, meta.mtime_secs.max(0) as u64);
    e.push_bytes(b"-");
    push_hex(&mut e, meta.size);
    e.push_bytes(b"\"");
    e
}

fn etag_matches(list: &str, etag: &str) -> bool {
    let strip = |t: &str| t.strip_prefix("W/").unwrap_or(t).to_string();
    let ours = strip(etag);
    list.split(',')
        .map(str::trim)
        .any(|t| t == "*" || strip(t) == ours)
}

/// nginx's preconditions that fail with 412: `If-Unmodified-Since` earlier than the file's
/// time (or not a date), `If-Match` naming none of its (strong) entity tags.
fn precondition_failed(req: &Request, meta: &FileMeta, etag: &str) -> bool {
    if let Some(iums) = &req.if_unmodified_since {
        let ok = httpdate::parse_http_date(iums)
            .ok()
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .is_some_and(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX) >= meta.mtime_secs);
        if !ok {
            return true;
        }
    }
    if let Some(im) = &req.if_match {
        let ok = im.trim() == "*" || im.split(',').map(str::trim).any(|t| t == etag);
        if !ok {
            return true;
        }
    }
    false
}

/// nginx's not-modified filter: with both headers, both must say "not modified";
/// `If-Modified-Since` as `if_modified_since` says (`off`: it never does).
fn not_modified(req: &Request, meta: &FileMeta, etag: &str, ims_mode: IfModifiedSince) -> bool {
    if req.if_none_match.is_none() && req.if_modified_since.is_none() {
        return false;
    }
    if let Some(ims) = &req.if_modified_since {
        let unchanged = ims_mode != IfModifiedSince::Off
            && httpdate::parse_http_date(ims)
                .ok()
                .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
                .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
                .is_some_and(|secs| {
                    secs == meta.mtime_secs
                        || (ims_mode == IfModifiedSince::Before && secs >= meta.mtime_secs)
                });
        if !unchanged {
            return false;
        }
    }
    req.if_none_match
        .as_deref()
        .is_none_or(|inm| etag_matches(inm, etag))
}

/// A byte range decision: `None` ignores the header (send the whole file).
enum RangeResult {
    /// One or more satisfiable ranges, inclusive, in the order asked.
    Satisfiable(Vec<(u64, u64)>),
    Unsatisfiable,
}

/// The most ranges one request may ask for (beyond, the whole file is sent).
pub const MAX_RANGES: usize = 64;

/// The most bytes a multi-range response carries (it is built in memory); beyond, the whole
/// file is sent with 200.
pub const MULTIPART_MAX_BYTES: u64 = 4 << 20;

fn number(s: &str) -> Option<u64> {
    let s = s.trim();
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// nginx's range parsing: another unit ignores the header; a malformed range is 416; ranges
/// that cannot be satisfied are dropped, and none left is 416; ranges whose lengths add up to
/// more than the file (or too many) send the whole file.
fn parse_range(h: &str, size: u64) -> Option<RangeResult> {
    let h = h.trim();
    if h.len() < 6 || !h.as_bytes()[..6].eq_ignore_ascii_case(b"bytes=") {
        return None;
    }
    let bad = Some(RangeResult::Unsatisfiable);
    let mut ranges = Vec::new();
    let mut total: u64 = 0;
    for spec in h[6..].split(',') {
        let Some((a, b)) = spec.split_once('-') else {
            return bad;
        };
        let r = if a.trim().is_empty() {
            match number(b) {
                Some(n) if n > 0 && size > 0 => Some((size.saturating_sub(n), size - 1)),
                Some(_) => None,
                None => return bad,
            }
        } else {
            let Some(start) = number(a) else {
                return bad;
            };
            let end = if b.trim().is_empty() {
                u64::MAX
            } else {
                match number(b) {
                    Some(e) => e,
                    None => return bad,
                }
            };
            if start > end {
                return bad;
            }
            (start < size).then(|| (start, end.min(size - 1)))
        };
        if let Some((x, y)) = r {
            total = total.saturating_add(y - x + 1);
            ranges.push((x, y));
        }
    }
    if ranges.is_empty() {
        return Some(RangeResult::Unsatisfiable);
    }
    if ranges.len() > MAX_RANGES || (ranges.len() > 1 && total > size) {
        return None;
    }
    Some(RangeResult::Satisfiable(ranges))
}

/// `Range` against a body of `size` bytes, as [`plan`] judges it for a file: `None` sends
/// the whole body, `Some(Err(()))` is a 416, `Some(Ok(ranges))` the parts (inclusive).
pub fn ranges(h: &str, size: u64) -> Option<Result<Vec<(u64, u64)>, ()>> {
    match parse_range(h, size)? {
        RangeResult::Satisfiable(r) => Some(Ok(r)),
        RangeResult::Unsatisfiable => Some(Err(())),
    }
}

/// The boundary of a `multipart/byteranges` response (nginx numbers its own; any token that
/// cannot occur in the parts' headers will do).
pub const BOUNDARY: &str = "00000000000000000001";

/// The head of part `(a, b)` of a multipart response, and the closing delimiter.
pub fn part_head(out: &mut Vec<u8>, content_type: &str, a: u64, b: u64, size: u64) {
    use std::io::Write;
    let _ = write!(
        out,
        "\r\n--{BOUNDARY}\r\nContent-Type: {content_type}\r\nContent-Range: bytes {a}-{b}/{size}\r\n\r\n"
    );
}

pub fn part_end(out: &mut Vec<u8>) {
    out.extend_from_slice(b"\r\n--");
    out.extend_from_slice(BOUNDARY.as_bytes());
    out.extend_from_slice(b"--\r\n");
}

/// Escapes a path for a `Location` header.
pub fn escape_uri(path: &str, out: &mut String) {
    percent_escape(path.as_bytes(), out, |b| {
        b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=:@/".contains(&b)
    });
}

/// Appends `bytes` to `out`, every byte `keep` refuses as `%XX` (upper-case hex, as nginx's
/// `ngx_escape_uri`).
pub fn percent_escape(bytes: &[u8], out: &mut String, keep: impl Fn(u8) -> bool) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    for &b in bytes {
        if keep(b) {
            out.push(b as char);
        } else {
            out.push('%');
            out.push(HEX[usize::from(b >> 4)] as char);
            out.push(HEX[usize::from(b & 15)] as char);
        }
    }
}

/// Decides the response for the opened `meta` of `req.path`.
pub fn plan(req: &Request, meta: &FileMeta) -> Plan {
    plan_with(req, meta, IfModifiedSince::Exact)
}

/// [`plan`] under the location's `if_modified_since`.
pub fn plan_with(req: &Request, meta: &FileMeta, ims_mode: IfModifiedSince) -> Plan {
    plan_full(req, meta, ims_mode, true)
}

/// [`plan_with`] and the location's `etag`: off, no `ETag` is sent, and as in nginx an
/// `If-Match` other than `*` fails (412) and `If-None-Match` never gives a 304.
pub fn plan_full(req: &Request, meta: &FileMeta, ims_mode: IfModifiedSince, etag_on: bool) -> Plan {
    if !matches!(req.method, Method::Get | Method::Head) {
        return Plan::Reply(error_simple(405));
    }
    if meta.is_dir {
        let mut location = String::with_capacity(req.path.len() + 1);
        escape_uri(&req.path, &mut location);
        if !location.ends_with('/') {
            location.push('/');
        }
        if let Some(q) = &req.query {
            location.push('?');
            location.push_str(q);
        }
        return Plan::Reply(Simple {
            status: 301,
            content_type: Some("text/html".to_string()),
            location: Some(location),
            body: error_body(301).to_vec(),
        });
    }
    if !meta.is_file {
        return Plan::Reply(error_simple(404));
    }
    // No tag matches nothing: `etag off` compares with a value no list holds.
    let etag = if etag_on {
        etag_inline(meta)
    } else {
        crate::InlineStr::from("\u{0}")
    };
    let sent = etag_on.then_some(etag);
    let last_modified = crate::http_date_inline(meta.mtime_secs.max(0) as u64);
    if precondition_failed(req, meta, &etag) {
        return Plan::Reply(error_simple(412));
    }
    if not_modified(req, meta, &etag, ims_mode) {
        return Plan::Send {
            status: 304,
            offset: 0,
            len: 0,
            headers: StaticHeaders {
                last_modified: Some(last_modified),
                etag: sent,
                content_range: None,
            },
        };
    }
    // `If-Range`: the range holds only when the date is the file's `Last-Modified` or the
    // tag its strong `ETag`, as nginx's range filter judges it; else the whole file.
    let if_range_ok = req.if_range.as_deref().is_none_or(|v| {
        let v = v.trim();
        match httpdate::parse_http_date(v) {
            Ok(t) => t
                .duration_since(std::time::UNIX_EPOCH)
                .is_ok_and(|d| d.as_secs() as i64 == meta.mtime_secs),
            Err(_) => etag_on && !v.starts_with("W/") && v == etag.as_str(),
        }
    });
    let range = req
        .range
        .as_deref()
        .filter(|_| if_range_ok)
        .and_then(|r| parse_range(r, meta.size));
    let headers = StaticHeaders {
        last_modified: Some(last_modified),
        etag: sent,
        content_range: None,
    };
    match range {
        None => Plan::Send {
            status: 200,
            offset: 0,
            len: meta.size,
            headers,
        },
        Some(RangeResult::Satisfiable(r)) if r.len() == 1 => {
            let (a, b) = r[0];
            Plan::Send {
                status: 206,
                offset: a,
                len: b - a + 1,
                headers: StaticHeaders {
                    content_range: Some(format!("bytes {a}-{b}/{}", meta.size)),
                    ..headers
                },
            }
        }
        Some(RangeResult::Satisfiable(r)) => {
            let total: u64 = r.iter().map(|(a, b)| b - a + 1).sum();
            if total > MULTIPART_MAX_BYTES {
                Plan::Send {
                    status: 200,
                    offset: 0,
                    len: meta.size,
                    headers,
                }
            } else {
                Plan::Multipart {
                    ranges: r,
                    size: meta.size,
                    headers,
                }
            }
        }
        Some(RangeResult::Unsatisfiable) => Plan::Send {
            status: 416,
            offset: 0,
            len: 0,
            headers: StaticHeaders {
                last_modified: None,
                etag: None,
                content_range: Some(format!("bytes */{}", meta.size)),
            },
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::{parse, Limits, Parse};
    use crate::route::tests::loc;
    use shard_config::LocationKind;

    fn req(extra: &str) -> Request {
        req_m("GET", "/a.txt", extra)
    }

    fn req_m(method: &str, path: &str, extra: &str) -> Request {
        let raw = format!("{method} {path} HTTP/1.1\r\nHost: x\r\n{extra}\r\n");
        match parse(raw.as_bytes(), &Limits::default()) {
            Parse::Complete { req, .. } => req,
            other => panic!("{other:?}"),
        }
    }

    const MTIME: i64 = 784_111_777;

    fn file(size: u64) -> FileMeta {
        FileMeta {
            size,
            mtime_secs: MTIME,
            is_dir: false,
            is_file: true,
        }
    }

    fn status(p: &Plan) -> u16 {
        match p {
            Plan::Send { status, .. } => *status,
            Plan::Reply(s) => s.status,
            Plan::Multipart { .. } => 206,
        }
    }

    #[test]
    fn full_file() {
        let p = plan(&req(""), &file(10));
        assert_eq!(
            p,
            Plan::Send {
                status: 200,
                offset: 0,
                len: 10,
                headers: StaticHeaders {
                    last_modified: Some("Sun, 06 Nov 1994 08:49:37 GMT".into()),
                    etag: Some("\"2ebc98a1-a\"".into()),
                    content_range: None,
                },
            }
        );
    }

    #[test]
    fn conditionals() {
        let lm = "Sun, 06 Nov 1994 08:49:37 GMT";
        let tag = "\"2ebc98a1-a\"";
        assert_eq!(
            status(&plan(&req(&format!("If-None-Match: {tag}\r\n")), &file(10))),
            304
        );
        assert_eq!(
            status(&plan(
                &req(&format!("If-None-Match: \"x\", W/{tag}\r\n")),
                &file(10)
            )),
            304
        );
        assert_eq!(status(&plan(&req("If-None-Match: *\r\n"), &file(10))), 304);
        assert_eq!(
            status(&plan(&req("If-None-Match: \"other\"\r\n"), &file(10))),
            200
        );
        assert_eq!(
            status(&plan(
                &req(&format!("If-Modified-Since: {lm}\r\n")),
                &file(10)
            )),
            304
        );
        assert_eq!(
            status(&plan(
                &req("If-Modified-Since: Mon, 01 Jan 2001 00:00:00 GMT\r\n"),
                &file(10)
            )),
            200,
            "nginx compares exactly"
        );
        assert_eq!(
            status(&plan(&req("If-Modified-Since: garbage\r\n"), &file(10))),
            200
        );
        assert_eq!(
            status(&plan(
                &req(&format!(
                    "If-None-Match: \"other\"\r\nIf-Modified-Since: {lm}\r\n"
                )),
                &file(10)
            )),
            200,
            "If-None-Match takes precedence"
        );
        let Plan::Send { len, headers, .. } =
            plan(&req(&format!("If-None-Match: {tag}\r\n")), &file(10))
        else {
            panic!()
        };
        assert_eq!((len, headers.etag.as_deref()), (0, Some(tag)));
    }

    fn range(r: &str, size: u64) -> (u16, u64, u64, Option<String>) {
        match plan(&req(&format!("Range: {r}\r\n")), &file(size)) {
            Plan::Send {
                status,
                offset,
                len,
                headers,
            } => (status, offset, len, headers.content_range),
            Plan::Reply(s) => (s.status, 0, 0, None),
            Plan::Multipart { ranges, .. } => (206, 0, ranges.len() as u64, None),
        }
    }

    #[test]
    fn if_range_keeps_the_range_only_for_the_files_own_validators() {
        let f = file(10);
        let tag = etag(&f);
        let date = crate::http_date(f.mtime_secs as u64);
        let st = |extra: &str| status(&plan(&req(extra), &f));
        assert_eq!(st("Range: bytes=0-1\r\n"), 206);
        assert_eq!(st(&format!("Range: bytes=0-1\r\nIf-Range: {tag}\r\n")), 206);
        assert_eq!(
            st(&format!("Range: bytes=0-1\r\nIf-Range: {date}\r\n")),
            206
        );
        assert_eq!(st("Range: bytes=0-1\r\nIf-Range: wrong\r\n"), 200);
        assert_eq!(
            st(&format!("Range: bytes=0-1\r\nIf-Range: W/{tag}\r\n")),
            200
        );
        assert_eq!(
            st("Range: bytes=0-1\r\nIf-Range: Mon, 28 Sep 1970 06:00:00 GMT\r\n"),
            200
        );
    }

    #[test]
    fn ranges() {
        assert_eq!(
            range("bytes=2-4", 10),
            (206, 2, 3, Some("bytes 2-4/10".into()))
        );
        assert_eq!(
            range("bytes=-3", 10),
            (206, 7, 3, Some("bytes 7-9/10".into()))
        );
        assert_eq!(
            range("bytes=7-", 10),
            (206, 7, 3, Some("bytes 7-9/10".into()))
        );
        assert_eq!(
            range("bytes=5-100", 10),
            (206, 5, 5, Some("bytes 5-9/10".into()))
        );
        assert_eq!(
            range("bytes=-100", 10),
            (206, 0, 10, Some("bytes 0-9/10".into()))
        );
        assert_eq!(
            range("BYTES= 0 - 0 ", 10),
            (206, 0, 1, Some("bytes 0-0/10".into()))
        );
        assert_eq!(
            range("bytes=20-30", 10),
            (416, 0, 0, Some("bytes */10".into()))
        );
        assert_eq!(
            range("bytes=10-", 10),
            (416, 0, 0, Some("bytes */10".into()))
        );
        assert_eq!(
            range("bytes=4-2", 10),
            (416, 0, 0, Some("bytes */10".into()))
        );
        assert_eq!(
            range("bytes=-0", 10),
            (416, 0, 0, Some("bytes */10".into()))
        );
        assert_eq!(range("bytes=0-", 0), (416, 0, 0, Some("bytes */0".into())));
        assert_eq!(
            range("bytes=x-y", 10),
            (416, 0, 0, Some("bytes */10".into()))
        );
        assert_eq!(range("bytes=99999999999999999999999-", 10).0, 416);
        assert_eq!(
            range("bytes=0-1,3-4", 10),
            (206, 0, 2, None),
            "multiple ranges: multipart/byteranges"
        );
        assert_eq!(
            range("bytes=0-1,50-60", 10),
            (206, 0, 2, Some("bytes 0-1/10".into())),
            "unsatisfiable ranges are dropped"
        );
        assert_eq!(
            range("bytes=0-8,2-9", 10),
            (200, 0, 10, None),
            "more than the file"
        );
        assert_eq!(range("items=0-1", 10), (200, 0, 10, None));
        let p = plan(&req("Range: bytes=0-1\r\nIf-None-Match: *\r\n"), &file(10));
        assert_eq!(status(&p), 304);
    }

    #[test]
    fn methods_dirs_and_specials() {
        assert_eq!(status(&plan(&req_m("POST", "/a.txt", ""), &file(1))), 405);
        assert_eq!(status(&plan(&req_m("DELETE", "/a.txt", ""), &file(1))), 405);
        assert_eq!(status(&plan(&req_m("HEAD", "/a.txt", ""), &file(1))), 200);
        let dir = FileMeta {
            is_dir: true,
            is_file: false,
            ..file(0)
        };
        match plan(&req_m("GET", "/my%20dir?q=1", ""), &dir) {
            Plan::Reply(s) => {
                assert_eq!(s.status, 301);
                assert_eq!(s.location.as_deref(), Some("/my%20dir/?q=1"));
            }
            other => panic!("{other:?}"),
        }
        let fifo = FileMeta {
            is_file: false,
            ..file(0)
        };
        assert_eq!(status(&plan(&req(""), &fifo)), 404);
    }

    #[test]
    fn paths_and_types() {
        let mut l = loc(LocationKind::Prefix, "/");
        assert_eq!(map_path(&l, "/a/b.txt"), PathBuf::from("/srv/html/a/b.txt"));
        l.path = "/files/".into();
        l.alias = Some(PathBuf::from("/data/other/"));
        assert_eq!(
            map_path(&l, "/files/x.json"),
            PathBuf::from("/data/other/x.json")
        );
        assert_eq!(map_path(&l, "/files/"), PathBuf::from("/data/other/"));
        let mut e = loc(LocationKind::Exact, "/f");
        e.alias = Some(PathBuf::from("/data/file.txt"));
        assert_eq!(map_path(&e, "/f"), PathBuf::from("/data/file.txt"));

        assert_eq!(content_type(&l, Path::new("/x/a.html")), "text/html");
        assert_eq!(content_type(&l, Path::new("/x/a.CSS")), "text/css");
        assert_eq!(content_type(&l, Path::new("/x/a.bin")), "text/plain");
        assert_eq!(content_type(&l, Path::new("/x/noext")), "text/plain");

        let mut i = loc(LocationKind::Prefix, "/");
        i.index = vec!["index.html".into(), "/abs.html".into(), "".into()];
        let mut path = map_path(&i, "/dir/");
        // The consumer's pattern: reassign the path inside the loop over candidates.
        for cand in index_candidates(&i, &path) {
            if cand.ends_with("abs.html") {
                path = cand;
                break;
            }
        }
        assert_eq!(path, PathBuf::from("/srv/html/abs.html"));
        let all: Vec<_> = index_candidates(&i, Path::new("/srv/html/dir/")).collect();
        assert_eq!(
            all,
            vec![
                PathBuf::from("/srv/html/dir/index.html"),
                PathBuf::from("/srv/html/abs.html")
            ]
        );
    }
}

/// Lower-case hexadecimal of `v`, without leading zeros ("0" for zero).
fn push_hex(s: &mut crate::InlineStr, v: u64) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut buf = [0u8; 16];
    let mut i = buf.len();
    let mut v = v;
    loop {
        i -= 1;
        buf[i] = HEX[(v & 15) as usize];
        v >>= 4;
        if v == 0 {
            break;
        }
    }
    s.push_bytes(&buf[i..]);
}

#[cfg(test)]
mod etag_tests {
    use super::*;

    #[test]
    fn etag_is_nginxs_hex_pair() {
        let m = |mtime_secs, size| FileMeta {
            size,
            mtime_secs,
            is_dir: false,
            is_file: true,
        };
        assert_eq!(etag(&m(0x6560_1a2b, 33)), "\"65601a2b-21\"");
        assert_eq!(etag(&m(0, 0)), "\"0-0\"");
        assert_eq!(etag(&m(-5, u64::MAX)), "\"0-ffffffffffffffff\"");
    }
}
