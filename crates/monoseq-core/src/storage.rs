//! The sequence-storage contract (seed 000 `ISeqStorage`): how the sequencer reads and persists
//! the projection (numbers plus checkpoint) and replays the PLog tail. The sequencer reaches
//! storage only through this trait.

use std::ops::ControlFlow;
use std::sync::Arc;

use crate::types::{Number, NumberKey, PLogOffset, SeqId, SeqValue, WsId, WsKind};

/// A storage call failed. The sequencer never panics on it: it answers busy, retries with
/// backoff and heals when storage does.
#[derive(Debug, thiserror::Error)]
#[error("sequence storage: {message}")]
pub struct StorageError {
    message: String,
    #[source]
    source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

impl StorageError {
    /// An error described by a message.
    pub fn new(message: impl Into<String>) -> StorageError {
        StorageError {
            message: message.into(),
            source: None,
        }
    }

    /// An error caused by another one.
    pub fn with_source(
        message: impl Into<String>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> StorageError {
        StorageError {
            message: message.into(),
            source: Some(source.into()),
        }
    }
}

/// The numbers one PLog event used, as replay hands them to the sequencer.
#[derive(Debug, Clone, Copy)]
pub struct ReplayedEvent<'a> {
    /// Where the event sits in the PLog.
    pub offset: PLogOffset,
    /// The kind of the event's workspace; the sequencer uses it to ignore numbers below a
    /// sequence's initial value (external or reserved IDs, seed issue #688).
    pub ws_kind: WsKind,
    /// Every number the event used, all of the event's workspace; keys may repeat.
    pub values: &'a [SeqValue],
}

/// Receives the replayed events one by one. It answers `ControlFlow::Break` when replay must
/// stop (shutdown); the storage then returns [`ReplayEnd::Stopped`] without reading further.
pub type Batcher<'a> = dyn FnMut(ReplayedEvent<'_>) -> ControlFlow<()> + 'a;

/// How a replay ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplayEnd {
    /// Every event from the start offset to the end of the PLog was passed to the batcher.
    Completed,
    /// The batcher asked to stop.
    Stopped,
}

