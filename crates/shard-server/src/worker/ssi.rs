//! Server Side Includes (`ssi on`) and the subrequests they make.
//!
//! A response that SSI applies to (`ssi_types`) leaves through a [`Pipe`] its request holds:
//! `Conn::flush` hands the pipe the HTTP/1.1 bytes the phases made (from any content source:
//! a file read whole, `return`, the proxy, FastCGI, the cache) instead of the socket, and the
//! pipe writes what comes out to the socket (or to an HTTP/2 stream, or to its own parent's
//! subrequest). The pipe rewrites the head (no `Content-Length`, `Accept-Ranges`, and no
//! validators unless `ssi_last_modified`; chunked for HTTP/1.1 clients, else the connection
//! closes after it), decodes the body's framing, cuts commands out with
//! `shard_http::ssi::Parser`, and stops at each: its writes refuse more until the worker has
//! run the command ([`Worker::ssi_step`], after each drive of the connection), because a
//! command reads variables and may start a subrequest.
//!
//! A **subrequest** (`include virtual=` / `file=`) is a connection of its own in
//! `Worker::conns`, with no socket, like an HTTP/2 stream: its input is a `GET` head with the
//! main request's headers, every phase runs for it, and its output goes to a [`SubOut`] in
//! `Worker::subs` (head read and dropped, body decoded) that the parent's pipe takes into its
//! output, in order. Includes run one at a time (each is waited for, as nginx's `wait="yes"`):
//! the output is nginx's, its parallelism is not. The subrequest's output is bounded
//! (`SUB_DATA_MAX`, then its writes wait for the parent), `set=` keeps at most
//! `subrequest_output_buffer_size`. `post_action` and `mirror` start subrequests whose output
//! nobody reads; a mirror's input is the main request's method, arguments, headers and (when
//! all of it is in the input buffer) body.
//!
//! This module owns the pipes, the subrequests' outputs and the commands; it does not own the
//! phases, the sockets, or closing connections (the loop's `close`, which ends a parent's
//! subrequest with it).

use shard_config::{LocationConf, SsiConf};
use shard_http::body::ChunkedDecoder;
use shard_http::ssi::{self as parse, Command, Item, Parser, Seg};

use super::conn::Conn;
use super::Worker;

/// Bytes a pipe holds for its sink before it takes no more input.
const OUT_MAX: usize = 64 * 1024;
/// Output a pipe waiting for a command or a subrequest keeps before it writes (nginx's
/// `postpone_output` default): a document whose first include fails early has sent nothing.
const POSTPONE: usize = 1460;
/// Body bytes parsed per round (commands stop it sooner).
const PARSE_STEP: usize = 16 * 1024;
/// Body bytes of a subrequest waiting for its parent before its writes wait.
const SUB_DATA_MAX: usize = 64 * 1024;
/// The most a `stub=` include keeps while it waits to know whether its stub replaces it.
const STUB_KEEP_MAX: usize = 1024 * 1024;
/// A response head longer than this is passed on unprocessed.
const HEAD_MAX: usize = 64 * 1024;
/// Commands and subrequest hand-overs one drive of a connection runs before it yields.
const STEPS_MAX: usize = 64;
/// How deep subrequests may nest (nginx's `NGX_HTTP_MAX_SUBREQUESTS` is about their
/// number; this is about recursion, `/a.html` including itself).
const DEPTH_MAX: u8 = 50;

/// The framing of an HTTP/1.1 response being read: its head, then its body.
#[derive(Debug)]
enum Framing {
    Head(Vec<u8>),
    Length(u64),
    Chunked(ChunkedDecoder),
    UntilClose,
    Done,
}

/// Reads a response: the head whole, then the body's payload decoded.
#[derive(Debug)]
struct Reader {
    framing: Framing,
    /// The head was not one this reader understands (or too long): it was handed over as
    /// it came, and what follows is taken until the close.
    bad: bool,
    /// The request was `HEAD`: no body whatever the head says.
    head_only: bool,
}

/// What one [`Reader::feed`] did.
struct Fed {
    taken: usize,
    /// The head, when this call completed it.
    head: Option<Vec<u8>>,
}

impl Reader {
    fn new(head_only: bool) -> Reader {
        Reader {
            framing: Framing::Head(Vec::new()),
            bad: false,
            head_only,
        }
    }

    fn done(&self) -> bool {
        matches!(self.framing, Framing::Done)
    }

    fn in_body(&self) -> bool {
        !matches!(self.framing, Framing::Head(_))
    }

    /// Takes response bytes: the payload is appended to `body`. Err: the head or the chunks
    /// are malformed.
    fn feed(&mut self, buf: &[u8], body: &mut Vec<u8>) -> Result<Fed, ()> {
        match &mut self.framing {
            Framing::Head(acc) => {
                let before = acc.len();
                let take = buf.len().min(HEAD_MAX + 4 - before.min(HEAD_MAX));
                acc.extend_from_slice(&buf[..take]);
                let Some(end) = memchr::memmem::find(acc, b"\r\n\r\n") else {
                    if acc.len() > HEAD_MAX {
                        let head = std::mem::take(acc);
                        self.bad = true;
                        self.framing = Framing::UntilClose;
                        return Ok(Fed {
                            taken: take,
                            head: Some(head),
                        });
                    }
                    return Ok(Fed {
                        taken: take,
                        head: None,
                    });
                };
                let head_len = end + 4;
                let mut head = std::mem::take(acc);
                head.truncate(head_len);
                let Ok((status, framing)) = framing_of(&head) else {
                    self.bad = true;
                    self.framing = Framing::UntilClose;
                    return Ok(Fed {
                        taken: head_len - before,
                        head: Some(head),
                    });
                };
                if (100..200).contains(&status) && status != 101 {
                    // Interim: the real head follows.
                    self.framing = Framing::Head(Vec::new());
                    return Ok(Fed {
                        taken: head_len - before,
                        head: None,
                    });
                }
                let no_body = self.head_only || matches!(status, 101 | 204 | 304);
                self.framing = if no_body { Framing::Done } else { framing };
                Ok(Fed {
                    taken: head_len - before,
                    head: Some(head),
                })
            }
            Framing::Length(left) => {
                let n = (*left).min(buf.len() as u64) as usize;
                body.extend_from_slice(&buf[..n]);
                *left -= n as u64;
                if *left == 0 {
                    self.framing = Framing::Done;
                }
                Ok(Fed {
                    taken: n,
                    head: None,
                })
            }
            Framing::Chunked(dec) => {
                let f = dec.feed_into(buf, body).map_err(|_| ())?;
                if dec.is_done() {
                    self.framing = Framing::Done;
                }
                Ok(Fed {
                    taken: f.consumed,
                    head: None,
                })
            }
            Framing::UntilClose => {
                body.extend_from_slice(buf);
                Ok(Fed {
                    taken: buf.len(),
                    head: None,
                })
            }
            // What follows a response belongs to the next one: not ours.
            Framing::Done => Ok(Fed {
                taken: 0,
                head: None,
            }),
        }
    }
}

