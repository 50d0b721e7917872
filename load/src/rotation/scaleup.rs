//! Part 2, the scale-up: R − 1 replicas behind the L4 balancer under
//! keep-alive HTTPS clients, then one more, started, ready and UP. The
//! balancer gives the new replica new connections only, and kept-alive
//! clients open none: without a maximum connection age it serves nothing.
//! With `--max-connection-age`, every connection is closed around its age
//! (with jitter), its client comes back through the balancer, and one in
//! R lands on the new replica.
//!
//! Each replica's redirect counter, read every 100 ms, gives its share of
//! the requests per second; the new replica is watched for twice the age
//! after it is UP.

use std::collections::BTreeMap;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;
use tokio::time::Instant;

use super::clients::{Finished, Load, Traffic};
use super::fleet::{self, Fleet};
use super::series::{self, ReplicaSeries};
use super::{Rig, SHUTDOWN_TIMEOUT};
use crate::fate::{Fate, FateCounts};
use crate::fleet::{phases, Steady};
use crate::replica::Ended;
use crate::report::{self, Latency, Mark};

/// How near the new replica's share must come to its fair share (1/R),
/// relative to it: within 10 %.
pub const SHARE_TOLERANCE: f64 = 0.1;

/// One replica's share of the requests answered, per second.
#[derive(Clone, Debug, Serialize)]
pub struct ShareSeries {
    /// The replica.
    pub replica: String,
    /// Per whole second from the origin: its redirects over the fleet's
    /// (0 in a second without any).
    pub share: Vec<f64>,
}

/// One scale-up run.
#[derive(Clone, Debug, Serialize)]
pub struct ScaleUpResult {
    /// The replicas' `--max-connection-age`, if any.
    #[serde(with = "crate::report::opt_millis")]
    pub age: Option<Duration>,
    /// Its label in tables.
    pub label: String,
    /// Every request by fate.
    pub requests: FateCounts,
    /// Requests sent a second time on a new connection after a reused one
    /// failed with nothing answered.
    pub retried: u64,
    /// TLS handshakes the clients made.
    pub handshakes: u64,
    /// Latency of the requests answered.
    pub latency: Latency,
    /// The replica added.
    pub new_replica: String,
    /// When the balancer had it UP, in seconds since the traffic started.
    pub added_at_s: f64,
    /// How long it was watched after that.
    pub window_s: f64,
    /// Its fair share, 1/R.
    pub fair_share: f64,
    /// Its share of the requests in the last whole second watched.
    pub new_share_end: f64,
    /// From its addition to the end of the first second from which its
    /// share stayed within [`SHARE_TOLERANCE`] of its fair share to the
    /// end; `None` if it never settled there.
    pub within_after_s: Option<f64>,
    /// Every replica's share per second.
    pub share_per_second: Vec<ShareSeries>,
    /// Every replica's redirects answered per second.
    pub redirects_per_second: Vec<ReplicaSeries>,
    /// Connections closed, by `by/reason`, summed over the replicas.
    pub closed: BTreeMap<String, u64>,
    /// Redirects answered 307.
    pub redirects_answered: u64,
    /// `SUM(links.hits)` after every replica exited.
    pub hits_stored: i64,
    /// How the replicas exited at the end (SIGTERM, no traffic).
    pub final_exits: Vec<Ended>,
    /// Seconds of traffic.
    pub traffic_s: f64,
    /// Every replica ready and UP.
    pub marks: Vec<Mark>,
}

impl ScaleUpResult {
    /// Redirects answered but not stored (negative: stored, not answered).
    pub fn hits_lost(&self) -> i64 {
        i64::try_from(self.redirects_answered).unwrap_or(i64::MAX) - self.hits_stored
    }
}

/// `--max-connection-age 20s`, or `no --max-connection-age`.
pub fn label(age: Option<Duration>) -> String {
    age.map_or_else(
        || "no --max-connection-age".to_owned(),
        |age| format!("--max-connection-age {}", humantime::format_duration(age)),
    )
}

