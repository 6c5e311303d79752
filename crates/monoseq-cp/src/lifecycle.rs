//! A partition's lifecycle as a machine without I/O: which step comes next, decided from the
//! results of the steps before. It starts a partition (waits for the sequencer's
//! actualization, answering queued commands meanwhile; checks the stored PLog against the
//! mark; covers the stored tail; rebuilds the idempotency window), serves groups, and after a
//! group stops (fenced, fatal, lost), heals a failed sequencer with bounded backoff, waits for
//! the actualization before retrying innocent commands, reads the PLog back after a failed
//! write before it takes another command, and checks the PLog against the mark again.
//!
//! It calls no storage, spawns nothing, sleeps nowhere and reads no clock: a driver performs
//! each [`Action`] and feeds its result back as an [`Input`]. The partition task
//! (`partition.rs`, on tokio) and the simulator (`ManualPartition`, simulated time) drive this
//! same machine, so a bug in the order of the steps fails a simulation seed. It is consulted
//! once per group, never per command; serving allocates nothing here.

use std::time::Duration;

use monoseq_backoff::Backoff;
use monoseq_core::Busy;

use crate::error::{CommandError, LostEvents, StepError};

/// How long a starting or rebuilt partition waits for its sequencer to finish actualizing
/// before it answers the queued commands and waits again.
pub const ACTUALIZE_WAIT: Duration = Duration::from_secs(1);
/// How long a partition waits for the actualization after a failed group before it retries
/// the group's innocent commands.
pub const RETRY_WAIT: Duration = Duration::from_secs(5);
/// First and longest delay before rebuilding a failed partition.
pub const REBUILD_DELAY_MIN: Duration = Duration::from_millis(20);
/// See [`REBUILD_DELAY_MIN`].
pub const REBUILD_DELAY_MAX: Duration = Duration::from_secs(5);
/// Why a partition refuses commands while it reads back a failed group's write.
const READING_BACK: &str = "reading back a group whose write failed";

/// Whether a partition serves, as the processor reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum PartitionState {
    /// Starting: actualizing and rebuilding its idempotency window.
    Starting,
    /// Serving commands (its sequencer may still answer busy).
    Serving,
    /// Its sequencer failed; being rebuilt.
    Rebuilding {
        /// What failed.
        reason: String,
    },
    /// Stopped.
    Stopped,
    /// The storage refused its writes: another node owns the partition now. Commands answer
    /// [`CommandError::NotOwner`] until the partition is released.
    Fenced,
    /// The storage lost events this partition acknowledged (its PLog now ends before them):
    /// serving would hand their numbers out again, so commands answer
    /// [`CommandError::Corrupted`] until an operator restores the storage.
    Lost {
        /// What was lost.
        reason: String,
    },
    /// The storage failed fatally (its engine is poisoned: no write can succeed until it is
    /// re-opened): commands answer [`CommandError::Storage`] naming the first failure until
    /// the server is restarted.
    Failed {
        /// The first fatal failure, with its causes, and what to do.
        reason: String,
    },
}

/// What the sequencer's actualization came to when the driver stopped waiting for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Actualization {
    /// Not finished yet (or not begun): `corrupted` when the stored data it needs is damaged,
    /// `failing` when the storage fails (from the sequencer's stats).
    Pending {
        /// The stored data the actualization needs is damaged.
        corrupted: bool,
        /// The storage fails the actualization's reads.
        failing: bool,
    },
    /// Actualized: ready for a transaction.
    Ready,
    /// The sequencer stopped; `fenced` when the storage fenced its writes off.
    Stopped {
        /// The storage refused the sequencer's writes: another node owns the partition now.
        fenced: bool,
    },
}

/// How a group left the writer, which answers it for every group: what the partition does
/// before the next one. One outcome per group: when a group meets several troubles the
/// gravest is given (fenced, then fatal, then lost, then a failed sequencer, then a failed
/// write).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GroupOutcome {
    /// Every command was answered (written, replayed or refused one by one): the next group
    /// runs.
    Answered,
    /// The storage refused a write: another node owns the partition now.
    Fenced,
    /// A write failed fatally (the store is poisoned).
    Fatal {
        /// The failure, with its causes.
        causes: String,
    },
    /// The storage lost events this partition acknowledged.
    Lost {
        /// What was lost.
        what: LostEvents,
    },
    /// The group's write failed; it may have landed from PLog offset `unresolved_from` on,
    /// so the PLog is read back from there before any other command is taken.
    Unwritten {
        /// The failed group's first PLog offset.
        unresolved_from: u64,
        /// Innocent commands of the group wait to run again (after the actualization).
        retry: bool,
    },
    /// The sequencer failed beyond healing (or the group's thread was lost): it is rebuilt,
    /// then the PLog is read back from `unresolved_from` when the group's write failed too.
    Failed {
        /// Why.
        why: String,
        /// The failed write's first PLog offset, if a write failed.
        unresolved_from: Option<u64>,
    },
}

