//! Part 1, the storm: every replica replaced once behind the L4 balancer,
//! under keep-alive HTTPS clients, with one `--drain-spread`.
//!
//! A replacement starts the new replica and waits until it is ready and
//! UP in the balancer (its start-up cost stays out of the window), then
//! SIGTERMs the oldest and waits for its exit. Its window runs from the
//! SIGTERM to a [`Options::tail`](super::Options) after the exit: the old
//! replica's clients come back through the balancer in it, each with a
//! full TLS handshake, and the new connections per 100 ms over the whole
//! fleet peak there.

use std::collections::BTreeMap;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;
use tokio::time::Instant;

use super::clients::{Load, Record, Traffic};
use super::fleet::{self, Fleet};
use super::series::{self, ReplicaSeries};
use super::{Options, Rig, Spread, SHUTDOWN_TIMEOUT};
use crate::fate::{Fate, FateCounts};
use crate::fleet::{phases, Added, Retired, Steady};
use crate::replica::Ended;
use crate::report::{self, Latency, Mark};

/// The first stretch of traffic, when every client opens its first
/// connection: kept out of the steady latency and reconnect rate.
pub const WARMUP: Duration = Duration::from_secs(1);

/// One replacement.
#[derive(Clone, Debug, Serialize)]
pub struct Replacement {
    /// The new replica.
    pub new_replica: String,
    /// From its start to its first 200 on `/readyz`.
    #[serde(with = "crate::report::millis")]
    pub new_ready_after: Duration,
    /// From its start until the balancer had it UP.
    #[serde(with = "crate::report::millis")]
    pub new_up_after: Duration,
    /// The old replica.
    pub old_replica: String,
    /// When it got SIGTERM, in seconds since the traffic started.
    pub sigterm_at_s: f64,
    /// From SIGTERM until the balancer's checks took it out, if before it
    /// exited.
    #[serde(with = "crate::report::opt_millis")]
    pub lb_out_after: Option<Duration>,
    /// How it ended; `after` is SIGTERM to exit.
    pub ended: Ended,
    /// The most new connections the fleet accepted in one 100 ms during
    /// the window.
    pub peak_new_per_100ms: u64,
    /// New connections the fleet accepted during the window.
    pub new_connections: u64,
}

/// One storm run: one spread, every replica replaced once.
#[derive(Clone, Debug, Serialize)]
pub struct StormResult {
    /// The spread.
    pub spread: Spread,
    /// Its round, from 1.
    pub round: u16,
    /// Its label in tables.
    pub label: String,
    /// Every request by fate.
    pub requests: FateCounts,
    /// Requests sent a second time on a new connection after a reused one
    /// failed with nothing answered.
    pub retried: u64,
    /// TLS handshakes the clients made (none resumed).
    pub handshakes: u64,
    /// Latency of requests answered, due after the warm-up and outside
    /// every replacement (from the new replica's start to the tail after
    /// the old one's exit).
    pub latency_steady: Latency,
    /// Latency of requests answered, due in a replacement's window (SIGTERM
    /// to the tail after the exit).
    pub latency_replacing: Latency,
    /// The worst p99 of a whole second after the warm-up and outside every
    /// replacement, ms: the window-wide p99s dilute a storm of a second
    /// over the seconds of a drain.
    pub p99_worst_second_steady_ms: f64,
    /// The worst p99 of a whole second that overlaps a replacement window.
    pub p99_worst_second_replacing_ms: f64,
    /// The most new connections the fleet accepted in one 100 ms during a
    /// replacement window.
    pub peak_new_per_100ms: u64,
    /// The same outside every replacement, after the warm-up.
    pub steady_peak_new_per_100ms: u64,
    /// Every replacement, in order.
    pub replacements: Vec<Replacement>,
    /// Connections closed, by `by/reason`, summed over the replicas (as
    /// each last counted them, before its exit).
    pub closed: BTreeMap<String, u64>,
    /// Redirects answered 307.
    pub redirects_answered: u64,
    /// `SUM(links.hits)` after every replica exited.
    pub hits_stored: i64,
    /// How the replicas left at the end exited (SIGTERM, no traffic).
    pub final_exits: Vec<Ended>,
    /// Seconds of traffic.
    pub traffic_s: f64,
    /// Per replica, per 100 ms from the origin: connections accepted.
    pub new_per_100ms: Vec<ReplicaSeries>,
    /// Per second: p50, p99 and max latency of the requests answered, ms.
    pub p50_ms_per_second: Vec<f64>,
    /// See `p50_ms_per_second`.
    pub p99_ms_per_second: Vec<f64>,
    /// See `p50_ms_per_second`.
    pub max_ms_per_second: Vec<f64>,
    /// Every replica ready and UP, SIGTERMed, out, exited.
    pub marks: Vec<Mark>,
}

