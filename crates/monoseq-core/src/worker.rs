//! Background worker of one sequencer: actualization (replay of the PLog tail into the backlog,
//! merging by maximum) and flushing (writing the backlog with its checkpoint). One worker per
//! sequencer and one step at a time, so storage sees a single writer and a checkpoint can never
//! overtake the values it covers. Steps are plain function calls: the driver runs them on a
//! shared pool, a simulation runs them in a seeded order.

use hashbrown::HashMap;
use std::ops::ControlFlow;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::params::KindSequences;
use crate::shared::{PoisonReason, Shared, Status};
use crate::storage::{Generation, ReplayEnd, ReplayedEvent, SeqStorage, StorageError};
use crate::types::{Number, NumberKey, PLogOffset, SeqValue, WsId};
use crate::ws_numbers::{NumberMap, WsNumbers};

/// How often (in events) replay publishes its progress counter.
const PROGRESS_EVERY_EVENTS: u64 = 1024;

/// What a background step asks of whoever drives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Step {
    /// Nothing to do until the sequencer signals again.
    Idle,
    /// Storage failed; call again after this delay (exponential backoff).
    RetryAfter(Duration),
    /// The sequencer was shut down or is poisoned (a newer sequencer fenced its writes off,
    /// or an invariant check failed); do not call again.
    Stopped,
}

/// Runs the background work of one sequencer, one step per call.
pub struct Worker<S: SeqStorage> {
    shared: Arc<Shared<S>>,
    buf: Vec<SeqValue>,
    /// The numbers of the flush in progress (shared with `Backlog::flushing` while it runs);
    /// between flushes an empty map whose capacity the next flush reuses.
    flushing: Arc<NumberMap>,
    stale: Stale,
    failures: u32,
    /// The last actualization ended before its replay did: the backlog holds replayed numbers
    /// not yet compared with storage, so they must not be written until a replay completes.
    replay_unchecked: bool,
    /// The writer generation claimed at the first actualization; `Generation(0)` (which
    /// storage always fences off) until then.
    generation: Generation,
}

/// Merges an event's numbers into `window` by maximum, one lookup per run of one workspace's
/// numbers. Zeros and numbers below their sequence's initial value are skipped: they never
/// move a sequence (invariant 5 and the #688 replay rule of docs/invariants.md).
fn merge_event(window: &mut NumberMap, kind: Option<&KindSequences>, values: &[SeqValue]) {
    let counts = |v: &&SeqValue| {
        let below_initial = kind
            .and_then(|k| k.index_of(v.key.seq).map(|i| v.value < k.initial[i]))
            .unwrap_or(false);
        v.value.0 != 0 && !below_initial
    };
    for run in values.chunk_by(|a, b| a.key.ws == b.key.ws) {
        window.raise_all(
            run[0].key.ws,
            run.iter().filter(counts).map(|v| (v.key.seq, v.value)),
        );
    }
}

/// Drops replayed values that storage already covers, reading storage as little as possible.
#[derive(Default)]
struct Stale {
    keys: Vec<NumberKey>,
    stored: Vec<Number>,
    /// During one actualization: per workspace, numbers storage is known to hold at least
    /// (read from it, or about to be written by this replay); without it, every replay flush
    /// would read every workspace it touches again. Emptied when it holds `known_max` numbers
    /// (twice the replay budget): a bound, not a recency policy.
    known: HashMap<WsId, WsNumbers>,
    known_len: usize,
    known_max: usize,
    /// Known numbers of the workspaces being compared, copied out of `known`.
    copies: Vec<WsNumbers>,
    /// The window being written, copied out of its map and sorted by workspace.
    order: Vec<(WsId, WsNumbers)>,
    /// Windows compared in this replay; workspaces of the current window, and how many of
    /// them were known; whether the last window's workspaces recurred.
    windows: u32,
    seen: usize,
    hits: usize,
    recurring: bool,
}

impl Stale {
    fn begin(&mut self, capacity: usize) {
        self.forget();
        self.known_max = capacity.max(1);
        self.windows = 0;
        self.seen = 0;
        self.hits = 0;
        self.recurring = false;
    }

    fn end(&mut self) {
        self.known = HashMap::new();
        self.known_len = 0;
        self.order = Vec::new();
    }

