//! State shared between the thread that owns a sequencer and its background worker: the
//! status word, the to-be-flushed backlog with its in-memory checkpoint, and the health flags.
//! Everything here is either an atomic or behind one short-held mutex.

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};

use crossbeam_utils::CachePadded;

use crate::params::Params;
use crate::storage::SeqStorage;
use crate::types::PLogOffset;
use crate::ws_numbers::NumberMap;

/// What a sequencer is doing, as the reference design's `SequenceStatus` (docs/invariants.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Status {
    /// Created; actualization is queued but no worker has picked it up yet.
    None,
    /// Rebuilding state from the checkpoint and the PLog tail; `start` answers busy.
    Actualizing,
    /// Ready for a transaction.
    Ready,
    /// A transaction is open.
    InTransaction,
    /// Shut down; nothing can start.
    Finished,
}

impl Status {
    fn from_u8(v: u8) -> Status {
        match v {
            0 => Status::None,
            1 => Status::Actualizing,
            2 => Status::Ready,
            3 => Status::InTransaction,
            _ => Status::Finished,
        }
    }

    fn to_u8(self) -> u8 {
        match self {
            Status::None => 0,
            Status::Actualizing => 1,
            Status::Ready => 2,
            Status::InTransaction => 3,
            Status::Finished => 4,
        }
    }
}

/// Why a sequencer stopped working (it is poisoned): `start` answers
/// [`StartError::Poisoned`](crate::StartError::Poisoned) with it from then on. The partition
/// heals with a new sequencer on the same storage value, which claims a newer generation and
/// actualizes from storage and the PLog.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum PoisonReason {
    /// A storage call of the background worker panicked.
    WorkerPanicked,
    /// Storage refused a write because a newer sequencer claimed it (invariant 11 of
    /// docs/invariants.md).
    Fenced,
    /// The checkpoint read back at actualization is below one written through the same
    /// storage value: storage lost acknowledged data (invariant 10 of docs/invariants.md).
    CheckpointWentBack {
        /// The checkpoint written before.
        written: PLogOffset,
        /// The checkpoint read back.
        read: PLogOffset,
    },
    /// A flush was about to write a checkpoint below the one already written.
    CheckpointWouldGoBack {
        /// The checkpoint storage holds.
        durable: PLogOffset,
        /// The checkpoint about to be written.
        writing: PLogOffset,
    },
    /// A committing transaction's offset is not the offset the backlog's checkpoint reached.
    BacklogOffsetMismatch {
        /// The backlog's checkpoint (0: none).
        backlog: PLogOffset,
        /// The committing transaction's offset.
        committing: PLogOffset,
    },
}

impl std::fmt::Display for PoisonReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PoisonReason::WorkerPanicked => {
                f.write_str("a storage call of the background worker panicked")
            }
            PoisonReason::Fenced => f.write_str(
                "the storage fenced this sequencer's writes off (a newer sequencer or another \
                 node claimed the partition, or the database went back in time); it stops",
            ),
            PoisonReason::CheckpointWentBack { written, read } => write!(
                f,
                "the stored checkpoint went back from {written} to {read}: storage lost acknowledged data"
            ),
            PoisonReason::CheckpointWouldGoBack { durable, writing } => write!(
                f,
                "a flush was about to lower the checkpoint from {durable} to {writing}"
            ),
            PoisonReason::BacklogOffsetMismatch {
                backlog,
                committing,
            } => write!(
                f,
                "a transaction at PLog offset {committing} committed where the backlog's checkpoint is {backlog}"
            ),
        }
    }
}

/// Committed numbers not yet durable in the projection, with the checkpoint they reach.
#[derive(Debug, Default)]
pub(crate) struct Backlog {
    /// Last number per key of committed transactions (or replayed events) not yet written,
    /// nor being written.
    pub(crate) values: NumberMap,
    /// The numbers the flusher is writing now, moved out of `values` whole when it began (so
    /// the lock is held for a swap, not a copy). For a key in both maps `values` is newer.
    /// `None` between flushes; a failed write merges them back into `values`.
    pub(crate) flushing: Option<Arc<NumberMap>>,
    /// In-memory checkpoint: storage plus `values` are exact up to here (exclusive). `None`
    /// until the first actualization has read the stored checkpoint.
    pub(crate) next_offset: Option<PLogOffset>,
    /// The checkpoint most recently written to storage.
    pub(crate) durable_offset: Option<PLogOffset>,
}

