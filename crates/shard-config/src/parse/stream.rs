//! The stream module: its block state, the handlers of `stream`, `server` and the stream
//! `proxy_*` settings, and the merge into [`StreamConf`].

#[allow(unused_imports)]
use super::*;

/// The `proxy_*` settings of the stream module, merged stream -> server.
#[derive(Default, Clone)]
pub(super) struct StreamSettings {
    pub(super) ssl: super::http::SslP,
    pub(super) proxy_ssl: super::http::ProxySslP,
    pub(super) connect_timeout_ms: Option<u64>,
    pub(super) timeout_ms: Option<u64>,
    /// `resolver` and `resolver_timeout`: names `proxy_pass $var` renders.
    pub(super) resolver: Option<ResolverConf>,
    pub(super) resolver_timeout_ms: Option<u64>,
    pub(super) buffer_size: Option<usize>,
    /// `proxy_protocol on|off`: a PROXY protocol v1 header to the upstream.
    pub(super) proxy_protocol: Option<bool>,
    /// `proxy_protocol_timeout`: for a `listen ... proxy_protocol` header. Default 30 s.
    pub(super) proxy_protocol_timeout_ms: Option<u64>,
    /// `proxy_next_upstream on|off`. Default on.
    pub(super) next_upstream: Option<bool>,
    /// `proxy_next_upstream_tries N` (0: no limit) and `proxy_next_upstream_timeout T`.
    pub(super) next_upstream_tries: Option<u32>,
    pub(super) next_upstream_timeout_ms: Option<u64>,
    /// `proxy_responses`, `proxy_requests` (UDP).
    pub(super) responses: Option<u32>,
    pub(super) requests: Option<u32>,
    /// `allow`/`deny` of this level (a level with any replaces its parent's).
    pub(super) access_rules: Option<Vec<AccessRule>>,
    /// `access_log`s of this level, and whether it said `off` (a level with any replaces
    /// its parent's, as in http).
    pub(super) access_log: Option<(bool, Vec<AccessLog>)>,
    /// `error_log`s of this level.
    pub(super) error_log: Option<Vec<ErrorLog>>,
    /// `ssl_preread`, `preread_buffer_size`, `preread_timeout`.
    pub(super) ssl_preread: Option<bool>,
    pub(super) preread_buffer_size: Option<usize>,
    pub(super) preread_timeout_ms: Option<u64>,
    /// `set_real_ip_from` of this level (a level with any replaces its parent's).
    pub(super) real_ip_from: Option<Vec<AccessRule>>,
    /// `limit_conn ZONE N` of this level (zone by name, where, the number), and
    /// `limit_conn_dry_run`.
    pub(super) limit_conn: Option<Vec<(String, Place, u64)>>,
    pub(super) limit_conn_dry_run: Option<bool>,
    /// `proxy_bind` (`Some(None)`: `off`).
    pub(super) bind: Option<Option<Vec<Part>>>,
    pub(super) bind_transparent: Option<bool>,
    /// `proxy_download_rate`, `proxy_upload_rate`: bytes per second, 0 unlimited.
    pub(super) download_rate: Option<SizeValue>,
    pub(super) upload_rate: Option<SizeValue>,
    pub(super) half_close: Option<bool>,
    pub(super) ssl_handshake_timeout_ms: Option<u64>,
    /// `ssl_alpn PROTOCOL ...`.
    pub(super) alpn: Option<Vec<String>>,
}

pub(super) struct StreamServerP {
    pub(super) place: Place,
    pub(super) listen: Vec<SocketAddr>,
    /// The `proxy_pass` argument and where it was written.
    pub(super) pass: Option<(String, Place)>,
    /// `return VALUE` (`ngx_stream_return_module`).
    pub(super) ret: Option<Vec<Part>>,
    /// `set $NAME VALUE` (`ngx_stream_set_module`), in order.
    pub(super) sets: Vec<(String, Vec<Part>)>,
    pub(super) settings: StreamSettings,
}

#[derive(Default)]
pub(super) struct StreamP {
    pub(super) settings: StreamSettings,
    pub(super) geoip: GeoipConf,
    pub(super) upstreams: Vec<UpstreamConf>,
    pub(super) servers: Vec<StreamServerP>,
    pub(super) listeners: Vec<ListenerP>,
    /// `map`, `split_clients` and `geo` of the stream block.
    pub(super) maps: Vec<MapConf>,
    pub(super) limit_zones: Vec<LimitZone>,
}

