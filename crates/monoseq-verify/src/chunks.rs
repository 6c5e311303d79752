//! Key layout 5's index in chunks, as `docs/format.md` documents it: a partition's WLog entries
//! and created records' references are written every so many events as one key per workspace
//! (and records bucket) and run, with the partition's indexed end; those of later events are
//! held in memory only while the server runs (a restart reads them back from the segment
//! files), so no chunk may hold them. This module reads:
//!
//! - each partition's indexed end ([`read_indexed`]), at most its applied end
//!   ([`check_indexed`]);
//! - every WLog chunk of each workspace ([`wlog_chunks`]): each entry an event names subtracts
//!   from the workspace's digest as a layout 4 entry does, entries no event names are orphans,
//!   and in comparison mode the entry a chunk holds for one event is compared with it
//!   ([`compare_event`]);
//! - every records chunk of each workspace and bucket ([`record_chunks`]): each reference is
//!   checked against the event that created its record, as a layout 4 reference is.
//!
//! A chunk must decode and hold the run its key names (its first entry at its key, inside its
//! records bucket, ending before the next chunk's run starts: the store looks an offset or ID
//! up in the last chunk starting at or below it); no chunk may hold the entry of an event at or
//! above its partition's indexed end.

use std::collections::HashSet;
use std::ops::{Bound, ControlFlow, Range};

use monoseq_core::PLogOffset;
use monoseq_kv::{Key, KvError, KvStore, Order};
use monoseq_store::{
    AppId, ChunkedRecord, ChunkedWLog, LOG_BLOCK_EVENTS, PartitionId, RECORD_BUCKET_BITS,
    RecordRef, decode_record_chunk, decode_wlog_chunk,
};

use crate::keys;
use crate::listing::PartitionList;
use crate::problem::{ChunkTable, Problem};
use crate::record::{ExpectedRecord, Place, reference_found};
use crate::source::{Source, describe_entry, report, scan_all, union};
use crate::state::{PartitionState, Problems, RecordState, State, differing, entry_hash, mark_of};
use crate::{Progress, Stage};

// -- Indexed ends ---------------------------------------------------------------------------------

/// The indexed end the engine records for `partition`: 1 when it records none (no chunk
/// written yet: every event's entries are held); `None`, reported, when it is damaged or
/// cannot be read (then which events the chunks hold is unknown).
pub(crate) fn read_indexed(
    kv: &impl KvStore,
    app: AppId,
    partition: u32,
    problems: &mut Problems,
) -> Option<u64> {
    let key = keys::indexed(app, partition);
    match kv.get(Key::new(&key, &[])) {
        Ok(None) => Some(1),
        Ok(Some(v)) => match <[u8; 8]>::try_from(v.as_slice()) {
            Ok(b) => Some(u64::from_be_bytes(b)),
            Err(_) => {
                problems.push(Problem::IndexedDamaged {
                    partition,
                    len: v.len(),
                });
                None
            }
        },
        Err(e) => {
            problems.unreadable(format!("the indexed end of partition {partition}"), &e);
            None
        }
    }
}

/// Each partition's indexed end against its applied end: the two move in one batch when a
/// chunk is written, and the indexed end never passes the applied end.
pub(crate) fn check_indexed(state: &State, problems: &mut Problems) {
    for (p, part) in state.partitions.iter().enumerate() {
        if let (Some(indexed), Some(applied)) = (part.indexed, part.applied)
            && indexed > applied
        {
            problems.push(Problem::IndexedAhead {
                partition: p as u32,
                indexed,
                applied,
            });
        }
    }
}

/// The indexed end of `partition` when PLog offset `plog` is at or above it (then no chunk may
/// hold the entries of that event); `None` otherwise, or for a partition the store does not
/// have.
fn ahead_of_indexed(partitions: &[PartitionState], partition: u32, plog: u64) -> Option<u64> {
    partitions
        .get(partition as usize)
        .and_then(|p| p.indexed)
        .filter(|&indexed| plog >= indexed)
}

// -- Reading and judging chunks -------------------------------------------------------------------

/// A stored key's clustering and value.
type Stored = (Vec<u8>, Vec<u8>);

/// One stored chunk as read: its clustering (its run's first number, `be64`), its value, and
/// where the run of the chunk after it starts (`None`: it is the last, or that key is damaged).
struct Chunk<'c> {
    clustering: &'c [u8],
    value: &'c [u8],
    next: Option<u64>,
}

