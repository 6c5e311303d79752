//! [`Cluster`]: runs this node's membership state machine (`monoseq-membership`) on tokio.
//! Owns the only clock and the only I/O of membership: it reads the time, makes the lease
//! calls the machine asks for off the runtime (`spawn_blocking`), hands their answers back,
//! and carries out serve, stop and drain on the command processor. It also keeps the last
//! read of the table for routing (`owner`) and readiness, and the results of the readiness
//! probes of the other nodes.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use monoseq_backoff::Backoff;
use monoseq_cp::CommandProcessor;
use monoseq_membership::{
    Action, Call, Config, LeaseRow, LeaseTable, Membership, NameTaken, Reply, StopReason,
    TableError, TableStatus, assign, execute,
};
use monoseq_store::{EventStore, PartitionId, TrustLevel, ensure_retired};
use monoseq_wire::{ClusterBody, ClusterNodeBody, ClusterPartitionBody};
use tokio::sync::{mpsc, oneshot, watch};

use super::ClusterSettings;
use super::marks::NodeMarks;
use super::pg::FencedLeases;
use crate::base::{APP, Store};
use crate::peers::{NODE_TOKEN_HINT, Readiness};

/// Longest wait for a released partition to finish its queued commands and flush.
const RELEASE_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest wait for leaving: every partition drained (in parallel), then released.
const LEAVE_TIMEOUT: Duration = Duration::from_secs(15);
/// Answers of lease calls and drains waiting for the driver: at most one call is out, and
/// one drain per partition.
const DONE_QUEUE_MIN: usize = 16;
/// Longest wait for a peer's `/readyz`.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);
/// A peer that says a partition it took within the last lease interval is not ready yet is
/// probed again this many times per renewal interval (once per interval otherwise: a partition
/// that stays unready longer, such as one refused against its marks, waits for the next one).
const PROBES_PER_RENEWAL_WHILE_STARTING: u32 = 8;
/// The driver looks for fenced partitions at least this many times per renewal interval.
const FENCED_CHECKS_PER_RENEWAL: u32 = 4;

/// Where a partition is served, as this node last read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Owner {
    /// This node holds the lease.
    Here,
    /// Another node holds a live lease.
    Node {
        /// Its name.
        node_id: String,
        /// Where it is reached.
        url: String,
    },
    /// Nobody holds a live lease (the partition is moving).
    Nobody,
}

/// The last read of the table, with when it was sent.
#[derive(Debug, Clone)]
struct View {
    status: TableStatus,
    read_at: Instant,
    live: Vec<String>,
    /// Partition → its lease's epoch in this read, and when this node first read that epoch.
    since: HashMap<u32, (u64, Instant)>,
}

/// A peer's last answer to a readiness probe.
#[derive(Debug, Clone)]
struct Probe {
    /// When the probe was sent.
    sent: Instant,
    /// What the peer answered.
    answer: Readiness,
}

/// When this node first read each lease's current epoch, given `before` (the last read's) and
/// the `leases` read `now`; and whether another node than `me` took a partition since.
fn epochs_since(
    before: &HashMap<u32, (u64, Instant)>,
    leases: &[LeaseRow],
    me: &str,
    now: Instant,
) -> (HashMap<u32, (u64, Instant)>, bool) {
    let mut taken = false;
    let since = leases
        .iter()
        .map(|row| {
            let seen = match before.get(&row.partition) {
                Some(&(epoch, at)) if epoch == row.epoch => at,
                _ => {
                    taken |= row.live_owner().is_some_and(|n| n != me);
                    now
                }
            };
            (row.partition, (row.epoch, seen))
        })
        .collect();
    (since, taken)
}

/// Why a partition another node owns cannot be forwarded to it yet, if it cannot. Its owner
/// must have answered a readiness probe within `fresh`, sent after this node first read the
/// lease's current epoch (`since`: an earlier answer says nothing of a partition the owner
/// took after it), and not named the partition in it.
fn remote_unready(
    p: u32,
    (node_id, url): (&str, &str),
    probe: Option<&Probe>,
    since: Instant,
    fresh: Duration,
) -> Option<String> {
    match probe {
        Some(probe) if probe.sent.elapsed() >= fresh => Some(format!(
            "its owner {node_id} ({url}) did not answer a readiness probe in the last {} ms",
            fresh.as_millis()
        )),
        None => Some(format!(
            "its owner {node_id} ({url}) did not answer a readiness probe yet"
        )),
        Some(Probe {
            answer: Readiness::TokenRefused(status),
            ..
        }) => Some(format!(
            "its owner {node_id} ({url}) refused this node's token ({status}), so this node \
             cannot forward to it: {NODE_TOKEN_HINT}"
        )),
        Some(probe) if probe.sent < since => Some(format!(
            "its owner {node_id} ({url}) took it lately and did not report it ready yet"
        )),
        Some(Probe {
            answer: Readiness::Unready(unready),
            ..
        }) if unready.contains(&p) => Some(format!("its owner {node_id} ({url}) is starting it")),
        Some(_) => None,
    }
}

