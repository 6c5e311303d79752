//! [`FaultyStore`]: a [`KvStore`] wrapper that fails chosen kinds of calls on demand (switched
//! on until switched off, or the next N calls), or applies the next N writes and then reports
//! their answers lost ([`KvError::OutcomeUnknown`]), for tests of the code above the contract.
//! Every failure is an error value, as from a real backend; nothing panics.

use std::ops::Bound;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::batch::WriteBatch;
use crate::error::{CasError, KvError, WriteError};
use crate::key::Key;
use crate::store::{KvStore, Order, Visitor};

/// A kind of [`KvStore`] call a [`FaultyStore`] can fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FaultOp {
    /// [`KvStore::get`] and [`KvStore::get_many`].
    Read,
    /// [`KvStore::scan`].
    Scan,
    /// [`KvStore::write`] (and the one-item writes built on it) and
    /// [`KvStore::compare_and_swap`].
    Write,
    /// [`KvStore::sync`].
    Sync,
}

impl FaultOp {
    /// Every kind, in declaration order.
    pub const ALL: [FaultOp; 4] = [FaultOp::Read, FaultOp::Scan, FaultOp::Write, FaultOp::Sync];

    fn index(self) -> usize {
        match self {
            FaultOp::Read => 0,
            FaultOp::Scan => 1,
            FaultOp::Write => 2,
            FaultOp::Sync => 3,
        }
    }

    fn name(self) -> &'static str {
        match self {
            FaultOp::Read => "read",
            FaultOp::Scan => "scan",
            FaultOp::Write => "write",
            FaultOp::Sync => "sync",
        }
    }
}

/// The switches and counters of one kind of call.
#[derive(Debug, Default)]
struct Switch {
    /// Fail every call until switched off.
    on: AtomicBool,
    /// Fail this many more calls.
    next: AtomicU64,
    calls: AtomicU64,
    failed: AtomicU64,
}

/// A [`KvStore`] that passes every call to `S` unless told to fail it: a failed call answers a
/// [`KvError::Backend`] (inside the operation's error) whose message names the injected
/// fault, and does not reach `S` (a failed write writes nothing, as the contract requires).
///
/// # Example
///
/// ```
/// use monoseq_kv::{FaultOp, FaultyStore, Key, KvStore, MemoryStore};
///
/// let store = FaultyStore::new(MemoryStore::new());
/// store.fail_next(FaultOp::Write, 1);
/// assert!(store.put(Key::new(b"p", b"a"), b"1").is_err());
/// assert!(store.put(Key::new(b"p", b"a"), b"1").is_ok());
/// store.fail(FaultOp::Read, true);
/// assert!(store.get(Key::new(b"p", b"a")).is_err());
/// store.heal();
/// assert_eq!(store.get(Key::new(b"p", b"a"))?, Some(b"1".to_vec()));
/// assert_eq!(store.failed(FaultOp::Read), 1);
/// # Ok::<(), monoseq_kv::KvError>(())
/// ```
#[derive(Default)]
pub struct FaultyStore<S> {
    inner: S,
    switches: [Switch; 4],
    /// Writes still to apply and then report lost.
    lose_answers: AtomicU64,
    /// Writes still to drop and report lost (the request never arrived).
    lose_requests: AtomicU64,
    hooks: std::sync::RwLock<Hooks>,
    /// Set by [`FaultyStore::poison`]: the injected first fatal failure.
    poisoned: std::sync::OnceLock<String>,
}

/// Code run before calls, to slow them down or make them panic (a broken storage call).
#[derive(Default)]
struct Hooks {
    read: Option<ReadHook>,
    write: Option<WriteHook>,
    sync: Option<SyncHook>,
    loss: Option<LossFilter>,
}

/// Called with the partition key of every key a read asks for.
type ReadHook = Box<dyn Fn(&[u8]) + Send + Sync>;
/// Called with every batch about to be written.
type WriteHook = Box<dyn Fn(&WriteBatch) + Send + Sync>;
/// Called before every sync.
type SyncHook = Box<dyn Fn() + Send + Sync>;
/// Chooses the batches whose answers (or requests) may be lost.
type LossFilter = Box<dyn Fn(&WriteBatch) -> bool + Send + Sync>;

