//! HTTP/2 frames (RFC 9113, section 4 and 6): reading them from a connection's bytes and
//! writing them, without I/O and without state beyond one header block in progress.
//!
//! The second piece, after [`crate::hpack`], of shard's own HTTP/2 framing (issue 34; not
//! wired into the worker yet). [`Reader`] cuts whole frames out of what a connection read
//! and checks what a frame alone can be checked for (its length against
//! SETTINGS_MAX_FRAME_SIZE, the stream id its type requires, padding, the fixed sizes of
//! PRIORITY, RST_STREAM, SETTINGS, PING, WINDOW_UPDATE), and joins HEADERS with its
//! CONTINUATION frames up to a bound (a CONTINUATION flood ends there). Stream states, flow
//! control windows and the connection's answers belong to the session that uses it.

/// The connection preface a client sends first (RFC 9113, 3.4).
pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// SETTINGS_MAX_FRAME_SIZE's initial and smallest value.
pub const DEFAULT_MAX_FRAME: usize = 16_384;

/// Frame types.
pub mod kind {
    pub const DATA: u8 = 0;
    pub const HEADERS: u8 = 1;
    pub const PRIORITY: u8 = 2;
    pub const RST_STREAM: u8 = 3;
    pub const SETTINGS: u8 = 4;
    pub const PUSH_PROMISE: u8 = 5;
    pub const PING: u8 = 6;
    pub const GOAWAY: u8 = 7;
    pub const WINDOW_UPDATE: u8 = 8;
    pub const CONTINUATION: u8 = 9;
}

/// Frame flags.
pub mod flag {
    pub const END_STREAM: u8 = 0x1;
    pub const ACK: u8 = 0x1;
    pub const END_HEADERS: u8 = 0x4;
    pub const PADDED: u8 = 0x8;
    pub const PRIORITY: u8 = 0x20;
}

/// Error codes (RFC 9113, 7).
pub mod code {
    pub const NO_ERROR: u32 = 0x0;
    pub const PROTOCOL_ERROR: u32 = 0x1;
    pub const INTERNAL_ERROR: u32 = 0x2;
    pub const FLOW_CONTROL_ERROR: u32 = 0x3;
    pub const SETTINGS_TIMEOUT: u32 = 0x4;
    pub const STREAM_CLOSED: u32 = 0x5;
    pub const FRAME_SIZE_ERROR: u32 = 0x6;
    pub const REFUSED_STREAM: u32 = 0x7;
    pub const CANCEL: u32 = 0x8;
    pub const COMPRESSION_ERROR: u32 = 0x9;
    pub const ENHANCE_YOUR_CALM: u32 = 0xb;
}

/// A frame as read: its payload borrows the reader's input (padding removed; for HEADERS,
/// the priority fields too, and the CONTINUATION frames joined).
#[derive(Debug, PartialEq, Eq)]
pub enum Frame<'a> {
    Data {
        stream: u32,
        data: &'a [u8],
        end_stream: bool,
        /// Bytes the frame counts against flow control (padding included).
        flow_len: usize,
    },
    Headers {
        stream: u32,
        block: &'a [u8],
        end_stream: bool,
    },
    Priority {
        stream: u32,
    },
    RstStream {
        stream: u32,
        code: u32,
    },
    Settings {
        ack: bool,
        /// (identifier, value) pairs, in order.
        params: Vec<(u16, u32)>,
    },
    PushPromise {
        stream: u32,
    },
    Ping {
        ack: bool,
        data: [u8; 8],
    },
    GoAway {
        last_stream: u32,
        code: u32,
    },
    WindowUpdate {
        stream: u32,
        increment: u32,
    },
    /// A type this version does not know: ignored, as RFC 9113 asks.
    Unknown,
}

/// Why the connection must end: a GOAWAY with this code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnError(pub u32);

