//! The HTTP reverse proxy's decisions (nginx's `ngx_http_proxy_module`): what is sent upstream
//! and how the upstream's answer is read and passed on.
//!
//! This module owns the upstream URI ([`upstream_uri`]: the request target as sent, or the
//! normalized path with the location's prefix replaced by `proxy_pass`'s URI and escaped as
//! nginx's `ngx_escape_uri`), the upstream request head ([`write_request`]: `proxy_set_header`
//! with its variables, then the client's headers less the hop-by-hop ones and those shard sets),
//! the upstream response head ([`parse_response`]: size limit, interim responses, body framing,
//! whether the upstream connection can be reused, the headers passed on) and the client's head
//! and chunks ([`write_client_head`], [`write_chunk`]).
//!
//! It deliberately owns no I/O and no policy that needs state: choosing and connecting to a peer,
//! retries (`proxy_next_upstream`), timeouts, connection pools, reading and buffering bodies
//! (chunked ones through [`crate::body::ChunkedDecoder::feed_into`]), and the client's framing
//! and keep-alive belong to the worker (`shard-server`'s `worker/proxy.rs`), which passes its
//! decisions in. Nothing here panics on any input, and every header written is a single line:
//! CR, LF and NUL are dropped from every value, whatever its source.

use std::net::SocketAddr;

use shard_config::{LocationConf, LocationKind, ProxyPass};

use crate::request::{Method, Request};
use crate::response::{push_u64, status_text};

/// Everything needed to build the upstream request.
pub struct RequestCtx<'a> {
    pub req: &'a Request,
    /// The request head exactly as received: request line through the empty line.
    pub head: &'a [u8],
    /// The matched location (its `path` and `kind` drive URI replacement; its `proxy` holds
    /// `set_headers` and `http_version_minor`).
    pub location: &'a LocationConf,
    pub pass: &'a ProxyPass,
    pub client: Option<SocketAddr>,
    pub server_addr: SocketAddr,
    /// The first `server_name` of the chosen server ("" when none).
    pub server_name: &'a str,
    /// Length of the request body shard will send (already fully read and de-chunked, or
    /// announced by the client when it is streamed), or `None` when the request has no body.
    pub body_len: Option<u64>,
    /// The body is streamed to the upstream in chunked encoding as it arrives (a chunked
    /// request body with `proxy_request_buffering off` and `proxy_http_version 1.1`).
    pub body_chunked: bool,
    /// For `$request_id`, `$connection` and the other variables of the connection.
    pub conn: crate::vars::Conn<'a>,
    /// Captures, `set` values and maps.
    pub scope: crate::vars::Scope<'a>,
}

/// Why an attempt at an upstream failed, in `proxy_next_upstream` terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    Error,
    Timeout,
    InvalidHeader,
    /// The upstream answered with a status `proxy_next_upstream` may retry (`http_5xx` ...).
    Status(u16),
}

impl Failure {
    /// Whether `proxy_next_upstream` asks for another peer after this failure.
    pub fn retried_by(self, nu: &shard_config::NextUpstream) -> bool {
        match self {
            Failure::Error => nu.error,
            Failure::Timeout => nu.timeout,
            Failure::InvalidHeader => nu.invalid_header,
            Failure::Status(s) => nu.retries_status(s),
        }
    }

    /// The answer when no peer is left: 504 after a timeout, else 502.
    pub fn status(self) -> u16 {
        match self {
            Failure::Timeout => 504,
            _ => 502,
        }
    }

    /// Whether the failure counts against the peer (`max_fails`): not a 403 or 404, which
    /// say nothing about the peer's health (nginx's `http_403`/`http_404` are not failures).
    pub fn counts_against_peer(self) -> bool {
        !matches!(self, Failure::Status(403 | 404))
    }
}

/// Whether a failed attempt may go to another peer: never once the response head reached the
/// client; a non-idempotent request (POST, LOCK, PATCH) only before it was sent, unless
/// `proxy_next_upstream non_idempotent`.
pub fn may_retry(
    head_sent: bool,
    request_sent: bool,
    method: &Method,
    non_idempotent: bool,
) -> bool {
    !head_sent && (!request_sent || method.is_idempotent() || non_idempotent)
}

/// Whether the client connection stays open after a proxy error page: a 502 or 504 after a
/// fully read request keeps it, as nginx does; a refused or timed-out request (400, 408, 413,
/// 500) closes it.
pub fn error_keeps_connection(status: u16, keep_alive: bool, body_pending: bool) -> bool {
    keep_alive && !body_pending && matches!(status, 502 | 504)
}

/// How the response body is framed for the client, from the upstream's framing: a length is
/// kept; a chunked or close-delimited body is re-chunked for an HTTP/1.1 client, and sent
/// until close to an HTTP/1.0 client (then the connection cannot be kept: the second value).
pub fn client_framing(upstream: Framing, client_http11: bool) -> (Framing, bool) {
    match upstream {
        Framing::None => (Framing::None, true),
        Framing::Length(n) => (Framing::Length(n), true),
        Framing::Chunked | Framing::Close if client_http11 => (Framing::Chunked, true),
        Framing::Chunked | Framing::Close => (Framing::Close, false),
    }
}

/// How a message body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    None,
    Length(u64),
    Chunked,
    /// Until the upstream closes the connection.
    Close,
}

/// A parsed upstream response head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponseHead {
    pub status: u16,
    /// Upstream HTTP/1.x minor version.
    pub minor: u8,
    pub framing: Framing,
    /// The upstream connection may carry another request once this body is read.
    pub reusable: bool,
    /// Headers passed to the client, in order, as received.
    pub headers: Vec<(String, Vec<u8>)>,
    /// The head has an `X-Accel-Redirect` (hidden from the client by default): the proxy
    /// looks for its target only then.
    pub accel_redirect: bool,
    /// The head has an `X-Accel-Limit-Rate`: the proxy reads it only then.
    pub accel_limit_rate: bool,
    /// The head has an `X-Accel-Charset`: the proxy reads it only then.
    pub accel_charset: bool,
}

#[derive(Debug)]
pub enum ResponseParse {
    Partial,
    /// A 1xx response other than 101: drop `head_len` bytes and parse again.
    Interim {
        head_len: usize,
    },
    Complete {
        head: ResponseHead,
        head_len: usize,
    },
    /// The upstream sent something that is not a valid response head (nginx: "upstream sent
    /// invalid header", "upstream sent too big header"): the reason for the error log.
    Invalid(&'static str),
}

/// Most header lines of an upstream response head; more is "too big", as for a client's head.
const MAX_RESPONSE_HEADERS: usize = 100;
/// Header lines of a client request looked at with a small array first (most carry fewer).
const FEW_HEADERS: usize = 24;

const INVALID_HEADER: &str = "upstream sent invalid header";
const TOO_BIG_HEADER: &str = "upstream sent too big header";
const INVALID_LENGTH: &str = "upstream sent invalid \"Content-Length\" header";
const UNEXPECTED_101: &str = "upstream sent unexpected 101";

/// Client headers never passed upstream. Hop-by-hop headers (RFC 9110 7.6.1) describe the
/// client's connection, not the upstream's. `Host` comes from `proxy_set_header` (nginx's
/// default `Host $proxy_host`). `Content-Length` and `Transfer-Encoding`: shard holds the whole
/// body, de-chunked, and frames it itself. `Expect`: the body was already read, so there is
/// nothing left to continue.
const REQUEST_DROPPED: [&str; 10] = [
    "host",
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "upgrade",
    "expect",
    "transfer-encoding",
    "content-length",
    "trailer",
];

/// Upstream headers never passed to the client: the hop-by-hop ones (shard frames the body and
/// decides the client's connection itself), and those nginx hides by default
/// (`proxy_hide_header`'s built-in list): `Server` and `Date` (shard writes its own), `X-Pad`
/// and the `X-Accel-*` family (instructions to the proxy, see [`is_hidden`]).
const RESPONSE_DROPPED: [&str; 11] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "content-length",
    "te",
    "trailer",
    "upgrade",
    "server",
    "date",
    "x-pad",
];

/// `proxy_set_header` names shard never sends: the body's framing is shard's alone, since a
/// configured value that disagreed with the body sent would desynchronize the upstream
/// connection (request smuggling).
fn is_framing_header(name: &str) -> bool {
    name.eq_ignore_ascii_case("content-length") || name.eq_ignore_ascii_case("transfer-encoding")
}

fn is_in(name: &str, list: &[&str]) -> bool {
    list.iter().any(|l| name.eq_ignore_ascii_case(l))
}

/// Leading and trailing spaces and tabs removed.
pub(crate) fn trim_ows(v: &[u8]) -> &[u8] {
    let start = v
        .iter()
        .position(|&b| b != b' ' && b != b'\t')
        .unwrap_or(v.len());
    let end = v
        .iter()
        .rposition(|&b| b != b' ' && b != b'\t')
        .map_or(start, |i| i + 1);
    &v[start..end]
}

/// The non-empty elements of a comma-separated header value.
fn tokens(v: &[u8]) -> impl Iterator<Item = &[u8]> {
    v.split(|&b| b == b',')
        .map(trim_ows)
        .filter(|t| !t.is_empty())
}

/// True when a `Connection` header among `hs` lists `name`: such a header is hop-by-hop.
fn named_by_connection(name: &str, hs: &[httparse::Header<'_>]) -> bool {
    hs.iter()
        .filter(|h| h.name.eq_ignore_ascii_case("connection"))
        .any(|h| tokens(h.value).any(|t| t.eq_ignore_ascii_case(name.as_bytes())))
}

/// Appends `v` without CR, LF and NUL, so no value can split or end a head.
fn push_clean(out: &mut Vec<u8>, v: &[u8]) {
    // Most values are short: a plain scan costs less than setting up `memchr3`.
    let clean = if v.len() <= 32 {
        !v.iter().any(|&b| matches!(b, b'\r' | b'\n' | 0))
    } else {
        memchr::memchr3(b'\r', b'\n', 0, v).is_none()
    };
    if clean {
        out.extend_from_slice(v);
    } else {
        out.extend(
            v.iter()
                .copied()
                .filter(|&b| !matches!(b, b'\r' | b'\n' | 0)),
        );
    }
}

/// Removes CR, LF and NUL from `out[from..]` in place.
fn strip_controls(out: &mut Vec<u8>, from: usize) {
    if memchr::memchr3(b'\r', b'\n', 0, out.get(from..).unwrap_or_default()).is_none() {
        return;
    }
    let mut w = from;
    for r in from..out.len() {
        let b = out[r];
        if !matches!(b, b'\r' | b'\n' | 0) {
            out[w] = b;
            w += 1;
        }
    }
    out.truncate(w);
}

/// nginx's `ngx_escape_uri(NGX_ESCAPE_URI)`, plus `"`: bytes that may not appear raw in a
/// request target's path once it has been decoded.
fn needs_escape(b: u8) -> bool {
    b <= b' ' || b >= 0x7f || matches!(b, b'"' | b'#' | b'%' | b'?')
}

/// The upstream URI in pieces, found without allocating: `head`, then `tail` (escaped when
/// `escape`), then `?` and `query`. [`upstream_uri`] and [`write_request`] both emit it.
struct UriParts<'a> {
    head: &'a str,
    tail: &'a str,
    escape: bool,
    query: Option<&'a str>,
}

