//! nginx's rewrite module (`rewrite`, `return`, `set`, `if`, `break`) as [`Instr`] lists of
//! servers, locations and `if` blocks, and the `map` block. Also the variables `set` and `map`
//! declare: a name no one declares is an error once the whole file was read (nginx checks it
//! then too), so a `map` may follow the server that uses it.

#[allow(unused_imports)]
use super::*;

use std::cell::RefCell;
use std::collections::HashSet;

thread_local! {
    /// Names declared by `set` and `map` in the parse under way.
    static DECLARED: RefCell<HashSet<String>> = RefCell::new(HashSet::new());
    /// Names used but not built in, with where: checked against `DECLARED` at the end.
    static USED: RefCell<Vec<(String, String, usize)>> = const { RefCell::new(Vec::new()) };
    /// `proxy_pass` of `if` blocks, by the index an `Instr::Location` holds until `flatten`
    /// makes each a location of its own.
    static IF_PASSES: RefCell<Vec<Option<PassP>>> = const { RefCell::new(Vec::new()) };
}

/// Starts a parse: forgets the names of any earlier one.
pub(super) fn reset_names() {
    DECLARED.with(|d| d.borrow_mut().clear());
    USED.with(|u| u.borrow_mut().clear());
    IF_PASSES.with(|p| p.borrow_mut().clear());
}

/// The `proxy_pass` an `Instr::Location(k)` stood for while parsing.
pub(super) fn take_if_pass(k: usize) -> Option<PassP> {
    IF_PASSES.with(|p| p.borrow_mut().get_mut(k).and_then(Option::take))
}

/// `proxy_pass` inside `if`: no URI part (nginx refuses one), the location's other settings.
pub(super) fn script_proxy_pass(_: &Env, script: &mut Vec<Instr>, d: &Directive, file: &str) -> R {
    let p = parse_proxy_pass(d, file)?;
    if p.uri.is_some() {
        return Err(derr(
            d,
            file,
            "\"proxy_pass\" cannot have URI part in location given by regular expression, \
             or inside named location, or inside \"if\" statement, or inside \
             \"limit_except\" block",
        ));
    }
    if script.iter().any(|i| matches!(i, Instr::Location(_))) {
        return Err(derr(d, file, "\"proxy_pass\" directive is duplicate"));
    }
    let k = IF_PASSES.with(|v| {
        let mut v = v.borrow_mut();
        v.push(Some(p));
        v.len() - 1
    });
    script.push(Instr::Location(k));
    Ok(())
}

pub(super) fn declare(name: &str) {
    DECLARED.with(|d| d.borrow_mut().insert(name.to_ascii_lowercase()));
}

/// A variable that is not built in: `$name` of a `set` or `map`, checked later.
pub(super) fn user_variable(d: &Directive, file: &str, name: &str) -> Var {
    USED.with(|u| {
        u.borrow_mut()
            .push((name.to_string(), file.to_string(), d.line))
    });
    Var::User(name.to_string())
}

/// The first variable used that nothing declares: nginx's `unknown "name" variable`.
pub(super) fn check_names() -> Result<(), ConfigError> {
    let declared = DECLARED.with(|d| d.borrow().clone());
    USED.with(|u| {
        for (name, file, line) in u.borrow().iter() {
            if !declared.contains(name) {
                return Err(err(file, *line, format!("unknown \"{name}\" variable")));
            }
        }
        Ok(())
    })
}

/// The instruction list a `return`, `rewrite`, `set`, `break` or `if` is read into.
pub(super) fn script_of<'t>(target: &'t mut Target<'_>) -> Option<&'t mut Vec<Instr>> {
    match target {
        Target::Server(cx) => Some(&mut cx.s.script),
        Target::Location(l) => Some(&mut l.script),
        Target::If(v) => Some(v),
        _ => None,
    }
}

pub(super) fn script_return(_: &Env, script: &mut Vec<Instr>, d: &Directive, file: &str) -> R {
    script.push(Instr::Return(parse_return(d, file)?));
    Ok(())
}

