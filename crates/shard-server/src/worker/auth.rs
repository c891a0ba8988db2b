//! `auth_basic` (`ngx_http_auth_basic_module`): the `Authorization: Basic` credentials of a
//! request checked against the location's user file, in the access phase.
//!
//! This module owns the password check for every format nginx reads: `{PLAIN}`, `{SHA}`,
//! `{SSHA}`, Apache's `$apr1$`, and everything `crypt(3)` knows (DES, `$1$`, `$5$`, `$6$`,
//! yescrypt). It does not own when the check runs (`conn.rs`'s phases) nor the 401 page
//! (`respond.rs` adds the `WWW-Authenticate` header the check asks for).

use md5::{Digest, Md5};
use shard_config::AuthBasic;

/// What the check decided.
pub(super) enum Auth {
    Granted,
    /// 401 with `WWW-Authenticate: Basic realm="..."`; the log line, if any.
    Denied(Option<String>),
    /// The user file could not be read: 500, logged.
    Broken(String),
}

/// The user and password of an `Authorization: Basic` header value.
pub(super) fn credentials(value: &[u8]) -> Option<(String, String)> {
    let v = std::str::from_utf8(value).ok()?.trim();
    let (scheme, rest) = v.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let raw = shard_http::base64_decode(rest.trim())?;
    let text = String::from_utf8(raw).ok()?;
    let (user, pass) = text.split_once(':')?;
    Some((user.to_string(), pass.to_string()))
}

/// nginx's check: no or unreadable credentials are a plain 401; an unknown user or a wrong
/// password a 401 and an `error` line naming them.
pub(super) fn check(conf: &AuthBasic, authorization: Option<&[u8]>) -> Auth {
    let users = match &conf.users {
        Ok(u) => u,
        Err(e) => return Auth::Broken(e.clone()),
    };
    let Some((user, pass)) = authorization.and_then(credentials) else {
        return Auth::Denied(None);
    };
    let Some((_, hash)) = users.iter().find(|(u, _)| *u == user) else {
        return Auth::Denied(Some(format!(
            "user \"{user}\" was not found in \"{}\"",
            conf.file.display()
        )));
    };
    if password_matches(&pass, hash) {
        Auth::Granted
    } else {
        Auth::Denied(Some(format!("user \"{user}\": password mismatch")))
    }
}

/// Whether `pass` is the password `hash` stores.
pub(super) fn password_matches(pass: &str, hash: &str) -> bool {
    if let Some(plain) = hash.strip_prefix("{PLAIN}") {
        return constant_eq(plain.as_bytes(), pass.as_bytes());
    }
    if let Some(b64) = hash.strip_prefix("{SHA}") {
        let Some(want) = shard_http::base64_decode(b64) else {
            return false;
        };
        let got = ring::digest::digest(&ring::digest::SHA1_FOR_LEGACY_USE_ONLY, pass.as_bytes());
        return constant_eq(&want, got.as_ref());
    }
    if let Some(b64) = hash.strip_prefix("{SSHA}") {
        let Some(raw) = shard_http::base64_decode(b64) else {
            return false;
        };
        if raw.len() < 20 {
            return false;
        }
        let (want, salt) = raw.split_at(20);
        let mut ctx = ring::digest::Context::new(&ring::digest::SHA1_FOR_LEGACY_USE_ONLY);
        ctx.update(pass.as_bytes());
        ctx.update(salt);
        return constant_eq(want, ctx.finish().as_ref());
    }
    if hash.starts_with("$apr1$") {
        return apr1(pass, hash).is_some_and(|h| constant_eq(h.as_bytes(), hash.as_bytes()));
    }
    shard_event::process::crypt_hash(pass, hash)
        .is_some_and(|h| constant_eq(h.as_bytes(), hash.as_bytes()))
}

fn constant_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The alphabet of crypt's base-64.
const ITOA64: &[u8; 64] = b"./0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

