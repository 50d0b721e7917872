//! Replay: what earlier processes left in the directory — spill files, and
//! the journals of processes that died — applied exactly once, at start
//! and then every scan interval by every replica sharing the directory.
//!
//! A journal is replayed only once the kernel has released its process's
//! lock on its ledger, that is once the process is gone; the replayer
//! holds that lock while it applies, so one replica does the work. The sink's batch ids make any second application — a
//! replayer killed halfway, two replicas racing — a no-op.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use lameduck_lifecycle::BoxError;
use tracing::Instrument;

use crate::disk::{self, ReadBack};
use crate::files::{self, File as Found};
use crate::frame::Kind;
use crate::journal::Dead;
use crate::merge::Merge;
use crate::sink::{Applied, Sink};
use crate::state::count;
use crate::{Key, Value, WriteBehind};

/// How old a temporary file must be before a replay removes it as left by
/// a process that died while making it. Making one takes milliseconds; a
/// replica sharing the directory may be making it now.
pub const STALE_TEMPORARY: Duration = Duration::from_secs(60);

/// What a replay did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Replayed {
    /// Spill files and dead processes' journals applied and removed.
    pub files: usize,
    /// Batches applied now.
    pub batches: usize,
    /// Records those batches were made of.
    pub records: u64,
    /// Batches found already applied (a crash after the commit, before the
    /// file was removed).
    pub already_applied: usize,
    /// Records skipped: torn, damaged or undecodable.
    pub torn: u64,
}

/// Why a replay stopped; what it had not applied stays for the next one.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// A file could not be read, parsed or removed.
    #[error("spill file {path}")]
    File {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The sink refused a batch.
    #[error("replaying {path}")]
    Sink {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: BoxError,
    },
}

/// What the directory holds for a replay, found in one listing.
#[derive(Debug, Default)]
struct Listing {
    spills: Vec<(PathBuf, String)>,
    ledgers: Vec<(PathBuf, String)>,
    segments: BTreeMap<String, Vec<PathBuf>>,
}

impl<K: Key, V: Value, M: Merge<V>> WriteBehind<K, V, M> {
    /// Applies every spill file in the directory, and the journal of every
    /// process that died, exactly once, removing each once applied.
    ///
    /// # Errors
    /// A [`ReplayError`]; what was not applied stays for the next replay.
    pub async fn replay<S: Sink<K, V>>(&self, sink: &S) -> Result<Replayed, ReplayError> {
        let dir = &self.inner.config.dir;
        let listing = self.list().map_err(|source| ReplayError::File {
            path: dir.clone(),
            source,
        })?;
        if listing.spills.is_empty() && listing.ledgers.is_empty() && listing.segments.is_empty() {
            return Ok(Replayed::default());
        }
        let span = tracing::info_span!(
            parent: None,
            "write-behind replay",
            state = self.inner.config.name,
            files = count(listing.spills.len() + listing.ledgers.len()),
            otel.status_code = tracing::field::Empty,
            error.type = tracing::field::Empty,
        );
        let replayed = self
            .apply_listing(listing, sink)
            .instrument(span.clone())
            .await;
        if replayed.is_err() {
            span.record("otel.status_code", "ERROR");
            span.record("error.type", "replay_failed");
        }
        replayed
    }

    fn list(&self) -> io::Result<Listing> {
        let (dir, name) = (&self.inner.config.dir, self.inner.config.name);
        let mut listing = Listing::default();
        let entries = match fs::read_dir(dir) {
            Ok(entries) => entries,
            Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(listing),
            Err(error) => return Err(error),
        };
        for entry in entries {
            let path = entry?.path();
            let Some(file) = path.file_name().and_then(|f| f.to_str()) else {
                continue;
            };
            match files::parse(name, file) {
                Some(Found::Spill { instance }) => listing.spills.push((path, instance)),
                Some(Found::Ledger { instance }) if instance != self.inner.instance => {
                    listing.ledgers.push((path, instance));
                }
                Some(Found::Segment { instance }) if instance != self.inner.instance => {
                    listing.segments.entry(instance).or_default().push(path);
                }
                Some(Found::Temporary) if is_stale(&path) => {
                    tracing::warn!(state = name, path = %path.display(), "removing a file left half-made by a process that died");
                    remove_if_present(&path)?;
                }
                _ => {}
            }
        }
        listing.spills.sort();
        listing.ledgers.sort();
        for segments in listing.segments.values_mut() {
            segments.sort();
        }
        Ok(listing)
    }

