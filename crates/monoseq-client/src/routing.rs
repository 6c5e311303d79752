//! [`View`]: which node owns which partition, as far as this client knows. Learned from
//! `/v1/info` (the partition count), `/v1/cluster` (the owners and their URLs) and 307
//! redirects; forgotten for a partition on `not_owner` and for a node on a refused
//! connection. Only a hint: any node answers any command (it forwards or redirects), so a
//! stale view costs a hop, never a wrong answer.

use std::collections::HashMap;
use std::sync::RwLock;
use std::time::{Duration, Instant};

use monoseq_wire::ClusterBody;

/// Shortest time between two refreshes of the view: many calls that fail together refresh
/// once.
pub(crate) const REFRESH_INTERVAL_MIN: Duration = Duration::from_millis(100);

pub(crate) struct View {
    /// The URLs the client was given, in order.
    seeds: Vec<String>,
    /// How long a fetched view is trusted.
    max_age: Duration,
    state: RwLock<State>,
}

#[derive(Default)]
struct State {
    partitions: Option<u32>,
    /// Partition → base URL of its owner.
    owners: HashMap<u32, String>,
    /// Which seed to try first when no owner is known (advanced past a refused one).
    next_seed: usize,
    refreshed: Option<Instant>,
}

impl View {
    pub(crate) fn new(seeds: Vec<String>, max_age: Duration) -> View {
        View {
            seeds,
            max_age,
            state: RwLock::new(State::default()),
        }
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, State> {
        self.state.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, State> {
        self.state.write().unwrap_or_else(|p| p.into_inner())
    }

    /// The partition count, once learned.
    pub(crate) fn partitions(&self) -> Option<u32> {
        self.read().partitions
    }

    pub(crate) fn set_partitions(&self, partitions: u32) {
        self.write().partitions = Some(partitions).filter(|p| *p > 0);
    }

    /// The partition of workspace `ws`, when the count is known: the server's rule,
    /// [`monoseq_wire::partition_of`].
    pub(crate) fn partition_of(&self, ws: u64) -> Option<u32> {
        let partitions = self.partitions()?;
        Some(monoseq_wire::partition_of(ws, partitions))
    }

    /// Where to send a command for `partition`: its owner, else a seed.
    pub(crate) fn node_for(&self, partition: Option<u32>) -> String {
        let state = self.read();
        if let Some(owner) = partition.and_then(|p| state.owners.get(&p)) {
            return owner.clone();
        }
        self.seed(&state)
    }

    /// A node for a read (any node reads any partition).
    pub(crate) fn any_node(&self) -> String {
        self.seed(&self.read())
    }

    fn seed(&self, state: &State) -> String {
        self.seeds[state.next_seed % self.seeds.len()].clone()
    }

    /// Every node to ask for the cluster's view, seeds first, then owners learned.
    pub(crate) fn candidates(&self) -> Vec<String> {
        let state = self.read();
        let mut all: Vec<String> = (0..self.seeds.len())
            .map(|i| self.seeds[(state.next_seed + i) % self.seeds.len()].clone())
            .collect();
        for url in state.owners.values() {
            if !all.contains(url) {
                all.push(url.clone());
            }
        }
        all
    }

    /// A 307 named `owner` for `partition`.
    pub(crate) fn learn_owner(&self, partition: u32, owner: &str) {
        self.write().owners.insert(partition, owner.to_owned());
    }

    /// `not_owner` or `partition_unavailable`: the partition moved.
    pub(crate) fn forget_owner(&self, partition: u32) {
        self.write().owners.remove(&partition);
    }

    /// A refused connection: nothing is routed to `node` until a refresh names it again, and
    /// the next seed is tried first.
    pub(crate) fn forget_node(&self, node: &str) {
        let mut state = self.write();
        state.owners.retain(|_, url| url != node);
        if self.seeds[state.next_seed % self.seeds.len()] == node {
            state.next_seed = (state.next_seed + 1) % self.seeds.len();
        }
    }

    /// Whether the owners are to be asked for before the next command: never fetched (the
    /// partition count alone, as `Client::info` learns it, names no owner), or older than
    /// the view's maximum age.
    pub(crate) fn stale(&self, now: Instant) -> bool {
        let state = self.read();
        state.partitions.is_none()
            || state
                .refreshed
                .is_none_or(|at| now.duration_since(at) >= self.max_age)
    }

    /// Claims a refresh when one is allowed now (at most one per [`REFRESH_INTERVAL_MIN`]);
    /// otherwise answers the instant the next one is allowed.
    pub(crate) fn claim_refresh(&self, now: Instant) -> Result<(), Instant> {
        let mut state = self.write();
        if let Some(at) = state.refreshed {
            let allowed = at + REFRESH_INTERVAL_MIN;
            if now < allowed {
                return Err(allowed);
            }
        }
        state.refreshed = Some(now);
        Ok(())
    }

    /// Takes the owners of a `/v1/cluster` answer. One node on embedded storage owns all.
    pub(crate) fn apply(&self, body: &ClusterBody, answered_by: &str) {
        let mut state = self.write();
        state.owners.clear();
        match body {
            ClusterBody::Single { partitions, .. } => {
                for p in partitions {
                    state.owners.insert(*p, answered_by.to_owned());
                }
            }
            ClusterBody::Clustered {
                nodes, partitions, ..
            } => {
                let urls: HashMap<&str, &str> = nodes
                    .iter()
                    .filter(|n| n.alive)
                    .map(|n| (n.node_id.as_str(), n.url.as_str()))
                    .collect();
                for p in partitions {
                    if let Some(url) = p.owner.as_deref().and_then(|o| urls.get(o)) {
                        state
                            .owners
                            .insert(p.partition, url.trim_end_matches('/').to_owned());
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use monoseq_wire::{ClusterNodeBody, ClusterPartitionBody};

    fn view() -> View {
        View::new(
            vec!["http://a".into(), "http://b".into()],
            Duration::from_secs(5),
        )
    }

    #[test]
    fn a_command_goes_to_its_partition_s_owner_once_known() {
        let v = view();
        assert_eq!(v.partition_of(9), None);
        v.set_partitions(4);
        assert_eq!(v.partition_of(9), Some(1));
        assert_eq!(v.node_for(Some(1)), "http://a");
        v.apply(
            &ClusterBody::Clustered {
                clustered: true,
                node_id: "n1".into(),
                lease_ms: 1,
                renew_ms: 1,
                nodes: vec![ClusterNodeBody {
                    node_id: "n2".into(),
                    url: "http://b/".into(),
                    alive: true,
                    partitions: vec![1],
                    ..ClusterNodeBody::default()
                }],
                partitions: vec![ClusterPartitionBody {
                    partition: 1,
                    epoch: 3,
                    owner: Some("n2".into()),
                    ..ClusterPartitionBody::default()
                }],
            },
            "http://a",
        );
        assert_eq!(v.node_for(Some(1)), "http://b");
        v.forget_owner(1);
        assert_eq!(v.node_for(Some(1)), "http://a");
    }

    #[test]
    fn a_refused_node_loses_its_partitions_and_its_turn() {
        let v = view();
        v.learn_owner(0, "http://a");
        v.forget_node("http://a");
        assert_eq!(v.node_for(Some(0)), "http://b");
        assert_eq!(v.candidates(), ["http://b", "http://a"]);
    }

    #[test]
    fn refreshes_are_spaced() {
        let v = view();
        let now = Instant::now();
        assert_eq!(v.claim_refresh(now), Ok(()));
        assert_eq!(v.claim_refresh(now), Err(now + REFRESH_INTERVAL_MIN));
        assert_eq!(v.claim_refresh(now + REFRESH_INTERVAL_MIN), Ok(()));
    }
}
