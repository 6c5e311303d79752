//! A consumer group's state and its transitions, without I/O: members join, renew, leave and
//! expire; [`GroupState::rebalance`] spreads the partitions over the live members, balanced
//! (the counts differ by at most one), sticky (a partition stays with its holder while the
//! holder is within its share) and cooperative (a partition held by someone else is first
//! marked [`Holder::Revoking`], and only its holder's release makes it [`Holder::Free`] for the
//! next member: two members never hold one partition).

use serde::{Deserialize, Serialize};

/// Most members one group holds; one more join is refused with [`GroupFull`].
pub const GROUP_MEMBERS_MAX: usize = 256;
/// Shortest session timeout a member may ask for, milliseconds.
pub const SESSION_TIMEOUT_MS_MIN: u64 = 1_000;
/// Longest session timeout a member may ask for, milliseconds.
pub const SESSION_TIMEOUT_MS_MAX: u64 = 300_000;
/// The session timeout of a member that names none, milliseconds.
pub const SESSION_TIMEOUT_MS_DEFAULT: u64 = 10_000;

/// One member of a group: one session of a named member, hosted by one node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    /// The member's name, chosen by the client (several sessions may share it over time).
    pub name: String,
    /// This session's identifier, unique in the group's life.
    pub session: String,
    /// The node hosting the session (its stream), as that node names itself.
    pub node: String,
    /// The session timeout, milliseconds.
    pub timeout_ms: u64,
    /// Renewals so far: a member whose count stops moving for longer than its timeout is
    /// expired by whichever node sees it.
    pub beat: u64,
    /// The session is ending: it keeps its partitions only until it releases them.
    pub leaving: bool,
}

/// Who holds one partition of a group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Holder {
    /// Nobody: the next rebalance gives it to a live member.
    Free,
    /// Delivered to `session`, given to it at `generation`.
    Held {
        /// The holding session.
        session: String,
        /// The generation it was given at.
        generation: u64,
    },
    /// Still delivered to `session`, which is asked to give it up.
    Revoking {
        /// The holding session.
        session: String,
        /// The generation it was given at.
        generation: u64,
    },
}

impl Holder {
    /// The session holding the partition, whether or not it is asked to give it up.
    #[must_use]
    pub fn session(&self) -> Option<&str> {
        match self {
            Holder::Free => None,
            Holder::Held { session, .. } | Holder::Revoking { session, .. } => Some(session),
        }
    }
}

/// A join refused because the group has [`GROUP_MEMBERS_MAX`] members.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the group has {GROUP_MEMBERS_MAX} members, its most: retry when one has left")]
pub struct GroupFull;

/// A group: its generation, members and the holder of each partition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupState {
    /// Rises at every change of membership or assignment.
    pub generation: u64,
    /// Members in the order they joined.
    pub members: Vec<Member>,
    /// One holder per partition, partition `i` at index `i`.
    pub holders: Vec<Holder>,
}

impl GroupState {
    /// A group without members over `partitions` partitions.
    #[must_use]
    pub fn new(partitions: u32) -> GroupState {
        GroupState {
            generation: 0,
            members: Vec::new(),
            holders: vec![Holder::Free; partitions as usize],
        }
    }

    /// The member with session `session`.
    #[must_use]
    pub fn member(&self, session: &str) -> Option<&Member> {
        self.members.iter().find(|m| m.session == session)
    }

    /// Partitions `session` holds (given or being revoked), in order.
    #[must_use]
    pub fn held_by(&self, session: &str) -> Vec<u32> {
        self.holders
            .iter()
            .enumerate()
            .filter(|(_, h)| h.session() == Some(session))
            .map(|(p, _)| p as u32)
            .collect()
    }

    /// Adds a session; any earlier session of the same member name is asked to leave (it
    /// keeps its partitions until it releases them or expires).
    ///
    /// # Errors
    ///
    /// [`GroupFull`] when the group has [`GROUP_MEMBERS_MAX`] members that are not leaving.
    pub fn join(&mut self, member: Member) -> Result<(), GroupFull> {
        let staying = self.members.iter().filter(|m| !m.leaving).count();
        if staying >= GROUP_MEMBERS_MAX {
            return Err(GroupFull);
        }
        for m in &mut self.members {
            if m.name == member.name {
                m.leaving = true;
            }
        }
        self.members.push(member);
        self.generation += 1;
        Ok(())
    }

