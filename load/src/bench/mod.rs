//! Scenario 2, the benchmarks: ratios measured in one run, with the servers
//! taking turns (round-robin, the order rotating every round) so that drift
//! of the machine hits every server alike. With two or more cores the
//! servers are pinned to CPU 0 and the harness to CPU 1 (`taskset`).
//!
//! The headline baseline is the minimal axum app a user would write instead
//! (`minimal-axum`: axum's README, an in-memory map of links, no
//! middleware, `axum::serve` with graceful shutdown); the others are extra
//! rows.
//!
//! 1. Throughput and latency of `GET /healthz`: lameduck (all its
//!    middleware), the minimal axum app, axum with the usual tower-http
//!    stack (`axum-stack`), bare hyper, and lameduck's own app on plain
//!    `axum::serve`. Headline: lameduck ÷ minimal axum, target ≥ 0.90.
//! 2. The redirect path `GET /{code}`: lameduck (counting hits) against the
//!    minimal axum app's in-memory redirect (headline, target ≥ 0.90) and
//!    against the same path without counting (`redirect-uncounted`).
//! 3. SIGTERM to exit with 10,000 idle keep-alive connections open and
//!    `--drain-delay 0s`, lameduck against the minimal axum app (headline,
//!    target ≤ 1.0×, on one core and on all cores), plain `axum::serve`,
//!    hyper-util's `GracefulShutdown` and the floor.
//! 4. RSS per idle connection at 10,000 connections (same runs as 3).
//! 5. Instructions per request under callgrind, lameduck against bare
//!    hyper and the minimal axum app (and plain `axum::serve`): a count,
//!    not a time, so the same on a busy machine as on an idle one.
//! 6. TLS: lameduck with `--tls-cert`/`--tls-key` (a chain the bench makes
//!    at start) against lameduck on plain HTTP, taking turns: keep-alive
//!    throughput of `GET /healthz` over HTTPS ÷ over HTTP, and new
//!    connections per second, each with a full TLS handshake (and, as an
//!    extra row, resumed sessions) ÷ plain TCP connections, with the
//!    server's CPU time per request.
//! 7. Traces: lameduck with traces off against lameduck exporting them over
//!    OTLP/HTTP and OTLP/gRPC to a receiver in the harness, taking turns, on
//!    `GET /healthz` and `GET /{code}`: throughput, latency and CPU a
//!    request on ÷ off, the spans received against the requests answered,
//!    what the SDK dropped, RSS, and instructions per request.
//!
//! Each part is a module of its own, named after it (`throughput`,
//! `counting`, `h2`, `tls`, `shutdown`, `instructions`, `spill`, `traces`); this one
//! holds what they share: the options, the runner and the overall summary.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::LazyLock;
use std::time::Duration;

use anyhow::Context;
use clap::ValueEnum;
use serde::Serialize;

use crate::binaries::{self, Binaries};
use crate::machine::{self, Machine};
use crate::raw;
use crate::report;
use crate::SERVICE;

mod counting;
mod durability;
mod h2;
mod instructions;
mod runner;
mod shutdown;
mod spill;
mod stats;
mod table;
mod throughput;
mod tls;
mod traces;

pub use durability::{DurabilityRun, DURABILITY_TARGET};
pub use h2::H2Case;
pub use instructions::InstructionSeries;
pub use shutdown::{ShutdownRun, ShutdownSeries};
pub use spill::SpillSeries;
pub use tls::{
    TlsReport, TlsSeries, HTTP_KEEP_ALIVE, HTTP_NEW, TLS_FULL, TLS_KEEP_ALIVE, TLS_RESUMED,
};
pub use traces::{ExitCounts, TracedRun, TracesCase, TracesReport, TracesSeries};

use runner::{create_bench_link, stop, Bench, CpuMark, CpuSpent, Harness, Target, Turn};
use stats::{median, median_measured};

/// The parts of the benchmark.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Part {
    /// Throughput, latency and CPU a request of `GET /healthz`.
    Throughput,
    /// The redirect `GET /{code}`: lameduck against the minimal axum app,
    /// and the cost of hit counting (also `redirect`).
    #[value(alias = "redirect")]
    Counting,
    /// SIGTERM to exit with idle connections open, and RSS per connection.
    Shutdown,
    /// Instructions per request under callgrind (needs valgrind).
    Instructions,
    /// A forced exit's synchronous spill of the pending hits.
    Spill,
    /// The journal's cost: the counted redirect journaled against counted
    /// in memory only, on one core and on all cores.
    Durability,
    /// HTTPS against plain HTTP: keep-alive throughput and handshakes per
    /// second.
    Tls,
    /// HTTP/2 with prior knowledge under h2load (needs h2load).
    H2,
    /// Traces off against traces exported over OTLP/HTTP and OTLP/gRPC to
    /// a receiver on loopback (needs valgrind for its instruction counts).
    Traces,
}

