//! Background workers and finalizers, stopped in a defined order after the
//! request drain: notify every worker, wait for the critical ones, then run
//! the finalizers in reverse registration order, each within its budget.
//!
//! Only a forced shutdown (a second signal) cuts this short; a passed drain
//! deadline does not. When it is forced, whatever has not finished is
//! abandoned and the force hooks run synchronously instead: the last chance
//! to save in-memory state before the process exits.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;
use tracing::{error, info, warn};

use crate::{panic_message, Shutdown, Trigger, Watch, LOG_TARGET};

/// The error a worker or finalizer returns.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

type BoxFuture = std::pin::Pin<Box<dyn Future<Output = Result<(), BoxError>> + Send>>;

/// A critical worker: its name, its budget to stop, its supervising task.
type CriticalWorker = (&'static str, Duration, JoinHandle<Outcome>);

/// A finalizer: its name, its budget, and what starts it.
type Finalizer = (
    &'static str,
    Duration,
    Box<dyn FnOnce() -> BoxFuture + Send>,
);

/// How a worker or finalizer ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// It finished on its own terms.
    Done,
    /// It returned an error (logged once, where it happened).
    Failed(String),
    /// It panicked.
    Panicked(String),
    /// It overran its budget and was abandoned.
    Abandoned,
    /// It was not run: shutdown was forced first.
    Skipped,
}

/// What a force hook runs: synchronous, no I/O round trips, bounded.
type ForceHook = Box<dyn FnOnce() -> Result<(), BoxError> + Send>;

impl Outcome {
    /// `true` for `Done`.
    pub fn is_done(&self) -> bool {
        *self == Outcome::Done
    }

    fn label(&self) -> &'static str {
        match self {
            Outcome::Done => "done",
            Outcome::Failed(_) => "failed",
            Outcome::Panicked(_) => "panicked",
            Outcome::Abandoned => "abandoned",
            Outcome::Skipped => "skipped",
        }
    }
}

/// One line of the stop report.
#[derive(Clone, Debug)]
pub struct Stopped {
    /// The registered name.
    pub name: &'static str,
    /// `"worker"`, `"finalizer"` or `"force hook"`.
    pub kind: &'static str,
    /// How it ended.
    pub outcome: Outcome,
    /// How long it took to stop (workers) or to run (finalizers).
    pub took: Duration,
}

/// Where the in-memory state of one component went by the exit: read from
/// the component after its finalizer and force hook ran
/// ([`Workers::on_report`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Kept {
    /// The component's name.
    pub name: &'static str,
    /// Updates this process applied to the component's store.
    pub flushed: u64,
    /// Updates left on disk for the next start (or a replica sharing the
    /// directory) to apply: the store could not take them in time.
    pub spilled: u64,
    /// Updates kept nowhere: the process acknowledged them and they are
    /// gone.
    pub lost: u64,
}

/// What reads a component's [`Kept`] at the end of the stop.
type Tally = Box<dyn FnOnce() -> Kept + Send>;

/// What stopping the workers and running the finalizers did.
#[derive(Clone, Debug, Default)]
pub struct StopReport {
    /// Critical workers first, then finalizers in the order they ran, then
    /// the force hooks if the shutdown was forced.
    pub stopped: Vec<Stopped>,
    /// A second signal forced the shutdown before everything had finished.
    pub forced: bool,
    /// Where each stateful component's updates went, in registration order.
    pub kept: Vec<Kept>,
}

impl StopReport {
    /// `true` if a critical worker failed or panicked, before or during
    /// shutdown.
    pub fn worker_failed(&self) -> bool {
        self.stopped.iter().any(|s| {
            s.kind == "worker" && matches!(s.outcome, Outcome::Failed(_) | Outcome::Panicked(_))
        })
    }

    /// `true` if a finalizer failed, panicked or overran its budget, or a
    /// force hook failed. A finalizer cut short by a forced shutdown does
    /// not count: the force hooks run in its place.
    pub fn finalizer_failed(&self) -> bool {
        self.stopped.iter().any(|s| match s.kind {
            "finalizer" if self.forced => {
                matches!(s.outcome, Outcome::Failed(_) | Outcome::Panicked(_))
            }
            "finalizer" | "force hook" => !matches!(s.outcome, Outcome::Done | Outcome::Skipped),
            _ => false,
        })
    }

