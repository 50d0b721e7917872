//! What `load crash` makes of a run: every failure held against the kills,
//! the table (a column per durability), the picture, the JSON, and the
//! verdict of `--check`.

use std::path::Path;
use std::time::Duration;

use hdrhistogram::Histogram;

use super::{CrashReport, Durability, FlavorResult, Kill, Replays, Unexplained};
use crate::fate::{Fate, FateCounts};
use crate::replica::Ended;
use crate::report::{self, Latency, Mark, Panel};
use crate::traffic::{Proto, Record};

/// A request due up to this long after a kill may still have gone to the
/// killed replica: the kill is timed just before `kill(2)`, and the
/// balancer hands requests to its kept-alive connections to the dead
/// process until it has read the kernel closing them — well within a
/// millisecond from release builds on an idle machine, 23 ms seen from the
/// debug builds of `cargo test` on two busy cores.
pub const KILL_GRACE: Duration = Duration::from_millis(100);

/// A request in flight on a killed replica fails within this long of the
/// kill: the kernel closes the dead process's connections as it dies, and
/// the balancer passes that on at once. A failure that ends later has
/// another cause.
pub const KILL_ECHO: Duration = Duration::from_millis(250);

/// A request due within this long after a killed replica is back in the
/// balancer still counts as "after a kill" for latency.
const AFTER_KILL_TAIL: Duration = Duration::from_secs(1);

/// Unexplained failures kept in the JSON, to look at.
const UNEXPLAINED_KEPT: usize = 20;

/// How a run ended, after its traffic.
pub(super) struct Ending {
    pub(super) final_exits: Vec<Ended>,
    pub(super) hits_stored: i64,
    pub(super) replays: Replays,
    pub(super) spill_files_left: usize,
    pub(super) traffic_s: f64,
    pub(super) marks: Vec<Mark>,
}

/// The kill that explains a failed request, if one does: the request was
/// due before the kill (up to [`KILL_GRACE`] after it), still unanswered at
/// the kill, failed within [`KILL_ECHO`] of it, and failed the way HAProxy
/// passes on a replica that closed its connection with the request
/// unanswered. That is a `reset`: having sent nothing it could answer, HAProxy
/// closes the client's HTTP/1.1 connection without a response, as the
/// replica did to it, and refuses the HTTP/2 stream (`REFUSED_STREAM`), so
/// neither names the replica; or a 502 that names the killed replica's
/// slot (`x-served-by`). A failure naming another slot is never explained.
pub fn attribute(record: &Record, kills: &[Kill]) -> Option<usize> {
    let due = record.due.as_secs_f64();
    let ended = due + record.latency.as_secs_f64();
    kills.iter().position(|kill| {
        let passed_on = match record.server {
            None => record.fate == Fate::Reset,
            Some(slot) => {
                usize::from(slot) == kill.slot
                    && (record.fate == Fate::Reset || record.status == 502)
            }
        };
        passed_on
            && due <= kill.at_s + KILL_GRACE.as_secs_f64()
            && ended >= kill.at_s
            && ended <= kill.at_s + KILL_ECHO.as_secs_f64()
    })
}

/// Every request counted: by fate and protocol, per second, the latency
/// of those answered (steady or after a kill), and every failure held
/// against the kills.
struct Tally {
    requests: FateCounts,
    http1: FateCounts,
    http2: FateCounts,
    steady: Histogram<u64>,
    after_kill: Histogram<u64>,
    ok_per_second: Vec<u64>,
    failed_per_second: Vec<u64>,
    latencies: Vec<Vec<Duration>>,
    redirects_answered: u64,
    redirects_cut: u64,
    cut_by_kills: u64,
    unexplained_first: Vec<Unexplained>,
}

impl Tally {
    fn new(seconds: usize) -> Tally {
        Tally {
            requests: FateCounts::default(),
            http1: FateCounts::default(),
            http2: FateCounts::default(),
            steady: report::histogram(),
            after_kill: report::histogram(),
            ok_per_second: vec![0; seconds],
            failed_per_second: vec![0; seconds],
            latencies: vec![Vec::new(); seconds],
            redirects_answered: 0,
            redirects_cut: 0,
            cut_by_kills: 0,
            unexplained_first: Vec::new(),
        }
    }

