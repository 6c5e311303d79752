//! monoseq-sim: a deterministic, seeded simulation of a whole cluster. Several nodes run the
//! real membership state machine (`monoseq-membership`), the real serving machine beside it
//! (marks pulled, losses settled, partitions started, stopped and drained), and the real
//! partitions (`monoseq_cp::ManualPartition`: the lifecycle the partition task drives, and its
//! writer: sequencing, idempotency window, group writes, read-back after a failed write) on
//! one simulated database with a synchronous standby (`db.rs`).
//! Clients send keyed commands to any node and retry with the same key until answered.
//!
//! One seed is one exact run: time is simulated in ticks, every random choice comes from the
//! seed, and nothing runs on another thread. Faults: node pauses longer than a lease, kills
//! and restarts, a second live run of one node name, clock-rate drift within
//! [`DRIFT_PPM_MAX`], lost and delayed lease calls (in some seeds every call, by up to a
//! renewal interval), failing calls, writes whose outcome is
//! unknown, cut links between nodes and between a node and the database, and database
//! failovers. The invariants are checked at every tick and at the end ([`Sim::run`]).

// Library code answers errors; an `expect` states why it cannot fail.
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

mod consume;
mod db;
mod follow;
mod groups;
mod node;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use monoseq_core::WsId;
use monoseq_cp::{CommandError, Outcome, operation_command, operation_key};
use monoseq_membership::{Route, Unplaced};
use monoseq_store::{AcceptedLoss, AppId, EventStore, PartitionId, TrustLevel};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

pub use consume::CONSUMERS_MAX;
pub use db::{Db, DbFaults, SimKv};
pub use follow::FOLLOWERS_MAX;
use node::{Node, Request};

/// Most commands in one group.
const GROUP_COMMANDS_MAX: usize = 16;
/// Simulated milliseconds per tick.
pub const TICK_MS: u64 = 10;
/// How long the group may take at the end to deliver every event to some member.
const GROUP_CATCH_UP_MS: u64 = 30_000;
/// Bound of every node clock's rate error, parts per million (±2 %).
pub const DRIFT_PPM_MAX: i64 = 20_000;
/// Lease duration of the simulated cluster, milliseconds.
pub const LEASE_MS: u64 = 1_500;
/// Renewal interval, milliseconds.
pub const RENEW_MS: u64 = 300;
/// How long a client waits for an answer before it sends its command again (to any node).
pub const CLIENT_TIMEOUT_MS: u64 = 1_000;
/// After the faults stop, every partition must be served again within this long: a lease to
/// expire, a renewal interval to notice, and time to actualize (generous: a few ticks).
pub const RECOVERY_MS: u64 = LEASE_MS + 2 * RENEW_MS + 500;
/// After the faults stop and every partition is served, every live node must hold its fair
/// share (within one partition) within this many renewal intervals.
pub const BALANCE_ROUNDS: u64 = 6;

/// What kind of invariant a run found broken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Kind {
    /// A number, key or epoch given twice, or an acknowledged event lost, unreadable or
    /// refused for good.
    Safety,
    /// Partitions not served again, or nodes not balanced, in time after the faults stopped.
    Liveness,
    /// A reader (follower, consumer, group member) given a wrong event or gap, or not every
    /// event.
    Reader,
    /// The checks could not read the simulated database.
    Read,
}

impl Kind {
    /// A violation of this kind, saying `text`.
    #[must_use]
    pub fn of(self, text: impl Into<String>) -> Violation {
        Violation {
            kind: self,
            at: None,
            text: text.into(),
        }
    }
}

/// When a run found a violation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum At {
    /// At this simulated millisecond.
    Ms(u64),
    /// In the checks after the run.
    End,
}

/// An invariant a run found broken: its kind, when, and what (`Display`: the line a failing
/// seed prints).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// What kind of invariant.
    pub kind: Kind,
    /// When it was found (`None`: in the final checks of the stored events).
    pub at: Option<At>,
    /// What was found.
    pub text: String,
}

impl Violation {
    /// The violation, found `at` unless it says when already.
    #[must_use]
    pub fn at(mut self, at: At) -> Violation {
        self.at.get_or_insert(at);
        self
    }
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.at {
            Some(At::Ms(ms)) => write!(f, "at {ms} ms: {}", self.text),
            Some(At::End) => write!(f, "at the end: {}", self.text),
            None => f.write_str(&self.text),
        }
    }
}

