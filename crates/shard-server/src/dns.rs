//! DNS messages as the worker's resolver sends and reads them (RFC 1035, AAAA of RFC 3596):
//! one question per query, A or AAAA, answers followed through CNAMEs.
//!
//! This module owns the bytes only: [`query`] writes a question, [`parse`] reads an answer
//! and checks that it answers that question. Sockets, retries, the cache and who waits are
//! `worker/resolver.rs`'s.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

pub const TYPE_A: u16 = 1;
pub const TYPE_CNAME: u16 = 5;
pub const TYPE_AAAA: u16 = 28;
const CLASS_IN: u16 = 1;
/// Longest name on the wire (RFC 1035 2.3.4).
const NAME_MAX: usize = 255;
/// Most compression pointers followed in one name (a loop guard).
const POINTERS_MAX: usize = 32;
/// Most CNAMEs followed in one answer.
const CNAMES_MAX: usize = 8;

/// Why a query failed, with nginx's numbers and words (`(3: Host not found)`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DnsError {
    FormatError,
    ServerFailure,
    HostNotFound,
    Unimplemented,
    Refused,
    /// No answer within `resolver_timeout`.
    TimedOut,
    /// The answer is not one of ours or cannot be read: it is ignored, as nginx does.
    Invalid,
}

impl DnsError {
    pub fn text(self) -> &'static str {
        match self {
            DnsError::FormatError => "1: Format error",
            DnsError::ServerFailure => "2: Server failure",
            DnsError::HostNotFound => "3: Host not found",
            DnsError::Unimplemented => "4: Unimplemented",
            DnsError::Refused => "5: Operation refused",
            DnsError::TimedOut => "110: Operation timed out",
            DnsError::Invalid => "Invalid response",
        }
    }
}

/// What an answer said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// The addresses (possibly none: the name exists without records of this type) and the
    /// smallest TTL among the records used, in seconds.
    Addrs(Vec<IpAddr>, u32),
    /// The answer did not fit in UDP (TC): ask again over TCP.
    Truncated,
    /// Only a CNAME (chain) whose last name has no records here: ask for that name, as
    /// nginx's resolver does; the TTL is the chain's smallest.
    Cname(String, u32),
}

/// Whether `name` can be asked for: labels of 1 to 63 letters, digits, `-` and `_`, 255
/// bytes in all.
pub fn valid_name(name: &str) -> bool {
    let name = name.strip_suffix('.').unwrap_or(name);
    !name.is_empty()
        && name.len() <= NAME_MAX
        && name.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes()
                    .all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_')
        })
}

/// A query for `name` (checked by [`valid_name`]) and `qtype`, recursion desired.
pub fn query(id: u16, name: &str, qtype: u16) -> Vec<u8> {
    let mut q = Vec::with_capacity(18 + name.len());
    q.extend_from_slice(&id.to_be_bytes());
    q.extend_from_slice(&[0x01, 0x00]); // RD
    q.extend_from_slice(&[0, 1, 0, 0, 0, 0, 0, 0]); // one question
    for label in name.trim_end_matches('.').split('.') {
        q.push(label.len() as u8);
        q.extend_from_slice(label.as_bytes());
    }
    q.push(0);
    q.extend_from_slice(&qtype.to_be_bytes());
    q.extend_from_slice(&CLASS_IN.to_be_bytes());
    q
}

