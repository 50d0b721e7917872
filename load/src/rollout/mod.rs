//! Scenario 1, the rolling deploy: R replicas behind HAProxy, rolled like a
//! Deployment with `maxSurge 1, maxUnavailable 0` (start a new replica, wait
//! until it is ready, add it to the balancer, SIGTERM an old one, wait for
//! its exit, take it out of the balancer, repeat) under constant open-loop
//! traffic, once per flavor with the same seed and rate.
//!
//! The balancer notices an old replica only through its failing `/readyz`
//! checks, so it keeps sending it new requests for up to
//! [`Checks::worst_lag`] after the SIGTERM, the way endpoint removal lags
//! in a real cluster. A server that stops accepting at once refuses or
//! resets them; lameduck's lame-duck period outlasts the lag.

pub mod summary;

use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use clap::ValueEnum;
use serde::Serialize;

use crate::binaries::Binaries;
use crate::fate::FateCounts;
use crate::fleet::seed::{self, Links};
use crate::fleet::{phases, Database, Fleet, Probe, Steady, Traffic};
use crate::haproxy::{Checks, Haproxy};
use crate::machine::Machine;
use crate::raw::RawConn;
use crate::replica::{Ended, Spec};
use crate::report::{Latency, Mark};
use crate::scenario::{Common, Scenario};
use crate::traffic::Mix;
use crate::SERVICE;

/// Server slots per balancer backend: R + 1 are in use at most.
const SLOTS: usize = 16;

/// Added to a replica's own shutdown budget before the harness kills it.
const EXIT_SLACK: Duration = Duration::from_secs(15);

/// Which server the replicas run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Flavor {
    /// lameduck with `--drain-delay` (the `--drain-delay` option).
    Lameduck,
    /// lameduck with `--drain-delay 0s`.
    LameduckNoDelay,
    /// The same app on plain `axum::serve(..).with_graceful_shutdown`.
    PlainAxum,
}

impl Flavor {
    fn slug(self) -> String {
        match self {
            Flavor::Lameduck => SERVICE.to_owned(),
            Flavor::LameduckNoDelay => format!("{SERVICE}-no-delay"),
            Flavor::PlainAxum => "plain-axum".to_owned(),
        }
    }

    fn drain_delay(self, options: &Options) -> Duration {
        match self {
            Flavor::Lameduck => options.drain_delay,
            Flavor::LameduckNoDelay | Flavor::PlainAxum => Duration::ZERO,
        }
    }

    fn label(self, options: &Options) -> String {
        match self {
            Flavor::Lameduck | Flavor::LameduckNoDelay => format!(
                "{SERVICE} --drain-delay {}",
                humantime::format_duration(self.drain_delay(options))
            ),
            Flavor::PlainAxum => "plain axum::serve".to_owned(),
        }
    }

    fn program(self, binaries: &Binaries) -> &Path {
        match self {
            Flavor::Lameduck | Flavor::LameduckNoDelay => &binaries.service,
            Flavor::PlainAxum => &binaries.plain_axum,
        }
    }
}

