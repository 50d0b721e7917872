//! The traces part's section of the summary: per route, the servers under
//! load, each traced one ÷ off run by run, what the traced ones exported,
//! and the instructions a request and a span cost.

use super::{ExitCounts, TracedRun, TracesCase, TracesReport, TracesSeries, FLAVORS};
use crate::bench::instructions::InstructionSeries;
use crate::bench::stats::{fmt_ratios, median};
use crate::bench::table::{fmt_busy, fmt_cpu, pairs_table, ratio, series_table};
use crate::bench::{Options, Series};
use crate::report;
use crate::SERVICE;

impl TracesSeries {
    /// Server spans received ÷ requests answered, one per run.
    #[allow(clippy::cast_precision_loss)]
    fn server_spans_per_request(&self) -> Vec<f64> {
        self.traced
            .iter()
            .map(|t| t.received.server_spans as f64 / t.answered.max(1) as f64)
            .collect()
    }
}

/// The traces part's section: per route, the servers under load, each
/// traced one ÷ off run by run, and what the traced ones exported; then
/// instructions per request and per span.
pub(in crate::bench) fn traces_summary(o: &Options, traces: &TracesReport, footer: &str) -> String {
    let mut text = format!(
        "### Traces: {SERVICE} with traces off, and exporting over OTLP/HTTP and OTLP/gRPC to a receiver on loopback sampling 1 % and all of the requests (`parentbased_traceidratio`), closed loop, {} connections, {} rounds of {:?} (+{:?} warm-up), servers taking turns\n\n\
         Batch span processor: {}. The receiver runs in the harness, on the load generator's core: it counts each export's spans by kind from its bytes (no message decoded) and answers success.\n\n",
        o.connections,
        o.rounds,
        o.duration,
        o.warmup,
        traces.settings.join(", "),
    );
    for case in &traces.cases {
        let Some((off, traced)) = case.series.split_first() else {
            continue;
        };
        let all: Vec<&Series> = case.series.iter().map(|s| &s.series).collect();
        let pairs: Vec<(&Series, &Series, String)> = traced
            .iter()
            .map(|s| (&s.series, &off.series, s.flavor.target(&case.route)))
            .collect();
        text.push_str(&format!(
            "#### `{}`\n\n{}\n{}\n{}\n\n{}\n",
            case.route,
            series_table(&all, &off.series),
            pairs_table(&pairs),
            quiet(&case.series),
            exported_table(&case.series),
        ));
    }
    text.push_str(&instructions_table(&traces.instructions, &traces.cases));
    text.push_str(footer);
    text.push('\n');
    text
}

/// How much the server's own CPU a request may vary between the rounds of
/// the same server before its throughput stops being a measurement: the
/// server does the same work each round, so a wider spread is the
/// machine's (another tenant of the host, which no steal time shows).
const QUIET_SPREAD: f64 = 1.10;

/// Whether the throughput above measures the servers: the spread of the
/// server CPU a request of traces off across the rounds (the same work
/// each round), and how busy each server kept its core (req/s × CPU a
/// request, median of the rounds): near 1, the server's core set the
/// pace; lower, the load generator did.
fn quiet(series: &[TracesSeries]) -> String {
    let Some(off) = series.first() else {
        return String::new();
    };
    let busy: Vec<String> = series
        .iter()
        .map(|s| {
            let busy = median(s.series.runs.iter().map(|r| r.rps * r.cpu_us / 1e6));
            format!("{} {busy:.2}", s.flavor.name())
        })
        .collect();
    format!(
        "Traces off's server CPU a request: {}. Server core busy (req/s × CPU a request, median of the rounds): {}.",
        spread(off.series.runs.iter().map(|run| run.cpu_us)),
        busy.join(", ")
    )
}

/// What the spread of a server's CPU a request across its rounds says.
fn spread(cpu_us: impl Iterator<Item = f64>) -> String {
    let cpu: Vec<f64> = cpu_us.filter(|cpu| cpu.is_finite() && *cpu > 0.0).collect();
    let (least, most) = (cpu.iter()).fold((f64::INFINITY, 0.0_f64), |(lo, hi), &c| {
        (lo.min(c), hi.max(c))
    });
    if cpu.is_empty() {
        "not measured".to_owned()
    } else if most / least <= QUIET_SPREAD {
        format!("{least:.2} to {most:.2} µs across the rounds: a quiet machine, the throughput is a measurement")
    } else {
        format!(
            "{least:.2} to {most:.2} µs across the rounds, more than {:.0} % apart for the same work: \
             the machine was not quiet, and the throughput ratios above are not a measurement (the instructions below are)",
            (QUIET_SPREAD - 1.0) * 100.0
        )
    }
}