/// Reads the answer to the question (`id`, `name`, `qtype`).
pub fn parse(buf: &[u8], id: u16, name: &str, qtype: u16) -> Result<Answer, DnsError> {
    if buf.len() < 12 || u16::from_be_bytes([buf[0], buf[1]]) != id {
        return Err(DnsError::Invalid);
    }
    let flags = u16::from_be_bytes([buf[2], buf[3]]);
    if flags & 0x8000 == 0 {
        return Err(DnsError::Invalid); // not a response
    }
    let qd = u16::from_be_bytes([buf[4], buf[5]]);
    let an = u16::from_be_bytes([buf[6], buf[7]]);
    if qd != 1 {
        return Err(DnsError::Invalid);
    }
    let mut pos = 12;
    let qname = read_name(buf, &mut pos).ok_or(DnsError::Invalid)?;
    if pos + 4 > buf.len() {
        return Err(DnsError::Invalid);
    }
    let qt = u16::from_be_bytes([buf[pos], buf[pos + 1]]);
    pos += 4;
    if !qname.eq_ignore_ascii_case(name.trim_end_matches('.')) || qt != qtype {
        return Err(DnsError::Invalid);
    }
    if flags & 0x0200 != 0 {
        return Ok(Answer::Truncated);
    }
    match flags & 0x000f {
        0 => {}
        1 => return Err(DnsError::FormatError),
        2 => return Err(DnsError::ServerFailure),
        3 => return Err(DnsError::HostNotFound),
        4 => return Err(DnsError::Unimplemented),
        5 => return Err(DnsError::Refused),
        _ => return Err(DnsError::ServerFailure),
    }
    // The records, then those of the name and of the CNAMEs it leads to.
    let mut records = Vec::new();
    for _ in 0..an {
        let owner = read_name(buf, &mut pos).ok_or(DnsError::Invalid)?;
        if pos + 10 > buf.len() {
            return Err(DnsError::Invalid);
        }
        let t = u16::from_be_bytes([buf[pos], buf[pos + 1]]);
        let class = u16::from_be_bytes([buf[pos + 2], buf[pos + 3]]);
        let ttl = u32::from_be_bytes([buf[pos + 4], buf[pos + 5], buf[pos + 6], buf[pos + 7]]);
        let len = usize::from(u16::from_be_bytes([buf[pos + 8], buf[pos + 9]]));
        pos += 10;
        if pos + len > buf.len() {
            return Err(DnsError::Invalid);
        }
        let data_at = pos;
        pos += len;
        if class != CLASS_IN {
            continue;
        }
        records.push((owner, t, ttl, data_at, len));
    }
    let mut wanted = vec![qname];
    let mut ttl_min = u32::MAX;
    // CNAMEs first (they may come in any order), a bounded number of steps.
    for _ in 0..CNAMES_MAX {
        let mut grew = false;
        for (owner, t, ttl, at, _) in &records {
            if *t == TYPE_CNAME && wanted.iter().any(|w| w.eq_ignore_ascii_case(owner)) {
                let mut p = *at;
                let target = read_name(buf, &mut p).ok_or(DnsError::Invalid)?;
                if !wanted.iter().any(|w| w.eq_ignore_ascii_case(&target)) {
                    wanted.push(target);
                    ttl_min = ttl_min.min(*ttl);
                    grew = true;
                }
            }
        }
        if !grew {
            break;
        }
    }
    let mut addrs = Vec::new();
    for (owner, t, ttl, at, len) in &records {
        if *t != qtype || !wanted.iter().any(|w| w.eq_ignore_ascii_case(owner)) {
            continue;
        }
        let d = &buf[*at..*at + *len];
        let ip = match (qtype, len) {
            (TYPE_A, 4) => IpAddr::V4(Ipv4Addr::new(d[0], d[1], d[2], d[3])),
            (TYPE_AAAA, 16) => {
                let mut o = [0u8; 16];
                o.copy_from_slice(d);
                IpAddr::V6(Ipv6Addr::from(o))
            }
            _ => return Err(DnsError::Invalid),
        };
        // Every record counts, a repeated address too: nginx's round robin tries each.
        addrs.push(ip);
        ttl_min = ttl_min.min(*ttl);
    }
    let ttl = if ttl_min == u32::MAX { 0 } else { ttl_min };
    if addrs.is_empty() && wanted.len() > 1 {
        let target = wanted.pop().unwrap_or_default();
        return Ok(Answer::Cname(target, ttl));
    }
    Ok(Answer::Addrs(addrs, ttl))
}

