//! [`MemoryStore`]: the reference backend, a `BTreeMap` of partitions behind a lock. Every
//! other backend must behave like it; it holds nothing across restarts.

use std::collections::BTreeMap;
use std::ops::{Bound, ControlFlow};
use std::sync::{PoisonError, RwLock};

use crate::batch::{Op, WriteBatch, first_conflict};
use crate::error::{CasError, KvError, WriteError};
use crate::key::{Key, limits};
use crate::store::{KvStore, Order, Visitor};

type Partition = BTreeMap<Vec<u8>, Vec<u8>>;

/// The in-memory reference backend. Writes are visible on return and durable never (`sync`
/// does nothing). Cheap to create; a fresh one per test is the norm.
///
/// # Example
///
/// ```
/// use monoseq_kv::{Key, KvStore, MemoryStore};
///
/// let store = MemoryStore::new();
/// store.put(Key::new(b"p", b"a"), b"1")?;
/// assert_eq!(store.get(Key::new(b"p", b"a"))?, Some(b"1".to_vec()));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Default)]
pub struct MemoryStore {
    partitions: RwLock<BTreeMap<Vec<u8>, Partition>>,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> MemoryStore {
        MemoryStore::default()
    }

    /// Every key stored, in order (for tests that look at what a writer stored).
    pub fn keys(&self) -> Vec<crate::KeyBuf> {
        let partitions = self
            .partitions
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        partitions
            .iter()
            .flat_map(|(p, rows)| {
                rows.keys().map(|c| crate::KeyBuf {
                    partition: p.clone(),
                    clustering: c.clone(),
                })
            })
            .collect()
    }
}

fn lookup<'m>(partitions: &'m BTreeMap<Vec<u8>, Partition>, key: Key<'_>) -> Option<&'m Vec<u8>> {
    partitions.get(key.partition)?.get(key.clustering)
}

fn apply(partitions: &mut BTreeMap<Vec<u8>, Partition>, op: Op, key: Key<'_>, value: &[u8]) {
    match op {
        Op::Put | Op::InsertIfAbsent => {
            partitions
                .entry(key.partition.to_vec())
                .or_default()
                .insert(key.clustering.to_vec(), value.to_vec());
        }
        Op::Delete => {
            if let Some(partition) = partitions.get_mut(key.partition) {
                partition.remove(key.clustering);
                if partition.is_empty() {
                    partitions.remove(key.partition);
                }
            }
        }
    }
}

/// Whether no clustering columns lie between the bounds (`BTreeMap::range` panics on those).
pub(crate) fn is_empty_range(from: Bound<&[u8]>, to: Bound<&[u8]>) -> bool {
    match (from, to) {
        (Bound::Included(a), Bound::Included(b)) => a > b,
        (Bound::Included(a), Bound::Excluded(b))
        | (Bound::Excluded(a), Bound::Included(b))
        | (Bound::Excluded(a), Bound::Excluded(b)) => a >= b,
        (_, Bound::Excluded(b)) => b.is_empty(),
        _ => false,
    }
}

impl KvStore for MemoryStore {
    fn get(&self, key: Key<'_>) -> Result<Option<Vec<u8>>, KvError> {
        let partitions = self
            .partitions
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        Ok(lookup(&partitions, key).cloned())
    }

    fn get_many(&self, keys: &[Key<'_>]) -> Result<Vec<Option<Vec<u8>>>, KvError> {
        let partitions = self
            .partitions
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        Ok(keys
            .iter()
            .map(|&key| lookup(&partitions, key).cloned())
            .collect())
    }

    fn scan(
        &self,
        partition: &[u8],
        from: Bound<&[u8]>,
        to: Bound<&[u8]>,
        order: Order,
        visit: &mut Visitor<'_>,
    ) -> Result<(), KvError> {
        if is_empty_range(from, to) {
            return Ok(());
        }
        let partitions = self
            .partitions
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        let Some(entries) = partitions.get(partition) else {
            return Ok(());
        };
        let range = entries.range::<[u8], _>((from, to));
        let mut step = |(clustering, value): (&Vec<u8>, &Vec<u8>)| visit(clustering, value);
        let _ = match order {
            Order::Ascending => range.map(&mut step).find(|flow| flow.is_break()),
            Order::Descending => range.rev().map(&mut step).find(ControlFlow::is_break),
        };
        Ok(())
    }

    fn write(&self, batch: &WriteBatch) -> Result<(), WriteError> {
        batch.check_limits()?;
        let mut partitions = self
            .partitions
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        let conflict = first_conflict::<std::convert::Infallible>(batch, |key| {
            Ok(lookup(&partitions, key).is_some())
        });
        if let Ok(Some(index)) = conflict {
            let key = batch.get(index).map(|item| item.key.to_owned());
            return Err(WriteError::Conflict {
                index,
                key: key.unwrap_or_default(),
            });
        }
        for item in batch.iter() {
            apply(&mut partitions, item.op, item.key, item.value);
        }
        Ok(())
    }

    fn compare_and_swap(
        &self,
        key: Key<'_>,
        expected: Option<&[u8]>,
        new: Option<&[u8]>,
    ) -> Result<(), CasError> {
        if let Some((what, len, max)) = limits::exceeded(key, new.unwrap_or_default()) {
            return Err(CasError::TooLarge { what, len, max });
        }
        let mut partitions = self
            .partitions
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        let current = lookup(&partitions, key);
        if current.map(Vec::as_slice) != expected {
            return Err(CasError::Mismatch {
                current: current.cloned(),
            });
        }
        match new {
            Some(value) => apply(&mut partitions, Op::Put, key, value),
            None => apply(&mut partitions, Op::Delete, key, &[]),
        }
        Ok(())
    }

    fn sync(&self) -> Result<(), KvError> {
        Ok(())
    }
}
