//! HTTP/3 (RFC 9114) frames and QPACK (RFC 9204), without I/O: what the worker's QUIC
//! connections (`shard-server`'s `worker/h3.rs`) cut a stream's bytes into and write back.
//!
//! QPACK here keeps no dynamic table either way: shard announces a table capacity of 0, so a
//! client may only send static references and literals (a field section that names the
//! dynamic table is `QPACK_DECOMPRESSION_FAILED`), and the encoder writes static indices and
//! literals, Huffman-coded when shorter (RFC 9204 allows both; neither needs the encoder and
//! decoder streams). The decoder bounds a field section as HTTP/2's does: by the decoded
//! size (names, values and 32 bytes each) the caller gives.

use crate::hpack::{huffman_decode, huffman_encode, huffman_len, integer, push_integer};

/// Frame types (RFC 9114, 7.2).
pub mod frame {
    pub const DATA: u64 = 0x00;
    pub const HEADERS: u64 = 0x01;
    pub const CANCEL_PUSH: u64 = 0x03;
    pub const SETTINGS: u64 = 0x04;
    pub const PUSH_PROMISE: u64 = 0x05;
    pub const GOAWAY: u64 = 0x07;
    pub const MAX_PUSH_ID: u64 = 0x0d;
    /// HTTP/2's frame types that HTTP/3 reserves: receiving one is `H3_FRAME_UNEXPECTED`.
    pub fn reserved_h2(ty: u64) -> bool {
        matches!(ty, 0x02 | 0x06 | 0x08 | 0x09)
    }
}

/// Unidirectional stream types (RFC 9114, 6.2; RFC 9204, 4.2).
pub mod stream_type {
    pub const CONTROL: u64 = 0x00;
    pub const PUSH: u64 = 0x01;
    pub const QPACK_ENCODER: u64 = 0x02;
    pub const QPACK_DECODER: u64 = 0x03;
}

/// Error codes (RFC 9114, 8.1; RFC 9204, 6).
pub mod code {
    pub const NO_ERROR: u64 = 0x100;
    pub const GENERAL_PROTOCOL_ERROR: u64 = 0x101;
    pub const INTERNAL_ERROR: u64 = 0x102;
    pub const STREAM_CREATION_ERROR: u64 = 0x103;
    pub const CLOSED_CRITICAL_STREAM: u64 = 0x104;
    pub const FRAME_UNEXPECTED: u64 = 0x105;
    pub const FRAME_ERROR: u64 = 0x106;
    pub const EXCESSIVE_LOAD: u64 = 0x107;
    pub const ID_ERROR: u64 = 0x108;
    pub const SETTINGS_ERROR: u64 = 0x109;
    pub const MISSING_SETTINGS: u64 = 0x10a;
    pub const REQUEST_REJECTED: u64 = 0x10b;
    pub const REQUEST_CANCELLED: u64 = 0x10c;
    pub const REQUEST_INCOMPLETE: u64 = 0x10d;
    pub const MESSAGE_ERROR: u64 = 0x10e;
    pub const QPACK_DECOMPRESSION_FAILED: u64 = 0x200;
}

/// SETTINGS identifiers (RFC 9114, 7.2.4.1; RFC 9204, 5).
pub mod setting {
    pub const QPACK_MAX_TABLE_CAPACITY: u64 = 0x01;
    pub const MAX_FIELD_SECTION_SIZE: u64 = 0x06;
    pub const QPACK_BLOCKED_STREAMS: u64 = 0x07;
}

/// The largest value a QUIC variable-length integer holds (RFC 9000, 16).
pub const VARINT_MAX: u64 = (1 << 62) - 1;

/// Reads a variable-length integer at the start of `b`: the value and its length, `None`
/// when `b` ends inside it.
pub fn read_varint(b: &[u8]) -> Option<(u64, usize)> {
    let first = *b.first()?;
    let len = 1usize << (first >> 6);
    if b.len() < len {
        return None;
    }
    let mut v = u64::from(first & 0x3f);
    for &x in &b[1..len] {
        v = (v << 8) | u64::from(x);
    }
    Some((v, len))
}

