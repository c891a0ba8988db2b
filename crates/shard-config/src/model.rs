//! The typed configuration: what the parser produces and everything downstream reads.
//!
//! Values here are final: inheritance (http -> server -> location) is already applied and
//! relative paths are already joined to the prefix, so no consumer has to know nginx's
//! merge rules. This module owns no parsing and no I/O.

use std::net::SocketAddr;
use std::path::PathBuf;

/// `types`: extension (lowercase, no dot) to MIME type, looked up once per static response
/// (hence foldhash, keyed per process, not SipHash).
pub type MimeTypes = std::collections::HashMap<String, String, foldhash::fast::RandomState>;

/// Where a directive was written: shown in errors as `file:line`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Place {
    pub file: String,
    pub line: usize,
}

impl std::fmt::Display for Place {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.file, self.line)
    }
}

#[derive(Debug, Clone)]
pub struct Config {
    /// The prefix (`-p`), against which relative paths were resolved.
    pub prefix: PathBuf,
    pub main: MainConf,
    pub events: EventsConf,
    /// `None` when the file has no `http` block.
    pub http: Option<HttpConf>,
    /// `None` when the file has no `stream` block.
    pub stream: Option<StreamConf>,
    /// Every distinct listening address of every `http` server, in order of first appearance,
    /// with its socket options merged (see [`Listener`]), then every `stream` server's
    /// addresses. One address belongs to one kind only.
    pub listeners: Vec<Listener>,
    /// Every file `include` read, in the order read (the main file is the caller's).
    pub included: Vec<PathBuf>,
    /// Every `access_log` file named anywhere (no variables, no syslog): nginx creates each at
    /// start, written or not (an http-level log every server overrides, for one).
    pub declared_logs: Vec<PathBuf>,
    /// Every `error_log` target named below the main context (http, server, location,
    /// stream, stream server), once each: the master opens them, the workers write the
    /// messages of a request or session there.
    pub context_error_logs: Vec<ErrorLog>,
    /// `[warn]` messages of the parse (`FILE:LINE` included), in order: shown by `-t` and
    /// logged at start and reload.
    pub warnings: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkerProcesses {
    /// `auto`: resolved by the server from affinity and cgroup quota.
    Auto,
    Fixed(usize),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum LogLevel {
    Debug,
    Info,
    Notice,
    Warn,
    Error,
    Crit,
    Alert,
    Emerg,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogTarget {
    Stderr,
    File(PathBuf),
    /// `syslog:server=...`: one datagram per line (RFC 3164).
    Syslog(std::sync::Arc<Syslog>),
}

/// `syslog:server=ADDRESS[:PORT]|unix:PATH[,facility=F][,severity=S][,tag=T][,nohostname]`,
/// as nginx's syslog module reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Syslog {
    pub server: SyslogServer,
    /// Default `local7` (23).
    pub facility: u8,
    /// `severity=`: access log lines' (default `info`); error log lines take their own level
    /// unless it is given.
    pub severity: Option<u8>,
    /// Default `nginx`, nginx's, so that existing syslog rules still match.
    pub tag: String,
    pub nohostname: bool,
    /// The `syslog:...` text as written (what the log is known by).
    pub text: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SyslogServer {
    Udp(std::net::SocketAddr),
    Unix(PathBuf),
}

impl Syslog {
    /// Reads `syslog:...`; errors are nginx's messages.
    pub fn parse(text: &str) -> Result<Syslog, String> {
        let spec = text.strip_prefix("syslog:").unwrap_or(text);
        let mut server = None;
        let mut s = Syslog {
            server: SyslogServer::Udp(std::net::SocketAddr::from(([127, 0, 0, 1], 514))),
            facility: 23,
            severity: None,
            tag: "nginx".to_string(),
            nohostname: false,
            text: text.to_string(),
        };
        for p in spec.split(',') {
            if let Some(v) = p.strip_prefix("server=") {
                server = Some(if let Some(path) = v.strip_prefix("unix:") {
                    SyslogServer::Unix(PathBuf::from(path))
                } else {
                    let with_port = if v.starts_with('[') && !v.contains("]:")
                        || !v.starts_with('[') && !v.contains(':')
                    {
                        format!("{v}:514")
                    } else {
                        v.to_string()
                    };
                    use std::net::ToSocketAddrs;
                    let addr = with_port
                        .to_socket_addrs()
                        .ok()
                        .and_then(|mut a| a.next())
                        .ok_or_else(|| format!("host not found in \"{v}\""))?;
                    SyslogServer::Udp(addr)
                });
            } else if let Some(v) = p.strip_prefix("facility=") {
                const FACILITIES: [&str; 24] = [
                    "kern", "user", "mail", "daemon", "auth", "intern", "lpr", "news", "uucp",
                    "clock", "authpriv", "ftp", "ntp", "audit", "alert", "cron", "local0",
                    "local1", "local2", "local3", "local4", "local5", "local6", "local7",
                ];
                s.facility = FACILITIES
                    .iter()
                    .position(|f| *f == v)
                    .ok_or_else(|| format!("unknown syslog facility \"{v}\""))?
                    as u8;
            } else if let Some(v) = p.strip_prefix("severity=") {
                const SEVERITIES: [&str; 8] = [
                    "emerg", "alert", "crit", "error", "warn", "notice", "info", "debug",
                ];
                s.severity = Some(
                    SEVERITIES
                        .iter()
                        .position(|x| *x == v)
                        .ok_or_else(|| format!("unknown syslog severity \"{v}\""))?
                        as u8,
                );
            } else if let Some(v) = p.strip_prefix("tag=") {
                if v.len() > 32 {
                    return Err("syslog tag length exceeds 32".to_string());
                }
                if !v.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
                    return Err(
                        "syslog \"tag\" only allows alphanumeric characters and underscore"
                            .to_string(),
                    );
                }
                s.tag = v.to_string();
            } else if p == "nohostname" {
                s.nohostname = true;
            } else {
                return Err(format!("unknown syslog parameter \"{p}\""));
            }
        }
        s.server = server.ok_or_else(|| "no syslog server specified".to_string())?;
        Ok(s)
    }

    /// The RFC 3164 header of a message at `severity`: `<PRI>Mmm dd hh:mm:ss HOST TAG: `
    /// (`HOST ` left out with `nohostname`), the time in UTC as shard's logs write it.
    pub fn header(&self, severity: u8, unix_secs: u64, hostname: &str) -> String {
        const MONTHS: [&str; 12] = [
            "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
        ];
        let days = (unix_secs / 86_400) as i64;
        let secs = unix_secs % 86_400;
        // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
        let z = days + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z - era * 146_097;
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let d = doy - (153 * mp + 2) / 5 + 1;
        let m = if mp < 10 { mp + 3 } else { mp - 9 } as usize;
        let pri = u32::from(self.facility) * 8 + u32::from(severity);
        let host = if self.nohostname {
            String::new()
        } else {
            format!("{hostname} ")
        };
        format!(
            "<{pri}>{} {d:2} {:02}:{:02}:{:02} {host}{}: ",
            MONTHS[m - 1],
            secs / 3600,
            secs % 3600 / 60,
            secs % 60,
            self.tag
        )
    }
}

#[derive(Debug, Clone)]
pub struct ErrorLog {
    pub target: LogTarget,
    /// Messages below this level are dropped. Default `error`.
    pub level: LogLevel,
}

/// The pid file when no `pid` directive names one, relative to the prefix (nginx's
/// `logs/nginx.pid`).
pub const DEFAULT_PID_PATH: &str = "logs/shard.pid";

/// `worker_shutdown_drain`'s default.
pub const SHUTDOWN_DRAIN_DEFAULT_MS: u64 = 5000;

#[derive(Debug, Clone)]
pub struct MainConf {
    /// Default `1`, as nginx.
    pub worker_processes: WorkerProcesses,
    /// Default `PREFIX/logs/shard.pid` ([`DEFAULT_PID_PATH`]); always `Some` after parsing.
    pub pid: Option<PathBuf>,
    /// Default `logs/error.log error` under the prefix (or the command line's `-e`); `stderr`
    /// is accepted as a target.
    pub error_log: ErrorLog,
    /// A main-level `error_log` was written (the command line's `-e` then does not apply).
    pub error_log_configured: bool,
    /// The main context's further `error_log`s: every one is written, each at its own
    /// level, as nginx.
    pub more_error_logs: Vec<ErrorLog>,
    /// `env`: the inherited variables the workers keep (`NAME`) and those they get
    /// (`NAME=VALUE`), in order; every other one but `TZ` is removed from their environment.
    pub env: Vec<(String, Option<String>)>,
    pub worker_rlimit_nofile: Option<u64>,
    /// `worker_rlimit_core`: the workers' largest core file (`RLIMIT_CORE`), in bytes.
    pub worker_rlimit_core: Option<u64>,
    /// `worker_priority`: the workers' nice value, -20 (first) to 20. Default 0 (the master's).
    pub worker_priority: i32,
    /// `worker_cpu_affinity`: the CPUs each worker may run on. Default none (any CPU).
    pub worker_cpu_affinity: Option<CpuAffinity>,
    /// `working_directory`: the workers' current directory (where a core file is written).
    pub working_directory: Option<PathBuf>,
    /// `worker_shutdown_timeout`: how long a gracefully stopping worker may keep serving its
    /// open connections before it closes them. Default none (wait as long as they need).
    pub worker_shutdown_timeout_ms: Option<u64>,
    /// `daemon`: the master detaches from the terminal (fork, `setsid`, standard input and
    /// output to `/dev/null`) once its sockets and logs are open. Default on, as nginx; the
    /// embedded default configuration says `daemon off`.
    pub daemon: bool,
    /// `master_process`: off runs one worker loop in the process itself, without a master
    /// (nginx's single-process mode, for debugging). Default on.
    pub master_process: bool,
    /// `worker_shutdown_drain` (shard's own): how long a gracefully stopping worker keeps its
    /// idle keep-alive connections open, answering a request that arrives on one with
    /// `Connection: close`, before it closes those still idle. nginx closes them at once,
    /// failing a request the client sent at that moment. Default 5 s; 0 (`off`) is nginx's
    /// behaviour. Capped by `worker_shutdown_timeout`.
    pub worker_shutdown_drain_ms: u64,
    /// `user USER [GROUP]`: workers switch to these after the master opened what only root
    /// can open. `None` when not written; a master running as root then uses nginx's default,
    /// `nobody` (see `shard_server::privilege`).
    pub user: Option<User>,
    /// `worker_sandbox on|off`: each worker confines itself with Landlock and seccomp after
    /// start-up (beyond nginx). Default off.
    pub worker_sandbox: bool,
}

/// `worker_cpu_affinity`, as nginx reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CpuAffinity {
    /// One mask per worker, in order (bit 0 is CPU 0); the last one is used by the workers
    /// beyond the list.
    Masks(Vec<u64>),
    /// `auto [MASK]`: worker N is bound to the Nth CPU of the mask (default every CPU),
    /// wrapping around.
    Auto(Option<u64>),
}

impl CpuAffinity {
    /// The CPUs worker `idx` may run on; `online` is the set the master may run on (used by
    /// `auto` without a mask). `None`: no binding.
    pub fn for_worker(&self, idx: usize, online: u64) -> Option<u64> {
        match self {
            CpuAffinity::Masks(m) => m.get(idx).or(m.last()).copied(),
            CpuAffinity::Auto(mask) => {
                let set = mask.unwrap_or(online);
                let cpus: Vec<u32> = (0..64).filter(|c| set & (1u64 << c) != 0).collect();
                if cpus.is_empty() {
                    return None;
                }
                Some(1u64 << cpus[idx % cpus.len()])
            }
        }
    }
}

/// `gzip_disable`: the user agents (by regular expression, or nginx's `msie6` mask) whose
/// responses are not compressed.
#[derive(Debug, Clone, Default)]
pub struct GzipDisable {
    pub regexes: Vec<crate::Regex>,
    /// `msie6`: `MSIE 4`-`6` without `SV1` (nginx's fast check).
    pub msie6: bool,
}

impl PartialEq for GzipDisable {
    fn eq(&self, o: &Self) -> bool {
        self.msie6 == o.msie6
            && self.regexes.len() == o.regexes.len()
            && self
                .regexes
                .iter()
                .zip(&o.regexes)
                .all(|(a, b)| a.as_str() == b.as_str())
    }
}

impl Eq for GzipDisable {}

impl GzipDisable {
    /// Whether a request with this `User-Agent` is kept from compression.
    pub fn matches(&self, ua: &str) -> bool {
        if self.msie6 && is_msie6(ua.as_bytes()) {
            return true;
        }
        self.regexes.iter().any(|r| r.is_match(ua))
    }
}

/// nginx's `msie6` mask: `MSIE ` followed by `4.`, `5.` or `6.`, and no `SV1` (Windows XP SP2's
/// patched MSIE 6 handles compression).
fn is_msie6(ua: &[u8]) -> bool {
    let Some(i) = ua.windows(5).position(|w| w == b"MSIE ") else {
        return false;
    };
    let v = &ua[i + 5..];
    if v.len() < 2 || !matches!(v[0], b'4' | b'5' | b'6') || v[1] != b'.' {
        return false;
    }
    if v[0] == b'6' && ua.windows(3).any(|w| w == b"SV1") {
        return false;
    }
    true
}

/// The `user` directive as written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    pub name: String,
    /// `None`: a group named as the user, as nginx.
    pub group: Option<String>,
    pub place: Place,
}

#[derive(Debug, Clone)]
pub struct EventsConf {
    /// Default 512.
    pub worker_connections: usize,
    /// Default off (nginx >= 1.11.3).
    pub accept_mutex: bool,
    /// Default 500 ms.
    pub accept_mutex_delay_ms: u64,
    /// Default off.
    pub multi_accept: bool,
    /// shard's own: steer new connections away from a stalled worker's reuseport shard, and
    /// let its siblings drain it. Default on; `off` is nginx's behaviour.
    pub reuseport_steering: bool,
    /// shard's own: how long a worker's loop may not turn, with work waiting, before it is
    /// stalled. Default 20 ms.
    pub reuseport_stall_threshold_ms: u64,
    /// `debug_connection`: clients whose connections log at the debug level to every
    /// error log (nginx's `--with-debug` builds).
    pub debug_connection: Vec<DebugConnection>,
}

/// One `debug_connection` value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DebugConnection {
    /// An address or a CIDR block (a name was resolved to its addresses at load).
    Net(std::net::IpAddr, u8),
    /// `unix:`: every connection to a UNIX-domain listener.
    Unix,
}

impl DebugConnection {
    /// Whether a client at `peer` (`None`: a UNIX-domain socket) is one of these.
    pub fn matches(list: &[DebugConnection], peer: Option<std::net::IpAddr>) -> bool {
        list.iter().any(|d| match (d, peer) {
            (DebugConnection::Unix, None) => true,
            (DebugConnection::Net(base, bits), Some(ip)) => in_block(ip, *base, *bits),
            _ => false,
        })
    }
}

