//! The middleware every request goes through, as one tower service: request
//! id, request span, Host check, per-route metrics, panics and the request
//! timeout turned into JSON answers, and JSON bodies on every error.
//!
//! One service rather than a layer each: axum gives every layer added with
//! `Router::layer` its own boxed service, cloned on every request, and every
//! `from_fn` boxes its future as well. Eight of them cost more instructions
//! than the router, the handler and hyper together (see the per-step table
//! in load/results/bench-analysis.md). Here a request makes no box of its
//! own: [`StackFuture`] lives in the one axum makes for the route, and what
//! the steps share (metrics, the timeout) sits behind one `Arc`.
//!
//! The steps, outermost first, as each request meets them:
//!
//! 1. the request id: the client's `x-request-id`, or a new UUID set on the
//!    request; echoed on the response;
//! 2. the span `request` (method, route, request id), around the request
//!    and its response body, made when something inside first needs it
//!    ([`RequestSpan`]) — or, with traces on, at once: the request's server
//!    span, continuing the caller's `traceparent`;
//! 3. metrics: count and latency by route and status class;
//! 4. the Host check (400);
//! 5. JSON error bodies: an error answer that is not JSON gets one;
//! 6. a panicking handler answers 500;
//! 7. the request timeout answers 503 and fires the request's token — unless
//!    the request's body is still arriving: that stall is the client's, and
//!    admission answers it 408 at the same deadline ([`RequestDeadline`]).

use std::convert::Infallible;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{ready, Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{MatchedPath, Request};
use axum::http::header::{Entry, HeaderName};
use axum::http::{HeaderValue, Response};
use axum::response::IntoResponse;
use hyper::body::Body as _;
use pin_project_lite::pin_project;
use tower::{Layer, Service};

use super::body::RequestDeadline;
use super::metrics::{HttpMetrics, RouteMetrics};
use super::middleware::{self, GuardMetrics};
use crate::error::ApiError;
use crate::lifecycle::RequestScope;
use crate::telemetry::RequestSpan;

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

    /// No step: the stack's service and future alone, for the bench's
    /// price of what is left when every step is off.
    pub const NONE: Steps = Steps {
        request_id: false,
        span: false,
        metrics: false,
        host_check: false,
        json_errors: false,
        catch_panic: false,
        timeout: false,
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
    /// The metric handles of the one handler this layer wraps
    /// ([`Stack::for_handler`]); `None` for a layer over a router's routes,
    /// which gives each route handles of its own.
    handler_route: Option<Arc<OnceLock<RouteMetrics>>>,
    /// With traces on, whether its requests are exported ([`Stack::untraced`]).
    traced: bool,
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
            handler_route: None,
            traced: true,
        }
    }

    /// The same stack, its requests never exported as traces (their span
    /// still carries their log lines): for probes and scrapes, which a
    /// kubelet or a balancer sends every second or two, and whose spans
    /// would bury the requests' own.
    pub fn untraced(&self) -> Stack {
        Stack {
            traced: false,
            ..self.clone()
        }
    }

    /// The stack for one handler of its own (`handler.layer(..)`, as the
    /// fallbacks are): axum makes such a handler's service anew for every
    /// request, so the handler's metric handles are kept in the layer,
    /// resolved at its first request and not again at each.
    pub fn for_handler(&self) -> Stack {
        Stack {
            shared: Arc::clone(&self.shared),
            handler_route: Some(Arc::default()),
            traced: self.traced,
        }
    }
}

impl<S> Layer<S> for Stack {
    type Service = StackService<S>;

