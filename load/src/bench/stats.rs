//! The statistics of the tables: medians, and ratios paired run by run
//! (each pair ran back to back in one round, so drift of a shared machine
//! cancels out of it), with their verdicts against a target.

use super::{Run, Series};

pub(super) fn median(values: impl Iterator<Item = f64>) -> f64 {
    let mut values: Vec<f64> = values.collect();
    if values.is_empty() {
        return 0.0;
    }
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    if values.len() % 2 == 1 {
        values[mid]
    } else {
        (values[mid - 1] + values[mid]) / 2.0
    }
}

/// The median of the finite `values`, NaN if there are none.
pub(super) fn median_measured(values: impl Iterator<Item = f64>) -> f64 {
    let measured: Vec<f64> = values.filter(|v| v.is_finite()).collect();
    if measured.is_empty() {
        f64::NAN
    } else {
        median(measured.into_iter())
    }
}

/// The ratio of `a` to `b` run by run (each pair ran back to back in one
/// round), as "median (min–max)": drift of a shared machine cancels out of
/// each pair, where a ratio of medians would mix rounds.
pub(super) fn paired_ratio(a: &Series, b: &Series, value: impl Fn(&Run) -> f64) -> String {
    fmt_ratios(&paired_ratios(&a.runs, &b.runs, value))
}

/// `a[i] ÷ b[i]` for every pair whose divisor is positive and whose
/// dividend was measured.
pub(super) fn paired_ratios<T>(a: &[T], b: &[T], value: impl Fn(&T) -> f64) -> Vec<f64> {
    a.iter()
        .zip(b)
        .filter(|(x, y)| value(x).is_finite() && value(y) > 0.0)
        .map(|(x, y)| value(x) / value(y))
        .collect()
}

/// Ratios as "median (min–max)", `–` for none.
pub(super) fn fmt_ratios(ratios: &[f64]) -> String {
    if ratios.is_empty() {
        return "–".to_owned();
    }
    let min = ratios.iter().copied().fold(f64::INFINITY, f64::min);
    let max = ratios.iter().copied().fold(0.0, f64::max);
    format!("{:.3} ({min:.2}–{max:.2})", median(ratios.iter().copied()))
}

/// "met" or "not met" for the median of paired `ratios` against a target
/// (`at_least`: the ratio must be ≥ it, else ≤).
pub(super) fn verdict(ratios: &[f64], target: f64, at_least: bool) -> &'static str {
    if ratios.is_empty() {
        return "not measured";
    }
    let value = median(ratios.iter().copied());
    if (at_least && value >= target) || (!at_least && value <= target) {
        "met"
    } else {
        "not met"
    }
}