/// What a seed runs.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    /// Node names.
    pub nodes: usize,
    /// Partitions.
    pub partitions: u32,
    /// Clients, each with a workspace of its own.
    pub clients: usize,
    /// Simulated milliseconds with faults.
    pub fault_ms: u64,
    /// Simulated milliseconds without faults after them.
    pub quiet_ms: u64,
    /// The database may go back in time (an asynchronous standby promoted with a lost tail,
    /// a backup restored); the operator then restarts every node with `--accept-loss` when
    /// the faults stop.
    pub losses: bool,
}

impl Plan {
    /// A plan drawn from `seed`.
    #[must_use]
    pub fn from_seed(seed: u64) -> Plan {
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x9a);
        Plan {
            nodes: rng.random_range(2..=4),
            partitions: rng.random_range(1..=8),
            clients: rng.random_range(2..=8),
            fault_ms: rng.random_range(3_000..=8_000),
            quiet_ms: RECOVERY_MS + BALANCE_ROUNDS * RENEW_MS + 1_500,
            losses: rng.random_bool(0.5),
        }
    }
}

/// What a run counted.
#[derive(Debug, Default, Clone)]
pub struct Report {
    /// Commands acknowledged (first answers and replays).
    pub acked: u64,
    /// Answers that were replays of an earlier write.
    pub replayed: u64,
    /// Transient errors clients retried.
    pub retried: u64,
    /// Faults injected, by kind.
    pub faults: BTreeMap<&'static str, u64>,
    /// Events and gaps delivered to followers.
    pub followed: u64,
    /// Consumer positions stored (answered as such).
    pub positions_set: u64,
    /// Position writes refused because another instance had moved the position.
    pub position_conflicts: u64,
    /// Position writes whose answer was lost, found written by reading back.
    pub positions_read_back: u64,
    /// Consumer group commits stored.
    pub group_commits: u64,
    /// Consumer group commits refused because the session no longer held the partition.
    pub group_stale_commits: u64,
    /// Events and gaps delivered to the group's members (counting redeliveries once).
    pub group_delivered: u64,
    /// A digest of every event stored at the end, times included: one seed gives the same in
    /// every run.
    pub stored_digest: u64,
}

/// A client: one workspace, one command at a time, retried with its key until answered.
struct Client {
    ws: u64,
    op: u64,
    sent_at: Option<u64>,
    next_send: u64,
}

/// Stored events with a key: (partition, PLog offset) to (workspace, key).
type Keyed = BTreeMap<(u32, u64), (u64, String)>;

/// The whole simulated cluster.
pub struct Sim {
    seed: u64,
    plan: Plan,
    rng: ChaCha8Rng,
    now: u64,
    db: Arc<Db>,
    nodes: Vec<Node>,
    clients: Vec<Client>,
    /// Links between nodes that are cut (both directions), by node index.
    cut_links: BTreeSet<(usize, usize)>,
    /// Acknowledged numbers: (partition, PLog offset), (ws, WLog offset), (ws, record ID),
    /// each with the key it was acknowledged for.
    plog: BTreeMap<(u32, u64), String>,
    wlog: BTreeMap<(u64, u64), String>,
    ids: BTreeMap<(u64, u64), String>,
    /// Every key's acknowledged answer.
    answers: BTreeMap<String, (u32, u64)>,
    report: Report,
    /// Runs started so far.
    runs: u64,
    /// The followers, their answers on the way, and the random source of their choices
    /// (their own, so that a seed's commands and faults do not depend on them).
    followers: Vec<follow::Follower>,
    in_flight: Vec<follow::InFlight>,
    readers_rng: ChaCha8Rng,
    /// The consumer instances, and what the checks know of each consumer name's position.
    consumers: Vec<consume::Consumer>,
    known: Vec<consume::Known>,
    /// The consumer group and what its checks know.
    group: groups::GroupSim,
}

/// The answer of a command the node it reached cannot place (as the server's: 503
/// `partition_unavailable`, transient).
fn unplaced(partition: u32, why: Unplaced) -> CommandError {
    unavailable(partition, &why.message(partition))
}

/// A transient refusal of a command for `partition`, `partition_unavailable`.
fn unavailable(partition: u32, reason: &str) -> CommandError {
    CommandError::Unavailable {
        partition,
        reason: reason.to_owned(),
    }
}

/// The config every partition writer runs with.
fn cp_config(partitions: u32) -> monoseq_cp::Config {
    monoseq_cp::Config {
        partitions,
        idempotency_window_events: 10_000,
        group_commands_max: GROUP_COMMANDS_MAX,
        ..monoseq_cp::Config::default()
    }
}

