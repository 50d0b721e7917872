//! What one run measured: the report's types (what slowhttptest held,
//! what the normal client saw, the server's counters and exit), and the
//! figures drawn from the raw records.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;

use super::{Attack, Options};
use crate::fate::Fate;
use crate::machine::Machine;
use crate::metric;
use crate::metrics::Metrics;
use crate::replica::Ended;
use crate::report::{self, Latency};

/// Everything one run measured.
#[derive(Clone, Debug, Serialize)]
pub struct AbuseReport {
    /// The machine, the date and the command.
    pub machine: Machine,
    /// The options.
    pub options: Options,
    /// One per attack, in the order run.
    pub attacks: Vec<AttackReport>,
}

/// One attack: what slowhttptest held, how the normal client fared, the
/// server's counters and its exit.
#[derive(Clone, Debug, Serialize)]
pub struct AttackReport {
    /// Which attack.
    pub attack: Attack,
    /// Connections it was to hold at once.
    pub target: u32,
    /// Every slowhttptest process, as run and as it reported.
    pub processes: Vec<SlowReport>,
    /// Connections held, from slowhttptest's reports and the server's gauge.
    pub held: Held,
    /// From starting slowhttptest to the start of the measurement.
    #[serde(with = "crate::report::millis")]
    pub ramp: Duration,
    /// The measurement started because [`MOST`] of the target was reported
    /// up (not because [`RAMP_LIMIT`] passed).
    pub ramp_reached: bool,
    /// The normal client's redirects.
    pub redirects: KindSummary,
    /// The normal client's link creations.
    pub creations: KindSummary,
    /// `/metrics` counters: after the attack minus before it.
    pub counters: Counters,
    /// The server's exit after SIGTERM.
    pub ended: Ended,
    /// Every normal request.
    pub requests: Vec<Record>,
}

/// Connections the attack held.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct Held {
    /// Most connected at once, summed over the processes, from their
    /// printed status (every 5 s) and their per-second CSV, whichever is
    /// higher.
    pub peak: u64,
    /// The same from the printed status alone.
    pub peak_printed: u64,
    /// Fewest and most connected in a second of the measurement (CSV).
    pub window_min: u64,
    /// See `window_min`.
    pub window_max: u64,
    /// Fewest and most `lameduck_connections_open` (every protocol, the
    /// normal client's connections included), read from the admin
    /// listener's `/metrics` every [`SAMPLE_EVERY`] during the measurement.
    pub server_min: i64,
    /// See `server_min`.
    pub server_max: i64,
    /// Reads of `/metrics` during the measurement that failed.
    pub failed_scrapes: usize,
    /// Status reports in which slowhttptest's own probe found the service
    /// unavailable, and all its status reports.
    pub probe_unavailable: usize,
    /// See `probe_unavailable`.
    pub probe_reports: usize,
}

/// One slowhttptest process.
#[derive(Clone, Debug, Serialize)]
pub struct SlowReport {
    /// The command line, as run in the output folder.
    pub command: String,
    /// How it ended: `"0"`, `"SIGKILL"`, …
    pub exit: String,
    /// Its own final verdict (`Exit status:` line), if it printed one.
    pub exit_status: Option<String>,
    /// The connection count it lowered its target to for lack of file
    /// descriptors, if it did.
    pub lowered_to: Option<u32>,
    /// Its printed status reports.
    pub printed: Vec<Status>,
    /// Connected sockets per second, from its CSV.
    pub per_second: Vec<(u32, u64)>,
}

/// One printed status report of slowhttptest.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Status {
    /// Seconds since it started.
    pub second: u32,
    /// Sockets connecting.
    pub pending: u64,
    /// Sockets that sent their request head and are open.
    pub connected: u64,
    /// Sockets closed (by the server).
    pub closed: u64,
    /// Sockets it could not open.
    pub error: u64,
    /// Its probe connection got an answer.
    pub available: bool,
}

/// What the normal client saw for one kind of request.
#[derive(Clone, Debug, Default, Serialize)]
pub struct KindSummary {
    /// Requests sent.
    pub requests: u64,
    /// Answered with the expected status.
    pub succeeded: u64,
    /// `succeeded ÷ requests`, in per cent.
    pub success_percent: f64,
    /// Latency of the successful ones.
    pub latency: Latency,
    /// The failures, by fate.
    pub failures: BTreeMap<String, u64>,
}

/// The server's counters over the attack (after minus before).
#[derive(Clone, Debug, Default, Serialize)]
pub struct Counters {
    /// `lameduck_requests_shed_total`: 503s at the concurrency limit.
    pub shed: f64,
    /// `lameduck_requests_timed_out_total`.
    pub timed_out: f64,
    /// `lameduck_http_requests_total` series with status `4xx` or `5xx`
    /// that grew: route and class, and by how much.
    pub http_errors: Vec<(String, f64)>,
}

