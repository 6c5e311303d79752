//! [`Serving`]: what a node does with the partitions its [`Membership`](crate::Membership)
//! gives it, as a step function beside it. A partition to serve first has the peers' marks
//! pulled (so its mark includes what former owners acknowledged), then its accepted losses
//! settled (a loss accepted after this run started holds it until a restart; a storage failure
//! retiring the lost numbers is retried with [`SETTLE_BACKOFF`] while the lease is held here),
//! and only then starts, unless the membership stopped it meanwhile. A stop releases it at
//! once; a drain stops taking commands, waits until the partition is idle or
//! [`DRAIN_MS_MAX`] passed, and reports to the membership; a fenced partition is reported to
//! the membership once.
//!
//! Like the membership it does no I/O and reads no clock: the caller gives the time, performs
//! each [`ServingAction`] (pull, settle, start, stop, drain, hold for readiness) and feeds what
//! came of it back ([`Serving::marks_pulled`], [`Serving::settled`], [`Serving::idle`],
//! [`Serving::fenced`]). The node on tokio and the simulated node drive this same machine.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use monoseq_backoff::Backoff;

/// Longest a drained partition may take to finish its queued commands and flush before it is
/// reported not drained (its lease is then left to expire rather than released); also how
/// long a stopped partition's queued commands are waited for.
pub const DRAIN_MS_MAX: u64 = 5_000;

/// Retries of a failed settle (retiring an accepted loss's numbers): 100 ms after the first
/// failure, doubling, at most 5 s apart.
pub const SETTLE_BACKOFF: Backoff =
    Backoff::new(Duration::from_millis(100), Duration::from_secs(5));

/// What came of settling a partition's accepted losses ([`ServingAction::Settle`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Settled {
    /// Every accepted loss is known to this run and its numbers are retired in the storage:
    /// the partition may start.
    Done,
    /// A loss was accepted after this run started: the partition is not served until the node
    /// restarts (why, for the log and readiness).
    Refused(String),
    /// The storage failed to retire an accepted loss's numbers: tried again (why).
    Failed(String),
}

/// A retry of a failed settle, for the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retry {
    /// Failures so far (1 for the first).
    pub attempt: u32,
    /// Milliseconds until the next try.
    pub in_ms: u64,
}

/// What the caller does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServingAction {
    /// Pull the marks of the other live nodes into this node's, then call
    /// [`Serving::marks_pulled`].
    PullMarks {
        /// The partition that waits for them.
        partition: u32,
        /// Its epoch.
        epoch: u64,
    },
    /// Settle the partition's accepted losses, then call [`Serving::settled`].
    Settle {
        /// The partition.
        partition: u32,
        /// Its epoch (its writes are fenced with it).
        epoch: u64,
    },
    /// Start serving the partition now, every write fenced with `epoch`.
    Start {
        /// The partition.
        partition: u32,
        /// Its epoch.
        epoch: u64,
        /// Who held it last, if anyone (from the membership's serve).
        previous: Option<String>,
    },
    /// Stop serving the partition now: its commands are answered "not the owner" from now on,
    /// and the queued ones finish within [`DRAIN_MS_MAX`] (nobody waits for them).
    Stop {
        /// The partition.
        partition: u32,
    },
    /// Stop taking commands for the partition, let it finish its queued ones and flush, and
    /// call [`Serving::idle`] once it has; past `deadline` it is reported not drained.
    Drain {
        /// The partition.
        partition: u32,
        /// Its epoch.
        epoch: u64,
        /// When the drain gives up (the caller's time).
        deadline: u64,
    },
    /// Tell the membership the partition is drained ([`crate::Membership::drained`]); it is no
    /// longer served here (`ok`: it finished; else it did not in time and whatever is left
    /// of it stops now).
    Drained {
        /// The partition.
        partition: u32,
        /// Its epoch.
        epoch: u64,
        /// It finished its queued commands and flushed.
        ok: bool,
    },
    /// Tell the membership the storage refused a write of the partition under its epoch
    /// ([`crate::Membership::fenced`]).
    Fenced {
        /// The partition.
        partition: u32,
    },
    /// The partition is leased here but not served, for `why` (readiness names it until
    /// [`ServingAction::Unhold`]); log it as an error.
    Hold {
        /// The partition.
        partition: u32,
        /// Its epoch.
        epoch: u64,
        /// Why.
        why: String,
        /// When it is tried again (a failed settle), if it is.
        retry: Option<Retry>,
    },
    /// The partition is no longer held for the reason given with [`ServingAction::Hold`].
    Unhold {
        /// The partition.
        partition: u32,
    },
}