/// Whether `ip` is in the block `base/bits` (an IPv4-mapped IPv6 address counts as IPv4):
/// `allow`/`deny` and `debug_connection` both ask it.
fn in_block(ip: std::net::IpAddr, base: std::net::IpAddr, bits: u8) -> bool {
    use std::net::IpAddr;
    let ip = match ip {
        IpAddr::V6(v) => v.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    };
    match (ip, base) {
        (IpAddr::V4(a), IpAddr::V4(b)) => {
            let m = u32::MAX.checked_shl(32 - u32::from(bits)).unwrap_or(0);
            u32::from(a) & m == u32::from(b) & m
        }
        (IpAddr::V6(a), IpAddr::V6(b)) => {
            let m = u128::MAX.checked_shl(128 - u32::from(bits)).unwrap_or(0);
            u128::from(a) & m == u128::from(b) & m
        }
        _ => false,
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SoKeepalive {
    On,
    Off,
}

/// The socket-level options of one listening address. Two `listen` directives for the same
/// address must carry identical options, or only one of them may carry any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenOpts {
    pub reuseport: bool,
    /// Default 511 (nginx's NGX_LISTEN_BACKLOG on Linux).
    pub backlog: i32,
    /// `backlog=` was written. Without it, a socket systemd passed keeps the backlog its
    /// `.socket` unit gave it.
    pub backlog_set: bool,
    /// `ssl`: connections are TLS. As nginx, any `listen` of the address that says `ssl`
    /// makes the address TLS (it is not compared as the other options are).
    pub ssl: bool,
    /// `proxy_protocol`: every connection starts with a PROXY protocol header (v1 or v2),
    /// read before anything else (before the TLS handshake). OR-ed over the address's
    /// `listen`s, as `ssl`.
    pub proxy_protocol: bool,
    /// `http2` (the form before nginx 1.25.1): HTTP/2 on the address whatever its servers'
    /// `http2` say. OR-ed over the address's `listen`s, as `ssl`.
    pub http2: bool,
    pub rcvbuf: Option<usize>,
    pub sndbuf: Option<usize>,
    pub deferred: bool,
    pub bind: bool,
    /// Only meaningful for IPv6 addresses. Default on.
    pub ipv6only: bool,
    pub so_keepalive: Option<SoKeepalive>,
    /// `shards=N|auto` (with `reuseport`): how many `SO_REUSEPORT` sockets the master creates
    /// for the address. `None`: one per worker, as nginx.
    pub shards: Option<Shards>,
    /// `listen unix:PATH`: a Unix-domain socket (the listener's `addr` is then the stand-in
    /// [`unix_stand_in`] gives, which no inet listener can have).
    pub unix: Option<PathBuf>,
    /// `udp` (stream): a datagram socket; each client address is a session.
    pub udp: bool,
    /// `quic` (http): a datagram socket carrying QUIC and HTTP/3 (`udp` is set too, so the
    /// socket is made as a datagram one; a `quic` address is another listener than the TCP
    /// one of the same address and port).
    pub quic: bool,
}

/// The address a `listen unix:PATH` is known by where addresses are compared (merging,
/// reloads, binary upgrades): `[100::HASH]:0`, in the discard-only prefix (RFC 6666) with
/// port 0, which no `listen` of an inet address can name.
pub fn unix_stand_in(path: &std::path::Path) -> SocketAddr {
    use std::os::unix::ffi::OsStrExt;
    // FNV-1a, 64 bits: stable across processes and versions (a binary upgrade compares).
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in path.as_os_str().as_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    let seg = |i: u32| ((h >> (48 - 16 * i)) & 0xffff) as u16;
    SocketAddr::from((
        std::net::Ipv6Addr::new(0x100, 0, 0, 0, seg(0), seg(1), seg(2), seg(3)),
        0,
    ))
}

/// Whether `a` is a [`unix_stand_in`].
pub fn is_unix_stand_in(a: &SocketAddr) -> bool {
    matches!(a, SocketAddr::V6(v6) if v6.port() == 0 && v6.ip().segments()[..4] == [0x100, 0, 0, 0])
}

/// Upper bound of `shards=N`.
pub const MAX_SHARDS: usize = 1024;

/// The `shards=` parameter of `listen`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shards {
    /// CPUs available to the process / 8, at least 1 (the nginx-devel proposal's ratio).
    Auto,
    Count(usize),
}

impl Default for ListenOpts {
    fn default() -> Self {
        ListenOpts {
            reuseport: false,
            backlog: 511,
            backlog_set: false,
            ssl: false,
            proxy_protocol: false,
            http2: false,
            rcvbuf: None,
            sndbuf: None,
            deferred: false,
            bind: false,
            ipv6only: true,
            so_keepalive: None,
            shards: None,
            unix: None,
            udp: false,
            quic: false,
        }
    }
}

/// What a listener's connections are: HTTP requests or a `stream` TCP relay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListenerKind {
    Http,
    /// Index into `StreamConf::servers`.
    Stream {
        server: usize,
    },
}

/// One listening address after merging every `listen` that names it.
#[derive(Debug, Clone)]
pub struct Listener {
    pub addr: SocketAddr,
    pub opts: ListenOpts,
    pub kind: ListenerKind,
    /// Indices into `HttpConf::servers` of the servers listening here, in file order
    /// (empty for a stream listener).
    pub servers: Vec<usize>,
    /// Index into `HttpConf::servers`: the one marked `default_server`, else the first
    /// (0 and meaningless for a stream listener).
    pub default_server: usize,
    /// Where the options were given (or the first `listen` when none were).
    pub place: Place,
    /// The server names of `servers` by nginx's precedence (empty for a stream listener);
    /// the copies of a listener share one index.
    pub names: std::sync::Arc<crate::index::ServerIndex>,
}

impl Listener {
    /// HTTP/2 on this address: `listen ... http2`, or `http2 on` in its default server (for
    /// a plain connection, whose preface is read before a server is chosen) or in any of its
    /// servers (`any`: for TLS, whose ALPN is chosen before the request names its server).
    pub fn http2(&self, http: &HttpConf, any: bool) -> bool {
        let on = |i: usize| http.servers.get(i).is_some_and(|s| s.http2.on);
        self.opts.http2 || on(self.default_server) || (any && self.servers.iter().any(|&i| on(i)))
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerName {
    /// `example.com` (stored lowercase). Also `""` and `_`, which match nothing special.
    Exact(String),
    /// `*.example.com`: stored as the suffix `.example.com`; matches `a.example.com`, not `example.com`.
    WildcardPrefix(String),
    /// `www.example.*`: stored as the prefix `www.example.`.
    WildcardSuffix(String),
    /// `.example.com`: stored as `example.com`; matches `example.com` and `*.example.com`.
    Dot(String),
    /// `~^www\.(.+)$`: tried after the wildcards, in file order (case-insensitive, as host
    /// names are compared lowercase).
    Regex(NameRegex),
}

/// A server name's regular expression, compared by its text.
#[derive(Debug, Clone)]
pub struct NameRegex(pub crate::Regex);

impl PartialEq for NameRegex {
    fn eq(&self, other: &Self) -> bool {
        self.0.as_str() == other.0.as_str()
    }
}

impl Eq for NameRegex {}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LocationKind {
    /// `location /path`
    Prefix,
    /// `location = /path`
    Exact,
    /// `location ^~ /path`: a prefix match that, when longest, stops the search.
    PrefixNoRegex,
    /// `location ~ re` and `location ~* re` (case-insensitive): `LocationConf::regex`.
    Regex,
    /// `location @name`: only reached by `try_files` and `error_page`.
    Named,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Return {
    /// `444` closes the connection without a response, as nginx.
    pub code: u16,
    /// Body text for codes other than 301/302/303/307/308, the URL for those, as written.
    pub text: Option<String>,
    /// `text` split into literal text and variables (empty when `text` is `None`).
    pub parts: Vec<Part>,
}

/// nginx's non-standard code: close the connection without sending anything.
pub const CLOSE_WITHOUT_RESPONSE: u16 = 444;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusHandler {
    /// `stub_status`: nginx's text format.
    Stub,
    /// `shard_status`: JSON, or Prometheus text with `?format=prometheus`.
    Shard,
    /// `empty_gif`: nginx's 1x1 transparent GIF.
    EmptyGif,
}

/// One `access_log PATH [FORMAT [buffer=SIZE] [flush=TIME] [if=CONDITION]]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccessLog {
    /// The file (made absolute), or the template's text when `path_vars` is set.
    pub path: PathBuf,
    /// A path with variables (`access_log logs/$host.log`): rendered per line, the file
    /// opened by the worker for each line (nginx without `open_log_file_cache`).
    pub path_vars: Option<Vec<Part>>,
    pub format: std::sync::Arc<LogFormat>,
    /// `if=`: the line is written only when this comes out neither empty nor `0`.
    pub condition: Option<Vec<Part>>,
    /// `buffer=SIZE`: lines wait in memory up to this many bytes (and at most `flush=`, 1 s
    /// by default in shard); `None`: each line is written at once, as nginx without
    /// `buffer=`.
    pub buffer: Option<usize>,
    /// `flush=TIME`: a buffered line waits at most this long. Default 1 s.
    pub flush_ms: Option<u64>,
    /// `gzip[=LEVEL]`: each flush of the buffer is written as one gzip member (`zcat` reads
    /// the file whole), at this level.
    pub gzip: Option<u32>,
    /// `syslog:...` instead of a file (`path` is then the `syslog:...` text).
    pub syslog: Option<std::sync::Arc<Syslog>>,
}

/// A `log_format NAME [escape=...] STRING ...` (or the predefined `combined`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogFormat {
    pub name: String,
    pub escape: LogEscape,
    pub parts: Vec<Part>,
    /// A `$sent_http_NAME` is among the parts: the response head is kept for the line.
    pub reads_sent_http: bool,
}

impl LogFormat {
    pub fn new(name: String, escape: LogEscape, parts: Vec<Part>) -> LogFormat {
        let reads_sent_http = parts
            .iter()
            .any(|p| matches!(p, Part::Var(Var::SentHttp(_))));
        LogFormat {
            name,
            escape,
            parts,
            reads_sent_http,
        }
    }

    /// nginx's predefined format: `$remote_addr - $remote_user [$time_local] "$request"
    /// $status $body_bytes_sent "$http_referer" "$http_user_agent"`.
    pub const COMBINED: &'static str = "combined";
}

/// `log_format ... escape=`: how variable values are written into a line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogEscape {
    /// `"`, `\`, bytes below 0x20 and from 0x7f as `\xHH`; an empty value as `-`.
    #[default]
    Default,
    /// JSON string escapes; an empty value stays empty.
    Json,
    /// As they are; an empty value as `-`.
    None,
}

/// Everything a request needs once its location is chosen. The server-level defaults are a
/// `LocationConf` too (`ServerConf::base`) with `path = ""`, used when no location matches.
#[derive(Debug, Clone)]
pub struct LocationConf {
    /// `geoip_*` of the http block (`None` without any).
    pub geoip: Option<std::sync::Arc<GeoipConf>>,
    pub kind: LocationKind,
    /// The prefix, the exact path, the expression as written, or the name with its `@`.
    pub path: String,
    /// The compiled expression of a regex location.
    pub regex: Option<crate::Regex>,
    /// Index into `ServerConf::locations` of the location this one is nested in.
    pub parent: Option<usize>,
    pub place: Place,
    pub ret: Option<Return>,
    pub handler: Option<StatusHandler>,
    /// `flv`: a request with `start=N` (0 < N < size) gets the FLV header, then the file
    /// from byte N (nginx's `ngx_http_flv_module`; ranges apply to that body).
    pub flv: bool,
    /// Default `html` under the prefix. With variables (`root /srv/$host`), the part before the
    /// first variable (what a sandbox may open) and `doc_root_vars` holds the whole template.
    pub root: PathBuf,
    pub alias: Option<PathBuf>,
    /// The `alias` is inherited from the enclosing location with this path (nginx merges
    /// `alias` into a nested location that has neither `root` nor `alias`): that prefix is
    /// what the alias replaces.
    pub alias_from: Option<String>,
    /// `root` or `alias` (whichever this location has) with variables, made absolute against
    /// the prefix; rendered per request.
    pub doc_root_vars: Option<Vec<Part>>,
    /// Default `["index.html"]`.
    pub index: Vec<String>,
    /// `index` as templates, when any name has a variable (rendered per request).
    pub index_vars: Option<Vec<Vec<Part>>>,
    /// Default `text/plain`.
    pub default_type: String,
    /// Extension (lowercase, no dot) to MIME type. Default: the bundled `mime.types`.
    pub types: std::sync::Arc<MimeTypes>,
    /// Default 75 s; 0 disables keep-alive.
    pub keepalive_timeout_ms: u64,
    /// `keepalive_timeout`'s second parameter: a kept-alive response says `Keep-Alive:
    /// timeout=N` (seconds).
    pub keepalive_header: Option<u64>,
    /// Default 1000.
    pub keepalive_requests: u64,
    /// `keepalive_disable`: the browsers keep-alive is off for. Default `msie6`.
    pub keepalive_disable: KeepaliveDisable,
    /// `keepalive_time`: a connection that has lived this long closes after the request
    /// under way. Default 1 h.
    pub keepalive_time_ms: u64,
    /// Default 1 MiB; 0 means unlimited.
    pub client_max_body_size: u64,
    /// Default 60 s.
    pub send_timeout_ms: u64,
    /// `auth_delay`: a 401 from the access phase (`auth_basic`) waits this long before it
    /// is sent (against timing attacks on passwords). Default 0.
    pub auth_delay_ms: u64,
    /// `client_body_timeout`: the longest wait between two reads of a request body. Default
    /// 60 s; then 408.
    pub client_body_timeout_ms: u64,
    /// `http2_chunk_size`: the largest DATA frame of a response over HTTP/2. Default 8k.
    pub http2_chunk_size: usize,
    /// How a request body is kept: `client_body_buffer_size`, `client_body_temp_path`,
    /// `client_body_in_file_only`, `client_body_in_single_buffer`.
    pub body: BodyConf,
    /// `lingering_close`, `lingering_time`, `lingering_timeout`.
    pub lingering: Lingering,
    /// `disable_symlinks`. Default off.
    pub disable_symlinks: DisableSymlinks,
    /// Default off, as nginx.
    pub sendfile: bool,
    /// `open_file_cache` and its companions. Default off.
    pub open_file_cache: OpenFileCache,
    /// Default on.
    pub tcp_nodelay: bool,
    /// Every `access_log` of the level that set them (all are written); empty is
    /// `access_log off`. Default `logs/access.log combined` under the prefix.
    /// `error_log` of this location, its server or http (`None`: the main context's): the
    /// request's messages go there instead, as nginx's.
    pub error_logs: Option<std::sync::Arc<Vec<ErrorLog>>>,
    pub access_logs: Vec<AccessLog>,
    /// The `gzip*` directives.
    pub gzip: GzipConf,
    /// `add_header NAME VALUE [always]` of the level that set any (nginx's inheritance).
    pub add_headers: Vec<AddHeader>,
    /// `add_trailer`: fields sent after a chunked response's last chunk (HTTP/1.1).
    pub add_trailers: Vec<AddHeader>,
    /// `expires`. Default off.
    pub expires: Option<Expires>,
    /// `userid` and its `userid_*` settings (`None`: `userid off`).
    pub userid: Option<std::sync::Arc<UseridConf>>,
    /// `server_tokens on|off`: `Server: shard/VERSION` or `Server: shard`. Default on.
    pub server_tokens: bool,
    /// `allow` and `deny` of the level that set any, in order: the first that matches the
    /// client decides; none matching allows.
    pub access_rules: Vec<AccessRule>,
    /// `valid_referers` (with `server_names` expanded to the server's names).
    pub referers: Option<std::sync::Arc<Referers>>,
    /// `secure_link`, `secure_link_md5`, `secure_link_secret` (`$secure_link`).
    pub secure_link: Option<std::sync::Arc<SecureLink>>,
    /// `error_page`s of the level that set any.
    pub error_pages: Vec<ErrorPage>,
    /// `try_files` of this location (not inherited).
    pub try_files: Option<TryFiles>,
    /// A variable of `add_header` or an `access_log` format reads the upstream's response
    /// headers (`$upstream_http_*`, `$upstream_cookie_*`): a proxied request keeps them.
    pub upstream_vars: bool,
    /// A variable of `return`, `add_header`, `index` or an `access_log` (its format, unless
    /// `combined`, or its `if=`) reads the request's header lines, directly or through a
    /// `map`: the worker keeps the request head for it. Derived once the maps are known.
    pub needs_head: bool,
    /// `internal`: only internal redirects reach this location; a client's request gets 404.
    pub internal: bool,
    /// `absolute_redirect` (default on), `port_in_redirect` (on), `server_name_in_redirect`
    /// (off): how a redirect to a relative URL is written.
    pub absolute_redirect: bool,
    pub port_in_redirect: bool,
    pub server_name_in_redirect: bool,
    /// `if_modified_since`: how `If-Modified-Since` is compared. Default `exact`.
    pub if_modified_since: IfModifiedSince,
    /// `etag on|off`: static files carry an `ETag`. Default on.
    pub etag: bool,
    /// `open_log_file_cache`: descriptors of access logs with variables kept open.
    pub open_log_file_cache: Option<OpenLogCache>,
    /// `auth_basic REALM` with `auth_basic_user_file FILE`: HTTP Basic authentication in the
    /// access phase. `None`: off (or no user file).
    pub auth_basic: Option<std::sync::Arc<AuthBasic>>,
    /// `limit_rate RATE` (bytes per second, 0: off) and `limit_rate_after SIZE`: the response
    /// is sent no faster, after its first SIZE bytes. Either may be variables, rendered when
    /// the response starts (as nginx 1.17+); `set $limit_rate` and an upstream's
    /// `X-Accel-Limit-Rate` take precedence over `limit_rate`.
    pub limit_rate: SizeValue,
    pub limit_rate_after: SizeValue,
    /// `satisfy any`: the request passes when `allow`/`deny` or `auth_basic` lets it (`all`,
    /// the default: both must).
    pub satisfy_any: bool,
    /// `limit_except METHOD ... { ... }`: for other methods, the block's access rules and
    /// `auth_basic` (inherited from this location) decide instead.
    pub limit_except: Option<std::sync::Arc<LimitExcept>>,
    /// `autoindex`, `autoindex_exact_size`, `autoindex_format`, `autoindex_localtime` (each
    /// `None` where not written: off, on, html, off).
    pub autoindex: Autoindex,
    /// `log_not_found`: a missing file is logged at `error`. Default on.
    pub log_not_found: bool,
    /// `recursive_error_pages on`: the answer of an `error_page` may itself be replaced by an
    /// `error_page`. Default off.
    pub recursive_error_pages: bool,
    /// `random_index on`: a URI ending in `/` is answered with a random file of the directory
    /// (names starting with `.` excepted). Default off.
    pub random_index: bool,
    /// `msie_refresh on`: shard's own 301 and 302 answers to MSIE (a `User-Agent` with
    /// `MSIE `, not Opera) are a page that refreshes to the location, as nginx's.
    pub msie_refresh: bool,
    /// `slice SIZE` (`ngx_http_slice_filter_module`): a proxied answer is asked for in ranges
    /// of this size, each its own request (and cache entry), and joined; 0 is off.
    pub slice_size: u64,
    /// `max_ranges N`: a `Range` with more ranges is answered whole; 0 turns ranges off. Default
    /// unlimited.
    pub max_ranges: Option<u32>,
    /// `chunked_transfer_encoding`: an HTTP/1.1 response of unknown length is chunked; off, it is
    /// delimited by the connection's close instead. Default on.
    pub chunked_transfer_encoding: bool,
    /// `rewrite_log`: the rewrite module's regex matches and results are logged at `notice`. Default off.
    pub rewrite_log: bool,
    /// `charset`: added to the `Content-Type` of responses whose type is in `charset_types`
    /// and says no charset. Default off.
    pub charset: Option<String>,
    /// `auth_request URI`: the access phase asks this URI (a subrequest: 2xx lets the
    /// request through, 401 and 403 refuse it, anything else is a 500).
    pub auth_request: Option<String>,
    /// `auth_request_set $NAME VALUE`: variables set from the subrequest's answer (its
    /// `$upstream_http_*`, `$status`...), lowercase names.
    pub auth_request_set: Vec<(String, Vec<Part>)>,
    /// `charset_types`. Default nginx's: text/html, text/xml, text/plain, text/vnd.wap.wml,
    /// application/javascript, application/rss+xml.
    pub charset_types: Vec<String>,
    /// `sub_filter` and its companions.
    pub sub_filter: SubFilterConf,
    /// `ssi` and its companions, with `subrequest_output_buffer_size`.
    pub ssi: SsiConf,
    /// `add_before_body`, `add_after_body`, `addition_types`.
    pub addition: AdditionConf,
    /// `post_action URI | @name`: a request made once the response is done, its answer
    /// dropped (`None`: `off`, the default).
    pub post_action: Option<String>,
    /// `dav_methods`, `dav_access`, `create_full_put_path`, `min_delete_depth`.
    pub dav: DavConf,
    /// `mirror URI`: background subrequests of each main request, their answers dropped
    /// (empty: none, the default or `off`); `mirror_request_body` (default on): they carry
    /// its body.
    pub mirrors: Vec<String>,
    pub mirror_request_body: bool,
    /// `log_subrequest on`: subrequests are written to the access log too.
    pub log_subrequest: bool,
    /// `source_charset`: the charset of the files and of proxied responses that name none.
    pub source_charset: Option<String>,
    /// `override_charset on`: a proxied response's own charset is recoded to `charset` too.
    pub override_charset: bool,
    /// From `source_charset` to `charset` by a `charset_map` (single-byte charsets only):
    /// each byte's replacement. `None`: no recoding.
    pub recode: Option<std::sync::Arc<[u8; 256]>>,
    /// `set_real_ip_from`, `real_ip_header`, `real_ip_recursive`.
    pub real_ip: RealIp,
    /// `limit_req` of the level that set any; `limit_req_status`, `limit_req_log_level`.
    pub limit_req: Vec<LimitReq>,
    pub limit_req_status: u16,
    /// `limit_req_dry_run`, `limit_conn_dry_run`: count and log, never delay or refuse.
    pub limit_req_dry_run: bool,
    pub limit_conn_dry_run: bool,
    pub limit_req_log_level: LogLevel,
    /// `limit_conn` of the level that set any; `limit_conn_status`, `limit_conn_log_level`.
    pub limit_conn: Vec<LimitConn>,
    pub limit_conn_status: u16,
    pub limit_conn_log_level: LogLevel,
    /// The rewrite module's instructions of this location (`rewrite`, `set`, `if`, `return`,
    /// `break`), in order; empty when `ret` says everything (a location that only returns).
    pub script: Vec<Instr>,
    /// `proxy_pass`, only on the location that names it (not inherited). A location with
    /// `fastcgi_pass` has its upstream here too, and `fastcgi` says the wire format.
    pub proxy_pass: Option<ProxyPass>,
    /// The other `proxy_*` directives, inherited http -> server -> location. In a location with
    /// `fastcgi_pass`, the `fastcgi_*` directives of the same names (timeouts, buffers,
    /// `next_upstream`, `intercept_errors`, `hide_header`, `pass_header`) instead.
    pub proxy: ProxyConf,
    /// `fastcgi_pass`: the upstream speaks FastCGI (`ngx_http_fastcgi_module`). Only on the
    /// location that names it.
    pub fastcgi: Option<std::sync::Arc<FastcgiConf>>,
    /// `grpc_pass`: the upstream speaks HTTP/2 (`ngx_http_grpc_module`); `proxy` holds the
    /// `grpc_*` settings. Only on the location that names it.
    pub grpc: bool,
    /// `scgi_pass` / `uwsgi_pass`: the upstream speaks SCGI or uwsgi (the conf's `wire`),
    /// a head of params before the raw body, answered with a CGI-style or HTTP head and the
    /// body up to `Content-Length` or the close. Only on the location that names it.
    pub gateway: Option<std::sync::Arc<FastcgiConf>>,
    /// `resolver` with its `resolver_timeout`, inherited: names resolved at run time.
    pub resolver: Option<std::sync::Arc<ResolverConf>>,
}

