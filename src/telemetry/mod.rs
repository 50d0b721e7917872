//! Logging: `tracing` to stdout, as text or JSON, filtered by `RUST_LOG`
//! (default `info`). A request's span is made only when something inside
//! the request needs it ([`request_span`]).

pub mod request_span;

use std::io::IsTerminal;

use clap::ValueEnum;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{fmt, EnvFilter};

pub use request_span::{LazySpans, RequestSpan};

/// Log line format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Installs the global subscriber. Call once, first thing in `main`.
pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let text = fmt::layer()
        .with_target(true)
        .with_ansi(std::io::stdout().is_terminal());
    let registry = tracing_subscriber::registry().with(filter);
    // `try_init` fails only if a subscriber is already set (tests): keep it.
    let subscriber = match format {
        LogFormat::Text => LazySpans::new(registry.with(text)),
        LogFormat::Json => LazySpans::new(registry.with(text.json().flatten_event(true))),
    };
    let _ = subscriber.try_init();
}