    /// Adds to `out` every number of `workspaces` that storage does not already hold or exceed, so
    /// a replay of a PLog with out-of-order numbers can never lower a stored sequence (invariant 5
    /// of docs/invariants.md). Reads storage at most once per workspace and actualization while the
    /// workspace stays in the known set; `remember` says whether to add the workspaces to it (see
    /// [`Stale::remember_window`]; never for the last window of a replay, which no later window
    /// will ask about). Counts what it adds to `out` as written: the caller writes it next, or
    /// abandons the actualization.
    fn uncovered<S: SeqStorage>(
        &mut self,
        storage: &S,
        workspaces: &[(WsId, WsNumbers)],
        remember: bool,
        out: &mut Vec<SeqValue>,
    ) -> Result<(), StorageError> {
        // Bound the known set before looking anything up in it, so a workspace found known
        // below is still known when its numbers are compared.
        if remember && self.known_len >= self.known_max {
            self.forget();
        }
        self.read_unknown(storage, workspaces)?;
        self.compare(workspaces, remember, out);
        Ok(())
    }

    /// Reads every number of `workspaces` not known yet, in one call, in key order, into
    /// `keys`/`stored`; what is known is copied once into `copies`, so the compare does not
    /// look it up again.
    fn read_unknown<S: SeqStorage>(
        &mut self,
        storage: &S,
        workspaces: &[(WsId, WsNumbers)],
    ) -> Result<(), StorageError> {
        self.keys.clear();
        self.copies.clear();
        let known_any = !self.known.is_empty();
        for (ws, numbers) in workspaces {
            let ws = *ws;
            let known = if known_any {
                self.known.get(&ws).cloned().unwrap_or_default()
            } else {
                WsNumbers::default()
            };
            self.hits += usize::from(!known.is_empty());
            let first = self.keys.len();
            self.keys.extend(
                numbers
                    .iter()
                    .map(|(seq, _)| seq)
                    .filter(|&seq| known.get(seq).is_none())
                    .map(|seq| NumberKey { ws, seq }),
            );
            self.keys[first..].sort_unstable();
            self.copies.push(known);
        }
        self.seen += workspaces.len();
        self.stored.clear();
        self.stored.resize(self.keys.len(), Number(0));
        if !self.keys.is_empty() {
            storage.read_numbers_many(&self.keys, &mut self.stored)?;
        }
        Ok(())
    }

    /// Adds to `out` every number of `workspaces` above what storage holds (`copies` and
    /// `stored`, from [`read_unknown`](Self::read_unknown)), and keeps what storage will hold
    /// in the known set.
    fn compare(
        &mut self,
        workspaces: &[(WsId, WsNumbers)],
        remember: bool,
        out: &mut Vec<SeqValue>,
    ) {
        let mut at = 0;
        for (i, (ws, numbers)) in workspaces.iter().enumerate() {
            let ws = *ws;
            let mut stored = std::mem::take(&mut self.copies[i]);
            let was_known = !stored.is_empty();
            let first = at;
            while at < self.keys.len() && self.keys[at].ws == ws {
                stored.set(self.keys[at].seq, self.stored[at]);
                at += 1;
            }
            for (seq, value) in numbers.iter() {
                if stored.get(seq).is_some_and(|n| value > n) {
                    stored.set(seq, value);
                    out.push(SeqValue {
                        key: NumberKey { ws, seq },
                        value,
                    });
                }
            }
            // A known workspace is updated even when the window is not remembered: a later
            // window must compare with what this one wrote, not with an older read.
            if remember || was_known {
                self.known_len += at - first;
                self.known.insert(ws, stored);
            }
        }
    }

    /// Whether the window about to be compared should add its workspaces to the known set:
    /// always the first window of a replay, then only while windows keep meeting known
    /// workspaces (a tail where workspaces recur), and every fourth window to notice when
    /// they start recurring. A tail of ever new workspaces then costs no bookkeeping.
    fn remember_window(&self) -> bool {
        self.windows.is_multiple_of(4) || self.recurring
    }

    /// A window was compared (`remembered`: its workspaces joined the known set): the next
    /// one decides on this one's hits. Once a window not remembered finds no recurrence, the
    /// known set is dropped, so the windows until the next remembered one look nothing up.
    fn window_done(&mut self, remembered: bool) {
        self.windows += 1;
        if self.seen > 0 {
            self.recurring = self.hits * 16 >= self.seen;
        }
        if !remembered && !self.recurring {
            self.forget();
        }
        self.hits = 0;
        self.seen = 0;
    }

