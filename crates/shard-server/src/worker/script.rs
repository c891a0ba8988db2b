//! Running nginx's rewrite module: a server's or location's [`Instr`] list on one request
//! (`rewrite`, `set`, `if`, `return`, `break`).
//!
//! This module changes the request's URI and arguments, the connection's captures and `set`
//! values, and says what comes next ([`Outcome`]); it writes no response (the caller answers
//! a `return`) and chooses no location.

use shard_config::{Cond, FileTest, Instr, LocationConf, RewriteFlag};
use shard_http::request::Request;

use super::Worker;

/// How a script ended.
pub(super) enum Outcome {
    /// Ran to its end with the URI unchanged (or `break`): go on in this location.
    Stay,
    /// The URI changed (`rewrite ... last`, or without a flag): search the location anew.
    Relocate,
    /// `return` (or a redirecting `rewrite`): answer with this code and text.
    Return { code: u16, text: Option<String> },
}

/// How deep `if` blocks may run one inside another (the parser allows no nesting; this guards
/// the recursion all the same).
const IF_DEPTH_MAX: usize = 8;

impl Worker<'_> {
    /// Runs `script` for the request on `key`, in `loc` (for `$document_root` and the like).
    pub(super) fn run_script(
        &mut self,
        key: usize,
        script: &[Instr],
        req: &mut Request,
        head: &[u8],
        loc: &LocationConf,
    ) -> Outcome {
        let mut changed = false;
        match self.run_instrs(key, script, req, head, loc, &mut changed, 0) {
            // `break` after the URI changed here: nginx's `valid_location = 0`.
            Some(Outcome::Stay) if changed => {
                req.location_left = true;
                Outcome::Stay
            }
            Some(o) => o,
            None if changed => Outcome::Relocate,
            None => Outcome::Stay,
        }
    }

    /// `None`: the list ran to its end.
    #[allow(clippy::too_many_arguments)]
    fn run_instrs(
        &mut self,
        key: usize,
        script: &[Instr],
        req: &mut Request,
        head: &[u8],
        loc: &LocationConf,
        changed: &mut bool,
        depth: usize,
    ) -> Option<Outcome> {
        for instr in script {
            match instr {
                Instr::Break => return Some(Outcome::Stay),
                Instr::AddHeader(h) => {
                    self.conns[key]
                        .rq()
                        .if_headers
                        .get_or_insert_with(Vec::new)
                        .push(h.clone());
                }
                Instr::Return(r) => {
                    let text = r
                        .text
                        .as_ref()
                        .map(|_| self.render(key, req, head, loc, &r.parts));
                    return Some(Outcome::Return { code: r.code, text });
                }
                Instr::Set { name, value } if name == "limit_rate" => {
                    let v = self.render(key, req, head, loc, value);
                    match shard_config::parse_size(&v) {
                        Some(n) => self.conns[key].rq().rate_set = Some(n),
                        None => crate::log!(Error, "invalid $limit_rate \"{v}\""),
                    }
                }
                Instr::Set { name, value } if name == "args" => {
                    req.query = Some(self.render(key, req, head, loc, value));
                    // As nginx's `$args` setter: the request line no longer says the URI,
                    // so a `proxy_pass` without a URI sends the path and the new arguments.
                    req.uri_changed = true;
                }
                Instr::Set { name, value } => {
                    let v = self.render(key, req, head, loc, value).into_bytes();
                    let vars = &mut self.conns[key].rq().user_vars;
                    match vars.iter_mut().find(|(n, _)| n == name) {
                        Some(slot) => slot.1 = v,
                        None => vars.push((name.clone(), v)),
                    }
                }
                Instr::Location(i) => self.conns[key].rq().if_location = Some(*i),
                Instr::If { cond, then } => {
                    if depth < IF_DEPTH_MAX && self.holds(key, cond, req, head, loc) {
                        // The last `if` that holds is the request's configuration: one without
                        // a `proxy_pass` of its own is its location's.
                        self.conns[key].rq().if_location = None;
                        // An `if` with headers of its own is the request's configuration from
                        // here on: its headers replace the location's (and an earlier if's).
                        if then.iter().any(|i| matches!(i, Instr::AddHeader(_))) {
                            self.conns[key].rq().if_headers = Some(Vec::new());
                        }
                        if let Some(o) =
                            self.run_instrs(key, then, req, head, loc, changed, depth + 1)
                        {
                            return Some(o);
                        }
                    }
                }
                Instr::Rewrite {
                    regex,
                    replacement,
                    flag,
                    redirect,
                } => {
                    let c = &mut self.conns[key];
                    let matched = regex.captures_into(&req.path, &mut c.rq().captures);
                    if loc.rewrite_log {
                        // nginx's notice lines, with the request's context.
                        crate::log!(
                            Notice,
                            "\"{}\" {} \"{}\"{}",
                            regex.as_str(),
                            if matched { "matches" } else { "does not match" },
                            req.path,
                            self.log_context(key, Some(req))
                        );
                    }
                    if !matched {
                        continue;
                    }
                    let c = &mut self.conns[key];
                    c.rq().capture_text = Some(req.path.clone());
                    shard_http::route::capture_names_into(&mut c.rq().capture_names, Some(regex));
                    let code = match flag {
                        RewriteFlag::Permanent => Some(301),
                        RewriteFlag::Redirect => Some(302),
                        _ if *redirect => Some(302),
                        _ => None,
                    };
                    let new = if replacement.iter().any(is_capture) && quoted_uri(req) {
                        self.render_escaping_captures(
                            key,
                            req,
                            head,
                            loc,
                            replacement,
                            code.is_some(),
                        )
                    } else {
                        self.render(key, req, head, loc, replacement)
                    };
                    if let Some(code) = code {
                        // As nginx: the request's arguments follow (after `&` when the
                        // replacement has its own), unless the replacement ends with `?`.
                        let mut url = unescape_redirect(&new);
                        let q = req.query.as_deref().filter(|q| !q.is_empty());
                        if url.ends_with('?') {
                            url.pop();
                        } else if let Some(q) = q {
                            url.push(if url.contains('?') { '&' } else { '?' });
                            url.push_str(q);
                        }
                        if loc.rewrite_log {
                            crate::log!(
                                Notice,
                                "rewritten redirect: \"{url}\"{}",
                                self.log_context(key, Some(req))
                            );
                        }
                        return Some(Outcome::Return {
                            code,
                            text: Some(url),
                        });
                    }
                    if loc.rewrite_log {
                        let (path, args) = new.split_once('?').unwrap_or((&new, ""));
                        crate::log!(
                            Notice,
                            "rewritten data: \"{path}\", args: \"{args}\"{}",
                            self.log_context(key, Some(req))
                        );
                    }
                    apply_uri(req, &new);
                    *changed = true;
                    match flag {
                        RewriteFlag::Last => return Some(Outcome::Relocate),
                        RewriteFlag::Break => return Some(Outcome::Stay),
                        _ => {}
                    }
                }
            }
        }
        None
    }

    /// A `rewrite` replacement as nginx's script engine copies it for a request whose URI
    /// was sent escaped (`%` or `+` in its path: nginx's `quoted_uri`, `plus_in_uri`): a
    /// capture after the replacement's `?` (anywhere in a redirect's) is escaped again as
    /// nginx's `NGX_ESCAPE_ARGS`, so `$1?c=$1` of `/a%25` gives `c=/a%25`.
    fn render_escaping_captures(
        &self,
        key: usize,
        req: &Request,
        head: &[u8],
        loc: &LocationConf,
        replacement: &[shard_config::Part],
        redirect: bool,
    ) -> String {
        let mut out = String::new();
        let mut args = redirect;
        for part in replacement {
            let text = self.render(key, req, head, loc, std::slice::from_ref(part));
            if args && is_capture(part) {
                shard_http::static_file::percent_escape(text.as_bytes(), &mut out, |c| {
                    !escape_args(c)
                });
            } else {
                out.push_str(&text);
            }
            args |= matches!(part, shard_config::Part::Lit(l) if l.contains('?'));
        }
        out
    }

    /// [`Worker::render`], with a regular expression's groups as `$1`.. (a rewrite rule's
    /// replacement) when given.
    pub(super) fn render_with_captures(
        &self,
        key: usize,
        req: &Request,
        head: &[u8],
        loc: &LocationConf,
        parts: &[shard_config::Part],
        caps: shard_http::proxy::Groups<'_>,
    ) -> String {
        let mut storage = shard_http::vars::header_storage();
        let hs = shard_http::vars::request_headers(head, &mut storage);
        let mut ctx = self.var_ctx(key, req, hs, loc);
        if let Some((ranges, text)) = caps {
            ctx.scope.captures = ranges;
            ctx.scope.capture_text = text;
            ctx.scope.capture_names = &[];
        }
        shard_http::vars::render(parts, &ctx)
    }

    /// A template's value for the request on `key` in `loc`.
    pub(super) fn render(
        &self,
        key: usize,
        req: &Request,
        head: &[u8],
        loc: &LocationConf,
        parts: &[shard_config::Part],
    ) -> String {
        self.render_with_captures(key, req, head, loc, parts, None)
    }

    fn holds(
        &mut self,
        key: usize,
        cond: &Cond,
        req: &Request,
        head: &[u8],
        loc: &LocationConf,
    ) -> bool {
        match cond {
            Cond::Value(v) => {
                let v = self.render(key, req, head, loc, v);
                !(v.is_empty() || v == "0")
            }
            Cond::Equal {
                left,
                right,
                negate,
            } => {
                let l = self.render(key, req, head, loc, left);
                let r = self.render(key, req, head, loc, right);
                (l == r) != *negate
            }
            Cond::Match {
                left,
                regex,
                negate,
            } => {
                let l = self.render(key, req, head, loc, left);
                // A negated match keeps the captures it had (`!~` sets none in nginx).
                let mut caps = Vec::new();
                match regex.captures_into(&l, &mut caps) {
                    true => {
                        if !*negate {
                            let c = &mut self.conns[key];
                            c.rq().captures = caps;
                            c.rq().capture_text = Some(l.clone());
                            shard_http::route::capture_names_into(
                                &mut c.rq().capture_names,
                                Some(regex),
                            );
                        }
                        !*negate
                    }
                    false => *negate,
                }
            }
            Cond::File { test, path, negate } => {
                let p = self.render(key, req, head, loc, path);
                let ok = match std::fs::metadata(&p) {
                    Ok(m) => match test {
                        FileTest::File => m.is_file(),
                        FileTest::Dir => m.is_dir(),
                        FileTest::Exists => true,
                        // nginx's `ngx_is_exec`: the owner's execute bit, whatever the
                        // type (a directory usually has it).
                        FileTest::Executable => {
                            use std::os::unix::fs::PermissionsExt;
                            m.permissions().mode() & 0o100 != 0
                        }
                    },
                    Err(_) => false,
                };
                ok != *negate
            }
        }
    }
}

