//! The command processor: routes each command to its partition (`workspace ID mod partitions`),
//! where one task per partition — the partition's single writer (`partition.rs`) — sequences
//! and writes groups of queued commands (group commit) and only then tells the clients.
//! Partitions are tasks on the shared runtime, so a process hosts thousands of them without a
//! thread each; up to [`Config::partition_threads_max`] (256 by default) run on a thread of
//! their own instead, woken by the commands they queue. With high-water marks (a data
//! directory) they share [`Config::writer_threads`] writer threads instead (`threads.rs`),
//! whose groups wait for one raise of their marks together. A command is checked
//! in full (validity, sizes, encodability) before it is queued, so a bad command never costs
//! its partition an actualization.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use monoseq_core::{PoisonReason, Runtime, Sequencer, SequencerStats, Status, WsId, WsKind};
use monoseq_kv::KvStore;
use monoseq_store::{
    AppId, Event, EventStore, Mark, Marks, PartitionId, TrustLevel, built_in_params_above,
};
use serde::Serialize;
use tokio::sync::{mpsc, oneshot};

use crate::acked::Acked;
use crate::command::{Command, Draft, draft, plan};
use crate::error::{CommandError, ConfigError, too_large};
use crate::idempotency::{IDEMPOTENCY_WINDOW_EVENTS_DEFAULT, IdempotencyKey};
use crate::outcome::{Counters, Outcome};
use crate::partition::{PartitionShared, PartitionState, PartitionTask};
use crate::recent::RECENT_RECORDS_BYTES_DEFAULT;
use crate::table::{Held, Partitions};
use crate::threads::{SyncStore, Task, WriterThreads};
use crate::writer::{Job, WriterTemplate};

/// Most partitions one processor hosts.
pub const PARTITIONS_MAX: u32 = 65_536;
/// Default commands written in one group commit.
pub const GROUP_COMMANDS_MAX_DEFAULT: usize = 256;
/// Default commands queued per partition before submissions are answered busy.
pub const QUEUE_COMMANDS_MAX_DEFAULT: usize = 4_096;
/// Default limit of unflushed sequence values per partition. Larger than the sequencer's own
/// default (the reference design's 500, docs/invariants.md) because a group's pending numbers count
/// against it: a full group of 256 commands with a WLog offset and a few record IDs each must fit.
pub const BACKLOG_VALUES_MAX_DEFAULT: usize = 8_192;
/// Default longest wait of a partition's sequencer flusher to gather numbers (the sequencer's
/// batcher delay; the backlog bound hurries it under load). Longer than the sequencer's own default
/// (the reference design's 5 ms): a busy workspace's numbers are then written once per flush rather
/// than once per few commands. A flush rewrites one row per workspace it touched: 5 → 50 ms saved a
/// tenth of the CPU per command, 50 → 500 ms another tenth in-process and a quarter of PostgreSQL's
/// CPU per command (docs/benchmarks/flush-delay.md). A restart replays at most this much more of
/// the PLog (at a million events a second); the numbers never depend on it.
pub const FLUSH_DELAY_DEFAULT: Duration = Duration::from_millis(500);
/// Default number of partitions that run on a thread of their own (see
/// [`Config::partition_threads_max`]). In-process it gave 1.11× the commands/s at 64 clients,
/// over HTTP 0.76–0.85× the server CPU per command (docs/benchmarks/http.md).
pub const PARTITION_THREADS_MAX_DEFAULT: usize = 256;
/// The writer threads partitions share by default ([`Config::writer_threads`]): half this
/// machine's cores (at least one), the other half left to the runtime that takes the
/// commands. Over HTTP at 8 partitions on two cores, one thread cost 0.82× the server CPU per
/// command of a thread per partition, two threads 0.89× (docs/benchmarks/http.md).
#[must_use]
pub fn writer_threads_default() -> usize {
    std::thread::available_parallelism().map_or(1, |n| (n.get() / 2).max(1))
}
/// Suggested client back-off when the answer is busy.
pub const RETRY_AFTER_SECS: u64 = 1;

