//! The component's own series, under its name: `<prefix>_<name>_pending`,
//! `…_flushed_total`, `…_spilled_total`, `…_lost_total`, and the journal's.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// Handles to the series; cloning shares them.
#[derive(Clone, Debug)]
pub(crate) struct Metrics {
    pub(crate) pending: Gauge,
    pub(crate) flush_batches: Counter,
    pub(crate) flush_failures: Counter,
    pub(crate) flush_seconds: Histogram,
    pub(crate) flushed: Counter,
    pub(crate) spills: Counter,
    pub(crate) spilled: Counter,
    pub(crate) lost: Counter,
    pub(crate) replayed: Counter,
    pub(crate) torn: Counter,
    pub(crate) unjournaled: Counter,
    pub(crate) journal_failures: Counter,
    pub(crate) journal_bytes: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            pending: Gauge::default(),
            flush_batches: Counter::default(),
            flush_failures: Counter::default(),
            flush_seconds: Histogram::new(exponential_buckets(0.0005, 2.0, 16)),
            flushed: Counter::default(),
            spills: Counter::default(),
            spilled: Counter::default(),
            lost: Counter::default(),
            replayed: Counter::default(),
            torn: Counter::default(),
            unjournaled: Counter::default(),
            journal_failures: Counter::default(),
            journal_bytes: Gauge::default(),
        }
    }
}

impl Metrics {
    /// Registers every series in `registry` (already under the
    /// component's name).
    pub(crate) fn register(&self, registry: &mut Registry) {
        let m = self;
        registry.register(
            "pending",
            "Updates recorded in memory, not yet in the store",
            m.pending.clone(),
        );
        registry.register(
            "flush_batches",
            "Batches applied to the store",
            m.flush_batches.clone(),
        );
        registry.register(
            "flush_failures",
            "Batches the store refused (their updates stay in memory and are retried)",
            m.flush_failures.clone(),
        );
        registry.register(
            "flush_duration_seconds",
            "Time to apply one batch",
            m.flush_seconds.clone(),
        );
        registry.register(
            "flushed",
            "Updates this process applied to the store",
            m.flushed.clone(),
        );
        registry.register(
            "spills",
            "Spill files written because the store could not take the updates at exit",
            m.spills.clone(),
        );
        registry.register(
            "spilled",
            "Updates left on disk at exit for the next start",
            m.spilled.clone(),
        );
        registry.register(
            "lost",
            "Updates kept nowhere: neither the store, a spill file nor the journal could take them",
            m.lost.clone(),
        );
        registry.register(
            "replayed",
            "Records applied from spill files and the journals of processes that died",
            m.replayed.clone(),
        );
        registry.register(
            "journal_torn_records",
            "Records of spill files and journals that failed their checksum or were cut, skipped",
            m.torn.clone(),
        );
        registry.register("journal_unjournaled", "Updates the journal could not take: kept in memory only, a process kill would lose them", m.unjournaled.clone());
        registry.register(
            "journal_failures",
            "Times the journal could not make a segment or take a record",
            m.journal_failures.clone(),
        );
        registry.register(
            "journal_bytes",
            "Disk the journal's segments take",
            m.journal_bytes.clone(),
        );
    }
}
