//! [`ManualPartition`] (feature `simulation`): one partition's single writer driven by hand,
//! for deterministic simulations of whole clusters. It is the writer the partition task runs
//! (sequencing, the idempotency window, the group write, the read-back after a failed write),
//! with its sequencer in manual mode: the caller steps the background worker, runs each group
//! on its own thread, and reads back after a failed group, as the task does before it takes
//! another command. No tokio runtime is involved.

use std::sync::Arc;

use monoseq_core::{Sequencer, Status, Step, Worker};
use monoseq_kv::KvStore;
use monoseq_store::{EventStore, Mark, PartitionId};

use crate::command::Command;
use crate::error::{CommandError, ConfigError};
use crate::idempotency::{IdempotencyKey, Window};
use crate::outcome::{Counters, Outcome};
use crate::partition::{Storage, Writer, busy, read_keys};
use crate::processor::{Config, prepare, sequencer_params};

/// One partition's writer and its sequencer's worker, stepped by the caller.
pub struct ManualPartition<S: KvStore + Clone> {
    writer: Writer<S>,
    worker: Worker<Storage<S>>,
    config: Config,
}

impl<S: KvStore + Clone> std::fmt::Debug for ManualPartition<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ManualPartition")
            .field("partition", &self.writer.partition.0)
            .finish_non_exhaustive()
    }
}

impl<S: KvStore + Clone + Send + Sync + 'static> ManualPartition<S> {
    /// Partition `partition` of `store`, its sequencer due to actualize (step the worker until
    /// [`status`](Self::status) is ready), with an empty idempotency window (call
    /// [`rebuild_window`](Self::rebuild_window) once actualized, as a starting partition does).
    /// `acked` is what this process acknowledged of the partition before (its memory across
    /// rebuilds; a new process starts from the default).
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
        let (seq, worker) = Sequencer::new_manual(params, storage);
        let writer = Writer {
            partition: PartitionId(partition),
            store,
            seq,
            window: Window::new(config.idempotency_window_events),
            marks: None,
            mark: acked,
            counters: Arc::new(Counters::default()),
            reported: (0, 0),
            failed: None,
            fenced: false,
            lost: None,
            acked: Arc::new(crate::acked::Acked::new(acked)),
            floor: retired.plog,
            unresolved: None,
            slow: crate::partition::SlowGroups::default(),
            fatal: None,
        };
        Ok(ManualPartition {
            writer,
            worker,
            config: config.clone(),
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

    /// The PLog offset the next event gets, as the sequencer knows it.
    #[must_use]
    pub fn next_offset(&self) -> u64 {
        self.writer.seq.handle().stats().next_offset
    }

    /// The highest numbers this writer acknowledged (or was opened with).
    #[must_use]
    pub fn acked(&self) -> Mark {
        self.writer.acked.get()
    }

    /// Runs one group of commands, as the partition task does with what its queue holds, and
    /// answers each. A command the group had to give up for another's fault is answered busy
    /// (the task would run it again after the actualization).
    pub fn run_group(
        &mut self,
        commands: Vec<(Command, Option<IdempotencyKey>)>,
    ) -> Vec<Result<Outcome, CommandError>> {
        let mut jobs = Vec::with_capacity(commands.len());
        let mut answers = Vec::with_capacity(commands.len());
        for (cmd, key) in commands {
            match prepare(&self.config, &self.writer.store, cmd, key) {
                Ok((job, answer)) => {
                    jobs.push(job);
                    answers.push(Err(answer));
                }
                Err(e) => answers.push(Ok(Err(e))),
            }
        }
        for retry in self.writer.run_group(jobs) {
            let _ = retry.reply.send(Err(busy(monoseq_core::Busy::Actualizing)));
        }
        answers
            .into_iter()
            .map(|a| match a {
                Ok(refused) => refused,
                Err(mut answer) => answer.try_recv().unwrap_or(Err(CommandError::ShuttingDown)),
            })
            .collect()
    }

    /// The first PLog offset of a failed group not yet read back: until
    /// [`read_back`](Self::read_back) succeeds, the partition must take no command.
    #[must_use]
    pub fn unresolved(&self) -> Option<u64> {
        self.writer.unresolved
    }

    /// Reads back the PLog from the failed group's first offset to the actualized end and
    /// remembers the keys found there (call once [`status`](Self::status) is ready again).
    ///
    /// # Errors
    ///
    /// When the PLog cannot be read; call again later.
    pub fn read_back(&mut self) -> Result<(), String> {
        let Some(from) = self.writer.unresolved else {
            return Ok(());
        };
        self.learn(from)?;
        self.writer.unresolved = None;
        Ok(())
    }

    /// Checks, once actualized, that the stored PLog still holds every event this partition
    /// acknowledged (its mark); false (and [`lost`](Self::lost) says why) when it does not.
    pub fn check_whole(&mut self) -> bool {
        self.writer.check_whole()
    }

    /// Raises the mark over every event the stored PLog holds above it, as a starting
    /// partition does once actualized and found whole.
    ///
    /// # Errors
    ///
    /// When the PLog cannot be read or the marks file raised; call again later.
    pub fn cover_stored_tail(&mut self) -> Result<(), String> {
        self.writer.cover_stored_tail()
    }

    /// Remembers the keys of the PLog tail the idempotency window spans, as a starting
    /// partition does once actualized.
    ///
    /// # Errors
    ///
    /// When the PLog cannot be read (the keys read before are kept).
    pub fn rebuild_window(&mut self) -> Result<(), String> {
        let from = self.writer.window.start(self.next_offset());
        self.learn(from)
    }

    fn learn(&mut self, from: u64) -> Result<(), String> {
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

    /// Whether the storage refused a write because another node owns the partition now.
    #[must_use]
    pub fn fenced(&self) -> bool {
        self.writer.fenced
    }

    /// Why the partition stopped because its storage lost acknowledged events, if it did.
    #[must_use]
    pub fn lost(&self) -> Option<&str> {
        self.writer.lost.as_deref()
    }

    /// Whether the sequencer stopped because the storage fenced its writes off (another node
    /// owns the partition now).
    #[must_use]
    pub fn sequencer_fenced(&self) -> bool {
        self.writer.seq.handle().stats().poison == Some(monoseq_core::PoisonReason::Fenced)
    }

    /// Why the sequencer failed beyond healing, if it did (the task then rebuilds it: open a
    /// new one).
    #[must_use]
    pub fn failed(&self) -> Option<&str> {
        self.writer.failed.as_deref()
    }
}
