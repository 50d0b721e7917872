//! The instructions part (`--parts instructions`, needs valgrind):
//! instructions per request under callgrind, lameduck against bare hyper and
//! the minimal axum app (and plain `axum::serve`), then lameduck without each
//! step of its middleware in turn: a count, not a time, so the same on a busy
//! machine as on an idle one.

use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context};
use nix::sys::signal::Signal;
use serde::Serialize;
use tokio::time::Instant;

use super::table::ratio;
use super::{
    create_bench_link, Bench, BenchReport, BARE_HYPER, COUNTING, LAMEDUCK, MINIMAL_AXUM,
    MINIMAL_REDIRECT, NOT_COUNTING, PLAIN_AXUM,
};
use crate::raw::{self, RawConn};
use crate::replica::{Replica, Spec};
use crate::report;
use crate::SERVICE;

/// Requests of the short and the long callgrind run; the difference of
/// their instruction counts, divided by the difference of these, leaves out
/// start-up and shutdown.
const INSTRUCTION_RUNS: [usize; 2] = [1_000, 11_000];

/// Instructions one server spends per request.
#[derive(Clone, Debug, Serialize)]
pub struct InstructionSeries {
    /// The route requested.
    pub route: String,
    /// The server.
    pub server: String,
    /// Instructions of the whole process, per run of [`INSTRUCTION_RUNS`].
    pub totals: Vec<u64>,
    /// (long total − short total) ÷ (long requests − short requests).
    pub per_request: f64,
}

/// One server and route of the instructions part.
struct Case<'a> {
    /// The route requested.
    route: &'static str,
    /// The server's row name.
    name: &'a str,
    /// Its binary.
    program: &'a Path,
    /// Where its readiness is read.
    ready: &'static str,
    /// The request sent, over and over.
    request: &'a [u8],
    /// The middleware step the build goes without (`LOAD_WITHOUT`), if any.
    step: Option<&'a str>,
}

impl<'a> Case<'a> {
    fn new(
        route: &'static str,
        name: &'a str,
        program: &'a Path,
        ready: &'static str,
        request: &'a [u8],
    ) -> Case<'a> {
        Case {
            route,
            name,
            program,
            ready,
            request,
            step: None,
        }
    }
}