pub(super) fn stream_upstream(env: &Env, sp: &mut StreamP, d: &Directive, file: &str) -> R {
    let u = read_upstream(env, d, file, Ctx::Upstream, &sp.upstreams)?;
    sp.upstreams.push(u);
    Ok(())
}

pub(super) fn stream_server(env: &Env, sp: &mut StreamP, d: &Directive, file: &str) -> R {
    let idx = sp.servers.len();
    let mut s = StreamServerP {
        place: place(d, file),
        listen: Vec::new(),
        pass: None,
        ret: None,
        sets: Vec::new(),
        settings: StreamSettings::default(),
    };
    let cx = StreamServerCx {
        s: &mut s,
        listeners: &mut sp.listeners,
        idx,
    };
    env.walk(
        block(d),
        file,
        Ctx::StreamServer,
        &mut Target::StreamServer(cx),
    )?;
    if s.listen.is_empty() {
        return Err(derr(d, file, "no \"listen\" is defined for server"));
    }
    if s.pass.is_none() && s.ret.is_none() {
        return Err(derr(d, file, "no handler for server"));
    }
    sp.servers.push(s);
    Ok(())
}

pub(super) fn stream_server_listen(cx: &mut StreamServerCx<'_>, d: &Directive, file: &str) -> R {
    let spec = parse_listen(d, file)?;
    if spec.opts.quic {
        return Err(derr(d, file, "invalid parameter \"quic\""));
    }
    if spec.default_server {
        return Err(derr(d, file, "invalid parameter \"default_server\""));
    }
    let mut opts = spec.opts.clone();
    opts.ssl = spec.ssl;
    opts.proxy_protocol = spec.proxy_protocol;
    // A port range is a `listen` per port, as nginx expands it.
    for addr in spec.addrs() {
        if cx.listeners.iter().any(|l| l.addr == addr) {
            return Err(derr(d, file, format!("a duplicate listen {addr}")));
        }
        cx.listeners.push(ListenerP {
            addr,
            opts: opts.clone(),
            opts_place: spec.opts_set.then(|| place(d, file)),
            first_place: place(d, file),
            servers: vec![cx.idx],
            default_server: None,
        });
        cx.s.listen.push(addr);
    }
    Ok(())
}

pub(super) fn stream_server_proxy_pass(
    cx: &mut StreamServerCx<'_>,
    d: &Directive,
    file: &str,
) -> R {
    if cx.s.ret.is_some() {
        return Err(derr(d, file, "\"proxy_pass\" directive is duplicate"));
    }
    if a0(d).contains('$') {
        // Checked now (unknown variables); rendered per session.
        stream_value(d, file, a0(d))?;
    }
    let pass = (a0(d).to_string(), place(d, file));
    once(&mut cx.s.pass, pass, d, file)
}

/// `return VALUE`: the text (variables allowed) sent to the client, then the close.
pub(super) fn stream_server_return(cx: &mut StreamServerCx<'_>, d: &Directive, file: &str) -> R {
    if cx.s.pass.is_some() {
        return Err(derr(d, file, "\"return\" directive is duplicate"));
    }
    let v = stream_value(d, file, a0(d))?;
    once(&mut cx.s.ret, v, d, file)
}

/// `set $NAME VALUE` in a stream server: evaluated in order when the session begins.
pub(super) fn stream_server_set(cx: &mut StreamServerCx<'_>, d: &Directive, file: &str) -> R {
    let Some(name) = d.args[0].strip_prefix('$').filter(|n| !n.is_empty()) else {
        return Err(derr(
            d,
            file,
            format!("invalid variable name \"{}\"", d.args[0]),
        ));
    };
    let name = name.to_ascii_lowercase();
    if !matches!(stream_variable(d, file, &name)?, Var::User(_)) {
        return Err(derr(
            d,
            file,
            format!("the \"{name}\" variable is built in: shard cannot set it"),
        ));
    }
    let value = stream_value(d, file, &d.args[1])?;
    cx.s.sets.push((name, value));
    Ok(())
}

/// `tcp_nodelay`: checked and accepted silently, shard setting `TCP_NODELAY` on both sockets
/// in any case (nginx's default).
pub(super) fn stream_flag_as_is(_: &mut StreamSettings, d: &Directive, file: &str) -> R {
    flag(d, file, a0(d)).map(|_| ())
}

/// `proxy_half_close on | off`.
pub(super) fn stream_half_close(s: &mut StreamSettings, d: &Directive, file: &str) -> R {
    let v = flag(d, file, a0(d))?;
    once(&mut s.half_close, v, d, file)
}

