//! [`NodeMachine`]: one node's decisions as one machine without I/O. It owns the
//! [`Membership`] (lease rounds, the node's name, which partitions are held) and the
//! [`Serving`] machine beside it (marks pulled, losses settled, started, stopped, drained,
//! fenced), passes each one's answers to the other in one order, and places requests by the
//! last read of the lease table ([`route`]). The caller gives the time and what came of each
//! [`NodeAction`]; it carries out the actions and nothing else. The node on tokio
//! (`monoseq serve --cluster-*`) and the simulated node are two such callers.

use crate::machine::{Action, Call, Membership, NameTaken, Phase, Reply, StopReason, View};
use crate::route::{Leases, Request, Route, route};
use crate::serving::{Retry, Serving, ServingAction, Settled};
use crate::{Config, TableStatus};

/// What the caller carries out next, in the order given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeAction {
    /// Make this lease call and hand its [`Reply`] to [`NodeMachine::reply`].
    Call(Call),
    /// Pull the marks of the other live nodes into this node's, then call
    /// [`NodeMachine::marks_pulled`]. The first action for a partition given to this node.
    PullMarks {
        /// The partition that waits for them.
        partition: u32,
        /// Its epoch.
        epoch: u64,
    },
    /// Settle the partition's accepted losses, then call [`NodeMachine::settled`].
    Settle {
        /// The partition.
        partition: u32,
        /// Its epoch (its writes are fenced with it).
        epoch: u64,
    },
    /// Start serving the partition now, every write fenced with `epoch`.
    Start {
        /// The partition.
        partition: u32,
        /// Its epoch.
        epoch: u64,
        /// Who held it last, if anyone.
        previous: Option<String>,
    },
    /// The membership stops the partition for `why`: a [`NodeAction::Stop`] follows (for the
    /// log; nothing to carry out).
    Stopping {
        /// The partition.
        partition: u32,
        /// The epoch it was served under.
        epoch: u64,
        /// Why.
        why: StopReason,
    },
    /// Stop serving the partition now: its commands are answered "not the owner" from now on.
    Stop {
        /// The partition.
        partition: u32,
    },
    /// The membership hands the partition to `to` (`None`: this node leaves): a
    /// [`NodeAction::Drain`] or, for a partition not started, [`NodeAction::Drained`] follows
    /// (for the log; nothing to carry out).
    HandingOff {
        /// The partition.
        partition: u32,
        /// Its epoch.
        epoch: u64,
        /// The node it goes to.
        to: Option<String>,
    },
    /// Stop taking commands for the partition, let it finish its queued ones and flush, and
    /// call [`NodeMachine::idle`] once it has; past `deadline` it is drained regardless.
    Drain {
        /// The partition.
        partition: u32,
        /// Its epoch.
        epoch: u64,
        /// When the drain gives up (the caller's time).
        deadline: u64,
    },
    /// The partition is no longer served here (the membership has been told): `ok` when it
    /// finished its queued commands, else whatever is left of it stops now.
    Drained {
        /// The partition.
        partition: u32,
        /// Its epoch.
        epoch: u64,
        /// It finished in time.
        ok: bool,
    },
    /// The partition is leased here but not served, for `why`, until [`NodeAction::Unhold`].
    Hold {
        /// The partition.
        partition: u32,
        /// Its epoch.
        epoch: u64,
        /// Why.
        why: String,
        /// When it is tried again, if it is.
        retry: Option<Retry>,
    },
    /// The partition is no longer held for the reason given with [`NodeAction::Hold`].
    Unhold {
        /// The partition.
        partition: u32,
    },
    /// The name is this run's now; `previous` is the stale run it took the name over from.
    Claimed {
        /// The earlier run, if one held the name.
        previous: Option<NameTaken>,
    },
    /// Refuse to start: another live run heartbeats under this name. The machine is over.
    Refuse(NameTaken),
    /// Another run claimed this node's name; every partition was stopped. The machine is over.
    Superseded,
    /// A partition's epoch went lower than one seen: never served by this run again.
    EpochWentBack {
        /// The partition.
        partition: u32,
        /// The highest epoch seen.
        seen: u64,
        /// The epoch found.
        found: u64,
    },
    /// Left the cluster: every partition was handed back. The machine is over.
    Left,
}

/// One node's membership and serving, stepped as one.
#[derive(Debug)]
pub struct NodeMachine {
    membership: Membership,
    serving: Serving,
}