/// A response head's status and body framing.
fn framing_of(head: &[u8]) -> Result<(u16, Framing), ()> {
    let mut fields = [httparse::EMPTY_HEADER; 128];
    let mut r = httparse::Response::new(&mut fields);
    match r.parse(head) {
        Ok(httparse::Status::Complete(_)) => {}
        _ => return Err(()),
    }
    let status = r.code.ok_or(())?;
    let mut framing = Framing::UntilClose;
    for f in r.headers.iter() {
        if f.name.eq_ignore_ascii_case("transfer-encoding") {
            framing = Framing::Chunked(ChunkedDecoder::new());
            break;
        }
        if f.name.eq_ignore_ascii_case("content-length") {
            let n: u64 = std::str::from_utf8(f.value)
                .ok()
                .and_then(|v| v.trim().parse().ok())
                .ok_or(())?;
            framing = if n == 0 {
                Framing::Done
            } else {
                Framing::Length(n)
            };
        }
    }
    Ok((status, framing))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// Bytes of earlier (pipelined) responses still to pass.
    Skip,
    Head,
    Body,
    /// Not processed (or processed and ended): bytes pass as they are.
    Pass,
}

/// nginx's `ctx->conditional`.
const COND_IF: u8 = 1;
const COND_ELSE: u8 = 2;

/// The SSI processing of one response (see the module's text).
pub(super) struct Pipe {
    stage: Stage,
    skip: usize,
    reader: Reader,
    chunked_out: bool,
    /// The client cannot be told where the body ends (HTTP/1.0): the connection closes.
    pub(super) must_close: bool,
    conf: SsiConf,
    parser: Parser,
    /// Decoded body bytes not parsed yet (a stub's text is put in front of them).
    body: Vec<u8>,
    body_pos: usize,
    text: Vec<u8>,
    /// Bytes for the sink, framed.
    out: Vec<u8>,
    out_pos: usize,
    /// The sink refused the last write (the socket is full): not a pause.
    pub(super) sink_blocked: bool,
    /// A command the worker must run before more is parsed.
    pending: Option<Item>,
    /// The subrequest (`Worker::subs`) being waited for.
    waiting: Option<usize>,
    ended: bool,
    /// A subrequest failed so that the whole response fails (nginx finalizes the main
    /// request with the error): the connection closes.
    failed: bool,
    // nginx's `ngx_http_ssi_ctx_t`.
    vars: Vec<(String, Vec<u8>)>,
    output: bool,
    output_chosen: bool,
    conditional: u8,
    in_block: bool,
    blocks: Vec<(String, Vec<u8>)>,
    errmsg: Vec<u8>,
    timefmt: String,
    // The request, for variables and subrequests.
    server: usize,
    location: Option<usize>,
    req: shard_http::request::Request,
    head: Vec<u8>,
    depth: u8,
    /// SSI applies (else only the addition module: the body passes as it is).
    parse: bool,
    /// `add_before_body` and `add_after_body` still to include.
    before: Option<Vec<u8>>,
    after: Option<Vec<u8>>,
}

/// An `include virtual=URI` for the addition module's bodies.
fn include_of(uri: Vec<u8>) -> Item {
    Item::Command(Command {
        name: "include".to_string(),
        params: vec![("virtual".to_string(), uri)],
    })
}

impl Pipe {
    /// A pipe for the response to `req` (whose head is `head`), with `conf`; `parse`: SSI
    /// applies (else only the addition module). It starts at the response's head, in server 0's
    /// base, not nested, with no additions.
    fn new(conf: SsiConf, req: shard_http::request::Request, head: Vec<u8>, parse: bool) -> Pipe {
        Pipe {
            stage: Stage::Head,
            skip: 0,
            reader: Reader::new(req.method == shard_http::request::Method::Head),
            chunked_out: req.minor_version >= 1 || req.http2,
            must_close: false,
            parser: Parser::new(conf.value_length as usize),
            conf,
            body: Vec::new(),
            body_pos: 0,
            text: Vec::new(),
            out: Vec::new(),
            out_pos: 0,
            sink_blocked: false,
            pending: None,
            waiting: None,
            ended: false,
            failed: false,
            vars: Vec::new(),
            output: true,
            output_chosen: false,
            conditional: 0,
            in_block: false,
            blocks: Vec::new(),
            errmsg: parse::ERRMSG.to_vec(),
            timefmt: parse::TIMEFMT.to_string(),
            server: 0,
            location: None,
            req,
            head,
            depth: 0,
            parse,
            before: None,
            after: None,
        }
    }

    /// Whether the pipe waits for the worker (a command, a subrequest).
    pub(super) fn paused(&self) -> bool {
        self.pending.is_some() || self.waiting.is_some()
    }

    /// Whether the response is not all out yet, though its bytes were all taken.
    pub(super) fn busy(&self) -> bool {
        self.out_pos < self.out.len()
            || self.paused()
            || self.body_pos < self.body.len()
            || (self.stage == Stage::Body && self.reader.done() && !self.ended)
    }

    /// The subrequest being waited for, if any.
    pub(super) fn waiting(&self) -> Option<usize> {
        self.waiting
    }

    /// Takes response bytes from `input` and writes what they become through `sink`: the
    /// contract of `write(2)` (`WouldBlock` when nothing was taken, because the sink is full
    /// ([`Pipe::sink_blocked`]) or the pipe waits for the worker).
    pub(super) fn write(
        &mut self,
        input: &[u8],
        sink: &mut dyn FnMut(&[u8]) -> std::io::Result<usize>,
    ) -> std::io::Result<usize> {
        use std::io::ErrorKind::WouldBlock;
        let mut taken = 0;
        loop {
            // Input is taken before output is written, so that a head and the text before a
            // first command leave together (or not at all, should the command fail the
            // response).
            if !self.paused() && self.out.len() < OUT_MAX {
                if self.body_pos < self.body.len() {
                    self.parse_body();
                    continue;
                }
                if self.stage == Stage::Body && self.reader.done() && !self.ended {
                    self.end_document();
                    continue;
                }
                if taken < input.len() {
                    taken += self.take(&input[taken..])?;
                    continue;
                }
            }
            let hold = self.paused() && self.out.len() - self.out_pos < POSTPONE;
            while !hold && self.out_pos < self.out.len() {
                match sink(&self.out[self.out_pos..]) {
                    Ok(0) => {
                        self.sink_blocked = true;
                        return if taken > 0 {
                            Ok(taken)
                        } else {
                            Err(WouldBlock.into())
                        };
                    }
                    Ok(n) => self.out_pos += n,
                    Err(e) if e.kind() == WouldBlock => {
                        self.sink_blocked = true;
                        return if taken > 0 { Ok(taken) } else { Err(e) };
                    }
                    Err(e) => return Err(e),
                }
            }
            if !hold {
                self.out.clear();
                self.out_pos = 0;
            }
            self.sink_blocked = false;
            if self.paused() {
                return if taken > 0 {
                    Ok(taken)
                } else {
                    Err(WouldBlock.into())
                };
            }
            if taken == input.len() && !self.busy() {
                return Ok(taken);
            }
        }
    }

