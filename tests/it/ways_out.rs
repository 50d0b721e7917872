//! Every way out keeps every hit, tested against the real binary.
//!
//! One row per way the process can end — clean signals, a passed deadline,
//! a second signal in each phase, the database down, a panicking worker, a
//! finalizer over its budget, an in-place upgrade and one whose successor
//! fails, a spill that cannot be written — on SQLite and on PostgreSQL.
//! Each row runs redirect traffic while its way out happens, counts the
//! 307s the client received, checks the exit code, restarts the service on
//! the same data (which applies any spill file) and compares: the hits
//! stored equal the hits answered, exactly. Only the rows where the spill
//! cannot be written may lose hits, and there the loss must be reported
//! with the right count.
//!
//! Hits are held in memory (`--flush-interval 1h`), so what the exit path
//! does with them is the only thing that can save them. The README's
//! "Ways out" table is this table in prose; keep them in step.
//!
//! Two rows need fault injection (`--features failpoints`, which
//! `scripts/test` turns on): a critical worker that panics and a finalizer
//! that hangs.

use std::fs;
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use lameduck::exit::Exit;
use nix::sys::signal::{kill, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use tempfile::TempDir;

use lameduck_testkit::binary::{
    create_link, finish_slow_post, metric, metrics, request, start_slow_post, wait_metric,
    LameduckProcess,
};
use lameduck_testkit::otlp::{self, Behaviour, Protocol, ReceivedSpan, Receiver, StatusCode};
use lameduck_testkit::postgres::PgCluster;
use lameduck_testkit::traffic::{Kind, Plan, Tally, Traffic};

/// Bound on anything that should take well under a second or two: a log
/// line, an exit, a successor's start. Reaching it is a failure.
const PATIENCE: Duration = Duration::from_secs(30);

/// Pause between two redirects of the traffic's client: enough to leave the
/// server's core to the server on this 2-core machine.
const TRAFFIC_PACE: Duration = Duration::from_millis(2);

/// Redirects answered before a row's way out begins.
const WARM_UP_HITS: u64 = 40;
/// The journal's bytes once its first segments are made: two of 256 KiB.
const JOURNAL_READY_BYTES: f64 = 512.0 * 1024.0;
/// The file that fills a spill directory's disk.
const FILLER: &str = "filler";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Database {
    Sqlite,
    Postgres,
}

/// Whether the journal found room on a disk that fills up.
#[derive(Clone, Copy, Debug)]
enum Room {
    /// None: not one segment fits (64 KiB), so no update is journaled.
    None,
    /// Its segments made before the disk filled (2 MiB): every update is.
    ForTheJournal,
}

/// How the spill directory cannot be written.
#[derive(Clone, Copy, Debug)]
enum Unwritable {
    /// On a tmpfs with no room left: `ENOSPC`.
    DiskFull,
    /// On a tmpfs remounted read-only: `EROFS`, even for root.
    ReadOnly,
    /// Under a regular file: the directory can never exist (`ENOTDIR`).
    Missing,
}

/// A way the process ends.
#[derive(Clone, Copy, Debug)]
enum Way {
    /// SIGTERM with nothing in flight.
    SigtermIdle,
    /// SIGTERM while a request is in flight; it finishes in the drain.
    SigtermInFlight,
    /// SIGINT (Ctrl-C).
    Sigint,
    /// A stalled request body holds the drain past `--shutdown-timeout`.
    Deadline,
    /// The same, with PostgreSQL stopped: the final flush spills.
    DeadlineDatabaseDown,
    /// A second signal during the lame duck (`--drain-delay`).
    SecondSignalInLameDuck(Signal),
    /// A second signal while a stalled request holds the drain.
    SecondSignalInDrain(Signal),
    /// A second signal while the final flush retries a stopped PostgreSQL.
    SecondSignalInFinalFlush(Signal),
    /// PostgreSQL stopped before SIGTERM: the final flush spills.
    DatabaseDownAtShutdown,
    /// The hit flusher panics: the process shuts itself down.
    CriticalWorkerPanic,
    /// Closing the pool hangs past its budget.
    FinalizerOverBudget,
    /// SIGHUP: a successor takes the socket over, then SIGTERM to it.
    Upgrade,
    /// SIGHUP to a binary replaced by one that fails at startup.
    UpgradeSuccessorFails,
    /// A second signal (SQLite) or the database down (PostgreSQL) with a
    /// spill directory that cannot be written, hits in memory only.
    SpillImpossible(Unwritable),
    /// PostgreSQL down at SIGTERM, the spill directory's disk full, and
    /// the hits journaled (the default durability) as far as it had room.
    DiskFullJournaled(Room),
}

/// What a row must find after the way out.
#[derive(Clone, Copy, Debug)]
enum Kept {
    /// Every answered hit stored, and nothing more.
    Exact,
    /// Every answered hit lost, and the loss reported with its count.
    LossReported,
    /// Every answered hit lost, reported with its count, and the journal's
    /// failure reported when it happened, with its directory.
    JournalFailureReported,
}

macro_rules! ways_out {
    ($($name:ident: $database:ident, $way:expr, $exit:ident, $kept:ident;)*) => {
        $(
            #[test]
            fn $name() {
                way_out(Database::$database, $way, Exit::$exit, Kept::$kept);
            }
        )*
    };
}

use Signal::{SIGINT, SIGTERM};
use Unwritable::{DiskFull, Missing, ReadOnly};
use Way::*;

ways_out! {
    // name                                        database  way                                  exit              kept
    sigterm_idle_sqlite:                           Sqlite,   SigtermIdle,                         Clean,            Exact;
    sigterm_idle_postgres:                         Postgres, SigtermIdle,                         Clean,            Exact;
    sigterm_in_flight_sqlite:                      Sqlite,   SigtermInFlight,                     Clean,            Exact;
    sigterm_in_flight_postgres:                    Postgres, SigtermInFlight,                     Clean,            Exact;
    sigint_sqlite:                                 Sqlite,   Sigint,                              Clean,            Exact;
    sigint_postgres:                               Postgres, Sigint,                              Clean,            Exact;
    deadline_sqlite:                               Sqlite,   Deadline,                            DeadlineExceeded, Exact;
    deadline_postgres:                             Postgres, Deadline,                            DeadlineExceeded, Exact;
    deadline_with_database_down:                   Postgres, DeadlineDatabaseDown,                DeadlineExceeded, Exact;
    repeated_sigterm_in_lame_duck_sqlite:          Sqlite,   SecondSignalInLameDuck(SIGTERM),     Forced,           Exact;
    sigint_in_lame_duck_sqlite:                    Sqlite,   SecondSignalInLameDuck(SIGINT),      Forced,           Exact;
    repeated_sigterm_in_lame_duck_postgres:        Postgres, SecondSignalInLameDuck(SIGTERM),     Forced,           Exact;
    sigint_in_lame_duck_postgres:                  Postgres, SecondSignalInLameDuck(SIGINT),      Forced,           Exact;
    repeated_sigterm_in_drain_sqlite:              Sqlite,   SecondSignalInDrain(SIGTERM),        Forced,           Exact;
    sigint_in_drain_sqlite:                        Sqlite,   SecondSignalInDrain(SIGINT),         Forced,           Exact;
    repeated_sigterm_in_drain_postgres:            Postgres, SecondSignalInDrain(SIGTERM),        Forced,           Exact;
    sigint_in_drain_postgres:                      Postgres, SecondSignalInDrain(SIGINT),         Forced,           Exact;
    repeated_sigterm_in_final_flush:               Postgres, SecondSignalInFinalFlush(SIGTERM),   Forced,           Exact;
    sigint_in_final_flush:                         Postgres, SecondSignalInFinalFlush(SIGINT),    Forced,           Exact;
    database_down_at_shutdown:                     Postgres, DatabaseDownAtShutdown,              StateSpilled,     Exact;
    critical_worker_panic_sqlite:                  Sqlite,   CriticalWorkerPanic,                 WorkerFailed,     Exact;
    critical_worker_panic_postgres:                Postgres, CriticalWorkerPanic,                 WorkerFailed,     Exact;
    finalizer_over_budget_sqlite:                  Sqlite,   FinalizerOverBudget,                 FinalizerFailed,  Exact;
    finalizer_over_budget_postgres:                Postgres, FinalizerOverBudget,                 FinalizerFailed,  Exact;
    upgrade_sqlite:                                Sqlite,   Upgrade,                             Clean,            Exact;
    upgrade_postgres:                              Postgres, Upgrade,                             Clean,            Exact;
    upgrade_with_failing_successor_sqlite:         Sqlite,   UpgradeSuccessorFails,               Clean,            Exact;
    upgrade_with_failing_successor_postgres:       Postgres, UpgradeSuccessorFails,               Clean,            Exact;
    spill_impossible_read_only_sqlite:             Sqlite,   SpillImpossible(ReadOnly),           StateLost,        LossReported;
    spill_impossible_missing_dir_sqlite:           Sqlite,   SpillImpossible(Missing),            StateLost,        LossReported;
    spill_impossible_disk_full_postgres:           Postgres, SpillImpossible(DiskFull),           StateLost,        LossReported;
    disk_full_no_room_for_the_journal_postgres:    Postgres, DiskFullJournaled(Room::None),       StateLost,        JournalFailureReported;
    disk_full_the_journal_keeps_postgres:          Postgres, DiskFullJournaled(Room::ForTheJournal), StateSpilled, Exact;
}

/// Runs one row: start, traffic, the way out, the exit code, then a restart
/// on the same data that reads back the hits.
fn way_out(database: Database, way: Way, exit: Exit, kept: Kept) {
    let cluster = (database == Database::Postgres).then(PgCluster::start);
    let data = TempDir::new().expect("data dir");
    let spill = SpillDir::new(way);
    let binary = Binary::new(way);
    let mut args = Args::new(&data, cluster.as_ref(), &spill);
    match way {
        Deadline | DeadlineDatabaseDown => args.push(&["--shutdown-timeout", "1s"]),
        SecondSignalInLameDuck(_) => args.push(&["--drain-delay", "30s"]),
        // The spill file is the only copy: with the journal, what it took
        // would be kept (and a tmpfs with a journal mapped cannot be
        // remounted read-only).
        SpillImpossible(ReadOnly | Missing) => {
            args.push(&["--drain-delay", "30s", "--state-durability", "memory"]);
        }
        SpillImpossible(DiskFull) => args.push(&["--state-durability", "memory"]),
        CriticalWorkerPanic => args.set_flush_interval("2s"),
        Upgrade | UpgradeSuccessorFails => {
            args.push(&["--pid-file", &data.path().join("pid").display().to_string()]);
        }
        _ => {}
    }
    let failpoints = match way {
        CriticalWorkerPanic => "write-behind-flusher=panic",
        FinalizerOverBudget => "close-database-pool-hangs=return",
        _ => "",
    };
    // The rows whose spans no other test holds (tests/it/traces.rs has the
    // rest) run traced, each batch held until the exit or until it is full.
    let receiver = traced(way).then(|| Receiver::start(Protocol::Grpc, Behaviour::Answer));
    let mut envs = vec![("FAILPOINTS", failpoints.to_owned())];
    if let Some(receiver) = &receiver {
        envs.extend(otlp::envs(Protocol::Grpc, &receiver.endpoint()));
        envs.push(("OTEL_BSP_SCHEDULE_DELAY", HELD.to_owned()));
    }
    let envs: Vec<(&str, &str)> = envs.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let mut server = LameduckProcess::start_exe(binary.path(), &args.as_strs(), &envs);
    // A spill directory that cannot be written fails the start (tested in
    // tests/it/state.rs), so it turns unwritable while the process runs, as
    // a disk fills up or a volume goes away.
    if let DiskFullJournaled(Room::ForTheJournal) = way {
        // The flusher makes the journal's segments as it starts.
        wait_metric(
            server.admin_addr(),
            "lameduck_hits_journal_bytes",
            |bytes| bytes >= JOURNAL_READY_BYTES,
        );
    }
    spill.make_unwritable();
    let addr = server.addr();
    let code = create_link(addr, "https://example.com/way-out");
    // Redirects on a new connection each, one after the other, until
    // stopped or until the listener closes.
    let traffic = Plan::redirects(addr, &code)
        .clients(&[Kind::NewConnection], 1)
        .pause(TRAFFIC_PACE)
        .until_closed()
        .start();
    traffic.wait_for(WARM_UP_HITS);

    let answered = leave(way, &mut server, traffic, cluster.as_ref(), &binary, &data);
    let exit_code = match way {
        // The first process handed over; the successor is the one that
        // received the SIGTERM, and its exit code is in the shared logs.
        Upgrade => successor_exit_code(&server),
        _ => server.exit_code(PATIENCE),
    };
    let logs = server.log_text();
    assert_eq!(
        exit_code,
        i32::from(exit.code()),
        "{way:?}: exit code; logs:\n{logs}"
    );
    if let Some(receiver) = &receiver {
        assert_every_span_flushed(way, receiver, answered, &logs);
    }
    drop(server);

    if let Some(cluster) = &cluster {
        if !cluster.is_running() {
            cluster.start_again();
        }
    }
    // The restart serves the default spill directory: an unwritable one
    // would fail the start, and its files were never written anyway —
    // unless the journal kept them there, with room made again.
    let restart = if spill.journal_kept() {
        spill.make_room();
        Args::new(&data, cluster.as_ref(), &spill)
    } else {
        Args::new(&data, cluster.as_ref(), &SpillDir::Default)
    };
    let mut restarted = LameduckProcess::start(&restart.as_strs(), &[]);
    let stored = stored_hits(restarted.addr(), &code);
    restarted.signal(SIGTERM);
    assert_eq!(restarted.exit_code(PATIENCE), 0, "{}", restarted.log_text());

    match kept {
        Kept::Exact => assert_eq!(
            stored, answered,
            "{way:?}: hits stored after the restart vs 307s answered; logs:\n{logs}"
        ),
        Kept::LossReported | Kept::JournalFailureReported => {
            assert_eq!(stored, 0, "{way:?}: nothing could be saved; logs:\n{logs}");
            if let Kept::JournalFailureReported = kept {
                let line = logs
                    .lines()
                    .find(|line| line.contains("the journal cannot take updates"))
                    .unwrap_or_else(|| panic!("{way:?}: no journal failure; logs:\n{logs}"));
                let line: serde_json::Value = serde_json::from_str(line).expect("JSON");
                let path = spill.path().expect("an explicit spill dir");
                assert_eq!(line["dir"], path.display().to_string(), "{line}");
                assert_eq!(line["level"], "ERROR", "{line}");
                // And how many, as the batch that holds them is sealed.
                let counted: u64 = logs
                    .lines()
                    .filter(|line| line.contains("updates not in the journal"))
                    .map(|line| {
                        let line: serde_json::Value = serde_json::from_str(line).expect("JSON");
                        assert_eq!(line["dir"], path.display().to_string(), "{line}");
                        line["updates"].as_u64().expect("a count")
                    })
                    .sum();
                assert_eq!(
                    counted, answered,
                    "{way:?}: unjournaled count; logs:\n{logs}"
                );
            }
            let line = logs
                .lines()
                .find(|line| line.contains("hits lost: the spill file cannot be written"))
                .unwrap_or_else(|| panic!("{way:?}: no loss reported; logs:\n{logs}"));
            let line: serde_json::Value = serde_json::from_str(line).expect("a JSON log line");
            assert_eq!(line["updates"], answered, "{way:?}: lost count; {line}");
            let path = spill.path().expect("an explicit spill dir");
            assert_eq!(line["path"], path.display().to_string(), "{line}");
            assert!(
                logs.contains(&format!("state_lost={answered}"))
                    || logs.contains(&format!("\"state_lost\":{answered}")),
                "{way:?}: the summary line counts the loss; logs:\n{logs}"
            );
        }
    }
}

/// The batch delay of the traced rows: longer than any row, so that the
/// spans the receiver has were exported by a full batch or by the flush
/// at the exit.
const HELD: &str = "600000";

/// Whether `way` runs traced: the rows whose spans `tests/it/traces.rs` does
/// not already follow (the README's ways-out rows without a ²).
fn traced(way: Way) -> bool {
    matches!(
        way,
        DeadlineDatabaseDown
            | DatabaseDownAtShutdown
            | Upgrade
            | UpgradeSuccessorFails
            | SpillImpossible(_)
            | DiskFullJournaled(_)
    )
}

/// What a traced row must find at the receiver once every process has
/// exited: one server span for each redirect answered (each process
/// flushing its own: an upgrade's two), the write-behind component's final
/// work among the spans (the flush, or the spill), and no span dropped.
fn assert_every_span_flushed(way: Way, receiver: &Receiver, answered: u64, logs: &str) {
    let spans = receiver.spans();
    let redirects = spans
        .iter()
        .filter(|span| span.name == "GET /{code}")
        .filter(|span| span.attr_i64("http.response.status_code") == Some(307))
        .count();
    assert_eq!(
        redirects as u64, answered,
        "{way:?}: server spans of the redirects answered; logs:\n{logs}"
    );
    assert!(
        spans
            .iter()
            .any(|span| span.name.starts_with("write-behind")),
        "{way:?}: the final flush's span; spans: {:?}",
        spans.iter().map(|span| &span.name).collect::<Vec<_>>()
    );
    if matches!(way, DatabaseDownAtShutdown) {
        // The final flush's database calls failed, and their spans say so.
        let calls: Vec<_> = spans
            .iter()
            .filter(|span| span.name == "UPDATE links")
            .filter(|span| inside(&spans, span, "write-behind final flush"))
            .collect();
        assert!(!calls.is_empty(), "{way:?}: the final flush's calls");
        for call in calls {
            assert_eq!(call.status_code, StatusCode::Error, "{call:#?}");
            assert!(!call.status_message.is_empty(), "{call:#?}");
            assert!(call.attr_str("error.type").is_some(), "{call:#?}");
        }
    }
    let flushed = logs.matches("traces flushed").count();
    let processes = if matches!(way, Upgrade) { 2 } else { 1 };
    assert!(
        flushed >= processes,
        "{way:?}: {flushed} flushes; logs:\n{logs}"
    );
    assert!(
        !logs.contains("spans_dropped"),
        "{way:?}: a span dropped; logs:\n{logs}"
    );
}

/// `true` if `span` is inside a span named `name`, at any depth.
fn inside(spans: &[ReceivedSpan], span: &ReceivedSpan, name: &str) -> bool {
    let mut parent = span.parent_span_id.as_deref();
    while let Some(id) = parent {
        let Some(up) = spans.iter().find(|up| up.span_id == id) else {
            return false;
        };
        if up.name == name {
            return true;
        }
        parent = up.parent_span_id.as_deref();
    }
    false
}

/// The redirects answered 307; every other answer fails the row.
fn answered(tally: Tally) -> u64 {
    tally.assert_none_failed("the way out");
    tally.answered()
}

/// Takes the process out the way the row says; returns the redirects
/// answered 307, with the traffic stopped.
fn leave(
    way: Way,
    server: &mut LameduckProcess,
    traffic: Traffic,
    cluster: Option<&PgCluster>,
    binary: &Binary,
    data: &TempDir,
) -> u64 {
    let pg = || cluster.expect("a PostgreSQL row");
    match way {
        SigtermIdle | Sigint | FinalizerOverBudget => {
            let answered = answered(traffic.finish());
            server.signal(if matches!(way, Sigint) {
                SIGINT
            } else {
                SIGTERM
            });
            answered
        }
        SigtermInFlight => {
            let mut held = start_slow_post(server.addr());
            server.wait_in_flight(1);
            server.signal(SIGTERM);
            await_log(server, "listener closed; draining");
            finish_slow_post(&mut held);
            answered(traffic.join())
        }
        Deadline => {
            let _held = start_slow_post(server.addr());
            server.wait_in_flight(1);
            server.signal(SIGTERM);
            let answered = answered(traffic.join());
            await_log(server, "shutdown timeout passed");
            answered
        }
        DeadlineDatabaseDown => {
            let answered = answered(traffic.finish());
            let _held = start_slow_post(server.addr());
            server.wait_in_flight(1);
            pg().stop();
            server.signal(SIGTERM);
            await_log(server, "shutdown timeout passed");
            answered
        }
        SecondSignalInLameDuck(second) => {
            server.signal(SIGTERM);
            await_log(server, "lame duck: ");
            // Traffic keeps being answered during the lame duck.
            let before = traffic.answered();
            traffic.wait_for(before + 20);
            let answered = answered(traffic.finish());
            server.signal(second);
            answered
        }
        SecondSignalInDrain(second) => {
            let _held = start_slow_post(server.addr());
            server.wait_in_flight(1);
            server.signal(SIGTERM);
            await_log(server, "listener closed; draining");
            let answered = answered(traffic.join());
            server.signal(second);
            answered
        }
        SecondSignalInFinalFlush(second) => {
            let answered = answered(traffic.finish());
            pg().stop();
            server.signal(SIGTERM);
            await_log(server, "final flush failed; retrying");
            server.signal(second);
            answered
        }
        DatabaseDownAtShutdown | SpillImpossible(DiskFull) | DiskFullJournaled(_) => {
            let answered = answered(traffic.finish());
            if let DiskFullJournaled(room) = way {
                // Every answered hit is in the journal, or counted as not.
                let (journaled, unjournaled) = match room {
                    Room::ForTheJournal => (answered, 0),
                    Room::None => (0, answered),
                };
                let metrics = metrics(server.admin_addr());
                let count = |name| metric(&metrics, name).map(|n| n as u64);
                assert_eq!(
                    count("lameduck_hits_journal_unjournaled_total"),
                    Some(unjournaled),
                    "{way:?}: {journaled} journaled; /metrics:\n{metrics}"
                );
                if let Room::None = room {
                    let failures = count("lameduck_hits_journal_failures_total");
                    assert!(failures >= Some(1), "{metrics}");
                }
            }
            pg().stop();
            server.signal(SIGTERM);
            answered
        }
        SpillImpossible(ReadOnly | Missing) => {
            server.signal(SIGTERM);
            await_log(server, "lame duck: ");
            let answered = answered(traffic.finish());
            server.signal(SIGINT);
            answered
        }
        CriticalWorkerPanic => {
            // The flusher panics at its first tick; the shutdown it starts
            // closes the listener, which ends the traffic.
            let answered = answered(traffic.join());
            await_log(server, "critical worker failed; shutting down");
            answered
        }
        Upgrade => {
            let first = server.pid();
            server.signal(Signal::SIGHUP);
            let successor = wait_for_new_pid(&data.path().join("pid"), first);
            // The first process drains and exits 0 while the successor
            // serves; the traffic goes on against the successor.
            assert_eq!(server.exit_code(PATIENCE), 0, "{}", server.log_text());
            let before = traffic.answered();
            traffic.wait_for(before + 20);
            let answered = answered(traffic.finish());
            kill(successor, SIGTERM).expect("SIGTERM to the successor");
            wait_gone(successor);
            answered
        }
        UpgradeSuccessorFails => {
            binary.break_it();
            server.signal(Signal::SIGHUP);
            await_log(server, "upgrade failed; this process keeps serving");
            let before = traffic.answered();
            traffic.wait_for(before + 20);
            let answered = answered(traffic.finish());
            server.signal(SIGTERM);
            answered
        }
    }
}

// === the process ===

/// The command line of one row.
struct Args(Vec<String>);

impl Args {
    fn new(data: &TempDir, cluster: Option<&PgCluster>, spill: &SpillDir) -> Args {
        let mut args = Args(Vec::new());
        args.push(&["--data-dir", &data.path().display().to_string()]);
        args.push(&["--log-format", "json", "--flush-interval", "1h"]);
        if let Some(cluster) = cluster {
            args.push(&["--database-url", &cluster.url()]);
        }
        if let Some(path) = spill.path() {
            args.push(&["--spill-dir", &path.display().to_string()]);
        }
        args
    }

    fn push(&mut self, args: &[&str]) {
        self.0.extend(args.iter().map(|arg| (*arg).to_owned()));
    }

    fn set_flush_interval(&mut self, interval: &str) {
        let at = self.0.iter().position(|arg| arg == "--flush-interval");
        self.0[at.expect("set by new") + 1] = interval.to_owned();
    }

    fn as_strs(&self) -> Vec<&str> {
        self.0.iter().map(String::as_str).collect()
    }
}

/// The binary a row runs: Cargo's, or a copy that the row can replace with
/// one that fails at startup (a broken release).
enum Binary {
    Cargo,
    Copy { exe: PathBuf, _dir: TempDir },
}

impl Binary {
    fn new(way: Way) -> Binary {
        if !matches!(way, UpgradeSuccessorFails) {
            return Binary::Cargo;
        }
        let dir = TempDir::new().expect("tempdir");
        let exe = dir.path().join("lameduck");
        fs::copy(lameduck_testkit::binary::binary(), &exe).expect("copy the binary");
        Binary::Copy { exe, _dir: dir }
    }

    fn path(&self) -> &Path {
        match self {
            Binary::Cargo => Path::new(lameduck_testkit::binary::binary()),
            Binary::Copy { exe, .. } => exe,
        }
    }

    /// Replaces the copy, atomically, by a program that fails at startup.
    fn break_it(&self) {
        let Binary::Copy { exe, .. } = self else {
            panic!("only a copied binary can be replaced")
        };
        let broken = exe.with_extension("broken");
        fs::write(&broken, "#!/bin/sh\necho 'a broken release' >&2\nexit 1\n")
            .expect("write the broken binary");
        fs::set_permissions(&broken, fs::Permissions::from_mode(0o755)).expect("chmod");
        fs::rename(&broken, exe).expect("replace the binary");
    }
}

fn await_log(server: &LameduckProcess, needle: &str) {
    assert!(
        server.wait_for_log(needle, PATIENCE),
        "no `{needle}` in the logs:\n{}",
        server.log_text()
    );
}

/// The pid the pid file holds once it is no longer `old`.
fn wait_for_new_pid(path: &Path, old: Pid) -> Pid {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let pid = fs::read_to_string(path)
            .ok()
            .and_then(|text| text.trim().parse::<i32>().ok())
            .map(Pid::from_raw);
        match pid {
            Some(pid) if pid != old => return pid,
            _ if Instant::now() > deadline => panic!("no successor wrote {}", path.display()),
            _ => thread::sleep(Duration::from_millis(10)),
        }
    }
}