/// Where a partition given to this node is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// The peers' marks are being pulled.
    Pulling,
    /// Its losses are being settled (after `failures` failed settles).
    Settling { failures: u32 },
    /// A loss accepted after this run started: held until the node restarts.
    Refused,
    /// Its last settle failed (`failures` in a row): settled again at `retry_at`.
    Waiting { failures: u32, retry_at: u64 },
    /// Started (the caller may have failed to start it: a drain then ends at once).
    Serving,
    /// Taking no commands, finishing its queued ones until `deadline`.
    Draining { deadline: u64 },
}

/// A partition the membership gave this node and did not take back yet.
#[derive(Debug, Clone)]
struct Part {
    epoch: u64,
    previous: Option<String>,
    phase: Phase,
    /// A [`ServingAction::Hold`] was given and not undone.
    held: bool,
    /// Its fencing was reported to the membership.
    fenced: bool,
}

/// The serving, settling and draining of one node's partitions.
#[derive(Debug, Default)]
pub struct Serving {
    parts: BTreeMap<u32, Part>,
    out: VecDeque<ServingAction>,
}

impl Serving {
    /// A node serving nothing yet.
    #[must_use]
    pub fn new() -> Serving {
        Serving::default()
    }

    /// The membership asks to serve `partition` under `epoch` ([`crate::Action::Serve`]): the
    /// peers' marks are pulled first.
    pub fn serve(&mut self, _now: u64, partition: u32, epoch: u64, previous: Option<String>) {
        self.forget(partition);
        self.parts.insert(
            partition,
            Part {
                epoch,
                previous,
                phase: Phase::Pulling,
                held: false,
                fenced: false,
            },
        );
        self.out
            .push_back(ServingAction::PullMarks { partition, epoch });
    }

    /// The membership stops `partition` ([`crate::Action::Stop`]): whatever was under way for
    /// it is dropped (a settle's or pull's answer for it is ignored), and it stops now.
    pub fn stop(&mut self, _now: u64, partition: u32) {
        self.forget(partition);
        self.out.push_back(ServingAction::Stop { partition });
    }

    /// The membership hands `partition` off ([`crate::Action::Drain`]): a started partition
    /// finishes its queued commands within [`DRAIN_MS_MAX`]; one not started yet has nothing
    /// to finish and is drained at once.
    pub fn drain(&mut self, now: u64, partition: u32, epoch: u64) {
        let started = self.parts.get(&partition).map(|p| p.phase);
        match started {
            Some(Phase::Draining { .. }) => {}
            Some(Phase::Serving) => {
                let deadline = now.saturating_add(DRAIN_MS_MAX);
                if let Some(part) = self.parts.get_mut(&partition) {
                    part.phase = Phase::Draining { deadline };
                }
                self.out.push_back(ServingAction::Drain {
                    partition,
                    epoch,
                    deadline,
                });
            }
            _ => {
                self.forget(partition);
                self.out.push_back(ServingAction::Drained {
                    partition,
                    epoch,
                    ok: true,
                });
            }
        }
    }

    /// The peers' marks were pulled for `partition` under `epoch` ([`ServingAction::PullMarks`]):
    /// its losses are settled next.
    pub fn marks_pulled(&mut self, _now: u64, partition: u32, epoch: u64) {
        if let Some(part) = self.current(partition, epoch)
            && part.phase == Phase::Pulling
        {
            part.phase = Phase::Settling { failures: 0 };
            self.out
                .push_back(ServingAction::Settle { partition, epoch });
        }
    }

