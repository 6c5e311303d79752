//! Combining: the batches that concurrent callers (the writers of different partitions, their
//! flushers) have ready go to PostgreSQL together, in one transaction and one round trip, so
//! that one commit (one `BEGIN`/`COMMIT`, one statement per kind, one write-ahead log flush)
//! serves several batches. Owns when a batch goes alone and when it waits, which batches may
//! share a transaction, and how each still gets exactly its own outcome.
//!
//! A batch that finds fewer than [`PgOptions::write_transactions`] of the store's write
//! transactions in flight and nobody waiting goes out at once, alone, on its caller's thread,
//! as it always did (`write.rs`). Otherwise its caller waits. When a transaction ends and
//! batches wait, its slot passes to a task on the store's runtime, which takes every batch
//! waiting (at most [`COMBINE_WRITES_MAX`], and [`COMBINE_BYTES_MAX`] of keys and values) into
//! one transaction: `BEGIN`, the check of each distinct fence in partition order, the union of
//! their conditional inserts as one multi-row `INSERT`, of their upserts as one, of their
//! deletes as one, `COMMIT`; it answers each caller as the server answers (no thread of a
//! caller sits between the server and the others' answers), and goes on while batches wait. A
//! batch that waited [`PgOptions::combine_wait`] without a transaction taking it starts one
//! past the limit, with the batches waiting then: a slow transaction holds the others up
//! little. The busier the store, the more each commit carries; an idle store adds no wait.
//!
//! Each batch keeps its own atomicity and its own outcome. Batches that share a transaction
//! touch disjoint keys: a batch with a key that one taken before it touches goes alone (an
//! upsert statement may not touch a row twice, and with shared keys the fixed order of the
//! statements need not be the order of any batch after another). The transaction is
//! optimistic: when it fails for a key found present, a fence that no longer holds, or any
//! error the server answered, nothing of it was written, and every batch then goes alone
//! through the path above, on its caller's thread, which names its own conflicting item or its
//! own fence and retries as it always did. When its answer is lost (the connection broke or
//! the call's time limit passed after the request left), every batch of it reports an unknown
//! outcome, as it would alone, after its caller waited for the server to end the transaction.
//!
//! No lock of the server's outlives a transaction, and the combined transaction has the call
//! time limit a batch alone has.
//!
//! [`PgOptions::write_transactions`]: crate::PgOptions::write_transactions
//! [`PgOptions::combine_wait`]: crate::PgOptions::combine_wait

use std::collections::{HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use monoseq_kv::{Key, WriteBatch, WriteError};
use tokio::runtime::Handle;

use crate::core::Inner;
use crate::error::{Failure, unknown_outcome};
use crate::exec::within;
use crate::fence::Fence;
use crate::options::PgOptions;
use crate::plan::Plan;
use crate::write::{self, Outcome};

/// Most batches one combined transaction carries; the others wait for the next one.
pub const COMBINE_WRITES_MAX: usize = 64;
/// Most bytes of keys and values one combined transaction carries (its first batch goes
/// whatever its size); the batches past it wait for the next one.
pub const COMBINE_BYTES_MAX: usize = 4 << 20;

/// What a batch that went in a combined transaction whose answer was lost reports.
const COMBINED_WRITE: &str = "writing a batch together with others in one transaction";

/// How a store's batch writes shared transactions since it opened
/// ([`PgStore::combining`](crate::PgStore::combining)).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Combining {
    /// Transactions that carried the batches of callers that waited, and committed.
    pub transactions: u64,
    /// Batches committed in those transactions.
    pub writes: u64,
    /// Such transactions that wrote nothing (a key found present, a fence that no longer
    /// held, an error the server answered); each of their batches then went alone.
    pub fallbacks: u64,
    /// Batches waiting now for a transaction to carry them.
    pub waiting: usize,
}

/// The slots of the store's write transactions, the batches waiting for one, and what the
/// tasks that write them need.
pub(crate) struct Combiner {
    state: Mutex<State>,
    inner: Arc<Inner>,
    runtime: Handle,
    slots: usize,
    wait: Duration,
    transactions: AtomicU64,
    writes: AtomicU64,
    fallbacks: AtomicU64,
}