/// Whether the prober pulls the peers' marks this round, the last pull at `last`: on every
/// round at the renewal cadence, at most twice a renewal while it probes faster.
fn marks_due(last: Option<Instant>, renew: Duration) -> bool {
    last.is_none_or(|at| at.elapsed() >= renew / 2)
}

/// Logs once when the peer at `url` starts refusing this node's token on readiness probes
/// (`before`: its previous answer, `now`: this one), and once when it accepts it again.
fn report_token_refusal(url: &str, before: Option<&Readiness>, now: &Readiness) {
    let refused_before = matches!(before, Some(Readiness::TokenRefused(_)));
    match (refused_before, now) {
        (false, Readiness::TokenRefused(status)) => tracing::error!(
            peer = url,
            status,
            "the node at {url} refused this node's token ({status}): this node reports the \
             partitions it owns not ready and cannot forward commands to it; {NODE_TOKEN_HINT}"
        ),
        (true, Readiness::Unready(_)) => {
            tracing::info!(
                peer = url,
                "the node at {url} accepts this node's token again"
            );
        }
        _ => {}
    }
}

/// Where the membership is.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Life {
    Joining,
    Member,
    /// Refused to start or superseded: the message says why.
    Ended(String),
    Left,
}

enum Done {
    Reply(Reply, Instant),
    Drained(u32, u64, bool),
}

/// The cluster membership of one node.
pub struct Cluster {
    settings: ClusterSettings,
    config: Config,
    partitions: u32,
    table: Arc<dyn FencedLeases>,
    cp: CommandProcessor<Store>,
    trust: TrustLevel,
    view: RwLock<Arc<View>>,
    /// Peer URL → its last answer to a readiness probe.
    probes: Mutex<HashMap<String, Probe>>,
    /// Wakes the prober when a read finds a partition taken by another node.
    probe_soon: tokio::sync::Notify,
    /// Asks the driver for a read of the table soon: routing found no live owner, or the owner
    /// it read did not answer (see [`Cluster::read_soon`]).
    read_soon: tokio::sync::Notify,
    leave: mpsc::Sender<oneshot::Sender<()>>,
    life: watch::Sender<Life>,
    /// This node's high-water marks and the losses accepted for the store.
    marks: Arc<NodeMarks>,
    /// Reaches the other nodes (their marks).
    prober: crate::peers::Prober,
    /// Partitions the membership gave this node to serve, with their epochs: a partition
    /// starts only if it is still here once the peers' marks are pulled.
    serving: Mutex<HashMap<u32, u64>>,
    /// Partitions leased here but not served, with why (a loss accepted after this process
    /// started, a retirement that failed).
    held: Mutex<BTreeMap<u32, String>>,
    /// Refused partitions already logged.
    refused: Mutex<HashSet<u32>>,
}

