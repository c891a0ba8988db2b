//! `ngx_http_fastcgi_module`'s directives: `fastcgi_pass` and the `fastcgi_*` settings.
//!
//! FastCGI is the proxy with a second wire format, so its upstream knobs (timeouts, buffers,
//! `next_upstream`, `intercept_errors`, hide/pass headers) parse into a [`ProxyP`] of their
//! own, merged like `proxy_*`'s and placed in the location's `proxy` when it has
//! `fastcgi_pass`. What only FastCGI has (params, `fastcgi_index`, `fastcgi_split_path_info`,
//! `fastcgi_keep_conn`, `fastcgi_catch_stderr`) merges here into a [`FastcgiConf`].
//!
//! `ngx_http_scgi_module` and `ngx_http_uwsgi_module` are the same shape with other wire
//! formats: `scgi_*` and `uwsgi_*` parse here too, each into a [`FastcgiP`] of its own (their
//! table rows are made from FastCGI's, `table::gateway_rows`), and `scgi_pass` / `uwsgi_pass`
//! place theirs in the location's `gateway`.

use super::*;

/// The `fastcgi_*` directives of one level; `None` inherits.
#[derive(Default, Clone)]
pub(super) struct FastcgiP {
    /// The upstream knobs shared with the HTTP proxy, under their `fastcgi_` names.
    pub(super) up: ProxyP,
    /// Every `fastcgi_param` of this level; `Some` replaces the parent's list.
    pub(super) params: Option<Vec<FastcgiParam>>,
    pub(super) index: Option<String>,
    pub(super) split_path_info: Option<crate::Regex>,
    pub(super) keep_conn: Option<bool>,
    pub(super) catch_stderr: Option<Vec<String>>,
    pub(super) pass_request_headers: Option<bool>,
    pub(super) pass_request_body: Option<bool>,
    /// `uwsgi_modifier1`, `uwsgi_modifier2`.
    pub(super) modifier1: Option<u8>,
    pub(super) modifier2: Option<u8>,
    /// `memcached_gzip_flag`.
    pub(super) gzip_flag: Option<u32>,
}

/// Merged `fastcgi_*` settings: every value known.
#[derive(Clone, Debug)]
pub(super) struct FastcgiEff {
    pub(super) up: ProxyConf,
    pub(super) conf: FastcgiConf,
}

impl Default for FastcgiEff {
    fn default() -> Self {
        FastcgiEff {
            up: ProxyConf {
                // The HTTP proxy's redirect rewriting and headers do not apply.
                redirect: ProxyRedirect::Off,
                cache: CacheConf {
                    convert_head: false,
                    ..CacheConf::default()
                },
                ..ProxyConf::default()
            },
            conf: FastcgiConf {
                wire: Wire::Fastcgi,
                modifier1: 0,
                modifier2: 0,
                gzip_flag: 0,
                params: Vec::new(),
                index: None,
                split_path_info: None,
                keep_conn: false,
                catch_stderr: Vec::new(),
                pass_request_headers: true,
                pass_request_body: true,
            },
        }
    }
}

impl FastcgiEff {
    /// `grpc_*`'s defaults: nginx's grpc module neither buffers the request body nor the
    /// response (streams go both ways as they come).
    pub(super) fn grpc() -> Self {
        let mut e = FastcgiEff::for_wire(Wire::Grpc);
        e.up.buffering = false;
        e.up.request_buffering = false;
        e.up.http_version_minor = 1;
        e
    }

    /// The defaults of `scgi_*` or `uwsgi_*`: FastCGI's, with their wire format.
    pub(super) fn for_wire(wire: Wire) -> Self {
        let mut e = FastcgiEff::default();
        e.conf.wire = wire;
        e
    }
}

impl FastcgiP {
    pub(super) fn merge(&self, parent: &FastcgiEff) -> FastcgiEff {
        let p = &parent.conf;
        FastcgiEff {
            up: self.up.merge(&parent.up),
            conf: FastcgiConf {
                wire: p.wire,
                modifier1: self.modifier1.unwrap_or(p.modifier1),
                modifier2: self.modifier2.unwrap_or(p.modifier2),
                gzip_flag: self.gzip_flag.unwrap_or(p.gzip_flag),
                params: self.params.clone().unwrap_or_else(|| p.params.clone()),
                index: self.index.clone().or_else(|| p.index.clone()),
                split_path_info: self
                    .split_path_info
                    .clone()
                    .or_else(|| p.split_path_info.clone()),
                keep_conn: self.keep_conn.unwrap_or(p.keep_conn),
                catch_stderr: self
                    .catch_stderr
                    .clone()
                    .unwrap_or_else(|| p.catch_stderr.clone()),
                pass_request_headers: self.pass_request_headers.unwrap_or(p.pass_request_headers),
                pass_request_body: self.pass_request_body.unwrap_or(p.pass_request_body),
            },
        }
    }
}

