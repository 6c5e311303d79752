//! The last read of the lease table as routing and readiness see it: where a request for a
//! partition goes ([`Route`]), which partitions a command could not be answered for now and why, and
//! the request for an early read when routing found nobody to send a command to.

use super::*;
use monoseq_membership::{Leases, Owner, Request, Route, Unplaced, route};

/// The last read of the table, with when it was sent.
#[derive(Debug, Clone)]
pub(super) struct View {
    pub(super) status: TableStatus,
    pub(super) read_at: Instant,
    pub(super) live: Vec<String>,
    /// Partition → its lease's epoch in this read, and when this node first read that epoch.
    pub(super) since: HashMap<u32, (u64, Instant)>,
}

/// When this node first read each lease's current epoch, given `before` (the last read's) and
/// the `leases` read `now`; and whether another node than `me` took a partition since.
pub(super) fn epochs_since(
    before: &HashMap<u32, (u64, Instant)>,
    leases: &[LeaseRow],
    me: &str,
    now: Instant,
) -> (HashMap<u32, (u64, Instant)>, bool) {
    let mut taken = false;
    let since = leases
        .iter()
        .map(|row| {
            let seen = match before.get(&row.partition) {
                Some(&(epoch, at)) if epoch == row.epoch => at,
                _ => {
                    taken |= row.live_owner().is_some_and(|n| n != me);
                    now
                }
            };
            (row.partition, (row.epoch, seen))
        })
        .collect();
    (since, taken)
}

impl Cluster {
    /// Where a request for partition `p` goes ([`monoseq_membership::route`] on the last read
    /// of the lease table and its age): `served_here` when this node's processor serves `p`,
    /// `relayed` when another node relayed the request here. Finding no live owner asks for a
    /// read of the table soon ([`Cluster::read_soon`]).
    #[must_use]
    pub fn route(&self, p: u32, served_here: bool, relayed: bool) -> Route {
        let view = self.view();
        let request = Request {
            partition: p,
            partitions: self.partitions,
            served_here,
            relayed,
        };
        let leases = Leases::Read {
            status: &view.status,
            age_ms: ms(view.read_at.elapsed()),
            me: &self.settings.node_id,
        };
        let route = route(request, leases);
        if route == Route::Unavailable(Unplaced::Moving) {
            self.read_soon();
        }
        route
    }

    /// Asks for a read of the lease table soon (at once, or one handoff poll after the last
    /// read): what this node last read sent a command nowhere useful (no live owner, or an
    /// owner that did not answer: a node restarted under a new address, a partition moved
    /// since). Without it the routing view waits for the next renewal's read.
    pub fn read_soon(&self) {
        self.read_soon.notify_one();
    }

    pub(super) fn view(&self) -> Arc<View> {
        Arc::clone(&self.view.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// Partitions a command could not be answered for now, with why: not served here and
    /// without a live owner this node reached lately, served here but not ready, or about to
    /// move to balance the nodes. Empty when every command can be answered or forwarded.
    #[must_use]
    pub fn unready(&self) -> Vec<(u32, String)> {
        let view = self.view();
        if view.status.leases.is_empty() {
            return (0..self.partitions)
                .map(|p| (p, "the lease table was not read yet".to_owned()))
                .collect();
        }
        let here: BTreeMap<u32, Unready> = self.cp.unready_partitions().into_iter().collect();
        let plan = assign(&view.status, self.partitions, &view.live);
        let fresh = self.settings.renew * 3 + PROBE_TIMEOUT;
        let probes = lock(&self.probes).clone();
        let mut out = Vec::new();
        for p in 0..self.partitions {
            let why = if self.cp.serves(p) {
                here.get(&p).map(|why| match why {
                    Unready::Refused { .. } => format!("{why}; {ACCEPT_LOSS_HINT}"),
                    _ => why.to_string(),
                })
            } else {
                match self.route(p, false, false) {
                    Route::Unavailable(Unplaced::Starting) => Some(
                        lock(&self.held)
                            .get(&p)
                            .cloned()
                            .unwrap_or_else(|| "leased here; starting".to_owned()),
                    ),
                    Route::Relay(Owner { node_id, url }) => {
                        let since = view.since.get(&p).map_or_else(Instant::now, |s| s.1);
                        remote_unready(p, (&node_id, &url), probes.get(&url), since, fresh)
                    }
                    Route::Unavailable(_) | Route::Local => {
                        Some("no live lease: the partition is moving between nodes".to_owned())
                    }
                }
            };
            let idx = p as usize;
            let moving = plan.target.get(idx) != plan.holder.get(idx);
            let why = why.or_else(|| {
                moving.then(|| {
                    let to = plan
                        .target
                        .get(idx)
                        .copied()
                        .flatten()
                        .and_then(|i| plan.nodes.get(i).cloned())
                        .unwrap_or_default();
                    format!("moving to {to} to balance the nodes")
                })
            });
            if let Some(why) = why {
                out.push((p, why));
            }
        }
        out
    }

    pub(super) fn set_view(&self, status: &TableStatus, read_at: Instant) {
        let alive = ms(self.settings.lease);
        let live = status
            .nodes
            .iter()
            .filter(|n| n.seen_ms_ago < alive)
            .map(|n| n.node_id.clone())
            .collect();
        let (since, taken) = epochs_since(
            &self.view().since,
            &status.leases,
            &self.settings.node_id,
            Instant::now(),
        );
        *self.view.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(View {
            status: status.clone(),
            read_at,
            live,
            since,
        });
        if taken {
            self.probe_soon.notify_one();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(partition: u32, epoch: u64, node: &str) -> LeaseRow {
        LeaseRow {
            partition,
            epoch,
            node_id: Some(node.to_owned()),
            expires_in_ms: 10_000,
        }
    }

    #[test]
    fn a_lease_keeps_when_it_was_first_read_until_its_epoch_changes() {
        let first = Instant::now();
        let later = first + Duration::from_secs(1);
        let (since, taken) = epochs_since(&HashMap::new(), &[lease(0, 1, "b")], "a", first);
        assert!(
            taken,
            "a first read of another node's lease wakes the prober"
        );
        let (kept, taken) = epochs_since(&since, &[lease(0, 1, "b")], "a", later);
        assert_eq!((kept[&0], taken), ((1, first), false));
        let (moved, taken) = epochs_since(&kept, &[lease(0, 2, "c")], "a", later);
        assert_eq!((moved[&0], taken), ((2, later), true));
        let (mine, taken) = epochs_since(&moved, &[lease(0, 3, "a")], "a", later);
        assert_eq!((mine[&0], taken), ((3, later), false));
    }
}
