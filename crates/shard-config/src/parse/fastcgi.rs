//! `ngx_http_fastcgi_module`'s directives: `fastcgi_pass` and the `fastcgi_*` settings.
//!
//! FastCGI is the proxy with a second wire format, so its upstream knobs (timeouts, buffers,
//! `next_upstream`, `intercept_errors`, hide/pass headers) parse into a [`ProxyP`] of their
//! own, merged like `proxy_*`'s and placed in the location's `proxy` when it has
//! `fastcgi_pass`. What only FastCGI has (params, `fastcgi_index`, `fastcgi_split_path_info`,
//! `fastcgi_keep_conn`, `fastcgi_catch_stderr`) merges here into a [`FastcgiConf`].

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

impl FastcgiP {
    pub(super) fn merge(&self, parent: &FastcgiEff) -> FastcgiEff {
        let p = &parent.conf;
        FastcgiEff {
            up: self.up.merge(&parent.up),
            conf: FastcgiConf {
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

/// `fastcgi_pass ADDRESS`: `host:port`, `unix:/path`, or an `upstream` name. Variables are
/// refused as in `proxy_pass`.
pub(super) fn location_fastcgi_pass(_: &Env, loc: &mut LocP, d: &Directive, file: &str) -> R {
    let a = a0(d);
    if loc.pass.is_some() || loc.fcgi_pass.is_some() {
        return Err(dup(d, file));
    }
    if a.contains('$') {
        // Rendered per request like `proxy_pass` with variables: `HOST:PORT` or an upstream
        // name, the host resolved through `resolver`.
        let mut parts = parse_header_value(d, file, a)?;
        parts.insert(0, Part::Lit("http://".to_string()));
        loc.fcgi_pass = Some(PassP {
            host: String::new(),
            port: None,
            uri: None,
            place: place(d, file),
            tls: false,
            dynamic: Some(parts),
        });
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
            tls: false,
            dynamic: None,
        }
    } else {
        if a.contains("://") {
            return Err(derr(d, file, format!("invalid URL prefix in \"{a}\"")));
        }
        // `host:port` or an upstream name: the same parser as proxy_pass's authority.
        let mut fake = d.clone();
        fake.args = vec![format!("http://{a}")];
        let mut p = parse_proxy_pass(&fake, file)?;
        if p.uri.is_some() {
            return Err(derr(d, file, format!("invalid host in upstream \"{a}\"")));
        }
        p.place = place(d, file);
        p
    };
    loc.fcgi_pass = Some(pass);
    Ok(())
}

/// Every `fastcgi_*` setting directive, by name.
pub(super) fn set_fastcgi(_: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    let f = &mut s.fcgi;
    let v = a0(d);
    match d.name.as_str() {
        "fastcgi_param" => {
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
        "fastcgi_index" => once(&mut f.index, v.to_string(), d, file),
        "fastcgi_split_path_info" => {
            let re = compile_regex(d, file, v, false)?;
            once(&mut f.split_path_info, re, d, file)
        }
        "fastcgi_keep_conn" => once(&mut f.keep_conn, flag(d, file, v)?, d, file),
        "fastcgi_catch_stderr" => {
            f.catch_stderr
                .get_or_insert_with(Vec::new)
                .push(v.to_string());
            Ok(())
        }
        "fastcgi_pass_request_headers" => {
            once(&mut f.pass_request_headers, flag(d, file, v)?, d, file)
        }
        "fastcgi_pass_request_body" => once(&mut f.pass_request_body, flag(d, file, v)?, d, file),
        "fastcgi_connect_timeout" => once(&mut f.up.connect_timeout_ms, time(d, file, v)?, d, file),
        "fastcgi_read_timeout" => once(&mut f.up.read_timeout_ms, time(d, file, v)?, d, file),
        "fastcgi_send_timeout" => once(&mut f.up.send_timeout_ms, time(d, file, v)?, d, file),
        "fastcgi_buffering" => once(&mut f.up.buffering, flag(d, file, v)?, d, file),
        "fastcgi_request_buffering" => {
            once(&mut f.up.request_buffering, flag(d, file, v)?, d, file)
        }
        "fastcgi_intercept_errors" => once(&mut f.up.intercept_errors, flag(d, file, v)?, d, file),
        "fastcgi_buffer_size" => once(&mut f.up.buffer_size, buffer_size(d, file, v)?, d, file),
        "fastcgi_buffers" => {
            let (n, size) = buffers(d, file)?;
            once(&mut f.up.buffers, (n, size), d, file)
        }
        "fastcgi_next_upstream" => {
            let nu = parse_next_upstream(d, file)?;
            once(&mut f.up.next_upstream, nu, d, file)
        }
        "fastcgi_next_upstream_timeout" => once(
            &mut f.up.next_upstream_timeout_ms,
            time(d, file, v)?,
            d,
            file,
        ),
        "fastcgi_bind" => {
            let (b, transparent) = super::http::parse_bind(d, file)?;
            once(&mut f.up.bind, b, d, file)?;
            f.up.bind_transparent = Some(transparent);
            Ok(())
        }
        "fastcgi_socket_keepalive" => once(&mut f.up.socket_keepalive, flag(d, file, v)?, d, file),
        "fastcgi_ignore_headers" => {
            let v = super::http::ignore_headers(d, file)?;
            f.up.ignore_headers = Some(f.up.ignore_headers.unwrap_or(0) | v);
            Ok(())
        }
        "fastcgi_limit_rate" => once(
            &mut f.up.limit_rate,
            super::http::upstream_rate(d, file, v)?,
            d,
            file,
        ),
        "fastcgi_next_upstream_tries" => {
            let n = v.parse::<u32>().map_err(|_| invalid(d, file, v))?;
            once(&mut f.up.next_upstream_tries, n, d, file)
        }
        "fastcgi_hide_header" | "fastcgi_pass_header" => {
            let list = if d.name == "fastcgi_hide_header" {
                &mut f.up.hide_headers
            } else {
                &mut f.up.pass_headers
            };
            list.get_or_insert_with(Vec::new)
                .push(v.to_ascii_lowercase());
            Ok(())
        }
        n if n.starts_with("fastcgi_cache") || n == "fastcgi_no_cache" => {
            super::cache::directive(&mut f.up.cache, &n["fastcgi_".len()..], d, file)
        }
        _ => Err(derr(d, file, format!("unknown directive \"{}\"", d.name))),
    }
}