/// `fastcgi_pass ADDRESS` (and `scgi_pass`, `uwsgi_pass`): `host:port`, `unix:/path`, or an
/// `upstream` name, with variables rendered per request. `uwsgi_pass` also takes a
/// `uwsgi://` prefix, and `suwsgi://` for uwsgi over TLS (`uwsgi_ssl_*`).
pub(super) fn location_fastcgi_pass(_: &Env, loc: &mut LocP, d: &Directive, file: &str) -> R {
    let wire = match d.name.as_str() {
        "scgi_pass" => Wire::Scgi,
        "uwsgi_pass" => Wire::Uwsgi,
        "memcached_pass" => Wire::Memcached,
        "grpc_pass" => Wire::Grpc,
        _ => Wire::Fastcgi,
    };
    let mut a = a0(d);
    if loc.pass.is_some() || loc.fcgi_pass.is_some() {
        return Err(dup(d, file));
    }
    let mut tls = false;
    if wire == Wire::Grpc {
        if a.len() >= 8 && a[..8].eq_ignore_ascii_case("grpcs://") {
            a = &a[8..];
            tls = true;
        } else if a.len() >= 7 && a[..7].eq_ignore_ascii_case("grpc://") {
            a = &a[7..];
        }
    }
    if wire == Wire::Uwsgi {
        if a.len() >= 9 && a[..9].eq_ignore_ascii_case("suwsgi://") {
            a = &a[9..];
            tls = true;
        } else if a.len() >= 8 && a[..8].eq_ignore_ascii_case("uwsgi://") {
            a = &a[8..];
        }
    }
    if a.contains('$') {
        // Rendered per request like `proxy_pass` with variables: `HOST:PORT` or an upstream
        // name, the host resolved through `resolver`.
        let mut parts = parse_header_value(d, file, a)?;
        let scheme = if tls { "https://" } else { "http://" };
        parts.insert(0, Part::Lit(scheme.to_string()));
        loc.fcgi_pass = Some((
            wire,
            PassP {
                host: String::new(),
                port: None,
                uri: None,
                place: place(d, file),
                tls: false,
                dynamic: Some(parts),
            },
        ));
        return Ok(());
    }
    let pass = if let Some(path) = a.strip_prefix("unix:") {
        if !path.starts_with('/') {
            return Err(derr(d, file, format!("invalid URL prefix in \"{a}\"")));
        }
        PassP {
            host: a.to_string(),
            port: None,
            uri: None,
            place: place(d, file),
            tls,
            dynamic: None,
        }
    } else {
        if a.contains("://") {
            return Err(derr(d, file, format!("invalid URL prefix in \"{a}\"")));
        }
        // `host:port` or an upstream name: the same parser as proxy_pass's authority.
        let mut fake = d.clone();
        let scheme = if tls { "https" } else { "http" };
        fake.args = vec![format!("{scheme}://{a}")];
        let mut p = parse_proxy_pass(&fake, file)?;
        if p.uri.is_some() {
            return Err(derr(d, file, format!("invalid host in upstream \"{a}\"")));
        }
        p.place = place(d, file);
        p
    };
    loc.fcgi_pass = Some((wire, pass));
    Ok(())
}

