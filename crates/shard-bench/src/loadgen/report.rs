//! The load report as text (a summary plus a log2 latency histogram in the style of
//! Cloudflare's mmhistogram) or as one JSON object with the same numbers.

use std::fmt::Write as _;

use hdrhistogram::Histogram;

use super::{LoadReport, LoadSpec};

/// Latency counts in power-of-two microsecond buckets: `(from, count)` where the bucket holds
/// values in `from..2 * from` (`from` 0 holds 0), from the lowest to the highest non-empty
/// bucket, empty buckets between included.
pub fn log2_buckets(h: &Histogram<u64>) -> Vec<(u64, u64)> {
    let bucket = |v: u64| if v == 0 { 0 } else { 64 - v.leading_zeros() };
    let mut counts = [0u64; 65];
    for v in h.iter_recorded() {
        // HDR buckets never straddle a power of two: their lowest value decides.
        let low = h.lowest_equivalent(v.value_iterated_to());
        counts[bucket(low) as usize] += v.count_at_value();
    }
    let Some(first) = counts.iter().position(|&c| c > 0) else {
        return Vec::new();
    };
    let last = counts.iter().rposition(|&c| c > 0).unwrap_or(first);
    (first..=last)
        .map(|b| (if b == 0 { 0 } else { 1u64 << (b - 1) }, counts[b]))
        .collect()
}

struct Summary {
    min: u64,
    mean: f64,
    p50: u64,
    p90: u64,
    p99: u64,
    p999: u64,
    max: u64,
    stdev: f64,
}

fn summary(h: &Histogram<u64>) -> Summary {
    if h.is_empty() {
        return Summary {
            min: 0,
            mean: 0.0,
            p50: 0,
            p90: 0,
            p99: 0,
            p999: 0,
            max: 0,
            stdev: 0.0,
        };
    }
    Summary {
        min: h.min(),
        mean: h.mean(),
        p50: h.value_at_quantile(0.5),
        p90: h.value_at_quantile(0.9),
        p99: h.value_at_quantile(0.99),
        p999: h.value_at_quantile(0.999),
        max: h.max(),
        stdev: h.stdev(),
    }
}

fn mode(spec: &LoadSpec) -> String {
    format!(
        "{}, {}",
        if spec.close {
            "connection per request"
        } else {
            "keep-alive"
        },
        match spec.rate {
            Some(r) => format!("open loop at {r} req/s (latency from the intended send time)"),
            None => "closed loop".to_string(),
        }
    )
}

/// The report for people: summary lines, errors, then the log2 histogram.
pub fn render_text(spec: &LoadSpec, r: &LoadReport) -> String {
    let s = summary(&r.histogram);
    let e = &r.errors;
    let mut o = String::new();
    let _ = writeln!(
        o,
        "load http://{}{}: {} connections, {} threads, {}",
        spec.target.host,
        spec.target.path,
        spec.connections,
        spec.threads.min(spec.connections),
        mode(spec)
    );
    let _ = writeln!(o, "  requests    {}", r.requests);
    let _ = writeln!(o, "  duration    {:.3} s", r.elapsed.as_secs_f64());
    let _ = writeln!(o, "  requests/s  {:.1}", r.rps);
    let _ = writeln!(
        o,
        "  transfer/s  {:.1} KiB",
        r.bytes as f64 / 1024.0 / r.elapsed.as_secs_f64().max(1e-9)
    );
    let _ = writeln!(
        o,
        "  latency µs  min {}  mean {:.1}  p50 {}  p90 {}  p99 {}  p99.9 {}  max {}  stdev {:.1}",
        s.min, s.mean, s.p50, s.p90, s.p99, s.p999, s.max, s.stdev
    );
    let _ = writeln!(
        o,
        "  errors      {} (connect {}, reset {}, timeout {}, bad status {}, other {})",
        e.total(),
        e.connect,
        e.reset,
        e.timeout,
        e.status,
        e.other
    );
    let buckets = log2_buckets(&r.histogram);
    if buckets.is_empty() {
        return o;
    }
    let _ = writeln!(
        o,
        "\nLatency in µs min:{:.2} avg:{:.2} med={:.2} max:{:.2} dev:{:.2} count:{}",
        s.min as f64,
        s.mean,
        s.p50 as f64,
        s.max as f64,
        s.stdev,
        r.histogram.len()
    );
    let _ = writeln!(o, "Latency in µs:");
    let _ = writeln!(o, " value |{} count", "-".repeat(50));
    let top = buckets.iter().map(|b| b.1).max().unwrap_or(1).max(1);
    for (from, count) in buckets {
        let stars = ((count as u128 * 50).div_ceil(top as u128)) as usize;
        let _ = writeln!(o, "{from:>6} |{:<50} {count}", "*".repeat(stars));
    }
    o
}

