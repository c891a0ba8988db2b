//! An HTTP/2 client on shard's own frames and HPACK, for tests that need to see frames
//! (windows, trailers, GOAWAY) without a tool: one connection, one stream at a time.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use shard_http::h2frame::{self, Frame, Reader};
use shard_http::hpack;

/// The header block of a request: `:method`, `:scheme` `http`, `:path`, `:authority`
/// `localhost` (more fields may be appended with `hpack::Encoder::field`).
pub fn request_block(method: &str, path: &str) -> Vec<u8> {
    let e = hpack::Encoder;
    let mut block = Vec::new();
    e.field(b":method", method.as_bytes(), &mut block);
    e.field(b":scheme", b"http", &mut block);
    e.field(b":path", path.as_bytes(), &mut block);
    e.field(b":authority", b"localhost", &mut block);
    block
}

pub enum Outcome {
    /// The status and the body's length.
    Answered(u16, usize),
    /// Not processed (above a GOAWAY's last stream id, or refused): safe to retry.
    Retry,
    /// Anything else: a failure.
    Failed(String),
}

pub struct Conn {
    s: TcpStream,
    next_id: u32,
    input: Vec<u8>,
    reader: Reader,
    decoder: hpack::Decoder,
    /// A GOAWAY came: its last stream id, and its error code.
    pub goaway: Option<u32>,
    pub goaway_code: Option<u32>,
    /// The sizes of the last answer's DATA frames.
    pub data_frames: Vec<usize>,
    /// The last answer's trailer fields (a HEADERS frame after its head).
    pub trailers: Vec<(String, String)>,
    /// The last answer's head fields and body.
    pub head: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Conn {
    pub fn open(addr: SocketAddr) -> std::io::Result<Conn> {
        let mut s = TcpStream::connect(addr)?;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        let mut hello = h2frame::PREFACE.to_vec();
        h2frame::push_settings(&mut hello, &[]);
        // A large connection window, so that bodies never wait on it.
        h2frame::push_window_update(&mut hello, 0, 1 << 30);
        s.write_all(&hello)?;
        Ok(Conn {
            s,
            next_id: 1,
            input: Vec::new(),
            reader: Reader::new(1 << 24, 1 << 20),
            decoder: hpack::Decoder::new(4096),
            goaway: None,
            goaway_code: None,
            data_frames: Vec::new(),
            trailers: Vec::new(),
            head: Vec::new(),
            body: Vec::new(),
        })
    }

    pub fn get(&mut self, path: &str) -> Outcome {
        self.send(&request_block("GET", path))
    }

    /// Reads frames until a GOAWAY comes (true) or `timeout` passes (false).
    pub fn wait_goaway(&mut self, timeout: Duration) -> bool {
        let deadline = std::time::Instant::now() + timeout;
        self.s
            .set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        while std::time::Instant::now() < deadline {
            let mut used_total = 0;
            while let Ok(Some((frame, used))) = self.reader.next(&self.input[used_total..]) {
                used_total += used;
                if let Frame::GoAway { last_stream, code } = frame {
                    self.goaway = Some(last_stream);
                    self.goaway_code = Some(code);
                }
            }
            self.input.drain(..used_total);
            if self.goaway.is_some() {
                return true;
            }
            let mut b = [0u8; 16384];
            match self.s.read(&mut b) {
                Ok(0) => return self.goaway.is_some(),
                Ok(n) => self.input.extend_from_slice(&b[..n]),
                Err(_) => {}
            }
        }
        false
    }

    /// Writes `bytes` as they are (frames built by hand, to misbehave on purpose).
    pub fn raw(&mut self, bytes: &[u8]) {
        self.s.write_all(bytes).unwrap();
    }

    /// The client's local port (the server's peer port for this connection).
    pub fn port(&self) -> u16 {
        self.s.local_addr().unwrap().port()
    }

    /// A request whose header block is `block`, as written (to misbehave on purpose).
    pub fn send(&mut self, block: &[u8]) -> Outcome {
        self.send_body(block, None)
    }

    /// A request with a header block and a body (in DATA frames of at most 16 KiB, the
    /// last with END_STREAM). The client does not wait for windows: a body must fit the
    /// server's initial stream window.
    pub fn send_body(&mut self, block: &[u8], body: Option<&[u8]>) -> Outcome {
        if self.goaway.is_some() {
            return Outcome::Retry;
        }
        let id = self.next_id;
        self.next_id += 2;
        self.data_frames.clear();
        self.trailers.clear();
        self.head.clear();
        self.body.clear();
        let block = block.to_vec();
        let mut out = Vec::new();
        h2frame::push_headers(&mut out, id, &block, body.is_none(), 16_384);
        if let Some(body) = body {
            let mut pieces = body.chunks(16_384).peekable();
            if pieces.peek().is_none() {
                h2frame::push_data(&mut out, id, &[], true);
            }
            while let Some(p) = pieces.next() {
                h2frame::push_data(&mut out, id, p, pieces.peek().is_none());
            }
        }
        if let Err(e) = self.s.write_all(&out) {
            return Outcome::Failed(format!("write: {e}"));
        }
        let mut status = 0u16;
        let mut body = 0usize;
        loop {
            // Whole frames first, then read more.
            let mut used_total = 0;
            let mut done = None;
            let mut replies = Vec::new();
            loop {
                let input = &self.input[used_total..];
                let (frame, used) = match self.reader.next(input) {
                    Ok(Some(f)) => f,
                    Ok(None) => break,
                    Err(e) => return Outcome::Failed(format!("frame error {e:?}")),
                };
                used_total += used;
                match frame {
                    Frame::Settings { ack: false, .. } => h2frame::push_settings_ack(&mut replies),
                    Frame::Ping { ack: false, data } => h2frame::push_ping_ack(&mut replies, &data),
                    Frame::GoAway { last_stream, code } => {
                        self.goaway = Some(last_stream);
                        self.goaway_code = Some(code);
                        if id > last_stream {
                            done = Some(Outcome::Retry);
                        }
                    }
                    Frame::Headers {
                        stream,
                        block,
                        end_stream,
                    } if stream == id => {
                        let mut st = 0u16;
                        let mut fields = Vec::new();
                        if let Err(e) = self.decoder.decode(block, 1 << 20, |n, v| {
                            if n == b":status" {
                                st = std::str::from_utf8(v).unwrap().parse().unwrap();
                            }
                            fields.push((
                                String::from_utf8_lossy(n).into_owned(),
                                String::from_utf8_lossy(v).into_owned(),
                            ));
                        }) {
                            return Outcome::Failed(format!("hpack {e:?}"));
                        }
                        if status != 0 && st == 0 {
                            // A second HEADERS frame: the trailers.
                            self.trailers = fields;
                        } else {
                            status = st;
                            self.head = fields;
                        }
                        if end_stream {
                            done = Some(Outcome::Answered(status, body));
                        }
                    }
                    Frame::Data {
                        stream,
                        data,
                        end_stream,
                        flow_len,
                    } if stream == id => {
                        body += data.len();
                        self.body.extend_from_slice(data);
                        self.data_frames.push(data.len());
                        h2frame::push_window_update(&mut replies, id, flow_len as u32);
                        if end_stream {
                            done = Some(Outcome::Answered(status, body));
                        }
                    }
                    Frame::RstStream { stream, code } if stream == id => {
                        done = Some(if code == h2frame::code::REFUSED_STREAM {
                            Outcome::Retry
                        } else {
                            Outcome::Failed(format!("reset {code}"))
                        });
                    }
                    _ => {}
                }
                if done.is_some() {
                    break;
                }
            }
            self.input.drain(..used_total);
            // (Acks to a server that already closed are not a request's failure: what
            // decides is whether the stream was answered.)
            if !replies.is_empty() {
                let _ = self.s.write_all(&replies);
            }
            if let Some(d) = done {
                return d;
            }
            let mut b = [0u8; 16384];
            match self.s.read(&mut b) {
                Ok(0) => {
                    return if self.goaway.is_some_and(|l| id > l) {
                        Outcome::Retry
                    } else {
                        Outcome::Failed(format!("closed before stream {id} ended"))
                    };
                }
                Ok(n) => self.input.extend_from_slice(&b[..n]),
                Err(e) => return Outcome::Failed(format!("read: {e}")),
            }
        }
    }
}

/// A connection driven frame by frame, for tests that misbehave on purpose or watch the
/// order of frames: what is written is the test's own, and [`Raw::read_until`] hands each
/// frame read to the test.
pub struct Raw {
    pub s: TcpStream,
    reader: Reader,
    input: Vec<u8>,
}

impl Raw {
    /// Connects and sends the preface and an empty SETTINGS (and its acknowledgement of the
    /// server's when `ack`: it takes the server's window as said at once).
    pub fn open(addr: SocketAddr, ack: bool) -> Raw {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut out = h2frame::PREFACE.to_vec();
        h2frame::push_settings(&mut out, &[]);
        if ack {
            h2frame::push_settings_ack(&mut out);
        }
        s.write_all(&out).unwrap();
        Raw {
            s,
            reader: Reader::new(1 << 24, 1 << 20),
            input: Vec::new(),
        }
    }

    pub fn write(&mut self, bytes: &[u8]) {
        self.s.write_all(bytes).unwrap();
    }

    /// Reads frames, handing each to `f` (with a buffer for what to answer, written after
    /// each batch), until `f` returns `Some`; frames after that one wait for the next call.
    /// Panics when the connection closes or nothing comes for 10 s.
    pub fn read_until<T>(&mut self, mut f: impl FnMut(Frame<'_>, &mut Vec<u8>) -> Option<T>) -> T {
        loop {
            let mut used = 0;
            let mut replies = Vec::new();
            let mut found = None;
            while let Ok(Some((frame, n))) = self.reader.next(&self.input[used..]) {
                used += n;
                found = f(frame, &mut replies);
                if found.is_some() {
                    break;
                }
            }
            self.input.drain(..used);
            if !replies.is_empty() {
                self.s.write_all(&replies).unwrap();
            }
            if let Some(t) = found {
                return t;
            }
            let mut b = [0u8; 65_536];
            let n = self.s.read(&mut b).expect("frames");
            assert!(n > 0, "closed");
            self.input.extend_from_slice(&b[..n]);
        }
    }
}