    /// Forgets every known number (the set is full, or a write of what `uncovered` answered
    /// failed).
    fn forget(&mut self) {
        self.known.clear();
        self.known_len = 0;
    }
}

/// Workspaces compared with storage and written back per storage call, so a workspace's stored
/// data is written while the read brought it close (it is still in the CPU cache, or in the
/// engine's block cache).
const WRITE_CHUNK_WORKSPACES: usize = 512;

/// Writes the numbers of `window` that storage does not already cover, in workspace order (an
/// ordered store then reads and writes neighbouring keys one after the other), with the checkpoint
/// `next` that the window reaches. Chunks before the last are written with the checkpoint storage
/// already holds (`stored`), so no checkpoint ever precedes its values. `last`: no window follows
/// in this replay. On failure `buf` holds every number found new if the window was compared in full
/// (only the last write failed), and is empty otherwise.
#[allow(
    clippy::too_many_arguments,
    reason = "one call site per window kind, all named"
)]
fn write_window<S: SeqStorage>(
    storage: &S,
    generation: Generation,
    stale: &mut Stale,
    window: &NumberMap,
    buf: &mut Vec<SeqValue>,
    stored: Option<PLogOffset>,
    next: PLogOffset,
    last: bool,
) -> Result<(), StorageError> {
    // Copied out in the table's order (sequential reads), then sorted: comparing in
    // workspace order straight from the table would miss the CPU cache once per workspace.
    let mut order = std::mem::take(&mut stale.order);
    order.clear();
    order.extend(window.workspaces().map(|(ws, n)| (ws, n.clone())));
    order.sort_unstable_by_key(|&(ws, _)| ws);
    let written = write_sorted(storage, generation, stale, &order, buf, stored, next, last);
    stale.order = order;
    written
}

/// [`write_window`] of the window's workspaces in ascending order.
#[allow(
    clippy::too_many_arguments,
    reason = "write_window's arguments, passed on"
)]
fn write_sorted<S: SeqStorage>(
    storage: &S,
    generation: Generation,
    stale: &mut Stale,
    order: &[(WsId, WsNumbers)],
    buf: &mut Vec<SeqValue>,
    stored: Option<PLogOffset>,
    next: PLogOffset,
    last: bool,
) -> Result<(), StorageError> {
    let chunk = if stored.is_some() {
        WRITE_CHUNK_WORKSPACES
    } else {
        order.len().max(1)
    };
    buf.clear();
    let mut written = 0;
    let remember = !last && stale.remember_window();
    let mut chunks = order.chunks(chunk).peekable();
    while let Some(workspaces) = chunks.next() {
        if let Err(e) = stale.uncovered(storage, workspaces, remember, buf) {
            buf.clear();
            stale.forget();
            return Err(e);
        }
        if let Some(stored) = stored
            && chunks.peek().is_some()
            && buf.len() > written
        {
            if let Err(e) = storage.write_fenced(generation, &buf[written..], stored) {
                buf.clear();
                stale.forget();
                return Err(e);
            }
            written = buf.len();
        }
    }
    stale.window_done(remember);
    storage
        .write_fenced(generation, &buf[written..], next)
        .inspect_err(|_| stale.forget())
}

/// What one actualization's replay reached.
struct Replay {
    /// Numbers replayed and not yet written.
    window: NumberMap,
    /// The offset after the last replayed event.
    next: PLogOffset,
    /// The checkpoint this replay wrote, if it wrote one.
    durable: Option<PLogOffset>,
    /// The checkpoint storage held when the replay began.
    stored_checkpoint: Option<PLogOffset>,
    events: u64,
    /// Why the replay stopped early, found inside the scan or writing its last window.
    error: Option<StorageError>,
}

impl Replay {
    /// The checkpoint storage holds now.
    fn stored(&self) -> Option<PLogOffset> {
        self.durable.or(self.stored_checkpoint)
    }

