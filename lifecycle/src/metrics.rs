//! The lifecycle's counters, as plain atomics: no metrics crate is imposed.
//! An application exports them by reading a [`Snapshot`] at scrape time
//! (the example service turns it into Prometheus series).

use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed};
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicU8};
use std::sync::Arc;
use std::time::Duration;

use crate::Phase;

/// The wire protocol of a connection, once its first bytes have told it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// Accepted, no request seen yet.
    Pending = 0,
    /// HTTP/1.x.
    Http1 = 1,
    /// HTTP/2.
    Http2 = 2,
}

impl Protocol {
    /// Every protocol, in label order.
    pub const ALL: [Protocol; 3] = [Protocol::Pending, Protocol::Http1, Protocol::Http2];

    /// The label value: `pending`, `http1` or `http2`.
    pub fn as_str(self) -> &'static str {
        ["pending", "http1", "http2"][self as usize]
    }
}

/// Who ended a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClosedBy {
    /// The client closed it (or it failed) while the server still wanted it.
    Client = 0,
    /// The server asked it to close (idle, lame duck or drain) and it did.
    Server = 1,
    /// The server dropped it at the deadline or on a forced shutdown.
    Abandoned = 2,
}

impl ClosedBy {
    /// Every closer, in label order.
    pub const ALL: [ClosedBy; 3] = [ClosedBy::Client, ClosedBy::Server, ClosedBy::Abandoned];

    /// The label value: `client`, `server` or `abandoned`.
    pub fn as_str(self) -> &'static str {
        ["client", "server", "abandoned"][self as usize]
    }
}

/// Why a connection ended: the first reason the server had to end it, or
/// the client's own choice.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CloseReason {
    /// The client closed it (or it failed) while the server still wanted it.
    Client = 0,
    /// The shutdown: the lame duck's spread or its end, or the drain.
    Drain = 1,
    /// It reached its maximum age (`ServeConfig::max_connection_age`).
    Age = 2,
    /// Nothing in flight for the idle limit.
    Idle = 3,
    /// The client was too slow: a request head, or taking its answers.
    Timeout = 4,
    /// Past its age, requests still in flight when the age's grace ran out:
    /// dropped with them.
    Grace = 5,
    /// Dropped at the shutdown deadline or on a forced shutdown.
    Abandoned = 6,
}

impl CloseReason {
    /// Every reason, in label order.
    pub const ALL: [CloseReason; 7] = [
        CloseReason::Client,
        CloseReason::Drain,
        CloseReason::Age,
        CloseReason::Idle,
        CloseReason::Timeout,
        CloseReason::Grace,
        CloseReason::Abandoned,
    ];

    /// The label value: `client`, `drain`, `age`, `idle`, `timeout`,
    /// `grace` or `abandoned`.
    pub fn as_str(self) -> &'static str {
        let labels = [
            "client",
            "drain",
            "age",
            "idle",
            "timeout",
            "grace",
            "abandoned",
        ];
        labels[self as usize]
    }

    /// Who ended the connection for this reason.
    pub fn by(self) -> ClosedBy {
        match self {
            CloseReason::Client => ClosedBy::Client,
            CloseReason::Abandoned => ClosedBy::Abandoned,
            _ => ClosedBy::Server,
        }
    }

    pub(crate) fn from_u8(code: u8) -> Option<CloseReason> {
        CloseReason::ALL.get(usize::from(code)).copied()
    }
}

#[derive(Debug, Default)]
struct Counters {
    connections_open: [AtomicI64; 3],
    connections_accepted: AtomicU64,
    connections_closed: [AtomicU64; 7],
    requests_in_flight: AtomicI64,
    requests_aborted: AtomicU64,
    requests_drained: AtomicU64,
    accept_errors: AtomicU64,
    phase: AtomicU8,
    drain_micros: AtomicU64,
}

/// Counters of connections, requests and the shutdown timeline. Cloning
/// shares them.
#[derive(Clone, Debug, Default)]
pub struct LifecycleMetrics(Arc<Counters>);

