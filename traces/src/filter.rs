//! With traces on, who sees which span: the subscriber's one filter, the
//! logs' (`RUST_LOG`) widened to the spans the exporter takes
//! ([`admitted`]), and the exporter's layer, shown only those
//! ([`Exports`]).
//!
//! The log lines and the exporter want different things: the lines what
//! `RUST_LOG` names, the exporter every span of [`Traces::FILTER`] and
//! above but a request's log span ([`exported_span`]). Given a
//! per-layer filter each, both filters are asked about every span at its
//! every entry and exit, a look-up in the registry each — four for each
//! command a request's log span follows into the database driver's
//! thread. Here neither has one: the logs' filter is the subscriber's own,
//! and lets the exported spans through as well; the exporter's layer
//! tells its spans apart when they are made. What that changes: a line's
//! span context may name an exported span whose level `RUST_LOG` leaves
//! out (under `RUST_LOG=warn`, the `INFO` span of the flush a warning was
//! logged in); no line is written that was not before.
//!
//! [`Traces::FILTER`]: super::Traces::FILTER

use std::any::TypeId;
use std::sync::atomic::{AtomicUsize, Ordering};

use tracing::span::{Attributes, Id, Record};
use tracing::subscriber::Interest;
use tracing::{Dispatch, Event, Metadata, Subscriber};
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::layer::{Context, Filter, Layer};
use tracing_subscriber::registry::LookupSpan;

use super::{server, Traces};

/// The subscriber's filter with traces on: what `logs` lets through, and
/// the spans exported ([`admitted`]).
#[derive(Debug)]
pub struct Admitted<F> {
    logs: F,
}

/// `logs` (the logs' filter, `RUST_LOG`'s), widened to every span the
/// exporter takes: add it to the subscriber as a layer, ahead of the log
/// lines' layer, which then needs no filter of its own.
pub fn admitted<F>(logs: F) -> Admitted<F> {
    Admitted { logs }
}

/// A span the exporter takes: [`Traces::FILTER`] and above, not a
/// request's log span.
fn exported_span(metadata: &Metadata<'_>) -> bool {
    metadata.is_span() && Traces::FILTER >= *metadata.level() && !server::is_log_span(metadata)
}

impl<S, F> Layer<S> for Admitted<F>
where
    S: Subscriber + for<'span> LookupSpan<'span>,
    F: Filter<S> + 'static,
{
    fn register_callsite(&self, metadata: &'static Metadata<'static>) -> Interest {
        // Asked whatever the answer: the logs' filter keeps its state of
        // callsites.
        let logs = self.logs.callsite_enabled(metadata);
        if exported_span(metadata) {
            Interest::always()
        } else {
            logs
        }
    }

    fn enabled(&self, metadata: &Metadata<'_>, cx: Context<'_, S>) -> bool {
        exported_span(metadata) || self.logs.enabled(metadata, &cx)
    }

    fn event_enabled(&self, event: &Event<'_>, cx: Context<'_, S>) -> bool {
        self.logs.event_enabled(event, &cx)
    }

    fn max_level_hint(&self) -> Option<LevelFilter> {
        // `None` is no bound at all.
        let logs = self.logs.max_level_hint()?;
        Some(logs.max(Traces::FILTER))
    }

    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, cx: Context<'_, S>) {
        self.logs.on_new_span(attrs, id, cx);
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, cx: Context<'_, S>) {
        self.logs.on_record(id, values, cx);
    }

    fn on_enter(&self, id: &Id, cx: Context<'_, S>) {
        self.logs.on_enter(id, cx);
    }

    fn on_exit(&self, id: &Id, cx: Context<'_, S>) {
        self.logs.on_exit(id, cx);
    }

    fn on_close(&self, id: Id, cx: Context<'_, S>) {
        self.logs.on_close(id, cx);
    }
}

