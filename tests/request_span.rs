//! The request span under a process's only subscriber, set as the thread's
//! default: alone in its test binary, because what it guards happens once
//! per process. `tracing` registers a callsite the first time it is used,
//! asking every subscriber; with one subscriber it asks the current one,
//! which is nobody while a line is being handled. A request span first made
//! for a line was then registered as wanted by no one, and never made.

use std::sync::{Arc, Mutex};

use axum::http::Method;
use lameduck::telemetry::{LazySpans, RequestSpan};
use tracing::Subscriber;
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

/// The names of the spans each line was logged in.
#[derive(Clone, Default)]
struct SpansOfLines(Arc<Mutex<Vec<Vec<&'static str>>>>);

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for SpansOfLines {
    fn on_event(&self, event: &tracing::Event<'_>, ctx: Context<'_, S>) {
        let spans = ctx
            .event_scope(event)
            .map(|scope| scope.from_root().map(|span| span.name()).collect())
            .unwrap_or_default();
        self.0.lock().expect("lock").push(spans);
    }
}

#[test]
fn the_first_request_span_ever_made_for_a_line_is_made() {
    let lines = SpansOfLines::default();
    let subscriber = LazySpans::new(tracing_subscriber::registry().with(lines.clone()));
    let _default = tracing::subscriber::set_default(subscriber);
    let mut span = RequestSpan::new(&Method::GET, None, None);
    span.in_scope(|| tracing::info!("the request's first line"));
    assert_eq!(*lines.0.lock().expect("lock"), [["request"]]);
}
