//! The sequencer: hands out PLog offsets and per-workspace numbers in sequencing transactions
//! (start → next* → flush | actualize, or start → cancel when nothing was handed out). Owns
//! the cache of recent workspaces and the numbers of the open transaction; shares the backlog
//! with its background worker.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use schnellru::{ByLength, LruMap};

#[cfg(feature = "tokio")]
use crate::driver::{DriverHandle, Runtime};
use crate::params::{KindSequences, Params};
use crate::shared::{PoisonReason, Shared, Status};
use crate::storage::{SeqStorage, StorageErrorKind};
use crate::types::{Number, PLogOffset, SeqId, WsId, WsKind};
use crate::worker::Worker;
use crate::ws_numbers::NumberMap;
#[cfg(debug_assertions)]
use crate::ws_numbers::WsNumbers;

/// Why `start` cannot begin a transaction now. Busy is an answer, not an error: the caller
/// retries later (the command processor answers 503 "server is busy").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Busy {
    /// Actualization is running.
    Actualizing,
    /// More values wait for the flusher than `backlog_values_max`.
    BacklogFull,
    /// Storage is failing (reads, writes or replay); the sequencer retries and heals with it.
    StorageUnavailable,
}

impl std::fmt::Display for Busy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Busy::Actualizing => "actualizing sequences from the PLog",
            Busy::BacklogFull => "too many unflushed sequence values",
            Busy::StorageUnavailable => "sequence storage is failing",
        })
    }
}

/// `start` was called wrongly, or the sequencer cannot work any more.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// The workspace kind is not in [`Params`].
    #[error("unknown workspace kind {0}: declare it with its sequences in Params")]
    UnknownWsKind(WsKind),
    /// The sequencer stopped working for the reason given (its worker panicked, a newer
    /// sequencer fenced it off, or a release-build invariant check failed); nothing can be
    /// handed out safely. Permanent for this sequencer: drop it and create a new one on the
    /// same storage value, which claims a newer generation and actualizes.
    #[error(
        "the sequencer is poisoned: {0}; drop it and create a new sequencer on the same storage"
    )]
    Poisoned(PoisonReason),
    /// The PLog reached `u64::MAX`: the next event's offset could not be followed by another.
    /// Permanent; nothing was handed out.
    #[error("the PLog of this partition is exhausted at offset {0}; no more events can be written")]
    PLogExhausted(PLogOffset),
    /// Stored data the sequencer needs is damaged (a PLog event or a stored number that does
    /// not decode): corrupt bytes are an error, never "busy". The worker keeps retrying, so
    /// the sequencer heals once an operator repairs the store.
    #[error(
        "stored sequence data is damaged (see the storage errors in the log); repair or restore \
         the store"
    )]
    Corrupted,
}

/// `next` was called wrongly.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NextError {
    /// The sequence is not declared for the transaction's workspace kind.
    #[error("unknown sequence {seq} for workspace kind {kind}: declare it in Params")]
    UnknownSequence {
        /// The workspace kind of the transaction.
        kind: WsKind,
        /// The sequence asked for.
        seq: SeqId,
    },
    /// The sequence reached `u64::MAX`. Permanent: retrying never helps; answer the command
    /// with an error that says so (not busy, not a storage failure).
    #[error("sequence {seq} of workspace {ws} is exhausted: it reached the largest number")]
    Exhausted {
        /// The workspace.
        ws: WsId,
        /// The sequence.
        seq: SeqId,
    },
}

impl NextError {
    /// Whether the sequence reached its largest number: a permanent condition, unlike a
    /// storage failure (see [`NextError::Exhausted`]).
    #[must_use]
    pub fn is_exhausted(&self) -> bool {
        matches!(self, NextError::Exhausted { .. })
    }
}

/// The answer of [`Sequencer::start`].
#[derive(Debug)]
#[must_use]
pub enum Start<'a, S: SeqStorage> {
    /// A transaction began; finish it with [`Transaction::flush`] or
    /// [`Transaction::actualize`].
    Began(Transaction<'a, S>),
    /// No transaction now; retry later.
    Busy(Busy),
}

impl<'a, S: SeqStorage> Start<'a, S> {
    /// The transaction, or `None` when busy.
    #[must_use]
    pub fn began(self) -> Option<Transaction<'a, S>> {
        match self {
            Start::Began(tx) => Some(tx),
            Start::Busy(_) => None,
        }
    }
}

/// What [`Sequencer::shutdown`] achieved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct ShutdownReport {
    /// The background work stopped within the shutdown timeout.
    pub stopped_in_time: bool,
    /// Values still unflushed (storage failing); the PLog still holds them, so the next
    /// actualization recovers them.
    pub unflushed_values: usize,
}

/// Cache-hit and miss counts of one sequencer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Starts whose workspace numbers were in memory.
    pub hits: u64,
    /// Starts that read the backlog or storage.
    pub misses: u64,
}

/// The numbers of one workspace as `start` loaded them: last number per sequence, in the
/// kind's declaration order.
struct WsEntry {
    kind: WsKind,
    numbers: Box<[Number]>,
}

