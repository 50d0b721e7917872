//! The process boundary: how a run ends, as an exit code. The codes are
//! documented in README.md; keep the two in step.

use std::process::ExitCode;

use crate::lifecycle::{DrainOutcome, DrainReport};

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
}

impl Exit {
    /// The numeric exit code.
    pub fn code(self) -> u8 {
        self as u8
    }

    /// The exit a drain ending in `report` calls for.
    pub fn from_drain(report: &DrainReport) -> Exit {
        match report.outcome {
            DrainOutcome::Clean => Exit::Clean,
            DrainOutcome::DeadlineExceeded => Exit::DeadlineExceeded,
            DrainOutcome::Forced => Exit::Forced,
        }
    }
}

impl From<Exit> for ExitCode {
    fn from(exit: Exit) -> ExitCode {
        ExitCode::from(exit.code())
    }
}
