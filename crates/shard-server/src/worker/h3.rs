//! HTTP/3 over QUIC (`listen ... quic`), on `quinn-proto` (QUIC without I/O) and shard's own
//! HTTP/3 frames and QPACK (`shard_http::h3`).
//!
//! Each `quic` socket the worker reads has an *endpoint* (`Worker::quic`): it cuts datagrams
//! into connections, answers version negotiation, refuses or retries new clients
//! (`quic_retry`). Each QUIC connection (`Worker::h3`) is driven from here: datagrams in,
//! timers, then its events, then its datagrams out, in rounds until nothing moves. Each
//! request stream is carried as HTTP/2's streams are (`h2.rs`): a *stream connection* in
//! `Worker::conns` with no socket, whose input is the HTTP/1.1 head its HEADERS say (and its
//! DATA, framed as the head says) and whose output is parsed back into HEADERS and DATA
//! frames ([`Worker::h3_send`]). So every phase, the proxy, static files, error pages and the
//! access log run per stream exactly as for HTTP/1.1 and HTTP/2.
//!
//! This module owns the endpoints, the QUIC connections, the control streams both ways and
//! the translation of request streams; it does not own the phases, the sockets' creation (the
//! master's `listen.rs`), or closing stream connections (the loop's `close`).
//!
//! Bounds: a datagram is at most [`DATAGRAM_MAX`] bytes; a readiness report reads at most
//! [`READ_BATCH`] datagrams; QUIC connections per worker are at most `worker_connections`
//! (new ones are refused beyond); a field section at most [`FIELD_SECTION_MAX`]; a request
//! stream's input waiting for its connection at most [`STREAM_INPUT_MAX`] (then the stream
//! is not read, and QUIC flow control holds the client); a stream's framed output not yet
//! taken by QUIC at most one DATA frame of [`DATA_FRAME_MAX`], and what QUIC holds of a
//! connection's responses until the client acknowledges them [`SEND_WINDOW`].
//!
//! What is not here yet (issue 36): steering by connection ID (the kernel's 4-tuple hash
//! places datagrams, so a client that changes address mid-connection reaches another worker),
//! 0-RTT, and a reload or binary upgrade that keeps every QUIC connection (see
//! docs/directives.md, `listen ... quic`).

use std::cmp::Reverse;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use quinn_proto as qp;
use shard_http::body::ChunkedDecoder;
use shard_http::h3::{self, code, frame, stream_type};

use super::conn::Conn;
use super::h2::{response_block, trailer_fields, FieldEncoder, Framing, Out, H2_STREAM};
use super::Worker;

/// `Conn::h2` of an HTTP/3 stream connection: set with `H2_STREAM` (every rule about a
/// socketless stream connection holds), the index being into `Worker::h3`.
pub(super) const H3_STREAM: u32 = 1 << 29;
const INDEX_MASK: u32 = H3_STREAM - 1;

/// Largest datagram read (the UDP payload limit).
const DATAGRAM_MAX: usize = 65_535;
/// Datagrams read from one socket per readiness report.
const READ_BATCH: usize = 64;
/// The largest field section a request's HEADERS may decode to (names, values, 32 bytes
/// each), announced in SETTINGS_MAX_FIELD_SECTION_SIZE.
const FIELD_SECTION_MAX: usize = 64 * 1024;
/// A stream's request body bytes waiting in its connection's input before the stream is
/// no longer read (QUIC's flow control then holds the client).
const STREAM_INPUT_MAX: usize = 64 * 1024;
/// The largest DATA frame written at once.
const DATA_FRAME_MAX: usize = 16 * 1024;
/// A response head longer than this fails its stream.
const RESPONSE_HEAD_MAX: usize = 64 * 1024;
/// The most bytes of a response's trailers sent.
const TRAILERS_MAX: usize = 64 * 1024;
/// Unidirectional streams a client may open (control, QPACK encoder and decoder, and a few
/// it may grease with).
const UNI_STREAMS_MAX: u32 = 8;
/// Bytes of a client's control stream or QPACK streams kept undecoded.
const UNI_INPUT_MAX: usize = 16 * 1024;
/// Response bytes a QUIC connection holds for its client before they are acknowledged
/// (quinn's send window; its default is 10 MB): what one slow client can make a worker keep,
/// and 20 MB/s at a 100 ms round trip.
const SEND_WINDOW: u64 = 2 << 20;
/// Datagrams one `sendmsg` carries with `quic_gso on` (the kernel takes up to 64).
const GSO_DATAGRAMS: usize = 16;
/// Rounds of events and streams one drive of a connection makes before it yields.
const ROUNDS_MAX: usize = 16;

/// One `quic` socket of this worker and its QUIC endpoint.
pub(super) struct Endpoint {
    fd: RawFd,
    /// Index into `Config::listeners`.
    conf_idx: usize,
    ep: qp::Endpoint,
    retry: bool,
    /// `quic_gso on`, while the kernel takes `UDP_SEGMENT` (a refusal turns it off).
    gso: bool,
    /// Connections by quinn's handle: their keys in `Worker::h3`.
    by_handle: HashMap<qp::ConnectionHandle, usize>,
}

/// One request stream.
struct Stream {
    /// The stream connection, once its HEADERS came (`None` before, and after it closed
    /// while its last bytes wait for QUIC).
    key: Option<usize>,
    /// Bytes read and not yet cut into frames.
    input: Vec<u8>,
    /// What is left of the DATA frame being read.
    data_left: u64,
    /// The client's FIN came (and everything before it was read).
    recv_done: bool,
    /// The client's HEADERS came.
    headers_seen: bool,
    /// The end of the body was given to the stream connection.
    body_ended: bool,
    /// Its HEADERS came in 0-RTT data, before the handshake completed (`$ssl_early_data`).
    early: bool,
    chunked_in: bool,
    head_only: bool,
    out: Out,
    /// Framed output QUIC has not taken yet (at most one frame), then the FIN.
    pending: Vec<u8>,
    pending_fin: bool,
    /// The stream connection's last write was refused: it waits for `Writable`.
    blocked: bool,
    /// FIN or RESET sent: nothing more goes out.
    sent_end: bool,
    /// RESET sent, or the FIN and all before it acknowledged (`Finished`): once its
    /// connection closed too, the stream is forgotten (until then QUIC may still need to
    /// send what it was given, and the connection must not close).
    over: bool,
}

impl Stream {
    fn new() -> Stream {
        Stream {
            key: None,
            input: Vec::new(),
            data_left: 0,
            recv_done: false,
            headers_seen: false,
            body_ended: false,
            early: false,
            chunked_in: false,
            head_only: false,
            out: Out::Head(Vec::new()),
            pending: Vec::new(),
            pending_fin: false,
            blocked: false,
            sent_end: false,
            over: false,
        }
    }
}

/// A unidirectional stream the client opened.
struct Uni {
    /// Its type, once read.
    kind: Option<u64>,
    input: Vec<u8>,
    /// The control stream's SETTINGS came.
    settings: bool,
}