/// Options of `load rollout`.
#[derive(Clone, Debug, clap::Args, Serialize)]
pub struct Options {
    /// Replicas serving at all times (R ≥ 2).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(2..=8))]
    pub replicas: u16,
    /// Replicas replaced one after another (K).
    #[arg(long, default_value_t = 10)]
    pub replacements: u16,
    /// Requests per second, constant.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=20_000))]
    pub rate: u32,
    /// Seed of the traffic's choices (protocol, kind, link).
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// lameduck's lame-duck period; must outlast the balancer's lag.
    #[arg(long, default_value = "3s", value_parser = humantime::parse_duration)]
    #[serde(with = "crate::report::millis")]
    pub drain_delay: Duration,
    /// Every replica's `--shutdown-timeout`.
    #[arg(long, default_value = "20s", value_parser = humantime::parse_duration)]
    #[serde(with = "crate::report::millis")]
    pub shutdown_timeout: Duration,
    /// Steady traffic before the first and after the last replacement.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    #[serde(with = "crate::report::millis")]
    pub steady: Duration,
    /// Links created before the traffic starts; redirects pick among them.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub links: u32,
    /// Share of requests over HTTP/2 (prior knowledge); the rest HTTP/1.1.
    #[arg(long, default_value_t = 0.5)]
    pub h2_share: f64,
    /// Share of requests creating links (`POST /api/links`); the rest redirect.
    #[arg(long, default_value_t = 0.1)]
    pub create_share: f64,
    /// A request without a complete answer after this long is a timeout.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    #[serde(with = "crate::report::millis")]
    pub timeout: Duration,
    /// The balancer's health checks.
    #[command(flatten)]
    pub checks: Checks,
    /// The flavors to roll, in this order.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_values_t = [Flavor::Lameduck, Flavor::LameduckNoDelay, Flavor::PlainAxum]
    )]
    pub flavors: Vec<Flavor>,
    /// Short correctness run: lameduck only, R=2, K=2, 400 req/s, 3 s of
    /// steady traffic; implies --check. Overrides those options.
    #[arg(long)]
    pub smoke: bool,
    /// `--check`, `--out`, `--bin-dir`, `--no-install`.
    #[command(flatten)]
    #[serde(flatten)]
    pub common: Common,
}

impl Options {
    /// Applies `--smoke`.
    pub fn resolve(mut self) -> Options {
        if self.smoke {
            self.replicas = 2;
            self.replacements = 2;
            self.rate = 400;
            self.steady = Duration::from_secs(3);
            self.flavors = vec![Flavor::Lameduck];
            self.common.check = true;
        }
        self
    }
}

/// One replacement: a new replica in, an old one out.
#[derive(Clone, Debug, Serialize)]
pub struct Replacement {
    /// The new replica.
    pub new_replica: String,
    /// From its start to its first 200 on `/readyz`.
    #[serde(with = "crate::report::millis")]
    pub new_ready_after: Duration,
    /// The old replica.
    pub old_replica: String,
    /// When it got SIGTERM, in seconds since the traffic started.
    pub sigterm_at_s: f64,
    /// From SIGTERM until the balancer's checks had taken it out of both
    /// backends (`None` if they never did within the wait bound).
    #[serde(with = "crate::report::opt_millis")]
    pub lb_out_after: Option<Duration>,
    /// How it ended; `after` is its drain time, SIGTERM to exit.
    pub ended: Ended,
}

/// Counts by protocol and by kind.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Breakdown {
    /// HTTP/1.1 requests.
    pub http1: FateCounts,
    /// HTTP/2 requests.
    pub http2: FateCounts,
    /// Redirects.
    pub redirect: FateCounts,
    /// Link creations.
    pub create: FateCounts,
}

/// One flavor's run.
#[derive(Clone, Debug, Serialize)]
pub struct FlavorResult {
    /// Which server.
    pub flavor: Flavor,
    /// Its label in tables.
    pub label: String,
    /// Every request by fate.
    pub requests: FateCounts,
    /// The same by protocol and kind.
    pub breakdown: Breakdown,
    /// Latency of successful requests outside replacements.
    pub latency_steady: Latency,
    /// Latency of successful requests due between a SIGTERM and one second
    /// after that replica's exit.
    pub latency_replacing: Latency,
    /// Every replacement, in order.
    pub replacements: Vec<Replacement>,
    /// How the replicas left at the end exited (SIGTERM without traffic).
    pub final_exits: Vec<Ended>,
    /// Redirects answered 307: hits the service owes the database.
    pub redirects_answered: u64,
    /// `SUM(links.hits)` after every replica exited.
    pub hits_stored: i64,
    /// Creations answered 201.
    pub links_answered: u64,
    /// Links in the database after the run, less the seeded ones.
    pub links_stored: i64,
    /// Seconds of traffic.
    pub traffic_s: f64,
    /// Per second of traffic: requests answered as expected.
    pub ok_per_second: Vec<u64>,
    /// Per second of traffic: failed requests.
    pub failed_per_second: Vec<u64>,
    /// Readiness, SIGTERM, balancer removal and exit of every replica.
    pub marks: Vec<Mark>,
}

