//! A node's part in one consumer group: the sessions it hosts, and the step it runs every
//! [`STEP_EVERY`] (and when woken): renew its live sessions in the group's state, end those
//! whose client went quiet or away, expire other nodes' members whose renewals stopped,
//! give up what the group asks its members to give up, rebalance, and start delivering what
//! its members were given. Every change of the group's state is one compare-and-swap, so any
//! node may take any step and the group has no coordinator to lose.
//!
//! Safety of "one member holds a partition" rests on two rules. A host delivers to a session
//! only while its last renewal was sent less than the session timeout ago (by the host's
//! clock); another node expires a member only after seeing its renewal count unchanged for
//! the timeout plus [`EXPIRY_MARGIN`] (by its own clock, from a read made after that renewal
//! was written). And every commit is checked against the fence in the position itself.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use monoseq_store::{ConsumerName, Fence, GroupState, Holder, PartitionId};
use monoseq_wire::{
    AssignedBody, AssignedPartitionBody, RevokedBody, SSE_ASSIGNED, SSE_REVOKED, SSE_SESSION_ENDED,
    SessionEndedBody,
};
use tokio::sync::{Notify, mpsc};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::super::AppState;
use super::super::filter::Filter;
use super::super::stream::{Chunk, Start, message, spawn_reader};

/// How often a host steps while it hosts a session.
pub(super) const STEP_EVERY: Duration = Duration::from_millis(100);
/// What another node waits beyond a member's timeout before it expires it.
const EXPIRY_MARGIN: Duration = Duration::from_millis(500);

/// One session of a member, hosted here: its stream is on this node.
pub(super) struct Session {
    pub(super) member: String,
    pub(super) id: String,
    pub(super) timeout: Duration,
    pub(super) filter: Arc<Filter>,
    pub(super) tx: mpsc::Sender<Chunk>,
    /// When the client last sent a heartbeat or commit here.
    pub(super) client_beat: Mutex<Instant>,
    /// Asked to leave (`DELETE`).
    pub(super) leaving: AtomicBool,
}

impl Session {
    /// Counts a heartbeat of the client.
    pub(super) fn beat(&self) {
        *self.client_beat.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
    }

