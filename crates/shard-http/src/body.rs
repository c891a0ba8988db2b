//! Bodies sent with `Transfer-Encoding: chunked`: a bounded, byte-driven state machine.
//!
//! The decoder walks the framing (chunk sizes, extensions, CRLFs and trailers) and counts
//! payload bytes. [`ChunkedDecoder::feed`] only counts them, for bodies shard discards;
//! [`ChunkedDecoder::feed_into`] also appends them to a caller's buffer, for request bodies the
//! HTTP proxy holds de-chunked and for chunked upstream responses. Both run the same state
//! machine. The decoder itself keeps a few counters of state, so its memory is constant
//! whatever the input; trailers are checked and dropped, never returned. Limits on the total
//! body size (`client_max_body_size`, the proxy's buffers) belong to the caller, which sees the
//! running count and owns the output buffer.

use crate::request::Reject;

/// Longest chunk extension accepted on one size line.
const MAX_EXTENSION: usize = 4096;
/// Most trailer bytes accepted after the last chunk.
const MAX_TRAILERS: usize = 16 * 1024;
/// Largest chunk size accepted (nginx refuses sizes beyond `off_t`).
const MAX_CHUNK: u64 = i64::MAX as u64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Expecting the first hex digit of a chunk size.
    SizeStart,
    Size,
    /// After the digits: whitespace and `;name=value` extensions until the line ends.
    Extension,
    SizeLf,
    Data,
    /// After chunk data: CRLF (or a bare LF).
    DataCr,
    DataLf,
    /// At the start of a trailer line (or the final empty line).
    TrailerStart,
    TrailerLine,
    /// After a CR inside a trailer line: only LF may follow.
    TrailerLineLf,
    TrailerEndLf,
    Done,
}

/// What one [`ChunkedDecoder::feed`] or [`ChunkedDecoder::feed_into`] call did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Feed {
    /// Input bytes used. Less than the input only when the body ended inside it.
    pub consumed: usize,
    /// Payload bytes among them.
    pub data: u64,
}

#[derive(Debug, Clone)]
pub struct ChunkedDecoder {
    state: State,
    /// The chunk size being read, then the payload bytes left in the chunk.
    size: u64,
    extension: usize,
    trailers: usize,
    /// The trailer lines, each ending in `\n`, when asked to keep them
    /// ([`ChunkedDecoder::keep_trailers`]; bounded as the trailers are).
    kept: Option<Vec<u8>>,
    /// The most trailer bytes taken ([`MAX_TRAILERS`] unless kept with another bound).
    max_trailers: usize,
}

impl Default for ChunkedDecoder {
    fn default() -> Self {
        Self::new()
    }
}

const fn bad(reason: &'static str) -> Reject {
    Reject {
        status: 400,
        reason,
    }
}

fn hex(b: u8) -> Option<u64> {
    match b {
        b'0'..=b'9' => Some(u64::from(b - b'0')),
        b'a'..=b'f' => Some(u64::from(b - b'a' + 10)),
        b'A'..=b'F' => Some(u64::from(b - b'A' + 10)),
        _ => None,
    }
}

impl ChunkedDecoder {
    pub fn new() -> ChunkedDecoder {
        ChunkedDecoder {
            state: State::SizeStart,
            size: 0,
            extension: 0,
            trailers: 0,
            kept: None,
            max_trailers: MAX_TRAILERS,
        }
    }

    /// Keeps the trailer lines, up to `max` bytes (an HTTP/2 stream sends a response's as
    /// a HEADERS frame: shard's own `add_trailer`s, bounded by the caller).
    pub fn keep_trailers(&mut self, max: usize) {
        self.kept.get_or_insert_with(Vec::new);
        self.max_trailers = max;
    }

    /// The trailer lines kept so far, each ending in `\n` (empty unless kept).
    pub fn trailers_kept(&self) -> &[u8] {
        self.kept.as_deref().unwrap_or(&[])
    }

