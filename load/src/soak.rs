//! `load soak`: lameduck holding many idle connections under sustained
//! load past its concurrency limit, then a SIGTERM. Not part of CI (it
//! takes minutes and most of the machine); a scenario like the others: its
//! table printed, `soak.json` and `summary.md` and the server's log under
//! `--out`, and with `--check` exit 1 unless it held.
//!
//! What it checks: the idle connections do not stop the server from
//! serving; past `--max-concurrent-requests` API requests are shed with
//! 503 rather than queued; health checks are never shed; and the drain
//! still ends cleanly (exit 0) with every connection open.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Args;
use nix::sys::signal::Signal;
use serde::Serialize;
use tokio::time::Instant;

use crate::binaries::Binaries;
use crate::machine::Machine;
use crate::raw::{self, LoopResult, RawConn};
use crate::replica::{Ended, Replica, Spec};
use crate::report::{self, Latency};
use crate::scenario::{Common, Scenario};
use crate::SERVICE;

/// Options of `load soak`.
#[derive(Clone, Debug, Args, Serialize)]
pub struct Options {
    /// Idle keep-alive connections held open for the whole run.
    #[arg(long, default_value_t = 10_000)]
    pub idle: usize,
    /// Connections of the closed-loop load on an API route.
    #[arg(long, default_value_t = 256)]
    pub connections: usize,
    /// The server's `--max-concurrent-requests`: set low so the load is shed.
    #[arg(long, default_value_t = 16)]
    pub max_concurrent_requests: u32,
    /// How long the sustained load runs.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    #[serde(with = "crate::report::millis")]
    pub duration: Duration,
    /// `--check`, `--out`, `--bin-dir`, `--no-install`.
    #[command(flatten)]
    #[serde(flatten)]
    pub common: Common,
}

/// Everything a soak measured.
#[derive(Debug, Serialize)]
pub struct SoakReport {
    /// Where and how.
    pub machine: Machine,
    /// The options.
    pub options: Options,
    /// What the idle connections cost.
    pub idle: Idle,
    /// The API load past the limit.
    pub api: Loop,
    /// The health checks beside it.
    pub health: Loop,
    /// The server's exit after SIGTERM.
    pub ended: Ended,
}

impl Scenario for Options {
    const NAME: &'static str = "soak";
    const PASSED: &'static str = "with every idle connection open the server served, shed \
                                  past its limit rather than queued, refused no health check and \
                                  exited 0";
    const TOOLS: &'static [&'static str] = &[];
    const PICTURE: bool = false;
    type Report = SoakReport;

    fn common(&self) -> &Common {
        &self.common
    }

    async fn run(
        self,
        binaries: &Binaries,
        machine: Machine,
        out: &Path,
    ) -> anyhow::Result<SoakReport> {
        run(self, binaries, machine, out).await
    }

    fn write(report: &SoakReport, out: &Path) -> anyhow::Result<()> {
        report::write_json(&out.join("soak.json"), report)?;
        let summary = out.join("summary.md");
        std::fs::write(&summary, table(report))
            .with_context(|| format!("cannot write {}", summary.display()))
    }

    fn summary(report: &SoakReport) -> String {
        table(report)
    }

    fn verdict(report: &SoakReport) -> Result<(), String> {
        let problems = problems(&report.api, &report.health, &report.ended);
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems.join("; "))
        }
    }
}

/// What `--check` holds against: exit 0 after SIGTERM, no health check
/// refused, no API request failed at the connection level (shed is fine).
fn problems(api: &Loop, health: &Loop, ended: &Ended) -> Vec<String> {
    let mut problems = Vec::new();
    if ended.code != Some(0) {
        problems.push(format!(
            "the server did not drain cleanly (exit {})",
            ended.describe()
        ));
    }
    if health.unexpected > 0 || health.errors > 0 {
        problems.push(format!(
            "health checks were refused under load ({} not 200, {} connection errors)",
            health.unexpected, health.errors
        ));
    }
    if api.errors > 0 {
        problems.push(format!(
            "{} API requests failed at the connection level",
            api.errors
        ));
    }
    problems
}

