//! The http module: its block state (settings merged http -> server -> location, servers,
//! locations, listeners), the handlers of its directives, and the merge into [`HttpConf`]
//! (`Eff::defaults` holds every default of an http level, once).

#[allow(unused_imports)]
use super::*;

/// The `ssl_*` directives of one block. A block with any `ssl_certificate` (or
/// `ssl_certificate_key`) replaces its parent's list, as nginx's array directives.
#[derive(Default, Clone)]
pub(super) struct SslP {
    pub(super) certificates: Option<Vec<SslPath>>,
    pub(super) keys: Option<Vec<SslPath>>,
    /// The configuration's directory, where certificate templates are relative to.
    pub(super) conf_dir: Option<PathBuf>,
    pub(super) protocols: Option<Vec<String>>,
    pub(super) ciphers: Option<String>,
    pub(super) prefer_server_ciphers: Option<bool>,
    pub(super) session_cache: Option<SessionCache>,
    pub(super) session_timeout_ms: Option<u64>,
    pub(super) session_tickets: Option<bool>,
    pub(super) session_ticket_keys: Option<Vec<(PathBuf, Place)>>,
    pub(super) verify_client: Option<VerifyClient>,
    pub(super) client_certificate: Option<PathBuf>,
    pub(super) trusted_certificate: Option<PathBuf>,
    pub(super) crl: Option<PathBuf>,
    pub(super) verify_depth: Option<u32>,
    pub(super) reject_handshake: Option<bool>,
    pub(super) password_file: Option<PathBuf>,
    pub(super) stapling: Option<bool>,
    pub(super) stapling_file: Option<PathBuf>,
    pub(super) conf_commands: Option<Vec<(String, String)>>,
    /// `ssl_ecdh_curve` (empty: `auto`).
    pub(super) ecdh_curve: Option<String>,
}

/// The merged `ssl_*` directives of a block: the certificate and key lists stay apart
/// until a server pairs them (`finish_server`).
#[derive(Default, Clone)]
pub(super) struct SslEff {
    pub(super) certificates: Vec<SslPath>,
    pub(super) keys: Vec<SslPath>,
    pub(super) conf_dir: PathBuf,
    pub(super) conf: SslConf,
}

/// One `ssl_certificate` or `ssl_certificate_key`: the path (as written when it has
/// variables), where it was written, and its template when it has variables.
#[derive(Clone)]
pub(super) struct SslPath {
    pub(super) path: PathBuf,
    pub(super) place: Place,
    pub(super) tpl: Option<(String, Vec<Part>)>,
}

impl SslEff {
    pub(super) fn merge(&self, p: &SslP) -> SslEff {
        SslEff {
            certificates: p
                .certificates
                .clone()
                .unwrap_or_else(|| self.certificates.clone()),
            keys: p.keys.clone().unwrap_or_else(|| self.keys.clone()),
            conf_dir: p.conf_dir.clone().unwrap_or_else(|| self.conf_dir.clone()),
            conf: SslConf {
                certificates: Vec::new(),
                protocols: p
                    .protocols
                    .clone()
                    .unwrap_or_else(|| self.conf.protocols.clone()),
                ciphers: p
                    .ciphers
                    .clone()
                    .unwrap_or_else(|| self.conf.ciphers.clone()),
                prefer_server_ciphers: p
                    .prefer_server_ciphers
                    .unwrap_or(self.conf.prefer_server_ciphers),
                session_cache: p
                    .session_cache
                    .clone()
                    .unwrap_or_else(|| self.conf.session_cache.clone()),
                session_timeout_ms: p.session_timeout_ms.unwrap_or(self.conf.session_timeout_ms),
                session_tickets: p.session_tickets.unwrap_or(self.conf.session_tickets),
                session_ticket_keys: p.session_ticket_keys.as_ref().map_or_else(
                    || self.conf.session_ticket_keys.clone(),
                    |v| v.iter().map(|(p, _)| p.clone()).collect(),
                ),
                verify_client: p.verify_client.unwrap_or(self.conf.verify_client),
                client_certificate: p
                    .client_certificate
                    .clone()
                    .or_else(|| self.conf.client_certificate.clone()),
                trusted_certificate: p
                    .trusted_certificate
                    .clone()
                    .or_else(|| self.conf.trusted_certificate.clone()),
                crl: p.crl.clone().or_else(|| self.conf.crl.clone()),
                verify_depth: p.verify_depth.unwrap_or(self.conf.verify_depth),
                reject_handshake: p.reject_handshake.unwrap_or(self.conf.reject_handshake),
                password_file: p
                    .password_file
                    .clone()
                    .or_else(|| self.conf.password_file.clone()),
                stapling: p.stapling.unwrap_or(self.conf.stapling),
                conf_commands: p
                    .conf_commands
                    .clone()
                    .unwrap_or_else(|| self.conf.conf_commands.clone()),
                ecdh_curve: p
                    .ecdh_curve
                    .clone()
                    .unwrap_or_else(|| self.conf.ecdh_curve.clone()),
                stapling_file: p
                    .stapling_file
                    .clone()
                    .or_else(|| self.conf.stapling_file.clone()),
            },
        }
    }

    /// The server's certificate pairs: each `ssl_certificate` with the
    /// `ssl_certificate_key` of the same rank.
    pub(super) fn pairs(&self) -> Result<Vec<CertPair>, ConfigError> {
        let mut out = Vec::new();
        // With variables in any of them, every pair is loaded at the handshake (nginx
        // compiles them all as complex values then), the plain paths as literals.
        let dynamic = self
            .certificates
            .iter()
            .chain(&self.keys)
            .any(|p| p.tpl.is_some());
        let side = |p: &SslPath| match &p.tpl {
            Some((raw, parts)) => (raw.clone(), parts.clone()),
            None => {
                let s = p.path.display().to_string();
                (s.clone(), vec![Part::Lit(s)])
            }
        };
        for (i, cert) in self.certificates.iter().enumerate() {
            let place = &cert.place;
            let Some(key) = self.keys.get(i) else {
                return Err(ConfigError::new(format!(
                    "no \"ssl_certificate_key\" is defined for certificate \"{}\" in {}",
                    cert.path.display(),
                    where_(&place.file, place.line)
                )));
            };
            let vars = dynamic.then(|| {
                let (cr, cparts) = side(cert);
                let (kr, kparts) = side(key);
                CertVars {
                    raw: (cr, kr),
                    cert: cparts,
                    key: kparts,
                    dir: self.conf_dir.clone(),
                }
            });
            out.push(CertPair {
                certificate: cert.path.clone(),
                key: key.path.clone(),
                vars,
                password_file: self.conf.password_file.clone(),
                stapling_file: self
                    .conf
                    .stapling
                    .then(|| self.conf.stapling_file.clone())
                    .flatten(),
                place: place.clone(),
            });
        }
        self.certificate_commands(&mut out);
        Ok(out)
    }

    /// `ssl_conf_command Certificate FILE` and `PrivateKey FILE` (OpenSSL's
    /// `SSL_CTX_use_certificate_chain_file` and `SSL_CTX_use_PrivateKey_file`, applied after
    /// the `ssl_*` directives): the file replaces the certificate, then the key, of the
    /// server's last pair. OpenSSL replaces the pair of the
    /// certificate's key type: with one pair (the common case) that is the same.
    fn certificate_commands(&self, out: &mut [CertPair]) {
        for (name, value) in &self.conf.conf_commands {
            let cert = name.eq_ignore_ascii_case("Certificate");
            if !cert && !name.eq_ignore_ascii_case("PrivateKey") {
                continue;
            }
            let path = PathBuf::from(value);
            // Without a pair the server still fails as nginx's (no `ssl_certificate`).
            let Some(pair) = out.last_mut() else { continue };
            let lit = vec![Part::Lit(path.display().to_string())];
            if cert {
                pair.certificate = path;
                if let Some(v) = &mut pair.vars {
                    v.raw.0 = pair.certificate.display().to_string();
                    v.cert = lit;
                }
            } else {
                pair.key = path;
                if let Some(v) = &mut pair.vars {
                    v.raw.1 = pair.key.display().to_string();
                    v.key = lit;
                }
            }
        }
    }
}

/// Settings that merge http -> server -> location. `None` is "not set in this block".
#[derive(Default, Clone)]
pub(super) struct Settings {
    /// `ssl_*` (http, server).
    pub(super) ssl: SslP,
    pub(super) root: Option<PathBuf>,
    /// Set with `root`: its template when it has variables.
    pub(super) root_vars: Option<Option<Vec<Part>>>,
    pub(super) index: Option<Vec<String>>,
    pub(super) default_type: Option<String>,
    pub(super) types: Option<Arc<crate::model::MimeTypes>>,
    pub(super) keepalive_timeout_ms: Option<u64>,
    /// `keepalive_timeout`'s second parameter, in seconds (`Some(None)`: not given).
    pub(super) keepalive_header: Option<Option<u64>>,
    pub(super) keepalive_requests: Option<u64>,
    pub(super) keepalive_time_ms: Option<u64>,
    pub(super) keepalive_disable: Option<KeepaliveDisable>,
    pub(super) client_max_body_size: Option<u64>,
    pub(super) send_timeout_ms: Option<u64>,
    pub(super) auth_delay_ms: Option<u64>,
    pub(super) client_body_timeout_ms: Option<u64>,
    pub(super) client_body_buffer_size: Option<usize>,
    pub(super) client_body_temp_path: Option<TempPath>,
    pub(super) client_body_in_file_only: Option<InFileOnly>,
    pub(super) client_body_in_single_buffer: Option<bool>,
    pub(super) lingering_close: Option<LingeringClose>,
    pub(super) lingering_time_ms: Option<u64>,
    pub(super) lingering_timeout_ms: Option<u64>,
    pub(super) disable_symlinks: Option<DisableSymlinks>,
    pub(super) sendfile: Option<bool>,
    /// `open_file_cache`: `Some(None)` is `off`, else (max, inactive).
    pub(super) open_file_cache: Option<Option<(usize, u64)>>,
    pub(super) open_file_cache_valid_ms: Option<u64>,
    pub(super) open_file_cache_min_uses: Option<u32>,
    pub(super) open_file_cache_errors: Option<bool>,
    pub(super) tcp_nodelay: Option<bool>,
    /// `access_log`s of this block: (`off` given, the logs).
    pub(super) access_log: Option<(bool, Vec<AccessLog>)>,
    /// `error_log`s of this block.
    pub(super) error_log: Option<Vec<ErrorLog>>,
    pub(super) client_header_timeout_ms: Option<u64>,
    pub(super) client_header_buffer_size: Option<usize>,
    pub(super) large_client_header_buffers: Option<(usize, usize)>,
    pub(super) underscores_in_headers: Option<bool>,
    pub(super) merge_slashes: Option<bool>,
    pub(super) http2: Option<bool>,
    pub(super) http2_max_concurrent_streams: Option<u32>,
    pub(super) http2_recv_buffer_size: Option<usize>,
    pub(super) http2_chunk_size: Option<usize>,
    pub(super) http2_body_preread_size: Option<usize>,
    pub(super) http2_rebalance: Option<bool>,
    pub(super) http3: Option<bool>,
    pub(super) http3_max_concurrent_streams: Option<u32>,
    pub(super) http3_stream_buffer_size: Option<usize>,
    pub(super) quic_retry: Option<bool>,
    pub(super) quic_gso: Option<bool>,
    pub(super) ssl_early_data: Option<bool>,
    pub(super) quic_host_key: Option<PathBuf>,
    pub(super) ignore_invalid_headers: Option<bool>,
    pub(super) gzip: GzipP,
    pub(super) proxy: ProxyP,
    pub(super) fcgi: FastcgiP,
    /// `scgi_*` and `uwsgi_*`: FastCGI's shape, their own values.
    pub(super) scgi: FastcgiP,
    pub(super) uwsgi: FastcgiP,
    pub(super) memcached: FastcgiP,
    /// `grpc_*`: the proxy's knobs under gRPC's names.
    pub(super) grpc: FastcgiP,
    /// `resolver` (with `resolver_timeout` unset in the struct) and `resolver_timeout`.
    pub(super) resolver: Option<ResolverConf>,
    pub(super) resolver_timeout_ms: Option<u64>,
    /// Every `add_header` of this block; `Some` replaces the parent's list.
    pub(super) add_headers: Option<Vec<AddHeader>>,
    /// Every `add_trailer` of this block; `Some` replaces the parent's list.
    pub(super) add_trailers: Option<Vec<AddHeader>>,
    /// `expires`: `Some(None)` is `off`.
    pub(super) expires: Option<Option<Expires>>,
    /// `userid` and `userid_*` of this level.
    pub(super) userid: UseridP,
    pub(super) server_tokens: Option<bool>,
    /// `allow`/`deny` of this block; `Some` replaces the parent's list.
    pub(super) access_rules: Option<Vec<AccessRule>>,
    pub(super) referers: Option<Arc<Referers>>,
    pub(super) secure_link: SecureLink,
    /// `error_page`s of this block; `Some` replaces the parent's list.
    pub(super) error_pages: Option<Vec<ErrorPage>>,
    pub(super) log_not_found: Option<bool>,
    pub(super) recursive_error_pages: Option<bool>,
    pub(super) random_index: Option<bool>,
    pub(super) msie_refresh: Option<bool>,
    pub(super) slice: Option<u64>,
    pub(super) max_ranges: Option<u32>,
    pub(super) chunked_transfer_encoding: Option<bool>,
    pub(super) rewrite_log: Option<bool>,
    pub(super) autoindex: Option<Autoindex>,
    pub(super) if_modified_since: Option<IfModifiedSince>,
    pub(super) etag: Option<bool>,
    /// `open_log_file_cache`: `Some(None)` is `off`.
    pub(super) open_log_file_cache: Option<Option<OpenLogCache>>,
    pub(super) satisfy_any: Option<bool>,
    pub(super) limit_rate: Option<SizeValue>,
    pub(super) limit_rate_after: Option<SizeValue>,
    /// `auth_basic REALM | off` (`Some(None)`: off) and `auth_basic_user_file`.
    pub(super) auth_basic: Option<Option<String>>,
    pub(super) auth_basic_user_file: Option<UserFile>,
    pub(super) absolute_redirect: Option<bool>,
    pub(super) port_in_redirect: Option<bool>,
    pub(super) server_name_in_redirect: Option<bool>,
    /// `charset`: `Some(None)` is `off`.
    pub(super) charset: Option<Option<String>>,
    pub(super) auth_request: Option<Option<String>>,
    pub(super) auth_request_set: Option<Vec<(String, Vec<Part>)>>,
    pub(super) charset_types: Option<Vec<String>>,
    pub(super) sub_filter_pairs: Option<Vec<(Vec<Part>, Vec<Part>)>>,
    pub(super) sub_filter_once: Option<bool>,
    pub(super) sub_filter_types: Option<(Vec<String>, bool)>,
    pub(super) sub_filter_last_modified: Option<bool>,
    pub(super) ssi: Option<bool>,
    pub(super) ssi_silent_errors: Option<bool>,
    pub(super) ssi_last_modified: Option<bool>,
    pub(super) ssi_types: Option<(Vec<String>, bool)>,
    pub(super) ssi_value_length: Option<u64>,
    pub(super) add_before_body: Option<String>,
    pub(super) add_after_body: Option<String>,
    /// `post_action` (`Some(None)`: `off`).
    pub(super) post_action: Option<Option<String>>,
    /// `dav_methods` (bits), `dav_access`, `create_full_put_path`, `min_delete_depth`.
    pub(super) dav_methods: Option<u8>,
    pub(super) dav_access: Option<u32>,
    pub(super) create_full_put_path: Option<bool>,
    pub(super) min_delete_depth: Option<u32>,
    /// `mirror URI ...` of this level (`Some(empty)`: `off`), `mirror_request_body`.
    pub(super) mirrors: Option<Vec<String>>,
    pub(super) mirror_request_body: Option<bool>,
    pub(super) log_subrequest: Option<bool>,
    pub(super) addition_types: Option<(Vec<String>, bool)>,
    pub(super) subrequest_output_buffer_size: Option<u64>,
    pub(super) override_charset: Option<bool>,
    pub(super) source_charset: Option<(String, Place)>,
    pub(super) real_ip_from: Option<Vec<AccessRule>>,
    pub(super) real_ip_header: Option<String>,
    pub(super) real_ip_recursive: Option<bool>,
    pub(super) limit_req: Option<Vec<LimitReq>>,
    pub(super) limit_req_status: Option<u16>,
    pub(super) limit_req_dry_run: Option<bool>,
    pub(super) limit_conn_dry_run: Option<bool>,
    pub(super) limit_req_log_level: Option<LogLevel>,
    pub(super) limit_conn: Option<Vec<LimitConn>>,
    pub(super) limit_conn_status: Option<u16>,
    pub(super) limit_conn_log_level: Option<LogLevel>,
}

/// The `gzip*` directives of one block. `types` is (types, `*` given).
#[derive(Default, Clone)]
pub(super) struct GzipP {
    pub(super) enabled: Option<bool>,
    pub(super) comp_level: Option<u32>,
    pub(super) types: Option<(Vec<String>, bool)>,
    pub(super) min_length: Option<u64>,
    pub(super) vary: Option<bool>,
    pub(super) http_version_minor: Option<u8>,
    pub(super) proxied: Option<GzipProxied>,
    pub(super) static_mode: Option<GzipStatic>,
    pub(super) disable: Option<GzipDisable>,
    pub(super) gunzip: Option<bool>,
}

impl GzipP {
    pub(super) fn merge(&self, parent: &GzipConf) -> GzipConf {
        let (types, any_type) = match &self.types {
            Some((t, any)) => (t.clone(), *any),
            None => (parent.types.clone(), parent.any_type),
        };
        GzipConf {
            enabled: self.enabled.unwrap_or(parent.enabled),
            comp_level: self.comp_level.unwrap_or(parent.comp_level),
            types,
            any_type,
            min_length: self.min_length.unwrap_or(parent.min_length),
            vary: self.vary.unwrap_or(parent.vary),
            http_version_minor: self.http_version_minor.unwrap_or(parent.http_version_minor),
            proxied: self.proxied.unwrap_or(parent.proxied),
            static_mode: self.static_mode.unwrap_or(parent.static_mode),
            disable: self
                .disable
                .clone()
                .unwrap_or_else(|| parent.disable.clone()),
            gunzip: self.gunzip.unwrap_or(parent.gunzip),
        }
    }
}

/// The `proxy_*` directives of one http/server/location block.
#[derive(Default, Clone)]
pub(super) struct ProxyP {
    /// Every `proxy_set_header` of this block, in order; `Some` replaces the parent's list.
    pub(super) set_headers: Option<Vec<(String, Vec<Part>)>>,
    pub(super) http_version_minor: Option<u8>,
    pub(super) connect_timeout_ms: Option<u64>,
    pub(super) read_timeout_ms: Option<u64>,
    pub(super) send_timeout_ms: Option<u64>,
    pub(super) next_upstream: Option<NextUpstream>,
    pub(super) next_upstream_tries: Option<u32>,
    pub(super) next_upstream_timeout_ms: Option<u64>,
    pub(super) socket_keepalive: Option<bool>,
    pub(super) ignore_client_abort: Option<bool>,
    pub(super) limit_rate: Option<u64>,
    /// `proxy_ignore_headers` ([`ignore`] bits).
    pub(super) ignore_headers: Option<u16>,
    /// `proxy_cache*` of this level.
    pub(super) cache: CacheP,
    pub(super) buffering: Option<bool>,
    pub(super) buffer_size: Option<usize>,
    pub(super) buffers: Option<(usize, usize)>,
    pub(super) request_buffering: Option<bool>,
    pub(super) intercept_errors: Option<bool>,
    pub(super) force_ranges: Option<bool>,
    pub(super) method: Option<Vec<Part>>,
    pub(super) pass_request_headers: Option<bool>,
    pub(super) pass_request_body: Option<bool>,
    pub(super) set_body: Option<Vec<Part>>,
    pub(super) hide_headers: Option<Vec<String>>,
    pub(super) pass_headers: Option<Vec<String>>,
    pub(super) redirect: Option<ProxyRedirect>,
    /// `proxy_cookie_domain`/`_path` of this level (`Some(empty)`: `off`).
    pub(super) cookie_domain: Option<Vec<RewriteRule>>,
    pub(super) cookie_path: Option<Vec<RewriteRule>>,
    /// `proxy_bind` (`Some(None)`: `off`), and its `transparent`.
    pub(super) bind: Option<Option<Vec<Part>>>,
    pub(super) bind_transparent: Option<bool>,
    /// `proxy_cookie_flags` of this level (`Some(empty)`: `off`).
    pub(super) cookie_flags: Option<Vec<CookieFlags>>,
    pub(super) ssl: ProxySslP,
    /// `proxy_store` (`Some(None)`: `off`) and `proxy_store_access`.
    pub(super) store: Option<Option<Store>>,
    pub(super) store_access: Option<u32>,
}

/// The `proxy_ssl_*` directives of one level (http's proxy and stream's), merged downwards.
#[derive(Default, Clone)]
pub(super) struct ProxySslP {
    /// `proxy_ssl on|off` (stream only: http's scheme says it).
    pub(super) enabled: Option<bool>,
    pub(super) verify: Option<bool>,
    pub(super) trusted_certificate: Option<PathBuf>,
    pub(super) crl: Option<PathBuf>,
    pub(super) server_name: Option<bool>,
    /// Empty: `$proxy_host`, the default.
    pub(super) name: Option<String>,
    /// Set with `name` when it has variables.
    pub(super) name_vars: Option<NameTpl>,
    pub(super) session_reuse: Option<bool>,
    pub(super) protocols: Option<Vec<String>>,
    pub(super) ciphers: Option<String>,
    pub(super) certificate: Option<PathBuf>,
    pub(super) certificate_key: Option<PathBuf>,
    /// `proxy_ssl_certificate`/`_key` with variables: as written and parsed, and the
    /// configuration's directory.
    pub(super) certificate_tpl: Option<(String, Vec<Part>)>,
    pub(super) certificate_key_tpl: Option<(String, Vec<Part>)>,
    pub(super) conf_dir: Option<PathBuf>,
    pub(super) password_file: Option<PathBuf>,
    pub(super) conf_commands: Option<Vec<(String, String)>>,
}

impl ProxySslP {
    pub(super) fn merge(&self, p: &ProxySsl) -> ProxySsl {
        ProxySsl {
            verify: self.verify.unwrap_or(p.verify),
            trusted_certificate: self
                .trusted_certificate
                .clone()
                .or_else(|| p.trusted_certificate.clone()),
            crl: self.crl.clone().or_else(|| p.crl.clone()),
            server_name: self.server_name.unwrap_or(p.server_name),
            name: match &self.name {
                Some(n) if n.is_empty() => None,
                Some(n) => Some(n.clone()),
                None => p.name.clone(),
            },
            name_vars: match &self.name {
                Some(_) => self.name_vars.clone(),
                None => p.name_vars.clone(),
            },
            session_reuse: self.session_reuse.unwrap_or(p.session_reuse),
            protocols: self
                .protocols
                .clone()
                .unwrap_or_else(|| p.protocols.clone()),
            ciphers: self.ciphers.clone().unwrap_or_else(|| p.ciphers.clone()),
            certificate: if self.certificate_tpl.is_some() {
                None
            } else {
                self.certificate.clone().or_else(|| p.certificate.clone())
            },
            certificate_key: if self.certificate_key_tpl.is_some() {
                None
            } else {
                self.certificate_key
                    .clone()
                    .or_else(|| p.certificate_key.clone())
            },
            certificate_vars: self.certificate_vars(p),
            password_file: self
                .password_file
                .clone()
                .or_else(|| p.password_file.clone()),
            conf_commands: self
                .conf_commands
                .clone()
                .unwrap_or_else(|| p.conf_commands.clone()),
            alpn_h2: p.alpn_h2,
        }
        .with_certificate_commands()
    }

    /// `proxy_ssl_certificate`/`_key` with variables at this level (the other of the pair, if
    /// a plain path, as a literal), else the parent's unless this level names a plain pair.
    fn certificate_vars(&self, p: &ProxySsl) -> Option<CertVars> {
        if self.certificate_tpl.is_none() && self.certificate_key_tpl.is_none() {
            if self.certificate.is_some() || self.certificate_key.is_some() {
                return None;
            }
            return p.certificate_vars.clone();
        }
        let side = |tpl: &Option<(String, Vec<Part>)>, plain: Option<&PathBuf>| match tpl {
            Some((raw, parts)) => (raw.clone(), parts.clone()),
            None => {
                let s = plain.map(|p| p.display().to_string()).unwrap_or_default();
                (s.clone(), vec![Part::Lit(s)])
            }
        };
        let (cr, cert) = side(
            &self.certificate_tpl,
            self.certificate.as_ref().or(p.certificate.as_ref()),
        );
        let (kr, key) = side(
            &self.certificate_key_tpl,
            self.certificate_key.as_ref().or(p.certificate_key.as_ref()),
        );
        Some(CertVars {
            raw: (cr, kr),
            cert,
            key,
            dir: self.conf_dir.clone().unwrap_or_default(),
        })
    }