/// A `limit_except` block: the methods it leaves alone, and what the others get.
#[derive(Debug, Clone)]
pub struct LimitExcept {
    /// Uppercase; `GET` brings `HEAD`, as nginx.
    pub methods: Vec<String>,
    /// A `proxy_pass` of the block: the location (index into the server's `locations`) a
    /// request of another method takes, its own with that `proxy_pass`.
    pub location: Option<usize>,
    pub access_rules: Vec<AccessRule>,
    pub auth_basic: Option<std::sync::Arc<AuthBasic>>,
}

/// `auth_basic` and its user file, read when the configuration is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthBasic {
    pub realm: String,
    pub file: PathBuf,
    /// `user:hash` lines (comments and empty lines left out), or why the file could not be
    /// read (each request is then a 500, as nginx's failed `open()`).
    pub users: Result<Vec<(String, String)>, String>,
    /// `auth_basic_user_file $var`: the file is rendered and read per request (a relative
    /// result is taken from the configuration's directory, as nginx); `users` is then unused.
    pub file_vars: Option<Vec<Part>>,
    pub conf_dir: PathBuf,
}

impl AuthBasic {
    /// The `user:hash` entries of a user file's text, as nginx reads them (`#` comments and
    /// empty lines skipped; what follows a second `:` ignored).
    pub fn parse_users(text: &str) -> Vec<(String, String)> {
        text.lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .filter_map(|l| {
                let (user, rest) = l.split_once(':')?;
                let hash = rest.split(':').next().unwrap_or("");
                Some((user.to_string(), hash.to_string()))
            })
            .collect()
    }
}

/// What FastCGI adds to the proxy's settings, for a location with `fastcgi_pass`; the same
/// for `scgi_pass` and `uwsgi_pass` (their `*_param`, `*_pass_request_*`, uwsgi's modifiers),
/// which use what applies to them.
#[derive(Debug, Clone)]
pub struct FastcgiConf {
    /// The wire format.
    pub wire: Wire,
    /// `uwsgi_modifier1` / `uwsgi_modifier2` (0..255, default 0): the packet header's bytes.
    pub modifier1: u8,
    pub modifier2: u8,
    /// `memcached_gzip_flag`: a value whose flags have these bits is gzip (0: none).
    pub gzip_flag: u32,
    /// `fastcgi_param NAME VALUE [if_not_empty]`, in order; a level with any replaces its
    /// parent's list, as nginx.
    pub params: Vec<FastcgiParam>,
    /// `fastcgi_index NAME`: appended to `$fastcgi_script_name` for a URI ending in `/`.
    pub index: Option<String>,
    /// `fastcgi_split_path_info REGEX`: its two captures are `$fastcgi_script_name` and
    /// `$fastcgi_path_info`.
    pub split_path_info: Option<crate::Regex>,
    /// `fastcgi_keep_conn on`: the application keeps the connection open after a response
    /// (pooled by the upstream's `keepalive`). Default off: it closes it.
    pub keep_conn: bool,
    /// `fastcgi_catch_stderr STRING`: a response whose stderr contains one of these is bad
    /// (`invalid_header`, then `fastcgi_next_upstream` or 502).
    pub catch_stderr: Vec<String>,
    /// `fastcgi_pass_request_headers on|off`: the client's headers go as `HTTP_*` params.
    pub pass_request_headers: bool,
    /// `fastcgi_pass_request_body on|off`.
    pub pass_request_body: bool,
}

/// `ngx_http_dav_module`'s settings of a location.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DavConf {
    /// `dav_methods`: the [`DavConf::PUT`] ... bits (0: `off`, the default).
    pub methods: u8,
    /// `dav_access`: the mode of the files and (with `x` added where `r` is) directories
    /// made (default `user:rw`, 0600).
    pub access: u32,
    /// `create_full_put_path on`: PUT makes the missing directories.
    pub create_full_put_path: bool,
    /// `min_delete_depth`: DELETE needs at least this many `/`-separated parts.
    pub min_delete_depth: u32,
}

impl DavConf {
    pub const PUT: u8 = 1;
    pub const DELETE: u8 = 2;
    pub const MKCOL: u8 = 4;
    pub const COPY: u8 = 8;
    pub const MOVE: u8 = 16;
}

impl Default for DavConf {
    fn default() -> Self {
        DavConf {
            methods: 0,
            access: 0o600,
            create_full_put_path: false,
            min_delete_depth: 0,
        }
    }
}

/// The wire format of a location that passes to an application server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Wire {
    /// `fastcgi_pass`: records (`shard_http::fastcgi`).
    #[default]
    Fastcgi,
    /// `scgi_pass`: a netstring of params, then the body.
    Scgi,
    /// `uwsgi_pass`: a 4-byte header and length-prefixed params, then the body.
    Uwsgi,
    /// `memcached_pass`: `get $memcached_key`, answered by `VALUE` and the data, or `END`.
    Memcached,
    /// `grpc_pass`: HTTP/2 as a client (`shard_http::grpc`), the request as the proxy's.
    Grpc,
}

impl Wire {
    /// nginx's name of the protocol, the scheme of the upstream in log lines.
    pub fn name(self) -> &'static str {
        match self {
            Wire::Fastcgi => "fastcgi",
            Wire::Scgi => "scgi",
            Wire::Uwsgi => "uwsgi",
            Wire::Memcached => "memcached",
            Wire::Grpc => "grpc",
        }
    }
}

/// One `fastcgi_param`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FastcgiParam {
    pub name: String,
    pub value: Vec<Part>,
    /// `if_not_empty`: not sent when the value is empty.
    pub if_not_empty: bool,
}

/// One instruction of nginx's rewrite module, run in order in the server (before the
/// location is chosen) and in the location.
#[derive(Debug, Clone)]
pub enum Instr {
    /// `return`: the request is answered (`444` closes).
    Return(Return),
    /// `rewrite REGEX REPLACEMENT [FLAG]` on the URI.
    Rewrite {
        regex: crate::Regex,
        replacement: Vec<Part>,
        flag: RewriteFlag,
        /// The replacement starts with `http://`, `https://` or `$scheme`: a redirect.
        redirect: bool,
    },
    /// `set $NAME VALUE`.
    Set { name: String, value: Vec<Part> },
    /// `if (CONDITION) { ... }`: the block's instructions, when the condition holds.
    If { cond: Cond, then: Vec<Instr> },
    /// `break`: no more rewrite instructions in this location.
    Break,
    /// `add_header` inside `if`: when the `if` holds, the response takes the `if`'s headers
    /// instead of the location's (nginx makes the `if` a location of its own).
    AddHeader(AddHeader),
    /// `proxy_pass` inside `if`: when the `if` holds, the request takes this location (an
    /// index into its server's `locations`): its own with that `proxy_pass`, as nginx makes
    /// the `if` a location of its own.
    Location(usize),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RewriteFlag {
    /// No flag: the next instructions run on the new URI; the location is searched anew
    /// at the end.
    None,
    /// `last`: stop here and search the location for the new URI.
    Last,
    /// `break`: stop here and serve the new URI in this location.
    Break,
    /// `redirect` (302), `permanent` (301).
    Redirect,
    Permanent,
}

/// An `if` condition.
#[derive(Debug, Clone)]
pub enum Cond {
    /// `($var)`: true unless empty or `0`.
    Value(Vec<Part>),
    /// `($var = text)`, `($var != text)`.
    Equal {
        left: Vec<Part>,
        right: Vec<Part>,
        negate: bool,
    },
    /// `($var ~ re)`, `~*`, `!~`, `!~*`.
    Match {
        left: Vec<Part>,
        regex: crate::Regex,
        negate: bool,
    },
    /// `(-f path)`, `-d`, `-e`, `-x`, and their `!` forms.
    File {
        test: FileTest,
        path: Vec<Part>,
        negate: bool,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileTest {
    /// `-f`: a regular file.
    File,
    /// `-d`: a directory.
    Dir,
    /// `-e`: anything.
    Exists,
    /// `-x`: an executable file.
    Executable,
}

/// The autoindex module's settings as written (inherited one by one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Autoindex {
    pub on: Option<bool>,
    pub exact_size: Option<bool>,
    pub format: Option<AutoindexFormat>,
    pub localtime: Option<bool>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AutoindexFormat {
    Html,
    Xml,
    Json,
    Jsonp,
}

/// `if_modified_since`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IfModifiedSince {
    /// The header is ignored.
    Off,
    /// Not modified when the time equals `Last-Modified`.
    Exact,
    /// Not modified when the time is `Last-Modified` or later.
    Before,
}

/// `keepalive_disable`: nginx's browser checks of the `User-Agent`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeepaliveDisable {
    /// MSIE 4 to 6 (not 6 with `SV1`), after a POST.
    pub msie6: bool,
    /// Safari on macOS.
    pub safari: bool,
}

/// `map SOURCE $NAME { ... }`.
#[derive(Debug, Clone)]
pub struct MapConf {
    /// The variable's name, without `$`.
    pub name: String,
    pub source: Vec<Part>,
    /// `hostnames`: keys may be `*.example.com`, `.example.com`, `www.example.*`.
    pub hostnames: bool,
    /// Exact keys (lowercase with `hostnames`), in file order.
    pub exact: Vec<(String, Vec<Part>)>,
    /// `~re` / `~*re` keys, tried in file order after the exact ones.
    pub regexes: Vec<(crate::Regex, Vec<Part>)>,
    /// `default`, else empty.
    pub default: Vec<Part>,
    /// `exact` indexed (with `hostnames`, its wildcard keys apart).
    pub index: crate::index::MapIndex,
    /// `split_clients SOURCE $NAME { ... }` instead of a `map`: the parts, each the upper
    /// bound (exclusive) of its share of MurmurHash2 values of the source, `0` for the
    /// share that takes the rest (`*`, or the one that reaches 100%); a hash beyond them
    /// all is the empty value. `exact`, `regexes` and `default` are empty.
    pub split: Option<Vec<(u32, Vec<Part>)>>,
    /// `geo [ADDRESS] $NAME { ... }` instead of a `map`: `source` renders the address (or,
    /// without one, the client address, a newline and `X-Forwarded-For`).
    pub geo: Option<Box<Geo>>,
}

/// A `geo` block: its table and the values its entries name.
#[derive(Debug, Clone)]
pub struct Geo {
    pub table: crate::index::GeoTable,
    pub values: Vec<Vec<Part>>,
    /// An address variable was written (`geo $arg_ip $g`); else the client's address is
    /// judged, through `proxy` and `X-Forwarded-For`.
    pub source_given: bool,
}

/// `limit_req_zone KEY zone=NAME:SIZE rate=RATE` or `limit_conn_zone KEY zone=NAME:SIZE`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitZone {
    pub name: String,
    pub key: Vec<Part>,
    /// Bytes of shared memory.
    pub size: usize,
    /// Requests per second, in thousandths (`1r/s` is 1000, `30r/m` is 500); `None` for a
    /// `limit_conn_zone`.
    pub rate_milli: Option<u64>,
    pub place: Place,
}

/// `limit_req zone=NAME [burst=N] [nodelay | delay=N]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitReq {
    /// Index into `HttpConf::limit_zones`.
    pub zone: usize,
    pub burst: u64,
    /// Requests up to this excess are not delayed (`nodelay`: all of the burst).
    pub delay: u64,
}