fn json_str(s: &str) -> String {
    let mut o = String::with_capacity(s.len() + 2);
    o.push('"');
    for ch in s.chars() {
        match ch {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(o, "\\u{:04x}", c as u32);
            }
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

/// A finite number for JSON (NaN and infinities become 0).
fn num(v: f64) -> String {
    if v.is_finite() {
        format!("{v:.3}")
    } else {
        "0".to_string()
    }
}

/// The report as one JSON object (one line).
pub fn render_json(spec: &LoadSpec, r: &LoadReport) -> String {
    let s = summary(&r.histogram);
    let e = &r.errors;
    let hist = log2_buckets(&r.histogram)
        .iter()
        .map(|(from, count)| format!("{{\"from_us\":{from},\"count\":{count}}}"))
        .collect::<Vec<_>>()
        .join(",");
    format!(
        concat!(
            "{{\"url\":{},\"connections\":{},\"threads\":{},\"close\":{},\"rate\":{},",
            "\"requests\":{},\"duration_s\":{},\"rps\":{},\"bytes\":{},",
            "\"latency_us\":{{\"min\":{},\"mean\":{},\"p50\":{},\"p90\":{},\"p99\":{},",
            "\"p99_9\":{},\"max\":{},\"stdev\":{}}},",
            "\"errors\":{{\"total\":{},\"connect\":{},\"reset\":{},\"timeout\":{},",
            "\"status\":{},\"other\":{}}},\"histogram\":[{}]}}"
        ),
        json_str(&format!("http://{}{}", spec.target.host, spec.target.path)),
        spec.connections,
        spec.threads.min(spec.connections),
        spec.close,
        spec.rate.map_or("null".to_string(), num),
        r.requests,
        num(r.elapsed.as_secs_f64()),
        num(r.rps),
        r.bytes,
        s.min,
        num(s.mean),
        s.p50,
        s.p90,
        s.p99,
        s.p999,
        s.max,
        num(s.stdev),
        e.total(),
        e.connect,
        e.reset,
        e.timeout,
        e.status,
        e.other,
        hist
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log2_buckets_split_at_powers_of_two() {
        let mut h = crate::loadgen::new_histogram();
        for v in [0, 1, 2, 3, 4, 7, 8, 1000, 1023, 1024, 5000] {
            h.record(v).unwrap();
        }
        let b = log2_buckets(&h);
        assert_eq!(b[0], (0, 1));
        assert_eq!(b[1], (1, 1));
        assert_eq!(b[2], (2, 2));
        assert_eq!(b[3], (4, 2));
        assert_eq!(b[4], (8, 1));
        assert!(b.contains(&(512, 2)));
        assert!(b.contains(&(1024, 1)));
        assert_eq!(*b.last().unwrap(), (4096, 1));
        assert_eq!(b.iter().map(|x| x.1).sum::<u64>(), 11);
    }

    #[test]
    fn json_escapes() {
        assert_eq!(json_str("a\"b\\c\n"), "\"a\\\"b\\\\c\\u000a\"");
    }
}
