//! The cache directives: `proxy_cache_path` / `fastcgi_cache_path` (http), and the
//! per-location `proxy_cache*` / `fastcgi_cache*` / `*_no_cache` settings, one parser for
//! both prefixes (nginx's two modules share `ngx_http_upstream`'s cache). What the settings
//! do at run time is the worker's (`shard-server`'s `worker/cache.rs`).

use super::*;

/// The cache settings of one level; `None` inherits.
#[derive(Default, Clone)]
pub(super) struct CacheP {
    pub(super) sel: Option<CacheSel>,
    pub(super) key: Option<Vec<Part>>,
    /// Every `*_cache_valid` of this level (a level with any replaces its parent's).
    pub(super) valid: Option<Vec<CacheValid>>,
    pub(super) methods: Option<Vec<String>>,
    pub(super) min_uses: Option<u64>,
    pub(super) bypass: Option<Vec<Vec<Part>>>,
    pub(super) no_cache: Option<Vec<Vec<Part>>>,
    pub(super) use_stale: Option<u16>,
    pub(super) background_update: Option<bool>,
    pub(super) lock: Option<bool>,
    pub(super) lock_timeout_ms: Option<u64>,
    pub(super) lock_age_ms: Option<u64>,
    pub(super) revalidate: Option<bool>,
    pub(super) convert_head: Option<bool>,
    pub(super) max_range_offset: Option<u64>,
}

impl CacheP {
    pub(super) fn merge(&self, p: &CacheConf) -> CacheConf {
        CacheConf {
            sel: self.sel.clone().unwrap_or_else(|| p.sel.clone()),
            key: self.key.clone().or_else(|| p.key.clone()),
            valid: self.valid.clone().unwrap_or_else(|| p.valid.clone()),
            methods: self.methods.clone().unwrap_or_else(|| p.methods.clone()),
            min_uses: self.min_uses.unwrap_or(p.min_uses),
            bypass: self.bypass.clone().unwrap_or_else(|| p.bypass.clone()),
            no_cache: self.no_cache.clone().unwrap_or_else(|| p.no_cache.clone()),
            use_stale: self.use_stale.unwrap_or(p.use_stale),
            background_update: self.background_update.unwrap_or(p.background_update),
            lock: self.lock.unwrap_or(p.lock),
            lock_timeout_ms: self.lock_timeout_ms.unwrap_or(p.lock_timeout_ms),
            lock_age_ms: self.lock_age_ms.unwrap_or(p.lock_age_ms),
            revalidate: self.revalidate.unwrap_or(p.revalidate),
            convert_head: self.convert_head.unwrap_or(p.convert_head),
            max_range_offset: self.max_range_offset.or(p.max_range_offset),
            reads_head: false,
        }
    }
}

/// `proxy_cache*` and `proxy_no_cache` (http, server, location).
pub(super) fn set_proxy_cache(_: &Env, s: &mut Settings, d: &Directive, file: &str) -> R {
    let what = d.name.strip_prefix("proxy_").unwrap_or(&d.name);
    directive(&mut s.proxy.cache, what, d, file)
}

/// One cache directive, named without its `proxy_`/`fastcgi_` prefix.
pub(super) fn directive(c: &mut CacheP, what: &str, d: &Directive, file: &str) -> R {
    let v = a0(d);
    match what {
        "cache" => {
            let sel = if v == "off" {
                CacheSel::Off
            } else if v.contains('$') {
                CacheSel::Var(parse_header_value(d, file, v)?)
            } else {
                CacheSel::Named(v.to_string(), place(d, file))
            };
            once(&mut c.sel, sel, d, file)
        }
        "cache_key" => once(&mut c.key, parse_header_value(d, file, v)?, d, file),
        "cache_valid" => {
            let (time, codes) = d.args.split_last().expect("arity checked");
            let secs = parse_time_ms(time)
                .map(|ms| ms / 1000)
                .ok_or_else(|| invalid(d, file, time))?;
            let mut list = Vec::new();
            let mut any = false;
            for a in codes {
                if a == "any" {
                    any = true;
                    continue;
                }
                match a.parse::<u16>() {
                    Ok(n @ 100..=599) => list.push(n),
                    _ => return Err(derr(d, file, format!("invalid status \"{a}\""))),
                }
            }
            if codes.is_empty() {
                list = vec![200, 301, 302];
            }
            if any {
                list.clear();
            }
            c.valid
                .get_or_insert_with(Vec::new)
                .push(CacheValid { codes: list, secs });
            Ok(())
        }
        "cache_methods" => {
            let mut m = Vec::new();
            for a in &d.args {
                match a.as_str() {
                    "GET" | "HEAD" => {}
                    "POST" => m.push(a.clone()),
                    _ => return Err(invalid(d, file, a)),
                }
            }
            once(&mut c.methods, m, d, file)
        }
        "cache_min_uses" => {
            let n = num::<u64>(d, file, v)?;
            once(&mut c.min_uses, n, d, file)
        }
        "cache_bypass" | "no_cache" => {
            let list = if what == "no_cache" {
                &mut c.no_cache
            } else {
                &mut c.bypass
            };
            let list = list.get_or_insert_with(Vec::new);
            for a in &d.args {
                list.push(parse_header_value(d, file, a)?);
            }
            Ok(())
        }
        "cache_use_stale" => {
            let mut bits = 0;
            for a in &d.args {
                bits |= match a.as_str() {
                    "off" => 0,
                    "error" => stale::ERROR,
                    "timeout" => stale::TIMEOUT,
                    "invalid_header" => stale::INVALID_HEADER,
                    "updating" => stale::UPDATING,
                    "http_500" => stale::HTTP_500,
                    "http_502" => stale::HTTP_502,
                    "http_503" => stale::HTTP_503,
                    "http_504" => stale::HTTP_504,
                    "http_403" => stale::HTTP_403,
                    "http_404" => stale::HTTP_404,
                    "http_429" => stale::HTTP_429,
                    _ => return Err(invalid(d, file, a)),
                };
            }
            if d.args.len() > 1 && d.args.iter().any(|a| a == "off") {
                return Err(invalid(d, file, "off"));
            }
            once(&mut c.use_stale, bits, d, file)
        }
        "cache_background_update" => once(&mut c.background_update, flag(d, file, v)?, d, file),
        "cache_lock" => once(&mut c.lock, flag(d, file, v)?, d, file),
        "cache_lock_timeout" => once(&mut c.lock_timeout_ms, time(d, file, v)?, d, file),
        "cache_lock_age" => once(&mut c.lock_age_ms, time(d, file, v)?, d, file),
        "cache_revalidate" => once(&mut c.revalidate, flag(d, file, v)?, d, file),
        "cache_convert_head" => once(&mut c.convert_head, flag(d, file, v)?, d, file),
        "cache_max_range_offset" => once(&mut c.max_range_offset, size(d, file, v)?, d, file),
        _ => Err(derr(d, file, format!("unknown directive \"{}\"", d.name))),
    }
}

