//! nginx-syntax configuration for shard: text in, a typed [`Config`] out.
//!
//! This crate owns the lexer, the directive table, inheritance (http -> server -> location)
//! and every configuration error message. It reads files only to follow `include`; it binds
//! no socket and resolves no CPU count (`worker_processes auto` stays [`WorkerProcesses::Auto`]).

#[doc(hidden)]
pub mod fuzz;
pub mod geoip;
#[rustfmt::skip]
mod geoip_data;
pub mod index;
mod lexer;
mod model;
mod parse;
pub mod pcre;
pub mod tree;
mod units;

#[cfg(test)]
mod tests;

pub use model::*;
pub use parse::runtime_variable;
pub use pcre::Regex;
pub use units::{parse_size, parse_time_ms};

/// `expires`' arguments read as the directive reads them (`Ok(None)` is `off`): for an
/// `expires $variable` whose value is known only per response.
pub fn expires_value(args: &[String]) -> Result<Option<Expires>, String> {
    parse::expires_value(args)
}

use std::path::Path;

/// The configuration shard runs when no `-c` is given and no file exists at the default path.
pub const DEFAULT_CONFIG: &str = include_str!("default.conf");

/// The MIME types bundled with shard (nginx's `mime.types` format).
pub const MIME_TYPES: &str = include_str!("mime.types");

/// The files nginx ships beside `nginx.conf` and shard bundles (copies in `conf/`): an
/// `include` of one of these names, relative and missing beside the configuration, reads the
/// bundled text, so `include fastcgi_params;` works with no file installed.
pub const BUNDLED_FILES: [(&str, &str); 5] = [
    ("mime.types", MIME_TYPES),
    ("fastcgi_params", include_str!("fastcgi_params")),
    ("fastcgi.conf", include_str!("fastcgi.conf")),
    ("scgi_params", include_str!("scgi_params")),
    ("uwsgi_params", include_str!("uwsgi_params")),
];

/// A configuration error, displayed the way nginx shows it after `[emerg] `:
/// `unknown directive "lisen" in conf/shard.conf:12`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ConfigError {
    /// The first error, as nginx would report it.
    pub message: String,
    /// Every further error found in the same run (`shard -t` lists them all; nginx stops
    /// at the first). Not part of `Display`.
    pub more: Vec<String>,
}

/// The display name of `-g` text in error messages.
pub(crate) const COMMAND_LINE: &str = "command line";

pub(crate) fn is_command_line(file: &str) -> bool {
    file == COMMAND_LINE
}

/// `FILE:LINE`, or `command line` for `-g` text.
pub(crate) fn where_(file: &str, line: usize) -> String {
    if is_command_line(file) {
        COMMAND_LINE.to_string()
    } else {
        format!("{file}:{line}")
    }
}

impl ConfigError {
    pub fn new(message: impl Into<String>) -> ConfigError {
        ConfigError {
            message: message.into(),
            more: Vec::new(),
        }
    }

    /// Every message: the first, then the others in the order found.
    pub fn all(&self) -> impl Iterator<Item = &str> {
        std::iter::once(self.message.as_str()).chain(self.more.iter().map(String::as_str))
    }

    /// `MSG in FILE:LINE` (or `MSG in command line`), nginx's shape. Shared by the lexer and
    /// the parser, so neither depends on the other for it.
    pub(crate) fn at(file: &str, line: usize, msg: impl std::fmt::Display) -> ConfigError {
        ConfigError::new(format!("{msg} in {}", where_(file, line)))
    }
}

/// Parses the file at `path`. `prefix` resolves relative paths (`pid`, logs, `root`);
/// `includes` resolve against the directory holding `path`, as nginx's conf prefix.
/// `extra` is the text of `-g` (main-context directives), parsed as if it followed the file.
/// A local address as `proxy_bind` takes it: `IP`, `IP:PORT`, `[IPV6]` or `[IPV6]:PORT` (port
/// 0: the kernel chooses).
pub fn parse_bind_addr(v: &str) -> Option<std::net::SocketAddr> {
    if let Ok(ip) = v.parse::<std::net::IpAddr>() {
        return Some(std::net::SocketAddr::new(ip, 0));
    }
    if let Some(inner) = v.strip_prefix('[').and_then(|r| r.strip_suffix(']')) {
        return inner
            .parse::<std::net::Ipv6Addr>()
            .ok()
            .map(|ip| std::net::SocketAddr::new(ip.into(), 0));
    }
    v.parse().ok()
}

