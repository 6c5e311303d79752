//! Key layout of the event store on the key-value contract (documented in `docs/format.md`):
//! partition keys are one tag byte per table, then the application, then the table's own
//! columns, as varints; clustering columns are big-endian so that byte order is numeric order.

use monoseq_core::{PLogOffset, SeqId, WsId};
use monoseq_kv::Key;

use crate::event::{RecordId, WLogOffset};

/// The key layout of a store whose PLog is in the key-value store (`docs/format.md`, "Event
/// store keys"): every database store, and data directories created before layout 4. Layout 1
/// wrote fixed-width partition keys and whole offsets and IDs as clustering columns; layout 2
/// kept one numbers partition per workspace.
pub const KEY_LAYOUT: u32 = 3;
/// The key layout this build creates data directories in: layout 3's keys but the PLog's,
/// which segment files beside the key-value store hold ([`crate::Segments`]), and an applied
/// end per partition. Builds before it refuse such a directory (they read layout 3 only).
pub const KEY_LAYOUT_SEGMENTS: u32 = 4;
/// Layout 4 with the WLog entries and created records' references of a partition's events
/// held in memory and written in chunks, one key per workspace (and records bucket) for every
/// [`CHUNK_EVENTS`] events of the partition ([`crate::Segments::with_chunks`]), instead of a
/// key per entry: a workspace's WLog and records keep growing at their ends only.
pub const KEY_LAYOUT_CHUNKS: u32 = 5;
/// Events of a partition whose WLog entries and created records' references are held in
/// memory before they are written as one chunk per workspace (key layout 5); a restart reads
/// them back from the segment files, so they bound its work too.
pub const CHUNK_EVENTS: usize = 8192;
/// A records chunk holds IDs that agree above their low 32 bits (a bucket): each of the
/// built-in ID sequences counts in its own bucket, so each ascends in its own chunks.
pub const RECORD_BUCKET_BITS: u32 = u64::BITS / 2;

/// Events per PLog partition key (and per WLog partition key): logs are split into blocks so
/// that no storage partition grows without bound (a Cassandra or DynamoDB partition must stay
/// small). 4 096 as in the reference platform.
pub const LOG_BLOCK_EVENTS: u64 = 4096;
/// Record IDs per records partition key; consecutive IDs of a workspace share a partition.
pub const RECORD_BLOCK_IDS: u64 = 4096;
/// Workspaces per numbers partition key: neighbouring workspaces' numbers share a partition, so
/// actualization compares a window of them with stored numbers in one range read.
pub const NUMBERS_BLOCK_WS: u64 = 4096;

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
pub(crate) const TAG_POSITION: u8 = 0x06;
pub(crate) const TAG_GROUP: u8 = 0x07;
pub(crate) const TAG_APPLIED: u8 = 0x08;
pub(crate) const TAG_WLOG_CHUNK: u8 = 0x09;
pub(crate) const TAG_RECORD_CHUNK: u8 = 0x0a;
pub(crate) const TAG_INDEXED: u8 = 0x0b;

/// Ends a consumer name in a position's clustering columns: below every byte a name may hold
/// (printable ASCII), so one consumer's positions are contiguous and ordered by partition.
pub(crate) const CONSUMER_NAME_END: u8 = 0x00;

/// Longest partition key: the tag and three varints of at most 10 bytes.
const PART_KEY_BYTES_MAX: usize = 1 + 3 * 10;

/// A partition key: tag, application, and up to two more columns. Partition keys are only
/// ever compared for equality (no scan crosses partitions), so they need no numeric order:
/// the logs and records tables write their columns as unsigned LEB128 varints, which keeps a
/// whole key, with the embedded engines' 2-byte length prefix, within the 20 bytes fjall
/// stores inline in its memtable (no heap allocation, no pointer to follow per comparison).
/// The checkpoint table keeps the fixed-width layout of key layout 1.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PartKey {
    buf: [u8; PART_KEY_BYTES_MAX],
    len: u8,
}

impl PartKey {
    /// Tag and application as a varint (logs, records and numbers).
    fn new(tag: u8, app: AppId) -> PartKey {
        PartKey::empty().push_byte(tag).push(u64::from(app.0))
    }