impl Bench<'_> {
    /// Each server under callgrind, twice: [`INSTRUCTION_RUNS`] requests
    /// over 8 connections, then SIGTERM. `GET /healthz` on lameduck, the
    /// minimal axum app, plain `axum::serve` and bare hyper; `GET /{code}`
    /// of one link on lameduck, on the minimal axum app, and without hit
    /// counting.
    pub(super) async fn instructions(&self) -> anyhow::Result<Vec<InstructionSeries>> {
        eprintln!("load: instructions per request under callgrind");
        let healthz = raw::get("/healthz");
        let redirect = raw::get("/bench-0");
        // lameduck without each step of its middleware, in turn, and
        // without every step at once.
        let without: Vec<(String, &str)> = crate::baseline::STEPS
            .iter()
            .chain([&crate::baseline::EVERY_STEP])
            .map(|step| (format!("{LAMEDUCK} without {step}"), *step))
            .collect();
        let mut series = Vec::new();
        let cases = self.instruction_cases(&healthz, &redirect, &without);
        for (index, case) in cases.iter().enumerate() {
            let spec = |run: &str| self.instruction_spec(case, run);
            let label = format!("in-{index}");
            series.push(
                self.count_instructions(
                    &label,
                    case.route,
                    case.name,
                    spec,
                    case.ready,
                    case.request,
                )
                .await?,
            );
        }
        Ok(series)
    }

    /// The servers and routes of the part, in the order of its table: the
    /// baselines on `GET /healthz` and `GET /{code}`, then lameduck
    /// `without` each step.
    fn instruction_cases<'a>(
        &'a self,
        healthz: &'a [u8],
        redirect: &'a [u8],
        without: &'a [(String, &'a str)],
    ) -> Vec<Case<'a>> {
        let b = self.binaries;
        let case = Case::new;
        let mut cases = vec![
            case("GET /healthz", LAMEDUCK, &b.service, "/readyz", healthz),
            case(
                "GET /healthz",
                MINIMAL_AXUM,
                &b.minimal_axum,
                "/readyz",
                healthz,
            ),
            case(
                "GET /healthz",
                PLAIN_AXUM,
                &b.plain_axum,
                "/readyz",
                healthz,
            ),
            case(
                "GET /healthz",
                BARE_HYPER,
                &b.bare_hyper,
                "/healthz",
                healthz,
            ),
            case("GET /{code}", &COUNTING, &b.service, "/readyz", redirect),
            case(
                "GET /{code}",
                MINIMAL_REDIRECT,
                &b.minimal_axum,
                "/readyz",
                redirect,
            ),
            case(
                "GET /{code}",
                &NOT_COUNTING,
                &b.redirect_uncounted,
                "/readyz",
                redirect,
            ),
        ];
        cases.extend(without.iter().map(|(name, step)| Case {
            step: Some(*step),
            ..case(
                "GET /healthz",
                name,
                &b.lameduck_without,
                "/readyz",
                healthz,
            )
        }));
        cases
    }

    /// The command of `case`'s server for the run named `run`: bare hyper
    /// takes no argument but its address; a build without a step is told
    /// which.
    fn instruction_spec(&self, case: &Case<'_>, run: &str) -> Spec {
        let mut spec = if case.program == self.binaries.bare_hyper.as_path() {
            self.bare_spec()
        } else {
            self.spec(case.program, run, &[])
        };
        if let Some(step) = case.step {
            let variable = crate::baseline::WITHOUT_ENV.to_owned();
            spec.env.push((variable, step.to_owned()));
        }
        spec
    }

    /// `name` under callgrind, twice: [`INSTRUCTION_RUNS`] requests of
    /// `request` over 8 connections, then SIGTERM; the difference of the two
    /// whole-process counts is what a request costs. `spec` gives the
    /// server's command for a run's name (`{label}-{requests}`, its data
    /// folder and log); readiness is read at `ready`. A `route` other than
    /// `GET /healthz` asks for `bench-0`, created first: `GET /{code}`
    /// (redirected), or `GET /api/links/{code}` (shown).
    ///
    /// # Errors
    /// If the server cannot start, answers otherwise, or exits other than 0.
    pub(super) async fn count_instructions(
        &self,
        label: &str,
        route: &str,
        name: &str,
        spec: impl Fn(&str) -> Spec,
        ready: &str,
        request: &[u8],
    ) -> anyhow::Result<InstructionSeries> {
        let (expected, needs_link) = match route {
            "GET /healthz" => (200, false),
            "GET /api/links/{code}" => (200, true),
            _ => (307, true),
        };
        let link = create_bench_link(0);
        let mut totals = Vec::new();
        for requests in INSTRUCTION_RUNS {
            let run = format!("{label}-{requests}");
            let spec = spec(&run);
            let out = self.logs.join(format!("callgrind-{run}.out"));
            let mut args: Vec<std::ffi::OsString> = vec![
                "--tool=callgrind".into(),
                format!("--callgrind-out-file={}", out.display()).into(),
                spec.program.clone().into_os_string(),
            ];
            args.extend(spec.args);
            let under_valgrind = Spec {
                program: "valgrind".into(),
                args,
                env: spec.env,
                cpus: spec.cpus,
            };
            let mut replica =
                Replica::spawn(&run, &under_valgrind, &self.logs.join(format!("{run}.log")))
                    .await?;
            replica.wait_ready(ready, Duration::from_secs(120)).await?;
            if needs_link {
                let created = RawConn::connect(replica.addr)
                    .await?
                    .exchange(&link)
                    .await?;
                if created.status != 201 {
                    bail!("{name}: creating the link answered {}", created.status);
                }
            }
            let answered = raw::exactly(replica.addr, request, expected, 8, requests)
                .await
                .with_context(|| format!("{name} under callgrind"))?;
            if answered != requests {
                bail!("{name} under callgrind answered {answered} of {requests} with {expected}");
            }
            let _ = replica.signal(Signal::SIGTERM);
            let ended = replica
                .wait_exit(Instant::now(), Duration::from_secs(120))
                .await;
            if ended.code != Some(0) {
                bail!("{name} under callgrind exited {}", ended.describe());
            }
            let total = callgrind_total(&out)?;
            eprintln!("load:   {route} on {name}: {requests} requests, {total} instructions");
            totals.push(total);
        }
        #[allow(clippy::cast_precision_loss)]
        let per_request = (totals[1] as f64 - totals[0] as f64)
            / (INSTRUCTION_RUNS[1] - INSTRUCTION_RUNS[0]) as f64;
        Ok(InstructionSeries {
            route: route.to_owned(),
            server: name.to_owned(),
            totals,
            per_request,
        })
    }
}

/// The instruction count of a callgrind output file (its `totals:` line).
fn callgrind_total(path: &Path) -> anyhow::Result<u64> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    text.lines()
        .find_map(|line| {
            line.strip_prefix("totals:")
                .or_else(|| line.strip_prefix("summary:"))
        })
        .and_then(|total| total.split_whitespace().next()?.parse().ok())
        .with_context(|| format!("no totals in {}", path.display()))
}

