//! A bounded in-memory cache of code → `Location` header. Links never
//! change once created, so a cached redirect needs no database at all: it
//! keeps redirecting (and counting hits) while the database is away. The
//! header value is made once, when the link is cached, and shared by every
//! redirect after (a clone counts a reference; making it checked and copied
//! the URL on every redirect).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use axum::http::HeaderValue;

use super::shard::ShardPicker;

const SHARDS: usize = 32;

/// Entries per shard; past it an arbitrary entry makes room.
const SHARD_CAPACITY: usize = 4096;

type Shard = Mutex<HashMap<Box<str>, HeaderValue>>;

/// The cache. Cloning shares it.
#[derive(Clone, Debug)]
pub struct LinkCache {
    shards: Arc<[Shard]>,
    picker: ShardPicker,
}

impl Default for LinkCache {
    fn default() -> Self {
        LinkCache {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            picker: ShardPicker::new(),
        }
    }
}

impl LinkCache {
    fn shard(&self, code: &str) -> &Shard {
        &self.shards[self.picker.pick(code, SHARDS)]
    }

    /// The `Location` of `code`, if cached.
    pub fn get(&self, code: &str) -> Option<HeaderValue> {
        self.shard(code)
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(code)
            .cloned()
    }

    /// Remembers `code` → `location`.
    pub fn insert(&self, code: &str, location: HeaderValue) {
        let mut shard = self
            .shard(code)
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if shard.len() >= SHARD_CAPACITY && !shard.contains_key(code) {
            if let Some(victim) = shard.keys().next().cloned() {
                shard.remove(&victim);
            }
        }
        shard.insert(code.into(), location);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembers_and_stays_bounded() {
        let cache = LinkCache::default();
        let location = HeaderValue::from_static("https://example.com/");
        cache.insert("abc", location.clone());
        assert_eq!(cache.get("abc"), Some(location.clone()));
        assert_eq!(cache.get("xyz"), None);
        for i in 0..(SHARDS * SHARD_CAPACITY * 2) {
            cache.insert(&format!("code{i}"), location.clone());
        }
        let entries: usize = cache
            .shards
            .iter()
            .map(|s| s.lock().expect("lock").len())
            .sum();
        assert!(entries <= SHARDS * SHARD_CAPACITY);
    }
}
