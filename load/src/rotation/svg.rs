//! The picture of `load rotation`: line charts, one panel per run, each
//! with its own time axis, a left axis for counts or shares, an optional
//! right axis (latency), a shaded target band, and the fleet's moments
//! (new replica UP, SIGTERM, balancer out, exit) marked.

use std::fmt::Write as _;

use crate::report::{self, Mark, MarkKind};

/// Replicas' colours, in the order they were started.
pub(super) const PALETTE: [&str; 8] = [
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf",
];

/// The colour of lines against the right axis.
pub(super) const RIGHT_COLOR: &str = "#7f7f7f";

/// The colour of a fleet's total.
pub(super) const TOTAL_COLOR: &str = "#000000";

const WIDTH: f64 = 960.0;
const PANEL_H: f64 = 250.0;
const LEFT: f64 = 60.0;
const RIGHT: f64 = 60.0;
const TOP: f64 = 50.0;

/// One line of a chart.
#[derive(Clone, Debug)]
pub(super) struct Line {
    /// Its name in the panel's legend.
    pub(super) label: String,
    /// Its colour.
    pub(super) color: &'static str,
    /// `(seconds, value)`, in order.
    pub(super) points: Vec<(f64, f64)>,
    /// Drawn against the right axis.
    pub(super) right: bool,
    /// Dashed, to tell it from the replicas' lines.
    pub(super) dashed: bool,
}

/// One panel.
#[derive(Clone, Debug)]
pub(super) struct Chart {
    /// Its title.
    pub(super) title: String,
    /// The time axis runs from 0 to this, in seconds.
    pub(super) x_max: f64,
    /// What the left axis counts.
    pub(super) left_label: String,
    /// The left axis's top.
    pub(super) left_max: f64,
    /// Left-axis values shown as percentages.
    pub(super) percent: bool,
    /// What the right axis measures, and its top, if it has lines.
    pub(super) right_axis: Option<(String, f64)>,
    /// A shaded band between two left-axis values: a target.
    pub(super) band: Option<(f64, f64)>,
    /// The lines.
    pub(super) lines: Vec<Line>,
    /// The fleet's moments.
    pub(super) marks: Vec<Mark>,
}

/// The legend of the marks, under the picture's title.
const MARKS_LEGEND: &str = r##"<tspan fill="#2ca02c">▼ new replica UP in the balancer</tspan>   <tspan fill="#d62728">┆ SIGTERM</tspan>   <tspan fill="#ff7f0e">┆ balancer took it out</tspan>   <tspan fill="#7f7f7f">┆ exit</tspan>"##;

/// An axis's top at or above `peak` with a little room, whose quarters
/// are round numbers.
pub(super) fn axis_top(peak: f64) -> f64 {
    report::nice_ceiling((peak * 1.1 / 4.0).max(0.25)) * 4.0
}

/// An SVG of `charts`, one under the other.
pub(super) fn render(title: &str, charts: &[Chart]) -> String {
    #[allow(clippy::cast_precision_loss)]
    let height = TOP + PANEL_H * charts.len() as f64 + 10.0;
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(svg, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        svg,
        r#"<text x="{LEFT}" y="22" font-size="15" font-weight="bold">{}</text>"#,
        report::escape(title)
    );
    let _ = writeln!(
        svg,
        r##"<text x="{LEFT}" y="40" fill="#444">{MARKS_LEGEND}</text>"##
    );
    for (index, chart) in charts.iter().enumerate() {
        #[allow(clippy::cast_precision_loss)]
        let top = TOP + 40.0 + PANEL_H * index as f64;
        panel(&mut svg, chart, top);
    }
    svg.push_str("</svg>\n");
    svg
}

/// Where a panel's plot is.
struct Frame {
    top: f64,
    bottom: f64,
    width: f64,
    x_max: f64,
}

impl Frame {
    fn x(&self, seconds: f64) -> f64 {
        LEFT + self.width * (seconds / self.x_max).clamp(0.0, 1.0)
    }

    fn y(&self, value: f64, max: f64) -> f64 {
        self.bottom - (self.bottom - self.top) * (value / max).clamp(0.0, 1.0)
    }
}

fn panel(svg: &mut String, chart: &Chart, top: f64) {
    let frame = Frame {
        top,
        bottom: top + PANEL_H - 85.0,
        width: WIDTH - LEFT - RIGHT,
        x_max: chart.x_max.max(1.0),
    };
    let _ = writeln!(
        svg,
        r#"<text x="{LEFT}" y="{}" font-weight="bold">{}</text>"#,
        top - 22.0,
        report::escape(&chart.title)
    );
    legend(svg, chart, top - 7.0);
    if let Some((low, high)) = chart.band {
        let (y0, y1) = (frame.y(high, chart.left_max), frame.y(low, chart.left_max));
        let _ = writeln!(
            svg,
            r##"<rect x="{LEFT}" y="{y0:.1}" width="{:.1}" height="{:.1}" fill="#2ca02c" opacity="0.12"/>"##,
            frame.width,
            (y1 - y0).max(1.0)
        );
    }
    axes(svg, chart, &frame);
    marks(svg, &chart.marks, &frame);
    for line in &chart.lines {
        let max = match (&chart.right_axis, line.right) {
            (Some((_, max)), true) => *max,
            _ => chart.left_max,
        };
        let mut points = String::new();
        for (t, v) in &line.points {
            let _ = write!(points, "{:.1},{:.1} ", frame.x(*t), frame.y(*v, max));
        }
        let (width, opacity) = if line.right { (1.2, 0.8) } else { (1.4, 0.9) };
        let dash = if line.dashed { "4,2" } else { "none" };
        let _ = writeln!(
            svg,
            r#"<polyline points="{}" fill="none" stroke="{}" stroke-width="{width}" stroke-dasharray="{dash}" opacity="{opacity}"><title>{}</title></polyline>"#,
            points.trim_end(),
            line.color,
            report::escape(&line.label)
        );
    }
}

