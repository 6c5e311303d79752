//! [`Combiner`]: the conditional writes that the lanes of different sequences have ready go to
//! storage together, in one [`Backend::write_each`] call (one durable write: one sync of the
//! embedded engine, one statement and commit on PostgreSQL), one call at a time. A lane's
//! leader hands its write over and waits for its own answer; each write still succeeds or
//! fails on its own condition. While a call is in flight the writes handed over wait, and the
//! next call takes them all, so the more sequences are busy the more each call carries.

use std::collections::{HashSet, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::oneshot;

use crate::backend::{Backend, ConditionalWrite, Version, WriteFailure};
use crate::error::StorageError;

/// Most writes one [`Backend::write_each`] call carries; the others wait for the next call.
pub const COMBINE_WRITES_MAX: usize = 256;

/// What a write handed to a [`Combiner`] answers.
pub(crate) type Written = Result<Version, WriteFailure>;

/// Carries the writes of many sequences in shared [`Backend::write_each`] calls.
pub(crate) struct Combiner {
    backend: Arc<dyn Backend>,
    waiting: Mutex<Waiting>,
}

/// The writes handed over and not yet taken by a call, and whether a task is making calls.
#[derive(Default)]
struct Waiting {
    writes: VecDeque<Handed>,
    running: bool,
}

struct Handed {
    write: ConditionalWrite,
    reply: oneshot::Sender<Written>,
}

impl Combiner {
    /// A combiner writing to `backend`.
    pub(crate) fn new(backend: Arc<dyn Backend>) -> Combiner {
        Combiner {
            backend,
            waiting: Mutex::new(Waiting::default()),
        }
    }

    /// Hands `write` over and waits for its answer. A caller that stops waiting before its
    /// write was taken by a call withdraws it (it is never written); once taken, the write
    /// goes on, and its outcome is what storage made of it.
    pub(crate) async fn write(self: &Arc<Self>, write: ConditionalWrite) -> Written {
        let (reply, answer) = oneshot::channel();
        let start = {
            let mut waiting = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
            waiting.writes.push_back(Handed { write, reply });
            !std::mem::replace(&mut waiting.running, true)
        };
        if start {
            // A task of its own, so that a leader that stops waiting never strands the writes
            // of the others.
            tokio::spawn(run_calls(Arc::clone(self)));
        }
        answer.await.unwrap_or_else(|_| {
            Err(WriteFailure::Storage(StorageError::message(
                "writing the sequences",
                "the combined writer ended without answering (runtime shutting down?)",
            )))
        })
    }

    /// The next call's writes: the waiting ones, in order, at most [`COMBINE_WRITES_MAX`], one
    /// per key (a second write of a key waits for the next call); writes nobody waits for any
    /// more are dropped. `None` when nothing waits: the task stops.
    fn take_call(&self) -> Option<Vec<Handed>> {
        let mut waiting = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
        waiting.writes.retain(|handed| !handed.reply.is_closed());
        if waiting.writes.is_empty() {
            waiting.running = false;
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
}

/// Makes calls while writes wait, then stops.
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

/// Resets a combiner whose task stopped early (cancelled, as when the runtime shuts down, or
/// panicked): the writes still waiting are dropped, so their callers get an error, and the
/// next write starts a new task.
struct Stopped<'a> {
    combiner: &'a Combiner,
    finished: bool,
}

impl Drop for Stopped<'_> {
    fn drop(&mut self) {
        if !self.finished {
            let mut waiting = self
                .combiner
                .waiting
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            waiting.writes.clear();
            waiting.running = false;
        }
    }
}