/// One QUIC connection carrying HTTP/3.
pub(super) struct H3Conn {
    ep: usize,
    handle: qp::ConnectionHandle,
    conn: qp::Connection,
    /// shard's connection number (`$connection`) and id.
    pub(super) id: u64,
    number: u64,
    /// The listener index (`Config::listeners`).
    listener: usize,
    peer: SocketAddr,
    /// Our control stream, and what of its bytes QUIC has not taken.
    control: Option<qp::StreamId>,
    control_out: Vec<u8>,
    streams: HashMap<qp::StreamId, Stream>,
    by_key: HashMap<usize, qp::StreamId>,
    uni: HashMap<qp::StreamId, Uni>,
    /// Stream connections to drive in this round.
    ready: Vec<usize>,
    in_drive: bool,
    /// GOAWAY sent: no new requests; those taken finish, then the connection closes.
    going_away: bool,
    /// Not closed before this, once gone away: the client has two round trips to read our
    /// GOAWAY before a request it sends meanwhile would cross our close.
    close_after: Option<Instant>,
    /// The next request stream id not yet taken (GOAWAY names it).
    next_bidi: u64,
    /// The timer queued for this connection (ms, 0: none).
    timer_ms: u64,
    /// The handshake's results, for `$ssl_server_name` and `$ssl_alpn_protocol`.
    pub(super) server_name: String,
    pub(super) alpn: String,
    /// `keepalive_requests` of the default server: requests taken before GOAWAY.
    taken: u64,
    keepalive_requests: u64,
    /// `ssl_early_data` of the default server: 0-RTT requests are possible.
    early_data: bool,
}

fn tag(idx: usize) -> u32 {
    H2_STREAM | H3_STREAM | (idx as u32 + 1)
}

/// The connection index in a stream connection's `Conn::h2`.
pub(super) fn conn_of(h2: u32) -> Option<usize> {
    let i = h2 & INDEX_MASK;
    (h2 & H3_STREAM != 0 && i != 0).then(|| (i - 1) as usize)
}

fn varint(v: u64) -> qp::VarInt {
    qp::VarInt::from_u64(v.min(h3::VARINT_MAX)).unwrap_or(qp::VarInt::MAX)
}

/// The QUIC configuration of a `quic` listener: its TLS context (the address's servers'
/// certificates, chosen by SNI) with ALPN `h3`, and the transport settings of its default
/// server.
/// `host_key` is `quic_host_key`'s contents, read once for this and [`endpoint_config`].
pub(super) fn server_config(
    tls: &rustls::ServerConfig,
    h3c: &shard_config::Http3Conf,
    host_key: Option<&[u8]>,
    idle_ms: u64,
) -> Result<qp::ServerConfig, String> {
    let mut t = tls.clone();
    t.alpn_protocols = vec![b"h3".to_vec()];
    // `ssl_early_data`: 0-RTT (quinn takes 0 or all). rustls allows early data only on
    // stateful resumption, whose cache takes each session once (a replayed first flight finds
    // it gone): tickets here name a cached session instead of carrying it. The context's
    // cache is `ssl_session_cache`'s (shared by the workers with `shared:`, which a resumed
    // client needs, since its new connection may reach any worker); without one, each worker
    // keeps its own.
    if h3c.early_data {
        t.max_early_data_size = u32::MAX;
        t.ticketer = Arc::new(NoTickets);
        if !t.session_storage.can_cache() {
            t.session_storage = rustls::server::ServerSessionMemoryCache::new(4096);
        }
        t.send_tls13_tickets = t.send_tls13_tickets.max(1);
    } else {
        t.max_early_data_size = 0;
    }
    let crypto = qp::crypto::rustls::QuicServerConfig::try_from(t)
        .map_err(|e| format!("QUIC needs TLSv1.3 with TLS_AES_128_GCM_SHA256 ({e})"))?;
    let mut transport = qp::TransportConfig::default();
    transport
        .max_concurrent_bidi_streams(varint(u64::from(h3c.max_concurrent_streams)))
        .max_concurrent_uni_streams(varint(u64::from(UNI_STREAMS_MAX)))
        .stream_receive_window(varint(h3c.stream_buffer_size as u64))
        .receive_window(varint(
            (h3c.stream_buffer_size as u64).saturating_mul(u64::from(h3c.max_concurrent_streams)),
        ))
        .max_idle_timeout(
            qp::IdleTimeout::try_from(Duration::from_millis(idle_ms.clamp(1000, 600_000))).ok(),
        )
        .enable_segmentation_offload(h3c.gso)
        .send_window(SEND_WINDOW);
    let mut sc = match host_key {
        Some(key) => {
            let salt = ring::hkdf::Salt::new(ring::hkdf::HKDF_SHA256, b"shard quic token");
            qp::ServerConfig::new(Arc::new(crypto), Arc::new(salt.extract(key)))
        }
        None => qp::ServerConfig::with_crypto(Arc::new(crypto)),
    };
    sc.transport_config(Arc::new(transport))
        .max_incoming(1024)
        .incoming_buffer_size(64 * 1024)
        .incoming_buffer_size_total(4 << 20);
    Ok(sc)
}

/// Tickets that carry no session: resumption goes through the session cache.
#[derive(Debug)]
struct NoTickets;

impl rustls::server::ProducesTickets for NoTickets {
    fn enabled(&self) -> bool {
        false
    }

    fn lifetime(&self) -> u32 {
        0
    }

    fn encrypt(&self, _: &[u8]) -> Option<Vec<u8>> {
        None
    }

    fn decrypt(&self, _: &[u8]) -> Option<Vec<u8>> {
        None
    }
}

/// Connection IDs that carry the socket's key in the steering plane (`listen::QuicPlane`)
/// in their first two bytes, so that the group's program sends every datagram of the
/// connection to this worker's socket whatever the client's address; the rest is a keyed
/// hash of a counter (unpredictable, never repeated).
struct KeyedCids {
    key: u16,
    hasher: std::collections::hash_map::RandomState,
    n: u64,
}

impl qp::ConnectionIdGenerator for KeyedCids {
    fn generate_cid(&mut self) -> qp::ConnectionId {
        use std::hash::BuildHasher;
        self.n += 1;
        let r = self.hasher.hash_one(self.n).to_be_bytes();
        let mut b = [0u8; shard_event::bpf::QUIC_CID_LEN];
        b[..2].copy_from_slice(&self.key.to_be_bytes());
        b[2..].copy_from_slice(&r[..shard_event::bpf::QUIC_CID_LEN - 2]);
        qp::ConnectionId::new(&b)
    }

    fn cid_len(&self) -> usize {
        shard_event::bpf::QUIC_CID_LEN
    }

    fn cid_lifetime(&self) -> Option<Duration> {
        None
    }
}

/// The secret stateless reset tokens are made from without `quic_host_key`: drawn once in
/// the master (`master::run` calls this before it forks), so that every worker of every
/// generation makes the same token for a connection ID: a worker that gets a datagram of a
/// connection another one held (a worker that died) can end it at once.
pub(crate) fn quic_reset_secret() -> &'static [u8; 32] {
    static SECRET: std::sync::OnceLock<[u8; 32]> = std::sync::OnceLock::new();
    SECRET.get_or_init(|| {
        let mut k = [0u8; 32];
        for c in k.chunks_mut(8) {
            c.copy_from_slice(&shard_event::process::random_u64().to_ne_bytes());
        }
        k
    })
}

/// The endpoint configuration: stateless reset tokens from `quic_host_key` when given (so
/// they outlive a restart), else from the master's secret; connection IDs that carry `key`
/// where the group is steered.
pub(super) fn endpoint_config(host_key: Option<&[u8]>, key: Option<u32>) -> qp::EndpointConfig {
    let secret = host_key.unwrap_or(quic_reset_secret());
    let hmac = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret);
    let mut ec = qp::EndpointConfig::new(Arc::new(hmac));
    if let Some(k) = key {
        ec.cid_generator(move || {
            Box::new(KeyedCids {
                key: k as u16,
                hasher: std::collections::hash_map::RandomState::new(),
                n: 0,
            })
        });
    }
    ec
}

