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
use rustls::server::danger::ClientCertVerifier;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::ServerConfig;
use shard_config::{Config, HttpConf, Listener, ListenerKind, SessionCache};

/// Per entry of `Config::listeners`: the TLS configuration of an `ssl` listener; and per
/// distinct `proxy_ssl_*` settings of the locations that pass to `https://`, the client
/// configuration (its session cache, shared by those locations in a worker).
#[derive(Default)]
pub struct TlsContexts {
    pub per_listener: Vec<Option<Arc<ServerConfig>>>,
    pub upstream: std::collections::HashMap<shard_config::ProxySsl, Arc<rustls::ClientConfig>>,
    /// Per http server: what verifies its clients' certificates (`ssl_verify_client` with
    /// CAs; `None` when off, or `optional_no_ca` without CAs).
    pub client_verifiers: Vec<Option<Arc<dyn ClientCertVerifier>>>,
    /// The same per stream server.
    pub stream_verifiers: Vec<Option<Arc<dyn ClientCertVerifier>>>,
    /// Per entry of `Config::listeners`: a server on it has `ssl_certificate` with
    /// variables, so the worker renders and loads a pair before the hello is processed
    /// ([`set_chosen`]).
    pub dynamic: Vec<bool>,
}

impl TlsContexts {
    pub fn get(&self, listener: usize) -> Option<&Arc<ServerConfig>> {
        self.per_listener.get(listener).and_then(Option::as_ref)
    }

    /// What verifies client certificates for http server `server`.
    pub fn client_verifier(&self, server: usize) -> Option<&Arc<dyn ClientCertVerifier>> {
        self.client_verifiers.get(server).and_then(Option::as_ref)
    }

    /// What verifies client certificates for stream server `server`.
    pub fn stream_verifier(&self, server: usize) -> Option<&Arc<dyn ClientCertVerifier>> {
        self.stream_verifiers.get(server).and_then(Option::as_ref)
    }

    /// The client configuration of a location's `proxy_ssl_*` (built for every location
    /// that passes to `https://`).
    pub fn upstream(&self, ssl: &shard_config::ProxySsl) -> Option<&Arc<rustls::ClientConfig>> {
        self.upstream.get(ssl)
    }
}

/// Where the kernel lists the TCP upper-layer protocols it can attach (`tls` is kTLS).
const AVAILABLE_ULP: &str = "/proc/sys/net/ipv4/tcp_available_ulp";

/// Says once, at start, how TLS records are encrypted when a listener is `ssl`: in user space
/// (rustls), and whether this kernel could do it instead (kTLS, which shard does not use yet:
/// see docs/directives.md). The notice is the report issue 14 asks for; every TLS connection
/// is a user-space one.
pub fn encryption_notice(contexts: &TlsContexts) {
    if contexts.per_listener.iter().all(Option::is_none) {
        return;
    }
    let ulps = std::fs::read_to_string(AVAILABLE_ULP).unwrap_or_default();
    let kernel = if ulps.split_whitespace().any(|u| u == "tls") {
        "the kernel offers kTLS, which shard does not use yet"
    } else {
        "the kernel offers no kTLS (no \"tls\" in /proc/sys/net/ipv4/tcp_available_ulp)"
    };
    crate::log!(
        Notice,
        "TLS records are encrypted in user space (rustls) and files sent over TLS are read, not \
         sent with sendfile; {kernel}"
    );
}

/// Session-ticket keys: a seed the master makes once (kept across reloads) from which every
/// worker derives the same key for each 6-hour period, so a ticket issued by one worker
/// resumes on any other, and keys rotate with no coordination (see [`SharedTicketer`]).
pub fn ticketer() -> Result<Arc<dyn rustls::server::ProducesTickets>, String> {
    Ok(Arc::new(SharedTicketer::new()?))
}

/// How long one ticket key encrypts; tickets are accepted for two periods.
const TICKET_PERIOD_SECS: u64 = 6 * 3600;
/// The longest ticket accepted (a session's state is a few hundred bytes): longer ones are
/// refused before decryption, as rustls's own ticketer does against partitioning oracles.
const TICKET_MAX_BYTES: usize = 4096;

/// Stateless session tickets shared by every worker: ChaCha20-Poly1305 under a key derived
/// (HKDF-SHA256) from a random seed and the current period. rustls's own ticketer makes its
/// keys at random in each process and accepts only tickets no longer than the longest it has
/// itself issued, so a worker would refuse its siblings' tickets until it issued one.
/// A period's ticket key and its name.
type TicketKey = Arc<(ring::aead::LessSafeKey, [u8; 16])>;

pub struct SharedTicketer {
    seed: ring::hkdf::Prk,
    /// The last period's key, derived once (a worker is single-threaded: never contended).
    cached: std::sync::Mutex<Option<(u64, TicketKey)>>,
}

impl std::fmt::Debug for SharedTicketer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SharedTicketer")
    }
}

/// An HKDF output length.
struct Len(usize);

impl ring::hkdf::KeyType for Len {
    fn len(&self) -> usize {
        self.0
    }
}

impl SharedTicketer {
    fn new() -> Result<SharedTicketer, String> {
        use ring::rand::SecureRandom;
        let mut seed = [0u8; 32];
        ring::rand::SystemRandom::new()
            .fill(&mut seed)
            .map_err(|_| "cannot make session ticket keys: no randomness".to_string())?;
        Ok(SharedTicketer {
            seed: ring::hkdf::Prk::new_less_safe(ring::hkdf::HKDF_SHA256, &seed),
            cached: std::sync::Mutex::new(None),
        })
    }

    /// Keys derived from an `ssl_session_ticket_key` file: nginx's format, 48 or 80 random
    /// bytes (`openssl rand 80 > ticket.key`), used here as the seed.
    fn from_key_file(path: &Path) -> Result<SharedTicketer, String> {
        let bytes = crate::keys::read_whole(path)?;
        if bytes.len() != 48 && bytes.len() != 80 {
            return Err(format!(
                "\"{}\" must be 48 or 80 bytes (\"ssl_session_ticket_key\")",
                path.display()
            ));
        }
        Ok(SharedTicketer {
            seed: ring::hkdf::Salt::new(ring::hkdf::HKDF_SHA256, b"shard ticket key file")
                .extract(&bytes),
            cached: std::sync::Mutex::new(None),
        })
    }

    /// [`Self::derive`], remembered for the current period.
    fn key(&self, period: u64) -> TicketKey {
        let mut c = self.cached.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((p, k)) = c.as_ref() {
            if *p == period {
                return k.clone();
            }
        }
        let k = Arc::new(self.derive(period));
        if period >= c.as_ref().map_or(0, |(p, _)| *p) {
            *c = Some((period, k.clone()));
        }
        k
    }

    /// The key and its 16-byte name for `period`.
    fn derive(&self, period: u64) -> (ring::aead::LessSafeKey, [u8; 16]) {
        let p = period.to_be_bytes();
        let info_key: [&[u8]; 2] = [b"shard ticket key", &p];
        let info_name: [&[u8]; 2] = [b"shard ticket name", &p];
        let key: ring::aead::UnboundKey = self
            .seed
            .expand(&info_key, &ring::aead::CHACHA20_POLY1305)
            .expect("HKDF output of the key's length")
            .into();
        let mut name = [0u8; 16];
        self.seed
            .expand(&info_name, Len(16))
            .and_then(|okm| okm.fill(&mut name))
            .expect("HKDF output of 16 bytes");
        (ring::aead::LessSafeKey::new(key), name)
    }

    fn period_now() -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
            / TICKET_PERIOD_SECS
    }
}

impl rustls::server::ProducesTickets for SharedTicketer {
    fn enabled(&self) -> bool {
        true
    }

    fn lifetime(&self) -> u32 {
        TICKET_PERIOD_SECS as u32
    }

    /// `key_name (16) | nonce (12) | ciphertext | tag (16)`.
    fn encrypt(&self, message: &[u8]) -> Option<Vec<u8>> {
        use ring::rand::SecureRandom;
        let k = self.key(Self::period_now());
        let (key, name) = (&k.0, k.1);
        let mut nonce = [0u8; 12];
        ring::rand::SystemRandom::new().fill(&mut nonce).ok()?;
        let mut out = Vec::with_capacity(16 + 12 + message.len() + 16);
        out.extend_from_slice(&name);
        out.extend_from_slice(&nonce);
        out.extend_from_slice(message);
        let tag = key
            .seal_in_place_separate_tag(
                ring::aead::Nonce::assume_unique_for_key(nonce),
                ring::aead::Aad::from(name),
                &mut out[28..],
            )
            .ok()?;
        out.extend_from_slice(tag.as_ref());
        Some(out)
    }

    fn decrypt(&self, ticket: &[u8]) -> Option<Vec<u8>> {
        if ticket.len() < 16 + 12 + 16 || ticket.len() > TICKET_MAX_BYTES {
            return None;
        }
        let now = Self::period_now();
        for period in [now, now.saturating_sub(1)] {
            let k = self.key(period);
            let (key, name) = (&k.0, k.1);
            if ticket[..16] != name {
                continue;
            }
            let nonce = ring::aead::Nonce::try_assume_unique_for_key(&ticket[16..28]).ok()?;
            let mut buf = ticket[28..].to_vec();
            let plain = key
                .open_in_place(nonce, ring::aead::Aad::from(name), &mut buf)
                .ok()?;
            return Some(plain.to_vec());
        }
        None
    }
}