    /// Fills the unset fields from `parent` (stream's two levels).
    pub(super) fn or(&self, parent: &ProxySslP) -> ProxySslP {
        ProxySslP {
            enabled: self.enabled.or(parent.enabled),
            verify: self.verify.or(parent.verify),
            trusted_certificate: self
                .trusted_certificate
                .clone()
                .or_else(|| parent.trusted_certificate.clone()),
            crl: self.crl.clone().or_else(|| parent.crl.clone()),
            server_name: self.server_name.or(parent.server_name),
            name: self.name.clone().or_else(|| parent.name.clone()),
            name_vars: match &self.name {
                Some(_) => self.name_vars.clone(),
                None => parent.name_vars.clone(),
            },
            session_reuse: self.session_reuse.or(parent.session_reuse),
            protocols: self.protocols.clone().or_else(|| parent.protocols.clone()),
            ciphers: self.ciphers.clone().or_else(|| parent.ciphers.clone()),
            certificate: self
                .certificate
                .clone()
                .or_else(|| parent.certificate.clone()),
            certificate_key: self
                .certificate_key
                .clone()
                .or_else(|| parent.certificate_key.clone()),
            certificate_tpl: self
                .certificate_tpl
                .clone()
                .or_else(|| parent.certificate_tpl.clone()),
            certificate_key_tpl: self
                .certificate_key_tpl
                .clone()
                .or_else(|| parent.certificate_key_tpl.clone()),
            conf_dir: self.conf_dir.clone().or_else(|| parent.conf_dir.clone()),
            password_file: self
                .password_file
                .clone()
                .or_else(|| parent.password_file.clone()),
            conf_commands: self
                .conf_commands
                .clone()
                .or_else(|| parent.conf_commands.clone()),
        }
    }
}

impl ProxyP {
    /// `parent.set_headers` is the inherited user list, without nginx's defaults (they are
    /// added per location by [`with_default_headers`]).
    pub(super) fn merge(&self, parent: &ProxyConf) -> ProxyConf {
        ProxyConf {
            set_headers: self
                .set_headers
                .clone()
                .unwrap_or_else(|| parent.set_headers.clone()),
            http_version_minor: self.http_version_minor.unwrap_or(parent.http_version_minor),
            connect_timeout_ms: self.connect_timeout_ms.unwrap_or(parent.connect_timeout_ms),
            read_timeout_ms: self.read_timeout_ms.unwrap_or(parent.read_timeout_ms),
            send_timeout_ms: self.send_timeout_ms.unwrap_or(parent.send_timeout_ms),
            next_upstream: self.next_upstream.unwrap_or(parent.next_upstream),
            next_upstream_tries: self
                .next_upstream_tries
                .unwrap_or(parent.next_upstream_tries),
            next_upstream_timeout_ms: self
                .next_upstream_timeout_ms
                .unwrap_or(parent.next_upstream_timeout_ms),
            socket_keepalive: self.socket_keepalive.unwrap_or(parent.socket_keepalive),
            ignore_client_abort: self
                .ignore_client_abort
                .unwrap_or(parent.ignore_client_abort),
            limit_rate: self.limit_rate.unwrap_or(parent.limit_rate),
            ignore_accel_redirect: self
                .ignore_headers
                .map_or(parent.ignore_accel_redirect, |b| {
                    b & ignore::X_ACCEL_REDIRECT != 0
                }),
            ignore_headers: self.ignore_headers.unwrap_or(parent.ignore_headers),
            cache: self.cache.merge(&parent.cache),
            buffering: self.buffering.unwrap_or(parent.buffering),
            buffer_size: self.buffer_size.unwrap_or(parent.buffer_size),
            buffers: self.buffers.unwrap_or(parent.buffers),
            request_buffering: self.request_buffering.unwrap_or(parent.request_buffering),
            intercept_errors: self.intercept_errors.unwrap_or(parent.intercept_errors),
            force_ranges: self.force_ranges.unwrap_or(parent.force_ranges),
            method: self.method.clone().or_else(|| parent.method.clone()),
            pass_request_headers: self
                .pass_request_headers
                .unwrap_or(parent.pass_request_headers),
            pass_request_body: self.pass_request_body.unwrap_or(parent.pass_request_body),
            set_body: self.set_body.clone().or_else(|| parent.set_body.clone()),
            hide_headers: self
                .hide_headers
                .clone()
                .unwrap_or_else(|| parent.hide_headers.clone()),
            pass_headers: self
                .pass_headers
                .clone()
                .unwrap_or_else(|| parent.pass_headers.clone()),
            redirect: self
                .redirect
                .clone()
                .unwrap_or_else(|| parent.redirect.clone()),
            cookie_domain: self
                .cookie_domain
                .clone()
                .unwrap_or_else(|| parent.cookie_domain.clone()),
            cookie_path: self
                .cookie_path
                .clone()
                .unwrap_or_else(|| parent.cookie_path.clone()),
            bind: self.bind.clone().unwrap_or_else(|| parent.bind.clone()),
            bind_transparent: match self.bind {
                Some(_) => self.bind_transparent.unwrap_or(false),
                None => parent.bind_transparent,
            },
            cookie_flags: self
                .cookie_flags
                .clone()
                .unwrap_or_else(|| parent.cookie_flags.clone()),
            ssl: self.ssl.merge(&parent.ssl),
            store: self.store.clone().unwrap_or_else(|| parent.store.clone()),
            store_access: self.store_access.unwrap_or(parent.store_access),
        }
    }
}

/// nginx's default request headers, appended after the user's unless the user set them:
/// `Host $proxy_host`, `Connection close`.
pub(super) fn with_default_headers(mut p: ProxyConf) -> ProxyConf {
    let has =
        |h: &[(String, Vec<Part>)], name: &str| h.iter().any(|(n, _)| n.eq_ignore_ascii_case(name));
    if !has(&p.set_headers, "Host") {
        p.set_headers
            .push(("Host".to_string(), vec![Part::Var(Var::ProxyHost)]));
    }
    if !has(&p.set_headers, "Connection") {
        p.set_headers.push((
            "Connection".to_string(),
            vec![Part::Lit("close".to_string())],
        ));
    }
    p
}

/// Settings after merging: every value known.
#[derive(Clone)]
pub(super) struct Eff {
    pub(super) ssl: SslEff,
    pub(super) root: PathBuf,
    pub(super) root_vars: Option<Vec<Part>>,
    pub(super) index: Vec<String>,
    pub(super) default_type: String,
    pub(super) types: Arc<crate::model::MimeTypes>,
    pub(super) keepalive_timeout_ms: u64,
    pub(super) keepalive_header: Option<u64>,
    pub(super) keepalive_requests: u64,
    pub(super) keepalive_time_ms: u64,
    pub(super) keepalive_disable: KeepaliveDisable,
    pub(super) client_max_body_size: u64,
    pub(super) send_timeout_ms: u64,
    pub(super) auth_delay_ms: u64,
    pub(super) client_body_timeout_ms: u64,
    pub(super) http2_chunk_size: usize,
    pub(super) body: BodyConf,
    pub(super) lingering: Lingering,
    pub(super) disable_symlinks: DisableSymlinks,
    pub(super) sendfile: bool,
    pub(super) open_file_cache: OpenFileCache,
    pub(super) tcp_nodelay: bool,
    pub(super) access_logs: Vec<AccessLog>,
    pub(super) error_logs: Option<Arc<Vec<ErrorLog>>>,
    pub(super) client_header_timeout_ms: u64,
    pub(super) client_header_buffer_size: usize,
    pub(super) large_client_header_buffers: (usize, usize),
    pub(super) underscores_in_headers: bool,
    pub(super) merge_slashes: bool,
    pub(super) ignore_invalid_headers: bool,
    pub(super) http2: crate::model::Http2Conf,
    pub(super) http3: crate::model::Http3Conf,
    pub(super) gzip: GzipConf,
    /// `set_headers` without nginx's defaults (see [`with_default_headers`]).
    pub(super) proxy: ProxyConf,
    pub(super) fcgi: FastcgiEff,
    pub(super) scgi: FastcgiEff,
    pub(super) uwsgi: FastcgiEff,
    pub(super) memcached: FastcgiEff,
    pub(super) grpc: FastcgiEff,
    pub(super) resolver: Option<ResolverConf>,
    pub(super) resolver_timeout_ms: u64,
    pub(super) add_headers: Vec<AddHeader>,
    pub(super) add_trailers: Vec<AddHeader>,
    pub(super) expires: Option<Expires>,
    pub(super) userid: UseridConf,
    pub(super) server_tokens: bool,
    pub(super) access_rules: Vec<AccessRule>,
    pub(super) secure_link: SecureLink,
    pub(super) referers: Option<Arc<Referers>>,
    pub(super) error_pages: Vec<ErrorPage>,
    pub(super) log_not_found: bool,
    pub(super) recursive_error_pages: bool,
    pub(super) random_index: bool,
    pub(super) msie_refresh: bool,
    pub(super) slice: u64,
    pub(super) max_ranges: Option<u32>,
    pub(super) chunked_transfer_encoding: bool,
    pub(super) rewrite_log: bool,
    pub(super) autoindex: Autoindex,
    pub(super) if_modified_since: IfModifiedSince,
    pub(super) etag: bool,
    pub(super) open_log_file_cache: Option<OpenLogCache>,
    pub(super) satisfy_any: bool,
    pub(super) limit_rate: SizeValue,
    pub(super) limit_rate_after: SizeValue,
    pub(super) auth_basic: Option<String>,
    pub(super) auth_basic_user_file: Option<UserFile>,
    pub(super) absolute_redirect: bool,
    pub(super) port_in_redirect: bool,
    pub(super) server_name_in_redirect: bool,
    pub(super) charset: Option<String>,
    pub(super) auth_request: Option<String>,
    pub(super) auth_request_set: Vec<(String, Vec<Part>)>,
    pub(super) charset_types: Vec<String>,
    pub(super) sub_filter: SubFilterConf,
    pub(super) ssi: SsiConf,
    pub(super) addition: AdditionConf,
    pub(super) post_action: Option<String>,
    pub(super) dav: DavConf,
    pub(super) mirrors: Vec<String>,
    pub(super) mirror_request_body: bool,
    pub(super) log_subrequest: bool,
    pub(super) override_charset: bool,
    pub(super) source_charset: Option<(String, Place)>,
    pub(super) real_ip: RealIp,
    pub(super) limit_req: Vec<LimitReq>,
    pub(super) limit_req_status: u16,
    pub(super) limit_req_dry_run: bool,
    pub(super) limit_conn_dry_run: bool,
    pub(super) limit_req_log_level: LogLevel,
    pub(super) limit_conn: Vec<LimitConn>,
    pub(super) limit_conn_status: u16,
    pub(super) limit_conn_log_level: LogLevel,
}

impl Eff {
    pub(super) fn defaults(prefix: &Path) -> Eff {
        Eff {
            ssl: SslEff::default(),
            root: prefix.join("html"),
            root_vars: None,
            index: vec!["index.html".to_string()],
            default_type: "text/plain".to_string(),
            types: bundled_types(),
            keepalive_timeout_ms: 75_000,
            keepalive_header: None,
            keepalive_requests: 1000,
            keepalive_time_ms: 3_600_000,
            keepalive_disable: KeepaliveDisable {
                msie6: true,
                safari: false,
            },
            client_max_body_size: 1 << 20,
            send_timeout_ms: 60_000,
            auth_delay_ms: 0,
            client_body_timeout_ms: 60_000,
            http2_chunk_size: 8 * 1024,
            body: BodyConf {
                buffer_size: CLIENT_BODY_BUFFER_DEFAULT,
                temp_path: TempPath {
                    path: prefix.join("client_body_temp"),
                    levels: Vec::new(),
                },
                in_file_only: InFileOnly::Off,
                in_single_buffer: false,
            },
            lingering: Lingering {
                close: LingeringClose::On,
                time_ms: 30_000,
                timeout_ms: 5_000,
            },
            disable_symlinks: DisableSymlinks::default(),
            sendfile: false,
            open_file_cache: OpenFileCache::default(),
            tcp_nodelay: true,
            error_logs: None,
            access_logs: vec![AccessLog {
                path: prefix.join("logs/access.log"),
                path_vars: None,
                flush_ms: None,
                format: combined_format(),
                condition: None,
                buffer: None,
                gzip: None,
                syslog: None,
            }],
            client_header_timeout_ms: 60_000,
            client_header_buffer_size: 1024,
            large_client_header_buffers: (4, 8192),
            underscores_in_headers: false,
            merge_slashes: true,
            http2: crate::model::Http2Conf::default(),
            http3: crate::model::Http3Conf::default(),
            ignore_invalid_headers: true,
            gzip: GzipConf::default(),
            proxy: ProxyConf::default(),
            fcgi: FastcgiEff::default(),
            scgi: FastcgiEff::for_wire(Wire::Scgi),
            uwsgi: FastcgiEff::for_wire(Wire::Uwsgi),
            memcached: FastcgiEff::for_wire(Wire::Memcached),
            grpc: FastcgiEff::grpc(),
            resolver: None,
            resolver_timeout_ms: 30_000,
            add_headers: Vec::new(),
            add_trailers: Vec::new(),
            expires: None,
            userid: UseridConf::default(),
            server_tokens: true,
            access_rules: Vec::new(),
            referers: None,
            secure_link: SecureLink::default(),
            error_pages: Vec::new(),
            log_not_found: true,
            recursive_error_pages: false,
            random_index: false,
            msie_refresh: false,
            slice: 0,
            max_ranges: None,
            chunked_transfer_encoding: true,
            rewrite_log: false,
            autoindex: Autoindex::default(),
            if_modified_since: IfModifiedSince::Exact,
            etag: true,
            open_log_file_cache: None,
            satisfy_any: false,
            limit_rate: SizeValue::Fixed(0),
            limit_rate_after: SizeValue::Fixed(0),
            auth_basic: None,
            auth_basic_user_file: None,
            absolute_redirect: true,
            port_in_redirect: true,
            server_name_in_redirect: false,
            charset: None,
            auth_request: None,
            auth_request_set: Vec::new(),
            charset_types: CHARSET_TYPES.iter().map(|t| t.to_string()).collect(),
            sub_filter: SubFilterConf::default(),
            ssi: SsiConf::default(),
            addition: AdditionConf::default(),
            post_action: None,
            dav: DavConf::default(),
            mirrors: Vec::new(),
            mirror_request_body: true,
            log_subrequest: false,
            override_charset: false,
            source_charset: None,
            real_ip: RealIp::default(),
            limit_req: Vec::new(),
            limit_req_status: 503,
            limit_req_dry_run: false,
            limit_conn_dry_run: false,
            limit_req_log_level: LogLevel::Error,
            limit_conn: Vec::new(),
            limit_conn_status: 503,
            limit_conn_log_level: LogLevel::Error,
        }
    }

    pub(super) fn merge(&self, s: &Settings) -> Eff {
        Eff {
            ssl: self.ssl.merge(&s.ssl),
            root: s.root.clone().unwrap_or_else(|| self.root.clone()),
            root_vars: s
                .root_vars
                .clone()
                .unwrap_or_else(|| self.root_vars.clone()),
            index: s.index.clone().unwrap_or_else(|| self.index.clone()),
            default_type: s
                .default_type
                .clone()
                .unwrap_or_else(|| self.default_type.clone()),
            types: s.types.clone().unwrap_or_else(|| self.types.clone()),
            keepalive_timeout_ms: s.keepalive_timeout_ms.unwrap_or(self.keepalive_timeout_ms),
            keepalive_header: s.keepalive_header.unwrap_or(self.keepalive_header),
            keepalive_requests: s.keepalive_requests.unwrap_or(self.keepalive_requests),
            keepalive_time_ms: s.keepalive_time_ms.unwrap_or(self.keepalive_time_ms),
            keepalive_disable: s.keepalive_disable.unwrap_or(self.keepalive_disable),
            client_max_body_size: s.client_max_body_size.unwrap_or(self.client_max_body_size),
            send_timeout_ms: s.send_timeout_ms.unwrap_or(self.send_timeout_ms),
            auth_delay_ms: s.auth_delay_ms.unwrap_or(self.auth_delay_ms),
            client_body_timeout_ms: s
                .client_body_timeout_ms
                .unwrap_or(self.client_body_timeout_ms),
            http2_chunk_size: s.http2_chunk_size.unwrap_or(self.http2_chunk_size),
            body: BodyConf {
                buffer_size: s.client_body_buffer_size.unwrap_or(self.body.buffer_size),
                temp_path: s
                    .client_body_temp_path
                    .clone()
                    .unwrap_or_else(|| self.body.temp_path.clone()),
                in_file_only: s.client_body_in_file_only.unwrap_or(self.body.in_file_only),
                in_single_buffer: s
                    .client_body_in_single_buffer
                    .unwrap_or(self.body.in_single_buffer),
            },
            lingering: Lingering {
                close: s.lingering_close.unwrap_or(self.lingering.close),
                time_ms: s.lingering_time_ms.unwrap_or(self.lingering.time_ms),
                timeout_ms: s.lingering_timeout_ms.unwrap_or(self.lingering.timeout_ms),
            },
            disable_symlinks: s
                .disable_symlinks
                .clone()
                .unwrap_or_else(|| self.disable_symlinks.clone()),
            sendfile: s.sendfile.unwrap_or(self.sendfile),
            open_file_cache: {
                let p = &self.open_file_cache;
                let (max, inactive_ms) = match s.open_file_cache {
                    Some(Some((max, inactive))) => (Some(max).filter(|&m| m > 0), inactive),
                    Some(None) => (None, p.inactive_ms),
                    None => (p.max, p.inactive_ms),
                };
                OpenFileCache {
                    max,
                    inactive_ms,
                    valid_ms: s.open_file_cache_valid_ms.unwrap_or(p.valid_ms),
                    min_uses: s.open_file_cache_min_uses.unwrap_or(p.min_uses),
                    errors: s.open_file_cache_errors.unwrap_or(p.errors),
                }
            },
            tcp_nodelay: s.tcp_nodelay.unwrap_or(self.tcp_nodelay),
            access_logs: match &s.access_log {
                Some((true, _)) => Vec::new(),
                Some((false, logs)) => logs.clone(),
                None => self.access_logs.clone(),
            },
            error_logs: match &s.error_log {
                Some(logs) => Some(Arc::new(logs.clone())),
                None => self.error_logs.clone(),
            },
            client_header_timeout_ms: s
                .client_header_timeout_ms
                .unwrap_or(self.client_header_timeout_ms),
            client_header_buffer_size: s
                .client_header_buffer_size
                .unwrap_or(self.client_header_buffer_size),
            large_client_header_buffers: s
                .large_client_header_buffers
                .unwrap_or(self.large_client_header_buffers),
            underscores_in_headers: s
                .underscores_in_headers
                .unwrap_or(self.underscores_in_headers),
            merge_slashes: s.merge_slashes.unwrap_or(self.merge_slashes),
            http2: crate::model::Http2Conf {
                on: s.http2.unwrap_or(self.http2.on),
                max_concurrent_streams: s
                    .http2_max_concurrent_streams
                    .unwrap_or(self.http2.max_concurrent_streams),
                recv_buffer_size: s
                    .http2_recv_buffer_size
                    .unwrap_or(self.http2.recv_buffer_size),
                chunk_size: s.http2_chunk_size.unwrap_or(self.http2.chunk_size),
                body_preread_size: s
                    .http2_body_preread_size
                    .unwrap_or(self.http2.body_preread_size),
                rebalance: s.http2_rebalance.unwrap_or(self.http2.rebalance),
            },
            http3: crate::model::Http3Conf {
                on: s.http3.unwrap_or(self.http3.on),
                max_concurrent_streams: s
                    .http3_max_concurrent_streams
                    .unwrap_or(self.http3.max_concurrent_streams),
                stream_buffer_size: s
                    .http3_stream_buffer_size
                    .unwrap_or(self.http3.stream_buffer_size),
                retry: s.quic_retry.unwrap_or(self.http3.retry),
                gso: s.quic_gso.unwrap_or(self.http3.gso),
                early_data: s.ssl_early_data.unwrap_or(self.http3.early_data),
                host_key: s
                    .quic_host_key
                    .clone()
                    .or_else(|| self.http3.host_key.clone()),
            },
            ignore_invalid_headers: s
                .ignore_invalid_headers
                .unwrap_or(self.ignore_invalid_headers),
            gzip: s.gzip.merge(&self.gzip),
            proxy: s.proxy.merge(&self.proxy),
            fcgi: s.fcgi.merge(&self.fcgi),
            scgi: s.scgi.merge(&self.scgi),
            uwsgi: s.uwsgi.merge(&self.uwsgi),
            memcached: s.memcached.merge(&self.memcached),
            grpc: s.grpc.merge(&self.grpc),
            resolver: s.resolver.clone().or_else(|| self.resolver.clone()),
            resolver_timeout_ms: s.resolver_timeout_ms.unwrap_or(self.resolver_timeout_ms),
            add_headers: s
                .add_headers
                .clone()
                .unwrap_or_else(|| self.add_headers.clone()),
            add_trailers: s
                .add_trailers
                .clone()
                .unwrap_or_else(|| self.add_trailers.clone()),
            expires: s.expires.clone().unwrap_or_else(|| self.expires.clone()),
            userid: s.userid.merge(&self.userid),
            server_tokens: s.server_tokens.unwrap_or(self.server_tokens),
            access_rules: s
                .access_rules
                .clone()
                .unwrap_or_else(|| self.access_rules.clone()),
            referers: s.referers.clone().or_else(|| self.referers.clone()),
            // As nginx's merge: a level with `secure_link_secret` takes neither of the other
            // two, and a level with `secure_link` or `secure_link_md5` no secret.
            secure_link: match &s.secure_link.secret {
                Some(secret) => SecureLink {
                    expr: None,
                    md5: None,
                    secret: Some(secret.clone()),
                },
                None => {
                    let expr = s
                        .secure_link
                        .expr
                        .clone()
                        .or_else(|| self.secure_link.expr.clone());
                    let md5 = s
                        .secure_link
                        .md5
                        .clone()
                        .or_else(|| self.secure_link.md5.clone());
                    let secret = if expr.is_none() && md5.is_none() {
                        self.secure_link.secret.clone()
                    } else {
                        None
                    };
                    SecureLink { expr, md5, secret }
                }
            },
            error_pages: s
                .error_pages
                .clone()
                .unwrap_or_else(|| self.error_pages.clone()),
            log_not_found: s.log_not_found.unwrap_or(self.log_not_found),
            recursive_error_pages: s
                .recursive_error_pages
                .unwrap_or(self.recursive_error_pages),
            random_index: s.random_index.unwrap_or(self.random_index),
            msie_refresh: s.msie_refresh.unwrap_or(self.msie_refresh),
            slice: s.slice.unwrap_or(self.slice),
            max_ranges: s.max_ranges.or(self.max_ranges),
            chunked_transfer_encoding: s
                .chunked_transfer_encoding
                .unwrap_or(self.chunked_transfer_encoding),
            rewrite_log: s.rewrite_log.unwrap_or(self.rewrite_log),
            autoindex: {
                let a = s.autoindex.unwrap_or_default();
                let p = &self.autoindex;
                Autoindex {
                    on: a.on.or(p.on),
                    exact_size: a.exact_size.or(p.exact_size),
                    format: a.format.or(p.format),
                    localtime: a.localtime.or(p.localtime),
                }
            },
            if_modified_since: s.if_modified_since.unwrap_or(self.if_modified_since),
            etag: s.etag.unwrap_or(self.etag),
            open_log_file_cache: s.open_log_file_cache.unwrap_or(self.open_log_file_cache),
            satisfy_any: s.satisfy_any.unwrap_or(self.satisfy_any),
            limit_rate: s
                .limit_rate
                .clone()
                .unwrap_or_else(|| self.limit_rate.clone()),
            limit_rate_after: s
                .limit_rate_after
                .clone()
                .unwrap_or_else(|| self.limit_rate_after.clone()),
            auth_basic: s
                .auth_basic
                .clone()
                .unwrap_or_else(|| self.auth_basic.clone()),
            auth_basic_user_file: s
                .auth_basic_user_file
                .clone()
                .or_else(|| self.auth_basic_user_file.clone()),
            absolute_redirect: s.absolute_redirect.unwrap_or(self.absolute_redirect),
            port_in_redirect: s.port_in_redirect.unwrap_or(self.port_in_redirect),
            server_name_in_redirect: s
                .server_name_in_redirect
                .unwrap_or(self.server_name_in_redirect),
            charset: s.charset.clone().unwrap_or_else(|| self.charset.clone()),
            auth_request: s
                .auth_request
                .clone()
                .unwrap_or_else(|| self.auth_request.clone()),
            auth_request_set: s
                .auth_request_set
                .clone()
                .unwrap_or_else(|| self.auth_request_set.clone()),
            sub_filter: {
                let p = &self.sub_filter;
                let (types, any_type) = s
                    .sub_filter_types
                    .clone()
                    .unwrap_or_else(|| (p.types.clone(), p.any_type));
                SubFilterConf {
                    pairs: s
                        .sub_filter_pairs
                        .clone()
                        .unwrap_or_else(|| p.pairs.clone()),
                    once: s.sub_filter_once.unwrap_or(p.once),
                    types,
                    any_type,
                    last_modified: s.sub_filter_last_modified.unwrap_or(p.last_modified),
                }
            },
            ssi: {
                let p = &self.ssi;
                let (types, any_type) = s
                    .ssi_types
                    .clone()
                    .unwrap_or_else(|| (p.types.clone(), p.any_type));
                SsiConf {
                    enabled: s.ssi.unwrap_or(p.enabled),
                    silent_errors: s.ssi_silent_errors.unwrap_or(p.silent_errors),
                    last_modified: s.ssi_last_modified.unwrap_or(p.last_modified),
                    types,
                    any_type,
                    value_length: s.ssi_value_length.unwrap_or(p.value_length),
                    output_buffer_size: s
                        .subrequest_output_buffer_size
                        .unwrap_or(p.output_buffer_size),
                }
            },
            post_action: s
                .post_action
                .clone()
                .unwrap_or_else(|| self.post_action.clone()),
            dav: DavConf {
                methods: s.dav_methods.unwrap_or(self.dav.methods),
                access: s.dav_access.unwrap_or(self.dav.access),
                create_full_put_path: s
                    .create_full_put_path
                    .unwrap_or(self.dav.create_full_put_path),
                min_delete_depth: s.min_delete_depth.unwrap_or(self.dav.min_delete_depth),
            },
            mirrors: s.mirrors.clone().unwrap_or_else(|| self.mirrors.clone()),
            mirror_request_body: s.mirror_request_body.unwrap_or(self.mirror_request_body),
            log_subrequest: s.log_subrequest.unwrap_or(self.log_subrequest),
            addition: {
                let p = &self.addition;
                let (types, any_type) = s
                    .addition_types
                    .clone()
                    .unwrap_or_else(|| (p.types.clone(), p.any_type));
                AdditionConf {
                    before: s.add_before_body.clone().or_else(|| p.before.clone()),
                    after: s.add_after_body.clone().or_else(|| p.after.clone()),
                    types,
                    any_type,
                }
            },
            charset_types: s
                .charset_types
                .clone()
                .unwrap_or_else(|| self.charset_types.clone()),
            source_charset: s
                .source_charset
                .clone()
                .or_else(|| self.source_charset.clone()),
            override_charset: s.override_charset.unwrap_or(self.override_charset),
            real_ip: RealIp {
                from: s
                    .real_ip_from
                    .clone()
                    .unwrap_or_else(|| self.real_ip.from.clone()),
                header: s
                    .real_ip_header
                    .clone()
                    .unwrap_or_else(|| self.real_ip.header.clone()),
                recursive: s.real_ip_recursive.unwrap_or(self.real_ip.recursive),
            },
            limit_req: s
                .limit_req
                .clone()
                .unwrap_or_else(|| self.limit_req.clone()),
            limit_req_status: s.limit_req_status.unwrap_or(self.limit_req_status),
            limit_req_dry_run: s.limit_req_dry_run.unwrap_or(self.limit_req_dry_run),
            limit_conn_dry_run: s.limit_conn_dry_run.unwrap_or(self.limit_conn_dry_run),
            limit_req_log_level: s.limit_req_log_level.unwrap_or(self.limit_req_log_level),
            limit_conn: s
                .limit_conn
                .clone()
                .unwrap_or_else(|| self.limit_conn.clone()),
            limit_conn_status: s.limit_conn_status.unwrap_or(self.limit_conn_status),
            limit_conn_log_level: s.limit_conn_log_level.unwrap_or(self.limit_conn_log_level),
        }
    }

