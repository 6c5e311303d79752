//! What a node decides, at each step, for the sessions of a group it hosts, without I/O: the
//! server's host and the cluster simulation both run [`plan_step`], carry out its plan
//! (stop readers, remove fences, end streams), leave out of the [`Changes`] what a fence
//! that could not be removed still guards ([`Changes::keep_fenced`]), write them by
//! compare-and-swap, then claim what [`to_claim`] lists. Time is the host's own clock, in
//! milliseconds. A session leaves the group's state only once no fence names it.
//!
//! Safety of "one member holds a partition" rests on two rules. A host delivers to a session
//! only while its last renewal was sent less than the session timeout ago
//! ([`Ending::Unrenewed`]); another node expires a member only after seeing its renewal count
//! unchanged for the timeout plus [`EXPIRY_MARGIN_MS`] ([`Seen::stale`]), counted from a
//! read made after that renewal was written. Clocks may drift apart by far less than the
//! margin. And a commit lands only on a position fenced by its session.

use std::collections::HashMap;

use super::plan::{GroupState, Holder};
use crate::fence::Fence;

/// What another node waits beyond a member's timeout before it expires it, milliseconds.
pub const EXPIRY_MARGIN_MS: u64 = 500;

/// A hosted session as its host sees it at a step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hosted {
    /// The session.
    pub session: String,
    /// Its timeout, milliseconds.
    pub timeout_ms: u64,
    /// Its stream is gone (the client closed it).
    pub closed: bool,
    /// It asked to leave.
    pub leaving: bool,
    /// Milliseconds since the client's last heartbeat or commit here.
    pub quiet_ms: u64,
    /// When its last renewal that landed was sent (host clock), if one did.
    pub renewed_at: Option<u64>,
    /// The partitions it is delivering now.
    pub reading: Vec<u32>,
}

/// Why a hosted session ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// Its stream is gone.
    Gone,
    /// It asked to leave.
    Left,
    /// No heartbeat or commit for its timeout.
    Quiet,
    /// Its host could not renew it within its timeout.
    Unrenewed,
    /// The group no longer lists it (expired elsewhere, or replaced and done giving up).
    Removed,
}

/// What one step changes in the group's state.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Changes {
    /// Hosted sessions that ended (their partitions are free).
    pub ended: Vec<String>,
    /// Other nodes' members seen expired.
    pub expired: Vec<String>,
    /// Partitions hosted sessions gave up.
    pub released: Vec<(String, u32)>,
    /// Hosted sessions renewed.
    pub renew: Vec<String>,
}

impl Changes {
    /// Leaves out what depends on a fence that could not be removed (`failed`: session and
    /// partition): a session whose fence stays is not removed and a partition whose fence
    /// stays is not released, so no session that left the group can still commit. The next
    /// step tries again.
    pub fn keep_fenced(&mut self, failed: &[(String, u32)]) {
        let stays = |id: &String| failed.iter().any(|(s, _)| s == id);
        self.ended.retain(|id| !stays(id));
        self.expired.retain(|id| !stays(id));
        self.released
            .retain(|(id, p)| !failed.iter().any(|(s, q)| s == id && q == p));
    }

    /// Applies them and rebalances; whether anything changed.
    pub fn apply(&self, state: &mut GroupState) -> bool {
        let mut changed = false;
        for id in self.ended.iter().chain(&self.expired) {
            changed |= state.remove(id);
        }
        for (id, p) in &self.released {
            changed |= state.release(id, *p);
        }
        for id in &self.renew {
            changed |= state.renew(id);
        }
        changed | state.rebalance()
    }
}

/// A step's plan, carried out before [`Changes`] are written.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StepPlan {
    /// Sessions to end: stop all their readers, remove their fences on the partitions listed,
    /// send their last message.
    pub end: Vec<(String, Ending, Vec<u32>)>,
    /// Readers to stop: `(session, partition, give up)`; with `give up`, also remove the
    /// session's fence (the partition is then released by the changes). One `revoked` message
    /// per session lists its partitions.
    pub stop: Vec<(String, u32, bool)>,
    /// Other nodes' members seen expired, with the partitions whose fences to remove first.
    pub expire: Vec<(String, Vec<u32>)>,
    /// What to write.
    pub changes: Changes,
}

