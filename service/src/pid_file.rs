//! `--pid-file`: how scripts find the process to send SIGHUP for an
//! in-place upgrade.

use std::io;
use std::path::{Path, PathBuf};

/// This process's pid, written to a file once the server is ready.
#[derive(Debug)]
pub struct PidFile(PathBuf);

impl PidFile {
    /// Writes this process's pid to `path`, atomically (a temporary file
    /// renamed over it).
    ///
    /// # Errors
    /// If the file cannot be written or renamed.
    pub fn write(path: &Path) -> io::Result<PidFile> {
        let temporary = path.with_extension("tmp");
        std::fs::write(&temporary, format!("{}\n", std::process::id()))?;
        std::fs::rename(&temporary, path)?;
        Ok(PidFile(path.to_owned()))
    }

    /// Writes `--pid-file`, if one was given; a failure is logged with the
    /// path, for the caller to give up its start.
    ///
    /// # Errors
    /// If the file cannot be written or renamed.
    pub fn write_if_asked(path: Option<&Path>) -> io::Result<Option<PidFile>> {
        let Some(path) = path else { return Ok(None) };
        PidFile::write(path).map(Some).inspect_err(|error| {
            tracing::error!(%error, path = %path.display(), "cannot write the pid file");
        })
    }

    /// Removes the file at exit, unless a successor has written its own pid
    /// there since (an in-place upgrade).
    pub fn remove(self) {
        let ours = std::fs::read_to_string(&self.0)
            .is_ok_and(|pid| pid.trim() == std::process::id().to_string());
        if ours {
            let _ = std::fs::remove_file(&self.0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_is_removed_only_while_it_names_this_process() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("server.pid");
        let file = PidFile::write(&path).expect("written");
        let written = std::fs::read_to_string(&path).expect("read");
        assert_eq!(written, format!("{}\n", std::process::id()));
        file.remove();
        assert!(!path.exists());

        // A successor wrote its pid over ours: the file is its now.
        let file = PidFile::write(&path).expect("written");
        std::fs::write(&path, "1\n").expect("successor's pid");
        file.remove();
        assert_eq!(std::fs::read_to_string(&path).expect("kept"), "1\n");
    }
}
