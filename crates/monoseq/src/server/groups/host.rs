//! A node's part in one consumer group: the sessions it hosts, and the step it runs every
//! [`STEP_EVERY`] (and when woken). What a step decides is `monoseq_store::plan_step`, shared
//! with the cluster simulation (where the safety argument is written); this file carries the
//! plan out: it stops readers, removes fences, ends streams, writes the changes by
//! compare-and-swap, and claims and starts reading what its sessions were given. Any node
//! may take any step: the group has no coordinator to lose.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use monoseq_store::{
    Changes, ConsumerName, Ending, GroupState, Hosted, PartitionId, Seen, plan_step, to_claim,
};
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
    /// When its last renewal that landed was sent (milliseconds of the host's clock).
    renewed_at: Option<u64>,
    /// Its partitions' readers.
    readers: HashMap<u32, JoinHandle<()>>,
}

/// This node's part in one group.
pub(super) struct Host {
    pub(super) group: ConsumerName,
    /// The start of the host's clock.
    epoch: Instant,
    pub(super) sessions: Mutex<HashMap<String, Arc<Session>>>,
    pub(super) wake: Notify,
}

/// The last message of a session that ends for `why`.
fn ended_body(why: Ending, timeout: Duration) -> SessionEndedBody {
    let (reason, message) = match why {
        Ending::Gone | Ending::Left => ("left", "the session left the group".to_owned()),
        Ending::Quiet => (
            "session_expired",
            format!(
                "no heartbeat or commit arrived for {} ms, the session timeout: the session's \
                 partitions go to other members; join again",
                timeout.as_millis()
            ),
        ),
        Ending::Unrenewed => (
            "session_expired",
            "this node could not renew the session in the group's store within its timeout \
             (storage unavailable?); join again, possibly through another node"
                .to_owned(),
        ),
        Ending::Removed => (
            "session_expired",
            "the group no longer lists this session (it expired, or another session of the \
             same member took over); join again"
                .to_owned(),
        ),
    };
    SessionEndedBody {
        reason: reason.into(),
        message,
    }
}

