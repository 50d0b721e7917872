//! What a component is told when it is made.

use std::path::PathBuf;
use std::time::Duration;

/// What survives what: the component's durability mode.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Durability {
    /// Updates are kept in memory until they land. A shutdown of any kind
    /// keeps them (flushed, or spilled to disk); SIGKILL, the OOM killer
    /// or a power loss lose those not yet flushed, at most a flush
    /// interval's worth.
    Memory,
    /// Every update is also stored into a journal file in the directory
    /// before [`record`](crate::WriteBehind::record) returns, through a
    /// shared file mapping: it survives SIGKILL and the OOM killer, and the
    /// next start (or a replica sharing the directory) applies it exactly
    /// once. A power loss or a kernel crash can still lose what the kernel
    /// had not written to the disk (no fsync a record).
    #[default]
    Journal,
}

/// How a component flushes, spills and journals.
#[derive(Clone, Debug)]
pub struct Config {
    /// Names its files, its metrics (`<name>_pending`, …), its workers and
    /// its log lines: ASCII letters, digits, `-` and `_`.
    pub name: &'static str,
    /// Where spill files and the journal live. Replicas may share it (a
    /// volume every replica mounts): each applies what the others left.
    pub dir: PathBuf,
    /// What survives what.
    pub durability: Durability,
    /// How often the flusher applies what is pending.
    pub flush_interval: Duration,
    /// How many pending updates wake the flusher before its interval is up.
    pub flush_threshold: u64,
    /// How long the final flush, after the last request, may retry the
    /// sink before it spills what is left (it keeps [`SPILL_RESERVE`] of
    /// it for the spill).
    pub final_flush_budget: Duration,
    /// How often a running process looks in `dir` for spill files and
    /// journals that others (or an earlier run) left, and applies them.
    pub scan_interval: Duration,
    /// The size of one journal segment file.
    pub segment_size: usize,
}

/// How much of the final flush's budget is kept for writing the spill
/// file after the sink gives up.
pub const SPILL_RESERVE: Duration = Duration::from_millis(500);

/// How long the flusher may take to stop after the drain.
pub const FLUSHER_STOP_BUDGET: Duration = Duration::from_secs(1);

impl Config {
    /// The defaults, for the component `name` keeping its files in `dir`:
    /// journaled, flushed every second or at 10,000 pending updates, a
    /// final flush of 5 s, a scan for others' files every 5 s, journal
    /// segments of 256 KiB.
    pub fn new(name: &'static str, dir: impl Into<PathBuf>) -> Config {
        Config {
            name,
            dir: dir.into(),
            durability: Durability::default(),
            flush_interval: Duration::from_secs(1),
            flush_threshold: 10_000,
            final_flush_budget: Duration::from_secs(5),
            scan_interval: Duration::from_secs(5),
            segment_size: 256 * 1024,
        }
    }

    /// The longest stopping the component can take: the flusher's stop
    /// and the final flush. Part of a service's shutdown budget.
    pub fn stop_budget(&self) -> Duration {
        FLUSHER_STOP_BUDGET + self.final_flush_budget
    }
}