    /// Takes one replayed event into the window, and writes the window with the checkpoint it
    /// reaches when it is full.
    fn take<S: SeqStorage>(
        &mut self,
        ev: ReplayedEvent<'_>,
        sh: &Shared<S>,
        generation: Generation,
        stale: &mut Stale,
        buf: &mut Vec<SeqValue>,
    ) -> ControlFlow<()> {
        if sh.stop.load(Ordering::Relaxed) {
            return ControlFlow::Break(());
        }
        if let Err(e) = self.advance(ev.offset) {
            self.error = Some(e);
            return ControlFlow::Break(());
        }
        merge_event(&mut self.window, sh.params.kind(ev.ws_kind), ev.values);
        self.events += 1;
        if self.events.is_multiple_of(PROGRESS_EVERY_EVENTS) {
            sh.metrics
                .replayed_events
                .fetch_add(PROGRESS_EVERY_EVENTS, Ordering::Relaxed);
        }
        if self.window.len() >= sh.params.replay_values_max {
            let (stored, next) = (self.stored(), self.next);
            let written = write_window(
                &sh.storage,
                generation,
                stale,
                &self.window,
                buf,
                stored,
                next,
                false,
            );
            if let Err(e) = written {
                self.error = Some(e);
                return ControlFlow::Break(());
            }
            self.window.clear();
            self.durable = Some(next);
        }
        ControlFlow::Continue(())
    }

    /// Moves past the event at `offset`, which must not go back and must have a successor.
    fn advance(&mut self, offset: PLogOffset) -> Result<(), StorageError> {
        if offset < self.next {
            return Err(StorageError::new(format!(
                "replay went backwards: event {offset} after {}; the PLog scan is broken",
                self.next
            )));
        }
        let Some(after) = offset.0.checked_add(1) else {
            return Err(StorageError::corrupted(format!(
                "the PLog holds an event at offset {offset}, which nothing can follow"
            )));
        };
        self.next = PLogOffset(after);
        Ok(())
    }
}

/// How writing the last window of a replay went.
struct LastWindow {
    /// The numbers the backlog keeps: those not written.
    backlog: NumberMap,
    flushed: bool,
    fenced: bool,
}

impl LastWindow {
    /// Nothing failed; `backlog` is kept (the whole window when it was not written).
    fn kept(backlog: NumberMap) -> LastWindow {
        LastWindow {
            backlog,
            flushed: true,
            fenced: false,
        }
    }
}

/// The numbers a failed write found new (`buf`, in workspace order), as a map by workspace.
fn found_new(buf: &[SeqValue]) -> NumberMap {
    let mut new = NumberMap::default();
    for run in buf.chunk_by(|a, b| a.key.ws == b.key.ws) {
        new.set_all(run[0].key.ws, run.iter().map(|v| (v.key.seq, v.value)));
    }
    new
}

impl<S: SeqStorage> std::fmt::Debug for Worker<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("failures", &self.failures)
            .finish_non_exhaustive()
    }
}

impl<S: SeqStorage> Worker<S> {
    pub(crate) fn new(shared: Arc<Shared<S>>) -> Worker<S> {
        Worker {
            shared,
            buf: Vec::new(),
            flushing: Arc::default(),
            stale: Stale::default(),
            failures: 0,
            replay_unchecked: false,
            generation: Generation(0),
        }
    }

    /// Does the next piece of background work: the whole actualization when one is due,
    /// otherwise one flush of the backlog.
    pub fn step(&mut self) -> Step {
        if self.shared.stop.load(Ordering::Acquire) {
            return Step::Stopped;
        }
        match self.shared.status() {
            Status::None | Status::Actualizing => self.actualize(),
            Status::Ready | Status::InTransaction => self.flush(),
            Status::Finished => Step::Stopped,
        }
    }

    /// One last flush attempt at shutdown, if anything is unflushed and state is exact.
    #[cfg_attr(not(feature = "tokio"), allow(dead_code))] // used by the driver
    pub(crate) fn final_flush(&mut self) -> Result<(), StorageError> {
        if self.replay_unchecked {
            return Ok(());
        }
        let Some(offset) = self.snapshot() else {
            return Ok(());
        };
        self.write_snapshot(offset)
    }

    fn flush(&mut self) -> Step {
        self.shared.flush_signalled.store(false, Ordering::Release);
        let Some(offset) = self.snapshot() else {
            // Nothing to write, or a failed check poisoned the sequencer.
            return if self.shared.stop.load(Ordering::Acquire) {
                Step::Stopped
            } else {
                Step::Idle
            };
        };
        match self.write_snapshot(offset) {
            Ok(()) => Step::Idle,
            Err(e) => self.failed_with(&e),
        }
    }

