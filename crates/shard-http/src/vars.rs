//! nginx's variables: the value of a [`Var`] for one request, and templates (literal text and
//! variables, [`Part`]) written out with them.
//!
//! This module owns what a variable means; the caller owns what it knows about the request
//! (the [`Ctx`] it fills: the parsed request, its raw header lines, addresses, times, the
//! response once there is one). Values are appended as bytes, unescaped: escaping belongs to
//! the consumer (the access log escapes, a `Location` header drops CR and LF). The one
//! filesystem call is `$realpath_root`'s `realpath`.

use std::io::Write;
use std::net::SocketAddr;

use shard_config::{LocationConf, MapConf, Part, ProxyPass, Var};

use crate::request::{Body, Request, MAX_HEADERS};
use crate::response::push_u64;

/// One peer a proxied request went to, for `$upstream_*`.
#[derive(Debug, Clone, Default)]
pub struct UpstreamTry {
    pub addr: String,
    /// `None` while no status was read (nginx logs `502` for a failed peer it gave up on, and
    /// `-` for a time not measured).
    pub status: Option<u16>,
    pub connect_ms: Option<u64>,
    pub header_ms: Option<u64>,
    pub response_ms: Option<u64>,
    /// Body bytes received from this peer (`$upstream_response_length`): 0 for a failed try.
    pub response_length: u64,
    /// Bytes read from and written to this peer (`$upstream_bytes_received`,
    /// `$upstream_bytes_sent`).
    pub bytes_received: u64,
    pub bytes_sent: u64,
    /// The response's header lines as received (kept only where a variable reads them).
    pub headers: Vec<(String, Vec<u8>)>,
}

/// What is known of the response, for `$status`, `$body_bytes_sent` and the like.
#[derive(Debug, Clone, Copy, Default)]
pub struct Done<'a> {
    pub status: u16,
    pub body_bytes: u64,
    /// Head and body bytes.
    pub bytes: u64,
    pub content_type: Option<&'a str>,
    pub location: Option<&'a str>,
    pub upstream: &'a [UpstreamTry],
    /// The trailers made so far (`add_trailer`, in order): `$sent_trailer_NAME`.
    pub trailers: &'a [(String, Vec<u8>)],
    /// `$upstream_cache_status` ("" without a cache).
    pub cache_status: &'a str,
    /// The response head as written, where a log format asks for `$sent_http_NAME` (empty
    /// otherwise: `content_type` and `location` answer then).
    pub head: &'a [u8],
}

/// What the worker knows of the connection and the clock.
#[derive(Debug, Clone, Copy)]
pub struct Conn<'a> {
    /// The connection's serial number and how many requests it has carried (this one too).
    pub connection: u64,
    pub requests: u64,
    /// Milliseconds since the epoch, now and when the request began.
    pub now_ms: u64,
    pub started_ms: u64,
    /// When the connection was accepted, on the same clock (`$connection_time`).
    pub opened_ms: u64,
    /// The socket's peer, before `real_ip` replaced it (`$realip_remote_addr`,
    /// `$realip_remote_port`).
    pub peer: Option<SocketAddr>,
    /// `$limit_req_status`, `$limit_conn_status` ("" where no limit applied).
    pub limit_req_status: &'a str,
    pub limit_conn_status: &'a str,
    /// Unique per request: `$request_id` is its 32 hex digits.
    pub request_id: u128,
    /// `$hostname`: the caller reads it once (`gethostname`).
    pub hostname: &'a str,
    /// The connection is TLS: `$scheme`, `$https` and the `$ssl_*` values.
    pub tls: Option<Tls<'a>>,
    /// `$http2`: `h2` (TLS), `h2c` (plain) on an HTTP/2 stream, else empty.
    pub http2: &'a str,
    /// `$http3`: `h3` on an HTTP/3 stream, else empty.
    pub http3: &'a str,
    /// The PROXY protocol header the connection began with (`listen ... proxy_protocol`).
    pub proxy_protocol: Option<&'a crate::proxy_protocol::Header>,
    /// The peers an upstream request of this request tried before it went on to an
    /// `error_page` (`$upstream_status` there, as nginx keeps it): used when `Done` has none.
    pub upstream: &'a [UpstreamTry],
    /// `$request_body`: the body in memory, where the caller has it (the upstream request).
    pub request_body: &'a [u8],
    /// `$limit_rate`: bytes per second (0: unlimited).
    pub limit_rate: u64,
    /// stub_status's numbers, for `$connections_*`.
    pub status: Option<&'a dyn Connections>,
    /// `$request_body_file`: the body's file, where it is in one.
    pub request_body_file: Option<&'a dyn BodyFile>,
    /// `$pipe`: the request was in the input behind the one before it.
    pub pipelined: bool,
    /// `$slice_range`: the slice being asked for (empty without `slice`).
    pub slice_range: &'a str,
}

/// Where `$connections_active`, `_reading`, `_writing` and `_waiting` come from (the
/// server's shared counters).
pub trait Connections {
    /// Active, reading, writing, waiting: `stub_status`'s numbers.
    fn connections(&self) -> [u64; 4];
}

impl std::fmt::Debug for dyn Connections + '_ {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Connections({:?})", self.connections())
    }
}

/// A request body's temporary file, named when `$request_body_file` asks (see the server's
/// `body.rs`).
pub trait BodyFile: std::fmt::Debug {
    /// The file's name; empty when it cannot have one.
    fn name(&self) -> &str;
}

/// What a TLS connection negotiated.
#[derive(Debug, Clone, Copy, Default)]
pub struct Tls<'a> {
    pub protocol: &'a str,
    pub cipher: &'a str,
    pub server_name: &'a str,
    /// `$ssl_session_reused`: the handshake resumed a session.
    pub session_reused: bool,
    /// `$ssl_alpn_protocol`, `$ssl_curve`.
    pub alpn: &'a str,
    pub curve: &'a str,
    /// `$ssl_session_id` (hex), `$ssl_ciphers`, `$ssl_curves` (the client's offers).
    pub session_id: &'a str,
    pub ciphers: &'a str,
    pub curves: &'a str,
    /// `$ssl_early_data`: the request came in 0-RTT data, before the handshake completed.
    pub early_data: bool,
    /// The client certificate's variables (`ssl_verify_client`): `$ssl_client_verify`, ...
    pub client: ClientCert<'a>,
}

