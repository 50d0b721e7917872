//! What a rollout measured, summed up: every request's fate, latency
//! steady and while replacing, hits and links answered against stored; the
//! comparison table, the picture, and the verdict of `--check`.

use std::path::Path;
use std::time::Duration;

use hdrhistogram::Histogram;

use super::{Breakdown, Flavor, FlavorResult, Options, Replacement, RolloutReport};
use crate::fate::{Fate, FateCounts};
use crate::fleet::{Ran, Stopped};
use crate::replica::Ended;
use crate::report::{self, Latency, Panel};
use crate::traffic::{Kind, Proto, Record};

/// A request due within this long after an old replica's exit still counts
/// as "during a replacement" for latency.
const REPLACEMENT_TAIL: Duration = Duration::from_secs(1);

/// What a flavor's run ended with, beside its traffic.
pub(super) struct Ending {
    /// Every replacement, in order.
    pub(super) replacements: Vec<Replacement>,
    /// The replicas left at the end, stopped, and every mark.
    pub(super) stopped: Stopped,
    /// `SUM(links.hits)` after every replica exited.
    pub(super) hits_stored: i64,
    /// Links in the database after the run, less the seeded ones.
    pub(super) links_stored: i64,
}

/// Every request counted: by fate, protocol and kind, per second, and the
/// latency of those answered, steady or while replacing.
struct Tally {
    requests: FateCounts,
    breakdown: Breakdown,
    steady: Histogram<u64>,
    replacing: Histogram<u64>,
    ok_per_second: Vec<u64>,
    failed_per_second: Vec<u64>,
    redirects_answered: u64,
    links_answered: u64,
}

impl Tally {
    fn new(seconds: usize) -> Tally {
        Tally {
            requests: FateCounts::default(),
            breakdown: Breakdown::default(),
            steady: report::histogram(),
            replacing: report::histogram(),
            ok_per_second: vec![0; seconds],
            failed_per_second: vec![0; seconds],
            redirects_answered: 0,
            links_answered: 0,
        }
    }

    /// Counts `record`; `replacing` says whether it was due in a
    /// replacement's window.
    fn add(&mut self, record: &Record, replacing: bool) {
        self.requests.add(record.fate);
        match record.proto {
            Proto::Http1 => self.breakdown.http1.add(record.fate),
            Proto::Http2 => self.breakdown.http2.add(record.fate),
        }
        match record.kind {
            Kind::Redirect => self.breakdown.redirect.add(record.fate),
            Kind::Create => self.breakdown.create.add(record.fate),
            // The rollout sends none.
            Kind::Read => {}
        }
        match (record.kind, record.status) {
            (Kind::Redirect, 307) => self.redirects_answered += 1,
            (Kind::Create, 201) => self.links_answered += 1,
            _ => {}
        }
        #[allow(clippy::cast_possible_truncation)]
        let second = record.due.as_secs() as usize;
        if record.fate == Fate::Success {
            if let Some(bucket) = self.ok_per_second.get_mut(second) {
                *bucket += 1;
            }
            let latency = if replacing {
                &mut self.replacing
            } else {
                &mut self.steady
            };
            report::record(latency, record.latency);
        } else if let Some(bucket) = self.failed_per_second.get_mut(second) {
            *bucket += 1;
        }
    }
}

