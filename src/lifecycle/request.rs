//! Per-request cancellation: every request runs inside a [`RequestScope`]
//! whose token fires when the request future is dropped (the client hung up
//! or reset the stream), at the shutdown deadline, or on a forced shutdown.

use std::convert::Infallible;
use std::future::Future;
use std::pin::pin;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hyper::header::{HeaderValue, CONNECTION};
use hyper::{Request, Response, Version};
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::Notify;
use tokio::task::JoinError;
use tokio_util::sync::CancellationToken;
use tokio_util::task::task_tracker::TaskTrackerToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt;

use super::metrics::{LifecycleMetrics, Protocol};
use super::Shutdown;

/// The cancellation scope of one request, found in its extensions.
///
/// Its token is cancelled when hyper drops the request future (the client
/// went away), when the shutdown deadline passes, or when shutdown is
/// forced. Work that must not be cut half-way — a database transaction —
/// belongs in [`RequestScope::run`]: it runs on a task the drain waits for,
/// observes the token at safe points, and cleans up before it returns.
#[derive(Clone, Debug)]
pub struct RequestScope {
    token: CancellationToken,
    tracker: TaskTracker,
    shutdown: Option<Shutdown>,
}

impl RequestScope {
    /// A scope that belongs to no server: its token fires only when
    /// cancelled by hand. For exercising handlers without a socket.
    pub fn detached() -> RequestScope {
        RequestScope {
            token: CancellationToken::new(),
            tracker: TaskTracker::new(),
            shutdown: None,
        }
    }

    /// The request's cancellation token.
    pub fn token(&self) -> &CancellationToken {
        &self.token
    }

    /// Resolves when the server's drain starts: a long-lived response (a
    /// stream, a websocket) should send its goodbye and end. Never resolves
    /// for a detached scope.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn draining(&self) {
        match &self.shutdown {
            Some(shutdown) => shutdown.draining().await,
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
    /// waits for its result.
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
        self.tracker.spawn(work(self.token.clone())).await
    }
}

/// What one connection's task and its requests share.
#[derive(Debug)]
pub(crate) struct ConnState {
    protocol: AtomicU8,
    /// Cancelled when the server wants this HTTP/2 connection to go away
    /// (GOAWAY) before the drain, i.e. during the lame-duck period.
    pub(crate) goaway: CancellationToken,
    /// Cancelled by the connection's first request: from then on hyper
    /// knows the protocol and shuts the connection down gracefully.
    pub(crate) first_request: CancellationToken,
    /// Set once a response went out with `Connection: close`: the server,
    /// not the client, ended this connection.
    close_sent: AtomicBool,
    /// Requests of this connection whose response head is not out yet.
    in_flight: AtomicUsize,
    /// Notified whenever a request of this connection starts or finishes.
    activity: Notify,
    open: Gauge,
    metrics: LifecycleMetrics,
}

impl ConnState {
    pub(crate) fn new(metrics: &LifecycleMetrics) -> ConnState {
        let open = metrics.connections_open(Protocol::pending);
        open.inc();
        ConnState {
            protocol: AtomicU8::new(Protocol::pending as u8),
            goaway: CancellationToken::new(),
            first_request: CancellationToken::new(),
            close_sent: AtomicBool::new(false),
            in_flight: AtomicUsize::new(0),
            activity: Notify::new(),
            open,
            metrics: metrics.clone(),
        }
    }

