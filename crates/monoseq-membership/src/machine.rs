//! [`Membership`]: one node's lease rounds as a step function. The caller gives the time (a
//! monotonic millisecond count of its own), asks [`Membership::poll`] for the next
//! [`Action`], performs it, and hands back what came of it ([`Membership::reply`],
//! [`Membership::drained`], [`Membership::fenced`]). At most one lease call is outstanding.
//!
//! A round, every renewal interval: heartbeat and renew every held lease in one call (a run
//! still claiming its name heartbeats alone, which claims the name when it is free or stale),
//! read the table, then take, hand off or release toward the [`crate::assign`]ment. Two calls
//! a round, not three, so that a slow table still leaves room for the read; and a round that
//! falls due while an acquire or release waits lets one go first when the watchdogs' deadlines
//! leave time for it, so that a slow table slows moves down rather than stopping them.
//! Between rounds, a node that expects a partition (handed to it, or held by a dead node until
//! its lease expires) reads the table again at once when it can take it. Two watchdogs stop
//! serving before the database can let anyone else in: a lease is served until
//! `renewal sent + lease − renewal interval`, and the node's name until
//! `heartbeat sent + name_valid_ms`.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

use crate::config::Config;
use crate::plan::assign;
use crate::table::{LeaseRow, LeaseTable, NameClaim, NodeRow, TableError, TableStatus};

/// Where a node is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Waiting to claim its name: takes no partition.
    Claiming,
    /// The name is this run's: takes, renews and hands off partitions.
    Member,
    /// Handing every partition back before it stops.
    Leaving,
    /// Left, refused to start, or superseded: does nothing more.
    Done,
}

/// A lease call the caller makes on its [`LeaseTable`] (with [`execute`]) and answers with
/// the matching [`Reply`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Call {
    /// Create the missing partition leases.
    EnsurePartitions,
    /// Heartbeat, claiming the name for this run when it is free or stale.
    Heartbeat,
    /// Renew these (partition, epoch) leases.
    Renew {
        /// The leases.
        held: Vec<(u32, u64)>,
    },
    /// Heartbeat under the name this run holds and, if it still does, renew these leases.
    HeartbeatRenew {
        /// The leases.
        held: Vec<(u32, u64)>,
    },
    /// Read every lease and node.
    Status,
    /// Take each of these partitions that is free or expired.
    Acquire {
        /// The partitions.
        partitions: Vec<u32>,
    },
    /// Free each of these (partition, epoch) leases still held with that epoch.
    Release {
        /// The leases.
        leases: Vec<(u32, u64)>,
    },
    /// Remove this run's node row.
    Leave,
}

impl Call {
    /// The reply of this call when it failed with `error` (or its answer never came).
    #[must_use]
    pub fn failed(&self, error: TableError) -> Reply {
        match self {
            Call::EnsurePartitions => Reply::Ensured(Err(error)),
            Call::Heartbeat => Reply::Heartbeat(Err(error)),
            Call::Renew { .. } => Reply::Renewed(Err(error)),
            Call::HeartbeatRenew { .. } => Reply::HeartbeatRenewed(Err(error)),
            Call::Status => Reply::Status(Err(error)),
            Call::Acquire { .. } => Reply::Acquired(Err(error)),
            Call::Release { .. } => Reply::Released(Err(error)),
            Call::Leave => Reply::Left(Err(error)),
        }
    }
}

/// What came of a [`Call`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// Of [`Call::EnsurePartitions`].
    Ensured(Result<(), TableError>),
    /// Of [`Call::Heartbeat`]: whether the name is this run's.
    Heartbeat(Result<bool, TableError>),
    /// Of [`Call::Renew`]: the partitions renewed.
    Renewed(Result<Vec<u32>, TableError>),
    /// Of [`Call::HeartbeatRenew`]: the partitions renewed, or `None` when the name is another
    /// run's.
    HeartbeatRenewed(Result<Option<Vec<u32>>, TableError>),
    /// Of [`Call::Status`].
    Status(Result<TableStatus, TableError>),
    /// Of [`Call::Acquire`]: the partitions taken, with their new epochs.
    Acquired(Result<Vec<(u32, u64)>, TableError>),
    /// Of [`Call::Release`]: the partitions freed.
    Released(Result<Vec<u32>, TableError>),
    /// Of [`Call::Leave`].
    Left(Result<(), TableError>),
}

