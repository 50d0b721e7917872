//! A batch: the updates that leave memory together and land in the sink in
//! one call, under one id.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::fmt;
use std::hash::Hash;

/// The id a batch is applied under. The sink records it in the same
/// transaction as the batch's effect, which is what makes applying the
/// batch again (after a flush whose commit went unconfirmed, from a spill
/// file, or from the journal of a killed process) a no-op.
///
/// It names the process that recorded the updates and the batch's place
/// among its batches (`<instance>-<generation>`), so the journal can
/// rebuild it after a kill without having written it anywhere.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BatchId {
    text: String,
    /// Where the instance ends in `text`.
    split: usize,
    generation: u64,
}

impl BatchId {
    pub(crate) fn new(instance: &str, generation: u64) -> BatchId {
        BatchId {
            text: format!("{instance}-{generation}"),
            split: instance.len(),
            generation,
        }
    }

    /// The id as text, at most 40 bytes: what the sink stores.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The process that recorded the batch: the id's first part.
    pub fn instance(&self) -> &str {
        &self.text[..self.split]
    }

    /// The batch's place among its process's batches: the id's second
    /// part. A process's generations grow, with gaps.
    pub fn generation(&self) -> u64 {
        self.generation
    }
}

impl fmt::Display for BatchId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// Updates that land in the sink together, each key once with its merged
/// value.
#[derive(Clone, Debug)]
pub struct Batch<K, V> {
    pub(crate) id: BatchId,
    /// The batch's place among its process's batches.
    pub(crate) generation: u64,
    /// The shards' maps as they were sealed: disjoint, never rehashed.
    pub(crate) maps: Vec<HashMap<K, V>>,
    /// How many updates were recorded into it (before merging).
    pub(crate) updates: u64,
    /// How many of those the journal could not take: kept in memory only.
    pub(crate) unjournaled: u64,
}

impl<K: Hash + Eq, V> Batch<K, V> {
    pub(crate) fn new(id: BatchId, generation: u64) -> Batch<K, V> {
        Batch {
            id,
            generation,
            maps: Vec::new(),
            updates: 0,
            unjournaled: 0,
        }
    }

    /// The id the sink records with the batch's effect.
    pub fn id(&self) -> &BatchId {
        &self.id
    }

    /// Every key with its merged value, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        self.maps.iter().flatten()
    }

    /// The merged value of `key`, if the batch has it.
    pub fn get<Q>(&self, key: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.maps.iter().find_map(|map| map.get(key))
    }

    /// How many keys the batch holds.
    pub fn len(&self) -> usize {
        self.maps.iter().map(HashMap::len).sum()
    }

    /// `true` if it holds no key.
    pub fn is_empty(&self) -> bool {
        self.maps.iter().all(HashMap::is_empty)
    }

    /// How many updates were recorded into it, before they were merged.
    pub fn updates(&self) -> u64 {
        self.updates
    }
}
