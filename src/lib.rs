//! lameduck: an HTTP service that stops, restarts and rolls out under load
//! without dropping a request or losing a byte.
//!
//! # The lifecycle in ten lines
//! 1. `main` installs SIGTERM/SIGINT/SIGHUP handlers, then [`App::build`]
//!    opens the database, applies spilled state, binds (or inherits) the
//!    listener and starts the workers.
//! 2. [`lifecycle::Lifecycle`] accepts connections on a `run_until_cancelled`
//!    loop and hands each to a `TaskTracker`; every request gets a
//!    cancellation token that fires if the client hangs up.
//! 3. The first signal turns `/readyz` to 503 and starts the lame-duck
//!    period: still serving, but asking clients to reconnect elsewhere.
//! 4. Then the listener closes (after taking its backlog) and every
//!    connection is told to shut down gracefully: the drain.
//! 5. Work still running at the deadline is cancelled, given a short grace
//!    to clean up, and abandoned; a second signal abandons it at once.
//! 6. Workers stop and finalizers run in reverse order (the final flush of
//!    in-memory state, then the pool) — after a passed deadline too; after a
//!    second signal, force hooks spill that state to disk instead. The
//!    outcome becomes an exit code.
//!
//! # Layout
//! - [`lifecycle`]: the `lameduck-lifecycle` crate (`lifecycle/`), owner of
//!   the timeline: signals, the accept loop and its connection deadlines,
//!   the per-request scope, workers and finalizers, the admin socket.
//!   Domain-blind: depend on it unchanged.
//! - [`handoff`]: the `lameduck-handoff` crate (`handoff/`): socket
//!   activation, systemd's notifications, the in-place upgrade.
//! - The `lameduck-service` crate (`service/`): the lifecycle's flags, exit
//!   codes ([`exit`]), the health probe ([`healthcheck`]), listening
//!   addresses, the lifecycle's metrics, the pid file.
//! - [`app`]: wires the domain to the lifecycle.
//! - [`config`]: command line and environment.
//! - [`http`]: router, health, readiness, metrics.
//! - [`error`]: the JSON error every handler answers with.
//! - [`links`]: the example domain, a link shortener (replace it).
//! - [`storage`]: the example's database (SQLite or PostgreSQL), and what
//!   the service knows of its health.
//! - [`breaker`]: a circuit breaker, for any dependency.
//! - [`telemetry`]: logging, and traces over OTLP.

pub mod app;
pub mod breaker;
pub mod config;
pub mod error;
pub mod http;
pub mod links;
pub mod listen;
pub mod storage;
pub mod telemetry;
pub mod tls;

pub use app::App;

/// The service's name as its package spells it: the command, and every
/// display of the name (messages, reports, the names its database sessions
/// and files carry). Read from `Cargo.toml` at compile time: renaming the
/// package renames them all.
pub const NAME: &str = env!("CARGO_PKG_NAME");

/// The service's crate name (the package name with `_` for `-`): the
/// prefix of its metrics and of its log targets.
pub const CRATE_NAME: &str = env!("CARGO_CRATE_NAME");
/// The handoff crate: restarts without a closed socket.
pub use lameduck_handoff as handoff;
/// The lifecycle crate, under the name the service has always used for it.
pub use lameduck_lifecycle as lifecycle;
/// Exit codes, from the service crate.
pub use lameduck_service::exit;
/// The container health probe, from the service crate.
pub use lameduck_service::healthcheck;
