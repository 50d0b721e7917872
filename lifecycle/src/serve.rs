//! The accept loop and the drain: phases 2 to 5 of the shutdown timeline.

use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::config::{ServeConfig, ACCEPT_ERROR_BACKOFF};
use crate::listener::{is_connection_error, Listener};
use crate::metrics::ClosedBy;
use crate::task::{Connections, HttpService};
use crate::{Phase, Shutdown, Watch, DEADLINE_CLEANUP_GRACE, LOG_TARGET};

/// At most this many connections are taken from the listen backlog when the
/// listener stops; more than any kernel backlog holds.
const MAX_BACKLOG_DRAIN: usize = 65_536;

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

/// Serves HTTP/1.1 and HTTP/2 (cleartext, prior knowledge) on `listener`
/// with `service` until `owner` is triggered, then runs the lame-duck
/// period and the drain of [`ServeConfig`]: phases 2 to 5. Resolves when
/// the last connection has closed, or when the deadline or a forced
/// shutdown gave up on the rest.
///
/// The building block of [`Lifecycle::run`](crate::Lifecycle::run), which
/// adds signals, workers, finalizers and the upgrade; use it directly to
/// drive the timeline from a loop of your own. It never binds or installs
/// signal handlers. The deadline abandons requests only: it is not a forced
/// shutdown, so the workers and finalizers that run after it still work.
pub async fn serve<L, S>(
    mut listener: L,
    service: S,
    owner: &Shutdown,
    config: ServeConfig,
) -> DrainReport
where
    L: Listener,
    S: HttpService,
{
    let shutdown = owner.watch();
    let connections = Connections::new(service, shutdown.clone(), &config);
    if let Err(error) = listener.set_send_timeout(config.send_timeout) {
        warn!(%error, "cannot set the send timeout; clients that stop reading keep their connections");
    }
    info!("listening on {}", listener.describe());

    // Phases 1-2: accept until the lame-duck period after the signal is over.
    let stop_accepting = CancellationToken::new();
    let accepting = accept_until(&mut listener, &stop_accepting, &connections);
    let lame_duck = async {
        shutdown.triggered().await;
        let signalled = Instant::now();
        let delay = config.drain_delay.max(shutdown.min_lame_duck());
        if !delay.is_zero() {
            info!(target: LOG_TARGET, ?delay, "lame duck: still serving, asking clients to reconnect elsewhere");
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
    let backlog_accepted = take_backlog(listener, &connections, shutdown);
    let draining = Instant::now();
    let metrics = shutdown.metrics();
    owner.start_draining();
    info!(
        target: LOG_TARGET,
        backlog_accepted,
        connections = metrics.open_connections(),
        requests_in_flight = metrics.requests_in_flight(),
        "listener closed; draining"
    );

    // Phases 4-5: every connection is told to close once idle; the deadline.
    let outcome = drain(owner, config.shutdown_timeout).await;
    let drain = draining.elapsed();
    let abandoned = shutdown.abandoned_work().unwrap_or_default();
    metrics.set_drain(drain);
    let counts = metrics.snapshot();
    owner.set_phase(Phase::Finalizing);
    info!(target: LOG_TARGET, ?outcome, ?drain, "drain finished");

    DrainReport {
        outcome,
        reason: shutdown.reason().map(str::to_owned),
        lame_duck: draining - signalled,
        drain,
        backlog_accepted,
        requests_drained: counts.requests_drained,
        requests_aborted: counts.requests_aborted,
        requests_abandoned: abandoned.requests,
        closed_by_client: counts.closed_by(ClosedBy::Client),
        closed_by_server: counts.closed_by(ClosedBy::Server),
        connections_abandoned: abandoned.connections,
    }
}

/// Serves the connections already waiting in `listener`'s backlog (unless
/// the shutdown is forced), even past the connection limit, then closes
/// it. Returns how many there were.
fn take_backlog<L: Listener, S: HttpService>(
    mut listener: L,
    connections: &Connections<S>,
    shutdown: &Watch,
) -> usize {
    if shutdown.is_forced() {
        return 0;
    }
    let queued = listener.accept_queued(MAX_BACKLOG_DRAIN);
    let taken = queued.len();
    for (io, peer) in queued {
        connections.spawn(io, peer, connections.try_permit());
    }
    taken
}

/// Waits for the tracked work to finish, up to `timeout`; then fires the
/// request tokens, grants the cleanup grace and abandons the rest.
async fn drain(owner: &Shutdown, timeout: Duration) -> DrainOutcome {
    let shutdown = owner.watch();
    let tracker = shutdown.tracker();
    tracker.close();
    let outcome = tokio::select! {
        biased;
        () = shutdown.forced() => DrainOutcome::Forced,
        () = tracker.wait() => DrainOutcome::Clean,
        () = tokio::time::sleep(timeout) => {
            warn!(
                target: LOG_TARGET,
                requests_in_flight = shutdown.metrics().requests_in_flight(),
                connections = shutdown.metrics().open_connections(),
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
    if outcome != DrainOutcome::Clean {
        owner.abandon_requests();
        let abandoned = shutdown.abandoned_work().unwrap_or_default();
        warn!(
            target: LOG_TARGET,
            requests = abandoned.requests,
            connections = abandoned.connections,
            "abandoned the remaining work"
        );
    }
    outcome
}

/// Accepts connections until `stop` is cancelled. At the connection limit
/// it waits for a connection to close before accepting the next. Errors are
/// absorbed: the loop never ends on its own.
async fn accept_until<L: Listener, S: HttpService>(
    listener: &mut L,
    stop: &CancellationToken,
    connections: &Connections<S>,
) {
    loop {
        let accept = async {
            let permit = connections.permit().await;
            (listener.accept().await, permit)
        };
        let Some((accepted, permit)) = stop.run_until_cancelled(accept).await else {
            return;
        };
        match accepted {
            Ok((io, peer)) => connections.spawn(io, peer, permit),
            Err(error) if is_connection_error(&error) => {
                debug!(%error, "connection failed before it was accepted");
            }
            Err(error) => {
                connections.metrics().accept_failed();
                warn!(%error, backoff = ?ACCEPT_ERROR_BACKOFF, "accept failed; backing off");
                stop.run_until_cancelled(tokio::time::sleep(ACCEPT_ERROR_BACKOFF))
                    .await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};

    use tokio::net::TcpListener;

    use super::*;

    // Connections that completed the handshake but were not yet accepted
    // when the accept loop stopped must be served, not reset by close().
    #[tokio::test]
    async fn backlog_connections_are_taken_before_the_listener_closes() {
        let mut listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let clients: Vec<std::net::TcpStream> = (0..5)
            .map(|_| std::net::TcpStream::connect(addr).expect("connect into the backlog"))
            .collect();

        let mut accepted = listener.accept_queued(MAX_BACKLOG_DRAIN);
        assert_eq!(accepted.len(), 5);
        drop(listener);

        // Each accepted stream is a live connection to its client.
        for (client, (server, _)) in clients.iter().zip(accepted.iter_mut()) {
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
        assert_eq!(refused.kind(), std::io::ErrorKind::ConnectionRefused);
    }
}
