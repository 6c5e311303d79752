//! One simulated node: the real node machine (`monoseq_membership::NodeMachine`: the
//! membership, and the serving beside it: marks pulled, losses settled, then started; stopped,
//! drained, fenced; routing) on a clock of its own (drifting within the stated bound), its lease calls
//! carried to the database with the faults the database decides (lost, late, failed), and the
//! partitions it serves: each the real partition lifecycle and writer (`ManualPartition`, the
//! machine the partition task drives) in simulated time. This file does only their simulated
//! I/O: it steps the sequencers' workers, carries commands to them, keeps their marks file,
//! settles losses on the simulated database and tells the machines what came of each.

use std::collections::BTreeMap;
use std::sync::Arc;

use monoseq_core::Step;
use monoseq_cp::{
    Answer, Command, CommandError, End, Held, IdempotencyKey, ManualPartition, Outcome, Partitions,
};
use monoseq_membership::{
    Call, Config, NodeAction, NodeMachine, Phase, Reply, Route, Settled, TableError,
};
use monoseq_store::{
    AcceptedLoss, AppId, EventStore, Mark, PageItem, PartitionId, ReadError, TrustLevel,
    find_losses, retired_ranges, settle_losses, start_mark,
};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::db::{Db, SimKv};
use crate::{Kind, LEASE_MS, Plan, RENEW_MS, Violation, cp_config};

/// A command on its way: which client sent it, for which of its operations.
pub(crate) struct Request {
    pub(crate) client: usize,
    pub(crate) op: u64,
    pub(crate) ws: u64,
    pub(crate) cmd: Command,
    pub(crate) key: String,
}

/// A partition this node started (the serving machine's [`ServingAction::Start`]).
struct Part {
    epoch: u64,
    writer: ManualPartition<Arc<SimKv>>,
    /// Commands on their way to the partition (its queue), given to it at its next tick.
    queue: Vec<Request>,
    /// Commands the partition took and has not answered yet, by tag.
    waiting: BTreeMap<u64, Request>,
    next_tag: u64,
    retry_at: u64,
}

type Answers = Vec<(Request, Result<Outcome, CommandError>)>;

/// More actions than this at one instant means the node machine never stops asking.
const ACTIONS_PER_STEP_MAX: usize = 8_192;

impl Held for Part {
    fn fenced(&self) -> bool {
        self.writer.ended() == Some(&End::Fenced)
    }
}

impl Part {
    /// Gives the queued commands to the partition, at simulated time `now`.
    fn submit_queued(&mut self, now: u64) {
        for r in std::mem::take(&mut self.queue) {
            let tag = self.next_tag;
            self.next_tag += 1;
            let key = IdempotencyKey::new(&r.key).expect("a valid key");
            self.writer.submit(tag, r.cmd.clone(), Some(key), now);
            self.waiting.insert(tag, r);
        }
    }

    /// Passes the partition's answers on to their requests.
    fn deliver(&mut self, given: Vec<Answer>, answers: &mut Answers) {
        for (tag, result) in given {
            if let Some(r) = self.waiting.remove(&tag) {
                answers.push((r, result));
            }
        }
    }

    /// Answers every command not answered yet, queued or taken, with `error`.
    fn refuse_all(&mut self, error: &CommandError, answers: &mut Answers) {
        refuse(std::mem::take(&mut self.queue), answers, || error.clone());
        let given = self.writer.refuse_all(error);
        self.deliver(given, answers);
    }
}