/// `proxy_next_upstream on | off`.
pub(super) fn stream_proxy_next_upstream(s: &mut StreamSettings, d: &Directive, file: &str) -> R {
    let v = flag(d, file, a0(d))?;
    once(&mut s.next_upstream, v, d, file)
}

/// A stream value: text and the stream module's variables (see [`stream_variable`]).
pub(super) fn stream_value(d: &Directive, file: &str, v: &str) -> Result<Vec<Part>, ConfigError> {
    super::http::parse_value_with(d, file, v, &mut |name| stream_variable(d, file, name))
}

/// The variables of nginx's stream core, upstream and PROXY protocol modules that shard has;
/// any other name is nginx's `unknown "name" variable`.
fn stream_variable(d: &Directive, file: &str, name: &str) -> Result<Var, ConfigError> {
    let lower = name.to_ascii_lowercase();
    if let Some(v) = Var::tls(&lower) {
        return Ok(v);
    }
    if let Some(g) = lower.strip_prefix("geoip_").and_then(GeoipVar::by_name) {
        return Ok(Var::Geoip(g));
    }
    Ok(match lower.as_str() {
        "protocol" => Var::Protocol,
        "bytes_received" => Var::BytesReceived,
        "session_time" => Var::SessionTime,
        "upstream_bytes_sent" => Var::UpstreamBytesSent,
        "upstream_bytes_received" => Var::UpstreamBytesReceived,
        "upstream_session_time" => Var::UpstreamSessionTime,
        "upstream_first_byte_time" => Var::UpstreamFirstByteTime,
        "ssl_preread_protocol" => Var::SslPrereadProtocol,
        "realip_remote_addr" => Var::RealipRemoteAddr,
        "realip_remote_port" => Var::RealipRemotePort,
        _ if !lower.is_empty() && lower.len() <= 2 && lower.bytes().all(|b| b.is_ascii_digit()) => {
            Var::Capture(lower.parse().unwrap_or(0))
        }
        "limit_conn_status" => Var::LimitConnStatus,
        "ssl_preread_server_name" => Var::SslPrereadServerName,
        "ssl_preread_alpn_protocols" => Var::SslPrereadAlpnProtocols,
        "remote_addr"
        | "remote_port"
        | "binary_remote_addr"
        | "server_addr"
        | "server_port"
        | "bytes_sent"
        | "status"
        | "connection"
        | "hostname"
        | "msec"
        | "nginx_version"
        | "pid"
        | "time_iso8601"
        | "time_local"
        | "upstream_addr"
        | "upstream_connect_time"
        | "proxy_protocol_addr"
        | "proxy_protocol_port"
        | "proxy_protocol_server_addr"
        | "proxy_protocol_server_port" => super::http::variable(d, file, &lower)?,
        _ if lower.starts_with("proxy_protocol_tlv_") => super::http::variable(d, file, &lower)?,
        // A stream `map`/`geo`/`split_clients`, which may come later: checked by
        // `finish_stream`.
        _ => {
            STREAM_USED.with(|u| {
                u.borrow_mut()
                    .push((lower.clone(), file.to_string(), d.line))
            });
            Var::User(lower)
        }
    })
}

thread_local! {
    /// Names a stream value used that are not built in, with where (see `stream_variable`).
    static STREAM_USED: std::cell::RefCell<Vec<(String, String, usize)>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// Starts a parse: forgets the names of any earlier one.
pub(super) fn reset_stream_names() {
    STREAM_USED.with(|u| u.borrow_mut().clear());
}

fn stream_ns(sp: &mut StreamP) -> super::script::VarNs<'_> {
    super::script::VarNs {
        maps: &mut sp.maps,
        value: stream_value,
        http: false,
    }
}

/// `map`, `split_clients`, `geo` in `stream` (`ngx_stream_map_module` and the others): as
/// in http, with the stream's variables.
pub(super) fn stream_map(env: &Env, sp: &mut StreamP, d: &Directive, file: &str) -> R {
    super::script::map_block(env, &mut stream_ns(sp), d, file)
}

pub(super) fn stream_split_clients(env: &Env, sp: &mut StreamP, d: &Directive, file: &str) -> R {
    super::script::split_clients_block(env, &mut stream_ns(sp), d, file)
}

pub(super) fn stream_geo(env: &Env, sp: &mut StreamP, d: &Directive, file: &str) -> R {
    super::script::geo_block(env, &mut stream_ns(sp), d, file)
}

