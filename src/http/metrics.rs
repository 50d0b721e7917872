//! `/metrics` in the Prometheus text format, and the middleware that counts
//! and times every request by route and status class.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::http::StatusCode;
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

    /// Handles for `route`'s series, to resolve once and keep.
    pub fn route(&self, route: &str) -> RouteMetrics {
        RouteMetrics {
            route: route.to_owned(),
            by_class: Default::default(),
        }
    }

    fn series(&self, route: &str, status: StatusCode) -> (Counter, Histogram) {
        let labels = RouteLabels {
            route: route.to_owned(),
            status: STATUS_CLASSES[class_index(status)],
        };
        (
            self.requests.get_or_create(&labels).clone(),
            self.latency.get_or_create(&labels).clone(),
        )
    }
}

/// One route's request counter and latency histogram for each status
/// class, each looked up in the families at its first use only: recording
/// then takes no lock on a family, no hashing and no allocation.
#[derive(Debug)]
pub struct RouteMetrics {
    route: String,
    by_class: [OnceLock<(Counter, Histogram)>; 5],
}

impl RouteMetrics {
    /// Counts a request to `route` answered `status` after `latency`.
    /// `route` is the route these handles were made for; for another (a
    /// service reached under two routes), the families are asked instead.
    pub fn record(
        &self,
        route: &str,
        metrics: &HttpMetrics,
        status: StatusCode,
        latency: Duration,
    ) {
        let seconds = latency.as_secs_f64();
        if route != self.route {
            let (requests, histogram) = metrics.series(route, status);
            requests.inc();
            histogram.observe(seconds);
            return;
        }
        let (requests, histogram) =
            self.by_class[class_index(status)].get_or_init(|| metrics.series(route, status));
        requests.inc();
        histogram.observe(seconds);
    }
}

const STATUS_CLASSES: [&str; 5] = ["1xx", "2xx", "3xx", "4xx", "5xx"];

fn class_index(status: StatusCode) -> usize {
    match status.as_u16() {
        100..=199 => 0,
        200..=299 => 1,
        300..=399 => 2,
        400..=499 => 3,
        _ => 4,
    }
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