pub(crate) struct Node {
    pub(crate) name: String,
    pub(crate) run: u64,
    pub(crate) alive: bool,
    /// Restarted after it dies (not a second run of a name).
    pub(crate) restartable: bool,
    pub(crate) paused_until: u64,
    /// It was paused at the last tick.
    was_paused: bool,
    /// Requests accepted while paused, each with whether another node relayed it: routed
    /// when the node runs again ([`crate::Sim::tick`]).
    pub(crate) inbox: Vec<(Request, bool)>,
    pub(crate) violations: Vec<Violation>,
    /// The node's decisions: its membership, what it serves, where requests go.
    machine: NodeMachine,
    /// Partitions waiting for the marks of the nodes this node reaches
    /// ([`NodeAction::PullMarks`]): pulled before its next step.
    pulls: Vec<(u32, u64)>,
    drift_ppm: i64,
    born: u64,
    /// A lease call's answer on its way, with when it arrives.
    awaiting: Option<(u64, Reply)>,
    /// The partitions it holds, by the processor's rules (`monoseq_cp::Partitions`).
    parts: Partitions<Part>,
    /// What this run acknowledged of each partition (a process's memory).
    acked: BTreeMap<u32, Mark>,
    /// The node's marks file (its local disk, kept across restarts): the highest numbers it
    /// acknowledged or learned from other nodes, per partition.
    pub(crate) disk: BTreeMap<u32, Mark>,
    /// This run was started with `--accept-loss`: at its start, every partition whose stored
    /// PLog lacks the event at its mark has the loss accepted ([`Node::begin_run`]).
    pub(crate) accept_loss: bool,
    /// The accepted losses in the node's marks directory (kept across restarts, merged from
    /// the nodes it reaches, as its marks are): partition, the PLog range lost and the mark
    /// retired.
    pub(crate) losses_accepted: Vec<AcceptedLoss>,
    /// The losses this run knew at its start, per partition (the command processor's
    /// `Config::retired`): its numbers continue above them.
    retired: Vec<Mark>,
    partitions: u32,
    rng: ChaCha8Rng,
}

fn machine(name: &str, run: u64, plan: &Plan, now: u64) -> NodeMachine {
    let config = Config::new(
        name,
        &format!("{name}-r{run}"),
        &format!("sim://{name}"),
        plan.partitions,
        LEASE_MS,
        RENEW_MS,
    )
    .expect("the simulation's membership parameters are valid");
    NodeMachine::new(config, now)
}

/// The answer of a lease call that failed (or whose answer was lost).
fn failed(call: &Call, message: &str) -> Reply {
    let e = TableError {
        message: message.to_owned(),
    };
    call.failed(e)
}

/// Prints a line when `MONOSEQ_SIM_TRACE` is set.
pub(crate) fn trace(line: impl FnOnce() -> String) {
    if std::env::var_os("MONOSEQ_SIM_TRACE").is_some() {
        eprintln!("{}", line());
    }
}

fn refuse(queue: Vec<Request>, answers: &mut Answers, error: impl Fn() -> CommandError) {
    for r in queue {
        answers.push((r, Err(error())));
    }
}

impl Node {
    /// Run `run` (unique in the simulation) of node `name`, started at `now`; `restartable`
    /// when it is the name's first run (a second run of a live name is not restarted).
    pub(crate) fn start(
        name: String,
        run: u64,
        restartable: bool,
        drift_ppm: i64,
        now: u64,
        plan: &Plan,
    ) -> Node {
        let seed = name.bytes().fold(run.wrapping_mul(31) ^ now, |h, b| {
            h.wrapping_mul(0x100_0000_01b3) ^ u64::from(b)
        });
        Node {
            machine: machine(&name, run, plan, now),
            pulls: Vec::new(),
            name,
            run,
            alive: true,
            restartable,
            paused_until: 0,
            was_paused: false,
            inbox: Vec::new(),
            violations: Vec::new(),
            drift_ppm,
            born: now,
            awaiting: None,
            parts: Partitions::new(plan.partitions),
            acked: BTreeMap::new(),
            disk: BTreeMap::new(),
            accept_loss: false,
            losses_accepted: Vec::new(),
            retired: vec![Mark::default(); plan.partitions as usize],
            partitions: plan.partitions,
            rng: ChaCha8Rng::seed_from_u64(seed),
        }
    }

    /// SIGKILL: everything in memory is gone.
    pub(crate) fn kill(&mut self) {
        self.alive = false;
        self.parts.release_all();
        self.pulls.clear();
        self.inbox.clear();
        self.awaiting = None;
        self.acked.clear();
    }

