//! When a connection is told to close before the drain: its moment in the
//! lame duck's spread and its age limit, each drawn once per connection
//! from the server's seed and the connection's number.
//!
//! A draw is a pure function of `(seed, connection, what)`, so a test that
//! knows the seed and the order it opened its connections in knows when
//! each will be told, to the millisecond, without statistics.

use std::hash::{BuildHasher, RandomState};
use std::time::Duration;

use crate::config::{DrainSpread, ServeConfig, SETTLE};

/// What a draw decides.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Draw {
    /// The fraction of the lame-duck period after which the connection is
    /// told to close ([`DrainSpread::Gradual`]).
    Spread = 0,
    /// Where its age limit falls in the jitter band: 0 at its low end, 1 at
    /// its high end.
    Age = 1,
}

/// The uniform number in `[0, 1)` that `what` draws for the server's
/// `connection`th connection (counted from 0 in accept order) under `seed`.
///
/// SplitMix64 over the three: every bit of the input moves half of the
/// output's, which is all a spread needs, and it needs no state to share
/// between connections.
pub fn draw(seed: u64, connection: u64, what: Draw) -> f64 {
    const GAMMA: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut z = seed
        .wrapping_add(GAMMA.wrapping_mul(connection.wrapping_mul(2).wrapping_add(what as u64 + 1)));
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    // The top 53 bits, as many as an f64 holds exactly.
    #[allow(clippy::cast_precision_loss)]
    let fraction = (z >> 11) as f64 / (1u64 << 53) as f64;
    fraction
}

/// When in a lame duck of `lame_duck` the connection that drew `fraction`
/// ([`Draw::Spread`]) is told to close, counted from the signal.
///
/// The moments are spread evenly over the lame duck but its end: the last
/// [`SETTLE`] of it (or its second half, if shorter) is left to every
/// connection told, so that its client's next request — answered with
/// `Connection: close` — comes before the drain closes what is left.
pub fn spread_moment(fraction: f64, lame_duck: Duration) -> Duration {
    let tail = (lame_duck / 2).min(SETTLE);
    (lame_duck - tail).mul_f64(fraction)
}

/// A seed nobody chose: what a server uses unless told one.
pub(crate) fn random_seed() -> u64 {
    RandomState::new().hash_one(std::process::id())
}

/// One connection's draws, made when it is accepted.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Plan {
    /// When in the lame duck it is told to close, as a fraction of it;
    /// `None`: at its start (immediate drain).
    pub(crate) spread: Option<f64>,
    /// How old it may grow before it is told to close, and how long after
    /// that it may take to finish.
    pub(crate) age: Option<(Duration, Duration)>,
}

impl Plan {
    pub(crate) fn new(config: &ServeConfig, connection: u64) -> Plan {
        let seed = config.connection_seed;
        let spread = (config.drain_spread == DrainSpread::Gradual)
            .then(|| draw(seed, connection, Draw::Spread));
        let age = config.max_connection_age.map(|age| {
            let jitter = config.max_connection_age_jitter.clamp(0.0, 1.0);
            let factor = 1.0 + jitter * (2.0 * draw(seed, connection, Draw::Age) - 1.0);
            (age.mul_f64(factor), config.max_connection_age_grace)
        });
        Plan { spread, age }
    }

    /// How long after the signal the connection is told, for a lame duck
    /// of `window`.
    pub(crate) fn told_after(&self, window: Duration) -> Duration {
        self.spread
            .map_or(Duration::ZERO, |u| spread_moment(u, window))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_are_uniform_and_independent_of_each_other() {
        let n = 100_000u32;
        let mut quarters = [0u32; 4];
        let mut sum_product = 0.0;
        for connection in 0..u64::from(n) {
            let (a, b) = (
                draw(7, connection, Draw::Spread),
                draw(7, connection, Draw::Age),
            );
            assert!((0.0..1.0).contains(&a) && (0.0..1.0).contains(&b));
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let quarter = (a * 4.0) as usize;
            quarters[quarter] += 1;
            sum_product += (a - 0.5) * (b - 0.5);
        }
        // Each quarter within 2 % of n/4; the two draws uncorrelated.
        for count in quarters {
            assert!(count.abs_diff(n / 4) < n / 50, "{quarters:?}");
        }
        assert!((sum_product / f64::from(n)).abs() < 0.001);
    }

    #[test]
    fn the_same_seed_and_connection_draw_the_same_and_another_seed_not() {
        assert_eq!(draw(1, 5, Draw::Spread), draw(1, 5, Draw::Spread));
        assert_ne!(draw(1, 5, Draw::Spread), draw(2, 5, Draw::Spread));
        assert_ne!(draw(1, 5, Draw::Spread), draw(1, 6, Draw::Spread));
    }

    #[test]
    fn the_age_limit_stays_inside_its_jitter_band() {
        let config = ServeConfig {
            max_connection_age: Some(Duration::from_secs(100)),
            max_connection_age_jitter: 0.1,
            ..ServeConfig::default()
        };
        let ages: Vec<Duration> = (0..1_000)
            .map(|n| Plan::new(&config, n).age.expect("an age").0)
            .collect();
        let (min, max) = (ages.iter().min(), ages.iter().max());
        assert!(min >= Some(&Duration::from_secs(90)), "{min:?}");
        assert!(max < Some(&Duration::from_secs(110)), "{max:?}");
        // The band is used, not one end of it.
        assert!(min < Some(&Duration::from_secs(91)) && max > Some(&Duration::from_secs(109)));
    }

    #[test]
    fn the_spread_leaves_the_lame_ducks_last_second_or_half_to_the_told() {
        let s = Duration::from_secs;
        assert_eq!(spread_moment(0.5, s(10)), s(9) / 2);
        assert_eq!(spread_moment(0.5, s(1)), Duration::from_millis(250));
        assert_eq!(spread_moment(0.999, Duration::ZERO), Duration::ZERO);
    }

    #[test]
    fn an_immediate_drain_tells_every_connection_at_the_signal() {
        let config = ServeConfig {
            drain_spread: DrainSpread::Immediate,
            ..ServeConfig::default()
        };
        let plan = Plan::new(&config, 3);
        assert_eq!(plan.told_after(Duration::from_secs(5)), Duration::ZERO);
        assert_eq!(plan.age, None);
    }
}
