//! A minimal WebSocket (RFC 6455) codec and blocking peers, for the `reload` experiment and
//! the proxy tests (which include this file with `#[path]`): the handshake (`Sec-WebSocket-
//! Accept` needs SHA-1 and base64, both here), frames of any length, masked from the client,
//! and an echo server. Written by hand rather than taken from `tungstenite`: a proxy only has
//! to carry the bytes, so a hundred lines that the tests can see through are enough, and the
//! workspace gains no dependency for it.
//!
//! Not a general WebSocket library: no extensions, no fragmentation on send, a text or binary
//! message is one frame, and control frames other than close and ping are ignored.

#![allow(dead_code)]

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

pub const OP_TEXT: u8 = 1;
pub const OP_BINARY: u8 = 2;
pub const OP_CLOSE: u8 = 8;
pub const OP_PING: u8 = 9;
pub const OP_PONG: u8 = 10;

/// The largest message the peers here accept.
pub const MESSAGE_MAX: usize = 16 << 20;

const GUID: &str = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

/// SHA-1 of `data` (FIPS 180-4), for the handshake only.
fn sha1(data: &[u8]) -> [u8; 20] {
    let mut h: [u32; 5] = [
        0x6745_2301,
        0xEFCD_AB89,
        0x98BA_DCFE,
        0x1032_5476,
        0xC3D2_E1F0,
    ];
    let mut msg = data.to_vec();
    msg.push(0x80);
    while msg.len() % 64 != 56 {
        msg.push(0);
    }
    msg.extend_from_slice(&((data.len() as u64) * 8).to_be_bytes());
    for block in msg.chunks(64) {
        let mut w = [0u32; 80];
        for (i, word) in block.chunks(4).enumerate() {
            w[i] = u32::from_be_bytes([word[0], word[1], word[2], word[3]]);
        }
        for i in 16..80 {
            w[i] = (w[i - 3] ^ w[i - 8] ^ w[i - 14] ^ w[i - 16]).rotate_left(1);
        }
        let [mut a, mut b, mut c, mut d, mut e] = h;
        for (i, &wi) in w.iter().enumerate() {
            let (f, k) = match i {
                0..=19 => ((b & c) | (!b & d), 0x5A82_7999),
                20..=39 => (b ^ c ^ d, 0x6ED9_EBA1),
                40..=59 => ((b & c) | (b & d) | (c & d), 0x8F1B_BCDC),
                _ => (b ^ c ^ d, 0xCA62_C1D6),
            };
            let t = a
                .rotate_left(5)
                .wrapping_add(f)
                .wrapping_add(e)
                .wrapping_add(k)
                .wrapping_add(wi);
            e = d;
            d = c;
            c = b.rotate_left(30);
            b = a;
            a = t;
        }
        for (x, y) in h.iter_mut().zip([a, b, c, d, e]) {
            *x = x.wrapping_add(y);
        }
    }
    let mut out = [0u8; 20];
    for (i, x) in h.iter().enumerate() {
        out[i * 4..i * 4 + 4].copy_from_slice(&x.to_be_bytes());
    }
    out
}

fn base64(data: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut s = String::new();
    for c in data.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for i in 0..4 {
            if i <= c.len() {
                s.push(T[(n >> (18 - 6 * i)) as usize & 63] as char);
            } else {
                s.push('=');
            }
        }
    }
    s
}

/// `Sec-WebSocket-Accept` for a client's `Sec-WebSocket-Key`.
pub fn accept_key(key: &str) -> String {
    base64(&sha1(format!("{}{GUID}", key.trim()).as_bytes()))
}

/// One frame: `fin`, the opcode and the unmasked payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub fin: bool,
    pub opcode: u8,
    pub payload: Vec<u8>,
}