/// The servers' names in the tables.
const LAMEDUCK: &str = SERVICE;
const MINIMAL_AXUM: &str = "minimal axum app";
const AXUM_STACK: &str = "axum + tower-http stack";
const BARE_HYPER: &str = "bare hyper";
const PLAIN_AXUM: &str = "plain axum::serve (same app)";
/// A second process of the minimal axum app, not a baseline: the two
/// copies' ratio is what the run's own noise makes of identical servers.
const MINIMAL_AXUM_COPY: &str = "minimal axum app, second copy";
static COUNTING: LazyLock<String> = LazyLock::new(|| format!("{SERVICE}, counting hits"));
const MINIMAL_REDIRECT: &str = "minimal axum app, in-memory map";
static NOT_COUNTING: LazyLock<String> = LazyLock::new(|| format!("{SERVICE}'s path, no counting"));

/// The headline target of the throughput and counting parts: lameduck ÷
/// the minimal axum app.
const THROUGHPUT_TARGET: f64 = 0.90;

/// [`BenchReport::placement`] when nothing is pinned (`--no-pin`, or one
/// core).
const NOT_PINNED: &str = "not pinned";

/// Options of `load bench`.
#[derive(Clone, Debug, clap::Args, Serialize)]
pub struct Options {
    /// Rounds; every server runs once per round.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub rounds: u32,
    /// Length of one measured run.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    #[serde(with = "crate::report::millis")]
    pub duration: Duration,
    /// Unmeasured load before each run.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    #[serde(with = "crate::report::millis")]
    pub warmup: Duration,
    /// Connections of the closed-loop client.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub connections: u32,
    /// Idle keep-alive connections for the shutdown and memory runs.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u32).range(1..=60_000))]
    pub idle: u32,
    /// Links the redirect benchmark cycles through.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub links: u32,
    /// The parts to run.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [Part::Throughput, Part::Counting, Part::Durability, Part::H2, Part::Tls, Part::Shutdown, Part::Instructions, Part::Spill, Part::Traces])]
    pub parts: Vec<Part>,
    /// Links with pending hits in the spill part.
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u32).range(1..=10_000_000))]
    pub spill_links: u32,
    /// Do not pin the servers to CPU 0 and the harness to CPU 1.
    #[arg(long)]
    pub no_pin: bool,
    /// Output folder (default: load/out/<timestamp>-bench).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Use the binaries in this folder instead of building them.
    #[arg(long)]
    #[serde(skip)]
    pub bin_dir: Option<PathBuf>,
}

/// One measured run under load.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Run {
    /// Expected answers per second.
    pub rps: f64,
    /// Median latency, ms.
    pub p50_ms: f64,
    /// 99th percentile latency, ms.
    pub p99_ms: f64,
    /// Answers with another status.
    pub unexpected: u64,
    /// Connection errors.
    pub errors: u64,
    /// The server's CPU time (user + system, every thread) over the run
    /// per answered request, µs; NaN where not measured.
    pub cpu_us: f64,
    /// The load generator's CPU time over the run ÷ the run's length: near
    /// 1 on one core, the run measured the client as much as the server.
    /// NaN where not measured.
    pub client_busy: f64,
}

impl Run {
    /// A closed-loop run's figures: what `result` counted, priced by what
    /// the server and the load generator `spent` over it.
    fn measured(result: &raw::LoopResult, spent: CpuSpent) -> Run {
        Run {
            rps: result.throughput(),
            p50_ms: result.latency_ms(0.50),
            p99_ms: result.latency_ms(0.99),
            unexpected: result.unexpected,
            errors: result.errors,
            cpu_us: spent.server_us_per(result.ok),
            client_busy: spent.load / result.elapsed.as_secs_f64(),
        }
    }
}