    async fn apply_listing<S: Sink<K, V>>(
        &self,
        mut listing: Listing,
        sink: &S,
    ) -> Result<Replayed, ReplayError> {
        let dir = self.inner.config.dir.clone();
        let file_error = |path: &Path| {
            let path = path.to_owned();
            move |source| ReplayError::File { path, source }
        };
        let mut replayed = Replayed::default();
        // Two replicas may apply one spill file at the same moment: the
        // sink's batch ids serialize them, one applies each batch.
        for (path, instance) in &listing.spills {
            let read = disk::read::<K, V, M>(std::slice::from_ref(path), Kind::Spill, instance, 0)
                .map_err(file_error(path))?;
            tracing::info!(state = self.inner.config.name, path = %path.display(), batches = read.batches.len(), "replaying a spill file");
            self.apply_read(path, read, sink, &mut replayed).await?;
            remove_if_present(path).map_err(file_error(path))?;
            replayed.files += 1;
        }
        for (ledger, instance) in &listing.ledgers {
            let segments = listing.segments.remove(instance).unwrap_or_default();
            let Some(dead) = Dead::lock(ledger).map_err(file_error(ledger))? else {
                continue;
            };
            let read = disk::read::<K, V, M>(&segments, Kind::Segment, instance, dead.confirmed)
                .map_err(file_error(ledger))?;
            if !read.batches.is_empty() {
                tracing::info!(state = self.inner.config.name, path = %ledger.display(), segments = segments.len(), batches = read.batches.len(), "replaying the journal of a process that died");
            }
            self.apply_read(ledger, read, sink, &mut replayed).await?;
            for segment in &segments {
                remove_if_present(segment).map_err(file_error(segment))?;
            }
            remove_if_present(&dead.path).map_err(file_error(ledger))?;
            replayed.files += 1;
        }
        // Segments with no ledger: their process's journal was replayed
        // (its ledger is removed last) and their removal cut short.
        let ledgered: Vec<&String> = listing.ledgers.iter().map(|(_, i)| i).collect();
        for (instance, segments) in &listing.segments {
            if !ledgered.contains(&instance) {
                for segment in segments {
                    remove_if_present(segment).map_err(file_error(segment))?;
                }
            }
        }
        disk::sync_dir(&dir).map_err(file_error(&dir))?;
        Ok(replayed)
    }

    /// Applies what was read from `path`, counting what was torn.
    async fn apply_read<S: Sink<K, V>>(
        &self,
        path: &Path,
        read: ReadBack<K, V>,
        sink: &S,
        replayed: &mut Replayed,
    ) -> Result<(), ReplayError> {
        let metrics = &self.inner.metrics;
        for (file, torn) in &read.torn {
            metrics.torn.inc();
            replayed.torn += 1;
            tracing::warn!(state = self.inner.config.name, path = %file.display(), offset = torn.offset, why = torn.why, "a torn record was skipped");
        }
        for batch in &read.batches {
            match sink.apply(batch).await {
                Ok(Applied::Now) => {
                    replayed.batches += 1;
                    replayed.records += batch.updates;
                    metrics.replayed.inc_by(batch.updates);
                }
                Ok(Applied::Before) => replayed.already_applied += 1,
                Err(source) => {
                    return Err(ReplayError::Sink {
                        path: path.to_owned(),
                        source: Box::new(source),
                    })
                }
            }
        }
        Ok(())
    }
}

/// `true` if `path` was last written [`STALE_TEMPORARY`] ago or more.
fn is_stale(path: &Path) -> bool {
    fs::metadata(path)
        .and_then(|meta| meta.modified())
        .is_ok_and(|modified| modified.elapsed().unwrap_or_default() >= STALE_TEMPORARY)
}

/// Removes `path`; another replica having removed it first is fine.
fn remove_if_present(path: &Path) -> io::Result<()> {
    match fs::remove_file(path) {
        Err(error) if error.kind() != io::ErrorKind::NotFound => Err(error),
        _ => Ok(()),
    }
}
