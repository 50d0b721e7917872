//! The process boundary: how a run ends, as an exit code. The codes are
//! documented in README.md; keep the two in step.

use std::process::ExitCode;

use lameduck_lifecycle::{DrainOutcome, Report};

/// Every way the process can end, each with its own exit code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Exit {
    /// Signalled, drained, finalized.
    Clean = 0,
    /// Startup failed (bind, signal handlers).
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
    /// State could not be written at the final flush: it is in a spill
    /// file in the state directory, applied at the next start.
    StateSpilled = 6,
    /// A finalizer failed or overran its budget.
    FinalizerFailed = 7,
    /// State was lost: it could be written neither where it belongs nor
    /// to a spill file (disk full, a read-only or unusable directory), and
    /// no journal kept it. The log names the directory and the count.
    StateLost = 8,
}

impl Exit {
    /// The numeric exit code.
    pub(crate) fn code(self) -> u8 {
        self as u8
    }

    /// The exit a run ending in `report` calls for. When several apply,
    /// the first of: state lost, forced, deadline exceeded, worker failed,
    /// finalizer failed, state spilled.
    pub(crate) fn from_report(report: &Report) -> Exit {
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