    /// True once the last chunk and the trailers have been read.
    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }

    fn end_of_size_line(&mut self) {
        self.state = if self.size == 0 {
            State::TrailerStart
        } else {
            State::Data
        };
    }

    /// Walks `input`, which continues where the previous call stopped. Stops at the end of the
    /// body, leaving any following bytes (a pipelined request) unconsumed. A malformed body is
    /// a 400; the decoder must not be fed again after an error.
    pub fn feed(&mut self, input: &[u8]) -> Result<Feed, Reject> {
        self.walk(input, None)
    }

    /// As [`feed`](Self::feed), and appends the payload bytes of `input` to `out` (`Feed::data`
    /// of them). On an error, `out` may already hold payload that preceded the malformed byte.
    pub fn feed_into(&mut self, input: &[u8], out: &mut Vec<u8>) -> Result<Feed, Reject> {
        self.walk(input, Some(out))
    }

    /// The one state machine behind `feed` and `feed_into`: `sink` receives the payload.
    fn walk(&mut self, input: &[u8], mut sink: Option<&mut Vec<u8>>) -> Result<Feed, Reject> {
        let mut i = 0;
        let mut data = 0u64;
        while i < input.len() {
            if self.state == State::Data {
                let take = self.size.min((input.len() - i) as u64);
                if let Some(out) = sink.as_deref_mut() {
                    out.extend_from_slice(&input[i..i + take as usize]);
                }
                i += take as usize;
                data += take;
                self.size -= take;
                if self.size == 0 {
                    self.state = State::DataCr;
                }
                continue;
            }
            let b = input[i];
            match self.state {
                State::Done => break,
                State::SizeStart => {
                    let d = hex(b).ok_or(bad("invalid chunk size"))?;
                    self.size = d;
                    self.extension = 0;
                    self.state = State::Size;
                }
                State::Size => match b {
                    b'\r' => self.state = State::SizeLf,
                    b'\n' => self.end_of_size_line(),
                    b';' | b' ' | b'\t' => self.state = State::Extension,
                    _ => {
                        let d = hex(b).ok_or(bad("invalid chunk size"))?;
                        if self.size > MAX_CHUNK >> 4 {
                            return Err(bad("chunk size too large"));
                        }
                        self.size = self.size << 4 | d;
                    }
                },
                State::Extension => match b {
                    b'\r' => self.state = State::SizeLf,
                    b'\n' => self.end_of_size_line(),
                    b'\t' => {}
                    c if c < 0x20 || c == 0x7f => return Err(bad("invalid chunk extension")),
                    _ => {
                        self.extension += 1;
                        if self.extension > MAX_EXTENSION {
                            return Err(bad("chunk extension too long"));
                        }
                    }
                },
                State::SizeLf => {
                    if b != b'\n' {
                        return Err(bad("invalid chunk size line"));
                    }
                    self.end_of_size_line();
                }
                State::DataCr => match b {
                    b'\r' => self.state = State::DataLf,
                    b'\n' => self.state = State::SizeStart,
                    _ => return Err(bad("chunk data longer than its size")),
                },
                State::DataLf => {
                    if b != b'\n' {
                        return Err(bad("invalid chunk terminator"));
                    }
                    self.state = State::SizeStart;
                }
                State::TrailerStart => match b {
                    b'\r' => self.state = State::TrailerEndLf,
                    b'\n' => self.state = State::Done,
                    _ => {
                        if let Some(k) = &mut self.kept {
                            k.push(b);
                        }
                        self.state = State::TrailerLine;
                    }
                },
                State::TrailerLine => match b {
                    b'\n' => {
                        if let Some(k) = &mut self.kept {
                            k.push(b'\n');
                        }
                        self.state = State::TrailerStart;
                    }
                    // A CR ends the line only before LF, as in nginx; a bare CR is refused.
                    b'\r' => self.state = State::TrailerLineLf,
                    0 => return Err(bad("NUL in trailer")),
                    _ => {
                        if let Some(k) = &mut self.kept {
                            k.push(b);
                        }
                    }
                },
                State::TrailerLineLf => {
                    if b != b'\n' {
                        return Err(bad("bare CR in trailer"));
                    }
                    if let Some(k) = &mut self.kept {
                        k.push(b'\n');
                    }
                    self.state = State::TrailerStart;
                }
                State::TrailerEndLf => {
                    if b != b'\n' {
                        return Err(bad("invalid end of chunked body"));
                    }
                    self.state = State::Done;
                }
                // Handled above, before a byte is taken.
                State::Data => {}
            }
            if matches!(
                self.state,
                State::TrailerStart
                    | State::TrailerLine
                    | State::TrailerLineLf
                    | State::TrailerEndLf
            ) {
                self.trailers += 1;
                if self.trailers > self.max_trailers {
                    return Err(bad("trailers too large"));
                }
            }
            i += 1;
        }
        Ok(Feed { consumed: i, data })
    }
}