    fn quiet_for(&self, now: Instant) -> Duration {
        now.saturating_duration_since(*self.client_beat.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// What the host's task keeps of a session between steps.
#[derive(Default)]
struct Running {
    /// When its last renewal that landed was sent.
    renewed_at: Option<Instant>,
    /// Its partitions' readers.
    readers: HashMap<u32, JoinHandle<()>>,
}

/// This node's part in one group.
pub(super) struct Host {
    pub(super) group: ConsumerName,
    pub(super) sessions: Mutex<HashMap<String, Arc<Session>>>,
    pub(super) wake: Notify,
}

/// Why a hosted session ends.
#[derive(Debug, Clone, Copy)]
enum Ending {
    Gone,
    Left,
    Quiet,
    Unrenewed,
    Removed,
}

impl Ending {
    fn body(self, timeout: Duration) -> SessionEndedBody {
        let (reason, message) = match self {
            Ending::Gone | Ending::Left => ("left", "the session left the group".to_owned()),
            Ending::Quiet => (
                "session_expired",
                format!(
                    "no heartbeat or commit arrived for {} ms, the session timeout: the \
                     session's partitions go to other members; join again",
                    timeout.as_millis()
                ),
            ),
            Ending::Unrenewed => (
                "session_expired",
                "this node could not renew the session in the group's store within its \
                 timeout (storage unavailable?); join again, possibly through another node"
                    .to_owned(),
            ),
            Ending::Removed => (
                "session_expired",
                "the group no longer lists this session (it expired, or another session of \
                 the same member took over); join again"
                    .to_owned(),
            ),
        };
        SessionEndedBody {
            reason: reason.into(),
            message,
        }
    }
}

impl Host {
    pub(super) fn new(group: ConsumerName) -> Host {
        Host {
            group,
            sessions: Mutex::default(),
            wake: Notify::new(),
        }
    }

    pub(super) fn sessions(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Session>>> {
        self.sessions.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Steps until no session is left here.
    pub(super) async fn run(self: Arc<Host>, st: Arc<AppState>) {
        let mut running: HashMap<String, Running> = HashMap::new();
        let mut seen: HashMap<String, (u64, Instant)> = HashMap::new();
        loop {
            let _ = tokio::time::timeout(STEP_EVERY, self.wake.notified()).await;
            if let Err(e) = self.step(&st, &mut running, &mut seen).await {
                tracing::warn!(group = %self.group, error = %crate::base::chain(&e), "a consumer group step failed; retrying");
            }
            if st.groups.retire_if_idle(&self) {
                return;
            }
        }
    }

    /// One step (see the module's documentation).
    async fn step(
        &self,
        st: &Arc<AppState>,
        running: &mut HashMap<String, Running>,
        seen: &mut HashMap<String, (u64, Instant)>,
    ) -> Result<(), monoseq_store::GroupError> {
        let now = Instant::now();
        let hosted: Vec<Arc<Session>> = self.sessions().values().cloned().collect();
        let partitions = st.cp.config().partitions;
        let state = blocking(st, {
            let g = self.group.clone();
            move |store| store.group(&g)
        })
        .await?
        .map_or_else(|| GroupState::new(partitions), |s| s.state);
        let mut ended: Vec<String> = Vec::new();
        let mut released: Vec<(String, u32)> = Vec::new();
        for s in &hosted {
            let run = running.entry(s.id.clone()).or_default();
            if let Some(why) = ending(s, run, &state, now) {
                self.end(st, s, run, &state, why).await;
                ended.push(s.id.clone());
            } else {
                released.extend(self.give_up(st, s, run, &state).await);
            }
        }
        let renew = due_renewals(&hosted, running, &ended, now);
        let hosted_ids: Vec<String> = hosted.iter().map(|s| s.id.clone()).collect();
        let changes = Changes {
            expired: stale_members(&state, &hosted_ids, seen, now),
            ended,
            released,
            renew,
        };
        let state = self.write(st, changes.clone()).await?;
        let Changes {
            renew,
            expired,
            ended,
            ..
        } = changes;
        for id in &renew {
            if state.member(id).is_some() {
                running.entry(id.clone()).or_default().renewed_at = Some(now);
            }
        }
        for id in &expired {
            tracing::info!(group = %self.group, session = %id, "a consumer group member expired: its renewals stopped for longer than its session timeout; its partitions go to the others");
        }
        for id in &ended {
            running.remove(id);
            self.sessions().remove(id);
        }
        remember(&state, &hosted_ids, seen, now);
        for s in &hosted {
            if let Some(run) = running.get_mut(&s.id) {
                self.take_up(st, s, run, &state).await;
            }
        }
        Ok(())
    }

    /// Applies a step's changes to the stored state, rebalancing; the state now stored.
    async fn write(
        &self,
        st: &Arc<AppState>,
        changes: Changes,
    ) -> Result<GroupState, monoseq_store::GroupError> {
        let g = self.group.clone();
        let partitions = st.cp.config().partitions;
        blocking(st, move |store| {
            store.update_group(&g, partitions, |state| Ok(changes.apply(state)))
        })
        .await
    }

    /// Stops a session: its readers, its fences, its stream (with a last message).
    async fn end(
        &self,
        st: &Arc<AppState>,
        s: &Session,
        run: &mut Running,
        state: &GroupState,
        why: Ending,
    ) {
        for (_, reader) in run.readers.drain() {
            stop(reader).await;
        }
        for p in state.held_by(&s.id) {
            self.unfence(st, &s.id, p).await;
        }
        let _ = s.tx.try_send(Chunk::Last(message(
            SSE_SESSION_ENDED,
            &why.body(s.timeout),
        )));
        tracing::info!(group = %self.group, member = %s.member, session = %s.id, reason = ?why, "a consumer group session ended");
    }

    /// Gives up what the group asks `s` to give up, and stops reading what it no longer
    /// holds; returns the partitions to mark free.
    async fn give_up(
        &self,
        st: &Arc<AppState>,
        s: &Session,
        run: &mut Running,
        state: &GroupState,
    ) -> Vec<(String, u32)> {
        let mut revoked = Vec::new();
        let mut released = Vec::new();
        for (p, holder) in state.holders.iter().enumerate() {
            let p = p as u32;
            let mine = holder.session() == Some(s.id.as_str());
            let revoking = mine && matches!(holder, Holder::Revoking { .. });
            if (revoking || !mine)
                && let Some(reader) = run.readers.remove(&p)
            {
                stop(reader).await;
                revoked.push(p);
            }
            if revoking {
                self.unfence(st, &s.id, p).await;
                released.push((s.id.clone(), p));
            }
        }
        if !revoked.is_empty() {
            let body = RevokedBody {
                generation: state.generation,
                partitions: revoked.clone(),
            };
            let _ = s.tx.send(Chunk::Control(message(SSE_REVOKED, &body))).await;
            tracing::info!(group = %self.group, member = %s.member, partitions = ?revoked, generation = state.generation, "consumer group partitions revoked from a member (rebalance)");
        }
        released
    }

    /// Claims and starts reading each partition `s` was given and does not read yet.
    async fn take_up(
        &self,
        st: &Arc<AppState>,
        s: &Session,
        run: &mut Running,
        state: &GroupState,
    ) {
        let mut assigned = Vec::new();
        for (p, holder) in state.holders.iter().enumerate() {
            let p = p as u32;
            let Holder::Held {
                session,
                generation,
            } = holder
            else {
                continue;
            };
            if *session != s.id || run.readers.contains_key(&p) {
                continue;
            }
            let fence = Fence {
                session: s.id.clone(),
                generation: *generation,
            };
            let g = self.group.clone();
            let claimed = blocking(st, move |store| {
                store.claim_partition(&g, PartitionId(p), &fence)
            })
            .await;
            match claimed {
                Ok(position) => {
                    assigned.push(AssignedPartitionBody {
                        partition: p,
                        position,
                    });
                }
                Err(e) => {
                    tracing::warn!(group = %self.group, partition = p, error = %crate::base::chain(&e), "a consumer group partition could not be claimed; trying again at the next step");
                }
            }
        }
        if !assigned.is_empty() {
            let parts: Vec<u32> = assigned.iter().map(|a| a.partition).collect();
            let starts: Vec<(u32, u64)> =
                assigned.iter().map(|a| (a.partition, a.position)).collect();
            let body = AssignedBody {
                generation: state.generation,
                partitions: assigned,
            };
            // The member hears of a partition before any of its events.
            let _ =
                s.tx.send(Chunk::Control(message(SSE_ASSIGNED, &body)))
                    .await;
            for (p, position) in starts {
                let start = Start::At(position + 1);
                let reader = spawn_reader(st, p, start, Arc::clone(&s.filter), s.tx.clone());
                run.readers.insert(p, reader);
            }
            tracing::info!(group = %self.group, member = %s.member, partitions = ?parts, generation = state.generation, "consumer group partitions assigned to a member");
        }
    }

    async fn unfence(&self, st: &Arc<AppState>, session: &str, p: u32) {
        let g = self.group.clone();
        let id = session.to_owned();
        let released = blocking(st, move |store| {
            store.release_partition(&g, PartitionId(p), &id)
        })
        .await;
        if let Err(e) = released {
            // The next holder's claim replaces the fence anyway; until then this session's
            // commits may still land, which the group's position can take (they are its own
            // processed offsets).
            tracing::warn!(group = %self.group, partition = p, error = %crate::base::chain(&e), "a consumer group fence could not be removed");
        }
    }
}

/// What one step changes in the group's state.
#[derive(Debug, Clone, Default)]
struct Changes {
    /// Hosted sessions that ended (their partitions are free).
    ended: Vec<String>,
    /// Other nodes' members seen expired.
    expired: Vec<String>,
    /// Partitions hosted sessions gave up.
    released: Vec<(String, u32)>,
    /// Hosted sessions renewed.
    renew: Vec<String>,
}

impl Changes {
    /// Applies them and rebalances; whether anything changed.
    fn apply(&self, state: &mut GroupState) -> bool {
        let mut changed = false;
        for id in self.ended.iter().chain(&self.expired) {
            changed |= state.remove(id);
        }
        for (id, p) in &self.released {
            changed |= state.release(id, *p);
        }
        for id in &self.renew {
            changed |= state.renew(id);
        }
        changed | state.rebalance()
    }
}

/// Hosted sessions still running whose last renewal is a quarter of their timeout old (or
/// that were never renewed).
fn due_renewals(
    hosted: &[Arc<Session>],
    running: &HashMap<String, Running>,
    ended: &[String],
    now: Instant,
) -> Vec<String> {
    hosted
        .iter()
        .filter(|s| !ended.contains(&s.id))
        .filter(|s| {
            running
                .get(&s.id)
                .and_then(|r| r.renewed_at)
                .is_none_or(|at| now.duration_since(at) >= s.timeout / 4)
        })
        .map(|s| s.id.clone())
        .collect()
}

/// Why a hosted session must end now, if it must.
fn ending(s: &Session, run: &Running, state: &GroupState, now: Instant) -> Option<Ending> {
    if s.tx.is_closed() {
        return Some(Ending::Gone);
    }
    if s.leaving.load(Ordering::Acquire) {
        return Some(Ending::Left);
    }
    if s.quiet_for(now) > s.timeout {
        return Some(Ending::Quiet);
    }
    let member = state.member(&s.id);
    if run.renewed_at.is_some()
        && member.is_none_or(|m| m.leaving && state.held_by(&s.id).is_empty())
    {
        return Some(Ending::Removed);
    }
    if run
        .renewed_at
        .is_some_and(|at| now.duration_since(at) > s.timeout)
    {
        return Some(Ending::Unrenewed);
    }
    None
}

/// Members hosted elsewhere whose renewal count has not moved for their timeout plus the
/// margin, as seen from here.
fn stale_members(
    state: &GroupState,
    hosted: &[String],
    seen: &HashMap<String, (u64, Instant)>,
    now: Instant,
) -> Vec<String> {
    state
        .members
        .iter()
        .filter(|m| !hosted.contains(&m.session))
        .filter(|m| {
            seen.get(&m.session).is_some_and(|&(beat, at)| {
                beat == m.beat
                    && now.duration_since(at) >= Duration::from_millis(m.timeout_ms) + EXPIRY_MARGIN
            })
        })
        .map(|m| m.session.clone())
        .collect()
}

/// Notes when each other member's renewal count was first seen at its value.
fn remember(
    state: &GroupState,
    hosted: &[String],
    seen: &mut HashMap<String, (u64, Instant)>,
    now: Instant,
) {
    seen.retain(|s, _| state.member(s).is_some());
    for m in state
        .members
        .iter()
        .filter(|m| !hosted.contains(&m.session))
    {
        match seen.get(&m.session) {
            Some(&(beat, _)) if beat == m.beat => {}
            _ => {
                seen.insert(m.session.clone(), (m.beat, now));
            }
        }
    }
}

/// Stops a reader and waits until it no longer runs (nothing more of it reaches the stream).
async fn stop(reader: JoinHandle<()>) {
    reader.abort();
    let _ = reader.await;
}

/// Runs `f` on the store on a blocking thread.
pub(super) async fn blocking<T, F>(st: &Arc<AppState>, f: F) -> Result<T, monoseq_store::GroupError>
where
    T: Send + 'static,
    F: FnOnce(
            &monoseq_store::EventStore<crate::base::Store>,
        ) -> Result<T, monoseq_store::GroupError>
        + Send
        + 'static,
{
    let store = st.cp.store().clone();
    match tokio::task::spawn_blocking(move || f(&store)).await {
        Ok(r) => r,
        Err(e) => Err(monoseq_store::GroupError::Storage(
            monoseq_kv::KvError::Backend {
                message: format!("a group's storage call did not finish: {e}"),
                source: None,
            },
        )),
    }
}
