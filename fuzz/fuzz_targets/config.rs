//! A configuration file: shard_config::fuzz::check_config.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| shard_config::fuzz::check_config(data));
