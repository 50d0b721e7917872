//! The accept loop and the drain: phases 2 to 5 of the shutdown timeline.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, info, warn};

use super::connection::{ConnState, ObservedStream};
use super::metrics::ClosedBy;
use super::request::Scoped;
use super::{Phase, Shutdown, Watch, DEADLINE_CLEANUP_GRACE, LOG_TARGET};

/// How long the accept loop pauses after an error that is not about one
/// connection (for example EMFILE, too many open files), so that it does not
/// spin while descriptors are exhausted.
pub const ACCEPT_ERROR_BACKOFF: Duration = Duration::from_millis(100);

/// How long the drain lets a connection that has not sent its first request
/// yet deliver it. hyper cancels a connection still detecting its protocol
/// at once, which would reset a request already on its way (a connection
/// just taken from the backlog); Go's `Server.Shutdown` gives new
/// connections a similar grace. Bounded by the shutdown timeout.
pub const FIRST_REQUEST_GRACE: Duration = Duration::from_secs(1);

/// How long a connection told to close (GOAWAY) may stay open with nothing
/// in flight: an HTTP/2 client that never acknowledges the GOAWAY's PING
/// (or a dead peer) must not hold the drain until the deadline.
pub const GOAWAY_GRACE: Duration = Duration::from_secs(1);

/// At most this many connections are taken from the listen backlog when the
/// listener stops; more than any kernel backlog holds.
const MAX_BACKLOG_DRAIN: usize = 65_536;

/// How connections are served and how the server shuts down; every field
/// is an operator's choice (see `ServerConfig` for the flags).
#[derive(Clone, Copy, Debug)]
pub struct ServeConfig {
    /// Lame-duck period: how long the server keeps accepting after the
    /// signal, so that a load balancer which has not yet seen readiness turn
    /// false still reaches a server that answers.
    pub drain_delay: Duration,
    /// How long in-flight work may take after the listener closes before its
    /// cancellation tokens fire.
    pub shutdown_timeout: Duration,
    /// Most connections open at once; at the limit the accept loop waits
    /// (the kernel backlog queues, then refuses) instead of failing.
    pub max_connections: usize,
    /// How long a client may take to send a request's headers (HTTP/1), so
    /// that slow-header clients (slowloris) cannot hold connections.
    pub header_read_timeout: Duration,
    /// A connection with no request in flight for this long is closed
    /// gracefully (HTTP/1 keep-alive and HTTP/2 alike).
    pub idle_timeout: Duration,
    /// Most concurrent streams on one HTTP/2 connection.
    pub h2_max_concurrent_streams: u32,
}

impl Default for ServeConfig {
    fn default() -> Self {
        ServeConfig {
            drain_delay: Duration::ZERO,
            shutdown_timeout: Duration::from_secs(20),
            max_connections: 10_000,
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            h2_max_concurrent_streams: 256,
        }
    }
}

/// How the drain ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DrainOutcome {
    /// Every request finished on its own.
    Clean,
    /// The shutdown timeout passed with work still running; that work was
    /// cancelled and, after the cleanup grace, abandoned.
    DeadlineExceeded,
    /// A forced shutdown (a second signal) abandoned whatever was running.
    Forced,
}

/// What the drain did, for the exit summary.
#[derive(Clone, Debug)]
pub struct DrainReport {
    /// How the drain ended.
    pub outcome: DrainOutcome,
    /// Why shutdown started (the signal, or the application's reason).
    pub reason: Option<String>,
    /// Time from the signal to closing the listener.
    pub lame_duck: Duration,
    /// Time from closing the listener to the end of the drain.
    pub drain: Duration,
    /// Connections taken from the listen backlog after accepting stopped.
    pub backlog_accepted: usize,
    /// Requests that completed after the signal.
    pub requests_drained: u64,
    /// Requests dropped before their response (client hang-ups and
    /// abandoned work), over the server's lifetime.
    pub requests_aborted: u64,
    /// Requests still running when the drain gave up on them.
    pub requests_abandoned: i64,
    /// Connections the client closed.
    pub closed_by_client: u64,
    /// Connections the server asked to close.
    pub closed_by_server: u64,
    /// Connections still open when the drain gave up on them.
    pub connections_abandoned: i64,
}

