//! A circuit breaker: when calls to a dependency keep failing, stop making
//! them and fail fast, until a trial call finds the dependency back.
//!
//! ```text
//!            threshold consecutive failures
//!   Closed ────────────────────────────────▶ Open ◀──────────┐
//!     ▲                                       │ begin_trial  │ the trial fails
//!     │            the trial succeeds         ▼              │
//!     └──────────────────────────────────  HalfOpen ─────────┘
//! ```
//!
//! - **Closed**: calls go through. A failure counts; a success sets the
//!   count back to zero. [`CircuitBreaker::threshold`] failures in a row
//!   open the breaker.
//! - **Open**: [`CircuitBreaker::allows`] says no: callers answer at once
//!   instead of waiting on a dependency that will not answer.
//! - **HalfOpen**: one trial is under way ([`CircuitBreaker::begin_trial`]);
//!   callers still fail fast. The trial's success closes the breaker, its
//!   failure opens it again.
//!
//! The breaker knows no clock and makes no calls: whoever owns the trials
//! (a prober on a connection of its own, say) decides when to try. Any
//! success reported while open or half-open closes it too — a dependency
//! that just answered is back, whoever asked.
//!
//! What counts as a failure is the caller's choice, and it matters: only
//! errors that say the dependency is unreachable or failing should count.
//! A saturated pool, a conflict or a cancelled call says nothing of the
//! dependency's health.
//!
//! ```
//! use lameduck::breaker::{BreakerState, CircuitBreaker};
//!
//! let breaker = CircuitBreaker::new(2);
//! breaker.record_failure();
//! assert!(breaker.allows());
//! breaker.record_failure();
//! assert_eq!(breaker.state(), BreakerState::Open);
//! assert!(!breaker.allows());
//!
//! assert!(breaker.begin_trial());
//! assert_eq!(breaker.state(), BreakerState::HalfOpen);
//! breaker.record_success();
//! assert_eq!(breaker.state(), BreakerState::Closed);
//! ```

use std::sync::atomic::{AtomicU32, AtomicU8, Ordering};
use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// The breaker's states.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BreakerState {
    /// Calls go through; failures are counted.
    Closed,
    /// Calls fail fast.
    Open,
    /// A trial is under way; other calls still fail fast.
    HalfOpen,
}

impl BreakerState {
    /// Every state, in the order of the diagram.
    pub const ALL: [BreakerState; 3] = [
        BreakerState::Closed,
        BreakerState::Open,
        BreakerState::HalfOpen,
    ];

    /// The state's name in logs, metrics and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            BreakerState::Closed => "closed",
            BreakerState::Open => "open",
            BreakerState::HalfOpen => "half_open",
        }
    }

    fn from_u8(value: u8) -> BreakerState {
        match value {
            1 => BreakerState::Open,
            2 => BreakerState::HalfOpen,
            _ => BreakerState::Closed,
        }
    }
}

/// A change of state, reported by the call that made it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Transition {
    /// The state before.
    pub from: BreakerState,
    /// The state after.
    pub to: BreakerState,
}

