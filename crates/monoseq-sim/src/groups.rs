//! One consumer group in the simulated cluster (invariant 18): members join through a node
//! that hosts their session, send heartbeats, process what their host delivers and commit it
//! through any node; members are killed, paused past their session and restarted, on top of
//! every fault of the seed (nodes killed and paused, the database failing, losing answers and
//! failing over). Each node runs the server's own step plan (`monoseq_store::plan_step`)
//! on its own drifting clock, through the faulty database.
//!
//! Checked: whenever a host delivers an event of a partition to a session, the partition's
//! fence names that session (two members never hold one partition); a commit that succeeds
//! comes from the fence's session, and never from a session its host ended; a partition is
//! given with the last acknowledged commit as its position or later (redelivery from there,
//! never a skip below it); and at the end every event of every partition was delivered to some
//! member. Checks that compare with acknowledged writes are skipped once the database went
//! back (a failover that lost writes).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use monoseq_store::{
    AppId, ConsumerName, EventStore, GroupError, GroupState, Hosted, Member, PartitionId, Seen,
    TrustLevel, plan_step, to_claim,
};
use rand::RngExt;

use crate::db::{ClientFate, ClientKv};
use crate::follow::Item;
use crate::{Kind, Sim, Violation};

/// Members of the simulated group.
const MEMBERS_MAX: usize = 3;
/// Their session timeout, milliseconds.
const SESSION_TIMEOUT_MS: u64 = 1_500;
/// Between two host steps, milliseconds (the server's `STEP_EVERY`).
const STEP_MS: u64 = 100;
/// Between two turns of a member (heartbeat, processing, commit), milliseconds.
const MEMBER_TURN_MS: u64 = 150;
/// Events a host's reader delivers per partition per tick.
const DELIVER_PER_STEP: usize = 8;
/// Per mille of member turns that kill the member (restarted later).
const KILL_PER_MILLE: u32 = 3;
/// Per mille of member turns that pause the member past its session.
const PAUSE_PER_MILLE: u32 = 3;
/// Per mille of member turns that leave the group cleanly (joining again later).
const LEAVE_PER_MILLE: u32 = 2;
/// Per mille of group calls that fail cleanly.
const CALL_FAIL_PER_MILLE: u32 = 20;
/// Per mille of group writes whose answer is lost after they landed.
const ANSWER_LOST_PER_MILLE: u32 = 20;

/// A member process.
pub(crate) struct GroupMember {
    name: String,
    /// Its session and the node hosting it.
    session: Option<(String, usize)>,
    /// Dead (killed or left) until then; it joins again after.
    away_until: u64,
    /// Paused (it neither reads nor sends) until then.
    paused_until: u64,
    next_turn: u64,
    /// Delivered and not processed yet: (partition, offset, generation of its fence).
    inbox: Vec<(u32, u64, u64)>,
    /// Per partition: the highest processed offset not committed yet, with its generation.
    processed: BTreeMap<u32, (u64, u64)>,
    /// Its stream ended (its host ended the session or died): it learns so at its next turn,
    /// after committing what it processed, and joins again.
    stream_ended: bool,
}

/// A session as its host keeps it.
struct HostedSession {
    member: usize,
    /// The client's last heartbeat, on the host's clock.
    client_beat: u64,
    renewed_at: Option<u64>,
    closed: bool,
    leaving: bool,
    /// Partitions delivered, each with its next offset and the fence generation.
    reading: BTreeMap<u32, (u64, u64)>,
}

/// A node's part in the group.
#[derive(Default)]
struct Host {
    sessions: BTreeMap<String, HostedSession>,
    seen: Seen,
    next_step: u64,
}

/// The simulated group and what its checks know.
pub(crate) struct GroupSim {
    name: ConsumerName,
    pub(crate) members: Vec<GroupMember>,
    hosts: Vec<Host>,
    sessions_made: u64,
    /// Offsets of each partition delivered to some member.
    delivered: BTreeMap<u32, BTreeSet<u64>>,
    /// Per partition: the last acknowledged commit, and how often the database had gone back.
    committed: BTreeMap<u32, (u64, u64)>,
    /// Sessions their host ended, with how often the database had gone back then: no commit
    /// of theirs may succeed after (unless the database went back since).
    ended: BTreeMap<String, u64>,
}

