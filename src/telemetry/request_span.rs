//! The request span, made the first time something needs it.
//!
//! Every request has a span, `request` (method, route, request id; once
//! answered, status and latency), so that every line it logs carries them.
//! Most requests log nothing, and making a span in `tracing-subscriber`'s
//! registry, entering it at every poll and closing it was the largest cost
//! of a request after hyper and axum themselves. A [`RequestSpan`] keeps its
//! fields instead, and becomes a span the first time anything inside the
//! request touches `tracing`: logs a line, makes or enters a span, or asks
//! for the current one (`Span::current`, `in_current_span`). Whoever looks
//! finds the span as if it had been made when the request came in, with
//! every field known by then.
//!
//! Only a subscriber wrapped in [`LazySpans`] sees that moment come; under
//! any other, a `RequestSpan` is made at once. `LazySpans` hides the
//! subscriber inside it from `Dispatch::downcast_ref`, and a layer that
//! records every span whether or not a line is logged in it (span timings,
//! an OpenTelemetry exporter) would see only the requests that logged: a
//! service that needs either builds its subscriber without `LazySpans`, and
//! gets every request's span made up front.
//!
//! With traces on ([`traces`]) the span stays lazy and carries the trace's
//! id beside the request id; the trace itself is the request's [`Edge`]: a
//! server span built straight for the exporter if the request is sampled,
//! nothing if it is not.

use std::cell::Cell;

use axum::extract::{MatchedPath, Request};
use axum::http::{HeaderValue, Method};
use tracing::level_filters::LevelFilter;
use tracing::span::{Attributes, Id, Record};
use tracing::subscriber::Interest;
use tracing::{Dispatch, Event, Metadata, Subscriber, Value};
use tracing_core::span::Current;

use opentelemetry::trace::TraceId;

// The `request` span's callsite and metadata are the traces' own
// (`traces::server::LOG_META`): one for every request whichever way its
// span is made.
use super::traces::server::{Hex, LOG_CALLSITE as CALLSITE, LOG_META as META};
use super::traces::Edge;

thread_local! {
    /// The span of the request being polled on this thread, while it is
    /// polled (see [`RequestSpan::in_scope`]).
    static POLLED: Cell<Slot> = const { Cell::new(Slot::Empty) };
}

/// A request's span, or what it will be made of.
#[derive(Debug, Default)]
enum Slot {
    #[default]
    Empty,
    /// Boxed: the slot moves into the thread and back at every poll.
    Pending(Box<Fields>),
    Made(Made),
}

impl Slot {
    fn enter(&self) {
        match self {
            Slot::Made(span) => span.enter(),
            Slot::Empty | Slot::Pending(_) => {}
        }
    }

    fn exit(&self) {
        match self {
            Slot::Made(span) => span.exit(),
            Slot::Empty | Slot::Pending(_) => {}
        }
    }
}

/// The fields of a request span not made yet, and the subscriber to make
/// it in.
#[derive(Debug)]
struct Fields {
    dispatch: Dispatch,
    method: Method,
    route: Option<MatchedPath>,
    request_id: Option<HeaderValue>,
    /// The trace, with traces on: the caller's, or a sampled request's own.
    trace_id: Option<TraceId>,
    /// Status and latency in milliseconds, once answered.
    answer: Option<(u16, f64)>,
}

