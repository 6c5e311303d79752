//! The command processor: routes each command to its partition (`workspace ID mod partitions`),
//! where one task per partition — the partition's single writer — runs the sequencing
//! transactions of a group of queued commands, writes their events in one atomic batch (group
//! commit), and only then tells the clients. Partitions are async tasks on a shared runtime,
//! so a process hosts thousands of them without a thread each.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use monoseq_core::{
    Busy, ParamsError, Runtime, Sequencer, SequencerHandle, SequencerStats, Start, StartError,
    Status, WsId, WsKind,
};
use monoseq_kv::KvStore;
use monoseq_store::{
    AppId, AppendError, Event, EventStore, Mark, Marks, PLogSeqStorage, PartitionId, RecordKind,
    TrustLevel, WLOG_OFFSET_SEQUENCE, WLogOffset, built_in_params_above,
};
use serde::Serialize;
use tokio::sync::{mpsc, oneshot};

use crate::command::{Command, InvalidCommand, Plan, plan, resolve};

/// Most partitions one processor hosts.
pub const PARTITIONS_MAX: u32 = 65_536;
/// Default commands written in one group commit.
pub const GROUP_COMMANDS_MAX_DEFAULT: usize = 256;
/// Default commands queued per partition before submissions are answered busy.
pub const QUEUE_COMMANDS_MAX_DEFAULT: usize = 4_096;
/// How long a partition waits for its sequencer to finish actualizing before retrying the
/// commands of a failed group.
const ACTUALIZE_WAIT: Duration = Duration::from_secs(5);
/// Default limit of unflushed sequence values per partition. Larger than the sequencer's own
/// default (seed 000's 500) because a group's pending numbers count against it: a full group
/// of 256 commands with a WLog offset and a few record IDs each must fit.
pub const BACKLOG_VALUES_MAX_DEFAULT: usize = 8_192;
/// Default longest wait of a partition's sequencer flusher to gather numbers (the sequencer's
/// batcher delay). Longer than the sequencer's own default (seed 000's 5 ms): a busy
/// workspace's numbers are then written once per flush rather than once per few commands,
/// which saved a tenth of the CPU per command at level 0; a restart replays at most this
/// much more of the PLog.
pub const FLUSH_DELAY_DEFAULT: Duration = Duration::from_millis(50);
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
    /// High-water marks raised, durably, beside each group's sync and before its answer
    /// (`None`: not kept, as for stores without a data directory).
    pub marks: Option<Arc<Marks>>,
    /// Per partition, numbers retired by accepted losses: sequences continue above them.
    /// Missing entries retire nothing.
    pub retired: Vec<Mark>,
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
        }
    }
}

/// Why the processor could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The partition count is 0 or above [`PARTITIONS_MAX`].
    #[error("partitions must be between 1 and {PARTITIONS_MAX}, got {0}")]
    Partitions(u32),
    /// A zero group size or queue depth.
    #[error("{0} must be at least 1")]
    Zero(&'static str),
    /// The sequencer refused its parameters.
    #[error("sequencer parameters: {0}")]
    Params(#[from] ParamsError),
    /// The high-water marks do not fit the partitions.
    #[error("high-water marks: {0}")]
    Marks(String),
}

/// The answer to a successful command.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Outcome {
    /// The partition that ran it.
    pub partition: u32,
    /// The event's PLog offset.
    pub plog_offset: u64,
    /// The event's WLog offset.
    pub wlog_offset: u64,
    /// Real IDs of the command's raw IDs.
    pub ids: BTreeMap<u64, u64>,
}

/// Why a command was not done. Nothing of it was written, except where said.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum CommandError {
    /// The command is malformed.
    #[error("{0}")]
    Invalid(#[from] InvalidCommand),
    /// The workspace kind is not one of the application's.
    #[error("unknown workspace kind {0}: the application declares its workspace kinds")]
    UnknownWsKind(u16),
    /// An update names a record that does not exist.
    #[error("record {id} of workspace {ws} does not exist; create it first")]
    UnknownRecord {
        /// The workspace.
        ws: u64,
        /// The record.
        id: u64,
    },
    /// The command is too large for storage.
    #[error("{0}")]
    TooLarge(String),
    /// The partition cannot take commands now (actualizing, backlog full, queue full, or its
    /// group failed because of another command); retry after a short wait.
    #[error("server is busy: {0}; retry later")]
    Busy(String),
    /// A key the command needed already existed (trust levels 0 and 1): the partition
    /// actualized; the key is named.
    #[error("{0}")]
    SequenceViolation(String),
    /// Storage failed; nothing was acknowledged. Retry later.
    #[error("storage unavailable: {0}; retry later")]
    Storage(String),
    /// The processor is shutting down.
    #[error("the server is shutting down")]
    ShuttingDown,
}

