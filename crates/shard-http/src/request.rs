//! Request heads: bytes in, a validated [`Request`] (or the nginx status to refuse it) out.
//!
//! This module owns the request line, the header section, their size limits
//! (`client_header_buffer_size` / `large_client_header_buffers`), URI decoding and
//! normalization, `Host` validation, keep-alive and body framing decisions. It does not read
//! bodies (see [`crate::body`]), choose servers or locations (see [`crate::route`]) or enforce
//! `client_max_body_size` (the caller knows the location).
//!
//! Statuses follow nginx: malformed input is 400, a request line that does not fit in one large
//! buffer is 414, a header line or section that does not fit is 431 (nginx says 400 "Request
//! Header Or Cookie Too Large"), an unsupported HTTP major version is 505, an unknown
//! `Transfer-Encoding` is 501, and `TRACE` or `CONNECT` is 405.
//!
//! `httparse` tokenizes the header section; nginx is stricter than it in places, and this
//! module tightens after it, so that nothing nginx refuses is served or proxied:
//! - a header whose name nginx calls invalid (anything but `[A-Za-z0-9-]`, plus `_` with
//!   `underscores_in_headers on`) is never interpreted, and with `ignore_invalid_headers on`
//!   (the default) it is dropped: `Transfer_Encoding` never frames a body nor reaches an
//!   upstream ([`header_name_forwarded`]);
//! - headers nginx keeps once (`Host`, `Content-Length`, `Transfer-Encoding`, `Expect`,
//!   `Authorization`, `Content-Range`, the `If-*` preconditions) are refused when repeated;
//! - `Content-Length` and `Transfer-Encoding` values are trimmed of spaces only: a tab left in
//!   them is refused (400 and 501), whatever `httparse` trimmed;
//! - an absolute-form target's authority must be `[A-Za-z0-9.-]+` or an IP literal, with an
//!   optional numeric port;
//! - the version's major number must not start with `0`.

use memchr::memchr;

/// Most header lines one request may carry; more is 431.
pub const MAX_HEADERS: usize = 100;
/// Header lines parsed into a stack array before the full [`MAX_HEADERS`] one is tried.
const FEW_HEADERS: usize = 24;
/// Longest method accepted.
const MAX_METHOD: usize = 32;

/// Header size limits and header-name rules, as configured per server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// `client_header_buffer_size`.
    pub header_buffer_size: usize,
    /// `large_client_header_buffers` count.
    pub large_buffers: usize,
    /// `large_client_header_buffers` size: the longest request line or header line.
    pub large_buffer_size: usize,
    pub names: NamePolicy,
    /// `merge_slashes on|off`: `//` in a path is one `/`. Default on.
    pub merge_slashes: bool,
}

/// `underscores_in_headers` and `ignore_invalid_headers`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NamePolicy {
    pub underscores: bool,
    pub ignore_invalid: bool,
}

impl Default for NamePolicy {
    fn default() -> Self {
        NamePolicy {
            underscores: false,
            ignore_invalid: true,
        }
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            header_buffer_size: 1024,
            large_buffers: 4,
            large_buffer_size: 8192,
            names: NamePolicy::default(),
            merge_slashes: true,
        }
    }
}

/// Whether nginx calls a header name valid: letters, digits and `-`, and `_` when
/// `underscores_in_headers` is on.
pub fn header_name_valid(name: &[u8], underscores: bool) -> bool {
    // One table look per byte (every header line of every request passes here).
    const fn table(underscores: bool) -> [bool; 256] {
        let mut t = [false; 256];
        let mut c = 0;
        while c < 256 {
            let b = c as u8;
            t[c] = b.is_ascii_alphanumeric() || b == b'-' || (b == b'_' && underscores);
            c += 1;
        }
        t
    }
    static PLAIN: [bool; 256] = table(false);
    static UNDERSCORES: [bool; 256] = table(true);
    let t = if underscores { &UNDERSCORES } else { &PLAIN };
    !name.is_empty() && name.iter().all(|&c| t[c as usize])
}

/// Whether a client header line is passed on (to an upstream): not when its name is invalid
/// and `ignore_invalid_headers` is on.
pub fn header_name_forwarded(name: &[u8], policy: NamePolicy) -> bool {
    !policy.ignore_invalid || header_name_valid(name, policy.underscores)
}

/// Headers nginx refuses to see twice (`ngx_http_process_unique_header_line`, and Host).
const UNIQUE_HEADERS: [&str; 11] = [
    "host",
    "content-length",
    "transfer-encoding",
    "expect",
    "authorization",
    "content-range",
    "if-modified-since",
    "if-unmodified-since",
    "if-match",
    "if-none-match",
    "if-range",
];

/// Bit `n` set: some name in [`UNIQUE_HEADERS`] is `n` bytes long (all are under 32).
const UNIQUE_HEADER_LENGTHS: u32 = {
    let mut m = 0u32;
    let mut i = 0;
    while i < UNIQUE_HEADERS.len() {
        m |= 1 << UNIQUE_HEADERS[i].len();
        i += 1;
    }
    m
};

impl Limits {
    /// Longest single line (request line or header line, terminator included).
    fn line_max(&self) -> usize {
        if self.large_buffer_size == 0 {
            self.header_buffer_size.max(1)
        } else {
            self.large_buffer_size
        }
    }

    /// Longest head. The caller stops reading at `large_buffers * large_buffer_size`, so a head
    /// still incomplete at that size must be refused here rather than waited for.
    pub fn head_max(&self) -> usize {
        let large = self.large_buffers.saturating_mul(self.large_buffer_size);
        if large == 0 {
            self.header_buffer_size.max(1)
        } else {
            large
        }
    }
}

/// Why a request was refused: the status to answer with and a short text for the error log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reject {
    pub status: u16,
    pub reason: &'static str,
}

const fn reject(status: u16, reason: &'static str) -> Reject {
    Reject { status, reason }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Method {
    Get,
    Head,
    Post,
    Put,
    Delete,
    Options,
    Patch,
    Other(String),
}

impl Method {
    fn from_bytes(b: &[u8]) -> Method {
        match b {
            b"GET" => Method::Get,
            b"HEAD" => Method::Head,
            b"POST" => Method::Post,
            b"PUT" => Method::Put,
            b"DELETE" => Method::Delete,
            b"OPTIONS" => Method::Options,
            b"PATCH" => Method::Patch,
            // Only A-Z, '_' and '-' get here: always ASCII.
            other => Method::Other(String::from_utf8_lossy(other).into_owned()),
        }
    }

    /// Whether a request may be sent again after it reached an upstream (nginx: everything
    /// but POST, LOCK and PATCH).
    pub fn is_idempotent(&self) -> bool {
        !matches!(self, Method::Post | Method::Patch)
            && !matches!(self, Method::Other(s) if s == "LOCK")
    }

    pub fn as_str(&self) -> &str {
        match self {
            Method::Get => "GET",
            Method::Head => "HEAD",
            Method::Post => "POST",
            Method::Put => "PUT",
            Method::Delete => "DELETE",
            Method::Options => "OPTIONS",
            Method::Patch => "PATCH",
            Method::Other(s) => s,
        }
    }
}

/// How the request body is framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Body {
    None,
    Length(u64),
    Chunked,
}

