//! Background worker of one sequencer: actualization (replay of the PLog tail into the backlog,
//! merging by maximum) and flushing (writing the backlog with its checkpoint). One worker per
//! sequencer and one step at a time, so storage sees a single writer and a checkpoint can never
//! overtake the values it covers. Steps are plain function calls: the driver runs them on a
//! shared pool, a simulation runs them in a seeded order.

use std::mem;

use hashbrown::HashMap;
use std::ops::ControlFlow;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::shared::{Shared, Status};
use crate::storage::{ReplayEnd, ReplayedEvent, SeqStorage, StorageError};
use crate::types::{Number, NumberKey, PLogOffset, SeqId, SeqValue};

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
    /// The sequencer was shut down; do not call again.
    Stopped,
}

/// Runs the background work of one sequencer, one step per call.
pub struct Worker<S: SeqStorage> {
    shared: Arc<Shared<S>>,
    buf: Vec<SeqValue>,
    stale: Stale,
    failures: u32,
}

/// Drops replayed values that storage already covers, reading storage as little as possible.
#[derive(Default)]
struct Stale {
    keys: Vec<NumberKey>,
    seqs: Vec<SeqId>,
    stored: Vec<Number>,
    /// During one actualization: per workspace, numbers storage is known to hold at least
    /// (read from it, or written by this replay); without it, every replay flush would read
    /// every workspace it touches again. Emptied when it reaches `known_max` numbers (twice
    /// the replay budget): a bound, not a recency policy.
    known: HashMap<NumberKey, Number>,
    known_max: usize,
}

impl Stale {
    fn begin(&mut self, capacity: usize) {
        self.known.clear();
        self.known_max = capacity.max(1);
    }

    fn end(&mut self) {
        self.known = HashMap::new();
        self.known_max = 0;
    }

    /// Removes from `values` every number storage already holds or exceeds, so a replay of a
    /// PLog with out-of-order numbers can never lower a stored sequence (SPEC invariant 5).
    /// Reads storage at most once per workspace and actualization while the workspace stays
    /// in the known set.
    fn drop_covered<S: SeqStorage>(
        &mut self,
        storage: &S,
        values: &mut HashMap<NumberKey, Number>,
    ) -> Result<(), StorageError> {
        self.keys.clear();
        self.keys.extend(values.keys().copied());
        self.keys.sort_unstable();
        for group in self.keys.chunk_by(|a, b| a.ws == b.ws) {
            let ws = group[0].ws;
            if self.known_max > 0 && self.known.len() >= self.known_max {
                self.known.clear();
            }
            self.seqs.clear();
            self.seqs.extend(
                group
                    .iter()
                    .filter(|k| !self.known.contains_key(*k))
                    .map(|k| k.seq),
            );
            if !self.seqs.is_empty() {
                self.stored.clear();
                self.stored.resize(self.seqs.len(), Number(0));
                storage.read_numbers(ws, &self.seqs, &mut self.stored)?;
                for (&seq, &n) in self.seqs.iter().zip(&self.stored) {
                    self.known.insert(NumberKey { ws, seq }, n);
                }
            }
            for key in group {
                let stored = self.known.get(key).copied().unwrap_or_default();
                if values.get(key).is_some_and(|v| *v <= stored) {
                    values.remove(key);
                }
            }
        }
        if self.known_max == 0 {
            self.known.clear();
        }
        Ok(())
    }

    /// Notes values this replay wrote: storage now holds at least them.
    fn written(&mut self, values: &[SeqValue]) {
        for v in values {
            if let Some(n) = self.known.get_mut(&v.key) {
                *n = (*n).max(v.value);
            }
        }
    }
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
            stale: Stale::default(),
            failures: 0,
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
    pub(crate) fn final_flush(&mut self) -> Result<(), StorageError> {
        let Some(offset) = self.snapshot() else {
            return Ok(());
        };
        self.write_snapshot(offset)
    }

    fn flush(&mut self) -> Step {
        self.shared.flush_signalled.store(false, Ordering::Release);
        let Some(offset) = self.snapshot() else {
            return Step::Idle;
        };
        match self.write_snapshot(offset) {
            Ok(()) => Step::Idle,
            Err(_) => self.failed(),
        }
    }

    /// Copies the backlog into `buf`; answers the checkpoint to write, or `None` when storage
    /// is already up to date.
    fn snapshot(&mut self) -> Option<PLogOffset> {
        let b = self.shared.lock_backlog();
        let offset = b.next_offset?;
        if b.values.is_empty() && b.durable_offset == Some(offset) {
            return None;
        }
        self.buf.clear();
        self.buf.extend(
            b.values
                .iter()
                .map(|(&key, &value)| SeqValue { key, value }),
        );
        Some(offset)
    }