/// Every run of one server, and their medians.
#[derive(Clone, Debug, Serialize)]
pub struct Series {
    /// The server.
    pub server: String,
    /// One run per round.
    pub runs: Vec<Run>,
    /// Median of `rps`.
    pub rps: f64,
    /// Median of `p50_ms`.
    pub p50_ms: f64,
    /// Median of `p99_ms`.
    pub p99_ms: f64,
    /// Median of `cpu_us` over the runs that measured it (NaN if none).
    pub cpu_us: f64,
    /// Median of `client_busy` over the runs that measured it (NaN if
    /// none).
    pub client_busy: f64,
}

impl Series {
    fn new(server: &str, runs: Vec<Run>) -> Series {
        Series {
            server: server.to_owned(),
            rps: median(runs.iter().map(|r| r.rps)),
            p50_ms: median(runs.iter().map(|r| r.p50_ms)),
            p99_ms: median(runs.iter().map(|r| r.p99_ms)),
            cpu_us: median_measured(runs.iter().map(|r| r.cpu_us)),
            client_busy: median_measured(runs.iter().map(|r| r.client_busy)),
            runs,
        }
    }

    fn failures(&self) -> u64 {
        self.runs.iter().map(|r| r.unexpected + r.errors).sum()
    }
}

/// Everything `load bench` measured.
#[derive(Clone, Debug, Serialize)]
pub struct BenchReport {
    /// Where and how.
    pub machine: Machine,
    /// The options.
    pub options: Options,
    /// How the processes were placed.
    pub placement: String,
    /// `GET /healthz`: lameduck, the minimal axum app, axum with the
    /// tower-http stack, bare hyper, plain axum::serve (same app).
    pub throughput: Vec<Series>,
    /// `GET /{code}`: lameduck counting, the minimal axum app, lameduck's
    /// path not counting.
    pub counting: Vec<Series>,
    /// The journal's cost: journaled, memory only and the minimal axum app
    /// on `GET /{code}`, on one core when pinning, then on all cores.
    pub durability: Vec<DurabilityRun>,
    /// Idle connections then SIGTERM: lameduck, the minimal axum app, plain
    /// axum::serve, hyper-util's `GracefulShutdown`, bare hyper exiting at
    /// once, and `close-floor` (no server); on one core when pinning, then
    /// on all cores.
    pub shutdown: Vec<ShutdownSeries>,
    /// Instructions per request: `GET /healthz` on lameduck, the minimal
    /// axum app, plain axum::serve and bare hyper, then `GET /{code}` on
    /// lameduck counting, the minimal axum app, and not counting.
    pub instructions: Vec<InstructionSeries>,
    /// The forced exit's spill, one run per round.
    pub spill: Option<SpillSeries>,
    /// HTTPS against plain HTTP on lameduck.
    pub tls: Option<TlsReport>,
    /// HTTP/2 (h2c) under h2load: lameduck, the minimal axum app, and the
    /// minimal app with `TCP_NODELAY`, per route and shape.
    pub h2: Vec<H2Case>,
    /// lameduck with traces off, and exporting over OTLP/HTTP and gRPC.
    pub traces: Option<TracesReport>,
}

/// `load bench`: pins, builds, runs, prints and writes.
pub fn main(options: Options, mut machine: Machine) -> ExitCode {
    let result = (|| -> anyhow::Result<()> {
        if options.parts.contains(&Part::Instructions) || options.parts.contains(&Part::Traces) {
            binaries::install_test_deps(&["valgrind"])?;
        }
        if options.parts.contains(&Part::H2) {
            binaries::install_test_deps(&["h2load"])?;
        }
        let binaries = Binaries::for_run(options.bin_dir.as_deref(), &mut machine)?;
        let pin = !options.no_pin && machine.cores >= 2;
        let placement = if pin {
            pin_self_to_last_cpu(machine.cores)?;
            format!(
                "servers pinned to CPU 0 (`taskset -c 0`), load generator to CPU {}",
                machine.cores - 1
            )
        } else {
            NOT_PINNED.to_owned()
        };
        let out = options.out.clone().unwrap_or_else(|| {
            let stamp = chrono::Utc::now().format("%Y%m%dT%H%M%SZ");
            machine::workspace_root()
                .join("load/out")
                .join(format!("{stamp}-bench"))
        });
        std::fs::create_dir_all(out.join("logs"))?;
        let runtime = tokio::runtime::Runtime::new()?;
        let report = runtime.block_on(run(options, &binaries, machine, placement, pin, &out))?;
        report::write_json(&out.join("bench.json"), &report)?;
        let text = summary(&report);
        std::fs::write(out.join("summary.md"), &text)?;
        println!("{text}");
        println!(
            "Written: {}/{{bench.json,summary.md}} and logs/",
            out.display()
        );
        Ok(())
    })();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("load: error: {error:#}");
            ExitCode::from(2)
        }
    }
}