/// The result of the step the driver performed, fed back with [`Lifecycle::feed`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Input {
    /// [`Action::WaitActualized`] ended.
    Actualized(Actualization),
    /// [`Action::AnswerQueued`] answered what was queued; `open` is false when the queue is
    /// closed (no one submits anymore).
    Answered {
        /// The queue is still open.
        open: bool,
    },
    /// [`Action::CheckWhole`]: whole, or what was lost.
    Checked(Result<(), LostEvents>),
    /// [`Action::CoverTail`]: covered, or why not.
    Covered(Result<(), StepError>),
    /// [`Action::RebuildWindow`]: rebuilt, or why not.
    WindowRebuilt(Result<(), StepError>),
    /// [`Action::ReadBack`]: read back, or why not.
    ReadBack(Result<(), StepError>),
    /// [`Action::Heal`]: a new sequencer replaces the failed one; `writer_lost` when the
    /// writer was lost too and a new one (with an empty idempotency window) was built.
    Replaced {
        /// A new writer was built around the new sequencer.
        writer_lost: bool,
    },
    /// [`Action::RunGroup`] ran a group.
    Ran(GroupOutcome),
    /// The queue closed (at [`Action::RunGroup`], or after [`Action::Stop`] drained it).
    Closed,
    /// [`Action::Pause`] or [`Action::Healed`] is done.
    Done,
}

/// Why a partition stopped serving.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum End {
    /// The queue closed: the processor stops or released the partition.
    Closed,
    /// Another node owns the partition now.
    Fenced,
    /// The storage failed fatally; the reason says what to do.
    Failed {
        /// The failure, with its causes, and what to do.
        reason: String,
    },
    /// The storage lost events this partition acknowledged.
    Lost {
        /// What was lost.
        reason: String,
    },
}

impl End {
    /// The answer to every command that reaches the partition from now on.
    #[must_use]
    pub fn refusal(&self, partition: u32) -> CommandError {
        match self {
            End::Closed => CommandError::ShuttingDown,
            End::Fenced => CommandError::NotOwner { partition },
            End::Failed { reason } => CommandError::Storage(reason.clone()),
            End::Lost { reason } => CommandError::Corrupted(reason.clone()),
        }
    }

    fn state(&self) -> PartitionState {
        match self {
            End::Closed => PartitionState::Stopped,
            End::Fenced => PartitionState::Fenced,
            End::Failed { reason } => PartitionState::Failed {
                reason: reason.clone(),
            },
            End::Lost { reason } => PartitionState::Lost {
                reason: reason.clone(),
            },
        }
    }
}

/// The next step for the driver to perform.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Wait up to `wait` for the sequencer to finish actualizing (return early when it did or
    /// stopped); feed [`Input::Actualized`].
    WaitActualized {
        /// Longest wait.
        wait: Duration,
    },
    /// Answer every command queued now with this error (the queue is not waited on); feed
    /// [`Input::Answered`].
    AnswerQueued(CommandError),
    /// Check that the stored PLog holds everything up to the mark; feed [`Input::Checked`].
    CheckWhole,
    /// Raise the mark over the stored PLog's tail (attempt `attempt`); feed [`Input::Covered`].
    CoverTail {
        /// 1 for the first attempt.
        attempt: u32,
    },
    /// Wait `delay`, answering every command that arrives with `refuse` when given (else
    /// leaving them queued); feed [`Input::Done`].
    Pause {
        /// How long.
        delay: Duration,
        /// The answer to commands arriving meanwhile.
        refuse: Option<CommandError>,
    },
    /// Remember the idempotency keys of the PLog tail the window spans (attempt `attempt`);
    /// feed [`Input::WindowRebuilt`]. A failing read is retried after a backoff: serving
    /// without the keys would apply a retry of a command in the window a second time.
    RebuildWindow {
        /// 1 for the first attempt.
        attempt: u32,
    },
    /// Read the PLog back from `from` to the actualized end and remember its keys (attempt
    /// `attempt`); on success the writer forgets its unresolved offset. Feed
    /// [`Input::ReadBack`].
    ReadBack {
        /// The failed group's first PLog offset.
        from: u64,
        /// 1 for the first attempt.
        attempt: u32,
    },
    /// The sequencer failed (`reason`): wait `delay` answering arriving commands
    /// "unavailable", then replace the sequencer with a new one on the same storage; feed
    /// [`Input::Replaced`]. Attempt 1 starts the rebuild; a later one follows a failed one.
    Heal {
        /// Why the partition is rebuilt.
        reason: String,
        /// 1 for the first attempt.
        attempt: u32,
        /// The backoff before this attempt.
        delay: Duration,
    },
    /// The rebuild succeeded after `attempts` attempts (count it); feed [`Input::Done`].
    Healed {
        /// Attempts it took.
        attempts: u32,
    },
    /// Take the next group (the retried commands first, else what the queue holds, waiting
    /// for one) and run it; feed [`Input::Ran`], or [`Input::Closed`] when the queue closed.
    RunGroup,
    /// Stop serving: answer the retried commands and every command that arrives with
    /// [`End::refusal`] until the queue closes, then feed [`Input::Closed`].
    Stop(End),
}

/// What to do once a heal succeeded.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Resume {
    /// Continue the start: check the PLog, cover its tail, rebuild the window.
    Start,
    /// Continue after a failed group: read back if a write is unresolved, check the PLog.
    AfterGroup,
    /// Continue reading back from `from`.
    ReadBack { from: u64, attempt: u32 },
}