/// What each step of lameduck's middleware costs on `GET /healthz`: the
/// instructions per request with every step less those without that one.
fn steps_table(
    service: &InstructionSeries,
    minimal: &InstructionSeries,
    steps: &[InstructionSeries],
) -> String {
    if steps.is_empty() {
        return String::new();
    }
    let above = service.per_request - minimal.per_request;
    let header: Vec<String> = vec![
        "step switched off".to_owned(),
        "instructions per `GET /healthz` without it".to_owned(),
        "what the step costs".to_owned(),
        format!("share of {SERVICE} − minimal axum app ({above:.0})"),
    ];
    let step_of = |s: &InstructionSeries| {
        let step = s.server.rsplit(" without ").next().unwrap_or(&s.server);
        step.to_owned()
    };
    let label = |step: String| {
        if step == crate::baseline::EVERY_STEP {
            "all seven at once".to_owned()
        } else {
            step
        }
    };
    let mut rows: Vec<Vec<String>> = steps
        .iter()
        .map(|s| {
            let cost = service.per_request - s.per_request;
            vec![
                label(step_of(s)),
                format!("{:.0}", s.per_request),
                format!("{cost:.0}"),
                format!("{:.0} %", 100.0 * cost / above),
            ]
        })
        .collect();
    let every = steps
        .iter()
        .find(|s| step_of(s) == crate::baseline::EVERY_STEP);
    let rest = every.map(|every| every.per_request - minimal.per_request);
    if let Some(rest) = rest {
        rows.push(vec![
            "what is left, above the minimal axum app".to_owned(),
            "–".to_owned(),
            format!("{rest:.0}"),
            format!("{:.0} %", 100.0 * rest / above),
        ]);
    }
    let rest = rest.map_or_else(String::new, |rest| {
        format!(
            " With every step off, {SERVICE} still runs {rest:.0} instructions a request more than the minimal axum app: the stack's own service and future, axum's route level for its layer, and the lifecycle's request scope, connection state and deadlines."
        )
    });
    format!(
        "What each step of the middleware costs, switched off one at a time, and all at once (`{SERVICE}-without`, a build for the bench only).{rest}\n\n{}\n",
        report::table(&header, &rows)
    )
}

/// The instructions part's section: every route and server, lameduck ÷ each
/// baseline, and what each step of the middleware costs.
pub(super) fn instructions_summary(report: &BenchReport, footer: &str) -> String {
    let [service, minimal, plain, bare, counted, minimal_redirect, uncounted, steps @ ..] =
        report.instructions.as_slice()
    else {
        return String::new();
    };
    let header: Vec<String> = vec![
        "route".to_owned(),
        "server".to_owned(),
        "instructions per request".to_owned(),
        format!(
            "whole process, {} / {} requests",
            INSTRUCTION_RUNS[0], INSTRUCTION_RUNS[1]
        ),
    ];
    let rows: Vec<Vec<String>> = report
        .instructions
        .iter()
        .map(|s| {
            vec![
                format!("`{}`", s.route),
                s.server.clone(),
                format!("{:.0}", s.per_request),
                s.totals
                    .iter()
                    .map(u64::to_string)
                    .collect::<Vec<_>>()
                    .join(" / "),
            ]
        })
        .collect();
    format!(
        "### Instructions per request (callgrind), {} and {} requests over 8 connections\n\n{}\n\
         **`GET /healthz`: {SERVICE} ÷ minimal axum app: {} of the instructions**, a throughput ratio of \
         {} if time followed instructions; **{SERVICE} ÷ bare hyper: {}** ({SERVICE} ÷ plain axum::serve: {}). \
         **`GET /{{code}}`: {SERVICE} ÷ minimal axum app: {}**, a throughput ratio of {}; counting ÷ not \
         counting: {}. Counted, not timed: the same on a busy machine as on an idle one.\n\n{}{footer}\n",
        INSTRUCTION_RUNS[0],
        INSTRUCTION_RUNS[1],
        report::table(&header, &rows),
        ratio(service.per_request, minimal.per_request),
        ratio(minimal.per_request, service.per_request),
        ratio(service.per_request, bare.per_request),
        ratio(service.per_request, plain.per_request),
        ratio(counted.per_request, minimal_redirect.per_request),
        ratio(minimal_redirect.per_request, counted.per_request),
        ratio(counted.per_request, uncounted.per_request),
        steps_table(service, minimal, steps),
    )
}
