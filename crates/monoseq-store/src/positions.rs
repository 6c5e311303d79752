//! Consumer positions: the PLog offset up to which a named consumer has processed a
//! partition, one entry per consumer and partition in the event store's own key-value store
//! (so every backend keeps them, and a backup holds them beside the events). A position is set
//! by compare-and-swap on the value stored, so two writers of one position never both succeed
//! on the same expected value, it never moves back unless the caller forces it, and through
//! [`EventStore::set_position_below`] it never points at or beyond the partition's end
//! (invariant 17). A consumer is listed ([`EventStore::positions_after`]) and deleted
//! ([`EventStore::delete_positions`]) whole. Owns the consumer name's rules, the positions table's key and value layout
//! (`docs/format.md`, "Consumer positions") and its errors.

use std::ops::{Bound, ControlFlow};

use monoseq_kv::{CasError, Key, KvError, KvStore, Order, Swap};

use crate::fence::BytesError;
use crate::keys::{
    CONSUMER_NAME_END, PartitionId, from_position_clustering, position_clustering,
    position_partition, position_prefix,
};
use crate::store::EventStore;

/// Longest consumer name, in bytes (each a printable ASCII character).
pub const CONSUMER_NAME_BYTES_MAX: usize = 255;
/// The format version of a stored position this build writes and reads.
pub const POSITION_FORMAT_VERSION: u8 = 1;
/// Version byte and CRC-32 before a position's body.
const POSITION_HEADER_BYTES: usize = 5;
/// Longest stored position: the header and a 10-byte varint.
const POSITION_BYTES_MAX: usize = POSITION_HEADER_BYTES + 10;
/// Characters of a refused consumer name repeated in the error.
const NAME_SHOWN_CHARS_MAX: usize = 64;
/// Scans of a consumer's positions one [`EventStore::delete_positions`] deletes, when a writer
/// keeps setting them meanwhile, before it gives up.
const DELETE_ROUNDS: usize = 3;

/// A consumer's name: 1 to [`CONSUMER_NAME_BYTES_MAX`] printable ASCII characters (space to
/// `~`), as the idempotency keys.
///
/// # Example
///
/// ```
/// use monoseq_store::ConsumerName;
///
/// assert_eq!(ConsumerName::new("orders-projector")?.as_str(), "orders-projector");
/// assert!(ConsumerName::new("").is_err());
/// assert!(ConsumerName::new("tab\there").is_err());
/// # Ok::<(), monoseq_store::InvalidConsumerName>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ConsumerName(String);

/// A consumer name that is empty, too long or not printable ASCII.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the consumer name {shown} is not valid ({why}): a consumer name is 1 to \
     {CONSUMER_NAME_BYTES_MAX} printable ASCII characters"
)]
pub struct InvalidConsumerName {
    /// The name as given, quoted and cut to a readable length.
    shown: String,
    /// What is wrong with it.
    why: &'static str,
}

impl ConsumerName {
    /// Checks `name`.
    ///
    /// # Errors
    ///
    /// [`InvalidConsumerName`] for an empty name, one over [`CONSUMER_NAME_BYTES_MAX`] bytes, or
    /// one holding anything but printable ASCII.
    pub fn new(name: &str) -> Result<ConsumerName, InvalidConsumerName> {
        let why = if name.is_empty() {
            Some("it is empty")
        } else if name.len() > CONSUMER_NAME_BYTES_MAX {
            Some("it is too long")
        } else if !name.bytes().all(|b| (0x20..0x7f).contains(&b)) {
            Some("it holds a character that is not printable ASCII")
        } else {
            None
        };
        match why {
            None => Ok(ConsumerName(name.to_owned())),
            Some(why) => Err(InvalidConsumerName {
                shown: format!(
                    "{:?}",
                    name.chars().take(NAME_SHOWN_CHARS_MAX).collect::<String>()
                ),
                why,
            }),
        }
    }

    /// The name.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for ConsumerName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// What [`EventStore::set_position`] writes, and on which condition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SetPosition {
    /// The new position: the PLog offset up to which the consumer has processed the partition
    /// (0: nothing yet).
    pub offset: u64,
    /// The position the caller read before (`None`: the consumer has no position on the
    /// partition yet). The write happens only if this is what is stored.
    pub expected: Option<u64>,
    /// Allows `offset` below `expected` (a consumer rewinding to read again).
    pub force: bool,
}

/// One stored position, as [`EventStore::all_positions`] lists them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerPosition {
    /// The consumer.
    pub consumer: ConsumerName,
    /// The partition.
    pub partition: PartitionId,
    /// The PLog offset processed.
    pub offset: u64,
}

