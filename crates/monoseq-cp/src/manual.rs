//! [`ManualPartition`] (feature `simulation`): one partition driven by hand, for deterministic
//! simulations of whole clusters. It drives the same [`Lifecycle`] the partition task drives
//! (start, groups, heal, read-back, stop) around the same writer, in simulated time: the
//! caller steps the sequencer's background worker, submits commands, and advances the
//! partition at each tick; a wait (for the actualization, or a backoff) ends when the
//! simulated time reaches it. No tokio runtime, no thread, no clock read but its origin.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use monoseq_core::{Params, Sequencer, Status, Step, Worker};
use monoseq_kv::KvStore;
use monoseq_store::{EventStore, Mark, PartitionId};
use tokio::sync::oneshot;

use crate::command::{Command, KindName, NewRecord};
use crate::error::{CommandError, ConfigError, StepError};
use crate::idempotency::IdempotencyKey;
use crate::lifecycle::{Action, Actualization, End, GroupOutcome, Input, Lifecycle};
use crate::outcome::{Counters, Outcome};
use crate::partition::actualization;
use crate::processor::{Config, prepare, sequencer_params};
use crate::writer::{Clock, Job, Storage, Writer, WriterTemplate, next_group, read_keys};

/// The idempotency key of a simulated client's operation `op` on workspace `ws`: one key
/// per operation, the same on every retry of it.
#[must_use]
pub fn operation_key(ws: u64, op: u64) -> String {
    format!("k{ws}-{op}")
}

/// The command of a simulated client's operation `op` on workspace `ws`: one created record,
/// so that a read-back checks its ID too.
#[must_use]
pub fn operation_command(ws: u64, op: u64) -> Command {
    Command {
        ws,
        ws_kind: 1,
        command: format!("sim.Op{op}"),
        create: vec![NewRecord {
            raw_id: 1,
            kind: KindName::CDoc,
            name: "sim.Doc".to_owned(),
            fields: Default::default(),
        }],
        update: Vec::new(),
        argument: None,
        expected_wlog_offset: None,
    }
}

/// Most steps of the lifecycle one [`ManualPartition::advance`] performs (it stops earlier
/// at a wait, or after one group).
const STEPS_PER_ADVANCE_MAX: usize = 64;

/// A command's answer, by the tag it was submitted with.
pub type Answer = (u64, Result<Outcome, CommandError>);

/// Simulated time: an origin taken once, and the simulated milliseconds since.
struct SimClock {
    origin: Instant,
    ms: u64,
}

impl Clock for SimClock {
    fn now(&self) -> Instant {
        self.origin + Duration::from_millis(self.ms)
    }

    fn unix_ms(&self) -> u64 {
        self.ms
    }
}

/// One partition's lifecycle, writer and sequencer worker, driven by the caller.
pub struct ManualPartition<S: KvStore + Clone> {
    writer: Writer<S>,
    worker: Worker<Storage<S>>,
    config: Config,
    params: Params,
    storage: Storage<S>,
    lifecycle: Lifecycle,
    /// Submitted commands no group took yet.
    queue: VecDeque<Job>,
    /// Innocent commands of a failed group, run first by the next group.
    retry: Vec<Job>,
    /// Every submitted command not answered yet, in submission order: its tag and answer.
    pending: Vec<(u64, oneshot::Receiver<Result<Outcome, CommandError>>)>,
    /// Commands refused before they were queued.
    refused: Vec<Answer>,
    /// Since when (simulated ms) the current wait runs.
    since: Option<u64>,
    /// The origin of the simulated monotonic clock.
    origin: Instant,
}

impl<S: KvStore + Clone> std::fmt::Debug for ManualPartition<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ManualPartition")
            .field("partition", &self.writer.partition.0)
            .field("lifecycle", &self.lifecycle)
            .finish_non_exhaustive()
    }
}

