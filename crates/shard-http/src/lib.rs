//! shard-http: the HTTP/1.1 decisions of shard, as pure functions and small state machines.
//!
//! This crate owns request-head parsing ([`request`]), chunked request bodies ([`body`]),
//! server and location selection ([`route`]), response heads and canned pages ([`response`]),
//! static-file decisions such as conditional requests and byte ranges ([`static_file`]), the
//! combined access-log line ([`access_log`]), gzip decisions and compression ([`gzip`]) and the two
//! date formats HTTP and nginx logs use.
//!
//! It owns no sockets, no file descriptors and no clock: callers pass bytes, `stat` results and
//! the current time in, and get decisions and bytes out. Nothing here panics on any input.

pub mod access_log;
pub mod autoindex;
pub mod body;
pub mod fastcgi;
pub mod gateway;
pub mod grpc;
pub mod gzip;
pub mod h2frame;
pub mod h3;
pub mod hpack;
pub mod proxy;
pub mod proxy_protocol;
pub mod request;
pub mod response;
pub mod route;
pub mod ssi;
pub mod static_file;
pub mod subfilter;
pub mod vars;

const WEEKDAYS: [&str; 7] = ["Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"];
const MONTHS: [&str; 12] = [
    "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
];

/// Broken-down UTC time: (year, month 1..=12, day 1..=31, hour, minute, second, weekday 0=Sun).
pub(crate) struct Civil {
    pub(crate) year: i64,
    pub(crate) month: usize,
    pub(crate) day: u32,
    pub(crate) hour: u32,
    pub(crate) min: u32,
    pub(crate) sec: u32,
    pub(crate) weekday: usize,
}

pub(crate) fn civil(unix_secs: u64) -> Civil {
    let days = (unix_secs / 86_400) as i64;
    let rem = unix_secs % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as usize;
    let year = yoe + era * 400 + i64::from(month <= 2);
    Civil {
        year,
        month,
        day,
        hour: (rem / 3600) as u32,
        min: (rem / 60 % 60) as u32,
        sec: (rem % 60) as u32,
        weekday: ((days + 4) % 7) as usize,
    }
}

/// A short ASCII string kept inline, never allocated: a `Last-Modified` date or an entity
/// tag, made once per static response. Longer input is cut at [`InlineStr::CAP`] bytes (no
/// caller writes that much: a date is at most 37 bytes, an entity tag 35).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct InlineStr {
    len: u8,
    buf: [u8; InlineStr::CAP],
}

impl InlineStr {
    pub const CAP: usize = 40;

    pub const fn new() -> InlineStr {
        InlineStr {
            len: 0,
            buf: [0; InlineStr::CAP],
        }
    }

    /// Appends ASCII bytes (anything else is written as `?`, so the text stays UTF-8).
    pub fn push_bytes(&mut self, b: &[u8]) {
        let at = self.len as usize;
        if b.is_ascii() && b.len() <= Self::CAP - at {
            self.buf[at..at + b.len()].copy_from_slice(b);
            self.len += b.len() as u8;
            return;
        }
        for &c in b {
            let at = self.len as usize;
            if at == Self::CAP {
                return;
            }
            self.buf[at] = if c.is_ascii() { c } else { b'?' };
            self.len += 1;
        }
    }

    pub fn as_str(&self) -> &str {
        let b = &self.buf[..self.len as usize];
        debug_assert!(b.is_ascii());
        // SAFETY: `push_bytes`, the only writer, stores ASCII bytes only, which are UTF-8
        // (checking it again cost as much as writing the date).
        unsafe { std::str::from_utf8_unchecked(b) }
    }
}

impl From<&str> for InlineStr {
    fn from(s: &str) -> InlineStr {
        let mut b = InlineStr::new();
        b.push_bytes(s.as_bytes());
        b
    }
}

impl Default for InlineStr {
    fn default() -> Self {
        InlineStr::new()
    }
}

impl std::ops::Deref for InlineStr {
    type Target = str;
    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl std::fmt::Debug for InlineStr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self.as_str(), f)
    }
}

