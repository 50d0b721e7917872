//! The process boundary: how a run ends, as an exit code. The codes are
//! documented in the template's README.md; keep the two in step.

use std::process::ExitCode;

use lameduck_lifecycle::{DrainOutcome, Report};

/// Every way the process can end, each with its own exit code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Exit {
    /// Signalled, drained, finalized: nothing was lost.
    Clean = 0,
    /// Startup failed (bind, a store, migrations, state left by an earlier
    /// run that could not be applied).
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
    /// A stateful component's store was unavailable at the final flush:
    /// its pending updates are in a spill file, applied at the next start.
    StateSpilled = 6,
    /// A finalizer failed or overran its budget.
    FinalizerFailed = 7,
    /// In-memory state was lost: its store could not take it and the spill
    /// file could not be written (disk full, read-only or missing
    /// directory, permission denied). The log names the path and the
    /// number of updates lost.
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
    pub fn from_report(report: &Report) -> Exit {
        if report.stop.state_lost() {
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
            DrainOutcome::Clean if report.stop.state_spilled() => Exit::StateSpilled,
            DrainOutcome::Clean => Exit::Clean,
        }
    }
}

impl From<Exit> for ExitCode {
    fn from(exit: Exit) -> ExitCode {
        ExitCode::from(exit.code())
    }
}
