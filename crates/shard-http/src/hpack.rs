//! HPACK (RFC 7541), HTTP/2's header compression: a decoder with its dynamic table and an
//! encoder, both without I/O and without allocation per field on the common paths.
//!
//! The first piece of shard's own HTTP/2 framing (issue 34): measured against the `h2`
//! crate the worker drives today, whose HPACK and frame buffers are most of its 21,000
//! instructions and 24 KiB per connection (docs/bench.md, `h2`). Nothing in the worker uses
//! this module yet.
//!
//! The decoder bounds what a header block may cost: the decoded list (names, values and 32
//! bytes each, as SETTINGS_MAX_HEADER_LIST_SIZE counts them), the dynamic table (the size
//! our SETTINGS announced), integers (no more than 2^28 - 1) and strings (no longer than the
//! block). The encoder writes the static table's indices and literals that are not indexed,
//! Huffman-coded when that is shorter; it keeps no dynamic table, so a response block costs
//! no state on the connection.

use std::collections::VecDeque;

/// Why a header block could not be decoded: each ends the connection (the session picks
/// the error code: `COMPRESSION_ERROR`, or nginx's for sizes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Error {
    /// The block ended inside a field.
    Truncated,
    /// An integer over 2^28 - 1.
    Integer,
    /// Index 0, or past the static and dynamic tables.
    Index,
    /// A Huffman string with the EOS symbol, or padding not all ones.
    Huffman,
    /// A dynamic table size update over our setting, or after a field.
    TableSize,
    /// The decoded list is larger than the limit given to [`Decoder::decode`].
    ListTooLarge,
    /// A string literal longer than [`Decoder::set_max_field`] allows.
    FieldTooLarge,
}

/// The static table (RFC 7541, Appendix A), index 1 first.
pub const STATIC: [(&str, &str); 61] = [
    (":authority", ""),
    (":method", "GET"),
    (":method", "POST"),
    (":path", "/"),
    (":path", "/index.html"),
    (":scheme", "http"),
    (":scheme", "https"),
    (":status", "200"),
    (":status", "204"),
    (":status", "206"),
    (":status", "304"),
    (":status", "400"),
    (":status", "404"),
    (":status", "500"),
    ("accept-charset", ""),
    ("accept-encoding", "gzip, deflate"),
    ("accept-language", ""),
    ("accept-ranges", ""),
    ("accept", ""),
    ("access-control-allow-origin", ""),
    ("age", ""),
    ("allow", ""),
    ("authorization", ""),
    ("cache-control", ""),
    ("content-disposition", ""),
    ("content-encoding", ""),
    ("content-language", ""),
    ("content-length", ""),
    ("content-location", ""),
    ("content-range", ""),
    ("content-type", ""),
    ("cookie", ""),
    ("date", ""),
    ("etag", ""),
    ("expect", ""),
    ("expires", ""),
    ("from", ""),
    ("host", ""),
    ("if-match", ""),
    ("if-modified-since", ""),
    ("if-none-match", ""),
    ("if-range", ""),
    ("if-unmodified-since", ""),
    ("last-modified", ""),
    ("link", ""),
    ("location", ""),
    ("max-forwards", ""),
    ("proxy-authenticate", ""),
    ("proxy-authorization", ""),
    ("range", ""),
    ("referer", ""),
    ("refresh", ""),
    ("retry-after", ""),
    ("server", ""),
    ("set-cookie", ""),
    ("strict-transport-security", ""),
    ("transfer-encoding", ""),
    ("user-agent", ""),
    ("vary", ""),
    ("via", ""),
    ("www-authenticate", ""),
];