/// Why a position was not read or set. Whatever the variant, nothing was written (except
/// after [`KvError::OutcomeUnknown`] inside [`PositionError::Storage`]: then the write may
/// have happened; read the position to tell).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PositionError {
    /// The stored position is not the one the caller expected.
    #[error(
        "the position of consumer {consumer} on partition {partition} is {}, not {} as \
         expected; nothing was written: read it and decide again",
        show(*current),
        show(*expected)
    )]
    Conflict {
        /// The consumer.
        consumer: ConsumerName,
        /// The partition.
        partition: PartitionId,
        /// What is stored (`None`: no position).
        current: Option<u64>,
        /// What the caller expected.
        expected: Option<u64>,
    },
    /// The new position is below the stored one and the caller did not force it.
    #[error(
        "the position of consumer {consumer} on partition {partition} would move back from \
         {current} to {offset}; nothing was written: positions only move forward unless the \
         request says \"force\": true"
    )]
    Backwards {
        /// The consumer.
        consumer: ConsumerName,
        /// The partition.
        partition: PartitionId,
        /// What is stored.
        current: u64,
        /// The refused new position.
        offset: u64,
    },
    /// The new position is at or beyond the partition's end: the consumer cannot have
    /// processed an event that is not written yet (invariant 17), whatever `force` says.
    #[error(
        "the position of consumer {consumer} on partition {partition} cannot be {offset}: the \
         partition's events end before offset {end} (the next one written), so a position is \
         at most {}; nothing was written: store the offset of the last event processed",
        end.saturating_sub(1)
    )]
    BeyondEnd {
        /// The consumer.
        consumer: ConsumerName,
        /// The partition.
        partition: PartitionId,
        /// The refused new position.
        offset: u64,
        /// The partition's end when it was refused: the next PLog offset to be written.
        end: u64,
    },
    /// The position is a consumer group's, and a member of the group holds the partition: it
    /// carries the member's fence (`crate::groups`), and only that member's commits move it.
    #[error(
        "the position of consumer {consumer} on partition {partition} is consumer group \
         {consumer}'s, and the group's member session {session} holds the partition (given at \
         generation {generation}); nothing was written: only that member moves the position, \
         by its commits. To set it, stop the group's members (or let their sessions end) and \
         retry"
    )]
    HeldByMember {
        /// The consumer: the group.
        consumer: ConsumerName,
        /// The partition.
        partition: PartitionId,
        /// The session holding it.
        session: String,
        /// The generation it was given at.
        generation: u64,
    },
    /// The consumer's positions were set again while they were being deleted, every time
    /// (`DELETE_ROUNDS` scans): some may be left.
    #[error(
        "the positions of consumer {consumer} kept being set while they were deleted; {left} \
         are left: stop the consumer, then delete it again"
    )]
    StillWritten {
        /// The consumer.
        consumer: ConsumerName,
        /// Positions stored after the last scan's deletes.
        left: usize,
    },
    /// A stored position does not decode.
    #[error(
        "the stored position of consumer {consumer} on partition {partition} is damaged \
         ({reason}); set it again with \"force\": true, or restore the store from a backup"
    )]
    Corrupt {
        /// The consumer (as far as its key says).
        consumer: String,
        /// The partition.
        partition: PartitionId,
        /// What is wrong.
        reason: String,
    },
    /// A storage fault; retry.
    #[error("the positions' storage failed")]
    Storage(#[from] KvError),
}

/// An offset for a message: the number, or "none".
fn show(offset: Option<u64>) -> String {
    offset.map_or_else(|| "none".to_owned(), |o| o.to_string())
}

/// The stored bytes of position `offset`: version, CRC-32 (little-endian) of the body, then
/// the body, `offset` as a varint.
pub(crate) fn encode_position(offset: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(POSITION_BYTES_MAX);
    out.push(POSITION_FORMAT_VERSION);
    out.extend_from_slice(&[0; 4]);
    let mut v = offset;
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
    let crc = crc32fast::hash(&out[POSITION_HEADER_BYTES..]);
    out[1..POSITION_HEADER_BYTES].copy_from_slice(&crc.to_le_bytes());
    out
}

/// The offset of stored position bytes, or what is wrong with them.
/// A group's fenced position (`crate::groups`) reads as its offset.
pub(crate) fn decode_position(bytes: &[u8]) -> Result<u64, BytesError> {
    if bytes.first() == Some(&crate::fence::FENCED_POSITION_VERSION) {
        return crate::fence::decode_fenced(bytes).map(|(offset, _)| offset);
    }
    let body = crate::fence::checked_body(bytes, POSITION_FORMAT_VERSION)?;
    match crate::fence::take_varint(body, "the offset")? {
        (offset, []) => Ok(offset),
        (_, rest) => Err(BytesError::Trailing(rest.len())),
    }
}

/// The refusal of a plain write (or delete) of position bytes that carry a group member's
/// fence: while a member holds the partition, only its commits move the position.
fn held_by_member(
    consumer: &ConsumerName,
    partition: PartitionId,
    bytes: &[u8],
) -> Option<PositionError> {
    let (_, fence) = crate::fence::decode_fenced(bytes).ok()?;
    Some(PositionError::HeldByMember {
        consumer: consumer.clone(),
        partition,
        session: fence.session,
        generation: fence.generation,
    })
}

impl<S: KvStore> EventStore<S> {
    /// The position of `consumer` on `partition`: the PLog offset it has processed, `None`
    /// when it never set one.
    ///
    /// # Errors
    ///
    /// [`PositionError::Corrupt`] when the stored bytes are damaged,
    /// [`PositionError::Storage`] on a storage fault.
    pub fn position(
        &self,
        consumer: &ConsumerName,
        partition: PartitionId,
    ) -> Result<Option<u64>, PositionError> {
        let part = position_partition(self.app());
        let clustering = position_clustering(consumer.as_str(), partition);
        let stored = self.kv().get(Key::new(part.as_bytes(), &clustering))?;
        stored
            .map(|bytes| decode_position(&bytes).map_err(|r| corrupt(consumer, partition, r)))
            .transpose()
    }

