//! Combining: the batches that concurrent callers (the writers of different partitions, their
//! flushers) have ready go to PostgreSQL together, in one transaction and one round trip, so
//! that one commit (one write-ahead log flush, one `BEGIN`/`COMMIT`, one statement per kind)
//! serves several batches. Owns when a batch goes alone and when it waits, which batches may
//! share a transaction, and how each still gets exactly its own outcome.
//!
//! A batch that finds fewer than [`WRITE_TRANSACTIONS_IN_FLIGHT`] of the store's write
//! transactions in flight and nobody waiting goes out at once, alone, as it always did
//! (`write.rs`). Otherwise its caller waits; when a transaction ends, its slot passes to the
//! first caller waiting, which takes every batch waiting (at most [`COMBINE_WRITES_MAX`], and
//! [`COMBINE_BYTES_MAX`] of keys and values) into one transaction: `BEGIN`, the check of each
//! distinct fence in partition order, the union of their conditional inserts as one multi-row
//! `INSERT`, of their upserts as one, of their deletes as one, `COMMIT`. The busier the store,
//! the more each commit carries; an idle store adds no wait.
//!
//! Each batch keeps its own atomicity and its own outcome. Batches that share a transaction
//! touch disjoint keys: a batch with a key that one taken before it touches goes alone (an
//! upsert statement may not touch a row twice, and with shared keys the fixed order of the
//! statements need not be the order of any batch after another). The transaction is
//! optimistic: when it fails for a key found present, a fence that no longer holds, or any
//! error the server answered, nothing of it was written, and every batch then goes alone
//! through the path above, which names its own conflicting item or its own fence and retries
//! as it always did. When its answer is lost (the connection broke or the call timed out after
//! the request left), every batch of it gets `KvError::OutcomeUnknown`, as it would alone.
//!
//! No lock of the server's outlives a transaction; a caller waits at most the call's time
//! limit for a transaction to take its batch, then goes alone.

use std::collections::{HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use monoseq_kv::{Key, KvError, WriteBatch, WriteError};

use crate::error::Failure;
use crate::fenced::Fence;
use crate::plan::Plan;
use crate::store::{Core, PgStore};
use crate::write::{self, Outcome};

/// Most batch-write transactions of one store in flight at once: a batch that finds fewer in
/// flight (and no batch waiting) goes out at once, alone; the batches arriving while this many
/// are in flight wait, and the next transaction to start carries them together.
pub const WRITE_TRANSACTIONS_IN_FLIGHT: usize = 2;
/// Most batches one combined transaction carries; the others wait for the next one.
pub const COMBINE_WRITES_MAX: usize = 64;
/// Most bytes of keys and values one combined transaction carries (its first batch goes
/// whatever its size); the batches past it wait for the next one.
pub const COMBINE_BYTES_MAX: usize = 4 << 20;

/// How a store's batch writes shared transactions since it opened ([`PgStore::combining`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Combining {
    /// Transactions that carried the batches of several callers and committed.
    pub transactions: u64,
    /// Batches committed in those transactions.
    pub writes: u64,
    /// Transactions of several batches that wrote nothing (a key found present, a fence that
    /// no longer held, an error the server answered); each of their batches then went alone.
    pub fallbacks: u64,
    /// Batches waiting now for a transaction to carry them.
    pub waiting: usize,
}

impl PgStore {
    /// How the batch writes of this store and of its fenced views shared transactions: see
    /// [`Combining`]. Cheap; for metrics and tests.
    pub fn combining(&self) -> Combining {
        self.core.combiner.counts()
    }
}

/// The slots of the store's write transactions, and the batches waiting for one.
#[derive(Default)]
pub(crate) struct Combiner {
    state: Mutex<State>,
    transactions: AtomicU64,
    writes: AtomicU64,
    fallbacks: AtomicU64,
}

#[derive(Default)]
struct State {
    /// Slots taken. Batches wait only while all are taken: `waiting` is empty unless
    /// `in_flight` is [`WRITE_TRANSACTIONS_IN_FLIGHT`].
    in_flight: usize,
    waiting: VecDeque<Arc<Waiter>>,
}

/// A batch waiting for a transaction, with its own copy of the batch (the transaction that
/// carries it may run on another caller's thread), and where its answer comes.
struct Waiter {
    batch: WriteBatch,
    fence: Option<Fence>,
    bytes: usize,
    answer: Mutex<Answer>,
    answered: Condvar,
}

