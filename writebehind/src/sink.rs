//! The user's half of the contract: where batches land.

use std::future::Future;

use crate::batch::Batch;

/// Whether a batch took effect now or had already.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Applied {
    /// The batch's effect and its id were written now.
    Now,
    /// The id was already recorded: the batch had landed (a flush whose
    /// commit went unconfirmed, a spill or a journal replayed twice), and
    /// nothing was written.
    Before,
}

/// Where batches land: a database, a file, another service.
///
/// # The contract: exactly once
/// [`Sink::apply`] writes the batch's effect **and records its id in the
/// same transaction**, and finds a batch whose id is already recorded
/// applied ([`Applied::Before`], writing nothing). The component may call
/// it twice for one batch — a commit whose answer was lost, a spill file
/// or the journal of a killed process replayed by two replicas at once —
/// and relies on that to count every update once. Ids must be remembered
/// at least as long as a spill file may wait to be replayed (days: until
/// the next start of any replica sharing the directory).
///
/// A sink that cannot keep ids gets at-least-once: a batch may be applied
/// twice after a crash.
///
/// # Order
/// One process hands one instance's batches over in generation order
/// ([`BatchId::generation`](crate::BatchId::generation)): its own flushes
/// in turn, and a replay pass the spill files oldest first, then the
/// journals. Two processes replaying one directory at the same moment may
/// hand a later batch over before an earlier one. So a sink that keeps, per
/// [`BatchId::instance`](crate::BatchId::instance), only the newest
/// generation it applied (and answers [`Applied::Before`] at or under it)
/// is exactly-once when one process at a time replays its directory; with
/// replicas sharing the directory, keep every id (a table, as a database
/// sink does).
pub trait Sink<K, V>: Send + Sync + 'static {
    /// Why a batch could not be applied: it stays pending and is retried,
    /// or spilled at exit.
    type Error: std::error::Error + Send + Sync + 'static;

    /// Applies `batch` and records [`Batch::id`] with it, atomically.
    ///
    /// # Errors
    /// Nothing was written: the component keeps the batch and tries again.
    ///
    /// # Cancel safety
    /// The future may be dropped at exit, when the final flush's budget
    /// runs out: the transaction must then either commit or roll back, as
    /// a database's does.
    fn apply(
        &self,
        batch: &Batch<K, V>,
    ) -> impl Future<Output = Result<Applied, Self::Error>> + Send;
}
