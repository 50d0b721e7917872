//! The HTTP/2 part (`--parts h2`): HTTP/2 with prior knowledge (h2c),
//! driven by `h2load` from nghttp2, in three shapes: one connection with
//! 100 concurrent streams, one with 10 (a client that multiplexes a few
//! calls over one connection, as gRPC clients do), and 64 connections with
//! 10 each; `GET /healthz` and the counted redirect `GET /{code}`.
//!
//! The servers take turns as in the other parts: lameduck, the minimal
//! axum app (the headline baseline), and the same minimal app with
//! `TCP_NODELAY` set on every connection (axum's `ListenerExt::tap_io`), as
//! lameduck sets it. With many streams on one connection the socket option
//! decides how responses reach the wire: without it the kernel holds small
//! writes back while earlier ones are unacknowledged (Nagle's algorithm)
//! and sends them together; with it every response is a packet of its own.
//!
//! Every run reads the server's CPU time and h2load's around it, as the
//! HTTP/1.1 parts do: CPU a request prices the server alone.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context};
use serde::Serialize;

use super::stats::{fmt_ratios, paired_ratio, paired_ratios, verdict};
use super::table::series_table;
use super::{stop, Bench, BenchReport, CpuMark, Harness, Run, Series, LAMEDUCK, MINIMAL_AXUM};
use crate::report::fmt_ms;
use crate::SERVICE;

/// The minimal axum app with `TCP_NODELAY` on its connections.
pub(super) const MINIMAL_NODELAY: &str = "minimal axum app + TCP_NODELAY";

/// `(connections, concurrent streams on each)`.
pub(super) const SHAPES: [(u32, u32); 3] = [(1, 100), (1, 10), (64, 10)];

/// The target of lameduck ÷ the minimal axum app over HTTP/2.
const H2_TARGET: f64 = 0.85;

/// One route in one shape: every server's runs.
#[derive(Clone, Debug, Serialize)]
pub struct H2Case {
    /// `GET /healthz` or `GET /{code}`.
    pub route: String,
    /// Connections.
    pub connections: u32,
    /// Concurrent streams on each.
    pub streams: u32,
    /// lameduck, the minimal axum app, the minimal app with `TCP_NODELAY`.
    pub series: Vec<Series>,
}

