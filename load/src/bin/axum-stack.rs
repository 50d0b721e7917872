//! `axum-stack server --listen ADDR …`: the minimal axum app with the usual
//! tower-http stack (`TraceLayer` with a fmt subscriber at `info`,
//! `x-request-id` set and propagated, `TimeoutLayer`, a Prometheus
//! middleware and `/metrics`) on
//! `axum::serve(..).with_graceful_shutdown(sigterm)`. Takes lameduck's
//! command line and uses only `--listen`.

use std::process::ExitCode;

fn main() -> ExitCode {
    match load::baseline::listen_arg(std::env::args().skip(1)) {
        Ok(listen) => load::baseline::run(load::baseline::axum_stack(listen)),
        Err(message) => {
            eprintln!("axum-stack: {message}");
            ExitCode::from(2)
        }
    }
}
