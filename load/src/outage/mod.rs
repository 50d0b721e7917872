//! Scenario 3, the database misbehaving behind a load balancer: R replicas
//! on one PostgreSQL behind HAProxy, which health-checks `/readyz` on each
//! replica's admin port every 500 ms (out after 2 failures, in after 1),
//! as a Kubernetes readiness probe feeds a Service. Open-loop mixed traffic
//! at a fixed rate — redirects of links every replica has served, link
//! creations, link reads — runs through the balancer while the database is
//! disturbed, one phase at a time ([`Phase`]): stopped, locked, restarted,
//! and cut off from one replica only.
//!
//! Every request's fate is counted per phase, with the replica that
//! answered (the balancer names it in `x-served-by`); every replica's
//! `/readyz` is read every 100 ms on its admin port ([`monitor`]). Between
//! phases the traffic pauses until every replica has flushed its pending
//! hits, so each phase's hits answered can be held against the hits
//! stored. The same phases run once per flavor: lameduck as it is, and
//! lameduck with `--readiness-follows-database`, the behaviour before
//! readiness stopped following the database.
//!
//! Each replica reaches PostgreSQL through a relay of its own
//! ([`Relay`]): phase (d) stops the last replica's.

pub mod monitor;
pub mod phase;
pub mod summary;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::ValueEnum;
use lameduck_testkit::relay::Relay;
use serde::Serialize;
use tokio::time::Instant;

use crate::binaries::Binaries;
use crate::fleet::seed::{self, Links};
use crate::fleet::{self, phases, Fleet, Probe, Steady, Traffic};
use crate::haproxy::{Checks, Haproxy};
use crate::machine::Machine;
use crate::raw::{self, RawConn};
use crate::replica::{Ended, Spec};
use crate::report::{self, Latency};
use crate::scenario::{Common, Scenario};
use crate::traffic::Mix;
use crate::{metric, SERVICE};
use phase::{Phase, PhaseResult};

/// How long the replicas may take, after a phase, to flush every pending
/// hit once the database answers.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(60);

/// How long a replica may take to exit after SIGTERM at the end.
const EXIT_TIMEOUT: Duration = Duration::from_secs(60);

/// Which readiness the replicas run with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Flavor {
    /// lameduck as it is: readiness about the process only.
    Lameduck,
    /// lameduck with `--readiness-follows-database`: `/readyz` turns 503
    /// while the database is down, as it did before.
    FollowsDatabase,
}

impl Flavor {
    fn slug(self) -> &'static str {
        match self {
            Flavor::Lameduck => SERVICE,
            Flavor::FollowsDatabase => "follows-database",
        }
    }

    /// Its label in tables.
    pub fn label(self) -> String {
        match self {
            Flavor::Lameduck => SERVICE.to_owned(),
            Flavor::FollowsDatabase => format!("{SERVICE} --readiness-follows-database"),
        }
    }
}

