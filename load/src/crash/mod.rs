//! Scenario 4, the crash loop: R replicas of the real binary on one
//! PostgreSQL and one spill directory, behind HAProxy, which follows each
//! replica's `/readyz` on its admin port, under open-loop redirects. Every
//! `--interval` the harness SIGKILLs one replica, in turn, and starts it
//! again at once with the same arguments on the same ports, as the kubelet
//! restarts a killed container in its pod; K kills in all.
//!
//! What may fail: only the requests in flight on the killed replica. The
//! balancer retries a request whose connection was refused on another
//! replica ([`Checks::redispatch`]), as an L7 balancer does, so a dead
//! replica still in the balancer costs nothing; a request the replica had
//! taken dies with it: HAProxy closes the client's HTTP/1.1 connection, or
//! refuses its HTTP/2 stream, as the replica did to it. Every failure is
//! held against the kills ([`summary::attribute`]).
//!
//! What must not be lost: any redirect answered. The killed process's
//! journal, in the shared spill directory, is applied exactly once by its
//! restart or by a surviving replica's scan. At the end every replica gets
//! SIGTERM, and the hits stored are held against the redirects answered:
//! `answered ≤ stored ≤ answered + cut`, where the cut redirects are those
//! sent and never answered (the kill may come after a hit was journaled and
//! before its 307 left). Beside it, the same with `--state-durability
//! memory`, which loses what each killed process held.

pub mod summary;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use clap::ValueEnum;
use serde::Serialize;
use tokio::time::Instant;

use crate::binaries::Binaries;
use crate::fate::FateCounts;
use crate::fleet::seed::{self, Links};
use crate::fleet::{phases, Database, Fleet, Ports, Probe, Restart, Steady, Traffic};
use crate::haproxy::{Checks, Haproxy};
use crate::machine::Machine;
use crate::raw::RawConn;
use crate::replica::{Ended, Spec};
use crate::report::{Latency, Mark};
use crate::scenario::{Common, Scenario};
use crate::traffic::{self, Mix};
use crate::SERVICE;

/// How long a replica may take to exit after the final SIGTERM (its own
/// `--shutdown-timeout` is 20 s).
const EXIT_TIMEOUT: Duration = Duration::from_secs(60);

/// What the replicas keep their hit counters in (`--state-durability`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Durability {
    /// Every hit journaled before its 307 (the default): a kill loses none.
    Journal,
    /// Pending hits in memory only: a kill loses them.
    Memory,
}

impl Durability {
    fn arg(self) -> &'static str {
        match self {
            Durability::Journal => "journal",
            Durability::Memory => "memory",
        }
    }

    fn slug(self) -> String {
        format!("{SERVICE}-{}", self.arg())
    }

    /// Its label in tables.
    pub fn label(self) -> String {
        format!("{SERVICE} --state-durability {}", self.arg())
    }
}

/// Options of `load crash`.
#[derive(Clone, Debug, clap::Args, Serialize)]
pub struct Options {
    /// Replicas behind the balancer (R ≥ 2: all but the killed one serve).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(2..=8))]
    pub replicas: u16,
    /// SIGKILLs, one replica after another (K).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u16).range(1..=100))]
    pub kills: u16,
    /// From one kill to the next; later if the replica killed last is not
    /// back in the balancer by then.
    #[arg(long, default_value = "3s", value_parser = humantime::parse_duration)]
    #[serde(with = "crate::report::millis")]
    pub interval: Duration,
    /// Requests per second, constant.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=20_000))]
    pub rate: u32,
    /// Seed of the traffic's choices (protocol, link).
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Steady traffic before the first kill and after the last restart.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    #[serde(with = "crate::report::millis")]
    pub steady: Duration,
    /// Links created before the traffic starts; redirects pick among them.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub links: u32,
    /// Share of requests over HTTP/2 (prior knowledge); the rest HTTP/1.1.
    #[arg(long, default_value_t = 0.5)]
    pub h2_share: f64,
    /// A request without a complete answer after this long is a timeout.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    #[serde(with = "crate::report::millis")]
    pub timeout: Duration,
    /// The balancer's health checks. In this scenario it always retries a
    /// refused connection on another replica (`--lb-retries` at least 1,
    /// redispatched): see [`Checks::redispatch`].
    #[command(flatten)]
    pub checks: Checks,
    /// The replicas' `--state-durability`, one run each, in this order.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_values_t = [Durability::Journal, Durability::Memory]
    )]
    pub durabilities: Vec<Durability>,
    /// Short correctness run: journal only, K=3 kills 2 s apart, 400
    /// req/s, 2 s of steady traffic; implies --check. Overrides those
    /// options.
    #[arg(long)]
    pub smoke: bool,
    /// `--check`, `--out`, `--bin-dir`, `--no-install`.
    #[command(flatten)]
    #[serde(flatten)]
    pub common: Common,
}

