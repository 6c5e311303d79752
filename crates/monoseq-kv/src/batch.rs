//! [`WriteBatch`]: the unit of atomic writing. Owns the batch's byte layout (one arena for all
//! keys and values, so building a batch of many items allocates a handful of times, and a
//! cleared batch is reused without allocating).

use crate::error::WriteError;
use crate::key::{Key, limits};

/// What a batch item does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    /// Write the value, replacing any.
    Put,
    /// Write the value if the key is absent; if it is present the whole batch fails with
    /// [`WriteError::Conflict`].
    InsertIfAbsent,
    /// Remove the key (absent keys are fine).
    Delete,
}

/// One item of a batch, borrowed from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchItem<'a> {
    /// What the item does.
    pub op: Op,
    /// The key it writes.
    pub key: Key<'a>,
    /// The value (empty for [`Op::Delete`]).
    pub value: &'a [u8],
}

#[derive(Debug, Clone, Copy)]
struct Header {
    op: Op,
    start: usize,
    partition_len: usize,
    clustering_len: usize,
    value_len: usize,
}

/// An ordered list of puts, conditional inserts and deletes that a store applies atomically
/// (see [`crate::KvStore::write`]).
///
/// # Example
///
/// ```
/// use monoseq_kv::{Key, KvStore, MemoryStore, WriteBatch, WriteError};
///
/// let store = MemoryStore::new();
/// let mut batch = WriteBatch::new();
/// batch.insert_if_absent(Key::new(b"plog/1", &1u64.to_be_bytes()), b"event 1");
/// batch.put(Key::new(b"checkpoint", b""), &2u64.to_be_bytes());
/// store.write(&batch)?;
///
/// // The same conditional insert again conflicts, and nothing of the batch is written.
/// batch.clear();
/// batch.put(Key::new(b"checkpoint", b""), &3u64.to_be_bytes());
/// batch.insert_if_absent(Key::new(b"plog/1", &1u64.to_be_bytes()), b"other");
/// let err = store.write(&batch).unwrap_err();
/// assert!(matches!(err, WriteError::Conflict { index: 1, .. }));
/// assert_eq!(store.get(Key::new(b"checkpoint", b""))?, Some(2u64.to_be_bytes().to_vec()));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Default)]
pub struct WriteBatch {
    bytes: Vec<u8>,
    items: Vec<Header>,
}

impl WriteBatch {
    /// An empty batch.
    pub fn new() -> WriteBatch {
        WriteBatch::default()
    }

    /// An empty batch with room for `items` items holding `bytes` bytes of keys and values.
    pub fn with_capacity(items: usize, bytes: usize) -> WriteBatch {
        WriteBatch {
            bytes: Vec::with_capacity(bytes),
            items: Vec::with_capacity(items),
        }
    }

    /// Adds a put of `value` at `key`.
    pub fn put(&mut self, key: Key<'_>, value: &[u8]) -> &mut WriteBatch {
        self.push(Op::Put, key, value)
    }

    /// Adds an insert of `value` at `key` that fails the whole batch if `key` is present.
    pub fn insert_if_absent(&mut self, key: Key<'_>, value: &[u8]) -> &mut WriteBatch {
        self.push(Op::InsertIfAbsent, key, value)
    }

    /// Adds a delete of `key`.
    pub fn delete(&mut self, key: Key<'_>) -> &mut WriteBatch {
        self.push(Op::Delete, key, &[])
    }

    /// Adds an item.
    pub fn push(&mut self, op: Op, key: Key<'_>, value: &[u8]) -> &mut WriteBatch {
        let value = if op == Op::Delete { &[][..] } else { value };
        let start = self.bytes.len();
        self.bytes.extend_from_slice(key.partition);
        self.bytes.extend_from_slice(key.clustering);
        self.bytes.extend_from_slice(value);
        self.items.push(Header {
            op,
            start,
            partition_len: key.partition.len(),
            clustering_len: key.clustering.len(),
            value_len: value.len(),
        });
        self
    }

    /// Number of items.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Whether the batch has no item.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Whether some item is an [`Op::InsertIfAbsent`].
    pub fn has_conditions(&self) -> bool {
        self.items.iter().any(|h| h.op == Op::InsertIfAbsent)
    }

    /// Removes every item, keeping the allocations.
    pub fn clear(&mut self) {
        self.bytes.clear();
        self.items.clear();
    }

    /// The item at `index`, if any.
    pub fn get(&self, index: usize) -> Option<BatchItem<'_>> {
        self.items.get(index).map(|h| self.item(h))
    }

    /// The items, in the order they were added.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = BatchItem<'_>> + '_ {
        self.items.iter().map(|h| self.item(h))
    }

    /// Checks every item against [`crate::limits`]. Every backend calls it before writing.
    ///
    /// # Errors
    ///
    /// [`WriteError::TooLarge`] naming the first item over a limit.
    pub fn check_limits(&self) -> Result<(), WriteError> {
        for (index, item) in self.iter().enumerate() {
            if let Some((what, len, max)) = limits::exceeded(item.key, item.value) {
                return Err(WriteError::TooLarge {
                    index,
                    what,
                    len,
                    max,
                });
            }
        }
        Ok(())
    }

    fn item(&self, h: &Header) -> BatchItem<'_> {
        let partition_end = h.start + h.partition_len;
        let clustering_end = partition_end + h.clustering_len;
        let value_end = clustering_end + h.value_len;
        BatchItem {
            op: h.op,
            key: Key::new(
                &self.bytes[h.start..partition_end],
                &self.bytes[partition_end..clustering_end],
            ),
            value: &self.bytes[clustering_end..value_end],
        }
    }
}

