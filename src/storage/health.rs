//! What the service knows of its database: `up`, `busy` or `down`, and the
//! prober that keeps it current.
//!
//! - **busy**: a call got no pooled connection within
//!   [`ACQUIRE_TIMEOUT`](super::ACQUIRE_TIMEOUT). The pool is saturated —
//!   every connection held by slow work, a lock, a burst — while the
//!   database may answer every other session at once. Such a call answers
//!   503 "busy" with `Retry-After`; nothing else changes. It ends at the
//!   next call that gets a connection, or when the prober sees the pool
//!   with room again.
//! - **down**: the [`CircuitBreaker`] is open: [`FAILURE_THRESHOLD`] calls
//!   in a row met errors that say the database cannot be reached or is
//!   failing (refused, reset, I/O, TLS, protocol errors, a shutting-down or
//!   crashed server, a full disk, a failed probe). Calls that need the
//!   database then answer 503 with `Retry-After` at once instead of
//!   waiting for it. The first success closes it again: a probe, a call, a
//!   hit flush that lands.
//! - **up**: neither.
//!
//! None of it decides readiness. Every replica shares the database: when it
//! is away for one, it is away for all, and a readiness that followed it
//! would take every replica out of its load balancer at once — the cached
//! redirects and the in-memory counting that exist for exactly that time
//! with them. The state is reported instead: a `database` field in
//! `/healthz` and `/readyz`, the `db_state` gauge, and one log line per
//! change.
//!
//! The prober ([`run_health_probe`]) asks `SELECT 1` on a connection of its
//! own, outside the pool, every [`PROBE_INTERVAL`] — and at once (at most
//! every [`PROBE_MIN_GAP`]) when a call met a failure or a full pool, or its
//! own last probe failed while the breaker was still closed, so an outage
//! opens the breaker within a few tenths of a second.
//! A saturated pool cannot make it fail, and its answer is what tells a
//! pool that waits on a dead database from one that waits on a busy one.
//! While the breaker is open, its probe is the half-open trial.

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use sqlx::any::AnyConnectOptions;
use sqlx::{AnyConnection, AnyPool, Connection};
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{classify, Storage, StorageError, Verdict};
use crate::breaker::{BreakerState, CircuitBreaker};
use crate::lifecycle::BoxError;

/// Real failures in a row that open the breaker. Three: one broken pooled
/// connection (a restart leaves a pool of them) does not open it, a
/// database that refuses a probe and two calls does.
pub const FAILURE_THRESHOLD: u32 = 3;

/// How often the prober asks the database, whatever the traffic. While the
/// breaker is open this is the longest a recovered database waits for the
/// breaker to close.
pub const PROBE_INTERVAL: Duration = Duration::from_millis(500);

/// How long one probe may take, connecting included, before it counts as
/// a failure.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// The shortest time between two probes that calls asked for: a burst of
/// failing calls asks for one probe, not one each.
pub const PROBE_MIN_GAP: Duration = Duration::from_millis(100);

/// The `Retry-After` of a 503 "busy" or "database unavailable", in seconds:
/// about when the next probe has told whether it is over.
pub const RETRY_AFTER_SECS: u32 = 1;

/// What the service knows of its database.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DatabaseState {
    /// Calls get connections and answers.
    Up,
    /// A call got no pooled connection within the acquire timeout.
    Busy,
    /// The circuit breaker is open (or trying): calls fail fast.
    Down,
}

impl DatabaseState {
    /// Every state.
    pub const ALL: [DatabaseState; 3] =
        [DatabaseState::Up, DatabaseState::Busy, DatabaseState::Down];

    /// `up`, `busy` or `down`: the `database` field of `/healthz` and
    /// `/readyz`, and the `state` label of `db_state`.
    pub fn as_str(self) -> &'static str {
        match self {
            DatabaseState::Up => "up",
            DatabaseState::Busy => "busy",
            DatabaseState::Down => "down",
        }
    }

    fn from_u8(value: u8) -> DatabaseState {
        match value {
            1 => DatabaseState::Busy,
            2 => DatabaseState::Down,
            _ => DatabaseState::Up,
        }
    }
}