impl Fields {
    /// The span, unless the subscriber does not want it (its level).
    fn make(&self) -> Made {
        let dispatch = &self.dispatch;
        if CALLSITE.interest().is_never() || !dispatch.enabled(&META) {
            return Made::none();
        }
        let fields = META.fields();
        let mut names = fields.iter();
        let fields_in_order = (
            names.next(),
            names.next(),
            names.next(),
            names.next(),
            names.next(),
            names.next(),
        );
        let (
            Some(method),
            Some(route),
            Some(request_id),
            Some(trace_id),
            Some(status),
            Some(latency_ms),
        ) = fields_in_order
        else {
            return Made::none();
        };
        let method_value = self.method.as_str();
        let route_value = self.route.as_ref().map_or("unmatched", MatchedPath::as_str);
        let id = self.request_id.as_ref().and_then(|id| id.to_str().ok());
        let id = id.unwrap_or("");
        let (status_value, latency_value) = self.answer.unzip();
        let trace_value = self.trace_id.map(|id| tracing::field::display(Hex(id)));
        let entries = [
            (&method, Some(&method_value as &dyn Value)),
            (&route, Some(&route_value as &dyn Value)),
            (&request_id, Some(&id as &dyn Value)),
            (&trace_id, trace_value.as_ref().map(|t| t as &dyn Value)),
            (&status, status_value.as_ref().map(|s| s as &dyn Value)),
            (&latency_ms, latency_value.as_ref().map(|l| l as &dyn Value)),
        ];
        let id = dispatch.new_span(&Attributes::new(&META, &fields.value_set(&entries)));
        Made {
            id: Some(id),
            dispatch: dispatch.clone(),
        }
    }
}

/// A request span made, or none (its level was off, or spans are).
#[derive(Debug)]
struct Made {
    id: Option<Id>,
    dispatch: Dispatch,
}

impl Made {
    fn none() -> Made {
        Made {
            id: None,
            dispatch: Dispatch::none(),
        }
    }

    fn enter(&self) {
        if let Some(id) = &self.id {
            self.dispatch.enter(id);
        }
    }

    fn exit(&self) {
        if let Some(id) = &self.id {
            self.dispatch.exit(id);
        }
    }
}

impl Drop for Made {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            self.dispatch.try_close(id);
        }
    }
}

/// The `request` span of one request: made when first needed under
/// [`LazySpans`], at once under any other subscriber; with traces on, the
/// request's [`Edge`] beside it.
#[derive(Debug)]
#[must_use = "a request span does nothing unless the request is polled in it"]
pub struct RequestSpan {
    slot: Slot,
    edge: Edge,
}

impl RequestSpan {
    /// The span of a request for `method` on `route` (`None`: no route
    /// matched) carrying `request_id`.
    pub fn new(
        method: &Method,
        route: Option<&MatchedPath>,
        request_id: Option<&HeaderValue>,
    ) -> RequestSpan {
        RequestSpan::with_edge(method, route, request_id, (Edge::Off, None))
    }

    /// The span of `request`, on `route`, carrying `request_id`, and its
    /// trace as decided at the edge ([`Edge::of`]): the same as
    /// [`RequestSpan::new`] with traces off.
    pub fn for_request(
        request: &Request,
        route: Option<&MatchedPath>,
        request_id: Option<&HeaderValue>,
    ) -> RequestSpan {
        let id = request_id.and_then(|id| id.to_str().ok());
        let (edge, trace_id) = Edge::of(request, route.map(MatchedPath::as_str), id);
        RequestSpan::with_edge(request.method(), route, request_id, (edge, trace_id))
    }

    fn with_edge(
        method: &Method,
        route: Option<&MatchedPath>,
        request_id: Option<&HeaderValue>,
        (edge, trace_id): (Edge, Option<TraceId>),
    ) -> RequestSpan {
        // Registered here, not when the span is made: a subscriber handling
        // a line cannot be asked about a new callsite.
        if CALLSITE.interest().is_never() {
            return RequestSpan {
                slot: Slot::Made(Made::none()),
                edge,
            };
        }
        let fields = Fields {
            dispatch: tracing::dispatcher::get_default(Dispatch::clone),
            method: method.clone(),
            route: route.cloned(),
            request_id: request_id.cloned(),
            trace_id,
            answer: None,
        };
        let slot = if fields.dispatch.is::<LazySpans>() {
            Slot::Pending(Box::new(fields))
        } else {
            Slot::Made(fields.make())
        };
        RequestSpan { slot, edge }
    }

    /// No span at all.
    pub fn none() -> RequestSpan {
        RequestSpan {
            slot: Slot::Made(Made::none()),
            edge: Edge::default(),
        }
    }

    /// `true` for [`RequestSpan::none`] (or a span its level filtered out),
    /// with no trace.
    pub fn is_none(&self) -> bool {
        matches!(&self.slot, Slot::Made(Made { id: None, .. })) && !self.edge.is_sampled()
    }