/// Cuts frames out of a connection's input.
#[derive(Debug)]
pub struct Reader {
    /// Our SETTINGS_MAX_FRAME_SIZE.
    pub max_frame: usize,
    /// The most bytes of a header block (HEADERS and its CONTINUATIONs, encoded) before the
    /// connection is ended with ENHANCE_YOUR_CALM.
    pub max_block: usize,
    /// The largest DATA frame taken: `max_frame` unless set (a peer may ignore our
    /// SETTINGS_MAX_FRAME_SIZE, as nginx's tests do; a frame within the stream's window
    /// costs no more than the window already allows).
    pub max_data: usize,
    /// A header block still waiting for its END_HEADERS: its stream, END_STREAM, and the
    /// fragments so far.
    pending: Option<(u32, bool, Vec<u8>)>,
    /// The joined block of the last HEADERS that needed CONTINUATIONs.
    joined: Vec<u8>,
}

impl Reader {
    pub fn new(max_frame: usize, max_block: usize) -> Reader {
        Reader {
            max_frame,
            max_block,
            max_data: max_frame,
            pending: None,
            joined: Vec::new(),
        }
    }

    /// A header block is open: HEADERS came without END_HEADERS, and its CONTINUATIONs
    /// have not ended it yet.
    pub fn in_block(&self) -> bool {
        self.pending.is_some()
    }

