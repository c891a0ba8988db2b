//! shard-http
