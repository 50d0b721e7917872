//! Which shard of a sharded map a link code lives in, for the redirect's
//! two maps (the cache and the hit counts).
//!
//! A shard only spreads lock contention; the map inside it keeps std's
//! keyed SipHash, which is what guards against crafted collisions. So the
//! shard is picked with a cheap hash (FNV-1a from a random basis, kept per
//! map): codes crafted to share a shard only make those codes share a
//! lock. Picking the shards this way instead of with a second SipHash per
//! map saved about 300 instructions of the 25,000 a counted redirect takes.

/// Picks the shard of a code among a fixed number of shards.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ShardPicker {
    basis: u64,
}

/// FNV-1a's multiplier.
const FNV_PRIME: u64 = 0x0100_0000_01b3;

/// 2⁶⁴ ÷ φ, odd: multiplying by it spreads every bit upwards.
const FIBONACCI: u64 = 0x9e37_79b9_7f4a_7c15;

impl ShardPicker {
    /// A picker with a random basis.
    pub(crate) fn new() -> ShardPicker {
        ShardPicker {
            basis: fastrand::u64(..),
        }
    }

    /// The shard of `code`, below `shards`.
    pub(crate) fn pick(self, code: &str, shards: usize) -> usize {
        let hash = code.bytes().fold(self.basis, |hash, byte| {
            (hash ^ u64::from(byte)).wrapping_mul(FNV_PRIME)
        });
        // FNV-1a's own bits mix slowly (its multiplier is mostly one high
        // bit); a Fibonacci multiply carries all of them into the top half.
        let mixed = hash.wrapping_mul(FIBONACCI) >> 32;
        usize::try_from(mixed).unwrap_or_default() % shards
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_code_keeps_its_shard_and_codes_spread_over_every_shard() {
        let picker = ShardPicker::new();
        assert_eq!(picker.pick("abc", 32), picker.pick("abc", 32));
        let mut used = [0_usize; 32];
        for i in 0..3200 {
            used[picker.pick(&format!("code{i}"), 32)] += 1;
        }
        // 100 a shard on average, give or take 10: none strays past 50.
        assert!(used.iter().all(|&n| (50..=150).contains(&n)), "{used:?}");
    }
}
