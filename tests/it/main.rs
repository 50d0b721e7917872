//! The integration tests, in one binary: the service in process, and the
//! real binary as a child process under real signals, beside real
//! PostgreSQL clusters, an OTLP receiver and outsiders' tools. What they
//! share is the test kit (`testkit/`).
//!
//! Four suites have binaries of their own, each for a reason of its
//! harness: `request_span` needs a process whose only subscriber is its
//! own; `container`, `systemd` and `template` build Docker images or whole
//! generated services, each one at a time with both cores, and so run
//! after this binary rather than beside its timing.

mod api;
mod cancellation;
mod database;
mod handoff;
mod limits;
mod manifests;
mod postgres_harness;
mod shutdown;
mod state;
mod streams;
mod tls;
mod traces;
mod unix_socket;
mod ways_out;