/// `limit_conn ZONE NUMBER`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitConn {
    pub zone: usize,
    pub max: u64,
}

/// One `error_page CODE ... [=[RESPONSE]] URI|@NAME|URL`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrorPage {
    pub codes: Vec<u16>,
    pub status: ErrorPageStatus,
    /// The URI (`/50x.html`), named location (`@fallback`) or URL, with variables.
    pub target: Vec<Part>,
}

/// What status an error page is sent with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorPageStatus {
    /// No `=`: the original error's (302 for a URL).
    Original,
    /// `=CODE`.
    Code(u16),
    /// `=` alone: whatever the target answers.
    Target,
}

/// `try_files FILE ... URI|=CODE|@NAME`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TryFiles {
    /// Tried in order under the root (or alias).
    pub files: Vec<TryFile>,
    pub last: TryLast,
}

/// One `try_files` candidate before the last parameter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TryFile {
    /// The name as written, less a trailing `/`.
    pub name: Vec<Part>,
    /// Written with a trailing `/` (`$uri/`): only a directory matches, else only a
    /// non-directory. Decided by the text, as nginx does, not by what a variable expands to:
    /// `$uri` with the URI `/` still wants a file.
    pub dir: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TryLast {
    /// An internal redirect to this URI (its `?` starts the new arguments).
    Uri(Vec<Part>),
    /// `@name`.
    Named(String),
    /// `=CODE`.
    Code(u16),
}

/// nginx's realip module: the client address taken from a header when the connection comes
/// from a trusted address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RealIp {
    /// `set_real_ip_from`: trusted networks (empty: the module is off).
    pub from: Vec<AccessRule>,
    /// `real_ip_header`, lowercase. Default `x-real-ip`.
    pub header: String,
    /// `real_ip_recursive`. Default off.
    pub recursive: bool,
}

impl Default for RealIp {
    fn default() -> Self {
        RealIp {
            from: Vec::new(),
            header: "x-real-ip".to_string(),
            recursive: false,
        }
    }
}

/// One `proxy_cookie_flags COOKIE FLAG ...` rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CookieFlags {
    pub cookie: CookieName,
    pub flags: Vec<CookieFlag>,
}

/// Which cookies a `proxy_cookie_flags` rule is for.
#[derive(Debug, Clone)]
pub enum CookieName {
    /// A name (variables allowed), compared without case.
    Name(Vec<Part>),
    /// `~REGEX` / `~*REGEX` over the name.
    Regex(crate::Regex),
}

impl PartialEq for CookieName {
    fn eq(&self, o: &Self) -> bool {
        match (self, o) {
            (CookieName::Name(a), CookieName::Name(b)) => a == b,
            (CookieName::Regex(a), CookieName::Regex(b)) => a.as_str() == b.as_str(),
            _ => false,
        }
    }
}

impl Eq for CookieName {}

/// What a `proxy_cookie_flags` flag does to a `Set-Cookie`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CookieFlag {
    Secure,
    NoSecure,
    HttpOnly,
    NoHttpOnly,
    /// `samesite` (no value), `samesite=strict|lax|none`: the attribute as written
    /// (`SameSite`, `SameSite=Strict`, ...), replacing one the cookie has.
    SameSite(&'static str),
    NoSameSite,
    /// A flag written with variables (`$arg_flag`): rendered per response, then read as one
    /// of the above (an empty or unknown value does nothing).
    Vars(Vec<Part>),
}

impl CookieFlag {
    /// A flag as written (without case): `secure`, `nosecure`, `httponly`, `nohttponly`,
    /// `samesite[=strict|lax|none]`, `nosamesite`.
    pub fn parse(text: &str) -> Option<CookieFlag> {
        Some(match text.to_ascii_lowercase().as_str() {
            "secure" => CookieFlag::Secure,
            "nosecure" => CookieFlag::NoSecure,
            "httponly" => CookieFlag::HttpOnly,
            "nohttponly" => CookieFlag::NoHttpOnly,
            "samesite" => CookieFlag::SameSite("SameSite"),
            "samesite=strict" => CookieFlag::SameSite("SameSite=Strict"),
            "samesite=lax" => CookieFlag::SameSite("SameSite=Lax"),
            "samesite=none" => CookieFlag::SameSite("SameSite=None"),
            "nosamesite" => CookieFlag::NoSameSite,
            _ => return None,
        })
    }
}

/// `ngx_http_secure_link_module`'s settings of a location, each inherited on its own.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SecureLink {
    /// `secure_link EXPRESSION`: `HASH[,EXPIRES]`, the hash in base64url.
    pub expr: Option<Vec<Part>>,
    /// `secure_link_md5 EXPRESSION`: what the hash must be the MD5 of.
    pub md5: Option<Vec<Part>>,
    /// `secure_link_secret WORD`: the older form, `/PREFIX/HEXHASH/LINK`.
    pub secret: Option<String>,
}

/// `valid_referers`: the `Referer` values `$invalid_referer` leaves empty.
#[derive(Debug, Clone, Default)]
pub struct Referers {
    /// `none`: no `Referer` header.
    pub none: bool,
    /// `blocked`: a `Referer` whose value a proxy or firewall removed (no `http://` or
    /// `https://`).
    pub blocked: bool,
    /// `server_names`: the server's names (added to the hosts once the server is known).
    pub server_names: bool,
    /// Host names (lowercase) to the URI prefix that must follow them ("" for any).
    pub exact: std::collections::HashMap<String, String>,
    /// `*.example.com`, `.example.com`, `www.example.*`, to an index into `wild_uris`.
    pub wild: crate::index::Wildcards,
    pub wild_uris: Vec<String>,
    /// `~REGEX` (without case), matched against the value after its scheme; and regular
    /// expression server names (`server_names`), against the host.
    pub regexes: Vec<crate::Regex>,
    pub host_regexes: Vec<crate::Regex>,
}

impl Referers {
    /// Adds a host (lowercase; wildcards as `server_name`'s) that must be followed by `uri`.
    pub fn add(&mut self, host: &str, uri: &str) {
        if self.wild.add_written(host, self.wild_uris.len()) {
            self.wild_uris.push(uri.to_string());
        } else {
            self.exact
                .entry(host.to_string())
                .or_insert_with(|| uri.to_string());
        }
    }

    /// nginx's `$invalid_referer` for this `Referer` value (`None`: no header): whether it
    /// is not one of these.
    pub fn invalid(&self, referer: Option<&str>) -> bool {
        if self.exact.is_empty()
            && self.wild.is_empty()
            && self.regexes.is_empty()
            && self.host_regexes.is_empty()
        {
            return false;
        }
        let Some(r) = referer else {
            return !self.none;
        };
        let lower = r.get(..8).map(str::to_ascii_lowercase).unwrap_or_default();
        let rest = if r.len() < "http://i.ru".len() {
            None
        } else if lower.starts_with("http://") {
            Some(&r[7..])
        } else if lower.starts_with("https://") {
            Some(&r[8..])
        } else {
            None
        };
        let Some(rest) = rest else {
            return !self.blocked;
        };
        let end = rest.find(['/', ':']).unwrap_or(rest.len());
        if end > 256 {
            return true;
        }
        let host = rest[..end].to_ascii_lowercase();
        let uri = self.exact.get(&host).map(String::as_str).or_else(|| {
            self.wild
                .leading(&host)
                .or_else(|| self.wild.trailing(&host))
                .map(|i| self.wild_uris[i].as_str())
        });
        if let Some(uri) = uri {
            // The URI part follows the port, if any.
            let path = rest[end..].find('/').map_or("", |i| &rest[end + i..]);
            return !path.starts_with(uri);
        }
        if self.host_regexes.iter().any(|re| re.is_match(&host)) {
            return false;
        }
        !self.regexes.iter().any(|re| re.is_match(rest))
    }
}

/// One `allow` or `deny`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AccessRule {
    pub allow: bool,
    /// The network (address and prefix length), `None` for `all` (and for `unix:`).
    pub net: Option<(std::net::IpAddr, u8)>,
    /// `unix:`: the rule is for clients of Unix-domain sockets only.
    pub unix: bool,
}

impl AccessRule {
    /// Whether `ip` is in this rule's network (an IPv4-mapped IPv6 client counts as IPv4).
    pub fn matches(&self, ip: std::net::IpAddr) -> bool {
        if self.unix {
            return false;
        }
        let Some((net, bits)) = self.net else {
            return true;
        };
        in_block(ip, net, bits)
    }

    /// [`AccessRule::matches`] for a client that may have no inet address (`None`: it came
    /// over a Unix-domain socket, which `unix:` and `all` match).
    pub fn matches_client(&self, ip: Option<std::net::IpAddr>) -> bool {
        match ip {
            Some(ip) => self.matches(ip),
            None => self.net.is_none(),
        }
    }
}

/// One `add_header NAME VALUE [always]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddHeader {
    pub name: String,
    pub value: Vec<Part>,
    /// Also on error responses (any status), not only on 200, 201, 204, 206, 301, 302, 303,
    /// 304, 307 and 308.
    pub always: bool,
}

/// `expires [modified] TIME | epoch | max`, or a variable (`expires $expires;`, h5bp) whose
/// value is read as those forms (`off` included) for each response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expires {
    Var(Vec<Part>),
    /// `Expires: Thu, 01 Jan 1970 00:00:01 GMT`, `Cache-Control: no-cache`.
    Epoch,
    /// `Expires: Thu, 31 Dec 2037 23:55:55 GMT`, `Cache-Control: max-age=315360000`.
    Max,
    /// Seconds after the request (or, `modified`, after the file's modification time); a
    /// negative value gives `Cache-Control: no-cache`.
    After {
        secs: i64,
        modified: bool,
    },
    /// `@TIME`: the next time the clock shows this time of day (seconds after midnight, in
    /// UTC, the time zone shard's clock and logs use).
    Daily(i64),
}

/// Where a request body that does not fit in memory goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BodyConf {
    /// `client_body_buffer_size`: body bytes kept in memory; a larger body is written to a
    /// temporary file. Default 8 KiB (nginx: two memory pages).
    pub buffer_size: usize,
    /// `client_body_temp_path`. Default `client_body_temp` under the prefix.
    pub temp_path: TempPath,
    /// `client_body_in_file_only`: every body goes to a named file, removed after the
    /// request (`clean`) or kept (`on`). Off, only a body larger than `buffer_size` goes to a
    /// file, one with no name (shard's own way: nothing is left behind by a crash).
    pub in_file_only: InFileOnly,
    /// `client_body_in_single_buffer`: accepted; shard's in-memory body is one buffer
    /// already, so it changes nothing.
    pub in_single_buffer: bool,
}

/// `client_body_in_file_only off|clean|on`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum InFileOnly {
    #[default]
    Off,
    Clean,
    On,
}

impl InFileOnly {
    /// Every body goes to a named file (`clean` or `on`).
    pub fn any(self) -> bool {
        self != InFileOnly::Off
    }
}

/// A temporary-file directory and its `levels` (nginx's `ngx_path_t`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TempPath {
    pub path: PathBuf,
    /// Digits per subdirectory level, at most three levels of 1 or 2 digits.
    pub levels: Vec<u8>,
}

impl TempPath {
    /// The path of temporary file number `n`: ten digits, under one directory per level named
    /// by the name's last digits, as nginx (`levels 1 2` puts `0000012345` in `5/34/`).
    pub fn file(&self, n: u64) -> PathBuf {
        let name = format!("{:010}", n % 10_000_000_000);
        let mut p = self.path.clone();
        let mut end = name.len();
        for &l in &self.levels {
            let l = usize::from(l);
            p.push(&name[end - l..end]);
            end -= l;
        }
        p.push(name);
        p
    }
}

/// `disable_symlinks off | on [from=PART] | if_not_owner [from=PART]`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DisableSymlinks {
    pub check: SymlinkCheck,
    /// The leading part of a file's path that is not checked; `None`: every component is.
    pub from: Option<SymlinksFrom>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SymlinkCheck {
    #[default]
    Off,
    /// Any symbolic link in the checked part refuses the file (403).
    On,
    /// A symbolic link is followed only when it and its target have the same owner.
    IfNotOwner,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SymlinksFrom {
    /// `from=$document_root`: the location's `root` or `alias`.
    DocumentRoot,
    Path(PathBuf),
}

/// `lingering_close off|on|always`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LingeringClose {
    Off,
    /// When the client may still be sending (unread input, a body not read to its end).
    On,
    Always,
}

/// How a connection that is closed (or a body that is discarded) keeps reading what the
/// client still sends, so the client sees the response rather than a reset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lingering {
    /// Default `on`.
    pub close: LingeringClose,
    /// `lingering_time`: the most time spent reading and discarding. Default 30 s.
    pub time_ms: u64,
    /// `lingering_timeout`: the longest wait for more client data. Default 5 s.
    pub timeout_ms: u64,
}

/// `proxy_pass http://NAME|HOST:PORT[/URI]` of one location.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyPass {
    /// Index into `HttpConf::upstreams` (a named block, or the implicit upstream of a host).
    pub upstream: usize,
    /// The URI part, when given (`proxy_pass http://b/x/` gives `Some("/x/")`): the part of
    /// the normalized request path that matched the location is replaced by it. `None` passes
    /// the request target as the client sent it.
    pub uri: Option<String>,
    /// `$proxy_host`: the upstream name, or `host[:port]` as written (port omitted when 80).
    pub proxy_host: String,
    /// `$proxy_port`: the port written, else the scheme's (80, or 443 for `https://`).
    pub proxy_port: u16,
    /// `proxy_pass https://...`: TLS to the upstream, set up by the location's `proxy_ssl_*`.
    pub tls: bool,
    /// `proxy_pass http://$backend...`: the URL with variables, rendered per request and its
    /// host resolved at run time (a named upstream, an address, or through `resolver`);
    /// `upstream` is then meaningless.
    pub dynamic: Option<Vec<Part>>,
}

/// `resolver ADDRESS ... [valid=TIME] [ipv4=on|off] [ipv6=on|off]` and `resolver_timeout`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolverConf {
    /// The servers, port 53 unless written; asked in turn.
    pub servers: Vec<SocketAddr>,
    /// `valid=`: how long an answer is kept, instead of its TTL.
    pub valid_ms: Option<u64>,
    pub ipv4: bool,
    pub ipv6: bool,
    /// `resolver_timeout`. Default 30 s.
    pub timeout_ms: u64,
}

