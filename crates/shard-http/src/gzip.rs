//! nginx's `ngx_http_gzip_module`: whether a response is compressed, and the compressor.
//!
//! [`decide`] applies nginx's header-filter rules (`gzip`, status 200 (a HEAD as its GET),
//! `gzip_min_length` against the uncompressed `Content-Length`, `gzip_types`, then the
//! request's `Accept-Encoding` and `gzip_http_version`). [`compress_with`] deflates a body the
//! caller reads in bounded chunks through a closure (for files: `pread`), so this module still
//! does no I/O of its own. Unlike nginx, which streams with chunked encoding, shard compresses
//! the whole body in memory and sends its `Content-Length`; bodies over
//! [`GZIP_MAX_FILE_BYTES`] are therefore sent uncompressed.

use std::io::Write;

use flate2::write::GzEncoder;
use flate2::Compression;
use shard_config::GzipConf;

use crate::request::Request;

/// Largest uncompressed body shard compresses (it holds the compressed copy in memory).
pub const GZIP_MAX_FILE_BYTES: u64 = 16 << 20;
/// Bytes of input read per call of the reader in [`compress_with`].
pub const GZIP_READ_CHUNK_BYTES: usize = 64 * 1024;
/// The `Content-Encoding` value.
pub const ENCODING: &str = "gzip";
/// The `Vary` value of `gzip_vary on`.
pub const VARY: &str = "Accept-Encoding";

/// What gzip does to one response.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Decision {
    /// Send `Vary: Accept-Encoding` (gzip applies to the response and `gzip_vary` is on),
    /// whether or not the body is compressed.
    pub vary: bool,
    /// Compress the body.
    pub compress: bool,
}

/// Decides for a response of `status` with `content_type` and an uncompressed body of `len`
/// bytes. Static files are asked with status 200 even when a `Range` was requested: a
/// compressed response ignores `Range`, as in nginx (whose gzip filter runs first).
pub fn decide(
    conf: &GzipConf,
    req: &Request,
    status: u16,
    content_type: Option<&str>,
    len: u64,
) -> Decision {
    decide_for(
        conf,
        req,
        status,
        content_type,
        len,
        &ResponseTraits::STATIC,
    )
}

/// [`decide`] for a response whose `gzip_proxied` traits are `traits`.
pub fn decide_for(
    conf: &GzipConf,
    req: &Request,
    status: u16,
    content_type: Option<&str>,
    len: u64,
    traits: &ResponseTraits,
) -> Decision {
    if !conf.enabled
        || status != 200
        || len < conf.min_length
        || !type_matches(conf, content_type.unwrap_or(""))
    {
        return Decision::default();
    }
    // `Vary` is decided before `gzip_proxied` looks at `Via`, as in nginx's filter.
    let compress = req.minor_version >= conf.http_version_minor
        && (!req.via || proxied_allows(conf, req, traits))
        && len <= GZIP_MAX_FILE_BYTES
        && req.accept_encoding.as_deref().is_some_and(accepts_gzip)
        && !req
            .user_agent
            .as_deref()
            .is_some_and(|ua| conf.disable.matches(ua));
    Decision {
        vary: conf.vary,
        compress,
    }
}

/// What `gzip_proxied` looks at in a response.
#[derive(Debug, Clone, Copy, Default)]
pub struct ResponseTraits {
    pub last_modified: bool,
    pub etag: bool,
    /// `Expires` in the past, or `Cache-Control: no-cache` / `no-store` / `private`.
    pub expired: bool,
    pub no_cache: bool,
    pub no_store: bool,
    pub private: bool,
}

impl ResponseTraits {
    /// A static file: it has `Last-Modified` and `ETag`.
    pub const STATIC: ResponseTraits = ResponseTraits {
        last_modified: true,
        etag: true,
        expired: false,
        no_cache: false,
        no_store: false,
        private: false,
    };
}