/// `add_header NAME VALUE [always]` inside `if`.
pub(super) fn script_add_header(
    env: &Env,
    script: &mut Vec<Instr>,
    d: &Directive,
    file: &str,
) -> R {
    let mut s = Settings::default();
    set_add_header(env, &mut s, d, file)?;
    for h in s.add_headers.unwrap_or_default() {
        script.push(Instr::AddHeader(h));
    }
    Ok(())
}

pub(super) fn script_break(_: &Env, script: &mut Vec<Instr>, _: &Directive, _: &str) -> R {
    script.push(Instr::Break);
    Ok(())
}

/// `set $NAME VALUE`.
pub(super) fn script_set(_: &Env, script: &mut Vec<Instr>, d: &Directive, file: &str) -> R {
    let Some(name) = d.args[0].strip_prefix('$').filter(|n| !n.is_empty()) else {
        return Err(derr(
            d,
            file,
            format!("invalid variable name \"{}\"", d.args[0]),
        ));
    };
    // nginx's changeable built-in variables, and those of a prefix (`$http_foo`, `$arg_a`,
    // `$cookie_c`), which a `set` shadows in the requests that run it (nginx: a new variable
    // whose value, until set, is the prefix's).
    let settable = ["limit_rate", "args"];
    let lower = name.to_ascii_lowercase();
    let prefixed = ["http_", "arg_", "cookie_"]
        .iter()
        .any(|p| lower.strip_prefix(p).is_some_and(|n| !n.is_empty()));
    if variable_is_builtin(name) && !settable.contains(&lower.as_str()) && !prefixed {
        return Err(derr(
            d,
            file,
            format!("the \"{name}\" variable is built in: shard cannot set it"),
        ));
    }
    if !variable_is_builtin(name) {
        declare(name);
    }
    let value = parse_header_value(d, file, &d.args[1])?;
    script.push(Instr::Set {
        name: name.to_ascii_lowercase(),
        value,
    });
    Ok(())
}

/// Whether `name` is one of shard's own variables (see `variable`).
fn variable_is_builtin(name: &str) -> bool {
    let probe = Directive {
        name: String::new(),
        args: Vec::new(),
        line: 0,
        block: None,
    };
    USED.with(|u| {
        let before = u.borrow().len();
        let builtin = !matches!(variable(&probe, "", name), Ok(Var::User(_)) | Err(_));
        u.borrow_mut().truncate(before);
        builtin
    })
}

/// `rewrite REGEX REPLACEMENT [last|break|redirect|permanent]`.
pub(super) fn script_rewrite(_: &Env, script: &mut Vec<Instr>, d: &Directive, file: &str) -> R {
    let regex = compile_regex(d, file, &d.args[0], false)?;
    let flag = match d.args.get(2).map(String::as_str) {
        None => RewriteFlag::None,
        Some("last") => RewriteFlag::Last,
        Some("break") => RewriteFlag::Break,
        Some("redirect") => RewriteFlag::Redirect,
        Some("permanent") => RewriteFlag::Permanent,
        Some(f) => return Err(derr(d, file, format!("invalid parameter \"{f}\""))),
    };
    let r = &d.args[1];
    let redirect =
        r.starts_with("http://") || r.starts_with("https://") || r.starts_with("$scheme");
    script.push(Instr::Rewrite {
        regex,
        replacement: parse_header_value(d, file, r)?,
        flag,
        redirect,
    });
    Ok(())
}

/// `if (CONDITION) { ... }`: only the rewrite module's directives are read inside.
pub(super) fn script_if(env: &Env, script: &mut Vec<Instr>, d: &Directive, file: &str) -> R {
    let cond = parse_cond(d, file)?;
    let mut then = Vec::new();
    env.walk(block(d), file, Ctx::If, &mut Target::If(&mut then))?;
    script.push(Instr::If { cond, then });
    Ok(())
}

