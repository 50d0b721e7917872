//! The traces part (`--parts traces`): what exporting traces costs.
//! lameduck five ways, taking turns like the other parts: traces off (no
//! OTLP endpoint, the lazy request span, nothing exported), and traces on
//! over OTLP/HTTP and over OTLP/gRPC to receivers in the harness
//! ([`receivers`]: the test kit's, counting), each sampling 1 % of the
//! requests and all of them (`parentbased_traceidratio`), on the counted
//! redirect `GET /{code}` (a server span) and on `GET /api/links/{code}` (a
//! server span and the database read's client span under it; probes such
//! as `/healthz` are never traced). Beside throughput, latency and CPU a
//! request: the spans the receiver got against the requests answered, what
//! the SDK dropped, the server's RSS, and the CPU of the export threads;
//! then instructions per request under callgrind, off against on, and per
//! span.
//!
//! This module runs the servers and reads what they said at exit;
//! [`receivers`] counts what they exported, [`tables`] writes the section.

use std::path::Path;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use anyhow::bail;
use lameduck_testkit::otlp::{Protocol, Received};
use opentelemetry_sdk::trace::{
    OTEL_BSP_MAX_EXPORT_BATCH_SIZE, OTEL_BSP_MAX_EXPORT_BATCH_SIZE_DEFAULT,
    OTEL_BSP_MAX_QUEUE_SIZE, OTEL_BSP_MAX_QUEUE_SIZE_DEFAULT, OTEL_BSP_SCHEDULE_DELAY,
};
use serde::Serialize;

use super::instructions::InstructionSeries;
use super::{stop, Bench, Series, Target, Turn};
use crate::raw;
use crate::replica::{self, Replica};
use crate::SERVICE;
use receivers::Receivers;

mod receivers;
mod tables;

pub(super) use tables::traces_summary;

/// One server of the traces part: how it exports (`None`: traces off),
/// and the ratio of requests it samples.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Flavor {
    /// The OTLP transport.
    pub transport: Option<Protocol>,
    /// `OTEL_TRACES_SAMPLER_ARG` of `parentbased_traceidratio`.
    pub ratio: f64,
}

/// The servers of the traces part, in the order of the tables: off, then
/// each transport sampling 1 % and all.
const FLAVORS: [Flavor; 5] = [
    Flavor::off(),
    Flavor::on(Protocol::HttpProtobuf, 0.01),
    Flavor::on(Protocol::HttpProtobuf, 1.0),
    Flavor::on(Protocol::Grpc, 0.01),
    Flavor::on(Protocol::Grpc, 1.0),
];

/// The rows' names, in the order of [`FLAVORS`].
static NAMES: LazyLock<Vec<String>> =
    LazyLock::new(|| FLAVORS.iter().map(|flavor| flavor.name()).collect());

impl Flavor {
    const fn off() -> Flavor {
        Flavor {
            transport: None,
            ratio: 0.0,
        }
    }

    const fn on(transport: Protocol, ratio: f64) -> Flavor {
        Flavor {
            transport: Some(transport),
            ratio,
        }
    }

    /// Its row's name.
    fn name(self) -> String {
        match self.transport {
            None => format!("{SERVICE}, traces off"),
            Some(Protocol::HttpProtobuf) => {
                format!("{SERVICE}, OTLP/HTTP, sampled {:.2}", self.ratio)
            }
            Some(Protocol::Grpc) => format!("{SERVICE}, OTLP/gRPC, sampled {:.2}", self.ratio),
        }
    }

    /// A short tag for its runs' names.
    fn tag(self) -> String {
        match self.transport {
            None => "off".to_owned(),
            Some(transport) => {
                format!("{}-{}", transport.env_value().replace('/', "-"), self.ratio)
            }
        }
    }

    /// The throughput target against off on `route`, as issue 46 sets it.
    fn target(self, route: &str) -> String {
        match (self.transport, self.ratio >= 1.0, route) {
            (None, ..) => String::new(),
            (Some(_), false, "GET /{code}") => "≥ 0.97".to_owned(),
            (Some(_), true, "GET /{code}") => "≥ 0.80".to_owned(),
            (Some(_), true, _) => "≥ 0.92".to_owned(),
            (Some(_), false, _) => String::new(),
        }
    }
}

/// The batch processor's export interval on the traced servers
/// (`OTEL_BSP_SCHEDULE_DELAY`), down from the SDK's 5 s: a run's last spans
/// reach the receiver a fraction of a second after it ends, so each run's
/// spans are counted before the next turn begins. Under load it changes
/// little: the batch is exported whenever 512 spans are queued.
const SCHEDULE_DELAY: Duration = Duration::from_millis(200);

