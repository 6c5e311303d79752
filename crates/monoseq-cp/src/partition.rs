//! The async side of one partition: a task that takes groups of queued commands and hands
//! each to the partition's [`Writer`] (`writer.rs`) on the partition's own thread or a
//! blocking one. The order of the task's steps (the start, a heal with bounded backoff, the
//! read-back after a failed write, stopping) is decided by the partition's [`Lifecycle`]
//! (`lifecycle.rs`); the task performs them on tokio and feeds their results back.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use monoseq_core::{Params, PoisonReason, Runtime, Sequencer, SequencerHandle, Status};
use monoseq_kv::KvStore;
use tokio::sync::mpsc;

use crate::error::{CommandError, StepError};
pub(crate) use crate::lifecycle::PartitionState;
use crate::lifecycle::{Action, Actualization, End, GroupOutcome, Input, Lifecycle};
use crate::threads::Raises;
use crate::writer::{
    Appending, Job, Storage, SystemClock, Writer, WriterTemplate, next_group, read_keys,
};

/// What the processor and a partition's task share.
pub(crate) struct PartitionShared<S: KvStore + Clone> {
    pub(crate) handle: Mutex<SequencerHandle<Storage<S>>>,
    pub(crate) state: Mutex<PartitionState>,
    pub(crate) rebuilds: AtomicU64,
    /// Set once the state is [`PartitionState::Fenced`]: read by every submission, without
    /// a lock.
    pub(crate) fenced: AtomicBool,
}