impl GroupSim {
    /// Offsets delivered to some member, over every partition.
    pub(crate) fn delivered_count(&self) -> u64 {
        self.delivered.values().map(|d| d.len() as u64).sum()
    }
}

/// The seed's group.
pub(crate) fn group(rng: &mut rand_chacha::ChaCha8Rng, nodes: usize) -> GroupSim {
    let members = (0..rng.random_range(1..=MEMBERS_MAX))
        .map(|i| GroupMember {
            name: format!("m{i}"),
            session: None,
            away_until: rng.random_range(0..1_000),
            paused_until: 0,
            next_turn: 0,
            inbox: Vec::new(),
            processed: BTreeMap::new(),
            stream_ended: false,
        })
        .collect();
    GroupSim {
        name: ConsumerName::new("fleet").expect("a valid group name"),
        members,
        hosts: (0..nodes).map(|_| Host::default()).collect(),
        sessions_made: 0,
        delivered: BTreeMap::new(),
        committed: BTreeMap::new(),
        ended: BTreeMap::new(),
    }
}

impl Sim {
    /// The store as node `n` reaches it for one group call; `None` when the node is down.
    fn group_store(&mut self, n: usize, write: bool) -> Option<EventStore<ClientKv>> {
        let node = &self.nodes[n];
        if !node.alive || self.now < node.paused_until {
            return None;
        }
        let roll = self.readers_rng.random_range(0..1_000u32);
        let fate = match roll {
            r if r < CALL_FAIL_PER_MILLE => ClientFate::Fail,
            r if write && r < CALL_FAIL_PER_MILLE + ANSWER_LOST_PER_MILLE => ClientFate::LoseAnswer,
            _ => ClientFate::Normal,
        };
        let kv = ClientKv {
            db: Arc::clone(&self.db),
            node: node.name.clone(),
            fate,
        };
        Some(EventStore::new(kv, AppId(1), TrustLevel::Level0))
    }

    /// One tick of the group: hosts due step, members due take a turn.
    pub(crate) fn tick_group(&mut self) {
        // Nodes may be added during a seed.
        while self.group.hosts.len() < self.nodes.len() {
            self.group.hosts.push(Host::default());
        }
        for n in 0..self.nodes.len() {
            if !self.nodes[n].alive {
                // A node that died lost its sessions; their members see their streams end.
                let lost: Vec<String> = self.group.hosts[n].sessions.keys().cloned().collect();
                for id in lost {
                    self.lose_session(n, &id);
                }
                continue;
            }
            if self.now < self.nodes[n].paused_until {
                continue;
            }
            if self.now >= self.group.hosts[n].next_step {
                self.group.hosts[n].next_step = self.now + STEP_MS;
                self.host_step(n);
            }
            // Readers run between steps, as the server's do.
            self.deliver(n);
        }
        for m in 0..self.group.members.len() {
            if self.now >= self.group.members[m].next_turn {
                self.group.members[m].next_turn = self.now + MEMBER_TURN_MS;
                self.member_turn(m);
            }
        }
    }

    /// A session its host no longer has (ended, or lost with the host): its stream ends.
    fn lose_session(&mut self, n: usize, id: &str) {
        if let Some(s) = self.group.hosts[n].sessions.remove(id) {
            let member = &mut self.group.members[s.member];
            if member.session.as_ref().is_some_and(|(sid, _)| sid == id) {
                member.stream_ended = true;
            }
        }
    }