/// Waits until `pid` (not our child: its parent has exited) is gone.
///
/// Reaped here if it became ours: the tests that follow upgrades make this
/// process every orphan's subreaper, and a zombie still answers `kill`.
fn wait_gone(pid: Pid) {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let gone = match waitpid(pid, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) => false,
            Ok(_) => true,
            Err(_) => kill(pid, None).is_err(),
        };
        if gone {
            return;
        }
        assert!(Instant::now() < deadline, "process {pid} still runs");
        thread::sleep(Duration::from_millis(10));
    }
}

/// The exit code in the successor's summary line: the second `shutdown
/// complete` in the logs both processes share.
fn successor_exit_code(server: &LameduckProcess) -> i32 {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let summaries: Vec<serde_json::Value> = server
            .logs()
            .iter()
            .filter(|line| line.contains("shutdown complete"))
            .filter_map(|line| serde_json::from_str(line).ok())
            .collect();
        if let [_, successor] = summaries.as_slice() {
            let code = successor["exit_code"].as_i64().expect("an exit code");
            return i32::try_from(code).expect("small");
        }
        assert!(
            Instant::now() < deadline,
            "no summary line from the successor:\n{}",
            server.log_text()
        );
        thread::sleep(Duration::from_millis(10));
    }
}

/// The stored hits of `code`, as the API reports them.
fn stored_hits(addr: SocketAddr, code: &str) -> u64 {
    let response =
        request(addr, "GET", &format!("/api/links/{code}"), None).expect("GET /api/links/{code}");
    assert_eq!(response.status, 200, "{response:?}");
    response.json()["hits"].as_u64().expect("hits")
}