impl<S: KvStore + Clone> PartitionShared<S> {
    pub(crate) fn handle(&self) -> SequencerHandle<Storage<S>> {
        self.handle
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub(crate) fn state(&self) -> PartitionState {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Whether another node owns the partition now.
    pub(crate) fn is_fenced(&self) -> bool {
        self.fenced.load(Ordering::Acquire)
    }

    fn set_state(&self, state: PartitionState) {
        *self.state.lock().unwrap_or_else(|e| e.into_inner()) = state;
    }
}

/// The async side of a partition.
pub(crate) struct PartitionTask<S: KvStore + Clone> {
    /// `None` only while a group runs on a blocking thread, or after that thread was lost.
    pub(crate) writer: Option<Writer<S>>,
    pub(crate) storage: Storage<S>,
    pub(crate) params: Params,
    pub(crate) runtime: Runtime,
    pub(crate) shared: Arc<PartitionShared<S>>,
    pub(crate) group_max: usize,
    pub(crate) window_events: u64,
    pub(crate) template: WriterTemplate<S>,
    /// The task runs on a thread of its own (`Handle::block_on`): its groups run in place
    /// rather than on the runtime's blocking pool.
    pub(crate) own_thread: bool,
    /// The task runs on a writer thread shared with other partitions: its groups run in
    /// place and their marks are raised with those of the thread's other groups.
    pub(crate) raises: Option<Arc<Raises>>,
}

impl<S: KvStore + Clone + Send + Sync + 'static> PartitionTask<S> {
    /// Drives the partition's [`Lifecycle`]: performs each step it asks for and feeds the
    /// result back, until it stops.
    pub(crate) async fn run(mut self, mut rx: mpsc::Receiver<Job>) {
        let mut lc = Lifecycle::new(self.template.partition.0);
        let mut retry: Vec<Job> = Vec::new();
        let mut heal_began = Instant::now();
        loop {
            if let Some(state) = lc.take_state() {
                self.shared.set_state(state);
            }
            let input = match lc.action() {
                Action::RunGroup => self.next_group(&mut rx, &mut retry).await,
                Action::Heal {
                    reason,
                    attempt,
                    delay,
                } => {
                    if attempt == 1 {
                        heal_began = Instant::now();
                    }
                    self.heal(&reason, attempt, delay, &mut rx).await
                }
                Action::Healed { attempts } => {
                    self.shared.rebuilds.fetch_add(1, Ordering::Relaxed);
                    tracing::info!(
                        partition = self.template.partition.0,
                        attempts,
                        elapsed_ms = heal_began.elapsed().as_millis() as u64,
                        "partition rebuilt; serving again"
                    );
                    Input::Done
                }
                Action::Stop(end) => return self.end(&end, retry, rx, lc).await,
                action => self.perform(action, &mut rx).await,
            };
            lc.feed(input);
        }
    }

    /// Performs a step of the start or of a recovery; its result.
    async fn perform(&mut self, action: Action, rx: &mut mpsc::Receiver<Job>) -> Input {
        match action {
            Action::WaitActualized { wait } => Input::Actualized(self.actualization(wait).await),
            Action::AnswerQueued(e) => Input::Answered {
                open: answer_queued(rx, &|| e.clone()),
            },
            Action::CheckWhole => Input::Checked(match &self.writer {
                Some(w) => w.whole(),
                None => Ok(()),
            }),
            Action::CoverTail { attempt } => Input::Covered(self.cover_tail(attempt).await),
            Action::Pause { delay, refuse } => {
                match refuse {
                    Some(e) => {
                        let _ = tokio::time::timeout(delay, drain(rx, &|| e.clone())).await;
                    }
                    None => tokio::time::sleep(delay).await,
                }
                Input::Done
            }
            Action::RebuildWindow { attempt } => {
                Input::WindowRebuilt(self.rebuild_window(attempt).await)
            }
            Action::ReadBack { from, attempt } => {
                Input::ReadBack(self.read_back(from, attempt).await)
            }
            // Performed by `run`.
            Action::RunGroup | Action::Heal { .. } | Action::Healed { .. } | Action::Stop(_) => {
                Input::Done
            }
        }
    }

    /// Takes the next group (the retried commands first, else what the queue holds) and runs
    /// it; how it ended, or [`Input::Closed`] when the queue closed.
    async fn next_group(&mut self, rx: &mut mpsc::Receiver<Job>, retry: &mut Vec<Job>) -> Input {
        let first = if retry.is_empty() {
            match rx.recv().await {
                Some(j) => Some(j),
                None => return Input::Closed,
            }
        } else {
            None
        };
        let mut jobs = next_group(retry, first, self.group_max, || rx.try_recv().ok());
        // The rest of a batch's share is being queued right now: the group takes it too.
        while jobs.len() < self.group_max && jobs.last().is_some_and(|j| j.more) {
            let Some(next) = rx.recv().await else { break };
            jobs = next_group(&mut jobs, Some(next), self.group_max, || rx.try_recv().ok());
        }
        let (outcome, mut jobs) = self.group(jobs).await;
        // Retried after a failed group, with the rest of their share taken already (answered,
        // or retried beside them): the group that retries them waits for nothing more.
        for j in &mut jobs {
            j.more = false;
        }
        *retry = jobs;
        Input::Ran(outcome)
    }

    /// The partition stopped serving (`end`): logs why once, answers the retried commands and
    /// every command that arrives with the same refusal until the queue closes, then stops
    /// the sequencer.
    async fn end(self, end: &End, retry: Vec<Job>, mut rx: mpsc::Receiver<Job>, mut lc: Lifecycle) {
        let partition = self.template.partition.0;
        match end {
            End::Closed => {}
            End::Fenced => {
                tracing::warn!(
                    partition,
                    "the storage refused this node's write: another node owns the partition \
                     now; it stops serving it here"
                );
                self.shared.fenced.store(true, Ordering::Release);
            }
            End::Failed { reason } => tracing::error!(partition, "{reason}"),
            End::Lost { reason } => tracing::error!(
                partition,
                "partition {partition} is refused: {reason}; it stops serving so that no number \
                 is handed out twice. Restore the storage, or accept the loss (its numbers are \
                 never handed out again): restart with `monoseq serve --accept-loss`"
            ),
        }
        if let Some(state) = lc.take_state() {
            self.shared.set_state(state);
        }
        let refused = || end.refusal(partition);
        for j in retry {
            let _ = j.reply.send(Err(refused()));
        }
        if *end != End::Closed {
            drain(&mut rx, &refused).await;
        }
        drop(rx);
        lc.feed(Input::Closed);
        if let Some(state) = lc.take_state() {
            self.shared.set_state(state);
        }
        if let Some(w) = self.writer {
            let seq = w.seq;
            let _ = tokio::task::spawn_blocking(move || seq.shutdown()).await;
        }
    }

    /// Covers the stored PLog's tail with the mark (see `Writer::cover_stored_tail`); a
    /// failure is logged, and the lifecycle retries it with backoff.
    async fn cover_tail(&mut self, attempt: u32) -> Result<(), StepError> {
        let Some(mut writer) = self.writer.take() else {
            return Ok(());
        };
        let covered = tokio::task::spawn_blocking(move || {
            let covered = writer.cover_stored_tail();
            (writer, covered)
        })
        .await;
        let Ok((writer, covered)) = covered else {
            return Ok(());
        };
        self.writer = Some(writer);
        if let Err(e) = &covered {
            tracing::warn!(
                partition = self.template.partition.0,
                attempt,
                "covering the stored PLog with the high-water mark failed: {e}; retrying"
            );
        }
        covered
    }

    /// Waits up to `wait` for the sequencer to finish actualizing; what it came to.
    async fn actualization(&self, wait: Duration) -> Actualization {
        let handle = self.shared.handle();
        let status = tokio::task::spawn_blocking(move || handle.wait_actualized(wait))
            .await
            .unwrap_or(Status::Finished);
        let stats = self.shared.handle().stats();
        actualization(status, &stats)
    }

    /// Remembers the keys of the PLog tail's events (the window's span before the PLog end);
    /// a failure is logged, and the lifecycle retries it with backoff.
    async fn rebuild_window(&mut self, attempt: u32) -> Result<(), StepError> {
        let next = self.shared.handle().stats().next_offset;
        let Some(from) = self.writer.as_ref().map(|w| w.window.start(next)) else {
            return Ok(());
        };
        let rebuilt = self.learn_keys(from, next).await;
        if let Err(e) = &rebuilt {
            tracing::warn!(
                partition = self.template.partition.0,
                attempt,
                "rebuilding the idempotency window failed: {e}; retrying before serving (a \
                 retry of a command in the window would otherwise be applied again)"
            );
        }
        rebuilt
    }

    /// Remembers the idempotency keys of the events at PLog offsets `from..to`; the keys read
    /// before an error are kept.
    async fn learn_keys(&mut self, from: u64, to: u64) -> Result<(), StepError> {
        let Some(w) = self.writer.as_ref() else {
            return Err(StepError::WriterLost);
        };
        let (store, partition, floor) = (w.store.clone(), w.partition, w.floor);
        let (keys, read) =
            tokio::task::spawn_blocking(move || read_keys(&store, partition, floor, from, to))
                .await
                .map_err(|e| StepError::ThreadLost(e.to_string()))?;
        if let Some(w) = &mut self.writer {
            w.remember(keys);
        }
        read
    }

    /// Reads back the PLog from a failed group's first offset `from` to the actualized end and
    /// remembers the keys found there (the lifecycle asks once the sequencer re-read the
    /// PLog's end, before any command is taken): a write whose answer was lost may have
    /// landed; a retry of one of its commands then gets the original answer instead of being
    /// applied a second time.
    async fn read_back(&mut self, from: u64, attempts: u32) -> Result<(), StepError> {
        let partition = self.template.partition.0;
        let to = self.shared.handle().stats().next_offset;
        match self.learn_keys(from, to).await {
            Ok(()) => {
                tracing::info!(
                    partition,
                    from,
                    to,
                    attempts,
                    "read back the PLog after a failed group write; serving again"
                );
                Ok(())
            }
            Err(e) => {
                tracing::warn!(
                    partition,
                    attempts,
                    "reading back the PLog after a failed group write failed: {e}; retrying"
                );
                Err(e)
            }
        }
    }

    /// Runs one group in place on the partition's own thread or its shared writer thread,
    /// else on a blocking thread; how it ended, and the jobs to retry.
    async fn group(&mut self, jobs: Vec<Job>) -> (GroupOutcome, Vec<Job>) {
        let failed = |why: &str| GroupOutcome::Failed {
            why: why.into(),
            unresolved_from: None,
        };
        let Some(writer) = self.writer.take() else {
            return (failed("a group's thread was lost"), jobs);
        };
        let (writer, ran) = if let Some(raises) = &self.raises {
            run_shared(writer, jobs, raises).await
        } else {
            let run = move |mut writer: Writer<S>| {
                let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    writer.run_group(jobs, &SystemClock)
                }));
                (writer, ran)
            };
            if self.own_thread {
                run(writer)
            } else {
                match tokio::task::spawn_blocking(move || run(writer)).await {
                    Ok(ran) => ran,
                    Err(_) => return (failed("a group's thread was lost"), Vec::new()),
                }
            }
        };
        self.writer = Some(writer);
        ran.unwrap_or_else(|_| (failed("processing a group panicked"), Vec::new()))
    }

    /// A new sequencer on the same storage (which fences the old one's writes), and a new
    /// writer around it when the old writer was lost.
    fn replace_sequencer(&mut self, template: &WriterTemplate<S>) -> bool {
        let seq = {
            let _span =
                tracing::info_span!("partition", partition = self.template.partition.0).entered();
            Sequencer::new(
                self.params.clone(),
                Arc::clone(&self.storage),
                &self.runtime,
            )
        };
        *self.shared.handle.lock().unwrap_or_else(|e| e.into_inner()) = seq.handle();
        let lost = self.writer.is_none();
        match &mut self.writer {
            Some(w) => {
                let old = std::mem::replace(&mut w.seq, seq);
                drop(old);
                w.reported = (0, 0);
            }
            None => self.writer = Some(template.writer(seq, self.window_events)),
        }
        lost
    }

    /// One attempt at rebuilding a failed partition (`reason`): after `delay` (the lifecycle's
    /// backoff), during which arriving commands are answered "unavailable", a new sequencer
    /// on the same storage, actualizing from the PLog.
    async fn heal(
        &mut self,
        reason: &str,
        attempt: u32,
        delay: Duration,
        rx: &mut mpsc::Receiver<Job>,
    ) -> Input {
        let partition = self.template.partition.0;
        if attempt == 1 {
            tracing::error!(partition, "partition failed: {reason}; rebuilding it");
        } else {
            tracing::error!(
                partition,
                attempts = attempt - 1,
                "rebuilding the partition failed; retrying"
            );
        }
        let unavailable = || CommandError::Unavailable {
            partition,
            reason: reason.to_owned(),
        };
        let _ = tokio::time::timeout(delay, drain(rx, &unavailable)).await;
        let template = self.template.clone();
        let writer_lost = self.replace_sequencer(&template);
        Input::Replaced { writer_lost }
    }
}

