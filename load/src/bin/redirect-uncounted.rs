//! `redirect-uncounted server …`: lameduck with a redirect that counts no
//! hit, to price hit counting in the benchmarks. Takes lameduck's own
//! command line.

use std::process::ExitCode;

/// lameduck's allocator, so that the comparison prices what it is for.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    match load::baseline::server_config() {
        Ok(config) => load::baseline::run(load::baseline::redirect_uncounted(config)),
        Err(code) => code,
    }
}
