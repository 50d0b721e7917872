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

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::ValueEnum;
use nix::sys::signal::Signal;
use serde::Serialize;
use tokio::time::Instant;

use crate::abuse;
use crate::binaries::{self, Binaries};
use crate::machine::Machine;
use crate::raw::{self, RawConn};
use crate::replica::{self, Replica, Spec};
use crate::report::{self, fmt_ms};
use crate::tls;

mod h2;
pub use h2::H2Case;

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
    /// HTTPS against plain HTTP: keep-alive throughput and handshakes per
    /// second.
    Tls,
    /// HTTP/2 with prior knowledge under h2load (needs h2load).
    H2,
}

/// Requests of the short and the long callgrind run; the difference of
/// their instruction counts, divided by the difference of these, leaves out
/// start-up and shutdown.
const INSTRUCTION_RUNS: [usize; 2] = [1_000, 11_000];

/// The servers' names in the tables.
const LAMEDUCK: &str = "lameduck";
const MINIMAL_AXUM: &str = "minimal axum app";
const AXUM_STACK: &str = "axum + tower-http stack";
const BARE_HYPER: &str = "bare hyper";
const PLAIN_AXUM: &str = "plain axum::serve (same app)";
/// A second process of the minimal axum app, not a baseline: the two
/// copies' ratio is what the run's own noise makes of identical servers.
const MINIMAL_AXUM_COPY: &str = "minimal axum app, second copy";
const COUNTING: &str = "lameduck, counting hits";
const MINIMAL_REDIRECT: &str = "minimal axum app, in-memory map";
const NOT_COUNTING: &str = "lameduck's path, no counting";
/// The rows of the TLS part.
pub const TLS_KEEP_ALIVE: &str = "HTTPS, keep-alive";
/// Plain HTTP, keep-alive.
pub const HTTP_KEEP_ALIVE: &str = "HTTP, keep-alive";
/// HTTPS, one request per connection, every handshake a full one.
pub const TLS_FULL: &str = "HTTPS, new connection per request, full handshake";
/// HTTPS, one request per connection, sessions resumed when the server
/// allows.
pub const TLS_RESUMED: &str = "HTTPS, new connection per request, session resumption";
/// Plain HTTP, one request per connection.
pub const HTTP_NEW: &str = "HTTP, new connection per request";

/// The headline targets: lameduck ÷ the minimal axum app.
const THROUGHPUT_TARGET: f64 = 0.90;
const SHUTDOWN_TARGET: f64 = 1.0;

/// The placement of the shutdown runs that leave the servers unpinned.
const ALL_CORES: &str = "all cores";

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
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [Part::Throughput, Part::Counting, Part::H2, Part::Tls, Part::Shutdown, Part::Instructions, Part::Spill])]
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

/// One shutdown run.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct ShutdownRun {
    /// SIGTERM to process exit, ms.
    pub exit_ms: f64,
    /// The exit code.
    pub code: Option<i32>,
    /// RSS before the idle connections, KiB.
    pub rss_before_kib: u64,
    /// RSS with them open, KiB.
    pub rss_open_kib: u64,
    /// (open − before) / connections, bytes.
    pub bytes_per_connection: f64,
}

/// Every shutdown run of one server, and their medians.
#[derive(Clone, Debug, Serialize)]
pub struct ShutdownSeries {
    /// The server.
    pub server: String,
    /// The CPUs it ran on.
    pub placement: String,
    /// One run per round.
    pub runs: Vec<ShutdownRun>,
    /// Median SIGTERM to exit, ms.
    pub exit_ms: f64,
    /// Median bytes per idle connection.
    pub bytes_per_connection: f64,
    /// Median, over the rounds, of this server's exit time less the
    /// floor's in the same round (the faster of bare hyper exiting at once
    /// and `close-floor`), ms: what the server itself adds to the kernel's
    /// work of closing the connections.
    pub above_floor_ms: f64,
}

/// Instructions one server spends per request.
#[derive(Clone, Debug, Serialize)]
pub struct InstructionSeries {
    /// The route requested.
    pub route: String,
    /// The server.
    pub server: String,
    /// Instructions of the whole process, per run of [`INSTRUCTION_RUNS`].
    pub totals: Vec<u64>,
    /// (long total − short total) ÷ (long requests − short requests).
    pub per_request: f64,
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
}

/// HTTPS against plain HTTP: lameduck with `--tls-cert`/`--tls-key`, and
/// lameduck without, taking turns.
#[derive(Clone, Debug, Serialize)]
pub struct TlsReport {
    /// The certificate chain.
    pub chain: String,
    /// What a handshake of the measured client settled on (version, cipher
    /// suite, key exchange, ALPN).
    pub negotiated: String,
    /// What ALPN settles on when a client offers `h2` and `http/1.1`.
    pub alpn_offering_h2: String,
    /// [`TLS_KEEP_ALIVE`], [`HTTP_KEEP_ALIVE`], [`TLS_FULL`],
    /// [`TLS_RESUMED`], [`HTTP_NEW`], in that order.
    pub series: Vec<TlsSeries>,
}

/// The runs of one TLS target, with CPU time.
#[derive(Clone, Debug, Serialize)]
pub struct TlsSeries {
    /// Throughput and latency.
    #[serde(flatten)]
    pub series: Series,
    /// The server's CPU time per answered request, µs, one per run.
    pub server_cpu_us: Vec<f64>,
    /// The server's CPU time ÷ the run's length (1.0: one core busy), one
    /// per run.
    pub server_busy: Vec<f64>,
    /// The harness's likewise: near its core's whole, the client and not
    /// the server set the pace.
    pub harness_busy: Vec<f64>,
    /// Handshakes that resumed a session ÷ handshakes, one per run (TLS
    /// targets only).
    pub resumed: Vec<f64>,
}

impl TlsSeries {
    fn server_cpu_us(&self) -> f64 {
        median(self.server_cpu_us.iter().copied())
    }
}

/// A forced exit's spill, timed: the force hook's own call
/// (`HitCounter::spill_now`), which takes the pending hits out of memory
/// and writes, fsyncs and renames the file, then fsyncs the directory.
#[derive(Clone, Debug, Serialize)]
pub struct SpillSeries {
    /// Links with pending hits.
    pub links: u32,
    /// Pending hits in all.
    pub hits: u64,
    /// Size of one spill file.
    pub bytes: u64,
    /// Where the files were written (the out folder's file system).
    pub dir: String,
    /// One time per round, ms.
    pub runs_ms: Vec<f64>,
    /// Median of `runs_ms`.
    pub median_ms: f64,
    /// Largest of `runs_ms`.
    pub max_ms: f64,
}