/// Performs `call` on `table` for the node of `config`.
#[must_use]
pub fn execute(call: &Call, table: &dyn LeaseTable, config: &Config) -> Reply {
    let lease = Duration::from_millis(config.lease_ms);
    let me = config.node_id.as_str();
    let name = NameClaim {
        node_id: me,
        run_id: &config.run_id,
        url: &config.url,
        stale: Duration::from_millis(config.name_stale_ms()),
        dir_id: &config.dir_id,
    };
    match call {
        Call::EnsurePartitions => Reply::Ensured(table.ensure_partitions(config.partitions)),
        Call::Heartbeat => Reply::Heartbeat(table.heartbeat(&name)),
        Call::Renew { held } => Reply::Renewed(table.renew(me, held, lease)),
        Call::HeartbeatRenew { held } => {
            Reply::HeartbeatRenewed(table.heartbeat_and_renew(&name, held, lease))
        }
        Call::Status => Reply::Status(table.status()),
        Call::Acquire { partitions } => Reply::Acquired(table.acquire(partitions, me, lease)),
        Call::Release { leases } => Reply::Released(table.release(me, leases)),
        Call::Leave => Reply::Left(table.leave(me, &config.run_id)),
    }
}

/// Why a partition stops being served at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// Its lease was not renewed in time: it stops before the lease can expire.
    LeaseNotRenewed,
    /// No heartbeat confirmed the node's name in time: another run could claim it soon.
    NameNotConfirmed,
    /// A renewal found the lease taken over.
    TakenOver,
    /// The storage refused a write under its epoch.
    Fenced,
    /// Its epoch went lower than one seen before: the database lost acknowledged writes.
    EpochWentBack,
    /// Another run of this node's name claimed the name.
    Superseded,
}

/// Another run holds a node's name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NameTaken {
    /// The name.
    pub node_id: String,
    /// The other run.
    pub run_id: String,
    /// Where the other run serves.
    pub url: String,
    /// Milliseconds since its last heartbeat: its age at the last read (by the database's
    /// clock) plus the time since that read's answer (by this node's clock).
    pub seen_ms_ago: u64,
    /// It recorded the identity of the directory whose lock this run holds: it is dead, and
    /// the name was taken from it without waiting for it to go stale.
    pub dead: bool,
}

/// What the caller does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Make this lease call and hand its [`Reply`] to [`Membership::reply`].
    Call(Call),
    /// Start serving `partition`, every write fenced with `epoch`.
    Serve {
        /// The partition.
        partition: u32,
        /// Its lease epoch.
        epoch: u64,
        /// Who held it last, by the latest read (a handoff or a takeover), if anyone.
        previous: Option<String>,
    },
    /// Stop serving `partition` now.
    Stop {
        /// The partition.
        partition: u32,
        /// The epoch it was served under.
        epoch: u64,
        /// Why.
        why: StopReason,
    },
    /// Planned move: stop taking commands for `partition`, finish its queue, flush, and
    /// report with [`Membership::drained`]; the lease is then released for `to`.
    Drain {
        /// The partition.
        partition: u32,
        /// Its epoch.
        epoch: u64,
        /// The node it goes to (`None`: the node is leaving).
        to: Option<String>,
    },
    /// The name is this run's now; `previous` is the stale run it took the name over from.
    Claimed {
        /// The earlier run, if one held the name.
        previous: Option<NameTaken>,
    },
    /// Refuse to start: another live run heartbeats under this name.
    Refuse(NameTaken),
    /// Another run claimed this node's name: this run stops (every partition was stopped).
    Superseded,
    /// A partition's epoch went lower than one seen: it is never served by this run again.
    EpochWentBack {
        /// The partition.
        partition: u32,
        /// The highest epoch seen.
        seen: u64,
        /// The epoch found.
        found: u64,
    },
    /// Left the cluster: every partition was handed back.
    Left,
}

/// A lease this run holds.
#[derive(Debug, Clone, Copy)]
struct Held {
    epoch: u64,
    /// Served until this instant unless a renewal moves it.
    valid_until: u64,
    /// Being handed off.
    draining: bool,
}

/// The last read of the table.
#[derive(Debug, Clone)]
pub struct View {
    /// What was read.
    pub status: TableStatus,
    /// When the read was sent (its rows are at least this fresh).
    pub read_at: u64,
    /// Every partition was held by the node that should hold it.
    pub settled: bool,
    /// The nodes judged alive.
    pub live: Vec<String>,
}