impl Options {
    /// Applies `--smoke`, and makes the balancer redispatch refused
    /// connections.
    pub fn resolve(mut self) -> Options {
        if self.smoke {
            self.kills = 3;
            self.interval = Duration::from_secs(2);
            self.rate = 400;
            self.steady = Duration::from_secs(2);
            self.durabilities = vec![Durability::Journal];
            self.common.check = true;
        }
        self.checks.redispatch = true;
        self.checks.retries = self.checks.retries.max(1);
        self
    }

    fn mix(&self) -> Mix {
        Mix {
            rate: self.rate,
            seed: self.seed,
            h2_share: self.h2_share,
            create_share: 0.0,
            read_share: 0.0,
            timeout: self.timeout,
            // Far more than any run takes; only a harness bug reaches it.
            max_duration: Duration::from_secs(1800),
        }
    }
}

/// One kill and the restart after it.
#[derive(Clone, Debug, Serialize)]
pub struct Kill {
    /// The replica (`r2`), whatever its process.
    pub replica: String,
    /// Its balancer slot.
    pub slot: usize,
    /// The process killed.
    pub pid: i32,
    /// How long that process had run.
    #[serde(with = "crate::report::millis")]
    pub uptime: Duration,
    /// When it got SIGKILL, in seconds since the traffic started.
    pub at_s: f64,
    /// How it ended (SIGKILL, unless the kernel did not let it go).
    pub ended: Ended,
    /// From the kill to the restarted process's first 200 on `/readyz`.
    #[serde(with = "crate::report::millis")]
    pub ready_after: Duration,
    /// The restart got the killed process's ports back; if not (another
    /// socket took one meanwhile) it got new ones, and its slot points there.
    pub same_ports: bool,
    /// From the kill until the balancer's checks took the slot out, if they
    /// did before the restart was ready.
    #[serde(with = "crate::report::opt_millis")]
    pub lb_out_after: Option<Duration>,
    /// From the kill until the restart was ready and its slot UP.
    #[serde(with = "crate::report::millis")]
    pub lb_in_after: Duration,
    /// Requests that failed in flight at this kill: the requests the killed
    /// process took with it ([`summary::attribute`]).
    pub cut: u64,
}

impl Kill {
    /// The kill `restart` tells of, at `at_s` since the traffic started;
    /// none of the failures attributed yet.
    fn of(restart: Restart, at_s: f64) -> Kill {
        Kill {
            replica: restart.replica,
            slot: restart.slot,
            pid: restart.pid,
            uptime: restart.uptime,
            at_s,
            ended: restart.ended,
            ready_after: restart.ready_after,
            same_ports: restart.same_ports,
            lb_out_after: restart.lb_out_after,
            lb_in_after: restart.lb_in_after,
            cut: 0,
        }
    }
}

