//! The process lifecycle: signals, the shutdown timeline, the accept loop and
//! the per-request cancellation scope.
//!
//! This module is deliberately blind to the service it runs: it never imports
//! routes, storage or domain state. It serves any `tower::Service` that
//! answers HTTP requests, and it can be lifted into another service unchanged.
//!
//! The timeline it drives, end to end:
//!
//! 1. **Signal** — [`Trigger::trigger`] (called by [`signal::forward`] on
//!    SIGTERM/SIGINT, or by the application). Readiness turns false at once.
//! 2. **Lame duck** — for the drain delay the server keeps accepting and
//!    serving, but HTTP/1 responses carry `Connection: close` and HTTP/2
//!    connections receive GOAWAY, so clients move away on their own.
//! 3. **Stop accepting** — the listen backlog is accepted and served, then
//!    the listener is closed: new connection attempts are refused.
//! 4. **Drain** — every connection is told to shut down gracefully; idle
//!    ones close at once, in-flight requests run to completion.
//! 5. **Deadline** — work still running at the shutdown timeout has its
//!    cancellation token fired, gets [`DEADLINE_CLEANUP_GRACE`] to clean up,
//!    and is then abandoned.
//! 6. **Finalize** — [`Workers::stop`] cancels background work, waits for
//!    critical workers, and runs finalizers in reverse registration order,
//!    each within its budget; the caller turns the reports into an exit code.
//!    A passed deadline abandons requests only: this phase still runs.
//!
//! A second signal at any point calls [`Force::force`]: everything still
//! running is abandoned at once, and the force hooks registered with
//! [`Workers::on_force`] save in-memory state synchronously before exit.
//!
//! Each role has its own handle: [`Shutdown`] (the owner, which drives the
//! drain), [`Trigger`], [`Force`] and [`Watch`] (look and wait only).

mod connection;
pub mod handoff;
mod metrics;
mod request;
mod serve;
mod shutdown;
pub mod signal;
mod workers;

pub use metrics::LifecycleMetrics;
pub use request::{RequestScope, Scoped, TrackedBody};
pub use serve::{
    serve, DrainOutcome, DrainReport, ResponseBody, ServeConfig, ACCEPT_ERROR_BACKOFF,
    FIRST_REQUEST_GRACE, GOAWAY_GRACE,
};
pub use shutdown::{Force, Phase, Shutdown, Trigger, Watch};
pub use workers::{BoxError, Outcome, StopReport, Stopped, Workers};

use std::time::Duration;

/// How long handlers get to clean up (roll back, return pooled connections)
/// after the shutdown deadline fires their cancellation tokens, before their
/// connections are dropped. Counted in the worst-case shutdown budget.
pub const DEADLINE_CLEANUP_GRACE: Duration = Duration::from_secs(1);

/// The `tracing` target of every shutdown-phase log line, so operators can
/// filter the whole timeline with `RUST_LOG=lameduck::shutdown=info`.
pub const LOG_TARGET: &str = "lameduck::shutdown";

/// `error: cause: cause…` on one line, each cause said once (some errors
/// already print their source).
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !message.ends_with(&cause_text) {
            message.push_str(": ");
            message.push_str(&cause_text);
        }
        source = cause.source();
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