impl Backlog {
    /// Numbers not yet durable in storage: the limit `start` enforces.
    pub(crate) fn len(&self) -> usize {
        self.values.len() + self.flushing.as_ref().map_or(0, |f| f.len())
    }

    /// Ends the flush in progress: written numbers leave, numbers whose write failed go back
    /// into `values` (under the numbers committed since, which are newer).
    pub(crate) fn end_flush(&mut self, written: bool) {
        if let Some(flushing) = self.flushing.take()
            && !written
        {
            self.values.raise_from(&flushing);
        }
    }
}

pub(crate) struct Shared<S> {
    pub(crate) params: Params,
    pub(crate) storage: S,
    status: AtomicU8,
    pub(crate) backlog: Mutex<Backlog>,
    /// Mirror of `backlog.len()`, read without the lock by `start`.
    /// Padded to a cache line of its own, as is `stop`: a waiting worker reads both in a loop,
    /// and the status word and the backlog lock, written several times per transaction, must
    /// not share their line (bench (b): 0.80 → 0.73 µs per cycle, docs/benchmarks/sequencer.md).
    pub(crate) backlog_len: CachePadded<AtomicUsize>,
    /// The last flush attempt failed.
    pub(crate) flush_failing: AtomicBool,
    /// The last actualization attempt failed.
    pub(crate) actualize_failing: AtomicBool,
    /// The last failed storage call of the worker found damaged bytes.
    pub(crate) storage_corrupted: AtomicBool,
    /// A flush was requested and the worker has not taken its snapshot yet.
    pub(crate) flush_signalled: AtomicBool,
    /// Shutdown was requested: replay stops, the worker exits.
    pub(crate) stop: CachePadded<AtomicBool>,
    /// The sequencer is poisoned (see `poison`); `start` answers an error.
    pub(crate) poisoned: AtomicBool,
    /// Why, set once by the first poison.
    poison: OnceLock<PoisonReason>,
    /// Wakes the background driver.
    pub(crate) wake: tokio::sync::Notify,
    /// The worker thread waiting for the backlog while transactions come fast,
    /// and whether it waits now: committing threads unpark it, with no system call otherwise.
    backlog_waiter: Mutex<Option<std::thread::Thread>>,
    backlog_waiting: AtomicBool,
    /// Signalled when actualization ends, for `start_wait` (`wait.rs`).
    pub(crate) status_signal: StatusSignal,
    pub(crate) metrics: Metrics,
}

/// Counters readable from any thread.
#[derive(Debug, Default)]
pub(crate) struct Metrics {
    pub(crate) actualizations: AtomicU64,
    pub(crate) replayed_events: AtomicU64,
    pub(crate) last_actualization_micros: AtomicU64,
    pub(crate) flushes: AtomicU64,
    pub(crate) storage_errors: AtomicU64,
    pub(crate) durable_offset: AtomicU64,
    pub(crate) next_offset: AtomicU64,
}

impl<S: SeqStorage> Shared<S> {
    pub(crate) fn new(params: Params, storage: S) -> Shared<S> {
        Shared {
            params,
            storage,
            status: AtomicU8::new(Status::None.to_u8()),
            backlog: Mutex::new(Backlog::default()),
            backlog_len: CachePadded::new(AtomicUsize::new(0)),
            flush_failing: AtomicBool::new(false),
            actualize_failing: AtomicBool::new(false),
            storage_corrupted: AtomicBool::new(false),
            flush_signalled: AtomicBool::new(false),
            stop: CachePadded::new(AtomicBool::new(false)),
            poisoned: AtomicBool::new(false),
            poison: OnceLock::new(),
            wake: tokio::sync::Notify::new(),
            backlog_waiter: Mutex::new(None),
            backlog_waiting: AtomicBool::new(false),
            status_signal: StatusSignal::default(),
            metrics: Metrics::default(),
        }
    }

    /// The status. `Finished` is final: once the stop flag is set (shutdown, drop or poison)
    /// nothing the owner or the worker writes into the status word can bring it back.
    #[inline]
    pub(crate) fn status(&self) -> Status {
        if self.stop.load(Ordering::Acquire) {
            return Status::Finished;
        }
        Status::from_u8(self.status.load(Ordering::Acquire))
    }