/// `load bench`: pins, builds, runs, prints and writes.
pub fn main(options: Options, mut machine: Machine) -> ExitCode {
    let result = (|| -> anyhow::Result<()> {
        if options.parts.contains(&Part::Instructions) {
            binaries::install_test_deps(&["valgrind"])?;
        }
        if options.parts.contains(&Part::H2) {
            binaries::install_test_deps(&["h2load"])?;
        }
        let binaries = match &options.bin_dir {
            Some(dir) => {
                machine.prebuilt(dir);
                Binaries::in_dir(dir)?
            }
            None => Binaries::build()?,
        };
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
            binaries::workspace_root()
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
        .prefix("lameduck-bench-")
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
    let spill = if options.parts.contains(&Part::Spill) {
        Some(spill(&options, &out.join("spill"))?)
    } else {
        None
    };
    Ok(BenchReport {
        machine,
        options: options.clone(),
        placement,
        throughput,
        counting,
        shutdown,
        instructions,
        spill,
        tls,
        h2,
    })
}

/// Times the forced exit's spill of `--spill-links` links with pending
/// hits (1 to 3 each, codes of the generated length), once per round, into
/// `dir` on the out folder's disk.
fn spill(options: &Options, dir: &Path) -> anyhow::Result<SpillSeries> {
    use lameduck::links::hits::{FinalFlush, HitCounter};
    eprintln!(
        "load: a forced exit's spill of {} links' pending hits",
        options.spill_links
    );
    let codes: Vec<String> = (0..options.spill_links)
        .map(|i| {
            format!(
                "{i:0width$x}",
                width = lameduck::links::validate::GENERATED_CODE_LENGTH
            )
        })
        .collect();
    let (mut runs_ms, mut hits, mut bytes) = (Vec::new(), 0, 0);
    for _ in 0..options.rounds {
        let counter = HitCounter::default();
        for (i, code) in codes.iter().enumerate() {
            for _ in 0..=i % 3 {
                counter.record(code);
            }
        }
        let started = std::time::Instant::now();
        let spilled = counter.spill_now(dir)?;
        runs_ms.push(started.elapsed().as_secs_f64() * 1e3);
        let Some(FinalFlush::Spilled { hits: n, path }) = spilled else {
            anyhow::bail!("nothing was spilled");
        };
        hits = n;
        bytes = std::fs::metadata(&path)?.len();
        std::fs::remove_file(&path)?;
    }
    let mut sorted = runs_ms.clone();
    sorted.sort_by(f64::total_cmp);
    Ok(SpillSeries {
        links: options.spill_links,
        hits,
        bytes,
        dir: dir.display().to_string(),
        median_ms: sorted[sorted.len() / 2],
        max_ms: sorted.last().copied().unwrap_or_default(),
        runs_ms,
    })
}

/// A server under HTTP/1.1 closed-loop load.
struct Target {
    name: &'static str,
    addr: SocketAddr,
    /// Its process, whose CPU time each run reads.
    pid: i32,
    /// The requests to cycle through.
    requests: Arc<Vec<Vec<u8>>>,
    /// The status every answer should have.
    expected: u16,
}

impl Target {
    fn new(
        name: &'static str,
        replica: &Replica,
        requests: &Arc<Vec<Vec<u8>>>,
        expected: u16,
    ) -> Target {
        Target {
            name,
            addr: replica.addr,
            pid: replica.pid(),
            requests: Arc::clone(requests),
            expected,
        }
    }
}

/// Where a load generator's CPU time is read: this process (the closed
/// loop runs in it) or its exited children (h2load).
#[derive(Clone, Copy, Debug)]
enum Harness {
    Own,
    Children,
}

/// The CPU time a server and the load generator had used when a run
/// began, to price the run when it ends.
struct CpuMark {
    pid: i32,
    harness: Harness,
    server: Option<Duration>,
    load: Option<Duration>,
}

/// What one run cost: CPU seconds, NaN where unreadable.
#[derive(Clone, Copy, Debug)]
struct CpuSpent {
    server: f64,
    load: f64,
}

impl CpuMark {
    fn take(pid: i32, harness: Harness) -> CpuMark {
        CpuMark {
            pid,
            harness,
            server: replica::cpu_time(&pid.to_string()),
            load: harness.cpu_time(),
        }
    }

    /// The CPU time each side has used since the mark.
    fn spent(&self) -> CpuSpent {
        let since = |before: Option<Duration>, after: Option<Duration>| match (before, after) {
            (Some(before), Some(after)) => after.saturating_sub(before).as_secs_f64(),
            _ => f64::NAN,
        };
        CpuSpent {
            server: since(self.server, replica::cpu_time(&self.pid.to_string())),
            load: since(self.load, self.harness.cpu_time()),
        }
    }
}

impl Harness {
    fn cpu_time(self) -> Option<Duration> {
        match self {
            Harness::Own => replica::cpu_time("self"),
            Harness::Children => replica::children_cpu_time(),
        }
    }
}

impl CpuSpent {
    /// Server CPU µs per answered request (NaN for none).
    #[allow(clippy::cast_precision_loss)]
    fn server_us_per(self, answered: u64) -> f64 {
        if answered > 0 {
            self.server * 1e6 / answered as f64
        } else {
            f64::NAN
        }
    }
}

struct Bench<'a> {
    options: &'a Options,
    binaries: &'a Binaries,
    cpus: Option<String>,
    scratch: PathBuf,
    logs: PathBuf,
}

impl Bench<'_> {
    fn spec(&self, program: &Path, data: &str, extra: &[&str]) -> Spec {
        let mut args: Vec<std::ffi::OsString> = [
            "server",
            "--listen",
            "127.0.0.1:0",
            "--log-format",
            "text",
            "--data-dir",
        ]
        .iter()
        .map(Into::into)
        .collect();
        args.push(self.scratch.join(data).into_os_string());
        args.extend(extra.iter().map(Into::into));
        Spec {
            program: program.to_owned(),
            args,
            env: Vec::new(),
            cpus: self.cpus.clone(),
        }
    }

    /// Bare hyper on a free port; it takes no other argument.
    fn bare_spec(&self) -> Spec {
        Spec {
            program: self.binaries.bare_hyper.clone(),
            args: vec!["127.0.0.1:0".into()],
            env: Vec::new(),
            cpus: self.cpus.clone(),
        }
    }

    async fn start(&self, name: &str, spec: &Spec, ready: &str) -> anyhow::Result<Replica> {
        let replica = Replica::spawn(name, spec, &self.logs.join(format!("{name}.log"))).await?;
        replica.wait_ready(ready, Duration::from_secs(30)).await?;
        Ok(replica)
    }

    /// Closed-loop runs of every target, `--connections` connections of
    /// one request at a time, taking turns, the order rotating each round.
    /// Around each measured run the server's CPU time and the harness's own
    /// are read: CPU a request prices the server alone, and a harness near
    /// a whole core says the client, not only the server, set the pace.
    async fn rounds(&self, targets: &[Target]) -> Vec<Series> {
        let mut runs: Vec<Vec<Run>> = vec![Vec::new(); targets.len()];
        let connections = usize::try_from(self.options.connections).unwrap_or(64);
        for round in 0..self.options.rounds as usize {
            for turn in 0..targets.len() {
                let index = (turn + round) % targets.len();
                let target = &targets[index];
                let load = |duration| {
                    raw::closed_loop(
                        target.addr,
                        Arc::clone(&target.requests),
                        target.expected,
                        connections,
                        duration,
                    )
                };
                load(self.options.warmup).await;
                let mark = CpuMark::take(target.pid, Harness::Own);
                let result = load(self.options.duration).await;
                let spent = mark.spent();
                let run = Run {
                    rps: result.throughput(),
                    p50_ms: result.latency_ms(0.50),
                    p99_ms: result.latency_ms(0.99),
                    unexpected: result.unexpected,
                    errors: result.errors,
                    cpu_us: spent.server_us_per(result.ok),
                    client_busy: spent.load / result.elapsed.as_secs_f64(),
                };
                eprintln!(
                    "load:   round {}/{} {}: {:.0} req/s, p50 {} ms, p99 {} ms, server CPU {:.2} µs a request, load generator {:.0} % of a core{}",
                    round + 1,
                    self.options.rounds,
                    target.name,
                    run.rps,
                    fmt_ms(run.p50_ms),
                    fmt_ms(run.p99_ms),
                    run.cpu_us,
                    run.client_busy * 100.0,
                    if run.unexpected + run.errors > 0 {
                        format!(", {} unexpected, {} errors", run.unexpected, run.errors)
                    } else {
                        String::new()
                    }
                );
                runs[index].push(run);
            }
        }
        targets
            .iter()
            .zip(runs)
            .map(|(target, runs)| Series::new(target.name, runs))
            .collect()
    }

    async fn throughput(&self) -> anyhow::Result<Vec<Series>> {
        eprintln!("load: throughput of GET /healthz");
        let b = self.binaries;
        let mut lameduck = self
            .start(
                "tp-lameduck",
                &self.spec(&b.lameduck, "tp-lameduck", &[]),
                "/readyz",
            )
            .await?;
        let mut minimal = self
            .start(
                "tp-minimal-axum",
                &self.spec(&b.minimal_axum, "tp-minimal", &[]),
                "/readyz",
            )
            .await?;
        let mut stack = self
            .start(
                "tp-axum-stack",
                &self.spec(&b.axum_stack, "tp-stack", &[]),
                "/readyz",
            )
            .await?;
        let mut bare = self
            .start("tp-bare-hyper", &self.bare_spec(), "/healthz")
            .await?;
        let mut plain = self
            .start(
                "tp-plain-axum",
                &self.spec(&b.plain_axum, "tp-plain", &[]),
                "/readyz",
            )
            .await?;
        let mut copy = self
            .start(
                "tp-minimal-axum-copy",
                &self.spec(&b.minimal_axum, "tp-minimal-copy", &[]),
                "/readyz",
            )
            .await?;
        let requests = Arc::new(vec![raw::get("/healthz")]);
        let targets = [
            Target::new(LAMEDUCK, &lameduck, &requests, 200),
            Target::new(MINIMAL_AXUM, &minimal, &requests, 200),
            Target::new(AXUM_STACK, &stack, &requests, 200),
            Target::new(BARE_HYPER, &bare, &requests, 200),
            Target::new(PLAIN_AXUM, &plain, &requests, 200),
            Target::new(MINIMAL_AXUM_COPY, &copy, &requests, 200),
        ];
        let series = self.rounds(&targets).await;
        for replica in [
            &mut lameduck,
            &mut minimal,
            &mut stack,
            &mut bare,
            &mut plain,
            &mut copy,
        ] {
            stop(replica).await;
        }
        Ok(series)
    }

    async fn counting(&self) -> anyhow::Result<Vec<Series>> {
        eprintln!("load: the redirect path: lameduck, the minimal axum app, no hit counting");
        let b = self.binaries;
        let mut counted = self
            .start(
                "ct-lameduck",
                &self.spec(&b.lameduck, "ct-counted", &[]),
                "/readyz",
            )
            .await?;
        let mut minimal = self
            .start(
                "ct-minimal-axum",
                &self.spec(&b.minimal_axum, "ct-minimal", &[]),
                "/readyz",
            )
            .await?;
        let mut uncounted = self
            .start(
                "ct-uncounted",
                &self.spec(&b.redirect_uncounted, "ct-uncounted", &[]),
                "/readyz",
            )
            .await?;
        for replica in [&counted, &minimal, &uncounted] {
            let mut conn = RawConn::connect(replica.addr).await?;
            for n in 0..self.options.links {
                let head = conn.exchange(&create_bench_link(n)).await?;
                if head.status != 201 {
                    bail!(
                        "{}: creating link bench-{n} answered {}",
                        replica.name,
                        head.status
                    );
                }
            }
        }
        let requests = Arc::new(
            (0..self.options.links)
                .map(|n| raw::get(&format!("/bench-{n}")))
                .collect(),
        );
        let targets = [
            Target::new(COUNTING, &counted, &requests, 307),
            Target::new(MINIMAL_REDIRECT, &minimal, &requests, 307),
            Target::new(NOT_COUNTING, &uncounted, &requests, 307),
        ];
        let series = self.rounds(&targets).await;
        for replica in [&mut counted, &mut minimal, &mut uncounted] {
            stop(replica).await;
        }
        Ok(series)
    }

    /// SIGTERM to exit with the idle connections open, for every server
    /// in every placement: on one core (CPU 0) when pinning, then on all
    /// of them.
    async fn shutdown(&self) -> anyhow::Result<Vec<ShutdownSeries>> {
        let mut placements = Vec::new();
        if let Some(cpus) = &self.cpus {
            placements.push((
                format!("one core (`taskset -c {cpus}`)"),
                Some(cpus.clone()),
            ));
        }
        placements.push((ALL_CORES.to_owned(), None));
        let mut all = Vec::new();
        for (placement, cpus) in placements {
            all.extend(self.shutdown_on(&placement, cpus).await?);
        }
        Ok(all)
    }

    async fn shutdown_on(
        &self,
        placement: &str,
        cpus: Option<String>,
    ) -> anyhow::Result<Vec<ShutdownSeries>> {
        let idle = usize::try_from(self.options.idle).unwrap_or(10_000);
        eprintln!(
            "load: SIGTERM to exit with {idle} idle keep-alive connections, servers on {placement}"
        );
        let b = self.binaries;
        // Room for the idle connections and the harness's own probes.
        let limit = (idle + 1000).to_string();
        let mut graceful = self.bare_spec();
        graceful.args.insert(0, "--graceful".into());
        let mut servers = [
            (
                "lameduck --drain-delay 0s",
                self.spec(
                    &b.lameduck,
                    "sd-lameduck",
                    &["--drain-delay", "0s", "--max-connections", &limit],
                ),
            ),
            (
                MINIMAL_AXUM,
                self.spec(
                    &b.minimal_axum,
                    "sd-minimal",
                    &["--max-connections", &limit],
                ),
            ),
            (
                PLAIN_AXUM,
                self.spec(&b.plain_axum, "sd-plain", &["--max-connections", &limit]),
            ),
            ("hyper-util GracefulShutdown", graceful),
            ("bare hyper (exits at once)", self.bare_spec()),
            (
                "no server: shutdown(2) + close(2) from every core",
                Spec {
                    program: b.close_floor.clone(),
                    args: vec!["127.0.0.1:0".into()],
                    env: Vec::new(),
                    cpus: None,
                },
            ),
        ];
        for (_, spec) in &mut servers {
            spec.cpus.clone_from(&cpus);
        }
        let tag = if cpus.is_some() { "sd1" } else { "sdn" };
        let mut runs: Vec<Vec<ShutdownRun>> = vec![Vec::new(); servers.len()];
        let rounds = self.options.rounds.min(5) as usize;
        let request = raw::get("/healthz");
        for round in 0..rounds {
            for turn in 0..servers.len() {
                let index = (turn + round) % servers.len();
                let (name, spec) = &servers[index];
                let mut replica = self
                    .start(&format!("{tag}-{index}-{round}"), spec, "/healthz")
                    .await?;
                // Settle the allocator with a little traffic first (the
                // no-server process, the last, answers one request per
                // connection).
                if index + 1 < servers.len() {
                    raw::closed_loop(
                        replica.addr,
                        Arc::new(vec![request.clone()]),
                        200,
                        8,
                        Duration::from_millis(300),
                    )
                    .await;
                }
                let rss_before_kib = replica.rss_kib().unwrap_or(0);
                crate::machine::conntrack_room(idle).await;
                let open = raw::open_idle(replica.addr, idle, &request, 256)
                    .await
                    .with_context(|| format!("{name}: opening {idle} idle connections"))?;
                tokio::time::sleep(Duration::from_millis(500)).await;
                let rss_open_kib = replica.rss_kib().unwrap_or(0);
                let sigterm = Instant::now();
                replica.signal(Signal::SIGTERM)?;
                let ended = replica.wait_exit(sigterm, Duration::from_secs(60)).await;
                drop(open);
                #[allow(clippy::cast_precision_loss)]
                let bytes_per_connection =
                    rss_open_kib.saturating_sub(rss_before_kib) as f64 * 1024.0 / idle as f64;
                let run = ShutdownRun {
                    exit_ms: ended.after.as_secs_f64() * 1000.0,
                    code: ended.code,
                    rss_before_kib,
                    rss_open_kib,
                    bytes_per_connection,
                };
                eprintln!(
                    "load:   round {}/{rounds} {name}: exit {} after {} ms; RSS {} → {} KiB, {:.0} B per connection",
                    round + 1,
                    ended.describe(),
                    fmt_ms(run.exit_ms),
                    rss_before_kib,
                    rss_open_kib,
                    bytes_per_connection
                );
                runs[index].push(run);
                // Let the closed sockets leave TIME_WAIT-heavy tables settle.
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
        // The floor: the faster, round by round, of the last two, which do
        // nothing but close.
        let floor = match runs.as_slice() {
            [.., bare, none] => round_floors(bare, none),
            _ => Vec::new(),
        };
        Ok(servers
            .iter()
            .zip(runs)
            .map(|((name, _), runs)| ShutdownSeries {
                server: (*name).to_owned(),
                placement: placement.to_owned(),
                exit_ms: median(runs.iter().map(|r| r.exit_ms)),
                bytes_per_connection: median(runs.iter().map(|r| r.bytes_per_connection)),
                above_floor_ms: median(runs.iter().zip(&floor).map(|(r, f)| r.exit_ms - f)),
                runs,
            })
            .collect())
    }

    /// Each server under callgrind, twice: [`INSTRUCTION_RUNS`] requests
    /// over 8 connections, then SIGTERM. `GET /healthz` on lameduck, the
    /// minimal axum app, plain `axum::serve` and bare hyper; `GET /{code}`
    /// of one link on lameduck, on the minimal axum app, and without hit
    /// counting.
    async fn instructions(&self) -> anyhow::Result<Vec<InstructionSeries>> {
        eprintln!("load: instructions per request under callgrind");
        let b = self.binaries;
        let healthz = raw::get("/healthz");
        let redirect = raw::get("/bench-0");
        let link = create_bench_link(0);
        let cases: [(&str, &str, &Path, &str, &[u8]); 7] = [
            ("GET /healthz", LAMEDUCK, &b.lameduck, "/readyz", &healthz),
            (
                "GET /healthz",
                MINIMAL_AXUM,
                &b.minimal_axum,
                "/readyz",
                &healthz,
            ),
            (
                "GET /healthz",
                PLAIN_AXUM,
                &b.plain_axum,
                "/readyz",
                &healthz,
            ),
            (
                "GET /healthz",
                BARE_HYPER,
                &b.bare_hyper,
                "/healthz",
                &healthz,
            ),
            ("GET /{code}", COUNTING, &b.lameduck, "/readyz", &redirect),
            (
                "GET /{code}",
                MINIMAL_REDIRECT,
                &b.minimal_axum,
                "/readyz",
                &redirect,
            ),
            (
                "GET /{code}",
                NOT_COUNTING,
                &b.redirect_uncounted,
                "/readyz",
                &redirect,
            ),
        ];
        // Then lameduck without each step of its middleware, in turn, and
        // without every step at once.
        let without: Vec<(String, &str)> = crate::baseline::STEPS
            .iter()
            .chain([&crate::baseline::EVERY_STEP])
            .map(|step| (format!("{LAMEDUCK} without {step}"), *step))
            .collect();
        let cases = cases
            .into_iter()
            .map(|(route, name, program, ready, request)| {
                (route, name, program, ready, request, None)
            })
            .chain(without.iter().map(|(name, step)| {
                let program = b.lameduck_without.as_path();
                (
                    "GET /healthz",
                    name.as_str(),
                    program,
                    "/readyz",
                    &healthz[..],
                    Some(*step),
                )
            }));
        let mut series = Vec::new();
        for (index, (route, name, program, ready, request, step)) in cases.enumerate() {
            let expected = if route == "GET /healthz" { 200 } else { 307 };
            let mut totals = Vec::new();
            for requests in INSTRUCTION_RUNS {
                let run = format!("in-{index}-{requests}");
                let mut spec = if program == b.bare_hyper.as_path() {
                    self.bare_spec()
                } else {
                    self.spec(program, &run, &[])
                };
                if let Some(step) = step {
                    let variable = crate::baseline::WITHOUT_ENV.to_owned();
                    spec.env.push((variable, step.to_owned()));
                }
                let out = self.logs.join(format!("callgrind-{run}.out"));
                let mut args: Vec<std::ffi::OsString> = vec![
                    "--tool=callgrind".into(),
                    format!("--callgrind-out-file={}", out.display()).into(),
                    spec.program.clone().into_os_string(),
                ];
                args.extend(spec.args);
                let under_valgrind = Spec {
                    program: "valgrind".into(),
                    args,
                    env: spec.env,
                    cpus: spec.cpus,
                };
                let mut replica =
                    Replica::spawn(&run, &under_valgrind, &self.logs.join(format!("{run}.log")))
                        .await?;
                replica.wait_ready(ready, Duration::from_secs(120)).await?;
                if expected == 307 {
                    let created = RawConn::connect(replica.addr)
                        .await?
                        .exchange(&link)
                        .await?;
                    if created.status != 201 {
                        bail!("{name}: creating the link answered {}", created.status);
                    }
                }
                let answered = raw::exactly(replica.addr, request, expected, 8, requests)
                    .await
                    .with_context(|| format!("{name} under callgrind"))?;
                if answered != requests {
                    bail!(
                        "{name} under callgrind answered {answered} of {requests} with {expected}"
                    );
                }
                let _ = replica.signal(Signal::SIGTERM);
                let ended = replica
                    .wait_exit(Instant::now(), Duration::from_secs(120))
                    .await;
                if ended.code != Some(0) {
                    bail!("{name} under callgrind exited {}", ended.describe());
                }
                let total = callgrind_total(&out)?;
                eprintln!("load:   {route} on {name}: {requests} requests, {total} instructions");
                totals.push(total);
            }
            #[allow(clippy::cast_precision_loss)]
            let per_request = (totals[1] as f64 - totals[0] as f64)
                / (INSTRUCTION_RUNS[1] - INSTRUCTION_RUNS[0]) as f64;
            series.push(InstructionSeries {
                route: route.to_owned(),
                server: name.to_owned(),
                totals,
                per_request,
            });
        }
        Ok(series)
    }
}

/// One target of the TLS part: a server, how to reach it, what to send.
struct TlsTarget<'a> {
    name: &'static str,
    server: &'a Replica,
    /// `None`: plain TCP.
    client: Option<tls::Client>,
    /// One request per connection (`Connection: close`), latency from the
    /// connect; else keep-alive, latency from the send.
    per_connection: bool,
}

/// One measured run of a TLS target.
#[derive(Clone, Copy)]
struct TlsRun {
    run: Run,
    server_busy: f64,
    resumed: f64,
}

impl Bench<'_> {
    /// HTTPS against plain HTTP on lameduck, taking turns like
    /// [`Bench::rounds`], the server's and the harness's CPU time read
    /// around every measured run.
    async fn tls(&self) -> anyhow::Result<TlsReport> {
        eprintln!(
            "load: TLS: HTTPS against plain HTTP, keep-alive and a new connection per request"
        );
        let certificates = tls::Certificates::make(&self.scratch.join("tls"))?;
        let (cert, key) = (
            certificates.cert.display().to_string(),
            certificates.key.display().to_string(),
        );
        let b = self.binaries;
        let spec = self.spec(
            &b.lameduck,
            "tls-lameduck",
            &["--tls-cert", &cert, "--tls-key", &key],
        );
        let mut https = Replica::spawn("tls-lameduck", &spec, &self.logs.join("tls-lameduck.log"))
            .await
            .context("lameduck with --tls-cert/--tls-key (does this build have them?)")?;
        // The public listener speaks TLS only: readiness on the admin one.
        let admin = abuse::admin_addr(&https).await?;
        https
            .wait_ready_at(admin, "/readyz", Duration::from_secs(30))
            .await?;
        let mut http = self
            .start(
                "tls-lameduck-plain",
                &self.spec(&b.lameduck, "tls-lameduck-plain", &[]),
                "/readyz",
            )
            .await?;

        let full = certificates.client(&[b"http/1.1"], false)?;
        let resuming = certificates.client(&[b"http/1.1"], true)?;
        let mut probe = full
            .connect(https.addr)
            .await
            .with_context(|| format!("TLS handshake with {}", https.addr))?;
        let negotiated = tls::describe(&probe);
        let head = probe.exchange(&raw::get("/healthz")).await?;
        if head.status != 200 {
            bail!("GET /healthz over HTTPS answered {}", head.status);
        }
        drop(probe);
        let h2 = certificates
            .client(&[b"h2", b"http/1.1"], false)?
            .connect(https.addr)
            .await?;
        let alpn_offering_h2 = tls::alpn(&h2);
        drop(h2);
        eprintln!("load:   negotiated {negotiated}; offering h2 too: ALPN {alpn_offering_h2}");

        let targets = [
            TlsTarget {
                name: TLS_KEEP_ALIVE,
                server: &https,
                client: Some(full.clone()),
                per_connection: false,
            },
            TlsTarget {
                name: HTTP_KEEP_ALIVE,
                server: &http,
                client: None,
                per_connection: false,
            },
            TlsTarget {
                name: TLS_FULL,
                server: &https,
                client: Some(full),
                per_connection: true,
            },
            TlsTarget {
                name: TLS_RESUMED,
                server: &https,
                client: Some(resuming),
                per_connection: true,
            },
            TlsTarget {
                name: HTTP_NEW,
                server: &http,
                client: None,
                per_connection: true,
            },
        ];
        let series = self.tls_rounds(&targets).await;
        stop(&mut https).await;
        stop(&mut http).await;
        Ok(TlsReport {
            chain: tls::CHAIN.to_owned(),
            negotiated,
            alpn_offering_h2,
            series,
        })
    }

    async fn tls_rounds(&self, targets: &[TlsTarget<'_>]) -> Vec<TlsSeries> {
        let connections = usize::try_from(self.options.connections).unwrap_or(64);
        let keep_alive = Arc::new(vec![raw::get("/healthz")]);
        let one_shot = Arc::new(vec![raw::get_close("/healthz")]);
        let mut runs: Vec<Vec<TlsRun>> = vec![Vec::new(); targets.len()];
        for round in 0..self.options.rounds as usize {
            for turn in 0..targets.len() {
                let index = (turn + round) % targets.len();
                let target = &targets[index];
                let (requests, latency) = if target.per_connection {
                    (&one_shot, raw::Latency::FromConnect)
                } else {
                    (&keep_alive, raw::Latency::FromSend)
                };
                let addr = target.server.addr;
                let go = |duration: Duration| {
                    let requests = Arc::clone(requests);
                    let client = target.client.clone();
                    async move {
                        match client {
                            Some(client) => {
                                let connect = move || {
                                    let client = client.clone();
                                    async move { client.connect(addr).await }
                                };
                                raw::closed_loop_with(
                                    connect,
                                    requests,
                                    200,
                                    connections,
                                    duration,
                                    latency,
                                )
                                .await
                            }
                            None => {
                                raw::closed_loop_with(
                                    move || RawConn::connect(addr),
                                    requests,
                                    200,
                                    connections,
                                    duration,
                                    latency,
                                )
                                .await
                            }
                        }
                    }
                };
                go(self.options.warmup).await;
                let handshakes = target.client.as_ref().map(tls::Client::handshakes);
                let mark = CpuMark::take(target.server.pid(), Harness::Own);
                let result = go(self.options.duration).await;
                let seconds = result.elapsed.as_secs_f64();
                let spent = mark.spent();
                let resumed = match (
                    handshakes,
                    target.client.as_ref().map(tls::Client::handshakes),
                ) {
                    (Some((made0, resumed0)), Some((made1, resumed1))) if made1 > made0 => {
                        #[allow(clippy::cast_precision_loss)]
                        let share = (resumed1 - resumed0) as f64 / (made1 - made0) as f64;
                        share
                    }
                    _ => 0.0,
                };
                let run = Run {
                    rps: result.throughput(),
                    p50_ms: result.latency_ms(0.50),
                    p99_ms: result.latency_ms(0.99),
                    unexpected: result.unexpected,
                    errors: result.errors,
                    cpu_us: spent.server_us_per(result.ok),
                    client_busy: spent.load / seconds,
                };
                eprintln!(
                    "load:   round {}/{} {}: {:.0} req/s, p50 {} ms, p99 {} ms, server CPU {:.1} µs per request ({:.0} % of a core), harness {:.0} %{}{}",
                    round + 1,
                    self.options.rounds,
                    target.name,
                    run.rps,
                    fmt_ms(run.p50_ms),
                    fmt_ms(run.p99_ms),
                    run.cpu_us,
                    spent.server / seconds * 100.0,
                    run.client_busy * 100.0,
                    if target.name == TLS_RESUMED {
                        format!(", {:.0} % resumed", resumed * 100.0)
                    } else {
                        String::new()
                    },
                    if run.unexpected + run.errors > 0 {
                        format!(", {} unexpected, {} errors", run.unexpected, run.errors)
                    } else {
                        String::new()
                    }
                );
                runs[index].push(TlsRun {
                    run,
                    server_busy: spent.server / seconds,
                    resumed,
                });
            }
        }
        targets
            .iter()
            .zip(runs)
            .map(|(target, runs)| TlsSeries {
                series: Series::new(target.name, runs.iter().map(|r| r.run).collect()),
                server_cpu_us: runs.iter().map(|r| r.run.cpu_us).collect(),
                server_busy: runs.iter().map(|r| r.server_busy).collect(),
                harness_busy: runs.iter().map(|r| r.run.client_busy).collect(),
                resumed: if target.client.is_some() {
                    runs.iter().map(|r| r.resumed).collect()
                } else {
                    Vec::new()
                },
            })
            .collect()
    }
}

/// The TLS part's tables.
fn tls_summary(o: &Options, report: &TlsReport, footer: &str) -> String {
    let [keep_tls, keep_http, full, resumed, new_http] = report.series.as_slice() else {
        return String::new();
    };
    let header: Vec<String> = [
        "client",
        "req/s (median)",
        "p50 ms",
        "p99 ms",
        "server CPU per request, µs",
        "server busy",
        "harness busy",
        "failed",
    ]
    .map(str::to_owned)
    .into();
    let percent = |values: &[f64]| format!("{:.0} %", median(values.iter().copied()) * 100.0);
    let rows: Vec<Vec<String>> = report
        .series
        .iter()
        .map(|s| {
            let mut name = s.series.server.clone();
            if s.series.server == TLS_RESUMED {
                name.push_str(&format!(" ({} resumed)", percent(&s.resumed)));
            }
            vec![
                name,
                format!("{:.0}", s.series.rps),
                fmt_ms(s.series.p50_ms),
                fmt_ms(s.series.p99_ms),
                format!("{:.1}", s.server_cpu_us()),
                percent(&s.server_busy),
                percent(&s.harness_busy),
                s.series.failures().to_string(),
            ]
        })
        .collect();
    let ratio_header: Vec<String> = [
        "ratio, run by run, median (min–max)",
        "throughput",
        "p50",
        "p99",
        "server CPU per request",
    ]
    .map(str::to_owned)
    .into();
    let cpu_ratio = |a: &TlsSeries, b: &TlsSeries| {
        fmt_ratios(
            &a.server_cpu_us
                .iter()
                .zip(&b.server_cpu_us)
                .filter(|(_, y)| **y > 0.0)
                .map(|(x, y)| x / y)
                .collect::<Vec<_>>(),
        )
    };
    let ratio_rows: Vec<Vec<String>> = [
        (keep_tls, keep_http, "keep-alive: HTTPS ÷ HTTP"),
        (
            full,
            new_http,
            "new connection per request: full TLS handshake ÷ plain TCP",
        ),
        (
            resumed,
            new_http,
            "new connection per request: session resumption ÷ plain TCP",
        ),
    ]
    .into_iter()
    .map(|(a, b, label)| {
        vec![
            label.to_owned(),
            paired_ratio(&a.series, &b.series, |r| r.rps),
            paired_ratio(&a.series, &b.series, |r| r.p50_ms),
            paired_ratio(&a.series, &b.series, |r| r.p99_ms),
            cpu_ratio(a, b),
        ]
    })
    .collect();
    let handshake_us = full.server_cpu_us() - new_http.server_cpu_us();
    format!(
        "### TLS: `GET /healthz` on lameduck over HTTPS and over plain HTTP, closed loop, {} connections, {} rounds of {:?} (+{:?} warm-up), taking turns\n\n{}\n\
         **HTTPS ÷ HTTP, run by run, median (min–max): keep-alive throughput {}; new connections per second, \
         full handshake: {} ({:.0} against {:.0} a second), with session resumption: {}.** \
         Each full handshake costs the server about {:.0} µs of CPU more than a plain connection \
         ({:.1} against {:.1} µs per connection and request).\n\n{}\n\
         Server: `lameduck server --tls-cert --tls-key`, a chain made at start: {}. The client offers \
         ALPN `http/1.1` alone (the raw client speaks HTTP/1.1) and negotiated {}; offering `h2` too, \
         the server picks {}. A new connection per request sends `Connection: close`, its latency counts \
         from the connect; keep-alive latency from the send. CPU is user + system time from \
         `/proc/PID/stat` around each measured run (10 ms ticks); *busy* is that time ÷ the run's \
         length, of one core: a harness near 100 % means the client, not the server, set the pace; \
         neither near it, a wait (neither process's CPU) did.\n\n{footer}\n",
        o.connections,
        o.rounds,
        o.duration,
        o.warmup,
        report::table(&header, &rows),
        paired_ratio(&keep_tls.series, &keep_http.series, |r| r.rps),
        paired_ratio(&full.series, &new_http.series, |r| r.rps),
        full.series.rps,
        new_http.series.rps,
        paired_ratio(&resumed.series, &new_http.series, |r| r.rps),
        handshake_us,
        full.server_cpu_us(),
        new_http.server_cpu_us(),
        report::table(&ratio_header, &ratio_rows),
        report.chain,
        report.negotiated,
        report.alpn_offering_h2,
    )
}

/// `POST /api/links` creating `bench-{n}`, the links the redirect
/// benchmarks follow.
fn create_bench_link(n: u32) -> Vec<u8> {
    let body = format!(r#"{{"url":"https://example.com/bench/{n}","code":"bench-{n}"}}"#);
    raw::post_json("/api/links", &body)
}

/// The instruction count of a callgrind output file (its `totals:` line).
fn callgrind_total(path: &Path) -> anyhow::Result<u64> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    text.lines()
        .find_map(|line| {
            line.strip_prefix("totals:")
                .or_else(|| line.strip_prefix("summary:"))
        })
        .and_then(|total| total.split_whitespace().next()?.parse().ok())
        .with_context(|| format!("no totals in {}", path.display()))
}

async fn stop(replica: &mut Replica) {
    let _ = replica.signal(Signal::SIGTERM);
    replica
        .wait_exit(Instant::now(), Duration::from_secs(30))
        .await;
}

fn median(values: impl Iterator<Item = f64>) -> f64 {
    let mut values: Vec<f64> = values.collect();
    if values.is_empty() {
        return 0.0;
    }
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    if values.len() % 2 == 1 {
        values[mid]
    } else {
        (values[mid - 1] + values[mid]) / 2.0
    }
}

/// The median of the finite `values`, NaN if there are none.
fn median_measured(values: impl Iterator<Item = f64>) -> f64 {
    let measured: Vec<f64> = values.filter(|v| v.is_finite()).collect();
    if measured.is_empty() {
        f64::NAN
    } else {
        median(measured.into_iter())
    }
}

/// The ratio of `a` to `b` run by run (each pair ran back to back in one
/// round), as "median (min–max)": drift of a shared machine cancels out of
/// each pair, where a ratio of medians would mix rounds.
fn paired_ratio(a: &Series, b: &Series, value: impl Fn(&Run) -> f64) -> String {
    fmt_ratios(&paired_ratios(&a.runs, &b.runs, value))
}

/// `a[i] ÷ b[i]` for every pair whose divisor is positive and whose
/// dividend was measured.
fn paired_ratios<T>(a: &[T], b: &[T], value: impl Fn(&T) -> f64) -> Vec<f64> {
    a.iter()
        .zip(b)
        .filter(|(x, y)| value(x).is_finite() && value(y) > 0.0)
        .map(|(x, y)| value(x) / value(y))
        .collect()
}

/// Ratios as "median (min–max)", `–` for none.
fn fmt_ratios(ratios: &[f64]) -> String {
    if ratios.is_empty() {
        return "–".to_owned();
    }
    let min = ratios.iter().copied().fold(f64::INFINITY, f64::min);
    let max = ratios.iter().copied().fold(0.0, f64::max);
    format!("{:.3} ({min:.2}–{max:.2})", median(ratios.iter().copied()))
}

/// "met" or "not met" for the median of paired `ratios` against a target
/// (`at_least`: the ratio must be ≥ it, else ≤).
fn verdict(ratios: &[f64], target: f64, at_least: bool) -> &'static str {
    if ratios.is_empty() {
        return "not measured";
    }
    let value = median(ratios.iter().copied());
    if (at_least && value >= target) || (!at_least && value <= target) {
        "met"
    } else {
        "not met"
    }
}

