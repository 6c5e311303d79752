//! Keys of the storage model: a partition key plus clustering columns, both opaque bytes.
//! Owns [`Key`] (borrowed), [`KeyBuf`] (owned) and the size limits every backend enforces.

use std::fmt;

/// Size limits every backend enforces on writes, chosen so that every backend we plan fits
/// them: DynamoDB allows 2 048-byte partition keys, 1 024-byte sort keys and 400 KB items;
/// a PostgreSQL B-tree index entry holds about 2 700 bytes; Cassandra and the embedded engines
/// allow more.
pub mod limits {
    /// Largest partition key, in bytes.
    pub const PARTITION_KEY_BYTES_MAX: usize = 1024;
    /// Largest clustering columns, in bytes.
    pub const CLUSTERING_BYTES_MAX: usize = 1024;
    /// Largest value, in bytes (384 KiB: a DynamoDB item with both keys stays under 400 KB).
    pub const VALUE_BYTES_MAX: usize = 384 * 1024;

    use crate::key::{Key, Oversized};

    /// The first part of a write of `value` at `key` that is over its limit, as
    /// `(what, len, max)`; `None` when all fit. Backends check every write with it (batches
    /// through [`crate::WriteBatch::check_limits`]).
    pub fn exceeded(key: Key<'_>, value: &[u8]) -> Option<(Oversized, usize, usize)> {
        if key.partition.len() > PARTITION_KEY_BYTES_MAX {
            return Some((
                Oversized::PartitionKey,
                key.partition.len(),
                PARTITION_KEY_BYTES_MAX,
            ));
        }
        if key.clustering.len() > CLUSTERING_BYTES_MAX {
            return Some((
                Oversized::Clustering,
                key.clustering.len(),
                CLUSTERING_BYTES_MAX,
            ));
        }
        if value.len() > VALUE_BYTES_MAX {
            return Some((Oversized::Value, value.len(), VALUE_BYTES_MAX));
        }
        None
    }
}

/// Which part of a write is over its limit (see [`crate::limits`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Oversized {
    /// The partition key, limited by [`crate::limits::PARTITION_KEY_BYTES_MAX`].
    PartitionKey,
    /// The clustering columns, limited by [`crate::limits::CLUSTERING_BYTES_MAX`].
    Clustering,
    /// The value, limited by [`crate::limits::VALUE_BYTES_MAX`].
    Value,
}

/// A borrowed key: the partition key selects a partition, the clustering columns order the
/// entries inside it. Both compare as unsigned bytes, lexicographically (so callers encode
/// integers big-endian to keep numeric order).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Key<'a> {
    /// The partition key.
    pub partition: &'a [u8],
    /// The clustering columns.
    pub clustering: &'a [u8],
}

impl<'a> Key<'a> {
    /// A key from its two parts.
    pub const fn new(partition: &'a [u8], clustering: &'a [u8]) -> Key<'a> {
        Key {
            partition,
            clustering,
        }
    }

    /// An owned copy.
    pub fn to_owned(self) -> KeyBuf {
        KeyBuf {
            partition: self.partition.to_vec(),
            clustering: self.clustering.to_vec(),
        }
    }
}

impl fmt::Display for Key<'_> {
    /// `partition 0a0b / clustering 01`, in hex.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("partition ")?;
        write_hex(f, self.partition)?;
        f.write_str(" / clustering ")?;
        write_hex(f, self.clustering)
    }
}

fn write_hex(f: &mut fmt::Formatter<'_>, bytes: &[u8]) -> fmt::Result {
    if bytes.is_empty() {
        return f.write_str("(empty)");
    }
    for byte in bytes {
        write!(f, "{byte:02x}")?;
    }
    Ok(())
}

/// An owned key, as reported by a conflict.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct KeyBuf {
    /// The partition key.
    pub partition: Vec<u8>,
    /// The clustering columns.
    pub clustering: Vec<u8>,
}

impl KeyBuf {
    /// The borrowed form.
    pub fn as_key(&self) -> Key<'_> {
        Key::new(&self.partition, &self.clustering)
    }
}

impl fmt::Display for KeyBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.as_key().fmt(f)
    }
}