/// Finds the first insert-if-absent item of `batch` whose key is present, taking earlier items
/// of the batch into account; `is_present` answers for the stored data. Backends call it under
/// their write lock, right before applying the batch.
pub(crate) fn first_conflict<E>(
    batch: &WriteBatch,
    is_present: impl FnMut(Key<'_>) -> Result<bool, E>,
) -> Result<Option<usize>, E> {
    first_conflict_ranged(batch, is_present, |_, _, _| Ok(false))
}

/// The lowest and highest clustering of a partition's insert-if-absent items, and their count.
type Span<'a> = (&'a [u8], &'a [u8], usize);

/// [`first_conflict`] for backends that can tell cheaply that a clustering range of a
/// partition holds no stored key (`range_is_empty(partition, lowest, highest)`, inclusive): a
/// partition with several insert-if-absent keys is probed once over their span, and when the
/// span is empty none of its keys is looked up one by one. A group of log entries with
/// consecutive offsets then costs one seek instead of one lookup per entry.
pub(crate) fn first_conflict_ranged<E>(
    batch: &WriteBatch,
    mut is_present: impl FnMut(Key<'_>) -> Result<bool, E>,
    mut range_is_empty: impl FnMut(&[u8], &[u8], &[u8]) -> Result<bool, E>,
) -> Result<Option<usize>, E> {
    if !batch.has_conditions() {
        return Ok(None);
    }
    // Per partition: the lowest and highest clustering of its insert-if-absent items and how
    // many there are.
    // foldhash, not SipHash: these maps live for one batch and hash every key of it; SipHash
    // was 3 % of a command's CPU in-process.
    let mut spans: foldhash::HashMap<&[u8], Span<'_>> = foldhash::HashMap::default();
    for item in batch.iter().filter(|i| i.op == Op::InsertIfAbsent) {
        let c = item.key.clustering;
        spans
            .entry(item.key.partition)
            .and_modify(|(lo, hi, n)| {
                *lo = (*lo).min(c);
                *hi = (*hi).max(c);
                *n += 1;
            })
            .or_insert((c, c, 1));
    }
    let mut stored_absent: foldhash::HashSet<&[u8]> = foldhash::HashSet::default();
    for (partition, (lo, hi, n)) in spans {
        if n > 1 && range_is_empty(partition, lo, hi)? {
            stored_absent.insert(partition);
        }
    }
    // Keys written by earlier items of this batch: `true` when they end up present.
    let mut written: foldhash::HashMap<Key<'_>, bool> = foldhash::HashMap::with_capacity_and_hasher(
        if batch.len() > 1 { batch.len() } else { 0 },
        Default::default(),
    );
    for (index, item) in batch.iter().enumerate() {
        if item.op == Op::InsertIfAbsent {
            let present = match written.get(&item.key) {
                Some(&present) => present,
                None if stored_absent.contains(item.key.partition) => false,
                None => is_present(item.key)?,
            };
            if present {
                return Ok(Some(index));
            }
        }
        if batch.len() > 1 {
            written.insert(item.key, item.op != Op::Delete);
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key<'a>(p: &'a [u8], c: &'a [u8]) -> Key<'a> {
        Key::new(p, c)
    }

    #[test]
    fn an_empty_span_skips_the_lookups_of_its_partition_only() {
        let mut batch = WriteBatch::new();
        batch.insert_if_absent(key(b"log", b"\x01"), b"a");
        batch.insert_if_absent(key(b"log", b"\x02"), b"b");
        batch.insert_if_absent(key(b"rec", b"\x07"), b"c");
        let mut looked_up = Vec::new();
        let conflict = first_conflict_ranged::<()>(
            &batch,
            |k| {
                looked_up.push(k.partition.to_vec());
                Ok(false)
            },
            |p, lo, hi| {
                assert_eq!((p, lo, hi), (&b"log"[..], &b"\x01"[..], &b"\x02"[..]));
                Ok(true)
            },
        )
        .unwrap();
        assert_eq!(conflict, None);
        assert_eq!(looked_up, vec![b"rec".to_vec()]);
    }

    #[test]
    fn a_stored_key_inside_the_span_is_still_found_by_lookup() {
        let mut batch = WriteBatch::new();
        batch.insert_if_absent(key(b"log", b"\x01"), b"a");
        batch.insert_if_absent(key(b"log", b"\x02"), b"b");
        let conflict = first_conflict_ranged::<()>(
            &batch,
            |k| Ok(k.clustering == b"\x02"),
            |_, _, _| Ok(false),
        )
        .unwrap();
        assert_eq!(conflict, Some(1));
    }

    #[test]
    fn an_empty_span_still_sees_keys_written_earlier_in_the_batch() {
        let mut batch = WriteBatch::new();
        batch.insert_if_absent(key(b"log", b"\x01"), b"a");
        batch.insert_if_absent(key(b"log", b"\x01"), b"again");
        let conflict =
            first_conflict_ranged::<()>(&batch, |_| Ok(false), |_, _, _| Ok(true)).unwrap();
        assert_eq!(conflict, Some(1));
    }
}