    pub(super) fn location(&self, kind: LocationKind, path: String, place: Place) -> LocationConf {
        LocationConf {
            kind,
            path,
            regex: None,
            parent: None,
            place,
            ret: None,
            handler: None,
            flv: false,
            root: self.root.clone(),
            alias: None,
            alias_from: None,
            geoip: None,
            doc_root_vars: self.root_vars.clone(),
            index_vars: index_templates(&self.index),
            index: self.index.clone(),
            default_type: self.default_type.clone(),
            types: self.types.clone(),
            keepalive_timeout_ms: self.keepalive_timeout_ms,
            keepalive_header: self.keepalive_header,
            keepalive_requests: self.keepalive_requests,
            keepalive_time_ms: self.keepalive_time_ms,
            keepalive_disable: self.keepalive_disable,
            client_max_body_size: self.client_max_body_size,
            send_timeout_ms: self.send_timeout_ms,
            auth_delay_ms: self.auth_delay_ms,
            client_body_timeout_ms: self.client_body_timeout_ms,
            http2_chunk_size: self.http2_chunk_size,
            body: self.body.clone(),
            lingering: self.lingering,
            disable_symlinks: self.disable_symlinks.clone(),
            sendfile: self.sendfile,
            open_file_cache: self.open_file_cache,
            tcp_nodelay: self.tcp_nodelay,
            access_logs: self.access_logs.clone(),
            error_logs: self.error_logs.clone(),
            gzip: self.gzip.clone(),
            add_headers: self.add_headers.clone(),
            add_trailers: self.add_trailers.clone(),
            expires: self.expires.clone(),
            userid: (self.userid.mode != UseridMode::Off).then(|| Arc::new(self.userid.clone())),
            server_tokens: self.server_tokens,
            access_rules: self.access_rules.clone(),
            referers: self.referers.clone(),
            secure_link: (self.secure_link != SecureLink::default())
                .then(|| Arc::new(self.secure_link.clone())),
            error_pages: self.error_pages.clone(),
            try_files: None,
            needs_head: false,
            upstream_vars: false,
            internal: false,
            log_not_found: self.log_not_found,
            recursive_error_pages: self.recursive_error_pages,
            random_index: self.random_index,
            msie_refresh: self.msie_refresh,
            slice_size: self.slice,
            max_ranges: self.max_ranges,
            chunked_transfer_encoding: self.chunked_transfer_encoding,
            rewrite_log: self.rewrite_log,
            autoindex: self.autoindex,
            if_modified_since: self.if_modified_since,
            etag: self.etag,
            open_log_file_cache: self.open_log_file_cache,
            auth_basic: match (&self.auth_basic, &self.auth_basic_user_file) {
                (Some(realm), Some(file)) => Some(auth_basic_users(realm, file)),
                _ => None,
            },
            absolute_redirect: self.absolute_redirect,
            port_in_redirect: self.port_in_redirect,
            server_name_in_redirect: self.server_name_in_redirect,
            charset: self.charset.clone(),
            auth_request: self.auth_request.clone(),
            auth_request_set: self.auth_request_set.clone(),
            charset_types: self.charset_types.clone(),
            sub_filter: self.sub_filter.clone(),
            ssi: self.ssi.clone(),
            addition: self.addition.clone(),
            post_action: self.post_action.clone(),
            dav: self.dav,
            mirrors: self.mirrors.clone(),
            mirror_request_body: self.mirror_request_body,
            log_subrequest: self.log_subrequest,
            source_charset: self
                .source_charset
                .as_ref()
                .map(|s| s.0.to_ascii_lowercase()),
            override_charset: self.override_charset,
            recode: None,
            real_ip: self.real_ip.clone(),
            limit_req: self.limit_req.clone(),
            limit_req_status: self.limit_req_status,
            limit_req_dry_run: self.limit_req_dry_run,
            limit_conn_dry_run: self.limit_conn_dry_run,
            limit_req_log_level: self.limit_req_log_level,
            limit_conn: self.limit_conn.clone(),
            limit_conn_status: self.limit_conn_status,
            limit_conn_log_level: self.limit_conn_log_level,
            script: Vec::new(),
            proxy_pass: None,
            proxy: with_default_headers(self.proxy.clone()),
            fastcgi: None,
            grpc: false,
            gateway: None,
            limit_except: None,
            satisfy_any: self.satisfy_any,
            limit_rate: self.limit_rate.clone(),
            limit_rate_after: self.limit_rate_after.clone(),
            resolver: self.resolver.as_ref().map(|r| {
                Arc::new(ResolverConf {
                    timeout_ms: self.resolver_timeout_ms,
                    ..r.clone()
                })
            }),
        }
    }
}

pub(super) struct LocP {
    pub(super) kind: LocationKind,
    pub(super) path: String,
    pub(super) regex: Option<crate::Regex>,
    pub(super) place: Place,
    pub(super) handler: Option<StatusHandler>,
    /// `flv`: this location's files are served as nginx's flv module serves them.
    pub(super) flv: bool,
    pub(super) alias: Option<PathBuf>,
    pub(super) alias_vars: Option<Vec<Part>>,
    /// The enclosing location's path, when `alias` is inherited from it.
    pub(super) alias_from: Option<String>,
    /// `proxy_pass`, resolved to an upstream once the whole `http` block is read.
    pub(super) pass: Option<PassP>,
    /// `fastcgi_pass`, `scgi_pass` or `uwsgi_pass`, likewise, with its wire format.
    pub(super) fcgi_pass: Option<(Wire, PassP)>,
    /// `limit_except`: its methods, its block's settings and `proxy_pass`.
    pub(super) limit_except: Option<(Vec<String>, Box<Settings>, Option<PassP>)>,
    pub(super) settings: Settings,
    pub(super) nested: Vec<LocP>,
    /// `(exact, path)` of `nested`, for [`no_duplicate`].
    pub(super) nested_keys: std::collections::HashSet<(bool, String)>,
    pub(super) try_files: Option<TryFiles>,
    pub(super) internal: bool,
    pub(super) script: Vec<Instr>,
}

/// A parsed `proxy_pass http://HOST[:PORT][/URI]`. It is resolved to an upstream only when
/// the whole `http` block was read: an `upstream` may follow the location that names it.
pub(super) struct PassP {
    /// As written (an IPv6 address keeps its brackets).
    pub(super) host: String,
    /// The port and its text as written, when one was written.
    pub(super) port: Option<(u16, String)>,
    pub(super) uri: Option<String>,
    pub(super) place: Place,
    /// `https://`.
    pub(super) tls: bool,
    /// With variables: the whole URL, rendered per request.
    pub(super) dynamic: Option<Vec<Part>>,
}

pub(super) struct ServerP {
    pub(super) try_files: Option<TryFiles>,
    pub(super) script: Vec<Instr>,
    pub(super) place: Place,
    pub(super) listen: Vec<SocketAddr>,
    pub(super) names: Vec<ServerName>,
    pub(super) settings: Settings,
    pub(super) locations: Vec<LocP>,
    /// `(exact, path)` of `locations`, for [`no_duplicate`].
    pub(super) location_keys: std::collections::HashSet<(bool, String)>,
    /// `ssl on` (nginx's directive before `listen ... ssl`, removed in 1.25.1): the
    /// server's addresses are TLS.
    pub(super) ssl_on: bool,
}

#[derive(Default)]
pub(super) struct HttpP {
    pub(super) settings: Settings,
    pub(super) geoip: GeoipConf,
    pub(super) servers: Vec<ServerP>,
    pub(super) listeners: Vec<ListenerP>,
    /// The named `upstream` blocks, in file order.
    pub(super) upstreams: Vec<UpstreamConf>,
    pub(super) maps: Vec<MapConf>,
    pub(super) limit_zones: Vec<LimitZone>,
    pub(super) charset_maps: Vec<CharsetMap>,
    pub(super) cache_paths: Vec<CachePath>,
}

/// The upstreams of `http` while `proxy_pass` directives are resolved.
pub(super) struct HttpUpstreams {
    /// Named blocks (the first `named`), then implicit ones.
    pub(super) list: Vec<UpstreamConf>,
    pub(super) named: usize,
}

impl HttpUpstreams {
    /// The upstream `p` names: a named block (whose name compares without case, as a host),
    /// else the implicit upstream `HOST:PORT`, created (resolved) on first use.
    pub(super) fn pass(&mut self, p: &PassP) -> Result<ProxyPass, ConfigError> {
        let at = |m: String| err(&p.place.file, p.place.line, m);
        if let Some(parts) = &p.dynamic {
            return Ok(ProxyPass {
                upstream: 0,
                uri: None,
                proxy_host: String::new(),
                proxy_port: if p.tls { 443 } else { 80 },
                tls: p.tls,
                dynamic: Some(parts.clone()),
            });
        }
        let default_port = if p.tls { 443 } else { 80 };
        let named = &self.list[..self.named];
        if let Some(i) = named
            .iter()
            .position(|u| u.name.eq_ignore_ascii_case(&p.host))
        {
            if let Some((port, _)) = &p.port {
                return Err(at(format!(
                    "upstream \"{}\" may not have port {port}",
                    p.host
                )));
            }
            return Ok(ProxyPass {
                upstream: i,
                uri: p.uri.clone(),
                proxy_host: p.host.clone(),
                proxy_port: default_port,
                tls: p.tls,
                dynamic: None,
            });
        }
        if let Some(path) = p.host.strip_prefix("unix:") {
            // `fastcgi_pass unix:/path`: a one-peer upstream on a Unix-domain socket.
            let upstream = match self.list[self.named..]
                .iter()
                .position(|u| u.name == p.host)
            {
                Some(i) => self.named + i,
                None => {
                    let mut u = implicit_upstream(
                        p.host.clone(),
                        p.place.clone(),
                        vec![SocketAddr::from(([0, 0, 0, 0], 0))],
                    );
                    u.peers[0].unix = Some(PathBuf::from(path));
                    u.peers[0].name = p.host.clone();
                    self.list.push(u);
                    self.list.len() - 1
                }
            };
            return Ok(ProxyPass {
                upstream,
                uri: p.uri.clone(),
                proxy_host: "localhost".to_string(),
                proxy_port: 80,
                tls: p.tls,
                dynamic: None,
            });
        }
        let port = p.port.as_ref().map_or(default_port, |(n, _)| *n);
        let proxy_host = match &p.port {
            Some((n, text)) if *n != default_port => format!("{}:{text}", p.host),
            _ => p.host.clone(),
        };
        let name = format!("{}:{port}", p.host);
        let implicit = &self.list[self.named..];
        let upstream = match implicit
            .iter()
            .position(|u| u.name.eq_ignore_ascii_case(&name))
        {
            Some(i) => self.named + i,
            None => {
                // nginx names the host alone here (`host not found in upstream "backend"`),
                // the usual sign of a misspelt or missing `upstream` block.
                let addrs = resolve_upstream(&name, None)
                    .map_err(|_| at(format!("host not found in upstream \"{}\"", p.host)))?;
                self.list
                    .push(implicit_upstream(name, p.place.clone(), addrs));
                self.list.len() - 1
            }
        };
        Ok(ProxyPass {
            upstream,
            uri: p.uri.clone(),
            proxy_host,
            proxy_port: port,
            tls: p.tls,
            dynamic: None,
        })
    }
}

pub(super) fn finish_server(
    s: ServerP,
    http_eff: &Eff,
    ups: &mut HttpUpstreams,
) -> Result<ServerConf, ConfigError> {
    let eff = http_eff.merge(&s.settings);
    check_charsets(&eff)?;
    let mut base = eff.location(LocationKind::Prefix, String::new(), s.place.clone());
    base.try_files = s.try_files.clone();
    let mut locations = Vec::new();
    for l in s.locations {
        flatten(l, &eff, None, ups, &mut locations)?;
    }
    // A server-level script runs before any location is chosen, as in nginx; one that starts
    // with `return` is that return, in every location.
    let mut script = s.script;
    if let Some(Instr::Return(r)) = script.first() {
        base.ret = Some(r.clone());
        for l in &mut locations {
            l.ret = Some(r.clone());
            l.script.clear();
            l.handler = None;
        }
        script.clear();
    }
    // `valid_referers server_names`: this server's names join the valid hosts.
    let names = if s.names.is_empty() {
        vec![ServerName::Exact(String::new())]
    } else {
        s.names.clone()
    };
    let mut expanded: Vec<(*const Referers, Arc<Referers>)> = Vec::new();
    for l in std::iter::once(&mut base).chain(locations.iter_mut()) {
        let Some(r) = l.referers.as_ref().filter(|r| r.server_names) else {
            continue;
        };
        let key = Arc::as_ptr(r);
        if let Some((_, done)) = expanded.iter().find(|(k, _)| *k == key) {
            l.referers = Some(done.clone());
            continue;
        }
        let mut with = (**r).clone();
        for n in &names {
            match n {
                ServerName::Exact(e) if !e.is_empty() => with.add(e, ""),
                ServerName::Exact(_) => {}
                ServerName::WildcardPrefix(suffix) => with.add(&format!("*{suffix}"), ""),
                ServerName::WildcardSuffix(prefix) => with.add(&format!("{prefix}*"), ""),
                ServerName::Dot(name) => with.add(&format!(".{name}"), ""),
                ServerName::Regex(re) => with.host_regexes.push(re.0.clone()),
            }
        }
        let with = Arc::new(with);
        expanded.push((key, with.clone()));
        l.referers = Some(with);
    }
    let ssl = SslConf {
        certificates: eff.ssl.pairs()?,
        ..eff.ssl.conf.clone()
    };
    let name = match s.names.first() {
        Some(ServerName::Exact(e)) => e.clone(),
        Some(ServerName::WildcardPrefix(suffix)) => format!("*{suffix}"),
        Some(ServerName::WildcardSuffix(prefix)) => format!("{prefix}*"),
        Some(ServerName::Dot(name)) => name.clone(),
        Some(ServerName::Regex(re)) => format!("~{}", re.0.as_str()),
        None => String::new(),
    };
    Ok(ServerConf {
        ssl,
        place: s.place,
        name,
        listen: s.listen,
        server_names: if s.names.is_empty() {
            vec![ServerName::Exact(String::new())]
        } else {
            s.names
        },
        client_header_timeout_ms: eff.client_header_timeout_ms,
        client_header_buffer_size: eff.client_header_buffer_size,
        large_client_header_buffers: eff.large_client_header_buffers,
        underscores_in_headers: eff.underscores_in_headers,
        merge_slashes: eff.merge_slashes,
        http2: eff.http2,
        http3: eff.http3.clone(),
        ignore_invalid_headers: eff.ignore_invalid_headers,
        base,
        index: crate::index::LocationIndex::build(&locations),
        locations,
        script,
    })
}

/// Nested locations become siblings of their parent, having inherited from it (all but
/// `proxy_pass`, which belongs to its own location only, as nginx).
pub(super) fn flatten(
    l: LocP,
    parent: &Eff,
    parent_idx: Option<usize>,
    ups: &mut HttpUpstreams,
    out: &mut Vec<LocationConf>,
) -> Result<(), ConfigError> {
    let eff = parent.merge(&l.settings);
    check_charsets(&eff)?;
    let mut conf = eff.location(l.kind, l.path, l.place);
    conf.regex = l.regex;
    conf.parent = parent_idx;
    // A script that starts with `return` is that return (nothing after it runs): the
    // common `location /x { return ...; }` needs no script at run time.
    match l.script.first() {
        Some(Instr::Return(r)) => conf.ret = Some(r.clone()),
        _ => {
            conf.ret = None;
            conf.script = l.script;
        }
    }
    conf.try_files = l.try_files;
    conf.internal = l.internal;
    let mut limit_pass = None;
    if let Some((methods, settings, pass)) = &l.limit_except {
        // The block inherits from its location, as nginx's nested configuration does.
        let inner = eff.merge(settings);
        let inner_loc = inner.location(LocationKind::Prefix, String::new(), conf.place.clone());
        if let Some(p) = pass {
            if p.uri.is_some() {
                return Err(err(
                    &p.place.file,
                    p.place.line,
                    "\"proxy_pass\" cannot have URI part in location given by regular \
                     expression, or inside named location, or inside \"if\" statement, or \
                     inside \"limit_except\" block",
                ));
            }
            limit_pass = Some(ups.pass(p)?);
        }
        conf.limit_except = Some(Arc::new(LimitExcept {
            methods: methods.clone(),
            location: None,
            access_rules: inner_loc.access_rules,
            auth_basic: inner_loc.auth_basic,
        }));
    }
    conf.handler = l.handler;
    conf.flv = l.flv;
    conf.alias = l.alias;
    conf.alias_from = l.alias_from;
    // What a nested location without `root` or `alias` inherits (not from a regex location,
    // whose alias is the whole path).
    let inherit = conf
        .alias
        .clone()
        .filter(|_| conf.kind != LocationKind::Regex || conf.alias_from.is_some())
        .map(|a| {
            let from = conf.alias_from.clone().unwrap_or_else(|| conf.path.clone());
            (a, l.alias_vars.clone(), from)
        });
    if l.alias_vars.is_some() {
        conf.doc_root_vars = l.alias_vars;
    } else if conf.alias.is_some() {
        conf.doc_root_vars = None;
    }
    if let Some(p) = &l.pass {
        if p.uri.is_some() && matches!(l.kind, LocationKind::Regex | LocationKind::Named) {
            return Err(err(
                &p.place.file,
                p.place.line,
                "\"proxy_pass\" cannot have URI part in location given by regular expression, \
                 or inside named location, or inside \"if\" statement, or inside \
                 \"limit_except\" block",
            ));
        }
    }
    conf.proxy_pass = match &l.pass {
        Some(p) => Some(ups.pass(p)?),
        None => None,
    };
    if let Some((wire, p)) = &l.fcgi_pass {
        // FastCGI, SCGI and uwsgi are the proxy with another wire format: its upstream,
        // their knobs.
        conf.proxy_pass = Some(ups.pass(p)?);
        let g = match wire {
            Wire::Fastcgi => &eff.fcgi,
            Wire::Scgi => &eff.scgi,
            Wire::Uwsgi => &eff.uwsgi,
            Wire::Memcached => &eff.memcached,
            Wire::Grpc => &eff.grpc,
        };
        conf.proxy = g.up.clone();
        let gw = Some(Arc::new(g.conf.clone()));
        if *wire == Wire::Grpc {
            // gRPC is the proxy's request and response, over HTTP/2: without a
            // `grpc_set_header Host`, `:authority` is the upstream's host (`$proxy_host`);
            // with one, a `host` field instead (as nginx).
            conf.grpc = true;
            conf.proxy.ssl.alpn_h2 = true;
        } else if *wire == Wire::Fastcgi {
            conf.fastcgi = gw;
        } else {
            conf.gateway = gw;
        }
    }
    let me = out.len();
    out.push(conf);
    // `if` and `limit_except` blocks with a `proxy_pass`: each a location of its own (unnamed,
    // reached only from here), the location's settings with that `proxy_pass`, as nginx.
    let mut script = std::mem::take(&mut out[me].script);
    for instr in script.iter_mut() {
        if let Instr::If { then, .. } = instr {
            for i in then.iter_mut() {
                if let Instr::Location(k) = i {
                    let Some(p) = super::script::take_if_pass(*k) else {
                        continue;
                    };
                    let pass = ups.pass(&p)?;
                    *k = push_block_location(out, me, pass);
                }
            }
        }
    }
    out[me].script = script;
    if let Some(pass) = limit_pass {
        let j = push_block_location(out, me, pass);
        if let Some(le) = out[me].limit_except.as_mut() {
            Arc::make_mut(le).location = Some(j);
        }
    }
    for mut n in l.nested {
        if let Some((alias, vars, from)) = &inherit {
            if n.alias.is_none() && n.alias_vars.is_none() && n.settings.root.is_none() {
                n.alias = Some(alias.clone());
                n.alias_vars = vars.clone();
                n.alias_from = Some(from.clone());
            }
        }
        flatten(n, &eff, Some(me), ups, out)?;
    }
    Ok(())
}

/// A location of its own for an `if` or `limit_except` block of location `of` that has a
/// `proxy_pass`: that location's settings with `pass`; named with no name, so that no URI and
/// no `@name` reaches it.
fn push_block_location(out: &mut Vec<LocationConf>, of: usize, pass: ProxyPass) -> usize {
    let mut b = out[of].clone();
    b.kind = LocationKind::Named;
    b.path = String::new();
    b.regex = None;
    b.script = Vec::new();
    b.ret = None;
    b.try_files = None;
    b.handler = None;
    b.fastcgi = None;
    b.proxy_pass = Some(pass);
    out.push(b);
    out.len() - 1
}

pub(super) fn http_upstream(env: &Env, h: &mut HttpP, d: &Directive, file: &str) -> R {
    let u = read_upstream(env, d, file, Ctx::HttpUpstream, &h.upstreams)?;
    h.upstreams.push(u);
    Ok(())
}

pub(super) fn http_server(env: &Env, h: &mut HttpP, d: &Directive, file: &str) -> R {
    let idx = h.servers.len();
    let mut s = ServerP {
        try_files: None,
        script: Vec::new(),
        place: place(d, file),
        listen: Vec::new(),
        names: Vec::new(),
        settings: Settings::default(),
        locations: Vec::new(),
        location_keys: Default::default(),
        ssl_on: false,
    };
    let mut cx = ServerCx {
        s: &mut s,
        listeners: &mut h.listeners,
        idx,
    };
    env.walk(
        block(d),
        file,
        Ctx::Server,
        &mut Target::Server(cx.reborrow()),
    )?;
    if s.ssl_on {
        // As nginx 1.22: every address the server listens on speaks TLS.
        for l in h
            .listeners
            .iter_mut()
            .filter(|l| s.listen.contains(&l.addr))
        {
            l.opts.ssl = true;
        }
    }
    if s.listen.is_empty() {
        let spec = ListenSpec {
            addr: SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 80),
            default_server: false,
            opts: ListenOpts::default(),
            opts_set: false,
            ssl: false,
            proxy_protocol: false,
            http2: false,
            last_port: None,
        };
        add_listen(&mut h.listeners, idx, &spec, s.place.clone())?;
        s.listen.push(spec.addr);
    }
    h.servers.push(s);
    Ok(())
}