/// Hands out PLog offsets and per-workspace numbers for one partition.
///
/// Only its owner calls it (methods take `&mut self`); background work runs on a shared
/// [`Runtime`] or, with [`Sequencer::new_manual`], wherever the caller steps a [`Worker`].
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use monoseq_core::mem::MemSeqStorage;
/// use monoseq_core::{Number, PLogOffset, Params, Runtime, SeqId, SeqValue, Sequencer, Start, WsId, WsKind};
///
/// let storage = MemSeqStorage::new();
/// storage.append_event(PLogOffset(42), WsKind(1), &[SeqValue::new(WsId(7), SeqId(1), Number(13))])?;
/// let params = Params::builder().kind(WsKind(1), [(SeqId(1), Number(1))]).build()?;
/// let runtime = Runtime::new(1)?;
/// let mut seq = Sequencer::new(params, storage.clone(), &runtime);
///
/// let Start::Began(mut tx) = seq.start_wait(WsKind(1), WsId(7), Duration::from_secs(5))? else {
///     panic!("still busy");
/// };
/// assert_eq!(tx.plog_offset(), PLogOffset(43));
/// assert_eq!(tx.next(SeqId(1))?, Number(14));
/// // ... write the event durably, then:
/// tx.flush();
/// seq.shutdown();
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Poison and replacement
///
/// A sequencer whose worker panicked, whose writes a newer sequencer on the same storage fenced
/// off, or whose release-build invariant check failed is poisoned: from then on `start`
/// answers [`StartError::Poisoned`] with the [`PoisonReason`] (also in
/// [`SequencerStats::poison`]), however the transaction open at that moment ends. Replace it
/// with a new sequencer on the same storage value (a clone of the same `Arc`): its first
/// actualization claims a newer writer generation ([`SeqStorage::claim`]) before it reads
/// anything, so no write the old worker still makes can land after that.
///
/// A transaction borrows the sequencer, so a second `start` while one is open does not
/// compile:
///
/// ```compile_fail,E0499
/// # use monoseq_core::{mem::MemSeqStorage, *};
/// # let params = Params::builder().kind(WsKind(1), [(SeqId(1), Number(1))]).build().unwrap();
/// # let (mut seq, _w) = Sequencer::new_manual(params, MemSeqStorage::new());
/// let a = seq.start(WsKind(1), WsId(1)).unwrap();
/// let b = seq.start(WsKind(1), WsId(2)).unwrap();
/// drop((a, b));
/// ```
///
/// A finished transaction is consumed, so `next` after `flush` does not compile:
///
/// ```compile_fail,E0382
/// # use monoseq_core::{mem::MemSeqStorage, *};
/// # let params = Params::builder().kind(WsKind(1), [(SeqId(1), Number(1))]).build().unwrap();
/// # let (mut seq, _w) = Sequencer::new_manual(params, MemSeqStorage::new());
/// let Start::Began(mut tx) = seq.start(WsKind(1), WsId(1)).unwrap() else { return };
/// tx.flush();
/// tx.next(SeqId(1)).unwrap();
/// ```
///
/// `next` exists only on a transaction, so it cannot be called without `start`:
///
/// ```compile_fail,E0599
/// # use monoseq_core::{mem::MemSeqStorage, *};
/// # let params = Params::builder().kind(WsKind(1), [(SeqId(1), Number(1))]).build().unwrap();
/// # let (mut seq, _w) = Sequencer::new_manual(params, MemSeqStorage::new());
/// seq.next(SeqId(1));
/// ```
///
/// Shutdown consumes the sequencer, so nothing can start after it:
///
/// ```compile_fail,E0382
/// # use monoseq_core::{mem::MemSeqStorage, *};
/// # let params = Params::builder().kind(WsKind(1), [(SeqId(1), Number(1))]).build().unwrap();
/// # let (mut seq, _w) = Sequencer::new_manual(params, MemSeqStorage::new());
/// seq.shutdown();
/// let _ = seq.start(WsKind(1), WsId(1));
/// ```
pub struct Sequencer<S: SeqStorage> {
    shared: Arc<Shared<S>>,
    #[cfg(feature = "tokio")]
    driver: Option<DriverHandle>,
    cache: LruMap<WsId, WsEntry, ByLength, hashbrown::DefaultHashBuilder>,
    cache_capacity: usize,
    /// Tags of workspaces that missed the full cache once (see [`Sequencer::admit`]);
    /// allocated when the cache first fills.
    doorkeeper: Vec<u32>,
    /// The workspace of the last transaction: consecutive transactions of one workspace touch
    /// no hash table. Its cache entry may be stale while `current_dirty`; it is written back
    /// before the cache is used for another workspace, so it is never evicted unsaved.
    current: Option<(WsId, WsKind)>,
    /// Last numbers of `current`, advanced in place by `next` (a rollback discards them).
    current_numbers: Vec<Number>,
    current_dirty: bool,
    /// An evicted entry's allocation, reused for the next workspace loaded from storage.
    spare: Option<Box<[Number]>>,
    /// Numbers of transactions committed before their events are durable (group commit),
    /// latest per key; they reach the backlog at `mark_durable`, never storage before.
    pending: NumberMap,
    /// The offset after the last pending transaction.
    pending_next_offset: Option<PLogOffset>,
    /// Sequences `next` advanced in the open transaction, one bit per kind index.
    tx_touched: u64,
    /// Storage-read scratch.
    read_buf: Vec<Number>,
    next_offset: PLogOffset,
    /// An actualization was requested: before the next transaction, drop cached numbers and
    /// take the offset the actualization reached.
    resync: bool,
    stats: CacheStats,
}