    /// What came of settling `partition` under `epoch` ([`ServingAction::Settle`]); an answer
    /// for an epoch the membership has since stopped is ignored.
    pub fn settled(&mut self, now: u64, partition: u32, epoch: u64, settled: Settled) {
        let Some(part) = self.current(partition, epoch) else {
            return;
        };
        let Phase::Settling { failures } = part.phase else {
            return;
        };
        let (why, retry) = match settled {
            Settled::Done => {
                part.phase = Phase::Serving;
                let previous = part.previous.clone();
                if std::mem::take(&mut part.held) {
                    self.out.push_back(ServingAction::Unhold { partition });
                }
                self.out.push_back(ServingAction::Start {
                    partition,
                    epoch,
                    previous,
                });
                return;
            }
            Settled::Refused(why) => {
                part.phase = Phase::Refused;
                (why, None)
            }
            Settled::Failed(why) => {
                let failures = failures.saturating_add(1);
                let wait = SETTLE_BACKOFF.delay(failures);
                let in_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX);
                part.phase = Phase::Waiting {
                    failures,
                    retry_at: now.saturating_add(in_ms),
                };
                let retry = Retry {
                    attempt: failures,
                    in_ms,
                };
                (why, Some(retry))
            }
        };
        part.held = true;
        self.out.push_back(ServingAction::Hold {
            partition,
            epoch,
            why,
            retry,
        });
    }

    /// `partition`, draining under `epoch`, finished its queued commands and flushed: it is
    /// reported drained.
    pub fn idle(&mut self, _now: u64, partition: u32, epoch: u64) {
        if let Some(part) = self.current(partition, epoch)
            && matches!(part.phase, Phase::Draining { .. })
        {
            self.forget(partition);
            self.out.push_back(ServingAction::Drained {
                partition,
                epoch,
                ok: true,
            });
        }
    }

    /// The storage refused a write of `partition` (another node took it over): reported to the
    /// membership once, which stops it.
    pub fn fenced(&mut self, _now: u64, partition: u32) {
        if let Some(part) = self.parts.get_mut(&partition)
            && matches!(part.phase, Phase::Serving | Phase::Draining { .. })
            && !part.fenced
        {
            part.fenced = true;
            self.out.push_back(ServingAction::Fenced { partition });
        }
    }

    /// The next action at `now`, if any; call until it answers `None`, and again by
    /// [`Serving::next_wake`].
    pub fn poll(&mut self, now: u64) -> Option<ServingAction> {
        if let Some(a) = self.out.pop_front() {
            return Some(a);
        }
        let due: Vec<(u32, u64, Phase)> = self
            .parts
            .iter()
            .filter(|(_, part)| due(part.phase).is_some_and(|at| now >= at))
            .map(|(p, part)| (*p, part.epoch, part.phase))
            .collect();
        for (partition, epoch, phase) in due {
            match phase {
                Phase::Waiting { failures, .. } => {
                    if let Some(part) = self.parts.get_mut(&partition) {
                        part.phase = Phase::Settling { failures };
                    }
                    self.out
                        .push_back(ServingAction::Settle { partition, epoch });
                }
                _ => {
                    self.forget(partition);
                    self.out.push_back(ServingAction::Drained {
                        partition,
                        epoch,
                        ok: false,
                    });
                }
            }
        }
        self.out.pop_front()
    }

    /// When [`Serving::poll`] next has something to do if nothing else happens (`u64::MAX`:
    /// never).
    #[must_use]
    pub fn next_wake(&self) -> u64 {
        if !self.out.is_empty() {
            return 0;
        }
        self.parts
            .values()
            .filter_map(|part| due(part.phase))
            .min()
            .unwrap_or(u64::MAX)
    }

    /// Whether `partition` is started here and takes commands (not draining).
    #[must_use]
    pub fn serves(&self, partition: u32) -> bool {
        self.parts
            .get(&partition)
            .is_some_and(|part| part.phase == Phase::Serving)
    }

    /// Whether `partition` is draining here.
    #[must_use]
    pub fn draining(&self, partition: u32) -> bool {
        self.parts
            .get(&partition)
            .is_some_and(|part| matches!(part.phase, Phase::Draining { .. }))
    }

    /// `partition` if it is given to this node under `epoch`.
    fn current(&mut self, partition: u32, epoch: u64) -> Option<&mut Part> {
        self.parts
            .get_mut(&partition)
            .filter(|part| part.epoch == epoch)
    }

    /// `partition` is no longer to be served here; a hold of it is undone.
    fn forget(&mut self, partition: u32) {
        if self.parts.remove(&partition).is_some_and(|part| part.held) {
            self.out.push_back(ServingAction::Unhold { partition });
        }
    }
}

