//! Spans ended and spans the collector took, counted: at exit their
//! difference is what was dropped — queued past the batch's capacity,
//! refused by the collector, or still waiting when the budget ran out. The
//! SDK's own shutdown would report success whatever the export did.
//!
//! The counts also say when exports start failing and when they succeed
//! again — one warning and one line, with what was dropped in between —
//! rather than an error for every batch a collector that is down refuses.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Spans in batches the collector refused, since the process started.
static REFUSED: AtomicU64 = AtomicU64::new(0);

/// Spans in batches the collector refused (down, unreachable, or answering
/// with an error), since the process started: a metric.
pub fn spans_refused() -> u64 {
    REFUSED.load(Ordering::Relaxed)
}

/// The two counts, shared by the processor and the exporter, and whether
/// exports are failing now.
#[derive(Debug, Default)]
pub(super) struct Counts {
    ended: AtomicU64,
    exported: AtomicU64,
    failing: AtomicBool,
    /// Spans refused since exports started failing.
    refused_in_outage: AtomicU64,
}

impl Counts {
    /// Spans ended (and sampled) so far, and spans the collector took.
    pub(super) fn snapshot(&self) -> (u64, u64) {
        // Exported first: a span is counted ended before it is exported.
        let exported = self.exported.load(Ordering::Acquire);
        (self.ended.load(Ordering::Acquire), exported)
    }
}

impl Counts {
    /// One span ended (and sampled).
    pub(super) fn ended(&self) {
        self.ended.fetch_add(1, Ordering::AcqRel);
    }

    /// What became of an export of `spans`: counted if the collector took
    /// them; if not, counted refused, and said once when exports start
    /// failing and once when they succeed again.
    pub(super) fn exported(&self, spans: u64, result: Result<(), String>) {
        match result {
            Ok(()) => {
                self.exported.fetch_add(spans, Ordering::AcqRel);
                if self.failing.swap(false, Ordering::AcqRel) {
                    let dropped = self.refused_in_outage.swap(0, Ordering::AcqRel);
                    tracing::info!(
                        spans_dropped = dropped,
                        "trace export recovered: the collector takes spans again"
                    );
                }
            }
            Err(error) => {
                REFUSED.fetch_add(spans, Ordering::Relaxed);
                self.refused_in_outage.fetch_add(spans, Ordering::AcqRel);
                if !self.failing.swap(true, Ordering::AcqRel) {
                    tracing::warn!(
                        %error,
                        "trace export failing: spans are dropped until the collector takes them again"
                    );
                }
            }
        }
    }
}
