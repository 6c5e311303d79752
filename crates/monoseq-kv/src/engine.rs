//! What the embedded backends share: the contract's control flow around an engine's
//! primitives. An engine supplies a [`WriteSession`] (point lookups, an optional range probe
//! and the application of one item, between taking its write lock or beginning its write
//! transaction and committing) and ordered [`Entry`] iterators; this module supplies the batch
//! write with its conflict check ([`apply_checked`]), compare-and-swap ([`swap_checked`]), the
//! ordered scan ([`scan_entries`]), `sync` per [`Durability`] ([`sync`]) and the
//! per-partition bounds in front of every session ([`Bounded`]), so that fjall and redb differ
//! only in how they reach their files (their shared open path is `crate::embedded`).

use std::cell::RefCell;
use std::ops::ControlFlow;
use std::sync::MutexGuard;

use crate::batch::{Op, WriteBatch, first_conflict_ranged};
use crate::bounds::Bounds;
use crate::encoding;
use crate::error::{CasError, KvError, WriteError};
use crate::group_commit::Commits;
use crate::key::{Key, limits};
use crate::options::Durability;
use crate::store::{Order, Visitor};

/// One write of an engine, from its write lock or write transaction to its commit. The
/// engine guarantees that nothing else writes while a session is open, so what a session
/// reads stays true until it commits.
pub(crate) trait WriteSession {
    /// Whether `key` is stored.
    fn contains(&mut self, key: Key<'_>) -> Result<bool, KvError>;

    /// Whether no key of `partition` with clustering columns in `lo..=hi` is stored. `false`
    /// is always a correct answer (the keys are then looked up one by one); `true` must be
    /// certain.
    fn range_is_empty(&mut self, partition: &[u8], lo: &[u8], hi: &[u8]) -> Result<bool, KvError>;

    /// The stored value of `key`.
    fn read(&mut self, key: Key<'_>) -> Result<Option<Vec<u8>>, KvError>;

    /// Makes one item part of the commit (`value` is empty for [`Op::Delete`]).
    fn apply(&mut self, op: Op, key: Key<'_>, value: &[u8]) -> Result<(), KvError>;

    /// The highest clustering stored in `partition` (`None`: it is empty): one seek from its
    /// end.
    fn highest_clustering(&mut self, partition: &[u8]) -> Result<Option<Vec<u8>>, KvError>;
}

/// An engine's session behind the store's per-partition bounds (`bounds.rs`), holding the
/// write lock that guards them: an insert-if-absent above its partition's bound is absent
/// without a lookup, and every applied write raises its partition's bound before the commit
/// (a bound too high if the commit then fails is still a bound). The one definition of the
/// bounds' use for every embedded engine.
pub(crate) struct Bounded<'b, S> {
    pub(crate) bounds: MutexGuard<'b, Bounds>,
    pub(crate) session: S,
}

impl<S: WriteSession> Bounded<'_, S> {
    /// Learns the bound of the partitions `batch` inserts into if absent, from their second
    /// visit on, then applies the batch like [`apply_checked`].
    ///
    /// # Errors
    ///
    /// [`WriteError::Conflict`] with the item's index and key; a storage fault of a lookup.
    pub(crate) fn apply_checked(&mut self, batch: &WriteBatch) -> Result<(), WriteError> {
        for item in batch.iter().filter(|i| i.op == Op::InsertIfAbsent) {
            self.visit(item.key.partition)?;
        }
        apply_checked(self, batch)
    }

    /// `KvStore::first_present` under the write lock: a key above its partition's bound is
    /// absent without a lookup; a partition's bound is learned from its second visit on, as
    /// for an insert-if-absent.
    ///
    /// # Errors
    ///
    /// A storage fault of a lookup or of learning a bound.
    pub(crate) fn first_present(&mut self, keys: &[Key<'_>]) -> Result<Option<usize>, KvError> {
        for (index, &key) in keys.iter().enumerate() {
            self.visit(key.partition)?;
            if self.contains(key)? {
                return Ok(Some(index));
            }
        }
        Ok(None)
    }

    /// `KvStore::expect_inserts` under the write lock: learns the bound of each of
    /// `partitions` not known yet, whatever its visits so far.
    ///
    /// # Errors
    ///
    /// A storage fault of learning a bound (those learned before it stay learned).
    pub(crate) fn learn(&mut self, partitions: &[&[u8]]) -> Result<(), KvError> {
        for &partition in partitions {
            if !self.bounds.knows(partition) {
                self.learn_bound(partition)?;
            }
        }
        Ok(())
    }

    /// A check of absence in `partition`: learns its bound if unknown, from its second visit.
    fn visit(&mut self, partition: &[u8]) -> Result<(), KvError> {
        if !self.bounds.knows(partition) && self.bounds.worth_learning(partition) {
            self.learn_bound(partition)?;
        }
        Ok(())
    }

    /// Learns the bound of `partition` from the stored data: one seek from its end.
    fn learn_bound(&mut self, partition: &[u8]) -> Result<(), KvError> {
        let highest = self.session.highest_clustering(partition)?;
        self.bounds.learn(partition, highest.as_deref());
        Ok(())
    }
}

impl<S: WriteSession> WriteSession for Bounded<'_, S> {
    fn contains(&mut self, key: Key<'_>) -> Result<bool, KvError> {
        if self.bounds.above(key.partition, key.clustering) {
            return Ok(false);
        }
        self.session.contains(key)
    }

    fn range_is_empty(&mut self, partition: &[u8], lo: &[u8], hi: &[u8]) -> Result<bool, KvError> {
        if self.bounds.above(partition, lo) {
            return Ok(true);
        }
        self.session.range_is_empty(partition, lo, hi)
    }

    fn read(&mut self, key: Key<'_>) -> Result<Option<Vec<u8>>, KvError> {
        self.session.read(key)
    }

    fn apply(&mut self, op: Op, key: Key<'_>, value: &[u8]) -> Result<(), KvError> {
        if op != Op::Delete {
            self.bounds.wrote(key.partition, key.clustering);
        }
        self.session.apply(op, key, value)
    }

    fn highest_clustering(&mut self, partition: &[u8]) -> Result<Option<Vec<u8>>, KvError> {
        self.session.highest_clustering(partition)
    }
}

/// Checks a batch's limits before any engine work: `Ok(true)` when it writes nothing.
///
/// # Errors
///
/// [`WriteError::TooLarge`] (through [`WriteBatch::check_limits`]) for an oversized item.
pub(crate) fn nothing_to_write(batch: &WriteBatch) -> Result<bool, WriteError> {
    batch.check_limits()?;
    Ok(batch.is_empty())
}

/// Applies `batch` in `session` unless one of its insert-if-absent items finds its key
/// present (stored, or written by an earlier item of the batch): then nothing is applied and
/// the first such item is named. The caller commits the session only after `Ok`.
///
/// # Errors
///
/// [`WriteError::Conflict`] with the item's index and key; a storage fault of a lookup.
pub(crate) fn apply_checked(
    session: &mut impl WriteSession,
    batch: &WriteBatch,
) -> Result<(), WriteError> {
    // The two lookups are called one after the other, never nested.
    let shared = RefCell::new(&mut *session);
    let conflict = first_conflict_ranged(
        batch,
        |key| shared.borrow_mut().contains(key),
        |partition, lo, hi| shared.borrow_mut().range_is_empty(partition, lo, hi),
    )?;
    if let Some(index) = conflict {
        let key = batch.get(index).map(|item| item.key.to_owned());
        return Err(WriteError::Conflict {
            index,
            key: key.unwrap_or_default(),
        });
    }
    for item in batch.iter() {
        session.apply(item.op, item.key, item.value)?;
    }
    Ok(())
}

/// Checks a compare-and-swap's limits before any engine work.
///
/// # Errors
///
/// [`CasError::TooLarge`] when the key or the new value is over its limit.
pub(crate) fn check_swap(key: Key<'_>, new: Option<&[u8]>) -> Result<(), CasError> {
    match limits::exceeded(key, new.unwrap_or_default()) {
        Some((what, len, max)) => Err(CasError::TooLarge { what, len, max }),
        None => Ok(()),
    }
}

/// Replaces the value of `key` by `new` (absent: delete) in `session` if it is `expected`
/// (absent: not stored). The caller commits the session only after `Ok`.
///
/// # Errors
///
/// [`CasError::Mismatch`] with the current value; a storage fault of the read.
pub(crate) fn swap_checked(
    session: &mut impl WriteSession,
    key: Key<'_>,
    expected: Option<&[u8]>,
    new: Option<&[u8]>,
) -> Result<(), CasError> {
    let current = session.read(key)?;
    if current.as_deref() != expected {
        return Err(CasError::Mismatch { current });
    }
    match new {
        Some(value) => session.apply(Op::Put, key, value)?,
        None => session.apply(Op::Delete, key, &[])?,
    }
    Ok(())
}

/// A stored entry as an engine's iterator yields it: the encoded key and the value.
pub(crate) trait Entry {
    /// The encoded key ([`encoding`]).
    fn key(&self) -> &[u8];
    /// The value.
    fn value(&self) -> &[u8];
}

/// Visits `entries` (the encoded range of `partition`, ascending) in `order` until `visit`
/// breaks or an entry fails.
///
/// # Errors
///
/// The first failed entry's error; entries visited before it stay visited.
pub(crate) fn scan_entries<E: Entry>(
    partition: &[u8],
    entries: impl DoubleEndedIterator<Item = Result<E, KvError>>,
    order: Order,
    visit: &mut Visitor<'_>,
) -> Result<(), KvError> {
    let mut step = |entry: Result<E, KvError>| -> Result<ControlFlow<()>, KvError> {
        let entry = entry?;
        Ok(visit(
            encoding::clustering(partition, entry.key()),
            entry.value(),
        ))
    };
    match order {
        Order::Ascending => {
            for entry in entries {
                if step(entry)?.is_break() {
                    break;
                }
            }
        }
        Order::Descending => {
            for entry in entries.rev() {
                if step(entry)?.is_break() {
                    break;
                }
            }
        }
    }
    Ok(())
}

/// `KvStore::sync` of an embedded engine: with [`Durability::Sync`] every commit was durable
/// already (only a failed flush is reported); otherwise `sync_now` makes every acknowledged
/// commit durable.
///
/// # Errors
///
/// The error of the flush, or of an earlier failed one.
pub(crate) fn sync(
    durability: Durability,
    commits: &Commits,
    sync_now: impl FnOnce() -> Result<(), KvError>,
) -> Result<(), KvError> {
    match durability {
        Durability::Sync => commits.check(),
        Durability::GroupCommit { .. } | Durability::Manual => sync_now(),
    }
}
