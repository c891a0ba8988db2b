//! TLS termination's configuration: what each `listen ... ssl` address presents, built from
//! the `ssl_*` directives of its servers by the master (at `-t`, at start and at reload, so
//! a bad certificate fails the test and a reload with one keeps the old generation).
//!
//! This module owns reading the PEM files (`ssl_certificate`, `ssl_certificate_key`), the
//! rustls `ServerConfig` per TLS listener (protocol versions, cipher suites, ALPN
//! `http/1.1`, session cache and tickets), and the choice of certificate during the
//! handshake: the server by SNI with nginx's `server_name` rules (the listener's default
//! server without SNI or for an unknown name), then the first of its certificates the
//! client's signature algorithms allow. The connection-level record I/O is `worker/tls.rs`.
//!
//! rustls with the `ring` provider: a maintained, memory-safe TLS stack without OpenSSL;
//! `ring` rather than `aws-lc-rs` because it builds with a C compiler alone (no cmake, no Go)
//! on the machines this project must build on, and covers every suite nginx users configure
//! by default (AES-GCM and ChaCha20-Poly1305, ECDSA and RSA).

use std::path::Path;
use std::sync::Arc;

use rustls::crypto::ring as provider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::ServerConfig;
use shard_config::{Config, HttpConf, Listener, ListenerKind, SessionCache};

/// Per entry of `Config::listeners`: the TLS configuration of an `ssl` listener.
#[derive(Default)]
pub struct TlsContexts {
    pub per_listener: Vec<Option<Arc<ServerConfig>>>,
}

impl TlsContexts {
    pub fn get(&self, listener: usize) -> Option<&Arc<ServerConfig>> {
        self.per_listener.get(listener).and_then(Option::as_ref)
    }
}

/// Session-ticket keys: made once by the master and inherited by every worker it forks, so
/// a ticket issued by one worker resumes on any other (and across reloads, which keep it).
pub fn ticketer() -> Result<Arc<dyn rustls::server::ProducesTickets>, String> {
    provider::Ticketer::new().map_err(|e| format!("cannot make session ticket keys: {e}"))
}

/// Builds every TLS listener's configuration; the first error in nginx's shape.
pub fn build(
    cfg: &Config,
    ticketer: &Arc<dyn rustls::server::ProducesTickets>,
) -> Result<TlsContexts, String> {
    let mut per_listener = Vec::with_capacity(cfg.listeners.len());
    for l in &cfg.listeners {
        if !l.opts.ssl || l.kind != ListenerKind::Http {
            per_listener.push(None);
            continue;
        }
        let Some(http) = cfg.http.as_ref() else {
            per_listener.push(None);
            continue;
        };
        per_listener.push(Some(Arc::new(listener_config(http, l, ticketer)?)));
    }
    Ok(TlsContexts { per_listener })
}

fn listener_config(
    http: &HttpConf,
    l: &Listener,
    ticketer: &Arc<dyn rustls::server::ProducesTickets>,
) -> Result<ServerConfig, String> {
    // Every server on the address that has certificates gets them loaded; the default
    // server must have some (nginx: `no "ssl_certificate" is defined for the "listen ...
    // ssl" directive`).
    let mut keys: Vec<Vec<Arc<CertifiedKey>>> = vec![Vec::new(); http.servers.len()];
    for &i in &l.servers {
        for pair in &http.servers[i].ssl.certificates {
            keys[i].push(load_pair(&pair.certificate, &pair.key, &pair.place)?);
        }
    }
    let default = &http.servers[l.default_server];
    if keys[l.default_server].is_empty() {
        return Err(format!(
            "no \"ssl_certificate\" is defined for the \"listen ... ssl\" directive in {}:{}",
            l.place.file, l.place.line
        ));
    }
    // Protocols, ciphers, sessions: the default server's, as nginx takes them from the
    // server whose context the handshake starts in.
    let ssl = &default.ssl;
    let mut versions: Vec<&'static rustls::SupportedProtocolVersion> = Vec::new();
    if ssl.protocols.iter().any(|p| p == "TLSv1.3") {
        versions.push(&rustls::version::TLS13);
    }
    if ssl.protocols.iter().any(|p| p == "TLSv1.2") {
        versions.push(&rustls::version::TLS12);
    }
    if versions.is_empty() {
        return Err(format!(
            "\"ssl_protocols\" names no protocol shard speaks (TLSv1.2, TLSv1.3) for {}",
            l.addr
        ));
    }
    let mut prov = provider::default_provider();
    prov.cipher_suites = cipher_suites(&ssl.ciphers);
    let builder = ServerConfig::builder_with_provider(Arc::new(prov))
        .with_protocol_versions(&versions)
        .map_err(|e| format!("ssl configuration for {}: {e}", l.addr))?;
    let resolver = SniResolver {
        http: Arc::new(http.clone()),
        listener: Arc::new(l.clone()),
        keys,
    };
    let mut config = builder
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(resolver));
    // HTTP/2 is not spoken: a client offering h2 and http/1.1 gets http/1.1.
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    config.ignore_client_order = ssl.prefer_server_ciphers;
    config.session_storage = match ssl.session_cache {
        SessionCache::Off | SessionCache::None => {
            Arc::new(rustls::server::NoServerSessionStorage {})
        }
        SessionCache::Cache(n) => rustls::server::ServerSessionMemoryCache::new(n),
    };
    if ssl.session_tickets {
        config.ticketer = ticketer.clone();
    } else {
        config.send_tls13_tickets = 0;
    }
    Ok(config)
}

