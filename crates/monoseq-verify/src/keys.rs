//! The event store's key layouts 3, 4 and 5 as `docs/format.md` documents them, rebuilt here
//! because `monoseq-store` keeps its partition keys private: building the partition key of a
//! PLog, WLog, records or numbers block, the checkpoint, applied-end (layouts 4 and 5), WLog
//! chunks, records chunks and indexed-end (layout 5) and server-metadata keys, and parsing a
//! listed partition key back into its table and columns. Unit tests check every key against
//! the ones `monoseq_store::EventStore` writes.

use monoseq_store::{AppId, LOG_BLOCK_EVENTS, RECORD_BLOCK_IDS, RECORD_BUCKET_BITS};

/// Workspaces per numbers block (`NUMBERS_BLOCK_WS` in `docs/format.md`).
pub(crate) const NUMBERS_BLOCK_WS: u64 = 4096;

pub(crate) const TAG_PLOG: u8 = 0x01;
pub(crate) const TAG_WLOG: u8 = 0x02;
pub(crate) const TAG_RECORD: u8 = 0x03;
pub(crate) const TAG_NUMBERS: u8 = 0x04;
const TAG_CHECKPOINT: u8 = 0x05;
const TAG_APPLIED: u8 = 0x08;
const TAG_WLOG_CHUNK: u8 = 0x09;
const TAG_RECORD_CHUNK: u8 = 0x0a;
const TAG_INDEXED: u8 = 0x0b;

/// The server's metadata partition and its clustering keys ("Other keys" in
/// `docs/format.md`; `store_id` is written by `monoseq_store::open_data_dir`).
pub(crate) const META_PARTITION: &[u8] = b"monoseq/meta";
pub(crate) const META_PARTITIONS: &[u8] = b"partitions";
pub(crate) const META_KEY_LAYOUT: &[u8] = b"key_layout";
pub(crate) const META_STORE_ID: &[u8] = b"store_id";

fn push_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Reads one unsigned LEB128 varint of at most 10 bytes; `None` when it is truncated or too
/// long.
fn read_varint(bytes: &mut &[u8]) -> Option<u64> {
    let mut v = 0u64;
    for (i, &b) in bytes.iter().enumerate().take(10) {
        if i == 9 && b > 1 {
            return None;
        }
        v |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            *bytes = bytes.get(i + 1..)?;
            return Some(v);
        }
    }
    None
}

fn partition_key(tag: u8, app: AppId, columns: &[u64]) -> Vec<u8> {
    let mut key = Vec::with_capacity(1 + 5 + 10 * columns.len());
    key.push(tag);
    push_varint(&mut key, u64::from(app.0));
    for &c in columns {
        push_varint(&mut key, c);
    }
    key
}

/// The partition key of PLog block `block` (offsets `block × 4096 ..`) of `partition`.
pub(crate) fn plog_block(app: AppId, partition: u32, block: u64) -> Vec<u8> {
    partition_key(TAG_PLOG, app, &[u64::from(partition), block])
}

/// The partition key of WLog block `block` of workspace `ws`.
pub(crate) fn wlog_block(app: AppId, ws: u64, block: u64) -> Vec<u8> {
    partition_key(TAG_WLOG, app, &[ws, block])
}

/// The partition key of records block `block` (IDs `block × 4096 ..`) of workspace `ws`.
pub(crate) fn record_block(app: AppId, ws: u64, block: u64) -> Vec<u8> {
    partition_key(TAG_RECORD, app, &[ws, block])
}

/// The partition key of numbers block `block` (workspaces `block × 4096 ..`).
pub(crate) fn numbers_block(app: AppId, block: u64) -> Vec<u8> {
    partition_key(TAG_NUMBERS, app, &[block])
}

/// The partition key of `partition`'s checkpoint (fixed-width columns; empty clustering).
pub(crate) fn checkpoint(app: AppId, partition: u32) -> Vec<u8> {
    let mut key = Vec::with_capacity(9);
    key.push(TAG_CHECKPOINT);
    key.extend_from_slice(&app.0.to_be_bytes());
    key.extend_from_slice(&partition.to_be_bytes());
    key
}

/// The partition key of `partition`'s applied end (key layout 4; empty clustering, value
/// `be64`: one past the last PLog offset whose WLog entries and records the engine holds).
pub(crate) fn applied(app: AppId, partition: u32) -> Vec<u8> {
    partition_key(TAG_APPLIED, app, &[u64::from(partition)])
}