/// One nginx variable (names as nginx's `ngx_http_core_module`, `..._proxy_module`,
/// `..._log_module` and `..._upstream_module` define them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Var {
    /// `$host`: the request's host (from the request line or `Host`), else the server name.
    Host,
    /// `$remote_addr`, `$remote_port`.
    RemoteAddr,
    RemotePort,
    /// `$binary_remote_addr`: the client address as 4 or 16 bytes (zone keys).
    BinaryRemoteAddr,
    /// `$remote_user`: the user of an `Authorization: Basic` header (verified or not).
    RemoteUser,
    /// `$server_addr`, `$server_port`, `$server_name`.
    ServerAddr,
    ServerPort,
    ServerName,
    /// `$server_protocol`: `HTTP/1.0` or `HTTP/1.1`.
    ServerProtocol,
    /// `$http2`: `h2`, `h2c` or empty.
    Http2,
    /// `$http3`: `h3` (or `hq`) on an HTTP/3 stream, else empty.
    Http3,
    /// `$scheme`: `https` on a TLS connection, else `http`.
    Scheme,
    /// `$https`: `on` on a TLS connection, else empty.
    Https,
    /// `$ssl_protocol` (`TLSv1.3`), `$ssl_cipher` (OpenSSL's name), `$ssl_server_name`
    /// (the SNI): empty on a plain connection.
    SslProtocol,
    SslCipher,
    SslServerName,
    /// `$ssl_client_verify` (`SUCCESS`, `FAILED:reason`, `NONE`), `$ssl_client_s_dn`,
    /// `$ssl_client_i_dn` (RFC 2253), `$ssl_client_serial` (hex), `$ssl_client_fingerprint`
    /// (SHA-1 of the certificate, hex): the client certificate (`ssl_verify_client`).
    SslClientVerify,
    SslClientSDn,
    SslClientIDn,
    SslClientSerial,
    SslClientFingerprint,
    /// `$ssl_client_s_dn_legacy`, `$ssl_client_i_dn_legacy`: OpenSSL's one-line form
    /// (`/C=US/O=x/CN=y`).
    SslClientSDnLegacy,
    SslClientIDnLegacy,
    /// `$ssl_client_raw_cert` (PEM), `$ssl_client_cert` (PEM, every line but the first
    /// after a tab), `$ssl_client_escaped_cert` (PEM, URL-encoded).
    SslClientRawCert,
    SslClientCert,
    SslClientEscapedCert,
    /// `$ssl_client_v_start`, `$ssl_client_v_end` (`Nov 24 12:00:00 2026 GMT`),
    /// `$ssl_client_v_remain` (whole days left).
    SslClientVStart,
    SslClientVEnd,
    SslClientVRemain,
    /// `$ssl_session_reused` (`r` or `.`), `$ssl_alpn_protocol`, `$ssl_curve` (the key
    /// exchange group, OpenSSL's name), `$ssl_early_data` (always empty: no 0-RTT).
    SslSessionReused,
    SslAlpnProtocol,
    SslCurve,
    SslEarlyData,
    /// `$ssl_session_id` (hex), `$ssl_ciphers` and `$ssl_curves` (what the client offered,
    /// OpenSSL's names joined by `:`, unknown ones as `0x` and hex).
    SslSessionId,
    SslCiphers,
    SslCurves,
    /// `$request_uri`: the target as received; `$uri` (`$document_uri`): the normalized path;
    /// `$args` (`$query_string`), `$is_args`.
    RequestUri,
    /// `$request_body`: the request body when it is in memory (for the upstream request a
    /// proxied location builds), else empty; `$request_body_file`: nginx's name of a body in a
    /// file, always empty in shard (its body files have no name, see `docs/directives.md`).
    RequestBody,
    RequestBodyFile,
    /// `$pipe`: `p` for a request that was already in the input behind the one before it
    /// (pipelined), else `.`.
    Pipe,
    Uri,
    Args,
    IsArgs,
    /// `$arg_NAME`: the first `NAME=` argument's value, as received (name compared without case).
    Arg(String),
    /// `$request`: the request line; `$request_method`.
    Request,
    RequestMethod,
    /// `$request_length`: bytes of the request head (and body, once read).
    RequestLength,
    /// `$content_type`, `$content_length`: the request's headers.
    ContentType,
    ContentLength,
    /// `$cookie_NAME`: the value of cookie NAME.
    Cookie(String),
    /// `$document_root`: the location's `root` (or `alias`); `$request_filename`: the file
    /// the URI maps to; `$realpath_root`: the root with symbolic links resolved.
    DocumentRoot,
    RealpathRoot,
    RequestFilename,
    /// `$fastcgi_script_name`, `$fastcgi_path_info`: the URI split by
    /// `fastcgi_split_path_info` (with `fastcgi_index` after a trailing `/`).
    FastcgiScriptName,
    FastcgiPathInfo,
    /// `$status`, `$body_bytes_sent`, `$bytes_sent` (head and body): the response's.
    Status,
    BodyBytesSent,
    BytesSent,
    /// `$request_time`: seconds since the request began, with milliseconds.
    RequestTime,
    /// `$msec`, `$time_local`, `$time_iso8601`: now.
    Msec,
    TimeLocal,
    /// `$date_gmt`, `$date_local` (`ngx_http_ssi_module`'s): now, in SSI's default `timefmt`
    /// (an SSI command formats them with its document's `config timefmt`).
    DateGmt,
    DateLocal,
    TimeIso8601,
    /// `$request_id`: 32 hex digits, unique per request.
    RequestId,
    /// `$invalid_referer`: `1` when the `Referer` is not one `valid_referers` names.
    InvalidReferer,
    /// `$secure_link`, `$secure_link_expires`.
    SecureLink,
    SecureLinkExpires,
    /// `$realip_remote_addr`, `$realip_remote_port`: the connection's own peer, before
    /// `set_real_ip_from` replaced `$remote_addr`.
    RealipRemoteAddr,
    RealipRemotePort,
    /// `$proxy_protocol_addr`, `_port`, `_server_addr`, `_server_port`: the PROXY protocol
    /// header's addresses (empty without one); `$proxy_protocol_tlv_NAME`: a v2 TLV.
    ProxyProtocolAddr,
    ProxyProtocolPort,
    ProxyProtocolServerAddr,
    ProxyProtocolServerPort,
    ProxyProtocolTlv(String),
    /// `$upstream_http_NAME` (lowercase, `_` standing for `-`): a header of the upstream's
    /// response, hidden ones too; `$upstream_cookie_NAME`: a cookie its `Set-Cookie` sets.
    UpstreamHttp(String),
    UpstreamCookie(String),
    /// `$limit_req_status` (`PASSED`, `DELAYED`, `REJECTED`, `DELAYED_DRY_RUN`,
    /// `REJECTED_DRY_RUN`) and `$limit_conn_status` (`PASSED`, `REJECTED`,
    /// `REJECTED_DRY_RUN`): what the limits decided; empty where none applied.
    LimitReqStatus,
    LimitConnStatus,
    /// `$connection` (serial number), `$connection_requests`, `$connection_time` (seconds
    /// since it was accepted, with milliseconds).
    Connection,
    ConnectionRequests,
    ConnectionTime,
    /// `$pid` (of the worker), `$hostname`, `$nginx_version` (shard's version).
    Pid,
    Hostname,
    /// `$limit_rate`: the response's rate (settable with `set`).
    LimitRate,
    /// `$connections_active`, `_reading`, `_writing`, `_waiting` (0..=3): stub_status's
    /// numbers.
    Connections(u8),
    NginxVersion,
    /// `$proxy_host`, `$proxy_port` (see [`ProxyPass`]).
    ProxyHost,
    ProxyPort,
    /// `$proxy_add_x_forwarded_for`: the client's `X-Forwarded-For` with `, $remote_addr`
    /// appended, or `$remote_addr` alone.
    ProxyAddXForwardedFor,
    /// `$upstream_addr`, `$upstream_status`, `$upstream_response_time`,
    /// `$upstream_connect_time`, `$upstream_header_time`: one entry per peer tried, joined
    /// with `, ` as nginx.
    UpstreamAddr,
    UpstreamStatus,
    UpstreamResponseTime,
    UpstreamConnectTime,
    UpstreamHeaderTime,
    /// `$upstream_response_length`: body bytes from each peer tried, as `$upstream_status`.
    UpstreamResponseLength,
    /// `$upstream_cache_status`: `MISS`, `BYPASS`, `EXPIRED`, `STALE`, `UPDATING`,
    /// `REVALIDATED` or `HIT`; empty without a cache.
    UpstreamCacheStatus,
    /// `$slice_range` (`ngx_http_slice_filter_module`): the range of the slice being asked
    /// for, `bytes=START-END`; empty outside a location with `slice`.
    SliceRange,
    /// `$NAME` set by `set` or defined by `map` (resolved by name when the request runs; the
    /// parse checked that something declares it).
    User(String),
    /// `$http_NAME`: the request header NAME (lowercase, `_` standing for `-`); every value of
    /// a repeated header joined with `, `.
    Http(String),
    /// `$0`..`$9`: a capture of the last regular expression that matched (a regex location).
    Capture(u8),
    /// `$sent_http_NAME`: a header of the response (only those shard writes itself:
    /// `content_type`, `content_length`, `location`, `last_modified`, `etag`,
    /// `content_encoding`, `connection`, `cache_control`, `expires`).
    SentHttp(String),
    /// `$geoip_*` (`geoip_country`, `geoip_city`, `geoip_org`).
    Geoip(GeoipVar),
    /// `$sent_trailer_NAME`: a trailer `add_trailer` made before this one (lowercase, `-`).
    SentTrailer(String),
    /// The stream module's own (`ngx_stream_core_module`, `ngx_stream_upstream_module`):
    /// `$protocol` (`TCP`), `$bytes_received` (from the client), `$session_time` (seconds
    /// with milliseconds), `$upstream_bytes_sent`, `$upstream_bytes_received` (in http: per
    /// peer tried, as `$upstream_status`), `$upstream_session_time`,
    /// `$upstream_first_byte_time`. The others are empty in http.
    Protocol,
    BytesReceived,
    SessionTime,
    UpstreamBytesSent,
    UpstreamBytesReceived,
    UpstreamSessionTime,
    UpstreamFirstByteTime,
    /// `$ssl_preread_protocol`, `$ssl_preread_server_name`, `$ssl_preread_alpn_protocols`:
    /// what the client's TLS ClientHello offered (stream `ssl_preread on`).
    SslPrereadProtocol,
    SslPrereadServerName,
    SslPrereadAlpnProtocols,
}

impl Var {
    /// Whether the variable reads the request's header lines (the worker must then keep the
    /// request head for it).
    pub fn reads_headers(&self) -> bool {
        matches!(
            self,
            Var::Http(_)
                | Var::Cookie(_)
                | Var::RemoteUser
                | Var::ContentType
                | Var::ContentLength
                | Var::RequestLength
                | Var::ProxyAddXForwardedFor
                // `geoip_proxy` reads `X-Forwarded-For`.
                | Var::Geoip(_)
        )
    }
}

/// Whether `parts` read the request's header lines, directly or through a `map` of `maps`
/// they name (whose source or any value may, through further maps).
pub fn parts_read_headers(parts: &[Part], maps: &[MapConf]) -> bool {
    fn walk(parts: &[Part], maps: &[MapConf], seen: &mut Vec<usize>) -> bool {
        parts.iter().any(|p| match p {
            Part::Lit(_) => false,
            Part::Var(Var::User(name)) => {
                let Some(i) = maps.iter().position(|m| &m.name == name) else {
                    return false;
                };
                if seen.contains(&i) {
                    return false;
                }
                seen.push(i);
                let m = &maps[i];
                walk(&m.source, maps, seen)
                    || walk(&m.default, maps, seen)
                    || m.exact.iter().any(|(_, v)| walk(v, maps, seen))
                    || m.regexes.iter().any(|(_, v)| walk(v, maps, seen))
            }
            Part::Var(v) => v.reads_headers(),
        })
    }
    walk(parts, maps, &mut Vec::new())
}

/// `open_log_file_cache max=N inactive=T min_uses=N valid=T`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenLogCache {
    /// Most descriptors (and paths counted) per worker; the least recently used goes.
    pub max: usize,
    /// A path not written for this long is forgotten. Default 10 s.
    pub inactive_ms: u64,
    /// Lines written within `inactive` before the descriptor is kept. Default 1.
    pub min_uses: u32,
    /// A kept descriptor is opened anew after this long. Default 60 s.
    pub valid_ms: u64,
}

/// A size written literally or with variables (`limit_rate $arg_rate`), the latter rendered
/// per request and read as nginx's `ngx_parse_size` reads a size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SizeValue {
    Fixed(u64),
    Vars(Vec<Part>),
}

impl SizeValue {
    /// Nothing to render, and zero.
    pub fn is_zero(&self) -> bool {
        *self == SizeValue::Fixed(0)
    }
}

/// A `proxy_set_header` value: literal text and variables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Part {
    Lit(String),
    Var(Var),
}

impl Var {
    /// A connection's TLS variable by its (lowercase) name: `$ssl_protocol`, `$ssl_cipher`,
    /// `$ssl_client_*`, ... (http and stream share them).
    pub fn tls(name: &str) -> Option<Var> {
        Some(match name {
            "ssl_protocol" => Var::SslProtocol,
            "ssl_cipher" => Var::SslCipher,
            "ssl_server_name" => Var::SslServerName,
            "ssl_session_reused" => Var::SslSessionReused,
            "ssl_alpn_protocol" => Var::SslAlpnProtocol,
            "ssl_curve" => Var::SslCurve,
            "ssl_session_id" => Var::SslSessionId,
            "ssl_ciphers" => Var::SslCiphers,
            "ssl_curves" => Var::SslCurves,
            "ssl_client_verify" => Var::SslClientVerify,
            "ssl_client_s_dn" => Var::SslClientSDn,
            "ssl_client_i_dn" => Var::SslClientIDn,
            "ssl_client_serial" => Var::SslClientSerial,
            "ssl_client_fingerprint" => Var::SslClientFingerprint,
            "ssl_client_s_dn_legacy" => Var::SslClientSDnLegacy,
            "ssl_client_i_dn_legacy" => Var::SslClientIDnLegacy,
            "ssl_client_raw_cert" => Var::SslClientRawCert,
            "ssl_client_cert" => Var::SslClientCert,
            "ssl_client_escaped_cert" => Var::SslClientEscapedCert,
            "ssl_client_v_start" => Var::SslClientVStart,
            "ssl_client_v_end" => Var::SslClientVEnd,
            "ssl_client_v_remain" => Var::SslClientVRemain,
            _ => return None,
        })
    }

    /// Whether this is one of the variables [`Var::tls`] names.
    pub fn is_tls(&self) -> bool {
        matches!(
            self,
            Var::SslProtocol
                | Var::SslCipher
                | Var::SslServerName
                | Var::SslSessionReused
                | Var::SslAlpnProtocol
                | Var::SslCurve
                | Var::SslSessionId
                | Var::SslCiphers
                | Var::SslCurves
                | Var::SslClientVerify
                | Var::SslClientSDn
                | Var::SslClientIDn
                | Var::SslClientSerial
                | Var::SslClientFingerprint
                | Var::SslClientSDnLegacy
                | Var::SslClientIDnLegacy
                | Var::SslClientRawCert
                | Var::SslClientCert
                | Var::SslClientEscapedCert
                | Var::SslClientVStart
                | Var::SslClientVEnd
                | Var::SslClientVRemain
        )
    }
}

/// Which failures send a request to the next upstream peer (`proxy_next_upstream`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NextUpstream {
    pub error: bool,
    pub timeout: bool,
    pub invalid_header: bool,
    /// `http_500`, `http_502`, ...: the statuses that are retried.
    pub statuses: &'static [u16],
    /// Retry also POST, LOCK and PATCH (`non_idempotent`).
    pub non_idempotent: bool,
}

impl NextUpstream {
    /// nginx's default: `error timeout`.
    pub const DEFAULT: NextUpstream = NextUpstream {
        error: true,
        timeout: true,
        invalid_header: false,
        statuses: &[],
        non_idempotent: false,
    };
    pub const OFF: NextUpstream = NextUpstream {
        error: false,
        timeout: false,
        invalid_header: false,
        statuses: &[],
        non_idempotent: false,
    };
    pub fn retries_status(&self, status: u16) -> bool {
        self.statuses.contains(&status)
    }
}

/// The `proxy_*` settings of a location (nginx's `ngx_http_proxy_module`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyConf {
    /// `proxy_set_header NAME VALUE`, in order, after nginx's defaults were merged in: `Host
    /// $proxy_host` and `Connection close` unless set. An empty value removes the header.
    /// As nginx, a level that sets any header does not inherit its parent's list.
    pub set_headers: Vec<(String, Vec<Part>)>,
    /// `proxy_http_version 1.0|1.1`: the minor version. Default 0, as nginx.
    pub http_version_minor: u8,
    /// `proxy_connect_timeout`, `proxy_read_timeout`, `proxy_send_timeout`. Default 60 s each.
    pub connect_timeout_ms: u64,
    pub read_timeout_ms: u64,
    pub send_timeout_ms: u64,
    /// `proxy_next_upstream`. Default `error timeout`.
    pub next_upstream: NextUpstream,
    /// `proxy_next_upstream_tries`: most peers tried per request, 0 = no limit. Default 0.
    pub next_upstream_tries: u32,
    /// `proxy_next_upstream_timeout`: no new attempt once this long has passed since the
    /// first began, 0 = no limit. Default 0.
    pub next_upstream_timeout_ms: u64,
    /// `proxy_socket_keepalive on|off`: `SO_KEEPALIVE` on upstream sockets. Default off.
    pub socket_keepalive: bool,
    /// `proxy_ignore_client_abort on|off` (and `fastcgi_`, `scgi_`, `uwsgi_`): a client that
    /// closes before the response head does not end the upstream's request. Default off:
    /// it does, logged with 499.
    pub ignore_client_abort: bool,
    /// `proxy_limit_rate`: bytes per second the upstream's response is read at (with
    /// buffering on), 0 = no limit. Default 0.
    pub limit_rate: u64,
    /// `proxy_ignore_headers X-Accel-Redirect`: an upstream's `X-Accel-Redirect` is passed
    /// over (hidden) instead of followed. Default off.
    pub ignore_accel_redirect: bool,
    /// `proxy_buffering on|off`. Default on.
    pub buffering: bool,
    /// `proxy_buffer_size`: the largest upstream response head, and the whole response
    /// buffer when buffering is off. Default 4 KiB (nginx: one memory page).
    pub buffer_size: usize,
    /// `proxy_buffers NUMBER SIZE`: with buffering on, the response buffer holds
    /// `buffer_size + NUMBER * SIZE` bytes. Default 8 x 4 KiB.
    pub buffers: (usize, usize),
    /// `proxy_request_buffering on|off`: read the whole request body before the upstream
    /// sees the request (default), or send it as it arrives.
    pub request_buffering: bool,
    /// `proxy_intercept_errors on|off`: an upstream's response of 300 or more for which the
    /// location has an `error_page` is replaced by that page. Default off.
    pub intercept_errors: bool,
    /// `proxy_force_ranges on|off`: byte ranges of uncached answers too, whatever their
    /// `Accept-Ranges` (default off: a cached location's only).
    pub force_ranges: bool,
    /// `proxy_method`: the method sent upstream instead of the client's.
    pub method: Option<Vec<Part>>,
    /// `proxy_pass_request_headers on|off`: the client's headers go upstream. Default on.
    pub pass_request_headers: bool,
    /// `proxy_pass_request_body on|off`: the client's body goes upstream. Default on.
    pub pass_request_body: bool,
    /// `proxy_set_body VALUE`: the body sent upstream instead of the client's.
    pub set_body: Option<Vec<Part>>,
    /// `proxy_hide_header`: more upstream headers not passed (lowercase).
    pub hide_headers: Vec<String>,
    /// `proxy_pass_header`: headers hidden by default (`Server`, `Date`, `X-Pad`, `X-Accel-*`)
    /// that are passed after all (lowercase).
    pub pass_headers: Vec<String>,
    /// `proxy_redirect`: how an upstream's `Location` and `Refresh` are rewritten.
    pub redirect: ProxyRedirect,
    /// `proxy_cookie_domain FROM TO` pairs, in order (empty: off): a `Set-Cookie`'s
    /// `domain=` equal to FROM (without case, a leading dot kept) becomes TO.
    pub cookie_domain: Vec<RewriteRule>,
    /// `proxy_cookie_path FROM TO` pairs, in order (empty: off): a `Set-Cookie`'s `path=`
    /// starting with FROM gets TO instead of that prefix.
    pub cookie_path: Vec<RewriteRule>,
    /// `proxy_cookie_flags`: the first rule whose cookie matches edits its flags.
    pub cookie_flags: Vec<CookieFlags>,
    /// `proxy_bind` / `fastcgi_bind`: the local address (variables allowed) connections to
    /// the upstream are made from. `None`: `off`, the kernel chooses.
    pub bind: Option<Vec<Part>>,
    /// `proxy_bind ... transparent`: the address may be foreign (`IP_TRANSPARENT`; the
    /// workers keep `CAP_NET_RAW` for it, as nginx's).
    pub bind_transparent: bool,
    /// `proxy_ssl_*`: TLS to an `https://` upstream.
    pub ssl: ProxySsl,
    /// `proxy_store on | STRING` (`None`: `off`, the default): 200 answers to `GET` saved as
    /// files; `proxy_store_access` their mode (default `user:rw`, 0600).
    pub store: Option<Store>,
    pub store_access: u32,
    /// `proxy_ignore_headers`: the upstream fields not acted on ([`ignore`] bits).
    pub ignore_headers: u16,
    /// `proxy_cache*`, `proxy_no_cache` (and `fastcgi_cache*` for FastCGI).
    pub cache: CacheConf,
}

