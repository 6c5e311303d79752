//! [`PLogSeqStorage`]: the sequence storage of one partition over the event store — numbers per
//! (application, workspace, sequence), the checkpoint per (application, partition), and replay by
//! scanning the PLog from the checkpoint (the reference design's `ActualizeSequencesFromPLog`,
//! docs/invariants.md).

use std::ops::{Bound, ControlFlow};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use monoseq_core::{
    Batcher, Fence, Number, PLogOffset, ReplayEnd, ReplayedEvent, SeqId, SeqStorage, SeqValue,
    StorageError, StorageErrorKind, WsId, check_out_len, read_numbers_by_workspace,
};
use monoseq_kv::{Key, KvError, KvStore, Order, WriteBatch};

use crate::builtin::built_in_initial;
use crate::codec::{EventHead, decode_numbers};
use crate::keys::{
    self, AppId, LOG_BLOCK_EVENTS, NUMBERS_BLOCK_WS, PartitionId, block_position,
    checkpoint_partition, from_numbers_clustering, numbers_clustering, numbers_clustering_from,
    numbers_partition, plog_partition,
};
use crate::plog::Segments;

/// The sequence storage of one partition of one application, over a key-value store `S`.
///
/// Values and checkpoint are written in one atomic batch, so the checkpoint is never visible
/// without the values it covers. The value embeds the [`Fence`] of its partition's writer
/// generations: keep one value per partition (an `Arc`) and give a clone to every sequencer that
/// takes the partition over, so a late write of an earlier one is refused. Replay decodes only the
/// numbers of each event (no allocation per event) and leaves out numbers below a built-in
/// sequence's initial value (the #688 replay rule of docs/invariants.md: external or reserved IDs
/// never move a sequence).
///
/// # Example
///
/// ```
/// use std::sync::Arc;
/// use monoseq_core::{PLogOffset, SeqStorage};
/// use monoseq_kv::MemoryStore;
/// use monoseq_store::{AppId, EventStore, PartitionId, TrustLevel};
///
/// let store = EventStore::new(Arc::new(MemoryStore::new()), AppId(1), TrustLevel::Level0);
/// let seq = store.seq_storage(PartitionId(0));
/// assert_eq!(seq.read_next_plog_offset()?, PLogOffset::FIRST);
/// # Ok::<(), monoseq_core::StorageError>(())
/// ```
#[derive(Debug)]
pub struct PLogSeqStorage<S> {
    kv: S,
    app: AppId,
    partition: PartitionId,
    replayed_events: AtomicU64,
    fence: Fence,
    /// The PLog's segment files (key layout 4); `None`: the PLog is in `kv`.
    segments: Option<Arc<Segments>>,
}

impl<S: KvStore> PLogSeqStorage<S> {
    /// The sequence storage of `partition` of `app` on `kv`.
    pub fn new(kv: S, app: AppId, partition: PartitionId) -> PLogSeqStorage<S> {
        PLogSeqStorage {
            kv,
            app,
            partition,
            replayed_events: AtomicU64::new(0),
            fence: Fence::new(),
            segments: None,
        }
    }

    /// The PLog's segment files, when it is kept there.
    pub fn segments(&self) -> Option<&Arc<Segments>> {
        self.segments.as_ref()
    }

    /// This storage replaying the PLog from `segments` (its segment files) when given.
    #[must_use]
    pub fn with_segments(mut self, segments: Option<Arc<Segments>>) -> PLogSeqStorage<S> {
        self.segments = segments;
        self
    }

    /// How many events replays have passed to their batchers since this value was created:
    /// what a restart cost, in events.
    pub fn replayed_events(&self) -> u64 {
        self.replayed_events.load(Ordering::Relaxed)
    }

