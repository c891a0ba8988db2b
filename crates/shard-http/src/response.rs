//! Response heads and the small in-memory responses: error pages and `return`.
//!
//! [`write_head`] appends a status line and headers to a caller's buffer; it always writes
//! `Server: shard`, `Date` and `Connection`, and leaves out what a status forbids
//! (`Content-Length` on 1xx/204, body headers on 304, as nginx). [`Simple`] is a complete
//! response held in memory. This module does not decide keep-alive, read files or write to
//! sockets.

/// A response head. `date` is the preformatted IMF-fixdate of the current second.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Head<'a> {
    pub status: u16,
    pub date: &'a [u8],
    pub content_type: Option<&'a str>,
    pub content_length: Option<u64>,
    pub keep_alive: bool,
    pub location: Option<&'a str>,
    pub last_modified: Option<&'a str>,
    pub etag: Option<&'a str>,
    /// Writes `Accept-Ranges: bytes`.
    pub accept_ranges: bool,
    pub content_range: Option<&'a str>,
    /// `Content-Encoding` (`gzip`).
    pub content_encoding: Option<&'a str>,
    /// `Vary` (`Accept-Encoding` with `gzip_vary on`).
    pub vary: Option<&'a str>,
    /// The `Server` value (`server_tokens`).
    pub server: &'a [u8],
    /// Header lines written last, each ending in CRLF (`expires`, `add_header`).
    pub extra: &'a [u8],
    /// `charset`: appended to `content_type` as `; charset=NAME` (see [`charset_for`]).
    pub charset: Option<&'a str>,
}

/// The `charset` of `loc` for a response of `content_type`: when set, the type is in
/// `charset_types` (or it is `*`) and the type names no charset yet.
pub fn charset_for<'l>(loc: &'l shard_config::LocationConf, content_type: &str) -> Option<&'l str> {
    let cs = loc.charset.as_deref()?;
    let lower = content_type.to_ascii_lowercase();
    if lower.contains("charset=") {
        return None;
    }
    let base = lower.split(';').next().unwrap_or("").trim();
    loc.charset_types
        .iter()
        .any(|t| t == "*" || t == base)
        .then_some(cs)
}

/// Whether `loc`'s `charset_types` include the media type `ty` (`*`: any).
pub fn charset_type(loc: &shard_config::LocationConf, ty: &str) -> bool {
    let base = ty.split(';').next().unwrap_or("").trim();
    loc.charset_types
        .iter()
        .any(|t| t == "*" || t.eq_ignore_ascii_case(base))
}

/// A `Content-Type` that names its charset: the type (parameters before the charset kept)
/// and the charset, unquoted.
pub fn named_charset(content_type: &str) -> Option<(&str, &str)> {
    let lower = content_type.to_ascii_lowercase();
    let i = lower.find("charset=")?;
    let ty = content_type[..i]
        .trim_end()
        .trim_end_matches(';')
        .trim_end();
    let cs = content_type[i + 8..]
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .trim_matches('"');
    (!cs.is_empty()).then_some((ty, cs))
}

/// `Server` with `server_tokens on` (nginx's default) and `off`.
pub const SERVER_TOKENS_ON: &[u8] = concat!("shard/", env!("CARGO_PKG_VERSION")).as_bytes();
pub const SERVER_TOKENS_OFF: &[u8] = b"shard";

/// The `Server` value of a location.
pub fn server_value(loc: &shard_config::LocationConf) -> &'static [u8] {
    if loc.server_tokens {
        SERVER_TOKENS_ON
    } else {
        SERVER_TOKENS_OFF
    }
}

/// The statuses `add_header` (without `always`) and `expires` apply to, as nginx's.
pub fn headers_apply(status: u16) -> bool {
    matches!(
        status,
        200 | 201 | 204 | 206 | 301 | 302 | 303 | 304 | 307 | 308
    )
}

