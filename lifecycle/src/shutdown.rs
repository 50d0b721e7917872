//! The shutdown timeline and the handles on it, one type per role.
//!
//! - [`Shutdown`] owns the timeline. The server loop drives it with it:
//!   start the drain, fire request tokens at the deadline, abandon what is
//!   left. It is not `Clone`: there is one owner.
//! - [`Trigger`] starts the shutdown (the first signal, an upgrade that
//!   handed over, a failing critical worker).
//! - [`Force`] forces it (the second signal): everything still running is
//!   abandoned at once and state is saved without a round trip.
//! - [`Watch`] can only look and wait: readiness, request scopes, workers.
//!
//! "The deadline passed" and "a second signal arrived" are two different
//! events on two different tokens: the first abandons requests and nothing
//! else, the second abandons everything.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::time::Instant;

use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};
use tokio_util::task::TaskTracker;

use crate::{LifecycleMetrics, LOG_TARGET};

/// Where the process stands on the shutdown timeline.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
pub enum Phase {
    /// Serving normally; ready.
    Running = 0,
    /// Signalled: not ready, still accepting, asking clients to go away.
    LameDuck = 1,
    /// Listener closed; waiting for in-flight requests.
    Draining = 2,
    /// Requests are done; workers stop and finalizers run.
    Finalizing = 3,
    /// Nothing is left to run.
    Stopped = 4,
}

impl Phase {
    /// Every phase, in timeline order.
    pub const ALL: [Phase; 5] = [
        Phase::Running,
        Phase::LameDuck,
        Phase::Draining,
        Phase::Finalizing,
        Phase::Stopped,
    ];

    /// The phase's name as it appears in logs and metrics.
    pub fn as_str(self) -> &'static str {
        ["running", "lame_duck", "draining", "finalizing", "stopped"][self as usize]
    }
}

/// Work that was running when the process gave up on it.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Abandoned {
    pub(crate) requests: i64,
    pub(crate) connections: i64,
}

#[derive(Debug, Default)]
struct Timeline {
    /// Cancelled by the first trigger: readiness turns false and the lame
    /// duck period begins. Never un-cancelled.
    triggered: CancellationToken,
    /// Cancelled when the listener has closed and every connection must be
    /// told to shut down gracefully.
    draining: CancellationToken,
    /// Parent of every request's cancellation token: cancelled at the
    /// shutdown deadline or when shutdown is forced, so handlers clean up.
    requests: CancellationToken,
    /// Cancelled when the connections still open must be dropped: after the
    /// deadline's cleanup grace, or at once on a forced shutdown. Requests
    /// only: workers and finalizers never watch it.
    abandon: CancellationToken,
    /// Cancelled by [`Force::force`] alone (a second signal): workers and
    /// finalizers are abandoned and state is saved at once.
    forced: CancellationToken,
    /// Why shutdown was forced; set once, by the first call to `force`.
    force_reason: OnceLock<String>,
    /// What was still running when the process gave up on it; taken just
    /// before `abandon` is cancelled, since the count drops right after.
    abandoned: OnceLock<Abandoned>,
    /// Why shutdown started, and the shortest lame-duck period it asks for
    /// whatever the configured drain delay (an in-place upgrade asks for
    /// one); set once, by the first trigger.
    reason: OnceLock<(String, Duration, Instant)>,
    /// Tracks every connection task and every piece of request work spawned
    /// through a `RequestScope`; the drain waits on it.
    tracker: TaskTracker,
    metrics: LifecycleMetrics,
}

// === impl Shutdown ===

/// The owner of the shutdown timeline: the one who drives the drain.
///
/// It hands out the role handles ([`Shutdown::watch`],
/// [`Shutdown::trigger_handle`], [`Shutdown::force_handle`]) and keeps to
/// itself what only the server loop may do: start the drain, cancel the
/// requests at the deadline, abandon the connections left.
#[derive(Debug)]
pub struct Shutdown {
    watch: Watch,
}

impl Default for Shutdown {
    fn default() -> Self {
        Shutdown::new()
    }
}

impl Shutdown {
    /// A fresh timeline in the `Running` phase.
    pub fn new() -> Shutdown {
        Shutdown {
            watch: Watch {
                timeline: Arc::default(),
            },
        }
    }

    /// A handle that can only watch the timeline.
    pub fn watch(&self) -> &Watch {
        &self.watch
    }

    /// A handle that can start the shutdown.
    pub fn trigger_handle(&self) -> Trigger {
        Trigger {
            timeline: Arc::clone(&self.watch.timeline),
        }
    }

    /// A handle that can force the shutdown: give it to whatever turns a
    /// second signal into an immediate exit, and to nothing else.
    pub fn force_handle(&self) -> Force {
        Force {
            timeline: Arc::clone(&self.watch.timeline),
        }
    }