    fn write_snapshot(&mut self, offset: PLogOffset) -> Result<(), StorageError> {
        let sh = &*self.shared;
        if let Err(e) = sh
            .storage
            .write_values_and_next_plog_offset(&self.buf, offset)
        {
            sh.flush_failing.store(true, Ordering::Release);
            sh.metrics.storage_errors.fetch_add(1, Ordering::Relaxed);
            return Err(e);
        }
        let mut b = sh.lock_backlog();
        // Keep what changed since the snapshot: it is newer than what was written.
        for v in &self.buf {
            if b.values.get(&v.key) == Some(&v.value) {
                b.values.remove(&v.key);
            }
        }
        debug_assert!(b.next_offset >= Some(offset));
        b.durable_offset = Some(offset);
        sh.backlog_len.store(b.values.len(), Ordering::Release);
        drop(b);
        sh.metrics.durable_offset.store(offset.0, Ordering::Relaxed);
        sh.metrics.flushes.fetch_add(1, Ordering::Relaxed);
        sh.flush_failing.store(false, Ordering::Release);
        self.failures = 0;
        Ok(())
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
    fn replay_start(&self) -> Result<PLogOffset, StorageError> {
        if let Some(o) = self.shared.lock_backlog().next_offset {
            return Ok(o);
        }
        let stored = self.shared.storage.read_next_plog_offset()?;
        self.shared
            .metrics
            .durable_offset
            .store(stored.0, Ordering::Relaxed);
        let mut b = self.shared.lock_backlog();
        b.next_offset = Some(stored);
        b.durable_offset = Some(stored);
        Ok(stored)
    }

    fn actualize(&mut self) -> Step {
        let sh = Arc::clone(&self.shared);
        if sh.status() == Status::None && !sh.transition(Status::None, Status::Actualizing) {
            return Step::Stopped;
        }
        let from = match self.replay_start() {
            Ok(o) => o,
            Err(_) => return self.failed_actualization(),
        };
        let limit = sh.params.replay_values_max;
        let mut values = mem::take(&mut sh.lock_backlog().values);
        let mut next = from;
        let mut durable = None;
        let mut events = 0u64;
        let mut inline_error = None;
        // The known-stored map may hold twice the replay budget: a tail whose workspaces
        // slightly outnumber one window's then reads each workspace once, not twice.
        self.stale
            .begin(sh.params.replay_values_max.saturating_mul(2));
        let buf = &mut self.buf;
        let stale = &mut self.stale;
        let replayed = sh.storage.replay_plog(from, &mut |ev: ReplayedEvent<'_>| {
            if sh.stop.load(Ordering::Relaxed) {
                return ControlFlow::Break(());
            }
            if ev.offset < next {
                inline_error = Some(StorageError::new(format!(
                    "replay went backwards: event {} after {}; the PLog scan is broken",
                    ev.offset, next
                )));
                return ControlFlow::Break(());
            }
            let kind = sh.params.kind(ev.ws_kind);
            for v in ev.values {
                // Numbers below a sequence's initial value (external, reserved or singleton
                // IDs) must never move it: skip them (SPEC invariant 5, seed issue #688).
                let below_initial = kind
                    .and_then(|k| k.index_of(v.key.seq).map(|i| v.value < k.initial[i]))
                    .unwrap_or(false);
                if v.value.0 == 0 || below_initial {
                    continue;
                }
                let e = values.entry(v.key).or_insert(Number(0));
                if v.value > *e {
                    *e = v.value;
                }
            }
            next = ev.offset.next();
            events += 1;
            if events.is_multiple_of(PROGRESS_EVERY_EVENTS) {
                sh.metrics
                    .replayed_events
                    .fetch_add(PROGRESS_EVERY_EVENTS, Ordering::Relaxed);
            }
            if values.len() >= limit {
                // Backlog full: make room by writing it, with the checkpoint it reaches.
                if let Err(e) = stale.drop_covered(&sh.storage, &mut values) {
                    inline_error = Some(e);
                    return ControlFlow::Break(());
                }
                buf.clear();
                buf.extend(values.iter().map(|(&key, &value)| SeqValue { key, value }));
                if let Err(e) = sh.storage.write_values_and_next_plog_offset(buf, next) {
                    inline_error = Some(e);
                    return ControlFlow::Break(());
                }
                stale.written(buf);
                values.clear();
                durable = Some(next);
            }
            ControlFlow::Continue(())
        });
        sh.metrics
            .replayed_events
            .fetch_add(events % PROGRESS_EVERY_EVENTS, Ordering::Relaxed);
        let completed = matches!((&replayed, &inline_error), (Ok(ReplayEnd::Completed), None));
        if completed && let Err(e) = self.stale.drop_covered(&sh.storage, &mut values) {
            inline_error = Some(e);
        }
        self.stale.end();
        {
            // Whatever happened, the backlog is exact up to `next`: keep the progress.
            let mut b = sh.lock_backlog();
            b.values = values;
            b.next_offset = Some(next);
            if durable.is_some() {
                b.durable_offset = durable;
            }
            sh.backlog_len.store(b.values.len(), Ordering::Release);
        }
        sh.metrics.next_offset.store(next.0, Ordering::Relaxed);
        if let Some(d) = durable {
            sh.metrics.durable_offset.store(d.0, Ordering::Relaxed);
        }
        match (replayed, inline_error) {
            (Ok(ReplayEnd::Completed), None) => {}
            (Ok(ReplayEnd::Stopped), None) => return Step::Stopped,
            _ => return self.failed_actualization(),
        }
        // Flush promptly, so a restart replays as little as possible; if storage refuses,
        // the backlog is exact and the flusher retries.
        let flushed = match self.snapshot() {
            Some(offset) => self.write_snapshot(offset).is_ok(),
            None => true,
        };
        sh.actualize_failing.store(false, Ordering::Release);
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

    fn failed_actualization(&mut self) -> Step {
        let sh = &self.shared;
        sh.actualize_failing.store(true, Ordering::Release);
        sh.metrics.storage_errors.fetch_add(1, Ordering::Relaxed);
        self.failed()
    }
}