impl Endpoint {
    pub(super) fn new(
        fd: RawFd,
        conf_idx: usize,
        sc: qp::ServerConfig,
        ec: qp::EndpointConfig,
        retry: bool,
        gso: bool,
    ) -> Endpoint {
        Endpoint {
            fd,
            conf_idx,
            ep: qp::Endpoint::new(Arc::new(ec), Some(Arc::new(sc)), false, None),
            retry,
            gso,
            by_handle: HashMap::new(),
        }
    }
}

/// How a datagram reached this worker's socket.
#[derive(Debug, PartialEq, Eq)]
enum Placed {
    /// Its connection ID carries this socket's key (short header, Handshake packet).
    ByCid,
    /// Its connection ID is the client's own (Initial, 0-RTT): the hash of its addresses.
    ByHash,
    /// Anything else (another key: a stray; garbage; an unsteered group).
    Other,
}

fn placement(d: &[u8], key: Option<u32>) -> Placed {
    let Some(&first) = d.first() else {
        return Placed::Other;
    };
    let keyed = |at: usize| {
        let k = d
            .get(at..at + 2)
            .map(|b| u32::from(u16::from_be_bytes([b[0], b[1]])));
        if key.is_some() && k == key {
            Placed::ByCid
        } else {
            Placed::Other
        }
    };
    if first & 0x80 == 0 {
        return keyed(1);
    }
    match (first & 0x30) >> 4 {
        0 | 1 => Placed::ByHash,
        2 if d.get(5).is_some_and(|&l| l >= 2) => keyed(6),
        _ => Placed::Other,
    }
}

/// Sends one datagram; a full socket buffer drops it (QUIC's loss recovery sends again).
fn send_datagram(fd: RawFd, buf: &[u8], to: &SocketAddr) {
    if let Err(e) = shard_event::sock::send_to(fd, buf, to) {
        if e.kind() != std::io::ErrorKind::WouldBlock {
            crate::log!(
                Info,
                "sendto() failed ({}) while sending to QUIC client {to}",
                shard_event::os_error_text(&e)
            );
        }
    }
}

impl Stream {
    /// Hands `pending` to QUIC; `Err` when the client stopped the stream.
    fn flush(&mut self, conn: &mut qp::Connection, id: qp::StreamId) -> Result<(), ()> {
        let mut s = conn.send_stream(id);
        while !self.pending.is_empty() {
            match s.write(&self.pending) {
                Ok(n) => {
                    self.pending.drain(..n);
                }
                Err(qp::WriteError::Blocked) => return Ok(()),
                Err(_) => return Err(()),
            }
        }
        if self.pending_fin && !self.sent_end {
            self.sent_end = true;
            let _ = s.finish();
        }
        Ok(())
    }

    /// The response head is whole: HEADERS, and the body's framing.
    fn begin(&mut self, head: &[u8]) -> std::io::Result<()> {
        let mut block = Vec::with_capacity(256);
        h3::Encoder.start(&mut block);
        let Some(Framing {
            status,
            length,
            chunked,
        }) = response_block(head, &h3::Encoder, &mut block)?
        else {
            self.out = Out::Head(Vec::new());
            return Ok(());
        };
        h3::push_frame_head(&mut self.pending, frame::HEADERS, block.len());
        self.pending.extend_from_slice(&block);
        let no_body = self.head_only || status == 204 || status == 304;
        let end_now = no_body || length == Some(0);
        self.out = if end_now {
            self.pending_fin = true;
            Out::Done
        } else if chunked {
            let mut dec = ChunkedDecoder::new();
            dec.keep_trailers(TRAILERS_MAX);
            Out::Chunked(dec)
        } else if let Some(n) = length {
            Out::Length(n)
        } else {
            Out::UntilClose
        };
        Ok(())
    }

    /// Takes HTTP/1.1 response bytes: `Ok(n)` taken, `WouldBlock` while QUIC holds the last
    /// frame.
    fn send(
        &mut self,
        conn: &mut qp::Connection,
        id: qp::StreamId,
        buf: &[u8],
    ) -> std::io::Result<usize> {
        use std::io::{Error, ErrorKind};
        let gone = || Error::from(ErrorKind::BrokenPipe);
        if self.sent_end && !matches!(self.out, Out::Done) {
            return Err(gone());
        }
        self.flush(conn, id).map_err(|()| gone())?;
        if !self.pending.is_empty() {
            self.blocked = true;
            return Err(ErrorKind::WouldBlock.into());
        }
        let used = match &mut self.out {
            Out::Head(acc) => {
                let before = acc.len();
                let take = buf
                    .len()
                    .min(RESPONSE_HEAD_MAX + 4 - before.min(RESPONSE_HEAD_MAX));
                acc.extend_from_slice(&buf[..take]);
                let Some(end) = memchr::memmem::find(acc, b"\r\n\r\n") else {
                    if acc.len() > RESPONSE_HEAD_MAX {
                        return Err(Error::new(ErrorKind::InvalidData, "response head too long"));
                    }
                    return Ok(take);
                };
                let head_len = end + 4;
                let head = std::mem::take(acc);
                self.begin(&head[..head_len])?;
                head_len - before
            }
            Out::Done => buf.len(),
            Out::Length(left) => {
                let n = (DATA_FRAME_MAX as u64).min(*left).min(buf.len() as u64) as usize;
                *left -= n as u64;
                let end = *left == 0;
                push_data(&mut self.pending, &buf[..n]);
                if end {
                    self.pending_fin = true;
                    self.out = Out::Done;
                }
                n
            }
            Out::Chunked(dec) => {
                let mut data = Vec::new();
                let f = dec
                    .feed_into(&buf[..DATA_FRAME_MAX.min(buf.len())], &mut data)
                    .map_err(|_| Error::new(ErrorKind::InvalidData, "bad chunks"))?;
                let done = dec.is_done();
                let trailers = done.then(|| trailer_block(dec.trailers_kept()));
                if !data.is_empty() {
                    push_data(&mut self.pending, &data);
                }
                if let Some(Some(t)) = trailers {
                    h3::push_frame_head(&mut self.pending, frame::HEADERS, t.len());
                    self.pending.extend_from_slice(&t);
                }
                if done {
                    self.pending_fin = true;
                    self.out = Out::Done;
                }
                f.consumed
            }
            Out::UntilClose => {
                let n = DATA_FRAME_MAX.min(buf.len());
                push_data(&mut self.pending, &buf[..n]);
                n
            }
        };
        self.flush(conn, id).map_err(|()| gone())?;
        Ok(used)
    }
}

fn push_data(out: &mut Vec<u8>, data: &[u8]) {
    h3::push_frame_head(out, frame::DATA, data.len());
    out.extend_from_slice(data);
}

impl FieldEncoder for h3::Encoder {
    fn status(&self, code: u16, out: &mut Vec<u8>) {
        h3::Encoder::status(self, code, out);
    }

    fn field(&self, name: &[u8], value: &[u8], out: &mut Vec<u8>) {
        h3::Encoder::field(self, name, value, out);
    }
}

/// The QPACK field section of a chunked response's trailer lines, `None` when empty.
fn trailer_block(lines: &[u8]) -> Option<Vec<u8>> {
    let mut block = Vec::new();
    h3::Encoder.start(&mut block);
    trailer_fields(lines, &h3::Encoder, &mut block).then_some(block)
}

/// What a request stream's frames asked for.
enum Cut {
    /// Nothing more can be cut until more bytes come.
    More,
    /// A whole HEADERS frame (the request's).
    Headers(Vec<u8>),
    /// The connection fails with this code.
    Fail(u64),
}

