//! The run's verdict and its Markdown summary: one column per attack, how
//! it was run, and a note for anything that did not go as asked.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::{
    most, AbuseReport, AttackReport, KindSummary, Options, MOST, PER_PROCESS, RAMP_LIMIT,
    RATE_OVERSHOOT,
};
use crate::report::{self, fmt_ms};
use crate::{metric, SERVICE};

/// What failed: one line per problem; empty when the run passed.
pub fn verdict(report: &AbuseReport) -> Vec<String> {
    let mut problems = Vec::new();
    for attack in &report.attacks {
        for (what, kind) in [
            ("redirects", &attack.redirects),
            ("link creations", &attack.creations),
        ] {
            if kind.requests == 0 || kind.succeeded < kind.requests {
                problems.push(format!(
                    "{}: {what} {} of {} succeeded",
                    attack.attack.title(),
                    kind.succeeded,
                    kind.requests
                ));
            }
        }
        if attack.ended.code != Some(0) {
            problems.push(format!(
                "{}: the server exited {} after SIGTERM",
                attack.attack.title(),
                attack.ended.describe()
            ));
        }
    }
    problems
}

/// The Markdown summary: one column per attack.
pub fn summary(report: &AbuseReport) -> String {
    let attacks = &report.attacks;
    let mut header = vec![String::new()];
    header.extend(attacks.iter().map(|a| a.attack.title()));
    let mut rows = held_rows(attacks);
    rows.extend(client_rows(attacks));
    rows.extend(server_rows(attacks));
    let mut text = format!(
        "### Abuse: slow bodies and slowloris (slowhttptest) against {SERVICE} with default settings, a normal client alongside, then SIGTERM\n\n{}",
        report::table(&header, &rows)
    );
    write_method(&mut text, attacks);
    write_client(&mut text, &report.options);
    for attack in attacks {
        let notes = notes(attack);
        if !notes.is_empty() {
            let _ = writeln!(
                text,
                "\n**{}: {}.**",
                attack.attack.title(),
                notes.join("; ")
            );
        }
    }
    let _ = write!(
        text,
        "\nMachine: {}\n\nCommand: `{}`\n",
        report.machine.line(),
        report.machine.command
    );
    text
}

/// A row: its name, then one cell per attack.
fn row(
    attacks: &[AttackReport],
    name: &str,
    cell: &dyn Fn(&AttackReport) -> String,
) -> Vec<String> {
    let mut row = vec![name.to_owned()];
    row.extend(attacks.iter().map(cell));
    row
}

/// What the attack held, and when the measurement started.
fn held_rows(attacks: &[AttackReport]) -> Vec<Vec<String>> {
    vec![
        row(
            attacks,
            "attack connections held at once, peak (slowhttptest)",
            &|a| a.held.peak.to_string(),
        ),
        row(
            attacks,
            "… while measuring, min–max (slowhttptest, per second)",
            &|a| format!("{}–{}", a.held.window_min, a.held.window_max),
        ),
        row(
            attacks,
            &format!("`{}` while measuring, min–max", metric("connections_open")),
            &|a| format!("{}–{}", a.held.server_min, a.held.server_max),
        ),
        row(attacks, "measuring from (attack start +)", &|a| {
            format!("{:.1} s", a.ramp.as_secs_f64())
        }),
    ]
}

/// How the normal client fared.
fn client_rows(attacks: &[AttackReport]) -> Vec<Vec<String>> {
    let rate = |kind: &KindSummary| format!("**{}**", percent(kind.success_percent));
    vec![
        row(attacks, "redirects `GET /{code}`: 307 / sent", &|a| {
            format!("{} / {}", a.redirects.succeeded, a.redirects.requests)
        }),
        row(attacks, "redirects: success rate", &|a| rate(&a.redirects)),
        row(attacks, "redirects: p50 / p99 / max (ms)", &|a| {
            a.redirects.latency.cell()
        }),
        row(
            attacks,
            "link creations `POST /api/links`: 201 / sent",
            &|a| format!("{} / {}", a.creations.succeeded, a.creations.requests),
        ),
        row(attacks, "link creations: success rate", &|a| {
            rate(&a.creations)
        }),
        row(attacks, "link creations: p50 / p99 / max (ms)", &|a| {
            a.creations.latency.cell()
        }),
        row(attacks, "normal requests failed, by fate", &failures),
    ]
}

/// The server's counters, slowhttptest's probe, and the server's exit.
fn server_rows(attacks: &[AttackReport]) -> Vec<Vec<String>> {
    vec![
        row(
            attacks,
            &format!("`{}`", metric("requests_shed_total")),
            &|a| format!("{:.0}", a.counters.shed),
        ),
        row(
            attacks,
            &format!("`{}`", metric("requests_timed_out_total")),
            &|a| format!("{:.0}", a.counters.timed_out),
        ),
        row(attacks, "`http_requests_total` 4xx / 5xx", &http_errors),
        row(attacks, "slowhttptest's probe: service available", &|a| {
            format!(
                "{} of {} reports",
                a.held.probe_reports - a.held.probe_unavailable,
                a.held.probe_reports
            )
        }),
        row(attacks, "**exit code after SIGTERM**", &|a| {
            format!("**{}**", a.ended.describe())
        }),
        row(attacks, "SIGTERM → exit", &|a| {
            format!("{} ms", fmt_ms(a.ended.after.as_secs_f64() * 1e3))
        }),
    ]
}

