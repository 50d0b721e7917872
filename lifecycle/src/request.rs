//! Per-request cancellation: every request runs inside a [`RequestScope`]
//! whose token fires when the request future is dropped (the client hung up
//! or reset the stream), at the shutdown deadline, or on a forced shutdown.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock, Weak};
use std::task::{ready, Context, Poll};

use hyper::body::{Body, Frame, SizeHint};
use hyper::header::{HeaderValue, CONNECTION};
use hyper::{Request, Response, Version};
use pin_project_lite::pin_project;
use tokio::task::futures::TaskLocalFuture;
use tokio::task::JoinError;
use tokio_util::sync::CancellationToken;
use tokio_util::task::task_tracker::TaskTrackerToken;
use tokio_util::task::TaskTracker;
use tower::util::Oneshot;
use tower::ServiceExt;
use tracing::Instrument;

use crate::connection::{BusyGuard, ConnState};
use crate::{Phase, Watch};

/// The cancellation scope of one request: a handler takes it as an
/// extractor (feature `axum`), or asks [`RequestScope::current`].
///
/// Its token is cancelled when hyper drops the request future (the client
/// went away), when the shutdown deadline passes, or when shutdown is
/// forced. Work that must not be cut half-way — a database transaction —
/// belongs in [`RequestScope::run`]: it runs on a task the drain waits for,
/// observes the token at safe points, and cleans up before it returns.
#[derive(Clone, Debug)]
pub struct RequestScope {
    token: Arc<LazyToken>,
    tracker: TaskTracker,
}

tokio::task_local! {
    /// The scope of the request being polled, set around each poll of it.
    ///
    /// Not an extension of the request: axum puts three there, and a
    /// fourth grows the map that holds them, on every request.
    static SCOPE: RequestScope;
}

/// A request's token, made the first time it is asked for: most requests
/// never ask, and a child token costs two locks on its parent.
#[derive(Debug, Default)]
struct LazyToken {
    /// The server's timeline (its drain) and the connection. The token is a
    /// child of the connection's request token while the connection lives
    /// (a scope kept longer does not keep it counted open), else of the
    /// server's; a detached scope's is a root.
    parent: Option<(Watch, Weak<ConnState>)>,
    token: OnceLock<CancellationToken>,
}

impl LazyToken {
    fn get(&self) -> &CancellationToken {
        self.token.get_or_init(|| match &self.parent {
            Some((shutdown, conn)) => match conn.upgrade() {
                Some(conn) => conn.request_token(shutdown),
                None => shutdown.request_token(),
            },
            None => CancellationToken::new(),
        })
    }

    /// Fires the token, made or not: one asked for later is born cancelled.
    fn cancel(&self) {
        self.token.get_or_init(CancellationToken::new).cancel();
    }
}

impl RequestScope {
    /// A scope that belongs to no server: its token fires only when
    /// cancelled by hand. For exercising handlers without a socket.
    pub fn detached() -> RequestScope {
        RequestScope {
            token: Arc::default(),
            tracker: TaskTracker::new(),
        }
    }

    /// The scope of the request being polled: `Some` while the lifecycle
    /// polls a request — its handler, extractors and middleware, and what
    /// dropping it drops — `None` elsewhere, in a task the request spawned
    /// among others: move the scope into it.
    pub fn current() -> Option<RequestScope> {
        SCOPE.try_with(RequestScope::clone).ok()
    }

    /// The request's cancellation token.
    pub fn token(&self) -> &CancellationToken {
        self.token.get()
    }

    /// Resolves when the server's drain starts: a long-lived response (a
    /// stream, a websocket) should send its goodbye and end. Never resolves
    /// for a detached scope.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn draining(&self) {
        match &self.token.parent {
            Some((shutdown, _)) => shutdown.draining().await,
            None => std::future::pending().await,
        }
    }

    /// A token that the drain waits for until it is dropped. Move it into
    /// work that outlives the request — an upgraded websocket's task, which
    /// hyper no longer tracks as a connection.
    pub fn hold_drain(&self) -> TaskTrackerToken {
        self.tracker.token()
    }

    /// Runs `work` to its own end on a task tracked by the lifecycle, and
    /// waits for its result. It runs in the caller's span (the request's),
    /// so what it logs carries the request's fields.
    ///
    /// If the request is dropped meanwhile, `work` keeps running: it sees its
    /// token cancelled and is expected to clean up (roll back, release what
    /// it holds) and return. The drain waits for it.
    ///
    /// # Errors
    /// The task's [`JoinError`] if `work` panicked.
    ///
    /// # Cancel safety
    /// Dropping the returned future does not cancel `work`; that is the point.
    pub async fn run<F, Fut, T>(&self, work: F) -> Result<T, JoinError>
    where
        F: FnOnce(CancellationToken) -> Fut,
        Fut: Future<Output = T> + Send + 'static,
        T: Send + 'static,
    {
        let work = work(self.token().clone()).in_current_span();
        self.tracker.spawn(work).await
    }
}