    /// Scans the PLog [`REPLAY_CHUNK_EVENTS`] offsets at a time (never across a block of
    /// [`LOG_BLOCK_EVENTS`]), copying each chunk's events out of the scan before passing them
    /// to the batcher: the batcher may read and write this storage (actualization writes full
    /// windows inline), and a backend may hold a lock for the length of a scan. A chunk's
    /// copies stay in the CPU's cache until the batcher reads them.
    fn replay(
        &self,
        from: PLogOffset,
        batcher: &mut Batcher<'_>,
    ) -> Result<ReplayEnd, StorageError> {
        let mut block = ReplayBlock::default();
        let mut first = from.0;
        loop {
            let block_end = (first / LOG_BLOCK_EVENTS + 1).saturating_mul(LOG_BLOCK_EVENTS);
            let end = (first / REPLAY_CHUNK_EVENTS + 1)
                .saturating_mul(REPLAY_CHUNK_EVENTS)
                .min(block_end);
            let failure = self.read_chunk(first, end, block_end, &mut block);
            let mut passed = 0u64;
            let mut stopped = false;
            for e in &block.events {
                passed += 1;
                let flow = batcher(ReplayedEvent {
                    offset: e.offset,
                    ws_kind: e.ws_kind,
                    values: &block.values[e.start..e.start + e.len],
                });
                if flow.is_break() {
                    stopped = true;
                    break;
                }
            }
            self.replayed_events.fetch_add(passed, Ordering::Relaxed);
            if stopped {
                return Ok(ReplayEnd::Stopped);
            }
            // Events read before a failure were passed: they stay valid.
            failure?;
            // Offsets are contiguous: a chunk that is not full is the last one.
            let last = block.events.last().map(|e| e.offset.0);
            if end == u64::MAX || last.is_none_or(|last| last + 1 < end) {
                return Ok(ReplayEnd::Completed);
            }
            first = end;
        }
    }

    /// Reads the events at offsets `first..end` (inside the block ending before `block_end`)
    /// into `block`. On a failure `block` holds the events read before it.
    fn read_chunk(
        &self,
        first: u64,
        end: u64,
        block_end: u64,
        block: &mut ReplayBlock,
    ) -> Result<(), StorageError> {
        block.events.clear();
        block.values.clear();
        if let Some(segments) = &self.segments {
            return self.read_logged_chunk(segments, first, end, block);
        }
        let part = plog_partition(self.app, self.partition, PLogOffset(first));
        let lower = block_position(first, LOG_BLOCK_EVENTS);
        let upper = block_position(end, LOG_BLOCK_EVENTS);
        let upper = if end == block_end {
            Bound::Unbounded
        } else {
            Bound::Excluded(&upper[..])
        };
        let block_base = first / LOG_BLOCK_EVENTS * LOG_BLOCK_EVENTS;
        let mut failure: Option<StorageError> = None;
        let scan = self.kv.scan(
            part.as_bytes(),
            Bound::Included(&lower),
            upper,
            Order::Ascending,
            &mut |clustering, value| match self
                .offset_at(block_base, clustering)
                .and_then(|offset| self.copy_event(offset, value, block))
            {
                Ok(()) => ControlFlow::Continue(()),
                Err(e) => {
                    failure = Some(e);
                    ControlFlow::Break(())
                }
            },
        );
        if let Err(e) = scan {
            return Err(StorageError::with_source(
                format!("reading the PLog of partition {} failed", self.partition),
                e,
            ));
        }
        failure.map_or(Ok(()), Err)
    }

    /// [`PLogSeqStorage::read_chunk`] from the PLog's segment files.
    fn read_logged_chunk(
        &self,
        segments: &Segments,
        first: u64,
        end: u64,
        block: &mut ReplayBlock,
    ) -> Result<(), StorageError> {
        let wanted = usize::try_from(end - first).unwrap_or(usize::MAX);
        let page = segments
            .read(self.partition, first, wanted, usize::MAX)
            .map_err(|e| {
                kv_error(
                    &format!("reading the PLog of partition {} failed", self.partition),
                    e,
                )
            })?;
        for (i, value) in page.payloads().enumerate() {
            if value == crate::plog::RETIRED_PAYLOAD {
                // A retired offset: the replay ends there, as at a missing one.
                break;
            }
            self.copy_event(page.first() + i as u64, value, block)?;
        }
        Ok(())
    }