/// Options of `load outage`.
#[derive(Clone, Debug, clap::Args, Serialize)]
pub struct Options {
    /// Replicas behind the balancer; phase (d) cuts off the last one.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(2..=8))]
    pub replicas: u16,
    /// Requests per second, constant, in every phase.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(1..=5_000))]
    pub rate: u32,
    /// Seed of the traffic's choices (phase n uses seed + n).
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Links every replica serves before the phases (so each has them
    /// cached); redirects and reads pick among them.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub links: u32,
    /// Share of requests over HTTP/2 (prior knowledge); the rest HTTP/1.1.
    #[arg(long, default_value_t = 0.5)]
    pub h2_share: f64,
    /// Share of requests creating links.
    #[arg(long, default_value_t = 0.1)]
    pub create_share: f64,
    /// Share of requests reading a link; the rest redirect.
    #[arg(long, default_value_t = 0.1)]
    pub read_share: f64,
    /// Traffic before and after each disturbance.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    #[serde(with = "crate::report::millis")]
    pub steady: Duration,
    /// How long PostgreSQL stays stopped in phase (a).
    #[arg(long, default_value = "15s", value_parser = humantime::parse_duration)]
    #[serde(with = "crate::report::millis")]
    pub stopped: Duration,
    /// How long `links` stays locked in phase (b).
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    #[serde(with = "crate::report::millis")]
    pub locked: Duration,
    /// How long the last replica stays cut off in phase (d).
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    #[serde(with = "crate::report::millis")]
    pub cut_off: Duration,
    /// The phases, in this order.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = Phase::ALL)]
    pub phases: Vec<Phase>,
    /// The replicas' `--request-timeout`.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    #[serde(with = "crate::report::millis")]
    pub request_timeout: Duration,
    /// A request without a complete answer after this long counts as a
    /// timeout: longer than the replicas' request timeout, so a request
    /// that hangs until it shows as slow, not as the client's impatience.
    #[arg(long, default_value = "35s", value_parser = humantime::parse_duration)]
    #[serde(with = "crate::report::millis")]
    pub timeout: Duration,
    /// The balancer's health checks.
    #[command(flatten)]
    pub checks: Checks,
    /// The flavors to run, in this order.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_values_t = [Flavor::Lameduck, Flavor::FollowsDatabase]
    )]
    pub flavors: Vec<Flavor>,
    /// Short correctness run: lameduck only, 100 req/s, 2 s of steady
    /// traffic around disturbances of 4 s; implies --check. Overrides those
    /// options.
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
            self.rate = 100;
            self.steady = Duration::from_secs(2);
            self.stopped = Duration::from_secs(4);
            self.locked = Duration::from_secs(4);
            self.cut_off = Duration::from_secs(4);
            self.flavors = vec![Flavor::Lameduck];
            self.common.check = true;
        }
        self
    }

    fn mix(&self, phase_index: u64) -> Mix {
        Mix {
            rate: self.rate,
            seed: self.seed + phase_index,
            h2_share: self.h2_share,
            create_share: self.create_share,
            read_share: self.read_share,
            timeout: self.timeout,
            // Far more than any phase takes; only a harness bug reaches it.
            max_duration: Duration::from_secs(600),
        }
    }
}

/// One flavor's run: every phase, then how the replicas exited and what
/// the database holds.
#[derive(Clone, Debug, Serialize)]
pub struct FlavorResult {
    /// Which.
    pub flavor: Flavor,
    /// Its label in tables.
    pub label: String,
    /// Redirects the replicas answered while their caches were filled,
    /// before the phases (hits too).
    pub warm_redirects: u64,
    /// Every phase, in order.
    pub phases: Vec<PhaseResult>,
    /// Creations and reads answered 503 behind an open breaker, over every
    /// phase: what the fail-fast target is held against.
    pub failed_fast: Latency,
    /// How the replicas exited at the end (SIGTERM, no traffic).
    pub exits: Vec<Ended>,
    /// Redirects answered 307 in all, warming up included.
    pub redirects_answered: u64,
    /// `SUM(links.hits)` after every replica exited.
    pub hits_stored: i64,
    /// Creations answered 201 in all.
    pub links_answered: u64,
    /// Creations answered unconfirmed in all (each may have been stored).
    pub links_unconfirmed: u64,
    /// Links in the database after the run, less the seeded ones.
    pub links_stored: i64,
}

impl FlavorResult {
    /// Hits answered but not stored, over the whole run.
    pub fn hits_lost(&self) -> i64 {
        i64::try_from(self.redirects_answered).unwrap_or(i64::MAX) - self.hits_stored
    }

    /// Links answered but not stored, over the whole run.
    pub fn links_lost(&self) -> i64 {
        i64::try_from(self.links_answered).unwrap_or(i64::MAX) - self.links_stored
    }

