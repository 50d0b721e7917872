//! `load abuse` (not in CI): slow HTTP attacks by the real `slowhttptest`
//! against lameduck, while a normal client keeps using it.
//!
//! Three attacks, one after the other, each against a fresh `lameduck
//! server` (default settings, SQLite, port 0): slow bodies on 1,100 and on
//! 5,000 connections (`slowhttptest -B`, `POST /api/links`), and slowloris
//! on 5,000 (`-H`). Once slowhttptest reports most of its connections up, a
//! normal client sends redirects and link creations at a steady pace, each
//! on a new connection; then the attack is stopped and the server gets
//! SIGTERM. Before lameduck read bodies ahead of its concurrency limit,
//! 1,100 slow bodies took every slot and every API route answered 503.
//!
//! slowhttptest never reopens a connection the server has closed, and
//! lameduck closes a slow one after [`SERVER_READ_TIMEOUT_SECS`]: to hold N
//! connections at once for the whole measurement, the attack opens N ÷ 10 s
//! new ones a second for as long as it runs (see [`plan`]).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{ExitCode, ExitStatus, Stdio};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::ValueEnum;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde::Serialize;
use tokio::process::{Child, Command};
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::binaries::{self, Binaries};
use crate::fate::Fate;
use crate::machine::Machine;
use crate::raw::{self, RawConn};
use crate::replica::{Ended, Replica, Spec};
use crate::report::{self, fmt_ms, Latency};
use crate::{metric, SERVICE};

/// lameduck's default `--body-read-timeout` and `--header-read-timeout`, in
/// seconds: how long the server lets one attack connection live. The
/// connection rate asked of slowhttptest is derived from it.
pub const SERVER_READ_TIMEOUT_SECS: f64 = 10.0;

/// The connection rate asked of slowhttptest over the rate that would just
/// hold its share: it opens fewer than `-r` a second, fewer still as its
/// sockets pile up (asked for 121/s, it opened 115 in the first second and
/// 104 in the tenth on the reference machine), so a quarter more keeps the
/// count at or a little above the target.
pub const RATE_OVERSHOOT: f64 = 1.25;

/// Most connections one slowhttptest process is asked to hold. Its loop
/// polls every socket it has ever opened once per new connection, so one
/// process asked for 5,000 held at 550/s opened under 300/s on the
/// reference machine and held under 2,900; several processes, each with a
/// share, keep the rate.
pub const PER_PROCESS: u32 = 1_100;

/// `-s`: the `Content-Length` the slow bodies announce. Under lameduck's
/// `--max-body-bytes` (64 KiB), so the server waits for the body instead of
/// answering 413 at once, and far more than the follow-ups send (up to 66
/// bytes every [`FOLLOWUP_INTERVAL_SECS`]), so no body ever completes.
pub const CONTENT_LENGTH: u32 = 8_192;

/// `-i`: seconds between follow-up data on each attack connection (a body
/// fragment, or a header line for slowloris): it keeps each connection
/// looking alive, never finished.
pub const FOLLOWUP_INTERVAL_SECS: u32 = 2;

/// The share of the target slowhttptest must report connected before the
/// normal client starts measuring.
pub const MOST: f64 = 0.95;

/// How long the harness waits for slowhttptest to report [`MOST`] of its
/// connections up; past it the measurement starts anyway, and the table
/// shows how many were held.
pub const RAMP_LIMIT: Duration = Duration::from_secs(20);

/// `-l` is [`RAMP_LIMIT`] + the window + this: the harness stops the attack
/// with SIGINT when the window ends; `-l` only bounds it if that fails.
pub const ATTACK_SLACK: Duration = Duration::from_secs(5);

/// How long slowhttptest may take to exit after SIGINT (it closes its
/// sockets and prints its final report); then it is killed.
pub const STOP_GRACE: Duration = Duration::from_secs(5);

/// How long lameduck may take to exit after SIGTERM before it is killed;
/// its default shutdown budget (20 s drain and the finalizers) fits.
pub const EXIT_LIMIT: Duration = Duration::from_secs(60);

/// How often the server's open connections are read from `/metrics` while
/// the normal client measures.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(1);

/// How long one `/metrics` scrape may take; a scrape that fails is an
/// error of the run, since the counters are part of the report.
pub const SCRAPE_TIMEOUT: Duration = Duration::from_secs(10);

/// How often slowhttptest's per-second CSV (and the server's log, for its
/// admin address) is read while waiting.
const RAMP_POLL: Duration = Duration::from_millis(250);

/// How long after readiness the server's log may take to show its admin
/// address (it is logged before readiness; the log is written behind).
const ADMIN_LOG_LIMIT: Duration = Duration::from_secs(5);

/// The code of the link the normal client's redirects ask for, created
/// before each attack.
const LINK_CODE: &str = "abuse";

/// The attacks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
pub enum Attack {
    /// Slow bodies (`-B`) on `POST /api/links`, 1,100 connections: the
    /// issue's attack, past the default 1,024 concurrency slots.
    #[value(name = "slow-body-1100")]
    #[serde(rename = "slow-body-1100")]
    SlowBody1100,
    /// Slow bodies on 5,000 connections.
    #[value(name = "slow-body-5000")]
    #[serde(rename = "slow-body-5000")]
    SlowBody5000,
    /// Slow headers (slowloris, `-H`) on 5,000 connections.
    #[value(name = "slowloris-5000")]
    #[serde(rename = "slowloris-5000")]
    Slowloris5000,
}

impl Attack {
    /// Connections the attack holds at once.
    pub fn target(self) -> u32 {
        match self {
            Attack::SlowBody1100 => 1_100,
            Attack::SlowBody5000 | Attack::Slowloris5000 => 5_000,
        }
    }

    /// Slow bodies (`-B`) rather than slow headers (`-H`).
    pub fn slow_body(self) -> bool {
        matches!(self, Attack::SlowBody1100 | Attack::SlowBody5000)
    }

    /// Its name on the command line and in file names.
    pub fn name(self) -> &'static str {
        match self {
            Attack::SlowBody1100 => "slow-body-1100",
            Attack::SlowBody5000 => "slow-body-5000",
            Attack::Slowloris5000 => "slowloris-5000",
        }
    }

    /// Its column heading.
    pub fn title(self) -> String {
        let kind = if self.slow_body() {
            "slow body"
        } else {
            "slowloris"
        };
        format!("{kind}, {} connections", self.target())
    }
}