    /// Counts `record`; `after_kill` says whether it was due in a kill's
    /// window. A failure is held against `kills` ([`attribute`]).
    fn add(&mut self, record: &Record, after_kill: bool, kills: &mut [Kill]) {
        self.requests.add(record.fate);
        match record.proto {
            Proto::Http1 => self.http1.add(record.fate),
            Proto::Http2 => self.http2.add(record.fate),
        }
        #[allow(clippy::cast_possible_truncation)]
        let second = record.due.as_secs() as usize;
        if record.fate == Fate::Success {
            self.redirects_answered += 1;
            if let Some(bucket) = self.ok_per_second.get_mut(second) {
                *bucket += 1;
            }
            if let Some(bucket) = self.latencies.get_mut(second) {
                bucket.push(record.latency);
            }
            let latency = if after_kill {
                &mut self.after_kill
            } else {
                &mut self.steady
            };
            report::record(latency, record.latency);
            return;
        }
        self.redirects_cut += 1;
        if let Some(bucket) = self.failed_per_second.get_mut(second) {
            *bucket += 1;
        }
        match attribute(record, kills) {
            Some(index) => {
                kills[index].cut += 1;
                self.cut_by_kills += 1;
            }
            None if self.unexplained_first.len() < UNEXPLAINED_KEPT => {
                self.unexplained_first.push(Unexplained {
                    due_s: (record.due.as_secs_f64() * 1000.0).round() / 1000.0,
                    latency: record.latency,
                    fate: record.fate,
                    status: record.status,
                    slot: record.server,
                    proto: record.proto,
                });
            }
            None => {}
        }
    }

    /// Per second, the p99 latency of the requests answered, ms.
    fn p99_ms_per_second(&mut self) -> Vec<f64> {
        self.latencies
            .iter_mut()
            .map(|second| {
                second.sort();
                let index = (second.len() * 99).div_ceil(100).saturating_sub(1);
                second
                    .get(index)
                    .map_or(0.0, |d| (d.as_secs_f64() * 1e5).round() / 100.0)
            })
            .collect()
    }
}

/// Sums up one durability's run.
pub(super) fn summarize(
    durability: Durability,
    records: &[Record],
    mut kills: Vec<Kill>,
    ending: Ending,
) -> FlavorResult {
    let windows: Vec<(f64, f64)> = kills
        .iter()
        .map(|kill| {
            (
                kill.at_s,
                kill.at_s + (kill.lb_in_after + AFTER_KILL_TAIL).as_secs_f64(),
            )
        })
        .collect();
    // Whole seconds only: a last, partial second would look like a drop.
    #[allow(clippy::cast_possible_truncation)]
    let seconds = (records.last().map_or(0, |r| r.due.as_secs()) as usize).max(1);
    let mut tally = Tally::new(seconds);
    for record in records {
        let due = record.due.as_secs_f64();
        let after_kill = windows.iter().any(|(from, to)| (*from..*to).contains(&due));
        tally.add(record, after_kill, &mut kills);
    }
    let p99_ms_per_second = tally.p99_ms_per_second();
    FlavorResult {
        durability,
        label: durability.label(),
        requests: tally.requests,
        http1: tally.http1,
        http2: tally.http2,
        cut_by_kills: tally.cut_by_kills,
        unexplained: tally.requests.failed() - tally.cut_by_kills,
        latency_steady: Latency::of(&tally.steady),
        latency_after_kill: Latency::of(&tally.after_kill),
        kills,
        final_exits: ending.final_exits,
        redirects_answered: tally.redirects_answered,
        redirects_cut: tally.redirects_cut,
        hits_stored: ending.hits_stored,
        replays: ending.replays,
        spill_files_left: ending.spill_files_left,
        traffic_s: (ending.traffic_s * 10.0).round() / 10.0,
        p99_ms_per_second,
        unexplained_first: tally.unexplained_first,
        ok_per_second: tally.ok_per_second,
        failed_per_second: tally.failed_per_second,
        marks: ending.marks,
    }
}

/// `median / max` of some durations, in ms, or `–`.
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

/// `0 ×3`, `SIGKILL ×10`: exits by how they ended.
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

