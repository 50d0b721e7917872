//! The shutdown handle: one cheap, cloneable value that every part of the
//! process watches to learn where the shutdown timeline stands.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};
use tokio_util::task::TaskTracker;

use super::{LifecycleMetrics, LOG_TARGET};

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
        match self {
            Phase::Running => "running",
            Phase::LameDuck => "lame_duck",
            Phase::Draining => "draining",
            Phase::Finalizing => "finalizing",
            Phase::Stopped => "stopped",
        }
    }

    fn from_u8(value: u8) -> Phase {
        Phase::ALL
            .get(usize::from(value))
            .copied()
            .unwrap_or(Phase::Stopped)
    }
}

/// Work that was running when the process gave up on it.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Abandoned {
    pub(crate) requests: i64,
    pub(crate) connections: i64,
}

/// A handle on the shutdown timeline, shared by the signal handler, the
/// accept loop, every connection, every request and the application.
///
/// Cloning is cheap; all clones observe the same timeline.
#[derive(Clone, Debug, Default)]
pub struct Shutdown {
    inner: Arc<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// Cancelled by the first trigger: readiness turns false and the lame
    /// duck period begins. Never un-cancelled.
    triggered: CancellationToken,
    /// Cancelled when the listener has closed and every connection must be
    /// told to shut down gracefully.
    draining: CancellationToken,
    /// Parent of every request's cancellation token: cancelled at the
    /// shutdown deadline or when shutdown is forced, so handlers clean up.
    requests: CancellationToken,
    /// Cancelled when whatever is still running must be dropped: after the
    /// deadline's cleanup grace, or at once on a forced shutdown.
    abandon: CancellationToken,
    /// Set once, by the first call to `force`.
    forced: OnceLock<String>,
    /// What was still running when the process gave up on it; taken just
    /// before `abandon` is cancelled, since the count drops right after.
    abandoned: OnceLock<Abandoned>,
    /// Why shutdown started; set once, by the first call to `trigger`.
    reason: OnceLock<String>,
    /// The shortest lame-duck period this shutdown asks for, whatever the
    /// configured drain delay (an in-place upgrade asks for one).
    min_lame_duck: OnceLock<Duration>,
    phase: AtomicU8,
    /// Tracks every connection task and every piece of request work spawned
    /// through a `RequestScope`; the drain waits on it.
    tracker: TaskTracker,
    metrics: LifecycleMetrics,
}

impl Shutdown {
    /// A fresh timeline in the `Running` phase, recording into `metrics`.
    pub fn new(metrics: LifecycleMetrics) -> Shutdown {
        let shutdown = Shutdown {
            inner: Arc::new(Inner {
                metrics,
                ..Inner::default()
            }),
        };
        shutdown.inner.metrics.set_phase(Phase::Running);
        shutdown
    }

    /// Starts the shutdown timeline. Only the first call counts; it returns
    /// `true` for that call.
    pub fn trigger(&self, reason: impl Into<String>) -> bool {
        self.trigger_with_lame_duck(reason, Duration::ZERO)
    }

    /// Like [`Shutdown::trigger`], with a lame-duck period of at least
    /// `lame_duck` even if the configured drain delay is shorter: keep-alive
    /// clients then get `Connection: close` (or GOAWAY) on their next request
    /// and move to a new connection before idle ones are closed.
    pub fn trigger_with_lame_duck(&self, reason: impl Into<String>, lame_duck: Duration) -> bool {
        let reason = reason.into();
        let _ = self.inner.min_lame_duck.set(lame_duck);
        if self.inner.reason.set(reason.clone()).is_err() {
            return false;
        }
        tracing::info!(target: LOG_TARGET, %reason, "shutdown started: readiness is now false");
        self.set_phase(Phase::LameDuck);
        self.inner.triggered.cancel();
        true
    }

    /// Abandons everything still running: request tokens fire and every
    /// connection is dropped. Implies [`Shutdown::trigger`].
    pub fn force(&self, reason: impl Into<String>) {
        let reason = reason.into();
        self.trigger(reason.clone());
        if self.inner.forced.set(reason.clone()).is_ok() {
            tracing::warn!(target: LOG_TARGET, %reason, "shutdown forced: abandoning all remaining work");
        }
        self.inner.requests.cancel();
        self.abandon();
    }