impl std::fmt::Display for InlineStr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The IMF-fixdate of `unix_secs`, as sent in `Date` and `Last-Modified`:
/// `Sun, 06 Nov 1994 08:49:37 GMT`.
/// An HTTP date (`Sun, 06 Nov 1994 08:49:37 GMT` and the two older forms) in unix seconds.
pub fn parse_http_date(s: &str) -> Option<i64> {
    let t = httpdate::parse_http_date(s).ok()?;
    let d = t.duration_since(std::time::UNIX_EPOCH).ok()?;
    i64::try_from(d.as_secs()).ok()
}

pub fn http_date(unix_secs: u64) -> String {
    http_date_inline(unix_secs).as_str().to_string()
}

/// [`http_date`] without an allocation (`Last-Modified`, once per static response).
pub fn http_date_inline(unix_secs: u64) -> InlineStr {
    // The last date made, per thread: a worker formats the same `Last-Modified` (most
    // files of a site share few times) request after request, and the calendar arithmetic
    // below is about 230 instructions.
    thread_local! {
        static LAST: std::cell::Cell<Option<(u64, InlineStr)>> = const { std::cell::Cell::new(None) };
    }
    if let Some((secs, d)) = LAST.get() {
        if secs == unix_secs {
            return d;
        }
    }
    let d = http_date_compute(unix_secs);
    LAST.set(Some((unix_secs, d)));
    d
}

fn http_date_compute(unix_secs: u64) -> InlineStr {
    let c = civil(unix_secs);
    if !(0..=9999).contains(&c.year) {
        return http_date_long(&c);
    }
    // Each field written in place: pushing field by field cost five times as much.
    let mut d = *b"Thu, 01 Jan 1970 00:00:00 GMT";
    let two = |d: &mut [u8; 29], at: usize, v: u32| {
        d[at] = b'0' + (v / 10 % 10) as u8;
        d[at + 1] = b'0' + (v % 10) as u8;
    };
    d[..3].copy_from_slice(WEEKDAYS[c.weekday].as_bytes());
    two(&mut d, 5, c.day);
    d[8..11].copy_from_slice(MONTHS[c.month - 1].as_bytes());
    let y = c.year as u32;
    two(&mut d, 12, y / 100);
    two(&mut d, 14, y % 100);
    two(&mut d, 17, c.hour);
    two(&mut d, 20, c.min);
    two(&mut d, 23, c.sec);
    let mut b = InlineStr::new();
    b.push_bytes(&d);
    b
}

/// A date whose year has more than four digits (nginx's `%4d` prints them all): rare enough
/// for `format!`.
fn http_date_long(c: &Civil) -> InlineStr {
    InlineStr::from(
        format!(
            "{}, {:02} {} {} {:02}:{:02}:{:02} GMT",
            WEEKDAYS[c.weekday],
            c.day,
            MONTHS[c.month - 1],
            c.year,
            c.hour,
            c.min,
            c.sec
        )
        .as_str(),
    )
}

/// nginx's `$time_local` for `unix_secs`, always in UTC: `06/Nov/1994:08:49:37 +0000`.
pub fn log_time(unix_secs: u64) -> String {
    let c = civil(unix_secs);
    format!(
        "{:02}/{}/{:04}:{:02}:{:02}:{:02} +0000",
        c.day,
        MONTHS[c.month - 1],
        c.year,
        c.hour,
        c.min,
        c.sec
    )
}