/// Sums up one flavor's run.
pub(super) fn summarize(
    flavor: Flavor,
    options: &Options,
    ran: &Ran,
    ending: Ending,
) -> FlavorResult {
    let windows: Vec<(f64, f64)> = ending
        .replacements
        .iter()
        .map(|r| {
            (
                r.sigterm_at_s,
                r.sigterm_at_s + (r.ended.after + REPLACEMENT_TAIL).as_secs_f64(),
            )
        })
        .collect();
    // Whole seconds only: a last, partial second would look like a drop.
    #[allow(clippy::cast_possible_truncation)]
    let seconds = (ran.records.last().map_or(0, |r| r.due.as_secs()) as usize).max(1);
    let mut tally = Tally::new(seconds);
    for record in &ran.records {
        let due = record.due.as_secs_f64();
        tally.add(
            record,
            windows.iter().any(|(from, to)| (*from..*to).contains(&due)),
        );
    }
    FlavorResult {
        flavor,
        label: flavor.label(options),
        requests: tally.requests,
        breakdown: tally.breakdown,
        latency_steady: Latency::of(&tally.steady),
        latency_replacing: Latency::of(&tally.replacing),
        replacements: ending.replacements,
        final_exits: ending.stopped.exits,
        redirects_answered: tally.redirects_answered,
        hits_stored: ending.hits_stored,
        links_answered: tally.links_answered,
        links_stored: ending.links_stored,
        traffic_s: (ran.traffic_s * 10.0).round() / 10.0,
        ok_per_second: tally.ok_per_second,
        failed_per_second: tally.failed_per_second,
        marks: ending.stopped.marks,
    }
}

/// The comparison table: one column per flavor.
pub fn summary_table(report: &RolloutReport) -> String {
    let mut header = vec![String::new()];
    header.extend(report.results.iter().map(|r| r.label.clone()));
    let row = |name: &str, cell: &dyn Fn(&FlavorResult) -> String| {
        let mut row = vec![name.to_owned()];
        row.extend(report.results.iter().map(cell));
        row
    };
    let mut rows = vec![
        row("requests", &|r| r.requests.total().to_string()),
        row("**failed**", &|r| format!("**{}**", r.requests.failed())),
    ];
    for fate in Fate::FAILURES {
        rows.push(row(&format!("  {}", fate.as_str()), &|r| {
            r.requests.get(fate).to_string()
        }));
    }
    rows.extend([
        row("failed over HTTP/1.1 / HTTP/2", &|r| {
            format!(
                "{} / {}",
                r.breakdown.http1.failed(),
                r.breakdown.http2.failed()
            )
        }),
        row("latency steady p50 / p99 / max (ms)", &|r| {
            r.latency_steady.cell()
        }),
        row("latency replacing p50 / p99 / max (ms)", &|r| {
            r.latency_replacing.cell()
        }),
        row("redirects answered 307", &|r| {
            r.redirects_answered.to_string()
        }),
        row("hits stored in PostgreSQL", &|r| r.hits_stored.to_string()),
        row("**hits lost**", &|r| format!("**{}**", r.hits_lost())),
        row("links answered 201 / stored", &|r| {
            format!("{} / {}", r.links_answered, r.links_stored)
        }),
        row("old replicas' exit codes", &|r| exit_codes(r)),
        row("drain time (SIGTERM → exit) median / max", &drain_times),
        row("balancer out after SIGTERM, median", &lb_out_lags),
    ]);
    report::table(&header, &rows)
}

/// The median and longest drain, SIGTERM to exit.
fn drain_times(result: &FlavorResult) -> String {
    let mut drains: Vec<Duration> = result.replacements.iter().map(|x| x.ended.after).collect();
    drains.sort();
    match (drains.get(drains.len() / 2), drains.last()) {
        (Some(median), Some(max)) => format!(
            "{} / {} ms",
            report::fmt_ms(median.as_secs_f64() * 1000.0),
            report::fmt_ms(max.as_secs_f64() * 1000.0)
        ),
        _ => "–".to_owned(),
    }
}

/// The median lag from SIGTERM to the balancer taking a replica out, and
/// how often that came before the exit.
fn lb_out_lags(result: &FlavorResult) -> String {
    let mut lags: Vec<Duration> = result
        .replacements
        .iter()
        .filter_map(|x| x.lb_out_after)
        .collect();
    lags.sort();
    let before_exit = result
        .replacements
        .iter()
        .filter(|x| x.lb_out_after.is_some_and(|lag| lag < x.ended.after))
        .count();
    let before_exit = format!("{before_exit}/{} before exit", result.replacements.len());
    match lags.get(lags.len() / 2) {
        Some(median) => format!(
            "{} ms ({before_exit})",
            report::fmt_ms(median.as_secs_f64() * 1000.0)
        ),
        None => format!("– ({before_exit})"),
    }
}

