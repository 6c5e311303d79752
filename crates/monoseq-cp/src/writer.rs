//! The group writer of one partition: on the partition's thread (or a blocking one) it runs
//! every command of a group through its sequencing transaction (reading records and stored
//! numbers there, never on the async runtime), answers retries of known idempotency keys from
//! their original events, writes the group's events in one atomic batch, syncs the store while
//! raising the partition's high-water mark, and only then answers the clients. It answers
//! each group with a [`GroupOutcome`] (written, or what a failed group leaves: fenced, fatal,
//! lost, unwritten, failed), the input of the partition's lifecycle, and assembles the next
//! group for both drivers (the partition task and the simulation's manual partition).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use monoseq_core::{
    Busy, NextError, PoisonReason, Sequencer, Start, StartError, Transaction, WsId,
};
use monoseq_kv::{KvError, KvStore};
use monoseq_store::{
    AppendError, CRECORD_ID_SEQUENCE, Event, EventStore, Mark, Marks, MarksError,
    OWRECORD_ID_SEQUENCE, PLogSeqStorage, PartitionId, ReadError, RecordKind, StoredRecords,
    WLOG_OFFSET_SEQUENCE, WLogOffset,
};
use tokio::sync::oneshot;

use crate::acked::Acked;
use crate::command::{Draft, Plan};
use crate::error::{CommandError, LostEvents, StepError, too_large};
use crate::idempotency::{IdempotencyKey, Window};
use crate::lifecycle::GroupOutcome;
use crate::outcome::{Counters, Outcome};
use crate::recent::RecentRecords;

/// A command that took longer than this from its arrival to its durable answer is logged, at
/// most once per [`SLOW_LOG_INTERVAL`] per partition (with the count since).
pub const SLOW_COMMAND: Duration = Duration::from_secs(1);

/// See [`SLOW_COMMAND`].
pub const SLOW_LOG_INTERVAL: Duration = Duration::from_secs(10);

pub(crate) type Storage<S> = Arc<PLogSeqStorage<S>>;

/// A queued command.
pub(crate) struct Job {
    /// Its event, encoded once, waiting for its numbers.
    pub(crate) draft: Draft,
    /// Applies the command only if its workspace's WLog ends at this offset.
    pub(crate) expected_wlog_offset: Option<u64>,
    pub(crate) plan: Plan,
    /// The idempotency key and the request's fingerprint.
    pub(crate) key: Option<(IdempotencyKey, u64)>,
    pub(crate) reply: oneshot::Sender<Result<Outcome, CommandError>>,
    /// When the command was queued.
    pub(crate) queued_at: Instant,
    /// More commands of the same batch follow this one on the partition's queue at once
    /// ([`CommandProcessor::submit_all`](crate::CommandProcessor::submit_all) queues them one
    /// after another, their room reserved first): a group that took this one waits for them.
    pub(crate) more: bool,
}

/// Groups whose oldest command took longer than [`SLOW_COMMAND`], for the rate-limited log.
#[derive(Debug, Default)]
pub(crate) struct SlowGroups {
    logged_at: Option<Instant>,
    since: u64,
}

impl SlowGroups {
    /// Counts a written group of `commands` whose oldest command arrived at `oldest`, began
    /// at `began` and spent `write` appending, syncing and raising its mark, answered at
    /// `now`; logs it when that command took [`SLOW_COMMAND`] or longer and no line was
    /// logged lately.
    fn note(
        &mut self,
        partition: PartitionId,
        commands: usize,
        (oldest, began, now): (Instant, Instant, Instant),
        write: Duration,
    ) {
        let total = now.saturating_duration_since(oldest);
        if total < SLOW_COMMAND {
            return;
        }
        self.since += 1;
        if self
            .logged_at
            .is_some_and(|at| now.saturating_duration_since(at) < SLOW_LOG_INTERVAL)
        {
            return;
        }
        let ms = |d: Duration| d.as_millis() as u64;
        let (total_ms, queued_ms, write_ms) = (
            ms(total),
            ms(began.saturating_duration_since(oldest)),
            ms(write),
        );
        tracing::warn!(
            partition = partition.0,
            commands,
            total_ms,
            queued_ms,
            write_ms,
            slow_groups = self.since,
            "a command took {total_ms} ms from its arrival to its durable answer ({queued_ms} ms \
             waiting for its group, {write_ms} ms appending, syncing and raising the mark); check \
             the storage's latency and the machine's load"
        );
        self.logged_at = Some(now);
        self.since = 0;
    }
}

/// Where a group reads the time: the system's clocks in production, simulated time in a
/// simulation (so that a seed is one exact run, stored event times included).
pub(crate) trait Clock {
    /// Now, on a monotonic clock (how long a group waited and wrote).
    fn now(&self) -> Instant;
    /// Now, in milliseconds since the Unix epoch (an event's registration time).
    fn unix_ms(&self) -> u64;
}