/// C's `strftime` for `unix_secs` in UTC (shard's local time is UTC), as SSI's `config
/// timefmt` formats `$date_gmt` and `$date_local`: the conversions nginx users write (`%a %A
/// %b %B %c %d %D %e %F %H %I %j %m %M %n %p %R %s %S %t %T %u %w %y %Y %z %Z %%`); another is
/// copied as it is.
pub fn strftime(fmt: &str, unix_secs: u64) -> String {
    const FULL_DAYS: [&str; 7] = [
        "Sunday",
        "Monday",
        "Tuesday",
        "Wednesday",
        "Thursday",
        "Friday",
        "Saturday",
    ];
    const FULL_MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    use std::fmt::Write as _;
    let c = civil(unix_secs);
    let mut out = String::with_capacity(fmt.len() + 16);
    let mut it = fmt.chars();
    while let Some(ch) = it.next() {
        if ch != '%' {
            out.push(ch);
            continue;
        }
        let Some(conv) = it.next() else {
            out.push('%');
            break;
        };
        let hour12 = if c.hour.is_multiple_of(12) {
            12
        } else {
            c.hour % 12
        };
        let _ = match conv {
            'a' => write!(out, "{}", WEEKDAYS[c.weekday]),
            'A' => write!(out, "{}", FULL_DAYS[c.weekday]),
            'b' | 'h' => write!(out, "{}", MONTHS[c.month - 1]),
            'B' => write!(out, "{}", FULL_MONTHS[c.month - 1]),
            'c' => write!(
                out,
                "{} {} {:2} {:02}:{:02}:{:02} {}",
                WEEKDAYS[c.weekday],
                MONTHS[c.month - 1],
                c.day,
                c.hour,
                c.min,
                c.sec,
                c.year
            ),
            'd' => write!(out, "{:02}", c.day),
            'D' => write!(out, "{:02}/{:02}/{:02}", c.month, c.day, c.year % 100),
            'e' => write!(out, "{:2}", c.day),
            'F' => write!(out, "{:04}-{:02}-{:02}", c.year, c.month, c.day),
            'H' => write!(out, "{:02}", c.hour),
            'I' => write!(out, "{:02}", hour12),
            'j' => write!(out, "{:03}", day_of_year(&c) + 1),
            'm' => write!(out, "{:02}", c.month),
            'M' => write!(out, "{:02}", c.min),
            'n' => writeln!(out),
            'p' => write!(out, "{}", if c.hour < 12 { "AM" } else { "PM" }),
            'R' => write!(out, "{:02}:{:02}", c.hour, c.min),
            's' => write!(out, "{unix_secs}"),
            'S' => write!(out, "{:02}", c.sec),
            't' => write!(out, "\t"),
            'T' => write!(out, "{:02}:{:02}:{:02}", c.hour, c.min, c.sec),
            'u' => write!(out, "{}", if c.weekday == 0 { 7 } else { c.weekday }),
            'w' => write!(out, "{}", c.weekday),
            'y' => write!(out, "{:02}", c.year % 100),
            'Y' => write!(out, "{}", c.year),
            'z' => write!(out, "+0000"),
            'Z' => write!(out, "GMT"),
            '%' => write!(out, "%"),
            other => write!(out, "%{other}"),
        };
    }
    out
}

/// Days since 1 January of `c`'s year.
fn day_of_year(c: &Civil) -> u32 {
    const BEFORE: [u32; 12] = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let leap = (c.year % 4 == 0 && c.year % 100 != 0) || c.year % 400 == 0;
    BEFORE[c.month - 1] + c.day - 1 + u32::from(leap && c.month > 2)
}

/// nginx's `$time_iso8601` for `unix_secs`, in UTC: `1994-11-06T08:49:37+00:00`.
pub fn iso8601_time(unix_secs: u64) -> String {
    let c = civil(unix_secs);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}+00:00",
        c.year, c.month, c.day, c.hour, c.min, c.sec
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    #[test]
    fn known_dates() {
        assert_eq!(http_date(784_111_777), "Sun, 06 Nov 1994 08:49:37 GMT");
        assert_eq!(log_time(784_111_777), "06/Nov/1994:08:49:37 +0000");
        assert_eq!(
            strftime("%A, %d-%b-%Y %H:%M:%S %Z|%j|%s|%q", 784_111_777),
            "Sunday, 06-Nov-1994 08:49:37 GMT|310|784111777|%q"
        );
        assert_eq!(iso8601_time(784_111_777), "1994-11-06T08:49:37+00:00");
        assert_eq!(http_date(0), "Thu, 01 Jan 1970 00:00:00 GMT");
        assert_eq!(http_date(1_795_000_000), "Wed, 18 Nov 2026 11:06:40 GMT");
        assert_eq!(http_date(951_782_400), "Tue, 29 Feb 2000 00:00:00 GMT");
        assert_eq!(http_date(253_402_300_799), "Fri, 31 Dec 9999 23:59:59 GMT");
        // Five digits and more: every one, as nginx's `%4d`.
        assert_eq!(http_date(253_402_300_800), "Sat, 01 Jan 10000 00:00:00 GMT");
        // The last date is kept per thread: the same time again, then another, then back.
        for _ in 0..2 {
            assert_eq!(http_date(0), "Thu, 01 Jan 1970 00:00:00 GMT");
            assert_eq!(http_date(0), "Thu, 01 Jan 1970 00:00:00 GMT");
            assert_eq!(http_date(784_111_777), "Sun, 06 Nov 1994 08:49:37 GMT");
        }
    }

    #[test]
    fn agrees_with_httpdate() {
        let mut s: u64 = 1;
        for i in 0..20_000u64 {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let t = if i % 2 == 0 {
                s % 4_102_444_800
            } else {
                i * 86_399
            };
            let want = httpdate::fmt_http_date(UNIX_EPOCH + Duration::from_secs(t));
            assert_eq!(http_date(t), want, "{t}");
        }
    }

    #[test]
    fn huge_times_do_not_panic() {
        let _ = http_date(u64::MAX);
        let _ = log_time(u64::MAX);
    }
}