/// A request in flight until its response head. Dropped before that (hyper
/// dropped the request future: the client went away), it fires the
/// request's token and counts the request as aborted.
#[must_use = "dropping the guard ends the request's in-flight count"]
struct InFlight {
    shutdown: Watch,
    token: Arc<LazyToken>,
    /// `Some(after_signal)` once the response head is out.
    answered: Option<bool>,
}

impl InFlight {
    /// The response head is out: ends the in-flight count. The phase it
    /// was made in.
    fn answer(mut self) -> Phase {
        let phase = self.shutdown.answering_in();
        self.answered = Some(phase > Phase::Running);
        phase
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if self.answered.is_none() {
            self.token.cancel();
        }
        self.shutdown.metrics().request_ended(self.answered);
    }
}

/// The per-request half of the lifecycle, as a service around the
/// application: polls each request inside its [`RequestScope`], counts it in
/// flight, and during shutdown asks HTTP/1 clients to close
/// (`Connection: close`) and HTTP/2 connections to go away (GOAWAY).
///
/// [`serve`](crate::serve) wraps every connection's service in it; it is
/// public so that tests can drive single requests through it.
#[derive(Clone, Debug)]
pub struct Scoped<S> {
    inner: S,
    shutdown: Watch,
    conn: Option<Arc<ConnState>>,
}

impl<S> Scoped<S> {
    /// Wraps `inner`; requests are scoped by `shutdown`'s timeline.
    pub fn new(inner: S, shutdown: Watch) -> Scoped<S> {
        Scoped {
            inner,
            shutdown,
            conn: None,
        }
    }

    pub(crate) fn for_connection(inner: S, shutdown: Watch, conn: Arc<ConnState>) -> Scoped<S> {
        Scoped {
            inner,
            shutdown,
            conn: Some(conn),
        }
    }
}

impl<S, ReqBody, ResBody> hyper::service::Service<Request<ReqBody>> for Scoped<S>
where
    S: tower::Service<Request<ReqBody>, Response = Response<ResBody>, Error = Infallible> + Clone,
    ResBody: Body + Unpin,
{
    type Response = Response<TrackedBody<ResBody>>;
    type Error = Infallible;
    type Future = ScopedFuture<TaskLocalFuture<RequestScope, Oneshot<S, Request<ReqBody>>>>;

    fn call(&self, request: Request<ReqBody>) -> Self::Future {
        let http2 = request.version() == Version::HTTP_2;
        if let Some(conn) = &self.conn {
            conn.observe(request.version());
            if http2 && conn.should_close(self.shutdown.answering_in()) {
                conn.goaway.cancel();
            }
        }
        let conn = self.conn.as_ref().map_or_else(Weak::new, Arc::downgrade);
        let token = Arc::new(LazyToken {
            parent: Some((self.shutdown.clone(), conn)),
            token: OnceLock::new(),
        });
        let scope = RequestScope {
            token: Arc::clone(&token),
            tracker: self.shutdown.tracker().clone(),
        };
        self.shutdown.metrics().request_started();
        ScopedFuture {
            inner: SCOPE.scope(scope, self.inner.clone().oneshot(request)),
            in_flight: Some(InFlight {
                shutdown: self.shutdown.clone(),
                token,
                answered: None,
            }),
            http2,
            first_poll: true,
            // The connection is busy until the response body is done.
            busy: self.conn.clone().map(BusyGuard::new),
        }
    }
}

pin_project! {
    /// One request through [`Scoped`]: the application's answer, then
    /// `Connection: close` on it if the shutdown has begun.
    #[must_use = "futures do nothing unless polled"]
    pub struct ScopedFuture<F> {
        #[pin]
        inner: F,
        in_flight: Option<InFlight>,
        http2: bool,
        first_poll: bool,
        busy: Option<BusyGuard>,
    }
}