impl ServerCx<'_> {
    pub(super) fn reborrow(&mut self) -> ServerCx<'_> {
        ServerCx {
            s: self.s,
            listeners: self.listeners,
            idx: self.idx,
        }
    }
}

pub(super) fn server_listen(_: &Env, cx: &mut ServerCx<'_>, d: &Directive, file: &str) -> R {
    let spec = parse_listen(d, file)?;
    if spec.opts.udp && !spec.opts.quic {
        // nginx's http `listen` has no `udp` (HTTP/3 says `quic`).
        return Err(derr(d, file, "invalid parameter \"udp\""));
    }
    if spec.opts.quic {
        // As nginx's `ngx_http_core_listen`.
        for (on, name) in [
            (spec.ssl, "ssl"),
            (spec.http2, "http2"),
            (spec.proxy_protocol, "proxy_protocol"),
        ] {
            if on {
                return Err(derr(
                    d,
                    file,
                    format!("\"{name}\" parameter is incompatible with \"quic\""),
                ));
            }
        }
        if spec.opts.shards.is_some() {
            return Err(derr(
                d,
                file,
                "the \"shards\" parameter is not supported with \"quic\" (each worker needs its own socket)",
            ));
        }
    }
    // A port range is a `listen` per port, as nginx expands it.
    for addr in spec.addrs() {
        let one = ListenSpec {
            addr,
            last_port: None,
            ..spec.clone()
        };
        add_listen(cx.listeners, cx.idx, &one, place(d, file))?;
        cx.s.listen.push(addr);
    }
    Ok(())
}

/// `ssl on|off`: nginx's form before `listen ... ssl` (deprecated since 1.15.0, removed in
/// 1.25.1), taken as nginx 1.22 takes it, with its warning.
pub(super) fn server_ssl(env: &Env, cx: &mut ServerCx<'_>, d: &Directive, file: &str) -> R {
    env.warn(
        d,
        file,
        "the \"ssl\" directive is deprecated, use the \"listen ... ssl\" directive instead",
    );
    cx.s.ssl_on = flag(d, file, a0(d))?;
    Ok(())
}

pub(super) fn server_server_name(_: &Env, cx: &mut ServerCx<'_>, d: &Directive, file: &str) -> R {
    for a in &d.args {
        cx.s.names.push(parse_server_name(d, file, a)?);
    }
    Ok(())
}

pub(super) fn server_location(env: &Env, cx: &mut ServerCx<'_>, d: &Directive, file: &str) -> R {
    let loc = read_location(env, d, file, None)?;
    no_duplicate(&mut cx.s.location_keys, &loc, d, file)?;
    cx.s.locations.push(loc);
    Ok(())
}

/// Compiles an expression with PCRE2, as nginx; a bad one is nginx's `pcre2_compile()
/// failed: ...` at the directive's `file:line`.
pub(super) fn compile_regex(
    d: &Directive,
    file: &str,
    re: &str,
    caseless: bool,
) -> Result<crate::Regex, ConfigError> {
    let r = crate::Regex::build(re, caseless).map_err(|why| derr(d, file, why))?;
    // Named captures (`(?<lang>..)`) become variables, as nginx's.
    for name in r.capture_names().iter().flatten() {
        declare(name);
    }
    Ok(r)
}

/// nginx's `duplicate location "/a"`: two locations of one level with the same path, both
/// exact or both prefix (`^~` or not); an exact and a prefix location of one path coexist.
/// `keys` holds the level's `(exact, path)` so far (a set: a level of 10,000 locations is
/// checked in linear time).
fn no_duplicate(
    keys: &mut std::collections::HashSet<(bool, String)>,
    loc: &LocP,
    d: &Directive,
    file: &str,
) -> R {
    if loc.kind == LocationKind::Regex {
        return Ok(());
    }
    if !keys.insert((loc.kind == LocationKind::Exact, loc.path.clone())) {
        return Err(derr(
            d,
            file,
            format!("duplicate location \"{}\"", loc.path),
        ));
    }
    Ok(())
}

pub(super) fn read_location(
    env: &Env,
    d: &Directive,
    file: &str,
    parent: Option<(LocationKind, &str)>,
) -> Result<LocP, ConfigError> {
    let mut regex = None;
    let (kind, path) = match d.args.as_slice() {
        [m, p] => match m.as_str() {
            "=" => (LocationKind::Exact, p.clone()),
            "^~" => (LocationKind::PrefixNoRegex, p.clone()),
            "~" | "~*" => {
                regex = Some(compile_regex(d, file, p, m == "~*")?);
                (LocationKind::Regex, p.clone())
            }
            m => return Err(derr(d, file, format!("invalid location modifier \"{m}\""))),
        },
        [a] => {
            if let Some(rest) = a.strip_prefix("^~") {
                (LocationKind::PrefixNoRegex, rest.to_string())
            } else if let Some(rest) = a.strip_prefix("~*") {
                regex = Some(compile_regex(d, file, rest, true)?);
                (LocationKind::Regex, rest.to_string())
            } else if let Some(rest) = a.strip_prefix('~') {
                regex = Some(compile_regex(d, file, rest, false)?);
                (LocationKind::Regex, rest.to_string())
            } else if let Some(rest) = a.strip_prefix('=') {
                (LocationKind::Exact, rest.to_string())
            } else if a.starts_with('@') {
                if parent.is_some() {
                    return Err(derr(
                        d,
                        file,
                        format!("named location \"{a}\" can be on the server level only"),
                    ));
                }
                (LocationKind::Named, a.clone())
            } else {
                (LocationKind::Prefix, a.clone())
            }
        }
        _ => {
            return Err(derr(
                d,
                file,
                "invalid number of arguments in \"location\" directive",
            ))
        }
    };
    if let Some((pkind, ppath)) = parent {
        if pkind == LocationKind::Exact {
            return Err(derr(
                d,
                file,
                format!("location \"{path}\" cannot be inside the exact location \"{ppath}\""),
            ));
        }
        if pkind == LocationKind::Named {
            return Err(derr(
                d,
                file,
                format!("location \"{path}\" cannot be inside the named location \"{ppath}\""),
            ));
        }
        // A regex location may nest anything and be nested anywhere; prefixes must extend
        // their enclosing prefix, as nginx.
        if kind != LocationKind::Regex && pkind != LocationKind::Regex && !path.starts_with(ppath) {
            return Err(derr(
                d,
                file,
                format!("location \"{path}\" is outside location \"{ppath}\""),
            ));
        }
    }
    let mut loc = LocP {
        try_files: None,
        internal: false,
        script: Vec::new(),
        kind,
        path,
        regex,
        place: place(d, file),
        handler: None,
        flv: false,
        alias: None,
        alias_vars: None,
        alias_from: None,
        pass: None,
        fcgi_pass: None,
        limit_except: None,
        settings: Settings::default(),
        nested: Vec::new(),
        nested_keys: Default::default(),
    };
    env.walk(
        block(d),
        file,
        Ctx::Location,
        &mut Target::Location(&mut loc),
    )?;
    Ok(loc)
}

pub(super) fn location_location(env: &Env, loc: &mut LocP, d: &Directive, file: &str) -> R {
    let path = loc.path.clone();
    let nested = read_location(env, d, file, Some((loc.kind, &path)))?;
    no_duplicate(&mut loc.nested_keys, &nested, d, file)?;
    loc.nested.push(nested);
    Ok(())
}

/// `limit_except METHOD ... { ... }`: the methods nginx knows (`GET` brings `HEAD`); the
/// block takes `allow`, `deny`, `auth_basic` and `auth_basic_user_file`.
pub(super) fn location_limit_except(env: &Env, loc: &mut LocP, d: &Directive, file: &str) -> R {
    const METHODS: [&str; 14] = [
        "GET",
        "HEAD",
        "POST",
        "PUT",
        "DELETE",
        "MKCOL",
        "COPY",
        "MOVE",
        "OPTIONS",
        "PROPFIND",
        "PROPPATCH",
        "LOCK",
        "UNLOCK",
        "PATCH",
    ];
    let mut methods = Vec::new();
    for a in &d.args {
        let m = a.to_ascii_uppercase();
        if !METHODS.contains(&m.as_str()) {
            return Err(derr(d, file, format!("invalid method \"{a}\"")));
        }
        if m == "GET" {
            methods.push("HEAD".to_string());
        }
        methods.push(m);
    }
    if loc.limit_except.is_some() {
        return Err(derr(d, file, "\"limit_except\" directive is duplicate"));
    }
    let mut block_loc = LocP {
        try_files: None,
        internal: false,
        script: Vec::new(),
        kind: LocationKind::Prefix,
        path: loc.path.clone(),
        regex: None,
        place: place(d, file),
        handler: None,
        flv: false,
        alias: None,
        alias_vars: None,
        alias_from: None,
        pass: None,
        fcgi_pass: None,
        limit_except: None,
        settings: Settings::default(),
        nested: Vec::new(),
        nested_keys: Default::default(),
    };
    env.walk(
        block(d),
        file,
        Ctx::LimitExcept,
        &mut Target::Location(&mut block_loc),
    )?;
    loc.limit_except = Some((methods, Box::new(block_loc.settings), block_loc.pass));
    Ok(())
}

pub(super) fn location_proxy_pass(_: &Env, loc: &mut LocP, d: &Directive, file: &str) -> R {
    let pass = parse_proxy_pass(d, file)?;
    if loc.fcgi_pass.is_some() {
        // One content handler per location: nginx's "is duplicate".
        return Err(dup(d, file));
    }
    once(&mut loc.pass, pass, d, file)
}

pub(super) fn location_stub_status(_: &Env, loc: &mut LocP, _: &Directive, _: &str) -> R {
    loc.handler = Some(StatusHandler::Stub);
    Ok(())
}

pub(super) fn location_shard_status(_: &Env, loc: &mut LocP, _: &Directive, _: &str) -> R {
    loc.handler = Some(StatusHandler::Shard);
    Ok(())
}

/// nginx takes variables in `access_log` paths; shard does not yet, and says so rather than
/// using `$name` as text (`proxy_pass` says so in its own words).
pub(super) fn no_variables(d: &Directive, file: &str, v: &str) -> R {
    if has_variables(v) {
        return Err(derr(
            d,
            file,
            format!("variables in \"{}\" are not supported by shard", d.name),
        ));
    }
    Ok(())
}

/// A `root`/`alias` value with variables: the literal directory before the first variable
/// (resolved against the prefix) and the whole template, made absolute likewise. `$document_root`
/// and `$realpath_root` cannot be used in it (nginx refuses them too).
fn doc_root_template(
    env: &Env,
    d: &Directive,
    file: &str,
) -> Result<(PathBuf, Vec<Part>), ConfigError> {
    let v = a0(d);
    let mut parts = parse_header_value(d, file, v)?;
    if parts.iter().any(|p| {
        matches!(
            p,
            Part::Var(Var::DocumentRoot | Var::RealpathRoot | Var::RequestFilename)
        )
    }) {
        return Err(derr(
            d,
            file,
            format!(
                "\"{}\" cannot use $document_root, $realpath_root or $request_filename",
                d.name
            ),
        ));
    }
    let literal = v.find('$').map_or(v, |i| &v[..i]);
    let dir = match literal.rfind('/') {
        Some(i) => &literal[..=i],
        None => "",
    };
    if !v.starts_with('/') {
        let prefix = env.prefix.display().to_string();
        let lead = format!("{}/", prefix.trim_end_matches('/'));
        match parts.first_mut() {
            Some(Part::Lit(l)) => l.insert_str(0, &lead),
            _ => parts.insert(0, Part::Lit(lead)),
        }
    }
    Ok((env.resolve(dir), parts))
}

pub(super) fn has_variables(v: &str) -> bool {
    v.as_bytes()
        .windows(2)
        .any(|w| w[0] == b'$' && (w[1].is_ascii_alphanumeric() || w[1] == b'_' || w[1] == b'{'))
}

pub(super) fn location_alias(env: &Env, loc: &mut LocP, d: &Directive, file: &str) -> R {
    if loc.alias.is_some() {
        return Err(dup(d, file));
    }
    if loc.settings.root.is_some() {
        return Err(derr(
            d,
            file,
            "\"alias\" directive is duplicate, \"root\" directive was specified earlier",
        ));
    }
    if has_variables(a0(d)) {
        let (dir, parts) = doc_root_template(env, d, file)?;
        loc.alias = Some(dir);
        loc.alias_vars = Some(parts);
    } else {
        loc.alias = Some(env.resolve(a0(d)));
    }
    Ok(())
}

pub(super) fn location_root(env: &Env, loc: &mut LocP, d: &Directive, file: &str) -> R {
    if loc.alias.is_some() {
        return Err(derr(
            d,
            file,
            "\"root\" directive is duplicate, \"alias\" directive was specified earlier",
        ));
    }
    set_root(env, &mut loc.settings, d, file)
}

pub(super) fn set_root(env: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    if has_variables(a0(d)) {
        let (dir, parts) = doc_root_template(env, d, file)?;
        s.root_vars = Some(Some(parts));
        return once(&mut s.root, dir, d, file);
    }
    s.root_vars = Some(None);
    once(&mut s.root, env.resolve(a0(d)), d, file)
}

/// The `index` names as templates when any has a variable (`index index${variant}.html`),
/// rendered per request; `None` when all are literal. Each was checked by [`set_index`].
fn index_templates(names: &[String]) -> Option<Vec<Vec<Part>>> {
    if !names.iter().any(|n| has_variables(n)) {
        return None;
    }
    let d = Directive {
        name: "index".into(),
        args: Vec::new(),
        line: 0,
        block: None,
    };
    names
        .iter()
        .map(|n| parse_header_value(&d, "", n).ok())
        .collect()
}

pub(super) fn set_index(_: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    if let Some(empty) = d.args.iter().find(|a| a.is_empty()) {
        return Err(derr(
            d,
            file,
            format!("index \"{empty}\" in \"index\" directive is invalid"),
        ));
    }
    for a in d.args.iter().filter(|a| has_variables(a)) {
        parse_header_value(d, file, a)?;
    }
    s.index
        .get_or_insert_with(Vec::new)
        .extend(d.args.iter().cloned());
    Ok(())
}

pub(super) fn set_default_type(_: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    once(&mut s.default_type, a0(d).to_string(), d, file)
}

pub(super) fn set_types(env: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    let mut map: crate::model::MimeTypes = match s.types.take() {
        Some(m) => Arc::try_unwrap(m).unwrap_or_else(|m| (*m).clone()),
        None => crate::model::MimeTypes::default(),
    };
    env.walk(block(d), file, Ctx::Types, &mut Target::Types(&mut map))?;
    s.types = Some(Arc::new(map));
    Ok(())
}

/// A setter for a field set once per block from one argument by a value parser: the shape of
/// most http settings (nginx's `ngx_conf_set_msec_slot`, `..._flag_slot`, `..._size_slot`).
macro_rules! slot {
    ($name:ident, $($field:ident).+, $parse:expr) => {
        pub(super) fn $name(_: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
            let v = $parse(d, file, a0(d))?;
            once(&mut s.$($field).+, v, d, file)
        }
    };
}

/// `keepalive_timeout TIMEOUT [HEADER_TIMEOUT]`: the second sends `Keep-Alive: timeout=N`.
pub(super) fn set_keepalive_timeout(_: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    let t = time(d, file, a0(d))?;
    once(&mut s.keepalive_timeout_ms, t, d, file)?;
    let header = match d.args.get(1) {
        Some(v) => Some(time(d, file, v)? / 1000),
        None => None,
    };
    s.keepalive_header = Some(header);
    Ok(())
}

slot!(set_keepalive_requests, keepalive_requests, num::<u64>);

slot!(set_keepalive_time, keepalive_time_ms, time);

/// `keepalive_disable none | msie6 | safari ...`: the browsers keep-alive is off for.
pub(super) fn set_keepalive_disable(_: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    let mut k = KeepaliveDisable {
        msie6: false,
        safari: false,
    };
    for a in &d.args {
        match a.as_str() {
            "none" => {}
            "msie6" => k.msie6 = true,
            "safari" => k.safari = true,
            _ => return Err(invalid(d, file, a)),
        }
    }
    once(&mut s.keepalive_disable, k, d, file)
}

slot!(set_client_max_body_size, client_max_body_size, size);

slot!(set_send_timeout, send_timeout_ms, time);

slot!(set_auth_delay, auth_delay_ms, time);

slot!(set_client_body_timeout, client_body_timeout_ms, time);

/// `client_body_buffer_size`'s default: two memory pages of x86-64, as nginx there.
pub(super) const CLIENT_BODY_BUFFER_DEFAULT: usize = 8192;

pub(super) fn set_client_body_buffer_size(
    _: &Env,
    s: &mut Settings,
    d: &Directive,
    file: &str,
) -> R {
    let v = size(d, file, a0(d))?;
    let v = usize::try_from(v).map_err(|_| invalid(d, file, a0(d)))?;
    once(&mut s.client_body_buffer_size, v, d, file)
}

/// `client_body_temp_path PATH [LEVEL1 [LEVEL2 [LEVEL3]]]`, as nginx's `ngx_conf_set_path_slot`.
pub(super) fn set_client_body_temp_path(
    env: &Env,
    s: &mut Settings,
    d: &Directive,
    file: &str,
) -> R {
    let mut levels = Vec::new();
    for a in &d.args[1..] {
        match num::<u8>(d, file, a) {
            Ok(l @ 1..=2) => levels.push(l),
            _ => return Err(invalid(d, file, a)),
        }
    }
    let path = TempPath {
        path: env.resolve(&d.args[0]),
        levels,
    };
    once(&mut s.client_body_temp_path, path, d, file)
}

/// `client_body_in_file_only on|clean|off`: `on` keeps every body file after the request,
/// `clean` removes it when the request is done.
pub(super) fn set_client_body_in_file_only(
    _: &Env,
    s: &mut Settings,
    d: &Directive,
    file: &str,
) -> R {
    let v = match a0(d) {
        "off" => InFileOnly::Off,
        "clean" => InFileOnly::Clean,
        "on" => InFileOnly::On,
        other => return Err(invalid(d, file, other)),
    };
    once(&mut s.client_body_in_file_only, v, d, file)
}

slot!(
    set_client_body_in_single_buffer,
    client_body_in_single_buffer,
    flag
);

pub(super) fn set_lingering_close(_: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    let v = match a0(d) {
        "off" => LingeringClose::Off,
        "on" => LingeringClose::On,
        "always" => LingeringClose::Always,
        other => return Err(invalid(d, file, other)),
    };
    once(&mut s.lingering_close, v, d, file)
}

/// `disable_symlinks off | on [from=PART] | if_not_owner [from=PART]`, in nginx's words.
pub(super) fn set_disable_symlinks(env: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    let mut v = DisableSymlinks::default();
    let mut from_given = false;
    for a in &d.args {
        match a.as_str() {
            "off" => v.check = SymlinkCheck::Off,
            "on" => v.check = SymlinkCheck::On,
            "if_not_owner" => v.check = SymlinkCheck::IfNotOwner,
            _ => {
                let Some(part) = a.strip_prefix("from=") else {
                    return Err(derr(d, file, format!("invalid parameter \"{a}\"")));
                };
                from_given = true;
                v.from = Some(if part.eq_ignore_ascii_case("$document_root") {
                    SymlinksFrom::DocumentRoot
                } else if part.contains('$') {
                    return Err(derr(
                        d,
                        file,
                        format!(
                            "variables other than $document_root in \"from=\" are not supported: \"{part}\""
                        ),
                    ));
                } else {
                    SymlinksFrom::Path(env.resolve(part))
                });
            }
        }
    }
    if from_given && v.check == SymlinkCheck::Off {
        return Err(derr(
            d,
            file,
            "\"from=\" cannot be used with \"off\" parameter",
        ));
    }
    once(&mut s.disable_symlinks, v, d, file)
}

slot!(set_lingering_time, lingering_time_ms, time);

slot!(set_lingering_timeout, lingering_timeout_ms, time);

slot!(set_sendfile, sendfile, flag);

/// `open_file_cache off | max=N [inactive=TIME]`, nginx's parameters and messages.
pub(super) fn set_open_file_cache(_: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    let mut max: Option<usize> = None;
    let mut inactive = 60_000;
    let mut off = false;
    for a in &d.args {
        let bad = || {
            derr(
                d,
                file,
                format!("invalid \"open_file_cache\" parameter \"{a}\""),
            )
        };
        if let Some(v) = a.strip_prefix("max=") {
            max = Some(v.parse().map_err(|_| bad())?);
        } else if let Some(v) = a.strip_prefix("inactive=") {
            inactive = crate::parse_time_ms(v).ok_or_else(bad)?;
        } else if a == "off" {
            off = true;
        } else {
            return Err(bad());
        }
    }
    let v = if off {
        None
    } else {
        let Some(max) = max else {
            return Err(derr(
                d,
                file,
                "\"open_file_cache\" must have the \"max\" parameter",
            ));
        };
        Some((max, inactive))
    };
    once(&mut s.open_file_cache, v, d, file)
}

slot!(set_open_file_cache_valid, open_file_cache_valid_ms, time);

slot!(
    set_open_file_cache_min_uses,
    open_file_cache_min_uses,
    num::<u32>
);

slot!(set_open_file_cache_errors, open_file_cache_errors, flag);

slot!(set_tcp_nodelay, tcp_nodelay, flag);

slot!(set_client_header_timeout, client_header_timeout_ms, time);

pub(super) fn set_client_header_buffer_size(
    _: &Env,
    s: &mut Settings,
    d: &Directive,
    file: &str,
) -> R {
    let v = size(d, file, a0(d))?;
    if v == 0 {
        return Err(invalid(d, file, a0(d)));
    }
    once(&mut s.client_header_buffer_size, v as usize, d, file)
}

slot!(set_underscores_in_headers, underscores_in_headers, flag);

slot!(set_merge_slashes, merge_slashes, flag);

slot!(set_http2, http2, flag);

slot!(set_http2_rebalance, http2_rebalance, flag);

slot!(set_http3, http3, flag);

slot!(set_quic_retry, quic_retry, flag);

slot!(set_quic_gso, quic_gso, flag);

slot!(set_ssl_early_data, ssl_early_data, flag);

/// `http3_max_concurrent_streams N`.
pub(super) fn set_http3_number(_: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    let v = num::<u32>(d, file, a0(d))?;
    once(&mut s.http3_max_concurrent_streams, v, d, file)
}

/// `http3_stream_buffer_size SIZE`.
pub(super) fn set_http3_stream_buffer_size(
    _: &Env,
    s: &mut Settings,
    d: &Directive,
    file: &str,
) -> R {
    let v = size(d, file, a0(d))?;
    if v == 0 || v > 1 << 30 {
        return Err(invalid(d, file, a0(d)));
    }
    once(&mut s.http3_stream_buffer_size, v as usize, d, file)
}

/// `quic_host_key FILE`: read at start, so a missing file fails `shard -t`.
pub(super) fn set_quic_host_key(env: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    let path = env.resolve_conf(a0(d));
    if let Err(e) = std::fs::metadata(&path) {
        return Err(derr(
            d,
            file,
            format!("failed to read QUIC host key \"{}\" ({e})", path.display()),
        ));
    }
    once(&mut s.quic_host_key, path, d, file)
}

/// `http2_max_concurrent_streams N` (1 or more).
pub(super) fn set_http2_max_concurrent_streams(
    _: &Env,
    s: &mut Settings,
    d: &Directive,
    file: &str,
) -> R {
    let v = num::<u32>(d, file, a0(d))?;
    if v == 0 {
        return Err(invalid(d, file, a0(d)));
    }
    once(&mut s.http2_max_concurrent_streams, v, d, file)
}

/// `http2_recv_buffer_size`, `http2_chunk_size`, `http2_body_preread_size`: sizes, the
/// first two not 0 (nginx: "the http2 chunk size cannot be zero"), none over 2^31 - 1
/// (an HTTP/2 window).
pub(super) fn set_http2_size(_: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    let v = size(d, file, a0(d))?;
    if v > u64::from(crate::model::H2_MAX_WINDOW) || (v == 0 && d.name != "http2_body_preread_size")
    {
        return Err(invalid(d, file, a0(d)));
    }
    let slot = match d.name.as_str() {
        "http2_recv_buffer_size" => &mut s.http2_recv_buffer_size,
        "http2_chunk_size" => &mut s.http2_chunk_size,
        _ => &mut s.http2_body_preread_size,
    };
    once(slot, v as usize, d, file)
}

slot!(set_ignore_invalid_headers, ignore_invalid_headers, flag);

pub(super) fn set_large_client_header_buffers(
    _: &Env,
    s: &mut Settings,
    d: &Directive,
    file: &str,
) -> R {
    let n = num::<usize>(d, file, a0(d))?;
    let sz = size(d, file, &d.args[1])?;
    if n == 0 {
        return Err(invalid(d, file, a0(d)));
    }
    if sz == 0 {
        return Err(invalid(d, file, &d.args[1]));
    }
    once(
        &mut s.large_client_header_buffers,
        (n, sz as usize),
        d,
        file,
    )
}

