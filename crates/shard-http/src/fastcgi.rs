//! FastCGI's wire format (the FastCGI 1.0 specification, as `ngx_http_fastcgi_module` speaks
//! it): the request as records, the response's records back to a CGI byte stream, and the
//! CGI response head.
//!
//! This module owns the bytes: `BEGIN_REQUEST`, the `PARAMS` stream (every `fastcgi_param`,
//! then the client's headers as `HTTP_*`), `STDIN` records around the body, and on the way
//! back a [`Decoder`] that turns `STDOUT` records into the response bytes, keeps `STDERR` for
//! the error log and sees `END_REQUEST`; [`parse_head`] reads the CGI head (`Status:`,
//! `Location:`) into the proxy's [`ResponseHead`]. Moving bytes, pools and retries are the
//! proxy's (`shard-server`'s `worker/proxy.rs`): FastCGI is a second wire format for the same
//! machinery, not a second proxy.

use shard_config::{FastcgiConf, Part};

use crate::proxy::{Framing, RequestCtx, ResponseHead, ResponseParse};
use crate::request::MAX_HEADERS;

/// The protocol version every record carries.
const VERSION: u8 = 1;
/// The request id shard uses: one request per connection at a time (no multiplexing, as
/// nginx).
const REQUEST_ID: u16 = 1;
/// Record types.
const BEGIN_REQUEST: u8 = 1;
const END_REQUEST: u8 = 3;
const PARAMS: u8 = 4;
const STDIN: u8 = 5;
const STDOUT: u8 = 6;
const STDERR: u8 = 7;
/// The `BEGIN_REQUEST` role and flag.
const RESPONDER: u16 = 1;
const KEEP_CONN: u8 = 1;
/// A record header's size.
pub const HEADER_LEN: usize = 8;
/// The most content one record carries.
pub const MAX_CONTENT: usize = 0xffff;
/// Most response head lines, as for an HTTP upstream.
const MAX_RESPONSE_HEADERS: usize = 100;
/// Header lines parsed into stack storage first (a larger head takes a second parse).
const SMALL_HEADS: usize = 24;
/// Most bytes of one response's stderr kept for the log (nginx logs each record; shard joins
/// them and cuts here).
pub const STDERR_MAX: usize = 4096;

/// `$fastcgi_script_name` (before `fastcgi_index`) and `$fastcgi_path_info` for `uri`: the two
/// captures of `fastcgi_split_path_info` when it matches, else the URI and nothing.
pub fn split_path<'u>(conf: Option<&FastcgiConf>, uri: &'u str) -> (&'u str, &'u str) {
    let Some(re) = conf.and_then(|c| c.split_path_info.as_ref()) else {
        return (uri, "");
    };
    let mut caps = Vec::new();
    if !re.captures_into(uri, &mut caps) {
        return (uri, "");
    }
    let group = |i: usize| {
        caps.get(i)
            .copied()
            .flatten()
            .and_then(|(a, b)| uri.get(a..b))
            .unwrap_or("")
    };
    (group(1), group(2))
}

/// Appends one record (several when `content` is longer than a record takes), padded to a
/// multiple of 8 bytes as nginx pads them.
pub fn push_record(out: &mut Vec<u8>, kind: u8, content: &[u8]) {
    let mut rest = content;
    loop {
        let n = rest.len().min(MAX_CONTENT);
        push_record_header(out, kind, n);
        out.extend_from_slice(&rest[..n]);
        out.resize(out.len() + padding(n), 0);
        rest = &rest[n..];
        if rest.is_empty() {
            return;
        }
    }
}

/// A record header for `len` bytes of content and its padding.
pub fn push_record_header(out: &mut Vec<u8>, kind: u8, len: usize) {
    debug_assert!(len <= MAX_CONTENT);
    let len = len as u16;
    out.extend_from_slice(&[
        VERSION,
        kind,
        (REQUEST_ID >> 8) as u8,
        REQUEST_ID as u8,
        (len >> 8) as u8,
        len as u8,
        padding(len.into()) as u8,
        0,
    ]);
}