    /// Takes some of `input` (at least a byte).
    fn take(&mut self, input: &[u8]) -> std::io::Result<usize> {
        match self.stage {
            Stage::Skip => {
                let n = self.skip.min(input.len());
                self.out.extend_from_slice(&input[..n]);
                self.skip -= n;
                if self.skip == 0 {
                    self.stage = Stage::Head;
                }
                Ok(n)
            }
            Stage::Pass => {
                self.out.extend_from_slice(input);
                Ok(input.len())
            }
            Stage::Head => {
                let mut none = Vec::new();
                let Ok(fed) = self.reader.feed(input, &mut none) else {
                    return Err(std::io::ErrorKind::InvalidData.into());
                };
                if let Some(head) = fed.head {
                    if self.reader.bad {
                        // Not a head this pipe understands: it passes as it came.
                        self.out.extend_from_slice(&head);
                        self.stage = Stage::Pass;
                        return Ok(fed.taken);
                    }
                    self.rewrite_head(&head);
                    self.stage = if self.reader.done() && self.reader.head_only {
                        self.ended = true;
                        Stage::Pass
                    } else {
                        Stage::Body
                    };
                    // `add_before_body`: its subrequest's body comes first.
                    if self.stage == Stage::Body {
                        if let Some(uri) = self.before.take() {
                            self.pending = Some(include_of(uri));
                        }
                    } else {
                        self.before = None;
                        self.after = None;
                    }
                }
                Ok(fed.taken)
            }
            Stage::Body => {
                let step = input.len().min(PARSE_STEP);
                let mut body = std::mem::take(&mut self.body);
                let fed = self.reader.feed(&input[..step], &mut body);
                self.body = body;
                match fed {
                    Ok(f) if f.taken > 0 => Ok(f.taken),
                    // The body ended before these bytes: they are the next response's.
                    Ok(_) => {
                        if !self.ended {
                            self.end_document();
                        }
                        self.stage = Stage::Pass;
                        Ok(0)
                    }
                    Err(()) => Err(std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        "bad chunks in an SSI response",
                    )),
                }
            }
        }
    }

    /// The head as the client gets it (nginx's `ngx_http_ssi_header_filter`).
    fn rewrite_head(&mut self, head: &[u8]) {
        let mut out = Vec::with_capacity(head.len() + 32);
        let status_status = framing_of(head).map(|(s, _)| s).unwrap_or(200);
        let body = !self.reader.head_only && !matches!(status_status, 101 | 204 | 304);
        for (i, line) in head[..head.len() - 2].split(|&b| b == b'\n').enumerate() {
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            if line.is_empty() {
                continue;
            }
            if i > 0 {
                let name = line.split(|&b| b == b':').next().unwrap_or(b"");
                let is = |n: &str| name.eq_ignore_ascii_case(n.as_bytes());
                if is("content-length") || is("accept-ranges") || is("transfer-encoding") {
                    continue;
                }
                // SSI drops the validators unless `ssi_last_modified`; the addition module
                // keeps `Last-Modified` and weakens the tag.
                let strip = self.parse && !self.conf.last_modified;
                if is("last-modified") && strip {
                    continue;
                }
                if is("etag") {
                    if strip {
                        continue;
                    }
                    // A weak tag: the body is not the file's bytes.
                    let v = line[5..].trim_ascii_start();
                    if !v.starts_with(b"W/") {
                        out.extend_from_slice(b"ETag: W/");
                        out.extend_from_slice(v);
                        out.extend_from_slice(b"\r\n");
                        continue;
                    }
                }
                if is("connection") && body && !self.chunked_out {
                    continue;
                }
            }
            out.extend_from_slice(line);
            out.extend_from_slice(b"\r\n");
        }
        if body {
            if self.chunked_out {
                out.extend_from_slice(b"Transfer-Encoding: chunked\r\n");
            } else {
                out.extend_from_slice(b"Connection: close\r\n");
                self.must_close = true;
            }
        }
        out.extend_from_slice(b"\r\n");
        self.out.extend_from_slice(&out);
    }

    /// Parses the decoded body until a command, its end, or a full output.
    fn parse_body(&mut self) {
        while self.body_pos < self.body.len() && self.out.len() < OUT_MAX && !self.paused() {
            let end = self.body.len().min(self.body_pos + PARSE_STEP);
            if !self.parse {
                let body = std::mem::take(&mut self.body);
                self.frame(&body[self.body_pos..end]);
                self.body = body;
                self.body_pos = end;
                continue;
            }
            let mut text = std::mem::take(&mut self.text);
            text.clear();
            let (n, item) = self.parser.feed(&self.body[self.body_pos..end], &mut text);
            self.body_pos += n;
            self.emit_text(&text);
            self.text = text;
            if let Some(item) = item {
                self.pending = Some(item);
            }
        }
        if self.body_pos == self.body.len() {
            self.body.clear();
            self.body_pos = 0;
        }
    }

    fn end_document(&mut self) {
        let mut text = std::mem::take(&mut self.text);
        text.clear();
        self.parser.finish(&mut text);
        self.emit_text(&text);
        self.text = text;
        // `add_after_body`: its subrequest's body comes last.
        if let Some(uri) = self.after.take() {
            self.pending = Some(include_of(uri));
            return;
        }
        if self.chunked_out {
            self.out.extend_from_slice(b"0\r\n\r\n");
        }
        self.ended = true;
        self.stage = Stage::Pass;
    }

    /// Document text: out, into the block being defined, or dropped (a false branch).
    fn emit_text(&mut self, text: &[u8]) {
        if text.is_empty() {
            return;
        }
        if self.in_block {
            if let Some(b) = self.blocks.last_mut() {
                b.1.extend_from_slice(text);
            }
        } else if self.output {
            self.frame(text);
        }
    }

    /// Body bytes out, as a chunk for an HTTP/1.1 client.
    fn frame(&mut self, bytes: &[u8]) {
        if bytes.is_empty() || self.reader.head_only {
            return;
        }
        if self.chunked_out {
            use std::io::Write as _;
            let _ = write!(self.out, "{:x}\r\n", bytes.len());
            self.out.extend_from_slice(bytes);
            self.out.extend_from_slice(b"\r\n");
        } else {
            self.out.extend_from_slice(bytes);
        }
    }

    /// Text to be parsed next, before the rest of the document (a stub's).
    fn insert(&mut self, text: &[u8]) {
        let rest = self.body.split_off(self.body_pos);
        self.body.truncate(0);
        self.body.extend_from_slice(text);
        self.body.extend_from_slice(&rest);
        self.body_pos = 0;
    }

    fn error(&mut self) {
        if !self.conf.silent_errors {
            let msg = std::mem::take(&mut self.errmsg);
            self.frame(&msg);
            self.errmsg = msg;
        }
    }

    fn var(&self, name: &str) -> Option<&[u8]> {
        self.vars
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_slice())
    }

    fn set_var(&mut self, name: &str, value: Vec<u8>) {
        match self.vars.iter_mut().find(|(n, _)| n == name) {
            Some(v) => v.1 = value,
            None => self.vars.push((name.to_string(), value)),
        }
    }
}

/// The output of one subrequest, on its way to its parent's pipe.
pub(super) struct SubOut {
    /// The parent connection (key and id) and the subrequest's own.
    parent: usize,
    parent_id: u64,
    conn: usize,
    conn_id: u64,
    reader: Reader,
    status: u16,
    /// Body bytes the parent has not taken.
    data: Vec<u8>,
    /// `set=` or `stub=`: the body is kept whole (up to `keep`) rather than streamed.
    keep: Option<usize>,
    overflow: bool,
    set: Option<String>,
    stub: Option<String>,
    /// The subrequest's response ended (or its connection closed: `failed` unless whole).
    done: bool,
    failed: bool,
    /// Its last write was refused for room: it waits for the parent.
    blocked: bool,
    /// The main request's number (`$request_id` is the main request's).
    request_seq: u64,
    /// Nobody reads the output (`post_action`).
    discard: bool,
}

