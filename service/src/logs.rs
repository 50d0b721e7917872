//! Logging: `tracing` to stdout, as text or JSON, filtered by `RUST_LOG`
//! (default `info`), their fields written as the stock formatter writes
//! them (`lameduck_traces::fields`), traces on or off. With traces on
//! (`lameduck-traces`) the same lines, less the spans' `otel.*` fields, and
//! every span the trace filter lets through exported over OTLP.

use std::io::IsTerminal;

use tracing_subscriber::filter::FilterExt;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::Layer as _;
use tracing_subscriber::{fmt, EnvFilter};

use lameduck_traces::fields::TextFields;
use lameduck_traces::{self as traces, Traces};

use crate::cli::LogFormat;

/// Installs the global subscriber: logs, and `traces` if they are on.
/// Call once, before anything logs.
pub fn init(format: LogFormat, traces: Option<&Traces>) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let ansi = std::io::stdout().is_terminal();
    let Some(traces) = traces else {
        let builder = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_target(true)
            .with_ansi(ansi);
        // `try_init` fails only if a subscriber is already set (tests): keep it.
        let _ = match format {
            LogFormat::Text => builder.fmt_fields(TextFields).try_init(),
            LogFormat::Json => builder.json().flatten_event(true).try_init(),
        };
        return;
    };
    // Every span made, for the exporter: the subscriber's filter is the
    // logs', widened to the spans exported (`traces::admitted`); the
    // exporter's layer takes those alone (`traces::Exports`).
    let logs = fmt::layer().with_target(true).with_ansi(ansi);
    let registry =
        tracing_subscriber::registry().with(traces::admitted(filter.and(traces::logged())));
    let _ = match format {
        // The log lines' layer and the exporter's as one layer: a span
        // closing goes through one subscriber's close guard the fewer.
        LogFormat::Text => {
            let text = logs.fmt_fields(TextFields);
            registry.with(text.and_then(traces.layer())).try_init()
        }
        LogFormat::Json => {
            let json = logs
                .json()
                .flatten_event(true)
                .fmt_fields(traces::fields::JsonFields);
            registry.with(json.and_then(traces.layer())).try_init()
        }
    };
}
