//! The directive table: each row names a directive, where it may appear, its arity, whether
//! it opens a block, and the handler that reads it ([`Set`]); `dispatch` pairs a handler with
//! the block being read ([`Target`]).

#[allow(unused_imports)]
use super::*;

/// What handles a directive: a function of the block state the directive is read into.
/// Each row of [`TABLE`] names its handler, as nginx's `ngx_command_t` names its `set`.
#[derive(Clone, Copy)]
pub(super) enum Set {
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

pub(super) type R = Result<(), ConfigError>;

pub(super) struct Spec {
    pub(super) name: &'static str,
    pub(super) ctx: u16,
    pub(super) min: usize,
    pub(super) max: usize,
    pub(super) block: bool,
    pub(super) set: Set,
}

pub(super) const fn d(name: &'static str, ctx: u16, min: usize, max: usize, set: Set) -> Spec {
    Spec {
        name,
        ctx,
        min,
        max,
        block: false,
        set,
    }
}

pub(super) const fn b(name: &'static str, ctx: u16, min: usize, max: usize, set: Set) -> Spec {
    Spec {
        name,
        ctx,
        min,
        max,
        block: true,
        set,
    }
}

pub(super) const HSL: u16 = H | S | L;

/// Every directive shard knows: name, contexts, arity, block or not, handler. A name valid in
/// several contexts with different meanings has one row per meaning (`server` is a block in
/// `http` and `stream`, a peer in `upstream`). Defaults are not here: each lives once, in the
/// merge of its context (`Eff::defaults`, `finish`, `finish_stream`, `finish_upstream`).
pub(super) static TABLE: &[Spec] = &[
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
    d("worker_sandbox", M, 1, 1, Set::Main(main_worker_sandbox)),
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
    d(
        "reuseport_steering",
        E,
        1,
        1,
        Set::Events(events_reuseport_steering),
    ),
    d(
        "reuseport_stall_threshold",
        E,
        1,
        1,
        Set::Events(events_reuseport_stall_threshold),
    ),
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
    d(
        "client_body_buffer_size",
        HSL,
        1,
        1,
        Set::Settings(set_client_body_buffer_size),
    ),
    d(
        "client_body_temp_path",
        HSL,
        1,
        4,
        Set::Settings(set_client_body_temp_path),
    ),
    d(
        "client_body_in_file_only",
        HSL,
        1,
        1,
        Set::Settings(set_client_body_in_file_only),
    ),
    d(
        "client_body_in_single_buffer",
        HSL,
        1,
        1,
        Set::Settings(set_client_body_in_single_buffer),
    ),
    d(
        "lingering_close",
        HSL,
        1,
        1,
        Set::Settings(set_lingering_close),
    ),
    d(
        "lingering_time",
        HSL,
        1,
        1,
        Set::Settings(set_lingering_time),
    ),
    d(
        "lingering_timeout",
        HSL,
        1,
        1,
        Set::Settings(set_lingering_timeout),
    ),
    d(
        "disable_symlinks",
        HSL,
        1,
        2,
        Set::Settings(set_disable_symlinks),
    ),
    d("sendfile", HSL, 1, 1, Set::Settings(set_sendfile)),
    d(
        "open_file_cache",
        HSL,
        1,
        2,
        Set::Settings(set_open_file_cache),
    ),
    d(
        "open_file_cache_valid",
        HSL,
        1,
        1,
        Set::Settings(set_open_file_cache_valid),
    ),
    d(
        "open_file_cache_min_uses",
        HSL,
        1,
        1,
        Set::Settings(set_open_file_cache_min_uses),
    ),
    d(
        "open_file_cache_errors",
        HSL,
        1,
        1,
        Set::Settings(set_open_file_cache_errors),
    ),
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
        "proxy_request_buffering",
        HSL,
        1,
        1,
        Set::Settings(set_proxy_request_buffering),
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
pub(super) enum Target<'t> {
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
pub(super) struct ServerCx<'t> {
    pub(super) s: &'t mut ServerP,
    pub(super) listeners: &'t mut Vec<ListenerP>,
    pub(super) idx: usize,
}

/// A `server` of `stream` being read.
pub(super) struct StreamServerCx<'t> {
    pub(super) s: &'t mut StreamServerP,
    pub(super) listeners: &'t mut Vec<ListenerP>,
    pub(super) idx: usize,
}

/// An `upstream` block being read.
pub(super) struct UpstreamP {
    /// `http` (a `server` without a port gets 80) or `stream`.
    pub(super) http: bool,
    pub(super) peers: Vec<PeerConf>,
    pub(super) keepalive: Option<usize>,
    pub(super) keepalive_timeout_ms: Option<u64>,
    pub(super) keepalive_requests: Option<u64>,
}

/// Runs the handler a row names on the block being read. A row whose handler does not take
/// this block (a mismatch between the table and the contexts it lists) is an error, never a
/// panic.
pub(super) fn dispatch(
    env: &Env,
    set: Set,
    target: &mut Target<'_>,
    d: &Directive,
    file: &str,
) -> R {
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
