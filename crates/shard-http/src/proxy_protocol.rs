//! The PROXY protocol (HAProxy's specification, versions 1 and 2): the header an L4 balancer
//! puts before a connection's first byte to say who the client was.
//!
//! This module owns the bytes: [`parse`] reads a v1 or v2 header from the start of what a
//! connection sent (without looking past it: with TLS, what follows is the handshake), and
//! [`write_v1`] / [`write_v2`] write one for an upstream (stream's `proxy_protocol on`). Reading
//! the socket, timeouts and what the addresses mean (`$proxy_protocol_addr`, `real_ip_header
//! proxy_protocol`) are the worker's and `vars.rs`'s.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// The v2 signature.
const V2_SIG: &[u8; 12] = b"\r\n\r\n\0\r\nQUIT\n";
/// The longest v1 header, CRLF included (the specification's 107 bytes).
pub const V1_MAX: usize = 107;
/// The longest v2 header shard reads (nginx's limit for the TLVs that follow the addresses).
pub const V2_MAX: usize = 16 + 4096;
/// The most bytes to look at before a header is known complete.
pub const MAX_HEADER: usize = V2_MAX;

/// What a header said. `src`/`dst` are `None` for `UNKNOWN` (v1), `LOCAL` and `UNSPEC` (v2):
/// the connection's own addresses stand.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Header {
    pub src: Option<SocketAddr>,
    pub dst: Option<SocketAddr>,
    /// v2 TLVs: type and value, in order (the SSL TLV's sub-TLVs follow it flattened, with
    /// their own types).
    pub tlvs: Vec<(u8, Vec<u8>)>,
}

#[derive(Debug, PartialEq, Eq)]
pub enum Parsed {
    /// More bytes are needed.
    Partial,
    /// A header of this many bytes.
    Complete(Header, usize),
    /// Not a PROXY protocol header: nginx's `broken header`.
    Invalid,
}

/// Parses a header at the start of `buf`.
pub fn parse(buf: &[u8]) -> Parsed {
    if buf.len() < V2_SIG.len() {
        let n = buf.len();
        if V2_SIG[..n] == *buf || b"PROXY "[..n.min(6)] == buf[..n.min(6)] {
            return Parsed::Partial;
        }
        return Parsed::Invalid;
    }
    if buf.starts_with(V2_SIG) {
        return parse_v2(buf);
    }
    if buf.starts_with(b"PROXY ") {
        return parse_v1(buf);
    }
    Parsed::Invalid
}

fn parse_v1(buf: &[u8]) -> Parsed {
    let Some(end) = buf.iter().take(V1_MAX).position(|&b| b == b'\n') else {
        return if buf.len() >= V1_MAX {
            Parsed::Invalid
        } else {
            Parsed::Partial
        };
    };
    if end == 0 || buf[end - 1] != b'\r' {
        return Parsed::Invalid;
    }
    let Ok(line) = std::str::from_utf8(&buf[6..end - 1]) else {
        return Parsed::Invalid;
    };
    let mut f = line.split(' ');
    let proto = f.next().unwrap_or("");
    if proto == "UNKNOWN" {
        return Parsed::Complete(Header::default(), end + 1);
    }
    let (Some(sa), Some(da), Some(sp), Some(dp), None) =
        (f.next(), f.next(), f.next(), f.next(), f.next())
    else {
        return Parsed::Invalid;
    };
    // Either family whatever the protocol says, as nginx's `ngx_parse_addr` takes it
    // (`PROXY TCP6 ::ffff:10.0.0.1 127.0.0.1 ...` is what some balancers send).
    let ip = |s: &str| -> Option<IpAddr> {
        match proto {
            "TCP4" | "TCP6" => s
                .parse::<Ipv4Addr>()
                .map(IpAddr::V4)
                .or_else(|_| s.parse::<Ipv6Addr>().map(IpAddr::V6))
                .ok(),
            _ => None,
        }
    };
    // Ports: decimal without a leading zero, as the specification says.
    let port = |s: &str| -> Option<u16> {
        if s.is_empty()
            || (s.len() > 1 && s.starts_with('0'))
            || !s.bytes().all(|c| c.is_ascii_digit())
        {
            return None;
        }
        s.parse().ok()
    };
    match (ip(sa), ip(da), port(sp), port(dp)) {
        (Some(s), Some(d), Some(sp), Some(dp)) => Parsed::Complete(
            Header {
                src: Some(SocketAddr::new(s, sp)),
                dst: Some(SocketAddr::new(d, dp)),
                tlvs: Vec::new(),
            },
            end + 1,
        ),
        _ => Parsed::Invalid,
    }
}