/// Bits of `proxy_ignore_headers` / `fastcgi_ignore_headers`.
pub mod ignore {
    pub const X_ACCEL_REDIRECT: u16 = 1;
    pub const X_ACCEL_EXPIRES: u16 = 1 << 1;
    pub const X_ACCEL_LIMIT_RATE: u16 = 1 << 2;
    pub const X_ACCEL_BUFFERING: u16 = 1 << 3;
    pub const X_ACCEL_CHARSET: u16 = 1 << 4;
    pub const EXPIRES: u16 = 1 << 5;
    pub const CACHE_CONTROL: u16 = 1 << 6;
    pub const SET_COOKIE: u16 = 1 << 7;
    pub const VARY: u16 = 1 << 8;
    /// nginx's field names, in the order of the bits above.
    pub const FIELDS: [&str; 9] = [
        "X-Accel-Redirect",
        "X-Accel-Expires",
        "X-Accel-Limit-Rate",
        "X-Accel-Buffering",
        "X-Accel-Charset",
        "Expires",
        "Cache-Control",
        "Set-Cookie",
        "Vary",
    ];
}

/// `proxy_cache_path` / `fastcgi_cache_path`: a cache directory and its keys zone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CachePath {
    /// `keys_zone=NAME:SIZE`.
    pub name: String,
    pub zone_size: usize,
    pub path: PathBuf,
    /// `levels=1:2`: the lengths of the directory names taken from the key's hash, from its
    /// end (each 1 or 2, at most 3 levels). Empty: every file in `path`.
    pub levels: Vec<u8>,
    /// `inactive=TIME`: an entry not used for this long is removed. Default 10 minutes.
    pub inactive_secs: u64,
    /// `max_size=SIZE`: the manager keeps the files under this many bytes (0: no limit).
    pub max_size: u64,
    /// `min_free=SIZE`: the manager keeps this much free on the file system (0: no limit).
    pub min_free: u64,
    /// `use_temp_path=on|off` (checked; shard always writes beside the entry, see
    /// `docs/directives.md`).
    pub use_temp_path: bool,
    /// `manager_files=`, `manager_sleep=`, `manager_threshold=`: the manager removes at
    /// most this many files per pass, sleeps this long between passes, and a pass lasts at
    /// most this long. Defaults 100, 50 ms, 200 ms.
    pub manager_files: u64,
    pub manager_sleep_ms: u64,
    pub manager_threshold_ms: u64,
    /// `loader_files=`, `loader_sleep=`, `loader_threshold=` (the same, for the loader).
    pub loader_files: u64,
    pub loader_sleep_ms: u64,
    pub loader_threshold_ms: u64,
    pub place: Place,
}

/// Which cache a location uses.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum CacheSel {
    #[default]
    Off,
    /// Named in the configuration, resolved after the parse to [`CacheSel::Zone`].
    Named(String, Place),
    /// Index into `HttpConf::cache_paths`.
    Zone(usize),
    /// A value with variables, looked up by name per request (empty: no cache; an unknown
    /// name: a 500).
    Var(Vec<Part>),
}

/// `proxy_cache_valid [CODE ...|any] TIME`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheValid {
    /// Empty: `any`.
    pub codes: Vec<u16>,
    pub secs: u64,
}

/// `proxy_cache_use_stale` bits.
pub mod stale {
    pub const ERROR: u16 = 1;
    pub const TIMEOUT: u16 = 1 << 1;
    pub const INVALID_HEADER: u16 = 1 << 2;
    pub const UPDATING: u16 = 1 << 3;
    pub const HTTP_500: u16 = 1 << 4;
    pub const HTTP_502: u16 = 1 << 5;
    pub const HTTP_503: u16 = 1 << 6;
    pub const HTTP_504: u16 = 1 << 7;
    pub const HTTP_403: u16 = 1 << 8;
    pub const HTTP_404: u16 = 1 << 9;
    pub const HTTP_429: u16 = 1 << 10;
    /// The bit of an upstream status, if it has one.
    pub fn of_status(status: u16) -> u16 {
        match status {
            500 => HTTP_500,
            502 => HTTP_502,
            503 => HTTP_503,
            504 => HTTP_504,
            403 => HTTP_403,
            404 => HTTP_404,
            429 => HTTP_429,
            _ => 0,
        }
    }
}

/// The cache settings of a location (`ngx_http_proxy_module`'s `proxy_cache*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheConf {
    pub sel: CacheSel,
    /// `proxy_cache_key`; `None`: `$scheme$proxy_host$request_uri` (FastCGI has no default).
    pub key: Option<Vec<Part>>,
    pub valid: Vec<CacheValid>,
    /// `proxy_cache_methods`: also these methods besides GET and HEAD (upper case).
    pub methods: Vec<String>,
    /// `proxy_cache_min_uses`. Default 1.
    pub min_uses: u64,
    /// `proxy_cache_bypass` and `proxy_no_cache`: any value not empty and not `0` holds.
    pub bypass: Vec<Vec<Part>>,
    pub no_cache: Vec<Vec<Part>>,
    /// `proxy_cache_use_stale` ([`stale`] bits). Default off.
    pub use_stale: u16,
    pub background_update: bool,
    pub lock: bool,
    /// `proxy_cache_lock_timeout`, `proxy_cache_lock_age`. Default 5 s each.
    pub lock_timeout_ms: u64,
    pub lock_age_ms: u64,
    pub revalidate: bool,
    /// `proxy_cache_convert_head`. Default on (off for FastCGI, which has no such directive).
    pub convert_head: bool,
    /// `proxy_cache_max_range_offset`: a range starting beyond it is not cached.
    pub max_range_offset: Option<u64>,
    /// The key, `proxy_cache_bypass`, `proxy_no_cache` or a variable zone name read the
    /// request's header fields (set after the parse; otherwise they are rendered without).
    pub reads_head: bool,
}

impl Default for CacheConf {
    fn default() -> Self {
        CacheConf {
            sel: CacheSel::Off,
            key: None,
            valid: Vec::new(),
            methods: Vec::new(),
            min_uses: 1,
            bypass: Vec::new(),
            no_cache: Vec::new(),
            use_stale: 0,
            background_update: false,
            lock: false,
            lock_timeout_ms: 5000,
            lock_age_ms: 5000,
            revalidate: false,
            convert_head: true,
            max_range_offset: None,
            reads_head: false,
        }
    }
}

/// The `proxy_ssl_*` settings of a location: how shard speaks TLS to an `https://` upstream.
/// nginx's defaults: no verification, no SNI, sessions reused.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ProxySsl {
    /// `proxy_ssl_verify on|off`. Default off.
    pub verify: bool,
    /// `proxy_ssl_trusted_certificate FILE`: the CAs a verified upstream's chain must reach.
    pub trusted_certificate: Option<PathBuf>,
    /// `proxy_ssl_crl FILE`: revocation lists (PEM) the upstream's chain is checked against,
    /// one wanted for every certificate (OpenSSL's `X509_V_FLAG_CRL_CHECK_ALL`).
    pub crl: Option<PathBuf>,
    /// `proxy_ssl_server_name on|off`: send SNI. Default off.
    pub server_name: bool,
    /// `proxy_ssl_name NAME`: the name verified and sent as SNI; `None` is the `proxy_pass`
    /// host (`$proxy_host` without its port), nginx's default.
    pub name: Option<String>,
    /// The same with variables: rendered per request (per session in stream), its port
    /// dropped as nginx drops it.
    pub name_vars: Option<NameTpl>,
    /// `proxy_ssl_session_reuse on|off`. Default on.
    pub session_reuse: bool,
    /// `proxy_ssl_protocols`, nginx's names. Default `TLSv1 TLSv1.1 TLSv1.2 TLSv1.3`.
    pub protocols: Vec<String>,
    /// `proxy_ssl_ciphers`, an OpenSSL string (as `ssl_ciphers`). Default `DEFAULT`.
    pub ciphers: String,
    /// `proxy_ssl_certificate` and `proxy_ssl_certificate_key`: a client certificate.
    pub certificate: Option<PathBuf>,
    pub certificate_key: Option<PathBuf>,
    /// The same with variables: loaded per request (an empty one: no certificate).
    pub certificate_vars: Option<CertVars>,
    /// `proxy_ssl_password_file`: passphrases of an encrypted `proxy_ssl_certificate_key`.
    pub password_file: Option<PathBuf>,
    /// `proxy_ssl_conf_command NAME VALUE`, in order (as `ssl_conf_command`).
    pub conf_commands: Vec<(String, String)>,
    /// ALPN `h2` is offered (`grpc_pass grpcs://`, as nginx); not a directive.
    pub alpn_h2: bool,
}

impl ProxySsl {
    /// `proxy_ssl_conf_command Certificate FILE` and `PrivateKey FILE` (applied after the
    /// other `proxy_ssl_*` directives, as OpenSSL applies them): the client certificate and
    /// its key become these files.
    pub fn with_certificate_commands(mut self) -> Self {
        for (name, value) in &self.conf_commands {
            let cert = name.eq_ignore_ascii_case("Certificate");
            if !cert && !name.eq_ignore_ascii_case("PrivateKey") {
                continue;
            }
            let lit = vec![Part::Lit(value.clone())];
            if cert {
                self.certificate = Some(PathBuf::from(value));
            } else {
                self.certificate_key = Some(PathBuf::from(value));
            }
            if let Some(v) = &mut self.certificate_vars {
                if cert {
                    v.raw.0 = value.clone();
                    v.cert = lit;
                } else {
                    v.raw.1 = value.clone();
                    v.key = lit;
                }
            }
        }
        self
    }
}

impl Default for ProxySsl {
    fn default() -> Self {
        ProxySsl {
            verify: false,
            trusted_certificate: None,
            crl: None,
            server_name: false,
            name: None,
            name_vars: None,
            session_reuse: true,
            protocols: ["TLSv1", "TLSv1.1", "TLSv1.2", "TLSv1.3"]
                .map(String::from)
                .to_vec(),
            ciphers: "DEFAULT".to_string(),
            certificate: None,
            certificate_key: None,
            certificate_vars: None,
            password_file: None,
            conf_commands: Vec::new(),
            alpn_h2: false,
        }
    }
}

/// A value with variables (`proxy_ssl_name`): as written, which two configurations compare
/// by, and parsed.
#[derive(Debug, Clone)]
pub struct NameTpl {
    pub raw: String,
    pub parts: Vec<Part>,
}

impl PartialEq for NameTpl {
    fn eq(&self, o: &NameTpl) -> bool {
        self.raw == o.raw
    }
}

impl Eq for NameTpl {}

impl std::hash::Hash for NameTpl {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        self.raw.hash(h);
    }
}

/// `proxy_ssl_certificate` and `_key` with variables: the templates as written (which two
/// configurations compare by) and parsed, and the directory relative names are in.
#[derive(Debug, Clone)]
pub struct CertVars {
    pub raw: (String, String),
    pub cert: Vec<Part>,
    pub key: Vec<Part>,
    pub dir: PathBuf,
}

impl PartialEq for CertVars {
    fn eq(&self, o: &CertVars) -> bool {
        self.raw == o.raw && self.dir == o.dir
    }
}

impl Eq for CertVars {}

impl std::hash::Hash for CertVars {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        self.raw.hash(h);
        self.dir.hash(h);
    }
}

/// `proxy_redirect default | off | REDIRECT REPLACEMENT` (several pairs allowed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProxyRedirect {
    /// `http://PROXY_HOST[:PORT]/URI` of `proxy_pass` becomes the location's prefix.
    Default,
    Off,
    /// Rules tried in order (`default` among them where written so).
    Pairs(Vec<RewriteRule>),
}

/// One rule of `proxy_redirect`, `proxy_cookie_domain` or `proxy_cookie_path`: what it
/// matches and the replacement (variables, and a regular expression's `$1`..).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RewriteRule {
    pub from: RewriteFrom,
    pub to: Vec<Part>,
}

/// A rewrite rule's match side.
#[derive(Debug, Clone)]
pub enum RewriteFrom {
    /// Text (a prefix of `Location`/`path=`; the whole `domain=`).
    Text(String),
    /// Text with variables, rendered per response.
    Vars(Vec<Part>),
    /// `~REGEX` / `~*REGEX`: a match replaces the whole value.
    Regex(crate::Regex),
    /// `proxy_redirect default` among other rules.
    Default,
}

impl PartialEq for RewriteFrom {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (RewriteFrom::Text(a), RewriteFrom::Text(b)) => a == b,
            (RewriteFrom::Vars(a), RewriteFrom::Vars(b)) => a == b,
            (RewriteFrom::Regex(a), RewriteFrom::Regex(b)) => a.as_str() == b.as_str(),
            (RewriteFrom::Default, RewriteFrom::Default) => true,
            _ => false,
        }
    }
}

impl Eq for RewriteFrom {}

/// Where `proxy_store` saves a response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Store {
    /// `on`: the file `root` or `alias` maps the URI to.
    Mapped,
    /// A path with variables.
    Path(Vec<Part>),
}

impl Default for ProxyConf {
    fn default() -> Self {
        ProxyConf {
            set_headers: Vec::new(),
            http_version_minor: 0,
            connect_timeout_ms: 60_000,
            read_timeout_ms: 60_000,
            send_timeout_ms: 60_000,
            next_upstream: NextUpstream::DEFAULT,
            next_upstream_tries: 0,
            next_upstream_timeout_ms: 0,
            socket_keepalive: false,
            ignore_client_abort: false,
            limit_rate: 0,
            ignore_accel_redirect: false,
            buffering: true,
            buffer_size: 4096,
            buffers: (8, 4096),
            request_buffering: true,
            intercept_errors: false,
            force_ranges: false,
            method: None,
            pass_request_headers: true,
            pass_request_body: true,
            set_body: None,
            hide_headers: Vec::new(),
            pass_headers: Vec::new(),
            redirect: ProxyRedirect::Default,
            cookie_domain: Vec::new(),
            cookie_path: Vec::new(),
            cookie_flags: Vec::new(),
            bind: None,
            bind_transparent: false,
            ssl: ProxySsl::default(),
            store: None,
            store_access: 0o600,
            ignore_headers: 0,
            cache: CacheConf::default(),
        }
    }
}