/// nginx's predefined `combined` format.
pub(super) fn combined_format() -> Arc<LogFormat> {
    static F: OnceLock<Arc<LogFormat>> = OnceLock::new();
    F.get_or_init(|| {
        let d = Directive {
            name: "log_format".to_string(),
            args: Vec::new(),
            line: 0,
            block: None,
        };
        let text = "$remote_addr - $remote_user [$time_local] \"$request\" $status \
                    $body_bytes_sent \"$http_referer\" \"$http_user_agent\"";
        Arc::new(LogFormat::new(
            LogFormat::COMBINED.to_string(),
            LogEscape::Default,
            // The text is fixed and valid: this cannot fail.
            parse_header_value(&d, "", text).unwrap_or_default(),
        ))
    })
    .clone()
}

/// `log_format NAME [escape=default|json|none] STRING ...` (http): the strings are joined.
/// A format must be defined before an `access_log` names it, as in nginx.
pub(super) fn http_log_format(env: &Env, _: &mut HttpP, d: &Directive, file: &str) -> R {
    define_log_format(&env.log_formats, d, file, &|v| {
        parse_header_value(d, file, v)
    })
}

/// A `log_format` of http or stream into `formats`, its strings read by `value`.
pub(super) fn define_log_format(
    formats: &std::cell::RefCell<HashMap<String, Arc<LogFormat>>>,
    d: &Directive,
    file: &str,
    value: &dyn Fn(&str) -> Result<Vec<Part>, ConfigError>,
) -> R {
    let name = a0(d).to_string();
    let mut rest = &d.args[1..];
    let mut escape = LogEscape::Default;
    if let Some(e) = rest.first().and_then(|a| a.strip_prefix("escape=")) {
        escape = match e {
            "default" => LogEscape::Default,
            "json" => LogEscape::Json,
            "none" => LogEscape::None,
            _ => {
                return Err(derr(
                    d,
                    file,
                    format!("unknown log format escaping \"{e}\""),
                ))
            }
        };
        rest = &rest[1..];
    }
    if rest.is_empty() {
        return Err(derr(
            d,
            file,
            "invalid number of arguments in \"log_format\" directive",
        ));
    }
    let mut formats = formats.borrow_mut();
    if name == LogFormat::COMBINED || formats.contains_key(&name) {
        return Err(derr(
            d,
            file,
            format!("duplicate \"log_format\" name \"{name}\""),
        ));
    }
    let parts = value(&rest.concat())?;
    formats.insert(name.clone(), Arc::new(LogFormat::new(name, escape, parts)));
    Ok(())
}

/// `error_log FILE|stderr|syslog:... [LEVEL]` in http, server, location: repeatable; a
/// level with any replaces its parent's.
pub(super) fn set_error_log(env: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    let l = parse_error_log(d, file, &env.prefix)?;
    env.note_error_log(&l);
    s.error_log.get_or_insert_with(Vec::new).push(l);
    Ok(())
}

/// `access_log PATH [FORMAT [buffer=SIZE] [gzip[=LEVEL]] [flush=TIME] [if=CONDITION]] | off`.
/// Several in one block are all written; `off` silences the block.
pub(super) fn set_access_log(env: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    let entry = s.access_log.get_or_insert_with(|| (false, Vec::new()));
    match parse_access_log(
        env,
        &env.log_formats,
        Some(combined_format()),
        d,
        file,
        &|v| parse_header_value(d, file, v),
    )? {
        None => entry.0 = true,
        Some(al) => entry.1.push(al),
    }
    Ok(())
}

/// One `access_log` of http or stream: `None` for `off`. `default` is the format without a
/// name (http's `combined`; stream has none, so the name is required there).
pub(super) fn parse_access_log(
    env: &Env,
    formats: &std::cell::RefCell<HashMap<String, Arc<LogFormat>>>,
    default: Option<Arc<LogFormat>>,
    d: &Directive,
    file: &str,
    value: &dyn Fn(&str) -> Result<Vec<Part>, ConfigError>,
) -> Result<Option<AccessLog>, ConfigError> {
    let a = a0(d);
    if a == "off" {
        if d.args.len() != 1 {
            return Err(derr(
                d,
                file,
                "invalid number of arguments in \"access_log\" directive",
            ));
        }
        return Ok(None);
    }
    let syslog = if a.starts_with("syslog:") {
        no_variables(d, file, a)?;
        Some(Arc::new(Syslog::parse(a).map_err(|m| derr(d, file, m))?))
    } else {
        None
    };
    let format = match (d.args.get(1), default) {
        (None, Some(f)) => f,
        (None, None) => {
            return Err(derr(
                d,
                file,
                "invalid number of arguments in \"access_log\" directive",
            ))
        }
        (Some(f), Some(c)) if f == LogFormat::COMBINED => c,
        (Some(f), _) => match formats.borrow().get(f) {
            Some(lf) => lf.clone(),
            None => return Err(derr(d, file, format!("unknown log format \"{f}\""))),
        },
    };
    let mut condition = None;
    let mut buffer = None;
    let mut gzip = None;
    let mut flush_ms = None;
    for p in d.args.iter().skip(2) {
        if let Some(v) = p.strip_prefix("buffer=") {
            buffer = Some(
                parse_size(v)
                    .ok_or_else(|| derr(d, file, format!("invalid buffer size \"{v}\"")))?,
            );
        } else if let Some(v) = p.strip_prefix("flush=") {
            flush_ms = Some(
                parse_time_ms(v)
                    .ok_or_else(|| derr(d, file, format!("invalid flush time \"{v}\"")))?,
            );
        } else if p == "gzip" {
            gzip = Some(1);
        } else if let Some(v) = p.strip_prefix("gzip=") {
            match v.parse::<u32>() {
                Ok(l) if (1..=9).contains(&l) => gzip = Some(l),
                _ => return Err(derr(d, file, format!("invalid compression level \"{v}\""))),
            }
        } else if let Some(v) = p.strip_prefix("if=") {
            condition = Some(value(v)?);
        } else {
            return Err(derr(d, file, format!("invalid parameter \"{p}\"")));
        }
    }
    if syslog.is_some() && (buffer.is_some() || gzip.is_some()) {
        return Err(derr(d, file, "logs to syslog cannot be buffered"));
    }
    let path = if syslog.is_some() {
        std::path::PathBuf::from(a)
    } else {
        env.resolve(a)
    };
    let path_vars = if syslog.is_none() && has_variables(a) {
        if buffer.is_some() || gzip.is_some() {
            return Err(derr(d, file, "buffered logs cannot have variables in name"));
        }
        Some(value(&path.to_string_lossy())?)
    } else {
        None
    };
    if syslog.is_none() && path_vars.is_none() {
        let mut declared = env.declared_logs.borrow_mut();
        if !declared.contains(&path) {
            declared.push(path.clone());
        }
    }
    // nginx: `gzip` without `buffer=` buffers 64 KiB.
    if gzip.is_some() && buffer.is_none() {
        buffer = Some(64 * 1024);
    }
    Ok(Some(AccessLog {
        path,
        path_vars,
        flush_ms,
        format,
        condition,
        buffer: buffer.map(|b| usize::try_from(b).unwrap_or(usize::MAX)),
        gzip,
        syslog,
    }))
}

slot!(set_gzip, gzip.enabled, flag);
slot!(set_server_tokens, server_tokens, server_tokens_value);

/// `server_tokens on | off` (`build` and a string are nginx Plus's).
fn server_tokens_value(d: &Directive, file: &str, v: &str) -> Result<bool, ConfigError> {
    match v {
        // `build` adds nginx's `--build` name, which shard has none of: the version alone.
        "on" | "build" => Ok(true),
        "off" => Ok(false),
        _ => Err(invalid(d, file, v)),
    }
}

/// `add_header NAME VALUE [always]`: repeatable; a level with any does not inherit its
/// parent's, as nginx.
/// `add_trailer NAME VALUE [always]`: as `add_header`, for the trailer of a chunked response.
pub(super) fn set_add_trailer(env: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    let mut one = Settings::default();
    set_add_header(env, &mut one, d, file)?;
    s.add_trailers
        .get_or_insert_with(Vec::new)
        .extend(one.add_headers.unwrap_or_default());
    Ok(())
}

pub(super) fn set_add_header(_: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    let always = match d.args.get(2).map(String::as_str) {
        None => false,
        Some("always") => true,
        Some(p) => return Err(derr(d, file, format!("invalid parameter \"{p}\""))),
    };
    let name = a0(d);
    if name.is_empty() || !name.bytes().all(|b| b.is_ascii_graphic() && b != b':') {
        return Err(invalid(d, file, name));
    }
    let value = parse_header_value(d, file, &d.args[1])?;
    s.add_headers.get_or_insert_with(Vec::new).push(AddHeader {
        name: name.to_string(),
        value,
        always,
    });
    Ok(())
}

slot!(set_log_not_found, log_not_found, flag);

slot!(set_rewrite_log, rewrite_log, flag);

slot!(
    set_chunked_transfer_encoding,
    chunked_transfer_encoding,
    flag
);

slot!(set_random_index, random_index, flag);
slot!(set_msie_refresh, msie_refresh, flag);

slot!(set_slice, slice, size);

slot!(set_recursive_error_pages, recursive_error_pages, flag);

slot!(set_max_ranges, max_ranges, num::<u32>);

/// `gzip_disable REGEX | msie6 | degradation ...`: case-insensitive expressions over the
/// `User-Agent`; `degradation` (nginx's load-based switch) is accepted and never holds.
pub(super) fn set_gzip_disable(_: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    let mut g = GzipDisable::default();
    for a in &d.args {
        match a.as_str() {
            "msie6" => g.msie6 = true,
            "degradation" => {}
            re => g.regexes.push(compile_regex(d, file, re, true)?),
        }
    }
    once(&mut s.gzip.disable, g, d, file)
}

slot!(set_limit_req_dry_run, limit_req_dry_run, flag);

slot!(set_limit_conn_dry_run, limit_conn_dry_run, flag);

/// `autoindex on|off`, `autoindex_exact_size on|off`, `autoindex_localtime on|off`,
/// `autoindex_format html|xml|json|jsonp`.
pub(super) fn set_autoindex(_: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    let a = s.autoindex.get_or_insert_with(Autoindex::default);
    let slot = match d.name.as_str() {
        "autoindex" => &mut a.on,
        "autoindex_exact_size" => &mut a.exact_size,
        "autoindex_localtime" => &mut a.localtime,
        _ => {
            let f = match a0(d) {
                "html" => AutoindexFormat::Html,
                "xml" => AutoindexFormat::Xml,
                "json" => AutoindexFormat::Json,
                "jsonp" => AutoindexFormat::Jsonp,
                v => return Err(invalid(d, file, v)),
            };
            return once(&mut a.format, f, d, file);
        }
    };
    let v = flag(d, file, a0(d))?;
    once(slot, v, d, file)
}

slot!(set_etag, etag, flag);

/// `open_log_file_cache max=N [inactive=TIME] [min_uses=N] [valid=TIME] | off`: descriptors of
/// access logs whose paths have variables, kept open by each worker.
pub(super) fn set_open_log_file_cache(_: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    let mut c = OpenLogCache {
        max: 0,
        inactive_ms: 10_000,
        min_uses: 1,
        valid_ms: 60_000,
    };
    let mut off = false;
    for a in &d.args {
        let bad = || {
            derr(
                d,
                file,
                format!("invalid \"open_log_file_cache\" parameter \"{a}\""),
            )
        };
        if let Some(v) = a.strip_prefix("max=") {
            c.max = v.parse().ok().filter(|&n| n > 0).ok_or_else(bad)?;
        } else if let Some(v) = a.strip_prefix("inactive=") {
            c.inactive_ms = crate::parse_time_ms(v).ok_or_else(bad)?;
        } else if let Some(v) = a.strip_prefix("min_uses=") {
            c.min_uses = v.parse().map_err(|_| bad())?;
        } else if let Some(v) = a.strip_prefix("valid=") {
            c.valid_ms = crate::parse_time_ms(v).ok_or_else(bad)?;
        } else if a == "off" {
            off = true;
        } else {
            return Err(bad());
        }
    }
    let v = if off {
        None
    } else if c.max == 0 {
        return Err(derr(
            d,
            file,
            "\"open_log_file_cache\" must have \"max\" parameter",
        ));
    } else {
        Some(c)
    };
    once(&mut s.open_log_file_cache, v, d, file)
}

/// `limit_rate RATE` and `limit_rate_after SIZE`: sizes, or variables rendered per request.
pub(super) fn set_limit_rate(_: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    let v = a0(d);
    let n = if has_variables(v) {
        SizeValue::Vars(parse_header_value(d, file, v)?)
    } else {
        SizeValue::Fixed(parse_size(v).ok_or_else(|| invalid(d, file, v))?)
    };
    if d.name == "limit_rate" {
        once(&mut s.limit_rate, n, d, file)
    } else {
        once(&mut s.limit_rate_after, n, d, file)
    }
}

/// `ssl_reject_handshake on | off`.
/// `ssl_password_file FILE`: relative to the configuration's directory, as nginx.
pub(super) fn set_ssl_password_file(env: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    let v = a0(d);
    if has_variables(v) {
        return Err(derr(
            d,
            file,
            "variables in \"ssl_password_file\" are not supported",
        ));
    }
    once(&mut s.ssl.password_file, env.resolve_conf(v), d, file)
}

pub(super) fn set_ssl_reject_handshake(_: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    let v = flag(d, file, a0(d))?;
    once(&mut s.ssl.reject_handshake, v, d, file)
}

/// `satisfy all | any`.
pub(super) fn set_satisfy(_: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    let any = match a0(d) {
        "all" => false,
        "any" => true,
        v => return Err(invalid(d, file, v)),
    };
    once(&mut s.satisfy_any, any, d, file)
}

/// `auth_basic REALM | off`.
pub(super) fn set_auth_basic(_: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    let v = a0(d);
    let realm = (v != "off").then(|| v.to_string());
    once(&mut s.auth_basic, realm, d, file)
}

/// `auth_basic_user_file FILE` (relative to the configuration's directory, as nginx).
pub(super) fn set_auth_basic_user_file(
    env: &Env,
    s: &mut Settings,
    d: &Directive,
    file: &str,
) -> R {
    let a = a0(d);
    let v = if has_variables(a) {
        UserFile {
            path: PathBuf::from(a),
            vars: Some(parse_header_value(d, file, a)?),
            conf_dir: env.resolve_conf("."),
        }
    } else {
        UserFile {
            path: env.resolve_conf(a),
            vars: None,
            conf_dir: PathBuf::new(),
        }
    };
    once(&mut s.auth_basic_user_file, v, d, file)
}

/// `auth_basic_user_file`: a path, or variables rendered per request.
#[derive(Debug, Clone)]
pub(super) struct UserFile {
    path: PathBuf,
    vars: Option<Vec<Part>>,
    conf_dir: PathBuf,
}

/// The user file of a location, read with the configuration. nginx reads it per request;
/// shard at start and reload (see docs), unless its name has variables.
fn auth_basic_users(realm: &str, f: &UserFile) -> Arc<AuthBasic> {
    let users = if f.vars.is_some() {
        Ok(Vec::new())
    } else {
        match std::fs::read_to_string(&f.path) {
            Ok(text) => Ok(AuthBasic::parse_users(&text)),
            Err(e) => Err(format!("open() \"{}\" failed ({e})", f.path.display())),
        }
    };
    Arc::new(AuthBasic {
        realm: realm.to_string(),
        file: f.path.clone(),
        users,
        file_vars: f.vars.clone(),
        conf_dir: f.conf_dir.clone(),
    })
}

/// `flv` (location): nginx's `ngx_http_flv_module`, a content handler of this location
/// only (not inherited).
pub(super) fn location_flv(_: &Env, loc: &mut LocP, _: &Directive, _: &str) -> R {
    loc.flv = true;
    Ok(())
}

/// `empty_gif` (location): nginx's 1x1 transparent GIF.
pub(super) fn location_empty_gif(_: &Env, loc: &mut LocP, _: &Directive, _: &str) -> R {
    loc.handler = Some(StatusHandler::EmptyGif);
    Ok(())
}

/// `if_modified_since off | exact | before`.
pub(super) fn set_if_modified_since(_: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    let v = match a0(d) {
        "off" => IfModifiedSince::Off,
        "exact" => IfModifiedSince::Exact,
        "before" => IfModifiedSince::Before,
        other => return Err(invalid(d, file, other)),
    };
    once(&mut s.if_modified_since, v, d, file)
}

slot!(set_absolute_redirect, absolute_redirect, flag);

slot!(set_port_in_redirect, port_in_redirect, flag);

slot!(set_server_name_in_redirect, server_name_in_redirect, flag);

/// `source_charset` and `charset` are joined by a `charset_map` when the configuration is
/// complete (`recode_table`); a pair no map joins is not recoded, as nginx.
pub(super) fn check_charsets(_: &Eff) -> R {
    Ok(())
}

/// `charset_map FROM TO { FROM_BYTE TO_BYTES; ... }` (hexadecimal; `TO_BYTES` a UTF-8
/// sequence when `TO` is `utf-8`).
pub(super) fn http_charset_map(env: &Env, h: &mut HttpP, d: &Directive, file: &str) -> R {
    let (from, to) = (
        d.args[0].to_ascii_lowercase(),
        d.args[1].to_ascii_lowercase(),
    );
    let utf8 = to == "utf-8";
    let hex = |t: &str| -> Option<Vec<u8>> {
        if t.is_empty() || t.len() % 2 == 1 && t.len() != 1 {
            return None;
        }
        let t = if t.len() == 1 {
            format!("0{t}")
        } else {
            t.to_string()
        };
        (0..t.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&t[i..i + 2], 16).ok())
            .collect()
    };
    let mut pairs = Vec::new();
    for (e, efile) in super::script::block_entries_of(env, d, file)? {
        let (a, [b]) = (&e.name, e.args.as_slice()) else {
            return Err(derr(&e, &efile, "invalid parameters number"));
        };
        let f = hex(a).filter(|v| v.len() == 1);
        let t = hex(b).filter(|v| v.len() == 1 || (utf8 && v.len() <= 3));
        let (Some(f), Some(t)) = (f, t) else {
            return Err(derr(&e, &efile, format!("invalid value \"{a} {b}\"")));
        };
        pairs.push((f[0], t));
    }
    h.charset_maps.push(CharsetMap { from, to, pairs });
    Ok(())
}

/// `sub_filter STRING REPLACEMENT`: the string matched without case; both may hold variables.
pub(super) fn set_sub_filter(_: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    if d.args[0].is_empty() {
        return Err(derr(d, file, "empty search pattern"));
    }
    let pattern = parse_header_value(d, file, &d.args[0])?;
    let replacement = parse_header_value(d, file, &d.args[1])?;
    s.sub_filter_pairs
        .get_or_insert_with(Vec::new)
        .push((pattern, replacement));
    Ok(())
}

slot!(set_sub_filter_once, sub_filter_once, flag);

slot!(set_sub_filter_last_modified, sub_filter_last_modified, flag);

slot!(set_ssi, ssi, flag);

slot!(set_ssi_silent_errors, ssi_silent_errors, flag);

slot!(set_ssi_last_modified, ssi_last_modified, flag);

slot!(
    set_subrequest_output_buffer_size,
    subrequest_output_buffer_size,
    size
);

/// `ssi_value_length LENGTH`: the longest parameter value of an SSI command.
pub(super) fn set_ssi_value_length(_: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    let v = size(d, file, a0(d))?;
    if v == 0 {
        return Err(invalid(d, file, a0(d)));
    }
    once(&mut s.ssi_value_length, v, d, file)
}

/// A `*_types MIME ...` list (`sub_filter_types`, `ssi_types`, `addition_types`): lowercase,
/// `text/html` always one, `*` for any type, as nginx's.
fn add_types(slot: &mut Option<(Vec<String>, bool)>, d: &Directive) {
    let (types, any) = slot.get_or_insert_with(|| (vec!["text/html".to_string()], false));
    for a in &d.args {
        if a == "*" {
            *any = true;
            continue;
        }
        let t = a.to_ascii_lowercase();
        if !types.contains(&t) {
            types.push(t);
        }
    }
}

/// `mirror URI | off` (repeatable): background subrequests of each main request, as
/// nginx's `ngx_http_mirror_module`; `off` and a URI at one level are "is duplicate".
pub(super) fn set_mirror(_: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    let v = a0(d);
    match (&mut s.mirrors, v) {
        (Some(_), "off") => Err(dup(d, file)),
        (None, "off") => {
            s.mirrors = Some(Vec::new());
            Ok(())
        }
        (Some(list), _) if list.is_empty() => Err(dup(d, file)),
        (slot, _) => {
            slot.get_or_insert_with(Vec::new).push(v.to_string());
            Ok(())
        }
    }
}

slot!(set_mirror_request_body, mirror_request_body, flag);

slot!(set_log_subrequest, log_subrequest, flag);

/// `post_action URI | @name | off`.
pub(super) fn set_post_action(_: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    let v = a0(d);
    if v.starts_with('@') {
        return Err(derr(
            d,
            file,
            "\"post_action\" to a named location is not supported by shard",
        ));
    }
    let v = (v != "off").then(|| v.to_string());
    once(&mut s.post_action, v, d, file)
}

/// `add_before_body URI`, `add_after_body URI` (an empty URI: none, as nginx's).
pub(super) fn set_add_before_body(_: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    once(&mut s.add_before_body, a0(d).to_string(), d, file)
}

pub(super) fn set_add_after_body(_: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    once(&mut s.add_after_body, a0(d).to_string(), d, file)
}

/// `addition_types MIME ...` (`*` for any); `text/html` is always one, as nginx.
pub(super) fn set_addition_types(_: &Env, s: &mut Settings, d: &Directive, _: &str) -> R {
    add_types(&mut s.addition_types, d);
    Ok(())
}

/// `ssi_types MIME ...` (`*` for any); `text/html` is always one, as nginx.
pub(super) fn set_ssi_types(_: &Env, s: &mut Settings, d: &Directive, _: &str) -> R {
    add_types(&mut s.ssi_types, d);
    Ok(())
}

/// `sub_filter_types MIME ...` (`*` for any); `text/html` is always one, as nginx.
pub(super) fn set_sub_filter_types(_: &Env, s: &mut Settings, d: &Directive, _: &str) -> R {
    add_types(&mut s.sub_filter_types, d);
    Ok(())
}

/// nginx's default `charset_types`.
pub(super) const CHARSET_TYPES: [&str; 6] = [
    "text/html",
    "text/xml",
    "text/plain",
    "text/vnd.wap.wml",
    "application/javascript",
    "application/rss+xml",
];

/// `auth_request URI | off`.
pub(super) fn set_auth_request(_: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    let v = (a0(d) != "off").then(|| a0(d).to_string());
    once(&mut s.auth_request, v, d, file)
}

/// `auth_request_set $NAME VALUE`: a variable set from the subrequest's answer.
pub(super) fn set_auth_request_set(_: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    let Some(name) = d.args[0].strip_prefix('$').filter(|n| !n.is_empty()) else {
        return Err(derr(
            d,
            file,
            format!("invalid variable name \"{}\"", d.args[0]),
        ));
    };
    super::script::declare(name);
    let value = parse_header_value(d, file, &d.args[1])?;
    s.auth_request_set
        .get_or_insert_with(Vec::new)
        .push((name.to_ascii_lowercase(), value));
    Ok(())
}

/// `charset NAME | off`.
pub(super) fn set_charset(_: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    let v = (a0(d) != "off").then(|| a0(d).to_string());
    once(&mut s.charset, v, d, file)
}

/// `charset_types MIME ...` (`*` for any); `text/html` is always one, as nginx.
pub(super) fn set_charset_types(_: &Env, s: &mut Settings, d: &Directive, _: &str) -> R {
    let types = s
        .charset_types
        .get_or_insert_with(|| vec!["text/html".to_string()]);
    for a in &d.args {
        let t = a.to_ascii_lowercase();
        if !types.contains(&t) {
            types.push(t);
        }
    }
    Ok(())
}

/// `source_charset NAME`: shard converts nothing, so it must name the `charset` (checked
/// when the levels are merged).
pub(super) fn set_source_charset(_: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    once(
        &mut s.source_charset,
        (a0(d).to_string(), place(d, file)),
        d,
        file,
    )
}

/// `override_charset on|off`: a proxied response's own charset is recoded too.
pub(super) fn set_override_charset(_: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    let v = flag(d, file, a0(d))?;
    once(&mut s.override_charset, v, d, file)
}

/// `error_page CODE ... [=[RESPONSE]] URI`: codes 300..=599 (not 499), as nginx.
pub(super) fn set_error_page(_: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    let n = d.args.len();
    let target = &d.args[n - 1];
    let mut status = ErrorPageStatus::Original;
    let mut codes_end = n - 1;
    if let Some(eq) = d.args[n - 2].strip_prefix('=') {
        codes_end = n - 2;
        status = if eq.is_empty() {
            ErrorPageStatus::Target
        } else {
            let c: u16 = num(d, file, eq)
                .map_err(|_| derr(d, file, format!("invalid value \"{}\"", d.args[n - 2])))?;
            ErrorPageStatus::Code(c)
        };
    } else if n >= 3 {
        if let Some(eq) = d.args[n - 1].strip_prefix('=') {
            // `error_page 404 =200` with no URI.
            let _ = eq;
            return Err(derr(
                d,
                file,
                "invalid number of arguments in \"error_page\" directive",
            ));
        }
    }
    if codes_end == 0 {
        return Err(derr(
            d,
            file,
            "invalid number of arguments in \"error_page\" directive",
        ));
    }
    let mut codes = Vec::new();
    for a in &d.args[..codes_end] {
        let c: u16 = a
            .parse()
            .ok()
            .filter(|c| (300..=599).contains(c) && *c != 499)
            .ok_or_else(|| {
                derr(
                    d,
                    file,
                    format!("value \"{a}\" must be between 300 and 599"),
                )
            })?;
        codes.push(c);
    }
    let target = parse_header_value(d, file, target)?;
    s.error_pages.get_or_insert_with(Vec::new).push(ErrorPage {
        codes,
        status,
        target,
    });
    Ok(())
}