/// A table row: its name, and a cell per durability.
type Row<'a> = dyn Fn(&str, &dyn Fn(&FlavorResult) -> String) -> Vec<String> + 'a;

/// The comparison table: one column per durability.
pub fn summary_table(report: &CrashReport) -> String {
    let mut header = vec![String::new()];
    header.extend(report.results.iter().map(|r| r.label.clone()));
    let row = |name: &str, cell: &dyn Fn(&FlavorResult) -> String| {
        let mut row = vec![name.to_owned()];
        row.extend(report.results.iter().map(cell));
        row
    };
    let mut rows = request_rows(&row);
    rows.extend(hit_and_restart_rows(&row));
    report::table(&header, &rows)
}

/// The kills and what the requests went through.
fn request_rows(row: &Row<'_>) -> Vec<Vec<String>> {
    let mut rows = vec![
        row("kills (SIGKILL, then a restart)", &|r| {
            format!(
                "{} ({})",
                r.kills.len(),
                exits(r.kills.iter().map(|k| &k.ended))
            )
        }),
        row("requests (all `GET /{code}`)", &|r| {
            r.requests.total().to_string()
        }),
        row("**failed**", &|r| format!("**{}**", r.requests.failed())),
    ];
    for fate in Fate::FAILURES {
        rows.push(row(&format!("  {}", fate.as_str()), &|r| {
            r.requests.get(fate).to_string()
        }));
    }
    rows.extend([
        row("failed over HTTP/1.1 / HTTP/2", &|r| {
            format!("{} / {}", r.http1.failed(), r.http2.failed())
        }),
        row("failed in flight on the killed replica", &|r| {
            r.cut_by_kills.to_string()
        }),
        row("**failed otherwise**", &|r| {
            format!("**{}**", r.unexplained)
        }),
        row("latency steady p50 / p99 / max (ms)", &|r| {
            r.latency_steady.cell()
        }),
        row("latency after a kill p50 / p99 / max (ms)", &|r| {
            r.latency_after_kill.cell()
        }),
    ]);
    rows
}

/// The hits against the redirects, the journals, the restarts and the exits.
fn hit_and_restart_rows(row: &Row<'_>) -> Vec<Vec<String>> {
    vec![
        row("redirects answered 307", &|r| {
            r.redirects_answered.to_string()
        }),
        row("redirects cut (sent, never answered)", &|r| {
            r.redirects_cut.to_string()
        }),
        row("hits stored in PostgreSQL", &|r| r.hits_stored.to_string()),
        row("**hits lost** (answered − stored)", &|r| {
            format!("**{}**", r.hits_lost())
        }),
        row("hits in excess (stored − answered) ≤ cut", &|r| {
            let holds = if r.hits_excess() <= r.redirects_cut {
                "yes"
            } else {
                "**no**"
            };
            format!("{} ≤ {}: {holds}", r.hits_excess(), r.redirects_cut)
        }),
        row(
            "dead journals applied at a start / by a running replica",
            &|r| format!("{} / {}", r.replays.at_start, r.replays.while_running),
        ),
        row(
            "torn records skipped; files left in the spill directory",
            &|r| format!("{}; {}", r.replays.torn_records, r.spill_files_left),
        ),
        row("restart ready after the kill, median / max (ms)", &|r| {
            median_max(r.kills.iter().map(|k| k.ready_after).collect())
        }),
        row(
            "back in the balancer after the kill, median / max (ms)",
            &|r| median_max(r.kills.iter().map(|k| k.lb_in_after).collect()),
        ),
        row("taken out by the balancer's checks meanwhile", &|r| {
            let out = r.kills.iter().filter(|k| k.lb_out_after.is_some()).count();
            format!("{out} of {}", r.kills.len())
        }),
        row("exit codes at the end (SIGTERM)", &|r| {
            exits(r.final_exits.iter())
        }),
    ]
}