fn pin_self_to_last_cpu(cores: usize) -> anyhow::Result<()> {
    use nix::sched::{sched_setaffinity, CpuSet};
    let mut set = CpuSet::new();
    set.set(cores - 1).context("cannot build the CPU set")?;
    sched_setaffinity(nix::unistd::Pid::from_raw(0), &set).context("cannot pin the harness")?;
    Ok(())
}

/// Runs the parts of `options`.
///
/// # Errors
/// If a server cannot be started or answers wrongly at setup.
pub async fn run(
    options: Options,
    binaries: &Binaries,
    machine: Machine,
    placement: String,
    pin: bool,
    out: &Path,
) -> anyhow::Result<BenchReport> {
    let scratch = tempfile::Builder::new()
        .prefix(&format!("{SERVICE}-bench-"))
        .tempdir()?;
    let bench = Bench {
        options: &options,
        binaries,
        cpus: pin.then(|| "0".to_owned()),
        scratch: scratch.path().to_owned(),
        logs: out.join("logs"),
    };
    let throughput = if options.parts.contains(&Part::Throughput) {
        bench.throughput().await?
    } else {
        Vec::new()
    };
    let counting = if options.parts.contains(&Part::Counting) {
        bench.counting().await?
    } else {
        Vec::new()
    };
    let durability = if options.parts.contains(&Part::Durability) {
        bench.durability().await?
    } else {
        Vec::new()
    };
    let shutdown = if options.parts.contains(&Part::Shutdown) {
        bench.shutdown().await?
    } else {
        Vec::new()
    };
    let instructions = if options.parts.contains(&Part::Instructions) {
        bench.instructions().await?
    } else {
        Vec::new()
    };
    let tls = if options.parts.contains(&Part::Tls) {
        Some(bench.tls().await?)
    } else {
        None
    };
    let h2 = if options.parts.contains(&Part::H2) {
        bench.h2().await?
    } else {
        Vec::new()
    };
    let traces = if options.parts.contains(&Part::Traces) {
        Some(bench.traces().await?)
    } else {
        None
    };
    let spill = if options.parts.contains(&Part::Spill) {
        Some(spill::spill(&options, &out.join("spill"))?)
    } else {
        None
    };
    Ok(BenchReport {
        machine,
        options: options.clone(),
        placement,
        throughput,
        counting,
        durability,
        shutdown,
        instructions,
        spill,
        tls,
        h2,
        traces,
    })
}