/// Configuration of a command processor.
#[derive(Debug, Clone)]
pub struct Config {
    /// The application whose partitions this processor runs.
    pub app: AppId,
    /// Number of partitions; a command goes to partition `ws % partitions`.
    pub partitions: u32,
    /// How events and records are written.
    pub trust: TrustLevel,
    /// Workspace kinds the application has (each gets the built-in sequences).
    pub ws_kinds: Vec<WsKind>,
    /// Most commands per group commit.
    pub group_commands_max: usize,
    /// Most commands queued per partition.
    pub queue_commands_max: usize,
    /// Sequencer parameters (limits; the kinds are set from `ws_kinds`).
    pub backlog_values_max: usize,
    /// Workspaces cached per partition.
    pub cache_workspaces_max: usize,
    /// Longest wait of a partition's flusher to gather sequence numbers.
    pub flush_delay: Duration,
    /// High-water marks raised, durably, after each group's sync and before its answer
    /// (`None`: not kept, as for stores without a data directory).
    pub marks: Option<Arc<Marks>>,
    /// Per partition, numbers retired by accepted losses: sequences continue above them.
    /// Missing entries retire nothing.
    pub retired: Vec<Mark>,
    /// Keys of a partition's last this many events are remembered for retries.
    pub idempotency_window_events: u64,
    /// Partitions of this process that run on a thread of their own, where the commands they
    /// queue wake them and each group runs in place; the partitions acquired beyond it run as
    /// tasks on the runtime, each group handed to its blocking pool.
    pub partition_threads_max: usize,
    /// With high-water marks, the partitions share this many writer threads (0: each runs
    /// on a thread of its own as without marks): the groups of one thread's partitions wait
    /// for one raise of their marks together.
    pub writer_threads: usize,
    /// Bytes of lately written records kept, all partitions together (each gets its share):
    /// an update of one of them is not read from the store again.
    pub recent_records_bytes: usize,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            app: AppId(1),
            partitions: 8,
            trust: TrustLevel::Level0,
            ws_kinds: vec![WsKind(1)],
            group_commands_max: GROUP_COMMANDS_MAX_DEFAULT,
            queue_commands_max: QUEUE_COMMANDS_MAX_DEFAULT,
            backlog_values_max: BACKLOG_VALUES_MAX_DEFAULT,
            cache_workspaces_max: monoseq_core::CACHE_WORKSPACES_MAX_DEFAULT,
            flush_delay: FLUSH_DELAY_DEFAULT,
            marks: None,
            retired: Vec::new(),
            idempotency_window_events: IDEMPOTENCY_WINDOW_EVENTS_DEFAULT,
            partition_threads_max: PARTITION_THREADS_MAX_DEFAULT,
            writer_threads: writer_threads_default(),
            recent_records_bytes: RECENT_RECORDS_BYTES_DEFAULT,
        }
    }
}

impl Config {
    /// The bytes of lately written records one partition's writer keeps: its share of
    /// [`Config::recent_records_bytes`].
    pub(crate) fn recent_bytes_per_partition(&self) -> usize {
        self.recent_records_bytes / self.partitions.max(1) as usize
    }
}

/// A point-in-time reading of the processor, for metrics and readiness.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct ProcessorStats {
    /// Commands committed.
    pub committed: u64,
    /// Retries answered from their original event.
    pub replayed: u64,
    /// Partitions rebuilt after a failure, all time.
    pub rebuilds: u64,
    /// Partitions not serving now (starting or being rebuilt).
    pub unavailable_partitions: u64,
    /// Commands answered busy.
    pub busy: u64,
    /// Commands that failed otherwise.
    pub failed: u64,
    /// Group commits written.
    pub groups: u64,
    /// Partitions actualizing now.
    pub actualizing_partitions: u64,
    /// Unflushed sequence values, all partitions.
    pub backlog_values: u64,
    /// Events replayed by actualizations, all partitions.
    pub replayed_events: u64,
    /// Completed actualizations, all partitions.
    pub actualizations: u64,
    /// Cache hits and misses of `start`, all partitions.
    pub cache_hits: u64,
    /// See `cache_hits`.
    pub cache_misses: u64,
    /// Storage failing on some partition.
    pub storage_failing: bool,
}

/// A command of a batch ([`CommandProcessor::submit_all`]): answered already (refused before
/// it was queued), or waiting for its partition's answer.
enum Answer {
    Done(Result<Outcome, CommandError>),
    Waiting(oneshot::Receiver<Result<Outcome, CommandError>>),
}

/// A partition this processor serves now.
struct Partition<S: KvStore + Clone> {
    queue: mpsc::Sender<Job>,
    shared: Arc<PartitionShared<S>>,
    /// Resolves when the partition's task has ended (its sender is dropped then).
    task: oneshot::Receiver<()>,
}

impl<S: KvStore + Clone> Held for Partition<S> {
    fn fenced(&self) -> bool {
        self.shared.is_fenced()
    }
}

/// Runs commands against an event store. Cheap to clone; every clone submits to the same
/// partitions.
pub struct CommandProcessor<S: KvStore + Clone> {
    inner: Arc<Inner<S>>,
}

impl<S: KvStore + Clone> Clone for CommandProcessor<S> {
    fn clone(&self) -> Self {
        CommandProcessor {
            inner: Arc::clone(&self.inner),
        }
    }
}

struct Inner<S: KvStore + Clone> {
    config: Config,
    store: EventStore<S>,
    /// The partitions this processor holds: its task's queue and shared state each.
    partitions: Partitions<Partition<S>>,
    runtime: Runtime,
    counters: Arc<Counters>,
    /// Per partition, the highest numbers acknowledged by this process, kept while the
    /// partition is released: acquired again, it refuses to serve a storage that lost them.
    acked: Vec<Arc<Acked>>,
    /// Partitions running on a thread of their own now.
    threads: Arc<AtomicUsize>,
    /// The writer threads the partitions share ([`Config::writer_threads`]).
    writer_threads: Option<WriterThreads>,
}

