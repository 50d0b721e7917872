//! What `load rotation` makes of a run: a table per part (a column per
//! run), the picture, the JSON, and the verdict of `--check`.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use super::scaleup::ScaleUpResult;
use super::storm::{Replacement, StormResult, WARMUP};
use super::{charts, svg};
use super::{RotationReport, Spread};
use crate::fate::{Fate, FateCounts};
use crate::replica::Ended;
use crate::report;
use crate::tls;

/// The most a gradual drain's peak reconnect rate may be, as a share of
/// the immediate one's in the same round.
pub const PEAK_RATIO_TARGET: f64 = 0.25;

/// The most a gradual drain's p99 during the replacements may be, as a
/// multiple of its steady p99.
pub const P99_RATIO_TARGET: f64 = 1.5;

/// Without an age, the new replica's share must stay under this in a
/// smoke run: it gets no connection.
const NO_AGE_SHARE_BOUND: f64 = 0.05;

/// `0 ×3`, `143 ×1`: exits by how they ended.
fn exits<'a>(ended: impl Iterator<Item = &'a Ended>) -> String {
    let mut counts: Vec<(String, usize)> = Vec::new();
    for ended in ended {
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

/// `server/drain 1000, client/client 3`: the nonzero closes.
fn closes(closed: &BTreeMap<String, u64>) -> String {
    let text = closed
        .iter()
        .filter(|(_, n)| **n > 0)
        .map(|(key, n)| format!("{key} {n}"))
        .collect::<Vec<_>>()
        .join(", ");
    if text.is_empty() {
        "–".to_owned()
    } else {
        text
    }
}

fn fates(counts: &FateCounts) -> String {
    let failed: Vec<String> = Fate::FAILURES
        .iter()
        .filter(|fate| counts.get(**fate) > 0)
        .map(|fate| format!("{} {}", fate.as_str(), counts.get(*fate)))
        .collect();
    if failed.is_empty() {
        "–".to_owned()
    } else {
        failed.join(", ")
    }
}

fn percent(share: f64) -> String {
    format!("{:.1} %", share * 100.0)
}

/// `median / max` of some durations, in ms.
fn median_max(mut durations: Vec<Duration>) -> String {
    durations.sort();
    match (durations.get(durations.len() / 2), durations.last()) {
        (Some(median), Some(max)) => format!(
            "{} / {}",
            report::fmt_ms(median.as_secs_f64() * 1000.0),
            report::fmt_ms(max.as_secs_f64() * 1000.0)
        ),
        _ => "–".to_owned(),
    }
}

/// The immediate run of `gradual`'s round, if there is one.
fn immediate_of<'a>(report: &'a RotationReport, gradual: &StormResult) -> Option<&'a StormResult> {
    report
        .storm
        .iter()
        .find(|r| r.spread == Spread::Immediate && r.round == gradual.round)
}

/// A table row: a name, and its cell in each run's column.
type Row<'a, R> = (&'static str, Box<dyn Fn(&R) -> String + 'a>);

/// `rows`, a column per run of `runs`, under `header`.
fn table<R>(header: &[String], runs: &[R], rows: Vec<Row<'_, R>>) -> String {
    let rows: Vec<Vec<String>> = rows
        .into_iter()
        .map(|(name, cell)| {
            let mut row = vec![name.to_owned()];
            row.extend(runs.iter().map(&cell));
            row
        })
        .collect();
    report::table(header, &rows)
}

/// `a / b / c`: a figure of each replacement.
fn each(r: &StormResult, figure: impl Fn(&Replacement) -> u64) -> String {
    r.replacements
        .iter()
        .map(|x| figure(x).to_string())
        .collect::<Vec<_>>()
        .join(" / ")
}

/// The storm's table: one column per run.
pub fn storm_table(report: &RotationReport) -> String {
    let mut header = vec![String::new()];
    header.extend(report.storm.iter().map(|r| {
        if report.options.rounds > 1 {
            format!("{} (round {})", r.label, r.round)
        } else {
            r.label.clone()
        }
    }));
    let mut rows = storm_connection_rows(report);
    rows.extend(storm_time_rows());
    table(&header, &report.storm, rows)
}