impl<S: KvStore + Clone + Send + Sync + 'static> ManualPartition<S> {
    /// Partition `partition` of `store`, starting: its sequencer due to actualize (step the
    /// worker), its lifecycle at the start. `acked` is what this process acknowledged of the
    /// partition before (its memory across rebuilds; a new process starts from the default).
    ///
    /// # Errors
    ///
    /// When the configuration gives no valid sequencer parameters.
    pub fn open(
        store: EventStore<S>,
        config: &Config,
        partition: u32,
        acked: Mark,
    ) -> Result<ManualPartition<S>, ConfigError> {
        let retired = config
            .retired
            .get(partition as usize)
            .copied()
            .unwrap_or_default();
        let params = sequencer_params(config, &retired)?;
        let storage = Arc::new(store.seq_storage(PartitionId(partition)));
        let (seq, worker) = Sequencer::new_manual(params.clone(), Arc::clone(&storage));
        let template = WriterTemplate {
            partition: PartitionId(partition),
            store,
            marks: None,
            mark: acked,
            counters: Arc::new(Counters::default()),
            acked: Arc::new(crate::acked::Acked::new(acked)),
            floor: retired.plog,
            recent_bytes: config.recent_bytes_per_partition(),
        };
        let writer = template.writer_at(seq, config.idempotency_window_events, acked);
        Ok(ManualPartition {
            writer,
            worker,
            config: config.clone(),
            params,
            storage,
            lifecycle: Lifecycle::new(partition),
            queue: VecDeque::new(),
            retry: Vec::new(),
            pending: Vec::new(),
            refused: Vec::new(),
            since: None,
            origin: Instant::now(),
        })
    }

    /// Raises what the writer knows was acknowledged (marks learned from other nodes before it
    /// serves, as a node pulls them when it takes a partition over).
    pub fn raise_mark(&mut self, mark: Mark) {
        self.writer.mark = self.writer.mark.max(&mark);
        self.writer.acked.raise(mark);
    }

    /// Runs one step of the sequencer's background work (actualization, flushing).
    pub fn step(&mut self) -> Step {
        self.worker.step()
    }

    /// The sequencer's status.
    #[must_use]
    pub fn status(&self) -> Status {
        self.writer.seq.status()
    }

    /// The highest numbers this writer acknowledged (or was opened with).
    #[must_use]
    pub fn acked(&self) -> Mark {
        self.writer.acked.get()
    }

    /// Still starting: not yet checked against its mark.
    #[must_use]
    pub fn starting(&self) -> bool {
        self.lifecycle.starting()
    }

    /// Serving, and its sequencer ready for a command now.
    #[must_use]
    pub fn ready(&self) -> bool {
        self.lifecycle.serving() && self.status() == Status::Ready
    }

    /// Serving with nothing queued: a handoff may end now.
    #[must_use]
    pub fn idle(&self) -> bool {
        self.lifecycle.serving() && self.queue.is_empty() && self.retry.is_empty()
    }

    /// Why it stopped serving, once it did.
    #[must_use]
    pub fn ended(&self) -> Option<&End> {
        self.lifecycle.ended()
    }

    /// Queues a command, answered by a later [`advance`](Self::advance) under `tag`, at
    /// simulated time `now_ms`.
    pub fn submit(&mut self, tag: u64, cmd: Command, key: Option<IdempotencyKey>, now_ms: u64) {
        match prepare(&self.config, &self.writer.store, cmd, key) {
            Ok((mut job, answer)) => {
                job.queued_at = self.clock(now_ms).now();
                self.queue.push_back(job);
                self.pending.push((tag, answer));
            }
            Err(e) => self.refused.push((tag, Err(e))),
        }
    }

    /// Answers every command not answered yet with `error` (a handoff, a stop); their answers.
    pub fn refuse_all(&mut self, error: &CommandError) -> Vec<Answer> {
        self.refuse_waiting(error);
        self.answers()
    }

    /// Answers the queued and the retried commands with `error`.
    fn refuse_waiting(&mut self, error: &CommandError) {
        for job in self.queue.drain(..).chain(self.retry.drain(..)) {
            let _ = job.reply.send(Err(error.clone()));
        }
    }

    /// Performs the lifecycle's steps at simulated time `now_ms` until one waits for time to
    /// pass (an actualization, a backoff, an empty queue) or a group ran; the answers given.
    pub fn advance(&mut self, now_ms: u64) -> Vec<Answer> {
        let mut ran = false;
        for _ in 0..STEPS_PER_ADVANCE_MAX {
            let action = self.lifecycle.action();
            let input = match action {
                Action::RunGroup if ran || (self.queue.is_empty() && self.retry.is_empty()) => {
                    break;
                }
                Action::RunGroup => {
                    ran = true;
                    Input::Ran(self.run_group(now_ms))
                }
                Action::Stop(end) => {
                    let partition = self.writer.partition.0;
                    self.refuse_waiting(&end.refusal(partition));
                    break;
                }
                action => match self.perform(action, now_ms) {
                    Some(input) => input,
                    None => break,
                },
            };
            self.lifecycle.feed(input);
        }
        self.answers()
    }

    /// Performs a step of the start or of a recovery; `None` while it waits for time to pass.
    fn perform(&mut self, action: Action, now_ms: u64) -> Option<Input> {
        Some(match action {
            Action::WaitActualized { wait } => {
                let stats = self.writer.seq.handle().stats();
                match actualization(self.status(), &stats) {
                    Actualization::Pending { .. } if !self.waited(now_ms, wait) => return None,
                    a => {
                        self.since = None;
                        Input::Actualized(a)
                    }
                }
            }
            Action::AnswerQueued(e) => {
                self.refuse_queued(&e);
                Input::Answered { open: true }
            }
            Action::CheckWhole => Input::Checked(self.writer.whole()),
            Action::CoverTail { .. } => Input::Covered(self.writer.cover_stored_tail()),
            Action::Pause { delay, refuse } => {
                if let Some(e) = refuse {
                    self.refuse_queued(&e);
                }
                if !self.waited(now_ms, delay) {
                    return None;
                }
                self.since = None;
                Input::Done
            }
            Action::RebuildWindow { .. } => {
                let from = self.writer.window.start(self.next_offset());
                Input::WindowRebuilt(self.learn(from))
            }
            Action::ReadBack { from, .. } => Input::ReadBack(self.learn(from)),
            Action::Heal { reason, delay, .. } => {
                self.refuse_queued(&CommandError::Unavailable {
                    partition: self.writer.partition.0,
                    reason,
                });
                if !self.waited(now_ms, delay) {
                    return None;
                }
                self.since = None;
                self.replace_sequencer();
                Input::Replaced { writer_lost: false }
            }
            Action::Healed { .. } => Input::Done,
            Action::RunGroup | Action::Stop(_) => return None,
        })
    }

    /// Whether `wait` passed since the current wait began (now, if none ran).
    fn waited(&mut self, now_ms: u64, wait: Duration) -> bool {
        let since = *self.since.get_or_insert(now_ms);
        let wait_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX);
        now_ms >= since.saturating_add(wait_ms)
    }

    fn clock(&self, now_ms: u64) -> SimClock {
        SimClock {
            origin: self.origin,
            ms: now_ms,
        }
    }

    /// Runs one group (the retried commands first, then what the queue holds), as the
    /// partition task does; how it ended.
    fn run_group(&mut self, now_ms: u64) -> GroupOutcome {
        let queue = &mut self.queue;
        let jobs = next_group(
            &mut self.retry,
            None,
            self.config.group_commands_max,
            || queue.pop_front(),
        );
        let clock = self.clock(now_ms);
        let (outcome, retry) = self.writer.run_group(jobs, &clock);
        self.retry = retry;
        outcome
    }

    /// A new sequencer on the same storage (its claim fences the old one's writes off), as a
    /// heal makes; the writer and its window stay.
    fn replace_sequencer(&mut self) {
        let (seq, worker) = Sequencer::new_manual(self.params.clone(), Arc::clone(&self.storage));
        self.writer.seq = seq;
        self.worker = worker;
        self.writer.reported = (0, 0);
    }

    /// Answers the queued commands (not the retried ones) with `error`.
    fn refuse_queued(&mut self, error: &CommandError) {
        for job in self.queue.drain(..) {
            let _ = job.reply.send(Err(error.clone()));
        }
    }

    /// The answers given since the last call, refusals at submission first.
    fn answers(&mut self) -> Vec<Answer> {
        let mut out = std::mem::take(&mut self.refused);
        self.pending
            .retain_mut(|(tag, answer)| match answer.try_recv() {
                Ok(result) => {
                    out.push((*tag, result));
                    false
                }
                Err(oneshot::error::TryRecvError::Empty) => true,
                Err(oneshot::error::TryRecvError::Closed) => {
                    out.push((*tag, Err(CommandError::ShuttingDown)));
                    false
                }
            });
        out
    }

    /// The PLog offset the next event gets, as the sequencer knows it.
    fn next_offset(&self) -> u64 {
        self.writer.seq.handle().stats().next_offset
    }

    fn learn(&mut self, from: u64) -> Result<(), StepError> {
        let to = self.next_offset();
        let (keys, read) = read_keys(
            &self.writer.store,
            self.writer.partition,
            self.writer.floor,
            from,
            to,
        );
        self.writer.remember(keys);
        read
    }
}
