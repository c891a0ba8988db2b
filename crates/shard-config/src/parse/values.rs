//! Value parsers shared by every context: numbers, sizes, times, flags, `listen`, `return`,
//! `server_name`, `error_log`, and the error shapes (`duplicate`, `invalid value`).

#[allow(unused_imports)]
use super::*;

pub(super) struct ListenerP {
    pub(super) addr: SocketAddr,
    pub(super) opts: ListenOpts,
    /// Where socket options were first given, if any were.
    pub(super) opts_place: Option<Place>,
    pub(super) first_place: Place,
    pub(super) servers: Vec<usize>,
    pub(super) default_server: Option<usize>,
}

/// One parsed `listen`.
#[derive(Debug, Clone)]
pub(super) struct ListenSpec {
    pub(super) addr: SocketAddr,
    pub(super) default_server: bool,
    pub(super) opts: ListenOpts,
    pub(super) opts_set: bool,
    /// `ssl` was written (OR-ed over the address's `listen`s, as nginx).
    pub(super) ssl: bool,
    /// `proxy_protocol` was written (OR-ed likewise).
    pub(super) proxy_protocol: bool,
    /// `http2` was written (OR-ed likewise).
    pub(super) http2: bool,
    /// A port range's last port: the `listen` stands for every port from `addr`'s to it.
    pub(super) last_port: Option<u16>,
}

impl ListenSpec {
    /// The addresses this `listen` stands for: one, or one per port of its range.
    pub(super) fn addrs(&self) -> Vec<SocketAddr> {
        let first = self.addr.port();
        (first..=self.last_port.unwrap_or(first))
            .map(|p| SocketAddr::new(self.addr.ip(), p))
            .collect()
    }
}

/// A directive the table admits in this context but no handler of the context takes: a
/// mismatch between `TABLE` and a handler, reported as nginx reports a directive it does not
/// know here rather than a panic (configuration text never panics the parser).
pub(super) fn not_handled(d: &Directive, file: &str) -> ConfigError {
    derr(
        d,
        file,
        format!("\"{}\" directive is not allowed here", d.name),
    )
}

pub(super) fn dup(d: &Directive, file: &str) -> ConfigError {
    derr(d, file, format!("\"{}\" directive is duplicate", d.name))
}

pub(super) fn invalid(d: &Directive, file: &str, v: &str) -> ConfigError {
    derr(
        d,
        file,
        format!("invalid value \"{v}\" in \"{}\" directive", d.name),
    )
}

pub(super) fn is_digits(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())
}

pub(super) fn num<N: std::str::FromStr>(
    d: &Directive,
    file: &str,
    v: &str,
) -> Result<N, ConfigError> {
    if !is_digits(v) {
        return Err(invalid(d, file, v));
    }
    v.parse::<N>().map_err(|_| invalid(d, file, v))
}

pub(super) fn size(d: &Directive, file: &str, v: &str) -> Result<u64, ConfigError> {
    parse_size(v).ok_or_else(|| invalid(d, file, v))
}

pub(super) fn time(d: &Directive, file: &str, v: &str) -> Result<u64, ConfigError> {
    parse_time_ms(v).ok_or_else(|| invalid(d, file, v))
}

pub(super) fn flag(d: &Directive, file: &str, v: &str) -> Result<bool, ConfigError> {
    if v.eq_ignore_ascii_case("on") {
        Ok(true)
    } else if v.eq_ignore_ascii_case("off") {
        Ok(false)
    } else {
        Err(derr(
            d,
            file,
            format!(
                "invalid value \"{v}\" in \"{}\" directive, it must be \"on\" or \"off\"",
                d.name
            ),
        ))
    }
}