/// How long the receiver must have taken nothing before a run's spans are
/// counted: a few export intervals, so that a batch the exporter is still
/// sending is not missed.
const SETTLED_AFTER: Duration = Duration::from_millis(600);

/// The longest wait for the receiver to settle after a run.
const SETTLE_BOUND: Duration = Duration::from_secs(10);

/// The server's threads that only exist to export: the batch processor's
/// (`trace export`), the OTLP/HTTP client's blocking runtime
/// (`reqwest-internal-sync-runtime`), and the OpenTelemetry SDK's own
/// batch processor of a build that has it (`OpenTelemetry.Traces.…`), as
/// `/proc/PID/task/TID/comm` shortens them. The gRPC exporter's transport
/// runs on the server's own runtime and is not among them; the spans'
/// encoding runs on the threads that end them.
const EXPORT_THREADS: [&str; 3] = ["trace export", "reqwest-", "OpenTelemetry"];

/// How long to wait for a stopped server's last log lines.
const LOG_WAIT: Duration = Duration::from_secs(2);

/// What exporting traces costs, per route, and in instructions.
#[derive(Clone, Debug, Serialize)]
pub struct TracesReport {
    /// The batch processor's settings the traced servers ran with, as
    /// `NAME=value (why)`.
    pub settings: Vec<String>,
    /// `GET /{code}`, then `GET /api/links/{code}`.
    pub cases: Vec<TracesCase>,
    /// Instructions per request under callgrind, off and on, per route.
    pub instructions: Vec<InstructionSeries>,
}

/// One route: the servers of [`FLAVORS`], in that order.
#[derive(Clone, Debug, Serialize)]
pub struct TracesCase {
    /// The route requested.
    pub route: String,
    /// The spans a sampled request makes on it.
    pub spans_per_request: u32,
    /// The servers.
    pub series: Vec<TracesSeries>,
}

/// One server's runs, with what its traces did.
#[derive(Clone, Debug, Serialize)]
pub struct TracesSeries {
    /// Throughput, latency and CPU a request.
    #[serde(flatten)]
    pub series: Series,
    /// How it exported and sampled.
    pub flavor: Flavor,
    /// What each turn exported, one per run.
    pub traced: Vec<TracedRun>,
    /// What it said of its traces at exit.
    pub exit: ExitCounts,
    /// What the receiver took from it over its life.
    pub received: Received,
}

/// What one turn (warm-up and measured run) did beside the load.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct TracedRun {
    /// Answers of the warm-up and the run, whatever their status.
    pub answered: u64,
    /// What the receiver took from the turn's start until it had been
    /// quiet for [`SETTLED_AFTER`].
    pub received: Received,
    /// The server's RSS at the end of the measured run, KiB.
    pub rss_kib: Option<u64>,
    /// CPU of the [`EXPORT_THREADS`] over the turn ÷ `answered`, µs.
    pub export_cpu_us: f64,
    /// The receiver thread's CPU over the turn ÷ the warm-up and run's
    /// length: it shares the load generator's core.
    pub receiver_busy: f64,
}

/// The server's own account of its traces, from its log at exit.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ExitCounts {
    /// Spans the exporter delivered (`spans_exported=`), if logged.
    pub spans_exported: Option<u64>,
    /// Spans ended but never delivered (`spans_dropped=`): queued past
    /// the batch's capacity, or refused.
    pub spans_dropped: u64,
    /// The trace pipeline's warnings and errors, with how often each came:
    /// the OpenTelemetry SDK's (`name=` of its lines at `WARN` and
    /// `ERROR`), and the batch processor's and exporter's own (their
    /// message: spans dropped for a full queue, exports failing).
    pub sdk_warnings: Vec<(String, u64)>,
}

/// One of the servers of a case.
struct Traced {
    name: &'static str,
    flavor: Flavor,
    replica: Replica,
}

