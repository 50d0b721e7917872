//! Request cancellation with a drop guard: a client that hangs up cancels
//! its request, and the half-done work is undone before the request ends.
//!
//! `cargo run -p lameduck-lifecycle --example cancel`, then
//! `curl -m 1 localhost:3000/slow` (gives up after a second: "rolled back"
//! in the log) and `curl localhost:3000/slow` (waits: "committed").

use std::time::Duration;

use axum::{routing::get, Router};
use lameduck_lifecycle::{Lifecycle, RequestScope};
use tokio_util::sync::CancellationToken;

/// Undoes the work unless disarmed: dropped half-way, it rolls back.
#[must_use = "dropping the guard rolls the work back"]
struct Rollback(Option<&'static str>);

impl Rollback {
    fn commit(mut self) {
        tracing::info!(work = self.0.take(), "committed");
    }
}

impl Drop for Rollback {
    fn drop(&mut self) {
        if let Some(work) = self.0 {
            tracing::info!(work, "rolled back");
        }
    }
}

async fn slow(token: CancellationToken) -> Result<&'static str, &'static str> {
    let guard = Rollback(Some("slow transfer"));
    // Stands in for statements of a transaction; stops at the first
    // safe point after the client went away (or the deadline passed).
    for _step in 0..3 {
        tokio::select! {
            () = token.cancelled() => return Err("cancelled"),
            () = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
    guard.commit();
    Ok("done\n")
}

async fn handler(scope: RequestScope) -> &'static str {
    // On a task of its own: a hang-up cancels the token, it does not drop
    // the work half-way, and the drain waits for it.
    match scope.run(slow).await {
        Ok(Ok(body)) => body,
        // Only a deadline gets here with a client still listening.
        Ok(Err(_cancelled)) => "cancelled\n",
        Err(_panicked) => "failed\n",
    }
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    tracing_subscriber::fmt().init();
    let lifecycle = Lifecycle::new().with_signals()?;
    let app = Router::new().route("/slow", get(handler));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    let report = lifecycle.serve(listener, app).run().await;
    tracing::info!(clean = report.is_clean(), "stopped");
    Ok(())
}