/// Where a heal is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HealStage {
    /// Waiting out the backoff, then replacing the sequencer.
    Replace,
    /// Waiting for the new sequencer's actualization.
    Actualize,
    /// Rebuilding the window of a writer built anew.
    Window { attempt: u32 },
    /// Rebuilt: counting it.
    Healed,
}

/// After a check of the PLog against the mark.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Then {
    /// Covering the tail (a start).
    Cover,
    /// Covering the tail, then serving (after a read-back: what a failed write left stored
    /// is acknowledged, so followers see it without waiting for the next group).
    CoverAndServe,
    /// Serving.
    Serve,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Phase {
    /// Waiting for the first actualization.
    Starting,
    /// Checking the stored PLog against the mark.
    Check(Then),
    /// Covering the stored tail.
    Cover { attempt: u32, then: Then },
    /// Rebuilding the window at the start.
    Window { attempt: u32 },
    /// Serving groups.
    Serving,
    /// Rebuilding a failed sequencer.
    Healing {
        reason: String,
        attempt: u32,
        writer_lost: bool,
        stage: HealStage,
        resume: Resume,
    },
    /// Waiting for the actualization before retrying a failed group's innocent commands.
    RetryWait,
    /// Reading back a failed group's write: waiting for the actualization (`read` false),
    /// then reading.
    ReadingBack { from: u64, attempt: u32, read: bool },
    /// Stopped serving.
    Stopped(End),
}

/// One partition's lifecycle; see the module's documentation.
#[derive(Debug)]
pub struct Lifecycle {
    partition: u32,
    phase: Phase,
    /// Answer the queued commands with this before the phase's own step.
    answer: Option<CommandError>,
    /// Pause (answering arrivals with the refusal, if any) before the phase's own step.
    pause: Option<(Duration, Option<CommandError>)>,
    /// The first PLog offset of a failed group not read back yet.
    unresolved: Option<u64>,
    /// The PLog was re-read (a heal or a read-back): check it against the mark again.
    reread: bool,
    state: PartitionState,
    /// `state` changed since [`Lifecycle::take_state`].
    changed: bool,
}

fn busy(b: Busy) -> CommandError {
    CommandError::Busy(b.to_string())
}

fn backoff() -> Backoff {
    Backoff::new(REBUILD_DELAY_MIN, REBUILD_DELAY_MAX)
}

impl Lifecycle {
    /// A starting partition, its sequencer actualizing.
    #[must_use]
    pub fn new(partition: u32) -> Lifecycle {
        Lifecycle {
            partition,
            phase: Phase::Starting,
            answer: None,
            pause: None,
            unresolved: None,
            reread: false,
            state: PartitionState::Starting,
            changed: false,
        }
    }

    /// The state the processor reports.
    #[must_use]
    pub fn state(&self) -> &PartitionState {
        &self.state
    }

    /// The state, when it changed since the last call.
    pub fn take_state(&mut self) -> Option<PartitionState> {
        if !self.changed {
            return None;
        }
        self.changed = false;
        Some(self.state.clone())
    }

    /// Still starting: not yet checked against its mark.
    #[must_use]
    pub fn starting(&self) -> bool {
        self.phase == Phase::Starting
    }

    /// Serving groups (nothing to read back, no heal under way).
    #[must_use]
    pub fn serving(&self) -> bool {
        self.phase == Phase::Serving
    }

    /// Why it stopped, once it did.
    #[must_use]
    pub fn ended(&self) -> Option<&End> {
        match &self.phase {
            Phase::Stopped(end) => Some(end),
            _ => None,
        }
    }

    fn set_state(&mut self, state: PartitionState) {
        if self.state != state {
            self.state = state;
            self.changed = true;
        }
    }

    fn unavailable(&self, reason: &str) -> CommandError {
        CommandError::Unavailable {
            partition: self.partition,
            reason: reason.to_owned(),
        }
    }

    /// The next step.
    #[must_use]
    pub fn action(&self) -> Action {
        if let Some(e) = &self.answer {
            return Action::AnswerQueued(e.clone());
        }
        if let Some((delay, refuse)) = &self.pause {
            return Action::Pause {
                delay: *delay,
                refuse: refuse.clone(),
            };
        }
        match &self.phase {
            Phase::Serving => Action::RunGroup,
            Phase::Starting
            | Phase::ReadingBack { read: false, .. }
            | Phase::Healing {
                stage: HealStage::Actualize,
                ..
            } => Action::WaitActualized {
                wait: ACTUALIZE_WAIT,
            },
            Phase::RetryWait => Action::WaitActualized { wait: RETRY_WAIT },
            Phase::Check(_) => Action::CheckWhole,
            Phase::Cover { attempt, .. } => Action::CoverTail { attempt: *attempt },
            Phase::Window { attempt }
            | Phase::Healing {
                stage: HealStage::Window { attempt },
                ..
            } => Action::RebuildWindow { attempt: *attempt },
            Phase::ReadingBack {
                from,
                attempt,
                read: true,
            } => Action::ReadBack {
                from: *from,
                attempt: *attempt,
            },
            Phase::Healing {
                reason,
                attempt,
                stage: HealStage::Replace,
                ..
            } => Action::Heal {
                reason: reason.clone(),
                attempt: *attempt,
                delay: backoff().delay(*attempt),
            },
            Phase::Healing {
                attempt,
                stage: HealStage::Healed,
                ..
            } => Action::Healed { attempts: *attempt },
            Phase::Stopped(end) => Action::Stop(end.clone()),
        }
    }

