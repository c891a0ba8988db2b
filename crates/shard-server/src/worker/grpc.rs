//! `grpc_pass`: the proxy's request and response over an HTTP/2 upstream connection.
//!
//! The proxy builds its request head (with the `grpc_*` settings) and reads an HTTP/1.1
//! response as for `proxy_pass`; between the two, the upstream connection's
//! `shard_http::grpc::Conn` (kept with the connection, pooled with it) frames the request
//! as a stream and turns the upstream's frames back into that response. As nginx's grpc
//! module, the body is never buffered: it goes as DATA as the client sends it and the
//! upstream's windows allow, and the upstream's answers to come (SETTINGS and PING
//! acknowledgements, window updates) are written whenever the connection is driven.
//!
//! This module owns that exchange ([`Worker::grpc_begin`], [`Worker::grpc_exchange`],
//! [`Worker::grpc_read`]); peers, retries, timeouts and the response path are the proxy's.

use super::*;

/// The most bytes read from a gRPC upstream at once: a whole frame at the size we allow.
const GRPC_READ_BYTES: usize = 9 + shard_http::h2frame::DEFAULT_MAX_FRAME;

impl Worker<'_> {
    /// Writes what the upstream connection `u`'s HTTP/2 state has to send. `Ok(true)`: all
    /// of it went.
    pub(super) fn grpc_flush(&mut self, u: usize) -> std::io::Result<bool> {
        let Some(uc) = self.upconns.get_mut(u) else {
            return Err(std::io::Error::from_raw_os_error(libc::EBADF));
        };
        let Some(mut g) = uc.grpc.take() else {
            return Ok(true);
        };
        let mut pos = 0;
        let res = uc.write_from(&g.out, &mut pos);
        g.out.drain(..pos);
        uc.grpc = Some(g);
        res
    }

    /// Starts this attempt's stream: the head the proxy built becomes HEADERS (and a body it
    /// holds in memory, DATA); then the exchange goes on until the request is sent.
    pub(super) fn grpc_begin(&mut self, p: &mut Proxy) -> Flow {
        let Some(u) = p.up else {
            p.state = State::Connect;
            return Flow::Next;
        };
        if !p.grpc_begun {
            p.grpc_begun = true;
            let Some(pass) = self.proxy_pass(p) else {
                return Flow::Fail(500);
            };
            let (https, authority) = (pass.tls, pass.proxy_host.clone());
            let te = raw_header(&p.head, "te").is_some_and(shard_http::grpc::te_trailers);
            let head_end =
                memchr::memmem::find(&p.upreq, b"\r\n\r\n").map_or(p.upreq.len(), |i| i + 4);
            let (head, body) = p.upreq.split_at(head_end);
            // A body read before (an `error_page` to a `grpc_pass` location after the proxy
            // read it) may be in a file: it goes from there as the windows open.
            let in_file = p.body.file().map_or(0, |(_, len)| len);
            let no_body = !p.streaming && body.is_empty() && in_file == 0;
            let Some(g) = self.upconns[u].grpc.as_mut() else {
                return Flow::Fail(500);
            };
            if g.begin(head, authority.as_bytes(), https, te, no_body)
                .is_err()
            {
                return Flow::Fail(500);
            }
            if !p.streaming && !body.is_empty() {
                g.push_body(body, true);
            }
            p.file_pos = 0;
            // Sent, as far as a retry is concerned: the stream is the upstream's now.
            p.upreq_pos = p.upreq.len();
        }
        p.state = State::StreamBody;
        Flow::Next
    }

    /// The request's stream, until it is sent: the upstream's frames read (its answers and
    /// windows; a response that comes early is kept in `rbuf`), ours written, and the
    /// client's body moved into DATA frames as the windows open.
    pub(super) fn grpc_exchange(&mut self, key: usize, p: &mut Proxy) -> Flow {
        let loc = self.proxy_location(p);
        let bound = loc.body.buffer_size.max(1);
        let Some(u) = p.up else {
            return Flow::Fail(502);
        };
        let mut rounds = 0;
        loop {
            rounds += 1;
            if rounds > super::super::TURN_ROUNDS_MAX {
                self.yield_conn(key);
                return Flow::Wait;
            }
            if p.rbuf.len() < loc.proxy.buffer_size {
                match self.grpc_read(p, loc.proxy.buffer_size) {
                    Ok(Some(0)) => {
                        return self.attempt_failed(
                            key,
                            p,
                            Failure::Error,
                            "upstream prematurely closed connection while sending request to upstream",
                        );
                    }
                    Ok(_) => {}
                    Err(e) => {
                        let msg = format!("{e} while sending request to upstream");
                        return self.attempt_failed(key, p, Failure::Error, &msg);
                    }
                }
            }
            match self.grpc_flush(u) {
                Ok(_) => {}
                Err(e) => {
                    let msg = format!(
                        "writev() failed ({}) while sending request to upstream",
                        os(&e)
                    );
                    return self.attempt_failed(key, p, Failure::Error, &msg);
                }
            }
            let Some(g) = self.upconns[u].grpc.as_ref() else {
                return Flow::Fail(502);
            };
            let flushed = g.out.is_empty();
            if g.response_done() && !g.request_sent() && !p.streaming {
                // Answered before the whole body: the rest is not sent, and the
                // connection is not kept.
                p.body_cut = true;
            }
            // The response's head came (a stream that answers as it reads: the body goes
            // on beside the response, `grpc_pump`), or the whole request went.
            if g.head_read() || (g.request_sent() && flushed) {
                if let Some(a) = p.attempts.last_mut() {
                    a.bytes_sent = p.upreq.len() as u64 + p.stream_pos as u64;
                }
                return self.await_response(key, p);
            }
            let waiting = g.body_waiting();
            if flushed && waiting < bound && !p.streaming && !g.request_sent() {
                if let Some((file, len)) = p.body.file() {
                    // A body file: the next piece, read as the windows took the last.
                    let want = (bound - waiting).min((len - p.file_pos) as usize);
                    let mut piece = std::mem::take(&mut p.scratch);
                    piece.resize(want, 0);
                    let read = shard_event::sock::pread(file.as_raw_fd(), &mut piece, p.file_pos);
                    match read {
                        Ok(n) if n > 0 || want == 0 => {
                            p.file_pos += n as u64;
                            let last = p.file_pos >= len;
                            if let Some(g) = self.upconns[u].grpc.as_mut() {
                                g.push_body(&piece[..n], last);
                            }
                            piece.clear();
                            p.scratch = piece;
                            continue;
                        }
                        _ => {
                            piece.clear();
                            p.scratch = piece;
                            let msg = "the request body file could not be read while sending request to upstream";
                            return self.attempt_failed(key, p, Failure::Error, msg);
                        }
                    }
                }
            }
            if !flushed || waiting >= bound || !p.streaming || g.request_sent() {
                // The socket or the upstream's windows hold the rest.
                self.set_proxy_deadline(key, loc.proxy.send_timeout_ms);
                return Flow::Wait;
            }
            match self.grpc_pull_body(key, p, bound - waiting, true) {
                Ok(true) => {}
                Ok(false) => return Flow::Wait,
                Err(flow) => return flow,
            }
        }
    }

    /// While the response is read, what the client sends of its body still goes upstream
    /// (bidirectional streams); nothing here waits. `Some`: the request must end so.
    pub(super) fn grpc_pump(&mut self, key: usize, p: &mut Proxy) -> Option<Flow> {
        let u = p.up?;
        let bound = self.proxy_location(p).body.buffer_size.max(1);
        for _ in 0..super::super::TURN_ROUNDS_MAX {
            // A write that fails is seen by the next read, which ends the response.
            let _ = self.grpc_flush(u);
            let g = self.upconns.get(u)?.grpc.as_ref()?;
            if g.request_sent() || !g.out.is_empty() || !p.streaming {
                return None;
            }
            let waiting = g.body_waiting();
            if waiting >= bound {
                return None;
            }
            match self.grpc_pull_body(key, p, bound - waiting, false) {
                Ok(true) => {}
                Ok(false) => return None,
                Err(Flow::Fail(_)) if p.head_sent => return Some(Flow::Abort),
                Err(flow) => return Some(flow),
            }
        }
        None
    }

    /// Moves what the client sent of its body (up to `room` bytes) into the stream, and its
    /// end. `Ok(false)`: nothing now (the client's body timeout runs when `timed`).
    fn grpc_pull_body(
        &mut self,
        key: usize,
        p: &mut Proxy,
        room: usize,
        timed: bool,
    ) -> Result<bool, Flow> {
        let Some(u) = p.up else {
            return Err(Flow::Fail(502));
        };
        if !self.conns[key].body_pending() {
            if self.conns[key].close_after {
                return Err(Flow::Fail(self.bad_body_status(key)));
            }
            if let Some(g) = self.upconns[u].grpc.as_mut() {
                g.end_body();
            }
            return Ok(true);
        }
        let mut piece = std::mem::take(&mut p.scratch);
        piece.clear();
        let mut got = false;
        if !p.stream_chunked {
            match self.read_body_direct(key, &mut piece, room) {
                Some(Io::Ready) => got = true,
                Some(Io::Wait) => {}
                Some(Io::Close) => {
                    p.scratch = piece;
                    return Err(Flow::Close);
                }
                None => {}
            }
        }
        if !got {
            if self.conns[key].inbuf.is_empty() {
                match self.read_more(key) {
                    Io::Ready => {}
                    Io::Wait => {
                        p.scratch = piece;
                        if timed {
                            let t = self.cx.now_ms + self.conns[key].rq().body_timeout_ms;
                            self.set_conn_deadline(key, t);
                        }
                        return Ok(false);
                    }
                    Io::Close => {
                        p.scratch = piece;
                        return Err(Flow::Close);
                    }
                }
            }
            self.consume_body(key, Some(&mut piece));
        }
        if self.conns[key].close_after {
            p.scratch = piece;
            return Err(Flow::Fail(self.bad_body_status(key)));
        }
        p.stream_pos += piece.len();
        let bound = self.proxy_location(p).body.buffer_size.max(1);
        if let Some(copy) = &mut p.stream_copy {
            if copy.len() + piece.len() <= bound {
                copy.extend_from_slice(&piece);
            } else {
                p.stream_copy = None;
            }
        }
        let last = !self.conns[key].body_pending();
        if let Some(g) = self.upconns[u].grpc.as_mut() {
            g.push_body(&piece, last);
        }
        piece.clear();
        p.scratch = piece;
        Ok(true)
    }

    /// A pooled gRPC connection became readable: its control frames (SETTINGS, their
    /// acknowledgement, PING, WINDOW_UPDATE) are answered and it stays (`true`); anything
    /// else, the end of the connection, or a connection that is not gRPC's: `false`, the
    /// pool closes it. nginx's grpc module keeps its connections the same way.
    pub(super) fn grpc_idle_read(&mut self, u: usize) -> bool {
        let Some(uc) = self.upconns.get_mut(u) else {
            return false;
        };
        let Some(mut g) = uc.grpc.take() else {
            return false;
        };
        let keep = loop {
            if uc.hup && !uc.readable {
                break false;
            }
            match uc.read_into(&mut g.raw, GRPC_READ_BYTES) {
                Ok(Some(0)) | Err(_) => break false,
                Ok(Some(_)) => {
                    if !g.idle_feed() {
                        break false;
                    }
                }
                Ok(None) => break !uc.hup,
            }
        };
        uc.grpc = Some(g);
        keep && matches!(self.grpc_flush(u), Ok(true))
    }

    /// Reads the upstream's frames and turns them into response bytes at the end of
    /// `p.rbuf` (a head at most `head_max` long); what they ask of us is written on the
    /// way. As [`Worker::read_upstream`]: `Ok(None)` to wait, `Ok(Some(0))` the end (of the
    /// stream, or the connection closed).
    pub(super) fn grpc_read(
        &mut self,
        p: &mut Proxy,
        head_max: usize,
    ) -> std::io::Result<Option<usize>> {
        let Some(u) = p.up else {
            return Err(std::io::Error::from_raw_os_error(libc::EBADF));
        };
        let Some(mut g) = self.upconns.get_mut(u).and_then(|uc| uc.grpc.take()) else {
            return Err(std::io::Error::from_raw_os_error(libc::EBADF));
        };
        let res = loop {
            let before = p.rbuf.len();
            if let Err(e) = g.feed(&mut p.rbuf, head_max) {
                break Err(std::io::Error::other(e.to_string()));
            }
            let n = p.rbuf.len() - before;
            if n > 0 {
                break Ok(Some(n));
            }
            if g.response_done() {
                break Ok(Some(0));
            }
            let uc = &mut self.upconns[u];
            match uc.read_into(&mut g.raw, GRPC_READ_BYTES) {
                Ok(Some(0)) => break Ok(Some(0)),
                Ok(Some(n)) => {
                    if let Some(a) = p.attempts.last_mut() {
                        a.bytes_received += n as u64;
                    }
                }
                other => break other,
            }
        };
        self.upconns[u].grpc = Some(g);
        // Answers (acknowledgements, windows, body DATA the windows let go) leave now.
        self.grpc_flush(u)?;
        res
    }
}
