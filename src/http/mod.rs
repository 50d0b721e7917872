//! The HTTP surface: the router, health and readiness, metrics, and the
//! JSON error boundary.

mod error;
pub mod metrics;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::extract::{FromRef, State};
use axum::http::StatusCode;
use axum::middleware;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::{Json, Router};
use prometheus_client::registry::Registry;
use serde_json::json;

pub use error::ApiError;
pub use metrics::HttpMetrics;

use crate::lifecycle::Shutdown;
use crate::links;
use crate::links::hits::HitCounter;
use crate::storage::Storage;

/// Whether startup has finished its work (migrations, recovery); `/readyz`
/// stays 503 until it has.
#[derive(Clone, Debug, Default)]
pub struct Startup(Arc<AtomicBool>);

impl Startup {
    /// Marks startup complete.
    pub fn complete(&self) {
        self.0.store(true, Ordering::Release);
    }

    /// `true` once startup is complete.
    pub fn is_complete(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

/// Everything the handlers share.
#[derive(Clone, Debug, FromRef)]
pub struct AppState {
    /// The shutdown timeline (readiness turns false when it starts).
    pub shutdown: Shutdown,
    /// Whether startup has finished.
    pub startup: Startup,
    /// Every metric, for `/metrics`.
    pub registry: Arc<Registry>,
    /// Request counts and latencies.
    pub http_metrics: HttpMetrics,
    /// The example's database.
    pub storage: Storage,
    /// The example's write-behind hit counters.
    pub hits: HitCounter,
}

/// The whole application router.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics::render))
        .merge(links::routes())
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(
            state.http_metrics.clone(),
            metrics::track,
        ))
        .with_state(state)
}

/// Liveness: 200 for as long as the process runs, draining included.
async fn healthz() -> impl IntoResponse {
    Json(json!({ "status": "ok" }))
}

/// Readiness: 200 once startup is complete, 503 from the instant shutdown
/// starts, so load balancers stop sending new work.
async fn readyz(
    State(shutdown): State<Shutdown>,
    State(startup): State<Startup>,
) -> impl IntoResponse {
    if shutdown.is_triggered() {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({ "status": "shutting down", "phase": shutdown.phase().as_str() })),
        )
    } else if !startup.is_complete() {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({ "status": "starting" })),
        )
    } else {
        (StatusCode::OK, Json(json!({ "status": "ready" })))
    }
}

async fn not_found() -> ApiError {
    ApiError::NotFound("no such route".to_owned())
}

async fn method_not_allowed() -> ApiError {
    ApiError::MethodNotAllowed
}