    /// Sets the position of `consumer` on `partition` to `set.offset` if the stored position
    /// is `set.expected` (`None`: none is stored), by compare-and-swap: of several writers
    /// expecting the same position, exactly one succeeds. Without `set.force` a position never
    /// moves back: an `offset` below `expected` is refused before anything is written.
    /// The write is durable as the store's writes are (see [`EventStore::sync`]).
    ///
    /// # Errors
    ///
    /// - [`PositionError::Conflict`] with the stored position when it is not `set.expected`.
    /// - [`PositionError::Backwards`] when `set.offset` is below the stored position and
    ///   `set.force` is false.
    /// - [`PositionError::HeldByMember`] when the position is a consumer group's and a member
    ///   holds the partition (its fence is stored): only the member's commits move it then.
    /// - [`PositionError::Corrupt`] when the stored position does not decode and `set.force`
    ///   is false (a forced write replaces damaged bytes, whatever it expected).
    /// - [`PositionError::Storage`] on a storage fault; after
    ///   [`KvError::OutcomeUnknown`] the position may have been set.
    ///
    /// # Example
    ///
    /// ```
    /// use monoseq_kv::MemoryStore;
    /// use monoseq_store::{AppId, ConsumerName, EventStore, PartitionId, PositionError,
    ///     SetPosition, TrustLevel};
    ///
    /// let store = EventStore::new(MemoryStore::new(), AppId(1), TrustLevel::Level0);
    /// let name = ConsumerName::new("projector")?;
    /// let p = PartitionId(0);
    /// store.set_position(&name, p, SetPosition { offset: 10, expected: None, force: false })?;
    /// store.set_position(&name, p, SetPosition { offset: 25, expected: Some(10), force: false })?;
    /// // A second writer that also read 10 loses, and learns what is stored.
    /// let lost = store.set_position(&name, p, SetPosition { offset: 30, expected: Some(10), force: false });
    /// assert!(matches!(lost, Err(PositionError::Conflict { current: Some(25), .. })));
    /// assert_eq!(store.position(&name, p)?, Some(25));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn set_position(
        &self,
        consumer: &ConsumerName,
        partition: PartitionId,
        set: SetPosition,
    ) -> Result<(), PositionError> {
        if let Some(expected) = set.expected
            && set.offset < expected
            && !set.force
        {
            return Err(self.refuse_backwards(consumer, partition, set, expected));
        }
        let part = position_partition(self.app());
        let clustering = position_clustering(consumer.as_str(), partition);
        let key = Key::new(part.as_bytes(), &clustering);
        let new = encode_position(set.offset);
        let conflict = |current| PositionError::Conflict {
            consumer: consumer.clone(),
            partition,
            current,
            expected: set.expected,
        };
        let mut expected_bytes = set.expected.map(encode_position);
        // A second attempt only when the expected position is stored in other bytes (an
        // encoding this build does not write, such as a longer varint: the condition is on
        // the offset, not on its bytes), or when a forced write meets damaged bytes, which
        // it replaces (still by compare-and-swap, on exactly those bytes).
        for _ in 0..2 {
            let Swapped::Not(bytes) = self.swap_position(key, expected_bytes.as_deref(), &new)?
            else {
                return Ok(());
            };
            let Some(bytes) = bytes else {
                return Err(conflict(None));
            };
            if let Some(held) = held_by_member(consumer, partition, &bytes) {
                return Err(held);
            }
            match decode_position(&bytes) {
                Ok(stored) if Some(stored) == set.expected => {}
                Ok(stored) => return Err(conflict(Some(stored))),
                Err(_) if set.force => {}
                Err(reason) => return Err(corrupt(consumer, partition, reason)),
            }
            expected_bytes = Some(bytes);
        }
        // Other bytes than expected twice in a row: another writer keeps rewriting them.
        Err(conflict(set.expected))
    }

    /// As [`EventStore::set_position`], refused first when `set.offset` is at or beyond `end`,
    /// the partition's end (the next PLog offset to be written): a position is the offset of
    /// the last event processed, so it is at most `end - 1`; 0 (nothing processed) is always
    /// within. `force` lets a position move back, never beyond the end. The caller names an
    /// end no greater than the partition's true end (its owner's): the end only grows, so a
    /// position below it stays below.
    ///
    /// # Errors
    ///
    /// [`PositionError::BeyondEnd`] with `end`, nothing written; else as
    /// [`EventStore::set_position`].
    pub fn set_position_below(
        &self,
        consumer: &ConsumerName,
        partition: PartitionId,
        set: SetPosition,
        end: u64,
    ) -> Result<(), PositionError> {
        if set.offset > 0 && set.offset >= end {
            return Err(PositionError::BeyondEnd {
                consumer: consumer.clone(),
                partition,
                offset: set.offset,
                end,
            });
        }
        self.set_position(consumer, partition, set)
    }

    /// The refusal of an unforced write of `set.offset` below `expected`, without writing:
    /// [`PositionError::Backwards`] when `expected` is stored, else the conflict (what the
    /// caller must learn first).
    fn refuse_backwards(
        &self,
        consumer: &ConsumerName,
        partition: PartitionId,
        set: SetPosition,
        expected: u64,
    ) -> PositionError {
        match self.position(consumer, partition) {
            Err(e) => e,
            Ok(Some(current)) if current == expected => PositionError::Backwards {
                consumer: consumer.clone(),
                partition,
                current,
                offset: set.offset,
            },
            Ok(current) => PositionError::Conflict {
                consumer: consumer.clone(),
                partition,
                current,
                expected: set.expected,
            },
        }
    }

    /// One compare-and-swap of a position's bytes.
    fn swap_position(
        &self,
        key: Key<'_>,
        expected: Option<&[u8]>,
        new: &[u8],
    ) -> Result<Swapped, PositionError> {
        match self.kv().compare_and_swap(key, expected, Some(new)) {
            Ok(()) => Ok(Swapped::Yes),
            Err(CasError::Mismatch { current }) => Ok(Swapped::Not(current)),
            Err(CasError::Storage(e)) => Err(PositionError::Storage(e)),
            // Over a size limit: a name is at most 255 bytes, so the key is far below every
            // limit, and the value is at most 15 bytes.
            Err(other) => Err(PositionError::Storage(KvError::Backend {
                message: format!("a position cannot be written: {other}"),
                source: None,
            })),
        }
    }

    /// Every position of `consumer`, in partition order (empty when it has none).
    ///
    /// # Errors
    ///
    /// As [`EventStore::position`].
    pub fn positions(
        &self,
        consumer: &ConsumerName,
    ) -> Result<Vec<(PartitionId, u64)>, PositionError> {
        let part = position_partition(self.app());
        let from = position_prefix(consumer.as_str());
        let to = past_consumer(consumer.as_str());
        let mut out = Vec::new();
        let mut failed = None;
        self.kv().scan(
            part.as_bytes(),
            Bound::Included(&from),
            Bound::Excluded(&to),
            Order::Ascending,
            &mut |clustering, value| match parse_entry(clustering, value) {
                Ok(position) => {
                    out.push((position.partition, position.offset));
                    ControlFlow::Continue(())
                }
                Err(e) => {
                    failed = Some(e);
                    ControlFlow::Break(())
                }
            },
        )?;
        match failed {
            Some(e) => Err(e),
            None => Ok(out),
        }
    }

    /// The first `max` positions of every consumer, in name then partition order, and whether
    /// more are stored. One range read; at most `max + 1` entries are visited.
    ///
    /// # Errors
    ///
    /// As [`EventStore::position`].
    pub fn all_positions(
        &self,
        max: usize,
    ) -> Result<(Vec<ConsumerPosition>, bool), PositionError> {
        self.positions_after(None, max)
    }

    /// The first `max` positions of the consumers named after `after` (every consumer when
    /// `None`), in name then partition order, and whether more are stored: one page of a
    /// listing of every consumer. One range read; at most `max + 1` entries are visited.
    ///
    /// # Errors
    ///
    /// As [`EventStore::position`].
    pub fn positions_after(
        &self,
        after: Option<&ConsumerName>,
        max: usize,
    ) -> Result<(Vec<ConsumerPosition>, bool), PositionError> {
        let part = position_partition(self.app());
        let from = after.map(|name| past_consumer(name.as_str()));
        let mut out = Vec::new();
        let mut more = false;
        let mut failed = None;
        self.kv().scan(
            part.as_bytes(),
            from.as_ref()
                .map_or(Bound::Unbounded, |f| Bound::Included(f.as_slice())),
            Bound::Unbounded,
            Order::Ascending,
            &mut |clustering, value| {
                if out.len() == max {
                    more = true;
                    return ControlFlow::Break(());
                }
                match parse_entry(clustering, value) {
                    Ok(position) => {
                        out.push(position);
                        ControlFlow::Continue(())
                    }
                    Err(e) => {
                        failed = Some(e);
                        ControlFlow::Break(())
                    }
                }
            },
        )?;
        match failed {
            Some(e) => Err(e),
            None => Ok((out, more)),
        }
    }
}