fn padding(n: usize) -> usize {
    (8 - n % 8) % 8
}

/// One `STDIN` record of a body piece, header and padding included (for bodies read from a
/// file piece by piece). `data` is at most [`MAX_CONTENT`] bytes.
pub fn push_stdin(out: &mut Vec<u8>, data: &[u8]) {
    push_record(out, STDIN, data);
}

/// The empty `STDIN` record: the body is complete.
pub fn push_stdin_end(out: &mut Vec<u8>) {
    push_record_header(out, STDIN, 0);
}

/// A FastCGI name-value pair: lengths of 1 byte below 128, else 4 bytes with the high bit.
fn push_pair(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    for len in [name.len(), value.len()] {
        if len < 128 {
            out.push(len as u8);
        } else {
            out.extend_from_slice(&((len as u32) | 0x8000_0000).to_be_bytes());
        }
    }
    out.extend_from_slice(name);
    out.extend_from_slice(value);
}

/// The params a cached request sets itself (empty unless revalidating), so the client's
/// headers of these names are not passed.
const CACHE_PARAMS: [&[u8]; 6] = [
    b"HTTP_IF_MODIFIED_SINCE",
    b"HTTP_IF_UNMODIFIED_SINCE",
    b"HTTP_IF_NONE_MATCH",
    b"HTTP_IF_MATCH",
    b"HTTP_RANGE",
    b"HTTP_IF_RANGE",
];

/// Appends the request's `BEGIN_REQUEST` and `PARAMS` records, and the body's `STDIN` records
/// when `body` is given (in memory); with a body in a file the caller sends its `STDIN`
/// records (see [`push_stdin`]) and the end ([`push_stdin_end`]).
///
/// Params, as nginx: every `fastcgi_param` in order (an `if_not_empty` one only when its value
/// is not empty), then with `fastcgi_pass_request_headers on` each client header as
/// `HTTP_NAME` (uppercase, `-` as `_`), unless a `fastcgi_param` set that name; repeated
/// headers are joined with `, ` (`; ` for `Cookie`).
///
/// `cache`: the response could be stored (`fastcgi_cache`), with the entry's `Last-Modified`
/// and `ETag` when revalidating (else empty): the client's validators and `Range` are not
/// passed, and the entry's are, as nginx's `params_cache`.
pub fn write_request(
    out: &mut Vec<u8>,
    ctx: &RequestCtx<'_>,
    conf: &FastcgiConf,
    body: Option<&[u8]>,
    cache: Option<(&[u8], &[u8])>,
) {
    let flags = if conf.keep_conn { KEEP_CONN } else { 0 };
    out.reserve(64 + 2 * HEADER_LEN + 512 + ctx.head.len() + body.map_or(0, |b| b.len() + 16));
    push_record(
        out,
        BEGIN_REQUEST,
        &[
            (RESPONDER >> 8) as u8,
            RESPONDER as u8,
            flags,
            0,
            0,
            0,
            0,
            0,
        ],
    );
    let mut params = Vec::with_capacity(512 + ctx.head.len());
    each_param(ctx, conf, cache, &mut |name, value| {
        push_pair(&mut params, name, value)
    });
    push_record(out, PARAMS, &params);
    push_record_header(out, PARAMS, 0);
    if let Some(b) = body {
        if !b.is_empty() {
            push_record(out, STDIN, b);
        }
        push_stdin_end(out);
    }
}