/// The storm's requests and connections.
fn storm_connection_rows(report: &RotationReport) -> Vec<Row<'_, StormResult>> {
    vec![
        (
            "requests (`GET /{code}`, HTTPS keep-alive)",
            Box::new(|r: &StormResult| r.requests.total().to_string()),
        ),
        (
            "**failed**",
            Box::new(|r: &StormResult| format!("**{}**", r.requests.failed())),
        ),
        ("  by fate", Box::new(|r: &StormResult| fates(&r.requests))),
        (
            "retried on a new connection (reused one closed unanswered)",
            Box::new(|r: &StormResult| r.retried.to_string()),
        ),
        (
            "TLS handshakes (clients, all full)",
            Box::new(|r: &StormResult| r.handshakes.to_string()),
        ),
        (
            "**peak new connections / 100 ms, replacing** (fleet)",
            Box::new(|r: &StormResult| format!("**{}**", r.peak_new_per_100ms)),
        ),
        (
            "  per replacement",
            Box::new(|r: &StormResult| each(r, |x| x.peak_new_per_100ms)),
        ),
        (
            "peak new connections / 100 ms, steady",
            Box::new(|r: &StormResult| r.steady_peak_new_per_100ms.to_string()),
        ),
        (
            "new connections in each replacement window",
            Box::new(|r: &StormResult| each(r, |x| x.new_connections)),
        ),
        (
            "**gradual peak / immediate peak**",
            Box::new(
                |r: &StormResult| match (r.spread, immediate_of(report, r)) {
                    (Spread::Gradual, Some(i)) if i.peak_new_per_100ms > 0 => {
                        #[allow(clippy::cast_precision_loss)]
                        let ratio = r.peak_new_per_100ms as f64 / i.peak_new_per_100ms as f64;
                        format!("**{ratio:.2}** (target ≤ {PEAK_RATIO_TARGET})")
                    }
                    _ => "–".to_owned(),
                },
            ),
        ),
        (
            "connections closed (by/reason)",
            Box::new(|r: &StormResult| closes(&r.closed)),
        ),
    ]
}

/// The storm's latency, drains, hits and exits.
fn storm_time_rows() -> Vec<Row<'static, StormResult>> {
    vec![
        (
            "latency steady p50 / p99 / max (ms)",
            Box::new(|r: &StormResult| r.latency_steady.cell()),
        ),
        (
            "latency replacing p50 / p99 / max (ms)",
            Box::new(|r: &StormResult| r.latency_replacing.cell()),
        ),
        (
            "worst second's p99, steady / replacing (ms)",
            Box::new(|r: &StormResult| {
                format!(
                    "{} / {}",
                    report::fmt_ms(r.p99_worst_second_steady_ms),
                    report::fmt_ms(r.p99_worst_second_replacing_ms)
                )
            }),
        ),
        (
            "**p99 replacing / steady**",
            Box::new(|r: &StormResult| format!("**{:.2}×**", r.p99_ratio())),
        ),
        (
            "balancer out after SIGTERM, median / max (ms)",
            Box::new(|r: &StormResult| {
                median_max(
                    r.replacements
                        .iter()
                        .filter_map(|x| x.lb_out_after)
                        .collect(),
                )
            }),
        ),
        (
            "SIGTERM → exit, median / max (ms)",
            Box::new(|r: &StormResult| {
                median_max(r.replacements.iter().map(|x| x.ended.after).collect())
            }),
        ),
        (
            "redirects answered 307",
            Box::new(|r: &StormResult| r.redirects_answered.to_string()),
        ),
        (
            "hits stored in PostgreSQL",
            Box::new(|r: &StormResult| r.hits_stored.to_string()),
        ),
        (
            "**hits lost** (answered − stored)",
            Box::new(|r: &StormResult| format!("**{}**", r.hits_lost())),
        ),
        (
            "exit codes: replaced / at the end",
            Box::new(|r: &StormResult| {
                format!(
                    "{} / {}",
                    exits(r.replacements.iter().map(|x| &x.ended)),
                    exits(r.final_exits.iter())
                )
            }),
        ),
    ]
}