/// Runs the scale-up once, with `age` as every replica's
/// `--max-connection-age` (none if `None`); the new replica is watched for
/// twice the options' age either way.
///
/// # Errors
/// If a step of the harness fails.
pub(super) async fn run(rig: &Rig<'_>, age: Option<Duration>) -> anyhow::Result<ScaleUpResult> {
    let o = rig.options;
    let window = o.max_connection_age * 2;
    eprintln!(
        "load: scale-up, {}: {} + 1 replicas, {} clients, {} req/s, watched {window:?}",
        label(age),
        o.replicas - 1,
        o.scaleup_clients,
        o.scaleup_rate
    );
    let slug = age.map_or_else(
        || "scale-up-no-age".to_owned(),
        |_| "scale-up-age".to_owned(),
    );
    // No replica leaves under traffic here: no lame duck is needed.
    let mut extra = vec![
        "--drain-delay".to_owned(),
        "0s".to_owned(),
        "--shutdown-timeout".to_owned(),
        humantime::format_duration(SHUTDOWN_TIMEOUT).to_string(),
    ];
    if let Some(age) = age {
        extra.push("--max-connection-age".to_owned());
        extra.push(humantime::format_duration(age).to_string());
    }
    let (mut fleet, scratch, codes) = rig.start_fleet(&slug, &extra, o.replicas - 1).await?;
    let load = Load {
        clients: o.scaleup_clients,
        rate: o.scaleup_rate,
        seed: o.seed,
        timeout: o.timeout,
        max_duration: Duration::from_secs(1800),
    };
    let traffic = Traffic::start(load, fleet.target(), rig.tls_client()?, codes);
    let origin = traffic.origin;
    fleet.begin(origin);
    // Watched to the end of the window: no steady stretch after it.
    let steady = Steady {
        before: o.steady,
        after: Duration::ZERO,
    };
    let watching = add_and_watch(&mut fleet, window);
    let ((new_replica, up), done) = phases(traffic, steady, watching).await?;
    let stopped = fleet.stop(o.exit_bound()).await?;
    drop(scratch);
    let watched = Watched {
        new_replica,
        added_at_s: series::seconds(origin, up),
        fair_share: 1.0 / f64::from(o.replicas),
        window,
    };
    let hits_stored = rig.hits_stored().await?;
    Ok(summarize(age, &done, &watched, stopped, hits_stored))
}

/// Adds a replica and watches it for `window` from the moment it is UP;
/// returns its name and that moment.
async fn add_and_watch(fleet: &mut Fleet, window: Duration) -> anyhow::Result<(String, Instant)> {
    let added = fleet.add().await?;
    let up = added.started + added.up_after;
    eprintln!("load:   {} UP after {:?}", added.name, added.up_after);
    tokio::time::sleep_until(up + window).await;
    Ok((added.name, up))
}

/// The replica added, and how it is judged.
struct Watched {
    new_replica: String,
    /// When it was UP, in seconds from the origin.
    added_at_s: f64,
    /// 1/R.
    fair_share: f64,
    /// How long it was watched.
    window: Duration,
}

fn summarize(
    age: Option<Duration>,
    done: &Finished,
    watched: &Watched,
    stopped: fleet::Stopped,
    hits_stored: i64,
) -> ScaleUpResult {
    let ticks = series::ticks_in(done.traffic_s);
    let per_tick = series::per_tick(&stopped.traces, ticks, series::REDIRECTS);
    let per_second = series::regroup(&per_tick, series::ticks_per_second());
    let share_per_second = shares(&per_second);
    let (new_share_end, within_after_s) = settle(&share_per_second, watched);
    let mut requests = FateCounts::default();
    let mut retried = 0;
    let mut latency: Histogram<u64> = report::histogram();
    for record in &done.records {
        requests.add(record.fate);
        retried += u64::from(record.retried);
        if record.fate == Fate::Success {
            report::record(&mut latency, record.latency);
        }
    }
    ScaleUpResult {
        age,
        label: label(age),
        requests,
        retried,
        handshakes: done.handshakes,
        latency: Latency::of(&latency),
        new_replica: watched.new_replica.clone(),
        added_at_s: watched.added_at_s,
        window_s: watched.window.as_secs_f64(),
        fair_share: watched.fair_share,
        new_share_end,
        within_after_s,
        share_per_second,
        redirects_per_second: per_second,
        closed: series::closed_by(&stopped.traces),
        redirects_answered: requests.get(Fate::Success),
        hits_stored,
        final_exits: stopped.exits,
        traffic_s: (done.traffic_s * 10.0).round() / 10.0,
        marks: stopped.marks,
    }
}