    /// Moves the timeline forward to `phase`; it never moves back.
    pub fn set_phase(&self, phase: Phase) {
        self.watch.metrics().advance_phase(phase);
    }

    pub(crate) fn start_draining(&self) {
        self.set_phase(Phase::Draining);
        self.watch.timeline.draining.cancel();
    }

    /// Fires every request's token: the deadline has passed. What
    /// [`serve`](crate::serve) does when the shutdown timeout runs out; a
    /// server loop of your own calls it at its deadline. Workers and
    /// finalizers are not affected, and requests that start afterwards are
    /// born cancelled.
    pub fn cancel_requests(&self) {
        self.watch.timeline.requests.cancel();
    }

    /// Drops every remaining connection, and remembers how much work that
    /// was. Does not force the shutdown: workers and finalizers still run.
    pub(crate) fn abandon_requests(&self) {
        self.watch.timeline.abandon();
    }
}

impl Timeline {
    fn abandon(&self) {
        let _ = self.abandoned.set(Abandoned {
            requests: self.metrics.requests_in_flight(),
            connections: self.metrics.open_connections(),
        });
        self.abandon.cancel();
    }

    fn trigger(&self, reason: String, lame_duck: Duration) -> bool {
        let now = Instant::now();
        if self.reason.set((reason.clone(), lame_duck, now)).is_err() {
            return false;
        }
        tracing::info!(target: LOG_TARGET, %reason, "shutdown started: readiness is now false");
        self.metrics.advance_phase(Phase::LameDuck);
        self.triggered.cancel();
        true
    }
}

// === impl Trigger ===

/// Starts the shutdown timeline; cannot force it.
#[derive(Clone, Debug)]
pub struct Trigger {
    timeline: Arc<Timeline>,
}

impl Trigger {
    /// Starts the shutdown timeline. Only the first trigger counts; it
    /// returns `true` for that call.
    pub fn trigger(&self, reason: impl Into<String>) -> bool {
        self.timeline.trigger(reason.into(), Duration::ZERO)
    }

    /// Like [`Trigger::trigger`], with a lame-duck period of at least
    /// `lame_duck` even if the configured drain delay is shorter: keep-alive
    /// clients then get `Connection: close` (or GOAWAY) on their next request
    /// and move to a new connection before idle ones are closed.
    pub fn trigger_with_lame_duck(&self, reason: impl Into<String>, lame_duck: Duration) -> bool {
        self.timeline.trigger(reason.into(), lame_duck)
    }
}

// === impl Force ===

/// Forces the shutdown: what a second signal does.
#[derive(Clone, Debug)]
pub struct Force {
    timeline: Arc<Timeline>,
}

impl Force {
    /// Abandons everything still running: request tokens fire, every
    /// connection is dropped, workers and finalizers are abandoned and the
    /// force hooks save state. Implies a trigger.
    pub fn force(&self, reason: impl Into<String>) {
        let timeline = &*self.timeline;
        let reason = reason.into();
        timeline.trigger(reason.clone(), Duration::ZERO);
        if timeline.force_reason.set(reason.clone()).is_ok() {
            tracing::warn!(target: LOG_TARGET, %reason, "shutdown forced: abandoning all remaining work");
        }
        timeline.requests.cancel();
        timeline.abandon();
        timeline.forced.cancel();
    }
}

// === impl Watch ===

/// Watches the shutdown timeline: it can look and wait, never trigger,
/// force or abandon. Cloning is cheap; all clones see the same timeline.
#[derive(Clone, Debug)]
pub struct Watch {
    timeline: Arc<Timeline>,
}

impl Watch {
    /// `true` once shutdown has started; readiness is the negation of this.
    pub fn is_triggered(&self) -> bool {
        // The reason is set first thing: an atomic load, where asking the
        // token locks it (every request asks, from every thread).
        self.timeline.reason.get().is_some()
    }