pub(super) fn parse_error_log(
    d: &Directive,
    file: &str,
    prefix: &Path,
) -> Result<ErrorLog, ConfigError> {
    if d.args[0].starts_with("memory:") {
        return Err(derr(
            d,
            file,
            "logging to \"memory:\" (a debugging build's ring buffer) is not supported by shard; log to a file, stderr or syslog",
        ));
    }
    let target = if d.args[0].starts_with("syslog:") {
        LogTarget::Syslog(std::sync::Arc::new(
            Syslog::parse(&d.args[0]).map_err(|m| derr(d, file, m))?,
        ))
    } else if d.args[0] == "stderr" {
        LogTarget::Stderr
    } else {
        LogTarget::File(prefix.join(&d.args[0]))
    };
    let level = match d.args.get(1).map(String::as_str) {
        None | Some("error") => LogLevel::Error,
        Some("debug") => LogLevel::Debug,
        Some("info") => LogLevel::Info,
        Some("notice") => LogLevel::Notice,
        Some("warn") => LogLevel::Warn,
        Some("crit") => LogLevel::Crit,
        Some("alert") => LogLevel::Alert,
        Some("emerg") => LogLevel::Emerg,
        Some(other) => return Err(derr(d, file, format!("invalid log level \"{other}\""))),
    };
    Ok(ErrorLog { target, level })
}

pub(super) fn parse_return(d: &Directive, file: &str) -> Result<Return, ConfigError> {
    let a0 = &d.args[0];
    let code = if is_digits(a0) {
        a0.parse::<u16>().ok().filter(|c| *c <= 999)
    } else {
        None
    };
    let parts = |t: Option<&String>| match t {
        Some(t) => parse_header_value(d, file, t),
        None => Ok(Vec::new()),
    };
    match (code, d.args.get(1)) {
        (Some(code), text) => Ok(Return {
            code,
            text: text.cloned(),
            parts: parts(text)?,
        }),
        (None, None)
            if a0.starts_with("http://")
                || a0.starts_with("https://")
                || a0.starts_with("$scheme") =>
        {
            Ok(Return {
                code: 302,
                text: Some(a0.clone()),
                parts: parts(Some(a0))?,
            })
        }
        (None, _) => Err(derr(d, file, format!("invalid return code \"{a0}\""))),
    }
}

pub(super) fn parse_server_name(
    d: &Directive,
    file: &str,
    a: &str,
) -> Result<ServerName, ConfigError> {
    if let Some(re) = a.strip_prefix('~') {
        let r = compile_regex(d, file, re, true)?;
        return Ok(ServerName::Regex(NameRegex(r)));
    }
    let n = a.to_ascii_lowercase();
    let bad = || derr(d, file, format!("invalid server name or wildcard \"{a}\""));
    let name = if let Some(rest) = n.strip_prefix('*') {
        if !rest.starts_with('.') || rest.len() < 2 {
            return Err(bad());
        }
        ServerName::WildcardPrefix(rest.to_string())
    } else if let Some(rest) = n.strip_suffix('*') {
        if !rest.ends_with('.') || rest.len() < 2 {
            return Err(bad());
        }
        ServerName::WildcardSuffix(rest.to_string())
    } else if let Some(rest) = n.strip_prefix('.') {
        if rest.is_empty() {
            return Err(bad());
        }
        ServerName::Dot(rest.to_string())
    } else {
        ServerName::Exact(n.clone())
    };
    let inner = match &name {
        ServerName::Exact(s)
        | ServerName::WildcardPrefix(s)
        | ServerName::WildcardSuffix(s)
        | ServerName::Dot(s) => s,
        ServerName::Regex(_) => return Ok(name),
    };
    if inner.contains('*') {
        return Err(bad());
    }
    Ok(name)
}

/// A `listen` address; a port range (`127.0.0.1:8080-8089`, as nginx takes it) gives its
/// first port and the range's last.
pub(super) fn parse_listen_addr(
    d: &Directive,
    file: &str,
    a: &str,
) -> Result<(SocketAddr, Option<u16>), ConfigError> {
    let bad_port = || {
        derr(
            d,
            file,
            format!("invalid port in \"{a}\" of the \"listen\" directive"),
        )
    };
    // `PORT-PORT` at the end (after `]` or the last `:`, or the whole of it).
    let tail_at = a.rfind([':', ']']).map_or(0, |i| i + 1);
    let range = a[tail_at..]
        .split_once('-')
        .filter(|_| !a.starts_with("unix:"));
    if let Some((from, to)) = range {
        if tail_at > 0 && a.as_bytes()[tail_at - 1] == b']' {
            return Err(bad_port());
        }
        let whole = format!("{}{from}", &a[..tail_at]);
        let (first, _) = parse_listen_one(d, file, &whole, a)?;
        let last = match to.parse::<u16>() {
            Ok(n) if is_digits(to) && n > 0 && n >= first.port() => n,
            _ => return Err(bad_port()),
        };
        return Ok((first, Some(last)));
    }
    Ok((parse_listen_one(d, file, a, a)?.0, None))
}