impl<S: KvStore> EventStore<S> {
    /// Deletes every position of `consumer`, each by compare-and-swap on the bytes just read
    /// (a position set meanwhile is read again and deleted at its new value, for up to
    /// `DELETE_ROUNDS` scans); damaged positions are deleted too. Answers what was deleted,
    /// in partition order: the last offset deleted per partition (`None`: damaged bytes).
    /// Empty when the consumer had no position.
    ///
    /// # Errors
    ///
    /// [`PositionError::HeldByMember`] when a member of consumer group `consumer` holds one of
    /// its partitions (nothing deleted, unless a member claimed a partition during a later
    /// scan: those deleted before stay deleted);
    /// [`PositionError::StillWritten`] when positions were set again after every scan (those
    /// deleted stay deleted); [`PositionError::Storage`] on a storage fault (after
    /// [`KvError::OutcomeUnknown`] some may have been deleted: read them to tell).
    pub fn delete_positions(
        &self,
        consumer: &ConsumerName,
    ) -> Result<Vec<(PartitionId, Option<u64>)>, PositionError> {
        let part = position_partition(self.app());
        let mut removed = std::collections::BTreeMap::new();
        for _ in 0..DELETE_ROUNDS {
            let entries = self.position_entries(consumer)?;
            if entries.is_empty() {
                return Ok(removed.into_iter().collect());
            }
            if let Some(held) = entries
                .iter()
                .find_map(|(_, p, bytes)| held_by_member(consumer, *p, bytes))
            {
                return Err(held);
            }
            let swaps: Vec<Swap<'_>> = entries
                .iter()
                .map(|(clustering, _, bytes)| Swap {
                    key: Key::new(part.as_bytes(), clustering),
                    expected: Some(bytes),
                    new: None,
                })
                .collect();
            let answers = self.kv().compare_and_swap_each(&swaps);
            for ((_, partition, bytes), answer) in entries.iter().zip(answers) {
                match answer {
                    Ok(()) => {
                        removed.insert(*partition, decode_position(bytes).ok());
                    }
                    // Set meanwhile: the next scan reads it again.
                    Err(CasError::Mismatch { .. }) => {}
                    Err(CasError::Storage(e)) => return Err(PositionError::Storage(e)),
                    Err(other) => {
                        return Err(PositionError::Storage(KvError::Backend {
                            message: format!("a position cannot be deleted: {other}"),
                            source: None,
                        }));
                    }
                }
            }
        }
        let left = self.position_entries(consumer)?.len();
        if left == 0 {
            return Ok(removed.into_iter().collect());
        }
        Err(PositionError::StillWritten {
            consumer: consumer.clone(),
            left,
        })
    }