/// Options of `load abuse`.
#[derive(Clone, Debug, clap::Args, Serialize)]
pub struct Options {
    /// The attacks to run, in this order.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [Attack::SlowBody1100, Attack::SlowBody5000, Attack::Slowloris5000])]
    pub attacks: Vec<Attack>,
    /// How long the normal client measures during each attack.
    #[arg(long, default_value = "15s", value_parser = humantime::parse_duration)]
    #[serde(with = "crate::report::millis")]
    pub window: Duration,
    /// Requests per second of each kind (redirects, link creations) the
    /// normal client sends, open loop.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=1_000))]
    pub rate: u32,
    /// How long one normal request may take, connect included.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    #[serde(with = "crate::report::millis")]
    pub timeout: Duration,
    /// Do not run `scripts/install-test-deps.sh abuse` (slowhttptest).
    #[arg(long)]
    pub no_install: bool,
    /// Output folder (default: load/out/<timestamp>-abuse).
    #[arg(long)]
    #[serde(skip)]
    pub out: Option<PathBuf>,
    /// Use the binaries in this folder instead of building them.
    #[arg(long)]
    #[serde(skip)]
    pub bin_dir: Option<PathBuf>,
}

/// Everything one run measured.
#[derive(Clone, Debug, Serialize)]
pub struct AbuseReport {
    /// The machine, the date and the command.
    pub machine: Machine,
    /// The options.
    pub options: Options,
    /// One per attack, in the order run.
    pub attacks: Vec<AttackReport>,
}

/// One attack: what slowhttptest held, how the normal client fared, the
/// server's counters and its exit.
#[derive(Clone, Debug, Serialize)]
pub struct AttackReport {
    /// Which attack.
    pub attack: Attack,
    /// Connections it was to hold at once.
    pub target: u32,
    /// Every slowhttptest process, as run and as it reported.
    pub processes: Vec<SlowReport>,
    /// Connections held, from slowhttptest's reports and the server's gauge.
    pub held: Held,
    /// From starting slowhttptest to the start of the measurement.
    #[serde(with = "crate::report::millis")]
    pub ramp: Duration,
    /// The measurement started because [`MOST`] of the target was reported
    /// up (not because [`RAMP_LIMIT`] passed).
    pub ramp_reached: bool,
    /// The normal client's redirects.
    pub redirects: KindSummary,
    /// The normal client's link creations.
    pub creations: KindSummary,
    /// `/metrics` counters: after the attack minus before it.
    pub counters: Counters,
    /// The server's exit after SIGTERM.
    pub ended: Ended,
    /// Every normal request.
    pub requests: Vec<Record>,
}

/// Connections the attack held.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct Held {
    /// Most connected at once, summed over the processes, from their
    /// printed status (every 5 s) and their per-second CSV, whichever is
    /// higher.
    pub peak: u64,
    /// The same from the printed status alone.
    pub peak_printed: u64,
    /// Fewest and most connected in a second of the measurement (CSV).
    pub window_min: u64,
    /// See `window_min`.
    pub window_max: u64,
    /// Fewest and most `lameduck_connections_open` (every protocol, the
    /// normal client's connections included), read from the admin
    /// listener's `/metrics` every [`SAMPLE_EVERY`] during the measurement.
    pub server_min: i64,
    /// See `server_min`.
    pub server_max: i64,
    /// Reads of `/metrics` during the measurement that failed.
    pub failed_scrapes: usize,
    /// Status reports in which slowhttptest's own probe found the service
    /// unavailable, and all its status reports.
    pub probe_unavailable: usize,
    /// See `probe_unavailable`.
    pub probe_reports: usize,
}

/// One slowhttptest process.
#[derive(Clone, Debug, Serialize)]
pub struct SlowReport {
    /// The command line, as run in the output folder.
    pub command: String,
    /// How it ended: `"0"`, `"SIGKILL"`, …
    pub exit: String,
    /// Its own final verdict (`Exit status:` line), if it printed one.
    pub exit_status: Option<String>,
    /// The connection count it lowered its target to for lack of file
    /// descriptors, if it did.
    pub lowered_to: Option<u32>,
    /// Its printed status reports.
    pub printed: Vec<Status>,
    /// Connected sockets per second, from its CSV.
    pub per_second: Vec<(u32, u64)>,
}

/// One printed status report of slowhttptest.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Status {
    /// Seconds since it started.
    pub second: u32,
    /// Sockets connecting.
    pub pending: u64,
    /// Sockets that sent their request head and are open.
    pub connected: u64,
    /// Sockets closed (by the server).
    pub closed: u64,
    /// Sockets it could not open.
    pub error: u64,
    /// Its probe connection got an answer.
    pub available: bool,
}

/// What the normal client saw for one kind of request.
#[derive(Clone, Debug, Default, Serialize)]
pub struct KindSummary {
    /// Requests sent.
    pub requests: u64,
    /// Answered with the expected status.
    pub succeeded: u64,
    /// `succeeded ÷ requests`, in per cent.
    pub success_percent: f64,
    /// Latency of the successful ones.
    pub latency: Latency,
    /// The failures, by fate.
    pub failures: BTreeMap<String, u64>,
}

/// The server's counters over the attack (after minus before).
#[derive(Clone, Debug, Default, Serialize)]
pub struct Counters {
    /// `lameduck_requests_shed_total`: 503s at the concurrency limit.
    pub shed: f64,
    /// `lameduck_requests_timed_out_total`.
    pub timed_out: f64,
    /// `lameduck_http_requests_total` series with status `4xx` or `5xx`
    /// that grew: route and class, and by how much.
    pub http_errors: Vec<(String, f64)>,
}

/// The kinds of normal requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// `GET /{code}`, 307 expected.
    Redirect,
    /// `POST /api/links`, 201 expected.
    Creation,
}

impl Kind {
    fn expected(self) -> u16 {
        match self {
            Kind::Redirect => 307,
            Kind::Creation => 201,
        }
    }
}

