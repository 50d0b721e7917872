//! The drawing kit the pictures share, on `plotters`' SVG backend: the
//! fonts, colours and round axis tops, how each kind of marked moment is
//! drawn, and a legend drawn with the same symbols as the plot.

use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::{Mark, MarkKind};

/// A drawing area of an SVG being written into a string.
pub(crate) type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;

/// A plot's area, in its data's coordinates (seconds, value).
pub(crate) type Plot<'a> = DrawingArea<SVGBackend<'a>, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

/// What drawing returns; into a string it cannot fail.
pub(crate) type Drawn = Result<(), DrawingAreaErrorKind<std::io::Error>>;

/// Requests answered as expected.
pub(crate) const BLUE_OK: RGBColor = RGBColor(0x1f, 0x77, 0xb4);
/// Failures, SIGTERM and SIGKILL.
pub(crate) const RED_FAIL: RGBColor = RGBColor(0xd6, 0x27, 0x28);
/// Readiness, a replica back in the balancer, a target band.
pub(crate) const GREEN_READY: RGBColor = RGBColor(0x2c, 0xa0, 0x2c);
/// The balancer taking a replica out.
pub(crate) const ORANGE_OUT: RGBColor = RGBColor(0xff, 0x7f, 0x0e);
/// A replica's exit; lines against a right-hand axis.
pub(crate) const GREY: RGBColor = RGBColor(0x7f, 0x7f, 0x7f);
/// The p99 latency of a timeline.
pub(crate) const PURPLE_P99: RGBColor = RGBColor(0x94, 0x67, 0xbd);
/// Shaded phases, and their labels' colour.
pub(crate) const WHEAT: RGBColor = RGBColor(0xf5, 0xde, 0xb3);
/// The labels of shaded phases.
pub(crate) const GOLDENROD: RGBColor = RGBColor(0xb8, 0x86, 0x0b);
/// Axis labels and notes.
pub(crate) const TEXT_GREY: RGBColor = RGBColor(0x44, 0x44, 0x44);
/// The plot's frame.
pub(crate) const FRAME: RGBColor = RGBColor(0x99, 0x99, 0x99);
/// The horizontal grid.
pub(crate) const GRID: RGBColor = RGBColor(0xee, 0xee, 0xee);

/// A sans-serif text style of `px` pixels (the SVG backend writes a
/// font size of the given size / 1.24).
pub(crate) fn font(px: f64, color: RGBColor, bold: bool) -> TextStyle<'static> {
    let style = if bold {
        FontStyle::Bold
    } else {
        FontStyle::Normal
    };
    FontDesc::new(FontFamily::SansSerif, px * 1.24, style).color(&color)
}

/// `font`, anchored at its left end and vertical middle.
pub(crate) fn left_font(px: f64, color: RGBColor, bold: bool) -> TextStyle<'static> {
    font(px, color, bold).pos(Pos::new(HPos::Left, VPos::Center))
}

/// The width of `text` at `px` pixels in a common sans-serif, roughly:
/// enough to lay a legend out.
pub(crate) fn text_width(text: &str, px: f64) -> i32 {
    #[allow(clippy::cast_precision_loss, clippy::cast_possible_truncation)]
    let width = (text.chars().count() as f64 * px * 0.5).round() as i32;
    width
}

/// A new white SVG canvas of `width` by `height` pixels writing into `svg`.
pub(crate) fn canvas(
    svg: &mut String,
    width: u32,
    height: u32,
) -> Result<Area<'_>, DrawingAreaErrorKind<std::io::Error>> {
    let root = SVGBackend::with_string(svg, (width, height)).into_drawing_area();
    root.fill(&WHITE)?;
    Ok(root)
}

