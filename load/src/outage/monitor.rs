//! What the harness watches while the traffic runs: every replica's
//! `/readyz` on its admin port — whether it is ready, and the database
//! state it reports (`up`, `busy`, `down`: down means its circuit breaker is
//! open) — and how many servers the balancer sends to.

use std::net::SocketAddr;
use std::time::Duration;

use serde::Serialize;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::haproxy::{self, Haproxy};
use crate::raw::{self, RawConn};

/// How often each replica's `/readyz` is read.
pub const SAMPLE_EVERY: Duration = Duration::from_millis(100);

/// How often the balancer's view is read.
const LB_EVERY: Duration = Duration::from_millis(250);

/// How long one `/readyz` may take before the sample says "no answer".
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// One reading of one replica's `/readyz`.
#[derive(Clone, Debug, Serialize)]
pub struct Sample {
    /// Since the phase's traffic started.
    #[serde(with = "crate::report::millis")]
    pub at: Duration,
    /// The status, or `None` if it did not answer in time.
    pub ready: Option<u16>,
    /// The `database` field.
    pub database: Option<String>,
}

impl Sample {
    fn says_down(&self) -> bool {
        self.database.as_deref() == Some("down")
    }
}

/// Everything watched during one phase.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Timeline {
    /// Per replica, in replica order.
    pub replicas: Vec<Vec<Sample>>,
    /// The balancer's servers that were UP, with when it was read.
    pub lb_up: Vec<(f64, usize)>,
}

impl Timeline {
    /// Whether `replica`'s breaker was open from `from` to `to`: the
    /// readings around that stretch, and any inside it, say "down".
    pub fn breaker_open(&self, replica: usize, from: Duration, to: Duration) -> bool {
        let Some(samples) = self.replicas.get(replica) else {
            return false;
        };
        let before = samples.iter().rev().find(|s| s.at <= from);
        let after = samples.iter().find(|s| s.at >= to);
        let (Some(before), Some(after)) = (before, after) else {
            return false;
        };
        samples
            .iter()
            .filter(|s| s.at >= before.at && s.at <= after.at)
            .all(Sample::says_down)
    }

    /// Per replica: readings that were not 200 (no answer included).
    pub fn not_ready(&self) -> Vec<usize> {
        self.replicas
            .iter()
            .map(|samples| samples.iter().filter(|s| s.ready != Some(200)).count())
            .collect()
    }

    /// Per replica: readings taken.
    pub fn readings(&self) -> Vec<usize> {
        self.replicas.iter().map(Vec::len).collect()
    }

    /// Per replica: how long it reported the database down, in seconds
    /// (from each "down" reading to the next reading).
    pub fn down_seconds(&self) -> Vec<f64> {
        self.replicas
            .iter()
            .map(|samples| {
                samples
                    .windows(2)
                    .filter(|pair| pair[0].says_down())
                    .fold(0.0, |sum, pair| {
                        sum + (pair[1].at - pair[0].at).as_secs_f64()
                    })
            })
            .collect()
    }

    /// The fewest servers the balancer had UP at any reading.
    pub fn lb_min_up(&self) -> Option<usize> {
        self.lb_up.iter().map(|(_, up)| *up).min()
    }
}

/// Reads every replica's `/readyz` every [`SAMPLE_EVERY`] (a task each,
/// so a replica slow to answer delays no other's readings) and the
/// balancer's `slots` every [`LB_EVERY`], until `stop` turns true.
pub async fn watch(
    admins: &[SocketAddr],
    lb: &Haproxy,
    slots: &[usize],
    origin: Instant,
    mut stop: watch::Receiver<bool>,
) -> Timeline {
    let readers: Vec<_> = admins
        .iter()
        .map(|admin| tokio::spawn(read_until(*admin, origin, stop.clone())))
        .collect();
    let mut lb_up = Vec::new();
    let mut ticker = tokio::time::interval(LB_EVERY);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while !*stop.borrow() {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = stop.changed() => break,
        }
        let mut up = 0;
        for slot in slots {
            if lb
                .status(*slot)
                .await
                .is_ok_and(|status| status.iter().all(|s| haproxy::is_up(s)))
            {
                up += 1;
            }
        }
        lb_up.push((
            (origin.elapsed().as_secs_f64() * 1000.0).round() / 1000.0,
            up,
        ));
    }
    let mut replicas = Vec::with_capacity(readers.len());
    for reader in readers {
        replicas.push(reader.await.unwrap_or_default());
    }
    Timeline { replicas, lb_up }
}

/// One replica's readings until `stop` turns true.
async fn read_until(
    admin: SocketAddr,
    origin: Instant,
    mut stop: watch::Receiver<bool>,
) -> Vec<Sample> {
    let mut samples = Vec::new();
    let mut conn = None;
    let mut ticker = tokio::time::interval(SAMPLE_EVERY);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while !*stop.borrow() {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = stop.changed() => break,
        }
        let (ready, database) = read(admin, &mut conn).await;
        samples.push(Sample {
            at: origin.elapsed(),
            ready,
            database,
        });
    }
    samples
}

/// One `/readyz` on `conn` (opened if needed): its status and `database`
/// field, or `None`s if it did not answer within [`PROBE_TIMEOUT`].
async fn read(admin: SocketAddr, conn: &mut Option<RawConn>) -> (Option<u16>, Option<String>) {
    let exchange = async {
        if conn.is_none() {
            *conn = Some(RawConn::connect(admin).await?);
        }
        let current = conn
            .as_mut()
            .ok_or_else(|| std::io::Error::other("no connection"))?;
        current.exchange_body(&raw::get("/readyz")).await
    };
    match tokio::time::timeout(PROBE_TIMEOUT, exchange).await {
        Ok(Ok((head, body))) => {
            if head.close {
                *conn = None;
            }
            let database = serde_json::from_slice::<serde_json::Value>(&body)
                .ok()
                .and_then(|json| json["database"].as_str().map(str::to_owned));
            (Some(head.status), database)
        }
        _ => {
            *conn = None;
            (None, None)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(at_ms: u64, database: &str) -> Sample {
        Sample {
            at: Duration::from_millis(at_ms),
            ready: Some(200),
            database: Some(database.to_owned()),
        }
    }

    #[test]
    fn the_breaker_was_open_only_where_every_reading_around_says_down() {
        let timeline = Timeline {
            replicas: vec![vec![
                sample(0, "up"),
                sample(100, "down"),
                sample(200, "down"),
                sample(300, "down"),
                sample(400, "up"),
            ]],
            lb_up: Vec::new(),
        };
        let ms = Duration::from_millis;
        assert!(timeline.breaker_open(0, ms(150), ms(160)));
        assert!(timeline.breaker_open(0, ms(100), ms(300)));
        assert!(!timeline.breaker_open(0, ms(50), ms(150)), "up before");
        assert!(!timeline.breaker_open(0, ms(350), ms(360)), "up after");
        assert!(
            !timeline.breaker_open(0, ms(450), ms(460)),
            "no reading after"
        );
        assert!(
            !timeline.breaker_open(1, ms(150), ms(160)),
            "no such replica"
        );
        assert!((timeline.down_seconds()[0] - 0.3).abs() < 1e-9);
        assert_eq!(timeline.not_ready(), vec![0]);
    }
}