impl Sim {
    /// The cluster of `seed`, running `plan`.
    #[must_use]
    pub fn new(seed: u64, plan: Plan) -> Sim {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let db = Db::new(seed);
        let nodes = (0..plan.nodes)
            .map(|i| {
                let drift = rng.random_range(-DRIFT_PPM_MAX..=DRIFT_PPM_MAX);
                Node::start(format!("n{i}"), i as u64, true, drift, 0, &plan)
            })
            .collect();
        let mut readers_rng = ChaCha8Rng::seed_from_u64(seed ^ 0xf011);
        let followers = (0..readers_rng.random_range(1..=follow::FOLLOWERS_MAX))
            .map(|_| {
                let p = readers_rng.random_range(0..plan.partitions);
                let limit = readers_rng.random_range(1..=64);
                follow::Follower::new(p, limit, readers_rng.random_range(0..2_000))
            })
            .collect();
        let (consumers, known) = consume::consumers(&mut readers_rng, plan.partitions);
        let group = groups::group(&mut ChaCha8Rng::seed_from_u64(seed ^ 0x9e37), plan.nodes);
        let clients = (0..plan.clients)
            .map(|c| Client {
                ws: c as u64 + 1,
                op: 1,
                sent_at: None,
                next_send: rng.random_range(0..500),
            })
            .collect();
        Sim {
            seed,
            plan,
            rng,
            now: 0,
            db,
            nodes,
            clients,
            cut_links: BTreeSet::new(),
            plog: BTreeMap::new(),
            wlog: BTreeMap::new(),
            ids: BTreeMap::new(),
            answers: BTreeMap::new(),
            report: Report::default(),
            runs: plan.nodes as u64,
            followers,
            in_flight: Vec::new(),
            readers_rng,
            consumers,
            known,
            group,
        }
    }

    /// Runs the plan: faults, then quiet; checks every invariant at every tick and at the end.
    ///
    /// # Errors
    ///
    /// The first invariant found broken, with the time it was found.
    pub fn run(mut self) -> Result<Report, Violation> {
        let quiet_from = self.plan.fault_ms;
        let end = quiet_from + self.plan.quiet_ms;
        self.db.set_faults(DbFaults {
            fail: self.rng.random_range(0..=20),
            unknown: self.rng.random_range(0..=30),
            // One seed in four stalls every lease call, one in four half of them: nothing may
            // be served twice meanwhile (moves then go one call a round, or not at all).
            late: [50, 50, 500, 1_000][self.rng.random_range(0..4usize)],
            late_ms_max: RENEW_MS,
        });
        let mut served_since: Option<u64> = None;
        let mut healed = false;
        while self.now < end {
            self.now += TICK_MS;
            self.db.set_now(self.now);
            if self.now < quiet_from {
                self.inject();
            } else if !healed {
                healed = true;
                self.heal_all();
            }
            self.tick();
            self.check_now().map_err(|v| v.at(At::Ms(self.now)))?;
            if self.now > quiet_from {
                if self.all_served() {
                    served_since.get_or_insert(self.now);
                } else if self.now > quiet_from + RECOVERY_MS {
                    let text = format!(
                        "{RECOVERY_MS} ms after the faults stopped, partitions {:?} are still \
                         not served\n{}",
                        self.unserved(),
                        self.dump()
                    );
                    return Err(Kind::Liveness.of(text).at(At::Ms(self.now)));
                }
                if let Some(since) = served_since
                    && self.now > since + BALANCE_ROUNDS * RENEW_MS
                {
                    self.check_balance().map_err(|v| v.at(At::Ms(self.now)))?;
                }
            }
        }
        self.last_retries().map_err(|v| v.at(At::End))?;
        self.catch_up_group(GROUP_CATCH_UP_MS / TICK_MS)
            .map_err(|v| v.at(At::End))?;
        self.catch_up_followers().map_err(|v| v.at(At::End))?;
        self.report.group_delivered = self.group.delivered_count();
        self.report.stored_digest = self.check_end()?;
        self.report.followed = self.followers.iter().map(|f| f.seen.len() as u64).sum();
        Ok(self.report)
    }

