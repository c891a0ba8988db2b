//! SCGI, uwsgi and memcached on the wire (`ngx_http_scgi_module`, `ngx_http_uwsgi_module`,
//! `ngx_http_memcached_module`): the request head (the params; memcached's `get KEY`), and
//! the answer's head.
//!
//! Both send the params (the same as FastCGI's, [`crate::fastcgi::each_param`]) in one block
//! before the request body, which follows as it is; both answer with a CGI-style head
//! (`Status:`, else 302 with `Location:`, else 200) or an HTTP status line and headers, then
//! the body up to `Content-Length` or until the application closes. This module owns the
//! bytes; the proxy (`shard-server`'s `worker::proxy`) owns the connection, the body and the
//! answer's delivery, as for `proxy_pass`.

use crate::fastcgi::{each_param, parse_cgi_head};
use crate::proxy::{RequestCtx, ResponseParse};
use shard_config::{FastcgiConf, Wire};

/// The most a uwsgi packet's params may take: its length is 16 bits.
const UWSGI_MAX: usize = 65535;

/// Appends the head of an SCGI or uwsgi request: the params, before the body. `Err` is the
/// reason for the error log (nginx: "uwsgi request is too big"), and the request fails
/// with 500.
///
/// SCGI (a netstring): `LEN:` then `CONTENT_LENGTH`, the body's length (0 without one), and
/// every param as `NAME\0VALUE\0`, then `,`. uwsgi: the 4-byte header (`uwsgi_modifier1`,
/// the params' length as 16-bit little-endian, `uwsgi_modifier2`), then every param as its
/// name and value, each after its 16-bit little-endian length.
pub fn write_head(
    out: &mut Vec<u8>,
    ctx: &RequestCtx<'_>,
    conf: &FastcgiConf,
    cache: Option<(&[u8], &[u8])>,
) -> Result<(), String> {
    if conf.wire == Wire::Memcached {
        // `get KEY`: `$memcached_key`, escaped as nginx's `NGX_ESCAPE_MEMCACHED`.
        let key = memcached_key(ctx);
        if key.is_empty() {
            return Err("the \"$memcached_key\" variable is not set".to_string());
        }
        out.extend_from_slice(b"get ");
        out.extend_from_slice(&key);
        out.extend_from_slice(b"\r\n");
        return Ok(());
    }
    let mut block = Vec::with_capacity(512 + ctx.head.len());
    match conf.wire {
        Wire::Scgi => {
            let mut len = itoa(ctx.body_len.unwrap_or(0));
            block.extend_from_slice(b"CONTENT_LENGTH\0");
            block.append(&mut len);
            block.push(0);
            each_param(ctx, conf, cache, &mut |name, value| {
                block.extend_from_slice(name);
                block.push(0);
                block.extend_from_slice(value);
                block.push(0);
            });
            out.reserve(block.len() + 24);
            out.extend_from_slice(&itoa(block.len() as u64));
            out.push(b':');
            out.extend_from_slice(&block);
            out.push(b',');
        }
        Wire::Uwsgi | Wire::Fastcgi | Wire::Memcached | Wire::Grpc => {
            let mut long = false;
            each_param(ctx, conf, cache, &mut |name, value| {
                for part in [name, value] {
                    long |= part.len() > UWSGI_MAX;
                    block.extend_from_slice(&(part.len() as u16).to_le_bytes());
                    block.extend_from_slice(part);
                }
            });
            if long || block.len() > UWSGI_MAX {
                return Err(format!("uwsgi request is too big: {}", block.len()));
            }
            out.reserve(block.len() + 4);
            out.push(conf.modifier1);
            out.extend_from_slice(&(block.len() as u16).to_le_bytes());
            out.push(conf.modifier2);
            out.extend_from_slice(&block);
        }
    }
    Ok(())
}

/// `$memcached_key` of the request, escaped (space, `%` and control bytes as `%XX`).
pub fn memcached_key(ctx: &RequestCtx<'_>) -> Vec<u8> {
    let mut storage = crate::vars::header_storage();
    let hs = crate::vars::request_headers(ctx.head, &mut storage);
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
    let mut raw = Vec::new();
    let part = shard_config::Part::Var(shard_config::Var::User("memcached_key".to_string()));
    crate::vars::push_parts(&mut raw, std::slice::from_ref(&part), &vc);
    let mut out = Vec::with_capacity(raw.len());
    for &c in &raw {
        if c <= b' ' || c == b'%' || c == 0x7f {
            out.extend_from_slice(format!("%{c:02X}").as_bytes());
        } else {
            out.push(c);
        }
    }
    out
}