impl CommandError {
    /// A stable machine-readable code.
    #[must_use]
    pub fn code(&self) -> &'static str {
        match self {
            CommandError::Invalid(_) => "invalid_command",
            CommandError::UnknownWsKind(_) => "unknown_workspace_kind",
            CommandError::UnknownRecord { .. } => "unknown_record",
            CommandError::TooLarge(_) => "too_large",
            CommandError::Busy(_) => "busy",
            CommandError::SequenceViolation(_) => "sequence_violation",
            CommandError::Storage(_) => "storage_unavailable",
            CommandError::ShuttingDown => "shutting_down",
        }
    }

    /// The HTTP status that fits.
    #[must_use]
    pub fn http_status(&self) -> u16 {
        match self {
            CommandError::Invalid(_) | CommandError::UnknownWsKind(_) => 400,
            CommandError::UnknownRecord { .. } => 404,
            CommandError::SequenceViolation(_) => 409,
            CommandError::TooLarge(_) => 413,
            CommandError::Busy(_) | CommandError::Storage(_) | CommandError::ShuttingDown => 503,
        }
    }
}

struct Job {
    cmd: Command,
    plan: Plan,
    reply: oneshot::Sender<Result<Outcome, CommandError>>,
}

/// Counters of the whole processor.
#[derive(Debug, Default)]
struct Counters {
    committed: AtomicU64,
    busy: AtomicU64,
    failed: AtomicU64,
    groups: AtomicU64,
    cache_hits: AtomicU64,
    cache_misses: AtomicU64,
}

/// A point-in-time reading of the processor, for metrics and readiness.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct ProcessorStats {
    /// Commands committed.
    pub committed: u64,
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

struct Partition<S: KvStore + Clone> {
    queue: mpsc::Sender<Job>,
    handle: SequencerHandle<PLogSeqStorage<S>>,
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
    partitions: Vec<Partition<S>>,
    tasks: std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>,
    counters: Arc<Counters>,
}