/// The kinds of normal requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// `GET /{code}`, 307 expected.
    Redirect,
    /// `POST /api/links`, 201 expected.
    Creation,
}

impl Kind {
    /// The status that means success.
    pub(super) fn expected(self) -> u16 {
        match self {
            Kind::Redirect => 307,
            Kind::Creation => 201,
        }
    }
}

/// One normal request.
#[derive(Clone, Debug, Serialize)]
pub struct Record {
    /// Which kind.
    pub kind: Kind,
    /// When it was due, from the start of the measurement, ms.
    pub due_ms: f64,
    /// From when it was due to its answer (or failure), ms.
    pub latency_ms: f64,
    /// What happened.
    pub fate: Fate,
}

// === figures ===

/// What the normal client saw for `kind`.
pub(super) fn summarize(records: &[Record], kind: Kind) -> KindSummary {
    let mut latency = report::histogram();
    let mut summary = KindSummary::default();
    for record in records.iter().filter(|r| r.kind == kind) {
        summary.requests += 1;
        if record.fate == Fate::Success {
            summary.succeeded += 1;
            report::record(
                &mut latency,
                Duration::from_secs_f64(record.latency_ms / 1e3),
            );
        } else {
            *summary
                .failures
                .entry(record.fate.as_str().to_owned())
                .or_default() += 1;
        }
    }
    #[allow(clippy::cast_precision_loss)]
    if summary.requests > 0 {
        summary.success_percent = summary.succeeded as f64 * 100.0 / summary.requests as f64;
    }
    summary.latency = Latency::of(&latency);
    summary
}

/// Connections held: sums the processes' counts second by second; `window` is the
/// measurement, in seconds since the attack started.
pub(super) fn held(processes: &[SlowReport], window: (f64, f64), server: &[i64]) -> Held {
    let mut per_second: BTreeMap<u32, u64> = BTreeMap::new();
    let mut printed: BTreeMap<u32, u64> = BTreeMap::new();
    let mut held = Held::default();
    for process in processes {
        for (second, connected) in &process.per_second {
            *per_second.entry(*second).or_default() += connected;
        }
        for status in &process.printed {
            *printed.entry(status.second).or_default() += status.connected;
            held.probe_reports += 1;
            held.probe_unavailable += usize::from(!status.available);
        }
    }
    held.peak_printed = printed.values().copied().max().unwrap_or(0);
    held.peak = per_second
        .values()
        .copied()
        .max()
        .unwrap_or(0)
        .max(held.peak_printed);
    let in_window: Vec<u64> = per_second
        .iter()
        .filter(|(second, _)| {
            let second = f64::from(**second);
            second >= window.0.floor() && second <= window.1.ceil()
        })
        .map(|(_, connected)| *connected)
        .collect();
    held.window_min = in_window.iter().copied().min().unwrap_or(0);
    held.window_max = in_window.iter().copied().max().unwrap_or(0);
    held.server_min = server.iter().copied().min().unwrap_or(0);
    held.server_max = server.iter().copied().max().unwrap_or(0);
    held
}

/// The server's counters over the attack: `after` minus `before`.
pub(super) fn counters(before: &Metrics, after: &Metrics) -> Counters {
    let delta = |name: &str| after.sum(name) - before.sum(name);
    let mut http_errors = Vec::new();
    for sample in after.samples(&metric("http_requests_total")) {
        let status = sample.label("status").unwrap_or_default();
        if status != "4xx" && status != "5xx" {
            continue;
        }
        let grew = sample.value - before.value(&sample.name, &sample.labels).unwrap_or(0.0);
        if grew > 0.0 {
            let route = sample.label("route").unwrap_or_default();
            http_errors.push((format!("{route} {status}"), grew));
        }
    }
    Counters {
        shed: delta(&metric("requests_shed_total")),
        timed_out: delta(&metric("requests_timed_out_total")),
        http_errors,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_are_parsed_and_summed() {
        let open = metric("connections_open");
        let requests = metric("http_requests");
        // A valid OpenMetrics page: each family under its own TYPE line.
        let text = format!(
            "# TYPE {open} gauge\n\
            {open}{{protocol=\"pending\"}} 3\n\
            {open}{{protocol=\"http1\"}} 1100\n\
            # TYPE {open}_other gauge\n\
            {open}_other 7\n\
            # TYPE {requests} counter\n\
            {requests}_total{{route=\"/api/links\",status=\"4xx\"}} 12\n\
            # EOF\n"
        );
        let metrics = Metrics::parse(&text).expect("a valid page");
        assert!((metrics.sum(&open) - 1103.0).abs() < 1e-9);
        let before = Metrics::default();
        let counted = counters(&before, &metrics);
        assert_eq!(
            counted.http_errors,
            vec![("/api/links 4xx".to_owned(), 12.0)]
        );
    }
}