/// Appends `v` (at most [`VARINT_MAX`]) as a variable-length integer, in its shortest form.
pub fn push_varint(out: &mut Vec<u8>, v: u64) {
    debug_assert!(v <= VARINT_MAX);
    if v < 1 << 6 {
        out.push(v as u8);
    } else if v < 1 << 14 {
        out.extend_from_slice(&((v as u16) | 0x4000).to_be_bytes());
    } else if v < 1 << 30 {
        out.extend_from_slice(&((v as u32) | 0x8000_0000).to_be_bytes());
    } else {
        out.extend_from_slice(&(v | 0xc000_0000_0000_0000).to_be_bytes());
    }
}

/// A frame's type and payload length, and the length of that header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHead {
    pub ty: u64,
    pub len: u64,
    pub head_len: usize,
}

/// The frame header at the start of `b`, `None` until it is whole.
pub fn frame_head(b: &[u8]) -> Option<FrameHead> {
    let (ty, a) = read_varint(b)?;
    let (len, c) = read_varint(&b[a..])?;
    Some(FrameHead {
        ty,
        len,
        head_len: a + c,
    })
}

/// Appends a frame header.
pub fn push_frame_head(out: &mut Vec<u8>, ty: u64, len: usize) {
    push_varint(out, ty);
    push_varint(out, len as u64);
}

/// The control stream's opening: its type, then our SETTINGS (a QPACK table of 0 and no
/// blocked streams are the defaults, so they are not sent; the field section limit is).
pub fn control_stream_start(max_field_section: u64) -> Vec<u8> {
    let mut settings = Vec::new();
    push_varint(&mut settings, setting::MAX_FIELD_SECTION_SIZE);
    push_varint(&mut settings, max_field_section);
    let mut out = Vec::with_capacity(settings.len() + 4);
    push_varint(&mut out, stream_type::CONTROL);
    push_frame_head(&mut out, frame::SETTINGS, settings.len());
    out.extend_from_slice(&settings);
    out
}

/// A GOAWAY frame naming the first request stream id that will not be served.
pub fn goaway(id: u64) -> Vec<u8> {
    let mut body = Vec::new();
    push_varint(&mut body, id);
    let mut out = Vec::new();
    push_frame_head(&mut out, frame::GOAWAY, body.len());
    out.extend_from_slice(&body);
    out
}

/// Parses a SETTINGS payload: `Err` for a setting sent twice or one HTTP/2 had (RFC 9114,
/// 7.2.4.1: `H3_SETTINGS_ERROR`), else the settings as pairs.
pub fn parse_settings(mut b: &[u8]) -> Result<Vec<(u64, u64)>, u64> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    while !b.is_empty() {
        let (id, a) = read_varint(b).ok_or(code::FRAME_ERROR)?;
        let (v, c) = read_varint(&b[a..]).ok_or(code::FRAME_ERROR)?;
        b = &b[a + c..];
        if matches!(id, 0x02..=0x05) || out.iter().any(|&(i, _)| i == id) {
            return Err(code::SETTINGS_ERROR);
        }
        out.push((id, v));
    }
    Ok(out)
}