    /// Feeds the result of the step [`action`](Self::action) asked for.
    pub fn feed(&mut self, event: Input) {
        if self.answer.is_some() {
            self.answer = None;
            if event == (Input::Answered { open: false }) && self.phase == Phase::Starting {
                self.stop(End::Closed);
            }
            return;
        }
        if self.pause.take().is_some() {
            return;
        }
        if event == Input::Closed {
            // The queue closed: nothing more to serve or answer.
            return self.stop(End::Closed);
        }
        match std::mem::replace(&mut self.phase, Phase::Serving) {
            Phase::Starting => self.started(event),
            Phase::Check(then) => self.checked(then, event),
            Phase::Cover { attempt, then } => self.covered(attempt, then, event),
            Phase::Window { attempt } => match self.window_rebuilt(attempt, event) {
                Some(attempt) => self.phase = Phase::Window { attempt },
                None => self.set_state(PartitionState::Serving),
            },
            Phase::Serving => self.ran(event),
            Phase::Healing {
                reason,
                attempt,
                writer_lost,
                stage,
                resume,
            } => self.healing(reason, attempt, writer_lost, stage, resume, event),
            Phase::RetryWait => self.after_retry_wait(),
            Phase::ReadingBack {
                from,
                attempt,
                read,
            } => self.reading_back(from, attempt, read, event),
            Phase::Stopped(end) => self.phase = Phase::Stopped(end),
        }
    }

    fn stop(&mut self, end: End) {
        let state = match &end {
            // Stopped once the queue closes, which it just did.
            End::Closed => PartitionState::Stopped,
            e => e.state(),
        };
        self.set_state(state);
        self.phase = Phase::Stopped(end);
    }

    fn start_heal(&mut self, reason: String, resume: Resume) {
        self.set_state(PartitionState::Rebuilding {
            reason: reason.clone(),
        });
        self.phase = Phase::Healing {
            reason,
            attempt: 1,
            writer_lost: false,
            stage: HealStage::Replace,
            resume,
        };
    }

    fn started(&mut self, event: Input) {
        self.phase = Phase::Starting;
        let Input::Actualized(a) = event else {
            return;
        };
        match a {
            Actualization::Pending { corrupted, failing } => {
                self.answer = Some(if corrupted {
                    CommandError::Corrupted(
                        "stored data this partition needs to actualize is damaged; repair or \
                         restore the store"
                            .into(),
                    )
                } else if failing {
                    busy(Busy::StorageUnavailable)
                } else {
                    busy(Busy::Actualizing)
                });
            }
            Actualization::Ready => self.phase = Phase::Check(Then::Cover),
            Actualization::Stopped { fenced: true } => self.stop(End::Fenced),
            Actualization::Stopped { fenced: false } => {
                self.start_heal(
                    "the sequencer failed while actualizing".into(),
                    Resume::Start,
                );
            }
        }
    }

    fn checked(&mut self, then: Then, event: Input) {
        match event {
            Input::Checked(Err(lost)) => self.stop(End::Lost {
                reason: lost.to_string(),
            }),
            Input::Checked(Ok(())) => match then {
                Then::Cover | Then::CoverAndServe => self.phase = Phase::Cover { attempt: 1, then },
                Then::Serve => self.serve(),
            },
            _ => self.phase = Phase::Check(then),
        }
    }

    fn covered(&mut self, attempt: u32, then: Then, event: Input) {
        match event {
            Input::Covered(Ok(())) if then == Then::CoverAndServe => self.serve(),
            Input::Covered(Ok(())) => self.phase = Phase::Window { attempt: 1 },
            Input::Covered(Err(_)) => {
                self.pause = Some((backoff().delay(attempt), None));
                self.phase = Phase::Cover {
                    attempt: attempt + 1,
                    then,
                };
            }
            _ => self.phase = Phase::Cover { attempt, then },
        }
    }

    /// After a window's rebuild: `None` once rebuilt, else the attempt to make after a backoff
    /// (commands stay queued meanwhile).
    fn window_rebuilt(&mut self, attempt: u32, event: Input) -> Option<u32> {
        match event {
            Input::WindowRebuilt(Ok(())) => None,
            Input::WindowRebuilt(Err(_)) => {
                self.pause = Some((backoff().delay(attempt), None));
                Some(attempt + 1)
            }
            _ => Some(attempt),
        }
    }

    fn serve(&mut self) {
        self.reread = false;
        self.set_state(PartitionState::Serving);
        self.phase = Phase::Serving;
    }

    /// The storage failed fatally (`causes`, whose error says what to do: check the disk,
    /// restart the server): the partition stops.
    fn failed_fatally(&mut self, causes: &str) {
        let reason = format!(
            "the storage failed fatally: {causes}. Partition {} writes nothing more until the \
             server is restarted",
            self.partition
        );
        self.stop(End::Failed { reason });
    }