impl NodeMachine {
    /// A node that has not joined yet; its first lease round is due at `now`.
    #[must_use]
    pub fn new(config: Config, now: u64) -> NodeMachine {
        NodeMachine {
            membership: Membership::new(config, now),
            serving: Serving::new(),
        }
    }

    /// The next action at `now`, if any: the serving machine's first, so that what one action
    /// of the membership asked for (a stop) is carried out before its next (the end). Call
    /// until it answers `None`, and again by [`NodeMachine::next_wake`] or after any input.
    pub fn poll(&mut self, now: u64) -> Option<NodeAction> {
        loop {
            if let Some(action) = self.serving.poll(now) {
                if let Some(action) = self.after_serving(now, action) {
                    return Some(action);
                }
                continue;
            }
            let action = self.membership.poll(now)?;
            if let Some(action) = self.after_membership(now, action) {
                return Some(action);
            }
        }
    }

    /// What the serving machine's `action` asks of the membership or the caller.
    fn after_serving(&mut self, now: u64, action: ServingAction) -> Option<NodeAction> {
        Some(match action {
            ServingAction::Fenced { partition } => {
                self.membership.fenced(now, partition);
                return None;
            }
            ServingAction::Drained {
                partition,
                epoch,
                ok,
            } => {
                self.membership.drained(now, partition, epoch, ok);
                NodeAction::Drained {
                    partition,
                    epoch,
                    ok,
                }
            }
            ServingAction::PullMarks { partition, epoch } => {
                NodeAction::PullMarks { partition, epoch }
            }
            ServingAction::Settle { partition, epoch } => NodeAction::Settle { partition, epoch },
            ServingAction::Start {
                partition,
                epoch,
                previous,
            } => NodeAction::Start {
                partition,
                epoch,
                previous,
            },
            ServingAction::Stop { partition } => NodeAction::Stop { partition },
            ServingAction::Drain {
                partition,
                epoch,
                deadline,
            } => NodeAction::Drain {
                partition,
                epoch,
                deadline,
            },
            ServingAction::Hold {
                partition,
                epoch,
                why,
                retry,
            } => NodeAction::Hold {
                partition,
                epoch,
                why,
                retry,
            },
            ServingAction::Unhold { partition } => NodeAction::Unhold { partition },
        })
    }

    /// What the membership's `action` asks of the serving machine or the caller.
    fn after_membership(&mut self, now: u64, action: Action) -> Option<NodeAction> {
        Some(match action {
            Action::Call(call) => NodeAction::Call(call),
            Action::Serve {
                partition,
                epoch,
                previous,
            } => {
                self.serving.serve(now, partition, epoch, previous);
                return None;
            }
            Action::Stop {
                partition,
                epoch,
                why,
            } => {
                self.serving.stop(now, partition);
                NodeAction::Stopping {
                    partition,
                    epoch,
                    why,
                }
            }
            Action::Drain {
                partition,
                epoch,
                to,
            } => {
                self.serving.drain(now, partition, epoch);
                NodeAction::HandingOff {
                    partition,
                    epoch,
                    to,
                }
            }
            Action::Claimed { previous } => NodeAction::Claimed { previous },
            Action::Refuse(taken) => NodeAction::Refuse(taken),
            Action::Superseded => NodeAction::Superseded,
            Action::EpochWentBack {
                partition,
                seen,
                found,
            } => NodeAction::EpochWentBack {
                partition,
                seen,
                found,
            },
            Action::Left => NodeAction::Left,
        })
    }

    /// When [`NodeMachine::poll`] next has something to do if nothing else happens.
    #[must_use]
    pub fn next_wake(&self) -> u64 {
        self.membership.next_wake().min(self.serving.next_wake())
    }

    /// The answer of a [`NodeAction::Call`].
    pub fn reply(&mut self, now: u64, reply: Reply) {
        self.membership.reply(now, reply);
    }

    /// The peers' marks were pulled for a [`NodeAction::PullMarks`].
    pub fn marks_pulled(&mut self, now: u64, partition: u32, epoch: u64) {
        self.serving.marks_pulled(now, partition, epoch);
    }

    /// What came of a [`NodeAction::Settle`].
    pub fn settled(&mut self, now: u64, partition: u32, epoch: u64, settled: Settled) {
        self.serving.settled(now, partition, epoch, settled);
    }

    /// A draining partition finished its queued commands and flushed ([`NodeAction::Drain`]).
    pub fn idle(&mut self, now: u64, partition: u32, epoch: u64) {
        self.serving.idle(now, partition, epoch);
    }