/// `log_format NAME [escape=...] STRING ...` in `stream`: the stream's own formats.
pub(super) fn stream_log_format(env: &Env, _: &mut StreamP, d: &Directive, file: &str) -> R {
    super::http::define_log_format(&env.stream_log_formats, d, file, &|v| {
        stream_value(d, file, v)
    })
}

/// `access_log PATH FORMAT [buffer=SIZE] [flush=TIME] [if=CONDITION] | off` in `stream`
/// and its servers: the format is required (the stream module has no `combined`).
pub(super) fn stream_access_log(env: &Env, s: &mut StreamSettings, d: &Directive, file: &str) -> R {
    let entry = s.access_log.get_or_insert_with(|| (false, Vec::new()));
    match super::http::parse_access_log(env, &env.stream_log_formats, None, d, file, &|v| {
        stream_value(d, file, v)
    })? {
        None => entry.0 = true,
        Some(al) => entry.1.push(al),
    }
    Ok(())
}

/// `error_log` in `stream` and its servers (see http's).
pub(super) fn stream_error_log(env: &Env, s: &mut StreamSettings, d: &Directive, file: &str) -> R {
    let l = super::values::parse_error_log(d, file, &env.prefix)?;
    env.note_error_log(&l);
    s.error_log.get_or_insert_with(Vec::new).push(l);
    Ok(())
}

/// The error logs of a stream server: its own level's, else the stream block's.
fn stream_error_logs(s: &StreamSettings, top: &StreamSettings) -> Option<Arc<Vec<ErrorLog>>> {
    s.error_log
        .as_ref()
        .or(top.error_log.as_ref())
        .map(|l| Arc::new(l.clone()))
}

/// The access logs a stream server writes: its own level's, else the stream block's.
fn stream_logs(s: &StreamSettings, top: &StreamSettings) -> Vec<AccessLog> {
    match s.access_log.as_ref().or(top.access_log.as_ref()) {
        Some((false, logs)) => logs.clone(),
        _ => Vec::new(),
    }
}

/// `allow`/`deny` (`ngx_stream_access_module`), in order.
pub(super) fn stream_access_rule(
    env: &Env,
    s: &mut StreamSettings,
    d: &Directive,
    file: &str,
) -> R {
    let rules = http_rules(env, d, file, super::http::set_access_rule, |t| {
        t.access_rules
    })?;
    s.access_rules.get_or_insert_with(Vec::new).extend(rules);
    Ok(())
}

/// The address rules an http handler (`allow`/`deny`, `set_real_ip_from`) reads from `d`,
/// taken out of the http settings it fills: the stream's directives are the same text.
fn http_rules(
    env: &Env,
    d: &Directive,
    file: &str,
    set: fn(&Env, &mut super::http::Settings, &Directive, &str) -> R,
    take: fn(super::http::Settings) -> Option<Vec<AccessRule>>,
) -> Result<Vec<AccessRule>, ConfigError> {
    let mut tmp = super::http::Settings::default();
    set(env, &mut tmp, d, file)?;
    Ok(take(tmp).unwrap_or_default())
}

pub(super) fn stream_proxy_connect_timeout(s: &mut StreamSettings, d: &Directive, file: &str) -> R {
    let t = time(d, file, a0(d))?;
    once(&mut s.connect_timeout_ms, t, d, file)
}

/// `proxy_bind ADDRESS[:PORT] | off` in stream (variables: the stream's).
pub(super) fn stream_proxy_bind(s: &mut StreamSettings, d: &Directive, file: &str) -> R {
    if d.args.len() > 1 {
        // The same parameters as http's (`transparent`; unknown ones refused).
        let (_, transparent) = super::http::parse_bind(d, file)?;
        s.bind_transparent = Some(transparent);
    }
    let v = a0(d);
    let b = if v == "off" {
        None
    } else {
        let parts = stream_value(d, file, v)?;
        if parts.iter().all(|p| matches!(p, Part::Lit(_))) && crate::parse_bind_addr(v).is_none() {
            return Err(derr(d, file, format!("invalid address \"{v}\"")));
        }
        Some(parts)
    };
    once(&mut s.bind, b, d, file)
}

/// `proxy_download_rate RATE` and `proxy_upload_rate RATE`: a size per second, 0 unlimited.
pub(super) fn stream_proxy_rate(s: &mut StreamSettings, d: &Directive, file: &str) -> R {
    let a = a0(d);
    let v = if has_variables(a) {
        SizeValue::Vars(stream_value(d, file, a)?)
    } else {
        SizeValue::Fixed(size(d, file, a)?)
    };
    let slot = if d.name == "proxy_download_rate" {
        &mut s.download_rate
    } else {
        &mut s.upload_rate
    };
    once(slot, v, d, file)
}