    /// One step of node `n`'s host: the shared plan, carried out through the faulty database.
    fn host_step(&mut self, n: usize) {
        if self.group.hosts[n].sessions.is_empty() {
            return;
        }
        let now = self.nodes[n].local(self.now);
        let hosted: Vec<Hosted> = self.group.hosts[n]
            .sessions
            .iter()
            .map(|(id, s)| Hosted {
                session: id.clone(),
                timeout_ms: SESSION_TIMEOUT_MS,
                closed: s.closed,
                leaving: s.leaving,
                quiet_ms: now.saturating_sub(s.client_beat),
                renewed_at: s.renewed_at,
                reading: s.reading.keys().copied().collect(),
            })
            .collect();
        let Some(store) = self.group_store(n, false) else {
            return;
        };
        let Ok(stored) = store.group(&self.group.name) else {
            return;
        };
        let partitions = self.plan.partitions;
        let state = stored.map_or_else(|| GroupState::new(partitions), |s| s.state);
        let plan = plan_step(&state, &hosted, &self.group.hosts[n].seen, now);
        let failed = self.carry_out(n, &plan);
        let mut changes = plan.changes.clone();
        changes.keep_fenced(&failed);
        for id in changes.ended.iter().chain(&changes.expired) {
            self.group.ended.insert(id.clone(), self.db.went_back());
        }
        let Some(store) = self.group_store(n, true) else {
            return;
        };
        let Ok(state) =
            store.update_group(&self.group.name, partitions, |st| Ok(changes.apply(st)))
        else {
            return;
        };
        let host = &mut self.group.hosts[n];
        for id in &changes.renew {
            if let (Some(s), Some(_)) = (host.sessions.get_mut(id), state.member(id)) {
                s.renewed_at = Some(now);
            }
        }
        for id in &changes.ended {
            self.lose_session(n, id);
        }
        self.group.hosts[n].seen.remember(&state, &hosted, now);
        self.claim(n, &state);
    }

    /// Stops what the plan stops and removes the fences it gives up; the fences that could
    /// not be removed.
    fn carry_out(&mut self, n: usize, plan: &monoseq_store::StepPlan) -> Vec<(String, u32)> {
        let g = self.group.name.clone();
        let mut unfence: Vec<(String, u32)> = Vec::new();
        for (id, _, held) in &plan.end {
            if let Some(s) = self.group.hosts[n].sessions.get_mut(id) {
                // Ending is final: its stream got its last message.
                s.closed = true;
                s.reading.clear();
            }
            unfence.extend(held.iter().map(|&p| (id.clone(), p)));
        }
        for (id, p, give_up) in &plan.stop {
            if let Some(s) = self.group.hosts[n].sessions.get_mut(id) {
                s.reading.remove(p);
            }
            if *give_up {
                unfence.push((id.clone(), *p));
            }
        }
        for (id, held) in &plan.expire {
            unfence.extend(held.iter().map(|&p| (id.clone(), p)));
        }
        let mut failed = Vec::new();
        for (id, p) in unfence {
            let removed = self
                .group_store(n, true)
                .is_some_and(|store| store.release_partition(&g, PartitionId(p), &id).is_ok());
            if !removed {
                failed.push((id, p));
            }
        }
        failed
    }

    /// Claims what node `n`'s sessions were given, checking each position against the last
    /// acknowledged commit.
    fn claim(&mut self, n: usize, state: &GroupState) {
        let g = self.group.name.clone();
        let ids: Vec<String> = self.group.hosts[n].sessions.keys().cloned().collect();
        for id in ids {
            let reading: Vec<u32> = self.group.hosts[n].sessions[&id]
                .reading
                .keys()
                .copied()
                .collect();
            for (p, fence) in to_claim(state, &id, &reading) {
                let Some(store) = self.group_store(n, true) else {
                    return;
                };
                let Ok(position) = store.claim_partition(&g, PartitionId(p), &fence) else {
                    continue;
                };
                if let Some(&(acked, backs)) = self.group.committed.get(&p)
                    && backs == self.db.went_back()
                    && position < acked
                {
                    self.pending_violation(Kind::Reader, format!(
                        "group: partition {p} was given to {id} at position {position}, below the \
                         acknowledged commit {acked}"
                    ));
                }
                if let Some(s) = self.group.hosts[n].sessions.get_mut(&id) {
                    s.reading.insert(p, (position + 1, fence.generation));
                }
            }
        }
    }

