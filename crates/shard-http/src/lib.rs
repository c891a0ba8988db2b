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
pub mod body;
pub mod gzip;
pub mod proxy;
pub mod request;
pub mod response;
pub mod route;
pub mod static_file;
pub mod vars;

const WEEKDAYS: [&str; 7] = ["Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"];
const MONTHS: [&str; 12] = [
    "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
];

/// Broken-down UTC time: (year, month 1..=12, day 1..=31, hour, minute, second, weekday 0=Sun).
struct Civil {
    year: i64,
    month: usize,
    day: u32,
    hour: u32,
    min: u32,
    sec: u32,
    weekday: usize,
}

fn civil(unix_secs: u64) -> Civil {
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

/// The IMF-fixdate of `unix_secs`, as sent in `Date` and `Last-Modified`:
/// `Sun, 06 Nov 1994 08:49:37 GMT`.
pub fn http_date(unix_secs: u64) -> String {
    let c = civil(unix_secs);
    // Written byte by byte: `format!` costs about ten times as much, once per static response
    // (`Last-Modified`).
    let mut b = Vec::with_capacity(29);
    b.extend_from_slice(WEEKDAYS[c.weekday].as_bytes());
    b.extend_from_slice(b", ");
    two_digits(&mut b, c.day);
    b.push(b' ');
    b.extend_from_slice(MONTHS[c.month - 1].as_bytes());
    b.push(b' ');
    four_digits(&mut b, c.year);
    b.push(b' ');
    two_digits(&mut b, c.hour);
    b.push(b':');
    two_digits(&mut b, c.min);
    b.push(b':');
    two_digits(&mut b, c.sec);
    b.extend_from_slice(b" GMT");
    // Only ASCII was written.
    String::from_utf8(b).unwrap_or_default()
}

fn two_digits(b: &mut Vec<u8>, v: u32) {
    b.push(b'0' + (v / 10 % 10) as u8);
    b.push(b'0' + (v % 10) as u8);
}

/// Years 0..=9999 as four digits (nginx's `%4d`); beyond that, every digit.
fn four_digits(b: &mut Vec<u8>, y: i64) {
    if (0..=9999).contains(&y) {
        let y = y as u32;
        two_digits(b, y / 100);
        two_digits(b, y % 100);
    } else {
        b.extend_from_slice(y.to_string().as_bytes());
    }
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
        assert_eq!(iso8601_time(784_111_777), "1994-11-06T08:49:37+00:00");
        assert_eq!(http_date(0), "Thu, 01 Jan 1970 00:00:00 GMT");
        assert_eq!(http_date(1_795_000_000), "Wed, 18 Nov 2026 11:06:40 GMT");
        assert_eq!(http_date(951_782_400), "Tue, 29 Feb 2000 00:00:00 GMT");
        assert_eq!(http_date(253_402_300_799), "Fri, 31 Dec 9999 23:59:59 GMT");
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