impl<S: SeqStorage> std::fmt::Debug for Sequencer<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sequencer")
            .field("status", &self.shared.status())
            .field("next_offset", &self.next_offset)
            .field("cached_workspaces", &self.cache.len())
            .finish_non_exhaustive()
    }
}

impl<S: SeqStorage> Sequencer<S> {
    /// Creates a sequencer whose background work runs on `runtime`, and starts actualization:
    /// `start` answers busy until it has finished. The actualization first claims a new writer
    /// generation of `storage`, which fences off every earlier sequencer on the same storage
    /// value. (Feature `tokio`.)
    #[cfg(feature = "tokio")]
    pub fn new(params: Params, storage: S, runtime: &Runtime) -> Sequencer<S> {
        let shared = Arc::new(Shared::new(params, storage));
        let driver = runtime.spawn(Worker::new(Arc::clone(&shared)), Arc::clone(&shared));
        let mut seq = Sequencer::with_shared(shared);
        seq.driver = Some(driver);
        seq
    }

    /// Creates a sequencer whose background work runs only when the caller steps the returned
    /// [`Worker`] (deterministic simulation, or an embedder's own event loop). Actualization
    /// is due at once: `start` answers busy until a step has run it.
    #[must_use]
    pub fn new_manual(params: Params, storage: S) -> (Sequencer<S>, Worker<S>) {
        let shared = Arc::new(Shared::new(params, storage));
        let worker = Worker::new(Arc::clone(&shared));
        (Sequencer::with_shared(shared), worker)
    }

    fn with_shared(shared: Arc<Shared<S>>) -> Sequencer<S> {
        let cap = shared.params.cache_workspaces_max;
        shared.wake.notify_one();
        Sequencer {
            shared,
            #[cfg(feature = "tokio")]
            driver: None,
            cache: LruMap::with_hasher(
                ByLength::new(u32::try_from(cap).unwrap_or(u32::MAX)),
                hashbrown::DefaultHashBuilder::default(),
            ),
            cache_capacity: cap,
            doorkeeper: Vec::new(),
            current: None,
            current_numbers: Vec::new(),
            current_dirty: false,
            spare: None,
            pending: NumberMap::default(),
            pending_next_offset: None,
            tx_touched: 0,
            read_buf: Vec::new(),
            next_offset: PLogOffset::FIRST,
            resync: true,
            stats: CacheStats::default(),
        }
    }

    /// The state it shares with its worker (for `wait.rs`).
    pub(crate) fn shared(&self) -> &Shared<S> {
        &self.shared
    }

    /// A handle that reads this sequencer's status and counters from any thread.
    #[must_use]
    pub fn handle(&self) -> SequencerHandle<S> {
        SequencerHandle {
            shared: Arc::clone(&self.shared),
        }
    }

    /// What the sequencer is doing now.
    #[must_use]
    pub fn status(&self) -> Status {
        self.shared.status()
    }

    /// Cache hits and misses of `start` so far.
    #[must_use]
    pub fn cache_stats(&self) -> CacheStats {
        self.stats
    }

    /// The parameters this sequencer runs with.
    #[must_use]
    pub fn params(&self) -> &Params {
        &self.shared.params
    }

    /// Workspaces whose numbers are in memory: the cache plus the current workspace.
    #[must_use]
    pub fn cached_workspaces(&self) -> usize {
        self.cache.len()
    }

    /// The storage this sequencer works on.
    #[must_use]
    pub fn storage(&self) -> &S {
        &self.shared.storage
    }