/// Starts the server, holds the idle connections, runs the load past the
/// limit, then SIGTERM with every connection still open.
async fn run(
    options: Options,
    binaries: &Binaries,
    machine: Machine,
    out: &Path,
) -> anyhow::Result<SoakReport> {
    let logs = out.join("logs");
    std::fs::create_dir_all(&logs).with_context(|| format!("cannot create {}", logs.display()))?;
    let data = tempfile::Builder::new()
        .prefix(&format!("{SERVICE}-soak-"))
        .tempdir()
        .context("cannot create the data directory")?;
    let mut server = start(&options, binaries, data.path(), &logs).await?;
    let (conns, idle) = hold_idle(&server, &options).await?;
    let (api, health) = sustained_load(server.addr, &options).await;
    let signalled = Instant::now();
    server.signal(Signal::SIGTERM)?;
    let ended = server.wait_exit(signalled, EXIT_LIMIT).await;
    drop(conns);
    Ok(SoakReport {
        machine,
        options,
        idle,
        api: Loop::of(&api),
        health: Loop::of(&health),
        ended,
    })
}

/// How long the server may take to answer `/readyz` after its start.
const READY_LIMIT: Duration = Duration::from_secs(30);

/// How long the server may take to exit after SIGTERM before it is killed.
const EXIT_LIMIT: Duration = Duration::from_secs(60);

/// How many idle connections are being opened at once.
const IDLE_CONNECTS_AT_ONCE: usize = 256;

/// Starts the server (its data in `data`, its log in `logs`) with room
/// for every connection and the low concurrency limit, waits for it to be
/// ready and creates the link the load reads.
async fn start(
    options: &Options,
    binaries: &Binaries,
    data: &Path,
    logs: &Path,
) -> anyhow::Result<Replica> {
    let max_connections = options.idle + options.connections + 1_000;
    let spec = Spec {
        program: binaries.service.clone(),
        args: [
            "server",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            &data.display().to_string(),
            "--max-connections",
            &max_connections.to_string(),
            "--max-concurrent-requests",
            &options.max_concurrent_requests.to_string(),
        ]
        .iter()
        .map(Into::into)
        .collect(),
        env: Vec::new(),
        cpus: None,
    };
    let server = Replica::spawn("soak", &spec, &logs.join(format!("soak-{SERVICE}.log"))).await?;
    server.wait_ready("/readyz", READY_LIMIT).await?;
    let mut conn = RawConn::connect(server.addr).await?;
    let created = conn
        .exchange(&raw::post_json(
            "/api/links",
            r#"{"url":"https://example.com/soak","code":"soak"}"#,
        ))
        .await?;
    if created.status != 201 {
        bail!("creating the link answered {}", created.status);
    }
    Ok(server)
}

/// What the idle connections cost.
#[derive(Debug, Serialize)]
pub struct Idle {
    /// How long opening them all took.
    #[serde(with = "crate::report::millis")]
    pub open_time: Duration,
    /// The server's RSS before they were opened, KiB.
    pub rss_before_kib: u64,
    /// With them open, KiB.
    pub rss_idle_kib: u64,
}

impl Idle {
    /// RSS each idle connection added, KiB.
    pub fn per_connection_kib(&self, idle: usize) -> f64 {
        #[allow(clippy::cast_precision_loss)]
        let per = self.rss_idle_kib.saturating_sub(self.rss_before_kib) as f64 / idle.max(1) as f64;
        per
    }
}

/// A closed loop's outcome, for the report.
#[derive(Debug, Serialize)]
pub struct Loop {
    /// Answered as expected (200).
    pub ok: u64,
    /// Answered otherwise (for the API past the limit: shed, 503).
    pub unexpected: u64,
    /// Connection errors.
    pub errors: u64,
    /// Answered as expected, per second.
    pub per_second: f64,
    /// Every answer's latency.
    pub latency: Latency,
}

impl Loop {
    fn of(result: &LoopResult) -> Loop {
        Loop {
            ok: result.ok,
            unexpected: result.unexpected,
            errors: result.errors,
            per_second: result.throughput(),
            latency: Latency::of(&result.latency_us),
        }
    }
}

