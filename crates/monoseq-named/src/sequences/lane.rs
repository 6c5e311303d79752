//! Lanes: the in-process combining of concurrent `next` calls on one sequence into one
//! conditional write (one "lane" per sequence with a leader task), which keeps writers of one
//! process from racing each other and turns N waiting callers into one storage round trip:
//! between batches the process remembers the state it last wrote, so a batch writes on it
//! without reading first (a stale memory is refused like a stale read). On a backend that
//! [combines](Backend::combines), the leaders of different sequences hand their writes to one
//! combiner (`combine.rs`), so the ready batches of every sequence share one durable write. With
//! a number cache (`cache.rs`) a `next` takes its numbers from this process's block of the
//! sequence without a storage call, and a lane's write reserves a whole block.

use std::collections::VecDeque;
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use super::{Inner, Sequences, backoff, created, rewritten};
use crate::address::Address;
use crate::backend::{Backend, ConditionalWrite, Object, Version, WriteFailure};
use crate::error::NextError;
use crate::record::{Metadata, SequenceData, VALUE_MAX, now_ms};

/// Most concurrent `next` calls of one process served by one conditional write.
pub const COMBINE_CALLS_MAX: usize = 1024;
/// Most `next` calls of one process waiting in one sequence's lane (besides the batch being
/// written); a call past it answers [`NextError::LaneFull`] at once instead of queueing, so
/// memory stays bounded while storage is slow.
pub const LANE_CALLS_MAX: usize = 16 * COMBINE_CALLS_MAX;
/// Most sequences whose last written state this process remembers between batches (so that
/// a batch writes without reading first); past it the memory is dropped and refilled.
const KNOWN_SEQUENCES_MAX: usize = 4096;

/// A sequence as this process last wrote it, with the version that write answered.
pub(super) struct Known {
    data: SequenceData,
    version: Version,
}

/// One `next` call waiting in a lane.
pub(super) struct Waiter {
    pub(super) increment: u64,
    pub(super) initial: u64,
    pub(super) metadata: Option<Metadata>,
    pub(super) started: Instant,
    pub(super) deadline: Instant,
    pub(super) timeout: Duration,
    pub(super) reply: oneshot::Sender<Result<u64, NextError>>,
}

impl Sequences {
    /// Queues `waiter` in the lane of `address`: `true` when it starts the lane (its caller
    /// starts the leader).
    pub(super) fn queue(&self, address: &Address, waiter: Waiter) -> Result<bool, NextError> {
        let mut lanes = self
            .inner
            .lanes
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        match lanes.get_mut(address.key()) {
            Some(lane) if lane.len() >= LANE_CALLS_MAX => Err(NextError::LaneFull {
                address: address.to_string(),
                waiting: lane.len(),
                max: LANE_CALLS_MAX,
            }),
            Some(lane) => {
                lane.push_back(waiter);
                Ok(false)
            }
            None => {
                lanes.insert(address.key().to_owned(), VecDeque::from([waiter]));
                Ok(true)
            }
        }
    }
}

/// The leader of a lane: serves the queued calls of one sequence, batch after batch, until the
/// lane is empty, then removes it.
pub(super) async fn lead_lane(inner: Arc<Inner>, address: Address) {
    let mut guard = LaneGuard {
        inner: &inner,
        key: address.key(),
        finished: false,
    };
    let mut known = inner.take_known(address.key());
    loop {
        let batch = {
            let mut lanes = inner.lanes.lock().unwrap_or_else(PoisonError::into_inner);
            let lane = lanes
                .get_mut(address.key())
                .expect("a lane lives while its leader runs");
            if lane.is_empty() {
                // Remembered before the lane goes, so that the next leader finds it.
                inner.keep_known(address.key(), known);
                lanes.remove(address.key());
                guard.finished = true;
                return;
            }
            take_batch(lane)
        };
        let batch = serve_from_block(&inner, address.key(), batch);
        if !batch.is_empty() {
            serve_batch(&inner, &address, batch, &mut known).await;
        }
    }
}

impl Inner {
    /// Makes one sequence's conditional write: through the combiner, with the writes of other
    /// sequences, when the backend combines; else on its own.
    async fn write(&self, write: ConditionalWrite) -> Result<Version, WriteFailure> {
        if let Some(combiner) = &self.combiner {
            return combiner.write(write).await;
        }
        match &write.expected {
            None => self.backend.create(&write.key, write.bytes).await,
            Some(expected) => {
                self.backend
                    .replace(&write.key, expected, write.bytes)
                    .await
            }
        }
    }

    /// The state this process last wrote for `key`, taken out for a lane's leader.
    fn take_known(&self, key: &str) -> Option<Known> {
        self.known
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(key)
    }

