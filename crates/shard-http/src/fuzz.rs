//! Fuzzing entry points for the parsers a client or an upstream can reach, and a stable,
//! deterministic run of them inside `cargo test`.
//!
//! Each `check_*` function takes arbitrary bytes, runs a parser on them and asserts the
//! invariants it documents (never a panic; a request ends as a request, a wait for more bytes
//! within the limits, or one of nginx's refusal statuses). The `cargo fuzz` targets under
//! `fuzz/` call exactly these functions on a nightly toolchain; the tests below call them on
//! tens of thousands of random, truncated and mutated inputs on stable, so CI runs the same
//! checks without a fuzzer.

use crate::body::ChunkedDecoder;
use crate::request::{parse, Limits, NamePolicy, Parse};
use crate::static_file::{plan, FileMeta};

/// The header limits a request is checked under: the defaults, tiny buffers with the other
/// header-name rules, and no buffers at all.
fn limit_sets() -> [Limits; 3] {
    [
        Limits::default(),
        Limits {
            header_buffer_size: 64,
            large_buffers: 2,
            large_buffer_size: 128,
            names: NamePolicy {
                underscores: true,
                ignore_invalid: false,
            },
            merge_slashes: false,
        },
        Limits {
            header_buffer_size: 0,
            large_buffers: 0,
            large_buffer_size: 0,
            names: NamePolicy::default(),
            merge_slashes: true,
        },
    ]
}

/// A request head (and, when it parses, its static-file plan) from arbitrary bytes, cut at
/// `cut` as a short read would.
pub fn check_request(data: &[u8], cut: usize, meta_seed: u64) {
    for l in &limit_sets() {
        for buf in [data, &data[..cut.min(data.len())]] {
            match parse(buf, l) {
                Parse::Complete { req, head_len } => {
                    assert!(head_len <= buf.len());
                    assert!(req.path.starts_with('/'));
                    // `merge_slashes off` keeps `//`; `..` is always resolved.
                    assert!(!l.merge_slashes || !req.path.contains("//"));
                    assert!(!req.path.contains("/../") && !req.path.ends_with("/.."));
                    let meta = FileMeta {
                        size: meta_seed % 100,
                        mtime_secs: meta_seed as i64,
                        is_dir: meta_seed & 3 == 0,
                        is_file: meta_seed & 4 != 0,
                    };
                    let _ = plan(&req, &meta);
                }
                Parse::Partial => assert!(buf.len() < l.head_max(), "partial at the limit"),
                Parse::Error(r) => {
                    assert!(
                        matches!(r.status, 400 | 405 | 414 | 431 | 501 | 505),
                        "{r:?}"
                    )
                }
            }
        }
    }
}

/// A chunked body fed in pieces whose sizes come from `splits`.
pub fn check_chunked(data: &[u8], splits: &[u8]) {
    let mut d = ChunkedDecoder::new();
    let mut pos = 0;
    let mut i = 0;
    while pos < data.len() {
        let step = 1 + splits.get(i).copied().unwrap_or(7) as usize % 20;
        i += 1;
        let end = (pos + step).min(data.len());
        match d.feed(&data[pos..end]) {
            Ok(f) => {
                assert!(f.consumed <= end - pos);
                assert!(f.data <= f.consumed as u64);
                if !d.is_done() {
                    assert_eq!(f.consumed, end - pos, "stopped early without finishing");
                }
                pos += f.consumed;
                if d.is_done() {
                    break;
                }
            }
            Err(r) => {
                assert_eq!(r.status, 400);
                break;
            }
        }
    }
}