    /// Links stored that neither a 201 nor an unconfirmed 503 announced,
    /// over the whole run.
    pub fn links_unannounced(&self) -> i64 {
        phase::unannounced(
            self.links_stored,
            self.links_answered,
            self.links_unconfirmed,
        )
    }
}

/// Everything a `load outage` run measured.
#[derive(Clone, Debug, Serialize)]
pub struct OutageReport {
    /// Where and how.
    pub machine: Machine,
    /// The options after `--smoke`.
    pub options: Options,
    /// One per flavor, in run order.
    pub results: Vec<FlavorResult>,
}

/// Runs every flavor of `options`.
///
/// # Errors
/// If a tool is missing or a step of the harness itself fails (a replica
/// that does not start, PostgreSQL that does not stop); failed requests are
/// results, not errors.
pub async fn run(
    options: Options,
    binaries: &Binaries,
    machine: Machine,
    out: &Path,
) -> anyhow::Result<OutageReport> {
    std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    // The harness's own calls wait out a stopped or locked database.
    let database = fleet::Database::start(Duration::from_secs(30)).await?;
    let result = run_flavors(&options, binaries, &database, out).await;
    database.stop().await;
    Ok(OutageReport {
        machine,
        results: result?,
        options,
    })
}

async fn run_flavors(
    options: &Options,
    binaries: &Binaries,
    database: &fleet::Database,
    out: &Path,
) -> anyhow::Result<Vec<FlavorResult>> {
    let mut results = Vec::new();
    for flavor in &options.flavors {
        eprintln!(
            "load: {} — {} replicas, {} req/s, phases {:?}",
            flavor.label(),
            options.replicas,
            options.rate,
            options.phases
        );
        let result = run_flavor(*flavor, options, binaries, database, out).await?;
        eprintln!(
            "load: {}: hits answered {} / stored {}, links answered {}",
            result.label,
            result.redirects_answered,
            result.hits_stored,
            summary::links(
                result.links_answered,
                result.links_unconfirmed,
                result.links_stored
            )
        );
        results.push(result);
    }
    Ok(results)
}

/// Replica `index`'s arguments (from 0): its own data directory, the
/// database through its own relay, and the flavor's readiness.
fn spec(flavor: Flavor, options: &Options, binaries: &Binaries, url: &str, data: &Path) -> Spec {
    let mut args: Vec<std::ffi::OsString> = [
        "server",
        "--listen",
        "127.0.0.1:0",
        "--log-format",
        "text",
        "--request-timeout",
        &humantime::format_duration(options.request_timeout).to_string(),
        "--data-dir",
    ]
    .iter()
    .map(Into::into)
    .collect();
    args.push(data.into());
    if flavor == Flavor::FollowsDatabase {
        args.push("--readiness-follows-database".into());
    }
    Spec {
        program: binaries.service.clone(),
        args,
        env: vec![("DATABASE_URL".to_owned(), url.to_owned())],
        cpus: None,
    }
}