/// Each replica's redirects per second over the fleet's.
fn shares(per_second: &[ReplicaSeries]) -> Vec<ShareSeries> {
    let totals = series::total(per_second);
    #[allow(clippy::cast_precision_loss)]
    let share = |n: &u64, total: &u64| {
        if *total == 0 {
            0.0
        } else {
            *n as f64 / *total as f64
        }
    };
    per_second
        .iter()
        .map(|s| ShareSeries {
            replica: s.replica.clone(),
            share: s
                .values
                .iter()
                .zip(&totals)
                .map(|(n, t)| share(n, t))
                .collect(),
        })
        .collect()
}

/// How the new replica's share settled: its share in the last whole second,
/// and how long after its addition it came within [`SHARE_TOLERANCE`] of
/// its fair share for good (to the end of the first second from which it
/// stayed there).
fn settle(shares: &[ShareSeries], watched: &Watched) -> (f64, Option<f64>) {
    let Some(share) = shares
        .iter()
        .find(|s| s.replica == watched.new_replica)
        .map(|s| &s.share)
    else {
        return (0.0, None);
    };
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let first = watched.added_at_s.ceil().max(0.0) as usize;
    let seen = share.get(first..).unwrap_or(&[]);
    let fair = watched.fair_share;
    let within = |s: &f64| (s - fair).abs() <= SHARE_TOLERANCE * fair;
    let settled = (0..seen.len()).find(|&i| seen[i..].iter().all(within));
    #[allow(clippy::cast_precision_loss)]
    let after = settled.map(|i| ((first + i + 1) as f64 - watched.added_at_s).max(0.0));
    (
        seen.last().copied().unwrap_or(0.0),
        after.map(|s| (s * 10.0).round() / 10.0),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn watched() -> Watched {
        Watched {
            new_replica: "r3".to_owned(),
            added_at_s: 2.5,
            fair_share: 1.0 / 3.0,
            window: Duration::from_secs(6),
        }
    }

    fn new_share(share: Vec<f64>) -> Vec<ShareSeries> {
        vec![ShareSeries {
            replica: "r3".to_owned(),
            share,
        }]
    }

    #[test]
    fn the_share_settles_at_the_first_second_from_which_it_stays_near_fair() {
        let shares = new_share(vec![0.0, 0.0, 0.0, 0.1, 0.32, 0.2, 0.31, 0.34, 0.33]);
        let (end, after) = settle(&shares, &watched());
        assert_eq!(
            after,
            Some(4.5),
            "from second 6 on, its end 7 s, 4.5 s after 2.5"
        );
        assert!((end - 0.33).abs() < 1e-9);
        assert_eq!(settle(&new_share(vec![0.0; 9]), &watched()), (0.0, None));
    }

    #[test]
    fn shares_are_of_the_fleets_requests_each_second() {
        let per_second = vec![
            ReplicaSeries {
                replica: "r1".to_owned(),
                values: vec![10, 0, 3],
            },
            ReplicaSeries {
                replica: "r2".to_owned(),
                values: vec![30, 0, 1],
            },
        ];
        let shares = shares(&per_second);
        assert_eq!(shares[0].share, vec![0.25, 0.0, 0.75]);
        assert_eq!(shares[1].share, vec![0.75, 0.0, 0.25]);
    }
}