/// The `$ssl_client_*` variables; `verify` is `NONE` without a certificate, the rest empty.
#[derive(Debug, Clone, Copy, Default)]
pub struct ClientCert<'a> {
    pub verify: &'a str,
    pub s_dn: &'a str,
    pub i_dn: &'a str,
    pub serial: &'a str,
    pub fingerprint: &'a str,
    pub s_dn_legacy: &'a str,
    pub i_dn_legacy: &'a str,
    /// The certificate in PEM, `$ssl_client_raw_cert`.
    pub pem: &'a str,
    pub v_start: &'a str,
    pub v_end: &'a str,
    /// When it ends, unix seconds (`$ssl_client_v_remain`); 0 without a certificate.
    pub v_end_secs: u64,
}

/// The variables the configuration and the request's rewrite instructions made.
#[derive(Debug, Clone, Copy, Default)]
pub struct Scope<'a> {
    /// Regular-expression captures of the last match (`$0`..`$9`), as byte ranges of
    /// `capture_text`.
    pub captures: &'a [Option<(usize, usize)>],
    pub capture_text: &'a str,
    /// The names of those captures (`(?<lang>...)`), by index: variables too.
    pub capture_names: &'a [Option<String>],
    /// Variables `set` gave a value, by lowercase name.
    pub user: &'a [(String, Vec<u8>)],
    /// The `map` blocks.
    pub maps: &'a [MapConf],
}

/// Everything a variable's value may come from.
pub struct Ctx<'a> {
    pub req: &'a Request,
    /// The request's header lines (see [`request_headers`]).
    pub headers: &'a [httparse::Header<'a>],
    pub client: Option<SocketAddr>,
    pub server_addr: SocketAddr,
    /// The first `server_name` of the chosen server ("" when none).
    pub server_name: &'a str,
    pub location: &'a LocationConf,
    pub pass: Option<&'a ProxyPass>,
    pub conn: Conn<'a>,
    /// Captures, `set` values and maps.
    pub scope: Scope<'a>,
    /// Set once the response is known (the access log); `None` before.
    pub done: Option<Done<'a>>,
}

pub use httparse::Header;

/// Room for a request's header lines, for [`request_headers`].
pub fn header_storage<'b>() -> [Header<'b>; MAX_HEADERS] {
    [httparse::EMPTY_HEADER; MAX_HEADERS]
}

/// The header lines of `head` (request line through the empty line). The worker parsed this
/// very head with the same `httparse` call, so failure means an empty list.
pub fn request_headers<'b, 'h>(
    head: &'b [u8],
    storage: &'h mut [httparse::Header<'b>; MAX_HEADERS],
) -> &'h [httparse::Header<'b>] {
    request_headers_in(head, storage)
}

/// [`request_headers`] into storage of any size (at least the head's line count: a smaller
/// one gives an empty list).
pub fn request_headers_in<'b, 'h>(
    head: &'b [u8],
    storage: &'h mut [httparse::Header<'b>],
) -> &'h [httparse::Header<'b>] {
    // Empty lines before the request line are allowed (RFC 9112 2.2), as in `request::parse`.
    let start = head
        .iter()
        .position(|&b| b != b'\r' && b != b'\n')
        .unwrap_or(head.len());
    let Some(nl) = memchr::memchr(b'\n', &head[start..]) else {
        return &[];
    };
    match httparse::parse_headers(&head[start + nl + 1..], storage) {
        Ok(httparse::Status::Complete((_, hs))) => hs,
        _ => &[],
    }
}

/// Appends every value of the request header `name`, joined with `, ` (`; ` for `Cookie`,
/// as nginx joins cookies); true if there was one.
pub fn push_joined(out: &mut Vec<u8>, name: &str, hs: &[httparse::Header<'_>]) -> bool {
    push_joined_if(out, name, hs, |_| true)
}

/// [`push_joined`] over the headers whose names `kept` takes.
pub fn push_joined_if(
    out: &mut Vec<u8>,
    name: &str,
    hs: &[httparse::Header<'_>],
    kept: impl Fn(&str) -> bool,
) -> bool {
    let mut any = false;
    let sep: &[u8] = if name.eq_ignore_ascii_case("cookie") {
        b"; "
    } else {
        b", "
    };
    for h in hs
        .iter()
        .filter(|h| var_names_header(name, h.name) && kept(h.name))
    {
        if any {
            out.extend_from_slice(sep);
        }
        out.extend_from_slice(h.value);
        any = true;
    }
    any
}

/// Whether a `$http_NAME`-style variable (its name with `-` for `_`) stands for header
/// `header`: without case, and a header's `_` matches as its `-` does (nginx turns each `-`
/// of a header name into `_` and compares with the variable's name, so `X_Foo` and `X-Foo`
/// are both `$http_x_foo`).
pub fn var_names_header(name: &str, header: &str) -> bool {
    name.len() == header.len()
        && name.bytes().zip(header.bytes()).all(|(n, h)| {
            let h = if h == b'_' { b'-' } else { h };
            n.eq_ignore_ascii_case(&h)
        })
}

/// Appends `ms` as seconds with three decimals (`0.012`), nginx's time format.
pub fn push_secs(out: &mut Vec<u8>, ms: u64) {
    push_u64(out, ms / 1000);
    out.push(b'.');
    let frac = ms % 1000;
    out.push(b'0' + (frac / 100) as u8);
    out.push(b'0' + (frac / 10 % 10) as u8);
    out.push(b'0' + (frac % 10) as u8);
}

/// The value of `name` among `key=value` pairs separated by `sep` (arguments by `&`, cookies
/// by `;`), the first one; the name compares without case for arguments, as nginx.
/// The value of argument `name` in a query string (`$arg_NAME`: names compare without case,
/// and only `name=...` counts, as nginx's `ngx_http_arg`).
pub fn arg<'q>(query: &'q str, name: &str) -> Option<&'q str> {
    find_pair(query, '&', name, true)
}

fn find_pair<'s>(s: &'s str, sep: char, name: &str, ignore_case: bool) -> Option<&'s str> {
    s.split(sep).find_map(|kv| {
        let kv = kv.trim_start_matches(' ');
        let (k, v) = kv.split_once('=')?;
        let same = if ignore_case {
            k.eq_ignore_ascii_case(name)
        } else {
            k == name
        };
        same.then_some(v)
    })
}

/// Appends the value of `var`; a variable with no value appends nothing (the access log
/// writes such a value as `-`, see [`is_empty`]).
pub fn push(out: &mut Vec<u8>, var: &Var, c: &Ctx<'_>) {
    push_at(out, var, c, 0)
}