/// A redirect's URL as nginx's script engine leaves it (`NGX_UNESCAPE_REDIRECT`): up to
/// its first `?` (written or escaped), `%XX` of a printable byte above `%` is decoded and
/// any other stays escaped; a broken escape loses its `%` (and its digit), as nginx's.
fn unescape_redirect(url: &str) -> String {
    let b = url.as_bytes();
    if !b.contains(&b'%') {
        return url.to_string();
    }
    let hex = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        _ => match c | 0x20 {
            c @ b'a'..=b'f' => Some(c - b'a' + 10),
            _ => None,
        },
    };
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        i += 1;
        if c == b'?' {
            out.push(c);
            break;
        }
        if c != b'%' {
            out.push(c);
            continue;
        }
        let Some(hi) = b.get(i).copied() else { break };
        i += 1;
        let Some(h) = hex(hi) else {
            out.push(hi);
            continue;
        };
        let Some(lo) = b.get(i).copied() else { break };
        i += 1;
        let Some(l) = hex(lo) else { continue };
        let ch = (h << 4) + l;
        if ch == b'?' {
            out.push(ch);
            break;
        }
        if ch > b'%' && ch < 0x7f {
            out.push(ch);
        } else {
            out.extend_from_slice(&[b'%', hi, lo]);
        }
    }
    out.extend_from_slice(&b[i..]);
    String::from_utf8_lossy(&out).into_owned()
}

