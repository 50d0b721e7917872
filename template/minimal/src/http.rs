//! The HTTP surface around the service's own routes: liveness and
//! readiness, `/metrics`, and JSON errors for unknown routes.

use std::sync::Arc;

use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use prometheus_client::registry::Registry;
use serde_json::json;

use lameduck_lifecycle::Watch;

/// The public router: the service's `api`, plus `/healthz` and `/readyz`
/// for load balancers that probe the port they send traffic to.
pub(crate) fn public(api: Router, watch: Watch) -> Router {
    api.merge(probes(watch)).fallback(not_found)
}

/// The admin listener's router: `/healthz`, `/readyz` and `/metrics`.
pub(crate) fn admin(watch: Watch, registry: Arc<Registry>) -> Router {
    probes(watch)
        .route("/metrics", get(metrics).with_state(registry))
        .fallback(not_found)
}

fn probes(watch: Watch) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(watch)
}

/// Liveness: 200 for as long as the process runs, draining included.
async fn healthz() -> Json<serde_json::Value> {
    Json(json!({ "status": "ok" }))
}

/// Readiness: 503 from the instant shutdown starts, so load balancers stop
/// sending new work.
async fn readyz(State(watch): State<Watch>) -> (StatusCode, Json<serde_json::Value>) {
    if watch.is_triggered() {
        let phase = watch.phase().as_str();
        let body = json!({ "status": "shutting down", "phase": phase });
        (StatusCode::SERVICE_UNAVAILABLE, Json(body))
    } else {
        (StatusCode::OK, Json(json!({ "status": "ready" })))
    }
}

/// Every registered series in the Prometheus text format.
async fn metrics(State(registry): State<Arc<Registry>>) -> Response {
    let mut body = String::new();
    match prometheus_client::encoding::text::encode(&mut body, &registry) {
        Ok(()) => {
            let content_type = "application/openmetrics-text; version=1.0.0; charset=utf-8";
            ([(CONTENT_TYPE, content_type)], body).into_response()
        }
        Err(error) => {
            let body = json!({ "error": error.to_string() });
            (StatusCode::INTERNAL_SERVER_ERROR, Json(body)).into_response()
        }
    }
}

async fn not_found() -> (StatusCode, Json<serde_json::Value>) {
    (
        StatusCode::NOT_FOUND,
        Json(json!({ "error": "no such route" })),
    )
}