/// The Huffman code's lengths in bits, by symbol (0-255, then 256 = EOS): RFC 7541,
/// Appendix B. The code is canonical (codes of one length are consecutive, in symbol order,
/// and each length's first code follows the previous length's last), so the lengths are the
/// whole table; [`HUFFMAN`] derives the codes from them.
const HUFFMAN_LENGTHS: [u8; 257] = [
    13, 23, 28, 28, 28, 28, 28, 28, 28, 24, 30, 28, 28, 30, 28, 28, 28, 28, 28, 28, 28, 28, 30, 28,
    28, 28, 28, 28, 28, 28, 28, 28, 6, 10, 10, 12, 13, 6, 8, 11, 10, 10, 8, 11, 8, 6, 6, 6, 5, 5,
    5, 6, 6, 6, 6, 6, 6, 6, 7, 8, 15, 6, 12, 10, 13, 6, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7,
    7, 7, 7, 7, 7, 7, 7, 7, 8, 7, 8, 13, 19, 13, 14, 6, 15, 5, 6, 5, 6, 5, 6, 6, 6, 5, 7, 7, 6, 6,
    6, 5, 6, 7, 6, 5, 5, 6, 7, 7, 7, 7, 7, 15, 11, 14, 13, 28, 20, 22, 20, 20, 22, 22, 22, 23, 22,
    23, 23, 23, 23, 23, 24, 23, 24, 24, 22, 23, 24, 23, 23, 23, 23, 21, 22, 23, 22, 23, 23, 24, 22,
    21, 20, 22, 22, 23, 23, 21, 23, 22, 22, 24, 21, 22, 23, 23, 21, 21, 22, 21, 23, 22, 23, 23, 20,
    22, 22, 22, 23, 22, 22, 23, 26, 26, 20, 19, 22, 23, 22, 25, 26, 26, 26, 27, 27, 26, 24, 25, 19,
    21, 26, 27, 27, 26, 27, 24, 21, 21, 26, 26, 28, 27, 27, 27, 20, 24, 20, 21, 22, 21, 21, 23, 22,
    22, 25, 25, 24, 24, 26, 23, 26, 27, 26, 26, 27, 27, 27, 27, 27, 28, 27, 27, 27, 27, 27, 26, 30,
];

const MAX_BITS: usize = 30;
const EOS: u16 = 256;

/// The canonical code: each symbol's code, and per length the first code, the first index
/// into `sorted` and the count, for decoding.
struct Huffman {
    codes: [u32; 257],
    /// Symbols ordered by (length, symbol).
    sorted: [u16; 257],
    /// For lengths 0..=30: the first code, the index in `sorted` of its symbol, and the
    /// left-justified (to 30 bits) limit below which a 30-bit window holds a code of this
    /// length or shorter.
    first: [u32; MAX_BITS + 1],
    index: [u16; MAX_BITS + 1],
    limit: [u32; MAX_BITS + 1],
}

const fn build() -> Huffman {
    let mut h = Huffman {
        codes: [0; 257],
        sorted: [0; 257],
        first: [0; MAX_BITS + 1],
        index: [0; MAX_BITS + 1],
        limit: [0; MAX_BITS + 1],
    };
    let mut count = [0u32; MAX_BITS + 1];
    let mut s = 0;
    while s < 257 {
        count[HUFFMAN_LENGTHS[s] as usize] += 1;
        s += 1;
    }
    let mut code = 0u32;
    let mut idx = 0u16;
    let mut len = 1;
    while len <= MAX_BITS {
        code = (code + if len > 1 { count[len - 1] } else { 0 }) << 1;
        h.first[len] = code;
        h.index[len] = idx;
        // Symbols of this length, in symbol order.
        let mut n = 0u32;
        let mut s = 0;
        while s < 257 {
            if HUFFMAN_LENGTHS[s] as usize == len {
                h.codes[s] = code + n;
                h.sorted[idx as usize] = s as u16;
                idx += 1;
                n += 1;
            }
            s += 1;
        }
        h.limit[len] = (code + count[len]) << (MAX_BITS - len);
        len += 1;
    }
    h
}

static HUFFMAN: Huffman = build();

/// The Huffman-coded length of `src` in bytes.
pub fn huffman_len(src: &[u8]) -> usize {
    let bits: usize = src
        .iter()
        .map(|&b| HUFFMAN_LENGTHS[b as usize] as usize)
        .sum();
    bits.div_ceil(8)
}

