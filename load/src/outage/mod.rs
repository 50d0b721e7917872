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
//! ([`relay`]): phase (d) stops the last replica's.

pub mod monitor;
pub mod phase;
pub mod relay;
pub mod summary;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::ValueEnum;
use nix::sys::signal::Signal;
use serde::Serialize;
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::binaries::Binaries;
use crate::haproxy::{self, Checks, Haproxy};
use crate::machine::Machine;
use crate::postgres::PgCluster;
use crate::raw::{self, RawConn};
use crate::replica::{Ended, Replica, Spec};
use crate::report::{self, Latency};
use crate::traffic::{self, Mix, Targets};
use crate::{metric, SERVICE};
use phase::{Database, Phase, PhaseResult};
use relay::Relay;

/// How long a replica may take to become ready.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// How long the balancer may take to see a ready replica as UP.
const LB_UP_TIMEOUT: Duration = Duration::from_secs(10);

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
    /// Exit non-zero unless lameduck meets every target ([`summary::verdict`]).
    #[arg(long)]
    pub check: bool,
    /// Output folder (default: load/out/<timestamp>-outage).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Use the binaries in this folder instead of building them.
    #[arg(long)]
    #[serde(skip)]
    pub bin_dir: Option<PathBuf>,
    /// Do not run scripts/install-test-deps.sh postgres haproxy first.
    #[arg(long)]
    #[serde(skip)]
    pub no_install: bool,
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
            self.check = true;
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
    eprintln!("load: starting a throwaway PostgreSQL");
    let cluster = Arc::new(
        tokio::task::spawn_blocking(PgCluster::start)
            .await
            .context("the PostgreSQL cluster failed to start")?,
    );
    let result = run_flavors(&options, binaries, &cluster, out).await;
    tokio::task::spawn_blocking(move || drop(cluster))
        .await
        .ok();
    Ok(OutageReport {
        machine,
        results: result?,
        options,
    })
}

async fn run_flavors(
    options: &Options,
    binaries: &Binaries,
    cluster: &Arc<PgCluster>,
    out: &Path,
) -> anyhow::Result<Vec<FlavorResult>> {
    let pool = PgPoolOptions::new()
        .max_connections(2)
        .acquire_timeout(Duration::from_secs(30))
        .connect(&cluster.url())
        .await
        .context("cannot connect to the throwaway PostgreSQL")?;
    let mut results = Vec::new();
    for flavor in &options.flavors {
        eprintln!(
            "load: {} — {} replicas, {} req/s, phases {:?}",
            flavor.label(),
            options.replicas,
            options.rate,
            options.phases
        );
        let result = run_flavor(*flavor, options, binaries, cluster, &pool, out).await?;
        eprintln!(
            "load: {}: hits answered {} / stored {}, links answered {} / stored {}",
            result.label,
            result.redirects_answered,
            result.hits_stored,
            result.links_answered,
            result.links_stored
        );
        results.push(result);
    }
    pool.close().await;
    Ok(results)
}

/// The replicas of one flavor's run, behind their balancer.
struct Fleet {
    replicas: Vec<Replica>,
    admins: Vec<SocketAddr>,
    slots: Vec<usize>,
}

