//! Logging: `tracing` to stdout, as text or JSON, filtered by `RUST_LOG`
//! (default `info`). A request's span is made only when something inside
//! the request needs it ([`request_span`]) — unless traces are exported
//! ([`traces`]): then every request's span is made, and exported.

pub mod request_span;
pub mod traces;

use std::io::IsTerminal;

use clap::ValueEnum;
use tracing_subscriber::filter::{filter_fn, FilterExt};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{fmt, EnvFilter, Layer};

pub use request_span::{LazySpans, RequestSpan};
pub use traces::Traces;

/// Log line format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// What the trace exporter takes: [`Traces::FILTER`], less the request spans
/// of routes left out of traces (probes, scrapes: `Stack::untraced`), which
/// are made with the logs' own callsite.
fn exported<S>() -> impl tracing_subscriber::layer::Filter<S> {
    Traces::FILTER.and(filter_fn(|metadata| !request_span::is_logs_only(metadata)))
}

/// The log lines' layer, for a subscriber of any shape.
fn text_layer<S>() -> fmt::Layer<S> {
    fmt::layer()
        .with_target(true)
        .with_ansi(std::io::stdout().is_terminal())
}

/// Installs the global subscriber: logs, and `traces` if they are on.
/// Call once, before anything logs.
pub fn init(format: LogFormat, traces: Option<&Traces>) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    // `try_init` fails only if a subscriber is already set (tests): keep it.
    let _ = match (traces, format) {
        (None, LogFormat::Text) => LazySpans::new(
            tracing_subscriber::registry()
                .with(filter)
                .with(text_layer()),
        )
        .try_init(),
        (None, LogFormat::Json) => {
            let json = text_layer().json().flatten_event(true);
            LazySpans::new(tracing_subscriber::registry().with(filter).with(json)).try_init()
        }
        // Every span made, for the exporter: the filter is the logs' alone.
        (Some(traces), LogFormat::Text) => {
            let logs = text_layer()
                .fmt_fields(traces::fields::TextFields)
                .with_filter(filter);
            let registry = tracing_subscriber::registry().with(logs);
            registry
                .with(traces.layer().with_filter(exported()))
                .try_init()
        }
        (Some(traces), LogFormat::Json) => {
            let json = text_layer()
                .json()
                .flatten_event(true)
                .fmt_fields(traces::fields::JsonFields);
            let registry = tracing_subscriber::registry().with(json.with_filter(filter));
            registry
                .with(traces.layer().with_filter(exported()))
                .try_init()
        }
    };
}
