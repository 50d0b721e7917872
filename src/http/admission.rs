//! Admission of API requests, as one tower service: a body announced over
//! the limit is refused at once, the body is read before the request takes
//! a slot, and past the concurrency limit the request is shed.
//!
//! In that order, each answering clearly:
//!
//! 1. a body announced larger than `--max-body-bytes` (its
//!    `Content-Length`, or the size the body reports) gets 413 before any of
//!    it is read: no `100 Continue`, and `Connection: close` on HTTP/1.1;
//! 2. the body is read in full ([`super::body`]), outside the limit, so a
//!    slow upload holds a connection, never a slot;
//! 3. a slot under `--max-concurrent-requests`, or 503 with `Retry-After`
//!    at once (no queueing); the slot is held until the response head is
//!    ready;
//! 4. axum's own body limit (for its extractors) is set to the same
//!    figure.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::extract::{DefaultBodyLimit, Request};
use axum::http::header::CONNECTION;
use axum::http::{HeaderValue, Response, Version};
use axum::response::IntoResponse;
use tokio::sync::Semaphore;
use tower::{Layer, Service};

use super::body::{self, BodyReading};
use super::middleware::{self, GuardMetrics};
use super::HttpLimits;
use crate::error::ApiError;

/// The layer, for the API routes.
#[derive(Clone, Debug)]
pub struct Admission {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    reading: BodyReading,
    slots: Semaphore,
    metrics: GuardMetrics,
}

impl Admission {
    /// Admission under `limits`, counting shed requests into `metrics`.
    /// Every route it wraps shares one set of slots.
    pub fn new(limits: HttpLimits, metrics: GuardMetrics) -> Admission {
        Admission {
            shared: Arc::new(Shared {
                reading: BodyReading {
                    max_bytes: limits.max_body_bytes,
                    timeout: limits.body_read_timeout,
                },
                slots: Semaphore::new(limits.max_concurrent_requests),
                metrics,
            }),
        }
    }
}

impl<S> Layer<S> for Admission {
    type Service = AdmissionService<<DefaultBodyLimit as Layer<S>>::Service>;

    fn layer(&self, inner: S) -> Self::Service {
        let limit = DefaultBodyLimit::max(self.shared.reading.max_bytes);
        AdmissionService {
            inner: limit.layer(inner),
            shared: Arc::clone(&self.shared),
        }
    }
}

/// One API route wrapped in admission.
#[derive(Clone, Debug)]
pub struct AdmissionService<S> {
    inner: S,
    shared: Arc<Shared>,
}

impl<S> Service<Request> for AdmissionService<S>
where
    S: Service<Request, Response = Response<Body>, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request) -> Self::Future {
        let clone = self.inner.clone();
        let ready = std::mem::replace(&mut self.inner, clone);
        let shared = Arc::clone(&self.shared);
        Box::pin(async move { Ok(admit(&shared, ready, request).await) })
    }
}

async fn admit<S>(shared: &Shared, mut inner: S, request: Request) -> Response<Body>
where
    S: Service<Request, Response = Response<Body>, Error = Infallible>,
{
    let limit = shared.reading.max_bytes;
    let announced = middleware::announced_body_size(&request);
    if announced > u64::try_from(limit).unwrap_or(u64::MAX) {
        let mut response = ApiError::BodyTooLarge { announced, limit }.into_response();
        if request.version() < Version::HTTP_2 {
            // hyper closes the connection anyway rather than read the body
            // it was never asked for; say so, as RFC 9112 §9.6 asks.
            response
                .headers_mut()
                .insert(CONNECTION, HeaderValue::from_static("close"));
        }
        return response;
    }
    let request = match body::read_first(request, shared.reading).await {
        Ok(request) => request,
        Err(refused) => return refused,
    };
    let Ok(_slot) = shared.slots.try_acquire() else {
        return middleware::shed(&shared.metrics);
    };
    match inner.call(request).await {
        Ok(response) => response,
        Err(infallible) => match infallible {},
    }
}