/// nginx's `ngx_http_gzip_module` settings of one location.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GzipConf {
    /// `gzip on|off`. Default off.
    pub enabled: bool,
    /// `gzip_comp_level 1..9`. Default 1.
    pub comp_level: u32,
    /// `gzip_types`: lowercase MIME types, always including `text/html`. Default `text/html`.
    pub types: Vec<String>,
    /// `gzip_types *`: any type.
    pub any_type: bool,
    /// `gzip_min_length`: responses whose `Content-Length` is below this are sent as they are.
    /// Default 20.
    pub min_length: u64,
    /// `gzip_vary on|off`: `Vary: Accept-Encoding` on responses gzip applies to. Default off.
    pub vary: bool,
    /// `gzip_http_version 1.0|1.1`: the lowest HTTP/1.x minor version compressed. Default 1.
    pub http_version_minor: u8,
    /// `gzip_proxied`: for requests that came through a proxy (`Via`). Default off.
    pub proxied: GzipProxied,
    /// `gzip_static off|on|always` (`ngx_http_gzip_static_module`): serve `FILE.gz` when it
    /// exists (`on`: to clients that take gzip). Default off.
    pub static_mode: GzipStatic,
    /// `gzip_disable`: user agents whose responses are not compressed.
    pub disable: GzipDisable,
    /// `gunzip on|off` (`ngx_http_gunzip_module`): a gzip-encoded response (proxied, or a
    /// `gzip_static` file) is decompressed for a client that does not take gzip.
    pub gunzip: bool,
}

/// `gzip_static`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GzipStatic {
    #[default]
    Off,
    On,
    Always,
}

/// `gzip_proxied off | any | [expired] [no-cache] [no-store] [private] [no_last_modified]
/// [no_etag] [auth]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GzipProxied {
    pub any: bool,
    pub expired: bool,
    pub no_cache: bool,
    pub no_store: bool,
    pub private: bool,
    pub no_last_modified: bool,
    pub no_etag: bool,
    pub auth: bool,
}

impl Default for GzipConf {
    fn default() -> Self {
        GzipConf {
            enabled: false,
            comp_level: 1,
            types: vec!["text/html".to_string()],
            any_type: false,
            min_length: 20,
            vary: false,
            http_version_minor: 1,
            proxied: GzipProxied::default(),
            static_mode: GzipStatic::Off,
            disable: GzipDisable::default(),
            gunzip: false,
        }
    }
}

#[derive(Debug, Clone)]
pub struct ServerConf {
    pub place: Place,
    /// Addresses this server listens on (each appears in `Config::listeners`).
    /// A server with no `listen` listens on `*:80`, as nginx (as root) does.
    pub listen: Vec<SocketAddr>,
    pub server_names: Vec<ServerName>,
    /// `$server_name`: the first name as nginx keeps it (`*.example.com`, `www.example.*`,
    /// `example.com` for `.example.com`, `~REGEX` as written; lowercase otherwise; `""` for
    /// none).
    pub name: String,
    /// Default 60 s.
    pub client_header_timeout_ms: u64,
    /// Default 1 KiB.
    pub client_header_buffer_size: usize,
    /// Default 4 buffers of 8 KiB.
    pub large_client_header_buffers: (usize, usize),
    /// `underscores_in_headers`: a `_` in a header name is valid. Default off.
    pub underscores_in_headers: bool,
    /// `merge_slashes on|off`: `//` in a request path is one `/`. Default on. As nginx, the
    /// address's default server's value applies (the path is read before the server is
    /// chosen).
    pub merge_slashes: bool,
    /// `http2` and its settings of this server.
    pub http2: Http2Conf,
    /// `http3` and the `http3_*`/`quic_*` settings (for the server's `quic` addresses).
    pub http3: Http3Conf,
    /// `ignore_invalid_headers`: header lines with an invalid name are dropped (neither
    /// interpreted nor proxied). Default on.
    pub ignore_invalid_headers: bool,
    /// `ssl_*` directives (http, server): what a TLS listener of this server presents.
    pub ssl: SslConf,
    /// Server-level settings, used when no location matches.
    pub base: LocationConf,
    /// The rewrite module's instructions at the server level, run before a location is chosen.
    pub script: Vec<Instr>,
    /// In file order.
    pub locations: Vec<LocationConf>,
    /// `locations` indexed for nginx's search (built once the list is final).
    pub index: crate::index::LocationIndex,
}

/// One `ssl_certificate` with the `ssl_certificate_key` of the same rank.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertPair {
    /// As written when the pair has variables (then `vars` says how to render it).
    pub certificate: PathBuf,
    pub key: PathBuf,
    /// `ssl_certificate`/`_key` with variables (in this pair or another of the server's):
    /// rendered and loaded at each handshake, as nginx 1.15.9+.
    pub vars: Option<CertVars>,
    /// `ssl_password_file`: passphrases (one per line) tried on an encrypted key.
    pub password_file: Option<PathBuf>,
    /// `ssl_stapling on` with `ssl_stapling_file`: the DER OCSP response stapled.
    pub stapling_file: Option<PathBuf>,
    /// Where the `ssl_certificate` was written (errors name it).
    pub place: Place,
}

/// `ssl_session_cache`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionCache {
    /// `off`: clients are told no session can be reused.
    Off,
    /// `none` (nginx's default): sessions are not cached, but clients are not told so.
    None,
    /// `builtin[:N]`: a cache of this many sessions per worker.
    Cache(usize),
    /// `shared:NAME:SIZE` (with or without `builtin`): one cache in shared memory that every
    /// worker reads and writes, so a session resumes on any worker; servers naming the same
    /// zone share it, and it is kept across reloads while its name and size stay.
    Shared { name: String, bytes: usize },
}

/// The TLS settings of a server (`ssl_*`; nginx's `ngx_http_ssl_module`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SslConf {
    /// In order: the first pair the client's signature algorithms allow is presented.
    pub certificates: Vec<CertPair>,
    /// `ssl_protocols`, as written (`TLSv1.2`, `TLSv1.3`, ...). Default nginx 1.22's
    /// `TLSv1 TLSv1.1 TLSv1.2 TLSv1.3`; shard speaks TLSv1.2 and TLSv1.3 of them.
    pub protocols: Vec<String>,
    /// `ssl_ciphers`, an OpenSSL cipher string. Default `HIGH:!aNULL:!MD5`.
    pub ciphers: String,
    pub prefer_server_ciphers: bool,
    pub session_cache: SessionCache,
    /// Default 5 minutes.
    pub session_timeout_ms: u64,
    /// Default on.
    pub session_tickets: bool,
    /// `ssl_session_ticket_key FILE` (repeatable): the first file's bytes seed the ticket
    /// keys, so every shard given the same file (other machines too) resumes the same
    /// tickets. Empty: a seed the master makes at start.
    pub session_ticket_keys: Vec<PathBuf>,
    /// `ssl_verify_client`. Default off.
    pub verify_client: VerifyClient,
    /// `ssl_client_certificate FILE`: CAs that verify client certificates, and whose names
    /// are sent to the client.
    pub client_certificate: Option<PathBuf>,
    /// `ssl_trusted_certificate FILE`: more CAs that verify them, not sent.
    pub trusted_certificate: Option<PathBuf>,
    /// `ssl_crl FILE`: revocation lists (PEM) the client certificates are checked against;
    /// with one, every certificate of the chain needs its issuer's list, as OpenSSL's
    /// `X509_V_FLAG_CRL_CHECK_ALL` that nginx sets.
    pub crl: Option<PathBuf>,
    /// `ssl_verify_depth N`: the client certificate's chain, from it to a trusted CA, has at
    /// most `N` certificates above it (1: signed by a trusted CA itself). Default 1.
    pub verify_depth: u32,
    /// `ssl_reject_handshake on`: handshakes that reach this server (by SNI, or as the
    /// default) are refused; it needs no certificate. Default off.
    pub reject_handshake: bool,
    /// `ssl_password_file FILE`: passphrases of encrypted keys, one per line.
    pub password_file: Option<PathBuf>,
    /// `ssl_stapling on|off`. Default off.
    pub stapling: bool,
    /// `ssl_stapling_file FILE`: a DER OCSP response stapled to every handshake.
    pub stapling_file: Option<PathBuf>,
    /// `ssl_conf_command NAME VALUE`, in order (checked at parse time; applied over the other
    /// `ssl_*` settings, as OpenSSL applies them last).
    pub conf_commands: Vec<(String, String)>,
    /// `ssl_ecdh_curve`: OpenSSL's group list; empty is `auto` (rustls's defaults).
    pub ecdh_curve: String,
}

/// `ssl_verify_client on | off | optional | optional_no_ca`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum VerifyClient {
    #[default]
    Off,
    /// A verified certificate is required: none is nginx's 496, a bad one 495.
    On,
    /// One is asked for; a bad one is 495.
    Optional,
    /// One is asked for; one whose issuer is unknown passes (`$ssl_client_verify` says so).
    OptionalNoCa,
}

impl Default for SslConf {
    fn default() -> Self {
        SslConf {
            certificates: Vec::new(),
            protocols: ["TLSv1", "TLSv1.1", "TLSv1.2", "TLSv1.3"]
                .map(String::from)
                .to_vec(),
            ciphers: "HIGH:!aNULL:!MD5".into(),
            prefer_server_ciphers: false,
            session_cache: SessionCache::None,
            session_timeout_ms: 300_000,
            session_tickets: true,
            session_ticket_keys: Vec::new(),
            verify_client: VerifyClient::Off,
            client_certificate: None,
            trusted_certificate: None,
            crl: None,
            verify_depth: 1,
            reject_handshake: false,
            password_file: None,
            stapling: false,
            stapling_file: None,
            conf_commands: Vec::new(),
            ecdh_curve: String::new(),
        }
    }
}

/// `userid v1|on|log|off` (nginx's `ngx_http_userid_module`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UseridMode {
    Off,
    Log,
    V1,
    On,
}

/// A location's `userid` settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UseridConf {
    pub mode: UseridMode,
    /// `userid_name`. Default `uid`.
    pub name: String,
    /// `userid_domain` (`None`: none sent).
    pub domain: Option<String>,
    /// `userid_path`. Default `/`.
    pub path: String,
    /// `userid_expires`: `None` off (a session cookie), `Some(None)` max, else seconds.
    pub expires: Option<Option<u64>>,
    /// `userid_p3p` (`None`: none sent).
    pub p3p: Option<String>,
    /// `userid_service` (`None`: the server's address, or 0 for v1).
    pub service: Option<u32>,
    /// `userid_mark`: the character put in place of the cookie's first `=` (`None`: off).
    pub mark: Option<u8>,
    /// `userid_flags`: `secure`, `httponly`, `samesite=VALUE`.
    pub secure: bool,
    pub httponly: bool,
    pub samesite: Option<String>,
}

impl Default for UseridConf {
    fn default() -> Self {
        UseridConf {
            mode: UseridMode::Off,
            name: "uid".to_string(),
            domain: None,
            path: "/".to_string(),
            expires: None,
            p3p: None,
            service: None,
            mark: None,
            secure: false,
            httponly: false,
            samesite: None,
        }
    }
}

/// The `$geoip_*` variables.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GeoipVar {
    CountryCode,
    CountryCode3,
    CountryName,
    AreaCode,
    CityContinentCode,
    CityCountryCode,
    CityCountryCode3,
    CityCountryName,
    DmaCode,
    Latitude,
    Longitude,
    Region,
    RegionName,
    City,
    PostalCode,
    Org,
}

impl GeoipVar {
    /// The variable of a name after `geoip_`.
    pub fn by_name(name: &str) -> Option<GeoipVar> {
        use GeoipVar::*;
        Some(match name {
            "country_code" => CountryCode,
            "country_code3" => CountryCode3,
            "country_name" => CountryName,
            "area_code" => AreaCode,
            "city_continent_code" => CityContinentCode,
            "city_country_code" => CityCountryCode,
            "city_country_code3" => CityCountryCode3,
            "city_country_name" => CityCountryName,
            "dma_code" => DmaCode,
            "latitude" => Latitude,
            "longitude" => Longitude,
            "region" => Region,
            "region_name" => RegionName,
            "city" => City,
            "postal_code" => PostalCode,
            "org" => Org,
            _ => return None,
        })
    }
}

impl GeoipConf {
    /// Appends `$geoip_*`'s value for a client at `addr` (nothing without the database it
    /// reads, or when the address is not in it).
    pub fn push(&self, out: &mut Vec<u8>, var: GeoipVar, addr: std::net::IpAddr) {
        use crate::geoip as g;
        use GeoipVar::*;
        match var {
            CountryCode | CountryCode3 | CountryName => {
                let Some(id) = self.country.as_ref().and_then(|db| db.country(addr)) else {
                    return;
                };
                if id == 0 {
                    return;
                }
                out.extend_from_slice(match var {
                    CountryCode => g::country_code(id),
                    CountryCode3 => g::country_code3(id),
                    _ => g::country_name(id),
                });
            }
            Org => {
                if let Some(name) = self.org.as_ref().and_then(|db| db.org(addr)) {
                    out.extend_from_slice(name);
                }
            }
            _ => {
                let Some(c) = self.city.as_ref().and_then(|db| db.city(addr)) else {
                    return;
                };
                match var {
                    AreaCode => out.extend_from_slice(c.area_code.to_string().as_bytes()),
                    DmaCode => out.extend_from_slice(c.dma_code.to_string().as_bytes()),
                    CityContinentCode => out.extend_from_slice(g::continent(c.country)),
                    CityCountryCode => out.extend_from_slice(g::country_code(c.country)),
                    CityCountryCode3 => out.extend_from_slice(g::country_code3(c.country)),
                    CityCountryName => out.extend_from_slice(g::country_name(c.country)),
                    Latitude => out.extend_from_slice(format!("{:.4}", c.latitude).as_bytes()),
                    Longitude => out.extend_from_slice(format!("{:.4}", c.longitude).as_bytes()),
                    Region => out.extend_from_slice(c.region),
                    RegionName => {
                        let cc = g::country_code(c.country);
                        if let Some(n) = g::region_name(cc, c.region) {
                            out.extend_from_slice(n);
                        }
                    }
                    City => out.extend_from_slice(c.city),
                    PostalCode => out.extend_from_slice(c.postal),
                    _ => {}
                }
            }
        }
    }
}

/// `geoip_country`, `geoip_city`, `geoip_org` (http or stream), `geoip_proxy` and
/// `geoip_proxy_recursive` (http): the databases, read when the configuration is.
#[derive(Debug, Default)]
pub struct GeoipConf {
    pub country: Option<crate::geoip::Db>,
    pub city: Option<crate::geoip::Db>,
    pub org: Option<crate::geoip::Db>,
    /// `geoip_proxy`: requests from these take their address from `X-Forwarded-For`.
    pub proxies: Vec<AccessRule>,
    pub proxy_recursive: bool,
}

#[derive(Debug, Clone)]
pub struct HttpConf {
    pub servers: Vec<ServerConf>,
    /// `charset_map FROM TO { ... }` blocks, in file order.
    pub charset_maps: Vec<CharsetMap>,
    /// `map` blocks, by variable name.
    pub maps: Vec<MapConf>,
    /// `limit_req_zone` and `limit_conn_zone`, in file order (`LimitReq::zone` and
    /// `LimitConn::zone` index them).
    pub limit_zones: Vec<LimitZone>,
    /// `proxy_cache_path` and `fastcgi_cache_path`, in file order (`CacheSel::Zone` indexes
    /// them).
    pub cache_paths: Vec<CachePath>,
    /// Named `upstream` blocks of `http`, then one implicit upstream per distinct
    /// `proxy_pass http://HOST:PORT` (named by `HOST:PORT` as written).
    pub upstreams: Vec<UpstreamConf>,
}

impl HttpConf {
    /// Every `client_body_temp_path` in use, once each: the master creates them at start.
    pub fn client_body_temp_paths(&self) -> Vec<&TempPath> {
        let mut out: Vec<&TempPath> = Vec::new();
        for s in &self.servers {
            for l in std::iter::once(&s.base).chain(&s.locations) {
                if !out.contains(&&l.body.temp_path) {
                    out.push(&l.body.temp_path);
                }
            }
        }
        out
    }
}

/// The `stream` block (nginx's `ngx_stream_proxy_module` subset): TCP relays.
#[derive(Debug, Clone)]
pub struct StreamConf {
    /// Named `upstream` blocks, then one implicit upstream per `proxy_pass ADDR`.
    pub upstreams: Vec<UpstreamConf>,
    /// `geoip_*` of the stream block.
    pub geoip: Option<std::sync::Arc<GeoipConf>>,
    pub servers: Vec<StreamServerConf>,
    /// `map`, `split_clients` and `geo` of the stream block (their values have the stream's
    /// variables).
    pub maps: Vec<MapConf>,
    /// `limit_conn_zone`s of the stream block (shared memory after http's zones).
    pub limit_zones: Vec<LimitZone>,
}

