//! From the directive tree to a [`Config`]: the walk (context, arity and block checks,
//! `include`), the entry point, and the final merge of the main and events contexts.
//!
//! By context: `table.rs` (every directive and its handler), `main_events.rs`, `http.rs`
//! (http, server, location, and the http proxy's settings), `stream.rs`, `upstream.rs` (both
//! modules' upstream blocks), `values.rs` (value parsers and error shapes shared by all).
//! The parser reads no socket and starts nothing; the lexer (`lexer.rs`) does not depend on
//! it.

use std::cell::Cell;
use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use crate::lexer::{parse_tree, Directive, Item};
use crate::model::*;
use crate::units::{parse_size, parse_time_ms};
use crate::{where_, ConfigError, COMMAND_LINE, MIME_TYPES};

mod cache;
mod fastcgi;
mod http;
mod main_events;
mod script;
mod stream;
mod table;
mod upstream;
mod values;

use cache::*;
use fastcgi::*;
pub(crate) use http::expires_value;
pub use http::runtime_variable;
use http::*;
use main_events::*;
use script::*;
use stream::*;
use table::*;
use upstream::*;
use values::*;

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
    /// `if` inside `server` or `location`.
    If,
    /// `limit_except METHOD ... { }` inside `location`.
    LimitExcept,
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

/// `if` inside `server` or `location`.
const IF: u16 = 1024;

/// `limit_except` inside `location` (nginx's `NGX_HTTP_LMT_CONF`).
const LMT: u16 = 2048;

const ANY: u16 = M | E | H | S | L | T | SM | SS | U | HU | IF | LMT;

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
            Ctx::If => IF,
            Ctx::LimitExcept => LMT,
        }
    }
}

/// How deep `include` may nest (guards against a file including itself).
pub(crate) const MAX_INCLUDE_DEPTH: usize = 32;

/// The files an `include` directive names, each with its text, in nginx's order: a pattern's
/// matches sorted by name (none is no error), a plain name that must exist. A relative name
/// resolves against `conf_dir`; a missing `mime.types` beside the configuration is the
/// bundled one.
pub(crate) fn include_sources(
    conf_dir: &Path,
    d: &Directive,
    file: &str,
) -> Result<Vec<(PathBuf, String)>, ConfigError> {
    let arg = &d.args[0];
    let pattern = if Path::new(arg).is_absolute() {
        PathBuf::from(arg)
    } else {
        conf_dir.join(arg)
    };
    let wildcard = arg.contains(['*', '?', '[']);
    let files: Vec<PathBuf> = if wildcard {
        // The directory part is literal; only the argument is a pattern.
        let pat = if Path::new(arg).is_absolute() {
            arg.clone()
        } else {
            let dir = glob::Pattern::escape(&conf_dir.to_string_lossy());
            format!("{}/{arg}", dir.trim_end_matches('/'))
        };
        let paths = glob::glob(&pat)
            .map_err(|e| derr(d, file, format!("glob() \"{pat}\" failed ({e})")))?;
        let mut v: Vec<PathBuf> = paths
            .filter_map(Result::ok)
            .filter(|p| p.is_file() && !hidden_match(Path::new(&pat), p))
            .collect();
        v.sort();
        v
    } else {
        vec![pattern]
    };
    let mut out = Vec::with_capacity(files.len());
    for path in files {
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) => {
                let bundled = crate::BUNDLED_FILES
                    .iter()
                    .find(|(name, _)| path.file_name().is_some_and(|n| n == *name));
                match bundled {
                    Some((_, text))
                        if !wildcard
                            && e.kind() == std::io::ErrorKind::NotFound
                            && Path::new(arg)
                                .parent()
                                .is_none_or(|p| p.as_os_str().is_empty()) =>
                    {
                        // Not beside the configuration: the bundled copy.
                        text.to_string()
                    }
                    _ => return Err(derr(d, file, open_failed(&path, &e))),
                }
            }
        };
        out.push((path, text));
    }
    Ok(out)
}