/// A name at `pos` (compression pointers followed), lowercase labels joined by dots.
fn read_name(buf: &[u8], pos: &mut usize) -> Option<String> {
    let mut name = String::new();
    let mut at = *pos;
    let mut jumped = false;
    let mut pointers = 0;
    loop {
        let len = *buf.get(at)? as usize;
        if len & 0xc0 == 0xc0 {
            let lo = *buf.get(at + 1)? as usize;
            if !jumped {
                *pos = at + 2;
            }
            jumped = true;
            pointers += 1;
            if pointers > POINTERS_MAX {
                return None;
            }
            at = ((len & 0x3f) << 8) | lo;
            continue;
        }
        if len & 0xc0 != 0 {
            return None;
        }
        at += 1;
        if len == 0 {
            break;
        }
        let label = buf.get(at..at + len)?;
        if !name.is_empty() {
            name.push('.');
        }
        name.push_str(std::str::from_utf8(label).ok()?);
        if name.len() > NAME_MAX {
            return None;
        }
        at += len;
    }
    if !jumped {
        *pos = at;
    }
    Some(name)
}

/// A response to `question` (a query this module wrote), for the tests' DNS servers: `addrs`
/// as records of the asked type with `ttl`, behind an optional CNAME; `rcode` and `tc` as
/// given.
pub fn answer_for(question: &[u8], addrs: &[IpAddr], ttl: u32, rcode: u8, tc: bool) -> Vec<u8> {
    let mut pos = 12;
    let name = read_name(question, &mut pos).unwrap_or_default();
    let qtype = question
        .get(pos..pos + 2)
        .map_or(TYPE_A, |b| u16::from_be_bytes([b[0], b[1]]));
    let qend = (pos + 4).min(question.len());
    let records: Vec<&IpAddr> = addrs
        .iter()
        .filter(|a| (qtype == TYPE_A) == a.is_ipv4())
        .collect();
    let mut r = question[..qend].to_vec();
    r[2] = 0x81 | if tc { 0x02 } else { 0 };
    r[3] = 0x80 | (rcode & 0x0f);
    r[6..8].copy_from_slice(&(records.len() as u16).to_be_bytes());
    r[8..12].fill(0);
    let _ = name;
    for a in records {
        r.extend_from_slice(&[0xc0, 12]);
        r.extend_from_slice(&qtype.to_be_bytes());
        r.extend_from_slice(&CLASS_IN.to_be_bytes());
        r.extend_from_slice(&ttl.to_be_bytes());
        match a {
            IpAddr::V4(v) => {
                r.extend_from_slice(&4u16.to_be_bytes());
                r.extend_from_slice(&v.octets());
            }
            IpAddr::V6(v) => {
                r.extend_from_slice(&16u16.to_be_bytes());
                r.extend_from_slice(&v.octets());
            }
        }
    }
    r
}

