//! The journal: every update recorded is also stored, framed, into a
//! mapped segment file before `record` returns, so that a process killed
//! after it answered leaves the update in the kernel's page cache, and the
//! next start (or a replica sharing the directory) applies it.
//!
//! Each shard of the pending updates writes its own segment, under the
//! shard's lock: no lock of the journal's own on the hot path. A segment
//! that fills is set aside until every batch it holds has landed, then
//! restarted and reused; the ledger says how far the batches have landed,
//! so a replay skips what is already in the sink. Disk use is bounded by
//! the segments that hold batches not yet landed, plus a few spares.

mod ledger;
mod segment;

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

use serde::Serialize;

pub(crate) use self::ledger::Dead;
use self::ledger::Ledger;
pub(crate) use self::segment::Segment;
use crate::files;
use crate::lock;
use crate::metrics::Metrics;

/// Spare segments kept for reuse beyond which a landed segment is removed.
const SPARES_KEPT: usize = 8;

/// The journal of one component in this process.
#[derive(Debug)]
pub(crate) struct Journal {
    dir: PathBuf,
    name: &'static str,
    instance: String,
    segment_size: usize,
    ledger: Ledger,
    /// The number of the next segment file.
    numbers: AtomicU64,
    /// Restarted segments, ready for a shard whose segment is full.
    spares: Mutex<Vec<Segment>>,
    /// Segments that filled and hold batches not landed yet.
    full: Mutex<Vec<Segment>>,
    /// The journal could not take an update the last time it tried: logs
    /// once a failing stretch, not once an update.
    failing: AtomicBool,
    metrics: Metrics,
}

impl Journal {
    /// Opens this process's journal in `dir`: creates its ledger, locked.
    ///
    /// # Errors
    /// The I/O error.
    pub(crate) fn open(
        dir: &Path,
        name: &'static str,
        instance: &str,
        segment_size: usize,
        metrics: Metrics,
    ) -> io::Result<Journal> {
        let ledger = Ledger::create(files::ledger(dir, name, instance))?;
        Ok(Journal {
            dir: dir.to_owned(),
            name,
            instance: instance.to_owned(),
            segment_size,
            ledger,
            numbers: AtomicU64::new(0),
            spares: Mutex::default(),
            full: Mutex::default(),
            failing: AtomicBool::new(false),
            metrics,
        })
    }

    /// Stores `payload` in batch `generation` into `current` (a shard's
    /// segment), moving to a spare segment when it is full. `false` if the
    /// journal cannot take it: no segment can be made (the disk is full),
    /// or the record is larger than a segment.
    pub(crate) fn append<T: Serialize + ?Sized>(
        &self,
        current: &mut Option<Segment>,
        generation: u64,
        payload: &T,
    ) -> bool {
        for _ in 0..2 {
            let segment = match current {
                Some(segment) => segment,
                None => match self.spare() {
                    Some(spare) => current.insert(spare),
                    None => return false,
                },
            };
            if segment.append(generation, payload) {
                if self.failing.swap(false, Ordering::Relaxed) {
                    tracing::info!(state = self.name, dir = %self.dir.display(), "the journal takes updates again");
                }
                return true;
            }
            match current.take() {
                Some(full) if full.newest().is_some() => lock(&self.full).push(full),
                // Restarted and still too small: the record is larger
                // than a segment.
                Some(empty) => {
                    *current = Some(empty);
                    self.failed(&io::Error::other(format!(
                        "a record is larger than a journal segment ({} bytes)",
                        self.segment_size
                    )));
                    return false;
                }
                None => return false,
            }
        }
        false
    }

    /// A restarted segment: a spare, or a new file.
    fn spare(&self) -> Option<Segment> {
        if let Some(spare) = lock(&self.spares).pop() {
            return Some(spare);
        }
        match self.create() {
            Ok(segment) => Some(segment),
            Err(error) => {
                self.failed(&error);
                None
            }
        }
    }

