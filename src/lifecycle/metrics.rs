//! The lifecycle's own Prometheus series. Handles to the hot-path series are
//! resolved once, so recording is a single atomic operation.

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

use super::Phase;

/// The wire protocol of a connection, once its first request has told it.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub(crate) enum Protocol {
    /// Accepted, no request seen yet.
    pending,
    http1,
    http2,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProtocolLabels {
    protocol: Protocol,
}

/// Who ended a connection.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub(crate) enum ClosedBy {
    /// The client closed it (or it failed) while the server still wanted it.
    client,
    /// The server asked it to close (lame duck or drain) and it did.
    server,
    /// The server dropped it at the deadline or on a forced shutdown.
    abandoned,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClosedByLabels {
    by: ClosedBy,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PhaseLabels {
    phase: &'static str,
}

/// Counters and gauges of connections, requests and the shutdown timeline.
///
/// Cloning shares the underlying series.
#[derive(Clone, Debug, Default)]
pub struct LifecycleMetrics {
    connections_open: Family<ProtocolLabels, Gauge>,
    connections_closed: Family<ClosedByLabels, Counter>,
    pub(crate) requests_in_flight: Gauge,
    pub(crate) requests_aborted: Counter,
    pub(crate) requests_drained: Counter,
    pub(crate) accept_errors: Counter,
    phase: Family<PhaseLabels, Gauge>,
    pub(crate) drain_seconds: Gauge<f64, AtomicU64>,
}

impl LifecycleMetrics {
    /// Registers every series under `registry` (prefix it with a namespace
    /// using `Registry::sub_registry_with_prefix` if you like).
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "connections_open",
            "Open connections by protocol (pending until the first request)",
            self.connections_open.clone(),
        );
        registry.register(
            "connections_closed",
            "Closed connections by who ended them: client, server (asked to close) or abandoned",
            self.connections_closed.clone(),
        );
        registry.register(
            "requests_in_flight",
            "Requests whose response has not been produced yet",
            self.requests_in_flight.clone(),
        );
        registry.register(
            "requests_aborted",
            "Requests dropped before their response: client hang-ups, resets and abandoned work",
            self.requests_aborted.clone(),
        );
        registry.register(
            "requests_drained",
            "Requests completed after the shutdown signal",
            self.requests_drained.clone(),
        );
        registry.register(
            "accept_errors",
            "Errors returned by accept(), absorbed by the accept loop",
            self.accept_errors.clone(),
        );
        registry.register(
            "shutdown_phase",
            "1 for the current shutdown phase, 0 for the others",
            self.phase.clone(),
        );
        registry.register(
            "drain_duration_seconds",
            "How long the last drain took, from closing the listener to the last request",
            self.drain_seconds.clone(),
        );
    }

    /// Requests in flight now.
    pub fn requests_in_flight(&self) -> i64 {
        self.requests_in_flight.get()
    }

    /// Requests dropped before their response, so far.
    pub fn requests_aborted(&self) -> u64 {
        self.requests_aborted.get()
    }

    /// Connections open now, of every protocol.
    pub fn open_connections(&self) -> i64 {
        self.connections_open_total()
    }

    pub(crate) fn connections_open(&self, protocol: Protocol) -> Gauge {
        self.connections_open
            .get_or_create(&ProtocolLabels { protocol })
            .clone()
    }

    /// Open connections of every protocol.
    pub(crate) fn connections_open_total(&self) -> i64 {
        [Protocol::pending, Protocol::http1, Protocol::http2]
            .into_iter()
            .map(|protocol| self.connections_open(protocol).get())
            .sum()
    }

    pub(crate) fn connection_closed(&self, by: ClosedBy) {
        self.connections_closed
            .get_or_create(&ClosedByLabels { by })
            .inc();
    }

    pub(crate) fn connections_closed_by(&self, by: ClosedBy) -> u64 {
        self.connections_closed
            .get_or_create(&ClosedByLabels { by })
            .get()
    }

    pub(crate) fn set_phase(&self, current: Phase) {
        for phase in Phase::ALL {
            self.phase
                .get_or_create(&PhaseLabels {
                    phase: phase.as_str(),
                })
                .set(i64::from(phase == current));
        }
    }
}