/// What a wait for the actualization came to: its `status` when the wait ended, read with
/// the sequencer's `stats` (why it still actualizes; whether the storage fenced it off).
pub(crate) fn actualization(status: Status, stats: &monoseq_core::SequencerStats) -> Actualization {
    match status {
        Status::None | Status::Actualizing => Actualization::Pending {
            corrupted: stats.storage_corrupted,
            failing: stats.storage_failing,
        },
        Status::Finished => Actualization::Stopped {
            fenced: stats.poison == Some(PoisonReason::Fenced),
        },
        _ => Actualization::Ready,
    }
}

/// Answers every command queued now with `error`; false when the queue is closed.
fn answer_queued(rx: &mut mpsc::Receiver<Job>, error: &(dyn Fn() -> CommandError + Sync)) -> bool {
    loop {
        match rx.try_recv() {
            Ok(j) => {
                let _ = j.reply.send(Err(error()));
            }
            Err(mpsc::error::TryRecvError::Empty) => return true,
            Err(mpsc::error::TryRecvError::Disconnected) => return false,
        }
    }
}

/// Answers every command that arrives with `error` until the queue closes (or the caller's
/// timeout ends the wait).
async fn drain(rx: &mut mpsc::Receiver<Job>, error: &(dyn Fn() -> CommandError + Sync)) {
    while let Some(j) = rx.recv().await {
        let _ = j.reply.send(Err(error()));
    }
}

/// Runs one group on a writer thread shared with other partitions: appends it, waits for
/// the thread's raise of its mark with those of the thread's other groups, then answers it.
/// The writer comes back with how the group ran (`Err`: it panicked).
async fn run_shared<S: KvStore + Clone + Send + Sync + 'static>(
    mut writer: Writer<S>,
    jobs: Vec<Job>,
    raises: &Raises,
) -> (Writer<S>, std::thread::Result<(GroupOutcome, Vec<Job>)>) {
    let partition = writer.partition.0;
    let appending = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        writer.append_group(jobs, &SystemClock)
    }));
    let ran = match appending {
        Err(panic) => Err(panic),
        Ok(Appending::Done(ended)) => Ok(ended),
        Ok(Appending::Appended(appended)) => {
            let raised = raises.raise(partition, appended.mark).await;
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                writer.finish_group(appended, raised, &SystemClock)
            }))
        }
    };
    (writer, ran)
}
