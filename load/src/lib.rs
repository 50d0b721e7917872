//! The rollout harness and the benchmarks of lameduck, side by side with
//! what a user would pick instead: a minimal axum app, axum with the usual
//! tower-http stack, and bare hyper (and, in the rollout, lameduck's own app
//! on plain `axum::serve`).
//!
//! # What it proves
//! 1. `load rollout` rolls R replicas behind a real HAProxy that health-checks
//!    `/readyz` (so endpoint removal lags the SIGTERM), like a Deployment with
//!    `maxSurge 1, maxUnavailable 0`, under constant open-loop traffic, and
//!    classifies every request's fate. It runs the same seed and rate against
//!    lameduck, lameduck with `--drain-delay 0s` and plain `axum::serve`, then
//!    counts the redirects answered against the hits stored in PostgreSQL.
//! 2. `load bench` measures ratios in one run, alternating the servers:
//!    throughput and p99 of a trivial route, the cost of hit counting on the
//!    redirect path, SIGTERM-to-exit with 10,000 idle connections, RSS
//!    per idle connection, and what exporting traces over OTLP costs.
//! 3. `load outage` runs R replicas on one PostgreSQL behind HAProxy, which
//!    follows each replica's `/readyz` on its admin port, under open-loop
//!    mixed traffic while the database is stopped, locked, restarted, and
//!    cut off from one replica: no redirect of a served link may fail,
//!    readiness must hold, calls that need the database must fail fast
//!    behind an open circuit breaker, and every hit must be stored. Beside
//!    it, the same with `--readiness-follows-database`.
//! 4. `load crash` SIGKILLs one of R replicas behind HAProxy every few
//!    seconds under open-loop redirects and restarts it on the same ports,
//!    as the kubelet restarts a container: only the requests in flight on
//!    the killed replica may fail, and the hits stored must lie between the
//!    redirects answered and those plus the requests the kills cut.
//! 5. `load rotation` puts long-lived keep-alive HTTPS clients behind an
//!    L4 balancer (HAProxy in `mode tcp`): every replica replaced with an
//!    immediate and with a gradual drain, the reconnect storm counted by
//!    the replicas every 100 ms; then a replica added, without and with a
//!    maximum connection age, and its share of the requests followed.
//! 6. `load soak` and `load abuse` (not in CI): many idle connections and
//!    load past the concurrency limit; slow bodies and slowloris from the
//!    real `slowhttptest` while a normal client keeps working, then SIGTERM.
//!
//! # Layout
//! - [`rollout`], [`bench`], [`outage`], [`crash`], [`rotation`]: the five
//!   scenarios;
//!   [`soak`], [`abuse`]: the long runs outside CI.
//! - [`traffic`]: open-loop mixed load over HTTP/1.1 and HTTP/2 clients;
//!   [`fate`]: what happened to one request. [`raw`]: a minimal HTTP/1.1
//!   client for closed-loop benchmarks and idle connections.
//! - [`fleet`]: the runner the scenarios behind the balancer share: a
//!   throwaway PostgreSQL, the balancer and its replicas (added, retired,
//!   killed and restarted), their marks, seeded links, and the traffic
//!   around the scenario's actions; [`scenario`]: what `load NAME` does
//!   with any of them (run, write, summary, verdict, exit code).
//! - [`replica`]: one server child process; [`haproxy`]: the balancer child
//!   and its runtime API (through the test kit's client).
//! - [`metrics`]: a replica's `/metrics`, read over the raw client and
//!   parsed by a text-format parser crate: samples, labels and sums.
//! - [`report`]: tables, JSON and the SVG pictures (drawn with `plotters`);
//!   [`machine`]: what ran it, the build's profile and the workspace's root.
//! - [`binaries`]: building and finding the servers, installing test tools.
//! - [`baseline`]: the plain-axum, bare-hyper and uncounted-redirect servers
//!   behind the `plain-axum`, `bare-hyper` and `redirect-uncounted` binaries.

pub mod abuse;
pub mod baseline;
pub mod bench;
pub mod binaries;
pub mod crash;
pub mod fleet;
/// What happened to one request: the test kit's classes, shared with the tests.
pub use lameduck_testkit::fate;
pub mod haproxy;
pub mod machine;
pub mod metrics;
pub mod outage;
pub mod raw;
pub mod replica;
pub mod report;
pub mod rollout;
pub mod rotation;
pub mod scenario;
pub mod soak;
pub mod tls;
pub mod traffic;

/// The service's name, as its package spells it (`lameduck::NAME`): the
/// name shown in every table, label and message, the name of its binary
/// and the prefix of the other names the harness gives its runs (replicas,
/// logs, scratch folders). Renaming the package renames them all.
pub const SERVICE: &str = lameduck::NAME;

/// The service's Prometheus series `name`, under the service's metric
/// prefix (its crate name, `lameduck::CRATE_NAME`): `metric("hits_pending")`
/// is `lameduck_hits_pending` for the package `lameduck`.
#[must_use]
pub fn metric(name: &str) -> String {
    format!("{}_{name}", lameduck::CRATE_NAME)
}

/// The tests' throwaway PostgreSQL cluster, from the test kit.
use lameduck_testkit::postgres;
