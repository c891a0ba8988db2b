//! TLS records on a client connection: the byte-level shim between a `Conn`'s socket and its
//! plaintext buffers when it was accepted on an `ssl` listener.
//!
//! This module owns one rustls `ServerConnection` per TLS connection and three operations with
//! the contracts of the plain socket calls they replace, so that `conn.rs`'s edge-triggered
//! rules hold unchanged: [`read_into`] returns fewer bytes than asked only when the socket is
//! drained (or at end of stream), [`write`] accepts plaintext while the socket takes the
//! records, and [`flush`] says whether every record went out (a connection with records
//! pending has output, so it waits for `EPOLLOUT` like any other). A first record that is not
//! TLS (plain HTTP sent to the TLS port) hands its bytes back, so the request can be answered
//! in plain HTTP with nginx's 400. Choosing certificates and building configurations is
//! `crate::tls`'s; `sendfile` is never used on these connections (the bytes must be
//! encrypted in user space).

use std::io::{self, Read, Write};
use std::os::fd::RawFd;
use std::sync::Arc;

use rustls::pki_types::CertificateDer;

use crate::x509::{der, validity};

/// Plaintext a connection may queue in rustls before `write` says the socket is full.
const PLAINTEXT_BUFFER_BYTES: usize = 64 * 1024;
/// Bytes of a first record kept to hand back when it turns out not to be TLS.
const FIRST_BYTES_MAX: usize = 16 * 1024;

pub(in crate::worker) struct TlsConn {
    pub(in crate::worker) conn: rustls::ServerConnection,
    /// The bytes read before the first record was accepted as TLS.
    first: Option<Vec<u8>>,
    /// A handshake completed on this connection was counted.
    pub(in crate::worker) counted: bool,
    /// Time spent processing handshake messages so far, nanoseconds.
    pub(in crate::worker) handshake_ns: u64,
    /// Times handshake records were processed (`TLS_HANDSHAKES_PER_TURN` counts these).
    pub(in crate::worker) handshake_steps: u32,
    /// The peer sent close_notify or ended the stream: reads return 0 from now on.
    pub(in crate::worker) peer_closed: bool,
    /// Our close_notify is queued and the socket's FIN waits until it is written.
    fin_pending: bool,
    /// Our close_notify was queued.
    notified: bool,
    /// The connection ends in an error (a response cut short, a send timeout): it closes
    /// without close_notify, so the client sees a truncation as one (nginx's quiet
    /// shutdown when `c->error` or `c->timedout`).
    pub(in crate::worker) quiet: bool,
    /// Plaintext on its way into a tunnel's or relay's pipe (`TlsSide::recv`), kept so that
    /// no read allocates.
    scratch: Vec<u8>,
    /// The client certificate as the last request's server judged it ([`client_cert`]).
    client: Option<Box<ClientCert>>,
    /// What the client offered (`$ssl_ciphers`, `$ssl_curves`), taken after its hello.
    offered: Option<Box<crate::tls::Offered>>,
    /// The session's id, stamped into its tickets and cache entries so that a resumed
    /// session has the id it was given (`None` until the hello is processed), and its hex
    /// for `$ssl_session_id`.
    session_id: Option<[u8; crate::tls::SESSION_ID_LEN]>,
    session_hex: String,
    /// A server of the listener has `ssl_certificate` with variables and the pair for this
    /// handshake is not rendered yet: the worker peeks at the hello first
    /// ([`peek_hello`]), then sets `chosen`.
    pub(in crate::worker) cert_pending: bool,
    /// The rendered pairs for this handshake (given to the resolver at each handshake step).
    pub(in crate::worker) chosen: Option<Vec<Arc<rustls::sign::CertifiedKey>>>,
    /// The SNI name of the peeked hello, for `$ssl_server_name` while the pair is rendered.
    sni_hint: Option<String>,
}

/// What the first bytes of a TLS connection say, peeked without reading them.
pub(in crate::worker) enum Peek {
    /// A whole ClientHello, and its SNI name ("" without one).
    Hello(String),
    /// Not all of it yet: wait for more.
    Wait,
    /// Not a hello, or the end of the stream: the handshake goes on as it would.
    Other,
}

/// Peeks at the socket for the connection's ClientHello ([`TlsConn::cert_pending`]).
pub(in crate::worker) fn peek_hello(fd: RawFd) -> Peek {
    let mut buf = vec![0u8; FIRST_BYTES_MAX];
    // SAFETY: `buf` is a live buffer of its length; MSG_PEEK leaves the bytes queued.
    let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_PEEK) };
    if n < 0 {
        let e = io::Error::last_os_error();
        return match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Peek::Wait,
            _ => Peek::Other,
        };
    }
    let n = n as usize;
    if n == 0 {
        return Peek::Other;
    }
    match crate::preread::parse(&buf[..n]) {
        crate::preread::Preread::Hello(h) => Peek::Hello(h.server_name),
        crate::preread::Preread::Partial if n < buf.len() => Peek::Wait,
        _ => Peek::Other,
    }
}

/// What [`read_into`] found besides plaintext.
pub(in crate::worker) enum NotTls {
    /// The client's first bytes are not a TLS record: here they are, for a plain answer.
    Plain(Vec<u8>),
    /// A TLS error (already answered with an alert where possible).
    Error(io::Error),
}

impl TlsConn {
    pub(in crate::worker) fn new(config: &Arc<rustls::ServerConfig>) -> io::Result<TlsConn> {
        let mut conn = rustls::ServerConnection::new(config.clone())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        conn.set_buffer_limit(Some(PLAINTEXT_BUFFER_BYTES));
        Ok(TlsConn {
            conn,
            first: Some(Vec::new()),
            counted: false,
            handshake_ns: 0,
            handshake_steps: 0,
            peer_closed: false,
            fin_pending: false,
            notified: false,
            quiet: false,
            scratch: Vec::new(),
            client: None,
            offered: None,
            session_id: None,
            session_hex: String::new(),
            cert_pending: false,
            chosen: None,
            sni_hint: None,
        })
    }

