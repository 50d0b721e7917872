//! The picture of `load rotation`: line charts, one panel per run, each
//! with its own time axis, a left axis for counts or shares, an optional
//! right axis (latency), a shaded target band, and the fleet's moments
//! (new replica UP, SIGTERM, balancer out, exit) marked.

use plotters::prelude::*;

use crate::report::draw::{self, Area, Drawn, Plot, Symbol};
use crate::report::{self, Mark, MarkKind};

/// Replicas' colours, in the order they were started.
pub(super) const PALETTE: [RGBColor; 8] = [
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0x8c, 0x56, 0x4b),
    RGBColor(0xe3, 0x77, 0xc2),
    RGBColor(0x17, 0xbe, 0xcf),
];

/// The colour of lines against the right axis.
pub(super) const RIGHT_COLOR: RGBColor = draw::GREY;

/// The colour of a fleet's total.
pub(super) const TOTAL_COLOR: RGBColor = BLACK;

const WIDTH: u32 = 960;
const PANEL_H: u32 = 280;
const TOP: u32 = 52;

/// One line of a chart.
#[derive(Clone, Debug)]
pub(super) struct Line {
    /// Its name in the panel's legend.
    pub(super) label: String,
    /// Its colour.
    pub(super) color: RGBColor,
    /// `(seconds, value)`, in order.
    pub(super) points: Vec<(f64, f64)>,
    /// Drawn against the right axis.
    pub(super) right: bool,
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
const MARKS_LEGEND: [(Symbol, &str); 4] = [
    (
        Symbol::Mark(MarkKind::Ready),
        "new replica UP in the balancer",
    ),
    (Symbol::Mark(MarkKind::Sigterm), "SIGTERM"),
    (Symbol::Mark(MarkKind::LbOut), "balancer took it out"),
    (Symbol::Mark(MarkKind::Exit), "exit"),
];

/// An axis's top at or above `peak` with a little room, whose quarters
/// are round numbers.
pub(super) fn axis_top(peak: f64) -> f64 {
    report::nice_ceiling((peak * 1.1 / 4.0).max(0.25)) * 4.0
}

/// An SVG of `charts`, one under the other.
pub(super) fn render(title: &str, charts: &[Chart]) -> String {
    #[allow(clippy::cast_possible_truncation)]
    let height = TOP + PANEL_H * charts.len() as u32 + 10;
    draw::render(WIDTH, height, |root| {
        root.draw(&Text::new(
            title.to_owned(),
            (60, 16),
            draw::left_font(15.0, BLACK, true),
        ))?;
        draw::legend(root, (60, 38), 12.0, MARKS_LEGEND)?;
        let (_, body) = root.split_vertically(TOP);
        for (chart, area) in charts
            .iter()
            .zip(&body.split_evenly((charts.len().max(1), 1)))
        {
            panel(area, chart)?;
        }
        Ok(())
    })
}

/// A chart's heading: its name in bold, what it found on the next line
/// (the title's part after the first colon), and its lines' legend.
fn heading(area: &Area<'_>, chart: &Chart) -> Drawn {
    let (name, found) = chart.title.split_once(": ").unwrap_or((&chart.title, ""));
    area.draw(&Text::new(
        name.to_owned(),
        (60, 10),
        draw::left_font(12.0, BLACK, true),
    ))?;
    area.draw(&Text::new(
        found.to_owned(),
        (60, 25),
        draw::left_font(12.0, BLACK, false),
    ))?;
    let mut keys: Vec<(Symbol, &str)> = chart
        .lines
        .iter()
        .map(|line| (Symbol::Line(line.color), line.label.as_str()))
        .collect();
    if chart.band.is_some() {
        keys.push((Symbol::Shade(draw::GREEN_READY), "target band"));
    }
    draw::legend(area, (60, 40), 11.0, keys)
}

/// One chart: its heading, the plot with its axes, band, marks and
/// lines, and what the axes measure under it.
fn panel(area: &Area<'_>, chart: &Chart) -> Drawn {
    heading(area, chart)?;
    let x_max = chart.x_max.max(1.0);
    let right_max = chart.right_axis.as_ref().map_or(1.0, |(_, max)| *max);
    let mut ctx = ChartBuilder::on(area)
        .margin_top(58)
        .margin_bottom(24)
        .x_label_area_size(22)
        .y_label_area_size(60)
        .right_y_label_area_size(60)
        .build_cartesian_2d(0.0..x_max, 0.0..chart.left_max)?
        .set_secondary_coord(0.0..x_max, 0.0..right_max);
    let percent = |v: &f64| format!("{:.0}%", v * 100.0);
    let count = |v: &f64| report::fmt_ms(*v).trim_end_matches(".00").to_owned();
    let left: &dyn Fn(&f64) -> String = if chart.percent { &percent } else { &count };
    ctx.configure_mesh()
        .disable_x_mesh()
        .bold_line_style(draw::GRID)
        .light_line_style(TRANSPARENT)
        .axis_style(draw::FRAME)
        .x_labels(11)
        .y_labels(6)
        .x_label_formatter(&|t| format!("{t:.0}s"))
        .y_label_formatter(left)
        .label_style(draw::font(12.0, draw::TEXT_GREY, false))
        .draw()?;
    if chart.right_axis.is_some() {
        ctx.configure_secondary_axes()
            .axis_style(draw::FRAME)
            .y_labels(5)
            .y_label_formatter(&|ms| report::fmt_ms(*ms))
            .label_style(draw::font(12.0, RIGHT_COLOR, false))
            .draw()?;
    }
    let plot = ctx.plotting_area();
    if let Some((low, high)) = chart.band {
        plot.draw(&Rectangle::new(
            [(0.0, low), (x_max, high)],
            draw::GREEN_READY.mix(0.12).filled(),
        ))?;
    }
    plot.draw(&Rectangle::new(
        [(0.0, 0.0), (x_max, chart.left_max)],
        draw::FRAME.stroke_width(1),
    ))?;
    // A replica UP in the balancer is its readiness here.
    let style = |kind| {
        draw::mark_style(if kind == MarkKind::LbIn {
            MarkKind::Ready
        } else {
            kind
        })
    };
    draw::marks(area, plot, &chart.marks, style)?;
    for line in &chart.lines {
        let (area, max) = match (&chart.right_axis, line.right) {
            (Some((_, max)), true) => (ctx.secondary_plotting_area(), *max),
            _ => (plot, chart.left_max),
        };
        draw_line(area, line, max)?;
    }
    note(area, plot, chart)
}

/// A line, its values clamped to the axis's top: what runs off the top
/// stays on the frame.
fn draw_line(plot: &Plot<'_>, line: &Line, max: f64) -> Drawn {
    let points: Vec<(f64, f64)> = line
        .points
        .iter()
        .map(|(t, v)| (*t, v.clamp(0.0, max)))
        .collect();
    let style = if line.right {
        line.color.mix(0.8).stroke_width(1)
    } else {
        line.color.mix(0.9).stroke_width(1)
    };
    plot.draw(&PathElement::new(points, style))
}

/// What the axes measure, under the time axis.
fn note(area: &Area<'_>, plot: &Plot<'_>, chart: &Chart) -> Drawn {
    let right = chart
        .right_axis
        .as_ref()
        .map_or_else(String::new, |(label, _)| format!("; right: {label}"));
    let (_, ys) = plot.get_pixel_range();
    let y = ys.end + 30 - area.get_base_pixel().1;
    area.draw(&Text::new(
        format!("left: {}{right}", chart.left_label),
        (60, y),
        draw::left_font(11.0, draw::TEXT_GREY, false),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charts_render_lines_bands_and_marks() {
        let chart = Chart {
            title: "a <run>: found".to_owned(),
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
            }],
            marks: vec![Mark {
                at_s: 2.0,
                kind: MarkKind::Sigterm,
                replica: "r1".to_owned(),
            }],
        };
        let svg = render("t", &[chart]);
        let doc = roxmltree::Document::parse(&svg).expect("well-formed XML");
        let texts: Vec<&str> = doc
            .descendants()
            .filter(|n| n.has_tag_name("text"))
            .filter_map(|n| n.text())
            .map(str::trim)
            .collect();
        for wanted in [
            "a <run>",
            "r1",
            "target band",
            "SIGTERM",
            "100%",
            "left: share; right: p99 (ms)",
        ] {
            assert!(texts.contains(&wanted), "{wanted:?} not in {texts:?}");
        }
        let lines = doc
            .descendants()
            .filter(|n| n.has_tag_name("polyline"))
            .count();
        // The line, the SIGTERM's rule, the legend's symbols, the axes.
        assert!(lines > 5, "{lines} polylines");
    }
}