/// One flavor: R replicas behind a fresh balancer, each reaching
/// PostgreSQL through its relay; links seeded and served by every replica;
/// then every phase, and the final stop.
async fn run_flavor(
    flavor: Flavor,
    options: &Options,
    binaries: &Binaries,
    database: &fleet::Database,
    out: &Path,
) -> anyhow::Result<FlavorResult> {
    let logs = out.join(flavor.slug()).join("logs");
    std::fs::create_dir_all(&logs)?;
    let scratch = tempfile::Builder::new()
        .prefix(&format!("{SERVICE}-outage-"))
        .tempdir()?;
    let replicas = usize::from(options.replicas);
    let lb = Haproxy::start(
        options.checks,
        replicas,
        scratch.path(),
        &logs.join("haproxy.log"),
    )
    .await?;
    let mut fleet = Fleet::new(lb, Probe::Admin, &logs);
    let cluster = database.cluster();
    let upstream = SocketAddr::from(([127, 0, 0, 1], cluster.port()));
    let direct = format!(":{}/", cluster.port());
    let mut relays = Vec::new();
    for index in 1..=replicas {
        let relay = Relay::start(upstream)
            .await
            .context("cannot bind a relay")?;
        let url = cluster
            .url()
            .replace(&direct, &format!(":{}/", relay.addr.port()));
        let data = scratch.path().join(format!("data-r{index}"));
        fleet
            .add(&spec(flavor, options, binaries, &url, &data))
            .await?;
        relays.push(relay);
    }
    database.empty_links().await?;
    let addr = fleet.first_addr()?;
    let links = Links {
        prefix: "outage",
        count: options.links,
        seed: options.seed,
    };
    let codes = seed::create(links, || RawConn::connect(addr)).await?;
    let mut warm_redirects = 0;
    for member in fleet.members() {
        warm_redirects += warm(member.process.addr, &codes).await?;
    }
    let stage = Stage {
        fleet: &fleet,
        database: phase::Database {
            cluster,
            pool: database.pool(),
            relays: &relays,
        },
        admins: fleet
            .members()
            .map(|m| m.admin.context("checked on the admin port"))
            .collect::<anyhow::Result<_>>()?,
        slots: fleet.members().map(|m| m.slot).collect(),
        options,
        codes,
    };
    let phases = stage.run_all(database).await?;
    let exits = fleet.stop(EXIT_TIMEOUT).await?.exits;
    let (hits_stored, links) = stored(database).await?;
    Ok(FlavorResult::of(
        flavor,
        phases,
        exits,
        warm_redirects,
        (hits_stored, links - i64::from(options.links)),
    ))
}

impl FlavorResult {
    /// Sums up a flavor's run: its phases, the redirects that warmed the
    /// caches, the exits, and what the database holds at the end.
    fn of(
        flavor: Flavor,
        phases: Vec<PhaseResult>,
        exits: Vec<Ended>,
        warm_redirects: u64,
        (hits_stored, links_stored): (i64, i64),
    ) -> FlavorResult {
        let redirects_answered =
            warm_redirects + phases.iter().map(|p| p.redirects_answered).sum::<u64>();
        let links_answered = phases.iter().map(|p| p.links_answered).sum();
        let links_unconfirmed = phases.iter().map(|p| p.links_unconfirmed).sum();
        let mut failed_fast = report::histogram();
        for us in phases.iter().flat_map(|p| &p.failed_fast_us) {
            report::record(&mut failed_fast, Duration::from_micros(*us));
        }
        FlavorResult {
            flavor,
            label: flavor.label(),
            warm_redirects,
            failed_fast: Latency::of(&failed_fast),
            phases,
            exits,
            redirects_answered,
            hits_stored,
            links_answered,
            links_unconfirmed,
            links_stored,
        }
    }
}

/// What every phase of a flavor's run works with.
struct Stage<'a> {
    fleet: &'a Fleet,
    database: phase::Database<'a>,
    admins: Vec<SocketAddr>,
    slots: Vec<usize>,
    options: &'a Options,
    codes: Arc<[String]>,
}