    /// Records the answer's status on the request's trace (the log span's
    /// fields come from [`record_answer`]).
    pub fn answered(&mut self, status: u16) {
        self.edge.answer(status);
    }

    /// Runs `f` inside the span: what it logs, and every span it makes or
    /// enters, is in the request's span, which is made then if it was not;
    /// and inside the request's trace.
    pub fn in_scope<R>(&mut self, f: impl FnOnce() -> R) -> R {
        let _decided = self.edge.enter();
        let slot = std::mem::take(&mut self.slot);
        // Entering makes the span of a request polled around this one first
        // (`LazySpans::enter`), so that this one's is its child.
        slot.enter();
        let Ok(mut outer) = POLLED.try_with(|polled| polled.replace(slot)) else {
            // The thread is ending and its locals are gone: run unscoped.
            return f();
        };
        if let Slot::Pending(_) = outer {
            // Polled inside another request's poll whose span is still
            // pending (this one's was not entered): made here, for the
            // same reason.
            outer = POLLED.with(|polled| {
                let this = polled.replace(outer);
                make_polled();
                polled.replace(this)
            });
        }
        let _restore = Restore {
            into: &mut self.slot,
            outer,
        };
        f()
    }
}

/// Puts the polled span back where it belongs when the scope ends, unwinding
/// included, and the thread's outer one (if a request was polled inside
/// another) back in place.
struct Restore<'a> {
    into: &'a mut Slot,
    outer: Slot,
}

impl Drop for Restore<'_> {
    fn drop(&mut self) {
        let outer = std::mem::take(&mut self.outer);
        if let Ok(mine) = POLLED.try_with(|polled| polled.replace(outer)) {
            mine.exit();
            *self.into = mine;
        }
    }
}

/// Records the answer's `status` and latency on the span of the request
/// being polled, made or not.
pub fn record_answer(status: u16, latency_ms: f64) {
    with_polled(|slot| match slot {
        Slot::Pending(fields) => fields.answer = Some((status, latency_ms)),
        Slot::Made(Made {
            id: Some(id),
            dispatch,
        }) => {
            let fields = META.fields();
            // Both in one `record`: each finds the span again.
            if let (Some(status_field), Some(latency_field)) =
                (fields.field("status"), fields.field("latency_ms"))
            {
                let entries = [
                    (&status_field, Some(&status as &dyn Value)),
                    (&latency_field, Some(&latency_ms as &dyn Value)),
                ];
                dispatch.record(id, &Record::new(&fields.value_set(&entries)));
            }
        }
        Slot::Made(_) | Slot::Empty => {}
    });
}

/// Makes the polled request's span if it is still pending, and enters it.
fn make_polled() {
    with_polled(|slot| {
        if let Slot::Pending(fields) = slot {
            let span = fields.make();
            span.enter();
            *slot = Slot::Made(span);
        }
    });
}

/// Runs `f` on the polled request's span, taken out of the thread's slot
/// meanwhile: what `f` does with `tracing` sees none (making the span does).
fn with_polled(f: impl FnOnce(&mut Slot)) {
    let Ok(mut slot) = POLLED.try_with(Cell::take) else {
        return;
    };
    f(&mut slot);
    let _ = POLLED.try_with(|polled| polled.set(slot));
}

/// A subscriber that makes a [`RequestSpan`] when something inside its
/// request first needs it: wraps the application's subscriber, and hands
/// it everything else unchanged.
pub struct LazySpans {
    inner: Box<dyn Subscriber + Send + Sync>,
}

impl LazySpans {
    /// Wraps `inner`.
    pub fn new(inner: impl Subscriber + Send + Sync) -> LazySpans {
        LazySpans {
            inner: Box::new(inner),
        }
    }
}

impl std::fmt::Debug for LazySpans {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LazySpans").finish_non_exhaustive()
    }
}

impl Subscriber for LazySpans {
    fn on_register_dispatch(&self, subscriber: &Dispatch) {
        self.inner.on_register_dispatch(subscriber);
    }