    /// Every stored entry of `consumer`: clustering columns, partition and bytes.
    fn position_entries(&self, consumer: &ConsumerName) -> Result<Vec<StoredEntry>, PositionError> {
        let part = position_partition(self.app());
        let from = position_prefix(consumer.as_str());
        let to = past_consumer(consumer.as_str());
        let mut out = Vec::new();
        self.kv().scan(
            part.as_bytes(),
            Bound::Included(&from),
            Bound::Excluded(&to),
            Order::Ascending,
            &mut |clustering, value| {
                let partition = from_position_clustering(clustering).map(|(_, p)| p);
                // A key that does not parse is not one of this consumer's (its prefix holds
                // the name and the end marker): left alone.
                if let Some(partition) = partition {
                    out.push((clustering.to_vec(), partition, value.to_vec()));
                }
                ControlFlow::Continue(())
            },
        )?;
        Ok(out)
    }
}

/// A stored position as read: its clustering columns, partition and bytes.
type StoredEntry = (Vec<u8>, PartitionId, Vec<u8>);

/// The least clustering above every position of `consumer`: the prefix ends with the name's
/// end marker, and one above it bounds the consumer.
fn past_consumer(consumer: &str) -> Vec<u8> {
    let mut to = position_prefix(consumer);
    if let Some(end) = to.last_mut() {
        *end = CONSUMER_NAME_END + 1;
    }
    to
}

/// What one compare-and-swap of a position did.
enum Swapped {
    /// The new bytes are stored.
    Yes,
    /// Other bytes than expected were stored (`None`: none), and still are.
    Not(Option<Vec<u8>>),
}

/// A stored entry of the positions table, or why it is damaged.
fn parse_entry(clustering: &[u8], value: &[u8]) -> Result<ConsumerPosition, PositionError> {
    let shown = String::from_utf8_lossy(clustering).into_owned();
    let Some((name, partition)) = from_position_clustering(clustering) else {
        return Err(PositionError::Corrupt {
            consumer: shown,
            partition: PartitionId(0),
            reason: "its key is not a consumer name and a partition".into(),
        });
    };
    let name = std::str::from_utf8(name)
        .ok()
        .and_then(|n| ConsumerName::new(n).ok());
    let Some(consumer) = name else {
        return Err(PositionError::Corrupt {
            consumer: shown,
            partition,
            reason: "its key holds no valid consumer name".into(),
        });
    };
    let offset = decode_position(value).map_err(|r| corrupt(&consumer, partition, r))?;
    Ok(ConsumerPosition {
        consumer,
        partition,
        offset,
    })
}

fn corrupt(consumer: &ConsumerName, partition: PartitionId, reason: BytesError) -> PositionError {
    PositionError::Corrupt {
        consumer: consumer.to_string(),
        partition,
        reason: reason.to_string(),
    }
}

/// Checks of the positions table that every backend passes (feature `conformance`; re-exported
/// by [`crate::conformance`]).
#[cfg(feature = "conformance")]
pub(crate) mod checks {
    use std::sync::Barrier;

    use monoseq_kv::KvStore;

    use super::{ConsumerName, PositionError, SetPosition};
    use crate::keys::PartitionId;
    use crate::store::EventStore;

    fn name(n: &str) -> ConsumerName {
        ConsumerName::new(n).expect("a valid name")
    }