/// A parsed, validated request head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub method: Method,
    /// The request line as received, without its line terminator (`$request`).
    pub request_line: String,
    /// The request target as received.
    pub target: String,
    /// Percent-decoded, dot segments resolved, slashes merged; always starts with `/`.
    pub path: String,
    /// The raw query string, without `?`.
    pub query: Option<String>,
    /// `1` for HTTP/1.1, `0` for HTTP/1.0.
    pub minor_version: u8,
    /// The request came on an HTTP/2 stream (`$server_protocol` is `HTTP/2.0`); its head
    /// was given as HTTP/1.1.
    pub http2: bool,
    /// The request came on an HTTP/3 stream (`HTTP/3.0`; `http2` is set too, since every
    /// HTTP/2 rule about a request given as HTTP/1.1 holds for it).
    pub http3: bool,
    /// The request is the `error_page` of a request refused while its head was read: it
    /// starts with nginx's error-page state (no further error page, and this status for a
    /// page that succeeds). `None` for every request a client sent.
    pub head_error_page: Option<Option<u16>>,
    /// From an absolute-form target, else the `Host` header: lowercase, port and trailing dot
    /// removed.
    pub host: Option<String>,
    /// A `Host` header was sent (`host_as_sent`).
    pub host_header: bool,
    /// The `Host` header as sent, when that is not `host` (a port, capitals, a trailing dot,
    /// or an absolute-form target's other host): what nginx's error log writes.
    pub host_raw: Option<String>,
    pub keep_alive: bool,
    pub body: Body,
    pub if_modified_since: Option<String>,
    pub if_none_match: Option<String>,
    /// `If-Match` and `If-Unmodified-Since` (nginx's 412).
    pub if_match: Option<String>,
    pub if_unmodified_since: Option<String>,
    pub range: Option<String>,
    /// `If-Range`: the `Range` holds only for this validator (an HTTP date or an entity tag).
    pub if_range: Option<String>,
    pub user_agent: Option<String>,
    pub referer: Option<String>,
    /// `Accept-Encoding`, the first one received.
    pub accept_encoding: Option<String>,
    /// `Expect: 100-continue` on an HTTP/1.1 request with a body: the client waits for a
    /// `100 Continue` before it sends the body.
    pub expect_continue: bool,
    /// Header lines whose name is invalid (see [`header_name_valid`]): not interpreted, and
    /// dropped when `names.ignore_invalid`. The caller logs them.
    pub invalid_headers: usize,
    /// The rules the head was read with; the proxy filters the raw head with them.
    pub names: NamePolicy,
    /// `path` (and `query`) were changed by an internal redirect (`try_files`, `error_page`):
    /// a `proxy_pass` without a URI then sends them, not the target as received.
    pub uri_changed: bool,
    /// nginx's `valid_location` cleared: a `break` (the directive or the `rewrite` flag)
    /// kept a URI that a `rewrite` changed in the location, so a `proxy_pass` with a URI
    /// sends the changed URI whole instead of replacing the location's part. Cleared when a
    /// location is searched again.
    pub location_left: bool,
    /// `try_files` found the file under a regex location's `alias`: the URI is appended to
    /// the alias rather than the alias being the file (nginx's `add_uri_to_alias`).
    pub add_uri_to_alias: bool,
    /// A `Via` header came (the request passed a proxy: `gzip_proxied`).
    pub via: bool,
    /// An `Authorization` header came (`gzip_proxied auth`).
    pub authorization: bool,
    /// The head's length as received, line ends as the client sent them (`$request_length`).
    pub head_len: usize,
}

/// The longest `$request` kept for a request refused before its head was parsed.
const UNPARSED_LINE_MAX: usize = 8192;

impl Request {
    /// What the access log sees of a request refused before its head was parsed (nginx logs
    /// those too): `$request` is its first line as far as it was received, up to CR or LF
    /// (nginx's `ngx_http_variable_request_line` for such a request); `$uri` is empty.
    /// The `Host` header as the client sent it (nginx's error log writes this), if it sent one.
    pub fn host_as_sent(&self) -> Option<&str> {
        if !self.host_header {
            return None;
        }
        self.host_raw.as_deref().or(self.host.as_deref())
    }

    pub fn unparsed(input: &[u8]) -> Request {
        // Leading empty lines are skipped before a request line, as when parsing.
        let start = input
            .iter()
            .position(|&b| b != b'\r' && b != b'\n')
            .unwrap_or(input.len());
        let rest = &input[start..];
        let end = memchr::memchr2(b'\r', b'\n', rest)
            .unwrap_or(rest.len())
            .min(UNPARSED_LINE_MAX);
        let line = &rest[..end];
        let method = line.split(|&b| b == b' ').next().unwrap_or(b"");
        let method = if !method.is_empty()
            && method
                .iter()
                .all(|&b| b.is_ascii_uppercase() || b == b'_' || b == b'-')
        {
            Method::from_bytes(method)
        } else {
            Method::Other(String::new())
        };
        Request {
            method,
            request_line: owned(line),
            target: String::new(),
            path: String::new(),
            query: None,
            minor_version: 0,
            http2: false,
            http3: false,
            head_error_page: None,
            host: None,
            host_header: false,
            host_raw: None,
            keep_alive: false,
            body: Body::None,
            if_modified_since: None,
            if_none_match: None,
            if_match: None,
            if_unmodified_since: None,
            if_range: None,
            range: None,
            user_agent: None,
            referer: None,
            accept_encoding: None,
            expect_continue: false,
            invalid_headers: 0,
            names: NamePolicy::default(),
            uri_changed: false,
            location_left: false,
            add_uri_to_alias: false,
            via: false,
            authorization: false,
            head_len: 0,
        }
    }
}

// `Complete` is much larger than the others; the caller takes the request by value and
// parse results are short-lived, so boxing would only add an allocation.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Parse {
    /// A whole head: the request and how many bytes of the buffer it used.
    Complete {
        req: Request,
        head_len: usize,
    },
    /// Not enough bytes yet, and still within the limits.
    Partial,
    Error(Reject),
}

fn is_method_byte(b: u8) -> bool {
    b.is_ascii_uppercase() || b == b'_' || b == b'-'
}

fn is_target_byte(b: u8) -> bool {
    b > 0x20 && b != 0x7f
}

/// Checks the start of a request line that has no terminator yet, so garbage is refused at
/// once instead of after a timeout.
fn check_partial_line(line: &[u8]) -> Result<(), Reject> {
    let mut i = 0;
    while i < line.len() && is_method_byte(line[i]) {
        i += 1;
    }
    if i > MAX_METHOD {
        return Err(reject(400, "invalid method"));
    }
    if i == line.len() {
        return Ok(());
    }
    if line[i] != b' ' || i == 0 {
        return Err(reject(400, "invalid method"));
    }
    while i < line.len() && line[i] == b' ' {
        i += 1;
    }
    while i < line.len() && line[i] != b' ' {
        let final_cr = line[i] == b'\r' && i + 1 == line.len();
        if !is_target_byte(line[i]) && !final_cr {
            return Err(reject(400, "invalid request target"));
        }
        i += 1;
    }
    Ok(())
}

struct Line<'a> {
    method: &'a [u8],
    target: &'a [u8],
    minor: u8,
}

