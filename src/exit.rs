//! The process boundary: how a run ends, as an exit code. The codes are
//! documented in README.md; keep the two in step.

use std::process::ExitCode;

use crate::app::RunReport;
use crate::lifecycle::DrainOutcome;

/// Every way the process can end, each with its own exit code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Exit {
    /// Signalled, drained, finalized: nothing was lost.
    Clean = 0,
    /// Startup failed (bind, database, migrations).
    Startup = 1,
    /// An option had an invalid value.
    Usage = 2,
    /// The shutdown timeout passed with work still running; it was
    /// cancelled and abandoned.
    DeadlineExceeded = 3,
    /// A second signal forced the exit; whatever was running was abandoned.
    Forced = 4,
    /// A critical worker failed and shut the process down.
    WorkerFailed = 5,
    /// The database was unavailable at the final flush: the hits are in a
    /// spill file in the data directory, applied at the next start.
    StateSpilled = 6,
    /// A finalizer failed or overran its budget.
    FinalizerFailed = 7,
    /// In-memory state was lost: the database could not take it and the
    /// spill file could not be written (disk full, read-only or missing
    /// directory, permission denied). The log names the path and the
    /// number of hits lost.
    StateLost = 8,
}

impl Exit {
    /// The numeric exit code.
    pub fn code(self) -> u8 {
        self as u8
    }

    /// The exit a run ending in `report` calls for. When several apply,
    /// the first of: state lost, forced, deadline exceeded, worker failed,
    /// finalizer failed, state spilled.
    pub fn from_run(report: &RunReport) -> Exit {
        if report.lost_hits > 0 {
            return Exit::StateLost;
        }
        if report.stop.forced {
            return Exit::Forced;
        }
        match report.drain.outcome {
            DrainOutcome::Forced => Exit::Forced,
            DrainOutcome::DeadlineExceeded => Exit::DeadlineExceeded,
            DrainOutcome::Clean if report.stop.worker_failed() => Exit::WorkerFailed,
            DrainOutcome::Clean if report.stop.finalizer_failed() => Exit::FinalizerFailed,
            DrainOutcome::Clean if report.spilled_hits > 0 => Exit::StateSpilled,
            DrainOutcome::Clean => Exit::Clean,
        }
    }
}

impl From<Exit> for ExitCode {
    fn from(exit: Exit) -> ExitCode {
        ExitCode::from(exit.code())
    }
}
