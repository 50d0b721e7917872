//! `LOAD_WITHOUT=STEP lameduck-without server …`: lameduck with one step of
//! its middleware switched off, so that `load bench` can price each step.
//! Takes lameduck's own command line.

use std::process::ExitCode;

/// lameduck's allocator, so that the comparison prices what it is for.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    match load::baseline::server_config() {
        Ok(config) => load::baseline::run(load::baseline::lameduck_without(config)),
        Err(code) => code,
    }
}
