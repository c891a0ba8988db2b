//! The `shard` binary: nginx's command line, then either a master process or a signal sender.
//!
//! `main` calls `run`, which returns an exit code; errors are printed nginx-style
//! (`shard: [emerg] ...`). This file owns argument handling and the choice of configuration
//! (a file, or the embedded default); everything else lives in the library crates.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Parser;

/// The end of `--help`: the signals the master understands (also `dist/shard.8`).
const HELP_SIGNALS: &str = "\
Signals to the master (its pid is in the pid file, default PREFIX/logs/shard.pid):
  TERM, INT   fast shutdown                  (-s stop)
  QUIT        graceful shutdown              (-s quit)
  HUP         reload the configuration       (-s reload)
  USR1        reopen the log files           (-s reopen)
  USR2        upgrade the binary: start a new master with the listening sockets
  WINCH       stop the workers gracefully (after USR2, before QUIT to the old master)
Signals to a worker: TERM/INT fast stop, QUIT graceful stop, USR1 reopen its access logs.

Files: PREFIX/conf/shard.conf (else the embedded default configuration),
PREFIX/logs/error.log, PREFIX/logs/shard.pid. Documentation: docs/directives.md, shard(8).";

/// Where shard looks for its configuration when `-c` is not given, relative to the prefix.
const DEFAULT_CONF_PATH: &str = "conf/shard.conf";

#[derive(Parser, Debug)]
#[command(
    name = "shard",
    disable_version_flag = true,
    disable_help_flag = true,
    about = "shard: a web server whose point is how connections are spread over workers",
    after_help = HELP_SIGNALS
)]
struct Cli {
    /// Show version and exit.
    #[arg(short = 'v')]
    version: bool,
    /// Show version and build information and exit.
    #[arg(short = 'V')]
    version_full: bool,
    /// Test the configuration and exit (binds no socket).
    #[arg(short = 't')]
    test: bool,
    /// Test the configuration, dump it (every file read, and what a sandboxed worker may
    /// open) and exit.
    #[arg(short = 'T')]
    dump: bool,
    /// Suppress non-error messages during the configuration test.
    #[arg(short = 'q')]
    quiet: bool,
    /// Send a signal to the master process: reload, quit, stop, reopen.
    #[arg(short = 's', value_name = "SIGNAL")]
    signal: Option<String>,
    /// Set the prefix path (default: the current directory).
    #[arg(short = 'p', value_name = "PREFIX")]
    prefix: Option<PathBuf>,
    /// Use this configuration file (default: PREFIX/conf/shard.conf, else the embedded default).
    #[arg(short = 'c', value_name = "FILE")]
    conf: Option<PathBuf>,
    /// Set global directives out of the configuration file.
    #[arg(short = 'g', value_name = "DIRECTIVES")]
    directives: Option<String>,
    /// Use this error log instead of the default (`stderr`: standard error) where the
    /// configuration names none at the main level.
    #[arg(short = 'e', value_name = "FILE")]
    error_log: Option<String>,
    /// Print help.
    #[arg(short = 'h', long = "help", short_alias = '?', action = clap::ArgAction::Help)]
    help: Option<bool>,
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { 1 } else { 0 });
        }
    };
    ExitCode::from(run(cli) as u8)
}

/// The configuration to use and how to name it in messages.
#[derive(Clone)]
struct Source {
    path: Option<PathBuf>,
    name: String,
}

fn choose_source(cli: &Cli, prefix: &Path) -> Source {
    match &cli.conf {
        Some(c) => {
            let path = if c.is_absolute() {
                c.clone()
            } else {
                prefix.join(c)
            };
            // Named by the path that is read, as nginx and as the errors about it do.
            Source {
                name: path.display().to_string(),
                path: Some(path),
            }
        }
        None => {
            let p = prefix.join(DEFAULT_CONF_PATH);
            if p.exists() {
                Source {
                    name: p.display().to_string(),
                    path: Some(p),
                }
            } else {
                Source {
                    path: None,
                    name: "(embedded default)".to_string(),
                }
            }
        }
    }
}