/// One normal request.
#[derive(Clone, Debug, Serialize)]
pub struct Record {
    /// Which kind.
    pub kind: Kind,
    /// When it was due, from the start of the measurement, ms.
    pub due_ms: f64,
    /// From when it was due to its answer (or failure), ms.
    pub latency_ms: f64,
    /// What happened.
    pub fate: Fate,
}

// === the run ===

/// `load abuse`: installs slowhttptest, builds, runs every attack, prints
/// and writes the table; exit code 1 if a normal request failed or the
/// server did not exit 0, 2 if the run itself failed.
pub fn main(options: Options, mut machine: Machine) -> ExitCode {
    let result = (|| -> anyhow::Result<bool> {
        if !options.no_install {
            binaries::install_test_deps(&["abuse"])?;
        }
        raise_fd_limit();
        let binaries = Binaries::for_run(options.bin_dir.as_deref(), &mut machine)?;
        let out = options.out.clone().unwrap_or_else(|| {
            let stamp = chrono::Utc::now().format("%Y%m%dT%H%M%SZ");
            binaries::workspace_root()
                .join("load/out")
                .join(format!("{stamp}-abuse"))
        });
        std::fs::create_dir_all(out.join("logs"))
            .with_context(|| format!("cannot create {}", out.display()))?;
        let runtime = tokio::runtime::Runtime::new().context("cannot start the runtime")?;
        let report = runtime.block_on(run(options, &binaries, machine, &out))?;
        report::write_json(&out.join("abuse.json"), &report)?;
        let text = summary(&report);
        std::fs::write(out.join("summary.md"), &text)
            .with_context(|| format!("cannot write {}", out.join("summary.md").display()))?;
        println!("{text}");
        println!(
            "Written: {}/{{abuse.json,summary.md}} and logs/",
            out.display()
        );
        let problems = verdict(&report);
        if problems.is_empty() {
            eprintln!("load abuse: passed: every normal request succeeded, every exit 0");
            Ok(true)
        } else {
            eprintln!("load abuse: FAILED: {}", problems.join("; "));
            Ok(false)
        }
    })();
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(error) => {
            eprintln!("load: error: {error:#}");
            ExitCode::from(2)
        }
    }
}

/// Raises this process's soft limit of open files to its hard limit, so
/// that lameduck, a child, can hold every attack connection (slowhttptest
/// raises its own). A failure is left for the attack to show: the table
/// reports the connections actually held.
fn raise_fd_limit() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        if soft < hard {
            if let Err(error) = setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
                eprintln!(
                    "load abuse: cannot raise the open-files limit from {soft} to {hard}: {error}"
                );
            }
        }
    }
}

/// Runs every attack of `options`, one after the other.
///
/// # Errors
/// If a server or slowhttptest cannot be started, or `/metrics` cannot be
/// read.
pub async fn run(
    options: Options,
    binaries: &Binaries,
    machine: Machine,
    out: &Path,
) -> anyhow::Result<AbuseReport> {
    let scratch = tempfile::Builder::new()
        .prefix(&format!("{SERVICE}-abuse-"))
        .tempdir()?;
    let mut attacks = Vec::with_capacity(options.attacks.len());
    for attack in &options.attacks {
        eprintln!("load abuse: {} …", attack.title());
        let report = one_attack(*attack, &options, binaries, scratch.path(), out).await?;
        eprintln!(
            "load abuse: {}: peak {} held, redirects {}/{}, creations {}/{}, exit {}",
            attack.title(),
            report.held.peak,
            report.redirects.succeeded,
            report.redirects.requests,
            report.creations.succeeded,
            report.creations.requests,
            report.ended.describe()
        );
        attacks.push(report);
    }
    Ok(AbuseReport {
        machine,
        options,
        attacks,
    })
}

