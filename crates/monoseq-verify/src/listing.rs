//! [`PartitionList`]: which blocks of the logs, records and numbers (and in key layout 5 which
//! workspaces' WLog and records chunks) a store holds. The key-value contract has no way to
//! list partitions (a scan stays inside one), so without a list verification finds only what
//! the PLogs lead to; with one it also finds WLog entries, records, chunks and numbers of
//! workspaces no event names, and PLog blocks past a gap or of unknown partitions. A list comes
//! from the engine's own listing ([`PartitionList::from_store`]) or from known partition keys
//! ([`PartitionList::from_keys`]); only `keys.rs` knows the layout of a partition key, and only
//! the kv crate how the engine stores one.

use std::collections::BTreeMap;
use std::ops::ControlFlow;

use monoseq_kv::FjallStore;
use monoseq_store::AppId;

use crate::keys::{self, Listed};

/// The blocks of one application's event store that a store holds, by table, sorted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PartitionList {
    pub(crate) plog: BTreeMap<u32, Vec<u64>>,
    pub(crate) wlog: Vec<(u64, u64)>,
    pub(crate) records: Vec<(u64, u64)>,
    pub(crate) numbers: Vec<u64>,
    /// Key layout 5: the workspaces with WLog chunks.
    pub(crate) wlog_chunks: Vec<u64>,
    /// Key layout 5: the (workspace, bucket) pairs with records chunks.
    pub(crate) record_chunks: Vec<(u64, u64)>,
}

/// Why listing an engine's partitions failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ListError {
    /// The engine could not be opened or read.
    #[error("reading every key of the engine: {message}")]
    Engine {
        /// The engine's error.
        message: String,
    },
}

impl PartitionList {
    /// The list of the partition keys `keys` (each once or more, any order); keys of other
    /// tables or applications are left out.
    pub fn from_keys<'k>(app: AppId, keys: impl IntoIterator<Item = &'k [u8]>) -> PartitionList {
        let mut list = PartitionList::default();
        for key in keys {
            list.add(app, key);
        }
        list.finish();
        list
    }

    /// Lists the partitions of `app` that `store` holds, through its listing
    /// ([`FjallStore::partitions`]: one seek per partition, nothing written). Open the store
    /// with [`FjallStore::open_read_only`] on a copy of a data directory (see
    /// [`crate::Snapshot`]).
    ///
    /// # Errors
    ///
    /// [`ListError`] when the engine's files cannot be read.
    pub fn from_store(store: &FjallStore, app: AppId) -> Result<PartitionList, ListError> {
        let mut list = PartitionList::default();
        store
            .partitions(&mut |partition| {
                list.add(app, partition);
                ControlFlow::Continue(())
            })
            .map_err(|e| ListError::Engine {
                message: e.to_string(),
            })?;
        list.finish();
        Ok(list)
    }

    fn add(&mut self, app: AppId, key: &[u8]) {
        match keys::parse(app, key) {
            Some(Listed::PLog(p, block)) => self.plog.entry(p).or_default().push(block),
            Some(Listed::WLog(ws, block)) => self.wlog.push((ws, block)),
            Some(Listed::Record(ws, block)) => self.records.push((ws, block)),
            Some(Listed::Numbers(block)) => self.numbers.push(block),
            Some(Listed::WLogChunks(ws)) => self.wlog_chunks.push(ws),
            Some(Listed::RecordChunks(ws, bucket)) => self.record_chunks.push((ws, bucket)),
            // An applied or indexed end is one key, read by partition, not a block.
            Some(Listed::Applied(_) | Listed::Indexed(_)) | None => {}
        }
    }

    fn finish(&mut self) {
        for blocks in self.plog.values_mut() {
            blocks.sort_unstable();
            blocks.dedup();
        }
        for v in [&mut self.wlog, &mut self.records] {
            v.sort_unstable();
            v.dedup();
        }
        for v in [&mut self.numbers, &mut self.wlog_chunks] {
            v.sort_unstable();
            v.dedup();
        }
        self.record_chunks.sort_unstable();
        self.record_chunks.dedup();
    }

    /// How many blocks (and partitions of chunks) the list holds, over all tables.
    #[must_use]
    pub fn blocks(&self) -> usize {
        self.plog.values().map(Vec::len).sum::<usize>()
            + self.wlog.len()
            + self.records.len()
            + self.numbers.len()
            + self.wlog_chunks.len()
            + self.record_chunks.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_sorted_into_their_tables_once_each() {
        let app = AppId(1);
        let keys = [
            keys::plog_block(app, 2, 1),
            keys::plog_block(app, 2, 0),
            keys::plog_block(app, 2, 0),
            keys::wlog_block(app, 9, 0),
            keys::record_block(app, 9, 78),
            keys::numbers_block(app, 0),
            keys::applied(app, 2),
            keys::wlog_chunks(app, 9),
            keys::wlog_chunks(app, 9),
            keys::record_chunks(app, 9, 75_131),
            keys::indexed(app, 2),
            keys::plog_block(AppId(2), 0, 0),
            keys::META_PARTITION.to_vec(),
        ];
        let list = PartitionList::from_keys(app, keys.iter().map(Vec::as_slice));
        assert_eq!(list.plog.get(&2), Some(&vec![0, 1]));
        assert_eq!(list.wlog, vec![(9, 0)]);
        assert_eq!(list.records, vec![(9, 78)]);
        assert_eq!(list.numbers, vec![0]);
        assert_eq!(list.wlog_chunks, vec![9]);
        assert_eq!(list.record_chunks, vec![(9, 75_131)]);
        assert_eq!(list.blocks(), 7);
    }
}