/// Reads every chunk of partition `part` in key order, calling `visit` with each one once the
/// key after it is known (a chunk's run must end before the next one's starts).
fn scan_chunks<S: KvStore>(
    kv: &S,
    part: &[u8],
    visit: &mut dyn FnMut(&Chunk<'_>),
) -> Result<(), KvError> {
    let mut before: Option<Stored> = None;
    let read = scan_all(kv, part, &mut |clustering, value| {
        if let Some((c, v)) = before.take() {
            visit(&Chunk {
                clustering: &c,
                value: &v,
                next: keys::chunk_start(clustering),
            });
        }
        before = Some((clustering.to_vec(), value.to_vec()));
    });
    if let Some((c, v)) = before {
        visit(&Chunk {
            clustering: &c,
            value: &v,
            next: None,
        });
    }
    read
}

/// A WLog chunk whose key names `first`, the next chunk's run starting at `next`: its
/// partition and entries when it decodes and holds the run its key names; else what is wrong
/// with it.
fn judge_wlog(
    first: u64,
    value: &[u8],
    next: Option<u64>,
) -> Result<(u32, Vec<ChunkedWLog>), String> {
    let (partition, entries) =
        decode_wlog_chunk(value).map_err(|e| format!("it does not decode: {e}"))?;
    let run = entries.first().zip(entries.last());
    check_run(
        first,
        run.map(|(a, b)| (a.offset, b.offset)),
        next,
        ChunkTable::WLog,
    )?;
    Ok((partition.0, entries))
}

/// A records chunk of bucket `bucket` whose key names `first`, the next chunk's run starting
/// at `next`: its partition and entries when it decodes and holds the run its key names,
/// inside its bucket; else what is wrong with it.
fn judge_records(
    first: u64,
    bucket: u64,
    value: &[u8],
    next: Option<u64>,
) -> Result<(u32, Vec<ChunkedRecord>), String> {
    let (partition, entries) =
        decode_record_chunk(value).map_err(|e| format!("it does not decode: {e}"))?;
    let run = entries
        .first()
        .zip(entries.last())
        .map(|(a, b)| (a.id, b.id));
    check_run(first, run, next, ChunkTable::Records)?;
    if let Some(outside) = run
        .into_iter()
        .flat_map(|(a, b)| [a, b])
        .find(|&id| keys::record_bucket(id) != bucket)
    {
        return Err(format!(
            "it holds record {outside}, outside its bucket {bucket}"
        ));
    }
    Ok((partition.0, entries))
}

/// A chunk's run `run` (its first and last numbers; `None`: no entry) against its key's
/// `first` and the next chunk's start `next`.
fn check_run(
    first: u64,
    run: Option<(u64, u64)>,
    next: Option<u64>,
    table: ChunkTable,
) -> Result<(), String> {
    let item = table.item();
    let Some((from, to)) = run else {
        return Err("it holds no entry".to_owned());
    };
    if from != first {
        return Err(format!("its first entry is {item} {from}"));
    }
    match next {
        Some(next) if to >= next => Err(format!(
            "its run reaches {item} {to}, past {next}, where the next chunk's run starts"
        )),
        _ => Ok(()),
    }
}

/// A chunk whose key is not the 8 bytes of its run's first number: no lookup finds it.
fn bad_key(table: ChunkTable, ws: u64, first: u64, len: usize) -> Problem {
    Problem::ChunkDamaged {
        table,
        ws,
        first,
        detail: format!("its key has {len} clustering bytes where 8 belong"),
    }
}

// -- WLog chunks ----------------------------------------------------------------------------------

/// Reads the WLog chunks of every workspace the events name (or every one the list names):
/// entries the workspace's events name subtract from its digest, as layout 4's entries do;
/// entries no event names are orphans (unless an accepted loss retired their offsets);
/// entries naming events at or above their partition's indexed end are ahead; damaged chunks
/// are reported (their entries subtract nothing). With a list, WLog entries under keys of
/// their own, which layout 5 never writes, are orphans too. Returns the workspaces whose
/// digests do not come to 0.
pub(crate) fn wlog_chunks<S: KvStore>(
    src: &Source<'_, S>,
    state: &mut State,
    problems: &mut Problems,
    progress: &mut dyn FnMut(Progress),
) -> HashSet<u64> {
    let wss = wlog_chunk_workspaces(src, state);
    let total = wss.len() as u64;
    for (done, &ws) in wss.iter().enumerate() {
        let part = keys::wlog_chunks(src.app, ws);
        let read = scan_chunks(src.kv, &part, &mut |chunk| {
            wlog_chunk(state, ws, chunk, problems);
        });
        if let Err(e) = read {
            problems.unreadable(format!("the WLog chunks of workspace {ws}"), &e);
        }
        report(progress, Stage::WLog, done as u64 + 1, total);
    }
    if let Some(list) = src.list {
        stray_wlog_entries(src, list, problems);
    }
    differing(state)
}

/// The workspaces whose WLog chunks to read, in order: every one the list names, or every one
/// the events name.
fn wlog_chunk_workspaces<S: KvStore>(src: &Source<'_, S>, state: &State) -> Vec<u64> {
    if let Some(list) = src.list {
        return list.wlog_chunks.clone();
    }
    let mut wss: Vec<u64> = state.workspaces.keys().copied().collect();
    wss.sort_unstable();
    wss
}

/// One WLog chunk of workspace `ws`: damaged, or each of its entries checked.
fn wlog_chunk(state: &mut State, ws: u64, chunk: &Chunk<'_>, problems: &mut Problems) {
    let Some(first) = keys::chunk_start(chunk.clustering) else {
        return problems.push(bad_key(ChunkTable::WLog, ws, 0, chunk.clustering.len()));
    };
    match judge_wlog(first, chunk.value, chunk.next) {
        Err(detail) => problems.push(Problem::ChunkDamaged {
            table: ChunkTable::WLog,
            ws,
            first,
            detail,
        }),
        Ok((partition, entries)) => {
            let retired = mark_of(&state.retired_of(ws), 0);
            for e in entries {
                wlog_chunk_entry(state, ws, (first, partition), e, retired, problems);
            }
        }
    }
}

/// Entry `e` of the WLog chunk of workspace `ws` whose run starts at `first`, of `partition`:
/// ahead of the partition's indexed end, subtracted from the digest when an event names its
/// offset, else an orphan unless at or below the retired WLog offset `retired`.
fn wlog_chunk_entry(
    state: &mut State,
    ws: u64,
    (first, partition): (u64, u32),
    e: ChunkedWLog,
    retired: u64,
    problems: &mut Problems,
) {
    if let Some(indexed) = ahead_of_indexed(&state.partitions, partition, e.plog) {
        return problems.push(Problem::ChunkAhead {
            table: ChunkTable::WLog,
            ws,
            number: e.offset,
            partition,
            offset: e.plog,
            indexed,
        });
    }
    match state.workspaces.get_mut(&ws) {
        Some(w) if w.names_wlog(e.offset) => {
            let hash = entry_hash(e.offset, partition, e.plog, e.crc);
            w.wlog_digest = w.wlog_digest.wrapping_sub(hash);
        }
        _ if e.offset <= retired => {}
        _ => problems.push(Problem::WLogOrphan {
            ws,
            wlog: e.offset,
            detail: describe_chunked(first, partition, e),
        }),
    }
}

/// What entry `e` of a WLog chunk of `partition` whose run starts at `first` says, for
/// messages.
fn describe_chunked(first: u64, partition: u32, e: ChunkedWLog) -> String {
    format!(
        "the WLog chunk whose run starts at WLog offset {first} refers to PLog offset {} of \
         partition {partition}",
        e.plog
    )
}

/// Key layout 5 writes no WLog entry under a key of its own: each one in the WLog blocks the
/// list names is an orphan.
fn stray_wlog_entries<S: KvStore>(
    src: &Source<'_, S>,
    list: &PartitionList,
    problems: &mut Problems,
) {
    for &(ws, block) in &list.wlog {
        let part = keys::wlog_block(src.app, ws, block);
        let read = scan_all(src.kv, &part, &mut |clustering, value| {
            problems.push(Problem::WLogOrphan {
                ws,
                wlog: keys::at_position(block, clustering)
                    .unwrap_or(block.saturating_mul(LOG_BLOCK_EVENTS)),
                detail: format!(
                    "an entry under a key of its own, which a key layout 5 store never writes: {}",
                    describe_entry(value)
                ),
            });
        });
        if let Err(e) = read {
            problems.unreadable(format!("WLog block {block} of workspace {ws}"), &e);
        }
    }
}

/// An event whose WLog entry is compared with it: its workspace and WLog offset, its
/// partition and PLog offset, and the checksum in its header.
pub(crate) struct EventAt {
    pub(crate) ws: u64,
    pub(crate) wlog: u64,
    pub(crate) partition: u32,
    pub(crate) offset: u64,
    pub(crate) crc: u32,
}

/// The WLog chunk that may hold an offset.
enum Covering {
    /// No chunk starts at or below it.
    None,
    /// That chunk is damaged (reported by [`wlog_chunks`]).
    Damaged,
    /// That chunk: the first offset of its run, its partition and its entries.
    Chunk {
        first: u64,
        partition: u32,
        entries: Vec<ChunkedWLog>,
    },
}

/// The WLog chunk of one workspace that holds the offsets being compared, kept for the next
/// ones: a workspace's events come in ascending WLog offsets, so each chunk is read once.
pub(crate) struct WLogCursor {
    ws: u64,
    /// The offsets `covering` covers: from, and up to (excluded) where the next chunk starts.
    span: Option<(u64, Option<u64>)>,
    covering: Covering,
}

impl WLogCursor {
    /// A cursor over workspace `ws`'s WLog chunks, nothing read yet.
    pub(crate) fn new(ws: u64) -> WLogCursor {
        WLogCursor {
            ws,
            span: None,
            covering: Covering::None,
        }
    }

    /// The chunk that may hold WLog offset `wlog`: the last one starting at or below it,
    /// judged as [`wlog_chunks`] judges it.
    fn at<S: KvStore>(&mut self, kv: &S, app: AppId, wlog: u64) -> Result<&Covering, KvError> {
        let covered = self
            .span
            .is_some_and(|(from, to)| from <= wlog && to.is_none_or(|to| wlog < to));
        if !covered {
            let part = keys::wlog_chunks(app, self.ws);
            let below = first_in(kv, &part, wlog, Order::Descending)?;
            let next = first_in(kv, &part, wlog, Order::Ascending)?
                .and_then(|(clustering, _)| keys::chunk_start(&clustering));
            let (from, covering) = match below {
                None => (0, Covering::None),
                Some((clustering, value)) => match keys::chunk_start(&clustering) {
                    None => (wlog, Covering::Damaged),
                    Some(first) => (first, judged(first, &value, next)),
                },
            };
            self.span = Some((from, next));
            self.covering = covering;
        }
        Ok(&self.covering)
    }
}

/// A WLog chunk as [`WLogCursor`] keeps it.
fn judged(first: u64, value: &[u8], next: Option<u64>) -> Covering {
    match judge_wlog(first, value, next) {
        Ok((partition, entries)) => Covering::Chunk {
            first,
            partition,
            entries,
        },
        Err(_) => Covering::Damaged,
    }
}

/// The first chunk of `part` in `order` from `at`: starting at or below it (descending), or
/// above it (ascending); its clustering and value.
fn first_in<S: KvStore>(
    kv: &S,
    part: &[u8],
    at: u64,
    order: Order,
) -> Result<Option<Stored>, KvError> {
    let at = at.to_be_bytes();
    let (from, to) = match order {
        Order::Descending => (Bound::Unbounded, Bound::Included(&at[..])),
        _ => (Bound::Excluded(&at[..]), Bound::Unbounded),
    };
    let mut found = None;
    kv.scan(part, from, to, order, &mut |clustering, value| {
        found = Some((clustering.to_vec(), value.to_vec()));
        ControlFlow::Break(())
    })?;
    Ok(found)
}

/// The entry the chunks hold for the event `at` (its chunk's first offset and partition with
/// it), `Some(None)` when none does; `None` when the chunk that would is damaged (reported
/// already) or cannot be read (reported here).
fn chunk_entry<S: KvStore>(
    src: &Source<'_, S>,
    cursor: &mut WLogCursor,
    at: &EventAt,
    problems: &mut Problems,
) -> Option<Option<(u64, u32, ChunkedWLog)>> {
    let covering = match cursor.at(src.kv, src.app, at.wlog) {
        Ok(covering) => covering,
        Err(e) => {
            let what = format!(
                "the WLog chunk of workspace {} that may hold WLog offset {}",
                at.ws, at.wlog
            );
            problems.unreadable(what, &e);
            return None;
        }
    };
    match covering {
        Covering::Damaged => None,
        Covering::None => Some(None),
        Covering::Chunk {
            first,
            partition,
            entries,
        } => Some(
            entries
                .binary_search_by_key(&at.wlog, |e| e.offset)
                .ok()
                .and_then(|i| entries.get(i))
                .map(|&e| (*first, *partition, e)),
        ),
    }
}

/// Compares the entry the chunks hold for the event `at` with it (comparison mode, for a
/// workspace whose digest differs): an event below its partition's indexed end has an entry
/// naming it (partition, PLog offset, checksum), unless its chunk is damaged (reported
/// already) or it is not applied yet; an event at or above it has none.
pub(crate) fn compare_event<S: KvStore>(
    src: &Source<'_, S>,
    cursor: &mut WLogCursor,
    partitions: &[PartitionState],
    at: &EventAt,
    problems: &mut Problems,
) {
    let Some(entry) = chunk_entry(src, cursor, at, problems) else {
        return;
    };
    let part = partitions.get(at.partition as usize);
    match (entry, part.and_then(|p| p.indexed)) {
        (None, _) if part.is_some_and(|p| p.may_lack_chunk_entry(at.offset)) => {}
        (None, _) => problems.push(Problem::WLogMissing {
            ws: at.ws,
            wlog: at.wlog,
            partition: at.partition,
            offset: at.offset,
        }),
        // An entry naming a PLog offset at or above its own partition's indexed end was
        // reported as it was read.
        (Some((_, partition, e)), Some(indexed)) if at.offset >= indexed => {
            if ahead_of_indexed(partitions, partition, e.plog).is_none() {
                problems.push(Problem::ChunkAhead {
                    table: ChunkTable::WLog,
                    ws: at.ws,
                    number: at.wlog,
                    partition: at.partition,
                    offset: at.offset,
                    indexed,
                });
            }
        }
        (Some((_, partition, e)), _)
            if partition == at.partition && e.plog == at.offset && e.crc == at.crc => {}
        (Some((first, partition, e)), _) => {
            let checksum = if partition == at.partition && e.plog == at.offset {
                ", with another checksum"
            } else {
                ""
            };
            problems.push(Problem::WLogDiffers {
                ws: at.ws,
                wlog: at.wlog,
                partition: at.partition,
                offset: at.offset,
                detail: format!("{}{checksum}", describe_chunked(first, partition, e)),
            });
        }
    }
}

// -- Records chunks -------------------------------------------------------------------------------

/// What the records chunks hold of one record an event created or updated.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum InChunk {
    /// No chunk holds it.
    #[default]
    Absent,
    /// The chunk that may hold it holds a reference to the event that created it.
    Found,
    /// The chunk that may hold it holds it wrongly, or is damaged: reported already.
    Reported,
}