fn parse_version(v: &[u8]) -> Result<u8, Reject> {
    let bad = reject(400, "invalid HTTP version");
    let Some(rest) = v.strip_prefix(b"HTTP/") else {
        return Err(bad);
    };
    let Some(dot) = memchr(b'.', rest) else {
        return Err(bad);
    };
    let (maj, min) = (&rest[..dot], &rest[dot + 1..]);
    // As nginx: the major number starts with 1-9 (`HTTP/01.1` and `HTTP/0.9` are 400); the
    // minor may have leading zeros.
    if !matches!(maj.first(), Some(b'1'..=b'9')) {
        return Err(bad);
    }
    let num = |d: &[u8]| -> Option<u32> {
        if d.is_empty() || d.len() > 3 || !d.iter().all(u8::is_ascii_digit) {
            return None;
        }
        Some(d.iter().fold(0u32, |a, &c| a * 10 + u32::from(c - b'0')))
    };
    let (Some(maj), Some(min)) = (num(maj), num(min)) else {
        return Err(bad);
    };
    if maj != 1 {
        return Err(reject(505, "unsupported HTTP version"));
    }
    // nginx takes minor versions up to 999; shard refuses those above 99 (stricter).
    if min > 99 {
        return Err(bad);
    }
    Ok(min as u8)
}

fn parse_line(line: &[u8]) -> Result<Line<'_>, Reject> {
    let mut i = 0;
    while i < line.len() && is_method_byte(line[i]) {
        i += 1;
    }
    if i == 0 || i > MAX_METHOD || i == line.len() || line[i] != b' ' {
        return Err(reject(400, "invalid method"));
    }
    let method = &line[..i];
    while i < line.len() && line[i] == b' ' {
        i += 1;
    }
    let t0 = i;
    while i < line.len() && line[i] != b' ' {
        if !is_target_byte(line[i]) {
            return Err(reject(400, "invalid request target"));
        }
        i += 1;
    }
    let target = &line[t0..i];
    if target.is_empty() {
        return Err(reject(400, "invalid request target"));
    }
    // nginx reads the target before the version: one that is neither a path nor a scheme
    // (`*`, the h2c preface's `PRI * HTTP/2.0`) is 400 whatever the version says.
    let first = target[0];
    if first != b'/'
        && !first.is_ascii_alphabetic()
        && !(method == b"CONNECT" && first.is_ascii_digit())
    {
        return Err(reject(400, "invalid request target"));
    }
    while i < line.len() && line[i] == b' ' {
        i += 1;
    }
    let mut end = line.len();
    while end > i && line[end - 1] == b' ' {
        end -= 1;
    }
    let version = &line[i..end];
    if version.is_empty() {
        return Err(reject(505, "HTTP/0.9 is not supported"));
    }
    Ok(Line {
        method,
        target,
        minor: parse_version(version)?,
    })
}

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// Whether `raw` is already what [`normalize_path`] makes of it: it starts with `/` and holds
/// no escape, no NUL, no empty segment and no segment that starts with a dot.
fn plain_path(raw: &[u8]) -> bool {
    if raw.first() != Some(&b'/') {
        return false;
    }
    let mut after_slash = false;
    for &c in raw {
        match c {
            b'%' | 0 => return false,
            b'/' | b'.' if after_slash => return false,
            _ => {}
        }
        after_slash = c == b'/';
    }
    true
}

/// Percent-decodes `raw` (which starts with `/`) and resolves `.`, `..` and empty segments.
pub fn normalize_path(raw: &[u8]) -> Result<String, Reject> {
    // Most paths need nothing done: no escape, no empty, `.` or `..` segment (a segment that
    // starts with a dot takes the long way, whatever it is).
    if plain_path(raw) {
        if let Ok(s) = std::str::from_utf8(raw) {
            return Ok(s.to_string());
        }
    }
    normalize_path_long(raw)
}

/// [`normalize_path`] with `merge_slashes off`: an empty segment (`//`) is kept, and `..`
/// takes it away like any other.
pub fn normalize_path_keep_slashes(raw: &[u8]) -> Result<String, Reject> {
    normalize_path_segments(raw, false)
}

/// [`normalize_path`] step by step: decode, then resolve the segments.
fn normalize_path_long(raw: &[u8]) -> Result<String, Reject> {
    normalize_path_segments(raw, true)
}

fn normalize_path_segments(raw: &[u8], merge: bool) -> Result<String, Reject> {
    let mut dec = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        let b = raw[i];
        if b == b'%' {
            let (Some(h), Some(l)) = (
                raw.get(i + 1).copied().and_then(hex),
                raw.get(i + 2).copied().and_then(hex),
            ) else {
                return Err(reject(400, "invalid percent-encoding in URI"));
            };
            let v = h << 4 | l;
            if v == 0 {
                return Err(reject(400, "NUL in URI"));
            }
            dec.push(v);
            i += 3;
        } else {
            if b == 0 {
                return Err(reject(400, "NUL in URI"));
            }
            dec.push(b);
            i += 1;
        }
    }
    let mut out: Vec<u8> = Vec::with_capacity(dec.len() + 1);
    let mut starts: Vec<usize> = Vec::new();
    let mut trailing = false;
    for (i, seg) in dec.split(|&c| c == b'/').enumerate() {
        match seg {
            // The leading empty segment is the root; others are `//` (kept without merging
            // unless they end the path).
            b"" if !merge && i > 0 => {
                starts.push(out.len());
                out.push(b'/');
                trailing = false;
            }
            b"" | b"." => trailing = true,
            b".." => {
                let Some(s) = starts.pop() else {
                    return Err(reject(400, "URI escapes the root"));
                };
                out.truncate(s);
                trailing = true;
            }
            _ => {
                starts.push(out.len());
                out.push(b'/');
                out.extend_from_slice(seg);
                trailing = false;
            }
        }
    }
    if trailing || out.is_empty() {
        out.push(b'/');
    }
    String::from_utf8(out).map_err(|_| reject(400, "URI is not UTF-8"))
}

/// RFC 3986's unreserved characters but `.` and its sub-delimiters: what a host name and
/// an IP literal are made of (with `.`, `%` or `:` as each allows).
fn host_byte(c: u8) -> bool {
    c.is_ascii_alphanumeric()
        || matches!(
            c,
            b'-' | b'_'
                | b'~'
                | b'!'
                | b'$'
                | b'&'
                | b'\''
                | b'('
                | b')'
                | b'*'
                | b'+'
                | b','
                | b';'
                | b'='
        )
}

/// nginx's `ngx_http_validate_host` (as tightened in 1.29.4 to RFC 3986's `host [ ":" port ]`):
/// a registered name of unreserved, sub-delimiter and `%` characters, or a bracketed IP
/// literal, then an optional `:` and a port of digits up to 65535. Lowercased, the port and a
/// trailing dot stripped; `..`, an empty name, whitespace, `/`, `@` and anything after the
/// port refused.
pub fn validate_host(v: &[u8]) -> Option<String> {
    #[derive(PartialEq)]
    enum St {
        Start,
        Host,
        Literal,
        End,
        Port,
    }
    let name_byte = |c: u8| host_byte(c) || c == b'%';
    let mut st = St::Start;
    let mut host_len = v.len();
    let mut dot_pos = usize::MAX;
    let mut port: u32 = 0;
    for (i, &c) in v.iter().enumerate() {
        match st {
            St::Start if c == b'[' => st = St::Literal,
            St::Start | St::Host => {
                st = St::Host;
                match c {
                    b':' => {
                        host_len = i;
                        st = St::Port;
                    }
                    b'.' => {
                        if dot_pos != usize::MAX && dot_pos + 1 == i {
                            return None;
                        }
                        dot_pos = i;
                    }
                    c if name_byte(c) => {}
                    _ => return None,
                }
            }
            St::Literal => match c {
                b']' => {
                    host_len = i + 1;
                    st = St::End;
                }
                b':' => {}
                b'.' => {
                    if dot_pos != usize::MAX && dot_pos + 1 == i {
                        return None;
                    }
                    dot_pos = i;
                }
                c if name_byte(c) && c != b'%' => {}
                _ => return None,
            },
            St::End if c == b':' => st = St::Port,
            St::End => return None,
            St::Port if c.is_ascii_digit() => {
                port = port * 10 + u32::from(c - b'0');
                if port > 65535 {
                    return None;
                }
            }
            St::Port => return None,
        }
    }
    if st == St::Literal {
        return None;
    }
    if host_len > 0 && dot_pos == host_len - 1 {
        host_len -= 1;
    }
    if host_len == 0 {
        return None;
    }
    let h = std::str::from_utf8(&v[..host_len]).ok()?;
    Some(h.to_ascii_lowercase())
}