/// An answer to `question` that is a CNAME to `target` alone (the tests' name servers).
pub fn answer_cname(question: &[u8], target: &str, ttl: u32) -> Vec<u8> {
    let mut pos = 12;
    let _ = read_name(question, &mut pos);
    let qend = (pos + 4).min(question.len());
    let mut r = question[..qend].to_vec();
    r[2] = 0x81;
    r[3] = 0x80;
    r[6..8].copy_from_slice(&1u16.to_be_bytes());
    r[8..12].fill(0);
    let mut data = Vec::new();
    for label in target.trim_end_matches('.').split('.') {
        data.push(label.len() as u8);
        data.extend_from_slice(label.as_bytes());
    }
    data.push(0);
    r.extend_from_slice(&[0xc0, 12]);
    r.extend_from_slice(&TYPE_CNAME.to_be_bytes());
    r.extend_from_slice(&CLASS_IN.to_be_bytes());
    r.extend_from_slice(&ttl.to_be_bytes());
    r.extend_from_slice(&(data.len() as u16).to_be_bytes());
    r.extend_from_slice(&data);
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        assert!(valid_name("api.example.com"));
        assert!(valid_name("a-b_c.d."));
        assert!(!valid_name(""));
        assert!(!valid_name("a..b"));
        assert!(!valid_name("a b.com"));
        assert!(!valid_name(&"x".repeat(64)));
    }

    #[test]
    fn answers_round_trip() {
        let q = query(0x1234, "Api.Example.com", TYPE_A);
        assert_eq!(&q[..2], &[0x12, 0x34]);
        let ips: Vec<IpAddr> = vec!["10.0.0.1".parse().unwrap(), "::1".parse().unwrap()];
        let r = answer_for(&q, &ips, 60, 0, false);
        assert_eq!(
            parse(&r, 0x1234, "api.example.com", TYPE_A),
            Ok(Answer::Addrs(vec!["10.0.0.1".parse().unwrap()], 60))
        );
        let q6 = query(7, "x.test", TYPE_AAAA);
        let r6 = answer_for(&q6, &ips, 5, 0, false);
        assert_eq!(
            parse(&r6, 7, "x.test", TYPE_AAAA),
            Ok(Answer::Addrs(vec!["::1".parse().unwrap()], 5))
        );
        // Another id, another name, another type: not ours.
        assert_eq!(
            parse(&r, 0x1235, "api.example.com", TYPE_A),
            Err(DnsError::Invalid)
        );
        assert_eq!(
            parse(&r, 0x1234, "other.example.com", TYPE_A),
            Err(DnsError::Invalid)
        );
        assert_eq!(
            parse(&r, 0x1234, "api.example.com", TYPE_AAAA),
            Err(DnsError::Invalid)
        );
        assert_eq!(
            parse(
                &answer_for(&q, &[], 0, 3, false),
                0x1234,
                "api.example.com",
                TYPE_A
            ),
            Err(DnsError::HostNotFound)
        );
        assert_eq!(
            parse(
                &answer_for(&q, &[], 0, 0, true),
                0x1234,
                "api.example.com",
                TYPE_A
            ),
            Ok(Answer::Truncated)
        );
        // Truncated garbage never panics.
        for n in 0..r.len() {
            let _ = parse(&r[..n], 0x1234, "api.example.com", TYPE_A);
        }
    }

    #[test]
    fn cnames_are_followed() {
        // www.test CNAME web.test; web.test A 192.0.2.1 (and an unrelated A record).
        let q = query(1, "www.test", TYPE_A);
        let mut r = q.clone();
        r[2] = 0x81;
        r[3] = 0x80;
        r[6..8].copy_from_slice(&3u16.to_be_bytes());
        // CNAME: owner pointer to the question, target "web.test".
        r.extend_from_slice(&[0xc0, 12, 0, 5, 0, 1, 0, 0, 0, 100, 0, 6]);
        let target_at = r.len();
        r.extend_from_slice(&[3, b'w', b'e', b'b', 0xc0, 16]);
        // A for web.test (pointer to the CNAME's target).
        r.extend_from_slice(&[
            0xc0,
            target_at as u8,
            0,
            1,
            0,
            1,
            0,
            0,
            0,
            30,
            0,
            4,
            192,
            0,
            2,
            1,
        ]);
        // A for an unrelated name (the root label).
        r.extend_from_slice(&[0, 0, 1, 0, 1, 0, 0, 0, 30, 0, 4, 10, 9, 9, 9]);
        assert_eq!(
            parse(&r, 1, "www.test", TYPE_A),
            Ok(Answer::Addrs(vec!["192.0.2.1".parse().unwrap()], 30))
        );
        // A CNAME alone: its target is to be asked.
        let only = answer_cname(&q, "web.test", 100);
        assert_eq!(
            parse(&only, 1, "www.test", TYPE_A),
            Ok(Answer::Cname("web.test".into(), 100))
        );
        // A pointer loop is refused, not followed forever.
        let mut bad = q.clone();
        bad[2] = 0x81;
        bad[6..8].copy_from_slice(&1u16.to_be_bytes());
        let at = bad.len();
        bad.extend_from_slice(&[0xc0, at as u8, 0, 1, 0, 1, 0, 0, 0, 1, 0, 4, 1, 2, 3, 4]);
        assert_eq!(parse(&bad, 1, "www.test", TYPE_A), Err(DnsError::Invalid));
    }
}
