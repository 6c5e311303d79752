//! Consumer groups in the event store: each group's state ([`GroupState`]: generation,
//! members, the holder of each partition) under one key, changed only by compare-and-swap, and
//! the group's positions, which are the consumer positions under the group's name with a
//! **fence** added: the session that holds the partition and the generation it was given at.
//!
//! The fence makes a stale member's commit fail in the same compare-and-swap that would write
//! it: a member claims a partition by writing its fence into the position
//! ([`EventStore::claim_partition`]), and a commit ([`EventStore::commit_group_position`])
//! succeeds only on bytes that still name its session. A member that lost a partition (it was
//! revoked, or its session expired and another member claimed it) can never move the group's
//! position again. Plain position writes ([`EventStore::set_position`]) and deletes are
//! refused while a fence is stored ([`crate::PositionError::HeldByMember`]): nothing but the
//! holder's commits moves a held position.
//!
//! Byte layouts: `docs/format.md` (group state: version, CRC-32, JSON; fenced position:
//! version 2, CRC-32, offset, generation, session).

mod host;
mod plan;

use std::ops::{Bound, ControlFlow};

use monoseq_kv::{CasError, Key, KvError, KvStore, Order};

pub use host::{Changes, EXPIRY_MARGIN_MS, Ending, Hosted, Seen, StepPlan, plan_step, to_claim};
pub use plan::{
    GROUP_MEMBERS_MAX, GroupFull, GroupState, Holder, Member, SESSION_TIMEOUT_MS_DEFAULT,
    SESSION_TIMEOUT_MS_MAX, SESSION_TIMEOUT_MS_MIN,
};

use crate::fence::{BytesError, checked_body, decode_fenced, encode_fenced, with_header};
pub use crate::fence::{FENCED_POSITION_VERSION, Fence};
use crate::keys::{group_partition, position_clustering, position_partition};
use crate::positions::{decode_position, encode_position};
use crate::{ConsumerName, EventStore, PartitionId};

/// Format version of a stored group state.
pub const GROUP_FORMAT_VERSION: u8 = 1;
/// Compare-and-swap rounds one update tries before it reports contention.
const UPDATE_ROUNDS_MAX: usize = 64;

/// Why a group operation failed. Nothing was written, except after
/// [`KvError::OutcomeUnknown`] inside [`GroupError::Storage`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GroupError {
    /// The committing session does not hold the partition (any more).
    #[error(
        "session {session} of group {group} does not hold partition {partition} (its holder is \
         {}); nothing was written: the partition was given to another member, so stop \
         processing it and wait for your next assignment",
        holder.as_ref().map_or_else(|| "nobody".to_owned(), |f| format!("{} since generation {}", f.session, f.generation))
    )]
    StaleGeneration {
        /// The group.
        group: ConsumerName,
        /// The committing session.
        session: String,
        /// The partition.
        partition: PartitionId,
        /// Who holds it now.
        holder: Option<Fence>,
    },
    /// The commit would move the position back.
    #[error(
        "the position of group {group} on partition {partition} is {current}; a member's \
         commit of {offset} would move it back, so nothing was written"
    )]
    Backwards {
        /// The group.
        group: ConsumerName,
        /// The partition.
        partition: PartitionId,
        /// What is stored.
        current: u64,
        /// The refused offset.
        offset: u64,
    },
    /// The group is full.
    #[error(transparent)]
    Full(#[from] GroupFull),
    /// Stored bytes do not decode.
    #[error(
        "the stored state of group {group} is damaged ({reason}); restore the store from a backup or delete the group"
    )]
    Corrupt {
        /// The group.
        group: String,
        /// What is wrong.
        reason: String,
    },
    /// Other writers kept changing the same state.
    #[error("group {group} changed {UPDATE_ROUNDS_MAX} times while this update was tried; retry")]
    Contended {
        /// The group.
        group: ConsumerName,
    },
    /// A storage fault; retry.
    #[error("the groups' storage failed")]
    Storage(#[from] KvError),
}

impl From<CasError> for GroupError {
    fn from(e: CasError) -> GroupError {
        match e {
            CasError::Storage(e) => GroupError::Storage(e),
            other => GroupError::Storage(KvError::Backend {
                message: format!("a group's state cannot be written: {other}"),
                source: None,
            }),
        }
    }
}