/// Reads the records chunks of every workspace and bucket the expected records (sorted by
/// workspace and ID) fall in, and every one the list names, and checks each reference against
/// the event that created its record, as a layout 4 reference is checked. Returns, for each
/// expected record, what the chunks hold of it.
pub(crate) fn record_chunks<S: KvStore>(
    src: &Source<'_, S>,
    state: &State,
    expected: &[ExpectedRecord],
    problems: &mut Problems,
    progress: &mut dyn FnMut(Progress),
) -> Vec<InChunk> {
    let mut marks = vec![InChunk::Absent; expected.len()];
    let buckets = union(
        expected
            .iter()
            .map(|&((ws, id), _)| (ws, keys::record_bucket(id))),
        src.list
            .map(|l| l.record_chunks.clone())
            .unwrap_or_default(),
    );
    let total = buckets.len() as u64;
    for (done, &(ws, bucket)) in buckets.iter().enumerate() {
        let mut check = BucketCheck {
            state,
            expected,
            marks: &mut marks,
            at: Place::of(state, ws, true),
            bucket,
        };
        let part = keys::record_chunks(src.app, ws, bucket);
        let read = scan_chunks(src.kv, &part, &mut |chunk| check.chunk(chunk, problems));
        if let Err(e) = read {
            problems.unreadable(
                format!("the records chunks of bucket {bucket} of workspace {ws}"),
                &e,
            );
        }
        report(progress, Stage::Records, done as u64 + 1, total);
    }
    marks
}

