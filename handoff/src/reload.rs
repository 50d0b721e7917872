//! `systemctl reload` that tells the truth, for `Type=notify` units
//! (systemd before 253 has no `Type=notify-reload`).
//!
//! A plain `ExecReload=kill -HUP $MAINPID` returns at once, before the
//! successor is ready, and reports success even when the successor never
//! comes up. [`reload`] is the `ExecReload=` command instead: it sends the
//! SIGHUP and waits for the outcome the old process writes in the unit's
//! runtime directory (`RuntimeDirectory=`; see [`Status`]) — the successor
//! it handed the unit over to, or why it could not (it serves on) — and
//! fails in the second case, so that `systemctl reload` returns non-zero
//! and the journal says "Reload failed".
//!
//! Why a file, and not systemd's own view (`systemctl show -p MainPID`):
//! that takes D-Bus, which refuses the processes of a `DynamicUser=` unit
//! (systemd#22737), and the hardened unit is one.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::{detach, UPGRADE_READY_TIMEOUT};

/// How long [`reload`] waits for the outcome by default: the successor's
/// own readiness timeout, and time for the old process to report.
pub const RELOAD_TIMEOUT: Duration = UPGRADE_READY_TIMEOUT.saturating_add(Duration::from_secs(15));

/// How often the status file is read.
const POLL: Duration = Duration::from_millis(50);

/// The status file's name in the runtime directory.
const STATUS_FILE: &str = "upgrade-status";

/// Why a reload did not hand the unit over.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    /// The unit has no `RuntimeDirectory=`, where the outcome is written.
    #[error(
        "RUNTIME_DIRECTORY is not set: give the unit a RuntimeDirectory= for the upgrade's status"
    )]
    NoRuntimeDirectory,
    /// The main process could not be sent SIGHUP.
    #[error("cannot send SIGHUP to pid {pid}")]
    Signal {
        /// The main process.
        pid: u32,
        /// Why.
        #[source]
        source: nix::Error,
    },
    /// The old process reported that the upgrade failed; it serves on.
    #[error("the upgrade failed: {0}; the old process serves on")]
    Failed(String),
    /// The main process exited without handing the unit over.
    #[error("the main process (pid {0}) exited without handing over")]
    Exited(u32),
    /// Nothing was decided in time.
    #[error(
        "no outcome within {0:?}: the main process neither handed over nor reported a failure"
    )]
    TimedOut(Duration),
}

/// How an upgrade went, as the process upgrading writes it: one line,
/// `pid=P attempt=N outcome=upgrading`, `… outcome=replaced successor=S`
/// or `… outcome=failed reason=…`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Status {
    /// The process that upgrades.
    pub(crate) pid: u32,
    /// Its upgrade's number (each process counts from 1).
    pub(crate) attempt: u32,
    /// Where it stands.
    pub(crate) outcome: Outcome,
}

/// See [`Status`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The successor is starting.
    Upgrading,
    /// The successor is ready and the main process now.
    Replaced(u32),
    /// The successor did not come up; why.
    Failed(String),
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "pid={} attempt={} ", self.pid, self.attempt)?;
        match &self.outcome {
            Outcome::Upgrading => write!(f, "outcome=upgrading"),
            Outcome::Replaced(successor) => write!(f, "outcome=replaced successor={successor}"),
            Outcome::Failed(reason) => {
                write!(f, "outcome=failed reason={}", reason.replace('\n', " "))
            }
        }
    }
}

impl Status {
    fn parse(line: &str) -> Option<Status> {
        let mut words = line.trim().splitn(4, ' ');
        let pid = words.next()?.strip_prefix("pid=")?.parse().ok()?;
        let attempt = words.next()?.strip_prefix("attempt=")?.parse().ok()?;
        let outcome = match words.next()?.strip_prefix("outcome=")? {
            "upgrading" => Outcome::Upgrading,
            "replaced" => {
                Outcome::Replaced(words.next()?.strip_prefix("successor=")?.parse().ok()?)
            }
            "failed" => Outcome::Failed(words.next()?.strip_prefix("reason=")?.to_owned()),
            _ => return None,
        };
        Some(Status {
            pid,
            attempt,
            outcome,
        })
    }
}

/// The status file: in the first directory of `RUNTIME_DIRECTORY`, which
/// systemd sets for every process of a unit with `RuntimeDirectory=`.
pub(crate) fn status_path() -> Option<PathBuf> {
    let dirs = std::env::var_os("RUNTIME_DIRECTORY")?;
    let first = dirs.to_string_lossy().split(':').next()?.to_owned();
    (!first.is_empty()).then(|| Path::new(&first).join(STATUS_FILE))
}

