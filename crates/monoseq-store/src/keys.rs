//! Key layout of the event store on the key-value contract (documented in `docs/format.md`):
//! one tag byte per table, then the application, then the table's own columns, integers
//! big-endian so that byte order is numeric order.

use monoseq_core::{PLogOffset, SeqId, WsId};

use crate::event::{RecordId, WLogOffset};

/// Events per PLog partition key (and per WLog partition key): logs are split into blocks so
/// that no storage partition grows without bound (a Cassandra or DynamoDB partition must stay
/// small). 4 096 as in the reference platform.
pub const LOG_BLOCK_EVENTS: u64 = 4096;
/// Record IDs per records partition key; consecutive IDs of a workspace share a partition.
pub const RECORD_BLOCK_IDS: u64 = 4096;

/// An application: the unit whose data the store keeps apart from other applications'.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AppId(pub u32);

/// A partition of an application: the owner of a PLog and of a sequencer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PartitionId(pub u32);

impl std::fmt::Display for AppId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::fmt::Display for PartitionId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

pub(crate) const TAG_PLOG: u8 = 0x01;
pub(crate) const TAG_WLOG: u8 = 0x02;
pub(crate) const TAG_RECORD: u8 = 0x03;
pub(crate) const TAG_NUMBERS: u8 = 0x04;
pub(crate) const TAG_CHECKPOINT: u8 = 0x05;

/// A partition key: tag, application, and up to two more big-endian columns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PartKey {
    buf: [u8; 21],
    len: u8,
}

impl PartKey {
    fn new(tag: u8, app: AppId) -> PartKey {
        let mut buf = [0u8; 21];
        buf[0] = tag;
        buf[1..5].copy_from_slice(&app.0.to_be_bytes());
        PartKey { buf, len: 5 }
    }

    fn push(mut self, bytes: &[u8]) -> PartKey {
        let at = usize::from(self.len);
        self.buf[at..at + bytes.len()].copy_from_slice(bytes);
        self.len += bytes.len() as u8;
        self
    }

    pub(crate) fn as_bytes(&self) -> &[u8] {
        &self.buf[..usize::from(self.len)]
    }
}

/// PLog: partition `01 app:be32 partition:be32 block:be64`, clustering `offset:be64`.
pub(crate) fn plog_partition(app: AppId, partition: PartitionId, offset: PLogOffset) -> PartKey {
    PartKey::new(TAG_PLOG, app)
        .push(&partition.0.to_be_bytes())
        .push(&(offset.0 / LOG_BLOCK_EVENTS).to_be_bytes())
}

/// WLog: partition `02 app:be32 ws:be64 block:be64`, clustering `offset:be64`.
pub(crate) fn wlog_partition(app: AppId, ws: WsId, offset: WLogOffset) -> PartKey {
    PartKey::new(TAG_WLOG, app)
        .push(&ws.0.to_be_bytes())
        .push(&(offset.0 / LOG_BLOCK_EVENTS).to_be_bytes())
}

/// Records: partition `03 app:be32 ws:be64 id_block:be64`, clustering `id:be64`.
pub(crate) fn record_partition(app: AppId, ws: WsId, id: RecordId) -> PartKey {
    PartKey::new(TAG_RECORD, app)
        .push(&ws.0.to_be_bytes())
        .push(&(id.0 / RECORD_BLOCK_IDS).to_be_bytes())
}

/// Numbers: partition `04 app:be32 ws:be64`, clustering `seq:be16`, value `be64`.
pub(crate) fn numbers_partition(app: AppId, ws: WsId) -> PartKey {
    PartKey::new(TAG_NUMBERS, app).push(&ws.0.to_be_bytes())
}

/// The clustering columns of one sequence's number.
pub(crate) fn seq_clustering(seq: SeqId) -> [u8; 2] {
    seq.0.to_be_bytes()
}

/// Checkpoint: partition `05 app:be32 partition:be32`, empty clustering, value `be64`.
pub(crate) fn checkpoint_partition(app: AppId, partition: PartitionId) -> PartKey {
    PartKey::new(TAG_CHECKPOINT, app).push(&partition.0.to_be_bytes())
}

/// Reads a big-endian `u64` value or clustering column; `None` unless exactly 8 bytes.
pub(crate) fn be64(bytes: &[u8]) -> Option<u64> {
    let arr: [u8; 8] = bytes.try_into().ok()?;
    Some(u64::from_be_bytes(arr))
}

/// Where a key of the event store points, for messages ("sequence violation at …").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Slot {
    /// An event's place in its partition's PLog.
    PLog {
        /// The partition.
        partition: PartitionId,
        /// The PLog offset.
        offset: PLogOffset,
    },
    /// An event's place in its workspace's WLog.
    WLog {
        /// The workspace.
        ws: WsId,
        /// The WLog offset.
        offset: WLogOffset,
    },
    /// A record.
    Record {
        /// The workspace.
        ws: WsId,
        /// The record ID.
        id: RecordId,
    },
}

impl std::fmt::Display for Slot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Slot::PLog { partition, offset } => {
                write!(f, "PLog offset {offset} of partition {partition}")
            }
            Slot::WLog { ws, offset } => write!(f, "WLog offset {offset} of workspace {ws}"),
            Slot::Record { ws, id } => write!(f, "record {id} of workspace {ws}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_keys_split_into_blocks_and_keep_numeric_order() {
        let a = plog_partition(AppId(1), PartitionId(2), PLogOffset(4095));
        let b = plog_partition(AppId(1), PartitionId(2), PLogOffset(4096));
        assert_ne!(a, b);
        assert!(a.as_bytes() < b.as_bytes());
        assert_eq!(
            a.as_bytes(),
            &[1, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0]
        );
        let w = wlog_partition(AppId(1), WsId(3), WLogOffset(1));
        assert_eq!(w.as_bytes().len(), 21);
        assert_eq!(numbers_partition(AppId(1), WsId(3)).as_bytes().len(), 13);
        assert_eq!(
            checkpoint_partition(AppId(1), PartitionId(2))
                .as_bytes()
                .len(),
            9
        );
    }

    #[test]
    fn records_of_one_workspace_share_a_partition_per_id_block() {
        let a = record_partition(AppId(1), WsId(3), RecordId(322_685_000_131_072));
        let b = record_partition(AppId(1), WsId(3), RecordId(322_685_000_131_073));
        assert_eq!(a, b);
    }
}