    /// `true` once shutdown has started; readiness is the negation of this.
    pub fn is_triggered(&self) -> bool {
        self.inner.triggered.is_cancelled()
    }

    /// Resolves once shutdown has started.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping and re-creating the future loses nothing.
    pub fn triggered(&self) -> WaitForCancellationFuture<'_> {
        self.inner.triggered.cancelled()
    }

    /// `true` once shutdown has been forced by [`Shutdown::force`].
    pub fn is_forced(&self) -> bool {
        self.inner.forced.get().is_some()
    }

    /// Resolves once shutdown has been forced.
    pub fn forced(&self) -> WaitForCancellationFuture<'_> {
        self.inner.abandon.cancelled()
    }

    /// Why shutdown started, if it has.
    pub fn reason(&self) -> Option<&str> {
        self.inner.reason.get().map(String::as_str)
    }

    /// The shortest lame-duck period the trigger asked for.
    pub fn min_lame_duck(&self) -> Duration {
        self.inner.min_lame_duck.get().copied().unwrap_or_default()
    }

    /// The current phase.
    pub fn phase(&self) -> Phase {
        Phase::from_u8(self.inner.phase.load(Ordering::Acquire))
    }

    /// Moves the timeline forward to `phase`; it never moves back.
    pub fn set_phase(&self, phase: Phase) {
        let previous = self.inner.phase.fetch_max(phase as u8, Ordering::AcqRel);
        if previous < phase as u8 {
            self.inner.metrics.set_phase(phase);
        }
    }

    /// The tracker that the drain waits on. Work spawned on it delays the
    /// drain until it finishes (or the deadline abandons it).
    pub fn tracker(&self) -> &TaskTracker {
        &self.inner.tracker
    }

    /// The lifecycle's metrics.
    pub fn metrics(&self) -> &LifecycleMetrics {
        &self.inner.metrics
    }

    /// A new cancellation token for one request: it fires at the shutdown
    /// deadline, on a forced shutdown, or when cancelled by its own guard.
    pub(crate) fn request_token(&self) -> CancellationToken {
        self.inner.requests.child_token()
    }

    pub(crate) fn start_draining(&self) {
        self.set_phase(Phase::Draining);
        self.inner.draining.cancel();
    }

    /// Resolves when the drain starts (the listener has closed). Long-lived
    /// responses — streams, websockets — should say goodbye and end now;
    /// the connections they hold are otherwise cut at the deadline.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub fn draining(&self) -> WaitForCancellationFuture<'_> {
        self.inner.draining.cancelled()
    }

    /// Fires every request's token: the deadline has passed.
    pub(crate) fn cancel_requests(&self) {
        self.inner.requests.cancel();
    }

    /// Drops every remaining connection, without marking the shutdown
    /// forced, and remembers how much work that was.
    pub(crate) fn abandon(&self) {
        let metrics = &self.inner.metrics;
        let _ = self.inner.abandoned.set(Abandoned {
            requests: metrics.requests_in_flight(),
            connections: metrics.open_connections(),
        });
        self.inner.abandon.cancel();
    }

    /// What was abandoned, if anything was.
    pub(crate) fn abandoned_work(&self) -> Option<Abandoned> {
        self.inner.abandoned.get().copied()
    }

    pub(crate) fn abandoned(&self) -> WaitForCancellationFuture<'_> {
        self.inner.abandon.cancelled()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_first_trigger_counts_and_phases_never_move_back() {
        let shutdown = Shutdown::new(LifecycleMetrics::default());
        assert_eq!(shutdown.phase(), Phase::Running);
        assert!(shutdown.trigger("SIGTERM"));
        assert!(!shutdown.trigger("SIGINT"));
        assert_eq!(shutdown.reason(), Some("SIGTERM"));
        assert_eq!(shutdown.phase(), Phase::LameDuck);
        shutdown.set_phase(Phase::Finalizing);
        shutdown.set_phase(Phase::Draining);
        assert_eq!(shutdown.phase(), Phase::Finalizing);
    }

    #[test]
    fn force_implies_trigger_and_fires_request_tokens() {
        let shutdown = Shutdown::new(LifecycleMetrics::default());
        let token = shutdown.request_token();
        shutdown.force("second SIGTERM");
        assert!(shutdown.is_triggered());
        assert!(shutdown.is_forced());
        assert!(token.is_cancelled());
        assert_eq!(shutdown.reason(), Some("second SIGTERM"));
    }
}
