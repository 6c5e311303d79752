//! The balanced assignment: which live node should hold each partition, computed from one read
//! of the table by a pure function, so that every node that read the same rows reaches the
//! same answer and acts only on its own part of it.
//!
//! Quotas: `partitions / n` each, and the `partitions % n` extra ones go to the nodes that hold
//! the most now (ties by a hash of the name), so a balanced cluster keeps what it holds. A node
//! over its quota gives up the partitions it scores lowest; every partition without a live
//! holder (free, expired, held by a dead node, or given up) goes to the node with room that
//! scores it highest (rendezvous hashing), so nodes starting together prefer different
//! partitions and a move lands where the fewest later moves are needed.

use crate::table::TableStatus;

/// Which node should hold each partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assignment {
    /// The live nodes, by name.
    pub nodes: Vec<String>,
    /// Per partition, the index in `nodes` of the node that should hold it (`None` only when
    /// no node is live).
    pub target: Vec<Option<usize>>,
    /// Per partition, the index of the live node whose lease is live now.
    pub holder: Vec<Option<usize>>,
}

impl Assignment {
    /// Whether every partition is held by the node that should hold it.
    #[must_use]
    pub fn settled(&self) -> bool {
        self.target == self.holder
    }

    /// How many partitions node `i` should hold.
    #[must_use]
    pub fn quota(&self, i: usize) -> usize {
        self.target.iter().filter(|t| **t == Some(i)).count()
    }
}

/// FNV-1a of a name.
fn name_hash(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The rendezvous score of `partition` for a node whose name hashes to `node` (a splitmix64
/// finalizer of both): each node ranks the partitions in its own order.
fn score(node: u64, partition: u32) -> u64 {
    let mut z = node ^ u64::from(partition).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The assignment of `partitions` partitions to the `live` nodes (names, any order) given the
/// leases of `status` (leases of nodes not in `live` count as not held).
///
/// # Example
///
/// ```
/// use monoseq_membership::{TableStatus, assign};
///
/// let live = ["a".to_owned(), "b".to_owned(), "c".to_owned()];
/// let a = assign(&TableStatus::default(), 64, &live);
/// let quotas: Vec<usize> = (0..3).map(|i| a.quota(i)).collect();
/// assert_eq!(quotas.iter().sum::<usize>(), 64);
/// assert!(quotas.iter().all(|q| (21..=22).contains(q)), "{quotas:?}");
/// ```
#[must_use]
pub fn assign(status: &TableStatus, partitions: u32, live: &[String]) -> Assignment {
    let mut nodes: Vec<String> = live.to_vec();
    nodes.sort();
    nodes.dedup();
    let n = nodes.len();
    let count = partitions as usize;
    let mut holder: Vec<Option<usize>> = vec![None; count];
    for l in &status.leases {
        if let (Some(owner), Some(slot)) = (l.live_owner(), holder.get_mut(l.partition as usize)) {
            *slot = nodes.binary_search_by(|x| x.as_str().cmp(owner)).ok();
        }
    }
    if n == 0 {
        return Assignment {
            nodes,
            target: vec![None; count],
            holder,
        };
    }
    let hashes: Vec<u64> = nodes.iter().map(|s| name_hash(s)).collect();
    let mut held = vec![0usize; n];
    for i in holder.iter().flatten() {
        held[*i] += 1;
    }
    // The extra partitions go to the nodes holding the most now.
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by_key(|&i| (std::cmp::Reverse(held[i]), hashes[i], i));
    let mut quota = vec![count / n; n];
    for &i in order.iter().take(count % n) {
        quota[i] += 1;
    }
    let mut target = holder.clone();
    // Over quota: give up the partitions scored lowest.
    for i in 0..n {
        if held[i] > quota[i] {
            let mut mine: Vec<usize> = (0..count).filter(|&p| target[p] == Some(i)).collect();
            mine.sort_by_key(|&p| (score(hashes[i], p as u32), p));
            for &p in mine.iter().take(held[i] - quota[i]) {
                target[p] = None;
            }
        }
    }
    let mut room: Vec<usize> = (0..n).map(|i| quota[i] - held[i].min(quota[i])).collect();
    for (p, slot) in target.iter_mut().enumerate() {
        if slot.is_some() {
            continue;
        }
        let best = (0..n)
            .filter(|&i| room[i] > 0)
            .max_by_key(|&i| (score(hashes[i], p as u32), std::cmp::Reverse(i)));
        if let Some(i) = best {
            *slot = Some(i);
            room[i] -= 1;
        }
    }
    Assignment {
        nodes,
        target,
        holder,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::LeaseRow;

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("node-{i}")).collect()
    }

    fn held_by(a: &Assignment) -> TableStatus {
        TableStatus {
            leases: a
                .target
                .iter()
                .enumerate()
                .map(|(p, t)| LeaseRow {
                    partition: p as u32,
                    epoch: 1,
                    node_id: t.map(|i| a.nodes[i].clone()),
                    expires_in_ms: 1_000,
                })
                .collect(),
            nodes: Vec::new(),
        }
    }

    #[test]
    fn every_node_gets_its_fair_share_within_one() {
        for n in 1..8 {
            for partitions in [1u32, 7, 64, 256] {
                let a = assign(&TableStatus::default(), partitions, &names(n));
                let quotas: Vec<usize> = (0..n).map(|i| a.quota(i)).collect();
                let (lo, hi) = (partitions as usize / n, (partitions as usize).div_ceil(n));
                assert!(quotas.iter().all(|q| (lo..=hi).contains(q)), "{quotas:?}");
                assert_eq!(quotas.iter().sum::<usize>(), partitions as usize);
            }
        }
    }

    #[test]
    fn a_balanced_cluster_keeps_what_it_holds() {
        let live = names(3);
        let first = assign(&TableStatus::default(), 64, &live);
        let again = assign(&held_by(&first), 64, &live);
        assert!(again.settled(), "no move once balanced");
        assert_eq!(again.target, first.target);
    }

    #[test]
    fn a_joining_node_takes_only_what_the_others_have_over_their_quota() {
        let first = assign(&TableStatus::default(), 64, &names(3));
        let joined = assign(&held_by(&first), 64, &names(4));
        let moved = (0..64)
            .filter(|&p| joined.target[p] != joined.holder[p])
            .count();
        assert_eq!(moved, 16, "exactly the new node's share moves");
        let newcomer = joined.nodes.iter().position(|n| n == "node-3");
        assert_eq!(joined.quota(newcomer.unwrap_or(9)), 16);
    }

    #[test]
    fn nodes_starting_together_prefer_different_partitions() {
        let a = assign(&TableStatus::default(), 64, &names(3));
        // Every node's partitions spread over the range rather than in one block.
        for i in 0..3 {
            let mine: Vec<usize> = (0..64).filter(|&p| a.target[p] == Some(i)).collect();
            assert!(
                mine.first() < Some(&16) && mine.last() > Some(&48),
                "{mine:?}"
            );
        }
    }
}