impl Bench<'_> {
    /// Every route in every shape, the servers taking turns.
    pub(super) async fn h2(&self) -> anyhow::Result<Vec<H2Case>> {
        eprintln!("load: HTTP/2 (h2c) with h2load");
        let b = self.binaries;
        let mut service = self
            .start(
                &format!("h2-{SERVICE}"),
                &self.spec(&b.service, &format!("h2-{SERVICE}"), &[]),
                "/readyz",
            )
            .await?;
        let mut minimal = self
            .start(
                "h2-minimal",
                &self.spec(&b.minimal_axum, "h2-minimal", &[]),
                "/readyz",
            )
            .await?;
        let mut nodelay_spec = self.spec(&b.minimal_axum, "h2-nodelay", &[]);
        nodelay_spec
            .env
            .push((crate::baseline::NODELAY_ENV.to_owned(), "1".to_owned()));
        let mut nodelay = self.start("h2-nodelay", &nodelay_spec, "/readyz").await?;
        let servers = [
            (LAMEDUCK, service.addr, service.pid()),
            (MINIMAL_AXUM, minimal.addr, minimal.pid()),
            (MINIMAL_NODELAY, nodelay.addr, nodelay.pid()),
        ];
        for replica in [&service, &minimal, &nodelay] {
            self.create_links(replica).await?;
        }
        let links: Vec<String> = (0..self.options.links)
            .map(|n| format!("/bench-{n}"))
            .collect();
        let routes = [
            ("GET /healthz", vec!["/healthz".to_owned()], 200),
            ("GET /{code}", links, 307),
        ];
        let mut cases = Vec::new();
        for (route, paths, expected) in &routes {
            for (connections, streams) in SHAPES {
                let shape = Shape {
                    connections,
                    streams,
                    expected: *expected,
                };
                cases.push(self.h2_case(&servers, route, paths, shape).await?);
            }
        }
        for replica in [&mut service, &mut minimal, &mut nodelay] {
            stop(replica).await;
        }
        Ok(cases)
    }

    /// Every server's rounds of `route` (`paths`) in `shape`, taking turns.
    async fn h2_case(
        &self,
        servers: &[(&str, SocketAddr, i32)],
        route: &str,
        paths: &[String],
        shape: Shape,
    ) -> anyhow::Result<H2Case> {
        let Shape {
            connections,
            streams,
            ..
        } = shape;
        let mut runs: Vec<Vec<Run>> = vec![Vec::new(); servers.len()];
        for round in 0..self.options.rounds as usize {
            for turn in 0..servers.len() {
                let index = (turn + round) % servers.len();
                let (name, addr, pid) = servers[index];
                let log = self.logs.join(format!("h2load-{index}.tsv"));
                let run = self.h2load(addr, paths, shape, &log, pid).await?;
                eprintln!(
                    "load:   round {}/{} {route} {connections}×{streams} {name}: {:.0} req/s, p50 {} ms, p99 {} ms, server CPU {:.2} µs a request, h2load {:.0} % of a core",
                    round + 1,
                    self.options.rounds,
                    run.rps,
                    fmt_ms(run.p50_ms),
                    fmt_ms(run.p99_ms),
                    run.cpu_us,
                    run.client_busy * 100.0,
                );
                runs[index].push(run);
            }
        }
        Ok(H2Case {
            route: route.to_owned(),
            connections,
            streams,
            series: servers
                .iter()
                .zip(runs)
                .map(|((name, ..), runs)| Series::new(name, runs))
                .collect(),
        })
    }

    /// One measured `h2load` run against `addr`, cycling through `paths`,
    /// after an unmeasured one of `--warmup`; the server (process `pid`)
    /// and h2load priced as [`Bench::rounds`] prices its runs.
    async fn h2load(
        &self,
        addr: SocketAddr,
        paths: &[String],
        shape: Shape,
        log: &Path,
        pid: i32,
    ) -> anyhow::Result<Run> {
        if !self.options.warmup.is_zero() {
            run_h2load(addr, paths, shape, self.options.warmup, log).await?;
        }
        let mark = CpuMark::take(pid, Harness::Children);
        let (stdout, log) = run_h2load(addr, paths, shape, self.options.duration, log).await?;
        let spent = mark.spent();
        let (mut run, answered) = parse(&stdout, &log, shape.expected)?;
        run.cpu_us = spent.server_us_per(answered);
        run.client_busy = spent.load / self.options.duration.as_secs_f64();
        Ok(run)
    }
}