/// An upstream response head, as the proxy reads it (for `GET` and for `HEAD`).
pub fn check_response_head(data: &[u8]) {
    use crate::proxy::{parse_response, Framing, ResponseParse};
    for head_request in [false, true] {
        match parse_response(data, 8192, head_request) {
            ResponseParse::Complete { head, head_len } => {
                assert!(head_len <= data.len());
                assert!((100..1000).contains(&head.status));
                if head_request {
                    assert!(!matches!(head.framing, Framing::Chunked | Framing::Close));
                }
            }
            ResponseParse::Interim { head_len } => assert!(head_len > 0 && head_len <= data.len()),
            ResponseParse::Partial => assert!(data.len() < 8192, "partial past the limit"),
            ResponseParse::Invalid(why) => assert!(!why.is_empty()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            let mut x = self.0;
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            self.0 = x;
            x
        }

        fn below(&mut self, n: usize) -> usize {
            if n == 0 {
                0
            } else {
                (self.next() % n as u64) as usize
            }
        }
    }

    const SEEDS: &[&[u8]] = &[
    b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /a/b/../c%20d?x=1 HTTP/1.1\r\nHost: Example.com:80\r\nConnection: keep-alive\r\nUser-Agent: ua\r\n\r\n",
    b"POST /up HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello",
    b"POST /up HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    b"GET http://h.test/p?q HTTP/1.0\r\nRange: bytes=0-5\r\nIf-None-Match: \"a\"\r\n\r\n",
    b"\r\n\r\nHEAD /%2e/x HTTP/1.1\nHost: [::1]:8080\n\n",
];

    const SPECIALS: &[u8] = b"\r\n :%/.?#\0\x7f\xff\t;-0123456789abcdefHTTP";

    fn mutate(rng: &mut Rng, seed: &[u8]) -> Vec<u8> {
        let mut v = seed.to_vec();
        for _ in 0..rng.below(6) {
            let pos = rng.below(v.len() + 1);
            match rng.below(6) {
                0 if !v.is_empty() => {
                    let p = pos.min(v.len() - 1);
                    v[p] = rng.next() as u8;
                }
                1 if pos < v.len() => {
                    v.remove(pos);
                }
                2 => v.insert(pos, SPECIALS[rng.below(SPECIALS.len())]),
                3 => {
                    let n = rng.below(3000);
                    let b = SPECIALS[rng.below(SPECIALS.len())];
                    v.splice(pos..pos, vec![b; n]);
                }
                4 => v.truncate(pos),
                _ => {
                    let other = SEEDS[rng.below(SEEDS.len())];
                    v.splice(pos..pos, other.iter().copied());
                }
            }
        }
        v
    }

    #[test]
    fn parse_never_panics() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        for round in 0..30_000 {
            let seed = SEEDS[rng.below(SEEDS.len())];
            let input: Vec<u8> = if round % 10 == 0 {
                (0..rng.below(600)).map(|_| rng.next() as u8).collect()
            } else {
                mutate(&mut rng, seed)
            };
            let cut = rng.below(input.len() + 1);
            check_request(&input, cut, rng.next());
        }
    }

    #[test]
    fn chunked_never_panics() {
        let mut rng = Rng(0x1234_5678_9abc_def1);
        let seeds: &[&[u8]] = &[
            b"5\r\nhello\r\n0\r\n\r\n",
            b"a;ext=1\r\n0123456789\r\n3\nabc\n0\r\nT: v\r\n\r\n",
            b"0\n\n",
            b"FFFFFFFFFFFFFFFF\r\n",
        ];
        for _ in 0..30_000 {
            let seed = seeds[rng.below(seeds.len())];
            let input = mutate(&mut rng, seed);
            let splits: Vec<u8> = (0..8).map(|_| rng.next() as u8).collect();
            check_chunked(&input, &splits);
        }
    }

    #[test]
    fn response_heads_never_panic() {
        let mut rng = Rng(0x0bad_cafe_f00d_1234);
        let seeds: &[&[u8]] = &[
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\nConnection: close\r\n\r\n",
        b"HTTP/1.0 404 Not Found\r\nConnection: keep-alive\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n",
    ];
        for round in 0..30_000 {
            let input: Vec<u8> = if round % 10 == 0 {
                (0..rng.below(400)).map(|_| rng.next() as u8).collect()
            } else {
                let seed = seeds[rng.below(seeds.len())];
                mutate(&mut rng, seed)
            };
            check_response_head(&input);
        }
    }
}