async fn one_attack(
    attack: Attack,
    options: &Options,
    binaries: &Binaries,
    scratch: &Path,
    out: &Path,
) -> anyhow::Result<AttackReport> {
    let data = scratch.join(attack.name());
    let spec = Spec {
        program: binaries.service.clone(),
        args: [
            "server",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            &data.display().to_string(),
        ]
        .iter()
        .map(Into::into)
        .collect(),
        env: Vec::new(),
        cpus: None,
    };
    let log = out
        .join("logs")
        .join(format!("{}-{SERVICE}.log", attack.name()));
    let mut server = Replica::spawn(attack.name(), &spec, &log).await?;
    server
        .wait_ready("/readyz", Duration::from_secs(30))
        .await?;
    let addr = server.addr;
    let admin = admin_addr(&server).await?;

    let mut conn = RawConn::connect(addr).await?;
    let created = conn
        .exchange(&raw::post_json(
            "/api/links",
            &format!(r#"{{"url":"https://example.com/{LINK_CODE}","code":"{LINK_CODE}"}}"#),
        ))
        .await?;
    if created.status != 201 {
        bail!("creating the link answered {}", created.status);
    }
    drop(conn);
    let before = scrape(admin).await?;

    let plans = plan(attack, addr, options.window);
    let started = Instant::now();
    let mut slow = Vec::with_capacity(plans.len());
    for (index, args) in plans.iter().enumerate() {
        slow.push(Slow::spawn(attack, index + 1, args, out)?);
    }
    let goal = most(attack.target());
    let mut ramp_reached = false;
    let ramp_deadline = started + RAMP_LIMIT;
    while Instant::now() < ramp_deadline {
        let connected: u64 = slow.iter().map(Slow::connected_now).sum();
        if connected >= goal {
            ramp_reached = true;
            break;
        }
        if slow.iter_mut().all(Slow::has_exited) {
            break;
        }
        tokio::time::sleep(RAMP_POLL).await;
    }
    let ramp = started.elapsed();

    let window_start = Instant::now();
    let (requests, samples) = tokio::join!(
        normal_client(addr, options),
        sample_connections(admin, window_start + options.window)
    );
    let window_end = Instant::now();

    let mut processes = Vec::with_capacity(slow.len());
    for process in slow {
        processes.push(process.stop().await);
    }
    let after = scrape(admin).await?;

    let signalled = Instant::now();
    server.signal(Signal::SIGTERM)?;
    let ended = server.wait_exit(signalled, EXIT_LIMIT).await;

    let window = (
        (window_start - started).as_secs_f64(),
        (window_end - started).as_secs_f64(),
    );
    let (samples, failed_scrapes) = samples;
    let mut held = held(&processes, window, &samples);
    held.failed_scrapes = failed_scrapes;
    Ok(AttackReport {
        attack,
        target: attack.target(),
        processes,
        held,
        ramp,
        ramp_reached,
        redirects: summarize(&requests, Kind::Redirect),
        creations: summarize(&requests, Kind::Creation),
        counters: counters(&before, &after),
        ended,
        requests,
    })
}

/// The address of the server's admin listener (`/metrics`), from its
/// `admin endpoints on http://ADDR` log line: the harness starts it on port
/// 0 (see [`Spec::args`]).
///
/// # Errors
/// If the line is not in the log within a few seconds.
pub async fn admin_addr(server: &Replica) -> anyhow::Result<SocketAddr> {
    let deadline = Instant::now() + ADMIN_LOG_LIMIT;
    loop {
        let log = std::fs::read_to_string(server.log()).unwrap_or_default();
        if let Some(addr) = log.lines().find_map(admin_line) {
            return Ok(addr);
        }
        if Instant::now() >= deadline {
            bail!(
                "{} logged no `admin endpoints on http://ADDR` line (see {})",
                server.name,
                server.log().display()
            );
        }
        tokio::time::sleep(RAMP_POLL).await;
    }
}

/// The address in an `admin endpoints on http://ADDR` log line.
fn admin_line(line: &str) -> Option<SocketAddr> {
    line.split("admin endpoints on http://")
        .nth(1)?
        .split(|c: char| c.is_whitespace() || c == '"')
        .next()?
        .parse()
        .ok()
}

/// `target × MOST`, rounded up.
fn most(target: u32) -> u64 {
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let goal = (f64::from(target) * MOST).ceil() as u64;
    goal
}

/// The slowhttptest command lines (arguments) of `attack` against `addr`,
/// one per process: the target split into shares of at most
/// [`PER_PROCESS`]; each process opens `share × RATE_OVERSHOOT ÷ 10 s`
/// connections a second (`-r`), so that about its share is open at once
/// while lameduck closes each after [`SERVER_READ_TIMEOUT_SECS`], for `-l`
/// seconds, and `-c` is what it opens in that time.
pub fn plan(attack: Attack, addr: SocketAddr, window: Duration) -> Vec<Vec<String>> {
    let target = attack.target();
    let processes = target.div_ceil(PER_PROCESS);
    let length = (RAMP_LIMIT + window + ATTACK_SLACK).as_secs_f64().ceil();
    (0..processes)
        .map(|index| {
            let share = target / processes + u32::from(index < target % processes);
            let rate = (f64::from(share) * RATE_OVERSHOOT / SERVER_READ_TIMEOUT_SECS).ceil();
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let (rate, length) = (rate as u32, length as u32);
            let mut args: Vec<String> = Vec::new();
            if attack.slow_body() {
                args.extend(["-B", "-t", "POST", "-f", "application/json"].map(String::from));
            } else {
                args.push("-H".to_owned());
            }
            args.extend([
                "-u".to_owned(),
                format!("http://{addr}/api/links"),
                "-c".to_owned(),
                (rate * length).to_string(),
                "-r".to_owned(),
                rate.to_string(),
                "-i".to_owned(),
                FOLLOWUP_INTERVAL_SECS.to_string(),
            ]);
            if attack.slow_body() {
                args.extend(["-s".to_owned(), CONTENT_LENGTH.to_string()]);
            }
            args.extend([
                "-l".to_owned(),
                length.to_string(),
                "-g".to_owned(),
                "-o".to_owned(),
                format!("logs/{}-slowhttptest-{}", attack.name(), index + 1),
            ]);
            args
        })
        .collect()
}

// === impl Slow ===

/// One running slowhttptest process.
struct Slow {
    child: Child,
    pid: Option<i32>,
    command: String,
    log: PathBuf,
    csv: PathBuf,
    exited: Option<ExitStatus>,
}

impl Slow {
    /// Starts `slowhttptest ARGS` in `out` (its `-o` paths are relative to
    /// it), its output into `logs/NAME-slowhttptest-INDEX.log`. Killed if
    /// dropped.
    fn spawn(attack: Attack, index: usize, args: &[String], out: &Path) -> anyhow::Result<Slow> {
        let stem = format!("logs/{}-slowhttptest-{index}", attack.name());
        let log = out.join(format!("{stem}.log"));
        let file = std::fs::File::create(&log)
            .with_context(|| format!("cannot create {}", log.display()))?;
        let child = Command::new("slowhttptest")
            .args(args)
            .current_dir(out)
            .stdin(Stdio::null())
            .stdout(Stdio::from(file.try_clone()?))
            .stderr(Stdio::from(file))
            .kill_on_drop(true)
            .spawn()
            .context(
                "cannot start slowhttptest (scripts/install-test-deps.sh abuse installs it)",
            )?;
        Ok(Slow {
            pid: child.id().and_then(|pid| i32::try_from(pid).ok()),
            child,
            command: format!("slowhttptest {}", args.join(" ")),
            log,
            csv: out.join(format!("{stem}.csv")),
            exited: None,
        })
    }

    /// Connected sockets in the last second its CSV has (0 before it has
    /// one).
    fn connected_now(&self) -> u64 {
        let text = std::fs::read_to_string(&self.csv).unwrap_or_default();
        parse_csv(&text)
            .last()
            .map_or(0, |(_, connected)| *connected)
    }

    fn has_exited(&mut self) -> bool {
        if self.exited.is_none() {
            self.exited = self.child.try_wait().ok().flatten();
        }
        self.exited.is_some()
    }

    /// SIGINT (it closes its sockets and prints its final report), SIGKILL
    /// after [`STOP_GRACE`]; then reads what it printed.
    async fn stop(mut self) -> SlowReport {
        if !self.has_exited() {
            if let Some(pid) = self.pid {
                let _ = kill(Pid::from_raw(pid), Signal::SIGINT);
            }
        }
        let status = match self.exited {
            Some(status) => Some(status),
            None => match tokio::time::timeout(STOP_GRACE, self.child.wait()).await {
                Ok(status) => status.ok(),
                Err(_) => {
                    let _ = self.child.start_kill();
                    self.child.wait().await.ok()
                }
            },
        };
        let exit = status.map_or_else(|| "?".to_owned(), |status| describe_exit(&status));
        let printed = std::fs::read_to_string(&self.log).unwrap_or_default();
        let parsed = parse_output(&strip_ansi(&printed));
        SlowReport {
            command: self.command,
            exit,
            exit_status: parsed.exit_status,
            lowered_to: parsed.lowered_to,
            printed: parsed.statuses,
            per_second: parse_csv(&std::fs::read_to_string(&self.csv).unwrap_or_default()),
        }
    }
}

fn describe_exit(status: &ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => code.to_string(),
        (None, Some(signal)) => Signal::try_from(signal)
            .map_or_else(|_| format!("signal {signal}"), |s| s.as_str().to_owned()),
        (None, None) => "?".to_owned(),
    }
}