/// Apache's `$apr1$` hash of `pass` with the salt of `setting` (the MD5-crypt algorithm with
/// Apache's magic), in its full `$apr1$SALT$HASH` form.
fn apr1(pass: &str, setting: &str) -> Option<String> {
    const MAGIC: &str = "$apr1$";
    let rest = setting.strip_prefix(MAGIC)?;
    let salt = rest.split('$').next()?;
    let salt = &salt.as_bytes()[..salt.len().min(8)];
    let pw = pass.as_bytes();

    let mut alt = Md5::new();
    alt.update(pw);
    alt.update(salt);
    alt.update(pw);
    let alt = alt.finalize();

    let mut ctx = Md5::new();
    ctx.update(pw);
    ctx.update(MAGIC.as_bytes());
    ctx.update(salt);
    let mut n = pw.len();
    while n > 0 {
        ctx.update(&alt[..n.min(16)]);
        n = n.saturating_sub(16);
    }
    let mut i = pw.len();
    while i > 0 {
        if i & 1 != 0 {
            ctx.update([0u8]);
        } else {
            ctx.update(&pw[..1.min(pw.len())]);
        }
        i >>= 1;
    }
    let mut fin = ctx.finalize();
    for round in 0..1000 {
        let mut c = Md5::new();
        if round & 1 != 0 {
            c.update(pw);
        } else {
            c.update(fin);
        }
        if round % 3 != 0 {
            c.update(salt);
        }
        if round % 7 != 0 {
            c.update(pw);
        }
        if round & 1 != 0 {
            c.update(fin);
        } else {
            c.update(pw);
        }
        fin = c.finalize();
    }
    let mut out = String::with_capacity(37);
    out.push_str(MAGIC);
    out.push_str(std::str::from_utf8(salt).ok()?);
    out.push('$');
    let mut push = |v: u32, n: usize| {
        let mut v = v;
        for _ in 0..n {
            out.push(ITOA64[(v & 0x3f) as usize] as char);
            v >>= 6;
        }
    };
    let f = |i: usize| u32::from(fin[i]);
    push((f(0) << 16) | (f(6) << 8) | f(12), 4);
    push((f(1) << 16) | (f(7) << 8) | f(13), 4);
    push((f(2) << 16) | (f(8) << 8) | f(14), 4);
    push((f(3) << 16) | (f(9) << 8) | f(15), 4);
    push((f(4) << 16) | (f(10) << 8) | f(5), 4);
    push(f(11), 2);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hashes of "secret" made by `openssl passwd` and Python's hashlib.
    #[test]
    fn every_htpasswd_format() {
        for hash in [
            "{PLAIN}secret",
            "{SHA}5en6G6MezRroT3XKqkdPOmY/BfQ=",
            "{SSHA}gVK8WC9YyFT1gMsQHTGCgT3sSv5zYWx0",
            "$apr1$xyz$HXgo9gtz4gpj4JWTLYmjB0",
            "$1$abc$iCQ2D3nhptRYi27fDYv2s1",
            "$6$saltsalt$TVLlQcbpFVof5W3Yz4DTP6gRstiNuHwwTt6GLc1E5n0U0aDehy0S5knV8wiOQSpT0Y77vwPZN.Pq.H91p5hVO1",
        ] {
            assert!(password_matches("secret", hash), "{hash}");
            assert!(!password_matches("Secret", hash), "{hash}");
            assert!(!password_matches("", hash), "{hash}");
        }
        assert!(!password_matches("secret", "garbage"));
        assert!(!password_matches("secret", "{SHA}!!"));
    }

    #[test]
    fn basic_credentials() {
        assert_eq!(
            credentials(b"Basic dXNlcjpwYTpzcw=="),
            Some(("user".into(), "pa:ss".into()))
        );
        assert_eq!(credentials(b"Bearer abc"), None);
        assert_eq!(credentials(b"Basic !!!"), None);
        assert_eq!(credentials(b"Basic dXNlcg=="), None, "no colon");
    }
}
