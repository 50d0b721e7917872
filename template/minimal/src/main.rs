//! `lameduck`: an HTTP service that stops, restarts and rolls out under load
//! without dropping a request. The template's `main`
//! ([`lameduck_service::main`]) parses the command line, starts logs and
//! traces, builds the app on the lifecycle, runs it until a signal, and
//! turns the outcome into an exit code.
//!
//! - [`app`]: the service (one route, one worker, one finalizer): replace it.
//! - [`counts`]: state of its own, requests per route, written behind.
//! - [`config`]: command line and environment.
//!
//! The lifecycle itself (signals, lame duck, drain, deadline, workers and
//! finalizers) is the crate in `lifecycle/`; socket activation and the
//! in-place upgrade the one in `handoff/`; the command line's common part,
//! exit codes, the health probe, listeners, logs, the lifecycle's metrics,
//! the HTTP surface (health, readiness, metrics) and this `main` the one in
//! `service/`; traces over OTLP the one in `traces/`; the write-behind
//! component (flush, journal, spill, replay) the one in `writebehind/`.

mod app;
mod config;
mod counts;

use std::process::ExitCode;

fn main() -> ExitCode {
    lameduck_service::main::<app::App>(lameduck_traces::package!())
}