    /// Node `n`'s readers deliver its sessions' partitions, each only while its last renewal
    /// is younger than the session timeout on the node's clock (as the server's readers do):
    /// each event delivered is checked against the partition's fence.
    fn deliver(&mut self, n: usize) {
        let store = EventStore::new(self.db.kv(), AppId(1), TrustLevel::Level0);
        let now = self.nodes[n].local(self.now);
        let work: Vec<(String, u32, u64, u64)> = self.group.hosts[n]
            .sessions
            .iter()
            .filter(|(_, s)| {
                s.renewed_at
                    .is_some_and(|at| now <= at + SESSION_TIMEOUT_MS)
            })
            .flat_map(|(id, s)| {
                s.reading
                    .iter()
                    .map(|(p, (next, g))| (id.clone(), *p, *next, *g))
            })
            .collect();
        for (id, p, next, generation) in work {
            let Some(Ok(items)) = self.read_at(n, p, next, DELIVER_PER_STEP, true) else {
                continue;
            };
            let Some(last) = items.last() else {
                continue;
            };
            let new_next = match last {
                Item::Event(o, _) => o + 1,
                Item::Gap(_, to) => to + 1,
            };
            let fence = store.group_position(&self.group.name, PartitionId(p));
            let holder = fence.ok().and_then(|(_, f)| f).map(|f| f.session);
            if holder.as_deref() != Some(id.as_str()) && self.db.went_back() == 0 {
                self.pending_violation(Kind::Reader, format!(
                    "group: node {n} delivered partition {p} to session {id} while the fence names \
                     {holder:?}: two members hold one partition"
                ));
            }
            let s = self.group.hosts[n]
                .sessions
                .get_mut(&id)
                .expect("listed above");
            s.reading.insert(p, (new_next, generation));
            let member = s.member;
            for item in items {
                let (from, to) = match item {
                    Item::Event(o, _) => (o, o),
                    Item::Gap(f, t) => (f, t),
                };
                self.group.delivered.entry(p).or_default().extend(from..=to);
                self.group.members[member].inbox.push((p, to, generation));
            }
        }
    }

    /// One turn of member `m`: join when it has no session, else heartbeat, process and
    /// commit; now and then it is killed, paused past its session, or leaves.
    fn member_turn(&mut self, m: usize) {
        let member = &self.group.members[m];
        if self.now < member.away_until || self.now < member.paused_until {
            return;
        }
        let Some((id, host)) = member.session.clone() else {
            self.join(m);
            return;
        };
        if member.stream_ended {
            // It commits what it processed (refused when another member holds the
            // partition now), then learns its stream ended and joins again.
            self.process_and_commit(m, &id);
            let member = &mut self.group.members[m];
            member.session = None;
            member.stream_ended = false;
            member.inbox.clear();
            member.processed.clear();
            return;
        }
        if self.now < self.plan.fault_ms {
            let roll = self.readers_rng.random_range(0..1_000u32);
            if roll < KILL_PER_MILLE + LEAVE_PER_MILLE {
                // Killed, or leaving: either way its stream closes.
                if let Some(s) = self.group.hosts[host].sessions.get_mut(&id) {
                    s.closed = true;
                }
                let member = &mut self.group.members[m];
                member.session = None;
                member.stream_ended = false;
                member.inbox.clear();
                member.processed.clear();
                member.away_until = self.now + self.readers_rng.random_range(0..3_000);
                return;
            }
            if roll < KILL_PER_MILLE + LEAVE_PER_MILLE + PAUSE_PER_MILLE {
                // Paused past its session: it will commit with a stale session when it wakes.
                self.group.members[m].paused_until = self.now + 2 * SESSION_TIMEOUT_MS + 500;
                return;
            }
        }
        let host_up = self.nodes[host].alive && self.now >= self.nodes[host].paused_until;
        if host_up && let Some(s) = self.group.hosts[host].sessions.get_mut(&id) {
            s.client_beat = self.nodes[host].local(self.now);
        }
        self.process_and_commit(m, &id);
    }

