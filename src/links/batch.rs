//! A batch of hit counts: what leaves memory together and lands in the
//! database in one transaction, or in one spill file.

use std::collections::HashMap;

use rand::distr::{Alphanumeric, SampleString};
use serde::{Deserialize, Serialize};

/// Hit counts that leave memory together and land in one transaction.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Batch {
    /// Recorded by the database with the counts; makes re-applying a no-op.
    pub id: String,
    /// Hits per link code.
    pub hits: Hits,
}

/// Hits per link code, kept as the disjoint maps of the shards they were
/// counted in: sealing a batch — which a forced exit does right before it
/// spills — moves the shards' maps and never rehashes a code. Serialized
/// as one JSON object; [`Batch::as_rows`] sorts when the batch is applied.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Hits(pub(crate) Vec<HashMap<String, u64>>);

impl Hits {
    /// The hits of `code`, if it has any.
    pub fn get(&self, code: &str) -> Option<u64> {
        self.0.iter().find_map(|map| map.get(code)).copied()
    }

    /// Every code with its hits, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (&String, &u64)> {
        self.0.iter().flatten()
    }

    /// `true` if no code has a hit.
    pub fn is_empty(&self) -> bool {
        self.0.iter().all(HashMap::is_empty)
    }
}

impl From<HashMap<String, u64>> for Hits {
    fn from(map: HashMap<String, u64>) -> Hits {
        Hits(vec![map])
    }
}

impl Serialize for Hits {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(self.iter())
    }
}

impl<'de> Deserialize<'de> for Hits {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Hits, D::Error> {
        HashMap::deserialize(deserializer).map(Hits::from)
    }
}

/// A fresh batch id.
pub(crate) fn new_batch_id() -> String {
    Alphanumeric.sample_string(&mut rand::rng(), 20)
}

impl Batch {
    /// The hits in the batch.
    pub fn total(&self) -> u64 {
        self.hits.iter().map(|(_, n)| n).sum()
    }

    /// The rows to apply, one per code, in no particular order
    /// ([`Storage::apply_hits`](crate::storage::Storage::apply_hits) locks
    /// the links in its own order).
    pub fn as_rows(&self) -> Vec<(String, u64)> {
        self.hits
            .iter()
            .map(|(code, n)| (code.clone(), *n))
            .collect()
    }
}
