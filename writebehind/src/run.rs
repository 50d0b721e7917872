//! The component on the lifecycle's timeline: one call registers its
//! workers, its finalizer, its force hook and its tally.

use std::sync::Arc;

use lameduck_lifecycle::{BoxError, Workers, LOG_TARGET};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::config::FLUSHER_STOP_BUDGET;
use crate::merge::Merge;
use crate::replay::{ReplayError, Replayed};
use crate::sink::Sink;
use crate::{Key, Value, WriteBehind};

impl<K: Key, V: Value, M: Merge<V>> WriteBehind<K, V, M> {
    /// Puts the component on the lifecycle's timeline, with `sink` as its
    /// store:
    ///
    /// 1. now, before the service is ready: applies what earlier processes
    ///    left in the directory (spill files, the journals of processes
    ///    that died), so the store holds every update from before;
    /// 2. a critical worker, the flusher: applies what is pending every
    ///    flush interval, or sooner at the threshold;
    /// 3. a background worker, the replayer: applies what other replicas
    ///    sharing the directory leave there, every scan interval;
    /// 4. a finalizer, the final flush, after the last request: flushes
    ///    with retries, and spills what the sink cannot take in time;
    /// 5. a force hook, for a second signal: spills at once;
    /// 6. its tally in the stop report ([`StopReport::kept`](lameduck_lifecycle::StopReport::kept)).
    ///
    /// Finalizers run last registered first: register what the sink needs
    /// at exit (closing its pool) before this.
    ///
    /// # Errors
    /// What was left could not be applied (the sink refused it, a file
    /// cannot be read): the service should not start, or it would serve
    /// without the updates from before.
    pub async fn attach<S: Sink<K, V>>(
        &self,
        workers: &mut Workers,
        sink: S,
    ) -> Result<Replayed, ReplayError> {
        let sink = Arc::new(sink);
        let name = self.inner.config.name;
        let replayed = self.replay(&*sink).await?;
        log_replayed(name, replayed);
        workers.spawn_critical(label(name, "flusher"), FLUSHER_STOP_BUDGET, {
            let (state, sink) = (self.clone(), Arc::clone(&sink));
            move |token| run_flusher(state, sink, token)
        });
        workers.spawn_background(label(name, "replayer"), {
            let (state, sink) = (self.clone(), Arc::clone(&sink));
            move |token| run_replayer(state, sink, token)
        });
        workers.on_shutdown(
            label(name, "final flush"),
            self.config().final_flush_budget,
            {
                let state = self.clone();
                move || {
                    let flush = async move {
                        let outcome = state.final_flush(&*sink).await?;
                        tracing::info!(target: LOG_TARGET, state = name, ?outcome, "final flush");
                        Ok(())
                    };
                    flush.instrument(
                        tracing::info_span!(parent: None, "write-behind final flush", state = name),
                    )
                }
            },
        );
        workers.on_force(label(name, "spill"), {
            let state = self.clone();
            move || {
                state.spill_now()?;
                Ok(())
            }
        });
        let state = self.clone();
        workers.on_report(move || state.kept());
        Ok(replayed)
    }
}

/// `"<name> <what>"`, for the lifecycle's names, which live as long as the
/// process: made once per component, at start.
fn label(name: &str, what: &str) -> &'static str {
    Box::leak(format!("{name} {what}").into_boxed_str())
}

/// The flusher: flushes every interval, or sooner at the threshold, until
/// `token` fires, and keeps spare journal segments ready. A failed flush
/// keeps the updates pending for the next; the worker itself never fails
/// on the sink's outage.
async fn run_flusher<K: Key, V: Value, M: Merge<V>, S: Sink<K, V>>(
    state: WriteBehind<K, V, M>,
    sink: Arc<S>,
    token: CancellationToken,
) -> Result<(), BoxError> {
    let name = state.config().name;
    let mut ticker = tokio::time::interval(state.config().flush_interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    state.prepare_journal();
    ticker.tick().await;
    loop {
        tokio::select! {
            () = token.cancelled() => return Ok(()),
            _ = ticker.tick() => {}
            () = state.many_pending() => ticker.reset(),
        }
        // Fault injection for the ways-out tests: a critical worker that
        // panics (`FAILPOINTS=write-behind-flusher=panic`).
        #[cfg(feature = "failpoints")]
        fail::fail_point!("write-behind-flusher");
        if let Err(error) = state.flush(&*sink).await {
            tracing::warn!(state = name, %error, pending = state.pending(), "flush failed; the updates stay in memory and are retried");
        }
        state.prepare_journal();
    }
}

/// The replayer: applies what appears in the directory while the process
/// runs, every scan interval, until `token` fires. A failed replay (the
/// sink is down) is retried at the next scan.
async fn run_replayer<K: Key, V: Value, M: Merge<V>, S: Sink<K, V>>(
    state: WriteBehind<K, V, M>,
    sink: Arc<S>,
    token: CancellationToken,
) -> Result<(), BoxError> {
    let name = state.config().name;
    let mut ticker = tokio::time::interval(state.config().scan_interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticker.tick().await;
    while token.run_until_cancelled(ticker.tick()).await.is_some() {
        match state.replay(&*sink).await {
            Ok(replayed) => log_replayed(name, replayed),
            Err(error) => {
                tracing::warn!(state = name, error = %lameduck_lifecycle::error_chain(&error), "applying what was left failed; retrying at the next scan");
            }
        }
    }
    Ok(())
}

fn log_replayed(name: &str, replayed: Replayed) {
    if replayed.files > 0 {
        tracing::info!(
            state = name,
            files = replayed.files,
            batches = replayed.batches,
            records = replayed.records,
            already_applied = replayed.already_applied,
            torn = replayed.torn,
            "applied spilled {name}"
        );
    }
}