/// Builds every TLS listener's configuration; the first error in nginx's shape.
pub fn build(
    cfg: &Config,
    ticketer: &Arc<dyn rustls::server::ProducesTickets>,
) -> Result<TlsContexts, String> {
    PASSWORDS.with(|p| p.borrow_mut().clear());
    let built = build_contexts(cfg, ticketer);
    PASSWORDS.with(|p| p.borrow_mut().clear());
    built
}

thread_local! {
    /// The `ssl_password_file`s read during one [`build`], by path: each is read once, as
    /// nginx reads it once (it may be a FIFO that someone writes to once).
    static PASSWORDS: std::cell::RefCell<std::collections::HashMap<std::path::PathBuf, Vec<Vec<u8>>>> =
        std::cell::RefCell::new(std::collections::HashMap::new());
}

fn build_contexts(
    cfg: &Config,
    ticketer: &Arc<dyn rustls::server::ProducesTickets>,
) -> Result<TlsContexts, String> {
    let mut client_verifiers = Vec::new();
    let mut zones: Vec<(&str, usize)> = Vec::new();
    let servers = cfg.http.iter().flat_map(|h| &h.servers);
    let stream_servers = cfg.stream.iter().flat_map(|s| &s.servers);
    for (ssl, place) in servers
        .clone()
        .map(|s| (&s.ssl, &s.place))
        .chain(stream_servers.map(|s| (&s.ssl, &s.place)))
    {
        // One zone per name, as nginx's shared memory zones.
        if let SessionCache::Shared { name, bytes } = &ssl.session_cache {
            match zones.iter().find(|(n, _)| n == name) {
                Some((_, b)) if b != bytes => {
                    return Err(format!(
                        "the size {bytes} of shared memory zone \"{name}\" conflicts with \
                         already declared size {b} in {}:{}",
                        place.file, place.line
                    ))
                }
                Some(_) => {}
                None => zones.push((name, *bytes)),
            }
        }
    }
    for s in servers {
        // A server with no certificate of its own takes its handshakes in the default
        // server's context: nginx checks its `ssl_*` settings no further (a request to it
        // with `ssl_verify_client on` and no certificate is still refused).
        if s.ssl.certificates.is_empty() && !s.ssl.reject_handshake {
            client_verifiers.push(None);
            continue;
        }
        client_verifiers.push(client_verifier(&s.ssl, &s.place)?);
    }
    let mut stream_verifiers = Vec::new();
    for s in cfg.stream.iter().flat_map(|st| &st.servers) {
        stream_verifiers.push(client_verifier(&s.ssl, &s.place)?);
    }
    let mut per_listener = Vec::with_capacity(cfg.listeners.len());
    let mut dynamic = Vec::with_capacity(cfg.listeners.len());
    for l in &cfg.listeners {
        dynamic.push(l.opts.ssl && listener_dynamic(cfg, l));
        if !l.opts.ssl {
            per_listener.push(None);
            continue;
        }
        if let ListenerKind::Stream { server } = l.kind {
            let Some(s) = cfg.stream.as_ref().and_then(|st| st.servers.get(server)) else {
                per_listener.push(None);
                continue;
            };
            per_listener.push(Some(Arc::new(stream_config(s, l, ticketer)?)));
            continue;
        }
        let Some(http) = cfg.http.as_ref() else {
            per_listener.push(None);
            continue;
        };
        per_listener.push(Some(Arc::new(listener_config(http, l, ticketer)?)));
    }
    // Certificates of servers that no `ssl` address reaches are still loaded and checked
    // (and their `ssl_password_file`s read), as nginx does at configuration time.
    let on_tls = |i: usize| {
        cfg.listeners
            .iter()
            .filter(|l| !matches!(l.kind, ListenerKind::Stream { .. }))
            .any(|l| l.opts.ssl && l.servers.contains(&i))
    };
    for (i, s) in cfg.http.iter().flat_map(|h| h.servers.iter().enumerate()) {
        if on_tls(i) || s.ssl.reject_handshake {
            continue;
        }
        for pair in s.ssl.certificates.iter().filter(|p| p.vars.is_none()) {
            load_pair(
                &pair.certificate,
                &pair.key,
                pair.password_file.as_deref(),
                None,
                &pair.place,
            )?;
        }
    }
    let mut upstream = std::collections::HashMap::new();
    for s in cfg.http.iter().flat_map(|h| &h.servers) {
        for loc in std::iter::once(&s.base).chain(&s.locations) {
            // A pass with variables may render to `https://` (or `grpcs://`).
            if !loc
                .proxy_pass
                .as_ref()
                .is_some_and(|p| p.tls || p.dynamic.is_some())
                || upstream.contains_key(&loc.proxy.ssl)
            {
                continue;
            }
            // `uwsgi_pass suwsgi://`: the messages name `uwsgi_ssl_*`.
            let c =
                upstream_config(&loc.proxy.ssl, &loc.place).map_err(|e| match &loc.gateway {
                    Some(_) => e.replace("proxy_ssl", "uwsgi_ssl"),
                    None => e,
                })?;
            upstream.insert(loc.proxy.ssl.clone(), Arc::new(c));
        }
    }
    for s in cfg.stream.iter().flat_map(|st| &st.servers) {
        if let Some(ssl) = s
            .proxy_ssl
            .as_ref()
            .filter(|ssl| !upstream.contains_key(*ssl))
        {
            let c = upstream_config(ssl, &s.place)?;
            upstream.insert(ssl.clone(), Arc::new(c));
        }
    }
    Ok(TlsContexts {
        per_listener,
        upstream,
        client_verifiers,
        stream_verifiers,
        dynamic,
    })
}

/// Whether a server on `l` has certificates with variables.
fn listener_dynamic(cfg: &Config, l: &Listener) -> bool {
    let dynamic = |ssl: &shard_config::SslConf| ssl.certificates.iter().any(|p| p.vars.is_some());
    match l.kind {
        ListenerKind::Stream { server } => cfg
            .stream
            .as_ref()
            .and_then(|st| st.servers.get(server))
            .is_some_and(|s| dynamic(&s.ssl)),
        _ => cfg
            .http
            .as_ref()
            .is_some_and(|h| l.servers.iter().any(|&i| dynamic(&h.servers[i].ssl))),
    }
}

thread_local! {
    /// The pairs the worker rendered and loaded for the handshake whose records it is about
    /// to process (`ssl_certificate` with variables); the resolver takes them.
    static CHOSEN: std::cell::RefCell<Option<Vec<Arc<CertifiedKey>>>> =
        const { std::cell::RefCell::new(None) };
}

/// Before a handshake's records are processed: the pairs of a server whose certificates
/// have variables, as the worker rendered and loaded them (empty: none could be loaded,
/// and the handshake fails as nginx's).
pub fn set_chosen(keys: Option<Vec<Arc<CertifiedKey>>>) {
    CHOSEN.with(|c| *c.borrow_mut() = keys);
}

fn take_chosen() -> Option<Vec<Arc<CertifiedKey>>> {
    CHOSEN.with(|c| c.borrow_mut().take())
}

/// One pair of `ssl_certificate` with variables, rendered: read as at configuration time
/// (the worker's user must be able to read it); errors in nginx's words.
pub fn load_rendered(
    cert: &Path,
    key: &Path,
    password_file: Option<&Path>,
    place: &shard_config::Place,
) -> Result<Arc<CertifiedKey>, String> {
    // Logged at the handshake, where the configuration's place means nothing.
    let at = format!(" in {}:{}", place.file, place.line);
    load_pair(cert, key, password_file, None, place)
        .map_err(|e| e.strip_suffix(&at).map(str::to_string).unwrap_or(e))
}

/// The first of `keys` the client's signature schemes allow, else the first.
fn pick(keys: &[Arc<CertifiedKey>], hello: &ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
    let schemes = hello.signature_schemes();
    keys.iter()
        .find(|k| k.key.choose_scheme(schemes).is_some())
        .or_else(|| keys.first())
        .cloned()
}