/// The exporter's layer, `inner`, handed only the spans exported
/// ([`exported_span`]): what a per-layer filter would do, at a fraction of
/// its cost.
///
/// A per-layer filter looks each span up in the registry at its every
/// entry and exit, for the filter's answer: the request's log span, which
/// the exporter never takes, is looked up each time it follows a command
/// into the database driver's thread — about 1,300 instructions of the
/// link shown, whether or not the request is sampled. Here a span is
/// told apart by its metadata when it is made, and the exported ones are
/// counted: while none is open, which is nearly always, entries, exits,
/// records and closes are not handed on at all. While one is, they all
/// are, and the exporter finds nothing of its own on the others; a close
/// is looked up then, to count.
///
/// A line is handed on if the span it is in is exported: a line logged
/// in a span left out (a `DEBUG` span under `RUST_LOG=debug`) is no event
/// of an exported span around it, where a per-layer filter would have
/// made it one.
#[derive(Debug)]
pub struct Exports<L> {
    inner: L,
    /// How many exported spans are open.
    open: AtomicUsize,
}

impl<L> Exports<L> {
    /// `inner`, shown only the spans exported.
    pub(super) fn new(inner: L) -> Exports<L> {
        Exports {
            inner,
            open: AtomicUsize::new(0),
        }
    }

    /// `true` while an exported span is open.
    #[inline]
    fn any_open(&self) -> bool {
        self.open.load(Ordering::Relaxed) > 0
    }
}

impl<S, L> Layer<S> for Exports<L>
where
    S: Subscriber + for<'span> LookupSpan<'span>,
    L: Layer<S>,
{
    fn on_register_dispatch(&self, subscriber: &Dispatch) {
        self.inner.on_register_dispatch(subscriber);
    }

    fn on_layer(&mut self, subscriber: &mut S) {
        self.inner.on_layer(subscriber);
    }

    // No `register_callsite` or `enabled`: the layer takes what it is
    // given and leaves the rest to the subscriber's filter, which must let
    // the spans exported through (`admitted`).

    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, cx: Context<'_, S>) {
        if exported_span(attrs.metadata()) {
            // Counted before the span can be entered anywhere: whoever
            // enters it was handed it after this.
            self.open.fetch_add(1, Ordering::Relaxed);
            self.inner.on_new_span(attrs, id, cx);
        }
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, cx: Context<'_, S>) {
        if self.any_open() {
            self.inner.on_record(id, values, cx);
        }
    }

    fn on_follows_from(&self, id: &Id, follows: &Id, cx: Context<'_, S>) {
        if self.any_open() {
            self.inner.on_follows_from(id, follows, cx);
        }
    }

    fn on_event(&self, event: &Event<'_>, cx: Context<'_, S>) {
        if !self.any_open() || *event.metadata().level() > Traces::FILTER {
            return;
        }
        let span = match event.parent() {
            Some(parent) => cx.metadata(parent),
            None if event.is_contextual() => cx.current_span().metadata(),
            None => None,
        };
        if span.is_some_and(exported_span) {
            self.inner.on_event(event, cx);
        }
    }

    fn on_enter(&self, id: &Id, cx: Context<'_, S>) {
        if self.any_open() {
            self.inner.on_enter(id, cx);
        }
    }

    fn on_exit(&self, id: &Id, cx: Context<'_, S>) {
        if self.any_open() {
            self.inner.on_exit(id, cx);
        }
    }

    fn on_close(&self, id: Id, cx: Context<'_, S>) {
        if self.any_open() && cx.metadata(&id).is_some_and(exported_span) {
            self.inner.on_close(id, cx);
            self.open.fetch_sub(1, Ordering::Relaxed);
        }
    }

    // Handed on, so that `Dispatch::downcast_ref` finds the exporter's
    // layer, as `OpenTelemetrySpanExt` looks for it, through this one.
    #[allow(unsafe_code)]
    unsafe fn downcast_raw(&self, id: TypeId) -> Option<*const ()> {
        if id == TypeId::of::<Self>() {
            return Some(std::ptr::from_ref(self).cast());
        }
        // SAFETY: the contract is the caller's, handed on as it came to
        // the layer inside, which lives as long as `self`.
        unsafe { self.inner.downcast_raw(id) }
    }
}

#[cfg(test)]
mod tests {
    use opentelemetry::trace::{SpanId, Status, TracerProvider as _};
    use opentelemetry_sdk::trace::SdkTracerProvider;
    use tracing_subscriber::layer::SubscriberExt;