    fn register_callsite(&self, metadata: &'static Metadata<'static>) -> Interest {
        self.inner.register_callsite(metadata)
    }

    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        self.inner.enabled(metadata)
    }

    fn max_level_hint(&self) -> Option<LevelFilter> {
        self.inner.max_level_hint()
    }

    /// A span made inside a request is its child.
    fn new_span(&self, span: &Attributes<'_>) -> Id {
        if span.is_contextual() {
            make_polled();
        }
        self.inner.new_span(span)
    }

    fn record(&self, span: &Id, values: &Record<'_>) {
        self.inner.record(span, values);
    }

    fn record_follows_from(&self, span: &Id, follows: &Id) {
        self.inner.record_follows_from(span, follows);
    }

    fn event_enabled(&self, event: &Event<'_>) -> bool {
        self.inner.event_enabled(event)
    }

    /// A line logged inside a request is in its span.
    fn event(&self, event: &Event<'_>) {
        if event.is_contextual() {
            make_polled();
        }
        self.inner.event(event);
    }

    /// A span entered inside a request is entered inside its span.
    fn enter(&self, span: &Id) {
        make_polled();
        self.inner.enter(span);
    }

    fn exit(&self, span: &Id) {
        self.inner.exit(span);
    }

    fn clone_span(&self, id: &Id) -> Id {
        self.inner.clone_span(id)
    }

    #[allow(deprecated)]
    fn drop_span(&self, id: Id) {
        self.inner.drop_span(id);
    }

    fn try_close(&self, id: Id) -> bool {
        self.inner.try_close(id)
    }

    /// Asked inside a request (`Span::current`), the current span is its.
    fn current_span(&self) -> Current {
        make_polled();
        self.inner.current_span()
    }
}

#[cfg(test)]
mod tests {
    use std::fmt::Write as _;
    use std::panic::{catch_unwind, AssertUnwindSafe};
    use std::sync::{Arc, Mutex};

    use tracing::field::{Field, Visit};
    use tracing_subscriber::layer::{Context, SubscriberExt};
    use tracing_subscriber::registry::LookupSpan;
    use tracing_subscriber::Layer;

    use super::*;

    /// What reached the registry, in order: each span made, with its
    /// fields and parent, and each line, with the spans it is in.
    #[derive(Clone, Default)]
    struct Seen(Arc<Mutex<Vec<String>>>);

    struct Values(String);

