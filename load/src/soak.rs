//! `load soak`: lameduck holding many idle connections under sustained
//! load past its concurrency limit, then a SIGTERM. Not part of CI (it
//! takes minutes and most of the machine); it prints its figures.
//!
//! What it checks: the idle connections do not stop the server from
//! serving; past `--max-concurrent-requests` API requests are shed with
//! 503 rather than queued; health checks are never shed; and the drain
//! still ends cleanly (exit 0) with every connection open.

use std::net::SocketAddr;
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Args;
use nix::sys::signal::Signal;
use tokio::time::Instant;

use crate::binaries::Binaries;
use crate::machine::{self, Machine};
use crate::raw::{self, LoopResult, RawConn};
use crate::replica::{Ended, Replica, Spec};
use crate::SERVICE;

/// Options of `load soak`.
#[derive(Clone, Debug, Args)]
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
    pub duration: Duration,
    /// Use the binaries in this folder instead of building them.
    #[arg(long)]
    pub bin_dir: Option<std::path::PathBuf>,
}

/// Runs the soak and prints its table; exit code 1 if a check failed.
pub fn main(options: Options, mut machine: Machine) -> ExitCode {
    let result = (|| -> anyhow::Result<String> {
        let binaries = Binaries::for_run(options.bin_dir.as_deref(), &mut machine)?;
        let runtime = tokio::runtime::Runtime::new().context("cannot start the runtime")?;
        runtime.block_on(run(&options, &binaries, &machine))
    })();
    match result {
        Ok(table) => {
            println!("{table}");
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("load soak: FAILED: {error:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(options: &Options, binaries: &Binaries, machine: &Machine) -> anyhow::Result<String> {
    let data = std::env::temp_dir().join(format!("{SERVICE}-soak-{}", std::process::id()));
    let mut server = start(options, binaries, &data).await?;
    let (conns, idle) = hold_idle(&server, options).await?;
    let (api, health) = sustained_load(server.addr, options).await;
    let signalled = Instant::now();
    server.signal(Signal::SIGTERM)?;
    let ended = server.wait_exit(signalled, EXIT_LIMIT).await;
    let figures = Figures {
        idle: &idle,
        api: &api,
        health: &health,
        ended: &ended,
    };
    let table = table(options, machine, &figures);
    drop(conns);
    let _ = std::fs::remove_dir_all(&data);
    check(&figures, table)
}

/// How long the server may take to answer `/readyz` after its start.
const READY_LIMIT: Duration = Duration::from_secs(30);

/// How long the server may take to exit after SIGTERM before it is killed.
const EXIT_LIMIT: Duration = Duration::from_secs(60);

/// How many idle connections are being opened at once.
const IDLE_CONNECTS_AT_ONCE: usize = 256;

/// Starts the server (its data in `data`, its log in `load/out`) with room
/// for every connection and the low concurrency limit, waits for it to be
/// ready and creates the link the load reads.
async fn start(options: &Options, binaries: &Binaries, data: &Path) -> anyhow::Result<Replica> {
    let logs = machine::workspace_root().join("load/out");
    std::fs::create_dir_all(&logs)?;
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
struct Idle {
    /// How long opening them all took.
    open_time: Duration,
    /// The server's RSS before they were opened and with them open, KiB.
    rss_before: u64,
    /// See `rss_before`.
    rss_idle: u64,
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
        rss_before,
        rss_idle: server.rss_kib().unwrap_or_default(),
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

/// What the soak measured.
struct Figures<'a> {
    /// The idle connections.
    idle: &'a Idle,
    /// The API load.
    api: &'a LoopResult,
    /// The health checks beside it.
    health: &'a LoopResult,
    /// The server's exit after SIGTERM.
    ended: &'a Ended,
}

/// The table of figures, in Markdown.
fn table(options: &Options, machine: &Machine, figures: &Figures<'_>) -> String {
    let Figures {
        idle,
        api,
        health,
        ended,
    } = figures;
    #[allow(clippy::cast_precision_loss)]
    let per_connection =
        (idle.rss_idle.saturating_sub(idle.rss_before)) as f64 / options.idle as f64;
    format!(
        "### Soak: {idle} idle connections, {conns} connections of load for {secs:?}, --max-concurrent-requests {limit}\n\n\
         | figure | value |\n| --- | ---: |\n\
         | idle connections opened | {idle} in {open:.1?} |\n\
         | RSS before / with idle connections | {before} / {with} KiB ({per:.1} KiB each) |\n\
         | API answered 200 | {ok} ({tput:.0} req/s) |\n\
         | API shed (503 + Retry-After) | {shed} |\n\
         | API connection errors | {api_errors} |\n\
         | API latency p50 / p99 / max | {p50:.2} / {p99:.2} / {max:.2} ms |\n\
         | health checks 200 / other / errors | {h_ok} / {h_bad} / {h_err} |\n\
         | exit code after SIGTERM | {exit} |\n\
         | SIGTERM → exit | {drain:.0?} |\n\n\
         Machine: {machine}\n\nCommand: `{command}`\n",
        idle = options.idle,
        conns = options.connections,
        secs = options.duration,
        limit = options.max_concurrent_requests,
        open = idle.open_time,
        before = idle.rss_before,
        with = idle.rss_idle,
        per = per_connection,
        ok = api.ok,
        tput = api.throughput(),
        shed = api.unexpected,
        api_errors = api.errors,
        p50 = api.latency_ms(0.5),
        p99 = api.latency_ms(0.99),
        max = api.latency_ms(1.0),
        h_ok = health.ok,
        h_bad = health.unexpected,
        h_err = health.errors,
        exit = ended.describe(),
        drain = ended.after,
        machine = machine.line(),
        command = std::env::args().collect::<Vec<_>>().join(" "),
    )
}

/// The table if every check passed, else which failed, the table after.
fn check(figures: &Figures<'_>, table: String) -> anyhow::Result<String> {
    let Figures {
        api, health, ended, ..
    } = figures;
    if ended.code != Some(0) {
        bail!(
            "the server did not drain cleanly (exit {})\n{table}",
            ended.describe()
        );
    }
    if health.unexpected > 0 || health.errors > 0 {
        bail!("health checks were refused under load\n{table}");
    }
    if api.errors > 0 {
        bail!("API requests failed at the connection level\n{table}");
    }
    Ok(table)
}
