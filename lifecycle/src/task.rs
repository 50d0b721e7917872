//! The connection task: one per accepted connection, tracked by the drain.
//! It serves the connection with hyper and walks it through the timeline's
//! [`Stage`]s, enforcing the head, idle and linger deadlines.

use std::convert::Infallible;
use std::fmt::Debug;
use std::future::{poll_fn, Future};
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use hyper::body::{Body, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{timeout, Instant};
use tokio_util::task::TaskTracker;
use tracing::debug;

use crate::config::{ServeConfig, FIRST_REQUEST_GRACE, GOAWAY_GRACE, SETTLE};
use crate::connection::{observed, ConnState, Overdue};
use crate::metrics::{CloseReason, LifecycleMetrics, Protocol};
use crate::request::Scoped;
use crate::rotation::Plan;
use crate::stage::{Event, Stage};
use crate::woken::WhenWoken;
use crate::{BoxError, Watch};

/// A `tower::Service` the lifecycle can serve: HTTP requests in, HTTP
/// responses out, errors answered inside (an axum `Router` is one).
pub trait HttpService:
    tower::Service<
        Request<Incoming>,
        Response = Response<Self::Body>,
        Error = Infallible,
        Future: Send + 'static,
    > + Clone
    + Send
    + 'static
{
    /// The response body, which hyper can send from any thread.
    type Body: Body<Data: Send, Error: Into<BoxError>> + Send + Unpin + 'static;
}

impl<S, B> HttpService for S
where
    S: tower::Service<Request<Incoming>, Response = Response<B>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: Body<Data: Send, Error: Into<BoxError>> + Send + Unpin + 'static,
{
    type Body = B;
}

/// Everything needed to serve one more connection; each connection's task
/// serves with a clone of it.
#[derive(Clone)]
pub(crate) struct Connections<S> {
    /// What every connection shares, behind one pointer: a connection's
    /// task keeps a clone for its whole life, and is smaller for it.
    shared: Arc<Shared>,
    service: S,
    shutdown: Watch,
}

struct Shared {
    builder: auto::Builder<TrackedExecutor>,
    /// One permit per open connection.
    limit: Arc<Semaphore>,
    /// Connections accepted so far: the next one's number in its draws.
    accepted: AtomicU64,
    config: ServeConfig,
}

impl<S: HttpService> Connections<S> {
    pub(crate) fn new(service: S, shutdown: Watch, config: &ServeConfig) -> Self {
        let mut builder = auto::Builder::new(TrackedExecutor(shutdown.tracker().clone()));
        // hyper's own header timeout also runs between keep-alive requests,
        // which would make it the idle timeout; the connection task enforces
        // the head deadline instead (`ConnState::overdue`).
        builder
            .http1()
            .timer(TokioTimer::new())
            .header_read_timeout(None);
        builder
            .http2()
            .timer(TokioTimer::new())
            .max_concurrent_streams(config.h2_max_concurrent_streams);
        let shared = Shared {
            builder,
            limit: Arc::new(Semaphore::new(config.max_connections)),
            accepted: AtomicU64::new(0),
            config: *config,
        };
        Connections {
            shared: Arc::new(shared),
            service,
            shutdown,
        }
    }

    pub(crate) fn metrics(&self) -> &LifecycleMetrics {
        self.shutdown.metrics()
    }

    /// Waits for room under the connection limit (never closed).
    pub(crate) async fn permit(&self) -> Option<OwnedSemaphorePermit> {
        Arc::clone(&self.shared.limit).acquire_owned().await.ok()
    }

    /// Room under the connection limit, if there is any now.
    pub(crate) fn try_permit(&self) -> Option<OwnedSemaphorePermit> {
        Arc::clone(&self.shared.limit).try_acquire_owned().ok()
    }

    /// Serves `io` on a tracked task that holds `permit` until it closes.
    pub(crate) fn spawn<Io, A>(&self, io: Io, peer: A, permit: Option<OwnedSemaphorePermit>)
    where
        Io: AsyncRead + AsyncWrite + Unpin + Send + 'static,
        A: Debug + Send + Sync + 'static,
    {
        let number = self.shared.accepted.fetch_add(1, Ordering::Relaxed);
        let plan = Plan::new(&self.shared.config, number);
        self.metrics().connection_accepted();
        let conn = Arc::new(ConnState::new(self.metrics(), plan.spread.is_none()));
        let io = observed(io, Arc::clone(&conn));
        // Boxed: the connection's future is 3.3 KiB, and a task copies its
        // whole stage when its future ends and when its output is taken.
        let run = self.clone().run(io, conn, plan, peer, permit);
        self.shutdown.tracker().spawn(Box::pin(run));
    }

    /// Serves the connection through its stages, holding its permit until
    /// it closes, and counts why it ended.
    ///
    /// An `async` block, not an `async fn`: the future of an `async fn`
    /// keeps its arguments twice, as captured and as moved into its body.
    #[expect(clippy::manual_async_fn, reason = "its arguments held once")]
    fn run<Io, A>(
        self,
        io: Io,
        conn: Arc<ConnState>,
        plan: Plan,
        peer: A,
        permit: Option<OwnedSemaphorePermit>,
    ) -> impl Future<Output = ()>
    where
        Io: AsyncRead + AsyncWrite + Unpin + Send + 'static,
        A: Debug + Send + Sync + 'static,
    {
        async move {
            let _permit = permit;
            let shutdown = &self.shutdown;
            // Each made inside its `pin!`: a value made first and moved into
            // the pin would keep a slot of its own in this future, which every
            // connection carries for its whole life.
            let mut connection = pin!(self.shared.builder.serve_connection_with_upgrades(
                TokioIo::new(io),
                Scoped::for_connection(self.service, shutdown.clone(), Arc::clone(&conn)),
            ));
            // The deadlines of the drain and of the age limit, which most
            // connections never reach, are made when first polled, each boxed
            // (`lazily`). Armed then, the first request's grace counts from the
            // drain.
            let first_request = || timeout(FIRST_REQUEST_GRACE, conn.first_request.cancelled());
            let mut first_request_due = pin!(lazily(first_request));
            let config = &self.shared.config;
            let mut idle = pin!(conn.idle_for(config.idle_timeout));
            let mut overdue = pin!(conn.overdue(config.header_read_timeout, config.send_timeout));
            let mut lingered = pin!(lazily(|| conn.idle_for(GOAWAY_GRACE)));
            let mut settled = pin!(lazily(|| conn.idle_since_last(SETTLE)));
            let mut spread_due = pin!(spread_due(shutdown, &plan, config.drain_delay));
            let mut aged = pin!(at(conn.at_age(plan.age.map(|(age, _)| age))));
            let mut grace_over = pin!(at(conn.at_age(plan.age.map(|(age, grace)| age + grace))));
            let mut stage = Stage::Serving;
            // The timeline's events and the deadlines: polled only when one of
            // them woke the task, not at every request the connection wakes it for.
            let when_woken = WhenWoken::new();
            let closed = loop {
                let listens = |event| stage.listens(event, conn.protocol() == Protocol::Http1);
                let told_for_age = conn.told() == Some(CloseReason::Age);
                // In a block of its own, which lends it the deadlines and the
                // stage until the connection or it has an event.
                let event = {
                    let mut others = pin!(async {
                        tokio::select! {
                            biased;
                            () = shutdown.abandoned(), if stage.watches_abandon() => Err(CloseReason::Abandoned),
                            () = shutdown.triggered(), if plan.spread.is_none() && listens(Event::Triggered) => Ok(Event::Triggered),
                            () = spread_due.as_mut(), if plan.spread.is_some() && listens(Event::Due) => {
                                conn.tell(CloseReason::Drain);
                                Ok(Event::Due)
                            }
                            () = aged.as_mut(), if listens(Event::Due) => {
                                conn.tell(CloseReason::Age);
                                Ok(Event::Due)
                            }
                            () = conn.goaway.cancelled(), if listens(Event::GoAway) => Ok(Event::GoAway),
                            () = shutdown.draining(), if listens(Event::Draining) => Ok(Event::Draining),
                            _ = first_request_due.as_mut(), if listens(Event::FirstRequestDue) => Ok(Event::FirstRequestDue),
                            () = idle.as_mut(), if listens(Event::Idle) => Ok(Event::Idle),
                            () = settled.as_mut(), if stage == Stage::Telling => Ok(Event::Idle),
                            overdue = overdue.as_mut() => Err(closing(&peer, CloseReason::Timeout, match overdue {
                                Overdue::Head => "request head not received in time; closing",
                                Overdue::Answers => "answers not taken in time; closing",
                            })),
                            () = grace_over.as_mut(), if told_for_age && stage != Stage::Serving => {
                                Err(closing(&peer, CloseReason::Grace, "past its age and its grace; dropping it with what it has in flight"))
                            }
                            () = lingered.as_mut(), if stage == Stage::Closing => {
                                let why = conn.told().unwrap_or(CloseReason::Drain);
                                Err(closing(&peer, why, "asked to close but still open; dropping it"))
                            }
                        }
                    });
                    when_woken.renew();
                    tokio::select! {
                        // The connection first: one that closes as soon as it is
                        // asked never arms the other branches' timers.
                        biased;
                        result = coalesced(connection.as_mut(), &conn) => {
                            if let Err(error) = result {
                                debug!(?peer, %error, "connection ended with an error");
                            }
                            let asked = stage == Stage::Closing || conn.close_sent.load(Ordering::Acquire);
                            break match conn.told() {
                                Some(why) if asked => why,
                                None if asked => CloseReason::Drain,
                                _ => CloseReason::Client,
                            };
                        }
                        next = poll_fn(|cx| when_woken.poll(others.as_mut(), cx)) => match next {
                            Ok(event) => event,
                            Err(why) => break why,
                        },
                    }
                };
                let next = stage.next(event, conn.facts());
                if next == Stage::Closing && stage != Stage::Closing {
                    conn.tell(Stage::reason(event));
                    connection.as_mut().graceful_shutdown();
                }
                stage = next;
            };
            shutdown.metrics().connection_closed(closed);
        }
    }
}

/// Resolves at the connection's moment in the drain spread: the signal,
/// plus its drawn fraction of the lame duck (`drain_delay`, or longer if the
/// trigger asked for it).
async fn spread_due(shutdown: &Watch, plan: &Plan, drain_delay: Duration) {
    shutdown.triggered().await;
    let signalled = shutdown.triggered_at().unwrap_or_else(Instant::now);
    let window = drain_delay.max(shutdown.min_lame_duck());
    at(Some(signalled + plan.told_after(window))).await;
}

/// Resolves at `instant`, or never; its timer is made when first polled,
/// boxed.
async fn at(instant: Option<Instant>) {
    match instant {
        Some(instant) => lazily(|| tokio::time::sleep_until(instant)).await,
        None => std::future::pending().await,
    }
}

/// The future `make` makes, made when first polled and boxed: a deadline
/// a connection seldom reaches costs its task a pointer, not a timer.
async fn lazily<F: Future>(make: impl FnOnce() -> F) -> F::Output {
    Box::pin(make()).await
}

/// Logs why the server closes a connection.
fn closing(peer: &impl Debug, why: CloseReason, what: &'static str) -> CloseReason {
    debug!(?peer, "{what}");
    why
}

/// Polls `connection`, except that an HTTP/2 connection whose streams are
/// still being answered is put off once, behind the tasks ready to run.
///
/// Each stream's answer wakes the connection's task, and each poll writes
/// what is ready: polled at every wake, a connection carrying many streams
/// makes a write — with `TCP_NODELAY`, a packet — per answer. Put off to
/// the back of the run queue, the poll finds the answers of the streams
/// that ran meanwhile and writes them together. A connection with nothing
/// in flight, or speaking HTTP/1, is polled at once.
///
/// One write for a whole batch would make the client wait for its last
/// answer before it can work on the first, and the server wait for the
/// client: a large batch is written in two halves instead. A stream that
/// starts once half of its batch is answered goes behind this task
/// ([`ConnState::half_answered`]).
fn coalesced<'a, F: Future>(
    mut connection: Pin<&'a mut F>,
    conn: &'a ConnState,
) -> impl Future<Output = F::Output> + 'a {
    let mut put_off = false;
    std::future::poll_fn(move |cx| {
        if !put_off && conn.protocol() == Protocol::Http2 && conn.busy() > 0 {
            put_off = true;
            // Woken while it runs, a task is queued behind the ready ones.
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        put_off = false;
        conn.writing();
        connection.as_mut().poll(cx)
    })
}