/// `gzip_proxied`: whether a request that came through a proxy (`Via`) may get a compressed
/// response with these traits.
pub fn proxied_allows(conf: &GzipConf, req: &Request, r: &ResponseTraits) -> bool {
    let p = &conf.proxied;
    p.any
        || (p.auth && req.authorization)
        || (p.no_last_modified && !r.last_modified)
        || (p.no_etag && !r.etag)
        || (p.expired && r.expired)
        || (p.no_cache && r.no_cache)
        || (p.no_store && r.no_store)
        || (p.private && r.private)
}

/// Whether `content_type` (parameters such as `; charset=` ignored) is in `gzip_types`.
pub fn type_matches(conf: &GzipConf, content_type: &str) -> bool {
    if conf.any_type {
        return true;
    }
    let base = content_type.split(';').next().unwrap_or("").trim();
    conf.types.iter().any(|t| t.eq_ignore_ascii_case(base))
}

/// Whether an `Accept-Encoding` value lists `gzip` with a non-zero quality.
pub fn accepts_gzip(accept_encoding: &str) -> bool {
    accept_encoding.split(',').any(|item| {
        let mut parts = item.split(';');
        let name = parts.next().unwrap_or("").trim();
        if !name.eq_ignore_ascii_case("gzip") {
            return false;
        }
        for p in parts {
            let p = p.trim();
            if let Some(q) = p.strip_prefix("q=").or_else(|| p.strip_prefix("Q=")) {
                return !is_zero_quality(q.trim());
            }
        }
        true
    })
}

/// `0`, `0.`, `0.0`, `0.00`, `0.000`.
fn is_zero_quality(q: &str) -> bool {
    match q.strip_prefix('0') {
        Some("") => true,
        Some(rest) => rest
            .strip_prefix('.')
            .is_some_and(|d| d.len() <= 3 && d.bytes().all(|b| b == b'0')),
        None => false,
    }
}

/// CRC-32 (IEEE), as nginx's `ngx_crc32_long` (the `hash` balancer uses it).
pub fn crc32(parts: &[&[u8]]) -> u32 {
    let mut c = flate2::Crc::new();
    for p in parts {
        c.update(p);
    }
    c.sum()
}

/// nginx's weak ETag for a compressed body: `"x"` becomes `W/"x"`; a weak one stays.
pub fn weak_etag(etag: &str) -> String {
    if etag.starts_with("W/") {
        etag.to_string()
    } else {
        format!("W/{etag}")
    }
}

/// The zlib-rs level for nginx's `gzip_comp_level`. zlib-rs (as zlib-ng) implements level 1
/// with its "quick" strategy, 31-48% larger than zlib's level 1 on text (measured, see
/// docs/directives.md); its level 2 is zlib's `deflate_fast` and comes out no larger than
/// zlib's level 1, so level 1 is mapped to it. Levels 2-9 are within 5% of zlib's.
fn level(comp_level: u32) -> Compression {
    match comp_level.clamp(1, 9) {
        1 => Compression::new(2),
        n => Compression::new(n),
    }
}

/// Compresses `data` at `comp_level` (1..=9) into a gzip member.
pub fn compress(comp_level: u32, data: &[u8]) -> Vec<u8> {
    let mut enc = GzEncoder::new(Vec::with_capacity(data.len() / 3 + 64), level(comp_level));
    // Writing into a Vec cannot fail.
    let _ = enc.write_all(data);
    enc.finish().unwrap_or_default()
}

