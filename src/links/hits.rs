//! Write-behind hit counters: redirects count in memory, a flusher worker
//! writes the counts to the database in one batched transaction every flush
//! interval, and the final flush at shutdown runs after the last in-flight
//! redirect. If the database is down then, the counts are spilled to disk
//! and applied at the next start.
//!
//! Exactly once: counts leave memory in batches with an id, and a batch
//! stays in memory ("unconfirmed") until its commit is confirmed. The
//! database records each applied id in the same transaction, so a batch
//! whose commit went unconfirmed — or that was spilled — is never counted
//! twice when it is applied again.
//!
//! Every way out keeps them: a clean exit and a passed deadline flush (or
//! spill) them after the last request; a forced exit (second signal)
//! spills them synchronously, with no database round trip. A spill that
//! cannot be written is counted as lost, logged with the path and the
//! count, and turns the exit code into "state lost".
//!
//! The honest bound: after SIGKILL, an OOM kill or power loss, the hits
//! since the last flush (at most one flush interval's worth) are lost.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::batch::new_batch_id;
pub use super::batch::{Batch, Hits};
use super::shard::ShardPicker;
use super::spill;
use crate::lifecycle::BoxError;
use crate::storage::{Storage, StorageError, StoredLink};
use crate::telemetry::traces;

/// Shards of the in-memory counts: a redirect locks one shard for a map
/// update, so concurrent redirects rarely contend and never on one lock.
const SHARDS: usize = 32;

/// How many pending hits wake the flusher before its interval is up.
pub const FLUSH_THRESHOLD: i64 = 10_000;

/// How much of the final flush's budget is kept for writing the spill file
/// after the database attempts give up.
pub const SPILL_RESERVE: Duration = Duration::from_millis(500);

/// How the final flush ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FinalFlush {
    /// Every pending hit is in the database.
    Flushed {
        /// Hits written by the final flush.
        hits: u64,
    },
    /// The database could not take them: they are in a spill file.
    Spilled {
        /// Hits written to the file.
        hits: u64,
        /// The file.
        path: std::path::PathBuf,
    },
}

/// Pending hits that could be written neither to the database nor to a
/// spill file: they are lost, and this says how many and where the spill
/// was to go.
#[derive(Debug, thiserror::Error)]
#[error("cannot write the spill file in {dir}: {hits} hits lost")]
pub struct SpillFailed {
    /// The spill directory.
    pub dir: std::path::PathBuf,
    /// The hits lost.
    pub hits: u64,
    /// Why the file could not be written.
    #[source]
    pub source: std::io::Error,
}

/// Series of the write-behind counters.
#[derive(Clone, Debug)]
struct HitMetrics {
    pending: Gauge,
    flush_batches: Counter,
    flush_failures: Counter,
    flush_seconds: Histogram,
    flushed: Counter,
    spills: Counter,
    spilled: Counter,
    lost: Counter,
}

impl Default for HitMetrics {
    fn default() -> Self {
        HitMetrics {
            pending: Gauge::default(),
            flush_batches: Counter::default(),
            flush_failures: Counter::default(),
            flush_seconds: Histogram::new(exponential_buckets(0.0005, 2.0, 16)),
            flushed: Counter::default(),
            spills: Counter::default(),
            spilled: Counter::default(),
            lost: Counter::default(),
        }
    }
}

/// The in-memory hit counters. Cloning shares them.
#[derive(Clone, Debug)]
pub struct HitCounter {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    shards: Box<[Mutex<HashMap<String, u64>>]>,
    picker: ShardPicker,
    /// Batches taken out of the shards whose commit is not confirmed yet
    /// (in flight, or failed), oldest first, and the id of the batch the
    /// shards will become: every pending hit already has its batch id, so a
    /// reader can ask the database which of them have landed.
    unconfirmed: Mutex<Unconfirmed>,
    /// Woken when [`FLUSH_THRESHOLD`] hits are pending.
    many_pending: Notify,
    /// One flush at a time.
    flush_lock: tokio::sync::Mutex<()>,
    /// `false` turns `record` into a no-op: only for measuring what counting
    /// costs (the load harness's uncounted baseline).
    counting: AtomicBool,
    metrics: HitMetrics,
}