fn parse_v2(buf: &[u8]) -> Parsed {
    if buf.len() < 16 {
        return Parsed::Partial;
    }
    let ver_cmd = buf[12];
    if ver_cmd >> 4 != 2 {
        return Parsed::Invalid;
    }
    let len = usize::from(u16::from_be_bytes([buf[14], buf[15]]));
    let total = 16 + len;
    if total > V2_MAX {
        return Parsed::Invalid;
    }
    if buf.len() < total {
        return Parsed::Partial;
    }
    let body = &buf[16..total];
    let mut h = Header::default();
    let (addrs_len, local) = match ver_cmd & 0x0f {
        // LOCAL: a health check from the balancer itself; whatever follows is ignored.
        0 => return Parsed::Complete(h, total),
        1 => match buf[13] {
            0x11 => (12, false),
            0x21 => (36, false),
            0x00 => (0, true),
            // AF_UNIX and UDP: the addresses are not used.
            0x31 | 0x32 => (216, true),
            0x12 => (12, true),
            0x22 => (36, true),
            // An address family or transport nginx does not know: the header is taken, with
            // no addresses (`$proxy_protocol_addr` empty) and its TLVs not read, as nginx's
            // parser returns there.
            _ => return Parsed::Complete(h, total),
        },
        _ => return Parsed::Invalid,
    };
    if body.len() < addrs_len {
        return Parsed::Invalid;
    }
    if !local {
        let a = &body[..addrs_len];
        let (src, dst) = if addrs_len == 12 {
            let s = Ipv4Addr::new(a[0], a[1], a[2], a[3]);
            let d = Ipv4Addr::new(a[4], a[5], a[6], a[7]);
            (
                SocketAddr::new(IpAddr::V4(s), u16::from_be_bytes([a[8], a[9]])),
                SocketAddr::new(IpAddr::V4(d), u16::from_be_bytes([a[10], a[11]])),
            )
        } else {
            let mut s = [0u8; 16];
            let mut d = [0u8; 16];
            s.copy_from_slice(&a[..16]);
            d.copy_from_slice(&a[16..32]);
            (
                SocketAddr::new(
                    IpAddr::V6(Ipv6Addr::from(s)),
                    u16::from_be_bytes([a[32], a[33]]),
                ),
                SocketAddr::new(
                    IpAddr::V6(Ipv6Addr::from(d)),
                    u16::from_be_bytes([a[34], a[35]]),
                ),
            )
        };
        h.src = Some(src);
        h.dst = Some(dst);
    }
    let addrs_len = addrs_len.min(body.len());
    if !read_tlvs(&body[addrs_len..], &mut h.tlvs) {
        return Parsed::Invalid;
    }
    Parsed::Complete(h, total)
}

/// TLVs in order; the SSL TLV (0x20) is kept whole and its sub-TLVs (after its 5 bytes of
/// client flags and verify result) follow it.
fn read_tlvs(mut b: &[u8], out: &mut Vec<(u8, Vec<u8>)>) -> bool {
    while !b.is_empty() {
        if b.len() < 3 {
            return false;
        }
        let t = b[0];
        let n = usize::from(u16::from_be_bytes([b[1], b[2]]));
        if b.len() < 3 + n {
            return false;
        }
        let v = &b[3..3 + n];
        out.push((t, v.to_vec()));
        if t == TLV_SSL && v.len() >= 5 && !read_tlvs(&v[5..], out) {
            return false;
        }
        b = &b[3 + n..];
    }
    true
}

const TLV_SSL: u8 = 0x20;

/// The TLV type of `$proxy_protocol_tlv_NAME`: nginx's names, or `0xNN`.
pub fn tlv_type(name: &str) -> Option<u8> {
    Some(match name {
        "alpn" => 0x01,
        "authority" => 0x02,
        "unique_id" => 0x05,
        "ssl" => 0x20,
        "ssl_version" => 0x21,
        "ssl_cn" => 0x22,
        "ssl_cipher" => 0x23,
        "ssl_sig_alg" => 0x24,
        "ssl_key_alg" => 0x25,
        "netns" => 0x30,
        _ => {
            // `0xNN`, or `ssl_0xNN` for a sub-TLV of the SSL TLV (kept in the same list).
            let name = name.strip_prefix("ssl_").unwrap_or(name);
            let hex = name
                .strip_prefix("0x")
                .or_else(|| name.strip_prefix("0X"))?;
            return u8::from_str_radix(hex, 16).ok();
        }
    })
}