impl StormResult {
    /// Redirects answered but not stored (negative: stored, not answered).
    pub fn hits_lost(&self) -> i64 {
        i64::try_from(self.redirects_answered).unwrap_or(i64::MAX) - self.hits_stored
    }

    /// p99 while replacing over p99 steady.
    pub fn p99_ratio(&self) -> f64 {
        if self.latency_steady.p99_ms > 0.0 {
            self.latency_replacing.p99_ms / self.latency_steady.p99_ms
        } else {
            f64::INFINITY
        }
    }
}

/// One replacement's steps, as the fleet did them.
struct Step {
    added: Added,
    retired: Retired,
}

/// Runs the storm once with `spread`.
///
/// # Errors
/// If a step of the harness fails.
pub(super) async fn run(rig: &Rig<'_>, spread: Spread, round: u16) -> anyhow::Result<StormResult> {
    let o = rig.options;
    eprintln!(
        "load: storm, --drain-spread {} (round {round}): R={}, {} clients, {} req/s, --drain-delay {:?}",
        spread.arg(),
        o.replicas,
        o.clients,
        o.rate,
        o.drain_delay
    );
    let extra = [
        "--drain-delay".to_owned(),
        humantime::format_duration(o.drain_delay).to_string(),
        "--drain-spread".to_owned(),
        spread.arg().to_owned(),
        "--shutdown-timeout".to_owned(),
        humantime::format_duration(SHUTDOWN_TIMEOUT).to_string(),
    ];
    let slug = format!("storm-{}-{round}", spread.arg());
    let (mut fleet, scratch, codes) = rig.start_fleet(&slug, &extra, o.replicas).await?;
    let traffic = Traffic::start(load(o), fleet.target(), rig.tls_client()?, codes);
    let origin = traffic.origin;
    fleet.begin(origin);
    let replacing = replace_all(&mut fleet, o);
    let (steps, done) = phases(traffic, Steady::around(o.steady), replacing).await?;
    let stopped = fleet.stop(o.exit_bound()).await?;
    drop(scratch);
    let hits_stored = rig.hits_stored().await?;
    Ok(summarize(
        Run {
            spread,
            round,
            origin,
            traffic_s: done.traffic_s,
            handshakes: done.handshakes,
            tail: o.tail(),
        },
        &done.records,
        &steps,
        stopped,
        hits_stored,
    ))
}

/// The storm's traffic.
fn load(o: &Options) -> Load {
    Load {
        clients: o.clients,
        rate: o.rate,
        seed: o.seed,
        timeout: o.timeout,
        // Far more than any run takes; only a harness bug reaches it.
        max_duration: Duration::from_secs(1800),
    }
}

/// Every replica replaced in turn, a tail apart (the steady traffic
/// around them is the runner's).
async fn replace_all(fleet: &mut Fleet, o: &Options) -> anyhow::Result<Vec<Step>> {
    let mut steps = Vec::new();
    for k in 1..=o.replicas {
        if k > 1 {
            tokio::time::sleep(o.tail()).await;
        }
        let added = fleet.add().await?;
        let retired = fleet.retire_oldest(o.exit_bound()).await?;
        eprintln!(
            "load:   {k}/{}: {} ready in {:?}, UP in {:?}; {} exited {} {:?} after SIGTERM (balancer out after {})",
            o.replicas,
            added.name,
            added.ready_after,
            added.up_after,
            retired.name,
            retired.ended.describe(),
            retired.ended.after,
            retired
                .lb_out_after
                .map_or_else(|| "-".to_owned(), |d| format!("{d:?}"))
        );
        steps.push(Step { added, retired });
    }
    Ok(steps)
}

/// What [`summarize`] needs of the run beside its records.
struct Run {
    spread: Spread,
    round: u16,
    origin: Instant,
    traffic_s: f64,
    handshakes: u64,
    tail: Duration,
}

/// A replacement's stretches, in seconds from the origin: from the new
/// replica's start, from the SIGTERM, to the tail after the exit.
#[derive(Clone, Copy)]
struct Window {
    start: f64,
    sigterm: f64,
    end: f64,
}

