//! Span fields formatted when a line needs them, not when the span is made.
//!
//! `tracing_subscriber`'s fmt layer formats a span's fields into a string
//! the moment the span is created, and again at every `record`, so that a
//! later log line can print them. Every request has a span (method, route,
//! request id, status, latency), and most requests log nothing: at `info`
//! that formatting was a seventh of the instructions a request cost.
//! [`Deferred`] wraps the fmt layer: a new span's values are kept as they
//! are, and handed to the fmt layer the first time an event inside the
//! span is logged. What is printed does not change.
//!
//! It relies on what the fmt layer does with a span before its first line:
//! with span events off (the default, `FmtSpan::NONE`), only formatting the
//! fields, which is what is deferred.

use std::sync::{Arc, Mutex, PoisonError};

use tracing::field::{display, Field, Value, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata, Subscriber};
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::{LookupSpan, SpanRef};
use tracing_subscriber::Layer;

/// The most fields a span may have for its formatting to be deferred (a
/// `ValueSet` is built from an array of at most this many); a span with
/// more is formatted at once.
const MAX_FIELDS: usize = 32;

/// Wraps a fmt layer (`inner`) so that span fields are formatted only when
/// an event inside the span is written.
#[derive(Debug)]
pub struct Deferred<L> {
    inner: L,
}

impl<L> Deferred<L> {
    /// Defers `inner`'s formatting of span fields.
    pub fn new(inner: L) -> Deferred<L> {
        Deferred { inner }
    }
}

/// A span's deferred values, in its extensions; `None` once handed over.
/// Handing over happens under the mutex, not under the span's extensions
/// (which the fmt layer takes), so that a line logged at the same moment on
/// another thread waits for the fields instead of printing without them.
#[derive(Clone, Debug)]
struct Deferral(Arc<Mutex<Option<Pending>>>);

