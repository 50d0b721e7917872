//! `plain-axum server …`: lameduck's app on plain
//! `axum::serve(..).with_graceful_shutdown(sigterm)`, the baseline of the
//! rollout and the benchmarks. Takes lameduck's own command line.

use std::process::ExitCode;

/// lameduck's allocator, so that the comparison prices what it is for.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    match load::baseline::server_config() {
        Ok(config) => load::baseline::run(load::baseline::plain_axum(config)),
        Err(code) => code,
    }
}