/// A run ID: unique per start of the process (a random hasher's output over the process ID
/// and the time).
fn new_run_id() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    h.write_u128(nanos);
    format!("{:016x}", h.finish())
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl Cluster {
    /// Joins the cluster: claims this node's name for this run (waiting, a bounded time, for
    /// another live run under the name to stop), then runs the lease rounds that take a fair
    /// share of the partitions.
    ///
    /// # Errors
    ///
    /// When another running process heartbeats under this node's name, or the settings do not
    /// fit the membership's rules.
    pub async fn join(
        settings: ClusterSettings,
        table: Arc<dyn FencedLeases>,
        cp: CommandProcessor<Store>,
        trust: TrustLevel,
        marks: Arc<NodeMarks>,
        prober: crate::peers::Prober,
    ) -> anyhow::Result<Arc<Cluster>> {
        let partitions = cp.config().partitions;
        let config = Config::new(
            &settings.node_id,
            &new_run_id(),
            &settings.advertise_url,
            partitions,
            ms(settings.lease),
            ms(settings.renew),
        )
        .and_then(|c| c.with_dir_id(marks.dir_id()))
        .map_err(|e| anyhow::anyhow!("{}", crate::base::chain(&e)))?;
        let (leave, leave_rx) = mpsc::channel(1);
        let (life, mut life_rx) = watch::channel(Life::Joining);
        let cluster = Arc::new(Cluster {
            config: config.clone(),
            settings,
            partitions,
            table,
            cp,
            trust,
            view: RwLock::new(Arc::new(View {
                status: TableStatus::default(),
                read_at: Instant::now(),
                live: Vec::new(),
                since: HashMap::new(),
            })),
            probes: Mutex::new(HashMap::new()),
            probe_soon: tokio::sync::Notify::new(),
            read_soon: tokio::sync::Notify::new(),
            leave,
            life,
            marks,
            prober,
            serving: Mutex::new(HashMap::new()),
            held: Mutex::new(BTreeMap::new()),
            refused: Mutex::new(HashSet::new()),
        });
        tokio::spawn(Arc::clone(&cluster).drive(Membership::new(config, 0), leave_rx));
        let life = life_rx
            .wait_for(|l| *l != Life::Joining)
            .await
            .context("the cluster driver stopped")?
            .clone();
        if let Life::Ended(why) = life {
            bail!("{why}");
        }
        tracing::info!(
            node_id = %cluster.settings.node_id,
            run_id = %cluster.config.run_id(),
            advertise_url = %cluster.settings.advertise_url,
            lease_ms = ms(cluster.settings.lease),
            renew_ms = ms(cluster.settings.renew),
            "joined the cluster"
        );
        Ok(cluster)
    }

    /// Resolves when this node's membership ended on its own (another run took its name), with
    /// why; never while it is a member.
    pub async fn ended(&self) -> String {
        let mut rx = self.life.subscribe();
        let ended = rx
            .wait_for(|l| matches!(l, Life::Ended(_)))
            .await
            .map(|l| match &*l {
                Life::Ended(why) => why.clone(),
                _ => String::new(),
            });
        match ended {
            Ok(why) => why,
            Err(_) => std::future::pending().await,
        }
    }

    /// Where partition `p` is served, by the last status read. Finding nobody asks for a read
    /// of the table soon ([`Cluster::read_soon`]).
    #[must_use]
    pub fn owner(&self, p: u32) -> Owner {
        let owner = self.owner_read(p);
        if owner == Owner::Nobody {
            self.read_soon();
        }
        owner
    }

    fn owner_read(&self, p: u32) -> Owner {
        let view = self.view();
        let age = i64::try_from(view.read_at.elapsed().as_millis()).unwrap_or(i64::MAX);
        let Some(row) = view.status.lease(p) else {
            return Owner::Nobody;
        };
        let Some(node) = row.live_owner() else {
            return Owner::Nobody;
        };
        if row.expires_in_ms <= age {
            return Owner::Nobody;
        }
        if node == self.settings.node_id {
            return Owner::Here;
        }
        match view.status.node(node) {
            Some(n) => Owner::Node {
                node_id: n.node_id.clone(),
                url: n.url.clone(),
            },
            None => Owner::Nobody,
        }
    }

    /// Asks for a read of the lease table soon (at once, or one handoff poll after the last
    /// read): what this node last read sent a command nowhere useful (no live owner, or an
    /// owner that did not answer: a node restarted under a new address, a partition moved
    /// since). Without it the routing view waits for the next renewal's read.
    pub fn read_soon(&self) {
        self.read_soon.notify_one();
    }

    fn view(&self) -> Arc<View> {
        Arc::clone(&self.view.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// Partitions a command could not be answered for now, with why: not served here and
    /// without a live owner this node reached lately, served here but not ready, or about to
    /// move to balance the nodes. Empty when every command can be answered or forwarded.
    #[must_use]
    pub fn unready(&self) -> Vec<(u32, String)> {
        let view = self.view();
        if view.status.leases.is_empty() {
            return (0..self.partitions)
                .map(|p| (p, "the lease table was not read yet".to_owned()))
                .collect();
        }
        let here: BTreeMap<u32, String> = self.cp.unready().into_iter().collect();
        let plan = assign(&view.status, self.partitions, &view.live);
        let fresh = self.settings.renew * 3 + PROBE_TIMEOUT;
        let probes = lock(&self.probes).clone();
        let mut out = Vec::new();
        for p in 0..self.partitions {
            let why = if self.cp.serves(p) {
                here.get(&p).map(|why| match why.starts_with("refused:") {
                    true => format!("{why}; {ACCEPT_LOSS_HINT}"),
                    false => why.clone(),
                })
            } else {
                match self.owner(p) {
                    Owner::Here => Some(
                        lock(&self.held)
                            .get(&p)
                            .cloned()
                            .unwrap_or_else(|| "leased here; starting".to_owned()),
                    ),
                    Owner::Nobody => {
                        Some("no live lease: the partition is moving between nodes".to_owned())
                    }
                    Owner::Node { node_id, url } => {
                        let since = view.since.get(&p).map_or_else(Instant::now, |s| s.1);
                        remote_unready(p, (&node_id, &url), probes.get(&url), since, fresh)
                    }
                }
            };
            let idx = p as usize;
            let moving = plan.target.get(idx) != plan.holder.get(idx);
            let why = why.or_else(|| {
                moving.then(|| {
                    let to = plan
                        .target
                        .get(idx)
                        .copied()
                        .flatten()
                        .and_then(|i| plan.nodes.get(i).cloned())
                        .unwrap_or_default();
                    format!("moving to {to} to balance the nodes")
                })
            });
            if let Some(why) = why {
                out.push((p, why));
            }
        }
        out
    }

    /// Probes every other live node's `/readyz` once per renewal interval with `probe`, for
    /// readiness, until the membership ends: at once when a read finds a partition taken by
    /// another node, and more often while a peer says a partition it took lately is starting.
    pub async fn probe_peers(self: Arc<Self>, probe: crate::peers::Prober) {
        let mut wait = Duration::ZERO;
        let mut marks_pulled = None;
        while matches!(*self.life.borrow(), Life::Joining | Life::Member) {
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = self.probe_soon.notified() => {}
            }
            let urls = self.peer_urls();
            let taken = self.taken_lately();
            let mut starting = false;
            for url in &urls {
                let sent = Instant::now();
                let Some(answer) = probe.readiness(url, PROBE_TIMEOUT).await else {
                    continue;
                };
                if let Readiness::Unready(unready) = &answer {
                    starting |= taken
                        .get(url)
                        .is_some_and(|ps| ps.iter().any(|p| unready.contains(p)));
                }
                let now = answer.clone();
                let before = lock(&self.probes).insert(url.clone(), Probe { sent, answer });
                report_token_refusal(url, before.map(|p| p.answer).as_ref(), &now);
            }
            if marks_due(marks_pulled, self.settings.renew) {
                self.pull_marks(&urls).await;
                marks_pulled = Some(Instant::now());
            }
            wait = match starting {
                true => self.settings.renew / PROBES_PER_RENEWAL_WHILE_STARTING,
                false => self.settings.renew,
            };
        }
    }

    /// Peer URL → the partitions it owns ([`Cluster::owner`]) under an epoch this node first
    /// read within the last lease interval.
    fn taken_lately(&self) -> HashMap<String, Vec<u32>> {
        let view = self.view();
        let mut taken: HashMap<String, Vec<u32>> = HashMap::new();
        for p in 0..self.partitions {
            let lately = view
                .since
                .get(&p)
                .is_some_and(|(_, at)| at.elapsed() < self.settings.lease);
            if let (true, Owner::Node { url, .. }) = (lately, self.owner(p)) {
                taken.entry(url).or_default().push(p);
            }
        }
        taken
    }

    /// The URLs of the other live nodes, by the last read of the table.
    fn peer_urls(&self) -> Vec<String> {
        let view = self.view();
        view.status
            .nodes
            .iter()
            .filter(|n| n.node_id != self.settings.node_id)
            .filter(|n| view.live.contains(&n.node_id))
            .map(|n| n.url.clone())
            .collect()
    }

    /// Pulls the marks of the live nodes at `urls` into this node's.
    async fn pull_marks(&self, urls: &[String]) {
        super::marks::pull_into(&self.marks, &self.prober, urls).await;
    }

    /// What `GET /v1/marks` answers: this node's marks and the losses accepted for the store.
    #[must_use]
    pub fn losses(&self) -> Vec<monoseq_store::AcceptedLoss> {
        self.marks.losses()
    }

    /// What `GET /v1/marks` answers: this node's marks and the losses accepted for the store.
    pub fn marks_answer(&self) -> monoseq_wire::MarksBody {
        self.marks.answer()
    }

    /// What `GET /v1/cluster` answers: this node, every node with its partitions, and every
    /// partition's owner, epoch and lease age, read from the database now.
    ///
    /// # Errors
    ///
    /// When the database cannot be read.
    pub async fn status(self: &Arc<Self>) -> anyhow::Result<ClusterBody> {
        let table = Arc::clone(&self.table);
        let status = tokio::task::spawn_blocking(move || table.status()).await??;
        let lease_ms = i64::try_from(self.settings.lease.as_millis()).unwrap_or(i64::MAX);
        let served = self.cp.owned();
        let partitions: Vec<_> = status
            .leases
            .iter()
            .map(|l| ClusterPartitionBody {
                partition: l.partition,
                epoch: l.epoch,
                owner: l.live_owner().map(str::to_owned),
                expires_in_ms: l.expires_in_ms,
                lease_age_ms: lease_ms - l.expires_in_ms,
                served_here: served.contains(&l.partition),
            })
            .collect();
        let nodes: Vec<_> = status
            .nodes
            .iter()
            .map(|n| {
                let mine: Vec<u32> = status
                    .leases
                    .iter()
                    .filter(|l| l.live_owner() == Some(n.node_id.as_str()))
                    .map(|l| l.partition)
                    .collect();
                ClusterNodeBody {
                    node_id: n.node_id.clone(),
                    run_id: Some(n.run_id.clone()),
                    url: n.url.clone(),
                    seen_ms_ago: n.seen_ms_ago,
                    alive: i64::try_from(n.seen_ms_ago).unwrap_or(i64::MAX) < lease_ms,
                    partitions: mine,
                }
            })
            .collect();
        Ok(ClusterBody::Clustered {
            clustered: true,
            node_id: self.settings.node_id.clone(),
            lease_ms,
            renew_ms: ms(self.settings.renew),
            nodes,
            partitions,
        })
    }

    /// Leaves the cluster: removes this node's row (so the others take each partition as soon
    /// as it is released), finishes and flushes every partition served here, and gives its
    /// lease back.
    pub async fn leave(self: &Arc<Self>) {
        let (tx, rx) = oneshot::channel();
        if self.leave.send(tx).await.is_ok()
            && tokio::time::timeout(LEAVE_TIMEOUT, rx).await.is_err()
        {
            tracing::warn!(
                "leaving the cluster did not finish in {LEAVE_TIMEOUT:?}; the remaining leases \
                 expire on their own"
            );
            return;
        }
        tracing::info!(node_id = %self.settings.node_id, "left the cluster; partitions handed over");
    }

    /// The driver: steps the state machine until it is done.
    async fn drive(
        self: Arc<Self>,
        mut m: Membership,
        mut leave_rx: mpsc::Receiver<oneshot::Sender<()>>,
    ) {
        let origin = Instant::now();
        let now = move || ms(origin.elapsed());
        let capacity = DONE_QUEUE_MIN + self.partitions as usize;
        let (done_tx, mut done_rx) = mpsc::channel::<Done>(capacity);
        let mut leaving: Option<oneshot::Sender<()>> = None;
        let fenced_every = self.settings.renew / FENCED_CHECKS_PER_RENEWAL;
        loop {
            for p in self.cp.fenced() {
                m.fenced(now(), p);
            }
            self.log_refused();
            while let Some(action) = m.poll(now()) {
                if !self.perform(action, &done_tx, &mut leaving) {
                    return;
                }
            }
            let wake = origin + Duration::from_millis(m.next_wake().min(now() + ms(fenced_every)));
            tokio::select! {
                Some(done) = done_rx.recv() => match done {
                    Done::Reply(reply, sent) => {
                        if let Reply::Status(Ok(status)) = &reply {
                            self.set_view(status, sent);
                        }
                        m.reply(now(), reply);
                    }
                    Done::Drained(p, epoch, ok) => m.drained(now(), p, epoch, ok),
                },
                Some(tx) = leave_rx.recv() => {
                    m.leave(now());
                    leaving = Some(tx);
                }
                () = self.read_soon.notified() => m.read_soon(now()),
                () = tokio::time::sleep_until(wake.into()) => {}
            }
        }
    }

    /// Logs each partition found below its marks once per time it is served.
    fn log_refused(&self) {
        for (p, why) in self.cp.unready() {
            if !why.starts_with("refused: ") {
                continue;
            }
            // The command processor logged the refusal with its reason; this adds where the
            // marks that decided it are kept, once.
            if lock(&self.refused).insert(p) {
                tracing::info!(
                    partition = p,
                    marks_dir = %self.marks.dir().display(),
                    "partition {p} was refused against the high-water marks kept in the marks \
                     directory"
                );
            }
        }
    }

    fn set_view(&self, status: &TableStatus, read_at: Instant) {
        let alive = ms(self.settings.lease);
        let live = status
            .nodes
            .iter()
            .filter(|n| n.seen_ms_ago < alive)
            .map(|n| n.node_id.clone())
            .collect();
        let (since, taken) = epochs_since(
            &self.view().since,
            &status.leases,
            &self.settings.node_id,
            Instant::now(),
        );
        *self.view.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(View {
            status: status.clone(),
            read_at,
            live,
            since,
        });
        if taken {
            self.probe_soon.notify_one();
        }
    }

    /// Carries out one action; `false` when the membership is over.
    fn perform(
        self: &Arc<Self>,
        action: Action,
        done: &mpsc::Sender<Done>,
        leaving: &mut Option<oneshot::Sender<()>>,
    ) -> bool {
        match action {
            Action::Call(call) => self.call(call, done.clone()),
            Action::Serve {
                partition,
                epoch,
                previous,
            } => self.serve(partition, epoch, previous.as_deref()),
            Action::Stop {
                partition,
                epoch,
                why,
            } => {
                log_stop(partition, epoch, why);
                self.stop_serving(partition);
            }
            Action::Drain {
                partition,
                epoch,
                to,
            } => self.drain(partition, epoch, to, done.clone()),
            Action::Claimed { previous } => {
                if let Some(p) = previous {
                    log_name_taken_over(&p);
                }
                self.life.send_replace(Life::Member);
            }
            Action::Refuse(taken) => {
                self.end(refusal(&taken, self.config.name_wait_ms()));
                return false;
            }
            Action::Superseded => {
                self.end(self.superseded());
                return false;
            }
            Action::EpochWentBack {
                partition,
                seen,
                found,
            } => log_epoch_went_back(partition, seen, found),
            Action::Left => {
                if let Some(tx) = leaving.take() {
                    let _ = tx.send(());
                }
                self.life.send_replace(Life::Left);
                return false;
            }
        }
        true
    }

    /// Ends this run's membership for `why` (logged, and handed to whoever waits for the end).
    fn end(&self, why: String) {
        tracing::error!("{why}");
        self.life.send_replace(Life::Ended(why));
    }

    /// Why this run stops when another run of its node claimed the name.
    fn superseded(&self) -> String {
        format!(
            "another run of node {} claimed its name (this run's heartbeats stopped for \
             longer than {} ms, or a second process was started with the same \
             --node-id): this run stopped serving and shuts down",
            self.settings.node_id,
            self.config.name_stale_ms()
        )
    }

    fn call(self: &Arc<Self>, call: Call, done: mpsc::Sender<Done>) {
        let table = Arc::clone(&self.table);
        let config = self.config.clone();
        tokio::spawn(async move {
            let sent = Instant::now();
            let asked = call.clone();
            let reply = tokio::task::spawn_blocking(move || {
                execute(&call, &*table as &dyn LeaseTable, &config)
            })
            .await
            .unwrap_or_else(|e| {
                asked.failed(TableError {
                    message: format!("the lease call did not finish: {}", crate::base::chain(&e)),
                })
            });
            log_failure(&reply);
            let _ = done.send(Done::Reply(reply, sent)).await;
        });
    }

    /// Starts serving `p` under `epoch`: pulls every live peer's marks first (so the mark
    /// includes what former owners acknowledged), makes sure numbers retired by an accepted
    /// loss stay retired (a storage failure doing so is retried with backoff while the lease
    /// is held here), then starts the partition with its writes going through the fenced view,
    /// unless the membership stopped it meanwhile.
    fn serve(self: &Arc<Self>, p: u32, epoch: u64, previous: Option<&str>) {
        lock(&self.serving).insert(p, epoch);
        lock(&self.refused).remove(&p);
        let me = Arc::clone(self);
        let previous = previous.map(str::to_owned);
        tokio::spawn(async move {
            me.pull_marks(&me.peer_urls()).await;
            let mut failures = 0;
            loop {
                match me.settle_losses(p, epoch).await {
                    Ok(()) => break,
                    Err(Unsettled::Refused(why)) => {
                        tracing::error!(partition = p, epoch, "{why}");
                        me.hold(p, epoch, why);
                        return;
                    }
                    Err(Unsettled::Failed(why)) => {
                        failures += 1;
                        let wait = SETTLE_BACKOFF.delay(failures);
                        tracing::error!(
                            partition = p,
                            epoch,
                            attempt = failures,
                            "{why}; the partition is not served until this succeeds: retrying \
                             in {} ms",
                            wait.as_millis()
                        );
                        if !me.hold(p, epoch, why) {
                            return;
                        }
                        tokio::time::sleep(wait).await;
                    }
                }
            }
            lock(&me.held).remove(&p);
            me.start_serving(p, epoch, previous.as_deref());
        });
    }

    /// Records why `p`, leased here under `epoch`, is not served yet (for `/readyz`); false
    /// when the membership stopped it meanwhile (nothing is recorded then).
    fn hold(&self, p: u32, epoch: u64, why: String) -> bool {
        let serving = lock(&self.serving);
        let still = serving.get(&p) == Some(&epoch);
        if still {
            lock(&self.held).insert(p, why);
        }
        still
    }

    /// Numbers of `p` retired by an accepted loss: the command processor must continue above
    /// them (it was started knowing the loss) and the database's stored state must be past
    /// them (the node that accepted the loss retires them, and so does any later owner if the
    /// database lost that write).
    async fn settle_losses(&self, p: u32, epoch: u64) -> Result<(), Unsettled> {
        let retired = self.marks.retired(p);
        let known = self
            .cp
            .config()
            .retired
            .get(p as usize)
            .copied()
            .unwrap_or_default();
        if !known.covers(&retired) {
            return Err(Unsettled::Refused(format!(
                "a loss of partition {p} (PLog offsets up to {}) was accepted after this process \
                 started; it does not serve the partition until restarted, so that the numbers \
                 handed out before the loss stay retired: restart this node",
                retired.plog
            )));
        }
        let store = EventStore::new(self.view_of(p, epoch), APP, TrustLevel::Level0);
        let seq = store.seq_storage(PartitionId(p));
        let done = tokio::task::spawn_blocking(move || ensure_retired(seq, p, retired))
            .await
            .map_err(|e| e.to_string())
            .and_then(|r| r.map_err(|e| crate::base::chain(&e)));
        match done {
            Ok(true) => {
                tracing::warn!(
                    partition = p,
                    epoch,
                    retired_plog = retired.plog,
                    "moved the partition's next PLog offset past its accepted loss"
                );
                Ok(())
            }
            Ok(false) => Ok(()),
            Err(e) => Err(Unsettled::Failed(format!(
                "retiring the numbers of partition {p}'s accepted loss failed: {e}"
            ))),
        }
    }

    fn view_of(&self, p: u32, epoch: u64) -> Store {
        self.table.fenced(p, epoch, &self.settings.node_id)
    }

    fn start_serving(self: &Arc<Self>, p: u32, epoch: u64, previous: Option<&str>) {
        let serving = lock(&self.serving);
        if serving.get(&p) != Some(&epoch) {
            return;
        }
        let store = EventStore::new(self.view_of(p, epoch), APP, self.trust);
        if let Err(e) = self.cp.acquire(p, store) {
            tracing::error!(
                partition = p,
                "starting the partition failed: {}",
                crate::base::chain(&e)
            );
            return;
        }
        drop(serving);
        match previous {
            Some(prev) if prev == self.settings.node_id => tracing::info!(
                partition = p,
                epoch,
                "took back the partition an earlier run of this node held; actualizing it"
            ),
            Some(prev) => tracing::info!(
                partition = p,
                epoch,
                from = prev,
                "took the partition over; actualizing it"
            ),
            None => tracing::info!(
                partition = p,
                epoch,
                "took the partition's lease; actualizing it"
            ),
        }
    }

    /// Stops serving `p` here at once (commands for it are answered "not the owner" from now
    /// on); its queued commands finish in the background.
    fn stop_serving(self: &Arc<Self>, p: u32) {
        self.forget(p);
        let cp = self.cp.clone();
        tokio::spawn(async move {
            if !cp.release(p, RELEASE_TIMEOUT).await {
                tracing::warn!(partition = p, "the partition did not stop in time");
            }
        });
    }

    /// A planned move: finishes `p`'s queued commands, flushes, then reports (the lease is
    /// released for the next owner).
    fn drain(self: &Arc<Self>, p: u32, epoch: u64, to: Option<String>, done: mpsc::Sender<Done>) {
        match &to {
            Some(to) => tracing::info!(
                partition = p,
                epoch,
                to = %to,
                "handing the partition over to balance the nodes"
            ),
            None => tracing::info!(partition = p, epoch, "handing the partition back: leaving"),
        }
        self.forget(p);
        let cp = self.cp.clone();
        tokio::spawn(async move {
            let ok = cp.release(p, RELEASE_TIMEOUT).await;
            if !ok {
                tracing::warn!(
                    partition = p,
                    "the partition did not stop in time; its lease is left to expire"
                );
            }
            let _ = done.send(Done::Drained(p, epoch, ok)).await;
        });
    }
}

impl Cluster {
    /// `p` is no longer to be served here: a pending start of it is dropped.
    fn forget(&self, p: u32) {
        lock(&self.serving).remove(&p);
        lock(&self.held).remove(&p);
    }
}

/// Why a partition leased here is not served yet.
enum Unsettled {
    /// A loss accepted after this process started: held until the node restarts.
    Refused(String),
    /// The storage failed to retire an accepted loss's numbers: retried.
    Failed(String),
}

/// Retries of a failed retirement: 100 ms after the first failure, doubling, at most 5 s apart.
const SETTLE_BACKOFF: Backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));

