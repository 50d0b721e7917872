//! Time series of a run: each replica's counters turned into counts per
//! tick, requests' latency per second, and the moments of the run on the
//! traffic's clock.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;

use super::clients::Record;
use super::fleet::Trace;
use super::scrape::{Reading, TICK};
use crate::fate::Fate;

/// One replica's counts, one per bucket.
#[derive(Clone, Debug, Serialize)]
pub struct ReplicaSeries {
    /// The replica (`r4`).
    pub replica: String,
    /// Per bucket (a tick or a second, as its field says).
    pub values: Vec<u64>,
}

/// What a counter of `reading` is.
type Counter = fn(&Reading) -> u64;

/// The connections a replica accepted.
pub(super) const ACCEPTED: Counter = |reading| reading.accepted;

/// The redirects a replica answered.
pub(super) const REDIRECTS: Counter = |reading| reading.redirects;

/// Each replica's growth of `counter` per tick, over `ticks` ticks from the
/// origin: bucket `b` holds what grew between the readings at ticks `b`
/// and `b + 1`. A replica's first reading is its baseline (it was not yet
/// in the balancer, or the traffic had not started); what grew over
/// skipped ticks lands in the last of them.
pub(super) fn per_tick(traces: &[Trace], ticks: usize, counter: Counter) -> Vec<ReplicaSeries> {
    traces
        .iter()
        .map(|trace| {
            let mut values = vec![0; ticks];
            for pair in trace.readings.windows(2) {
                let grew = counter(&pair[1]).saturating_sub(counter(&pair[0]));
                let bucket = usize::try_from(pair[1].tick).unwrap_or(usize::MAX);
                if let Some(value) = bucket.checked_sub(1).and_then(|b| values.get_mut(b)) {
                    *value += grew;
                }
            }
            ReplicaSeries {
                replica: trace.name.clone(),
                values,
            }
        })
        .collect()
}

/// Sums of every `per` buckets (ticks into seconds); a last, partial group
/// is dropped.
pub(super) fn regroup(series: &[ReplicaSeries], per: usize) -> Vec<ReplicaSeries> {
    series
        .iter()
        .map(|s| ReplicaSeries {
            replica: s.replica.clone(),
            values: s.values.chunks_exact(per).map(|c| c.iter().sum()).collect(),
        })
        .collect()
}

/// The whole fleet's count per bucket.
pub(super) fn total(series: &[ReplicaSeries]) -> Vec<u64> {
    let len = series.iter().map(|s| s.values.len()).max().unwrap_or(0);
    (0..len)
        .map(|b| series.iter().filter_map(|s| s.values.get(b)).sum())
        .collect()
}

/// Ticks in `seconds` of traffic (whole ticks).
pub(super) fn ticks_in(seconds: f64) -> usize {
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let ticks = (seconds / TICK.as_secs_f64()).floor().max(0.0) as usize;
    ticks
}

/// The tick bucket a moment `at_s` seconds from the origin falls in.
pub(super) fn tick_of(at_s: f64) -> usize {
    ticks_in(at_s)
}

/// Where tick bucket `tick` starts, in seconds from the origin.
pub(super) fn at_tick(tick: usize) -> f64 {
    #[allow(clippy::cast_precision_loss)]
    let at = tick as f64 * TICK.as_secs_f64();
    at
}

/// Ticks per second.
pub(super) fn ticks_per_second() -> usize {
    usize::try_from(Duration::from_secs(1).as_nanos() / TICK.as_nanos()).unwrap_or(10)
}

/// p50, p99 and max latency (ms) per whole second of due time, of the
/// requests answered as expected; 0 for a second without any.
pub(super) fn latency_per_second(records: &[Record]) -> [Vec<f64>; 3] {
    #[allow(clippy::cast_possible_truncation)]
    let seconds = records.last().map_or(0, |r| r.due.as_secs()) as usize;
    let mut buckets: Vec<Vec<Duration>> = vec![Vec::new(); seconds];
    for record in records.iter().filter(|r| r.fate == Fate::Success) {
        #[allow(clippy::cast_possible_truncation)]
        if let Some(bucket) = buckets.get_mut(record.due.as_secs() as usize) {
            bucket.push(record.latency);
        }
    }
    let ms = |d: Option<&Duration>| d.map_or(0.0, |d| (d.as_secs_f64() * 1e5).round() / 100.0);
    let mut out = [Vec::new(), Vec::new(), Vec::new()];
    for mut bucket in buckets {
        bucket.sort();
        let at = |q: usize| (bucket.len() * q).div_ceil(100).saturating_sub(1);
        out[0].push(ms(bucket.get(at(50))));
        out[1].push(ms(bucket.get(at(99))));
        out[2].push(ms(bucket.last()));
    }
    out
}

/// Each replica's last reading of its closed connections, summed over the
/// fleet: `server/drain` → count.
pub(super) fn closed_by(traces: &[Trace]) -> BTreeMap<String, u64> {
    let mut sums = BTreeMap::new();
    for reading in traces.iter().filter_map(|t| t.readings.last()) {
        for (key, value) in &reading.closed {
            *sums.entry(key.clone()).or_default() += value;
        }
    }
    sums
}

/// Seconds from `origin` to `at` (negative before it), to the millisecond.
pub(super) fn seconds(origin: Instant, at: Instant) -> f64 {
    let s = match at.checked_duration_since(origin) {
        Some(after) => after.as_secs_f64(),
        None => -origin.duration_since(at).as_secs_f64(),
    };
    (s * 1000.0).round() / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(tick: u64, accepted: u64) -> Reading {
        Reading {
            tick,
            accepted,
            ..Reading::default()
        }
    }

    #[test]
    fn counters_turn_into_counts_per_tick_from_each_replicas_baseline() {
        let traces = vec![
            Trace {
                name: "r1".to_owned(),
                readings: vec![reading(0, 5), reading(1, 7), reading(2, 7), reading(4, 10)],
            },
            Trace {
                name: "r4".to_owned(),
                readings: vec![reading(2, 0), reading(3, 4)],
            },
        ];
        let series = per_tick(&traces, 5, ACCEPTED);
        assert_eq!(
            series[0].values,
            vec![2, 0, 0, 3, 0],
            "a skipped tick's growth lands in the last"
        );
        assert_eq!(
            series[1].values,
            vec![0, 0, 4, 0, 0],
            "the first reading is the baseline"
        );
        assert_eq!(total(&series), vec![2, 0, 4, 3, 0]);
        assert_eq!(regroup(&series, 2)[0].values, vec![2, 3]);
        assert_eq!(tick_of(0.35), 3);
    }
}
