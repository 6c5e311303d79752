//! Upper bounds of the clustering columns stored per partition, for a backend that is the only
//! writer of its data (the embedded backends hold their directory's lock) and keeps the bounds
//! under its write lock: an insert-if-absent above its partition's bound needs no lookup.
//! Numbers from a sequencer make that the usual case, since every new PLog, WLog or record key
//! sorts after the keys before it; a lookup in an LSM-tree's memtable is not cheap.
//!
//! Sound as long as every write of the backend raises the bound of its partition (a bound may
//! be too high, never too low) and a bound is learned from the stored data while writes are
//! held off. Deletes leave bounds alone: what remains is still below them.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasher, RandomState};

/// Partitions whose bounds are kept, about 64 bytes each; reaching it forgets them all (a
/// bound, not a recency policy: forgotten bounds are learned again by one seek each).
pub(crate) const PARTITIONS_MAX: usize = 1 << 16;

/// Per partition: the highest clustering stored in it or written since, `None` when empty.
#[derive(Debug)]
pub(crate) struct Bounds {
    highest: HashMap<Box<[u8]>, Option<Vec<u8>>>,
    /// Hashes of partitions seen once without a bound: a bound is learned on a partition's
    /// second conditional insert, so partitions written about once each (a workload spread
    /// over more partitions than the bounds hold) cost no seek. Same capacity and policy.
    seen: HashSet<u64>,
    hasher: RandomState,
    capacity: usize,
}

impl Default for Bounds {
    fn default() -> Bounds {
        Bounds::with_capacity(PARTITIONS_MAX)
    }
}

impl Bounds {
    pub(crate) fn with_capacity(capacity: usize) -> Bounds {
        Bounds {
            highest: HashMap::new(),
            seen: HashSet::new(),
            hasher: RandomState::new(),
            capacity: capacity.max(1),
        }
    }

    /// Whether to learn the bound of `partition`, which has none: on its second visit since
    /// it was last forgotten (a false positive of the hash only learns a bound early).
    pub(crate) fn worth_learning(&mut self, partition: &[u8]) -> bool {
        let hash = self.hasher.hash_one(partition);
        if self.seen.remove(&hash) {
            return true;
        }
        if self.seen.len() >= self.capacity {
            self.seen.clear();
        }
        self.seen.insert(hash);
        false
    }

    /// Whether the bound of `partition` is known.
    pub(crate) fn knows(&self, partition: &[u8]) -> bool {
        self.highest.contains_key(partition)
    }

    /// Whether `clustering` is certainly absent from `partition`: above its known bound.
    /// `false` means "look it up".
    pub(crate) fn above(&self, partition: &[u8], clustering: &[u8]) -> bool {
        self.highest
            .get(partition)
            .is_some_and(|highest| highest.as_deref().is_none_or(|h| clustering > h))
    }

    /// Records the highest clustering stored in `partition` (`None`: it is empty), read while
    /// no write could run.
    pub(crate) fn learn(&mut self, partition: &[u8], highest: Option<&[u8]>) {
        if self.highest.len() >= self.capacity {
            self.highest.clear();
        }
        self.highest
            .insert(partition.into(), highest.map(<[u8]>::to_vec));
    }

    /// A key is (about to be) written: raises its partition's bound if known.
    pub(crate) fn wrote(&mut self, partition: &[u8], clustering: &[u8]) {
        let Some(highest) = self.highest.get_mut(partition) else {
            return;
        };
        match highest {
            Some(h) if clustering <= h.as_slice() => {}
            Some(h) => {
                h.clear();
                h.extend_from_slice(clustering);
            }
            None => *highest = Some(clustering.to_vec()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_keys_above_a_known_bound_are_certainly_absent() {
        let mut b = Bounds::default();
        assert!(
            !b.above(b"p", b"\x05"),
            "an unknown partition proves nothing"
        );
        b.learn(b"p", Some(b"\x05"));
        assert!(b.knows(b"p"));
        assert!(!b.above(b"p", b"\x05"));
        assert!(!b.above(b"p", b"\x04"));
        assert!(b.above(b"p", b"\x06"));
        assert!(b.above(b"p", b"\x05\x00"));
        b.learn(b"q", None);
        assert!(b.above(b"q", b""), "every key is above an empty partition");
    }

    #[test]
    fn writes_raise_bounds_and_never_lower_them() {
        let mut b = Bounds::default();
        b.learn(b"p", None);
        b.wrote(b"p", b"\x07");
        assert!(!b.above(b"p", b"\x07"));
        b.wrote(b"p", b"\x03");
        assert!(!b.above(b"p", b"\x07"), "a lower write kept the bound");
        assert!(b.above(b"p", b"\x08"));
        b.wrote(b"unknown", b"\x01");
        assert!(!b.knows(b"unknown"), "writes do not invent bounds");
    }

    #[test]
    fn a_bound_is_worth_learning_on_a_partitions_second_visit() {
        let mut b = Bounds::with_capacity(2);
        assert!(!b.worth_learning(b"p"));
        assert!(!b.worth_learning(b"q"));
        assert!(b.worth_learning(b"p"));
        assert!(!b.worth_learning(b"p"), "learning starts the count again");
        assert!(!b.worth_learning(b"r"), "a full set of visits forgets them");
        assert!(!b.worth_learning(b"q"));
    }

    #[test]
    fn a_full_set_forgets_everything_rather_than_growing() {
        let mut b = Bounds::with_capacity(2);
        b.learn(b"a", None);
        b.learn(b"b", None);
        b.learn(b"c", None);
        assert!(!b.knows(b"a") && !b.knows(b"b"));
        assert!(b.knows(b"c"));
    }
}