    /// After the run, each client's command not answered yet is sent once more to its
    /// partition's owner (a client retries until answered, and without faults its retry
    /// reaches the owner), and the cluster runs until it is answered: a write that landed but
    /// whose answer was lost is acknowledged by its replay, so its partition's end covers it.
    fn last_retries(&mut self) -> Result<(), Violation> {
        for c in 0..self.clients.len() {
            let client = &mut self.clients[c];
            client.sent_at = Some(self.now);
            let request = Request {
                client: c,
                op: client.op,
                ws: client.ws,
                cmd: operation_command(client.ws, client.op),
                key: operation_key(client.ws, client.op),
            };
            let p = WsId(request.ws).partition(self.plan.partitions);
            let owner = (0..self.nodes.len())
                .find(|&n| self.nodes[n].is_member() && self.nodes[n].serves_ready(p))
                .ok_or_else(|| {
                    Kind::Liveness.of(format!("no node serves partition {p} at the end"))
                })?;
            self.nodes[owner].enqueue(p, request);
        }
        for _ in 0..CLIENT_TIMEOUT_MS / TICK_MS {
            self.now += TICK_MS;
            self.db.set_now(self.now);
            self.tick();
            self.check_now()?;
        }
        Ok(())
    }

    fn count(&mut self, fault: &'static str) {
        *self.report.faults.entry(fault).or_insert(0) += 1;
    }

    /// Injects the faults of one tick, each with a small probability.
    fn inject(&mut self) {
        let (roll, who) = self.roll_fault();
        match roll {
            0..=19 | 32..=37 => self.node_fault(roll, who),
            20..=31 | 38..=43 => self.database_fault(roll, who),
            _ => {}
        }
        self.restart_dead();
    }

    /// Draws the fault of this tick (a roll out of 10 000) and the node it hits; once the
    /// database lost writes, the faults that take a node out of reach are not drawn.
    fn roll_fault(&mut self) -> (u32, usize) {
        let n = self.nodes.len();
        let mut roll = self.rng.random_range(0..10_000u32);
        let who = self.rng.random_range(0..n);
        if self.db.went_back() > 0 && roll <= 19
            || self.db.went_back() > 0 && (32..=37).contains(&roll)
        {
            // Once the database lost writes, the nodes that acknowledged them stay reachable
            // (no kill, pause, second run or cut between nodes): marks travel between live
            // nodes, and a node's marks are out of reach while it is down. See DESIGN.md, "What
            // if the database loses acknowledged writes?".
            roll = 10_000;
        }
        (roll, who)
    }

    /// A fault of one node (`who`): a pause, a kill, a second run of its name, or a link to
    /// another node cut or mended.
    fn node_fault(&mut self, roll: u32, who: usize) {
        let n = self.nodes.len();
        match roll {
            0..=9 => {
                // A pause longer than a lease (a stop-the-world, a frozen VM).
                let pause = self.rng.random_range(LEASE_MS..=3 * LEASE_MS);
                self.nodes[who].paused_until = self.now + pause;
                self.count("pause");
            }
            10..=16 => {
                self.nodes[who].kill();
                self.count("kill");
            }
            17..=19 => {
                // A second run of the same name while the first may still live.
                let name = self.nodes[who].name.clone();
                let drift = self.rng.random_range(-DRIFT_PPM_MAX..=DRIFT_PPM_MAX);
                let run = self.next_run();
                self.nodes
                    .push(Node::start(name, run, false, drift, self.now, &self.plan));
                self.begin_run(self.nodes.len() - 1);
                self.count("second run of a name");
            }
            32..=37 if n > 1 => {
                let other = (who + 1 + self.rng.random_range(0..n - 1)) % n;
                let link = (who.min(other), who.max(other));
                if !self.cut_links.remove(&link) {
                    self.cut_links.insert(link);
                }
                self.count("link between nodes cut or mended");
            }
            _ => {}
        }
    }

    /// A fault of the database: a failover, a lost tail or a restored backup, or `who` cut
    /// off from it.
    fn database_fault(&mut self, roll: u32, who: usize) {
        match roll {
            20..=25 => {
                let until = self.now + self.rng.random_range(200..=2_000);
                self.db.fail_over(until);
                self.count("database failover");
            }
            38..=41 if self.plan.losses && self.loss_in_scope() => {
                // An asynchronous standby that was behind is promoted: its lost tail.
                let lag = self.rng.random_range(20..=1_000);
                let until = self.now + self.rng.random_range(200..=1_500);
                self.db.go_back(self.now.saturating_sub(lag), until);
                node::trace(|| format!("{} database back by {lag} ms", self.now));
                self.count("asynchronous standby promoted with a lost tail");
            }
            42..=43 if self.plan.losses && self.loss_in_scope() => {
                // A backup restored (a point-in-time recovery to an earlier point).
                let back = self.rng.random_range(1_000..=4_000);
                let until = self.now + self.rng.random_range(500..=2_000);
                self.db.go_back(self.now.saturating_sub(back), until);
                node::trace(|| format!("{} database back by {back} ms", self.now));
                self.count("database restored to an earlier point");
            }
            26..=31 => {
                let name = self.nodes[who].name.clone();
                let cut = self.rng.random_bool(0.5);
                self.db.cut(&name, cut);
                self.count("node cut off from the database");
            }
            _ => {}
        }
    }