/// `ssl_alpn PROTOCOL ...` (nginx 1.21.4): what a `listen ... ssl` stream server offers.
pub(super) fn stream_ssl_alpn(s: &mut StreamSettings, d: &Directive, file: &str) -> R {
    for a in &d.args {
        if a.is_empty() || a.len() > 255 {
            return Err(invalid(d, file, a));
        }
    }
    once(&mut s.alpn, d.args.clone(), d, file)
}

pub(super) fn stream_ssl_handshake_timeout(s: &mut StreamSettings, d: &Directive, file: &str) -> R {
    let t = time(d, file, a0(d))?;
    once(&mut s.ssl_handshake_timeout_ms, t, d, file)
}

/// `proxy_responses N`, `proxy_requests N` (UDP sessions).
pub(super) fn stream_udp_counts(s: &mut StreamSettings, d: &Directive, file: &str) -> R {
    let n = num::<u32>(d, file, a0(d))?;
    if d.name == "proxy_responses" {
        once(&mut s.responses, n, d, file)
    } else {
        once(&mut s.requests, n, d, file)
    }
}

/// `resolver ADDRESS ...` and `resolver_timeout TIME` (stream).
pub(super) fn stream_resolver(s: &mut StreamSettings, d: &Directive, file: &str) -> R {
    if d.name == "resolver" {
        let r = super::http::parse_resolver(d, file)?;
        once(&mut s.resolver, r, d, file)
    } else {
        let t = time(d, file, a0(d))?;
        once(&mut s.resolver_timeout_ms, t, d, file)
    }
}

/// `proxy_next_upstream_tries N`, `proxy_next_upstream_timeout TIME` (stream).
pub(super) fn stream_next_upstream_limit(s: &mut StreamSettings, d: &Directive, file: &str) -> R {
    if d.name == "proxy_next_upstream_tries" {
        let n = num::<u32>(d, file, a0(d))?;
        once(&mut s.next_upstream_tries, n, d, file)
    } else {
        let t = time(d, file, a0(d))?;
        once(&mut s.next_upstream_timeout_ms, t, d, file)
    }
}

pub(super) fn stream_proxy_timeout(s: &mut StreamSettings, d: &Directive, file: &str) -> R {
    let t = time(d, file, a0(d))?;
    once(&mut s.timeout_ms, t, d, file)
}

pub(super) fn stream_proxy_protocol(s: &mut StreamSettings, d: &Directive, file: &str) -> R {
    let v = flag(d, file, a0(d))?;
    once(&mut s.proxy_protocol, v, d, file)
}

pub(super) fn stream_proxy_protocol_timeout(
    s: &mut StreamSettings,
    d: &Directive,
    file: &str,
) -> R {
    let t = time(d, file, a0(d))?;
    once(&mut s.proxy_protocol_timeout_ms, t, d, file)
}

pub(super) fn stream_proxy_buffer_size(s: &mut StreamSettings, d: &Directive, file: &str) -> R {
    let n = size(d, file, a0(d))?;
    if n == 0 || n > (1 << 30) {
        return Err(invalid(d, file, a0(d)));
    }
    once(&mut s.buffer_size, n as usize, d, file)
}

/// `limit_conn_zone KEY zone=NAME:SIZE` in stream (`ngx_stream_limit_conn_module`).
pub(super) fn stream_limit_conn_zone(_: &Env, sp: &mut StreamP, d: &Directive, file: &str) -> R {
    let key = stream_value(d, file, a0(d))?;
    let Some(v) = d.args[1].strip_prefix("zone=") else {
        return Err(derr(
            d,
            file,
            format!("invalid parameter \"{}\"", d.args[1]),
        ));
    };
    let (name, size) = super::http::zone_param(d, file, v)?;
    if sp.limit_zones.iter().any(|z| z.name == name) {
        return Err(derr(d, file, format!("duplicate zone \"{name}\"")));
    }
    sp.limit_zones.push(LimitZone {
        name,
        key,
        size,
        rate_milli: None,
        place: place(d, file),
    });
    Ok(())
}

/// `limit_conn ZONE N` in stream (repeatable; a level with any replaces its parent's).
pub(super) fn stream_limit_conn(s: &mut StreamSettings, d: &Directive, file: &str) -> R {
    let max: u64 = d.args[1].parse().ok().filter(|&n| n > 0).ok_or_else(|| {
        derr(
            d,
            file,
            format!("invalid number of connections \"{}\"", d.args[1]),
        )
    })?;
    s.limit_conn
        .get_or_insert_with(Vec::new)
        .push((a0(d).to_string(), place(d, file), max));
    Ok(())
}