/// Every `fastcgi_*`, `scgi_*` and `uwsgi_*` setting directive, by name.
pub(super) fn set_fastcgi(_: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    let name = d.name.as_str();
    let (f, suffix) = if let Some(x) = name.strip_prefix("fastcgi_") {
        (&mut s.fcgi, x)
    } else if let Some(x) = name.strip_prefix("scgi_") {
        (&mut s.scgi, x)
    } else if let Some(x) = name.strip_prefix("uwsgi_") {
        (&mut s.uwsgi, x)
    } else if let Some(x) = name.strip_prefix("memcached_") {
        (&mut s.memcached, x)
    } else {
        return Err(derr(d, file, format!("unknown directive \"{name}\"")));
    };
    let v = a0(d);
    match suffix {
        "param" => {
            let if_not_empty = match d.args.get(2).map(String::as_str) {
                None => false,
                Some("if_not_empty") => true,
                Some(x) => return Err(derr(d, file, format!("invalid parameter \"{x}\""))),
            };
            let value = parse_header_value(d, file, &d.args[1])?;
            f.params.get_or_insert_with(Vec::new).push(FastcgiParam {
                name: v.to_string(),
                value,
                if_not_empty,
            });
            Ok(())
        }
        "index" => once(&mut f.index, v.to_string(), d, file),
        "split_path_info" => {
            let re = compile_regex(d, file, v, false)?;
            once(&mut f.split_path_info, re, d, file)
        }
        "keep_conn" => once(&mut f.keep_conn, flag(d, file, v)?, d, file),
        "catch_stderr" => {
            f.catch_stderr
                .get_or_insert_with(Vec::new)
                .push(v.to_string());
            Ok(())
        }
        "pass_request_headers" => once(&mut f.pass_request_headers, flag(d, file, v)?, d, file),
        "pass_request_body" => once(&mut f.pass_request_body, flag(d, file, v)?, d, file),
        "connect_timeout" => once(&mut f.up.connect_timeout_ms, time(d, file, v)?, d, file),
        "read_timeout" => once(&mut f.up.read_timeout_ms, time(d, file, v)?, d, file),
        "send_timeout" => once(&mut f.up.send_timeout_ms, time(d, file, v)?, d, file),
        "buffering" => once(&mut f.up.buffering, flag(d, file, v)?, d, file),
        "request_buffering" => once(&mut f.up.request_buffering, flag(d, file, v)?, d, file),
        "intercept_errors" => once(&mut f.up.intercept_errors, flag(d, file, v)?, d, file),
        "buffer_size" => once(&mut f.up.buffer_size, buffer_size(d, file, v)?, d, file),
        "buffers" => {
            let (n, size) = buffers(d, file)?;
            once(&mut f.up.buffers, (n, size), d, file)
        }
        "next_upstream" => {
            let nu = parse_next_upstream(d, file)?;
            once(&mut f.up.next_upstream, nu, d, file)
        }
        "next_upstream_timeout" => once(
            &mut f.up.next_upstream_timeout_ms,
            time(d, file, v)?,
            d,
            file,
        ),
        "bind" => {
            let (b, transparent) = super::http::parse_bind(d, file)?;
            once(&mut f.up.bind, b, d, file)?;
            f.up.bind_transparent = Some(transparent);
            Ok(())
        }
        "socket_keepalive" => once(&mut f.up.socket_keepalive, flag(d, file, v)?, d, file),
        "ignore_client_abort" => once(&mut f.up.ignore_client_abort, flag(d, file, v)?, d, file),
        "ignore_headers" => {
            let v = super::http::ignore_headers(d, file)?;
            f.up.ignore_headers = Some(f.up.ignore_headers.unwrap_or(0) | v);
            Ok(())
        }
        "limit_rate" => once(
            &mut f.up.limit_rate,
            super::http::upstream_rate(d, file, v)?,
            d,
            file,
        ),
        "next_upstream_tries" => {
            let n = v.parse::<u32>().map_err(|_| invalid(d, file, v))?;
            once(&mut f.up.next_upstream_tries, n, d, file)
        }
        "hide_header" | "pass_header" => {
            let list = if suffix == "hide_header" {
                &mut f.up.hide_headers
            } else {
                &mut f.up.pass_headers
            };
            list.get_or_insert_with(Vec::new)
                .push(v.to_ascii_lowercase());
            Ok(())
        }
        "gzip_flag" => {
            let n = v.parse::<u32>().map_err(|_| invalid(d, file, v))?;
            once(&mut f.gzip_flag, n, d, file)
        }
        "modifier1" | "modifier2" => {
            let n = v.parse::<u8>().map_err(|_| invalid(d, file, v))?;
            let slot = if suffix == "modifier1" {
                &mut f.modifier1
            } else {
                &mut f.modifier2
            };
            once(slot, n, d, file)
        }
        n if n.starts_with("cache") || n == "no_cache" => {
            super::cache::directive(&mut f.up.cache, n, d, file)
        }
        _ => Err(derr(d, file, format!("unknown directive \"{}\"", d.name))),
    }
}
