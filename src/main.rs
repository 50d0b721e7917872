//! `lameduck`: the link shortener, run by the template's `main`
//! ([`lameduck_service::main`]): the command line, logs and traces, the
//! lifecycle with its signals and in-place upgrade, the service built on it
//! ([`lameduck::App`]), and its outcome as the exit code.

use std::process::ExitCode;

/// mimalloc instead of the system allocator: a request makes a few dozen
/// short-lived allocations, and glibc's malloc and free were a third of the
/// instructions of `GET /healthz` (`load bench --parts instructions`).
/// Its v2 line (feature `v2`): the crate's default, v3, took about 180 more
/// instructions per request, at the same RSS per idle connection.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    // Fault injection for the ways-out tests (`FAILPOINTS=…`); not compiled
    // into a normal build.
    #[cfg(feature = "failpoints")]
    let _failpoints = fail::FailScenario::setup();
    lameduck_service::main::<lameduck::App>(lameduck_traces::package!())
}