impl Stage<'_> {
    /// Every phase in turn, each held against what the database gained
    /// over it, once the replicas have flushed.
    async fn run_all(&self, database: &fleet::Database) -> anyhow::Result<Vec<PhaseResult>> {
        settle(&self.admins).await?;
        let mut before = stored(database).await?;
        let mut results = Vec::new();
        for (index, phase) in self.options.phases.iter().enumerate() {
            let (result, now) = self.run(index as u64, *phase, before, database).await?;
            before = now;
            results.push(result);
        }
        Ok(results)
    }

    /// One phase: traffic with its own seed, steady, the disturbance,
    /// steady, while every replica's readiness and the balancer are
    /// watched; then the replicas settle and the database is read.
    async fn run(
        &self,
        index: u64,
        phase: Phase,
        before: (i64, i64),
        database: &fleet::Database,
    ) -> anyhow::Result<(PhaseResult, (i64, i64))> {
        let options = self.options;
        eprintln!("load:   {}", phase.label(options));
        let traffic = Traffic::start(
            options.mix(index),
            self.fleet.targets(),
            Arc::clone(&self.codes),
        );
        let origin = traffic.origin;
        let stopped = traffic.stopped();
        let disturbing = phase::disturb(phase, &self.database, options, origin);
        let (timeline, outcome) = tokio::join!(
            monitor::watch(&self.admins, self.fleet.lb(), &self.slots, origin, stopped),
            phases(traffic, Steady::around(options.steady), disturbing)
        );
        let (disturbance, ran) = outcome?;
        settle(&self.admins).await?;
        let now = stored(database).await?;
        let result = PhaseResult::of(
            phase::Observed {
                phase,
                options,
                ran: &ran,
                timeline,
                disturbance,
            },
            (now.0 - before.0, now.1 - before.1),
        );
        eprintln!(
            "load:     redirects {} failed / {}, creations {} failed / {}, reads {} failed / {}; hits answered {} / stored {}",
            result.redirects.failed(),
            result.redirects.total(),
            result.creations.failed(),
            result.creations.total(),
            result.reads.failed(),
            result.reads.total(),
            result.redirects_answered,
            result.hits_stored
        );
        Ok((result, now))
    }
}

/// Redirects every code once through `addr`, so that replica has them
/// cached; returns how many it answered 307 (all, or an error).
async fn warm(addr: SocketAddr, codes: &[String]) -> anyhow::Result<u64> {
    let mut conn = RawConn::connect(addr).await?;
    for code in codes {
        let head = conn.exchange(&raw::get(&format!("/{code}"))).await?;
        if head.status != 307 {
            bail!("redirecting {code} through {addr} answered {}", head.status);
        }
        if head.close {
            conn = RawConn::connect(addr).await?;
        }
    }
    Ok(codes.len() as u64)
}

/// Waits until no replica holds a pending hit or a request in flight.
async fn settle(admins: &[SocketAddr]) -> anyhow::Result<()> {
    let deadline = Instant::now() + SETTLE_TIMEOUT;
    for admin in admins {
        loop {
            let metrics = raw::RawConn::connect(*admin)
                .await?
                .exchange_body(&raw::get_close("/metrics"))
                .await?
                .1;
            let text = String::from_utf8_lossy(&metrics);
            let value = |name: &str| {
                text.lines()
                    .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
                    .and_then(|value| value.trim().parse::<f64>().ok())
            };
            let pending = value(&metric("hits_pending"));
            let in_flight = value(&metric("requests_in_flight"));
            if pending == Some(0.0) && in_flight == Some(0.0) {
                break;
            }
            if Instant::now() > deadline {
                bail!(
                    "{admin}: {pending:?} hits pending and {in_flight:?} requests in flight after {SETTLE_TIMEOUT:?}"
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    Ok(())
}

/// `SUM(links.hits)` and the number of links.
async fn stored(database: &fleet::Database) -> anyhow::Result<(i64, i64)> {
    Ok((database.hits_stored().await?, database.links().await?))
}

impl Scenario for Options {
    const NAME: &'static str = "outage";
    const PASSED: &'static str = "no failed redirect, failing fast behind an open breaker, \
                                  every replica ready throughout, no lost hit";
    type Report = OutageReport;

    fn common(&self) -> &Common {
        &self.common
    }

    async fn run(
        self,
        binaries: &Binaries,
        machine: Machine,
        out: &Path,
    ) -> anyhow::Result<OutageReport> {
        run(self, binaries, machine, out).await
    }

    fn write(report: &OutageReport, out: &Path) -> anyhow::Result<()> {
        summary::write(report, out)
    }

    fn summary(report: &OutageReport) -> String {
        summary::summary(report)
    }

    fn verdict(report: &OutageReport) -> Result<(), String> {
        summary::verdict(report)
    }
}