/// `send` of a subrequest's connection: its response bytes into its [`SubOut`].
pub(super) fn sub_send(
    subs: &mut slab::Slab<SubOut>,
    sub: u32,
    buf: &[u8],
) -> std::io::Result<usize> {
    use std::io::{Error, ErrorKind};
    let s = subs
        .get_mut(sub as usize - 1)
        .ok_or_else(|| Error::from(ErrorKind::BrokenPipe))?;
    if s.discard {
        s.data.clear();
    }
    if s.keep.is_none() && s.data.len() >= SUB_DATA_MAX {
        s.blocked = true;
        return Err(ErrorKind::WouldBlock.into());
    }
    let before = s.data.len();
    let fed = s
        .reader
        .feed(buf, &mut s.data)
        .map_err(|()| Error::new(ErrorKind::InvalidData, "subrequest response"))?;
    if let Some(head) = fed.head {
        s.status = framing_of(&head).map(|(st, _)| st).unwrap_or(502);
        if s.reader.bad {
            s.status = 502;
        }
    }
    if let Some(max) = s.keep {
        if s.data.len() > max {
            s.data.truncate(max.max(before));
            s.overflow = true;
        }
    }
    if s.reader.done() {
        s.done = true;
    }
    // Past its response, what else comes is dropped.
    Ok(if s.reader.done() {
        buf.len()
    } else {
        fed.taken
    })
}

/// The parameters of a command: nginx's tables (name, mandatory).
fn params_of(name: &str) -> Option<&'static [(&'static str, bool)]> {
    Some(match name {
        "include" => &[
            ("virtual", false),
            ("file", false),
            ("wait", false),
            ("set", false),
            ("stub", false),
        ],
        "echo" => &[("var", true), ("default", false), ("encoding", false)],
        "config" => &[("errmsg", false), ("timefmt", false)],
        "set" => &[("var", true), ("value", true)],
        "if" | "elif" => &[("expr", true)],
        "else" | "endif" | "endblock" => &[],
        "block" => &[("name", true)],
        _ => return None,
    })
}

/// Bytes of a request target for a subrequest's request line: those a request line cannot
/// hold escaped.
fn push_target(out: &mut Vec<u8>, uri: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    for &b in uri {
        if b <= b' ' || b == 0x7f {
            out.extend_from_slice(&[b'%', HEX[(b >> 4) as usize], HEX[(b & 15) as usize]]);
        } else {
            out.push(b);
        }
    }
}

/// Request headers a subrequest does not carry: its framing, its validators and ranges (a
/// subrequest's answer is whole), compression (its bytes go into another body), the
/// connection's own.
/// Header lines a mirror subrequest does not copy: the body's framing (its own is written)
/// and the client's connection.
fn mirror_drops(name: &[u8]) -> bool {
    const DROP: [&str; 5] = [
        "content-length",
        "transfer-encoding",
        "expect",
        "connection",
        "keep-alive",
    ];
    DROP.iter().any(|d| name.eq_ignore_ascii_case(d.as_bytes()))
}

fn sub_drops(name: &[u8]) -> bool {
    const DROP: [&str; 12] = [
        "content-length",
        "transfer-encoding",
        "expect",
        "connection",
        "keep-alive",
        "range",
        "if-range",
        "if-modified-since",
        "if-unmodified-since",
        "if-none-match",
        "if-match",
        "accept-encoding",
    ];
    DROP.iter().any(|d| name.eq_ignore_ascii_case(d.as_bytes()))
}

impl<'a> Worker<'a> {
    /// The response about to be written for connection `key`, of `content_type` and
    /// `status`: when SSI or the addition module applies, its pipe is made (it takes the
    /// bytes already waiting to go first as they are). `true`: the response is filtered.
    pub(super) fn filter_begin(
        &mut self,
        key: usize,
        req: &shard_http::request::Request,
        head: &[u8],
        loc: &LocationConf,
        content_type: Option<&str>,
        status: u16,
    ) -> bool {
        let c = &self.conns[key];
        if c.req.as_ref().is_some_and(|r| r.ssi.is_some()) {
            return true;
        }
        let ssi = applies(loc, content_type);
        // nginx's addition filter: 200 answers of main requests only.
        let addition =
            status == 200 && c.sub == 0 && loc.addition.applies_to(content_type.unwrap_or(""));
        if !ssi && !addition {
            return false;
        }
        let uri = |u: &Option<String>| {
            u.as_deref()
                .filter(|u| addition && !u.is_empty())
                .map(|u| u.as_bytes().to_vec())
        };
        let server = c.rd().server;
        let location = self.location_index(server, loc);
        let depth = self.sub_depth(key);
        let skip = c.out.len() - c.out_pos;
        let mut pipe = Pipe::new(loc.ssi.clone(), req.clone(), head.to_vec(), ssi);
        pipe.skip = skip;
        if skip > 0 {
            pipe.stage = Stage::Skip;
        }
        pipe.server = server;
        pipe.location = location;
        pipe.depth = depth;
        pipe.before = uri(&loc.addition.before);
        pipe.after = uri(&loc.addition.after);
        self.conns[key].rq().ssi = Some(Box::new(pipe));
        true
    }

    /// The index of `loc` among its server's locations (`None`: the server's base).
    fn location_index(&self, server: usize, loc: &LocationConf) -> Option<usize> {
        let srv = self.cx.cfg.http.as_ref()?.servers.get(server)?;
        srv.locations.iter().position(|l| std::ptr::eq(l, loc))
    }

