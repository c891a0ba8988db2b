//! The access-log line: nginx's `combined` format (a fast path), and any `log_format`,
//! escaped as nginx escapes variables.
//!
//! `$remote_addr - - [$time_local] "$request" $status $body_bytes_sent "$http_referer"
//! "$http_user_agent"`. This module formats one line into a caller's buffer; buffering,
//! flushing and files belong to the caller.

use std::io::Write;
use std::net::IpAddr;

use shard_config::{LogEscape, LogFormat, Part, Var};

use crate::vars;

const HEX: &[u8; 16] = b"0123456789ABCDEF";

/// Appends `s` with `"`, `\`, control bytes and bytes >= 0x7f written as `\xHH`.
fn push_escaped(out: &mut Vec<u8>, s: &str) {
    push_escaped_bytes(out, s.as_bytes());
}

fn push_escaped_bytes(out: &mut Vec<u8>, s: &[u8]) {
    for &b in s {
        if b == b'"' || b == b'\\' || !(0x20..0x7f).contains(&b) {
            out.extend_from_slice(&[
                b'\\',
                b'x',
                HEX[usize::from(b >> 4)],
                HEX[usize::from(b & 15)],
            ]);
        } else {
            out.push(b);
        }
    }
}

fn push_opt(out: &mut Vec<u8>, v: Option<&str>) {
    out.push(b'"');
    match v {
        Some(s) => push_escaped(out, s),
        None => out.push(b'-'),
    }
    out.push(b'"');
}

/// Appends one `combined` line, newline included.
#[allow(clippy::too_many_arguments)]
pub fn write_combined(
    out: &mut Vec<u8>,
    addr: IpAddr,
    time_local: &str,
    request_line: &str,
    status: u16,
    bytes: u64,
    referer: Option<&str>,
    user_agent: Option<&str>,
) {
    let _ = write!(out, "{addr} - - [{time_local}] \"");
    push_escaped(out, request_line);
    let _ = write!(out, "\" {status} {bytes} ");
    push_opt(out, referer);
    out.push(b' ');
    push_opt(out, user_agent);
    out.push(b'\n');
}

/// Appends `v` as a JSON string's content (nginx's `escape=json`).
fn push_json(out: &mut Vec<u8>, v: &[u8]) {
    for &b in v {
        match b {
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\r' => out.extend_from_slice(b"\\r"),
            b'\t' => out.extend_from_slice(b"\\t"),
            0x08 => out.extend_from_slice(b"\\b"),
            0x0c => out.extend_from_slice(b"\\f"),
            b if b < 0x20 => {
                out.extend_from_slice(b"\\u00");
                out.push(HEX[usize::from(b >> 4)]);
                out.push(HEX[usize::from(b & 15)]);
            }
            b => out.push(b),
        }
    }
}

/// Appends one line of `format` for the request in `ctx`, newline included: literal text as
/// written, each variable's value escaped as the format says (an empty value is `-`, except
/// with `escape=json` and `escape=none`, as nginx writes a variable that is not found).
pub fn write_format(out: &mut Vec<u8>, format: &LogFormat, ctx: &vars::Ctx<'_>) {
    write_format_with(out, format, |v, var| vars::push(v, var, ctx));
}

/// [`write_format`] with the variables' values from `value` (the stream module has its own).
pub fn write_format_with(
    out: &mut Vec<u8>,
    format: &LogFormat,
    mut value: impl FnMut(&mut Vec<u8>, &Var),
) {
    let mut v = Vec::new();
    for p in &format.parts {
        match p {
            Part::Lit(s) => out.extend_from_slice(s.as_bytes()),
            Part::Var(var) => {
                v.clear();
                value(&mut v, var);
                match format.escape {
                    LogEscape::Json => push_json(out, &v),
                    LogEscape::None => out.extend_from_slice(&v),
                    // `$uri` is always found in nginx (empty for a request refused before
                    // it had one), so it is never `-`.
                    LogEscape::Default if v.is_empty() && !matches!(var, Var::Uri) => {
                        out.push(b'-')
                    }
                    LogEscape::Default => push_escaped_bytes(out, &v),
                }
            }
        }
    }
    out.push(b'\n');
}

/// `access_log ... if=CONDITION`: the line is written unless the value is empty or `0`.
pub fn condition_holds(parts: &[Part], ctx: &vars::Ctx<'_>) -> bool {
    let mut v = Vec::new();
    vars::push_parts(&mut v, parts, ctx);
    !(v.is_empty() || v == b"0")
}

/// [`condition_holds`] of a value already rendered.
pub fn value_holds(v: &[u8]) -> bool {
    !(v.is_empty() || v == b"0")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn combined_line() {
        let mut out = Vec::new();
        write_combined(
            &mut out,
            "127.0.0.1".parse().unwrap(),
            "06/Nov/1994:08:49:37 +0000",
            "GET /ok?x=1 HTTP/1.1",
            200,
            2,
            None,
            Some("test \"agent\""),
        );
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "127.0.0.1 - - [06/Nov/1994:08:49:37 +0000] \"GET /ok?x=1 HTTP/1.1\" 200 2 \"-\" \"test \\x22agent\\x22\"\n"
        );
    }

    #[test]
    fn escaping() {
        let mut out = Vec::new();
        write_combined(
            &mut out,
            "::1".parse().unwrap(),
            "t",
            "a\\b\tc\x7fé",
            404,
            0,
            Some(""),
            None,
        );
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "::1 - - [t] \"a\\x5Cb\\x09c\\x7F\\xC3\\xA9\" 404 0 \"\" \"-\"\n"
        );
    }
}