/// `expires` and `add_header` of `loc` for a response with `status`, as header lines. `now`
/// and `mtime` are Unix seconds (`mtime`: the file's, for `expires modified`); `ctx` gives
/// the variables' values.
pub fn write_extra(
    out: &mut Vec<u8>,
    loc: &shard_config::LocationConf,
    if_headers: Option<&[shard_config::AddHeader]>,
    status: u16,
    now: u64,
    mtime: Option<i64>,
    ctx: Option<&crate::vars::Ctx<'_>>,
) {
    use shard_config::Expires;
    let applies = headers_apply(status);
    let mut expires = loc.expires.clone();
    if let (Some(Expires::Var(parts)), Some(c)) = (&expires, ctx) {
        let v = crate::vars::render(parts, c);
        let args: Vec<String> = v.split_whitespace().map(str::to_string).collect();
        expires = shard_config::expires_value(&args).ok().flatten();
        if matches!(expires, Some(Expires::Var(_))) {
            expires = None;
        }
    }
    if let (Some(e), true) = (expires, applies) {
        match e {
            Expires::Var(_) => {}
            Expires::Epoch => out.extend_from_slice(
                b"Expires: Thu, 01 Jan 1970 00:00:01 GMT\r\nCache-Control: no-cache\r\n",
            ),
            Expires::Max => out.extend_from_slice(
                b"Expires: Thu, 31 Dec 2037 23:55:55 GMT\r\nCache-Control: max-age=315360000\r\n",
            ),
            Expires::Daily(at) => {
                // nginx's `ngx_next_time`: today at that time if it is still to come, else
                // tomorrow.
                let now = now as i64;
                let midnight = now - now.rem_euclid(86_400);
                let mut next = midnight + at;
                if next <= now {
                    next += 86_400;
                }
                header(out, b"Expires: ", crate::http_date(next as u64).as_bytes());
                out.extend_from_slice(b"Cache-Control: max-age=");
                push_u64(out, (next - now) as u64);
                out.extend_from_slice(b"\r\n");
            }
            Expires::After { secs, modified } => {
                let base = if modified {
                    mtime.unwrap_or(now as i64)
                } else {
                    now as i64
                };
                let at = base.saturating_add(secs).max(0);
                header(out, b"Expires: ", crate::http_date(at as u64).as_bytes());
                let max_age = at - now as i64;
                if max_age < 0 {
                    out.extend_from_slice(b"Cache-Control: no-cache\r\n");
                } else {
                    out.extend_from_slice(b"Cache-Control: max-age=");
                    push_u64(out, max_age as u64);
                    out.extend_from_slice(b"\r\n");
                }
            }
        }
    }
    // Where this function's lines begin: a `$sent_http_NAME` in an `add_header` value reads
    // the lines added before it (nginx's header list as the filter fills it).
    let start = out.len();
    let mut value = Vec::new();
    let headers = if_headers.unwrap_or(&loc.add_headers);
    let list: Vec<&shard_config::AddHeader> =
        headers.iter().filter(|h| h.always || applies).collect();
    for (i, h) in list.iter().enumerate() {
        // `ETag` and `Last-Modified` are set, not added (nginx's header filter): the last one
        // wins, and an empty one leaves none.
        let set =
            h.name.eq_ignore_ascii_case("etag") || h.name.eq_ignore_ascii_case("last-modified");
        if set
            && list[i + 1..]
                .iter()
                .any(|l| l.name.eq_ignore_ascii_case(&h.name))
        {
            continue;
        }
        value.clear();
        match (ctx, h.value.as_slice()) {
            (_, [shard_config::Part::Lit(v)]) => value.extend_from_slice(v.as_bytes()),
            (Some(c), parts)
                if parts.iter().any(|p| {
                    matches!(p, shard_config::Part::Var(shard_config::Var::SentHttp(_)))
                }) =>
            {
                let mut seen = c.done.map_or(&b""[..], |d| d.head).to_vec();
                if seen.is_empty() {
                    seen.extend_from_slice(b"HTTP/1.1\r\n");
                }
                seen.extend_from_slice(&out[start..]);
                let view = crate::vars::Ctx {
                    req: c.req,
                    headers: c.headers,
                    client: c.client,
                    server_addr: c.server_addr,
                    server_name: c.server_name,
                    location: c.location,
                    pass: c.pass,
                    conn: c.conn,
                    scope: c.scope,
                    done: Some(crate::vars::Done {
                        head: &seen,
                        ..c.done.unwrap_or_default()
                    }),
                };
                crate::vars::push_parts(&mut value, parts, &view);
            }
            (Some(c), parts) => crate::vars::push_parts(&mut value, parts, c),
            (None, _) => {}
        }
        // An empty value adds nothing, as nginx.
        if !value.is_empty() {
            out.extend_from_slice(h.name.as_bytes());
            out.extend_from_slice(b": ");
            push_value(out, &value);
            out.extend_from_slice(b"\r\n");
        }
    }
}