#[derive(Default)]
struct State {
    /// Slots taken. Batches wait only while all are taken: `waiting` is empty unless
    /// `in_flight` is at least the combiner's `slots`.
    in_flight: usize,
    waiting: VecDeque<Arc<Waiter>>,
}

/// A batch waiting for a transaction, with its own copy of the batch (the transaction that
/// carries it runs on the store's runtime), and where its answer comes.
struct Waiter {
    batch: WriteBatch,
    fence: Option<Fence>,
    bytes: usize,
    answer: Mutex<Answer>,
    answered: Condvar,
}

/// What a waiting caller is told.
#[derive(Clone)]
enum Answer {
    /// Nothing yet.
    Pending,
    /// Its batch goes alone, on the caller's thread: the combined transaction wrote nothing,
    /// or the batch may not share it.
    Alone,
    /// Its batch was committed in a combined transaction.
    Written,
    /// The combined transaction's answer was lost, as this says.
    Unknown(String),
}

/// How a batch entered the combiner.
enum Entry {
    /// It took a slot: it goes at once, alone.
    Slot,
    /// It waits.
    Queued(Arc<Waiter>),
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Waiter {
    fn new(batch: &WriteBatch, fence: Option<&Fence>) -> Waiter {
        Waiter {
            batch: batch.clone(),
            fence: fence.cloned(),
            bytes: batch
                .iter()
                .map(|i| i.key.partition.len() + i.key.clustering.len() + i.value.len())
                .sum(),
            answer: Mutex::new(Answer::Pending),
            answered: Condvar::new(),
        }
    }

    fn answer(&self, answer: Answer) {
        *lock(&self.answer) = answer;
        self.answered.notify_one();
    }

    /// The answer, waiting for it until `deadline` (without one: for as long as it takes);
    /// [`Answer::Pending`] when the deadline passed first.
    fn wait(&self, deadline: Option<Instant>) -> Answer {
        let mut answer = lock(&self.answer);
        loop {
            if !matches!(*answer, Answer::Pending) {
                return answer.clone();
            }
            answer = match deadline {
                None => self
                    .answered
                    .wait(answer)
                    .unwrap_or_else(PoisonError::into_inner),
                Some(deadline) => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Answer::Pending;
                    }
                    let waited = self.answered.wait_timeout(answer, left);
                    waited.unwrap_or_else(PoisonError::into_inner).0
                }
            };
        }
    }
}

impl Combiner {
    /// The combiner of a store on `inner`, whose transactions run on `runtime`.
    pub(crate) fn new(inner: &Arc<Inner>, runtime: &Handle, options: &PgOptions) -> Combiner {
        Combiner {
            state: Mutex::new(State::default()),
            inner: Arc::clone(inner),
            runtime: runtime.clone(),
            slots: options.write_transactions,
            wait: options.combine_wait,
            transactions: AtomicU64::new(0),
            writes: AtomicU64::new(0),
            fallbacks: AtomicU64::new(0),
        }
    }

    pub(crate) fn counts(&self) -> Combining {
        Combining {
            transactions: self.transactions.load(Ordering::Relaxed),
            writes: self.writes.load(Ordering::Relaxed),
            fallbacks: self.fallbacks.load(Ordering::Relaxed),
            waiting: lock(&self.state).waiting.len(),
        }
    }

    /// Takes a slot when one is free and no batch waits.
    fn free_slot(&self, state: &mut State) -> bool {
        let free = state.in_flight < self.slots && state.waiting.is_empty();
        if free {
            state.in_flight += 1;
        }
        free
    }

    /// A slot for `batch` when one is free, else its place in the queue (copied outside the
    /// lock).
    fn enter(&self, batch: &WriteBatch, fence: Option<&Fence>) -> Entry {
        if self.free_slot(&mut lock(&self.state)) {
            return Entry::Slot;
        }
        let waiter = Arc::new(Waiter::new(batch, fence));
        let mut state = lock(&self.state);
        if self.free_slot(&mut state) {
            return Entry::Slot;
        }
        state.waiting.push_back(Arc::clone(&waiter));
        Entry::Queued(waiter)
    }