/// One `listen` address `a` (`shown` in errors).
fn parse_listen_one(
    d: &Directive,
    file: &str,
    a: &str,
    shown: &str,
) -> Result<(SocketAddr, ()), ConfigError> {
    let a_shown = shown;
    let not_found = || {
        derr(
            d,
            file,
            format!("host not found in \"{a_shown}\" of the \"listen\" directive"),
        )
    };
    let bad_port = || {
        derr(
            d,
            file,
            format!("invalid port in \"{a_shown}\" of the \"listen\" directive"),
        )
    };
    let port_of = |p: &str| -> Result<u16, ConfigError> {
        if !is_digits(p) {
            return Err(bad_port());
        }
        match p.parse::<u16>() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(bad_port()),
        }
    };
    if let Some(path) = a.strip_prefix("unix:") {
        if path.is_empty() {
            return Err(derr(
                d,
                file,
                format!(
                    "no path in the unix domain socket \"{a_shown}\" of the \"listen\" directive"
                ),
            ));
        }
        return Ok((crate::unix_stand_in(std::path::Path::new(path)), ()));
    }
    if let Some(rest) = a.strip_prefix('[') {
        let Some(end) = rest.find(']') else {
            return Err(not_found());
        };
        let ip: Ipv6Addr = rest[..end].parse().map_err(|_| not_found())?;
        let after = &rest[end + 1..];
        let port = if after.is_empty() {
            80
        } else if let Some(p) = after.strip_prefix(':') {
            port_of(p)?
        } else {
            return Err(not_found());
        };
        return Ok((SocketAddr::new(IpAddr::V6(ip), port), ()));
    }
    if is_digits(a) {
        return Ok((
            SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), port_of(a)?),
            (),
        ));
    }
    let (host, port) = match a.rsplit_once(':') {
        Some((h, p)) => (h, port_of(p)?),
        None => (a, 80),
    };
    let ip = match host {
        "*" => Ipv4Addr::UNSPECIFIED,
        h if h.eq_ignore_ascii_case("localhost") => Ipv4Addr::LOCALHOST,
        h => h.parse::<Ipv4Addr>().map_err(|_| not_found())?,
    };
    Ok((SocketAddr::new(IpAddr::V4(ip), port), ()))
}

pub(super) fn parse_listen(d: &Directive, file: &str) -> Result<ListenSpec, ConfigError> {
    let (addr, last_port) = parse_listen_addr(d, file, &d.args[0])?;
    let unix = d.args[0].strip_prefix("unix:").map(PathBuf::from);
    let mut spec = ListenSpec {
        addr,
        default_server: false,
        opts: ListenOpts {
            unix,
            ..ListenOpts::default()
        },
        opts_set: false,
        ssl: false,
        proxy_protocol: false,
        http2: false,
        last_port,
    };
    for p in &d.args[1..] {
        let (key, val) = match p.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (p.as_str(), None),
        };
        let o = &mut spec.opts;
        match (key, val) {
            ("default_server" | "default", None) => spec.default_server = true,
            ("ssl", None) => {
                spec.ssl = true;
                continue;
            }
            ("proxy_protocol", None) => {
                spec.proxy_protocol = true;
                continue;
            }
            ("http2", None) => {
                spec.http2 = true;
                continue;
            }
            ("reuseport", None) => o.reuseport = true,
            ("udp", None) => o.udp = true,
            ("quic", None) => {
                o.udp = true;
                o.quic = true;
            }
            ("deferred", None) => o.deferred = true,
            ("shards", Some("auto")) => o.shards = Some(Shards::Auto),
            ("shards", Some(v)) => {
                let n = v
                    .parse::<usize>()
                    .ok()
                    .filter(|n| (1..=MAX_SHARDS).contains(n))
                    .ok_or_else(|| derr(d, file, format!("invalid shards \"{v}\"")))?;
                o.shards = Some(Shards::Count(n));
            }
            ("bind", None) => o.bind = true,
            ("backlog", Some(v)) => {
                o.backlog = v
                    .parse::<i32>()
                    .ok()
                    .filter(|n| *n != 0 && (*n > 0 || *n == -1))
                    .ok_or_else(|| derr(d, file, format!("invalid backlog \"{v}\"")))?;
                o.backlog_set = true;
            }
            ("rcvbuf", Some(v)) => {
                o.rcvbuf = Some(
                    parse_size(v).ok_or_else(|| derr(d, file, format!("invalid rcvbuf \"{v}\"")))?
                        as usize,
                );
            }
            ("sndbuf", Some(v)) => {
                o.sndbuf = Some(
                    parse_size(v).ok_or_else(|| derr(d, file, format!("invalid sndbuf \"{v}\"")))?
                        as usize,
                );
            }
            ("ipv6only", Some(v)) => {
                o.ipv6only = match v {
                    "on" => true,
                    "off" => false,
                    _ => return Err(derr(d, file, format!("invalid ipv6only flags \"{v}\""))),
                };
            }
            ("so_keepalive", Some(v)) => {
                o.so_keepalive = Some(match v {
                    "on" => SoKeepalive::On,
                    "off" => SoKeepalive::Off,
                    // `idle:intvl:cnt`: shard keeps only "on".
                    _ if v.contains(':')
                        && v.split(':')
                            .all(|x| x.is_empty() || parse_time_ms(x).is_some()) =>
                    {
                        SoKeepalive::On
                    }
                    _ => {
                        return Err(derr(
                            d,
                            file,
                            format!("invalid so_keepalive value: \"{p}\""),
                        ))
                    }
                });
            }
            _ => return Err(derr(d, file, format!("invalid parameter \"{p}\""))),
        }
        if key != "default_server" && key != "default" {
            spec.opts_set = true;
        }
    }
    if spec.opts.shards.is_some() && !spec.opts.reuseport {
        return Err(derr(
            d,
            file,
            "the \"shards\" parameter requires \"reuseport\"".to_string(),
        ));
    }
    Ok(spec)
}