/// glob(3) without GLOB_PERIOD: a wildcard does not match a name's leading dot, so
/// `.site.conf` stays out of `conf.d/*.conf` (a common way to disable a site), while
/// `conf.d/.*.conf` names it. (The `glob` crate's `require_literal_leading_dot` also refuses
/// the explicit `.*`, so the rule is applied here, component by component.)
fn hidden_match(pattern: &Path, path: &Path) -> bool {
    pattern.components().zip(path.components()).any(|(p, m)| {
        let (p, m) = (p.as_os_str().as_bytes(), m.as_os_str().as_bytes());
        m.first() == Some(&b'.') && p.first() != Some(&b'.')
    })
}

struct Env {
    prefix: PathBuf,
    conf_dir: PathBuf,
    depth: Cell<usize>,
    /// Files read by `include`, in order.
    included: std::cell::RefCell<Vec<PathBuf>>,
    /// Every error found so far (see `walk`).
    errors: std::cell::RefCell<Vec<ConfigError>>,
    /// `[warn]` messages, in order.
    warnings: std::cell::RefCell<Vec<String>>,
    /// `log_format`s defined so far, by name.
    log_formats: std::cell::RefCell<HashMap<String, Arc<LogFormat>>>,
    /// The stream block's `log_format`s (a namespace of their own, as in nginx).
    stream_log_formats: std::cell::RefCell<HashMap<String, Arc<LogFormat>>>,
    /// Zones named by `limit_req` and `limit_conn`, in order of first use (their `zone`
    /// fields index this until `finish_http` resolves them), with where they were named and
    /// whether as a `limit_req` zone.
    zone_refs: std::cell::RefCell<Vec<(String, Place, bool)>>,
    /// Every plain `access_log` file named (see `Config::declared_logs`).
    declared_logs: std::cell::RefCell<Vec<PathBuf>>,
    /// Every `error_log` below the main context (see `Config::context_error_logs`).
    context_error_logs: std::cell::RefCell<Vec<ErrorLog>>,
}

impl Env {
    /// Notes an `error_log` below the main context, for the master to open.
    pub(super) fn note_error_log(&self, l: &ErrorLog) {
        let mut v = self.context_error_logs.borrow_mut();
        if !v.iter().any(|o| o.target == l.target) {
            v.push(l.clone());
        }
    }
}

/// `NGINX_ONLY` is sorted, as its binary search needs (a test checks it).
#[cfg(test)]
#[allow(non_snake_case)]
pub(crate) fn NGINX_ONLY_IS_SORTED() -> bool {
    NGINX_ONLY.windows(2).all(|w| w[0] < w[1])
}

/// `docs/nginx-directives.md`: every name of nginx's directive index with what shard does
/// with it, made from the directive table (a test keeps the file equal to this).
#[cfg(test)]
pub(crate) fn directive_index_doc() -> String {
    let mut out = String::from(
        "# nginx's directives in shard\n\n\
         Every directive of nginx's directive index (its own modules), with what shard does with\n\
         it: **supported** (see [directives.md](directives.md) for arguments, defaults and any\n\
         difference), **no effect** (accepted, its value checked, with a one-line warning: a tuning\n\
         knob that means nothing in shard), or **not supported** (`-t` names it: `\"NAME\" is an\n\
         nginx directive that shard does not support`). Generated from the directive table\n\
         (`crates/shard-config/src/parse/table.rs`); `cargo test -p shard-config` fails when it is\n\
         out of date, and `SHARD_BLESS=1` writes it anew.\n\n",
    );
    let mut rows = Vec::new();
    let (mut sup, mut none, mut refused) = (0, 0, 0);
    for &name in NGINX_ONLY {
        let specs: Vec<&Spec> = TABLE.iter().filter(|s| s.name == name).collect();
        let status = if specs.is_empty() {
            refused += 1;
            "not supported"
        } else if specs.iter().all(|s| matches!(s.set, Set::NoEffect(_))) {
            none += 1;
            "no effect"
        } else {
            sup += 1;
            "supported"
        };
        rows.push(format!("| `{name}` | {status} |\n"));
    }
    out.push_str(&format!(
        "{} names: {sup} supported, {none} accepted with no effect, {refused} not supported.\n\n\
         | directive | shard |\n|---|---|\n",
        NGINX_ONLY.len()
    ));
    for r in rows {
        out.push_str(&r);
    }
    out
}