/// Compresses `len` bytes that `read(buf, offset)` supplies in chunks of at most
/// [`GZIP_READ_CHUNK_BYTES`] (a `pread`). A read of 0 before `len` bytes (the file shrank) is
/// an `UnexpectedEof` error; `Interrupted` reads are retried.
pub fn compress_with(
    comp_level: u32,
    len: u64,
    mut read: impl FnMut(&mut [u8], u64) -> std::io::Result<usize>,
) -> std::io::Result<Vec<u8>> {
    let cap = usize::try_from(len / 3).unwrap_or(0).saturating_add(64);
    let mut enc = GzEncoder::new(Vec::with_capacity(cap), level(comp_level));
    let mut chunk = vec![0u8; GZIP_READ_CHUNK_BYTES.min(len as usize).max(1)];
    let mut offset = 0u64;
    while offset < len {
        let want = (len - offset).min(chunk.len() as u64) as usize;
        let n = match read(&mut chunk[..want], offset) {
            Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => n.min(want),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        enc.write_all(&chunk[..n])?;
        offset += n as u64;
    }
    enc.finish()
}

#[cfg(test)]
mod size_tests {
    use super::*;

    /// zlib 1.2.13's sizes for `text()` at levels 1..=9 (windowBits 31, memLevel 8, as nginx
    /// sets them for a large response), computed with Python's `zlib.compressobj`.
    const ZLIB: [usize; 9] = [
        25275, 24990, 23429, 24253, 20736, 21849, 21536, 19491, 19499,
    ];

    fn text() -> Vec<u8> {
        let mut s = String::new();
        for i in 0..3000 {
            s.push_str(&format!(
                "<div class=\"item item-{}\"><a href=\"/p/{i}\">Item number {i}</a> {}</div>\n",
                i % 7,
                "x".repeat(i % 13)
            ));
        }
        s.into_bytes()
    }

    #[test]
    fn no_level_is_more_than_five_percent_larger_than_zlib() {
        let t = text();
        assert_eq!(t.len(), 228_765, "the text zlib's sizes were measured on");
        for (i, want) in ZLIB.iter().enumerate() {
            let got = compress(i as u32 + 1, &t).len();
            assert!(
                got * 100 <= want * 105,
                "level {}: {got} bytes vs zlib's {want}",
                i + 1
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::{parse, Limits, Parse};
    use crate::response::{write_head, Head};
    use std::io::Read;

    fn req(head: &str) -> Request {
        let raw = format!("{head}\r\nHost: x\r\n\r\n");
        match parse(raw.as_bytes(), &Limits::default()) {
            Parse::Complete { req, .. } => req,
            other => panic!("{other:?}"),
        }
    }

    fn on() -> GzipConf {
        GzipConf {
            enabled: true,
            ..Default::default()
        }
    }

    fn gunzip(b: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(b)
            .read_to_end(&mut out)
            .unwrap();
        out
    }

    const YES: Decision = Decision {
        vary: false,
        compress: true,
    };

    #[test]
    fn accept_encoding() {
        for yes in [
            "gzip",
            "GZIP",
            "deflate, gzip",
            "gzip;q=0.5",
            "br;q=1.0, gzip ; q=1",
            "gzip;q=0.001",
        ] {
            assert!(accepts_gzip(yes), "{yes}");
        }
        for no in [
            "",
            "deflate",
            "x-gzip",
            "gzipx",
            "gzip;q=0",
            "gzip; q=0.000",
            "*",
            "identity, br",
        ] {
            assert!(!accepts_gzip(no), "{no}");
        }
    }

    #[test]
    fn decisions() {
        let g = req("GET / HTTP/1.1\r\nAccept-Encoding: gzip");
        let html = Some("text/html");
        assert_eq!(decide(&on(), &g, 200, html, 100), YES);
        assert_eq!(
            decide(&GzipConf::default(), &g, 200, html, 100),
            Decision::default()
        );
        // Status, type, length, method, encoding, version.
        assert_eq!(decide(&on(), &g, 404, html, 100), Decision::default());
        assert_eq!(
            decide(&on(), &g, 200, Some("text/css"), 100),
            Decision::default()
        );
        assert_eq!(decide(&on(), &g, 200, None, 100), Decision::default());
        // `gzip_types *` takes an answer without a type too (nginx's type test).
        let any = GzipConf {
            any_type: true,
            ..on()
        };
        assert_eq!(decide(&any, &g, 200, None, 100), YES);
        assert_eq!(decide(&on(), &g, 200, html, 19), Decision::default());
        assert_eq!(decide(&on(), &g, 200, html, 20), YES);
        // HEAD gets the headers a GET gets (issue 12).
        let h = req("HEAD / HTTP/1.1\r\nAccept-Encoding: gzip");
        assert_eq!(decide(&on(), &h, 200, html, 100), YES);
        let n = req("GET / HTTP/1.1");
        assert_eq!(decide(&on(), &n, 200, html, 100), Decision::default());
        let old = req("GET / HTTP/1.0\r\nAccept-Encoding: gzip");
        assert_eq!(decide(&on(), &old, 200, html, 100), Decision::default());
        let v10 = GzipConf {
            http_version_minor: 0,
            ..on()
        };
        assert_eq!(decide(&v10, &old, 200, html, 100), YES);
        assert_eq!(
            decide(&on(), &g, 200, html, GZIP_MAX_FILE_BYTES + 1),
            Decision::default()
        );
        // Vary goes on every eligible response, compressed or not.
        let vary = GzipConf { vary: true, ..on() };
        assert_eq!(
            decide(&vary, &n, 200, html, 100),
            Decision {
                vary: true,
                compress: false
            }
        );
        assert_eq!(
            decide(&vary, &g, 200, html, 100),
            Decision {
                vary: true,
                compress: true
            }
        );
        assert_eq!(decide(&vary, &g, 200, html, 1), Decision::default());
    }

    #[test]
    fn types() {
        let c = GzipConf {
            types: vec!["text/html".into(), "application/json".into()],
            ..on()
        };
        assert!(type_matches(&c, "text/html; charset=utf-8"));
        assert!(type_matches(&c, "Application/JSON"));
        assert!(!type_matches(&c, "text/plain"));
        let any = GzipConf {
            any_type: true,
            ..on()
        };
        assert!(type_matches(&any, "image/png"));
    }

    #[test]
    fn etags() {
        assert_eq!(weak_etag("\"a-b\""), "W/\"a-b\"");
        assert_eq!(weak_etag("W/\"a-b\""), "W/\"a-b\"");
    }

    #[test]
    fn round_trips() {
        let data: Vec<u8> = (0..200_000u32)
            .flat_map(|i| format!("line {} of text\n", i % 977).into_bytes())
            .collect();
        for lvl in [1, 6, 9] {
            let z = compress(lvl, &data);
            assert!(z.len() < data.len() / 4, "level {lvl}: {}", z.len());
            assert_eq!(gunzip(&z), data);
        }
        // Chunked reads, with short and interrupted reads along the way.
        let mut calls = 0;
        let z = compress_with(6, data.len() as u64, |buf, off| {
            calls += 1;
            if calls % 5 == 0 {
                return Err(std::io::ErrorKind::Interrupted.into());
            }
            assert!(buf.len() <= GZIP_READ_CHUNK_BYTES);
            let off = off as usize;
            let n = buf.len().min(1000 + calls * 7).min(data.len() - off);
            buf[..n].copy_from_slice(&data[off..off + n]);
            Ok(n)
        })
        .unwrap();
        assert_eq!(gunzip(&z), data);
        assert_eq!(gunzip(&compress_with(1, 0, |_, _| Ok(0)).unwrap()), b"");
        let short = compress_with(1, 10, |buf, off| {
            Ok(if off == 0 { buf.len().min(4) } else { 0 })
        });
        assert_eq!(short.unwrap_err().kind(), std::io::ErrorKind::UnexpectedEof);
    }

    #[test]
    fn head_headers() {
        let mut out = Vec::new();
        write_head(
            &mut out,
            &Head {
                date: b"D",
                content_length: Some(5),
                content_encoding: Some(ENCODING),
                vary: Some(VARY),
                etag: Some("W/\"e\""),
                ..Default::default()
            },
        );
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "HTTP/1.1 200 OK\r\nServer: shard/0.1.0\r\nDate: D\r\nContent-Length: 5\r\n\
             Connection: close\r\nVary: Accept-Encoding\r\nETag: W/\"e\"\r\nContent-Encoding: gzip\r\n\r\n"
        );
    }
}