    /// The next whole frame at the start of `input`: `Ok(None)` when more input is needed,
    /// else the frame and how many bytes it used (also for a CONTINUATION that only added to
    /// a header block, reported as `Frame::Unknown`).
    pub fn next<'a>(
        &'a mut self,
        input: &'a [u8],
    ) -> Result<Option<(Frame<'a>, usize)>, ConnError> {
        if input.len() < 9 {
            return Ok(None);
        }
        let len =
            (usize::from(input[0]) << 16) | (usize::from(input[1]) << 8) | usize::from(input[2]);
        let (ty, flags) = (input[3], input[4]);
        let stream = u32::from_be_bytes([input[5], input[6], input[7], input[8]]) & 0x7fff_ffff;
        // A header block frame may be as large as a header block may be (nginx announces
        // 16 MiB frames and takes them; a peer that ignores our SETTINGS sends its head in
        // one frame): bounded all the same, by `max_block`.
        let limit = match ty {
            kind::HEADERS | kind::CONTINUATION => self.max_frame.max(self.max_block),
            kind::DATA => self.max_frame.max(self.max_data),
            _ => self.max_frame,
        };
        if len > limit {
            return Err(ConnError(code::FRAME_SIZE_ERROR));
        }
        // A client may never push: refused on its header, before its payload (as nginx).
        if ty == kind::PUSH_PROMISE {
            return Err(ConnError(code::PROTOCOL_ERROR));
        }
        if input.len() < 9 + len {
            return Ok(None);
        }
        let used = 9 + len;
        let p = &input[9..used];
        // While a header block is open, only its CONTINUATIONs may come (RFC 9113, 6.10).
        if let Some((open, ..)) = &self.pending {
            if ty != kind::CONTINUATION || stream != *open {
                return Err(ConnError(code::PROTOCOL_ERROR));
            }
        }
        let frame = match ty {
            kind::DATA => {
                if stream == 0 {
                    return Err(ConnError(code::PROTOCOL_ERROR));
                }
                Frame::Data {
                    stream,
                    data: unpad(p, flags)?,
                    end_stream: flags & flag::END_STREAM != 0,
                    flow_len: len,
                }
            }
            kind::HEADERS => {
                if stream == 0 {
                    return Err(ConnError(code::PROTOCOL_ERROR));
                }
                let mut block = unpad(p, flags)?;
                if flags & flag::PRIORITY != 0 {
                    if depends_on(block) == Some(stream) {
                        // A stream cannot depend on itself (RFC 9113 5.3.1): nginx ends the
                        // connection with PROTOCOL_ERROR.
                        return Err(ConnError(code::PROTOCOL_ERROR));
                    }
                    block = block.get(5..).ok_or(ConnError(code::FRAME_SIZE_ERROR))?;
                }
                let end_stream = flags & flag::END_STREAM != 0;
                if flags & flag::END_HEADERS == 0 {
                    if block.len() > self.max_block {
                        return Err(ConnError(code::ENHANCE_YOUR_CALM));
                    }
                    self.pending = Some((stream, end_stream, block.to_vec()));
                    Frame::Unknown
                } else {
                    Frame::Headers {
                        stream,
                        block,
                        end_stream,
                    }
                }
            }
            kind::CONTINUATION => {
                let Some((open, end_stream, mut acc)) = self.pending.take() else {
                    return Err(ConnError(code::PROTOCOL_ERROR));
                };
                if acc.len() + p.len() > self.max_block {
                    return Err(ConnError(code::ENHANCE_YOUR_CALM));
                }
                acc.extend_from_slice(p);
                if flags & flag::END_HEADERS == 0 {
                    self.pending = Some((open, end_stream, acc));
                    Frame::Unknown
                } else {
                    self.joined = acc;
                    Frame::Headers {
                        stream: open,
                        block: &self.joined,
                        end_stream,
                    }
                }
            }
            kind::PRIORITY => {
                if stream == 0 {
                    return Err(ConnError(code::PROTOCOL_ERROR));
                }
                if len != 5 {
                    // A stream error in RFC 9113; ending the connection is allowed and simpler.
                    return Err(ConnError(code::FRAME_SIZE_ERROR));
                }
                if depends_on(p) == Some(stream) {
                    return Err(ConnError(code::PROTOCOL_ERROR));
                }
                Frame::Priority { stream }
            }
            kind::RST_STREAM => {
                if stream == 0 {
                    return Err(ConnError(code::PROTOCOL_ERROR));
                }
                if len != 4 {
                    return Err(ConnError(code::FRAME_SIZE_ERROR));
                }
                Frame::RstStream {
                    stream,
                    code: u32::from_be_bytes([p[0], p[1], p[2], p[3]]),
                }
            }
            kind::SETTINGS => {
                if stream != 0 {
                    return Err(ConnError(code::PROTOCOL_ERROR));
                }
                let ack = flags & flag::ACK != 0;
                if (ack && len != 0) || len % 6 != 0 {
                    return Err(ConnError(code::FRAME_SIZE_ERROR));
                }
                let params = p
                    .chunks_exact(6)
                    .map(|c| {
                        (
                            u16::from_be_bytes([c[0], c[1]]),
                            u32::from_be_bytes([c[2], c[3], c[4], c[5]]),
                        )
                    })
                    .collect();
                Frame::Settings { ack, params }
            }
            // A client may not push (RFC 9113, 8.4).
            kind::PUSH_PROMISE => return Err(ConnError(code::PROTOCOL_ERROR)),
            kind::PING => {
                if stream != 0 {
                    return Err(ConnError(code::PROTOCOL_ERROR));
                }
                if len != 8 {
                    return Err(ConnError(code::FRAME_SIZE_ERROR));
                }
                let mut data = [0u8; 8];
                data.copy_from_slice(p);
                Frame::Ping {
                    ack: flags & flag::ACK != 0,
                    data,
                }
            }
            kind::GOAWAY => {
                if stream != 0 {
                    return Err(ConnError(code::PROTOCOL_ERROR));
                }
                if len < 8 {
                    return Err(ConnError(code::FRAME_SIZE_ERROR));
                }
                Frame::GoAway {
                    last_stream: u32::from_be_bytes([p[0], p[1], p[2], p[3]]) & 0x7fff_ffff,
                    code: u32::from_be_bytes([p[4], p[5], p[6], p[7]]),
                }
            }
            kind::WINDOW_UPDATE => {
                if len != 4 {
                    return Err(ConnError(code::FRAME_SIZE_ERROR));
                }
                let increment = u32::from_be_bytes([p[0], p[1], p[2], p[3]]) & 0x7fff_ffff;
                if increment == 0 && stream == 0 {
                    return Err(ConnError(code::PROTOCOL_ERROR));
                }
                Frame::WindowUpdate { stream, increment }
            }
            _ => Frame::Unknown,
        };
        Ok(Some((frame, used)))
    }
}

/// A DATA or HEADERS payload without its padding.
fn unpad(p: &[u8], flags: u8) -> Result<&[u8], ConnError> {
    if flags & flag::PADDED == 0 {
        return Ok(p);
    }
    let pad = usize::from(*p.first().ok_or(ConnError(code::FRAME_SIZE_ERROR))?);
    if pad >= p.len() {
        return Err(ConnError(code::PROTOCOL_ERROR));
    }
    Ok(&p[1..p.len() - pad])
}