impl FlavorResult {
    /// Hits answered but not stored (negative: stored but not answered,
    /// from requests whose answer was lost).
    pub fn hits_lost(&self) -> i64 {
        i64::try_from(self.redirects_answered).unwrap_or(i64::MAX) - self.hits_stored
    }

    /// Links answered 201 but not stored.
    pub fn links_lost(&self) -> i64 {
        i64::try_from(self.links_answered).unwrap_or(i64::MAX) - self.links_stored
    }

    /// Every exit, replacements first.
    pub fn exits(&self) -> impl Iterator<Item = &Ended> {
        self.replacements
            .iter()
            .map(|r| &r.ended)
            .chain(&self.final_exits)
    }

    /// No failed request, no lost or extra hit or link, every exit 0.
    pub fn is_clean(&self) -> bool {
        self.requests.failed() == 0
            && self.hits_lost() == 0
            && self.links_lost() == 0
            && self.exits().all(|e| e.code == Some(0))
    }
}

/// Everything a `load rollout` run measured.
#[derive(Clone, Debug, Serialize)]
pub struct RolloutReport {
    /// Where and how.
    pub machine: Machine,
    /// The options after `--smoke`.
    pub options: Options,
    /// The traffic.
    pub mix: Mix,
    /// One per flavor, in run order.
    pub results: Vec<FlavorResult>,
}

/// Runs every flavor of `options`.
///
/// # Errors
/// If a tool is missing or a step of the rollout itself fails (a replica
/// that does not start, a balancer that rejects a command); failed requests
/// are results, not errors.
pub async fn run(
    options: Options,
    binaries: &Binaries,
    machine: Machine,
    out: &Path,
) -> anyhow::Result<RolloutReport> {
    let checks = options.checks;
    if options.flavors.contains(&Flavor::Lameduck) && options.drain_delay <= checks.worst_lag() {
        eprintln!(
            "load: warning: --drain-delay {:?} does not outlast the balancer's worst lag {:?} \
             (fall + 1 checks {:?} apart): expect failures",
            options.drain_delay,
            checks.worst_lag(),
            checks.inter
        );
    }
    std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    let database = Database::start(Duration::from_secs(10)).await?;
    let result = run_flavors(&options, binaries, &database, out).await;
    database.stop().await;
    Ok(RolloutReport {
        machine,
        mix: mix(&options),
        results: result?,
        options,
    })
}

fn mix(options: &Options) -> Mix {
    Mix {
        rate: options.rate,
        seed: options.seed,
        h2_share: options.h2_share,
        create_share: options.create_share,
        read_share: 0.0,
        timeout: options.timeout,
        // Far more than any rollout takes; only a harness bug reaches it.
        max_duration: Duration::from_secs(1800),
    }
}

async fn run_flavors(
    options: &Options,
    binaries: &Binaries,
    database: &Database,
    out: &Path,
) -> anyhow::Result<Vec<FlavorResult>> {
    let mut results = Vec::new();
    for flavor in &options.flavors {
        eprintln!(
            "load: rolling {} (R={}, K={}, {} req/s)",
            flavor.label(options),
            options.replicas,
            options.replacements,
            options.rate
        );
        let result = run_flavor(*flavor, options, binaries, database, out).await?;
        eprintln!(
            "load: {}: {} requests, {} failed, hits answered {} / stored {}",
            result.label,
            result.requests.total(),
            result.requests.failed(),
            result.redirects_answered,
            result.hits_stored
        );
        results.push(result);
    }
    Ok(results)
}

/// Every replica's arguments: the flavor's server and drain delay, one
/// database, one data directory.
fn spec(flavor: Flavor, options: &Options, binaries: &Binaries, url: &str, data: &Path) -> Spec {
    Spec {
        program: flavor.program(binaries).to_owned(),
        args: [
            "server",
            "--listen",
            "127.0.0.1:0",
            "--log-format",
            "text",
            "--drain-delay",
            &humantime::format_duration(flavor.drain_delay(options)).to_string(),
            "--shutdown-timeout",
            &humantime::format_duration(options.shutdown_timeout).to_string(),
            "--data-dir",
        ]
        .iter()
        .map(Into::into)
        .chain([data.as_os_str().to_owned()])
        .collect(),
        env: vec![("DATABASE_URL".to_owned(), url.to_owned())],
        cpus: None,
    }
}