/// The benchmark tables in Markdown, each with the machine and command.
pub fn summary(report: &BenchReport) -> String {
    let o = &report.options;
    let footer = format!(
        "Machine: {}; {}.\n\nCommand: `{}`\n",
        report.machine.line(),
        report.placement,
        report.machine.command
    );
    let mut text = String::new();
    text.push_str(&throughput::throughput_summary(report, &footer));
    text.push_str(&counting::counting_summary(report, &footer));
    text.push_str(&durability::durability_summary(report, &footer));
    if !report.h2.is_empty() {
        text.push_str(&h2::h2_summary(report, &footer));
    }
    text.push_str(&shutdown::shutdown_summaries(report, &footer));
    text.push_str(&instructions::instructions_summary(report, &footer));
    if let Some(tls) = &report.tls {
        text.push_str(&tls::tls_summary(o, tls, &footer));
    }
    if let Some(spill) = &report.spill {
        text.push_str(&spill::spill_summary(spill, &footer));
    }
    if let Some(traces) = &report.traces {
        text.push_str(&traces::traces_summary(o, traces, &footer));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::shutdown::ALL_CORES;
    use super::*;

    #[derive(clap::Parser)]
    pub(super) struct Args {
        #[command(flatten)]
        pub(super) options: Options,
    }

    pub(super) fn series(server: &str, rps: &[f64]) -> Series {
        let runs = rps
            .iter()
            .map(|&rps| Run {
                rps,
                p50_ms: 1e3 / rps,
                p99_ms: 2e3 / rps,
                unexpected: 0,
                errors: 0,
                cpu_us: 1e6 / rps,
                client_busy: 0.5,
            })
            .collect();
        Series::new(server, runs)
    }

    fn shutdown_series(server: &str, exits: &[f64]) -> ShutdownSeries {
        let runs: Vec<ShutdownRun> = exits
            .iter()
            .map(|&exit_ms| ShutdownRun {
                exit_ms,
                code: Some(0),
                rss_before_kib: 1024,
                rss_open_kib: 2048,
                bytes_per_connection: 100.0,
            })
            .collect();
        ShutdownSeries {
            server: server.to_owned(),
            placement: ALL_CORES.to_owned(),
            exit_ms: median(exits.iter().copied()),
            bytes_per_connection: 100.0,
            above_floor_ms: 0.0,
            runs,
        }
    }

    /// A report whose every headline is known: the throughput, counting,
    /// shutdown and HTTP/2 parts with made-up runs.
    fn headline_report() -> BenchReport {
        use clap::Parser;
        let mut machine = Machine::describe();
        machine.command = "load bench --test".to_owned();
        BenchReport {
            machine,
            options: Args::parse_from(["load"]).options,
            placement: NOT_PINNED.to_owned(),
            throughput: vec![
                series(LAMEDUCK, &[95.0, 80.0]),
                series(MINIMAL_AXUM, &[100.0, 100.0]),
                series(AXUM_STACK, &[90.0, 90.0]),
                series(BARE_HYPER, &[200.0, 200.0]),
                series(PLAIN_AXUM, &[95.0, 80.0]),
                series(MINIMAL_AXUM_COPY, &[80.0, 125.0]),
            ],
            counting: vec![
                series(&COUNTING, &[50.0]),
                series(MINIMAL_REDIRECT, &[100.0]),
                series(&NOT_COUNTING, &[50.0]),
            ],
            durability: Vec::new(),
            shutdown: vec![
                shutdown_series(&format!("{SERVICE} --drain-delay 0s"), &[50.0]),
                shutdown_series(MINIMAL_AXUM, &[100.0]),
                shutdown_series(PLAIN_AXUM, &[100.0]),
                shutdown_series("hyper-util GracefulShutdown", &[40.0]),
                shutdown_series("bare hyper (exits at once)", &[20.0]),
                shutdown_series("no server", &[20.0]),
            ],
            instructions: Vec::new(),
            spill: None,
            tls: None,
            traces: None,
            h2: vec![H2Case {
                route: "GET /healthz".to_owned(),
                connections: 1,
                streams: 100,
                series: vec![
                    series(LAMEDUCK, &[90.0]),
                    series(MINIMAL_AXUM, &[100.0]),
                    series(h2::MINIMAL_NODELAY, &[80.0]),
                ],
            }],
        }
    }

    #[test]
    fn the_headlines_are_lameduck_over_the_minimal_axum_app() {
        let text = summary(&headline_report());
        assert!(
            text.contains("throughput 0.900 (0.90–0.90) (target ≥ 0.85: met)"),
            "{text}"
        );
        assert!(
            text.contains(&format!(
                "{SERVICE} ÷ minimal axum app + TCP_NODELAY: throughput 1.125"
            )),
            "{text}"
        );
        assert!(
            text.contains(&format!(
                "**{SERVICE} ÷ minimal axum app, run by run, median (min–max): \
                 throughput 0.875 (0.80–0.95) (target ≥ 0.90: not met)"
            )),
            "{text}"
        );
        assert!(
            text.contains("throughput 0.500 (0.50–0.50) (target ≥ 0.90: not met)"),
            "{text}"
        );
        assert!(
            text.contains(&format!("| {SERVICE} ÷ axum + tower-http stack ")),
            "{text}"
        );
        assert!(
            text.contains(&format!("≤ 1.0×; {SERVICE}: 0.500 (0.50–0.50) (met)")),
            "{text}"
        );
        assert!(
            text.contains(
                "(minimal axum app ÷ its second copy, run by run): throughput 1.025 (0.80–1.25)"
            ),
            "{text}"
        );
        assert!(text.contains("| minimal axum app, second copy "), "{text}");
        assert!(text.contains("Command: `load bench --test`"), "{text}");
        assert!(
            !text.contains("target ≥ 0.97") && !text.contains("≤ 100 ms"),
            "no old target: {text}"
        );
    }
}
