//! A process's ledger in the journal directory: its name is the instance's
//! (so its segments and batch ids can be found), its lock says the process
//! is alive, and it holds how far the process's batches have landed.

use std::fs::{self, File, OpenOptions, TryLockError};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

const MAGIC: &[u8; 8] = b"LDWBLDG1";

/// This process's ledger: created locked, locked while the process lives
/// (the kernel drops the lock when it dies, however it dies).
#[derive(Debug)]
pub(crate) struct Ledger {
    path: PathBuf,
    file: File,
}

impl Ledger {
    /// Creates the ledger at `path`, locked. It is made under a temporary
    /// name and renamed into place once locked, so that no replica ever
    /// finds it unlocked while this process lives.
    ///
    /// # Errors
    /// The I/O error.
    pub(crate) fn create(path: PathBuf) -> io::Result<Ledger> {
        let name = path
            .file_name()
            .and_then(|name| name.to_str())
            .ok_or_else(|| io::Error::other("a ledger path ends in a name"))?;
        let temporary = path.with_file_name(format!(".{name}.tmp"));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&temporary)?;
        file.try_lock().map_err(|error| match error {
            TryLockError::Error(error) => error,
            TryLockError::WouldBlock => io::Error::other("a new ledger is locked already"),
        })?;
        let mut header = [0; 16];
        header[..8].copy_from_slice(MAGIC);
        file.write_all_at(&header, 0)?;
        fs::rename(&temporary, &path)?;
        Ok(Ledger { path, file })
    }

    /// Records that every batch up to `generation` is where it belongs (in
    /// the sink, or in a spill file): a replay skips their records.
    ///
    /// # Errors
    /// The I/O error.
    pub(crate) fn confirm(&self, generation: u64) -> io::Result<()> {
        self.file.write_all_at(&generation.to_le_bytes(), 8)
    }

    /// The file.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
}

/// The ledger of another process, locked by this one: the other is gone,
/// and this process replays its journal.
#[derive(Debug)]
pub(crate) struct Dead {
    /// The dead process's ledger.
    pub(crate) path: PathBuf,
    /// Every batch up to this one had landed.
    pub(crate) confirmed: u64,
    /// Held while replaying, so that one replica replays it.
    _lock: File,
}

impl Dead {
    /// Locks the ledger at `path` if its process is gone: `None` if it is
    /// alive (or another replica is replaying it now).
    ///
    /// # Errors
    /// The I/O error, or a file that is no ledger.
    pub(crate) fn lock(path: &Path) -> io::Result<Option<Dead>> {
        let file = match File::open(path) {
            Ok(file) => file,
            Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(error) => return Err(error),
        };
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => return Ok(None),
            Err(TryLockError::Error(error)) => return Err(error),
        }
        // Replayed and removed by another replica between the listing and
        // the lock: nothing to do.
        if !path.exists() {
            return Ok(None);
        }
        let mut header = [0; 16];
        file.read_exact_at(&mut header, 0)?;
        if &header[..8] != MAGIC {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "not a ledger"));
        }
        let mut confirmed = [0; 8];
        confirmed.copy_from_slice(&header[8..]);
        Ok(Some(Dead {
            path: path.to_owned(),
            confirmed: u64::from_le_bytes(confirmed),
            _lock: file,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_live_ledger_cannot_be_taken_and_a_released_one_can() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("state.abc.ledger");
        let ledger = Ledger::create(path.clone()).expect("create");
        ledger.confirm(41).expect("confirm");
        assert!(Dead::lock(&path).expect("look").is_none(), "alive");
        drop(ledger);
        let dead = Dead::lock(&path).expect("look").expect("gone");
        assert_eq!(dead.confirmed, 41);
        assert!(Dead::lock(&path).expect("look").is_none(), "being replayed");
    }
}