    /// `true` if any component lost an update it had acknowledged.
    pub fn state_lost(&self) -> bool {
        self.kept.iter().any(|kept| kept.lost > 0)
    }

    /// `true` if any component left updates on disk for the next start.
    pub fn state_spilled(&self) -> bool {
        self.kept.iter().any(|kept| kept.spilled > 0)
    }

    /// The tally of the component registered as `name`, if any.
    pub fn kept(&self, name: &str) -> Option<&Kept> {
        self.kept.iter().find(|kept| kept.name == name)
    }

    /// `name=outcome(ms)` for each entry, for the exit summary line.
    pub fn summary(&self) -> String {
        self.stopped
            .iter()
            .map(|s| {
                let took = s.took.as_millis();
                format!("{}:{}={}({took}ms)", s.kind, s.name, s.outcome.label())
            })
            .collect::<Vec<_>>()
            .join(" ")
    }

    fn record(&mut self, name: &'static str, kind: &'static str, outcome: Outcome, took: Duration) {
        self.stopped.push(Stopped {
            name,
            kind,
            outcome,
            took,
        });
    }
}

/// The registry of background workers and finalizers.
///
/// - A *critical* worker is waited for at shutdown (up to its budget); if it
///   fails or panics at any time, it starts a whole-process shutdown.
/// - A *background* worker is cancelled as soon as the drain starts and is
///   never waited for.
/// - A *finalizer* runs once, after the drain and after the workers have
///   stopped, in reverse registration order, within its own budget.
/// - A *force hook* runs only when the shutdown is forced, synchronously,
///   after the workers and finalizers were abandoned: it saves what they
///   would have saved, without a round trip (a spill to local disk).
pub struct Workers {
    /// Only looks: workers are never the ones to force or abandon.
    watch: Watch,
    /// A failing critical worker starts the shutdown through this.
    trigger: Trigger,
    critical_token: CancellationToken,
    background_token: CancellationToken,
    critical: Vec<CriticalWorker>,
    finalizers: Vec<Finalizer>,
    force_hooks: Vec<(&'static str, ForceHook)>,
    tallies: Vec<Tally>,
}

impl std::fmt::Debug for Workers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let critical: Vec<_> = self.critical.iter().map(|(name, ..)| name).collect();
        let finalizers: Vec<_> = self.finalizers.iter().map(|(name, ..)| name).collect();
        f.debug_struct("Workers")
            .field("critical", &critical)
            .field("finalizers", &finalizers)
            .finish_non_exhaustive()
    }
}

impl Workers {
    /// An empty registry on `shutdown`'s timeline.
    pub fn new(shutdown: &Shutdown) -> Workers {
        Workers {
            watch: shutdown.watch().clone(),
            trigger: shutdown.trigger_handle(),
            critical_token: CancellationToken::new(),
            background_token: CancellationToken::new(),
            critical: Vec::new(),
            finalizers: Vec::new(),
            force_hooks: Vec::new(),
            tallies: Vec::new(),
        }
    }