/// nginx's `quoted_uri` or `plus_in_uri`: the request's path as sent had `%` or `+`.
fn quoted_uri(req: &Request) -> bool {
    let path = req.target.split('?').next().unwrap_or("");
    path.bytes().any(|b| b == b'%' || b == b'+')
}

fn is_capture(p: &shard_config::Part) -> bool {
    matches!(p, shard_config::Part::Var(shard_config::Var::Capture(_)))
}

/// nginx's `NGX_ESCAPE_ARGS`: controls, space, `"#%&+;<>?\\^` and backquote, braces, `|`,
/// DEL and every byte over 0x7f.
fn escape_args(c: u8) -> bool {
    !(0x20..0x7f).contains(&c)
        || matches!(
            c,
            b' ' | b'"'
                | b'#'
                | b'%'
                | b'&'
                | b'+'
                | b';'
                | b'<'
                | b'>'
                | b'?'
                | b'\\'
                | b'^'
                | b'`'
                | b'{'
                | b'|'
                | b'}'
        )
}

/// The URI a `rewrite` made: its `?` starts new arguments, to which the request's own are
/// added unless it ends with `?` (nginx's rule); without `?` the arguments stay.
fn apply_uri(req: &mut Request, new: &str) {
    match new.split_once('?') {
        Some((path, args)) => {
            let keep_old = !new.ends_with('?');
            let mut q = args.strip_suffix('?').unwrap_or(args).to_string();
            if keep_old {
                if let Some(old) = req.query.as_deref().filter(|o| !o.is_empty()) {
                    if !q.is_empty() {
                        q.push('&');
                    }
                    q.push_str(old);
                }
            }
            req.path = path.to_string();
            req.query = (!q.is_empty()).then_some(q);
        }
        None => req.path = new.to_string(),
    }
    req.uri_changed = true;
}