/// The normal requests that failed, by fate, both kinds together.
fn failures(attack: &AttackReport) -> String {
    let mut all: BTreeMap<String, u64> = BTreeMap::new();
    for (class, count) in attack
        .redirects
        .failures
        .iter()
        .chain(&attack.creations.failures)
    {
        *all.entry(class.clone()).or_default() += count;
    }
    if all.is_empty() {
        "none".to_owned()
    } else {
        all.iter()
            .map(|(class, count)| format!("{class}: {count}"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// The 4xx and 5xx series that grew, and by how much.
fn http_errors(attack: &AttackReport) -> String {
    if attack.counters.http_errors.is_empty() {
        "none".to_owned()
    } else {
        attack
            .counters
            .http_errors
            .iter()
            .map(|(series, count)| format!("`{series}` {count:.0}"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// How the attacks were run, and each one's command line.
fn write_method(text: &mut String, attacks: &[AttackReport]) {
    let _ = write!(
        text,
        "\nEach attack runs against a fresh `{SERVICE} server` (default settings: `--max-connections` 10000, `--max-concurrent-requests` 1024, `--body-read-timeout` and `--header-read-timeout` 10s; SQLite; port 0). \
         slowhttptest never reopens a connection the server has closed, and {SERVICE} closes a slow one after 10 s, so each process opens {overshoot} × its share ÷ 10 s connections a second (`-r`) for as long as it runs, which holds about its share at once; \
         at most {per} per process, since one process's loop slows down with every socket it has opened. \
         The harness stops it with SIGINT when the measurement ends (`-l` only bounds it). Commands, run in the output folder:\n\n",
        overshoot = RATE_OVERSHOOT,
        per = PER_PROCESS,
    );
    for attack in attacks {
        let first = attack
            .processes
            .first()
            .map_or("–", |process| process.command.as_str());
        let count = attack.processes.len();
        let times = if count == 1 {
            String::new()
        } else {
            format!(" ({count} processes, each like this one, `-o …-1` to `…-{count}`)")
        };
        let _ = writeln!(text, "- {}: `{first}`{times}", attack.attack.title());
    }
}

/// How the normal client ran and what the counters count.
fn write_client(text: &mut String, options: &Options) {
    let _ = write!(
        text,
        "\nNormal client: open loop, {rate} req/s each of `GET /{{code}}` (a link created before the attack; 307 expected) and `POST /api/links` (201), every request on a new connection with a {timeout:?} timeout, for {window:?} from the moment slowhttptest reported {most:.0} % of its connections up. \
         Latency counts from when a request was due, connect included; percentiles are of the successful ones. \
         Counters: `/metrics` (on the admin listener, `--admin-listen 127.0.0.1:0`) after the attack minus before it; the 4xx of `/api/links` are the attack's own: slow bodies answered 408 after 10 s, and slowhttptest's probes (`GET /api/links`, 405, one per process every 5 s). \
         `{open}` includes the normal client's connections.\n",
        rate = options.rate,
        timeout = options.timeout,
        window = options.window,
        most = MOST * 100.0,
        open = metric("connections_open"),
    );
}

/// What did not go as asked in `attack`.
fn notes(attack: &AttackReport) -> Vec<String> {
    let mut notes = Vec::new();
    if attack.held.peak < u64::from(attack.target) {
        notes.push(format!(
            "slowhttptest held at most {} of the {} connections asked for",
            attack.held.peak, attack.target
        ));
    } else if attack.held.window_min < most(attack.target) {
        notes.push(format!(
            "slowhttptest held as few as {} connections in a second of the measurement",
            attack.held.window_min
        ));
    }
    if !attack.ramp_reached {
        notes.push(format!(
            "the measurement started after {:?} without {:.0} % of the connections up",
            RAMP_LIMIT,
            MOST * 100.0
        ));
    }
    for process in &attack.processes {
        if let Some(lowered) = process.lowered_to {
            notes.push(format!(
                "a slowhttptest process lowered its connection count to {lowered} for lack of file descriptors"
            ));
        }
        if process.exit != "0" {
            notes.push(format!("a slowhttptest process exited {}", process.exit));
        }
    }
    if attack.held.failed_scrapes > 0 {
        notes.push(format!(
            "{} reads of `/metrics` failed during the measurement",
            attack.held.failed_scrapes
        ));
    }
    if attack.ended.killed {
        notes.push("the server had to be killed".to_owned());
    }
    notes
}

fn percent(value: f64) -> String {
    if (value - 100.0).abs() < f64::EPSILON {
        "100 %".to_owned()
    } else {
        format!("{value:.2} %")
    }
}