/// The whole Markdown summary: the table, the setup, the machine.
pub fn summary(report: &CrashReport) -> String {
    let o = &report.options;
    let moved: usize = report
        .results
        .iter()
        .flat_map(|r| &r.kills)
        .filter(|k| !k.same_ports)
        .count();
    let moved = if moved == 0 {
        String::new()
    } else {
        format!(
            " ({moved} restarts found a port taken and started on new ones, their slot re-pointed)"
        )
    };
    format!(
        "### Crash loop: R={} replicas, K={} SIGKILLs {:?} apart, {} req/s\n\n{}\n\
         Traffic: open loop, {} req/s, seed {}, {:.0}% HTTP/2 (prior knowledge), the rest HTTP/1.1, \
         every request `GET /{{code}}` over {} links; timeout {:?}. Kills: one replica after another, \
         SIGKILL, then the harness starts it again at once with the same arguments on the same ports{moved}. \
         Balancer: HAProxy, `/readyz` on the admin port checked every {:?}, out after {} failures, in after {}; \
         a refused connection is retried {} time(s) on another replica (`option redispatch 1`, \
         `retry-on conn-failure`), a request a replica died with never. A failure counts as in flight on \
         the killed replica when it was sent before the kill ({:?} of grace), was unanswered at it, failed \
         within {:?} of it, and failed the way HAProxy passes on a replica that closed with the request \
         unanswered: the HTTP/1.1 connection closed or the HTTP/2 stream refused (`reset`), or a 502 \
         naming the killed replica. \
         The replicas share one PostgreSQL and one spill directory; hits are counted after every replica \
         has exited on SIGTERM.\n\n\
         Machine: {}\n\nCommand: `{}`\n",
        o.replicas,
        o.kills,
        o.interval,
        o.rate,
        summary_table(report),
        o.rate,
        o.seed,
        o.h2_share * 100.0,
        o.links,
        o.timeout,
        o.checks.inter,
        o.checks.fall,
        o.checks.rise,
        o.checks.retries,
        KILL_GRACE,
        KILL_ECHO,
        report.machine.line(),
        report.machine.command
    )
}

fn panel(result: &FlavorResult) -> Panel {
    Panel {
        title: format!(
            "{}: {} requests, {} failed ({} in flight on a killed replica), {} hits lost",
            result.label,
            result.requests.total(),
            result.requests.failed(),
            result.cut_by_kills,
            result.hits_lost()
        ),
        ok: result.ok_per_second.clone(),
        failed: result.failed_per_second.clone(),
        marks: result.marks.clone(),
        spans: Vec::new(),
        p99_ms: result.p99_ms_per_second.clone(),
    }
}

/// Writes `crash.json`, `crash.svg` and `summary.md` into `out`.
///
/// # Errors
/// If a file cannot be written.
pub fn write(report: &CrashReport, out: &Path) -> anyhow::Result<()> {
    report::write_json(&out.join("crash.json"), report)?;
    let panels: Vec<Panel> = report.results.iter().map(panel).collect();
    let title = format!(
        "Crash loop: R={}, K={} SIGKILLs {:?} apart, {} req/s, seed {}",
        report.options.replicas,
        report.options.kills,
        report.options.interval,
        report.options.rate,
        report.options.seed
    );
    std::fs::write(
        out.join("crash.svg"),
        report::timeline_svg(&title, report::CRASH_LEGEND, &panels),
    )?;
    std::fs::write(out.join("summary.md"), summary(report))?;
    Ok(())
}