/// Every param of the request, in order, as nginx builds them for FastCGI, SCGI and uwsgi:
/// every `*_param` (an `if_not_empty` one only when its value is not empty), the cache's
/// validators when revalidating, then with `*_pass_request_headers on` each client header as
/// `HTTP_NAME` (uppercase, `-` as `_`), unless a param set that name; repeated headers are
/// joined with `, ` (`; ` for `Cookie`).
pub fn each_param(
    ctx: &RequestCtx<'_>,
    conf: &FastcgiConf,
    cache: Option<(&[u8], &[u8])>,
    emit: &mut dyn FnMut(&[u8], &[u8]),
) {
    // Storage for as many header lines as the head has (not the parser's maximum: zeroing
    // 100 entries per request showed in callgrind).
    let lines = memchr::memchr_iter(b'\n', ctx.head).count();
    let mut small = [httparse::EMPTY_HEADER; SMALL_HEADS];
    let mut big;
    let storage: &mut [httparse::Header<'_>] = if lines <= SMALL_HEADS {
        &mut small
    } else {
        big = vec![httparse::EMPTY_HEADER; lines.min(MAX_HEADERS)];
        &mut big
    };
    let hs = crate::vars::request_headers_in(ctx.head, storage);
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
    let mut value = Vec::with_capacity(256);
    for p in &conf.params {
        value.clear();
        push_value(&mut value, &p.value, &vc, ctx);
        if p.if_not_empty && value.is_empty() {
            continue;
        }
        emit(p.name.as_bytes(), &value);
    }
    let is_param = |name: &[u8]| {
        conf.params
            .iter()
            .any(|p| p.name.as_bytes().eq_ignore_ascii_case(name))
    };
    if let Some((last_modified, etag)) = cache {
        for (name, v) in [
            (&b"HTTP_IF_MODIFIED_SINCE"[..], last_modified),
            (b"HTTP_IF_NONE_MATCH", etag),
        ] {
            if !v.is_empty() && !is_param(name) {
                emit(name, v);
            }
        }
    }
    if conf.pass_request_headers {
        let mut name = Vec::new();
        for (i, h) in hs.iter().enumerate() {
            // As the proxy: a name `ignore_invalid_headers` drops is not passed.
            if !crate::request::header_name_forwarded(h.name.as_bytes(), ctx.req.names)
                || !h
                    .name
                    .bytes()
                    .all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_')
            {
                continue;
            }
            // A repeat was joined into its first occurrence.
            if hs[..i].iter().any(|e| e.name.eq_ignore_ascii_case(h.name)) {
                continue;
            }
            name.clear();
            name.extend_from_slice(b"HTTP_");
            name.extend(h.name.bytes().map(|c| match c {
                b'-' => b'_',
                c => c.to_ascii_uppercase(),
            }));
            if is_param(&name) || (cache.is_some() && CACHE_PARAMS.contains(&&name[..])) {
                continue;
            }
            let sep: &[u8] = if h.name.eq_ignore_ascii_case("cookie") {
                b"; "
            } else {
                b", "
            };
            value.clear();
            for e in hs[i..]
                .iter()
                .filter(|e| e.name.eq_ignore_ascii_case(h.name))
            {
                if !value.is_empty() {
                    value.extend_from_slice(sep);
                }
                value.extend_from_slice(e.value);
            }
            emit(&name, &value);
        }
    }
}

/// A param's value; `$content_length` is the body's length when shard knows it (a chunked
/// request's body was read and de-chunked first), as nginx passes it.
fn push_value(out: &mut Vec<u8>, parts: &[Part], vc: &crate::vars::Ctx<'_>, ctx: &RequestCtx<'_>) {
    for part in parts {
        match part {
            Part::Var(shard_config::Var::ContentLength) if ctx.body_len.is_some() => {
                crate::response::push_u64(out, ctx.body_len.unwrap_or(0));
            }
            p => crate::vars::push_parts(out, std::slice::from_ref(p), vc),
        }
    }
}

/// What [`Decoder::feed`] found.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Fed {
    /// Bytes of the input consumed (whole records, or parts of one).
    pub consumed: usize,
    /// `END_REQUEST` was read: the response is complete.
    pub ended: bool,
}

/// Turns the application's records back into the response's bytes.
#[derive(Debug, Default)]
pub struct Decoder {
    /// The current record: its type, content left, padding left.
    kind: u8,
    content_left: usize,
    padding_left: usize,
    /// Content of an `END_REQUEST` record so far (8 bytes).
    end: Vec<u8>,
    ended: bool,
}