    fn ran(&mut self, event: Input) {
        let Input::Ran(outcome) = event else {
            return;
        };
        match outcome {
            GroupOutcome::Answered => {}
            GroupOutcome::Fenced => self.stop(End::Fenced),
            GroupOutcome::Fatal { causes } => self.failed_fatally(&causes),
            GroupOutcome::Lost { what } => self.stop(End::Lost {
                reason: what.to_string(),
            }),
            GroupOutcome::Failed {
                why,
                unresolved_from,
            } => {
                self.unresolved = unresolved_from;
                self.reread = true;
                self.start_heal(why, Resume::AfterGroup);
            }
            GroupOutcome::Unwritten {
                unresolved_from,
                retry,
            } => {
                self.unresolved = Some(unresolved_from);
                self.reread = true;
                if retry {
                    self.phase = Phase::RetryWait;
                } else {
                    self.after_retry_wait();
                }
            }
        }
    }

    /// After a failed group (healed, or its retries waited for): read back, then check.
    fn after_retry_wait(&mut self) {
        match self.unresolved {
            Some(from) => self.read_back(from, 1),
            None => self.recheck(),
        }
    }

    fn read_back(&mut self, from: u64, attempt: u32) {
        self.set_state(PartitionState::Rebuilding {
            reason: READING_BACK.into(),
        });
        self.phase = Phase::ReadingBack {
            from,
            attempt,
            read: false,
        };
    }

    /// Serves again, after a check of the PLog against the mark when it was re-read.
    fn recheck(&mut self) {
        if self.reread {
            self.phase = Phase::Check(Then::Serve);
        } else {
            self.serve();
        }
    }

    fn healing(
        &mut self,
        reason: String,
        attempt: u32,
        mut writer_lost: bool,
        stage: HealStage,
        resume: Resume,
        event: Input,
    ) {
        let mut next = stage;
        let mut attempt = attempt;
        match (stage, event) {
            (HealStage::Replace, Input::Replaced { writer_lost: lost }) => {
                writer_lost |= lost;
                if lost {
                    // The new writer knows no failed write: its window is rebuilt instead.
                    self.unresolved = None;
                }
                next = HealStage::Actualize;
            }
            (HealStage::Actualize, Input::Actualized(a)) => match a {
                Actualization::Pending { .. } => self.answer = Some(self.unavailable(&reason)),
                Actualization::Ready if writer_lost => next = HealStage::Window { attempt: 1 },
                Actualization::Ready => next = HealStage::Healed,
                Actualization::Stopped { fenced: true } => return self.stop(End::Fenced),
                Actualization::Stopped { fenced: false } => {
                    attempt += 1;
                    next = HealStage::Replace;
                }
            },
            (HealStage::Window { attempt: window }, event) => {
                next = match self.window_rebuilt(window, event) {
                    Some(window) => HealStage::Window { attempt: window },
                    None => HealStage::Healed,
                };
            }
            (HealStage::Healed, Input::Done) => {
                self.set_state(PartitionState::Serving);
                return match resume {
                    Resume::Start => self.phase = Phase::Check(Then::Cover),
                    Resume::AfterGroup => self.after_retry_wait(),
                    Resume::ReadBack { from, attempt } => self.read_back(from, attempt),
                };
            }
            _ => {}
        }
        self.phase = Phase::Healing {
            reason,
            attempt,
            writer_lost,
            stage: next,
            resume,
        };
    }