/// The TLS 1.2 suites an OpenSSL cipher string names, in its order, followed by every TLS 1.3
/// suite (nginx's `ssl_ciphers` does not govern TLS 1.3 either). A string of keywords
/// (`HIGH:!aNULL:!MD5`, nginx's default) or naming no suite shard has gives rustls's
/// defaults, all of which such strings allow.
pub fn cipher_suites(ciphers: &str) -> Vec<rustls::SupportedCipherSuite> {
    use rustls::crypto::ring::cipher_suite as cs;
    let named: [(&str, rustls::SupportedCipherSuite); 6] = [
        (
            "ECDHE-ECDSA-AES128-GCM-SHA256",
            cs::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
        ),
        (
            "ECDHE-ECDSA-AES256-GCM-SHA384",
            cs::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
        ),
        (
            "ECDHE-ECDSA-CHACHA20-POLY1305",
            cs::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
        ),
        (
            "ECDHE-RSA-AES128-GCM-SHA256",
            cs::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
        ),
        (
            "ECDHE-RSA-AES256-GCM-SHA384",
            cs::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
        ),
        (
            "ECDHE-RSA-CHACHA20-POLY1305",
            cs::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
        ),
    ];
    let mut tls12: Vec<rustls::SupportedCipherSuite> = Vec::new();
    for word in ciphers.split([':', ' ', ',']).filter(|w| !w.is_empty()) {
        if let Some((_, s)) = named.iter().find(|(n, _)| n.eq_ignore_ascii_case(word)) {
            if !tls12.contains(s) {
                tls12.push(*s);
            }
        }
    }
    let defaults = provider::DEFAULT_CIPHER_SUITES.to_vec();
    if tls12.is_empty() {
        return defaults;
    }
    let mut out: Vec<_> = defaults
        .iter()
        .copied()
        .filter(|s| s.version() == &rustls::version::TLS13)
        .collect();
    out.extend(tls12);
    out
}

/// Reads one certificate chain and its key; errors name the file as nginx's do.
fn load_pair(
    cert: &Path,
    key: &Path,
    place: &shard_config::Place,
) -> Result<Arc<CertifiedKey>, String> {
    let at = format!("{}:{}", place.file, place.line);
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| {
            format!(
                "cannot load certificate \"{}\": {} in {at}",
                cert.display(),
                pem_error(&e)
            )
        })?;
    if chain.is_empty() {
        return Err(format!(
            "cannot load certificate \"{}\": no certificate in the file in {at}",
            cert.display()
        ));
    }
    let der = PrivateKeyDer::from_pem_file(key).map_err(|e| {
        format!(
            "cannot load certificate key \"{}\": {} in {at}",
            key.display(),
            pem_error(&e)
        )
    })?;
    let signing = provider::sign::any_supported_type(&der).map_err(|e| {
        format!(
            "cannot load certificate key \"{}\": {e} in {at}",
            key.display()
        )
    })?;
    let ck = CertifiedKey::new(chain, signing);
    if let Err(e) = ck.keys_match() {
        return Err(format!(
            "SSL_CTX_use_PrivateKey(\"{}\") failed: the key does not match certificate \"{}\" ({e}) in {at}",
            key.display(),
            cert.display()
        ));
    }
    Ok(Arc::new(ck))
}

fn pem_error(e: &rustls::pki_types::pem::Error) -> String {
    match e {
        rustls::pki_types::pem::Error::Io(io) => {
            format!("open() failed ({})", shard_event::os_error_text(io))
        }
        rustls::pki_types::pem::Error::NoItemsFound => "no PEM object found".to_string(),
        other => format!("{other:?}"),
    }
}

/// The certificate for a handshake: the server SNI names (nginx's `server_name` rules, the
/// default server without SNI), then the first of its pairs the client can verify.
struct SniResolver {
    http: Arc<HttpConf>,
    listener: Arc<Listener>,
    /// Per server (index into `HttpConf::servers`): its certificates, in order.
    keys: Vec<Vec<Arc<CertifiedKey>>>,
}

impl std::fmt::Debug for SniResolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SniResolver({})", self.listener.addr)
    }
}

impl ResolvesServerCert for SniResolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let name = hello.server_name().map(str::to_ascii_lowercase);
        let server = shard_http::route::select_server(&self.http, &self.listener, name.as_deref());
        let keys = self.keys.get(server).filter(|k| !k.is_empty())?;
        let schemes = hello.signature_schemes();
        keys.iter()
            .find(|k| k.key.choose_scheme(schemes).is_some())
            .or_else(|| keys.first())
            .cloned()
    }
}
