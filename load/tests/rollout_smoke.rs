//! The short correctness run of Scenario 1 (the README's test command runs
//! it): lameduck with a drain delay, two replicas behind HAProxy, two
//! replacements under 400 requests per second. It fails on any failed
//! request, any lost hit or link, or any replica that does not exit 0.
//!
//! A test in this package cannot get `CARGO_BIN_EXE_lameduck`, so the
//! harness builds the servers itself, in the test's own (debug) profile
//! and with its features (`cargo build --features lameduck/failpoints -p
//! lameduck -p load --bins`, a no-op when they are fresh), and installs
//! HAProxy and PostgreSQL with scripts/install-test-deps.sh when missing.

mod support;

#[test]
fn rolling_lameduck_under_load_fails_no_request_and_loses_no_hit() {
    support::smoke("rollout", "| **failed**");
}