    /// Records the protocol when the first request reveals it.
    fn observe(&self, version: Version) {
        self.first_request.cancel();
        let protocol = if version == Version::HTTP_2 {
            Protocol::http2
        } else {
            Protocol::http1
        };
        if self
            .protocol
            .compare_exchange(
                Protocol::pending as u8,
                protocol as u8,
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_ok()
        {
            self.open.dec();
            self.metrics.connections_open(protocol).inc();
        }
    }

    fn protocol(&self) -> Protocol {
        match self.protocol.load(Ordering::Acquire) {
            p if p == Protocol::http2 as u8 => Protocol::http2,
            p if p == Protocol::http1 as u8 => Protocol::http1,
            _ => Protocol::pending,
        }
    }

    pub(crate) fn is_http2(&self) -> bool {
        self.protocol() == Protocol::http2
    }

    pub(crate) fn close_sent(&self) -> bool {
        self.close_sent.load(Ordering::Acquire)
    }

    fn request_started(&self) {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        self.activity.notify_waiters();
    }

    fn request_finished(&self) {
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
        self.activity.notify_waiters();
    }

    /// Resolves once no request of this connection has been in flight for
    /// `timeout`.
    pub(crate) async fn idle_for(&self, timeout: Duration) {
        loop {
            let activity = self.activity.notified();
            let mut activity = pin!(activity);
            // Registered before the check, so no change slips between.
            activity.as_mut().enable();
            if self.in_flight.load(Ordering::Acquire) > 0 {
                activity.await;
                continue;
            }
            tokio::select! {
                () = tokio::time::sleep(timeout) => return,
                () = activity => {}
            }
        }
    }
}

impl Drop for ConnState {
    fn drop(&mut self) {
        self.metrics.connections_open(self.protocol()).dec();
    }
}

/// Counts a request in flight, for the server and for its connection;
/// dropping it before [`InFlightGuard::complete`] counts the request as
/// aborted.
#[must_use = "dropping the guard ends the request's in-flight count"]
struct InFlightGuard {
    metrics: LifecycleMetrics,
    conn: Option<Arc<ConnState>>,
    completed: bool,
}

impl InFlightGuard {
    fn start(metrics: &LifecycleMetrics, conn: Option<Arc<ConnState>>) -> InFlightGuard {
        metrics.requests_in_flight.inc();
        if let Some(conn) = &conn {
            conn.request_started();
        }
        InFlightGuard {
            metrics: metrics.clone(),
            conn,
            completed: false,
        }
    }

    fn complete(mut self, after_signal: bool) {
        self.completed = true;
        if after_signal {
            self.metrics.requests_drained.inc();
        }
    }
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        self.metrics.requests_in_flight.dec();
        if let Some(conn) = &self.conn {
            conn.request_finished();
        }
        if !self.completed {
            self.metrics.requests_aborted.inc();
        }
    }
}

/// The per-request half of the lifecycle, as a service around the
/// application: gives each request its [`RequestScope`], counts it in
/// flight, and during shutdown asks HTTP/1 clients to close
/// (`Connection: close`) and HTTP/2 connections to go away (GOAWAY).
///
/// [`serve`](super::serve) wraps every connection's service in it; it is
/// public so that tests can drive single requests through it.
#[derive(Clone, Debug)]
pub struct Scoped<S> {
    inner: S,
    shutdown: Shutdown,
    conn: Option<Arc<ConnState>>,
}

impl<S> Scoped<S> {
    /// Wraps `inner`; requests are scoped by `shutdown`'s timeline.
    pub fn new(inner: S, shutdown: Shutdown) -> Scoped<S> {
        Scoped {
            inner,
            shutdown,
            conn: None,
        }
    }

    pub(crate) fn for_connection(inner: S, shutdown: Shutdown, conn: Arc<ConnState>) -> Scoped<S> {
        Scoped {
            inner,
            shutdown,
            conn: Some(conn),
        }
    }
}

impl<S, ReqBody, ResBody> hyper::service::Service<Request<ReqBody>> for Scoped<S>
where
    S: tower::Service<Request<ReqBody>, Response = Response<ResBody>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send,
    ReqBody: Send + 'static,
{
    type Response = Response<ResBody>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<ResBody>, Infallible>> + Send>>;

    fn call(&self, mut request: Request<ReqBody>) -> Self::Future {
        let http2 = request.version() == Version::HTTP_2;
        if let Some(conn) = &self.conn {
            conn.observe(request.version());
            if http2 && self.shutdown.is_triggered() {
                conn.goaway.cancel();
            }
        }

        let inner = self.inner.clone();
        let conn = self.conn.clone();
        let shutdown = self.shutdown.clone();
        Box::pin(async move {
            let token = shutdown.request_token();
            request.extensions_mut().insert(RequestScope {
                token: token.clone(),
                tracker: shutdown.tracker().clone(),
                shutdown: Some(shutdown.clone()),
            });
            let in_flight = InFlightGuard::start(shutdown.metrics(), conn.clone());
            // Fires the request's token if hyper drops this future first.
            let cancel_on_drop = token.drop_guard();

            let mut response = inner.oneshot(request).await?;

            cancel_on_drop.disarm();
            let shutting_down = shutdown.is_triggered();
            in_flight.complete(shutting_down);
            if shutting_down && !http2 {
                response
                    .headers_mut()
                    .insert(CONNECTION, HeaderValue::from_static("close"));
                if let Some(conn) = conn {
                    conn.close_sent.store(true, Ordering::Release);
                }
            }
            Ok(response)
        })
    }
}