/// The condition of `if`, as the lexer split it: `($a`, `=`, `b)` and the like.
fn parse_cond(d: &Directive, file: &str) -> Result<Cond, ConfigError> {
    let mut args: Vec<String> = d.args.clone();
    let bad = || {
        derr(
            d,
            file,
            format!("invalid condition \"{}\"", d.args.join(" ")),
        )
    };
    if args.is_empty() {
        return Err(bad());
    }
    let first = args[0].strip_prefix('(').ok_or_else(bad)?.to_string();
    args[0] = first;
    let n = args.len();
    let last = args[n - 1].strip_suffix(')').ok_or_else(bad)?.to_string();
    args[n - 1] = last;
    if args.last().is_some_and(String::is_empty) {
        args.pop();
    }
    if args.first().is_some_and(String::is_empty) {
        args.remove(0);
    }
    let tpl = |v: &str| parse_header_value(d, file, v);
    match args.as_slice() {
        [v] if v.starts_with('$') => Ok(Cond::Value(tpl(v)?)),
        [op, path] => {
            let (negate, op) = match op.strip_prefix('!') {
                Some(o) => (true, o),
                None => (false, op.as_str()),
            };
            let test = match op {
                "-f" => FileTest::File,
                "-d" => FileTest::Dir,
                "-e" => FileTest::Exists,
                "-x" => FileTest::Executable,
                _ => return Err(bad()),
            };
            Ok(Cond::File {
                test,
                path: tpl(path)?,
                negate,
            })
        }
        [left, op, right] if left.starts_with('$') => match op.as_str() {
            "=" | "!=" => Ok(Cond::Equal {
                left: tpl(left)?,
                right: tpl(right)?,
                negate: op == "!=",
            }),
            "~" | "~*" | "!~" | "!~*" => Ok(Cond::Match {
                left: tpl(left)?,
                regex: compile_regex(d, file, right, op.ends_with('*'))?,
                negate: op.starts_with('!'),
            }),
            _ => Err(derr(d, file, format!("unexpected \"{op}\" in condition"))),
        },
        _ => Err(bad()),
    }
}

/// The entries of a `map`-like block (`map`, `split_clients`) with the file each was read
/// from: an `include` among them is replaced by the entries of the files it names, as nginx
/// reads a `map` (its `include` may name a pattern).
/// The entries of `d`'s block (`include`s followed), for other modules' blocks.
pub(super) fn block_entries_of(
    env: &Env,
    d: &Directive,
    file: &str,
) -> Result<Vec<(Directive, String)>, ConfigError> {
    block_entries(env, d, file)
}

fn block_entries(
    env: &Env,
    d: &Directive,
    file: &str,
) -> Result<Vec<(Directive, String)>, ConfigError> {
    fn collect(
        env: &Env,
        items: &[Item],
        file: &str,
        depth: usize,
        out: &mut Vec<(Directive, String)>,
    ) -> R {
        for item in items {
            let e = match item {
                Item::Error(e) => return Err(e.clone()),
                Item::Dir(e) => e,
            };
            if e.name != "include" || e.block.is_some() || e.args.len() != 1 {
                out.push((e.clone(), file.to_string()));
                continue;
            }
            if depth >= MAX_INCLUDE_DEPTH {
                return Err(derr(
                    e,
                    file,
                    format!("too deep include nesting of \"{}\"", e.args[0]),
                ));
            }
            for (path, text) in include_sources(&env.conf_dir, e, file)? {
                env.included.borrow_mut().push(path.clone());
                let name = path.display().to_string();
                collect(env, &parse_tree(&text, &name), &name, depth + 1, out)?;
            }
        }
        Ok(())
    }
    let mut out = Vec::new();
    collect(env, block(d), file, 0, &mut out)?;
    Ok(out)
}

/// `map SOURCE $NAME { KEY VALUE; ... default VALUE; hostnames; include FILE; }` (http).
pub(super) fn http_map(env: &Env, h: &mut HttpP, d: &Directive, file: &str) -> R {
    map_block(env, &mut VarNs::http(&mut h.maps), d, file)
}