/// The database's health as every call and the prober see it. Cloning
/// shares it.
#[derive(Clone, Debug)]
pub struct DatabaseHealth {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    breaker: CircuitBreaker,
    /// A call got no pooled connection in time, and none has since.
    busy: AtomicBool,
    /// The state last logged and set on the gauge.
    reported: AtomicU8,
    /// Held while a change of state is logged, so changes log in order.
    reporting: Mutex<()>,
    /// Asks the prober for a probe now.
    probe_now: Notify,
    /// Wakes the calls waiting for a pooled connection when the breaker
    /// opens.
    opened: Notify,
    metrics: HealthMetrics,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabel {
    state: &'static str,
}

#[derive(Debug, Default)]
struct HealthMetrics {
    state: Family<StateLabel, Gauge>,
    failures: Counter,
    busy: Counter,
    failed_fast: Counter,
}

impl Default for DatabaseHealth {
    fn default() -> Self {
        let health = DatabaseHealth {
            inner: Arc::new(Inner {
                breaker: CircuitBreaker::new(FAILURE_THRESHOLD),
                busy: AtomicBool::new(false),
                reported: AtomicU8::new(DatabaseState::Up as u8),
                reporting: Mutex::new(()),
                probe_now: Notify::new(),
                opened: Notify::new(),
                metrics: HealthMetrics::default(),
            }),
        };
        for state in DatabaseState::ALL {
            health
                .gauge(state)
                .set(i64::from(state == DatabaseState::Up));
        }
        health
    }
}

// === impl DatabaseHealth ===

impl DatabaseHealth {
    /// Registers `state`, `breaker_state`, `breaker_transitions_total`,
    /// `failures_total`, `busy_total` and `failed_fast_total` under
    /// `registry` (the service gives them the prefix `db_`).
    pub fn register(&self, registry: &mut Registry) {
        let metrics = &self.inner.metrics;
        registry.register(
            "state",
            "What the service knows of its database: 1 for the current state (up, busy, down)",
            metrics.state.clone(),
        );
        registry.register(
            "failures",
            "Database calls and probes that met an error saying the database cannot be reached or is failing",
            metrics.failures.clone(),
        );
        registry.register(
            "busy",
            "Database calls that got no pooled connection within the acquire timeout (answered 503 busy)",
            metrics.busy.clone(),
        );
        registry.register(
            "failed_fast",
            "Database calls refused at once because the circuit breaker was open",
            metrics.failed_fast.clone(),
        );
        self.inner.breaker.register(registry);
    }

    /// The current state: `down` while the breaker is not closed, `busy`
    /// while the pool is known to be saturated, `up` otherwise.
    pub fn state(&self) -> DatabaseState {
        if !self.inner.breaker.allows() {
            DatabaseState::Down
        } else if self.inner.busy.load(Ordering::Acquire) {
            DatabaseState::Busy
        } else {
            DatabaseState::Up
        }
    }

    /// The circuit breaker that decides when calls fail fast.
    pub fn breaker(&self) -> &CircuitBreaker {
        &self.inner.breaker
    }

    /// `Ok` if a call may go to the database now; [`StorageError::Down`]
    /// (counted) while the breaker is open.
    pub(super) fn admit(&self) -> Result<(), StorageError> {
        if self.inner.breaker.allows() {
            Ok(())
        } else {
            Err(self.failed_fast())
        }
    }

    /// Counts a call refused because the breaker is open; its error.
    pub(super) fn failed_fast(&self) -> StorageError {
        self.inner.metrics.failed_fast.inc();
        StorageError::Down
    }

    /// Resolves when the breaker next opens (enable it before checking
    /// [`DatabaseHealth::admit`], so that no opening falls in between).
    pub(super) fn breaker_opened(&self) -> tokio::sync::futures::Notified<'_> {
        self.inner.opened.notified()
    }

    /// Notes what a call's result says about the database, and turns a
    /// "busy" met while the breaker opened into "down": the answer says
    /// what is known when it is given.
    pub(super) fn observe<T>(&self, result: Result<T, StorageError>) -> Result<T, StorageError> {
        let verdict = match &result {
            Ok(_) => Verdict::Answered,
            Err(error) => error.verdict(),
        };
        match verdict {
            Verdict::Answered => self.answered(),
            Verdict::Busy => self.pool_saturated(),
            Verdict::Failing => self.failed(),
            Verdict::Silent => {}
        }
        match result {
            Err(StorageError::Busy) if !self.inner.breaker.allows() => Err(StorageError::Down),
            other => other,
        }
    }

    /// The database answered a call that had a pooled connection.
    fn answered(&self) {
        let inner = &*self.inner;
        inner.busy.store(false, Ordering::Release);
        inner.breaker.record_success();
        self.report();
    }

    /// A call got no pooled connection in time: busy, or a database that
    /// cannot be reached behind a pool that keeps trying to connect. The
    /// prober tells which.
    fn pool_saturated(&self) {
        let inner = &*self.inner;
        inner.metrics.busy.inc();
        inner.busy.store(true, Ordering::Release);
        inner.probe_now.notify_one();
        self.report();
    }