fn load(
    src: &Source,
    prefix: &Path,
    extra: Option<&str>,
    error_log: Option<&str>,
) -> Result<shard_config::Config, shard_config::ConfigError> {
    let mut cfg = match &src.path {
        Some(p) => shard_config::load(p, prefix, extra),
        None => shard_config::parse_str(
            shard_config::DEFAULT_CONFIG,
            &src.name,
            prefix,
            prefix,
            extra,
        ),
    }?;
    // nginx's `-e`: the error log where the configuration's main level names none.
    if let (Some(e), false) = (error_log, cfg.main.error_log_configured) {
        cfg.main.error_log.target = if e == "stderr" {
            shard_config::LogTarget::Stderr
        } else {
            shard_config::LogTarget::File(prefix.join(e))
        };
    }
    Ok(cfg)
}

/// What `-V` says shard has, in the words of nginx's `./configure` (the `--with-*` modules
/// nginx builds only on request, and `--without-*` for the default ones shard lacks), so that
/// scripts and test suites that read `nginx -V` find the modules shard implements.
const NGINX_MODULES: &str = "--with-http_ssl_module --with-http_v2_module \
--with-http_realip_module --with-http_addition_module --with-http_sub_module --with-http_gunzip_module \
--with-http_gzip_static_module --with-http_auth_request_module \
--with-http_secure_link_module --with-http_stub_status_module --with-stream \
--with-stream_ssl_module --with-stream_realip_module --with-stream_ssl_preread_module \
--with-http_geoip_module --with-stream_geoip_module --with-http_dav_module \
--with-http_random_index_module --with-http_slice_module --with-http_flv_module --with-debug \
--without-http_browser_module \
--without-http_tunnel_module \
--without-http_upstream_sticky --without-http_upstream_least_time_module \
--without-stream_pass_module --without-stream_upstream_least_time_module";

/// How `-V` names the TLS library, in the form nginx prints for a library that offers
/// OpenSSL's interface under another name (BoringSSL: `OpenSSL 1.1.1 (compatible;
/// BoringSSL)`): shard's `ssl_*` directives take OpenSSL 3.0's names, commands
/// (`ssl_conf_command`), verification words and defaults, so scripts and test suites that
/// gate a TLS feature on `built with OpenSSL X` find what shard implements.
const OPENSSL_COMPAT: &str = "OpenSSL 3.0.0 (compatible; rustls 0.23, TLS 1.2 and 1.3)";

fn run(cli: Cli) -> i32 {
    if cli.version || cli.version_full {
        eprintln!("shard version: shard/{}", env!("CARGO_PKG_VERSION"));
        if cli.version_full {
            eprintln!(
                "built with Rust; accept strategies: reuseport, accept_mutex, EPOLLEXCLUSIVE"
            );
            eprintln!("built with {OPENSSL_COMPAT}");
            eprintln!("TLS SNI support enabled");
            eprintln!("nginx-equivalent configure arguments: {NGINX_MODULES}");
            eprintln!("default configuration path: PREFIX/{DEFAULT_CONF_PATH} (else the embedded default)");
        }
        if !cli.test && !cli.dump && cli.signal.is_none() {
            return 0;
        }
    }
    let prefix = match &cli.prefix {
        Some(p) => p.clone(),
        None => std::env::current_dir().unwrap_or_else(|_| PathBuf::from(".")),
    };
    let src = choose_source(&cli, &prefix);
    let n_workers =
        |c: &shard_config::Config| shard_server::master::resolve_workers(c.main.worker_processes);
    let cfg = match load(
        &src,
        &prefix,
        cli.directives.as_deref(),
        cli.error_log.as_deref(),
    )
    .and_then(|c| c.check_workers(n_workers(&c)).map(|()| c))
    {
        Ok(c) => c,
        Err(e) => {
            for m in e.all() {
                eprintln!("shard: [emerg] {m}");
            }
            if cli.test || cli.dump {
                eprintln!("shard: configuration file {} test failed", src.name);
            }
            return 1;
        }
    };
    // As nginx, `-q` silences only the "syntax is ok" lines, not warnings.
    for w in &cfg.warnings {
        eprintln!("shard: [warn] {w}");
    }
    if cli.test || cli.dump {
        // The workers' identity is part of the configuration: an unknown user or group fails
        // the test, as nginx's `ngx_set_user` does when run as root.
        if let Some(w) = shard_server::privilege::ignored_user_warning(&cfg) {
            eprintln!("shard: [warn] {w}");
        }
        match shard_server::privilege::worker_identity(&cfg) {
            Err(e) => {
                eprintln!("shard: [emerg] {e}");
                eprintln!("shard: configuration file {} test failed", src.name);
                return 1;
            }
            // What nginx only finds at run time: directories the workers cannot reach.
            Ok(Some(id)) => {
                for w in shard_server::privilege::unreachable_paths(&cfg, &id) {
                    eprintln!("shard: [warn] {w}");
                }
            }
            Ok(None) => {}
        }
        // As nginx's test, the log files are opened (and created): a log in a missing
        // directory fails here, not at start.
        shard_server::log::make_prefix_logs_dir(&cfg.prefix);
        if let Err(e) = shard_server::log::check_files(&cfg) {
            eprintln!("shard: [emerg] {e}");
            eprintln!("shard: configuration file {} test failed", src.name);
            return 1;
        }
        // Certificates and keys are read as the start reads them.
        if let Err(e) =
            shard_server::tls::ticketer().and_then(|t| shard_server::tls::build(&cfg, &t))
        {
            eprintln!("shard: [emerg] {e}");
            eprintln!("shard: configuration file {} test failed", src.name);
            return 1;
        }
        if !cli.quiet {
            eprintln!("shard: the configuration file {} syntax is ok", src.name);
            eprintln!("shard: configuration file {} test is successful", src.name);
        }
        if cli.dump {
            print!("{}", dump(&src, &cfg));
        }
        return 0;
    }
    if let Some(sig) = &cli.signal {
        return send_signal(&cfg, sig);
    }
    let conf_name = src.name.clone();
    let extra = cli.directives.clone();
    let error_log = cli.error_log.clone();
    let reload = Box::new(move || {
        load(&src, &prefix, extra.as_deref(), error_log.as_deref()).map_err(|e| e.to_string())
    });
    match shard_server::run(shard_server::RunOptions {
        config: cfg,
        conf_name,
        reload,
    }) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("shard: [emerg] {e:#}");
            1
        }
    }
}

