//! How two updates of one key become one: the only rule the user's code
//! gives besides its sink. Pending updates are merged as they are recorded,
//! so memory, a batch and a spill hold one value a key, whatever the
//! traffic.

use std::ops::AddAssign;

/// Merges an update into the value pending for its key.
///
/// It must be associative: updates are merged in the order they were
/// recorded within a batch, and batches are applied in order, but a replay
/// merges the journal's records of one batch afresh.
pub trait Merge<V>: Send + Sync + 'static {
    /// Folds `update` into `pending`.
    fn merge(pending: &mut V, update: V);
}

/// Adds: counters (`u64`, `i64`, `f64`, …).
#[derive(Clone, Copy, Debug, Default)]
pub struct Sum;

impl<V: AddAssign> Merge<V> for Sum {
    fn merge(pending: &mut V, update: V) {
        *pending += update;
    }
}

/// Keeps the greatest: high-water marks, last-seen timestamps.
#[derive(Clone, Copy, Debug, Default)]
pub struct Max;

impl<V: Ord> Merge<V> for Max {
    fn merge(pending: &mut V, update: V) {
        if update > *pending {
            *pending = update;
        }
    }
}

/// The last update wins: settings, statuses.
#[derive(Clone, Copy, Debug, Default)]
pub struct Last;

impl<V> Merge<V> for Last {
    fn merge(pending: &mut V, update: V) {
        *pending = update;
    }
}

/// Appends, in recording order: event lists, audit trails.
#[derive(Clone, Copy, Debug, Default)]
pub struct Append;

impl<T> Merge<Vec<T>> for Append {
    fn merge(pending: &mut Vec<T>, update: Vec<T>) {
        pending.extend(update);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fold<V, M: Merge<V>>(updates: impl IntoIterator<Item = V>) -> Option<V> {
        updates
            .into_iter()
            .fold(None, |pending, update| match pending {
                None => Some(update),
                Some(mut pending) => {
                    M::merge(&mut pending, update);
                    Some(pending)
                }
            })
    }

    #[test]
    fn each_rule_folds_updates_as_its_name_says() {
        assert_eq!(fold::<u64, Sum>([1, 2, 3]), Some(6));
        assert_eq!(fold::<u64, Max>([4, 9, 2]), Some(9));
        assert_eq!(fold::<&str, Last>(["a", "b", "c"]), Some("c"));
        assert_eq!(
            fold::<Vec<u8>, Append>([vec![1], vec![2, 3]]),
            Some(vec![1, 2, 3])
        );
    }
}