/// lameduck (`a`) ÷ each of `baselines`, run by run: throughput, p50 and
/// p99 as median (min–max), and the target of each row if it has one.
fn ratio_table(a: &Series, baselines: &[(&Series, String)]) -> String {
    let header: Vec<String> = [
        "ratio, run by run",
        "throughput, median (min–max)",
        "p50",
        "p99",
        "server CPU a request",
        "target (throughput)",
    ]
    .map(str::to_owned)
    .into();
    let rows: Vec<Vec<String>> = baselines
        .iter()
        .map(|(b, target)| {
            vec![
                format!("{} ÷ {}", a.server, b.server),
                paired_ratio(a, b, |r| r.rps),
                paired_ratio(a, b, |r| r.p50_ms),
                paired_ratio(a, b, |r| r.p99_ms),
                paired_ratio(a, b, |r| r.cpu_us),
                target.clone(),
            ]
        })
        .collect();
    report::table(&header, &rows)
}

/// The table of series under load, with each median ÷ `base`'s.
fn series_table(series: &[&Series], base: &Series) -> String {
    let header: Vec<String> = vec![
        "server".to_owned(),
        "req/s (median)".to_owned(),
        "p50 ms".to_owned(),
        "p99 ms".to_owned(),
        format!("median ÷ median of {}", base.server),
        "server CPU µs a request (median)".to_owned(),
        "load generator busy (median)".to_owned(),
        "failed".to_owned(),
    ];
    let rows: Vec<Vec<String>> = series
        .iter()
        .map(|s| {
            vec![
                s.server.clone(),
                format!("{:.0}", s.rps),
                fmt_ms(s.p50_ms),
                fmt_ms(s.p99_ms),
                ratio(s.rps, base.rps),
                fmt_cpu(s.cpu_us),
                fmt_busy(s.client_busy),
                s.failures().to_string(),
            ]
        })
        .collect();
    report::table(&header, &rows)
}

