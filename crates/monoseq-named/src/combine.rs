//! [`Combiner`]: the conditional writes that the lanes of different sequences have ready go to
//! storage together, in one [`Backend::write_each`] call (one durable write: one sync of the
//! embedded engine, one transaction and commit on PostgreSQL). At most
//! [`DURABLE_WRITES_IN_FLIGHT`] calls are in flight: a lane's leader whose write finds a call
//! free and nothing waiting makes it at once, alone, in its own task (no hop, no added
//! latency when storage keeps up); otherwise the write waits, and the first call to end takes
//! every write waiting. So the busier storage is, the more each durable write carries. Each
//! write still succeeds or fails on its own condition, and its leader gets only its own answer.
//!
//! Four calls in flight rather than one keep storage busy while the callers of the last call
//! send their next requests: over HTTP with 16 connections on 4 sequences, one or two calls in
//! flight lost up to a third of the throughput on PostgreSQL (whose own group commit already
//! overlaps concurrent commits), while on 16 sequences four in flight serve 1.5–2× the calls
//! of a write per sequence (see `docs/benchmarks/named.md`).

use std::collections::{HashSet, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::oneshot;

use crate::backend::{Backend, ConditionalWrite, Version, WriteFailure};
use crate::error::StorageError;

/// Most writes one [`Backend::write_each`] call carries; the others wait for the next call.
pub const COMBINE_WRITES_MAX: usize = 256;
/// Most [`Backend::write_each`] calls of one combiner in flight at once. A write handed over
/// while fewer are in flight goes out at once, alone; the writes handed over while this many
/// are in flight wait, and the first call to end takes them all.
pub const DURABLE_WRITES_IN_FLIGHT: usize = 4;

/// What a write handed to a [`Combiner`] answers.
pub(crate) type Written = Result<Version, WriteFailure>;

/// Carries the writes of many sequences in shared [`Backend::write_each`] calls.
pub(crate) struct Combiner {
    backend: Arc<dyn Backend>,
    waiting: Mutex<Waiting>,
}

/// The writes handed over and not yet taken by a call, and the calls in flight.
#[derive(Default)]
struct Waiting {
    writes: VecDeque<Handed>,
    calls: usize,
}

struct Handed {
    write: ConditionalWrite,
    reply: oneshot::Sender<Written>,
}

/// How a write was handed over.
enum Handing {
    /// A slot was free and nothing waited: the caller makes the write itself, alone.
    Alone(ConditionalWrite),
    /// It waits for a call; its answer comes here.
    Queued(oneshot::Receiver<Written>),
}

impl Combiner {
    /// A combiner writing to `backend`.
    pub(crate) fn new(backend: Arc<dyn Backend>) -> Combiner {
        Combiner {
            backend,
            waiting: Mutex::new(Waiting::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Waiting> {
        self.waiting.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Makes `write`, alone at once when a call may start (no hop to another task), else with
    /// the writes waiting, in the next call. A caller that stops waiting before its write was
    /// taken by a call withdraws it (it is never written); once taken, the write goes on, and
    /// its outcome is what storage made of it.
    pub(crate) async fn write(self: &Arc<Self>, write: ConditionalWrite) -> Written {
        let answer = match self.hand(write) {
            Handing::Alone(write) => {
                let _slot = Slot(self);
                let mut answers = self.backend.write_each(vec![write]).await;
                return answers.pop().unwrap_or_else(|| Err(unanswered()));
            }
            Handing::Queued(answer) => answer,
        };
        answer.await.unwrap_or_else(|_| Err(unanswered()))
    }

    /// Takes a slot for `write` alone when one is free and nothing waits; else queues it (and
    /// starts a task on a free slot for the writes waiting).
    fn hand(self: &Arc<Self>, write: ConditionalWrite) -> Handing {
        let mut waiting = self.lock();
        if waiting.calls < DURABLE_WRITES_IN_FLIGHT && waiting.writes.is_empty() {
            waiting.calls += 1;
            return Handing::Alone(write);
        }
        let (reply, answer) = oneshot::channel();
        waiting.writes.push_back(Handed { write, reply });
        if waiting.calls < DURABLE_WRITES_IN_FLIGHT {
            waiting.calls += 1;
            tokio::spawn(run_calls(Arc::clone(self)));
        }
        Handing::Queued(answer)
    }

    /// The next call's writes: the waiting ones, in order, at most [`COMBINE_WRITES_MAX`], one
    /// per key (a second write of a key waits for the next call); writes nobody waits for any
    /// more are dropped. `None` when nothing waits: the call's slot is given up.
    fn take_call(&self) -> Option<Vec<Handed>> {
        let mut waiting = self.lock();
        waiting.writes.retain(|handed| !handed.reply.is_closed());
        if waiting.writes.is_empty() {
            waiting.calls -= 1;
            return None;
        }
        let mut keys = HashSet::new();
        let mut call = Vec::new();
        let mut later = VecDeque::new();
        while let Some(handed) = waiting.writes.pop_front() {
            if call.len() < COMBINE_WRITES_MAX && keys.insert(handed.write.key.clone()) {
                call.push(handed);
            } else {
                later.push_back(handed);
            }
        }
        waiting.writes = later;
        Some(call)
    }

    /// Gives up a call's slot that a task ended early with (cancelled, as when the runtime
    /// shuts down, or panicked): the writes still waiting are dropped, so their callers get an
    /// error.
    fn abandon_slot(&self) {
        let mut waiting = self.lock();
        waiting.writes.clear();
        waiting.calls -= 1;
    }
}

/// The failure of a write whose combined call ended without an answer for it: the call's task
/// was cancelled (the runtime is shutting down) or panicked, or the backend answered too few.
/// The write may have landed; the caller hands nothing out and reads again.
fn unanswered() -> WriteFailure {
    WriteFailure::Storage(StorageError::message(
        "writing the sequence",
        "the combined write that carried it ended without answering for it (its task was \
         cancelled or panicked, or the backend answered fewer writes than it was given), so \
         it may have landed",
    ))
}

/// The slot of a call made in the caller's own task: when that call ends (or is abandoned),
/// the writes that waited meanwhile go out from a task of their own, on the same slot.
struct Slot<'a>(&'a Arc<Combiner>);

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        let combiner = self.0;
        let mut waiting = combiner.lock();
        if waiting.writes.is_empty() {
            waiting.calls -= 1;
            return;
        }
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(run_calls(Arc::clone(combiner)));
            }
            Err(_) => {
                waiting.writes.clear();
                waiting.calls -= 1;
            }
        }
    }
}

/// Makes calls on one slot while writes wait, then gives the slot up.
async fn run_calls(combiner: Arc<Combiner>) {
    let mut stopped = Stopped {
        combiner: &combiner,
        finished: false,
    };
    while let Some(call) = combiner.take_call() {
        let (writes, replies): (Vec<ConditionalWrite>, Vec<oneshot::Sender<Written>>) = call
            .into_iter()
            .map(|handed| (handed.write, handed.reply))
            .unzip();
        let answers = combiner.backend.write_each(writes).await;
        // A reply without an answer (a backend answering too few) is dropped: its caller
        // gets an error.
        for (reply, answer) in replies.into_iter().zip(answers) {
            let _ = reply.send(answer);
        }
    }
    stopped.finished = true;
}

/// Gives up the slot of a task that stopped early.
struct Stopped<'a> {
    combiner: &'a Combiner,
    finished: bool,
}

impl Drop for Stopped<'_> {
    fn drop(&mut self) {
        if !self.finished {
            self.combiner.abandon_slot();
        }
    }
}