impl Decoder {
    pub fn new() -> Decoder {
        Decoder::default()
    }

    /// `END_REQUEST` was read.
    pub fn is_done(&self) -> bool {
        self.ended
    }

    /// Consumes what it can of `input`: `STDOUT` content is appended to `stdout`, `STDERR`
    /// content to `stderr` (up to [`STDERR_MAX`] bytes). Bytes after `END_REQUEST` are not
    /// consumed. Errors are nginx's log messages.
    pub fn feed(
        &mut self,
        input: &[u8],
        stdout: &mut Vec<u8>,
        stderr: &mut Vec<u8>,
    ) -> Result<Fed, &'static str> {
        let mut pos = 0;
        while pos < input.len() && !self.ended {
            if self.content_left > 0 {
                let n = self.content_left.min(input.len() - pos);
                let data = &input[pos..pos + n];
                match self.kind {
                    STDOUT => stdout.extend_from_slice(data),
                    STDERR => {
                        let room = STDERR_MAX.saturating_sub(stderr.len());
                        stderr.extend_from_slice(&data[..n.min(room)]);
                    }
                    END_REQUEST => self.end.extend_from_slice(data),
                    _ => {}
                }
                pos += n;
                self.content_left -= n;
                if self.content_left == 0 && self.kind == END_REQUEST && self.padding_left == 0 {
                    self.ended = true;
                }
                continue;
            }
            if self.padding_left > 0 {
                let n = self.padding_left.min(input.len() - pos);
                pos += n;
                self.padding_left -= n;
                if self.padding_left == 0 && self.kind == END_REQUEST {
                    self.ended = true;
                }
                continue;
            }
            // A new record header.
            if input.len() - pos < HEADER_LEN {
                break;
            }
            let h = &input[pos..pos + HEADER_LEN];
            if h[0] != VERSION {
                return Err("upstream sent unsupported FastCGI protocol version");
            }
            let id = u16::from_be_bytes([h[2], h[3]]);
            let len = usize::from(u16::from_be_bytes([h[4], h[5]]));
            let kind = h[1];
            if !matches!(kind, STDOUT | STDERR | END_REQUEST) {
                return Err("upstream sent invalid FastCGI record type");
            }
            if id != REQUEST_ID {
                return Err("upstream sent unexpected FastCGI request id");
            }
            pos += HEADER_LEN;
            self.kind = kind;
            self.content_left = len;
            self.padding_left = usize::from(h[6]);
            if kind == END_REQUEST && len < 8 {
                return Err("upstream sent invalid FastCGI end request record");
            }
        }
        Ok(Fed {
            consumed: pos,
            ended: self.ended,
        })
    }
}

/// Parses the CGI response head at the start of `buf` (the application's stdout so far):
/// header lines up to an empty line, LF or CRLF. The status is `Status:` (`404` or
/// `404 Not Found`), else 302 with a `Location:`, else 200, as nginx. `Status` and the
/// `X-Accel-*` headers are not passed on; nor are `Server`, `Date` and hop-by-hop headers,
/// which are shard's own (`fastcgi_pass_header` passes the first ones). The body is
/// `Content-Length` long, else runs until `END_REQUEST`.
pub fn parse_head(buf: &[u8], max: usize, head_request: bool, pass: &[String]) -> ResponseParse {
    parse_cgi_head(buf, max, head_request, pass, None)
}