    /// Records (or the FIN behind them) wait to be written.
    pub(in crate::worker) fn has_output(&self) -> bool {
        self.conn.wants_write() || self.fin_pending
    }

    /// `$ssl_protocol` (`TLSv1.3`), as OpenSSL names it.
    pub(in crate::worker) fn protocol(&self) -> Option<&'static str> {
        Some(match self.conn.protocol_version()? {
            rustls::ProtocolVersion::TLSv1_3 => "TLSv1.3",
            rustls::ProtocolVersion::TLSv1_2 => "TLSv1.2",
            _ => return None,
        })
    }

    /// `$ssl_cipher`, in OpenSSL's name (`TLS_AES_128_GCM_SHA256`, `ECDHE-RSA-AES128-GCM-SHA256`).
    pub(in crate::worker) fn cipher(&self) -> Option<&'static str> {
        use rustls::CipherSuite as C;
        Some(match self.conn.negotiated_cipher_suite()?.suite() {
            C::TLS13_AES_128_GCM_SHA256 => "TLS_AES_128_GCM_SHA256",
            C::TLS13_AES_256_GCM_SHA384 => "TLS_AES_256_GCM_SHA384",
            C::TLS13_CHACHA20_POLY1305_SHA256 => "TLS_CHACHA20_POLY1305_SHA256",
            C::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256 => "ECDHE-ECDSA-AES128-GCM-SHA256",
            C::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384 => "ECDHE-ECDSA-AES256-GCM-SHA384",
            C::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256 => "ECDHE-ECDSA-CHACHA20-POLY1305",
            C::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256 => "ECDHE-RSA-AES128-GCM-SHA256",
            C::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384 => "ECDHE-RSA-AES256-GCM-SHA384",
            C::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256 => "ECDHE-RSA-CHACHA20-POLY1305",
            _ => return None,
        })
    }

    /// `$ssl_server_name`: the SNI the client sent (the peeked one before the hello is
    /// processed).
    pub(in crate::worker) fn server_name(&self) -> Option<&str> {
        self.conn
            .server_name()
            .or(self.sni_hint.as_deref().filter(|s| !s.is_empty()))
    }

    /// The hello was peeked ([`peek_hello`]): its SNI name, for rendering the pair.
    pub(in crate::worker) fn peeked(&mut self, sni: String) {
        self.cert_pending = false;
        self.sni_hint = Some(sni);
    }

    /// `$ssl_session_reused`.
    pub(in crate::worker) fn session_reused(&self) -> bool {
        self.conn.handshake_kind() == Some(rustls::HandshakeKind::Resumed)
    }

    /// `$ssl_alpn_protocol`.
    pub(in crate::worker) fn alpn(&self) -> &str {
        self.conn
            .alpn_protocol()
            .and_then(|p| std::str::from_utf8(p).ok())
            .unwrap_or("")
    }

    /// `$ssl_curve`: the key exchange group, in OpenSSL's name.
    pub(in crate::worker) fn curve(&self) -> &'static str {
        use rustls::NamedGroup as G;
        match self.conn.negotiated_key_exchange_group().map(|g| g.name()) {
            Some(G::X25519) => "X25519",
            Some(G::secp256r1) => "prime256v1",
            Some(G::secp384r1) => "secp384r1",
            Some(G::secp521r1) => "secp521r1",
            Some(G::X448) => "X448",
            _ => "",
        }
    }

    /// After handshake records were processed: keeps what the hello offered, and the
    /// session's id: the one a resumed session's ticket or cache entry carried, else a new
    /// random one (which the tickets and cache entries this connection makes will carry,
    /// see [`crate::tls::SessionIds`]).
    fn after_handshake_step(&mut self) {
        // Taken whatever this connection's state: no later connection may find them.
        let offered = crate::tls::take_offered();
        let ids = crate::tls::SessionIds::take();
        if self.offered.is_none() {
            self.offered = offered.map(Box::new);
        }
        let id = match ids.resumed {
            Some(id) => id,
            None if self.session_id.is_none() && self.offered.is_some() => {
                let mut id = [0u8; crate::tls::SESSION_ID_LEN];
                // SAFETY: `getrandom` writes at most `id.len()` bytes into `id`.
                let n = unsafe { libc::getrandom(id.as_mut_ptr().cast(), id.len(), 0) };
                if n != id.len() as isize {
                    return;
                }
                id
            }
            None => return,
        };
        self.session_id = Some(id);
        self.session_hex = id.iter().map(|b| format!("{b:02x}")).collect();
    }

    /// Before handshake records are processed: the session's id, for the tickets and cache
    /// entries made meanwhile.
    fn before_handshake_step(&self) {
        crate::tls::SessionIds::set_current(self.session_id);
        if self.chosen.is_some() {
            crate::tls::set_chosen(self.chosen.clone());
        }
    }

    /// The client certificate as `server` judged it, if a request to it did.
    pub(in crate::worker) fn client_judged(&self, server: usize) -> Option<&ClientCert> {
        self.client.as_deref().filter(|c| c.server == server)
    }

    /// The TLS variables of the connection, its client certificate as judged for `server`
    /// (`verify` is `NONE` when it was not).
    pub(in crate::worker) fn vars(&self, server: usize) -> shard_http::vars::Tls<'_> {
        shard_http::vars::Tls {
            protocol: self.protocol().unwrap_or(""),
            cipher: self.cipher().unwrap_or(""),
            server_name: self.server_name().unwrap_or(""),
            session_reused: self.session_reused(),
            alpn: self.alpn(),
            curve: self.curve(),
            session_id: &self.session_hex,
            ciphers: self.offered.as_ref().map_or("", |o| &o.ciphers),
            curves: self.offered.as_ref().map_or("", |o| &o.curves),
            early_data: false,
            client: match self.client_judged(server) {
                Some(cc) => shard_http::vars::ClientCert {
                    verify: &cc.verify,
                    s_dn: &cc.s_dn,
                    i_dn: &cc.i_dn,
                    serial: &cc.serial,
                    fingerprint: &cc.fingerprint,
                    s_dn_legacy: &cc.s_dn_legacy,
                    i_dn_legacy: &cc.i_dn_legacy,
                    pem: &cc.pem,
                    v_start: &cc.v_start,
                    v_end: &cc.v_end,
                    v_end_secs: cc.v_end_secs,
                },
                None => shard_http::vars::ClientCert {
                    verify: "NONE",
                    ..Default::default()
                },
            },
        }
    }
}