    /// A call met an error that says the database is unreachable or failing.
    fn failed(&self) {
        let inner = &*self.inner;
        inner.metrics.failures.inc();
        self.record_failure();
        inner.probe_now.notify_one();
        self.report();
    }

    /// Counts a failure on the breaker; if that opens it, wakes the calls
    /// waiting for a pooled connection, which fail fast now too.
    fn record_failure(&self) {
        let opened = self.inner.breaker.record_failure();
        if opened.is_some_and(|transition| transition.to == BreakerState::Open) {
            self.inner.opened.notify_waiters();
        }
    }

    /// The pool has room again (an idle connection, or fewer than its
    /// maximum): whatever made it busy is over.
    fn pool_has_room(&self) {
        self.inner.busy.store(false, Ordering::Release);
        self.report();
    }

    fn gauge(&self, state: DatabaseState) -> Gauge {
        self.inner
            .metrics
            .state
            .get_or_create(&StateLabel {
                state: state.as_str(),
            })
            .clone()
    }

    /// Logs and sets the gauge if the state changed since last reported.
    fn report(&self) {
        let inner = &*self.inner;
        if inner.reported.load(Ordering::Acquire) == self.state() as u8 {
            return;
        }
        let _in_order = inner
            .reporting
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let now = self.state();
        let before = DatabaseState::from_u8(inner.reported.swap(now as u8, Ordering::AcqRel));
        if before == now {
            return;
        }
        self.gauge(before).set(0);
        self.gauge(now).set(1);
        let from = before.as_str();
        match now {
            DatabaseState::Down => tracing::warn!(
                from,
                failures = inner.breaker.threshold(),
                "database unreachable: the circuit breaker is open; calls that need it answer 503 at once until a probe reaches it (readiness unchanged)"
            ),
            DatabaseState::Busy => tracing::warn!(
                from,
                "database busy: a call got no pooled connection within the acquire timeout and answered 503 busy (readiness unchanged)"
            ),
            DatabaseState::Up => tracing::info!(from, "database up again"),
        }
    }
}

/// Background worker: probes the database on a connection of its own
/// every [`PROBE_INTERVAL`], and sooner when a call asks for it, until
/// `token` fires. A probe that fails counts toward opening the breaker; one
/// that succeeds closes it (while open it is the half-open trial). After
/// each probe, a pool that has room again is no longer busy.
///
/// # Errors
/// None: an unreachable database is a state, not a failure.
pub async fn run_health_probe(storage: Storage, token: CancellationToken) -> Result<(), BoxError> {
    let health = storage.health.clone();
    let mut prober = Prober {
        options: AnyConnectOptions::clone(&storage.probe_options),
        connection: None,
    };
    let mut ticker = tokio::time::interval(PROBE_INTERVAL);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last = Instant::now();
    loop {
        tokio::select! {
            biased;
            () = token.cancelled() => break,
            _ = ticker.tick() => {}
            () = health.inner.probe_now.notified() => {
                let gap = tokio::time::sleep_until(last + PROBE_MIN_GAP);
                if token.run_until_cancelled(gap).await.is_none() {
                    break;
                }
            }
        }
        health.inner.breaker.begin_trial();
        let Some(answered) = token.run_until_cancelled(prober.probe()).await else {
            break;
        };
        if answered {
            health.inner.breaker.record_success();
        } else {
            health.inner.metrics.failures.inc();
            health.record_failure();
            // Failures are adding up toward the threshold: confirm at the
            // minimum gap, not the interval, so that the breaker opens
            // within tenths of a second even when no call meets an error
            // (the pool replaces dead connections quietly and keeps
            // retrying refused ones until the acquire timeout).
            if health.inner.breaker.allows() {
                health.inner.probe_now.notify_one();
            }
        }
        if has_room(&storage.pool) {
            health.pool_has_room();
        }
        health.report();
        last = Instant::now();
        ticker.reset();
    }
    if let Some(connection) = prober.connection.take() {
        let _ = connection.close().await;
    }
    Ok(())
}

/// Whether `pool` can hand out a connection without waiting for one to
/// come back.
fn has_room(pool: &AnyPool) -> bool {
    pool.num_idle() > 0 || pool.size() < pool.options().get_max_connections()
}

/// The prober's own connection, opened again after any failure.
struct Prober {
    options: AnyConnectOptions,
    connection: Option<AnyConnection>,
}