/// How deep a `map` value may refer to other maps.
const MAP_DEPTH_MAX: usize = 8;

fn push_at(out: &mut Vec<u8>, var: &Var, c: &Ctx<'_>, depth: usize) {
    let req = c.req;
    // `set $http_foo ...` (or `$arg_`, `$cookie_`): the value set, in a request that set it.
    if !c.scope.user.is_empty() {
        let prefixed = match var {
            Var::Http(n) => Some(("http_", n)),
            Var::Arg(n) => Some(("arg_", n)),
            Var::Cookie(n) => Some(("cookie_", n)),
            _ => None,
        };
        if let Some((p, n)) = prefixed {
            let set = c.scope.user.iter().find(|(k, _)| {
                k.len() == p.len() + n.len()
                    && k[..p.len()].eq_ignore_ascii_case(p)
                    && k[p.len()..]
                        .bytes()
                        .zip(n.bytes())
                        .all(|(a, b)| a.eq_ignore_ascii_case(&b) || (a == b'_' && b == b'-'))
            });
            if let Some((_, v)) = set {
                out.extend_from_slice(v);
                return;
            }
        }
    }
    match var {
        Var::Host => {
            let host = req.host.as_deref().unwrap_or(c.server_name);
            out.extend_from_slice(host.as_bytes());
        }
        // A client with no inet address came over a Unix-domain socket: nginx's `unix:`.
        Var::RemoteAddr => match c.client {
            Some(a) => {
                let _ = write!(out, "{}", a.ip());
            }
            None => out.extend_from_slice(b"unix:"),
        },
        Var::RealipRemoteAddr => match c.conn.peer {
            Some(a) => {
                let _ = write!(out, "{}", a.ip());
            }
            None => out.extend_from_slice(b"unix:"),
        },
        Var::ProxyProtocolAddr
        | Var::ProxyProtocolServerAddr
        | Var::ProxyProtocolPort
        | Var::ProxyProtocolServerPort
        | Var::ProxyProtocolTlv(_) => push_proxy_protocol(out, var, c.conn.proxy_protocol),
        Var::RealipRemotePort => {
            if let Some(a) = c.conn.peer {
                push_u64(out, u64::from(a.port()));
            }
        }
        Var::RemotePort => {
            if let Some(a) = c.client.filter(|a| a.port() != 0) {
                push_u64(out, u64::from(a.port()));
            }
        }
        Var::BinaryRemoteAddr => match c.client.map(|a| a.ip()) {
            Some(std::net::IpAddr::V4(v4)) => out.extend_from_slice(&v4.octets()),
            Some(std::net::IpAddr::V6(v6)) => match v6.to_ipv4_mapped() {
                Some(v4) => out.extend_from_slice(&v4.octets()),
                None => out.extend_from_slice(&v6.octets()),
            },
            None => {}
        },
        Var::RemoteUser => {
            // The user of `Authorization: Basic`, verified or not (as nginx).
            if let Some(h) = c
                .headers
                .iter()
                .find(|h| h.name.eq_ignore_ascii_case("authorization"))
            {
                let v = String::from_utf8_lossy(h.value);
                if let Some((scheme, rest)) = v.trim().split_once(' ') {
                    if scheme.eq_ignore_ascii_case("basic") {
                        if let Some(raw) = crate::base64_decode(rest.trim()) {
                            if let Some(i) = raw.iter().position(|&b| b == b':') {
                                out.extend_from_slice(&raw[..i]);
                            }
                        }
                    }
                }
            }
        }
        Var::Https => {
            if c.conn.tls.is_some() {
                out.extend_from_slice(b"on");
            }
        }
        // Listed (not `v if v.is_tls()`): this match names every variable.
        Var::SslProtocol
        | Var::SslCipher
        | Var::SslServerName
        | Var::SslClientVerify
        | Var::SslClientSDn
        | Var::SslClientIDn
        | Var::SslClientSerial
        | Var::SslClientFingerprint
        | Var::SslClientSDnLegacy
        | Var::SslClientIDnLegacy
        | Var::SslClientRawCert
        | Var::SslClientVStart
        | Var::SslClientVEnd
        | Var::SslAlpnProtocol
        | Var::SslCurve
        | Var::SslSessionId
        | Var::SslCiphers
        | Var::SslCurves
        | Var::SslClientCert
        | Var::SslClientEscapedCert
        | Var::SslClientVRemain
        | Var::SslSessionReused => push_tls(out, var, c.conn.tls.as_ref(), c.conn.now_ms),
        Var::SslEarlyData => {
            if c.conn.tls.as_ref().is_some_and(|t| t.early_data) {
                out.push(b'1');
            }
        }
        Var::ServerAddr if shard_config::is_unix_stand_in(&c.server_addr) => {
            out.extend_from_slice(b"unix:");
        }
        Var::ServerAddr => {
            let _ = write!(out, "{}", c.server_addr.ip());
        }
        Var::ServerPort if shard_config::is_unix_stand_in(&c.server_addr) => {}
        Var::ServerPort => push_u64(out, u64::from(c.server_addr.port())),
        Var::ServerName => out.extend_from_slice(c.server_name.as_bytes()),
        Var::ServerProtocol if req.http3 => out.extend_from_slice(b"HTTP/3.0"),
        Var::ServerProtocol if req.http2 => out.extend_from_slice(b"HTTP/2.0"),
        Var::ServerProtocol => {
            out.extend_from_slice(b"HTTP/1.");
            push_u64(out, u64::from(req.minor_version));
        }
        Var::Http2 => out.extend_from_slice(c.conn.http2.as_bytes()),
        Var::Http3 => out.extend_from_slice(c.conn.http3.as_bytes()),
        Var::Scheme => out.extend_from_slice(if c.conn.tls.is_some() {
            b"https"
        } else {
            b"http"
        }),
        Var::RequestUri => out.extend_from_slice(req.target.as_bytes()),
        Var::RequestBody => out.extend_from_slice(c.conn.request_body),
        Var::RequestBodyFile => {
            if let Some(f) = c.conn.request_body_file {
                out.extend_from_slice(f.name().as_bytes());
            }
        }
        Var::Pipe => out.push(if c.conn.pipelined { b'p' } else { b'.' }),
        Var::Uri => out.extend_from_slice(req.path.as_bytes()),
        Var::Args => out.extend_from_slice(req.query.as_deref().unwrap_or("").as_bytes()),
        Var::IsArgs => {
            if req.query.as_deref().is_some_and(|q| !q.is_empty()) {
                out.push(b'?');
            }
        }
        Var::Arg(name) => {
            if let Some(v) = req.query.as_deref().and_then(|q| arg(q, name)) {
                out.extend_from_slice(v.as_bytes());
            }
        }
        Var::Request => out.extend_from_slice(req.request_line.as_bytes()),
        Var::RequestMethod => out.extend_from_slice(req.method.as_str().as_bytes()),
        Var::RequestLength => {
            // The head as received; one rebuilt from its lines where the parse left none.
            let head: usize = if req.head_len > 0 {
                req.head_len
            } else {
                req.request_line.len()
                    + 2
                    + c.headers
                        .iter()
                        .map(|h| h.name.len() + 2 + h.value.len() + 2)
                        .sum::<usize>()
                    + 2
            };
            let body = match req.body {
                Body::Length(n) => n,
                _ => 0,
            };
            push_u64(out, head as u64 + body);
        }
        Var::ContentType => {
            push_joined(out, "content-type", c.headers);
        }
        Var::ContentLength => {
            push_joined(out, "content-length", c.headers);
        }
        Var::Cookie(name) => {
            for h in c
                .headers
                .iter()
                .filter(|h| h.name.eq_ignore_ascii_case("cookie"))
            {
                let v = String::from_utf8_lossy(h.value);
                if let Some(v) = find_pair(&v, ';', name, false) {
                    out.extend_from_slice(v.as_bytes());
                    return;
                }
            }
        }
        Var::DocumentRoot | Var::RealpathRoot => {
            let rendered = doc_root_at(c, depth + 1);
            let root = rendered
                .as_deref()
                .or(c.location.alias.as_deref())
                .unwrap_or(&c.location.root);
            if matches!(var, Var::RealpathRoot) {
                if let Ok(p) = std::fs::canonicalize(root) {
                    out.extend_from_slice(p.as_os_str().as_encoded_bytes());
                    return;
                }
            }
            out.extend_from_slice(root.as_os_str().as_encoded_bytes());
        }
        Var::FastcgiScriptName | Var::FastcgiPathInfo => {
            let (script, info) =
                crate::fastcgi::split_path(c.location.fastcgi.as_deref(), &req.path);
            if matches!(var, Var::FastcgiScriptName) {
                out.extend_from_slice(script.as_bytes());
                if script.ends_with('/') {
                    if let Some(ix) = c.location.fastcgi.as_ref().and_then(|f| f.index.as_ref()) {
                        out.extend_from_slice(ix.as_bytes());
                    }
                }
            } else {
                out.extend_from_slice(info.as_bytes());
            }
        }
        Var::RequestFilename => {
            let root = doc_root_at(c, depth + 1);
            let p = if req.add_uri_to_alias {
                crate::static_file::map_try_path_with(c.location, &req.path, root.as_deref())
            } else {
                crate::static_file::map_path_with(c.location, &req.path, root.as_deref())
            };
            out.extend_from_slice(p.as_os_str().as_encoded_bytes());
        }
        Var::Status => {
            if let Some(d) = &c.done {
                push_u64(out, u64::from(d.status));
            } else {
                out.extend_from_slice(b"000");
            }
        }
        Var::BodyBytesSent => push_u64(out, c.done.map_or(0, |d| d.body_bytes)),
        Var::BytesSent => push_u64(out, c.done.map_or(0, |d| d.bytes)),
        Var::RequestTime => push_secs(out, c.conn.now_ms.saturating_sub(c.conn.started_ms)),
        Var::Msec => push_secs(out, c.conn.now_ms),
        Var::LimitReqStatus => out.extend_from_slice(c.conn.limit_req_status.as_bytes()),
        Var::LimitConnStatus => out.extend_from_slice(c.conn.limit_conn_status.as_bytes()),
        Var::UpstreamHttp(name) => {
            let last = c
                .done
                .and_then(|d| d.upstream.last())
                .or(c.conn.upstream.last());
            let mut first = true;
            for (_, v) in last
                .into_iter()
                .flat_map(|t| &t.headers)
                .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            {
                if !first {
                    out.extend_from_slice(b", ");
                }
                first = false;
                out.extend_from_slice(v);
            }
        }
        Var::UpstreamCookie(name) => {
            let last = c
                .done
                .and_then(|d| d.upstream.last())
                .or(c.conn.upstream.last());
            let value = last
                .into_iter()
                .flat_map(|t| &t.headers)
                .find_map(|(n, v)| {
                    if !n.eq_ignore_ascii_case("set-cookie") {
                        return None;
                    }
                    let v = std::str::from_utf8(v).ok()?;
                    // Spaces around the name and value are skipped, nothing else (a tab is
                    // part of them), as nginx's Set-Cookie parser.
                    let (k, rest) = v.split_once('=')?;
                    (k.trim_matches(' ') == name)
                        .then(|| rest.split(';').next().unwrap_or("").trim_matches(' '))
                });
            if let Some(v) = value {
                out.extend_from_slice(v.as_bytes());
            }
        }
        Var::InvalidReferer => {
            if c.location
                .referers
                .as_ref()
                .is_some_and(|r| r.invalid(req.referer.as_deref()))
            {
                out.push(b'1');
            }
        }
        Var::SecureLink => {
            if depth < MAP_DEPTH_MAX {
                secure_link(out, c, depth + 1);
            }
        }
        Var::SecureLinkExpires => {
            if let Some(expr) = c
                .location
                .secure_link
                .as_ref()
                .and_then(|s| s.expr.as_ref())
            {
                if depth < MAP_DEPTH_MAX {
                    let mut v = Vec::new();
                    push_parts_at(&mut v, expr, c, depth + 1);
                    if let Some(i) = v.iter().position(|&b| b == b',') {
                        out.extend_from_slice(&v[i + 1..]);
                    }
                }
            }
        }
        Var::ConnectionTime => push_secs(out, c.conn.now_ms.saturating_sub(c.conn.opened_ms)),
        Var::TimeLocal => out.extend_from_slice(crate::log_time(c.conn.now_ms / 1000).as_bytes()),
        Var::DateGmt | Var::DateLocal => out.extend_from_slice(
            crate::strftime(crate::ssi::TIMEFMT, c.conn.now_ms / 1000).as_bytes(),
        ),
        Var::TimeIso8601 => {
            out.extend_from_slice(crate::iso8601_time(c.conn.now_ms / 1000).as_bytes())
        }
        Var::RequestId => {
            let _ = write!(out, "{:032x}", c.conn.request_id);
        }
        Var::Connection => push_u64(out, c.conn.connection),
        Var::ConnectionRequests => push_u64(out, c.conn.requests),
        Var::Pid => push_u64(out, u64::from(std::process::id())),
        Var::Hostname => out.extend_from_slice(c.conn.hostname.as_bytes()),
        Var::LimitRate => push_u64(out, c.conn.limit_rate),
        Var::Connections(i) => {
            if let Some(s) = c.conn.status {
                push_u64(out, s.connections()[usize::from(*i).min(3)]);
            }
        }
        Var::NginxVersion => out.extend_from_slice(env!("CARGO_PKG_VERSION").as_bytes()),
        Var::ProxyHost => {
            if let Some(p) = c.pass {
                out.extend_from_slice(p.proxy_host.as_bytes());
            }
        }
        Var::ProxyPort => {
            if let Some(p) = c.pass {
                push_u64(out, u64::from(p.proxy_port));
            }
        }
        Var::ProxyAddXForwardedFor => {
            let had = push_joined(out, "x-forwarded-for", c.headers);
            if let Some(a) = c.client {
                if had {
                    out.extend_from_slice(b", ");
                }
                let _ = write!(out, "{}", a.ip());
            }
        }
        Var::UpstreamAddr
        | Var::UpstreamStatus
        | Var::UpstreamResponseTime
        | Var::UpstreamConnectTime
        | Var::UpstreamHeaderTime
        | Var::UpstreamResponseLength
        | Var::UpstreamBytesReceived
        | Var::UpstreamBytesSent => {
            let tries = match c.done {
                Some(d) if !d.upstream.is_empty() => d.upstream,
                _ => c.conn.upstream,
            };
            for (i, t) in tries.iter().enumerate() {
                if i > 0 {
                    out.extend_from_slice(b", ");
                }
                let ms = match var {
                    Var::UpstreamAddr => {
                        out.extend_from_slice(t.addr.as_bytes());
                        continue;
                    }
                    Var::UpstreamStatus => {
                        match t.status {
                            Some(s) => push_u64(out, u64::from(s)),
                            None => out.extend_from_slice(b"502"),
                        }
                        continue;
                    }
                    Var::UpstreamResponseLength => {
                        push_u64(out, t.response_length);
                        continue;
                    }
                    Var::UpstreamBytesReceived => {
                        push_u64(out, t.bytes_received);
                        continue;
                    }
                    Var::UpstreamBytesSent => {
                        push_u64(out, t.bytes_sent);
                        continue;
                    }
                    Var::UpstreamResponseTime => t.response_ms,
                    Var::UpstreamConnectTime => t.connect_ms,
                    _ => t.header_ms,
                };
                match ms {
                    Some(ms) => push_secs(out, ms),
                    None => out.push(b'-'),
                }
            }
        }
        Var::SliceRange => out.extend_from_slice(c.conn.slice_range.as_bytes()),
        Var::UpstreamCacheStatus => {
            if let Some(d) = c.done {
                out.extend_from_slice(d.cache_status.as_bytes());
            }
        }
        Var::Http(name) => {
            // A header `ignore_invalid_headers` drops is not one (nginx never lists it).
            push_joined_if(out, name, c.headers, |h| {
                crate::request::header_name_forwarded(h.as_bytes(), c.req.names)
            });
        }
        Var::User(name) => {
            if let Some((_, v)) = c
                .scope
                .user
                .iter()
                .find(|(n, _)| n.eq_ignore_ascii_case(name))
            {
                out.extend_from_slice(v);
            } else if let Some(i) = c
                .scope
                .capture_names
                .iter()
                .position(|n| n.as_deref().is_some_and(|n| n.eq_ignore_ascii_case(name)))
            {
                if let Some(Some((a, b))) = c.scope.captures.get(i) {
                    // Byte ranges (PCRE's byte mode, as nginx): a group may end inside a
                    // character, and its bytes are passed as they are.
                    if let Some(t) = c.scope.capture_text.as_bytes().get(*a..*b) {
                        out.extend_from_slice(t);
                    }
                }
            } else if let Some(m) = c
                .scope
                .maps
                .iter()
                .find(|m| m.name.eq_ignore_ascii_case(name))
            {
                if depth < MAP_DEPTH_MAX {
                    let mut src = Vec::new();
                    push_parts_at(&mut src, &m.source, c, depth + 1);
                    let text = String::from_utf8_lossy(&src);
                    let mut caps = Vec::new();
                    match map_lookup_with(m, &text, &mut caps) {
                        (value, Some(re)) => {
                            // The value sees the expression's groups.
                            let scope = Scope {
                                captures: &caps,
                                capture_text: &text,
                                capture_names: re.capture_names(),
                                ..c.scope
                            };
                            let inner = Ctx { scope, ..*c };
                            push_parts_at(out, value, &inner, depth + 1);
                        }
                        (value, None) => push_parts_at(out, value, c, depth + 1),
                    }
                }
            }
        }
        Var::Capture(n) => {
            if let Some(Some((a, b))) = c.scope.captures.get(usize::from(*n)) {
                if let Some(t) = c.scope.capture_text.as_bytes().get(*a..*b) {
                    out.extend_from_slice(t);
                }
            }
        }
        // The stream module's: the http parse never yields them.
        Var::Protocol
        | Var::BytesReceived
        | Var::SessionTime
        | Var::UpstreamSessionTime
        | Var::UpstreamFirstByteTime
        | Var::SslPrereadProtocol
        | Var::SslPrereadServerName
        | Var::SslPrereadAlpnProtocols => {}
        Var::SentTrailer(name) => {
            let Some(d) = &c.done else { return };
            if let Some((_, v)) = d
                .trailers
                .iter()
                .find(|(n, _)| n.eq_ignore_ascii_case(name))
            {
                out.extend_from_slice(v);
            }
        }
        Var::Geoip(g) => {
            let Some(conf) = c.location.geoip.as_deref() else {
                return;
            };
            let Some(mut addr) = c.client.map(|a| a.ip()) else {
                return;
            };
            // `geoip_proxy`: a trusted peer's `X-Forwarded-For` names the client (the last
            // address, or with `geoip_proxy_recursive` the last one not trusted).
            if conf.proxies.iter().any(|p| p.matches(addr)) {
                let xff: Vec<&str> = c
                    .headers
                    .iter()
                    .filter(|h| h.name.eq_ignore_ascii_case("x-forwarded-for"))
                    .filter_map(|h| std::str::from_utf8(h.value).ok())
                    .flat_map(|v| v.split(','))
                    .map(str::trim)
                    .filter(|v| !v.is_empty())
                    .collect();
                for v in xff.iter().rev() {
                    let Ok(ip) = v.parse::<std::net::IpAddr>() else {
                        break;
                    };
                    addr = ip;
                    if !conf.proxy_recursive || !conf.proxies.iter().any(|p| p.matches(ip)) {
                        break;
                    }
                }
            }
            conf.push(out, *g, addr);
        }
        Var::SentHttp(name) => {
            let Some(d) = &c.done else { return };
            if !d.head.is_empty() {
                // Every line of that name, joined with `, ` as nginx joins a repeated one.
                let values = crate::proxy::head_fields(d.head)
                    .filter(|(n, _)| n.eq_ignore_ascii_case(name.as_bytes()));
                for (i, (_, v)) in values.enumerate() {
                    if i > 0 {
                        out.extend_from_slice(b", ");
                    }
                    out.extend_from_slice(v);
                }
                return;
            }
            let v = match name.as_str() {
                "content-type" => d.content_type,
                "location" => d.location,
                _ => None,
            };
            if let Some(v) = v {
                out.extend_from_slice(v.as_bytes());
            }
        }
    }
}