    /// Tag and application as `be32` (checkpoint).
    fn fixed(tag: u8, app: AppId) -> PartKey {
        PartKey::empty()
            .push_byte(tag)
            .push_be(&app.0.to_be_bytes())
    }

    fn empty() -> PartKey {
        PartKey {
            buf: [0u8; PART_KEY_BYTES_MAX],
            len: 0,
        }
    }

    fn push_byte(mut self, byte: u8) -> PartKey {
        self.buf[usize::from(self.len)] = byte;
        self.len += 1;
        self
    }

    fn push_be(mut self, bytes: &[u8]) -> PartKey {
        let at = usize::from(self.len);
        self.buf[at..at + bytes.len()].copy_from_slice(bytes);
        self.len += bytes.len() as u8;
        self
    }

    fn push(mut self, mut v: u64) -> PartKey {
        while v >= 0x80 {
            self = self.push_byte((v as u8) | 0x80);
            v >>= 7;
        }
        self.push_byte(v as u8)
    }

    pub(crate) fn as_bytes(&self) -> &[u8] {
        &self.buf[..usize::from(self.len)]
    }
}

/// The clustering column of a log entry or record inside its block: the position in the block
/// (`n mod block size`), big-endian.
pub(crate) fn block_position(n: u64, block: u64) -> [u8; 2] {
    debug_assert!(block <= 1 << 16);
    ((n % block) as u16).to_be_bytes()
}

/// Whether `n`, a WLog offset or record ID of `ws`, is where the store announces the
/// workspace's next block (of `block` numbers) to the key-value store, so that its bound is
/// learned before the block's first keys ([`monoseq_kv::KvStore::expect_inserts`]): one
/// position a block, spread over the block by the workspace's number, since workspaces written
/// at one pace reach their blocks' ends together and would otherwise all have their next
/// block's bound learned at once.
pub(crate) fn announces_next_block(ws: WsId, n: u64, block: u64) -> bool {
    // Fibonacci hashing: consecutive workspaces land far apart in the block.
    let at = (ws.0.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) % block;
    n % block == at
}

/// The number whose position in the block starting at `block_first` is `clustering`; `None`
/// unless `clustering` is 2 bytes (or the number is past `u64::MAX`).
pub(crate) fn from_block_position(block_first: u64, clustering: &[u8]) -> Option<u64> {
    let arr: [u8; 2] = clustering.try_into().ok()?;
    block_first.checked_add(u64::from(u16::from_be_bytes(arr)))
}

/// A whole key of the logs or records tables.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BlockKey {
    pub(crate) partition: PartKey,
    pub(crate) clustering: [u8; 2],
}

impl BlockKey {
    pub(crate) fn as_key(&self) -> Key<'_> {
        Key::new(self.partition.as_bytes(), &self.clustering)
    }
}

/// PLog: partition `01 app partition block` (varints; block = offset / 4 096), clustering
/// `offset mod 4 096` (be16).
pub(crate) fn plog_partition(app: AppId, partition: PartitionId, offset: PLogOffset) -> PartKey {
    PartKey::new(TAG_PLOG, app)
        .push(u64::from(partition.0))
        .push(offset.0 / LOG_BLOCK_EVENTS)
}

/// The key of the PLog entry at `offset`.
pub(crate) fn plog_key(app: AppId, partition: PartitionId, offset: PLogOffset) -> BlockKey {
    BlockKey {
        partition: plog_partition(app, partition, offset),
        clustering: block_position(offset.0, LOG_BLOCK_EVENTS),
    }
}

/// WLog: partition `02 app ws block` (varints), clustering `offset mod 4 096` (be16).
pub(crate) fn wlog_partition(app: AppId, ws: WsId, offset: WLogOffset) -> PartKey {
    PartKey::new(TAG_WLOG, app)
        .push(ws.0)
        .push(offset.0 / LOG_BLOCK_EVENTS)
}

/// The key of the WLog entry at `offset`.
pub(crate) fn wlog_key(app: AppId, ws: WsId, offset: WLogOffset) -> BlockKey {
    BlockKey {
        partition: wlog_partition(app, ws, offset),
        clustering: block_position(offset.0, LOG_BLOCK_EVENTS),
    }
}

