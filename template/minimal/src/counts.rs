//! State of the service's own: requests per route, counted before each
//! response goes out and added up in `counts.json` in the state directory.
//! This file says what is kept, how two updates merge and how a batch
//! lands; the write-behind component (`writebehind/`) owns the rest: the
//! flusher, the journal that keeps a count across SIGKILL, the final flush,
//! the spill and the replay. README.md, "Keep your own state", walks
//! through it.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use axum::extract::{MatchedPath, Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::Response;
use axum::Json;
use lameduck_writebehind::{Applied, Batch, Sink, Sum, WriteBehind};
use serde::{Deserialize, Serialize};

/// Requests per route, added up.
pub(crate) type Counts = WriteBehind<String, u64, Sum>;

/// What has landed: requests per route.
type Totals = BTreeMap<String, u64>;

/// `counts.json`: the totals and, written with them, the newest batch
/// applied from each process (`BatchId::generation`: one process applies a
/// process's batches in order; see `Sink`'s "Order" for when it is not
/// enough, and keep every id then).
#[derive(Debug, Default, Serialize, Deserialize)]
struct Stored {
    counts: Totals,
    applied: BTreeMap<String, u64>,
}

/// Where batches land: `counts.json` in this directory, replaced whole.
/// The processes sharing it (an in-place upgrade runs two) take turns
/// under `counts.lock`.
#[derive(Clone, Debug)]
pub(crate) struct CountsFile(pub(crate) PathBuf);

impl Sink<String, u64> for CountsFile {
    type Error = io::Error;

    // No `.await`: dropped at exit, a call has replaced the file or not.
    async fn apply(&self, batch: &Batch<String, u64>) -> io::Result<Applied> {
        let (process, number) = (batch.id().instance(), batch.id().generation());
        let turn = File::create(self.0.join("counts.lock"))?;
        turn.lock()?;
        let mut stored = read(&self.0)?;
        if stored.applied.get(process).is_some_and(|&n| n >= number) {
            return Ok(Applied::Before);
        }
        for (route, n) in batch.iter() {
            *stored.counts.entry(route.clone()).or_default() += n;
        }
        stored.applied.insert(process.to_owned(), number);
        let temporary = self.0.join("counts.json.tmp");
        let mut file = File::create(&temporary)?;
        file.write_all(&serde_json::to_vec(&stored)?)?;
        file.sync_all()?;
        fs::rename(&temporary, self.0.join("counts.json"))?;
        Ok(Applied::Now)
    }
}

fn read(dir: &Path) -> io::Result<Stored> {
    match fs::read(dir.join("counts.json")) {
        Ok(json) => Ok(serde_json::from_slice(&json)?),
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(Stored::default()),
        Err(error) => Err(error),
    }
}

/// Counts a request under its route as it comes in: before its response.
pub(crate) async fn count(
    State(counts): State<Counts>,
    route: MatchedPath,
    request: Request,
    next: Next,
) -> Response {
    counts.record(route.as_str(), 1);
    next.run(request).await
}

/// `GET /api/counts` → `{"/api/greetings": 2}`: what has landed, up to a
/// flush interval behind the requests.
pub(crate) async fn show(State(file): State<CountsFile>) -> Result<Json<Totals>, StatusCode> {
    let stored = read(&file.0).map_err(|error| {
        tracing::error!(%error, "cannot read counts.json");
        StatusCode::INTERNAL_SERVER_ERROR
    })?;
    Ok(Json(stored.counts))
}

#[cfg(test)]
mod tests {
    use super::*;

    // The component may hand the sink one batch twice (a commit whose
    // answer was lost, a spill file two processes replay at once): its id
    // makes it land once.
    #[tokio::test]
    async fn a_batch_handed_twice_lands_once() {
        let dir = tempfile::tempdir().expect("a directory");
        let config = lameduck_writebehind::Config::new("counts", dir.path());
        let counts = Counts::open(config).expect("open");
        counts.record("/a", 1);
        counts.record("/a", 1);
        counts.spill_now().expect("spilled");
        let spill = fs::read_dir(dir.path())
            .expect("list")
            .map(|entry| entry.expect("an entry").path())
            .find(|path| path.extension().is_some_and(|ext| ext == "spill"))
            .expect("a spill file");
        let batch = fs::read(&spill).expect("read");
        let file = CountsFile(dir.path().to_owned());
        assert_eq!(counts.replay(&file).await.expect("replay").batches, 1);
        fs::write(&spill, batch).expect("the same batch again");
        let again = counts.replay(&file).await.expect("replay");
        assert_eq!((again.batches, again.already_applied), (0, 1));
        assert_eq!(read(dir.path()).expect("read").counts["/a"], 2);
    }
}