async fn run_flavor(
    flavor: Flavor,
    options: &Options,
    binaries: &Binaries,
    cluster: &Arc<PgCluster>,
    pool: &PgPool,
    out: &Path,
) -> anyhow::Result<FlavorResult> {
    let logs = out.join(flavor.slug()).join("logs");
    std::fs::create_dir_all(&logs)?;
    let scratch = tempfile::Builder::new()
        .prefix(&format!("{SERVICE}-outage-"))
        .tempdir()?;
    let checks = options.checks;
    let lb = Haproxy::start(
        checks,
        usize::from(options.replicas),
        scratch.path(),
        &logs.join("haproxy.log"),
    )
    .await?;
    let upstream = SocketAddr::from(([127, 0, 0, 1], cluster.port()));
    let mut relays = Vec::new();
    for _ in 0..options.replicas {
        relays.push(Relay::start(upstream).await?);
    }
    let mut fleet = start_fleet(
        flavor,
        options,
        binaries,
        cluster,
        &relays,
        &lb,
        &logs,
        scratch.path(),
    )
    .await?;

    sqlx::query("TRUNCATE links, link_audit")
        .execute(pool)
        .await
        .context("cannot empty the links table")?;
    let codes = seed_links(fleet.replicas[0].addr, options.links, options.seed).await?;
    let mut warm_redirects = 0;
    for replica in &fleet.replicas {
        warm_redirects += warm(replica.addr, &codes).await?;
    }
    settle(&fleet.admins).await?;
    let mut before = stored(pool).await?;

    let database = Database {
        cluster,
        pool,
        relays: &relays,
    };
    let targets = Targets {
        http1: lb.http1,
        http2: lb.http2,
    };
    let mut phases = Vec::new();
    for (index, phase) in options.phases.iter().enumerate() {
        eprintln!("load:   {}", phase.label(options));
        let (stop, stopped) = watch::channel(false);
        let origin = Instant::now();
        let traffic = tokio::spawn(traffic::run(
            options.mix(index as u64),
            targets,
            Arc::clone(&codes),
            origin,
            stopped.clone(),
        ));
        let script = async {
            tokio::time::sleep(options.steady).await;
            let disturbance = phase::disturb(*phase, &database, options, origin).await;
            if disturbance.is_ok() {
                tokio::time::sleep(options.steady).await;
            }
            let _ = stop.send(true);
            disturbance
        };
        let (timeline, disturbance) = tokio::join!(
            monitor::watch(&fleet.admins, &lb, &fleet.slots, origin, stopped),
            script
        );
        let records = traffic.await.context("the traffic task failed")?;
        let disturbance = disturbance?;
        let traffic_s = origin.elapsed().as_secs_f64();
        settle(&fleet.admins).await?;
        let now = stored(pool).await?;
        let result = PhaseResult::of(
            *phase,
            options,
            &records,
            timeline,
            disturbance,
            traffic_s,
            (now.0 - before.0, now.1 - before.1),
        );
        before = now;
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
        phases.push(result);
    }

    let sigterm = Instant::now();
    for replica in &fleet.replicas {
        replica.signal(Signal::SIGTERM)?;
    }
    let mut exits = Vec::new();
    for replica in &mut fleet.replicas {
        exits.push(replica.wait_exit(sigterm, EXIT_TIMEOUT).await);
    }
    lb.stop().await;
    let (hits_stored, links) = stored(pool).await?;
    let redirects_answered =
        warm_redirects + phases.iter().map(|p| p.redirects_answered).sum::<u64>();
    let links_answered = phases.iter().map(|p| p.links_answered).sum();
    let mut failed_fast = report::histogram();
    for us in phases.iter().flat_map(|p| &p.failed_fast_us) {
        report::record(&mut failed_fast, Duration::from_micros(*us));
    }
    Ok(FlavorResult {
        flavor,
        label: flavor.label(),
        warm_redirects,
        failed_fast: Latency::of(&failed_fast),
        phases,
        exits,
        redirects_answered,
        hits_stored,
        links_answered,
        links_stored: links - i64::from(options.links),
    })
}

/// Starts the replicas, each reaching PostgreSQL through its relay, and
/// puts each into the balancer's slot of its number, health-checked on its
/// admin port.
#[allow(clippy::too_many_arguments)]
async fn start_fleet(
    flavor: Flavor,
    options: &Options,
    binaries: &Binaries,
    cluster: &PgCluster,
    relays: &[Relay],
    lb: &Haproxy,
    logs: &Path,
    scratch: &Path,
) -> anyhow::Result<Fleet> {
    let mut fleet = Fleet {
        replicas: Vec::new(),
        admins: Vec::new(),
        slots: Vec::new(),
    };
    let direct = format!(":{}/", cluster.port());
    for (index, relay) in relays.iter().enumerate() {
        let name = format!("r{}", index + 1);
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
        args.push(scratch.join(format!("data-{name}")).into_os_string());
        if flavor == Flavor::FollowsDatabase {
            args.push("--readiness-follows-database".into());
        }
        let url = cluster
            .url()
            .replace(&direct, &format!(":{}/", relay.addr.port()));
        let spec = Spec {
            program: binaries.service.clone(),
            args,
            env: vec![("DATABASE_URL".to_owned(), url)],
            cpus: None,
        };
        let replica = Replica::spawn(&name, &spec, &logs.join(format!("{name}.log"))).await?;
        let admin = replica.admin_addr().await?;
        replica
            .wait_ready_at(admin, "/readyz", READY_TIMEOUT)
            .await?;
        let slot = index + 1;
        lb.enable_checked_at(slot, replica.addr, admin.port())
            .await?;
        lb.wait_status(slot, "up", haproxy::is_up, LB_UP_TIMEOUT)
            .await?;
        fleet.replicas.push(replica);
        fleet.admins.push(admin);
        fleet.slots.push(slot);
    }
    Ok(fleet)
}

/// Creates `count` links through `addr`; returns their codes.
async fn seed_links(addr: SocketAddr, count: u32, seed: u64) -> anyhow::Result<Arc<[String]>> {
    let mut conn = RawConn::connect(addr).await?;
    let mut codes = Vec::new();
    for n in 0..count {
        let code = format!("outage-{n}");
        let body = format!(r#"{{"url":"https://example.com/outage/{seed}/{n}","code":"{code}"}}"#);
        let head = conn.exchange(&raw::post_json("/api/links", &body)).await?;
        if head.status != 201 {
            bail!("creating link {code} answered {}", head.status);
        }
        if head.close {
            conn = RawConn::connect(addr).await?;
        }
        codes.push(code);
    }
    Ok(codes.into())
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
async fn stored(pool: &PgPool) -> anyhow::Result<(i64, i64)> {
    let hits = sqlx::query_scalar("SELECT COALESCE(SUM(hits), 0)::BIGINT FROM links")
        .fetch_one(pool)
        .await?;
    let links = sqlx::query_scalar("SELECT COUNT(*) FROM links")
        .fetch_one(pool)
        .await?;
    Ok((hits, links))
}