/// Writes `status` to `path` whole (a temporary file, renamed over it).
pub(crate) fn write_status(path: &Path, status: &Status) -> std::io::Result<()> {
    let temporary = path.with_extension(format!("{}.tmp", std::process::id()));
    std::fs::write(&temporary, format!("{status}\n"))?;
    std::fs::rename(&temporary, path)
}

fn read_status(path: &Path) -> Option<Status> {
    Status::parse(&std::fs::read_to_string(path).ok()?)
}

/// Sends SIGHUP to `main_pid` and waits (up to `timeout`) until it reports
/// the outcome of the upgrade it starts; returns the successor's pid, the
/// unit's main process from then on.
///
/// # Errors
/// See [`ReloadError`].
pub fn reload(main_pid: u32, timeout: Duration) -> Result<u32, ReloadError> {
    let path = status_path().ok_or(ReloadError::NoRuntimeDirectory)?;
    let before = read_status(&path);
    let pid = i32::try_from(main_pid).map_err(|_| ReloadError::Exited(main_pid))?;
    kill(Pid::from_raw(pid), Signal::SIGHUP).map_err(|source| ReloadError::Signal {
        pid: main_pid,
        source,
    })?;
    let deadline = Instant::now() + timeout;
    loop {
        std::thread::sleep(POLL);
        if let Some(outcome) = outcome(before.as_ref(), read_status(&path), main_pid) {
            return outcome;
        }
        if !detach::alive(main_pid) {
            // It may have reported just before it exited.
            return outcome(before.as_ref(), read_status(&path), main_pid)
                .unwrap_or(Err(ReloadError::Exited(main_pid)));
        }
        if Instant::now() > deadline {
            return Err(ReloadError::TimedOut(timeout));
        }
    }
}

/// The outcome of the reload, if `now` tells it: a status that `main_pid`
/// wrote since `before` (each of its upgrades has a new number) and that is
/// final.
fn outcome(
    before: Option<&Status>,
    now: Option<Status>,
    main_pid: u32,
) -> Option<Result<u32, ReloadError>> {
    let now = now.filter(|now| now.pid == main_pid && Some(now) != before)?;
    match now.outcome {
        Outcome::Upgrading => None,
        Outcome::Replaced(successor) => Some(Ok(successor)),
        Outcome::Failed(reason) => Some(Err(ReloadError::Failed(reason))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(pid: u32, attempt: u32, outcome: Outcome) -> Status {
        Status {
            pid,
            attempt,
            outcome,
        }
    }

    #[test]
    fn a_status_reads_back_as_written() {
        for written in [
            status(10, 1, Outcome::Upgrading),
            status(10, 2, Outcome::Replaced(11)),
            status(
                10,
                3,
                Outcome::Failed(
                    "the new process exited before it was ready (exit status: 1)".into(),
                ),
            ),
        ] {
            assert_eq!(Status::parse(&written.to_string()), Some(written));
        }
        assert_eq!(Status::parse("garbage"), None);
    }

    #[test]
    fn only_a_final_status_of_this_pid_since_the_signal_decides() {
        let earlier = status(10, 1, Outcome::Failed("timed out".into()));
        let pending = |now| outcome(Some(&earlier), Some(now), 10).is_none();
        assert!(
            pending(earlier.clone()),
            "the last attempt's failure is not this one's"
        );
        assert!(pending(status(10, 2, Outcome::Upgrading)));
        assert!(
            pending(status(9, 5, Outcome::Replaced(10))),
            "another process's"
        );
        assert!(matches!(
            outcome(
                Some(&earlier),
                Some(status(10, 2, Outcome::Failed("exited".into()))),
                10
            ),
            Some(Err(ReloadError::Failed(_)))
        ));
        assert!(matches!(
            outcome(None, Some(status(10, 1, Outcome::Replaced(11))), 10),
            Some(Ok(11))
        ));
    }

    #[test]
    fn the_status_file_is_replaced_whole() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join(STATUS_FILE);
        write_status(&path, &status(1, 1, Outcome::Upgrading)).expect("write");
        write_status(&path, &status(1, 1, Outcome::Replaced(2))).expect("write");
        assert_eq!(read_status(&path), Some(status(1, 1, Outcome::Replaced(2))));
        assert_eq!(std::fs::read_dir(dir.path()).expect("list").count(), 1);
    }
}
