//! `minimal-axum server --listen ADDR …`: the minimal axum app a user
//! writes from axum's README (the routes the benchmarks use, an in-memory
//! map of links, no middleware) on
//! `axum::serve(..).with_graceful_shutdown(sigterm)`: the baseline of the
//! headline ratios. Takes lameduck's command line and uses only `--listen`.

use std::process::ExitCode;

fn main() -> ExitCode {
    match load::baseline::listen_arg(std::env::args().skip(1)) {
        Ok(listen) => load::baseline::run(load::baseline::minimal_axum(listen)),
        Err(message) => {
            eprintln!("minimal-axum: {message}");
            ExitCode::from(2)
        }
    }
}