/// Round by round, the faster of two processes that do nothing but close
/// their connections: one leaving them to the kernel at exit, one closing
/// them from every core. Either can win a round on a shared machine.
fn round_floors(exit_at_once: &[ShutdownRun], close_only: &[ShutdownRun]) -> Vec<f64> {
    exit_at_once
        .iter()
        .zip(close_only)
        .map(|(a, b)| a.exit_ms.min(b.exit_ms))
        .collect()
}

/// A signed difference in milliseconds: `+12.3`, `−4.56`.
fn fmt_delta_ms(ms: f64) -> String {
    let sign = if ms < 0.0 { '−' } else { '+' };
    format!("{sign}{}", fmt_ms(ms.abs()))
}

/// One placement's shutdown table, and the target's verdict.
fn shutdown_summary(
    o: &Options,
    placement: &str,
    series: &[&ShutdownSeries],
    footer: &str,
) -> String {
    let header: Vec<String> = [
        "server",
        "SIGTERM → exit, median (min–max) ms",
        "above the floor, median ms",
        "exit codes",
        "RSS idle",
        "RSS with connections",
        "RSS per idle connection",
    ]
    .map(str::to_owned)
    .into();
    let rows: Vec<Vec<String>> = series
        .iter()
        .map(|s| {
            let min = s
                .runs
                .iter()
                .map(|r| r.exit_ms)
                .fold(f64::INFINITY, f64::min);
            let max = s.runs.iter().map(|r| r.exit_ms).fold(0.0, f64::max);
            let codes: Vec<String> = s
                .runs
                .iter()
                .map(|r| {
                    r.code
                        .map_or_else(|| "signal".to_owned(), |c| c.to_string())
                })
                .collect();
            let mib = |kib: f64| format!("{:.1} MiB", kib / 1024.0);
            vec![
                s.server.clone(),
                format!("{} ({}–{})", fmt_ms(s.exit_ms), fmt_ms(min), fmt_ms(max)),
                fmt_ms(s.above_floor_ms),
                codes.join(" "),
                #[allow(clippy::cast_precision_loss)]
                mib(median(s.runs.iter().map(|r| r.rss_before_kib as f64))),
                #[allow(clippy::cast_precision_loss)]
                mib(median(s.runs.iter().map(|r| r.rss_open_kib as f64))),
                format!("{:.1} KiB", s.bytes_per_connection / 1024.0),
            ]
        })
        .collect();
    let target = match series {
        [lameduck, minimal, _, graceful, bare, none] => {
            let floor = median(round_floors(&bare.runs, &none.runs).into_iter());
            let beyond_graceful = median(
                lameduck
                    .runs
                    .iter()
                    .zip(&graceful.runs)
                    .map(|(l, g)| l.exit_ms - g.exit_ms),
            );
            let ratios = paired_ratios(&lameduck.runs, &minimal.runs, |r| r.exit_ms);
            format!(
                "**Target: lameduck ÷ minimal axum app, SIGTERM → exit, round by round, ≤ {SHUTDOWN_TARGET:.1}×; \
                 lameduck: {} ({}), {} ms against {} ms.** The floor is the \
                 faster, round by round, of two processes that do nothing but close the {} \
                 connections: bare hyper exiting at once, so that the kernel closes them at exit, \
                 and no server at all, sending each its FIN (`shutdown(2)`, then `close(2)`) from \
                 one thread per core it may use. Median {} ms: the kernel's own cost of closing \
                 them (and of the peer's ACK, on loopback). Paired round by round, lameduck takes \
                 **{} ms above the floor**, the minimal axum app {} ms; lameduck − hyper-util's \
                 `GracefulShutdown`: **{} ms**.",
                fmt_ratios(&ratios),
                verdict(&ratios, SHUTDOWN_TARGET, false),
                fmt_ms(lameduck.exit_ms),
                fmt_ms(minimal.exit_ms),
                o.idle,
                fmt_ms(floor),
                fmt_ms(lameduck.above_floor_ms),
                fmt_ms(minimal.above_floor_ms),
                fmt_delta_ms(beyond_graceful),
            )
        }
        _ => format!(
            "**Target: lameduck ÷ minimal axum app, SIGTERM → exit, ≤ {SHUTDOWN_TARGET:.1}×.**"
        ),
    };
    format!(
        "### Shutdown with {} idle keep-alive HTTP/1.1 connections, `--drain-delay 0s`, servers on {placement}, {} rounds\n\n{}\n\
         {target} RSS per idle connection = (RSS with the connections − RSS before) ÷ {}.\n\n{footer}\n",
        o.idle,
        series.first().map_or(0, |s| s.runs.len()),
        report::table(&header, &rows),
        o.idle,
    )
}

