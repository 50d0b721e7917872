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
        }
    }
}