/// A response body hyper can send from any thread.
pub trait ResponseBody:
    hyper::body::Body<Data: Send, Error: Into<Box<dyn std::error::Error + Send + Sync>>>
    + Send
    + 'static
{
}

impl<B> ResponseBody for B where
    B: hyper::body::Body<Data: Send, Error: Into<Box<dyn std::error::Error + Send + Sync>>>
        + Send
        + 'static
{
}

/// Serves HTTP/1.1 and HTTP/2 (cleartext, prior knowledge) on `listener`
/// with `service` until `shutdown` is triggered, then runs the lame-duck
/// period and the drain of [`ServeConfig`]. Resolves when the last
/// connection has closed, or when the deadline or a forced shutdown gave up
/// on the rest.
///
/// It never binds or installs signal handlers: the caller passes an already
/// bound listener (port 0 in tests, an inherited socket in production) and
/// triggers the shutdown from wherever it likes, through a
/// [`Trigger`](super::Trigger) or [`Force`](super::Force) handle.
///
/// The deadline abandons requests only: it never counts as a forced
/// shutdown, so the workers and finalizers that run after `serve` still do
/// their work.
pub async fn serve<S, B>(
    listener: TcpListener,
    service: S,
    owner: &Shutdown,
    config: ServeConfig,
) -> DrainReport
where
    S: tower::Service<Request<Incoming>, Response = Response<B>, Error = Infallible, Future: Send>
        + Clone
        + Send
        + 'static,
    B: ResponseBody + Unpin,
{
    let shutdown = owner.watch();
    let connections = Connections {
        builder: connection_builder(shutdown.tracker().clone(), &config),
        service,
        shutdown: shutdown.clone(),
        limit: Arc::new(Semaphore::new(config.max_connections)),
        idle_timeout: config.idle_timeout,
        header_read_timeout: config.header_read_timeout,
    };
    match listener.local_addr() {
        Ok(addr) => info!("listening on http://{addr}"),
        Err(error) => warn!(%error, "listening on an unknown address"),
    }

    // Phases 1-2: accept until the lame-duck period after the signal is over.
    let stop_accepting = CancellationToken::new();
    let accepting = accept_until(&listener, &stop_accepting, &connections);
    let lame_duck = async {
        shutdown.triggered().await;
        let signalled = Instant::now();
        let delay = config.drain_delay.max(shutdown.min_lame_duck());
        if !delay.is_zero() {
            info!(
                target: LOG_TARGET,
                ?delay,
                "lame duck: still serving, asking clients to reconnect elsewhere"
            );
            tokio::select! {
                () = tokio::time::sleep(delay) => {}
                () = shutdown.forced() => {}
            }
        }
        stop_accepting.cancel();
        signalled
    };
    let ((), signalled) = tokio::join!(accepting, lame_duck);

    // Phase 3: take what is already in the backlog, then close the listener.
    let backlog_accepted = if shutdown.is_forced() {
        0
    } else {
        accept_backlog(listener, &connections)
    };
    let draining = Instant::now();
    let lame_duck = draining - signalled;
    let metrics = shutdown.metrics();
    info!(
        target: LOG_TARGET,
        backlog_accepted,
        connections = connections_open(shutdown),
        requests_in_flight = metrics.requests_in_flight.get(),
        "listener closed; draining"
    );

    // Phase 4: every connection is told to close once idle.
    owner.start_draining();
    let tracker = shutdown.tracker();
    tracker.close();
    let outcome = tokio::select! {
        biased;
        () = shutdown.forced() => DrainOutcome::Forced,
        () = tracker.wait() => DrainOutcome::Clean,
        () = tokio::time::sleep(config.shutdown_timeout) => {
            // Phase 5: the deadline. Let handlers clean up, then give up.
            warn!(
                target: LOG_TARGET,
                requests_in_flight = metrics.requests_in_flight.get(),
                connections = connections_open(shutdown),
                grace = ?DEADLINE_CLEANUP_GRACE,
                "shutdown timeout passed: cancelling in-flight requests"
            );
            owner.cancel_requests();
            tokio::select! {
                () = tracker.wait() => {}
                () = tokio::time::sleep(DEADLINE_CLEANUP_GRACE) => {}
                () = shutdown.forced() => {}
            }
            DrainOutcome::DeadlineExceeded
        }
    };
    let drain = draining.elapsed();

    if outcome != DrainOutcome::Clean {
        owner.abandon_requests();
    }
    let abandoned = shutdown.abandoned_work().unwrap_or_default();
    if outcome != DrainOutcome::Clean {
        warn!(
            target: LOG_TARGET,
            requests = abandoned.requests,
            connections = abandoned.connections,
            "abandoned the remaining work"
        );
    }
    metrics.drain_seconds.set(drain.as_secs_f64());
    owner.set_phase(Phase::Finalizing);
    info!(target: LOG_TARGET, ?outcome, ?drain, "drain finished");

    DrainReport {
        outcome,
        reason: shutdown.reason().map(str::to_owned),
        lame_duck,
        drain,
        backlog_accepted,
        requests_drained: metrics.requests_drained.get(),
        requests_aborted: metrics.requests_aborted.get(),
        requests_abandoned: abandoned.requests,
        closed_by_client: metrics.connections_closed_by(ClosedBy::client),
        closed_by_server: metrics.connections_closed_by(ClosedBy::server),
        connections_abandoned: abandoned.connections,
    }
}