/// Spawns HTTP/2 stream tasks on the lifecycle's tracker, so the drain
/// waits for them as it waits for connections.
#[derive(Clone, Debug)]
struct TrackedExecutor(TaskTracker);

impl<F> hyper::rt::Executor<F> for TrackedExecutor
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    fn execute(&self, future: F) {
        self.0.spawn(future);
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
    use std::task::{Context, Wake, Waker};

    use hyper::Version;

    use super::*;
    use crate::connection::BusyGuard;

    /// Counts the wakes it gets.
    #[derive(Default)]
    pub(crate) struct Wakes(pub(crate) AtomicUsize);

    impl Wake for Wakes {
        fn wake(self: Arc<Self>) {
            self.wake_by_ref();
        }

        fn wake_by_ref(self: &Arc<Self>) {
            self.0.fetch_add(1, Relaxed);
        }
    }

    /// Polls `coalesced` three times over a connection that counts its
    /// polls: how many reached it, and how many wakes the task got.
    fn three_polls(conn: &ConnState) -> (usize, usize) {
        let wakes = Arc::new(Wakes::default());
        let waker = Waker::from(Arc::clone(&wakes));
        let mut cx = Context::from_waker(&waker);
        let polled = AtomicUsize::new(0);
        let mut connection = pin!(std::future::poll_fn(|_| {
            polled.fetch_add(1, Relaxed);
            Poll::<()>::Pending
        }));
        let mut coalesced = pin!(coalesced(connection.as_mut(), conn));
        for _ in 0..3 {
            assert!(coalesced.as_mut().poll(&mut cx).is_pending());
        }
        (polled.load(Relaxed), wakes.0.load(Relaxed))
    }

    fn conn(version: Version) -> Arc<ConnState> {
        let conn = ConnState::new(&LifecycleMetrics::default(), true);
        conn.observe(version);
        Arc::new(conn)
    }

    #[test]
    fn a_busy_http2_connection_is_put_off_once_per_wake() {
        let http2 = conn(Version::HTTP_2);
        let _streams = [
            BusyGuard::new(Arc::clone(&http2)),
            BusyGuard::new(Arc::clone(&http2)),
        ];
        // Put off, polled, put off again: every other poll reaches it, and
        // each putting off wakes the task to come back.
        assert_eq!(three_polls(&http2), (1, 2));
    }

    #[test]
    fn an_idle_http2_connection_and_an_http1_one_are_polled_at_once() {
        assert_eq!(three_polls(&conn(Version::HTTP_2)), (3, 0));
        let http1 = conn(Version::HTTP_11);
        let _request = BusyGuard::new(Arc::clone(&http1));
        assert_eq!(three_polls(&http1), (3, 0));
    }
}