/// The verdict of `--check`: every journal run must have had all its kills,
/// no failure but the requests in flight on a killed replica, its hits
/// within `answered ≤ stored ≤ answered + cut`, and every replica exit 0
/// at the end. A memory run that lost nothing earns a warning: the kills
/// would then be too gentle to tell.
pub fn verdict(report: &CrashReport) -> Result<(), String> {
    let mut problems = Vec::new();
    for result in &report.results {
        if result.durability == Durability::Memory {
            if result.hits_lost() == 0 {
                eprintln!(
                    "load: warning: {} lost no hit: the kills are too gentle to tell",
                    result.label
                );
            }
            continue;
        }
        let mut wrong = Vec::new();
        if result.kills.len() != usize::from(report.options.kills) {
            wrong.push(format!(
                "{} kills of {}",
                result.kills.len(),
                report.options.kills
            ));
        }
        if result.unexplained > 0 {
            wrong.push(format!(
                "{} failed requests not in flight on a killed replica",
                result.unexplained
            ));
        }
        if !result.within_bound() {
            wrong.push(format!(
                "hits answered {}, stored {}, cut {}: out of answered ≤ stored ≤ answered + cut",
                result.redirects_answered, result.hits_stored, result.redirects_cut
            ));
        }
        if !result.final_exits.iter().all(|e| e.code == Some(0)) {
            wrong.push(format!(
                "exits at the end [{}]",
                exits(result.final_exits.iter())
            ));
        }
        if !wrong.is_empty() {
            problems.push(format!("{}: {}", result.label, wrong.join(", ")));
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kill(slot: usize, at_s: f64) -> Kill {
        Kill {
            replica: format!("r{slot}"),
            slot,
            pid: 1,
            uptime: Duration::from_secs(3),
            at_s,
            ended: Ended {
                code: None,
                signal: Some(9),
                killed: false,
                after: Duration::ZERO,
            },
            ready_after: Duration::from_millis(200),
            same_ports: true,
            lb_out_after: None,
            lb_in_after: Duration::from_millis(300),
            cut: 0,
        }
    }

    fn failed(due_s: f64, latency_ms: u64, server: Option<u8>, fate: Fate) -> Record {
        Record {
            due: Duration::from_secs_f64(due_s),
            latency: Duration::from_millis(latency_ms),
            fate,
            kind: crate::traffic::Kind::Redirect,
            proto: Proto::Http1,
            status: if fate == Fate::Http5xx { 502 } else { 0 },
            retry_after: false,
            unconfirmed: false,
            server,
        }
    }

    #[test]
    fn only_a_failure_in_flight_at_a_kill_and_passed_on_by_the_balancer_is_explained() {
        let kills = [kill(1, 5.0), kill(2, 8.0)];
        let explained = |due_s, latency_ms, server, fate| {
            attribute(&failed(due_s, latency_ms, server, fate), &kills)
        };
        // A closed connection or a refused stream, out at the kill, or
        // handed to the dead replica's connections just after it.
        assert_eq!(explained(4.999, 3, None, Fate::Reset), Some(0));
        assert_eq!(explained(7.9, 102, None, Fate::Reset), Some(1));
        assert_eq!(explained(5.05, 3, None, Fate::Reset), Some(0));
        // A 502 naming the killed replica; not one naming another.
        assert_eq!(explained(4.999, 3, Some(1), Fate::Http5xx), Some(0));
        assert_eq!(explained(4.999, 3, Some(3), Fate::Http5xx), None);
        // The balancer's own 503 with no server is not in flight anywhere.
        assert_eq!(explained(4.999, 3, None, Fate::Http5xx), None);
        // Due past the grace, answered before the kill, or failing long
        // after it.
        assert_eq!(explained(5.2, 3, None, Fate::Reset), None);
        assert_eq!(explained(4.9, 3, None, Fate::Reset), None);
        assert_eq!(explained(4.999, 2000, None, Fate::Timeout), None);
        assert_eq!(explained(4.999, 900, None, Fate::Reset), None);
    }

    #[test]
    fn the_bound_allows_the_cut_and_nothing_lost() {
        let result = |answered: u64, stored: i64, cut: u64| FlavorResult {
            durability: Durability::Journal,
            label: String::new(),
            requests: FateCounts::default(),
            http1: FateCounts::default(),
            http2: FateCounts::default(),
            cut_by_kills: 0,
            unexplained: 0,
            unexplained_first: Vec::new(),
            latency_steady: Latency::default(),
            latency_after_kill: Latency::default(),
            kills: Vec::new(),
            final_exits: Vec::new(),
            redirects_answered: answered,
            redirects_cut: cut,
            hits_stored: stored,
            replays: Replays::default(),
            spill_files_left: 0,
            traffic_s: 0.0,
            ok_per_second: Vec::new(),
            failed_per_second: Vec::new(),
            p99_ms_per_second: Vec::new(),
            marks: Vec::new(),
        };
        assert!(result(100, 100, 0).within_bound());
        assert!(result(100, 103, 3).within_bound());
        assert!(!result(100, 104, 3).within_bound());
        assert!(!result(100, 99, 3).within_bound());
        assert_eq!(result(100, 99, 3).hits_lost(), 1);
    }
}