    /// The PLog offset a stored key's clustering (a position in the block starting at
    /// `block_base`) names.
    fn offset_at(&self, block_base: u64, clustering: &[u8]) -> Result<u64, StorageError> {
        keys::from_block_position(block_base, clustering).ok_or_else(|| {
            StorageError::corrupted(format!(
                "PLog of partition {} holds a key of {} bytes where a 2-byte position belongs: \
                 the PLog is damaged; restore it from a backup",
                self.partition,
                clustering.len()
            ))
        })
    }

    /// Copies the numbers of the PLog event at `offset` into `block`, leaving out those below
    /// their sequence's initial value. On a failure `block` is as it was.
    fn copy_event(
        &self,
        offset: u64,
        value: &[u8],
        block: &mut ReplayBlock,
    ) -> Result<(), StorageError> {
        let start = block.values.len();
        let head = match self.decode_event_numbers(offset, value, &mut block.values) {
            Ok(head) => head,
            Err(e) => {
                block.values.truncate(start);
                return Err(e);
            }
        };
        let kept = keep_handed_out(&mut block.values, start);
        block.events.push(BlockEvent {
            offset: head.plog_offset,
            ws_kind: head.ws_kind,
            start,
            len: kept - start,
        });
        Ok(())
    }

    /// Appends the numbers of the event stored at PLog offset `offset` to `values`; refuses an
    /// event that does not decode or says it is at another offset (`values` may then hold some
    /// of its numbers).
    fn decode_event_numbers(
        &self,
        offset: u64,
        value: &[u8],
        values: &mut Vec<SeqValue>,
    ) -> Result<EventHead, StorageError> {
        let head = decode_numbers(value, values).map_err(|e| {
            StorageError::with_source(
                format!(
                    "event at PLog offset {offset} of partition {} does not decode",
                    self.partition
                ),
                e,
            )
            .with_kind(StorageErrorKind::Corrupted)
        })?;
        if head.plog_offset.0 != offset {
            return Err(StorageError::corrupted(format!(
                "event at PLog offset {offset} of partition {} says it is at offset {}: the PLog \
                 is damaged; restore it from a backup",
                self.partition, head.plog_offset
            )));
        }
        Ok(head)
    }

    /// Reads the numbers of `block` (ascending keys of one block of workspaces) into `out` with
    /// one range read from the first to the last workspace asked, merged with the keys.
    fn read_numbers_range(
        &self,
        block: &[monoseq_core::NumberKey],
        out: &mut [Number],
    ) -> Result<(), StorageError> {
        let (first, last) = (block[0].ws, block[block.len() - 1].ws);
        let block_first = first.0 / NUMBERS_BLOCK_WS * NUMBERS_BLOCK_WS;
        let part = numbers_partition(self.app, first);
        let from = numbers_clustering_from(first.0 - block_first);
        let to = numbers_clustering_from(last.0 - block_first + 1);
        let mut next = 0;
        let mut failure = None;
        self.kv
            .scan(
                part.as_bytes(),
                Bound::Included(&from),
                Bound::Excluded(&to),
                Order::Ascending,
                &mut |clustering, value| {
                    let Some((ws, seq)) = from_numbers_clustering(block_first, clustering) else {
                        failure = Some(StorageError::corrupted(format!(
                            "a stored number of workspaces from {block_first} has a key of {} \
                             bytes where 4 belong; restore the projection from a backup or \
                             delete it to replay the whole PLog",
                            clustering.len()
                        )));
                        return ControlFlow::Break(());
                    };
                    let key = monoseq_core::NumberKey { ws, seq };
                    while next < block.len() && block[next] < key {
                        next += 1;
                    }
                    if next == block.len() {
                        return ControlFlow::Break(());
                    }
                    if block[next] == key {
                        match stored_number(ws, seq, value) {
                            Ok(n) => out[next] = n,
                            Err(e) => {
                                failure = Some(e);
                                return ControlFlow::Break(());
                            }
                        }
                    }
                    ControlFlow::Continue(())
                },
            )
            .map_err(|e| kv_error("reading sequence numbers failed", e))?;
        failure.map_or(Ok(()), Err)
    }
}