    /// The batches of the next transaction, taken from the front of the queue: at least one,
    /// then as many as [`COMBINE_WRITES_MAX`] and [`COMBINE_BYTES_MAX`] allow.
    fn take(state: &mut State, mut group: Vec<Arc<Waiter>>) -> Vec<Arc<Waiter>> {
        let mut bytes: usize = group.iter().map(|w| w.bytes).sum();
        while group.len() < COMBINE_WRITES_MAX {
            let Some(next) = state.waiting.front() else {
                break;
            };
            if !group.is_empty() && bytes + next.bytes > COMBINE_BYTES_MAX {
                break;
            }
            bytes += next.bytes;
            group.extend(state.waiting.pop_front());
        }
        group
    }

    /// A slot's transaction ended: the batches waiting, which keep the slot, or `None` (the
    /// slot is freed) when nothing waits.
    fn next_group(&self) -> Option<Vec<Arc<Waiter>>> {
        let mut state = lock(&self.state);
        if state.waiting.is_empty() {
            state.in_flight -= 1;
            return None;
        }
        Some(Combiner::take(&mut state, Vec::new()))
    }

    /// `waiter` with the batches waiting, on a slot past the limit, when no transaction took
    /// it yet.
    fn group_now(&self, waiter: &Arc<Waiter>) -> Option<Vec<Arc<Waiter>>> {
        let mut state = lock(&self.state);
        let position = state.waiting.iter().position(|w| Arc::ptr_eq(w, waiter))?;
        let first = state.waiting.remove(position)?;
        state.in_flight += 1;
        Some(Combiner::take(&mut state, vec![first]))
    }

    /// Passes on the slot of a transaction that ended: to a task writing the batches waiting,
    /// or back to the free ones.
    fn finish(self: &Arc<Self>) {
        if let Some(group) = self.next_group() {
            self.start(group);
        }
    }

    /// Starts a task on the store's runtime that writes `group`, then the batches waiting as
    /// long as some do, on one slot.
    fn start(self: &Arc<Self>, group: Vec<Arc<Waiter>>) {
        let task = Task {
            combiner: Arc::clone(self),
            slot_held: true,
        };
        let taken = Taken {
            group,
            answered: false,
        };
        self.runtime.spawn(async move {
            let mut task = task;
            let mut taken = taken;
            loop {
                task.combiner.write_group(&mut taken).await;
                match task.combiner.next_group() {
                    Some(group) => {
                        taken = Taken {
                            group,
                            answered: false,
                        }
                    }
                    None => {
                        task.slot_held = false;
                        return;
                    }
                }
            }
        });
    }

