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
}

/// Starts a parse: forgets the names of any earlier one.
pub(super) fn reset_names() {
    DECLARED.with(|d| d.borrow_mut().clear());
    USED.with(|u| u.borrow_mut().clear());
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
    if variable_is_builtin(name) {
        return Err(derr(
            d,
            file,
            format!("the \"{name}\" variable is built in: shard cannot set it"),
        ));
    }
    declare(name);
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

/// `map SOURCE $NAME { KEY VALUE; ... default VALUE; hostnames; }` (http).
pub(super) fn http_map(_: &Env, h: &mut HttpP, d: &Directive, file: &str) -> R {
    let source = parse_header_value(d, file, &d.args[0])?;
    let Some(name) = d.args[1].strip_prefix('$').filter(|n| !n.is_empty()) else {
        return Err(derr(
            d,
            file,
            format!("invalid variable name \"{}\"", d.args[1]),
        ));
    };
    let name = name.to_ascii_lowercase();
    if h.maps.iter().any(|m| m.name == name) {
        return Err(derr(
            d,
            file,
            format!("duplicate \"map\" variable \"${name}\""),
        ));
    }
    declare(&name);
    let mut m = MapConf {
        name,
        source,
        hostnames: false,
        exact: Vec::new(),
        regexes: Vec::new(),
        default: Vec::new(),
        index: Default::default(),
    };
    let mut seen = std::collections::HashSet::new();
    for item in block(d) {
        let e = match item {
            Item::Error(e) => return Err(e.clone()),
            Item::Dir(e) => e,
        };
        if e.block.is_some() {
            return Err(derr(e, file, "unexpected \"{\""));
        }
        match (e.name.as_str(), e.args.as_slice()) {
            ("hostnames", []) => m.hostnames = true,
            ("volatile", []) => {}
            ("include", _) => {
                return Err(derr(
                    e,
                    file,
                    "\"include\" inside \"map\" is not supported by shard",
                ))
            }
            ("default", [v]) => m.default = parse_header_value(e, file, v)?,
            (key, [v]) => {
                let value = parse_header_value(e, file, v)?;
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
    h.maps.push(m);
    Ok(())
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