/// The most errors one run reports.
const MAX_ERRORS: usize = 100;

#[derive(Default)]
struct MainP {
    worker_processes: Option<WorkerProcesses>,
    pid: Option<PathBuf>,
    error_log: Option<ErrorLog>,
    more_error_logs: Vec<ErrorLog>,
    env: Vec<(String, Option<String>)>,
    worker_rlimit_nofile: Option<u64>,
    worker_rlimit_core: Option<u64>,
    worker_priority: Option<i32>,
    worker_cpu_affinity: Option<CpuAffinity>,
    working_directory: Option<PathBuf>,
    worker_shutdown_timeout_ms: Option<u64>,
    worker_shutdown_drain_ms: Option<u64>,
    user: Option<User>,
    worker_sandbox: Option<bool>,
    daemon: Option<bool>,
    master_process: Option<bool>,
}

#[derive(Default)]
struct EventsP {
    worker_connections: Option<usize>,
    accept_mutex: Option<bool>,
    accept_mutex_delay_ms: Option<u64>,
    multi_accept: Option<bool>,
    reuseport_steering: Option<bool>,
    reuseport_stall_threshold_ms: Option<u64>,
    use_: Option<String>,
    debug_connection: Vec<crate::model::DebugConnection>,
}

#[derive(Default)]
struct State {
    main: MainP,
    events: Option<EventsP>,
    http: Option<HttpP>,
    stream: Option<StreamP>,
}

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
        included: std::cell::RefCell::new(Vec::new()),
        errors: std::cell::RefCell::new(Vec::new()),
        warnings: std::cell::RefCell::new(Vec::new()),
        log_formats: std::cell::RefCell::new(HashMap::new()),
        stream_log_formats: std::cell::RefCell::new(HashMap::new()),
        zone_refs: std::cell::RefCell::new(Vec::new()),
        declared_logs: std::cell::RefCell::new(Vec::new()),
        context_error_logs: std::cell::RefCell::new(Vec::new()),
    };
    reset_names();
    reset_stream_names();
    let mut st = State::default();
    let items = parse_tree(text, name);
    env.walk(&items, name, Ctx::Main, &mut Target::Main(&mut st))?;
    if let Some(extra) = extra {
        let items = parse_tree(extra, COMMAND_LINE);
        env.walk(&items, COMMAND_LINE, Ctx::Main, &mut Target::Main(&mut st))?;
    }
    if let Err(e) = check_names() {
        env.fail(e);
    }
    let mut errors = env.errors.take().into_iter();
    if let Some(mut first) = errors.next() {
        first.more.extend(errors.map(|e| e.message));
        return Err(first);
    }
    env.finish(st)
}

impl Env {
    pub(super) fn resolve(&self, p: &str) -> PathBuf {
        self.prefix.join(p)
    }

    /// A path relative to the configuration file's directory (nginx's `ngx_conf_full_name`
    /// with the configuration prefix: `ssl_certificate`, `include`).
    pub(super) fn resolve_conf(&self, p: &str) -> PathBuf {
        self.conf_dir.join(p)
    }

    /// Reads every directive of `items` into `target` with the handler its table row names,
    /// after checking the row's context, arity and block; follows `include`.
    ///
    /// An error in one directive is recorded and the walk goes on with the next, so one run
    /// reports every error of the configuration (nginx stops at the first). A syntax error
    /// ends the walk of its file: what follows it cannot be read reliably.
    fn walk(
        &self,
        items: &[Item],
        file: &str,
        ctx: Ctx,
        target: &mut Target<'_>,
    ) -> Result<(), ConfigError> {
        for item in items {
            let d = match item {
                Item::Error(e) => {
                    self.fail(e.clone());
                    break;
                }
                Item::Dir(d) => d,
            };
            if let Err(e) = self.directive(d, file, ctx, target) {
                self.fail(e);
            }
        }
        Ok(())
    }

