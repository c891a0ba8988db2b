//! Regular expressions as nginx runs them: PCRE2 (nginx's engine since 1.21.5), through the
//! `pcre2` crate, compiled once at load with the JIT where the platform has it.
//!
//! This module owns compiling an expression (`~`, `~*`: caseless) and the two questions the
//! server asks of one: does it match, and where are its groups. Groups are byte ranges of the
//! subject, numbered as PCRE numbers them, with their names (`(?<n>...)`, `(?P<n>...)`,
//! `(?'n'...)`) for variables. It does not own what the captures mean (`$1`, named variables:
//! `shard_http::vars`) nor where expressions are allowed (the parsers).
//!
//! Patterns are compiled as nginx compiles them: byte mode (no UTF), so `.` is one byte, a
//! group is a byte range that may end inside a character, and `~*` folds ASCII letters only.
//! Everything PCRE2 offers (look-around, backreferences, atomic groups, possessive
//! quantifiers, `\Q...\E`, recursion) is available as in nginx.
//!
//! Cost: a location scan asks `is_match` of each expression (the crate's match data, pooled
//! per thread without a lock) and only the one that matches again for its groups; byte mode
//! also spares PCRE2's UTF-8 check of the subject on every call.

use pcre2::bytes::RegexBuilder;

/// A compiled regular expression with nginx's PCRE semantics.
#[derive(Clone)]
pub struct Regex {
    re: pcre2::bytes::Regex,
}

impl Regex {
    /// Compiles `pattern`, case-insensitively when `caseless` (`~*`). The error is nginx's:
    /// `pcre2_compile() failed: MESSAGE in "PATTERN" at "REST"`, REST being the pattern from
    /// where PCRE2 stopped.
    pub fn build(pattern: &str, caseless: bool) -> Result<Regex, String> {
        let re = RegexBuilder::new()
            .caseless(caseless)
            .jit_if_available(true)
            .build(pattern)
            .map_err(|e| {
                let text = e.to_string();
                // "PCRE2: error compiling pattern at offset N: MESSAGE"
                let msg = text.splitn(3, ": ").nth(2).unwrap_or(&text);
                let rest = e
                    .offset()
                    .and_then(|o| pattern.get(o.min(pattern.len())..))
                    .unwrap_or("");
                format!("pcre2_compile() failed: {msg} in \"{pattern}\" at \"{rest}\"")
            })?;
        Ok(Regex { re })
    }

    /// Compiles a case-sensitive `pattern` (`~`).
    pub fn new(pattern: &str) -> Result<Regex, String> {
        Regex::build(pattern, false)
    }

    /// Whether the expression matches somewhere in `subject`. A match-time failure (PCRE2's
    /// match or depth limit) counts as no match.
    pub fn is_match(&self, subject: &str) -> bool {
        self.re.is_match(subject.as_bytes()).unwrap_or(false)
    }

    /// Matches `subject`; on a match, `out` holds every group's byte range (group 0 is the
    /// whole match; `None` for a group that did not take part) and the result is `true`. `out`
    /// is left alone when there is no match.
    pub fn captures_into(&self, subject: &str, out: &mut Vec<Option<(usize, usize)>>) -> bool {
        // Most expressions of a scan do not match: they cost one pooled `is_match`.
        if !self.is_match(subject) {
            return false;
        }
        let mut locs = self.re.capture_locations();
        if !matches!(
            self.re.captures_read(&mut locs, subject.as_bytes()),
            Ok(Some(_))
        ) {
            return false;
        }
        out.clear();
        out.extend((0..locs.len()).map(|i| locs.get(i)));
        true
    }

    /// The groups' names by number (`None` for unnamed groups and for group 0).
    pub fn capture_names(&self) -> &[Option<String>] {
        self.re.capture_names()
    }

    /// The number of groups, group 0 included.
    pub fn captures_len(&self) -> usize {
        self.re.captures_len()
    }

    /// The expression as written.
    pub fn as_str(&self) -> &str {
        self.re.as_str()
    }
}