    /// A new run of the same name.
    pub(crate) fn restart(&mut self, run: u64, drift_ppm: i64, now: u64, plan: &Plan) {
        self.kill();
        self.run = run;
        self.machine = machine(&self.name, self.run, plan, now);
        self.drift_ppm = drift_ppm;
        self.born = now;
        self.alive = true;
        self.paused_until = 0;
        self.accept_loss = false;
        self.retired = vec![Mark::default(); self.partitions as usize];
    }

    /// What a run does at its start once it has pulled the marks of the nodes it reaches (as
    /// `serve` does before it serves anything): with `--accept-loss`, accepts the loss of every
    /// partition whose stored PLog lacks the event at its mark (above any loss accepted
    /// before), found by the server's search (`monoseq_store::find_losses`); then fixes the
    /// losses this run knows.
    pub(crate) fn begin_run(&mut self, db: &Arc<Db>, now: u64) {
        if self.accept_loss {
            let store = EventStore::new(db.kv(), AppId(1), TrustLevel::Level0);
            let marks: Vec<(Mark, Mark)> = (0..self.partitions)
                .map(|p| (self.mark_of(p), self.retired_of(p)))
                .collect();
            let found = find_losses(&store, &marks).unwrap_or_else(|e| {
                let text = format!("{}: searching for losses failed: {e}", self.name);
                self.violations.push(Kind::Read.of(text));
                Vec::new()
            });
            for loss in found {
                trace(|| {
                    let run = format!("{}-r{}", self.name, self.run);
                    format!("{now} {run} accepts the loss of {loss}")
                });
                self.losses_accepted.push(loss.accepted(now));
            }
        }
        self.retired = (0..self.partitions).map(|p| self.retired_of(p)).collect();
    }

    /// The numbers of `p` retired by the losses in the marks directory.
    fn retired_of(&self, p: u32) -> Mark {
        self.losses_accepted
            .iter()
            .filter(|l| l.partition == p)
            .fold(Mark::default(), |m, l| m.max(&l.mark))
    }

    /// The command processor's configuration of this run.
    fn cp_config(&self) -> monoseq_cp::Config {
        monoseq_cp::Config {
            retired: self.retired.clone(),
            ..cp_config(self.partitions)
        }
    }

    /// The node's own clock: true time since its start, at its drifting rate.
    pub(crate) fn local(&self, now: u64) -> u64 {
        let dt = i128::from(now - self.born);
        let local = dt + dt * i128::from(self.drift_ppm) / 1_000_000;
        self.born + u64::try_from(local).unwrap_or(0)
    }

    pub(crate) fn describe(&self) -> String {
        let parts: Vec<String> = self.parts.each(|p, x| {
            format!(
                "{p}@{}:{:?}{}{}{}",
                x.epoch,
                x.writer.status(),
                if x.writer.starting() { " starting" } else { "" },
                if x.writer.ready() { "" } else { " not ready" },
                if self.machine.draining(p) {
                    " draining"
                } else {
                    ""
                },
            )
        });
        format!(
            "{} run {} alive {} phase {:?} held {:?} parts {parts:?} paused_until {} awaiting \
             {:?} local {} next_wake {} born {}\n  {:?}",
            self.name,
            self.run,
            self.alive,
            self.machine.phase(),
            self.machine.held().collect::<Vec<_>>(),
            self.paused_until,
            self.awaiting.as_ref().map(|a| a.0),
            self.local(self.born),
            self.machine.next_wake(),
            self.born,
            self.machine
        )
    }

    /// The highest numbers this node knows were acknowledged for `p`: its run's memory and
    /// its marks file.
    fn mark_of(&self, p: u32) -> Mark {
        let memory = self.acked.get(&p).copied().unwrap_or_default();
        let disk = self.disk.get(&p).copied().unwrap_or_default();
        start_mark(disk, memory)
    }