fn trim(v: &[u8]) -> &[u8] {
    let mut s = 0;
    let mut e = v.len();
    while s < e && (v[s] == b' ' || v[s] == b'\t') {
        s += 1;
    }
    while e > s && (v[e - 1] == b' ' || v[e - 1] == b'\t') {
        e -= 1;
    }
    &v[s..e]
}

/// `v` as a `String`, invalid UTF-8 replaced (nginx keeps bytes; a request's text here is
/// a `String`): the check for valid UTF-8 runs a word at a time over ASCII, where
/// `from_utf8_lossy`'s walks byte by byte (about 150 instructions a request line).
fn owned(v: &[u8]) -> String {
    match std::str::from_utf8(v) {
        Ok(s) => s.to_owned(),
        Err(_) => String::from_utf8_lossy(v).into_owned(),
    }
}

fn text(v: &[u8]) -> String {
    owned(trim(v))
}

/// Trims spaces only, as nginx trims header values: a tab stays in the value.
fn trim_spaces(v: &[u8]) -> &[u8] {
    let s = v.iter().position(|&c| c != b' ').unwrap_or(v.len());
    let e = v.iter().rposition(|&c| c != b' ').map_or(s, |e| e + 1);
    &v[s..e.max(s)]
}

/// The value of a raw header line (`name: value`, without its terminator), as nginx sees it.
fn raw_value(line: &[u8]) -> &[u8] {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    match memchr(b':', line) {
        Some(i) => trim_spaces(&line[i + 1..]),
        None => b"",
    }
}

/// An absolute-form target's authority as nginx's request-line parser accepts it: a name of
/// `[A-Za-z0-9.-]` or a bracketed IP literal (IPv6 or RFC 3986's IPvFuture: letters, digits,
/// `:`, unreserved and sub-delimiter characters), then an optional `:` and digits.
fn valid_authority(a: &[u8]) -> bool {
    let rest = if a.first() == Some(&b'[') {
        let Some(close) = memchr(b']', a) else {
            return false;
        };
        if !a[1..close]
            .iter()
            .all(|&c| host_byte(c) || c == b':' || c == b'.')
        {
            return false;
        }
        &a[close + 1..]
    } else {
        let end = a.iter().position(|&c| c == b':').unwrap_or(a.len());
        if !a[..end]
            .iter()
            .all(|&c| c.is_ascii_alphanumeric() || c == b'.' || c == b'-')
        {
            return false;
        }
        &a[end..]
    };
    match rest.split_first() {
        None => true,
        Some((b':', port)) => port.iter().all(u8::is_ascii_digit),
        Some(_) => false,
    }
}

fn parse_length(v: &[u8]) -> Option<u64> {
    if v.is_empty() || v.len() > 19 || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n = v.iter().fold(0u64, |a, &c| a * 10 + u64::from(c - b'0'));
    (n <= i64::MAX as u64).then_some(n)
}

/// The target split into host (absolute form only), raw path and raw query.
/// (host of an absolute-form target, raw path, raw query).
type Target<'a> = (Option<&'a [u8]>, &'a [u8], Option<&'a [u8]>);

fn split_target(t: &[u8]) -> Result<Target<'_>, Reject> {
    let (host, rest): (Option<&[u8]>, &[u8]) = if t.first() == Some(&b'/') {
        (None, t)
    } else {
        let after = if t.len() >= 7 && t[..7].eq_ignore_ascii_case(b"http://") {
            &t[7..]
        } else if t.len() >= 8 && t[..8].eq_ignore_ascii_case(b"https://") {
            &t[8..]
        } else {
            return Err(reject(400, "invalid request target"));
        };
        let end = after
            .iter()
            .position(|&c| c == b'/' || c == b'?' || c == b'#')
            .unwrap_or(after.len());
        (Some(&after[..end]), &after[end..])
    };
    // A fragment is never sent by conforming clients; drop it as nginx does.
    let rest = match memchr(b'#', rest) {
        Some(i) => &rest[..i],
        None => rest,
    };
    let (path, query) = match memchr(b'?', rest) {
        Some(i) => (&rest[..i], Some(&rest[i + 1..])),
        None => (rest, None),
    };
    let path: &[u8] = if path.is_empty() { b"/" } else { path };
    Ok((host, path, query))
}

/// Parses one request head from the start of `buf`.
pub fn parse(buf: &[u8], limits: &Limits) -> Parse {
    match parse_inner(buf, limits) {
        Ok(Some((req, head_len))) => Parse::Complete { req, head_len },
        Ok(None) => Parse::Partial,
        Err(r) => Parse::Error(r),
    }
}