    /// The storage refused a write of `partition` under its epoch: the membership stops it.
    pub fn fenced(&mut self, now: u64, partition: u32) {
        self.serving.fenced(now, partition);
    }

    /// Leave the cluster: every partition is drained and handed back, then
    /// [`NodeAction::Left`].
    pub fn leave(&mut self, now: u64) {
        self.membership.leave(now);
    }

    /// Read the lease table soon: routing found no live owner, or one that did not answer.
    pub fn read_soon(&mut self, now: u64) {
        self.membership.read_soon(now);
    }

    /// Where a request for `partition` goes at `now`: [`route`] on the last read of the lease
    /// table, aged by this node's clock; `served_here` when this node serves the partition,
    /// `relayed` when another node relayed the request here. Before any read, no owner is
    /// known.
    #[must_use]
    pub fn route(&self, partition: u32, now: u64, served_here: bool, relayed: bool) -> Route {
        let request = Request {
            partition,
            partitions: self.membership.config().partitions(),
            served_here,
            relayed,
        };
        let unread = TableStatus::default();
        let (status, read_at) = self
            .membership
            .view()
            .map_or((&unread, 0), |v| (&v.status, v.read_at));
        let leases = Leases::Read {
            status,
            age_ms: now.saturating_sub(read_at),
            me: self.membership.config().node_id(),
        };
        route(request, leases)
    }

    /// The parameters it runs with.
    #[must_use]
    pub fn config(&self) -> &Config {
        self.membership.config()
    }

    /// Where the membership is.
    #[must_use]
    pub fn phase(&self) -> Phase {
        self.membership.phase()
    }

    /// The last read of the lease table.
    #[must_use]
    pub fn view(&self) -> Option<&View> {
        self.membership.view()
    }