// === the normal client ===

/// Open loop: request *i* of each kind is due at *start + i ÷ rate* whether
/// or not earlier ones have answered (creations half a period after
/// redirects), each on a new connection, for `--window`; latency counts
/// from when it was due, so a stall shows as latency, not as fewer
/// requests.
async fn normal_client(addr: SocketAddr, options: &Options) -> Vec<Record> {
    let window_ms = u64::try_from(options.window.as_millis()).unwrap_or(u64::MAX);
    let per_kind = u64::from(options.rate).saturating_mul(window_ms) / 1000;
    let period = Duration::from_secs(1) / options.rate;
    let redirect = Arc::new(raw::get(&format!("/{LINK_CODE}")));
    let start = Instant::now();
    let mut due: Vec<(Duration, Kind, u64)> = (0..per_kind)
        .flat_map(|i| {
            let at = period * u32::try_from(i).unwrap_or(u32::MAX);
            [
                (at, Kind::Redirect, i),
                (at + period / 2, Kind::Creation, i),
            ]
        })
        .collect();
    due.sort_by_key(|(at, _, _)| *at);
    let mut tasks = JoinSet::new();
    for (at, kind, i) in due {
        tokio::time::sleep_until(start + at).await;
        let request = match kind {
            Kind::Redirect => Arc::clone(&redirect),
            Kind::Creation => Arc::new(raw::post_json(
                "/api/links",
                &format!(r#"{{"url":"https://example.com/normal/{i}"}}"#),
            )),
        };
        let timeout = options.timeout;
        tasks.spawn(async move {
            let due = start + at;
            let answer = tokio::time::timeout_at(due + timeout, async {
                let mut conn = RawConn::connect(addr).await?;
                conn.exchange(&request).await
            })
            .await;
            let fate = match answer {
                Ok(Ok(head)) => Fate::of_status(head.status, kind.expected()),
                Ok(Err(error)) => Fate::of_io(&error).unwrap_or(Fate::OtherError),
                Err(_) => Fate::Timeout,
            };
            Record {
                kind,
                due_ms: at.as_secs_f64() * 1e3,
                latency_ms: due.elapsed().as_secs_f64() * 1e3,
                fate,
            }
        });
    }
    let mut records = Vec::new();
    while let Some(done) = tasks.join_next().await {
        match done {
            Ok(record) => records.push(record),
            Err(error) => {
                eprintln!("load abuse: a request task failed: {error}");
                records.push(Record {
                    kind: Kind::Redirect,
                    due_ms: 0.0,
                    latency_ms: 0.0,
                    fate: Fate::OtherError,
                });
            }
        }
    }
    records.sort_by(|a, b| a.due_ms.total_cmp(&b.due_ms));
    records
}

/// `lameduck_connections_open` (every protocol) every [`SAMPLE_EVERY`]
/// until `until`; a scrape that fails is counted, not fatal (the admin
/// listener failing under the attack is a finding).
async fn sample_connections(addr: SocketAddr, until: Instant) -> (Vec<i64>, usize) {
    let open = metric("connections_open");
    let mut samples = Vec::new();
    let mut failed = 0;
    while Instant::now() < until {
        match scrape(addr).await {
            #[allow(clippy::cast_possible_truncation)]
            Ok(metrics) => samples.push(sum_of(&metrics, &open) as i64),
            Err(_) => failed += 1,
        }
        tokio::time::sleep(SAMPLE_EVERY.min(until.saturating_duration_since(Instant::now()))).await;
    }
    (samples, failed)
}

/// `GET /metrics` on a new connection, parsed.
async fn scrape(addr: SocketAddr) -> anyhow::Result<BTreeMap<String, f64>> {
    let answer = tokio::time::timeout(SCRAPE_TIMEOUT, async {
        let mut conn = RawConn::connect(addr).await?;
        conn.exchange_body(&raw::get("/metrics")).await
    })
    .await
    .context("GET /metrics timed out")?
    .context("GET /metrics failed")?;
    let (head, body) = answer;
    if head.status != 200 {
        bail!("GET /metrics answered {}", head.status);
    }
    Ok(parse_metrics(&String::from_utf8_lossy(&body)))
}

// === figures ===

fn summarize(records: &[Record], kind: Kind) -> KindSummary {
    let mut latency = report::histogram();
    let mut summary = KindSummary::default();
    for record in records.iter().filter(|r| r.kind == kind) {
        summary.requests += 1;
        if record.fate == Fate::Success {
            summary.succeeded += 1;
            report::record(
                &mut latency,
                Duration::from_secs_f64(record.latency_ms / 1e3),
            );
        } else {
            *summary
                .failures
                .entry(record.fate.as_str().to_owned())
                .or_default() += 1;
        }
    }
    #[allow(clippy::cast_precision_loss)]
    if summary.requests > 0 {
        summary.success_percent = summary.succeeded as f64 * 100.0 / summary.requests as f64;
    }
    summary.latency = Latency::of(&latency);
    summary
}

/// Sums the processes' counts second by second; `window` is the
/// measurement, in seconds since the attack started.
fn held(processes: &[SlowReport], window: (f64, f64), server: &[i64]) -> Held {
    let mut per_second: BTreeMap<u32, u64> = BTreeMap::new();
    let mut printed: BTreeMap<u32, u64> = BTreeMap::new();
    let mut held = Held::default();
    for process in processes {
        for (second, connected) in &process.per_second {
            *per_second.entry(*second).or_default() += connected;
        }
        for status in &process.printed {
            *printed.entry(status.second).or_default() += status.connected;
            held.probe_reports += 1;
            held.probe_unavailable += usize::from(!status.available);
        }
    }
    held.peak_printed = printed.values().copied().max().unwrap_or(0);
    held.peak = per_second
        .values()
        .copied()
        .max()
        .unwrap_or(0)
        .max(held.peak_printed);
    let in_window: Vec<u64> = per_second
        .iter()
        .filter(|(second, _)| {
            let second = f64::from(**second);
            second >= window.0.floor() && second <= window.1.ceil()
        })
        .map(|(_, connected)| *connected)
        .collect();
    held.window_min = in_window.iter().copied().min().unwrap_or(0);
    held.window_max = in_window.iter().copied().max().unwrap_or(0);
    held.server_min = server.iter().copied().min().unwrap_or(0);
    held.server_max = server.iter().copied().max().unwrap_or(0);
    held
}

fn counters(before: &BTreeMap<String, f64>, after: &BTreeMap<String, f64>) -> Counters {
    let delta = |name: &str| {
        after.get(name).copied().unwrap_or(0.0) - before.get(name).copied().unwrap_or(0.0)
    };
    let requests = format!("{}{{", metric("http_requests_total"));
    let mut http_errors = Vec::new();
    for (series, value) in after {
        let Some(labels) = series.strip_prefix(requests.as_str()) else {
            continue;
        };
        let status = label(labels, "status").unwrap_or_default();
        if status != "4xx" && status != "5xx" {
            continue;
        }
        let grew = value - before.get(series).copied().unwrap_or(0.0);
        if grew > 0.0 {
            let route = label(labels, "route").unwrap_or_default();
            http_errors.push((format!("{route} {status}"), grew));
        }
    }
    Counters {
        shed: delta(&metric("requests_shed_total")),
        timed_out: delta(&metric("requests_timed_out_total")),
        http_errors,
    }
}

/// The value of `name="…"` in a label set.
fn label<'a>(labels: &'a str, name: &str) -> Option<&'a str> {
    let start = labels.find(&format!("{name}=\""))? + name.len() + 2;
    let rest = &labels[start..];
    Some(&rest[..rest.find('"')?])
}