    fn reading_back(&mut self, from: u64, attempt: u32, read: bool, event: Input) {
        self.phase = Phase::ReadingBack {
            from,
            attempt,
            read,
        };
        match (read, event) {
            (false, Input::Actualized(a)) => match a {
                Actualization::Pending { .. } => {
                    self.answer = Some(self.unavailable(READING_BACK));
                    self.phase = Phase::ReadingBack {
                        from,
                        attempt: attempt + 1,
                        read: false,
                    };
                }
                Actualization::Ready => {
                    self.phase = Phase::ReadingBack {
                        from,
                        attempt,
                        read: true,
                    };
                }
                Actualization::Stopped { fenced: true } => self.stop(End::Fenced),
                Actualization::Stopped { fenced: false } => self.start_heal(
                    "the sequencer failed after a group write failed".into(),
                    Resume::ReadBack {
                        from,
                        attempt: attempt + 1,
                    },
                ),
            },
            (true, Input::ReadBack(Ok(()))) => {
                self.unresolved = None;
                // What landed of the failed write is stored and read back: acknowledged, so
                // that followers see it without waiting for the next group.
                self.phase = Phase::Check(Then::CoverAndServe);
            }
            (true, Input::ReadBack(Err(StepError::Fatal(causes)))) => {
                self.failed_fatally(&causes);
            }
            (true, Input::ReadBack(Err(_))) => {
                self.pause = Some((
                    backoff().delay(attempt),
                    Some(self.unavailable(READING_BACK)),
                ));
                self.phase = Phase::ReadingBack {
                    from,
                    attempt: attempt + 1,
                    read: false,
                };
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PENDING: Actualization = Actualization::Pending {
        corrupted: false,
        failing: false,
    };

    /// A partition started and serving.
    fn serving() -> Lifecycle {
        let mut lc = Lifecycle::new(3);
        lc.feed(Input::Actualized(Actualization::Ready));
        assert_eq!(lc.action(), Action::CheckWhole);
        lc.feed(Input::Checked(Ok(())));
        assert_eq!(lc.action(), Action::CoverTail { attempt: 1 });
        lc.feed(Input::Covered(Ok(())));
        assert_eq!(lc.action(), Action::RebuildWindow { attempt: 1 });
        lc.feed(Input::WindowRebuilt(Ok(())));
        assert_eq!(lc.action(), Action::RunGroup);
        assert_eq!(lc.take_state(), Some(PartitionState::Serving));
        lc
    }

    fn failed_write(from: u64) -> GroupOutcome {
        GroupOutcome::Unwritten {
            unresolved_from: from,
            retry: true,
        }
    }

    fn lost() -> LostEvents {
        LostEvents {
            partition: 3,
            acked: 9,
            end: 5,
        }
    }

    fn read_failed() -> StepError {
        StepError::Read("read failed".into())
    }

    #[test]
    fn a_start_waits_for_the_actualization_then_checks_covers_and_rebuilds_before_serving() {
        let mut lc = Lifecycle::new(3);
        assert_eq!(
            lc.action(),
            Action::WaitActualized {
                wait: ACTUALIZE_WAIT
            }
        );
        lc.feed(Input::Actualized(PENDING));
        assert_eq!(
            lc.action(),
            Action::AnswerQueued(busy(Busy::Actualizing)),
            "commands queued while it actualizes are answered busy"
        );
        lc.feed(Input::Answered { open: true });
        assert!(lc.starting());
        assert!(matches!(lc.action(), Action::WaitActualized { .. }));
        let lc = serving();
        assert!(lc.serving());
    }

    #[test]
    fn a_start_answers_corrupted_or_storage_unavailable_by_what_the_actualization_meets() {
        let mut lc = Lifecycle::new(3);
        lc.feed(Input::Actualized(Actualization::Pending {
            corrupted: true,
            failing: true,
        }));
        assert!(matches!(
            lc.action(),
            Action::AnswerQueued(CommandError::Corrupted(_))
        ));
        lc.feed(Input::Answered { open: true });
        lc.feed(Input::Actualized(Actualization::Pending {
            corrupted: false,
            failing: true,
        }));
        assert_eq!(
            lc.action(),
            Action::AnswerQueued(busy(Busy::StorageUnavailable))
        );
    }

    #[test]
    fn a_start_stops_when_the_queue_closes_while_it_actualizes() {
        let mut lc = Lifecycle::new(3);
        lc.feed(Input::Actualized(PENDING));
        lc.feed(Input::Answered { open: false });
        assert_eq!(lc.action(), Action::Stop(End::Closed));
        assert_eq!(lc.take_state(), Some(PartitionState::Stopped));
    }

    #[test]
    fn a_start_below_the_mark_is_refused_as_lost() {
        let mut lc = Lifecycle::new(3);
        lc.feed(Input::Actualized(Actualization::Ready));
        lc.feed(Input::Checked(Err(lost())));
        let end = End::Lost {
            reason: lost().to_string(),
        };
        assert_eq!(lc.action(), Action::Stop(end.clone()));
        assert_eq!(
            end.refusal(3),
            CommandError::Corrupted(lost().to_string()),
            "every later command is refused as corrupted"
        );
        assert!(matches!(lc.take_state(), Some(PartitionState::Lost { .. })));
    }

    #[test]
    fn a_start_fenced_while_actualizing_stops_as_not_owner() {
        let mut lc = Lifecycle::new(3);
        lc.feed(Input::Actualized(Actualization::Stopped { fenced: true }));
        assert_eq!(lc.action(), Action::Stop(End::Fenced));
        assert_eq!(
            End::Fenced.refusal(3),
            CommandError::NotOwner { partition: 3 }
        );
        assert_eq!(lc.take_state(), Some(PartitionState::Fenced));
    }

    #[test]
    fn a_failing_cover_of_the_tail_is_retried_after_a_backoff_without_refusing() {
        let mut lc = Lifecycle::new(3);
        lc.feed(Input::Actualized(Actualization::Ready));
        lc.feed(Input::Checked(Ok(())));
        lc.feed(Input::Covered(Err(read_failed())));
        assert_eq!(
            lc.action(),
            Action::Pause {
                delay: backoff().delay(1),
                refuse: None
            }
        );
        lc.feed(Input::Done);
        assert_eq!(lc.action(), Action::CoverTail { attempt: 2 });
        lc.feed(Input::Covered(Ok(())));
        assert_eq!(
            lc.action(),
            Action::RebuildWindow { attempt: 1 },
            "the window after the tail"
        );
        lc.feed(Input::WindowRebuilt(Err(read_failed())));
        assert_eq!(
            lc.action(),
            Action::Pause {
                delay: backoff().delay(1),
                refuse: None
            },
            "a failed rebuild of the window is retried: serving without it would apply a \
             retry twice"
        );
        lc.feed(Input::Done);
        assert_eq!(lc.action(), Action::RebuildWindow { attempt: 2 });
        lc.feed(Input::WindowRebuilt(Ok(())));
        assert_eq!(lc.action(), Action::RunGroup);
    }

    #[test]
    fn a_sequencer_failing_while_it_starts_is_healed_then_the_start_goes_on() {
        let mut lc = Lifecycle::new(3);
        lc.feed(Input::Actualized(Actualization::Stopped { fenced: false }));
        assert!(matches!(
            lc.take_state(),
            Some(PartitionState::Rebuilding { .. })
        ));
        assert!(matches!(lc.action(), Action::Heal { attempt: 1, .. }));
        lc.feed(Input::Replaced { writer_lost: false });
        lc.feed(Input::Actualized(Actualization::Ready));
        assert_eq!(lc.action(), Action::Healed { attempts: 1 });
        lc.feed(Input::Done);
        assert_eq!(lc.action(), Action::CheckWhole);
    }

    #[test]
    fn a_clean_group_keeps_serving() {
        let mut lc = serving();
        lc.feed(Input::Ran(GroupOutcome::Answered));
        assert_eq!(lc.action(), Action::RunGroup);
        assert_eq!(lc.take_state(), None);
    }

    #[test]
    fn a_group_fenced_fatal_or_lost_stops_the_partition() {
        let mut lc = serving();
        lc.feed(Input::Ran(GroupOutcome::Fenced));
        assert_eq!(lc.action(), Action::Stop(End::Fenced));
        let mut lc = serving();
        lc.feed(Input::Ran(GroupOutcome::Fatal {
            causes: "poisoned".into(),
        }));
        let Action::Stop(End::Failed { reason }) = lc.action() else {
            panic!(
                "a fatal write stops the partition as failed: {:?}",
                lc.action()
            );
        };
        assert!(
            reason.contains("poisoned") && reason.contains("restarted"),
            "{reason}"
        );
        let mut lc = serving();
        lc.feed(Input::Ran(GroupOutcome::Lost { what: lost() }));
        assert_eq!(
            lc.action(),
            Action::Stop(End::Lost {
                reason: lost().to_string()
            })
        );
        lc.feed(Input::Closed);
        assert_eq!(lc.take_state(), Some(PartitionState::Stopped));
    }

    #[test]
    fn a_failed_write_waits_for_the_actualization_then_reads_back_before_any_command() {
        let mut lc = serving();
        lc.feed(Input::Ran(failed_write(40)));
        assert_eq!(lc.action(), Action::WaitActualized { wait: RETRY_WAIT });
        lc.feed(Input::Actualized(Actualization::Ready));
        assert!(matches!(lc.action(), Action::WaitActualized { .. }));
        assert!(!lc.serving());
        lc.feed(Input::Actualized(PENDING));
        assert!(
            matches!(
                lc.action(),
                Action::AnswerQueued(CommandError::Unavailable { .. })
            ),
            "commands are refused until the write is read back"
        );
        lc.feed(Input::Answered { open: true });
        lc.feed(Input::Actualized(Actualization::Ready));
        assert_eq!(
            lc.action(),
            Action::ReadBack {
                from: 40,
                attempt: 2
            }
        );
        lc.feed(Input::ReadBack(Err(read_failed())));
        assert!(matches!(
            lc.action(),
            Action::Pause {
                refuse: Some(CommandError::Unavailable { .. }),
                ..
            }
        ));
        lc.feed(Input::Done);
        lc.feed(Input::Actualized(Actualization::Ready));
        assert_eq!(
            lc.action(),
            Action::ReadBack {
                from: 40,
                attempt: 3
            }
        );
        lc.feed(Input::ReadBack(Ok(())));
        assert_eq!(
            lc.action(),
            Action::CheckWhole,
            "the re-read PLog is checked against the mark"
        );
        lc.feed(Input::Checked(Ok(())));
        assert_eq!(
            lc.action(),
            Action::CoverTail { attempt: 1 },
            "what the failed write left stored is acknowledged before serving"
        );
        lc.feed(Input::Covered(Err(StepError::Raise("sync failed".into()))));
        assert!(matches!(lc.action(), Action::Pause { refuse: None, .. }));
        lc.feed(Input::Done);
        assert_eq!(lc.action(), Action::CoverTail { attempt: 2 });
        lc.feed(Input::Covered(Ok(())));
        assert_eq!(
            lc.action(),
            Action::RunGroup,
            "no window rebuild: the read-back learned its keys"
        );
        assert_eq!(lc.take_state(), Some(PartitionState::Serving));
    }

    #[test]
    fn a_read_back_found_below_the_mark_stops_as_lost() {
        let mut lc = serving();
        lc.feed(Input::Ran(GroupOutcome::Unwritten {
            unresolved_from: 7,
            retry: false,
        }));
        lc.feed(Input::Actualized(Actualization::Ready));
        lc.feed(Input::ReadBack(Ok(())));
        lc.feed(Input::Checked(Err(lost())));
        assert_eq!(
            lc.action(),
            Action::Stop(End::Lost {
                reason: lost().to_string()
            })
        );
    }

    #[test]
    fn a_failed_write_without_commands_to_retry_reads_back_at_once() {
        let mut lc = serving();
        lc.feed(Input::Ran(GroupOutcome::Unwritten {
            unresolved_from: 7,
            retry: false,
        }));
        assert_eq!(
            lc.action(),
            Action::WaitActualized {
                wait: ACTUALIZE_WAIT
            },
            "no wait for retries: the read-back waits for the actualization itself"
        );
        assert!(matches!(
            lc.take_state(),
            Some(PartitionState::Rebuilding { .. })
        ));
        lc.feed(Input::Actualized(Actualization::Ready));
        assert_eq!(
            lc.action(),
            Action::ReadBack {
                from: 7,
                attempt: 1
            }
        );
    }

    /// A read-back that finds the storage failed fatally (the PLog poisoned by a failed flush
    /// of another partition's cycle) stops the partition as failed, as a fatal group write
    /// does, rather than retrying a read-back that cannot succeed until a restart.
    #[test]
    fn a_read_back_that_finds_the_storage_failed_fatally_stops_the_partition() {
        let mut lc = serving();
        lc.feed(Input::Ran(GroupOutcome::Unwritten {
            unresolved_from: 7,
            retry: false,
        }));
        lc.feed(Input::Actualized(Actualization::Ready));
        assert!(matches!(lc.action(), Action::ReadBack { .. }));
        lc.feed(Input::ReadBack(Err(StepError::Fatal("poisoned".into()))));
        let Action::Stop(End::Failed { reason }) = lc.action() else {
            panic!("a fatal read-back stops the partition: {:?}", lc.action());
        };
        assert!(reason.contains("poisoned"), "{reason}");
        assert!(reason.contains("restarted"), "{reason}");
    }

    #[test]
    fn a_failed_sequencer_is_healed_with_backoff_then_read_back_and_checked() {
        let mut lc = serving();
        lc.feed(Input::Ran(GroupOutcome::Failed {
            why: "sequencer poisoned".into(),
            unresolved_from: Some(12),
        }));
        assert_eq!(
            lc.take_state(),
            Some(PartitionState::Rebuilding {
                reason: "sequencer poisoned".into()
            })
        );
        for attempt in 1..=3 {
            assert_eq!(
                lc.action(),
                Action::Heal {
                    reason: "sequencer poisoned".into(),
                    attempt,
                    delay: backoff().delay(attempt)
                }
            );
            lc.feed(Input::Replaced { writer_lost: false });
            lc.feed(Input::Actualized(PENDING));
            assert!(matches!(
                lc.action(),
                Action::AnswerQueued(CommandError::Unavailable { .. })
            ));
            lc.feed(Input::Answered { open: false });
            if attempt < 3 {
                lc.feed(Input::Actualized(Actualization::Stopped { fenced: false }));
            }
        }
        lc.feed(Input::Actualized(Actualization::Ready));
        assert_eq!(lc.action(), Action::Healed { attempts: 3 });
        lc.feed(Input::Done);
        assert!(matches!(lc.action(), Action::WaitActualized { .. }));
        lc.feed(Input::Actualized(Actualization::Ready));
        assert_eq!(
            lc.action(),
            Action::ReadBack {
                from: 12,
                attempt: 1
            }
        );
    }

    #[test]
    fn a_heal_that_lost_its_writer_rebuilds_the_window_before_serving() {
        let mut lc = serving();
        lc.feed(Input::Ran(GroupOutcome::Failed {
            why: "a group's thread was lost".into(),
            unresolved_from: Some(12),
        }));
        lc.feed(Input::Replaced { writer_lost: true });
        lc.feed(Input::Actualized(Actualization::Ready));
        assert_eq!(lc.action(), Action::RebuildWindow { attempt: 1 });
        lc.feed(Input::WindowRebuilt(Err(read_failed())));
        lc.feed(Input::Done);
        assert_eq!(lc.action(), Action::RebuildWindow { attempt: 2 });
        lc.feed(Input::WindowRebuilt(Ok(())));
        assert_eq!(lc.action(), Action::Healed { attempts: 1 });
        lc.feed(Input::Done);
        assert_eq!(
            lc.action(),
            Action::CheckWhole,
            "the new writer knows no failed write: checked, not read back"
        );
    }

    #[test]
    fn a_heal_fenced_off_stops_as_not_owner() {
        let mut lc = serving();
        lc.feed(Input::Ran(GroupOutcome::Failed {
            why: "x".into(),
            unresolved_from: None,
        }));
        lc.feed(Input::Replaced { writer_lost: false });
        lc.feed(Input::Actualized(Actualization::Stopped { fenced: true }));
        assert_eq!(lc.action(), Action::Stop(End::Fenced));
    }

    #[test]
    fn a_sequencer_failing_during_a_read_back_is_healed_and_the_read_back_goes_on() {
        let mut lc = serving();
        lc.feed(Input::Ran(GroupOutcome::Unwritten {
            unresolved_from: 5,
            retry: false,
        }));
        lc.feed(Input::Actualized(Actualization::Stopped { fenced: false }));
        assert!(matches!(lc.action(), Action::Heal { attempt: 1, .. }));
        lc.feed(Input::Replaced { writer_lost: false });
        lc.feed(Input::Actualized(Actualization::Ready));
        lc.feed(Input::Done);
        assert_eq!(
            lc.take_state(),
            Some(PartitionState::Rebuilding {
                reason: READING_BACK.into()
            })
        );
        lc.feed(Input::Actualized(Actualization::Ready));
        assert_eq!(
            lc.action(),
            Action::ReadBack {
                from: 5,
                attempt: 2
            }
        );
        lc.feed(Input::Actualized(Actualization::Stopped { fenced: true }));
        assert!(
            matches!(lc.action(), Action::ReadBack { .. }),
            "an event the step did not ask for changes nothing"
        );
    }

    #[test]
    fn a_closed_queue_while_serving_stops_it() {
        let mut lc = serving();
        lc.feed(Input::Closed);
        assert_eq!(lc.action(), Action::Stop(End::Closed));
        assert_eq!(End::Closed.refusal(3), CommandError::ShuttingDown);
    }
}