/// rustls's error when the certificate resolver found nothing for the client's name.
const NO_CERTIFICATE: &str = "no server certificate chain resolved";
/// The TLS alert `unrecognized_name` (RFC 6066).
const UNRECOGNIZED_NAME: u8 = 112;

/// Writes one fatal alert record straight to the socket (before any key exists, a plain
/// record), best effort: the connection closes after it.
fn send_alert(fd: RawFd, description: u8) {
    let record = [21, 3, 3, 0, 2, 2, description];
    // SAFETY: `record` is a live buffer of its length; a short or failed send is ignored.
    unsafe {
        libc::send(fd, record.as_ptr().cast(), record.len(), libc::MSG_NOSIGNAL);
    }
}

/// The socket as rustls reads and writes it; the first record's bytes are kept meanwhile.
struct Sock<'a> {
    fd: RawFd,
    first: Option<&'a mut Vec<u8>>,
    /// A read returned less than it was offered: the socket is drained for now, so the
    /// edge-triggered reader may wait for the next edge without a read that says `EAGAIN`
    /// (the rule `conn.rs` follows for plain sockets).
    short: bool,
}

impl Sock<'_> {
    fn new(fd: RawFd) -> Sock<'static> {
        Sock {
            fd,
            first: None,
            short: false,
        }
    }
}

impl Read for Sock<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = shard_event::sock::read(self.fd, buf)?;
        self.short |= n > 0 && n < buf.len();
        if let Some(f) = self.first.as_mut() {
            if f.len() + n <= FIRST_BYTES_MAX {
                f.extend_from_slice(&buf[..n]);
            }
        }
        Ok(n)
    }
}