/// The scale-up's table: one column per run.
pub fn scale_up_table(report: &RotationReport) -> String {
    let mut header = vec![String::new()];
    header.extend(report.scale_up.iter().map(|r| r.label.clone()));
    let age = report.options.max_connection_age;
    let rows: Vec<Row<'_, ScaleUpResult>> = vec![
        (
            "requests (`GET /{code}`, HTTPS keep-alive)",
            Box::new(|r: &ScaleUpResult| r.requests.total().to_string()),
        ),
        (
            "**failed**",
            Box::new(|r: &ScaleUpResult| format!("**{}**", r.requests.failed())),
        ),
        (
            "  by fate",
            Box::new(|r: &ScaleUpResult| fates(&r.requests)),
        ),
        (
            "retried on a new connection (reused one closed unanswered)",
            Box::new(|r: &ScaleUpResult| r.retried.to_string()),
        ),
        (
            "TLS handshakes (clients, all full)",
            Box::new(|r: &ScaleUpResult| r.handshakes.to_string()),
        ),
        (
            "latency p50 / p99 / max (ms)",
            Box::new(|r: &ScaleUpResult| r.latency.cell()),
        ),
        (
            "new replica UP at (s)",
            Box::new(|r: &ScaleUpResult| format!("{:.1}", r.added_at_s)),
        ),
        ("**new replica's share, last second**", Box::new(new_share)),
        (
            "**within 10 % of fair for good after**",
            Box::new(move |r: &ScaleUpResult| match r.within_after_s {
                Some(s) => format!("**{s:.1} s** (target ≤ {:?})", age * 2),
                None => format!("**never** in {:.0} s", r.window_s),
            }),
        ),
        ("every replica's share, last second", Box::new(last_shares)),
        (
            "connections closed (by/reason)",
            Box::new(|r: &ScaleUpResult| closes(&r.closed)),
        ),
        (
            "redirects answered 307",
            Box::new(|r: &ScaleUpResult| r.redirects_answered.to_string()),
        ),
        (
            "hits stored in PostgreSQL",
            Box::new(|r: &ScaleUpResult| r.hits_stored.to_string()),
        ),
        (
            "**hits lost** (answered − stored)",
            Box::new(|r: &ScaleUpResult| format!("**{}**", r.hits_lost())),
        ),
        (
            "exit codes at the end",
            Box::new(|r: &ScaleUpResult| exits(r.final_exits.iter())),
        ),
    ];
    table(&header, &report.scale_up, rows)
}

/// The new replica's share in the last second watched, and its fair one.
fn new_share(result: &ScaleUpResult) -> String {
    format!(
        "**{}** (fair {})",
        percent(result.new_share_end),
        percent(result.fair_share)
    )
}