/// The system's clocks.
pub(crate) struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }

    fn unix_ms(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64)
    }
}

/// Everything a group needs, moved to a blocking thread for the group and back.
pub(crate) struct Writer<S: KvStore + Clone> {
    pub(crate) partition: PartitionId,
    pub(crate) store: EventStore<S>,
    pub(crate) seq: Sequencer<Storage<S>>,
    pub(crate) window: Window,
    pub(crate) marks: Option<Arc<Marks>>,
    pub(crate) mark: Mark,
    pub(crate) counters: Arc<Counters>,
    /// Cache counters already added to `counters`.
    pub(crate) reported: (u64, u64),
    /// The processor's memory of this partition's acknowledged numbers.
    pub(crate) acked: Arc<Acked>,
    /// The highest PLog offset retired by an accepted loss (0: none): the PLog has a gap
    /// below it, and reads of its tail continue above it.
    pub(crate) floor: u64,
    /// Slow groups not logged yet.
    pub(crate) slow: SlowGroups,
    /// The records this writer wrote lately, as written: an update of one is not read again.
    pub(crate) recent: RecentRecords,
}

/// A command that got its numbers and waits for its group's write.
struct Accepted {
    job: Job,
    outcome: Outcome,
}

/// The commands of one group being sequenced.
struct Group {
    /// Sequenced, with their events in the same order.
    accepted: Vec<Accepted>,
    events: Vec<Event>,
    /// Per key hash, the index in `accepted` of the group's command with that key.
    in_group: HashMap<u64, usize>,
    /// Commands repeating a key of this group: they wait for its first command's answer.
    followers: Vec<(Job, usize)>,
    /// Retries of events above the mark, answered once the mark covers them.
    replays: Vec<(Job, Outcome, Mark)>,
    /// Commands refused on an expected WLog offset after the group accepted others: answered
    /// once the group is written, retried with its innocent commands if it fails.
    conflicts: Vec<(Job, CommandError)>,
    /// The records the group's commands update, as stored before the group: read once, to
    /// check each command, and handed to the event store to merge the updates into.
    stored: StoredRecords,
    /// What went wrong beyond single commands.
    trouble: Trouble,
}

/// What went wrong in a group beyond refusing single commands; several troubles of one group
/// come to one [`GroupOutcome`], the gravest.
#[derive(Debug, Default)]
struct Trouble {
    /// The storage refused a write: another node owns the partition now.
    fenced: bool,
    /// A write failed fatally (the store is poisoned), with the failure's causes.
    fatal: Option<String>,
    /// The storage no longer holds events this partition acknowledged.
    lost: Option<LostEvents>,
    /// The sequencer failed beyond healing.
    failed: Option<String>,
    /// The first PLog offset of the group whose write failed: the PLog from there may hold
    /// events of the group (a write whose answer was lost may have landed).
    unresolved: Option<u64>,
}

impl Trouble {
    /// The group's outcome; `retry` when innocent commands of it wait to run again.
    fn outcome(self, retry: bool) -> GroupOutcome {
        if self.fenced {
            return GroupOutcome::Fenced;
        }
        if let Some(causes) = self.fatal {
            return GroupOutcome::Fatal { causes };
        }
        if let Some(what) = self.lost {
            return GroupOutcome::Lost { what };
        }
        match (self.failed, self.unresolved) {
            (Some(why), unresolved_from) => GroupOutcome::Failed {
                why,
                unresolved_from,
            },
            (None, Some(unresolved_from)) => GroupOutcome::Unwritten {
                unresolved_from,
                retry,
            },
            (None, None) => GroupOutcome::Answered,
        }
    }
}

impl Group {
    fn with_capacity(jobs: usize) -> Group {
        Group {
            accepted: Vec::with_capacity(jobs),
            events: Vec::with_capacity(jobs),
            in_group: HashMap::new(),
            followers: Vec::new(),
            replays: Vec::new(),
            conflicts: Vec::new(),
            stored: StoredRecords::new(),
            trouble: Trouble::default(),
        }
    }
}

/// How [`Writer::append_group`] left a group.
pub(crate) enum Appending {
    /// Nothing waits: how the group ended, and the commands to retry.
    Done((GroupOutcome, Vec<Job>)),
    /// Appended: it waits for its mark's raise, then [`Writer::finish_group`].
    Appended(Box<Appended>),
}

/// A group appended and not yet durable: acknowledged only once the mark covering it is
/// raised after the store's sync.
pub(crate) struct Appended {
    group: Group,
    /// The mark that covers the group.
    pub(crate) mark: Mark,
    /// The updated records as written.
    records: StoredRecords,
    commands: usize,
    /// When its oldest command was queued, the group began, its append began and ended.
    times: (Instant, Instant, Instant, Instant),
}

