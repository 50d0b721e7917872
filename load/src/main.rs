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
//! cargo run -p load --release -- soak               # idle connections + load past the limit (not in CI)
//! cargo run -p load --release -- abuse              # slowhttptest slow bodies and slowloris + a normal client (not in CI)
//! ```

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};
use load::binaries::{self, Binaries};
use load::machine::Machine;
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
        Command::Rollout(options) => run_rollout(options.resolve(), machine),
        Command::Bench(options) => bench::main(options, machine),
        Command::Outage(options) => run_outage(options.resolve(), machine),
        Command::Crash(options) => run_crash(options.resolve(), machine),
        Command::Rotation(options) => run_rotation(options.resolve(), machine),
        Command::Soak(options) => soak::main(options, machine),
        Command::Abuse(options) => abuse::main(options, machine),
    }
}

fn run_rollout(options: rollout::Options, mut machine: Machine) -> ExitCode {
    let result = (|| -> anyhow::Result<ExitCode> {
        if !options.no_install {
            binaries::install_test_deps(&["postgres", "haproxy"])?;
        }
        let binaries = Binaries::for_run(options.bin_dir.as_deref(), &mut machine)?;
        let out = output_dir(options.out.clone(), "rollout");
        let runtime = tokio::runtime::Runtime::new().context("cannot start the runtime")?;
        let check = options.check;
        let report = runtime.block_on(rollout::run(options, &binaries, machine, &out))?;
        rollout::write(&report, &out)?;
        println!("{}", rollout::summary(&report));
        println!(
            "Written: {}/{{rollout.json,rollout.svg,summary.md}} and logs/",
            out.display()
        );
        if check {
            if let Err(problems) = rollout::verdict(&report) {
                eprintln!("load: check FAILED: {problems}");
                return Ok(ExitCode::FAILURE);
            }
            eprintln!("load: check passed: no failed request, no lost hit, every exit 0");
        }
        Ok(ExitCode::SUCCESS)
    })();
    result.unwrap_or_else(|error| {
        eprintln!("load: error: {error:#}");
        ExitCode::from(2)
    })
}

fn run_outage(options: outage::Options, mut machine: Machine) -> ExitCode {
    let result = (|| -> anyhow::Result<ExitCode> {
        if !options.no_install {
            binaries::install_test_deps(&["postgres", "haproxy"])?;
        }
        let binaries = Binaries::for_run(options.bin_dir.as_deref(), &mut machine)?;
        let out = output_dir(options.out.clone(), "outage");
        let runtime = tokio::runtime::Runtime::new().context("cannot start the runtime")?;
        let check = options.check;
        let report = runtime.block_on(outage::run(options, &binaries, machine, &out))?;
        outage::summary::write(&report, &out)?;
        println!("{}", outage::summary::summary(&report));
        println!(
            "Written: {}/{{outage.json,outage.svg,summary.md}} and logs/",
            out.display()
        );
        if check {
            if let Err(problems) = outage::summary::verdict(&report) {
                eprintln!("load: check FAILED: {problems}");
                return Ok(ExitCode::FAILURE);
            }
            eprintln!(
                "load: check passed: no failed redirect, failing fast behind an open breaker, \
                 every replica ready throughout, no lost hit"
            );
        }
        Ok(ExitCode::SUCCESS)
    })();
    result.unwrap_or_else(|error| {
        eprintln!("load: error: {error:#}");
        ExitCode::from(2)
    })
}

fn run_crash(options: crash::Options, mut machine: Machine) -> ExitCode {
    let result = (|| -> anyhow::Result<ExitCode> {
        if !options.no_install {
            binaries::install_test_deps(&["postgres", "haproxy"])?;
        }
        let binaries = Binaries::for_run(options.bin_dir.as_deref(), &mut machine)?;
        let out = output_dir(options.out.clone(), "crash");
        let runtime = tokio::runtime::Runtime::new().context("cannot start the runtime")?;
        let check = options.check;
        let report = runtime.block_on(crash::run(options, &binaries, machine, &out))?;
        crash::summary::write(&report, &out)?;
        println!("{}", crash::summary::summary(&report));
        println!(
            "Written: {}/{{crash.json,crash.svg,summary.md}} and logs/",
            out.display()
        );
        if check {
            if let Err(problems) = crash::summary::verdict(&report) {
                eprintln!("load: check FAILED: {problems}");
                return Ok(ExitCode::FAILURE);
            }
            eprintln!(
                "load: check passed: only requests in flight on a killed replica failed, \
                 answered ≤ stored ≤ answered + cut, every exit 0"
            );
        }
        Ok(ExitCode::SUCCESS)
    })();
    result.unwrap_or_else(|error| {
        eprintln!("load: error: {error:#}");
        ExitCode::from(2)
    })
}

fn run_rotation(options: rotation::Options, mut machine: Machine) -> ExitCode {
    let result = (|| -> anyhow::Result<ExitCode> {
        if !options.no_install {
            binaries::install_test_deps(&["postgres", "haproxy"])?;
        }
        let binaries = Binaries::for_run(options.bin_dir.as_deref(), &mut machine)?;
        let out = output_dir(options.out.clone(), "rotation");
        let runtime = tokio::runtime::Runtime::new().context("cannot start the runtime")?;
        let check = options.check;
        let report = runtime.block_on(rotation::run(options, &binaries, machine, &out))?;
        rotation::summary::write(&report, &out)?;
        println!("{}", rotation::summary::summary(&report));
        println!(
            "Written: {}/{{rotation.json,rotation.svg,summary.md}} and logs/",
            out.display()
        );
        if check {
            if let Err(problems) = rotation::summary::verdict(&report) {
                eprintln!("load: check FAILED: {problems}");
                return Ok(ExitCode::FAILURE);
            }
            eprintln!(
                "load: check passed: no failed request, every hit stored, a gradual drain's storm \
                 within its bound, the new replica served once connections age"
            );
        }
        Ok(ExitCode::SUCCESS)
    })();
    result.unwrap_or_else(|error| {
        eprintln!("load: error: {error:#}");
        ExitCode::from(2)
    })
}

/// `out`, or `load/out/<timestamp>-<what>` in the workspace.
fn output_dir(out: Option<PathBuf>, what: &str) -> PathBuf {
    out.unwrap_or_else(|| {
        let stamp = chrono::Utc::now().format("%Y%m%dT%H%M%SZ");
        binaries::workspace_root()
            .join("load/out")
            .join(format!("{stamp}-{what}"))
    })
}