    /// Dead nodes come back after a while (a restart with a new run).
    fn restart_dead(&mut self) {
        for i in 0..self.nodes.len() {
            if !self.nodes[i].alive && self.nodes[i].restartable && self.rng.random_bool(0.01) {
                let drift = self.rng.random_range(-DRIFT_PPM_MAX..=DRIFT_PPM_MAX);
                let run = self.next_run();
                self.nodes[i].restart(run, drift, self.now, &self.plan);
                self.begin_run(i);
                self.count("restart");
            }
        }
    }

    /// The faults stop: links mend, the database answers, dead nodes restart, nothing more
    /// is lost. Second runs of a name stay as they are (one of the two gave up).
    fn heal_all(&mut self) {
        self.db.heal();
        self.cut_links.clear();
        if self.db.went_back() > 0 {
            // The operator, told of the loss, restarts every node with `--accept-loss`.
            for i in 0..self.nodes.len() {
                let name = self.nodes[i].name.clone();
                let first_run_of_name = self
                    .nodes
                    .iter()
                    .position(|n| n.name == name)
                    .is_some_and(|first| first == i);
                self.nodes[i].kill();
                if first_run_of_name {
                    let drift = self.rng.random_range(-DRIFT_PPM_MAX..=DRIFT_PPM_MAX);
                    let run = self.next_run();
                    self.nodes[i].restart(run, drift, self.now, &self.plan);
                    self.nodes[i].accept_loss = true;
                    self.begin_run(i);
                }
                self.nodes[i].restartable = false;
            }
            self.count("operator restart with --accept-loss");
        }
        for i in 0..self.nodes.len() {
            let name = self.nodes[i].name.clone();
            self.nodes[i].paused_until = 0;
            if !self.nodes[i].alive && self.nodes[i].restartable && !self.name_alive(&name) {
                let drift = self.rng.random_range(-DRIFT_PPM_MAX..=DRIFT_PPM_MAX);
                let run = self.next_run();
                self.nodes[i].restart(run, drift, self.now, &self.plan);
                self.begin_run(i);
            }
        }
    }

    /// A run of node `i` starts: it pulls the marks of the nodes it reaches, then accepts
    /// losses (with `--accept-loss`) and fixes the losses it knows (see [`Node::begin_run`]).
    fn begin_run(&mut self, i: usize) {
        self.gossip(Some(i));
        let db = Arc::clone(&self.db);
        self.nodes[i].begin_run(&db, self.now);
    }

    /// A run number never used before in this simulation (run IDs are unique per start).
    fn next_run(&mut self) -> u64 {
        self.runs += 1;
        self.runs
    }

    fn name_alive(&self, name: &str) -> bool {
        self.nodes.iter().any(|n| n.alive && n.name == name)
    }

    /// Every node pulls the marks of every node it reaches and raises its own marks file with
    /// them (a max-merge), once per renewal interval; a node about to serve a partition pulls
    /// at once (see [`Sim::tick`]).
    fn gossip(&mut self, only: Option<usize>) {
        let n = self.nodes.len();
        for i in 0..n {
            if only.is_some_and(|o| o != i) || !self.up(i) {
                continue;
            }
            for j in 0..n {
                if i == j || !self.up(j) || self.cut_links.contains(&(i.min(j), i.max(j))) {
                    continue;
                }
                let (marks, losses) = (
                    self.nodes[j].disk.clone(),
                    self.nodes[j].losses_accepted.clone(),
                );
                self.nodes[i].learn_marks(&marks, &losses);
            }
        }
    }

    /// Whether a loss of the database now is within what monoseq guarantees to notice: every
    /// node runs and reaches the others, and every partition is served (its owner covered
    /// the stored PLog with its marks). See DESIGN.md, "What if the database loses
    /// acknowledged writes?".
    fn loss_in_scope(&self) -> bool {
        self.cut_links.is_empty()
            && (0..self.nodes.len()).all(|i| {
                let n = &self.nodes[i];
                (n.alive || !n.restartable) && (!n.alive || self.up(i))
            })
            && self.all_served()
    }

