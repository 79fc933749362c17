//! Latency distributions as pictures: a cumulative distribution chart in plain SVG
//! (a log-scaled latency axis, one line per series), written next to the tables.

use std::fmt::Write;

use super::stats::Sorted;

const W: f64 = 760.0;
const H: f64 = 420.0;
const LEFT: f64 = 60.0;
const RIGHT: f64 = 190.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 50.0;
const COLORS: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
];

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// A CDF chart of latencies in microseconds: x = latency (log scale), y = share of
/// operations at or below it.
pub fn cdf_chart(title: &str, series: &[(String, &Sorted)]) -> String {
    let all = series.iter().flat_map(|(_, s)| s.0.iter().copied());
    let (lo, hi) = all.fold((u64::MAX, 1u64), |(lo, hi), v| {
        (lo.min(v.max(1)), hi.max(v))
    });
    let (lo, hi) = if lo > hi { (1, 10) } else { (lo, hi) };
    let (log_lo, log_hi) = (
        (lo as f64).log10().floor(),
        (hi as f64)
            .log10()
            .ceil()
            .max((lo as f64).log10().floor() + 1.0),
    );
    let plot_w = W - LEFT - RIGHT;
    let plot_h = H - TOP - BOTTOM;
    let x = |us: f64| LEFT + ((us.max(1.0).log10() - log_lo) / (log_hi - log_lo)) * plot_w;
    let y = |share: f64| TOP + (1.0 - share) * plot_h;
    let mut svg = String::new();
    let _ = write!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">
<rect width="100%" height="100%" fill="white"/>
<text x="{LEFT}" y="22" font-size="15">{}</text>
"#,
        escape(title)
    );
    // Grid: decades on x, quartiles on y.
    let mut decade = log_lo;
    while decade <= log_hi {
        let px = x(10f64.powf(decade));
        let label = match 10f64.powf(decade) {
            v if v >= 1e6 => format!("{} s", v / 1e6),
            v if v >= 1e3 => format!("{} ms", v / 1e3),
            v => format!("{v} µs"),
        };
        let _ = writeln!(
            svg,
            r##"<line x1="{px:.1}" y1="{TOP}" x2="{px:.1}" y2="{:.1}" stroke="#ddd"/><text x="{px:.1}" y="{:.1}" text-anchor="middle">{label}</text>"##,
            TOP + plot_h,
            TOP + plot_h + 18.0
        );
        decade += 1.0;
    }
    for q in [0.0, 0.25, 0.5, 0.75, 0.99] {
        let py = y(q);
        let _ = writeln!(
            svg,
            r##"<line x1="{LEFT}" y1="{py:.1}" x2="{:.1}" y2="{py:.1}" stroke="#eee"/><text x="{:.1}" y="{:.1}" text-anchor="end">p{}</text>"##,
            LEFT + plot_w,
            LEFT - 6.0,
            py + 4.0,
            (q * 100.0) as u32
        );
    }
    let _ = writeln!(
        svg,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">latency (log scale)</text>"#,
        LEFT + plot_w / 2.0,
        H - 10.0
    );
    for (i, (label, sorted)) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let n = sorted.0.len();
        if n == 0 {
            continue;
        }
        // At most ~400 points per line: every k-th sample plus the last.
        let step = (n / 400).max(1);
        let mut points = String::new();
        for (j, v) in sorted
            .0
            .iter()
            .enumerate()
            .filter(|(j, _)| j % step == 0 || *j == n - 1)
        {
            let _ = write!(
                points,
                "{:.1},{:.1} ",
                x(*v as f64),
                y((j + 1) as f64 / n as f64)
            );
        }
        let _ = writeln!(
            svg,
            r#"<polyline fill="none" stroke="{color}" stroke-width="1.6" points="{points}"/>"#
        );
        let ly = TOP + 16.0 * i as f64 + 8.0;
        let _ = writeln!(
            svg,
            r#"<line x1="{:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{color}" stroke-width="3"/><text x="{:.1}" y="{:.1}">{}</text>"#,
            LEFT + plot_w + 12.0,
            LEFT + plot_w + 30.0,
            LEFT + plot_w + 36.0,
            ly + 4.0,
            escape(label)
        );
    }
    svg.push_str("</svg>\n");
    svg
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_one_line_per_series_with_escaped_labels() {
        let a = Sorted((1..=1000).collect());
        let b = Sorted(vec![50, 60, 70]);
        let svg = cdf_chart("t <1>", &[("a & b".into(), &a), ("c".into(), &b)]);
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert!(svg.contains("a &amp; b") && svg.contains("t &lt;1&gt;"));
        assert!(svg.trim_end().ends_with("</svg>"));
    }
}
