//! What `load outage` prints and writes: a table per flavor (a column per
//! phase), the comparison of the flavors, the picture, and the verdict of
//! `--check` against the targets.

use std::path::Path;
use std::time::Duration;

use super::phase::PhaseResult;
use super::{Flavor, FlavorResult, OutageReport};
use crate::fate::FateCounts;
use crate::replica::Ended;
use crate::report::{self, Panel, Span};

/// A creation or read answered 503 behind an open breaker must come back
/// this fast (p99), through the balancer, from release builds: failing fast
/// is the breaker's whole point.
pub const FAIL_FAST_P99_MS: f64 = 10.0;

/// The same bound for debug builds (the smoke run under `cargo test`):
/// their request path is several times slower and far more sensitive to a
/// busy machine, so the 10 ms of a release build would fail on noise;
/// 100 ms still tells failing fast from waiting for a pooled connection
/// (the 3 s acquire timeout).
pub const FAIL_FAST_P99_MS_DEBUG: f64 = 100.0;

/// The fail-fast bound for the servers this harness runs: release or debug
/// builds, as it was built itself.
pub fn fail_fast_bound_ms() -> f64 {
    if crate::machine::PROFILE == "release" {
        FAIL_FAST_P99_MS
    } else {
        FAIL_FAST_P99_MS_DEBUG
    }
}

/// Creations succeed again within this long of the database answering.
pub const RECOVERY: Duration = Duration::from_secs(1);

/// `failed / total`, with the failures by class when there are any.
fn fates(counts: &FateCounts) -> String {
    let failed = counts.failed();
    if failed == 0 {
        return format!("0 / {}", counts.total());
    }
    let classes: Vec<String> = crate::fate::Fate::FAILURES
        .iter()
        .filter(|fate| counts.get(**fate) > 0)
        .map(|fate| format!("{} {}", counts.get(*fate), fate.as_str()))
        .collect();
    format!("**{failed}** / {} ({})", counts.total(), classes.join(", "))
}

/// One flavor's table: a row per measure, a column per phase.
pub fn flavor_table(result: &FlavorResult) -> String {
    let mut header = vec![String::new()];
    header.extend(result.phases.iter().map(|p| p.phase.short().to_owned()));
    let row = |name: &str, cell: &dyn Fn(&PhaseResult) -> String| {
        let mut row = vec![name.to_owned()];
        row.extend(result.phases.iter().map(cell));
        row
    };
    let per_replica = |values: Vec<String>| values.join(" · ");
    let rows = vec![
        row("**redirects failed** / sent", &|p| fates(&p.redirects)),
        row("creations failed / sent", &|p| fates(&p.creations)),
        row("reads failed / sent", &|p| fates(&p.reads)),
        row("503s to creations and reads (with `Retry-After`)", &|p| {
            format!("{} ({})", p.unavailable.0, p.unavailable.1)
        }),
        row(
            "of them failed fast, breaker open: n, p50 / p99 / max ms",
            &|p| {
                if p.failed_fast.count == 0 {
                    "–".to_owned()
                } else {
                    format!("{}: {}", p.failed_fast.count, p.failed_fast.cell())
                }
            },
        ),
        row("creations and reads, p50 / p99 / max ms", &|p| {
            p.database_latency.cell()
        }),
        row("last failure after the database answered", &|p| {
            report::fmt_ms(p.recovered_after.as_secs_f64() * 1000.0) + " ms"
        }),
        row("`/readyz` not 200, per replica (of readings)", &|p| {
            per_replica(
                p.not_ready
                    .iter()
                    .map(|(bad, all)| format!("{bad}/{all}"))
                    .collect(),
            )
        }),
        row("database reported down, per replica (s)", &|p| {
            per_replica(p.down_s.iter().map(|s| format!("{s:.1}")).collect())
        }),
        row("balancer: fewest servers UP", &|p| {
            p.lb_min_up.map_or("–".to_owned(), |n| n.to_string())
        }),
        row("hits answered / stored", &|p| {
            format!("{} / {}", p.redirects_answered, p.hits_stored)
        }),
        row("links answered 201 / stored", &|p| {
            links(p.links_answered, p.links_unconfirmed, p.links_stored)
        }),
    ];
    report::table(&header, &rows)
}

