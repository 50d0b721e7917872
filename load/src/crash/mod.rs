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
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
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
use crate::fate::FateCounts;
use crate::haproxy::{self, Checks, Haproxy};
use crate::machine::Machine;
use crate::postgres::PgCluster;
use crate::replica::{Ended, Replica, Spec};
use crate::report::{Latency, Mark, MarkKind};
use crate::traffic::{self, Mix, Targets};
use crate::{rollout, SERVICE};

/// How long a replica may take from its start to a 200 on `/readyz`: the
/// restart's wait, the journal replay included.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// How long the balancer may take to see a ready replica as UP.
const LB_UP_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a SIGKILLed process may take to be reaped: at once, unless the
/// kernel is stuck; the bound keeps the harness from hanging on it.
const KILL_EXIT_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a replica may take to exit after the final SIGTERM (its own
/// `--shutdown-timeout` is 20 s).
const EXIT_TIMEOUT: Duration = Duration::from_secs(60);

/// How often the balancer's view of a killed replica's slot is read, from
/// the kill until it is back.
const STATUS_POLL: Duration = Duration::from_millis(25);

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
    /// Exit non-zero if a journal run had a failure no kill explains, hits
    /// out of the bound, or a replica that did not exit 0 at the end.
    #[arg(long)]
    pub check: bool,
    /// Output folder (default: load/out/<timestamp>-crash).
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
    /// Applies `--smoke`, and makes the balancer redispatch refused
    /// connections.
    pub fn resolve(mut self) -> Options {
        if self.smoke {
            self.kills = 3;
            self.interval = Duration::from_secs(2);
            self.rate = 400;
            self.steady = Duration::from_secs(2);
            self.durabilities = vec![Durability::Journal];
            self.check = true;
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
    eprintln!("load: starting a throwaway PostgreSQL");
    let cluster = tokio::task::spawn_blocking(PgCluster::start)
        .await
        .context("the PostgreSQL cluster failed to start")?;
    let result = run_flavors(&options, binaries, &cluster.url(), out).await;
    tokio::task::spawn_blocking(move || drop(cluster))
        .await
        .ok();
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
    url: &str,
    out: &Path,
) -> anyhow::Result<Vec<FlavorResult>> {
    let pool = PgPoolOptions::new()
        .max_connections(2)
        .acquire_timeout(Duration::from_secs(10))
        .connect(url)
        .await
        .context("cannot connect to the throwaway PostgreSQL")?;
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
        let result = run_flavor(*durability, options, binaries, &pool, url, out).await?;
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
    pool.close().await;
    Ok(results)
}

/// One replica: a balancer slot and the process that serves it now.
struct Member {
    /// `r1`, `r2`, …: the replica, whatever its process.
    name: String,
    slot: usize,
    /// Processes started for it so far, the first included.
    starts: u32,
    process: Replica,
    /// Its ports, which a restart takes back.
    listen: SocketAddr,
    admin: SocketAddr,
}

impl Member {
    fn process_name(&self) -> String {
        format!("{}-{}", self.name, self.starts)
    }
}

/// What a durability's run needs at hand.
struct Rig<'a> {
    lb: &'a Haproxy,
    program: PathBuf,
    durability: Durability,
    url: String,
    scratch: PathBuf,
    logs: PathBuf,
    origin: Instant,
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

    fn spill_dir(&self) -> PathBuf {
        self.scratch.join("spill")
    }

    /// Every replica's arguments, on `ports` (public, admin) or on free
    /// ones: one database, one data directory, one spill directory.
    fn spec(&self, ports: Option<(SocketAddr, SocketAddr)>) -> Spec {
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

    /// Starts `name`'s process (`r1-2`) on `ports` or free ones and waits
    /// until its admin listener answers 200 on `/readyz`; returns it with
    /// its admin address.
    async fn spawn(
        &self,
        name: &str,
        ports: Option<(SocketAddr, SocketAddr)>,
    ) -> anyhow::Result<(Replica, SocketAddr)> {
        let log = self.logs.join(format!("{name}.log"));
        let process = Replica::spawn(name, &self.spec(ports), &log).await?;
        let admin = process.admin_addr().await?;
        process
            .wait_ready_at(admin, "/readyz", READY_TIMEOUT)
            .await?;
        Ok((process, admin))
    }

    /// Starts replica `index` (from 1) in the balancer's slot of its number.
    async fn start(&mut self, index: usize) -> anyhow::Result<Member> {
        let name = format!("r{index}");
        let (process, admin) = self.spawn(&format!("{name}-1"), None).await?;
        self.lb
            .enable_checked_at(index, process.addr, admin.port())
            .await?;
        self.lb
            .wait_status(index, "up", haproxy::is_up, LB_UP_TIMEOUT)
            .await?;
        Ok(Member {
            name,
            slot: index,
            starts: 1,
            listen: process.addr,
            admin,
            process,
        })
    }

    /// SIGKILLs `member`'s process, reaps it, and starts it again on its
    /// ports while following its slot in the balancer: out (if its checks
    /// fail before the restart is ready) and back UP.
    async fn kill_and_restart(&mut self, member: &mut Member) -> anyhow::Result<Kill> {
        let (pid, uptime) = (member.process.pid(), member.process.started.elapsed());
        let killed_at = Instant::now();
        member.process.signal(Signal::SIGKILL)?;
        let ended = member.process.wait_exit(killed_at, KILL_EXIT_TIMEOUT).await;
        let (ready_tx, ready_rx) = watch::channel(false);
        let lb = self.lb;
        let follow = follow_slot(lb, member.slot, killed_at, ready_rx);
        let rig = &*self;
        let restart = async {
            let restarted = rig.restart(member).await;
            if restarted.is_ok() {
                let _ = ready_tx.send(true);
            }
            drop(ready_tx);
            restarted.map(|same_ports| (same_ports, killed_at.elapsed()))
        };
        let (followed, restarted) = tokio::join!(follow, restart);
        let (same_ports, ready_after) = restarted?;
        let (lb_out_after, lb_in_after) = followed?;
        let name = member.name.clone();
        self.mark(killed_at, MarkKind::Sigkill, &name);
        if let Some(after) = lb_out_after {
            self.mark(killed_at + after, MarkKind::LbOut, &name);
        }
        self.mark(killed_at + ready_after, MarkKind::Ready, &name);
        self.mark(killed_at + lb_in_after, MarkKind::LbIn, &name);
        Ok(Kill {
            replica: name,
            slot: member.slot,
            pid,
            uptime,
            at_s: self.at(killed_at),
            ended,
            ready_after,
            same_ports,
            lb_out_after,
            lb_in_after,
            cut: 0,
        })
    }

    /// Starts `member` again with the same arguments on its ports, as a
    /// container restarts in its pod; if they are taken, on new ones, and
    /// points its slot there. Returns whether the ports were its own.
    async fn restart(&self, member: &mut Member) -> anyhow::Result<bool> {
        member.starts += 1;
        let ports = Some((member.listen, member.admin));
        let (process, admin, same_ports) = match self.spawn(&member.process_name(), ports).await {
            Ok((process, admin)) => (process, admin, true),
            Err(error) => {
                eprintln!(
                    "load: warning: {} did not start on its ports ({error:#}); starting it on new ones",
                    member.process_name()
                );
                member.starts += 1;
                let (process, admin) = self.spawn(&member.process_name(), None).await?;
                self.lb
                    .enable_checked_at(member.slot, process.addr, admin.port())
                    .await?;
                (process, admin, false)
            }
        };
        member.listen = process.addr;
        member.admin = admin;
        member.process = process;
        Ok(same_ports)
    }
}

/// Reads `slot`'s state until the restart is ready (`ready` turns true) and
/// the slot is UP in every backend; returns when it first went out of any
/// backend (if it did) and when it was back, from `since`.
///
/// # Errors
/// If the restart failed (`ready` dropped while false), the runtime API
/// fails, or the slot is not back within the restart's and the balancer's
/// bounds.
async fn follow_slot(
    lb: &Haproxy,
    slot: usize,
    since: Instant,
    ready: watch::Receiver<bool>,
) -> anyhow::Result<(Option<Duration>, Duration)> {
    let deadline = since + READY_TIMEOUT + LB_UP_TIMEOUT;
    let mut out_after = None;
    loop {
        let status = lb.status(slot).await?;
        if out_after.is_none() && status.iter().any(|s| haproxy::is_out(s)) {
            out_after = Some(since.elapsed());
        }
        let is_ready = *ready.borrow();
        if is_ready && status.iter().all(|s| haproxy::is_up(s)) {
            return Ok((out_after, since.elapsed()));
        }
        if !is_ready && ready.has_changed().is_err() {
            bail!("slot {slot}: the restart failed");
        }
        if Instant::now() > deadline {
            bail!("slot {slot} not back in the balancer within {READY_TIMEOUT:?} + {LB_UP_TIMEOUT:?}: {status:?}");
        }
        tokio::time::sleep(STATUS_POLL).await;
    }
}

async fn run_flavor(
    durability: Durability,
    options: &Options,
    binaries: &Binaries,
    pool: &PgPool,
    url: &str,
    out: &Path,
) -> anyhow::Result<FlavorResult> {
    let logs = out.join(durability.slug()).join("logs");
    std::fs::create_dir_all(&logs)?;
    let scratch = tempfile::Builder::new()
        .prefix(&format!("{SERVICE}-crash-"))
        .tempdir()?;
    let lb = Haproxy::start(
        options.checks,
        usize::from(options.replicas),
        scratch.path(),
        &logs.join("haproxy.log"),
    )
    .await?;
    let mut rig = Rig {
        lb: &lb,
        program: binaries.service.clone(),
        durability,
        url: url.to_owned(),
        scratch: scratch.path().to_owned(),
        logs: logs.clone(),
        origin: Instant::now() + Duration::from_secs(3600),
        marks: Vec::new(),
    };
    let mut fleet = Vec::new();
    for index in 1..=usize::from(options.replicas) {
        fleet.push(rig.start(index).await?);
    }
    sqlx::query("TRUNCATE links, link_audit")
        .execute(pool)
        .await
        .context("cannot empty the links table")?;
    let codes = rollout::seed_links(fleet[0].listen, options.links, options.seed).await?;

    let (stop, stopped) = watch::channel(false);
    let origin = Instant::now();
    rig.origin = origin;
    let targets = Targets {
        http1: lb.http1,
        http2: lb.http2,
    };
    let traffic = tokio::spawn(traffic::run(options.mix(), targets, codes, origin, stopped));

    let outcome = async {
        let mut kills = Vec::new();
        for k in 0..usize::from(options.kills) {
            let due = origin + options.steady + options.interval * u32::try_from(k)?;
            tokio::time::sleep_until(due).await;
            let replicas = fleet.len();
            let member = &mut fleet[k % replicas];
            let kill = rig.kill_and_restart(member).await?;
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
        tokio::time::sleep(options.steady).await;
        Ok::<_, anyhow::Error>(kills)
    }
    .await;
    let _ = stop.send(true);
    let records = traffic.await.context("the traffic task failed")?;
    let kills = outcome?;
    let traffic_s = origin.elapsed().as_secs_f64();

    // The rest stop with no traffic; their exit flushes what they hold.
    let sigterm = Instant::now();
    for member in &fleet {
        member.process.signal(Signal::SIGTERM)?;
    }
    let mut final_exits = Vec::new();
    for member in &mut fleet {
        final_exits.push(member.process.wait_exit(sigterm, EXIT_TIMEOUT).await);
    }
    let spill_files_left = std::fs::read_dir(rig.spill_dir()).map_or(0, Iterator::count);
    let marks = rig.marks;
    lb.stop().await;
    let hits_stored: i64 = sqlx::query_scalar("SELECT COALESCE(SUM(hits), 0)::BIGINT FROM links")
        .fetch_one(pool)
        .await?;

    Ok(summary::summarize(
        durability,
        &records,
        kills,
        summary::Ending {
            final_exits,
            hits_stored,
            replays: replays(&logs)?,
            spill_files_left,
            traffic_s,
            marks,
        },
    ))
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