/// One node's membership state machine.
#[derive(Debug)]
pub struct Membership {
    cfg: Config,
    phase: Phase,
    held: BTreeMap<u32, Held>,
    /// The outstanding call, with when it was sent.
    pending: Option<(Call, u64)>,
    queue: VecDeque<Call>,
    out: VecDeque<Action>,
    ensured: bool,
    next_round: u64,
    next_poll: Option<u64>,
    claimed_at: Option<u64>,
    settle_until: Option<u64>,
    /// Claiming: since when another live run holds the name, and that run.
    claiming_since: Option<u64>,
    name_holder: Option<NodeRow>,
    /// When `name_holder` was read (the answer's arrival).
    name_holder_at: u64,
    name_valid_until: u64,
    /// While the table holds a live lease under this run's name that it did not acquire, the
    /// run takes nothing (and releases nothing for another node) before this instant: the
    /// earlier run that holds it has stopped serving by then (its name would be stale), even one
    /// that left and is still draining.
    takeback_at: u64,
    left: bool,
    epochs: BTreeMap<u32, u64>,
    went_back: BTreeSet<u32>,
    view: Option<View>,
    /// How long the last answer took.
    latency: u64,
    /// An acquire or release went before the round that was due.
    plan_call_sent_late: bool,
    /// The last read found news of another node (a new run of it, a lease it took anew):
    /// the table is read again within a handoff poll (see [`Membership::catching_up`]).
    news: bool,
    /// Leases whose release failed, released again at `release_again_at`: once each (in
    /// `release_retried`), so that a failing database does not hold a leaving node back.
    unreleased: Vec<(u32, u64)>,
    release_again_at: u64,
    release_retried: BTreeSet<(u32, u64)>,
}

impl Membership {
    /// A node that has not joined yet; its first round is due at `now`.
    #[must_use]
    pub fn new(cfg: Config, now: u64) -> Membership {
        Membership {
            cfg,
            phase: Phase::Claiming,
            held: BTreeMap::new(),
            pending: None,
            queue: VecDeque::new(),
            out: VecDeque::new(),
            ensured: false,
            next_round: now,
            next_poll: None,
            claimed_at: None,
            settle_until: None,
            claiming_since: None,
            name_holder: None,
            name_holder_at: 0,
            name_valid_until: 0,
            takeback_at: 0,
            left: false,
            epochs: BTreeMap::new(),
            went_back: BTreeSet::new(),
            view: None,
            latency: 0,
            plan_call_sent_late: false,
            news: false,
            unreleased: Vec::new(),
            release_again_at: 0,
            release_retried: BTreeSet::new(),
        }
    }

    /// The parameters.
    #[must_use]
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// Where the node is in its life.
    #[must_use]
    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// The last read of the table.
    #[must_use]
    pub fn view(&self) -> Option<&View> {
        self.view.as_ref()
    }