/// What a partition needs to build a writer again: everything but its sequencer and window.
#[derive(Clone)]
pub(crate) struct WriterTemplate<S: KvStore + Clone> {
    pub(crate) partition: PartitionId,
    pub(crate) store: EventStore<S>,
    pub(crate) marks: Option<Arc<Marks>>,
    pub(crate) mark: Mark,
    pub(crate) counters: Arc<Counters>,
    pub(crate) acked: Arc<Acked>,
    pub(crate) floor: u64,
    /// Bytes of lately written records the writer keeps.
    pub(crate) recent_bytes: usize,
}

impl<S: KvStore + Clone> WriterTemplate<S> {
    /// A new writer around `seq`, with an empty window of `window_events` events, its mark
    /// the start mark (`monoseq_store::start_mark`) of the stored one and what this process
    /// acknowledged.
    pub(crate) fn writer(&self, seq: Sequencer<Storage<S>>, window_events: u64) -> Writer<S> {
        let stored = self
            .marks
            .as_ref()
            .and_then(|m| m.get(self.partition.0).ok())
            .unwrap_or(self.mark);
        let mark = monoseq_store::start_mark(stored, self.acked.get());
        self.writer_at(seq, window_events, mark)
    }

    /// A new writer around `seq`, with an empty window of `window_events` events, at `mark`.
    pub(crate) fn writer_at(
        &self,
        seq: Sequencer<Storage<S>>,
        window_events: u64,
        mark: Mark,
    ) -> Writer<S> {
        Writer {
            partition: self.partition,
            store: self.store.clone(),
            seq,
            window: Window::new(window_events),
            marks: self.marks.clone(),
            mark,
            counters: Arc::clone(&self.counters),
            reported: (0, 0),
            acked: Arc::clone(&self.acked),
            floor: self.floor,
            slow: SlowGroups::default(),
            recent: RecentRecords::new(self.recent_bytes),
        }
    }
}

pub(crate) fn busy(b: Busy) -> CommandError {
    CommandError::Busy(b.to_string())
}

/// The jobs of the next group: the retried ones first (`retry` is emptied), then `first` and
/// what `queued` gives, up to `max` jobs.
pub(crate) fn next_group(
    retry: &mut Vec<Job>,
    first: Option<Job>,
    max: usize,
    mut queued: impl FnMut() -> Option<Job>,
) -> Vec<Job> {
    let mut jobs = std::mem::take(retry);
    jobs.extend(first);
    while jobs.len() < max
        && let Some(j) = queued()
    {
        jobs.push(j);
    }
    jobs
}

/// An idempotency key found in the PLog: the key, its workspace and its event's offset.
pub(crate) type FoundKey = (String, u64, u64);

/// The idempotency keys of the events at PLog offsets `from..to`, with the read's result (the
/// keys read before an error are given too). Offsets up to `floor` were retired by an accepted
/// loss: the PLog has a gap below it, so the part above it is read on its own.
///
/// The store is first brought up to the partition's log ([`EventStore::redo_partition`]): a
/// group whose key-value batch failed after its log was made durable is stored, and a retry
/// answered from the keys found here must find its WLog entries and records, whether or not
/// another group is ever appended.
pub(crate) fn read_keys<S: KvStore + Clone>(
    store: &EventStore<S>,
    partition: PartitionId,
    floor: u64,
    from: u64,
    to: u64,
) -> (Vec<FoundKey>, Result<(), StepError>) {
    if let Err(e) = store.redo_partition(partition) {
        let why = format!(
            "writing the key-value store up to the PLog: {}",
            monoseq_kv::chain(&e)
        );
        let step = if monoseq_kv::is_poisoned(&e) {
            StepError::Fatal(why)
        } else {
            StepError::Read(why)
        };
        return (Vec::new(), Err(step));
    }
    let mut keys = Vec::new();
    let mut read = |from: u64, to: u64| {
        store.for_each_key(
            partition,
            monoseq_core::PLogOffset(from),
            monoseq_core::PLogOffset(to),
            &mut |head, i| keys.push((i.key, head.ws.0, head.plog_offset.0)),
        )
    };
    let below = if from <= floor {
        read(from, (floor + 1).min(to))
    } else {
        Ok(())
    };
    let above = read(from.max(floor + 1), to);
    let result = below
        .and(above)
        .map_err(|e| StepError::Read(monoseq_kv::chain(&e)));
    (keys, result)
}

impl<S: KvStore + Clone> Writer<S> {
    /// Checks, once the sequencer has actualized, that the stored PLog still holds every event
    /// this partition acknowledged (its high-water mark): a database that failed over to a
    /// standby that was behind, or a restored backup, ends below it, and serving would hand
    /// the lost events' numbers out again. What was lost, if something was.
    pub(crate) fn whole(&self) -> Result<(), LostEvents> {
        let end = self.seq.handle().stats().next_offset.saturating_sub(1);
        if end >= self.mark.plog {
            return Ok(());
        }
        Err(self.lost(end))
    }

