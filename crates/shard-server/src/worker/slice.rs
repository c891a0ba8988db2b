//! `slice SIZE` (nginx's `ngx_http_slice_filter_module`): a proxied answer asked for in
//! ranges of `SIZE` (`$slice_range`, typically sent as `proxy_set_header Range` and part of
//! the `proxy_cache_key`), each its own upstream request and cache entry, joined into one
//! answer to the client.
//!
//! The first slice's `206` becomes the whole answer's head (status 200, the complete length,
//! no `Content-Range`), to which the client's own `Range`, `If-Range` and preconditions then
//! apply; each following slice is asked for when the one before it ended, its head checked
//! (a `206` with the expected range and the first one's `ETag`) and dropped, its body passed
//! on. Where nginx runs the following slices as subrequests, shard runs them as further
//! attempts of the same proxied request ([`Worker::slice_next`]). This module owns the slice
//! state and those checks; the proxy's steps move the bytes.

use super::*;
use shard_http::proxy::ResponseHead;

/// One sliced request's progress.
pub(super) struct Slice {
    size: u64,
    /// Where the next slice starts (the first one's start before its answer came).
    start: u64,
    /// Where the answer the client gets ends: the end of its range, or the whole length.
    end: u64,
    /// The first slice's `ETag`, which every following one must have.
    etag: Option<Vec<u8>>,
    /// The first slice answered: its head is the client's.
    first_done: bool,
    /// The body length of the slice being read.
    piece: u64,
    /// Where the first slice started (the window's offset).
    offset: u64,
}

/// What a slice's head means for the request.
pub(super) enum SliceHead {
    /// The first slice, turned into the whole answer's head (or an answer that is not a
    /// slice, passed as it is): the response starts as any other.
    Respond,
    /// A following slice: its body goes on after the last one's.
    Body,
    /// The answer cannot be joined: nginx's log line.
    Fail(String),
    /// The client's preconditions fail on the whole answer (412).
    Status(u16),
}

/// nginx's `ngx_http_slice_get_start`: the start of the client's single `Range` (0 with
/// `If-Range`, a suffix, several ranges or none).
fn client_start(req: &Request) -> u64 {
    if req.if_range.is_some() {
        return 0;
    }
    let Some(r) = req.range.as_deref() else {
        return 0;
    };
    if r.len() < 6 || !r[..6].eq_ignore_ascii_case("bytes=") || r.contains(',') {
        return 0;
    }
    let digits: String = r[6..]
        .trim_start_matches(' ')
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().unwrap_or(0)
}

/// A slice's `Content-Range`: `(start, end exclusive, complete length)`, the length `None`
/// for `*` (nginx's `ngx_http_slice_parse_content_range`).
fn content_range(v: &[u8]) -> Option<(u64, u64, Option<u64>)> {
    let v = std::str::from_utf8(v).ok()?.trim();
    let rest = v.strip_prefix("bytes ")?.trim_start();
    let (range, total) = rest.split_once('/')?;
    let (a, b) = range.split_once('-')?;
    let num = |s: &str| -> Option<u64> {
        let s = s.trim();
        (!s.is_empty() && s.bytes().all(|c| c.is_ascii_digit()))
            .then(|| s.parse().ok())
            .flatten()
    };
    let (a, b) = (num(a)?, num(b)?);
    let total = match total.trim() {
        "*" => None,
        t => Some(num(t)?),
    };
    Some((a, b.checked_add(1)?, total))
}

fn field<'h>(head: &'h ResponseHead, name: &str) -> Option<&'h [u8]> {
    head.headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| &v[..])
}