#[cfg(test)]
mod trailer_tests {
    use super::*;

    #[test]
    fn trailers_are_kept_when_asked() {
        let mut d = ChunkedDecoder::new();
        d.keep_trailers(1024);
        let mut out = Vec::new();
        d.feed_into(b"3\r\nabc\r\n0\r\nX-A: 1\r\nX-B: 2\n\r\n", &mut out)
            .unwrap();
        assert!(d.is_done());
        assert_eq!(
            (&out[..], d.trailers_kept()),
            (&b"abc"[..], &b"X-A: 1\nX-B: 2\n"[..])
        );
        let mut plain = ChunkedDecoder::new();
        plain.feed(b"0\r\nX: 1\r\n\r\n").unwrap();
        assert!(plain.trailers_kept().is_empty());
    }

    #[test]
    fn trailers_as_nginx() {
        for (body, ok) in [
            (&b"0\r\nX: a\r\n\r\n"[..], true),
            (b"0\r\nX: a\n\n", true),
            (b"0\r\nnocolon\r\n\r\n", true),
            (b"0\r\nX: a\rb\r\n\r\n", false),
            (b"0\r\nX: a\0b\r\n\r\n", false),
        ] {
            let mut d = ChunkedDecoder::new();
            let r = d.feed(body);
            assert_eq!(
                r.is_ok() && d.is_done(),
                ok,
                "{:?}",
                String::from_utf8_lossy(body)
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(input: &[u8]) -> Result<(Feed, bool), Reject> {
        let mut d = ChunkedDecoder::new();
        let f = d.feed(input)?;
        Ok((f, d.is_done()))
    }

    #[test]
    fn whole_body() {
        let b = b"5\r\nhello\r\n0\r\n\r\nGET /";
        let (f, done) = all(b).unwrap();
        assert!(done);
        assert_eq!(
            f,
            Feed {
                consumed: b.len() - 5,
                data: 5
            }
        );
    }

    #[test]
    fn byte_by_byte_with_extensions_and_trailers() {
        let b = b"A;name=\"v\"\r\n0123456789\r\n1 ; x\n!\n0\r\nX-T: 1\r\nY: 2\r\n\r\n";
        let mut d = ChunkedDecoder::new();
        let mut data = 0;
        for (i, c) in b.iter().enumerate() {
            assert!(!d.is_done(), "done early at {i}");
            let f = d.feed(std::slice::from_ref(c)).unwrap();
            assert_eq!(f.consumed, 1);
            data += f.data;
        }
        assert!(d.is_done());
        assert_eq!(data, 11);
        assert_eq!(
            d.feed(b"more").unwrap(),
            Feed {
                consumed: 0,
                data: 0
            }
        );
    }

    #[test]
    fn split_data() {
        let mut d = ChunkedDecoder::new();
        assert_eq!(
            d.feed(b"10\r\n0123").unwrap(),
            Feed {
                consumed: 8,
                data: 4
            }
        );
        assert_eq!(d.feed(b"456789abcdef\r\n0\r\n").unwrap().data, 12);
        assert!(!d.is_done());
        d.feed(b"\r\n").unwrap();
        assert!(d.is_done());
    }

    #[test]
    fn malformed_is_400() {
        for b in [
            &b"x\r\n"[..],
            b"\r\n",
            b"5\rX",
            b"5\r\nhelloX",
            b"5\r\nhello\rX",
            b"0\r\n\rX",
            b"5 \x01\r\n",
            b"-1\r\n",
            b"8000000000000000\r\n",
            b"ffffffffffffffffffff\r\n",
        ] {
            let r = all(b).unwrap_err();
            assert_eq!(r.status, 400, "{:?}", String::from_utf8_lossy(b));
        }
        assert!(all(b"7fffffffffffffff\r\n").is_ok());
        assert!(
            all(b"000000000000000000000001\r\nx").is_ok(),
            "leading zeros are fine"
        );
        let long_ext = format!("1;{}\r\n", "a".repeat(5000));
        assert!(all(long_ext.as_bytes()).is_err());
        let trailers = format!("0\r\n{}", "X: y\r\n".repeat(5000));
        assert!(all(trailers.as_bytes()).is_err());
    }

    /// Feeds `body` to one decoder in pieces of `step` bytes through `feed_into`; returns the
    /// payload, the bytes consumed and whether the body ended.
    fn decode_in_steps(body: &[u8], step: usize) -> (Vec<u8>, usize, bool) {
        let mut d = ChunkedDecoder::new();
        let mut out = Vec::new();
        let mut consumed = 0;
        for piece in body.chunks(step) {
            let before = out.len();
            let f = d.feed_into(piece, &mut out).unwrap();
            assert_eq!(
                f.data,
                (out.len() - before) as u64,
                "data counts what was appended"
            );
            consumed += f.consumed;
            if f.consumed < piece.len() {
                break;
            }
        }
        (out, consumed, d.is_done())
    }

    #[test]
    fn feed_into_collects_payload_across_splits() {
        let body: &[u8] =
            b"5\r\nhello\r\n1;ext=1\r\n \r\nA\n0123456789\n0\r\nX-T: 1\r\n\r\nGET / HTTP/1.1\r\n";
        let end = body.len() - b"GET / HTTP/1.1\r\n".len();
        for step in 1..=body.len() {
            let (out, consumed, done) = decode_in_steps(body, step);
            assert_eq!(out, b"hello 0123456789", "step {step}");
            assert_eq!(consumed, end, "step {step}: the pipelined request is left");
            assert!(done, "step {step}");
        }
    }

    #[test]
    fn feed_into_appends_and_agrees_with_feed() {
        let body = b"3\r\nabc\r\n4\r\ndefg\r\n0\r\n\r\n";
        let mut out = b"kept:".to_vec();
        let mut d = ChunkedDecoder::new();
        let f = d.feed_into(&body[..9], &mut out).unwrap();
        assert_eq!(out, b"kept:abc");
        assert_eq!(f, ChunkedDecoder::new().feed(&body[..9]).unwrap());
        let f = d.feed_into(&body[9..13], &mut out).unwrap();
        assert_eq!((f.consumed, f.data), (4, 2));
        assert_eq!(out, b"kept:abcde");
        d.feed_into(&body[13..], &mut out).unwrap();
        assert!(d.is_done());
        assert_eq!(out, b"kept:abcdefg");
        assert_eq!(
            d.feed_into(b"more", &mut out).unwrap(),
            Feed {
                consumed: 0,
                data: 0
            }
        );
        assert_eq!(out, b"kept:abcdefg", "nothing after the end");
    }

    #[test]
    fn feed_into_rejects_like_feed() {
        let mut out = Vec::new();
        let r = ChunkedDecoder::new()
            .feed_into(b"2\r\nabc\r\n", &mut out)
            .unwrap_err();
        assert_eq!(r.status, 400);
        assert_eq!(out, b"ab", "payload before the error stays");
        let r = ChunkedDecoder::new()
            .feed_into(b"zz\r\n", &mut out)
            .unwrap_err();
        assert_eq!(r, ChunkedDecoder::new().feed(b"zz\r\n").unwrap_err());
    }
}