impl Default for Head<'_> {
    fn default() -> Self {
        Head {
            status: 200,
            date: b"",
            content_type: None,
            content_length: None,
            keep_alive: false,
            location: None,
            last_modified: None,
            etag: None,
            accept_ranges: false,
            content_range: None,
            content_encoding: None,
            vary: None,
            server: SERVER_TOKENS_ON,
            extra: b"",
            charset: None,
        }
    }
}

/// A complete response held in memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Simple {
    pub status: u16,
    pub content_type: Option<String>,
    pub location: Option<String>,
    pub body: Vec<u8>,
}

/// The reason phrase for `status` (nginx's wording), or `""` for codes without one.
pub fn status_text(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        101 => "Switching Protocols",
        200 => "OK",
        201 => "Created",
        202 => "Accepted",
        204 => "No Content",
        206 => "Partial Content",
        301 => "Moved Permanently",
        302 => "Moved Temporarily",
        303 => "See Other",
        304 => "Not Modified",
        307 => "Temporary Redirect",
        308 => "Permanent Redirect",
        400 => "Bad Request",
        401 => "Unauthorized",
        402 => "Payment Required",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Not Allowed",
        406 => "Not Acceptable",
        408 => "Request Time-out",
        409 => "Conflict",
        410 => "Gone",
        411 => "Length Required",
        412 => "Precondition Failed",
        413 => "Request Entity Too Large",
        414 => "Request-URI Too Large",
        415 => "Unsupported Media Type",
        416 => "Requested Range Not Satisfiable",
        421 => "Misdirected Request",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        502 => "Bad Gateway",
        503 => "Service Temporarily Unavailable",
        504 => "Gateway Time-out",
        505 => "HTTP Version Not Supported",
        507 => "Insufficient Storage",
        _ => "",
    }
}

macro_rules! page {
    ($title:literal) => {
        concat!(
            "<html>\r\n<head><title>",
            $title,
            "</title></head>\r\n<body>\r\n<center><h1>",
            $title,
            "</h1></center>\r\n<hr><center>shard</center>\r\n</body>\r\n</html>\r\n"
        )
        .as_bytes()
    };
}