    /// Remembers what a leader last wrote (nothing when its last attempt did not succeed).
    fn keep_known(&self, key: &str, known: Option<Known>) {
        let Some(known) = known else { return };
        let mut all = self.known.lock().unwrap_or_else(PoisonError::into_inner);
        if all.len() >= KNOWN_SEQUENCES_MAX {
            all.clear();
        }
        all.insert(key.to_owned(), known);
    }
}

/// Removes a lane whose leader stopped early (its task was cancelled, as when the runtime
/// shuts down, or it panicked), so that the next call starts a new leader instead of queueing
/// behind none. The waiters still queued get an error when their reply is dropped.
struct LaneGuard<'a> {
    inner: &'a Inner,
    key: &'a str,
    finished: bool,
}

impl Drop for LaneGuard<'_> {
    fn drop(&mut self) {
        if !self.finished {
            let mut lanes = self
                .inner
                .lanes
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            lanes.remove(self.key);
        }
    }
}

/// Answers the waiters at the front of `batch` whose numbers this process's block holds (a
/// refill may have installed it since they queued); returns the others.
fn serve_from_block(inner: &Inner, key: &str, batch: Vec<Waiter>) -> Vec<Waiter> {
    let Some(cache) = &inner.cache else {
        return batch;
    };
    let mut waiters = batch.into_iter();
    let mut rest = Vec::new();
    for waiter in waiters.by_ref() {
        let taken = match waiter.metadata {
            None => cache.take(key, waiter.increment),
            Some(_) => None,
        };
        match taken {
            Some(first) => {
                let _ = waiter.reply.send(Ok(first));
            }
            None => {
                rest.push(waiter);
                break;
            }
        }
    }
    rest.extend(waiters);
    rest
}

/// The first waiter and the compatible ones right behind it (same initial value, no
/// metadata), as many as fit below [`VALUE_MAX`] and [`COMBINE_CALLS_MAX`].
fn take_batch(lane: &mut VecDeque<Waiter>) -> Vec<Waiter> {
    let first = lane.pop_front().expect("the lane is not empty");
    let mut total = first.increment;
    let combinable = first.metadata.is_none();
    let initial = first.initial;
    let mut batch = vec![first];
    while combinable && batch.len() < COMBINE_CALLS_MAX {
        let Some(next) = lane.front() else { break };
        if next.metadata.is_some() || next.initial != initial {
            break;
        }
        match total.checked_add(next.increment) {
            Some(sum) if sum <= VALUE_MAX => total = sum,
            _ => break,
        }
        batch.push(lane.pop_front().expect("front exists"));
    }
    batch
}

/// Serves one batch with one conditional write per attempt: the waiters get consecutive
/// ranges, in order. Every waiter takes part in at least one attempt that reads what is stored
/// (a timeout of 0 tries once); after a lost race, the waiters whose deadline passed are
/// answered busy, nothing having been written for them. An attempt runs to its end whatever
/// the deadlines: a write cut short could land after its callers were told it had not.
/// `known` is what this process last wrote, if that write succeeded: the attempt writes on it
/// without reading first, and leaves in it what it wrote, or nothing.
async fn serve_batch(
    inner: &Inner,
    address: &Address,
    mut batch: Vec<Waiter>,
    known: &mut Option<Known>,
) {
    let mut attempts = 0u32;
    // Whether the batch lost a race on what was stored: only then may a waiter out of time
    // be answered busy (a refused write on a stale memory is no try of theirs).
    let mut lost = false;
    loop {
        if lost {
            // Answer the waiters out of time before trying again.
            let now = Instant::now();
            let (expired, live): (Vec<Waiter>, Vec<Waiter>) =
                batch.into_iter().partition(|w| w.deadline <= now);
            for waiter in expired {
                answer_busy(waiter, address, attempts);
            }
            batch = live;
        }
        if batch.is_empty() {
            return;
        }
        attempts += 1;
        match attempt(inner, address, &mut batch, known).await {
            Attempt::Done => return,
            Attempt::Stale => {}
            Attempt::Lost => {
                lost = true;
                // Sleep no later than the earliest deadline; the loop answers it then.
                let earliest = batch.iter().map(|w| w.deadline).min();
                if let Some(earliest) = earliest {
                    backoff(attempts, earliest).await;
                }
            }
            Attempt::Failed(error) => {
                let mut waiters = batch.into_iter();
                if let Some(last) = waiters.next_back() {
                    for waiter in waiters {
                        let _ = waiter.reply.send(Err(error.clone_lossy()));
                    }
                    let _ = last.reply.send(Err(error));
                }
                return;
            }
        }
    }
}