fn legend(svg: &mut String, chart: &Chart, y: f64) {
    let mut text = String::new();
    for line in &chart.lines {
        let _ = write!(
            text,
            r#"<tspan fill="{}">━ {}</tspan>   "#,
            line.color,
            report::escape(&line.label)
        );
    }
    if chart.band.is_some() {
        text.push_str(r##"<tspan fill="#2ca02c">░ target band</tspan>"##);
    }
    let _ = writeln!(
        svg,
        r##"<text x="{LEFT}" y="{y}" fill="#444" font-size="11">{}</text>"##,
        text.trim_end()
    );
}

fn axes(svg: &mut String, chart: &Chart, frame: &Frame) {
    let _ = writeln!(
        svg,
        r##"<rect x="{LEFT}" y="{}" width="{}" height="{}" fill="none" stroke="#999"/>"##,
        frame.top,
        frame.width,
        frame.bottom - frame.top
    );
    for step in 0..=4 {
        let value = chart.left_max * f64::from(step) / 4.0;
        let y = frame.y(value, chart.left_max);
        let label = if chart.percent {
            format!("{:.0}%", value * 100.0)
        } else {
            report::fmt_ms(value).trim_end_matches(".00").to_owned()
        };
        let _ = writeln!(
            svg,
            r##"<line x1="{LEFT}" x2="{:.1}" y1="{y:.1}" y2="{y:.1}" stroke="#eee"/><text x="{}" y="{:.1}" text-anchor="end" fill="#444">{label}</text>"##,
            LEFT + frame.width,
            LEFT - 6.0,
            y + 4.0
        );
        if let Some((_, max)) = &chart.right_axis {
            let _ = writeln!(
                svg,
                r#"<text x="{:.1}" y="{:.1}" fill="{RIGHT_COLOR}">{}</text>"#,
                LEFT + frame.width + 4.0,
                y + 4.0,
                report::fmt_ms(max * f64::from(step) / 4.0)
            );
        }
    }
    let tick = report::nice_ceiling(frame.x_max / 10.0).max(1.0);
    let mut t = 0.0;
    while t <= frame.x_max {
        let _ = writeln!(
            svg,
            r##"<text x="{:.1}" y="{}" text-anchor="middle" fill="#444">{t:.0}s</text>"##,
            frame.x(t),
            frame.bottom + 15.0
        );
        t += tick;
    }
    let _ = writeln!(
        svg,
        r##"<text x="{LEFT}" y="{}" fill="#444" font-size="11">left: {}{}</text>"##,
        frame.bottom + 32.0,
        report::escape(&chart.left_label),
        chart
            .right_axis
            .as_ref()
            .map_or_else(String::new, |(label, _)| format!(
                "; right: {}",
                report::escape(label)
            ))
    );
}

fn marks(svg: &mut String, marks: &[Mark], frame: &Frame) {
    for mark in marks {
        let x = frame.x(mark.at_s);
        let tooltip = format!(
            "{:?} {} at {:.2}s",
            mark.kind,
            report::escape(&mark.replica),
            mark.at_s
        );
        let (color, dash) = match mark.kind {
            MarkKind::Ready | MarkKind::LbIn => {
                let _ = writeln!(
                    svg,
                    r##"<path d="M{x:.1},{:.1} l-5,-8 h10 z" fill="#2ca02c"><title>{tooltip}</title></path>"##,
                    frame.top - 1.0
                );
                continue;
            }
            MarkKind::Sigterm | MarkKind::Sigkill => ("#d62728", "4,3"),
            MarkKind::LbOut => ("#ff7f0e", "2,2"),
            MarkKind::Exit => ("#7f7f7f", "1,3"),
        };
        let _ = writeln!(
            svg,
            r#"<line x1="{x:.1}" x2="{x:.1}" y1="{}" y2="{}" stroke="{color}" stroke-dasharray="{dash}"><title>{tooltip}</title></line>"#,
            frame.top, frame.bottom
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charts_render_lines_bands_and_marks() {
        let chart = Chart {
            title: "a <run>".to_owned(),
            x_max: 10.0,
            left_label: "share".to_owned(),
            left_max: 1.0,
            percent: true,
            right_axis: Some(("p99 (ms)".to_owned(), 20.0)),
            band: Some((0.3, 0.37)),
            lines: vec![Line {
                label: "r1".to_owned(),
                color: PALETTE[0],
                points: vec![(0.5, 0.5), (1.5, 0.4)],
                right: false,
                dashed: false,
            }],
            marks: vec![Mark {
                at_s: 2.0,
                kind: MarkKind::Sigterm,
                replica: "r1".to_owned(),
            }],
        };
        let svg = render("t", &[chart]);
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>\n"));
        assert!(svg.contains("a &lt;run&gt;"));
        assert!(svg.contains("<polyline") && svg.contains("stroke-dasharray"));
    }
}