/// Appends one final frame; `mask` is given by a client (RFC 6455 5.3), never by a server.
pub fn encode(out: &mut Vec<u8>, opcode: u8, payload: &[u8], mask: Option<[u8; 4]>) {
    out.push(0x80 | opcode);
    let m = if mask.is_some() { 0x80 } else { 0 };
    match payload.len() {
        n if n < 126 => out.push(m | n as u8),
        n if n <= 0xffff => {
            out.push(m | 126);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            out.push(m | 127);
            out.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    match mask {
        Some(k) => {
            out.extend_from_slice(&k);
            out.extend(payload.iter().enumerate().map(|(i, b)| b ^ k[i % 4]));
        }
        None => out.extend_from_slice(payload),
    }
}

/// The first frame of `buf` and its length, `Ok(None)` while incomplete.
pub fn decode(buf: &[u8]) -> io::Result<Option<(Frame, usize)>> {
    if buf.len() < 2 {
        return Ok(None);
    }
    let masked = buf[1] & 0x80 != 0;
    let (len, mut at) = match buf[1] & 0x7f {
        126 if buf.len() >= 4 => (u64::from(u16::from_be_bytes([buf[2], buf[3]])), 4),
        127 if buf.len() >= 10 => (u64::from_be_bytes(buf[2..10].try_into().unwrap()), 10),
        126 | 127 => return Ok(None),
        n => (u64::from(n), 2),
    };
    if len > MESSAGE_MAX as u64 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "frame too large",
        ));
    }
    let mask = if masked {
        if buf.len() < at + 4 {
            return Ok(None);
        }
        at += 4;
        Some([buf[at - 4], buf[at - 3], buf[at - 2], buf[at - 1]])
    } else {
        None
    };
    let end = at + len as usize;
    if buf.len() < end {
        return Ok(None);
    }
    let mut payload = buf[at..end].to_vec();
    if let Some(k) = mask {
        for (i, b) in payload.iter_mut().enumerate() {
            *b ^= k[i % 4];
        }
    }
    let frame = Frame {
        fin: buf[0] & 0x80 != 0,
        opcode: buf[0] & 0x0f,
        payload,
    };
    Ok(Some((frame, end)))
}

/// A blocking connection that speaks frames: `buf` holds bytes read past the last frame.
pub struct Conn {
    pub stream: TcpStream,
    pub buf: Vec<u8>,
    /// This side is a client: its frames are masked.
    client: bool,
}

impl Conn {
    pub fn send(&mut self, opcode: u8, payload: &[u8]) -> io::Result<()> {
        let mut out = Vec::with_capacity(payload.len() + 14);
        let mask = self.client.then(|| {
            let n = payload.len() as u32 ^ 0x5a17_c3e9;
            n.to_be_bytes()
        });
        encode(&mut out, opcode, payload, mask);
        self.stream.write_all(&out)
    }

    /// The next frame; `UnexpectedEof` when the peer closed the connection first.
    pub fn recv(&mut self) -> io::Result<Frame> {
        loop {
            if let Some((f, n)) = decode(&self.buf)? {
                self.buf.drain(..n);
                return Ok(f);
            }
            let mut chunk = [0u8; 16 * 1024];
            let n = self.stream.read(&mut chunk)?;
            if n == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    /// Sends a close frame and waits for the peer's close (or its end of stream).
    pub fn close(mut self) -> io::Result<()> {
        self.send(OP_CLOSE, &1000u16.to_be_bytes())?;
        loop {
            match self.recv() {
                Ok(f) if f.opcode == OP_CLOSE => return Ok(()),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
                Err(e) => return Err(e),
            }
        }
    }
}

/// The handshake's answer: the status and the head's header lines.
pub struct Handshake {
    pub status: u16,
    pub headers: Vec<(String, String)>,
}

impl Handshake {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Reads a head (up to `\r\n\r\n`); bytes past it are left in `buf`.
fn read_head(stream: &mut TcpStream, buf: &mut Vec<u8>) -> io::Result<String> {
    loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..i]).into_owned();
            buf.drain(..i + 4);
            return Ok(head);
        }
        if buf.len() > 64 * 1024 {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "head too large"));
        }
        let mut chunk = [0u8; 4096];
        let n = stream.read(&mut chunk)?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

fn parse_headers(head: &str) -> Vec<(String, String)> {
    head.split("\r\n")
        .skip(1)
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect()
}