    use super::*;
    use crate::server::{LOG_CALLSITE, LOG_META};
    use crate::testing::Ended;

    /// A request's log span, as the service makes it.
    fn log_span() -> tracing::Span {
        assert!(!LOG_CALLSITE.interest().is_never());
        tracing::Span::new(&LOG_META, &LOG_META.fields().value_set(&[]))
    }

    // What a per-layer filter gave the exporter, it still gets: the spans
    // exported, their parents, their lines, a failure (`crate::fail`), and
    // nothing of a log span or of a span below `Traces::FILTER`, entered in
    // between or not.
    #[test]
    fn the_exporter_gets_its_spans_and_nothing_else() {
        let ended = Ended::default();
        let provider = SdkTracerProvider::builder()
            .with_span_processor(ended.clone())
            .build();
        let exports = Exports::new(
            tracing_opentelemetry::layer()
                .with_tracer(provider.tracer("test"))
                .with_tracked_inactivity(false),
        );
        // No filter at all: every span is made, as under `RUST_LOG=trace`.
        let subscriber = tracing_subscriber::registry().with(exports);
        tracing::subscriber::with_default(subscriber, || {
            // No exported span open: the log span's entries go nowhere.
            log_span().in_scope(|| tracing::info!("in a request"));
            let flush = tracing::info_span!("flush");
            flush.in_scope(|| {
                tracing::info!("applied");
                tracing::debug!("not an event");
                // One open: a log span followed into another thread, and a
                // `DEBUG` span, entered in between.
                log_span().in_scope(|| {
                    tracing::warn!("a request's line");
                    tracing::debug_span!("driver").in_scope(|| {
                        let database = tracing::info_span!(
                            "database",
                            error.type = tracing::field::Empty,
                            otel.status_description = tracing::field::Empty,
                        );
                        crate::fail(&database, "kind", &"it failed");
                    });
                });
            });
            drop(flush);
            // None open again.
            log_span().in_scope(|| tracing::info!("in a request"));
        });
        let ended = ended.spans();
        let names: Vec<_> = ended.iter().map(|span| span.name.as_ref()).collect();
        assert_eq!(names, ["database", "flush"]);
        let (database, flush) = (&ended[0], &ended[1]);
        assert_eq!(flush.parent_span_id, SpanId::INVALID);
        assert_eq!(
            database.parent_span_id,
            flush.span_context.span_id(),
            "the flush is the database call's parent"
        );
        assert_eq!(database.status, Status::error("it failed"));
        let kind = opentelemetry::KeyValue::new("error.type", "kind");
        assert!(database.attributes.contains(&kind), "{database:?}");
        let events: Vec<_> = flush.events.iter().map(|e| e.name.as_ref()).collect();
        assert_eq!(events, ["applied"], "the flush's own lines, INFO and above");
        assert!(database.events.is_empty());
    }

    // Spans that close on other threads while others are made: the count
    // of those open comes back to none, so that the log spans entered
    // after cost the exporter nothing again. And the layer inside is found
    // through this one, as `OpenTelemetrySpanExt` looks for the exporter's.
    #[test]
    fn the_count_of_exported_spans_open_comes_back_to_none() {
        type Counting = Exports<tracing_subscriber::layer::Identity>;
        let exports = Counting::new(tracing_subscriber::layer::Identity::new());
        let dispatch = Dispatch::new(tracing_subscriber::registry().with(exports));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let dispatch = dispatch.clone();
                std::thread::spawn(move || {
                    tracing::dispatcher::with_default(&dispatch, || {
                        for _ in 0..100 {
                            let flush = tracing::info_span!("flush");
                            let copy = flush.clone();
                            let _ = std::thread::spawn(move || drop(copy)).join();
                            log_span().in_scope(|| drop(flush));
                        }
                    });
                })
            })
            .collect();
        for thread in threads {
            thread.join().expect("no panic");
        }
        let exports = dispatch.downcast_ref::<Counting>().expect("found");
        assert!(!exports.any_open());
        let inside = dispatch.downcast_ref::<tracing_subscriber::layer::Identity>();
        assert!(inside.is_some(), "the layer inside is found through it");
    }
}