impl Bench<'_> {
    /// Both routes, then the callgrind runs.
    pub(super) async fn traces(&self) -> anyhow::Result<TracesReport> {
        eprintln!("load: traces: off, over HTTP/protobuf and over gRPC to a receiver on loopback, sampling 1 % and all");
        refuse_inherited_otel()?;
        let receivers = Receivers::start()?;
        eprintln!("load:   {receivers}");
        let links = |path: fn(u32) -> String| -> Vec<Vec<u8>> {
            (0..self.options.links)
                .map(|n| raw::get(&path(n)))
                .collect()
        };
        let mut cases = Vec::new();
        for (route, short, requests, expected, spans) in [
            (
                "GET /{code}",
                "redirect",
                links(|n| format!("/bench-{n}")),
                307,
                1,
            ),
            (
                "GET /api/links/{code}",
                "show",
                links(|n| format!("/api/links/bench-{n}")),
                200,
                2,
            ),
        ] {
            let requests = Arc::new(requests);
            let mut case = self
                .traces_case(&receivers, route, short, requests, expected)
                .await?;
            case.spans_per_request = spans;
            cases.push(case);
        }
        let instructions = self.traces_instructions(&receivers).await?;
        Ok(TracesReport {
            settings: settings(),
            cases,
            instructions,
        })
    }

    /// A server's command: lameduck, the traced ones pointed at `receivers`
    /// over their transport, sampling at their ratio.
    fn traces_spec(&self, receivers: &Receivers, run: &str, flavor: Flavor) -> replica::Spec {
        let mut spec = self.spec(&self.binaries.service, run, &[]);
        if let Some(transport) = flavor.transport {
            spec.env
                .extend(traced_env(receivers, transport, flavor.ratio));
        }
        spec
    }

    async fn traces_case(
        &self,
        receivers: &Receivers,
        route: &str,
        short: &str,
        requests: Arc<Vec<Vec<u8>>>,
        expected: u16,
    ) -> anyhow::Result<TracesCase> {
        eprintln!("load:   {route}");
        let mut servers = Vec::new();
        for (flavor, name) in FLAVORS.into_iter().zip(NAMES.iter()) {
            let run = format!("tr-{short}-{}", flavor.tag());
            let replica = self
                .start(&run, &self.traces_spec(receivers, &run, flavor), "/readyz")
                .await?;
            self.create_links(&replica).await?;
            servers.push(Traced {
                name: name.as_str(),
                flavor,
                replica,
            });
        }
        let started: Vec<Received> = servers
            .iter()
            .map(|s| {
                s.flavor
                    .transport
                    .map_or_else(Received::default, |t| receivers.received(t))
            })
            .collect();
        let targets: Vec<Target> = servers
            .iter()
            .map(|s| Target::new(s.name, &s.replica, &requests, expected))
            .collect();
        let mut runs = vec![Vec::new(); servers.len()];
        let mut traced = vec![Vec::new(); servers.len()];
        for round in 0..self.options.rounds as usize {
            for turn in 0..servers.len() {
                let index = (turn + round) % servers.len();
                let (run, traced_run) = self
                    .traced_turn(receivers, &servers[index], &targets[index], round)
                    .await;
                runs[index].push(run);
                traced[index].push(traced_run);
            }
        }
        let mut series = Vec::new();
        for ((mut server, (runs, traced)), started) in servers
            .into_iter()
            .zip(runs.into_iter().zip(traced))
            .zip(started)
        {
            stop(&mut server.replica).await;
            let received = match server.flavor.transport {
                Some(transport) => receivers
                    .settle(transport, SETTLED_AFTER, SETTLE_BOUND)
                    .await
                    .since(&started),
                None => Received::default(),
            };
            series.push(TracesSeries {
                series: Series::new(server.name, runs),
                flavor: server.flavor,
                traced,
                exit: exit_counts(server.replica.log()).await,
                received,
            });
        }
        Ok(TracesCase {
            route: route.to_owned(),
            spans_per_request: 1,
            series,
        })
    }

    /// One turn of [`Bench::turn`], with what the server exported
    /// meanwhile: the receiver's counts from before the warm-up until it is
    /// quiet again, and the CPU of the export threads and of the receiver.
    async fn traced_turn(
        &self,
        receivers: &Receivers,
        server: &Traced,
        target: &Target,
        round: usize,
    ) -> (super::Run, TracedRun) {
        let pid = server.replica.pid();
        let before = server.flavor.transport.map(|t| receivers.received(t));
        let export_before = export_threads_cpu(pid);
        let receiver_before = receivers.cpu_time();
        let Turn {
            run,
            answered,
            elapsed,
        } = self.turn(target, round).await;
        let rss_kib = server.replica.rss_kib();
        let received = match (server.flavor.transport, before) {
            (Some(transport), Some(before)) => receivers
                .settle(transport, SETTLED_AFTER, SETTLE_BOUND)
                .await
                .since(&before),
            _ => Received::default(),
        };
        let export_cpu = since(export_before, export_threads_cpu(pid));
        let receiver_cpu = since(receiver_before, receivers.cpu_time());
        #[allow(clippy::cast_precision_loss)]
        let per_answer = |seconds: f64| seconds * 1e6 / answered.max(1) as f64;
        let loaded = (self.options.warmup + elapsed).as_secs_f64();
        let traced = TracedRun {
            answered,
            received,
            rss_kib,
            export_cpu_us: per_answer(export_cpu),
            receiver_busy: receiver_cpu / loaded,
        };
        if server.flavor.transport.is_some() {
            eprintln!(
                "load:     {} answered, {} server spans and {} others received in {} exports; RSS {} KiB; export threads {:.2} µs a request; receiver {:.0} % of a core",
                answered,
                received.server_spans,
                received.client_spans + received.other_spans,
                received.exports,
                rss_kib.unwrap_or(0),
                traced.export_cpu_us,
                traced.receiver_busy * 100.0,
            );
        }
        (run, traced)
    }

    /// Instructions per request under callgrind, each server of
    /// [`FLAVORS`], on both routes.
    async fn traces_instructions(
        &self,
        receivers: &Receivers,
    ) -> anyhow::Result<Vec<InstructionSeries>> {
        let redirect = raw::get("/bench-0");
        let show = raw::get("/api/links/bench-0");
        let mut series = Vec::new();
        let routes = [("GET /{code}", &redirect), ("GET /api/links/{code}", &show)];
        for (case, (route, request)) in routes.into_iter().enumerate() {
            for (index, flavor) in FLAVORS.into_iter().enumerate() {
                let label = format!("tr-in-{case}-{index}");
                let spec = |run: &str| self.traces_spec(receivers, run, flavor);
                let name = flavor.name();
                series.push(
                    self.count_instructions(&label, route, &name, spec, "/readyz", request)
                        .await?,
                );
            }
        }
        Ok(series)
    }
}