/// A `$proxy_protocol_*` variable of the header `h` the connection began with (`None`:
/// none, every one empty), for http and stream alike.
pub fn push_proxy_protocol(
    out: &mut Vec<u8>,
    var: &Var,
    h: Option<&crate::proxy_protocol::Header>,
) {
    let Some(h) = h else { return };
    match var {
        Var::ProxyProtocolAddr | Var::ProxyProtocolPort => {
            if let Some(a) = h.src {
                push_addr_part(out, var, a);
            }
        }
        Var::ProxyProtocolServerAddr | Var::ProxyProtocolServerPort => {
            if let Some(a) = h.dst {
                push_addr_part(out, var, a);
            }
        }
        Var::ProxyProtocolTlv(name) => crate::proxy_protocol::push_tlv(out, h, name),
        _ => {}
    }
}

/// The address or the port of `a`, as the `$proxy_protocol_*` variable `var` names it.
fn push_addr_part(out: &mut Vec<u8>, var: &Var, a: SocketAddr) {
    if matches!(var, Var::ProxyProtocolPort | Var::ProxyProtocolServerPort) {
        push_u64(out, u64::from(a.port()));
    } else {
        out.extend_from_slice(a.ip().to_string().as_bytes());
    }
}

/// A TLS variable (`$ssl_protocol`, `$ssl_client_*`, ...) of connection TLS `tls` (`None`:
/// not TLS, every one empty), for http and stream alike; `now_ms` for `$ssl_client_v_remain`.
pub fn push_tls(out: &mut Vec<u8>, var: &Var, tls: Option<&Tls<'_>>, now_ms: u64) {
    match var {
        Var::SslProtocol
        | Var::SslCipher
        | Var::SslServerName
        | Var::SslClientVerify
        | Var::SslClientSDn
        | Var::SslClientIDn
        | Var::SslClientSerial
        | Var::SslClientFingerprint
        | Var::SslClientSDnLegacy
        | Var::SslClientIDnLegacy
        | Var::SslClientRawCert
        | Var::SslClientVStart
        | Var::SslClientVEnd
        | Var::SslAlpnProtocol
        | Var::SslCurve
        | Var::SslSessionId
        | Var::SslCiphers
        | Var::SslCurves => {
            if let Some(t) = tls {
                out.extend_from_slice(tls_text(var, t).as_bytes());
            }
        }
        Var::SslClientCert => {
            // nginx's deprecated form: a tab after every line break but the last.
            let pem = tls.map_or("", |t| t.client.pem).as_bytes();
            if let Some((last, body)) = pem.split_last() {
                for &b in body {
                    out.push(b);
                    if b == b'\n' {
                        out.push(b'\t');
                    }
                }
                out.push(*last);
            }
        }
        Var::SslClientEscapedCert => {
            // nginx's `NGX_ESCAPE_URI_COMPONENT` of the PEM.
            for &b in tls.map_or("", |t| t.client.pem).as_bytes() {
                if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
                    out.push(b);
                } else {
                    let _ = write!(out, "%{b:02X}");
                }
            }
        }
        Var::SslClientVRemain => {
            if let Some(t) = tls.filter(|t| t.client.v_end_secs > 0) {
                let now = now_ms / 1000;
                push_u64(out, t.client.v_end_secs.saturating_sub(now) / 86_400);
            }
        }
        Var::SslSessionReused => {
            if let Some(t) = tls {
                out.push(if t.session_reused { b'r' } else { b'.' });
            }
        }
        _ => {}
    }
}