/// The one command that continues a partition refused for a loss.
pub const ACCEPT_LOSS_HINT: &str = "restart this node with `monoseq serve --accept-loss` (the \
     loss is recorded in its marks directory and the lost numbers are retired), or restore the \
     database to hold them";

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn refusal(taken: &NameTaken, waited_ms: u64) -> String {
    format!(
        "refusing to start: node ID {} is in use by another running process at {} (run {}, \
         last heartbeat {} ms ago; waited {waited_ms} ms for it to stop). Stop that process, or \
         give this one another --node-id",
        taken.node_id, taken.url, taken.run_id, taken.seen_ms_ago
    )
}

fn log_stop(partition: u32, epoch: u64, why: StopReason) {
    match why {
        StopReason::LeaseNotRenewed => tracing::error!(
            partition,
            epoch,
            "the partition's lease could not be renewed in time; it stops being served here \
             before the lease can expire"
        ),
        StopReason::NameNotConfirmed => tracing::error!(
            partition,
            epoch,
            "no heartbeat confirmed this node's name in time; the partition stops being served \
             here before another run could claim the name"
        ),
        StopReason::TakenOver => tracing::warn!(
            partition,
            epoch,
            "the partition's lease was taken over by another node; it stops being served here"
        ),
        StopReason::Fenced => tracing::warn!(
            partition,
            epoch,
            "the storage refused a write under this node's lease epoch; the partition stops \
             being served here"
        ),
        StopReason::EpochWentBack | StopReason::Superseded => {}
    }
}

