//! Output: Markdown tables for stdout and the README, JSON for machines,
//! and an SVG picture of a run (requests per second and failures over
//! time, with every SIGTERM or SIGKILL and every replica's readiness
//! marked, and the p99 latency per second where a scenario gives it).

use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use hdrhistogram::Histogram;
use serde::Serialize;

/// Serializes a `Duration` as milliseconds (a float).
pub mod millis {
    use std::time::Duration;

    /// For `#[serde(with = "crate::report::millis")]`.
    ///
    /// # Errors
    /// The serializer's.
    pub fn serialize<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64((d.as_secs_f64() * 1e6).round() / 1e3)
    }
}

/// Serializes an `Option<Duration>` as milliseconds (a float), or null.
pub mod opt_millis {
    use std::time::Duration;

    /// For `#[serde(with = "crate::report::opt_millis")]`.
    ///
    /// # Errors
    /// The serializer's.
    pub fn serialize<S: serde::Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => super::millis::serialize(d, s),
            None => s.serialize_none(),
        }
    }
}

/// A new latency histogram in microseconds (1 µs to 60 s, 3 digits).
pub fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 3).unwrap_or_else(|_| unreachable!("valid bounds"))
}

/// Records `d` into a microsecond histogram, clamped to its range.
pub fn record(histogram: &mut Histogram<u64>, d: Duration) {
    let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
    histogram.saturating_record(us.clamp(1, 60_000_000));
}

/// p50, p99 and max of a latency distribution, in milliseconds.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct Latency {
    /// Requests measured.
    pub count: u64,
    /// Median.
    pub p50_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// Slowest.
    pub max_ms: f64,
}

impl Latency {
    /// From a microsecond histogram.
    pub fn of(histogram: &Histogram<u64>) -> Latency {
        #[allow(clippy::cast_precision_loss)]
        let ms = |us: u64| (us as f64 / 10.0).round() / 100.0;
        if histogram.is_empty() {
            return Latency::default();
        }
        Latency {
            count: histogram.len(),
            p50_ms: ms(histogram.value_at_quantile(0.50)),
            p99_ms: ms(histogram.value_at_quantile(0.99)),
            max_ms: ms(histogram.max()),
        }
    }

    /// `p50 / p99 / max` in ms, for a table cell.
    pub fn cell(&self) -> String {
        if self.count == 0 {
            return "–".to_owned();
        }
        format!(
            "{} / {} / {}",
            fmt_ms(self.p50_ms),
            fmt_ms(self.p99_ms),
            fmt_ms(self.max_ms)
        )
    }
}

/// A millisecond figure with sensible precision.
pub fn fmt_ms(ms: f64) -> String {
    if ms >= 100.0 {
        format!("{ms:.0}")
    } else if ms >= 10.0 {
        format!("{ms:.1}")
    } else {
        format!("{ms:.2}")
    }
}

/// A Markdown table with aligned columns.
pub fn table(header: &[String], rows: &[Vec<String>]) -> String {
    let columns = header.len();
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate().take(columns) {
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    let line = |cells: &[String]| {
        let mut out = String::from("|");
        for (i, width) in widths.iter().enumerate() {
            let cell = cells.get(i).map_or("", String::as_str);
            let pad = width - cell.chars().count();
            let _ = write!(out, " {cell}{} |", " ".repeat(pad));
        }
        out.push('\n');
        out
    };
    let mut out = line(header);
    out.push('|');
    for (i, width) in widths.iter().enumerate() {
        let dashes = "-".repeat((*width).max(3));
        if i == 0 {
            let _ = write!(out, " {dashes} |");
        } else {
            let _ = write!(out, " {}: |", &dashes[1..]);
        }
    }
    out.push('\n');
    for row in rows {
        out.push_str(&line(row));
    }
    out
}

/// Writes `value` as pretty JSON to `path`.
///
/// # Errors
/// If it cannot be written.
pub fn write_json(path: &Path, value: &impl Serialize) -> anyhow::Result<()> {
    let json = serde_json::to_string_pretty(value)?;
    std::fs::write(path, json + "\n").with_context(|| format!("cannot write {}", path.display()))
}

/// A marked moment on a rollout picture.
#[derive(Clone, Debug, Serialize)]
pub struct Mark {
    /// Seconds since the traffic started.
    pub at_s: f64,
    /// What happened.
    pub kind: MarkKind,
    /// Which replica.
    pub replica: String,
}

/// The kinds of marked moments.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MarkKind {
    /// A new replica was ready and added to the balancer.
    Ready,
    /// An old replica was sent SIGTERM.
    Sigterm,
    /// The balancer took the old replica out (health checks failed).
    LbOut,
    /// The old replica exited.
    Exit,
    /// A replica was sent SIGKILL.
    Sigkill,
    /// The balancer put a replica back (health checks passed).
    LbIn,
}