impl<S: KvStore + Clone + Send + Sync + 'static> CommandProcessor<S> {
    /// Starts one task (and one sequencer) per partition, on the current tokio runtime (on a
    /// thread of its own for the first [`Config::partition_threads_max`]). Each
    /// sequencer starts actualizing at once; commands to a partition are answered busy until
    /// its actualization ends.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] for an out-of-range partition count, a zero group size or queue depth,
    /// or sequencer parameters the sequencer refuses.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime.
    pub fn start(store: EventStore<S>, config: Config) -> Result<CommandProcessor<S>, ConfigError> {
        let cp = CommandProcessor::start_unowned(store.clone(), config)?;
        for p in 0..cp.inner.config.partitions {
            cp.acquire(p, store.clone())?;
        }
        Ok(cp)
    }

    /// A processor that serves no partition yet: each starts when [`acquire`](Self::acquire)d
    /// (with the store view its writes go through, fenced by the partition's lease when
    /// several nodes share the storage) and stops when released; a command for a partition
    /// not served here answers [`CommandError::NotOwner`].
    ///
    /// # Errors
    ///
    /// As [`start`](Self::start).
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime.
    pub fn start_unowned(
        store: EventStore<S>,
        config: Config,
    ) -> Result<CommandProcessor<S>, ConfigError> {
        if config.partitions == 0 || config.partitions > PARTITIONS_MAX {
            return Err(ConfigError::Partitions(config.partitions));
        }
        if config.group_commands_max == 0 {
            return Err(ConfigError::Zero("group_commands_max"));
        }
        if config.queue_commands_max == 0 {
            return Err(ConfigError::Zero("queue_commands_max"));
        }
        if config.idempotency_window_events == 0 {
            return Err(ConfigError::Zero("idempotency_window_events"));
        }
        // The parameters are checked once here, so that acquiring a partition later cannot
        // fail on them.
        sequencer_params(&config, &Mark::default())?;
        let runtime = Runtime::from_handle(tokio::runtime::Handle::current());
        let partitions = Partitions::new(config.partitions);
        let acked = (0..config.partitions).map(|_| Arc::default()).collect();
        let writer_threads = match (&config.marks, config.writer_threads) {
            (Some(marks), n) if n > 0 => {
                let synced = store.clone();
                let sync: SyncStore = Arc::new(move || synced.sync());
                Some(WriterThreads::new(
                    n,
                    config.partitions,
                    Arc::clone(marks),
                    sync,
                ))
            }
            _ => None,
        };
        Ok(CommandProcessor {
            inner: Arc::new(Inner {
                config,
                store,
                partitions,
                runtime,
                counters: Arc::new(Counters::default()),
                acked,
                threads: Arc::default(),
                writer_threads,
            }),
        })
    }

    /// Starts serving partition `p` with its writes going through `store` (a view of the
    /// processor's store: fenced by the partition's lease when nodes share the storage). Its
    /// sequencer actualizes from the PLog first; commands answer busy until it is done. A
    /// partition served already is left as it is.
    ///
    /// # Errors
    ///
    /// [`ConfigError::Partitions`] for a partition the processor does not have; as
    /// [`start`](Self::start) otherwise.
    pub fn acquire(&self, p: u32, store: EventStore<S>) -> Result<(), ConfigError> {
        let inner = &self.inner;
        let acked = inner
            .acked
            .get(p as usize)
            .ok_or(ConfigError::Partitions(p))?;
        inner.partitions.acquire(p, || {
            let context = (&inner.runtime, &inner.counters, acked);
            let (task, shared) = start_partition(&store, &inner.config, p, context)?;
            let (queue, rx) = mpsc::channel(inner.config.queue_commands_max);
            let task = self.run_partition(p, task, rx)?;
            Ok(Partition {
                queue,
                shared,
                task,
            })
        })?;
        Ok(())
    }

    /// Runs partition `p`'s task on a thread of its own while fewer than
    /// [`Config::partition_threads_max`] do, else (or when the system refuses the thread) on
    /// the runtime; the receiver resolves when it has ended.
    fn run_partition(
        &self,
        p: u32,
        mut task: PartitionTask<S>,
        rx: mpsc::Receiver<Job>,
    ) -> Result<oneshot::Receiver<()>, ConfigError> {
        let (ended, task_ended) = oneshot::channel::<()>();
        if let Some(shared) = &self.inner.writer_threads {
            match shared.place(p, &tokio::runtime::Handle::current()) {
                Ok((raises, thread)) => {
                    task.own_thread = true;
                    task.raises = Some(raises);
                    let run: Task = Box::pin(async move {
                        let _ended = ended;
                        task.run(rx).await;
                    });
                    // The thread outlives every task sent to it (a task's panic ends that task
                    // alone), and `place` starts it again if it is gone: only a thread that
                    // ended in between refuses the task, which then never starts.
                    if thread.send(run).is_err() {
                        tracing::error!(
                            partition = p,
                            "the partition's writer thread ended as the partition started; \
                             it does not serve here: release and acquire it again, or restart"
                        );
                    }
                    return Ok(task_ended);
                }
                Err(error) => tracing::warn!(
                    partition = p,
                    "the system refused a writer thread ({error}); the partition runs on a \
                     thread of its own or on the runtime instead"
                ),
            }
        }
        let threads = Arc::clone(&self.inner.threads);
        let (mut task, rx, ended) =
            if threads.fetch_add(1, Ordering::AcqRel) >= self.inner.config.partition_threads_max {
                threads.fetch_sub(1, Ordering::AcqRel);
                (task, rx, ended)
            } else {
                task.own_thread = true;
                // The slot gives the thread back when the thread ends, or here if it never
                // starts.
                let payload = (task, rx, ended, ThreadSlot(threads));
                let runtime = tokio::runtime::Handle::current();
                let builder = std::thread::Builder::new().name(format!("monoseq-p{p}"));
                let refused = spawn_or_return(builder, payload, move |(task, rx, ended, slot)| {
                    let _ended = ended;
                    let _slot = slot;
                    runtime.block_on(task.run(rx));
                });
                let Err(((task, rx, ended, _slot), error)) = refused else {
                    return Ok(task_ended);
                };
                tracing::warn!(
                    partition = p,
                    "the system refused the partition a thread of its own ({error}); it runs on \
                     the runtime instead (raise the thread limit, ulimit -u, or lower \
                     --partition-threads-max)"
                );
                (task, rx, ended)
            };
        task.own_thread = false;
        tokio::spawn(async move {
            let _ended = ended;
            task.run(rx).await;
        });
        Ok(task_ended)
    }

    /// Stops serving partition `p`: new commands for it answer [`CommandError::NotOwner`] at
    /// once, queued ones are finished (or refused by the storage's fence if another node took
    /// the partition over), and its sequencer flushes its numbers. Answers whether it stopped
    /// within `timeout` (after which its storage writes may still be in flight: only a fence
    /// keeps them from landing).
    pub async fn release(&self, p: u32, timeout: Duration) -> bool {
        let partition = self.inner.partitions.release(p);
        let Some(partition) = partition else {
            return true;
        };
        let Partition { queue, task, .. } = partition;
        drop(queue);
        tokio::time::timeout(timeout, task).await.is_ok()
    }

    /// Whether this processor serves partition `p` now (acquired and not fenced off).
    #[must_use]
    pub fn serves(&self, p: u32) -> bool {
        self.inner.partitions.serves(p)
    }

    /// The partitions this processor serves now, in order.
    #[must_use]
    pub fn owned(&self) -> Vec<u32> {
        self.served().map(|(p, _)| p).collect()
    }

    /// The partitions whose storage refused a write because another node took them over:
    /// they answer [`CommandError::NotOwner`] and wait to be released.
    #[must_use]
    pub fn fenced(&self) -> Vec<u32> {
        self.inner.partitions.fenced()
    }

    /// Each served partition's number and shared state.
    fn served(&self) -> impl Iterator<Item = (u32, Arc<PartitionShared<S>>)> + '_ {
        self.inner
            .partitions
            .each(|p, part| (p, Arc::clone(&part.shared)))
            .into_iter()
    }

    /// The partition that runs commands of workspace `ws`: `ws mod partitions`.
    #[must_use]
    pub fn partition_of(&self, ws: WsId) -> u32 {
        ws.partition(self.inner.config.partitions)
    }

    /// The end of partition `p`'s PLog as this process knows it: the offset the next
    /// acknowledged event gets. Every offset below it is durable and final (its event was
    /// synced and its mark raised before its command was answered), so a reader may deliver
    /// it; one at or above it may still be taken back by a crash. While another node owns
    /// the partition this is what this process last knew (a lower bound).
    ///
    /// # Panics
    ///
    /// When `p` is not below the partition count.
    #[must_use]
    pub fn plog_end(&self, p: u32) -> u64 {
        self.inner.acked[p as usize].end()
    }

    /// A receiver that wakes whenever [`CommandProcessor::plog_end`] of partition `p` moves:
    /// the partition's writer signals it after each durable group, so followers learn of new
    /// events from the write path, without polling the store.
    ///
    /// # Panics
    ///
    /// When `p` is not below the partition count.
    #[must_use]
    pub fn watch_plog_end(&self, p: u32) -> tokio::sync::watch::Receiver<u64> {
        self.inner.acked[p as usize].subscribe()
    }

    /// Keeps partition `p`'s newly acknowledged events in memory for its followers here
    /// (`true`, while any follows it), so that [`CommandProcessor::recent_plog`] hands them
    /// over without a read of the store; `false` stops and forgets them.
    ///
    /// # Panics
    ///
    /// When `p` is not below the partition count.
    pub fn follow_plog(&self, p: u32, followed: bool) {
        self.inner.acked[p as usize].set_followed(followed);
    }

    /// The events of partition `p` from PLog offset `from` below `until` (and below
    /// [`CommandProcessor::plog_end`]) as its writer kept them for followers, as whole groups
    /// in PLog order with no offset missing (the first and last may hold events outside the
    /// range); `None` when they are not all kept (read the store then).
    ///
    /// # Panics
    ///
    /// When `p` is not below the partition count.
    #[must_use]
    pub fn recent_plog(&self, p: u32, from: u64, until: u64) -> Option<Vec<Arc<[Event]>>> {
        self.inner.acked[p as usize].kept(from, until)
    }

    /// The event store.
    #[must_use]
    pub fn store(&self) -> &EventStore<S> {
        &self.inner.store
    }

    /// The configuration.
    #[must_use]
    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// Runs a command: validates it, queues it on its partition, and answers once its event is
    /// durable (or with why not).
    ///
    /// # Errors
    ///
    /// [`CommandError`]; its `class` and `code` say how to answer a client.
    pub async fn submit(&self, cmd: Command) -> Result<Outcome, CommandError> {
        self.submit_keyed(cmd, None).await
    }

    /// Like [`submit`](Self::submit), with an idempotency key: a retry with the same key and
    /// the same command gets the original answer (with [`Outcome::replayed`]) and writes
    /// nothing, within the window of the partition's last
    /// [`Config::idempotency_window_events`] events, also across restarts; the same key with
    /// another command is refused.
    ///
    /// # Errors
    ///
    /// As [`submit`](Self::submit), and [`CommandError::KeyReused`].
    pub async fn submit_keyed(
        &self,
        cmd: Command,
        key: Option<IdempotencyKey>,
    ) -> Result<Outcome, CommandError> {
        let (job, answer) = prepare(&self.inner.config, &self.inner.store, cmd, key)?;
        self.queue(job)?;
        answer.await.unwrap_or(Err(CommandError::ShuttingDown))
    }

    /// Runs several commands (a batch), each as [`submit_keyed`](Self::submit_keyed) would,
    /// and answers each in the order given. Every command is checked and encoded first; then
    /// each partition's share is queued at once, in the batch's order, and its partition's
    /// next group takes all of it (up to [`Config::group_commands_max`]) instead of starting
    /// on the first command while the others are still being encoded and leaving them to the
    /// group after: a batch waits for its slowest partition, so that would cost it a whole
    /// group commit more. A share the partition's queue has no room for is refused whole
    /// ([`CommandError::Busy`]).
    pub async fn submit_all(
        &self,
        cmds: Vec<(Command, Option<IdempotencyKey>)>,
    ) -> Vec<Result<Outcome, CommandError>> {
        let mut answers = Vec::with_capacity(cmds.len());
        let mut shares: BTreeMap<u32, (Vec<usize>, Vec<Job>)> = BTreeMap::new();
        for (i, (cmd, key)) in cmds.into_iter().enumerate() {
            match prepare(&self.inner.config, &self.inner.store, cmd, key) {
                Ok((job, answer)) => {
                    let share = shares.entry(self.partition_of(job.plan.ws)).or_default();
                    share.0.push(i);
                    share.1.push(job);
                    answers.push(Answer::Waiting(answer));
                }
                Err(e) => answers.push(Answer::Done(Err(e))),
            }
        }
        for (partition, (places, jobs)) in shares {
            if let Err(e) = self.queue_share(partition, jobs) {
                for i in places {
                    answers[i] = Answer::Done(Err(e.clone()));
                }
            }
        }
        // The partitions run them all meanwhile: awaited in order, the answers are all in as
        // soon as the slowest is.
        let mut out = Vec::with_capacity(answers.len());
        for answer in answers {
            out.push(match answer {
                Answer::Done(done) => done,
                Answer::Waiting(answer) => answer.await.unwrap_or(Err(CommandError::ShuttingDown)),
            });
        }
        out
    }

    /// Queues a batch's share for `partition` in one go: room for all of it is reserved
    /// first, then each command is queued, marked as followed by the next
    /// ([`Job::more`](crate::writer::Job)) but the last.
    ///
    /// # Errors
    ///
    /// As [`queue`](Self::queue), for the whole share.
    fn queue_share(&self, partition: u32, jobs: Vec<Job>) -> Result<(), CommandError> {
        let count = jobs.len();
        // `Err(true)`: no room; `Err(false)`: the partition's task ended.
        let sent = self.inner.partitions.admit(partition, |p| {
            let permits = p
                .queue
                .try_reserve_many(count)
                .map_err(|e| matches!(e, mpsc::error::TrySendError::Full(())))?;
            for (n, (mut job, permit)) in jobs.into_iter().zip(permits).enumerate() {
                job.more = n + 1 < count;
                permit.send(job);
            }
            Ok(())
        })?;
        self.queued(partition, sent, count, || {
            format!(
                "the partition's queue has no room for the batch's {count} commands for it \
                 (none of them was queued)"
            )
        })
    }

    /// Queues a prepared command on its partition.
    ///
    /// # Errors
    ///
    /// [`CommandError::Busy`] when the partition's queue is full, [`CommandError::NotOwner`]
    /// when this processor does not serve the partition (or its task ended).
    fn queue(&self, job: Job) -> Result<(), CommandError> {
        let partition = self.partition_of(job.plan.ws);
        // `Err(true)`: the queue is full; `Err(false)`: the partition's task ended.
        let sent = self.inner.partitions.admit(partition, |p| {
            p.queue
                .try_send(job)
                .map_err(|e| matches!(e, mpsc::error::TrySendError::Full(_)))
        })?;
        self.queued(partition, sent, 1, || {
            "the partition's queue is full".to_owned()
        })
    }

    /// What queueing `commands` on `partition` came to: `Err(true)` when its queue had no
    /// room (busy, as `busy` says), `Err(false)` when the partition's task ended.
    fn queued(
        &self,
        partition: u32,
        sent: Result<(), bool>,
        commands: usize,
        busy: impl FnOnce() -> String,
    ) -> Result<(), CommandError> {
        match sent {
            Ok(()) => Ok(()),
            Err(true) => {
                let commands = u64::try_from(commands).unwrap_or(u64::MAX);
                self.inner
                    .counters
                    .busy
                    .fetch_add(commands, Ordering::Relaxed);
                Err(CommandError::Busy(busy()))
            }
            Err(false) => Err(CommandError::NotOwner { partition }),
        }
    }

    /// Whether every partition serves and has finished actualizing.
    #[must_use]
    pub fn ready(&self) -> bool {
        self.unready_partitions().is_empty()
    }

    /// Partitions that do not serve now, each with why: starting, actualizing, storage
    /// failing (a fatal failure names its first cause), being rebuilt after a failure, or
    /// refused against their marks.
    #[must_use]
    pub fn unready_partitions(&self) -> Vec<(u32, Unready)> {
        let mut out = Vec::new();
        for (p, shared) in self.served() {
            let st = shared.handle().stats();
            let why = match shared.state() {
                PartitionState::Rebuilding { reason } => Some(Unready::Rebuilding { reason }),
                PartitionState::Stopped => Some(Unready::Stopped),
                PartitionState::Fenced => Some(Unready::Fenced),
                PartitionState::Lost { reason } => Some(Unready::Refused { reason }),
                PartitionState::Failed { reason } => Some(Unready::Failed { reason }),
                PartitionState::Starting => {
                    Some(sequencer_unready(&st).unwrap_or(Unready::Starting))
                }
                _ => sequencer_unready(&st),
            };
            if let Some(why) = why {
                out.push((p, why));
            }
        }
        out
    }

    /// [`unready_partitions`](Self::unready_partitions), each reason as text (what
    /// `/readyz` shows).
    #[must_use]
    pub fn unready(&self) -> Vec<(u32, String)> {
        self.unready_partitions()
            .into_iter()
            .map(|(p, why)| (p, why.to_string()))
            .collect()
    }

    /// Partitions whose storage failed fatally (its engine is poisoned), each with the first
    /// failure and what to do: they write nothing until the server is restarted.
    #[must_use]
    pub fn storage_failures(&self) -> Vec<(u32, String)> {
        self.served()
            .filter_map(|(p, shared)| match shared.state() {
                PartitionState::Failed { reason } => Some((p, reason)),
                _ => None,
            })
            .collect()
    }

    /// The sequencer counters of each partition.
    pub fn partition_stats(&self) -> impl Iterator<Item = SequencerStats> + '_ {
        self.served().map(|(_, s)| s.handle().stats())
    }

    /// Tells `observer` of every group a writer of this processor makes durable from now on
    /// (for latency histograms); a second observer is refused (`false`).
    pub fn observe_groups(&self, observer: Arc<dyn crate::GroupObserver>) -> bool {
        self.inner.counters.group_observer.set(observer).is_ok()
    }

    /// The counters now.
    #[must_use]
    pub fn stats(&self) -> ProcessorStats {
        let c = &self.inner.counters;
        let mut s = ProcessorStats {
            committed: c.committed.load(Ordering::Relaxed),
            replayed: c.replayed.load(Ordering::Relaxed),
            busy: c.busy.load(Ordering::Relaxed),
            failed: c.failed.load(Ordering::Relaxed),
            groups: c.groups.load(Ordering::Relaxed),
            cache_hits: c.cache_hits.load(Ordering::Relaxed),
            cache_misses: c.cache_misses.load(Ordering::Relaxed),
            ..ProcessorStats::default()
        };
        for (_, shared) in self.served() {
            s.rebuilds += shared.rebuilds.load(Ordering::Relaxed);
            if !matches!(shared.state(), PartitionState::Serving) {
                s.unavailable_partitions += 1;
            }
            let st = shared.handle().stats();
            if matches!(st.status, Status::None | Status::Actualizing) {
                s.actualizing_partitions += 1;
            }
            s.backlog_values += st.backlog_values as u64;
            s.replayed_events += st.replayed_events;
            s.actualizations += st.actualizations;
            s.storage_failing |= st.storage_failing;
        }
        s
    }

    /// Stops accepting commands, finishes the queued ones, flushes every sequencer and waits
    /// for the partitions to stop, at most `timeout`. Answers whether all stopped in time.
    pub async fn shutdown(self, timeout: Duration) -> bool {
        let tasks: Vec<_> = self
            .inner
            .partitions
            .release_all()
            .into_iter()
            .map(|p| p.task)
            .collect();
        // Dropping the senders closes each queue; the workers drain it and stop.
        drop(self);
        tokio::time::timeout(timeout, async {
            for t in tasks {
                let _ = t.await;
            }
        })
        .await
        .is_ok()
    }
}