    /// The compare-and-set rules on `store` (a fresh one): a position is created only when none
    /// is stored, moves only from the value expected, never back unless forced, and a refusal
    /// names the stored value and writes nothing.
    ///
    /// # Panics
    ///
    /// When the store breaks a rule.
    pub fn positions_compare_and_set<K: KvStore>(store: &EventStore<K>) {
        let (c, p) = (name("conformance"), PartitionId(1));
        let set = |offset, expected, force| SetPosition {
            offset,
            expected,
            force,
        };
        assert_eq!(store.position(&c, p).expect("read"), None);
        store
            .set_position(&c, p, set(0, None, false))
            .expect("create at 0");
        assert!(matches!(
            store.set_position(&c, p, set(3, None, false)),
            Err(PositionError::Conflict {
                current: Some(0),
                expected: None,
                ..
            })
        ));
        store
            .set_position(&c, p, set(40, Some(0), false))
            .expect("forward");
        assert!(matches!(
            store.set_position(&c, p, set(50, Some(39), false)),
            Err(PositionError::Conflict {
                current: Some(40),
                ..
            })
        ));
        assert!(matches!(
            store.set_position(&c, p, set(39, Some(40), false)),
            Err(PositionError::Backwards {
                current: 40,
                offset: 39,
                ..
            })
        ));
        assert_eq!(store.position(&c, p).expect("read"), Some(40));
        store
            .set_position(&c, p, set(7, Some(40), true))
            .expect("forced back");
        store
            .set_position(&c, p, set(u64::MAX, Some(7), false))
            .expect("to the top");
        assert_eq!(store.position(&c, p).expect("read"), Some(u64::MAX));
        assert!(matches!(
            store.set_position(&c, PartitionId(2), set(1, Some(0), false)),
            Err(PositionError::Conflict { current: None, .. })
        ));
        assert_eq!(store.positions(&c).expect("list"), vec![(p, u64::MAX)]);
    }

    /// `writers` threads, `rounds` times, each set the same position from the same expected
    /// value to an offset of their own, all released at once: in every round exactly one
    /// succeeds, and every other is refused naming the winner's offset (invariant 17).
    /// Answers how many rounds ran.
    ///
    /// # Panics
    ///
    /// When a round has no winner or more than one, or a loser names another value.
    pub fn positions_one_writer_wins<K: KvStore>(
        store: &EventStore<K>,
        writers: u64,
        rounds: u64,
    ) -> u64 {
        let (c, p) = (name("race"), PartitionId(0));
        let first = SetPosition {
            offset: 0,
            expected: None,
            force: false,
        };
        store
            .set_position(&c, p, first)
            .expect("the first position");
        let barrier = Barrier::new(usize::try_from(writers).expect("a thread count"));
        let outcomes = std::thread::scope(|scope| {
            let threads: Vec<_> = (0..writers)
                .map(|w| {
                    let race = Race {
                        store,
                        barrier: &barrier,
                        consumer: &c,
                        partition: p,
                        writers,
                    };
                    scope.spawn(move || race.writer(w, rounds))
                })
                .collect();
            threads
                .into_iter()
                .map(|t| t.join().expect("a writer"))
                .collect::<Vec<_>>()
        });
        for round in 0..usize::try_from(rounds).expect("a round count") {
            let answers: Vec<&Result<u64, Option<u64>>> =
                outcomes.iter().map(|mine| &mine[round]).collect();
            let winners: Vec<u64> = answers
                .iter()
                .filter_map(|a| a.as_ref().ok().copied())
                .collect();
            assert_eq!(
                winners.len(),
                1,
                "round {round}: {} writers succeeded on the same expected position: {answers:?}",
                winners.len()
            );
            for a in &answers {
                if let Err(current) = a {
                    assert_eq!(*current, Some(winners[0]), "round {round}: {answers:?}");
                }
            }
        }
        rounds
    }

    /// What the writers of [`positions_one_writer_wins`] share.
    struct Race<'a, K> {
        store: &'a EventStore<K>,
        barrier: &'a Barrier,
        consumer: &'a ConsumerName,
        partition: PartitionId,
        writers: u64,
    }

    impl<K: KvStore> Race<'_, K> {
        /// Writer `w`'s rounds: in round `r` every writer expects `r × writers` and sets an
        /// offset of its own above it. Answers per round the offset set, or the position the
        /// refusal named.
        fn writer(&self, w: u64, rounds: u64) -> Vec<Result<u64, Option<u64>>> {
            let (c, p) = (self.consumer, self.partition);
            let mut mine = Vec::new();
            for round in 0..rounds {
                let expected = round * self.writers;
                self.barrier.wait();
                let offset = expected + self.writers + w;
                let set = SetPosition {
                    offset,
                    expected: Some(expected),
                    force: false,
                };
                mine.push(match self.store.set_position(c, p, set) {
                    Ok(()) => Ok(offset),
                    Err(PositionError::Conflict { current, .. }) => Err(current),
                    Err(e) => panic!("round {round}, writer {w}: {e}"),
                });
                // Every writer has tried before the winner's position is moved to the next
                // round's expected value.
                self.barrier.wait();
                if w == 0 {
                    let winner = self.store.position(c, p).expect("read");
                    let next = SetPosition {
                        offset: (round + 1) * self.writers,
                        expected: winner,
                        force: true,
                    };
                    self.store
                        .set_position(c, p, next)
                        .expect("the next round's start");
                }
                self.barrier.wait();
            }
            mine
        }
    }
}

#[cfg(test)]
mod tests {
    use monoseq_kv::MemoryStore;

    use super::*;
    use crate::keys::AppId;
    use crate::store::TrustLevel;

    fn store() -> EventStore<MemoryStore> {
        EventStore::new(MemoryStore::new(), AppId(1), TrustLevel::Level0)
    }

    fn name(n: &str) -> ConsumerName {
        ConsumerName::new(n).unwrap()
    }

