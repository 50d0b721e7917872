//! Scenario 5, connections over time: long-lived keep-alive HTTPS clients
//! behind an L4 balancer (HAProxy in `mode tcp`, as kube-proxy balances a
//! Service; TLS ends at the replicas), in two parts measured in one run.
//!
//! 1. The storm ([`storm`]): R replicas on one PostgreSQL, each replaced
//!    once (the new one started, ready and UP in the balancer first, then
//!    the old one SIGTERMed with `--drain-delay`), under steady open-loop
//!    redirects from many clients; once with `--drain-spread immediate`
//!    (every answer of the lame duck says `Connection: close`: the old
//!    replica's clients all come back at once) and once with `gradual`
//!    (each connection told at its own moment over the lame-duck period),
//!    same seed. Each replica's `connections_accepted_total`, read every
//!    100 ms, gives the reconnect rate; the clients give latency.
//! 2. The scale-up ([`scaleup`]): R − 1 replicas, one added under steady
//!    traffic. Keep-alive clients behind an L4 balancer never see it unless
//!    the servers rotate their connections: once without
//!    `--max-connection-age`, once with it. Each replica's redirect counter
//!    gives its share of the requests per second.
//!
//! Every redirect answered must be a hit stored, and no request may fail.

mod charts;
mod clients;
mod fleet;
pub mod scaleup;
mod scrape;
pub mod series;
pub mod storm;
pub mod summary;
mod svg;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::ValueEnum;
use serde::Serialize;
use tempfile::TempDir;

use crate::binaries::Binaries;
use crate::fleet::seed::{self, Links};
use crate::fleet::Database;
use crate::haproxy::Checks;
use crate::machine::Machine;
use crate::scenario::{Common, Scenario};
use crate::tls;
use crate::SERVICE;
use fleet::Fleet;

pub use scaleup::ScaleUpResult;
pub use storm::StormResult;

/// Every replica's `--shutdown-timeout`.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(20);

/// Added to a replica's own shutdown budget before the harness kills it.
const EXIT_SLACK: Duration = Duration::from_secs(15);

/// How the lame duck tells its connections to close (`--drain-spread`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Spread {
    /// Every answer of the lame-duck period says `Connection: close`.
    Immediate,
    /// Each connection is told at its own moment, spread uniformly over
    /// the lame-duck period.
    Gradual,
}

impl Spread {
    /// The flag's value.
    pub fn arg(self) -> &'static str {
        match self {
            Spread::Immediate => "immediate",
            Spread::Gradual => "gradual",
        }
    }
}

/// The two parts of the scenario.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Part {
    /// Replacing every replica, immediate against gradual drain.
    Storm,
    /// Adding a replica, without and with a maximum connection age.
    ScaleUp,
}