    /// The events between the stored PLog's `end` and the mark are lost.
    fn lost(&self, end: u64) -> LostEvents {
        LostEvents {
            partition: self.partition.0,
            acked: self.mark.plog,
            end,
        }
    }

    /// Raises the mark over every event the stored PLog holds above it, once actualized at a
    /// start or a takeover: any of them may have been acknowledged (by a former owner whose
    /// marks this node has not learned), so they are treated as acknowledged, durably, before
    /// anything is served. A later loss of them is then noticed and their numbers retired.
    pub(crate) fn cover_stored_tail(&mut self) -> Result<(), StepError> {
        let end = self.seq.handle().stats().next_offset.saturating_sub(1);
        if end <= self.mark.plog {
            return Ok(());
        }
        let mut tail = Vec::new();
        let from = (self.mark.plog + 1).max(self.floor + 1);
        let read = self.store.for_each_event(
            self.partition,
            monoseq_core::PLogOffset(from),
            monoseq_core::PLogOffset(end + 1),
            &mut |e: Event| tail.push(e),
        );
        read.map_err(|e| StepError::Read(monoseq_kv::chain(&e)))?;
        let mut mark = group_mark(self.mark, &tail);
        mark.plog = mark.plog.max(end);
        self.raise_synced(mark)
            .map_err(|e| StepError::Raise(crate::error::chain(&e)))?;
        self.mark = mark;
        self.acked.raise(mark);
        Ok(())
    }

    /// Remembers keys read from the PLog in the idempotency window.
    pub(crate) fn remember(&mut self, keys: Vec<FoundKey>) {
        for (key, ws, offset) in keys {
            if let Ok(k) = IdempotencyKey::new(&key) {
                self.window.insert(k.hash_in(ws), offset);
            }
        }
    }
}

