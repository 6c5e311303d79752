//! monoseq-backoff: the bounded exponential backoff every retry loop of monoseq uses. Owns the
//! arithmetic only — the delay before the next attempt, and its fully jittered variant — and
//! neither reads a clock nor sleeps, so a state machine can use it and stay simulable; the
//! caller decides how to wait.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use monoseq_backoff::Backoff;
//!
//! let backoff = Backoff::new(Duration::from_millis(20), Duration::from_secs(5));
//! assert_eq!(backoff.delay(1), Duration::from_millis(20));
//! assert_eq!(backoff.delay(3), Duration::from_millis(80));
//! assert_eq!(backoff.delay(30), Duration::from_secs(5));
//! assert!(backoff.jittered(3) < Duration::from_millis(80));
//! ```

// Library code answers errors; an `expect` states why it cannot fail.
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

/// Doublings past which the delay no longer grows (2^31 × the first delay is past any useful
/// bound, and the shift stays within `u32`).
const DOUBLINGS_MAX: u32 = 31;

/// A bounded exponential backoff: `first` after the first failure, doubling per failure, never
/// above `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    first: Duration,
    max: Duration,
}

impl Backoff {
    /// A backoff starting at `first` and capped at `max` (a `max` below `first` caps every
    /// delay at `max`).
    #[must_use]
    pub const fn new(first: Duration, max: Duration) -> Backoff {
        Backoff { first, max }
    }

    /// The delay after `failures` consecutive failures: 0 for none, then `first × 2^(failures
    /// − 1)`, at most `max`. Never decreases as `failures` grows.
    #[must_use]
    pub fn delay(&self, failures: u32) -> Duration {
        if failures == 0 {
            return Duration::ZERO;
        }
        let doublings = (failures - 1).min(DOUBLINGS_MAX);
        self.first.saturating_mul(1u32 << doublings).min(self.max)
    }

    /// A delay drawn uniformly from `[0, delay(failures))` ("full jitter"): callers that lost
    /// the same race spread out instead of colliding again. Random enough for spreading, not
    /// for anything else.
    #[must_use]
    pub fn jittered(&self, failures: u32) -> Duration {
        let bound_ns = u64::try_from(self.delay(failures).as_nanos()).unwrap_or(u64::MAX);
        Duration::from_nanos(random() % bound_ns.max(1))
    }
}

/// A random number from the standard library's per-hasher random keys, mixed with the
/// process ID so that processes started together differ.
fn random() -> u64 {
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_u64(std::process::id().into());
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_delay_doubles_from_the_first_and_stops_at_the_bound() {
        let backoff = Backoff::new(Duration::from_millis(1), Duration::from_millis(100));
        let delays: Vec<u128> = (0..10).map(|f| backoff.delay(f).as_millis()).collect();
        assert_eq!(delays, [0, 1, 2, 4, 8, 16, 32, 64, 100, 100]);
        assert_eq!(backoff.delay(u32::MAX), Duration::from_millis(100));
    }

    #[test]
    fn a_jittered_delay_stays_below_its_bound() {
        let backoff = Backoff::new(Duration::from_millis(1), Duration::from_millis(100));
        for failures in 1..40 {
            assert!(backoff.jittered(failures) < backoff.delay(failures));
        }
        assert_eq!(backoff.jittered(0), Duration::ZERO);
    }
}