    /// The partitions this run serves (or drains), with their epochs.
    pub fn held(&self) -> impl Iterator<Item = (u32, u64)> + '_ {
        self.held.iter().map(|(p, h)| (*p, h.epoch))
    }

    /// Partitions refused for good because their epoch went back.
    #[must_use]
    pub fn went_back(&self) -> &BTreeSet<u32> {
        &self.went_back
    }

    /// Asks for a read of the table soon, because what this node last read sent a command
    /// nowhere useful: a partition without a live owner in it, or an owner that did not
    /// answer (a node restarted under a new address, a partition taken back or moved since).
    /// The read goes at once, or one [`Config::handoff_poll_ms`] after the last read (so a
    /// stream of such commands reads the table at most that often); a member only.
    pub fn read_soon(&mut self, now: u64) {
        if self.phase != Phase::Member {
            return;
        }
        let last = self.view.as_ref().map_or(0, |v| v.read_at);
        let at = now.max(last + self.cfg.handoff_poll_ms());
        self.next_poll = Some(self.next_poll.map_or(at, |t| t.min(at)));
    }

    /// When [`Membership::poll`] next has something to do if nothing else happens.
    #[must_use]
    pub fn next_wake(&self) -> u64 {
        if !self.out.is_empty() || (self.pending.is_none() && !self.queue.is_empty()) {
            return 0;
        }
        let mut t = u64::MAX;
        // While a call is out, only the watchdogs have deadlines: its reply comes first.
        if self.pending.is_none() {
            if self.phase != Phase::Done {
                t = t.min(self.next_round);
            }
            if let Some(p) = self.next_poll {
                t = t.min(p);
            }
            if !self.unreleased.is_empty() {
                t = t.min(self.release_again_at);
            }
        }
        for h in self.held.values() {
            t = t.min(h.valid_until);
        }
        if matches!(self.phase, Phase::Member | Phase::Leaving) && !self.held.is_empty() {
            t = t.min(self.name_valid_until);
        }
        t
    }

    /// The next action at `now`, if any; call until it answers `None`.
    pub fn poll(&mut self, now: u64) -> Option<Action> {
        self.watchdogs(now);
        if let Some(a) = self.out.pop_front() {
            return Some(a);
        }
        if self.phase == Phase::Done || self.pending.is_some() {
            return None;
        }
        if now >= self.next_round && !self.plan_call_goes_first(now) {
            self.start_round(now);
        } else if now < self.next_round && self.next_poll.is_some_and(|t| now >= t) {
            self.next_poll = None;
            if !self.queue.contains(&Call::Status) {
                self.queue.push_back(Call::Status);
            }
        }
        if !self.unreleased.is_empty() && now >= self.release_again_at {
            for (p, epoch) in std::mem::take(&mut self.unreleased) {
                self.push_release(p, epoch);
            }
        }
        if self.phase == Phase::Leaving
            && self.left
            && self.held.is_empty()
            && self.queue.is_empty()
            && self.unreleased.is_empty()
        {
            self.phase = Phase::Done;
            return Some(Action::Left);
        }
        let mut call = self.queue.pop_front()?;
        match &mut call {
            Call::Renew { held } => {
                *held = self.held().collect();
                if held.is_empty() {
                    return self.poll(now);
                }
            }
            Call::HeartbeatRenew { held } => *held = self.held().collect(),
            // Every release waiting goes in this one call: a leaving node's drains end one by
            // one, and a lease call per partition would make each wait for the one before.
            Call::Release { leases } => {
                self.queue.retain(|c| match c {
                    Call::Release { leases: more } => {
                        leases.extend_from_slice(more);
                        false
                    }
                    _ => true,
                });
                leases.sort_unstable();
                leases.dedup();
            }
            _ => {}
        }
        self.pending = Some((call.clone(), now));
        Some(Action::Call(call))
    }

    /// Whether the acquire or release at the queue's front goes before a round that is due:
    /// once a round, and only when it and the round's heartbeat can both be answered (at the
    /// last answer's latency, with a quarter of a renewal interval to spare) before the name or
    /// a lease would stop being served. Without it a table answering in half a renewal
    /// interval or more keeps a node renewing and reading, never taking or handing over.
    fn plan_call_goes_first(&mut self, now: u64) -> bool {
        if self.phase != Phase::Member
            || self.plan_call_sent_late
            || !matches!(
                self.queue.front(),
                Some(Call::Acquire { .. } | Call::Release { .. })
            )
        {
            return false;
        }
        let deadline = self
            .held
            .values()
            .map(|h| h.valid_until.min(self.name_valid_until))
            .min()
            .unwrap_or(u64::MAX);
        let answered = now + 2 * self.latency + self.cfg.renew_ms / 4;
        self.plan_call_sent_late = answered < deadline;
        self.plan_call_sent_late
    }

    fn start_round(&mut self, now: u64) {
        self.next_round = now + self.cfg.renew_ms;
        self.next_poll = None;
        self.plan_call_sent_late = false;
        self.queue.retain(|c| {
            !matches!(
                c,
                Call::Heartbeat | Call::Status | Call::Renew { .. } | Call::HeartbeatRenew { .. }
            )
        });
        match self.phase {
            Phase::Claiming => {
                self.queue.push_front(Call::Heartbeat);
                self.queue.push_front(Call::Status);
            }
            Phase::Member => self
                .queue
                .push_front(Call::HeartbeatRenew { held: Vec::new() }),
            Phase::Leaving => self.queue.push_front(Call::Renew { held: Vec::new() }),
            Phase::Done => {}
        }
        if !self.ensured && self.phase != Phase::Leaving {
            self.queue.push_front(Call::EnsurePartitions);
        }
    }

    fn watchdogs(&mut self, now: u64) {
        if matches!(self.phase, Phase::Member | Phase::Leaving) {
            let late: Vec<u32> = self
                .held
                .iter()
                .filter(|(_, h)| h.valid_until <= now)
                .map(|(p, _)| *p)
                .collect();
            for p in late {
                self.stop(p, StopReason::LeaseNotRenewed);
            }
        }
        // A leaving run no longer heartbeats: it too stops (its drains cut short, their leases
        // left to expire) before a new run of its name could take them back.
        if matches!(self.phase, Phase::Member | Phase::Leaving) && now >= self.name_valid_until {
            self.stop_all(StopReason::NameNotConfirmed);
        }
    }

    fn stop(&mut self, partition: u32, why: StopReason) {
        if let Some(h) = self.held.remove(&partition) {
            self.out.push_back(Action::Stop {
                partition,
                epoch: h.epoch,
                why,
            });
        }
    }

    fn stop_all(&mut self, why: StopReason) {
        let all: Vec<u32> = self.held.keys().copied().collect();
        for p in all {
            self.stop(p, why);
        }
    }

    /// Begins leaving: the node row goes first (so the others plan without this node and
    /// take each partition as soon as it is released), then every partition is drained and
    /// released; [`Action::Left`] ends it.
    pub fn leave(&mut self, _now: u64) {
        if matches!(self.phase, Phase::Leaving | Phase::Done) {
            return;
        }
        if self.phase == Phase::Claiming {
            self.phase = Phase::Done;
            self.out.push_back(Action::Left);
            return;
        }
        self.phase = Phase::Leaving;
        self.next_poll = None;
        self.queue.retain(|c| matches!(c, Call::Release { .. }));
        self.queue.push_front(Call::Leave);
        let held: Vec<(u32, u64)> = self.held().collect();
        for (p, epoch) in held {
            if let Some(h) = self.held.get_mut(&p)
                && !h.draining
            {
                h.draining = true;
                self.out.push_back(Action::Drain {
                    partition: p,
                    epoch,
                    to: None,
                });
            }
        }
    }

    /// A drained partition (after [`Action::Drain`]): `ok` when its queue finished and its
    /// numbers were flushed; its lease is then released, else left to expire.
    pub fn drained(&mut self, _now: u64, partition: u32, epoch: u64, ok: bool) {
        if self
            .held
            .get(&partition)
            .is_some_and(|h| h.epoch == epoch && h.draining)
        {
            self.held.remove(&partition);
            if ok {
                self.queue.push_front(Call::Release {
                    leases: vec![(partition, epoch)],
                });
            }
        }
    }

    /// The storage refused a write of `partition` (another node took it over).
    pub fn fenced(&mut self, _now: u64, partition: u32) {
        self.stop(partition, StopReason::Fenced);
    }

    /// The answer of the outstanding call, at `now`.
    pub fn reply(&mut self, now: u64, reply: Reply) {
        let Some((call, sent)) = self.pending.take() else {
            return;
        };
        self.latency = now.saturating_sub(sent);
        match (call, reply) {
            (Call::EnsurePartitions, Reply::Ensured(r)) => self.ensured = r.is_ok(),
            (Call::Heartbeat, Reply::Heartbeat(r)) => self.on_heartbeat(now, sent, r),
            (Call::Renew { held }, Reply::Renewed(Ok(renewed))) => {
                self.on_renewed(sent, &held, &renewed);
            }
            (Call::HeartbeatRenew { held }, Reply::HeartbeatRenewed(r)) => {
                self.on_heartbeat_renewed(sent, &held, r);
            }
            (Call::Status, Reply::Status(Ok(status))) => self.observe(now, sent, status),
            (Call::Acquire { .. }, Reply::Acquired(Ok(taken))) => {
                for (partition, epoch) in taken {
                    self.on_acquired(sent, partition, epoch);
                }
            }
            (Call::Release { leases }, Reply::Released(r)) => self.on_released(now, leases, &r),
            (Call::Leave, Reply::Left(_)) => self.left = true,
            _ => {}
        }
    }

    fn on_heartbeat(&mut self, now: u64, sent: u64, r: Result<bool, TableError>) {
        match (self.phase, r) {
            (Phase::Claiming, Ok(true)) => {
                self.phase = Phase::Member;
                self.claimed_at = Some(now);
                self.name_valid_until = sent + self.cfg.name_valid_ms();
                // An earlier run stops serving once its name could be claimed as stale; a run
                // that left gave its name up sooner, and may still be draining until then.
                // (Its last heartbeat may predate this process's clock: added before subtracted.)
                // One that recorded the directory whose lock this run holds is dead: its
                // leases are taken back at once.
                self.takeback_at = match &self.name_holder {
                    Some(n) if self.holder_is_dead(n) => 0,
                    Some(n) => (self.name_holder_at + self.cfg.name_stale_ms())
                        .saturating_sub(n.seen_ms_ago),
                    None => now + self.cfg.name_stale_ms(),
                };
                let previous = self.name_holder.take().map(|n| self.taken(n, now));
                self.out.push_back(Action::Claimed { previous });
                self.queue.push_front(Call::Status);
            }
            (Phase::Claiming, Ok(false)) => {
                let since = *self.claiming_since.get_or_insert(sent);
                // Refuse only on fresh evidence: an answer that waited (this process was
                // paused) says nothing about the other run now.
                let fresh = now.saturating_sub(sent) <= self.cfg.renew_ms;
                if fresh && now.saturating_sub(since) >= self.cfg.name_wait_ms() {
                    let holder = self.name_holder.take().map(|n| self.taken(n, now));
                    self.phase = Phase::Done;
                    self.out
                        .push_back(Action::Refuse(holder.unwrap_or(NameTaken {
                            node_id: self.cfg.node_id.clone(),
                            run_id: String::new(),
                            url: String::new(),
                            seen_ms_ago: 0,
                            dead: false,
                        })));
                }
            }
            _ => {}
        }
    }

    /// A round's heartbeat and renewal came back. A run that began leaving meanwhile still
    /// keeps what the answer confirmed: its leases' and name's validity while it drains.
    fn on_heartbeat_renewed(
        &mut self,
        sent: u64,
        held: &[(u32, u64)],
        r: Result<Option<Vec<u32>>, TableError>,
    ) {
        match (self.phase, r) {
            (Phase::Member | Phase::Leaving, Ok(Some(renewed))) => {
                self.name_valid_until = self.name_valid_until.max(sent + self.cfg.name_valid_ms());
                self.on_renewed(sent, held, &renewed);
            }
            (Phase::Member, Ok(None)) => {
                self.stop_all(StopReason::Superseded);
                self.phase = Phase::Done;
                self.out.push_back(Action::Superseded);
                return;
            }
            _ => {}
        }
        if self.phase == Phase::Member {
            self.queue.push_front(Call::Status);
        }
    }

    /// Whether the run `n` that held this node's name is dead: it recorded the identity of the
    /// directory whose lock this run holds, and held that lock while it ran.
    fn holder_is_dead(&self, n: &NodeRow) -> bool {
        !self.cfg.dir_id.is_empty() && n.dir_id == self.cfg.dir_id
    }

    fn taken(&self, n: NodeRow, now: u64) -> NameTaken {
        NameTaken {
            dead: self.holder_is_dead(&n),
            node_id: n.node_id,
            run_id: n.run_id,
            url: n.url,
            seen_ms_ago: n.seen_ms_ago + now.saturating_sub(self.name_holder_at),
        }
    }

    fn on_renewed(&mut self, sent: u64, asked: &[(u32, u64)], renewed: &[u32]) {
        let valid_until = sent + self.cfg.lease_valid_ms();
        for &(p, epoch) in asked {
            let Some(h) = self.held.get_mut(&p).filter(|h| h.epoch == epoch) else {
                continue;
            };
            if renewed.contains(&p) {
                h.valid_until = h.valid_until.max(valid_until);
            } else {
                self.stop(p, StopReason::TakenOver);
            }
        }
    }

    /// A failed release is tried once more half a renewal later: one call frees every drained
    /// partition, and a database failing over, or a connection dropped, would otherwise leave
    /// each of them unserved until its lease expires.
    fn on_released(&mut self, now: u64, leases: Vec<(u32, u64)>, r: &Result<Vec<u32>, TableError>) {
        if r.is_ok() {
            for l in &leases {
                self.release_retried.remove(l);
            }
            return;
        }
        for l in leases {
            if self.release_retried.insert(l) {
                self.unreleased.push(l);
            } else {
                self.release_retried.remove(&l);
            }
        }
        self.release_again_at = now + self.cfg.renew_ms / 2;
    }

    fn on_acquired(&mut self, sent: u64, partition: u32, epoch: u64) {
        let seen = self.epochs.get(&partition).copied().unwrap_or(0);
        if epoch <= seen && seen > 0 {
            if self.went_back.insert(partition) {
                self.out.push_back(Action::EpochWentBack {
                    partition,
                    seen,
                    found: epoch,
                });
            }
            return;
        }
        self.epochs.insert(partition, epoch);
        if self.phase != Phase::Member || self.went_back.contains(&partition) {
            self.queue.push_front(Call::Release {
                leases: vec![(partition, epoch)],
            });
            return;
        }
        let previous = self
            .view
            .as_ref()
            .and_then(|v| v.status.lease(partition))
            .and_then(|l| l.node_id.clone());
        self.held.insert(
            partition,
            Held {
                epoch,
                valid_until: sent + self.cfg.lease_valid_ms(),
                draining: false,
            },
        );
        self.out.push_back(Action::Serve {
            partition,
            epoch,
            previous,
        });
    }

    fn check_epochs(&mut self, status: &TableStatus) {
        for l in &status.leases {
            let seen = *self.epochs.entry(l.partition).or_insert(l.epoch);
            if l.epoch < seen {
                if self.went_back.insert(l.partition) {
                    self.out.push_back(Action::EpochWentBack {
                        partition: l.partition,
                        seen,
                        found: l.epoch,
                    });
                    self.stop(l.partition, StopReason::EpochWentBack);
                }
            } else {
                self.epochs.insert(l.partition, l.epoch);
            }
        }
    }

    fn observe(&mut self, now: u64, sent: u64, status: TableStatus) {
        self.check_epochs(&status);
        let me = self.cfg.node_id.clone();
        self.news = self
            .view
            .as_ref()
            .is_some_and(|v| news_of_others(&v.status, &status, &me));
        let mut live: Vec<String> = status
            .nodes
            .iter()
            .filter(|n| n.seen_ms_ago < self.cfg.alive_ms() && n.node_id != me)
            .map(|n| n.node_id.clone())
            .collect();
        if self.phase == Phase::Member {
            live.push(me.clone());
        }
        if self.phase == Phase::Claiming {
            self.name_holder = status
                .node(&me)
                .filter(|n| n.run_id != self.cfg.run_id)
                .cloned();
            self.name_holder_at = now;
        }
        self.view = Some(View {
            status,
            read_at: sent,
            settled: false,
            live,
        });
        if self.phase == Phase::Member {
            self.plan(now, sent);
        }
    }

    /// Acts on this node's part of the assignment of the last read.
    fn plan(&mut self, now: u64, sent: u64) {
        let Some(view) = self.view.as_mut() else {
            return;
        };
        let me_owned = self.cfg.node_id.clone();
        let me = me_owned.as_str();
        let a = assign(&view.status, self.cfg.partitions, &view.live);
        view.settled = a.settled();
        let Some(mine) = a.nodes.iter().position(|n| n == me) else {
            return;
        };
        let view = self
            .view
            .as_ref()
            .map(|v| (v.status.clone(), v.live.clone()));
        let Some((status, live)) = view else {
            return;
        };
        let settle_until = self.settle_deadline(&status, &live, me, now);
        let earlier_run = self.earlier_run_may_serve(&status, me, sent);
        let read = Read {
            status: &status,
            live: &live,
            me,
            sent,
            settling: now < settle_until || earlier_run,
        };
        self.queue.retain(|c| !matches!(c, Call::Acquire { .. }));
        let mut round = Round::default();
        for p in 0..self.cfg.partitions {
            let row = status.lease(p);
            let target = a.target.get(p as usize).copied().flatten();
            let target_name = target.and_then(|i| a.nodes.get(i));
            round.moving |= is_moving(row.and_then(LeaseRow::live_owner), target_name, &live);
            if target == Some(mine) {
                self.take(p, row, &read, &mut round);
            } else {
                self.give_up(p, row, &read, target_name);
            }
        }
        if !round.acquire.is_empty() {
            let partitions = std::mem::take(&mut round.acquire);
            self.queue.push_back(Call::Acquire { partitions });
        }
        self.next_poll = if earlier_run {
            Some((now + self.cfg.handoff_poll_ms()).min(self.takeback_at))
        } else if read.settling {
            Some(settle_until)
        } else if round.expect_handoff || round.moving || self.catching_up(&status, &live, sent) {
            Some(now + self.cfg.handoff_poll_ms())
        } else {
            round
                .expiry
                .map(|e| e.max(now + self.cfg.handoff_poll_ms()))
        };
    }

    /// Whether this member reads the table again within a handoff poll rather than at its next
    /// round, to learn the other nodes' new runs at once: the read sent at `sent` found news of
    /// another node (a new run under its name, with its address; a lease it took anew), or,
    /// within a lease interval of this run's claim, a node counted live was not heard from since
    /// the claim. After every node was restarted together, each run thus reads the others'
    /// addresses and epochs within a poll of their claims and takebacks (for routing and
    /// readiness), instead of forwarding to a dead run and asking for reads one failure at a time.
    fn catching_up(&self, status: &TableStatus, live: &[String], sent: u64) -> bool {
        let Some(claimed) = self.claimed_at else {
            return self.news;
        };
        let unheard = sent < claimed + self.cfg.lease_ms
            && status.nodes.iter().any(|n| {
                n.node_id != self.cfg.node_id
                    && live.contains(&n.node_id)
                    && claimed + n.seen_ms_ago > sent
            });
        self.news || unheard
    }

    /// Whether an earlier run of this name may still serve, as read at `sent`: the table holds a
    /// live lease under the name that this run did not acquire, and that run has not certainly
    /// stopped yet (`takeback_at`). This run takes nothing meanwhile, so that two runs of one
    /// name never serve at once (a run that left gives its name up before its drains end).
    fn earlier_run_may_serve(&self, status: &TableStatus, me: &str, sent: u64) -> bool {
        sent < self.takeback_at
            && status
                .leases
                .iter()
                .any(|l| l.live_owner() == Some(me) && !self.held.contains_key(&l.partition))
    }

    /// Until when this member waits before taking partitions. Decided at the first plan: a
    /// fresh cluster waits one renewal interval for the nodes started together to heartbeat,
    /// so that none takes everything first.
    fn settle_deadline(
        &mut self,
        status: &TableStatus,
        live: &[String],
        me: &str,
        now: u64,
    ) -> u64 {
        if self.settle_until.is_none() {
            // A run that took its name from a dead earlier run holding leases is no fresh
            // cluster either: it takes them back at once.
            let others_hold = status.leases.iter().any(|l| {
                l.live_owner().is_some_and(|o| {
                    (o != me && live.iter().any(|n| n == o)) || (o == me && self.takeback_at == 0)
                })
            });
            let claimed = self.claimed_at.unwrap_or(now);
            self.settle_until = Some(if others_hold {
                claimed
            } else {
                claimed + self.cfg.renew_ms
            });
        }
        self.settle_until.unwrap_or(0)
    }

    /// Partition `p` (lease `row`) should be this node's: acquires it when free (or left by an
    /// earlier run of this name), or notes when its holder should hand it over.
    fn take(&mut self, p: u32, row: Option<&LeaseRow>, read: &Read<'_>, round: &mut Round) {
        if self.held.contains_key(&p) || self.went_back.contains(&p) {
            return;
        }
        let epoch = row.map_or(0, |r| r.epoch);
        match row.and_then(LeaseRow::live_owner) {
            None if !read.settling => round.acquire.push(p),
            // Left by an earlier run of this name: taken back with a new epoch (not while that
            // run may still serve: `settling`).
            Some(o) if o == read.me && !read.settling => {
                self.push_release(p, epoch);
                round.acquire.push(p);
            }
            Some(o) if o != read.me => {
                let alive = read.live.iter().any(|n| n == o);
                if alive || read.status.node(o).is_none() {
                    round.expect_handoff = true;
                } else {
                    let expires_in = row.map_or(0, |r| r.expires_in_ms.max(0));
                    let at = read.sent + expires_in.unsigned_abs() + 1;
                    round.expiry = Some(round.expiry.map_or(at, |e| e.min(at)));
                }
            }
            _ => {}
        }
    }

    /// Partition `p` (lease `row`) should be another node's (`to`): drains it if this node
    /// serves it, releases a lease an earlier run of this name left (not while that run may
    /// still serve: `settling`).
    fn give_up(&mut self, p: u32, row: Option<&LeaseRow>, read: &Read<'_>, to: Option<&String>) {
        if let Some(h) = self.held.get_mut(&p) {
            if !h.draining {
                h.draining = true;
                self.out.push_back(Action::Drain {
                    partition: p,
                    epoch: h.epoch,
                    to: to.cloned(),
                });
            }
        } else if row.and_then(LeaseRow::live_owner) == Some(read.me) && !read.settling {
            self.push_release(p, row.map_or(0, |r| r.epoch));
        }
    }

    fn push_release(&mut self, partition: u32, epoch: u64) {
        let call = Call::Release {
            leases: vec![(partition, epoch)],
        };
        if !self.queue.contains(&call) {
            self.queue.push_back(call);
        }
    }
}

