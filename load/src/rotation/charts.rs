//! The panels of `load rotation`'s picture: for each storm run, every
//! replica's new connections per 100 ms, the fleet's, and the p99 per
//! second; for each scale-up run, every replica's share of the requests
//! per second against its fair share.

use super::scaleup::{ScaleUpResult, SHARE_TOLERANCE};
use super::series;
use super::storm::{StormResult, WARMUP};
use super::svg::{self, Chart, Line};
use crate::report;

/// `12.5 %`.
fn percent(share: f64) -> String {
    format!("{:.1} %", share * 100.0)
}

/// The storm's panels, on common axes so that the runs compare at a glance.
pub(super) fn storm(runs: &[StormResult]) -> Vec<Chart> {
    let x_max = runs.iter().map(|r| r.traffic_s).fold(1.0, f64::max);
    let rounds = runs.iter().map(|r| r.round).max().unwrap_or(1);
    // The clients' first connections, and the first second's latency,
    // would flatten the rest: the axes are set from after the warm-up,
    // and the warm-up runs off the top.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let warm = WARMUP.as_secs() as usize;
    let warm_ticks = warm * series::ticks_per_second();
    #[allow(clippy::cast_precision_loss)]
    let peak = runs
        .iter()
        .flat_map(|r| series::total(&r.new_per_100ms).into_iter().skip(warm_ticks))
        .max()
        .unwrap_or(1) as f64;
    let p99_top = runs
        .iter()
        .flat_map(|r| r.p99_ms_per_second.iter().skip(warm))
        .copied()
        .fold(1.0, f64::max);
    runs.iter()
        .map(|r| Chart {
            title: format!(
                "storm, {}{}: peak {} new connections / 100 ms replacing; p99 {} ms steady, {} ms replacing; {} failed",
                r.label,
                if rounds > 1 {
                    format!(" (round {})", r.round)
                } else {
                    String::new()
                },
                r.peak_new_per_100ms,
                report::fmt_ms(r.latency_steady.p99_ms),
                report::fmt_ms(r.latency_replacing.p99_ms),
                r.requests.failed()
            ),
            x_max,
            left_label: "new connections per 100 ms (each replica's accepted count; \
                         the clients' first connections run off the top)"
                .to_owned(),
            left_max: svg::axis_top(peak),
            percent: false,
            right_axis: Some(("p99 latency per second, ms".to_owned(), svg::axis_top(p99_top))),
            band: None,
            lines: storm_lines(r),
            marks: r.marks.clone(),
        })
        .collect()
}

/// A storm run's lines: each replica's new connections per 100 ms, the
/// fleet's, and the p99 per second.
#[allow(clippy::cast_precision_loss)]
fn storm_lines(r: &StormResult) -> Vec<Line> {
    let per_tick = |values: &[u64]| -> Vec<(f64, f64)> {
        values
            .iter()
            .enumerate()
            .map(|(t, n)| (series::at_tick(t) + 0.05, *n as f64))
            .collect()
    };
    let mut lines: Vec<Line> = r
        .new_per_100ms
        .iter()
        .enumerate()
        .map(|(i, s)| Line {
            label: s.replica.clone(),
            color: svg::PALETTE[i % svg::PALETTE.len()],
            points: per_tick(&s.values),
            right: false,
        })
        .collect();
    lines.push(Line {
        label: "fleet".to_owned(),
        color: svg::TOTAL_COLOR,
        points: per_tick(&series::total(&r.new_per_100ms)),
        right: false,
    });
    lines.push(Line {
        label: "p99 latency (right)".to_owned(),
        color: svg::RIGHT_COLOR,
        points: r
            .p99_ms_per_second
            .iter()
            .enumerate()
            .map(|(s, ms)| (s as f64 + 0.5, *ms))
            .collect(),
        right: true,
    });
    lines
}

/// The scale-up's panels.
pub(super) fn scale_up(runs: &[ScaleUpResult]) -> Vec<Chart> {
    let x_max = runs.iter().map(|r| r.traffic_s).fold(1.0, f64::max);
    runs.iter()
        .map(|r| {
            let lines = r
                .share_per_second
                .iter()
                .enumerate()
                .map(|(i, s)| Line {
                    label: s.replica.clone(),
                    color: svg::PALETTE[i % svg::PALETTE.len()],
                    #[allow(clippy::cast_precision_loss)]
                    points: s
                        .share
                        .iter()
                        .enumerate()
                        .map(|(t, v)| (t as f64 + 0.5, *v))
                        .collect(),
                    right: false,
                })
                .collect();
            let within = r.within_after_s.map_or_else(
                || "never within 10 %".to_owned(),
                |s| format!("within 10 % after {s:.1} s"),
            );
            Chart {
                title: format!(
                    "scale-up, {}: {} UP at {:.1} s, {} of the requests at the end ({within}); {} failed",
                    r.label,
                    r.new_replica,
                    r.added_at_s,
                    percent(r.new_share_end),
                    r.requests.failed()
                ),
                x_max,
                left_label: "share of the redirects answered per second (each replica's count)".to_owned(),
                left_max: 1.0,
                percent: true,
                right_axis: None,
                band: Some((
                    r.fair_share * (1.0 - SHARE_TOLERANCE),
                    r.fair_share * (1.0 + SHARE_TOLERANCE),
                )),
                lines,
                marks: r.marks.clone(),
            }
        })
        .collect()
}