impl<S: KvStore + Clone + Send + Sync + 'static> CommandProcessor<S> {
    /// Starts one task (and one sequencer) per partition on the current tokio runtime. Each
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
        if config.partitions == 0 || config.partitions > PARTITIONS_MAX {
            return Err(ConfigError::Partitions(config.partitions));
        }
        if config.group_commands_max == 0 {
            return Err(ConfigError::Zero("group_commands_max"));
        }
        if config.queue_commands_max == 0 {
            return Err(ConfigError::Zero("queue_commands_max"));
        }
        let runtime = Runtime::from_handle(tokio::runtime::Handle::current());
        let counters = Arc::new(Counters::default());
        let mut partitions = Vec::with_capacity(config.partitions as usize);
        let mut tasks = Vec::with_capacity(config.partitions as usize);
        for p in 0..config.partitions {
            let retired = config.retired.get(p as usize).copied().unwrap_or_default();
            let params = built_in_params_above(config.ws_kinds.iter().copied(), &retired)
                .backlog_values_max(config.backlog_values_max)
                .cache_workspaces_max(config.cache_workspaces_max)
                .batcher_delay(config.flush_delay)
                .build()?;
            let mark = match &config.marks {
                Some(m) => m.get(p).map_err(|e| ConfigError::Marks(e.to_string()))?,
                None => Mark::default(),
            };
            let (queue, rx) = mpsc::channel(config.queue_commands_max);
            let seq = Sequencer::new(params.clone(), store.seq_storage(PartitionId(p)), &runtime);
            let handle = seq.handle();
            let worker = PartitionWorker {
                partition: PartitionId(p),
                store: store.clone(),
                seq,
                group_max: config.group_commands_max,
                counters: Arc::clone(&counters),
                reported: (0, 0),
                marks: config.marks.clone(),
                mark,
            };
            tasks.push(tokio::spawn(worker.run(rx)));
            partitions.push(Partition { queue, handle });
        }
        Ok(CommandProcessor {
            inner: Arc::new(Inner {
                config,
                store,
                partitions,
                tasks: std::sync::Mutex::new(tasks),
                counters,
            }),
        })
    }

    /// The partition that runs commands of workspace `ws`: `ws mod partitions`.
    #[must_use]
    pub fn partition_of(&self, ws: WsId) -> u32 {
        (ws.0 % u64::from(self.inner.config.partitions)) as u32
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
    /// [`CommandError`]; its `http_status` and `code` say how to answer a client.
    pub async fn submit(&self, cmd: Command) -> Result<Outcome, CommandError> {
        let plan = plan(&cmd)?;
        if !self.inner.config.ws_kinds.contains(&plan.ws_kind) {
            return Err(CommandError::UnknownWsKind(cmd.ws_kind));
        }
        let p = &self.inner.partitions[self.partition_of(plan.ws) as usize];
        let (reply, answer) = oneshot::channel();
        let job = Job { cmd, plan, reply };
        match p.queue.try_send(job) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(_)) => {
                self.inner.counters.busy.fetch_add(1, Ordering::Relaxed);
                return Err(CommandError::Busy("the partition's queue is full".into()));
            }
            Err(mpsc::error::TrySendError::Closed(_)) => return Err(CommandError::ShuttingDown),
        }
        answer.await.unwrap_or(Err(CommandError::ShuttingDown))
    }

    /// Whether every partition has finished actualizing.
    #[must_use]
    pub fn ready(&self) -> bool {
        self.inner
            .partitions
            .iter()
            .all(|p| !matches!(p.handle.status(), Status::None | Status::Actualizing))
    }

    /// The sequencer counters of each partition.
    pub fn partition_stats(&self) -> impl Iterator<Item = SequencerStats> + '_ {
        self.inner.partitions.iter().map(|p| p.handle.stats())
    }

    /// The counters now.
    #[must_use]
    pub fn stats(&self) -> ProcessorStats {
        let c = &self.inner.counters;
        let mut s = ProcessorStats {
            committed: c.committed.load(Ordering::Relaxed),
            busy: c.busy.load(Ordering::Relaxed),
            failed: c.failed.load(Ordering::Relaxed),
            groups: c.groups.load(Ordering::Relaxed),
            cache_hits: c.cache_hits.load(Ordering::Relaxed),
            cache_misses: c.cache_misses.load(Ordering::Relaxed),
            ..ProcessorStats::default()
        };
        for st in self.partition_stats() {
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
        let tasks =
            std::mem::take(&mut *self.inner.tasks.lock().unwrap_or_else(|e| e.into_inner()));
        // Dropping the last sender closes each queue; the workers drain it and stop.
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

/// The single writer of one partition.
struct PartitionWorker<S: KvStore + Clone> {
    partition: PartitionId,
    store: EventStore<S>,
    seq: Sequencer<PLogSeqStorage<S>>,
    group_max: usize,
    counters: Arc<Counters>,
    /// Cache counters already added to `counters`.
    reported: (u64, u64),
    /// Where the partition's high-water mark is kept, and the mark as last made durable.
    marks: Option<Arc<Marks>>,
    mark: Mark,
}

/// A command that got its numbers and waits for its group's write.
struct Accepted {
    job: Job,
    outcome: Outcome,
}

impl<S: KvStore + Clone + Send + Sync + 'static> PartitionWorker<S> {
    async fn run(mut self, mut rx: mpsc::Receiver<Job>) {
        let mut jobs: Vec<Job> = Vec::with_capacity(self.group_max);
        let mut retry: Vec<Job> = Vec::new();
        loop {
            if retry.is_empty() {
                match rx.recv().await {
                    Some(j) => jobs.push(j),
                    None => break,
                }
            } else {
                jobs.append(&mut retry);
            }
            while jobs.len() < self.group_max {
                match rx.try_recv() {
                    Ok(j) => jobs.push(j),
                    Err(_) => break,
                }
            }
            retry = self.run_group(&mut jobs).await;
            if !retry.is_empty() {
                self.wait_actualized().await;
            }
        }
        for j in retry {
            let _ = j.reply.send(Err(CommandError::ShuttingDown));
        }
        let seq = self.seq;
        let _ = tokio::task::spawn_blocking(move || seq.shutdown()).await;
    }

    async fn wait_actualized(&self) {
        let handle = self.seq.handle();
        let _ = tokio::task::spawn_blocking(move || handle.wait_actualized(ACTUALIZE_WAIT)).await;
    }

    /// Sequences and writes one group; answers every job except those to retry, which it
    /// returns (they were innocent members of a group that failed).
    async fn run_group(&mut self, jobs: &mut Vec<Job>) -> Vec<Job> {
        let mut accepted: Vec<Accepted> = Vec::with_capacity(jobs.len());
        let mut events: Vec<Event> = Vec::with_capacity(jobs.len());
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        for job in jobs.drain(..) {
            match self.sequence(&job, now_ms) {
                Ok((event, outcome)) => {
                    events.push(event);
                    accepted.push(Accepted { job, outcome });
                }
                Err(e) => self.answer(job, Err(e)),
            }
        }
        self.report_cache();
        if accepted.is_empty() {
            return Vec::new();
        }
        let mark = group_mark(self.mark, &events);
        let result = self.write_group(events, mark).await;
        match result {
            Ok(()) => {
                self.mark = mark;
                self.seq.mark_durable();
                self.counters.groups.fetch_add(1, Ordering::Relaxed);
                for a in accepted {
                    self.answer(a.job, Ok(a.outcome));
                }
                Vec::new()
            }
            Err(e) => {
                // Nothing of the group was written (or a storage fault left it unknown): the
                // PLog decides which numbers were used.
                self.seq.actualize();
                let (culprit, error) = blame(&e);
                let mut retry = Vec::new();
                for (i, a) in accepted.into_iter().enumerate() {
                    match (culprit, &error) {
                        (Some(c), Some(err)) if c == i => self.answer(a.job, Err(err.clone())),
                        (Some(_), _) => retry.push(a.job),
                        (None, _) => self.answer(a.job, Err(CommandError::Storage(e.to_string()))),
                    }
                }
                retry
            }
        }
    }

    /// Makes a group of events durable before anyone is told: appends it, then syncs the
    /// store (concurrent partitions share one flush when the store group-commits; with a store
    /// that syncs every write it is a no-op) while raising the partition's high-water mark
    /// beside it.
    async fn write_group(&self, events: Vec<Event>, mark: Mark) -> Result<(), AppendError> {
        let store = self.store.clone();
        let partition = self.partition;
        let appended = tokio::task::spawn_blocking(move || store.append(partition, &events)).await;
        flatten(appended, "event write")?;
        let store = self.store.clone();
        let synced = tokio::task::spawn_blocking(move || store.sync());
        let raised = self.marks.clone().map(|marks| {
            tokio::task::spawn_blocking(move || marks.raise(partition.0, &mark))
        });
        let raised = match raised {
            Some(r) => flatten(
                r.await.map(|r| {
                    r.map_err(|e| {
                        AppendError::Storage(monoseq_kv::KvError::backend(
                            "raising the high-water mark failed".to_owned(),
                            e,
                        ))
                    })
                }),
                "raising the high-water mark",
            ),
            None => Ok(()),
        };
        let synced = flatten(
            synced.await.map(|r| r.map_err(AppendError::Storage)),
            "syncing the store",
        );
        synced.and(raised)
    }

    /// Runs the sequencing transaction of one command, committed as pending.
    fn sequence(&mut self, job: &Job, now_ms: u64) -> Result<(Event, Outcome), CommandError> {
        let plan = &job.plan;
        let mut updated = Vec::with_capacity(job.cmd.update.len());
        for u in &job.cmd.update {
            match self
                .store
                .read_record(plan.ws, monoseq_store::RecordId(u.id))
            {
                Ok(Some(r)) => updated.push((r.kind, r.name)),
                Ok(None) => {
                    return Err(CommandError::UnknownRecord {
                        ws: plan.ws.0,
                        id: u.id,
                    });
                }
                Err(e) => return Err(CommandError::Storage(e.to_string())),
            }
        }
        let mut tx = match self.seq.start(plan.ws_kind, plan.ws) {
            Ok(Start::Began(tx)) => tx,
            Ok(Start::Busy(b)) => return Err(busy(b)),
            Err(StartError::UnknownWsKind(k)) => return Err(CommandError::UnknownWsKind(k.0)),
            Err(e) => return Err(CommandError::Storage(e.to_string())),
        };
        let internal = |e: monoseq_core::NextError| CommandError::Storage(e.to_string());
        let wlog = tx.next(WLOG_OFFSET_SEQUENCE.id).map_err(internal)?;
        let mut ids = BTreeMap::new();
        for &(raw, kind) in &plan.raw_ids {
            let n = tx.next(RecordKind::id_sequence(kind)).map_err(internal)?;
            ids.insert(raw, n.0);
        }
        let plog = tx.plog_offset();
        let (created, updated, argument) = resolve(&job.cmd, &ids, &updated);
        let event = Event {
            plog_offset: plog,
            ws: plan.ws,
            ws_kind: plan.ws_kind,
            wlog_offset: WLogOffset(wlog.0),
            registered_at_ms: now_ms,
            command: job.cmd.command.clone(),
            argument,
            created,
            updated,
            idempotency: None,
        };
        tx.commit_pending();
        Ok((
            event,
            Outcome {
                partition: self.partition.0,
                plog_offset: plog.0,
                wlog_offset: wlog.0,
                ids,
            },
        ))
    }

    fn answer(&self, job: Job, result: Result<Outcome, CommandError>) {
        let counter = match &result {
            Ok(_) => &self.counters.committed,
            Err(CommandError::Busy(_)) => &self.counters.busy,
            Err(_) => &self.counters.failed,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        let _ = job.reply.send(result);
    }

    fn report_cache(&mut self) {
        let s = self.seq.cache_stats();
        let (h, m) = self.reported;
        self.counters
            .cache_hits
            .fetch_add(s.hits - h, Ordering::Relaxed);
        self.counters
            .cache_misses
            .fetch_add(s.misses - m, Ordering::Relaxed);
        self.reported = (s.hits, s.misses);
    }
}

/// The result of a blocking storage call, with a panic in it as a storage error.
fn flatten<T>(
    joined: Result<Result<T, AppendError>, tokio::task::JoinError>,
    what: &str,
) -> Result<T, AppendError> {
    joined.unwrap_or_else(|join| {
        Err(AppendError::Storage(monoseq_kv::KvError::Backend {
            message: format!("{what} panicked: {join}"),
            source: None,
        }))
    })
}

/// The partition's high-water mark once `events` are acknowledged: `mark` raised by the
/// last PLog offset and the highest WLog offset and record IDs of the group.
fn group_mark(mark: Mark, events: &[Event]) -> Mark {
    use monoseq_store::{CRECORD_ID_SEQUENCE, OWRECORD_ID_SEQUENCE};
    let mut m = mark;
    for e in events {
        m.plog = m.plog.max(e.plog_offset.0);
        e.for_each_number(|seq, n| {
            let slot = match seq {
                s if s == WLOG_OFFSET_SEQUENCE.id => &mut m.wlog,
                s if s == CRECORD_ID_SEQUENCE.id => &mut m.crecord,
                s if s == OWRECORD_ID_SEQUENCE.id => &mut m.owrecord,
                _ => return,
            };
            *slot = (*slot).max(n.0);
        });
    }
    m
}

fn busy(b: Busy) -> CommandError {
    CommandError::Busy(b.to_string())
}

/// Which command of a failed group caused the failure, and its error; `(None, None)` for a
/// storage fault that concerns the whole group.
fn blame(e: &AppendError) -> (Option<usize>, Option<CommandError>) {
    match e {
        AppendError::SequenceViolation { event_index, .. } => (
            Some(*event_index),
            Some(CommandError::SequenceViolation(e.to_string())),
        ),
        AppendError::TooLarge { event_index, .. } | AppendError::Encode { event_index, .. } => (
            Some(*event_index),
            Some(CommandError::TooLarge(e.to_string())),
        ),
        AppendError::UnknownRecord {
            event_index,
            ws,
            id,
            ..
        } => (
            Some(*event_index),
            Some(CommandError::UnknownRecord { ws: ws.0, id: id.0 }),
        ),
        _ => (None, None),
    }
}