/// The key of record `id`: partition `03 app ws id_block` (varints; id_block = id / 4 096),
/// clustering `id mod 4 096` (be16).
pub(crate) fn record_key(app: AppId, ws: WsId, id: RecordId) -> BlockKey {
    BlockKey {
        partition: PartKey::new(TAG_RECORD, app)
            .push(ws.0)
            .push(id.0 / RECORD_BLOCK_IDS),
        clustering: block_position(id.0, RECORD_BLOCK_IDS),
    }
}

/// Numbers: partition `04 app ws_block` (varints; ws_block = ws / 4 096), clustering
/// `ws mod 4 096` (be16) then `seq` (be16), value `be64`.
pub(crate) fn numbers_partition(app: AppId, ws: WsId) -> PartKey {
    PartKey::new(TAG_NUMBERS, app).push(ws.0 / NUMBERS_BLOCK_WS)
}

/// The clustering columns of the number of `seq` of `ws`, inside its numbers block.
pub(crate) fn numbers_clustering(ws: WsId, seq: SeqId) -> [u8; 4] {
    let [a, b] = block_position(ws.0, NUMBERS_BLOCK_WS);
    let [c, d] = seq.0.to_be_bytes();
    [a, b, c, d]
}

/// The lowest clustering of the numbers of workspace position `position` in its block
/// (`position` may be one past the last, 4 096, as an exclusive bound).
pub(crate) fn numbers_clustering_from(position: u64) -> [u8; 4] {
    debug_assert!(position <= NUMBERS_BLOCK_WS);
    let [a, b] = (position as u16).to_be_bytes();
    [a, b, 0, 0]
}

/// The workspace and sequence of a numbers clustering in the block of workspaces starting at
/// `block_first`; `None` unless it is 4 bytes.
pub(crate) fn from_numbers_clustering(
    block_first: u64,
    clustering: &[u8],
) -> Option<(WsId, SeqId)> {
    let [a, b, c, d]: [u8; 4] = clustering.try_into().ok()?;
    Some((
        WsId(block_first + u64::from(u16::from_be_bytes([a, b]))),
        SeqId(u16::from_be_bytes([c, d])),
    ))
}

/// Checkpoint: partition `05 app:be32 partition:be32`, empty clustering, value `be64`.
pub(crate) fn checkpoint_partition(app: AppId, partition: PartitionId) -> PartKey {
    PartKey::fixed(TAG_CHECKPOINT, app).push_be(&partition.0.to_be_bytes())
}

/// Applied end (key layout 4, the PLog in segment files): partition `08 app partition`
/// (varints), empty clustering, value `be64`: one past the last PLog offset whose WLog entry
/// and records the store holds.
pub(crate) fn applied_partition(app: AppId, partition: PartitionId) -> PartKey {
    PartKey::new(TAG_APPLIED, app).push(u64::from(partition.0))
}

/// WLog chunks (key layout 5): partition `09 app ws` (varints), clustering the chunk's first
/// WLog offset (`be64`). A workspace's chunks hold disjoint runs of offsets, so the chunk that
/// may hold an offset is the last one starting at or below it.
pub(crate) fn wlog_chunk_partition(app: AppId, ws: WsId) -> PartKey {
    PartKey::new(TAG_WLOG_CHUNK, app).push(ws.0)
}

/// Records chunks (key layout 5): partition `0a app ws bucket` (varints; bucket = ID >> 32),
/// clustering the chunk's first record ID (`be64`); disjoint runs, as WLog chunks'.
pub(crate) fn record_chunk_partition(app: AppId, ws: WsId, bucket: u64) -> PartKey {
    PartKey::new(TAG_RECORD_CHUNK, app).push(ws.0).push(bucket)
}

/// The records bucket of `id` ([`RECORD_BUCKET_BITS`]).
pub(crate) fn record_bucket(id: RecordId) -> u64 {
    id.0 >> RECORD_BUCKET_BITS
}