/// QPACK's static table (RFC 9204, Appendix A).
pub const STATIC: [(&str, &str); 99] = [
    (":authority", ""),
    (":path", "/"),
    ("age", "0"),
    ("content-disposition", ""),
    ("content-length", "0"),
    ("cookie", ""),
    ("date", ""),
    ("etag", ""),
    ("if-modified-since", ""),
    ("if-none-match", ""),
    ("last-modified", ""),
    ("link", ""),
    ("location", ""),
    ("referer", ""),
    ("set-cookie", ""),
    (":method", "CONNECT"),
    (":method", "DELETE"),
    (":method", "GET"),
    (":method", "HEAD"),
    (":method", "OPTIONS"),
    (":method", "POST"),
    (":method", "PUT"),
    (":scheme", "http"),
    (":scheme", "https"),
    (":status", "103"),
    (":status", "200"),
    (":status", "304"),
    (":status", "404"),
    (":status", "503"),
    ("accept", "*/*"),
    ("accept", "application/dns-message"),
    ("accept-encoding", "gzip, deflate, br"),
    ("accept-ranges", "bytes"),
    ("access-control-allow-headers", "cache-control"),
    ("access-control-allow-headers", "content-type"),
    ("access-control-allow-origin", "*"),
    ("cache-control", "max-age=0"),
    ("cache-control", "max-age=2592000"),
    ("cache-control", "max-age=604800"),
    ("cache-control", "no-cache"),
    ("cache-control", "no-store"),
    ("cache-control", "public, max-age=31536000"),
    ("content-encoding", "br"),
    ("content-encoding", "gzip"),
    ("content-type", "application/dns-message"),
    ("content-type", "application/javascript"),
    ("content-type", "application/json"),
    ("content-type", "application/x-www-form-urlencoded"),
    ("content-type", "image/gif"),
    ("content-type", "image/jpeg"),
    ("content-type", "image/png"),
    ("content-type", "text/css"),
    ("content-type", "text/html; charset=utf-8"),
    ("content-type", "text/plain"),
    ("content-type", "text/plain;charset=utf-8"),
    ("range", "bytes=0-"),
    ("strict-transport-security", "max-age=31536000"),
    (
        "strict-transport-security",
        "max-age=31536000; includesubdomains",
    ),
    (
        "strict-transport-security",
        "max-age=31536000; includesubdomains; preload",
    ),
    ("vary", "accept-encoding"),
    ("vary", "origin"),
    ("x-content-type-options", "nosniff"),
    ("x-xss-protection", "1; mode=block"),
    (":status", "100"),
    (":status", "204"),
    (":status", "206"),
    (":status", "302"),
    (":status", "400"),
    (":status", "403"),
    (":status", "421"),
    (":status", "425"),
    (":status", "500"),
    ("accept-language", ""),
    ("access-control-allow-credentials", "FALSE"),
    ("access-control-allow-credentials", "TRUE"),
    ("access-control-allow-headers", "*"),
    ("access-control-allow-methods", "get"),
    ("access-control-allow-methods", "get, post, options"),
    ("access-control-allow-methods", "options"),
    ("access-control-expose-headers", "content-length"),
    ("access-control-request-headers", "content-type"),
    ("access-control-request-method", "get"),
    ("access-control-request-method", "post"),
    ("alt-svc", "clear"),
    ("authorization", ""),
    (
        "content-security-policy",
        "script-src 'none'; object-src 'none'; base-uri 'none'",
    ),
    ("early-data", "1"),
    ("expect-ct", ""),
    ("forwarded", ""),
    ("if-range", ""),
    ("origin", ""),
    ("purpose", "prefetch"),
    ("server", ""),
    ("timing-allow-origin", "*"),
    ("upgrade-insecure-requests", "1"),
    ("user-agent", ""),
    ("x-forwarded-for", ""),
    ("x-frame-options", "deny"),
    ("x-frame-options", "sameorigin"),
];

/// Why a field section could not be decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QpackError {
    /// Malformed, or a reference to the dynamic table shard never has
    /// (`QPACK_DECOMPRESSION_FAILED`, a connection error).
    Decompression,
    /// The decoded fields are over the caller's bound.
    TooLarge,
}

/// A decoded field section: names and values as ranges of one buffer.
#[derive(Debug, Default)]
pub struct Fields {
    buf: Vec<u8>,
    spans: Vec<(u32, u32, u32)>,
}

impl Fields {
    /// The fields, in order.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        self.spans.iter().map(|&(n, v, e)| {
            (
                &self.buf[n as usize..v as usize],
                &self.buf[v as usize..e as usize],
            )
        })
    }

    pub fn len(&self) -> usize {
        self.spans.len()
    }

    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }

    fn push(&mut self, name: &[u8], value: impl FnOnce(&mut Vec<u8>) -> Result<(), QpackError>) {
        let n = self.buf.len() as u32;
        self.buf.extend_from_slice(name);
        let v = self.buf.len() as u32;
        // A failed value leaves the field out; the caller stops at the error.
        if value(&mut self.buf).is_ok() {
            let e = self.buf.len() as u32;
            self.spans.push((n, v, e));
        }
    }
}

fn qint(b: &[u8], pos: &mut usize, prefix: u32) -> Result<usize, QpackError> {
    integer(b, pos, prefix).map_err(|_| QpackError::Decompression)
}

/// A string literal whose length prefix is `prefix` bits with the Huffman flag just above.
fn qstring(b: &[u8], pos: &mut usize, prefix: u32, out: &mut Vec<u8>) -> Result<(), QpackError> {
    let huffman = b.get(*pos).ok_or(QpackError::Decompression)? & (1 << prefix) != 0;
    let len = qint(b, pos, prefix)?;
    let end = pos.checked_add(len).ok_or(QpackError::Decompression)?;
    let s = b.get(*pos..end).ok_or(QpackError::Decompression)?;
    *pos = end;
    if huffman {
        huffman_decode(s, out).map_err(|_| QpackError::Decompression)
    } else {
        out.extend_from_slice(s);
        Ok(())
    }
}