/// The breaker. Cloning shares it.
#[derive(Clone, Debug)]
pub struct CircuitBreaker {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// The state, as a `BreakerState` discriminant: read on every call.
    state: AtomicU8,
    /// Failures in a row while closed.
    failures: AtomicU32,
    threshold: u32,
    metrics: BreakerMetrics,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabel {
    state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ToLabel {
    to: &'static str,
}

#[derive(Debug, Default)]
struct BreakerMetrics {
    state: Family<StateLabel, Gauge>,
    transitions: Family<ToLabel, Counter>,
}

// === impl CircuitBreaker ===

impl CircuitBreaker {
    /// A closed breaker that opens after `threshold` consecutive failures
    /// (at least one).
    pub fn new(threshold: u32) -> CircuitBreaker {
        let breaker = CircuitBreaker {
            inner: Arc::new(Inner {
                state: AtomicU8::new(BreakerState::Closed as u8),
                failures: AtomicU32::new(0),
                threshold: threshold.max(1),
                metrics: BreakerMetrics::default(),
            }),
        };
        for state in BreakerState::ALL {
            let on = i64::from(state == BreakerState::Closed);
            breaker
                .inner
                .metrics
                .state
                .get_or_create(&StateLabel {
                    state: state.as_str(),
                })
                .set(on);
        }
        breaker
    }

    /// Registers `breaker_state{state}` (1 for the current state, 0 for the
    /// others) and `breaker_transitions_total{to}` under `registry`.
    pub fn register(&self, registry: &mut Registry) {
        let metrics = &self.inner.metrics;
        registry.register(
            "breaker_state",
            "The circuit breaker's state: 1 for the current one (closed, open, half_open)",
            metrics.state.clone(),
        );
        registry.register(
            "breaker_transitions",
            "Changes of the circuit breaker's state, by the state entered",
            metrics.transitions.clone(),
        );
    }

    /// Failures in a row that open the breaker.
    pub fn threshold(&self) -> u32 {
        self.inner.threshold
    }

    /// The current state.
    pub fn state(&self) -> BreakerState {
        BreakerState::from_u8(self.inner.state.load(Ordering::Acquire))
    }

    /// Whether a call may go through: only while closed.
    pub fn allows(&self) -> bool {
        self.state() == BreakerState::Closed
    }

    /// A call succeeded: the failure count starts again, and an open or
    /// half-open breaker closes.
    pub fn record_success(&self) -> Option<Transition> {
        self.inner.failures.store(0, Ordering::Release);
        if self.allows() {
            return None;
        }
        let from = self.swap(BreakerState::Closed);
        (from != BreakerState::Closed).then_some(Transition {
            from,
            to: BreakerState::Closed,
        })
    }

    /// A call failed the way that counts: while closed, the
    /// [`threshold`](CircuitBreaker::threshold)th failure in a row opens
    /// the breaker; a failed trial opens it again.
    pub fn record_failure(&self) -> Option<Transition> {
        let inner = &*self.inner;
        match self.state() {
            BreakerState::Closed => {
                let failures = inner.failures.fetch_add(1, Ordering::AcqRel) + 1;
                if failures < inner.threshold {
                    return None;
                }
                self.change(BreakerState::Closed, BreakerState::Open)
            }
            BreakerState::HalfOpen => self.change(BreakerState::HalfOpen, BreakerState::Open),
            BreakerState::Open => None,
        }
    }

    /// Starts a trial if the breaker is open: it turns half-open, and the
    /// caller reports the trial's outcome with
    /// [`record_success`](CircuitBreaker::record_success) or
    /// [`record_failure`](CircuitBreaker::record_failure). `false` (and no
    /// change) in any other state.
    pub fn begin_trial(&self) -> bool {
        self.change(BreakerState::Open, BreakerState::HalfOpen)
            .is_some()
    }

    fn change(&self, from: BreakerState, to: BreakerState) -> Option<Transition> {
        self.inner
            .state
            .compare_exchange(from as u8, to as u8, Ordering::AcqRel, Ordering::Acquire)
            .ok()?;
        self.count(from, to);
        Some(Transition { from, to })
    }

    fn swap(&self, to: BreakerState) -> BreakerState {
        let from = BreakerState::from_u8(self.inner.state.swap(to as u8, Ordering::AcqRel));
        if from != to {
            self.count(from, to);
        }
        from
    }

    fn count(&self, from: BreakerState, to: BreakerState) {
        let metrics = &self.inner.metrics;
        let label = |state: BreakerState| StateLabel {
            state: state.as_str(),
        };
        metrics.state.get_or_create(&label(from)).set(0);
        metrics.state.get_or_create(&label(to)).set(1);
        metrics
            .transitions
            .get_or_create(&ToLabel { to: to.as_str() })
            .inc();
        if to == BreakerState::Closed {
            self.inner.failures.store(0, Ordering::Release);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metrics_text(breaker: &CircuitBreaker) -> String {
        let mut registry = Registry::default();
        breaker.register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
        text
    }

    #[test]
    fn opens_only_on_consecutive_failures() {
        let breaker = CircuitBreaker::new(3);
        assert_eq!(breaker.record_failure(), None);
        assert_eq!(breaker.record_failure(), None);
        // A success in between starts the count again.
        assert_eq!(breaker.record_success(), None);
        assert_eq!(breaker.record_failure(), None);
        assert_eq!(breaker.record_failure(), None);
        assert!(breaker.allows());
        assert_eq!(
            breaker.record_failure(),
            Some(Transition {
                from: BreakerState::Closed,
                to: BreakerState::Open
            })
        );
        assert!(!breaker.allows());
        // More failures while open change nothing.
        assert_eq!(breaker.record_failure(), None);
        assert_eq!(breaker.state(), BreakerState::Open);
    }

    #[test]
    fn a_trial_closes_it_or_opens_it_again() {
        let breaker = CircuitBreaker::new(1);
        assert!(!breaker.begin_trial(), "no trial while closed");
        breaker.record_failure();
        assert!(breaker.begin_trial());
        assert!(!breaker.begin_trial(), "one trial at a time");
        assert!(!breaker.allows(), "calls still fail fast during the trial");
        assert_eq!(
            breaker.record_failure(),
            Some(Transition {
                from: BreakerState::HalfOpen,
                to: BreakerState::Open
            })
        );
        assert!(breaker.begin_trial());
        assert_eq!(
            breaker.record_success(),
            Some(Transition {
                from: BreakerState::HalfOpen,
                to: BreakerState::Closed
            })
        );
        assert!(breaker.allows());
    }

    #[test]
    fn any_success_closes_an_open_breaker_and_the_count_starts_over() {
        let breaker = CircuitBreaker::new(2);
        breaker.record_failure();
        breaker.record_failure();
        assert_eq!(breaker.state(), BreakerState::Open);
        assert_eq!(
            breaker.record_success(),
            Some(Transition {
                from: BreakerState::Open,
                to: BreakerState::Closed
            })
        );
        assert_eq!(breaker.record_failure(), None, "one failure of two");
        assert!(breaker.allows());
    }

    #[test]
    fn its_state_and_transitions_are_metrics() {
        let breaker = CircuitBreaker::new(1);
        let text = metrics_text(&breaker);
        assert!(
            text.contains(r#"breaker_state{state="closed"} 1"#),
            "{text}"
        );
        assert!(text.contains(r#"breaker_state{state="open"} 0"#), "{text}");
        breaker.record_failure();
        breaker.begin_trial();
        breaker.record_success();
        breaker.record_failure();
        let text = metrics_text(&breaker);
        assert!(text.contains(r#"breaker_state{state="open"} 1"#), "{text}");
        assert!(
            text.contains(r#"breaker_state{state="closed"} 0"#),
            "{text}"
        );
        assert!(
            text.contains(r#"breaker_transitions_total{to="open"} 2"#),
            "{text}"
        );
        assert!(
            text.contains(r#"breaker_transitions_total{to="half_open"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"breaker_transitions_total{to="closed"} 1"#),
            "{text}"
        );
    }
}