    /// Raises the marks file with marks learned from another node, and adds the losses it
    /// accepted.
    pub(crate) fn learn_marks(&mut self, marks: &BTreeMap<u32, Mark>, losses: &[AcceptedLoss]) {
        for (p, m) in marks {
            let mine = self.disk.entry(*p).or_default();
            *mine = mine.max(m);
        }
        for loss in losses {
            if !self.losses_accepted.contains(loss) {
                self.losses_accepted.push(*loss);
            }
        }
    }

    /// Raises the marks of the partitions not started yet with the marks file's.
    pub(crate) fn refresh_marks(&mut self) {
        for (p, m) in &self.disk {
            if let Some(part) = self.parts.get_mut(*p)
                && part.writer.starting()
            {
                part.writer.raise_mark(*m);
            }
        }
    }

    /// Whether this node waits for the marks of the nodes it reaches: a partition to serve
    /// waits for them, or a partition it serves has not started yet (it is about to check its
    /// PLog against its mark).
    pub(crate) fn wants_marks(&self) -> bool {
        self.alive
            && (!self.pulls.is_empty()
                || self.parts.each(|_, p| p.writer.starting()).contains(&true))
    }

    pub(crate) fn is_member(&self) -> bool {
        self.machine.phase() == Phase::Member
    }

    pub(crate) fn held_count(&self) -> usize {
        self.machine.held().count()
    }

    pub(crate) fn serves(&self, p: u32) -> bool {
        self.alive && self.machine.serves(p) && self.parts.serves(p)
    }

    /// Serves `p` and can take a command for it now.
    pub(crate) fn serves_ready(&self, p: u32) -> bool {
        self.serves(p) && self.parts.admit(p, |x| x.writer.ready()) == Ok(true)
    }

    /// Whether this run holds partition `p` (acquired and not fenced off: starting, serving
    /// or handing off), as the server's `CommandProcessor::serves`: it answers reads of `p`
    /// itself.
    pub(crate) fn holds(&self, p: u32) -> bool {
        self.alive && self.parts.serves(p)
    }

    /// The end of `p` as this run knows it: one past the highest PLog offset its writer
    /// acknowledged (`CommandProcessor::plog_end`); `None` when it does not hold `p`.
    pub(crate) fn plog_end(&self, p: u32) -> Option<u64> {
        self.parts.held(p, |part| part.writer.acked().plog + 1)
    }

    /// A page of `p`'s PLog from `from`, as the server's `local_page` reads it: below this
    /// run's end of `p`, with the ranges its known accepted losses retired as gaps. `None`
    /// when this run does not hold `p`. Reads go to the database unfenced (any reader may
    /// read), through no fault of the database's own random source (the caller decides the
    /// faults of its reads, see `crate::follow`).
    pub(crate) fn read_page(
        &self,
        db: &Db,
        p: u32,
        from: u64,
        limit: usize,
    ) -> Option<Result<Vec<PageItem>, ReadError>> {
        let end = self.plog_end(p)?;
        let retired = retired_ranges(&self.losses_accepted, p);
        let store = EventStore::new(db.kv(), AppId(1), TrustLevel::Level0);
        Some(store.read_plog_page(PartitionId(p), from, limit, end, &retired))
    }

    pub(crate) fn enqueue(&mut self, p: u32, r: Request) {
        if let Some(part) = self.parts.get_mut(p) {
            part.queue.push(r);
        }
    }

    /// Where a request for `p` goes at simulated time `now` (the node machine's routing, on
    /// this node's last read of the lease table, aged by its own clock); `served_here` when
    /// this node answers such a request itself, `relayed` when another node relayed it here.
    pub(crate) fn route(&self, p: u32, now: u64, served_here: bool, relayed: bool) -> Route {
        self.machine.route(p, self.local(now), served_here, relayed)
    }