impl<S: KvStore + Clone + Send + Sync + 'static> Writer<S> {
    /// Sequences a group, writes it and answers its commands; how the group ended, and the
    /// innocent commands of a group that failed because of one of them, to retry.
    pub(crate) fn run_group(
        &mut self,
        jobs: Vec<Job>,
        clock: &impl Clock,
    ) -> (GroupOutcome, Vec<Job>) {
        // Announced before sequencing: a marks cycle starting meanwhile waits for this group.
        let marks = self.marks.clone();
        let begun = marks.as_deref().map(Marks::begin_group);
        let appended = match self.append_group(jobs, clock) {
            Appending::Done(ended) => return ended,
            Appending::Appended(appended) => appended,
        };
        let raised = match begun {
            Some(group) => {
                group.raise_after(self.partition.0, &appended.mark, || self.store.sync())
            }
            None => self.raise_synced(appended.mark),
        };
        self.finish_group(appended, raised, clock)
    }

    /// The first half of [`Writer::run_group`]: sequences the group and appends its events
    /// without waiting for them to be durable. Done already when nothing was appended (every
    /// command answered, or the append failed); else the group waits for its mark's raise
    /// (after the store's sync) and [`Writer::finish_group`].
    pub(crate) fn append_group(&mut self, jobs: Vec<Job>, clock: &impl Clock) -> Appending {
        let began = clock.now();
        let oldest = jobs.iter().map(|j| j.queued_at).min().unwrap_or(began);
        let commands = jobs.len();
        let now_ms = clock.unix_ms();
        let mut group = Group::with_capacity(jobs.len());
        for job in jobs {
            self.take_job(job, now_ms, &mut group);
        }
        self.report_cache();
        let replayed = group.replays.iter().fold(self.mark, |m, r| m.max(&r.2));
        if group.accepted.is_empty() {
            if !group.replays.is_empty() {
                self.answer_replays(std::mem::take(&mut group.replays), replayed);
            }
            return Appending::Done((group.trouble.outcome(false), Vec::new()));
        }
        let mark = group_mark(replayed, &group.events);
        let writing = clock.now();
        let stored = std::mem::take(&mut group.stored);
        match self
            .store
            .append_deferred(self.partition, &group.events, stored)
        {
            Ok(records) => Appending::Appended(Box::new(Appended {
                group,
                mark,
                records,
                commands,
                times: (oldest, began, writing, clock.now()),
            })),
            Err(e) => Appending::Done(self.unwritten(&e, group)),
        }
    }

    /// The second half of [`Writer::run_group`], once the raise of the group's mark after the
    /// store's sync answered `raised`: writes what the append deferred until its events were
    /// durable ([`EventStore::append_deferred`]) and answers the group's commands, or fails
    /// the group (a mark not raised leaves its events unacknowledged).
    pub(crate) fn finish_group(
        &mut self,
        appended: Box<Appended>,
        raised: Result<(), MarksError>,
        clock: &impl Clock,
    ) -> (GroupOutcome, Vec<Job>) {
        let Appended {
            group,
            mark,
            records,
            commands,
            times: (oldest, began, writing, appended),
        } = *appended;
        let durable = raised
            .map_err(|e| match e {
                MarksError::Store(e) => AppendError::Storage(e),
                e => {
                    AppendError::Storage(KvError::backend("raising the high-water mark failed", e))
                }
            })
            .and_then(|()| self.store.apply_deferred(self.partition));
        if let Err(e) = durable {
            return self.unwritten(&e, group);
        }
        self.recent.keep(records);
        let written = clock.now();
        let write = written.saturating_duration_since(writing);
        let append = appended.saturating_duration_since(writing);
        let sync = written.saturating_duration_since(appended);
        self.counters.group_written(commands, append, sync);
        let Group {
            accepted,
            events,
            followers,
            replays,
            conflicts,
            trouble,
            ..
        } = group;
        // Kept for followers before the end that covers the group is published.
        self.acked.keep(events);
        self.written_group(mark, accepted, followers, replays);
        self.answer_conflicts(conflicts);
        self.slow
            .note(self.partition, commands, (oldest, began, written), write);
        (trouble.outcome(false), Vec::new())
    }

    /// The group's write failed (`e`): what was written is unknown, so the window forgets its
    /// keys and the recent records are read again; its commands are answered or kept to retry.
    fn unwritten(&mut self, e: &AppendError, group: Group) -> (GroupOutcome, Vec<Job>) {
        let Group {
            mut accepted,
            events,
            followers,
            replays,
            conflicts,
            mut trouble,
            ..
        } = group;
        if let Some(first) = accepted.first() {
            self.window.forget_from(first.outcome.plog_offset);
        }
        self.recent.clear();
        for (a, event) in accepted.iter_mut().zip(events) {
            a.job.draft.give_back(event);
        }
        for (job, _, _) in replays {
            answer(&self.counters, job, Err(storage_error(e)));
        }
        let mut retry = self.failed_group(e, accepted, followers, &mut trouble);
        retry.extend(conflicts.into_iter().map(|(job, _)| job));
        (trouble.outcome(!retry.is_empty()), retry)
    }

    /// Takes one command into the group: answers it at once (a refusal, or a retry of an event
    /// the mark covers), makes it follow the command of the group with its key, keeps it as a
    /// retry to answer once the mark covers its event, or sequences it.
    fn take_job(&mut self, job: Job, now_ms: u64, group: &mut Group) {
        if let Some((key, fingerprint)) = &job.key {
            let hash = key.hash_in(job.plan.ws.0);
            if let Some(&i) = group.in_group.get(&hash) {
                let same = matches!(&group.accepted[i].job.key, Some((_, f)) if f == fingerprint);
                if same {
                    group.followers.push((job, i));
                } else {
                    let e = key_reused(key);
                    answer(&self.counters, job, Err(e));
                }
                return;
            }
            match self.replay(key, hash, job.plan.ws, *fingerprint) {
                // An event above the mark (its first answer was lost): the mark must
                // cover it before it is acknowledged.
                Some(Ok((outcome, m))) if !self.mark.covers(&m) => {
                    group.replays.push((job, outcome, m));
                    return;
                }
                Some(result) => {
                    answer(&self.counters, job, result.map(|(outcome, _)| outcome));
                    return;
                }
                None => {}
            }
        }
        let mut job = job;
        match self.sequence(&mut job, now_ms, &mut group.stored, &mut group.trouble) {
            Ok(outcome) => {
                if let Some((key, _)) = &job.key {
                    let hash = key.hash_in(job.plan.ws.0);
                    self.window.insert(hash, outcome.plog_offset);
                    group.in_group.insert(hash, group.accepted.len());
                }
                group.events.push(job.draft.take_event());
                group.accepted.push(Accepted { job, outcome });
            }
            // Decided against this group's unwritten events too: answered once they are
            // durable (a refusal never names an offset that may not be written).
            Err(e @ CommandError::WlogConflict { .. }) if !group.accepted.is_empty() => {
                group.conflicts.push((job, e));
            }
            Err(e) => answer(&self.counters, job, Err(e)),
        }
    }

    /// Answers the group's refusals on an expected WLog offset, once its events are durable.
    fn answer_conflicts(&self, conflicts: Vec<(Job, CommandError)>) {
        for (job, e) in conflicts {
            answer(&self.counters, job, Err(e));
        }
    }

    /// The group's events are durable under `mark`: marks them durable in the sequencer and
    /// answers every command of the group.
    fn written_group(
        &mut self,
        mark: Mark,
        accepted: Vec<Accepted>,
        followers: Vec<(Job, usize)>,
        replays: Vec<(Job, Outcome, Mark)>,
    ) {
        self.seq.mark_durable();
        self.mark = mark;
        self.acked.set(mark);
        self.counters.groups.fetch_add(1, Ordering::Relaxed);
        for (job, outcome, _) in replays {
            answer(&self.counters, job, Ok(outcome));
        }
        for (job, i) in followers {
            let mut outcome = accepted[i].outcome.clone();
            outcome.replayed = true;
            answer(&self.counters, job, Ok(outcome));
        }
        for a in accepted {
            answer(&self.counters, a.job, Ok(a.outcome));
        }
    }

    /// Answers retries of events above the mark (their first answers were lost) once the mark
    /// covers them: raised durably first, as a group's write does.
    fn answer_replays(&mut self, replays: Vec<(Job, Outcome, Mark)>, mark: Mark) {
        match self.raise_synced(mark) {
            Ok(()) => {
                self.mark = mark;
                self.acked.set(mark);
                for (job, outcome, _) in replays {
                    answer(&self.counters, job, Ok(outcome));
                }
            }
            Err(e) => {
                let e =
                    AppendError::Storage(KvError::backend("raising the high-water mark failed", e));
                for (job, _, _) in replays {
                    answer(&self.counters, job, Err(storage_error(&e)));
                }
            }
        }
    }

    /// After a failed group write: the PLog decides which numbers were used. The command that
    /// caused it gets its error, the others are retried; a storage fault fails them all.
    fn failed_group(
        &mut self,
        e: &AppendError,
        accepted: Vec<Accepted>,
        followers: Vec<(Job, usize)>,
        trouble: &mut Trouble,
    ) -> Vec<Job> {
        if matches!(e, AppendError::Storage(KvError::Fenced { .. })) {
            // Nothing of the group was written, so its commands may go to the new owner.
            trouble.fenced = true;
            let partition = self.partition.0;
            for a in accepted {
                answer(
                    &self.counters,
                    a.job,
                    Err(CommandError::NotOwner { partition }),
                );
            }
            for (job, _) in followers {
                answer(
                    &self.counters,
                    job,
                    Err(CommandError::NotOwner { partition }),
                );
            }
            return Vec::new();
        }
        let fatal = monoseq_kv::is_poisoned(e);
        if fatal {
            // Logged once by the task, which stops writing.
            trouble.fatal = Some(crate::error::chain(e));
        }
        self.seq.actualize();
        let first = accepted.first().map(|a| a.outcome.plog_offset);
        trouble.unresolved = first;
        let blamed = CommandError::of_append(e);
        if blamed.is_none() && !fatal {
            tracing::warn!(
                partition = self.partition.0,
                "writing a group of {} commands failed: {}",
                accepted.len(),
                crate::error::chain(e)
            );
        }
        let mut retry = Vec::new();
        for (i, a) in accepted.into_iter().enumerate() {
            match &blamed {
                Some((c, err)) if *c == i => answer(&self.counters, a.job, Err(err.clone())),
                Some(_) => retry.push(a.job),
                None => answer(&self.counters, a.job, Err(storage_error(e))),
            }
        }
        for (job, _) in followers {
            match &blamed {
                Some(_) => retry.push(job),
                None => answer(&self.counters, job, Err(storage_error(e))),
            }
        }
        retry
    }

    /// Syncs the store and raises the partition's high-water mark to `mark` after it (only
    /// the sync without marks).
    fn raise_synced(&self, mark: Mark) -> Result<(), MarksError> {
        match &self.marks {
            None => self.store.sync().map_err(MarksError::Store),
            Some(marks) => marks.raise_after(self.partition.0, &mark, || self.store.sync()),
        }
    }

    /// The answer to a retry of a command whose event carries the same key: the original
    /// answer, or a refusal if the body differs. `None` when the key is not known (never seen,
    /// or its event is gone).
    fn replay(
        &self,
        key: &IdempotencyKey,
        hash: u64,
        ws: monoseq_core::WsId,
        fingerprint: u64,
    ) -> Option<Result<(Outcome, Mark), CommandError>> {
        let offset = self.window.get(hash)?;
        let event = match self
            .store
            .read_event(self.partition, monoseq_core::PLogOffset(offset))
        {
            Ok(Some(e)) => e,
            Ok(None) => return None,
            Err(e) => return Some(Err(read_error(&e))),
        };
        let recorded = event.idempotency.as_ref()?;
        if recorded.key != key.as_str() || event.ws != ws {
            return None;
        }
        if recorded.fingerprint != fingerprint {
            return Some(Err(key_reused(key)));
        }
        let outcome = Outcome {
            partition: self.partition.0,
            plog_offset: event.plog_offset.0,
            wlog_offset: event.wlog_offset.0,
            ids: recorded.raw_ids.iter().copied().collect(),
            replayed: true,
        };
        Some(Ok((
            outcome,
            group_mark(Mark::default(), std::slice::from_ref(&event)),
        )))
    }

    /// Runs the sequencing transaction of one command, committed as pending, and numbers its
    /// draft event in place. A command whose expected WLog offset is not where its workspace's
    /// WLog ends (the group's earlier commands included) cancels the transaction: it takes no
    /// number. The records it updates are read into `stored`, the group's.
    fn sequence(
        &mut self,
        job: &mut Job,
        now_ms: u64,
        stored: &mut StoredRecords,
        trouble: &mut Trouble,
    ) -> Result<Outcome, CommandError> {
        let plan = &job.plan;
        self.read_updated(job, stored)?;
        let tx = match self.seq.start(plan.ws_kind, plan.ws) {
            Ok(Start::Began(tx)) => tx,
            Ok(Start::Busy(b)) => return Err(busy(b)),
            Err(StartError::UnknownWsKind(k)) => return Err(CommandError::UnknownWsKind(k.0)),
            Err(e @ StartError::PLogExhausted(_)) => {
                return Err(CommandError::Exhausted(e.to_string()));
            }
            Err(e @ StartError::Corrupted) => return Err(CommandError::Corrupted(e.to_string())),
            Err(StartError::Poisoned(PoisonReason::Fenced)) => {
                trouble.fenced = true;
                return Err(CommandError::NotOwner {
                    partition: self.partition.0,
                });
            }
            Err(e) => {
                trouble.failed = Some(monoseq_kv::chain(&e));
                return Err(CommandError::Unavailable {
                    partition: self.partition.0,
                    reason: monoseq_kv::chain(&e),
                });
            }
        };
        let plog = tx.plog_offset();
        if plog.0 <= self.mark.plog {
            // The PLog was re-read (an actualization) and ends before events this partition
            // acknowledged: the storage lost them.
            tx.actualize();
            let lost = self.lost(plog.0 - 1);
            let refusal = CommandError::Corrupted(lost.to_string());
            trouble.lost = Some(lost);
            return Err(refusal);
        }
        let mut tx = on_expected_wlog(tx, plan.ws, job.expected_wlog_offset)?;
        let wlog = tx.next(WLOG_OFFSET_SEQUENCE.id).map_err(next_error)?;
        let mut ids = BTreeMap::new();
        for &(raw, kind) in &plan.raw_ids {
            let n = tx.next(RecordKind::id_sequence(kind)).map_err(next_error)?;
            ids.insert(raw, n.0);
        }
        job.draft.number(plan, &ids);
        let event = &mut job.draft.event;
        event.plog_offset = plog;
        event.wlog_offset = WLogOffset(wlog.0);
        event.registered_at_ms = now_ms;
        for u in &mut event.updated {
            if let Some(r) = stored.get(plan.ws, u.id) {
                u.kind = r.kind;
                u.name.clone_from(&r.name);
            }
        }
        tx.commit_pending();
        let outcome = Outcome {
            partition: self.partition.0,
            plog_offset: plog.0,
            wlog_offset: wlog.0,
            ids,
            replayed: false,
        };
        Ok(outcome)
    }

    /// Reads the stored records the command updates into `stored` (once per group: one read
    /// already is not read again; nothing the group writes is written before it ends; one
    /// this writer wrote lately is taken as it wrote it, unread) and checks that each stays
    /// within the storage's limits once updated, before any number is taken.
    fn read_updated(&mut self, job: &Job, stored: &mut StoredRecords) -> Result<(), CommandError> {
        let ws = job.plan.ws;
        for change in &job.draft.event.updated {
            let id = change.id;
            if stored.get(ws, id).is_none() {
                let record = match self.recent.take(ws, id) {
                    Some(r) => r,
                    None => match self.store.read_record(ws, id) {
                        Ok(Some(r)) => r,
                        Ok(None) => {
                            return Err(CommandError::UnknownRecord { ws: ws.0, id: id.0 });
                        }
                        Err(e) => return Err(read_error(&e)),
                    },
                };
                stored.insert(ws, record);
            }
            if let Some(record) = stored.get(ws, id) {
                self.store
                    .check_update_storable(record, change)
                    .map_err(|e| too_large(&e))?;
            }
        }
        Ok(())
    }

    fn report_cache(&mut self) {
        let s = self.seq.cache_stats();
        let (h, m) = self.reported;
        self.counters
            .cache_hits
            .fetch_add(s.hits.saturating_sub(h), Ordering::Relaxed);
        self.counters
            .cache_misses
            .fetch_add(s.misses.saturating_sub(m), Ordering::Relaxed);
        self.reported = (s.hits, s.misses);
    }
}