    fn pipe_location(&self, p: &Pipe) -> &'a LocationConf {
        let cfg: &'a shard_config::Config = self.cx.cfg;
        let http = cfg.http.as_ref().expect("SSI runs under http");
        let s = &http.servers[p.server];
        p.location.map_or(&s.base, |i| &s.locations[i])
    }

    /// How many subrequests deep connection `key` is.
    fn sub_depth(&self, key: usize) -> u8 {
        let mut depth = 0;
        let mut k = key;
        while let Some(s) = self
            .conns
            .get(k)
            .filter(|c| c.sub != 0)
            .and_then(|c| self.subs.get(c.sub as usize - 1))
        {
            depth += 1;
            if depth >= DEPTH_MAX {
                break;
            }
            k = s.parent;
        }
        depth
    }

    /// After a drive of connection `key`: runs the command its pipe stopped at, or hands it
    /// its subrequest's output. `true`: the connection has more to do now.
    pub(super) fn ssi_step(&mut self, key: usize) -> bool {
        let Some(mut p) = self
            .conns
            .get_mut(key)
            .and_then(|c| c.req.as_mut())
            .and_then(|r| r.ssi.take())
        else {
            return false;
        };
        let id = self.conns[key].id;
        let mut progressed = false;
        if let Some(w) = p.waiting {
            progressed = self.ssi_collect(&mut p, w);
        }
        if p.waiting.is_none() {
            if let Some(item) = p.pending.take() {
                self.ssi_command(key, id, &mut p, item);
                progressed = true;
            }
        }
        let failed = p.failed;
        match self
            .conns
            .get_mut(key)
            .filter(|c| c.id == id)
            .and_then(|c| c.req.as_mut())
        {
            Some(r) => r.ssi = Some(p),
            None => {
                // The connection closed under the command: its subrequest goes too.
                if let Some(w) = p.waiting {
                    self.sub_abort(w);
                }
                return false;
            }
        }
        if failed {
            self.close(key);
            return false;
        }
        if progressed {
            // The connection may write again.
            self.conns[key].writable |= !self.conns[key]
                .rd()
                .ssi
                .as_ref()
                .is_some_and(|p| p.sink_blocked);
        }
        progressed
    }

    /// Drives `key`, then its SSI commands and subrequest output, at most [`STEPS_MAX`]
    /// rounds before it yields.
    pub(super) fn ssi_after_drive(&mut self, key: usize) {
        for _ in 0..STEPS_MAX {
            if !self.ssi_step(key) {
                return;
            }
            self.drive_turn(key);
        }
        self.yield_conn(key);
    }

    /// Moves subrequest `w`'s output into `p`; ends the include when the subrequest has.
    fn ssi_collect(&mut self, p: &mut Pipe, w: usize) -> bool {
        let Some(s) = self.subs.get_mut(w) else {
            p.waiting = None;
            return true;
        };
        let mut progressed = false;
        if s.keep.is_none() && !s.data.is_empty() && p.out.len() < OUT_MAX {
            let data = std::mem::take(&mut s.data);
            p.frame(&data);
            s.data = data;
            s.data.clear();
            progressed = true;
            if s.blocked {
                s.blocked = false;
                let (sk, sid) = (s.conn, s.conn_id);
                if let Some(c) = self.conns.get_mut(sk).filter(|c| c.id == sid) {
                    c.writable = true;
                    self.yield_conn(sk);
                }
            }
        }
        let s = &self.subs[w];
        if !s.done || (s.keep.is_none() && !s.data.is_empty()) {
            return progressed;
        }
        let s = self.subs.remove(w);
        p.waiting = None;
        let ok = !s.failed && s.status < 300;
        if let Some(name) = s.set {
            if s.overflow {
                crate::log!(
                    Error,
                    "too big subrequest response while sending to client, \"subrequest_output_buffer_size\" is {}",
                    s.keep.unwrap_or(0)
                );
            }
            // nginx sets the variable from a successful answer only; one too big fails the
            // main request.
            if s.overflow {
                p.failed = true;
            } else if ok {
                p.set_var(&name, s.data);
            }
        } else if let Some(stub) = s.stub {
            if ok && !s.data.is_empty() {
                p.frame(&s.data);
            } else if let Some(text) = p
                .blocks
                .iter()
                .find(|(n, _)| *n == stub)
                .map(|(_, t)| t.clone())
            {
                // The stub is parsed as the document goes on (it may hold commands).
                p.insert(&text);
            }
        }
        true
    }

    /// A subrequest's connection closed: its output is whole or cut; its parent goes on.
    pub(super) fn sub_closed(&mut self, sub: u32, conn_id: u64) {
        let Some(s) = self
            .subs
            .get_mut(sub as usize - 1)
            .filter(|s| s.conn_id == conn_id)
        else {
            return;
        };
        if !s.done {
            // nginx: an answer that ends early still gave what it had; until the close is
            // the end of an answer framed by it.
            let whole = matches!(s.reader.framing, Framing::UntilClose | Framing::Done);
            s.failed = !whole;
            if !s.reader.in_body() {
                s.status = s.status.max(500);
            }
            s.done = true;
        }
        let (parent, parent_id) = (s.parent, s.parent_id);
        if s.discard {
            // A `post_action`: nobody collects it.
            self.subs.remove(sub as usize - 1);
            return;
        }
        if self.conns.get(parent).is_some_and(|c| c.id == parent_id) {
            self.yield_conn(parent);
        }
    }

    /// The main request's number, for a subrequest's connection `key`.
    pub(super) fn sub_request_seq(&self, key: usize) -> Option<u64> {
        let sub = self.conns[key].sub;
        (sub != 0)
            .then(|| self.subs.get(sub as usize - 1).map(|s| s.request_seq))
            .flatten()
    }

    /// A subrequest's connection ran: its parent takes what it wrote.
    pub(super) fn sub_moved(&mut self, sub: u32, conn_id: u64) {
        let Some(s) = self
            .subs
            .get(sub as usize - 1)
            .filter(|s| s.conn_id == conn_id && s.keep.is_none() && !s.data.is_empty())
        else {
            return;
        };
        let (parent, parent_id) = (s.parent, s.parent_id);
        if self.conns.get(parent).is_some_and(|c| c.id == parent_id) {
            self.yield_conn(parent);
        }
    }

    /// Ends subrequest `w` whose parent is gone.
    pub(super) fn sub_abort(&mut self, w: usize) {
        if let Some(s) = self.subs.try_remove(w) {
            if self.conns.get(s.conn).is_some_and(|c| c.id == s.conn_id) {
                self.close(s.conn);
            }
        }
    }

    /// Runs one command of `p` (nginx's `ngx_http_ssi_body_filter`'s dispatch).
    fn ssi_command(&mut self, key: usize, id: u64, p: &mut Pipe, item: Item) {
        let cmd = match item {
            Item::Error(msg) => {
                self.ssi_log(key, &msg);
                p.error();
                return;
            }
            Item::Command(c) => c,
        };
        let Some(table) = params_of(&cmd.name) else {
            if p.output {
                self.ssi_log(key, &format!("invalid SSI command: \"{}\"", cmd.name));
                p.error();
            }
            return;
        };
        let block_cmd = cmd.name == "endblock";
        let conditional = match cmd.name.as_str() {
            "elif" | "else" => COND_IF,
            "endif" => COND_ELSE,
            _ => 0,
        };
        if !p.output && !block_cmd {
            if p.in_block {
                // A command inside a block is kept as text, run when the stub is.
                let mut t = format!("<!--#{}", cmd.name).into_bytes();
                for (k, v) in &cmd.params {
                    t.extend_from_slice(format!(" {k}=\"").as_bytes());
                    t.extend_from_slice(v);
                    t.push(b'"');
                }
                t.extend_from_slice(b" -->");
                if let Some(b) = p.blocks.last_mut() {
                    b.1.extend_from_slice(&t);
                }
                return;
            }
            if conditional == 0 {
                return;
            }
        }
        if conditional != 0 && (p.conditional == 0 || p.conditional > conditional) {
            self.ssi_log(
                key,
                &format!("invalid context of SSI command: \"{}\"", cmd.name),
            );
            p.error();
            return;
        }
        for (k, _) in &cmd.params {
            if !table.iter().any(|(n, _)| n == k) {
                self.ssi_log(
                    key,
                    &format!(
                        "invalid parameter name: \"{k}\" in \"{}\" SSI command",
                        cmd.name
                    ),
                );
                p.error();
                return;
            }
            if cmd.params.iter().filter(|(n, _)| n == k).count() > 1 {
                self.ssi_log(
                    key,
                    &format!(
                        "duplicate \"{k}\" parameter in \"{}\" SSI command",
                        cmd.name
                    ),
                );
                p.error();
                return;
            }
        }
        for (n, mandatory) in table {
            if *mandatory && cmd.param(n).is_none() {
                self.ssi_log(
                    key,
                    &format!(
                        "mandatory \"{n}\" parameter is absent in \"{}\" SSI command",
                        cmd.name
                    ),
                );
                p.error();
                return;
            }
        }
        let res = match cmd.name.as_str() {
            "echo" => self.ssi_echo(key, p, &cmd),
            "set" => self
                .ssi_eval(key, p, cmd.param("value").unwrap_or_default())
                .map(|v| {
                    let name = String::from_utf8_lossy(cmd.param("var").unwrap_or_default())
                        .to_ascii_lowercase();
                    p.set_var(&name, v);
                }),
            "config" => {
                if let Some(t) = cmd.param("timefmt") {
                    p.timefmt = String::from_utf8_lossy(t).into_owned();
                }
                if let Some(m) = cmd.param("errmsg") {
                    p.errmsg = m.to_vec();
                }
                Ok(())
            }
            "include" => self.ssi_include(key, id, p, &cmd),
            "if" | "elif" => self.ssi_if(key, p, &cmd),
            "else" => {
                p.output = !p.output_chosen;
                p.conditional = COND_ELSE;
                Ok(())
            }
            "endif" => {
                p.output = true;
                p.output_chosen = false;
                p.conditional = 0;
                Ok(())
            }
            "block" => {
                let name = String::from_utf8_lossy(cmd.param("name").unwrap_or_default());
                p.blocks.push((name.into_owned(), Vec::new()));
                p.output = false;
                p.in_block = true;
                Ok(())
            }
            "endblock" => {
                p.output = true;
                p.in_block = false;
                Ok(())
            }
            _ => Ok(()),
        };
        if let Err(msg) = res {
            self.ssi_log(key, &msg);
            p.error();
        }
    }

    fn ssi_log(&self, key: usize, msg: &str) {
        crate::log!(Error, "{msg}{}", self.log_context(key, None));
    }

    /// A command's string with its variables (`Err`: nginx's message).
    fn ssi_eval(&self, key: usize, p: &Pipe, text: &[u8]) -> Result<Vec<u8>, String> {
        let mut out = Vec::with_capacity(text.len());
        for seg in parse::segments(text)? {
            match seg {
                Seg::Text(t) => out.extend_from_slice(&t),
                Seg::Var(name) => {
                    self.ssi_var(key, p, &name, &mut out);
                }
            }
        }
        Ok(out)
    }

    /// Appends variable `name`'s value: the document's own (`set`, `include set=`, an `if`'s
    /// captures) first, then nginx's. `false`: not found (nginx's `not_found`).
    fn ssi_var(&self, key: usize, p: &Pipe, name: &str, out: &mut Vec<u8>) -> bool {
        if let Some(v) = p.var(name) {
            out.extend_from_slice(v);
            return true;
        }
        if name == "date_gmt" || name == "date_local" {
            let now = shard_event::unix_ms() / 1000;
            out.extend_from_slice(shard_http::strftime(&p.timefmt, now).as_bytes());
            return true;
        }
        let var = shard_config::runtime_variable(name);
        let loc = self.pipe_location(p);
        let mut storage = shard_http::vars::header_storage();
        let hs = shard_http::vars::request_headers(&p.head, &mut storage);
        let found = match &var {
            shard_config::Var::Arg(n) => p
                .req
                .query
                .as_deref()
                .is_some_and(|q| shard_http::vars::arg(q, n).is_some()),
            shard_config::Var::Http(n) => hs
                .iter()
                .any(|h| shard_http::vars::var_names_header(n, h.name)),
            shard_config::Var::User(n) => {
                self.conns[key].rd().user_vars.iter().any(|(k, _)| k == n)
            }
            _ => true,
        };
        if found {
            let ctx = self.var_ctx(key, &p.req, hs, loc);
            shard_http::vars::push(out, &var, &ctx);
        }
        found
    }

    /// `echo var= [default=] [encoding=]`.
    fn ssi_echo(&self, key: usize, p: &mut Pipe, cmd: &Command) -> Result<(), String> {
        let name =
            String::from_utf8_lossy(cmd.param("var").unwrap_or_default()).to_ascii_lowercase();
        let mut value = Vec::new();
        if !self.ssi_var(key, p, &name, &mut value) {
            value = cmd.param("default").unwrap_or(b"(none)").to_vec();
        }
        if value.is_empty() {
            return Ok(());
        }
        let mut out = Vec::with_capacity(value.len() + 16);
        match cmd.param("encoding") {
            Some(b"none") => out = value,
            Some(b"url") => parse::escape_url(&value, &mut out),
            Some(b"entity") | None => parse::escape_entity(&value, &mut out),
            Some(other) => {
                self.ssi_log(
                    key,
                    &format!(
                        "unknown encoding \"{}\" in the \"echo\" command",
                        String::from_utf8_lossy(other)
                    ),
                );
                parse::escape_entity(&value, &mut out);
            }
        }
        p.frame(&out);
        Ok(())
    }

    /// `if expr=` / `elif expr=` (nginx's `ngx_http_ssi_if`).
    fn ssi_if(&self, key: usize, p: &mut Pipe, cmd: &Command) -> Result<(), String> {
        if cmd.name == "if" && p.conditional != 0 {
            return Err("the \"if\" command inside the \"if\" command".to_string());
        }
        if p.output_chosen {
            p.output = false;
            return Ok(());
        }
        let expr = cmd.param("expr").unwrap_or_default();
        let truth = match parse::parse_expr(expr)? {
            parse::Expr::Value(left) => !self.ssi_eval(key, p, &left)?.is_empty(),
            parse::Expr::Compare {
                left,
                negated,
                right,
                regex,
            } => {
                let left = self.ssi_eval(key, p, &left)?;
                let right = self.ssi_eval(key, p, &right)?;
                let matched = if regex {
                    let pattern = String::from_utf8_lossy(&right);
                    let re = shard_config::Regex::new(&pattern)
                        .map_err(|e| format!("pcre2_compile() failed: {e} in \"{pattern}\""))?;
                    let subject = String::from_utf8_lossy(&left);
                    let mut caps = Vec::new();
                    let m = re.captures_into(&subject, &mut caps);
                    if m {
                        // The captures are the document's variables `$1`... and by name.
                        for (i, c) in caps.iter().enumerate().skip(1) {
                            let v =
                                c.map_or(Vec::new(), |(s, e)| subject.as_bytes()[s..e].to_vec());
                            p.set_var(&i.to_string(), v.clone());
                            if let Some(Some(n)) = re.capture_names().get(i) {
                                p.set_var(&n.to_ascii_lowercase(), v);
                            }
                        }
                    }
                    m
                } else {
                    left == right
                };
                matched != negated
            }
        };
        p.output = truth;
        if truth {
            p.output_chosen = true;
        }
        p.conditional = COND_IF;
        Ok(())
    }

    /// `include virtual=|file= [wait=] [set=] [stub=]`: the subrequest starts; the
    /// document goes on once it has ended.
    fn ssi_include(
        &mut self,
        key: usize,
        id: u64,
        p: &mut Pipe,
        cmd: &Command,
    ) -> Result<(), String> {
        let (virt, file) = (cmd.param("virtual"), cmd.param("file"));
        let (set, stub) = (cmd.param("set"), cmd.param("stub"));
        if let (Some(v), Some(f)) = (virt, file) {
            return Err(format!(
                "inclusion may be either virtual=\"{}\" or file=\"{}\"",
                String::from_utf8_lossy(v),
                String::from_utf8_lossy(f)
            ));
        }
        let Some(raw) = virt.or(file) else {
            return Err("no parameter in \"include\" SSI command".to_string());
        };
        if set.is_some() && stub.is_some() {
            return Err(
                "\"set\" and \"stub\" cannot be used together in \"include\" SSI command"
                    .to_string(),
            );
        }
        if let Some(w) = cmd.param("wait") {
            if virt.is_none() {
                return Err(format!(
                    "\"wait\" cannot be used with file=\"{}\"",
                    String::from_utf8_lossy(raw)
                ));
            }
            if !w.eq_ignore_ascii_case(b"yes") && !w.eq_ignore_ascii_case(b"no") {
                return Err(format!(
                    "invalid value \"{}\" in the \"wait\" parameter",
                    String::from_utf8_lossy(w)
                ));
            }
        }
        let stub = match stub {
            Some(s) => {
                let s = String::from_utf8_lossy(s).into_owned();
                if !p.blocks.iter().any(|(n, _)| *n == s) {
                    return Err(format!("\"stub\"=\"{s}\" for \"include\" not found"));
                }
                Some(s)
            }
            None => None,
        };
        let mut uri = self.ssi_eval(key, p, raw)?;
        // A relative path is the current document's directory's.
        if uri.first() != Some(&b'/') {
            let cur = p.req.path.as_bytes();
            let dir = cur.iter().rposition(|&b| b == b'/').map_or(0, |i| i + 1);
            let mut abs = cur[..dir].to_vec();
            abs.extend_from_slice(&uri);
            uri = abs;
        }
        if uri.is_empty()
            || uri[0] != b'/'
            || uri.windows(4).any(|w| w == b"/../")
            || uri.ends_with(b"/..")
        {
            return Err(format!(
                "unsafe URI \"{}\" was detected",
                String::from_utf8_lossy(&uri)
            ));
        }
        if p.depth + 1 >= DEPTH_MAX {
            return Err(format!(
                "subrequests cycle while processing \"{}\"",
                String::from_utf8_lossy(&uri)
            ));
        }
        let head = self.sub_head(key, &uri, &p.head, p.req.host.as_deref());
        let keep = if set.is_some() {
            // `subrequest_output_buffer_size` of the location the subrequest goes to.
            let path = uri.split(|&b| b == b'?').next().unwrap_or(&uri);
            let size = self
                .cx
                .cfg
                .http
                .as_ref()
                .and_then(|h| h.servers.get(p.server))
                .map(|srv| {
                    shard_http::route::find_location(srv, &String::from_utf8_lossy(path))
                        .ssi
                        .output_buffer_size
                })
                .unwrap_or(p.conf.output_buffer_size);
            Some(size as usize)
        } else if stub.is_some() {
            Some(STUB_KEEP_MAX)
        } else {
            None
        };
        let set = set.map(|s| String::from_utf8_lossy(s).to_ascii_lowercase());
        p.waiting = Some(self.start_sub(key, Some(id), head, keep, set, stub));
        Ok(())
    }

    /// Starts a subrequest of connection `key` whose input is `head`: for the parent whose
    /// id is `parent` (it takes the output), or for nobody (`post_action`: the output is
    /// dropped and the subrequest's record goes with its connection). It runs on its next
    /// turn; its end wakes the parent. Returns its index in `subs`.
    fn start_sub(
        &mut self,
        key: usize,
        parent: Option<u64>,
        head: Vec<u8>,
        keep: Option<usize>,
        set: Option<String>,
        stub: Option<String>,
    ) -> usize {
        let c = &self.conns[key];
        let (peer, listener, number) = (c.peer, c.listener, c.number);
        let proxy_protocol = c.proxy_protocol.clone();
        let request_seq = c.rd().request_seq;
        let conn_id = self.next_conn_id;
        self.next_conn_id += 1;
        let mut c = Conn::new_stream(peer, listener, conn_id, number, self.cx.now_ms);
        c.proxy_protocol = proxy_protocol;
        let sk = self.conns.insert(c);
        let w = self.subs.insert(SubOut {
            parent: if parent.is_some() { key } else { usize::MAX },
            parent_id: parent.unwrap_or(0),
            conn: sk,
            conn_id,
            reader: Reader::new(false),
            status: 0,
            data: Vec::new(),
            keep,
            overflow: false,
            set,
            stub,
            done: false,
            failed: false,
            blocked: false,
            request_seq,
            discard: parent.is_none(),
        });
        self.conns[sk].sub = w as u32 + 1;
        self.start_reading(sk, true);
        self.conns[sk].inbuf = head;
        self.yield_conn(sk);
        w
    }

    /// The `Host` of a subrequest whose main request sent none (HTTP/1.0): its server's
    /// name, else `localhost` (a subrequest's head is HTTP/1.1, which needs one).
    fn sub_host(&self, key: usize) -> String {
        let name = &self.server_of(key).name;
        if name.is_empty() || name.starts_with(['~', '*', '.']) || name.ends_with('*') {
            "localhost".to_string()
        } else {
            name.clone()
        }
    }

    /// `post_action URI`: once the request on `key` is answered, a `GET` of the URI (or
    /// named location) with its headers runs as a subrequest whose answer nobody reads.
    pub(super) fn post_action(&mut self, key: usize, uri: &str, req_head: &[u8]) {
        let head = self.sub_head(key, uri.as_bytes(), req_head, None);
        self.start_sub(key, None, head, None, None, None);
    }

    /// Closes the subrequests nobody reads when they are all the worker still holds (a
    /// stopping worker's last step before it exits).
    pub(super) fn end_background_subrequests(&mut self) {
        let background =
            |c: &Conn| c.sub != 0 && self.subs.get(c.sub as usize - 1).is_some_and(|s| s.discard);
        if !self.conns.iter().all(|(_, c)| background(c)) {
            return;
        }
        let keys: Vec<usize> = self.conns.iter().map(|(k, _)| k).collect();
        crate::log!(
            Info,
            "worker {}: ending {} background subrequests to exit",
            self.idx,
            keys.len()
        );
        for k in keys {
            self.close(k);
        }
    }

    /// `mirror URI ...` (nginx's precontent handler): each URI a background subrequest of
    /// the main request on `key`, with its method, arguments and headers and, with
    /// `mirror_request_body on`, its body; nobody reads the answers. A body not yet all
    /// arrived is not waited for: those mirrors go without it (and say so at `info`).
    pub(super) fn mirror(
        &mut self,
        key: usize,
        loc: &LocationConf,
        req: &shard_http::request::Request,
        req_head: &[u8],
    ) {
        let body = if loc.mirror_request_body {
            let b = self.conns[key].body_at_hand();
            if b.is_none() {
                crate::log!(
                    Info,
                    "mirror subrequests go without the request body, which has not all arrived{}",
                    self.log_context(key, Some(req))
                );
            }
            b
        } else {
            None
        };
        let method = req.request_line.split(' ').next().unwrap_or("GET");
        for uri in &loc.mirrors {
            let query = req.query.as_deref().filter(|q| !q.is_empty());
            let mut head = self.sub_head_lines(
                key,
                method.as_bytes(),
                uri.as_bytes(),
                query,
                req_head,
                mirror_drops,
                None,
            );
            if let Some(b) = body.as_deref().filter(|b| !b.is_empty()) {
                head.extend_from_slice(format!("Content-Length: {}\r\n\r\n", b.len()).as_bytes());
                head.extend_from_slice(b);
            } else {
                head.extend_from_slice(b"\r\n");
            }
            self.start_sub(key, None, head, None, None, None);
        }
    }

    /// A subrequest's head: `GET` of `uri` with the main request's header lines (`req_head`)
    /// but those [`sub_drops`] names, and a `Host` when they have none (`host`, else
    /// [`Worker::sub_host`]).
    fn sub_head(&self, key: usize, uri: &[u8], req_head: &[u8], host: Option<&str>) -> Vec<u8> {
        let mut head = self.sub_head_lines(key, b"GET", uri, None, req_head, sub_drops, host);
        head.extend_from_slice(b"\r\n");
        head
    }

    /// A subrequest's request line (`method`, `uri` with `query`) and header lines: the main
    /// request's (`req_head`) but those `drops` names, and a `Host` when they have none
    /// (`host`, else [`Worker::sub_host`]); without the blank line that ends a head.
    #[allow(clippy::too_many_arguments)]
    fn sub_head_lines(
        &self,
        key: usize,
        method: &[u8],
        uri: &[u8],
        query: Option<&str>,
        req_head: &[u8],
        drops: fn(&[u8]) -> bool,
        host: Option<&str>,
    ) -> Vec<u8> {
        let mut head = Vec::with_capacity(req_head.len() + uri.len() + 64);
        head.extend_from_slice(method);
        head.push(b' ');
        push_target(&mut head, uri);
        if let Some(q) = query {
            head.push(b'?');
            head.extend_from_slice(q.as_bytes());
        }
        head.extend_from_slice(b" HTTP/1.1\r\n");
        let mut storage = shard_http::vars::header_storage();
        let hs = shard_http::vars::request_headers(req_head, &mut storage);
        let mut has_host = false;
        for h in hs.iter().filter(|h| !drops(h.name.as_bytes())) {
            has_host |= h.name.eq_ignore_ascii_case("host");
            head.extend_from_slice(h.name.as_bytes());
            head.extend_from_slice(b": ");
            head.extend_from_slice(h.value);
            head.extend_from_slice(b"\r\n");
        }
        if !has_host {
            head.extend_from_slice(b"Host: ");
            match host {
                Some(h) => head.extend_from_slice(h.as_bytes()),
                None => head.extend_from_slice(self.sub_host(key).as_bytes()),
            }
            head.extend_from_slice(b"\r\n");
        }
        head
    }
}