/// One read of the table, as the plan of this node sees it.
struct Read<'a> {
    status: &'a TableStatus,
    live: &'a [String],
    me: &'a str,
    /// When the read was sent.
    sent: u64,
    /// This member still waits before taking partitions.
    settling: bool,
}

/// What planning on one read found, for when to read again.
#[derive(Default)]
struct Round {
    /// A partition this node should take is held by a live node (or one the table does not
    /// know): it is awaited from its holder.
    expect_handoff: bool,
    /// A planned move is under way somewhere (a partition free, or held by a live node that is
    /// not its target): every node reads the table again soon, so that the ones forwarding
    /// commands learn the new owner within a poll interval rather than at their next round.
    moving: bool,
    /// When the first lease this node should take from a dead node expires.
    expiry: Option<u64>,
    /// The partitions to take now, in one call.
    acquire: Vec<u32>,
}

/// Whether `now`, read after `before`, holds news of a node other than `me`: another run under
/// its name (or another address), or a lease it holds with another epoch.
fn news_of_others(before: &TableStatus, now: &TableStatus, me: &str) -> bool {
    let new_run = now.nodes.iter().any(|n| {
        n.node_id != me
            && before
                .node(&n.node_id)
                .is_none_or(|b| b.run_id != n.run_id || b.url != n.url)
    });
    new_run
        || now.leases.iter().any(|l| {
            l.live_owner().is_some_and(|o| o != me)
                && before.lease(l.partition).map(|b| b.epoch) != Some(l.epoch)
        })
}

/// Whether a partition whose live owner is `owner` moves soon to its `target`: free, or held
/// by a live node that is not its target. (Held by a dead node, it waits for the lease to
/// expire instead.)
fn is_moving(owner: Option<&str>, target: Option<&String>, live: &[String]) -> bool {
    target.is_some_and(|t| match owner {
        None => true,
        Some(o) => o != t && live.iter().any(|n| n == o),
    })
}

#[cfg(test)]
mod tests;