/// The transaction, when the command expects no WLog offset or the one its workspace's WLog
/// ends at; else the transaction is cancelled (it handed out nothing yet, so the PLog offset
/// and every number stay for the next command, and no actualization runs) and the command
/// refused.
fn on_expected_wlog<'a, S: KvStore + Clone>(
    tx: Transaction<'a, Storage<S>>,
    ws: WsId,
    expected: Option<u64>,
) -> Result<Transaction<'a, Storage<S>>, CommandError> {
    let Some(expected) = expected else {
        return Ok(tx);
    };
    let current = tx.current(WLOG_OFFSET_SEQUENCE.id).map_err(next_error)?;
    if current.0 == expected {
        return Ok(tx);
    }
    if let Err(tx) = tx.cancel() {
        tx.actualize();
    }
    Err(CommandError::WlogConflict {
        ws: ws.0,
        expected,
        current: current.0,
    })
}

fn answer(counters: &Counters, job: Job, result: Result<Outcome, CommandError>) {
    let counter = match &result {
        Ok(o) if o.replayed => &counters.replayed,
        Ok(_) => &counters.committed,
        Err(CommandError::Busy(_)) => &counters.busy,
        Err(_) => &counters.failed,
    };
    counter.fetch_add(1, Ordering::Relaxed);
    let _ = job.reply.send(result);
}