/// One `upstream NAME { ... }` block (or the implicit upstream of `proxy_pass HOST:PORT`).
#[derive(Debug, Clone)]
pub struct UpstreamConf {
    /// The block's name, or the `proxy_pass` argument for an implicit upstream.
    pub name: String,
    pub place: Place,
    /// Primaries and backups in file order (`PeerConf::backup` tells them apart).
    pub peers: Vec<PeerConf>,
    /// `keepalive N` (http only): idle connections to this upstream each worker keeps.
    /// Default 0: no pool, a connection per request.
    pub keepalive: usize,
    /// `keepalive_timeout` (http only): how long an idle pooled connection is kept. Default 60 s.
    pub keepalive_timeout_ms: u64,
    /// `keepalive_requests` (http only): requests per pooled connection. Default 1000.
    pub keepalive_requests: u64,
    /// `keepalive_time` (http only): a pooled connection that has lived this long is closed
    /// instead of kept. Default 1 h.
    pub keepalive_time_ms: u64,
    /// How a peer is chosen. Default weighted round robin.
    pub balance: Balance,
    /// For `server ... resolve` peers: the http block's `resolver`.
    pub resolver: Option<std::sync::Arc<ResolverConf>>,
}

/// An upstream's balancing method.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Balance {
    /// nginx's smooth weighted round robin.
    #[default]
    RoundRobin,
    /// `least_conn`: the fewest active connections (per worker, as nginx without a `zone`)
    /// relative to weight; round robin among equals.
    LeastConn,
    /// `ip_hash`: the client's IPv4 /24 (or whole IPv6 address) chooses, as nginx.
    IpHash,
    /// `hash KEY [consistent]` (http).
    Hash { key: Vec<Part>, consistent: bool },
    /// `random [two [least_conn]]`: a peer drawn by weight; with `two`, two drawn and the
    /// one with fewer active connections (per worker) taken.
    Random { two: bool },
}

/// One address of an upstream `server` (a host name resolving to several addresses gives
/// one peer per address).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerConf {
    pub addr: SocketAddr,
    /// The `server` argument as written (shown in logs: nginx shows the address).
    pub name: String,
    /// Default 1.
    pub weight: u32,
    /// Default 1; 0 disables failure accounting.
    pub max_fails: u32,
    /// Default 10 s.
    pub fail_timeout_ms: u64,
    /// `max_conns=N`: at most N connections to this peer at once, in each worker (as nginx
    /// without a shared `zone`). Default 0: no limit.
    pub max_conns: u32,
    /// `server unix:/path` (http): the peer is this Unix-domain socket (`addr` is then
    /// `0.0.0.0:0` and unused).
    pub unix: Option<PathBuf>,
    pub backup: bool,
    pub down: bool,
    /// `server NAME resolve`: the name as written (`host:port`); workers resolve it again
    /// through the http block's `resolver` when its answer expires and replace this peer by
    /// one per address (this one is the template; `down` while the name had no answer at
    /// load).
    pub resolve: Option<String>,
}

#[derive(Debug, Clone)]
pub struct StreamServerConf {
    /// `ssl_*`: what a `listen ... ssl` of this server presents.
    pub ssl: SslConf,
    /// `proxy_ssl on` and its `proxy_ssl_*`: TLS to the upstream. `None`: plain TCP.
    pub proxy_ssl: Option<ProxySsl>,
    pub place: Place,
    pub listen: Vec<SocketAddr>,
    /// Index into `StreamConf::upstreams`.
    pub upstream: usize,
    /// `proxy_connect_timeout`. Default 60 s.
    pub connect_timeout_ms: u64,
    /// `proxy_timeout`: between two successive reads or writes. Default 10 min.
    pub timeout_ms: u64,
    /// `proxy_buffer_size`: each direction's buffer. Default 16 KiB.
    pub buffer_size: usize,
    /// `proxy_protocol on`: the upstream is sent a PROXY protocol v1 header first.
    pub proxy_protocol: bool,
    /// `proxy_protocol_timeout`: how long a `listen ... proxy_protocol` connection may take
    /// to send its header. Default 30 s.
    pub proxy_protocol_timeout_ms: u64,
    /// `proxy_next_upstream on|off`: a failed connect tries the next peer. Default on.
    pub next_upstream: bool,
    /// `proxy_next_upstream_tries`: at most this many peers per session (0: no limit), and
    /// `proxy_next_upstream_timeout`: no new peer once this long passed since the first
    /// connect began (0: no limit).
    pub next_upstream_tries: u32,
    pub next_upstream_timeout_ms: u64,
    /// `proxy_responses N` (UDP): datagrams expected back per client datagram, after which
    /// the session ends (`None`: not limited, the session ends at `proxy_timeout`).
    pub responses: Option<u32>,
    /// `proxy_requests N` (UDP): client datagrams a session takes; the next one starts a new
    /// session (0: not limited).
    pub requests: u32,
    /// `allow`/`deny`: the first rule matching the client decides (none: allowed).
    pub access_rules: Vec<AccessRule>,
    /// `return VALUE`: sent to the client, then the connection closes (no upstream:
    /// `upstream` is then `usize::MAX`).
    pub ret: Option<Vec<Part>>,
    /// `access_log`: one line per session, when it ends (stream formats have only the
    /// stream's variables; none by default, as nginx's stream has no default log).
    /// `error_log` of this server or the stream block (`None`: the main context's).
    pub error_logs: Option<std::sync::Arc<Vec<ErrorLog>>>,
    pub access_logs: Vec<AccessLog>,
    /// `set $NAME VALUE`, in order: evaluated when the session begins.
    pub sets: Vec<(String, Vec<Part>)>,
    /// `ssl_preread on`: the client's ClientHello is read (not consumed) before the
    /// upstream is chosen, within `preread_buffer_size` bytes and `preread_timeout`.
    pub ssl_preread: bool,
    pub preread_buffer_size: usize,
    pub preread_timeout_ms: u64,
    /// `proxy_pass` with variables: rendered per session to an `upstream` name or an
    /// `ADDRESS:PORT` (`upstream` is then `usize::MAX`).
    pub pass_vars: Option<Vec<Part>>,
    /// `resolver` (with `resolver_timeout`): how a host name `pass_vars` rendered is
    /// resolved at run time.
    pub resolver: Option<std::sync::Arc<ResolverConf>>,
    /// `set_real_ip_from` (`ngx_stream_realip_module`): a connection from these networks
    /// that sent a PROXY header takes the header's source as `$remote_addr`.
    pub real_ip_from: Vec<AccessRule>,
    /// `limit_conn ZONE N` (zones index `StreamConf::limit_zones`), `limit_conn_dry_run`.
    pub limit_conn: Vec<LimitConn>,
    pub limit_conn_dry_run: bool,
    /// `proxy_bind`: the local address (stream variables allowed) of upstream connections.
    pub bind: Option<Vec<Part>>,
    /// `proxy_bind ... transparent`.
    pub bind_transparent: bool,
    /// `proxy_download_rate` / `proxy_upload_rate`: bytes per second read from the upstream
    /// / from the client, 0 unlimited (nginx's per-connection formula); variables are
    /// rendered when the upstream is connected.
    pub download_rate: SizeValue,
    pub upload_rate: SizeValue,
    /// `proxy_half_close on`: one side's end of stream is passed on as a FIN and the session
    /// goes on until both ended. Off (nginx's default), it ends when either side has ended and
    /// what it sent is delivered.
    pub half_close: bool,
    /// `ssl_handshake_timeout`: a `listen ... ssl` client's handshake. Default 60 s.
    pub ssl_handshake_timeout_ms: u64,
    /// `ssl_alpn`: the ALPN protocols offered; a client that offers others fails its
    /// handshake. Empty: none (the client's ALPN is ignored).
    pub alpn: Vec<String>,
}

/// nginx's `open_file_cache`, `open_file_cache_valid`, `open_file_cache_min_uses` and
/// `open_file_cache_errors`: descriptors and metadata of opened files, kept per worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenFileCache {
    /// Most entries; `None` is `open_file_cache off` (the default).
    pub max: Option<usize>,
    /// An entry not used for this long is removed. Default 60 s.
    pub inactive_ms: u64,
    /// An entry is checked again (opened anew) after this long. Default 60 s.
    pub valid_ms: u64,
    /// Uses within `inactive` before a descriptor is kept. Default 1.
    pub min_uses: u32,
    /// Cache lookup errors (not found, forbidden) too. Default off.
    pub errors: bool,
}

impl Default for OpenFileCache {
    fn default() -> Self {
        OpenFileCache {
            max: None,
            inactive_ms: 60_000,
            valid_ms: 60_000,
            min_uses: 1,
            errors: false,
        }
    }
}

/// The largest HTTP/2 flow-control window (RFC 9113, 6.9.1).
pub const H2_MAX_WINDOW: u32 = (1 << 31) - 1;

/// `http2` and the `http2_*` settings of a server (nginx's `ngx_http_v2_module`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Http2Conf {
    /// `http2 on|off` (1.25.1's form); `listen ... http2` turns it on for the address.
    /// Default off.
    pub on: bool,
    /// `http2_max_concurrent_streams`: streams a connection may have open at once. Default 128.
    pub max_concurrent_streams: u32,
    /// `http2_recv_buffer_size`: bytes read from a connection per read (nginx: the worker's
    /// read buffer). Default 256k.
    pub recv_buffer_size: usize,
    /// `http2_chunk_size`: the largest DATA frame of a response. Default 8k.
    pub chunk_size: usize,
    /// `http2_body_preread_size`: a stream's initial receive window, the request body a
    /// client may send before it is asked for. Default 64k.
    pub body_preread_size: usize,
    /// `http2_rebalance on|off` (shard's own): a worker whose requests in flight run well
    /// above its siblings' sends `GOAWAY` to some of its HTTP/2 connections that are between
    /// requests, so that their clients reconnect and steering deals them to cooler workers.
    /// Default off.
    pub rebalance: bool,
}

/// `http3`, `http3_*` and `quic_*` settings of a server (nginx's `ngx_http_v3_module`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Http3Conf {
    /// `http3 on|off`: HTTP/3 on a `quic` address. Default on.
    pub on: bool,
    /// `http3_max_concurrent_streams`: request streams a connection may have open at once.
    /// Default 128.
    pub max_concurrent_streams: u32,
    /// `http3_stream_buffer_size`: a stream's receive window (what a client may send
    /// before it is read). Default 64k.
    pub stream_buffer_size: usize,
    /// `quic_retry on|off`: a Retry packet validates a new client's address first.
    pub retry: bool,
    /// `quic_gso on|off`: several datagrams of a connection in one `sendmsg`, cut by the
    /// kernel (`UDP_SEGMENT`). Default off.
    pub gso: bool,
    /// `ssl_early_data on|off`: 0-RTT requests on `quic` addresses (resumed clients send
    /// their first request with the handshake; `$ssl_early_data` says which). Default off.
    pub early_data: bool,
    /// `quic_host_key FILE`: the key stateless reset tokens and Retry tokens are made with,
    /// so that they outlive a restart.
    pub host_key: Option<PathBuf>,
}

impl Default for Http3Conf {
    fn default() -> Self {
        Http3Conf {
            on: true,
            max_concurrent_streams: 128,
            stream_buffer_size: 64 * 1024,
            retry: false,
            gso: false,
            early_data: false,
            host_key: None,
        }
    }
}

impl Default for Http2Conf {
    fn default() -> Self {
        Http2Conf {
            on: false,
            max_concurrent_streams: 128,
            recv_buffer_size: 256 * 1024,
            chunk_size: 8 * 1024,
            body_preread_size: 64 * 1024,
            rebalance: false,
        }
    }
}

/// `charset_map FROM TO { FROM_BYTE TO_BYTES; ... }`: names lowercase; each pair's `TO` is one
/// byte, or a UTF-8 sequence when `TO` is `utf-8`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CharsetMap {
    pub from: String,
    pub to: String,
    pub pairs: Vec<(u8, Vec<u8>)>,
}

/// The byte table that recodes `src` into `dst` by one of `maps` (either way round), when
/// both are single-byte charsets (no `utf-8` map): what nginx's charset filter does with a
/// table of single bytes. `None` when no map joins them or they are the same charset.
pub fn recode_table(maps: &[CharsetMap], src: &str, dst: &str) -> Option<[u8; 256]> {
    if src.eq_ignore_ascii_case(dst) {
        return None;
    }
    let mut table = [0u8; 256];
    for (i, b) in table.iter_mut().enumerate() {
        *b = i as u8;
    }
    let single = |m: &CharsetMap| m.pairs.iter().all(|(_, t)| t.len() == 1);
    if let Some(m) = maps
        .iter()
        .find(|m| m.from.eq_ignore_ascii_case(src) && m.to.eq_ignore_ascii_case(dst) && single(m))
    {
        for (f, t) in &m.pairs {
            table[usize::from(*f)] = t[0];
        }
        return Some(table);
    }
    let m = maps.iter().find(|m| {
        m.from.eq_ignore_ascii_case(dst) && m.to.eq_ignore_ascii_case(src) && single(m)
    })?;
    for (f, t) in &m.pairs {
        table[usize::from(t[0])] = *f;
    }
    Some(table)
}

/// `sub_filter STRING REPLACEMENT` (both may hold variables), `sub_filter_once`,
/// `sub_filter_types`, `sub_filter_last_modified`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubFilterConf {
    pub pairs: Vec<(Vec<Part>, Vec<Part>)>,
    /// Default on.
    pub once: bool,
    /// Lowercase MIME types; `text/html` always one. `*` (`any_type`): every type.
    pub types: Vec<String>,
    pub any_type: bool,
    /// Default off: `Last-Modified` and `ETag` are removed from a filtered response.
    pub last_modified: bool,
}

impl Default for SubFilterConf {
    fn default() -> Self {
        SubFilterConf {
            pairs: Vec::new(),
            once: true,
            types: vec!["text/html".to_string()],
            any_type: false,
            last_modified: false,
        }
    }
}

/// `ngx_http_addition_module`'s settings of one location.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdditionConf {
    /// `add_before_body URI`, `add_after_body URI`: subrequests whose bodies go before and
    /// after a 200 response's (an empty URI is none).
    pub before: Option<String>,
    pub after: Option<String>,
    /// `addition_types`: lowercase MIME types, `text/html` always one; `*`: every type.
    pub types: Vec<String>,
    pub any_type: bool,
}

impl Default for AdditionConf {
    fn default() -> Self {
        AdditionConf {
            before: None,
            after: None,
            types: vec!["text/html".to_string()],
            any_type: false,
        }
    }
}

impl AdditionConf {
    /// Whether a response of `content_type` gets its additions.
    pub fn applies_to(&self, content_type: &str) -> bool {
        let set = |u: &Option<String>| u.as_deref().is_some_and(|u| !u.is_empty());
        (set(&self.before) || set(&self.after))
            && type_listed(&self.types, self.any_type, content_type)
    }
}

/// `ngx_http_ssi_module`'s settings of one location.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SsiConf {
    /// `ssi on|off`. Default off.
    pub enabled: bool,
    /// `ssi_silent_errors`: a failed command writes nothing (default off: nginx's
    /// "[an error occurred while processing the directive]").
    pub silent_errors: bool,
    /// `ssi_last_modified`: keep `Last-Modified` and a weak `ETag` (default off: removed).
    pub last_modified: bool,
    /// `ssi_types`: lowercase MIME types, `text/html` always one; `*` (`any_type`): every type.
    pub types: Vec<String>,
    pub any_type: bool,
    /// `ssi_value_length`: the longest parameter value (default 256).
    pub value_length: u64,
    /// `subrequest_output_buffer_size`: the most an `include ... set=` keeps (default 4k,
    /// nginx's page size).
    pub output_buffer_size: u64,
}

impl Default for SsiConf {
    fn default() -> Self {
        SsiConf {
            enabled: false,
            silent_errors: false,
            last_modified: false,
            types: vec!["text/html".to_string()],
            any_type: false,
            value_length: 256,
            output_buffer_size: 4096,
        }
    }
}

impl SsiConf {
    /// Whether a response of `content_type` is processed.
    pub fn applies_to(&self, content_type: &str) -> bool {
        self.enabled && type_listed(&self.types, self.any_type, content_type)
    }
}

impl SubFilterConf {
    /// Whether a response of `content_type` is filtered.
    pub fn applies_to(&self, content_type: &str) -> bool {
        !self.pairs.is_empty() && type_listed(&self.types, self.any_type, content_type)
    }
}

/// Whether `content_type` (its parameters aside) is one of a `*_types` list (`any`: `*`).
fn type_listed(types: &[String], any: bool, content_type: &str) -> bool {
    let base = content_type.split(';').next().unwrap_or("").trim();
    any || types.iter().any(|t| t.eq_ignore_ascii_case(base))
}