/// Appends the Huffman coding of `src` to `out`, padded with ones.
pub fn huffman_encode(src: &[u8], out: &mut Vec<u8>) {
    let mut acc: u64 = 0;
    let mut n = 0u32;
    for &b in src {
        let len = HUFFMAN_LENGTHS[b as usize] as u32;
        acc = (acc << len) | u64::from(HUFFMAN.codes[b as usize]);
        n += len;
        while n >= 8 {
            n -= 8;
            out.push((acc >> n) as u8);
        }
    }
    if n > 0 {
        out.push(((acc << (8 - n)) as u8) | (0xff >> n));
    }
}

/// Appends the decoding of the Huffman string `src` to `out`.
pub fn huffman_decode(src: &[u8], out: &mut Vec<u8>) -> Result<(), Error> {
    let h = &HUFFMAN;
    let mut acc: u64 = 0;
    let mut n: u32 = 0;
    let mut i = 0;
    loop {
        while n <= 56 && i < src.len() {
            acc = (acc << 8) | u64::from(src[i]);
            n += 8;
            i += 1;
        }
        if n == 0 {
            return Ok(());
        }
        // The next 30 bits, left-justified; past the end they read as ones (padding).
        let window = if n >= MAX_BITS as u32 {
            (acc >> (n - MAX_BITS as u32)) as u32 & ((1 << MAX_BITS) - 1)
        } else {
            ((acc << (MAX_BITS as u32 - n)) as u32 | ((1 << (MAX_BITS as u32 - n)) - 1))
                & ((1 << MAX_BITS) - 1)
        };
        let mut len = 5;
        while len <= MAX_BITS && window >= h.limit[len] {
            len += 1;
        }
        if len > MAX_BITS {
            return Err(Error::Huffman);
        }
        if len as u32 > n {
            // What is left is shorter than the code it would start: padding, which must be
            // all ones (RFC 7541, 5.2). RFC 7541 also refuses padding over 7 bits; nginx
            // takes any run of ones short of EOS (its `ending` states), and clients that
            // pad a whole byte exist (nginx's own test client): as nginx.
            let pad = (acc & ((1 << n) - 1)) as u32;
            if pad != (1 << n) - 1 {
                return Err(Error::Huffman);
            }
            return Ok(());
        }
        let code = window >> (MAX_BITS - len);
        let sym = h.sorted[(h.index[len] + (code - h.first[len]) as u16) as usize];
        if sym == EOS {
            return Err(Error::Huffman);
        }
        out.push(sym as u8);
        n -= len as u32;
        acc &= (1u64 << n).wrapping_sub(1);
    }
}

/// Reads an integer with an `prefix`-bit prefix at `src[*pos]` (RFC 7541, 5.1).
pub(crate) fn integer(src: &[u8], pos: &mut usize, prefix: u32) -> Result<usize, Error> {
    let max = (1usize << prefix) - 1;
    let first = *src.get(*pos).ok_or(Error::Truncated)? as usize & max;
    *pos += 1;
    if first < max {
        return Ok(first);
    }
    let mut value = max;
    let mut shift = 0;
    loop {
        let b = *src.get(*pos).ok_or(Error::Truncated)?;
        *pos += 1;
        value += ((b & 0x7f) as usize) << shift;
        shift += 7;
        if value > (1 << 28) - 1 {
            return Err(Error::Integer);
        }
        if b & 0x80 == 0 {
            return Ok(value);
        }
    }
}

