//! How connections are served and how the server shuts down: the
//! operator's choices, and the fixed graces of the timeline.

use std::time::Duration;

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

/// How much of the lame-duck period connections take to hear that they
/// must close.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DrainSpread {
    /// Each connection is told at its own moment, drawn uniformly over the
    /// lame-duck period but its last second ([`spread_moment`](crate::spread_moment)):
    /// an idle one is closed then, a busy one gets
    /// `Connection: close` on its next response (HTTP/1) or a GOAWAY
    /// (HTTP/2). Its clients reconnect elsewhere at an even rate instead of
    /// all at once (Envoy's gradual drain, HAProxy's `close-spread-time`).
    #[default]
    Gradual,
    /// Every response after the signal says `Connection: close` and every
    /// HTTP/2 connection gets its GOAWAY at once; idle HTTP/1 connections
    /// are closed when the listener closes.
    Immediate,
}

/// How long an HTTP/1 connection told to close (its moment in the drain
/// spread, its age) must have carried no request before the server closes
/// it: one idle that long is closed at its moment, one used more recently
/// is answered with `Connection: close` on its next request, or closed
/// once idle that long (or at the drain). Closing an idle keep-alive
/// connection races the request its client may be sending on it right
/// then; a client that has left a connection unused this long rarely picks
/// that very moment, where one pausing a few milliseconds between requests
/// (and stalled by a busy machine) would.
pub const SETTLE: Duration = Duration::from_secs(1);

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
    /// How long what the server sent may go unacknowledged (TCP; see
    /// [`Listener::set_send_timeout`](crate::Listener::set_send_timeout)),
    /// or an HTTP/2 answer wait for room in the client's flow-control
    /// window, before the connection is closed: a client that stopped
    /// taking its answers holds its connection busy, out of the idle
    /// timeout's reach.
    pub send_timeout: Duration,
    /// How the lame duck spreads telling connections to close.
    pub drain_spread: DrainSpread,
    /// A connection open this long (give or take the jitter) is asked to
    /// close as at a drain, so that clients of long-lived pools move to
    /// replicas added since (`None`: never).
    pub max_connection_age: Option<Duration>,
    /// Each connection's age limit is drawn within this fraction either
    /// side of `max_connection_age` (0.1: ±10 %, gRPC's A9), so that the
    /// connections of one burst do not all close together.
    pub max_connection_age_jitter: f64,
    /// How long a connection past its age may take to finish what it has in
    /// flight (a long stream) before it is dropped with it.
    pub max_connection_age_grace: Duration,
    /// Seed of each connection's draws (its moment in the drain spread, its
    /// age limit): a fixed seed makes them reproducible, see
    /// [`draw`](crate::draw).
    pub connection_seed: u64,
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
            send_timeout: Duration::from_secs(30),
            drain_spread: DrainSpread::Gradual,
            max_connection_age: None,
            max_connection_age_jitter: 0.1,
            max_connection_age_grace: Duration::from_secs(30),
            connection_seed: crate::rotation::random_seed(),
        }
    }
}
