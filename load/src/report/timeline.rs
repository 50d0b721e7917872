//! The timeline picture of rollout, crash and outage: one panel per
//! flavor on a common time axis, requests answered and failed per second,
//! the p99 latency against a right-hand axis where given, marked moments
//! and shaded phases.

use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::draw::{self, Area, Drawn, Key, Plot};
use super::{fmt_ms, Panel};

const WIDTH: u32 = 960;
const PANEL_H: u32 = 240;
const TOP: u32 = 52;

/// What the panels share: the common axes, and whether any has a latency
/// axis on the right.
struct Axes {
    seconds: f64,
    y_max: f64,
    right: bool,
}

impl Axes {
    #[allow(clippy::cast_precision_loss)]
    fn of(panels: &[Panel]) -> Axes {
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
        Axes {
            seconds: seconds as f64,
            y_max: draw::nice_ceiling(peak as f64 * 1.1),
            right: panels.iter().any(|p| !p.p99_ms.is_empty()),
        }
    }
}

/// The picture: `title`, the legend, then one panel per flavor.
pub(super) fn render(title: &str, legend: &[Key], panels: &[Panel]) -> String {
    let axes = Axes::of(panels);
    #[allow(clippy::cast_possible_truncation)]
    let height = TOP + PANEL_H * panels.len() as u32 + 10;
    draw::render(WIDTH, height, |root| {
        root.draw(&Text::new(
            title.to_owned(),
            (60, 16),
            draw::left_font(15.0, BLACK, true),
        ))?;
        draw::legend(
            root,
            (60, 38),
            11.0,
            legend.iter().map(|k| (k.symbol, k.label)),
        )?;
        let (_, body) = root.split_vertically(TOP);
        let areas = body.split_evenly((panels.len().max(1), 1));
        for (panel, area) in panels.iter().zip(&areas) {
            draw_panel(area, panel, &axes)?;
        }
        Ok(())
    })
}

/// One flavor's panel: its title above the plot, then the plot.
fn draw_panel(area: &Area<'_>, panel: &Panel, axes: &Axes) -> Drawn {
    area.draw(&Text::new(
        panel.title.clone(),
        (60, 10),
        draw::left_font(12.0, BLACK, true),
    ))?;
    let top_ms = draw::nice_ceiling(panel.p99_ms.iter().copied().fold(0.0, f64::max) * 1.1);
    let mut chart = ChartBuilder::on(area)
        .margin_top(24)
        .margin_bottom(12)
        .margin_right(if axes.right { 0 } else { 20 })
        .x_label_area_size(22)
        .y_label_area_size(60)
        .right_y_label_area_size(if axes.right { 60 } else { 0 })
        .build_cartesian_2d(0.0..axes.seconds, 0.0..axes.y_max)?
        .set_secondary_coord(0.0..axes.seconds, 0.0..top_ms);
    chart
        .configure_mesh()
        .disable_x_mesh()
        .bold_line_style(draw::GRID)
        .light_line_style(TRANSPARENT)
        .axis_style(draw::FRAME)
        .x_labels(11)
        .y_labels(7)
        .x_label_formatter(&|t| format!("{t:.0}s"))
        .y_label_formatter(&|v| format!("{v:.0}"))
        .label_style(draw::font(12.0, draw::TEXT_GREY, false))
        .axis_desc_style(draw::font(12.0, draw::TEXT_GREY, false))
        .y_desc("requests / s")
        .draw()?;
    if !panel.p99_ms.is_empty() {
        chart
            .configure_secondary_axes()
            .axis_style(draw::FRAME)
            .y_labels(3)
            .y_label_formatter(&|ms| fmt_ms(*ms))
            .label_style(draw::font(12.0, draw::PURPLE_P99, false))
            .axis_desc_style(draw::font(12.0, draw::PURPLE_P99, false))
            .y_desc("p99 latency, ms")
            .draw()?;
    }
    let plot = chart.plotting_area();
    shade_spans(plot, panel, axes)?;
    plot.draw(&Rectangle::new(
        [(0.0, 0.0), (axes.seconds, axes.y_max)],
        draw::FRAME.stroke_width(1),
    ))?;
    draw::marks(area, plot, &panel.marks, draw::mark_style)?;
    draw_series(plot, chart.secondary_plotting_area(), panel)
}

/// The shaded phases, each named at its top.
fn shade_spans(plot: &Plot<'_>, panel: &Panel, axes: &Axes) -> Drawn {
    let label = draw::font(11.0, draw::GOLDENROD, false).pos(Pos::new(HPos::Center, VPos::Top));
    for span in &panel.spans {
        plot.draw(&Rectangle::new(
            [(span.from_s, 0.0), (span.to_s, axes.y_max)],
            draw::WHEAT.mix(0.6).filled(),
        ))?;
        plot.draw(
            &(EmptyElement::at(((span.from_s + span.to_s) / 2.0, axes.y_max))
                + Text::new(span.label.clone(), (0, 5), label.clone())),
        )?;
    }
    Ok(())
}

/// The failed requests as bars, the answered ones and the p99 as lines.
#[allow(clippy::cast_precision_loss)]
fn draw_series(plot: &Plot<'_>, right: &Plot<'_>, panel: &Panel) -> Drawn {
    // A failure or two among a thousand would be under a pixel high.
    let (_, ys) = plot.get_pixel_range();
    let y_max = plot.as_coord_spec().get_y_range().end;
    let least = y_max * 2.0 / f64::from(ys.end - ys.start).max(1.0);
    for (second, failed) in panel.failed.iter().enumerate().filter(|(_, f)| **f > 0) {
        let s = second as f64;
        plot.draw(&Rectangle::new(
            [(s, 0.0), (s + 1.0, (*failed as f64).max(least))],
            draw::RED_FAIL.mix(0.8).filled(),
        ))?;
    }
    let ok: Vec<(f64, f64)> = panel
        .ok
        .iter()
        .enumerate()
        .map(|(s, n)| (s as f64 + 0.5, *n as f64))
        .collect();
    plot.draw(&PathElement::new(ok, draw::BLUE_OK.stroke_width(2)))?;
    if !panel.p99_ms.is_empty() {
        let p99: Vec<(f64, f64)> = panel
            .p99_ms
            .iter()
            .enumerate()
            .map(|(s, ms)| (s as f64 + 0.5, *ms))
            .collect();
        right.draw(&PathElement::new(
            p99,
            draw::PURPLE_P99.mix(0.85).stroke_width(1),
        ))?;
    }
    Ok(())
}