    /// Counts a renewal of `session`; `false` when it is no member (it expired or left).
    pub fn renew(&mut self, session: &str) -> bool {
        match self.members.iter_mut().find(|m| m.session == session) {
            Some(m) => {
                m.beat += 1;
                true
            }
            None => false,
        }
    }

    /// Marks `session` as leaving; `false` when it is no member.
    pub fn leave(&mut self, session: &str) -> bool {
        match self.members.iter_mut().find(|m| m.session == session) {
            Some(m) => {
                m.leaving = true;
                true
            }
            None => false,
        }
    }

    /// Removes `session` and frees what it held: for a session whose host stopped delivering
    /// to it (it left, its stream ended) or that expired. `false` when it was no member.
    pub fn remove(&mut self, session: &str) -> bool {
        let before = self.members.len();
        self.members.retain(|m| m.session != session);
        for h in &mut self.holders {
            if h.session() == Some(session) {
                *h = Holder::Free;
            }
        }
        let removed = self.members.len() != before;
        if removed {
            self.generation += 1;
        }
        removed
    }

    /// Frees partition `p` that `session` was asked to give up; `false` when it was not
    /// revoking it.
    pub fn release(&mut self, session: &str, p: u32) -> bool {
        match self.holders.get_mut(p as usize) {
            Some(h @ Holder::Revoking { .. }) if h.session() == Some(session) => {
                *h = Holder::Free;
                true
            }
            _ => false,
        }
    }

    /// Moves the assignment one step towards the balanced one: partitions over a member's
    /// share (or held by a leaving member) are marked revoking; free partitions go to the
    /// live members furthest below their share. Returns whether anything changed (the
    /// generation then rises).
    pub fn rebalance(&mut self) -> bool {
        let live: Vec<&str> = self
            .members
            .iter()
            .filter(|m| !m.leaving)
            .map(|m| m.session.as_str())
            .collect();
        let quotas = quotas(&live, &self.holders);
        let mut kept: Vec<usize> = vec![0; live.len()];
        let mut changed = false;
        let index = |s: &str| live.iter().position(|l| *l == s);
        // Keep each holding within its share, in partition order; revoke the rest.
        for h in &mut self.holders {
            if let Holder::Held {
                session,
                generation,
            } = h
            {
                match index(session) {
                    Some(i) if kept[i] < quotas[i] => kept[i] += 1,
                    _ => {
                        *h = Holder::Revoking {
                            session: std::mem::take(session),
                            generation: *generation,
                        };
                        changed = true;
                    }
                }
            } else if let Holder::Revoking { session, .. } = h
                && let Some(i) = index(session)
            {
                // A revoking partition still counts against its holder until released.
                kept[i] += 1;
            }
        }
        let next_generation = self.generation + 1;
        for h in &mut self.holders {
            if *h != Holder::Free {
                continue;
            }
            let neediest = (0..live.len())
                .filter(|&i| kept[i] < quotas[i])
                .max_by_key(|&i| (quotas[i] - kept[i], std::cmp::Reverse(i)));
            let Some(i) = neediest else { break };
            kept[i] += 1;
            *h = Holder::Held {
                session: live[i].to_owned(),
                generation: next_generation,
            };
            changed = true;
        }
        if changed {
            self.generation = next_generation;
        }
        changed
    }
}