/// The flavors side by side: failed redirects, and failed creations and
/// reads, per phase.
pub fn comparison_table(report: &OutageReport) -> String {
    let mut header = vec!["phase".to_owned()];
    for result in &report.results {
        header.push(format!("{}: redirects failed", result.label));
        header.push("creations, reads failed".to_owned());
    }
    let phases = report
        .results
        .first()
        .map(|r| r.phases.len())
        .unwrap_or_default();
    let rows: Vec<Vec<String>> = (0..phases)
        .map(|index| {
            let mut row = vec![report.results[0].phases[index].label.clone()];
            for result in &report.results {
                let phase = &result.phases[index];
                row.push(format!(
                    "{} / {}",
                    phase.redirects.failed(),
                    phase.redirects.total()
                ));
                row.push(format!(
                    "{} / {}",
                    phase.creations.failed() + phase.reads.failed(),
                    phase.creations.total() + phase.reads.total()
                ));
            }
            row
        })
        .collect();
    report::table(&header, &rows)
}

fn exits(result: &FlavorResult) -> String {
    result
        .exits
        .iter()
        .map(Ended::describe)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The whole Markdown summary.
pub fn summary(report: &OutageReport) -> String {
    let o = &report.options;
    let mut text = format!(
        "### The database misbehaving behind a load balancer: {} replicas, {} req/s\n\n{}\n",
        o.replicas,
        o.rate,
        comparison_table(report)
    );
    for result in &report.results {
        text.push_str(&format!(
            "\n#### {}\n\n{}\nCreations and reads answered 503 behind an open breaker, over \
             every phase: {} (p50 / p99 / max ms, of {}). Exits after the phases: {}. Hits answered \
             {} / stored {} in all (warming up included); links answered {}.\n",
            result.label,
            flavor_table(result),
            result.failed_fast.cell(),
            result.failed_fast.count,
            exits(result),
            result.redirects_answered,
            result.hits_stored,
            links(result.links_answered, result.links_unconfirmed, result.links_stored)
        ));
    }
    text.push_str(&format!(
        "\nTraffic through HAProxy: open loop, {} req/s, seed {} (+ the phase's number), {:.0}% HTTP/2, \
         {:.0}% `POST /api/links`, {:.0}% `GET /api/links/{{code}}`, the rest `GET /{{code}}` over {} links \
         every replica has served; {:?} of it before and after each disturbance; client timeout {:?}. \
         Balancer: `/readyz` on each replica's admin port every {:?}, out after {} failures, in after {}, \
         {} retries. Replicas: `--request-timeout {:?}`, one PostgreSQL, each through a relay of its own \
         (phase (d) stops the last one's). Between phases the traffic pauses until every replica has \
         flushed its pending hits.\n\nMachine: {}\n\nCommand: `{}`\n",
        o.rate,
        o.seed,
        o.h2_share * 100.0,
        o.create_share * 100.0,
        o.read_share * 100.0,
        o.links,
        o.steady,
        o.timeout,
        o.checks.inter,
        o.checks.fall,
        o.checks.rise,
        o.checks.retries,
        o.request_timeout,
        report.machine.line(),
        report.machine.command
    ));
    text
}

/// One panel per flavor: the phases end to end, each disturbance shaded.
fn panels(report: &OutageReport) -> Vec<Panel> {
    report
        .results
        .iter()
        .map(|result| {
            let (mut ok, mut failed, mut spans) = (Vec::new(), Vec::new(), Vec::new());
            for phase in &result.phases {
                #[allow(clippy::cast_precision_loss)]
                let offset = ok.len() as f64;
                spans.push(Span {
                    from_s: offset + phase.disturbance.from.as_secs_f64(),
                    to_s: offset + phase.disturbance.answering.as_secs_f64(),
                    label: phase.phase.short().to_owned(),
                });
                ok.extend(&phase.ok_per_second);
                failed.extend(&phase.failed_per_second);
                failed.resize(ok.len(), 0);
            }
            let redirects: u64 = result.phases.iter().map(|p| p.redirects.failed()).sum();
            let others: u64 = result
                .phases
                .iter()
                .map(|p| p.creations.failed() + p.reads.failed())
                .sum();
            Panel {
                title: format!(
                    "{}: {redirects} redirects failed, {others} creations and reads failed",
                    result.label
                ),
                ok,
                failed,
                marks: Vec::new(),
                spans,
                p99_ms: Vec::new(),
            }
        })
        .collect()
}

/// Writes `outage.json`, `outage.svg` and `summary.md` into `out`.
///
/// # Errors
/// If a file cannot be written.
pub fn write(report: &OutageReport, out: &Path) -> anyhow::Result<()> {
    report::write_json(&out.join("outage.json"), report)?;
    let title = format!(
        "The database misbehaving: {} replicas behind HAProxy, {} req/s",
        report.options.replicas, report.options.rate
    );
    std::fs::write(
        out.join("outage.svg"),
        report::timeline_svg(&title, report::PHASE_LEGEND, &panels(report)),
    )?;
    std::fs::write(out.join("summary.md"), summary(report))?;
    Ok(())
}

/// What a phase of lameduck's run falls short of, if anything.
fn shortfalls(phase: &PhaseResult, request_timeout: Duration) -> Vec<String> {
    let mut problems = Vec::new();
    if phase.redirects.failed() > 0 {
        problems.push(format!("{} redirects failed", phase.redirects.failed()));
    }
    if phase.failed_fast_without_retry_after > 0 {
        problems.push(format!(
            "{} 503s behind the open breaker had no Retry-After",
            phase.failed_fast_without_retry_after
        ));
    }
    if phase.unavailable.0 != phase.unavailable.1 {
        problems.push(format!(
            "{} of {} 503s had no Retry-After",
            phase.unavailable.0 - phase.unavailable.1,
            phase.unavailable.0
        ));
    }
    if phase.database_latency.max_ms >= request_timeout.as_secs_f64() * 1000.0 {
        problems.push(format!(
            "a creation or read waited {} ms, to the request timeout",
            phase.database_latency.max_ms
        ));
    }
    if phase.recovered_after > RECOVERY {
        problems.push(format!(
            "creations or reads still failed {:?} after the database answered",
            phase.recovered_after
        ));
    }
    if !phase.always_ready() {
        problems.push(format!(
            "`/readyz` was not always 200: {:?}",
            phase.not_ready
        ));
    }
    if phase.hits_lost() != 0 || phase.links_lost() > 0 || phase.links_unannounced() > 0 {
        problems.push(format!(
            "hits answered {} / stored {}, links answered {}",
            phase.redirects_answered,
            phase.hits_stored,
            links(
                phase.links_answered,
                phase.links_unconfirmed,
                phase.links_stored
            )
        ));
    }
    problems
}

/// The verdict of `--check`: lameduck's runs must meet every target in
/// every phase — no failed redirect, 503s behind an open breaker within
/// [`FAIL_FAST_P99_MS`] (p99 over the phases: one phase holds a few;
/// [`FAIL_FAST_P99_MS_DEBUG`] for debug builds) and
/// every 503 with `Retry-After`, nothing
/// waiting to the request timeout, creations back within [`RECOVERY`] of
/// the database answering, every replica ready throughout, hits answered
/// equal stored, links stored no fewer than answered 201 and no more than
/// those and the creations answered unconfirmed (a commit whose answer a
/// cut connection lost may have been made) — and every replica exit 0
/// with nothing lost over the run. The `--readiness-follows-database` flavor is the comparison
/// and has no targets.
///
/// # Errors
/// Every shortfall, in one message.
pub fn verdict(report: &OutageReport) -> Result<(), String> {
    let mut problems = Vec::new();
    for result in report
        .results
        .iter()
        .filter(|r| r.flavor == Flavor::Lameduck)
    {
        for phase in &result.phases {
            for problem in shortfalls(phase, report.options.request_timeout) {
                problems.push(format!("{}: {problem}", phase.label));
            }
        }
        let bound = fail_fast_bound_ms();
        if result.failed_fast.count > 0 && result.failed_fast.p99_ms > bound {
            problems.push(format!(
                "503s behind an open breaker took {} ms (p99 of {} over the phases), over {bound} ms ({} build)",
                result.failed_fast.p99_ms,
                result.failed_fast.count,
                crate::machine::PROFILE
            ));
        }
        if !result.exits.iter().all(|e| e.code == Some(0)) {
            problems.push(format!("exits [{}]", exits(result)));
        }
        if result.hits_lost() != 0 || result.links_lost() > 0 || result.links_unannounced() > 0 {
            problems.push(format!(
                "over the run: hits answered {} / stored {}, links answered {}",
                result.redirects_answered,
                result.hits_stored,
                links(
                    result.links_answered,
                    result.links_unconfirmed,
                    result.links_stored
                )
            ));
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("; "))
    }
}

/// Links answered 201 (and unconfirmed, if any) / stored: stored must lie
/// between the first and their sum.
pub fn links(answered: u64, unconfirmed: u64, stored: i64) -> String {
    if unconfirmed == 0 {
        format!("{answered} / {stored}")
    } else {
        format!("{answered} (+{unconfirmed} unconfirmed) / {stored}")
    }
}