    /// Begins a sequencing transaction for workspace `ws` of kind `kind`. The transaction
    /// carries the PLog offset for the event; its numbers come from [`Transaction::next`].
    ///
    /// Answers [`Start::Busy`] while actualization runs, while the backlog has no room for
    /// what this transaction may add (the kind's sequence count) within
    /// `backlog_values_max`, or when storage fails to read the workspace's numbers.
    ///
    /// # Errors
    ///
    /// [`StartError::UnknownWsKind`] for a kind not in [`Params`];
    /// [`StartError::Poisoned`] once the sequencer is poisoned (its worker panicked or was
    /// fenced off, or an invariant check failed), whatever happened to the transaction open
    /// at that moment; [`StartError::PLogExhausted`] when the PLog offset reached `u64::MAX`.
    pub fn start(&mut self, kind: WsKind, ws: WsId) -> Result<Start<'_, S>, StartError> {
        let sh = &*self.shared;
        let Some(kind_index) = sh.params.kinds.iter().position(|k| k.kind == kind) else {
            return Err(StartError::UnknownWsKind(kind));
        };
        match sh.status() {
            Status::Ready => {}
            Status::None | Status::Actualizing => {
                if sh.actualize_failing.load(Ordering::Acquire)
                    && sh.storage_corrupted.load(Ordering::Acquire)
                {
                    return Err(StartError::Corrupted);
                }
                return Ok(Start::Busy(
                    if sh.actualize_failing.load(Ordering::Acquire) {
                        Busy::StorageUnavailable
                    } else {
                        Busy::Actualizing
                    },
                ));
            }
            // Only a poison finishes a sequencer its owner still holds (shutdown and drop
            // consume it); a reason is always recorded before the stop flag.
            Status::Finished => {
                return Err(StartError::Poisoned(
                    sh.poison_reason().unwrap_or(PoisonReason::WorkerPanicked),
                ));
            }
            Status::InTransaction => unreachable!("a transaction borrows the sequencer"),
        }
        // Room for every sequence of the kind: one transaction adds at most that many values.
        let may_add = sh.params.kinds[kind_index].seqs.len();
        if sh.backlog_len.load(Ordering::Acquire) + self.pending.len() + may_add
            > sh.params.backlog_values_max
        {
            return Ok(Start::Busy(if sh.flush_failing.load(Ordering::Acquire) {
                Busy::StorageUnavailable
            } else {
                Busy::BacklogFull
            }));
        }
        if self.resync {
            self.resynchronize();
        }
        if self.next_offset.0 == u64::MAX {
            // Its event could be written, but no offset would follow it: refuse now rather
            // than fail after the event is durable.
            return Err(StartError::PLogExhausted(self.next_offset));
        }
        if self.current == Some((ws, kind)) {
            self.stats.hits += 1;
        } else if let Err(kind) = self.load(kind_index, ws) {
            if kind == StorageErrorKind::Corrupted {
                return Err(StartError::Corrupted);
            }
            return Ok(Start::Busy(Busy::StorageUnavailable));
        }
        self.tx_touched = 0;
        self.shared.set_status(Status::InTransaction);
        Ok(Start::Began(Transaction {
            offset: self.next_offset,
            kind_index,
            ws,
            seq: self,
            done: false,
        }))
    }

    /// Stops the background work, flushing what it can, and returns within the shutdown
    /// timeout even while storage is down. Consumes the sequencer: nothing can start after.
    #[cfg_attr(not(feature = "tokio"), allow(unused_mut))] // the driver is taken out of it
    pub fn shutdown(mut self) -> ShutdownReport {
        self.shared.finish();
        #[cfg(feature = "tokio")]
        let stopped_in_time = match self.driver.take() {
            Some(d) => d.wait(self.shared.params.shutdown_timeout),
            None => true,
        };
        #[cfg(not(feature = "tokio"))]
        let stopped_in_time = true;
        ShutdownReport {
            stopped_in_time,
            unflushed_values: self.shared.backlog_len.load(Ordering::Acquire),
        }
    }

    fn resynchronize(&mut self) {
        let next = self
            .shared
            .lock_backlog()
            .next_offset
            .expect("actualization sets the in-memory checkpoint before Ready");
        self.next_offset = next;
        self.cache.clear();
        self.current = None;
        self.resync = false;
    }

    /// Makes `ws` the current workspace: writes the previous one back to the cache and loads
    /// the numbers of `ws` from the cache, the backlog, or storage (in that order).
    fn load(&mut self, kind_index: usize, ws: WsId) -> Result<(), StorageErrorKind> {
        if let Some((old_ws, _)) = self.current.take()
            && std::mem::take(&mut self.current_dirty)
            && let Some(entry) = self.cache.peek_mut(&old_ws)
        {
            entry.numbers.copy_from_slice(&self.current_numbers);
        }
        let sh = Arc::clone(&self.shared);
        let kind: &KindSequences = &sh.params.kinds[kind_index];
        self.current_numbers.clear();
        let cached = match self.cache.get(&ws) {
            Some(entry) if entry.kind == kind.kind => {
                self.stats.hits += 1;
                self.current_numbers.extend_from_slice(&entry.numbers);
                self.current = Some((ws, kind.kind));
                return Ok(());
            }
            Some(_) => true,
            None => false,
        };
        self.stats.misses += 1;
        self.current_numbers.resize(kind.seqs.len(), Number(0));
        if !self.load_unflushed(kind, ws) {
            self.load_stored(kind, ws)?;
        }
        self.cache_current(kind, ws, cached);
        Ok(())
    }

    /// Takes the newest numbers of `ws` that have not reached storage (pending, in the
    /// backlog, or being flushed) into `current_numbers`; answers whether every sequence of
    /// the kind had one.
    fn load_unflushed(&mut self, kind: &KindSequences, ws: WsId) -> bool {
        let b = self.shared.lock_backlog();
        let pending = self.pending.get(ws);
        let backlog = b.values.get(ws);
        let flushing = b.flushing.as_ref().and_then(|f| f.get(ws));
        if pending.is_none() && backlog.is_none() && flushing.is_none() {
            return false;
        }
        let mut complete = true;
        for (slot, &seq) in self.current_numbers.iter_mut().zip(&kind.seqs) {
            let newest = [pending, backlog, flushing]
                .into_iter()
                .flatten()
                .filter_map(|n| n.get(seq))
                .max();
            match newest {
                Some(n) => *slot = n,
                None => complete = false,
            }
        }
        complete
    }

    /// Raises `current_numbers` to the stored numbers of `ws`. Values missing from the backlog
    /// were flushed before we looked (the flusher drops the numbers it writes only once they
    /// are written), so storage has them.
    fn load_stored(&mut self, kind: &KindSequences, ws: WsId) -> Result<(), StorageErrorKind> {
        let sh = &*self.shared;
        self.read_buf.clear();
        self.read_buf.resize(kind.seqs.len(), Number(0));
        if let Err(e) = sh.storage.read_numbers(ws, &kind.seqs, &mut self.read_buf) {
            sh.metrics.storage_errors.fetch_add(1, Ordering::Relaxed);
            return Err(e.kind());
        }
        for (slot, &stored) in self.current_numbers.iter_mut().zip(&self.read_buf) {
            *slot = (*slot).max(stored);
        }
        Ok(())
    }

    /// Makes `ws`, just loaded into `current_numbers`, the current workspace, and keeps it in
    /// the cache unless the cache is full and does not admit it (`cached`: the cache holds
    /// `ws` under another kind, which this entry replaces).
    fn cache_current(&mut self, kind: &KindSequences, ws: WsId, cached: bool) {
        self.current = Some((ws, kind.kind));
        if !cached && self.cache.len() >= self.cache_capacity && !self.admit(ws) {
            // Held only as the current workspace; its numbers go to the backlog on commit.
            return;
        }
        let numbers = match self.spare.take() {
            Some(mut b) if b.len() == kind.seqs.len() => {
                b.copy_from_slice(&self.current_numbers);
                b
            }
            _ => self.current_numbers.clone().into_boxed_slice(),
        };
        let entry = WsEntry {
            kind: kind.kind,
            numbers,
        };
        if !cached
            && self.cache.len() >= self.cache_capacity
            && let Some((_, evicted)) = self.cache.pop_oldest()
        {
            self.spare = Some(evicted.numbers);
        }
        self.cache.insert(ws, entry);
    }

    /// Whether `ws`, missing from a full cache, may evict an entry: only on its second miss
    /// while the doorkeeper still remembers the first. A stream of workspaces seen once (a
    /// scan, or more workspaces in rotation than the cache holds) then costs no eviction and
    /// does not push out the workspaces in use.
    fn admit(&mut self, ws: WsId) -> bool {
        if self.doorkeeper.is_empty() {
            self.doorkeeper = vec![0; self.cache_capacity.next_power_of_two()];
        }
        let h = ws.0.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let i = (h >> 32) as usize & (self.doorkeeper.len() - 1);
        let tag = (h as u32) | 1;
        let seen = self.doorkeeper[i] == tag;
        self.doorkeeper[i] = if seen { 0 } else { tag };
        seen
    }

    /// Commits the open transaction's numbers as pending: handed out, not yet durable.
    fn commit_pending(&mut self, ws: WsId, kind_index: usize, offset: PLogOffset) {
        self.assert_commits_the_started_offset(offset);
        let kind = &self.shared.params.kinds[kind_index];
        self.pending.set_all(
            ws,
            touched(self.tx_touched, &kind.seqs, &self.current_numbers),
        );
        self.current_dirty = true;
        self.next_offset = offset.next();
        self.pending_next_offset = Some(self.next_offset);
        self.shared.set_status(Status::Ready);
    }

    /// Declares every pending transaction's event durable: their numbers join the backlog and
    /// the flusher may persist them. Call it after the group's events were written durably.
    pub fn mark_durable(&mut self) {
        let Some(next_offset) = self.pending_next_offset.take() else {
            return;
        };
        let sh = &*self.shared;
        {
            let mut b = sh.lock_backlog();
            // Paired with the check in `commit` that the backlog reached the committed offset:
            // the backlog's high-water mark never goes down.
            assert!(
                b.next_offset.is_none_or(|o| o <= next_offset),
                "the backlog's next offset {:?} would go back to {next_offset}",
                b.next_offset
            );
            b.values.take_from(&mut self.pending);
            b.next_offset = Some(next_offset);
            sh.publish_backlog_len(b.len(), sh.params.backlog_urgent());
        }
        sh.metrics
            .next_offset
            .store(next_offset.0, Ordering::Relaxed);
        if sh.backlog_len.load(Ordering::Relaxed) >= sh.params.backlog_urgent() {
            sh.wake.notify_one();
        }
        sh.signal_flush();
    }

    /// Transactions committed with [`Transaction::commit_pending`] and not yet marked durable.
    #[must_use]
    pub fn has_pending(&self) -> bool {
        self.pending_next_offset.is_some()
    }

    /// Discards every pending transaction and starts actualization: the PLog decides which of
    /// their numbers were used. Call it when writing a group of events failed. `start`
    /// answers busy until actualization finishes.
    pub fn actualize(&mut self) {
        self.rollback();
    }

    fn commit(&mut self, ws: WsId, kind_index: usize, offset: PLogOffset) {
        // This event is durable, so are the pending ones before it (one PLog, written in
        // order).
        self.mark_durable();
        self.assert_commits_the_started_offset(offset);
        let sh = &*self.shared;
        let kind = &sh.params.kinds[kind_index];
        let next_offset = offset.next();
        let urgent = sh.params.backlog_urgent();
        let (before, after) = {
            let mut b = sh.lock_backlog();
            if b.next_offset != Some(offset) {
                // Paired with the check where actualization reads the checkpoint back: a
                // checkpoint that skipped or repeated an event would let a flush cover numbers
                // it does not hold, and a restart hand them out again.
                let backlog = b.next_offset.unwrap_or(PLogOffset(0));
                drop(b);
                sh.poison(PoisonReason::BacklogOffsetMismatch {
                    backlog,
                    committing: offset,
                });
                return;
            }
            let before = b.len();
            let numbers = touched(self.tx_touched, &kind.seqs, &self.current_numbers);
            // A lookup in the backlog per commit: measurable on the hot path, so debug only.
            #[cfg(debug_assertions)]
            assert_numbers_rise(b.values.get(ws), numbers.clone());
            b.values.set_all(ws, numbers);
            b.next_offset = Some(next_offset);
            let after = b.len();
            sh.publish_backlog_len(after, urgent);
            (before, after)
        };
        self.current_dirty = true;
        self.next_offset = next_offset;
        sh.metrics
            .next_offset
            .store(next_offset.0, Ordering::Relaxed);
        sh.set_status(Status::Ready);
        if before < urgent && after >= urgent {
            // Filling up: cut the batching delay short.
            sh.wake.notify_one();
        }
        sh.signal_flush();
    }

    /// Precondition of a commit: the transaction commits the offset `start` handed out, the
    /// one the sequencer's next offset still holds; the commit then moves it past `offset`.
    #[inline]
    fn assert_commits_the_started_offset(&self, offset: PLogOffset) {
        assert_eq!(
            offset, self.next_offset,
            "a transaction commits the PLog offset start handed out"
        );
    }

    fn rollback(&mut self) {
        self.pending.clear();
        self.pending_next_offset = None;
        self.resync = true;
        self.current = None;
        self.current_dirty = false;
        let sh = &*self.shared;
        sh.set_status(Status::Actualizing);
        sh.wake.notify_one();
    }
}