/// nginx's built-in HTML page for `status`, or empty for codes that have none.
pub fn error_body(status: u16) -> &'static [u8] {
    match status {
        // nginx's internal codes of `ssl_verify_client`: sent as 400.
        495 => concat!(
            "<html>\r\n<head><title>400 The SSL certificate error</title></head>\r\n",
            "<body>\r\n<center><h1>400 Bad Request</h1></center>\r\n",
            "<center>The SSL certificate error</center>\r\n",
            "<hr><center>shard</center>\r\n</body>\r\n</html>\r\n"
        )
        .as_bytes(),
        496 => concat!(
            "<html>\r\n<head><title>400 No required SSL certificate was sent</title></head>\r\n",
            "<body>\r\n<center><h1>400 Bad Request</h1></center>\r\n",
            "<center>No required SSL certificate was sent</center>\r\n",
            "<hr><center>shard</center>\r\n</body>\r\n</html>\r\n"
        )
        .as_bytes(),
        // nginx's internal code for plain HTTP sent to an HTTPS port: sent as 400.
        497 => concat!(
            "<html>\r\n<head><title>400 The plain HTTP request was sent to HTTPS port</title></head>\r\n",
            "<body>\r\n<center><h1>400 Bad Request</h1></center>\r\n",
            "<center>The plain HTTP request was sent to HTTPS port</center>\r\n",
            "<hr><center>shard</center>\r\n</body>\r\n</html>\r\n"
        )
        .as_bytes(),
        301 => page!("301 Moved Permanently"),
        302 => page!("302 Found"),
        303 => page!("303 See Other"),
        307 => page!("307 Temporary Redirect"),
        308 => page!("308 Permanent Redirect"),
        400 => page!("400 Bad Request"),
        401 => page!("401 Authorization Required"),
        402 => page!("402 Payment Required"),
        403 => page!("403 Forbidden"),
        404 => page!("404 Not Found"),
        405 => page!("405 Not Allowed"),
        406 => page!("406 Not Acceptable"),
        408 => page!("408 Request Time-out"),
        409 => page!("409 Conflict"),
        410 => page!("410 Gone"),
        411 => page!("411 Length Required"),
        412 => page!("412 Precondition Failed"),
        413 => page!("413 Request Entity Too Large"),
        414 => page!("414 Request-URI Too Large"),
        415 => page!("415 Unsupported Media Type"),
        416 => page!("416 Requested Range Not Satisfiable"),
        421 => page!("421 Misdirected Request"),
        429 => page!("429 Too Many Requests"),
        431 => page!("431 Request Header Fields Too Large"),
        500 => page!("500 Internal Server Error"),
        501 => page!("501 Not Implemented"),
        502 => page!("502 Bad Gateway"),
        503 => page!("503 Service Temporarily Unavailable"),
        504 => page!("504 Gateway Time-out"),
        505 => page!("505 HTTP Version Not Supported"),
        507 => page!("507 Insufficient Storage"),
        _ => b"",
    }
}

/// The error page for `status` as a [`Simple`] (`text/html`, or no type when there is no page).
pub fn error_simple(status: u16) -> Simple {
    let body = error_body(status);
    Simple {
        status,
        content_type: (!body.is_empty()).then(|| "text/html".to_string()),
        location: None,
        body: body.to_vec(),
    }
}

fn is_redirect(code: u16) -> bool {
    matches!(code, 301 | 302 | 303 | 307 | 308)
}

/// nginx's `return`: redirects carry their text as `Location` and an HTML page; other codes
/// with text send it as the body with `default_type`; a bare code sends its error page (>= 400)
/// or nothing. `text` is the directive's text with its variables already expanded.
pub fn return_reply(code: u16, text: Option<String>, default_type: &str) -> Simple {
    match text {
        Some(url) if is_redirect(code) => Simple {
            location: Some(url),
            ..error_simple(code)
        },
        Some(text) => Simple {
            status: code,
            content_type: Some(default_type.to_string()),
            location: None,
            body: text.into_bytes(),
        },
        None if code >= 400 || is_redirect(code) => error_simple(code),
        // nginx's `ngx_http_send_response` gives an empty answer the `default_type` too; its
        // header filter drops it from a 204.
        None => Simple {
            status: code,
            content_type: (code != 204).then(|| default_type.to_string()),
            location: None,
            body: Vec::new(),
        },
    }
}

/// nginx's `absolute_redirect on` (the default): a `Location` that starts with `/` is sent as
/// `http://HOST[:PORT]/...`, HOST being the request's host (else the server's name) and PORT
/// the listening port unless it is 80 (`port_in_redirect on`).
pub fn absolute_location(location: &str, host: &str, port: u16) -> String {
    absolute_location_scheme(location, host, port, false)
}

/// [`absolute_location`] on a TLS connection when `https`: `https://`, port 443 left out.
pub fn absolute_location_scheme(location: &str, host: &str, port: u16, https: bool) -> String {
    if !location.starts_with('/') {
        return location.to_string();
    }
    let mut s = String::with_capacity(location.len() + host.len() + 14);
    s.push_str(if https { "https://" } else { "http://" });
    s.push_str(host);
    if port != if https { 443 } else { 80 } {
        s.push(':');
        s.push_str(&port.to_string());
    }
    s.push_str(location);
    s
}

/// Appends the decimal digits of `n`.
pub fn push_u64(out: &mut Vec<u8>, mut n: u64) {
    let mut buf = [0u8; 20];
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&buf[i..]);
}

