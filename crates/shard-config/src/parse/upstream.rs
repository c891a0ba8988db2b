//! `upstream` blocks of both modules, peers (`server ADDR [weight=N] ...`), address
//! resolution at load time, and the upstream and peer defaults (once).

#[allow(unused_imports)]
use super::*;

/// `upstream NAME { ... }` of `stream` (`ctx` [`Ctx::Upstream`]) or `http`
/// ([`Ctx::HttpUpstream`]: `keepalive*` allowed, a `server` without a port gets 80 and names
/// compare without case, as nginx). `existing`: the blocks already read.
pub(super) fn read_upstream(
    env: &Env,
    d: &Directive,
    file: &str,
    ctx: Ctx,
    existing: &[UpstreamConf],
) -> Result<UpstreamConf, ConfigError> {
    let http = ctx == Ctx::HttpUpstream;
    let name = d.args[0].clone();
    let same = |u: &UpstreamConf| {
        if http {
            u.name.eq_ignore_ascii_case(&name)
        } else {
            u.name == name
        }
    };
    if existing.iter().any(same) {
        return Err(derr(d, file, format!("duplicate upstream \"{name}\"")));
    }
    let mut u = UpstreamP {
        http,
        peers: Vec::new(),
        keepalive: None,
        keepalive_timeout_ms: None,
        keepalive_requests: None,
        keepalive_time_ms: None,
        balance: None,
    };
    env.walk(block(d), file, ctx, &mut Target::Upstream(&mut u))?;
    if u.peers.is_empty() {
        return Err(derr(d, file, "no servers are inside upstream"));
    }
    Ok(finish_upstream(name, place(d, file), u))
}

pub(super) fn upstream_server(u: &mut UpstreamP, d: &Directive, file: &str) -> R {
    let default_port = u.http.then_some(80);
    u.peers
        .extend(parse_upstream_server(d, file, default_port)?);
    Ok(())
}

/// `least_conn`, `ip_hash`, `hash KEY [consistent]`: one balancing method per upstream.
pub(super) fn upstream_balance(u: &mut UpstreamP, d: &Directive, file: &str) -> R {
    let b = match d.name.as_str() {
        "least_conn" => Balance::LeastConn,
        "ip_hash" => Balance::IpHash,
        "random" => match d
            .args
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>()
            .as_slice()
        {
            [] => Balance::Random { two: false },
            ["two"] | ["two", "least_conn"] => Balance::Random { two: true },
            [.., p] => return Err(derr(d, file, format!("invalid parameter \"{p}\""))),
        },
        _ => {
            let consistent = match d.args.get(1).map(String::as_str) {
                None => false,
                Some("consistent") => true,
                Some(p) => return Err(derr(d, file, format!("invalid parameter \"{p}\""))),
            };
            Balance::Hash {
                key: if u.http {
                    parse_header_value(d, file, a0(d))?
                } else {
                    super::stream::stream_value(d, file, a0(d))?
                },
                consistent,
            }
        }
    };
    if u.balance.is_some() {
        return Err(derr(d, file, "load balancing method redefined"));
    }
    u.balance = Some(b);
    Ok(())
}

pub(super) fn upstream_keepalive(u: &mut UpstreamP, d: &Directive, file: &str) -> R {
    let n = num::<usize>(d, file, a0(d))?;
    if n == 0 {
        return Err(invalid(d, file, a0(d)));
    }
    once(&mut u.keepalive, n, d, file)
}

pub(super) fn upstream_keepalive_timeout(u: &mut UpstreamP, d: &Directive, file: &str) -> R {
    let t = time(d, file, a0(d))?;
    once(&mut u.keepalive_timeout_ms, t, d, file)
}

pub(super) fn upstream_keepalive_time(u: &mut UpstreamP, d: &Directive, file: &str) -> R {
    let t = time(d, file, a0(d))?;
    once(&mut u.keepalive_time_ms, t, d, file)
}

pub(super) fn upstream_keepalive_requests(u: &mut UpstreamP, d: &Directive, file: &str) -> R {
    let n = num::<u64>(d, file, a0(d))?;
    once(&mut u.keepalive_requests, n, d, file)
}

/// Resolves an upstream address `HOST:PORT` / `[V6]:PORT` (at configuration time, as nginx).
/// Without a port, `default_port` applies (80 in http), else it is an error. The error is
/// the message without its place (nginx words these `... in upstream "ADDR"`).
pub(super) fn resolve_upstream(
    a: &str,
    default_port: Option<u16>,
) -> Result<Vec<SocketAddr>, String> {
    if a.starts_with("unix:") {
        return Err(format!(
            "unix domain sockets are not supported in upstream \"{a}\""
        ));
    }
    let no_port = || match default_port {
        Some(p) => Ok(p),
        None => Err(format!("no port in upstream \"{a}\"")),
    };
    let port_of = |p: &str| match p.parse::<u16>() {
        Ok(n) if n > 0 && is_digits(p) => Ok(n),
        _ => Err(format!("invalid port in upstream \"{a}\"")),
    };
    let (host, port) = if let Some(rest) = a.strip_prefix('[') {
        let Some(end) = rest.find(']') else {
            return Err(format!("invalid IPv6 address in upstream \"{a}\""));
        };
        match rest[end + 1..].strip_prefix(':') {
            Some(p) => (&rest[..end], port_of(p)?),
            None if rest[end + 1..].is_empty() => (&rest[..end], no_port()?),
            None => return Err(format!("invalid port in upstream \"{a}\"")),
        }
    } else {
        match a.rsplit_once(':') {
            Some((h, p)) => (h, port_of(p)?),
            None => (a, no_port()?),
        }
    };
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(vec![SocketAddr::new(ip, port)]);
    }
    let not_found = || format!("host not found in upstream \"{a}\"");
    if host.is_empty() || host.contains(['/', ' ']) {
        return Err(not_found());
    }
    use std::net::ToSocketAddrs;
    let mut v: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map_err(|_| not_found())?
        .collect();
    v.dedup();
    if v.is_empty() {
        return Err(not_found());
    }
    Ok(v)
}

