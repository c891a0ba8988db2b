//! `ssl_preread`: what a TLS ClientHello says before any TLS is done (nginx's
//! `ngx_stream_ssl_preread_module`): the SNI name, the ALPN protocols and the highest
//! protocol version offered, for `$ssl_preread_server_name`, `$ssl_preread_alpn_protocols`
//! and `$ssl_preread_protocol`.
//!
//! This module only parses bytes the relay already read; reading them, the buffer's bound
//! (`preread_buffer_size`) and the timeout (`preread_timeout`) are the relay's.

/// What a ClientHello offered.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Hello {
    /// `TLSv1`, `TLSv1.1`, `TLSv1.2`, `TLSv1.3` (`supported_versions`, else the hello's
    /// own version); empty when unknown.
    pub protocol: String,
    pub server_name: String,
    /// The ALPN protocols, comma-separated as nginx writes them.
    pub alpn: String,
}

/// What the bytes read so far are.
#[derive(Debug, PartialEq, Eq)]
pub enum Preread {
    /// A whole ClientHello.
    Hello(Hello),
    /// The start of one: read more.
    Partial,
    /// Not a TLS ClientHello: the session goes on without the variables.
    NotTls,
}

/// Looks at the first bytes of a connection. A ClientHello may span several handshake
/// records; their payloads are joined.
pub fn parse(buf: &[u8]) -> Preread {
    // An SSL version 2 ClientHello (a 2-byte record header with the high bit, message 1):
    // only its version is read, as nginx does.
    if buf.len() >= 5 && buf[0] & 0x80 != 0 && buf[2] == 1 && (buf[3] == 0 || buf[3] == 3) {
        let v = usize::from(u16::from_be_bytes([buf[3], buf[4]]));
        return Preread::Hello(Hello {
            protocol: version_name(v).to_string(),
            ..Hello::default()
        });
    }
    let mut hs = Vec::new();
    let mut at = 0;
    loop {
        let Some(h) = buf.get(at..at + 5) else {
            return if buf.is_empty() || is_record_start(&buf[at..]) {
                Preread::Partial
            } else {
                Preread::NotTls
            };
        };
        if h[0] != 0x16 || h[1] != 3 {
            return Preread::NotTls;
        }
        let len = usize::from(u16::from_be_bytes([h[3], h[4]]));
        let Some(body) = buf.get(at + 5..at + 5 + len) else {
            return Preread::Partial;
        };
        hs.extend_from_slice(body);
        at += 5 + len;
        // Handshake header: type 1 (ClientHello), 3-byte length.
        if hs.len() >= 4 {
            if hs[0] != 1 {
                return Preread::NotTls;
            }
            let need =
                4 + (usize::from(hs[1]) << 16 | usize::from(hs[2]) << 8 | usize::from(hs[3]));
            if hs.len() >= need {
                return match hello(&hs[4..need]) {
                    Some(h) => Preread::Hello(h),
                    None => Preread::NotTls,
                };
            }
        }
    }
}

/// Whether `b` (shorter than a record header) may begin a handshake record.
fn is_record_start(b: &[u8]) -> bool {
    match b.first() {
        None => true,
        // Perhaps a version 2 hello, whose header needs 5 bytes to tell.
        Some(&t) if t & 0x80 != 0 => true,
        Some(&t) => t == 0x16 && b.get(1).is_none_or(|&v| v == 3),
    }
}

/// A cursor over a ClientHello's fields; every read is bounds-checked.
struct Rd<'a>(&'a [u8]);

impl<'a> Rd<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (a, b) = (self.0.get(..n)?, self.0.get(n..)?);
        self.0 = b;
        Some(a)
    }
    fn u8(&mut self) -> Option<usize> {
        self.take(1).map(|b| usize::from(b[0]))
    }
    fn u16(&mut self) -> Option<usize> {
        self.take(2)
            .map(|b| usize::from(u16::from_be_bytes([b[0], b[1]])))
    }
    fn vec8(&mut self) -> Option<&'a [u8]> {
        let n = self.u8()?;
        self.take(n)
    }
    fn vec16(&mut self) -> Option<&'a [u8]> {
        let n = self.u16()?;
        self.take(n)
    }
}

fn version_name(v: usize) -> &'static str {
    match v {
        0x0002 => "SSLv2",
        0x0300 => "SSLv3",
        0x0301 => "TLSv1",
        0x0302 => "TLSv1.1",
        0x0303 => "TLSv1.2",
        0x0304 => "TLSv1.3",
        _ => "",
    }
}

