//! [`FjallStore::partitions`]: which partitions the store holds. The key-value contract has no
//! way to list partitions (a scan stays inside one), so whoever must find every partition
//! (verification) asks the engine; it answers from the key layout of [`crate::encoding`] with
//! one seek per partition, reading nothing inside a partition but its first key.

use std::ops::{Bound, ControlFlow};

use super::{FjallStore, fault};
use crate::encoding;
use crate::error::KvError;

impl FjallStore {
    /// Visits the partition key of every partition holding at least one entry, once each, in
    /// the engine's order (by length, then bytes), until `visit` breaks. Reads only; works on
    /// a store opened with [`FjallStore::open_read_only`].
    ///
    /// # Errors
    ///
    /// A [`KvError`] when the engine's files cannot be read (`Corrupted` for damaged bytes);
    /// the partitions visited before it stay visited.
    ///
    /// # Example
    ///
    /// ```
    /// use std::ops::ControlFlow;
    /// use monoseq_kv::{FjallStore, Key, KvStore, Options};
    ///
    /// let dir = tempfile::tempdir()?;
    /// let store = FjallStore::open(dir.path(), Options::default())?;
    /// store.put(Key::new(b"b", b"1"), b"x")?;
    /// store.put(Key::new(b"b", b"2"), b"x")?;
    /// store.put(Key::new(b"a", b"1"), b"x")?;
    /// let mut seen = Vec::new();
    /// store.partitions(&mut |p| {
    ///     seen.push(p.to_vec());
    ///     ControlFlow::Continue(())
    /// })?;
    /// assert_eq!(seen, [b"a".to_vec(), b"b".to_vec()]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn partitions(
        &self,
        visit: &mut dyn FnMut(&[u8]) -> ControlFlow<()>,
    ) -> Result<(), KvError> {
        let kv = &self.files().kv;
        let mut from: Bound<Vec<u8>> = Bound::Unbounded;
        loop {
            let Some(guard) = kv.range((from, Bound::Unbounded)).next() else {
                return Ok(());
            };
            let key = guard
                .key()
                .map_err(|error| fault("listing the partitions", error))?;
            let Some(partition) = encoding::partition_of(&key) else {
                return Err(KvError::Corrupted {
                    message: format!(
                        "a key of {} bytes is shorter than the partition length it starts with",
                        key.len()
                    ),
                });
            };
            if visit(partition).is_break() {
                return Ok(());
            }
            match encoding::after_partition(partition) {
                Some(next) => from = Bound::Included(next),
                None => return Ok(()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::ops::ControlFlow;

    use crate::{FjallStore, Key, KvStore, Options, WriteBatch};

    fn listed(store: &FjallStore) -> Vec<Vec<u8>> {
        let mut seen = Vec::new();
        store
            .partitions(&mut |p| {
                seen.push(p.to_vec());
                ControlFlow::Continue(())
            })
            .expect("list");
        seen
    }

    #[test]
    fn every_partition_is_listed_once_even_when_one_is_a_prefix_of_another() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let store = FjallStore::open(dir.path(), Options::default()).expect("open");
        let mut batch = WriteBatch::new();
        for (p, c) in [
            (&b"ab"[..], &b"\xff"[..]),
            (b"a", b"b"),
            (b"ab", b""),
            (b"", b"1"),
        ] {
            batch.put(Key::new(p, c), b"v");
        }
        for c in 0u16..300 {
            batch.put(Key::new(b"\xff", &c.to_be_bytes()), b"v");
        }
        store.write(&batch).expect("write");
        store.delete(Key::new(b"a", b"b")).expect("delete");
        assert_eq!(listed(&store), [&b""[..], b"\xff", b"ab"]);
    }

    #[test]
    fn a_read_only_store_lists_and_reads_but_writes_nothing() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let store = FjallStore::open(dir.path(), Options::default()).expect("open");
        store.put(Key::new(b"p", b"1"), b"v").expect("put");
        drop(store);
        let store = FjallStore::open_read_only(dir.path(), Options::default()).expect("open");
        assert_eq!(listed(&store), [b"p".to_vec()]);
        assert_eq!(
            store.get(Key::new(b"p", b"1")).expect("get"),
            Some(b"v".to_vec())
        );
        let refused = store
            .put(Key::new(b"p", b"2"), b"v")
            .expect_err("read-only");
        assert!(refused.to_string().contains("read-only"), "{refused}");
        store.sync().expect("nothing to flush");
        drop(store);
        let store = FjallStore::open(dir.path(), Options::default()).expect("open");
        assert_eq!(store.get(Key::new(b"p", b"2")).expect("get"), None);
    }
}
