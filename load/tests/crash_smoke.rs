//! The short correctness run of Scenario 4 (the README's test command runs
//! it): three lameduck replicas on one PostgreSQL and one spill directory
//! behind HAProxy, under 400 redirects a second, one SIGKILLed and
//! restarted every 2 s, three times. It fails on any failed request but
//! those in flight on the killed replica, on hits stored outside
//! `answered ≤ stored ≤ answered + cut` (a lost answered hit included), or
//! on a replica that does not exit 0 at the end.
//!
//! Like the rollout's smoke run, it builds the servers itself, in the
//! test's own (debug) profile, and installs HAProxy and PostgreSQL when
//! missing.

mod support;

#[test]
fn sigkilled_replicas_behind_the_balancer_fail_only_their_inflight_requests_and_lose_no_hit() {
    support::smoke("crash", "| **hits lost**");
}