/// Checks a command in full (validity, workspace kind, storability) and makes it a job with the
/// receiver of its answer. The command is encoded here, once: its draft event serves the
/// storable check, the fingerprint and, numbered, the event written.
pub(crate) fn prepare<S: KvStore + Clone>(
    config: &Config,
    store: &EventStore<S>,
    cmd: Command,
    key: Option<IdempotencyKey>,
) -> Result<(Job, oneshot::Receiver<Result<Outcome, CommandError>>), CommandError> {
    let plan = plan(&cmd)?;
    if !config.ws_kinds.contains(&plan.ws_kind) {
        return Err(CommandError::UnknownWsKind(cmd.ws_kind));
    }
    let expected_wlog_offset = cmd.expected_wlog_offset;
    let (draft, fingerprint) = draft(cmd, &plan, key.as_ref());
    check_storable(store, &draft)?;
    let (reply, answer) = oneshot::channel();
    let job = Job {
        draft,
        expected_wlog_offset,
        plan,
        key: key.map(|k| (k, fingerprint)),
        reply,
        queued_at: std::time::Instant::now(),
        more: false,
    };
    Ok((job, answer))
}

/// Refuses, before it takes any number, a command whose event or records would not fit the
/// storage's limits: its draft has the largest possible numbers.
fn check_storable<S: KvStore + Clone>(
    store: &EventStore<S>,
    draft: &Draft,
) -> Result<(), CommandError> {
    store
        .check_storable(&draft.event)
        .map_err(|e| too_large(&e))
}

