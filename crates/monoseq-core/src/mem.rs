//! In-memory sequence storage with fault hooks: the reference [`SeqStorage`] for tests,
//! simulations and benchmarks. Every call (and every single value write) passes a hook that can
//! block, delay or fail it, and [`MemSeqStorage::snapshot`] takes the image a crash would leave.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use crate::storage::{
    Batcher, Fence, ReplayEnd, ReplayedEvent, SeqStorage, StorageError, check_out_len,
};
use crate::types::{Number, NumberKey, PLogOffset, SeqId, SeqValue, WsId, WsKind};
use crate::ws_table::WsTable;

/// Events copied out of the lock per replay round, so the batcher runs unlocked.
const REPLAY_CHUNK_EVENTS: usize = 4096;
/// Values written per lock hold when no hook is installed: a reader waits at most a few
/// cache misses, shorter than the mutex spins before it puts the thread to sleep.
const WRITE_CHUNK_VALUES: usize = 8;

/// A point where a hook runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Op {
    /// Before [`SeqStorage::read_numbers`].
    ReadNumbers(WsId),
    /// Before [`SeqStorage::read_next_plog_offset`].
    ReadNextPLogOffset,
    /// Before writing the `index`-th value of a [`SeqStorage::write_values_and_next_plog_offset`] call.
    WriteValue {
        /// Position of the value in the call.
        index: usize,
        /// The value about to be written.
        value: SeqValue,
    },
    /// Before writing the checkpoint, after every value of the call was written.
    WriteCheckpoint(PLogOffset),
    /// Before passing the event at this offset to the batcher during replay.
    ReplayEvent(PLogOffset),
    /// Before [`MemSeqStorage::append_event`].
    AppendEvent(PLogOffset),
}

/// A hook: runs before an operation, may block or sleep, and fails it by returning `Err`.
pub type Hook = dyn Fn(Op) -> Result<(), StorageError> + Send + Sync;

#[derive(Debug, Clone, Copy)]
struct PlogEntry {
    offset: PLogOffset,
    kind: WsKind,
    start: usize,
    len: usize,
}

impl State {
    fn get(&self, key: NumberKey) -> Number {
        self.numbers
            .get(key.ws)
            .and_then(|seqs| seqs.get(key.seq))
            .unwrap_or_default()
    }

    fn set(&mut self, key: NumberKey, value: Number) {
        self.numbers.set_all(key.ws, [(key.seq, value)]);
    }

    /// Sets `values`, looking each run of one workspace's values up once.
    fn set_all(&mut self, values: &[SeqValue]) {
        for run in values.chunk_by(|a, b| a.key.ws == b.key.ws) {
            self.numbers
                .set_all(run[0].key.ws, run.iter().map(|v| (v.key.seq, v.value)));
        }
    }
}

#[derive(Debug, Clone, Default)]
struct State {
    /// Per workspace, its sequences' numbers: one lookup, one cache line, reads a workspace.
    numbers: WsTable,
    checkpoint: Option<PLogOffset>,
    plog: Vec<PlogEntry>,
    plog_values: Vec<SeqValue>,
}

/// Sequence storage held in memory. Cloning the `Arc` shares it; [`snapshot`] copies it.
///
/// # Example
///
/// ```
/// use monoseq_core::mem::MemSeqStorage;
/// use monoseq_core::{Number, PLogOffset, SeqId, SeqStorage, SeqValue, WsId, WsKind};
///
/// let storage = MemSeqStorage::new();
/// storage
///     .append_event(PLogOffset(1), WsKind(1), &[SeqValue::new(WsId(7), SeqId(1), Number(13))])
///     .unwrap();
/// assert_eq!(storage.read_next_plog_offset().unwrap(), PLogOffset(1));
/// storage.fail_all("disk unplugged");
/// assert!(storage.read_next_plog_offset().is_err());
/// storage.clear_hook();
/// assert!(storage.read_next_plog_offset().is_ok());
/// ```
///
/// [`snapshot`]: MemSeqStorage::snapshot
#[derive(Default)]
pub struct MemSeqStorage {
    state: Mutex<State>,
    hook: RwLock<Option<Arc<Hook>>>,
    /// A hook is installed; without one, calls skip the hook lock.
    hooked: AtomicBool,
    /// Orders the writer generations of the sequencers sharing this storage.
    fence: Fence,
}