/// A failure no kill explains, kept for the JSON (the first few).
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Unexplained {
    /// When it was due, in seconds since the traffic started.
    pub due_s: f64,
    /// Its latency.
    #[serde(with = "crate::report::millis")]
    pub latency: Duration,
    /// How it failed.
    pub fate: crate::fate::Fate,
    /// The status, 0 if none.
    pub status: u16,
    /// The slot the balancer named, if any.
    pub slot: Option<u8>,
    /// HTTP/1.1 or HTTP/2.
    pub proto: traffic::Proto,
}

/// What the replicas' logs say about journals and spills.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct Replays {
    /// Dead processes' journals applied by a replica as it started.
    pub at_start: u64,
    /// Dead processes' journals applied by a running replica's scan.
    pub while_running: u64,
    /// Records torn by a kill, found and skipped.
    pub torn_records: u64,
}

/// One durability's run.
#[derive(Clone, Debug, Serialize)]
pub struct FlavorResult {
    /// Which.
    pub durability: Durability,
    /// Its label in tables.
    pub label: String,
    /// Every request by fate.
    pub requests: FateCounts,
    /// HTTP/1.1 requests by fate.
    pub http1: FateCounts,
    /// HTTP/2 requests by fate.
    pub http2: FateCounts,
    /// Failed requests a kill explains: in flight on the killed replica.
    pub cut_by_kills: u64,
    /// Failed requests no kill explains (the target is none): how many.
    pub unexplained: u64,
    /// The first of them.
    pub unexplained_first: Vec<Unexplained>,
    /// Latency of successful requests away from kills.
    pub latency_steady: Latency,
    /// Latency of successful requests due between a kill and one second
    /// after its replica was back in the balancer.
    pub latency_after_kill: Latency,
    /// Every kill, in order.
    pub kills: Vec<Kill>,
    /// How the replicas exited at the end (SIGTERM, no traffic).
    pub final_exits: Vec<Ended>,
    /// Redirects answered 307.
    pub redirects_answered: u64,
    /// Redirects sent and never answered: the kill may have come after the
    /// hit was recorded.
    pub redirects_cut: u64,
    /// `SUM(links.hits)` after every replica exited.
    pub hits_stored: i64,
    /// Journals applied, and torn records skipped, from the logs.
    pub replays: Replays,
    /// Files in the spill directory after every replica exited.
    pub spill_files_left: usize,
    /// Seconds of traffic.
    pub traffic_s: f64,
    /// Per second of traffic: requests answered as expected.
    pub ok_per_second: Vec<u64>,
    /// Per second of traffic: failed requests.
    pub failed_per_second: Vec<u64>,
    /// Per second of traffic: p99 latency of the requests answered, ms.
    pub p99_ms_per_second: Vec<f64>,
    /// Kills, restarts ready, the balancer taking slots out and back.
    pub marks: Vec<Mark>,
}

impl FlavorResult {
    /// Redirects answered but not stored (0 when none is missing).
    pub fn hits_lost(&self) -> u64 {
        u64::try_from(i64::try_from(self.redirects_answered).unwrap_or(i64::MAX) - self.hits_stored)
            .unwrap_or(0)
    }

    /// Hits stored beyond the redirects answered (0 when none).
    pub fn hits_excess(&self) -> u64 {
        u64::try_from(self.hits_stored - i64::try_from(self.redirects_answered).unwrap_or(i64::MAX))
            .unwrap_or(0)
    }

    /// `answered ≤ stored ≤ answered + cut`.
    pub fn within_bound(&self) -> bool {
        self.hits_lost() == 0 && self.hits_excess() <= self.redirects_cut
    }
}

/// Everything a `load crash` run measured.
#[derive(Clone, Debug, Serialize)]
pub struct CrashReport {
    /// Where and how.
    pub machine: Machine,
    /// The options after `--smoke`.
    pub options: Options,
    /// The traffic.
    pub mix: Mix,
    /// One per durability, in run order.
    pub results: Vec<FlavorResult>,
}