    pub(crate) fn step(&mut self, now: u64, db: &Arc<Db>, answers: &mut Answers) {
        if !self.alive {
            return;
        }
        if now < self.paused_until {
            self.was_paused = true;
            return;
        }
        let t = self.local(now);
        // A process frozen in the middle of its work goes on where it stopped: the partitions
        // it served write before its watchdog can notice that their leases ran out (only the
        // fence stops those writes).
        let resumed = std::mem::take(&mut self.was_paused);
        if resumed {
            self.step_partitions(now, t, answers);
        }
        if let Some((at, _)) = &self.awaiting
            && *at <= now
            && let Some((_, reply)) = self.awaiting.take()
        {
            self.machine.reply(t, reply);
        }
        // The marks asked for were pulled before this step (see `Sim::tick`).
        for (p, epoch) in std::mem::take(&mut self.pulls) {
            self.machine.marks_pulled(t, p, epoch);
        }
        self.actions(now, t, db, answers);
        self.step_partitions(now, t, answers);
        self.actions(now, t, db, answers);
    }

    fn step_partitions(&mut self, now: u64, t: u64, answers: &mut Answers) {
        for p in 0..self.partitions {
            self.step_partition(p, now, t, answers);
        }
    }

    /// Carries out what the node machine asks for now, until it asks for nothing more. A
    /// machine that never stops asking is a violation (it would hang the seed).
    fn actions(&mut self, now: u64, t: u64, db: &Arc<Db>, answers: &mut Answers) {
        for _ in 0..ACTIONS_PER_STEP_MAX {
            let Some(action) = self.machine.poll(t) else {
                return;
            };
            if !matches!(action, NodeAction::Call(_)) {
                trace(|| format!("{now} {}-r{} {action:?}", self.name, self.run));
            }
            if !self.carry_out(action, now, t, db, answers) {
                return;
            }
        }
        self.violations.push(Kind::Liveness.of(format!(
            "{}: the node machine asked for more than {ACTIONS_PER_STEP_MAX} actions at one \
             instant",
            self.name
        )));
    }

    /// Does the simulated I/O of one action of the node machine, and tells the machine what
    /// came of it; `false` when this run is over.
    fn carry_out(
        &mut self,
        action: NodeAction,
        now: u64,
        t: u64,
        db: &Arc<Db>,
        answers: &mut Answers,
    ) -> bool {
        match action {
            NodeAction::Call(call) => self.call(call, now, t, db),
            NodeAction::PullMarks { partition, epoch } => self.pulls.push((partition, epoch)),
            NodeAction::Settle { partition, epoch } => {
                let settled = self.settle(db, partition, epoch);
                self.machine.settled(t, partition, epoch, settled);
            }
            NodeAction::Start {
                partition, epoch, ..
            } => self.start_partition(db, partition, epoch, now),
            NodeAction::Stop { partition } | NodeAction::Drained { partition, .. } => {
                self.drop_partition(partition, answers);
            }
            NodeAction::Refuse(_) | NodeAction::Superseded => {
                self.kill();
                return false;
            }
            NodeAction::EpochWentBack {
                partition,
                seen,
                found,
            } if db.went_back() == 0 => self.violations.push(Kind::Safety.of(format!(
                "{}: partition {partition}'s epoch went back from {seen} to {found} although \
                 the database lost nothing",
                self.name
            ))),
            // A draining partition takes no more commands ([`Node::serves`]) and reports idle
            // when it is ([`Node::advance`]); readiness and log lines are not simulated.
            NodeAction::Drain { .. }
            | NodeAction::Hold { .. }
            | NodeAction::Unhold { .. }
            | NodeAction::Stopping { .. }
            | NodeAction::HandingOff { .. }
            | NodeAction::Claimed { .. }
            | NodeAction::EpochWentBack { .. }
            | NodeAction::Left => {}
        }
        true
    }

    /// Starts partition `p` under `epoch`: the real lifecycle and writer, writing through this
    /// node's fenced view of the database, opened with the marks this node knows.
    fn start_partition(&mut self, db: &Arc<Db>, p: u32, epoch: u64, now: u64) {
        let kv = Arc::new(SimKv::new(Arc::clone(db), &self.name, p, epoch));
        let store = EventStore::new(kv, AppId(1), TrustLevel::Level0);
        let acked = self.mark_of(p);
        let writer = ManualPartition::open(store, &self.cp_config(), p, acked)
            .expect("the simulation's processor configuration is valid");
        let part = Part {
            epoch,
            writer,
            queue: Vec::new(),
            waiting: BTreeMap::new(),
            next_tag: 0,
            retry_at: now,
        };
        if !matches!(self.parts.acquire(p, || Ok(part)), Ok(true)) {
            self.violations.push(Kind::Safety.of(format!(
                "{}: partition {p} was started under epoch {epoch} while this run held it",
                self.name
            )));
        }
    }