fn summarize(
    run: Run,
    records: &[Record],
    steps: &[Step],
    stopped: fleet::Stopped,
    hits_stored: i64,
) -> StormResult {
    let windows: Vec<Window> = steps
        .iter()
        .map(|step| {
            let sigterm = series::seconds(run.origin, step.retired.sigterm);
            Window {
                start: series::seconds(run.origin, step.added.started),
                sigterm,
                end: sigterm + (step.retired.ended.after + run.tail).as_secs_f64(),
            }
        })
        .collect();
    let ticks = series::ticks_in(run.traffic_s);
    let new_per_100ms = series::per_tick(&stopped.traces, ticks, series::ACCEPTED);
    let fleet_new = series::total(&new_per_100ms);
    let replacements: Vec<Replacement> = steps
        .iter()
        .zip(&windows)
        .map(|(step, window)| replacement(step, *window, &fleet_new))
        .collect();
    let steady_peak = fleet_new
        .iter()
        .enumerate()
        .filter(|(tick, _)| {
            let at = series::at_tick(*tick);
            at >= WARMUP.as_secs_f64() && !windows.iter().any(|w| (w.start..w.end).contains(&at))
        })
        .map(|(_, n)| *n)
        .max()
        .unwrap_or(0);
    let (requests, retried, steady, replacing) = tally(records, &windows);
    let [p50, p99, max] = series::latency_per_second(records);
    let (p99_worst_second_steady_ms, p99_worst_second_replacing_ms) = worst_seconds(&p99, &windows);
    StormResult {
        spread: run.spread,
        round: run.round,
        label: format!("--drain-spread {}", run.spread.arg()),
        requests,
        retried,
        handshakes: run.handshakes,
        latency_steady: Latency::of(&steady),
        latency_replacing: Latency::of(&replacing),
        p99_worst_second_steady_ms,
        p99_worst_second_replacing_ms,
        peak_new_per_100ms: replacements
            .iter()
            .map(|r| r.peak_new_per_100ms)
            .max()
            .unwrap_or(0),
        steady_peak_new_per_100ms: steady_peak,
        closed: series::closed_by(&stopped.traces),
        redirects_answered: requests.get(Fate::Success),
        hits_stored,
        final_exits: stopped.exits,
        traffic_s: (run.traffic_s * 10.0).round() / 10.0,
        new_per_100ms,
        p50_ms_per_second: p50,
        p99_ms_per_second: p99,
        max_ms_per_second: max,
        marks: stopped.marks,
        replacements,
    }
}

/// The worst p99 of a second, steady (after the warm-up, clear of every
/// replacement) and replacing (overlapping a SIGTERM-to-tail window).
fn worst_seconds(p99_per_second: &[f64], windows: &[Window]) -> (f64, f64) {
    let (mut steady, mut replacing) = (0.0_f64, 0.0_f64);
    for (second, p99) in p99_per_second.iter().enumerate() {
        #[allow(clippy::cast_precision_loss)]
        let (from, to) = (second as f64, second as f64 + 1.0);
        if windows.iter().any(|w| from < w.end && to > w.sigterm) {
            replacing = replacing.max(*p99);
        } else if from >= WARMUP.as_secs_f64()
            && !windows.iter().any(|w| from < w.end && to > w.start)
        {
            steady = steady.max(*p99);
        }
    }
    (steady, replacing)
}

/// A replacement's figures, its reconnect peak read from the fleet's new
/// connections per tick in its window (SIGTERM to tail).
fn replacement(step: &Step, window: Window, fleet_new: &[u64]) -> Replacement {
    let from = series::tick_of(window.sigterm);
    let to = (series::tick_of(window.end) + 1).min(fleet_new.len());
    let in_window = fleet_new.get(from..to).unwrap_or(&[]);
    Replacement {
        new_replica: step.added.name.clone(),
        new_ready_after: step.added.ready_after,
        new_up_after: step.added.up_after,
        old_replica: step.retired.name.clone(),
        sigterm_at_s: window.sigterm,
        lb_out_after: step.retired.lb_out_after,
        ended: step.retired.ended,
        peak_new_per_100ms: in_window.iter().copied().max().unwrap_or(0),
        new_connections: in_window.iter().sum(),
    }
}

/// Requests by fate, those retried, and the latency of those answered:
/// steady (after the warm-up, outside every replacement) and replacing
/// (due from a SIGTERM to its window's end).
fn tally(
    records: &[Record],
    windows: &[Window],
) -> (FateCounts, u64, Histogram<u64>, Histogram<u64>) {
    let mut requests = FateCounts::default();
    let mut retried = 0;
    let (mut steady, mut replacing) = (report::histogram(), report::histogram());
    for record in records {
        requests.add(record.fate);
        retried += u64::from(record.retried);
        if record.fate != Fate::Success {
            continue;
        }
        let due = record.due.as_secs_f64();
        if windows.iter().any(|w| (w.sigterm..w.end).contains(&due)) {
            report::record(&mut replacing, record.latency);
        } else if due >= WARMUP.as_secs_f64()
            && !windows.iter().any(|w| (w.start..w.end).contains(&due))
        {
            report::record(&mut steady, record.latency);
        }
    }
    (requests, retried, steady, replacing)
}