/// The partition key of workspace `ws`'s WLog chunks (key layout 5; clustering: the first WLog
/// offset of the chunk's run, `be64`).
pub(crate) fn wlog_chunks(app: AppId, ws: u64) -> Vec<u8> {
    partition_key(TAG_WLOG_CHUNK, app, &[ws])
}

/// The partition key of workspace `ws`'s records chunks of bucket `bucket` (key layout 5;
/// clustering: the first record ID of the chunk's run, `be64`).
pub(crate) fn record_chunks(app: AppId, ws: u64, bucket: u64) -> Vec<u8> {
    partition_key(TAG_RECORD_CHUNK, app, &[ws, bucket])
}

/// The partition key of `partition`'s indexed end (key layout 5; empty clustering, value
/// `be64`: one past the last PLog offset whose WLog entries and created records' references
/// are in chunks).
pub(crate) fn indexed(app: AppId, partition: u32) -> Vec<u8> {
    partition_key(TAG_INDEXED, app, &[u64::from(partition)])
}

/// The records bucket of record ID `id`: the partition key of the records chunks that may
/// hold it.
pub(crate) fn record_bucket(id: u64) -> u64 {
    id >> RECORD_BUCKET_BITS
}

/// The first number of a chunk's run, from its clustering; `None` unless it is 8 bytes.
pub(crate) fn chunk_start(clustering: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(clustering.try_into().ok()?))
}

/// The clustering column of `n` inside its block of the logs or records: `n mod 4096`, be16.
pub(crate) fn position(n: u64) -> [u8; 2] {
    ((n % LOG_BLOCK_EVENTS) as u16).to_be_bytes()
}

/// The number at clustering `clustering` of block `block`; `None` unless it is 2 bytes.
pub(crate) fn at_position(block: u64, clustering: &[u8]) -> Option<u64> {
    let arr: [u8; 2] = clustering.try_into().ok()?;
    Some(block * LOG_BLOCK_EVENTS + u64::from(u16::from_be_bytes(arr)))
}

/// The block a log offset sits in.
pub(crate) fn log_block_of(offset: u64) -> u64 {
    offset / LOG_BLOCK_EVENTS
}

/// The block a record ID sits in.
pub(crate) fn record_block_of(id: u64) -> u64 {
    id / RECORD_BLOCK_IDS
}

/// The workspace and sequence of a numbers clustering in block `block`; `None` unless it is
/// 4 bytes.
pub(crate) fn numbers_at(block: u64, clustering: &[u8]) -> Option<(u64, u16)> {
    let [a, b, c, d]: [u8; 4] = clustering.try_into().ok()?;
    Some((
        block * NUMBERS_BLOCK_WS + u64::from(u16::from_be_bytes([a, b])),
        u16::from_be_bytes([c, d]),
    ))
}

/// A listed partition key of the event store, parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Listed {
    /// A PLog block: partition, block.
    PLog(u32, u64),
    /// A WLog block: workspace, block.
    WLog(u64, u64),
    /// A records block: workspace, block.
    Record(u64, u64),
    /// A numbers block.
    Numbers(u64),
    /// A partition's applied end (key layouts 4 and 5).
    Applied(u32),
    /// A workspace's WLog chunks (key layout 5).
    WLogChunks(u64),
    /// A workspace's records chunks of one bucket (key layout 5): workspace, bucket.
    RecordChunks(u64, u64),
    /// A partition's indexed end (key layout 5).
    Indexed(u32),
}

/// Parses a partition key of the logs, records, numbers, applied ends, chunks or indexed ends
/// of `app`; `None` for keys of other tables or applications, or keys that do not parse.
pub(crate) fn parse(app: AppId, key: &[u8]) -> Option<Listed> {
    let (&tag, mut rest) = key.split_first()?;
    if !matches!(
        tag,
        TAG_PLOG
            | TAG_WLOG
            | TAG_RECORD
            | TAG_NUMBERS
            | TAG_APPLIED
            | TAG_WLOG_CHUNK
            | TAG_RECORD_CHUNK
            | TAG_INDEXED
    ) {
        return None;
    }
    if read_varint(&mut rest)? != u64::from(app.0) {
        return None;
    }
    let a = read_varint(&mut rest)?;
    if rest.is_empty() {
        return parse_one_column(tag, a);
    }
    let b = read_varint(&mut rest)?;
    if !rest.is_empty() {
        return None;
    }
    match tag {
        TAG_PLOG => Some(Listed::PLog(u32::try_from(a).ok()?, b)),
        TAG_WLOG => Some(Listed::WLog(a, b)),
        TAG_RECORD => Some(Listed::Record(a, b)),
        TAG_RECORD_CHUNK => Some(Listed::RecordChunks(a, b)),
        _ => None,
    }
}

