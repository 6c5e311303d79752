//! The sequence-storage contract (the reference design's `ISeqStorage`, docs/invariants.md): how
//! the sequencer reads and persists the projection (numbers plus checkpoint) and replays the PLog
//! tail. The sequencer reaches storage only through this trait.

use std::ops::ControlFlow;
use std::sync::Arc;

use crate::types::{Number, NumberKey, PLogOffset, SeqId, SeqValue, WsId, WsKind};

/// What kind of failure a [`StorageError`] is: whether retrying can help.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StorageErrorKind {
    /// Storage could not answer now (I/O, network, an injected fault); the sequencer retries
    /// with backoff and heals when storage does.
    Unavailable,
    /// Stored data is damaged (a checkpoint of 0, bytes that do not decode); retrying reads
    /// the same damage until an operator repairs it.
    Corrupted,
    /// The write came from a writer generation older than the newest that claimed this
    /// storage: a newer sequencer owns the partition now. Permanent for that writer; its
    /// sequencer stops (poisoned) and never retries.
    Fenced,
}

/// A storage call failed. The sequencer never panics on it: it answers busy, retries with
/// backoff and heals when storage does, except after a [fenced](StorageErrorKind::Fenced)
/// write, which stops it.
#[derive(Debug, thiserror::Error)]
#[error("sequence storage: {message}")]
pub struct StorageError {
    kind: StorageErrorKind,
    message: String,
    #[source]
    source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

impl StorageError {
    /// An error described by a message, of kind [`StorageErrorKind::Unavailable`].
    pub fn new(message: impl Into<String>) -> StorageError {
        StorageError::of_kind(StorageErrorKind::Unavailable, message)
    }

    /// An error of `kind` described by a message.
    pub fn of_kind(kind: StorageErrorKind, message: impl Into<String>) -> StorageError {
        StorageError {
            kind,
            message: message.into(),
            source: None,
        }
    }

    /// Stored data is damaged ([`StorageErrorKind::Corrupted`]).
    pub fn corrupted(message: impl Into<String>) -> StorageError {
        StorageError::of_kind(StorageErrorKind::Corrupted, message)
    }

    /// A write of an older writer generation was refused ([`StorageErrorKind::Fenced`]).
    pub fn fenced(message: impl Into<String>) -> StorageError {
        StorageError::of_kind(StorageErrorKind::Fenced, message)
    }

