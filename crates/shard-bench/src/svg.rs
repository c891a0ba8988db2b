//! Charts as standalone SVG files: grouped bars (per-worker shares, requests/s) and log2
//! latency histograms. Hand-written, no dependency: the charts are simple and must open in any
//! browser without scripts.

use std::fmt::Write;

const W: f64 = 760.0;
const BAR_AREA_H: f64 = 260.0;
const TOP: f64 = 50.0;
const LEFT: f64 = 60.0;
const PALETTE: [&str; 8] = [
    "#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#9c755f",
];

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Groups of bars: `groups[i] = (label, values)`; every group has one bar per series name.
pub fn grouped_bars(
    title: &str,
    unit: &str,
    series: &[String],
    groups: &[(String, Vec<f64>)],
) -> String {
    let max = groups
        .iter()
        .flat_map(|(_, v)| v.iter().copied())
        .fold(0.0_f64, f64::max)
        .max(1e-9);
    let n_groups = groups.len().max(1) as f64;
    let group_w = (W - LEFT - 20.0) / n_groups;
    let n_series = series.len().max(1) as f64;
    let bar_w = (group_w * 0.8 / n_series).max(1.0);
    let h = TOP + BAR_AREA_H + 70.0 + legend_height(series.iter().map(String::len));
    let mut s = String::new();
    let _ = write!(
        s,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"{}\" y=\"24\" font-size=\"15\" text-anchor=\"middle\">{}</text>\n",
        W / 2.0,
        esc(title)
    );
    let base = TOP + BAR_AREA_H;
    let _ = writeln!(
        s,
        "<line x1=\"{LEFT}\" y1=\"{base}\" x2=\"{}\" y2=\"{base}\" stroke=\"black\"/>",
        W - 10.0
    );
    for t in 0..=4 {
        let v = max * t as f64 / 4.0;
        let y = base - BAR_AREA_H * t as f64 / 4.0;
        grid_line(&mut s, y, &short(v));
    }
    let _ = writeln!(
        s,
        "<text x=\"14\" y=\"{}\" transform=\"rotate(-90 14 {})\" text-anchor=\"middle\">{}</text>",
        TOP + BAR_AREA_H / 2.0,
        TOP + BAR_AREA_H / 2.0,
        esc(unit)
    );
    for (gi, (label, values)) in groups.iter().enumerate() {
        let gx = LEFT + gi as f64 * group_w + group_w * 0.1;
        for (si, v) in values.iter().enumerate() {
            let bh = BAR_AREA_H * v / max;
            let x = gx + si as f64 * bar_w;
            let _ = writeln!(
                s,
                "<rect x=\"{x:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{bh:.1}\" fill=\"{}\"><title>{}: {}</title></rect>",
                base - bh,
                (bar_w - 1.0).max(1.0),
                PALETTE[si % PALETTE.len()],
                esc(series.get(si).map_or("", String::as_str)),
                short(*v)
            );
        }
        let _ = writeln!(
            s,
            "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
            gx + group_w * 0.4,
            base + 16.0,
            esc(label)
        );
    }
    legend(&mut s, series, base + 40.0);
    s.push_str("</svg>\n");
    s
}