/// Decodes a HEADERS frame's payload, its decoded size (RFC 9114, 4.2.2: name, value and
/// 32 bytes per field) at most `max_size`.
pub fn decode(block: &[u8], max_size: usize) -> Result<Fields, QpackError> {
    let mut pos = 0;
    // Required Insert Count, then the base: with no dynamic table both must be 0.
    if qint(block, &mut pos, 8)? != 0 {
        return Err(QpackError::Decompression);
    }
    let _delta_base = qint(block, &mut pos, 7)?;
    let mut f = Fields::default();
    let mut size = 0usize;
    let mut tmp = Vec::new();
    while pos < block.len() {
        let b = block[pos];
        let start = f.buf.len();
        if b & 0x80 != 0 {
            // Indexed field line; T (0x40) says static.
            if b & 0x40 == 0 {
                return Err(QpackError::Decompression);
            }
            let i = qint(block, &mut pos, 6)?;
            let &(n, v) = STATIC.get(i).ok_or(QpackError::Decompression)?;
            f.push(n.as_bytes(), |o| {
                o.extend_from_slice(v.as_bytes());
                Ok(())
            });
        } else if b & 0x40 != 0 {
            // Literal with a name reference; T (0x10) says static.
            if b & 0x10 == 0 {
                return Err(QpackError::Decompression);
            }
            let i = qint(block, &mut pos, 4)?;
            let &(n, _) = STATIC.get(i).ok_or(QpackError::Decompression)?;
            let mut res = Ok(());
            f.push(n.as_bytes(), |o| {
                res = qstring(block, &mut pos, 7, o);
                res
            });
            res?;
        } else if b & 0x20 != 0 {
            // Literal with a literal name: N (0x10), H (0x08), a 3-bit length prefix.
            tmp.clear();
            qstring(block, &mut pos, 3, &mut tmp)?;
            let mut res = Ok(());
            f.push(&tmp, |o| {
                res = qstring(block, &mut pos, 7, o);
                res
            });
            res?;
        } else {
            // Post-base references name the dynamic table.
            return Err(QpackError::Decompression);
        }
        size += f.buf.len() - start + 32;
        if size > max_size {
            return Err(QpackError::TooLarge);
        }
    }
    Ok(f)
}

/// A QPACK encoder without a dynamic table: static indices and literals, Huffman-coded when
/// shorter.
#[derive(Debug, Default)]
pub struct Encoder;