/// The environment of a server exporting to `receivers` over `transport`,
/// sampling `ratio` of the requests: the endpoint, the protocol, the
/// sampler and the export interval; every other batch setting is the
/// SDK's default.
fn traced_env(receivers: &Receivers, transport: Protocol, ratio: f64) -> [(String, String); 5] {
    [
        (
            "OTEL_EXPORTER_OTLP_ENDPOINT".to_owned(),
            receivers.endpoint(transport),
        ),
        (
            "OTEL_EXPORTER_OTLP_PROTOCOL".to_owned(),
            transport.env_value().to_owned(),
        ),
        (
            "OTEL_TRACES_SAMPLER".to_owned(),
            "parentbased_traceidratio".to_owned(),
        ),
        ("OTEL_TRACES_SAMPLER_ARG".to_owned(), ratio.to_string()),
        (
            OTEL_BSP_SCHEDULE_DELAY.to_owned(),
            SCHEDULE_DELAY.as_millis().to_string(),
        ),
    ]
}

/// The batch settings the traced servers ran with, for the output.
fn settings() -> Vec<String> {
    vec![
        format!(
            "{OTEL_BSP_SCHEDULE_DELAY}={} (set by the bench)",
            SCHEDULE_DELAY.as_millis()
        ),
        format!("{OTEL_BSP_MAX_QUEUE_SIZE}={OTEL_BSP_MAX_QUEUE_SIZE_DEFAULT} (the SDK's default)"),
        format!(
            "{OTEL_BSP_MAX_EXPORT_BATCH_SIZE}={OTEL_BSP_MAX_EXPORT_BATCH_SIZE_DEFAULT} (the SDK's default)"
        ),
    ]
}

/// The servers inherit the harness's environment, and an `OTEL_*` variable
/// there (an endpoint, a sampler, a batch size) would change what this part
/// measures, the "off" server included.
fn refuse_inherited_otel() -> anyhow::Result<()> {
    let inherited: Vec<String> = std::env::vars_os()
        .filter_map(|(name, _)| name.into_string().ok())
        .filter(|name| name.starts_with("OTEL_"))
        .collect();
    if !inherited.is_empty() {
        bail!(
            "the traces part sets the servers' OTEL_* variables itself; unset {} first",
            inherited.join(", ")
        );
    }
    Ok(())
}

/// The CPU time of the [`EXPORT_THREADS`] of process `pid`; `None` if
/// `/proc` cannot be read. A process without them (traces off) has zero.
fn export_threads_cpu(pid: i32) -> Option<Duration> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let mut total = Duration::ZERO;
    for task in tasks.flatten() {
        let tid = task.file_name();
        let tid = tid.to_string_lossy();
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if EXPORT_THREADS.iter().any(|prefix| comm.starts_with(prefix)) {
            total += replica::cpu_time(&format!("{pid}/task/{tid}")).unwrap_or_default();
        }
    }
    Some(total)
}