#[doc(hidden)]
pub mod fuzz;

/// Standard base64 (RFC 4648) with `=` padding.
pub fn base64_encode(data: &[u8]) -> String {
    const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &b)| n | u32::from(b) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(B64[(n >> (18 - 6 * i) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// A cookie's `expires` date as nginx's `ngx_cookie_time` writes it: `Thu, 31-Dec-37
/// 23:55:55 GMT`, with a two-digit year up to 2037 and the whole year after.
pub fn cookie_time(unix_secs: u64) -> String {
    let c = civil(unix_secs);
    let year = if c.year > 2037 {
        c.year.to_string()
    } else {
        format!("{:02}", c.year % 100)
    };
    format!(
        "{}, {:02}-{}-{} {:02}:{:02}:{:02} GMT",
        WEEKDAYS[c.weekday],
        c.day,
        MONTHS[c.month - 1],
        year,
        c.hour,
        c.min,
        c.sec
    )
}

/// Standard base64 (RFC 4648, with or without `=` padding); `None` for anything else.
pub fn base64_decode(s: &str) -> Option<Vec<u8>> {
    let val = |c: u8| -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    };
    let t = s.trim_end_matches('=');
    if s.len() - t.len() > 2 || t.len() % 4 == 1 {
        return None;
    }
    let mut out = Vec::with_capacity(t.len() * 3 / 4);
    for chunk in t.as_bytes().chunks(4) {
        let mut n = 0u32;
        for (i, &c) in chunk.iter().enumerate() {
            n |= val(c)? << (18 - 6 * i);
        }
        out.push((n >> 16) as u8);
        if chunk.len() > 2 {
            out.push((n >> 8) as u8);
        }
        if chunk.len() > 3 {
            out.push(n as u8);
        }
    }
    Some(out)
}

#[cfg(test)]
mod base64_tests {
    #[test]
    fn encodes_and_cookie_times() {
        for (dec, enc) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
        ] {
            assert_eq!(super::base64_encode(dec.as_bytes()), enc);
        }
        assert_eq!(
            super::cookie_time(2145916555),
            "Thu, 31-Dec-37 23:55:55 GMT"
        );
        assert_eq!(super::cookie_time(0), "Thu, 01-Jan-70 00:00:00 GMT");
    }

    #[test]
    fn decodes_rfc_4648_vectors() {
        for (enc, dec) in [
            ("", ""),
            ("Zg==", "f"),
            ("Zm8=", "fo"),
            ("Zm9v", "foo"),
            ("Zm9vYg==", "foob"),
            ("Zm9vYmE", "fooba"),
            ("Zm9vYmFy", "foobar"),
        ] {
            assert_eq!(
                super::base64_decode(enc).as_deref(),
                Some(dec.as_bytes()),
                "{enc}"
            );
        }
        assert_eq!(super::base64_decode("Z"), None);
        assert_eq!(super::base64_decode("Zm9v!"), None);
        assert_eq!(super::base64_decode("Zg==="), None);
    }
}