/// One flavor: R replicas behind a fresh balancer, links seeded, then
/// steady traffic, K replacements, steady traffic, and the final stop.
async fn run_flavor(
    flavor: Flavor,
    options: &Options,
    binaries: &Binaries,
    database: &Database,
    out: &Path,
) -> anyhow::Result<FlavorResult> {
    let logs = out.join(flavor.slug()).join("logs");
    std::fs::create_dir_all(&logs)?;
    let scratch = tempfile::Builder::new()
        .prefix(&format!("{SERVICE}-load-"))
        .tempdir()?;
    let lb = Haproxy::start(
        options.checks,
        SLOTS,
        scratch.path(),
        &logs.join("haproxy.log"),
    )
    .await?;
    let mut fleet = Fleet::new(lb, Probe::Public, &logs);
    let spec = spec(
        flavor,
        options,
        binaries,
        &database.url(),
        &scratch.path().join("data"),
    );
    for _ in 0..options.replicas {
        fleet.add(&spec).await?;
    }
    database.empty_links().await?;
    let addr = fleet.first_addr()?;
    let links = Links {
        prefix: "seed",
        count: options.links,
        seed: options.seed,
    };
    let codes = seed::create(links, || RawConn::connect(addr)).await?;

    let traffic = Traffic::start(mix(options), fleet.targets(), codes);
    fleet.begin(traffic.origin);
    let exit_bound = flavor.drain_delay(options) + options.shutdown_timeout + EXIT_SLACK;
    let replacing = replace(&mut fleet, &spec, options, exit_bound);
    let (replacements, ran) = phases(traffic, Steady::around(options.steady), replacing).await?;
    let stopped = fleet.stop(exit_bound).await?;
    let links_stored = database.links().await? - i64::from(options.links);
    Ok(summary::summarize(
        flavor,
        options,
        &ran,
        summary::Ending {
            replacements,
            stopped,
            hits_stored: database.hits_stored().await?,
            links_stored,
        },
    ))
}

/// K replacements, one after another: a new replica in (ready and UP),
/// the oldest out (SIGTERM, out of the balancer, exit).
async fn replace(
    fleet: &mut Fleet,
    spec: &Spec,
    options: &Options,
    exit_bound: Duration,
) -> anyhow::Result<Vec<Replacement>> {
    let mut replacements = Vec::new();
    for k in 0..options.replacements {
        let added = fleet.add(spec).await?;
        let retired = fleet.retire_oldest(exit_bound).await?;
        eprintln!(
            "load:   {}/{}: {} ready in {:?}; {} exited {} after {:?} (balancer out after {})",
            k + 1,
            options.replacements,
            added.name,
            added.ready_after,
            retired.name,
            retired.ended.describe(),
            retired.ended.after,
            retired
                .lb_out_after
                .map_or_else(|| "-".to_owned(), |d| format!("{d:?}"))
        );
        replacements.push(Replacement {
            new_replica: added.name,
            new_ready_after: added.ready_after,
            old_replica: retired.name,
            sigterm_at_s: fleet.at(retired.sigterm),
            lb_out_after: retired.lb_out_after,
            ended: retired.ended,
        });
    }
    Ok(replacements)
}

impl Scenario for Options {
    const NAME: &'static str = "rollout";
    const PASSED: &'static str = "no failed request, no lost hit, every exit 0";
    type Report = RolloutReport;

    fn common(&self) -> &Common {
        &self.common
    }

    async fn run(
        self,
        binaries: &Binaries,
        machine: Machine,
        out: &Path,
    ) -> anyhow::Result<RolloutReport> {
        run(self, binaries, machine, out).await
    }

    fn write(report: &RolloutReport, out: &Path) -> anyhow::Result<()> {
        summary::write(report, out)
    }

    fn summary(report: &RolloutReport) -> String {
        summary::summary(report)
    }

    fn verdict(report: &RolloutReport) -> Result<(), String> {
        summary::verdict(report)
    }
}