/// Precondition of a commit into the backlog: every number a transaction hands out is above
/// the one the backlog holds for its key (`backlog`, the workspace's entry there), so a flush
/// never lowers a stored number.
#[cfg(debug_assertions)]
fn assert_numbers_rise(
    backlog: Option<&WsNumbers>,
    numbers: impl Iterator<Item = (SeqId, Number)>,
) {
    let Some(backlog) = backlog else {
        return;
    };
    for (seq, number) in numbers {
        if let Some(held) = backlog.get(seq) {
            assert!(
                number > held,
                "{seq:?} would hand out {number:?}, not above the backlog's {held:?}"
            );
        }
    }
}

/// The sequences a transaction advanced (bits of `touched`, by kind index) with their numbers.
fn touched<'a>(
    touched: u64,
    seqs: &'a [SeqId],
    numbers: &'a [Number],
) -> impl Iterator<Item = (SeqId, Number)> + Clone + 'a {
    let mut bits = touched;
    std::iter::from_fn(move || {
        if bits == 0 {
            return None;
        }
        let i = bits.trailing_zeros() as usize;
        bits &= bits - 1;
        Some((seqs[i], numbers[i]))
    })
}

#[cfg(feature = "tokio")]
impl<S: SeqStorage> Drop for Sequencer<S> {
    fn drop(&mut self) {
        if self.driver.is_some() {
            // Not shut down explicitly: stop background work without waiting for it.
            self.shared.finish();
        }
    }
}