/// When each other member's renewal count was first seen at its value (host clock).
#[derive(Debug, Clone, Default)]
pub struct Seen(HashMap<String, (u64, u64)>);

impl Seen {
    /// Other members whose count has not moved for their timeout plus the margin.
    #[must_use]
    pub fn stale(&self, state: &GroupState, hosted: &[Hosted], now: u64) -> Vec<String> {
        state
            .members
            .iter()
            .filter(|m| !hosted.iter().any(|h| h.session == m.session))
            .filter(|m| {
                self.0.get(&m.session).is_some_and(|&(beat, at)| {
                    beat == m.beat
                        && now.saturating_sub(at) >= m.timeout_ms.saturating_add(EXPIRY_MARGIN_MS)
                })
            })
            .map(|m| m.session.clone())
            .collect()
    }

    /// Notes the renewal counts of `state` read at `now`.
    pub fn remember(&mut self, state: &GroupState, hosted: &[Hosted], now: u64) {
        self.0.retain(|s, _| state.member(s).is_some());
        for m in &state.members {
            if hosted.iter().any(|h| h.session == m.session) {
                continue;
            }
            match self.0.get(&m.session) {
                Some(&(beat, _)) if beat == m.beat => {}
                _ => {
                    self.0.insert(m.session.clone(), (m.beat, now));
                }
            }
        }
    }
}

/// Why `h` must end now, if it must.
fn ending(h: &Hosted, state: &GroupState, now: u64) -> Option<Ending> {
    if h.closed {
        return Some(Ending::Gone);
    }
    if h.leaving {
        return Some(Ending::Left);
    }
    if h.quiet_ms > h.timeout_ms {
        return Some(Ending::Quiet);
    }
    // A join that was answered is in the state, so a session missing from it was removed
    // (expired elsewhere) or lost with the database's last writes: either way it is over.
    let member = state.member(&h.session);
    if member.is_none_or(|m| m.leaving && state.held_by(&h.session).is_empty()) {
        return Some(Ending::Removed);
    }
    if h.renewed_at
        .is_some_and(|at| now.saturating_sub(at) > h.timeout_ms)
    {
        return Some(Ending::Unrenewed);
    }
    None
}

/// The plan of one step over `state` as read at `now`.
#[must_use]
pub fn plan_step(state: &GroupState, hosted: &[Hosted], seen: &Seen, now: u64) -> StepPlan {
    let mut plan = StepPlan::default();
    for h in hosted {
        if let Some(why) = ending(h, state, now) {
            plan.end
                .push((h.session.clone(), why, state.held_by(&h.session)));
            plan.changes.ended.push(h.session.clone());
            continue;
        }
        for (p, holder) in state.holders.iter().enumerate() {
            let p = p as u32;
            let mine = holder.session() == Some(h.session.as_str());
            let revoking = mine && matches!(holder, Holder::Revoking { .. });
            if revoking {
                plan.stop.push((h.session.clone(), p, true));
                plan.changes.released.push((h.session.clone(), p));
            } else if !mine && h.reading.contains(&p) {
                plan.stop.push((h.session.clone(), p, false));
            }
        }
        let due = h
            .renewed_at
            .is_none_or(|at| now.saturating_sub(at) >= h.timeout_ms / 4);
        if due {
            plan.changes.renew.push(h.session.clone());
        }
    }
    plan.changes.expired = seen.stale(state, hosted, now);
    plan.expire = plan
        .changes
        .expired
        .iter()
        .map(|id| (id.clone(), state.held_by(id)))
        .collect();
    plan
}