/// One workspace's records chunks of one bucket, checked against the expected records.
struct BucketCheck<'v> {
    state: &'v State,
    expected: &'v [ExpectedRecord],
    marks: &'v mut [InChunk],
    at: Place,
    bucket: u64,
}

impl BucketCheck<'_> {
    /// One chunk: damaged (the records its run may hold are then reported with it), or each
    /// of its entries checked.
    fn chunk(&mut self, chunk: &Chunk<'_>, problems: &mut Problems) {
        let (ws, bucket) = (self.at.ws, self.bucket);
        let Some(first) = keys::chunk_start(chunk.clustering) else {
            let first = bucket.saturating_mul(1 << RECORD_BUCKET_BITS);
            return problems.push(bad_key(
                ChunkTable::Records,
                ws,
                first,
                chunk.clustering.len(),
            ));
        };
        match judge_records(first, bucket, chunk.value, chunk.next) {
            Err(detail) => {
                problems.push(Problem::ChunkDamaged {
                    table: ChunkTable::Records,
                    ws,
                    first,
                    detail,
                });
                let bucket_end = bucket
                    .saturating_add(1)
                    .saturating_mul(1 << RECORD_BUCKET_BITS);
                let end = chunk.next.unwrap_or(bucket_end);
                self.mark(first..end, InChunk::Reported);
            }
            Ok((partition, entries)) => {
                for e in entries {
                    self.entry(partition, e, problems);
                }
            }
        }
    }

    /// Marks the expected records of the workspace with IDs in `ids`.
    fn mark(&mut self, ids: Range<u64>, mark: InChunk) {
        let ws = self.at.ws;
        let from = self.expected.partition_point(|&(k, _)| k < (ws, ids.start));
        let upto = self.expected.partition_point(|&(k, _)| k < (ws, ids.end));
        for m in self.marks.get_mut(from..upto).unwrap_or_default() {
            *m = mark;
        }
    }

    /// Entry `e` of a chunk of `partition`: ahead of the indexed end, or a reference to the
    /// event that created its record, or dangling; fine without a record below a retired mark
    /// (an accepted loss took its event).
    fn entry(&mut self, partition: u32, e: ChunkedRecord, problems: &mut Problems) {
        let ws = self.at.ws;
        let i = self.expected.binary_search_by_key(&(ws, e.id), |&(k, _)| k);
        let expected = i.ok().and_then(|i| self.expected.get(i)).map(|&(_, rs)| rs);
        let created = expected.filter(|rs| rs.kind != 0);
        let mark = if let Some((partition, offset, indexed)) = self.ahead(partition, e, created) {
            problems.push(Problem::ChunkAhead {
                table: ChunkTable::Records,
                ws,
                number: e.id,
                partition,
                offset,
                indexed,
            });
            InChunk::Reported
        } else if created.is_none() && self.below_retired(e.id) {
            return;
        } else {
            let r = RecordRef {
                partition: PartitionId(partition),
                plog_offset: PLogOffset(e.plog),
                index: e.index,
                event_crc: e.crc,
            };
            match reference_found(&self.at, &r, expected) {
                None => InChunk::Found,
                Some(found) => {
                    problems.push(Problem::RecordDangling {
                        ws,
                        id: e.id,
                        partition,
                        offset: e.plog,
                        found,
                    });
                    InChunk::Reported
                }
            }
        };
        if let Some(m) = i.ok().and_then(|i| self.marks.get_mut(i)) {
            *m = mark;
        }
    }

    /// The partition, PLog offset and indexed end of an event at or above its partition's
    /// indexed end that entry `e` (of a chunk of `partition`) names, or that created its
    /// record (`created`): no chunk may hold it.
    fn ahead(
        &self,
        partition: u32,
        e: ChunkedRecord,
        created: Option<RecordState>,
    ) -> Option<(u32, u64, u64)> {
        let partitions = &self.state.partitions;
        if let Some(indexed) = ahead_of_indexed(partitions, partition, e.plog) {
            return Some((partition, e.plog, indexed));
        }
        let offset = created?.offset;
        let indexed = ahead_of_indexed(partitions, self.at.partition, offset)?;
        Some((self.at.partition, offset, indexed))
    }

    /// Whether record `id` of the workspace is at or below a retired mark of its partition.
    fn below_retired(&self, id: u64) -> bool {
        let retired = self.state.retired_of(self.at.ws);
        [1usize, 2].iter().any(|&i| id <= mark_of(&retired, i))
    }
}