    /// The partitions held, with their epochs.
    pub fn held(&self) -> impl Iterator<Item = (u32, u64)> + '_ {
        self.membership.held()
    }

    /// Whether `partition` is started here and takes commands (not draining).
    #[must_use]
    pub fn serves(&self, partition: u32) -> bool {
        self.serving.serves(partition)
    }

    /// Whether `partition` is draining here.
    #[must_use]
    pub fn draining(&self, partition: u32) -> bool {
        self.serving.draining(partition)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::route::Unplaced;
    use crate::{MemoryLeaseTable, Owner, execute};

    const PARTITIONS: u32 = 4;

    fn machine(name: &str) -> NodeMachine {
        let url = format!("http://{name}");
        let config = Config::new(name, &format!("{name}-1"), &url, PARTITIONS, 1_500, 300)
            .expect("valid parameters");
        NodeMachine::new(config, 0)
    }

    /// Steps `node` from `from` to `to` (10 ms ticks) as a shell would: lease calls answered by
    /// `table` (none when `cut`: the database is unreachable and calls go unanswered), marks
    /// pulled, losses settled and drains finished at once. Returns every action but the calls.
    fn run(
        node: &mut NodeMachine,
        table: &MemoryLeaseTable,
        (from, to): (u64, u64),
        cut: bool,
    ) -> Vec<NodeAction> {
        let mut seen = Vec::new();
        for now in (from..to).step_by(10) {
            table.set_now(now);
            while let Some(action) = node.poll(now) {
                match &action {
                    NodeAction::Call(call) if !cut => {
                        let reply = execute(call, table, node.config());
                        node.reply(now, reply);
                    }
                    NodeAction::Call(_) => {}
                    NodeAction::PullMarks { partition, epoch } => {
                        node.marks_pulled(now, *partition, *epoch);
                    }
                    NodeAction::Settle { partition, epoch } => {
                        node.settled(now, *partition, *epoch, Settled::Done);
                    }
                    NodeAction::Drain {
                        partition, epoch, ..
                    } => node.idle(now, *partition, *epoch),
                    _ => {}
                }
                if !matches!(action, NodeAction::Call(_)) {
                    seen.push(action);
                }
            }
        }
        seen
    }

    fn started(actions: &[NodeAction]) -> Vec<u32> {
        let mut out: Vec<u32> = actions
            .iter()
            .filter_map(|a| match a {
                NodeAction::Start { partition, .. } => Some(*partition),
                _ => None,
            })
            .collect();
        out.sort_unstable();
        out
    }

    #[test]
    fn a_partition_starts_only_after_its_marks_are_pulled_and_its_losses_settled() {
        let table = MemoryLeaseTable::new();
        let mut a = machine("a");
        let actions = run(&mut a, &table, (0, 2_000), false);
        assert_eq!(started(&actions), [0, 1, 2, 3], "a lone node serves all");
        for p in 0..PARTITIONS {
            let at = |want: fn(&NodeAction, u32) -> bool| {
                actions.iter().position(|x| want(x, p)).expect("present")
            };
            let pull =
                at(|x, p| matches!(x, NodeAction::PullMarks { partition, .. } if *partition == p));
            let settle =
                at(|x, p| matches!(x, NodeAction::Settle { partition, .. } if *partition == p));
            let start =
                at(|x, p| matches!(x, NodeAction::Start { partition, .. } if *partition == p));
            assert!(
                pull < settle && settle < start,
                "partition {p}: {actions:?}"
            );
            assert!(a.serves(p));
        }
    }

    #[test]
    fn a_fenced_partition_is_stopped_with_its_reason_and_the_membership_lets_it_go() {
        let table = MemoryLeaseTable::new();
        let mut a = machine("a");
        run(&mut a, &table, (0, 2_000), false);
        a.fenced(2_000, 2);
        let actions = run(&mut a, &table, (2_000, 2_010), false);
        let stopping = NodeAction::Stopping {
            partition: 2,
            epoch: 1,
            why: StopReason::Fenced,
        };
        let at = actions.iter().position(|x| *x == stopping);
        let stop = actions
            .iter()
            .position(|x| *x == NodeAction::Stop { partition: 2 });
        assert!(
            matches!((at, stop), (Some(i), Some(j)) if i < j),
            "the membership's stop reaches the serving machine, reason first: {actions:?}"
        );
        assert!(!a.serves(2));
        assert!(
            a.held().all(|(p, _)| p != 2),
            "the membership no longer holds a fenced partition"
        );
    }

    #[test]
    fn leaving_hands_every_partition_back_through_a_drain_then_ends() {
        let table = MemoryLeaseTable::new();
        let mut a = machine("a");
        run(&mut a, &table, (0, 2_000), false);
        a.leave(2_000);
        let actions = run(&mut a, &table, (2_000, 2_300), false);
        for p in 0..PARTITIONS {
            let handing = actions.iter().position(|x| {
                matches!(x, NodeAction::HandingOff { partition, to: None, .. } if *partition == p)
            });
            let drained = actions.iter().position(
                |x| matches!(x, NodeAction::Drained { partition, ok: true, .. } if *partition == p),
            );
            assert!(
                matches!((handing, drained), (Some(i), Some(j)) if i < j),
                "partition {p} is drained after its handoff: {actions:?}"
            );
        }
        assert_eq!(actions.last(), Some(&NodeAction::Left));
        for p in 0..PARTITIONS {
            let live = table.lease(p).is_some_and(|(_, _, live)| live);
            assert!(
                !live,
                "the membership heard partition {p} drained and released its lease at once"
            );
        }
    }

    #[test]
    fn a_request_goes_to_the_owner_read_lately_and_nowhere_once_its_lease_may_have_expired() {
        let table = MemoryLeaseTable::new();
        let mut b = machine("b");
        run(&mut b, &table, (0, 2_000), false);
        let mut a = machine("a");
        assert_eq!(
            a.route(0, 0, false, false),
            Route::Unavailable(Unplaced::Moving),
            "before any read no owner is known"
        );
        // a joins while b keeps its leases; both step together.
        for now in (2_000..2_400).step_by(10) {
            run(&mut b, &table, (now, now + 10), false);
            run(&mut a, &table, (now, now + 10), false);
        }
        let read_at = a.view().expect("a read the table").read_at;
        let owner = |route: Route| match route {
            Route::Relay(Owner { node_id, .. }) => Some(node_id),
            _ => None,
        };
        let b_holds: Vec<u32> = b.held().map(|(p, _)| p).collect();
        let p = *b_holds.first().expect("b still holds a partition");
        assert_eq!(
            owner(a.route(p, read_at, false, false)).as_deref(),
            Some("b")
        );
        // The database is cut off from a: its read only ages.
        run(&mut a, &table, (2_400, 2_500), true);
        assert_eq!(
            a.route(p, read_at + 10_000, false, false),
            Route::Unavailable(Unplaced::Moving),
            "a lease that may have expired since the read names no owner"
        );
        assert_eq!(
            a.route(PARTITIONS, read_at, false, false),
            Route::Unavailable(Unplaced::NoSuchPartition {
                partitions: PARTITIONS
            })
        );
    }
}