/// An open sequencing transaction. Finish it with [`flush`](Self::flush) once the event is
/// durable, or [`actualize`](Self::actualize) when writing it failed; one that handed out
/// nothing may [`cancel`](Self::cancel) instead. Dropping it unfinished actualizes, so its
/// numbers are handed out again unless the PLog shows them used.
#[must_use = "finish the transaction with flush() or actualize()"]
pub struct Transaction<'a, S: SeqStorage> {
    seq: &'a mut Sequencer<S>,
    offset: PLogOffset,
    kind_index: usize,
    ws: WsId,
    done: bool,
}

impl<S: SeqStorage> std::fmt::Debug for Transaction<'_, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transaction")
            .field("offset", &self.offset)
            .field("ws", &self.ws)
            .finish_non_exhaustive()
    }
}

impl<S: SeqStorage> Transaction<'_, S> {
    /// The PLog offset for this transaction's event.
    #[must_use]
    pub fn plog_offset(&self) -> PLogOffset {
        self.offset
    }

    /// The workspace of the transaction.
    #[must_use]
    pub fn ws(&self) -> WsId {
        self.ws
    }

    /// Hands out the next number of sequence `seq` of the transaction's workspace.
    ///
    /// # Errors
    ///
    /// [`NextError::UnknownSequence`] if the workspace kind has no such sequence;
    /// [`NextError::Exhausted`] if it reached `u64::MAX`. The transaction stays usable.
    #[inline]
    pub fn next(&mut self, seq: SeqId) -> Result<Number, NextError> {
        let kind = &self.seq.shared.params.kinds[self.kind_index];
        let Some(i) = kind.index_of(seq) else {
            return Err(NextError::UnknownSequence {
                kind: kind.kind,
                seq,
            });
        };
        let last = self.seq.current_numbers[i];
        let initial = kind.initial[i];
        let n = if last < initial {
            initial
        } else {
            Number(
                last.0
                    .checked_add(1)
                    .ok_or(NextError::Exhausted { ws: self.ws, seq })?,
            )
        };
        self.seq.current_numbers[i] = n;
        self.seq.tx_touched |= 1 << i;
        Ok(n)
    }

    /// The last number of sequence `seq` in the transaction's workspace, without handing one
    /// out: the largest stored or handed out (by this transaction's [`next`](Self::next)
    /// too), `Number(0)` when there is none. It is not raised to the sequence's initial value:
    /// a workspace that never had a number answers `Number(0)` whatever its initial value, and
    /// a number below the initial value (carried by an event without this sequence handing it
    /// out, or handed out before the initial value was raised) is answered as it is; `next`
    /// then hands out the initial value.
    ///
    /// # Errors
    ///
    /// [`NextError::UnknownSequence`] if the workspace kind has no such sequence.
    #[inline]
    pub fn current(&self, seq: SeqId) -> Result<Number, NextError> {
        let kind = &self.seq.shared.params.kinds[self.kind_index];
        match kind.index_of(seq) {
            Some(i) => Ok(self.seq.current_numbers[i]),
            None => Err(NextError::UnknownSequence {
                kind: kind.kind,
                seq,
            }),
        }
    }

    /// Ends a transaction that handed out nothing as if it never started: its PLog offset goes
    /// to the next transaction, every sequence keeps its numbers, nothing reaches the backlog
    /// and no actualization runs. For a command refused after a look at
    /// [`current`](Self::current), such as an append on an expected WLog offset that does not
    /// match.
    ///
    /// # Errors
    ///
    /// The transaction itself, unchanged, once [`next`](Self::next) handed out a number: a
    /// number handed out cannot be taken back without the PLog deciding. Finish it with
    /// [`flush`](Self::flush), [`commit_pending`](Self::commit_pending) or
    /// [`actualize`](Self::actualize) (dropping it actualizes).
    ///
    /// # Example
    ///
    /// ```
    /// use monoseq_core::mem::MemSeqStorage;
    /// use monoseq_core::{Number, PLogOffset, Params, SeqId, Sequencer, Start, Step, WsId, WsKind};
    ///
    /// let params = Params::builder().kind(WsKind(1), [(SeqId(1), Number(1))]).build()?;
    /// let (mut seq, mut worker) = Sequencer::new_manual(params, MemSeqStorage::new());
    /// assert_eq!(worker.step(), Step::Idle); // actualized
    /// let Start::Began(tx) = seq.start(WsKind(1), WsId(7))? else { panic!("busy") };
    /// assert_eq!(tx.current(SeqId(1))?, Number(0)); // no number yet
    /// tx.cancel().expect("nothing was handed out");
    /// let Start::Began(mut tx) = seq.start(WsKind(1), WsId(7))? else { panic!("busy") };
    /// assert_eq!(tx.plog_offset(), PLogOffset(1)); // the cancelled one took no offset
    /// assert_eq!(tx.next(SeqId(1))?, Number(1));
    /// let tx = tx.cancel().expect_err("a number was handed out");
    /// tx.actualize();
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn cancel(mut self) -> Result<(), Self> {
        if self.seq.tx_touched != 0 {
            return Err(self);
        }
        self.done = true;
        self.seq.shared.set_status(Status::Ready);
        Ok(())
    }

    /// Commits the transaction: call it only after the event is durable in the PLog. Its
    /// numbers and offset become the workspace's last ones; the flusher persists them. Pending
    /// transactions before it become durable too.
    pub fn flush(mut self) {
        self.done = true;
        self.seq.commit(self.ws, self.kind_index, self.offset);
    }

    /// Commits the transaction before its event is durable, for group commit: the next
    /// transaction continues after its numbers and offset, but nothing of it is persisted
    /// until [`Sequencer::mark_durable`]. If writing the group fails, call
    /// [`Sequencer::actualize`]: the PLog then decides which numbers were used.
    pub fn commit_pending(mut self) {
        self.done = true;
        self.seq
            .commit_pending(self.ws, self.kind_index, self.offset);
    }

    /// Abandons the transaction and starts actualization: the PLog decides which numbers were
    /// used. `start` answers busy until actualization finishes.
    pub fn actualize(mut self) {
        self.done = true;
        self.seq.rollback();
    }
}