/// The counters at one instant.
#[derive(Clone, Debug, PartialEq)]
pub struct Snapshot {
    /// Open connections by protocol (pending until the first bytes tell).
    pub connections_open: [(Protocol, i64); 3],
    /// Connections accepted so far.
    pub connections_accepted: u64,
    /// Closed connections by why they ended.
    pub connections_closed: [(CloseReason, u64); 7],
    /// Requests whose response has not been produced yet.
    pub requests_in_flight: i64,
    /// Requests dropped before their response: hang-ups, resets, abandoned.
    pub requests_aborted: u64,
    /// Requests completed after the shutdown signal.
    pub requests_drained: u64,
    /// Errors returned by `accept()`, absorbed by the accept loop.
    pub accept_errors: u64,
    /// The current phase of the shutdown timeline.
    pub phase: Phase,
    /// How long the last drain took.
    pub drain: Duration,
}

impl Snapshot {
    /// Closed connections ended by `by`, whatever the reason.
    pub fn closed_by(&self, by: ClosedBy) -> u64 {
        let closed = self.connections_closed.iter();
        closed
            .filter(|(why, _)| why.by() == by)
            .map(|(_, n)| n)
            .sum()
    }

    /// Closed connections that ended for `why`.
    pub fn closed_for(&self, why: CloseReason) -> u64 {
        self.connections_closed[why as usize].1
    }
}

impl LifecycleMetrics {
    /// Every counter, read now.
    pub fn snapshot(&self) -> Snapshot {
        let c = &self.0;
        Snapshot {
            connections_open: Protocol::ALL
                .map(|p| (p, c.connections_open[p as usize].load(Relaxed))),
            connections_accepted: c.connections_accepted.load(Relaxed),
            connections_closed: CloseReason::ALL
                .map(|r| (r, c.connections_closed[r as usize].load(Relaxed))),
            requests_in_flight: c.requests_in_flight.load(Relaxed),
            requests_aborted: c.requests_aborted.load(Relaxed),
            requests_drained: c.requests_drained.load(Relaxed),
            accept_errors: c.accept_errors.load(Relaxed),
            phase: self.phase(),
            drain: Duration::from_micros(c.drain_micros.load(Relaxed)),
        }
    }

    /// Requests in flight now.
    pub fn requests_in_flight(&self) -> i64 {
        self.0.requests_in_flight.load(Relaxed)
    }

    /// Connections open now, of every protocol.
    pub fn open_connections(&self) -> i64 {
        let open = &self.0.connections_open;
        open.iter().map(|n| n.load(Relaxed)).sum()
    }

    pub(crate) fn connection_moved(&self, from: Option<Protocol>, to: Option<Protocol>) {
        if let Some(from) = from {
            self.0.connections_open[from as usize].fetch_sub(1, Relaxed);
        }
        if let Some(to) = to {
            self.0.connections_open[to as usize].fetch_add(1, Relaxed);
        }
    }

    pub(crate) fn connection_accepted(&self) {
        self.0.connections_accepted.fetch_add(1, Relaxed);
    }

    pub(crate) fn connection_closed(&self, why: CloseReason) {
        self.0.connections_closed[why as usize].fetch_add(1, Relaxed);
    }

    pub(crate) fn request_started(&self) {
        self.0.requests_in_flight.fetch_add(1, Relaxed);
    }

    /// A request left flight: answered (`Some(after_signal)`) or aborted.
    pub(crate) fn request_ended(&self, answered: Option<bool>) {
        self.0.requests_in_flight.fetch_sub(1, Relaxed);
        match answered {
            None => self.0.requests_aborted.fetch_add(1, Relaxed),
            Some(true) => self.0.requests_drained.fetch_add(1, Relaxed),
            Some(false) => return,
        };
    }

    pub(crate) fn accept_failed(&self) {
        self.0.accept_errors.fetch_add(1, Relaxed);
    }

    /// The shutdown timeline's phase: this is where the timeline keeps it.
    pub(crate) fn phase(&self) -> Phase {
        Phase::ALL[usize::from(self.0.phase.load(Acquire))]
    }

    /// Moves the phase forward to `phase`; it never moves back.
    pub(crate) fn advance_phase(&self, phase: Phase) {
        self.0.phase.fetch_max(phase as u8, AcqRel);
    }

    pub(crate) fn set_drain(&self, took: Duration) {
        let micros = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        self.0.drain_micros.store(micros, Relaxed);
    }
}