impl<S: std::fmt::Debug> std::fmt::Debug for FaultyStore<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultyStore")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<S> FaultyStore<S> {
    /// `inner`, failing nothing yet.
    pub fn new(inner: S) -> FaultyStore<S> {
        FaultyStore {
            inner,
            switches: Default::default(),
            lose_answers: AtomicU64::new(0),
            lose_requests: AtomicU64::new(0),
            hooks: Default::default(),
            poisoned: std::sync::OnceLock::new(),
        }
    }

    /// From now on every write and sync answers [`KvError::Poisoned`] naming `first` as the
    /// first fatal failure, as an engine whose flush to disk failed; reads still pass.
    /// [`heal`](Self::heal) does not undo it (a poisoned engine stays poisoned until it is
    /// re-opened); a second call keeps the first cause.
    pub fn poison(&self, first: &str) {
        let _ = self
            .poisoned
            .set(format!("injected fatal failure (FaultyStore): {first}"));
    }

    /// Runs `hook` with the partition key of every key a read (`get`, `get_many`) asks for,
    /// before the read; it may sleep (a slow read) or panic (a broken call). Replaces any.
    pub fn on_read(&self, hook: impl Fn(&[u8]) + Send + Sync + 'static) {
        self.hooks.write().unwrap_or_else(|e| e.into_inner()).read = Some(Box::new(hook));
    }

    /// Runs `hook` with every batch before it is written; it may sleep or panic. Replaces any.
    pub fn on_write(&self, hook: impl Fn(&WriteBatch) + Send + Sync + 'static) {
        self.hooks.write().unwrap_or_else(|e| e.into_inner()).write = Some(Box::new(hook));
    }

    /// Runs `hook` before every sync; it may sleep (a slow disk) or look at what other files
    /// hold while the store is not yet durable. Replaces any.
    pub fn on_sync(&self, hook: impl Fn() + Send + Sync + 'static) {
        self.hooks.write().unwrap_or_else(|e| e.into_inner()).sync = Some(Box::new(hook));
    }

    /// Lets the loss counts ([`lose_answers_next`](Self::lose_answers_next),
    /// [`lose_requests_next`](Self::lose_requests_next)) take only batches for which `filter`
    /// answers true (compare-and-swaps are then never lost). Replaces any.
    pub fn lose_only(&self, filter: impl Fn(&WriteBatch) -> bool + Send + Sync + 'static) {
        self.hooks.write().unwrap_or_else(|e| e.into_inner()).loss = Some(Box::new(filter));
    }

    /// Whether a loss count may take this write (`None`: a compare-and-swap).
    fn may_lose(&self, batch: Option<&WriteBatch>) -> bool {
        let hooks = self.hooks.read().unwrap_or_else(|e| e.into_inner());
        match (&hooks.loss, batch) {
            (None, _) => true,
            (Some(filter), Some(batch)) => filter(batch),
            (Some(_), None) => false,
        }
    }

    /// Removes the hooks.
    pub fn clear_hooks(&self) {
        *self.hooks.write().unwrap_or_else(|e| e.into_inner()) = Hooks::default();
    }

    fn before_read(&self, partitions: &mut dyn Iterator<Item = &[u8]>) {
        let hooks = self.hooks.read().unwrap_or_else(|e| e.into_inner());
        if let Some(h) = &hooks.read {
            partitions.for_each(h);
        }
    }

    fn before_write(&self, batch: &WriteBatch) {
        let hooks = self.hooks.read().unwrap_or_else(|e| e.into_inner());
        if let Some(h) = &hooks.write {
            h(batch);
        }
    }

    /// The wrapped store (calls on it are never failed).
    pub fn inner(&self) -> &S {
        &self.inner
    }

    fn switch(&self, op: FaultOp) -> &Switch {
        &self.switches[op.index()]
    }

    /// Fails every call of kind `op` while `on` (until switched off or [`heal`](Self::heal)).
    pub fn fail(&self, op: FaultOp, on: bool) {
        self.switch(op).on.store(on, Ordering::SeqCst);
    }

    /// Fails the next `calls` calls of kind `op` (replacing any count left), then heals it.
    pub fn fail_next(&self, op: FaultOp, calls: u64) {
        self.switch(op).next.store(calls, Ordering::SeqCst);
    }

    /// Applies the next `calls` writes (batches and compare-and-swaps that get past the other
    /// switches) to the wrapped store, then answers [`KvError::OutcomeUnknown`] for each, as a
    /// backend whose connection dropped after the commit was sent. Replaces any count left.
    pub fn lose_answers_next(&self, calls: u64) {
        self.lose_answers.store(calls, Ordering::SeqCst);
    }

    /// Answers [`KvError::OutcomeUnknown`] for the next `calls` writes without applying them,
    /// as a backend whose connection dropped before the request arrived. Replaces any count
    /// left.
    pub fn lose_requests_next(&self, calls: u64) {
        self.lose_requests.store(calls, Ordering::SeqCst);
    }

    /// Stops failing anything.
    pub fn heal(&self) {
        for s in &self.switches {
            s.on.store(false, Ordering::SeqCst);
            s.next.store(0, Ordering::SeqCst);
        }
        self.lose_answers.store(0, Ordering::SeqCst);
        self.lose_requests.store(0, Ordering::SeqCst);
    }

    /// Whether the current write is one whose answer (or request) is to be lost.
    fn take_one(count: &AtomicU64) -> bool {
        count
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
    }

    /// Runs a write through the loss switches: `apply` reaches the wrapped store unless the
    /// request is to be lost; a lost answer or request becomes [`KvError::OutcomeUnknown`].
    fn write_through<E: From<KvError>>(
        &self,
        batch: Option<&WriteBatch>,
        apply: impl FnOnce() -> Result<(), E>,
    ) -> Result<(), E> {
        if !self.may_lose(batch) {
            return apply();
        }
        if Self::take_one(&self.lose_requests) {
            return Err(lost("the request was lost before it arrived").into());
        }
        if !Self::take_one(&self.lose_answers) {
            return apply();
        }
        // The answer is lost whatever it was: applied, or refused.
        let _ = apply();
        Err(lost("the write was applied, then its answer was lost").into())
    }

    /// Calls of kind `op` so far, failed or not.
    pub fn calls(&self, op: FaultOp) -> u64 {
        self.switch(op).calls.load(Ordering::SeqCst)
    }

    /// Calls of kind `op` failed so far.
    pub fn failed(&self, op: FaultOp) -> u64 {
        self.switch(op).failed.load(Ordering::SeqCst)
    }

    /// Counts a call of kind `op`; answers the injected error when it must fail.
    fn check(&self, op: FaultOp) -> Result<(), KvError> {
        let s = self.switch(op);
        s.calls.fetch_add(1, Ordering::SeqCst);
        if let (FaultOp::Write | FaultOp::Sync, Some(first)) = (op, self.poisoned.get()) {
            s.failed.fetch_add(1, Ordering::SeqCst);
            return Err(KvError::poisoned(first.clone()));
        }
        let fail = s.on.load(Ordering::SeqCst)
            || s.next
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok();
        if !fail {
            return Ok(());
        }
        s.failed.fetch_add(1, Ordering::SeqCst);
        Err(KvError::Backend {
            message: format!("injected {} fault (FaultyStore)", op.name()),
            source: None,
        })
    }
}