fn log_failure(reply: &Reply) {
    let failed = match reply {
        Reply::Ensured(Err(e)) | Reply::Left(Err(e)) | Reply::Renewed(Err(e)) => Some(e),
        Reply::Heartbeat(Err(e)) | Reply::Status(Err(e)) => Some(e),
        Reply::HeartbeatRenewed(Err(e)) => Some(e),
        Reply::Acquired(Err(e)) | Reply::Released(Err(e)) => Some(e),
        _ => None,
    };
    if let Some(e) = failed {
        tracing::warn!(
            "a lease call failed: {}; partitions stop being served here when their leases can \
             no longer be renewed in time",
            crate::base::chain(e)
        );
    }
}

/// The warning of a run that took its node's name over from an earlier run.
fn log_name_taken_over(p: &NameTaken) {
    if p.dead {
        tracing::warn!(
            node_id = %p.node_id,
            earlier_run = %p.run_id,
            earlier_url = %p.url,
            "took this node's name over from an earlier run that held this marks directory's \
             lock, so it is dead (its heartbeat stopped {} ms before); its partitions are taken \
             back at once with new epochs",
            p.seen_ms_ago
        );
        return;
    }
    tracing::warn!(
        node_id = %p.node_id,
        earlier_run = %p.run_id,
        earlier_url = %p.url,
        "took this node's name over from an earlier run whose heartbeat stopped \
         {} ms before; its partitions are taken back with new epochs",
        p.seen_ms_ago
    );
}