/// [`parse_head`], with the status of a status line read before the headers (`fixed`,
/// SCGI's and uwsgi's answers may start with one), which a `Status:` header does not change.
pub(crate) fn parse_cgi_head(
    buf: &[u8],
    max: usize,
    head_request: bool,
    pass: &[String],
    fixed: Option<u16>,
) -> ResponseParse {
    // Nothing to parse before the empty line that ends the head has arrived.
    let ended = buf.starts_with(b"\n")
        || buf.starts_with(b"\r\n")
        || memchr::memchr_iter(b'\n', buf).any(|i| {
            buf.get(i + 1) == Some(&b'\n')
                || (buf.get(i + 1) == Some(&b'\r') && buf.get(i + 2) == Some(&b'\n'))
        });
    if !ended {
        return if buf.len() >= max {
            ResponseParse::Invalid("upstream sent too big header")
        } else {
            ResponseParse::Partial
        };
    }
    let mut small = [httparse::EMPTY_HEADER; SMALL_HEADS];
    let mut big;
    let parsed = match httparse::parse_headers(buf, &mut small) {
        Err(httparse::Error::TooManyHeaders) => {
            big = vec![httparse::EMPTY_HEADER; MAX_RESPONSE_HEADERS];
            httparse::parse_headers(buf, &mut big)
        }
        other => other,
    };
    let (head_len, hs) = match parsed {
        Ok(httparse::Status::Complete((n, hs))) => (n, hs),
        Ok(httparse::Status::Partial) if buf.len() >= max => {
            return ResponseParse::Invalid("upstream sent too big header")
        }
        Ok(httparse::Status::Partial) => return ResponseParse::Partial,
        Err(httparse::Error::TooManyHeaders) => {
            return ResponseParse::Invalid("upstream sent too big header")
        }
        Err(_) => return ResponseParse::Invalid("upstream sent invalid header"),
    };
    if head_len > max {
        return ResponseParse::Invalid("upstream sent too big header");
    }
    let mut status = None;
    let mut location = false;
    let mut length: Option<u64> = None;
    for h in hs.iter() {
        if h.name.eq_ignore_ascii_case("status") {
            let v = trim(h.value);
            let code = v.get(..3).filter(|c| c.iter().all(u8::is_ascii_digit));
            let Some(code) = code.filter(|_| v.len() == 3 || v[3] == b' ') else {
                return ResponseParse::Invalid("upstream sent invalid status");
            };
            let n = code.iter().fold(0u16, |a, &c| a * 10 + u16::from(c - b'0'));
            if !(100..=999).contains(&n) {
                return ResponseParse::Invalid("upstream sent invalid status");
            }
            status = Some(n);
        } else if h.name.eq_ignore_ascii_case("location") {
            location = true;
        } else if h.name.eq_ignore_ascii_case("content-length") {
            let v = trim(h.value);
            let n = std::str::from_utf8(v)
                .ok()
                .filter(|s| !s.is_empty() && s.bytes().all(|c| c.is_ascii_digit()))
                .and_then(|s| s.parse::<u64>().ok());
            match n {
                Some(n) if length.is_none_or(|l| l == n) => length = Some(n),
                _ => {
                    return ResponseParse::Invalid(
                        "upstream sent invalid \"Content-Length\" header",
                    )
                }
            }
        }
    }
    let status = fixed.or(status).unwrap_or(if location { 302 } else { 200 });
    let framing = if head_request || status == 204 || status == 304 {
        Framing::None
    } else if let Some(n) = length {
        Framing::Length(n)
    } else {
        Framing::Close
    };
    let headers = hs
        .iter()
        .filter(|h| {
            let n = h.name;
            if n.eq_ignore_ascii_case("status") {
                return false;
            }
            // The body's length is the framing's, written once by the proxy; a HEAD's
            // answer passes the application's.
            if n.eq_ignore_ascii_case("content-length") {
                return head_request;
            }
            if (head_request && n.eq_ignore_ascii_case("content-length"))
                || n.get(..8)
                    .is_some_and(|p| p.eq_ignore_ascii_case("x-accel-"))
                || n.eq_ignore_ascii_case("server")
                || n.eq_ignore_ascii_case("date")
            {
                return pass.iter().any(|p| n.eq_ignore_ascii_case(p))
                    || (head_request && n.eq_ignore_ascii_case("content-length"));
            }
            !HOP_BY_HOP.iter().any(|hop| n.eq_ignore_ascii_case(hop))
        })
        .map(|h| (h.name.to_string(), h.value.to_vec()))
        .collect();
    ResponseParse::Complete {
        head: ResponseHead {
            status,
            minor: 1,
            framing,
            reusable: false,
            headers,
            // The proxy reads the records' head itself (`X-Accel-Redirect` from PHP).
            accel_redirect: true,
            accel_limit_rate: true,
            accel_charset: true,
        },
        head_len,
    }
}