/// Appends a frame header.
pub fn push_header(out: &mut Vec<u8>, len: usize, ty: u8, flags: u8, stream: u32) {
    out.extend_from_slice(&[(len >> 16) as u8, (len >> 8) as u8, len as u8, ty, flags]);
    out.extend_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
}

/// Appends a SETTINGS frame with `params`.
pub fn push_settings(out: &mut Vec<u8>, params: &[(u16, u32)]) {
    push_header(out, params.len() * 6, kind::SETTINGS, 0, 0);
    for (id, v) in params {
        out.extend_from_slice(&id.to_be_bytes());
        out.extend_from_slice(&v.to_be_bytes());
    }
}

/// Appends a SETTINGS acknowledgement.
pub fn push_settings_ack(out: &mut Vec<u8>) {
    push_header(out, 0, kind::SETTINGS, flag::ACK, 0);
}

/// Appends a PING acknowledgement of `data`.
pub fn push_ping_ack(out: &mut Vec<u8>, data: &[u8; 8]) {
    push_header(out, 8, kind::PING, flag::ACK, 0);
    out.extend_from_slice(data);
}

/// Appends a WINDOW_UPDATE.
pub fn push_window_update(out: &mut Vec<u8>, stream: u32, increment: u32) {
    push_header(out, 4, kind::WINDOW_UPDATE, 0, stream);
    out.extend_from_slice(&(increment & 0x7fff_ffff).to_be_bytes());
}

/// Appends a RST_STREAM.
pub fn push_rst_stream(out: &mut Vec<u8>, stream: u32, code: u32) {
    push_header(out, 4, kind::RST_STREAM, 0, stream);
    out.extend_from_slice(&code.to_be_bytes());
}

/// Appends a GOAWAY.
pub fn push_goaway(out: &mut Vec<u8>, last_stream: u32, code: u32) {
    push_header(out, 8, kind::GOAWAY, 0, 0);
    out.extend_from_slice(&(last_stream & 0x7fff_ffff).to_be_bytes());
    out.extend_from_slice(&code.to_be_bytes());
}

/// Appends a header block as HEADERS and as many CONTINUATIONs as `max_frame` needs.
pub fn push_headers(
    out: &mut Vec<u8>,
    stream: u32,
    block: &[u8],
    end_stream: bool,
    max_frame: usize,
) {
    let mut chunks = block.chunks(max_frame.max(1)).peekable();
    let first = chunks.next().unwrap_or(&[]);
    let mut flags = if end_stream { flag::END_STREAM } else { 0 };
    if chunks.peek().is_none() {
        flags |= flag::END_HEADERS;
    }
    push_header(out, first.len(), kind::HEADERS, flags, stream);
    out.extend_from_slice(first);
    while let Some(c) = chunks.next() {
        let last = chunks.peek().is_none();
        push_header(
            out,
            c.len(),
            kind::CONTINUATION,
            if last { flag::END_HEADERS } else { 0 },
            stream,
        );
        out.extend_from_slice(c);
    }
}

/// Appends a DATA frame (`data` no longer than the peer's SETTINGS_MAX_FRAME_SIZE).
pub fn push_data(out: &mut Vec<u8>, stream: u32, data: &[u8], end_stream: bool) {
    push_header(
        out,
        data.len(),
        kind::DATA,
        if end_stream { flag::END_STREAM } else { 0 },
        stream,
    );
    out.extend_from_slice(data);
}