fn answer_busy(waiter: Waiter, address: &Address, attempts: u32) {
    let _ = waiter.reply.send(Err(NextError::Busy {
        address: address.to_string(),
        attempts,
        waited: waiter.started.elapsed(),
        timeout: waiter.timeout,
    }));
}

enum Attempt {
    /// Every waiter of the batch was answered.
    Done,
    /// Another writer won; retry.
    Lost,
    /// The state this process remembered had changed (another process wrote, or a `reset`,
    /// `set` or `delete`); retry at once with a fresh read.
    Stale,
    /// An error every waiter gets.
    Failed(NextError),
}

/// One conditional write for the whole batch, on the state this process last wrote if it
/// knows it, else on a fresh read (a stale `known` is refused like a stale read, and the
/// retry reads). With a cache it stores the ceiling of a whole block, and once it is durable
/// keeps the numbers past the batch's as the block. On success, answers every waiter, leaves
/// what it wrote in `known` and returns [`Attempt::Done`]; waiters that would overflow are
/// answered with [`NextError::Overflow`] and dropped from the batch.
async fn attempt(
    inner: &Inner,
    address: &Address,
    batch: &mut Vec<Waiter>,
    known: &mut Option<Known>,
) -> Attempt {
    // Taken before anything is read: a `reset`, `set` or `delete` of this process that drops
    // the block from here on revokes it, and this attempt then installs nothing.
    let ticket = inner.cache.as_ref().map(|c| c.begin_refill(address.key()));
    let remembered = known.is_some();
    let (old, version) = match known.take() {
        Some(Known { data, version }) => (Some(data), Some(version)),
        None => match load_stored(&*inner.backend, address).await {
            Ok(stored) => stored,
            Err(failed) => return failed,
        },
    };
    let start = old.as_ref().map_or(batch[0].initial, |old| old.value);
    let end = keep_fitting(batch, address, start);
    if batch.is_empty() {
        return Attempt::Done;
    }
    let ceiling = inner.cache.as_ref().map_or(end, |c| c.ceiling(start, end));
    let metadata = batch[0].metadata.clone();
    let now = now_ms();
    let (data, expected) = match (old, version) {
        (Some(old), Some(version)) => (rewritten(old, ceiling, metadata, now), Some(version)),
        _ => (created(address, ceiling, metadata, now), None),
    };
    let write = ConditionalWrite {
        key: address.key().to_owned(),
        expected,
        bytes: data.encode(),
    };
    match inner.write(write).await {
        Err(WriteFailure::Conflict) if remembered => Attempt::Stale,
        Err(WriteFailure::Conflict) => Attempt::Lost,
        Err(WriteFailure::Storage(e)) => Attempt::Failed(NextError::Storage(e)),
        Ok(version) => {
            *known = Some(Known { data, version });
            // Before the answers, so that a caller's next call already finds the block.
            if let (Some(cache), Some(ticket)) = (&inner.cache, ticket) {
                cache.install(address.key(), ticket, end, ceiling);
            }
            let mut value = start;
            for waiter in batch.drain(..) {
                let _ = waiter.reply.send(Ok(value));
                value += waiter.increment;
            }
            debug_assert_eq!(value, end);
            Attempt::Done
        }
    }
}

/// The stored sequence and its version (both `None` when absent), or how the attempt ends.
async fn load_stored(
    backend: &dyn Backend,
    address: &Address,
) -> Result<(Option<SequenceData>, Option<Version>), Attempt> {
    let loaded = match backend.load(address.key()).await {
        Err(e) => return Err(Attempt::Failed(NextError::Storage(e))),
        Ok(loaded) => loaded,
    };
    match loaded {
        None => Ok((None, None)),
        Some(Object { bytes, version }) => match SequenceData::decode(&bytes, address.name()) {
            Ok(old) => Ok((Some(old), Some(version))),
            Err(reason) => Err(Attempt::Failed(NextError::InvalidStored {
                key: address.key().to_owned(),
                reason: reason.to_string(),
            })),
        },
    }
}

/// Keeps the prefix of `batch` whose numbers, from `start`, stay at or below [`VALUE_MAX`];
/// answers the others [`NextError::Overflow`]. Returns the value after the kept prefix.
fn keep_fitting(batch: &mut Vec<Waiter>, address: &Address, start: u64) -> u64 {
    let mut end = start;
    let mut fits = 0;
    for waiter in batch.iter() {
        match end.checked_add(waiter.increment) {
            Some(next) if next <= VALUE_MAX => {
                end = next;
                fits += 1;
            }
            _ => break,
        }
    }
    for waiter in batch.drain(fits..) {
        let _ = waiter.reply.send(Err(NextError::Overflow {
            address: address.to_string(),
            value: end,
            increment: waiter.increment,
            max: VALUE_MAX,
        }));
    }
    end
}
