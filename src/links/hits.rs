//! The example's write-behind state: a hit is one redirect of a link,
//! counted by the write-behind component (`lameduck-writebehind`), which
//! owns everything else — the flusher, the final flush after the last
//! redirect, the spill, the replay, the journal that keeps what a redirect
//! counted across a SIGKILL or an OOM kill. What is the domain's stays
//! here: what a hit is, and how a batch of them lands in the database.

use axum::extract::FromRef;
use lameduck_writebehind::{Applied, Batch, Config, OpenError, Sink, Sum, WriteBehind};

use crate::config::ServerConfig;
use crate::storage::{Storage, StorageError, StoredLink};

/// The write-behind component's name: its files, metrics
/// (`lameduck_hits_pending`, …), workers and log lines.
pub const NAME: &str = "hits";

/// Hits per link code, added up.
pub type HitCounter = WriteBehind<String, u64, Sum>;

/// Opens the hit counters in the spill directory, with the durability the
/// configuration asks for.
///
/// # Errors
/// The spill directory cannot take a file.
pub fn open(config: &ServerConfig) -> Result<HitCounter, OpenError> {
    HitCounter::open(counter_config(config))
}

/// The component's configuration from the service's.
pub fn counter_config(config: &ServerConfig) -> Config {
    let mut counters = Config::new(NAME, config.spill_dir());
    counters.durability = config.state_durability.into();
    counters.flush_interval = config.flush_interval;
    counters.final_flush_budget = crate::app::FINAL_FLUSH_BUDGET;
    counters
}

/// Where batches of hits land: one transaction adds them to their links
/// and records the batch id ([`Storage::apply_hits`]).
#[derive(Clone, Debug)]
pub struct HitSink(pub Storage);

impl FromRef<Storage> for HitSink {
    fn from_ref(storage: &Storage) -> HitSink {
        HitSink(storage.clone())
    }
}

impl Sink<String, u64> for HitSink {
    type Error = StorageError;

    async fn apply(&self, batch: &Batch<String, u64>) -> Result<Applied, StorageError> {
        let rows: Vec<(String, u64)> = batch.iter().map(|(code, n)| (code.clone(), *n)).collect();
        let applied = self.0.apply_hits(batch.id().as_str(), &rows).await?;
        Ok(if applied {
            Applied::Now
        } else {
            Applied::Before
        })
    }
}

/// The link `code` with its hits: stored plus pending, each hit counted
/// exactly once even while a flush moves it into the database.
///
/// The pending hits are taken first, with their batch ids; then one
/// statement reads the link and which of those batches have landed, so a
/// batch committed meanwhile is counted from the database and not from
/// memory. The answer is the count at some instant during the call.
///
/// # Errors
/// The database error.
pub async fn find_with_hits(
    hits: &HitCounter,
    storage: &Storage,
    code: &str,
) -> Result<Option<StoredLink>, StorageError> {
    let pending = hits.pending_for(code);
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

#[cfg(test)]
mod tests {
    use super::*;

    use tokio_util::sync::CancellationToken;

    async fn storage_with_link(dir: &std::path::Path, code: &str) -> Storage {
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

    // A read never counts a hit twice or misses one, wherever a flush is
    // when it reads: before, during (a batch committed, not yet confirmed)
    // or after.
    #[tokio::test]
    async fn a_read_counts_every_hit_once_while_flushes_land() {
        let dir = tempfile::tempdir().expect("tempdir");
        let storage = storage_with_link(dir.path(), "abc").await;
        let sink = HitSink(storage.clone());
        let counter = HitCounter::open(Config::new(NAME, dir.path().join("spill"))).expect("open");
        let read = || async {
            find_with_hits(&counter, &storage, "abc")
                .await
                .expect("read")
                .expect("link")
                .hits
        };
        assert_eq!(read().await, 0);

        for _ in 0..3 {
            counter.record("abc", 1);
        }
        assert_eq!(read().await, 3);
        // The batch lands between the snapshot of the pending hits and the
        // read of the database: counted from the database only.
        let pending = counter.pending_for("abc");
        assert_eq!(counter.flush(&sink).await.expect("flush"), 3);
        let ids: Vec<&str> = pending.iter().map(|(id, _)| id.as_str()).collect();
        let (link, landed) = storage
            .find_link_and_batches("abc", &ids)
            .await
            .expect("read")
            .expect("link");
        assert_eq!((link.hits, landed), (3, vec![true]));
        assert_eq!(read().await, 3);

        for _ in 0..4 {
            counter.record("abc", 1);
        }
        assert_eq!(read().await, 7);
        assert_eq!(counter.flush(&sink).await.expect("flush"), 4);
        assert_eq!(counter.pending(), 0);
        assert_eq!(read().await, 7);
        assert_eq!(storage.total_hits().await.expect("total"), 7);
    }
}