/// Appends an integer with an `prefix`-bit prefix whose other bits are `flags`.
pub(crate) fn push_integer(out: &mut Vec<u8>, flags: u8, prefix: u32, mut v: usize) {
    let max = (1usize << prefix) - 1;
    if v < max {
        out.push(flags | v as u8);
        return;
    }
    out.push(flags | max as u8);
    v -= max;
    while v >= 0x80 {
        out.push((v & 0x7f) as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// A dynamic table entry: name, value.
type Entry = (Box<[u8]>, Box<[u8]>);

/// The dynamic table: newest first; its size counts 32 bytes per entry (RFC 7541, 4.1).
#[derive(Debug, Default)]
struct Table {
    entries: VecDeque<Entry>,
    size: usize,
    max: usize,
}

impl Table {
    fn evict_to(&mut self, max: usize) {
        while self.size > max {
            let Some((n, v)) = self.entries.pop_back() else {
                break;
            };
            self.size -= n.len() + v.len() + 32;
        }
    }

    fn insert(&mut self, name: &[u8], value: &[u8]) {
        let size = name.len() + value.len() + 32;
        if size > self.max {
            // Larger than the whole table: it empties the table and is not kept (4.4).
            self.entries.clear();
            self.size = 0;
            return;
        }
        self.evict_to(self.max - size);
        self.entries.push_front((name.into(), value.into()));
        self.size += size;
    }
}

/// Field `i` of the static table (1-61) or the dynamic table `t` (62 on).
fn get(t: &Table, i: usize) -> Result<(&[u8], &[u8]), Error> {
    if i == 0 {
        return Err(Error::Index);
    }
    if let Some((n, v)) = STATIC.get(i - 1) {
        return Ok((n.as_bytes(), v.as_bytes()));
    }
    t.entries
        .get(i - 1 - STATIC.len())
        .map(|(n, v)| (&n[..], &v[..]))
        .ok_or(Error::Index)
}

/// An HPACK decoder: one per connection (its dynamic table is the connection's).
#[derive(Debug)]
pub struct Decoder {
    table: Table,
    /// SETTINGS_HEADER_TABLE_SIZE as we announced it: a size update may not exceed it.
    setting: usize,
    /// Decoded strings of the field in hand.
    scratch: Vec<u8>,
    /// The longest string literal taken, as sent (nginx: `large_client_header_buffers`'
    /// size); `usize::MAX` unless set.
    max_field: usize,
}

impl Decoder {
    /// String literals longer than `n` bytes (as sent) fail with [`Error::FieldTooLarge`].
    pub fn set_max_field(&mut self, n: usize) {
        self.max_field = n;
    }

    /// A decoder whose table may grow to `table_size` bytes (4096 is HTTP/2's default).
    pub fn new(table_size: usize) -> Decoder {
        Decoder {
            table: Table {
                max: table_size,
                ..Table::default()
            },
            setting: table_size,
            scratch: Vec::new(),
            max_field: usize::MAX,
        }
    }

    /// Bytes the dynamic table holds now (entries plus 32 each).
    pub fn table_size(&self) -> usize {
        self.table.size
    }

    /// Decodes a whole header block, handing each field to `field` in order. The list may
    /// decode to at most `max_list` bytes (names and values, as nginx counts its header
    /// limit); past that, [`Error::ListTooLarge`] at once (the connection ends with it, so
    /// the dynamic table need not follow the rest of the block).
    pub fn decode(
        &mut self,
        block: &[u8],
        max_list: usize,
        mut field: impl FnMut(&[u8], &[u8]),
    ) -> Result<(), Error> {
        let mut pos = 0;
        let mut list = 0usize;
        let mut fields_seen = false;
        while pos < block.len() {
            let b = block[pos];
            let (name_at, value_at, index) = if b & 0x80 != 0 {
                // Indexed field (6.1).
                let i = integer(block, &mut pos, 7)?;
                let (n, v) = get(&self.table, i)?;
                list += n.len() + v.len();
                if list > max_list {
                    return Err(Error::ListTooLarge);
                }
                field(n, v);
                fields_seen = true;
                continue;
            } else if b & 0x40 != 0 {
                // Literal with incremental indexing (6.2.1).
                let i = integer(block, &mut pos, 6)?;
                self.scratch.clear();
                let n = self.name(block, &mut pos, i)?;
                let v = self.string(block, &mut pos)?;
                (n, v, true)
            } else if b & 0x20 != 0 {
                // Dynamic table size update (6.3): only before the first field.
                let size = integer(block, &mut pos, 5)?;
                if size > self.setting || fields_seen {
                    return Err(Error::TableSize);
                }
                self.table.max = size;
                self.table.evict_to(size);
                continue;
            } else {
                // Literal without indexing (6.2.2) or never indexed (6.2.3).
                let i = integer(block, &mut pos, 4)?;
                self.scratch.clear();
                let n = self.name(block, &mut pos, i)?;
                let v = self.string(block, &mut pos)?;
                (n, v, false)
            };
            fields_seen = true;
            let s = &self.scratch;
            let (name, value) = (&s[name_at.0..name_at.1], &s[value_at.0..value_at.1]);
            list += name.len() + value.len();
            if list > max_list {
                return Err(Error::ListTooLarge);
            }
            field(name, value);
            if index {
                self.table.insert(name, value);
            }
        }
        Ok(())
    }

    /// A literal field's name into `scratch`: indexed (`i` > 0) or a string.
    fn name(&mut self, block: &[u8], pos: &mut usize, i: usize) -> Result<(usize, usize), Error> {
        if i == 0 {
            return self.string(block, pos);
        }
        let start = self.scratch.len();
        let (n, _) = get(&self.table, i)?;
        self.scratch.extend_from_slice(n);
        Ok((start, self.scratch.len()))
    }

    /// A string literal (5.2) into `scratch`: its range there.
    fn string(&mut self, block: &[u8], pos: &mut usize) -> Result<(usize, usize), Error> {
        let huffman = *block.get(*pos).ok_or(Error::Truncated)? & 0x80 != 0;
        let len = integer(block, pos, 7)?;
        if len > self.max_field {
            return Err(Error::FieldTooLarge);
        }
        let end = pos.checked_add(len).ok_or(Error::Truncated)?;
        let raw = block.get(*pos..end).ok_or(Error::Truncated)?;
        *pos = end;
        let start = self.scratch.len();
        if huffman {
            huffman_decode(raw, &mut self.scratch)?;
        } else {
            self.scratch.extend_from_slice(raw);
        }
        Ok((start, self.scratch.len()))
    }
}

/// The first index of `name` in [`STATIC`] (0: none): a `match` the compiler turns into a
/// dispatch on length and bytes, where a scan compared every entry.
fn static_name(name: &[u8]) -> usize {
    match name {
        b":authority" => 1,
        b":method" => 2,
        b":path" => 4,
        b":scheme" => 6,
        b":status" => 8,
        b"accept-charset" => 15,
        b"accept-encoding" => 16,
        b"accept-language" => 17,
        b"accept-ranges" => 18,
        b"accept" => 19,
        b"access-control-allow-origin" => 20,
        b"age" => 21,
        b"allow" => 22,
        b"authorization" => 23,
        b"cache-control" => 24,
        b"content-disposition" => 25,
        b"content-encoding" => 26,
        b"content-language" => 27,
        b"content-length" => 28,
        b"content-location" => 29,
        b"content-range" => 30,
        b"content-type" => 31,
        b"cookie" => 32,
        b"date" => 33,
        b"etag" => 34,
        b"expect" => 35,
        b"expires" => 36,
        b"from" => 37,
        b"host" => 38,
        b"if-match" => 39,
        b"if-modified-since" => 40,
        b"if-none-match" => 41,
        b"if-range" => 42,
        b"if-unmodified-since" => 43,
        b"last-modified" => 44,
        b"link" => 45,
        b"location" => 46,
        b"max-forwards" => 47,
        b"proxy-authenticate" => 48,
        b"proxy-authorization" => 49,
        b"range" => 50,
        b"referer" => 51,
        b"refresh" => 52,
        b"retry-after" => 53,
        b"server" => 54,
        b"set-cookie" => 55,
        b"strict-transport-security" => 56,
        b"transfer-encoding" => 57,
        b"user-agent" => 58,
        b"vary" => 59,
        b"via" => 60,
        b"www-authenticate" => 61,
        _ => 0,
    }
}

/// An HPACK encoder that keeps no dynamic table: static indices and literals without
/// indexing, Huffman-coded when shorter.
#[derive(Debug, Default)]
pub struct Encoder;

impl Encoder {
    /// Appends `:status` `code`.
    pub fn status(&self, code: u16, out: &mut Vec<u8>) {
        let index = match code {
            200 => 8,
            204 => 9,
            206 => 10,
            304 => 11,
            400 => 12,
            404 => 13,
            500 => 14,
            _ => 0,
        };
        if index != 0 {
            push_integer(out, 0x80, 7, index);
            return;
        }
        let mut digits = [0u8; 3];
        let mut c = code.min(999);
        for d in digits.iter_mut().rev() {
            *d = b'0' + (c % 10) as u8;
            c /= 10;
        }
        push_integer(out, 0x00, 4, 8);
        Self::string(&digits, out);
    }

    /// Appends a field; `name` must be lowercase, as HTTP/2 requires.
    pub fn field(&self, name: &[u8], value: &[u8], out: &mut Vec<u8>) {
        let name_index = static_name(name);
        if name_index != 0 {
            // The entries of one name follow each other.
            for (i, (n, v)) in STATIC.iter().enumerate().skip(name_index - 1) {
                if n.as_bytes() != name {
                    break;
                }
                if !v.is_empty() && v.as_bytes() == value {
                    push_integer(out, 0x80, 7, i + 1);
                    return;
                }
            }
        }
        push_integer(out, 0x00, 4, name_index);
        if name_index == 0 {
            Self::string(name, out);
        }
        Self::string(value, out);
    }

    fn string(s: &[u8], out: &mut Vec<u8>) {
        let h = huffman_len(s);
        if h < s.len() {
            push_integer(out, 0x80, 7, h);
            huffman_encode(s, out);
        } else {
            push_integer(out, 0x00, 7, s.len());
            out.extend_from_slice(s);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    /// A browser-like request block, Huffman-coded by Python's `hpack`.
    const BROWSER_HUFFMAN: &str =
        "8387448a606c47fe120544093e0b418b44e3b245d25426e3cd34cf7acbd07f66a281b0dae053fafc\
         087ed4ce6aadf2a7979c89c6bfb521aeba0bc8b1e632586d975765c53facd8f7e8cff4a506ea5531\
         149d4ffda97a7b0f49580880b814dc394761986d975765cf60821c0160878e0fffe3fffeef4084f2\
         b466ab8bffc7fffffe7fff1ffffe3f";

    /// `cargo test --release -p shard-http hpack_speed -- --ignored --nocapture`: time per
    /// decode of [`BROWSER_HUFFMAN`] with a new decoder each time (a measurement, not a
    /// timed test: it asserts nothing).
    #[test]
    #[ignore]
    fn hpack_speed() {
        let block = hex(BROWSER_HUFFMAN);
        let n = 200_000;
        let t = std::time::Instant::now();
        let mut total = 0;
        for _ in 0..n {
            let mut d = Decoder::new(4096);
            d.decode(&block, 1 << 20, |a, b| total += a.len() + b.len())
                .unwrap();
        }
        let per = t.elapsed().as_nanos() as f64 / n as f64;
        eprintln!(
            "decode of a {} byte block: {per:.0} ns ({total})",
            block.len()
        );
    }

    fn decode_all(d: &mut Decoder, block: &[u8]) -> Result<Vec<(String, Vec<u8>)>, Error> {
        let mut got = Vec::new();
        d.decode(block, 1 << 20, |n, v| {
            got.push((String::from_utf8(n.to_vec()).unwrap(), v.to_vec()));
        })?;
        Ok(got)
    }

    fn pairs(list: &[(&str, &str)]) -> Vec<(String, Vec<u8>)> {
        list.iter()
            .map(|(n, v)| (n.to_string(), v.as_bytes().to_vec()))
            .collect()
    }

    /// RFC 7541, C.4: three requests with Huffman coding on one connection; the dynamic
    /// table carries `:authority` and the custom fields from one to the next.
    #[test]
    fn decodes_the_rfc_requests_with_huffman_and_the_dynamic_table() {
        let mut d = Decoder::new(4096);
        let first = hex("828684418cf1e3c2e5f23a6ba0ab90f4ff");
        assert_eq!(
            decode_all(&mut d, &first).unwrap(),
            pairs(&[
                (":method", "GET"),
                (":scheme", "http"),
                (":path", "/"),
                (":authority", "www.example.com"),
            ])
        );
        assert_eq!(d.table_size(), 57);
        let second = hex("828684be5886a8eb10649cbf");
        assert_eq!(
            decode_all(&mut d, &second).unwrap(),
            pairs(&[
                (":method", "GET"),
                (":scheme", "http"),
                (":path", "/"),
                (":authority", "www.example.com"),
                ("cache-control", "no-cache"),
            ])
        );
        assert_eq!(d.table_size(), 110);
        let third = hex("828785bf408825a849e95ba97d7f8925a849e95bb8e8b4bf");
        assert_eq!(
            decode_all(&mut d, &third).unwrap(),
            pairs(&[
                (":method", "GET"),
                (":scheme", "https"),
                (":path", "/index.html"),
                (":authority", "www.example.com"),
                ("custom-key", "custom-value"),
            ])
        );
        assert_eq!(d.table_size(), 164);
    }

    /// A browser-like block written by Python's `hpack` (Huffman on and off): every byte
    /// value survives, repeated `cookie` fields stay apart.
    #[test]
    fn decodes_another_encoders_blocks_huffman_or_not() {
        let want = vec![
            (":method".to_string(), b"POST".to_vec()),
            (":scheme".to_string(), b"https".to_vec()),
            (":path".to_string(), b"/a/b?c=%20d&e".to_vec()),
            (":authority".to_string(), b"shard.test:8443".to_vec()),
            (
                "user-agent".to_string(),
                b"Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) \
                  Chrome/120.0 Safari/537.36"
                    .to_vec(),
            ),
            ("cookie".to_string(), b"a=1".to_vec()),
            ("cookie".to_string(), "b=\u{e9}".as_bytes().to_vec()),
            ("x-bin".to_string(), b"\x00\x7f\xc3\xbf".to_vec()),
        ];
        let huff = hex(BROWSER_HUFFMAN);
        assert_eq!(decode_all(&mut Decoder::new(4096), &huff).unwrap(), want);
        let plain = hex(
            "8387440d2f612f623f633d253230642665410f73686172642e746573743a383434337a614d6f7a69\
             6c6c612f352e3020285831313b204c696e7578207838365f363429204170706c655765624b69742f\
             3533372e333620284b48544d4c2c206c696b65204765636b6f29204368726f6d652f3132302e3020\
             5361666172692f3533372e33366003613d316004623dc3a94005782d62696e04007fc3bf",
        );
        assert_eq!(decode_all(&mut Decoder::new(4096), &plain).unwrap(), want);
    }

    #[test]
    fn huffman_round_trips_every_byte() {
        let all: Vec<u8> = (0..=255u8).chain((0..=255u8).rev()).collect();
        let mut coded = Vec::new();
        huffman_encode(&all, &mut coded);
        assert_eq!(coded.len(), huffman_len(&all));
        let mut back = Vec::new();
        huffman_decode(&coded, &mut back).unwrap();
        assert_eq!(back, all);
        // RFC 7541, C.4.1's value.
        let mut c = Vec::new();
        huffman_encode(b"www.example.com", &mut c);
        assert_eq!(c, hex("f1e3c2e5f23a6ba0ab90f4ff"));
    }

    #[test]
    fn refuses_bad_huffman_padding_and_eos() {
        let mut out = Vec::new();
        // 'a' (00011) then 3 zero bits: padding must be ones.
        assert_eq!(huffman_decode(&[0x18], &mut out), Err(Error::Huffman));
        // A whole byte of ones after a full symbol: padding of 11 bits, which nginx takes.
        let mut c = Vec::new();
        huffman_encode(b"0", &mut c); // 00000 + 111
        c.push(0xff);
        let mut out = Vec::new();
        assert_eq!(huffman_decode(&c, &mut out), Ok(()));
        assert_eq!(out, b"0");
        // EOS itself (30 ones) inside the string.
        assert_eq!(
            huffman_decode(&[0xff, 0xff, 0xff, 0xff], &mut Vec::new()),
            Err(Error::Huffman)
        );
    }

    #[test]
    fn bounds_integers_indices_table_updates_and_the_list() {
        let mut d = Decoder::new(4096);
        assert_eq!(d.decode(&[0x80], 1 << 20, |_, _| {}), Err(Error::Index));
        assert_eq!(d.decode(&[0xbe], 1 << 20, |_, _| {}), Err(Error::Index));
        // An integer that never ends within 2^28.
        let long = [0xff, 0xff, 0xff, 0xff, 0xff, 0xff];
        assert_eq!(d.decode(&long, 1 << 20, |_, _| {}), Err(Error::Integer));
        // A string longer than the block.
        assert_eq!(
            d.decode(&[0x40, 0x05, b'a'], 1 << 20, |_, _| {}),
            Err(Error::Truncated)
        );
        // A size update over our setting, and one after a field.
        assert_eq!(
            d.decode(&[0x3f, 0xe2, 0x1f], 1 << 20, |_, _| {}),
            Err(Error::TableSize)
        );
        assert_eq!(
            d.decode(&[0x82, 0x20], 1 << 20, |_, _| {}),
            Err(Error::TableSize)
        );
        // An HPACK bomb: one indexed field repeated decodes to far more than the block.
        let mut bomb = vec![0x40, 0x01, b'x', 0x7f, 0x00];
        bomb.extend(std::iter::repeat_n(b'v', 127));
        bomb.extend(std::iter::repeat_n(0xbe, 10_000));
        let mut calls = 0;
        let r = Decoder::new(4096).decode(&bomb, 16 * 1024, |_, _| calls += 1);
        assert_eq!(r, Err(Error::ListTooLarge));
        assert!(calls * 128 <= 16 * 1024, "{calls}");
        // A string over the field limit, as sent.
        let mut d = Decoder::new(4096);
        d.set_max_field(4);
        assert_eq!(
            d.decode(
                &[0x00, 0x01, b'a', 0x05, b'v', b'v', b'v', b'v', b'v'],
                1 << 20,
                |_, _| {}
            ),
            Err(Error::FieldTooLarge)
        );
    }

    #[test]
    fn the_table_evicts_oldest_first_and_a_huge_entry_empties_it() {
        let mut t = Table {
            max: 100,
            ..Table::default()
        };
        t.insert(b"a", b"1"); // 34
        t.insert(b"b", b"2"); // 68
        t.insert(b"c", b"3"); // 102 > 100: "a" goes
        assert_eq!(t.entries.len(), 2);
        assert_eq!(&t.entries[1].0[..], b"b");
        t.insert(&[b'x'; 80], b"");
        assert!(t.entries.is_empty() && t.size == 0);
    }

    #[test]
    fn static_name_finds_each_names_first_entry() {
        for (i, (n, _)) in STATIC.iter().enumerate() {
            let first = STATIC.iter().position(|(m, _)| m == n).unwrap() + 1;
            assert_eq!(static_name(n.as_bytes()), first, "{n} ({i})");
        }
        assert_eq!(static_name(b"x-nothing"), 0);
    }

    #[test]
    fn the_encoders_blocks_decode_back() {
        let e = Encoder;
        let mut block = Vec::new();
        e.status(200, &mut block);
        e.status(503, &mut block);
        e.field(b"server", b"shard", &mut block);
        e.field(b"content-length", b"2", &mut block);
        e.field(b"x-custom", b"Value With Spaces", &mut block);
        e.field(b"accept-encoding", b"gzip, deflate", &mut block);
        let got = decode_all(&mut Decoder::new(4096), &block).unwrap();
        assert_eq!(
            got,
            pairs(&[
                (":status", "200"),
                (":status", "503"),
                ("server", "shard"),
                ("content-length", "2"),
                ("x-custom", "Value With Spaces"),
                ("accept-encoding", "gzip, deflate"),
            ])
        );
        // No dynamic table: the same fields cost the same bytes again.
        let mut again = Vec::new();
        e.field(b"server", b"shard", &mut again);
        assert!(block.windows(again.len()).any(|w| w == again));
    }
}