impl<S: SeqStorage> Drop for Transaction<'_, S> {
    fn drop(&mut self) {
        if !self.done {
            self.seq.rollback();
        }
    }
}

/// Reads a sequencer's status and counters from any thread.
pub struct SequencerHandle<S: SeqStorage> {
    shared: Arc<Shared<S>>,
}

impl<S: SeqStorage> SequencerHandle<S> {
    /// The state it shares with the sequencer (for `wait.rs`).
    pub(crate) fn shared(&self) -> &Shared<S> {
        &self.shared
    }
}

impl<S: SeqStorage> Clone for SequencerHandle<S> {
    fn clone(&self) -> Self {
        SequencerHandle {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<S: SeqStorage> std::fmt::Debug for SequencerHandle<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SequencerHandle")
            .field("status", &self.status())
            .finish_non_exhaustive()
    }
}

/// A point-in-time reading of a sequencer's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct SequencerStats {
    /// Current status.
    pub status: Status,
    /// Values waiting for the flusher.
    pub backlog_values: usize,
    /// The last checkpoint written to storage (0 before the first).
    pub durable_offset: u64,
    /// The PLog offset after the last committed (durable) event; `next_offset -
    /// durable_offset` is the checkpoint lag in events.
    pub next_offset: u64,
    /// How long the last actualization took, in microseconds.
    pub last_actualization_micros: u64,
    /// Completed actualizations.
    pub actualizations: u64,
    /// Events replayed by all actualizations (grows during one: progress).
    pub replayed_events: u64,
    /// Successful flushes.
    pub flushes: u64,
    /// Failed storage calls.
    pub storage_errors: u64,
    /// The last flush or actualization failed and is being retried.
    pub storage_failing: bool,
    /// The sequencer is poisoned: `start` answers [`StartError::Poisoned`]; replace it with
    /// a new sequencer on the same storage value.
    pub poisoned: bool,
    /// The last failed storage call found damaged bytes.
    pub storage_corrupted: bool,
    /// Why it is poisoned.
    pub poison: Option<PoisonReason>,
}