    /// Moves the backlog's numbers to `Backlog::flushing` (a swap under the lock) and copies
    /// them into `buf`; answers the checkpoint to write, or `None` when storage is already up
    /// to date.
    fn snapshot(&mut self) -> Option<PLogOffset> {
        let mut b = self.shared.lock_backlog();
        let offset = b.next_offset?;
        debug_assert!(b.flushing.is_none(), "one flush at a time");
        if b.values.is_empty() && b.durable_offset == Some(offset) {
            return None;
        }
        if let Some(durable) = b.durable_offset
            && offset < durable
        {
            // Paired with the check where actualization reads the checkpoint back: a lower
            // checkpoint would make a restart replay from before numbers this one covers.
            drop(b);
            self.shared.poison(PoisonReason::CheckpointWouldGoBack {
                durable,
                writing: offset,
            });
            return None;
        }
        // Unique between flushes (the backlog dropped its clone when the last one ended), so
        // `make_mut` does not copy.
        std::mem::swap(Arc::make_mut(&mut self.flushing), &mut b.values);
        b.flushing = Some(Arc::clone(&self.flushing));
        drop(b);
        self.buf.clear();
        self.buf.extend(self.flushing.values());
        Some(offset)
    }

    fn write_snapshot(&mut self, offset: PLogOffset) -> Result<(), StorageError> {
        let sh = &*self.shared;
        let written = sh.storage.write_fenced(self.generation, &self.buf, offset);
        let mut b = sh.lock_backlog();
        b.end_flush(written.is_ok());
        sh.backlog_len.store(b.len(), Ordering::Release);
        if written.is_ok() {
            // Paired with the check in `snapshot` that poisons instead of writing a lower
            // checkpoint: the flushed high-water mark never goes down.
            assert!(
                b.durable_offset.is_none_or(|d| d <= offset),
                "the flushed checkpoint {:?} would go back to {offset}",
                b.durable_offset
            );
            b.durable_offset = Some(offset);
        }
        drop(b);
        Arc::make_mut(&mut self.flushing).clear();
        if let Err(e) = written {
            sh.flush_failing.store(true, Ordering::Release);
            sh.metrics.storage_errors.fetch_add(1, Ordering::Relaxed);
            return Err(e);
        }
        sh.metrics.durable_offset.store(offset.0, Ordering::Relaxed);
        sh.metrics.flushes.fetch_add(1, Ordering::Relaxed);
        sh.flush_failing.store(false, Ordering::Release);
        self.failures = 0;
        Ok(())
    }

    /// A storage call failed with `e`: a fenced write stops the worker for good (a newer
    /// sequencer owns the storage), anything else is retried with backoff.
    fn failed_with(&mut self, e: &StorageError) -> Step {
        if e.is_fenced() {
            self.shared.poison(PoisonReason::Fenced);
            return Step::Stopped;
        }
        self.failed()
    }

    fn failed(&mut self) -> Step {
        self.failures = self.failures.saturating_add(1);
        let p = &self.shared.params;
        let shift = (self.failures - 1).min(20);
        let delay = p
            .retry_delay_min
            .saturating_mul(1 << shift)
            .min(p.retry_delay_max);
        Step::RetryAfter(delay)
    }

    /// Reads the checkpoint to replay from: the in-memory one when state is exact up to it,
    /// otherwise the stored one.
    ///
    /// The first call claims a writer generation before reading anything, so no write of an
    /// earlier sequencer on this storage lands after this one read the checkpoint. `Ok(None)`:
    /// the sequencer is poisoned (storage lost a checkpoint it acknowledged).
    fn replay_start(&mut self) -> Result<Option<PLogOffset>, StorageError> {
        if let Some(o) = self.shared.lock_backlog().next_offset {
            return Ok(Some(o));
        }
        let written = if self.generation == Generation(0) {
            let claim = self.shared.storage.claim()?;
            self.generation = claim.generation;
            claim.checkpoint_written
        } else {
            None
        };
        let stored = self.shared.storage.read_next_plog_offset()?;
        if stored < PLogOffset::FIRST {
            return Err(StorageError::corrupted(format!(
                "the stored checkpoint is {stored}, below the first PLog offset: the projection \
                 is damaged; delete it to replay the whole PLog"
            )));
        }
        if let Some(written) = written
            && stored < written
        {
            // Paired with the checks where checkpoints are written (never lower than the one
            // stored): storage lost what it acknowledged (invariant 10 of docs/invariants.md).
            self.shared.poison(PoisonReason::CheckpointWentBack {
                written,
                read: stored,
            });
            return Ok(None);
        }
        self.shared
            .metrics
            .durable_offset
            .store(stored.0, Ordering::Relaxed);
        let mut b = self.shared.lock_backlog();
        b.next_offset = Some(stored);
        b.durable_offset = Some(stored);
        Ok(Some(stored))
    }