impl UriParts<'_> {
    fn len(&self) -> usize {
        let escaped = if self.escape {
            self.tail.bytes().filter(|&b| needs_escape(b)).count()
        } else {
            0
        };
        self.head.len() + self.tail.len() + 2 * escaped + self.query.map_or(0, |q| q.len() + 1)
    }

    fn write(&self, out: &mut Vec<u8>) {
        const HEX: &[u8; 16] = b"0123456789ABCDEF";
        out.extend_from_slice(self.head.as_bytes());
        if self.escape {
            for b in self.tail.bytes() {
                if needs_escape(b) {
                    out.extend_from_slice(&[
                        b'%',
                        HEX[usize::from(b >> 4)],
                        HEX[usize::from(b & 0xf)],
                    ]);
                } else {
                    out.push(b);
                }
            }
        } else {
            out.extend_from_slice(self.tail.as_bytes());
        }
        if let Some(q) = self.query {
            out.push(b'?');
            out.extend_from_slice(q.as_bytes());
        }
    }
}

/// The origin form of a target as the client sent it: an absolute-form target loses its scheme
/// and authority (`http://h/p?q` is `/p?q`, `http://h?q` is `/?q`), and a fragment, which is
/// no part of a request target (RFC 9112 3.2), is dropped as the request parser drops it.
fn origin_form(target: &str) -> UriParts<'_> {
    let t = match target.find('#') {
        Some(i) => &target[..i],
        None => target,
    };
    let parts = |head, tail| UriParts {
        head,
        tail,
        escape: false,
        query: None,
    };
    let b = t.as_bytes();
    let authority = if b.len() >= 7 && b[..7].eq_ignore_ascii_case(b"http://") {
        7
    } else if b.len() >= 8 && b[..8].eq_ignore_ascii_case(b"https://") {
        8
    } else {
        return parts("", t);
    };
    let rest = &t[authority..];
    match rest.find(['/', '?']) {
        Some(i) if rest.as_bytes()[i] == b'/' => parts("", &rest[i..]),
        Some(i) => parts("/", &rest[i..]),
        None => parts("/", ""),
    }
}

/// The part of `path` after the prefix `location` matched, or `None` when it matched nothing
/// (the server's base location, whose path is empty).
fn after_location<'p>(path: &'p str, location: &LocationConf) -> Option<&'p str> {
    if location.path.is_empty() {
        return None;
    }
    match location.kind {
        LocationKind::Exact => (path == location.path).then_some(""),
        LocationKind::Prefix | LocationKind::PrefixNoRegex => {
            path.strip_prefix(location.path.as_str())
        }
        // The configuration refuses a URI part in these (nginx's rule).
        LocationKind::Regex | LocationKind::Named => None,
    }
}

fn uri_parts<'a>(req: &'a Request, location: &LocationConf, pass: &'a ProxyPass) -> UriParts<'a> {
    if let (Some(_), Some(uri)) = (&pass.dynamic, pass.uri.as_deref()) {
        // `proxy_pass` with variables and a URI: the URI is sent as it is, as nginx.
        return UriParts {
            head: uri,
            tail: "",
            escape: false,
            query: None,
        };
    }
    let Some(uri) = pass.uri.as_deref().filter(|_| !req.location_left) else {
        if req.uri_changed {
            // nginx: the full normalized URI of a changed request.
            return UriParts {
                head: "",
                tail: &req.path,
                escape: true,
                query: req.query.as_deref().filter(|q| !q.is_empty()),
            };
        }
        return origin_form(&req.target);
    };
    let path = req.path.as_str();
    let tail = match after_location(path, location) {
        Some(rest) => rest,
        None if uri.ends_with('/') => path.strip_prefix('/').unwrap_or(path),
        None => path,
    };
    UriParts {
        head: uri,
        tail,
        escape: true,
        query: req.query.as_deref().filter(|q| !q.is_empty()),
    }
}