/// `try_files FILE ... URI | =CODE | @NAME` (location).
pub(super) fn location_try_files(_: &Env, loc: &mut LocP, d: &Directive, file: &str) -> R {
    if loc.try_files.is_some() {
        return Err(dup(d, file));
    }
    let (last, files) = d.args.split_last().unwrap_or((&d.args[0], &[]));
    let last = if let Some(code) = last.strip_prefix('=') {
        let c: u16 = code
            .parse()
            .ok()
            .filter(|c| (100..=999).contains(c))
            .ok_or_else(|| derr(d, file, format!("invalid code \"{last}\"")))?;
        TryLast::Code(c)
    } else if last.starts_with('@') {
        TryLast::Named(last.clone())
    } else {
        TryLast::Uri(parse_header_value(d, file, last)?)
    };
    let files = files
        .iter()
        .map(|f| {
            let (text, dir) = match f.strip_suffix('/') {
                Some(t) => (t, true),
                None => (f.as_str(), false),
            };
            Ok(TryFile {
                name: parse_header_value(d, file, text)?,
                dir,
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    loc.try_files = Some(TryFiles { files, last });
    Ok(())
}

/// `try_files` in `server`: for requests no location matches (nginx does not merge it into
/// locations).
pub(super) fn server_try_files(env: &Env, cx: &mut ServerCx<'_>, d: &Directive, file: &str) -> R {
    let mut tmp = LocP {
        try_files: None,
        internal: false,
        script: Vec::new(),
        kind: LocationKind::Prefix,
        path: String::new(),
        regex: None,
        place: place(d, file),
        handler: None,
        flv: false,
        alias: None,
        alias_vars: None,
        alias_from: None,
        pass: None,
        fcgi_pass: None,
        limit_except: None,
        settings: Settings::default(),
        nested: Vec::new(),
        nested_keys: Default::default(),
    };
    if cx.s.try_files.is_some() {
        return Err(dup(d, file));
    }
    location_try_files(env, &mut tmp, d, file)?;
    cx.s.try_files = tmp.try_files;
    Ok(())
}

pub(super) fn location_internal(_: &Env, loc: &mut LocP, _: &Directive, _: &str) -> R {
    loc.internal = true;
    Ok(())
}

/// `zone=NAME:SIZE` of a `limit_*_zone`.
pub(super) fn zone_param(
    d: &Directive,
    file: &str,
    v: &str,
) -> Result<(String, usize), ConfigError> {
    let (name, size) = v
        .split_once(':')
        .ok_or_else(|| derr(d, file, format!("invalid zone size \"{v}\"")))?;
    let size = parse_size(size)
        .filter(|&n| n >= 8192)
        .ok_or_else(|| derr(d, file, format!("zone \"{name}\" is too small")))?;
    Ok((name.to_string(), size as usize))
}

/// `limit_req_zone KEY zone=NAME:SIZE rate=N r/s|r/m` and `limit_conn_zone KEY zone=NAME:SIZE`.
pub(super) fn http_limit_zone(_: &Env, h: &mut HttpP, d: &Directive, file: &str) -> R {
    let req = d.name == "limit_req_zone";
    let key = parse_header_value(d, file, a0(d))?;
    let mut zone = None;
    let mut rate = None;
    for a in &d.args[1..] {
        if let Some(v) = a.strip_prefix("zone=") {
            zone = Some(zone_param(d, file, v)?);
        } else if let Some(v) = a.strip_prefix("rate=").filter(|_| req) {
            let (n, per) = if let Some(n) = v.strip_suffix("r/s") {
                (n, 1)
            } else if let Some(n) = v.strip_suffix("r/m") {
                (n, 60)
            } else {
                return Err(derr(d, file, format!("invalid rate \"{v}\"")));
            };
            let n: u64 = n
                .parse()
                .ok()
                .filter(|&n| n > 0)
                .ok_or_else(|| derr(d, file, format!("invalid rate \"{v}\"")))?;
            rate = Some(n * 1000 / per);
        } else if a == "sync" {
            return Err(derr(d, file, "\"sync\" is not supported by shard"));
        } else {
            return Err(derr(d, file, format!("invalid parameter \"{a}\"")));
        }
    }
    let Some((name, size)) = zone else {
        return Err(derr(
            d,
            file,
            format!("\"{}\" must have \"zone\" parameter", d.name),
        ));
    };
    if req && rate.is_none() {
        // nginx's default rate is 1r/s.
        rate = Some(1000);
    }
    if h.limit_zones.iter().any(|z| z.name == name) {
        return Err(derr(d, file, format!("duplicate zone \"{name}\"")));
    }
    h.limit_zones.push(LimitZone {
        name,
        key,
        size,
        rate_milli: rate,
        place: place(d, file),
    });
    Ok(())
}

fn zone_ref(env: &Env, name: &str, d: &Directive, file: &str, req: bool) -> usize {
    let mut refs = env.zone_refs.borrow_mut();
    refs.push((name.to_string(), place(d, file), req));
    refs.len() - 1
}

/// `limit_req zone=NAME [burst=N] [nodelay | delay=N]` (repeatable).
pub(super) fn set_limit_req(env: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    let mut zone = None;
    let mut burst = 0;
    let mut delay = 0;
    let mut nodelay = false;
    for a in &d.args {
        if let Some(v) = a.strip_prefix("zone=") {
            zone = Some(v.to_string());
        } else if let Some(v) = a.strip_prefix("burst=") {
            burst = v
                .parse()
                .ok()
                .filter(|&n: &u64| n > 0)
                .ok_or_else(|| derr(d, file, format!("invalid burst value \"{a}\"")))?;
        } else if let Some(v) = a.strip_prefix("delay=") {
            delay = v
                .parse()
                .ok()
                .filter(|&n: &u64| n > 0)
                .ok_or_else(|| derr(d, file, format!("invalid delay value \"{a}\"")))?;
        } else if a == "nodelay" {
            nodelay = true;
        } else {
            return Err(derr(d, file, format!("invalid parameter \"{a}\"")));
        }
    }
    let Some(name) = zone else {
        return Err(derr(d, file, "\"limit_req\" must have \"zone\" parameter"));
    };
    let z = zone_ref(env, &name, d, file, true);
    s.limit_req.get_or_insert_with(Vec::new).push(LimitReq {
        zone: z,
        burst,
        delay: if nodelay { u64::MAX } else { delay },
    });
    Ok(())
}

/// `limit_conn ZONE NUMBER` (repeatable).
pub(super) fn set_limit_conn(env: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    let max: u64 = d.args[1].parse().ok().filter(|&n| n > 0).ok_or_else(|| {
        derr(
            d,
            file,
            format!("invalid number of connections \"{}\"", d.args[1]),
        )
    })?;
    let z = zone_ref(env, a0(d), d, file, false);
    s.limit_conn
        .get_or_insert_with(Vec::new)
        .push(LimitConn { zone: z, max });
    Ok(())
}

/// `limit_req_status` / `limit_conn_status CODE` (400..=599).
pub(super) fn set_limit_status(_: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    let c: u16 = a0(d)
        .parse()
        .ok()
        .filter(|c| (400..=599).contains(c))
        .ok_or_else(|| derr(d, file, "value must be between 400 and 599"))?;
    if d.name == "limit_req_status" {
        once(&mut s.limit_req_status, c, d, file)
    } else {
        once(&mut s.limit_conn_status, c, d, file)
    }
}

/// `limit_req_log_level` / `limit_conn_log_level info | notice | warn | error`.
pub(super) fn set_limit_log_level(_: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    let l = match a0(d) {
        "info" => LogLevel::Info,
        "notice" => LogLevel::Notice,
        "warn" => LogLevel::Warn,
        "error" => LogLevel::Error,
        v => return Err(invalid(d, file, v)),
    };
    if d.name == "limit_req_log_level" {
        once(&mut s.limit_req_log_level, l, d, file)
    } else {
        once(&mut s.limit_conn_log_level, l, d, file)
    }
}

/// `set_real_ip_from ADDRESS | CIDR | unix: | HOSTNAME` (repeatable; a host name stands for
/// every address it resolves to at start, as nginx).
pub(super) fn set_real_ip_from(env: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    let a = a0(d);
    if a == "all" {
        return Err(invalid(d, file, "all"));
    }
    let list = s.real_ip_from.get_or_insert_with(Vec::new);
    if a != "unix:" && parse_cidr(a).is_none() && !a.contains('/') {
        use std::net::ToSocketAddrs;
        let addrs: Vec<IpAddr> = (a, 0)
            .to_socket_addrs()
            .map_err(|_| {
                derr(
                    d,
                    file,
                    format!("host not found in set_real_ip_from \"{a}\""),
                )
            })?
            .map(|sa| sa.ip())
            .collect();
        for ip in addrs {
            let bits = if ip.is_ipv4() { 32 } else { 128 };
            list.push(AccessRule {
                allow: true,
                net: Some((ip, bits)),
                unix: false,
            });
        }
        return Ok(());
    }
    let net = parse_net(env, d, file)?;
    list.push(AccessRule {
        allow: true,
        net,
        unix: a == "unix:",
    });
    Ok(())
}

/// `real_ip_header NAME | X-Real-IP | X-Forwarded-For | proxy_protocol`.
pub(super) fn set_real_ip_header(_: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    once(&mut s.real_ip_header, a0(d).to_ascii_lowercase(), d, file)
}

slot!(set_real_ip_recursive, real_ip_recursive, flag);

/// `allow ADDRESS | CIDR | all` and `deny ...`, in order.
pub(super) fn set_access_rule(env: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    let net = parse_net(env, d, file)?;
    s.access_rules
        .get_or_insert_with(Vec::new)
        .push(AccessRule {
            allow: d.name == "allow",
            net,
            unix: a0(d) == "unix:",
        });
    Ok(())
}

/// `valid_referers none | blocked | server_names | NAME[/URI] | ~REGEX ...` (server,
/// location): what `$invalid_referer` accepts. A level with its own replaces its parent's.
/// `secure_link EXPR`, `secure_link_md5 EXPR` (variables allowed), `secure_link_secret WORD`.
pub(super) fn set_secure_link(_: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    let sl = &mut s.secure_link;
    match d.name.as_str() {
        "secure_link" => once(&mut sl.expr, parse_header_value(d, file, a0(d))?, d, file),
        "secure_link_md5" => once(&mut sl.md5, parse_header_value(d, file, a0(d))?, d, file),
        _ => once(&mut sl.secret, a0(d).to_string(), d, file),
    }?;
    if sl.secret.is_some() && (sl.expr.is_some() || sl.md5.is_some()) {
        return Err(derr(
            d,
            file,
            "\"secure_link_secret\" cannot be mixed with \"secure_link\" and \"secure_link_md5\"",
        ));
    }
    Ok(())
}

pub(super) fn set_valid_referers(_: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    let mut r = Referers::default();
    for a in &d.args {
        match a.as_str() {
            "none" => r.none = true,
            "blocked" => r.blocked = true,
            "server_names" => r.server_names = true,
            re if re.starts_with('~') => {
                r.regexes.push(compile_regex(d, file, &re[1..], true)?);
            }
            name => {
                let (host, uri) = match name.find('/') {
                    Some(i) => (&name[..i], &name[i..]),
                    None => (name, ""),
                };
                r.add(&host.to_ascii_lowercase(), uri);
            }
        }
    }
    once(&mut s.referers, Arc::new(r), d, file)
}

/// `ADDRESS`, `CIDR` or `all` (`None`) of `allow`, `deny`, `set_real_ip_from`.
fn parse_net(env: &Env, d: &Directive, file: &str) -> Result<Option<(IpAddr, u8)>, ConfigError> {
    let a = a0(d);
    if a == "all" {
        return Ok(None);
    }
    if a == "unix:" {
        return Ok(None);
    }
    let (base, bits, exact) = parse_cidr(a).ok_or_else(|| invalid(d, file, a))?;
    if !exact {
        env.warn(d, file, format!("low address bits of {a} are meaningless"));
    }
    Ok(Some((base, bits)))
}

/// `ADDRESS` or `ADDRESS/BITS` (IPv4 or IPv6): the network, its prefix length, and whether
/// the address was the network itself (nginx warns "low address bits of 10.0.0.1/8 are
/// meaningless" and uses the network). Shared by `allow`/`deny`/`set_real_ip_from` and `geo`.
pub(super) fn parse_cidr(a: &str) -> Option<(IpAddr, u8, bool)> {
    let (addr, bits) = match a.split_once('/') {
        Some((addr, bits)) => (addr, Some(bits)),
        None => (a, None),
    };
    let ip: IpAddr = addr.parse().ok()?;
    let max = if ip.is_ipv4() { 32 } else { 128 };
    let bits = match bits {
        None => max,
        Some(b) => b.parse::<u8>().ok().filter(|&n| n <= max)?,
    };
    let base = match ip {
        IpAddr::V4(v) => {
            let m = u32::MAX.checked_shl(32 - u32::from(bits)).unwrap_or(0);
            IpAddr::V4((u32::from(v) & m).into())
        }
        IpAddr::V6(v) => {
            let m = u128::MAX.checked_shl(128 - u32::from(bits)).unwrap_or(0);
            IpAddr::V6((u128::from(v) & m).into())
        }
    };
    Some((base, bits, base == ip))
}

/// `expires [modified] TIME | epoch | max | off`.
pub(super) fn set_expires(_: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    if d.args.iter().any(|a| a.contains('$')) {
        let e = Expires::Var(parse_header_value(d, file, &d.args.join(" "))?);
        return once(&mut s.expires, Some(e), d, file);
    }
    let e = expires_value(&d.args).map_err(|m| derr(d, file, m))?;
    once(&mut s.expires, e, d, file)
}

/// The forms of `expires`' arguments (`None` is `off`).
pub(crate) fn expires_value(args: &[String]) -> Result<Option<Expires>, String> {
    let (modified, v) = match args {
        [m, v] if m == "modified" => (true, v.as_str()),
        [v] => (false, v.as_str()),
        _ => return Err("invalid number of arguments in \"expires\" directive".to_string()),
    };
    let e = match v {
        "off" if !modified => None,
        "epoch" if !modified => Some(Expires::Epoch),
        "max" if !modified => Some(Expires::Max),
        _ => {
            let (neg, t) = match v.strip_prefix('-') {
                Some(t) => (true, t),
                None => (false, v.strip_prefix('+').unwrap_or(v)),
            };
            if let Some(day) = t.strip_prefix('@') {
                if modified {
                    return Err("daily time cannot be used with \"modified\" parameter".into());
                }
                if neg {
                    return Err("invalid value".into());
                }
                let ms = parse_time_ms(day).ok_or_else(|| "invalid value".to_string())?;
                if ms > 24 * 3600 * 1000 {
                    return Err("daily time value must be less than 24 hours".into());
                }
                return Ok(Some(Expires::Daily((ms / 1000) as i64)));
            }
            let ms = parse_time_ms(t).ok_or_else(|| "invalid value".to_string())?;
            let secs = (ms / 1000) as i64;
            Some(Expires::After {
                secs: if neg { -secs } else { secs },
                modified,
            })
        }
    };
    Ok(e)
}

pub(super) fn set_gzip_comp_level(_: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    let n = num::<u32>(d, file, a0(d))?;
    if !(1..=9).contains(&n) {
        return Err(derr(d, file, "value must be between 1 and 9"));
    }
    once(&mut s.gzip.comp_level, n, d, file)
}

pub(super) fn set_gzip_types(_: &Env, s: &mut Settings, d: &Directive, _: &str) -> R {
    // As nginx: repeated in one block, the lists add up; `text/html` is implied.
    let (types, any) = s
        .gzip
        .types
        .get_or_insert_with(|| (vec!["text/html".to_string()], false));
    for a in &d.args {
        if a == "*" {
            *any = true;
        } else {
            let t = a.to_ascii_lowercase();
            if !types.contains(&t) {
                types.push(t);
            }
        }
    }
    Ok(())
}

slot!(set_gzip_min_length, gzip.min_length, size);

slot!(set_gzip_vary, gzip.vary, flag);

slot!(set_gunzip, gzip.gunzip, flag);

/// `gzip_static on | off | always`.
pub(super) fn set_gzip_static(_: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    let v = match a0(d) {
        "on" => GzipStatic::On,
        "off" => GzipStatic::Off,
        "always" => GzipStatic::Always,
        other => return Err(invalid(d, file, other)),
    };
    once(&mut s.gzip.static_mode, v, d, file)
}

/// `1.0` or `1.1`: the minor version.
pub(super) fn http_minor(d: &Directive, file: &str) -> Result<u8, ConfigError> {
    match a0(d) {
        "1.0" => Ok(0),
        "1.1" => Ok(1),
        a => Err(invalid(d, file, a)),
    }
}

pub(super) fn set_gzip_http_version(_: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    let minor = http_minor(d, file)?;
    once(&mut s.gzip.http_version_minor, minor, d, file)
}

pub(super) fn set_proxy_set_header(_: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    // As nginx: repeats add up; a block with any replaces the inherited list.
    let value = parse_header_value(d, file, &d.args[1])?;
    s.proxy
        .set_headers
        .get_or_insert_with(Vec::new)
        .push((a0(d).to_string(), value));
    Ok(())
}

pub(super) fn set_proxy_http_version(_: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    let minor = http_minor(d, file)?;
    once(&mut s.proxy.http_version_minor, minor, d, file)
}

/// `resolver ADDRESS ... [valid=TIME] [ipv4=on|off] [ipv6=on|off] [status_zone=NAME]`: the
/// DNS servers names are resolved through at run time (port 53 unless written).
pub(super) fn set_resolver(_: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    let r = parse_resolver(d, file)?;
    once(&mut s.resolver, r, d, file)
}

/// `resolver`'s arguments (http's and stream's), `resolver_timeout` left at its default.
pub(super) fn parse_resolver(d: &Directive, file: &str) -> Result<ResolverConf, ConfigError> {
    let mut r = ResolverConf {
        servers: Vec::new(),
        valid_ms: None,
        ipv4: true,
        ipv6: true,
        timeout_ms: 30_000,
    };
    for a in &d.args {
        let onoff = |v: &str| match v {
            "on" => Ok(true),
            "off" => Ok(false),
            _ => Err(derr(d, file, format!("invalid parameter \"{a}\""))),
        };
        match a.split_once('=') {
            Some(("valid", v)) => {
                r.valid_ms = Some(
                    parse_time_ms(v)
                        .ok_or_else(|| derr(d, file, format!("invalid parameter \"{a}\"")))?,
                )
            }
            Some(("ipv4", v)) => r.ipv4 = onoff(v)?,
            Some(("ipv6", v)) => r.ipv6 = onoff(v)?,
            Some(("status_zone", _)) => {}
            _ => {
                let addrs = resolve_upstream(a, Some(53))
                    .map_err(|_| derr(d, file, format!("host not found in resolver \"{a}\"")))?;
                r.servers.extend(addrs);
            }
        }
    }
    if !r.ipv4 && !r.ipv6 {
        return Err(derr(
            d,
            file,
            "\"ipv4\" and \"ipv6\" cannot both be \"off\"",
        ));
    }
    if r.servers.is_empty() {
        return Err(derr(d, file, "no name servers defined"));
    }
    Ok(r)
}

slot!(set_resolver_timeout, resolver_timeout_ms, time);

slot!(set_proxy_connect_timeout, proxy.connect_timeout_ms, time);

slot!(set_proxy_read_timeout, proxy.read_timeout_ms, time);

slot!(set_proxy_send_timeout, proxy.send_timeout_ms, time);

pub(super) fn set_proxy_next_upstream(_: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    let nu = parse_next_upstream(d, file)?;
    once(&mut s.proxy.next_upstream, nu, d, file)
}

slot!(
    set_proxy_next_upstream_tries,
    proxy.next_upstream_tries,
    num::<u32>
);

slot!(set_proxy_buffering, proxy.buffering, flag);

slot!(set_proxy_force_ranges, proxy.force_ranges, flag);

/// `fastcgi_force_ranges` (and `scgi_`, `uwsgi_`).
pub(super) fn set_fastcgi_force_ranges(_: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    let v = flag(d, file, a0(d))?;
    once(&mut upstream_knobs(s, &d.name).force_ranges, v, d, file)
}

slot!(
    set_proxy_next_upstream_timeout,
    proxy.next_upstream_timeout_ms,
    time
);

slot!(set_proxy_socket_keepalive, proxy.socket_keepalive, flag);

slot!(
    set_proxy_ignore_client_abort,
    proxy.ignore_client_abort,
    flag
);

slot!(set_proxy_limit_rate, proxy.limit_rate, upstream_rate);

/// `proxy_ignore_headers FIELD ...` (a level with it replaces its parent's; repeats add up).
pub(super) fn set_proxy_ignore_headers(_: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    // Repeats add up, as nginx's bitmask slot.
    let v = ignore_headers(d, file)?;
    s.proxy.ignore_headers = Some(s.proxy.ignore_headers.unwrap_or(0) | v);
    Ok(())
}

/// nginx's fields of `proxy_ignore_headers`/`fastcgi_ignore_headers` (any case), as
/// [`ignore`] bits.
pub(super) fn ignore_headers(d: &Directive, file: &str) -> Result<u16, ConfigError> {
    let mut bits = 0;
    for a in &d.args {
        let Some(i) = ignore::FIELDS
            .iter()
            .position(|f| f.eq_ignore_ascii_case(a))
        else {
            return Err(invalid(d, file, a));
        };
        bits |= 1 << i;
    }
    Ok(bits)
}

/// `proxy_limit_rate` / `fastcgi_limit_rate RATE`: bytes per second, `0` off (no variables,
/// as nginx).
pub(super) fn upstream_rate(d: &Directive, file: &str, v: &str) -> Result<u64, ConfigError> {
    parse_size(v).ok_or_else(|| invalid(d, file, v))
}

slot!(set_proxy_pass_request_body, proxy.pass_request_body, flag);

/// `proxy_set_body VALUE` (variables allowed).
pub(super) fn set_proxy_set_body(_: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    let v = parse_header_value(d, file, a0(d))?;
    once(&mut s.proxy.set_body, v, d, file)
}

slot!(set_proxy_request_buffering, proxy.request_buffering, flag);

slot!(set_proxy_intercept_errors, proxy.intercept_errors, flag);

slot!(
    set_proxy_pass_request_headers,
    proxy.pass_request_headers,
    flag
);

/// `proxy_bind ADDRESS[:PORT] [transparent] | off` (http and stream), `fastcgi_bind`: the
/// local address of upstream connections, variables allowed (an empty value binds nothing),
/// and whether it may be foreign (`transparent`: the workers keep `CAP_NET_RAW`, as nginx's).
pub(super) fn parse_bind(
    d: &Directive,
    file: &str,
) -> Result<(Option<Vec<Part>>, bool), ConfigError> {
    let v = a0(d);
    let transparent = match d.args.get(1).map(String::as_str) {
        None => false,
        Some("transparent") => true,
        Some(extra) => return Err(derr(d, file, format!("invalid parameter \"{extra}\""))),
    };
    if v == "off" {
        return Ok((None, false));
    }
    let parts = parse_header_value(d, file, v)?;
    if parts.iter().all(|p| matches!(p, Part::Lit(_))) && crate::parse_bind_addr(v).is_none() {
        return Err(derr(d, file, format!("invalid address \"{v}\"")));
    }
    Ok((Some(parts), transparent))
}

pub(super) fn set_proxy_bind(_: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    let (b, transparent) = parse_bind(d, file)?;
    once(&mut s.proxy.bind, b, d, file)?;
    s.proxy.bind_transparent = Some(transparent);
    Ok(())
}

/// `proxy_method METHOD` (variables allowed): the method sent upstream.
/// The `ProxyP` a `proxy_*`, `fastcgi_*`, `scgi_*` or `uwsgi_*` directive sets.
fn upstream_knobs<'s>(s: &'s mut Settings, name: &str) -> &'s mut ProxyP {
    if name.starts_with("fastcgi_") {
        &mut s.fcgi.up
    } else if name.starts_with("scgi_") {
        &mut s.scgi.up
    } else if name.starts_with("uwsgi_") {
        &mut s.uwsgi.up
    } else if name.starts_with("memcached_") {
        &mut s.memcached.up
    } else if name.starts_with("grpc_") {
        &mut s.grpc.up
    } else {
        &mut s.proxy
    }
}

/// `proxy_store on | off | STRING` (`fastcgi_store` the same).
pub(super) fn set_proxy_store(_: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    let v = match a0(d) {
        "on" => Some(Store::Mapped),
        "off" => None,
        other => Some(Store::Path(parse_header_value(d, file, other)?)),
    };
    let p = upstream_knobs(s, &d.name);
    once(&mut p.store, v, d, file)
}

/// `proxy_store_access users:rw group:rw all:r` (`fastcgi_store_access` the same).
pub(super) fn set_proxy_store_access(_: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    let mode = access_mode(d, file)?;
    let p = upstream_knobs(s, &d.name);
    once(&mut p.store_access, mode, d, file)
}

/// `dav_methods off | METHOD ...` (`PUT`, `DELETE`, `MKCOL`, `COPY`, `MOVE`).
pub(super) fn set_dav_methods(_: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    let mut bits = 0u8;
    for a in &d.args {
        bits |= match a.as_str() {
            "off" if d.args.len() == 1 => 0,
            "PUT" => DavConf::PUT,
            "DELETE" => DavConf::DELETE,
            "MKCOL" => DavConf::MKCOL,
            "COPY" => DavConf::COPY,
            "MOVE" => DavConf::MOVE,
            _ => return Err(invalid(d, file, a)),
        };
    }
    once(&mut s.dav_methods, bits, d, file)
}

/// `dav_access users:rw group:r ...`, as `proxy_store_access`.
pub(super) fn set_dav_access(_: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    let mode = access_mode(d, file)?;
    once(&mut s.dav_access, mode, d, file)
}

slot!(set_create_full_put_path, create_full_put_path, flag);

slot!(set_min_delete_depth, min_delete_depth, num::<u32>);

/// The mode `user:rw group:r all:r` names (nginx's `ngx_conf_set_access_slot`): group or
/// all rights alone give the user `rw`.
fn access_mode(d: &Directive, file: &str) -> Result<u32, ConfigError> {
    let mut mode = 0u32;
    let mut user = false;
    for a in &d.args {
        let Some((who, rights)) = a.split_once(':') else {
            return Err(invalid(d, file, a));
        };
        let shift = match who {
            "user" => {
                user = true;
                6
            }
            "group" => 3,
            "all" => 0,
            _ => return Err(invalid(d, file, a)),
        };
        let bits = match rights {
            "r" => 4,
            "rw" => 6,
            _ => return Err(invalid(d, file, a)),
        };
        mode |= bits << shift;
    }
    // Group or all rights given without the user's: the user may read and write (nginx).
    if !user {
        mode |= 0o600;
    }
    Ok(mode)
}

pub(super) fn set_proxy_method(_: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    let m = parse_header_value(d, file, a0(d))?;
    once(&mut s.proxy.method, m, d, file)
}

/// `proxy_hide_header NAME` and `proxy_pass_header NAME` (only headers hidden by default can
/// be passed): repeatable, lowercase; a level with any replaces its parent's list.
pub(super) fn set_proxy_header_list(_: &Env, s: &mut Settings, d: &Directive, _: &str) -> R {
    let list = if d.name == "proxy_hide_header" {
        &mut s.proxy.hide_headers
    } else {
        &mut s.proxy.pass_headers
    };
    list.get_or_insert_with(Vec::new)
        .push(a0(d).to_ascii_lowercase());
    Ok(())
}

/// `proxy_cookie_domain off | DOMAIN REPLACEMENT` and `proxy_cookie_path off | PATH
/// REPLACEMENT`: repeatable, a level with any replaces its parent's list, `off` alone
/// clears it. Replacements may have variables; regular expressions are refused as in
/// `proxy_redirect`.
pub(super) fn set_proxy_cookie(_: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    let list = if d.name == "proxy_cookie_domain" {
        &mut s.proxy.cookie_domain
    } else {
        &mut s.proxy.cookie_path
    };
    match d.args.as_slice() {
        [a] if a == "off" => {
            if list.as_ref().is_some_and(|l| !l.is_empty()) {
                return Err(derr(d, file, format!("invalid parameter \"{a}\"")));
            }
            *list = Some(Vec::new());
            Ok(())
        }
        [from, to] => {
            let mut rule = rewrite_rule(d, file, from, to)?;
            if d.name == "proxy_cookie_domain" {
                // nginx: a domain's expression is always caseless, and a leading dot of the
                // replacement goes (the value's own dot is kept).
                if let RewriteFrom::Regex(_) = rule.from {
                    let re = from.trim_start_matches('~').trim_start_matches('*');
                    rule.from = RewriteFrom::Regex(compile_regex(d, file, re, true)?);
                }
                if let Some(Part::Lit(t)) = rule.to.first_mut() {
                    if let Some(rest) = t.strip_prefix('.') {
                        *t = rest.to_string();
                    }
                }
            }
            list.get_or_insert_with(Vec::new).push(rule);
            Ok(())
        }
        _ => Err(derr(
            d,
            file,
            format!("invalid number of arguments in \"{}\" directive", d.name),
        )),
    }
}

/// `proxy_cookie_flags off | COOKIE [FLAG ...]`: repeatable, a level with any replaces its
/// parent's list; `COOKIE` is a name (variables allowed) or `~REGEX`/`~*REGEX`; flags
/// `secure`, `httponly`, `samesite[=strict|lax|none]` and their `no` forms.
pub(super) fn set_proxy_cookie_flags(_: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    let list = &mut s.proxy.cookie_flags;
    if d.args.len() == 1 && d.args[0] == "off" {
        if list.as_ref().is_some_and(|l| !l.is_empty()) {
            return Err(derr(d, file, "invalid parameter \"off\""));
        }
        *list = Some(Vec::new());
        return Ok(());
    }
    if list.as_ref().is_some_and(|l| l.is_empty()) {
        return Err(derr(
            d,
            file,
            "\"proxy_cookie_flags\" directive is duplicate",
        ));
    }
    let name = &d.args[0];
    // nginx compiles a cookie's expression caseless, whatever the prefix.
    let cookie = if let Some(re) = name.strip_prefix("~*") {
        CookieName::Regex(compile_regex(d, file, re, true)?)
    } else if let Some(re) = name.strip_prefix('~') {
        CookieName::Regex(compile_regex(d, file, re, true)?)
    } else {
        CookieName::Name(parse_header_value(d, file, name)?)
    };
    let mut flags = Vec::new();
    for a in &d.args[1..] {
        let f = match CookieFlag::parse(a) {
            Some(f) => f,
            None if has_variables(a) => CookieFlag::Vars(parse_header_value(d, file, a)?),
            None => return Err(derr(d, file, format!("invalid parameter \"{a}\""))),
        };
        flags.push(f);
    }
    if flags.is_empty() {
        return Err(derr(
            d,
            file,
            "invalid number of arguments in \"proxy_cookie_flags\" directive",
        ));
    }
    list.get_or_insert_with(Vec::new)
        .push(CookieFlags { cookie, flags });
    Ok(())
}

/// `proxy_redirect default | off | REDIRECT REPLACEMENT`.
pub(super) fn set_proxy_redirect(_: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    let v = match d.args.as_slice() {
        [a] if a == "false" || a == "off" => ProxyRedirect::Off,
        [a] if a == "default" => match &mut s.proxy.redirect {
            // `default` among other rules keeps its place in the list.
            Some(ProxyRedirect::Pairs(v)) => {
                v.push(RewriteRule {
                    from: RewriteFrom::Default,
                    to: Vec::new(),
                });
                return Ok(());
            }
            _ => ProxyRedirect::Default,
        },
        [a] => return Err(invalid(d, file, a)),
        [from, to] => {
            let rule = rewrite_rule(d, file, from, to)?;
            match &mut s.proxy.redirect {
                Some(ProxyRedirect::Pairs(v)) => {
                    v.push(rule);
                    return Ok(());
                }
                Some(ProxyRedirect::Default) => ProxyRedirect::Pairs(vec![
                    RewriteRule {
                        from: RewriteFrom::Default,
                        to: Vec::new(),
                    },
                    rule,
                ]),
                _ => ProxyRedirect::Pairs(vec![rule]),
            }
        }
        _ => {
            return Err(derr(
                d,
                file,
                "invalid number of arguments in \"proxy_redirect\" directive",
            ))
        }
    };
    s.proxy.redirect = Some(v);
    Ok(())
}

/// One `FROM TO` rule of `proxy_redirect` / `proxy_cookie_domain` / `proxy_cookie_path`:
/// `FROM` is text, text with variables, or `~REGEX` / `~*REGEX` (its captures usable in `TO`).
fn rewrite_rule(
    d: &Directive,
    file: &str,
    from: &str,
    to: &str,
) -> Result<RewriteRule, ConfigError> {
    let from = if let Some(re) = from.strip_prefix("~*") {
        RewriteFrom::Regex(compile_regex(d, file, re, true)?)
    } else if let Some(re) = from.strip_prefix('~') {
        RewriteFrom::Regex(compile_regex(d, file, re, false)?)
    } else if has_variables(from) {
        RewriteFrom::Vars(parse_header_value(d, file, from)?)
    } else {
        RewriteFrom::Text(from.to_string())
    };
    Ok(RewriteRule {
        from,
        to: parse_header_value(d, file, to)?,
    })
}

/// `gzip_proxied off | any | expired no-cache no-store private no_last_modified no_etag auth`.
pub(super) fn set_gzip_proxied(_: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    let mut p = GzipProxied::default();
    for a in &d.args {
        match a.as_str() {
            "off" => {}
            "any" => p.any = true,
            "expired" => p.expired = true,
            "no-cache" => p.no_cache = true,
            "no-store" => p.no_store = true,
            "private" => p.private = true,
            "no_last_modified" => p.no_last_modified = true,
            "no_etag" => p.no_etag = true,
            "auth" => p.auth = true,
            _ => return Err(invalid(d, file, a)),
        }
    }
    once(&mut s.gzip.proxied, p, d, file)
}

slot!(set_proxy_buffer_size, proxy.buffer_size, buffer_size);

pub(super) fn set_proxy_buffers(_: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    let v = buffers(d, file)?;
    once(&mut s.proxy.buffers, v, d, file)
}

/// `proxy_buffers`/`fastcgi_buffers NUMBER SIZE`: at least 2, bounded in all.
pub(super) fn buffers(d: &Directive, file: &str) -> Result<(usize, usize), ConfigError> {
    let n = num::<usize>(d, file, a0(d))?;
    let size = buffer_size(d, file, &d.args[1])?;
    if n == 0 {
        return Err(invalid(d, file, a0(d)));
    }
    if n < 2 {
        return Err(derr(
            d,
            file,
            format!("there must be at least 2 \"{}\"", d.name),
        ));
    }
    // The buffers are memory a worker holds per proxied response: bounded like one buffer.
    if n.checked_mul(size).is_none_or(|t| t > MAX_PROXY_BUFFER) {
        return Err(invalid(d, file, a0(d)));
    }
    Ok((n, size))
}

/// The bundled `mime.types` as a map, parsed once.
pub(crate) fn bundled_types() -> Arc<crate::model::MimeTypes> {
    static MAP: OnceLock<Arc<crate::model::MimeTypes>> = OnceLock::new();
    MAP.get_or_init(|| {
        let mut map = crate::model::MimeTypes::default();
        for item in parse_tree(MIME_TYPES, "mime.types") {
            if let Item::Dir(t) = item {
                for entry in t.block.unwrap_or_default() {
                    if let Item::Dir(e) = entry {
                        for ext in e.args {
                            map.insert(ext.to_ascii_lowercase(), e.name.clone());
                        }
                    }
                }
            }
        }
        Arc::new(map)
    })
    .clone()
}

/// The largest `proxy_buffer_size`, and the largest `proxy_buffers` total: memory a worker
/// holds for one proxied response.
pub(super) const MAX_PROXY_BUFFER: usize = 1 << 30;

pub(super) fn buffer_size(d: &Directive, file: &str, v: &str) -> Result<usize, ConfigError> {
    match size(d, file, v)? {
        n if n == 0 || n > MAX_PROXY_BUFFER as u64 => Err(invalid(d, file, v)),
        n => Ok(n as usize),
    }
}

/// `proxy_pass http[s]://HOST[:PORT][/URI]` (nginx's `ngx_parse_url` with a URI part; errors
/// worded as nginx's, `... in upstream "REST"` with REST the text after the scheme).
pub(super) fn parse_proxy_pass(d: &Directive, file: &str) -> Result<PassP, ConfigError> {
    let url = d.args[0].as_str();
    let starts = |p: &str| {
        url.len() >= p.len() && url.as_bytes()[..p.len()].eq_ignore_ascii_case(p.as_bytes())
    };
    let tls = starts("https://");
    // With variables, nginx checks the prefix of the rendered URL only (`http:/$uri` is a
    // valid `proxy_pass`): shard's run-time check is the same.
    if !starts("http://") && !tls && !url.contains('$') {
        return Err(derr(d, file, format!("invalid URL prefix in \"{url}\"")));
    }
    if url.contains('$') {
        // Rendered and resolved per request (a named upstream, an address, or `resolver`).
        let parts = parse_header_value(d, file, url)?;
        return Ok(PassP {
            host: String::new(),
            port: None,
            uri: None,
            place: place(d, file),
            tls,
            dynamic: Some(parts),
        });
    }
    // The scheme is ASCII, so this is a character boundary.
    let rest = &url[if tls { 8 } else { 7 }..];
    if let Some(path) = rest.strip_prefix("unix:") {
        // `http://unix:/run/app.sock:/uri`: as nginx, the path ends at the first `:`,
        // and what follows it is the URI.
        let (path, uri) = match path.split_once(':') {
            Some((p, u)) => (p, Some(u).filter(|u| !u.is_empty())),
            None => (path, None),
        };
        if path.is_empty() {
            return Err(derr(
                d,
                file,
                format!("no path in the unix domain socket \"{rest}\""),
            ));
        }
        return Ok(PassP {
            host: format!("unix:{path}"),
            port: None,
            uri: uri.map(str::to_string),
            place: place(d, file),
            tls,
            dynamic: None,
        });
    }
    let bad = |what: &str| derr(d, file, format!("{what} in upstream \"{rest}\""));
    let port_of = |p: &str| -> Result<(u16, String), ConfigError> {
        match p.parse::<u16>() {
            Ok(n) if n > 0 && is_digits(p) => Ok((n, p.to_string())),
            _ => Err(bad("invalid port")),
        }
    };
    let (host, port, uri) = if let Some(v6) = rest.strip_prefix('[') {
        let Some(close) = v6.find(']') else {
            return Err(bad("invalid host"));
        };
        let after = &v6[close + 1..];
        let (port_part, uri) = match after.find('/') {
            Some(i) => (&after[..i], Some(&after[i..])),
            None => (after, None),
        };
        let port = match port_part.strip_prefix(':') {
            Some(p) => Some(port_of(p)?),
            None if port_part.is_empty() => None,
            None => return Err(bad("invalid host")),
        };
        let addr = &v6[..close];
        if addr.is_empty() {
            return Err(bad("no host"));
        }
        if addr.parse::<Ipv6Addr>().is_err() {
            return Err(bad("invalid IPv6 address"));
        }
        (&rest[..close + 2], port, uri)
    } else {
        // As nginx, the URI part starts at the first `/`, or at a `?` before it.
        let (host_port, uri) = match rest.find(['/', '?']) {
            Some(i) => (&rest[..i], Some(&rest[i..])),
            None => (rest, None),
        };
        let (host, port) = match host_port.split_once(':') {
            Some((h, p)) => (h, Some(port_of(p)?)),
            None => (host_port, None),
        };
        if host.is_empty() {
            return Err(bad("no host"));
        }
        (host, port, uri)
    };
    Ok(PassP {
        host: host.to_string(),
        port,
        uri: uri.map(str::to_string),
        place: place(d, file),
        tls,
        dynamic: None,
    })
}

/// Every `proxy_ssl_*` directive of http (`proxy_pass https://`).
pub(super) fn set_proxy_ssl(env: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    apply_proxy_ssl(env, &mut s.proxy.ssl, d, file, &mut |name| {
        variable(d, file, name)
    })
}

/// `uwsgi_ssl_*`: `proxy_ssl_*`'s twins for `uwsgi_pass suwsgi://...`, read by the same
/// code under the proxy's name (messages name the directive as written).
pub(super) fn set_uwsgi_ssl(env: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    let mut twin = d.clone();
    twin.name = d.name.replacen("uwsgi_", "proxy_", 1);
    apply_proxy_ssl(env, &mut s.uwsgi.up.ssl, &twin, file, &mut |name| {
        variable(d, file, name)
    })
    .map_err(|mut e| {
        e.message = e.message.replace(&twin.name, &d.name);
        e
    })
}

/// A `grpc_*` directive: its `proxy_*` twin's handler, run on the `grpc_*` settings
/// (nginx's grpc module has the proxy's knobs under its own names); messages name the
/// directive as written.
pub(super) fn set_grpc(env: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    let mut twin = d.clone();
    twin.name = d.name.replacen("grpc_", "proxy_", 1);
    let Some(Set::Settings(set)) = super::table::TABLE
        .iter()
        .find(|x| x.name == twin.name && x.ctx & table::HSL == table::HSL)
        .map(|x| x.set)
    else {
        return Err(derr(d, file, format!("unknown directive \"{}\"", d.name)));
    };
    std::mem::swap(&mut s.proxy, &mut s.grpc.up);
    let res = set(env, s, &twin, file);
    std::mem::swap(&mut s.proxy, &mut s.grpc.up);
    res.map_err(|mut e| {
        e.message = e.message.replace(&twin.name, &d.name);
        e
    })
}

/// One `proxy_ssl_*` directive, http's or stream's, by its name; variables named as `var`
/// knows them.
pub(super) fn apply_proxy_ssl(
    env: &Env,
    p: &mut ProxySslP,
    d: &Directive,
    file: &str,
    var: &mut dyn FnMut(&str) -> Result<Var, ConfigError>,
) -> R {
    let v = a0(d);
    match d.name.as_str() {
        "proxy_ssl" => once(&mut p.enabled, flag(d, file, v)?, d, file),
        "proxy_ssl_verify" => once(&mut p.verify, flag(d, file, v)?, d, file),
        "proxy_ssl_server_name" => once(&mut p.server_name, flag(d, file, v)?, d, file),
        "proxy_ssl_session_reuse" => once(&mut p.session_reuse, flag(d, file, v)?, d, file),
        "proxy_ssl_name" => {
            // `$proxy_host` alone is the default (stored empty); other variables are
            // rendered per request.
            let name = if v == "$proxy_host" {
                String::new()
            } else {
                v.to_string()
            };
            if has_variables(v) && v != "$proxy_host" {
                p.name_vars = Some(NameTpl {
                    raw: v.to_string(),
                    parts: parse_value_with(d, file, v, var)?,
                });
            }
            once(&mut p.name, name, d, file)
        }
        "proxy_ssl_protocols" => {
            for a in &d.args {
                if !["SSLv2", "SSLv3", "TLSv1", "TLSv1.1", "TLSv1.2", "TLSv1.3"]
                    .contains(&a.as_str())
                {
                    return Err(invalid(d, file, a));
                }
            }
            if !d.args.iter().any(|a| a == "TLSv1.2" || a == "TLSv1.3") {
                return Err(derr(
                    d,
                    file,
                    "\"proxy_ssl_protocols\" names no protocol shard speaks (TLSv1.2, TLSv1.3)",
                ));
            }
            once(&mut p.protocols, d.args.clone(), d, file)
        }
        "proxy_ssl_ciphers" => once(&mut p.ciphers, v.to_string(), d, file),
        "proxy_ssl_crl" => once(&mut p.crl, pem_path(env, d, file)?, d, file),
        "proxy_ssl_trusted_certificate" => {
            once(&mut p.trusted_certificate, pem_path(env, d, file)?, d, file)
        }
        "proxy_ssl_certificate" | "proxy_ssl_certificate_key" if has_variables(v) => {
            // Loaded per request, as nginx 1.21.0+.
            let parts = parse_value_with(d, file, v, var)?;
            p.conf_dir = Some(env.resolve_conf(""));
            let slot = if d.name.ends_with("_key") {
                &mut p.certificate_key_tpl
            } else {
                &mut p.certificate_tpl
            };
            once(slot, (v.to_string(), parts), d, file)
        }
        "proxy_ssl_certificate" => once(&mut p.certificate, pem_path(env, d, file)?, d, file),
        "proxy_ssl_certificate_key" => {
            once(&mut p.certificate_key, pem_path(env, d, file)?, d, file)
        }
        "proxy_ssl_password_file" => once(&mut p.password_file, pem_path(env, d, file)?, d, file),
        "proxy_ssl_conf_command" => {
            let command = conf_command(env, d, file)?;
            p.conf_commands.get_or_insert_with(Vec::new).push(command);
            Ok(())
        }
        _ => Err(derr(d, file, format!("unknown directive \"{}\"", d.name))),
    }
}

/// A PEM file named by a `proxy_ssl_*` directive, relative to the configuration's directory.
fn pem_path(env: &Env, d: &Directive, file: &str) -> Result<PathBuf, ConfigError> {
    let v = a0(d);
    if has_variables(v) || v.starts_with("data:") || v.starts_with("engine:") {
        return Err(derr(
            d,
            file,
            format!(
                "\"{}\" must name a PEM file (no variables, \"data:\" or \"engine:\")",
                d.name
            ),
        ));
    }
    Ok(env.resolve_conf(v))
}

/// A `proxy_set_header` value: literal text, `$name` and `${name}`. A `$` not followed by a
/// name character is literal text.
pub(super) fn parse_header_value(
    d: &Directive,
    file: &str,
    v: &str,
) -> Result<Vec<Part>, ConfigError> {
    parse_value_with(d, file, v, &mut |name| variable(d, file, name))
}

/// [`parse_header_value`] with the variables `var` knows (the stream module has its own).
pub(super) fn parse_value_with(
    d: &Directive,
    file: &str,
    v: &str,
    var: &mut dyn FnMut(&str) -> Result<Var, ConfigError>,
) -> Result<Vec<Part>, ConfigError> {
    let is_name = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    let b = v.as_bytes();
    let mut parts = Vec::new();
    // Every split is at an ASCII byte (`$`, `{`, `}`, name characters): slicing `v` is safe.
    let mut lit_start = 0;
    let mut i = 0;
    while i < b.len() {
        if b[i] != b'$' {
            i += 1;
            continue;
        }
        let bracket = b.get(i + 1) == Some(&b'{');
        let start = if bracket { i + 2 } else { i + 1 };
        let mut end = start;
        while end < b.len() && is_name(b[end]) {
            end += 1;
        }
        if end == start {
            i += 1;
            continue;
        }
        let name = &v[start..end];
        if bracket && b.get(end) != Some(&b'}') {
            return Err(derr(
                d,
                file,
                format!("the closing bracket in \"{name}\" variable is missing"),
            ));
        }
        if lit_start < i {
            parts.push(Part::Lit(v[lit_start..i].to_string()));
        }
        parts.push(Part::Var(var(name)?));
        i = if bracket { end + 1 } else { end };
        lit_start = i;
    }
    if lit_start < b.len() {
        parts.push(Part::Lit(v[lit_start..].to_string()));
    }
    Ok(parts)
}

/// The variables shard knows (names compare without case, as nginx's).
pub(super) fn variable(d: &Directive, file: &str, name: &str) -> Result<Var, ConfigError> {
    Ok(variable_with(name, |n| user_variable(d, file, n)))
}

/// The variable `name` names at run time (an SSI command's): one shard does not know is a
/// user variable (`set`, `map`), empty unless something gave it a value.
pub fn runtime_variable(name: &str) -> Var {
    variable_with(name, |n| Var::User(n.to_string()))
}

fn variable_with(name: &str, user: impl FnOnce(&str) -> Var) -> Var {
    let name = name.to_ascii_lowercase();
    if let Some(v) = Var::tls(&name) {
        return v;
    }
    let prefixed = |p: &str| name.strip_prefix(p).filter(|n| !n.is_empty());
    if let Some(g) = name.strip_prefix("geoip_").and_then(GeoipVar::by_name) {
        return Var::Geoip(g);
    }
    // The userid module's: values the request's userid step sets (`$uid_reset` is the
    // configuration's, through a `map` or `set`).
    if matches!(name.as_str(), "uid_got" | "uid_set" | "uid_reset") {
        return Var::User(name);
    }
    match name.as_str() {
        "host" => Var::Host,
        "remote_addr" => Var::RemoteAddr,
        "remote_port" => Var::RemotePort,
        "remote_user" => Var::RemoteUser,
        "binary_remote_addr" => Var::BinaryRemoteAddr,
        "server_addr" => Var::ServerAddr,
        "server_port" => Var::ServerPort,
        "server_name" => Var::ServerName,
        "server_protocol" => Var::ServerProtocol,
        "http2" => Var::Http2,
        "http3" => Var::Http3,
        "scheme" => Var::Scheme,
        "https" => Var::Https,
        "ssl_early_data" => Var::SslEarlyData,
        "request_uri" => Var::RequestUri,
        "request_body" => Var::RequestBody,
        "request_body_file" => Var::RequestBodyFile,
        "pipe" => Var::Pipe,
        "uri" | "document_uri" => Var::Uri,
        "args" | "query_string" => Var::Args,
        "is_args" => Var::IsArgs,
        "request" => Var::Request,
        "request_method" => Var::RequestMethod,
        "request_length" => Var::RequestLength,
        "content_type" => Var::ContentType,
        "content_length" => Var::ContentLength,
        "document_root" => Var::DocumentRoot,
        "realpath_root" => Var::RealpathRoot,
        "request_filename" => Var::RequestFilename,
        "fastcgi_script_name" => Var::FastcgiScriptName,
        "fastcgi_path_info" => Var::FastcgiPathInfo,
        "status" => Var::Status,
        "body_bytes_sent" => Var::BodyBytesSent,
        "bytes_sent" => Var::BytesSent,
        "request_time" => Var::RequestTime,
        "msec" => Var::Msec,
        "time_local" => Var::TimeLocal,
        "date_gmt" => Var::DateGmt,
        "date_local" => Var::DateLocal,
        "time_iso8601" => Var::TimeIso8601,
        "request_id" => Var::RequestId,
        "connection" => Var::Connection,
        "connection_requests" => Var::ConnectionRequests,
        "connection_time" => Var::ConnectionTime,
        "invalid_referer" => Var::InvalidReferer,
        "secure_link" => Var::SecureLink,
        "secure_link_expires" => Var::SecureLinkExpires,
        "realip_remote_addr" => Var::RealipRemoteAddr,
        "realip_remote_port" => Var::RealipRemotePort,
        "limit_req_status" => Var::LimitReqStatus,
        "limit_conn_status" => Var::LimitConnStatus,
        "pid" => Var::Pid,
        "hostname" => Var::Hostname,
        "limit_rate" => Var::LimitRate,
        "connections_active" => Var::Connections(0),
        "connections_reading" => Var::Connections(1),
        "connections_writing" => Var::Connections(2),
        "connections_waiting" => Var::Connections(3),
        "nginx_version" => Var::NginxVersion,
        "proxy_host" => Var::ProxyHost,
        "proxy_port" => Var::ProxyPort,
        "proxy_add_x_forwarded_for" => Var::ProxyAddXForwardedFor,
        "upstream_addr" => Var::UpstreamAddr,
        "proxy_protocol_addr" => Var::ProxyProtocolAddr,
        "proxy_protocol_port" => Var::ProxyProtocolPort,
        "proxy_protocol_server_addr" => Var::ProxyProtocolServerAddr,
        "proxy_protocol_server_port" => Var::ProxyProtocolServerPort,
        "upstream_status" => Var::UpstreamStatus,
        "upstream_response_time" => Var::UpstreamResponseTime,
        "upstream_connect_time" => Var::UpstreamConnectTime,
        "upstream_header_time" => Var::UpstreamHeaderTime,
        "upstream_response_length" => Var::UpstreamResponseLength,
        "upstream_bytes_received" => Var::UpstreamBytesReceived,
        "upstream_bytes_sent" => Var::UpstreamBytesSent,
        "upstream_cache_status" => Var::UpstreamCacheStatus,
        "slice_range" => Var::SliceRange,
        n if n.len() == 1 && n.as_bytes()[0].is_ascii_digit() => {
            Var::Capture(n.as_bytes()[0] - b'0')
        }
        _ => {
            if let Some(n) = prefixed("http_") {
                Var::Http(n.replace('_', "-"))
            } else if let Some(n) = prefixed("proxy_protocol_tlv_") {
                Var::ProxyProtocolTlv(n.to_string())
            } else if let Some(n) = prefixed("upstream_http_") {
                Var::UpstreamHttp(n.replace('_', "-"))
            } else if let Some(n) = prefixed("upstream_cookie_") {
                Var::UpstreamCookie(n.to_string())
            } else if let Some(n) = prefixed("sent_http_") {
                Var::SentHttp(n.replace('_', "-"))
            } else if let Some(n) = prefixed("sent_trailer_") {
                Var::SentTrailer(n.replace('_', "-"))
            } else if let Some(n) = name.strip_prefix("arg_") {
                // `$arg_` alone is the argument with an empty name (`?=x`), as nginx.
                Var::Arg(n.to_string())
            } else if let Some(n) = prefixed("cookie_") {
                Var::Cookie(n.to_string())
            } else {
                user(&name)
            }
        }
    }
}

/// The `http_NNN` values of `proxy_next_upstream`, ascending; bit i of a mask is entry i.
pub(super) const NEXT_STATUSES: [u16; 7] = [403, 404, 429, 500, 502, 503, 504];

/// The statuses of `mask` as a `&'static` slice (`NextUpstream::statuses` is `&'static` so
/// the model stays `Copy`). All 128 combinations are built, and leaked, once per process
/// (well under 1 KiB), so parsing again on every reload leaks nothing more.
pub(super) fn next_statuses(mask: u8) -> &'static [u16] {
    static ALL: OnceLock<Vec<&'static [u16]>> = OnceLock::new();
    ALL.get_or_init(|| {
        (0..1u16 << NEXT_STATUSES.len())
            .map(|m| {
                let v: Vec<u16> = NEXT_STATUSES
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| m & (1 << i) != 0)
                    .map(|(_, c)| *c)
                    .collect();
                &*Box::leak(v.into_boxed_slice())
            })
            .collect()
    })[mask as usize]
}

