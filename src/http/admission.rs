//! Admission of API requests, as one tower service: a body announced over
//! the limit is refused at once, the body is read before the request takes
//! a slot, and past the concurrency limit the request is shed.
//!
//! In that order, each answering clearly:
//!
//! 1. a body announced larger than `--max-body-bytes` (its
//!    `Content-Length`, or the size the body reports) gets 413 before any of
//!    it is read: no `100 Continue`, and `Connection: close` on HTTP/1.1
//!    (a request whose body has already ended, as a `GET` without one, has
//!    nothing to refuse and goes straight to step 3);
//! 2. the body is read in full ([`super::body`]), outside the limit, so a
//!    slow upload holds a connection, never a slot;
//! 3. a slot under `--max-concurrent-requests`, or 503 with `Retry-After`
//!    at once (no queueing); the slot is held until the response head is
//!    ready;
//! 4. axum's own body limit (for its extractors) is set to the same
//!    figure, on requests that have a body.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::{Body, HttpBody as _};
use axum::extract::{DefaultBodyLimit, Request};
use axum::http::header::CONNECTION;
use axum::http::{HeaderValue, Response, Version};
use axum::response::IntoResponse;
use pin_project_lite::pin_project;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
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
    slots: Arc<Semaphore>,
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
                slots: Arc::new(Semaphore::new(limits.max_concurrent_requests)),
                metrics,
            }),
        }
    }
}

impl<S> Layer<S> for Admission {
    type Service = AdmissionService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        AdmissionService {
            inner,
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
    type Future = AdmissionFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request) -> Self::Future {
        let shared = &self.shared;
        if request.body().is_end_stream() {
            // No body (a redirect, a read): nothing to refuse or wait for;
            // a slot now.
            return match admit(shared) {
                Some(slot) => AdmissionFuture {
                    state: State::Admitted {
                        future: self.inner.call(request),
                        _slot: slot,
                    },
                },
                None => AdmissionFuture::answered(middleware::shed(&shared.metrics)),
            };
        }
        if let Some(refused) = announced_too_large(shared, &request) {
            return AdmissionFuture::answered(refused);
        }
        // The service polled ready serves this request once its body is
        // read, under axum's limit (step 4, only here: a request without a
        // body has nothing for it to apply to, and setting it takes an
        // extension, one too many for the map's first allocation); a clone
        // takes its place for the next.
        let clone = self.inner.clone();
        let limit = DefaultBodyLimit::max(shared.reading.max_bytes);
        let mut ready = limit.layer(std::mem::replace(&mut self.inner, clone));
        let shared = Arc::clone(shared);
        let future = Box::pin(async move {
            let request = match body::read_first(request, shared.reading).await {
                Ok(request) => request,
                Err(refused) => return refused,
            };
            let Some(_slot) = admit(&shared) else {
                return middleware::shed(&shared.metrics);
            };
            match ready.call(request).await {
                Ok(response) => response,
                Err(infallible) => match infallible {},
            }
        });
        AdmissionFuture {
            state: State::Reading { future },
        }
    }
}

/// Step 1: 413 for a body announced over the limit, before any is read.
fn announced_too_large(shared: &Shared, request: &Request) -> Option<Response<Body>> {
    let limit = shared.reading.max_bytes;
    let announced = middleware::announced_body_size(request);
    if announced <= u64::try_from(limit).unwrap_or(u64::MAX) {
        return None;
    }
    let mut response = ApiError::BodyTooLarge { announced, limit }.into_response();
    if request.version() < Version::HTTP_2 {
        // hyper closes the connection anyway rather than read the body it
        // was never asked for; say so, as RFC 9112 §9.6 asks.
        response
            .headers_mut()
            .insert(CONNECTION, HeaderValue::from_static("close"));
    }
    Some(response)
}

/// Step 3: a slot, held until the response head is ready; `None` past the
/// limit (the request is shed at once).
fn admit(shared: &Shared) -> Option<OwnedSemaphorePermit> {
    Arc::clone(&shared.slots).try_acquire_owned().ok()
}

pin_project! {
    /// An API request on its way through admission.
    pub struct AdmissionFuture<F> {
        #[pin]
        state: State<F>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F> {
        /// Admitted at once: the route answers, holding the slot (given
        /// back when the answer is ready).
        Admitted {
            #[pin]
            future: F,
            _slot: OwnedSemaphorePermit,
        },
        /// Reading the body first, then admitted or shed.
        Reading {
            future: Pin<Box<dyn Future<Output = Response<Body>> + Send>>,
        },
        /// Refused before the route (413, 503).
        Answered { response: Option<Response<Body>> },
    }
}

impl<F> AdmissionFuture<F> {
    fn answered(response: Response<Body>) -> Self {
        let response = Some(response);
        AdmissionFuture {
            state: State::Answered { response },
        }
    }
}

impl<F> Future for AdmissionFuture<F>
where
    F: Future<Output = Result<Response<Body>, Infallible>>,
{
    type Output = Result<Response<Body>, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            StateProj::Admitted { future, .. } => future.poll(cx),
            StateProj::Reading { future } => future.as_mut().poll(cx).map(Ok),
            StateProj::Answered { response } => Poll::Ready(Ok(response
                .take()
                .expect("AdmissionFuture polled after it answered"))),
        }
    }
}
