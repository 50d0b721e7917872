//! The short correctness run of Scenario 5: keep-alive HTTPS clients
//! behind HAProxy in `mode tcp`. The storm replaces each of three replicas
//! once under 100 clients, with `--drain-spread immediate` and then
//! `gradual`; the scale-up adds a third replica under 40 clients, without
//! and with a 2 s `--max-connection-age`. It fails on any failed request,
//! any hit answered and not stored (or stored and not answered), a gradual
//! drain whose reconnect peak is not below the immediate one's, or a new
//! replica that gets traffic without an age, or next to none with one.
//! No latency bound: a loaded CI box would make one flaky.
//!
//! Like the other smoke runs, it builds the servers itself, in the test's
//! own (debug) profile, and installs HAProxy and PostgreSQL when missing.

mod support;

use serde_json::Value;

fn count(value: &Value) -> u64 {
    value
        .as_u64()
        .unwrap_or_else(|| panic!("not a count: {value}"))
}

#[test]
fn a_gradual_drain_spreads_the_reconnects_and_an_age_moves_clients_to_a_new_replica() {
    let report = support::smoke("rotation", "| **hits lost**");
    let runs = |part: &str| report[part].as_array().expect("runs").clone();
    for run in runs("storm").iter().chain(&runs("scale_up")) {
        let label = &run["label"];
        assert_eq!(
            count(&run["requests"]["failed"]),
            0,
            "{label}: failed requests"
        );
        assert_eq!(
            run["hits_stored"].as_i64(),
            run["redirects_answered"].as_i64(),
            "{label}: hits stored against redirects answered"
        );
    }
    let peak = |spread: &str| {
        runs("storm")
            .iter()
            .find(|run| run["spread"] == spread)
            .map(|run| count(&run["peak_new_per_100ms"]))
            .unwrap_or_else(|| panic!("no {spread} run"))
    };
    assert!(
        peak("gradual") < peak("immediate"),
        "gradual peak {} against immediate {}",
        peak("gradual"),
        peak("immediate")
    );
    let share = |aged: bool| {
        runs("scale_up")
            .iter()
            .find(|run| run["age"].is_null() != aged)
            .and_then(|run| run["new_share_end"].as_f64())
            .expect("a scale-up run")
    };
    assert!(
        share(false) < 0.05,
        "without an age the new replica served {}",
        share(false)
    );
    assert!(
        share(true) > 1.0 / 6.0,
        "with an age the new replica served {}",
        share(true)
    );
}