    impl Visit for Values {
        fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
            let _ = write!(self.0, " {}={value:?}", field.name());
        }
    }

    impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Seen {
        fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
            let mut values = Values(format!("span {}", attrs.metadata().name()));
            attrs.record(&mut values);
            let parent = ctx.span(id).and_then(|span| span.parent());
            let parent = parent.map(|span| span.name());
            self.0
                .lock()
                .expect("lock")
                .push(format!("{} under {parent:?}", values.0));
        }

        fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
            let mut values = Values("line".to_owned());
            event.record(&mut values);
            let spans: Vec<_> = ctx
                .event_scope(event)
                .map(|scope| scope.from_root().map(|span| span.name()).collect())
                .unwrap_or_default();
            self.0
                .lock()
                .expect("lock")
                .push(format!("{} in {spans:?}", values.0));
        }
    }

    /// Runs `f` under `LazySpans` (or the bare registry) and says what the
    /// registry saw.
    fn seen(lazy: bool, f: impl FnOnce()) -> Vec<String> {
        seen_through("trace", lazy, f)
    }

    /// [`seen`], with the lines and spans `filter` (`RUST_LOG` syntax)
    /// lets through.
    fn seen_through(filter: &str, lazy: bool, f: impl FnOnce()) -> Vec<String> {
        let seen = Seen::default();
        let filter = tracing_subscriber::EnvFilter::new(filter);
        let registry = tracing_subscriber::registry()
            .with(filter)
            .with(seen.clone());
        let dispatch = if lazy {
            Dispatch::new(LazySpans::new(registry))
        } else {
            Dispatch::new(registry)
        };
        tracing::dispatcher::with_default(&dispatch, f);
        let seen = seen.0.lock().expect("lock");
        seen.clone()
    }

    fn request() -> RequestSpan {
        RequestSpan::new(&Method::GET, None, Some(&HeaderValue::from_static("an-id")))
    }

    const MADE: &str =
        r#"span request method="GET" route="unmatched" request_id="an-id" under None"#;

    #[test]
    fn a_request_that_logs_nothing_makes_no_span() {
        let seen = seen(true, || {
            let mut span = request();
            span.in_scope(|| ());
            span.in_scope(|| record_answer(200, 1.5));
        });
        assert!(seen.is_empty(), "{seen:?}");
    }

    // Made at the first line, with every field known by then, the answer's
    // included; the next poll's line is in the same span; after the poll
    // (or a panic inside it) the thread is out of the request.
    #[test]
    fn a_line_logged_inside_a_request_is_in_its_span() {
        let seen = seen(true, || {
            let mut span = request();
            span.in_scope(|| ());
            span.in_scope(|| {
                record_answer(404, 2.5);
                tracing::info!("first");
            });
            span.in_scope(|| tracing::info!("second"));
            let panicked = catch_unwind(AssertUnwindSafe(|| span.in_scope(|| panic!("boom"))));
            assert!(panicked.is_err());
            tracing::info!("after");
        });
        let made = MADE.replace(" under", " status=404 latency_ms=2.5 under");
        assert_eq!(
            seen,
            [
                made.as_str(),
                r#"line message=first in ["request"]"#,
                r#"line message=second in ["request"]"#,
                "line message=after in []",
            ]
        );
    }

    // `Span::current` (what `in_current_span` asks) and a span made inside
    // the request find the request's span, made for them.
    #[test]
    fn a_request_asked_for_its_span_makes_it() {
        let seen = seen(true, || {
            let mut span = request();
            let current = span.in_scope(tracing::Span::current);
            current.in_scope(|| tracing::info!("handed off"));
            let mut other = request();
            other.in_scope(|| {
                let _child = tracing::info_span!("child").entered();
                tracing::info!("in child");
            });
        });
        assert_eq!(
            seen,
            [
                MADE,
                r#"line message=handed off in ["request"]"#,
                MADE,
                "span child under Some(\"request\")",
                r#"line message=in child in ["request", "child"]"#,
            ]
        );
    }

    // A span made elsewhere and entered inside the request does not become
    // the parent of the request's span, as it would not have been had the
    // span been made up front.
    #[test]
    fn a_span_entered_inside_a_request_does_not_adopt_it() {
        let seen = seen(true, || {
            let outside = tracing::info_span!("outside");
            let mut span = request();
            span.in_scope(|| {
                let _entered = outside.enter();
                let _child = tracing::info_span!("child").entered();
            });
        });
        assert_eq!(
            seen,
            [
                "span outside under None",
                MADE,
                "span child under Some(\"outside\")"
            ]
        );
    }

    // Filtered to warnings, as a quiet production service may be: a
    // warning a request logs still carries its fields, lazily or not.
    #[test]
    fn a_warning_is_in_the_request_span_whatever_the_filter() {
        for lazy in [true, false] {
            let seen = seen_through("warn", lazy, || {
                let mut span = request();
                span.in_scope(|| {
                    tracing::info!("filtered out");
                    tracing::warn!("kept");
                });
            });
            let kept = r#"line message=kept in ["request"]"#;
            assert_eq!(seen, [MADE, kept], "lazy: {lazy}");
        }
    }

    // An in-process request polled inside another's poll: its span is the
    // child of the outer request's, as it was when spans were made up front.
    #[test]
    fn a_request_polled_inside_another_is_its_child() {
        let seen = seen(true, || {
            let mut outer = request();
            let mut inner = RequestSpan::new(&Method::GET, None, None);
            outer.in_scope(|| inner.in_scope(|| tracing::info!("inner")));
        });
        let inner =
            r#"span request method="GET" route="unmatched" request_id="" under Some("request")"#;
        let line = r#"line message=inner in ["request", "request"]"#;
        assert_eq!(seen, [MADE, inner, line]);
    }

    #[test]
    fn under_another_subscriber_the_span_is_made_at_once() {
        let seen = seen(false, || {
            let mut span = request();
            span.in_scope(|| tracing::info!("line"));
        });
        assert_eq!(seen, [MADE, r#"line message=line in ["request"]"#]);
    }
}
