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

use std::process::Command;
use std::time::Instant;

#[test]
fn rolling_lameduck_under_load_fails_no_request_and_loses_no_hit() {
    let out = tempfile::Builder::new()
        .prefix(&format!("{}-rollout-smoke-", load::SERVICE))
        .tempdir()
        .expect("a temporary output folder");
    let started = Instant::now();
    let output = Command::new(env!("CARGO_BIN_EXE_load"))
        .args(["rollout", "--smoke", "--out"])
        .arg(out.path())
        .output()
        .expect("run the load binary");
    let elapsed = started.elapsed();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "load rollout --smoke failed ({}) after {elapsed:?}\n--- stdout ---\n{stdout}\n--- stderr ---\n{stderr}",
        output.status
    );
    assert!(
        stdout.contains("| **failed**") && out.path().join("rollout.json").is_file(),
        "no summary or JSON written\n{stdout}"
    );
    println!("{stdout}");
    // A correctness check, not a timing check: the time is only reported.
    println!("smoke rollout took {elapsed:?}");
}