/// Seconds from `before` to `after`, NaN if either is unknown.
fn since(before: Option<Duration>, after: Option<Duration>) -> f64 {
    match (before, after) {
        (Some(before), Some(after)) => after.saturating_sub(before).as_secs_f64(),
        _ => f64::NAN,
    }
}

/// Reads what a stopped server said of its traces: its last flush's line
/// (`traces flushed …` or `traces not flushed …`) and the SDK's own
/// warnings. Waits up to [`LOG_WAIT`] for the log's last lines to be
/// written.
async fn exit_counts(log: &Path) -> ExitCounts {
    let deadline = tokio::time::Instant::now() + LOG_WAIT;
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        let done = text.contains("shutdown complete");
        if done || tokio::time::Instant::now() >= deadline {
            return parse_exit_counts(&text);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The warnings of the service's own batch processor and exporter, by the
/// start of their message.
const PIPELINE_WARNINGS: [&str; 2] = ["trace spans dropped", "trace export failing"];

fn parse_exit_counts(log: &str) -> ExitCounts {
    let field = |line: &str, name: &str| -> Option<u64> {
        let rest = line.split(&format!("{name}=")).nth(1)?;
        rest.split(|c: char| !c.is_ascii_digit())
            .next()?
            .parse()
            .ok()
    };
    let mut counts = ExitCounts::default();
    for line in log.lines() {
        if line.contains("traces flushed") || line.contains("traces not flushed") {
            counts.spans_exported = field(line, "spans_exported");
            counts.spans_dropped = field(line, "spans_dropped").unwrap_or(0);
        }
        let sdk = [" WARN opentelemetry", " ERROR opentelemetry"];
        let own = PIPELINE_WARNINGS
            .iter()
            .find(|message| line.contains(" WARN ") && line.contains(*message));
        if let Some(message) = own {
            match counts.sdk_warnings.iter_mut().find(|(n, _)| n == message) {
                Some((_, seen)) => *seen += 1,
                None => counts.sdk_warnings.push(((*message).to_owned(), 1)),
            }
        } else if sdk.iter().any(|level| line.contains(level)) {
            let name = line
                .split("name=\"")
                .nth(1)
                .and_then(|rest| rest.split('"').next())
                .unwrap_or("(unnamed)");
            match counts.sdk_warnings.iter_mut().find(|(n, _)| n == name) {
                Some((_, seen)) => *seen += 1,
                None => counts.sdk_warnings.push((name.to_owned(), 1)),
            }
        }
    }
    counts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exit_counts_and_the_sdk_warnings_are_read_from_the_log() {
        let log = "\
2026-11-26T08:07:56Z  WARN opentelemetry_sdk: name=\"BatchSpanProcessor.SpanDroppingStarted\" message=\"dropped\"
2026-11-26T08:07:56Z ERROR opentelemetry_sdk: name=\"BatchSpanProcessor.ExportError\" error=\"x\"
2026-11-26T08:07:56Z ERROR opentelemetry_sdk: name=\"BatchSpanProcessor.ExportError\" error=\"y\"
2026-11-26T08:07:56Z  WARN lameduck::telemetry::traces::batch: trace spans dropped: the queue is full (OTEL_BSP_MAX_QUEUE_SIZE) max_queue_size=2048
2026-11-26T08:07:56Z  WARN lameduck_lifecycle::shutdown: traces flushed, but the collector did not take every span spans_exported=1200 spans_dropped=34 requests_ended_open=0
2026-11-26T08:07:56Z  INFO lameduck_lifecycle::shutdown: shutdown complete reason=\"SIGTERM\"";
        let counts = parse_exit_counts(log);
        assert_eq!(counts.spans_exported, Some(1200));
        assert_eq!(counts.spans_dropped, 34);
        assert_eq!(
            counts.sdk_warnings,
            vec![
                ("BatchSpanProcessor.SpanDroppingStarted".to_owned(), 1),
                ("BatchSpanProcessor.ExportError".to_owned(), 2),
                ("trace spans dropped".to_owned(), 1),
            ]
        );
        let clean = parse_exit_counts(
            "x INFO lameduck_lifecycle::shutdown: traces flushed spans_exported=7 requests_ended_open=0",
        );
        assert_eq!(clean.spans_exported, Some(7));
        assert_eq!(clean.spans_dropped, 0);
        assert!(clean.sdk_warnings.is_empty());
    }
}