/// Log2 latency histograms, one line per series: `buckets[i]` counts requests whose latency in
/// microseconds is in `[2^i, 2^(i+1))`. Shown as the share of requests per bucket.
pub fn log2_histograms(title: &str, series: &[(String, Vec<u64>)]) -> String {
    let n_buckets = longest(series).max(1);
    let shares: Vec<Vec<f64>> = series
        .iter()
        .map(|(_, b)| {
            let total = b.iter().sum::<u64>().max(1) as f64;
            b.iter().map(|&c| c as f64 / total).collect()
        })
        .collect();
    let max = shares
        .iter()
        .flatten()
        .copied()
        .fold(0.0_f64, f64::max)
        .max(1e-9);
    let step = (W - LEFT - 20.0) / n_buckets as f64;
    let base = TOP + BAR_AREA_H;
    let h = base + 70.0 + legend_height(series.iter().map(|x| x.0.len()));
    let mut s = String::new();
    let _ = write!(
        s,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"{}\" y=\"24\" font-size=\"15\" text-anchor=\"middle\">{}</text>\n",
        W / 2.0,
        esc(title)
    );
    let _ = writeln!(
        s,
        "<line x1=\"{LEFT}\" y1=\"{base}\" x2=\"{}\" y2=\"{base}\" stroke=\"black\"/>",
        W - 10.0
    );
    for t in 0..=4 {
        let v = max * t as f64 / 4.0;
        let y = base - BAR_AREA_H * t as f64 / 4.0;
        grid_line(&mut s, y, &format!("{:.0}%", v * 100.0));
    }
    log2_x_axis(&mut s, n_buckets, step, base, "latency (log2 buckets)");
    for (si, sh) in shares.iter().enumerate() {
        let pts: Vec<String> = sh
            .iter()
            .enumerate()
            .map(|(i, v)| {
                format!(
                    "{:.1},{:.1}",
                    LEFT + (i as f64 + 0.5) * step,
                    base - BAR_AREA_H * v / max
                )
            })
            .collect();
        let _ = writeln!(
            s,
            "<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"2\" points=\"{}\"/>",
            PALETTE[si % PALETTE.len()],
            pts.join(" ")
        );
    }
    let names: Vec<String> = series.iter().map(|(n, _)| n.clone()).collect();
    legend(&mut s, &names, base + 48.0);
    s.push_str("</svg>\n");
    s
}

/// The length of the longest series (1 when there is none).
fn longest(series: &[(String, Vec<u64>)]) -> usize {
    series.iter().map(|(_, v)| v.len()).max().unwrap_or(1)
}

/// The largest value of any series, at least 1 (a scale's top).
fn largest(series: &[(String, Vec<u64>)]) -> u64 {
    series
        .iter()
        .flat_map(|(_, v)| v.iter().copied())
        .max()
        .unwrap_or(1)
        .max(1)
}

/// A horizontal grid line at `y` with its value on the left.
fn grid_line(s: &mut String, y: f64, label: &str) {
    let _ = writeln!(
        s,
        "<text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{label}</text><line x1=\"{LEFT}\" y1=\"{y:.1}\" x2=\"{}\" y2=\"{y:.1}\" stroke=\"#ddd\"/>",
        LEFT - 4.0,
        y + 4.0,
        W - 10.0
    );
}

/// The x axis of a log2 latency histogram: every other bucket's lower bound, and `caption`.
fn log2_x_axis(s: &mut String, n_buckets: usize, step: f64, base: f64, caption: &str) {
    for i in (0..n_buckets).step_by(2) {
        let _ = writeln!(
            s,
            "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\" font-size=\"10\">{}</text>",
            LEFT + (i as f64 + 0.5) * step,
            base + 14.0,
            duration_label(1u64 << i)
        );
    }
    let _ = writeln!(
        s,
        "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{caption}</text>",
        W / 2.0,
        base + 30.0
    );
}

fn header(s: &mut String, h: f64, title: &str) {
    let _ = write!(
        s,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"{}\" y=\"24\" font-size=\"15\" text-anchor=\"middle\">{}</text>\n",
        W / 2.0,
        esc(title)
    );
}