fn key_reused(key: &IdempotencyKey) -> CommandError {
    CommandError::KeyReused {
        key: key.as_str().to_owned(),
    }
}

fn next_error(e: NextError) -> CommandError {
    match e {
        NextError::Exhausted { .. } => CommandError::Exhausted(e.to_string()),
        other => CommandError::Storage(other.to_string()),
    }
}

/// A failed read: damaged bytes are corruption, anything else a storage fault.
pub(crate) fn read_error(e: &ReadError) -> CommandError {
    match e {
        ReadError::Corrupt { .. }
        | ReadError::Misplaced { .. }
        | ReadError::Storage(KvError::Corrupted { .. }) => {
            CommandError::Corrupted(crate::error::chain(e))
        }
        _ => CommandError::Storage(crate::error::chain(e)),
    }
}

fn storage_error(e: &AppendError) -> CommandError {
    match e {
        AppendError::CorruptRecord { .. } | AppendError::Storage(KvError::Corrupted { .. }) => {
            CommandError::Corrupted(crate::error::chain(e))
        }
        _ => CommandError::Storage(crate::error::chain(e)),
    }
}

/// The partition's high-water mark once `events` are acknowledged: `mark` raised by the
/// last PLog offset and the highest WLog offset and record IDs of the group.
fn group_mark(mark: Mark, events: &[Event]) -> Mark {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn lost() -> LostEvents {
        LostEvents {
            partition: 1,
            acked: 9,
            end: 5,
        }
    }

    #[test]
    fn a_group_without_trouble_is_answered() {
        assert_eq!(Trouble::default().outcome(false), GroupOutcome::Answered);
    }

    #[test]
    fn troubles_of_one_group_come_to_the_gravest_fenced_fatal_lost_failed_unwritten() {
        let all = || Trouble {
            fenced: true,
            fatal: Some("poisoned".into()),
            lost: Some(lost()),
            failed: Some("sequencer failed".into()),
            unresolved: Some(40),
        };
        assert_eq!(all().outcome(true), GroupOutcome::Fenced);
        let not_fenced = || Trouble {
            fenced: false,
            ..all()
        };
        assert_eq!(
            not_fenced().outcome(true),
            GroupOutcome::Fatal {
                causes: "poisoned".into()
            }
        );
        let not_fatal = || Trouble {
            fatal: None,
            ..not_fenced()
        };
        assert_eq!(
            not_fatal().outcome(true),
            GroupOutcome::Lost { what: lost() }
        );
        let not_lost = || Trouble {
            lost: None,
            ..not_fatal()
        };
        assert_eq!(
            not_lost().outcome(true),
            GroupOutcome::Failed {
                why: "sequencer failed".into(),
                unresolved_from: Some(40)
            },
            "a failed sequencer is rebuilt, then the failed write read back"
        );
        let unwritten = Trouble {
            failed: None,
            ..not_lost()
        };
        assert_eq!(
            unwritten.outcome(true),
            GroupOutcome::Unwritten {
                unresolved_from: 40,
                retry: true
            }
        );
    }

    #[test]
    fn a_lost_partition_names_what_it_acknowledged_and_where_the_plog_ends() {
        assert_eq!(
            lost().to_string(),
            "the storage lost acknowledged events of partition 1: PLog offsets up to 9 were \
             acknowledged, the stored PLog now ends at 5 (a database failover to a standby that \
             was behind, or a restored backup?)"
        );
    }
}