/// The ClientHello body (after its handshake header).
fn hello(body: &[u8]) -> Option<Hello> {
    let mut r = Rd(body);
    let legacy = r.u16()?;
    r.take(32)?; // random
    r.vec8()?; // session id
    r.vec16()?; // cipher suites
    r.vec8()?; // compression methods
    let mut out = Hello {
        protocol: version_name(legacy).to_string(),
        ..Hello::default()
    };
    if r.0.is_empty() {
        return Some(out);
    }
    // What was found stands when the extensions are cut short (nginx's parser reads them
    // as they come and keeps what it saw).
    let list = match r.vec16() {
        Some(l) => l,
        // The list's length read, its bytes short: what there is.
        None => r.0,
    };
    let mut ext = Rd(list);
    while !ext.0.is_empty() {
        let Some(kind) = ext.u16() else {
            return Some(out);
        };
        if kind == 43 {
            // supported_versions: nginx names the hello TLSv1.3 whatever it lists (only
            // TLS 1.3 clients send it).
            out.protocol = "TLSv1.3".to_string();
        }
        let Some(data) = ext.vec16() else {
            return Some(out);
        };
        let mut data = Rd(data);
        match kind {
            0 => {
                // server_name: a list; nginx takes the host_name entry.
                let mut list = Rd(data.vec16()?);
                while !list.0.is_empty() {
                    let t = list.u8()?;
                    let name = list.vec16()?;
                    if t == 0 {
                        out.server_name = String::from_utf8_lossy(name).into_owned();
                        break;
                    }
                }
            }
            16 => {
                let mut list = Rd(data.vec16()?);
                let mut names = Vec::new();
                while !list.0.is_empty() {
                    names.push(String::from_utf8_lossy(list.vec8()?).into_owned());
                }
                out.alpn = names.join(",");
            }
            _ => {}
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A ClientHello as a client library writes it: rustls, offering TLS 1.3 and 1.2.
    fn rustls_hello(sni: &str, alpn: &[&[u8]]) -> Vec<u8> {
        use std::sync::Arc;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut cfg = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(rustls::RootCertStore::empty())
            .with_no_client_auth();
        cfg.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        let name = rustls::pki_types::ServerName::try_from(sni.to_string()).unwrap();
        let mut c = rustls::ClientConnection::new(Arc::new(cfg), name).unwrap();
        let mut out = Vec::new();
        c.write_tls(&mut out).unwrap();
        out
    }

    #[test]
    fn version_2_hellos_and_supported_versions_name_the_protocol_as_nginx() {
        // SSLv2-style record header, message 1, version 0.2 / 3.1.
        let v2 = |a: u8, b: u8| vec![0x80, 0x1c, 0x01, a, b, 0x00, 0x03];
        let proto = |buf: &[u8]| match parse(buf) {
            Preread::Hello(h) => h.protocol,
            other => panic!("{other:?}"),
        };
        assert_eq!(proto(&v2(0, 2)), "SSLv2");
        assert_eq!(proto(&v2(3, 1)), "TLSv1");
        // A TLS record whose hello says SSL 3.0.
        let mut h = vec![0x16, 3, 0, 0, 0x2a, 1, 0, 0, 0x26, 3, 0];
        h.extend_from_slice(&[0; 32]);
        h.extend_from_slice(&[0, 0, 0, 0]);
        assert_eq!(proto(&h), "SSLv3");
        // supported_versions (even a draft version, even cut short): TLSv1.3.
        let mut h = vec![0x16, 3, 1, 0, 0x33, 1, 0, 0, 0x2f, 3, 3];
        h.extend_from_slice(&[0; 32]);
        h.extend_from_slice(&[0, 0, 0, 0, 0, 7, 0, 0x2b, 0, 7, 2, 0x7f, 0x1c]);
        assert_eq!(proto(&h), "TLSv1.3");
    }

    #[test]
    fn a_real_client_hello() {
        let b = rustls_hello("a.example.com", &[b"h2", b"http/1.1"]);
        let want = Hello {
            protocol: "TLSv1.3".into(),
            server_name: "a.example.com".into(),
            alpn: "h2,http/1.1".into(),
        };
        assert_eq!(parse(&b), Preread::Hello(want.clone()));
        // Every shorter prefix is incomplete, never wrong.
        for n in 0..b.len() {
            assert_eq!(parse(&b[..n]), Preread::Partial, "{n}");
        }
        // Split over two records, as some clients do.
        let body = &b[5..];
        let (x, y) = body.split_at(40);
        let mut two = vec![0x16, 3, 1, 0, x.len() as u8];
        two.extend_from_slice(x);
        two.extend_from_slice(&[0x16, 3, 1, (y.len() >> 8) as u8, y.len() as u8]);
        two.extend_from_slice(y);
        assert_eq!(parse(&two), Preread::Hello(want));
    }

    #[test]
    fn not_tls() {
        assert_eq!(parse(b"GET / HTTP/1.1\r\n"), Preread::NotTls);
        assert_eq!(parse(b"SSH-2.0-OpenSSH"), Preread::NotTls);
        assert_eq!(
            parse(b"\x16\x03\x01\x00\x04\x02\x00\x00\x00"),
            Preread::NotTls
        );
        // A hello whose fields overrun it.
        assert_eq!(
            parse(b"\x16\x03\x01\x00\x08\x01\x00\x00\x04\x03\x03\xff\xff"),
            Preread::NotTls
        );
        assert_eq!(parse(b"\x16"), Preread::Partial);
        assert_eq!(parse(b"\x17"), Preread::NotTls);
    }
}
