//! An HTTP surface around a service's own routes, for a service that does
//! not bring its own (the full example has a richer one): liveness and
//! readiness, `/metrics`, JSON errors for unknown routes, and, with traces
//! on, every public request's server span.

use std::sync::Arc;
use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::handler::Handler;
use axum::http::header::CONTENT_TYPE;
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use prometheus_client::registry::Registry;
use serde_json::json;

use lameduck_lifecycle::Watch;

use lameduck_traces::{self as traces, ServerSpan};

/// The header a proxy or client names a request by, carried on its span.
const REQUEST_ID: &str = "x-request-id";

/// The public router: the service's `api`, plus `/healthz` and `/readyz`
/// for load balancers that probe the port they send traffic to. With
/// traces on, each request to the `api` (or to no route) runs in its server
/// span ([`traced`]), and the probes, which a balancer sends every second
/// or two, are left out; off, the layer is not there at all.
pub fn public(api: Router, watch: Watch) -> Router {
    if traces::enabled() {
        // `Router::layer` runs after routing: `MatchedPath` is known.
        let api = api.layer(middleware::from_fn(traced));
        api.merge(probes(watch))
            .fallback(not_found.layer(middleware::from_fn(traced)))
    } else {
        api.merge(probes(watch)).fallback(not_found)
    }
}

/// Runs `request` inside its log span and its trace (decided here: the
/// caller's `traceparent` continued, the sampler asked), then records the
/// answer's status and latency. A sampled request dropped before its answer
/// (the client went away, or the shutdown abandoned it) ends its span in
/// error.
async fn traced(request: Request, next: Next) -> Response {
    let mut span = {
        let route = request.extensions().get::<MatchedPath>();
        let id = request.headers().get(REQUEST_ID);
        let id = id.and_then(|id| id.to_str().ok());
        ServerSpan::new(&request, route.map(MatchedPath::as_str), id)
    };
    let started = Instant::now();
    let response = span.run(next.run(request)).await;
    let latency_ms = started.elapsed().as_secs_f64() * 1000.0;
    span.answer(response.status().as_u16(), latency_ms);
    response
}

/// The admin listener's router: `/healthz`, `/readyz` and `/metrics`.
pub fn admin(watch: Watch, registry: Arc<Registry>) -> Router {
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
