//! Spill files: hit counts the database could not take at shutdown (or
//! that a forced exit had no time to send), written durably to the spill
//! directory and applied exactly once — at the next start, or by any
//! running replica that shares the directory.
//!
//! Durability: written to a temporary file, fsynced, renamed into place,
//! then the directory is fsynced. Exactly once: every batch carries the id
//! the database records with it, and a file is removed only after all its
//! batches are committed, so a crash at any point during replay leaves
//! either the file (re-applied as a no-op for batches that landed) or
//! nothing to do. Two replicas replaying one file at the same moment are
//! serialized by the database on the batch id: one applies each batch, the
//! other finds it applied.
//!
//! Shared directory: the file names carry a random part (every container's
//! pid is 1), and a replica removes another's temporary file only once it
//! is [`STALE_TEMPORARY`] old, so it never deletes a spill being written.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use rand::distr::{Alphanumeric, SampleString};

use serde::{Deserialize, Serialize};
use tracing::Instrument;

use super::batch::Batch;
use crate::storage::{Storage, StorageError};

const SUFFIX: &str = ".spill.json";

/// The spill file format this build writes and reads.
const VERSION: u32 = 1;

/// How old a temporary spill file must be before a replay removes it as
/// left by a process that died while writing it. Writing one takes
/// milliseconds; a replica sharing the directory may be writing it now.
pub const STALE_TEMPORARY: Duration = Duration::from_secs(60);

#[derive(Debug, Deserialize)]
struct SpillFile {
    version: u32,
    batches: Vec<Batch>,
}

/// What [`write`] serializes: a [`SpillFile`] that borrows its batches.
#[derive(Serialize)]
struct SpillFileRef<'a> {
    version: u32,
    batches: &'a [Batch],
}

/// Errors while replaying spill files at startup.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// A spill file could not be read, parsed or removed.
    #[error("spill file {path}")]
    File {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The database refused a batch; the file stays for the next start.
    #[error("replaying spill file {path}")]
    Storage {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: StorageError,
    },
}

/// What a replay did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Replayed {
    /// Spill files applied and removed.
    pub files: usize,
    /// Hits applied to the database now.
    pub hits: u64,
    /// Batches found already applied (a crash after commit, before removal).
    pub already_applied: usize,
}

/// Writes `batches` to a new spill file in `dir`, durably.
///
/// # Errors
/// The I/O error; no file is left half-written under the final name.
pub fn write(dir: &Path, batches: &[Batch]) -> io::Result<PathBuf> {
    fs::create_dir_all(dir)?;
    let name = format!(
        "hits-{}-{}-{}{SUFFIX}",
        chrono::Utc::now().format("%Y%m%dT%H%M%S%.3fZ"),
        std::process::id(),
        Alphanumeric.sample_string(&mut rand::rng(), 8)
    );
    let path = dir.join(&name);
    let temporary = dir.join(format!(".{name}.tmp"));
    let body = serde_json::to_vec(&SpillFileRef {
        version: VERSION,
        batches,
    })
    .map_err(io::Error::other)?;
    let mut file = File::create(&temporary)?;
    file.write_all(&body)?;
    file.sync_all()?;
    drop(file);
    fs::rename(&temporary, &path)?;
    File::open(dir)?.sync_all()?;
    Ok(path)
}

/// Creates `dir` if needed and writes (then removes) a small file in it,
/// so that a spill directory that cannot take a file fails the start
/// instead of the exit that needs it.
///
/// # Errors
/// The I/O error.
pub fn ensure_writable(dir: &Path) -> io::Result<()> {
    fs::create_dir_all(dir)?;
    let probe = dir.join(format!(
        ".probe-{}-{}",
        std::process::id(),
        Alphanumeric.sample_string(&mut rand::rng(), 8)
    ));
    let written = File::create(&probe).and_then(|mut file| {
        file.write_all(crate::NAME.as_bytes())?;
        file.sync_all()
    });
    let removed = fs::remove_file(&probe);
    written.and(removed)
}