/// Runs every durability of `options`.
///
/// # Errors
/// If a tool is missing or a step of the harness fails (a replica that does
/// not start or restart, a balancer that does not take it back); failed
/// requests and lost hits are results, not errors.
pub async fn run(
    options: Options,
    binaries: &Binaries,
    machine: Machine,
    out: &Path,
) -> anyhow::Result<CrashReport> {
    std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    let database = Database::start(Duration::from_secs(10)).await?;
    let result = run_flavors(&options, binaries, &database, out).await;
    database.stop().await;
    Ok(CrashReport {
        machine,
        mix: options.mix(),
        results: result?,
        options,
    })
}

async fn run_flavors(
    options: &Options,
    binaries: &Binaries,
    database: &Database,
    out: &Path,
) -> anyhow::Result<Vec<FlavorResult>> {
    let mut results = Vec::new();
    for durability in &options.durabilities {
        eprintln!(
            "load: {} — R={}, K={} kills {:?} apart, {} req/s",
            durability.label(),
            options.replicas,
            options.kills,
            options.interval,
            options.rate
        );
        let result = run_flavor(*durability, options, binaries, database, out).await?;
        eprintln!(
            "load: {}: {} requests, {} failed ({} in flight on a killed replica); hits answered {} / stored {} / cut {}",
            result.label,
            result.requests.total(),
            result.requests.failed(),
            result.cut_by_kills,
            result.redirects_answered,
            result.hits_stored,
            result.redirects_cut
        );
        results.push(result);
    }
    Ok(results)
}

/// What every replica of a durability's run is started with.
struct Setup {
    program: PathBuf,
    durability: Durability,
    url: String,
    scratch: PathBuf,
}

impl Setup {
    fn spill_dir(&self) -> PathBuf {
        self.scratch.join("spill")
    }

    /// Every replica's arguments, on `ports` (public, admin) or on free
    /// ones: one database, one data directory, one spill directory.
    fn spec(&self, ports: Option<Ports>) -> Spec {
        let (listen, admin) = ports.map_or_else(
            || ("127.0.0.1:0".to_owned(), "127.0.0.1:0".to_owned()),
            |(listen, admin)| (listen.to_string(), admin.to_string()),
        );
        let mut args: Vec<OsString> = [
            "server",
            "--listen",
            &listen,
            "--admin-listen",
            &admin,
            "--log-format",
            "text",
            "--state-durability",
            self.durability.arg(),
            "--data-dir",
        ]
        .iter()
        .map(Into::into)
        .collect();
        args.push(self.scratch.join("data").into_os_string());
        args.push("--spill-dir".into());
        args.push(self.spill_dir().into_os_string());
        Spec {
            program: self.program.clone(),
            args,
            env: vec![("DATABASE_URL".to_owned(), self.url.clone())],
            cpus: None,
        }
    }
}

/// One durability: R replicas behind a fresh balancer, links seeded, then
/// steady traffic, K kills `--interval` apart, steady traffic, and the
/// final stop.
async fn run_flavor(
    durability: Durability,
    options: &Options,
    binaries: &Binaries,
    database: &Database,
    out: &Path,
) -> anyhow::Result<FlavorResult> {
    let logs = out.join(durability.slug()).join("logs");
    std::fs::create_dir_all(&logs)?;
    let scratch = tempfile::Builder::new()
        .prefix(&format!("{SERVICE}-crash-"))
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
    let setup = Setup {
        program: binaries.service.clone(),
        durability,
        url: database.url(),
        scratch: scratch.path().to_owned(),
    };
    for _ in 0..replicas {
        fleet.add(&setup.spec(None)).await?;
    }
    database.empty_links().await?;
    let addr = fleet.first_addr()?;
    let links = Links {
        prefix: "seed",
        count: options.links,
        seed: options.seed,
    };
    let codes = seed::create(links, || RawConn::connect(addr)).await?;

    let traffic = Traffic::start(options.mix(), fleet.targets(), codes);
    let origin = traffic.origin;
    fleet.begin(origin);
    let killing = kill_in_turn(&mut fleet, &setup, options, origin);
    let (kills, ran) = phases(traffic, Steady::around(options.steady), killing).await?;
    let stopped = fleet.stop(EXIT_TIMEOUT).await?;
    let spill_files_left = std::fs::read_dir(setup.spill_dir()).map_or(0, Iterator::count);
    Ok(summary::summarize(
        durability,
        &ran.records,
        kills,
        summary::Ending {
            final_exits: stopped.exits,
            hits_stored: database.hits_stored().await?,
            replays: replays(&logs)?,
            spill_files_left,
            traffic_s: ran.traffic_s,
            marks: stopped.marks,
        },
    ))
}