    /// An error caused by another one, of kind [`StorageErrorKind::Unavailable`].
    pub fn with_source(
        message: impl Into<String>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> StorageError {
        StorageError {
            kind: StorageErrorKind::Unavailable,
            message: message.into(),
            source: Some(source.into()),
        }
    }

    /// The same error with another kind.
    #[must_use]
    pub fn with_kind(mut self, kind: StorageErrorKind) -> StorageError {
        self.kind = kind;
        self
    }

    /// What kind of failure this is.
    #[must_use]
    pub fn kind(&self) -> StorageErrorKind {
        self.kind
    }

    /// Whether a newer writer generation fenced this write off.
    #[must_use]
    pub fn is_fenced(&self) -> bool {
        self.kind == StorageErrorKind::Fenced
    }
}

/// A writer generation of one storage value: each sequencer claims a new one (see
/// [`SeqStorage::claim`]) before it reads anything, and writes with it. `Generation(0)` is
/// never claimed, so a write with it is always fenced off.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Generation(pub u64);

impl std::fmt::Display for Generation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// A claim of a storage value by a new writer: its generation, and the newest checkpoint a
/// write through this storage value has stored (any generation), which the new writer must
/// find at least again when it reads the checkpoint back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Claim {
    /// The generation the new writer writes with.
    pub generation: Generation,
    /// The newest checkpoint written through this storage value before the claim, if any.
    pub checkpoint_written: Option<PLogOffset>,
}

/// Generation fencing inside one process (invariant 11 of docs/invariants.md): the state a
/// [`SeqStorage`] embeds so that, once a newer writer has claimed it, a late write of an older one
/// changes nothing. One mutex is held across "is this generation still the newest?" and the write
/// itself, so a claim waits for a write in flight and no window remains between them.
///
/// Share one storage value (for instance an `Arc`) between the sequencers that succeed each
/// other on a partition: a fence only orders the writers that go through it.
///
/// # Example
///
/// ```
/// use monoseq_core::{Fence, Generation, StorageError};
///
/// let fence = Fence::new();
/// let old = fence.claim().generation;
/// let new = fence.claim().generation;
/// assert!(fence.write(old, None, || Ok::<_, StorageError>(())).unwrap_err().is_fenced());
/// assert!(fence.write(new, None, || Ok::<_, StorageError>(())).is_ok());
/// assert!(fence.write(Generation(0), None, || Ok::<_, StorageError>(())).is_err());
/// ```
#[derive(Debug, Default)]
pub struct Fence {
    state: std::sync::Mutex<FenceState>,
}

#[derive(Debug, Default)]
struct FenceState {
    newest: Generation,
    checkpoint_written: Option<PLogOffset>,
}

impl Fence {
    /// A fence nobody claimed yet.
    #[must_use]
    pub fn new() -> Fence {
        Fence::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, FenceState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Claims the fence for a new writer: every write of an older generation is refused from
    /// now on. Waits for a write in flight to end.
    pub fn claim(&self) -> Claim {
        let mut st = self.lock();
        st.newest = Generation(st.newest.0.saturating_add(1));
        Claim {
            generation: st.newest,
            checkpoint_written: st.checkpoint_written,
        }
    }

    /// The newest generation claimed (`Generation(0)`: none yet).
    #[must_use]
    pub fn newest(&self) -> Generation {
        self.lock().newest
    }

    /// Runs `write` if `generation` is the newest claimed, holding the fence until it ends so
    /// no claim slips in between; `checkpoint` is the checkpoint `write` stores, remembered
    /// when it succeeds (see [`Claim::checkpoint_written`]).
    ///
    /// # Errors
    ///
    /// A [`StorageErrorKind::Fenced`] error, without running `write`, for an older or
    /// unclaimed generation; otherwise what `write` answers.
    pub fn write<T>(
        &self,
        generation: Generation,
        checkpoint: Option<PLogOffset>,
        write: impl FnOnce() -> Result<T, StorageError>,
    ) -> Result<T, StorageError> {
        let mut st = self.lock();
        if generation == Generation(0) || generation != st.newest {
            return Err(StorageError::fenced(format!(
                "write of writer generation {generation} refused: generation {} owns this \
                 partition's sequence storage now; this sequencer stops",
                st.newest
            )));
        }
        let out = write()?;
        if checkpoint.is_some() {
            st.checkpoint_written = st.checkpoint_written.max(checkpoint);
        }
        Ok(out)
    }
}

/// The numbers one PLog event used, as replay hands them to the sequencer.
#[derive(Debug, Clone, Copy)]
pub struct ReplayedEvent<'a> {
    /// Where the event sits in the PLog.
    pub offset: PLogOffset,
    /// The kind of the event's workspace; the sequencer uses it to ignore numbers below a
    /// sequence's initial value (external or reserved IDs, the #688 replay rule of
    /// docs/invariants.md).
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
/// the thread that owns the sequencer. Sequencers that succeed each other on a partition (after
/// a poison, a drop, or a shutdown that did not stop in time) share one storage value, for
/// instance through an `Arc`, so that its [`Fence`] orders their writes.
///
/// Obligations every implementation keeps (the `conformance` feature's
/// `monoseq_core::conformance` suite checks them):
///
/// - **Visibility.** After a write returns `Ok`, every later read (from any thread) sees it.
/// - **Never written reads as 0.** A number never written reads as `Number(0)`, and empty
///   storage answers the checkpoint [`PLogOffset::FIRST`].
/// - **Values before checkpoint.** [`write_values_and_next_plog_offset`] makes the values
///   visible and durable no later than the checkpoint: after a crash at any moment, if the new
///   checkpoint is visible then so are all the values of the same call (writing both
///   atomically is fine). The checkpoint is never written ahead of the values it covers (invariant
///   4 of docs/invariants.md).
/// - **No loss on `Ok`.** What a write acknowledged survives a crash, as far as the
///   implementation's durability setting promises.
/// - **Fencing (invariant 11 of docs/invariants.md).** Once [`claim`] returned a generation, a
///   [`write_fenced`] of any older generation fails with a [`StorageErrorKind::Fenced`] error
///   and changes nothing; `claim` waits for a write in flight, so no write of an older
///   generation lands after it returns. The provided methods do this with the embedded
///   [`Fence`]; a storage shared by several processes overrides both with its own conditional
///   write (a lease epoch compared in the same transaction).
/// - **Errors, not panics.** A failure returns [`StorageError`] (damaged data as
///   [`StorageErrorKind::Corrupted`], never a checkpoint of 0); the caller retries. Invalid
///   arguments (a checkpoint of 0, `out` of another length than the keys) are errors too.
/// - **Replay order.** [`replay_plog`] passes events in increasing offset order, each once,
///   starting at the given offset, with every sequence number the event used. Values inside one
///   call are unordered and keys may repeat across events.
/// - **Reentrant replay.** The batcher may call every other method of the storage, writes
///   included (actualization writes a full window from inside it): replay holds no lock
///   across a batcher call.
///
/// [`write_values_and_next_plog_offset`]: SeqStorage::write_values_and_next_plog_offset
/// [`write_fenced`]: SeqStorage::write_fenced
/// [`claim`]: SeqStorage::claim
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
    /// Not fenced: the sequencer writes through [`write_fenced`](SeqStorage::write_fenced).
    /// Call this directly only where no sequencer runs (tools, tests).
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