impl std::fmt::Debug for MemSeqStorage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = self.lock();
        f.debug_struct("MemSeqStorage")
            .field("workspaces", &st.numbers.len())
            .field("checkpoint", &st.checkpoint)
            .field("events", &st.plog.len())
            .finish()
    }
}

impl MemSeqStorage {
    /// Empty storage: no numbers, no checkpoint, an empty PLog.
    #[must_use]
    pub fn new() -> Arc<MemSeqStorage> {
        Arc::new(MemSeqStorage::default())
    }

    /// Empty storage with room for the numbers of `workspaces` workspaces, so filling it does
    /// not rehash (benchmarks set it up outside what they time; a copy keeps the room).
    #[must_use]
    pub fn with_workspaces(workspaces: usize) -> Arc<MemSeqStorage> {
        let storage = MemSeqStorage::default();
        storage.lock().numbers.reserve(workspaces);
        Arc::new(storage)
    }

    /// Installs a hook that runs before every operation (replacing any earlier one).
    pub fn set_hook(&self, hook: impl Fn(Op) -> Result<(), StorageError> + Send + Sync + 'static) {
        *self.hook.write().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(hook));
        self.hooked.store(true, Ordering::SeqCst);
    }

    /// Removes the hook: storage heals.
    pub fn clear_hook(&self) {
        *self.hook.write().unwrap_or_else(|e| e.into_inner()) = None;
        self.hooked.store(false, Ordering::SeqCst);
    }

    /// Makes every operation fail with `message` until [`clear_hook`](Self::clear_hook).
    pub fn fail_all(&self, message: &'static str) {
        self.set_hook(move |_| Err(StorageError::new(message)));
    }

    /// Appends an event to the PLog, as the command processor's event write would.
    ///
    /// # Errors
    ///
    /// A [`StorageError`] if the hook fails the append, or if `offset` is not after the last
    /// event's (an offset handed out twice).
    pub fn append_event(
        &self,
        offset: PLogOffset,
        kind: WsKind,
        values: &[SeqValue],
    ) -> Result<(), StorageError> {
        self.run_hook(Op::AppendEvent(offset))?;
        let mut st = self.lock();
        if let Some(last) = st.plog.last()
            && last.offset >= offset
        {
            return Err(StorageError::new(format!(
                "sequence violation: PLog offset {offset} is not after the last event's {}",
                last.offset
            )));
        }
        let start = st.plog_values.len();
        st.plog_values.extend_from_slice(values);
        st.plog.push(PlogEntry {
            offset,
            kind,
            start,
            len: values.len(),
        });
        Ok(())
    }

    /// Every event in the PLog, in order: `(offset, kind, values)`.
    #[must_use]
    pub fn events(&self) -> Vec<(PLogOffset, WsKind, Vec<SeqValue>)> {
        let st = self.lock();
        st.plog
            .iter()
            .map(|e| {
                (
                    e.offset,
                    e.kind,
                    st.plog_values[e.start..e.start + e.len].to_vec(),
                )
            })
            .collect()
    }

    /// The stored number of `key` (0 if none), bypassing hooks.
    #[must_use]
    pub fn number(&self, key: NumberKey) -> Number {
        self.lock().get(key)
    }

    /// Every stored number, bypassing hooks.
    #[must_use]
    pub fn numbers(&self) -> HashMap<NumberKey, Number> {
        let st = self.lock();
        st.numbers
            .iter()
            .flat_map(|(ws, seqs)| seqs.iter().map(move |(seq, n)| (NumberKey { ws, seq }, n)))
            .collect()
    }

    /// The stored checkpoint (`None` if never written), bypassing hooks.
    #[must_use]
    pub fn checkpoint(&self) -> Option<PLogOffset> {
        self.lock().checkpoint
    }

    /// Sets the stored numbers and checkpoint directly, bypassing hooks (test set-up).
    pub fn seed_projection(&self, values: &[SeqValue], checkpoint: PLogOffset) {
        let mut st = self.lock();
        for v in values {
            st.set(v.key, v.value);
        }
        st.checkpoint = Some(checkpoint);
    }

    /// A copy of everything stored, without the hook: what a restart after a crash at this
    /// moment would find. Every write is applied when its hook passes, so the copy holds every
    /// value and checkpoint written so far and nothing else. The copy has a fence of its own,
    /// claimed by nobody: a restarted process starts its generations afresh.
    #[must_use]
    pub fn snapshot(&self) -> Arc<MemSeqStorage> {
        Arc::new(MemSeqStorage {
            state: Mutex::new(self.lock().clone()),
            hook: RwLock::new(None),
            hooked: AtomicBool::new(false),
            fence: Fence::new(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn run_hook(&self, op: Op) -> Result<(), StorageError> {
        if !self.hooked.load(Ordering::Acquire) {
            return Ok(());
        }
        let hook = self.hook.read().unwrap_or_else(|e| e.into_inner()).clone();
        match hook {
            Some(h) => h(op),
            None => Ok(()),
        }
    }
}

impl SeqStorage for MemSeqStorage {
    fn read_numbers(
        &self,
        ws: WsId,
        seqs: &[SeqId],
        out: &mut [Number],
    ) -> Result<(), StorageError> {
        check_out_len(seqs.len(), out.len())?;
        self.run_hook(Op::ReadNumbers(ws))?;
        let st = self.lock();
        let stored = st.numbers.get(ws);
        for (seq, out) in seqs.iter().zip(out.iter_mut()) {
            *out = stored.and_then(|n| n.get(*seq)).unwrap_or_default();
        }
        Ok(())
    }

    fn read_next_plog_offset(&self) -> Result<PLogOffset, StorageError> {
        self.run_hook(Op::ReadNextPLogOffset)?;
        Ok(self.lock().checkpoint.unwrap_or(PLogOffset::FIRST))
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
        if self.hooked.load(Ordering::Acquire) {
            for (index, value) in values.iter().enumerate() {
                self.run_hook(Op::WriteValue {
                    index,
                    value: *value,
                })?;
                self.lock().set(value.key, value.value);
            }
        } else {
            for chunk in values.chunks(WRITE_CHUNK_VALUES) {
                self.lock().set_all(chunk);
            }
        }
        self.run_hook(Op::WriteCheckpoint(next_plog_offset))?;
        self.lock().checkpoint = Some(next_plog_offset);
        Ok(())
    }

    fn fence(&self) -> &Fence {
        &self.fence
    }

    fn replay_plog(
        &self,
        from: PLogOffset,
        batcher: &mut Batcher<'_>,
    ) -> Result<ReplayEnd, StorageError> {
        let mut entries: Vec<PlogEntry> = Vec::new();
        let mut values: Vec<SeqValue> = Vec::new();
        let mut next = from;
        loop {
            entries.clear();
            values.clear();
            {
                let st = self.lock();
                let first = st.plog.partition_point(|e| e.offset < next);
                for e in st.plog[first..].iter().take(REPLAY_CHUNK_EVENTS) {
                    entries.push(PlogEntry {
                        start: values.len(),
                        ..*e
                    });
                    values.extend_from_slice(&st.plog_values[e.start..e.start + e.len]);
                }
            }
            let Some(last) = entries.last() else {
                return Ok(ReplayEnd::Completed);
            };
            // An event at `u64::MAX` is the last one there can be.
            let after = last.offset.0.checked_add(1);
            for e in &entries {
                self.run_hook(Op::ReplayEvent(e.offset))?;
                let event = ReplayedEvent {
                    offset: e.offset,
                    ws_kind: e.kind,
                    values: &values[e.start..e.start + e.len],
                };
                if batcher(event).is_break() {
                    return Ok(ReplayEnd::Stopped);
                }
            }
            match after {
                Some(after) => next = PLogOffset(after),
                None => return Ok(ReplayEnd::Completed),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::ops::ControlFlow;

    use super::*;

    #[test]
    fn empty_storage_answers_the_first_offset_and_zero_numbers() {
        let s = MemSeqStorage::new();
        assert_eq!(s.read_next_plog_offset().unwrap(), PLogOffset::FIRST);
        let mut out = [Number(9); 2];
        s.read_numbers(WsId(1), &[SeqId(1), SeqId(2)], &mut out)
            .unwrap();
        assert_eq!(out, [Number(0), Number(0)]);
    }

    #[test]
    fn append_refuses_an_offset_handed_out_twice() {
        let s = MemSeqStorage::new();
        s.append_event(PLogOffset(1), WsKind(1), &[]).unwrap();
        let err = s.append_event(PLogOffset(1), WsKind(1), &[]).unwrap_err();
        assert!(err.to_string().contains("sequence violation"), "{err}");
    }

    #[test]
    fn replay_passes_events_in_order_from_the_offset_and_stops_on_break() {
        let s = MemSeqStorage::new();
        for o in 1..=5_000u64 {
            let v = SeqValue::new(WsId(o % 3), SeqId(1), Number(o));
            s.append_event(PLogOffset(o), WsKind(1), &[v]).unwrap();
        }
        let mut seen = Vec::new();
        let end = s
            .replay_plog(PLogOffset(2), &mut |e: ReplayedEvent<'_>| {
                seen.push((e.offset.0, e.values[0].value.0));
                ControlFlow::Continue(())
            })
            .unwrap();
        assert_eq!(end, ReplayEnd::Completed);
        assert_eq!(seen.len(), 4_999);
        assert!(seen.iter().all(|&(o, v)| o == v));
        assert!(seen.windows(2).all(|w| w[0].0 + 1 == w[1].0));

        let mut count = 0;
        let end = s
            .replay_plog(PLogOffset(1), &mut |_: ReplayedEvent<'_>| {
                count += 1;
                if count == 10 {
                    ControlFlow::Break(())
                } else {
                    ControlFlow::Continue(())
                }
            })
            .unwrap();
        assert_eq!((end, count), (ReplayEnd::Stopped, 10));
    }

    #[test]
    fn a_crash_between_value_writes_leaves_the_old_checkpoint() {
        let s = MemSeqStorage::new();
        let crash_image: Arc<Mutex<Option<Arc<MemSeqStorage>>>> = Arc::default();
        let values = [
            SeqValue::new(WsId(1), SeqId(1), Number(5)),
            SeqValue::new(WsId(2), SeqId(1), Number(6)),
        ];
        s.write_values_and_next_plog_offset(&values[..1], PLogOffset(3))
            .unwrap();
        let weak = Arc::downgrade(&s);
        let image = crash_image.clone();
        s.set_hook(move |op| {
            if let Op::WriteValue { index: 1, .. } = op {
                *image.lock().unwrap() = Some(weak.upgrade().unwrap().snapshot());
                return Err(StorageError::new("crash"));
            }
            Ok(())
        });
        assert!(
            s.write_values_and_next_plog_offset(&values, PLogOffset(9))
                .is_err()
        );
        let image = crash_image.lock().unwrap().clone().unwrap();
        assert_eq!(image.checkpoint(), Some(PLogOffset(3)));
        assert_eq!(image.number(values[1].key), Number(0));
    }
}