/// The URI sent upstream (path and query).
///
/// Without a URI in `proxy_pass`, the target as the client sent it (in origin form). With one,
/// nginx's rule: the normalized path, its matched location prefix replaced by the URI
/// (`location /a/` + `proxy_pass http://b/x/` sends `/a/b` as `/x/b`; `location /a` with
/// `/x/` sends `/x//b`, as nginx), the rest escaped, then `?` and the raw query when it is not
/// empty (nginx's `r->args.len > 0`). When the location matched no prefix, the URI is joined
/// to the whole path with a single `/`.
pub fn upstream_uri(req: &Request, location: &LocationConf, pass: &ProxyPass) -> String {
    let parts = uri_parts(req, location, pass);
    let mut out = Vec::with_capacity(parts.len());
    parts.write(&mut out);
    // Every piece is a `str` or ASCII, so this never takes the lossy path.
    String::from_utf8(out).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

/// Appends the upstream request head to `out`.
///
/// The request line (`HTTP/1.<proxy_http_version>`), then every `proxy_set_header` in order
/// (one whose value comes out empty is not sent, as nginx; `Content-Length` and
/// `Transfer-Encoding` are never taken from it), then the client's headers in order except
/// those named by `proxy_set_header`, those with an invalid name under
/// `ignore_invalid_headers on`, the hop-by-hop ones (see `REQUEST_DROPPED`) and those
/// the client's `Connection` lists, then `Content-Length` when there is a body.
pub fn write_request(out: &mut Vec<u8>, ctx: &RequestCtx<'_>) {
    // A small array first, as `request::parse` does (initialising all `MAX_HEADERS` entries
    // cost more than parsing a short head); an empty list means more lines (or none).
    let mut few = [httparse::EMPTY_HEADER; FEW_HEADERS];
    let mut many;
    let hs = match crate::vars::request_headers_in(ctx.head, &mut few) {
        [] => {
            many = crate::vars::header_storage();
            crate::vars::request_headers(ctx.head, &mut many)
        }
        hs => hs,
    };
    let conf = &ctx.location.proxy;
    let vc = crate::vars::Ctx {
        req: ctx.req,
        headers: hs,
        client: ctx.client,
        server_addr: ctx.server_addr,
        server_name: ctx.server_name,
        location: ctx.location,
        pass: Some(ctx.pass),
        conn: ctx.conn,
        scope: ctx.scope,
        done: None,
    };

    match &conf.method {
        // `proxy_method`: rendered, kept to token characters.
        Some(parts) => {
            let m = out.len();
            crate::vars::push_parts(out, parts, &vc);
            let mut i = m;
            while i < out.len() {
                if out[i].is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&out[i]) {
                    i += 1;
                } else {
                    out.remove(i);
                }
            }
            if out.len() == m {
                out.extend_from_slice(ctx.req.method.as_str().as_bytes());
            }
        }
        None => out.extend_from_slice(ctx.req.method.as_str().as_bytes()),
    }
    out.push(b' ');
    let uri = out.len();
    uri_parts(ctx.req, ctx.location, ctx.pass).write(out);
    strip_controls(out, uri);
    out.extend_from_slice(b" HTTP/1.");
    push_u64(out, u64::from(conf.http_version_minor));
    out.extend_from_slice(b"\r\n");

    for (name, parts) in &conf.set_headers {
        if name.is_empty() || is_framing_header(name) {
            continue;
        }
        let line = out.len();
        push_clean(out, name.as_bytes());
        out.extend_from_slice(b": ");
        let value = out.len();
        crate::vars::push_parts(out, parts, &vc);
        strip_controls(out, value);
        if out.len() == value {
            out.truncate(line);
        } else {
            out.extend_from_slice(b"\r\n");
        }
    }

    // Headers the client's `Connection` names are not passed (looked up only when it sent one).
    let connection = hs.iter().any(|h| h.name.eq_ignore_ascii_case("connection"));
    // `proxy_pass_request_headers off`: only the headers `proxy_set_header` makes.
    for h in hs.iter().filter(|_| conf.pass_request_headers) {
        // An invalid name (`X_Forwarded_For` with underscores off) never reaches the upstream,
        // where a CGI-style backend would read it as the real header.
        if !crate::request::header_name_forwarded(h.name.as_bytes(), ctx.req.names)
            || is_in(h.name, &REQUEST_DROPPED)
            || conf
                .set_headers
                .iter()
                .any(|(n, _)| n.eq_ignore_ascii_case(h.name))
            || (connection && named_by_connection(h.name, hs))
        {
            continue;
        }
        out.extend_from_slice(h.name.as_bytes());
        out.extend_from_slice(b": ");
        push_clean(out, h.value);
        out.extend_from_slice(b"\r\n");
    }

    if ctx.body_chunked {
        out.extend_from_slice(b"Transfer-Encoding: chunked\r\n");
    } else if let Some(n) = ctx.body_len {
        out.extend_from_slice(b"Content-Length: ");
        push_u64(out, n);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

/// Whether an upstream request head (as [`write_request`] wrote it) asks to switch protocols:
/// HTTP/1.1 with a non-empty `Upgrade` header. Only such a request may be answered with a
/// `101` that turns the connection into a tunnel; nginx's rule, since its `Upgrade` reaches
/// the upstream only through an explicit `proxy_set_header Upgrade ...`.
pub fn upgrade_requested(upstream_head: &[u8]) -> bool {
    let end = memchr::memmem::find(upstream_head, b"\r\n\r\n").unwrap_or(upstream_head.len());
    let mut lines = upstream_head[..end]
        .split(|&b| b == b'\n')
        .map(|l| l.strip_suffix(b"\r").unwrap_or(l));
    let http11 = lines.next().is_some_and(|l| l.ends_with(b" HTTP/1.1"));
    http11
        && lines.any(|l| {
            l.len() > 8 && l[..8].eq_ignore_ascii_case(b"upgrade:") && !trim_ows(&l[8..]).is_empty()
        })
}

/// A `Content-Length` value: digits only, within `off_t` (nginx's `ngx_atoof`).
pub(crate) fn parse_length(v: &[u8]) -> Option<u64> {
    let v = trim_ows(v);
    if v.is_empty() || v.len() > 19 || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n = v.iter().fold(0u64, |a, &c| a * 10 + u64::from(c - b'0'));
    (n <= i64::MAX as u64).then_some(n)
}

/// Every header line of a response head (status line skipped) as `(name, value)`, values
/// trimmed: what `$upstream_http_*` reads, hidden headers included.
pub fn header_lines(head: &[u8]) -> Vec<(String, Vec<u8>)> {
    head_fields(head)
        .filter_map(|(n, v)| Some((std::str::from_utf8(n).ok()?.to_string(), v.to_vec())))
        .collect()
}

/// The `name: value` lines of a head (its first line skipped), name and value trimmed of
/// optional whitespace, without copying: what [`header_lines`] collects, and what the
/// worker reads one field of (`X-Accel-Limit-Rate`) or the access log (`$sent_http_NAME`).
pub fn head_fields(head: &[u8]) -> impl Iterator<Item = (&[u8], &[u8])> {
    head.split(|&b| b == b'\n')
        .skip(1)
        .map(|l| l.strip_suffix(b"\r").unwrap_or(l))
        .filter_map(|l| {
            let i = memchr::memchr(b':', l)?;
            let name = trim_ows(&l[..i]);
            (!name.is_empty()).then(|| (name, trim_ows(&l[i + 1..])))
        })
}

/// Headers nginx hides from the client by default, beyond `RESPONSE_DROPPED`: `X-Accel-*`.
fn is_hidden(name: &str) -> bool {
    is_in(name, &RESPONSE_DROPPED)
        || name
            .get(..8)
            .is_some_and(|p| p.eq_ignore_ascii_case("x-accel-"))
}

/// A default-hidden header `proxy_pass_header` names (never a hop-by-hop one).
fn passable(name: &str, pass: &[String]) -> bool {
    let hop = RESPONSE_DROPPED[..8]
        .iter()
        .any(|h| name.eq_ignore_ascii_case(h));
    !hop && pass.iter().any(|p| name.eq_ignore_ascii_case(p))
}

/// Renders a rewrite rule's replacement; with a regular expression's match, `$1`.. are its
/// groups (byte ranges of the text given).
pub type RenderWith<'r> = dyn Fn(&[shard_config::Part], Groups<'_>) -> String + 'r;

/// A regular expression's groups (byte ranges, `None` for a group that took no part) and the
/// text they index.
pub type Groups<'a> = Option<(&'a [Option<(usize, usize)>], &'a str)>;

/// How a rewrite rule's text matches (see [`apply_rewrites`]).
#[derive(Clone, Copy, PartialEq, Eq)]
enum MatchBy {
    /// A prefix, with case (`proxy_redirect`, `proxy_cookie_path`).
    Prefix,
    /// The whole value without case, a leading dot of either left out and the value's kept
    /// (`proxy_cookie_domain`).
    Domain,
}

/// The first rule of `rules` that matches `value`, applied, as nginx's
/// `ngx_http_proxy_rewrite_*_handler`s: text (or text with variables, rendered now) replaces
/// what it matched; a regular expression that matches replaces the whole value with its
/// replacement (where its groups are `$1`..). `default` answers for `proxy_redirect
/// default` among the rules. `None`: no rule matched.
fn apply_rewrites(
    value: &str,
    rules: &[shard_config::RewriteRule],
    by: MatchBy,
    default: &dyn Fn(&str) -> Option<String>,
    render: &RenderWith<'_>,
) -> Option<String> {
    use shard_config::RewriteFrom;
    let mut caps = Vec::new();
    for r in rules {
        let text = match &r.from {
            RewriteFrom::Default => match default(value) {
                Some(v) => return Some(v),
                None => continue,
            },
            RewriteFrom::Regex(re) => {
                if re.captures_into(value, &mut caps) {
                    return Some(render(&r.to, Some((&caps, value))));
                }
                continue;
            }
            RewriteFrom::Text(t) => std::borrow::Cow::Borrowed(t.as_str()),
            RewriteFrom::Vars(parts) => std::borrow::Cow::Owned(render(parts, None)),
        };
        match by {
            MatchBy::Prefix => {
                if let Some(rest) = value.strip_prefix(text.as_ref()) {
                    return Some(format!("{}{rest}", render(&r.to, None)));
                }
            }
            MatchBy::Domain => {
                let (dot, bare) = match value.strip_prefix('.') {
                    Some(b) => (".", b),
                    None => ("", value),
                };
                let want = text.strip_prefix('.').unwrap_or(&text);
                if want.eq_ignore_ascii_case(bare) {
                    return Some(format!("{dot}{}", render(&r.to, None)));
                }
            }
        }
    }
    None
}

/// The `Location` (or `Refresh`) an upstream sent, rewritten by `proxy_redirect`: the first
/// rule that matches (see [`apply_rewrites`]). `default` is the rule `http://PROXY_HOST/URI`
/// (or `.../` without a URI part) to the location's prefix (`/`). `None`: unchanged.
pub fn redirect_location(
    value: &str,
    location: &LocationConf,
    pass: &ProxyPass,
    render: &RenderWith<'_>,
) -> Option<String> {
    use shard_config::ProxyRedirect;
    let default = |value: &str| {
        let uri = pass.uri.as_deref().unwrap_or("/");
        let scheme = if pass.tls { "https" } else { "http" };
        let from = format!("{scheme}://{}{uri}", pass.proxy_host);
        let to = match (pass.uri.is_some(), location.kind) {
            (true, LocationKind::Prefix | LocationKind::PrefixNoRegex | LocationKind::Exact) => {
                location.path.as_str()
            }
            _ => "/",
        };
        value
            .strip_prefix(from.as_str())
            .map(|rest| format!("{to}{rest}"))
    };
    match &location.proxy.redirect {
        ProxyRedirect::Off => None,
        ProxyRedirect::Default => default(value),
        ProxyRedirect::Pairs(rules) => {
            apply_rewrites(value, rules, MatchBy::Prefix, &default, render)
        }
    }
}

/// Parses an upstream response head at the start of `buf`. `max` is `proxy_buffer_size`;
/// `head_request` is true when the request was `HEAD`.
///
/// Framing: none for `HEAD`, 204 and 304; `Transfer-Encoding` wins over `Content-Length`
/// (chunked when `chunked` is the last coding, else until close), then `Content-Length`
/// (repeats must agree), else until close. The connection is reusable when the body has an
/// end, HTTP/1.1 did not say `close` or HTTP/1.0 said `keep-alive`, and the framing was not
/// ambiguous (`Transfer-Encoding` with `Content-Length`). For `HEAD`, the upstream's
/// `Content-Length` is passed on, as nginx does: it is the length a `GET` would have had.
pub fn parse_response(buf: &[u8], max: usize, head_request: bool) -> ResponseParse {
    parse_response_passing(buf, max, head_request, &[], false)
}

/// [`parse_response`], keeping the default-hidden headers `pass` names (`proxy_pass_header`,
/// lowercase): `Server`, `Date`, `X-Pad`, `X-Accel-*`; hop-by-hop headers are never kept.
///
/// `upgrade`: the request asked the upstream to switch protocols (see [`upgrade_requested`]),
/// so a `101` is the complete head of an upgraded connection, passed with its `Upgrade`
/// header; otherwise a `101` nobody asked for is an invalid response.
pub fn parse_response_passing(
    buf: &[u8],
    max: usize,
    head_request: bool,
    pass: &[String],
    upgrade: bool,
) -> ResponseParse {
    if buf.is_empty() {
        // Nothing read yet (each response's first look): no parser to set up.
        return ResponseParse::Partial;
    }
    // Left uninitialised: httparse writes the headers it finds (writing 100 empty ones first
    // cost more than parsing a small head).
    let mut storage =
        [const { std::mem::MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_RESPONSE_HEADERS];
    let mut resp = httparse::Response::new(&mut []);
    let parsed = httparse::ParserConfig::default().parse_response_with_uninit_headers(
        &mut resp,
        buf,
        &mut storage,
    );
    let head_len = match parsed {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) if buf.len() >= max => {
            return ResponseParse::Invalid(TOO_BIG_HEADER)
        }
        Ok(httparse::Status::Partial) => return ResponseParse::Partial,
        Err(httparse::Error::TooManyHeaders) => return ResponseParse::Invalid(TOO_BIG_HEADER),
        Err(_) => return ResponseParse::Invalid(INVALID_HEADER),
    };
    if head_len > max {
        return ResponseParse::Invalid(TOO_BIG_HEADER);
    }
    // httparse accepts only HTTP/1.0 and HTTP/1.1 and three-digit codes.
    let (Some(minor), Some(status)) = (resp.version, resp.code) else {
        return ResponseParse::Invalid(INVALID_HEADER);
    };
    if status < 100 {
        return ResponseParse::Invalid(INVALID_HEADER);
    }
    if status == 101 {
        if !upgrade {
            // The upstream was not asked to switch (the client's `Upgrade` was not forwarded):
            // tunnelling would hand the client a protocol it did not ask for.
            return ResponseParse::Invalid(UNEXPECTED_101);
        }
        // The connection is the upgraded protocol's from here: no body, never reused. Its
        // `Upgrade` header goes to the client; `Connection: upgrade` is written by shard.
        let headers = resp
            .headers
            .iter()
            .filter(|h| {
                let shown = !is_hidden(h.name) || passable(h.name, pass);
                h.name.eq_ignore_ascii_case("upgrade")
                    || (shown && !named_by_connection(h.name, resp.headers))
            })
            .map(|h| (h.name.to_string(), h.value.to_vec()))
            .collect();
        return ResponseParse::Complete {
            head: ResponseHead {
                status,
                minor,
                framing: Framing::None,
                reusable: false,
                headers,
                accel_redirect: resp
                    .headers
                    .iter()
                    .any(|h| h.name.eq_ignore_ascii_case("x-accel-redirect")),
                accel_limit_rate: resp
                    .headers
                    .iter()
                    .any(|h| h.name.eq_ignore_ascii_case("x-accel-limit-rate")),
                accel_charset: false,
            },
            head_len,
        };
    }
    if status < 200 {
        return ResponseParse::Interim { head_len };
    }
    let hs: &[httparse::Header<'_>] = resp.headers;

    let mut te = false;
    let mut chunked = false;
    let mut length: Option<u64> = None;
    let mut close = false;
    let mut keep_alive = false;
    let mut accel_redirect = false;
    let mut accel_limit_rate = false;
    let mut accel_charset = false;
    let mut connection = false;
    for h in hs {
        if h.name.eq_ignore_ascii_case("transfer-encoding") {
            te = true;
            // The codings of repeated headers form one list; only the last one says chunked.
            for t in tokens(h.value) {
                chunked = t.eq_ignore_ascii_case(b"chunked");
            }
        } else if h.name.eq_ignore_ascii_case("content-length") {
            let Some(n) = parse_length(h.value) else {
                return ResponseParse::Invalid(INVALID_LENGTH);
            };
            if length.is_some_and(|l| l != n) {
                return ResponseParse::Invalid(INVALID_LENGTH);
            }
            length = Some(n);
        } else if h.name.eq_ignore_ascii_case("connection") {
            connection = true;
            for t in tokens(h.value) {
                close |= t.eq_ignore_ascii_case(b"close");
                keep_alive |= t.eq_ignore_ascii_case(b"keep-alive");
            }
        } else if h.name.eq_ignore_ascii_case("x-accel-redirect") {
            accel_redirect = true;
        } else if h.name.eq_ignore_ascii_case("x-accel-limit-rate") {
            accel_limit_rate = true;
        } else if h.name.eq_ignore_ascii_case("x-accel-charset") {
            accel_charset = true;
        }
    }

    // As nginx since 1.21.1: a response whose end could be read two ways is refused, not
    // guessed at (the next response on the connection would be desynchronized).
    if te && length.is_some() {
        return ResponseParse::Invalid(
            "upstream sent \"Content-Length\" and \"Transfer-Encoding\" headers at the same time",
        );
    }
    if te && !chunked {
        return ResponseParse::Invalid("upstream sent unknown \"Transfer-Encoding\"");
    }
    let framing = if head_request || status == 204 || status == 304 {
        Framing::None
    } else if te {
        if chunked {
            Framing::Chunked
        } else {
            Framing::Close
        }
    } else if let Some(n) = length {
        Framing::Length(n)
    } else {
        Framing::Close
    };
    let persistent = if minor == 1 {
        !close
    } else {
        keep_alive && !close
    };
    let ambiguous = te && length.is_some();
    let reusable = framing != Framing::Close && persistent && !ambiguous;

    let pass_length = head_request && !te;
    let mut length_passed = false;
    let mut headers = Vec::with_capacity(hs.len());
    for h in hs {
        if pass_length && !length_passed && h.name.eq_ignore_ascii_case("content-length") {
            length_passed = true;
        } else if (is_hidden(h.name) && !passable(h.name, pass))
            || (connection && named_by_connection(h.name, hs))
        {
            continue;
        }
        headers.push((h.name.to_string(), h.value.to_vec()));
    }

    ResponseParse::Complete {
        head: ResponseHead {
            status,
            minor,
            framing,
            reusable,
            headers,
            accel_redirect,
            accel_limit_rate,
            accel_charset,
        },
        head_len,
    }
}

/// `proxy_cookie_domain` and `proxy_cookie_path` on one `Set-Cookie` value, as nginx: the
/// `domain=` and `path=` attributes (names without case) each take the first rule that
/// matches; a domain matches without case and ignoring a leading dot (which is kept), a path
/// by a literal prefix, which the replacement takes the place of. `render` gives a
/// replacement's text. `None`: nothing changed.
pub fn rewrite_set_cookie(
    value: &[u8],
    domains: &[shard_config::RewriteRule],
    paths: &[shard_config::RewriteRule],
    render: &RenderWith<'_>,
) -> Option<Vec<u8>> {
    let none = |_: &str| None;
    let text = std::str::from_utf8(value).ok()?;
    let mut out = String::with_capacity(text.len() + 16);
    let mut changed = false;
    for (i, part) in text.split(';').enumerate() {
        if i > 0 {
            out.push(';');
        }
        let lead = part.len() - part.trim_start().len();
        let attr = &part[lead..];
        let (name, val) = attr.split_once('=').unwrap_or((attr, ""));
        let new = if i == 0 {
            None
        } else if name.eq_ignore_ascii_case("domain") && !domains.is_empty() {
            apply_rewrites(val, domains, MatchBy::Domain, &none, render)
                .map(|v| format!("{name}={v}"))
        } else if name.eq_ignore_ascii_case("path") && !paths.is_empty() {
            apply_rewrites(val, paths, MatchBy::Prefix, &none, render)
                .map(|v| format!("{name}={v}"))
        } else {
            None
        };
        out.push_str(&part[..lead]);
        match new {
            Some(n) => {
                changed = true;
                out.push_str(&n);
            }
            None => out.push_str(attr),
        }
    }
    changed.then(|| out.into_bytes())
}

/// `proxy_cookie_flags`: the `Set-Cookie` value with the flags of the first rule whose
/// cookie matches its name (`name` renders a rule's name) added or removed, as nginx edits
/// them: a flag the cookie lacks is appended (`; Secure`, `; HttpOnly`, `; SameSite=...`), a
/// `SameSite` it has is replaced, a `no` flag removes the attribute. `None` when nothing
/// changed.
pub fn set_cookie_flags(
    value: &[u8],
    rules: &[shard_config::CookieFlags],
    name: &dyn Fn(&[shard_config::Part]) -> String,
) -> Option<Vec<u8>> {
    use shard_config::{CookieFlag, CookieName};
    let text = std::str::from_utf8(value).ok()?;
    let cookie = text.split(';').next()?.split('=').next()?.trim();
    let rule = rules.iter().find(|r| match &r.cookie {
        CookieName::Name(parts) => name(parts).eq_ignore_ascii_case(cookie),
        CookieName::Regex(re) => re.is_match(cookie),
    })?;
    let mut attrs: Vec<String> = text.split(';').map(|a| a.trim().to_string()).collect();
    let is = |a: &str, n: &str| {
        let key = a.split('=').next().unwrap_or("").trim();
        key.eq_ignore_ascii_case(n)
    };
    let before = attrs.clone();
    for f in &rule.flags {
        let rendered;
        let f = match f {
            CookieFlag::Vars(parts) => match CookieFlag::parse(&name(parts)) {
                Some(v) => {
                    rendered = v;
                    &rendered
                }
                None => continue,
            },
            f => f,
        };
        let (attr, add): (&str, Option<&str>) = match f {
            CookieFlag::Secure => ("secure", Some("Secure")),
            CookieFlag::NoSecure => ("secure", None),
            CookieFlag::HttpOnly => ("httponly", Some("HttpOnly")),
            CookieFlag::NoHttpOnly => ("httponly", None),
            CookieFlag::SameSite(v) => ("samesite", Some(v)),
            CookieFlag::NoSameSite => ("samesite", None),
            CookieFlag::Vars(_) => continue,
        };
        let at = attrs
            .iter()
            .skip(1)
            .position(|a| is(a, attr))
            .map(|i| i + 1);
        match (at, add) {
            (Some(i), None) => {
                attrs.remove(i);
            }
            (Some(i), Some(v)) if attr == "samesite" => attrs[i] = v.to_string(),
            (Some(_), Some(_)) => {}
            (None, Some(v)) => attrs.push(v.to_string()),
            (None, None) => {}
        }
    }
    (attrs != before).then(|| attrs.join("; ").into_bytes())
}

/// Appends the client's response head for `head`, delimited by `client_framing`.
///
/// The status line and `Server`/`Date` as [`crate::response::write_head`] writes them, the
/// upstream's passed headers in order, the framing header (`Content-Length` or
/// `Transfer-Encoding: chunked`; nothing for [`Framing::None`] and [`Framing::Close`]) and
/// `Connection`.
pub fn write_client_head(
    out: &mut Vec<u8>,
    head: &ResponseHead,
    date: &[u8],
    client_framing: Framing,
    keep_alive: bool,
    server: &[u8],
    extra: &[u8],
) {
    // One allocation for the whole head (the client's buffer may come back small).
    let fields: usize = head
        .headers
        .iter()
        .map(|(n, v)| n.len() + v.len() + 4)
        .sum();
    out.reserve(96 + server.len() + date.len() + fields + extra.len());
    out.extend_from_slice(b"HTTP/1.1 ");
    push_u64(out, u64::from(head.status));
    out.push(b' ');
    out.extend_from_slice(status_text(head.status).as_bytes());
    out.extend_from_slice(b"\r\n");
    // A passed upstream `Server` or `Date` (`proxy_pass_header`) replaces shard's own; an
    // empty `server` or `date` is none at all (the location passes the upstream's, which
    // sent none: nginx then sends none either).
    let has = |n: &str| head.headers.iter().any(|(h, _)| h.eq_ignore_ascii_case(n));
    if !has("server") && !server.is_empty() {
        out.extend_from_slice(b"Server: ");
        push_clean(out, server);
        out.extend_from_slice(b"\r\n");
    }
    if !has("date") && !date.is_empty() {
        out.extend_from_slice(b"Date: ");
        push_clean(out, date);
        out.extend_from_slice(b"\r\n");
    }
    for (name, value) in &head.headers {
        push_clean(out, name.as_bytes());
        out.extend_from_slice(b": ");
        push_clean(out, value);
        out.extend_from_slice(b"\r\n");
    }
    match client_framing {
        Framing::Length(n) => {
            out.extend_from_slice(b"Content-Length: ");
            push_u64(out, n);
            out.extend_from_slice(b"\r\n");
        }
        Framing::Chunked => out.extend_from_slice(b"Transfer-Encoding: chunked\r\n"),
        Framing::None | Framing::Close => {}
    }
    out.extend_from_slice(if head.status == 101 {
        b"Connection: upgrade\r\n"
    } else if keep_alive {
        b"Connection: keep-alive\r\n"
    } else {
        b"Connection: close\r\n"
    });
    out.extend_from_slice(extra);
    out.extend_from_slice(b"\r\n");
}

/// Appends one chunk (`data` non-empty) in chunked encoding.
///
/// Empty `data` appends nothing: a zero-size chunk would end the body.
pub fn write_chunk(out: &mut Vec<u8>, data: &[u8]) {
    if data.is_empty() {
        return;
    }
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut digits = [0u8; 16];
    let mut i = digits.len();
    let mut n = data.len() as u64;
    loop {
        i -= 1;
        digits[i] = HEX[(n & 0xf) as usize];
        n >>= 4;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[i..]);
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
}

/// The last chunk and the end of a chunked body.
pub const LAST_CHUNK: &[u8] = b"0\r\n\r\n";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::{parse, Limits, Parse};

    #[test]
    fn set_cookie_domain_and_path_rewrites() {
        use shard_config::{RewriteFrom, RewriteRule};
        let lit = |t: &str| vec![shard_config::Part::Lit(t.to_string())];
        let rule = |from: &str, to: &str| RewriteRule {
            from: RewriteFrom::Text(from.to_string()),
            to: lit(to),
        };
        let domains = vec![rule("localhost", "example.org")];
        let paths = vec![
            RewriteRule {
                from: RewriteFrom::Regex(shard_config::Regex::build("^/re/(.+)$", false).unwrap()),
                to: vec![
                    shard_config::Part::Lit("/x/".into()),
                    shard_config::Part::Var(shard_config::Var::Capture(1)),
                ],
            },
            rule("/two/", "/"),
        ];
        // Literals as they are; `$1` from the groups given.
        let render = |p: &[shard_config::Part], caps: Groups<'_>| {
            p.iter()
                .map(|part| match (part, caps) {
                    (shard_config::Part::Lit(t), _) => t.clone(),
                    (shard_config::Part::Var(shard_config::Var::Capture(n)), Some((c, text))) => {
                        c[usize::from(*n)].map_or(String::new(), |(a, b)| text[a..b].to_string())
                    }
                    _ => String::new(),
                })
                .collect::<String>()
        };
        let r = |v: &str| {
            rewrite_set_cookie(v.as_bytes(), &domains, &paths, &render)
                .map(|b| String::from_utf8(b).unwrap())
        };
        assert_eq!(
            r("a=1; Domain=.LocalHost; Path=/two/some/uri/; HttpOnly").as_deref(),
            Some("a=1; Domain=.example.org; Path=/some/uri/; HttpOnly")
        );
        assert_eq!(r("a=1; domain=other; path=/one/"), None);
        assert_eq!(
            r("a=1; path=/re/deep/er").as_deref(),
            Some("a=1; path=/x/deep/er")
        );
        // The cookie's own name=value is never an attribute.
        assert_eq!(r("domain=localhost"), None);
    }
    use crate::route::tests::loc;
    use shard_config::{Part, Var};
    use std::path::Path;

    const CONN: crate::vars::Conn<'static> = crate::vars::Conn {
        connection: 7,
        requests: 1,
        now_ms: 1_000_000,
        started_ms: 999_990,
        opened_ms: 0,
        peer: None,
        limit_req_status: "",
        limit_conn_status: "",
        request_id: 0xabc,
        hostname: "testhost",
        tls: None,
        proxy_protocol: None,
        http2: "",
        http3: "",
        upstream: &[],
        request_body: &[],
        request_body_file: None,
        status: None,
        limit_rate: 0,
        pipelined: false,
        slice_range: "",
    };

    fn req(raw: &str) -> (Request, Vec<u8>) {
        match parse(raw.as_bytes(), &Limits::default()) {
            Parse::Complete { req, head_len } => (req, raw.as_bytes()[..head_len].to_vec()),
            other => panic!("{raw:?}: {other:?}"),
        }
    }

    fn pass(uri: Option<&str>) -> ProxyPass {
        ProxyPass {
            upstream: 0,
            uri: uri.map(str::to_string),
            proxy_host: "backend".into(),
            proxy_port: 80,
            tls: false,
            dynamic: None,
        }
    }

    fn location(kind: LocationKind, path: &str, headers: &[(&str, Vec<Part>)]) -> LocationConf {
        let mut l = loc(kind, path);
        l.proxy.set_headers = headers
            .iter()
            .map(|(n, p)| (n.to_string(), p.clone()))
            .collect();
        l
    }

    fn lit(s: &str) -> Part {
        Part::Lit(s.into())
    }

    fn var(v: Var) -> Part {
        Part::Var(v)
    }

    /// nginx's defaults, as the configuration merges them in.
    fn defaults() -> Vec<(&'static str, Vec<Part>)> {
        vec![
            ("Host", vec![var(Var::ProxyHost)]),
            ("Connection", vec![lit("close")]),
        ]
    }

    fn uri(target: &str, kind: LocationKind, loc_path: &str, pass_uri: Option<&str>) -> String {
        let (r, _) = req(&format!("GET {target} HTTP/1.1\r\nHost: x\r\n\r\n"));
        let (l, p) = (location(kind, loc_path, &[]), pass(pass_uri));
        let u = upstream_uri(&r, &l, &p);
        assert_eq!(
            uri_parts(&r, &l, &p).len(),
            u.len(),
            "the reserved length is exact"
        );
        u
    }

    struct Sent<'a> {
        raw: &'a str,
        location: &'a LocationConf,
        pass: &'a ProxyPass,
        client: Option<&'a str>,
        body_len: Option<u64>,
    }

    fn sent(s: Sent<'_>) -> String {
        let (r, head) = req(s.raw);
        let mut out = b"before".to_vec();
        write_request(
            &mut out,
            &RequestCtx {
                req: &r,
                head: &head,
                location: s.location,
                pass: s.pass,
                client: s.client.map(|c| c.parse().unwrap()),
                server_addr: "127.0.0.1:8080".parse().unwrap(),
                server_name: "example.com",
                body_len: s.body_len,
                body_chunked: false,
                conn: CONN,
                scope: Default::default(),
            },
        );
        let text = String::from_utf8(out).unwrap();
        text.strip_prefix("before")
            .expect("appends to what is there")
            .to_string()
    }

    /// `write_request` with nginx's default headers, client 192.0.2.7:5555 and no body.
    fn sent_default(raw: &str, extra: &[(&str, Vec<Part>)]) -> String {
        let mut headers = defaults();
        headers.extend(extra.iter().cloned());
        let l = location(LocationKind::Prefix, "/", &headers);
        sent(Sent {
            raw,
            location: &l,
            pass: &pass(None),
            client: Some("192.0.2.7:5555"),
            body_len: None,
        })
    }

    /// More header lines than the small array holds: every one still goes upstream.
    #[test]
    fn a_request_with_many_headers_passes_them_all() {
        let mut raw = String::from("GET /x HTTP/1.1\r\nHost: a.test\r\n");
        for i in 0..60 {
            raw.push_str(&format!("X-H{i}: v{i}\r\n"));
        }
        raw.push_str("\r\n");
        let out = sent_default(&raw, &[]);
        for i in 0..60 {
            assert!(
                out.contains(&format!("X-H{i}: v{i}\r\n")),
                "X-H{i} missing: {out}"
            );
        }
    }

    /// The parse says whether the head has an `X-Accel-Redirect`, whatever its case; the
    /// proxy looks for the target only then.
    #[test]
    fn the_parse_notes_an_accel_redirect() {
        let accel = |raw: &str| match parse_response(raw.as_bytes(), 4096, false) {
            ResponseParse::Complete { head, .. } => head.accel_redirect,
            other => panic!("{other:?}"),
        };
        assert!(accel(
            "HTTP/1.1 200 OK\r\nX-Accel-Redirect: /in\r\nContent-Length: 0\r\n\r\n"
        ));
        assert!(accel(
            "HTTP/1.1 200 OK\r\nx-ACCEL-redirect: /in\r\nContent-Length: 0\r\n\r\n"
        ));
        assert!(!accel(
            "HTTP/1.1 200 OK\r\nX-Accel-Buffering: no\r\nContent-Length: 0\r\n\r\n"
        ));
        // Nothing read yet: more is needed.
        assert!(matches!(
            parse_response(b"", 4096, false),
            ResponseParse::Partial
        ));
    }

    #[test]
    fn uri_rules() {
        use LocationKind::{Exact, Prefix, PrefixNoRegex};
        #[rustfmt::skip]
        let table: &[(&str, LocationKind, &str, Option<&str>, &str)] = &[
            // No URI: the target as sent, unnormalized.
            ("/a/b?x=1", Prefix, "/a/", None, "/a/b?x=1"),
            ("/a//b/../c%20d?x", Prefix, "/a/", None, "/a//b/../c%20d?x"),
            ("/a?", Prefix, "/", None, "/a?"),
            ("/p#frag", Prefix, "/", None, "/p"),
            // Absolute form: path and query only.
            ("http://h.test/p/q?z", Prefix, "/", None, "/p/q?z"),
            ("HTTP://h.test:81", Prefix, "/", None, "/"),
            ("http://h.test?q=1", Prefix, "/", None, "/?q=1"),
            ("https://h.test/s", Prefix, "/", None, "/s"),
            // URI "/": the location prefix goes.
            ("/a/b?x=1", Prefix, "/a/", Some("/"), "/b?x=1"),
            ("/a/", Prefix, "/a/", Some("/"), "/"),
            // URI "/x/" with location "/a/".
            ("/a/b/c", Prefix, "/a/", Some("/x/"), "/x/b/c"),
            ("/a/", PrefixNoRegex, "/a/", Some("/x/"), "/x/"),
            ("/a//b/./c/../d", Prefix, "/a/", Some("/x/"), "/x/b/d"),
            // nginx replaces exactly the matched prefix: `location /a` + `/x/` doubles a slash.
            ("/a/b", Prefix, "/a", Some("/x/"), "/x//b"),
            ("/ab", Prefix, "/a", Some("/x"), "/xb"),
            // Exact locations replace the whole path.
            ("/exact?q", Exact, "/exact", Some("/other"), "/other?q"),
            ("/exact", Exact, "/exact", Some("/"), "/"),
            // Decoded bytes are escaped again; the query passes raw.
            ("/a/b%20c%3Fd%25e%23f", Prefix, "/a/", Some("/x/"), "/x/b%20c%3Fd%25e%23f"),
            ("/a/caf%C3%A9%22%7F%09", Prefix, "/a/", Some("/"), "/caf%C3%A9%22%7F%09"),
            ("/a/%7e%2b%26%3d", Prefix, "/a/", Some("/"), "/~+&="),
            ("/a/b?x=%20y&z", Prefix, "/a/", Some("/x/"), "/x/b?x=%20y&z"),
            // An empty query is dropped, as nginx (`r->args.len > 0`).
            ("/a/b?", Prefix, "/a/", Some("/x/"), "/x/b"),
            // Absolute form with a URI: the normalized path.
            ("http://h.test/a/b?q", Prefix, "/a/", Some("/x/"), "/x/b?q"),
            // The server's base location (path ""): joined with one slash.
            ("/a/b", Prefix, "", Some("/x/"), "/x/a/b"),
            ("/a/b", Prefix, "", Some("/x"), "/x/a/b"),
            ("/", Prefix, "", Some("/"), "/"),
        ];
        for &(target, kind, loc_path, pass_uri, want) in table {
            assert_eq!(
                uri(target, kind, loc_path, pass_uri),
                want,
                "{target} in {kind:?} {loc_path:?} to {pass_uri:?}"
            );
        }
    }

    #[test]
    fn uri_without_prefix_match_does_not_panic() {
        // A location that does not prefix the path (not produced by routing) still gives a URI.
        assert_eq!(
            uri("/other", LocationKind::Prefix, "/a/", Some("/x/")),
            "/x/other"
        );
        assert_eq!(
            uri("/other", LocationKind::Exact, "/a", Some("/x")),
            "/x/other"
        );
    }

    #[test]
    fn request_head_defaults_and_filtering() {
        let t = sent_default(
            "GET /p?q HTTP/1.1\r\nHost: Example.com\r\nConnection: keep-alive, X-Drop\r\n\
             X-Drop: 1\r\nKeep-Alive: 300\r\nTE: trailers\r\nUpgrade: websocket\r\n\
             Proxy-Connection: keep-alive\r\nExpect: 100-continue\r\nTrailer: X-T\r\n\
             Transfer-Encoding: chunked\r\nAccept: */*\r\nX-Forwarded-For: 10.0.0.1\r\n\
             Cookie: a=1\r\nCookie: b=2\r\n\r\n",
            &[],
        );
        assert_eq!(
            t,
            "GET /p?q HTTP/1.0\r\nHost: backend\r\nConnection: close\r\nAccept: */*\r\n\
             X-Forwarded-For: 10.0.0.1\r\nCookie: a=1\r\nCookie: b=2\r\n\r\n"
        );
    }

    #[test]
    fn retry_and_error_decisions() {
        use shard_config::NextUpstream;
        let nu = NextUpstream::DEFAULT;
        assert!(Failure::Error.retried_by(&nu) && Failure::Timeout.retried_by(&nu));
        assert!(!Failure::InvalidHeader.retried_by(&nu) && !Failure::Status(502).retried_by(&nu));
        assert_eq!(
            (Failure::Timeout.status(), Failure::Error.status()),
            (504, 502)
        );
        assert!(!Failure::Status(404).counts_against_peer());
        assert!(Failure::Status(502).counts_against_peer());
        // Not once the head went out; POST only before it was sent.
        assert!(!may_retry(true, false, &Method::Get, true));
        assert!(may_retry(false, true, &Method::Get, false));
        assert!(!may_retry(false, true, &Method::Post, false));
        assert!(may_retry(false, false, &Method::Post, false));
        assert!(may_retry(false, true, &Method::Post, true));
        assert!(error_keeps_connection(502, true, false));
        assert!(!error_keeps_connection(502, true, true));
        assert!(!error_keeps_connection(408, true, false));
        assert_eq!(
            client_framing(Framing::Close, true),
            (Framing::Chunked, true)
        );
        assert_eq!(
            client_framing(Framing::Chunked, false),
            (Framing::Close, false)
        );
        assert_eq!(
            client_framing(Framing::Length(3), false),
            (Framing::Length(3), true)
        );
    }

    #[test]
    fn invalid_header_names_are_not_forwarded() {
        let raw = "GET / HTTP/1.1\r\nHost: x\r\nX_Forwarded_For: 6.6.6.6\r\n\
                   Transfer_Encoding: chunked\r\nContent_Length: 5\r\nX-Ok: 1\r\n\r\n";
        let t = sent_default(raw, &[]);
        assert!(!t.contains('_'), "{t}");
        assert!(t.contains("X-Ok: 1\r\n"), "{t}");
        // With `ignore_invalid_headers off` they are ordinary unknown headers, as in nginx.
        let limits = Limits {
            names: crate::request::NamePolicy {
                underscores: false,
                ignore_invalid: false,
            },
            ..Limits::default()
        };
        let Parse::Complete { req: r, head_len } = parse(raw.as_bytes(), &limits) else {
            panic!()
        };
        assert_eq!(r.invalid_headers, 3);
        assert_eq!(r.body, crate::request::Body::None);
        let mut out = Vec::new();
        let l = location(LocationKind::Prefix, "/", &defaults());
        write_request(
            &mut out,
            &RequestCtx {
                req: &r,
                head: &raw.as_bytes()[..head_len],
                location: &l,
                pass: &pass(None),
                client: None,
                server_addr: "127.0.0.1:8080".parse().unwrap(),
                server_name: "example.com",
                body_len: None,
                body_chunked: false,
                conn: CONN,
                scope: Default::default(),
            },
        );
        let t = String::from_utf8(out).unwrap();
        assert!(t.contains("X_Forwarded_For: 6.6.6.6\r\n"), "{t}");
    }

    #[test]
    fn request_head_from_real_configuration() {
        let conf = shard_config::parse_str(
            "events {}\nhttp { server { listen 127.0.0.1:8080; server_name example.com;\n\
             location /a/ { proxy_pass http://127.0.0.1:9000/x/; proxy_http_version 1.1;\n\
             proxy_set_header X-Real-IP $remote_addr; } } }\n",
            "t.conf",
            Path::new("/nonexistent-conf"),
            Path::new("/pfx"),
            None,
        )
        .unwrap();
        let http = conf.http.as_ref().unwrap();
        let l = &http.servers[0].locations[0];
        let t = sent(Sent {
            raw: "GET /a/b%20c?k HTTP/1.1\r\nHost: h\r\nConnection: close\r\nAccept: */*\r\n\r\n",
            location: l,
            pass: l.proxy_pass.as_ref().unwrap(),
            client: Some("192.0.2.7:5555"),
            body_len: None,
        });
        let (host, conn) = (
            t.find("\r\nHost: 127.0.0.1:9000\r\n"),
            t.find("\r\nConnection: close\r\n"),
        );
        assert!(t.starts_with("GET /x/b%20c?k HTTP/1.1\r\n"), "{t}");
        assert!(host.is_some() && conn.is_some(), "{t}");
        assert!(t.contains("\r\nX-Real-IP: 192.0.2.7\r\n"), "{t}");
        assert!(t.ends_with("\r\nAccept: */*\r\n\r\n"), "{t}");
        assert_eq!(t.matches("Connection").count(), 1, "{t}");
        assert_eq!(t.matches("Host").count(), 1, "{t}");
    }

    #[test]
    fn request_head_variables() {
        let l = location(
            LocationKind::Prefix,
            "/a/",
            &[
                ("Host", vec![var(Var::Host)]),
                (
                    "X-All",
                    vec![
                        var(Var::Scheme),
                        lit(" "),
                        var(Var::RequestMethod),
                        lit(" "),
                        var(Var::ServerName),
                        lit(" "),
                        var(Var::ServerAddr),
                        lit(":"),
                        var(Var::ServerPort),
                        lit(" "),
                        var(Var::RemoteAddr),
                        lit(":"),
                        var(Var::RemotePort),
                        lit(" "),
                        var(Var::RequestUri),
                        lit(" "),
                        var(Var::Uri),
                        var(Var::IsArgs),
                        var(Var::Args),
                        lit(" "),
                        var(Var::ProxyHost),
                        lit(":"),
                        var(Var::ProxyPort),
                    ],
                ),
                ("X-Forwarded-For", vec![var(Var::ProxyAddXForwardedFor)]),
                ("X-UA", vec![var(Var::Http("user-agent".into()))]),
                (
                    "X-Multi",
                    vec![lit("<"), var(Var::Http("x-multi".into())), lit(">")],
                ),
                ("X-Missing", vec![var(Var::Http("x-missing".into()))]),
                ("Accept-Encoding", vec![]),
            ],
        );
        let p = ProxyPass {
            upstream: 3,
            uri: Some("/x/".into()),
            proxy_host: "up.test:9000".into(),
            proxy_port: 9000,
            tls: false,
            dynamic: None,
        };
        let t = sent(Sent {
            raw: "POST /a/%20b?k=v HTTP/1.1\r\nHost: H.test:8080\r\nUser-Agent: ua/1\r\n\
                  X-Forwarded-For: 10.0.0.1\r\nAccept-Encoding: gzip\r\nX-Multi: a\r\n\
                  x-forwarded-for: 10.0.0.2\r\nx-multi: b\r\nContent-Length: 3\r\n\r\n",
            location: &l,
            pass: &p,
            client: Some("192.0.2.7:5555"),
            body_len: Some(3),
        });
        assert_eq!(
            t,
            "POST /x/%20b?k=v HTTP/1.0\r\nHost: h.test\r\n\
             X-All: http POST example.com 127.0.0.1:8080 192.0.2.7:5555 /a/%20b?k=v /a/ b?k=v up.test:9000:9000\r\n\
             X-Forwarded-For: 10.0.0.1, 10.0.0.2, 192.0.2.7\r\nX-UA: ua/1\r\nX-Multi: <a, b>\r\n\
             User-Agent: ua/1\r\nContent-Length: 3\r\n\r\n"
        );
    }

    #[test]
    fn host_falls_back_to_server_name_and_args_vars_when_absent() {
        let l = location(
            LocationKind::Prefix,
            "/",
            &[
                ("Host", vec![var(Var::Host)]),
                (
                    "X-Q",
                    vec![lit("["), var(Var::IsArgs), var(Var::Args), lit("]")],
                ),
            ],
        );
        let send = |raw: &str| {
            sent(Sent {
                raw,
                location: &l,
                pass: &pass(None),
                client: None,
                body_len: None,
            })
        };
        assert_eq!(
            send("GET / HTTP/1.0\r\n\r\n"),
            "GET / HTTP/1.0\r\nHost: example.com\r\nX-Q: []\r\n\r\n"
        );
        assert_eq!(
            send("GET /?a=1 HTTP/1.0\r\n\r\n"),
            "GET /?a=1 HTTP/1.0\r\nHost: example.com\r\nX-Q: [?a=1]\r\n\r\n"
        );
        assert_eq!(
            send("GET http://abs.test/? HTTP/1.0\r\n\r\n"),
            "GET /? HTTP/1.0\r\nHost: abs.test\r\nX-Q: []\r\n\r\n"
        );
    }

    #[test]
    fn x_forwarded_for() {
        let xff = [("X-Forwarded-For", vec![var(Var::ProxyAddXForwardedFor)])];
        let l = location(LocationKind::Prefix, "/", &xff);
        let send = |raw: &str, client: Option<&str>| {
            sent(Sent {
                raw,
                location: &l,
                pass: &pass(None),
                client,
                body_len: None,
            })
        };
        let plain = "GET / HTTP/1.1\r\nHost: h\r\n\r\n";
        let with = "GET / HTTP/1.1\r\nHost: h\r\nX-Forwarded-For: 1.2.3.4\r\n\r\n";
        assert_eq!(
            send(plain, Some("192.0.2.7:1")),
            "GET / HTTP/1.0\r\nX-Forwarded-For: 192.0.2.7\r\n\r\n"
        );
        assert_eq!(
            send(with, Some("[::1]:1")),
            "GET / HTTP/1.0\r\nX-Forwarded-For: 1.2.3.4, ::1\r\n\r\n"
        );
        assert_eq!(
            send(with, None),
            "GET / HTTP/1.0\r\nX-Forwarded-For: 1.2.3.4\r\n\r\n"
        );
        assert_eq!(
            send(plain, None),
            "GET / HTTP/1.0\r\n\r\n",
            "empty: not sent"
        );
    }

    #[test]
    fn empty_value_drops_the_header_and_the_clients() {
        let t = sent_default(
            "GET / HTTP/1.1\r\nHost: h\r\nAccept-Encoding: gzip\r\nX-Keep: 1\r\n\r\n",
            &[
                ("Accept-Encoding", vec![lit("")]),
                ("X-Empty", vec![var(Var::Http("x-none".into()))]),
            ],
        );
        assert_eq!(
            t,
            "GET / HTTP/1.0\r\nHost: backend\r\nConnection: close\r\nX-Keep: 1\r\n\r\n"
        );
        // `proxy_set_header Connection ""` (keepalive upstreams): no Connection at all.
        let l = location(
            LocationKind::Prefix,
            "/",
            &[("Connection", vec![]), ("Host", vec![var(Var::Host)])],
        );
        let t = sent(Sent {
            raw: "GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n",
            location: &l,
            pass: &pass(None),
            client: None,
            body_len: None,
        });
        assert_eq!(t, "GET / HTTP/1.0\r\nHost: h\r\n\r\n");
    }

    #[test]
    fn hop_by_hop_named_in_connection_is_dropped() {
        let t = sent_default(
            "GET / HTTP/1.1\r\nHost: h\r\nConnection: X-A\r\nconnection: x-b ,, X-C\r\n\
             X-A: 1\r\nX-B: 2\r\nx-c: 3\r\nX-D: 4\r\n\r\n",
            &[],
        );
        assert_eq!(
            t,
            "GET / HTTP/1.0\r\nHost: backend\r\nConnection: close\r\nX-D: 4\r\n\r\n"
        );
    }

    #[test]
    fn content_length_is_shards() {
        let l = location(LocationKind::Prefix, "/", &defaults());
        let send = |raw: &str, body_len: Option<u64>| {
            sent(Sent {
                raw,
                location: &l,
                pass: &pass(None),
                client: None,
                body_len,
            })
        };
        let base = "HTTP/1.0\r\nHost: backend\r\nConnection: close\r\n";
        assert_eq!(
            send(
                "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n",
                Some(11)
            ),
            format!("POST / {base}Content-Length: 11\r\n\r\n")
        );
        assert_eq!(
            send(
                "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 0\r\n\r\n",
                Some(0)
            ),
            format!("POST / {base}Content-Length: 0\r\n\r\n")
        );
        assert_eq!(
            send(
                "GET / HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\n",
                None
            ),
            format!("GET / {base}\r\n")
        );
        // A configured Content-Length or Transfer-Encoding never competes with shard's.
        let l = location(
            LocationKind::Prefix,
            "/",
            &[
                ("Content-Length", vec![lit("99")]),
                ("transfer-encoding", vec![lit("chunked")]),
            ],
        );
        let t = sent(Sent {
            raw: "PUT / HTTP/1.1\r\nHost: h\r\nContent-Length: 2\r\n\r\n",
            location: &l,
            pass: &pass(None),
            client: None,
            body_len: Some(2),
        });
        assert_eq!(t, "PUT / HTTP/1.0\r\nContent-Length: 2\r\n\r\n");
    }

    #[test]
    fn request_line_version_method_and_leading_empty_lines() {
        let mut l = location(LocationKind::Prefix, "/", &[]);
        l.proxy.http_version_minor = 1;
        let t = sent(Sent {
            raw: "\r\n\r\nBREW /pot HTTP/1.0\r\nX: y\r\n\r\n",
            location: &l,
            pass: &pass(None),
            client: None,
            body_len: None,
        });
        assert_eq!(t, "BREW /pot HTTP/1.1\r\nX: y\r\n\r\n");
    }

    #[test]
    fn values_never_split_the_head() {
        let l = location(
            LocationKind::Prefix,
            "/",
            &[
                ("X-Inject", vec![lit("a\r\nEvil: 1\0")]),
                ("X-Evil\r\nName", vec![lit("v")]),
                ("X-Only-Controls", vec![lit("\r\n")]),
            ],
        );
        let t = sent(Sent {
            raw: "GET / HTTP/1.1\r\nHost: h\r\n\r\n",
            location: &l,
            pass: &pass(None),
            client: None,
            body_len: None,
        });
        assert_eq!(
            t,
            "GET / HTTP/1.0\r\nX-Inject: aEvil: 1\r\nX-EvilName: v\r\n\r\n"
        );
    }

    fn complete(raw: &str, head_request: bool) -> (ResponseHead, usize) {
        match parse_response(raw.as_bytes(), 4096, head_request) {
            ResponseParse::Complete { head, head_len } => (head, head_len),
            other => panic!("{raw:?}: {other:?}"),
        }
    }

    fn invalid(raw: &[u8], max: usize) -> &'static str {
        match parse_response(raw, max, false) {
            ResponseParse::Invalid(why) => why,
            other => panic!("{:?}: {other:?}", String::from_utf8_lossy(raw)),
        }
    }

    #[test]
    fn response_framing() {
        use Framing::{Chunked, Close, Length, None};
        #[rustfmt::skip]
        let table: &[(&str, bool, Framing, bool)] = &[
            ("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n", false, Length(5), true),
            ("HTTP/1.1 200 OK\r\nContent-Length:  0 \r\n\r\n", false, Length(0), true),
            ("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", false, Chunked, true),
            ("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, Chunked \r\n\r\n", false, Chunked, true),
            ("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\ntransfer-encoding: chunked\r\n\r\n", false, Chunked, true),
            ("HTTP/1.1 200 OK\r\n\r\n", false, Close, false),
            // No body, whatever the headers say.
            ("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n", true, None, true),
            ("HTTP/1.1 200 OK\r\n\r\n", true, None, true),
            ("HTTP/1.1 204 No Content\r\n\r\n", false, None, true),
            ("HTTP/1.1 304 Not Modified\r\nContent-Length: 10\r\n\r\n", false, None, true),
            ("HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n", false, None, false),
            // Identical repeats are one length.
            ("HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n", false, Length(5), true),
            ("HTTP/1.1 200 OK\r\nContent-Length: 5\r\ncontent-length:  005\r\n\r\n", false, Length(5), true),
            // Persistence.
            ("HTTP/1.0 200 OK\r\nContent-Length: 5\r\n\r\n", false, Length(5), false),
            ("HTTP/1.0 200 OK\r\nConnection: Keep-Alive\r\nContent-Length: 5\r\n\r\n", false, Length(5), true),
            ("HTTP/1.0 200 OK\r\nConnection: foo, keep-alive\r\nContent-Length: 5\r\n\r\n", false, Length(5), true),
            ("HTTP/1.0 200 OK\r\nConnection: keep-alive\r\n\r\n", false, Close, false),
            ("HTTP/1.0 200 OK\r\nConnection: keep-alive, close\r\nContent-Length: 5\r\n\r\n", false, Length(5), false),
            ("HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 5\r\n\r\n", false, Length(5), false),
            ("HTTP/1.1 200 OK\r\nConnection: foo\r\nConnection: CLOSE\r\nTransfer-Encoding: chunked\r\n\r\n", false, Chunked, false),
            ("HTTP/1.1 200 OK\r\nConnection: keep-alive\r\nContent-Length: 1\r\n\r\n", false, Length(1), true),
            // Bare LF line ends.
            ("HTTP/1.1 404 Not Found\nContent-Length: 9\n\n", false, Length(9), true),
        ];
        for &(raw, head_request, framing, reusable) in table {
            let (h, n) = complete(raw, head_request);
            assert_eq!(n, raw.len(), "{raw:?}");
            assert_eq!(
                (h.framing, h.reusable),
                (framing, reusable),
                "{raw:?} HEAD={head_request}"
            );
        }
    }

    #[test]
    fn invalid_content_length() {
        for v in [
            "abc",
            "-1",
            "",
            " ",
            "5, 5",
            "1 2",
            "+5",
            "0x5",
            "99999999999999999999",
            "9223372036854775808",
        ] {
            let raw = format!("HTTP/1.1 200 OK\r\nContent-Length: {v}\r\n\r\n");
            assert_eq!(invalid(raw.as_bytes(), 4096), INVALID_LENGTH, "{v:?}");
        }
        assert_eq!(
            invalid(
                b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
                4096
            ),
            INVALID_LENGTH
        );
        let (h, _) = complete(
            "HTTP/1.1 200 OK\r\nContent-Length: 9223372036854775807\r\n\r\n",
            false,
        );
        assert_eq!(h.framing, Framing::Length(i64::MAX as u64));
    }

    #[test]
    fn upgrade_only_when_asked() {
        let raw = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: x\r\nServer: up\r\n\r\nFRAME";
        let ResponseParse::Complete { head, head_len } =
            parse_response_passing(raw, 4096, false, &[], true)
        else {
            panic!("an asked-for 101 is complete");
        };
        assert_eq!(head_len, raw.len() - 5);
        assert_eq!(
            (head.status, head.framing, head.reusable),
            (101, Framing::None, false)
        );
        let names: Vec<&str> = head.headers.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["Upgrade", "Sec-WebSocket-Accept"]);
        let mut out = Vec::new();
        write_client_head(&mut out, &head, b"D", Framing::None, true, b"shard", b"");
        let text = String::from_utf8(out).unwrap();
        assert!(text.contains("\r\nUpgrade: websocket\r\n"), "{text}");
        assert!(text.contains("\r\nConnection: upgrade\r\n"), "{text}");
        assert!(
            !text.contains("Content-Length") && !text.contains("keep-alive"),
            "{text}"
        );

        assert!(upgrade_requested(
            b"GET / HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n"
        ));
        assert!(upgrade_requested(
            b"GET / HTTP/1.1\r\nupgrade:websocket\r\n\r\nbody"
        ));
        assert!(!upgrade_requested(
            b"GET / HTTP/1.0\r\nUpgrade: websocket\r\n\r\n"
        ));
        assert!(!upgrade_requested(
            b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"
        ));
        assert!(!upgrade_requested(b"GET / HTTP/1.1\r\nUpgrade:  \r\n\r\n"));
        assert!(!upgrade_requested(
            b"GET / HTTP/1.1\r\nX: 1\r\n\r\nUpgrade: websocket\r\n"
        ));
    }

    #[test]
    fn interim_and_upgrade() {
        let raw = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n";
        let ResponseParse::Interim { head_len } = parse_response(raw, 4096, false) else {
            panic!("100 is interim");
        };
        assert_eq!(head_len, 25);
        let (h, n) = complete(std::str::from_utf8(&raw[head_len..]).unwrap(), false);
        assert_eq!(
            (h.status, h.framing, n),
            (200, Framing::Length(0), raw.len() - 25)
        );
        let raw = b"HTTP/1.1 103 Early Hints\r\nLink: </s.css>\r\n\r\n";
        assert!(matches!(
            parse_response(raw, 4096, true),
            ResponseParse::Interim { head_len } if head_len == raw.len()
        ));
        assert_eq!(
            invalid(
                b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n",
                4096
            ),
            UNEXPECTED_101
        );
    }

    #[test]
    fn partial_and_too_big() {
        for raw in [
            &b""[..],
            b"H",
            b"HTTP/1.",
            b"HTTP/1.1 2",
            b"HTTP/1.1 200 OK\r\n",
            b"HTTP/1.1 200 OK\r\nA: b\r\n\r",
        ] {
            assert!(
                matches!(parse_response(raw, 4096, false), ResponseParse::Partial),
                "{:?}",
                String::from_utf8_lossy(raw)
            );
        }
        let head = b"HTTP/1.1 200 OK\r\nX-Long: aaaaaaaaaa\r\n\r\n";
        // Exactly `max` is fine; one byte less is too big, complete or not.
        assert!(matches!(
            parse_response(head, head.len(), false),
            ResponseParse::Complete { .. }
        ));
        assert_eq!(invalid(head, head.len() - 1), TOO_BIG_HEADER);
        assert_eq!(invalid(&head[..20], 20), TOO_BIG_HEADER);
        assert!(matches!(
            parse_response(&head[..20], 21, false),
            ResponseParse::Partial
        ));
        // 100 headers are accepted, 101 are too many.
        let many = |n: usize| format!("HTTP/1.1 200 OK\r\n{}\r\n", "X-A: b\r\n".repeat(n));
        assert!(matches!(
            parse_response(many(100).as_bytes(), 1 << 20, false),
            ResponseParse::Complete { .. }
        ));
        assert_eq!(invalid(many(101).as_bytes(), 1 << 20), TOO_BIG_HEADER);
    }

    #[test]
    fn garbage_is_invalid() {
        for raw in [
            &b"garbage\r\n\r\n"[..],
            b"\x16\x03\x01\x02\x00",
            b"HTTP/2 200\r\n\r\n",
            b"HTTP/1.2 200 OK\r\n\r\n",
            b"HTTP/2.0 200 OK\r\n\r\n",
            b"HTTP/1.1 abc OK\r\n\r\n",
            b"HTTP/1.1 20 OK\r\n\r\n",
            b"HTTP/1.1 099 Low\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nBad Header\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nX: a\r\n folded\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nX: a\0b\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nX : a\r\n\r\n",
        ] {
            assert_eq!(
                invalid(raw, 4096),
                INVALID_HEADER,
                "{:?}",
                String::from_utf8_lossy(raw)
            );
        }
    }

    #[test]
    fn response_headers_passed_on() {
        let raw = "HTTP/1.1 200 OK\r\nServer: up/1\r\nDate: yesterday\r\n\
                   Connection: keep-alive, X-Hop\r\nX-Hop: 1\r\nKeep-Alive: timeout=5\r\n\
                   Content-Type: text/plain\r\nSet-Cookie: a=1\r\nTE: x\r\nTrailer: X-T\r\n\
                   Upgrade: h2c\r\nProxy-Connection: close\r\nX-Pad: avoid browser bug\r\n\
                   X-Accel-Redirect: /internal\r\nset-cookie: b=2\r\n\
                   Transfer-Encoding: chunked\r\nX-Accel: not a directive\r\n\r\nbody";
        let (h, n) = complete(raw, false);
        assert_eq!(n, raw.len() - 4);
        assert_eq!((h.status, h.minor), (200, 1));
        let names: Vec<(&str, &[u8])> = h
            .headers
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_slice()))
            .collect();
        assert_eq!(
            names,
            [
                ("Content-Type", &b"text/plain"[..]),
                ("Set-Cookie", b"a=1"),
                ("set-cookie", b"b=2"),
                ("X-Accel", b"not a directive"),
            ]
        );
    }

    #[test]
    fn head_response_keeps_its_content_length() {
        let raw = "HTTP/1.1 200 OK\r\nContent-Length: 1234\r\nContent-Length: 1234\r\nETag: \"e\"\r\n\r\n";
        let (h, _) = complete(raw, true);
        assert_eq!(h.framing, Framing::None);
        assert_eq!(
            h.headers,
            [
                ("Content-Length".to_string(), b"1234".to_vec()),
                ("ETag".to_string(), b"\"e\"".to_vec()),
            ]
        );
        let (h, _) = complete(raw, false);
        assert_eq!(h.headers, [("ETag".to_string(), b"\"e\"".to_vec())]);
        assert!(matches!(
            parse_response(
                b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
                4096,
                true
            ),
            ResponseParse::Invalid(_)
        ));
    }

    fn client_head(framing: Framing, keep_alive: bool, status: u16) -> String {
        let head = ResponseHead {
            status,
            minor: 1,
            framing: Framing::Close,
            reusable: false,
            headers: vec![
                ("Content-Type".into(), b"text/html".to_vec()),
                ("X-Bad".into(), b"a\r\nInjected: 1".to_vec()),
            ],
            accel_redirect: false,
            accel_limit_rate: false,
            accel_charset: false,
        };
        let mut out = b"[".to_vec();
        write_client_head(
            &mut out,
            &head,
            b"Sun, 06 Nov 1994 08:49:37 GMT",
            framing,
            keep_alive,
            b"shard",
            b"",
        );
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn client_heads() {
        let start = "[HTTP/1.1 200 OK\r\nServer: shard\r\nDate: Sun, 06 Nov 1994 08:49:37 GMT\r\n\
                     Content-Type: text/html\r\nX-Bad: aInjected: 1\r\n";
        assert_eq!(
            client_head(Framing::Length(42), true, 200),
            format!("{start}Content-Length: 42\r\nConnection: keep-alive\r\n\r\n")
        );
        assert_eq!(
            client_head(Framing::Length(0), false, 200),
            format!("{start}Content-Length: 0\r\nConnection: close\r\n\r\n")
        );
        assert_eq!(
            client_head(Framing::Chunked, true, 200),
            format!("{start}Transfer-Encoding: chunked\r\nConnection: keep-alive\r\n\r\n")
        );
        assert_eq!(
            client_head(Framing::None, true, 200),
            format!("{start}Connection: keep-alive\r\n\r\n")
        );
        assert_eq!(
            client_head(Framing::Close, false, 200),
            format!("{start}Connection: close\r\n\r\n")
        );
        // A code without a reason phrase keeps the space, as `response::write_head`.
        assert!(client_head(Framing::None, false, 299)
            .starts_with("[HTTP/1.1 299 \r\nServer: shard\r\n"));
        assert!(
            client_head(Framing::None, false, 304).starts_with("[HTTP/1.1 304 Not Modified\r\n")
        );
    }

    #[test]
    fn chunks() {
        let mut out = Vec::new();
        write_chunk(&mut out, b"");
        assert!(out.is_empty(), "an empty chunk would end the body");
        write_chunk(&mut out, b"hello");
        write_chunk(&mut out, &[b'x'; 26]);
        out.extend_from_slice(LAST_CHUNK);
        let mut want = b"5\r\nhello\r\n1a\r\n".to_vec();
        want.extend_from_slice(&[b'x'; 26]);
        want.extend_from_slice(b"\r\n0\r\n\r\n");
        assert_eq!(out, want);
        let mut big = Vec::new();
        write_chunk(&mut big, &vec![0u8; 0x10000]);
        assert!(big.starts_with(b"10000\r\n\0"));
        // What shard writes, shard's own decoder reads back.
        let mut d = crate::body::ChunkedDecoder::new();
        let mut payload = Vec::new();
        let f = d.feed_into(&out, &mut payload).unwrap();
        assert!(d.is_done());
        assert_eq!((f.consumed, payload.len()), (out.len(), 31));
    }

    struct Rng(u64);

    impl Rng {
        fn below(&mut self, n: usize) -> usize {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            (self.0 % n.max(1) as u64) as usize
        }
    }

    fn mutate(rng: &mut Rng, seed: &[u8]) -> Vec<u8> {
        const SPECIALS: &[u8] = b"\r\n :,%/.?#\0\x7f\xff\t;-0123456789chunkedclose";
        let mut v = seed.to_vec();
        for _ in 0..rng.below(5) {
            let pos = rng.below(v.len() + 1);
            match rng.below(4) {
                0 if pos < v.len() => v[pos] = SPECIALS[rng.below(SPECIALS.len())],
                1 if pos < v.len() => {
                    v.remove(pos);
                }
                2 => v.insert(pos, SPECIALS[rng.below(SPECIALS.len())]),
                _ => v.truncate(pos),
            }
        }
        v
    }

    /// Random and mutated heads never panic, and whatever the client sent, the upstream head
    /// shard writes parses back as one request with the same method.
    #[test]
    fn never_panics_and_always_writes_one_head() {
        let mut rng = Rng(0x2545_f491_4f6c_dd1d);
        let responses: &[&[u8]] = &[
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close, X-A\r\nX-A: 1\r\n\r\nhello",
            b"HTTP/1.0 100 Continue\r\n\r\nHTTP/1.1 304 Not Modified\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
        ];
        for i in 0..20_000 {
            let raw = mutate(&mut rng, responses[i % responses.len()]);
            let _ = parse_response(&raw, rng.below(200), i % 3 == 0);
        }
        let requests: &[&[u8]] = &[
            b"GET /a/b%20c/../d?x=1 HTTP/1.1\r\nHost: h\r\nConnection: keep-alive, X-A\r\nX-A: 1\r\nX-Forwarded-For: 1.1.1.1\r\n\r\n",
            b"POST http://h.test/a?q HTTP/1.0\r\nContent-Length: 3\r\nUser-Agent: u\r\n\r\n",
        ];
        let l = location(
            LocationKind::Prefix,
            "/a",
            &[
                ("Host", vec![var(Var::Host)]),
                ("X-F", vec![var(Var::ProxyAddXForwardedFor)]),
                (
                    "X-U",
                    vec![var(Var::RequestUri), var(Var::Http("user-agent".into()))],
                ),
            ],
        );
        let passes = [pass(None), pass(Some("/x/")), pass(Some("/"))];
        let mut checked = 0;
        for i in 0..20_000 {
            let raw = mutate(&mut rng, requests[i % requests.len()]);
            let Parse::Complete { req: r, head_len } = parse(&raw, &Limits::default()) else {
                continue;
            };
            let mut out = Vec::new();
            write_request(
                &mut out,
                &RequestCtx {
                    req: &r,
                    head: &raw[..head_len],
                    location: &l,
                    pass: &passes[i % passes.len()],
                    client: Some("[2001:db8::1]:9".parse().unwrap()),
                    server_addr: "127.0.0.1:80".parse().unwrap(),
                    server_name: "s",
                    body_len: (i % 2 == 0).then_some(7),
                    body_chunked: false,
                    conn: CONN,
                    scope: Default::default(),
                },
            );
            let mut hs = [httparse::EMPTY_HEADER; 128];
            let mut back = httparse::Request::new(&mut hs);
            let n = match back.parse(&out) {
                Ok(httparse::Status::Complete(n)) => n,
                other => panic!(
                    "{:?} gave {:?}: {other:?}",
                    String::from_utf8_lossy(&raw),
                    String::from_utf8_lossy(&out)
                ),
            };
            assert_eq!(n, out.len());
            assert_eq!(back.method, Some(r.method.as_str()));
            checked += 1;
        }
        assert!(checked > 1000, "only {checked} requests parsed");
    }
}