    /// The fence that orders the writer generations of this storage value.
    fn fence(&self) -> &Fence;

    /// Claims this storage for a new writer generation: from its return on, writes of every
    /// older generation are refused. Waits for a write in flight of an older generation to
    /// end. A sequencer claims before it reads anything.
    ///
    /// # Errors
    ///
    /// A [`StorageError`] when the claim could not be recorded (a storage shared by several
    /// processes); the provided implementation does not fail.
    fn claim(&self) -> Result<Claim, StorageError> {
        Ok(self.fence().claim())
    }

    /// [`write_values_and_next_plog_offset`](SeqStorage::write_values_and_next_plog_offset) as
    /// writer `generation`, refused when a newer generation has claimed this storage.
    ///
    /// # Errors
    ///
    /// A [`StorageErrorKind::Fenced`] error, with nothing written, for an older generation;
    /// otherwise as the unfenced write.
    fn write_fenced(
        &self,
        generation: Generation,
        values: &[SeqValue],
        next_plog_offset: PLogOffset,
    ) -> Result<(), StorageError> {
        self.fence().write(generation, Some(next_plog_offset), || {
            self.write_values_and_next_plog_offset(values, next_plog_offset)
        })
    }

    /// Scans the PLog from `from` (inclusive) to its end and passes each event (its offset,
    /// workspace kind and numbers) to `batcher`. Numbers that must not move a sequence (below its
    /// initial value, the #688 replay rule of docs/invariants.md) may be left out by the
    /// implementation; the sequencer ignores them anyway.
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
    check_out_len(keys.len(), out.len())?;
    let mut at = 0;
    for run in keys.chunk_by(|a, b| a.ws == b.ws) {
        seqs.clear();
        seqs.extend(run.iter().map(|k| k.seq));
        storage.read_numbers(run[0].ws, seqs, &mut out[at..at + run.len()])?;
        at += run.len();
    }
    Ok(())
}

/// Refuses an `out` buffer of another length than the keys asked for: an error, not a panic.
///
/// # Errors
///
/// A [`StorageError`] naming both lengths when they differ.
pub fn check_out_len(keys: usize, out: usize) -> Result<(), StorageError> {
    if keys == out {
        Ok(())
    } else {
        Err(StorageError::new(format!(
            "{keys} numbers asked for with room for {out}: pass one slot per key"
        )))
    }
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

    fn fence(&self) -> &Fence {
        (**self).fence()
    }

    fn claim(&self) -> Result<Claim, StorageError> {
        (**self).claim()
    }

    fn write_fenced(
        &self,
        generation: Generation,
        values: &[SeqValue],
        next_plog_offset: PLogOffset,
    ) -> Result<(), StorageError> {
        (**self).write_fenced(generation, values, next_plog_offset)
    }

    fn replay_plog(
        &self,
        from: PLogOffset,
        batcher: &mut Batcher<'_>,
    ) -> Result<ReplayEnd, StorageError> {
        (**self).replay_plog(from, batcher)
    }
}