/// Appends `$proxy_protocol_tlv_NAME`'s value (`ssl_verify`: the SSL TLV's verify result as
/// a decimal number, as nginx).
pub fn push_tlv(out: &mut Vec<u8>, h: &Header, name: &str) {
    if name == "ssl_verify" {
        if let Some((_, v)) = h.tlvs.iter().find(|(t, _)| *t == TLV_SSL) {
            if v.len() >= 5 {
                let n = u32::from_be_bytes([v[1], v[2], v[3], v[4]]);
                out.extend_from_slice(n.to_string().as_bytes());
            }
        }
        return;
    }
    if let Some(t) = tlv_type(name) {
        if let Some((_, v)) = h.tlvs.iter().find(|(k, _)| *k == t) {
            out.extend_from_slice(v);
        }
    }
}

/// Appends a v1 header for a connection from `src` to `dst` (`UNKNOWN` when the families
/// differ).
pub fn write_v1(out: &mut Vec<u8>, src: SocketAddr, dst: SocketAddr) {
    let line = match (src, dst) {
        (SocketAddr::V4(s), SocketAddr::V4(d)) => {
            format!(
                "PROXY TCP4 {} {} {} {}\r\n",
                s.ip(),
                d.ip(),
                s.port(),
                d.port()
            )
        }
        (SocketAddr::V6(s), SocketAddr::V6(d)) => {
            format!(
                "PROXY TCP6 {} {} {} {}\r\n",
                s.ip(),
                d.ip(),
                s.port(),
                d.port()
            )
        }
        _ => "PROXY UNKNOWN\r\n".to_string(),
    };
    out.extend_from_slice(line.as_bytes());
}