/// `limit_conn_dry_run on | off` in stream.
pub(super) fn stream_limit_conn_dry_run(s: &mut StreamSettings, d: &Directive, file: &str) -> R {
    let v = flag(d, file, a0(d))?;
    once(&mut s.limit_conn_dry_run, v, d, file)
}

/// `set_real_ip_from ADDRESS | CIDR` in stream (`ngx_stream_realip_module`).
pub(super) fn stream_set_real_ip_from(
    env: &Env,
    s: &mut StreamSettings,
    d: &Directive,
    file: &str,
) -> R {
    let nets = http_rules(env, d, file, super::http::set_real_ip_from, |t| {
        t.real_ip_from
    })?;
    s.real_ip_from.get_or_insert_with(Vec::new).extend(nets);
    Ok(())
}

/// `ssl_preread on | off` (`ngx_stream_ssl_preread_module`).
pub(super) fn stream_ssl_preread(s: &mut StreamSettings, d: &Directive, file: &str) -> R {
    let v = flag(d, file, a0(d))?;
    once(&mut s.ssl_preread, v, d, file)
}

/// `preread_buffer_size SIZE` (16k).
pub(super) fn stream_preread_buffer_size(s: &mut StreamSettings, d: &Directive, file: &str) -> R {
    let n = size(d, file, a0(d))?;
    if n == 0 || n > (1 << 20) {
        return Err(invalid(d, file, a0(d)));
    }
    once(&mut s.preread_buffer_size, n as usize, d, file)
}

/// `preread_timeout TIME` (30s).
pub(super) fn stream_preread_timeout(s: &mut StreamSettings, d: &Directive, file: &str) -> R {
    let t = time(d, file, a0(d))?;
    once(&mut s.preread_timeout_ms, t, d, file)
}