/// A group's state as stored, with its bytes (the condition of the next swap).
#[derive(Debug, Clone)]
pub struct StoredGroup {
    /// The state.
    pub state: GroupState,
    /// Its bytes (`None`: nothing stored yet).
    pub bytes: Option<Vec<u8>>,
}

fn encode_group(state: &GroupState) -> Vec<u8> {
    // Serializing plain owned data to a vector cannot fail.
    let body = serde_json::to_vec(state).unwrap_or_default();
    with_header(GROUP_FORMAT_VERSION, &body)
}

fn decode_group(bytes: &[u8]) -> Result<GroupState, BytesError> {
    let body = checked_body(bytes, GROUP_FORMAT_VERSION)?;
    serde_json::from_slice(body).map_err(|e| BytesError::Json(e.to_string()))
}

/// The offset and fence (if any) of any stored position's bytes.
pub(crate) fn decode_any(bytes: &[u8]) -> Result<(u64, Option<Fence>), BytesError> {
    match bytes.first() {
        Some(&FENCED_POSITION_VERSION) => decode_fenced(bytes).map(|(o, f)| (o, Some(f))),
        _ => decode_position(bytes).map(|o| (o, None)),
    }
}

impl<S: KvStore> EventStore<S> {
    /// The state of group `group`, `None` when it has never been written.
    ///
    /// # Errors
    ///
    /// [`GroupError::Corrupt`] for damaged bytes, [`GroupError::Storage`] on a fault.
    pub fn group(&self, group: &ConsumerName) -> Result<Option<StoredGroup>, GroupError> {
        let part = group_partition(self.app());
        let Some(bytes) = self
            .kv()
            .get(Key::new(part.as_bytes(), group.as_str().as_bytes()))?
        else {
            return Ok(None);
        };
        let state = decode_group(&bytes).map_err(|reason| GroupError::Corrupt {
            group: group.to_string(),
            reason: reason.to_string(),
        })?;
        Ok(Some(StoredGroup {
            state,
            bytes: Some(bytes),
        }))
    }

    /// Applies `change` to the group's state (a new group over `partitions` partitions when
    /// none is stored) and stores the result by compare-and-swap, reading again and applying
    /// again when another writer came first. `change` returns whether it changed anything;
    /// nothing is written when it did not. Returns the state now stored.
    ///
    /// # Errors
    ///
    /// What `change` returns, [`GroupError::Contended`] after `UPDATE_ROUNDS_MAX` lost
    /// rounds, or a read's error.
    pub fn update_group<F>(
        &self,
        group: &ConsumerName,
        partitions: u32,
        mut change: F,
    ) -> Result<GroupState, GroupError>
    where
        F: FnMut(&mut GroupState) -> Result<bool, GroupError>,
    {
        let part = group_partition(self.app());
        let key = Key::new(part.as_bytes(), group.as_str().as_bytes());
        let mut stored = self.group(group)?.unwrap_or_else(|| StoredGroup {
            state: GroupState::new(partitions),
            bytes: None,
        });
        for _ in 0..UPDATE_ROUNDS_MAX {
            let mut state = stored.state.clone();
            if !change(&mut state)? {
                return Ok(state);
            }
            let new = encode_group(&state);
            match self
                .kv()
                .compare_and_swap(key, stored.bytes.as_deref(), Some(&new))
            {
                Ok(()) => return Ok(state),
                Err(CasError::Mismatch { current: None }) => {
                    stored = StoredGroup {
                        state: GroupState::new(partitions),
                        bytes: None,
                    };
                }
                Err(CasError::Mismatch {
                    current: Some(bytes),
                }) => {
                    let state = decode_group(&bytes).map_err(|reason| GroupError::Corrupt {
                        group: group.to_string(),
                        reason: reason.to_string(),
                    })?;
                    stored = StoredGroup {
                        state,
                        bytes: Some(bytes),
                    };
                }
                Err(e) => return Err(e.into()),
            }
        }
        Err(GroupError::Contended {
            group: group.clone(),
        })
    }