/// Appends a v2 header (command PROXY, TCP) for a connection from `src` to `dst`.
pub fn write_v2(out: &mut Vec<u8>, src: SocketAddr, dst: SocketAddr) {
    out.extend_from_slice(V2_SIG);
    out.push(0x21);
    match (src, dst) {
        (SocketAddr::V4(s), SocketAddr::V4(d)) => {
            out.push(0x11);
            out.extend_from_slice(&12u16.to_be_bytes());
            out.extend_from_slice(&s.ip().octets());
            out.extend_from_slice(&d.ip().octets());
            out.extend_from_slice(&s.port().to_be_bytes());
            out.extend_from_slice(&d.port().to_be_bytes());
        }
        (SocketAddr::V6(s), SocketAddr::V6(d)) => {
            out.push(0x21);
            out.extend_from_slice(&36u16.to_be_bytes());
            out.extend_from_slice(&s.ip().octets());
            out.extend_from_slice(&d.ip().octets());
            out.extend_from_slice(&s.port().to_be_bytes());
            out.extend_from_slice(&d.port().to_be_bytes());
        }
        _ => {
            out.push(0x00);
            out.extend_from_slice(&0u16.to_be_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn v1_headers() {
        let buf = b"PROXY TCP4 192.0.2.1 198.51.100.2 56324 443\r\nGET / HTTP/1.1\r\n";
        let Parsed::Complete(h, n) = parse(buf) else {
            panic!()
        };
        assert_eq!(n, 45);
        assert_eq!(h.src, Some(addr("192.0.2.1:56324")));
        assert_eq!(h.dst, Some(addr("198.51.100.2:443")));
        // The family of the addresses is theirs, not the protocol's (nginx).
        assert!(matches!(
            parse(b"PROXY TCP6 ::ffff:10.0.0.1 127.0.0.1 1 2\r\n"),
            Parsed::Complete(..)
        ));
        let Parsed::Complete(h, _) = parse(b"PROXY TCP6 2001:db8::1 ::1 1 2\r\n") else {
            panic!()
        };
        assert_eq!(h.src, Some(addr("[2001:db8::1]:1")));
        assert!(matches!(
            parse(b"PROXY UNKNOWN\r\n"),
            Parsed::Complete(Header { src: None, .. }, 15)
        ));
        assert!(matches!(
            parse(b"PROXY UNKNOWN ffff::1 x y z\r\n"),
            Parsed::Complete(_, _)
        ));
        for p in [1, 5, 20, 43] {
            assert_eq!(parse(&buf[..p]), Parsed::Partial, "{p}");
        }
        for bad in [
            &b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2\n"[..],
            b"PROXY TCP4 1.2.3.4 5.6.7.8 01 2\r\n",
            b"PROXY TCP4 1.2.3.4 5.6.7.8 70000 2\r\n",
            b"PROXY TCP4 1.2.3 5.6.7.8 1 2\r\n",
            b"PROXY TCP5 1.2.3.4 5.6.7.8 1 2\r\n",
            b"PROXY TCP4 1.2.3.4 5.6.7.8 1\r\n",
            b"GET / HTTP/1.1\r\n",
            b"proxy TCP4",
        ] {
            assert_eq!(
                parse(bad),
                Parsed::Invalid,
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        let long = [b"PROXY TCP4 ".as_slice(), &[b'1'; 120]].concat();
        assert_eq!(parse(&long), Parsed::Invalid, "longer than 107 bytes");
    }

    #[test]
    fn v2_headers_round_trip_with_tlvs() {
        let mut b = Vec::new();
        write_v2(&mut b, addr("10.0.0.1:1234"), addr("10.0.0.2:80"));
        // Add TLVs: ALPN "h2" and an SSL TLV with a CN sub-TLV.
        let mut tlvs = vec![0x01, 0, 2, b'h', b'2'];
        let sub = [0x22, 0, 3, b'b', b'o', b'b'];
        let mut ssl = vec![0x01, 0, 0, 0, 0];
        ssl.extend_from_slice(&sub);
        tlvs.push(0x20);
        tlvs.extend_from_slice(&(ssl.len() as u16).to_be_bytes());
        tlvs.extend_from_slice(&ssl);
        let len = 12 + tlvs.len() as u16;
        b[14..16].copy_from_slice(&len.to_be_bytes());
        b.extend_from_slice(&tlvs);
        b.extend_from_slice(b"\x16\x03\x01"); // the TLS handshake that follows
        let Parsed::Complete(h, n) = parse(&b) else {
            panic!("{:?}", parse(&b))
        };
        assert_eq!(n, b.len() - 3);
        assert_eq!(h.src, Some(addr("10.0.0.1:1234")));
        assert_eq!(h.dst, Some(addr("10.0.0.2:80")));
        let tlv = |name: &str| {
            let mut o = Vec::new();
            push_tlv(&mut o, &h, name);
            String::from_utf8(o).unwrap()
        };
        assert_eq!(tlv("alpn"), "h2");
        assert_eq!(tlv("0x01"), "h2");
        assert_eq!(tlv("ssl_cn"), "bob");
        assert_eq!(tlv("ssl_verify"), "0");
        assert_eq!(tlv_type("ssl_0x21"), Some(0x21));
        assert_eq!(tlv_type("ssl_0x22"), tlv_type("ssl_cn"));
        assert_eq!(tlv("authority"), "");
        for p in [3, 12, 15, 20] {
            assert_eq!(parse(&b[..p]), Parsed::Partial, "{p}");
        }
        let mut v6 = Vec::new();
        write_v2(&mut v6, addr("[::1]:1"), addr("[::2]:2"));
        assert!(matches!(
            parse(&v6),
            Parsed::Complete(Header { src: Some(_), .. }, 52)
        ));
        // LOCAL: no addresses.
        let mut local = v6.clone();
        local[12] = 0x20;
        assert!(matches!(
            parse(&local),
            Parsed::Complete(Header { src: None, .. }, 52)
        ));
        // A wrong version, a truncated TLV, an oversized length.
        let mut bad = v6.clone();
        bad[12] = 0x31;
        assert_eq!(parse(&bad), Parsed::Invalid);
        let mut bad = b[..b.len() - 3].to_vec();
        let l = u16::from_be_bytes([bad[14], bad[15]]) - 1;
        bad[14..16].copy_from_slice(&l.to_be_bytes());
        bad.pop();
        assert_eq!(parse(&bad), Parsed::Invalid);
        let mut big = v6.clone();
        big[14..16].copy_from_slice(&0xffffu16.to_be_bytes());
        assert_eq!(parse(&big), Parsed::Invalid);
    }

    /// An address family nginx does not know (AF_UNSPEC with STREAM, or an unassigned
    /// one with a body): taken whole, no addresses, as nginx's parser.
    #[test]
    fn v2_unknown_families_are_taken_without_addresses() {
        let sig = b"\r\n\r\n\0\r\nQUIT\n";
        let mut unspec = sig.to_vec();
        unspec.extend_from_slice(&[0x21, 0x01, 0, 0]);
        let mut other = sig.to_vec();
        other.extend_from_slice(&[0x21, 0x41, 0, 4, 1, 2, 3, 4]);
        for (b, len) in [(unspec, 16), (other, 20)] {
            match parse(&b) {
                Parsed::Complete(h, n) => {
                    assert_eq!(n, len);
                    assert!(h.src.is_none() && h.dst.is_none());
                }
                _ => panic!("not taken: {b:?}"),
            }
        }
    }

    #[test]
    fn v1_writes_what_it_reads() {
        let mut b = Vec::new();
        write_v1(&mut b, addr("1.2.3.4:5"), addr("6.7.8.9:10"));
        assert_eq!(b, b"PROXY TCP4 1.2.3.4 6.7.8.9 5 10\r\n");
        assert!(matches!(parse(&b), Parsed::Complete(_, 33)));
    }
}
