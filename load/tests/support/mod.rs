//! What the smoke runs share: `load SCENARIO --smoke` run as a user runs
//! it, and what a passed run leaves behind.

use std::process::Command;
use std::time::Instant;

/// Runs `load SCENARIO --smoke` with a fresh output folder. Panics, with
/// the run's output, unless it exits 0, prints `marker` in its summary and
/// writes `SCENARIO.json`; returns that JSON, for a test to look closer. A
/// correctness run: its time is only reported.
pub(crate) fn smoke(scenario: &str, marker: &str) -> serde_json::Value {
    let out = tempfile::Builder::new()
        .prefix(&format!("{}-{scenario}-smoke-", load::SERVICE))
        .tempdir()
        .expect("a temporary output folder");
    let started = Instant::now();
    let output = Command::new(env!("CARGO_BIN_EXE_load"))
        .args([scenario, "--smoke", "--out"])
        .arg(out.path())
        .output()
        .expect("run the load binary");
    let elapsed = started.elapsed();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "load {scenario} --smoke failed ({}) after {elapsed:?}\n--- stdout ---\n{stdout}\n--- stderr ---\n{stderr}",
        output.status
    );
    let json = out.path().join(format!("{scenario}.json"));
    assert!(
        stdout.contains(marker) && json.is_file(),
        "no summary or JSON written\n{stdout}"
    );
    println!("{stdout}");
    println!("smoke {scenario} took {elapsed:?}");
    let text = std::fs::read_to_string(&json).expect("the JSON is readable");
    serde_json::from_str(&text).expect("the JSON parses")
}