/// `-T`: every configuration file as read, as nginx prints them, then what a sandboxed
/// worker may open under this configuration.
fn dump(src: &Source, cfg: &shard_config::Config) -> String {
    let mut out = String::new();
    let main = match &src.path {
        Some(p) => std::fs::read_to_string(p).unwrap_or_default(),
        None => shard_config::DEFAULT_CONFIG.to_string(),
    };
    let mut files = vec![(src.name.clone(), main)];
    // A file included more than once is printed once, as nginx 1.13.8+ keeps one dump per
    // file name.
    let mut seen = std::collections::HashSet::new();
    for p in cfg.included.iter().filter(|p| seen.insert(*p)) {
        files.push((
            p.display().to_string(),
            std::fs::read_to_string(p).unwrap_or_default(),
        ));
    }
    for (name, text) in files {
        out.push_str(&format!("# configuration file {name}:\n{text}"));
        if !text.ends_with('\n') {
            out.push('\n');
        }
        out.push('\n');
    }
    out.push_str(&shard_server::sandbox::Plan::from_config(cfg).render(cfg.main.worker_sandbox));
    out
}

/// `-s SIGNAL`: read the pid file named by the configuration and signal that master.
fn send_signal(cfg: &shard_config::Config, name: &str) -> i32 {
    let sig = match name {
        "stop" => libc::SIGTERM,
        "quit" => libc::SIGQUIT,
        "reopen" => libc::SIGUSR1,
        "reload" => libc::SIGHUP,
        _ => {
            eprintln!(
                "shard: invalid option: \"-s {name}\" (expected stop, quit, reopen or reload)"
            );
            return 1;
        }
    };
    let Some(pid_path) = &cfg.main.pid else {
        eprintln!("shard: [error] no \"pid\" directive in the configuration: cannot find the master to signal");
        return 1;
    };
    let text = match std::fs::read_to_string(pid_path) {
        Ok(t) => t,
        Err(e) => {
            eprintln!(
                "shard: [error] open() \"{}\" failed ({e})",
                pid_path.display()
            );
            return 1;
        }
    };
    let pid: libc::pid_t = match text.trim().parse() {
        Ok(p) if p > 0 => p,
        _ => {
            eprintln!(
                "shard: [error] invalid PID number \"{}\" in \"{}\"",
                text.trim(),
                pid_path.display()
            );
            return 1;
        }
    };
    if let Err(e) = shard_server::signal(pid, sig) {
        eprintln!("shard: [error] kill({pid}, {sig}) failed ({e})");
        return 1;
    }
    0
}