/// Appends a header value, dropping CR and LF so no value can split the head.
fn push_value(out: &mut Vec<u8>, v: &[u8]) {
    if memchr::memchr2(b'\r', b'\n', v).is_none() {
        out.extend_from_slice(v);
    } else {
        out.extend(v.iter().copied().filter(|&b| b != b'\r' && b != b'\n'));
    }
}

fn header(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    push_value(out, value);
    out.extend_from_slice(b"\r\n");
}

/// Appends the status line and headers of `head`, ending with the empty line.
pub fn write_head(out: &mut Vec<u8>, head: &Head<'_>) {
    let s = head.status;
    let not_modified = s == 304;
    let no_length = s < 200 || s == 204 || not_modified;
    out.extend_from_slice(b"HTTP/1.1 ");
    push_u64(out, u64::from(s));
    out.push(b' ');
    out.extend_from_slice(status_text(s).as_bytes());
    out.extend_from_slice(b"\r\n");
    header(out, b"Server: ", head.server);
    // The worker's own date, always 29 ASCII bytes: nothing to strip.
    debug_assert!(memchr::memchr2(b'\r', b'\n', head.date).is_none());
    out.extend_from_slice(b"Date: ");
    out.extend_from_slice(head.date);
    out.extend_from_slice(b"\r\n");
    if let Some(ct) = head.content_type.filter(|_| !not_modified) {
        out.extend_from_slice(b"Content-Type: ");
        push_value(out, ct.as_bytes());
        if let Some(cs) = head.charset {
            out.extend_from_slice(b"; charset=");
            push_value(out, cs.as_bytes());
        }
        out.extend_from_slice(b"\r\n");
    }
    if let Some(n) = head.content_length.filter(|_| !no_length) {
        out.extend_from_slice(b"Content-Length: ");
        push_u64(out, n);
        out.extend_from_slice(b"\r\n");
    }
    // As nginx's header filter: validators only on 200, 206 and 304 (an error page served
    // from a file keeps its ETag, not its Last-Modified).
    if let Some(lm) = head.last_modified.filter(|_| matches!(s, 200 | 206 | 304)) {
        header(out, b"Last-Modified: ", lm.as_bytes());
    }
    out.extend_from_slice(if head.keep_alive {
        b"Connection: keep-alive\r\n"
    } else {
        b"Connection: close\r\n"
    });
    if let Some(loc) = head.location {
        header(out, b"Location: ", loc.as_bytes());
    }
    if let Some(v) = head.vary {
        header(out, b"Vary: ", v.as_bytes());
    }
    if let Some(etag) = head.etag {
        header(out, b"ETag: ", etag.as_bytes());
    }
    // nginx's range filter announces ranges on 200 only.
    if head.accept_ranges && s == 200 {
        out.extend_from_slice(b"Accept-Ranges: bytes\r\n");
    }
    if let Some(cr) = head.content_range {
        header(out, b"Content-Range: ", cr.as_bytes());
    }
    if let Some(ce) = head.content_encoding.filter(|_| !not_modified) {
        header(out, b"Content-Encoding: ", ce.as_bytes());
    }
    out.extend_from_slice(head.extra);
    out.extend_from_slice(b"\r\n");
}

/// Whether the connection is kept open after this response: the client asked for it, the
/// location allows keep-alive (`keepalive_timeout` > 0), the connection is under
/// `keepalive_requests` (counting this request), and the worker is not stopping.
pub fn keep_alive(
    req: &crate::request::Request,
    loc: &shard_config::LocationConf,
    requests_on_connection: u64,
    stopping: bool,
) -> bool {
    req.keep_alive
        && !stopping
        && loc.keepalive_timeout_ms > 0
        && requests_on_connection < loc.keepalive_requests
        && !browser_refuses_keepalive(req, loc)
}

/// An MSIE agent as nginx's `ngx_http_process_user_agent` tells one: `MSIE ` with at least
/// three more bytes after it, and no `Opera`.
pub fn is_msie(req: &crate::request::Request) -> bool {
    let Some(ua) = req.user_agent.as_deref() else {
        return false;
    };
    let b = ua.as_bytes();
    memchr::memmem::find(b, b"MSIE ").is_some_and(|i| i + 7 < b.len())
        && memchr::memmem::find(b, b"Opera").is_none()
}