fn connections_open(shutdown: &Watch) -> i64 {
    shutdown.metrics().connections_open_total()
}

/// Accepts connections until `stop` is cancelled. At the connection limit
/// it waits for a connection to close before accepting the next. Errors are
/// absorbed: the loop never ends on its own.
async fn accept_until<S>(listener: &TcpListener, stop: &CancellationToken, connections: &S)
where
    S: SpawnConnection,
{
    let accept = || async {
        let permit = connections.permit().await;
        (listener.accept().await, permit)
    };
    while let Some((accepted, permit)) = stop.run_until_cancelled(accept()).await {
        match accepted {
            Ok((stream, peer)) => connections.spawn(stream, peer, permit),
            Err(error) if is_connection_error(&error) => {
                debug!(%error, "connection failed before it was accepted");
            }
            Err(error) => {
                connections.metrics().accept_errors.inc();
                warn!(%error, backoff = ?ACCEPT_ERROR_BACKOFF, "accept failed; backing off");
                stop.run_until_cancelled(tokio::time::sleep(ACCEPT_ERROR_BACKOFF))
                    .await;
            }
        }
    }
}

/// Accepts, without waiting, every connection already in the listen backlog,
/// then closes the listener so that new attempts are refused rather than
/// left to time out.
fn accept_backlog<S: SpawnConnection>(listener: TcpListener, connections: &S) -> usize {
    // Asking the socket directly, rather than through the reactor, sees
    // connections that arrived since the reactor last polled.
    let listener = match listener.into_std() {
        Ok(listener) => listener,
        Err(error) => {
            warn!(%error, "could not inspect the listen backlog; closing the listener");
            return 0;
        }
    };
    let mut accepted = 0;
    for _ in 0..MAX_BACKLOG_DRAIN {
        match listener.accept() {
            Ok((stream, peer)) => {
                let stream = stream
                    .set_nonblocking(true)
                    .and_then(|()| TcpStream::from_std(stream));
                match stream {
                    Ok(stream) => {
                        // Already waiting: served even past the limit.
                        connections.spawn(stream, peer, connections.try_permit());
                        accepted += 1;
                    }
                    Err(error) => warn!(%error, %peer, "dropping a connection from the backlog"),
                }
            }
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => break,
            Err(error) if is_connection_error(&error) => {}
            Err(error) => {
                warn!(%error, "accept failed while emptying the backlog");
                break;
            }
        }
    }
    accepted
}

/// Errors that concern one connection, not the listener.
fn is_connection_error(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}