/// Why a partition does not serve now; its text is what `/readyz` and the logs show.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Unready {
    /// Starting, before its sequencer began actualizing.
    Starting,
    /// Its sequencer actualizes.
    Actualizing,
    /// Its sequencer actualizes, and the storage fails the reads.
    ActualizingStorageFailing,
    /// Stored data its sequencer needs to actualize is damaged.
    Corrupted,
    /// Its sequencer stopped, poisoned by `poison` when known.
    SequencerFailed {
        /// Why the sequencer stopped.
        poison: Option<PoisonReason>,
    },
    /// It serves, but the storage fails its sequencer's flushes.
    FlushFailing,
    /// Its sequencer failed; being rebuilt.
    Rebuilding {
        /// What failed.
        reason: String,
    },
    /// Stopped.
    Stopped,
    /// The storage refused its writes: another node owns it now.
    Fenced,
    /// Refused against its high-water marks: the storage lost events it acknowledged.
    Refused {
        /// What was lost.
        reason: String,
    },
    /// The storage failed fatally; the reason names the first failure and what to do.
    Failed {
        /// The failure, with its causes, and what to do.
        reason: String,
    },
}

impl std::fmt::Display for Unready {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unready::Starting => f.write_str("starting"),
            Unready::Actualizing => f.write_str("actualizing"),
            Unready::ActualizingStorageFailing => f.write_str("actualizing: storage is failing"),
            Unready::Corrupted => {
                f.write_str("corrupted: stored data the partition needs is damaged")
            }
            Unready::SequencerFailed { poison: None } => f.write_str("failed"),
            Unready::SequencerFailed {
                poison: Some(reason),
            } => write!(f, "failed: {reason}"),
            Unready::FlushFailing => {
                f.write_str("storage is failing: sequence numbers cannot be flushed")
            }
            Unready::Rebuilding { reason } => write!(f, "rebuilding: {reason}"),
            Unready::Stopped => f.write_str("stopped"),
            Unready::Fenced => f.write_str("fenced: another node took it over"),
            Unready::Refused { reason } => write!(f, "refused: {reason}"),
            Unready::Failed { reason } => f.write_str(reason),
        }
    }
}

