//! The short correctness run of Scenario 3 (the README's test command runs
//! it): three lameduck replicas on one PostgreSQL behind HAProxy, which
//! follows their `/readyz` on the admin port, under 100 requests per second
//! while PostgreSQL is stopped, `links` locked, PostgreSQL restarted, and
//! one replica cut off from it. It fails on any failed redirect of a served
//! link, a 503 behind an open breaker slower than 100 ms (p99; the debug
//! builds `cargo test` makes; 10 ms for a release run) or without
//! `Retry-After`, a request that waits to the request timeout, creations
//! failing more than a second after the database answers again, a replica
//! that is not ready at any reading, any lost hit or link, or an exit other
//! than 0.
//!
//! Like the rollout's smoke run, it builds the servers itself, in the
//! test's own (debug) profile, and installs HAProxy and PostgreSQL when
//! missing.

mod support;

#[test]
fn through_the_balancer_a_misbehaving_database_fails_no_cached_redirect_and_loses_no_hit() {
    support::smoke("outage", "**redirects failed**");
}