/// Parses memcached's answer to `get`: `VALUE KEY FLAGS LENGTH` then the data (a 200 of that
/// length, `Content-Encoding: gzip` when `FLAGS` has `gzip_flag`'s bits), or `END` (404). The
/// `\r\nEND\r\n` after the data is left unread: the connection is not kept. `Invalid` for
/// anything else (nginx: "memcached sent invalid response").
pub fn parse_memcached(
    buf: &[u8],
    key: &[u8],
    gzip_flag: u32,
    head_request: bool,
) -> ResponseParse {
    let Some(end) = memchr::memchr(b'\n', buf) else {
        return if buf.len() > 4096 {
            ResponseParse::Invalid("memcached sent invalid response")
        } else {
            ResponseParse::Partial
        };
    };
    let line = buf[..end].strip_suffix(b"\r").unwrap_or(&buf[..end]);
    let head = |status, framing, headers| ResponseParse::Complete {
        head: crate::proxy::ResponseHead {
            status,
            minor: 1,
            framing,
            reusable: false,
            headers,
            accel_redirect: false,
            accel_limit_rate: false,
            accel_charset: false,
        },
        head_len: end + 1,
    };
    if line == b"END" {
        return head(404, crate::proxy::Framing::None, Vec::new());
    }
    let Some(rest) = line.strip_prefix(b"VALUE ") else {
        return ResponseParse::Invalid("memcached sent invalid response");
    };
    let mut parts = rest.split(|&c| c == b' ');
    let (Some(k), Some(flags), Some(len)) = (parts.next(), parts.next(), parts.next()) else {
        return ResponseParse::Invalid("memcached sent invalid response");
    };
    if k != key {
        return ResponseParse::Invalid("memcached sent invalid key in response");
    }
    let num = |b: &[u8]| std::str::from_utf8(b).ok()?.parse::<u64>().ok();
    let (Some(flags), Some(len)) = (num(flags), num(len)) else {
        return ResponseParse::Invalid("memcached sent invalid response");
    };
    let mut headers = Vec::new();
    if gzip_flag != 0 && (flags as u32) & gzip_flag != 0 {
        headers.push(("Content-Encoding".to_string(), b"gzip".to_vec()));
    }
    if head_request {
        headers.push(("Content-Length".to_string(), len.to_string().into_bytes()));
        return head(200, crate::proxy::Framing::None, headers);
    }
    head(200, crate::proxy::Framing::Length(len), headers)
}

fn itoa(n: u64) -> Vec<u8> {
    n.to_string().into_bytes()
}

/// Parses the answer's head at the start of `buf`: an HTTP status line (`HTTP/1.1 404 Not
/// Found`) then header lines, or header lines alone (CGI style), as nginx's
/// `ngx_http_scgi_process_status_line`: a first line that is not a status line is a header.
/// The body runs to `Content-Length`, else to the close.
pub fn parse_head(buf: &[u8], max: usize, head_request: bool, pass: &[String]) -> ResponseParse {
    match status_line(buf) {
        Line::Partial if buf.len() >= max => ResponseParse::Invalid("upstream sent too big header"),
        Line::Partial => ResponseParse::Partial,
        Line::Not => parse_cgi_head(buf, max, head_request, pass, None),
        Line::Status(code, len) => {
            match parse_cgi_head(
                &buf[len..],
                max.saturating_sub(len),
                head_request,
                pass,
                Some(code),
            ) {
                ResponseParse::Complete { head, head_len } => ResponseParse::Complete {
                    head,
                    head_len: head_len + len,
                },
                other => other,
            }
        }
    }
}

enum Line {
    /// Not enough to tell.
    Partial,
    /// Not a status line: the head is CGI-style.
    Not,
    /// The status and the line's length with its end.
    Status(u16, usize),
}

/// `HTTP/D.D SP DDD [SP REASON] LF` (CRLF too), as `ngx_http_parse_status_line` takes it.
fn status_line(buf: &[u8]) -> Line {
    const PREFIX: &[u8] = b"HTTP/";
    let n = buf.len().min(PREFIX.len());
    if buf[..n] != PREFIX[..n] {
        return Line::Not;
    }
    let Some(end) = memchr::memchr(b'\n', buf) else {
        return Line::Partial;
    };
    let line = buf[..end].strip_suffix(b"\r").unwrap_or(&buf[..end]);
    let rest = &line[PREFIX.len()..];
    let Some(sp) = rest.iter().position(|&c| c == b' ') else {
        return Line::Not;
    };
    let version = &rest[..sp];
    let ok_version = version
        .split(|&c| c == b'.')
        .map(|p| !p.is_empty() && p.len() <= 3 && p.iter().all(u8::is_ascii_digit))
        .fold((0, true), |(k, all), ok| (k + 1, all && ok));
    if ok_version != (2, true) {
        return Line::Not;
    }
    let after = &rest[sp + 1..];
    let code = after.get(..3).filter(|c| c.iter().all(u8::is_ascii_digit));
    let Some(code) = code.filter(|_| after.len() == 3 || after[3] == b' ') else {
        return Line::Not;
    };
    let n = code.iter().fold(0u16, |a, &c| a * 10 + u16::from(c - b'0'));
    if n < 100 {
        return Line::Not;
    }
    Line::Status(n, end + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(buf: &[u8]) -> (u16, usize, Vec<(String, Vec<u8>)>) {
        match parse_head(buf, 4096, false, &[]) {
            ResponseParse::Complete { head, head_len } => (head.status, head_len, head.headers),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_status_line_or_a_cgi_head() {
        let (s, n, hs) = parse(b"HTTP/1.1 404 Not Found\r\nX-A: 1\r\n\r\nbody");
        assert_eq!((s, n), (404, 34));
        assert_eq!(hs, vec![("X-A".to_string(), b"1".to_vec())]);
        let (s, n, _) = parse(b"Status: 201 Made\r\nX-A: 1\r\n\r\n");
        assert_eq!((s, n), (201, 28));
        let (s, _, _) = parse(b"Location: /x\n\n");
        assert_eq!(s, 302);
        let (s, _, _) = parse(b"X-A: 1\n\n");
        assert_eq!(s, 200);
        // A status line's status stands, whatever `Status:` says.
        let (s, _, _) = parse(b"HTTP/1.0 203 OK\r\nStatus: 500\r\n\r\n");
        assert_eq!(s, 203);
    }

    #[test]
    fn partial_heads_wait_and_big_ones_fail() {
        assert!(matches!(
            parse_head(b"HTT", 4096, false, &[]),
            ResponseParse::Partial
        ));
        assert!(matches!(
            parse_head(b"HTTP/1.1 200 OK\r\nX-A", 4096, false, &[]),
            ResponseParse::Partial
        ));
        assert!(matches!(
            parse_head(b"HTTP/1.1 200 OK", 8, false, &[]),
            ResponseParse::Invalid(_)
        ));
    }
}