impl Prober {
    /// `SELECT 1` within [`PROBE_TIMEOUT`], connecting first if needed.
    /// `false` if it timed out or met an error that says the database is
    /// unreachable or failing; the connection is then dropped.
    async fn probe(&mut self) -> bool {
        let outcome = tokio::time::timeout(PROBE_TIMEOUT, self.select_one()).await;
        let answered = match &outcome {
            Ok(Ok(())) => true,
            Ok(Err(error)) => classify(error) != Verdict::Failing,
            Err(_elapsed) => false,
        };
        if !matches!(outcome, Ok(Ok(()))) {
            self.connection = None;
        }
        answered
    }

    async fn select_one(&mut self) -> Result<(), sqlx::Error> {
        let connection = match &mut self.connection {
            Some(connection) => connection,
            None => self
                .connection
                .insert(AnyConnection::connect_with(&self.options).await?),
        };
        sqlx::query("SELECT 1").execute(connection).await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(kind: std::io::ErrorKind) -> StorageError {
        StorageError::from(sqlx::Error::Io(std::io::Error::from(kind)))
    }

    // Gap: a saturated pool read as an outage. A call that got no pooled
    // connection makes the database busy, never down, however many do.
    #[test]
    fn a_saturated_pool_is_busy_and_never_opens_the_breaker() {
        let health = DatabaseHealth::default();
        for _ in 0..10 {
            let answered = health.observe::<()>(Err(StorageError::Busy));
            assert!(matches!(answered, Err(StorageError::Busy)));
        }
        assert_eq!(health.state(), DatabaseState::Busy);
        assert_eq!(health.breaker().state(), BreakerState::Closed);
        assert!(health.admit().is_ok(), "busy calls still go through");

        health.observe(Ok(())).expect("answered");
        assert_eq!(health.state(), DatabaseState::Up);
    }

    #[test]
    fn consecutive_real_failures_open_the_breaker_and_a_success_closes_it() {
        let health = DatabaseHealth::default();
        for n in 1..=FAILURE_THRESHOLD {
            assert_eq!(
                health.state(),
                DatabaseState::Up,
                "after {} failures",
                n - 1
            );
            let _ = health.observe::<()>(Err(error(std::io::ErrorKind::ConnectionRefused)));
        }
        assert_eq!(health.state(), DatabaseState::Down);
        assert!(matches!(health.admit(), Err(StorageError::Down)));
        // A call that meets a full pool while the breaker is open is told
        // the database is down, not busy.
        assert!(matches!(
            health.observe::<()>(Err(StorageError::Busy)),
            Err(StorageError::Down)
        ));

        // A hit flush that lands, say.
        health.observe(Ok(())).expect("answered");
        assert_eq!(health.state(), DatabaseState::Up);
        assert!(health.admit().is_ok());
    }

    #[test]
    fn answers_that_say_nothing_of_the_database_change_nothing() {
        let health = DatabaseHealth::default();
        let _ = health.observe::<()>(Err(error(std::io::ErrorKind::ConnectionReset)));
        let _ = health.observe::<()>(Err(error(std::io::ErrorKind::ConnectionReset)));
        // A cancelled call is silent; a conflict is an answer.
        let _ = health.observe::<()>(Err(StorageError::Cancelled));
        let _ = health.observe::<()>(Err(error(std::io::ErrorKind::ConnectionReset)));
        assert_eq!(health.state(), DatabaseState::Down, "three in a row");

        let health = DatabaseHealth::default();
        let _ = health.observe::<()>(Err(error(std::io::ErrorKind::ConnectionReset)));
        let _ = health.observe::<()>(Err(error(std::io::ErrorKind::ConnectionReset)));
        let _ = health.observe::<()>(Err(StorageError::Conflict));
        let _ = health.observe::<()>(Err(error(std::io::ErrorKind::ConnectionReset)));
        assert_eq!(
            health.state(),
            DatabaseState::Up,
            "the conflict came between"
        );
    }

    #[test]
    fn the_state_is_a_gauge() {
        let health = DatabaseHealth::default();
        let text = || {
            let mut registry = Registry::default();
            health.register(&mut registry);
            let mut text = String::new();
            prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
            text
        };
        assert!(text().contains(r#"state{state="up"} 1"#), "{}", text());
        let _ = health.observe::<()>(Err(StorageError::Busy));
        let busy = text();
        assert!(busy.contains(r#"state{state="busy"} 1"#), "{busy}");
        assert!(busy.contains(r#"state{state="up"} 0"#), "{busy}");
        assert!(busy.contains("busy_total 1"), "{busy}");
    }
}