    /// Records an error; the parse fails once the whole configuration was read.
    fn fail(&self, e: ConfigError) {
        let mut errors = self.errors.borrow_mut();
        if errors.len() < MAX_ERRORS {
            errors.push(e);
        }
    }

    /// Records a warning (`[warn]` at `-t` and at start).
    pub(super) fn warn(&self, d: &Directive, file: &str, msg: impl std::fmt::Display) {
        self.warnings
            .borrow_mut()
            .push(format!("{msg} in {}", where_(file, d.line)));
    }

    fn directive(
        &self,
        d: &Directive,
        file: &str,
        ctx: Ctx,
        target: &mut Target<'_>,
    ) -> Result<(), ConfigError> {
        if ctx == Ctx::Types {
            if d.name == "include" && d.block.is_none() {
                if d.args.len() != 1 {
                    return Err(derr(
                        d,
                        file,
                        "invalid number of arguments in \"include\" directive",
                    ));
                }
                return self.include(d, file, ctx, target);
            }
            if d.block.is_some() {
                return Err(derr(d, file, "unexpected \"{\""));
            }
            if let Target::Types(map) = target {
                for ext in &d.args {
                    map.insert(ext.to_ascii_lowercase(), d.name.clone());
                }
            }
            return Ok(());
        }
        // A name may have several entries (`server` is a block in `http` and `stream`, a
        // simple directive in `upstream`): the one valid here wins.
        let mut named = TABLE.iter().filter(|s| s.name == d.name).peekable();
        let Some(&first) = named.peek() else {
            if NGINX_ONLY.binary_search(&d.name.as_str()).is_ok() {
                return Err(derr(
                    d,
                    file,
                    format!(
                        "\"{}\" is an nginx directive that shard does not support",
                        d.name
                    ),
                ));
            }
            return Err(derr(d, file, format!("unknown directive \"{}\"", d.name)));
        };
        let spec = named.find(|s| s.ctx & ctx.bit() != 0).unwrap_or(first);
        if spec.ctx & ctx.bit() == 0 && ctx == Ctx::If && spec.ctx & L != 0 {
            return Err(derr(
                d,
                file,
                format!("\"{}\" inside \"if\" is not supported by shard", d.name),
            ));
        }
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
            Set::Walk => self.include(d, file, ctx, target),
            Set::NoEffect(check) => {
                check(d, file)?;
                self.warn(
                    d,
                    file,
                    format!("\"{}\" is accepted and has no effect in shard", d.name),
                );
                Ok(())
            }
            set => dispatch(self, set, target, d, file),
        }
    }

    fn include(
        &self,
        d: &Directive,
        file: &str,
        ctx: Ctx,
        target: &mut Target<'_>,
    ) -> Result<(), ConfigError> {
        if self.depth.get() >= MAX_INCLUDE_DEPTH {
            return Err(derr(
                d,
                file,
                format!("too deep include nesting of \"{}\"", d.args[0]),
            ));
        }
        for (path, text) in include_sources(&self.conf_dir, d, file)? {
            if std::fs::metadata(&path).is_ok() {
                self.included.borrow_mut().push(path.clone());
            }
            let name = path.display().to_string();
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
            return Err(ConfigError::new(
                "no \"events\" section in configuration".to_string(),
            ));
        };
        let _ = ev.use_;
        let main = MainConf {
            worker_processes: st
                .main
                .worker_processes
                .unwrap_or(WorkerProcesses::Fixed(1)),
            // nginx's compiled-in default is `logs/nginx.pid` under the prefix.
            pid: Some(
                st.main
                    .pid
                    .unwrap_or_else(|| self.prefix.join(crate::model::DEFAULT_PID_PATH)),
            ),
            error_log_configured: st.main.error_log.is_some(),
            more_error_logs: st.main.more_error_logs,
            env: st.main.env,
            error_log: st.main.error_log.unwrap_or_else(|| ErrorLog {
                target: LogTarget::File(self.prefix.join("logs/error.log")),
                level: LogLevel::Error,
            }),
            worker_rlimit_nofile: st.main.worker_rlimit_nofile,
            worker_rlimit_core: st.main.worker_rlimit_core,
            worker_priority: st.main.worker_priority.unwrap_or(0),
            worker_cpu_affinity: st.main.worker_cpu_affinity,
            working_directory: st.main.working_directory,
            worker_shutdown_timeout_ms: st.main.worker_shutdown_timeout_ms,
            worker_shutdown_drain_ms: st
                .main
                .worker_shutdown_drain_ms
                .unwrap_or(crate::model::SHUTDOWN_DRAIN_DEFAULT_MS),
            user: st.main.user,
            worker_sandbox: st.main.worker_sandbox.unwrap_or(false),
            daemon: st.main.daemon.unwrap_or(true),
            master_process: st.main.master_process.unwrap_or(true),
        };
        let events = EventsConf {
            worker_connections: ev.worker_connections.unwrap_or(512),
            accept_mutex: ev.accept_mutex.unwrap_or(false),
            accept_mutex_delay_ms: ev.accept_mutex_delay_ms.unwrap_or(500),
            multi_accept: ev.multi_accept.unwrap_or(false),
            reuseport_steering: ev.reuseport_steering.unwrap_or(true),
            reuseport_stall_threshold_ms: ev.reuseport_stall_threshold_ms.unwrap_or(20),
            debug_connection: ev.debug_connection.clone(),
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
            included: self.included.take(),
            declared_logs: self.declared_logs.take(),
            context_error_logs: self.context_error_logs.take(),
            warnings: self.warnings.take(),
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
        let mut upstreams = h.upstreams;
        // `server NAME resolve` resolves through the http block's `resolver`.
        for u in &mut upstreams {
            let Some(name) = u.peers.iter().find_map(|p| p.resolve.clone()) else {
                continue;
            };
            let Some(r) = &http_eff.resolver else {
                return Err(err(
                    &u.place.file,
                    u.place.line,
                    format!("no resolver defined to resolve \"{name}\""),
                ));
            };
            u.resolver = Some(Arc::new(ResolverConf {
                timeout_ms: http_eff.resolver_timeout_ms,
                ..r.clone()
            }));
        }
        let mut ups = HttpUpstreams {
            named: upstreams.len(),
            list: upstreams,
        };
        let mut servers = h
            .servers
            .into_iter()
            .map(|s| finish_server(s, &http_eff, &mut ups))
            .collect::<Result<Vec<_>, _>>()?;
        // `limit_req`/`limit_conn` named zones by name; a zone may be defined after its use.
        let refs = self.zone_refs.take();
        let mut resolved = Vec::with_capacity(refs.len());
        for (name, at, req) in &refs {
            let Some(i) = h.limit_zones.iter().position(|z| z.name == *name) else {
                return Err(err(
                    &at.file,
                    at.line,
                    format!("zero size shared memory zone \"{name}\""),
                ));
            };
            let z = &h.limit_zones[i];
            if z.rate_milli.is_some() != *req {
                let want = if *req {
                    "limit_req_zone"
                } else {
                    "limit_conn_zone"
                };
                return Err(err(
                    &at.file,
                    at.line,
                    format!("the zone \"{name}\" is not a \"{want}\" zone"),
                ));
            }
            resolved.push(i);
        }
        let g = h.geoip;
        let geoip =
            (g.country.is_some() || g.city.is_some() || g.org.is_some()).then(|| Arc::new(g));
        for s in &mut servers {
            for l in std::iter::once(&mut s.base).chain(s.locations.iter_mut()) {
                l.geoip = geoip.clone();
                let upstream = |p: &[Part]| {
                    p.iter().any(|x| {
                        matches!(x, Part::Var(Var::UpstreamHttp(_) | Var::UpstreamCookie(_)))
                    })
                };
                l.upstream_vars = l.add_headers.iter().any(|a| upstream(&a.value))
                    || l.add_trailers.iter().any(|a| upstream(&a.value))
                    || l.access_logs.iter().any(|al| upstream(&al.format.parts));
                if let (Some(src), Some(dst)) = (&l.source_charset, &l.charset) {
                    l.recode = recode_table(&h.charset_maps, src, dst).map(Arc::new);
                }
                let reads = |p: &[Part]| parts_read_headers(p, &h.maps);
                // The userid module reads the `Cookie` header; WebDAV its `Destination`,
                // `Depth`, `Overwrite` and `Date`; mirrors and `auth_request` subrequests
                // copy them all (a proxied subrequest sends the main request's headers).
                l.needs_head = l.userid.is_some()
                    || l.dav.methods != 0
                    || !l.mirrors.is_empty()
                    || l.auth_request.is_some()
                    || l.ret.as_ref().is_some_and(|r| reads(&r.parts))
                    || l.add_headers.iter().any(|a| reads(&a.value))
                    || l.add_trailers.iter().any(|a| reads(&a.value))
                    || l.sub_filter.pairs.iter().any(|(p, r)| reads(p) || reads(r))
                    || l.index_vars.iter().flatten().any(|t| reads(t))
                    || l.secure_link
                        .as_deref()
                        .is_some_and(|sl| sl.expr.iter().chain(sl.md5.iter()).any(|t| reads(t)))
                    || l.access_logs.iter().any(|al| {
                        al.format.name != LogFormat::COMBINED && reads(&al.format.parts)
                            || al.condition.as_deref().is_some_and(reads)
                    });
                for r in &mut l.limit_req {
                    r.zone = resolved[r.zone];
                }
                resolve_cache(l, &h.cache_paths)?;
                let cc = &l.proxy.cache;
                let sel_reads = matches!(&cc.sel, CacheSel::Var(p) if reads(p));
                let reads_head = sel_reads
                    || cc.key.as_deref().is_some_and(reads)
                    || cc.bypass.iter().chain(&cc.no_cache).any(|p| reads(p));
                l.proxy.cache.reads_head = reads_head;
                for c in &mut l.limit_conn {
                    c.zone = resolved[c.zone];
                }
            }
        }
        *listeners = h
            .listeners
            .into_iter()
            .map(|l| Listener {
                addr: l.addr,
                kind: ListenerKind::Http,
                default_server: l.default_server.unwrap_or(l.servers[0]),
                names: Arc::new(crate::index::ServerIndex::build(&servers, &l.servers)),
                servers: l.servers,
                opts: l.opts,
                place: l.opts_place.unwrap_or(l.first_place),
            })
            .collect();
        Ok(HttpConf {
            charset_maps: h.charset_maps,
            maps: h.maps,
            limit_zones: h.limit_zones,
            cache_paths: h.cache_paths,
            servers,
            upstreams: ups.list,
        })
    }
}