impl Encoder {
    /// Starts a field section (its prefix: no dynamic table references).
    pub fn start(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&[0, 0]);
    }

    /// Appends `:status` `code`.
    pub fn status(&self, code: u16, out: &mut Vec<u8>) {
        let mut digits = [0u8; 3];
        let mut c = code.min(999);
        for d in digits.iter_mut().rev() {
            *d = b'0' + (c % 10) as u8;
            c /= 10;
        }
        self.field(b":status", &digits, out);
    }

    /// Appends a field; `name` must be lowercase, as HTTP/3 requires.
    pub fn field(&self, name: &[u8], value: &[u8], out: &mut Vec<u8>) {
        let mut name_index = None;
        for (i, (n, v)) in STATIC.iter().enumerate() {
            if n.as_bytes() != name {
                continue;
            }
            if v.as_bytes() == value {
                push_integer(out, 0xc0, 6, i);
                return;
            }
            name_index.get_or_insert(i);
        }
        match name_index {
            Some(i) => push_integer(out, 0x50, 4, i),
            None => Self::string(name, 0x20, 3, out),
        }
        Self::string(value, 0x00, 7, out);
    }

    /// A string with a `prefix`-bit length under `flags`, the Huffman bit just above it.
    fn string(s: &[u8], flags: u8, prefix: u32, out: &mut Vec<u8>) {
        let h = huffman_len(s);
        if h < s.len() {
            push_integer(out, flags | (1 << prefix), prefix, h);
            huffman_encode(s, out);
        } else {
            push_integer(out, flags, prefix, s.len());
            out.extend_from_slice(s);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(f: &Fields) -> Vec<(String, String)> {
        f.iter()
            .map(|(n, v)| {
                (
                    String::from_utf8_lossy(n).into_owned(),
                    String::from_utf8_lossy(v).into_owned(),
                )
            })
            .collect()
    }

    #[test]
    fn varints_take_their_shortest_form_and_read_back() {
        for (v, len) in [
            (0u64, 1),
            (63, 1),
            (64, 2),
            (16_383, 2),
            (16_384, 4),
            (1 << 30, 8),
            (VARINT_MAX, 8),
        ] {
            let mut b = Vec::new();
            push_varint(&mut b, v);
            assert_eq!(b.len(), len, "{v}");
            assert_eq!(read_varint(&b), Some((v, len)));
            assert_eq!(read_varint(&b[..len - 1]), None);
        }
        // RFC 9000's example: 0x9d7f3e7d is 494878333.
        assert_eq!(
            read_varint(&[0x9d, 0x7f, 0x3e, 0x7d]),
            Some((494_878_333, 4))
        );
    }

    #[test]
    fn a_field_section_encoded_reads_back() {
        let e = Encoder;
        let mut b = Vec::new();
        e.start(&mut b);
        e.status(200, &mut b);
        e.status(418, &mut b);
        e.field(b"content-type", b"text/plain", &mut b);
        e.field(b"content-type", b"text/x-odd", &mut b);
        e.field(b"x-custom", b"a value, long enough for huffman", &mut b);
        e.field(b"x-e", b"", &mut b);
        let f = decode(&b, 4096).unwrap();
        assert_eq!(
            pairs(&f),
            [
                (":status", "200"),
                (":status", "418"),
                ("content-type", "text/plain"),
                ("content-type", "text/x-odd"),
                ("x-custom", "a value, long enough for huffman"),
                ("x-e", ""),
            ]
            .map(|(a, b)| (a.to_string(), b.to_string()))
        );
        // `:status 200` is static entry 25: one byte.
        assert_eq!(b[2], 0xc0 | 25);
    }

    #[test]
    fn dynamic_references_and_limits_are_refused() {
        // Required Insert Count 1: a dynamic table shard never allowed.
        assert_eq!(
            decode(&[0x01, 0x00, 0x80], 4096).unwrap_err(),
            QpackError::Decompression
        );
        // An indexed line with T = 0 (dynamic).
        assert_eq!(
            decode(&[0x00, 0x00, 0x80], 4096).unwrap_err(),
            QpackError::Decompression
        );
        // A post-base index.
        assert_eq!(
            decode(&[0x00, 0x00, 0x10], 4096).unwrap_err(),
            QpackError::Decompression
        );
        // Past the static table.
        assert_eq!(
            decode(&[0x00, 0x00, 0xff, 0x30], 4096).unwrap_err(),
            QpackError::Decompression
        );
        // A literal that runs past the block.
        assert_eq!(
            decode(&[0x00, 0x00, 0x51, 0x05, b'a'], 4096).unwrap_err(),
            QpackError::Decompression
        );
        let e = Encoder;
        let mut b = Vec::new();
        e.start(&mut b);
        e.field(b"x-long", &[b'a'; 100], &mut b);
        assert_eq!(decode(&b, 100).unwrap_err(), QpackError::TooLarge);
        assert!(decode(&b, 200).is_ok());
    }

    #[test]
    fn settings_and_frames() {
        let c = control_stream_start(65536);
        assert_eq!(c[0], 0x00);
        let h = frame_head(&c[1..]).unwrap();
        assert_eq!(h.ty, frame::SETTINGS);
        let s = parse_settings(&c[1 + h.head_len..]).unwrap();
        assert_eq!(s, vec![(setting::MAX_FIELD_SECTION_SIZE, 65536)]);
        // HTTP/2's SETTINGS_ENABLE_PUSH (0x02) is an error in HTTP/3; so is a repeat.
        assert_eq!(parse_settings(&[0x02, 0x00]), Err(code::SETTINGS_ERROR));
        assert_eq!(
            parse_settings(&[0x06, 0x01, 0x06, 0x01]),
            Err(code::SETTINGS_ERROR)
        );
        let g = goaway(8);
        assert_eq!(g, vec![0x07, 0x01, 0x08]);
    }
}