/// When a partition in `phase` has something due without an event: a settle's retry, a
/// drain's deadline.
fn due(phase: Phase) -> Option<u64> {
    match phase {
        Phase::Waiting { retry_at, .. } => Some(retry_at),
        Phase::Draining { deadline } => Some(deadline),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain_all(s: &mut Serving, now: u64) -> Vec<ServingAction> {
        std::iter::from_fn(|| s.poll(now)).collect()
    }

    fn pull(partition: u32, epoch: u64) -> ServingAction {
        ServingAction::PullMarks { partition, epoch }
    }

    fn settle(partition: u32, epoch: u64) -> ServingAction {
        ServingAction::Settle { partition, epoch }
    }

    fn start(partition: u32, epoch: u64) -> ServingAction {
        ServingAction::Start {
            partition,
            epoch,
            previous: None,
        }
    }

    fn drained(partition: u32, epoch: u64, ok: bool) -> ServingAction {
        ServingAction::Drained {
            partition,
            epoch,
            ok,
        }
    }

    /// A node serving partition 0 under epoch 1, started at 10.
    fn serving() -> Serving {
        let mut s = Serving::new();
        s.serve(0, 0, 1, None);
        s.marks_pulled(5, 0, 1);
        s.settled(10, 0, 1, Settled::Done);
        drain_all(&mut s, 10);
        s
    }

    #[test]
    fn a_partition_starts_only_after_its_marks_are_pulled_and_its_losses_settled() {
        let mut s = Serving::new();
        s.serve(0, 3, 7, Some("b".into()));
        assert_eq!(drain_all(&mut s, 0), [pull(3, 7)]);
        s.settled(1, 3, 7, Settled::Done);
        assert_eq!(
            drain_all(&mut s, 1),
            [],
            "no settle answer counts before the pull"
        );
        s.marks_pulled(2, 3, 7);
        assert_eq!(drain_all(&mut s, 2), [settle(3, 7)]);
        assert!(!s.serves(3));
        s.settled(3, 3, 7, Settled::Done);
        let started = ServingAction::Start {
            partition: 3,
            epoch: 7,
            previous: Some("b".into()),
        };
        assert_eq!(drain_all(&mut s, 3), [started]);
        assert!(s.serves(3));
    }

    #[test]
    fn a_loss_accepted_after_the_start_holds_the_partition_without_retrying() {
        let mut s = Serving::new();
        s.serve(0, 0, 1, None);
        s.marks_pulled(0, 0, 1);
        drain_all(&mut s, 0);
        s.settled(1, 0, 1, Settled::Refused("restart".into()));
        let hold = ServingAction::Hold {
            partition: 0,
            epoch: 1,
            why: "restart".into(),
            retry: None,
        };
        assert_eq!(drain_all(&mut s, 1), [hold]);
        assert_eq!(s.next_wake(), u64::MAX, "nothing is tried again");
        assert_eq!(drain_all(&mut s, 1_000_000), []);
        assert!(!s.serves(0));
        s.stop(2_000_000, 0);
        let stop = ServingAction::Stop { partition: 0 };
        assert_eq!(
            drain_all(&mut s, 2_000_000),
            [ServingAction::Unhold { partition: 0 }, stop]
        );
    }

    #[test]
    fn a_failed_settle_is_held_and_retried_with_backoff_then_starts() {
        let mut s = Serving::new();
        s.serve(0, 0, 1, None);
        s.marks_pulled(0, 0, 1);
        drain_all(&mut s, 0);
        let mut now = 0;
        for (attempt, in_ms) in [(1, 100), (2, 200), (3, 400)] {
            s.settled(now, 0, 1, Settled::Failed("db down".into()));
            let hold = ServingAction::Hold {
                partition: 0,
                epoch: 1,
                why: "db down".into(),
                retry: Some(Retry { attempt, in_ms }),
            };
            assert_eq!(drain_all(&mut s, now), [hold]);
            assert_eq!(s.next_wake(), now + in_ms);
            assert_eq!(
                drain_all(&mut s, now + in_ms - 1),
                [],
                "not before its time"
            );
            now += in_ms;
            assert_eq!(drain_all(&mut s, now), [settle(0, 1)]);
        }
        s.settled(now, 0, 1, Settled::Done);
        let unhold = ServingAction::Unhold { partition: 0 };
        assert_eq!(drain_all(&mut s, now), [unhold, start(0, 1)]);
    }

    #[test]
    fn the_settle_backoff_stops_growing_at_five_seconds() {
        assert_eq!(SETTLE_BACKOFF.delay(30), Duration::from_secs(5));
    }

    #[test]
    fn a_settle_answer_for_a_stopped_epoch_starts_nothing() {
        let mut s = Serving::new();
        s.serve(0, 0, 1, None);
        s.marks_pulled(0, 0, 1);
        drain_all(&mut s, 0);
        s.stop(1, 0);
        s.settled(2, 0, 1, Settled::Done);
        let stop = ServingAction::Stop { partition: 0 };
        assert_eq!(drain_all(&mut s, 2), [stop]);
        s.serve(3, 0, 2, None);
        s.marks_pulled(3, 0, 2);
        drain_all(&mut s, 3);
        s.settled(4, 0, 1, Settled::Done);
        s.marks_pulled(4, 0, 1);
        assert_eq!(drain_all(&mut s, 4), [], "epoch 1's answers are stale");
        s.settled(5, 0, 2, Settled::Done);
        assert_eq!(drain_all(&mut s, 5), [start(0, 2)]);
    }

    #[test]
    fn a_partition_stopped_while_its_settle_waits_to_retry_is_not_settled_again() {
        let mut s = Serving::new();
        s.serve(0, 0, 1, None);
        s.marks_pulled(0, 0, 1);
        drain_all(&mut s, 0);
        s.settled(0, 0, 1, Settled::Failed("db down".into()));
        drain_all(&mut s, 0);
        s.stop(50, 0);
        let unhold = ServingAction::Unhold { partition: 0 };
        let stop = ServingAction::Stop { partition: 0 };
        assert_eq!(drain_all(&mut s, 50), [unhold, stop]);
        assert_eq!(s.next_wake(), u64::MAX);
        assert_eq!(drain_all(&mut s, 10_000), []);
    }

    #[test]
    fn a_drained_partition_is_reported_once_it_is_idle() {
        let mut s = serving();
        s.drain(100, 0, 1);
        let drain = ServingAction::Drain {
            partition: 0,
            epoch: 1,
            deadline: 100 + DRAIN_MS_MAX,
        };
        assert_eq!(drain_all(&mut s, 100), [drain]);
        assert!(!s.serves(0) && s.draining(0), "it takes no command");
        assert_eq!(drain_all(&mut s, 200), [], "not before it is idle");
        s.idle(300, 0, 1);
        assert_eq!(drain_all(&mut s, 300), [drained(0, 1, true)]);
        s.idle(400, 0, 1);
        assert_eq!(drain_all(&mut s, 400 + DRAIN_MS_MAX), [], "reported once");
    }

    #[test]
    fn a_drain_that_does_not_finish_in_time_is_reported_not_drained() {
        let mut s = serving();
        s.drain(100, 0, 1);
        drain_all(&mut s, 100);
        assert_eq!(s.next_wake(), 100 + DRAIN_MS_MAX);
        assert_eq!(drain_all(&mut s, 99 + DRAIN_MS_MAX), []);
        assert_eq!(
            drain_all(&mut s, 100 + DRAIN_MS_MAX),
            [drained(0, 1, false)]
        );
        s.idle(200 + DRAIN_MS_MAX, 0, 1);
        assert_eq!(drain_all(&mut s, 200 + DRAIN_MS_MAX), [], "reported once");
    }

    #[test]
    fn a_partition_not_started_yet_is_drained_at_once() {
        let mut s = Serving::new();
        s.serve(0, 0, 1, None);
        s.marks_pulled(0, 0, 1);
        drain_all(&mut s, 0);
        s.settled(0, 0, 1, Settled::Refused("restart".into()));
        drain_all(&mut s, 0);
        s.drain(10, 0, 1);
        let unhold = ServingAction::Unhold { partition: 0 };
        assert_eq!(drain_all(&mut s, 10), [unhold, drained(0, 1, true)]);
        s.settled(20, 0, 1, Settled::Done);
        assert_eq!(drain_all(&mut s, 20), [], "nothing starts after the drain");
    }

    #[test]
    fn a_fenced_partition_is_reported_to_the_membership_once() {
        let mut s = serving();
        s.fenced(20, 0);
        s.fenced(30, 0);
        assert_eq!(
            drain_all(&mut s, 30),
            [ServingAction::Fenced { partition: 0 }]
        );
        s.fenced(40, 5);
        assert_eq!(
            drain_all(&mut s, 40),
            [],
            "not served here: nothing to report"
        );
    }
}
