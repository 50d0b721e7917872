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

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::ValueEnum;
use hdrhistogram::Histogram;
use nix::sys::signal::Signal;
use serde::Serialize;
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::binaries::Binaries;
use crate::fate::{Fate, FateCounts};
use crate::haproxy::{self, Checks, Haproxy};
use crate::machine::Machine;
use crate::postgres::PgCluster;
use crate::raw::{self, RawConn};
use crate::replica::{Ended, Replica, Spec};
use crate::report::{self, Latency, Mark, MarkKind, Panel};
use crate::traffic::{self, Kind, Mix, Proto, Record, Targets};
use crate::SERVICE;

/// Server slots per balancer backend: R + 1 are in use at most.
const SLOTS: usize = 16;

/// How long a new replica may take to become ready.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// How long the balancer may take to see a new, ready replica as UP.
const LB_UP_TIMEOUT: Duration = Duration::from_secs(10);

/// Added to a replica's own shutdown budget before the harness kills it.
const EXIT_SLACK: Duration = Duration::from_secs(15);

/// A request due within this long after an old replica's exit still counts
/// as "during a replacement" for latency.
const REPLACEMENT_TAIL: Duration = Duration::from_secs(1);

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
    /// Exit non-zero if a lameduck run with a drain delay had any failed
    /// request, lost a hit or a link, or a replica exited non-zero.
    #[arg(long)]
    pub check: bool,
    /// Output folder (default: load/out/<timestamp>-rollout).
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
            self.replicas = 2;
            self.replacements = 2;
            self.rate = 400;
            self.steady = Duration::from_secs(3);
            self.flavors = vec![Flavor::Lameduck];
            self.check = true;
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

    fn panel(&self) -> Panel {
        Panel {
            title: format!(
                "{}: {} requests, {} failed, {} hits lost",
                self.label,
                self.requests.total(),
                self.requests.failed(),
                self.hits_lost()
            ),
            ok: self.ok_per_second.clone(),
            failed: self.failed_per_second.clone(),
            marks: self.marks.clone(),
            spans: Vec::new(),
            p99_ms: Vec::new(),
        }
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

/// Runs every flavor of `options` and writes `rollout.json`, `rollout.svg`
/// and `summary.md` into `out`.
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
    eprintln!("load: starting a throwaway PostgreSQL");
    let cluster = tokio::task::spawn_blocking(PgCluster::start)
        .await
        .context("the PostgreSQL cluster failed to start")?;
    let result = run_flavors(&options, binaries, &cluster, checks, out).await;
    tokio::task::spawn_blocking(move || drop(cluster))
        .await
        .ok();
    let results = result?;
    let mix = mix(&options);
    Ok(RolloutReport {
        machine,
        options,
        mix,
        results,
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
    cluster: &PgCluster,
    checks: Checks,
    out: &Path,
) -> anyhow::Result<Vec<FlavorResult>> {
    let url = cluster.url();
    let pool = PgPoolOptions::new()
        .max_connections(2)
        .acquire_timeout(Duration::from_secs(10))
        .connect(&url)
        .await
        .context("cannot connect to the throwaway PostgreSQL")?;
    let mut results = Vec::new();
    for flavor in &options.flavors {
        eprintln!(
            "load: rolling {} (R={}, K={}, {} req/s)",
            flavor.label(options),
            options.replicas,
            options.replacements,
            options.rate
        );
        let result = run_flavor(*flavor, options, binaries, &pool, &url, checks, out).await?;
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
    pool.close().await;
    Ok(results)
}

/// What a flavor's run needs at hand.
struct Rig<'a> {
    lb: &'a Haproxy,
    spec: Spec,
    logs: PathBuf,
    origin: Instant,
    next_id: usize,
    free: Vec<usize>,
    marks: Vec<Mark>,
}

impl Rig<'_> {
    fn at(&self, instant: Instant) -> f64 {
        instant
            .checked_duration_since(self.origin)
            .map_or(0.0, |d| d.as_secs_f64())
    }

    fn mark(&mut self, instant: Instant, kind: MarkKind, replica: &str) {
        if instant >= self.origin {
            self.marks.push(Mark {
                at_s: (self.at(instant) * 1000.0).round() / 1000.0,
                kind,
                replica: replica.to_owned(),
            });
        }
    }

    /// Starts a replica, waits until it is ready, and adds it to the
    /// balancer in a free slot.
    async fn start_replica(&mut self) -> anyhow::Result<(usize, Replica, Duration)> {
        let name = format!("r{}", self.next_id);
        self.next_id += 1;
        let slot = self
            .free
            .pop()
            .context("no free balancer slot (raise SLOTS)")?;
        let log = self.logs.join(format!("{name}.log"));
        let replica = Replica::spawn(&name, &self.spec, &log).await?;
        let ready_after = replica.wait_ready("/readyz", READY_TIMEOUT).await?;
        self.lb.enable(slot, replica.addr).await?;
        self.mark(Instant::now(), MarkKind::Ready, &name);
        Ok((slot, replica, ready_after))
    }

    /// SIGTERMs `old`, waits both for its exit and for the balancer's
    /// checks to take it out, then empties its slot: the endpoint is
    /// removed neither before the process is gone nor before the
    /// balancer's lag has passed, as in a cluster whose endpoint removal
    /// trails the SIGTERM.
    async fn retire(
        &mut self,
        slot: usize,
        mut old: Replica,
        bound: Duration,
    ) -> anyhow::Result<(Option<Duration>, Ended)> {
        let sigterm = Instant::now();
        old.signal(Signal::SIGTERM)?;
        self.mark(sigterm, MarkKind::Sigterm, &old.name);
        let lb = self.lb;
        let name = old.name.clone();
        let watch_lb = async {
            lb.wait_status(slot, "out", haproxy::is_out, bound)
                .await
                .ok()
                .map(|_| sigterm.elapsed())
        };
        let (lb_out, ended) = tokio::join!(watch_lb, old.wait_exit(sigterm, bound));
        if let Some(after) = lb_out {
            self.mark(sigterm + after, MarkKind::LbOut, &name);
        }
        self.mark(sigterm + ended.after, MarkKind::Exit, &name);
        lb.disable(slot).await?;
        self.free.push(slot);
        Ok((lb_out, ended))
    }
}

async fn run_flavor(
    flavor: Flavor,
    options: &Options,
    binaries: &Binaries,
    pool: &PgPool,
    url: &str,
    checks: Checks,
    out: &Path,
) -> anyhow::Result<FlavorResult> {
    let work = out.join(flavor.slug());
    let logs = work.join("logs");
    std::fs::create_dir_all(&logs)?;
    let scratch = tempfile::Builder::new()
        .prefix(&format!("{SERVICE}-load-"))
        .tempdir()?;
    let lb = Haproxy::start(checks, SLOTS, scratch.path(), &logs.join("haproxy.log")).await?;
    let drain_delay = flavor.drain_delay(options);
    let spec = Spec {
        program: flavor.program(binaries).to_owned(),
        args: [
            "server",
            "--listen",
            "127.0.0.1:0",
            "--log-format",
            "text",
            "--drain-delay",
            &humantime::format_duration(drain_delay).to_string(),
            "--shutdown-timeout",
            &humantime::format_duration(options.shutdown_timeout).to_string(),
            "--data-dir",
        ]
        .iter()
        .map(Into::into)
        .chain([scratch.path().join("data").into_os_string()])
        .collect(),
        env: vec![("DATABASE_URL".to_owned(), url.to_owned())],
        cpus: None,
    };
    let mut rig = Rig {
        lb: &lb,
        spec,
        logs,
        origin: Instant::now() + Duration::from_secs(3600),
        next_id: 1,
        free: (1..=SLOTS).rev().collect(),
        marks: Vec::new(),
    };
    let exit_bound = drain_delay + options.shutdown_timeout + EXIT_SLACK;

    let mut active: VecDeque<(usize, Replica)> = VecDeque::new();
    for _ in 0..options.replicas {
        let (slot, replica, _) = rig.start_replica().await?;
        active.push_back((slot, replica));
    }
    for (slot, _) in &active {
        lb.wait_status(*slot, "up", haproxy::is_up, LB_UP_TIMEOUT)
            .await?;
    }
    sqlx::query("TRUNCATE links, link_audit")
        .execute(pool)
        .await
        .context("cannot empty the links table")?;
    let codes = seed_links(active[0].1.addr, options.links, options.seed).await?;

    let (stop, stopped) = watch::channel(false);
    let origin = Instant::now();
    rig.origin = origin;
    let targets = Targets {
        http1: lb.http1,
        http2: lb.http2,
    };
    let traffic = tokio::spawn(traffic::run(mix(options), targets, codes, origin, stopped));

    let outcome = async {
        tokio::time::sleep(options.steady).await;
        let mut replacements = Vec::new();
        for k in 0..options.replacements {
            let (slot, new, ready_after) = rig.start_replica().await?;
            lb.wait_status(slot, "up", haproxy::is_up, LB_UP_TIMEOUT).await?;
            let new_name = new.name.clone();
            active.push_back((slot, new));
            let Some((old_slot, old)) = active.pop_front() else {
                bail!("no replica to replace");
            };
            let old_name = old.name.clone();
            let sigterm_at_s = rig.at(Instant::now());
            let (lb_out_after, ended) = rig.retire(old_slot, old, exit_bound).await?;
            eprintln!(
                "load:   {}/{}: {new_name} ready in {:?}; {old_name} exited {} after {:?} (balancer out after {})",
                k + 1,
                options.replacements,
                ready_after,
                ended.describe(),
                ended.after,
                lb_out_after.map_or_else(|| "-".to_owned(), |d| format!("{d:?}"))
            );
            replacements.push(Replacement {
                new_replica: new_name,
                new_ready_after: ready_after,
                old_replica: old_name,
                sigterm_at_s,
                lb_out_after,
                ended,
            });
        }
        tokio::time::sleep(options.steady).await;
        Ok::<_, anyhow::Error>(replacements)
    }
    .await;
    let _ = stop.send(true);
    let records = traffic.await.context("the traffic task failed")?;
    let replacements = outcome?;
    let traffic_s = origin.elapsed().as_secs_f64();

    // The rest stop with no traffic; their exit flushes whatever they hold.
    let sigterm = Instant::now();
    for (_, replica) in &active {
        replica.signal(Signal::SIGTERM)?;
    }
    let mut final_exits = Vec::new();
    for (_, mut replica) in active {
        final_exits.push(replica.wait_exit(sigterm, exit_bound).await);
    }
    let marks = rig.marks;
    lb.stop().await;

    let hits_stored: i64 = sqlx::query_scalar("SELECT COALESCE(SUM(hits), 0)::BIGINT FROM links")
        .fetch_one(pool)
        .await?;
    let rows: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM links")
        .fetch_one(pool)
        .await?;

    Ok(summarize(
        flavor,
        options,
        &records,
        replacements,
        final_exits,
        hits_stored,
        rows - i64::from(options.links),
        traffic_s,
        marks,
    ))
}

/// Creates `count` links through `addr` and returns their codes
/// (`seed-0`, `seed-1`, …).
///
/// # Errors
/// If a creation fails or answers other than 201.
pub(crate) async fn seed_links(
    addr: std::net::SocketAddr,
    count: u32,
    seed: u64,
) -> anyhow::Result<Arc<[String]>> {
    let mut conn = RawConn::connect(addr).await?;
    let mut codes = Vec::new();
    for n in 0..count {
        let code = format!("seed-{n}");
        let body = format!(r#"{{"url":"https://example.com/seed/{seed}/{n}","code":"{code}"}}"#);
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

#[allow(clippy::too_many_arguments)]
fn summarize(
    flavor: Flavor,
    options: &Options,
    records: &[Record],
    replacements: Vec<Replacement>,
    final_exits: Vec<Ended>,
    hits_stored: i64,
    links_stored: i64,
    traffic_s: f64,
    marks: Vec<Mark>,
) -> FlavorResult {
    let windows: Vec<(f64, f64)> = replacements
        .iter()
        .map(|r| {
            (
                r.sigterm_at_s,
                r.sigterm_at_s + (r.ended.after + REPLACEMENT_TAIL).as_secs_f64(),
            )
        })
        .collect();
    let mut requests = FateCounts::default();
    let mut breakdown = Breakdown::default();
    let mut steady: Histogram<u64> = report::histogram();
    let mut replacing: Histogram<u64> = report::histogram();
    // Whole seconds only: a last, partial second would look like a drop.
    #[allow(clippy::cast_possible_truncation)]
    let seconds = (records.last().map_or(0, |r| r.due.as_secs()) as usize).max(1);
    let mut ok_per_second = vec![0; seconds];
    let mut failed_per_second = vec![0; seconds];
    let (mut redirects_answered, mut links_answered) = (0, 0);
    for record in records {
        requests.add(record.fate);
        match record.proto {
            Proto::Http1 => breakdown.http1.add(record.fate),
            Proto::Http2 => breakdown.http2.add(record.fate),
        }
        match record.kind {
            Kind::Redirect => breakdown.redirect.add(record.fate),
            Kind::Create => breakdown.create.add(record.fate),
            // The rollout sends none.
            Kind::Read => {}
        }
        match (record.kind, record.status) {
            (Kind::Redirect, 307) => redirects_answered += 1,
            (Kind::Create, 201) => links_answered += 1,
            _ => {}
        }
        #[allow(clippy::cast_possible_truncation)]
        let second = record.due.as_secs() as usize;
        if record.fate == Fate::Success {
            if let Some(bucket) = ok_per_second.get_mut(second) {
                *bucket += 1;
            }
            let due = record.due.as_secs_f64();
            if windows.iter().any(|(from, to)| (*from..*to).contains(&due)) {
                report::record(&mut replacing, record.latency);
            } else {
                report::record(&mut steady, record.latency);
            }
        } else if let Some(bucket) = failed_per_second.get_mut(second) {
            *bucket += 1;
        }
    }
    FlavorResult {
        flavor,
        label: flavor.label(options),
        requests,
        breakdown,
        latency_steady: Latency::of(&steady),
        latency_replacing: Latency::of(&replacing),
        replacements,
        final_exits,
        redirects_answered,
        hits_stored,
        links_answered,
        links_stored,
        traffic_s: (traffic_s * 10.0).round() / 10.0,
        ok_per_second,
        failed_per_second,
        marks,
    }
}

// === output ===

/// The comparison table: one column per flavor.
pub fn summary_table(report: &RolloutReport) -> String {
    let mut header = vec![String::new()];
    header.extend(report.results.iter().map(|r| r.label.clone()));
    let row = |name: &str, cell: &dyn Fn(&FlavorResult) -> String| {
        let mut row = vec![name.to_owned()];
        row.extend(report.results.iter().map(cell));
        row
    };
    let mut rows = vec![
        row("requests", &|r| r.requests.total().to_string()),
        row("**failed**", &|r| format!("**{}**", r.requests.failed())),
    ];
    for fate in Fate::FAILURES {
        rows.push(row(&format!("  {}", fate.as_str()), &|r| {
            r.requests.get(fate).to_string()
        }));
    }
    rows.extend([
        row("failed over HTTP/1.1 / HTTP/2", &|r| {
            format!(
                "{} / {}",
                r.breakdown.http1.failed(),
                r.breakdown.http2.failed()
            )
        }),
        row("latency steady p50 / p99 / max (ms)", &|r| {
            r.latency_steady.cell()
        }),
        row("latency replacing p50 / p99 / max (ms)", &|r| {
            r.latency_replacing.cell()
        }),
        row("redirects answered 307", &|r| {
            r.redirects_answered.to_string()
        }),
        row("hits stored in PostgreSQL", &|r| r.hits_stored.to_string()),
        row("**hits lost**", &|r| format!("**{}**", r.hits_lost())),
        row("links answered 201 / stored", &|r| {
            format!("{} / {}", r.links_answered, r.links_stored)
        }),
        row("old replicas' exit codes", &|r| exit_codes(r)),
        row("drain time (SIGTERM → exit) median / max", &|r| {
            let mut drains: Vec<Duration> = r.replacements.iter().map(|x| x.ended.after).collect();
            drains.sort();
            match (drains.get(drains.len() / 2), drains.last()) {
                (Some(median), Some(max)) => format!(
                    "{} / {} ms",
                    report::fmt_ms(median.as_secs_f64() * 1000.0),
                    report::fmt_ms(max.as_secs_f64() * 1000.0)
                ),
                _ => "–".to_owned(),
            }
        }),
        row("balancer out after SIGTERM, median", &|r| {
            let mut lags: Vec<Duration> = r
                .replacements
                .iter()
                .filter_map(|x| x.lb_out_after)
                .collect();
            lags.sort();
            let before_exit = r
                .replacements
                .iter()
                .filter(|x| x.lb_out_after.is_some_and(|lag| lag < x.ended.after))
                .count();
            let before_exit = format!("{before_exit}/{} before exit", r.replacements.len());
            match lags.get(lags.len() / 2) {
                Some(median) => format!(
                    "{} ms ({before_exit})",
                    report::fmt_ms(median.as_secs_f64() * 1000.0)
                ),
                None => format!("– ({before_exit})"),
            }
        }),
    ]);
    report::table(&header, &rows)
}

fn exit_codes(result: &FlavorResult) -> String {
    let mut counts: Vec<(String, usize)> = Vec::new();
    for ended in result.replacements.iter().map(|r| &r.ended) {
        let code = ended.describe();
        match counts.iter_mut().find(|(c, _)| *c == code) {
            Some((_, n)) => *n += 1,
            None => counts.push((code, 1)),
        }
    }
    counts
        .iter()
        .map(|(code, n)| format!("{code} ×{n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The whole Markdown summary: the table, the setup, the machine.
pub fn summary(report: &RolloutReport) -> String {
    let o = &report.options;
    format!(
        "### Rolling deploy: R={} replicas, K={} replacements, {} req/s\n\n{}\n\
         Traffic: open loop, {} req/s, seed {}, {:.0}% HTTP/2 (prior knowledge), {:.0}% `POST /api/links`, \
         the rest `GET /{{code}}` over {} links; timeout {:?}. Balancer: HAProxy, `/readyz` checked every {:?}, \
         out after {} failures, in after {}, {} retries of a failed connection; a replica leaves the \
         balancer only once it has exited and the checks have failed. Replicas share one PostgreSQL; hits are counted after every \
         replica has exited.\n\n\
         Machine: {}\n\nCommand: `{}`\n",
        o.replicas,
        o.replacements,
        o.rate,
        summary_table(report),
        o.rate,
        o.seed,
        o.h2_share * 100.0,
        o.create_share * 100.0,
        o.links,
        o.timeout,
        o.checks.inter,
        o.checks.fall,
        o.checks.rise,
        o.checks.retries,
        report.machine.line(),
        report.machine.command
    )
}

/// Writes `rollout.json`, `rollout.svg` and `summary.md` into `out`.
///
/// # Errors
/// If a file cannot be written.
pub fn write(report: &RolloutReport, out: &Path) -> anyhow::Result<()> {
    report::write_json(&out.join("rollout.json"), report)?;
    let panels: Vec<Panel> = report.results.iter().map(FlavorResult::panel).collect();
    let title = format!(
        "Rolling deploy: R={}, K={}, {} req/s, seed {}",
        report.options.replicas,
        report.options.replacements,
        report.options.rate,
        report.options.seed
    );
    std::fs::write(
        out.join("rollout.svg"),
        report::rollout_svg(&title, &panels),
    )?;
    std::fs::write(out.join("summary.md"), summary(report))?;
    Ok(())
}

/// The verdict of `--check`: every lameduck run with a drain delay must be
/// clean. Baselines without failures earn a warning: the scenario would
/// then be too weak to tell the difference.
pub fn verdict(report: &RolloutReport) -> Result<(), String> {
    let mut problems = Vec::new();
    for result in &report.results {
        let baseline = result.flavor != Flavor::Lameduck;
        if baseline {
            if result.requests.failed() == 0 && result.hits_lost() == 0 {
                eprintln!(
                    "load: warning: baseline {} failed nothing: the scenario is too weak to tell",
                    result.label
                );
            }
            continue;
        }
        if !result.is_clean() {
            problems.push(format!(
                "{}: {} failed requests, {} hits lost, {} links lost, exits [{}]",
                result.label,
                result.requests.failed(),
                result.hits_lost(),
                result.links_lost(),
                result
                    .exits()
                    .map(Ended::describe)
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("; "))
    }
}