/// Spill files waiting in `dir`, oldest first.
///
/// # Errors
/// If `dir` exists but cannot be listed.
pub fn pending(dir: &Path) -> io::Result<Vec<PathBuf>> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(error) => return Err(error),
    };
    let mut files = Vec::new();
    for entry in entries {
        let path = entry?.path();
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        if name.starts_with("hits-") && name.ends_with(SUFFIX) {
            files.push(path);
        } else if name.starts_with(".hits-") && name.ends_with(".tmp") && is_stale(&path) {
            // The process died while writing it: it was never renamed into
            // place, so its hits were lost with the process (like SIGKILL).
            tracing::warn!(path = %path.display(), "removing an incomplete spill file");
            remove_if_present(&path)?;
        }
    }
    files.sort();
    Ok(files)
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

/// Applies every spill file in `dir` to the database, exactly once, and
/// removes each after its batches are committed. A file that another
/// replica applied and removed meanwhile is skipped.
///
/// # Errors
/// A [`ReplayError`]; files not yet applied stay for the next start.
pub async fn replay(dir: &Path, storage: &Storage) -> Result<Replayed, ReplayError> {
    let files = pending(dir).map_err(|source| ReplayError::File {
        path: dir.display().to_string(),
        source,
    })?;
    if files.is_empty() {
        return Ok(Replayed::default());
    }
    // A span of its own (with traces on), linked to no request.
    let span = crate::traced_span!(
        parent: None,
        "spill replay",
        files = crate::telemetry::traces::count(files.len())
    );
    let replayed = apply(dir, files, storage).instrument(span.clone()).await;
    if let Err(error) = &replayed {
        crate::telemetry::traces::fail(&span, "replay_failed", error);
    }
    replayed
}

/// Applies the spill `files` found in `dir`, in order.
async fn apply(
    dir: &Path,
    files: Vec<PathBuf>,
    storage: &Storage,
) -> Result<Replayed, ReplayError> {
    let file_error = |path: &Path| {
        let path = path.display().to_string();
        move |source| ReplayError::File { path, source }
    };
    let mut replayed = Replayed::default();
    for path in files {
        let bytes = match fs::read(&path) {
            Ok(bytes) => bytes,
            Err(error) if error.kind() == io::ErrorKind::NotFound => continue,
            Err(error) => return Err(file_error(&path)(error)),
        };
        let spill: SpillFile = serde_json::from_slice(&bytes).map_err(|error| {
            file_error(&path)(io::Error::new(io::ErrorKind::InvalidData, error))
        })?;
        if spill.version != VERSION {
            return Err(file_error(&path)(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "format version {}, this build reads {VERSION}",
                    spill.version
                ),
            )));
        }
        tracing::info!(path = %path.display(), batches = spill.batches.len(), "replaying spilled hits");
        for batch in &spill.batches {
            let applied = storage
                .apply_hits(&batch.id, &batch.as_rows())
                .await
                .map_err(|source| ReplayError::Storage {
                    path: path.display().to_string(),
                    source,
                })?;
            if applied {
                replayed.hits += batch.total();
            } else {
                replayed.already_applied += 1;
            }
        }
        remove_if_present(&path).map_err(file_error(&path))?;
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(file_error(dir))?;
        replayed.files += 1;
    }
    Ok(replayed)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    #[test]
    fn written_spills_are_found_and_incomplete_ones_removed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let batch = Batch {
            id: "b1".to_owned(),
            hits: HashMap::from([("abc".to_owned(), 3)]).into(),
        };
        let path = write(dir.path(), &[batch]).expect("write");
        let crashed = dir.path().join(".hits-crashed.spill.json.tmp");
        fs::write(&crashed, b"{").expect("tmp");
        // Fresh: maybe another replica writing it now; kept.
        assert_eq!(pending(dir.path()).expect("list"), vec![path.clone()]);
        assert!(crashed.exists());
        // Old: left by a process that died while writing it; removed.
        let old = std::time::SystemTime::now() - STALE_TEMPORARY - Duration::from_secs(1);
        File::options()
            .write(true)
            .open(&crashed)
            .and_then(|file| file.set_modified(old))
            .expect("age the temporary file");
        assert_eq!(pending(dir.path()).expect("list"), vec![path.clone()]);
        assert!(!crashed.exists());
        let spill: SpillFile =
            serde_json::from_slice(&fs::read(&path).expect("read")).expect("parse");
        assert_eq!(spill.batches[0].hits.get("abc"), Some(3));
    }
}
