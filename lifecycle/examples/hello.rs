//! A complete service on the lifecycle: one route, one background worker,
//! one finalizer. `cargo run -p lameduck-lifecycle --example hello`, then
//! `curl localhost:3000` and Ctrl-C (twice to force).

use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::{extract::State, routing::get, Router};
use lameduck_lifecycle::{Lifecycle, ServeConfig};

#[tokio::main]
async fn main() -> std::io::Result<ExitCode> {
    tracing_subscriber::fmt().init();
    let mut lifecycle = Lifecycle::new().with_signals()?;
    let greeted = Arc::new(AtomicU64::new(0));

    // A background worker: cancelled when the drain starts.
    lifecycle
        .workers()
        .spawn_background("heartbeat", |token| async move {
            let mut ticks = tokio::time::interval(Duration::from_secs(10));
            while token.run_until_cancelled(ticks.tick()).await.is_some() {
                tracing::info!("still here");
            }
            Ok(())
        });
    // A finalizer: runs after the last request, within its budget.
    let total = Arc::clone(&greeted);
    lifecycle
        .workers()
        .on_shutdown("report", Duration::from_secs(1), move || async move {
            tracing::info!(greeted = total.load(Ordering::Relaxed), "goodbye");
            Ok(())
        });

    let app = Router::new().route("/", get(hello)).with_state(greeted);
    let addr = std::env::var("HELLO_LISTEN").unwrap_or_else(|_| "127.0.0.1:3000".to_owned());
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let config = ServeConfig {
        drain_delay: Duration::from_millis(500),
        ..ServeConfig::default()
    };
    let report = lifecycle.serve(listener, app).config(config).run().await;
    Ok(if report.is_clean() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

async fn hello(State(greeted): State<Arc<AtomicU64>>) -> &'static str {
    greeted.fetch_add(1, Ordering::Relaxed);
    "hello\n"
}