/// Runs `h2load` for `duration` as `shape` says; its summary and its
/// per-request log.
async fn run_h2load(
    addr: SocketAddr,
    paths: &[String],
    shape: Shape,
    duration: Duration,
    log: &Path,
) -> anyhow::Result<(String, String)> {
    // h2load appends to its log.
    match std::fs::remove_file(log) {
        Err(error) if error.kind() != std::io::ErrorKind::NotFound => {
            return Err(error).context("cannot remove the last h2load log");
        }
        _ => {}
    }
    let mut command = tokio::process::Command::new("h2load");
    command
        .arg("--duration")
        .arg(format!("{}ms", duration.as_millis().max(1)))
        .arg("--clients")
        .arg(shape.connections.to_string())
        .arg("--max-concurrent-streams")
        .arg(shape.streams.to_string())
        .arg("--log-file")
        .arg(log)
        .args(paths.iter().map(|path| format!("http://{addr}{path}")))
        .kill_on_drop(true);
    let output = command
        .output()
        .await
        .context("cannot run h2load (scripts/install-test-deps.sh h2load installs it)")?;
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    if !output.status.success() {
        bail!(
            "h2load failed ({}): {stdout}{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let log = std::fs::read_to_string(log).context("cannot read h2load's log")?;
    Ok((stdout, log))
}

/// How `h2load` loads a server, and the status expected.
#[derive(Clone, Copy, Debug)]
struct Shape {
    connections: u32,
    /// Concurrent streams on each connection.
    streams: u32,
    expected: u16,
}

/// A run from `h2load`'s summary (`stdout`) and its per-request log
/// (start µs, status, µs to the end of the response, tab-separated), and
/// how many answers the log holds with the `expected` status.
fn parse(stdout: &str, log: &str, expected: u16) -> anyhow::Result<(Run, u64)> {
    let rps = stdout
        .lines()
        .find_map(|line| {
            let rest = line.strip_prefix("finished in ")?;
            let (_, rate) = rest.split_once(", ")?;
            rate.strip_suffix(" req/s").or_else(|| {
                let (rate, _) = rate.split_once(" req/s")?;
                Some(rate)
            })
        })
        .and_then(|rate| rate.trim().parse::<f64>().ok())
        .with_context(|| format!("no rate in h2load's summary: {stdout}"))?;
    let counter = |label: &str| -> u64 {
        stdout
            .lines()
            .find_map(|line| line.strip_prefix("requests: "))
            .and_then(|line| {
                line.split(", ")
                    .find_map(|part| part.strip_suffix(label)?.trim().parse().ok())
            })
            .unwrap_or(0)
    };
    let errors = counter(" failed") + counter(" errored") + counter(" timeout");
    let mut latencies_us = Vec::new();
    let mut unexpected = 0;
    for line in log.lines() {
        let mut fields = line.split('\t').skip(1);
        let status: Option<u16> = fields.next().and_then(|s| s.parse().ok());
        let micros: Option<f64> = fields.next().and_then(|s| s.parse().ok());
        match (status, micros) {
            (Some(status), Some(micros)) if status == expected => latencies_us.push(micros),
            _ => unexpected += 1,
        }
    }
    if latencies_us.is_empty() {
        bail!("h2load logged no answer {expected}: {stdout}");
    }
    latencies_us.sort_by(f64::total_cmp);
    let at = |q: f64| {
        let rank = ((latencies_us.len() - 1) as f64 * q).round() as usize;
        latencies_us[rank] / 1000.0
    };
    let run = Run {
        rps,
        p50_ms: at(0.50),
        p99_ms: at(0.99),
        unexpected,
        errors,
        cpu_us: f64::NAN,
        client_busy: f64::NAN,
    };
    Ok((run, latencies_us.len() as u64))
}

/// The HTTP/2 section: one table per route and shape, the headline
/// lameduck ÷ the minimal axum app, and ÷ the same app with `TCP_NODELAY`.
pub(super) fn h2_summary(report: &BenchReport, footer: &str) -> String {
    let o = &report.options;
    let mut text = format!(
        "### HTTP/2 with prior knowledge (h2c), `h2load`, {} rounds of {:?} (+{:?} warm-up), servers taking turns\n\n",
        o.rounds, o.duration, o.warmup
    );
    for case in &report.h2 {
        let [service, minimal, nodelay] = case.series.as_slice() else {
            continue;
        };
        let ratios = paired_ratios(&service.runs, &minimal.runs, |r| r.rps);
        text.push_str(&format!(
            "#### `{}`, {} connection(s) × {} streams\n\n{}\n\
             **{SERVICE} ÷ minimal axum app, run by run: throughput {} (target ≥ {:.2}: {}), p50 {}, p99 {}**; \
             {SERVICE} ÷ minimal axum app + TCP_NODELAY: throughput {}, p99 {}.\n\n",
            case.route,
            case.connections,
            case.streams,
            series_table(&[service, minimal, nodelay], minimal),
            fmt_ratios(&ratios),
            H2_TARGET,
            verdict(&ratios, H2_TARGET, true),
            paired_ratio(service, minimal, |r| r.p50_ms),
            paired_ratio(service, minimal, |r| r.p99_ms),
            paired_ratio(service, nodelay, |r| r.rps),
            paired_ratio(service, nodelay, |r| r.p99_ms),
        ));
    }
    text.push_str(footer);
    text.push('\n');
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_and_the_log_of_h2load_are_read() {
        let stdout = "starting benchmark...\n\
            finished in 4.00s, 26345.00 req/s, 1.98MB/s\n\
            requests: 105380 total, 105380 started, 105380 done, 105378 succeeded, 1 failed, 1 errored, 0 timeout\n\
            status codes: 105378 2xx, 0 3xx, 0 4xx, 0 5xx\n";
        let log = "1795458706509220\t200\t4000\n\
                   1795458706509265\t200\t1000\n\
                   1795458706509265\t200\t2000\n\
                   1795458706509266\t503\t100\n";
        let (run, answered) = parse(stdout, log, 200).expect("parsed");
        assert_eq!(answered, 3);
        assert!((run.rps - 26345.0).abs() < 1e-9, "{run:?}");
        assert_eq!(run.errors, 2);
        assert_eq!(run.unexpected, 1);
        assert!((run.p50_ms - 2.0).abs() < 1e-9, "{run:?}");
        assert!((run.p99_ms - 4.0).abs() < 1e-9, "{run:?}");
        assert!(parse("no summary", log, 200).is_err());
    }
}