/// Where `map`, `split_clients` and `geo` put their variable: http's or stream's blocks,
/// values read with that module's variables.
pub(super) struct VarNs<'m> {
    pub(super) maps: &'m mut Vec<MapConf>,
    pub(super) value: fn(&Directive, &str, &str) -> Result<Vec<Part>, ConfigError>,
    /// http's names are checked against every use at the end of the parse (`declare`);
    /// the stream's by `finish_stream`.
    pub(super) http: bool,
}

impl VarNs<'_> {
    fn http(maps: &mut Vec<MapConf>) -> VarNs<'_> {
        VarNs {
            maps,
            value: parse_header_value,
            http: true,
        }
    }
}

/// `map` of http or stream.
pub(super) fn map_block(env: &Env, ns: &mut VarNs<'_>, d: &Directive, file: &str) -> R {
    let source = (ns.value)(d, file, &d.args[0])?;
    let Some(name) = d.args[1].strip_prefix('$').filter(|n| !n.is_empty()) else {
        return Err(derr(
            d,
            file,
            format!("invalid variable name \"{}\"", d.args[1]),
        ));
    };
    let name = name.to_ascii_lowercase();
    if ns.maps.iter().any(|m| m.name == name) {
        return Err(derr(
            d,
            file,
            format!("duplicate \"map\" variable \"${name}\""),
        ));
    }
    if ns.http {
        declare(&name);
    }
    let mut m = empty_map(name, source);
    let mut seen = std::collections::HashSet::new();
    for (e, file) in block_entries(env, d, file)? {
        let (e, file) = (&e, file.as_str());
        if e.block.is_some() {
            return Err(derr(e, file, "unexpected \"{\""));
        }
        match (e.name.as_str(), e.args.as_slice()) {
            ("hostnames", []) => m.hostnames = true,
            ("volatile", []) => {}
            ("default", [v]) => m.default = (ns.value)(e, file, v)?,
            (key, [v]) => {
                let value = (ns.value)(e, file, v)?;
                if let Some(re) = key.strip_prefix("~*") {
                    m.regexes.push((compile_regex(e, file, re, true)?, value));
                } else if let Some(re) = key.strip_prefix('~') {
                    m.regexes.push((compile_regex(e, file, re, false)?, value));
                } else {
                    let key = key.strip_prefix('\\').unwrap_or(key);
                    let key = if m.hostnames {
                        key.to_ascii_lowercase()
                    } else {
                        key.to_string()
                    };
                    if m.hostnames && !valid_wildcard_key(&key) {
                        return Err(derr(
                            e,
                            file,
                            format!("invalid hostname or wildcard \"{key}\""),
                        ));
                    }
                    if !seen.insert(key.clone()) {
                        return Err(derr(e, file, format!("conflicting parameter \"{key}\"")));
                    }
                    m.exact.push((key, value));
                }
            }
            _ => return Err(derr(e, file, "invalid number of the map parameters")),
        }
    }
    m.index = crate::index::MapIndex::build(&m.exact, m.hostnames);
    ns.maps.push(m);
    Ok(())
}

/// `split_clients SOURCE $NAME { PERCENT% VALUE; ... * VALUE; }` (http): nginx's
/// percentages with up to two decimals, adding up to at most 100%; the value is literal text.
pub(super) fn http_split_clients(env: &Env, h: &mut HttpP, d: &Directive, file: &str) -> R {
    split_clients_block(env, &mut VarNs::http(&mut h.maps), d, file)
}