fn parse_inner(buf: &[u8], limits: &Limits) -> Result<Option<(Request, usize)>, Reject> {
    let line_max = limits.line_max();
    let head_max = limits.head_max();

    // Empty lines before the request line are ignored (RFC 9112 2.2).
    let start = buf
        .iter()
        .position(|&b| b != b'\r' && b != b'\n')
        .unwrap_or(buf.len());
    if start == buf.len() {
        return if buf.len() >= head_max {
            Err(reject(400, "no request line"))
        } else {
            Ok(None)
        };
    }
    let rest = &buf[start..];
    let Some(nl) = memchr(b'\n', rest) else {
        check_partial_line(rest)?;
        if rest.len() >= line_max || buf.len() >= head_max {
            return Err(reject(414, "request line too long"));
        }
        return Ok(None);
    };
    let line = if nl > 0 && rest[nl - 1] == b'\r' {
        &rest[..nl - 1]
    } else {
        &rest[..nl]
    };
    if nl >= line_max {
        // What is already malformed in it is 400 before its length is 414.
        check_partial_line(line)?;
        return Err(reject(414, "request line too long"));
    }
    // `parse_line` refuses, with the same statuses, all that `check_partial_line` would.
    let rl = parse_line(line)?;
    let hdr_start = start + nl + 1;

    // Header line lengths and the end of the head.
    let hb = &buf[hdr_start..];
    let mut pos = 0;
    let mut head_end = None;
    loop {
        match memchr(b'\n', &hb[pos..]) {
            Some(i) => {
                if i == 0 || (i == 1 && hb[pos] == b'\r') {
                    head_end = Some(pos + i + 1);
                    break;
                }
                if i >= line_max {
                    return Err(reject(431, "header line too long"));
                }
                pos += i + 1;
            }
            None => {
                if hb.len() - pos >= line_max {
                    return Err(reject(431, "header line too long"));
                }
                break;
            }
        }
    }
    let Some(end) = head_end else {
        // Incomplete: still refuse what is already malformed or too large.
        let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
        match httparse::parse_headers(hb, &mut headers) {
            Err(httparse::Error::TooManyHeaders) => {
                return Err(reject(431, "too many header lines"))
            }
            Err(_) => return Err(reject(400, "invalid header line")),
            Ok(_) => {}
        }
        if buf.len() >= head_max {
            return Err(reject(431, "request header too large"));
        }
        return Ok(None);
    };
    let head_len = hdr_start + end;
    if head_len > head_max {
        return Err(reject(431, "request header too large"));
    }
    // Most requests carry a handful of headers: a small array first (initialising all
    // `MAX_HEADERS` entries cost more than parsing them), the full one only when it is short.
    let mut few = [httparse::EMPTY_HEADER; FEW_HEADERS];
    let mut many;
    let hs = match httparse::parse_headers(&hb[..end], &mut few) {
        Err(httparse::Error::TooManyHeaders) => {
            many = [httparse::EMPTY_HEADER; MAX_HEADERS];
            httparse::parse_headers(&hb[..end], &mut many)
        }
        other => other,
    };
    let hs: &[httparse::Header<'_>] = match hs {
        Ok(httparse::Status::Complete((_, hs))) => hs,
        Ok(httparse::Status::Partial) => return Err(reject(400, "invalid header line")),
        Err(httparse::Error::TooManyHeaders) => return Err(reject(431, "too many header lines")),
        Err(_) => return Err(reject(400, "invalid header line")),
    };

    let (uri_host, raw_path, raw_query) = split_target(rl.target)?;
    if let Some(a) = uri_host {
        if !valid_authority(a) {
            return Err(reject(400, "invalid host in request line"));
        }
    }
    let path = if limits.merge_slashes {
        normalize_path(raw_path)?
    } else {
        normalize_path_keep_slashes(raw_path)?
    };
    let mut host = match uri_host {
        Some(h) => Some(validate_host(h).ok_or(reject(400, "invalid host in request line"))?),
        None => None,
    };

    let mut header_host: Option<String> = None;
    let mut host_sent: Option<&[u8]> = None;
    let mut conn_close = false;
    let mut conn_keep = false;
    let mut content_length: Option<u64> = None;
    let mut transfer_encoding: Option<&[u8]> = None;
    let mut if_modified_since = None;
    let mut if_none_match = None;
    let mut if_match = None;
    let mut if_unmodified_since = None;
    let mut if_range = None;
    let mut range = None;
    let mut user_agent = None;
    let mut referer = None;
    let mut accept_encoding = None;
    let mut invalid_headers = 0;
    let mut expect_continue = false;
    let mut via = false;
    let mut authorization = false;
    let mut seen_unique = [false; UNIQUE_HEADERS.len()];
    // The raw header lines, in order: httparse returns one header per line (it refuses
    // obs-fold), so header i is line i.
    let mut at = 0;
    for h in hs {
        let line = memchr(b'\n', &hb[at..end]).map(|i| {
            let l = (at, at + i);
            at += i + 1;
            l
        });
        let name = h.name.as_bytes();
        let v = h.value;
        if !header_name_valid(name, limits.names.underscores) {
            // Never interpreted; dropped (or passed on as an unknown header) by the proxy.
            invalid_headers += 1;
            continue;
        }
        // A name of no unique header's length is passed over at once (most of them).
        let maybe_unique = name.len() < 32 && UNIQUE_HEADER_LENGTHS & (1 << name.len()) != 0;
        if let Some(u) = maybe_unique
            .then(|| {
                UNIQUE_HEADERS
                    .iter()
                    .position(|u| name.eq_ignore_ascii_case(u.as_bytes()))
            })
            .flatten()
        {
            if std::mem::replace(&mut seen_unique[u], true) {
                return Err(reject(400, "duplicate header line"));
            }
        }
        // The value as sent, for the headers whose spaces and tabs matter.
        let raw = || line.map_or(v, |(s, e)| raw_value(&hb[s..e]));
        if name.eq_ignore_ascii_case(b"host") {
            let sent = raw();
            header_host = Some(validate_host(sent).ok_or(reject(400, "invalid Host header"))?);
            host_sent = Some(sent);
        } else if name.eq_ignore_ascii_case(b"connection") {
            for tok in v.split(|&c| c == b',') {
                let tok = trim(tok);
                if tok.eq_ignore_ascii_case(b"close") {
                    conn_close = true;
                } else if tok.eq_ignore_ascii_case(b"keep-alive") {
                    conn_keep = true;
                }
            }
        } else if name.eq_ignore_ascii_case(b"content-length") {
            content_length =
                Some(parse_length(raw()).ok_or(reject(400, "invalid Content-Length header"))?);
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            transfer_encoding = Some(raw());
        } else if name.eq_ignore_ascii_case(b"expect") {
            expect_continue = raw().eq_ignore_ascii_case(b"100-continue");
        } else if name.eq_ignore_ascii_case(b"if-modified-since") {
            if_modified_since.get_or_insert_with(|| text(v));
        } else if name.eq_ignore_ascii_case(b"if-none-match") {
            if_none_match.get_or_insert_with(|| text(v));
        } else if name.eq_ignore_ascii_case(b"if-match") {
            if_match.get_or_insert_with(|| text(v));
        } else if name.eq_ignore_ascii_case(b"if-unmodified-since") {
            if_unmodified_since.get_or_insert_with(|| text(v));
        } else if name.eq_ignore_ascii_case(b"range") {
            range.get_or_insert_with(|| text(v));
        } else if name.eq_ignore_ascii_case(b"if-range") {
            if_range.get_or_insert_with(|| text(v));
        } else if name.eq_ignore_ascii_case(b"user-agent") {
            user_agent.get_or_insert_with(|| text(v));
        } else if name.eq_ignore_ascii_case(b"referer") {
            referer.get_or_insert_with(|| text(v));
        } else if name.eq_ignore_ascii_case(b"accept-encoding") {
            accept_encoding.get_or_insert_with(|| text(v));
        } else if name.eq_ignore_ascii_case(b"via") {
            via = true;
        } else if name.eq_ignore_ascii_case(b"authorization") {
            authorization = true;
        }
    }

    let body = match (transfer_encoding, content_length) {
        (Some(_), _) if rl.minor == 0 => {
            return Err(reject(400, "HTTP/1.0 request with Transfer-Encoding"));
        }
        (Some(_), Some(_)) => {
            return Err(reject(400, "both Content-Length and Transfer-Encoding"));
        }
        (Some(te), None) => {
            if !te.eq_ignore_ascii_case(b"chunked") {
                return Err(reject(501, "unknown Transfer-Encoding"));
            }
            Body::Chunked
        }
        (None, Some(n)) => Body::Length(n),
        (None, None) => Body::None,
    };
    // nginx asks for the header itself: an absolute-form target does not stand in for it.
    if header_host.is_none() && rl.minor >= 1 {
        return Err(reject(400, "HTTP/1.1 request without Host header"));
    }
    if host.is_none() {
        host = header_host;
    }
    let host_raw = host_sent
        .filter(|&sent| host.as_deref().map(str::as_bytes) != Some(sent))
        .map(owned);
    // After the headers, as nginx (a missing Host is reported first).
    match rl.method {
        b"CONNECT" => return Err(reject(405, "CONNECT method")),
        b"TRACE" => return Err(reject(405, "TRACE method")),
        _ => {}
    }
    let keep_alive = if rl.minor >= 1 {
        !conn_close
    } else {
        conn_keep && !conn_close
    };

    let req = Request {
        method: Method::from_bytes(rl.method),
        request_line: owned(line),
        target: owned(rl.target),
        path,
        query: raw_query.map(owned),
        minor_version: rl.minor,
        http2: false,
        http3: false,
        head_error_page: None,
        host,
        host_header: host_sent.is_some(),
        host_raw,
        keep_alive,
        body,
        if_modified_since,
        if_none_match,
        if_match,
        if_unmodified_since,
        if_range,
        range,
        user_agent,
        referer,
        accept_encoding,
        expect_continue: expect_continue && rl.minor >= 1 && body != Body::None,
        invalid_headers,
        names: limits.names,
        uri_changed: false,
        location_left: false,
        add_uri_to_alias: false,
        via,
        authorization,
        head_len,
    };
    Ok(Some((req, head_len)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Calls `f` with every string of 1 to `max` bytes over `alphabet`; returns how many.
    fn every_string(alphabet: &[u8], max: usize, mut f: impl FnMut(&[u8])) -> usize {
        let mut strings: Vec<Vec<u8>> = vec![vec![]];
        let mut n = 0;
        for _ in 0..max {
            let mut next = Vec::new();
            for p in &strings {
                for &c in alphabet {
                    let mut q = p.clone();
                    q.push(c);
                    f(&q);
                    n += 1;
                    next.push(q);
                }
            }
            strings = next;
        }
        n
    }

    #[test]
    fn a_complete_request_line_needs_no_partial_check_first() {
        // Every line of up to 6 bytes over an alphabet with each case of both checks.
        every_string(b"G /1.\r\x01H", 6, |m| {
            let alone = parse_line(m).err().map(|r| r.status);
            let both = check_partial_line(m)
                .and_then(|_| parse_line(m).map(|_| ()))
                .err()
                .map(|r| r.status);
            assert_eq!(alone, both, "{:?}", String::from_utf8_lossy(m));
        });
        // A long method too (MAX_METHOD).
        let long = [b"G".repeat(40), b" / HTTP/1.1".to_vec()].concat();
        assert_eq!(parse_line(&long).err().map(|r| r.status), Some(400));
    }

    #[test]
    fn the_plain_path_shortcut_agrees_with_the_long_way() {
        // Every path of up to 6 bytes over an alphabet with each special case.
        let checked = every_string(b"/.a%2e\0\xc3", 6, |q| {
            let fast = normalize_path(q).map_err(|r| r.status);
            let long = normalize_path_long(q).map_err(|r| r.status);
            assert_eq!(fast, long, "{:?}", String::from_utf8_lossy(q));
        });
        assert_eq!(checked, 299_592, "8 + 8^2 + ... + 8^6 paths");
    }

    fn lim() -> Limits {
        Limits {
            header_buffer_size: 1024,
            large_buffers: 4,
            large_buffer_size: 2048,
            names: NamePolicy::default(),
            merge_slashes: true,
        }
    }

    #[test]
    fn merge_slashes_off_keeps_empty_segments() {
        let k = |p: &str| normalize_path_keep_slashes(p.as_bytes()).map_err(|r| r.status);
        assert_eq!(k("/a//b"), Ok("/a//b".into()));
        assert_eq!(k("//"), Ok("//".into()));
        assert_eq!(k("/a//../b"), Ok("/a/b".into()));
        assert_eq!(k("/a/./b/"), Ok("/a/b/".into()));
        assert_eq!(k("/a/%2F/b"), Ok("/a///b".into()));
        assert_eq!(k("/.."), Err(400));
        assert_eq!(
            normalize_path(b"/a//b").map_err(|r| r.status),
            Ok("/a/b".into())
        );
    }

    fn ok(s: &[u8]) -> (Request, usize) {
        match parse(s, &lim()) {
            Parse::Complete { req, head_len } => (req, head_len),
            other => panic!("{:?}: {other:?}", String::from_utf8_lossy(s)),
        }
    }

    fn status(s: &[u8]) -> u16 {
        match parse(s, &lim()) {
            Parse::Error(r) => r.status,
            Parse::Partial => 0,
            Parse::Complete { .. } => 200,
        }
    }

    #[test]
    fn simple_get() {
        let raw = b"GET /a/b.txt?x=1&y HTTP/1.1\r\nHost: Example.COM:8080\r\nUser-Agent: ua\r\nReferer: r\r\n\r\nNEXT";
        let (r, n) = ok(raw);
        assert_eq!(n, raw.len() - 4);
        assert_eq!(r.method, Method::Get);
        assert_eq!(r.request_line, "GET /a/b.txt?x=1&y HTTP/1.1");
        assert_eq!(r.target, "/a/b.txt?x=1&y");
        assert_eq!(r.path, "/a/b.txt");
        assert_eq!(r.query.as_deref(), Some("x=1&y"));
        assert_eq!(r.minor_version, 1);
        assert_eq!(r.host.as_deref(), Some("example.com"));
        assert!(r.keep_alive);
        assert_eq!(r.body, Body::None);
        assert_eq!(r.user_agent.as_deref(), Some("ua"));
        assert_eq!(r.referer.as_deref(), Some("r"));
    }

    #[test]
    fn bare_lf_and_leading_empty_lines() {
        let (r, n) = ok(b"\r\n\r\nHEAD / HTTP/1.0\nX: y\n\n");
        assert_eq!(n, 26);
        assert_eq!(r.method, Method::Head);
        assert!(!r.keep_alive);
        assert_eq!(r.host, None);
    }

    #[test]
    fn keep_alive_rules() {
        assert!(!ok(b"GET / HTTP/1.0\r\n\r\n").0.keep_alive);
        assert!(
            ok(b"GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n")
                .0
                .keep_alive
        );
        assert!(ok(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").0.keep_alive);
        assert!(
            !ok(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: foo, close\r\n\r\n")
                .0
                .keep_alive
        );
    }

    #[test]
    fn partial_heads() {
        for s in [
            &b""[..],
            b"G",
            b"GET",
            b"GET /",
            b"GET / HTTP/1.1",
            b"GET / HTTP/1.1\r\n",
            b"GET / HTTP/1.1\r\nHo",
            b"GET / HTTP/1.1\r\nHost: x\r\n",
            b"GET / HTTP/1.1\r\nHost: x\r\n\r",
            b"\r\n",
        ] {
            assert!(
                matches!(parse(s, &lim()), Parse::Partial),
                "{:?}",
                String::from_utf8_lossy(s)
            );
        }
    }

    #[test]
    fn malformed_is_400() {
        for s in [
            &b"\x16\x03\x01\x02\x00\r\n\r\n"[..],
            b"\x16\x03\x01",
            b"get / HTTP/1.1\r\nHost: x\r\n\r\n",
            b"GET /a b HTTP/1.1\r\nHost: x\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost x\r\n\r\n",
            b"GET / HTTP/1.1\r\n\r\n",
            b"GET / HTTX/1.1\r\nHost: x\r\n\r\n",
            b"GET / HTTP/1.100\r\nHost: x\r\n\r\n",
            b"GET foo HTTP/1.1\r\nHost: x\r\n\r\n",
            b"GET /\x01 HTTP/1.1\r\nHost: x\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: a/b\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: a..b\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: \r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: x\r\n folded\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1x\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: \r\n\r\n",
            b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"GET /../secret.txt HTTP/1.1\r\nHost: x\r\n\r\n",
            b"GET /a/../../b HTTP/1.1\r\nHost: x\r\n\r\n",
            b"GET /%2e%2e/secret.txt HTTP/1.1\r\nHost: x\r\n\r\n",
            b"GET /dir%2f..%2f..%2fsecret.txt HTTP/1.1\r\nHost: x\r\n\r\n",
            b"GET /a.txt%00.html HTTP/1.1\r\nHost: x\r\n\r\n",
            b"GET /%zz HTTP/1.1\r\nHost: x\r\n\r\n",
            b"GET /%4 HTTP/1.1\r\nHost: x\r\n\r\n",
            b"GET /%ff HTTP/1.1\r\nHost: x\r\n\r\n",
        ] {
            assert_eq!(status(s), 400, "{:?}", String::from_utf8_lossy(s));
        }
    }

    /// One row per class of hostile request found by a differential run against nginx 1.22:
    /// (request, the status nginx gives, or 200 where it serves it).
    #[test]
    fn hostile_requests_as_nginx() {
        let get = |hdrs: &str| format!("GET / HTTP/1.1\r\nHost: x\r\n{hdrs}\r\n");
        let post = |hdrs: &str| format!("POST / HTTP/1.1\r\nHost: x\r\n{hdrs}\r\n");
        let mut table: Vec<(String, u16)> = vec![
            // Invalid header names: ignored, the request is served.
            (get("Transfer_Encoding: chunked\r\n"), 200),
            (get("Content_Length: 5\r\n"), 200),
            (get("X_Forwarded_For: 1.2.3.4\r\n"), 200),
            // Hard header errors.
            (get("Foo Bar: x\r\n"), 400),
            (get(": novalue\r\n"), 400),
            (get("Foo\x01: x\r\n"), 400),
            (get("X: a\0b\r\n"), 400),
            (get("X: a\rb\r\n"), 400),
            // Stricter than nginx (docs/directives.md lists both).
            (get("NoColonHere\r\n"), 400),
            (get("Foo@: x\r\n"), 400),
            (
                "GET ftp://localhost/ HTTP/1.1\r\nHost: x\r\n\r\n".into(),
                400,
            ),
            // Absolute-form authorities.
            (
                "GET http://localhost/ HTTP/1.1\r\nHost: x\r\n\r\n".into(),
                200,
            ),
            (
                "GET http://localhost:80/ HTTP/1.1\r\nHost: x\r\n\r\n".into(),
                200,
            ),
            ("GET http://[::1]/ HTTP/1.1\r\nHost: x\r\n\r\n".into(), 200),
            (
                "GET http://[v1.a!$&'()*+,;=-._~]/ HTTP/1.1\r\nHost: x\r\n\r\n".into(),
                200,
            ),
            (
                "GET http://[v1.a/]/ HTTP/1.1\r\nHost: x\r\n\r\n".into(),
                400,
            ),
            (
                "GET http://localhost:/ HTTP/1.1\r\nHost: x\r\n\r\n".into(),
                200,
            ),
            (
                "GET http://localhost:80x/ HTTP/1.1\r\nHost: x\r\n\r\n".into(),
                400,
            ),
            (
                "GET http://localhost::80/ HTTP/1.1\r\nHost: x\r\n\r\n".into(),
                400,
            ),
            (
                "GET http://foo_bar/ HTTP/1.1\r\nHost: x\r\n\r\n".into(),
                400,
            ),
            (
                "GET http://%6cocalhost/ HTTP/1.1\r\nHost: x\r\n\r\n".into(),
                400,
            ),
            ("GET http://[::1/ HTTP/1.1\r\nHost: x\r\n\r\n".into(), 400),
            ("GET http://a@b/ HTTP/1.1\r\nHost: x\r\n\r\n".into(), 400),
            ("GET http:/// HTTP/1.1\r\nHost: x\r\n\r\n".into(), 400),
            // Methods.
            ("TRACE / HTTP/1.1\r\nHost: x\r\n\r\n".into(), 405),
            ("CONNECT /x HTTP/1.1\r\nHost: x\r\n\r\n".into(), 405),
            (
                "CONNECT localhost:80 HTTP/1.1\r\nHost: x\r\n\r\n".into(),
                400,
            ),
            ("TRACE / HTTP/1.1\r\n\r\n".into(), 400),
            ("get / HTTP/1.1\r\nHost: x\r\n\r\n".into(), 400),
            ("FOO / HTTP/1.1\r\nHost: x\r\n\r\n".into(), 200),
            // Versions.
            ("GET / HTTP/01.1\r\nHost: x\r\n\r\n".into(), 400),
            ("GET / HTTP/1.01\r\nHost: x\r\n\r\n".into(), 200),
            ("GET / HTTP/1.1x\r\nHost: x\r\n\r\n".into(), 400),
            ("GET / http/1.1\r\nHost: x\r\n\r\n".into(), 400),
            ("GET / HTTP/1\r\nHost: x\r\n\r\n".into(), 400),
            ("GET / HTTP/10.0\r\nHost: x\r\n\r\n".into(), 505),
            // Content-Length: spaces are trimmed, tabs are not.
            (post("Content-Length: 5 \r\n"), 200),
            (post("Content-Length:  5\r\n"), 200),
            (post("Content-Length: 5\t\r\n"), 400),
            (post("Content-Length: \t5\r\n"), 400),
            (post("Content-Length: +5\r\n"), 400),
            (post("Content-Length: 5,5\r\n"), 400),
            (post("Content-Length: 5 5\r\n"), 400),
            (post("Content-Length: 05\r\n"), 200),
            // Transfer-Encoding: exactly `chunked`, any case, spaces trimmed.
            (post("Transfer-Encoding: Chunked\r\n"), 200),
            (post("Transfer-Encoding: chunked \r\n"), 200),
            (post("Transfer-Encoding: chunked\t\r\n"), 501),
            (post("Transfer-Encoding: \tchunked\r\n"), 501),
            (post("Transfer-Encoding: gzip, chunked\r\n"), 501),
            (post("Transfer-Encoding: chunked,\r\n"), 501),
            (post("Transfer-Encoding: identity\r\n"), 501),
            (
                post("Transfer-Encoding: chunked\r\nContent-Length: 5\r\n"),
                400,
            ),
            // Host header values.
            ("GET / HTTP/1.1\r\nHost: a_b\r\n\r\n".into(), 200),
            ("GET / HTTP/1.1\r\nHost: a..b\r\n\r\n".into(), 400),
            ("GET / HTTP/1.1\r\nHost: a/b\r\n\r\n".into(), 400),
            ("GET / HTTP/1.1\r\nHost: a\tb\r\n\r\n".into(), 400),
            ("GET / HTTP/1.1\r\n\r\n".into(), 400),
            ("GET / HTTP/1.0\r\n\r\n".into(), 200),
        ];
        // Headers nginx keeps once: a repeat is 400 even with the same value.
        for name in UNIQUE_HEADERS {
            let v = if name == "content-length" { "0" } else { "x" };
            table.push((
                format!("GET / HTTP/1.1\r\n{name}: {v}\r\n{name}: {v}\r\n\r\n"),
                400,
            ));
        }
        // Repeats nginx allows.
        for name in [
            "Content-Type",
            "User-Agent",
            "Referer",
            "Accept",
            "Cookie",
            "Range",
            "Via",
        ] {
            table.push((get(&format!("{name}: a\r\n{name}: a\r\n")), 200));
        }
        for (raw, want) in &table {
            assert_eq!(status(raw.as_bytes()), *want, "{raw:?}");
        }
        // Invalid names are counted (for the log) and never frame a body.
        let (r, _) = ok(b"POST / HTTP/1.1\r\nHost: x\r\nTransfer_Encoding: chunked\r\nContent_Length: 5\r\n\r\n");
        assert_eq!((r.invalid_headers, r.body), (2, Body::None));
    }

    #[test]
    fn expect_continue_only_with_a_body_on_http_1_1() {
        let e = |raw: &[u8]| ok(raw).0.expect_continue;
        assert!(e(
            b"POST / HTTP/1.1\r\nHost: x\r\nExpect: 100-Continue\r\nContent-Length: 1\r\n\r\n"
        ));
        assert!(!e(
            b"GET / HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n\r\n"
        ));
        assert!(!e(
            b"POST / HTTP/1.0\r\nExpect: 100-continue\r\nContent-Length: 1\r\n\r\n"
        ));
        assert!(!e(
            b"POST / HTTP/1.1\r\nHost: x\r\nExpect: other\r\nContent-Length: 1\r\n\r\n"
        ));
    }

    #[test]
    fn version_505() {
        assert_eq!(status(b"GET / HTTP/2.0\r\nHost: x\r\n\r\n"), 505);
        // The target is judged first, as nginx: the h2c preface is 400.
        assert_eq!(status(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"), 400);
        assert_eq!(status(b"GET / HTTP/3.1\r\nHost: x\r\n\r\n"), 505);
        // As nginx: a major version starting with 0 is malformed, not unsupported.
        assert_eq!(status(b"GET / HTTP/0.9\r\n\r\n"), 400);
        assert_eq!(status(b"GET / HTTP/01.1\r\nHost: x\r\n\r\n"), 400);
        assert_eq!(status(b"GET /\r\n\r\n"), 505);
        let (r, _) = ok(b"GET / HTTP/1.2\r\nHost: x\r\n\r\n");
        assert_eq!(r.minor_version, 2);
    }

    #[test]
    fn transfer_encoding() {
        assert_eq!(
            status(b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n"),
            501
        );
        assert_eq!(
            status(b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"),
            501
        );
        let (r, _) = ok(b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: Chunked\r\n\r\n");
        assert_eq!(r.body, Body::Chunked);
        let (r, _) = ok(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length:  42 \r\n\r\n");
        assert_eq!(r.body, Body::Length(42));
    }

    #[test]
    fn size_limits() {
        let long_uri = format!("GET /{} HTTP/1.1\r\nHost: x\r\n\r\n", "a".repeat(3000));
        assert_eq!(status(long_uri.as_bytes()), 414);
        assert_eq!(
            status(&long_uri.as_bytes()[..2500]),
            414,
            "partial long line"
        );
        assert_eq!(
            status(&long_uri.as_bytes()[..2000]),
            0,
            "partial, within limits"
        );
        let big = format!(
            "GET / HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n",
            "b".repeat(3000)
        );
        assert_eq!(status(big.as_bytes()), 431);
        assert_eq!(status(&big.as_bytes()[..2500]), 431);
        let many = format!(
            "GET / HTTP/1.1\r\nHost: x\r\n{}\r\n",
            (0..200)
                .map(|i| format!("X-H{i}: {}\r\n", "v".repeat(60)))
                .collect::<String>()
        );
        assert_eq!(status(many.as_bytes()), 431);
        assert_eq!(status(&many.as_bytes()[..8192]), 431);
        // Many small headers, under the count but over the total.
        let total = format!(
            "GET / HTTP/1.1\r\nHost: x\r\n{}\r\n",
            (0..90)
                .map(|i| format!("X-H{i}: {}\r\n", "v".repeat(100)))
                .collect::<String>()
        );
        assert_eq!(status(total.as_bytes()), 431);
        assert_eq!(status(&total.as_bytes()[..8192]), 431);
        assert_eq!(status(&total.as_bytes()[..8000]), 0);
        let max = format!(
            "GET / HTTP/1.1\r\nHost: x\r\n{}\r\n",
            "X-A: b\r\n".repeat(99)
        );
        assert_eq!(status(max.as_bytes()), 200);
        let over = format!(
            "GET / HTTP/1.1\r\nHost: x\r\n{}\r\n",
            "X-A: b\r\n".repeat(100)
        );
        assert_eq!(status(over.as_bytes()), 431);
    }

    #[test]
    fn paths_are_normalized() {
        let p = |t: &str| {
            ok(format!("GET {t} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
                .0
                .path
        };
        assert_eq!(p("/"), "/");
        assert_eq!(p("//a///b"), "/a/b");
        assert_eq!(p("/dir/../a.txt"), "/a.txt");
        assert_eq!(p("/a/./b/"), "/a/b/");
        assert_eq!(p("/a/b/.."), "/a/");
        assert_eq!(p("/a/.."), "/");
        assert_eq!(p("/a/."), "/a/");
        assert_eq!(p("/%61.txt"), "/a.txt");
        assert_eq!(p("/a%20b%2Fc"), "/a b/c");
        assert_eq!(p("/caf%C3%A9"), "/café");
        assert_eq!(p("/a#frag"), "/a");
        assert_eq!(p("/..a/b..c"), "/..a/b..c");
    }

    #[test]
    fn absolute_form_uses_its_host() {
        let (r, _) = ok(b"GET http://Other.Test:81/p/q?z HTTP/1.1\r\nHost: x\r\n\r\n");
        assert_eq!(r.host.as_deref(), Some("other.test"));
        assert_eq!(r.path, "/p/q");
        assert_eq!(r.query.as_deref(), Some("z"));
        let (r, _) = ok(b"GET http://h.test HTTP/1.0\r\n\r\n");
        assert_eq!((r.host.as_deref(), r.path.as_str()), (Some("h.test"), "/"));
        // HTTP/1.1 needs the header all the same, as nginx asks for it.
        assert_eq!(status(b"GET http://h.test HTTP/1.1\r\n\r\n"), 400);
    }

    #[test]
    fn hosts() {
        assert_eq!(
            validate_host(b"EXACT.example.com:80").as_deref(),
            Some("exact.example.com")
        );
        assert_eq!(
            validate_host(b"example.com.").as_deref(),
            Some("example.com")
        );
        assert_eq!(validate_host(b"[::1]:8080").as_deref(), Some("[::1]"));
        assert_eq!(validate_host(b":80"), None);
        assert_eq!(validate_host(b"[::1"), None);
        assert_eq!(validate_host(b"a b"), None);
        // nginx 1.29.4's RFC 3986 rule: nothing but a port after the name.
        for bad in [
            &b"localhost: evil"[..],
            b"localhost:a b",
            b"localhost:80/../x",
            b"localhost:80:80",
            b"localhost:65536",
            b"[::1]x",
            b"a@b",
            b"a\tb",
            b"a..b",
            b"\xc3\xa9.test",
        ] {
            assert_eq!(
                validate_host(bad),
                None,
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        assert_eq!(validate_host(b"localhost:").as_deref(), Some("localhost"));
        assert_eq!(
            validate_host(b"a_b~c%41:65535").as_deref(),
            Some("a_b~c%41")
        );
        assert_eq!(
            validate_host(b"[::FFFF:1.2.3.4]").as_deref(),
            Some("[::ffff:1.2.3.4]")
        );
    }

    #[test]
    fn methods_and_conditionals() {
        let (r, _) = ok(b"BREW /pot HTTP/1.1\r\nHost: x\r\nIf-None-Match: \"e\"\r\nIf-Modified-Since: d\r\nRange: bytes=1-2\r\n\r\n");
        assert_eq!(r.method, Method::Other("BREW".into()));
        assert_eq!(r.method.as_str(), "BREW");
        assert_eq!(r.if_none_match.as_deref(), Some("\"e\""));
        assert_eq!(r.if_modified_since.as_deref(), Some("d"));
        assert_eq!(r.range.as_deref(), Some("bytes=1-2"));
    }
}