/// The text of a TLS variable that is one of the connection's [`Tls`] fields as it is.
fn tls_text<'a>(var: &Var, t: &Tls<'a>) -> &'a str {
    match var {
        Var::SslProtocol => t.protocol,
        Var::SslCipher => t.cipher,
        Var::SslServerName => t.server_name,
        Var::SslAlpnProtocol => t.alpn,
        Var::SslCurve => t.curve,
        Var::SslSessionId => t.session_id,
        Var::SslCiphers => t.ciphers,
        Var::SslCurves => t.curves,
        Var::SslClientVerify => t.client.verify,
        Var::SslClientSDn => t.client.s_dn,
        Var::SslClientIDn => t.client.i_dn,
        Var::SslClientSerial => t.client.serial,
        Var::SslClientFingerprint => t.client.fingerprint,
        Var::SslClientSDnLegacy => t.client.s_dn_legacy,
        Var::SslClientIDnLegacy => t.client.i_dn_legacy,
        Var::SslClientRawCert => t.client.pem,
        Var::SslClientVStart => t.client.v_start,
        Var::SslClientVEnd => t.client.v_end,
        _ => "",
    }
}

/// The location's `root` or `alias` rendered for this request when it has variables
/// (`root /srv/$host`); `None` when it is plain text (then `LocationConf::root`/`alias`).
pub fn doc_root(c: &Ctx<'_>) -> Option<std::path::PathBuf> {
    doc_root_at(c, 0)
}

