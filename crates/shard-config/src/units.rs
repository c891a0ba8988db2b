//! nginx's sizes (`8k`, `1m`, `1g`, bytes) and times (`75s`, `500ms`, `1m30s`, plain seconds).

/// Parses a size: a decimal number of bytes with an optional `k`, `m` or `g` suffix
/// (either case). `None` when malformed or overflowing.
pub fn parse_size(s: &str) -> Option<u64> {
    let (num, mult) = match s.as_bytes().last()? {
        b'k' | b'K' => (&s[..s.len() - 1], 1u64 << 10),
        b'm' | b'M' => (&s[..s.len() - 1], 1u64 << 20),
        b'g' | b'G' => (&s[..s.len() - 1], 1u64 << 30),
        _ => (s, 1),
    };
    if num.is_empty() || !num.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    num.parse::<u64>().ok()?.checked_mul(mult)
}

/// Parses a time into milliseconds: a sequence of `NUMBER UNIT` with units `ms`, `s`, `m`,
/// `h`, `d`, `w`, `M` (30 days), `y` (365 days); a bare trailing number is seconds.
pub fn parse_time_ms(s: &str) -> Option<u64> {
    let b = s.as_bytes();
    if b.is_empty() {
        return None;
    }
    let mut i = 0;
    let mut total: u64 = 0;
    while i < b.len() {
        let start = i;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        if i == start {
            return None;
        }
        let n: u64 = s[start..i].parse().ok()?;
        let mult: u64 = if i == b.len() {
            1000
        } else if b[i..].starts_with(b"ms") {
            i += 2;
            1
        } else {
            let m = match b[i] {
                b's' => 1000,
                b'm' => 60_000,
                b'h' => 3_600_000,
                b'd' => 86_400_000,
                b'w' => 7 * 86_400_000,
                b'M' => 30 * 86_400_000,
                b'y' => 365 * 86_400_000,
                _ => return None,
            };
            i += 1;
            m
        };
        total = total.checked_add(n.checked_mul(mult)?)?;
    }
    Some(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("0"), Some(0));
        assert_eq!(parse_size("1024"), Some(1024));
        assert_eq!(parse_size("1k"), Some(1024));
        assert_eq!(parse_size("8K"), Some(8192));
        assert_eq!(parse_size("1m"), Some(1 << 20));
        assert_eq!(parse_size("2M"), Some(2 << 20));
        assert_eq!(parse_size("1g"), Some(1 << 30));
        assert_eq!(parse_size(""), None);
        assert_eq!(parse_size("k"), None);
        assert_eq!(parse_size("1x"), None);
        assert_eq!(parse_size("-1"), None);
        assert_eq!(parse_size("1.5k"), None);
        assert_eq!(parse_size("99999999999999999999g"), None);
    }

    #[test]
    fn times() {
        assert_eq!(parse_time_ms("75s"), Some(75_000));
        assert_eq!(parse_time_ms("75"), Some(75_000));
        assert_eq!(parse_time_ms("0"), Some(0));
        assert_eq!(parse_time_ms("500ms"), Some(500));
        assert_eq!(parse_time_ms("1m"), Some(60_000));
        assert_eq!(parse_time_ms("1h"), Some(3_600_000));
        assert_eq!(parse_time_ms("1d"), Some(86_400_000));
        assert_eq!(parse_time_ms("1m30s"), Some(90_000));
        assert_eq!(parse_time_ms("1h1m1s1ms"), Some(3_661_001));
        assert_eq!(parse_time_ms(""), None);
        assert_eq!(parse_time_ms("s"), None);
        assert_eq!(parse_time_ms("10x"), None);
        assert_eq!(parse_time_ms("1.5s"), None);
    }
}