    fn create(&self) -> io::Result<Segment> {
        let n = self.numbers.fetch_add(1, Ordering::Relaxed);
        let path = files::segment(&self.dir, self.name, &self.instance, n);
        let segment = Segment::create(path, self.segment_size)?;
        self.metrics.journal_bytes.inc_by(self.size());
        Ok(segment)
    }

    fn size(&self) -> i64 {
        i64::try_from(self.segment_size).unwrap_or(i64::MAX)
    }

    /// Logs the first failure of a stretch, loudly: from now on updates are
    /// kept in memory only, and a process kill would lose them.
    fn failed(&self, error: &io::Error) {
        self.metrics.journal_failures.inc();
        if !self.failing.swap(true, Ordering::Relaxed) {
            tracing::error!(
                state = self.name,
                dir = %self.dir.display(),
                %error,
                "the journal cannot take updates: they are kept in memory only until it can, and a process kill would lose them"
            );
        }
    }

    /// Makes sure `n` spare segments are ready, so that a shard whose
    /// segment fills does not create a file under its lock. The flusher
    /// calls it between flushes.
    pub(crate) fn prepare(&self, n: usize) {
        while lock(&self.spares).len() < n {
            match self.create() {
                Ok(segment) => lock(&self.spares).push(segment),
                Err(error) => {
                    self.failed(&error);
                    return;
                }
            }
        }
    }

    /// Records that every batch up to `generation` is where it belongs, and
    /// recycles the full segments that held only those.
    ///
    /// # Errors
    /// The ledger could not be written: a replay may apply those batches
    /// again, which the sink's batch ids make harmless.
    pub(crate) fn confirm(&self, generation: u64) -> io::Result<()> {
        self.ledger.confirm(generation)?;
        let landed: Vec<Segment> = {
            let mut full = lock(&self.full);
            let (landed, waiting) = std::mem::take(&mut *full)
                .into_iter()
                .partition(|segment| segment.newest().is_some_and(|n| n <= generation));
            *full = waiting;
            landed
        };
        for mut segment in landed {
            let mut spares = lock(&self.spares);
            if spares.len() < SPARES_KEPT {
                segment.restart();
                spares.push(segment);
            } else {
                drop(spares);
                self.remove(segment);
            }
        }
        Ok(())
    }

    fn remove(&self, segment: Segment) {
        if let Err(error) = std::fs::remove_file(segment.path()) {
            tracing::warn!(state = self.name, path = %segment.path().display(), %error, "cannot remove a journal segment");
        }
        self.metrics.journal_bytes.dec_by(self.size());
    }

    /// Writes every segment's dirty pages to the disk, the shards' `current`
    /// ones included: what a spill that could not be written falls back
    /// on. `false` if the journal's files are gone (the directory was
    /// removed) or a page could not be written.
    pub(crate) fn sync(&self, current: &[&Segment]) -> bool {
        let full = lock(&self.full);
        let segments = current.iter().copied().chain(full.iter());
        let mut kept = self.ledger.path().exists();
        for segment in segments {
            kept &= segment.path().exists();
            if let Err(error) = segment.sync() {
                tracing::error!(state = self.name, path = %segment.path().display(), %error, "cannot write a journal segment to disk");
                kept = false;
            }
        }
        kept
    }

    /// Removes the journal's files: every update it held is in the sink or
    /// in a spill file. `current` are the shards' segments.
    pub(crate) fn close(&self, current: Vec<Segment>) {
        let full = std::mem::take(&mut *lock(&self.full));
        let spares = std::mem::take(&mut *lock(&self.spares));
        for segment in current.into_iter().chain(full).chain(spares) {
            self.remove(segment);
        }
        if let Err(error) = std::fs::remove_file(self.ledger.path()) {
            tracing::warn!(state = self.name, path = %self.ledger.path().display(), %error, "cannot remove the journal's ledger");
        }
    }
}