/// Completions per time bin, one line per series, with the window `shade` (bin indices,
/// start inclusive, end exclusive) shaded: where a stall shows as a dip.
pub fn timeseries(
    title: &str,
    bin_ms: u64,
    series: &[(String, Vec<u64>)],
    shade: Option<(f64, f64)>,
) -> String {
    let n = longest(series).max(2);
    let max = largest(series) as f64;
    let step = (W - LEFT - 20.0) / (n - 1) as f64;
    let base = TOP + BAR_AREA_H;
    let h = base + 70.0 + legend_height(series.iter().map(|x| x.0.len()));
    let mut s = String::new();
    header(&mut s, h, title);
    if let Some((a, b)) = shade {
        let _ = writeln!(
            s,
            "<rect x=\"{:.1}\" y=\"{TOP}\" width=\"{:.1}\" height=\"{BAR_AREA_H}\" fill=\"#f4d7d7\"/>\
             <text x=\"{:.1}\" y=\"{}\" font-size=\"11\" fill=\"#a33\">worker stopped</text>",
            LEFT + a * step,
            ((b - a) * step).max(1.0),
            LEFT + a * step + 4.0,
            TOP + 14.0
        );
    }
    let _ = writeln!(
        s,
        "<line x1=\"{LEFT}\" y1=\"{base}\" x2=\"{}\" y2=\"{base}\" stroke=\"black\"/>",
        W - 10.0
    );
    for t in 0..=4 {
        let v = max * t as f64 / 4.0;
        let y = base - BAR_AREA_H * t as f64 / 4.0;
        grid_line(&mut s, y, &short(v));
    }
    let every = (n / 10).max(1);
    for i in (0..n).step_by(every) {
        let _ = writeln!(
            s,
            "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\" font-size=\"10\">{:.1}s</text>",
            LEFT + i as f64 * step,
            base + 14.0,
            (i as u64 * bin_ms) as f64 / 1000.0
        );
    }
    let _ = writeln!(
        s,
        "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">time; responses completed per {bin_ms} ms</text>",
        W / 2.0,
        base + 30.0
    );
    for (si, (_, v)) in series.iter().enumerate() {
        let pts: Vec<String> = v
            .iter()
            .enumerate()
            .map(|(i, &c)| {
                format!(
                    "{:.1},{:.1}",
                    LEFT + i as f64 * step,
                    base - BAR_AREA_H * c as f64 / max
                )
            })
            .collect();
        let _ = writeln!(
            s,
            "<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"1.5\" points=\"{}\"/>",
            PALETTE[si % PALETTE.len()],
            pts.join(" ")
        );
    }
    let names: Vec<String> = series.iter().map(|(n, _)| n.clone()).collect();
    legend(&mut s, &names, base + 48.0);
    s.push_str("</svg>\n");
    s
}

/// Log2 latency histograms with a logarithmic count axis (Cloudflare's mmhistogram style):
/// a handful of requests at 1 s stays visible beside thousands at 100 us, which a linear
/// percentage axis flattens to nothing.
pub fn log2_histograms_log_count(title: &str, series: &[(String, Vec<u64>)]) -> String {
    let n_buckets = longest(series).max(1);
    let max = largest(series) as f64;
    let decades = max.log10().ceil().max(1.0);
    let y_of = |c: u64| {
        if c == 0 {
            0.0
        } else {
            // 1 request sits just above the axis; `max` at the top.
            BAR_AREA_H * (0.04 + 0.96 * (c as f64).log10() / decades)
        }
    };
    let step = (W - LEFT - 20.0) / n_buckets as f64;
    let base = TOP + BAR_AREA_H;
    let h = base + 70.0 + legend_height(series.iter().map(|x| x.0.len()));
    let mut s = String::new();
    header(&mut s, h, title);
    let _ = writeln!(
        s,
        "<line x1=\"{LEFT}\" y1=\"{base}\" x2=\"{}\" y2=\"{base}\" stroke=\"black\"/>",
        W - 10.0
    );
    for d in 0..=decades as u32 {
        let c = 10u64.pow(d);
        let y = base - y_of(c);
        let label = if c >= 10_000 {
            short(c as f64)
        } else {
            c.to_string()
        };
        grid_line(&mut s, y, &label);
    }
    log2_x_axis(
        &mut s,
        n_buckets,
        step,
        base,
        "latency (log2 buckets); requests, log scale",
    );
    let n = series.len().max(1) as f64;
    for (si, (_, b)) in series.iter().enumerate() {
        let bw = (step * 0.8 / n).max(1.0);
        for (i, &c) in b.iter().enumerate() {
            if c == 0 {
                continue;
            }
            let hgt = y_of(c);
            let _ = writeln!(
                s,
                "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"{bw:.1}\" height=\"{hgt:.1}\" fill=\"{}\"><title>{c}</title></rect>",
                LEFT + i as f64 * step + step * 0.1 + si as f64 * bw,
                base - hgt,
                PALETTE[si % PALETTE.len()]
            );
        }
    }
    let names: Vec<String> = series.iter().map(|(n, _)| n.clone()).collect();
    legend(&mut s, &names, base + 48.0);
    s.push_str("</svg>\n");
    s
}

