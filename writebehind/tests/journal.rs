//! The component against its directory: what a process that died left is
//! applied exactly once, torn records are skipped and counted, a live
//! process's journal is left alone, the journal's disk stays bounded, and
//! the final flush spends its whole budget on a store that is down.
//!
//! A process "dies" here by being dropped without its final flush: its
//! ledger's lock goes with its file, and what it stored into its mappings
//! is in the page cache, as after a SIGKILL. The binary's tests kill it
//! for real.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use lameduck_writebehind::{Applied, Batch, Config, FinalFlush, Sink, Sum, WriteBehind};

type Counts = WriteBehind<String, u64, Sum>;

/// Totals per key, and the ids of the batches applied.
type Tables = (HashMap<String, u64>, HashSet<String>);

/// Totals and applied batch ids, changed together; can be taken down.
#[derive(Clone, Default)]
struct Store {
    state: Arc<Mutex<Tables>>,
    down: Arc<AtomicBool>,
}

#[derive(Debug, thiserror::Error)]
#[error("the store is down")]
struct Down;

impl Sink<String, u64> for Store {
    type Error = Down;

    async fn apply(&self, batch: &Batch<String, u64>) -> Result<Applied, Down> {
        if self.down.load(Ordering::Relaxed) {
            return Err(Down);
        }
        let mut state = self.state.lock().expect("lock");
        let (totals, applied) = &mut *state;
        if !applied.insert(batch.id().to_string()) {
            return Ok(Applied::Before);
        }
        for (key, n) in batch.iter() {
            *totals.entry(key.clone()).or_default() += n;
        }
        Ok(Applied::Now)
    }
}

impl Store {
    fn total(&self) -> u64 {
        self.state.lock().expect("lock").0.values().sum()
    }
}

fn open(dir: &Path) -> Counts {
    Counts::open(Config::new("hits", dir)).expect("open")
}

fn open_small(dir: &Path) -> Counts {
    let mut config = Config::new("hits", dir);
    config.segment_size = 4096;
    Counts::open(config).expect("open")
}

fn record(counts: &Counts, n: u64) {
    for i in 0..n {
        counts.record(&format!("code{}", i % 13), 1);
    }
}

/// Records `n` updates of one key: one shard, one journal segment.
fn record_one(counts: &Counts, n: u64) {
    for _ in 0..n {
        counts.record("code", 1);
    }
}

/// The one journal segment in `dir`.
fn only_segment(dir: &Path) -> std::path::PathBuf {
    let mut segments = std::fs::read_dir(dir)
        .expect("list")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "seg"));
    let segment = segments.next().expect("a segment");
    assert!(segments.next().is_none(), "one segment");
    segment
}

/// Where each record of a segment ends: records start after the 16-byte
/// header, each a length, a checksum and the body, until a zero length.
fn record_ends(bytes: &[u8]) -> Vec<usize> {
    let mut ends = Vec::new();
    let mut at = 16;
    loop {
        let len = u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes")) as usize;
        if len == 0 {
            return ends;
        }
        at += 8 + len;
        ends.push(at);
    }
}

fn files(dir: &Path, suffix: &str) -> usize {
    std::fs::read_dir(dir)
        .expect("list")
        .filter(|e| {
            let name = e.as_ref().expect("entry").file_name();
            name.to_str().is_some_and(|n| n.ends_with(suffix))
        })
        .count()
}

#[tokio::test]
async fn what_a_dead_process_recorded_is_applied_exactly_once_by_the_next() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::default();
    let dead = open(dir.path());
    record(&dead, 500);
    assert_eq!(dead.flush(&store).await.expect("flush"), 500);
    record(&dead, 700);
    drop(dead);
    assert_eq!(store.total(), 500);

    let next = open(dir.path());
    let replayed = next.replay(&store).await.expect("replay");
    assert_eq!(store.total(), 1_200, "{replayed:?}");
    assert_eq!(
        replayed.records, 700,
        "the landed batch is skipped by the ledger"
    );
    assert_eq!(replayed.torn, 0);
    assert_eq!(replayed.files, 1);
    assert_eq!(files(dir.path(), ".seg"), 0, "the dead journal is removed");
    assert_eq!(
        files(dir.path(), ".ledger"),
        1,
        "only the live ledger is left"
    );

    let again = open(dir.path()).replay(&store).await.expect("replay");
    assert_eq!(again.records, 0);
    assert_eq!(store.total(), 1_200);
}

#[tokio::test]
async fn a_journal_replayed_twice_counts_nothing_twice() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::default();
    let dead = open(dir.path());
    record(&dead, 300);
    drop(dead);
    // A copy of the dead journal, as a replayer killed before removing it
    // would leave it: the batch ids make the second application a no-op.
    let copy = tempfile::tempdir().expect("tempdir");
    for entry in std::fs::read_dir(dir.path()).expect("list") {
        let path = entry.expect("entry").path();
        std::fs::copy(&path, copy.path().join(path.file_name().expect("name"))).expect("copy");
    }
    open(dir.path()).replay(&store).await.expect("replay");
    let second = open(copy.path()).replay(&store).await.expect("replay");
    assert_eq!(second.already_applied, 1, "one batch: {second:?}");
    assert_eq!(store.total(), 300);
}

#[tokio::test]
async fn a_live_process_journal_is_left_alone() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::default();
    let live = open(dir.path());
    record(&live, 100);
    let replayed = open(dir.path()).replay(&store).await.expect("replay");
    assert_eq!(replayed.files, 0);
    assert_eq!(store.total(), 0);
    assert_eq!(live.flush(&store).await.expect("flush"), 100);
    assert_eq!(store.total(), 100);
}

