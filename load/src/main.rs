//! `load`: the rollout harness and the benchmarks. See load/README.md.
//!
//! ```text
//! cargo run -p load --release -- rollout            # Scenario 1, every flavor
//! cargo run -p load --release -- rollout --smoke    # the short correctness run
//! cargo run -p load --release -- bench              # Scenario 2
//! cargo run -p load --release -- outage             # Scenario 3: the database misbehaving
//! cargo run -p load --release -- outage --smoke     # its short correctness run
//! cargo run -p load --release -- crash --check      # Scenario 4: SIGKILLs under load
//! cargo run -p load --release -- crash --smoke      # its short correctness run
//! cargo run -p load --release -- rotation --check   # Scenario 5: reconnect storms and scale-up
//! cargo run -p load --release -- rotation --smoke   # its short correctness run
//! cargo run -p load --release -- soak --check       # idle connections + load past the limit (not in CI)
//! cargo run -p load --release -- abuse              # slowhttptest slow bodies and slowloris + a normal client (not in CI)
//! ```

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use load::machine::Machine;
use load::scenario;
use load::{abuse, bench, crash, outage, rollout, rotation, soak};

/// The rollout harness and benchmarks of lameduck.
#[derive(Debug, Parser)]
#[command(name = "load", about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Scenario 1: roll replicas behind HAProxy under constant load.
    Rollout(rollout::Options),
    /// Scenario 2: throughput, hit counting, TLS, shutdown latency,
    /// memory, and what exporting traces costs.
    Bench(bench::Options),
    /// Scenario 3: replicas behind HAProxy while the database is stopped,
    /// locked, restarted, and cut off from one replica.
    Outage(outage::Options),
    /// Scenario 4: replicas behind HAProxy under load, one SIGKILLed every
    /// few seconds and restarted; here the balancer retries a refused
    /// connection on another replica (--lb-retries at least 1).
    Crash(crash::Options),
    /// Scenario 5: keep-alive HTTPS clients behind an L4 balancer; every
    /// replica replaced with an immediate and a gradual drain (the
    /// reconnect storm), then a replica added without and with a maximum
    /// connection age (who serves it).
    Rotation(rotation::Options),
    /// Many idle connections and sustained load past the concurrency limit,
    /// then SIGTERM (not in CI).
    Soak(soak::Options),
    /// Slow-body and slowloris attacks by slowhttptest while a normal
    /// client creates links and follows redirects, then SIGTERM (not in CI).
    Abuse(abuse::Options),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Before any pinning narrows what this process sees.
    let machine = Machine::describe();
    match cli.command {
        Command::Rollout(options) => scenario::main(options.resolve(), machine),
        Command::Bench(options) => bench::main(options, machine),
        Command::Outage(options) => scenario::main(options.resolve(), machine),
        Command::Crash(options) => scenario::main(options.resolve(), machine),
        Command::Rotation(options) => scenario::main(options.resolve(), machine),
        Command::Soak(options) => scenario::main(options, machine),
        Command::Abuse(options) => abuse::main(options, machine),
    }
}