/// What each server exported, beside its RSS and the export's CPU.
fn exported_table(series: &[TracesSeries]) -> String {
    let header: Vec<String> = [
        "server",
        "requests answered (all runs)",
        "sampled (ratio)",
        "server spans received ÷ requests, run by run",
        "database spans received",
        "other spans received",
        "spans per export (mean)",
        "bytes per span (mean)",
        "spans received, every kind",
        "at exit, server's count: ended / exported / dropped",
        "trace pipeline warnings",
        "RSS at end of run, MiB (median / max)",
        "export threads' CPU µs a request (median)",
        "receiver busy (median)",
    ]
    .map(str::to_owned)
    .into();
    let rows: Vec<Vec<String>> = series.iter().map(exported_row).collect();
    report::table(&header, &rows)
}

/// One server's row of [`exported_table`]; traces off, a dash where only
/// an exporting server has a figure.
fn exported_row(s: &TracesSeries) -> Vec<String> {
    let answered: u64 = s.traced.iter().map(|t| t.answered).sum();
    let traced = s.flavor.transport.is_some();
    let or_dash = |cell: String| if traced { cell } else { "–".to_owned() };
    #[allow(clippy::cast_precision_loss)]
    let mean = |total: u64, of: u64| {
        if of > 0 {
            format!("{:.0}", total as f64 / of as f64)
        } else {
            "–".to_owned()
        }
    };
    let received = &s.received;
    let export_cpu = s.traced.iter().map(|t| t.export_cpu_us);
    let receiver_busy = s.traced.iter().map(|t| t.receiver_busy);
    vec![
        s.series.server.clone(),
        answered.to_string(),
        or_dash(format!("{:.3}", s.flavor.ratio)),
        or_dash(fmt_ratios(&s.server_spans_per_request())),
        or_dash(received.client_spans.to_string()),
        or_dash(received.other_spans.to_string()),
        or_dash(mean(received.spans(), received.exports)),
        or_dash(mean(received.bytes, received.spans())),
        or_dash(received.spans().to_string()),
        or_dash(exit_cell(&s.exit)),
        or_dash(warnings_cell(&s.exit)),
        rss_cell(&s.traced),
        or_dash(fmt_cpu(median(export_cpu.filter(|v| v.is_finite())))),
        or_dash(fmt_busy(median(receiver_busy.filter(|v| v.is_finite())))),
    ]
}

/// The server's own count at exit: ended / exported / dropped.
fn exit_cell(exit: &ExitCounts) -> String {
    exit.spans_exported.map_or_else(
        || "not logged".to_owned(),
        |exported| {
            let dropped = exit.spans_dropped;
            format!("{} / {exported} / {dropped}", exported + dropped)
        },
    )
}

