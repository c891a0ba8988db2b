//! The fuzzing entry point for the configuration parser, and a stable, deterministic run of it
//! inside `cargo test`.
//!
//! `check_config` parses arbitrary bytes as a configuration file: it must never panic, and an
//! error must say something (most name `FILE:LINE` as nginx's do; a few, such as nginx's
//! `no "events" section in configuration`, name no place). The `cargo fuzz` target `config` under `fuzz/` calls it on a nightly
//! toolchain; the test below feeds it mutated copies of the shipped example configurations.

use std::path::Path;

/// Parses `data` as `fuzz.conf` in a directory that does not exist (so `include` of a relative
/// pattern finds nothing).
pub fn check_config(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let dir = Path::new("/nonexistent/shard-fuzz");
    match crate::parse_str(&text, "fuzz.conf", dir, dir, None) {
        Ok(cfg) => {
            // What the server does next with a parsed configuration.
            let _ = cfg.check_workers(1);
            let _ = cfg.check_workers(64);
        }
        Err(e) => assert!(!e.message.is_empty()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEEDS: &[&str] = &[
        include_str!("../../../conf/examples/reuseport.conf"),
        include_str!("../../../conf/examples/accept_mutex_on.conf"),
        include_str!("../../../conf/examples/accept_mutex_off.conf"),
        include_str!("../../../conf/examples/proxy.conf"),
        "events {}\nhttp { server { listen 80; location / { return 200 \"x\"; } } }\n",
        "events { worker_connections 10; }\nstream { upstream u { server 127.0.0.1:1 weight=2 \
         max_fails=3 fail_timeout=5s; server 127.0.0.1:2 backup; } server { listen 9000 \
         reuseport shards=2; proxy_pass u; } }\n",
    ];
    const SPECIALS: &[&str] = &[
        "{",
        "}",
        ";",
        "\"",
        "'",
        "\\",
        "#",
        "$",
        " ",
        "\n",
        "server",
        "location",
        "listen",
        "include",
        "=",
        "~",
        "^~",
        "0",
        "-1",
        "99999999999999999999",
        "1k",
        "10s",
        "on",
        "off",
        "reuseport",
        "shards=0",
        "shards=auto",
        "[::1]:80",
        "unix:/x",
        "*",
        "http",
        "events",
    ];

    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n.max(1) as u64) as usize
        }
    }

    /// Token-level and byte-level mutations: configurations are text, and most interesting
    /// breakage is a word or a brace moved.
    fn mutate(rng: &mut Rng, seed: &str) -> Vec<u8> {
        let mut v = seed.as_bytes().to_vec();
        for _ in 0..1 + rng.below(5) {
            let pos = rng.below(v.len() + 1);
            match rng.below(5) {
                0 if pos < v.len() => {
                    v.remove(pos);
                }
                1 => {
                    let s = SPECIALS[rng.below(SPECIALS.len())];
                    v.splice(pos..pos, s.bytes());
                }
                2 if pos < v.len() => v[pos] = rng.next() as u8,
                3 => v.truncate(pos),
                _ => {
                    // Repeat a slice (a block or a directive twice).
                    let a = rng.below(v.len() + 1);
                    let b = (a + rng.below(200)).min(v.len());
                    let piece = v[a..b].to_vec();
                    v.splice(pos..pos, piece);
                }
            }
        }
        v
    }

    #[test]
    fn config_parser_never_panics() {
        let mut rng = Rng(0x5eed_c0de_1234_abcd);
        for seed in SEEDS {
            check_config(seed.as_bytes());
        }
        for _ in 0..20_000 {
            let seed = SEEDS[rng.below(SEEDS.len())];
            check_config(&mutate(&mut rng, seed));
        }
    }
}