/// The error of a partition whose lease epoch in the database went lower than one seen.
fn log_epoch_went_back(partition: u32, seen: u64, found: u64) {
    tracing::error!(
        partition,
        epoch_seen = seen,
        epoch_now = found,
        "the database's lease of the partition went back in time: the database lost \
         acknowledged writes (a failover to a standby that was behind, or a restored \
         backup?). This node no longer serves the partition, so that no number is \
         handed out twice; restore the database, or restart the node to accept the loss"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    const OWNER: (&str, &str) = ("b", "http://b");
    const FRESH: Duration = Duration::from_secs(7);

    fn probe(sent: Instant, unready: &[u32]) -> Probe {
        Probe {
            sent,
            answer: Readiness::Unready(unready.iter().copied().collect()),
        }
    }

    fn lease(partition: u32, epoch: u64, node: &str) -> LeaseRow {
        LeaseRow {
            partition,
            epoch,
            node_id: Some(node.to_owned()),
            expires_in_ms: 10_000,
        }
    }

    #[test]
    fn a_partition_whose_owner_reported_it_ready_after_taking_it_is_ready() {
        let since = Instant::now();
        let p = probe(since + Duration::from_millis(1), &[3]);
        assert_eq!(remote_unready(0, OWNER, Some(&p), since, FRESH), None);
    }

    #[test]
    fn a_readiness_answer_sent_before_the_owner_took_the_partition_does_not_count() {
        let sent = Instant::now();
        let p = probe(sent, &[]);
        let since = sent + Duration::from_millis(1);
        let why = remote_unready(0, OWNER, Some(&p), since, FRESH).expect("not ready");
        assert!(why.contains("did not report it ready yet"), "{why}");
    }

    #[test]
    fn a_partition_its_owner_names_unready_is_not_ready() {
        let since = Instant::now();
        let p = probe(since, &[0]);
        let why = remote_unready(0, OWNER, Some(&p), since, FRESH).expect("not ready");
        assert!(why.contains("is starting it"), "{why}");
    }

    #[test]
    fn a_partition_whose_owner_refuses_this_nodes_token_is_not_ready_and_says_what_to_do() {
        let since = Instant::now();
        let refused = Probe {
            sent: since + Duration::from_millis(1),
            answer: Readiness::TokenRefused(401),
        };
        let why = remote_unready(0, OWNER, Some(&refused), since, FRESH).expect("not ready");
        assert!(why.contains("refused this node's token (401)"), "{why}");
        assert!(why.contains(NODE_TOKEN_HINT), "{why}");
    }

    #[test]
    fn peers_marks_are_pulled_at_most_twice_a_renewal_while_probes_run_faster() {
        let renew = Duration::from_secs(4);
        assert!(marks_due(None, renew), "the first round pulls");
        assert!(
            !marks_due(Some(Instant::now()), renew),
            "a fast round right after does not"
        );
        let round_ago = Instant::now()
            .checked_sub(renew)
            .expect("a monotonic clock this old");
        assert!(
            marks_due(Some(round_ago), renew),
            "a round a renewal later does"
        );
    }

    #[test]
    fn a_partition_whose_owner_answered_no_probe_lately_is_not_ready() {
        let since = Instant::now();
        let p = probe(since, &[]);
        let stale = Duration::ZERO;
        assert!(remote_unready(0, OWNER, Some(&p), since, stale).is_some());
        assert!(remote_unready(0, OWNER, None, since, FRESH).is_some());
    }

    #[test]
    fn a_lease_keeps_when_it_was_first_read_until_its_epoch_changes() {
        let first = Instant::now();
        let later = first + Duration::from_secs(1);
        let (since, taken) = epochs_since(&HashMap::new(), &[lease(0, 1, "b")], "a", first);
        assert!(
            taken,
            "a first read of another node's lease wakes the prober"
        );
        let (kept, taken) = epochs_since(&since, &[lease(0, 1, "b")], "a", later);
        assert_eq!((kept[&0], taken), ((1, first), false));
        let (moved, taken) = epochs_since(&kept, &[lease(0, 2, "c")], "a", later);
        assert_eq!((moved[&0], taken), ((2, later), true));
        let (mine, taken) = epochs_since(&moved, &[lease(0, 3, "a")], "a", later);
        assert_eq!((mine[&0], taken), ((3, later), false));
    }
}
