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

use std::process::Command;
use std::time::Instant;

#[test]
fn through_the_balancer_a_misbehaving_database_fails_no_cached_redirect_and_loses_no_hit() {
    let out = tempfile::Builder::new()
        .prefix(&format!("{}-outage-smoke-", load::SERVICE))
        .tempdir()
        .expect("a temporary output folder");
    let started = Instant::now();
    let output = Command::new(env!("CARGO_BIN_EXE_load"))
        .args(["outage", "--smoke", "--out"])
        .arg(out.path())
        .output()
        .expect("run the load binary");
    let elapsed = started.elapsed();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "load outage --smoke failed ({}) after {elapsed:?}\n--- stdout ---\n{stdout}\n--- stderr ---\n{stderr}",
        output.status
    );
    assert!(
        stdout.contains("**redirects failed**") && out.path().join("outage.json").is_file(),
        "no summary or JSON written\n{stdout}"
    );
    println!("{stdout}");
    // A correctness run: the time is only reported.
    println!("smoke outage took {elapsed:?}");
}