/// What a waiting caller is told.
enum Answer {
    /// Nothing yet.
    Pending,
    /// A slot passed to it: it leads the next transaction, its batch first.
    Lead,
    /// Its batch goes alone, on the caller's thread (the combined transaction wrote nothing,
    /// or the batch may not share it).
    Alone,
    /// Its batch's outcome, in a transaction that carried it.
    Done(Result<(), WriteError>),
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
                return std::mem::replace(&mut *answer, Answer::Pending);
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
    fn counts(&self) -> Combining {
        Combining {
            transactions: self.transactions.load(Ordering::Relaxed),
            writes: self.writes.load(Ordering::Relaxed),
            fallbacks: self.fallbacks.load(Ordering::Relaxed),
            waiting: lock(&self.state).waiting.len(),
        }
    }

    /// Takes a slot when one is free and no batch waits.
    fn free_slot(state: &mut State) -> bool {
        let free = state.in_flight < WRITE_TRANSACTIONS_IN_FLIGHT && state.waiting.is_empty();
        if free {
            state.in_flight += 1;
        }
        free
    }

    /// A slot for `batch` when one is free, else its place in the queue (copied outside the
    /// lock).
    fn enter(&self, batch: &WriteBatch, fence: Option<&Fence>) -> Entry {
        if Combiner::free_slot(&mut lock(&self.state)) {
            return Entry::Slot;
        }
        let waiter = Arc::new(Waiter::new(batch, fence));
        let mut state = lock(&self.state);
        if Combiner::free_slot(&mut state) {
            return Entry::Slot;
        }
        state.waiting.push_back(Arc::clone(&waiter));
        Entry::Queued(waiter)
    }

    /// A slot's transaction ended: the slot passes to the first caller waiting, who leads
    /// the next transaction, or is freed when nobody waits.
    fn pass_on(&self) {
        let next = {
            let mut state = lock(&self.state);
            let next = state.waiting.pop_front();
            if next.is_none() {
                state.in_flight -= 1;
            }
            next
        };
        if let Some(next) = next {
            next.answer(Answer::Lead);
        }
    }

    /// Takes `waiter` out of the queue when no transaction took it yet; true when it did.
    fn withdraw(&self, waiter: &Arc<Waiter>) -> bool {
        let mut state = lock(&self.state);
        let position = state.waiting.iter().position(|w| Arc::ptr_eq(w, waiter));
        position.is_some_and(|i| state.waiting.remove(i).is_some())
    }

    /// The batches of the next transaction: `first`, then those waiting, in order, within
    /// [`COMBINE_WRITES_MAX`] and [`COMBINE_BYTES_MAX`].
    fn take(&self, first: Arc<Waiter>) -> Vec<Arc<Waiter>> {
        let mut bytes = first.bytes;
        let mut group = vec![first];
        let mut state = lock(&self.state);
        while group.len() < COMBINE_WRITES_MAX {
            let Some(next) = state.waiting.front() else {
                break;
            };
            if bytes + next.bytes > COMBINE_BYTES_MAX {
                break;
            }
            bytes += next.bytes;
            group.extend(state.waiting.pop_front());
        }
        group
    }
}

/// A taken slot, passed on when dropped (also when its holder unwinds).
struct Slot<'a>(&'a Combiner);

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.0.pass_on();
    }
}

/// The batches a leader took: each caller but the leader gets an answer, also when the leader
/// unwinds before it answered them (then the outcome is unknown).
struct Taken {
    group: Vec<Arc<Waiter>>,
    answered: bool,
}

impl Drop for Taken {
    fn drop(&mut self) {
        if self.answered {
            return;
        }
        for waiter in self.group.iter().skip(1) {
            waiter.answer(Answer::Done(Err(WriteError::Storage(
                KvError::OutcomeUnknown {
                    message: "the thread writing this batch together with others stopped \
                              before it answered"
                        .to_owned(),
                },
            ))));
        }
    }
}

impl Core {
    /// Writes `batch`, in a transaction that first checks `fence` when there is one: alone
    /// when a slot is free, else together with the other batches waiting (module docs).
    pub(crate) fn write(
        &self,
        batch: &WriteBatch,
        fence: Option<&Fence>,
    ) -> Result<(), WriteError> {
        batch.check_limits()?;
        if batch.is_empty() {
            return Ok(());
        }
        let waiter = match self.combiner.enter(batch, fence) {
            Entry::Slot => {
                let _slot = Slot(&self.combiner);
                return self.write_alone(batch, fence);
            }
            Entry::Queued(waiter) => waiter,
        };
        match self.wait_turn(&waiter) {
            Answer::Done(result) => result,
            Answer::Lead => {
                let _slot = Slot(&self.combiner);
                self.lead(waiter)
            }
            Answer::Alone | Answer::Pending => self.write_alone(batch, fence),
        }
    }