/// The injected unknown outcome.
fn lost(what: &str) -> KvError {
    KvError::OutcomeUnknown {
        message: format!("injected lost answer (FaultyStore): {what}"),
    }
}

impl<S: KvStore> KvStore for FaultyStore<S> {
    fn get(&self, key: Key<'_>) -> Result<Option<Vec<u8>>, KvError> {
        self.check(FaultOp::Read)?;
        self.before_read(&mut std::iter::once(key.partition));
        self.inner.get(key)
    }

    fn get_many(&self, keys: &[Key<'_>]) -> Result<Vec<Option<Vec<u8>>>, KvError> {
        self.check(FaultOp::Read)?;
        self.before_read(&mut keys.iter().map(|k| k.partition));
        self.inner.get_many(keys)
    }

    fn first_present(&self, keys: &[Key<'_>]) -> Result<Option<usize>, KvError> {
        self.check(FaultOp::Read)?;
        self.before_read(&mut keys.iter().map(|k| k.partition));
        self.inner.first_present(keys)
    }

    fn expect_inserts(&self, partitions: &[&[u8]]) -> Result<(), KvError> {
        self.check(FaultOp::Read)?;
        self.before_read(&mut partitions.iter().copied());
        self.inner.expect_inserts(partitions)
    }

    fn scan(
        &self,
        partition: &[u8],
        from: Bound<&[u8]>,
        to: Bound<&[u8]>,
        order: Order,
        visit: &mut Visitor<'_>,
    ) -> Result<(), KvError> {
        self.check(FaultOp::Scan)?;
        self.inner.scan(partition, from, to, order, visit)
    }

    fn write(&self, batch: &WriteBatch) -> Result<(), WriteError> {
        self.check(FaultOp::Write)?;
        self.before_write(batch);
        self.write_through(Some(batch), || self.inner.write(batch))
    }

    fn compare_and_swap(
        &self,
        key: Key<'_>,
        expected: Option<&[u8]>,
        new: Option<&[u8]>,
    ) -> Result<(), CasError> {
        self.check(FaultOp::Write)?;
        self.write_through(None, || self.inner.compare_and_swap(key, expected, new))
    }

    fn sync(&self) -> Result<(), KvError> {
        self.check(FaultOp::Sync)?;
        if let Some(h) = &self.hooks.read().unwrap_or_else(|e| e.into_inner()).sync {
            h();
        }
        self.inner.sync()
    }

    fn engine_stats(&self) -> Option<crate::EngineStats> {
        self.inner.engine_stats()
    }
}

#[cfg(test)]
mod tests {
    use std::ops::ControlFlow;

    use super::*;
    use crate::memory::MemoryStore;

    fn key(c: &[u8]) -> Key<'_> {
        Key::new(b"p", c)
    }

    fn scan_count(s: &FaultyStore<MemoryStore>) -> Result<usize, KvError> {
        let mut n = 0;
        s.scan(
            b"p",
            Bound::Unbounded,
            Bound::Unbounded,
            Order::Ascending,
            &mut |_, _| {
                n += 1;
                ControlFlow::Continue(())
            },
        )?;
        Ok(n)
    }

    #[test]
    fn hooks_see_every_read_partition_and_every_batch_until_cleared() {
        use std::sync::Arc;
        use std::sync::atomic::AtomicUsize;
        let s = FaultyStore::new(MemoryStore::new());
        let (reads, writes) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let r = Arc::clone(&reads);
        s.on_read(move |p| {
            assert_eq!(p, b"p");
            r.fetch_add(1, Ordering::SeqCst);
        });
        let w = Arc::clone(&writes);
        s.on_write(move |b| {
            w.fetch_add(b.len(), Ordering::SeqCst);
        });
        s.put(key(b"a"), b"1").expect("put");
        s.get(key(b"a")).expect("get");
        s.get_many(&[key(b"a"), key(b"b")]).expect("get_many");
        assert_eq!(
            (reads.load(Ordering::SeqCst), writes.load(Ordering::SeqCst)),
            (3, 1)
        );
        s.clear_hooks();
        s.get(key(b"a")).expect("get");
        assert_eq!(reads.load(Ordering::SeqCst), 3);
    }

    #[test]
    fn a_healthy_faulty_store_passes_every_call_through() {
        let s = FaultyStore::new(MemoryStore::new());
        s.put(key(b"a"), b"1").unwrap();
        s.compare_and_swap(key(b"a"), Some(b"1"), Some(b"2"))
            .unwrap();
        assert_eq!(s.get(key(b"a")).unwrap(), Some(b"2".to_vec()));
        assert_eq!(s.get_many(&[key(b"a"), key(b"b")]).unwrap().len(), 2);
        assert_eq!(scan_count(&s).unwrap(), 1);
        s.sync().unwrap();
        for op in FaultOp::ALL {
            assert_eq!(s.failed(op), 0, "{op:?}");
        }
        assert_eq!(s.calls(FaultOp::Write), 2);
        assert_eq!(s.calls(FaultOp::Read), 2);
    }

    #[test]
    fn a_switched_on_fault_fails_every_call_of_its_kind_and_only_those() {
        let s = FaultyStore::new(MemoryStore::new());
        s.put(key(b"a"), b"1").unwrap();
        s.fail(FaultOp::Write, true);
        for _ in 0..3 {
            assert!(matches!(
                s.put(key(b"b"), b"2"),
                Err(WriteError::Storage(KvError::Backend { .. }))
            ));
        }
        assert!(matches!(
            s.compare_and_swap(key(b"a"), Some(b"1"), Some(b"3")),
            Err(CasError::Storage(_))
        ));
        assert_eq!(
            s.get(key(b"a")).unwrap(),
            Some(b"1".to_vec()),
            "reads still work"
        );
        assert_eq!(
            s.get(key(b"b")).unwrap(),
            None,
            "a failed write wrote nothing"
        );
        s.fail(FaultOp::Write, false);
        s.put(key(b"b"), b"2").unwrap();
        assert_eq!(s.failed(FaultOp::Write), 4);
    }

    #[test]
    fn the_next_n_calls_fail_then_the_store_heals() {
        let s = FaultyStore::new(MemoryStore::new());
        s.put(key(b"a"), b"1").unwrap();
        s.fail_next(FaultOp::Scan, 2);
        assert!(scan_count(&s).is_err());
        assert!(scan_count(&s).is_err());
        assert_eq!(scan_count(&s).unwrap(), 1);
        s.fail_next(FaultOp::Sync, 1);
        assert!(s.sync().is_err());
        s.sync().unwrap();
        s.fail_next(FaultOp::Read, 1);
        let err = s.get_many(&[key(b"a")]).unwrap_err();
        assert!(err.to_string().contains("injected read fault"), "{err}");
        assert!(s.get(key(b"a")).is_ok());
        assert_eq!((s.failed(FaultOp::Scan), s.calls(FaultOp::Scan)), (2, 3));
    }

    #[test]
    fn a_lost_answer_is_reported_unknown_whether_or_not_the_write_landed() {
        let s = FaultyStore::new(MemoryStore::new());
        s.lose_answers_next(1);
        let e = s.put(key(b"a"), b"1").unwrap_err();
        assert!(e.is_outcome_unknown(), "{e}");
        assert_eq!(s.get(key(b"a")).unwrap(), Some(b"1".to_vec()), "applied");
        s.lose_requests_next(1);
        let e = s
            .compare_and_swap(key(b"a"), Some(b"1"), Some(b"2"))
            .unwrap_err();
        assert!(e.is_outcome_unknown(), "{e}");
        assert_eq!(
            s.get(key(b"a")).unwrap(),
            Some(b"1".to_vec()),
            "not applied"
        );
        s.lose_answers_next(1);
        let e = s
            .compare_and_swap(key(b"a"), Some(b"1"), Some(b"2"))
            .unwrap_err();
        assert!(e.is_outcome_unknown(), "{e}");
        assert_eq!(s.get(key(b"a")).unwrap(), Some(b"2".to_vec()), "swapped");
        s.put(key(b"b"), b"1").expect("the counts are used up");
    }

    #[test]
    fn heal_clears_every_switch_and_count_left() {
        let s = FaultyStore::new(MemoryStore::new());
        for op in FaultOp::ALL {
            s.fail(op, true);
        }
        s.fail_next(FaultOp::Read, 10);
        s.heal();
        s.put(key(b"a"), b"1").unwrap();
        assert!(s.get(key(b"a")).is_ok());
        assert!(scan_count(&s).is_ok());
        assert!(s.sync().is_ok());
    }
}
