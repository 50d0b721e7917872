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

use anyhow::Context;
use hdrhistogram::Histogram;
use serde::Serialize;
use tokio::sync::watch;
use tokio::time::Instant;

use super::clients::{self, Load, Record};
use super::fleet::{self, Fleet};
use super::series::{self, ReplicaSeries};
use super::{Rig, SHUTDOWN_TIMEOUT};
use crate::fate::{Fate, FateCounts};
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
    let (scratch, logs) = rig.dirs(&slug)?;
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
    let data = scratch.path().join("data");
    let spec = fleet::spec(&rig.program, &rig.certificates, &data, &rig.url, &extra);
    let mut fleet = Fleet::start(o.checks, spec, o.seed, scratch.path(), &logs).await?;
    for _ in 1..o.replicas {
        fleet.add().await?;
    }
    let codes = rig
        .fresh_links(fleet.first_addr().context("no replica")?)
        .await?;

    let tls = rig.tls_client()?;
    let (stop, stopped) = watch::channel(false);
    let origin = Instant::now();
    fleet.begin(origin);
    let load = Load {
        clients: o.scaleup_clients,
        rate: o.scaleup_rate,
        seed: o.seed,
        timeout: o.timeout,
        max_duration: Duration::from_secs(1800),
    };
    let traffic = tokio::spawn(clients::run(
        load,
        fleet.target(),
        tls.clone(),
        codes,
        origin,
        stopped,
    ));
    let added = async {
        tokio::time::sleep(o.steady).await;
        let added = fleet.add().await?;
        let up = added.started + added.up_after;
        eprintln!("load:   {} UP after {:?}", added.name, added.up_after);
        tokio::time::sleep_until(up + window).await;
        Ok::<_, anyhow::Error>((added.name, up))
    }
    .await;
    let _ = stop.send(true);
    let records = traffic.await.context("the clients failed")?;
    let (new_replica, up) = added?;
    let traffic_s = origin.elapsed().as_secs_f64();
    let stopped = fleet.stop(o.exit_bound()).await?;
    let hits_stored = rig.hits_stored().await?;
    let fair_share = 1.0 / f64::from(o.replicas);
    let mut result = summarize(age, &records, stopped, hits_stored, traffic_s, origin);
    result.handshakes = tls.handshakes().0;
    settle(
        &mut result,
        &new_replica,
        series::seconds(origin, up),
        fair_share,
        window,
    );
    Ok(result)
}

fn summarize(
    age: Option<Duration>,
    records: &[Record],
    stopped: fleet::Stopped,
    hits_stored: i64,
    traffic_s: f64,
    origin: Instant,
) -> ScaleUpResult {
    let ticks = series::ticks_in(traffic_s);
    let per_tick = series::per_tick(&stopped.traces, ticks, series::REDIRECTS);
    let per_second = series::regroup(&per_tick, series::ticks_per_second());
    let totals = series::total(&per_second);
    #[allow(clippy::cast_precision_loss)]
    let share_per_second = per_second
        .iter()
        .map(|s| ShareSeries {
            replica: s.replica.clone(),
            share: s
                .values
                .iter()
                .zip(&totals)
                .map(|(n, total)| {
                    if *total == 0 {
                        0.0
                    } else {
                        *n as f64 / *total as f64
                    }
                })
                .collect(),
        })
        .collect();
    let mut requests = FateCounts::default();
    let mut retried = 0;
    let mut latency: Histogram<u64> = report::histogram();
    for record in records {
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
        handshakes: 0,
        latency: Latency::of(&latency),
        new_replica: String::new(),
        added_at_s: 0.0,
        window_s: 0.0,
        fair_share: 0.0,
        new_share_end: 0.0,
        within_after_s: None,
        share_per_second,
        redirects_per_second: per_second,
        closed: series::closed_by(&stopped.traces),
        redirects_answered: requests.get(Fate::Success),
        hits_stored,
        final_exits: stopped.exits,
        traffic_s: (traffic_s * 10.0).round() / 10.0,
        marks: series::marks(origin, &stopped.marks),
    }
}

/// Fills in how the new replica's share settled: its share in the last
/// whole second, and when it came within [`SHARE_TOLERANCE`] of
/// `fair_share` for good, from `added_at_s` on.
fn settle(
    result: &mut ScaleUpResult,
    new_replica: &str,
    added_at_s: f64,
    fair_share: f64,
    window: Duration,
) {
    result.new_replica = new_replica.to_owned();
    result.added_at_s = added_at_s;
    result.window_s = window.as_secs_f64();
    result.fair_share = fair_share;
    let Some(share) = result
        .share_per_second
        .iter()
        .find(|s| s.replica == new_replica)
        .map(|s| &s.share)
    else {
        return;
    };
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let first = added_at_s.ceil().max(0.0) as usize;
    let watched = share.get(first..).unwrap_or(&[]);
    result.new_share_end = watched.last().copied().unwrap_or(0.0);
    let within = |s: &f64| (s - fair_share).abs() <= SHARE_TOLERANCE * fair_share;
    let settled =
        (0..watched.len()).find(|&i| !watched[i..].is_empty() && watched[i..].iter().all(within));
    #[allow(clippy::cast_precision_loss)]
    let after = settled.map(|i| ((first + i + 1) as f64 - added_at_s).max(0.0));
    result.within_after_s = after.map(|s| (s * 10.0).round() / 10.0);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(new_share: Vec<f64>) -> ScaleUpResult {
        let mut result = summarize(
            None,
            &[],
            fleet::Stopped {
                exits: Vec::new(),
                traces: Vec::new(),
                marks: Vec::new(),
            },
            0,
            0.0,
            Instant::now(),
        );
        result.share_per_second = vec![ShareSeries {
            replica: "r3".to_owned(),
            share: new_share,
        }];
        result
    }

    #[test]
    fn the_share_settles_at_the_first_second_from_which_it_stays_near_fair() {
        let mut r = result(vec![0.0, 0.0, 0.0, 0.1, 0.32, 0.2, 0.31, 0.34, 0.33]);
        settle(&mut r, "r3", 2.5, 1.0 / 3.0, Duration::from_secs(6));
        assert_eq!(
            r.within_after_s,
            Some(4.5),
            "from second 6 on, its end 7 s, 4.5 s after 2.5"
        );
        assert!((r.new_share_end - 0.33).abs() < 1e-9);

        let mut none = result(vec![0.0; 9]);
        settle(&mut none, "r3", 2.5, 1.0 / 3.0, Duration::from_secs(6));
        assert_eq!((none.within_after_s, none.new_share_end), (None, 0.0));
    }
}