impl Host {
    pub(super) fn new(group: ConsumerName) -> Host {
        Host {
            group,
            epoch: Instant::now(),
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
        let mut seen = Seen::default();
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

    /// The host's clock, milliseconds.
    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// One step (see the module's documentation).
    async fn step(
        &self,
        st: &Arc<AppState>,
        running: &mut HashMap<String, Running>,
        seen: &mut Seen,
    ) -> Result<(), monoseq_store::GroupError> {
        let now = self.now_ms();
        let sessions: Vec<Arc<Session>> = self.sessions().values().cloned().collect();
        let hosted: Vec<Hosted> = sessions
            .iter()
            .map(|s| view(s, running.entry(s.id.clone()).or_default()))
            .collect();
        let partitions = st.cp.config().partitions;
        let state = blocking(st, {
            let g = self.group.clone();
            move |store| store.group(&g)
        })
        .await?
        .map_or_else(|| GroupState::new(partitions), |s| s.state);
        let plan = plan_step(&state, &hosted, seen, now);
        for s in &sessions {
            let run = running.entry(s.id.clone()).or_default();
            if let Some((_, why, held)) = plan.end.iter().find(|e| e.0 == s.id) {
                self.end(st, s, run, held, *why).await;
                continue;
            }
            let stops: Vec<(u32, bool)> = plan
                .stop
                .iter()
                .filter(|x| x.0 == s.id)
                .map(|x| (x.1, x.2))
                .collect();
            self.give_up(st, s, run, &stops, state.generation).await;
        }
        let changes = plan.changes;
        let state = self.write(st, changes.clone()).await?;
        for id in &changes.renew {
            if state.member(id).is_some() {
                running.entry(id.clone()).or_default().renewed_at = Some(now);
            }
        }
        for id in &changes.expired {
            tracing::info!(group = %self.group, session = %id, "a consumer group member expired: its renewals stopped for longer than its session timeout; its partitions go to the others");
        }
        for id in &changes.ended {
            running.remove(id);
            self.sessions().remove(id);
        }
        seen.remember(&state, &hosted, now);
        for s in &sessions {
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

    /// Stops a session: its readers, its fences on `held`, its stream (with a last message).
    async fn end(
        &self,
        st: &Arc<AppState>,
        s: &Session,
        run: &mut Running,
        held: &[u32],
        why: Ending,
    ) {
        for (_, reader) in run.readers.drain() {
            stop(reader).await;
        }
        for &p in held {
            self.unfence(st, &s.id, p).await;
        }
        let _ = s.tx.try_send(Chunk::Last(message(
            SSE_SESSION_ENDED,
            &ended_body(why, s.timeout),
        )));
        tracing::info!(group = %self.group, member = %s.member, session = %s.id, reason = ?why, "a consumer group session ended");
    }

    /// Stops the readers `stops` names (removing the fence of each given up), and tells the
    /// member with one `revoked` message.
    async fn give_up(
        &self,
        st: &Arc<AppState>,
        s: &Session,
        run: &mut Running,
        stops: &[(u32, bool)],
        generation: u64,
    ) {
        let mut revoked = Vec::new();
        for &(p, give_up) in stops {
            if let Some(reader) = run.readers.remove(&p) {
                stop(reader).await;
                revoked.push(p);
            }
            if give_up {
                self.unfence(st, &s.id, p).await;
            }
        }
        if !revoked.is_empty() {
            let body = RevokedBody {
                generation,
                partitions: revoked.clone(),
            };
            let _ = s.tx.send(Chunk::Control(message(SSE_REVOKED, &body))).await;
            tracing::info!(group = %self.group, member = %s.member, partitions = ?revoked, generation, "consumer group partitions revoked from a member (rebalance)");
        }
    }

    /// Claims and starts reading each partition `s` was given and does not read yet; the
    /// member hears of a partition (`assigned`) before any of its events.
    async fn take_up(
        &self,
        st: &Arc<AppState>,
        s: &Session,
        run: &mut Running,
        state: &GroupState,
    ) {
        let reading: Vec<u32> = run.readers.keys().copied().collect();
        let mut assigned = Vec::new();
        for (p, fence) in to_claim(state, &s.id, &reading) {
            let g = self.group.clone();
            let claimed = blocking(st, move |store| {
                store.claim_partition(&g, PartitionId(p), &fence)
            })
            .await;
            match claimed {
                Ok(position) => assigned.push(AssignedPartitionBody {
                    partition: p,
                    position,
                }),
                Err(e) => {
                    tracing::warn!(group = %self.group, partition = p, error = %crate::base::chain(&e), "a consumer group partition could not be claimed; trying again at the next step");
                }
            }
        }
        if assigned.is_empty() {
            return;
        }
        let starts: Vec<(u32, u64)> = assigned.iter().map(|a| (a.partition, a.position)).collect();
        let body = AssignedBody {
            generation: state.generation,
            partitions: assigned,
        };
        let _ =
            s.tx.send(Chunk::Control(message(SSE_ASSIGNED, &body)))
                .await;
        for &(p, position) in &starts {
            let start = Start::At(position + 1);
            let reader = spawn_reader(st, p, start, Arc::clone(&s.filter), s.tx.clone());
            run.readers.insert(p, reader);
        }
        tracing::info!(group = %self.group, member = %s.member, partitions = ?starts.iter().map(|s| s.0).collect::<Vec<_>>(), generation = state.generation, "consumer group partitions assigned to a member");
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

/// A hosted session as the shared plan sees it.
fn view(s: &Session, run: &Running) -> Hosted {
    Hosted {
        session: s.id.clone(),
        timeout_ms: u64::try_from(s.timeout.as_millis()).unwrap_or(u64::MAX),
        closed: s.tx.is_closed(),
        leaving: s.leaving.load(Ordering::Acquire),
        quiet_ms: u64::try_from(s.quiet_for(Instant::now()).as_millis()).unwrap_or(u64::MAX),
        renewed_at: run.renewed_at,
        reading: run.readers.keys().copied().collect(),
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