/// The partitions `session` was given and does not read yet, with the fence to claim each by.
#[must_use]
pub fn to_claim(state: &GroupState, session: &str, reading: &[u32]) -> Vec<(u32, Fence)> {
    state
        .holders
        .iter()
        .enumerate()
        .filter_map(|(p, h)| match h {
            Holder::Held {
                session: s,
                generation,
            } if s == session && !reading.contains(&(p as u32)) => Some((
                p as u32,
                Fence {
                    session: s.clone(),
                    generation: *generation,
                },
            )),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::groups::plan::Member;

    fn member(session: &str, timeout_ms: u64) -> Member {
        Member {
            name: session.into(),
            session: session.into(),
            node: "n".into(),
            timeout_ms,
            beat: 0,
            leaving: false,
        }
    }

    fn hosted(session: &str, renewed_at: Option<u64>) -> Hosted {
        Hosted {
            session: session.into(),
            timeout_ms: 1_000,
            closed: false,
            leaving: false,
            quiet_ms: 0,
            renewed_at,
            reading: Vec::new(),
        }
    }

    #[test]
    fn another_nodes_member_expires_only_after_its_timeout_and_the_margin_unchanged() {
        let mut state = GroupState::new(2);
        state.join(member("far", 1_000)).unwrap();
        let mut seen = Seen::default();
        seen.remember(&state, &[], 10_000);
        assert!(
            seen.stale(&state, &[], 11_000 + EXPIRY_MARGIN_MS - 1)
                .is_empty()
        );
        assert_eq!(seen.stale(&state, &[], 11_000 + EXPIRY_MARGIN_MS), ["far"]);
        // A renewal seen meanwhile starts the count again.
        state.renew("far");
        seen.remember(&state, &[], 11_200);
        assert!(
            seen.stale(&state, &[], 12_000 + EXPIRY_MARGIN_MS)
                .is_empty()
        );
    }

    #[test]
    fn a_host_stops_delivering_before_any_other_node_may_expire_its_member() {
        // Renewed at 5 000 by its host; another node saw the renewal at 5 000 at the earliest.
        let mut state = GroupState::new(1);
        state.join(member("s", 1_000)).unwrap();
        let h = hosted("s", Some(5_000));
        let plan = plan_step(&state, std::slice::from_ref(&h), &Seen::default(), 6_001);
        assert_eq!(plan.end[0].1, Ending::Unrenewed);
        // Another node that read the renewal at 5 000 does not expire the member yet.
        let mut elsewhere = Seen::default();
        elsewhere.remember(&state, &[], 5_000);
        assert!(elsewhere.stale(&state, &[], 6_001).is_empty());
    }

    #[test]
    fn a_revoked_partition_is_stopped_unfenced_and_released_and_a_given_one_claimed() {
        let mut state = GroupState::new(2);
        state.join(member("a", 1_000)).unwrap();
        state.rebalance();
        state.join(member("b", 1_000)).unwrap();
        state.rebalance();
        let mut a = hosted("a", Some(0));
        a.reading = vec![0, 1];
        let plan = plan_step(&state, &[a], &Seen::default(), 10);
        let revoked: Vec<_> = plan.stop.iter().filter(|s| s.2).map(|s| s.1).collect();
        assert_eq!(revoked.len(), 1);
        assert_eq!(plan.changes.released, vec![("a".to_owned(), revoked[0])]);
        let mut next = state.clone();
        plan.changes.apply(&mut next);
        let claims = to_claim(&next, "b", &[]);
        assert_eq!(claims.len(), 1);
        assert_eq!(claims[0].0, revoked[0]);
        assert_eq!(claims[0].1.generation, next.generation);
    }

    #[test]
    fn a_session_missing_from_the_state_ends_even_before_its_first_renewal() {
        let state = GroupState::new(2);
        let plan = plan_step(&state, &[hosted("gone", None)], &Seen::default(), 0);
        assert_eq!(plan.end, vec![("gone".to_owned(), Ending::Removed, vec![])]);
    }

    #[test]
    fn a_closed_quiet_or_leaving_session_ends_with_its_partitions_unfenced() {
        let mut state = GroupState::new(2);
        state.join(member("a", 1_000)).unwrap();
        state.rebalance();
        for (h, why) in [
            (
                Hosted {
                    closed: true,
                    ..hosted("a", None)
                },
                Ending::Gone,
            ),
            (
                Hosted {
                    leaving: true,
                    ..hosted("a", None)
                },
                Ending::Left,
            ),
            (
                Hosted {
                    quiet_ms: 1_001,
                    ..hosted("a", None)
                },
                Ending::Quiet,
            ),
        ] {
            let plan = plan_step(&state, &[h], &Seen::default(), 0);
            assert_eq!(plan.end, vec![("a".to_owned(), why, vec![0, 1])]);
            assert_eq!(plan.changes.ended, vec!["a".to_owned()]);
        }
    }
}