/// K kills, one replica after another, the k-th at `origin + steady +
/// k·interval` or once the one before is back, whichever is later.
async fn kill_in_turn(
    fleet: &mut Fleet,
    setup: &Setup,
    options: &Options,
    origin: Instant,
) -> anyhow::Result<Vec<Kill>> {
    let replicas = usize::from(options.replicas);
    let mut kills = Vec::new();
    for k in 0..usize::from(options.kills) {
        let due = origin + options.steady + options.interval * u32::try_from(k)?;
        tokio::time::sleep_until(due).await;
        let restart = fleet
            .kill_and_restart(k % replicas, |ports| setup.spec(ports))
            .await?;
        let at_s = fleet.at(restart.killed_at);
        let kill = Kill::of(restart, at_s);
        eprintln!(
            "load:   {}/{}: {} (pid {}, up {:.1?}) killed at {:.2}s; ready again after {:?}, back in the balancer after {:?}{}",
            k + 1,
            options.kills,
            kill.replica,
            kill.pid,
            kill.uptime,
            kill.at_s,
            kill.ready_after,
            kill.lb_in_after,
            if kill.same_ports { "" } else { " (on new ports)" }
        );
        kills.push(kill);
    }
    Ok(kills)
}

impl Scenario for Options {
    const NAME: &'static str = "crash";
    const PASSED: &'static str = "only requests in flight on a killed replica failed, \
                                  answered ≤ stored ≤ answered + cut, every exit 0";
    type Report = CrashReport;

    fn common(&self) -> &Common {
        &self.common
    }

    async fn run(
        self,
        binaries: &Binaries,
        machine: Machine,
        out: &Path,
    ) -> anyhow::Result<CrashReport> {
        run(self, binaries, machine, out).await
    }

    fn write(report: &CrashReport, out: &Path) -> anyhow::Result<()> {
        summary::write(report, out)
    }

    fn summary(report: &CrashReport) -> String {
        summary::summary(report)
    }

    fn verdict(report: &CrashReport) -> Result<(), String> {
        summary::verdict(report)
    }
}

/// Counts, in every replica's log in `logs`, the journals of dead processes
/// it applied — as it started (before its `listening on` line) or while it
/// ran — and the torn records it skipped.
fn replays(logs: &Path) -> anyhow::Result<Replays> {
    let mut replays = Replays::default();
    for entry in std::fs::read_dir(logs)? {
        let path = entry?.path();
        let is_replica = path
            .file_name()
            .and_then(|name| name.to_str())
            .is_some_and(|name| name.starts_with('r') && name.ends_with(".log"));
        if !is_replica {
            continue;
        }
        let text = std::fs::read_to_string(&path)?;
        let mut listening = false;
        for line in text.lines() {
            if line.contains("listening on ") {
                listening = true;
            } else if line.contains("replaying the journal of a process that died") {
                if listening {
                    replays.while_running += 1;
                } else {
                    replays.at_start += 1;
                }
            } else if line.contains("a torn record was skipped") {
                replays.torn_records += 1;
            }
        }
    }
    Ok(replays)
}