impl Worker<'_> {
    /// A request to a location with `slice`: its first slice is the one the client's range
    /// starts in.
    pub(super) fn slice_begin(&mut self, key: usize, p: &mut Proxy, size: u64) {
        let start = size * (client_start(&p.req) / size);
        p.slice = Some(Box::new(Slice {
            size,
            start,
            end: u64::MAX,
            etag: None,
            first_done: false,
            piece: 0,
            offset: start,
        }));
        self.conns[key].rq().slice_range = format!("bytes={}-{}", start, start + size - 1);
    }

    /// Judges a slice's answer head (before the response starts).
    pub(super) fn slice_head(&mut self, p: &mut Proxy, head: &mut ResponseHead) -> SliceHead {
        let Some(st) = p.slice.as_mut() else {
            return SliceHead::Respond;
        };
        if head.status != 206 {
            if !st.first_done {
                // Not a slice (the upstream ignores ranges): the answer as it is.
                p.slice = None;
                return SliceHead::Respond;
            }
            return SliceHead::Fail(format!(
                "unexpected status code {} in slice response",
                head.status
            ));
        }
        let etag = field(head, "etag").map(<[u8]>::to_vec);
        if st.etag.is_some() && etag != st.etag {
            return SliceHead::Fail("etag mismatch in slice response".to_string());
        }
        let Some((a, b, total)) = field(head, "content-range").and_then(content_range) else {
            return SliceHead::Fail("invalid range in slice response".to_string());
        };
        let Some(total) = total else {
            return SliceHead::Fail("no complete length in slice response".to_string());
        };
        let expected = (st.start + st.size).min(total);
        if a != st.start || b != expected {
            return SliceHead::Fail(format!(
                "unexpected range in slice response: {a}-{b}, expected: {}-{expected}",
                st.start
            ));
        }
        st.start = b;
        st.piece = b - a;
        if st.first_done {
            p.upbody = UpBody::Length(b - a);
            p.upstream_reusable = head.reusable;
            return SliceHead::Body;
        }
        // The first slice's head is the whole answer's.
        st.etag = etag;
        st.offset = a;
        st.end = total;
        head.status = 200;
        head.headers.retain(|(n, _)| {
            !n.eq_ignore_ascii_case("content-range") && !n.eq_ignore_ascii_case("accept-ranges")
        });
        head.framing = Framing::Length(total);
        // The whole answer's validators, judged as nginx's not-modified filter would.
        let text = |name: &str| field(head, name).map(|v| String::from_utf8_lossy(v).into_owned());
        let (lm, etag) = (text("last-modified"), text("etag"));
        let mode = self.proxy_location(p).if_modified_since;
        match crate::cache::conditional(&p.req, lm.as_deref(), etag.as_deref(), mode) {
            Some(412) => return SliceHead::Status(412),
            Some(_) => {
                head.status = 304;
                head.framing = Framing::None;
            }
            None => {}
        }
        SliceHead::Respond
    }

    /// The first slice's response started (`start_response`): its body is the slice's own
    /// length, placed at its offset in what the client gets; a client range ends the slices
    /// at its end (and skips those before it, as nginx's header filter).
    pub(super) fn slice_started(&mut self, p: &mut Proxy, status: u16) {
        let Some(st) = p.slice.as_mut().filter(|st| !st.first_done) else {
            return;
        };
        st.first_done = true;
        p.upbody = UpBody::Length(st.piece);
        match p.window.as_mut() {
            Some((a, b, pos)) => {
                *pos = st.offset;
                if st.start + st.size <= *a {
                    st.start = st.size * (*a / st.size);
                }
                st.end = *b;
            }
            None if status == 200 => {}
            // A 304: the slice is read (and stored), nothing of it sent, nothing follows.
            None => {
                st.end = 0;
                p.window = Some((0, 0, 0));
            }
        }
    }

    /// The slice in hand ended: the next one is asked for (`true`), or the answer is whole.
    pub(super) fn slice_next(&mut self, key: usize, p: &mut Proxy) -> bool {
        let Some(st) = p.slice.as_ref() else {
            return false;
        };
        if !st.first_done || st.start >= st.end {
            return false;
        }
        let (start, size) = (st.start, st.size);
        self.cache_commit(p);
        if let Some(u) = p.up.take() {
            if p.upstream_reusable && !p.body_cut {
                self.pool_upconn(u);
            } else {
                self.close_upconn(u);
            }
        }
        // (`proxy_connect` sets what each attempt starts with: `upreq_pos`, `reused`,
        // `grpc_begun`.)
        p.upreq.clear();
        p.cache = None;
        p.cache_looked = false;
        p.tried.fill(false);
        p.tries = 0;
        p.rbuf.clear();
        p.upbody = UpBody::None;
        p.last_failure = None;
        p.retry_peer = None;
        p.state = State::Connect;
        if let Some(w) = p.window.as_mut() {
            w.2 = start;
        }
        self.conns[key].rq().slice_range = format!("bytes={}-{}", start, start + size - 1);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_ranges_parse_as_nginx() {
        assert_eq!(content_range(b"bytes 0-1/16"), Some((0, 2, Some(16))));
        assert_eq!(content_range(b"bytes 2-3/*"), Some((2, 4, None)));
        assert_eq!(content_range(b"bytes  4 - 5 / 16"), Some((4, 6, Some(16))));
        assert_eq!(content_range(b"bytes x-1/2"), None);
        assert_eq!(content_range(b"items 0-1/2"), None);
    }

    #[test]
    fn the_first_slice_is_the_one_the_single_range_starts_in() {
        let req = |range: Option<&str>, if_range: bool| {
            let mut r = shard_http::request::Request::unparsed(b"GET /t HTTP/1.1");
            r.range = range.map(str::to_string);
            r.if_range = if_range.then(|| "\"x\"".to_string());
            client_start(&r)
        };
        assert_eq!(req(None, false), 0);
        assert_eq!(req(Some("bytes=5-9"), false), 5);
        assert_eq!(req(Some("bytes=5-"), false), 5);
        assert_eq!(req(Some("bytes=-5"), false), 0);
        assert_eq!(req(Some("bytes=3-3,4-4"), false), 0);
        assert_eq!(req(Some("bytes=5-9"), true), 0);
    }
}
