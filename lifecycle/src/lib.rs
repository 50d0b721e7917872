#![doc = include_str!("../README.md")]

mod admin;
mod config;
mod connection;
mod handover;
mod listener;
pub mod metrics;
mod request;
mod rotation;
mod serve;
mod shutdown;
mod stage;
mod task;
mod timeline;
mod woken;
mod workers;

pub use admin::ADMIN_CLOSE_GRACE;
pub use config::{
    DrainSpread, ServeConfig, ACCEPT_ERROR_BACKOFF, FIRST_REQUEST_GRACE, GOAWAY_GRACE, SETTLE,
};
pub use handover::Handover;
pub use listener::Listener;
pub use metrics::LifecycleMetrics;
#[cfg(feature = "axum")]
pub use request::NoRequestScope;
pub use request::{RequestScope, Scoped, ScopedFuture, TrackedBody};
pub use rotation::{draw, spread_moment, Draw};
pub use serve::{serve, DrainOutcome, DrainReport};
pub use shutdown::{Force, Phase, Shutdown, Trigger, Watch};
pub use task::HttpService;
pub use timeline::{Lifecycle, Report, Serve};
pub use workers::{BoxError, Kept, Outcome, StopReport, Stopped, Workers};

use std::time::Duration;

/// How long handlers get to clean up (roll back, return pooled connections)
/// after the shutdown deadline fires their cancellation tokens, before their
/// connections are dropped. Counted in the worst-case shutdown budget.
pub const DEADLINE_CLEANUP_GRACE: Duration = Duration::from_secs(1);

/// The `tracing` target of every shutdown-phase log line, so operators can
/// filter the whole timeline with `RUST_LOG=lameduck_lifecycle::shutdown=info`:
/// this crate's name (whatever a service renames it to), then `::shutdown`.
pub const LOG_TARGET: &str = concat!(env!("CARGO_CRATE_NAME"), "::shutdown");

/// `error: cause: cause…` on one line, each cause said once (some errors
/// already print their source).
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut message = error.to_string();
    for cause in std::iter::successors(error.source(), |cause| cause.source()) {
        let cause = cause.to_string();
        if !message.ends_with(&cause) {
            message = format!("{message}: {cause}");
        }
    }
    message
}

/// The message of a panic payload (`panic!` with a string literal or a
/// formatted string), for logs and reports.
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic".to_owned())
}