    fn layer(&self, inner: S) -> StackService<S> {
        StackService {
            inner,
            shared: Arc::clone(&self.shared),
            route: self.handler_route.clone().unwrap_or_default(),
            traced: self.traced,
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
    /// See [`Stack::untraced`].
    traced: bool,
}

impl<S> Service<Request> for StackService<S>
where
    S: Service<Request, Response = Response<Body>, Error = Infallible>,
{
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = StackFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    /// Steps 1, 2 and 4 here; the route's future, the panic and the
    /// timeout in [`StackFuture`].
    fn call(&mut self, mut request: Request) -> Self::Future {
        let steps = self.shared.steps;
        // Tokio's clock: the timeout's deadline is counted from it (and
        // paused time in tests moves it).
        let started = tokio::time::Instant::now();
        if steps.timeout && !request.body().is_end_stream() {
            // A body still arriving when the timeout fires is the client's
            // stall, not the server's: admission reads it within this
            // deadline too, and answers 408 first.
            request
                .extensions_mut()
                .insert(RequestDeadline(started + self.shared.request_timeout));
        }
        let request_id = steps.request_id.then(|| request_id(&mut request));
        let route = request.extensions().get::<MatchedPath>().cloned();
        let span = match (steps.span, self.traced) {
            (true, true) => RequestSpan::for_request(&request, route.as_ref(), request_id.as_ref()),
            (true, false) => {
                RequestSpan::new(request.method(), route.as_ref(), request_id.as_ref())
            }
            (false, _) => RequestSpan::none(),
        };
        let host_problem = steps
            .host_check
            .then(|| middleware::host_problem(&request))
            .flatten();
        let state = match host_problem {
            Some(problem) => State::Answered {
                response: Some(ApiError::BadRequest(problem.to_owned()).into_response()),
            },
            // The route's future does its work when polled, inside the span.
            // The timeout's timer is made when the route first has to wait:
            // an answer ready at once (most of them) never touches the
            // timer wheel.
            None => State::Routing {
                future: self.inner.call(request),
                timeout: None,
            },
        };
        StackFuture {
            state,
            span,
            finish: Finish {
                shared: Arc::clone(&self.shared),
                route_metrics: Arc::clone(&self.route),
                route,
                request_id,
                started,
            },
        }
    }
}

/// The route template for metrics and the span.
fn route_name(route: &Option<MatchedPath>) -> &str {
    route.as_ref().map_or("unmatched", MatchedPath::as_str)
}

pin_project! {
    /// One request's way through the stack: the route's future polled in
    /// the request's span, under `catch_unwind` and the timeout; then a
    /// JSON body for a plain error answer; then the metrics and the request
    /// id on the response.
    ///
    /// One state machine rather than nested `async` blocks: each nesting
    /// level copied the whole future again, and they made it 3 KiB.
    pub struct StackFuture<F> {
        #[pin]
        state: State<F>,
        span: RequestSpan,
        finish: Finish,
    }

    impl<F> PinnedDrop for StackFuture<F> {
        // A request dropped unanswered (the client went away) drops the
        // route's future, and what it logs then, inside the span.
        fn drop(this: Pin<&mut Self>) {
            let mut this = this.project();
            if !matches!(this.state.as_ref().get_ref(), State::Done) {
                this.span.in_scope(|| this.state.set(State::Done));
            }
        }
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F> {
        /// The route is answering; the timeout, if on, runs beside it from
        /// the route's first wait.
        Routing {
            #[pin]
            future: F,
            #[pin]
            timeout: Option<tokio::time::Sleep>,
        },
        /// A plain-text error answer getting its JSON body.
        Converting {
            future: Pin<Box<dyn Future<Output = Response<Body>> + Send>>,
        },
        /// Answered without the route (the Host check).
        Answered { response: Option<Response<Body>> },
        Done,
    }
}

/// What the stack does with the response: steps 1 and 3, and the log line.
struct Finish {
    shared: Arc<Shared>,
    route_metrics: Arc<OnceLock<RouteMetrics>>,
    route: Option<MatchedPath>,
    request_id: Option<HeaderValue>,
    started: tokio::time::Instant,
}

impl<F> Future for StackFuture<F>
where
    F: Future<Output = Result<Response<Body>, Infallible>>,
{
    type Output = Result<Response<Body>, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let (mut state, finish) = (this.state, this.finish);
        let response = ready!(this.span.in_scope(|| {
            let response = ready!(answer(state.as_mut(), finish, cx));
            finish.count_and_log(&response);
            Poll::Ready(response)
        }));
        this.span.answered(response.status().as_u16());
        Poll::Ready(Ok(finish.deliver(response, this.span)))
    }
}

/// Polls the route's future (under `catch_unwind` and the timeout), then
/// gives a plain error answer its JSON body. Ends in [`State::Done`].
fn answer<F>(
    mut state: Pin<&mut State<F>>,
    finish: &Finish,
    cx: &mut Context<'_>,
) -> Poll<Response<Body>>
where
    F: Future<Output = Result<Response<Body>, Infallible>>,
{
    let steps = finish.shared.steps;
    loop {
        let response = match state.as_mut().project() {
            StateProj::Routing {
                future,
                mut timeout,
            } => {
                let polled = if steps.catch_panic {
                    std::panic::catch_unwind(AssertUnwindSafe(|| future.poll(cx)))
                } else {
                    Ok(future.poll(cx))
                };
                match polled {
                    Ok(Poll::Ready(Ok(response))) => response,
                    Ok(Poll::Ready(Err(infallible))) => match infallible {},
                    Err(panic) => middleware::panic_response(&finish.shared.guard_metrics, panic),
                    Ok(Poll::Pending) if steps.timeout => {
                        if timeout.is_none() {
                            let deadline = finish.started + finish.shared.request_timeout;
                            timeout.set(Some(tokio::time::sleep_until(deadline)));
                        }
                        match timeout.as_pin_mut().map(|t| t.poll(cx)) {
                            Some(Poll::Ready(())) => finish.timed_out(),
                            _ => return Poll::Pending,
                        }
                    }
                    Ok(Poll::Pending) => return Poll::Pending,
                }
            }
            StateProj::Converting { future } => {
                let response = ready!(future.as_mut().poll(cx));
                state.set(State::Done);
                return Poll::Ready(response);
            }
            StateProj::Answered { response } => response
                .take()
                .expect("StackFuture polled after it answered"),
            StateProj::Done => panic!("StackFuture polled after it answered"),
        };
        // Dropped here, inside the span: the route's future, whether it
        // answered, panicked or timed out.
        state.set(State::Done);
        if steps.json_errors && middleware::lacks_json_body(&response) {
            let future = Box::pin(middleware::json_error_body(response));
            state.set(State::Converting { future });
            continue;
        }
        return Poll::Ready(response);
    }
}

impl Finish {
    /// Step 7's answer: 503, and the request's token fired so that work it
    /// handed off stops too. Called while the lifecycle polls the request,
    /// in its scope.
    fn timed_out(&self) -> Response<Body> {
        if let Some(scope) = RequestScope::current() {
            scope.token().cancel();
        }
        self.shared.guard_metrics.timed_out();
        let timeout = self.shared.request_timeout;
        ApiError::Unavailable(format!("request timed out after {timeout:?}")).into_response()
    }

    /// Counts the answer and logs it; called inside the request's span.
    fn count_and_log(&self, response: &Response<Body>) {
        let shared = &self.shared;
        let latency = self.started.elapsed();
        let route = route_name(&self.route);
        if shared.steps.metrics {
            self.route_metrics
                .get_or_init(|| shared.http_metrics.route(route))
                .record(route, &shared.http_metrics, response.status(), latency);
        }
        middleware::on_response(response, latency);
    }

    /// Echoes the request id on the answer; a streaming body takes the
    /// request's span along.
    fn deliver(&mut self, mut response: Response<Body>, span: &mut RequestSpan) -> Response<Body> {
        if let Some(mut request_id) = self.request_id.take() {
            // Never indexed by HTTP/2's header compression: a value that is
            // new on every response would only push useful entries out of
            // the table, and looking it up there cost more than the rest of
            // the response.
            request_id.set_sensitive(true);
            response
                .headers_mut()
                .entry(X_REQUEST_ID)
                .or_insert(request_id);
        }
        // A body that is all there (most answers) logs nothing while it is
        // sent; a streaming one (SSE) is polled inside the request's span.
        if response.body().size_hint().exact().is_some() || span.is_none() {
            return response;
        }
        let span = std::mem::replace(span, RequestSpan::none());
        response.map(|body| Body::new(InSpan { body, span }))
    }
}

/// The request's id: the client's `x-request-id`, or a new random (v4)
/// UUID, which is then set on the request too.
///
/// Its bits come from `fastrand`'s per-thread generator, not from a
/// cryptographic one: an id correlates log lines and is no secret, and the
/// cryptographic generator cost nearly half of this step.
fn request_id(request: &mut Request) -> HeaderValue {
    // One look-up of the header, whether the client sent it or not.
    let vacant = match request.headers_mut().entry(X_REQUEST_ID) {
        Entry::Occupied(given) => return given.get().clone(),
        Entry::Vacant(vacant) => vacant,
    };
    let random = fastrand::u128(..).to_le_bytes();
    let uuid = uuid::Builder::from_random_bytes(random).into_uuid();
    let mut text = [0; uuid::fmt::Hyphenated::LENGTH];
    uuid.hyphenated().encode_lower(&mut text);
    // Its own allocation, shared by the request, the response and the span
    // without being copied again.
    let id = HeaderValue::from_maybe_shared(axum::body::Bytes::from_owner(text))
        .expect("a UUID's hex digits and dashes are a valid header value");
    vacant.insert(id).clone()
}

/// A response body polled inside its request's span.
struct InSpan {
    body: Body,
    span: RequestSpan,
}

impl hyper::body::Body for InSpan {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        let InSpan { body, span } = &mut *self;
        span.in_scope(|| Pin::new(body).poll_frame(cx))
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
    use std::sync::Mutex;

    use axum::http::header::HOST;
    use tracing::field::{Field, Visit};
    use tracing_subscriber::layer::{Context as LayerContext, SubscriberExt};
    use tracing_subscriber::registry::LookupSpan;

    use super::*;

    /// Each event's message and the name of the span it was logged in.
    type Logged = Vec<(String, Option<&'static str>)>;

    /// Remembers what was logged, and where.
    #[derive(Clone, Default)]
    struct SpansOfEvents(Arc<Mutex<Logged>>);

    impl<S: tracing::Subscriber + for<'a> LookupSpan<'a>> tracing_subscriber::Layer<S>
        for SpansOfEvents
    {
        fn on_event(&self, event: &tracing::Event<'_>, ctx: LayerContext<'_, S>) {
            struct Message(String);
            impl Visit for Message {
                fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
                    if field.name() == "message" {
                        self.0 = format!("{value:?}");
                    }
                }
            }
            let mut message = Message(String::new());
            event.record(&mut message);
            let span = ctx.event_span(event).map(|span| span.name());
            self.0.lock().expect("lock").push((message.0, span));
        }
    }

    // A client that hangs up drops the route's future; what its drop
    // guards log then must still carry the request's span (its id), made
    // for the line or up front.
    #[tokio::test]
    async fn what_a_dropped_request_logs_is_in_its_span() {
        for lazy in [true, false] {
            let events = SpansOfEvents::default();
            let registry = tracing_subscriber::registry().with(events.clone());
            let dispatch = if lazy {
                tracing::Dispatch::new(crate::telemetry::LazySpans::new(registry))
            } else {
                tracing::Dispatch::new(registry)
            };
            let _default = tracing::dispatcher::set_default(&dispatch);
            struct LogOnDrop;
            impl Drop for LogOnDrop {
                fn drop(&mut self) {
                    tracing::info!("handler dropped");
                }
            }
            let route = tower::service_fn(|_request: Request| async {
                let _guard = LogOnDrop;
                std::future::pending::<Result<Response<Body>, Infallible>>().await
            });
            let stack = Stack::new(
                HttpMetrics::default(),
                GuardMetrics::default(),
                Duration::from_secs(60),
            );
            let mut service = stack.layer(route);
            let request = Request::builder()
                .header(HOST, "lameduck")
                .body(Body::empty())
                .expect("request");
            let mut answer = Box::pin(service.call(request));
            assert!(futures_util::poll!(&mut answer).is_pending());
            drop(answer);
            let events = events.0.lock().expect("lock").clone();
            let expected = [("handler dropped".to_owned(), Some("request"))];
            assert_eq!(events, expected, "lazy: {lazy}");
        }
    }

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