fn exit_codes(result: &FlavorResult) -> String {
    let mut counts: Vec<(String, usize)> = Vec::new();
    for ended in result.replacements.iter().map(|r| &r.ended) {
        let code = ended.describe();
        match counts.iter_mut().find(|(c, _)| *c == code) {
            Some((_, n)) => *n += 1,
            None => counts.push((code, 1)),
        }
    }
    counts
        .iter()
        .map(|(code, n)| format!("{code} ×{n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The whole Markdown summary: the table, the setup, the machine.
pub fn summary(report: &RolloutReport) -> String {
    let o = &report.options;
    format!(
        "### Rolling deploy: R={} replicas, K={} replacements, {} req/s\n\n{}\n\
         Traffic: open loop, {} req/s, seed {}, {:.0}% HTTP/2 (prior knowledge), {:.0}% `POST /api/links`, \
         the rest `GET /{{code}}` over {} links; timeout {:?}. Balancer: HAProxy, `/readyz` checked every {:?}, \
         out after {} failures, in after {}, {} retries of a failed connection; a replica leaves the \
         balancer only once it has exited and the checks have failed. Replicas share one PostgreSQL; hits are counted after every \
         replica has exited.\n\n\
         Machine: {}\n\nCommand: `{}`\n",
        o.replicas,
        o.replacements,
        o.rate,
        summary_table(report),
        o.rate,
        o.seed,
        o.h2_share * 100.0,
        o.create_share * 100.0,
        o.links,
        o.timeout,
        o.checks.inter,
        o.checks.fall,
        o.checks.rise,
        o.checks.retries,
        report.machine.line(),
        report.machine.command
    )
}

/// Writes `rollout.json`, `rollout.svg` and `summary.md` into `out`.
///
/// # Errors
/// If a file cannot be written.
pub fn write(report: &RolloutReport, out: &Path) -> anyhow::Result<()> {
    report::write_json(&out.join("rollout.json"), report)?;
    let panels: Vec<Panel> = report.results.iter().map(panel).collect();
    let title = format!(
        "Rolling deploy: R={}, K={}, {} req/s, seed {}",
        report.options.replicas,
        report.options.replacements,
        report.options.rate,
        report.options.seed
    );
    std::fs::write(
        out.join("rollout.svg"),
        report::rollout_svg(&title, &panels),
    )?;
    std::fs::write(out.join("summary.md"), summary(report))?;
    Ok(())
}

/// The verdict of `--check`: every lameduck run with a drain delay must be
/// clean. Baselines without failures earn a warning: the scenario would
/// then be too weak to tell the difference.
pub fn verdict(report: &RolloutReport) -> Result<(), String> {
    let mut problems = Vec::new();
    for result in &report.results {
        let baseline = result.flavor != Flavor::Lameduck;
        if baseline {
            if result.requests.failed() == 0 && result.hits_lost() == 0 {
                eprintln!(
                    "load: warning: baseline {} failed nothing: the scenario is too weak to tell",
                    result.label
                );
            }
            continue;
        }
        if !result.is_clean() {
            problems.push(format!(
                "{}: {} failed requests, {} hits lost, {} links lost, exits [{}]",
                result.label,
                result.requests.failed(),
                result.hits_lost(),
                result.links_lost(),
                result
                    .exits()
                    .map(Ended::describe)
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("; "))
    }
}

/// One flavor's panel of the picture.
fn panel(result: &FlavorResult) -> Panel {
    Panel {
        title: format!(
            "{}: {} requests, {} failed, {} hits lost",
            result.label,
            result.requests.total(),
            result.requests.failed(),
            result.hits_lost()
        ),
        ok: result.ok_per_second.clone(),
        failed: result.failed_per_second.clone(),
        marks: result.marks.clone(),
        spans: Vec::new(),
        p99_ms: Vec::new(),
    }
}