impl<S: SeqStorage> SequencerHandle<S> {
    /// What the sequencer is doing now.
    #[must_use]
    pub fn status(&self) -> Status {
        self.shared.status()
    }

    /// The counters now.
    #[must_use]
    pub fn stats(&self) -> SequencerStats {
        let sh = &*self.shared;
        let m = &sh.metrics;
        SequencerStats {
            status: sh.status(),
            backlog_values: sh.backlog_len.load(Ordering::Acquire),
            durable_offset: m.durable_offset.load(Ordering::Relaxed),
            next_offset: m.next_offset.load(Ordering::Relaxed),
            last_actualization_micros: m.last_actualization_micros.load(Ordering::Relaxed),
            actualizations: m.actualizations.load(Ordering::Relaxed),
            replayed_events: m.replayed_events.load(Ordering::Relaxed),
            flushes: m.flushes.load(Ordering::Relaxed),
            storage_errors: m.storage_errors.load(Ordering::Relaxed),
            storage_failing: sh.flush_failing.load(Ordering::Acquire)
                || sh.actualize_failing.load(Ordering::Acquire),
            poisoned: sh.poisoned.load(Ordering::Acquire),
            storage_corrupted: sh.storage_corrupted.load(Ordering::Acquire),
            poison: sh.poison_reason(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem::MemSeqStorage;
    use crate::worker::Step;

    fn params() -> Params {
        Params::builder()
            .kind(WsKind(1), [(SeqId(1), Number(1))])
            .build()
            .expect("valid parameters")
    }

    #[test]
    fn a_commit_at_an_offset_the_backlog_did_not_reach_poisons_instead_of_panicking() {
        let (mut seq, mut worker) = Sequencer::new_manual(params(), MemSeqStorage::new());
        assert_eq!(worker.step(), Step::Idle);
        let shared = Arc::clone(&seq.shared);
        let Ok(Start::Began(mut tx)) = seq.start(WsKind(1), WsId(1)) else {
            panic!("no transaction");
        };
        assert_eq!(tx.next(SeqId(1)), Ok(Number(1)));
        // Broken state: the backlog's checkpoint skipped ahead of the open transaction.
        shared.lock_backlog().next_offset = Some(PLogOffset(5));
        tx.flush();
        let reason = PoisonReason::BacklogOffsetMismatch {
            backlog: PLogOffset(5),
            committing: PLogOffset(1),
        };
        assert_eq!(
            seq.start(WsKind(1), WsId(1)).map(|_| ()),
            Err(StartError::Poisoned(reason))
        );
        assert!(shared.lock_backlog().values.is_empty(), "nothing committed");
        assert_eq!(worker.step(), Step::Stopped);
    }

    #[test]
    #[should_panic(expected = "commits the PLog offset start handed out")]
    fn committing_an_offset_start_did_not_hand_out_panics() {
        let (mut seq, mut worker) = Sequencer::new_manual(params(), MemSeqStorage::new());
        assert_eq!(worker.step(), Step::Idle);
        seq.commit(WsId(1), 0, PLogOffset(3));
    }

    #[test]
    #[should_panic(expected = "the backlog's next offset")]
    fn marking_a_group_durable_below_the_backlog_panics() {
        let (mut seq, mut worker) = Sequencer::new_manual(params(), MemSeqStorage::new());
        assert_eq!(worker.step(), Step::Idle);
        let shared = Arc::clone(&seq.shared);
        let Ok(Start::Began(mut tx)) = seq.start(WsKind(1), WsId(1)) else {
            panic!("no transaction");
        };
        assert_eq!(tx.next(SeqId(1)), Ok(Number(1)));
        tx.commit_pending();
        // Broken state: the backlog's high-water mark is above the pending group.
        shared.lock_backlog().next_offset = Some(PLogOffset(7));
        seq.mark_durable();
    }

    #[test]
    #[should_panic(expected = "not above the backlog's")]
    fn committing_a_number_not_above_the_backlog_panics() {
        let (mut seq, mut worker) = Sequencer::new_manual(params(), MemSeqStorage::new());
        assert_eq!(worker.step(), Step::Idle);
        let shared = Arc::clone(&seq.shared);
        let Ok(Start::Began(mut tx)) = seq.start(WsKind(1), WsId(1)) else {
            panic!("no transaction");
        };
        assert_eq!(tx.next(SeqId(1)), Ok(Number(1)));
        // Broken state: the backlog holds a higher number than the one just handed out.
        shared
            .lock_backlog()
            .values
            .set_all(WsId(1), [(SeqId(1), Number(5))]);
        tx.flush();
    }
}