    /// Spawns a critical worker. Its token fires after the request drain;
    /// it then has `budget` to return. An error or panic, at any time, is
    /// logged once and starts a whole-process shutdown.
    pub fn spawn_critical<F, Fut>(&mut self, name: &'static str, budget: Duration, work: F)
    where
        F: FnOnce(CancellationToken) -> Fut,
        Fut: Future<Output = Result<(), BoxError>> + Send + 'static,
    {
        let work = work(self.critical_token.child_token());
        let trigger = self.trigger.clone();
        let handle = tokio::spawn(async move {
            let outcome = run_caught(work).await;
            if !outcome.is_done() {
                error!(target: LOG_TARGET, worker = name, ?outcome, "critical worker failed; shutting down");
                trigger.trigger(format!("critical worker {name} failed"));
            }
            outcome
        });
        self.critical.push((name, budget, handle));
    }

    /// Spawns a background worker: cancelled when the drain starts, never
    /// waited for. Its failure is logged and nothing more.
    pub fn spawn_background<F, Fut>(&mut self, name: &'static str, work: F)
    where
        F: FnOnce(CancellationToken) -> Fut,
        Fut: Future<Output = Result<(), BoxError>> + Send + 'static,
    {
        let token = self.background_token.child_token();
        let work = work(token.clone());
        let watch = self.watch.clone();
        tokio::spawn(async move {
            let mut running = std::pin::pin!(run_caught(work));
            // Background work is cut as soon as the drain begins.
            let outcome = tokio::select! {
                outcome = &mut running => outcome,
                () = async { tokio::select! {
                    () = watch.draining() => {}
                    () = watch.forced() => {}
                } } => {
                    token.cancel();
                    running.await
                }
            };
            if !outcome.is_done() {
                warn!(target: LOG_TARGET, worker = name, ?outcome, "background worker failed");
            }
        });
    }

    /// Registers a finalizer. Finalizers run after the drain and after the
    /// workers stop, last registered first; one that overruns `budget` is
    /// abandoned.
    pub fn on_shutdown<F, Fut>(&mut self, name: &'static str, budget: Duration, finalize: F)
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = Result<(), BoxError>> + Send + 'static,
    {
        let run: Box<dyn FnOnce() -> BoxFuture + Send> = Box::new(move || Box::pin(finalize()));
        self.finalizers.push((name, budget, run));
    }

    /// Registers a force hook: run only if the shutdown is forced, after
    /// the workers and finalizers were abandoned, last registered first. It
    /// must be synchronous and quick (no network, no database): the process
    /// exits right after it. A hook that fails is reported as a failed
    /// finalizer.
    pub fn on_force<F>(&mut self, name: &'static str, hook: F)
    where
        F: FnOnce() -> Result<(), BoxError> + Send + 'static,
    {
        self.force_hooks.push((name, Box::new(hook)));
    }

    /// Registers what reads where a stateful component's updates went,
    /// once its finalizer and force hook have run; the stop report carries
    /// it ([`StopReport::kept`]), and an exit code can say "state lost" or
    /// "state spilled" from it.
    pub fn on_report<F>(&mut self, tally: F)
    where
        F: FnOnce() -> Kept + Send + 'static,
    {
        self.tallies.push(Box::new(tally));
    }

    /// The longest [`Workers::stop`] can take: the slowest critical worker's
    /// budget plus every finalizer's.
    pub fn budget(&self) -> Duration {
        let slowest = self.critical.iter().map(|(_, budget, _)| *budget).max();
        let finalizers = self.finalizers.iter().map(|(_, budget, _)| *budget);
        slowest.unwrap_or_default() + finalizers.sum::<Duration>()
    }

    /// Stops everything, in order: background workers are already cancelled;
    /// critical workers are cancelled and waited for (each up to its budget);
    /// then finalizers run in reverse registration order. A forced shutdown
    /// abandons whatever is running, skips whatever has not started, and
    /// runs the force hooks.
    pub async fn stop(self) -> StopReport {
        let mut report = StopReport::default();
        let watch = &self.watch;
        self.background_token.cancel();
        self.critical_token.cancel();

        let started = Instant::now();
        for (name, budget, mut handle) in self.critical {
            let outcome = tokio::select! {
                joined = tokio::time::timeout_at(started + budget, &mut handle) => match joined {
                    Ok(joined) => joined.unwrap_or_else(|join_error| Outcome::Panicked(join_error.to_string())),
                    Err(_elapsed) => {
                        warn!(target: LOG_TARGET, worker = name, ?budget, "worker did not stop within its budget; abandoned");
                        Outcome::Abandoned
                    }
                },
                () = watch.forced() => Outcome::Abandoned,
            };
            // Nothing to abort if it finished.
            handle.abort();
            report.record(name, "worker", outcome, started.elapsed());
        }

        for (name, budget, run) in self.finalizers.into_iter().rev() {
            let started = Instant::now();
            let outcome = if watch.is_forced() {
                Outcome::Skipped
            } else {
                info!(target: LOG_TARGET, finalizer = name, ?budget, "finalizer started");
                tokio::select! {
                    finished = tokio::time::timeout(budget, run_caught(run())) => finished.unwrap_or_else(|_elapsed| {
                        warn!(target: LOG_TARGET, finalizer = name, ?budget, "finalizer overran its budget; abandoned");
                        Outcome::Abandoned
                    }),
                    () = watch.forced() => Outcome::Abandoned,
                }
            };
            if let Outcome::Failed(error) | Outcome::Panicked(error) = &outcome {
                error!(target: LOG_TARGET, finalizer = name, %error, "finalizer failed");
            }
            info!(target: LOG_TARGET, finalizer = name, outcome = outcome.label(), took = ?started.elapsed(), "finalizer finished");
            report.record(name, "finalizer", outcome, started.elapsed());
        }

        report.forced = watch.is_forced();
        if report.forced {
            run_force_hooks(self.force_hooks, &mut report);
        }
        report.kept = self.tallies.into_iter().map(|tally| tally()).collect();
        report
    }
}

/// Runs the force hooks, last registered first, each caught.
fn run_force_hooks(hooks: Vec<(&'static str, ForceHook)>, report: &mut StopReport) {
    for (name, hook) in hooks.into_iter().rev() {
        let started = Instant::now();
        let outcome = match std::panic::catch_unwind(AssertUnwindSafe(hook)) {
            Ok(Ok(())) => Outcome::Done,
            Ok(Err(error)) => Outcome::Failed(error.to_string()),
            Err(panic) => Outcome::Panicked(panic_message(&*panic)),
        };
        if let Outcome::Failed(error) | Outcome::Panicked(error) = &outcome {
            error!(target: LOG_TARGET, hook = name, %error, "force hook failed");
        }
        info!(target: LOG_TARGET, hook = name, outcome = outcome.label(), took = ?started.elapsed(), "force hook finished");
        report.record(name, "force hook", outcome, started.elapsed());
    }
}

/// Runs `work` on its own task, turning an error or a panic into an
/// [`Outcome`]. Dropping the future aborts the task.
async fn run_caught<Fut>(work: Fut) -> Outcome
where
    Fut: Future<Output = Result<(), BoxError>> + Send + 'static,
{
    match AbortOnDropHandle::new(tokio::spawn(work)).await {
        Ok(Ok(())) => Outcome::Done,
        Ok(Err(error)) => Outcome::Failed(error.to_string()),
        Err(failed) if failed.is_panic() => Outcome::Panicked(panic_message(&*failed.into_panic())),
        Err(_cancelled) => Outcome::Abandoned,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    fn shutdown() -> Shutdown {
        Shutdown::new()
    }

    #[tokio::test(start_paused = true)]
    async fn finalizers_run_in_reverse_registration_order() {
        let mut workers = Workers::new(&shutdown());
        let order = Arc::new(Mutex::new(Vec::new()));
        for name in ["first", "second", "third"] {
            let order = Arc::clone(&order);
            workers.on_shutdown(name, Duration::from_secs(1), move || async move {
                order.lock().expect("lock").push(name);
                Ok(())
            });
        }
        let report = workers.stop().await;
        assert_eq!(*order.lock().expect("lock"), ["third", "second", "first"]);
        assert!(!report.finalizer_failed());
    }

    #[tokio::test(start_paused = true)]
    async fn an_overrunning_finalizer_is_abandoned_at_its_budget_and_the_rest_still_run() {
        let mut workers = Workers::new(&shutdown());
        let ran = Arc::new(Mutex::new(false));
        {
            let ran = Arc::clone(&ran);
            workers.on_shutdown(
                "registered first, runs last",
                Duration::from_secs(1),
                move || async move {
                    *ran.lock().expect("lock") = true;
                    Ok(())
                },
            );
        }
        workers.on_shutdown("stuck", Duration::from_secs(2), std::future::pending);
        let started = Instant::now();
        let report = workers.stop().await;
        assert_eq!(started.elapsed(), Duration::from_secs(2));
        assert_eq!(report.stopped[0].outcome, Outcome::Abandoned);
        assert!(report.finalizer_failed());
        assert!(*ran.lock().expect("lock"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_failing_critical_worker_triggers_shutdown_and_is_reported() {
        let shutdown = shutdown();
        let mut workers = Workers::new(&shutdown);
        workers.spawn_critical("doomed", Duration::from_secs(1), |_token| async {
            Err::<(), BoxError>("disk on fire".into())
        });
        shutdown.watch().triggered().await;
        assert_eq!(
            shutdown.watch().reason(),
            Some("critical worker doomed failed")
        );
        let report = workers.stop().await;
        assert!(report.worker_failed());
        assert_eq!(
            report.stopped[0].outcome,
            Outcome::Failed("disk on fire".to_owned())
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_panicking_critical_worker_is_caught_and_triggers_shutdown() {
        let shutdown = shutdown();
        let mut workers = Workers::new(&shutdown);
        workers.spawn_critical("panicky", Duration::from_secs(1), |_token| async {
            panic!("boom");
        });
        shutdown.watch().triggered().await;
        let report = workers.stop().await;
        assert_eq!(
            report.stopped[0].outcome,
            Outcome::Panicked("boom".to_owned())
        );
    }

    #[tokio::test(start_paused = true)]
    async fn critical_workers_are_waited_for_and_background_workers_are_not() {
        let shutdown = shutdown();
        let mut workers = Workers::new(&shutdown);
        let cleaned = Arc::new(Mutex::new(false));
        {
            let cleaned = Arc::clone(&cleaned);
            workers.spawn_critical(
                "careful",
                Duration::from_secs(10),
                move |token| async move {
                    token.cancelled().await;
                    tokio::time::sleep(Duration::from_secs(3)).await;
                    *cleaned.lock().expect("lock") = true;
                    Ok(())
                },
            );
        }
        // Ignores its token entirely: must not hold shutdown.
        workers.spawn_background("careless", |_token| std::future::pending());
        shutdown.trigger_handle().trigger("test");
        shutdown.start_draining();
        let started = Instant::now();
        let report = workers.stop().await;
        assert_eq!(started.elapsed(), Duration::from_secs(3));
        assert!(*cleaned.lock().expect("lock"));
        assert_eq!(report.stopped.len(), 1);
    }

    // Gap: the deadline used to share the token of a forced shutdown, so
    // the final flush was skipped whenever a stalled request held the drain.
    #[tokio::test(start_paused = true)]
    async fn a_passed_deadline_still_stops_workers_and_runs_every_finalizer() {
        let shutdown = shutdown();
        let mut workers = Workers::new(&shutdown);
        let ran = Arc::new(Mutex::new(Vec::new()));
        for name in ["pool", "flush"] {
            let ran = Arc::clone(&ran);
            workers.on_shutdown(name, Duration::from_secs(1), move || async move {
                tokio::time::sleep(Duration::from_millis(10)).await;
                ran.lock().expect("lock").push(name);
                Ok(())
            });
        }
        workers.on_force("spill", || panic!("not forced: no force hook runs"));
        shutdown.trigger_handle().trigger("SIGTERM");
        shutdown.start_draining();
        shutdown.cancel_requests();
        shutdown.abandon_requests();
        let report = workers.stop().await;
        assert_eq!(*ran.lock().expect("lock"), ["flush", "pool"]);
        assert!(!report.forced);
        assert!(!report.finalizer_failed());
        assert!(report.stopped.iter().all(|s| s.outcome.is_done()));
    }

    // A second signal during a finalizer abandons it, skips the rest and
    // runs the force hooks (last registered first) before `stop` returns.
    #[tokio::test(start_paused = true)]
    async fn a_forced_shutdown_abandons_the_running_finalizer_and_runs_the_force_hooks() {
        let shutdown = shutdown();
        let mut workers = Workers::new(&shutdown);
        let order = Arc::new(Mutex::new(Vec::new()));
        workers.on_shutdown("never reached", Duration::from_secs(5), || async {
            panic!("skipped after a forced shutdown")
        });
        let (entered, started) = tokio::sync::oneshot::channel();
        workers.on_shutdown("slow flush", Duration::from_secs(5), move || async move {
            let _ = entered.send(());
            std::future::pending().await
        });
        for name in ["first", "second"] {
            let order = Arc::clone(&order);
            workers.on_force(name, move || {
                order.lock().expect("lock").push(name);
                Ok(())
            });
        }
        let force = shutdown.force_handle();
        let stopping = tokio::spawn(workers.stop());
        started.await.expect("the slow finalizer started");
        force.force("second signal (SIGTERM)");
        let report = stopping.await.expect("stop");
        assert!(report.forced);
        let outcomes: Vec<_> = report
            .stopped
            .iter()
            .map(|s| (s.name, s.outcome.clone()))
            .collect();
        assert_eq!(
            outcomes,
            [
                ("slow flush", Outcome::Abandoned),
                ("never reached", Outcome::Skipped),
                ("second", Outcome::Done),
                ("first", Outcome::Done),
            ]
        );
        assert_eq!(*order.lock().expect("lock"), ["second", "first"]);
        assert!(!report.finalizer_failed());
    }

    #[tokio::test(start_paused = true)]
    async fn a_failing_force_hook_is_a_failed_finalizer() {
        let shutdown = shutdown();
        let mut workers = Workers::new(&shutdown);
        workers.on_force("spill", || Err("read-only file system".into()));
        shutdown.force_handle().force("second signal (SIGINT)");
        let report = workers.stop().await;
        assert!(report.finalizer_failed());
    }
}