/// Why a partition's sequencer does not serve, if it does not.
fn sequencer_unready(st: &SequencerStats) -> Option<Unready> {
    match st.status {
        Status::None | Status::Actualizing if st.storage_corrupted => Some(Unready::Corrupted),
        Status::None | Status::Actualizing if st.storage_failing => {
            Some(Unready::ActualizingStorageFailing)
        }
        Status::None | Status::Actualizing => Some(Unready::Actualizing),
        Status::Finished => Some(Unready::SequencerFailed { poison: st.poison }),
        _ if st.storage_failing => Some(Unready::FlushFailing),
        _ => None,
    }
}

/// A partition's sequencer parameters: the built-in sequences of every workspace kind,
/// continuing above `retired`, and the configured limits.
pub(crate) fn sequencer_params(
    config: &Config,
    retired: &Mark,
) -> Result<monoseq_core::Params, ConfigError> {
    Ok(
        built_in_params_above(config.ws_kinds.iter().copied(), retired)
            .backlog_values_max(config.backlog_values_max)
            .cache_workspaces_max(config.cache_workspaces_max)
            .batcher_delay(config.flush_delay)
            .build()?,
    )
}

/// Gives a partition's thread back to [`Inner::threads`] when the thread ends.
struct ThreadSlot(Arc<AtomicUsize>);