    /// Whether node `i` runs and is not paused.
    fn up(&self, i: usize) -> bool {
        self.nodes[i].alive && self.now >= self.nodes[i].paused_until
    }

    /// One tick: nodes step, clients send, answers arrive.
    fn tick(&mut self) {
        if self.now.is_multiple_of(RENEW_MS) {
            self.gossip(None);
        }
        let mut answers: Vec<(Request, Result<Outcome, CommandError>)> = Vec::new();
        for i in 0..self.nodes.len() {
            if self.nodes[i].wants_marks() {
                // A partition's new owner learns what its former owners acknowledged.
                self.gossip(Some(i));
                self.nodes[i].refresh_marks();
            }
            if self.up(i) {
                // Requests accepted while it was paused, taken now that it runs again.
                for (request, relayed) in std::mem::take(&mut self.nodes[i].inbox) {
                    answers.extend(self.route(i, request, !relayed));
                }
            }
            let db = Arc::clone(&self.db);
            self.nodes[i].step(self.now, &db, &mut answers);
        }
        let mut sends = Vec::new();
        for (c, client) in self.clients.iter_mut().enumerate() {
            let due = match client.sent_at {
                Some(at) => self.now >= at + CLIENT_TIMEOUT_MS,
                None => self.now >= client.next_send,
            };
            if due {
                client.sent_at = Some(self.now);
                sends.push(Request {
                    client: c,
                    op: client.op,
                    ws: client.ws,
                    cmd: operation_command(client.ws, client.op),
                    key: operation_key(client.ws, client.op),
                });
            }
        }
        for request in sends {
            let to = self.rng.random_range(0..self.nodes.len());
            if let Some(refused) = self.route(to, request, true) {
                answers.push(refused);
            }
        }
        for (request, result) in answers {
            self.answer(request, result);
        }
        self.tick_followers();
        self.tick_consumers();
        self.tick_group();
    }

    /// Delivers `request` to node `to`, which places it as the server does (`Node::route`):
    /// queued on its partition there, relayed once to the owner it read, or answered at once
    /// (`may_forward` is false for a relayed request). An immediate answer when it does not
    /// queue it.
    fn route(
        &mut self,
        to: usize,
        request: Request,
        may_forward: bool,
    ) -> Option<(Request, Result<Outcome, CommandError>)> {
        let partition = WsId(request.ws).partition(self.plan.partitions);
        let node = &mut self.nodes[to];
        if !node.alive {
            // Connection refused, at once: the client tries again soon, through any node.
            return Some((request, Err(unavailable(partition, "connection refused"))));
        }
        if self.now < node.paused_until {
            // Accepted by the kernel; the process runs it when it wakes.
            node.inbox.push((request, !may_forward));
            return None;
        }
        match node.route(partition, self.now, node.serves(partition), !may_forward) {
            Route::Local => {
                node.enqueue(partition, request);
                None
            }
            Route::Unavailable(why) => Some((request, Err(unplaced(partition, why)))),
            Route::Relay(owner) => match self.relay_target(to, &owner.node_id) {
                Some(target) => self.route(target, request, false),
                // Relaying failed: the node answers `owner_unreachable` (503).
                None => Some((
                    request,
                    Err(unavailable(partition, "the owner did not answer")),
                )),
            },
        }
    }

    /// The node a request relayed by node `from` to the owner named `owner` reaches: none
    /// when no live member runs under the name, or the link between them is cut.
    fn relay_target(&self, from: usize, owner: &str) -> Option<usize> {
        let target = self
            .nodes
            .iter()
            .position(|n| n.alive && n.name == owner && n.is_member())?;
        let link = (from.min(target), from.max(target));
        (target != from && !self.cut_links.contains(&link)).then_some(target)
    }

    /// A client receives an answer: acknowledgments are recorded and checked whatever
    /// operation they answer; the client moves on only with an answer to its current one.
    fn answer(&mut self, request: Request, result: Result<Outcome, CommandError>) {
        match &result {
            Ok(outcome) => self.acknowledge(&request, outcome),
            Err(e) if e.is_transient() => self.report.retried += 1,
            Err(_) => {}
        }
        let client = &mut self.clients[request.client];
        if request.op != client.op {
            return;
        }
        match result {
            Ok(_) => {
                client.op += 1;
                client.sent_at = None;
                client.next_send = self.now + self.rng.random_range(0..50);
            }
            Err(e) if e.is_transient() || matches!(e, CommandError::Corrupted(_)) => {
                // A partition refused after a loss waits for the operator: try again later.
                client.sent_at = None;
                client.next_send = self.now + self.rng.random_range(20..200);
            }
            Err(e) => {
                let broken = format!("key {} was refused for good ({e:?}): {e}", request.key);
                self.report.faults.insert("permanent refusal", 1);
                self.pending_violation(Kind::Safety, broken);
            }
        }
    }

