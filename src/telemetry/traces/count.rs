//! Spans ended and spans the collector took, counted: at exit their
//! difference is what was dropped — queued past the batch's capacity,
//! refused by the collector, or still waiting when the budget ran out. The
//! SDK's own shutdown reports success whatever the export did.
//!
//! The exporter also says when exports start failing and when they succeed
//! again — one warning and one line, with what was dropped in between —
//! instead of the SDK's error for every batch a collector that is down
//! refuses ([`is_per_batch_error`]).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use opentelemetry::Context;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{Span, SpanData, SpanExporter, SpanProcessor};
use opentelemetry_sdk::Resource;

/// Spans in batches the collector refused, since the process started.
static REFUSED: AtomicU64 = AtomicU64::new(0);

/// Spans in batches the collector refused (down, unreachable, or answering
/// with an error), since the process started: a metric.
pub fn spans_refused() -> u64 {
    REFUSED.load(Ordering::Relaxed)
}

/// Whether `metadata` is the SDK's own error for one batch that failed to
/// export, which the exporter reports by itself when exports start and
/// stop failing: the logs leave it out.
pub(super) fn is_per_batch_error(metadata: &tracing::Metadata<'_>) -> bool {
    metadata.name() == "BatchSpanProcessor.ExportError"
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

/// A processor or exporter that counts what passes through it.
#[derive(Debug)]
pub(super) struct Counted<T> {
    inner: T,
    counts: Arc<Counts>,
}

impl<E: SpanExporter> Counted<E> {
    /// Counts the spans `exporter` delivers.
    pub(super) fn exporter(exporter: E, counts: &Arc<Counts>) -> Counted<E> {
        Counted {
            inner: exporter,
            counts: Arc::clone(counts),
        }
    }
}

impl<P: SpanProcessor> Counted<P> {
    /// Counts the spans that end into `processor`.
    pub(super) fn processor(processor: P, counts: &Arc<Counts>) -> Counted<P> {
        Counted {
            inner: processor,
            counts: Arc::clone(counts),
        }
    }
}

impl<E: SpanExporter> SpanExporter for Counted<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let spans = batch.len() as u64;
        let result = self.inner.export(batch).await;
        let counts = &*self.counts;
        match &result {
            Ok(()) => {
                counts.exported.fetch_add(spans, Ordering::AcqRel);
                if counts.failing.swap(false, Ordering::AcqRel) {
                    let dropped = counts.refused_in_outage.swap(0, Ordering::AcqRel);
                    tracing::info!(
                        spans_dropped = dropped,
                        "trace export recovered: the collector takes spans again"
                    );
                }
            }
            Err(error) => {
                REFUSED.fetch_add(spans, Ordering::Relaxed);
                counts.refused_in_outage.fetch_add(spans, Ordering::AcqRel);
                if !counts.failing.swap(true, Ordering::AcqRel) {
                    tracing::warn!(
                        %error,
                        "trace export failing: spans are dropped until the collector takes them again"
                    );
                }
            }
        }
        result
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

impl<P: SpanProcessor> SpanProcessor for Counted<P> {
    fn on_start(&self, span: &mut Span, cx: &Context) {
        self.inner.on_start(span, cx);
    }

    fn on_end(&self, span: SpanData) {
        self.counts.ended.fetch_add(1, Ordering::AcqRel);
        self.inner.on_end(span);
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}