impl Deferral {
    fn of<S>(span: &SpanRef<'_, S>) -> Option<Deferral>
    where
        S: for<'a> LookupSpan<'a>,
    {
        span.extensions().get::<Deferral>().cloned()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Pending>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A span's values, kept until a line needs them: the text of every string
/// value in one buffer, so that keeping a span's fields costs two
/// allocations, not one per field.
#[derive(Debug, Default)]
struct Pending {
    values: Vec<(Field, Owned)>,
    text: String,
}

/// A field's value, owned.
#[derive(Debug)]
enum Owned {
    /// A string, at this range of [`Pending::text`].
    Str(std::ops::Range<usize>),
    /// A `Debug` or `Display` value, formatted (it may borrow what the span
    /// outlives), at this range of [`Pending::text`].
    Text(std::ops::Range<usize>),
    I64(i64),
    U64(u64),
    F64(f64),
    Bool(bool),
}

impl Visit for Pending {
    fn record_str(&mut self, field: &Field, value: &str) {
        let start = self.text.len();
        self.text.push_str(value);
        self.set(field, Owned::Str(start..self.text.len()));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        use std::fmt::Write as _;
        let start = self.text.len();
        let _ = write!(self.text, "{value:?}");
        self.set(field, Owned::Text(start..self.text.len()));
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.set(field, Owned::I64(value));
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.set(field, Owned::U64(value));
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        self.set(field, Owned::F64(value));
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.set(field, Owned::Bool(value));
    }
}

impl Pending {
    /// Keeps `value` for `field`, replacing an earlier one (a `record`
    /// after creation).
    fn set(&mut self, field: &Field, value: Owned) {
        match self.values.iter_mut().find(|(kept, _)| kept == field) {
            Some((_, kept)) => *kept = value,
            None => self.values.push((field.clone(), value)),
        }
    }

    /// Hands the values to `f` as the `ValueSet` of `metadata`'s fields.
    fn with_value_set<R>(
        &self,
        metadata: &'static Metadata<'static>,
        f: impl FnOnce(&tracing::field::ValueSet<'_>) -> R,
    ) -> Option<R> {
        let values: Vec<Box<dyn Value + '_>> = self
            .values
            .iter()
            .map(|(_, value)| -> Box<dyn Value + '_> {
                match value {
                    Owned::Str(range) => Box::new(&self.text[range.clone()]),
                    Owned::Text(range) => Box::new(display(&self.text[range.clone()])),
                    Owned::I64(n) => Box::new(*n),
                    Owned::U64(n) => Box::new(*n),
                    Owned::F64(n) => Box::new(*n),
                    Owned::Bool(b) => Box::new(*b),
                }
            })
            .collect();
        let padding = metadata.fields().iter().next()?;
        let mut entries: [(&Field, Option<&dyn Value>); MAX_FIELDS] =
            [(&padding, None); MAX_FIELDS];
        for (entry, ((field, _), value)) in entries.iter_mut().zip(self.values.iter().zip(&values))
        {
            *entry = (field, Some(&**value));
        }
        Some(f(&metadata.fields().value_set(&entries)))
    }
}

impl<S, L> Layer<S> for Deferred<L>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    L: Layer<S>,
{
    fn on_register_dispatch(&self, subscriber: &tracing::Dispatch) {
        self.inner.on_register_dispatch(subscriber);
    }

    fn on_layer(&mut self, subscriber: &mut S) {
        self.inner.on_layer(subscriber);
    }

    fn register_callsite(
        &self,
        metadata: &'static Metadata<'static>,
    ) -> tracing::subscriber::Interest {
        self.inner.register_callsite(metadata)
    }

    fn enabled(&self, metadata: &Metadata<'_>, ctx: Context<'_, S>) -> bool {
        self.inner.enabled(metadata, ctx)
    }

    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let fields = attrs.metadata().fields();
        let deferrable = !fields.is_empty() && fields.len() <= MAX_FIELDS;
        let (Some(span), true) = (ctx.span(id), deferrable) else {
            return self.inner.on_new_span(attrs, id, ctx);
        };
        let mut pending = Pending {
            values: Vec::with_capacity(fields.len()),
            text: String::with_capacity(64),
        };
        attrs.record(&mut pending);
        let deferral = Deferral(Arc::new(Mutex::new(Some(pending))));
        span.extensions_mut().insert(deferral);
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        if let Some(deferral) = ctx.span(id).as_ref().and_then(Deferral::of) {
            if let Some(pending) = deferral.lock().as_mut() {
                values.record(pending);
                return;
            }
        }
        self.inner.on_record(id, values, ctx);
    }

    fn on_follows_from(&self, span: &Id, follows: &Id, ctx: Context<'_, S>) {
        self.inner.on_follows_from(span, follows, ctx);
    }

    fn event_enabled(&self, event: &Event<'_>, ctx: Context<'_, S>) -> bool {
        self.inner.event_enabled(event, ctx)
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        // The spans the line will print, root first, as the fmt layer would
        // have seen them made.
        if let Some(scope) = ctx.event_scope(event) {
            for span in scope.from_root() {
                let Some(deferral) = Deferral::of(&span) else {
                    continue;
                };
                let mut slot = deferral.lock();
                if let Some(pending) = slot.take() {
                    let metadata = span.metadata();
                    // `on_new_span` deferred only spans with fields.
                    let _ = pending.with_value_set(metadata, |values| {
                        let attrs = Attributes::new(metadata, values);
                        self.inner.on_new_span(&attrs, &span.id(), ctx.clone());
                    });
                }
            }
        }
        self.inner.on_event(event, ctx);
    }

    fn on_enter(&self, id: &Id, ctx: Context<'_, S>) {
        self.inner.on_enter(id, ctx);
    }

    fn on_exit(&self, id: &Id, ctx: Context<'_, S>) {
        self.inner.on_exit(id, ctx);
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        self.inner.on_close(id, ctx);
    }

    fn on_id_change(&self, old: &Id, new: &Id, ctx: Context<'_, S>) {
        self.inner.on_id_change(old, new, ctx);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use tracing::field::Empty;
    use tracing_subscriber::field::RecordFields;
    use tracing_subscriber::fmt::format::{DefaultFields, Writer};
    use tracing_subscriber::fmt::{self, FormatFields, MakeWriter};
    use tracing_subscriber::layer::SubscriberExt;

    use super::*;

    /// Everything written, for comparing.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl Captured {
        fn text(&self) -> String {
            String::from_utf8(self.0.lock().expect("lock").clone()).expect("utf-8")
        }
    }

    impl std::io::Write for Captured {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().expect("lock").extend_from_slice(bytes);
            Ok(bytes.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Captured {
        type Writer = Captured;

        fn make_writer(&'a self) -> Captured {
            self.clone()
        }
    }

    /// `DefaultFields`, counting the spans and events it formats.
    #[derive(Clone, Default)]
    struct Counting(Arc<AtomicUsize>);

    impl<'w> FormatFields<'w> for Counting {
        fn format_fields<R: RecordFields>(
            &self,
            writer: Writer<'w>,
            fields: R,
        ) -> std::fmt::Result {
            self.0.fetch_add(1, Ordering::Relaxed);
            DefaultFields::new().format_fields(writer, fields)
        }
    }

    /// A request's span, as the stack makes it, and what is logged in it.
    fn log_a_request() {
        let outer = tracing::info_span!("connection", peer = %"127.0.0.1:4000", tls = false);
        let _outer = outer.enter();
        let span = tracing::info_span!(
            "request",
            method = "GET",
            route = "/{code}",
            request_id = "0b5d…",
            status = Empty,
            latency_ms = Empty,
        );
        span.record("status", 307_u16);
        span.record("latency_ms", 0.25_f64);
        span.in_scope(|| tracing::info!(hits = 3, "redirected"));
        span.record("latency_ms", 0.5_f64);
        span.in_scope(|| tracing::warn!(error = "late", "after the answer"));
        let quiet = tracing::info_span!("quiet", n = 1);
        quiet.in_scope(|| {});
    }

    fn text_of(deferred: bool, json: bool) -> String {
        let out = Captured::default();
        let layer = fmt::layer()
            .without_time()
            .with_ansi(false)
            .with_writer(out.clone());
        let dispatch: tracing::Dispatch = match (deferred, json) {
            (false, false) => tracing_subscriber::registry().with(layer).into(),
            (true, false) => tracing_subscriber::registry()
                .with(Deferred::new(layer))
                .into(),
            (false, true) => tracing_subscriber::registry().with(layer.json()).into(),
            (true, true) => tracing_subscriber::registry()
                .with(Deferred::new(layer.json()))
                .into(),
        };
        tracing::dispatcher::with_default(&dispatch, log_a_request);
        out.text()
    }

    #[test]
    fn the_lines_are_the_same_as_without_deferral_in_text_and_json() {
        for json in [false, true] {
            let eager = text_of(false, json);
            assert!(eager.contains("request_id"), "{eager}");
            assert!(eager.contains("hits"), "{eager}");
            assert_eq!(text_of(true, json), eager, "json: {json}");
        }
    }

    #[test]
    fn a_span_without_a_line_is_never_formatted() {
        let counting = Counting::default();
        let layer = fmt::layer()
            .fmt_fields(counting.clone())
            .with_writer(Captured::default());
        let subscriber = tracing_subscriber::registry().with(Deferred::new(layer));
        tracing::subscriber::with_default(subscriber, || {
            for _ in 0..10 {
                let span = tracing::info_span!("request", request_id = "x", status = Empty);
                span.record("status", 200_u16);
                span.in_scope(|| tracing::info!("inside"));
            }
            assert_eq!(
                counting.0.load(Ordering::Relaxed),
                10 * 2,
                "a span and an event each"
            );
            let span = tracing::info_span!("request", request_id = "y", status = Empty);
            span.record("status", 200_u16);
            drop(span);
        });
        assert_eq!(counting.0.load(Ordering::Relaxed), 20);
    }
}