/// `proxy_next_upstream error | timeout | invalid_header | http_NNN | non_idempotent ... | off`.
pub(super) fn parse_next_upstream(d: &Directive, file: &str) -> Result<NextUpstream, ConfigError> {
    let mut nu = NextUpstream::OFF;
    let mut mask = 0u8;
    for a in &d.args {
        let v = a.to_ascii_lowercase();
        match v.as_str() {
            "error" => nu.error = true,
            "timeout" => nu.timeout = true,
            "invalid_header" => nu.invalid_header = true,
            "non_idempotent" => nu.non_idempotent = true,
            // `off` stands alone (nginx lets it override the others silently).
            "off" if d.args.len() == 1 => {}
            _ => {
                let code = v.strip_prefix("http_").filter(|c| is_digits(c));
                let i = code
                    .and_then(|c| NEXT_STATUSES.iter().position(|s| s.to_string() == c))
                    .ok_or_else(|| invalid(d, file, a))?;
                mask |= 1 << i;
            }
        }
    }
    nu.statuses = next_statuses(mask);
    Ok(nu)
}

/// `ssl_certificate FILE` (repeatable: one per key type). Relative to the configuration's
/// directory, as nginx's; variables (nginx's per-SNI loading) are refused.
pub(super) fn set_ssl_certificate(env: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    apply_ssl_path(env, &mut s.ssl, d, file, &mut |name| {
        variable(d, file, name)
    })
}

