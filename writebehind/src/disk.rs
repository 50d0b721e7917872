//! What the component writes to its directory outside the journal — spill
//! files — and how every file it finds there is read back into batches.
//!
//! A spill file is written whole and durably (a temporary file, fsynced,
//! renamed into place, the directory fsynced): it is what survives even a
//! power loss after a clean exit.

use std::collections::{BTreeMap, HashMap};
use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;

use crate::batch::{Batch, BatchId};
use crate::frame::{self, Kind, Torn, HEADER};
use crate::merge::Merge;
use crate::Key;

/// Writes every update of `batches` to a new spill file in `dir`.
///
/// # Errors
/// The I/O error; no file is left under a name a replay reads.
pub(crate) fn write_spill<K: Key, V: serde::Serialize>(
    dir: &Path,
    name: &str,
    instance: &str,
    batches: &[Batch<K, V>],
) -> io::Result<PathBuf> {
    let mut out = vec![0; HEADER];
    frame::write_header(&mut out, Kind::Spill, 0);
    for batch in batches {
        for entry in batch.iter() {
            frame::push(&mut out, 0, batch.generation, &entry).map_err(io::Error::other)?;
        }
    }
    frame::end(&mut out);
    fs::create_dir_all(dir)?;
    let (path, temporary) = crate::files::spill(dir, name, instance);
    let written = File::create_new(&temporary).and_then(|mut file| {
        file.write_all(&out)?;
        file.sync_all()
    });
    if let Err(error) = written.and_then(|()| fs::rename(&temporary, &path)) {
        let _ = fs::remove_file(&temporary);
        return Err(error);
    }
    sync_dir(dir)?;
    Ok(path)
}

/// Makes the directory's entries (a rename, a removal) durable.
///
/// # Errors
/// The I/O error.
pub(crate) fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Batches read back from a process's files, with what could not be read.
#[derive(Debug)]
pub(crate) struct ReadBack<K, V> {
    /// Oldest first.
    pub(crate) batches: Vec<Batch<K, V>>,
    /// Records skipped, by file: torn, damaged, or not decodable.
    pub(crate) torn: Vec<(PathBuf, Torn)>,
}

/// Reads the files at `paths` (of `kind`, all written by `instance`) into
/// batches: a batch's records may lie in several files (each shard has its
/// own journal segment), and every record is merged into its batch's value
/// by `M`. Records of a batch up to `confirmed` are skipped (they landed).
///
/// # Errors
/// A file cannot be read, or is not a file of `kind`. A file removed
/// meanwhile is skipped.
pub(crate) fn read<K, V, M>(
    paths: &[PathBuf],
    kind: Kind,
    instance: &str,
    confirmed: u64,
) -> io::Result<ReadBack<K, V>>
where
    K: Key,
    V: DeserializeOwned,
    M: Merge<V>,
{
    let mut batches: BTreeMap<u64, (HashMap<K, V>, u64)> = BTreeMap::new();
    let mut torn = Vec::new();
    for path in paths {
        let bytes = match fs::read(path) {
            Ok(bytes) => bytes,
            Err(error) if error.kind() == io::ErrorKind::NotFound => continue,
            Err(error) => return Err(error),
        };
        let use_ = frame::read_header(&bytes, kind).map_err(|why| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: {why}", path.display()),
            )
        })?;
        let (records, torn_here) = frame::read(&bytes, use_);
        torn.extend(torn_here.into_iter().map(|t| (path.clone(), t)));
        merge_records::<K, V, M>(path, records, confirmed, &mut batches, &mut torn);
    }
    let batches = batches
        .into_iter()
        .map(|(generation, (map, updates))| {
            let mut batch = Batch::new(BatchId::new(instance, generation), generation);
            batch.maps.push(map);
            batch.updates = updates;
            batch
        })
        .collect();
    Ok(ReadBack { batches, torn })
}

/// Merges `records` read from `path` into `batches`.
fn merge_records<K, V, M>(
    path: &Path,
    records: Vec<frame::Record<'_>>,
    confirmed: u64,
    batches: &mut BTreeMap<u64, (HashMap<K, V>, u64)>,
    torn: &mut Vec<(PathBuf, Torn)>,
) where
    K: Key,
    V: DeserializeOwned,
    M: Merge<V>,
{
    for record in records {
        if record.generation <= confirmed {
            continue;
        }
        let Ok((key, value)) = postcard::from_bytes::<(K, V)>(record.payload) else {
            let why = "its payload does not decode";
            torn.push((
                path.to_owned(),
                Torn {
                    offset: record.offset,
                    why,
                },
            ));
            continue;
        };
        let (map, updates) = batches.entry(record.generation).or_default();
        *updates += 1;
        match map.get_mut(&key) {
            Some(pending) => M::merge(pending, value),
            None => {
                map.insert(key, value);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::merge::Sum;

    #[test]
    fn a_spill_reads_back_as_the_batches_written_each_under_its_id() {
        let dir = tempfile::tempdir().expect("tempdir");
        let batch = |generation, entries: &[(&str, u64)]| {
            let mut batch = Batch::new(BatchId::new("inst", generation), generation);
            batch
                .maps
                .push(entries.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect());
            batch.updates = entries.iter().map(|(_, v)| v).sum();
            batch
        };
        let written = [batch(3, &[("a", 2), ("b", 1)]), batch(4, &[("a", 5)])];
        let path = write_spill(dir.path(), "hits", "inst", &written).expect("write");
        let back = read::<String, u64, Sum>(std::slice::from_ref(&path), Kind::Spill, "inst", 0)
            .expect("read");
        assert!(back.torn.is_empty());
        let ids: Vec<&str> = back.batches.iter().map(|b| b.id().as_str()).collect();
        assert_eq!(ids, ["inst-3", "inst-4"]);
        assert_eq!(back.batches[0].get("a"), Some(&2));
        assert_eq!(back.batches[1].get("a"), Some(&5));
        // Landed up to 3: only 4 is left to apply.
        let back = read::<String, u64, Sum>(std::slice::from_ref(&path), Kind::Spill, "inst", 3)
            .expect("read");
        assert_eq!(back.batches.len(), 1);
        let leftovers: Vec<_> = fs::read_dir(dir.path()).expect("list").collect();
        assert_eq!(leftovers.len(), 1, "no temporary file is left");
    }
}