    /// Waits for a queued batch's turn: its outcome, the lead of the next transaction, or
    /// going alone, also when no transaction took it within the call's time limit.
    fn wait_turn(&self, waiter: &Arc<Waiter>) -> Answer {
        let limit = self.inner.call_timeout();
        let answer = waiter.wait(Some(Instant::now() + limit));
        if !matches!(answer, Answer::Pending) {
            return answer;
        }
        if self.combiner.withdraw(waiter) {
            tracing::warn!(
                location = %self.location,
                waited = ?limit,
                "a batch waited for a PostgreSQL write transaction past the call's time limit \
                 and goes alone; the server answers slowly"
            );
            return Answer::Alone;
        }
        // A transaction took it; it ends within its own time limit.
        waiter.wait(None)
    }

    /// Leads the next transaction: takes the batches waiting, writes those that may share it
    /// together, answers each caller, and answers the leader's own outcome.
    fn lead(&self, first: Arc<Waiter>) -> Result<(), WriteError> {
        let leader = Arc::clone(&first);
        let mut taken = Taken {
            group: self.combiner.take(first),
            answered: false,
        };
        let group = &taken.group;
        let plans: Vec<Plan<'_>> = group.iter().map(|w| Plan::new(&w.batch)).collect();
        let members = shareable(&plans);
        let answers = match members.iter().filter(|m| **m).count() {
            0 | 1 => group.iter().map(|_| None).collect(),
            _ => self.write_together(group, &plans, &members),
        };
        let mut answers = answers.into_iter();
        let own = answers.next().flatten();
        for (waiter, answer) in group.iter().skip(1).zip(answers) {
            waiter.answer(answer.map_or(Answer::Alone, Answer::Done));
        }
        taken.answered = true;
        match own {
            Some(result) => result,
            None => self.write_alone(&leader.batch, leader.fence.as_ref()),
        }
    }

    /// Writes the batches of `group` that `members` marks in one transaction: each one's
    /// outcome when the transaction committed or its answer was lost, `None` for each that
    /// must go alone (not a member, or the transaction wrote nothing).
    fn write_together(
        &self,
        group: &[Arc<Waiter>],
        plans: &[Plan<'_>],
        members: &[bool],
    ) -> Vec<Option<Result<(), WriteError>>> {
        let chosen = || {
            plans
                .iter()
                .zip(members)
                .filter(|(_, m)| **m)
                .map(|(p, _)| p)
        };
        let union = union(chosen());
        let fences = distinct_fences(
            group
                .iter()
                .zip(members)
                .filter(|(_, m)| **m)
                .filter_map(|(w, _)| w.fence.as_ref()),
        );
        let count = chosen().count();
        let applied = self.run(
            self.inner.call_timeout(),
            write::apply_combined(&self.inner, &union, &fences),
        );
        let outcome: Option<Result<(), KvError>> = match applied {
            Ok(Outcome::Written) => {
                self.combiner.transactions.fetch_add(1, Ordering::Relaxed);
                self.combiner
                    .writes
                    .fetch_add(count as u64, Ordering::Relaxed);
                Some(Ok(()))
            }
            Err(failure) if failure.outcome_unknown() => {
                Some(Err(self.unknown_outcome(&union, count, failure)))
            }
            other => {
                self.combiner.fallbacks.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(
                    writes = count,
                    cause = %fallback_cause(other),
                    "a combined PostgreSQL transaction wrote nothing; its batches go each alone"
                );
                None
            }
        };
        members
            .iter()
            .map(|member| match (member, &outcome) {
                (true, Some(Ok(()))) => Some(Ok(())),
                (true, Some(Err(e))) => Some(Err(WriteError::Storage(copy_unknown(e)))),
                _ => None,
            })
            .collect()
    }

    /// The error of a combined transaction whose answer was lost: waits (on another
    /// connection) until the server ended it, as a write alone does.
    fn unknown_outcome(&self, union: &Plan<'_>, count: usize, failure: Failure) -> KvError {
        let key = first_key(union);
        let settled = key.is_some_and(|k| self.settle(k));
        tracing::warn!(
            location = %self.location,
            writes = count,
            settled,
            "the answer of a combined PostgreSQL transaction was lost; each of its batches \
             reports an unknown outcome"
        );
        failure.into_unknown(
            "writing a batch together with others in one transaction",
            settled,
        )
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

/// The first key a plan writes, which a transaction that lost its answer is settled on.
fn first_key<'a>(plan: &Plan<'a>) -> Option<Key<'a>> {
    keys(plan).next()
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

/// Another copy of an unknown outcome, for each batch of the transaction.
fn copy_unknown(error: &KvError) -> KvError {
    KvError::OutcomeUnknown {
        message: match error {
            KvError::OutcomeUnknown { message } => message.clone(),
            other => other.to_string(),
        },
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