/// Leaves out of `values[start..]` the numbers below their sequence's initial value, keeping
/// the order of the others; answers the new end of `values`.
fn keep_handed_out(values: &mut Vec<SeqValue>, start: usize) -> usize {
    let mut kept = start;
    for i in start..values.len() {
        if values[i].value >= initial_value(values[i].key.seq) {
            values[kept] = values[i];
            kept += 1;
        }
    }
    values.truncate(kept);
    kept
}

/// Events replay copies out of one scan before the batcher sees them: few enough that their
/// copies stay in the CPU's cache (about 70 KiB with three numbers per event), many enough
/// that the scan's seek is paid once per thousand events.
const REPLAY_CHUNK_EVENTS: u64 = 1024;

/// One chunk's events as replay copies them out of the scan.
#[derive(Default)]
struct ReplayBlock {
    events: Vec<BlockEvent>,
    values: Vec<SeqValue>,
}

/// An event of a [`ReplayBlock`]: its numbers are `values[start..start + len]`.
struct BlockEvent {
    offset: PLogOffset,
    ws_kind: monoseq_core::WsKind,
    start: usize,
    len: usize,
}

/// The initial value below which a replayed number is left out: the built-in sequence's
/// initial value, or 1 (only the "never handed out" 0 is left out) for other sequences.
fn initial_value(seq: SeqId) -> Number {
    built_in_initial(seq).unwrap_or(Number(1))
}

/// A block of numbers is read with one range read when at least this many keys of it are
/// asked for ...
const RANGE_READ_KEYS_MIN: usize = 16;
/// ... and the workspaces asked for are at least one in this many of the range between the
/// first and the last (otherwise a lookup each reads less).
const RANGE_READ_SPAN_MAX: u64 = 4;

/// Whether the keys of `block` (one block of workspaces, ascending) are read with one range
/// read rather than a lookup per workspace: enough keys, from workspaces dense enough in the
/// range between the first and the last.
fn worth_a_range_read(block: &[monoseq_core::NumberKey]) -> bool {
    let (first, last) = (block[0].ws, block[block.len() - 1].ws);
    let span = last.0 - first.0 + 1;
    let workspaces = block.chunk_by(|a, b| a.ws == b.ws).count() as u64;
    block.len() >= RANGE_READ_KEYS_MIN && span <= workspaces * RANGE_READ_SPAN_MAX
}

/// A stored number's value: `be64`.
fn stored_number(ws: WsId, seq: SeqId, value: &[u8]) -> Result<Number, StorageError> {
    keys::be64(value).map(Number).ok_or_else(|| {
        StorageError::corrupted(format!(
            "stored number {seq} of workspace {ws} is damaged ({} value bytes); restore the \
             projection from a backup or delete it to replay the whole PLog",
            value.len()
        ))
    })
}

fn kv_error(what: &str, e: impl Into<WriteFailure>) -> StorageError {
    let e = e.into();
    let fenced = e.fenced;
    let error = StorageError::with_source(what.to_owned(), e.source);
    if fenced {
        // Another node owns the partition now: this writer must stop, not retry.
        error.with_kind(StorageErrorKind::Fenced)
    } else {
        error
    }
}

/// A key-value error with whether it was a lease fence.
struct WriteFailure {
    fenced: bool,
    source: Box<dyn std::error::Error + Send + Sync>,
}

impl From<KvError> for WriteFailure {
    fn from(e: KvError) -> WriteFailure {
        WriteFailure {
            fenced: matches!(e, KvError::Fenced { .. }),
            source: Box::new(e),
        }
    }
}

impl From<monoseq_kv::WriteError> for WriteFailure {
    fn from(e: monoseq_kv::WriteError) -> WriteFailure {
        WriteFailure {
            fenced: matches!(e, monoseq_kv::WriteError::Storage(KvError::Fenced { .. })),
            source: Box::new(e),
        }
    }
}

