//! `/metrics` in the Prometheus text format, and the middleware that counts
//! and times every request by route and status class.

use std::sync::Arc;
use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::http::header::CONTENT_TYPE;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use crate::error::ApiError;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteLabels {
    /// The route template (`/api/links/{code}`), never the raw path, so the
    /// series stay few.
    route: String,
    /// `2xx`, `3xx`, `4xx` or `5xx`.
    status: &'static str,
}

/// Per-route request counts and latencies.
#[derive(Clone, Debug)]
pub struct HttpMetrics {
    requests: Family<RouteLabels, Counter>,
    latency: Family<RouteLabels, Histogram>,
}

impl Default for HttpMetrics {
    fn default() -> Self {
        HttpMetrics {
            requests: Family::default(),
            latency: Family::new_with_constructor(|| {
                // 0.5 ms … ~16 s
                Histogram::new(exponential_buckets(0.0005, 2.0, 16))
            }),
        }
    }
}

impl HttpMetrics {
    /// Registers the series under `registry`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "http_requests",
            "Requests answered, by route and status class",
            self.requests.clone(),
        );
        registry.register(
            "http_request_duration_seconds",
            "Time to produce the response head, by route and status class",
            self.latency.clone(),
        );
    }

    fn record(&self, route: String, status: u16, seconds: f64) {
        let labels = RouteLabels {
            route,
            status: status_class(status),
        };
        self.requests.get_or_create(&labels).inc();
        self.latency.get_or_create(&labels).observe(seconds);
    }
}

fn status_class(status: u16) -> &'static str {
    match status {
        100..=199 => "1xx",
        200..=299 => "2xx",
        300..=399 => "3xx",
        400..=499 => "4xx",
        _ => "5xx",
    }
}

/// Middleware: counts and times the request under its matched route.
pub async fn track(State(metrics): State<HttpMetrics>, request: Request, next: Next) -> Response {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_owned(), |path| path.as_str().to_owned());
    let started = Instant::now();
    let response = next.run(request).await;
    metrics.record(
        route,
        response.status().as_u16(),
        started.elapsed().as_secs_f64(),
    );
    response
}

/// `GET /metrics`: every registered series in the Prometheus text format.
pub async fn render(State(registry): State<Arc<Registry>>) -> Result<Response, ApiError> {
    let mut body = String::new();
    prometheus_client::encoding::text::encode(&mut body, &registry)
        .map_err(|error| ApiError::Internal(Box::new(error)))?;
    Ok((
        [(
            CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        body,
    )
        .into_response())
}