/// The sum of every series of metric `name`.
fn sum_of(metrics: &BTreeMap<String, f64>, name: &str) -> f64 {
    metrics
        .iter()
        .filter(|(series, _)| {
            series.as_str() == name
                || series
                    .strip_prefix(name)
                    .is_some_and(|rest| rest.starts_with('{'))
        })
        .map(|(_, value)| value)
        .sum()
}

// === parsing ===

/// Prometheus or OpenMetrics text: series (name and labels) → value.
fn parse_metrics(text: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            Some((series.to_owned(), value.parse().ok()?))
        })
        .collect()
}

/// `text` without its ANSI escape sequences (slowhttptest colours its
/// output and clears the screen before each report).
fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c != '\u{1b}' {
            out.push(c);
            continue;
        }
        if chars.next() == Some('[') {
            // Parameters and intermediates, then one final byte.
            for next in chars.by_ref() {
                if ('@'..='~').contains(&next) {
                    break;
                }
            }
        }
    }
    out
}

/// What slowhttptest printed.
#[derive(Debug, Default, PartialEq, Eq)]
struct Printed {
    statuses: Vec<Status>,
    exit_status: Option<String>,
    lowered_to: Option<u32>,
}

/// Parses slowhttptest's output, colours stripped: its status reports
/// (`slow HTTP test status on 10th second:` then `connected: N` …), its
/// `Exit status:` and a lowered connection target.
fn parse_output(text: &str) -> Printed {
    let mut printed = Printed::default();
    let mut current: Option<Status> = None;
    let number = |rest: &str| rest.trim().parse::<u64>().ok();
    for line in text.lines() {
        let line = line.trim();
        if let Some(rest) = line.strip_prefix("slow HTTP test status on ") {
            printed.statuses.extend(current.take());
            let second = rest
                .trim_end_matches(|c: char| !c.is_ascii_digit())
                .parse()
                .ok();
            current = second.map(|second| Status {
                second,
                ..Status::default()
            });
        } else if let Some(status) = current.as_mut() {
            if let Some(rest) = line.strip_prefix("pending:") {
                status.pending = number(rest).unwrap_or(0);
            } else if let Some(rest) = line.strip_prefix("connected:") {
                status.connected = number(rest).unwrap_or(0);
            } else if let Some(rest) = line.strip_prefix("error:") {
                status.error = number(rest).unwrap_or(0);
            } else if let Some(rest) = line.strip_prefix("closed:") {
                status.closed = number(rest).unwrap_or(0);
            } else if let Some(rest) = line.strip_prefix("service available:") {
                status.available = rest.trim() == "YES";
                printed.statuses.extend(current.take());
            }
        }
        if let Some(rest) = line.split("Exit status:").nth(1) {
            printed.exit_status = Some(rest.trim().to_owned());
        }
        if let Some(rest) = line.split("Decreasing target connection number to").nth(1) {
            printed.lowered_to = rest.trim().parse().ok();
        }
    }
    printed.statuses.extend(current);
    printed
}

/// slowhttptest's CSV (`Seconds,Closed,Pending,Connected,Service
/// Available`): second → connected.
fn parse_csv(text: &str) -> Vec<(u32, u64)> {
    text.lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(',').collect();
            Some((
                fields.first()?.trim().parse().ok()?,
                fields.get(3)?.trim().parse().ok()?,
            ))
        })
        .collect()
}

// === the table ===

/// What failed: one line per problem; empty when the run passed.
pub fn verdict(report: &AbuseReport) -> Vec<String> {
    let mut problems = Vec::new();
    for attack in &report.attacks {
        for (what, kind) in [
            ("redirects", &attack.redirects),
            ("link creations", &attack.creations),
        ] {
            if kind.requests == 0 || kind.succeeded < kind.requests {
                problems.push(format!(
                    "{}: {what} {} of {} succeeded",
                    attack.attack.title(),
                    kind.succeeded,
                    kind.requests
                ));
            }
        }
        if attack.ended.code != Some(0) {
            problems.push(format!(
                "{}: the server exited {} after SIGTERM",
                attack.attack.title(),
                attack.ended.describe()
            ));
        }
    }
    problems
}