    fn pending_violation(&mut self, kind: Kind, text: String) {
        self.nodes[0].violations.push(kind.of(text));
    }

    fn acknowledge(&mut self, request: &Request, o: &Outcome) {
        node::trace(|| {
            format!(
                "{} ack {} p{} plog {} wlog {}{}",
                self.now,
                request.key,
                o.partition,
                o.plog_offset,
                o.wlog_offset,
                if o.replayed { " replayed" } else { "" }
            )
        });
        self.report.acked += 1;
        if o.replayed {
            self.report.replayed += 1;
        }
        let key = &request.key;
        let mut broken = Vec::new();
        match self.answers.get(key) {
            // A key applied again after the database lost its first event is applied once.
            Some(&first) if first != (o.partition, o.plog_offset) && self.holds(first, key) => {
                broken.push(format!(
                    "key {key} was applied twice: at PLog offsets {} and {} of partition {}",
                    first.1, o.plog_offset, o.partition
                ));
            }
            _ => {
                self.answers
                    .insert(key.clone(), (o.partition, o.plog_offset));
            }
        }
        let mut once = |what: String, holder: Option<&String>| {
            if let Some(h) = holder
                && h != key
            {
                broken.push(format!("{what} was acknowledged to {h} and to {key}"));
            }
        };
        once(
            format!("PLog offset {} of partition {}", o.plog_offset, o.partition),
            self.plog.get(&(o.partition, o.plog_offset)),
        );
        once(
            format!("WLog offset {} of workspace {}", o.wlog_offset, request.ws),
            self.wlog.get(&(request.ws, o.wlog_offset)),
        );
        for id in o.ids.values() {
            once(
                format!("record ID {id} of workspace {}", request.ws),
                self.ids.get(&(request.ws, *id)),
            );
        }
        self.check_followers_saw(o.partition, o.plog_offset, key);
        self.plog.insert((o.partition, o.plog_offset), key.clone());
        self.wlog.insert((request.ws, o.wlog_offset), key.clone());
        for id in o.ids.values() {
            self.ids.insert((request.ws, *id), key.clone());
        }
        for b in broken {
            self.pending_violation(Kind::Safety, b);
        }
    }

    /// Whether the database holds `key`'s event at (partition, PLog offset).
    fn holds(&self, (p, offset): (u32, u64), key: &str) -> bool {
        let store = EventStore::new(self.db.kv(), AppId(1), TrustLevel::Level0);
        matches!(
            store.read_event(PartitionId(p), monoseq_core::PLogOffset(offset)),
            Ok(Some(e)) if e.idempotency.as_ref().is_some_and(|i| i.key == key)
        )
    }

    fn check_now(&mut self) -> Result<(), Violation> {
        if let Some(v) = self.db.violations().into_iter().next() {
            return Err(Kind::Safety.of(v));
        }
        for n in &mut self.nodes {
            if let Some(v) = n.violations.first() {
                return Err(v.clone());
            }
        }
        Ok(())
    }

    fn live_members(&self) -> Vec<&Node> {
        self.nodes
            .iter()
            .filter(|n| n.alive && n.is_member())
            .collect()
    }

    fn unserved(&self) -> Vec<u32> {
        (0..self.plan.partitions)
            .filter(|p| !self.live_members().iter().any(|n| n.serves_ready(*p)))
            .collect()
    }

    fn all_served(&self) -> bool {
        self.unserved().is_empty()
    }

    fn check_balance(&self) -> Result<(), Violation> {
        let members = self.live_members();
        if members.is_empty() {
            return Err(Kind::Liveness.of("no live member after the faults stopped"));
        }
        let share = (self.plan.partitions as usize).div_ceil(members.len());
        let floor = self.plan.partitions as usize / members.len();
        for n in &members {
            let held = n.held_count();
            if held > share || held + 1 < floor.max(1).min(share) {
                let spread: Vec<(String, usize)> = members
                    .iter()
                    .map(|m| (m.name.clone(), m.held_count()))
                    .collect();
                return Err(Kind::Liveness.of(format!(
                    "{} rounds after every partition was served again the nodes are not \
                     balanced (fair share {floor}..={share}): {spread:?}\n{}",
                    BALANCE_ROUNDS,
                    self.dump()
                )));
            }
        }
        Ok(())
    }

