//! The lifecycle's counters as Prometheus series: read at scrape time from
//! the lifecycle's [`Snapshot`] (`lameduck_connections_open{protocol}`,
//! `lameduck_connections_closed_total{by,reason}`,
//! `lameduck_requests_in_flight`, `lameduck_shutdown_phase{phase}`…), and
//! the traces' (`lameduck_traces_spans_refused_total`).

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use lameduck_lifecycle::metrics::{ClosedBy, LifecycleMetrics, Snapshot};
use lameduck_lifecycle::Phase;

/// Exports [`LifecycleMetrics`] to a Prometheus registry.
#[derive(Debug)]
pub struct LifecycleCollector(LifecycleMetrics);

impl LifecycleCollector {
    /// Registers the lifecycle's series under `registry`.
    pub fn register(metrics: &LifecycleMetrics, registry: &mut Registry) {
        registry.register_collector(Box::new(LifecycleCollector(metrics.clone())));
    }
}

/// A family of series with one label, one series per value.
fn labelled<M: EncodeMetric>(
    encoder: &mut DescriptorEncoder,
    (name, help, kind): (&str, &str, MetricType),
    label: &str,
    series: impl IntoIterator<Item = (&'static str, M)>,
) -> std::fmt::Result {
    let mut family = encoder.encode_descriptor(name, help, None, kind)?;
    for (value, metric) in series {
        metric.encode(family.encode_family(&[(label, value)])?)?;
    }
    Ok(())
}

/// One series without labels.
fn single<M: EncodeMetric>(
    encoder: &mut DescriptorEncoder,
    (name, help, kind): (&str, &str, MetricType),
    metric: M,
) -> std::fmt::Result {
    metric.encode(encoder.encode_descriptor(name, help, None, kind)?)
}

impl Collector for LifecycleCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        use MetricType::{Counter, Gauge};
        let s: Snapshot = self.0.snapshot();
        let e = &mut encoder;
        labelled(
            e,
            (
                "connections_open",
                "Open connections by protocol (pending until the first request)",
                Gauge,
            ),
            "protocol",
            s.connections_open
                .map(|(p, n)| (p.as_str(), ConstGauge::new(n))),
        )?;
        single(
            e,
            (
                "connections_accepted",
                "Connections accepted on the service's listeners",
                Counter,
            ),
            ConstCounter::new(s.connections_accepted),
        )?;
        let mut closed = e.encode_descriptor(
            "connections_closed",
            "Closed connections by who ended them (client or server) and why: client, drain, age, idle, timeout, grace (past its age's grace) or abandoned",
            None,
            Counter,
        )?;
        for (why, n) in s.connections_closed {
            let by = if why.by() == ClosedBy::Client {
                "client"
            } else {
                "server"
            };
            let labels = [("by", by), ("reason", why.as_str())];
            ConstCounter::new(n).encode(closed.encode_family(&labels)?)?;
        }
        single(
            e,
            (
                "requests_in_flight",
                "Requests whose response has not been produced yet",
                Gauge,
            ),
            ConstGauge::new(s.requests_in_flight),
        )?;
        single(e, ("requests_aborted", "Requests dropped before their response: client hang-ups, resets and abandoned work", Counter), ConstCounter::new(s.requests_aborted))?;
        single(
            e,
            (
                "requests_drained",
                "Requests completed after the shutdown signal",
                Counter,
            ),
            ConstCounter::new(s.requests_drained),
        )?;
        single(
            e,
            (
                "accept_errors",
                "Errors returned by accept(), absorbed by the accept loop",
                Counter,
            ),
            ConstCounter::new(s.accept_errors),
        )?;
        labelled(
            e,
            (
                "shutdown_phase",
                "1 for the current shutdown phase, 0 for the others",
                Gauge,
            ),
            "phase",
            Phase::ALL.map(|p| (p.as_str(), ConstGauge::new(i64::from(p == s.phase)))),
        )?;
        single(
            e,
            (
                "drain_duration_seconds",
                "How long the last drain took, from closing the listener to the last request",
                Gauge,
            ),
            ConstGauge::new(s.drain.as_secs_f64()),
        )
    }
}

/// The traces' series (`lameduck_traces_spans_refused_total`): read at
/// scrape time, zero while traces are off.
#[derive(Debug)]
pub struct TracesCollector;

impl TracesCollector {
    /// Registers the series under `registry`.
    pub fn register(registry: &mut prometheus_client::registry::Registry) {
        registry.register_collector(Box::new(TracesCollector));
    }
}

impl prometheus_client::collector::Collector for TracesCollector {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::DescriptorEncoder,
    ) -> std::fmt::Result {
        use prometheus_client::encoding::EncodeMetric;
        let refused = prometheus_client::metrics::counter::ConstCounter::new(
            lameduck_traces::spans_refused(),
        );
        let metric = encoder.encode_descriptor(
            "traces_spans_refused",
            "Spans in batches the trace collector refused (down, unreachable or failing): dropped",
            None,
            prometheus_client::metrics::MetricType::Counter,
        )?;
        refused.encode(metric)
    }
}