/// A location's `proxy_cache NAME` (or `fastcgi_cache`) names a zone of `paths`, as nginx
/// checks at start (`"proxy_cache" zone "NAME" is unknown`); FastCGI has no default key.
fn resolve_cache(l: &mut LocationConf, paths: &[CachePath]) -> R {
    let prefix = match (&l.fastcgi, &l.gateway) {
        (Some(_), _) => "fastcgi",
        (_, Some(g)) => g.wire.name(),
        _ => "proxy",
    };
    if let CacheSel::Named(name, at) = &l.proxy.cache.sel {
        let Some(i) = paths.iter().position(|p| p.name == *name) else {
            return Err(err(
                &at.file,
                at.line,
                format!("\"{prefix}_cache\" zone \"{name}\" is unknown"),
            ));
        };
        l.proxy.cache.sel = CacheSel::Zone(i);
    }
    if prefix != "proxy"
        && l.proxy.cache.key.is_none()
        && !matches!(l.proxy.cache.sel, CacheSel::Off)
    {
        return Err(err(
            &l.place.file,
            l.place.line,
            format!("no \"{prefix}_cache_key\" for \"{prefix}_cache\""),
        ));
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

fn block(d: &Directive) -> &[Item] {
    d.block.as_deref().unwrap_or_default()
}