    fn set(offset: u64, expected: Option<u64>) -> SetPosition {
        SetPosition {
            offset,
            expected,
            force: false,
        }
    }

    #[test]
    fn a_position_round_trips_through_its_stored_bytes() {
        for offset in [0, 1, 127, 128, 300, u64::from(u32::MAX), u64::MAX] {
            let bytes = encode_position(offset);
            assert!(bytes.len() <= POSITION_BYTES_MAX);
            assert_eq!(decode_position(&bytes), Ok(offset));
        }
        // CRC-32 of [0] is 0xd202ef8d, stored little-endian.
        assert_eq!(encode_position(0), [1, 0x8d, 0xef, 0x02, 0xd2, 0]);
    }

    #[test]
    fn damaged_position_bytes_are_refused_naming_what_is_wrong() {
        let mut flipped = encode_position(300);
        flipped[5] ^= 1;
        assert!(matches!(
            decode_position(&flipped),
            Err(BytesError::Checksum { .. })
        ));
        let mut newer = encode_position(300);
        newer[0] = 3;
        assert!(
            decode_position(&newer)
                .unwrap_err()
                .to_string()
                .contains("version 3")
        );
        assert!(decode_position(&[]).is_err());
        assert!(decode_position(&[1, 0, 0]).is_err());
        let mut long = encode_position(1);
        long.push(0);
        let crc = crc32fast::hash(&long[5..]);
        long[1..5].copy_from_slice(&crc.to_le_bytes());
        assert_eq!(decode_position(&long), Err(BytesError::Trailing(1)));
        assert_eq!(
            BytesError::Trailing(1).to_string(),
            "1 bytes after the offset"
        );
    }

    #[test]
    fn consumer_names_are_one_to_255_printable_ascii_characters() {
        assert!(ConsumerName::new(&"x".repeat(255)).is_ok());
        assert!(ConsumerName::new(" ~").is_ok());
        for bad in [
            String::new(),
            "x".repeat(256),
            "é".into(),
            "a\u{0}b".into(),
            "\n".into(),
        ] {
            let e = ConsumerName::new(&bad).unwrap_err().to_string();
            assert!(e.contains("1 to 255 printable ASCII"), "{e}");
        }
    }

    #[test]
    fn a_position_is_created_only_when_none_is_stored_and_then_moves_by_compare_and_set() {
        let s = store();
        let (c, p) = (name("c"), PartitionId(2));
        assert_eq!(s.position(&c, p).unwrap(), None);
        s.set_position(&c, p, set(0, None)).unwrap();
        assert_eq!(s.position(&c, p).unwrap(), Some(0));
        let again = s.set_position(&c, p, set(5, None)).unwrap_err();
        assert!(
            matches!(
                again,
                PositionError::Conflict {
                    current: Some(0),
                    expected: None,
                    ..
                }
            ),
            "{again}"
        );
        let wrong = s.set_position(&c, p, set(5, Some(3))).unwrap_err();
        assert!(matches!(
            wrong,
            PositionError::Conflict {
                current: Some(0),
                ..
            }
        ));
        s.set_position(&c, p, set(5, Some(0))).unwrap();
        s.set_position(&c, p, set(5, Some(5))).unwrap();
        assert_eq!(s.position(&c, p).unwrap(), Some(5));
        let none = s
            .set_position(&c, PartitionId(3), set(1, Some(1)))
            .unwrap_err();
        assert!(matches!(
            none,
            PositionError::Conflict { current: None, .. }
        ));
    }

    #[test]
    fn a_position_moves_back_only_when_forced() {
        let s = store();
        let (c, p) = (name("c"), PartitionId(0));
        s.set_position(&c, p, set(10, None)).unwrap();
        let back = s.set_position(&c, p, set(9, Some(10))).unwrap_err();
        assert!(
            matches!(
                back,
                PositionError::Backwards {
                    current: 10,
                    offset: 9,
                    ..
                }
            ),
            "{back}"
        );
        assert!(back.to_string().contains("\"force\": true"), "{back}");
        // Backwards and unexpected: the conflict is what the caller must learn first.
        let stale = s.set_position(&c, p, set(3, Some(7))).unwrap_err();
        assert!(matches!(
            stale,
            PositionError::Conflict {
                current: Some(10),
                ..
            }
        ));
        assert_eq!(s.position(&c, p).unwrap(), Some(10));
        s.set_position(
            &c,
            p,
            SetPosition {
                offset: 2,
                expected: Some(10),
                force: true,
            },
        )
        .unwrap();
        assert_eq!(s.position(&c, p).unwrap(), Some(2));
    }

    #[test]
    fn the_condition_is_on_the_offset_not_on_its_bytes() {
        let s = store();
        let (c, p) = (name("c"), PartitionId(0));
        // Offset 5 as a two-byte varint, as no build writes it but every build reads it.
        let mut other = vec![1, 0, 0, 0, 0, 0x85, 0x00];
        let crc = crc32fast::hash(&other[5..]);
        other[1..5].copy_from_slice(&crc.to_le_bytes());
        let part = position_partition(AppId(1));
        let clustering = position_clustering("c", p);
        s.kv()
            .put(Key::new(part.as_bytes(), &clustering), &other)
            .unwrap();
        assert_eq!(s.position(&c, p).unwrap(), Some(5));
        s.set_position(&c, p, set(6, Some(5))).unwrap();
        assert_eq!(s.position(&c, p).unwrap(), Some(6));
    }