fn doc_root_at(c: &Ctx<'_>, depth: usize) -> Option<std::path::PathBuf> {
    let t = c.location.doc_root_vars.as_ref()?;
    let mut v = Vec::new();
    push_parts_at(&mut v, t, c, depth);
    Some(std::path::PathBuf::from(
        String::from_utf8_lossy(&v).into_owned(),
    ))
}

/// Appends a template: its literal text and the values of its variables.
/// `$secure_link` as nginx's secure link module computes it: with `secure_link_secret`, the
/// link of `/PREFIX/HEXHASH/LINK` when `HEXHASH` is the MD5 of the link and the secret;
/// otherwise `secure_link`'s `HASH[,EXPIRES]`: `1` when `HASH` (base64url) is the MD5 of
/// `secure_link_md5` and the time has not passed, `0` when it has, empty when the hash is
/// wrong.
fn secure_link(out: &mut Vec<u8>, c: &Ctx<'_>, depth: usize) {
    use md5::{Digest, Md5};
    let Some(sl) = c.location.secure_link.as_deref() else {
        return;
    };
    if let Some(secret) = &sl.secret {
        // The raw target: past its first segment, 32 hex digits, then the link.
        let target = c.req.target.as_bytes();
        let Some(rest) = target.get(1..) else { return };
        let Some(a) = rest.iter().position(|&b| b == b'/') else {
            return;
        };
        let rest = &rest[a + 1..];
        let Some(b) = rest.iter().position(|&b| b == b'/') else {
            return;
        };
        let (hex, link) = (&rest[..b], &rest[b + 1..]);
        if hex.len() != 32 || link.is_empty() {
            return;
        }
        let mut h = Md5::new();
        h.update(link);
        h.update(secret.as_bytes());
        let want = h.finalize();
        let ok = (0..16).all(|i| {
            std::str::from_utf8(&hex[2 * i..2 * i + 2])
                .ok()
                .and_then(|x| u8::from_str_radix(x, 16).ok())
                == Some(want[i])
        });
        if ok {
            out.extend_from_slice(link);
        }
        return;
    }
    let (Some(expr), Some(md5)) = (&sl.expr, &sl.md5) else {
        return;
    };
    let mut v = Vec::new();
    push_parts_at(&mut v, expr, c, depth);
    let (hash, expires) = match v.iter().position(|&b| b == b',') {
        Some(i) => {
            let t = std::str::from_utf8(&v[i + 1..]).ok();
            match t.and_then(|t| t.parse::<i64>().ok()).filter(|&e| e > 0) {
                Some(e) => (&v[..i], e),
                None => return,
            }
        }
        None => (&v[..], 0),
    };
    if hash.len() > 24 {
        return;
    }
    let b64: String = hash
        .iter()
        .map(|&b| match b {
            b'-' => '+',
            b'_' => '/',
            b => b as char,
        })
        .collect();
    let Some(hash) = crate::base64_decode(&b64).filter(|h| h.len() == 16) else {
        return;
    };
    let mut m = Vec::new();
    push_parts_at(&mut m, md5, c, depth);
    if Md5::digest(&m).as_slice() != hash.as_slice() {
        return;
    }
    let now = (c.conn.now_ms / 1000) as i64;
    out.push(if expires != 0 && expires < now {
        b'0'
    } else {
        b'1'
    });
}