/// A share of a core as a percentage, `–` where not measured.
fn fmt_busy(share: f64) -> String {
    if share.is_finite() {
        format!("{:.0} %", share * 100.0)
    } else {
        "–".to_owned()
    }
}

/// CPU µs a request, `–` where not measured.
fn fmt_cpu(us: f64) -> String {
    if us.is_finite() {
        format!("{us:.2}")
    } else {
        "–".to_owned()
    }
}

fn ratio(a: f64, b: f64) -> String {
    if b == 0.0 {
        "–".to_owned()
    } else {
        format!("{:.3}", a / b)
    }
}

/// What each step of lameduck's middleware costs on `GET /healthz`: the
/// instructions per request with every step less those without that one.
fn steps_table(
    lameduck: &InstructionSeries,
    minimal: &InstructionSeries,
    steps: &[InstructionSeries],
) -> String {
    if steps.is_empty() {
        return String::new();
    }
    let above = lameduck.per_request - minimal.per_request;
    let header: Vec<String> = vec![
        "step switched off".to_owned(),
        "instructions per `GET /healthz` without it".to_owned(),
        "what the step costs".to_owned(),
        format!("share of lameduck − minimal axum app ({above:.0})"),
    ];
    let step_of = |s: &InstructionSeries| {
        let step = s.server.rsplit(" without ").next().unwrap_or(&s.server);
        step.to_owned()
    };
    let label = |step: String| {
        if step == crate::baseline::EVERY_STEP {
            "all seven at once".to_owned()
        } else {
            step
        }
    };
    let mut rows: Vec<Vec<String>> = steps
        .iter()
        .map(|s| {
            let cost = lameduck.per_request - s.per_request;
            vec![
                label(step_of(s)),
                format!("{:.0}", s.per_request),
                format!("{cost:.0}"),
                format!("{:.0} %", 100.0 * cost / above),
            ]
        })
        .collect();
    let every = steps
        .iter()
        .find(|s| step_of(s) == crate::baseline::EVERY_STEP);
    let rest = every.map(|every| every.per_request - minimal.per_request);
    if let Some(rest) = rest {
        rows.push(vec![
            "what is left, above the minimal axum app".to_owned(),
            "–".to_owned(),
            format!("{rest:.0}"),
            format!("{:.0} %", 100.0 * rest / above),
        ]);
    }
    let rest = rest.map_or_else(String::new, |rest| {
        format!(
            " With every step off, lameduck still runs {rest:.0} instructions a request more than the minimal axum app: the stack's own service and future, axum's route level for its layer, and the lifecycle's request scope, connection state and deadlines."
        )
    });
    format!(
        "What each step of the middleware costs, switched off one at a time, and all at once (`lameduck-without`, a build for the bench only).{rest}\n\n{}\n",
        report::table(&header, &rows)
    )
}

