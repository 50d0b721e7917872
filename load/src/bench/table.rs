//! The tables shared by the parts under HTTP load: each server's medians,
//! and lameduck ÷ each baseline run by run; with the cells they format.

use super::stats::paired_ratio;
use super::Series;
use crate::report::{self, fmt_ms};

/// lameduck (`a`) ÷ each of `baselines`, run by run: throughput, p50 and
/// p99 as median (min–max), and the target of each row if it has one.
pub(super) fn ratio_table(a: &Series, baselines: &[(&Series, String)]) -> String {
    let pairs: Vec<(&Series, &Series, String)> = baselines
        .iter()
        .map(|(b, target)| (a, *b, target.clone()))
        .collect();
    pairs_table(&pairs)
}

/// Each `a ÷ b` of `pairs`, run by run, as [`ratio_table`] gives them.
pub(super) fn pairs_table(pairs: &[(&Series, &Series, String)]) -> String {
    let header: Vec<String> = [
        "ratio, run by run",
        "throughput, median (min–max)",
        "p50",
        "p99",
        "server CPU a request",
        "target (throughput)",
    ]
    .map(str::to_owned)
    .into();
    let rows: Vec<Vec<String>> = pairs
        .iter()
        .map(|(a, b, target)| {
            vec![
                format!("{} ÷ {}", a.server, b.server),
                paired_ratio(a, b, |r| r.rps),
                paired_ratio(a, b, |r| r.p50_ms),
                paired_ratio(a, b, |r| r.p99_ms),
                paired_ratio(a, b, |r| r.cpu_us),
                target.clone(),
            ]
        })
        .collect();
    report::table(&header, &rows)
}

/// The table of series under load, with each median ÷ `base`'s.
pub(super) fn series_table(series: &[&Series], base: &Series) -> String {
    let header: Vec<String> = vec![
        "server".to_owned(),
        "req/s (median)".to_owned(),
        "p50 ms".to_owned(),
        "p99 ms".to_owned(),
        format!("median ÷ median of {}", base.server),
        "server CPU µs a request (median)".to_owned(),
        "load generator busy (median)".to_owned(),
        "failed".to_owned(),
    ];
    let rows: Vec<Vec<String>> = series
        .iter()
        .map(|s| {
            vec![
                s.server.clone(),
                format!("{:.0}", s.rps),
                fmt_ms(s.p50_ms),
                fmt_ms(s.p99_ms),
                ratio(s.rps, base.rps),
                fmt_cpu(s.cpu_us),
                fmt_busy(s.client_busy),
                s.failures().to_string(),
            ]
        })
        .collect();
    report::table(&header, &rows)
}

/// A share of a core as a percentage, `–` where not measured.
pub(super) fn fmt_busy(share: f64) -> String {
    if share.is_finite() {
        format!("{:.0} %", share * 100.0)
    } else {
        "–".to_owned()
    }
}

/// CPU µs a request, `–` where not measured.
pub(super) fn fmt_cpu(us: f64) -> String {
    if us.is_finite() {
        format!("{us:.2}")
    } else {
        "–".to_owned()
    }
}

pub(super) fn ratio(a: f64, b: f64) -> String {
    if b == 0.0 {
        "–".to_owned()
    } else {
        format!("{:.3}", a / b)
    }
}
