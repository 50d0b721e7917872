//! The shutdown part (`--parts shutdown`): SIGTERM to exit with `--idle`
//! idle keep-alive connections open and `--drain-delay 0s`, lameduck against
//! the minimal axum app (headline, target ≤ 1.0×, on one core and on all
//! cores), plain `axum::serve`, hyper-util's `GracefulShutdown` and the
//! floor; and RSS per idle connection, from the same runs.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use nix::sys::signal::Signal;
use serde::Serialize;
use tokio::time::Instant;

use super::stats::{fmt_ratios, median, paired_ratios, verdict};
use super::{Bench, BenchReport, Options, MINIMAL_AXUM, NOT_PINNED, PLAIN_AXUM};
use crate::raw;
use crate::replica::Spec;
use crate::report::{self, fmt_ms};
use crate::SERVICE;

/// The headline target of the shutdown part: lameduck ÷ the minimal axum
/// app, SIGTERM to exit.
const SHUTDOWN_TARGET: f64 = 1.0;

/// The placement of the shutdown runs that leave the servers unpinned.
pub(super) const ALL_CORES: &str = "all cores";

/// One shutdown run.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct ShutdownRun {
    /// SIGTERM to process exit, ms.
    pub exit_ms: f64,
    /// The exit code.
    pub code: Option<i32>,
    /// RSS before the idle connections, KiB.
    pub rss_before_kib: u64,
    /// RSS with them open, KiB.
    pub rss_open_kib: u64,
    /// (open − before) / connections, bytes.
    pub bytes_per_connection: f64,
}

/// Every shutdown run of one server, and their medians.
#[derive(Clone, Debug, Serialize)]
pub struct ShutdownSeries {
    /// The server.
    pub server: String,
    /// The CPUs it ran on.
    pub placement: String,
    /// One run per round.
    pub runs: Vec<ShutdownRun>,
    /// Median SIGTERM to exit, ms.
    pub exit_ms: f64,
    /// Median bytes per idle connection.
    pub bytes_per_connection: f64,
    /// Median, over the rounds, of this server's exit time less the
    /// floor's in the same round (the faster of bare hyper exiting at once
    /// and `close-floor`), ms: what the server itself adds to the kernel's
    /// work of closing the connections.
    pub above_floor_ms: f64,
}