/// `msie_refresh`: the page nginx sends MSIE instead of a 301 or 302 to `location` (as
/// written, not made absolute), escaped as its `NGX_ESCAPE_REFRESH`.
pub fn msie_refresh_page(location: &str) -> Vec<u8> {
    let mut out = String::from("<html><head><meta http-equiv=\"Refresh\" content=\"0; URL=");
    crate::static_file::percent_escape(location.as_bytes(), &mut out, |c| {
        (0x20..0x7f).contains(&c)
            && !matches!(
                c,
                b' ' | b'"' | b'\'' | b'<' | b'>' | b'\\' | b'^' | b'`' | b'{' | b'|' | b'~'
            )
    });
    out.push_str("\"></head><body></body></html>\r\n");
    out.into_bytes()
}

/// `keepalive_disable`: nginx's reading of the `User-Agent` (`ngx_http_process_user_agent`):
/// MSIE 4 to 6 (not 6 with `SV1`, not Opera) after a POST, and Safari on macOS.
fn browser_refuses_keepalive(
    req: &crate::request::Request,
    loc: &shard_config::LocationConf,
) -> bool {
    let k = loc.keepalive_disable;
    let Some(ua) = req.user_agent.as_deref().filter(|_| k.msie6 || k.safari) else {
        return false;
    };
    // `memmem` rather than `str::contains`, whose searcher is built anew each call (about
    // 500 instructions apiece, 3,400 per request for the six of them); and the rare names
    // first, so that an ordinary agent costs two scans.
    let has = |needle: &str| memchr::memmem::find(ua.as_bytes(), needle.as_bytes()).is_some();
    let msie = memchr::memmem::find(ua.as_bytes(), b"MSIE ");
    let safari_named = has("Safari/");
    if msie.is_none() && !safari_named {
        return false;
    }
    let opera = has("Opera");
    let msie_at = msie.filter(|&i| i + 7 < ua.len() && !opera);
    if let Some(i) = msie_at {
        let b = ua.as_bytes();
        let msie6 = b[i + 6] == b'.'
            && match b[i + 5] {
                b'4' | b'5' => true,
                b'6' => !ua[i + 8..].contains("SV1"),
                _ => false,
            };
        return k.msie6 && msie6 && req.method == crate::request::Method::Post;
    }
    let safari = !opera && safari_named && !has("Gecko/") && !has("Chrome/") && has("Mac OS X");
    k.safari && safari
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keep_alive_rules() {
        use crate::request::{parse, Limits, Parse};
        let Parse::Complete { req, .. } =
            parse(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", &Limits::default())
        else {
            panic!()
        };
        let mut loc = crate::route::tests::loc(shard_config::LocationKind::Prefix, "/");
        loc.keepalive_requests = 3;
        assert!(keep_alive(&req, &loc, 2, false));
        assert!(
            !keep_alive(&req, &loc, 3, false),
            "keepalive_requests reached"
        );
        assert!(!keep_alive(&req, &loc, 0, true), "stopping");
        loc.keepalive_timeout_ms = 0;
        assert!(!keep_alive(&req, &loc, 0, false), "keepalive_timeout 0");
    }

    fn head_text(h: &Head<'_>) -> String {
        let mut out = Vec::new();
        write_head(&mut out, h);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn full_head() {
        let t = head_text(&Head {
            status: 206,
            date: b"Sun, 06 Nov 1994 08:49:37 GMT",
            content_type: Some("text/plain"),
            content_length: Some(3),
            keep_alive: true,
            location: None,
            last_modified: Some("Sat, 05 Nov 1994 08:49:37 GMT"),
            etag: Some("\"1-a\""),
            accept_ranges: true,
            content_range: Some("bytes 2-4/10"),
            content_encoding: None,
            vary: None,
            server: SERVER_TOKENS_ON,
            extra: b"",
            charset: None,
        });
        assert_eq!(
            t,
            "HTTP/1.1 206 Partial Content\r\nServer: shard/0.1.0\r\nDate: Sun, 06 Nov 1994 08:49:37 GMT\r\n\
             Content-Type: text/plain\r\nContent-Length: 3\r\nLast-Modified: Sat, 05 Nov 1994 08:49:37 GMT\r\n\
             Connection: keep-alive\r\nETag: \"1-a\"\r\nContent-Range: bytes 2-4/10\r\n\r\n",
            "nginx announces ranges on 200 only"
        );
    }

    #[test]
    fn minimal_and_special_heads() {
        let t = head_text(&Head {
            status: 404,
            date: b"D",
            content_length: Some(0),
            ..Default::default()
        });
        assert_eq!(t, "HTTP/1.1 404 Not Found\r\nServer: shard/0.1.0\r\nDate: D\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
        let t = head_text(&Head {
            status: 304,
            date: b"D",
            content_type: Some("text/plain"),
            content_length: Some(0),
            etag: Some("\"e\""),
            accept_ranges: true,
            keep_alive: true,
            ..Default::default()
        });
        assert_eq!(t, "HTTP/1.1 304 Not Modified\r\nServer: shard/0.1.0\r\nDate: D\r\nConnection: keep-alive\r\nETag: \"e\"\r\n\r\n");
        let t = head_text(&Head {
            status: 299,
            date: b"D",
            location: Some("/x\r\nSet-Cookie: a"),
            ..Default::default()
        });
        assert_eq!(t, "HTTP/1.1 299 \r\nServer: shard/0.1.0\r\nDate: D\r\nConnection: close\r\nLocation: /xSet-Cookie: a\r\n\r\n");
    }

    #[test]
    fn numbers() {
        for n in [0u64, 7, 10, 99, 12345, u64::MAX] {
            let mut v = Vec::new();
            push_u64(&mut v, n);
            assert_eq!(v, n.to_string().into_bytes());
        }
    }

    #[test]
    fn error_pages() {
        assert_eq!(
            error_body(404),
            b"<html>\r\n<head><title>404 Not Found</title></head>\r\n<body>\r\n<center><h1>404 Not Found</h1></center>\r\n<hr><center>shard</center>\r\n</body>\r\n</html>\r\n"
        );
        assert!(error_body(299).is_empty());
        assert_eq!(error_simple(299).content_type, None);
        assert_eq!(error_simple(431).content_type.as_deref(), Some("text/html"));
        for code in [400, 403, 405, 408, 413, 414, 416, 431, 500, 501, 505] {
            let b = String::from_utf8(error_body(code).to_vec()).unwrap();
            assert!(b.contains(&format!("<title>{code} ")), "{code}");
            assert!(!status_text(code).is_empty());
        }
    }

    #[test]
    fn returns() {
        let r = return_reply(301, Some("/ok".into()), "text/plain");
        assert_eq!(
            (r.status, r.location.as_deref(), r.content_type.as_deref()),
            (301, Some("/ok"), Some("text/html"))
        );
        assert_eq!(r.body, error_body(301));
        let r = return_reply(200, Some("OK".into()), "text/plain");
        assert_eq!(
            r,
            Simple {
                status: 200,
                content_type: Some("text/plain".into()),
                location: None,
                body: b"OK".to_vec()
            }
        );
        assert_eq!(return_reply(403, None, "text/plain"), error_simple(403));
        let r = return_reply(204, None, "text/plain");
        assert_eq!(
            r,
            Simple {
                status: 204,
                content_type: None,
                location: None,
                body: vec![]
            }
        );
        let r = return_reply(404, Some("nope".into()), "text/x");
        assert_eq!(
            (r.status, r.body.as_slice(), r.content_type.as_deref()),
            (404, &b"nope"[..], Some("text/x"))
        );
    }

    #[test]
    fn absolute_locations() {
        assert_eq!(absolute_location("/a?b", "h.test", 80), "http://h.test/a?b");
        assert_eq!(
            absolute_location("/a", "h.test", 8080),
            "http://h.test:8080/a"
        );
        assert_eq!(absolute_location("https://x/", "h", 8080), "https://x/");
    }
}
