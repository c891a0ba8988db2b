//! The directive table, `include`, and the walk from the directive tree to a [`Config`].

use std::cell::Cell;
use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use crate::lexer::{parse_tree, Directive, Item};
use crate::model::*;
use crate::units::{parse_size, parse_time_ms};
use crate::{where_, ConfigError, COMMAND_LINE, MIME_TYPES};

fn err(file: &str, line: usize, msg: impl std::fmt::Display) -> ConfigError {
    ConfigError::at(file, line, msg)
}

fn derr(d: &Directive, file: &str, msg: impl std::fmt::Display) -> ConfigError {
    err(file, d.line, msg)
}

fn place(d: &Directive, file: &str) -> Place {
    Place {
        file: file.to_string(),
        line: d.line,
    }
}

/// `open() "PATH" failed (2: No such file or directory)`, as nginx words it.
pub(crate) fn open_failed(path: &Path, e: &std::io::Error) -> String {
    let text = e.to_string();
    let text = match text.find(" (os error") {
        Some(i) => text[..i].to_string(),
        None => text,
    };
    match e.raw_os_error() {
        Some(n) => format!("open() \"{}\" failed ({n}: {text})", path.display()),
        None => format!("open() \"{}\" failed ({text})", path.display()),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ctx {
    Main,
    Events,
    Http,
    Server,
    Location,
    Types,
    Stream,
    StreamServer,
    Upstream,
    HttpUpstream,
}

const M: u16 = 1;
const E: u16 = 2;
const H: u16 = 4;
const S: u16 = 8;
const L: u16 = 16;
const T: u16 = 32;
/// `stream` (main of the stream module).
const SM: u16 = 64;
/// `server` inside `stream`.
const SS: u16 = 128;
/// `upstream` inside `stream`.
const U: u16 = 256;
/// `upstream` inside `http`.
const HU: u16 = 512;
const ANY: u16 = M | E | H | S | L | T | SM | SS | U | HU;
const MANY: usize = usize::MAX;

impl Ctx {
    fn bit(self) -> u16 {
        match self {
            Ctx::Main => M,
            Ctx::Events => E,
            Ctx::Http => H,
            Ctx::Server => S,
            Ctx::Location => L,
            Ctx::Types => T,
            Ctx::Stream => SM,
            Ctx::StreamServer => SS,
            Ctx::Upstream => U,
            Ctx::HttpUpstream => HU,
        }
    }
}

/// What handles a directive: a function of the block state the directive is read into.
/// Each row of [`TABLE`] names its handler, as nginx's `ngx_command_t` names its `set`.
#[derive(Clone, Copy)]
enum Set {
    /// `include`, and `error_log` below the main context: the walk handles these itself.
    Walk,
    Main(fn(&Env, &mut State, &Directive, &str) -> R),
    Events(fn(&mut EventsP, &Directive, &str) -> R),
    Http(fn(&Env, &mut HttpP, &Directive, &str) -> R),
    Server(fn(&Env, &mut ServerCx<'_>, &Directive, &str) -> R),
    Location(fn(&Env, &mut LocP, &Directive, &str) -> R),
    /// The settings every http level has (http, server, location), merged downwards.
    Settings(fn(&Env, &mut Settings, &Directive, &str) -> R),
    Stream(fn(&Env, &mut StreamP, &Directive, &str) -> R),
    StreamServer(fn(&mut StreamServerCx<'_>, &Directive, &str) -> R),
    /// The `proxy_*` settings of `stream` and its servers.
    StreamSettings(fn(&mut StreamSettings, &Directive, &str) -> R),
    Upstream(fn(&mut UpstreamP, &Directive, &str) -> R),
}

type R = Result<(), ConfigError>;

struct Spec {
    name: &'static str,
    ctx: u16,
    min: usize,
    max: usize,
    block: bool,
    set: Set,
}

const fn d(name: &'static str, ctx: u16, min: usize, max: usize, set: Set) -> Spec {
    Spec {
        name,
        ctx,
        min,
        max,
        block: false,
        set,
    }
}

const fn b(name: &'static str, ctx: u16, min: usize, max: usize, set: Set) -> Spec {
    Spec {
        name,
        ctx,
        min,
        max,
        block: true,
        set,
    }
}

const HSL: u16 = H | S | L;

/// Every directive shard knows: name, contexts, arity, block or not, handler. A name valid in
/// several contexts with different meanings has one row per meaning (`server` is a block in
/// `http` and `stream`, a peer in `upstream`). Defaults are not here: each lives once, in the
/// merge of its context (`Eff::defaults`, `finish`, `finish_stream`, `finish_upstream`).
static TABLE: &[Spec] = &[
    d("include", ANY, 1, 1, Set::Walk),
    // main
    d(
        "worker_processes",
        M,
        1,
        1,
        Set::Main(main_worker_processes),
    ),
    d("pid", M, 1, 1, Set::Main(main_pid)),
    d("error_log", M, 1, 2, Set::Main(main_error_log)),
    d("error_log", HSL, 1, 2, Set::Walk),
    d(
        "worker_rlimit_nofile",
        M,
        1,
        1,
        Set::Main(main_worker_rlimit_nofile),
    ),
    d(
        "worker_shutdown_timeout",
        M,
        1,
        1,
        Set::Main(main_worker_shutdown_timeout),
    ),
    d("user", M, 1, 2, Set::Main(main_user)),
    b("events", M, 0, 0, Set::Main(main_events)),
    b("http", M, 0, 0, Set::Main(main_http)),
    b("stream", M, 0, 0, Set::Main(main_stream)),
    // events
    d(
        "worker_connections",
        E,
        1,
        1,
        Set::Events(events_worker_connections),
    ),
    d("accept_mutex", E, 1, 1, Set::Events(events_accept_mutex)),
    d(
        "accept_mutex_delay",
        E,
        1,
        1,
        Set::Events(events_accept_mutex_delay),
    ),
    d("multi_accept", E, 1, 1, Set::Events(events_multi_accept)),
    d("use", E, 1, 1, Set::Events(events_use)),
    // http
    b("server", H, 0, 0, Set::Http(http_server)),
    b("server", SM, 0, 0, Set::Stream(stream_server)),
    d("listen", S, 1, MANY, Set::Server(server_listen)),
    d(
        "listen",
        SS,
        1,
        MANY,
        Set::StreamServer(stream_server_listen),
    ),
    d("server_name", S, 1, MANY, Set::Server(server_server_name)),
    b("location", S, 1, 2, Set::Server(server_location)),
    b("location", L, 1, 2, Set::Location(location_location)),
    d("return", S, 1, 2, Set::Server(server_return)),
    d("return", L, 1, 2, Set::Location(location_return)),
    d("root", H | S, 1, 1, Set::Settings(set_root)),
    d("root", L, 1, 1, Set::Location(location_root)),
    d("alias", L, 1, 1, Set::Location(location_alias)),
    d("index", HSL, 1, MANY, Set::Settings(set_index)),
    d("default_type", HSL, 1, 1, Set::Settings(set_default_type)),
    b("types", HSL, 0, 0, Set::Settings(set_types)),
    d(
        "keepalive_timeout",
        HSL,
        1,
        2,
        Set::Settings(set_keepalive_timeout),
    ),
    d(
        "keepalive_requests",
        HSL,
        1,
        1,
        Set::Settings(set_keepalive_requests),
    ),
    d(
        "client_header_timeout",
        H | S,
        1,
        1,
        Set::Settings(set_client_header_timeout),
    ),
    d(
        "client_header_buffer_size",
        H | S,
        1,
        1,
        Set::Settings(set_client_header_buffer_size),
    ),
    d(
        "large_client_header_buffers",
        H | S,
        2,
        2,
        Set::Settings(set_large_client_header_buffers),
    ),
    d(
        "underscores_in_headers",
        H | S,
        1,
        1,
        Set::Settings(set_underscores_in_headers),
    ),
    d(
        "ignore_invalid_headers",
        H | S,
        1,
        1,
        Set::Settings(set_ignore_invalid_headers),
    ),
    d(
        "client_max_body_size",
        HSL,
        1,
        1,
        Set::Settings(set_client_max_body_size),
    ),
    d("send_timeout", HSL, 1, 1, Set::Settings(set_send_timeout)),
    d(
        "client_body_timeout",
        HSL,
        1,
        1,
        Set::Settings(set_client_body_timeout),
    ),
    d("sendfile", HSL, 1, 1, Set::Settings(set_sendfile)),
    d("tcp_nodelay", HSL, 1, 1, Set::Settings(set_tcp_nodelay)),
    d("access_log", HSL, 1, MANY, Set::Settings(set_access_log)),
    d("stub_status", L, 0, 1, Set::Location(location_stub_status)),
    d(
        "shard_status",
        L,
        0,
        0,
        Set::Location(location_shard_status),
    ),
    // gzip
    d("gzip", HSL, 1, 1, Set::Settings(set_gzip)),
    d(
        "gzip_comp_level",
        HSL,
        1,
        1,
        Set::Settings(set_gzip_comp_level),
    ),
    d("gzip_types", HSL, 1, MANY, Set::Settings(set_gzip_types)),
    d(
        "gzip_min_length",
        HSL,
        1,
        1,
        Set::Settings(set_gzip_min_length),
    ),
    d("gzip_vary", HSL, 1, 1, Set::Settings(set_gzip_vary)),
    d(
        "gzip_http_version",
        HSL,
        1,
        1,
        Set::Settings(set_gzip_http_version),
    ),
    // upstream (stream and http); `keepalive*` exist in http upstreams only, as nginx. The
    // http-only entries come after the http/server/location ones of the same name, so a
    // stream upstream reports them as not allowed there.
    b("upstream", H, 1, 1, Set::Http(http_upstream)),
    b("upstream", SM, 1, 1, Set::Stream(stream_upstream)),
    d("server", U | HU, 1, MANY, Set::Upstream(upstream_server)),
    d("keepalive", HU, 1, 1, Set::Upstream(upstream_keepalive)),
    d(
        "keepalive_timeout",
        HU,
        1,
        1,
        Set::Upstream(upstream_keepalive_timeout),
    ),
    d(
        "keepalive_requests",
        HU,
        1,
        1,
        Set::Upstream(upstream_keepalive_requests),
    ),
    // proxy (stream: server; http: location)
    d(
        "proxy_pass",
        SS,
        1,
        1,
        Set::StreamServer(stream_server_proxy_pass),
    ),
    d("proxy_pass", L, 1, 1, Set::Location(location_proxy_pass)),
    d(
        "proxy_connect_timeout",
        SM | SS,
        1,
        1,
        Set::StreamSettings(stream_proxy_connect_timeout),
    ),
    d(
        "proxy_connect_timeout",
        HSL,
        1,
        1,
        Set::Settings(set_proxy_connect_timeout),
    ),
    d(
        "proxy_timeout",
        SM | SS,
        1,
        1,
        Set::StreamSettings(stream_proxy_timeout),
    ),
    d(
        "proxy_buffer_size",
        SM | SS,
        1,
        1,
        Set::StreamSettings(stream_proxy_buffer_size),
    ),
    d(
        "proxy_buffer_size",
        HSL,
        1,
        1,
        Set::Settings(set_proxy_buffer_size),
    ),
    // http proxy
    d(
        "proxy_set_header",
        HSL,
        2,
        2,
        Set::Settings(set_proxy_set_header),
    ),
    d(
        "proxy_http_version",
        HSL,
        1,
        1,
        Set::Settings(set_proxy_http_version),
    ),
    d(
        "proxy_read_timeout",
        HSL,
        1,
        1,
        Set::Settings(set_proxy_read_timeout),
    ),
    d(
        "proxy_send_timeout",
        HSL,
        1,
        1,
        Set::Settings(set_proxy_send_timeout),
    ),
    d(
        "proxy_next_upstream",
        HSL,
        1,
        MANY,
        Set::Settings(set_proxy_next_upstream),
    ),
    d(
        "proxy_next_upstream_tries",
        HSL,
        1,
        1,
        Set::Settings(set_proxy_next_upstream_tries),
    ),
    d(
        "proxy_buffering",
        HSL,
        1,
        1,
        Set::Settings(set_proxy_buffering),
    ),
    d("proxy_buffers", HSL, 2, 2, Set::Settings(set_proxy_buffers)),
];

/// The block a walk reads directives into: the state [`Set`] handlers take.
enum Target<'t> {
    Main(&'t mut State),
    Events(&'t mut EventsP),
    Http(&'t mut HttpP),
    Server(ServerCx<'t>),
    Location(&'t mut LocP),
    Stream(&'t mut StreamP),
    StreamServer(StreamServerCx<'t>),
    Upstream(&'t mut UpstreamP),
    /// `types { MIME EXT ...; }`: every line is a mapping, not a directive.
    Types(&'t mut HashMap<String, String>),
}

/// A `server` of `http` being read: its state, and the http block's listeners it adds to.
struct ServerCx<'t> {
    s: &'t mut ServerP,
    listeners: &'t mut Vec<ListenerP>,
    idx: usize,
}

/// A `server` of `stream` being read.
struct StreamServerCx<'t> {
    s: &'t mut StreamServerP,
    listeners: &'t mut Vec<ListenerP>,
    idx: usize,
}

/// An `upstream` block being read.
struct UpstreamP {
    /// `http` (a `server` without a port gets 80) or `stream`.
    http: bool,
    peers: Vec<PeerConf>,
    keepalive: Option<usize>,
    keepalive_timeout_ms: Option<u64>,
    keepalive_requests: Option<u64>,
}

/// Runs the handler a row names on the block being read. A row whose handler does not take
/// this block (a mismatch between the table and the contexts it lists) is an error, never a
/// panic.
fn dispatch(env: &Env, set: Set, target: &mut Target<'_>, d: &Directive, file: &str) -> R {
    match (set, target) {
        (Set::Main(f), Target::Main(st)) => f(env, st, d, file),
        (Set::Events(f), Target::Events(ev)) => f(ev, d, file),
        (Set::Http(f), Target::Http(h)) => f(env, h, d, file),
        (Set::Server(f), Target::Server(cx)) => f(env, cx, d, file),
        (Set::Location(f), Target::Location(l)) => f(env, l, d, file),
        (Set::Settings(f), Target::Http(h)) => f(env, &mut h.settings, d, file),
        (Set::Settings(f), Target::Server(cx)) => f(env, &mut cx.s.settings, d, file),
        (Set::Settings(f), Target::Location(l)) => f(env, &mut l.settings, d, file),
        (Set::Stream(f), Target::Stream(sp)) => f(env, sp, d, file),
        (Set::StreamServer(f), Target::StreamServer(cx)) => f(cx, d, file),
        (Set::StreamSettings(f), Target::Stream(sp)) => f(&mut sp.settings, d, file),
        (Set::StreamSettings(f), Target::StreamServer(cx)) => f(&mut cx.s.settings, d, file),
        (Set::Upstream(f), Target::Upstream(u)) => f(u, d, file),
        _ => Err(not_handled(d, file)),
    }
}

/// How deep `include` may nest (guards against a file including itself).
const MAX_INCLUDE_DEPTH: usize = 32;

struct Env {
    prefix: PathBuf,
    conf_dir: PathBuf,
    depth: Cell<usize>,
}

// ---------------------------------------------------------------------------------------
// Partial (unmerged) state.

#[derive(Default)]
struct MainP {
    worker_processes: Option<WorkerProcesses>,
    pid: Option<PathBuf>,
    error_log: Option<ErrorLog>,
    worker_rlimit_nofile: Option<u64>,
    worker_shutdown_timeout_ms: Option<u64>,
    user: Option<(String, Option<String>)>,
}

#[derive(Default)]
struct EventsP {
    worker_connections: Option<usize>,
    accept_mutex: Option<bool>,
    accept_mutex_delay_ms: Option<u64>,
    multi_accept: Option<bool>,
    use_: Option<String>,
}

/// Settings that merge http -> server -> location. `None` is "not set in this block".
#[derive(Default, Clone)]
struct Settings {
    root: Option<PathBuf>,
    index: Option<Vec<String>>,
    default_type: Option<String>,
    types: Option<Arc<HashMap<String, String>>>,
    keepalive_timeout_ms: Option<u64>,
    keepalive_requests: Option<u64>,
    client_max_body_size: Option<u64>,
    send_timeout_ms: Option<u64>,
    client_body_timeout_ms: Option<u64>,
    sendfile: Option<bool>,
    tcp_nodelay: Option<bool>,
    access_log: Option<Option<AccessLog>>,
    client_header_timeout_ms: Option<u64>,
    client_header_buffer_size: Option<usize>,
    large_client_header_buffers: Option<(usize, usize)>,
    underscores_in_headers: Option<bool>,
    ignore_invalid_headers: Option<bool>,
    gzip: GzipP,
    proxy: ProxyP,
}

/// The `gzip*` directives of one block. `types` is (types, `*` given).
#[derive(Default, Clone)]
struct GzipP {
    enabled: Option<bool>,
    comp_level: Option<u32>,
    types: Option<(Vec<String>, bool)>,
    min_length: Option<u64>,
    vary: Option<bool>,
    http_version_minor: Option<u8>,
}

impl GzipP {
    fn merge(&self, parent: &GzipConf) -> GzipConf {
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
        }
    }
}

/// The `proxy_*` directives of one http/server/location block.
#[derive(Default, Clone)]
struct ProxyP {
    /// Every `proxy_set_header` of this block, in order; `Some` replaces the parent's list.
    set_headers: Option<Vec<(String, Vec<Part>)>>,
    http_version_minor: Option<u8>,
    connect_timeout_ms: Option<u64>,
    read_timeout_ms: Option<u64>,
    send_timeout_ms: Option<u64>,
    next_upstream: Option<NextUpstream>,
    next_upstream_tries: Option<u32>,
    buffering: Option<bool>,
    buffer_size: Option<usize>,
    buffers: Option<(usize, usize)>,
}

impl ProxyP {
    /// `parent.set_headers` is the inherited user list, without nginx's defaults (they are
    /// added per location by [`with_default_headers`]).
    fn merge(&self, parent: &ProxyConf) -> ProxyConf {
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
            buffering: self.buffering.unwrap_or(parent.buffering),
            buffer_size: self.buffer_size.unwrap_or(parent.buffer_size),
            buffers: self.buffers.unwrap_or(parent.buffers),
        }
    }
}

/// nginx's default request headers, appended after the user's unless the user set them:
/// `Host $proxy_host`, `Connection close`.
fn with_default_headers(mut p: ProxyConf) -> ProxyConf {
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
struct Eff {
    root: PathBuf,
    index: Vec<String>,
    default_type: String,
    types: Arc<HashMap<String, String>>,
    keepalive_timeout_ms: u64,
    keepalive_requests: u64,
    client_max_body_size: u64,
    send_timeout_ms: u64,
    client_body_timeout_ms: u64,
    sendfile: bool,
    tcp_nodelay: bool,
    access_log: Option<AccessLog>,
    client_header_timeout_ms: u64,
    client_header_buffer_size: usize,
    large_client_header_buffers: (usize, usize),
    underscores_in_headers: bool,
    ignore_invalid_headers: bool,
    gzip: GzipConf,
    /// `set_headers` without nginx's defaults (see [`with_default_headers`]).
    proxy: ProxyConf,
}

impl Eff {
    fn defaults(prefix: &Path) -> Eff {
        Eff {
            root: prefix.join("html"),
            index: vec!["index.html".to_string()],
            default_type: "text/plain".to_string(),
            types: bundled_types(),
            keepalive_timeout_ms: 75_000,
            keepalive_requests: 1000,
            client_max_body_size: 1 << 20,
            send_timeout_ms: 60_000,
            client_body_timeout_ms: 60_000,
            sendfile: false,
            tcp_nodelay: true,
            access_log: Some(AccessLog {
                path: prefix.join("logs/access.log"),
                format: "combined".to_string(),
            }),
            client_header_timeout_ms: 60_000,
            client_header_buffer_size: 1024,
            large_client_header_buffers: (4, 8192),
            underscores_in_headers: false,
            ignore_invalid_headers: true,
            gzip: GzipConf::default(),
            proxy: ProxyConf::default(),
        }
    }

    fn merge(&self, s: &Settings) -> Eff {
        Eff {
            root: s.root.clone().unwrap_or_else(|| self.root.clone()),
            index: s.index.clone().unwrap_or_else(|| self.index.clone()),
            default_type: s
                .default_type
                .clone()
                .unwrap_or_else(|| self.default_type.clone()),
            types: s.types.clone().unwrap_or_else(|| self.types.clone()),
            keepalive_timeout_ms: s.keepalive_timeout_ms.unwrap_or(self.keepalive_timeout_ms),
            keepalive_requests: s.keepalive_requests.unwrap_or(self.keepalive_requests),
            client_max_body_size: s.client_max_body_size.unwrap_or(self.client_max_body_size),
            send_timeout_ms: s.send_timeout_ms.unwrap_or(self.send_timeout_ms),
            client_body_timeout_ms: s
                .client_body_timeout_ms
                .unwrap_or(self.client_body_timeout_ms),
            sendfile: s.sendfile.unwrap_or(self.sendfile),
            tcp_nodelay: s.tcp_nodelay.unwrap_or(self.tcp_nodelay),
            access_log: s
                .access_log
                .clone()
                .unwrap_or_else(|| self.access_log.clone()),
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
            ignore_invalid_headers: s
                .ignore_invalid_headers
                .unwrap_or(self.ignore_invalid_headers),
            gzip: s.gzip.merge(&self.gzip),
            proxy: s.proxy.merge(&self.proxy),
        }
    }

    fn location(&self, kind: LocationKind, path: String, place: Place) -> LocationConf {
        LocationConf {
            kind,
            path,
            place,
            ret: None,
            handler: None,
            root: self.root.clone(),
            alias: None,
            index: self.index.clone(),
            default_type: self.default_type.clone(),
            types: self.types.clone(),
            keepalive_timeout_ms: self.keepalive_timeout_ms,
            keepalive_requests: self.keepalive_requests,
            client_max_body_size: self.client_max_body_size,
            send_timeout_ms: self.send_timeout_ms,
            client_body_timeout_ms: self.client_body_timeout_ms,
            sendfile: self.sendfile,
            tcp_nodelay: self.tcp_nodelay,
            access_log: self.access_log.clone(),
            gzip: self.gzip.clone(),
            proxy_pass: None,
            proxy: with_default_headers(self.proxy.clone()),
        }
    }
}

struct LocP {
    kind: LocationKind,
    path: String,
    place: Place,
    ret: Option<Return>,
    handler: Option<StatusHandler>,
    alias: Option<PathBuf>,
    /// `proxy_pass`, resolved to an upstream once the whole `http` block is read.
    pass: Option<PassP>,
    settings: Settings,
    nested: Vec<LocP>,
}

/// A parsed `proxy_pass http://HOST[:PORT][/URI]`. It is resolved to an upstream only when
/// the whole `http` block was read: an `upstream` may follow the location that names it.
struct PassP {
    /// As written (an IPv6 address keeps its brackets).
    host: String,
    /// The port and its text as written, when one was written.
    port: Option<(u16, String)>,
    uri: Option<String>,
    place: Place,
}

struct ServerP {
    place: Place,
    listen: Vec<SocketAddr>,
    names: Vec<ServerName>,
    ret: Option<Return>,
    settings: Settings,
    locations: Vec<LocP>,
}

struct ListenerP {
    addr: SocketAddr,
    opts: ListenOpts,
    /// Where socket options were first given, if any were.
    opts_place: Option<Place>,
    first_place: Place,
    servers: Vec<usize>,
    default_server: Option<usize>,
}

#[derive(Default)]
struct HttpP {
    settings: Settings,
    servers: Vec<ServerP>,
    listeners: Vec<ListenerP>,
    /// The named `upstream` blocks, in file order.
    upstreams: Vec<UpstreamConf>,
}

#[derive(Default)]
struct State {
    main: MainP,
    events: Option<EventsP>,
    http: Option<HttpP>,
    stream: Option<StreamP>,
}

/// The `proxy_*` settings of the stream module, merged stream -> server.
#[derive(Default, Clone)]
struct StreamSettings {
    connect_timeout_ms: Option<u64>,
    timeout_ms: Option<u64>,
    buffer_size: Option<usize>,
}

struct StreamServerP {
    place: Place,
    listen: Vec<SocketAddr>,
    /// The `proxy_pass` argument and where it was written.
    pass: Option<(String, Place)>,
    settings: StreamSettings,
}

#[derive(Default)]
struct StreamP {
    settings: StreamSettings,
    upstreams: Vec<UpstreamConf>,
    servers: Vec<StreamServerP>,
    listeners: Vec<ListenerP>,
}

/// One parsed `listen`.
#[derive(Debug, Clone)]
struct ListenSpec {
    addr: SocketAddr,
    default_server: bool,
    opts: ListenOpts,
    opts_set: bool,
}

// ---------------------------------------------------------------------------------------
// Entry point.

pub(crate) fn parse(
    text: &str,
    name: &str,
    conf_dir: &Path,
    prefix: &Path,
    extra: Option<&str>,
) -> Result<Config, ConfigError> {
    let env = Env {
        prefix: prefix.to_path_buf(),
        conf_dir: conf_dir.to_path_buf(),
        depth: Cell::new(0),
    };
    let mut st = State::default();
    let items = parse_tree(text, name);
    env.walk(&items, name, Ctx::Main, &mut Target::Main(&mut st))?;
    if let Some(extra) = extra {
        let items = parse_tree(extra, COMMAND_LINE);
        env.walk(&items, COMMAND_LINE, Ctx::Main, &mut Target::Main(&mut st))?;
    }
    env.finish(st)
}

impl Env {
    fn resolve(&self, p: &str) -> PathBuf {
        self.prefix.join(p)
    }

    /// Reads every directive of `items` into `target` with the handler its table row names,
    /// after checking the row's context, arity and block; follows `include`.
    fn walk(
        &self,
        items: &[Item],
        file: &str,
        ctx: Ctx,
        target: &mut Target<'_>,
    ) -> Result<(), ConfigError> {
        for item in items {
            let d = match item {
                Item::Error(e) => return Err(e.clone()),
                Item::Dir(d) => d,
            };
            if ctx == Ctx::Types {
                if d.name == "include" && d.block.is_none() {
                    if d.args.len() != 1 {
                        return Err(derr(
                            d,
                            file,
                            "invalid number of arguments in \"include\" directive",
                        ));
                    }
                    self.include(d, file, ctx, target)?;
                    continue;
                }
                if d.block.is_some() {
                    return Err(derr(d, file, "unexpected \"{\""));
                }
                if let Target::Types(map) = target {
                    for ext in &d.args {
                        map.insert(ext.to_ascii_lowercase(), d.name.clone());
                    }
                }
                continue;
            }
            // A name may have several entries (`server` is a block in `http` and `stream`, a
            // simple directive in `upstream`): the one valid here wins.
            let mut named = TABLE.iter().filter(|s| s.name == d.name).peekable();
            let Some(&first) = named.peek() else {
                return Err(derr(d, file, format!("unknown directive \"{}\"", d.name)));
            };
            let spec = named.find(|s| s.ctx & ctx.bit() != 0).unwrap_or(first);
            if spec.ctx & ctx.bit() == 0 {
                return Err(derr(
                    d,
                    file,
                    format!("\"{}\" directive is not allowed here", d.name),
                ));
            }
            if !spec.block && d.block.is_some() {
                return Err(derr(
                    d,
                    file,
                    format!("directive \"{}\" is not terminated by \";\"", d.name),
                ));
            }
            if spec.block && d.block.is_none() {
                return Err(derr(
                    d,
                    file,
                    format!("directive \"{}\" has no opening \"{{\"", d.name),
                ));
            }
            if d.args.len() < spec.min || d.args.len() > spec.max {
                return Err(derr(
                    d,
                    file,
                    format!("invalid number of arguments in \"{}\" directive", d.name),
                ));
            }
            match spec.set {
                Set::Walk if d.name == "include" => self.include(d, file, ctx, target)?,
                // `error_log` below main: checked, accepted for nginx compatibility; shard
                // has one error log.
                Set::Walk => {
                    parse_error_log(d, file, &self.prefix)?;
                }
                set => dispatch(self, set, target, d, file)?,
            }
        }
        Ok(())
    }

    fn include(
        &self,
        d: &Directive,
        file: &str,
        ctx: Ctx,
        target: &mut Target<'_>,
    ) -> Result<(), ConfigError> {
        let arg = &d.args[0];
        let pattern = if Path::new(arg).is_absolute() {
            PathBuf::from(arg)
        } else {
            self.conf_dir.join(arg)
        };
        let wildcard = arg.contains(['*', '?', '[']);
        let files: Vec<PathBuf> = if wildcard {
            // The directory part is literal; only the argument is a pattern.
            let pat = if Path::new(arg).is_absolute() {
                arg.clone()
            } else {
                let dir = glob::Pattern::escape(&self.conf_dir.to_string_lossy());
                format!("{}/{arg}", dir.trim_end_matches('/'))
            };
            let paths = glob::glob(&pat)
                .map_err(|e| derr(d, file, format!("glob() \"{pat}\" failed ({e})")))?;
            let mut v: Vec<PathBuf> = paths
                .filter_map(Result::ok)
                .filter(|p| p.is_file())
                .collect();
            v.sort();
            v
        } else {
            vec![pattern]
        };
        if self.depth.get() >= MAX_INCLUDE_DEPTH {
            return Err(derr(
                d,
                file,
                format!("too deep include nesting of \"{arg}\""),
            ));
        }
        for path in files {
            let name = path.display().to_string();
            let text = match std::fs::read_to_string(&path) {
                Ok(t) => t,
                Err(e) => {
                    if !wildcard
                        && e.kind() == std::io::ErrorKind::NotFound
                        && path.file_name().is_some_and(|n| n == "mime.types")
                        && Path::new(arg)
                            .parent()
                            .is_none_or(|p| p.as_os_str().is_empty())
                    {
                        // No mime.types beside the configuration: use the bundled one.
                        MIME_TYPES.to_string()
                    } else {
                        return Err(derr(d, file, open_failed(&path, &e)));
                    }
                }
            };
            let items = parse_tree(&text, &name);
            self.depth.set(self.depth.get() + 1);
            let r = self.walk(&items, &name, ctx, target);
            self.depth.set(self.depth.get() - 1);
            r?;
        }
        Ok(())
    }

    // -----------------------------------------------------------------------------------
    // The final, merged configuration.

    fn finish(&self, st: State) -> Result<Config, ConfigError> {
        let Some(ev) = st.events else {
            return Err(ConfigError {
                message: "no \"events\" section in configuration".to_string(),
            });
        };
        let _ = ev.use_;
        let main = MainConf {
            worker_processes: st
                .main
                .worker_processes
                .unwrap_or(WorkerProcesses::Fixed(1)),
            pid: st.main.pid,
            error_log: st.main.error_log.unwrap_or_else(|| ErrorLog {
                target: LogTarget::File(self.prefix.join("logs/error.log")),
                level: LogLevel::Error,
            }),
            worker_rlimit_nofile: st.main.worker_rlimit_nofile,
            worker_shutdown_timeout_ms: st.main.worker_shutdown_timeout_ms,
            user: st.main.user,
        };
        let events = EventsConf {
            worker_connections: ev.worker_connections.unwrap_or(512),
            accept_mutex: ev.accept_mutex.unwrap_or(false),
            accept_mutex_delay_ms: ev.accept_mutex_delay_ms.unwrap_or(500),
            multi_accept: ev.multi_accept.unwrap_or(false),
        };
        let mut listeners = Vec::new();
        let http = match st.http {
            Some(h) => Some(self.finish_http(h, &mut listeners)?),
            None => None,
        };
        let stream = match st.stream {
            Some(sp) => Some(finish_stream(sp, &mut listeners)?),
            None => None,
        };
        Ok(Config {
            prefix: self.prefix.clone(),
            main,
            events,
            http,
            stream,
            listeners,
        })
    }

    /// Merges the http block, resolves every `proxy_pass` (named upstreams first, then
    /// implicit ones in order of first use) and fills `listeners` with the http addresses.
    fn finish_http(
        &self,
        h: HttpP,
        listeners: &mut Vec<Listener>,
    ) -> Result<HttpConf, ConfigError> {
        let http_eff = Eff::defaults(&self.prefix).merge(&h.settings);
        let mut ups = HttpUpstreams {
            named: h.upstreams.len(),
            list: h.upstreams,
        };
        let servers = h
            .servers
            .into_iter()
            .map(|s| finish_server(s, &http_eff, &mut ups))
            .collect::<Result<Vec<_>, _>>()?;
        *listeners = h
            .listeners
            .into_iter()
            .map(|l| Listener {
                addr: l.addr,
                kind: ListenerKind::Http,
                default_server: l.default_server.unwrap_or(l.servers[0]),
                servers: l.servers,
                opts: l.opts,
                place: l.opts_place.unwrap_or(l.first_place),
            })
            .collect();
        Ok(HttpConf {
            servers,
            upstreams: ups.list,
        })
    }
}

/// The upstreams of `http` while `proxy_pass` directives are resolved.
struct HttpUpstreams {
    /// Named blocks (the first `named`), then implicit ones.
    list: Vec<UpstreamConf>,
    named: usize,
}

impl HttpUpstreams {
    /// The upstream `p` names: a named block (whose name compares without case, as a host),
    /// else the implicit upstream `HOST:PORT`, created (resolved) on first use.
    fn pass(&mut self, p: &PassP) -> Result<ProxyPass, ConfigError> {
        let at = |m: String| err(&p.place.file, p.place.line, m);
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
                proxy_port: 80,
            });
        }
        let port = p.port.as_ref().map_or(80, |(n, _)| *n);
        let proxy_host = match &p.port {
            Some((n, text)) if *n != 80 => format!("{}:{text}", p.host),
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
        })
    }
}

fn finish_server(
    s: ServerP,
    http_eff: &Eff,
    ups: &mut HttpUpstreams,
) -> Result<ServerConf, ConfigError> {
    let eff = http_eff.merge(&s.settings);
    let mut base = eff.location(LocationKind::Prefix, String::new(), s.place.clone());
    base.ret = s.ret.clone();
    let mut locations = Vec::new();
    for l in s.locations {
        flatten(l, &eff, ups, &mut locations)?;
    }
    if let Some(r) = &s.ret {
        // A server-level `return` runs before any location is chosen, as in nginx.
        for l in &mut locations {
            l.ret = Some(r.clone());
            l.handler = None;
        }
    }
    Ok(ServerConf {
        place: s.place,
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
        ignore_invalid_headers: eff.ignore_invalid_headers,
        base,
        locations,
    })
}

/// Nested locations become siblings of their parent, having inherited from it (all but
/// `proxy_pass`, which belongs to its own location only, as nginx).
fn flatten(
    l: LocP,
    parent: &Eff,
    ups: &mut HttpUpstreams,
    out: &mut Vec<LocationConf>,
) -> Result<(), ConfigError> {
    let eff = parent.merge(&l.settings);
    let mut conf = eff.location(l.kind, l.path, l.place);
    conf.ret = l.ret;
    conf.handler = l.handler;
    conf.alias = l.alias;
    conf.proxy_pass = match &l.pass {
        Some(p) => Some(ups.pass(p)?),
        None => None,
    };
    out.push(conf);
    for n in l.nested {
        flatten(n, &eff, ups, out)?;
    }
    Ok(())
}

/// Sets a directive that may appear once per block (nginx: "is duplicate").
fn once<T>(slot: &mut Option<T>, value: T, d: &Directive, file: &str) -> R {
    if slot.is_some() {
        return Err(dup(d, file));
    }
    *slot = Some(value);
    Ok(())
}

fn a0(d: &Directive) -> &str {
    d.args.first().map_or("", String::as_str)
}

// ---------------------------------------------------------------------------------------
// main

fn main_worker_processes(_: &Env, st: &mut State, d: &Directive, file: &str) -> R {
    let a = a0(d);
    let v = if a == "auto" {
        WorkerProcesses::Auto
    } else {
        match a.parse::<usize>() {
            Ok(n) if (1..=1024).contains(&n) && is_digits(a) => WorkerProcesses::Fixed(n),
            _ => return Err(invalid(d, file, a)),
        }
    };
    once(&mut st.main.worker_processes, v, d, file)
}

fn main_pid(env: &Env, st: &mut State, d: &Directive, file: &str) -> R {
    once(&mut st.main.pid, env.resolve(a0(d)), d, file)
}

fn main_error_log(env: &Env, st: &mut State, d: &Directive, file: &str) -> R {
    st.main.error_log = Some(parse_error_log(d, file, &env.prefix)?);
    Ok(())
}

fn main_worker_rlimit_nofile(_: &Env, st: &mut State, d: &Directive, file: &str) -> R {
    let n = num::<u64>(d, file, a0(d))?;
    once(&mut st.main.worker_rlimit_nofile, n, d, file)
}

fn main_worker_shutdown_timeout(_: &Env, st: &mut State, d: &Directive, file: &str) -> R {
    let t = time(d, file, a0(d))?;
    once(&mut st.main.worker_shutdown_timeout_ms, t, d, file)
}

fn main_user(_: &Env, st: &mut State, d: &Directive, file: &str) -> R {
    let user = (d.args[0].clone(), d.args.get(1).cloned());
    once(&mut st.main.user, user, d, file)
}

fn main_events(env: &Env, st: &mut State, d: &Directive, file: &str) -> R {
    if st.events.is_some() {
        return Err(dup(d, file));
    }
    let mut ev = EventsP::default();
    env.walk(block(d), file, Ctx::Events, &mut Target::Events(&mut ev))?;
    st.events = Some(ev);
    Ok(())
}

fn main_http(env: &Env, st: &mut State, d: &Directive, file: &str) -> R {
    if st.http.is_some() {
        return Err(dup(d, file));
    }
    let mut h = HttpP::default();
    env.walk(block(d), file, Ctx::Http, &mut Target::Http(&mut h))?;
    st.http = Some(h);
    Ok(())
}

fn main_stream(env: &Env, st: &mut State, d: &Directive, file: &str) -> R {
    if st.stream.is_some() {
        return Err(dup(d, file));
    }
    let mut sp = StreamP::default();
    env.walk(block(d), file, Ctx::Stream, &mut Target::Stream(&mut sp))?;
    st.stream = Some(sp);
    Ok(())
}

fn block(d: &Directive) -> &[Item] {
    d.block.as_deref().unwrap_or_default()
}

// ---------------------------------------------------------------------------------------
// events

fn events_worker_connections(ev: &mut EventsP, d: &Directive, file: &str) -> R {
    let n = num::<usize>(d, file, a0(d))?;
    if n == 0 {
        return Err(invalid(d, file, a0(d)));
    }
    once(&mut ev.worker_connections, n, d, file)
}

fn events_accept_mutex(ev: &mut EventsP, d: &Directive, file: &str) -> R {
    let v = flag(d, file, a0(d))?;
    once(&mut ev.accept_mutex, v, d, file)
}

fn events_accept_mutex_delay(ev: &mut EventsP, d: &Directive, file: &str) -> R {
    let t = time(d, file, a0(d))?;
    once(&mut ev.accept_mutex_delay_ms, t, d, file)
}

fn events_multi_accept(ev: &mut EventsP, d: &Directive, file: &str) -> R {
    let v = flag(d, file, a0(d))?;
    once(&mut ev.multi_accept, v, d, file)
}

fn events_use(ev: &mut EventsP, d: &Directive, file: &str) -> R {
    if ev.use_.is_some() {
        return Err(dup(d, file));
    }
    if a0(d) != "epoll" {
        return Err(derr(d, file, format!("invalid event type \"{}\"", a0(d))));
    }
    ev.use_ = Some(a0(d).to_string());
    Ok(())
}

// ---------------------------------------------------------------------------------------
// http, server, location

fn http_upstream(env: &Env, h: &mut HttpP, d: &Directive, file: &str) -> R {
    let u = read_upstream(env, d, file, Ctx::HttpUpstream, &h.upstreams)?;
    h.upstreams.push(u);
    Ok(())
}

fn http_server(env: &Env, h: &mut HttpP, d: &Directive, file: &str) -> R {
    let idx = h.servers.len();
    let mut s = ServerP {
        place: place(d, file),
        listen: Vec::new(),
        names: Vec::new(),
        ret: None,
        settings: Settings::default(),
        locations: Vec::new(),
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
    if s.listen.is_empty() {
        let spec = ListenSpec {
            addr: SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 80),
            default_server: false,
            opts: ListenOpts::default(),
            opts_set: false,
        };
        add_listen(&mut h.listeners, idx, &spec, s.place.clone())?;
        s.listen.push(spec.addr);
    }
    h.servers.push(s);
    Ok(())
}

impl ServerCx<'_> {
    fn reborrow(&mut self) -> ServerCx<'_> {
        ServerCx {
            s: self.s,
            listeners: self.listeners,
            idx: self.idx,
        }
    }
}

fn server_listen(_: &Env, cx: &mut ServerCx<'_>, d: &Directive, file: &str) -> R {
    let spec = parse_listen(d, file)?;
    add_listen(cx.listeners, cx.idx, &spec, place(d, file))?;
    cx.s.listen.push(spec.addr);
    Ok(())
}

fn server_server_name(_: &Env, cx: &mut ServerCx<'_>, d: &Directive, file: &str) -> R {
    for a in &d.args {
        cx.s.names.push(parse_server_name(d, file, a)?);
    }
    Ok(())
}

fn server_location(env: &Env, cx: &mut ServerCx<'_>, d: &Directive, file: &str) -> R {
    let loc = read_location(env, d, file, None)?;
    cx.s.locations.push(loc);
    Ok(())
}

fn server_return(_: &Env, cx: &mut ServerCx<'_>, d: &Directive, file: &str) -> R {
    let r = parse_return(d, file)?;
    cx.s.ret.get_or_insert(r);
    Ok(())
}

fn read_location(
    env: &Env,
    d: &Directive,
    file: &str,
    parent: Option<(LocationKind, &str)>,
) -> Result<LocP, ConfigError> {
    let (kind, path) = if d.args.len() == 2 {
        let kind = match d.args[0].as_str() {
            "=" => LocationKind::Exact,
            "^~" => LocationKind::PrefixNoRegex,
            "~" | "~*" => return Err(derr(d, file, "regex locations are not supported")),
            m => return Err(derr(d, file, format!("invalid location modifier \"{m}\""))),
        };
        (kind, d.args[1].clone())
    } else {
        let a = &d.args[0];
        if let Some(rest) = a.strip_prefix("^~") {
            (LocationKind::PrefixNoRegex, rest.to_string())
        } else if a.starts_with('~') {
            return Err(derr(d, file, "regex locations are not supported"));
        } else if let Some(rest) = a.strip_prefix('=') {
            (LocationKind::Exact, rest.to_string())
        } else if a.starts_with('@') {
            return Err(derr(d, file, "named locations are not supported"));
        } else {
            (LocationKind::Prefix, a.clone())
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
        if !path.starts_with(ppath) {
            return Err(derr(
                d,
                file,
                format!("location \"{path}\" is outside location \"{ppath}\""),
            ));
        }
    }
    let mut loc = LocP {
        kind,
        path,
        place: place(d, file),
        ret: None,
        handler: None,
        alias: None,
        pass: None,
        settings: Settings::default(),
        nested: Vec::new(),
    };
    env.walk(
        block(d),
        file,
        Ctx::Location,
        &mut Target::Location(&mut loc),
    )?;
    Ok(loc)
}

fn location_location(env: &Env, loc: &mut LocP, d: &Directive, file: &str) -> R {
    let path = loc.path.clone();
    let nested = read_location(env, d, file, Some((loc.kind, &path)))?;
    loc.nested.push(nested);
    Ok(())
}

fn location_return(_: &Env, loc: &mut LocP, d: &Directive, file: &str) -> R {
    let r = parse_return(d, file)?;
    loc.ret.get_or_insert(r);
    Ok(())
}

fn location_proxy_pass(_: &Env, loc: &mut LocP, d: &Directive, file: &str) -> R {
    let pass = parse_proxy_pass(d, file)?;
    once(&mut loc.pass, pass, d, file)
}

fn location_stub_status(_: &Env, loc: &mut LocP, _: &Directive, _: &str) -> R {
    loc.handler = Some(StatusHandler::Stub);
    Ok(())
}

fn location_shard_status(_: &Env, loc: &mut LocP, _: &Directive, _: &str) -> R {
    loc.handler = Some(StatusHandler::Shard);
    Ok(())
}

fn location_alias(env: &Env, loc: &mut LocP, d: &Directive, file: &str) -> R {
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
    loc.alias = Some(env.resolve(a0(d)));
    Ok(())
}

fn location_root(env: &Env, loc: &mut LocP, d: &Directive, file: &str) -> R {
    if loc.alias.is_some() {
        return Err(derr(
            d,
            file,
            "\"root\" directive is duplicate, \"alias\" directive was specified earlier",
        ));
    }
    set_root(env, &mut loc.settings, d, file)
}

// The settings of every http level.

fn set_root(env: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    once(&mut s.root, env.resolve(a0(d)), d, file)
}

fn set_index(_: &Env, s: &mut Settings, d: &Directive, _: &str) -> R {
    s.index
        .get_or_insert_with(Vec::new)
        .extend(d.args.iter().cloned());
    Ok(())
}

fn set_default_type(_: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    once(&mut s.default_type, a0(d).to_string(), d, file)
}

fn set_types(env: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    let mut map: HashMap<String, String> = match s.types.take() {
        Some(m) => Arc::try_unwrap(m).unwrap_or_else(|m| (*m).clone()),
        None => HashMap::new(),
    };
    env.walk(block(d), file, Ctx::Types, &mut Target::Types(&mut map))?;
    s.types = Some(Arc::new(map));
    Ok(())
}

fn set_keepalive_timeout(_: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    let t = time(d, file, a0(d))?;
    once(&mut s.keepalive_timeout_ms, t, d, file)
}

fn set_keepalive_requests(_: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    let n = num::<u64>(d, file, a0(d))?;
    once(&mut s.keepalive_requests, n, d, file)
}

fn set_client_max_body_size(_: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    let n = size(d, file, a0(d))?;
    once(&mut s.client_max_body_size, n, d, file)
}

fn set_send_timeout(_: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    let t = time(d, file, a0(d))?;
    once(&mut s.send_timeout_ms, t, d, file)
}

fn set_client_body_timeout(_: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    let t = time(d, file, a0(d))?;
    once(&mut s.client_body_timeout_ms, t, d, file)
}

fn set_sendfile(_: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    let v = flag(d, file, a0(d))?;
    once(&mut s.sendfile, v, d, file)
}

fn set_tcp_nodelay(_: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    let v = flag(d, file, a0(d))?;
    once(&mut s.tcp_nodelay, v, d, file)
}

fn set_client_header_timeout(_: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    let t = time(d, file, a0(d))?;
    once(&mut s.client_header_timeout_ms, t, d, file)
}

fn set_client_header_buffer_size(_: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    let v = size(d, file, a0(d))?;
    if v == 0 {
        return Err(invalid(d, file, a0(d)));
    }
    once(&mut s.client_header_buffer_size, v as usize, d, file)
}

fn set_underscores_in_headers(_: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    let v = flag(d, file, a0(d))?;
    once(&mut s.underscores_in_headers, v, d, file)
}

fn set_ignore_invalid_headers(_: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    let v = flag(d, file, a0(d))?;
    once(&mut s.ignore_invalid_headers, v, d, file)
}

fn set_large_client_header_buffers(_: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
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

fn set_access_log(env: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    let a = a0(d);
    let v = if a == "off" {
        if d.args.len() != 1 {
            return Err(derr(
                d,
                file,
                "invalid number of arguments in \"access_log\" directive",
            ));
        }
        None
    } else {
        let format = match d.args.get(1) {
            None => "combined".to_string(),
            Some(f) if f == "combined" => f.clone(),
            Some(f) if f.contains('=') => "combined".to_string(),
            Some(f) => return Err(derr(d, file, format!("unknown log format \"{f}\""))),
        };
        Some(AccessLog {
            path: env.resolve(a),
            format,
        })
    };
    // shard keeps one access log per block: the first given.
    if s.access_log.is_none() {
        s.access_log = Some(v);
    }
    Ok(())
}

fn set_gzip(_: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    let v = flag(d, file, a0(d))?;
    once(&mut s.gzip.enabled, v, d, file)
}

fn set_gzip_comp_level(_: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    let n = num::<u32>(d, file, a0(d))?;
    if !(1..=9).contains(&n) {
        return Err(derr(d, file, "value must be between 1 and 9"));
    }
    once(&mut s.gzip.comp_level, n, d, file)
}

fn set_gzip_types(_: &Env, s: &mut Settings, d: &Directive, _: &str) -> R {
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

fn set_gzip_min_length(_: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    let n = size(d, file, a0(d))?;
    once(&mut s.gzip.min_length, n, d, file)
}

fn set_gzip_vary(_: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    let v = flag(d, file, a0(d))?;
    once(&mut s.gzip.vary, v, d, file)
}

/// `1.0` or `1.1`: the minor version.
fn http_minor(d: &Directive, file: &str) -> Result<u8, ConfigError> {
    match a0(d) {
        "1.0" => Ok(0),
        "1.1" => Ok(1),
        a => Err(invalid(d, file, a)),
    }
}

fn set_gzip_http_version(_: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    let minor = http_minor(d, file)?;
    once(&mut s.gzip.http_version_minor, minor, d, file)
}

fn set_proxy_set_header(_: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    // As nginx: repeats add up; a block with any replaces the inherited list.
    let value = parse_header_value(d, file, &d.args[1])?;
    s.proxy
        .set_headers
        .get_or_insert_with(Vec::new)
        .push((a0(d).to_string(), value));
    Ok(())
}

fn set_proxy_http_version(_: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    let minor = http_minor(d, file)?;
    once(&mut s.proxy.http_version_minor, minor, d, file)
}

fn set_proxy_connect_timeout(_: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    let t = time(d, file, a0(d))?;
    once(&mut s.proxy.connect_timeout_ms, t, d, file)
}

fn set_proxy_read_timeout(_: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    let t = time(d, file, a0(d))?;
    once(&mut s.proxy.read_timeout_ms, t, d, file)
}

fn set_proxy_send_timeout(_: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    let t = time(d, file, a0(d))?;
    once(&mut s.proxy.send_timeout_ms, t, d, file)
}

fn set_proxy_next_upstream(_: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    let nu = parse_next_upstream(d, file)?;
    once(&mut s.proxy.next_upstream, nu, d, file)
}

fn set_proxy_next_upstream_tries(_: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    let n = num::<u32>(d, file, a0(d))?;
    once(&mut s.proxy.next_upstream_tries, n, d, file)
}

fn set_proxy_buffering(_: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    let v = flag(d, file, a0(d))?;
    once(&mut s.proxy.buffering, v, d, file)
}

fn set_proxy_buffer_size(_: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    let n = buffer_size(d, file, a0(d))?;
    once(&mut s.proxy.buffer_size, n, d, file)
}

fn set_proxy_buffers(_: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    let n = num::<usize>(d, file, a0(d))?;
    let size = buffer_size(d, file, &d.args[1])?;
    if n == 0 {
        return Err(invalid(d, file, a0(d)));
    }
    if n < 2 {
        return Err(derr(d, file, "there must be at least 2 \"proxy_buffers\""));
    }
    // The buffers are memory a worker holds per proxied response: bounded like one buffer.
    if n.checked_mul(size).is_none_or(|t| t > MAX_PROXY_BUFFER) {
        return Err(invalid(d, file, a0(d)));
    }
    once(&mut s.proxy.buffers, (n, size), d, file)
}

// ---------------------------------------------------------------------------------------
// stream

fn stream_upstream(env: &Env, sp: &mut StreamP, d: &Directive, file: &str) -> R {
    let u = read_upstream(env, d, file, Ctx::Upstream, &sp.upstreams)?;
    sp.upstreams.push(u);
    Ok(())
}

fn stream_server(env: &Env, sp: &mut StreamP, d: &Directive, file: &str) -> R {
    let idx = sp.servers.len();
    let mut s = StreamServerP {
        place: place(d, file),
        listen: Vec::new(),
        pass: None,
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
    if s.pass.is_none() {
        return Err(derr(d, file, "no handler for server"));
    }
    sp.servers.push(s);
    Ok(())
}

fn stream_server_listen(cx: &mut StreamServerCx<'_>, d: &Directive, file: &str) -> R {
    let spec = parse_listen(d, file)?;
    if spec.default_server {
        return Err(derr(d, file, "invalid parameter \"default_server\""));
    }
    if cx.listeners.iter().any(|l| l.addr == spec.addr) {
        return Err(derr(d, file, format!("a duplicate listen {}", spec.addr)));
    }
    cx.listeners.push(ListenerP {
        addr: spec.addr,
        opts: spec.opts.clone(),
        opts_place: spec.opts_set.then(|| place(d, file)),
        first_place: place(d, file),
        servers: vec![cx.idx],
        default_server: None,
    });
    cx.s.listen.push(spec.addr);
    Ok(())
}

fn stream_server_proxy_pass(cx: &mut StreamServerCx<'_>, d: &Directive, file: &str) -> R {
    let pass = (a0(d).to_string(), place(d, file));
    once(&mut cx.s.pass, pass, d, file)
}

fn stream_proxy_connect_timeout(s: &mut StreamSettings, d: &Directive, file: &str) -> R {
    let t = time(d, file, a0(d))?;
    once(&mut s.connect_timeout_ms, t, d, file)
}

fn stream_proxy_timeout(s: &mut StreamSettings, d: &Directive, file: &str) -> R {
    let t = time(d, file, a0(d))?;
    once(&mut s.timeout_ms, t, d, file)
}

fn stream_proxy_buffer_size(s: &mut StreamSettings, d: &Directive, file: &str) -> R {
    let n = size(d, file, a0(d))?;
    if n == 0 || n > (1 << 30) {
        return Err(invalid(d, file, a0(d)));
    }
    once(&mut s.buffer_size, n as usize, d, file)
}

// ---------------------------------------------------------------------------------------
// upstream (http and stream)

/// `upstream NAME { ... }` of `stream` (`ctx` [`Ctx::Upstream`]) or `http`
/// ([`Ctx::HttpUpstream`]: `keepalive*` allowed, a `server` without a port gets 80 and names
/// compare without case, as nginx). `existing`: the blocks already read.
fn read_upstream(
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
    };
    env.walk(block(d), file, ctx, &mut Target::Upstream(&mut u))?;
    if u.peers.is_empty() {
        return Err(derr(d, file, "no servers are inside upstream"));
    }
    Ok(finish_upstream(name, place(d, file), u))
}

fn upstream_server(u: &mut UpstreamP, d: &Directive, file: &str) -> R {
    let default_port = u.http.then_some(80);
    u.peers
        .extend(parse_upstream_server(d, file, default_port)?);
    Ok(())
}

fn upstream_keepalive(u: &mut UpstreamP, d: &Directive, file: &str) -> R {
    let n = num::<usize>(d, file, a0(d))?;
    if n == 0 {
        return Err(invalid(d, file, a0(d)));
    }
    once(&mut u.keepalive, n, d, file)
}

fn upstream_keepalive_timeout(u: &mut UpstreamP, d: &Directive, file: &str) -> R {
    let t = time(d, file, a0(d))?;
    once(&mut u.keepalive_timeout_ms, t, d, file)
}

fn upstream_keepalive_requests(u: &mut UpstreamP, d: &Directive, file: &str) -> R {
    let n = num::<u64>(d, file, a0(d))?;
    once(&mut u.keepalive_requests, n, d, file)
}

// ---------------------------------------------------------------------------------------
// Value parsers.

/// A directive the table admits in this context but no handler of the context takes: a
/// mismatch between `TABLE` and a handler, reported as nginx reports a directive it does not
/// know here rather than a panic (configuration text never panics the parser).
fn not_handled(d: &Directive, file: &str) -> ConfigError {
    derr(
        d,
        file,
        format!("\"{}\" directive is not allowed here", d.name),
    )
}

fn dup(d: &Directive, file: &str) -> ConfigError {
    derr(d, file, format!("\"{}\" directive is duplicate", d.name))
}

fn invalid(d: &Directive, file: &str, v: &str) -> ConfigError {
    derr(
        d,
        file,
        format!("invalid value \"{v}\" in \"{}\" directive", d.name),
    )
}

fn is_digits(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())
}

fn num<N: std::str::FromStr>(d: &Directive, file: &str, v: &str) -> Result<N, ConfigError> {
    if !is_digits(v) {
        return Err(invalid(d, file, v));
    }
    v.parse::<N>().map_err(|_| invalid(d, file, v))
}

fn size(d: &Directive, file: &str, v: &str) -> Result<u64, ConfigError> {
    parse_size(v).ok_or_else(|| invalid(d, file, v))
}

fn time(d: &Directive, file: &str, v: &str) -> Result<u64, ConfigError> {
    parse_time_ms(v).ok_or_else(|| invalid(d, file, v))
}

fn flag(d: &Directive, file: &str, v: &str) -> Result<bool, ConfigError> {
    if v.eq_ignore_ascii_case("on") {
        Ok(true)
    } else if v.eq_ignore_ascii_case("off") {
        Ok(false)
    } else {
        Err(derr(
            d,
            file,
            format!(
                "invalid value \"{v}\" in \"{}\" directive, it must be \"on\" or \"off\"",
                d.name
            ),
        ))
    }
}

fn parse_error_log(d: &Directive, file: &str, prefix: &Path) -> Result<ErrorLog, ConfigError> {
    let target = if d.args[0] == "stderr" {
        LogTarget::Stderr
    } else {
        LogTarget::File(prefix.join(&d.args[0]))
    };
    let level = match d.args.get(1).map(String::as_str) {
        None | Some("error") => LogLevel::Error,
        Some("debug") => LogLevel::Debug,
        Some("info") => LogLevel::Info,
        Some("notice") => LogLevel::Notice,
        Some("warn") => LogLevel::Warn,
        Some("crit") => LogLevel::Crit,
        Some("alert") => LogLevel::Alert,
        Some("emerg") => LogLevel::Emerg,
        Some(other) => return Err(derr(d, file, format!("invalid log level \"{other}\""))),
    };
    Ok(ErrorLog { target, level })
}

fn parse_return(d: &Directive, file: &str) -> Result<Return, ConfigError> {
    let a0 = &d.args[0];
    let code = if is_digits(a0) {
        a0.parse::<u16>().ok().filter(|c| *c <= 999)
    } else {
        None
    };
    match (code, d.args.get(1)) {
        (Some(code), text) => Ok(Return {
            code,
            text: text.cloned(),
        }),
        (None, None)
            if a0.starts_with("http://")
                || a0.starts_with("https://")
                || a0.starts_with("$scheme") =>
        {
            Ok(Return {
                code: 302,
                text: Some(a0.clone()),
            })
        }
        (None, _) => Err(derr(d, file, format!("invalid return code \"{a0}\""))),
    }
}

fn parse_server_name(d: &Directive, file: &str, a: &str) -> Result<ServerName, ConfigError> {
    let n = a.to_ascii_lowercase();
    if n.starts_with('~') {
        return Err(derr(d, file, "regex server names are not supported"));
    }
    let bad = || derr(d, file, format!("invalid server name or wildcard \"{a}\""));
    let name = if let Some(rest) = n.strip_prefix('*') {
        if !rest.starts_with('.') || rest.len() < 2 {
            return Err(bad());
        }
        ServerName::WildcardPrefix(rest.to_string())
    } else if let Some(rest) = n.strip_suffix('*') {
        if !rest.ends_with('.') || rest.len() < 2 {
            return Err(bad());
        }
        ServerName::WildcardSuffix(rest.to_string())
    } else if let Some(rest) = n.strip_prefix('.') {
        if rest.is_empty() {
            return Err(bad());
        }
        ServerName::Dot(rest.to_string())
    } else {
        ServerName::Exact(n.clone())
    };
    let inner = match &name {
        ServerName::Exact(s)
        | ServerName::WildcardPrefix(s)
        | ServerName::WildcardSuffix(s)
        | ServerName::Dot(s) => s,
    };
    if inner.contains('*') {
        return Err(bad());
    }
    Ok(name)
}

fn parse_listen_addr(d: &Directive, file: &str, a: &str) -> Result<SocketAddr, ConfigError> {
    let not_found = || {
        derr(
            d,
            file,
            format!("host not found in \"{a}\" of the \"listen\" directive"),
        )
    };
    let bad_port = || {
        derr(
            d,
            file,
            format!("invalid port in \"{a}\" of the \"listen\" directive"),
        )
    };
    let port_of = |p: &str| -> Result<u16, ConfigError> {
        if !is_digits(p) {
            return Err(bad_port());
        }
        match p.parse::<u16>() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(bad_port()),
        }
    };
    if a.starts_with("unix:") {
        return Err(derr(
            d,
            file,
            format!("unix domain sockets are not supported in \"{a}\" of the \"listen\" directive"),
        ));
    }
    if let Some(rest) = a.strip_prefix('[') {
        let Some(end) = rest.find(']') else {
            return Err(not_found());
        };
        let ip: Ipv6Addr = rest[..end].parse().map_err(|_| not_found())?;
        let after = &rest[end + 1..];
        let port = if after.is_empty() {
            80
        } else if let Some(p) = after.strip_prefix(':') {
            port_of(p)?
        } else {
            return Err(not_found());
        };
        return Ok(SocketAddr::new(IpAddr::V6(ip), port));
    }
    if is_digits(a) {
        return Ok(SocketAddr::new(
            IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            port_of(a)?,
        ));
    }
    let (host, port) = match a.rsplit_once(':') {
        Some((h, p)) => (h, port_of(p)?),
        None => (a, 80),
    };
    let ip = match host {
        "*" => Ipv4Addr::UNSPECIFIED,
        h if h.eq_ignore_ascii_case("localhost") => Ipv4Addr::LOCALHOST,
        h => h.parse::<Ipv4Addr>().map_err(|_| not_found())?,
    };
    Ok(SocketAddr::new(IpAddr::V4(ip), port))
}

fn parse_listen(d: &Directive, file: &str) -> Result<ListenSpec, ConfigError> {
    let addr = parse_listen_addr(d, file, &d.args[0])?;
    let mut spec = ListenSpec {
        addr,
        default_server: false,
        opts: ListenOpts::default(),
        opts_set: false,
    };
    for p in &d.args[1..] {
        let (key, val) = match p.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (p.as_str(), None),
        };
        let o = &mut spec.opts;
        match (key, val) {
            ("default_server" | "default", None) => spec.default_server = true,
            ("reuseport", None) => o.reuseport = true,
            ("deferred", None) => o.deferred = true,
            ("shards", Some("auto")) => o.shards = Some(Shards::Auto),
            ("shards", Some(v)) => {
                let n = v
                    .parse::<usize>()
                    .ok()
                    .filter(|n| (1..=MAX_SHARDS).contains(n))
                    .ok_or_else(|| derr(d, file, format!("invalid shards \"{v}\"")))?;
                o.shards = Some(Shards::Count(n));
            }
            ("bind", None) => o.bind = true,
            ("backlog", Some(v)) => {
                o.backlog = v
                    .parse::<i32>()
                    .ok()
                    .filter(|n| *n != 0 && (*n > 0 || *n == -1))
                    .ok_or_else(|| derr(d, file, format!("invalid backlog \"{v}\"")))?;
            }
            ("rcvbuf", Some(v)) => {
                o.rcvbuf = Some(
                    parse_size(v).ok_or_else(|| derr(d, file, format!("invalid rcvbuf \"{v}\"")))?
                        as usize,
                );
            }
            ("sndbuf", Some(v)) => {
                o.sndbuf = Some(
                    parse_size(v).ok_or_else(|| derr(d, file, format!("invalid sndbuf \"{v}\"")))?
                        as usize,
                );
            }
            ("ipv6only", Some(v)) => {
                o.ipv6only = match v {
                    "on" => true,
                    "off" => false,
                    _ => return Err(derr(d, file, format!("invalid ipv6only flags \"{v}\""))),
                };
            }
            ("so_keepalive", Some(v)) => {
                o.so_keepalive = Some(match v {
                    "on" => SoKeepalive::On,
                    "off" => SoKeepalive::Off,
                    // `idle:intvl:cnt`: shard keeps only "on".
                    _ if v.contains(':')
                        && v.split(':')
                            .all(|x| x.is_empty() || parse_time_ms(x).is_some()) =>
                    {
                        SoKeepalive::On
                    }
                    _ => {
                        return Err(derr(
                            d,
                            file,
                            format!("invalid so_keepalive value: \"{p}\""),
                        ))
                    }
                });
            }
            _ => return Err(derr(d, file, format!("invalid parameter \"{p}\""))),
        }
        if key != "default_server" && key != "default" {
            spec.opts_set = true;
        }
    }
    if spec.opts.shards.is_some() && !spec.opts.reuseport {
        return Err(derr(
            d,
            file,
            "the \"shards\" parameter requires \"reuseport\"".to_string(),
        ));
    }
    Ok(spec)
}

fn add_listen(
    listeners: &mut Vec<ListenerP>,
    server: usize,
    spec: &ListenSpec,
    at: Place,
) -> Result<(), ConfigError> {
    let here = |msg: String| ConfigError {
        message: format!("{msg} in {}", where_(&at.file, at.line)),
    };
    let Some(l) = listeners.iter_mut().find(|l| l.addr == spec.addr) else {
        listeners.push(ListenerP {
            addr: spec.addr,
            opts: spec.opts.clone(),
            opts_place: spec.opts_set.then(|| at.clone()),
            first_place: at.clone(),
            servers: vec![server],
            default_server: spec.default_server.then_some(server),
        });
        return Ok(());
    };
    if l.servers.contains(&server) {
        return Err(here(format!("a duplicate listen {}", spec.addr)));
    }
    if spec.opts_set {
        match &l.opts_place {
            Some(first) if l.opts != spec.opts => {
                return Err(ConfigError {
                    message: format!(
                        "duplicate listen options for {} in {} (first given in {})",
                        spec.addr,
                        where_(&at.file, at.line),
                        where_(&first.file, first.line)
                    ),
                });
            }
            Some(_) => {}
            None => {
                l.opts = spec.opts.clone();
                l.opts_place = Some(at.clone());
            }
        }
    }
    if spec.default_server {
        if l.default_server.is_some() {
            return Err(here(format!(
                "a duplicate default server for {}",
                spec.addr
            )));
        }
        l.default_server = Some(server);
    }
    l.servers.push(server);
    Ok(())
}

/// The bundled `mime.types` as a map, parsed once.
pub(crate) fn bundled_types() -> Arc<HashMap<String, String>> {
    static MAP: OnceLock<Arc<HashMap<String, String>>> = OnceLock::new();
    MAP.get_or_init(|| {
        let mut map = HashMap::new();
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

// ---------------------------------------------------------------------------------------
// stream

/// Resolves an upstream address `HOST:PORT` / `[V6]:PORT` (at configuration time, as nginx).
/// Without a port, `default_port` applies (80 in http), else it is an error. The error is
/// the message without its place (nginx words these `... in upstream "ADDR"`).
fn resolve_upstream(a: &str, default_port: Option<u16>) -> Result<Vec<SocketAddr>, String> {
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

/// `server ADDR [weight=N] [max_fails=N] [fail_timeout=T] [backup] [down];` in `upstream`.
/// `default_port`: the port of an `ADDR` without one (80 in http, none in stream).
fn parse_upstream_server(
    d: &Directive,
    file: &str,
    default_port: Option<u16>,
) -> Result<Vec<PeerConf>, ConfigError> {
    let name = d.args[0].clone();
    let addrs = resolve_upstream(&name, default_port).map_err(|m| derr(d, file, m))?;
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
            None if p == "backup" => peer.backup = true,
            None if p == "down" => peer.down = true,
            _ => return Err(bad()),
        }
    }
    Ok(addrs
        .into_iter()
        .map(|addr| PeerConf {
            addr,
            name: if addr.to_string() == name {
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
fn default_peer(addr: SocketAddr) -> PeerConf {
    PeerConf {
        addr,
        name: addr.to_string(),
        weight: 1,
        max_fails: 1,
        fail_timeout_ms: 10_000,
        backup: false,
        down: false,
    }
}

/// An upstream block's defaults (`keepalive` off, `keepalive_timeout 60s`,
/// `keepalive_requests 1000`), in one place.
fn finish_upstream(name: String, place: Place, u: UpstreamP) -> UpstreamConf {
    UpstreamConf {
        name,
        place,
        peers: u.peers,
        keepalive: u.keepalive.unwrap_or(0),
        keepalive_timeout_ms: u.keepalive_timeout_ms.unwrap_or(60_000),
        keepalive_requests: u.keepalive_requests.unwrap_or(1000),
    }
}

/// The one-group upstream of a `proxy_pass` naming an address: nginx's defaults per peer.
fn implicit_upstream(name: String, at: Place, addrs: Vec<SocketAddr>) -> UpstreamConf {
    let u = UpstreamP {
        http: false,
        peers: addrs.into_iter().map(default_peer).collect(),
        keepalive: None,
        keepalive_timeout_ms: None,
        keepalive_requests: None,
    };
    finish_upstream(name, at, u)
}

/// Merges the stream block, resolves `proxy_pass` and appends the stream listeners to the
/// http ones (an address may serve one kind only).
fn finish_stream(sp: StreamP, listeners: &mut Vec<Listener>) -> Result<StreamConf, ConfigError> {
    let mut upstreams = sp.upstreams;
    let mut servers = Vec::with_capacity(sp.servers.len());
    for s in sp.servers {
        let (target, at) = s.pass.expect("checked when the server was parsed");
        let upstream = match upstreams.iter().position(|u| u.name == target) {
            Some(i) => i,
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
        servers.push(StreamServerConf {
            place: s.place,
            listen: s.listen,
            upstream,
            connect_timeout_ms: get(|x| x.connect_timeout_ms, 60_000),
            timeout_ms: get(|x| x.timeout_ms, 600_000),
            buffer_size: get(|x| x.buffer_size.map(|n| n as u64), 16 * 1024) as usize,
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
        });
    }
    Ok(StreamConf { upstreams, servers })
}

// ---------------------------------------------------------------------------------------
// http proxy

/// The largest `proxy_buffer_size`, and the largest `proxy_buffers` total: memory a worker
/// holds for one proxied response.
const MAX_PROXY_BUFFER: usize = 1 << 30;

fn buffer_size(d: &Directive, file: &str, v: &str) -> Result<usize, ConfigError> {
    match size(d, file, v)? {
        n if n == 0 || n > MAX_PROXY_BUFFER as u64 => Err(invalid(d, file, v)),
        n => Ok(n as usize),
    }
}

/// `proxy_pass http://HOST[:PORT][/URI]` (nginx's `ngx_parse_url` with a URI part; errors
/// worded as nginx's, `... in upstream "REST"` with REST the text after the scheme).
fn parse_proxy_pass(d: &Directive, file: &str) -> Result<PassP, ConfigError> {
    let url = d.args[0].as_str();
    let starts = |p: &str| {
        url.len() >= p.len() && url.as_bytes()[..p.len()].eq_ignore_ascii_case(p.as_bytes())
    };
    if !starts("http://") {
        if starts("https://") {
            return Err(derr(d, file, "https protocol requires SSL support"));
        }
        return Err(derr(d, file, format!("invalid URL prefix in \"{url}\"")));
    }
    if url.contains('$') {
        return Err(derr(
            d,
            file,
            "variables in \"proxy_pass\" are not supported",
        ));
    }
    // The scheme is ASCII, so byte 7 is a character boundary.
    let rest = &url[7..];
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
    })
}

/// A `proxy_set_header` value: literal text, `$name` and `${name}`. A `$` not followed by a
/// name character is literal text.
fn parse_header_value(d: &Directive, file: &str, v: &str) -> Result<Vec<Part>, ConfigError> {
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
        parts.push(Part::Var(variable(d, file, name)?));
        i = if bracket { end + 1 } else { end };
        lit_start = i;
    }
    if lit_start < b.len() {
        parts.push(Part::Lit(v[lit_start..].to_string()));
    }
    Ok(parts)
}

/// The variables shard knows (names compare without case, as nginx's).
fn variable(d: &Directive, file: &str, name: &str) -> Result<Var, ConfigError> {
    let name = name.to_ascii_lowercase();
    Ok(match name.as_str() {
        "host" => Var::Host,
        "remote_addr" => Var::RemoteAddr,
        "remote_port" => Var::RemotePort,
        "server_addr" => Var::ServerAddr,
        "server_port" => Var::ServerPort,
        "server_name" => Var::ServerName,
        "scheme" => Var::Scheme,
        "request_uri" => Var::RequestUri,
        "uri" => Var::Uri,
        "args" => Var::Args,
        "is_args" => Var::IsArgs,
        "request_method" => Var::RequestMethod,
        "proxy_host" => Var::ProxyHost,
        "proxy_port" => Var::ProxyPort,
        "proxy_add_x_forwarded_for" => Var::ProxyAddXForwardedFor,
        n if n.starts_with("http_") => Var::Http(n["http_".len()..].replace('_', "-")),
        n => return Err(derr(d, file, format!("unknown \"{n}\" variable"))),
    })
}

/// The `http_NNN` values of `proxy_next_upstream`, ascending; bit i of a mask is entry i.
const NEXT_STATUSES: [u16; 7] = [403, 404, 429, 500, 502, 503, 504];

/// The statuses of `mask` as a `&'static` slice (`NextUpstream::statuses` is `&'static` so
/// the model stays `Copy`). All 128 combinations are built, and leaked, once per process
/// (well under 1 KiB), so parsing again on every reload leaks nothing more.
fn next_statuses(mask: u8) -> &'static [u16] {
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
fn parse_next_upstream(d: &Directive, file: &str) -> Result<NextUpstream, ConfigError> {
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