/// The trace pipeline's warnings with how often each came, or `none`.
fn warnings_cell(exit: &ExitCounts) -> String {
    if exit.sdk_warnings.is_empty() {
        return "none".to_owned();
    }
    (exit.sdk_warnings.iter())
        .map(|(name, seen)| format!("{name} ×{seen}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The RSS at the end of each run, MiB: median / max, or a dash if none
/// was read.
fn rss_cell(traced: &[TracedRun]) -> String {
    #[allow(clippy::cast_precision_loss)]
    let rss: Vec<f64> = (traced.iter())
        .filter_map(|t| t.rss_kib)
        .map(|kib| kib as f64 / 1024.0)
        .collect();
    if rss.is_empty() {
        return "–".to_owned();
    }
    format!(
        "{:.1} / {:.1}",
        median(rss.iter().copied()),
        rss.iter().copied().fold(0.0, f64::max)
    )
}

/// Instructions per request, off and on, per route, with on ÷ off; and
/// what sampling adds to a request, and a span costs.
fn instructions_table(series: &[InstructionSeries], cases: &[TracesCase]) -> String {
    if series.is_empty() {
        return String::new();
    }
    let header: Vec<String> = [
        "route",
        "server",
        "instructions per request (callgrind)",
        "÷ traces off",
        "more than off, a request",
        "a span, all in (sampled 1.0)",
    ]
    .map(str::to_owned)
    .into();
    let rows: Vec<Vec<String>> = series
        .chunks(FLAVORS.len())
        .flat_map(|route| {
            let off = route[0].per_request;
            let spans = cases
                .iter()
                .find(|case| case.route == route[0].route)
                .map_or(1, |case| case.spans_per_request);
            route.iter().zip(FLAVORS).map(move |(s, flavor)| {
                let more = s.per_request - off;
                let traced = flavor.transport.is_some();
                vec![
                    format!("`{}`", s.route),
                    s.server.clone(),
                    format!("{:.0}", s.per_request),
                    ratio(s.per_request, off),
                    if traced {
                        format!("{more:.0}")
                    } else {
                        "–".to_owned()
                    },
                    if traced && flavor.ratio >= 1.0 {
                        format!("{:.0}", more / f64::from(spans))
                    } else {
                        "–".to_owned()
                    },
                ]
            })
        })
        .collect();
    format!(
        "Instructions under callgrind (the whole process, export threads included; the difference of a 1,000- and an 11,000-request run over 8 connections). A span, all in: what a request sampled costs more than one with traces off, ÷ the spans it makes (the redirect 1, the link shown 2: its server span and its database read). Targets: a span ≤ 8,000; sampled 0.01, ≤ 1,000 more a request.\n\n{}\n",
        report::table(&header, &rows)
    )
}

#[cfg(test)]
mod tests {
    use lameduck_testkit::otlp::Received;

    use super::super::{settings, Flavor};
    use super::*;
    use crate::bench::tests::series;

    fn traced(flavor: Flavor, rps: &[f64], received: u64) -> TracesSeries {
        let run = TracedRun {
            answered: 1000,
            received: Received {
                exports: 2,
                server_spans: received,
                bytes: received * 300,
                ..Received::default()
            },
            rss_kib: Some(20 * 1024),
            export_cpu_us: 2.0,
            receiver_busy: 0.1,
        };
        TracesSeries {
            series: series(&flavor.name(), rps),
            flavor,
            traced: vec![run; rps.len()],
            exit: ExitCounts {
                spans_exported: Some(received * rps.len() as u64),
                spans_dropped: (1000 - received) * rps.len() as u64,
                sdk_warnings: Vec::new(),
            },
            received: Received {
                exports: 4,
                server_spans: received * rps.len() as u64,
                bytes: received * rps.len() as u64 * 300,
                ..Received::default()
            },
        }
    }

    // The summary says which settings ran, prices each server against off
    // run by run with its target, shows dropped spans rather than hiding
    // them, and prices a span from the instructions.
    #[test]
    fn the_summary_gives_on_over_off_and_the_dropped_spans() {
        use clap::Parser;
        let options = crate::bench::tests::Args::parse_from(["load"]).options;
        let [off, http_some, http_all, grpc_some, grpc_all] = FLAVORS;
        let instructions = [20_000.0, 20_500.0, 28_000.0, 20_600.0, 28_500.0]
            .into_iter()
            .zip(FLAVORS)
            .map(|(per_request, flavor)| InstructionSeries {
                route: "GET /{code}".to_owned(),
                server: flavor.name(),
                totals: Vec::new(),
                per_request,
            })
            .collect();
        let report = TracesReport {
            settings: settings(),
            cases: vec![TracesCase {
                route: "GET /{code}".to_owned(),
                spans_per_request: 1,
                series: vec![
                    traced(off, &[100.0, 100.0], 0),
                    traced(http_some, &[98.0, 99.0], 10),
                    traced(http_all, &[50.0, 60.0], 1000),
                    traced(grpc_some, &[97.0, 97.0], 10),
                    traced(grpc_all, &[40.0, 40.0], 900),
                ],
            }],
            instructions,
        };
        let text = traces_summary(&options, &report, "footer");
        assert!(
            text.contains("OTEL_BSP_SCHEDULE_DELAY=200 (set by the bench)"),
            "{text}"
        );
        assert!(
            text.contains("OTEL_BSP_MAX_QUEUE_SIZE=2048 (the SDK's default)"),
            "{text}"
        );
        let all = format!("| {} ÷ {} | 0.550 (0.50–0.60)", http_all.name(), off.name());
        assert!(text.contains(&all), "{text}");
        assert!(text.contains("| ≥ 0.80 "), "{text}");
        assert!(text.contains("| ≥ 0.97 "), "{text}");
        assert!(text.contains("| 2000 / 1800 / 200 "), "{text}");
        // The same CPU a request in every round of off: quiet; and each
        // test server's core busy all the time (rps × its CPU a request).
        assert!(
            text.contains("10000.00 to 10000.00 µs across the rounds: a quiet machine"),
            "{text}"
        );
        assert!(text.contains(&format!("{} 1.00, ", off.name())), "{text}");
        assert!(text.contains("| 0.900 (0.90–0.90) "), "{text}");
        assert!(text.contains("| 0.010 (0.01–0.01) "), "{text}");
        // Sampled 0.01: 500 more a request; all: 8,000 a span.
        let cells = |server: &str| -> Vec<String> {
            let row = text
                .lines()
                .find(|line| line.starts_with("| `GET /{code}`") && line.contains(server))
                .unwrap_or_else(|| panic!("no instructions row of {server}:\n{text}"));
            row.split('|').map(|cell| cell.trim().to_owned()).collect()
        };
        assert_eq!(cells(&http_some.name())[5..7], ["500", "–"]);
        assert_eq!(cells(&http_all.name())[5..7], ["8000", "8000"]);
    }

    // The same work taking 10 % more CPU in one round than in another is
    // a quiet machine; more is not, and the section says the throughput
    // is no measurement then. Rounds not measured (NaN) are left out.
    #[test]
    fn the_spread_of_the_same_work_tells_a_quiet_machine() {
        let quiet = spread([9.81, 10.2, f64::NAN, 10.79].into_iter());
        assert!(
            quiet.starts_with("9.81 to 10.79 µs") && quiet.contains("a quiet machine"),
            "{quiet}"
        );
        let noisy = spread([11.45, 20.83, 12.0].into_iter());
        assert!(
            noisy.contains("not quiet") && noisy.contains("not a measurement"),
            "{noisy}"
        );
        assert_eq!(spread([f64::NAN].into_iter()), "not measured");
    }
}