/// The HTTP/2 section: one table per route and shape, the headline
/// lameduck ÷ the minimal axum app, and ÷ the same app with `TCP_NODELAY`.
fn h2_summary(report: &BenchReport, footer: &str) -> String {
    let o = &report.options;
    let mut text = format!(
        "### HTTP/2 with prior knowledge (h2c), `h2load`, {} rounds of {:?} (+{:?} warm-up), servers taking turns\n\n",
        o.rounds, o.duration, o.warmup
    );
    for case in &report.h2 {
        let [lameduck, minimal, nodelay] = case.series.as_slice() else {
            continue;
        };
        let ratios = paired_ratios(&lameduck.runs, &minimal.runs, |r| r.rps);
        text.push_str(&format!(
            "#### `{}`, {} connection(s) × {} streams\n\n{}\n\
             **lameduck ÷ minimal axum app, run by run: throughput {} (target ≥ {:.2}: {}), p50 {}, p99 {}**; \
             lameduck ÷ minimal axum app + TCP_NODELAY: throughput {}, p99 {}.\n\n",
            case.route,
            case.connections,
            case.streams,
            series_table(&[lameduck, minimal, nodelay], minimal),
            fmt_ratios(&ratios),
            h2::H2_TARGET,
            verdict(&ratios, h2::H2_TARGET, true),
            paired_ratio(lameduck, minimal, |r| r.p50_ms),
            paired_ratio(lameduck, minimal, |r| r.p99_ms),
            paired_ratio(lameduck, nodelay, |r| r.rps),
            paired_ratio(lameduck, nodelay, |r| r.p99_ms),
        ));
    }
    text.push_str(footer);
    text.push('\n');
    text
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
    if let [lameduck, minimal, stack, bare, plain, copy] = report.throughput.as_slice() {
        let ratios = paired_ratios(&lameduck.runs, &minimal.runs, |r| r.rps);
        text.push_str(&format!(
            "### Trivial route: `GET /healthz`, closed loop, {} connections, {} rounds of {:?} (+{:?} warm-up), servers taking turns\n\n{}\n\
             **lameduck ÷ minimal axum app, run by run, median (min–max): throughput {} \
             (target ≥ {THROUGHPUT_TARGET:.2}: {}), p50 {}, p99 {}; server CPU a request {}.** The run's own noise, \
             two copies of the minimal axum app taking turns like the rest (minimal axum app \
             ÷ its second copy, run by run): throughput {}, p99 {}. The other baselines:\n\n{}\n{footer}\n",
            o.connections,
            o.rounds,
            o.duration,
            o.warmup,
            series_table(&[lameduck, minimal, stack, bare, plain, copy], minimal),
            fmt_ratios(&ratios),
            verdict(&ratios, THROUGHPUT_TARGET, true),
            paired_ratio(lameduck, minimal, |r| r.p50_ms),
            paired_ratio(lameduck, minimal, |r| r.p99_ms),
            paired_ratio(lameduck, minimal, |r| r.cpu_us),
            paired_ratio(minimal, copy, |r| r.rps),
            paired_ratio(minimal, copy, |r| r.p99_ms),
            ratio_table(
                lameduck,
                &[
                    (minimal, format!("≥ {THROUGHPUT_TARGET:.2} (headline)")),
                    (stack, String::new()),
                    (bare, String::new()),
                    (plain, String::new()),
                ]
            ),
        ));
    }
    if let [counted, minimal, uncounted] = report.counting.as_slice() {
        let ratios = paired_ratios(&counted.runs, &minimal.runs, |r| r.rps);
        text.push_str(&format!(
            "### Redirect hot path: `GET /{{code}}` over {} links (lameduck on SQLite, the default store; the minimal axum app on an in-memory map), closed loop, {} connections, {} rounds of {:?} (+{:?} warm-up)\n\n{}\n\
             **lameduck ÷ minimal axum app, run by run, median (min–max): throughput {} \
             (target ≥ {THROUGHPUT_TARGET:.2}: {}), p50 {}, p99 {}; server CPU a request {}.** The cost of counting the hit:\n\n{}\n{footer}\n",
            o.links,
            o.connections,
            o.rounds,
            o.duration,
            o.warmup,
            series_table(&[counted, minimal, uncounted], minimal),
            fmt_ratios(&ratios),
            verdict(&ratios, THROUGHPUT_TARGET, true),
            paired_ratio(counted, minimal, |r| r.p50_ms),
            paired_ratio(counted, minimal, |r| r.p99_ms),
            paired_ratio(counted, minimal, |r| r.cpu_us),
            ratio_table(
                counted,
                &[
                    (minimal, format!("≥ {THROUGHPUT_TARGET:.2} (headline)")),
                    (uncounted, "≥ 0.95 (the cost of counting)".to_owned()),
                ]
            ),
        ));
    }
    if !report.h2.is_empty() {
        text.push_str(&h2_summary(report, &footer));
    }
    let mut placements: Vec<&str> = report
        .shutdown
        .iter()
        .map(|s| s.placement.as_str())
        .collect();
    placements.dedup();
    for placement in placements {
        let series: Vec<&ShutdownSeries> = report
            .shutdown
            .iter()
            .filter(|s| s.placement == placement)
            .collect();
        // The harness stays pinned when the servers get every core.
        let footer = if placement == ALL_CORES && report.placement != NOT_PINNED {
            format!(
                "Machine: {}; servers on all cores, load generator pinned to CPU {}.\n\nCommand: `{}`\n",
                report.machine.line(),
                report.machine.cores.saturating_sub(1),
                report.machine.command
            )
        } else {
            footer.clone()
        };
        text.push_str(&shutdown_summary(o, placement, &series, &footer));
    }
    if let [lameduck, minimal, plain, bare, counted, minimal_redirect, uncounted, steps @ ..] =
        report.instructions.as_slice()
    {
        let header: Vec<String> = vec![
            "route".to_owned(),
            "server".to_owned(),
            "instructions per request".to_owned(),
            format!(
                "whole process, {} / {} requests",
                INSTRUCTION_RUNS[0], INSTRUCTION_RUNS[1]
            ),
        ];
        let rows: Vec<Vec<String>> = report
            .instructions
            .iter()
            .map(|s| {
                vec![
                    format!("`{}`", s.route),
                    s.server.clone(),
                    format!("{:.0}", s.per_request),
                    s.totals
                        .iter()
                        .map(u64::to_string)
                        .collect::<Vec<_>>()
                        .join(" / "),
                ]
            })
            .collect();
        text.push_str(&format!(
            "### Instructions per request (callgrind), {} and {} requests over 8 connections\n\n{}\n\
             **`GET /healthz`: lameduck ÷ minimal axum app: {} of the instructions**, a throughput ratio of \
             {} if time followed instructions; **lameduck ÷ bare hyper: {}** (lameduck ÷ plain axum::serve: {}). \
             **`GET /{{code}}`: lameduck ÷ minimal axum app: {}**, a throughput ratio of {}; counting ÷ not \
             counting: {}. Counted, not timed: the same on a busy machine as on an idle one.\n\n{}{footer}\n",
            INSTRUCTION_RUNS[0],
            INSTRUCTION_RUNS[1],
            report::table(&header, &rows),
            ratio(lameduck.per_request, minimal.per_request),
            ratio(minimal.per_request, lameduck.per_request),
            ratio(lameduck.per_request, bare.per_request),
            ratio(lameduck.per_request, plain.per_request),
            ratio(counted.per_request, minimal_redirect.per_request),
            ratio(minimal_redirect.per_request, counted.per_request),
            ratio(counted.per_request, uncounted.per_request),
            steps_table(lameduck, minimal, steps),
        ));
    }
    if let Some(tls) = &report.tls {
        text.push_str(&tls_summary(o, tls, &footer));
    }
    if let Some(spill) = &report.spill {
        let runs: Vec<String> = spill.runs_ms.iter().map(|ms| fmt_ms(*ms)).collect();
        text.push_str(&format!(
            "### A forced exit's spill: pending hits of {} links, written synchronously\n\n\
             {} hits, a {} KiB file, written, fsynced and renamed, directory fsynced, in {}; \
             one run per round: {} ms.\n\n\
             **Median {} ms, max {} ms (target: well under 100 ms).** Timed around \
             `HitCounter::spill_now`, the call the force hook makes at a second signal.\n\n{footer}\n",
            spill.links,
            spill.hits,
            spill.bytes / 1024,
            spill.dir,
            runs.join(", "),
            fmt_ms(spill.median_ms),
            fmt_ms(spill.max_ms),
        ));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(clap::Parser)]
    struct Args {
        #[command(flatten)]
        options: Options,
    }

    fn series(server: &str, rps: &[f64]) -> Series {
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

    #[test]
    fn the_tls_part_prints_https_over_http_run_by_run() {
        let tls_series = |name: &str, rps: &[f64], cpu_us: f64| TlsSeries {
            series: series(name, rps),
            server_cpu_us: vec![cpu_us; rps.len()],
            server_busy: vec![1.0; rps.len()],
            harness_busy: vec![0.5; rps.len()],
            resumed: vec![0.9; rps.len()],
        };
        let report = TlsReport {
            chain: tls::CHAIN.to_owned(),
            negotiated: "TLS 1.3, X25519, ALPN http/1.1".to_owned(),
            alpn_offering_h2: "h2".to_owned(),
            series: vec![
                tls_series(TLS_KEEP_ALIVE, &[90.0, 95.0], 20.0),
                tls_series(HTTP_KEEP_ALIVE, &[100.0, 100.0], 18.0),
                tls_series(TLS_FULL, &[10.0, 12.0], 250.0),
                tls_series(TLS_RESUMED, &[20.0, 20.0], 120.0),
                tls_series(HTTP_NEW, &[100.0, 100.0], 25.0),
            ],
        };
        use clap::Parser;
        let options = Args::parse_from(["load"]).options;
        assert!(options.parts.contains(&Part::Tls), "a default part");
        let text = tls_summary(&options, &report, "footer");
        for expected in [
            "keep-alive throughput 0.925 (0.90–0.95)",
            "full handshake: 0.110 (0.10–0.12) (11 against 100 a second)",
            "with session resumption: 0.200 (0.20–0.20)",
            "about 225 µs of CPU more",
            "session resumption (90 % resumed)",
            "the server picks h2",
        ] {
            assert!(text.contains(expected), "{expected}: {text}");
        }
    }

    #[test]
    fn the_headlines_are_lameduck_over_the_minimal_axum_app() {
        use clap::Parser;
        let mut machine = Machine::describe();
        machine.command = "load bench --test".to_owned();
        let report = BenchReport {
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
                series(COUNTING, &[50.0]),
                series(MINIMAL_REDIRECT, &[100.0]),
                series(NOT_COUNTING, &[50.0]),
            ],
            shutdown: vec![
                shutdown_series("lameduck --drain-delay 0s", &[50.0]),
                shutdown_series(MINIMAL_AXUM, &[100.0]),
                shutdown_series(PLAIN_AXUM, &[100.0]),
                shutdown_series("hyper-util GracefulShutdown", &[40.0]),
                shutdown_series("bare hyper (exits at once)", &[20.0]),
                shutdown_series("no server", &[20.0]),
            ],
            instructions: Vec::new(),
            spill: None,
            tls: None,
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
        };
        let text = summary(&report);
        assert!(
            text.contains("throughput 0.900 (0.90–0.90) (target ≥ 0.85: met)"),
            "{text}"
        );
        assert!(
            text.contains("lameduck ÷ minimal axum app + TCP_NODELAY: throughput 1.125"),
            "{text}"
        );
        assert!(
            text.contains(
                "**lameduck ÷ minimal axum app, run by run, median (min–max): \
                 throughput 0.875 (0.80–0.95) (target ≥ 0.90: not met)"
            ),
            "{text}"
        );
        assert!(
            text.contains("throughput 0.500 (0.50–0.50) (target ≥ 0.90: not met)"),
            "{text}"
        );
        assert!(
            text.contains("| lameduck ÷ axum + tower-http stack "),
            "{text}"
        );
        assert!(
            text.contains("≤ 1.0×; lameduck: 0.500 (0.50–0.50) (met)"),
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