/// The client side of `proxy_pass https://` and stream's `proxy_ssl on`: nginx's
/// `proxy_ssl_*` defaults are no verification and no SNI.
pub(crate) fn upstream_config(
    ssl: &shard_config::ProxySsl,
    place: &shard_config::Place,
) -> Result<rustls::ClientConfig, String> {
    let at = format!("{}:{}", place.file, place.line);
    let mut versions: Vec<&'static rustls::SupportedProtocolVersion> = Vec::new();
    if ssl.protocols.iter().any(|p| p == "TLSv1.3") {
        versions.push(&rustls::version::TLS13);
    }
    if ssl.protocols.iter().any(|p| p == "TLSv1.2") {
        versions.push(&rustls::version::TLS12);
    }
    let mut prov = provider::default_provider();
    prov.cipher_suites = cipher_suites(&ssl.ciphers);
    // `proxy_ssl_conf_command`: the server-side `Options` mean nothing to a client.
    let _ = apply_conf_commands(&ssl.conf_commands, &mut versions, &mut prov);
    let prov = Arc::new(prov);
    let builder = rustls::ClientConfig::builder_with_provider(prov.clone())
        .with_protocol_versions(&versions)
        .map_err(|e| format!("proxy_ssl configuration: {e} in {at}"))?;
    let builder = if ssl.verify {
        let Some(ca) = &ssl.trusted_certificate else {
            return Err(format!(
                "no proxy_ssl_trusted_certificate for proxy_ssl_verify in {at}"
            ));
        };
        let mut roots = rustls::RootCertStore::empty();
        let certs = CertificateDer::pem_file_iter(ca)
            .and_then(|it| it.collect::<Result<Vec<_>, _>>())
            .map_err(|e| {
                format!(
                    "cannot load certificate \"{}\": {} in {at}",
                    ca.display(),
                    pem_error(&e)
                )
            })?;
        let cas = certs.clone();
        let (added, _) = roots.add_parsable_certificates(certs);
        if added == 0 {
            return Err(format!(
                "cannot load certificate \"{}\": no certificate in the file in {at}",
                ca.display()
            ));
        }
        let mut vb = rustls::client::WebPkiServerVerifier::builder_with_provider(
            Arc::new(roots),
            prov.clone(),
        );
        if let Some(path) = &ssl.crl {
            let crls = rustls::pki_types::CertificateRevocationListDer::pem_file_iter(path)
                .and_then(|it| it.collect::<Result<Vec<_>, _>>())
                .map_err(|e| {
                    format!(
                        "X509_load_crl_file(\"{}\") failed ({}) in {at}",
                        path.display(),
                        pem_error(&e)
                    )
                })?;
            // As OpenSSL with nginx's flags: a list is wanted for every certificate of the
            // chain, and an expired one counts.
            vb = vb.with_crls(crls).enforce_revocation_expiration();
        }
        let verifier = vb
            .build()
            .map_err(|e| format!("proxy_ssl_trusted_certificate: {e} in {at}"))?;
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(CnFallback {
                inner: verifier,
                cas,
                provider: prov,
            }))
    } else {
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(NoVerify(prov)))
    };
    let mut config = match (&ssl.certificate, &ssl.certificate_key) {
        (Some(cert), Some(key)) => {
            let place = shard_config::Place {
                file: place.file.clone(),
                line: place.line,
            };
            // Loaded and matched as a server's own (X.509 v1 too, which rustls's
            // `with_client_auth_cert` refuses), then offered whatever the server asks.
            let ck = load_pair(cert, key, ssl.password_file.as_deref(), None, &place)?;
            builder.with_client_cert_resolver(Arc::new(FixedClientCert(ck)))
        }
        (Some(cert), None) => {
            return Err(format!(
                "no \"proxy_ssl_certificate_key\" is defined for certificate \"{}\" in {at}",
                cert.display()
            ))
        }
        _ => builder.with_no_client_auth(),
    };
    config.enable_sni = ssl.server_name;
    if ssl.alpn_h2 {
        config.alpn_protocols = vec![b"h2".to_vec()];
    }
    if !ssl.session_reuse {
        config.resumption = rustls::client::Resumption::disabled();
    }
    Ok(config)
}

/// `proxy_ssl_certificate`: the one certificate a TLS connection to an upstream offers.
#[derive(Debug)]
struct FixedClientCert(Arc<CertifiedKey>);

impl rustls::client::ResolvesClientCert for FixedClientCert {
    fn resolve(
        &self,
        _root_hint_subjects: &[&[u8]],
        _schemes: &[rustls::SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        Some(self.0.clone())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

/// The CA certificates of a PEM file, and how many there are; nginx's error words.
fn read_cas(
    path: &Path,
    place: &shard_config::Place,
) -> Result<(usize, Vec<CertificateDer<'static>>), String> {
    let at = format!("{}:{}", place.file, place.line);
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| {
            format!(
                "cannot load certificate \"{}\": {} in {at}",
                path.display(),
                pem_error(&e)
            )
        })?;
    if certs.is_empty() {
        return Err(format!(
            "cannot load certificate \"{}\": no certificate in the file in {at}",
            path.display()
        ));
    }
    Ok((certs.len(), certs))
}

/// What judges a server's client certificates: webpki against `ssl_client_certificate` and
/// `ssl_trusted_certificate`. nginx's error when `on` or `optional` have no CA.
fn client_verifier(
    ssl: &shard_config::SslConf,
    place: &shard_config::Place,
) -> Result<Option<Arc<dyn ClientCertVerifier>>, String> {
    use shard_config::VerifyClient;
    if ssl.verify_client == VerifyClient::Off {
        return Ok(None);
    }
    let mut roots = rustls::RootCertStore::empty();
    let mut cas = Vec::new();
    for path in [&ssl.client_certificate, &ssl.trusted_certificate]
        .into_iter()
        .flatten()
    {
        let (_, certs) = read_cas(path, place)?;
        cas.extend(certs.iter().cloned());
        roots.add_parsable_certificates(certs);
    }
    if roots.is_empty() {
        if ssl.verify_client == VerifyClient::OptionalNoCa {
            return Ok(None);
        }
        return Err(format!(
            "no ssl_client_certificate for ssl_verify_client in {}:{}",
            place.file, place.line
        ));
    }
    let roots = Arc::new(roots);
    let builder = || {
        rustls::server::WebPkiClientVerifier::builder_with_provider(
            roots.clone(),
            Arc::new(provider::default_provider()),
        )
        .allow_unauthenticated()
    };
    let mut crls = Vec::new();
    if let Some(path) = &ssl.crl {
        crls = rustls::pki_types::CertificateRevocationListDer::pem_file_iter(path)
            .and_then(|it| it.collect::<Result<Vec<_>, _>>())
            .map_err(|e| {
                format!(
                    "X509_load_crl_file(\"{}\") failed ({}) in {}:{}",
                    path.display(),
                    pem_error(&e),
                    place.file,
                    place.line
                )
            })?;
        if let Some(bad) = crls.iter().find(|c| crate::x509::parse_crl(c).is_none()) {
            return Err(format!(
                "X509_load_crl_file(\"{}\") failed (a list of {} bytes is not a CRL) in {}:{}",
                path.display(),
                bad.len(),
                place.file,
                place.line
            ));
        }
    }
    // As OpenSSL: expired lists count, and a list is wanted for every certificate. webpki
    // reads version 2 lists only; with a version 1 list (what `openssl ca -gencrl` writes
    // without CRL extensions) the lists are checked by shard's own walk instead.
    let with_crls = (!crls.is_empty())
        .then(|| {
            builder()
                .with_crls(crls.clone())
                .enforce_revocation_expiration()
                .build()
                .ok()
        })
        .flatten();
    let webpki_crls = with_crls.is_some();
    let v = match with_crls {
        Some(v) => v,
        None => builder().build().map_err(|e| {
            format!(
                "ssl_client_certificate: {e} in {}:{}",
                place.file, place.line
            )
        })?,
    };
    Ok(Some(Arc::new(WithV1Leaves {
        inner: v,
        cas,
        crls: crls.into_iter().map(|c| c.as_ref().to_vec()).collect(),
        crl: ssl.crl.is_some(),
        webpki_crls,
        depth: ssl.verify_depth,
        provider: Arc::new(provider::default_provider()),
    })))
}

/// The listener's side of `ssl_verify_client`: a certificate is asked for (naming the CAs
/// of `ssl_client_certificate`) but never required, and any is taken once the client proves
/// it holds its key; the request's server judges it ([`client_verifier`]) and answers 495 or
/// 496 as nginx, rather than the handshake failing.
#[derive(Debug)]
struct AskForCertificate {
    hints: Vec<rustls::DistinguishedName>,
    provider: Arc<rustls::crypto::CryptoProvider>,
}

impl ClientCertVerifier for AskForCertificate {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        false
    }

    fn root_hint_subjects(&self) -> &[rustls::DistinguishedName] {
        &self.hints
    }

    fn verify_client_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::server::danger::ClientCertVerified, rustls::Error> {
        Ok(rustls::server::danger::ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        tls12_signature(&self.provider, message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        tls13_signature(&self.provider, message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// A handshake signature checked with the provider's algorithms: what both verifiers that
/// take any certificate ([`AskForCertificate`], [`NoVerify`]) still require. A certificate
/// `webpki` cannot read for its version (X.509 v1, which OpenSSL takes) is checked against
/// the public key [`crate::x509`] reads from it.
fn tls12_signature(
    provider: &rustls::crypto::CryptoProvider,
    message: &[u8],
    cert: &CertificateDer<'_>,
    dss: &rustls::DigitallySignedStruct,
) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
    let algs = &provider.signature_verification_algorithms;
    match rustls::crypto::verify_tls12_signature(message, cert, dss, algs) {
        // Only a failure pays for the second look at the certificate.
        Err(_) if webpki_refuses_version(cert) => {
            raw_key_signature(algs, message, cert, dss, false)
        }
        checked => checked,
    }
}

/// The TLS 1.3 form of [`tls12_signature`].
fn tls13_signature(
    provider: &rustls::crypto::CryptoProvider,
    message: &[u8],
    cert: &CertificateDer<'_>,
    dss: &rustls::DigitallySignedStruct,
) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
    let algs = &provider.signature_verification_algorithms;
    match rustls::crypto::verify_tls13_signature(message, cert, dss, algs) {
        // Only a failure pays for the second look at the certificate.
        Err(_) if webpki_refuses_version(cert) => raw_key_signature(algs, message, cert, dss, true),
        checked => checked,
    }
}

/// `webpki` reads only X.509 v3 certificates.
fn webpki_refuses_version(cert: &CertificateDer<'_>) -> bool {
    matches!(
        webpki::EndEntityCert::try_from(cert),
        Err(webpki::Error::UnsupportedCertVersion)
    )
}

/// A handshake signature by the key of `cert`, read by [`crate::x509`]: in TLS 1.3 by the
/// first algorithm of the scheme, in TLS 1.2 by any of them that fits the key, as rustls
/// checks it with a certificate `webpki` can read.
fn raw_key_signature(
    algs: &rustls::crypto::WebPkiSupportedAlgorithms,
    message: &[u8],
    cert: &CertificateDer<'_>,
    dss: &rustls::DigitallySignedStruct,
    tls13: bool,
) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
    let unadvertised = || {
        rustls::Error::PeerMisbehaved(
            rustls::PeerMisbehaved::SignedHandshakeWithUnadvertisedSigScheme,
        )
    };
    use rustls::SignatureScheme as S;
    let tls13_scheme = matches!(
        dss.scheme,
        S::ECDSA_NISTP256_SHA256
            | S::ECDSA_NISTP384_SHA384
            | S::ECDSA_NISTP521_SHA512
            | S::RSA_PSS_SHA256
            | S::RSA_PSS_SHA384
            | S::RSA_PSS_SHA512
            | S::ED25519
            | S::ED448
    );
    if tls13 && !tls13_scheme {
        return Err(unadvertised());
    }
    let c = crate::x509::parse(cert).ok_or(rustls::Error::InvalidCertificate(
        rustls::CertificateError::BadEncoding,
    ))?;
    let (_, candidates) = algs
        .mapping
        .iter()
        .find(|(scheme, _)| *scheme == dss.scheme)
        .ok_or_else(unadvertised)?;
    let candidates = if tls13 {
        &candidates[..candidates.len().min(1)]
    } else {
        candidates
    };
    let fits = candidates
        .iter()
        .filter(|a| a.public_key_alg_id().as_ref() == c.spki_alg);
    let mut any = false;
    for a in fits {
        any = true;
        if a.verify_signature(c.public_key, message, dss.signature())
            .is_ok()
        {
            return Ok(rustls::client::danger::HandshakeSignatureValid::assertion());
        }
    }
    Err(if any {
        rustls::Error::InvalidCertificate(rustls::CertificateError::BadSignature)
    } else {
        rustls::Error::General("the signature scheme does not fit the certificate's key".into())
    })
}

/// `ssl_verify_client` for the X.509 v1 client certificates `webpki` cannot read and OpenSSL
/// verifies: one issued by a trusted CA itself (a chain of one, which `ssl_verify_depth 1`,
/// nginx's default, allows), within its dates. Every other certificate is `inner`'s. With a
/// CRL configured a v1 certificate is refused as unverifiable (`unable to get certificate
/// CRL`): shard does not read CRLs itself.
#[derive(Debug)]
struct WithV1Leaves {
    inner: Arc<dyn ClientCertVerifier>,
    cas: Vec<CertificateDer<'static>>,
    /// `ssl_crl`'s lists (DER), and whether `inner` checks them (webpki read them all).
    crls: Vec<Vec<u8>>,
    crl: bool,
    webpki_crls: bool,
    /// `ssl_verify_depth`, for the chains this verifier walks itself.
    depth: u32,
    provider: Arc<rustls::crypto::CryptoProvider>,
}

/// OpenSSL's walk from a peer's certificate: issuers by name and signature, from the trusted
/// `cas` or the peer's chain, up to a trusted certificate that signed itself; the issuers
/// above the peer's own count against `depth` (a trusted intermediate too). The chain, the
/// peer's certificate first.
fn walk_chain<'c>(
    cas: &'c [CertificateDer<'static>],
    depth: u32,
    leaf: crate::x509::Cert<'c>,
    intermediates: &'c [CertificateDer<'_>],
    algs: &[&'static dyn rustls::pki_types::SignatureVerificationAlgorithm],
) -> Result<Vec<crate::x509::Cert<'c>>, rustls::Error> {
    use rustls::CertificateError as E;
    let mut chain = vec![leaf];
    loop {
        let cur = *chain.last().expect("one at least");
        if cur.subject == cur.issuer && crate::x509::signed_by(&cur, &cur, algs) {
            let trusted = cas
                .iter()
                .any(|ca| crate::x509::parse(ca).is_some_and(|t| t.tbs == cur.tbs));
            if !trusted {
                return Err(rustls::Error::InvalidCertificate(E::UnknownIssuer));
            }
            return Ok(chain);
        }
        let issuer = crate::x509::trusted_issuer(&cur, cas, algs).or_else(|| {
            intermediates
                .iter()
                .filter_map(|i| crate::x509::parse(i))
                .find(|i| i.subject == cur.issuer && crate::x509::signed_by(&cur, i, algs))
        });
        let Some(issuer) = issuer else {
            return Err(rustls::Error::InvalidCertificate(E::UnknownIssuer));
        };
        if chain.len() > depth as usize {
            return Err(rustls::Error::General("chain too long".into()));
        }
        chain.push(issuer);
    }
}

