//! A run's traffic over time: started at an origin, steady for a while,
//! the scenario's own actions, steady again, and stopped, also when an
//! action fails.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::traffic::{self, Mix, Record, Targets};

/// Traffic that runs until it is stopped, and what it leaves then.
pub trait Stoppable {
    /// What the traffic leaves: its records and how long it ran.
    type Ran;

    /// Stops the traffic and collects what it measured.
    ///
    /// # Errors
    /// If the traffic's task failed.
    fn stop(self) -> impl Future<Output = anyhow::Result<Self::Ran>>;
}

/// Open-loop mixed traffic through the balancer ([`traffic::run`]).
pub struct Traffic {
    /// When it started: the zero of its records, marks and series.
    pub origin: Instant,
    stop: watch::Sender<bool>,
    task: JoinHandle<Vec<Record>>,
}

impl Traffic {
    /// Starts `mix` against `targets`, redirecting among `codes`, now.
    pub fn start(mix: Mix, targets: Targets, codes: Arc<[String]>) -> Traffic {
        let (stop, stopped) = watch::channel(false);
        let origin = Instant::now();
        let task = tokio::spawn(traffic::run(mix, targets, codes, origin, stopped));
        Traffic { origin, stop, task }
    }

    /// Turns true when the traffic is told to stop: for a watcher that
    /// runs as long as it does.
    pub fn stopped(&self) -> watch::Receiver<bool> {
        self.stop.subscribe()
    }
}

/// What the traffic measured.
#[derive(Debug)]
pub struct Ran {
    /// Every request, in the order they were due.
    pub records: Vec<Record>,
    /// Seconds from the origin until every request had ended.
    pub traffic_s: f64,
}

impl Stoppable for Traffic {
    type Ran = Ran;

    async fn stop(self) -> anyhow::Result<Ran> {
        let _ = self.stop.send(true);
        let records = self.task.await.context("the traffic task failed")?;
        Ok(Ran {
            records,
            traffic_s: self.origin.elapsed().as_secs_f64(),
        })
    }
}

/// How long the traffic runs steady before the scenario's actions and
/// after them.
#[derive(Clone, Copy, Debug)]
pub struct Steady {
    /// Before the first action.
    pub before: Duration,
    /// After the last.
    pub after: Duration,
}

impl Steady {
    /// As long before as after.
    pub fn around(steady: Duration) -> Steady {
        Steady {
            before: steady,
            after: steady,
        }
    }
}

/// Runs the phases of a scenario under `traffic`: `steady.before`, then
/// `actions`, then `steady.after` (skipped if an action failed), then stops
/// the traffic either way; returns what the actions and the traffic gave.
///
/// # Errors
/// An action's error, or the traffic's.
pub async fn phases<L: Stoppable, T>(
    traffic: L,
    steady: Steady,
    actions: impl Future<Output = anyhow::Result<T>>,
) -> anyhow::Result<(T, L::Ran)> {
    let outcome = async {
        tokio::time::sleep(steady.before).await;
        let done = actions.await?;
        tokio::time::sleep(steady.after).await;
        Ok::<_, anyhow::Error>(done)
    }
    .await;
    let ran = traffic.stop().await?;
    Ok((outcome?, ran))
}