/// Storage of a partition's sequence projection and access to its PLog.
///
/// One value serves one partition. The sequencer calls it from one background worker and from
/// the thread that owns the sequencer, never for writes from two threads at once.
///
/// Obligations every implementation keeps:
///
/// - **Visibility.** After a write returns `Ok`, every later read (from any thread) sees it.
/// - **Values before checkpoint.** [`write_values_and_next_plog_offset`] makes the values
///   durable no later than the checkpoint: after a crash at any moment, if the new checkpoint
///   is visible then so are all the values of the same call (writing both atomically is fine).
///   The checkpoint is never written ahead of the values it covers (SPEC invariant 4).
/// - **No loss on `Ok`.** What a write acknowledged survives a crash, as far as the
///   implementation's durability setting promises.
/// - **Errors, not panics.** A failure returns [`StorageError`]; the caller retries.
/// - **Replay order.** [`replay_plog`] passes events in increasing offset order, each once,
///   starting at the given offset, with every sequence number the event used. Values inside one
///   call are unordered and keys may repeat across events.
///
/// [`write_values_and_next_plog_offset`]: SeqStorage::write_values_and_next_plog_offset
/// [`replay_plog`]: SeqStorage::replay_plog
pub trait SeqStorage: Send + Sync + 'static {
    /// Reads the last numbers of `ws` for each of `seqs` into `out` (same length, same order),
    /// all in one call. A number never written reads as `Number(0)`.
    ///
    /// # Errors
    ///
    /// A [`StorageError`] when storage cannot answer; `out` is then unspecified.
    fn read_numbers(
        &self,
        ws: WsId,
        seqs: &[SeqId],
        out: &mut [Number],
    ) -> Result<(), StorageError>;

    /// Reads the last numbers of many `keys`, in ascending order (by workspace, then
    /// sequence), into `out` (same length, same order). Actualization compares whole windows
    /// of replayed numbers with storage this way; an ordered store can answer neighbouring
    /// workspaces with one range read instead of a lookup each. The provided implementation
    /// calls [`read_numbers`](SeqStorage::read_numbers) once per workspace.
    ///
    /// # Errors
    ///
    /// A [`StorageError`] when storage cannot answer; `out` is then unspecified.
    fn read_numbers_many(
        &self,
        keys: &[NumberKey],
        out: &mut [Number],
    ) -> Result<(), StorageError> {
        debug_assert!(
            keys.is_sorted(),
            "read_numbers_many: keys in ascending order"
        );
        read_numbers_by_workspace(self, keys, out, &mut Vec::new())
    }

    /// Reads the checkpoint: the PLog offset up to which (exclusive) the stored numbers are
    /// valid. Empty storage answers [`PLogOffset::FIRST`].
    ///
    /// # Errors
    ///
    /// A [`StorageError`] when storage cannot answer.
    fn read_next_plog_offset(&self) -> Result<PLogOffset, StorageError>;

    /// Writes `values` (keys unique within the call; may be empty) and then the checkpoint
    /// `next_plog_offset`. Stored numbers are the last numbers handed out; the sequencer
    /// never writes a number lower than one it wrote before for the same key.
    ///
    /// # Errors
    ///
    /// A [`StorageError`] when the write failed; some values may have been written, the
    /// checkpoint may not.
    fn write_values_and_next_plog_offset(
        &self,
        values: &[SeqValue],
        next_plog_offset: PLogOffset,
    ) -> Result<(), StorageError>;

    /// Scans the PLog from `from` (inclusive) to its end and passes each event (its offset,
    /// workspace kind and numbers) to `batcher`. Numbers that must not move a sequence (below its
    /// initial value, seed issue #688) may be left out by the implementation; the sequencer
    /// ignores them anyway.
    ///
    /// # Errors
    ///
    /// A [`StorageError`] when reading failed; events passed before the error stay valid.
    fn replay_plog(
        &self,
        from: PLogOffset,
        batcher: &mut Batcher<'_>,
    ) -> Result<ReplayEnd, StorageError>;
}

/// Reads the numbers of `keys` (grouped by workspace) into `out` with one
/// [`SeqStorage::read_numbers`] per workspace; `seqs` is a scratch buffer. What
/// [`SeqStorage::read_numbers_many`] does unless an implementation reads better.
///
/// # Errors
///
/// The first [`StorageError`] of a read; `out` is then unspecified.
pub fn read_numbers_by_workspace<S: SeqStorage + ?Sized>(
    storage: &S,
    keys: &[NumberKey],
    out: &mut [Number],
    seqs: &mut Vec<SeqId>,
) -> Result<(), StorageError> {
    let mut at = 0;
    for run in keys.chunk_by(|a, b| a.ws == b.ws) {
        seqs.clear();
        seqs.extend(run.iter().map(|k| k.seq));
        storage.read_numbers(run[0].ws, seqs, &mut out[at..at + run.len()])?;
        at += run.len();
    }
    Ok(())
}

impl<T: SeqStorage + ?Sized> SeqStorage for Arc<T> {
    fn read_numbers(
        &self,
        ws: WsId,
        seqs: &[SeqId],
        out: &mut [Number],
    ) -> Result<(), StorageError> {
        (**self).read_numbers(ws, seqs, out)
    }

    fn read_numbers_many(
        &self,
        keys: &[NumberKey],
        out: &mut [Number],
    ) -> Result<(), StorageError> {
        (**self).read_numbers_many(keys, out)
    }

    fn read_next_plog_offset(&self) -> Result<PLogOffset, StorageError> {
        (**self).read_next_plog_offset()
    }

    fn write_values_and_next_plog_offset(
        &self,
        values: &[SeqValue],
        next_plog_offset: PLogOffset,
    ) -> Result<(), StorageError> {
        (**self).write_values_and_next_plog_offset(values, next_plog_offset)
    }

    fn replay_plog(
        &self,
        from: PLogOffset,
        batcher: &mut Batcher<'_>,
    ) -> Result<ReplayEnd, StorageError> {
        (**self).replay_plog(from, batcher)
    }
}
