//! The names of the component's files in its directory. Every name starts
//! with the component's name and the writing process's instance id, so
//! several components and several replicas can share one directory.
//!
//! ```text
//! <name>.<instance>.ledger        the process's ledger (locked while it lives)
//! <name>.<instance>.<n>.seg       a journal segment
//! <name>.<instance>.<stamp>.spill a spill file
//! .<file>.tmp                     any of them while it is being made
//! ```

use std::path::{Path, PathBuf};

use rand::distr::{Alphanumeric, SampleString};

/// What a file in the directory is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum File {
    /// A process's ledger.
    Ledger { instance: String },
    /// One of a process's journal segments.
    Segment { instance: String },
    /// A spill file.
    Spill { instance: String },
    /// A file being made (or left half-made by a process that died).
    Temporary,
}

/// `true` if `name` can name a component: its files' names are parsed by
/// their dots.
pub(crate) fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// A fresh instance id: names this process's files and batches.
pub(crate) fn new_instance() -> String {
    Alphanumeric.sample_string(&mut rand::rng(), 12)
}

/// The ledger of `instance`.
pub(crate) fn ledger(dir: &Path, name: &str, instance: &str) -> PathBuf {
    dir.join(format!("{name}.{instance}.ledger"))
}

/// Segment number `n` of `instance`.
pub(crate) fn segment(dir: &Path, name: &str, instance: &str, n: u64) -> PathBuf {
    dir.join(format!("{name}.{instance}.{n:06}.seg"))
}

/// A new spill file of `instance`, and the temporary name it is made under.
pub(crate) fn spill(dir: &Path, name: &str, instance: &str) -> (PathBuf, PathBuf) {
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis();
    let unique = Alphanumeric.sample_string(&mut rand::rng(), 6);
    let file = format!("{name}.{instance}.{stamp}-{unique}.spill");
    (dir.join(&file), dir.join(format!(".{file}.tmp")))
}

/// What the file called `file` is to the component `name`, if it is one of
/// its files.
pub(crate) fn parse(name: &str, file: &str) -> Option<File> {
    if let Some(inner) = file.strip_prefix('.') {
        let inner = inner.strip_suffix(".tmp")?;
        return parse(name, inner).map(|_| File::Temporary);
    }
    let rest = file.strip_prefix(name)?.strip_prefix('.')?;
    let (instance, kind) = rest.split_once('.')?;
    let instance = instance.to_owned();
    if kind == "ledger" {
        Some(File::Ledger { instance })
    } else if kind.ends_with(".seg") {
        Some(File::Segment { instance })
    } else if kind.ends_with(".spill") {
        Some(File::Spill { instance })
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_made_parses_back_and_other_components_files_do_not() {
        let dir = Path::new("/d");
        let name = |path: PathBuf| {
            path.file_name()
                .expect("name")
                .to_str()
                .expect("UTF-8")
                .to_owned()
        };
        let instance = || "abc123".to_owned();
        assert_eq!(
            parse("hits", &name(ledger(dir, "hits", "abc123"))),
            Some(File::Ledger {
                instance: instance()
            })
        );
        assert_eq!(
            parse("hits", &name(segment(dir, "hits", "abc123", 7))),
            Some(File::Segment {
                instance: instance()
            })
        );
        let (spill, temporary) = spill(dir, "hits", "abc123");
        assert_eq!(
            parse("hits", &name(spill)),
            Some(File::Spill {
                instance: instance()
            })
        );
        assert_eq!(parse("hits", &name(temporary)), Some(File::Temporary));
        assert_eq!(parse("hit", &name(ledger(dir, "hits", "abc123"))), None);
        assert_eq!(parse("hits", "hits-old.spill.json"), None);
        assert!(valid_name("route-hits_2") && !valid_name("a.b") && !valid_name(""));
    }
}