/// Each live member's share of the partitions: `n / k` or one more, the larger shares going
/// to the members holding the most now (fewest moves), ties to the earlier member.
fn quotas(live: &[&str], holders: &[Holder]) -> Vec<usize> {
    let k = live.len();
    if k == 0 {
        return Vec::new();
    }
    let n = holders.len();
    let held: Vec<usize> = live
        .iter()
        .map(|s| holders.iter().filter(|h| h.session() == Some(*s)).count())
        .collect();
    let mut order: Vec<usize> = (0..k).collect();
    order.sort_by_key(|&i| (std::cmp::Reverse(held[i]), i));
    let mut quotas = vec![n / k; k];
    for &i in order.iter().take(n % k) {
        quotas[i] += 1;
    }
    quotas
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(name: &str, session: &str) -> Member {
        Member {
            name: name.into(),
            session: session.into(),
            node: "n".into(),
            timeout_ms: SESSION_TIMEOUT_MS_DEFAULT,
            beat: 0,
            leaving: false,
        }
    }

    /// Rebalances and releases every revoking partition until nothing changes, as the
    /// members' hosts would.
    fn settle(g: &mut GroupState) {
        for _ in 0..10 {
            g.rebalance();
            let revoking: Vec<(String, u32)> = g
                .holders
                .iter()
                .enumerate()
                .filter_map(|(p, h)| match h {
                    Holder::Revoking { session, .. } => Some((session.clone(), p as u32)),
                    _ => None,
                })
                .collect();
            if revoking.is_empty() {
                return;
            }
            for (s, p) in revoking {
                assert!(g.release(&s, p));
            }
        }
        panic!("no settled assignment after 10 rounds: {g:?}");
    }

    fn counts(g: &GroupState) -> Vec<usize> {
        g.members
            .iter()
            .filter(|m| !m.leaving)
            .map(|m| g.held_by(&m.session).len())
            .collect()
    }

    #[test]
    fn partitions_spread_over_members_balanced_within_one() {
        for members in 1..=7 {
            for partitions in [1u32, 5, 16, 64] {
                let mut g = GroupState::new(partitions);
                for i in 0..members {
                    g.join(member(&format!("m{i}"), &format!("s{i}"))).unwrap();
                    settle(&mut g);
                }
                let c = counts(&g);
                let (max, min) = (c.iter().max().unwrap(), c.iter().min().unwrap());
                assert!(max - min <= 1, "{members} members, {partitions}: {c:?}");
                assert_eq!(c.iter().sum::<usize>(), partitions as usize);
            }
        }
    }

    #[test]
    fn a_join_moves_only_what_the_newcomer_needs() {
        let mut g = GroupState::new(16);
        g.join(member("a", "a1")).unwrap();
        g.join(member("b", "b1")).unwrap();
        settle(&mut g);
        let before = g.holders.clone();
        g.join(member("c", "c1")).unwrap();
        settle(&mut g);
        let moved = before
            .iter()
            .zip(&g.holders)
            .filter(|(x, y)| x.session() != y.session())
            .count();
        // c takes 5 of 16 (balanced: 6, 5, 5); nothing else moves.
        assert_eq!(moved, 5, "{:?}", g.holders);
    }

    #[test]
    fn a_partition_goes_to_a_new_member_only_after_its_holder_releases_it() {
        let mut g = GroupState::new(2);
        g.join(member("a", "a1")).unwrap();
        settle(&mut g);
        g.join(member("b", "b1")).unwrap();
        g.rebalance();
        // One of a's partitions is revoking and still a's; b holds nothing yet.
        assert!(g.held_by("b1").is_empty());
        assert_eq!(g.held_by("a1").len(), 2);
        let p = g
            .holders
            .iter()
            .position(|h| matches!(h, Holder::Revoking { .. }))
            .unwrap() as u32;
        assert!(!g.rebalance(), "nothing moves until a releases");
        assert!(g.release("a1", p));
        g.rebalance();
        assert_eq!(g.held_by("b1"), vec![p]);
    }

    #[test]
    fn a_removed_members_partitions_go_to_the_others_and_the_generation_rises() {
        let mut g = GroupState::new(6);
        for s in ["a", "b", "c"] {
            g.join(member(s, s)).unwrap();
        }
        settle(&mut g);
        let generation = g.generation;
        assert!(g.remove("b"));
        settle(&mut g);
        assert!(g.generation > generation);
        assert_eq!(counts(&g), vec![3, 3]);
        assert!(g.held_by("b").is_empty());
    }

    #[test]
    fn a_second_session_of_a_name_waits_for_the_first_to_give_up() {
        let mut g = GroupState::new(4);
        g.join(member("a", "a1")).unwrap();
        settle(&mut g);
        g.join(member("a", "a2")).unwrap();
        g.rebalance();
        assert!(g.member("a1").unwrap().leaving);
        assert!(g.held_by("a2").is_empty());
        assert_eq!(g.held_by("a1").len(), 4);
        settle(&mut g);
        assert_eq!(g.held_by("a2").len(), 4);
    }

    #[test]
    fn a_full_group_refuses_a_join() {
        let mut g = GroupState::new(1);
        for i in 0..GROUP_MEMBERS_MAX {
            g.join(member(&format!("m{i}"), &format!("s{i}"))).unwrap();
        }
        assert_eq!(g.join(member("x", "x")), Err(GroupFull));
    }
}