impl<S: KvStore> SeqStorage for PLogSeqStorage<S> {
    fn read_numbers(
        &self,
        ws: WsId,
        seqs: &[SeqId],
        out: &mut [Number],
    ) -> Result<(), StorageError> {
        check_out_len(seqs.len(), out.len())?;
        out.fill(Number(0));
        // Point reads of exactly the asked sequences: cheaper than opening a scan.
        let part = numbers_partition(self.app, ws);
        let clustering: Vec<[u8; 4]> = seqs.iter().map(|&s| numbers_clustering(ws, s)).collect();
        let keys: Vec<monoseq_kv::Key<'_>> = clustering
            .iter()
            .map(|c| monoseq_kv::Key::new(part.as_bytes(), c))
            .collect();
        let values = self
            .kv
            .get_many(&keys)
            .map_err(|e| kv_error("reading sequence numbers failed", e))?;
        for ((slot, value), &seq) in out.iter_mut().zip(values).zip(seqs) {
            let Some(value) = value else { continue };
            *slot = stored_number(ws, seq, &value)?;
        }
        Ok(())
    }

    fn read_numbers_many(
        &self,
        keys: &[monoseq_core::NumberKey],
        out: &mut [Number],
    ) -> Result<(), StorageError> {
        check_out_len(keys.len(), out.len())?;
        out.fill(Number(0));
        let mut at = 0;
        let mut seqs: Vec<SeqId> = Vec::new();
        for block in keys.chunk_by(|a, b| a.ws.0 / NUMBERS_BLOCK_WS == b.ws.0 / NUMBERS_BLOCK_WS) {
            let out = &mut out[at..at + block.len()];
            at += block.len();
            if worth_a_range_read(block) {
                self.read_numbers_range(block, out)?;
            } else {
                // Few or scattered workspaces: a lookup each.
                read_numbers_by_workspace(self, block, out, &mut seqs)?;
            }
        }
        Ok(())
    }

    fn read_next_plog_offset(&self) -> Result<PLogOffset, StorageError> {
        let part = checkpoint_partition(self.app, self.partition);
        let value = self
            .kv
            .get(Key::new(part.as_bytes(), &[]))
            .map_err(|e| kv_error("reading the checkpoint failed", e))?;
        match value {
            None => Ok(PLogOffset::FIRST),
            Some(bytes) => match keys::be64(&bytes) {
                Some(n) if n >= PLogOffset::FIRST.0 => Ok(PLogOffset(n)),
                _ => Err(StorageError::corrupted(format!(
                    "checkpoint of partition {} is damaged; delete it to replay the whole PLog",
                    self.partition
                ))),
            },
        }
    }

    fn write_values_and_next_plog_offset(
        &self,
        values: &[SeqValue],
        next_plog_offset: PLogOffset,
    ) -> Result<(), StorageError> {
        if next_plog_offset < PLogOffset::FIRST {
            return Err(StorageError::new(format!(
                "checkpoint {next_plog_offset} is below the first PLog offset; nothing was written"
            )));
        }
        let mut batch = WriteBatch::with_capacity(values.len() + 1, values.len() * 24 + 20);
        for v in values {
            let part = numbers_partition(self.app, v.key.ws);
            batch.put(
                Key::new(part.as_bytes(), &numbers_clustering(v.key.ws, v.key.seq)),
                &v.value.0.to_be_bytes(),
            );
        }
        // Last, and in the same atomic batch: the checkpoint never shows without its values.
        let part = checkpoint_partition(self.app, self.partition);
        batch.put(
            Key::new(part.as_bytes(), &[]),
            &next_plog_offset.0.to_be_bytes(),
        );
        self.kv
            .write(&batch)
            .map_err(|e| kv_error("writing sequence numbers and checkpoint failed", e))
    }

    fn fence(&self) -> &Fence {
        &self.fence
    }

    fn replay_plog(
        &self,
        from: PLogOffset,
        batcher: &mut Batcher<'_>,
    ) -> Result<ReplayEnd, StorageError> {
        self.replay(from, batcher)
    }
}
