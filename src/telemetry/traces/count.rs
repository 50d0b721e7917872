//! Spans ended and spans the collector took, counted: at exit their
//! difference is what was dropped — queued past the batch's capacity,
//! refused by the collector, or still waiting when the budget ran out. The
//! SDK's own shutdown reports success whatever the export did.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use opentelemetry::Context;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{Span, SpanData, SpanExporter, SpanProcessor};
use opentelemetry_sdk::Resource;

/// The two counts, shared by the processor and the exporter.
#[derive(Debug, Default)]
pub(super) struct Counts {
    ended: AtomicU64,
    exported: AtomicU64,
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
        if result.is_ok() {
            self.counts.exported.fetch_add(spans, Ordering::AcqRel);
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