    /// `p` is no longer served here: every command not answered yet is answered "not the
    /// owner".
    fn drop_partition(&mut self, p: u32, answers: &mut Answers) {
        if let Some(mut part) = self.parts.release(p) {
            part.refuse_all(&CommandError::NotOwner { partition: p }, answers);
        }
    }

    /// Carries a lease call to the database, with its faults.
    fn call(&mut self, call: Call, now: u64, t: u64, db: &Arc<Db>) {
        trace(|| format!("{now} {}-r{} (local {t}) {call:?}", self.name, self.run));
        let (late, late_ms_max) = db.lateness();
        let reply = match db.lease_call_fate(&self.name) {
            Err(e) => failed(&call, &e.message),
            Ok(answered) => {
                let reply = db.lease_call(&call, self.machine.config());
                if !answered {
                    failed(&call, "the answer was lost")
                } else if self.rng.random_range(0..1_000u32) < late {
                    let late = self.rng.random_range(10..=late_ms_max.max(10));
                    self.awaiting = Some((now + late, reply));
                    return;
                } else {
                    reply
                }
            }
        };
        self.machine.reply(t, reply);
    }

    fn step_partition(&mut self, p: u32, now: u64, t: u64, answers: &mut Answers) {
        let Some(mut part) = self.parts.release(p) else {
            return;
        };
        self.advance(p, &mut part, now, t, answers);
        // Held again as it was: it was released only to be stepped beside the node.
        let _ = self.parts.acquire(p, || Ok(part));
    }

    /// One tick of a started partition: its worker's step, its queue carried to it, its
    /// lifecycle advanced; the serving machine hears when it is fenced, and when it is idle
    /// while it drains.
    fn advance(&mut self, p: u32, part: &mut Part, now: u64, t: u64, answers: &mut Answers) {
        if now >= part.retry_at {
            // One piece of background work per tick: a whole actualization, or one flush.
            if let Step::RetryAfter(d) = part.writer.step() {
                part.retry_at = now + u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
            }
        }
        part.submit_queued(now);
        let given = part.writer.advance(now);
        if !part.writer.starting() {
            // What it acknowledged (a covered tail, a group) is durable in the marks file
            // before the answers leave.
            let acked = part.writer.acked();
            self.acked.insert(p, acked);
            self.raise_disk(p, acked);
        }
        part.deliver(given, answers);
        if part.fenced() {
            self.machine.fenced(t, p);
        } else if self.machine.draining(p) && part.writer.idle() {
            self.machine.idle(t, p, part.epoch);
        }
    }

    /// Settles `p`'s accepted losses under `epoch` before it is served, by the server's rule
    /// (`monoseq_store::settle_losses`) on this node's fenced view of the database.
    fn settle(&self, db: &Arc<Db>, p: u32, epoch: u64) -> Settled {
        let kv = Arc::new(SimKv::new(Arc::clone(db), &self.name, p, epoch));
        let store = EventStore::new(kv, AppId(1), TrustLevel::Level0);
        let known = self.retired[p as usize];
        match settle_losses(
            store.seq_storage(PartitionId(p)),
            p,
            known,
            self.retired_of(p),
        ) {
            Ok(_) => Settled::Done,
            Err(e) if e.needs_restart() => Settled::Refused(e.to_string()),
            Err(e) => Settled::Failed(e.to_string()),
        }
    }

    fn raise_disk(&mut self, p: u32, mark: Mark) {
        let disk = self.disk.entry(p).or_default();
        *disk = disk.max(&mark);
    }
}