fn connection_builder(
    tracker: TaskTracker,
    config: &ServeConfig,
) -> auto::Builder<TrackedExecutor> {
    let mut builder = auto::Builder::new(TrackedExecutor(tracker));
    // hyper's own header timeout also runs between keep-alive requests,
    // which would make it the idle timeout; the connection task enforces
    // the header deadline instead (`ConnState::head_overdue`).
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(None);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(config.h2_max_concurrent_streams);
    builder
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

// === impl Connections ===

/// Everything needed to serve one more connection.
struct Connections<S> {
    builder: auto::Builder<TrackedExecutor>,
    service: S,
    shutdown: Watch,
    /// One permit per open connection.
    limit: Arc<Semaphore>,
    idle_timeout: Duration,
    header_read_timeout: Duration,
}

trait SpawnConnection {
    /// Serves `stream` on a tracked task that holds `permit` until the
    /// connection closes.
    fn spawn(&self, stream: TcpStream, peer: SocketAddr, permit: Option<OwnedSemaphorePermit>);
    fn metrics(&self) -> &super::LifecycleMetrics;
    /// Waits for room under the connection limit.
    async fn permit(&self) -> Option<OwnedSemaphorePermit>;
    /// Room under the connection limit, if there is any now.
    fn try_permit(&self) -> Option<OwnedSemaphorePermit>;
}

impl<S, B> SpawnConnection for Connections<S>
where
    S: tower::Service<Request<Incoming>, Response = Response<B>, Error = Infallible, Future: Send>
        + Clone
        + Send
        + 'static,
    B: ResponseBody + Unpin,
{
    fn metrics(&self) -> &super::LifecycleMetrics {
        self.shutdown.metrics()
    }

    async fn permit(&self) -> Option<OwnedSemaphorePermit> {
        // The semaphore is never closed.
        Arc::clone(&self.limit).acquire_owned().await.ok()
    }

    fn try_permit(&self) -> Option<OwnedSemaphorePermit> {
        Arc::clone(&self.limit).try_acquire_owned().ok()
    }

    fn spawn(&self, stream: TcpStream, peer: SocketAddr, permit: Option<OwnedSemaphorePermit>) {
        if let Err(error) = stream.set_nodelay(true) {
            debug!(%error, %peer, "could not set TCP_NODELAY");
        }
        let conn = Arc::new(ConnState::new(
            self.shutdown.metrics(),
            self.shutdown.request_token(),
        ));
        let service = Scoped::for_connection(
            self.service.clone(),
            self.shutdown.clone(),
            Arc::clone(&conn),
        );
        let builder = self.builder.clone();
        let shutdown = self.shutdown.clone();
        let idle_timeout = self.idle_timeout;
        let header_read_timeout = self.header_read_timeout;
        let stream = ObservedStream::new(stream, Arc::clone(&conn));
        self.shutdown.tracker().spawn(async move {
            let _permit = permit;
            let connection = builder.serve_connection_with_upgrades(TokioIo::new(stream), service);
            let mut connection = pin!(connection);
            let mut lame_duck_seen = false;
            let mut draining_seen = false;
            let mut asked_to_close = false;
            // A connection that has not carried a request when the drain
            // starts may still deliver its first one: hyper would drop it
            // while it is detecting the protocol, failing a request already
            // on its way.
            let first_request_grace = async {
                tokio::select! {
                    () = conn.first_request.cancelled() => {}
                    () = tokio::time::sleep(FIRST_REQUEST_GRACE) => {}
                }
            };
            let mut first_request_grace = pin!(first_request_grace);
            let idle = conn.idle_for(idle_timeout);
            let mut idle = pin!(idle);
            let head_overdue = conn.head_overdue(header_read_timeout);
            let mut head_overdue = pin!(head_overdue);
            // Once the connection is asked to close: how long it may linger.
            let lingered = conn.idle_for(GOAWAY_GRACE);
            let mut lingered = pin!(lingered);
            // Every poll polls each enabled branch, so the conditions keep
            // the shutdown tokens out of it until the timeline reaches them:
            // while serving, one shared token is watched, not four. An
            // HTTP/1 connection has nothing to do at the signal (its next
            // response says `Connection: close`), so it sleeps through the
            // lame duck and wakes once, at the drain.
            let closed_by = loop {
                tokio::select! {
                    // The connection first: one that closes as soon as it
                    // is asked to never arms the other branches' timers.
                    biased;
                    result = connection.as_mut() => {
                        if let Err(error) = result {
                            debug!(%peer, %error, "connection ended with an error");
                        }
                        break if asked_to_close || conn.close_sent() {
                            ClosedBy::server
                        } else {
                            ClosedBy::client
                        };
                    }
                    // Abandoning comes after the trigger and, within
                    // microseconds, the drain; whichever is seen first
                    // enables this.
                    () = shutdown.abandoned(), if lame_duck_seen || draining_seen => {
                        break ClosedBy::abandoned;
                    }
                    // Lame duck: GOAWAY at once to HTTP/2 connections that have
                    // carried a request (a fresh one gets it with its first,
                    // through `goaway`). A connection whose protocol is not
                    // known yet may turn out HTTP/2, so it watches too.
                    () = shutdown.triggered(), if !lame_duck_seen && !conn.is_http1() => {
                        lame_duck_seen = true;
                        if conn.is_http2() && conn.has_served() && !asked_to_close {
                            connection.as_mut().graceful_shutdown();
                            asked_to_close = true;
                        }
                    }
                    () = conn.goaway.cancelled(), if lame_duck_seen && !asked_to_close => {
                        connection.as_mut().graceful_shutdown();
                        asked_to_close = true;
                    }
                    // The drain: close at once if the connection has served,
                    // else after its first request or the grace.
                    () = shutdown.draining(), if !draining_seen => {
                        draining_seen = true;
                        if conn.has_served() && !asked_to_close {
                            connection.as_mut().graceful_shutdown();
                            asked_to_close = true;
                        }
                    }
                    () = &mut first_request_grace, if draining_seen && !asked_to_close => {
                        connection.as_mut().graceful_shutdown();
                        asked_to_close = true;
                    }
                    () = &mut idle, if !asked_to_close => {
                        debug!(%peer, "closing an idle connection");
                        connection.as_mut().graceful_shutdown();
                        asked_to_close = true;
                    }
                    () = &mut head_overdue => {
                        debug!(%peer, "request head not received in time; closing");
                        break ClosedBy::server;
                    }
                    () = &mut lingered, if asked_to_close => {
                        debug!(%peer, "asked to close but still open; dropping it");
                        break ClosedBy::server;
                    }
                }
            };
            shutdown.metrics().connection_closed(closed_by);
        });
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::sync::Mutex;

    use super::*;
    use crate::lifecycle::LifecycleMetrics;

    /// Collects the streams instead of serving them.
    #[derive(Default)]
    struct Collect {
        streams: Mutex<Vec<TcpStream>>,
        metrics: LifecycleMetrics,
    }

    impl SpawnConnection for Collect {
        fn spawn(
            &self,
            stream: TcpStream,
            _peer: SocketAddr,
            _permit: Option<OwnedSemaphorePermit>,
        ) {
            self.streams.lock().expect("not poisoned").push(stream);
        }

        fn metrics(&self) -> &LifecycleMetrics {
            &self.metrics
        }

        async fn permit(&self) -> Option<OwnedSemaphorePermit> {
            None
        }

        fn try_permit(&self) -> Option<OwnedSemaphorePermit> {
            None
        }
    }

    // Connections that completed the handshake but were not yet accepted
    // when the accept loop stopped must be served, not reset by close().
    #[tokio::test]
    async fn backlog_connections_are_taken_before_the_listener_closes() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let clients: Vec<std::net::TcpStream> = (0..5)
            .map(|_| std::net::TcpStream::connect(addr).expect("connect into the backlog"))
            .collect();

        let collect = Collect::default();
        assert_eq!(accept_backlog(listener, &collect), 5);

        // Each accepted stream is a live connection to its client.
        let mut accepted = collect.streams.into_inner().expect("not poisoned");
        for (client, server) in clients.iter().zip(accepted.iter_mut()) {
            let mut client = client;
            client.write_all(b"x").expect("client writes");
            let mut byte = [0u8; 1];
            server.readable().await.expect("readable");
            assert_eq!(server.try_read(&mut byte).expect("server reads"), 1);
            server.try_write(b"y").expect("server writes");
            client.read_exact(&mut byte).expect("client reads");
            assert_eq!(&byte, b"y");
        }
        // And the listener is gone: new attempts are refused.
        let refused = std::net::TcpStream::connect(addr).expect_err("listener closed");
        assert_eq!(refused.kind(), io::ErrorKind::ConnectionRefused);
    }
}
