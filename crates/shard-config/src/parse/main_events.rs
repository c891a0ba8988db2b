//! Handlers of the main context (`worker_processes`, `pid`, `user`, the `events`, `http` and
//! `stream` blocks) and of `events`.

#[allow(unused_imports)]
use super::*;

pub(super) fn main_worker_processes(_: &Env, st: &mut State, d: &Directive, file: &str) -> R {
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

pub(super) fn main_pid(env: &Env, st: &mut State, d: &Directive, file: &str) -> R {
    once(&mut st.main.pid, env.resolve(a0(d)), d, file)
}

pub(super) fn main_error_log(env: &Env, st: &mut State, d: &Directive, file: &str) -> R {
    let log = parse_error_log(d, file, &env.prefix)?;
    if st.main.error_log.is_none() {
        st.main.error_log = Some(log);
    } else {
        st.main.more_error_logs.push(log);
    }
    Ok(())
}

/// `env NAME` or `env NAME=VALUE` (main): what the workers' environment keeps or sets; nginx
/// removes every other inherited variable but `TZ`.
pub(super) fn main_env(_: &Env, st: &mut State, d: &Directive, file: &str) -> R {
    let (name, value) = match a0(d).split_once('=') {
        Some((n, v)) => (n, Some(v.to_string())),
        None => (a0(d), None),
    };
    if name.is_empty() {
        return Err(invalid(d, file, a0(d)));
    }
    st.main.env.push((name.to_string(), value));
    Ok(())
}

pub(super) fn main_worker_rlimit_nofile(_: &Env, st: &mut State, d: &Directive, file: &str) -> R {
    let n = num::<u64>(d, file, a0(d))?;
    once(&mut st.main.worker_rlimit_nofile, n, d, file)
}

pub(super) fn main_worker_rlimit_core(_: &Env, st: &mut State, d: &Directive, file: &str) -> R {
    let n = size(d, file, a0(d))?;
    once(&mut st.main.worker_rlimit_core, n, d, file)
}

/// `worker_priority N`: a nice value, `-20` to `20` as nginx takes it.
pub(super) fn main_worker_priority(_: &Env, st: &mut State, d: &Directive, file: &str) -> R {
    let a = a0(d);
    let n = match a.strip_prefix('-') {
        Some(abs) => num::<i32>(d, file, abs).map(|n| -n),
        None => num::<i32>(d, file, a),
    }?;
    if !(-20..=20).contains(&n) {
        return Err(invalid(d, file, a));
    }
    once(&mut st.main.worker_priority, n, d, file)
}

/// `worker_cpu_affinity MASK ...` or `worker_cpu_affinity auto [MASK]`: masks of `0` and `1`,
/// CPU 0 rightmost, at most 64 CPUs (nginx's limit).
pub(super) fn main_worker_cpu_affinity(_: &Env, st: &mut State, d: &Directive, file: &str) -> R {
    let mask = |a: &str| -> Result<u64, ConfigError> {
        if a.len() > 64 {
            return Err(derr(
                d,
                file,
                "\"worker_cpu_affinity\" supports up to 64 CPUs only",
            ));
        }
        let mut m = 0u64;
        for c in a.chars() {
            m = match c {
                '0' => m << 1,
                '1' => (m << 1) | 1,
                _ => {
                    return Err(derr(
                        d,
                        file,
                        format!("invalid character \"{c}\" in \"worker_cpu_affinity\""),
                    ))
                }
            };
        }
        Ok(m)
    };
    let v = if a0(d) == "auto" {
        if d.args.len() > 2 {
            return Err(derr(
                d,
                file,
                "invalid number of arguments in \"worker_cpu_affinity\" directive",
            ));
        }
        CpuAffinity::Auto(d.args.get(1).map(|a| mask(a)).transpose()?)
    } else {
        CpuAffinity::Masks(d.args.iter().map(|a| mask(a)).collect::<Result<_, _>>()?)
    };
    once(&mut st.main.worker_cpu_affinity, v, d, file)
}

pub(super) fn main_working_directory(env: &Env, st: &mut State, d: &Directive, file: &str) -> R {
    once(&mut st.main.working_directory, env.resolve(a0(d)), d, file)
}

pub(super) fn main_worker_shutdown_timeout(
    _: &Env,
    st: &mut State,
    d: &Directive,
    file: &str,
) -> R {
    let t = time(d, file, a0(d))?;
    once(&mut st.main.worker_shutdown_timeout_ms, t, d, file)
}

/// `worker_shutdown_drain TIME | off`.
pub(super) fn main_worker_shutdown_drain(_: &Env, st: &mut State, d: &Directive, file: &str) -> R {
    let t = if a0(d) == "off" {
        0
    } else {
        time(d, file, a0(d))?
    };
    once(&mut st.main.worker_shutdown_drain_ms, t, d, file)
}

pub(super) fn main_user(_: &Env, st: &mut State, d: &Directive, file: &str) -> R {
    let user = User {
        name: d.args[0].clone(),
        group: d.args.get(1).cloned(),
        place: place(d, file),
    };
    once(&mut st.main.user, user, d, file)
}

pub(super) fn main_daemon(_: &Env, st: &mut State, d: &Directive, file: &str) -> R {
    let v = flag(d, file, a0(d))?;
    once(&mut st.main.daemon, v, d, file)
}

pub(super) fn main_master_process(_: &Env, st: &mut State, d: &Directive, file: &str) -> R {
    let v = flag(d, file, a0(d))?;
    once(&mut st.main.master_process, v, d, file)
}

pub(super) fn main_worker_sandbox(_: &Env, st: &mut State, d: &Directive, file: &str) -> R {
    let v = flag(d, file, a0(d))?;
    once(&mut st.main.worker_sandbox, v, d, file)
}

pub(super) fn main_events(env: &Env, st: &mut State, d: &Directive, file: &str) -> R {
    if st.events.is_some() {
        return Err(dup(d, file));
    }
    let mut ev = EventsP::default();
    env.walk(block(d), file, Ctx::Events, &mut Target::Events(&mut ev))?;
    st.events = Some(ev);
    Ok(())
}

pub(super) fn main_http(env: &Env, st: &mut State, d: &Directive, file: &str) -> R {
    if st.http.is_some() {
        return Err(dup(d, file));
    }
    let mut h = HttpP::default();
    env.walk(block(d), file, Ctx::Http, &mut Target::Http(&mut h))?;
    st.http = Some(h);
    Ok(())
}

pub(super) fn main_stream(env: &Env, st: &mut State, d: &Directive, file: &str) -> R {
    if st.stream.is_some() {
        return Err(dup(d, file));
    }
    let mut sp = StreamP::default();
    env.walk(block(d), file, Ctx::Stream, &mut Target::Stream(&mut sp))?;
    st.stream = Some(sp);
    Ok(())
}

pub(super) fn events_worker_connections(ev: &mut EventsP, d: &Directive, file: &str) -> R {
    let n = num::<usize>(d, file, a0(d))?;
    if n == 0 {
        return Err(invalid(d, file, a0(d)));
    }
    once(&mut ev.worker_connections, n, d, file)
}

pub(super) fn events_accept_mutex(ev: &mut EventsP, d: &Directive, file: &str) -> R {
    let v = flag(d, file, a0(d))?;
    once(&mut ev.accept_mutex, v, d, file)
}

pub(super) fn events_accept_mutex_delay(ev: &mut EventsP, d: &Directive, file: &str) -> R {
    let t = time(d, file, a0(d))?;
    once(&mut ev.accept_mutex_delay_ms, t, d, file)
}

/// `debug_connection ADDRESS | CIDR | NAME | unix:` (repeatable): a name is resolved now,
/// each of its addresses a client of its own, as nginx's.
pub(super) fn events_debug_connection(ev: &mut EventsP, d: &Directive, file: &str) -> R {
    use crate::model::DebugConnection;
    let v = a0(d);
    if v == "unix:" {
        ev.debug_connection.push(DebugConnection::Unix);
        return Ok(());
    }
    if let Some((ip, bits, _)) = super::http::parse_cidr(v) {
        ev.debug_connection.push(DebugConnection::Net(ip, bits));
        return Ok(());
    }
    // A block that did not parse is not a name: no lookup for it.
    use std::net::ToSocketAddrs;
    let addrs: Vec<std::net::IpAddr> = match v.contains('/') {
        true => Vec::new(),
        false => (v, 0u16)
            .to_socket_addrs()
            .map(|a| a.map(|a| a.ip()).collect())
            .unwrap_or_default(),
    };
    if addrs.is_empty() {
        return Err(derr(
            d,
            file,
            format!("host not found in \"{v}\" of the \"debug_connection\" directive"),
        ));
    }
    for ip in addrs {
        let bits = if ip.is_ipv4() { 32 } else { 128 };
        ev.debug_connection.push(DebugConnection::Net(ip, bits));
    }
    Ok(())
}

pub(super) fn events_multi_accept(ev: &mut EventsP, d: &Directive, file: &str) -> R {
    let v = flag(d, file, a0(d))?;
    once(&mut ev.multi_accept, v, d, file)
}

pub(super) fn events_reuseport_steering(ev: &mut EventsP, d: &Directive, file: &str) -> R {
    let v = flag(d, file, a0(d))?;
    once(&mut ev.reuseport_steering, v, d, file)
}

pub(super) fn events_reuseport_stall_threshold(ev: &mut EventsP, d: &Directive, file: &str) -> R {
    let t = time(d, file, a0(d))?;
    // A zero threshold would take every worker between two loop turns for a stalled one.
    if t == 0 {
        return Err(invalid(d, file, a0(d)));
    }
    once(&mut ev.reuseport_stall_threshold_ms, t, d, file)
}

pub(super) fn events_use(ev: &mut EventsP, d: &Directive, file: &str) -> R {
    if ev.use_.is_some() {
        return Err(dup(d, file));
    }
    if a0(d) != "epoll" {
        return Err(derr(d, file, format!("invalid event type \"{}\"", a0(d))));
    }
    ev.use_ = Some(a0(d).to_string());
    Ok(())
}