/// Indexed end (key layout 5): partition `0b app partition` (varints), empty clustering, value
/// `be64`: one past the last PLog offset whose WLog entry and created records' references are
/// in chunks; the events above it are indexed in memory only, and read again from the
/// segment files at start.
pub(crate) fn indexed_partition(app: AppId, partition: PartitionId) -> PartKey {
    PartKey::new(TAG_INDEXED, app).push(u64::from(partition.0))
}

/// Consumer positions: partition `06 app:varint` (every consumer of the application in one
/// storage partition, so one range read lists them all).
pub(crate) fn position_partition(app: AppId) -> PartKey {
    PartKey::new(TAG_POSITION, app)
}

/// The partition key of every consumer group's state: `07 app`; the clustering column is the
/// group's name.
pub(crate) fn group_partition(app: AppId) -> PartKey {
    PartKey::new(TAG_GROUP, app)
}

/// The clustering columns of `consumer`'s position on `partition`: the name's bytes, `00`,
/// then `partition:be32`.
pub(crate) fn position_clustering(consumer: &str, partition: PartitionId) -> Vec<u8> {
    let mut c = position_prefix(consumer);
    c.extend_from_slice(&partition.0.to_be_bytes());
    c
}

/// The clustering prefix every position of `consumer` starts with: the name's bytes, `00`.
pub(crate) fn position_prefix(consumer: &str) -> Vec<u8> {
    let mut c = Vec::with_capacity(consumer.len() + 1 + 4);
    c.extend_from_slice(consumer.as_bytes());
    c.push(CONSUMER_NAME_END);
    c
}

/// The consumer name and partition of a position's clustering columns; `None` unless they
/// are a name, `00` and 4 bytes.
pub(crate) fn from_position_clustering(clustering: &[u8]) -> Option<(&[u8], PartitionId)> {
    let end = clustering.iter().position(|&b| b == CONSUMER_NAME_END)?;
    let (name, rest) = clustering.split_at(end);
    let partition: [u8; 4] = rest.get(1..)?.try_into().ok()?;
    Some((name, PartitionId(u32::from_be_bytes(partition))))
}