/// webpki refuses a CA certificate as a client's own (`CaUsedAsEndEntity`); OpenSSL takes it.
fn webpki_refuses_ca_leaf(e: &rustls::Error) -> bool {
    matches!(
        e,
        rustls::Error::InvalidCertificate(rustls::CertificateError::Other(o))
            if matches!(o.0.downcast_ref::<webpki::Error>(), Some(webpki::Error::CaUsedAsEndEntity))
    )
}

impl WithV1Leaves {
    /// OpenSSL's walk from the client's certificate: issuers by name and signature, from the
    /// trusted CAs or the client's chain, up to a trusted certificate that signed itself; the
    /// issuers above the client's own count against `ssl_verify_depth` (a trusted
    /// intermediate too). The chain, the client's certificate first.
    fn walk<'c>(
        &'c self,
        leaf: crate::x509::Cert<'c>,
        intermediates: &'c [CertificateDer<'_>],
        algs: &[&'static dyn rustls::pki_types::SignatureVerificationAlgorithm],
    ) -> Result<Vec<crate::x509::Cert<'c>>, rustls::Error> {
        walk_chain(&self.cas, self.depth, leaf, intermediates, algs)
    }

    /// `ssl_crl` as OpenSSL checks it for nginx (every certificate of the chain but the
    /// self-signed root): a list from the certificate's issuer, signed by it, not past its
    /// `nextUpdate`, that does not name the certificate's serial.
    fn check_crls(
        &self,
        chain: &[crate::x509::Cert<'_>],
        algs: &[&'static dyn rustls::pki_types::SignatureVerificationAlgorithm],
        now: u64,
    ) -> Result<(), rustls::Error> {
        use rustls::CertificateError as E;
        // nginx's verify callback lets OpenSSL go on after an error, so the error that
        // stands is the last one found, from the client's certificate upwards.
        let mut last = Ok(());
        for pair in chain.windows(2) {
            let (cert, issuer) = (&pair[0], &pair[1]);
            let list = self
                .crls
                .iter()
                .filter_map(|c| crate::x509::parse_crl(c))
                .find(|l| l.issuer == cert.issuer && crate::x509::crl_signed_by(l, issuer, algs));
            let error = match list {
                None => E::UnknownRevocationStatus,
                Some(l) if l.next_update.is_some_and(|t| t < now) => E::ExpiredRevocationList,
                Some(l) if l.revoked.contains(&cert.serial) => E::Revoked,
                Some(_) => continue,
            };
            last = Err(rustls::Error::InvalidCertificate(error));
        }
        last
    }
}

impl ClientCertVerifier for WithV1Leaves {
    fn offer_client_auth(&self) -> bool {
        self.inner.offer_client_auth()
    }

    fn client_auth_mandatory(&self) -> bool {
        self.inner.client_auth_mandatory()
    }

    fn root_hint_subjects(&self) -> &[rustls::DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::server::danger::ClientCertVerified, rustls::Error> {
        use rustls::CertificateError as E;
        let verdict = self
            .inner
            .verify_client_cert(end_entity, intermediates, now);
        let ca_leaf = verdict.as_ref().is_err_and(webpki_refuses_ca_leaf);
        let own_walk = ca_leaf || webpki_refuses_version(end_entity);
        if verdict.is_err() && !own_walk {
            return verdict;
        }
        if verdict.is_ok() && (!self.crl || self.webpki_crls) {
            return verdict;
        }
        // shard's own walk: a certificate webpki refuses, or lists webpki cannot read.
        let bad = |e: E| Err(rustls::Error::InvalidCertificate(e));
        let Some(c) = crate::x509::parse(end_entity) else {
            return bad(E::BadEncoding);
        };
        let algs = self.provider.signature_verification_algorithms.all;
        let chain = self.walk(c, intermediates, algs)?;
        if own_walk {
            match crate::x509::validity(end_entity) {
                Some((from, _)) if now.as_secs() < from => return bad(E::NotValidYet),
                Some((_, until)) if now.as_secs() > until => return bad(E::Expired),
                Some(_) => {}
                None => return bad(E::BadEncoding),
            }
        }
        if self.crl {
            self.check_crls(&chain, algs, now.as_secs())?;
        }
        Ok(rustls::server::danger::ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        tls12_signature(&self.provider, message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        tls13_signature(&self.provider, message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// `proxy_ssl_verify off` (nginx's default): any certificate is accepted, as OpenSSL does
/// without verification; the handshake's signatures are still checked, so the peer holds
/// the key of the certificate it sent.
/// `proxy_ssl_verify on`: webpki's verification, and OpenSSL's fallback to the subject's
/// common name when the certificate lists no DNS name in `subjectAltName` (webpki reads
/// `subjectAltName` only, so a CN-only certificate, which nginx's upstream check accepts,
/// would fail). A name mismatch is webpki's last check: the chain and its validity were
/// verified when it reports one.
#[derive(Debug)]
struct CnFallback {
    inner: Arc<rustls::client::WebPkiServerVerifier>,
    /// The trusted CAs, for the certificates webpki refuses to read (X.509 version 1, a CA
    /// as the peer's own), which shard walks itself as OpenSSL would.
    cas: Vec<CertificateDer<'static>>,
    provider: Arc<rustls::crypto::CryptoProvider>,
}

/// How many issuers above an upstream's certificate shard's own walk follows (webpki's path
/// has its own bound; `proxy_ssl_verify_depth` is not applied).
const UPSTREAM_WALK_DEPTH: u32 = 100;

impl CnFallback {
    /// The names a certificate is valid for, as OpenSSL's `X509_check_host`: its DNS
    /// `subjectAltName`s, else its common names.
    fn name_ok(cert: &crate::x509::Cert<'_>, name: &str) -> bool {
        if crate::x509::has_dns_san(cert) {
            return crate::x509::dns_sans(cert)
                .iter()
                .any(|n| crate::x509::host_matches(n, name));
        }
        crate::x509::subject_cns(cert)
            .iter()
            .any(|cn| crate::x509::host_matches(cn, name))
    }
}

impl rustls::client::danger::ServerCertVerifier for CnFallback {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &rustls::pki_types::ServerName<'_>,
        ocsp_response: &[u8],
        now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        use rustls::CertificateError as E;
        let res = self.inner.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        );
        let name_failed = matches!(
            &res,
            Err(rustls::Error::InvalidCertificate(
                E::NotValidForName | E::NotValidForNameContext { .. }
            ))
        );
        let own_walk =
            res.as_ref().is_err_and(webpki_refuses_ca_leaf) || webpki_refuses_version(end_entity);
        if !name_failed && !own_walk {
            return res;
        }
        let rustls::pki_types::ServerName::DnsName(name) = server_name else {
            return res;
        };
        let Some(cert) = crate::x509::parse(end_entity) else {
            return res;
        };
        if own_walk {
            let algs = self.provider.signature_verification_algorithms.all;
            walk_chain(&self.cas, UPSTREAM_WALK_DEPTH, cert, intermediates, algs)?;
            let bad = |e: E| Err(rustls::Error::InvalidCertificate(e));
            match crate::x509::validity(end_entity) {
                Some((from, _)) if now.as_secs() < from => return bad(E::NotValidYet),
                Some((_, until)) if now.as_secs() > until => return bad(E::Expired),
                Some(_) => {}
                None => return bad(E::BadEncoding),
            }
        }
        // A name mismatch is webpki's last check: the chain was verified when it reports one.
        if Self::name_ok(&cert, name.as_ref()) {
            return Ok(rustls::client::danger::ServerCertVerified::assertion());
        }
        if own_walk {
            return Err(rustls::Error::InvalidCertificate(E::NotValidForName));
        }
        res
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        tls12_signature(&self.provider, message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        tls13_signature(&self.provider, message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

#[derive(Debug)]
struct NoVerify(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for NoVerify {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &rustls::pki_types::ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        tls12_signature(&self.0, message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        tls13_signature(&self.0, message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

fn listener_config(
    http: &HttpConf,
    l: &Listener,
    ticketer: &Arc<dyn rustls::server::ProducesTickets>,
) -> Result<ServerConfig, String> {
    // Every server on the address that has certificates gets them loaded; the default
    // server must have some (nginx: `no "ssl_certificate" is defined for the "listen ...
    // ssl" directive`).
    // A server with `ssl_reject_handshake on` keeps none: the resolver then refuses the
    // handshakes that reach it.
    let mut keys: Vec<Vec<Arc<CertifiedKey>>> = vec![Vec::new(); http.servers.len()];
    let mut dynamic = vec![false; http.servers.len()];
    for &i in &l.servers {
        if http.servers[i].ssl.reject_handshake {
            continue;
        }
        if http.servers[i]
            .ssl
            .certificates
            .iter()
            .any(|p| p.vars.is_some())
        {
            dynamic[i] = true;
            continue;
        }
        for pair in &http.servers[i].ssl.certificates {
            keys[i].push(load_pair(
                &pair.certificate,
                &pair.key,
                pair.password_file.as_deref(),
                pair.stapling_file.as_deref(),
                &pair.place,
            )?);
        }
    }
    let default = &http.servers[l.default_server];
    if keys[l.default_server].is_empty()
        && !default.ssl.reject_handshake
        && !dynamic[l.default_server]
    {
        return Err(format!(
            "no \"ssl_certificate\" is defined for the \"listen ... {}\" directive in {}:{}",
            if l.opts.quic { "quic" } else { "ssl" },
            l.place.file,
            l.place.line
        ));
    }
    // A server with no certificate of its own handshakes in the default server's context,
    // with its certificates (nginx keeps the default's SSL_CTX for such a name).
    for &i in &l.servers {
        if keys[i].is_empty() && !http.servers[i].ssl.reject_handshake && !dynamic[i] {
            keys[i] = keys[l.default_server].clone();
            dynamic[i] = dynamic[l.default_server];
        }
    }
    // Protocols, ciphers, sessions: the default server's, as nginx takes them from the
    // server whose context the handshake starts in.
    // What a session established here was judged by: it resumes only where that is the same
    // (nginx's session ID context: certificates and client CA names).
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    for &i in &l.servers {
        let ssl = &http.servers[i].ssl;
        ctx.update(&[ssl.verify_client as u8]);
        if ssl.verify_client != shard_config::VerifyClient::Off {
            for path in [&ssl.client_certificate, &ssl.trusted_certificate]
                .into_iter()
                .flatten()
            {
                for ca in read_cas(path, &l.place)?.1 {
                    ctx.update(&ca);
                }
            }
        }
        for k in &keys[i] {
            for c in &k.cert {
                ctx.update(c);
            }
        }
        hash_templates(&mut ctx, &http.servers[i].ssl);
        ctx.update(b"/");
    }
    let context = SessionContext::from(ctx.finish());
    let resolver = SniResolver {
        listener: Arc::new(l.clone()),
        keys,
        dynamic,
    };
    // A certificate is asked of every client of an address where any server wants one;
    // each server judges it by its own `ssl_verify_client` once the request names it.
    let asking: Vec<&shard_config::SslConf> = l
        .servers
        .iter()
        .map(|&i| &http.servers[i].ssl)
        .filter(|ssl| ssl.verify_client != shard_config::VerifyClient::Off)
        .collect();
    let mut client_auth: Option<Arc<dyn ClientCertVerifier>> = None;
    if !asking.is_empty() {
        let mut hints = rustls::RootCertStore::empty();
        for ssl in &asking {
            if let Some(path) = &ssl.client_certificate {
                let (_, certs) = read_cas(path, &l.place)?;
                hints.add_parsable_certificates(certs);
            }
        }
        let prov = Arc::new(provider::default_provider());
        // Each CA named once, however many servers or files list it (as OpenSSL's list).
        let mut subjects = hints.subjects();
        let mut seen = Vec::new();
        subjects.retain(|d| {
            let der = d.as_ref().to_vec();
            let fresh = !seen.contains(&der);
            if fresh {
                seen.push(der);
            }
            fresh
        });
        let asker = AskForCertificate {
            hints: subjects,
            provider: prov,
        };
        client_auth = Some(Arc::new(asker));
    }
    let mut config = base_config(
        &default.ssl,
        l,
        Arc::new(resolver),
        client_auth,
        ticketer,
        context,
    )?;
    if l.http2(http, true) {
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    }
    Ok(config)
}

/// A `ServerConfig` from `ssl_*` settings and a certificate resolver.
fn base_config(
    ssl: &shard_config::SslConf,
    l: &Listener,
    resolver: Arc<dyn ResolvesServerCert>,
    client_auth: Option<Arc<dyn ClientCertVerifier>>,
    ticketer: &Arc<dyn rustls::server::ProducesTickets>,
    context: SessionContext,
) -> Result<ServerConfig, String> {
    let mut versions: Vec<&'static rustls::SupportedProtocolVersion> = Vec::new();
    if ssl.protocols.iter().any(|p| p == "TLSv1.3") {
        versions.push(&rustls::version::TLS13);
    }
    if ssl.protocols.iter().any(|p| p == "TLSv1.2") {
        versions.push(&rustls::version::TLS12);
    }
    let mut prov = provider::default_provider();
    prov.cipher_suites = cipher_suites(&ssl.ciphers);
    // `ssl_ecdh_curve` first, as a `Groups` command, then the `ssl_conf_command`s.
    let mut commands = Vec::with_capacity(ssl.conf_commands.len() + 1);
    if !ssl.ecdh_curve.is_empty() {
        commands.push(("Groups".to_string(), ssl.ecdh_curve.clone()));
    }
    commands.extend(ssl.conf_commands.iter().cloned());
    let switches = apply_conf_commands(&commands, &mut versions, &mut prov);
    if versions.is_empty() {
        return Err(format!(
            "\"ssl_protocols\" names no protocol shard speaks (TLSv1.2, TLSv1.3) for {}",
            l.addr
        ));
    }
    let builder = ServerConfig::builder_with_provider(Arc::new(prov))
        .with_protocol_versions(&versions)
        .map_err(|e| format!("ssl configuration for {}: {e}", l.addr))?;
    let builder = match client_auth {
        Some(v) => builder.with_client_cert_verifier(v),
        None => builder.with_no_client_auth(),
    };
    let mut config = builder.with_cert_resolver(resolver);
    // `listener_config` offers h2 first where HTTP/2 is on.
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    config.ignore_client_order = switches
        .server_preference
        .unwrap_or(ssl.prefer_server_ciphers);
    let session_tickets = switches.session_tickets.unwrap_or(ssl.session_tickets);
    let storage: Arc<dyn rustls::server::StoresServerSessions> = match &ssl.session_cache {
        SessionCache::Off | SessionCache::None => {
            Arc::new(rustls::server::NoServerSessionStorage {})
        }
        SessionCache::Cache(n) => rustls::server::ServerSessionMemoryCache::new(*n),
        SessionCache::Shared { name, bytes } => {
            crate::sessions::zone(name, *bytes, ssl.session_timeout_ms).map_err(|e| {
                format!(
                    "ssl_session_cache shared:{name}: mmap() failed ({e}) for {}",
                    l.addr
                )
            })?
        }
    };
    config.session_storage = if storage.can_cache() {
        Arc::new(ContextStore {
            inner: storage,
            context,
            timeout_secs: ssl.session_timeout_ms.div_ceil(1000),
        })
    } else {
        storage
    };
    if session_tickets {
        let inner: Arc<dyn rustls::server::ProducesTickets> = match ssl.session_ticket_keys.first()
        {
            // A key file: every shard given it (on any machine) opens the same tickets.
            Some(path) => Arc::new(SharedTicketer::from_key_file(path)?),
            None => ticketer.clone(),
        };
        config.ticketer = Arc::new(ContextTicketer {
            inner,
            context,
            timeout_secs: ssl.session_timeout_ms.div_ceil(1000),
        });
        // One ticket per handshake, as OpenSSL sends after a resumption (two after a full
        // handshake): each costs an encryption and a record.
        config.send_tls13_tickets = 1;
    } else if matches!(
        ssl.session_cache,
        SessionCache::Shared { .. } | SessionCache::Cache(_)
    ) {
        // No tickets that carry the session: TLS 1.3 resumes from the cache instead, with a
        // ticket that only names the cached session (what OpenSSL does for nginx then).
        config.send_tls13_tickets = 1;
    } else {
        config.send_tls13_tickets = 0;
    }
    Ok(config)
}

/// What `ssl_conf_command Options` switched, over `ssl_prefer_server_ciphers` and
/// `ssl_session_tickets`.
#[derive(Default)]
struct Switches {
    server_preference: Option<bool>,
    session_tickets: Option<bool>,
}

/// `ssl_conf_command`s, in order, over what the other `ssl_*` directives chose (the
/// parser checked each; see `docs/directives.md` for what each one does here).
fn apply_conf_commands(
    commands: &[(String, String)],
    versions: &mut Vec<&'static rustls::SupportedProtocolVersion>,
    prov: &mut rustls::crypto::CryptoProvider,
) -> Switches {
    let mut sw = Switches::default();
    let rank = |v: &str| match v {
        "TLSv1.3" => 13,
        "TLSv1.2" => 12,
        "None" => 0,
        _ => 10,
    };
    let of = |v: &rustls::SupportedProtocolVersion| {
        if v.version == rustls::ProtocolVersion::TLSv1_3 {
            13
        } else {
            12
        }
    };
    for (name, value) in commands {
        let words = value.split([':', ',', ' ']).filter(|w| !w.is_empty());
        match name.to_ascii_lowercase().as_str() {
            "ciphersuites" => {
                let wanted: Vec<String> = words.map(|w| w.replacen("TLS_", "TLS13_", 1)).collect();
                let mut tls13: Vec<rustls::SupportedCipherSuite> = Vec::new();
                for w in &wanted {
                    if let Some(s) = provider::ALL_CIPHER_SUITES
                        .iter()
                        .find(|s| format!("{:?}", s.suite()) == *w)
                    {
                        tls13.push(*s);
                    }
                }
                let tls12 = prov
                    .cipher_suites
                    .iter()
                    .copied()
                    .filter(|s| s.version() != &rustls::version::TLS13);
                prov.cipher_suites = tls13.into_iter().chain(tls12).collect();
            }
            "cipherstring" => {
                let tls13: Vec<_> = prov
                    .cipher_suites
                    .iter()
                    .copied()
                    .filter(|s| s.version() == &rustls::version::TLS13)
                    .collect();
                let tls12 = cipher_suites(value)
                    .into_iter()
                    .filter(|s| s.version() != &rustls::version::TLS13);
                prov.cipher_suites = tls13.into_iter().chain(tls12).collect();
            }
            "minprotocol" => {
                let min = rank(value);
                versions.retain(|v| of(v) >= min);
            }
            "maxprotocol" => {
                let max = if value == "None" { 99 } else { rank(value) };
                versions.retain(|v| of(v) <= max);
            }
            "protocol" => {
                for w in words {
                    let (on, bare) = match w.strip_prefix('-') {
                        Some(b) => (false, b),
                        None => (true, w.trim_start_matches('+')),
                    };
                    let which: Vec<&'static rustls::SupportedProtocolVersion> = match bare {
                        "ALL" => vec![&rustls::version::TLS13, &rustls::version::TLS12],
                        "TLSv1.3" => vec![&rustls::version::TLS13],
                        "TLSv1.2" => vec![&rustls::version::TLS12],
                        _ => Vec::new(),
                    };
                    for v in which {
                        let has = versions.iter().any(|x| x.version == v.version);
                        if on && !has {
                            versions.push(v);
                        } else if !on {
                            versions.retain(|x| x.version != v.version);
                        }
                    }
                }
            }
            "groups" | "curves" => {
                let wanted: Vec<&str> = words.filter_map(shard_config::kx_group_name).collect();
                let all = std::mem::take(&mut prov.kx_groups);
                prov.kx_groups = wanted
                    .iter()
                    .filter_map(|w| {
                        all.iter()
                            .find(|g| format!("{:?}", g.name()) == *w)
                            .copied()
                    })
                    .collect();
            }
            "options" => {
                for w in words {
                    let (on, bare) = match w.strip_prefix('-') {
                        Some(b) => (false, b),
                        None => (true, w),
                    };
                    if bare.eq_ignore_ascii_case("ServerPreference") {
                        sw.server_preference = Some(on);
                    } else if bare.eq_ignore_ascii_case("SessionTicket") {
                        sw.session_tickets = Some(on);
                    }
                }
            }
            _ => {}
        }
    }
    // TLS 1.3 before TLS 1.2, as rustls wants them.
    versions.sort_by_key(|v| std::cmp::Reverse(of(v)));
    sw
}

/// A digest of what a listener's sessions were established under: its certificates and,
/// per server, `ssl_verify_client` and the client CAs. Sessions and tickets carry it, so a
/// session made where no client certificate was asked for (or under other CAs, or another
/// certificate) does not resume after a reload changed that, or on another listener sharing
/// the cache: the client makes a full handshake, as nginx's session ID context makes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct SessionContext([u8; 16]);

impl From<ring::digest::Digest> for SessionContext {
    fn from(d: ring::digest::Digest) -> Self {
        let mut b = [0u8; 16];
        b.copy_from_slice(&d.as_ref()[..16]);
        SessionContext(b)
    }
}

/// A session cache whose keys are bound to a [`SessionContext`], and whose sessions last
/// `ssl_session_timeout` (each value carries the second it was stored).
#[derive(Debug)]
struct ContextStore {
    inner: Arc<dyn rustls::server::StoresServerSessions>,
    context: SessionContext,
    timeout_secs: u64,
}

impl ContextStore {
    fn key(&self, key: &[u8]) -> Vec<u8> {
        let mut d = ring::digest::Context::new(&ring::digest::SHA256);
        d.update(&self.context.0);
        d.update(key);
        d.finish().as_ref().to_vec()
    }
}

/// Seconds since the epoch, for session ages.
fn unix_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// `$ssl_session_id`'s bytes (OpenSSL's session ids are 32).
pub const SESSION_ID_LEN: usize = 32;

/// The session ids a connection's handshake step works with: rustls makes tickets and cache
/// entries, and opens them, inside the connection's `process_new_packets`, on the worker's
/// thread, so the connection sets `current` before the step and takes `resumed` after it.
#[derive(Debug, Default, Clone, Copy)]
pub struct SessionIds {
    /// The id of the session the connection has (stored with every ticket or entry).
    pub current: Option<[u8; SESSION_ID_LEN]>,
    /// The id a ticket or entry opened in this step carried.
    pub resumed: Option<[u8; SESSION_ID_LEN]>,
}

thread_local! {
    static SESSION_IDS: std::cell::Cell<SessionIds> = const {
        std::cell::Cell::new(SessionIds { current: None, resumed: None })
    };
}

impl SessionIds {
    pub fn set_current(id: Option<[u8; SESSION_ID_LEN]>) {
        SESSION_IDS.with(|s| {
            s.set(SessionIds {
                current: id,
                resumed: None,
            })
        });
    }

    /// What the step left, cleared.
    pub fn take() -> SessionIds {
        SESSION_IDS.with(|s| s.take())
    }
}

/// `value` with the second it was made and the session's id in front.
fn stamped(value: &[u8]) -> Vec<u8> {
    let id = SESSION_IDS.with(|s| s.get().current).unwrap_or_default();
    [&unix_secs().to_be_bytes()[..], &id, value].concat()
}

/// The value [`stamped`] made, if it is no older than `timeout_secs` (OpenSSL's rule); its
/// session id is noted for the connection.
fn unstamped(value: &[u8], timeout_secs: u64) -> Option<Vec<u8>> {
    let (at, rest) = value.split_first_chunk::<8>()?;
    let (id, rest) = rest.split_first_chunk::<SESSION_ID_LEN>()?;
    let age = unix_secs().saturating_sub(u64::from_be_bytes(*at));
    if age > timeout_secs {
        return None;
    }
    if id.iter().any(|&b| b != 0) {
        SESSION_IDS.with(|s| {
            let mut ids = s.get();
            ids.resumed = Some(*id);
            s.set(ids);
        });
    }
    Some(rest.to_vec())
}

impl rustls::server::StoresServerSessions for ContextStore {
    fn put(&self, key: Vec<u8>, value: Vec<u8>) -> bool {
        self.inner.put(self.key(&key), stamped(&value))
    }
    fn get(&self, key: &[u8]) -> Option<Vec<u8>> {
        unstamped(&self.inner.get(&self.key(key))?, self.timeout_secs)
    }
    fn take(&self, key: &[u8]) -> Option<Vec<u8>> {
        unstamped(&self.inner.take(&self.key(key))?, self.timeout_secs)
    }
    fn can_cache(&self) -> bool {
        self.inner.can_cache()
    }
}

/// Tickets that carry a [`SessionContext`] (one from another context does not open) and the
/// second they were issued: a ticket older than `ssl_session_timeout` resumes nothing, as
/// OpenSSL's session timeout applies to nginx's tickets.
#[derive(Debug)]
struct ContextTicketer {
    inner: Arc<dyn rustls::server::ProducesTickets>,
    context: SessionContext,
    timeout_secs: u64,
}

impl rustls::server::ProducesTickets for ContextTicketer {
    fn enabled(&self) -> bool {
        self.inner.enabled()
    }
    fn lifetime(&self) -> u32 {
        self.inner
            .lifetime()
            .min(u32::try_from(self.timeout_secs).unwrap_or(u32::MAX))
    }
    fn encrypt(&self, plain: &[u8]) -> Option<Vec<u8>> {
        self.inner
            .encrypt(&[&self.context.0[..], &stamped(plain)].concat())
    }
    fn decrypt(&self, cipher: &[u8]) -> Option<Vec<u8>> {
        let plain = self.inner.decrypt(cipher)?;
        unstamped(plain.strip_prefix(&self.context.0[..])?, self.timeout_secs)
    }
}

/// A stream server's TLS configuration: its certificates (no SNI choice: one server per
/// address) and its `ssl_*` settings.
fn stream_config(
    s: &shard_config::StreamServerConf,
    l: &Listener,
    ticketer: &Arc<dyn rustls::server::ProducesTickets>,
) -> Result<ServerConfig, String> {
    let mut keys = Vec::new();
    let dynamic = s.ssl.certificates.iter().any(|p| p.vars.is_some());
    for pair in s.ssl.certificates.iter().filter(|_| !dynamic) {
        keys.push(load_pair(
            &pair.certificate,
            &pair.key,
            pair.password_file.as_deref(),
            pair.stapling_file.as_deref(),
            &pair.place,
        )?);
    }
    if keys.is_empty() && !dynamic {
        return Err(format!(
            "no \"ssl_certificate\" is defined for the \"listen ... ssl\" directive in {}:{}",
            l.place.file, l.place.line
        ));
    }
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    for k in &keys {
        for c in &k.cert {
            ctx.update(c);
        }
    }
    hash_templates(&mut ctx, &s.ssl);
    let context = SessionContext::from(ctx.finish());
    // `ssl_verify_client`: asked for, judged once the handshake is done (the relay closes a
    // session whose certificate fails, as nginx's stream SSL handler).
    let client_auth: Option<Arc<dyn ClientCertVerifier>> =
        if s.ssl.verify_client == shard_config::VerifyClient::Off {
            None
        } else {
            let mut hints = rustls::RootCertStore::empty();
            if let Some(path) = &s.ssl.client_certificate {
                let (_, certs) = read_cas(path, &l.place)?;
                hints.add_parsable_certificates(certs);
            }
            Some(Arc::new(AskForCertificate {
                hints: hints.subjects(),
                provider: Arc::new(provider::default_provider()),
            }))
        };
    let mut config = base_config(
        &s.ssl,
        l,
        Arc::new(FixedResolver { keys, dynamic }),
        client_auth,
        ticketer,
        context,
    )?;
    // A TCP relay offers what `ssl_alpn` lists (none by default); rustls refuses a client
    // whose list has none of them with `no_application_protocol`, as OpenSSL does for nginx.
    config.alpn_protocols = s.alpn.iter().map(|p| p.as_bytes().to_vec()).collect();
    Ok(config)
}

/// The certificates of a stream server: the first the client's signature schemes allow.
#[derive(Debug)]
struct FixedResolver {
    keys: Vec<Arc<CertifiedKey>>,
    /// The certificates have variables: the worker's rendered pairs ([`set_chosen`]).
    dynamic: bool,
}

impl ResolvesServerCert for FixedResolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        note_hello(&hello);
        if self.dynamic {
            return pick(&take_chosen()?, &hello);
        }
        pick(&self.keys, &hello)
    }
}

/// A server's certificate templates in its session context: sessions resume between
/// servers whose templates (and so whose rendered pairs) are the same, as nginx's session
/// ID context of complex values.
fn hash_templates(ctx: &mut ring::digest::Context, ssl: &shard_config::SslConf) {
    for v in ssl.certificates.iter().filter_map(|p| p.vars.as_ref()) {
        ctx.update(v.raw.0.as_bytes());
        ctx.update(b"\0");
        ctx.update(v.raw.1.as_bytes());
        ctx.update(b"\0");
    }
}

/// The TLS 1.2 suites an OpenSSL cipher string names, in its order, followed by every TLS 1.3
/// suite (nginx's `ssl_ciphers` does not govern TLS 1.3 either). A string of keywords
/// (`HIGH:!aNULL:!MD5`, nginx's default) or naming no suite shard has gives rustls's
/// defaults, all of which such strings allow.
pub fn cipher_suites(ciphers: &str) -> Vec<rustls::SupportedCipherSuite> {
    use provider::cipher_suite as cs;
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

/// A private key, decrypted with the passphrases of `password_file` when it is encrypted
/// (`crate::keys`); errors as nginx's `cannot load certificate key`.
fn load_key(
    key: &Path,
    password_file: Option<&Path>,
    at: &str,
) -> Result<PrivateKeyDer<'static>, String> {
    let passwords = match password_file {
        Some(f) => match PASSWORDS.with(|p| p.borrow().get(f).cloned()) {
            Some(read) => read,
            None => {
                let read = crate::keys::read_passwords(f).map_err(|e| format!("{e} in {at}"))?;
                PASSWORDS.with(|p| p.borrow_mut().insert(f.to_path_buf(), read.clone()));
                read
            }
        },
        None => Vec::new(),
    };
    let encrypted = crate::keys::load_encrypted_key(key, &passwords).map_err(|e| {
        format!(
            "cannot load certificate key \"{}\": {e} in {at}",
            key.display()
        )
    })?;
    match encrypted {
        Some(k) => Ok(k),
        None => PrivateKeyDer::from_pem_file(key).map_err(|e| {
            format!(
                "cannot load certificate key \"{}\": {} in {at}",
                key.display(),
                pem_error(&e)
            )
        }),
    }
}

/// Reads one certificate chain and its key; errors name the file as nginx's do.
fn load_pair(
    cert: &Path,
    key: &Path,
    password_file: Option<&Path>,
    stapling_file: Option<&Path>,
    place: &shard_config::Place,
) -> Result<Arc<CertifiedKey>, String> {
    let at = format!("{}:{}", place.file, place.line);
    let der = load_key(key, password_file, &at)?;
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
    // The TLS Feature extension (RFC 7633, "must-staple"): clients that enforce it refuse a
    // handshake without a stapled OCSP response, which shard sends only from a file.
    const TLS_FEATURE: [u8; 10] = [0x06, 0x08, 0x2b, 0x06, 0x01, 0x05, 0x05, 0x07, 0x01, 0x18];
    if stapling_file.is_none()
        && chain[0]
            .windows(TLS_FEATURE.len())
            .any(|w| w == TLS_FEATURE)
    {
        return Err(format!(
            "certificate \"{}\" requires OCSP stapling (\"must-staple\"), which shard does \
             only with \"ssl_stapling_file\": clients that enforce it would refuse every \
             connection in {at}",
            cert.display()
        ));
    }
    let signing = provider::sign::any_supported_type(&der).map_err(|e| {
        format!(
            "cannot load certificate key \"{}\": {e} in {at}",
            key.display()
        )
    })?;
    let mut ck = CertifiedKey::new(chain, signing);
    // `ssl_stapling_file`: the OCSP response every handshake staples, read as it is (nginx
    // checks it no further either).
    if let Some(f) = stapling_file {
        let der = crate::keys::read_whole(f).map_err(|e| format!("{e} in {at}"))?;
        if der.first() != Some(&0x30) {
            return Err(format!(
                "d2i_OCSP_RESPONSE_bio(\"{}\") failed: not a DER OCSP response in {at}",
                f.display()
            ));
        }
        ck.ocsp = Some(der);
    }
    // The key matches the certificate by its public key, as OpenSSL checks it; rustls's own
    // check reads the certificate with webpki, which takes only X.509 v3.
    let matched = if webpki_refuses_version(&ck.cert[0]) {
        match (ck.key.public_key(), crate::x509::parse(&ck.cert[0])) {
            (Some(k), Some(c)) if k.as_ref() != c.spki => Err("the public keys differ".to_string()),
            (_, None) => Err("the certificate cannot be read".to_string()),
            _ => Ok(()),
        }
    } else {
        ck.keys_match().map_err(|e| e.to_string())
    };
    if let Err(e) = matched {
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
    listener: Arc<Listener>,
    /// Per server (index into `HttpConf::servers`): its certificates, in order.
    keys: Vec<Vec<Arc<CertifiedKey>>>,
    /// Per server: its certificates have variables (the worker's rendered pairs,
    /// [`set_chosen`]).
    dynamic: Vec<bool>,
}

impl std::fmt::Debug for SniResolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SniResolver({})", self.listener.addr)
    }
}

impl ResolvesServerCert for SniResolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        note_hello(&hello);
        let name = hello.server_name().map(str::to_ascii_lowercase);
        let server = shard_http::route::select_server(&self.listener, name.as_deref());
        if self.dynamic.get(server).copied().unwrap_or(false) {
            return pick(&take_chosen()?, &hello);
        }
        let keys = self.keys.get(server).filter(|k| !k.is_empty())?;
        pick(keys, &hello)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::server::ProducesTickets;

    #[test]
    fn tickets_open_in_any_copy_of_the_ticketer_and_nowhere_else() {
        let t = SharedTicketer::new().unwrap();
        let ticket = t.encrypt(b"session state").unwrap();
        // A forked worker has the same seed: its copy opens what another issued, with no
        // ticket of its own issued first.
        let copy = SharedTicketer {
            seed: t.seed.clone(),
            cached: std::sync::Mutex::new(None),
        };
        assert_eq!(
            copy.decrypt(&ticket).as_deref(),
            Some(&b"session state"[..])
        );
        let mut bad = ticket.clone();
        let last = bad.len() - 1;
        bad[last] ^= 1;
        assert_eq!(copy.decrypt(&bad), None);
        let other = SharedTicketer::new().unwrap();
        assert_eq!(other.decrypt(&ticket), None);
        // Two ticketers from the same key file (two machines) open each other's tickets.
        let dir = std::env::temp_dir().join(format!("shard-ticket-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let key = dir.join("ticket.key");
        std::fs::write(&key, [7u8; 80]).unwrap();
        let a = SharedTicketer::from_key_file(&key).unwrap();
        let b = SharedTicketer::from_key_file(&key).unwrap();
        assert_eq!(
            b.decrypt(&a.encrypt(b"s").unwrap()).as_deref(),
            Some(&b"s"[..])
        );
        std::fs::write(&key, [7u8; 40]).unwrap();
        assert!(SharedTicketer::from_key_file(&key)
            .unwrap_err()
            .contains("48 or 80 bytes"));
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(t.decrypt(&vec![0u8; TICKET_MAX_BYTES + 1]), None);
        // The previous period's key still opens; the period's key names differ.
        let p = SharedTicketer::period_now();
        assert_ne!(t.key(p).1, t.key(p - 1).1);
        assert_eq!(t.key(p).1, t.derive(p).1);
    }

    #[test]
    fn cipher_strings_name_suites_or_keep_the_defaults() {
        let defaults = provider::DEFAULT_CIPHER_SUITES.len();
        assert_eq!(cipher_suites("HIGH:!aNULL:!MD5").len(), defaults);
        let s = cipher_suites(
            "ECDHE-RSA-AES256-GCM-SHA384:ECDHE-ECDSA-AES128-GCM-SHA256:DHE-RSA-AES256-SHA",
        );
        let tls12: Vec<_> = s
            .iter()
            .filter(|c| c.version() == &rustls::version::TLS12)
            .map(|c| c.suite())
            .collect();
        assert_eq!(
            tls12,
            [
                rustls::CipherSuite::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
                rustls::CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256
            ]
        );
        assert!(s.iter().any(|c| c.version() == &rustls::version::TLS13));
    }
}

/// What a client offered in its hello: `$ssl_ciphers` and `$ssl_curves`, in OpenSSL's names.
#[derive(Debug, Default)]
pub struct Offered {
    pub ciphers: String,
    pub curves: String,
}

thread_local! {
    /// The hello the certificate resolver saw last: rustls calls it inside the connection's
    /// `process_new_packets`, on this thread, and the connection takes it right after
    /// ([`take_offered`]).
    static OFFERED: std::cell::RefCell<Option<Offered>> = const { std::cell::RefCell::new(None) };
}

fn note_hello(hello: &ClientHello<'_>) {
    let mut o = Offered::default();
    for (i, c) in hello.cipher_suites().iter().enumerate() {
        if i > 0 {
            o.ciphers.push(':');
        }
        match openssl_cipher_name(u16::from(*c)) {
            Some(n) => o.ciphers.push_str(n),
            None => o.ciphers.push_str(&format!("0x{:04x}", u16::from(*c))),
        }
    }
    for (i, g) in hello.named_groups().unwrap_or(&[]).iter().enumerate() {
        if i > 0 {
            o.curves.push(':');
        }
        match openssl_group_name(u16::from(*g)) {
            Some(n) => o.curves.push_str(n),
            None => o.curves.push_str(&format!("0x{:04x}", u16::from(*g))),
        }
    }
    OFFERED.with(|h| *h.borrow_mut() = Some(o));
}

/// The offers [`note_hello`] kept, once.
pub fn take_offered() -> Option<Offered> {
    OFFERED.with(|h| h.borrow_mut().take())
}

/// OpenSSL's name of a cipher suite by its IANA number, for the suites clients commonly offer.
pub fn openssl_cipher_name(code: u16) -> Option<&'static str> {
    Some(match code {
        0x1301 => "TLS_AES_128_GCM_SHA256",
        0x1302 => "TLS_AES_256_GCM_SHA384",
        0x1303 => "TLS_CHACHA20_POLY1305_SHA256",
        0x1304 => "TLS_AES_128_CCM_SHA256",
        0x1305 => "TLS_AES_128_CCM_8_SHA256",
        0xc02b => "ECDHE-ECDSA-AES128-GCM-SHA256",
        0xc02c => "ECDHE-ECDSA-AES256-GCM-SHA384",
        0xc02f => "ECDHE-RSA-AES128-GCM-SHA256",
        0xc030 => "ECDHE-RSA-AES256-GCM-SHA384",
        0xcca8 => "ECDHE-RSA-CHACHA20-POLY1305",
        0xcca9 => "ECDHE-ECDSA-CHACHA20-POLY1305",
        0xccaa => "DHE-RSA-CHACHA20-POLY1305",
        0xc023 => "ECDHE-ECDSA-AES128-SHA256",
        0xc024 => "ECDHE-ECDSA-AES256-SHA384",
        0xc027 => "ECDHE-RSA-AES128-SHA256",
        0xc028 => "ECDHE-RSA-AES256-SHA384",
        0xc009 => "ECDHE-ECDSA-AES128-SHA",
        0xc00a => "ECDHE-ECDSA-AES256-SHA",
        0xc013 => "ECDHE-RSA-AES128-SHA",
        0xc014 => "ECDHE-RSA-AES256-SHA",
        0x009e => "DHE-RSA-AES128-GCM-SHA256",
        0x009f => "DHE-RSA-AES256-GCM-SHA384",
        0x0067 => "DHE-RSA-AES128-SHA256",
        0x006b => "DHE-RSA-AES256-SHA256",
        0x0033 => "DHE-RSA-AES128-SHA",
        0x0039 => "DHE-RSA-AES256-SHA",
        0x009c => "AES128-GCM-SHA256",
        0x009d => "AES256-GCM-SHA384",
        0x003c => "AES128-SHA256",
        0x003d => "AES256-SHA256",
        0x002f => "AES128-SHA",
        0x0035 => "AES256-SHA",
        0x000a => "DES-CBC3-SHA",
        _ => return None,
    })
}

/// OpenSSL's name of a key exchange group by its IANA number (`$ssl_curve`, `$ssl_curves`).
pub fn openssl_group_name(code: u16) -> Option<&'static str> {
    Some(match code {
        0x0017 => "prime256v1",
        0x0018 => "secp384r1",
        0x0019 => "secp521r1",
        0x001d => "X25519",
        0x001e => "X448",
        0x0100 => "ffdhe2048",
        0x0101 => "ffdhe3072",
        0x0102 => "ffdhe4096",
        0x0103 => "ffdhe6144",
        0x0104 => "ffdhe8192",
        0x11ec => "X25519MLKEM768",
        _ => return None,
    })
}