#[tokio::test]
async fn a_torn_record_is_skipped_counted_and_the_rest_applied() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::default();
    let dead = open(dir.path());
    record_one(&dead, 50);
    drop(dead);
    let segment = only_segment(dir.path());
    let mut bytes = std::fs::read(&segment).expect("read");
    // Flip a byte of the third record's payload.
    let at = record_ends(&bytes)[1];
    bytes[at + 8 + 13] ^= 0x55;
    std::fs::write(&segment, &bytes).expect("write");

    let replayed = open(dir.path()).replay(&store).await.expect("replay");
    assert_eq!(replayed.torn, 1, "{replayed:?}");
    assert_eq!(store.total(), 49, "every other record is applied");
}

#[tokio::test]
async fn a_journal_cut_mid_record_keeps_the_records_before_the_cut() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::default();
    let dead = open(dir.path());
    record_one(&dead, 20);
    drop(dead);
    let segment = only_segment(dir.path());
    // Cut it in the middle of its last record.
    let bytes = std::fs::read(&segment).expect("read");
    let ends = record_ends(&bytes);
    assert_eq!(ends.len(), 20);
    std::fs::write(&segment, &bytes[..ends[19] - 3]).expect("cut");

    let replayed = open(dir.path()).replay(&store).await.expect("replay");
    assert_eq!(replayed.torn, 1, "{replayed:?}");
    assert_eq!(store.total(), 19);
}

#[tokio::test]
async fn segments_are_reused_as_batches_land_so_the_journal_stays_bounded() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::default();
    let counts = open_small(dir.path());
    for _ in 0..50 {
        record(&counts, 2_000);
        counts.flush(&store).await.expect("flush");
    }
    assert_eq!(store.total(), 100_000);
    let segments = files(dir.path(), ".seg");
    // 2,000 records of ~25 bytes fill 13 shards' 4 KiB segments about
    // once each a round; landed ones are reused, eight spares kept.
    assert!(
        segments <= 13 * 2 + 8,
        "{segments} segments after 50 rounds"
    );
    drop(counts);
    let replayed = open(dir.path()).replay(&store).await.expect("replay");
    assert_eq!(replayed.records, 0, "everything had landed: {replayed:?}");
    assert_eq!(store.total(), 100_000);
}

#[tokio::test]
async fn a_spill_and_the_journal_it_supersedes_count_each_update_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::default();
    let dying = open(dir.path());
    record(&dying, 400);
    store.down.store(true, Ordering::Relaxed);
    assert!(dying.flush(&store).await.is_err());
    record(&dying, 100);
    let spilled = dying.spill_now().expect("spill");
    assert!(spilled.is_some());
    assert_eq!(dying.spilled(), 500);
    drop(dying);
    assert_eq!(files(dir.path(), ".spill"), 1);

    store.down.store(false, Ordering::Relaxed);
    let replayed = open(dir.path()).replay(&store).await.expect("replay");
    assert_eq!(store.total(), 500, "{replayed:?}");
    assert_eq!(files(dir.path(), ".spill"), 0);
    assert_eq!(files(dir.path(), ".seg"), 0);
}

#[tokio::test]
async fn in_memory_mode_writes_no_journal_and_a_dead_process_loses_its_pending_updates() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::default();
    let mut config = Config::new("hits", dir.path());
    config.durability = lameduck_writebehind::Durability::Memory;
    let counts = Counts::open(config).expect("open");
    record(&counts, 10);
    assert_eq!(files(dir.path(), ".seg") + files(dir.path(), ".ledger"), 0);
    drop(counts);
    assert_eq!(
        open(dir.path())
            .replay(&store)
            .await
            .expect("replay")
            .records,
        0
    );
}

#[tokio::test]
async fn a_reader_sees_each_pending_update_once_under_its_batch_id() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::default();
    let counts = open(dir.path());
    counts.record("abc", 3);
    let before = counts.pending_for("abc");
    assert_eq!(before.len(), 1);
    counts.flush(&store).await.expect("flush");
    // The id a reader was told is the id the batch landed under.
    assert!(store
        .state
        .lock()
        .expect("lock")
        .1
        .contains(before[0].0.as_str()));
    counts.record("abc", 2);
    assert_eq!(
        counts
            .pending_for("abc")
            .iter()
            .map(|(_, n)| n)
            .sum::<u64>(),
        2
    );
}

// The final flush retries a store that is down to the end of its budget (less
// the spill's reserve), not until its next backoff would pass it: a store
// back just before then takes every update, and nothing is spilled.
#[tokio::test(start_paused = true)]
async fn the_final_flush_retries_a_store_that_is_down_until_its_budget_is_spent() {
    let dir = tempfile::tempdir().expect("dir");
    let counts = open(dir.path());
    let store = Store::default();
    store.down.store(true, Ordering::Relaxed);
    record(&counts, 10);
    // Budget 5 s, the last 500 ms kept for the spill: back at 4.4 s. With
    // a backoff doubling from 50 ms to 1 s, the try due after 3.55 s would
    // come at 4.55 s, past the 4.5 s mark.
    let back = {
        let down = Arc::clone(&store.down);
        tokio::spawn(async move {
            tokio::time::sleep(std::time::Duration::from_millis(4_400)).await;
            down.store(false, Ordering::Relaxed);
        })
    };
    let outcome = counts.final_flush(&store).await.expect("nothing lost");
    back.await.expect("the store came back");
    assert!(
        matches!(outcome, FinalFlush::Flushed { updates: 10 }),
        "{outcome:?}"
    );
    assert_eq!(store.total(), 10);
    assert_eq!(files(dir.path(), ".spill"), 0);
}