/// Runs `run(payload)` on a new thread of `builder`. When the system refuses the thread (a
/// limit on threads or memory), `run` never ran and the payload comes back with the reason, so
/// that the caller can run it elsewhere.
fn spawn_or_return<P: Send + 'static>(
    builder: std::thread::Builder,
    payload: P,
    run: impl FnOnce(P) + Send + 'static,
) -> Result<(), (P, std::io::Error)> {
    let ours = Arc::new(Mutex::new(Some(payload)));
    let theirs = Arc::clone(&ours);
    let spawned = builder.spawn(move || {
        let payload = theirs.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(payload) = payload {
            run(payload);
        }
    });
    let Err(error) = spawned else {
        return Ok(());
    };
    // A thread that was not created never ran its closure, so the payload is still here.
    match ours.lock().unwrap_or_else(|e| e.into_inner()).take() {
        Some(payload) => Err((payload, error)),
        None => Ok(()),
    }
}

impl Drop for ThreadSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Builds partition `p`: its sequencer (actualizing from the start), its writer and its task.
fn start_partition<S: KvStore + Clone + Send + Sync + 'static>(
    store: &EventStore<S>,
    config: &Config,
    p: u32,
    (runtime, counters, acked): (&Runtime, &Arc<Counters>, &Arc<Acked>),
) -> Result<(PartitionTask<S>, Arc<PartitionShared<S>>), ConfigError> {
    let retired = config.retired.get(p as usize).copied().unwrap_or_default();
    let params = sequencer_params(config, &retired)?;
    let stored = match &config.marks {
        Some(m) => m
            .get(p)
            .map_err(|e| ConfigError::Marks(monoseq_kv::chain(&e)))?,
        None => Mark::default(),
    };
    let mark = monoseq_store::start_mark(stored, acked.get());
    // Every number at or below a stored mark was acknowledged: readers may see up to it.
    acked.raise(mark);
    // What an earlier writer kept for followers may not continue into this one's groups.
    acked.forget_kept();
    let storage = Arc::new(store.seq_storage(PartitionId(p)));
    // The sequencer's driver logs inside this span: every line names its partition.
    let seq = {
        let _span = tracing::info_span!("partition", partition = p).entered();
        Sequencer::new(params.clone(), Arc::clone(&storage), runtime)
    };
    let shared = Arc::new(PartitionShared {
        handle: Mutex::new(seq.handle()),
        state: Mutex::new(PartitionState::Starting),
        rebuilds: AtomicU64::new(0),
        fenced: AtomicBool::new(false),
    });
    let template = WriterTemplate {
        partition: PartitionId(p),
        store: store.clone(),
        marks: config.marks.clone(),
        mark,
        counters: Arc::clone(counters),
        acked: Arc::clone(acked),
        floor: retired.plog,
        recent_bytes: config.recent_bytes_per_partition(),
    };
    let writer = template.writer_at(seq, config.idempotency_window_events, mark);
    let task = PartitionTask {
        writer: Some(writer),
        storage,
        params,
        runtime: runtime.clone(),
        shared: Arc::clone(&shared),
        group_max: config.group_commands_max,
        window_events: config.idempotency_window_events,
        template,
        own_thread: false,
        raises: None,
    };
    Ok((task, shared))
}

