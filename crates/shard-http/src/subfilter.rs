//! `sub_filter` (`ngx_http_sub_filter_module`): strings of a response body replaced by
//! others, matched without case, as the body streams by.
//!
//! It owns the matching across the pieces a body arrives in: a piece's end that could start
//! a match is held back until the next piece says whether it does. No I/O; the worker feeds
//! it the bytes of a response and writes what it gives back.

/// The body filter of one response: patterns (lowercase) with their replacements, in the
/// order of the configuration.
#[derive(Debug)]
pub struct SubFilter {
    pairs: Vec<(Vec<u8>, Vec<u8>)>,
    /// `sub_filter_once`: each pattern is replaced at its first match only.
    once: bool,
    used: Vec<bool>,
    /// Bytes held back: the start of a possible match at the end of the last piece.
    held: Vec<u8>,
    /// The bytes any pattern starts with, either case.
    first: [bool; 256],
}

impl SubFilter {
    /// A filter for `pairs` (patterns matched without case; empty ones are dropped, as
    /// nginx drops a pattern a variable left empty). `None` when no pattern is left.
    pub fn new(pairs: Vec<(Vec<u8>, Vec<u8>)>, once: bool) -> Option<SubFilter> {
        let pairs: Vec<(Vec<u8>, Vec<u8>)> = pairs
            .into_iter()
            .filter(|(p, _)| !p.is_empty())
            .map(|(p, r)| (p.to_ascii_lowercase(), r))
            .collect();
        if pairs.is_empty() {
            return None;
        }
        let mut first = [false; 256];
        for (p, _) in &pairs {
            first[usize::from(p[0])] = true;
            first[usize::from(p[0].to_ascii_uppercase())] = true;
        }
        Some(SubFilter {
            used: vec![false; pairs.len()],
            pairs,
            once,
            held: Vec::new(),
            first,
        })
    }

    /// Filters the next piece of the body into `out`.
    pub fn feed(&mut self, data: &[u8], out: &mut Vec<u8>) {
        if self.held.is_empty() {
            self.run(data, out, false);
        } else {
            let mut buf = std::mem::take(&mut self.held);
            buf.extend_from_slice(data);
            self.run(&buf, out, false);
        }
    }

    /// The body ended: what was held back goes out as it is (no match can complete).
    pub fn finish(&mut self, out: &mut Vec<u8>) {
        let held = std::mem::take(&mut self.held);
        self.run(&held, out, true);
    }

    /// Every pattern was replaced once (`sub_filter_once`): the rest passes untouched.
    fn done(&self) -> bool {
        self.once && self.used.iter().all(|&u| u)
    }

    fn run(&mut self, buf: &[u8], out: &mut Vec<u8>, last: bool) {
        let mut i = 0;
        let mut copied = 0;
        'scan: while i < buf.len() {
            if self.done() {
                break;
            }
            if !self.first[usize::from(buf[i])] {
                i += 1;
                continue;
            }
            let rest = &buf[i..];
            let mut partial = false;
            for (k, (p, r)) in self.pairs.iter().enumerate() {
                if self.once && self.used[k] {
                    continue;
                }
                if rest.len() >= p.len() {
                    if rest[..p.len()].eq_ignore_ascii_case(p) {
                        out.extend_from_slice(&buf[copied..i]);
                        out.extend_from_slice(r);
                        i += p.len();
                        copied = i;
                        self.used[k] = true;
                        continue 'scan;
                    }
                } else if !last && rest.eq_ignore_ascii_case(&p[..rest.len()]) {
                    partial = true;
                }
            }
            if partial {
                // Perhaps the start of a match: the next piece decides.
                out.extend_from_slice(&buf[copied..i]);
                self.held.extend_from_slice(&buf[i..]);
                return;
            }
            i += 1;
        }
        out.extend_from_slice(&buf[copied..]);
    }
}

#[cfg(test)]
mod tests {
    use super::SubFilter;

    fn run(pairs: &[(&str, &str)], once: bool, pieces: &[&str]) -> String {
        let pairs = pairs
            .iter()
            .map(|(p, r)| (p.as_bytes().to_vec(), r.as_bytes().to_vec()))
            .collect();
        let mut f = SubFilter::new(pairs, once).unwrap();
        let mut out = Vec::new();
        for p in pieces {
            f.feed(p.as_bytes(), &mut out);
        }
        f.finish(&mut out);
        String::from_utf8(out).unwrap()
    }

    /// nginx's sub_filter.t cases.
    #[test]
    fn matches_as_nginx() {
        assert_eq!(run(&[("foo", "bar")], true, &["foo"]), "bar");
        assert_eq!(run(&[("foo", "bar")], true, &["FOO"]), "bar", "caseless");
        assert_eq!(run(&[("foo", "bar")], true, &["foofoo"]), "barfoo", "once");
        assert_eq!(run(&[("foo", "bar")], false, &["foofoo"]), "barbar", "many");
        assert_eq!(run(&[("foo", "bar")], false, &["fo"]), "fo", "incomplete");
        assert_eq!(run(&[("foo", "bar")], false, &["foofo"]), "barfo");
        assert_eq!(run(&[("abac", "_r")], true, &["abaabac"]), "aba_r");
        assert_eq!(run(&[("abac", "_r")], true, &["ababac"]), "ab_r");
        assert_eq!(run(&[("ababX", "_r")], true, &["abababX"]), "ab_r");
        assert_eq!(run(&[("aab", "_r")], true, &["aaaab"]), "aa_r");
        assert_eq!(run(&[("A", "B")], true, &["CAAC"]), "CBAC");
        assert_eq!(run(&[("A", "B")], false, &["CAAC"]), "CBBC");
    }

    #[test]
    fn a_match_split_across_pieces_is_found() {
        assert_eq!(
            run(&[("foo", "bar")], false, &["xf", "o", "oy", "fo"]),
            "xbaryfo"
        );
        assert_eq!(run(&[("abc", "_")], false, &["ab", "ab", "c"]), "ab_");
        // Several patterns, each once.
        assert_eq!(run(&[("a", "1"), ("b", "2")], true, &["abab"]), "12ab");
        assert!(SubFilter::new(vec![(Vec::new(), b"x".to_vec())], true).is_none());
    }
}
