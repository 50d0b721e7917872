//! With traces on, the subscriber's one filter: the logs' (`RUST_LOG`),
//! widened to the spans the exporter takes.
//!
//! The log lines and the exporter want different things: the lines what
//! `RUST_LOG` names, the exporter every span of [`Traces::FILTER`] and
//! above but a request's log span ([`super::exported`]). Given a
//! per-layer filter each, both filters are asked about every span at its
//! every entry and exit, a look-up in the registry each — four for each
//! command a request's log span follows into the database driver's
//! thread. Here the logs' filter is the subscriber's own, and lets the
//! exported spans through as well: the log lines' layer has no filter of
//! its own, the exporter keeps its per-layer one. What that changes: a
//! line's span context may name an exported span whose level `RUST_LOG`
//! leaves out (under `RUST_LOG=warn`, the `INFO` span of the flush a
//! warning was logged in); no line is written that was not before.
//!
//! [`Traces::FILTER`]: super::Traces::FILTER

use tracing::span::{Attributes, Id, Record};
use tracing::subscriber::Interest;
use tracing::{Event, Metadata, Subscriber};
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
