//! Output: Markdown tables for stdout and the README, JSON for machines,
//! and an SVG picture of a run (requests per second and failures over
//! time, with every SIGTERM or SIGKILL and every replica's readiness
//! marked, and the p99 latency per second where a scenario gives it),
//! drawn with `plotters` in `timeline.rs` from the kit in `draw.rs`.

use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use hdrhistogram::Histogram;
use serde::Serialize;

pub(crate) mod draw;
mod timeline;

pub(crate) use draw::nice_ceiling;
pub use draw::{Key, Symbol};

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
const ROLLOUT_LEGEND: &[Key] = &[
    Key {
        symbol: Symbol::Line(draw::BLUE_OK),
        label: "answered as expected /s",
    },
    Key {
        symbol: Symbol::Bar(draw::RED_FAIL),
        label: "failed /s",
    },
    Key {
        symbol: Symbol::Mark(MarkKind::Ready),
        label: "new replica ready",
    },
    Key {
        symbol: Symbol::Mark(MarkKind::Sigterm),
        label: "SIGTERM",
    },
    Key {
        symbol: Symbol::Mark(MarkKind::LbOut),
        label: "balancer took it out",
    },
    Key {
        symbol: Symbol::Mark(MarkKind::Exit),
        label: "exit",
    },
];

/// The crash picture's legend.
pub const CRASH_LEGEND: &[Key] = &[
    Key {
        symbol: Symbol::Line(draw::BLUE_OK),
        label: "answered as expected /s",
    },
    Key {
        symbol: Symbol::Line(draw::PURPLE_P99),
        label: "p99 latency (ms, right)",
    },
    Key {
        symbol: Symbol::Bar(draw::RED_FAIL),
        label: "failed /s",
    },
    Key {
        symbol: Symbol::Mark(MarkKind::Sigkill),
        label: "SIGKILL",
    },
    Key {
        symbol: Symbol::Mark(MarkKind::Ready),
        label: "restarted replica ready",
    },
    Key {
        symbol: Symbol::Mark(MarkKind::LbOut),
        label: "balancer took it out",
    },
    Key {
        symbol: Symbol::Mark(MarkKind::LbIn),
        label: "put it back",
    },
];

/// The legend of a picture with shaded phases and no marks.
pub const PHASE_LEGEND: &[Key] = &[
    Key {
        symbol: Symbol::Line(draw::BLUE_OK),
        label: "answered as expected /s",
    },
    Key {
        symbol: Symbol::Bar(draw::RED_FAIL),
        label: "failed /s",
    },
    Key {
        symbol: Symbol::Shade(draw::WHEAT),
        label: "the disturbance, named above it",
    },
];

/// An SVG with one panel per flavor, on a common time axis, with the
/// rollout's marks.
pub fn rollout_svg(title: &str, panels: &[Panel]) -> String {
    timeline_svg(title, ROLLOUT_LEGEND, panels)
}

/// An SVG with one panel per flavor, on a common time axis: requests
/// answered and failed per second, marks and shaded spans, the p99 latency
/// where given; `legend` says what its symbols mean.
pub fn timeline_svg(title: &str, legend: &[Key], panels: &[Panel]) -> String {
    timeline::render(title, legend, panels)
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
        let svg = rollout_svg("t <1>", &[panel]);
        let doc = roxmltree::Document::parse(&svg).expect("well-formed XML");
        assert_eq!(doc.root_element().tag_name().name(), "svg");
        let texts: Vec<&str> = doc
            .descendants()
            .filter(|n| n.has_tag_name("text"))
            .filter_map(|n| n.text())
            .map(str::trim)
            .collect();
        for wanted in [
            "t <1>",
            "a <b>",
            "database <down>",
            "SIGTERM",
            "requests / s",
            "0s",
        ] {
            assert!(texts.contains(&wanted), "{wanted:?} not in {texts:?}");
        }
        let count = |tag: &str| doc.descendants().filter(|n| n.has_tag_name(tag)).count();
        assert!(count("polyline") >= 2, "the answered and p99 lines");
        assert!(count("rect") >= 3, "background, span, failed bar");
        assert!((nice_ceiling(1100.0) - 1200.0).abs() < 1e-9);
    }
}