    /// Writes `batch`, whose limits are checked and which is not empty, in a transaction
    /// that first checks `fence` when there is one: with `alone` (the batch in a transaction
    /// of its own) when a slot is free, else together with the other batches waiting (module
    /// docs). `settle` waits until no transaction in flight writes a key (`Core::settle`).
    pub(crate) fn write(
        self: &Arc<Self>,
        batch: &WriteBatch,
        fence: Option<&Fence>,
        alone: impl FnOnce() -> Result<(), WriteError>,
        settle: impl FnOnce(Key<'_>) -> bool,
    ) -> Result<(), WriteError> {
        let waiter = match self.enter(batch, fence) {
            Entry::Slot => {
                let _slot = Slot(self);
                return alone();
            }
            Entry::Queued(waiter) => waiter,
        };
        match self.wait_turn(&waiter) {
            Answer::Written => Ok(()),
            Answer::Unknown(cause) => {
                // As a batch alone: wait until the server ended the transaction.
                let key = batch.get(0).map(|item| item.key);
                let settled = key.is_some_and(settle);
                Err(WriteError::Storage(unknown_outcome(
                    COMBINED_WRITE,
                    &cause,
                    settled,
                )))
            }
            Answer::Alone | Answer::Pending => alone(),
        }
    }

    /// Waits for a queued batch's turn: its answer, or, when no transaction took it within
    /// the combiner's wait, a transaction of its own (with the batches waiting then).
    fn wait_turn(self: &Arc<Self>, waiter: &Arc<Waiter>) -> Answer {
        let answer = waiter.wait(Some(Instant::now() + self.wait));
        if !matches!(answer, Answer::Pending) {
            return answer;
        }
        if let Some(group) = self.group_now(waiter) {
            self.start(group);
        }
        // A transaction has it; it ends within its own time limit.
        waiter.wait(None)
    }

    /// Writes the batches of `taken` that may share a transaction in one, and answers every
    /// caller.
    async fn write_group(&self, taken: &mut Taken) {
        let group = &taken.group;
        let plans: Vec<Plan<'_>> = group.iter().map(|w| Plan::new(&w.batch)).collect();
        let members = shareable(&plans);
        let count = members.iter().filter(|m| **m).count();
        let outcome = match count {
            0 => Answer::Alone,
            _ => self.write_together(group, &plans, &members, count).await,
        };
        for (waiter, member) in group.iter().zip(&members) {
            waiter.answer(match member {
                true => outcome.clone(),
                false => Answer::Alone,
            });
        }
        taken.answered = true;
    }

    /// Writes the batches `members` marks in one transaction: what each of them is told.
    async fn write_together(
        &self,
        group: &[Arc<Waiter>],
        plans: &[Plan<'_>],
        members: &[bool],
        count: usize,
    ) -> Answer {
        let chosen = plans.iter().zip(members).filter(|(_, m)| **m);
        let union = union(chosen.map(|(p, _)| p));
        let fences = distinct_fences(
            group
                .iter()
                .zip(members)
                .filter(|(_, m)| **m)
                .filter_map(|(w, _)| w.fence.as_ref()),
        );
        let inner = &self.inner;
        let applied = within(
            inner.call_timeout(),
            write::apply_combined(inner, &union, &fences),
        )
        .await;
        match applied {
            Ok(Outcome::Written) => {
                self.transactions.fetch_add(1, Ordering::Relaxed);
                self.writes.fetch_add(count as u64, Ordering::Relaxed);
                Answer::Written
            }
            Err(failure) if failure.outcome_unknown() => {
                tracing::warn!(
                    writes = count,
                    "the answer of a combined PostgreSQL transaction was lost; each of its \
                     batches reports an unknown outcome"
                );
                Answer::Unknown(failure.lost_answer())
            }
            other => {
                self.fallbacks.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(
                    writes = count,
                    cause = %fallback_cause(other),
                    "a combined PostgreSQL transaction wrote nothing; its batches go each alone"
                );
                Answer::Alone
            }
        }
    }
}

/// A taken slot of a caller writing alone, passed on when dropped (also when it unwinds).
struct Slot<'a>(&'a Arc<Combiner>);

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.0.finish();
    }
}

/// A task writing batches on a slot: the slot is freed also when the task is dropped before it
/// ended (the runtime shutting down, a panic).
struct Task {
    combiner: Arc<Combiner>,
    slot_held: bool,
}

impl Drop for Task {
    fn drop(&mut self) {
        if self.slot_held {
            lock(&self.combiner.state).in_flight -= 1;
        }
    }
}

/// The batches a task took: every caller gets an answer, also when the task is dropped before
/// it answered them (the runtime shutting down with the store): then the outcome is unknown.
struct Taken {
    group: Vec<Arc<Waiter>>,
    answered: bool,
}

impl Drop for Taken {
    fn drop(&mut self) {
        if self.answered {
            return;
        }
        for waiter in &self.group {
            waiter.answer(Answer::Unknown(
                "the store stopped the transaction carrying it (it is closing)".to_owned(),
            ));
        }
    }
}

