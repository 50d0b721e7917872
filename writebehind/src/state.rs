//! The component: updates recorded into sharded maps (and the journal),
//! sealed into batches, applied to the sink, spilled at exit when the sink
//! cannot take them.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::{BuildHasher, Hash};
use std::marker::PhantomData;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use lameduck_lifecycle::Kept;
use prometheus_client::registry::Registry;
use serde::Serialize;
use tokio::sync::Notify;
use tokio::time::Instant;
use tracing::Instrument;

use crate::batch::{Batch, BatchId};
use crate::config::{Config, Durability, SPILL_RESERVE};
use crate::journal::{Journal, Segment};
use crate::merge::Merge;
use crate::metrics::Metrics;
use crate::sink::{Applied, Sink};
use crate::{disk, files, lock, Key, Value};

/// Shards of the pending updates: an update locks one shard, so concurrent
/// updates rarely contend and never on one lock.
const SHARDS: usize = 32;

/// Spare journal segments the flusher keeps ready.
const SPARES: usize = 2;

/// The least time worth a try of the final flush: a round trip to a store
/// on the same network.
const LAST_TRY: std::time::Duration = std::time::Duration::from_millis(50);

/// Why a component could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The name cannot name files.
    #[error("{0:?} cannot name a write-behind component: use ASCII letters, digits, '-' and '_'")]
    Name(&'static str),
    /// The directory cannot take a file: a spill at exit would fail.
    #[error("the spill directory {path} is not writable")]
    Dir {
        /// The directory.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// Updates that could be written neither to the store, nor to a spill
/// file, nor kept by the journal: lost.
#[derive(Debug, thiserror::Error)]
#[error("cannot write the spill file in {dir}: {updates} {name} lost")]
pub struct SpillFailed {
    /// The component.
    pub name: &'static str,
    /// The directory.
    pub dir: PathBuf,
    /// The updates lost.
    pub updates: u64,
    /// Why the spill file could not be written.
    #[source]
    pub source: std::io::Error,
}

/// Where pending updates went at the end.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FinalFlush {
    /// Every pending update is in the store.
    Flushed {
        /// Updates the final flush applied.
        updates: u64,
    },
    /// The store could not take them: they are on disk, in a spill file
    /// (or, when it could not be written, in the journal).
    Spilled {
        /// Updates left on disk.
        updates: u64,
        /// The spill file, or the directory of the journal that kept them.
        path: PathBuf,
    },
}

/// Write-behind state: updates recorded in memory, merged per key,
/// applied to a [`Sink`] in batches. Cloning shares it.
///
/// `K` is the key, `V` the update (and the merged value), `M` the rule
/// that merges two updates of one key.
pub struct WriteBehind<K, V, M> {
    pub(crate) inner: Arc<Inner<K, V, M>>,
}

impl<K, V, M> Clone for WriteBehind<K, V, M> {
    fn clone(&self) -> Self {
        WriteBehind {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<K, V, M> std::fmt::Debug for WriteBehind<K, V, M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriteBehind")
            .field("name", &self.inner.config.name)
            .field("instance", &self.inner.instance)
            .field("pending", &self.inner.metrics.pending.get())
            .finish_non_exhaustive()
    }
}

pub(crate) struct Inner<K, V, M> {
    pub(crate) config: Config,
    /// Names this process's files and batch ids.
    pub(crate) instance: String,
    shards: Box<[Mutex<Shard<K, V>>]>,
    picker: foldhash::quality::RandomState,
    /// The generation of the batch the shards will be sealed into. Read
    /// under a shard's lock; moved on under every shard's lock, so an
    /// update is journaled under the generation of the batch it ends in.
    generation: AtomicU64,
    /// Batches taken out of the shards whose landing is not confirmed yet
    /// (in flight, or failed), oldest first.
    unconfirmed: Mutex<Vec<Batch<K, V>>>,
    /// `None` in [`Durability::Memory`].
    pub(crate) journal: Option<Journal>,
    /// Set once the journal's files are removed at exit: later updates are
    /// kept in memory only. Read under a shard's lock.
    journal_closed: AtomicBool,
    /// Woken when the flush threshold is reached.
    many_pending: Notify,
    /// One flush at a time.
    flush_lock: tokio::sync::Mutex<()>,
    /// `false` turns `record` into a no-op: only for measuring what the
    /// component costs.
    recording: AtomicBool,
    pub(crate) metrics: Metrics,
    _merge: PhantomData<fn() -> M>,
}

struct Shard<K, V> {
    map: HashMap<K, V>,
    /// Updates recorded into `map`.
    updates: u64,
    /// Of those, the ones the journal could not take.
    unjournaled: u64,
    /// This shard's journal segment.
    segment: Option<Segment>,
}

impl<K, V> Default for Shard<K, V> {
    fn default() -> Self {
        Shard {
            map: HashMap::new(),
            updates: 0,
            unjournaled: 0,
            segment: None,
        }
    }
}

impl<K: Key, V: Value, M: Merge<V>> WriteBehind<K, V, M> {
    /// Opens a component: checks that its directory takes a file (so that
    /// a spill at exit does not fail for want of one) and, when journaled,
    /// creates this process's ledger there.
    ///
    /// # Errors
    /// An [`OpenError`] naming the directory.
    pub fn open(config: Config) -> Result<WriteBehind<K, V, M>, OpenError> {
        if !files::valid_name(config.name) {
            return Err(OpenError::Name(config.name));
        }
        let instance = files::new_instance();
        let metrics = Metrics::default();
        let dir_error = |source| OpenError::Dir {
            path: config.dir.clone(),
            source,
        };
        ensure_writable(&config.dir, config.name).map_err(dir_error)?;
        let journal = match config.durability {
            Durability::Memory => None,
            Durability::Journal => Some(
                Journal::open(
                    &config.dir,
                    config.name,
                    &instance,
                    config.segment_size,
                    metrics.clone(),
                )
                .map_err(dir_error)?,
            ),
        };
        Ok(WriteBehind {
            inner: Arc::new(Inner {
                config,
                instance,
                shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
                picker: foldhash::quality::RandomState::default(),
                generation: AtomicU64::new(1),
                unconfirmed: Mutex::default(),
                journal,
                journal_closed: AtomicBool::new(false),
                many_pending: Notify::new(),
                flush_lock: tokio::sync::Mutex::new(()),
                recording: AtomicBool::new(true),
                metrics,
                _merge: PhantomData,
            }),
        })
    }

    /// Registers the component's series under its name.
    pub fn register(&self, registry: &mut Registry) {
        self.inner
            .metrics
            .register(registry.sub_registry_with_prefix(self.inner.config.name));
    }

    /// The configuration it was opened with.
    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// Records `update` for `key`, merged into what is pending for it. In
    /// [`Durability::Journal`] it is in the journal when this returns: a
    /// response sent after it may promise the update.
    ///
    /// Locks one shard of 32 briefly; makes no system call (the journal
    /// is a file mapping, and a segment is made ahead by the flusher).
    ///
    /// The journal stores `key` as `Q` serializes: it must serialize as
    /// `K` does (a `str` as a `String`).
    pub fn record<Q>(&self, key: &Q, update: V)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + Serialize + ToOwned<Owned = K> + ?Sized,
    {
        let inner = &*self.inner;
        if !inner.recording.load(Ordering::Relaxed) {
            return;
        }
        let index = usize::try_from(inner.picker.hash_one(key) >> 32).unwrap_or_default() % SHARDS;
        let mut guard = lock(&inner.shards[index]);
        let shard = &mut *guard;
        if let Some(journal) = self.journal() {
            let generation = inner.generation.load(Ordering::Acquire);
            if !journal.append(&mut shard.segment, generation, &(key, &update)) {
                shard.unjournaled += 1;
                inner.metrics.unjournaled.inc();
            }
        }
        match shard.map.get_mut(key) {
            Some(pending) => M::merge(pending, update),
            None => {
                shard.map.insert(key.to_owned(), update);
            }
        }
        shard.updates += 1;
        drop(guard);
        let threshold = i64::try_from(inner.config.flush_threshold).unwrap_or(i64::MAX);
        if inner.metrics.pending.inc() + 1 == threshold {
            inner.many_pending.notify_one();
        }
    }

    /// The journal, while it is open.
    fn journal(&self) -> Option<&Journal> {
        let inner = &*self.inner;
        inner
            .journal
            .as_ref()
            .filter(|_| !inner.journal_closed.load(Ordering::Acquire))
    }

    /// Turns recording on or off. Off is only for measuring what the
    /// component costs; a service never wants it.
    pub fn set_recording(&self, on: bool) {
        self.inner.recording.store(on, Ordering::Relaxed);
    }

    /// Updates recorded and not yet in the store.
    pub fn pending(&self) -> u64 {
        u64::try_from(self.inner.metrics.pending.get()).unwrap_or_default()
    }

    /// Updates this process applied to the store.
    pub fn flushed(&self) -> u64 {
        self.inner.metrics.flushed.get()
    }

    /// Updates this process left on disk at exit.
    pub fn spilled(&self) -> u64 {
        self.inner.metrics.spilled.get()
    }

    /// Updates this process lost.
    pub fn lost(&self) -> u64 {
        self.inner.metrics.lost.get()
    }

    /// Where this process's updates went: what the lifecycle's stop report
    /// carries.
    pub fn kept(&self) -> Kept {
        Kept {
            name: self.inner.config.name,
            flushed: self.flushed(),
            spilled: self.spilled(),
            lost: self.lost(),
        }
    }

    /// What is pending for `key`, each value with the id of the batch it
    /// is (or will be) applied in: a reader adds to what the store holds
    /// the values of the batches the store has not recorded yet, and counts
    /// every update once even while a flush lands.
    ///
    /// Taken under the lock that sealing a batch holds, so no update is
    /// seen twice or missed on its way from a shard into a batch.
    pub fn pending_for<Q>(&self, key: &Q) -> Vec<(BatchId, V)>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let inner = &*self.inner;
        let index = usize::try_from(inner.picker.hash_one(key) >> 32).unwrap_or_default() % SHARDS;
        let unconfirmed = lock(&inner.unconfirmed);
        let mut pending: Vec<(BatchId, V)> = unconfirmed
            .iter()
            .filter_map(|batch| Some((batch.id.clone(), batch.get(key)?.clone())))
            .collect();
        if let Some(value) = lock(&inner.shards[index]).map.get(key) {
            let next = inner.generation.load(Ordering::Acquire);
            pending.push((BatchId::new(&inner.instance, next), value.clone()));
        }
        pending
    }

    /// Moves everything in the shards into an unconfirmed batch, under the
    /// id readers were told it would have.
    pub(crate) fn seal(&self) {
        let inner = &*self.inner;
        let mut unconfirmed = lock(&inner.unconfirmed);
        let mut shards: Vec<_> = inner.shards.iter().map(lock).collect();
        let generation = inner.generation.fetch_add(1, Ordering::AcqRel);
        let mut batch = Batch::new(BatchId::new(&inner.instance, generation), generation);
        for shard in shards.iter_mut().filter(|shard| shard.updates > 0) {
            let room = shard.map.len();
            batch.maps.push(std::mem::replace(
                &mut shard.map,
                HashMap::with_capacity(room),
            ));
            batch.updates += std::mem::take(&mut shard.updates);
            batch.unjournaled += std::mem::take(&mut shard.unjournaled);
        }
        drop(shards);
        if batch.unjournaled > 0 {
            // Loud once a batch: the journal's failure was logged when it
            // began; this says how much it has left to memory alone.
            let name = inner.config.name;
            tracing::warn!(
                state = name,
                updates = batch.unjournaled,
                batch = %batch.id,
                dir = %inner.config.dir.display(),
                "{name}: updates not in the journal; a process kill before they land would lose them"
            );
        }
        if batch.updates > 0 {
            unconfirmed.push(batch);
        }
    }

    /// Applies every pending update to `sink`, a batch at a time, oldest
    /// first. On error the updates stay pending under their batch's id and
    /// the next flush retries them.
    ///
    /// # Errors
    /// The sink's error for the first batch that failed.
    ///
    /// # Cancel safety
    /// Cancel safe: a batch whose apply was interrupted stays unconfirmed
    /// with its id, and applying it again is a no-op if it had landed.
    pub async fn flush<S: Sink<K, V>>(&self, sink: &S) -> Result<u64, S::Error> {
        let inner = &*self.inner;
        let _one_at_a_time = inner.flush_lock.lock().await;
        self.seal();
        let batches = lock(&inner.unconfirmed).clone();
        if batches.is_empty() {
            return Ok(0);
        }
        let span = tracing::info_span!(
            "write-behind flush",
            state = inner.config.name,
            batches = count(batches.len()),
            updates = count(batches.iter().map(Batch::updates).sum::<u64>()),
        );
        self.apply_batches(batches, sink).instrument(span).await
    }

    async fn apply_batches<S: Sink<K, V>>(
        &self,
        batches: Vec<Batch<K, V>>,
        sink: &S,
    ) -> Result<u64, S::Error> {
        let inner = &*self.inner;
        let metrics = &inner.metrics;
        let mut flushed = 0;
        for batch in batches {
            let started = Instant::now();
            match sink.apply(&batch).await {
                Ok(applied) => {
                    lock(&inner.unconfirmed).retain(|b| b.id != batch.id);
                    metrics.pending.dec_by(count(batch.updates));
                    metrics.flush_batches.inc();
                    metrics
                        .flush_seconds
                        .observe(started.elapsed().as_secs_f64());
                    if applied == Applied::Now {
                        metrics.flushed.inc_by(batch.updates);
                    }
                    flushed += batch.updates;
                    self.confirm(batch.generation);
                }
                Err(error) => {
                    metrics.flush_failures.inc();
                    return Err(error);
                }
            }
        }
        Ok(flushed)
    }

    /// Tells the journal that every batch up to `generation` has landed.
    fn confirm(&self, generation: u64) {
        if let Some(journal) = self.journal() {
            if let Err(error) = journal.confirm(generation) {
                tracing::warn!(state = self.inner.config.name, %error, "cannot write the journal's ledger: a replay may apply landed batches again, which their ids make harmless");
            }
        }
    }

    /// Takes every pending update out of memory, as batches.
    fn take_all(&self) -> Vec<Batch<K, V>> {
        self.seal();
        let batches = std::mem::take(&mut *lock(&self.inner.unconfirmed));
        let updates: u64 = batches.iter().map(Batch::updates).sum();
        self.inner.metrics.pending.dec_by(count(updates));
        batches
    }

    /// Takes every pending update out of memory and writes it to a new
    /// spill file, synchronously: no round trip to the sink, so it is what
    /// a forced exit runs. `Ok(None)` if nothing was pending.
    ///
    /// If the file cannot be written, the journal (when there is one, and
    /// its files are still there) keeps what it took: those updates count
    /// as spilled, the rest as lost.
    ///
    /// # Errors
    /// [`SpillFailed`] if any update is lost: counted, and logged with the
    /// directory and the count.
    pub fn spill_now(&self) -> Result<Option<FinalFlush>, SpillFailed> {
        let inner = &*self.inner;
        let (name, dir) = (inner.config.name, &inner.config.dir);
        let batches = self.take_all();
        let updates: u64 = batches.iter().map(Batch::updates).sum();
        if updates == 0 {
            return Ok(None);
        }
        let span = tracing::info_span!(
            "write-behind spill",
            state = name,
            updates = count(updates),
            otel.status_code = tracing::field::Empty,
            error.type = tracing::field::Empty,
        );
        let _in_span = span.enter();
        let metrics = &inner.metrics;
        let source = match disk::write_spill(dir, name, &inner.instance, &batches) {
            Ok(path) => {
                metrics.spills.inc();
                metrics.spilled.inc_by(updates);
                if let Some(newest) = batches.last() {
                    self.confirm(newest.generation);
                }
                tracing::warn!(state = name, updates, path = %path.display(), "{name} spilled to disk; any replica sharing the spill directory applies them");
                return Ok(Some(FinalFlush::Spilled { updates, path }));
            }
            Err(source) => source,
        };
        let kept_by_journal = self
            .journal()
            .is_some_and(|journal| self.sync_journal(journal));
        let unjournaled: u64 = batches.iter().map(|b| b.unjournaled).sum();
        let lost = if kept_by_journal {
            unjournaled
        } else {
            updates
        };
        let kept = updates - lost;
        metrics.spilled.inc_by(kept);
        if kept > 0 {
            tracing::warn!(state = name, updates = kept, path = %dir.display(), error = %source, "{name} could not be spilled, and the journal keeps them: the next start applies them");
        }
        if lost == 0 {
            return Ok(Some(FinalFlush::Spilled {
                updates: kept,
                path: dir.clone(),
            }));
        }
        metrics.lost.inc_by(lost);
        let failed = SpillFailed {
            name,
            dir: dir.clone(),
            updates: lost,
            source,
        };
        tracing::error!(state = name, updates = lost, path = %dir.display(), error = %lameduck_lifecycle::error_chain(&failed), "{name} lost: the spill file cannot be written");
        span.record("otel.status_code", "ERROR");
        span.record("error.type", "spill_failed");
        Err(failed)
    }

    /// Writes the journal to disk; `true` if its files are all there.
    fn sync_journal(&self, journal: &Journal) -> bool {
        let shards: Vec<_> = self.inner.shards.iter().map(lock).collect();
        let current: Vec<&Segment> = shards.iter().filter_map(|s| s.segment.as_ref()).collect();
        journal.sync(&current)
    }

    /// Removes the journal's files once nothing pending needs them: every
    /// update is in the store or a spill file. Later updates are kept in
    /// memory only.
    pub(crate) fn close_journal(&self) {
        let inner = &*self.inner;
        let Some(journal) = &inner.journal else {
            return;
        };
        if inner.journal_closed.swap(true, Ordering::AcqRel) {
            return;
        }
        let current: Vec<Segment> = inner
            .shards
            .iter()
            .filter_map(|shard| lock(shard).segment.take())
            .collect();
        journal.close(current);
    }

    /// Makes spare journal segments ahead of need (the flusher's job).
    pub(crate) fn prepare_journal(&self) {
        if let Some(journal) = self.journal() {
            journal.prepare(SPARES);
        }
    }

    /// The final flush, after the last request: retries the sink with
    /// backoff until the budget (less [`SPILL_RESERVE`]) is spent, then
    /// spills what is left. The journal's files are removed once nothing
    /// needs them.
    ///
    /// # Errors
    /// [`SpillFailed`] if updates are lost.
    pub async fn final_flush<S: Sink<K, V>>(&self, sink: &S) -> Result<FinalFlush, SpillFailed> {
        let name = self.inner.config.name;
        let budget = self.inner.config.final_flush_budget;
        let deadline = Instant::now() + budget.saturating_sub(SPILL_RESERVE);
        let mut backoff = std::time::Duration::from_millis(50);
        let mut flushed = 0;
        loop {
            match tokio::time::timeout_at(deadline, self.flush(sink)).await {
                Ok(Ok(updates)) => {
                    flushed += updates;
                    if self.pending() == 0 {
                        self.close_journal();
                        return Ok(FinalFlush::Flushed { updates: flushed });
                    }
                }
                Ok(Err(error)) => {
                    tracing::warn!(state = name, %error, "final flush failed; retrying")
                }
                Err(_elapsed) => break,
            }
            // The time left is used to the end: the last wait is cut short
            // so that one more try still has `LAST_TRY` for itself.
            let left = deadline.saturating_duration_since(Instant::now());
            if left < LAST_TRY {
                break;
            }
            tokio::time::sleep(backoff.min(left - LAST_TRY)).await;
            backoff = (backoff * 2).min(std::time::Duration::from_secs(1));
        }
        tracing::warn!(
            state = name,
            "the store is unavailable at the final flush: spilling what is pending"
        );
        let spilled = self.spill_now()?;
        if matches!(&spilled, Some(FinalFlush::Spilled { path, .. }) if path.is_file()) {
            self.close_journal();
        }
        Ok(spilled.unwrap_or(FinalFlush::Flushed { updates: flushed }))
    }
}

/// A count as a span field that OpenTelemetry records as a number: its
/// attributes are signed, and an unsigned field is written as text.
pub(crate) fn count(n: impl TryInto<i64>) -> i64 {
    n.try_into().unwrap_or(i64::MAX)
}

/// Creates `dir` if needed and writes (then removes) a small file in it.
fn ensure_writable(dir: &std::path::Path, name: &str) -> std::io::Result<()> {
    use std::io::Write;
    std::fs::create_dir_all(dir)?;
    let probe = dir.join(format!(".{name}.probe-{}.tmp", files::new_instance()));
    let written = std::fs::File::create(&probe).and_then(|mut file| {
        file.write_all(name.as_bytes())?;
        file.sync_all()
    });
    let removed = std::fs::remove_file(&probe);
    written.and(removed)
}

impl<K, V, M> WriteBehind<K, V, M> {
    /// Resolves when the flush threshold is reached.
    pub(crate) async fn many_pending(&self) {
        self.inner.many_pending.notified().await;
    }
}