pub(super) fn set_ssl_certificate_key(env: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    apply_ssl_path(env, &mut s.ssl, d, file, &mut |name| {
        variable(d, file, name)
    })
}

/// `ssl_certificate` or `ssl_certificate_key` into `p`, variables named as `var` knows them
/// (http's or stream's). With variables (nginx 1.15.9+) the path is a template the worker
/// renders at each handshake, relative to the configuration's directory.
pub(super) fn apply_ssl_path(
    env: &Env,
    p: &mut SslP,
    d: &Directive,
    file: &str,
    var: &mut dyn FnMut(&str) -> Result<Var, ConfigError>,
) -> R {
    let v = a0(d);
    if has_variables(v) {
        let parts = parse_value_with(d, file, v, var)?;
        p.conf_dir = Some(env.resolve_conf(""));
        let list = if d.name.ends_with("_key") {
            &mut p.keys
        } else {
            &mut p.certificates
        };
        list.get_or_insert_with(Vec::new).push(SslPath {
            path: PathBuf::from(v),
            place: place(d, file),
            tpl: Some((v.to_string(), parts)),
        });
        return Ok(());
    }
    if v.starts_with("data:") || v.starts_with("engine:") {
        return Err(derr(
            d,
            file,
            format!(
                "\"{}\" must name a PEM file (\"data:\" and \"engine:\" are not supported)",
                d.name
            ),
        ));
    }
    let list = if d.name.ends_with("_key") {
        &mut p.keys
    } else {
        &mut p.certificates
    };
    list.get_or_insert_with(Vec::new).push(SslPath {
        path: env.resolve_conf(v),
        place: place(d, file),
        tpl: None,
    });
    Ok(())
}

/// `ssl_verify_client`, `ssl_client_certificate`, `ssl_trusted_certificate`,
/// `ssl_verify_depth`, `ssl_crl`.
pub(super) fn set_ssl_client(env: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    let v = a0(d);
    match d.name.as_str() {
        "ssl_verify_client" => {
            let mode = match v {
                "off" => VerifyClient::Off,
                "on" => VerifyClient::On,
                "optional" => VerifyClient::Optional,
                "optional_no_ca" => VerifyClient::OptionalNoCa,
                _ => return Err(invalid(d, file, v)),
            };
            once(&mut s.ssl.verify_client, mode, d, file)
        }
        "ssl_client_certificate" => once(
            &mut s.ssl.client_certificate,
            pem_path(env, d, file)?,
            d,
            file,
        ),
        "ssl_verify_depth" => once(&mut s.ssl.verify_depth, num::<u32>(d, file, v)?, d, file),
        "ssl_crl" => once(&mut s.ssl.crl, pem_path(env, d, file)?, d, file),
        _ => once(
            &mut s.ssl.trusted_certificate,
            pem_path(env, d, file)?,
            d,
            file,
        ),
    }
}

/// `ssl_protocols`: nginx's names; shard speaks TLSv1.2 and TLSv1.3 of them.
pub(super) fn set_ssl_protocols(_: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    for a in &d.args {
        if !["SSLv2", "SSLv3", "TLSv1", "TLSv1.1", "TLSv1.2", "TLSv1.3"].contains(&a.as_str()) {
            return Err(invalid(d, file, a));
        }
    }
    once(&mut s.ssl.protocols, d.args.clone(), d, file)
}

pub(super) fn set_ssl_ciphers(_: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    once(&mut s.ssl.ciphers, a0(d).to_string(), d, file)
}

pub(super) fn set_ssl_prefer_server_ciphers(
    _: &Env,
    s: &mut Settings,
    d: &Directive,
    file: &str,
) -> R {
    let v = flag(d, file, a0(d))?;
    once(&mut s.ssl.prefer_server_ciphers, v, d, file)
}

/// `ssl_session_cache off | none | [builtin[:size]] [shared:name:size]`: a cache of sessions
/// per worker (the `shared` size counts as nginx's, about 4000 sessions per megabyte).
pub(super) fn set_ssl_session_cache(_: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    let mut sessions = 0usize;
    let mut shared = None;
    let mut v = None;
    for a in &d.args {
        match a.as_str() {
            "off" if d.args.len() == 1 => v = Some(SessionCache::Off),
            "none" if d.args.len() == 1 => v = Some(SessionCache::None),
            "builtin" => sessions = sessions.max(20480),
            b if b.starts_with("builtin:") => {
                let n: usize = b[8..].parse().map_err(|_| invalid(d, file, a))?;
                sessions = sessions.max(n);
            }
            sh if sh.starts_with("shared:") => {
                let mut it = sh[7..].splitn(2, ':');
                let (Some(name), Some(size)) = (it.next(), it.next()) else {
                    return Err(invalid(d, file, a));
                };
                let bytes = parse_size(size).ok_or_else(|| invalid(d, file, a))?;
                if name.is_empty() || bytes < 8192 {
                    return Err(invalid(d, file, a));
                }
                shared = Some(SessionCache::Shared {
                    name: name.to_string(),
                    bytes: bytes as usize,
                });
            }
            _ => return Err(invalid(d, file, a)),
        }
    }
    // With a shared cache, `builtin` adds nothing a worker could not find there.
    let v = v.or(shared).unwrap_or(SessionCache::Cache(sessions.max(1)));
    once(&mut s.ssl.session_cache, v, d, file)
}

pub(super) fn set_ssl_session_timeout(_: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    let v = time(d, file, a0(d))?;
    once(&mut s.ssl.session_timeout_ms, v, d, file)
}

/// `ssl_session_ticket_key FILE`: nginx's 48- or 80-byte key files; relative to the
/// configuration's directory.
pub(super) fn set_ssl_session_ticket_key(
    env: &Env,
    s: &mut Settings,
    d: &Directive,
    file: &str,
) -> R {
    let v = a0(d);
    if has_variables(v) {
        return Err(derr(
            d,
            file,
            format!("variables in \"{}\" are not supported", d.name),
        ));
    }
    s.ssl
        .session_ticket_keys
        .get_or_insert_with(Vec::new)
        .push((env.resolve_conf(v), place(d, file)));
    Ok(())
}

pub(super) fn set_ssl_session_tickets(_: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    let v = flag(d, file, a0(d))?;
    once(&mut s.ssl.session_tickets, v, d, file)
}

/// `ssl_stapling on` needs OCSP fetching, which shard does not do: accepted with a warning,
/// as nginx itself ignores it with one when it cannot staple (a certificate without an OCSP
/// responder URL), so Mozilla's recommended configuration runs; `off` is accepted.
pub(super) fn set_ssl_stapling(env: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    let on = flag(d, file, a0(d))?;
    if on {
        env.warn(
            d,
            file,
            "\"ssl_stapling\" staples only an \"ssl_stapling_file\" in shard (OCSP responses are not fetched)",
        );
    }
    once(&mut s.ssl.stapling, on, d, file)
}

/// `ssl_conf_command NAME VALUE` (repeatable; a level with any replaces its parent's list):
/// OpenSSL's configuration commands that have a meaning for rustls, checked here so that
/// `-t` names the line; any other command is refused by name.
pub(super) fn set_ssl_conf_command(env: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    let command = conf_command(env, d, file)?;
    s.ssl
        .conf_commands
        .get_or_insert_with(Vec::new)
        .push(command);
    Ok(())
}

/// A `*ssl_conf_command NAME VALUE`, checked; a file's value (`Certificate`, `PrivateKey`)
/// made relative to the configuration's directory, as nginx does for OpenSSL's file
/// commands.
fn conf_command(env: &Env, d: &Directive, file: &str) -> Result<(String, String), ConfigError> {
    let (name, value) = (&d.args[0], &d.args[1]);
    check_conf_command(name, value).map_err(|m| derr(d, file, m))?;
    let value = if is_file_command(name) {
        env.resolve_conf(value).display().to_string()
    } else {
        value.clone()
    };
    Ok((name.clone(), value))
}

/// OpenSSL's configuration commands whose value is a file shard reads.
pub(crate) fn is_file_command(name: &str) -> bool {
    name.eq_ignore_ascii_case("Certificate") || name.eq_ignore_ascii_case("PrivateKey")
}

/// `ssl_ecdh_curve auto | GROUP[:GROUP...]`: the key exchange groups, as OpenSSL's group
/// list (`auto`: rustls's defaults); kept as a `Groups` command applied before any
/// `ssl_conf_command`. A list naming no group shard has fails as nginx's.
pub(super) fn set_ssl_ecdh_curve(_: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    let v = a0(d);
    if v == "auto" {
        return once(&mut s.ssl.ecdh_curve, String::new(), d, file);
    }
    if !v.split(':').any(|g| crate::kx_group_name(g).is_some()) {
        return Err(derr(
            d,
            file,
            format!("SSL_CTX_set1_curves_list(\"{v}\") failed: no group shard has"),
        ));
    }
    once(&mut s.ssl.ecdh_curve, v.to_string(), d, file)
}

/// Whether shard can apply `ssl_conf_command NAME VALUE` (see `docs/directives.md`).
pub fn check_conf_command(name: &str, value: &str) -> Result<(), String> {
    let failed = || format!("SSL_CONF_cmd(\"{name}\", \"{value}\") failed");
    let list = |v: &str| -> Vec<String> {
        v.split([':', ',', ' '])
            .filter(|w| !w.is_empty())
            .map(str::to_string)
            .collect()
    };
    match name.to_ascii_lowercase().as_str() {
        "ciphersuites" => {
            if list(value)
                .iter()
                .any(|c| crate::TLS13_SUITES.contains(&c.as_str()))
            {
                Ok(())
            } else {
                Err(format!("{}: no TLS 1.3 suite shard has", failed()))
            }
        }
        "cipherstring" | "certificate" | "privatekey" => Ok(()),
        "minprotocol" | "maxprotocol" => match value {
            "None" | "TLSv1" | "TLSv1.1" | "TLSv1.2" | "TLSv1.3" | "SSLv3" => Ok(()),
            _ => Err(failed()),
        },
        "protocol" => {
            for p in list(value) {
                let bare = p.trim_start_matches(['+', '-']);
                if !matches!(
                    bare,
                    "ALL" | "SSLv2" | "SSLv3" | "TLSv1" | "TLSv1.1" | "TLSv1.2" | "TLSv1.3"
                ) {
                    return Err(failed());
                }
            }
            Ok(())
        }
        "groups" | "curves" => {
            if list(value)
                .iter()
                .any(|g| crate::kx_group_name(g).is_some())
            {
                Ok(())
            } else {
                Err(format!("{}: no group shard has", failed()))
            }
        }
        "options" => {
            for o in list(value) {
                let bare = o.trim_start_matches('-');
                if !crate::TLS_OPTIONS
                    .iter()
                    .any(|k| k.eq_ignore_ascii_case(bare))
                {
                    return Err(failed());
                }
            }
            Ok(())
        }
        _ => Err(format!(
            "\"ssl_conf_command {name}\" is not supported by shard (Ciphersuites, CipherString, \
             MinProtocol, MaxProtocol, Protocol, Groups, Curves, Options, Certificate, \
             PrivateKey are)"
        )),
    }
}

/// `ssl_stapling_file FILE`: relative to the configuration's directory.
pub(super) fn set_ssl_stapling_file(env: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    once(&mut s.ssl.stapling_file, env.resolve_conf(a0(d)), d, file)
}

/// An `ssl_*` directive applied to `p` (the stream module's; the http module's handlers are
/// the `set_ssl_*` above, on its settings).
pub(super) fn apply_ssl(env: &Env, p: &mut SslP, d: &Directive, file: &str) -> R {
    let mut s = Settings {
        ssl: std::mem::take(p),
        ..Settings::default()
    };
    let r = match d.name.as_str() {
        "ssl_certificate" => set_ssl_certificate(env, &mut s, d, file),
        "ssl_certificate_key" => set_ssl_certificate_key(env, &mut s, d, file),
        "ssl_protocols" => set_ssl_protocols(env, &mut s, d, file),
        "ssl_ciphers" => set_ssl_ciphers(env, &mut s, d, file),
        "ssl_prefer_server_ciphers" => set_ssl_prefer_server_ciphers(env, &mut s, d, file),
        "ssl_session_cache" => set_ssl_session_cache(env, &mut s, d, file),
        "ssl_session_timeout" => set_ssl_session_timeout(env, &mut s, d, file),
        "ssl_session_tickets" => set_ssl_session_tickets(env, &mut s, d, file),
        "ssl_session_ticket_key" => set_ssl_session_ticket_key(env, &mut s, d, file),
        "ssl_verify_client"
        | "ssl_client_certificate"
        | "ssl_trusted_certificate"
        | "ssl_verify_depth"
        | "ssl_crl" => set_ssl_client(env, &mut s, d, file),
        "ssl_reject_handshake" => set_ssl_reject_handshake(env, &mut s, d, file),
        "ssl_password_file" => set_ssl_password_file(env, &mut s, d, file),
        "ssl_stapling" => set_ssl_stapling(env, &mut s, d, file),
        "ssl_stapling_file" => set_ssl_stapling_file(env, &mut s, d, file),
        "ssl_conf_command" => set_ssl_conf_command(env, &mut s, d, file),
        "ssl_ecdh_curve" => set_ssl_ecdh_curve(env, &mut s, d, file),
        _ => Ok(()),
    };
    *p = s.ssl;
    r
}

/// `geoip_country`, `geoip_city`, `geoip_org` `FILE [utf8]`, `geoip_proxy CIDR`,
/// `geoip_proxy_recursive on|off` (http).
pub(super) fn http_geoip(env: &Env, h: &mut HttpP, d: &Directive, file: &str) -> R {
    geoip_directive(env, &mut h.geoip, d, file)
}

/// The databases of a `geoip_*` directive, http's or stream's: read whole now, as nginx's
/// `GeoIP_open` with `GEOIP_MEMORY_CACHE`; the edition must be the directive's.
pub(super) fn geoip_directive(env: &Env, g: &mut GeoipConf, d: &Directive, file: &str) -> R {
    use crate::geoip::{Db, Edition};
    let v = a0(d);
    match d.name.as_str() {
        "geoip_proxy" => {
            let Some((ip, bits, _)) = parse_cidr(v) else {
                return Err(invalid(d, file, v));
            };
            g.proxies.push(AccessRule {
                allow: true,
                net: Some((ip, bits)),
                unix: false,
            });
            Ok(())
        }
        "geoip_proxy_recursive" => {
            g.proxy_recursive = flag(d, file, v)?;
            Ok(())
        }
        name => {
            if let Some(a) = d.args.get(1).filter(|a| *a != "utf8") {
                return Err(invalid(d, file, a));
            }
            let slot = match name {
                "geoip_country" => &mut g.country,
                "geoip_city" => &mut g.city,
                _ => &mut g.org,
            };
            if slot.is_some() {
                return Err(derr(d, file, format!("\"{name}\" directive is duplicate")));
            }
            let path = env.resolve(v);
            let read = std::fs::metadata(&path)
                .ok()
                .filter(|m| m.len() <= crate::geoip::DB_MAX_BYTES)
                .and_then(|_| std::fs::read(&path).ok());
            let Some(bytes) = read else {
                return Err(derr(d, file, format!("GeoIP_open(\"{v}\") failed")));
            };
            let db = Db::open(bytes)
                .map_err(|e| derr(d, file, format!("invalid GeoIP database \"{v}\" {e}")))?;
            let fits = match name {
                "geoip_country" => db.edition == Edition::Country,
                "geoip_city" => matches!(db.edition, Edition::City { .. }),
                _ => db.edition == Edition::Org,
            };
            if !fits {
                return Err(derr(
                    d,
                    file,
                    format!("invalid GeoIP database \"{v}\" for \"{name}\""),
                ));
            }
            *slot = Some(db);
            Ok(())
        }
    }
}

/// The `userid*` directives of one level.
#[derive(Default, Clone)]
pub(super) struct UseridP {
    mode: Option<UseridMode>,
    name: Option<String>,
    domain: Option<Option<String>>,
    path: Option<String>,
    expires: Option<Option<Option<u64>>>,
    p3p: Option<Option<String>>,
    service: Option<u32>,
    mark: Option<Option<u8>>,
    flags: Option<(bool, bool, Option<String>)>,
}

impl UseridP {
    fn merge(&self, p: &UseridConf) -> UseridConf {
        let (secure, httponly, samesite) = self
            .flags
            .clone()
            .unwrap_or_else(|| (p.secure, p.httponly, p.samesite.clone()));
        UseridConf {
            mode: self.mode.unwrap_or(p.mode),
            name: self.name.clone().unwrap_or_else(|| p.name.clone()),
            domain: self.domain.clone().unwrap_or_else(|| p.domain.clone()),
            path: self.path.clone().unwrap_or_else(|| p.path.clone()),
            expires: self.expires.unwrap_or(p.expires),
            p3p: self.p3p.clone().unwrap_or_else(|| p.p3p.clone()),
            service: self.service.or(p.service),
            mark: self.mark.unwrap_or(p.mark),
            secure,
            httponly,
            samesite,
        }
    }
}

/// `userid`, `userid_name`, `_domain`, `_path`, `_expires`, `_p3p`, `_service`, `_mark`,
/// `_flags` (http, server, location).
pub(super) fn set_userid(_: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    let u = &mut s.userid;
    let v = a0(d);
    match d.name.as_str() {
        "userid" => {
            let m = match v {
                "on" => UseridMode::On,
                "v1" => UseridMode::V1,
                "log" => UseridMode::Log,
                "off" => UseridMode::Off,
                _ => return Err(invalid(d, file, v)),
            };
            once(&mut u.mode, m, d, file)
        }
        "userid_name" => once(&mut u.name, v.to_string(), d, file),
        "userid_domain" => once(&mut u.domain, (v != "none").then(|| v.to_string()), d, file),
        "userid_path" => once(&mut u.path, v.to_string(), d, file),
        "userid_expires" => {
            let e = match v {
                "off" => None,
                "max" => Some(None),
                t => Some(Some(time(d, file, t)? / 1000)),
            };
            once(&mut u.expires, e, d, file)
        }
        "userid_p3p" => once(&mut u.p3p, (v != "none").then(|| v.to_string()), d, file),
        "userid_service" => once(&mut u.service, num::<u32>(d, file, v)?, d, file),
        "userid_mark" => {
            let m = match v {
                "off" => None,
                m if m.len() == 1 && m.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'=') => {
                    Some(m.as_bytes()[0])
                }
                _ => {
                    return Err(derr(
                        d,
                        file,
                        format!("\"userid_mark\" must be a letter, a digit or \"=\": \"{v}\""),
                    ))
                }
            };
            once(&mut u.mark, m, d, file)
        }
        _ => {
            // userid_flags off | [secure] [httponly] [samesite=strict|lax|none]
            let mut f = (false, false, None);
            for a in &d.args {
                match a.as_str() {
                    "off" if d.args.len() == 1 => {}
                    "secure" => f.0 = true,
                    "httponly" => f.1 = true,
                    a if a.starts_with("samesite=")
                        && matches!(&a[9..], "strict" | "lax" | "none") =>
                    {
                        f.2 = Some(a[9..].to_string())
                    }
                    a => return Err(invalid(d, file, a)),
                }
            }
            once(&mut u.flags, f, d, file)
        }
    }
}
