//! The middleware every request goes through, as one tower service: request
//! id, request span, Host check, per-route metrics, panics and the request
//! timeout turned into JSON answers, and JSON bodies on every error.
//!
//! One service rather than a layer each: axum gives every layer added with
//! `Router::layer` its own boxed service, cloned on every request, and every
//! `from_fn` boxes its future as well. Eight of them cost more instructions
//! than the router, the handler and hyper together (see the per-layer table
//! in the README's "Measured"). Here a request makes one box, and what the
//! steps share (metrics, the timeout) sits behind one `Arc`.
//!
//! The steps, outermost first, as each request meets them:
//!
//! 1. the request id: the client's `x-request-id`, or a new UUID set on the
//!    request; echoed on the response;
//! 2. the span `request` (method, route, request id), entered for the
//!    request and for its response body;
//! 3. metrics: count and latency by route and status class;
//! 4. the Host check (400);
//! 5. JSON error bodies: an error answer that is not JSON gets one;
//! 6. a panicking handler answers 500;
//! 7. the request timeout answers 503 and fires the request's token.

use std::convert::Infallible;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{MatchedPath, Request};
use axum::http::header::HeaderName;
use axum::http::{HeaderValue, Response};
use axum::response::IntoResponse;
use futures_util::FutureExt;
use hyper::body::Body as _;
use tower::{Layer, Service};
use tracing::Instrument;

use super::metrics::{HttpMetrics, RouteMetrics};
use super::middleware::{self, GuardMetrics};
use crate::error::ApiError;
use crate::lifecycle::RequestScope;

/// The request id header: the client's is kept, one is made otherwise.
pub const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// Which steps the stack runs: all of them in a service. `load bench`
/// switches one off at a time ([`set_steps_for_benchmark`]) to price it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Steps {
    /// Step 1: make or keep the request id, echo it.
    pub request_id: bool,
    /// Step 2: the request span.
    pub span: bool,
    /// Step 3: count and time the request.
    pub metrics: bool,
    /// Step 4: the Host check.
    pub host_check: bool,
    /// Step 5: JSON error bodies.
    pub json_errors: bool,
    /// Step 6: a panic answers 500.
    pub catch_panic: bool,
    /// Step 7: the request timeout.
    pub timeout: bool,
}

impl Steps {
    /// Every step: what a service runs.
    pub const ALL: Steps = Steps {
        request_id: true,
        span: true,
        metrics: true,
        host_check: true,
        json_errors: true,
        catch_panic: true,
        timeout: true,
    };
}

static STEPS: OnceLock<Steps> = OnceLock::new();

/// For benchmarks only: the steps of every stack made from now on (the
/// first call wins; `false` if steps were already set). A service never
/// calls it: `load bench` does, in a build of its own, to measure what each
/// step costs by switching it off.
pub fn set_steps_for_benchmark(steps: Steps) -> bool {
    STEPS.set(steps).is_ok()
}

/// The layer: wraps each route (so the matched route is known) in a
/// [`StackService`].
#[derive(Clone, Debug)]
pub struct Stack {
    shared: Arc<Shared>,
}

/// What every request's steps share.
#[derive(Debug)]
struct Shared {
    http_metrics: HttpMetrics,
    guard_metrics: GuardMetrics,
    request_timeout: Duration,
    steps: Steps,
}

impl Stack {
    /// The stack counting into `http_metrics` and `guard_metrics`, answering
    /// 503 past `request_timeout`.
    pub fn new(
        http_metrics: HttpMetrics,
        guard_metrics: GuardMetrics,
        request_timeout: Duration,
    ) -> Stack {
        Stack {
            shared: Arc::new(Shared {
                http_metrics,
                guard_metrics,
                request_timeout,
                steps: *STEPS.get().unwrap_or(&Steps::ALL),
            }),
        }
    }
}

impl<S> Layer<S> for Stack {
    type Service = StackService<S>;

    fn layer(&self, inner: S) -> StackService<S> {
        StackService {
            inner,
            shared: Arc::clone(&self.shared),
            route: Arc::default(),
        }
    }
}

/// One route (and method) wrapped in the stack.
#[derive(Clone, Debug)]
pub struct StackService<S> {
    inner: S,
    shared: Arc<Shared>,
    /// This route's metric handles, resolved at its first request and
    /// shared by every clone of the service.
    route: Arc<OnceLock<RouteMetrics>>,
}

impl<S> Service<Request> for StackService<S>
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
        // The service polled ready serves this request; a clone takes its
        // place for the next.
        let clone = self.inner.clone();
        let ready = std::mem::replace(&mut self.inner, clone);
        let shared = Arc::clone(&self.shared);
        let route = Arc::clone(&self.route);
        Box::pin(async move { Ok(serve(&shared, &route, ready, request).await) })
    }
}