// === the spill directory ===

/// Where a row's spill files go.
enum SpillDir {
    /// `<data-dir>/spill`.
    Default,
    /// A directory that the row makes unwritable; a mount is undone on
    /// drop.
    Unwritable {
        path: PathBuf,
        how: Unwritable,
        mounted: bool,
        /// The journal has its segments there.
        journal: bool,
        _holder: TempDir,
    },
}

impl SpillDir {
    /// A writable directory, on a tmpfs of its own where the row will fill
    /// it or make it read-only.
    fn new(way: Way) -> SpillDir {
        let (how, size) = match way {
            SpillImpossible(how) => (how, "64k"),
            DiskFullJournaled(Room::None) => (DiskFull, "64k"),
            DiskFullJournaled(Room::ForTheJournal) => (DiskFull, "2m"),
            _ => return SpillDir::Default,
        };
        let holder = TempDir::new().expect("tempdir");
        let (path, mounted) = match how {
            DiskFull | ReadOnly => {
                let path = holder.path().join("tmpfs");
                fs::create_dir(&path).expect("mount point");
                let size = format!("size={size}");
                run(
                    "mount",
                    &["-t", "tmpfs", "-o", &size, "tmpfs", path_str(&path)],
                );
                (path, true)
            }
            Missing => (holder.path().join("volume").join("spill"), false),
        };
        fs::create_dir_all(&path).expect("spill dir");
        SpillDir::Unwritable {
            path,
            how,
            mounted,
            journal: matches!(way, DiskFullJournaled(Room::ForTheJournal)),
            _holder: holder,
        }
    }