    /// At the end: every acknowledged event is in the PLog with its key, and no key is in
    /// two events. A digest of every stored event (its times included).
    fn check_end(&self) -> Result<u64, Violation> {
        // Offsets retired by accepted losses: the PLog has a gap below each, and continues
        // above it.
        let mut floors: BTreeMap<u32, BTreeSet<u64>> = BTreeMap::new();
        let losses: Vec<AcceptedLoss> = self
            .nodes
            .iter()
            .flat_map(|n| n.losses_accepted.iter().copied())
            .collect();
        for l in &losses {
            floors.entry(l.partition).or_default().insert(l.mark.plog);
        }
        let retired: BTreeMap<u32, u64> = floors
            .iter()
            .filter_map(|(p, f)| f.last().map(|last| (*p, *last)))
            .collect();
        let (events, digest) = self.stored_events(&floors)?;
        let mut keys: BTreeMap<(u64, &str), (u32, u64)> = BTreeMap::new();
        let mut offsets: BTreeMap<(u32, u64), String> = BTreeMap::new();
        for ((p, offset), (ws, key)) in &events {
            if let Some(other) = keys.insert((*ws, key.as_str()), (*p, *offset)) {
                return Err(Kind::Safety.of(format!(
                    "key {key} is in two events: PLog offset {} of partition {} and {offset} of \
                     partition {p}",
                    other.1, other.0
                )));
            }
            offsets.insert((*p, *offset), key.clone());
        }
        for ((p, offset), key) in &self.plog {
            match offsets.get(&(*p, *offset)) {
                Some(k) if k == key => {}
                // Lost with the database, and the loss accepted: retired, never reused.
                None if retired.get(p).is_some_and(|r| offset <= r) => {}
                Some(k) => {
                    return Err(Kind::Safety.of(format!(
                        "PLog offset {offset} of partition {p} was acknowledged to {key} but \
                         holds {k}"
                    )));
                }
                None => {
                    return Err(Kind::Safety.of(format!(
                        "PLog offset {offset} of partition {p}, acknowledged to {key}, is not \
                         readable"
                    )));
                }
            }
        }
        self.check_followers_end(&offsets, &losses)?;
        Ok(digest)
    }

    /// Every stored event with a key, by partition and PLog offset (read around the gaps the
    /// `floors` of accepted losses leave), and a digest of every stored event, times included.
    fn stored_events(
        &self,
        floors: &BTreeMap<u32, BTreeSet<u64>>,
    ) -> Result<(Keyed, u64), Violation> {
        let store = EventStore::new(self.db.kv(), AppId(1), TrustLevel::Level0);
        let mut events = BTreeMap::new();
        let mut digest = std::hash::DefaultHasher::new();
        for p in 0..self.plan.partitions {
            let starts =
                std::iter::once(1).chain(floors.get(&p).into_iter().flatten().map(|f| f + 1));
            for from in starts {
                store
                    .for_each_event(
                        PartitionId(p),
                        monoseq_core::PLogOffset(from),
                        monoseq_core::PLogOffset(u64::MAX),
                        &mut |e| {
                            std::hash::Hash::hash(&format!("{e:?}"), &mut digest);
                            if let Some(i) = e.idempotency {
                                events.insert((p, e.plog_offset.0), (e.ws.0, i.key));
                            }
                        },
                    )
                    .map_err(|e| Kind::Read.of(format!("reading partition {p}'s PLog: {e}")))?;
            }
        }
        Ok((events, std::hash::Hasher::finish(&digest)))
    }

    /// The state of the leases and of every node, for a failure's message.
    fn dump(&self) -> String {
        let mut out = String::new();
        if let Ok(status) = monoseq_membership::LeaseTable::status(&*self.db.table()) {
            out += &format!(
                "leases: {:?}\nnode rows: {:?}\n",
                status.leases, status.nodes
            );
        }
        for n in &self.nodes {
            out += &format!("{}\n", n.describe());
        }
        out
    }

    /// The seed.
    #[must_use]
    pub fn seed(&self) -> u64 {
        self.seed
    }
}

/// Runs seed `seed` with its own plan.
///
/// # Errors
///
/// The first invariant found broken.
pub fn run_seed(seed: u64) -> Result<Report, Violation> {
    Sim::new(seed, Plan::from_seed(seed)).run()
}