    /// Resolves once shutdown has started.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping and re-creating the future loses nothing.
    pub fn triggered(&self) -> WaitForCancellationFuture<'_> {
        self.timeline.triggered.cancelled()
    }

    /// Resolves when the drain starts (the listener has closed). Long-lived
    /// responses — streams, websockets — should say goodbye and end now;
    /// the connections they hold are otherwise cut at the deadline.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub fn draining(&self) -> WaitForCancellationFuture<'_> {
        self.timeline.draining.cancelled()
    }

    /// `true` once shutdown has been forced (a second signal). A passed
    /// deadline is not a forced shutdown.
    pub fn is_forced(&self) -> bool {
        self.timeline.forced.is_cancelled()
    }

    /// Resolves once shutdown has been forced (a second signal); never on
    /// a passed deadline.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub fn forced(&self) -> WaitForCancellationFuture<'_> {
        self.timeline.forced.cancelled()
    }

    /// Why shutdown started, if it has.
    pub fn reason(&self) -> Option<&str> {
        self.timeline
            .reason
            .get()
            .map(|(reason, _, _)| reason.as_str())
    }

    /// Why shutdown was forced, if it was.
    pub fn force_reason(&self) -> Option<&str> {
        self.timeline.force_reason.get().map(String::as_str)
    }

    /// The current phase.
    pub fn phase(&self) -> Phase {
        self.timeline.metrics.phase()
    }

    /// The phase a response made now is made in: `LameDuck` from the
    /// trigger on (its reason is set a moment before the phase moves).
    pub(crate) fn answering_in(&self) -> Phase {
        let triggered = self.is_triggered().then_some(Phase::LameDuck);
        self.phase().max(triggered.unwrap_or(Phase::Running))
    }

    /// The tracker that the drain waits on. Work spawned on it delays the
    /// drain until it finishes (or the deadline abandons it).
    pub fn tracker(&self) -> &TaskTracker {
        &self.timeline.tracker
    }

    /// The lifecycle's metrics.
    pub fn metrics(&self) -> &LifecycleMetrics {
        &self.timeline.metrics
    }

    /// The shortest lame-duck period the trigger asked for.
    pub(crate) fn min_lame_duck(&self) -> Duration {
        self.timeline
            .reason
            .get()
            .map_or(Duration::ZERO, |(_, d, _)| *d)
    }

    /// When shutdown started, if it has.
    pub(crate) fn triggered_at(&self) -> Option<Instant> {
        self.timeline.reason.get().map(|(_, _, at)| *at)
    }

    /// A new cancellation token for one request: it fires at the shutdown
    /// deadline, on a forced shutdown, or when cancelled by its own guard.
    pub(crate) fn request_token(&self) -> CancellationToken {
        self.timeline.requests.child_token()
    }

    /// What was abandoned, if anything was.
    pub(crate) fn abandoned_work(&self) -> Option<Abandoned> {
        self.timeline.abandoned.get().copied()
    }

    /// Resolves when the connections still open must be dropped (after the
    /// deadline's grace, or on a forced shutdown): from then on, a request
    /// that ends unanswered was given up by the server, not by its client.
    pub fn abandoned(&self) -> WaitForCancellationFuture<'_> {
        self.timeline.abandon.cancelled()
    }

    /// `true` once [`Watch::abandoned`] has resolved, and already while the
    /// connections it drops are being dropped: what ends then can ask.
    pub fn is_abandoned(&self) -> bool {
        self.timeline.abandon.is_cancelled()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_first_trigger_counts_and_phases_never_move_back() {
        let shutdown = Shutdown::new();
        let trigger = shutdown.trigger_handle();
        let watch = shutdown.watch();
        assert_eq!(watch.phase(), Phase::Running);
        assert!(trigger.trigger("SIGTERM"));
        assert!(!trigger.trigger("SIGINT"));
        assert_eq!(watch.reason(), Some("SIGTERM"));
        assert_eq!(watch.phase(), Phase::LameDuck);
        shutdown.set_phase(Phase::Finalizing);
        shutdown.set_phase(Phase::Draining);
        assert_eq!(watch.phase(), Phase::Finalizing);
    }

    #[test]
    fn force_implies_trigger_and_fires_request_tokens() {
        let shutdown = Shutdown::new();
        let token = shutdown.watch().request_token();
        shutdown.force_handle().force("second SIGTERM");
        let watch = shutdown.watch();
        assert!(watch.is_triggered());
        assert!(watch.is_forced());
        assert!(watch.is_abandoned());
        assert!(token.is_cancelled());
        assert_eq!(watch.reason(), Some("second SIGTERM"));
        assert_eq!(watch.force_reason(), Some("second SIGTERM"));
    }

    // The bug this split fixes: the deadline used to cancel the token that
    // `forced()` returned, so workers took a passed deadline for a second
    // signal and skipped the final flush.
    #[test]
    fn the_deadline_abandons_requests_but_is_not_a_forced_shutdown() {
        let shutdown = Shutdown::new();
        let token = shutdown.watch().request_token();
        shutdown.trigger_handle().trigger("SIGTERM");
        shutdown.cancel_requests();
        assert!(!shutdown.watch().is_abandoned());
        shutdown.abandon_requests();
        let watch = shutdown.watch();
        assert!(watch.is_abandoned());
        assert!(token.is_cancelled());
        assert!(watch.abandoned_work().is_some());
        assert!(!watch.is_forced());
        assert!(!watch.timeline.forced.is_cancelled());
    }
}