/// `split_clients` of http or stream.
pub(super) fn split_clients_block(env: &Env, ns: &mut VarNs<'_>, d: &Directive, file: &str) -> R {
    let source = (ns.value)(d, file, &d.args[0])?;
    let name = new_variable(ns, d, file, &d.args[1])?;
    // In hundredths of a percent, as nginx's `ngx_atofp(value, len, 2)`.
    let mut parts: Vec<(u32, String)> = Vec::new();
    for (e, file) in block_entries(env, d, file)? {
        let (e, file) = (&e, file.as_str());
        if e.block.is_some() {
            return Err(derr(e, file, "unexpected \"{\""));
        }
        let [value] = e.args.as_slice() else {
            return Err(derr(
                e,
                file,
                "invalid number of the split_clients parameters",
            ));
        };
        let share = if e.name == "*" {
            0
        } else {
            e.name
                .strip_suffix('%')
                .and_then(hundredths)
                .filter(|&n| n > 0)
                .ok_or_else(|| derr(e, file, format!("invalid percent value \"{}\"", e.name)))?
        };
        parts.push((share, value.clone()));
    }
    let (mut sum, mut last) = (0u32, 0u64);
    let mut split = Vec::with_capacity(parts.len());
    for (share, value) in parts {
        sum = if share == 0 { 10_000 } else { sum + share };
        if sum > 10_000 {
            return Err(derr(d, file, "percent total is greater than 100%"));
        }
        let bound = if sum == 10_000 {
            0
        } else {
            last += u64::from(share) * 0xffff_ffff / 10_000;
            last as u32
        };
        split.push((bound, vec![Part::Lit(value)]));
    }
    ns.maps.push(MapConf {
        split: Some(split),
        ..empty_map(name, source)
    });
    Ok(())
}

/// `geo [ADDRESS] $NAME { default V; NET V; ranges; FIRST-LAST V; delete NET; proxy NET;
/// proxy_recursive; include FILE; }` (http), as nginx's geo module: the longest network
/// wins, or with `ranges` the range (a later one overrides an earlier one where they
/// overlap); values are literal text.
pub(super) fn http_geo(env: &Env, h: &mut HttpP, d: &Directive, file: &str) -> R {
    geo_block(env, &mut VarNs::http(&mut h.maps), d, file)
}

/// `geo` of http or stream (the stream's has no `proxy`: there is no `X-Forwarded-For`).
pub(super) fn geo_block(env: &Env, ns: &mut VarNs<'_>, d: &Directive, file: &str) -> R {
    let (source, var) = match d.args.as_slice() {
        [v] => (None, v),
        [s, v] => (Some((ns.value)(d, file, s)?), v),
        _ => {
            return Err(derr(
                d,
                file,
                "invalid number of arguments in \"geo\" directive",
            ))
        }
    };
    let name = new_variable(ns, d, file, var)?;
    let mut b = crate::index::GeoBuilder::default();
    let mut values: Vec<Vec<Part>> = Vec::new();
    let mut value = |v: &str| -> u32 {
        values.push(vec![Part::Lit(v.to_string())]);
        (values.len() - 1) as u32
    };
    for (e, file) in block_entries(env, d, file)? {
        let (e, file) = (&e, file.as_str());
        let bad = || derr(e, file, format!("invalid parameter \"{}\"", e.name));
        match (e.name.as_str(), e.args.as_slice()) {
            ("ranges", []) => b.set_ranges(),
            ("proxy_recursive", []) => b.proxy_recursive = true,
            ("default", [v]) => b.default = Some(value(v)),
            ("proxy", [net]) if ns.http => {
                let (ip, bits) = geo_net(net).ok_or_else(|| invalid(e, file, net))?;
                b.proxies.push(AccessRule {
                    allow: true,
                    net: Some((ip, bits)),
                    unix: false,
                });
            }
            ("delete", [net]) if b.is_ranges() => {
                let (first, last) = geo_range(net).ok_or_else(|| invalid(e, file, net))?;
                b.range(first, last, None);
            }
            ("delete", [net]) => {
                let (ip, bits) = geo_net(net).ok_or_else(|| invalid(e, file, net))?;
                b.net(ip, bits, None);
            }
            (net, [v]) if b.is_ranges() => {
                let (first, last) = geo_range(net).ok_or_else(bad)?;
                let v = value(v);
                b.range(first, last, Some(v));
            }
            (net, [v]) => {
                let (ip, bits) = geo_net(net).ok_or_else(bad)?;
                let v = value(v);
                b.net(ip, bits, Some(v));
            }
            _ => return Err(derr(e, file, "invalid number of the geo parameters")),
        }
    }
    let table = b.build();
    let source_given = source.is_some();
    let source = source.unwrap_or_else(|| {
        let mut s = vec![Part::Var(Var::RemoteAddr)];
        if !table.proxies.is_empty() {
            s.push(Part::Lit("\n".into()));
            s.push(Part::Var(Var::Http("x-forwarded-for".into())));
        }
        s
    });
    ns.maps.push(MapConf {
        geo: Some(Box::new(Geo {
            table,
            values,
            source_given,
        })),
        ..empty_map(name, source)
    });
    Ok(())
}

