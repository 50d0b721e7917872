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
    // 6 and 8 are kept free for state that must outlive the process (the
    // full template uses them for spilled and lost state).
    /// A finalizer failed or overran its budget.
    FinalizerFailed = 7,
}

impl Exit {
    /// The numeric exit code.
    pub(crate) fn code(self) -> u8 {
        self as u8
    }

    /// The exit a run ending in `report` calls for. When several apply,
    /// the first of: forced, deadline exceeded, worker failed, finalizer
    /// failed.
    pub(crate) fn from_report(report: &Report) -> Exit {
        if report.stop.forced {
            return Exit::Forced;
        }
        match report.drain.outcome {
            DrainOutcome::Forced => Exit::Forced,
            DrainOutcome::DeadlineExceeded => Exit::DeadlineExceeded,
            DrainOutcome::Clean if report.stop.worker_failed() => Exit::WorkerFailed,
            DrainOutcome::Clean if report.stop.finalizer_failed() => Exit::FinalizerFailed,
            DrainOutcome::Clean => Exit::Clean,
        }
    }
}

impl From<Exit> for ExitCode {
    fn from(exit: Exit) -> ExitCode {
        ExitCode::from(exit.code())
    }
}
