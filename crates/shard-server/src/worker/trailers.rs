//! `add_trailer`: fields sent after the last chunk of an HTTP/1.1 response, as nginx's
//! headers filter (`ngx_http_trailers_filter`) and chunked filter do.
//!
//! A response expects trailers when its location has an `add_trailer` for its status (the
//! statuses `add_header` uses, or any with `always`) and it can be chunked: HTTP/1.1 with
//! `chunked_transfer_encoding on`, not `HEAD`, a status with a body. Such a response is sent
//! chunked even when its length is known (nginx clears `Content-Length` then). Responses
//! shard makes itself (files, `return`, error pages) are re-framed here once made, their
//! trailers rendered then; proxied ones are framed by the proxy, their trailers rendered
//! at the last chunk (`proxy.rs`). An HTTP/2 stream's response is made the same way and
//! its session sends the trailers as a last HEADERS frame (`h2.rs`).
//!
//! It owns the framing and the rendering; the flush writes `Req::tail` after a file body.

use shard_config::LocationConf;
use shard_http::request::{Method, Request};

use super::Worker;

/// Whether a response of `status` to `req` in `loc` ends with trailers.
pub(super) fn expected(loc: &LocationConf, req: &Request, status: u16) -> bool {
    let safe = shard_http::response::headers_apply(status);
    loc.add_trailers.iter().any(|t| safe || t.always)
        && (req.http2 || (req.minor_version >= 1 && loc.chunked_transfer_encoding))
        && req.method != Method::Head
        && !(status < 200 || status == 204 || status == 304)
}

impl Worker<'_> {
    /// The last chunk and the trailers of `loc` for a response of `status` with
    /// `body_bytes`: each value rendered in order (`$sent_trailer_NAME` sees those before
    /// it, `$sent_http_NAME` the response head `sent`, when given); an empty value is not
    /// sent, as nginx.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn last_chunk(
        &self,
        key: usize,
        req: &Request,
        head: &[u8],
        loc: &LocationConf,
        status: u16,
        body_bytes: u64,
        upstream: &[shard_http::vars::UpstreamTry],
        sent: &[u8],
    ) -> Vec<u8> {
        let safe = shard_http::response::headers_apply(status);
        let mut made: Vec<(String, Vec<u8>)> = Vec::new();
        let mut storage = shard_http::vars::header_storage();
        let hs = shard_http::vars::request_headers(head, &mut storage);
        for t in loc.add_trailers.iter().filter(|t| safe || t.always) {
            let mut ctx = self.var_ctx(key, req, hs, loc);
            ctx.done = Some(shard_http::vars::Done {
                status,
                body_bytes,
                upstream,
                trailers: &made,
                head: sent,
                ..Default::default()
            });
            let mut v = Vec::new();
            shard_http::vars::push_parts(&mut v, &t.value, &ctx);
            v.retain(|&b| b != b'\r' && b != b'\n');
            if !v.is_empty() {
                made.push((t.name.clone(), v));
            }
        }
        let mut out = b"0\r\n".to_vec();
        for (n, v) in &made {
            out.extend_from_slice(n.as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(v);
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(b"\r\n");
        out
    }

    /// Re-frames the response shard made on `key` (its head from `out_start` in the output
    /// buffer, then its body there or as the request's file) as chunked with `loc`'s
    /// trailers, when it expects them.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn frame_trailers(
        &mut self,
        key: usize,
        out_start: usize,
        req: &Request,
        head: &[u8],
        loc: &LocationConf,
        status: u16,
        body_bytes: u64,
    ) {
        if loc.add_trailers.is_empty() || !expected(loc, req, status) {
            return;
        }
        let c = &mut self.conns[key];
        let Some(end) = c
            .out
            .get(out_start..)
            .and_then(|o| memchr::memmem::find(o, b"\r\n\r\n"))
            .map(|i| out_start + i + 4)
        else {
            return;
        };
        let Some(cl) = memchr::memmem::find(&c.out[out_start..end], b"\r\nContent-Length: ")
            .map(|i| out_start + i + 2)
        else {
            return;
        };
        let Some(cl_end) = memchr::memmem::find(&c.out[cl..end], b"\r\n").map(|i| cl + i + 2)
        else {
            return;
        };
        let sent = c.out[out_start..end].to_vec();
        let last = self.last_chunk(key, req, head, loc, status, body_bytes, &[], &sent);
        let c = &mut self.conns[key];
        let body = c.out.split_off(end);
        c.out.splice(
            cl..cl_end,
            b"Transfer-Encoding: chunked\r\n".iter().copied(),
        );
        let r = c.rq();
        match r.file_remaining() {
            Some(n) if n > 0 => {
                c.out.extend_from_slice(format!("{n:x}\r\n").as_bytes());
                let r = c.rq();
                r.tail = b"\r\n".to_vec();
                r.tail.extend_from_slice(&last);
            }
            _ => {
                shard_http::proxy::write_chunk(&mut c.out, &body);
                c.out.extend_from_slice(&last);
            }
        }
    }
}