impl Worker<'_> {
    /// The worker's `quic` sockets get their endpoints (in `Worker::new`, before the
    /// sandbox: the endpoints' keys come from the system's random source).
    pub(super) fn quic_setup(&mut self) {
        let cfg = self.cx.cfg;
        let Some(http) = cfg.http.as_ref() else {
            return;
        };
        for li in 0..self.listeners.len() {
            let conf_idx = self.listeners[li].conf_idx;
            let l = &cfg.listeners[conf_idx];
            if !l.opts.quic {
                continue;
            }
            let srv = &http.servers[l.default_server];
            let Some(tls) = self.tls.get(conf_idx) else {
                continue;
            };
            let host_key = match srv.http3.host_key.as_ref().map(std::fs::read).transpose() {
                Ok(k) => k,
                Err(e) => {
                    let path = srv.http3.host_key.as_ref().map(|p| p.display().to_string());
                    crate::log!(
                        Emerg,
                        "failed to read QUIC host key \"{}\" ({e}) for {}",
                        path.unwrap_or_default(),
                        l.addr
                    );
                    continue;
                }
            };
            let host_key = host_key.as_deref();
            let sc = match server_config(tls, &srv.http3, host_key, srv.base.keepalive_timeout_ms) {
                Ok(sc) => sc,
                Err(e) => {
                    crate::log!(Emerg, "{e} for {}", l.addr);
                    continue;
                }
            };
            let ec = endpoint_config(host_key, self.listeners[li].quic_key);
            let fd = self.listeners[li].fd;
            let ep = Endpoint::new(fd, conf_idx, sc, ec, srv.http3.retry, srv.http3.gso);
            if self.quic.len() <= li {
                self.quic.resize_with(li + 1, || None);
            }
            self.quic[li] = Some(ep);
        }
    }

    /// Datagrams on `quic` socket `li`.
    pub(super) fn quic_readable(&mut self, li: usize) {
        let Some(fd) = self.quic.get(li).and_then(|e| e.as_ref()).map(|e| e.fd) else {
            return;
        };
        let mut buf = std::mem::take(&mut self.h3_buf);
        buf.resize(DATAGRAM_MAX, 0);
        let mut touched: Vec<usize> = Vec::new();
        for _ in 0..READ_BATCH {
            let (n, from) = match shard_event::sock::recv_from(fd, &mut buf) {
                Ok((n, Some(from))) => (n, from),
                Ok((_, None)) => continue,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => break,
            };
            let slot = self.cx.slot;
            crate::shm::WorkerSlot::bump(&slot.quic_datagrams, 1);
            match placement(&buf[..n], self.listeners[li].quic_key) {
                Placed::ByCid => crate::shm::WorkerSlot::bump(&slot.quic_by_cid, 1),
                Placed::ByHash => crate::shm::WorkerSlot::bump(&slot.quic_by_hash, 1),
                Placed::Other => {}
            }
            if let Some(k) = self.quic_datagram(li, from, &buf[..n]) {
                if !touched.contains(&k) {
                    touched.push(k);
                }
            }
        }
        self.h3_buf = buf;
        for k in touched {
            self.h3_drive(k);
        }
    }

    /// One datagram from `from`: the connection it moved, if any.
    fn quic_datagram(&mut self, li: usize, from: SocketAddr, data: &[u8]) -> Option<usize> {
        let now = Instant::now();
        let mut out = Vec::new();
        let steered = self.listeners[li].quic_key.is_some();
        let ep = self.quic[li].as_mut()?;
        // A short header names a connection: one this worker does not hold is a stray.
        let short = data.first().is_some_and(|b| b & 0x80 == 0);
        let Some(event) = ep.ep.handle(now, from, None, None, data.into(), &mut out) else {
            if short {
                crate::shm::WorkerSlot::bump(&self.cx.slot.quic_strays, 1);
            }
            return None;
        };
        match event {
            qp::DatagramEvent::ConnectionEvent(h, ev) => {
                let k = *ep.by_handle.get(&h)?;
                self.h3.get_mut(k)?.conn.handle_event(ev);
                Some(k)
            }
            qp::DatagramEvent::Response(t) => {
                // Version negotiation, or a stateless reset. A reset goes out only where the
                // group is steered by connection ID: there a stray's connection is gone (its
                // worker died); without steering it may live in another process reading the
                // same socket (a worker of the previous generation), which a reset would end.
                if short {
                    crate::shm::WorkerSlot::bump(&self.cx.slot.quic_strays, 1);
                    if steered {
                        send_datagram(ep.fd, &out[..t.size], &t.destination);
                    }
                } else {
                    send_datagram(ep.fd, &out[..t.size], &t.destination);
                }
                None
            }
            qp::DatagramEvent::NewConnection(incoming) => {
                if self.shutting_down {
                    // Left for the next generation's worker, which reads the same socket.
                    ep.ep.ignore(incoming);
                    return None;
                }
                if self.h3.len() >= self.conns_max {
                    let t = ep.ep.refuse(incoming, &mut out);
                    send_datagram(ep.fd, &out[..t.size], &t.destination);
                    return None;
                }
                if ep.retry && !incoming.remote_address_validated() && incoming.may_retry() {
                    if let Ok(t) = ep.ep.retry(incoming, &mut out) {
                        send_datagram(ep.fd, &out[..t.size], &t.destination);
                        crate::shm::WorkerSlot::bump(&self.cx.slot.quic_retries, 1);
                    }
                    return None;
                }
                let (handle, conn) = match ep.ep.accept(incoming, now, &mut out, None) {
                    Ok(x) => x,
                    Err(e) => {
                        if let Some(t) = e.response {
                            send_datagram(ep.fd, &out[..t.size], &t.destination);
                        }
                        return None;
                    }
                };
                let conf_idx = ep.conf_idx;
                let id = self.next_conn_id;
                self.next_conn_id += 1;
                let number = self
                    .region
                    .connections
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
                    + 1;
                let (keepalive_requests, early_data) = self
                    .cx
                    .cfg
                    .http
                    .as_ref()
                    .map(|h| {
                        let l = &self.cx.cfg.listeners[conf_idx];
                        let srv = &h.servers[l.default_server];
                        (srv.base.keepalive_requests, srv.http3.early_data)
                    })
                    .unwrap_or((1000, false));
                let k = self.h3.insert(H3Conn {
                    ep: li,
                    handle,
                    conn,
                    id,
                    number,
                    listener: conf_idx,
                    peer: from,
                    control: None,
                    control_out: Vec::new(),
                    streams: HashMap::new(),
                    by_key: HashMap::new(),
                    uni: HashMap::new(),
                    ready: Vec::new(),
                    in_drive: false,
                    going_away: false,
                    close_after: None,
                    next_bidi: 0,
                    timer_ms: 0,
                    server_name: String::new(),
                    alpn: String::new(),
                    taken: 0,
                    keepalive_requests,
                    early_data,
                });
                if let Some(ep) = self.quic[li].as_mut() {
                    ep.by_handle.insert(handle, k);
                }
                crate::shm::WorkerSlot::bump(&self.cx.slot.quic_connections, 1);
                Some(k)
            }
        }
    }

    /// Moves connection `k` until nothing moves: QUIC's events to the endpoint and back,
    /// the application's events, the streams, then datagrams out and the timer.
    pub(super) fn h3_drive(&mut self, k: usize) {
        let Some(c) = self.h3.get_mut(k) else {
            return;
        };
        if c.in_drive {
            return;
        }
        c.in_drive = true;
        for _ in 0..ROUNDS_MAX {
            self.h3_endpoint_events(k);
            self.h3_events(k);
            let ready = std::mem::take(&mut self.h3[k].ready);
            for sk in &ready {
                self.drive(*sk);
            }
            self.h3_flush_streams(k);
            let moved = self.h3_transmit(k);
            if ready.is_empty() && self.h3[k].ready.is_empty() && !moved {
                break;
            }
        }
        let c = &mut self.h3[k];
        c.in_drive = false;
        // A connection told to go away closes once its requests are answered (and the
        // client had time to read the GOAWAY).
        if c.going_away
            && !c.conn.is_closed()
            && c.streams.is_empty()
            && c.close_after.is_none_or(|t| Instant::now() >= t)
        {
            c.conn
                .close(Instant::now(), varint(code::NO_ERROR), bytes::Bytes::new());
            self.h3_endpoint_events(k);
            self.h3_transmit(k);
        }
        if self.h3[k].conn.is_drained() {
            self.h3_remove(k);
            return;
        }
        self.h3_set_timer(k);
    }

    fn h3_endpoint_events(&mut self, k: usize) {
        let c = &mut self.h3[k];
        let Some(ep) = self.quic.get_mut(c.ep).and_then(|e| e.as_mut()) else {
            return;
        };
        while let Some(ev) = c.conn.poll_endpoint_events() {
            if let Some(back) = ep.ep.handle_event(c.handle, ev) {
                c.conn.handle_event(back);
            }
        }
    }

    /// Writes the connection's datagrams; whether any left.
    fn h3_transmit(&mut self, k: usize) -> bool {
        let c = &mut self.h3[k];
        let Some(ep) = self.quic.get_mut(c.ep).and_then(|e| e.as_mut()) else {
            return false;
        };
        let fd = ep.fd;
        let now = Instant::now();
        let mut buf = std::mem::take(&mut self.h3_buf);
        let mut any = false;
        loop {
            buf.clear();
            // `quic_gso`: up to GSO_DATAGRAMS datagrams of equal size in one buffer, cut by
            // the kernel.
            let max = if ep.gso { GSO_DATAGRAMS } else { 1 };
            let Some(t) = c.conn.poll_transmit(now, max, &mut buf) else {
                break;
            };
            any = true;
            let data = &buf[..t.size];
            match t.segment_size.filter(|&s| s < t.size) {
                Some(seg) => {
                    match shard_event::sock::send_to_segmented(fd, data, &t.destination, seg as u16)
                    {
                        Ok(_) => {}
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                        Err(e) => {
                            // No segmentation offload here: one by one from now on.
                            crate::log!(
                                Notice,
                                "UDP_SEGMENT refused ({}): quic_gso off for this socket",
                                shard_event::os_error_text(&e)
                            );
                            ep.gso = false;
                            for d in data.chunks(seg) {
                                send_datagram(fd, d, &t.destination);
                            }
                        }
                    }
                }
                None => send_datagram(fd, data, &t.destination),
            }
        }
        self.h3_buf = buf;
        any
    }

    fn h3_set_timer(&mut self, k: usize) {
        let c = &mut self.h3[k];
        // A gone-away connection with nothing left closes at `close_after`.
        let close = c
            .close_after
            .filter(|_| c.going_away && c.streams.is_empty() && !c.conn.is_closed());
        let Some(at) = [c.conn.poll_timeout(), close].into_iter().flatten().min() else {
            c.timer_ms = 0;
            return;
        };
        let wait = at.saturating_duration_since(Instant::now());
        let ms = self.cx.now_ms
            + wait.as_millis() as u64
            + u64::from(wait.subsec_nanos() % 1_000_000 != 0);
        if c.timer_ms != ms {
            c.timer_ms = ms;
            self.h3_timers.push(Reverse((ms, k, c.id)));
        }
    }

    /// The earliest QUIC timer.
    pub(super) fn next_h3_deadline(&self) -> Option<u64> {
        self.h3_timers.peek().map(|Reverse((ms, _, _))| *ms)
    }

    /// Runs the QUIC timers that are due.
    pub(super) fn expire_h3_timers(&mut self) {
        let now = self.cx.now_ms;
        while let Some(&Reverse((ms, k, id))) = self.h3_timers.peek() {
            if ms > now {
                break;
            }
            self.h3_timers.pop();
            let Some(c) = self
                .h3
                .get_mut(k)
                .filter(|c| c.id == id && c.timer_ms == ms)
            else {
                continue;
            };
            c.timer_ms = 0;
            c.conn.handle_timeout(Instant::now());
            self.h3_drive(k);
        }
    }

    /// The application's events of connection `k`.
    fn h3_events(&mut self, k: usize) {
        while let Some(ev) = self.h3[k].conn.poll() {
            match ev {
                qp::Event::HandshakeDataReady => {
                    let c = &mut self.h3[k];
                    if let Some(hd) = c
                        .conn
                        .crypto_session()
                        .handshake_data()
                        .and_then(|d| d.downcast::<qp::crypto::rustls::HandshakeData>().ok())
                    {
                        c.server_name = hd.server_name.unwrap_or_default();
                        c.alpn = hd
                            .protocol
                            .map(|p| String::from_utf8_lossy(&p).into_owned())
                            .unwrap_or_default();
                    }
                }
                qp::Event::Connected => self.h3_open_control(k),
                qp::Event::ConnectionLost { reason } => {
                    let number = self.h3[k].number;
                    let outer = crate::log::set_connection(number);
                    crate::log!(
                        Info,
                        "quic connection closed ({reason}), client: {}",
                        self.h3[k].peer
                    );
                    crate::log::set_connection(outer);
                    self.h3_close_streams(k);
                }
                qp::Event::Stream(se) => match se {
                    qp::StreamEvent::Opened { dir } => self.h3_accept_streams(k, dir),
                    qp::StreamEvent::Readable { id } => self.h3_read(k, id),
                    qp::StreamEvent::Writable { id } => self.h3_writable(k, id),
                    qp::StreamEvent::Stopped { id, .. } => self.h3_stopped(k, id),
                    qp::StreamEvent::Finished { id } => {
                        let c = &mut self.h3[k];
                        if let Some(st) = c.streams.get_mut(&id) {
                            st.over = true;
                            if st.key.is_none() {
                                c.streams.remove(&id);
                            }
                        }
                    }
                    qp::StreamEvent::Available { .. } => {}
                },
                qp::Event::DatagramReceived | qp::Event::DatagramsUnblocked => {}
            }
        }
    }

    /// Opens our control stream with our SETTINGS.
    fn h3_open_control(&mut self, k: usize) {
        let c = &mut self.h3[k];
        if c.control.is_some() {
            return;
        }
        let Some(id) = c.conn.streams().open(qp::Dir::Uni) else {
            return;
        };
        c.control = Some(id);
        c.control_out = h3::control_stream_start(FIELD_SECTION_MAX as u64);
        if c.going_away {
            c.control_out.extend_from_slice(&h3::goaway(c.next_bidi));
        }
        h3_flush_control(c);
    }

    fn h3_accept_streams(&mut self, k: usize, dir: qp::Dir) {
        loop {
            let c = &mut self.h3[k];
            let Some(id) = c.conn.streams().accept(dir) else {
                return;
            };
            match dir {
                qp::Dir::Bi => {
                    c.next_bidi = id.index() * 4 + 4;
                    if c.going_away {
                        // After GOAWAY: refused, so the client may send it again elsewhere.
                        let _ = c.conn.recv_stream(id).stop(varint(code::REQUEST_REJECTED));
                        let _ = c.conn.send_stream(id).reset(varint(code::REQUEST_REJECTED));
                        continue;
                    }
                    c.streams.insert(id, Stream::new());
                }
                qp::Dir::Uni => {
                    c.uni.insert(
                        id,
                        Uni {
                            kind: None,
                            input: Vec::new(),
                            settings: false,
                        },
                    );
                }
            }
            self.h3_read(k, id);
        }
    }

    /// Reads what stream `id` has, within its bounds.
    fn h3_read(&mut self, k: usize, id: qp::StreamId) {
        let c = &mut self.h3[k];
        if c.uni.contains_key(&id) {
            self.h3_read_uni(k, id);
            return;
        }
        let Some(st) = c.streams.get_mut(&id) else {
            return;
        };
        if st.recv_done {
            return;
        }
        let waiting = st
            .key
            .and_then(|sk| self.conns.get(sk))
            .map_or(0, |c| c.inbuf.len());
        let room = (STREAM_INPUT_MAX + FIELD_SECTION_MAX).saturating_sub(st.input.len() + waiting);
        if room == 0 {
            return;
        }
        let mut rs = c.conn.recv_stream(id);
        let Ok(mut chunks) = rs.read(true) else {
            return;
        };
        let mut reset = false;
        let mut left = room;
        while left > 0 {
            match chunks.next(left) {
                Ok(Some(ch)) => {
                    left = left.saturating_sub(ch.bytes.len());
                    st.input.extend_from_slice(&ch.bytes);
                }
                Ok(None) => {
                    st.recv_done = true;
                    break;
                }
                Err(qp::ReadError::Blocked) => break,
                Err(qp::ReadError::Reset(_)) => {
                    reset = true;
                    break;
                }
            }
        }
        let _ = chunks.finalize();
        if reset {
            self.h3_drop_stream(k, id);
            return;
        }
        self.h3_cut(k, id);
    }

    /// Cuts request stream `id`'s input into frames: its HEADERS make its stream
    /// connection, its DATA go to that connection's input.
    fn h3_cut(&mut self, k: usize, id: qp::StreamId) {
        loop {
            let c = &mut self.h3[k];
            let Some(st) = c.streams.get_mut(&id) else {
                return;
            };
            let cut = cut_request(st);
            match cut {
                Cut::More => break,
                Cut::Fail(code) => {
                    self.h3_fail(k, code);
                    return;
                }
                Cut::Headers(block) => {
                    let Some(st) = self.h3[k].streams.get_mut(&id) else {
                        return;
                    };
                    if st.headers_seen {
                        // Trailers: taken (decoded for their validity) and dropped.
                        if h3::decode(&block, FIELD_SECTION_MAX).is_err() {
                            self.h3_fail(k, code::QPACK_DECOMPRESSION_FAILED);
                            return;
                        }
                        continue;
                    }
                    st.headers_seen = true;
                    let fields = match h3::decode(&block, FIELD_SECTION_MAX) {
                        Ok(f) => f,
                        Err(h3::QpackError::Decompression) => {
                            self.h3_fail(k, code::QPACK_DECOMPRESSION_FAILED);
                            return;
                        }
                        Err(h3::QpackError::TooLarge) => {
                            self.h3_reset(k, id, code::EXCESSIVE_LOAD);
                            return;
                        }
                    };
                    let pairs: Vec<(&[u8], &[u8])> = fields.iter().collect();
                    // With no body: the FIN came right after the HEADERS.
                    let end = st.recv_done && st.input.is_empty();
                    let mut chunked = false;
                    let Some(head) = super::h2::request_head(&pairs, end, &mut chunked) else {
                        self.h3_reset(k, id, code::MESSAGE_ERROR);
                        return;
                    };
                    let head_only = pairs.iter().any(|&(n, v)| n == b":method" && v == b"HEAD");
                    st.chunked_in = chunked;
                    st.head_only = head_only;
                    self.h3_stream(k, id, head);
                }
            }
        }
        // DATA waiting for the connection, and the end of the body.
        self.h3_feed(k, id);
    }

    /// Moves DATA bytes of stream `id` into its connection's input (chunked when its head
    /// says so), and the body's end once the FIN came.
    fn h3_feed(&mut self, k: usize, id: qp::StreamId) {
        let c = &mut self.h3[k];
        let Some(st) = c.streams.get_mut(&id) else {
            return;
        };
        let Some(sk) = st.key else {
            return;
        };
        let Some(conn) = self.conns.get_mut(sk) else {
            return;
        };
        let mut moved = false;
        // Frames after the HEADERS: DATA are streamed; others are skipped whole.
        loop {
            if st.data_left > 0 {
                let n = (st.data_left as usize).min(st.input.len());
                if n == 0 {
                    break;
                }
                if st.chunked_in {
                    conn.inbuf
                        .extend_from_slice(format!("{n:x}\r\n").as_bytes());
                    conn.inbuf.extend_from_slice(&st.input[..n]);
                    conn.inbuf.extend_from_slice(b"\r\n");
                } else {
                    conn.inbuf.extend_from_slice(&st.input[..n]);
                }
                st.input.drain(..n);
                st.data_left -= n as u64;
                moved = true;
                continue;
            }
            let Some(h) = h3::frame_head(&st.input) else {
                break;
            };
            match h.ty {
                frame::DATA => {
                    st.input.drain(..h.head_len);
                    st.data_left = h.len;
                }
                frame::HEADERS => {
                    // Trailers: dropped whole (shard passes none upstream).
                    let whole = h.head_len as u64 + h.len;
                    if (st.input.len() as u64) < whole {
                        break;
                    }
                    st.input.drain(..whole as usize);
                }
                _ => {
                    let whole = h.head_len as u64 + h.len;
                    if (st.input.len() as u64) < whole {
                        break;
                    }
                    st.input.drain(..whole as usize);
                }
            }
        }
        if st.recv_done && st.input.is_empty() && st.data_left == 0 && !st.body_ended {
            st.body_ended = true;
            if st.chunked_in {
                conn.inbuf.extend_from_slice(b"0\r\n\r\n");
                moved = true;
            }
        }
        if moved {
            c.ready.push(sk);
        }
    }

    /// A new request: its stream connection, with the HTTP/1.1 head as its input.
    fn h3_stream(&mut self, k: usize, id: qp::StreamId, head: Vec<u8>) {
        let c = &self.h3[k];
        let (peer, listener, number) = (c.peer, c.listener, c.number);
        let conn_id = self.next_conn_id;
        self.next_conn_id += 1;
        let mut sc = Conn::new_stream(Some(peer), listener, conn_id, number, self.cx.now_ms);
        sc.h2 = tag(k);
        sc.requests = self.h3[k].taken + 1;
        let sk = self.conns.insert(sc);
        self.start_reading(sk, true);
        self.conns[sk].inbuf = head;
        let c = &mut self.h3[k];
        // As nginx's `$ssl_early_data`: early data in use and the handshake not complete.
        let early = c.early_data && c.conn.is_handshaking();
        if early {
            crate::shm::WorkerSlot::bump(&self.cx.slot.quic_0rtt, 1);
        }
        if let Some(st) = c.streams.get_mut(&id) {
            st.key = Some(sk);
            st.early = early;
        }
        c.by_key.insert(sk, id);
        c.ready.push(sk);
        c.taken += 1;
        if c.taken >= c.keepalive_requests {
            self.h3_go_away_conn(k);
        }
    }

    /// QUIC took what it was given on stream `id`: its connection writes again.
    fn h3_writable(&mut self, k: usize, id: qp::StreamId) {
        let c = &mut self.h3[k];
        let Some(st) = c.streams.get_mut(&id) else {
            if c.control == Some(id) {
                h3_flush_control(c);
            }
            return;
        };
        if st.flush(&mut c.conn, id).is_err() {
            self.h3_drop_stream(k, id);
            return;
        }
        if st.blocked && st.pending.is_empty() {
            st.blocked = false;
            if let Some(sk) = st.key {
                if let Some(sc) = self.conns.get_mut(sk) {
                    sc.writable = true;
                }
                c.ready.push(sk);
            }
        }
        if st.key.is_none() && st.over {
            c.streams.remove(&id);
        }
    }

    fn h3_flush_streams(&mut self, k: usize) {
        let c = &mut self.h3[k];
        h3_flush_control(c);
        let mut gone = Vec::new();
        for (&id, st) in c.streams.iter_mut() {
            if st.pending.is_empty() && (st.sent_end || !st.pending_fin) {
                // Streams whose connection waits for room to read again.
                continue;
            }
            if st.flush(&mut c.conn, id).is_err() {
                gone.push(id);
            }
        }
        for id in gone {
            self.h3_drop_stream(k, id);
        }
        // Streams whose connection took its input read more.
        let ids: Vec<qp::StreamId> = self.h3[k]
            .streams
            .iter()
            .filter(|(_, s)| !s.recv_done && s.key.is_some())
            .map(|(&id, _)| id)
            .collect();
        for id in ids {
            self.h3_read(k, id);
        }
    }

    /// The client stopped stream `id` (it wants no more of the response).
    fn h3_stopped(&mut self, k: usize, id: qp::StreamId) {
        let c = &mut self.h3[k];
        if c.control == Some(id) {
            self.h3_fail(k, code::CLOSED_CRITICAL_STREAM);
            return;
        }
        if let Some(st) = c.streams.get_mut(&id) {
            st.sent_end = true;
            st.pending.clear();
            let _ = c
                .conn
                .send_stream(id)
                .reset(varint(code::REQUEST_CANCELLED));
        }
        self.h3_drop_stream(k, id);
    }

    /// Ends stream `id` with `code` both ways; its connection closes.
    fn h3_reset(&mut self, k: usize, id: qp::StreamId, code: u64) {
        let c = &mut self.h3[k];
        if let Some(st) = c.streams.get_mut(&id) {
            st.sent_end = true;
            st.pending.clear();
        }
        let _ = c.conn.send_stream(id).reset(varint(code));
        let _ = c.conn.recv_stream(id).stop(varint(code));
        self.h3_drop_stream(k, id);
    }

    /// Forgets stream `id`; its connection, if any, closes now.
    fn h3_drop_stream(&mut self, k: usize, id: qp::StreamId) {
        let c = &mut self.h3[k];
        let Some(st) = c.streams.remove(&id) else {
            return;
        };
        if let Some(sk) = st.key {
            c.by_key.remove(&sk);
            self.close(sk);
        }
    }

    /// Fails the connection with an HTTP/3 error code.
    fn h3_fail(&mut self, k: usize, code: u64) {
        let c = &mut self.h3[k];
        let number = c.number;
        let outer = crate::log::set_connection(number);
        crate::log!(
            Info,
            "client sent an invalid HTTP/3 stream (error 0x{code:x}), client: {}",
            c.peer
        );
        crate::log::set_connection(outer);
        c.conn
            .close(Instant::now(), varint(code), bytes::Bytes::new());
        self.h3_close_streams(k);
    }

    fn h3_close_streams(&mut self, k: usize) {
        let c = &mut self.h3[k];
        let keys: Vec<usize> = c.by_key.keys().copied().collect();
        c.by_key.clear();
        c.streams.clear();
        for sk in keys {
            self.close(sk);
        }
    }

    /// A client's unidirectional stream: its type, then (control) SETTINGS and GOAWAY; the
    /// QPACK streams carry nothing shard needs with no dynamic table and are drained.
    fn h3_read_uni(&mut self, k: usize, id: qp::StreamId) {
        let c = &mut self.h3[k];
        let Some(u) = c.uni.get_mut(&id) else {
            return;
        };
        let mut rs = c.conn.recv_stream(id);
        let Ok(mut chunks) = rs.read(true) else {
            return;
        };
        let mut closed = false;
        loop {
            match chunks.next(UNI_INPUT_MAX) {
                Ok(Some(ch)) => {
                    if u.kind.is_none() || u.kind == Some(stream_type::CONTROL) {
                        u.input.extend_from_slice(&ch.bytes);
                    }
                    if u.input.len() > UNI_INPUT_MAX {
                        break;
                    }
                }
                Ok(None) | Err(qp::ReadError::Reset(_)) => {
                    closed = true;
                    break;
                }
                Err(qp::ReadError::Blocked) => break,
            }
        }
        let _ = chunks.finalize();
        if u.kind.is_none() {
            let Some((kind, n)) = h3::read_varint(&u.input) else {
                return;
            };
            u.input.drain(..n);
            match kind {
                stream_type::CONTROL | stream_type::QPACK_ENCODER | stream_type::QPACK_DECODER => {
                    if c.uni.values().any(|o| o.kind == Some(kind)) {
                        self.h3_fail(k, code::STREAM_CREATION_ERROR);
                        return;
                    }
                    let u = c.uni.get_mut(&id).expect("present");
                    u.kind = Some(kind);
                    if kind != stream_type::CONTROL {
                        u.input.clear();
                    }
                }
                stream_type::PUSH => {
                    // Only a server pushes.
                    self.h3_fail(k, code::STREAM_CREATION_ERROR);
                    return;
                }
                _ => {
                    // Unknown (or grease): not read.
                    let _ = c
                        .conn
                        .recv_stream(id)
                        .stop(varint(code::STREAM_CREATION_ERROR));
                    c.uni.remove(&id);
                    return;
                }
            }
        }
        let c = &mut self.h3[k];
        let u = c.uni.get_mut(&id).expect("present");
        if u.kind == Some(stream_type::CONTROL) {
            if closed {
                self.h3_fail(k, code::CLOSED_CRITICAL_STREAM);
                return;
            }
            loop {
                let u = self.h3[k].uni.get_mut(&id).expect("present");
                let Some(h) = h3::frame_head(&u.input) else {
                    break;
                };
                let whole = h.head_len as u64 + h.len;
                if whole > UNI_INPUT_MAX as u64 {
                    self.h3_fail(k, code::EXCESSIVE_LOAD);
                    return;
                }
                if (u.input.len() as u64) < whole {
                    break;
                }
                let payload: Vec<u8> = u.input[h.head_len..whole as usize].to_vec();
                u.input.drain(..whole as usize);
                let first = !u.settings;
                u.settings = true;
                let err = match h.ty {
                    frame::SETTINGS if first => h3::parse_settings(&payload).err(),
                    _ if first => Some(code::MISSING_SETTINGS),
                    frame::SETTINGS | frame::DATA | frame::HEADERS | frame::PUSH_PROMISE => {
                        Some(code::FRAME_UNEXPECTED)
                    }
                    t if frame::reserved_h2(t) => Some(code::FRAME_UNEXPECTED),
                    frame::GOAWAY => {
                        // The client goes: nothing new will come; answer what came.
                        self.h3[k].going_away = true;
                        None
                    }
                    _ => None,
                };
                if let Some(code) = err {
                    self.h3_fail(k, code);
                    return;
                }
            }
        } else if closed {
            // A QPACK stream closed is a critical stream closed.
            self.h3_fail(k, code::CLOSED_CRITICAL_STREAM);
        }
    }

    /// Sends GOAWAY on connection `k`: it takes no new requests, and closes once those it
    /// has are answered.
    fn h3_go_away_conn(&mut self, k: usize) {
        let c = &mut self.h3[k];
        if c.going_away {
            return;
        }
        c.going_away = true;
        let grace = (c.conn.rtt() * 2).max(Duration::from_millis(50));
        c.close_after = Some(Instant::now() + grace);
        if c.control.is_some() {
            c.control_out.extend_from_slice(&h3::goaway(c.next_bidi));
            h3_flush_control(c);
        }
    }

    /// Every QUIC connection goes away gracefully (a stopping worker).
    pub(super) fn h3_go_away_all(&mut self) {
        let keys: Vec<usize> = self.h3.iter().map(|(k, _)| k).collect();
        for k in keys {
            self.h3_go_away_conn(k);
            self.h3_drive(k);
        }
    }

    fn h3_remove(&mut self, k: usize) {
        self.h3_close_streams(k);
        let c = self.h3.remove(k);
        if let Some(ep) = self.quic.get_mut(c.ep).and_then(|e| e.as_mut()) {
            ep.by_handle.remove(&c.handle);
        }
        crate::shm::WorkerSlot::drop_one(&self.cx.slot.quic_connections);
    }

    /// `send` of an HTTP/3 stream connection: its response bytes into frames.
    pub(super) fn h3_send(
        conns: &mut slab::Slab<H3Conn>,
        h2: u32,
        key: usize,
        buf: &[u8],
    ) -> std::io::Result<usize> {
        let gone = || std::io::Error::from(std::io::ErrorKind::BrokenPipe);
        let c = conn_of(h2)
            .and_then(|i| conns.get_mut(i))
            .ok_or_else(gone)?;
        let id = *c.by_key.get(&key).ok_or_else(gone)?;
        let st = c.streams.get_mut(&id).ok_or_else(gone)?;
        st.send(&mut c.conn, id, buf)
    }

    /// An HTTP/3 stream connection closes: its response ends, whole (FIN) or cut (reset).
    pub(super) fn h3_stream_closed(&mut self, h2: u32, key: usize) {
        let Some(k) = conn_of(h2).filter(|&k| self.h3.contains(k)) else {
            return;
        };
        let c = &mut self.h3[k];
        let Some(id) = c.by_key.remove(&key) else {
            return;
        };
        let Some(st) = c.streams.get_mut(&id) else {
            return;
        };
        st.key = None;
        match st.out {
            Out::Done => {}
            Out::UntilClose => st.pending_fin = true,
            _ => {
                st.sent_end = true;
                st.over = true;
                st.pending.clear();
                let _ = c.conn.send_stream(id).reset(varint(code::INTERNAL_ERROR));
            }
        }
        if !st.recv_done {
            // Answered before the client finished its body: it may stop.
            let _ = c.conn.recv_stream(id).stop(varint(code::NO_ERROR));
        }
        if st.flush(&mut c.conn, id).is_err() {
            st.over = true;
        }
        if st.over {
            c.streams.remove(&id);
        }
        self.h3_stream_moved(h2);
    }

    /// A stream connection ran outside its connection's drive: its connection sends.
    pub(super) fn h3_stream_moved(&mut self, h2: u32) {
        if let Some(k) = conn_of(h2).filter(|&k| self.h3.contains(k)) {
            if !self.h3[k].in_drive {
                self.h3_drive(k);
            }
        }
    }

    /// `$ssl_*` of an HTTP/3 stream: TLS 1.3, its connection's name and ALPN, and whether
    /// the request came in 0-RTT data.
    pub(super) fn h3_tls(&self, key: usize) -> Option<(&str, &str, bool)> {
        let c = self.conns.get(key)?;
        let k = conn_of(c.h2)?;
        let q = self.h3.get(k)?;
        let early = q
            .by_key
            .get(&key)
            .and_then(|id| q.streams.get(id))
            .is_some_and(|s| s.early);
        Some((q.server_name.as_str(), q.alpn.as_str(), early))
    }

    /// Closes every QUIC connection at once (a fast stop, or a stop whose time is up).
    pub(super) fn h3_close_all(&mut self) {
        let keys: Vec<usize> = self.h3.iter().map(|(k, _)| k).collect();
        for k in keys {
            self.h3[k]
                .conn
                .close(Instant::now(), varint(code::NO_ERROR), bytes::Bytes::new());
            self.h3_endpoint_events(k);
            self.h3_transmit(k);
            self.h3_remove(k);
        }
    }
}