/// The TLS 1.3 suites shard speaks, by OpenSSL's names (`ssl_conf_command Ciphersuites`).
pub const TLS13_SUITES: [&str; 3] = [
    "TLS_AES_128_GCM_SHA256",
    "TLS_AES_256_GCM_SHA384",
    "TLS_CHACHA20_POLY1305_SHA256",
];

/// `ssl_conf_command Options` flags shard accepts: `ServerPreference` and `SessionTicket` act;
/// the others name what rustls always or never does (no renegotiation, no compression,
/// extended master secret, middlebox compatibility) or a tuning shard has no use for.
pub const TLS_OPTIONS: [&str; 13] = [
    "ServerPreference",
    "SessionTicket",
    "PrioritizeChaCha",
    "NoRenegotiation",
    "Compression",
    "KTLS",
    "EncryptThenMac",
    "ExtendedMasterSecret",
    "MiddleboxCompat",
    "AntiReplay",
    "Bugs",
    "NoResumptionOnRenegotiation",
    "AllowNoDHEKEX",
];

/// A key exchange group's canonical name for an OpenSSL group name (`X25519`, `P-256`,
/// `prime256v1`, `secp384r1`, ...): `None` for one shard does not have.
pub fn kx_group_name(name: &str) -> Option<&'static str> {
    Some(match name.to_ascii_lowercase().as_str() {
        "x25519" => "X25519",
        "p-256" | "prime256v1" | "secp256r1" => "secp256r1",
        "p-384" | "secp384r1" => "secp384r1",
        "x25519mlkem768" => "X25519MLKEM768",
        _ => return None,
    })
}

pub fn load(path: &Path, prefix: &Path, extra: Option<&str>) -> Result<Config, ConfigError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| ConfigError::new(parse::open_failed(path, &e)))?;
    let conf_dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    parse::parse(&text, &path.display().to_string(), conf_dir, prefix, extra)
}

/// Parses `text` as if read from a file named `name` in directory `conf_dir`.
///
/// Errors name `name` (or an included file) and the line; `-g` text is named `command line`.
pub fn parse_str(
    text: &str,
    name: &str,
    conf_dir: &Path,
    prefix: &Path,
    extra: Option<&str>,
) -> Result<Config, ConfigError> {
    parse::parse(text, name, conf_dir, prefix, extra)
}

impl Config {
    /// Whether any `proxy_bind`/`fastcgi_bind` is `transparent` (the workers then keep
    /// `CAP_NET_RAW`, as nginx's).
    pub fn transparent_binds(&self) -> bool {
        let http = self.http.iter().flat_map(|h| &h.servers).any(|s| {
            std::iter::once(&s.base)
                .chain(&s.locations)
                // (A FastCGI location's `proxy` is its `fastcgi_*` settings.)
                .any(|l| l.proxy.bind_transparent)
        });
        http || self
            .stream
            .iter()
            .flat_map(|st| &st.servers)
            .any(|s| s.bind_transparent)
    }

    /// Checks what depends on the resolved number of workers (`worker_processes auto` is
    /// resolved by the server): `shards=N` may not exceed it. `cpus` resolves `shards=auto`.
    pub fn check_workers(&self, n_workers: usize) -> Result<(), ConfigError> {
        for l in &self.listeners {
            if let Some(Shards::Count(n)) = l.opts.shards {
                if n > n_workers {
                    return Err(ConfigError::new(format!(
                        "\"shards={n}\" of {} is more than the {n_workers} worker processes in {}",
                        l.addr, l.place
                    )));
                }
            }
        }
        Ok(())
    }
}

/// How many `SO_REUSEPORT` sockets a `reuseport` listener gets with `n_workers` workers on a
/// machine where the process may use `cpus` CPUs.
pub fn shard_count(shards: Option<Shards>, n_workers: usize, cpus: usize) -> usize {
    match shards {
        None => n_workers,
        Some(Shards::Count(n)) => n.min(n_workers),
        Some(Shards::Auto) => (cpus / 8).clamp(1, n_workers.max(1)),
    }
}