/// Which plans of a group may share its transaction, in order: each that does not conflict
/// within itself and touches no key that one chosen before it touches.
fn shareable(plans: &[Plan<'_>]) -> Vec<bool> {
    let mut taken: HashSet<Key<'_>> = HashSet::new();
    plans
        .iter()
        .map(|plan| {
            if plan.conflict_in_batch.is_some() || keys(plan).any(|k| taken.contains(&k)) {
                return false;
            }
            taken.extend(keys(plan));
            true
        })
        .collect()
}

/// Every key a plan writes (a conditional key that is rewritten appears twice).
fn keys<'a>(plan: &Plan<'a>) -> impl Iterator<Item = Key<'a>> {
    let conditions = plan.conditions.iter().map(|c| c.key);
    let upserts = plan.upserts.iter().map(|(k, _)| *k);
    conditions
        .chain(upserts)
        .chain(plan.deletes.iter().copied())
}

/// The plans of batches over disjoint keys as one plan, each statement's rows sorted by key
/// (so that concurrent transactions lock rows of one statement in the same order).
fn union<'p, 'a: 'p>(plans: impl Iterator<Item = &'p Plan<'a>>) -> Plan<'a> {
    let mut union = Plan::default();
    for plan in plans {
        union.conditions.extend_from_slice(&plan.conditions);
        union.upserts.extend_from_slice(&plan.upserts);
        union.deletes.extend_from_slice(&plan.deletes);
    }
    union.conditions.sort_unstable_by_key(|c| c.key);
    union.upserts.sort_unstable_by_key(|(key, _)| *key);
    union.deletes.sort_unstable();
    union
}

/// Each fence once (two batches of one view share its check), in partition order: concurrent
/// transactions then lock lease rows in one order and cannot deadlock on them.
fn distinct_fences<'a>(fences: impl Iterator<Item = &'a Fence>) -> Vec<&'a Fence> {
    let mut distinct: Vec<&Fence> = Vec::new();
    for fence in fences {
        if !distinct.iter().any(|f| f.same(fence)) {
            distinct.push(fence);
        }
    }
    distinct.sort_by_key(|f| f.order());
    distinct
}

/// What made a combined transaction write nothing, for the log.
fn fallback_cause(applied: Result<Outcome, Failure>) -> String {
    match applied {
        Ok(Outcome::Fenced) => "a fence no longer held".to_owned(),
        Ok(outcome) => format!("{outcome:?}"),
        Err(failure) => failure
            .into_kv("writing batches together, which wrote nothing")
            .to_string(),
    }
}

#[cfg(test)]
mod tests {
    use monoseq_kv::{Key, WriteBatch};

    use super::{Plan, shareable, union};

    fn batch(items: &[(&[u8], bool)]) -> WriteBatch {
        let mut batch = WriteBatch::new();
        for (clustering, insert) in items {
            match insert {
                true => batch.insert_if_absent(Key::new(b"p", clustering), b"v"),
                false => batch.put(Key::new(b"p", clustering), b"v"),
            };
        }
        batch
    }

    #[test]
    fn a_batch_sharing_a_key_with_an_earlier_one_or_conflicting_within_itself_goes_alone() {
        let batches = [
            batch(&[(b"a", true), (b"b", false)]),
            batch(&[(b"c", true), (b"b", false)]),
            batch(&[(b"d", true), (b"d", true)]),
            batch(&[(b"c", false)]),
            batch(&[(b"e", false), (b"f", true)]),
        ];
        let plans: Vec<Plan<'_>> = batches.iter().map(Plan::new).collect();
        assert_eq!(shareable(&plans), [true, false, false, true, true]);
    }

    #[test]
    fn the_union_of_plans_sorts_each_statement_by_key() {
        let batches = [
            batch(&[(b"m", true), (b"z", false)]),
            batch(&[(b"a", true), (b"n", false)]),
        ];
        let plans: Vec<Plan<'_>> = batches.iter().map(Plan::new).collect();
        let union = union(plans.iter());
        let inserted: Vec<_> = union.conditions.iter().map(|c| c.key.clustering).collect();
        let upserted: Vec<_> = union.upserts.iter().map(|(k, _)| k.clustering).collect();
        assert_eq!(inserted, [b"a", b"m"]);
        assert_eq!(upserted, [b"n", b"z"]);
        assert_eq!(union.conflict_in_batch, None);
    }
}