/// Headers that describe a connection, never passed from an application's head.
const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "te",
    "trailer",
    "upgrade",
    "proxy-authenticate",
];

fn trim(v: &[u8]) -> &[u8] {
    let s = v
        .iter()
        .position(|c| !c.is_ascii_whitespace())
        .unwrap_or(v.len());
    let e = v
        .iter()
        .rposition(|c| !c.is_ascii_whitespace())
        .map_or(s, |e| e + 1);
    &v[s..e]
}

/// The stderr text as nginx logs it: `FastCGI sent in stderr: "..."`, the text trimmed of
/// trailing line ends, with control characters other than tab escaped.
pub fn stderr_message(stderr: &[u8]) -> String {
    let text = String::from_utf8_lossy(stderr);
    let text = text.trim_end_matches(['\r', '\n']);
    let mut out = String::with_capacity(text.len() + 32);
    out.push_str("FastCGI sent in stderr: \"");
    for c in text.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c if c.is_control() && c != '\t' => out.push_str(&format!("\\x{:02X}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(kind: u8, content: &[u8], pad: u8) -> Vec<u8> {
        let mut v = vec![
            1,
            kind,
            0,
            1,
            (content.len() >> 8) as u8,
            content.len() as u8,
            pad,
            0,
        ];
        v.extend_from_slice(content);
        v.resize(v.len() + usize::from(pad), 0);
        v
    }

    #[test]
    fn records_are_padded_and_split() {
        let mut out = Vec::new();
        push_record(&mut out, STDIN, b"abc");
        assert_eq!(
            out,
            [1, 5, 0, 1, 0, 3, 5, 0, b'a', b'b', b'c', 0, 0, 0, 0, 0]
        );
        let mut out = Vec::new();
        push_record(&mut out, STDIN, &vec![7u8; MAX_CONTENT + 10]);
        // 65535 + 1 padding, then 10 + 6 padding, each behind a header.
        assert_eq!(out.len(), 8 + MAX_CONTENT + 1 + 8 + 10 + 6);
        assert_eq!(&out[..8], &[1, 5, 0, 1, 0xff, 0xff, 1, 0]);
        let second = 8 + MAX_CONTENT + 1;
        assert_eq!(&out[second..second + 8], &[1, 5, 0, 1, 0, 10, 6, 0]);
    }

    #[test]
    fn pairs_use_long_lengths_from_128() {
        let mut out = Vec::new();
        push_pair(&mut out, b"A", &[b'x'; 200]);
        assert_eq!(&out[..5], &[1, 0x80, 0, 0, 200]);
        assert_eq!(out.len(), 5 + 1 + 200);
    }

    #[test]
    fn decoder_reads_records_in_any_pieces() {
        let mut wire = record(STDERR, b"PHP Warning: x\n", 1);
        wire.extend(record(STDOUT, b"Status: 404\r\n\r\nbody", 4));
        wire.extend(record(STDOUT, b"", 0));
        wire.extend(record(END_REQUEST, &[0; 8], 0));
        wire.extend_from_slice(b"extra");
        for step in [1, 3, 7, 64] {
            let mut d = Decoder::new();
            let (mut out, mut err) = (Vec::new(), Vec::new());
            let mut pos = 0;
            let mut buf = Vec::new();
            while pos < wire.len() && !d.is_done() {
                let end = (pos + step).min(wire.len());
                buf.extend_from_slice(&wire[pos..end]);
                pos = end;
                let fed = d.feed(&buf, &mut out, &mut err).unwrap();
                buf.drain(..fed.consumed);
            }
            assert!(d.is_done(), "step {step}");
            assert_eq!(out, b"Status: 404\r\n\r\nbody");
            assert_eq!(err, b"PHP Warning: x\n");
        }
        let mut d = Decoder::new();
        let fed = d.feed(&wire, &mut Vec::new(), &mut Vec::new()).unwrap();
        assert_eq!(fed.consumed, wire.len() - 5, "bytes after the end are left");
    }

    #[test]
    fn decoder_refuses_what_nginx_refuses() {
        let mut d = Decoder::new();
        let mut bad = record(STDOUT, b"x", 7);
        bad[0] = 2;
        assert!(d.feed(&bad, &mut Vec::new(), &mut Vec::new()).is_err());
        let mut d = Decoder::new();
        let mut bad = record(STDOUT, b"x", 7);
        bad[3] = 9;
        assert_eq!(
            d.feed(&bad, &mut Vec::new(), &mut Vec::new()),
            Err("upstream sent unexpected FastCGI request id")
        );
        let mut d = Decoder::new();
        assert!(d
            .feed(&record(11, b"", 0), &mut Vec::new(), &mut Vec::new())
            .is_err());
    }

    fn head(buf: &[u8]) -> (u16, Framing, Vec<(String, Vec<u8>)>, usize) {
        match parse_head(buf, 4096, false, &[]) {
            ResponseParse::Complete { head, head_len } => {
                (head.status, head.framing, head.headers, head_len)
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn cgi_heads() {
        let (st, fr, hs, n) = head(b"Content-type: text/html\r\n\r\nhello");
        assert_eq!((st, fr, n), (200, Framing::Close, 27));
        assert_eq!(
            hs,
            vec![("Content-type".to_string(), b"text/html".to_vec())]
        );
        let (st, _, hs, _) = head(b"Status: 404 Not Found\nX-Powered-By: PHP\n\n");
        assert_eq!(st, 404);
        assert_eq!(hs.len(), 1, "Status is not passed");
        let (st, _, _, _) = head(b"Location: /login\r\n\r\n");
        assert_eq!(st, 302);
        let (st, _, _, _) = head(b"Status: 301\r\nLocation: /x\r\n\r\n");
        assert_eq!(st, 301);
        let (_, fr, _, _) = head(b"Content-Length: 5\r\nX-Accel-Redirect: /a\r\n\r\n");
        assert_eq!(fr, Framing::Length(5));
        assert!(matches!(
            parse_head(b"Status: abc\r\n\r\n", 4096, false, &[]),
            ResponseParse::Invalid(_)
        ));
        assert!(matches!(
            parse_head(b"Content-Type: x\r\n", 4096, false, &[]),
            ResponseParse::Partial
        ));
        assert!(matches!(
            parse_head(&[b'a'; 100], 64, false, &[]),
            ResponseParse::Invalid("upstream sent too big header")
        ));
    }

    #[test]
    fn heads_with_many_lines_and_split_heads() {
        let mut many = String::new();
        for i in 0..40 {
            many.push_str(&format!("X-H{i}: v\r\n"));
        }
        many.push_str("\r\nbody");
        let (st, _, hs, _) = head(many.as_bytes());
        assert_eq!((st, hs.len()), (200, 40));
        // The empty line split over reads: partial until it is whole, in either line ending.
        assert!(matches!(
            parse_head(b"Status: 201\r\n\r", 4096, false, &[]),
            ResponseParse::Partial
        ));
        assert_eq!(head(b"Status: 201\n\nx").0, 201);
        assert_eq!(head(b"\r\nbody only").0, 200);
    }

    #[test]
    fn stderr_is_logged_as_nginx_writes_it() {
        assert_eq!(
            stderr_message(b"PHP Warning:  oops in /a.php on line 3\n"),
            "FastCGI sent in stderr: \"PHP Warning:  oops in /a.php on line 3\""
        );
    }
}