/// A partition key of table `tag` whose only column (after the application) is `a`.
fn parse_one_column(tag: u8, a: u64) -> Option<Listed> {
    match tag {
        TAG_NUMBERS => Some(Listed::Numbers(a)),
        TAG_APPLIED => Some(Listed::Applied(u32::try_from(a).ok()?)),
        TAG_WLOG_CHUNK => Some(Listed::WLogChunks(a)),
        TAG_INDEXED => Some(Listed::Indexed(u32::try_from(a).ok()?)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use monoseq_core::{PLogOffset, WsId};
    use monoseq_kv::MemoryStore;
    use monoseq_store::{EventStore, PartitionId, RecordId, TrustLevel, WLogOffset};

    use super::*;

    #[test]
    fn keys_match_the_ones_the_event_store_writes() {
        let app = AppId(300);
        let store = EventStore::new(Arc::new(MemoryStore::new()), app, TrustLevel::Level0);
        for offset in [1u64, 4095, 4096, 1 << 40] {
            let k = store.plog_key(PartitionId(7), PLogOffset(offset));
            assert_eq!(k.partition, plog_block(app, 7, log_block_of(offset)));
            assert_eq!(k.clustering, position(offset));
            assert_eq!(
                at_position(log_block_of(offset), &k.clustering),
                Some(offset)
            );
            let k = store.wlog_key(WsId(1 << 47), WLogOffset(offset));
            assert_eq!(k.partition, wlog_block(app, 1 << 47, log_block_of(offset)));
            assert_eq!(k.clustering, position(offset));
        }
        let id = 322_685_000_131_072u64;
        let k = store.record_key(WsId(9), RecordId(id));
        assert_eq!(k.partition, record_block(app, 9, record_block_of(id)));
        assert_eq!(k.clustering, position(id));
    }

    #[test]
    fn listed_partition_keys_parse_back_to_their_columns() {
        let app = AppId(1);
        assert_eq!(parse(app, &plog_block(app, 3, 9)), Some(Listed::PLog(3, 9)));
        assert_eq!(
            parse(app, &wlog_block(app, u64::MAX, 2)),
            Some(Listed::WLog(u64::MAX, 2))
        );
        assert_eq!(
            parse(app, &record_block(app, 300, 78_000_000_000)),
            Some(Listed::Record(300, 78_000_000_000))
        );
        assert_eq!(parse(app, &numbers_block(app, 5)), Some(Listed::Numbers(5)));
        assert_eq!(parse(app, &applied(app, 300)), Some(Listed::Applied(300)));
        assert_eq!(
            parse(app, &wlog_chunks(app, 1 << 47)),
            Some(Listed::WLogChunks(1 << 47))
        );
        assert_eq!(
            parse(app, &record_chunks(app, 9, 75_131)),
            Some(Listed::RecordChunks(9, 75_131))
        );
        assert_eq!(parse(app, &indexed(app, 2)), Some(Listed::Indexed(2)));
        // A column too many or too few.
        assert_eq!(
            parse(app, &partition_key(TAG_WLOG_CHUNK, app, &[9, 1])),
            None
        );
        assert_eq!(
            parse(app, &partition_key(TAG_RECORD_CHUNK, app, &[9])),
            None
        );
        assert_eq!(parse(app, &partition_key(TAG_PLOG, app, &[3])), None);
        assert_eq!(parse(AppId(2), &plog_block(app, 3, 9)), None);
        assert_eq!(parse(app, &checkpoint(app, 3)), None);
        assert_eq!(parse(app, META_PARTITION), None);
        let mut long = plog_block(app, 3, 9);
        long.push(0);
        assert_eq!(parse(app, &long), None);
        assert_eq!(parse(app, &[TAG_PLOG, 1, 0x80]), None);
    }
}