/// Options of `load rotation`.
#[derive(Clone, Debug, clap::Args, Serialize)]
pub struct Options {
    /// Replicas serving (R ≥ 2): the storm replaces each once; the
    /// scale-up starts with R − 1 and adds one.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(2..=6))]
    pub replicas: u16,
    /// Keep-alive HTTPS clients of the storm.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=5000))]
    pub clients: u32,
    /// Requests per second of the storm, all its clients together.
    #[arg(long, default_value_t = 4000, value_parser = clap::value_parser!(u32).range(1..=20_000))]
    pub rate: u32,
    /// The replicas' lame-duck period (`--drain-delay`); must outlast the
    /// balancer's lag.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    #[serde(with = "crate::report::millis")]
    pub drain_delay: Duration,
    /// The storm's `--drain-spread`s, in this order.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [Spread::Immediate, Spread::Gradual])]
    pub spreads: Vec<Spread>,
    /// Storm rounds: each runs every spread, every other round in the
    /// reverse order.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=10))]
    pub rounds: u16,
    /// Keep-alive HTTPS clients of the scale-up.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(1..=5000))]
    pub scaleup_clients: u32,
    /// Requests per second of the scale-up, all its clients together.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=20_000))]
    pub scaleup_rate: u32,
    /// The scale-up's second run's `--max-connection-age` (its first runs
    /// without); the new replica is watched for twice as long.
    #[arg(long, default_value = "20s", value_parser = humantime::parse_duration)]
    #[serde(with = "crate::report::millis")]
    pub max_connection_age: Duration,
    /// Steady traffic before the first change and after the last.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    #[serde(with = "crate::report::millis")]
    pub steady: Duration,
    /// Links created before the traffic starts; redirects pick among them.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub links: u32,
    /// Seed of the clients' choices of link.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// A request without a whole answer this long after it was due (its
    /// connect and handshake included) is a timeout.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    #[serde(with = "crate::report::millis")]
    pub timeout: Duration,
    /// The balancer's health checks (of `/readyz` on the admin port).
    #[command(flatten)]
    pub checks: Checks,
    /// The parts to run.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [Part::Storm, Part::ScaleUp])]
    pub parts: Vec<Part>,
    /// Short correctness run: 100 storm clients at 400 req/s, 40 scale-up
    /// clients at 200 req/s, a 1.5 s lame duck, a 2 s age, 1.5 s of steady
    /// traffic, checks every 200 ms; implies --check, of the correctness
    /// targets only. Overrides those options.
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
            self.clients = 100;
            self.rate = 400;
            self.scaleup_clients = 40;
            self.scaleup_rate = 200;
            self.drain_delay = Duration::from_millis(1500);
            self.max_connection_age = Duration::from_secs(2);
            self.steady = Duration::from_millis(1500);
            self.links = 50;
            self.rounds = 1;
            self.checks.inter = Duration::from_millis(200);
            self.common.check = true;
        }
        self
    }

    /// Every storm run, in order: `(round, spread)`, from round 1.
    pub fn storm_runs(&self) -> Vec<(u16, Spread)> {
        let mut runs = Vec::new();
        for round in 1..=self.rounds {
            let mut spreads = self.spreads.clone();
            if round % 2 == 0 {
                spreads.reverse();
            }
            runs.extend(spreads.into_iter().map(|spread| (round, spread)));
        }
        runs
    }

    /// How long a replica may take from SIGTERM to its exit.
    fn exit_bound(&self) -> Duration {
        self.drain_delay + SHUTDOWN_TIMEOUT + EXIT_SLACK
    }

    /// A quarter of the steady period and at most a second: the pause
    /// after a replica's exit before the next change, and the stretch
    /// after it that still counts as its window.
    fn tail(&self) -> Duration {
        (self.steady / 4).min(Duration::from_secs(1))
    }
}

/// Everything a `load rotation` run measured.
#[derive(Clone, Debug, Serialize)]
pub struct RotationReport {
    /// Where and how.
    pub machine: Machine,
    /// The options after `--smoke`.
    pub options: Options,
    /// The storm's runs, in run order.
    pub storm: Vec<StormResult>,
    /// The scale-up's runs: without an age, then with one.
    pub scale_up: Vec<ScaleUpResult>,
}

/// What every run shares: the options, the server, its certificate, the
/// database.
struct Rig<'a> {
    options: &'a Options,
    program: PathBuf,
    certificates: tls::Certificates,
    database: &'a Database,
    out: &'a Path,
}

