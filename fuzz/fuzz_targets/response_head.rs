//! An upstream's response head as the proxy reads it: shard_http::fuzz::check_response_head.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| shard_http::fuzz::check_response_head(data));