    #[test]
    fn listings_give_one_consumers_positions_and_everyones_up_to_a_bound() {
        let s = store();
        for (n, p, o) in [
            ("a", 1, 10),
            ("a", 0, 4),
            ("ab", 0, 7),
            ("a ", 3, 1),
            ("b", 2, 9),
        ] {
            s.set_position(&name(n), PartitionId(p), set(o, None))
                .unwrap();
        }
        assert_eq!(
            s.positions(&name("a")).unwrap(),
            vec![(PartitionId(0), 4), (PartitionId(1), 10)]
        );
        assert_eq!(s.positions(&name("c")).unwrap(), vec![]);
        let (all, more) = s.all_positions(10).unwrap();
        let listed: Vec<_> = all
            .iter()
            .map(|p| (p.consumer.as_str(), p.partition.0, p.offset))
            .collect();
        assert_eq!(
            listed,
            vec![
                ("a", 0, 4),
                ("a", 1, 10),
                ("a ", 3, 1),
                ("ab", 0, 7),
                ("b", 2, 9)
            ]
        );
        assert!(!more);
        let (first, more) = s.all_positions(2).unwrap();
        assert_eq!(first.len(), 2);
        assert!(more);
        // A page after consumer "a" starts with the next name, whatever it begins with.
        let (after, more) = s.positions_after(Some(&name("a")), 10).unwrap();
        let listed: Vec<_> = after
            .iter()
            .map(|p| (p.consumer.as_str(), p.partition.0))
            .collect();
        assert_eq!(listed, vec![("a ", 3), ("ab", 0), ("b", 2)]);
        assert!(!more);
        assert_eq!(s.positions_after(Some(&name("b")), 10).unwrap().0, vec![]);
    }

    #[test]
    fn a_position_at_or_beyond_the_end_is_refused_even_forced() {
        let s = store();
        let (c, p) = (name("c"), PartitionId(0));
        // End 6: events 1 to 5 are written; 5 is the last a consumer can have processed.
        s.set_position_below(&c, p, set(5, None), 6).unwrap();
        for (offset, force) in [(6, false), (7, false), (6, true), (u64::MAX, true)] {
            let at_end = SetPosition {
                offset,
                expected: Some(5),
                force,
            };
            let e = s.set_position_below(&c, p, at_end, 6).unwrap_err();
            assert!(
                matches!(e, PositionError::BeyondEnd { end: 6, offset: o, .. } if o == offset),
                "{e}"
            );
            assert!(e.to_string().contains("at most 5"), "{e}");
        }
        assert_eq!(s.position(&c, p).unwrap(), Some(5));
        // Nothing processed is a position on an empty partition (end 1) too.
        s.set_position_below(&c, PartitionId(1), set(0, None), 1)
            .unwrap();
        let back = SetPosition {
            offset: 2,
            expected: Some(5),
            force: true,
        };
        s.set_position_below(&c, p, back, 6).unwrap();
        assert_eq!(s.position(&c, p).unwrap(), Some(2));
    }

    #[test]
    fn deleting_a_consumer_removes_every_position_of_it_and_nothing_else() {
        let s = store();
        for (n, p, o) in [("a", 1, 10), ("a", 0, 4), ("ab", 0, 7), ("a ", 3, 1)] {
            s.set_position(&name(n), PartitionId(p), set(o, None))
                .unwrap();
        }
        // Damaged bytes are deleted too, named without an offset.
        let part = position_partition(AppId(1));
        let clustering = position_clustering("a", PartitionId(5));
        s.kv()
            .put(Key::new(part.as_bytes(), &clustering), &[1, 2, 3])
            .unwrap();
        assert_eq!(
            s.delete_positions(&name("a")).unwrap(),
            vec![
                (PartitionId(0), Some(4)),
                (PartitionId(1), Some(10)),
                (PartitionId(5), None)
            ]
        );
        assert_eq!(s.positions(&name("a")).unwrap(), vec![]);
        assert_eq!(s.delete_positions(&name("a")).unwrap(), vec![]);
        let (left, _) = s.all_positions(10).unwrap();
        let left: Vec<_> = left.iter().map(|p| p.consumer.as_str()).collect();
        assert_eq!(left, vec!["a ", "ab"]);
    }

    #[test]
    fn a_damaged_position_is_named_not_read_as_a_number() {
        let s = store();
        let (c, p) = (name("c"), PartitionId(4));
        let part = position_partition(AppId(1));
        let clustering = position_clustering("c", p);
        s.kv()
            .put(Key::new(part.as_bytes(), &clustering), &[1, 2, 3])
            .unwrap();
        let e = s.position(&c, p).unwrap_err().to_string();
        assert!(e.contains("consumer c on partition 4 is damaged"), "{e}");
        assert!(s.positions(&c).is_err());
        assert!(s.set_position(&c, p, set(1, Some(0))).is_err());
        // A forced write replaces the damaged bytes.
        let forced = SetPosition {
            offset: 1,
            expected: Some(0),
            force: true,
        };
        s.set_position(&c, p, forced).unwrap();
        assert_eq!(s.position(&c, p).unwrap(), Some(1));
    }
}