#[derive(Debug)]
struct Unconfirmed {
    batches: Vec<Batch>,
    next_id: String,
}

impl Default for Unconfirmed {
    fn default() -> Self {
        Unconfirmed {
            batches: Vec::new(),
            next_id: new_batch_id(),
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Default for HitCounter {
    fn default() -> Self {
        HitCounter {
            inner: Arc::new(Inner {
                shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
                picker: ShardPicker::new(),
                unconfirmed: Mutex::default(),
                many_pending: Notify::new(),
                flush_lock: tokio::sync::Mutex::new(()),
                counting: AtomicBool::new(true),
                metrics: HitMetrics::default(),
            }),
        }
    }
}

impl HitCounter {
    /// Registers the counters' series.
    pub fn register(&self, registry: &mut Registry) {
        let m = &self.inner.metrics;
        registry.register(
            "hits_pending",
            "Hits counted in memory, not yet in the database",
            m.pending.clone(),
        );
        registry.register(
            "hit_flush_batches",
            "Batches of hits committed",
            m.flush_batches.clone(),
        );
        registry.register(
            "hit_flush_failures",
            "Flush attempts that failed (hits stay in memory)",
            m.flush_failures.clone(),
        );
        registry.register(
            "hit_flush_duration_seconds",
            "Time to commit one batch",
            m.flush_seconds.clone(),
        );
        registry.register(
            "hits_flushed",
            "Hits written to the database",
            m.flushed.clone(),
        );
        registry.register(
            "hit_spills",
            "Spill files written because the database was down at shutdown",
            m.spills.clone(),
        );
        registry.register(
            "hits_spilled",
            "Hits written to spill files",
            m.spilled.clone(),
        );
        registry.register(
            "hits_lost",
            "Hits that could be written neither to the database nor to a spill file",
            m.lost.clone(),
        );
    }

    /// Counts one hit for `code`. Locks one shard of [`SHARDS`] briefly.
    pub fn record(&self, code: &str) {
        let inner = &*self.inner;
        if !inner.counting.load(Ordering::Relaxed) {
            return;
        }
        let shard = inner.picker.pick(code, SHARDS);
        {
            let mut counts = lock(&inner.shards[shard]);
            match counts.get_mut(code) {
                Some(count) => *count += 1,
                None => {
                    counts.insert(code.to_owned(), 1);
                }
            }
        }
        if inner.metrics.pending.inc() + 1 == FLUSH_THRESHOLD {
            inner.many_pending.notify_one();
        }
    }

    /// Turns counting on or off. Off is only for measuring what counting
    /// costs; a service never wants it.
    pub fn set_counting(&self, on: bool) {
        self.inner.counting.store(on, Ordering::Relaxed);
    }

    /// Hits counted and not yet persisted, in total.
    pub fn pending(&self) -> i64 {
        self.inner.metrics.pending.get()
    }

    /// Hits spilled to disk by this process.
    pub fn spilled(&self) -> u64 {
        self.inner.metrics.spilled.get()
    }

    /// Hits this process wrote to the database (batches replayed from a
    /// spill file not included).
    pub fn flushed(&self) -> u64 {
        self.inner.metrics.flushed.get()
    }

    /// Hits this process lost: neither the database nor a spill file
    /// could take them.
    pub fn lost(&self) -> u64 {
        self.inner.metrics.lost.get()
    }

    /// Takes every pending hit out of memory and writes it to a new spill
    /// file in `dir`, synchronously: no database round trip, so it is what
    /// a forced exit runs. `Ok(None)` if nothing was pending.
    ///
    /// # Errors
    /// [`SpillFailed`] if the file cannot be written: the hits are counted
    /// as lost and an error line names the directory and the count.
    pub fn spill_now(&self, dir: &Path) -> Result<Option<FinalFlush>, SpillFailed> {
        let batches = self.take_all();
        let hits: u64 = batches.iter().map(Batch::total).sum();
        if hits == 0 {
            return Ok(None);
        }
        let span = crate::traced_span!("spill pending hits", hits = traces::count(hits));
        let _in_span = span.enter();
        let metrics = &self.inner.metrics;
        match spill::write(dir, &batches) {
            Ok(path) => {
                metrics.spills.inc();
                metrics.spilled.inc_by(hits);
                tracing::warn!(hits, path = %path.display(), "hits spilled to disk; any replica sharing the spill directory applies them");
                Ok(Some(FinalFlush::Spilled { hits, path }))
            }
            Err(source) => {
                metrics.lost.inc_by(hits);
                let failed = SpillFailed {
                    dir: dir.to_owned(),
                    hits,
                    source,
                };
                tracing::error!(hits, path = %dir.display(), error = %crate::lifecycle::error_chain(&failed), "hits lost: the spill file cannot be written");
                crate::telemetry::traces::fail(&span, "spill_failed", &failed);
                Err(failed)
            }
        }
    }

    /// The pending hits of `code`, each with the id of the batch it is (or
    /// will be) applied in. Taken under the `unconfirmed` lock, which
    /// [`HitCounter::seal`] holds while it empties the shards, so no hit is
    /// seen twice or missed on its way from a shard into a batch.
    fn pending_for(&self, code: &str) -> Vec<(String, u64)> {
        let inner = &*self.inner;
        let shard = inner.picker.pick(code, SHARDS);
        let unconfirmed = lock(&inner.unconfirmed);
        let mut pending: Vec<(String, u64)> = unconfirmed
            .batches
            .iter()
            .filter_map(|batch| Some((batch.id.clone(), batch.hits.get(code)?)))
            .collect();
        if let Some(&count) = lock(&inner.shards[shard]).get(code) {
            pending.push((unconfirmed.next_id.clone(), count));
        }
        pending
    }

    /// The link with its hits: persisted plus pending, each hit counted
    /// exactly once even while a flush moves it into the database.
    ///
    /// The pending hits are taken first, with their batch ids; then one
    /// statement reads the link and which of those batches have landed, so
    /// a batch committed meanwhile is counted from the database and not
    /// from memory. That holds for the shards too, which are pending under
    /// the id of the batch they will be sealed into; any batch after that
    /// one holds only hits counted after the snapshot. The answer is the
    /// count at some instant during the call.
    ///
    /// # Errors
    /// The database error.
    pub async fn find_with_hits(
        &self,
        storage: &Storage,
        code: &str,
    ) -> Result<Option<StoredLink>, StorageError> {
        read_with_pending(storage, code, &self.pending_for(code)).await
    }

    /// Takes everything out of the shards into an unconfirmed batch, under
    /// the id readers were told it would have.
    fn seal(&self) {
        let inner = &*self.inner;
        let mut unconfirmed = lock(&inner.unconfirmed);
        // A code lives in one shard only: the shards' maps are disjoint and
        // are moved into the batch as they are. Each shard starts again
        // with room for as many codes as it had.
        let hits = Hits(
            inner
                .shards
                .iter()
                .map(|shard| {
                    let mut shard = lock(shard);
                    let room = shard.len();
                    std::mem::replace(&mut *shard, HashMap::with_capacity(room))
                })
                .filter(|map| !map.is_empty())
                .collect(),
        );
        if !hits.is_empty() {
            let id = std::mem::replace(&mut unconfirmed.next_id, new_batch_id());
            unconfirmed.batches.push(Batch { id, hits });
        }
    }

    /// Writes every pending hit to the database, one transaction per batch.
    /// On error the hits stay in memory, their batch id kept, and the next
    /// flush retries them.
    ///
    /// # Errors
    /// The database error of the first batch that failed.
    ///
    /// # Cancel safety
    /// Cancel safe: a batch whose commit was interrupted stays unconfirmed
    /// with its id, and applying it again is a no-op if it had landed.
    pub async fn flush(&self, storage: &Storage) -> Result<u64, StorageError> {
        let inner = &*self.inner;
        let _one_at_a_time = inner.flush_lock.lock().await;
        self.seal();
        let batches = lock(&inner.unconfirmed).batches.clone();
        if batches.is_empty() {
            return Ok(0);
        }
        // A span of its own (with traces on): the flusher's, or a child of
        // the final flush's.
        let span = crate::traced_span!(
            "hit flush",
            batches = traces::count(batches.len()),
            hits = traces::count(batches.iter().map(Batch::total).sum::<u64>()),
        );
        self.flush_batches(batches, storage).instrument(span).await
    }

    /// Applies `batches` in order, each exactly once; stops at the first
    /// that fails.
    async fn flush_batches(
        &self,
        batches: Vec<Batch>,
        storage: &Storage,
    ) -> Result<u64, StorageError> {
        let inner = &*self.inner;
        let mut flushed = 0;
        for batch in batches {
            let started = Instant::now();
            match storage.apply_hits(&batch.id, &batch.as_rows()).await {
                Ok(applied) => {
                    lock(&inner.unconfirmed)
                        .batches
                        .retain(|b| b.id != batch.id);
                    let total = batch.total();
                    inner
                        .metrics
                        .pending
                        .dec_by(i64::try_from(total).unwrap_or(i64::MAX));
                    inner.metrics.flush_batches.inc();
                    inner
                        .metrics
                        .flush_seconds
                        .observe(started.elapsed().as_secs_f64());
                    if applied {
                        inner.metrics.flushed.inc_by(total);
                    }
                    flushed += total;
                }
                Err(error) => {
                    inner.metrics.flush_failures.inc();
                    return Err(error);
                }
            }
        }
        Ok(flushed)
    }

    /// Takes every pending hit out of memory, as batches, for a spill file.
    fn take_all(&self) -> Vec<Batch> {
        self.seal();
        let inner = &*self.inner;
        let batches = std::mem::take(&mut lock(&inner.unconfirmed).batches);
        let total: u64 = batches.iter().map(Batch::total).sum();
        inner
            .metrics
            .pending
            .dec_by(i64::try_from(total).unwrap_or(i64::MAX));
        batches
    }

    /// Resolves when many hits are pending.
    async fn many_pending(&self) {
        self.inner.many_pending.notified().await;
    }
}

/// The link `code` with its stored hits plus those of `pending` (from
/// [`HitCounter::pending_for`]) whose batch had not landed when it was read.
async fn read_with_pending(
    storage: &Storage,
    code: &str,
    pending: &[(String, u64)],
) -> Result<Option<StoredLink>, StorageError> {
    let ids: Vec<&str> = pending.iter().map(|(id, _)| id.as_str()).collect();
    let Some((mut link, landed)) = storage.find_link_and_batches(code, &ids).await? else {
        return Ok(None);
    };
    for ((_, count), landed) in pending.iter().zip(landed) {
        if !landed {
            link.hits = link
                .hits
                .saturating_add(i64::try_from(*count).unwrap_or(i64::MAX));
        }
    }
    Ok(Some(link))
}

/// The flusher worker: flushes every `interval`, or sooner when
/// [`FLUSH_THRESHOLD`] hits are pending, until `token` fires. A failed flush
/// keeps the hits in memory for the next one; the worker itself never fails
/// on a database outage.
///
/// # Errors
/// None today; the signature lets a real failure stop the process.
pub async fn run_flusher(
    counter: HitCounter,
    storage: Storage,
    interval: Duration,
    token: CancellationToken,
) -> Result<(), BoxError> {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticker.tick().await;
    loop {
        tokio::select! {
            () = token.cancelled() => return Ok(()),
            _ = ticker.tick() => {}
            () = counter.many_pending() => ticker.reset(),
        }
        // Fault injection for the ways-out tests: a critical worker that
        // panics (`FAILPOINTS=hit-flusher=panic`).
        #[cfg(feature = "failpoints")]
        fail::fail_point!("hit-flusher");
        if let Err(error) = counter.flush(&storage).await {
            tracing::warn!(%error, pending = counter.pending(), "hit flush failed; the hits stay in memory and are retried");
        }
    }
}

/// The final flush, run as a finalizer after the last in-flight redirect:
/// retries with backoff until `budget` less [`SPILL_RESERVE`] is spent, then
/// writes whatever is left to a spill file in `spill_dir`.
///
/// # Errors
/// [`SpillFailed`] if the spill file cannot be written either: those hits
/// are lost, counted and logged as such.
pub async fn final_flush(
    counter: &HitCounter,
    storage: &Storage,
    spill_dir: &Path,
    budget: Duration,
) -> Result<FinalFlush, SpillFailed> {
    let deadline = Instant::now() + budget.saturating_sub(SPILL_RESERVE);
    let mut backoff = Duration::from_millis(50);
    let mut flushed = 0;
    loop {
        match tokio::time::timeout_at(deadline, counter.flush(storage)).await {
            Ok(Ok(hits)) => {
                flushed += hits;
                if counter.pending() == 0 {
                    return Ok(FinalFlush::Flushed { hits: flushed });
                }
            }
            Ok(Err(error)) => tracing::warn!(%error, "final hit flush failed; retrying"),
            Err(_elapsed) => break,
        }
        if Instant::now() + backoff >= deadline {
            break;
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(1));
    }
    tracing::warn!("database unavailable at the final flush: spilling the pending hits");
    Ok(counter
        .spill_now(spill_dir)?
        .unwrap_or(FinalFlush::Flushed { hits: flushed }))
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::future::Future;

    fn pending_total(counter: &HitCounter, code: &str) -> u64 {
        counter.pending_for(code).iter().map(|(_, n)| n).sum()
    }

    #[test]
    fn recorded_hits_are_pending_per_code_until_taken() {
        let counter = HitCounter::default();
        for _ in 0..3 {
            counter.record("abc");
        }
        counter.record("xyz");
        assert_eq!(counter.pending(), 4);
        assert_eq!(pending_total(&counter, "abc"), 3);

        counter.seal();
        // Sealed into a batch: still pending, still visible.
        assert_eq!(pending_total(&counter, "abc"), 3);
        counter.record("abc");
        assert_eq!(pending_total(&counter, "abc"), 4);

        let batches = counter.take_all();
        assert_eq!(batches.len(), 2);
        assert_eq!(batches.iter().map(Batch::total).sum::<u64>(), 5);
        assert_eq!(counter.pending(), 0);
        assert_eq!(pending_total(&counter, "abc"), 0);
    }

    async fn storage_with_link(dir: &Path, code: &str) -> Storage {
        let storage = Storage::open(None, dir, 2, crate::storage::StorageMetrics::default())
            .await
            .expect("open SQLite");
        let link = StoredLink {
            code: code.to_owned(),
            url: "https://example.com/".to_owned(),
            hits: 0,
            created_at: "2026-01-01T00:00:00.000Z".to_owned(),
        };
        storage
            .insert_link(&link, &CancellationToken::new())
            .await
            .expect("insert");
        storage
    }

    /// Reads `code` as `find_with_hits` does, with `meanwhile` run
    /// between taking the pending hits and reading the database: the worst
    /// moment for a flush to land.
    async fn read_around(
        counter: &HitCounter,
        storage: &Storage,
        code: &str,
        meanwhile: impl Future<Output = ()>,
    ) -> i64 {
        let pending = counter.pending_for(code);
        meanwhile.await;
        read_with_pending(storage, code, &pending)
            .await
            .expect("read")
            .expect("the link exists")
            .hits
    }

    // A read never counts a hit twice or misses one, wherever a flush is
    // when it reads: before, during (a batch committed, not yet confirmed)
    // or after, and whether the hits were in a shard or a batch.
    #[tokio::test]
    async fn a_read_counts_every_hit_once_while_flushes_land() {
        let dir = tempfile::tempdir().expect("tempdir");
        let storage = storage_with_link(dir.path(), "abc").await;
        let counter = HitCounter::default();
        let read = |storage| counter.find_with_hits(storage, "abc");
        assert_eq!(read(&storage).await.expect("read").expect("link").hits, 0);

        // Hits in a shard; a whole flush lands between snapshot and read.
        for _ in 0..3 {
            counter.record("abc");
        }
        let hits = read_around(&counter, &storage, "abc", async {
            assert_eq!(counter.flush(&storage).await.expect("flush"), 3);
        })
        .await;
        assert_eq!(hits, 3);

        // Hits in an unconfirmed batch whose commit lands but is not yet
        // confirmed, plus newer hits in a shard.
        for _ in 0..4 {
            counter.record("abc");
        }
        counter.seal();
        counter.record("abc");
        let sealed = lock(&counter.inner.unconfirmed).batches[0].clone();
        let hits = read_around(&counter, &storage, "abc", async {
            assert!(storage
                .apply_hits(&sealed.id, &sealed.as_rows())
                .await
                .expect("apply"));
        })
        .await;
        assert_eq!(hits, 8);
        assert_eq!(read(&storage).await.expect("read").expect("link").hits, 8);

        // The flush confirms it (the re-apply is a no-op) and the shard.
        assert_eq!(counter.flush(&storage).await.expect("flush"), 5);
        assert_eq!(counter.pending(), 0);
        assert_eq!(read(&storage).await.expect("read").expect("link").hits, 8);
        assert_eq!(storage.total_hits().await.expect("total"), 8);
    }

    #[test]
    fn concurrent_recording_loses_nothing() {
        let counter = HitCounter::default();
        std::thread::scope(|scope| {
            for t in 0..8 {
                let counter = counter.clone();
                scope.spawn(move || {
                    for i in 0..10_000 {
                        counter.record(&format!("code{}", (i + t) % 17));
                    }
                });
            }
        });
        let total: u64 = counter.take_all().iter().map(Batch::total).sum();
        assert_eq!(total, 80_000);
    }

    #[test]
    fn a_spill_writes_every_pending_hit_once_and_empties_memory() {
        let dir = tempfile::tempdir().expect("tempdir");
        let counter = HitCounter::default();
        for i in 0..1_000 {
            counter.record(&format!("code{}", i % 7));
        }
        counter.seal();
        counter.record("late");
        let Ok(Some(FinalFlush::Spilled { hits, path })) = counter.spill_now(dir.path()) else {
            panic!("spilled");
        };
        assert_eq!(hits, 1_001);
        assert_eq!(counter.pending(), 0);
        assert_eq!(counter.spilled(), 1_001);
        assert_eq!(spill::pending(dir.path()).expect("list"), vec![path]);
        assert!(
            matches!(counter.spill_now(dir.path()), Ok(None)),
            "nothing left"
        );
    }

    #[test]
    fn a_spill_that_cannot_be_written_counts_the_hits_as_lost_and_names_the_dir() {
        let holder = tempfile::tempdir().expect("tempdir");
        let file = holder.path().join("a-file");
        std::fs::write(&file, b"x").expect("write");
        let dir = file.join("spill");
        let counter = HitCounter::default();
        for _ in 0..5 {
            counter.record("abc");
        }
        let failed = counter.spill_now(&dir).expect_err("ENOTDIR");
        assert_eq!(failed.hits, 5);
        assert_eq!(failed.dir, dir);
        assert_eq!(counter.lost(), 5);
        assert_eq!(counter.spilled(), 0);
        assert!(failed.to_string().contains("5 hits lost"), "{failed}");
    }
}