fn h3_flush_control(c: &mut H3Conn) {
    let Some(id) = c.control else {
        return;
    };
    while !c.control_out.is_empty() {
        match c.conn.send_stream(id).write(&c.control_out) {
            Ok(n) => {
                c.control_out.drain(..n);
            }
            Err(_) => return,
        }
    }
}

/// The next thing stream `st`'s input holds before its body: its HEADERS whole, or a frame
/// the request stream may not carry.
fn cut_request(st: &mut Stream) -> Cut {
    loop {
        if st.headers_seen && st.data_left > 0 {
            return Cut::More;
        }
        let Some(h) = h3::frame_head(&st.input) else {
            if st.recv_done && !st.input.is_empty() {
                return Cut::Fail(code::FRAME_ERROR);
            }
            return Cut::More;
        };
        match h.ty {
            frame::HEADERS => {
                if h.len > FIELD_SECTION_MAX as u64 * 2 {
                    return Cut::Fail(code::EXCESSIVE_LOAD);
                }
                let whole = h.head_len + h.len as usize;
                if st.input.len() < whole {
                    if st.recv_done {
                        return Cut::Fail(code::FRAME_ERROR);
                    }
                    return Cut::More;
                }
                let block = st.input[h.head_len..whole].to_vec();
                st.input.drain(..whole);
                return Cut::Headers(block);
            }
            frame::DATA if !st.headers_seen => return Cut::Fail(code::FRAME_UNEXPECTED),
            frame::DATA => return Cut::More,
            frame::SETTINGS
            | frame::GOAWAY
            | frame::MAX_PUSH_ID
            | frame::CANCEL_PUSH
            | frame::PUSH_PROMISE => return Cut::Fail(code::FRAME_UNEXPECTED),
            t if frame::reserved_h2(t) => return Cut::Fail(code::FRAME_UNEXPECTED),
            _ => {
                // Unknown frame types are skipped (RFC 9114, 9).
                let whole = h.head_len as u64 + h.len;
                if (st.input.len() as u64) < whole {
                    return Cut::More;
                }
                st.input.drain(..whole as usize);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{placement, Placed};

    #[test]
    fn datagrams_are_told_by_the_key_their_connection_id_carries() {
        // A short header with key 0x0102 after the first byte.
        let short = [0x41u8, 0x01, 0x02, 9, 9, 9, 9, 9, 9];
        assert_eq!(placement(&short, Some(0x0102)), Placed::ByCid);
        assert_eq!(placement(&short, Some(0x0103)), Placed::Other);
        assert_eq!(placement(&short, None), Placed::Other);
        // Long headers: Initial and 0-RTT are the client's IDs; Handshake carries ours at
        // offset 6 behind its length.
        let long = |ty: u8| {
            [
                0xc0 | (ty << 4),
                0,
                0,
                0,
                1,
                8,
                0x01,
                0x02,
                7,
                7,
                7,
                7,
                7,
                7,
            ]
        };
        assert_eq!(placement(&long(0), Some(0x0102)), Placed::ByHash);
        assert_eq!(placement(&long(1), Some(0x0102)), Placed::ByHash);
        assert_eq!(placement(&long(2), Some(0x0102)), Placed::ByCid);
        assert_eq!(placement(&long(3), Some(0x0102)), Placed::Other);
        assert_eq!(placement(&[], Some(1)), Placed::Other);
        assert_eq!(placement(&[0x40], Some(1)), Placed::Other);
    }
}