/// `proxy_cache_path` / `fastcgi_cache_path PATH [levels=] keys_zone=NAME:SIZE ...` (http).
pub(super) fn http_cache_path(env: &Env, h: &mut HttpP, d: &Directive, file: &str) -> R {
    let mut c = CachePath {
        name: String::new(),
        zone_size: 0,
        path: env.resolve(&d.args[0]),
        levels: Vec::new(),
        inactive_secs: 600,
        max_size: 0,
        min_free: 0,
        use_temp_path: true,
        manager_files: 100,
        manager_sleep_ms: 50,
        manager_threshold_ms: 200,
        loader_files: 100,
        loader_sleep_ms: 50,
        loader_threshold_ms: 200,
        place: place(d, file),
    };
    for a in &d.args[1..] {
        let (k, v) = a.split_once('=').unwrap_or((a, ""));
        let bad = || derr(d, file, format!("invalid parameter \"{a}\""));
        match k {
            "levels" => {
                for l in v.split(':') {
                    match l {
                        "1" => c.levels.push(1),
                        "2" => c.levels.push(2),
                        _ => return Err(derr(d, file, format!("invalid \"levels\" \"{v}\""))),
                    }
                }
                if c.levels.len() > 3 {
                    return Err(derr(d, file, format!("invalid \"levels\" \"{v}\"")));
                }
            }
            "keys_zone" => {
                let (name, sz) = v
                    .split_once(':')
                    .filter(|(n, _)| !n.is_empty())
                    .ok_or_else(|| derr(d, file, format!("invalid keys zone size \"{a}\"")))?;
                let n = parse_size(sz)
                    .filter(|&n| n >= 8192)
                    .ok_or_else(|| derr(d, file, format!("invalid keys zone size \"{a}\"")))?;
                c.name = name.to_string();
                c.zone_size = n as usize;
            }
            "use_temp_path" => c.use_temp_path = flag(d, file, v)?,
            "inactive" => c.inactive_secs = time(d, file, v).map_err(|_| bad())? / 1000,
            "max_size" => c.max_size = size(d, file, v).map_err(|_| bad())?,
            "min_free" => c.min_free = size(d, file, v).map_err(|_| bad())?,
            "manager_files" => c.manager_files = num(d, file, v).map_err(|_| bad())?,
            "manager_sleep" => c.manager_sleep_ms = time(d, file, v).map_err(|_| bad())?,
            "manager_threshold" => c.manager_threshold_ms = time(d, file, v).map_err(|_| bad())?,
            "loader_files" => c.loader_files = num(d, file, v).map_err(|_| bad())?,
            "loader_sleep" => c.loader_sleep_ms = time(d, file, v).map_err(|_| bad())?,
            "loader_threshold" => c.loader_threshold_ms = time(d, file, v).map_err(|_| bad())?,
            _ => return Err(bad()),
        }
    }
    if c.name.is_empty() {
        return Err(derr(
            d,
            file,
            format!("\"{}\" must have \"keys_zone\" parameter", d.name),
        ));
    }
    if h.cache_paths.iter().any(|z| z.name == c.name) {
        return Err(derr(d, file, format!("duplicate zone \"{}\"", c.name)));
    }
    if let Some(z) = h.cache_paths.iter().find(|z| z.path == c.path) {
        return Err(derr(
            d,
            file,
            format!(
                "the same path name \"{}\" used in {}:{} and in {}:{}",
                c.path.display(),
                z.place.file,
                z.place.line,
                file,
                d.line
            ),
        ));
    }
    h.cache_paths.push(c);
    Ok(())
}