/// The Markdown summary: one column per attack.
pub fn summary(report: &AbuseReport) -> String {
    let attacks = &report.attacks;
    let options = &report.options;
    let mut header = vec![String::new()];
    header.extend(attacks.iter().map(|a| a.attack.title()));
    let row = |name: &str, cell: &dyn Fn(&AttackReport) -> String| {
        let mut row = vec![name.to_owned()];
        row.extend(attacks.iter().map(cell));
        row
    };
    let rate = |kind: &KindSummary| format!("**{}**", percent(kind.success_percent));
    let failures = |a: &AttackReport| {
        let mut all: BTreeMap<String, u64> = BTreeMap::new();
        for (class, count) in a.redirects.failures.iter().chain(&a.creations.failures) {
            *all.entry(class.clone()).or_default() += count;
        }
        if all.is_empty() {
            "none".to_owned()
        } else {
            all.iter()
                .map(|(class, count)| format!("{class}: {count}"))
                .collect::<Vec<_>>()
                .join(", ")
        }
    };
    let rows = vec![
        row(
            "attack connections held at once, peak (slowhttptest)",
            &|a| a.held.peak.to_string(),
        ),
        row(
            "… while measuring, min–max (slowhttptest, per second)",
            &|a| format!("{}–{}", a.held.window_min, a.held.window_max),
        ),
        row(
            &format!("`{}` while measuring, min–max", metric("connections_open")),
            &|a| format!("{}–{}", a.held.server_min, a.held.server_max),
        ),
        row("measuring from (attack start +)", &|a| {
            format!("{:.1} s", a.ramp.as_secs_f64())
        }),
        row("redirects `GET /{code}`: 307 / sent", &|a| {
            format!("{} / {}", a.redirects.succeeded, a.redirects.requests)
        }),
        row("redirects: success rate", &|a| rate(&a.redirects)),
        row("redirects: p50 / p99 / max (ms)", &|a| {
            a.redirects.latency.cell()
        }),
        row("link creations `POST /api/links`: 201 / sent", &|a| {
            format!("{} / {}", a.creations.succeeded, a.creations.requests)
        }),
        row("link creations: success rate", &|a| rate(&a.creations)),
        row("link creations: p50 / p99 / max (ms)", &|a| {
            a.creations.latency.cell()
        }),
        row("normal requests failed, by fate", &failures),
        row(&format!("`{}`", metric("requests_shed_total")), &|a| {
            format!("{:.0}", a.counters.shed)
        }),
        row(&format!("`{}`", metric("requests_timed_out_total")), &|a| {
            format!("{:.0}", a.counters.timed_out)
        }),
        row("`http_requests_total` 4xx / 5xx", &|a| {
            if a.counters.http_errors.is_empty() {
                "none".to_owned()
            } else {
                a.counters
                    .http_errors
                    .iter()
                    .map(|(series, count)| format!("`{series}` {count:.0}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        }),
        row("slowhttptest's probe: service available", &|a| {
            format!(
                "{} of {} reports",
                a.held.probe_reports - a.held.probe_unavailable,
                a.held.probe_reports
            )
        }),
        row("**exit code after SIGTERM**", &|a| {
            format!("**{}**", a.ended.describe())
        }),
        row("SIGTERM → exit", &|a| {
            format!("{} ms", fmt_ms(a.ended.after.as_secs_f64() * 1e3))
        }),
    ];

    let mut text = format!(
        "### Abuse: slow bodies and slowloris (slowhttptest) against {SERVICE} with default settings, a normal client alongside, then SIGTERM\n\n{}",
        report::table(&header, &rows)
    );
    let _ = write!(
        text,
        "\nEach attack runs against a fresh `{SERVICE} server` (default settings: `--max-connections` 10000, `--max-concurrent-requests` 1024, `--body-read-timeout` and `--header-read-timeout` 10s; SQLite; port 0). \
         slowhttptest never reopens a connection the server has closed, and {SERVICE} closes a slow one after 10 s, so each process opens {overshoot} × its share ÷ 10 s connections a second (`-r`) for as long as it runs, which holds about its share at once; \
         at most {per} per process, since one process's loop slows down with every socket it has opened. \
         The harness stops it with SIGINT when the measurement ends (`-l` only bounds it). Commands, run in the output folder:\n\n",
        overshoot = RATE_OVERSHOOT,
        per = PER_PROCESS,
    );
    for attack in attacks {
        let first = attack
            .processes
            .first()
            .map_or("–", |process| process.command.as_str());
        let count = attack.processes.len();
        let times = if count == 1 {
            String::new()
        } else {
            format!(" ({count} processes, each like this one, `-o …-1` to `…-{count}`)")
        };
        let _ = writeln!(text, "- {}: `{first}`{times}", attack.attack.title());
    }
    let _ = write!(
        text,
        "\nNormal client: open loop, {rate} req/s each of `GET /{{code}}` (a link created before the attack; 307 expected) and `POST /api/links` (201), every request on a new connection with a {timeout:?} timeout, for {window:?} from the moment slowhttptest reported {most:.0} % of its connections up. \
         Latency counts from when a request was due, connect included; percentiles are of the successful ones. \
         Counters: `/metrics` (on the admin listener, `--admin-listen 127.0.0.1:0`) after the attack minus before it; the 4xx of `/api/links` are the attack's own: slow bodies answered 408 after 10 s, and slowhttptest's probes (`GET /api/links`, 405, one per process every 5 s). \
         `{open}` includes the normal client's connections.\n",
        rate = options.rate,
        timeout = options.timeout,
        window = options.window,
        most = MOST * 100.0,
        open = metric("connections_open"),
    );
    for attack in attacks {
        let mut notes = Vec::new();
        if attack.held.peak < u64::from(attack.target) {
            notes.push(format!(
                "slowhttptest held at most {} of the {} connections asked for",
                attack.held.peak, attack.target
            ));
        } else if attack.held.window_min < most(attack.target) {
            notes.push(format!(
                "slowhttptest held as few as {} connections in a second of the measurement",
                attack.held.window_min
            ));
        }
        if !attack.ramp_reached {
            notes.push(format!(
                "the measurement started after {:?} without {:.0} % of the connections up",
                RAMP_LIMIT,
                MOST * 100.0
            ));
        }
        for process in &attack.processes {
            if let Some(lowered) = process.lowered_to {
                notes.push(format!(
                    "a slowhttptest process lowered its connection count to {lowered} for lack of file descriptors"
                ));
            }
            if process.exit != "0" {
                notes.push(format!("a slowhttptest process exited {}", process.exit));
            }
        }
        if attack.held.failed_scrapes > 0 {
            notes.push(format!(
                "{} reads of `/metrics` failed during the measurement",
                attack.held.failed_scrapes
            ));
        }
        if attack.ended.killed {
            notes.push("the server had to be killed".to_owned());
        }
        if !notes.is_empty() {
            let _ = writeln!(
                text,
                "\n**{}: {}.**",
                attack.attack.title(),
                notes.join("; ")
            );
        }
    }
    let _ = write!(
        text,
        "\nMachine: {}\n\nCommand: `{}`\n",
        report.machine.line(),
        report.machine.command
    );
    text
}

fn percent(value: f64) -> String {
    if (value - 100.0).abs() < f64::EPSILON {
        "100 %".to_owned()
    } else {
        format!("{value:.2} %")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PRINTED: &str = "Mon Nov 23 06:14:46 2026:\u{1b}[H\u{1b}[2JMon Nov 23 06:14:46 2026:\n\
        \t\u{1b}[1;36mslowhttptest version 1.8.2\n\
        \u{1b}[0;34mnumber of connections:\u{1b}[1;34m            300\n\
        \u{1b}[0mMon Nov 23 06:14:46 2026:\u{1b}[1;32m\n\
        slow HTTP test status on \u{1b}[0;32m5\u{1b}[1;32mth second:\n\n\
        \u{1b}[1;32minitializing:\u{1b}[1;32m        0\n\
        \u{1b}[1;32mpending:     \u{1b}[1;32m        2\n\
        \u{1b}[1;32mconnected:   \u{1b}[1;32m        298\n\
        \u{1b}[1;32merror:       \u{1b}[1;32m        0\n\
        \u{1b}[1;32mclosed:      \u{1b}[1;32m        7\n\
        \u{1b}[1;32mservice available:\u{1b}[1;32m   \u{1b}[1;32mYES\u{1b}[0m\n\
        \u{1b}[0mMon Nov 23 06:14:54 2026:\u{1b}[0;36m\n\
        Test ended on 13th second\n\
        Exit status:\u{1b}[1;36m No open connections left\n";

    #[test]
    fn slowhttptest_output_is_read_without_its_colours() {
        let printed = parse_output(&strip_ansi(PRINTED));
        assert_eq!(
            printed.statuses,
            vec![Status {
                second: 5,
                pending: 2,
                connected: 298,
                closed: 7,
                error: 0,
                available: true,
            }]
        );
        assert_eq!(
            printed.exit_status.as_deref(),
            Some("No open connections left")
        );
        assert_eq!(printed.lowered_to, None);
    }

    #[test]
    fn a_lowered_target_is_noticed() {
        let text =
            " hit system limit for open fds: 1024. \nDecreasing target connection number to 1018\n";
        assert_eq!(parse_output(text).lowered_to, Some(1018));
    }

    #[test]
    fn slowhttptest_csv_gives_connected_per_second() {
        let csv = "Seconds,Closed,Pending,Connected,Service Available\n0,0,1,0,300\n1,0,1,96,300\n11,95,0,205,300\n";
        assert_eq!(parse_csv(csv), vec![(0, 0), (1, 96), (11, 205)]);
    }

    #[test]
    fn the_admin_address_is_found_in_text_and_json_lines() {
        let text =
            "2026-11-23T06:14:38Z  INFO lameduck::app: admin endpoints on http://127.0.0.1:4242";
        assert_eq!(
            admin_line(text),
            Some(SocketAddr::from(([127, 0, 0, 1], 4242)))
        );
        let json = r#"{"message":"admin endpoints on http://127.0.0.1:4243","level":"INFO"}"#;
        assert_eq!(
            admin_line(json),
            Some(SocketAddr::from(([127, 0, 0, 1], 4243)))
        );
        assert_eq!(admin_line("listening on http://127.0.0.1:1"), None);
    }

    #[test]
    fn metrics_are_parsed_and_summed() {
        let open = metric("connections_open");
        let requests = metric("http_requests_total");
        let text = format!(
            "# TYPE {open} gauge\n\
            {open}{{protocol=\"pending\"}} 3\n\
            {open}{{protocol=\"http1\"}} 1100\n\
            {open}_other 7\n\
            {requests}{{route=\"/api/links\",status=\"4xx\"}} 12\n\
            # EOF\n"
        );
        let metrics = parse_metrics(&text);
        assert!((sum_of(&metrics, &open) - 1103.0).abs() < 1e-9);
        let before = BTreeMap::new();
        let counted = counters(&before, &metrics);
        assert_eq!(
            counted.http_errors,
            vec![("/api/links 4xx".to_owned(), 12.0)]
        );
    }

    #[test]
    fn the_plan_splits_5000_into_shares_that_hold_it() {
        let addr = SocketAddr::from(([127, 0, 0, 1], 8080));
        let plans = plan(Attack::SlowBody5000, addr, Duration::from_secs(15));
        assert_eq!(plans.len(), 5);
        let joined = plans[0].join(" ");
        assert!(
            joined.starts_with("-B -t POST -f application/json -u http://127.0.0.1:8080/api/links -c 5000 -r 125 -i 2 -s 8192 -l 40"),
            "{joined}"
        );
        let loris = plan(Attack::Slowloris5000, addr, Duration::from_secs(15));
        assert!(loris[0].join(" ").starts_with("-H -u "));
        assert_eq!(
            plan(Attack::SlowBody1100, addr, Duration::from_secs(15)).len(),
            1
        );
    }
}