impl<F, B> Future for ScopedFuture<F>
where
    F: Future<Output = Result<Response<B>, Infallible>>,
    B: Body + Unpin,
{
    type Output = Result<Response<TrackedBody<B>>, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let conn = this.busy.as_ref().map(|BusyGuard(conn)| conn);
        if std::mem::take(this.first_poll) && *this.http2 && conn.is_some_and(|c| c.half_answered())
        {
            // Starts behind the connection's task, which writes the half
            // answered: the client works on it while this half is made.
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        let Ok(mut response) = ready!(this.inner.poll(cx));
        let in_flight = this.in_flight.take();
        let phase = in_flight.map_or(Phase::Running, InFlight::answer);
        let busy = this.busy.take();
        if let Some(BusyGuard(conn)) = busy.as_ref().filter(|_| *this.http2) {
            conn.answer_ready();
        }
        // HTTP/2 was told at the request (GOAWAY): nothing to add here.
        let close = !*this.http2
            && match &busy {
                Some(BusyGuard(conn)) => conn.should_close(phase),
                None => phase > Phase::Running,
            };
        if close {
            response
                .headers_mut()
                .insert(CONNECTION, HeaderValue::from_static("close"));
            if let Some(BusyGuard(conn)) = &busy {
                conn.close_sent.store(true, Ordering::Release);
            }
        }
        let untaken = this.http2.then_some(false);
        Poll::Ready(Ok(response.map(|inner| {
            let mut body = TrackedBody {
                inner,
                untaken,
                busy,
            };
            if !body.inner.is_end_stream() {
                body.wait_to_be_taken();
            }
            body
        })))
    }
}

/// A handler's [`RequestScope`]: the one the lifecycle polls the request in,
/// else one put in the request's extensions by hand (a test, a server of
/// one's own); none is a 500.
#[cfg(feature = "axum")]
impl<S: Sync> axum_core::extract::FromRequestParts<S> for RequestScope {
    type Rejection = NoRequestScope;

    async fn from_request_parts(
        parts: &mut hyper::http::request::Parts,
        _state: &S,
    ) -> Result<RequestScope, NoRequestScope> {
        RequestScope::current()
            .or_else(|| parts.extensions.get::<RequestScope>().cloned())
            .ok_or(NoRequestScope)
    }
}

/// A handler asked for a [`RequestScope`] and the request has none: it is
/// not served by the lifecycle ([`Scoped`]) and none was put in its
/// extensions. Answers 500.
#[cfg(feature = "axum")]
#[derive(Debug)]
pub struct NoRequestScope;

#[cfg(feature = "axum")]
impl axum_core::response::IntoResponse for NoRequestScope {
    fn into_response(self) -> axum_core::response::Response {
        let message = "the request has no RequestScope: it is not served by the lifecycle";
        (hyper::StatusCode::INTERNAL_SERVER_ERROR, message).into_response()
    }
}

/// A response body that keeps its connection marked busy until it has been
/// sent (or dropped): a streaming response is not an idle connection. On
/// HTTP/2 it also tells the connection when it waits for hyper to take its
/// next frame ([`ConnState::answer_untaken`]).
#[derive(Debug)]
pub struct TrackedBody<B> {
    inner: B,
    /// HTTP/2 only: whether the body waits to be taken: made, or having
    /// given a frame, and since then neither polled nor dropped.
    untaken: Option<bool>,
    busy: Option<BusyGuard>,
}

impl<B> TrackedBody<B> {
    fn wait_to_be_taken(&mut self) {
        if let (Some(untaken @ false), Some(BusyGuard(conn))) = (&mut self.untaken, &self.busy) {
            *untaken = true;
            conn.answer_untaken();
        }
    }

    fn taken(&mut self) {
        if let (Some(untaken @ true), Some(BusyGuard(conn))) = (&mut self.untaken, &self.busy) {
            *untaken = false;
            conn.answer_taken();
        }
    }
}

impl<B> Drop for TrackedBody<B> {
    fn drop(&mut self) {
        self.taken();
    }
}

