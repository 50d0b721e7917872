//! Logging: `tracing` to stdout, as text or JSON, filtered by `RUST_LOG`
//! (default `info`). Span fields are formatted only when a line inside the
//! span is written ([`deferred`]).

pub mod deferred;

use std::io::IsTerminal;

use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{fmt, EnvFilter};

use crate::config::LogFormat;
pub use deferred::Deferred;

/// Installs the global subscriber. Call once, first thing in `main`.
pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let text = fmt::layer()
        .with_target(true)
        .with_ansi(std::io::stdout().is_terminal());
    let registry = tracing_subscriber::registry().with(filter);
    // `try_init` fails only if a subscriber is already set (tests): keep it.
    let _ = match format {
        LogFormat::Text => registry.with(Deferred::new(text)).try_init(),
        LogFormat::Json => registry
            .with(Deferred::new(text.json().flatten_event(true)))
            .try_init(),
    };
}