/// Whether `loc` has SSI or the addition module at all: the check every response makes
/// before [`Worker::filter_begin`] looks closer.
#[inline]
pub(super) fn may_filter(loc: &LocationConf) -> bool {
    loc.ssi.enabled || loc.addition.before.is_some() || loc.addition.after.is_some()
}

/// Whether a response of `content_type` in `loc` is one SSI processes.
pub(super) fn applies(loc: &LocationConf, content_type: Option<&str>) -> bool {
    // An answer without a type is taken by `ssi_types *` only (nginx's test of the type).
    loc.ssi.enabled && loc.ssi.applies_to(content_type.unwrap_or(""))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pipe(chunked: bool, conf: SsiConf) -> Pipe {
        let mut p = Pipe::new(conf, test_request(), Vec::new(), true);
        p.chunked_out = chunked;
        p
    }

    fn test_request() -> shard_http::request::Request {
        let limits = shard_http::request::Limits::default();
        match shard_http::request::parse(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n", &limits) {
            shard_http::request::Parse::Complete { req, .. } => req,
            _ => panic!(),
        }
    }

    fn run(p: &mut Pipe, input: &[u8], out: &mut Vec<u8>) -> std::io::Result<usize> {
        p.write(input, &mut |b: &[u8]| {
            out.extend_from_slice(b);
            Ok(b.len())
        })
    }

    #[test]
    fn a_document_is_rechunked_and_stops_at_each_command() {
        let mut p = pipe(true, SsiConf::default());
        let resp = b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: 25\r\nLast-Modified: x\r\nAccept-Ranges: bytes\r\n\r\nab<!--#echo var=\"v\" -->cd";
        let mut out = Vec::new();
        let n = run(&mut p, resp, &mut out).unwrap();
        assert!(p.paused());
        // Held while the command waits: less than `POSTPONE` is out.
        assert!(out.is_empty());
        // The worker runs the command.
        let Some(Item::Command(c)) = p.pending.take() else {
            panic!()
        };
        assert_eq!(c.name, "echo");
        p.frame(b"V");
        let _ = run(&mut p, &resp[n..], &mut out).unwrap();
        assert!(!p.busy());
        let head_end = memchr::memmem::find(&out, b"\r\n\r\n").unwrap() + 4;
        let head = String::from_utf8_lossy(&out[..head_end]).to_string();
        assert!(head.contains("Transfer-Encoding: chunked"), "{head}");
        assert!(
            !head.contains("Content-Length")
                && !head.contains("Last-Modified")
                && !head.contains("Accept-Ranges"),
            "{head}"
        );
        assert_eq!(
            &out[head_end..],
            b"2\r\nab\r\n1\r\nV\r\n2\r\ncd\r\n0\r\n\r\n"
        );
    }

    #[test]
    fn http_1_0_gets_the_body_until_close_and_a_head_request_no_body() {
        let mut p = pipe(false, SsiConf::default());
        let resp = b"HTTP/1.1 200 OK\r\nConnection: keep-alive\r\nContent-Length: 3\r\n\r\nabc";
        let mut out = Vec::new();
        run(&mut p, resp, &mut out).unwrap();
        assert!(p.must_close && !p.busy());
        assert!(
            out.ends_with(b"Connection: close\r\n\r\nabc"),
            "{}",
            String::from_utf8_lossy(&out)
        );
        let mut p = pipe(true, SsiConf::default());
        p.reader = Reader::new(true);
        out.clear();
        run(
            &mut p,
            b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\n",
            &mut out,
        )
        .unwrap();
        assert!(!p.busy());
        assert!(
            out.ends_with(b"Transfer-Encoding: chunked\r\n\r\n") || out.ends_with(b"OK\r\n\r\n")
        );
    }

    #[test]
    fn earlier_responses_pass_first_and_later_ones_after() {
        let mut p = pipe(true, SsiConf::default());
        p.stage = Stage::Skip;
        p.skip = 5;
        let mut out = Vec::new();
        let mut input = b"prev!".to_vec();
        input.extend_from_slice(b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nxNEXT");
        let mut at = 0;
        while at < input.len() {
            at += run(&mut p, &input[at..], &mut out).unwrap();
        }
        let s = String::from_utf8_lossy(&out);
        assert!(s.starts_with("prev!HTTP/1.1 200"), "{s}");
        assert!(s.ends_with("1\r\nx\r\n0\r\n\r\nNEXT"), "{s}");
    }

    #[test]
    fn a_full_sink_is_not_a_pause() {
        let mut p = pipe(true, SsiConf::default());
        let resp = b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabc";
        let r = p.write(resp, &mut |_: &[u8]| {
            Err(std::io::ErrorKind::WouldBlock.into())
        });
        // Taken into the pipe's output, which waits for the sink.
        assert!(r.is_ok() || p.sink_blocked);
        assert!(p.busy() && !p.paused());
    }

    #[test]
    fn subrequest_output_is_decoded_and_bounded() {
        let mut subs = slab::Slab::new();
        let w = subs.insert(SubOut {
            parent: 0,
            parent_id: 0,
            conn: 1,
            conn_id: 1,
            reader: Reader::new(false),
            status: 0,
            data: Vec::new(),
            keep: Some(4),
            overflow: false,
            set: Some("x".into()),
            stub: None,
            done: false,
            failed: false,
            blocked: false,
            request_seq: 0,
            discard: false,
        });
        let resp = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n3\r\ndef\r\n0\r\n\r\n";
        let mut at = 0;
        while at < resp.len() {
            at += sub_send(&mut subs, w as u32 + 1, &resp[at..]).unwrap();
        }
        let s = &subs[w];
        assert!(s.done && s.overflow);
        assert_eq!(s.status, 200);
        assert_eq!(s.data, b"abcd");
    }
}
