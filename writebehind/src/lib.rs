#![doc = include_str!("../README.md")]

mod batch;
mod config;
mod disk;
mod files;
mod frame;
mod journal;
mod merge;
mod metrics;
mod replay;
mod run;
mod sink;
mod state;

pub use batch::{Batch, BatchId};
pub use config::{Config, Durability, FLUSHER_STOP_BUDGET, SPILL_RESERVE};
pub use merge::{Append, Last, Max, Merge, Sum};
pub use replay::{ReplayError, Replayed, STALE_TEMPORARY};
pub use sink::{Applied, Sink};
pub use state::{FinalFlush, OpenError, SpillFailed, WriteBehind};

use std::fmt::Debug;
use std::hash::Hash;
use std::sync::{Mutex, MutexGuard, PoisonError};

use serde::de::DeserializeOwned;
use serde::Serialize;

/// What can key the state: hashed in memory, serialized into the journal
/// and spill files (with `serde`, as `postcard` writes it).
pub trait Key:
    Hash + Eq + Clone + Debug + Serialize + DeserializeOwned + Send + Sync + 'static
{
}

impl<T> Key for T where
    T: Hash + Eq + Clone + Debug + Serialize + DeserializeOwned + Send + Sync + 'static
{
}

/// What an update (and a merged value) can be.
pub trait Value: Clone + Debug + Serialize + DeserializeOwned + Send + Sync + 'static {}

impl<T> Value for T where T: Clone + Debug + Serialize + DeserializeOwned + Send + Sync + 'static {}

/// Locks `mutex`; a panic elsewhere while holding it leaves data that is
/// still whole (every critical section here is a few assignments).
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