#[cfg(test)]
mod tests {
    use super::{PoisonReason, Unready, spawn_or_return};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, mpsc};

    #[test]
    fn a_refused_thread_hands_its_work_back_unrun() {
        // A stack larger than any address space: the system refuses the thread for real.
        let builder = std::thread::Builder::new().stack_size(usize::MAX / 4);
        let ran = Arc::new(AtomicBool::new(false));
        let theirs = Arc::clone(&ran);
        let refused = spawn_or_return(builder, vec![1, 2, 3], move |_| {
            theirs.store(true, Ordering::SeqCst);
        });
        let Err((payload, error)) = refused else {
            panic!("a thread with a stack of {} bytes started", usize::MAX / 4);
        };
        assert_eq!(payload, vec![1, 2, 3]);
        assert!(!error.to_string().is_empty());
        assert!(!ran.load(Ordering::SeqCst), "the refused thread's work ran");
    }

    #[test]
    fn a_started_thread_runs_its_work_with_the_payload() {
        let (tx, rx) = mpsc::channel();
        let started = spawn_or_return(std::thread::Builder::new(), 7_u32, move |n| {
            tx.send(n * 6).expect("receiver alive");
        });
        assert!(started.is_ok());
        assert_eq!(rx.recv().expect("the thread ran"), 42);
    }

    #[test]
    fn an_unready_partitions_text_is_what_readyz_showed() {
        let texts = [
            (Unready::Starting, "starting"),
            (Unready::Actualizing, "actualizing"),
            (
                Unready::ActualizingStorageFailing,
                "actualizing: storage is failing",
            ),
            (
                Unready::Corrupted,
                "corrupted: stored data the partition needs is damaged",
            ),
            (Unready::SequencerFailed { poison: None }, "failed"),
            (
                Unready::SequencerFailed {
                    poison: Some(PoisonReason::Fenced),
                },
                &format!("failed: {}", PoisonReason::Fenced),
            ),
            (
                Unready::FlushFailing,
                "storage is failing: sequence numbers cannot be flushed",
            ),
            (Unready::Rebuilding { reason: "x".into() }, "rebuilding: x"),
            (Unready::Stopped, "stopped"),
            (Unready::Fenced, "fenced: another node took it over"),
            (
                Unready::Refused {
                    reason: "lost".into(),
                },
                "refused: lost",
            ),
            (
                Unready::Failed {
                    reason: "the storage failed fatally".into(),
                },
                "the storage failed fatally",
            ),
        ];
        for (why, text) in texts {
            assert_eq!(why.to_string(), text, "{why:?}");
        }
    }
}