    /// Member `m` processes its inbox and commits what it processed through a random node.
    fn process_and_commit(&mut self, m: usize, id: &str) {
        let member = &mut self.group.members[m];
        for (p, offset, generation) in member.inbox.drain(..) {
            let e = member.processed.entry(p).or_insert((offset, generation));
            *e = (e.0.max(offset), e.1.max(generation));
        }
        let commits: Vec<(u32, (u64, u64))> =
            std::mem::take(&mut member.processed).into_iter().collect();
        let g = self.group.name.clone();
        for (p, (offset, generation)) in commits {
            let to = self.readers_rng.random_range(0..self.nodes.len());
            let Some(store) = self.group_store(to, true) else {
                continue;
            };
            match store.commit_group_position(&g, PartitionId(p), id, generation, offset) {
                Ok(()) => {
                    if self.group.ended.get(id) == Some(&self.db.went_back()) {
                        self.pending_violation(
                            Kind::Reader,
                            format!(
                                "group: session {id}, ended by its host, committed {offset} on \
                             partition {p}"
                            ),
                        );
                    }
                    self.group
                        .committed
                        .insert(p, (offset, self.db.went_back()));
                    self.report.group_commits += 1;
                }
                Err(GroupError::StaleGeneration { .. }) => self.report.group_stale_commits += 1,
                Err(e @ GroupError::Backwards { .. })
                    if self.group.ended.get(id) == Some(&self.db.went_back()) =>
                {
                    self.pending_violation(Kind::Reader, format!(
                        "group: session {id}, ended by its host, had its commit on partition {p} \
                         judged by its offset, not refused as stale: {e}"
                    ));
                }
                Err(_) => {}
            }
        }
    }

    /// Member `m` joins through a random live node, which then hosts its session.
    fn join(&mut self, m: usize) {
        let n = self.readers_rng.random_range(0..self.nodes.len());
        let Some(store) = self.group_store(n, true) else {
            return;
        };
        self.group.sessions_made += 1;
        let id = format!(
            "{}~{}",
            self.group.members[m].name, self.group.sessions_made
        );
        let member = Member {
            name: self.group.members[m].name.clone(),
            session: id.clone(),
            node: self.nodes[n].name.clone(),
            timeout_ms: SESSION_TIMEOUT_MS,
            beat: 0,
            leaving: false,
        };
        let joined = store.update_group(&self.group.name, self.plan.partitions, |st| {
            st.join(member.clone())?;
            st.rebalance();
            Ok(true)
        });
        if joined.is_err() {
            // The join's answer is lost or refused: the member tries again; a session that
            // did land expires, unhosted.
            return;
        }
        let beat = self.nodes[n].local(self.now);
        self.group.hosts[n].sessions.insert(
            id.clone(),
            HostedSession {
                member: m,
                client_beat: beat,
                renewed_at: None,
                closed: false,
                leaving: false,
                reading: BTreeMap::new(),
            },
        );
        self.group.members[m].session = Some((id, n));
    }

    /// At the end: members wake and come back, the group runs until every event of every
    /// partition was delivered to some member.
    pub(crate) fn catch_up_group(&mut self, rounds: u64) -> Result<(), Violation> {
        for member in &mut self.group.members {
            member.paused_until = 0;
            member.away_until = member.away_until.min(self.now);
        }
        let mut missing = Vec::new();
        for _ in 0..rounds {
            self.now += crate::TICK_MS;
            self.db.set_now(self.now);
            self.tick();
            self.check_now()?;
            missing = self.undelivered();
            if missing.is_empty() {
                return Ok(());
            }
        }
        Err(Kind::Reader.of(format!(
            "group: events never delivered to any member (partition, first offset): {missing:?}"
        )))
    }

    /// Each partition whose events below its end were not all delivered, with the first
    /// offset missing.
    fn undelivered(&self) -> Vec<(u32, u64)> {
        (0..self.plan.partitions)
            .filter_map(|p| {
                let end = (0..self.nodes.len())
                    .filter(|&n| self.nodes[n].is_member() && self.nodes[n].serves_ready(p))
                    .find_map(|n| self.nodes[n].plog_end(p))?;
                let got = self.group.delivered.get(&p);
                (1..end)
                    .find(|o| got.is_none_or(|g| !g.contains(o)))
                    .map(|o| (p, o))
            })
            .collect()
    }
}