/// Reads a big-endian `u64` value; `None` unless exactly 8 bytes.
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
    fn log_keys_split_into_blocks_and_keep_numeric_order_inside_one() {
        let a = plog_key(AppId(1), PartitionId(2), PLogOffset(4095));
        let b = plog_key(AppId(1), PartitionId(2), PLogOffset(4096));
        let c = plog_key(AppId(1), PartitionId(2), PLogOffset(4097));
        assert_ne!(a.partition, b.partition);
        assert_eq!(b.partition, c.partition);
        assert!(b.clustering < c.clustering);
        assert_eq!(a.partition.as_bytes(), &[1, 1, 2, 0]);
        assert_eq!(a.clustering, [0x0f, 0xff]);
        assert_eq!(b.partition.as_bytes(), &[1, 1, 2, 1]);
        assert_eq!(from_block_position(4096, &c.clustering), Some(4097));
        assert_eq!(from_block_position(4096, &[0, 0, 1]), None);
    }

    #[test]
    fn workspaces_announce_their_next_blocks_spread_over_the_block() {
        let block = LOG_BLOCK_EVENTS;
        let mut per_sixteenth = [0_u32; 16];
        for ws in 0..1000 {
            let at: Vec<u64> = (0..block)
                .filter(|&n| announces_next_block(WsId(ws), n, block))
                .collect();
            assert_eq!(at.len(), 1, "workspace {ws}: once a block");
            assert!(announces_next_block(WsId(ws), at[0] + 5 * block, block));
            per_sixteenth[(at[0] * 16 / block) as usize] += 1;
        }
        // 1 000 workspaces numbered in a row: 62.5 a sixteenth on average.
        assert!(
            per_sixteenth.iter().all(|&n| (40..=90).contains(&n)),
            "{per_sixteenth:?}"
        );
    }

    #[test]
    fn partition_keys_are_varints_and_distinct_per_column() {
        let w = wlog_partition(AppId(1), WsId(300), WLogOffset(1));
        assert_eq!(w.as_bytes(), &[2, 1, 0xac, 0x02, 0]);
        let big = wlog_partition(AppId(u32::MAX), WsId(u64::MAX), WLogOffset(u64::MAX));
        assert_eq!(big.as_bytes().len(), 1 + 5 + 10 + 8);
        // Varints are prefix-free, so different columns never give the same partition key.
        assert_ne!(
            wlog_partition(AppId(1), WsId(0x80), WLogOffset(1)).as_bytes(),
            wlog_partition(AppId(0x80), WsId(1), WLogOffset(1)).as_bytes()
        );
        assert_eq!(numbers_partition(AppId(1), WsId(3)).as_bytes(), &[4, 1, 0]);
        assert_eq!(
            checkpoint_partition(AppId(1), PartitionId(2)).as_bytes(),
            &[5, 0, 0, 0, 1, 0, 0, 0, 2]
        );
    }

    #[test]
    fn keys_of_realistic_ids_fit_the_inline_size_of_the_embedded_engine() {
        // Workspace IDs of the reference platform are around 2^47; record IDs start at
        // 322 680 000 131 072. With the 2-byte partition length the embedded engines add,
        // the whole key stays within 20 bytes.
        let ws = WsId(140_737_488_486_400);
        let record = record_key(AppId(1), ws, RecordId(322_685_000_131_072));
        let wlog = wlog_key(AppId(1), ws, WLogOffset(1 << 30));
        let plog = plog_key(AppId(1), PartitionId(1000), PLogOffset(1 << 40));
        for key in [record, wlog, plog] {
            let k = key.as_key();
            assert!(2 + k.partition.len() + k.clustering.len() <= 20, "{k}");
        }
    }

    #[test]
    fn neighbouring_workspaces_share_a_numbers_partition_in_workspace_then_sequence_order() {
        let (a, b) = (WsId(4095), WsId(4096));
        assert_ne!(
            numbers_partition(AppId(1), a),
            numbers_partition(AppId(1), b)
        );
        assert_eq!(
            numbers_partition(AppId(1), b),
            numbers_partition(AppId(1), WsId(8191))
        );
        let first = numbers_clustering(WsId(4097), SeqId(300));
        let second = numbers_clustering(WsId(4098), SeqId(1));
        assert!(first < second);
        assert!(numbers_clustering_from(1) <= first && first < numbers_clustering_from(2));
        assert_eq!(
            from_numbers_clustering(4096, &first),
            Some((WsId(4097), SeqId(300)))
        );
        assert_eq!(from_numbers_clustering(4096, &first[..3]), None);
        // The whole key of a realistic workspace stays within fjall's inline size.
        let ws = WsId(140_737_488_486_400);
        let part = numbers_partition(AppId(1), ws);
        assert!(2 + part.as_bytes().len() + 4 <= 20);
    }

    #[test]
    fn one_consumers_positions_are_contiguous_and_in_partition_order() {
        assert_eq!(position_partition(AppId(1)).as_bytes(), &[6, 1]);
        let a = position_clustering("a", PartitionId(7));
        let a_last = position_clustering("a", PartitionId(u32::MAX));
        let ab = position_clustering("ab", PartitionId(0));
        let space = position_clustering("a ", PartitionId(0));
        assert_eq!(a, [b'a', 0, 0, 0, 0, 7]);
        // Every position of "a" sorts before those of any longer name starting with "a".
        assert!(a < a_last && a_last < space && a_last < ab);
        assert!(a.starts_with(&position_prefix("a")));
        assert!(!ab.starts_with(&position_prefix("a")));
        assert_eq!(
            from_position_clustering(&a),
            Some((&b"a"[..], PartitionId(7)))
        );
        assert_eq!(from_position_clustering(&a[..5]), None);
        assert_eq!(from_position_clustering(b"abc"), None);
    }

    #[test]
    fn records_of_one_workspace_share_a_partition_per_id_block() {
        let a = record_key(AppId(1), WsId(3), RecordId(322_685_000_131_072));
        let b = record_key(AppId(1), WsId(3), RecordId(322_685_000_131_073));
        assert_eq!(a.partition, b.partition);
        assert!(a.clustering < b.clustering);
    }
}