/// Opens a WebSocket to `addr` (`path`, `Host: host`, `extra` header lines each ending in
/// `\r\n`). A `101` with the right `Sec-WebSocket-Accept` gives the connection; any other
/// answer gives the handshake only, for the caller to inspect.
pub fn connect(
    addr: SocketAddr,
    path: &str,
    extra: &str,
    timeout: Duration,
) -> io::Result<(Handshake, Option<Conn>)> {
    let mut stream = TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    stream.set_nodelay(true)?;
    let key = "dGhlIHNhbXBsZSBub25jZQ==";
    let req = format!(
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n{extra}\r\n"
    );
    stream.write_all(req.as_bytes())?;
    let mut buf = Vec::new();
    let head = read_head(&mut stream, &mut buf)?;
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let hs = Handshake {
        status,
        headers: parse_headers(&head),
    };
    if status != 101 {
        return Ok((hs, None));
    }
    if hs.header("sec-websocket-accept") != Some(accept_key(key).as_str()) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "bad Sec-WebSocket-Accept",
        ));
    }
    Ok((
        hs,
        Some(Conn {
            stream,
            buf,
            client: true,
        }),
    ))
}

/// Serves one accepted connection as a WebSocket echo: the handshake, then every data frame
/// back as it came, a ping answered, and a close answered with a close. Requests without
/// `Upgrade: websocket` get a `426`, or `101` anyway when `rogue` (a peer that switches
/// without being asked).
pub fn serve_echo(mut stream: TcpStream, rogue: bool) -> io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    stream.set_nodelay(true)?;
    let mut buf = Vec::new();
    let head = read_head(&mut stream, &mut buf)?;
    let headers = parse_headers(&head);
    let get = |n: &str| {
        headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(n))
            .map(|(_, v)| v.clone())
    };
    let asked = get("upgrade").is_some_and(|u| u.eq_ignore_ascii_case("websocket"));
    if !asked && !rogue {
        let body = "upgrade required";
        let resp = format!(
            "HTTP/1.1 426 Upgrade Required\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        return stream.write_all(resp.as_bytes());
    }
    let key = get("sec-websocket-key").unwrap_or_default();
    let resp = format!(
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Accept: {}\r\n\r\n",
        accept_key(&key)
    );
    stream.write_all(resp.as_bytes())?;
    let mut c = Conn {
        stream,
        buf,
        client: false,
    };
    loop {
        let f = match c.recv() {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e),
        };
        match f.opcode {
            OP_CLOSE => {
                c.send(OP_CLOSE, &f.payload)?;
                return Ok(());
            }
            OP_PING => c.send(OP_PONG, &f.payload)?,
            OP_TEXT | OP_BINARY => c.send(f.opcode, &f.payload)?,
            _ => {}
        }
    }
}

/// A WebSocket echo server on a free loopback port, one thread per connection, until the
/// process ends.
pub fn echo_server(rogue: bool) -> io::Result<SocketAddr> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    let addr = l.local_addr()?;
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            std::thread::spawn(move || {
                let _ = serve_echo(s, rogue);
            });
        }
    });
    Ok(addr)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc_6455_sample_key() {
        assert_eq!(
            accept_key("dGhlIHNhbXBsZSBub25jZQ=="),
            "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
        );
        assert_eq!(base64(b"ab"), "YWI=");
        assert_eq!(base64(b"a"), "YQ==");
    }

    #[test]
    fn frames_round_trip() {
        for len in [0usize, 5, 125, 126, 65535, 65536, 200_000] {
            let payload: Vec<u8> = (0..len).map(|i| i as u8).collect();
            for mask in [None, Some([1, 2, 3, 4])] {
                let mut out = Vec::new();
                encode(&mut out, OP_BINARY, &payload, mask);
                assert_eq!(decode(&out[..out.len() - 1]).unwrap(), None);
                let (f, n) = decode(&out).unwrap().unwrap();
                assert_eq!((f.opcode, f.fin, n), (OP_BINARY, true, out.len()));
                assert_eq!(f.payload, payload);
            }
        }
    }
}