    fn actualize(&mut self) -> Step {
        let sh = Arc::clone(&self.shared);
        if sh.status() == Status::None && !sh.transition(Status::None, Status::Actualizing) {
            return Step::Stopped;
        }
        let from = match self.replay_start() {
            Ok(Some(o)) => o,
            Ok(None) => return Step::Stopped,
            Err(e) => return self.failed_actualization(&e),
        };
        let (mut replay, replayed) = self.replay_tail(from);
        let completed = matches!((&replayed, &replay.error), (Ok(ReplayEnd::Completed), None));
        let last = self.write_last_window(&mut replay, completed);
        self.stale.end();
        self.replay_unchecked = !(completed && replay.error.is_none());
        self.keep_progress(&replay, last.backlog);
        if last.fenced {
            sh.poison(PoisonReason::Fenced);
            return Step::Stopped;
        }
        match (replayed, replay.error) {
            (Ok(ReplayEnd::Completed), None) => {}
            (Ok(ReplayEnd::Stopped), None) => return Step::Stopped,
            (Err(e), _) | (_, Some(e)) => return self.failed_actualization(&e),
        }
        self.actualized(last.flushed)
    }

    /// Replays the PLog from `from` (the backlog is exact up to it) into a window of numbers,
    /// writing the window each time it fills up.
    fn replay_tail(&mut self, from: PLogOffset) -> (Replay, Result<ReplayEnd, StorageError>) {
        let sh = &*self.shared;
        let (window, stored_checkpoint) = {
            let mut b = sh.lock_backlog();
            debug_assert!(b.flushing.is_none(), "flushes end before the next step");
            (std::mem::take(&mut b.values), b.durable_offset)
        };
        let mut replay = Replay {
            window,
            next: from,
            durable: None,
            stored_checkpoint,
            events: 0,
            error: None,
        };
        // The known-stored map may hold twice the replay budget: a tail whose workspaces
        // slightly outnumber one window's then reads each workspace once, not twice.
        self.stale
            .begin(sh.params.replay_values_max.saturating_mul(2));
        let (generation, stale, buf) = (self.generation, &mut self.stale, &mut self.buf);
        let replayed = sh.storage.replay_plog(from, &mut |ev: ReplayedEvent<'_>| {
            replay.take(ev, sh, generation, stale, buf)
        });
        sh.metrics
            .replayed_events
            .fetch_add(replay.events % PROGRESS_EVERY_EVENTS, Ordering::Relaxed);
        (replay, replayed)
    }

    /// Writes the last window of a completed replay at once, so a restart replays as little as
    /// possible (invariant 7 of docs/invariants.md). If storage refuses, the numbers found new go
    /// to the backlog, exact, and the flusher retries them.
    fn write_last_window(&mut self, replay: &mut Replay, completed: bool) -> LastWindow {
        let window = std::mem::take(&mut replay.window);
        let up_to_date = window.is_empty() && replay.stored() == Some(replay.next);
        if !completed || up_to_date {
            return LastWindow::kept(window);
        }
        let sh = &*self.shared;
        let written = write_window(
            &sh.storage,
            self.generation,
            &mut self.stale,
            &window,
            &mut self.buf,
            replay.stored(),
            replay.next,
            true,
        );
        let Err(e) = written else {
            replay.durable = Some(replay.next);
            return LastWindow::kept(NumberMap::default());
        };
        sh.flush_failing.store(true, Ordering::Release);
        sh.metrics.storage_errors.fetch_add(1, Ordering::Relaxed);
        let backlog = if self.buf.is_empty() && !window.is_empty() {
            // The compare with storage failed: nothing is known to be new yet.
            replay.error = Some(StorageError::new("reading stored numbers failed"));
            window
        } else {
            found_new(&self.buf)
        };
        LastWindow {
            backlog,
            flushed: false,
            fenced: e.is_fenced(),
        }
    }

    /// Whatever happened, the backlog is exact up to where the replay reached: keep the
    /// progress (`values`: the numbers not yet written).
    fn keep_progress(&self, replay: &Replay, values: NumberMap) {
        let sh = &*self.shared;
        {
            let mut b = sh.lock_backlog();
            b.values = values;
            b.next_offset = Some(replay.next);
            if replay.durable.is_some() {
                b.durable_offset = replay.durable;
            }
            sh.backlog_len.store(b.len(), Ordering::Release);
        }
        sh.metrics
            .next_offset
            .store(replay.next.0, Ordering::Relaxed);
        if let Some(d) = replay.durable {
            sh.metrics.durable_offset.store(d.0, Ordering::Relaxed);
            sh.metrics.flushes.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A replay completed: clears the failure flags and opens the sequencer (`flushed`: its
    /// last window was written, otherwise the flusher retries it with backoff).
    fn actualized(&mut self, flushed: bool) -> Step {
        let sh = &*self.shared;
        if flushed {
            sh.flush_failing.store(false, Ordering::Release);
        }
        sh.actualize_failing.store(false, Ordering::Release);
        sh.storage_corrupted.store(false, Ordering::Release);
        sh.metrics.actualizations.fetch_add(1, Ordering::Relaxed);
        if !sh.transition(Status::Actualizing, Status::Ready) {
            return Step::Stopped;
        }
        if flushed {
            self.failures = 0;
            Step::Idle
        } else {
            self.failed()
        }
    }

    fn failed_actualization(&mut self, e: &StorageError) -> Step {
        let sh = &self.shared;
        sh.actualize_failing.store(true, Ordering::Release);
        sh.storage_corrupted.store(
            e.kind() == crate::storage::StorageErrorKind::Corrupted,
            Ordering::Release,
        );
        sh.metrics.storage_errors.fetch_add(1, Ordering::Relaxed);
        self.failed_with(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem::MemSeqStorage;
    use crate::params::Params;
    use crate::sequencer::{Sequencer, Start, StartError};
    use crate::types::{SeqId, WsKind};

    #[test]
    fn a_flush_that_would_lower_the_checkpoint_poisons_and_writes_nothing() {
        let params = Params::builder()
            .kind(WsKind(1), [(SeqId(1), Number(1))])
            .build()
            .expect("valid parameters");
        let storage = MemSeqStorage::new();
        let (mut seq, mut worker) = Sequencer::new_manual(params, Arc::clone(&storage));
        assert_eq!(worker.step(), Step::Idle);
        {
            // Broken state: the backlog's checkpoint is below the one already written.
            let mut b = worker.shared.lock_backlog();
            b.values.set_all(WsId(1), [(SeqId(1), Number(3))]);
            b.durable_offset = Some(PLogOffset(9));
            b.next_offset = Some(PLogOffset(4));
        }
        assert_eq!(worker.step(), Step::Stopped);
        assert_eq!(storage.checkpoint(), None, "nothing was written");
        let reason = PoisonReason::CheckpointWouldGoBack {
            durable: PLogOffset(9),
            writing: PLogOffset(4),
        };
        assert_eq!(
            seq.start(WsKind(1), WsId(1)).map(|_| ()),
            Err(StartError::Poisoned(reason))
        );
        assert!(!matches!(
            seq.start(WsKind(1), WsId(1)),
            Ok(Start::Began(_))
        ));
    }

    #[test]
    #[should_panic(expected = "the flushed checkpoint")]
    fn a_written_checkpoint_below_the_flushed_one_panics() {
        let params = Params::builder()
            .kind(WsKind(1), [(SeqId(1), Number(1))])
            .build()
            .expect("valid parameters");
        let (_seq, mut worker) = Sequencer::new_manual(params, MemSeqStorage::new());
        assert_eq!(worker.step(), Step::Idle);
        // Broken state: `snapshot`'s check was skipped and a lower checkpoint reaches the write.
        worker.shared.lock_backlog().durable_offset = Some(PLogOffset(9));
        let _ = worker.write_snapshot(PLogOffset(4));
    }
}