impl<B: Body + Unpin> Body for TrackedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = &mut *self;
        this.taken();
        let frame = Pin::new(&mut this.inner).poll_frame(cx);
        if matches!(frame, Poll::Ready(Some(Ok(_)))) {
            // Taken once hyper has sent it and asks for the next, or drops
            // the body after the last.
            this.wait_to_be_taken();
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_asked_for_after_the_hang_up_is_born_cancelled() {
        let hung_up = LazyToken::default();
        hung_up.cancel();
        assert!(hung_up.get().is_cancelled());

        let asked = LazyToken::default();
        let token = asked.get().clone();
        asked.cancel();
        assert!(token.is_cancelled());
    }

    #[test]
    fn a_token_made_late_still_follows_the_deadline() {
        let shutdown = crate::Shutdown::new();
        let watch = shutdown.watch();
        let conn = Arc::new(ConnState::new(watch.metrics(), true));
        let scope = |conn: &Arc<ConnState>| LazyToken {
            parent: Some((watch.clone(), Arc::downgrade(conn))),
            token: OnceLock::new(),
        };
        let early = scope(&conn);
        let token = early.get().clone();
        // A scope kept after its connection closed does not keep the
        // connection counted open, and its token still has a parent.
        let late = scope(&conn);
        drop(conn);
        assert_eq!(watch.metrics().open_connections(), 0);
        shutdown.cancel_requests();
        assert!(token.is_cancelled());
        assert!(late.get().is_cancelled(), "born after the deadline");
    }

    // What a handler takes from its scope is the request's: a hang-up
    // fires its token. Outside the request's polls there is no scope.
    #[tokio::test]
    async fn a_request_is_polled_in_its_scope_and_a_hang_up_fires_it() {
        let shutdown = crate::Shutdown::new();
        let (taken, mut token) = tokio::sync::mpsc::unbounded_channel();
        let handler = move |_: Request<()>| {
            let taken = taken.clone();
            async move {
                let scope = RequestScope::current().expect("polled in its scope");
                taken.send(scope.token().clone()).expect("the test waits");
                std::future::pending::<Result<Response<String>, Infallible>>().await
            }
        };
        let scoped = Scoped::new(tower::service_fn(handler), shutdown.watch().clone());
        let mut request = Box::pin(hyper::service::Service::call(&scoped, Request::new(())));
        assert!(futures_poll(&mut request).is_pending());
        assert!(RequestScope::current().is_none(), "only while polled");
        let token = token.try_recv().expect("the handler ran");
        assert!(!token.is_cancelled());
        drop(request);
        assert!(token.is_cancelled(), "the client hung up");
    }

    fn futures_poll<F: Future + Unpin>(future: &mut F) -> Poll<F::Output> {
        let mut cx = Context::from_waker(std::task::Waker::noop());
        Pin::new(future).poll(&mut cx)
    }

    // A handler takes the scope as an extractor: the lifecycle's, else one
    // put in the request by hand; with neither it answers 500.
    #[cfg(feature = "axum")]
    #[tokio::test]
    async fn the_extractor_finds_the_scope_or_answers_500() {
        use axum::body::Body as AxumBody;

        async fn handler(scope: RequestScope) -> &'static str {
            let _ = scope.token();
            "scoped"
        }
        let router = axum::Router::new().route("/", axum::routing::get(handler));
        let request = || Request::get("/").body(AxumBody::empty()).expect("request");

        let bare = router.clone().oneshot(request()).await.expect("infallible");
        assert_eq!(bare.status(), hyper::StatusCode::INTERNAL_SERVER_ERROR);

        let mut by_hand = request();
        by_hand.extensions_mut().insert(RequestScope::detached());
        let answer = router.clone().oneshot(by_hand).await.expect("infallible");
        assert_eq!(answer.status(), hyper::StatusCode::OK);

        let shutdown = crate::Shutdown::new();
        let scoped = Scoped::new(router, shutdown.watch().clone());
        let served = hyper::service::Service::call(&scoped, request()).await;
        assert_eq!(served.expect("infallible").status(), hyper::StatusCode::OK);
    }

    // A stream that starts once half of its batch waits to be written goes
    // behind the connection's task, once: its first poll wakes it and
    // returns, the next answers. Once the connection wrote, none waits.
    #[test]
    fn a_stream_of_a_half_answered_batch_lets_the_connection_write_first() {
        use std::sync::atomic::Ordering::Relaxed;
        use std::task::Waker;

        use crate::task::tests::Wakes;

        let shutdown = crate::Shutdown::new();
        let watch = shutdown.watch();
        let conn = Arc::new(ConnState::new(watch.metrics(), true));
        conn.observe(Version::HTTP_2);
        let answer = |_: Request<()>| async { Ok::<_, Infallible>(Response::new(String::new())) };
        let scoped =
            Scoped::for_connection(tower::service_fn(answer), watch.clone(), Arc::clone(&conn));
        let wakes = Arc::new(Wakes::default());
        let waker = Waker::from(Arc::clone(&wakes));
        let mut cx = Context::from_waker(&waker);
        let mut stream = || {
            let request = Request::builder().version(Version::HTTP_2).body(());
            let mut stream = Box::pin(hyper::service::Service::call(
                &scoped,
                request.expect("request"),
            ));
            let mut polls = 1;
            while stream.as_mut().poll(&mut cx).is_pending() && polls < 3 {
                polls += 1;
            }
            (polls, wakes.0.swap(0, Relaxed))
        };

        for _ in 0..crate::connection::MIN_HALF_BATCH {
            conn.answer_ready();
        }
        assert_eq!(stream(), (2, 1), "put off once, and woken");
        conn.writing();
        assert_eq!(stream(), (1, 0), "nothing waits to be written");
    }
}