    /// Owner side: records the status of the owner's own progress (a transaction began,
    /// ended, or asked for actualization). Never overrides `Finished`: [`status`](Self::status)
    /// answers `Finished` whatever this word holds once the stop flag is set, so a poison
    /// that lands while a transaction is open stays visible.
    #[inline]
    pub(crate) fn set_status(&self, s: Status) {
        self.status.store(s.to_u8(), Ordering::Release);
    }

    /// Marks the sequencer poisoned for `reason` (the first reason wins) and stops it:
    /// `start` answers [`StartError::Poisoned`](crate::StartError::Poisoned) from now on.
    pub(crate) fn poison(&self, reason: PoisonReason) {
        let _ = self.poison.set(reason);
        self.poisoned.store(true, Ordering::Release);
        self.finish();
    }

    /// Why the sequencer is poisoned, if it is.
    pub(crate) fn poison_reason(&self) -> Option<PoisonReason> {
        if self.poisoned.load(Ordering::Acquire) {
            self.poison.get().copied()
        } else {
            None
        }
    }

    /// Moves `from` to `to` unless the status changed meanwhile (shutdown wins every race).
    pub(crate) fn transition(&self, from: Status, to: Status) -> bool {
        let done = self
            .status
            .compare_exchange(
                from.to_u8(),
                to.to_u8(),
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_ok();
        if done {
            self.notify_status();
        }
        done
    }

    /// Marks the sequencer finished and wakes everyone waiting on it.
    pub(crate) fn finish(&self) {
        self.stop.store(true, Ordering::Release);
        self.status
            .store(Status::Finished.to_u8(), Ordering::Release);
        self.wake.notify_one();
        self.notify_status();
    }

    fn notify_status(&self) {
        self.status_signal.notify();
    }

    #[inline]
    pub(crate) fn lock_backlog(&self) -> MutexGuard<'_, Backlog> {
        self.backlog.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Publishes the backlog's length after a commit, and wakes the worker waiting in
    /// [`begin_backlog_wait`](Shared::begin_backlog_wait) once it reaches `urgent`.
    #[inline]
    pub(crate) fn publish_backlog_len(&self, len: usize, urgent: usize) {
        // Sequentially consistent with the waiter's flag: either it sees this length, or this
        // thread sees it waiting.
        self.backlog_len.store(len, Ordering::SeqCst);
        if len >= urgent
            && self.backlog_waiting.load(Ordering::SeqCst)
            && self.backlog_waiting.swap(false, Ordering::SeqCst)
            && let Some(t) = &*self
                .backlog_waiter
                .lock()
                .unwrap_or_else(|e| e.into_inner())
        {
            t.unpark();
        }
    }

    /// Worker side: from now until [`end_backlog_wait`](Shared::end_backlog_wait), a commit
    /// that makes the backlog urgent unparks the calling thread.
    #[cfg_attr(not(feature = "tokio"), allow(dead_code))] // used by the driver
    pub(crate) fn begin_backlog_wait(&self) {
        *self
            .backlog_waiter
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(std::thread::current());
        self.backlog_waiting.store(true, Ordering::SeqCst);
    }

    #[cfg_attr(not(feature = "tokio"), allow(dead_code))] // used by the driver
    pub(crate) fn end_backlog_wait(&self) {
        self.backlog_waiting.store(false, Ordering::SeqCst);
    }

    /// The backlog's length as last published, ordered with
    /// [`begin_backlog_wait`](Shared::begin_backlog_wait).
    #[cfg_attr(not(feature = "tokio"), allow(dead_code))] // used by the driver
    pub(crate) fn backlog_len_now(&self) -> usize {
        self.backlog_len.load(Ordering::SeqCst)
    }

    /// Asks the worker to flush, waking it only when it is not already due to.
    #[inline]
    pub(crate) fn signal_flush(&self) {
        if !self.flush_signalled.load(Ordering::Relaxed)
            && !self.flush_signalled.swap(true, Ordering::AcqRel)
        {
            self.wake.notify_one();
        }
    }
}

/// Signalled whenever the status changes in a way a waiter cares about (actualization ended,
/// finish).
#[derive(Debug, Default)]
pub(crate) struct StatusSignal {
    pub(crate) lock: Mutex<()>,
    pub(crate) changed: Condvar,
}

impl StatusSignal {
    /// Wakes every waiter; takes the lock so that a waiter between its check and its wait
    /// cannot miss the wake-up.
    pub(crate) fn notify(&self) {
        let _guard = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        self.changed.notify_all();
    }
}