impl Rig<'_> {
    /// A scratch folder for a run's balancer and data, and its log folder
    /// under the output folder.
    fn dirs(&self, slug: &str) -> anyhow::Result<(TempDir, PathBuf)> {
        let logs = self.out.join(slug).join("logs");
        std::fs::create_dir_all(&logs)
            .with_context(|| format!("cannot create {}", logs.display()))?;
        let scratch = tempfile::Builder::new()
            .prefix(&format!("{SERVICE}-rotation-"))
            .tempdir()?;
        Ok((scratch, logs))
    }

    /// A client that verifies the run's chain, offers HTTP/1.1 and never
    /// resumes a session: every reconnection is a full handshake.
    fn tls_client(&self) -> anyhow::Result<tls::Client> {
        self.certificates.client(&[b"http/1.1"], false)
    }

    /// Starts `replicas` replicas with the common arguments and `extra`
    /// behind a new L4 balancer (logs under `slug`), and seeds fresh links
    /// through the first. The scratch folder holds the replicas' data: keep
    /// it until they have exited.
    ///
    /// # Errors
    /// If a replica or the balancer does not start, or seeding fails.
    async fn start_fleet(
        &self,
        slug: &str,
        extra: &[String],
        replicas: u16,
    ) -> anyhow::Result<(Fleet, TempDir, Arc<[String]>)> {
        let (scratch, logs) = self.dirs(slug)?;
        let data = scratch.path().join("data");
        let url = self.database.url();
        let spec = fleet::spec(&self.program, &self.certificates, &data, &url, extra);
        let o = self.options;
        let mut fleet = Fleet::start(o.checks, spec, o.seed, scratch.path(), &logs).await?;
        for _ in 0..replicas {
            fleet.add().await?;
        }
        let first = fleet.first_addr()?;
        let codes = self.fresh_links(first).await?;
        Ok((fleet, scratch, codes))
    }

    /// Empties the links table and seeds `links` links through `addr`.
    async fn fresh_links(&self, addr: SocketAddr) -> anyhow::Result<Arc<[String]>> {
        self.database.empty_links().await?;
        let client = self.tls_client()?;
        let links = Links {
            prefix: "seed",
            count: self.options.links,
            seed: self.options.seed,
        };
        seed::create(links, || client.connect(addr)).await
    }

    /// `SUM(links.hits)`, once every replica has exited.
    async fn hits_stored(&self) -> anyhow::Result<i64> {
        self.database.hits_stored().await
    }
}

/// Runs the parts of `options`.
///
/// # Errors
/// If a tool is missing or a step of the harness fails (a replica that
/// does not start, a balancer that does not take it); failed requests and
/// lost hits are results, not errors.
pub async fn run(
    options: Options,
    binaries: &Binaries,
    machine: Machine,
    out: &Path,
) -> anyhow::Result<RotationReport> {
    std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    if options.drain_delay <= options.checks.worst_lag() {
        eprintln!(
            "load: warning: --drain-delay {:?} does not outlast the balancer's worst lag {:?}: \
             expect refused connections",
            options.drain_delay,
            options.checks.worst_lag()
        );
    }
    let database = Database::start(Duration::from_secs(10)).await?;
    let result = run_parts(&options, binaries, &database, out).await;
    database.stop().await;
    let (storm, scale_up) = result?;
    Ok(RotationReport {
        machine,
        options,
        storm,
        scale_up,
    })
}

async fn run_parts(
    options: &Options,
    binaries: &Binaries,
    database: &Database,
    out: &Path,
) -> anyhow::Result<(Vec<StormResult>, Vec<ScaleUpResult>)> {
    // The replicas read the chain and its key from here for the whole run.
    let tls_dir = tempfile::Builder::new()
        .prefix(&format!("{SERVICE}-rotation-tls-"))
        .tempdir()?;
    let certificates = tls::Certificates::make(tls_dir.path())?;
    let rig = Rig {
        options,
        program: binaries.service.clone(),
        certificates,
        database,
        out,
    };
    let mut storm = Vec::new();
    if options.parts.contains(&Part::Storm) {
        for (round, spread) in options.storm_runs() {
            storm.push(storm::run(&rig, spread, round).await?);
        }
    }
    let mut scale_up = Vec::new();
    if options.parts.contains(&Part::ScaleUp) {
        for age in [None, Some(options.max_connection_age)] {
            scale_up.push(scaleup::run(&rig, age).await?);
        }
    }
    drop(tls_dir);
    Ok((storm, scale_up))
}

impl Scenario for Options {
    const NAME: &'static str = "rotation";
    const PASSED: &'static str = "no failed request, every hit stored, a gradual drain's \
                                  storm within its bound, the new replica served once connections age";
    type Report = RotationReport;

    fn common(&self) -> &Common {
        &self.common
    }

    async fn run(
        self,
        binaries: &Binaries,
        machine: Machine,
        out: &Path,
    ) -> anyhow::Result<RotationReport> {
        run(self, binaries, machine, out).await
    }

    fn write(report: &RotationReport, out: &Path) -> anyhow::Result<()> {
        summary::write(report, out)
    }

    fn summary(report: &RotationReport) -> String {
        summary::summary(report)
    }

    fn verdict(report: &RotationReport) -> Result<(), String> {
        summary::verdict(report)
    }
}