/// The stream a priority block (`E | dependency(31) | weight`) depends on.
fn depends_on(p: &[u8]) -> Option<u32> {
    let b: [u8; 4] = p.get(..4)?.try_into().ok()?;
    Some(u32::from_be_bytes(b) & 0x7fff_ffff)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_all(r: &mut Reader, mut input: &[u8]) -> Result<Vec<String>, ConnError> {
        let mut seen = Vec::new();
        while let Some((f, used)) = r.next(input)? {
            if f != Frame::Unknown {
                seen.push(format!("{f:?}"));
            }
            input = &input[used..];
        }
        Ok(seen)
    }

    #[test]
    fn frames_written_read_back() {
        let mut out = Vec::new();
        push_settings(&mut out, &[(3, 100), (4, 65_535)]);
        push_settings_ack(&mut out);
        push_ping_ack(&mut out, b"12345678");
        push_window_update(&mut out, 3, 1000);
        push_rst_stream(&mut out, 5, code::CANCEL);
        push_goaway(&mut out, 7, code::NO_ERROR);
        push_data(&mut out, 1, b"hello", true);
        let mut r = Reader::new(DEFAULT_MAX_FRAME, 1 << 16);
        let seen = read_all(&mut r, &out).unwrap();
        assert_eq!(
            seen,
            [
                "Settings { ack: false, params: [(3, 100), (4, 65535)] }",
                "Settings { ack: true, params: [] }",
                "Ping { ack: true, data: [49, 50, 51, 52, 53, 54, 55, 56] }",
                "WindowUpdate { stream: 3, increment: 1000 }",
                "RstStream { stream: 5, code: 8 }",
                "GoAway { last_stream: 7, code: 0 }",
                "Data { stream: 1, data: [104, 101, 108, 108, 111], end_stream: true, flow_len: 5 }",
            ]
        );
    }

    #[test]
    fn a_header_block_in_continuations_is_joined_and_bounded() {
        let block: Vec<u8> = (0..40u8).collect();
        let mut out = Vec::new();
        push_headers(&mut out, 1, &block, true, 16);
        let mut r = Reader::new(DEFAULT_MAX_FRAME, 1 << 16);
        let seen = read_all(&mut r, &out).unwrap();
        assert_eq!(seen.len(), 1);
        assert!(
            seen[0].starts_with("Headers { stream: 1, block: [0, 1, 2"),
            "{seen:?}"
        );
        assert!(seen[0].ends_with("39], end_stream: true }"), "{seen:?}");
        // The same block against a bound of 32 bytes: a CONTINUATION flood stops there.
        let mut r = Reader::new(DEFAULT_MAX_FRAME, 32);
        assert_eq!(
            read_all(&mut r, &out),
            Err(ConnError(code::ENHANCE_YOUR_CALM))
        );
        // Another frame inside an open block.
        let mut bad = Vec::new();
        push_header(&mut bad, 3, kind::HEADERS, 0, 1);
        bad.extend_from_slice(&[0x82, 0x86, 0x84]);
        push_ping_ack(&mut bad, b"abcdefgh");
        let mut r = Reader::new(DEFAULT_MAX_FRAME, 1 << 16);
        assert_eq!(read_all(&mut r, &bad), Err(ConnError(code::PROTOCOL_ERROR)));
    }

    #[test]
    fn a_stream_that_depends_on_itself_ends_the_connection() {
        // PRIORITY on stream 3 depending on 3.
        let mut p = Vec::new();
        push_header(&mut p, 5, kind::PRIORITY, 0, 3);
        p.extend_from_slice(&[0, 0, 0, 3, 16]);
        assert_eq!(
            Reader::new(DEFAULT_MAX_FRAME, 1 << 16).next(&p),
            Err(ConnError(code::PROTOCOL_ERROR))
        );
        // HEADERS with PRIORITY on stream 5 depending on 5 (exclusive bit set).
        let mut h = Vec::new();
        push_header(&mut h, 5 + 1, kind::HEADERS, 0x20 | 0x4, 5);
        h.extend_from_slice(&[0x80, 0, 0, 5, 16, 0x82]);
        assert_eq!(
            Reader::new(DEFAULT_MAX_FRAME, 1 << 16).next(&h),
            Err(ConnError(code::PROTOCOL_ERROR))
        );
        // On another stream, both are fine.
        let mut ok = Vec::new();
        push_header(&mut ok, 5, kind::PRIORITY, 0, 3);
        ok.extend_from_slice(&[0, 0, 0, 1, 16]);
        assert!(Reader::new(DEFAULT_MAX_FRAME, 1 << 16).next(&ok).is_ok());
    }

    #[test]
    fn padding_and_priority_are_removed() {
        let mut out = Vec::new();
        // HEADERS, PADDED | PRIORITY | END_HEADERS: pad length 2, 5 priority bytes, block.
        push_header(&mut out, 1 + 5 + 3 + 2, kind::HEADERS, 0x8 | 0x20 | 0x4, 3);
        out.extend_from_slice(&[2, 0, 0, 0, 1, 16, 0x82, 0x86, 0x84, 0, 0]);
        // DATA, PADDED: pad length 1.
        push_header(&mut out, 1 + 2 + 1, kind::DATA, 0x8, 3);
        out.extend_from_slice(&[1, b'o', b'k', 0]);
        let mut r = Reader::new(DEFAULT_MAX_FRAME, 1 << 16);
        let seen = read_all(&mut r, &out).unwrap();
        assert_eq!(
            seen,
            [
                "Headers { stream: 3, block: [130, 134, 132], end_stream: false }",
                "Data { stream: 3, data: [111, 107], end_stream: false, flow_len: 4 }",
            ]
        );
        // Padding as long as the payload.
        let mut bad = Vec::new();
        push_header(&mut bad, 2, kind::DATA, 0x8, 3);
        bad.extend_from_slice(&[2, 0]);
        assert_eq!(
            Reader::new(DEFAULT_MAX_FRAME, 1 << 16).next(&bad),
            Err(ConnError(code::PROTOCOL_ERROR))
        );
    }

    #[test]
    fn frames_that_break_the_rules_end_the_connection() {
        let cases: Vec<(Vec<u8>, u32)> = vec![
            // Over SETTINGS_MAX_FRAME_SIZE.
            (
                {
                    let mut v = Vec::new();
                    push_header(&mut v, 16_385, kind::DATA, 0, 1);
                    v
                },
                code::FRAME_SIZE_ERROR,
            ),
            // DATA on stream 0.
            (
                {
                    let mut v = Vec::new();
                    push_data(&mut v, 0, b"x", false);
                    v
                },
                code::PROTOCOL_ERROR,
            ),
            // SETTINGS on a stream, or not a multiple of 6.
            (
                {
                    let mut v = Vec::new();
                    push_header(&mut v, 0, kind::SETTINGS, 0, 1);
                    v
                },
                code::PROTOCOL_ERROR,
            ),
            (
                {
                    let mut v = Vec::new();
                    push_header(&mut v, 5, kind::SETTINGS, 0, 0);
                    v.extend([0; 5]);
                    v
                },
                code::FRAME_SIZE_ERROR,
            ),
            // PING of 7 bytes.
            (
                {
                    let mut v = Vec::new();
                    push_header(&mut v, 7, kind::PING, 0, 0);
                    v.extend([0; 7]);
                    v
                },
                code::FRAME_SIZE_ERROR,
            ),
            // WINDOW_UPDATE of 0 on the connection.
            (
                {
                    let mut v = Vec::new();
                    push_window_update(&mut v, 0, 0);
                    v
                },
                code::PROTOCOL_ERROR,
            ),
            // PUSH_PROMISE from a client.
            (
                {
                    let mut v = Vec::new();
                    push_header(&mut v, 4, kind::PUSH_PROMISE, 0x4, 1);
                    v.extend([0, 0, 0, 2]);
                    v
                },
                code::PROTOCOL_ERROR,
            ),
            // A CONTINUATION with no HEADERS open.
            (
                {
                    let mut v = Vec::new();
                    push_header(&mut v, 1, kind::CONTINUATION, 0x4, 1);
                    v.push(0x82);
                    v
                },
                code::PROTOCOL_ERROR,
            ),
        ];
        for (bytes, want) in cases {
            let got = Reader::new(DEFAULT_MAX_FRAME, 1 << 16)
                .next(&bytes)
                .map(|_| ());
            assert_eq!(got, Err(ConnError(want)), "{bytes:?}");
        }
    }

    #[test]
    fn partial_input_waits_and_unknown_types_are_skipped() {
        let mut out = Vec::new();
        push_header(&mut out, 3, 0xfa, 0, 0);
        out.extend_from_slice(b"xyz");
        push_ping_ack(&mut out, b"abcdefgh");
        let mut r = Reader::new(DEFAULT_MAX_FRAME, 1 << 16);
        assert_eq!(r.next(&out[..8]), Ok(None));
        assert_eq!(r.next(&out[..11]), Ok(None));
        let seen = read_all(&mut r, &out).unwrap();
        assert_eq!(
            seen,
            ["Ping { ack: true, data: [97, 98, 99, 100, 101, 102, 103, 104] }"]
        );
    }
}