/// `server ADDR [weight=N] [max_fails=N] [fail_timeout=T] [max_conns=N] [backup] [down];` in
/// `upstream`.
/// `default_port`: the port of an `ADDR` without one (80 in http, none in stream).
pub(super) fn parse_upstream_server(
    d: &Directive,
    file: &str,
    default_port: Option<u16>,
) -> Result<Vec<PeerConf>, ConfigError> {
    let name = d.args[0].clone();
    let unix = match name.strip_prefix("unix:") {
        Some(path) if path.starts_with('/') => Some(PathBuf::from(path)),
        Some(_) => return Err(derr(d, file, format!("invalid address \"{name}\""))),
        None => None,
    };
    let resolve = d.args[1..].iter().any(|a| a == "resolve");
    if resolve && (default_port.is_none() || unix.is_some()) {
        return Err(derr(
            d,
            file,
            "\"resolve\" is supported by shard for host names of http upstreams only",
        ));
    }
    let addrs = match &unix {
        // A stream peer is known by a stand-in address (its failures are counted by it);
        // http's by its index.
        Some(p) if default_port.is_none() => vec![crate::unix_stand_in(p)],
        Some(_) => vec![SocketAddr::from(([0, 0, 0, 0], 0))],
        // A name the workers resolve at run time may have no answer yet: its peer waits,
        // down, for the first one (nginx starts such an upstream empty).
        None if resolve => match resolve_upstream(&name, default_port) {
            Ok(a) if !a.is_empty() => a,
            Ok(_) | Err(_) => {
                let port = name
                    .rsplit_once(':')
                    .and_then(|(_, p)| p.parse::<u16>().ok())
                    .or(default_port)
                    .unwrap_or(80);
                vec![SocketAddr::from(([0, 0, 0, 0], port))]
            }
        },
        None => resolve_upstream(&name, default_port).map_err(|m| derr(d, file, m))?,
    };
    let unresolved = resolve && addrs.iter().all(|a| a.ip().is_unspecified());
    let Some(&first) = addrs.first() else {
        return Err(derr(
            d,
            file,
            format!("host not found in upstream \"{name}\""),
        ));
    };
    let mut peer = default_peer(first);
    for p in &d.args[1..] {
        let bad = || derr(d, file, format!("invalid parameter \"{p}\""));
        match p.split_once('=') {
            Some(("weight", v)) => {
                peer.weight = v
                    .parse::<u32>()
                    .ok()
                    .filter(|n| *n > 0 && is_digits(v))
                    .ok_or_else(bad)?;
            }
            Some(("max_fails", v)) => {
                peer.max_fails = v
                    .parse::<u32>()
                    .ok()
                    .filter(|_| is_digits(v))
                    .ok_or_else(bad)?;
            }
            Some(("fail_timeout", v)) => peer.fail_timeout_ms = parse_time_ms(v).ok_or_else(bad)?,
            Some(("max_conns", v)) => {
                peer.max_conns = v
                    .parse::<u32>()
                    .ok()
                    .filter(|_| is_digits(v))
                    .ok_or_else(bad)?;
            }
            None if p == "backup" => peer.backup = true,
            None if p == "down" => peer.down = true,
            None if p == "resolve" => {}
            _ => return Err(bad()),
        }
    }
    if resolve {
        peer.resolve = Some(name.clone());
        peer.down |= unresolved;
    }
    Ok(addrs
        .into_iter()
        .map(|addr| PeerConf {
            addr,
            unix: unix.clone(),
            name: if addr.to_string() == name || unix.is_some() {
                name.clone()
            } else {
                addr.to_string()
            },
            ..peer.clone()
        })
        .collect())
}

/// A peer with nginx's defaults: `weight=1 max_fails=1 fail_timeout=10s`. The one place these
/// defaults live.
pub(super) fn default_peer(addr: SocketAddr) -> PeerConf {
    PeerConf {
        addr,
        unix: None,
        name: addr.to_string(),
        weight: 1,
        max_fails: 1,
        fail_timeout_ms: 10_000,
        max_conns: 0,
        backup: false,
        down: false,
        resolve: None,
    }
}

/// An upstream block's defaults (`keepalive` off, `keepalive_timeout 60s`,
/// `keepalive_requests 1000`), in one place.
pub(super) fn finish_upstream(name: String, place: Place, u: UpstreamP) -> UpstreamConf {
    UpstreamConf {
        name,
        place,
        peers: u.peers,
        keepalive: u.keepalive.unwrap_or(0),
        keepalive_timeout_ms: u.keepalive_timeout_ms.unwrap_or(60_000),
        keepalive_requests: u.keepalive_requests.unwrap_or(1000),
        keepalive_time_ms: u.keepalive_time_ms.unwrap_or(3_600_000),
        balance: u.balance.unwrap_or_default(),
        resolver: None,
    }
}

/// The one-group upstream of a `proxy_pass` naming an address: nginx's defaults per peer.
pub(super) fn implicit_upstream(name: String, at: Place, addrs: Vec<SocketAddr>) -> UpstreamConf {
    let u = UpstreamP {
        http: false,
        peers: addrs.into_iter().map(default_peer).collect(),
        keepalive: None,
        keepalive_timeout_ms: None,
        keepalive_requests: None,
        keepalive_time_ms: None,
        balance: None,
    };
    finish_upstream(name, at, u)
}
