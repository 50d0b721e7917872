//! One journal segment: a preallocated file mapped into memory
//! (`MAP_SHARED`). A record stored into it is in the kernel's page cache
//! as soon as the store is made; the process may die the next instant
//! (SIGKILL, the OOM killer) and the kernel still writes it to the file.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use memmap2::MmapMut;
use serde::Serialize;

use crate::frame::{self, Kind, HEADER};

/// A journal segment of this process's, mapped.
#[derive(Debug)]
pub(crate) struct Segment {
    path: PathBuf,
    map: MmapMut,
    /// Kept open with the mapping.
    _file: File,
    /// How many times the segment was (re)started: a record of an earlier
    /// use is never read as one of this use.
    use_: u32,
    /// Where the next record goes; the length there is zero.
    cursor: usize,
    /// The newest batch generation among its records: it may be reused once
    /// every batch up to that one has landed.
    newest: Option<u64>,
}

impl Segment {
    /// Creates the file at `path`, allocates `size` bytes of disk for it
    /// (so that a store into the mapping never meets a full disk, which
    /// would be a `SIGBUS`), and maps it.
    ///
    /// # Errors
    /// The I/O error: the directory is full, read-only or gone.
    pub(crate) fn create(path: PathBuf, size: usize) -> io::Result<Segment> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)?;
        let len = i64::try_from(size).map_err(io::Error::other)?;
        let allocated =
            nix::fcntl::posix_fallocate(file.as_raw_fd(), 0, len).map_err(io::Error::from);
        if let Err(error) = allocated {
            let _ = std::fs::remove_file(&path);
            return Err(error);
        }
        // SAFETY: the mapping is of a file this process created under a
        // name that holds its instance id, and allocated in full. Nothing
        // but this process writes it while it lives; a replica reads it
        // only after the kernel released this process's lock on its
        // ledger, which happens when the process is gone. The file is
        // never truncated while mapped: no access can fault past its end.
        #[allow(unsafe_code)]
        let map = unsafe { MmapMut::map_mut(&file)? };
        let mut segment = Segment {
            path,
            map,
            _file: file,
            use_: 0,
            cursor: HEADER,
            newest: None,
        };
        segment.restart();
        Ok(segment)
    }

    /// Starts a new use: what the segment held is forgotten.
    pub(crate) fn restart(&mut self) {
        self.use_ = self.use_.wrapping_add(1);
        self.map[HEADER..HEADER + 4].fill(0);
        frame::write_header(&mut self.map[..HEADER], Kind::Segment, self.use_);
        self.cursor = HEADER;
        self.newest = None;
    }

    /// Appends a record of `payload` in batch `generation`; `false` if it
    /// does not fit.
    pub(crate) fn append<T: Serialize + ?Sized>(&mut self, generation: u64, payload: &T) -> bool {
        match frame::encode(&mut self.map[self.cursor..], self.use_, generation, payload) {
            Some(taken) => {
                self.cursor += taken;
                self.newest = Some(self.newest.map_or(generation, |n| n.max(generation)));
                true
            }
            None => false,
        }
    }

    /// The newest batch generation it holds, if it holds any record.
    pub(crate) fn newest(&self) -> Option<u64> {
        self.newest
    }

    /// The file.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Writes its dirty pages to the disk and waits (`msync`): what a
    /// power loss needs, and a process kill does not.
    ///
    /// # Errors
    /// The I/O error.
    pub(crate) fn sync(&self) -> io::Result<()> {
        self.map.flush()
    }
}