impl Write for Sock<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        shard_event::sock::write(self.fd, buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Writes pending records (then the FIN a [`TlsSide::shut`] left waiting for them).
/// `Ok(true)`: none is left; `Ok(false)`: the socket is full.
pub(in crate::worker) fn flush(fd: RawFd, t: &mut TlsConn) -> io::Result<bool> {
    while t.conn.wants_write() {
        match t.conn.write_tls(&mut Sock::new(fd)) {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    if t.fin_pending {
        t.fin_pending = false;
        shard_event::sock::shutdown_write(fd);
    }
    Ok(true)
}

/// The close of a connection whose handshake completed: close_notify, written now if the
/// socket takes it (nginx's `ngx_ssl_shutdown` does the same, and OpenSSL 3 clients report an
/// end of stream without it as an error: Python's `ssl`, curl on a response that ends with the
/// connection). Nothing when records are still pending (a client that stopped reading), the
/// connection ends in an error (`quiet`), or the notice went out already; never waits.
pub(in crate::worker) fn close_notify(fd: RawFd, t: &mut TlsConn) {
    if t.conn.is_handshaking() || t.notified || t.quiet || t.conn.wants_write() {
        return;
    }
    t.notified = true;
    t.conn.send_close_notify();
    let _ = t.conn.write_tls(&mut Sock::new(fd));
}

/// Reads plaintext into the spare capacity of `buf`, at most `max` bytes, reading and
/// decrypting records as needed. `Ok(n)` with `n < max`: the socket is drained (or ended:
/// then the next call returns `Ok(0)`); `Err(WouldBlock)`: nothing yet.
pub(in crate::worker) fn read_into(
    fd: RawFd,
    t: &mut TlsConn,
    buf: &mut Vec<u8>,
    max: usize,
) -> Result<usize, NotTls> {
    let begin = buf.len();
    // A short read of the socket in this call: once rustls has no more plaintext, the
    // socket is known to be drained without a read that says `EAGAIN`.
    let mut drained = false;
    loop {
        let got = buf.len() - begin;
        if got >= max {
            return Ok(got);
        }
        let old = buf.len();
        buf.resize(old + (max - got), 0);
        match t.conn.reader().read(&mut buf[old..]) {
            Ok(n) => {
                buf.truncate(old + n);
                if n == 0 {
                    // close_notify: end of stream.
                    t.peer_closed = true;
                    return Ok(got);
                }
                continue;
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                buf.truncate(old);
                if drained {
                    return if got > 0 {
                        Ok(got)
                    } else {
                        Err(NotTls::Error(e))
                    };
                }
            }
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                // The peer closed without close_notify: an end of stream all the same.
                buf.truncate(old);
                t.peer_closed = true;
                return Ok(got);
            }
            Err(e) => {
                buf.truncate(old);
                return Err(NotTls::Error(e));
            }
        }
        let mut sock = Sock {
            fd,
            first: t.first.as_mut(),
            short: false,
        };
        let res = t.conn.read_tls(&mut sock);
        drained |= sock.short;
        match res {
            Ok(0) => {
                t.peer_closed = true;
                return Ok(got);
            }
            Ok(_) => {
                let timed = t.conn.is_handshaking().then(std::time::Instant::now);
                if timed.is_some() {
                    t.before_handshake_step();
                }
                let processed = t.conn.process_new_packets();
                if let Some(t0) = timed {
                    if t.chosen.is_some() {
                        crate::tls::set_chosen(None);
                    }
                    t.handshake_ns += t0.elapsed().as_nanos() as u64;
                    t.handshake_steps = t.handshake_steps.wrapping_add(1);
                    t.after_handshake_step();
                }
                if let Err(e) = processed {
                    if let Some(bytes) = t.first.take().filter(|b| looks_plain(b)) {
                        return Err(NotTls::Plain(bytes));
                    }
                    // No certificate for the name (`ssl_reject_handshake on`): nginx's
                    // `unrecognized_name` alert, not the `access_denied` rustls queued.
                    if matches!(&e, rustls::Error::General(m) if m == NO_CERTIFICATE) {
                        send_alert(fd, UNRECOGNIZED_NAME);
                        return Err(NotTls::Error(io::Error::new(io::ErrorKind::InvalidData, e)));
                    }
                    // The alert rustls queued goes out if the socket takes it.
                    let _ = flush(fd, t);
                    return Err(NotTls::Error(io::Error::new(io::ErrorKind::InvalidData, e)));
                }
                if !t.conn.is_handshaking() || t.first.as_ref().is_some_and(|f| f.len() > 5) {
                    // A record was accepted: the bytes are TLS.
                    t.first = None;
                }
                if let Err(e) = flush(fd, t) {
                    return Err(NotTls::Error(e));
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                return if got > 0 {
                    Ok(got)
                } else {
                    Err(NotTls::Error(e))
                };
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(NotTls::Error(e)),
        }
    }
}

/// A first record that no TLS client sends: it starts with an ASCII letter (a method).
fn looks_plain(b: &[u8]) -> bool {
    b.first().is_some_and(u8::is_ascii_uppercase)
}

/// Queues plaintext and writes what records the socket takes. `Err(WouldBlock)` when records
/// are still pending from before (the socket is full).
pub(in crate::worker) fn write(fd: RawFd, t: &mut TlsConn, data: &[u8]) -> io::Result<usize> {
    if !flush(fd, t)? {
        return Err(io::ErrorKind::WouldBlock.into());
    }
    let n = t.conn.writer().write(data)?;
    flush(fd, t)?;
    if n == 0 && !data.is_empty() {
        return Err(io::ErrorKind::WouldBlock.into());
    }
    Ok(n)
}

/// A TLS connection as one side of a tunnel (`relay::move_between`).
pub(in crate::worker) struct TlsSide<'a> {
    pub(in crate::worker) fd: RawFd,
    pub(in crate::worker) t: &'a mut TlsConn,
}

impl super::relay::Endpoint for TlsSide<'_> {
    fn recv(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let mut v = std::mem::take(&mut self.t.scratch);
        v.clear();
        let res = match read_into(self.fd, self.t, &mut v, buf.len()) {
            Ok(n) => {
                buf[..n].copy_from_slice(&v[..n]);
                Ok(n)
            }
            Err(NotTls::Error(e)) => Err(e),
            Err(NotTls::Plain(_)) => Err(io::ErrorKind::InvalidData.into()),
        };
        self.t.scratch = v;
        res
    }
    fn send(&mut self, buf: &[u8]) -> io::Result<usize> {
        write(self.fd, self.t, buf)
    }
    /// close_notify, then the FIN once every record went out (a later `flush` sends it when
    /// the socket is full now).
    fn shut(&mut self) {
        self.t.notified = true;
        self.t.conn.send_close_notify();
        self.t.fin_pending = true;
        let _ = flush(self.fd, self.t);
    }
}

/// TLS to an upstream (`proxy_pass https://`): the client side, with the contracts of the
/// plain upstream socket calls it stands in for in `proxy.rs`. `readable` and `writable` are
/// the upstream connection's edge-triggered flags: cleared only where the socket said
/// `EAGAIN`, and `readable` is never cleared while decrypted bytes wait in rustls.
pub(in crate::worker) type UpTls = rustls::ClientConnection;

/// Writes pending records. `Ok(true)`: none is left; `Ok(false)`: the socket is full.
pub(in crate::worker) fn flush_up(fd: RawFd, c: &mut UpTls) -> io::Result<bool> {
    while c.wants_write() {
        match c.write_tls(&mut Sock::new(fd)) {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

/// What one [`read_records`] found.
#[derive(PartialEq, Eq)]
enum Records {
    Read,
    /// Read, and the socket is drained (a short read): wait for the next edge.
    Drained,
    /// The socket's end of stream (rustls knows it now).
    End,
    /// `EAGAIN`.
    Again,
}

/// Reads records from the socket into rustls once, and processes them.
fn read_records(fd: RawFd, c: &mut UpTls) -> io::Result<Records> {
    loop {
        let mut sock = Sock::new(fd);
        match c.read_tls(&mut sock) {
            Ok(n) => {
                if let Err(e) = c.process_new_packets() {
                    // The alert rustls queued, if the socket takes it.
                    let _ = flush_up(fd, c);
                    return Err(io::Error::new(io::ErrorKind::InvalidData, e));
                }
                return Ok(match (n, sock.short) {
                    (0, _) => Records::End,
                    (_, true) => Records::Drained,
                    _ => Records::Read,
                });
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(Records::Again),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// One step of the handshake to an upstream. `Ok(true)`: it is complete (the client's last
/// flight may still wait in rustls: [`write_up`] sends it first); `Ok(false)`: wait.
pub(in crate::worker) fn handshake_up(
    fd: RawFd,
    c: &mut UpTls,
    readable: &mut bool,
    writable: &mut bool,
) -> io::Result<bool> {
    loop {
        if *writable && !flush_up(fd, c)? {
            *writable = false;
        }
        if !c.is_handshaking() {
            return Ok(true);
        }
        if !*readable {
            return Ok(false);
        }
        match read_records(fd, c)? {
            Records::Read => {}
            Records::Drained | Records::Again => *readable = false,
            Records::End if c.is_handshaking() => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the upstream closed the connection in the handshake",
                ))
            }
            Records::End => {}
        }
    }
}

/// Writes `buf[*pos..]` as records while the socket takes them. `Ok(true)`: all of it is
/// on the wire; `Ok(false)`: the socket is full (`writable` is then cleared).
pub(in crate::worker) fn write_up(
    fd: RawFd,
    c: &mut UpTls,
    buf: &[u8],
    pos: &mut usize,
    writable: &mut bool,
) -> io::Result<bool> {
    loop {
        if !*writable {
            return Ok(false);
        }
        if !flush_up(fd, c)? {
            *writable = false;
            return Ok(false);
        }
        if *pos >= buf.len() {
            return Ok(true);
        }
        let n = c.writer().write(&buf[*pos..])?;
        if n == 0 {
            // rustls took nothing although its records are all out: never expected; wait
            // rather than spin.
            return Ok(false);
        }
        *pos += n;
    }
}

/// Reads plaintext from the upstream into the spare capacity of `buf`, at most `max` bytes.
/// `Ok(Some(0))`: end of stream (close_notify, or the socket's end without one, which an
/// upstream body framed by the connection's end also is for nginx); `Ok(None)`: wait.
pub(in crate::worker) fn read_up(
    fd: RawFd,
    c: &mut UpTls,
    buf: &mut Vec<u8>,
    max: usize,
    readable: &mut bool,
) -> io::Result<Option<usize>> {
    let start = buf.len();
    loop {
        buf.resize(start + max.max(1), 0);
        let got = c.reader().read(&mut buf[start..]);
        match got {
            Ok(n) => {
                buf.truncate(start + n);
                if n == max.max(1) {
                    // The buffer filled: more may wait in rustls, whatever the socket says.
                    *readable = true;
                }
                return Ok(Some(n));
            }
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                buf.truncate(start);
                return Ok(Some(0));
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => buf.truncate(start),
            Err(e) => {
                buf.truncate(start);
                return Err(e);
            }
        }
        if !*readable {
            return Ok(None);
        }
        if matches!(read_records(fd, c)?, Records::Again | Records::Drained) {
            *readable = false;
        }
        // An alert to answer, a key update: best effort, the next write flushes the rest.
        if c.wants_write() {
            let _ = flush_up(fd, c);
        }
    }
}

/// Whether an upstream connection about to go idle in a pool holds nothing: no plaintext
/// and no end of stream behind the response, only TLS housekeeping (a session ticket, read
/// and processed here), and no record left unwritten. Reads until `EAGAIN`, so the pool's
/// "any event closes it" rule holds from here on.
pub(in crate::worker) fn up_idle(fd: RawFd, c: &mut UpTls, readable: bool) -> bool {
    let mut r = readable;
    let mut one = Vec::new();
    matches!(read_up(fd, c, &mut one, 1, &mut r), Ok(None)) && flush_up(fd, c).unwrap_or(false)
}

/// close_notify to an upstream whose handshake completed, if the socket takes it now.
pub(in crate::worker) fn close_up(fd: RawFd, c: &mut UpTls) {
    if !c.is_handshaking() {
        c.send_close_notify();
        let _ = flush_up(fd, c);
    }
}

/// An upstream's TLS connection as one side of a relay (stream's `proxy_ssl on`).
pub(in crate::worker) struct UpTlsSide<'a> {
    pub(in crate::worker) fd: RawFd,
    pub(in crate::worker) c: &'a mut UpTls,
    /// Our close_notify is queued and the FIN waits until it is written ([`finish_up`]).
    pub(in crate::worker) fin_pending: &'a mut bool,
}

impl super::relay::Endpoint for UpTlsSide<'_> {
    fn recv(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let mut drained = false;
        loop {
            match self.c.reader().read(buf) {
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(0),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
            if drained {
                // A short read just now: nothing more until the next edge.
                return Err(io::ErrorKind::WouldBlock.into());
            }
            match read_records(self.fd, self.c)? {
                Records::Again => return Err(io::ErrorKind::WouldBlock.into()),
                Records::Drained => drained = true,
                Records::Read | Records::End => {}
            }
            if self.c.wants_write() {
                let _ = flush_up(self.fd, self.c);
            }
        }
    }
    fn send(&mut self, buf: &[u8]) -> io::Result<usize> {
        if !flush_up(self.fd, self.c)? {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let n = self.c.writer().write(buf)?;
        flush_up(self.fd, self.c)?;
        if n == 0 && !buf.is_empty() {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        Ok(n)
    }
    fn shut(&mut self) {
        self.c.send_close_notify();
        *self.fin_pending = true;
        let _ = finish_up(self.fd, self.c, self.fin_pending);
    }
}

/// Writes an upstream's pending records, then the FIN a [`UpTlsSide::shut`] left waiting.
/// `Ok(true)`: nothing is left.
pub(in crate::worker) fn finish_up(
    fd: RawFd,
    c: &mut UpTls,
    fin_pending: &mut bool,
) -> io::Result<bool> {
    if !flush_up(fd, c)? {
        return Ok(false);
    }
    if *fin_pending {
        *fin_pending = false;
        shard_event::sock::shutdown_write(fd);
    }
    Ok(true)
}

/// The client certificate as a request's server judged it (`ssl_verify_client`), and the
/// `$ssl_client_*` variables; made when a request first needs them.
pub(in crate::worker) struct ClientCert {
    /// The http server whose CAs judged it.
    pub(in crate::worker) server: usize,
    pub(in crate::worker) outcome: ClientOutcome,
    /// OpenSSL's `X509_V_ERR_*` number of a failure (0 when it has none), for the log.
    pub(in crate::worker) error_code: u32,
    pub(in crate::worker) verify: String,
    pub(in crate::worker) s_dn: String,
    pub(in crate::worker) i_dn: String,
    pub(in crate::worker) serial: String,
    pub(in crate::worker) fingerprint: String,
    pub(in crate::worker) s_dn_legacy: String,
    pub(in crate::worker) i_dn_legacy: String,
    /// The certificate in PEM (`$ssl_client_raw_cert`).
    pub(in crate::worker) pem: String,
    /// Its validity as OpenSSL prints it, and its end in unix seconds.
    pub(in crate::worker) v_start: String,
    pub(in crate::worker) v_end: String,
    pub(in crate::worker) v_end_secs: u64,
}

/// What verification found.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(in crate::worker) enum ClientOutcome {
    /// No certificate was sent.
    None,
    Success,
    /// It does not verify; `issuer`: only because its issuer is unknown (which
    /// `optional_no_ca` lets pass, as nginx's `ngx_ssl_verify_error_optional`).
    Failed {
        issuer: bool,
    },
}

/// Judges the connection's client certificate for `server` with its CAs (`None`: it has
/// none, `optional_no_ca`), once per connection and server.
pub(in crate::worker) fn client_cert<'t>(
    t: &'t mut TlsConn,
    server: usize,
    verifier: Option<&Arc<dyn rustls::server::danger::ClientCertVerifier>>,
    depth: u32,
) -> &'t ClientCert {
    if t.client.as_ref().is_none_or(|c| c.server != server) {
        t.client = Some(Box::new(judge(t, server, verifier, depth)));
    }
    t.client.as_deref().expect("just made")
}

fn judge(
    t: &TlsConn,
    server: usize,
    verifier: Option<&Arc<dyn rustls::server::danger::ClientCertVerifier>>,
    depth: u32,
) -> ClientCert {
    let mut c = ClientCert {
        server,
        outcome: ClientOutcome::None,
        error_code: 0,
        verify: "NONE".to_string(),
        s_dn: String::new(),
        i_dn: String::new(),
        serial: String::new(),
        fingerprint: String::new(),
        s_dn_legacy: String::new(),
        i_dn_legacy: String::new(),
        pem: String::new(),
        v_start: String::new(),
        v_end: String::new(),
        v_end_secs: 0,
    };
    let Some((ee, rest)) = t.conn.peer_certificates().and_then(<[_]>::split_first) else {
        return c;
    };
    // Read by shard's own walk, which takes every version (webpki only v3).
    let parsed = crate::x509::parse(ee);
    let now = rustls::pki_types::UnixTime::now();
    // `ssl_verify_depth`: the client's intermediates the chain may use (depth 1: none, the
    // certificate is signed by a trusted CA itself).
    let allowed = &rest[..rest.len().min(depth.saturating_sub(1) as usize)];
    let verify = |inter: &[CertificateDer<'_>]| match verifier {
        Some(v) => v.verify_client_cert(ee, inter, now).map(|_| ()),
        None => Err(rustls::Error::InvalidCertificate(
            rustls::CertificateError::UnknownIssuer,
        )),
    };
    let mut result = verify(allowed);
    if result.is_err() && allowed.len() < rest.len() && verify(rest).is_ok() {
        result = Err(rustls::Error::General("chain too long".into()));
    }
    // OpenSSL's numbers and words, which nginx's `$ssl_client_verify` and log use.
    let failure: Option<(bool, u32, String)> = match result {
        Ok(()) => None,
        Err(e) => {
            use rustls::CertificateError as E;
            Some(match &e {
                rustls::Error::InvalidCertificate(E::UnknownIssuer) => {
                    // Without a known issuer, OpenSSL still judges the dates, and names a
                    // certificate that signed itself.
                    match date_error(ee, now.as_secs()) {
                        Some(bad) => bad,
                        None if parsed.as_ref().is_some_and(|p| p.subject == p.issuer) => {
                            (true, 18, "self-signed certificate".to_string())
                        }
                        None => (
                            true,
                            20,
                            "unable to get local issuer certificate".to_string(),
                        ),
                    }
                }
                rustls::Error::InvalidCertificate(E::Expired | E::ExpiredContext { .. }) => {
                    (false, 10, "certificate has expired".to_string())
                }
                rustls::Error::InvalidCertificate(
                    E::NotValidYet | E::NotValidYetContext { .. },
                ) => (false, 9, "certificate is not yet valid".to_string()),
                rustls::Error::InvalidCertificate(E::BadSignature) => {
                    (false, 7, "certificate signature failure".to_string())
                }
                rustls::Error::InvalidCertificate(E::Revoked) => {
                    (false, 23, "certificate revoked".to_string())
                }
                rustls::Error::InvalidCertificate(E::UnknownRevocationStatus) => {
                    (false, 3, "unable to get certificate CRL".to_string())
                }
                rustls::Error::InvalidCertificate(
                    E::ExpiredRevocationList | E::ExpiredRevocationListContext { .. },
                ) => (false, 12, "CRL has expired".to_string()),
                rustls::Error::General(g) if g == "chain too long" => {
                    (false, 22, "certificate chain too long".to_string())
                }
                other => (false, 0, other.to_string()),
            })
        }
    };
    (c.outcome, c.verify) = match failure {
        None => (ClientOutcome::Success, "SUCCESS".to_string()),
        Some((issuer, code, why)) => {
            c.error_code = code;
            (ClientOutcome::Failed { issuer }, format!("FAILED:{why}"))
        }
    };
    if let Some(cert) = parsed {
        let content = |name: &[u8]| der(name).map_or(&[][..], |(_, c, _)| c).to_vec();
        let (subject, issuer) = (content(cert.subject), content(cert.issuer));
        c.s_dn = dn_rfc2253(&subject);
        c.i_dn = dn_rfc2253(&issuer);
        c.s_dn_legacy = dn_oneline(&subject);
        c.i_dn_legacy = dn_oneline(&issuer);
        c.serial = serial_hex(cert.serial);
    }
    if let Some((start, end)) = validity(ee) {
        c.v_start = asn1_print(start);
        c.v_end = asn1_print(end);
        c.v_end_secs = end;
    }
    c.pem = pem(ee);
    let digest = ring::digest::digest(&ring::digest::SHA1_FOR_LEGACY_USE_ONLY, ee);
    c.fingerprint = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    c
}

/// A certificate's validity against `now` (unix seconds): `None` when within it (or when
/// the dates cannot be read: webpki judges those certificates), else OpenSSL's error.
fn date_error(cert: &[u8], now: u64) -> Option<(bool, u32, String)> {
    let (not_before, not_after) = validity(cert)?;
    if now < not_before {
        Some((false, 9, "certificate is not yet valid".to_string()))
    } else if now > not_after {
        Some((false, 10, "certificate has expired".to_string()))
    } else {
        None
    }
}

/// Unix seconds as OpenSSL's `ASN1_TIME_print` writes a time: `Nov  4 12:00:00 2026 GMT`.
fn asn1_print(t: u64) -> String {
    // Civil date from days (Howard Hinnant's civil_from_days).
    let z = t / 86_400 + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + u64::from(m <= 2);
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let secs = t % 86_400;
    format!(
        "{} {d:2} {:02}:{:02}:{:02} {y} GMT",
        MONTHS[(m - 1) as usize],
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}

/// A certificate in PEM, as OpenSSL writes it (64 base64 characters a line).
fn pem(der: &[u8]) -> String {
    let b64 = shard_http::base64_encode(der);
    let mut out = String::from("-----BEGIN CERTIFICATE-----\n");
    for line in b64.as_bytes().chunks(64) {
        out.push_str(std::str::from_utf8(line).unwrap_or_default());
        out.push('\n');
    }
    out.push_str("-----END CERTIFICATE-----\n");
    out
}

/// A distinguished name's content (the `SEQUENCE` of `SET`s, without its own tag) as
/// OpenSSL's `XN_FLAG_RFC2253` prints it, which nginx's `$ssl_client_s_dn` is: every
/// attribute in reverse order (so the most specific first), `,` between parts, `+` between
/// the attributes of one part, OpenSSL's short names, an attribute it has no name for as its
/// dotted OID and `#` with the value's DER in hex, special characters and bytes above ASCII
/// escaped.
fn dn_rfc2253(name: &[u8]) -> String {
    let mut attrs = dn_attrs(name);
    attrs.reverse();
    let mut out = String::new();
    for (i, (p, a)) in attrs.iter().enumerate() {
        if i > 0 {
            out.push(if attrs[i - 1].0 == *p { '+' } else { ',' });
        }
        out.push_str(&a.rfc2253);
    }
    out
}

/// A distinguished name as OpenSSL's `X509_NAME_oneline` prints it, which nginx's
/// `$ssl_client_s_dn_legacy` is: in DER order, each attribute after a `/`.
fn dn_oneline(name: &[u8]) -> String {
    dn_attrs(name)
        .iter()
        .map(|(_, a)| format!("/{}", a.oneline))
        .collect()
}

/// One attribute of a distinguished name, printed both ways.
struct DnAttr {
    rfc2253: String,
    oneline: String,
}

/// The attributes of a name in DER order, each with the number of its part (its `SET`).
fn dn_attrs(name: &[u8]) -> Vec<(usize, DnAttr)> {
    let mut attrs = Vec::new();
    let mut rest = name;
    let mut part = 0;
    while let Some((0x31, set, r)) = der(rest) {
        rest = r;
        let mut s = set;
        while let Some((0x30, atv, r2)) = der(s) {
            s = r2;
            let Some((0x06, oid, r3)) = der(atv) else {
                break;
            };
            let Some((tag, value, after)) = der(r3) else {
                break;
            };
            let (rfc2253, name) = match short_name(oid) {
                Some(n) => (format!("{n}={}", dn_value(tag, value)), n.to_string()),
                None => {
                    let tlv = &r3[..r3.len() - after.len()];
                    let hex: String = tlv.iter().map(|b| format!("{b:02X}")).collect();
                    (format!("{}=#{hex}", dotted(oid)), dotted(oid))
                }
            };
            let oneline = format!("{name}={}", oneline_value(value));
            attrs.push((part, DnAttr { rfc2253, oneline }));
        }
        part += 1;
    }
    attrs
}

/// A value as `X509_NAME_oneline` writes it: printable ASCII as it is, other bytes `\xHH`.
fn oneline_value(value: &[u8]) -> String {
    let mut out = String::with_capacity(value.len());
    for &b in value {
        match b {
            0x20..=0x7e => out.push(char::from(b)),
            _ => out.push_str(&format!("\\x{b:02X}")),
        }
    }
    out
}

/// OpenSSL's short name of an attribute type.
fn short_name(oid: &[u8]) -> Option<&'static str> {
    const MS_JURISDICTION: [u8; 10] = [0x2b, 0x06, 0x01, 0x04, 0x01, 0x82, 0x37, 0x3c, 0x02, 0x01];
    Some(match oid {
        [0x55, 0x04, x] => match x {
            0x03 => "CN",
            0x04 => "SN",
            0x05 => "serialNumber",
            0x06 => "C",
            0x07 => "L",
            0x08 => "ST",
            0x09 => "street",
            0x0a => "O",
            0x0b => "OU",
            0x0c => "title",
            0x0d => "description",
            0x0f => "businessCategory",
            0x11 => "postalCode",
            0x2a => "GN",
            0x2b => "initials",
            0x2c => "generationQualifier",
            0x2e => "dnQualifier",
            0x41 => "pseudonym",
            0x61 => "organizationIdentifier",
            _ => return None,
        },
        [0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x09, 0x01] => "emailAddress",
        [0x09, 0x92, 0x26, 0x89, 0x93, 0xf2, 0x2c, 0x64, 0x01, 0x19] => "DC",
        [0x09, 0x92, 0x26, 0x89, 0x93, 0xf2, 0x2c, 0x64, 0x01, 0x01] => "UID",
        [head @ .., last] if head == MS_JURISDICTION => match last {
            1 => "jurisdictionL",
            2 => "jurisdictionST",
            3 => "jurisdictionC",
            _ => return None,
        },
        _ => return None,
    })
}

/// An OID in dotted decimal.
fn dotted(oid: &[u8]) -> String {
    let mut parts = Vec::new();
    if let Some((&first, rest)) = oid.split_first() {
        parts.push(u64::from(first / 40));
        parts.push(u64::from(first % 40));
        let mut v = 0u64;
        for &b in rest {
            v = v << 7 | u64::from(b & 0x7f);
            if b & 0x80 == 0 {
                parts.push(v);
                v = 0;
            }
        }
    }
    let dotted: Vec<String> = parts.iter().map(u64::to_string).collect();
    dotted.join(".")
}

/// An attribute value, RFC 2253-escaped; BMP and universal strings are decoded, other string
/// types are taken as bytes, anything else is `#` and its hex.
fn dn_value(tag: u8, value: &[u8]) -> String {
    let decoded = |chars: &mut dyn Iterator<Item = Option<char>>| -> Vec<u8> {
        chars
            .map(|c| c.unwrap_or(char::REPLACEMENT_CHARACTER))
            .collect::<String>()
            .into_bytes()
    };
    let bytes: Vec<u8> = match tag {
        0x1e => decoded(
            &mut char::decode_utf16(
                value
                    .chunks_exact(2)
                    .map(|p| u16::from_be_bytes([p[0], p[1]])),
            )
            .map(Result::ok),
        ),
        0x1c => decoded(
            &mut value
                .chunks_exact(4)
                .map(|p| char::from_u32(u32::from_be_bytes([p[0], p[1], p[2], p[3]]))),
        ),
        0x0c | 0x13 | 0x14 | 0x16 => value.to_vec(),
        _ => {
            return std::iter::once("#".to_string())
                .chain(value.iter().map(|b| format!("{b:02X}")))
                .collect();
        }
    };
    let mut out = String::with_capacity(bytes.len());
    let last = bytes.len().saturating_sub(1);
    for (i, &b) in bytes.iter().enumerate() {
        match b {
            b',' | b'+' | b'"' | b'\\' | b'<' | b'>' | b';' => {
                out.push('\\');
                out.push(char::from(b));
            }
            b'#' if i == 0 => out.push_str("\\#"),
            b' ' if i == 0 || i == last => out.push_str("\\ "),
            0x20..=0x7e => out.push(char::from(b)),
            _ => out.push_str(&format!("\\{b:02X}")),
        }
    }
    out
}

/// A serial number as OpenSSL prints it: uppercase hex, without DER's sign byte.
fn serial_hex(serial: &[u8]) -> String {
    let s = match serial {
        [0, rest @ ..] if !rest.is_empty() => rest,
        s => s,
    };
    s.iter().map(|b| format!("{b:02X}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::x509::asn1_time;

    #[test]
    fn times_and_certificates_print_as_openssl() {
        assert_eq!(asn1_print(0), "Jan  1 00:00:00 1970 GMT");
        assert_eq!(asn1_print(1_795_521_600), "Nov 24 12:00:00 2026 GMT");
        assert_eq!(asn1_print(951_782_400), "Feb 29 00:00:00 2000 GMT");
        assert_eq!(
            pem(b"any carnal pleas"),
            "-----BEGIN CERTIFICATE-----\nYW55IGNhcm5hbCBwbGVhcw==\n-----END CERTIFICATE-----\n"
        );
        assert_eq!(
            pem(&[0u8; 48]).lines().nth(1).map(str::len),
            Some(64),
            "64 characters a line"
        );
    }

    #[test]
    fn asn1_times_are_unix_seconds() {
        assert_eq!(asn1_time(0x17, b"700101000000Z"), Some(0));
        assert_eq!(asn1_time(0x17, b"491231235959Z"), Some(2_524_607_999));
        assert_eq!(asn1_time(0x18, b"20261124120000Z"), Some(1_795_521_600));
        assert_eq!(asn1_time(0x18, b"20261124120000+0100"), None);
        assert_eq!(asn1_time(0x17, b"2611241200Z"), None);
    }

    #[test]
    fn distinguished_names_print_as_openssl_rfc2253() {
        // SEQUENCE content: SET{SEQ{C, "US"}}, SET{SEQ{O, "A, B"}}, SET{SEQ{CN, " x#"}}.
        let atv = |oid: &[u8], tag: u8, v: &[u8]| {
            let mut seq = vec![0x06, oid.len() as u8];
            seq.extend_from_slice(oid);
            seq.extend_from_slice(&[tag, v.len() as u8]);
            seq.extend_from_slice(v);
            let mut set = vec![0x30, seq.len() as u8];
            set.extend_from_slice(&seq);
            let mut out = vec![0x31, set.len() as u8];
            out.extend_from_slice(&set);
            out
        };
        let mut name = atv(&[0x55, 4, 6], 0x13, b"US");
        name.extend(atv(&[0x55, 4, 10], 0x0c, b"A, B"));
        name.extend(atv(&[0x55, 4, 3], 0x0c, " x#\u{e9}".as_bytes()));
        name.extend(atv(&[0x2b, 6, 1, 4, 1, 0x82, 0x37], 0x0c, b"v"));
        assert_eq!(
            dn_rfc2253(&name),
            "1.3.6.1.4.1.311=#0C0176,CN=\\ x#\\C3\\A9,O=A\\, B,C=US"
        );
        // A part with two attributes (SN, GN): reversed inside the part too, joined by `+`.
        let mut set = Vec::new();
        for (oid, v) in [([0x55u8, 4, 4], &b"Doe"[..]), ([0x55, 4, 42], &b"Jo"[..])] {
            let mut seq = vec![0x06, 3];
            seq.extend_from_slice(&oid);
            seq.extend_from_slice(&[0x0c, v.len() as u8]);
            seq.extend_from_slice(v);
            set.extend_from_slice(&[0x30, seq.len() as u8]);
            set.extend_from_slice(&seq);
        }
        let mut name = atv(&[0x55, 4, 6], 0x13, b"US");
        name.extend_from_slice(&[0x31, set.len() as u8]);
        name.extend_from_slice(&set);
        assert_eq!(dn_rfc2253(&name), "GN=Jo+SN=Doe,C=US");
        assert_eq!(dn_oneline(&name), "/C=US/SN=Doe/GN=Jo");
        assert_eq!(serial_hex(&[0x00, 0x9a, 0x01]), "9A01");
        assert_eq!(serial_hex(&[0x05]), "05");
    }
}