impl Bench<'_> {
    /// SIGTERM to exit with the idle connections open, for every server
    /// in every placement: on one core (CPU 0) when pinning, then on all
    /// of them.
    pub(super) async fn shutdown(&self) -> anyhow::Result<Vec<ShutdownSeries>> {
        let mut all = Vec::new();
        for (placement, cpus) in self.placements() {
            all.extend(self.shutdown_on(&placement, cpus).await?);
        }
        Ok(all)
    }

    /// Every server's rounds on `placement` (`cpus`), taking turns, and
    /// their series, with each one's time above the floor.
    async fn shutdown_on(
        &self,
        placement: &str,
        cpus: Option<String>,
    ) -> anyhow::Result<Vec<ShutdownSeries>> {
        let idle = usize::try_from(self.options.idle).unwrap_or(10_000);
        eprintln!(
            "load: SIGTERM to exit with {idle} idle keep-alive connections, servers on {placement}"
        );
        let servers = self.shutdown_servers(idle, &cpus);
        let tag = if cpus.is_some() { "sd1" } else { "sdn" };
        let mut runs: Vec<Vec<ShutdownRun>> = vec![Vec::new(); servers.len()];
        let rounds = self.options.rounds.min(5) as usize;
        for round in 0..rounds {
            for turn in 0..servers.len() {
                let index = (turn + round) % servers.len();
                let (name, spec) = &servers[index];
                let label = format!("{tag}-{index}-{round}");
                // The no-server process, the last, answers one request per
                // connection: no warm-up traffic for it.
                let warm_up = index + 1 < servers.len();
                let run = match self.shutdown_run(name, spec, &label, idle, warm_up).await {
                    Ok(run) => run,
                    // A connect refused or reset once in 10,000 (a table
                    // full for a moment) is the machine's, not the server's:
                    // the run is made again, with a fresh process, once.
                    Err(error) => {
                        eprintln!(
                            "load:   round {}/{rounds} {name}: {error:#}; run again",
                            round + 1
                        );
                        let again = format!("{label}-again");
                        self.shutdown_run(name, spec, &again, idle, warm_up).await?
                    }
                };
                eprintln!(
                    "load:   round {}/{rounds} {name}: exit {} after {} ms; RSS {} → {} KiB, {:.0} B per connection",
                    round + 1,
                    run.exit,
                    fmt_ms(run.run.exit_ms),
                    run.run.rss_before_kib,
                    run.run.rss_open_kib,
                    run.run.bytes_per_connection
                );
                runs[index].push(run.run);
                // Let the closed sockets leave TIME_WAIT-heavy tables settle.
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
        // The floor: the faster, round by round, of the last two, which do
        // nothing but close.
        let floor = match runs.as_slice() {
            [.., bare, none] => round_floors(bare, none),
            _ => Vec::new(),
        };
        Ok(servers
            .iter()
            .zip(runs)
            .map(|((name, _), runs)| ShutdownSeries {
                server: name.clone(),
                placement: placement.to_owned(),
                exit_ms: median(runs.iter().map(|r| r.exit_ms)),
                bytes_per_connection: median(runs.iter().map(|r| r.bytes_per_connection)),
                above_floor_ms: median(runs.iter().zip(&floor).map(|(r, f)| r.exit_ms - f)),
                runs,
            })
            .collect())
    }

    /// The servers of the shutdown part, in the order of its table, on
    /// `cpus`, with room for `idle` connections: lameduck, the minimal
    /// axum app, plain `axum::serve`, hyper-util's `GracefulShutdown`, then
    /// the two floors (bare hyper exiting at once, and no server).
    fn shutdown_servers(&self, idle: usize, cpus: &Option<String>) -> Vec<(String, Spec)> {
        let b = self.binaries;
        // Room for the idle connections and the harness's own probes.
        let limit = (idle + 1000).to_string();
        let mut graceful = self.bare_spec();
        graceful.args.insert(0, "--graceful".into());
        let max = ["--max-connections", &limit];
        let service_args = ["--drain-delay", "0s", "--max-connections", &limit];
        let floor = Spec {
            program: b.close_floor.clone(),
            args: vec!["127.0.0.1:0".into()],
            env: Vec::new(),
            cpus: None,
        };
        let mut servers = vec![
            (
                format!("{SERVICE} --drain-delay 0s"),
                self.spec(&b.service, &format!("sd-{SERVICE}"), &service_args),
            ),
            (
                MINIMAL_AXUM.to_owned(),
                self.spec(&b.minimal_axum, "sd-minimal", &max),
            ),
            (
                PLAIN_AXUM.to_owned(),
                self.spec(&b.plain_axum, "sd-plain", &max),
            ),
            ("hyper-util GracefulShutdown".to_owned(), graceful),
            ("bare hyper (exits at once)".to_owned(), self.bare_spec()),
            (
                "no server: shutdown(2) + close(2) from every core".to_owned(),
                floor,
            ),
        ];
        for (_, spec) in &mut servers {
            spec.cpus.clone_from(cpus);
        }
        servers
    }

    /// One run: the server started as `label`, warmed up with a little
    /// traffic (`warm_up`) to settle its allocator, `idle` connections
    /// opened, SIGTERM, and the wait for its exit; RSS before and with the
    /// connections.
    async fn shutdown_run(
        &self,
        name: &str,
        spec: &Spec,
        label: &str,
        idle: usize,
        warm_up: bool,
    ) -> anyhow::Result<Measured> {
        let request = raw::get("/healthz");
        let mut replica = self.start(label, spec, "/healthz").await?;
        if warm_up {
            raw::closed_loop(
                replica.addr,
                Arc::new(vec![request.clone()]),
                200,
                8,
                Duration::from_millis(300),
            )
            .await;
        }
        let rss_before_kib = replica.rss_kib().unwrap_or(0);
        crate::machine::conntrack_room(idle).await;
        let open = raw::open_idle(replica.addr, idle, &request, 256)
            .await
            .with_context(|| format!("{name}: opening {idle} idle connections"))?;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let rss_open_kib = replica.rss_kib().unwrap_or(0);
        let sigterm = Instant::now();
        replica.signal(Signal::SIGTERM)?;
        let ended = replica.wait_exit(sigterm, Duration::from_secs(60)).await;
        drop(open);
        #[allow(clippy::cast_precision_loss)]
        let bytes_per_connection =
            rss_open_kib.saturating_sub(rss_before_kib) as f64 * 1024.0 / idle as f64;
        Ok(Measured {
            run: ShutdownRun {
                exit_ms: ended.after.as_secs_f64() * 1000.0,
                code: ended.code,
                rss_before_kib,
                rss_open_kib,
                bytes_per_connection,
            },
            exit: ended.describe(),
        })
    }
}

/// One shutdown run, and how the process ended, for the progress line.
struct Measured {
    run: ShutdownRun,
    exit: String,
}

/// Round by round, the faster of two processes that do nothing but close
/// their connections: one leaving them to the kernel at exit, one closing
/// them from every core. Either can win a round on a shared machine.
fn round_floors(exit_at_once: &[ShutdownRun], close_only: &[ShutdownRun]) -> Vec<f64> {
    exit_at_once
        .iter()
        .zip(close_only)
        .map(|(a, b)| a.exit_ms.min(b.exit_ms))
        .collect()
}

/// A signed difference in milliseconds: `+12.3`, `−4.56`.
fn fmt_delta_ms(ms: f64) -> String {
    let sign = if ms < 0.0 { '−' } else { '+' };
    format!("{sign}{}", fmt_ms(ms.abs()))
}

/// One placement's shutdown table, and the target's verdict.
fn shutdown_summary(
    o: &Options,
    placement: &str,
    series: &[&ShutdownSeries],
    footer: &str,
) -> String {
    let header: Vec<String> = [
        "server",
        "SIGTERM → exit, median (min–max) ms",
        "above the floor, median ms",
        "exit codes",
        "RSS idle",
        "RSS with connections",
        "RSS per idle connection",
    ]
    .map(str::to_owned)
    .into();
    let rows: Vec<Vec<String>> = series.iter().map(|s| shutdown_row(s)).collect();
    let target = shutdown_target(o, series);
    format!(
        "### Shutdown with {} idle keep-alive HTTP/1.1 connections, `--drain-delay 0s`, servers on {placement}, {} rounds\n\n{}\n\
         {target} RSS per idle connection = (RSS with the connections − RSS before) ÷ {}.\n\n{footer}\n",
        o.idle,
        series.first().map_or(0, |s| s.runs.len()),
        report::table(&header, &rows),
        o.idle,
    )
}

/// One server's row of [`shutdown_summary`].
fn shutdown_row(s: &ShutdownSeries) -> Vec<String> {
    let exits = || s.runs.iter().map(|r| r.exit_ms);
    let min = exits().fold(f64::INFINITY, f64::min);
    let max = exits().fold(0.0, f64::max);
    let codes: Vec<String> = (s.runs.iter())
        .map(|r| {
            r.code
                .map_or_else(|| "signal".to_owned(), |c| c.to_string())
        })
        .collect();
    let mib = |kib: f64| format!("{:.1} MiB", kib / 1024.0);
    vec![
        s.server.clone(),
        format!("{} ({}–{})", fmt_ms(s.exit_ms), fmt_ms(min), fmt_ms(max)),
        fmt_ms(s.above_floor_ms),
        codes.join(" "),
        #[allow(clippy::cast_precision_loss)]
        mib(median(s.runs.iter().map(|r| r.rss_before_kib as f64))),
        #[allow(clippy::cast_precision_loss)]
        mib(median(s.runs.iter().map(|r| r.rss_open_kib as f64))),
        format!("{:.1} KiB", s.bytes_per_connection / 1024.0),
    ]
}

/// The headline under the table: lameduck ÷ the minimal axum app with its
/// verdict, the floor, and each server's time above it.
fn shutdown_target(o: &Options, series: &[&ShutdownSeries]) -> String {
    let [service, minimal, _, graceful, bare, none] = series else {
        return format!(
            "**Target: {SERVICE} ÷ minimal axum app, SIGTERM → exit, ≤ {SHUTDOWN_TARGET:.1}×.**"
        );
    };
    let floor = median(round_floors(&bare.runs, &none.runs).into_iter());
    let beyond_graceful = median(
        service
            .runs
            .iter()
            .zip(&graceful.runs)
            .map(|(l, g)| l.exit_ms - g.exit_ms),
    );
    let ratios = paired_ratios(&service.runs, &minimal.runs, |r| r.exit_ms);
    format!(
        "**Target: {SERVICE} ÷ minimal axum app, SIGTERM → exit, round by round, ≤ {SHUTDOWN_TARGET:.1}×; \
         {SERVICE}: {} ({}), {} ms against {} ms.** The floor is the \
         faster, round by round, of two processes that do nothing but close the {} \
         connections: bare hyper exiting at once, so that the kernel closes them at exit, \
         and no server at all, sending each its FIN (`shutdown(2)`, then `close(2)`) from \
         one thread per core it may use. Median {} ms: the kernel's own cost of closing \
         them (and of the peer's ACK, on loopback). Paired round by round, {SERVICE} takes \
         **{} ms above the floor**, the minimal axum app {} ms; {SERVICE} − hyper-util's \
         `GracefulShutdown`: **{} ms**.",
        fmt_ratios(&ratios),
        verdict(&ratios, SHUTDOWN_TARGET, false),
        fmt_ms(service.exit_ms),
        fmt_ms(minimal.exit_ms),
        o.idle,
        fmt_ms(floor),
        fmt_ms(service.above_floor_ms),
        fmt_ms(minimal.above_floor_ms),
        fmt_delta_ms(beyond_graceful),
    )
}

/// Every placement's shutdown table, in the order they ran.
pub(super) fn shutdown_summaries(report: &BenchReport, footer: &str) -> String {
    let o = &report.options;
    let mut text = String::new();
    let mut placements: Vec<&str> = report
        .shutdown
        .iter()
        .map(|s| s.placement.as_str())
        .collect();
    placements.dedup();
    for placement in placements {
        let series: Vec<&ShutdownSeries> = report
            .shutdown
            .iter()
            .filter(|s| s.placement == placement)
            .collect();
        // The harness stays pinned when the servers get every core.
        let footer = if placement == ALL_CORES && report.placement != NOT_PINNED {
            format!(
                "Machine: {}; servers on all cores, load generator pinned to CPU {}.\n\nCommand: `{}`\n",
                report.machine.line(),
                report.machine.cores.saturating_sub(1),
                report.machine.command
            )
        } else {
            footer.to_owned()
        };
        text.push_str(&shutdown_summary(o, placement, &series, &footer));
    }
    text
}