/// Every replica's share in the last second: `r1 33 %, r2 …`.
fn last_shares(result: &ScaleUpResult) -> String {
    result
        .share_per_second
        .iter()
        .map(|s| {
            format!(
                "{} {}",
                s.replica,
                percent(s.share.last().copied().unwrap_or(0.0))
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The whole Markdown summary: the tables, the setup, the machine.
pub fn summary(report: &RotationReport) -> String {
    let o = &report.options;
    let mut text = String::new();
    if !report.storm.is_empty() {
        text.push_str(&format!(
            "### Storm: R={} replicas each replaced once, {} clients, {} req/s, --drain-delay {:?}\n\n{}\n\
             A replacement starts the new replica, waits until it is ready and UP in the balancer, then SIGTERMs \
             the oldest and waits for its exit; the next starts {:?} later. Its window runs from the SIGTERM to \
             {:?} after the exit; steady is everything after the first {:?} outside any replacement (from the new \
             replica's start on). New connections are each replica's `connections_accepted_total`, read every \
             100 ms, summed over the fleet per 100 ms.\n\n",
            o.replicas,
            o.clients,
            o.rate,
            o.drain_delay,
            storm_table(report),
            o.tail(),
            o.tail(),
            WARMUP,
        ));
    }
    if !report.scale_up.is_empty() {
        text.push_str(&format!(
            "### Scale-up: {} replicas, then one more (R={}), {} clients, {} req/s, watched {:?} after it is UP\n\n{}\n\
             Shares are each replica's redirects answered (its `http_requests_total{{status=\"3xx\"}}`, read every \
             100 ms) over the fleet's, per whole second. The scale-up's replicas run without a lame duck \
             (`--drain-delay 0s`): none leaves under traffic.\n\n",
            o.replicas - 1,
            o.replicas,
            o.scaleup_clients,
            o.scaleup_rate,
            o.max_connection_age * 2,
            scale_up_table(report)
        ));
    }
    text.push_str(&format!(
        "Clients: open loop, each of N clients sends its own `GET /{{code}}` every N/rate seconds (seed {}, {} links), \
         HTTP/1.1 over TLS ({}), one connection at a time, kept alive until the server closes it or says \
         `Connection: close`; no session resumption, so every reconnection is a full handshake; latency from the \
         due time; timeout {:?}. Balancer: HAProxy in `mode tcp` (L4, round-robin), TLS passed through to the \
         replicas, `/readyz` on each replica's admin port checked every {:?}, out after {} failures, in after {}, \
         {} retries. Replicas share one PostgreSQL; hits are counted after every replica has exited.\n\n\
         Machine: {}\n\nCommand: `{}`\n",
        o.seed,
        o.links,
        tls::CHAIN,
        o.timeout,
        o.checks.inter,
        o.checks.fall,
        o.checks.rise,
        o.checks.retries,
        report.machine.line(),
        report.machine.command
    ));
    text
}

/// Writes `rotation.json`, `rotation.svg` and `summary.md` into `out`.
///
/// # Errors
/// If a file cannot be written.
pub fn write(report: &RotationReport, out: &Path) -> anyhow::Result<()> {
    report::write_json(&out.join("rotation.json"), report)?;
    let o = &report.options;
    let mut charts = charts::storm(&report.storm);
    charts.extend(charts::scale_up(&report.scale_up));
    let title = format!(
        "Rotation behind L4: storm R={}, {} clients, {} req/s, drain {:?} · scale-up {} clients, age {:?}",
        o.replicas, o.clients, o.rate, o.drain_delay, o.scaleup_clients, o.max_connection_age,
    );
    std::fs::write(out.join("rotation.svg"), svg::render(&title, &charts))?;
    std::fs::write(out.join("summary.md"), summary(report))?;
    Ok(())
}

/// What every run must get right: no failed request, every hit answered
/// stored and none more, every replica's exit 0.
fn correctness(
    label: &str,
    requests: &FateCounts,
    hits_lost: i64,
    exits: &[&Ended],
) -> Vec<String> {
    let mut wrong = Vec::new();
    if requests.failed() > 0 {
        wrong.push(format!(
            "{label}: {} failed requests ({})",
            requests.failed(),
            fates(requests)
        ));
    }
    if hits_lost != 0 {
        wrong.push(format!("{label}: hits answered − stored = {hits_lost}"));
    }
    if !exits.iter().all(|e| e.code == Some(0)) {
        wrong.push(format!(
            "{label}: exits [{}]",
            exits
                .iter()
                .map(|e| e.describe())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    wrong
}

fn storm_verdict(report: &RotationReport, smoke: bool) -> Vec<String> {
    let mut wrong = Vec::new();
    for r in &report.storm {
        let ended: Vec<&Ended> = r
            .replacements
            .iter()
            .map(|x| &x.ended)
            .chain(&r.final_exits)
            .collect();
        wrong.extend(correctness(&r.label, &r.requests, r.hits_lost(), &ended));
        if r.spread != Spread::Gradual {
            continue;
        }
        if let Some(i) = immediate_of(report, r) {
            #[allow(clippy::cast_precision_loss)]
            let bound = if smoke {
                i.peak_new_per_100ms.saturating_sub(1) as f64
            } else {
                i.peak_new_per_100ms as f64 * PEAK_RATIO_TARGET
            };
            #[allow(clippy::cast_precision_loss)]
            if r.peak_new_per_100ms as f64 > bound {
                wrong.push(format!(
                    "round {}: gradual peak {} new connections / 100 ms against immediate {} (bound {bound:.1})",
                    r.round, r.peak_new_per_100ms, i.peak_new_per_100ms
                ));
            }
        }
        if !smoke && r.p99_ratio() > P99_RATIO_TARGET {
            wrong.push(format!(
                "{}: p99 replacing {} ms is {:.2}× steady {} ms (target ≤ {P99_RATIO_TARGET}×)",
                r.label,
                report::fmt_ms(r.latency_replacing.p99_ms),
                r.p99_ratio(),
                report::fmt_ms(r.latency_steady.p99_ms)
            ));
        }
    }
    wrong
}

fn scale_up_verdict(report: &RotationReport, smoke: bool) -> Vec<String> {
    let mut wrong = Vec::new();
    let window = report.options.max_connection_age.as_secs_f64() * 2.0;
    for r in &report.scale_up {
        let ended: Vec<&Ended> = r.final_exits.iter().collect();
        wrong.extend(correctness(&r.label, &r.requests, r.hits_lost(), &ended));
        match (r.age.is_some(), smoke) {
            (true, false) if !r.within_after_s.is_some_and(|s| s <= window) => wrong.push(format!(
                "{}: the new replica's share was not within 10 % of {} for good by {window:.0} s (at the end {})",
                r.label,
                percent(r.fair_share),
                percent(r.new_share_end)
            )),
            (true, true) if r.new_share_end < r.fair_share / 2.0 => wrong.push(format!(
                "{}: the new replica served {} at the end, under half its fair share",
                r.label,
                percent(r.new_share_end)
            )),
            (false, true) if r.new_share_end > NO_AGE_SHARE_BOUND => wrong.push(format!(
                "{}: the new replica served {} at the end without an age (expected none)",
                r.label,
                percent(r.new_share_end)
            )),
            _ => {}
        }
    }
    wrong
}

/// The verdict of `--check`. Every run: no failed request, hits answered =
/// hits stored, every exit 0. Each round's gradual run: a peak reconnect
/// rate at most [`PEAK_RATIO_TARGET`] of the immediate run's, and a p99
/// while replacing at most [`P99_RATIO_TARGET`] times its steady p99 (the
/// immediate run's is reported, not held to it: it is the storm being
/// measured). The scale-up with an age: the new replica's share within 10
/// % of its fair share for good within twice the age. A smoke run keeps
/// the correctness and drops the timing: a gradual peak below the
/// immediate one, the new replica at half its fair share or more with the
/// age and at most 5 % without.
pub fn verdict(report: &RotationReport) -> Result<(), String> {
    let smoke = report.options.smoke;
    let mut wrong = storm_verdict(report, smoke);
    wrong.extend(scale_up_verdict(report, smoke));
    if !smoke {
        for r in report
            .storm
            .iter()
            .filter(|r| r.spread == Spread::Immediate)
        {
            if r.p99_ratio() <= P99_RATIO_TARGET {
                eprintln!(
                    "load: warning: {} kept its p99 within {P99_RATIO_TARGET}× while replacing: \
                     the storm is too gentle to tell",
                    r.label
                );
            }
        }
    }
    if wrong.is_empty() {
        Ok(())
    } else {
        Err(wrong.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn closes_list_the_nonzero_reasons() {
        let mut closed = BTreeMap::new();
        closed.insert("server/drain".to_owned(), 12);
        closed.insert("server/age".to_owned(), 0);
        assert_eq!(closes(&closed), "server/drain 12");
        assert_eq!(closes(&BTreeMap::new()), "–");
    }
}
