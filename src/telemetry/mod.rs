//! Logging: `tracing` to stdout, as text or JSON, filtered by `RUST_LOG`
//! (default `info`). A request's span is made only when something inside
//! the request needs it ([`request_span`]), traces on or off: a request's
//! trace is its server span, decided and built apart ([`traces::Edge`]).

pub mod request_span;
/// The traces crate (`traces/`), where the service has always had it.
pub use lameduck_traces as traces;

use std::io::IsTerminal;

use tracing_subscriber::filter::FilterExt;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::Layer as _;
use tracing_subscriber::{fmt, EnvFilter};

pub use request_span::{LazySpans, RequestSpan};
pub use traces::Traces;

use traces::fields::TextFields;

/// Log line format (`--log-format`), from the service crate.
pub use lameduck_service::LogFormat;

/// The log lines' layer, for a subscriber of any shape: the stock text
/// format, its fields written by [`traces::fields::TextFields`], traces on
/// or off.
fn text_layer<S>() -> fmt::Layer<S, TextFields> {
    fmt::layer()
        .with_target(true)
        .with_ansi(std::io::stdout().is_terminal())
        .fmt_fields(TextFields)
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
        // Request spans stay lazy: a request's trace is its edge's
        // (`traces::Edge`), not a `tracing` span.
        // The logs' filter is the subscriber's, widened to the spans
        // exported (`traces::admitted`); the exporter's layer takes those
        // alone (`traces::Exports`). The log lines' layer and the
        // exporter's are one layer (`and_then`): a span closing goes
        // through one subscriber's close guard the fewer, about 130
        // instructions for every request whose log span was made (a link
        // read's is: the SQLite driver asks for the current span).
        (Some(traces), LogFormat::Text) => {
            let registry = tracing_subscriber::registry()
                .with(traces::admitted(filter.and(traces::logged())))
                .with(text_layer().and_then(traces.layer()));
            LazySpans::new(registry).try_init()
        }
        (Some(traces), LogFormat::Json) => {
            let json = text_layer()
                .json()
                .flatten_event(true)
                .fmt_fields(traces::fields::JsonFields);
            let registry = tracing_subscriber::registry()
                .with(traces::admitted(filter.and(traces::logged())))
                .with(json.and_then(traces.layer()));
            LazySpans::new(registry).try_init()
        }
    };
}

/// The traces' series, from the service crate.
pub use lameduck_service::metrics::TracesCollector;