    /// Whether the journal in this directory kept the hits the spill could
    /// not: then the restart must read this directory.
    fn journal_kept(&self) -> bool {
        matches!(self, SpillDir::Unwritable { journal: true, .. })
    }

    /// Frees the room that `make_unwritable` took, as an operator would.
    fn make_room(&self) {
        if let SpillDir::Unwritable {
            path,
            how: DiskFull,
            ..
        } = self
        {
            fs::remove_file(path.join(FILLER)).expect("the filler");
        }
    }

    /// Takes away the directory's ability to take a spill file.
    fn make_unwritable(&self) {
        let SpillDir::Unwritable { path, how, .. } = self else {
            return;
        };
        match how {
            DiskFull => {
                // Fill it: a spill file can still be created, not written.
                let _ = fs::write(path.join(FILLER), vec![0u8; 4 << 20]);
                assert!(fs::write(path.join("probe"), [0u8; 8192]).is_err(), "full");
            }
            ReadOnly => {
                run("mount", &["-o", "remount,ro", path_str(path)]);
                assert!(fs::write(path.join("probe"), b"x").is_err(), "read-only");
            }
            Missing => {
                // The volume goes away and a file takes its name: the
                // directory cannot be made again.
                let volume = path.parent().expect("a parent");
                fs::remove_dir_all(volume).expect("remove the volume");
                fs::write(volume, b"not a directory").expect("a file in its place");
            }
        }
    }

    fn path(&self) -> Option<&Path> {
        match self {
            SpillDir::Default => None,
            SpillDir::Unwritable { path, .. } => Some(path),
        }
    }
}

impl Drop for SpillDir {
    fn drop(&mut self) {
        if let SpillDir::Unwritable {
            path,
            mounted: true,
            ..
        } = self
        {
            let _ = Command::new("umount").arg(&*path).status();
        }
    }
}

fn path_str(path: &Path) -> &str {
    path.to_str().expect("a UTF-8 temporary path")
}

fn run(program: &str, args: &[&str]) {
    let output = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program}: {e}"));
    assert!(
        output.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}