    /// Every stored group's name, in name order, at most `max`, and whether more exist.
    ///
    /// # Errors
    ///
    /// [`GroupError::Storage`] on a fault.
    pub fn group_names(&self, max: usize) -> Result<(Vec<ConsumerName>, bool), GroupError> {
        let part = group_partition(self.app());
        let mut out = Vec::new();
        let mut more = false;
        self.kv().scan(
            part.as_bytes(),
            Bound::Unbounded,
            Bound::Unbounded,
            Order::Ascending,
            &mut |clustering, _| {
                if out.len() == max {
                    more = true;
                    return ControlFlow::Break(());
                }
                if let Some(name) = std::str::from_utf8(clustering)
                    .ok()
                    .and_then(|n| ConsumerName::new(n).ok())
                {
                    out.push(name);
                }
                ControlFlow::Continue(())
            },
        )?;
        Ok((out, more))
    }

    /// Deletes the group's state (not its positions). Returns whether one was stored.
    ///
    /// # Errors
    ///
    /// [`GroupError::Storage`] on a fault.
    pub fn delete_group(&self, group: &ConsumerName) -> Result<bool, GroupError> {
        let part = group_partition(self.app());
        let key = Key::new(part.as_bytes(), group.as_str().as_bytes());
        for _ in 0..UPDATE_ROUNDS_MAX {
            let Some(bytes) = self.kv().get(key)? else {
                return Ok(false);
            };
            match self.kv().compare_and_swap(key, Some(&bytes), None) {
                Ok(()) => return Ok(true),
                Err(CasError::Mismatch { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Err(GroupError::Contended {
            group: group.clone(),
        })
    }

    /// Writes `fence` into the group's position on `partition`, keeping its offset, and
    /// returns that offset (0 when none was stored): from now on only `fence`'s session can
    /// commit it. Called by a member's host before it delivers the partition to the member.
    ///
    /// # Errors
    ///
    /// [`GroupError::Corrupt`] for damaged position bytes, [`GroupError::Contended`], or a
    /// storage fault.
    pub fn claim_partition(
        &self,
        group: &ConsumerName,
        partition: PartitionId,
        fence: &Fence,
    ) -> Result<u64, GroupError> {
        self.swap_fenced(group, partition, |offset, stored| match stored {
            // A later generation gave the partition to someone else: this claim is stale.
            Some(f) if f.generation > fence.generation && f.session != fence.session => {
                Err(GroupError::StaleGeneration {
                    group: group.clone(),
                    session: fence.session.clone(),
                    partition,
                    holder: Some(f.clone()),
                })
            }
            Some(f) if f == fence => Ok(None),
            _ => Ok(Some(encode_fenced(offset, fence))),
        })
        .map(|(offset, _)| offset)
    }

    /// Removes `session`'s fence from the group's position on `partition` (keeping the
    /// offset): after it, `session` can no longer commit there. Nothing changes when another
    /// session's fence (or none) is stored.
    ///
    /// # Errors
    ///
    /// As [`EventStore::claim_partition`].
    pub fn release_partition(
        &self,
        group: &ConsumerName,
        partition: PartitionId,
        session: &str,
    ) -> Result<(), GroupError> {
        self.swap_fenced(group, partition, |offset, fence| match fence {
            Some(f) if f.session == session => Ok(Some(encode_position(offset))),
            _ => Ok(None),
        })
        .map(|_| ())
    }

    /// A member's commit: stores `offset` as the group's position on `partition` only if the
    /// stored fence names `session`, given at `generation` or before.
    ///
    /// # Errors
    ///
    /// [`GroupError::StaleGeneration`] when another session (or none) holds the partition, or
    /// it was given at a later generation than the member knows,
    /// [`GroupError::Backwards`] for an offset below the stored one; nothing is written.
    pub fn commit_group_position(
        &self,
        group: &ConsumerName,
        partition: PartitionId,
        session: &str,
        generation: u64,
        offset: u64,
    ) -> Result<(), GroupError> {
        self.swap_fenced(group, partition, |current, fence| match fence {
            Some(f) if f.session == session && f.generation <= generation => {
                if offset < current {
                    return Err(GroupError::Backwards {
                        group: group.clone(),
                        partition,
                        current,
                        offset,
                    });
                }
                Ok((offset != current).then(|| encode_fenced(offset, f)))
            }
            holder => Err(GroupError::StaleGeneration {
                group: group.clone(),
                session: session.to_owned(),
                partition,
                holder: holder.cloned(),
            }),
        })
        .map(|_| ())
    }

    /// The group's position on `partition` with its fence.
    ///
    /// # Errors
    ///
    /// As [`EventStore::claim_partition`].
    pub fn group_position(
        &self,
        group: &ConsumerName,
        partition: PartitionId,
    ) -> Result<(u64, Option<Fence>), GroupError> {
        let part = position_partition(self.app());
        let clustering = position_clustering(group.as_str(), partition);
        match self.kv().get(Key::new(part.as_bytes(), &clustering))? {
            None => Ok((0, None)),
            Some(bytes) => decode_any(&bytes).map_err(|reason| GroupError::Corrupt {
                group: group.to_string(),
                reason: format!("position on partition {partition}: {reason}"),
            }),
        }
    }

    /// One read-decide-swap round trip on a group position, repeated while others write
    /// between: `decide` gets the stored offset and fence and returns the new bytes (`None`:
    /// leave them). Returns the offset and fence it decided on.
    fn swap_fenced<F>(
        &self,
        group: &ConsumerName,
        partition: PartitionId,
        mut decide: F,
    ) -> Result<(u64, Option<Fence>), GroupError>
    where
        F: FnMut(u64, Option<&Fence>) -> Result<Option<Vec<u8>>, GroupError>,
    {
        let part = position_partition(self.app());
        let clustering = position_clustering(group.as_str(), partition);
        let key = Key::new(part.as_bytes(), &clustering);
        let mut stored = self.kv().get(key)?;
        for _ in 0..UPDATE_ROUNDS_MAX {
            let (offset, fence) = match &stored {
                None => (0, None),
                Some(bytes) => decode_any(bytes).map_err(|reason| GroupError::Corrupt {
                    group: group.to_string(),
                    reason: format!("position on partition {partition}: {reason}"),
                })?,
            };
            let Some(new) = decide(offset, fence.as_ref())? else {
                return Ok((offset, fence));
            };
            match self
                .kv()
                .compare_and_swap(key, stored.as_deref(), Some(&new))
            {
                Ok(()) => return Ok((offset, fence)),
                Err(CasError::Mismatch { current }) => stored = current,
                Err(e) => return Err(e.into()),
            }
        }
        Err(GroupError::Contended {
            group: group.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use monoseq_kv::MemoryStore;

    use super::*;
    use crate::{AppId, PositionError, SetPosition, TrustLevel};

    fn store() -> EventStore<MemoryStore> {
        EventStore::new(MemoryStore::new(), AppId(1), TrustLevel::Level0)
    }

    fn fence(session: &str, generation: u64) -> Fence {
        Fence {
            session: session.into(),
            generation,
        }
    }

    #[test]
    fn a_commit_from_a_session_that_lost_its_partition_is_refused() {
        let s = store();
        let g = ConsumerName::new("g").unwrap();
        let p = PartitionId(3);
        assert_eq!(s.claim_partition(&g, p, &fence("a", 1)).unwrap(), 0);
        s.commit_group_position(&g, p, "a", 9, 10).unwrap();
        // b is given the partition and claims it: a's next commit fails, whatever it says.
        assert_eq!(s.claim_partition(&g, p, &fence("b", 2)).unwrap(), 10);
        let stale = s.commit_group_position(&g, p, "a", 9, 20);
        assert!(
            matches!(&stale, Err(GroupError::StaleGeneration { holder: Some(f), .. }) if f.session == "b"),
            "{stale:?}"
        );
        s.commit_group_position(&g, p, "b", 9, 15).unwrap();
        // A claim of an earlier generation than the stored fence's changes nothing.
        assert!(matches!(
            s.claim_partition(&g, p, &fence("a", 1)),
            Err(GroupError::StaleGeneration { .. })
        ));
        assert!(matches!(
            s.commit_group_position(&g, p, "b", 1, 16),
            Err(GroupError::StaleGeneration { .. })
        ));
        assert_eq!(s.position(&g, p).unwrap(), Some(15));
    }

    #[test]
    fn a_released_partition_takes_no_commit_from_its_former_holder() {
        let s = store();
        let g = ConsumerName::new("g").unwrap();
        let p = PartitionId(0);
        s.claim_partition(&g, p, &fence("a", 1)).unwrap();
        s.commit_group_position(&g, p, "a", 9, 4).unwrap();
        s.release_partition(&g, p, "a").unwrap();
        assert!(matches!(
            s.commit_group_position(&g, p, "a", 9, 5),
            Err(GroupError::StaleGeneration { holder: None, .. })
        ));
        assert_eq!(s.group_position(&g, p).unwrap(), (4, None));
    }

    #[test]
    fn a_plain_position_write_or_delete_is_refused_while_a_member_holds_the_partition() {
        let s = store();
        let g = ConsumerName::new("g").unwrap();
        let p = PartitionId(1);
        let plain = |offset, expected| SetPosition {
            offset,
            expected,
            force: true,
        };
        s.claim_partition(&g, p, &fence("a", 7)).unwrap();
        s.commit_group_position(&g, p, "a", 9, 5).unwrap();
        for expected in [Some(5), None, Some(4)] {
            let refused = s.set_position(&g, p, plain(2, expected));
            assert!(
                matches!(&refused, Err(PositionError::HeldByMember { session, generation: 7, .. }) if session == "a"),
                "{refused:?}"
            );
        }
        assert!(matches!(
            s.delete_positions(&g),
            Err(PositionError::HeldByMember { .. })
        ));
        assert_eq!(s.group_position(&g, p).unwrap(), (5, Some(fence("a", 7))));
        s.commit_group_position(&g, p, "a", 9, 6).unwrap();
        // Once the member gave the partition up, an operator may set the position again.
        s.release_partition(&g, p, "a").unwrap();
        s.set_position(&g, p, plain(2, Some(6))).unwrap();
        assert_eq!(s.group_position(&g, p).unwrap(), (2, None));
        assert_eq!(s.delete_positions(&g).unwrap(), vec![(p, Some(2))]);
    }

    #[test]
    fn a_member_commit_never_moves_the_position_back() {
        let s = store();
        let g = ConsumerName::new("g").unwrap();
        let p = PartitionId(0);
        s.claim_partition(&g, p, &fence("a", 1)).unwrap();
        s.commit_group_position(&g, p, "a", 9, 9).unwrap();
        assert!(matches!(
            s.commit_group_position(&g, p, "a", 9, 8),
            Err(GroupError::Backwards { current: 9, .. })
        ));
    }

    #[test]
    fn group_states_are_swapped_and_listed() {
        let s = store();
        let g = ConsumerName::new("fleet").unwrap();
        let state = s
            .update_group(&g, 4, |st| {
                st.join(Member {
                    name: "m".into(),
                    session: "m-1".into(),
                    node: "n".into(),
                    timeout_ms: SESSION_TIMEOUT_MS_DEFAULT,
                    beat: 0,
                    leaving: false,
                })?;
                st.rebalance();
                Ok(true)
            })
            .unwrap();
        assert_eq!(state.held_by("m-1"), vec![0, 1, 2, 3]);
        assert_eq!(s.group(&g).unwrap().unwrap().state, state);
        assert_eq!(s.group_names(10).unwrap(), (vec![g.clone()], false));
        assert!(s.delete_group(&g).unwrap());
        assert!(s.group(&g).unwrap().is_none());
    }

    #[test]
    fn damaged_group_bytes_are_reported_not_misread() {
        let mut bytes = encode_group(&GroupState::new(2));
        let last = bytes.len() - 1;
        bytes[last] ^= 0x40;
        assert!(matches!(
            decode_group(&bytes),
            Err(BytesError::Checksum { .. })
        ));
        let mut fenced = encode_fenced(5, &fence("s", 1));
        fenced[crate::fence::HEADER_BYTES] ^= 1;
        assert!(matches!(
            decode_any(&fenced),
            Err(BytesError::Checksum { .. })
        ));
    }
}