/// Legend columns: four short names a row, two long ones.
fn legend_columns(longest: usize) -> usize {
    if longest > 22 {
        2
    } else {
        4
    }
}

fn legend_height(names: impl Iterator<Item = usize> + Clone) -> f64 {
    let cols = legend_columns(names.clone().max().unwrap_or(0));
    18.0 * names.count().div_ceil(cols) as f64
}

fn legend(s: &mut String, names: &[String], y0: f64) {
    let cols = legend_columns(names.iter().map(String::len).max().unwrap_or(0));
    let col_w = (W - LEFT) / cols as f64;
    for (i, name) in names.iter().enumerate() {
        let x = LEFT + (i % cols) as f64 * col_w;
        let y = y0 + (i / cols) as f64 * 18.0;
        let _ = writeln!(
            s,
            "<rect x=\"{x}\" y=\"{}\" width=\"12\" height=\"12\" fill=\"{}\"/><text x=\"{}\" y=\"{y}\">{}</text>",
            y - 10.0,
            PALETTE[i % PALETTE.len()],
            x + 16.0,
            esc(name)
        );
    }
}

fn short(v: f64) -> String {
    if v >= 1e6 {
        format!("{:.1}M", v / 1e6)
    } else if v >= 1e4 {
        format!("{:.0}k", v / 1e3)
    } else if v >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

/// `1us`, `512us`, `1ms`, `1s` for a power of two of microseconds.
pub fn duration_label(us: u64) -> String {
    if us >= 1_000_000 {
        format!("{}s", us / 1_000_000)
    } else if us >= 1000 {
        format!("{}ms", us / 1000)
    } else {
        format!("{us}us")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charts_are_well_formed_svg() {
        let bars = grouped_bars(
            "t <&>",
            "req/s",
            &["w0".into(), "w1".into()],
            &[
                ("reuseport".into(), vec![1.0, 2.0]),
                ("mutex".into(), vec![0.0, 3.0]),
            ],
        );
        assert!(bars.starts_with("<svg") && bars.trim_end().ends_with("</svg>"));
        assert!(bars.contains("t &lt;&amp;&gt;"));
        assert_eq!(
            bars.matches("<rect x=").count(),
            4 + 2,
            "4 bars and 2 legend keys"
        );
        let h = log2_histograms("h", &[("a".into(), vec![0, 5, 5]), ("b".into(), vec![])]);
        assert_eq!(h.matches("<polyline").count(), 2);
        assert_eq!(duration_label(2048), "2ms");
        let t = timeseries(
            "t",
            50,
            &[("a".into(), vec![5, 0, 5]), ("b".into(), vec![1])],
            Some((1.0, 2.0)),
        );
        assert_eq!(t.matches("<polyline").count(), 2);
        assert!(t.contains("worker stopped"));
        let l = log2_histograms_log_count("l", &[("a".into(), vec![1000, 0, 1])]);
        // Two non-empty buckets, and the single slow request is still a visible bar.
        assert_eq!(l.matches("<title>").count(), 2);
        assert!(l.contains("<title>1</title>"));
    }
}