/// A `geo` network: `ADDRESS`, `ADDRESS/BITS` (masked) or `default` (0.0.0.0/0).
fn geo_net(v: &str) -> Option<(IpAddr, u8)> {
    if v == "default" {
        return Some((IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0));
    }
    parse_cidr(v).map(|(base, bits, _)| (base, bits))
}

/// A `geo ... { ranges; }` range: `FIRST-LAST` of IPv4 addresses, or `default`.
fn geo_range(v: &str) -> Option<(u32, u32)> {
    if v == "default" {
        return Some((0, u32::MAX));
    }
    let (a, b) = v.split_once('-')?;
    let a = u32::from(a.parse::<Ipv4Addr>().ok()?);
    let b = u32::from(b.parse::<Ipv4Addr>().ok()?);
    (a <= b).then_some((a, b))
}

/// A variable block with no keys yet: what `map`, `split_clients` and `geo` start from.
fn empty_map(name: String, source: Vec<Part>) -> MapConf {
    MapConf {
        name,
        source,
        hostnames: false,
        exact: Vec::new(),
        regexes: Vec::new(),
        default: Vec::new(),
        index: Default::default(),
        split: None,
        geo: None,
    }
}

/// The variable `$NAME` a `split_clients` or `geo` block defines: lowercase, declared, not
/// one another block already defines.
fn new_variable(
    ns: &VarNs<'_>,
    d: &Directive,
    file: &str,
    var: &str,
) -> Result<String, ConfigError> {
    let Some(name) = var.strip_prefix('$').filter(|n| !n.is_empty()) else {
        return Err(derr(d, file, format!("invalid variable name \"{var}\"")));
    };
    let name = name.to_ascii_lowercase();
    if ns.maps.iter().any(|m| m.name == name) {
        return Err(derr(d, file, format!("duplicate variable \"{name}\"")));
    }
    if ns.http {
        declare(&name);
    }
    Ok(name)
}

/// A percentage's number with up to two decimals, in hundredths (`0.5` is 50, `2` is 200).
fn hundredths(v: &str) -> Option<u32> {
    let (int, frac) = v.split_once('.').unwrap_or((v, ""));
    if int.is_empty() && frac.is_empty()
        || frac.len() > 2
        || !int.bytes().chain(frac.bytes()).all(|b| b.is_ascii_digit())
    {
        return None;
    }
    let int: u32 = if int.is_empty() { 0 } else { int.parse().ok()? };
    let frac: u32 = format!("{frac:0<2}").parse().ok()?;
    int.checked_mul(100)?.checked_add(frac)
}

/// A `map ... { hostnames; }` key as nginx's wildcard hash takes it: a `*` only as a whole
/// first label (`*.example.com`) or a whole last one (`www.example.*`), never both.
fn valid_wildcard_key(key: &str) -> bool {
    match (key.strip_prefix("*."), key.strip_suffix(".*")) {
        (Some(_), Some(_)) => false,
        (Some(rest), None) => !rest.is_empty() && !rest.contains('*'),
        (None, Some(rest)) => !rest.is_empty() && !rest.contains('*'),
        (None, None) => !key.contains('*'),
    }
}