/// Renders a picture into a string: `draw` fills the canvas.
pub(crate) fn render(width: u32, height: u32, draw: impl FnOnce(&Area<'_>) -> Drawn) -> String {
    let mut svg = String::new();
    let drawn = canvas(&mut svg, width, height).and_then(|root| {
        draw(&root)?;
        root.present()
    });
    drawn.unwrap_or_else(|e| unreachable!("drawing into a string cannot fail: {e}"));
    svg
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

/// How a marked moment is drawn.
#[derive(Clone, Copy, Debug)]
pub(crate) enum MarkStyle {
    /// A triangle above the plot: readiness comes milliseconds before the
    /// SIGTERM it allows, and would hide under its line.
    Triangle,
    /// A vertical rule across the plot, of this colour and width. Solid:
    /// plotters' SVG backend writes every dash as an element of its own
    /// (a rollout's picture took 366 kB dashed), so colour and width tell
    /// the kinds apart.
    Rule(RGBColor, u32),
}

/// The style of each kind of marked moment.
pub(crate) fn mark_style(kind: MarkKind) -> MarkStyle {
    match kind {
        MarkKind::Ready => MarkStyle::Triangle,
        MarkKind::Sigterm => MarkStyle::Rule(RED_FAIL, 1),
        MarkKind::Sigkill => MarkStyle::Rule(RED_FAIL, 2),
        MarkKind::LbOut => MarkStyle::Rule(ORANGE_OUT, 1),
        MarkKind::LbIn => MarkStyle::Rule(GREEN_READY, 1),
        MarkKind::Exit => MarkStyle::Rule(GREY, 1),
    }
}

/// A line from `from` to `to` in pixels.
pub(crate) fn rule(area: &Area<'_>, from: (i32, i32), to: (i32, i32), style: ShapeStyle) -> Drawn {
    area.draw(&PathElement::new(vec![from, to], style))
}

/// The down-pointing triangle of a readiness, its tip at `tip`.
pub(crate) fn triangle(area: &Area<'_>, tip: (i32, i32)) -> Drawn {
    let (x, y) = tip;
    area.draw(&Polygon::new(
        vec![(x, y), (x - 5, y - 8), (x + 5, y - 8)],
        GREEN_READY.filled(),
    ))
}

/// Draws a mark of `style` at pixel column `x` of a plot spanning `top`
/// to `bottom`.
pub(crate) fn mark(area: &Area<'_>, style: MarkStyle, x: i32, top: i32, bottom: i32) -> Drawn {
    match style {
        MarkStyle::Triangle => triangle(area, (x, top - 1)),
        MarkStyle::Rule(color, width) => {
            rule(area, (x, top), (x, bottom), color.stroke_width(width))
        }
    }
}

/// Draws `marks` on `plot`, which lies in `area` (a panel's, wide enough
/// for the triangles above the plot: an area clips what is drawn on it),
/// each in the style `style` gives its kind.
pub(crate) fn marks(
    area: &Area<'_>,
    plot: &Plot<'_>,
    marks: &[Mark],
    style: impl Fn(MarkKind) -> MarkStyle,
) -> Drawn {
    let (base_x, base_y) = area.get_base_pixel();
    let (_, ys) = plot.get_pixel_range();
    for mark in marks {
        let (x, _) = plot.map_coordinate(&(mark.at_s, 0.0));
        self::mark(
            area,
            style(mark.kind),
            x - base_x,
            ys.start - base_y,
            ys.end - 1 - base_y,
        )?;
    }
    Ok(())
}

/// The symbol of a legend entry, drawn as in the plot.
#[derive(Clone, Copy, Debug)]
pub enum Symbol {
    /// A line of this colour.
    Line(RGBColor),
    /// A bar of this colour.
    Bar(RGBColor),
    /// A shaded stretch of this colour.
    Shade(RGBColor),
    /// A marked moment.
    Mark(MarkKind),
}

/// One entry of a picture's legend: its symbol, and what it stands for.
#[derive(Clone, Copy, Debug)]
pub struct Key {
    /// How it is drawn.
    pub symbol: Symbol,
    /// What it means.
    pub label: &'static str,
}

/// Draws `symbol` in the 14 pixels right of `x`, centred on `y`.
fn symbol(area: &Area<'_>, symbol: Symbol, x: i32, y: i32) -> Drawn {
    match symbol {
        Symbol::Line(color) => area.draw(&PathElement::new(
            vec![(x, y), (x + 14, y)],
            color.stroke_width(2),
        )),
        Symbol::Bar(color) => area.draw(&Rectangle::new(
            [(x + 3, y - 5), (x + 11, y + 6)],
            color.mix(0.8).filled(),
        )),
        Symbol::Shade(color) => area.draw(&Rectangle::new(
            [(x, y - 5), (x + 14, y + 6)],
            color.mix(0.6).filled(),
        )),
        Symbol::Mark(kind) => match mark_style(kind) {
            MarkStyle::Triangle => triangle(area, (x + 7, y + 4)),
            style => mark(area, style, x + 7, y - 6, y + 7),
        },
    }
}

/// Draws a legend on one line from `(x, y)`: each entry's symbol, then its
/// label in `px` pixels.
pub(crate) fn legend<'k>(
    area: &Area<'_>,
    (mut x, y): (i32, i32),
    px: f64,
    keys: impl IntoIterator<Item = (Symbol, &'k str)>,
) -> Drawn {
    let style = left_font(px, TEXT_GREY, false);
    for (key, label) in keys {
        symbol(area, key, x, y)?;
        area.draw(&Text::new(label.to_owned(), (x + 18, y), style.clone()))?;
        x += 18 + text_width(label, px) + 14;
    }
    Ok(())
}