/// Steps 1 to 3 around [`handle`].
async fn serve<S>(
    shared: &Shared,
    route_metrics: &OnceLock<RouteMetrics>,
    inner: S,
    mut request: Request,
) -> Response<Body>
where
    S: Service<Request, Response = Response<Body>, Error = Infallible>,
{
    let steps = shared.steps;
    let started = Instant::now();
    let request_id = if steps.request_id {
        request_id(&mut request)
    } else {
        HeaderValue::from_static("")
    };
    let route = request.extensions().get::<MatchedPath>().cloned();
    let route = route.as_ref().map_or("unmatched", MatchedPath::as_str);
    let span = if steps.span {
        middleware::request_span(request.method(), route, &request_id)
    } else {
        tracing::Span::none()
    };
    let host_problem = steps
        .host_check
        .then(|| middleware::host_problem(&request))
        .flatten();
    let response = match host_problem {
        Some(problem) => ApiError::BadRequest(problem.to_owned()).into_response(),
        None => {
            handle(shared, inner, request)
                .instrument(span.clone())
                .await
        }
    };
    let latency = started.elapsed();
    if steps.metrics {
        route_metrics
            .get_or_init(|| shared.http_metrics.route(route))
            .record(route, &shared.http_metrics, response.status(), latency);
    }
    span.in_scope(|| middleware::on_response(&response, latency, &span));
    let (mut parts, body) = response.into_parts();
    if steps.request_id {
        // Never indexed by HTTP/2's header compression: a value that is new
        // on every response would only push useful entries out of the
        // table, and looking it up there cost more than the rest of the
        // response.
        let mut request_id = request_id;
        request_id.set_sensitive(true);
        parts.headers.entry(X_REQUEST_ID).or_insert(request_id);
    }
    // A body that is all there (most answers) logs nothing while it is
    // sent; a streaming one (SSE) is polled inside the request's span.
    let body = if body.size_hint().exact().is_some() || !steps.span {
        body
    } else {
        Body::new(InSpan { body, span })
    };
    Response::from_parts(parts, body)
}

/// Steps 5 to 7 around the route.
async fn handle<S>(shared: &Shared, mut inner: S, request: Request) -> Response<Body>
where
    S: Service<Request, Response = Response<Body>, Error = Infallible>,
{
    let token = request
        .extensions()
        .get::<RequestScope>()
        .map(|scope| scope.token().clone());
    let steps = shared.steps;
    let call = async move {
        match inner.call(request).await {
            Ok(response) => response,
            Err(infallible) => match infallible {},
        }
    };
    let guarded = async move {
        if steps.catch_panic {
            AssertUnwindSafe(call).catch_unwind().await
        } else {
            Ok(call.await)
        }
    };
    let outcome = if steps.timeout {
        tokio::time::timeout(shared.request_timeout, guarded).await
    } else {
        Ok(guarded.await)
    };
    let response = match outcome {
        Ok(Ok(response)) => response,
        Ok(Err(panic)) => middleware::panic_response(&shared.guard_metrics, panic),
        Err(_elapsed) => {
            if let Some(token) = token {
                token.cancel();
            }
            shared.guard_metrics.timed_out();
            ApiError::Unavailable(format!(
                "request timed out after {:?}",
                shared.request_timeout
            ))
            .into_response()
        }
    };
    if !steps.json_errors {
        return response;
    }
    middleware::json_error_body(response).await
}

/// The request's id: the client's `x-request-id`, or a new random (v4)
/// UUID, which is then set on the request too.
fn request_id(request: &mut Request) -> HeaderValue {
    if let Some(id) = request.headers().get(X_REQUEST_ID) {
        return id.clone();
    }
    let uuid = uuid::Builder::from_random_bytes(rand::random()).into_uuid();
    let mut text = [0; uuid::fmt::Hyphenated::LENGTH];
    let id = HeaderValue::from_str(uuid.hyphenated().encode_lower(&mut text))
        .expect("a UUID's hex digits and dashes are a valid header value");
    request.headers_mut().insert(X_REQUEST_ID, id.clone());
    id
}

/// A response body polled inside its request's span.
struct InSpan {
    body: Body,
    span: tracing::Span,
}

impl hyper::body::Body for InSpan {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        let this = &mut *self;
        let _entered = this.span.enter();
        Pin::new(&mut this.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_id_is_kept_or_made_as_a_uuid() {
        let mut given = Request::builder()
            .header(X_REQUEST_ID, "abc-123")
            .body(Body::empty())
            .expect("request");
        assert_eq!(request_id(&mut given), "abc-123");

        let mut bare = Request::new(Body::empty());
        let made = request_id(&mut bare);
        let text = made.to_str().expect("ascii");
        let parsed = uuid::Uuid::parse_str(text).expect("a UUID");
        assert_eq!(parsed.get_version_num(), 4, "{text}");
        assert_eq!(bare.headers().get(X_REQUEST_ID), Some(&made));
        assert_ne!(request_id(&mut Request::new(Body::empty())), made);
    }
}
