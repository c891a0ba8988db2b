//! A request head (cut where a short read could cut it) and a chunked body decoder fed in
//! pieces: shard_http::fuzz::check_request / check_chunked.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (ctl, rest) = data.split_at(data.len().min(8));
    let mut seed = [0u8; 8];
    seed[..ctl.len()].copy_from_slice(ctl);
    let seed = u64::from_le_bytes(seed);
    shard_http::fuzz::check_request(rest, (seed % (rest.len() as u64 + 1)) as usize, seed);
    shard_http::fuzz::check_chunked(rest, ctl);
});