impl std::fmt::Debug for Regex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Regex({:?})", self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::Regex;

    fn caps(re: &str, caseless: bool, s: &str) -> Option<Vec<Option<String>>> {
        let r = Regex::build(re, caseless).unwrap_or_else(|e| panic!("{re}: {e}"));
        let mut out = Vec::new();
        r.captures_into(s, &mut out).then(|| {
            out.iter()
                .map(|m| m.map(|(a, b)| s[a..b].to_string()))
                .collect()
        })
    }

    fn m(re: &str, s: &str) -> bool {
        Regex::new(re)
            .unwrap_or_else(|e| panic!("{re}: {e}"))
            .is_match(s)
    }

    /// Expressions from the configurations nginx users copy (h5bp, WordPress, MediaWiki,
    /// Drupal, nginx's documentation), matched as PCRE matches them.
    #[test]
    fn real_configuration_expressions() {
        // h5bp: hidden files except .well-known (negative look-ahead).
        let h5bp = r"/\.(?!well-known)";
        assert!(m(h5bp, "/.git/config"));
        assert!(m(h5bp, "/a/.htaccess"));
        assert!(!m(h5bp, "/.well-known/acme-challenge/x"));
        assert!(!m(h5bp, "/index.html"));
        // h5bp's variant with an escaped slash.
        assert!(!m(r"/\.(?!well-known\/)", "/.well-known/x"));
        // h5bp: backup and config files.
        let backups = r"(?:\.(?:bak|conf|dist|fla|in[ci]|log|orig|psd|sh|sql|sw[op])|~)$";
        assert!(m(backups, "/site.conf"));
        assert!(m(backups, "/index.php~"));
        assert!(!m(backups, "/index.php"));
        // WordPress / Debian's snippets/fastcgi-php.conf.
        assert_eq!(
            caps(r"^(.+?\.php)(/.*)$", false, "/index.php/a/b"),
            Some(vec![
                Some("/index.php/a/b".into()),
                Some("/index.php".into()),
                Some("/a/b".into())
            ])
        );
        assert_eq!(caps(r"^(.+?\.php)(/.*)$", false, "/index.php"), None);
        assert!(m(r"\.php$", "/wp-login.php"));
        // WordPress: no PHP in uploads (caseless).
        assert!(Regex::build(r"/(?:uploads|files)/.*\.php$", true)
            .unwrap()
            .is_match("/wp-content/UPLOADS/x.PHP"));
        // MediaWiki: a lazy prefix and a named group in both syntaxes.
        let c = caps(r"^/wiki/(?<page>.*)$", false, "/wiki/Main_Page").unwrap();
        assert_eq!(c[1].as_deref(), Some("Main_Page"));
        let r = Regex::new(r"^/(?P<lang>[a-z]{2})/(?'rest'.*)").unwrap();
        assert_eq!(
            r.capture_names(),
            &[None, Some("lang".to_string()), Some("rest".to_string())]
        );
        // Drupal: private files and look-behind.
        assert!(m(r"^/sites/.*/private/", "/sites/default/private/a"));
        assert!(m(r"(?<!/)\.txt$", "/robots.txt"));
        assert!(!m(r"(?<=/)\.txt$", "/robots.txt"));
        // nginx documentation: server_name with a capture, caseless locations.
        let c = caps(r"^(www\.)?(?<domain>.+)$", false, "www.example.com").unwrap();
        assert_eq!(c[2].as_deref(), Some("example.com"));
        assert!(Regex::build(r"\.(gif|jpg|jpeg)$", true)
            .unwrap()
            .is_match("/a/B.JPG"));
    }

    /// What the `regex` crate refused and PCRE has.
    #[test]
    fn pcre_only_syntax() {
        assert!(m(r"^(\w)\1$", "aa")); // backreference
        assert!(!m(r"^(\w)\1$", "ab"));
        assert!(m(r"^\Qa.b\E$", "a.b")); // quoting
        assert!(!m(r"^\Qa.b\E$", "axb"));
        assert!(!m(r"^a++a", "aaa")); // possessive
        assert!(!m(r"^(?>a+)a", "aaa")); // atomic group
        assert!(m(r"^(\((?:[^()]|(?1))*\))$", "(a(b)c)")); // recursion
    }

    #[test]
    fn bad_expressions_name_the_reason() {
        let e = Regex::new("(unclosed").unwrap_err();
        assert_eq!(
            e,
            "pcre2_compile() failed: missing closing parenthesis in \"(unclosed\" at \"\""
        );
        let e = Regex::new("a{2,1}").unwrap_err();
        assert!(
            e.starts_with("pcre2_compile() failed: numbers out of order"),
            "{e}"
        );
    }

    /// Byte mode, as nginx: `.` is one byte (a group may end inside a character), `~*` folds
    /// ASCII only; an unmatched group is `None`.
    #[test]
    fn groups_are_byte_ranges() {
        let r = Regex::new(r"^/(.)(x)?").unwrap();
        let mut out = Vec::new();
        assert!(r.captures_into("/é", &mut out));
        assert_eq!(out, vec![Some((0, 2)), Some((1, 2)), None]);
        assert!(Regex::build("^/É", true).unwrap().is_match("/É"));
        assert!(!Regex::build("^/É", true).unwrap().is_match("/é"));
        // Reused buffers do not leak groups between matches.
        let r = Regex::new(r"^/(a)?(b)").unwrap();
        let mut out = Vec::new();
        assert!(r.captures_into("/ab", &mut out));
        assert!(r.captures_into("/b", &mut out));
        assert_eq!(out, vec![Some((0, 2)), None, Some((1, 2))]);
    }
}