pub fn push_parts(out: &mut Vec<u8>, parts: &[Part], c: &Ctx<'_>) {
    push_parts_at(out, parts, c, 0)
}

fn push_parts_at(out: &mut Vec<u8>, parts: &[Part], c: &Ctx<'_>, depth: usize) {
    for p in parts {
        match p {
            Part::Lit(s) => out.extend_from_slice(s.as_bytes()),
            Part::Var(v) => push_at(out, v, c, depth),
        }
    }
}

/// nginx's `map` lookup: the exact key, else (with `hostnames`, the value compared without
/// case and a trailing dot) the longest `*.name` or `.name` key, else the longest `name.*`
/// key, else the regular expressions in order, else `default`. Keys are found through
/// `MapConf::index`, in time linear in the value's length however many there are.
pub fn map_lookup<'m>(m: &'m MapConf, value: &str) -> &'m [Part] {
    map_lookup_with(m, value, &mut Vec::new()).0
}

/// [`map_lookup`], with the groups of the regular expression that chose the value (in
/// `caps`, byte ranges of `value`) and that expression (for its group names): a value's
/// `$1` or `$name` are these, as nginx's.
pub fn map_lookup_with<'m>(
    m: &'m MapConf,
    value: &str,
    caps: &mut Vec<Option<(usize, usize)>>,
) -> (&'m [Part], Option<&'m shard_config::Regex>) {
    let found = |p: &'m [Part]| (p, None);
    if let Some(g) = &m.geo {
        // `geo`: the address (with no address variable, the client's and its
        // `X-Forwarded-For`, on two lines).
        let addr = if g.source_given {
            g.table.address(value, None)
        } else {
            let (client, xff) = value.split_once('\n').unwrap_or((value, ""));
            g.table.address(client, Some(xff).filter(|x| !x.is_empty()))
        };
        return found(
            g.table
                .find(addr)
                .and_then(|i| g.values.get(i as usize))
                .map_or(&[], Vec::as_slice),
        );
    }
    if let Some(split) = &m.split {
        // `split_clients`: the share the value's MurmurHash2 falls in. The bounds grow (a
        // cumulative table) up to the catch-all `0`, so a binary search finds it.
        let h = murmur_hash2(value.as_bytes());
        let i = split.partition_point(|(bound, _)| *bound != 0 && h >= *bound);
        return found(split.get(i).map_or(&[], |(_, v)| v.as_slice()));
    }
    let lower;
    let v = if m.hostnames {
        lower = value.trim_end_matches('.').to_ascii_lowercase();
        lower.as_str()
    } else {
        value
    };
    if let Some(i) = m.index.find(v) {
        return found(&m.exact[i].1);
    }
    for (re, p) in &m.regexes {
        if re.captures_into(value, caps) {
            return (p, Some(re));
        }
    }
    found(&m.default)
}

/// nginx's `ngx_murmur_hash2` (MurmurHash2, seed 0 xor the length), which `split_clients`
/// draws with.
pub fn murmur_hash2(data: &[u8]) -> u32 {
    const M: u32 = 0x5bd1_e995;
    let mut h = data.len() as u32;
    let mut chunks = data.chunks_exact(4);
    for c in &mut chunks {
        let mut k = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> 24;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M) ^ k;
    }
    let rest = chunks.remainder();
    if rest.len() >= 3 {
        h ^= u32::from(rest[2]) << 16;
    }
    if rest.len() >= 2 {
        h ^= u32::from(rest[1]) << 8;
    }
    if !rest.is_empty() {
        h ^= u32::from(rest[0]);
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^ (h >> 15)
}