/// A shaded stretch of a picture, with a label: a phase of a scenario.
#[derive(Clone, Debug, Serialize)]
pub struct Span {
    /// Where it starts, in seconds since the traffic started.
    pub from_s: f64,
    /// Where it ends.
    pub to_s: f64,
    /// What happened meanwhile.
    pub label: String,
}

/// One panel of a picture: one flavor's run.
#[derive(Clone, Debug)]
pub struct Panel {
    /// Its title.
    pub title: String,
    /// Per second: requests answered as expected.
    pub ok: Vec<u64>,
    /// Per second: failed requests.
    pub failed: Vec<u64>,
    /// Marked moments.
    pub marks: Vec<Mark>,
    /// Shaded stretches.
    pub spans: Vec<Span>,
    /// Per second: the p99 latency of the requests answered as expected,
    /// in milliseconds, drawn against a right-hand axis; empty for none.
    pub p99_ms: Vec<f64>,
}

/// The rollout picture's legend.
const ROLLOUT_LEGEND: &str = r##"<tspan fill="#1f77b4">━ answered as expected /s</tspan>   <tspan fill="#d62728">▮ failed /s</tspan>   <tspan fill="#2ca02c">▼ new replica ready</tspan>   <tspan fill="#d62728">┆ SIGTERM</tspan>   <tspan fill="#ff7f0e">┆ balancer took it out</tspan>   <tspan fill="#7f7f7f">┆ exit</tspan>"##;

/// The crash picture's legend.
pub const CRASH_LEGEND: &str = r##"<tspan fill="#1f77b4">━ answered as expected /s</tspan>   <tspan fill="#9467bd">━ p99 latency (ms, right)</tspan>   <tspan fill="#d62728">▮ failed /s</tspan>   <tspan fill="#d62728">│ SIGKILL</tspan>   <tspan fill="#2ca02c">▼ restarted replica ready</tspan>   <tspan fill="#ff7f0e">┆ balancer took it out</tspan>   <tspan fill="#2ca02c">┆ put it back</tspan>"##;

/// The legend of a picture with shaded phases and no marks.
pub const PHASE_LEGEND: &str = r##"<tspan fill="#1f77b4">━ answered as expected /s</tspan>   <tspan fill="#d62728">▮ failed /s</tspan>   <tspan fill="#b8860b">░ the disturbance, named above it</tspan>"##;

/// An SVG with one panel per flavor, on a common time axis, with the
/// rollout's marks.
pub fn rollout_svg(title: &str, panels: &[Panel]) -> String {
    timeline_svg(title, ROLLOUT_LEGEND, panels)
}