/// Opens `--idle` keep-alive connections (each after one `/healthz`) and
/// measures what they cost the server; the caller holds them open until
/// the server has exited.
async fn hold_idle(
    server: &Replica,
    options: &Options,
) -> anyhow::Result<(Vec<std::net::TcpStream>, Idle)> {
    let rss_before = server.rss_kib().unwrap_or_default();
    let opened = Instant::now();
    let conns = raw::open_idle(
        server.addr,
        options.idle,
        &raw::get("/healthz"),
        IDLE_CONNECTS_AT_ONCE,
    )
    .await?;
    let open_time = opened.elapsed();
    let idle = Idle {
        open_time,
        rss_before_kib: rss_before,
        rss_idle_kib: server.rss_kib().unwrap_or_default(),
    };
    Ok((conns, idle))
}

/// For `--duration`: closed-loop API reads on `--connections`
/// connections, and health checks on 4 beside them.
async fn sustained_load(addr: SocketAddr, options: &Options) -> (LoopResult, LoopResult) {
    let api = raw::closed_loop(
        addr,
        Arc::new(vec![raw::get("/api/links/soak")]),
        200,
        options.connections,
        options.duration,
    );
    let health = raw::closed_loop(
        addr,
        Arc::new(vec![raw::get("/healthz")]),
        200,
        4,
        options.duration,
    );
    tokio::join!(api, health)
}

/// The table of figures, in Markdown.
fn table(report: &SoakReport) -> String {
    let SoakReport {
        machine,
        options,
        idle,
        api,
        health,
        ended,
    } = report;
    format!(
        "### Soak: {idle_n} idle connections, {conns} connections of load for {secs:?}, --max-concurrent-requests {limit}\n\n\
         | figure | value |\n| --- | ---: |\n\
         | idle connections opened | {idle_n} in {open:.1?} |\n\
         | RSS before / with idle connections | {before} / {with} KiB ({per:.1} KiB each) |\n\
         | API answered 200 | {ok} ({tput:.0} req/s) |\n\
         | API shed (503 + Retry-After) | {shed} |\n\
         | API connection errors | {api_errors} |\n\
         | API latency p50 / p99 / max | {latency} ms |\n\
         | health checks 200 / other / errors | {h_ok} / {h_bad} / {h_err} |\n\
         | exit code after SIGTERM | {exit} |\n\
         | SIGTERM → exit | {drain:.0?} |\n\n\
         Machine: {line}\n\nCommand: `{command}`\n",
        idle_n = options.idle,
        conns = options.connections,
        secs = options.duration,
        limit = options.max_concurrent_requests,
        open = idle.open_time,
        before = idle.rss_before_kib,
        with = idle.rss_idle_kib,
        per = idle.per_connection_kib(options.idle),
        ok = api.ok,
        tput = api.per_second,
        shed = api.unexpected,
        api_errors = api.errors,
        latency = api.latency.cell(),
        h_ok = health.ok,
        h_bad = health.unexpected,
        h_err = health.errors,
        exit = ended.describe(),
        drain = ended.after,
        line = machine.line(),
        command = machine.command,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answered(ok: u64, unexpected: u64, errors: u64) -> Loop {
        Loop {
            ok,
            unexpected,
            errors,
            per_second: 0.0,
            latency: Latency::default(),
        }
    }

    fn exited(code: Option<i32>) -> Ended {
        Ended {
            code,
            signal: None,
            killed: false,
            after: Duration::from_millis(200),
        }
    }

    #[test]
    fn shedding_passes_and_each_failure_is_named() {
        let (shed, healthy) = (answered(10, 500, 0), answered(40, 0, 0));
        assert!(problems(&shed, &healthy, &exited(Some(0))).is_empty());

        let problems = problems(&answered(10, 0, 2), &answered(40, 1, 0), &exited(Some(3)));
        assert_eq!(problems.len(), 3, "{problems:?}");
        assert!(problems[0].contains("exit 3"), "{problems:?}");
        assert!(problems[1].contains("1 not 200"), "{problems:?}");
        assert!(problems[2].starts_with("2 API requests"), "{problems:?}");
    }
}