/// A template's text, as a `String` (a value that is not UTF-8 is kept, lossily).
pub fn render(parts: &[Part], c: &Ctx<'_>) -> String {
    if let [Part::Lit(s)] = parts {
        return s.clone();
    }
    let mut out = Vec::new();
    push_parts(&mut out, parts, c);
    String::from_utf8(out).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

/// Whether a template needs the request's header lines (any `$http_*`, `$cookie_*`,
/// `$content_*`, `$request_length`, `$proxy_add_x_forwarded_for`).
pub fn needs_headers(parts: &[Part]) -> bool {
    parts
        .iter()
        .any(|p| matches!(p, Part::Var(v) if v.reads_headers()))
}

/// nginx's realip module: the client address a trusted `peer` reports in `conf.header`
/// (`proxy_protocol`: the PROXY protocol header's source, `pp`); `None` when the peer is not
/// trusted or the header holds no address. A `None` peer came over a Unix-domain socket
/// (trusted by `set_real_ip_from unix:`).
pub fn real_ip(
    peer: Option<std::net::IpAddr>,
    conf: &shard_config::RealIp,
    headers: &[Header<'_>],
    pp: Option<std::net::IpAddr>,
) -> Option<std::net::IpAddr> {
    let trusted = |ip: std::net::IpAddr| conf.from.iter().any(|r| r.matches(ip));
    let peer_trusted = conf.from.iter().any(|r| r.matches_client(peer));
    if conf.from.is_empty() || !peer_trusted {
        return None;
    }
    if conf.header == "proxy_protocol" {
        return pp;
    }
    let mut value = Vec::new();
    if !push_joined(&mut value, &conf.header, headers) {
        return None;
    }
    let value = String::from_utf8_lossy(&value);
    let parse = |s: &str| s.trim().parse::<std::net::IpAddr>().ok();
    if conf.header != "x-forwarded-for" {
        return parse(&value);
    }
    let addrs: Vec<&str> = value
        .split(',')
        .map(str::trim)
        .filter(|a| !a.is_empty())
        .collect();
    if !conf.recursive {
        return addrs.last().and_then(|a| parse(a));
    }
    // From the right, the first address that is not trusted; all trusted: the leftmost.
    for a in addrs.iter().rev() {
        let ip = parse(a)?;
        if !trusted(ip) {
            return Some(ip);
        }
    }
    addrs.first().and_then(|a| parse(a))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::route::tests::Rng;

    /// nginx's `map` order, by a scan of every key: the oracle of [`map_lookup`].
    fn map_lookup_scan<'m>(m: &'m MapConf, value: &str) -> &'m [Part] {
        let lower;
        let v = if m.hostnames {
            lower = value.trim_end_matches('.').to_ascii_lowercase();
            lower.as_str()
        } else {
            value
        };
        let wild = |k: &str| m.hostnames && (k.starts_with(['*', '.']) || k.ends_with('*'));
        if let Some((_, p)) = m.exact.iter().find(|(k, _)| !wild(k) && k == v) {
            return p;
        }
        if m.hostnames {
            // The longest leading wildcard, then the longest trailing one; the first written
            // of one length.
            let mut best: Option<(usize, &[Part])> = None;
            for (k, p) in &m.exact {
                let len = if let Some(suffix) = k.strip_prefix('*') {
                    (v.len() > suffix.len() && v.ends_with(suffix)).then_some(suffix.len())
                } else if let Some(name) = k.strip_prefix('.') {
                    (v == name || v.ends_with(&k[..])).then_some(k.len())
                } else {
                    None
                };
                if let Some(len) = len {
                    if best.is_none_or(|(l, _)| len > l) {
                        best = Some((len, p));
                    }
                }
            }
            if best.is_none() {
                for (k, p) in &m.exact {
                    if let Some(prefix) = k.strip_suffix('*') {
                        if v.len() > prefix.len() && v.starts_with(prefix) {
                            let len = prefix.len();
                            if best.is_none_or(|(l, _)| len > l) {
                                best = Some((len, p));
                            }
                        }
                    }
                }
            }
            if let Some((_, p)) = best {
                return p;
            }
        }
        for (re, p) in &m.regexes {
            if re.is_match(value) {
                return p;
            }
        }
        &m.default
    }

    fn labels(r: &mut Rng, max: usize) -> String {
        (0..1 + r.below(max))
            .map(|_| r.pick(&["a", "b", "ex", "www", "com"]))
            .collect::<Vec<_>>()
            .join(".")
    }

    /// Random maps (with and without `hostnames`) and values: the index chooses what the
    /// scan chooses.
    #[test]
    fn map_index_chooses_what_the_scan_chooses() {
        let mut r = Rng(0x3a9_0000_1111_2222);
        for _ in 0..3000 {
            let hostnames = r.below(3) != 0;
            let mut exact: Vec<(String, Vec<Part>)> = Vec::new();
            for i in 0..r.below(12) {
                let key = match (hostnames, r.below(5)) {
                    (true, 0) => format!("*.{}", labels(&mut r, 2)),
                    (true, 1) => format!(".{}", labels(&mut r, 2)),
                    (true, 2) => format!("{}.*", labels(&mut r, 2)),
                    _ => labels(&mut r, 3),
                };
                if exact.iter().all(|(k, _)| *k != key) {
                    exact.push((key, vec![Part::Lit(i.to_string())]));
                }
            }
            let regexes = (0..r.below(3))
                .map(|i| {
                    let re = r.pick(&[r"^a", r"com$", r"b\.", r"^www"]);
                    (
                        shard_config::Regex::new(re).unwrap(),
                        vec![Part::Lit(format!("re{i}"))],
                    )
                })
                .collect();
            let m = MapConf {
                name: "m".into(),
                source: vec![],
                hostnames,
                index: shard_config::index::MapIndex::build(&exact, hostnames),
                split: None,
                geo: None,
                exact,
                regexes,
                default: vec![Part::Lit("default".into())],
            };
            for _ in 0..40 {
                let mut v = labels(&mut r, 4);
                if r.below(5) == 0 {
                    v = v.to_ascii_uppercase() + ".";
                }
                assert_eq!(
                    map_lookup(&m, &v),
                    map_lookup_scan(&m, &v),
                    "{v:?} in {:?}",
                    m.exact.iter().map(|(k, _)| k).collect::<Vec<_>>()
                );
            }
        }
    }
}