pub(super) fn add_listen(
    listeners: &mut Vec<ListenerP>,
    server: usize,
    spec: &ListenSpec,
    at: Place,
) -> Result<(), ConfigError> {
    let here = |msg: String| ConfigError::new(format!("{msg} in {}", where_(&at.file, at.line)));
    // A `quic` address is a datagram socket beside the TCP one of the same address and port.
    let Some(l) = listeners
        .iter_mut()
        .find(|l| l.addr == spec.addr && l.opts.quic == spec.opts.quic)
    else {
        let mut opts = spec.opts.clone();
        // QUIC is always TLS: its servers' certificates are loaded for it as for `ssl`.
        opts.ssl = spec.ssl || spec.opts.quic;
        opts.proxy_protocol = spec.proxy_protocol;
        opts.http2 = spec.http2;
        listeners.push(ListenerP {
            addr: spec.addr,
            opts,
            opts_place: spec.opts_set.then(|| at.clone()),
            first_place: at.clone(),
            servers: vec![server],
            default_server: spec.default_server.then_some(server),
        });
        return Ok(());
    };
    if l.servers.contains(&server) {
        return Err(here(format!("a duplicate listen {}", spec.addr)));
    }
    if spec.opts_set {
        match &l.opts_place {
            Some(first)
                if ListenOpts {
                    ssl: false,
                    proxy_protocol: false,
                    http2: false,
                    ..l.opts.clone()
                } != spec.opts =>
            {
                return Err(ConfigError::new(format!(
                    "duplicate listen options for {} in {} (first given in {})",
                    spec.addr,
                    where_(&at.file, at.line),
                    where_(&first.file, first.line)
                )));
            }
            Some(_) => {}
            None => {
                let (ssl, pp, h2) = (l.opts.ssl, l.opts.proxy_protocol, l.opts.http2);
                l.opts = spec.opts.clone();
                l.opts.ssl = ssl;
                l.opts.proxy_protocol = pp;
                l.opts.http2 = h2;
                l.opts_place = Some(at.clone());
            }
        }
    }
    l.opts.ssl |= spec.ssl;
    l.opts.proxy_protocol |= spec.proxy_protocol;
    l.opts.http2 |= spec.http2;
    if spec.default_server {
        if l.default_server.is_some() {
            return Err(here(format!(
                "a duplicate default server for {}",
                spec.addr
            )));
        }
        l.default_server = Some(server);
    }
    l.servers.push(server);
    Ok(())
}