/// Merges the stream block, resolves `proxy_pass` and appends the stream listeners to the
/// http ones (an address may serve one kind only).
pub(super) fn finish_stream(
    sp: StreamP,
    listeners: &mut Vec<Listener>,
) -> Result<StreamConf, ConfigError> {
    STREAM_USED.with(|u| {
        for (name, file, line) in u.borrow().iter() {
            let set = sp
                .servers
                .iter()
                .flat_map(|s| &s.sets)
                .any(|(n, _)| n == name);
            // A named group of a `map`'s expression is a variable too, as nginx's.
            let group = sp.maps.iter().flat_map(|m| &m.regexes).any(|(re, _)| {
                re.capture_names()
                    .iter()
                    .flatten()
                    .any(|n| n.eq_ignore_ascii_case(name))
            });
            if !set && !group && !sp.maps.iter().any(|m| &m.name == name) {
                return Err(err(file, *line, format!("unknown \"{name}\" variable")));
            }
        }
        Ok(())
    })?;
    let mut upstreams = sp.upstreams;
    let mut servers = Vec::with_capacity(sp.servers.len());
    for s in sp.servers {
        let preread = (
            s.settings
                .ssl_preread
                .or(sp.settings.ssl_preread)
                .unwrap_or(false),
            s.settings
                .preread_buffer_size
                .or(sp.settings.preread_buffer_size)
                .unwrap_or(16 * 1024),
            s.settings
                .preread_timeout_ms
                .or(sp.settings.preread_timeout_ms)
                .unwrap_or(30_000),
        );
        let mut limit_conn = Vec::new();
        let conns = s
            .settings
            .limit_conn
            .as_ref()
            .or(sp.settings.limit_conn.as_ref());
        for (name, at, max) in conns.into_iter().flatten() {
            let Some(zone) = sp.limit_zones.iter().position(|z| &z.name == name) else {
                return Err(err(
                    &at.file,
                    at.line,
                    format!("zero size shared memory zone \"{name}\""),
                ));
            };
            limit_conn.push(LimitConn { zone, max: *max });
        }
        let limit_conn_dry_run = s
            .settings
            .limit_conn_dry_run
            .or(sp.settings.limit_conn_dry_run)
            .unwrap_or(false);
        let real_ip_from = s
            .settings
            .real_ip_from
            .clone()
            .or_else(|| sp.settings.real_ip_from.clone())
            .unwrap_or_default();
        let alpn = s
            .settings
            .alpn
            .clone()
            .or_else(|| sp.settings.alpn.clone())
            .unwrap_or_default();
        let Some((target, at)) = s.pass.clone() else {
            // `return`: no upstream.
            let ssl_eff = super::http::SslEff::default()
                .merge(&sp.settings.ssl)
                .merge(&s.settings.ssl);
            let ssl = SslConf {
                certificates: ssl_eff.pairs()?,
                ..ssl_eff.conf.clone()
            };
            servers.push(StreamServerConf {
                ssl,
                proxy_ssl: None,
                place: s.place.clone(),
                listen: s.listen.clone(),
                upstream: usize::MAX,
                connect_timeout_ms: 60_000,
                timeout_ms: 600_000,
                buffer_size: 16 * 1024,
                proxy_protocol: false,
                proxy_protocol_timeout_ms: s
                    .settings
                    .proxy_protocol_timeout_ms
                    .or(sp.settings.proxy_protocol_timeout_ms)
                    .unwrap_or(30_000),
                next_upstream: true,
                next_upstream_tries: 0,
                next_upstream_timeout_ms: 0,
                responses: None,
                requests: 0,
                access_rules: s
                    .settings
                    .access_rules
                    .clone()
                    .or_else(|| sp.settings.access_rules.clone())
                    .unwrap_or_default(),
                ret: s.ret.clone(),
                sets: s.sets.clone(),
                access_logs: stream_logs(&s.settings, &sp.settings),
                error_logs: stream_error_logs(&s.settings, &sp.settings),
                ssl_preread: preread.0,
                preread_buffer_size: preread.1,
                preread_timeout_ms: preread.2,
                pass_vars: None,
                resolver: None,
                real_ip_from: real_ip_from.clone(),
                limit_conn: limit_conn.clone(),
                limit_conn_dry_run,
                bind: None,
                bind_transparent: false,
                download_rate: SizeValue::Fixed(0),
                upload_rate: SizeValue::Fixed(0),
                half_close: false,
                ssl_handshake_timeout_ms: s
                    .settings
                    .ssl_handshake_timeout_ms
                    .or(sp.settings.ssl_handshake_timeout_ms)
                    .unwrap_or(60_000),
                alpn: alpn.clone(),
            });
            continue;
        };
        let mut pass_vars = None;
        let upstream = match upstreams.iter().position(|u| u.name == target) {
            Some(i) => i,
            None if target.contains('$') => {
                let d = Directive {
                    name: "proxy_pass".into(),
                    args: vec![target.clone()],
                    line: at.line,
                    block: None,
                };
                pass_vars = Some(stream_value(&d, &at.file, &target)?);
                usize::MAX
            }
            None if target.starts_with("unix:") => {
                // `proxy_pass unix:/path`: one peer on a Unix-domain socket.
                let path = PathBuf::from(&target["unix:".len()..]);
                let mut u = implicit_upstream(
                    target.clone(),
                    at.clone(),
                    vec![crate::unix_stand_in(&path)],
                );
                u.peers[0].unix = Some(path);
                upstreams.push(u);
                upstreams.len() - 1
            }
            None => {
                let addrs =
                    resolve_upstream(&target, None).map_err(|m| err(&at.file, at.line, m))?;
                upstreams.push(implicit_upstream(target.clone(), at.clone(), addrs));
                upstreams.len() - 1
            }
        };
        let get = |f: fn(&StreamSettings) -> Option<u64>, dflt: u64| {
            f(&s.settings).or(f(&sp.settings)).unwrap_or(dflt)
        };
        let ssl_eff = super::http::SslEff::default()
            .merge(&sp.settings.ssl)
            .merge(&s.settings.ssl);
        let ssl = SslConf {
            certificates: ssl_eff.pairs()?,
            ..ssl_eff.conf.clone()
        };
        let proxy_ssl = s.settings.proxy_ssl.or(&sp.settings.proxy_ssl);
        servers.push(StreamServerConf {
            ssl,
            proxy_ssl: proxy_ssl
                .enabled
                .unwrap_or(false)
                .then(|| proxy_ssl.merge(&ProxySsl::default())),
            place: s.place,
            listen: s.listen,
            upstream,
            connect_timeout_ms: get(|x| x.connect_timeout_ms, 60_000),
            timeout_ms: get(|x| x.timeout_ms, 600_000),
            buffer_size: get(|x| x.buffer_size.map(|n| n as u64), 16 * 1024) as usize,
            proxy_protocol: s
                .settings
                .proxy_protocol
                .or(sp.settings.proxy_protocol)
                .unwrap_or(false),
            proxy_protocol_timeout_ms: get(|x| x.proxy_protocol_timeout_ms, 30_000),
            next_upstream: s
                .settings
                .next_upstream
                .or(sp.settings.next_upstream)
                .unwrap_or(true),
            next_upstream_tries: s
                .settings
                .next_upstream_tries
                .or(sp.settings.next_upstream_tries)
                .unwrap_or(0),
            next_upstream_timeout_ms: get(|x| x.next_upstream_timeout_ms, 0),
            responses: s.settings.responses.or(sp.settings.responses),
            requests: s.settings.requests.or(sp.settings.requests).unwrap_or(0),
            access_rules: s
                .settings
                .access_rules
                .clone()
                .or_else(|| sp.settings.access_rules.clone())
                .unwrap_or_default(),
            ret: None,
            sets: s.sets,
            access_logs: stream_logs(&s.settings, &sp.settings),
            error_logs: stream_error_logs(&s.settings, &sp.settings),
            ssl_preread: preread.0,
            preread_buffer_size: preread.1,
            preread_timeout_ms: preread.2,
            pass_vars,
            resolver: s
                .settings
                .resolver
                .clone()
                .or_else(|| sp.settings.resolver.clone())
                .map(|r| {
                    std::sync::Arc::new(ResolverConf {
                        timeout_ms: get(|x| x.resolver_timeout_ms, 30_000),
                        ..r
                    })
                }),
            real_ip_from: real_ip_from.clone(),
            limit_conn,
            limit_conn_dry_run,
            bind: s
                .settings
                .bind
                .clone()
                .or_else(|| sp.settings.bind.clone())
                .flatten(),
            bind_transparent: match s.settings.bind {
                Some(_) => s.settings.bind_transparent.unwrap_or(false),
                None => sp.settings.bind_transparent.unwrap_or(false),
            },
            download_rate: s
                .settings
                .download_rate
                .clone()
                .or_else(|| sp.settings.download_rate.clone())
                .unwrap_or(SizeValue::Fixed(0)),
            upload_rate: s
                .settings
                .upload_rate
                .clone()
                .or_else(|| sp.settings.upload_rate.clone())
                .unwrap_or(SizeValue::Fixed(0)),
            half_close: s
                .settings
                .half_close
                .or(sp.settings.half_close)
                .unwrap_or(false),
            ssl_handshake_timeout_ms: get(|x| x.ssl_handshake_timeout_ms, 60_000),
            alpn,
        });
    }
    for l in sp.listeners {
        if listeners.iter().any(|h| h.addr == l.addr) {
            return Err(err(
                &l.first_place.file,
                l.first_place.line,
                format!("a duplicate listen {} (already used by http)", l.addr),
            ));
        }
        listeners.push(Listener {
            addr: l.addr,
            opts: l.opts,
            kind: ListenerKind::Stream {
                server: l.servers[0],
            },
            servers: Vec::new(),
            default_server: 0,
            place: l.opts_place.unwrap_or(l.first_place),
            names: Default::default(),
        });
    }
    let g = std::mem::take(&mut { sp.geoip });
    let geoip = (g.country.is_some() || g.city.is_some() || g.org.is_some())
        .then(|| std::sync::Arc::new(g));
    Ok(StreamConf {
        upstreams,
        geoip,
        servers,
        maps: sp.maps,
        limit_zones: sp.limit_zones,
    })
}

/// Every `ssl_*` directive of a stream block: the http module's rules on the stream's
/// settings.
pub(super) fn stream_ssl(env: &Env, s: &mut StreamSettings, d: &Directive, file: &str) -> R {
    if d.name == "ssl_certificate" || d.name == "ssl_certificate_key" {
        return super::http::apply_ssl_path(env, &mut s.ssl, d, file, &mut |name| {
            stream_variable(d, file, name)
        });
    }
    super::http::apply_ssl(env, &mut s.ssl, d, file)
}

/// `proxy_ssl` and the `proxy_ssl_*` settings of stream and its servers.
pub(super) fn stream_proxy_ssl(env: &Env, s: &mut StreamSettings, d: &Directive, file: &str) -> R {
    super::http::apply_proxy_ssl(env, &mut s.proxy_ssl, d, file, &mut |name| {
        stream_variable(d, file, name)
    })
}

/// `geoip_country`, `geoip_city`, `geoip_org` in stream.
pub(super) fn stream_geoip(env: &Env, sp: &mut StreamP, d: &Directive, file: &str) -> R {
    super::http::geoip_directive(env, &mut sp.geoip, d, file)
}
