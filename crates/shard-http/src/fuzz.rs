//! Deterministic robustness tests: many random, truncated and mutated inputs to the parsers,
//! checking that nothing panics and that the documented invariants hold.

use crate::body::ChunkedDecoder;
use crate::request::{parse, Limits, NamePolicy, Parse};
use crate::static_file::{plan, FileMeta};

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
    let limits = [
        Limits::default(),
        Limits {
            header_buffer_size: 64,
            large_buffers: 2,
            large_buffer_size: 128,
            names: NamePolicy {
                underscores: true,
                ignore_invalid: false,
            },
        },
        Limits {
            header_buffer_size: 0,
            large_buffers: 0,
            large_buffer_size: 0,
            names: NamePolicy::default(),
        },
    ];
    for round in 0..30_000 {
        let seed = SEEDS[rng.below(SEEDS.len())];
        let input: Vec<u8> = if round % 10 == 0 {
            (0..rng.below(600)).map(|_| rng.next() as u8).collect()
        } else {
            mutate(&mut rng, seed)
        };
        for l in &limits {
            for cut in [input.len(), rng.below(input.len() + 1)] {
                let buf = &input[..cut];
                match parse(buf, l) {
                    Parse::Complete { req, head_len } => {
                        assert!(head_len <= buf.len());
                        assert!(req.path.starts_with('/'));
                        assert!(!req.path.contains("//") && !req.path.contains("/../"));
                        let meta = FileMeta {
                            size: rng.next() % 100,
                            mtime_secs: rng.next() as i64,
                            is_dir: rng.below(4) == 0,
                            is_file: rng.below(4) != 0,
                        };
                        let _ = plan(&req, &meta);
                    }
                    Parse::Partial => assert!(buf.len() < l.head_max(), "partial at the limit"),
                    Parse::Error(r) => assert!(matches!(r.status, 400 | 414 | 431 | 501 | 505)),
                }
            }
        }
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
        let mut d = ChunkedDecoder::new();
        let mut pos = 0;
        while pos < input.len() {
            let end = (pos + 1 + rng.below(20)).min(input.len());
            match d.feed(&input[pos..end]) {
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
}
