//! nginx-syntax configuration for shard: text in, a typed [`Config`] out.
//!
//! This crate owns the lexer, the directive table, inheritance (http -> server -> location)
//! and every configuration error message. It reads files only to follow `include`; it binds
//! no socket and resolves no CPU count (`worker_processes auto` stays [`WorkerProcesses::Auto`]).

mod model;

pub use model::*;

use std::path::Path;

/// The configuration shard runs when no `-c` is given and no file exists at the default path.
pub const DEFAULT_CONFIG: &str = include_str!("default.conf");

/// The MIME types bundled with shard (nginx's `mime.types` format).
pub const MIME_TYPES: &str = include_str!("mime.types");

/// A configuration error, displayed the way nginx shows it after `[emerg] `:
/// `unknown directive "lisen" in conf/shard.conf:12`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ConfigError {
    pub message: String,
}

/// Parses the file at `path`. `prefix` resolves relative paths (`pid`, logs, `root`);
/// `includes` resolve against the directory holding `path`, as nginx's conf prefix.
/// `extra` is the text of `-g` (main-context directives), parsed as if it followed the file.
pub fn load(path: &Path, prefix: &Path, extra: Option<&str>) -> Result<Config, ConfigError> {
    let _ = (path, prefix, extra);
    todo!()
}

/// Parses `text` as if read from a file named `name` in directory `conf_dir`.
pub fn parse_str(
    text: &str,
    name: &str,
    conf_dir: &Path,
    prefix: &Path,
    extra: Option<&str>,
) -> Result<Config, ConfigError> {
    let _ = (text, name, conf_dir, prefix, extra);
    todo!()
}