/// An SVG with one panel per flavor, on a common time axis: requests
/// answered and failed per second, marks and shaded spans; `legend` is SVG
/// text content (`<tspan>`s).
pub fn timeline_svg(title: &str, legend: &str, panels: &[Panel]) -> String {
    const W: f64 = 960.0;
    const PANEL_H: f64 = 230.0;
    const LEFT: f64 = 60.0;
    const TOP: f64 = 50.0;
    // Room for the latency axis's labels, when there is one.
    let right = if panels.iter().any(|p| !p.p99_ms.is_empty()) {
        50.0
    } else {
        20.0
    };
    let plot_w = W - LEFT - right;
    let plot_h = PANEL_H - 70.0;
    #[allow(clippy::cast_precision_loss)]
    let height = TOP + PANEL_H * panels.len() as f64 + 30.0;
    let seconds = panels
        .iter()
        .map(|p| p.ok.len().max(p.failed.len()))
        .max()
        .unwrap_or(1)
        .max(1);
    let peak = panels
        .iter()
        .flat_map(|p| p.ok.iter().zip(&p.failed).map(|(a, b)| a + b))
        .max()
        .unwrap_or(1)
        .max(1);
    #[allow(clippy::cast_precision_loss)]
    let y_max = nice_ceiling(peak as f64 * 1.1);
    #[allow(clippy::cast_precision_loss)]
    let x_of = |t: f64| LEFT + plot_w * t / seconds as f64;

    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{height}" viewBox="0 0 {W} {height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(svg, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        svg,
        r#"<text x="{LEFT}" y="22" font-size="15" font-weight="bold">{}</text>"#,
        escape(title)
    );
    let _ = writeln!(
        svg,
        r##"<text x="{LEFT}" y="40" fill="#444">{legend}</text>"##
    );
    for (index, panel) in panels.iter().enumerate() {
        #[allow(clippy::cast_precision_loss)]
        let top = TOP + 25.0 + PANEL_H * index as f64;
        let bottom = top + plot_h;
        let y_of = |v: f64| bottom - plot_h * v / y_max;
        let _ = writeln!(
            svg,
            r#"<text x="{LEFT}" y="{}" font-weight="bold">{}</text>"#,
            top - 12.0,
            escape(&panel.title)
        );
        for span in &panel.spans {
            let (x0, x1) = (x_of(span.from_s), x_of(span.to_s));
            let _ = writeln!(
                svg,
                r##"<rect x="{x0:.1}" y="{top}" width="{:.1}" height="{plot_h}" fill="#f5deb3" opacity="0.6"><title>{} from {:.2}s to {:.2}s</title></rect><text x="{:.1}" y="{}" text-anchor="middle" fill="#b8860b" font-size="11">{}</text>"##,
                (x1 - x0).max(1.0),
                escape(&span.label),
                span.from_s,
                span.to_s,
                (x0 + x1) / 2.0,
                top + 12.0,
                escape(&span.label)
            );
        }
        let _ = writeln!(
            svg,
            r##"<rect x="{LEFT}" y="{top}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#999"/>"##
        );
        for step in 0..=4 {
            let v = y_max * f64::from(step) / 4.0;
            let y = y_of(v);
            let _ = writeln!(
                svg,
                r##"<line x1="{LEFT}" x2="{}" y1="{y:.1}" y2="{y:.1}" stroke="#eee"/><text x="{}" y="{:.1}" text-anchor="end" fill="#444">{v:.0}</text>"##,
                LEFT + plot_w,
                LEFT - 6.0,
                y + 4.0
            );
        }
        let tick = nice_ceiling(seconds as f64 / 10.0).max(1.0);
        let mut t = 0.0;
        while t <= seconds as f64 {
            let x = x_of(t);
            let _ = writeln!(
                svg,
                r##"<text x="{x:.1}" y="{}" text-anchor="middle" fill="#444">{t:.0}s</text>"##,
                bottom + 15.0
            );
            t += tick;
        }
        for mark in &panel.marks {
            let x = x_of(mark.at_s);
            let tooltip = format!(
                "{:?} {} at {:.2}s",
                mark.kind,
                escape(&mark.replica),
                mark.at_s
            );
            if mark.kind == MarkKind::Ready {
                // Readiness comes milliseconds before the SIGTERM it allows:
                // a triangle above the plot keeps it visible.
                let _ = writeln!(
                    svg,
                    r##"<path d="M{:.1},{:.1} l-5,-8 h10 z" fill="#2ca02c"><title>{tooltip}</title></path>"##,
                    x,
                    top - 1.0
                );
                continue;
            }
            let (color, dash) = match mark.kind {
                MarkKind::Sigterm => ("#d62728", "4,3"),
                MarkKind::Sigkill => ("#d62728", "none"),
                MarkKind::LbOut => ("#ff7f0e", "2,2"),
                MarkKind::LbIn => ("#2ca02c", "2,2"),
                MarkKind::Ready | MarkKind::Exit => ("#7f7f7f", "1,3"),
            };
            let _ = writeln!(
                svg,
                r#"<line x1="{x:.1}" x2="{x:.1}" y1="{top}" y2="{bottom}" stroke="{color}" stroke-dasharray="{dash}"><title>{tooltip}</title></line>"#
            );
        }
        for (second, failed) in panel.failed.iter().enumerate() {
            if *failed == 0 {
                continue;
            }
            #[allow(clippy::cast_precision_loss)]
            let (x0, x1) = (x_of(second as f64), x_of(second as f64 + 1.0));
            #[allow(clippy::cast_precision_loss)]
            let y = y_of(*failed as f64).min(bottom - 2.0);
            let _ = writeln!(
                svg,
                r##"<rect x="{x0:.1}" y="{y:.1}" width="{:.1}" height="{:.1}" fill="#d62728" opacity="0.8"><title>{second}s: {failed} failed</title></rect>"##,
                (x1 - x0).max(1.0),
                bottom - y
            );
        }
        let mut points = String::new();
        for (second, ok) in panel.ok.iter().enumerate() {
            #[allow(clippy::cast_precision_loss)]
            let _ = write!(
                points,
                "{:.1},{:.1} ",
                x_of(second as f64 + 0.5),
                y_of(*ok as f64)
            );
        }
        let _ = writeln!(
            svg,
            r##"<polyline points="{}" fill="none" stroke="#1f77b4" stroke-width="1.5"/>"##,
            points.trim_end()
        );
        latency_line(&mut svg, panel, LEFT + plot_w, bottom, plot_h, &x_of);
    }
    svg.push_str("</svg>\n");
    svg
}

/// A panel's p99 latency per second, against its own axis on the right of
/// the plot (`right` is its x, `bottom` and `plot_h` the plot's).
fn latency_line(
    svg: &mut String,
    panel: &Panel,
    right: f64,
    bottom: f64,
    plot_h: f64,
    x_of: &dyn Fn(f64) -> f64,
) {
    if panel.p99_ms.is_empty() {
        return;
    }
    let top_ms = nice_ceiling(panel.p99_ms.iter().copied().fold(0.0, f64::max) * 1.1);
    let y_of = |ms: f64| bottom - plot_h * ms / top_ms;
    for step in 0..=2 {
        let ms = top_ms * f64::from(step) / 2.0;
        let _ = writeln!(
            svg,
            r##"<text x="{:.1}" y="{:.1}" fill="#9467bd">{}</text>"##,
            right + 4.0,
            y_of(ms) + 4.0,
            fmt_ms(ms)
        );
    }
    let mut points = String::new();
    for (second, ms) in panel.p99_ms.iter().enumerate() {
        #[allow(clippy::cast_precision_loss)]
        let _ = write!(points, "{:.1},{:.1} ", x_of(second as f64 + 0.5), y_of(*ms));
    }
    let _ = writeln!(
        svg,
        r##"<polyline points="{}" fill="none" stroke="#9467bd" stroke-width="1" opacity="0.8"/>"##,
        points.trim_end()
    );
}

/// The next round number at or above `value` (1, 1.2, 1.5, 2, 2.5, 3, 4,
/// 5, 6, 8 times a power of ten): an axis's top.
pub(crate) fn nice_ceiling(value: f64) -> f64 {
    if value <= 0.0 {
        return 1.0;
    }
    let magnitude = 10f64.powf(value.log10().floor());
    for step in [1.0, 1.2, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0] {
        if step * magnitude >= value {
            return step * magnitude;
        }
    }
    10.0 * magnitude
}

/// `text` with `&`, `<` and `>` escaped for SVG.
pub(crate) fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align_their_columns() {
        let header = vec!["what".to_owned(), "a".to_owned()];
        let rows = vec![vec!["requests".to_owned(), "12345".to_owned()]];
        let rendered = table(&header, &rows);
        let lines: Vec<&str> = rendered.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(
            lines.iter().all(|l| l.len() == lines[0].len()),
            "{rendered}"
        );
    }

    #[test]
    fn pictures_are_well_formed_enough() {
        let panel = Panel {
            title: "a <b>".to_owned(),
            ok: vec![10, 20, 30],
            failed: vec![0, 5, 0],
            marks: vec![Mark {
                at_s: 1.5,
                kind: MarkKind::Sigterm,
                replica: "r1".to_owned(),
            }],
            spans: vec![Span {
                from_s: 0.5,
                to_s: 2.0,
                label: "database <down>".to_owned(),
            }],
            p99_ms: vec![1.0, 2.5, 1.2],
        };
        let svg = rollout_svg("t", &[panel]);
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>\n"));
        assert!(svg.contains("a &lt;b&gt;"));
        assert!(svg.contains("database &lt;down&gt;"));
        assert!((nice_ceiling(1100.0) - 1200.0).abs() < 1e-9);
    }
}
