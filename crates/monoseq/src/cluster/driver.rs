//! [`Cluster`]: runs this node's machine (`monoseq_membership::NodeMachine`: membership and
//! serving) on tokio. Owns the only clock and the only I/O of membership: it reads the time, makes the lease
//! calls the machine asks for off the runtime (`spawn_blocking`), hands their answers back,
//! and carries out the machine's actions. Its parts: the last read of the table for routing
//! and readiness (`routing.rs`), the readiness probes of the other nodes and the pull of their
//! marks (`probes.rs`), and the I/O of serving, stopping and draining partitions on the
//! command processor that the machine asks for (`serving.rs`);
//! this file holds the loop that steps the machine, joining and leaving, the status answer
//! and the log lines.

mod probes;
mod routing;
mod serving;

use probes::{PROBE_TIMEOUT, Probe, remote_unready};
use routing::View;
pub use serving::ACCEPT_LOSS_HINT;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use monoseq_cp::{CommandProcessor, Unready};
use monoseq_membership::{
    Call, Config, DRAIN_MS_MAX, LeaseRow, LeaseTable, NameTaken, NodeAction, NodeMachine, Reply,
    Retry, Settled, StopReason, TableError, TableStatus, assign, execute,
};
use monoseq_store::{EventStore, PartitionId, TrustLevel, settle_losses};
use monoseq_wire::{ClusterBody, ClusterNodeBody, ClusterPartitionBody};
use tokio::sync::{mpsc, oneshot, watch};

use super::ClusterSettings;
use super::marks::NodeMarks;
use super::pg::FencedLeases;
use crate::base::{APP, Store};
use crate::peers::{NODE_TOKEN_HINT, Readiness};

/// Longest wait for leaving: every partition drained (in parallel), then released.
const LEAVE_TIMEOUT: Duration = Duration::from_secs(15);
/// Answers of lease calls and of the serving machine's I/O waiting for the driver: at most one
/// call is out, and a pull, a settle or a drain per partition.
const DONE_QUEUE_MIN: usize = 16;
/// The driver looks for fenced partitions at least this many times per renewal interval.
const FENCED_CHECKS_PER_RENEWAL: u32 = 4;

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
    /// The peers' marks were pulled for (partition, epoch).
    Pulled(u32, u64),
    /// What came of settling (partition, epoch)'s accepted losses.
    Settled(u32, u64, Settled),
    /// A draining (partition, epoch) finished its queued commands and flushed.
    Idle(u32, u64),
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
            held: Mutex::new(BTreeMap::new()),
            refused: Mutex::new(HashSet::new()),
        });
        tokio::spawn(Arc::clone(&cluster).drive(NodeMachine::new(config, 0), leave_rx));
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

    /// The URL this node gives its peers and clients.
    #[must_use]
    pub fn advertise_url(&self) -> &str {
        &self.settings.advertise_url
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

    /// The driver: steps this node's machine (membership and serving, `monoseq-membership`)
    /// until the membership is over.
    async fn drive(
        self: Arc<Self>,
        mut node: NodeMachine,
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
                node.fenced(now(), p);
            }
            self.log_refused();
            while let Some(action) = node.poll(now()) {
                if !self.perform(action, now(), &done_tx, &mut leaving) {
                    return;
                }
            }
            let next = node.next_wake();
            let wake = origin + Duration::from_millis(next.min(now() + ms(fenced_every)));
            tokio::select! {
                Some(done) = done_rx.recv() => match done {
                    Done::Reply(reply, sent) => {
                        if let Reply::Status(Ok(status)) = &reply {
                            self.set_view(status, sent);
                        }
                        node.reply(now(), reply);
                    }
                    Done::Pulled(p, epoch) => node.marks_pulled(now(), p, epoch),
                    Done::Settled(p, epoch, settled) => node.settled(now(), p, epoch, settled),
                    Done::Idle(p, epoch) => node.idle(now(), p, epoch),
                },
                Some(tx) = leave_rx.recv() => {
                    node.leave(now());
                    leaving = Some(tx);
                }
                () = self.read_soon.notified() => node.read_soon(now()),
                () = tokio::time::sleep_until(wake.into()) => {}
            }
        }
    }

    /// Logs each partition found below its marks once per time it is served.
    fn log_refused(&self) {
        for (p, why) in self.cp.unready_partitions() {
            if !matches!(why, Unready::Refused { .. }) {
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

    /// Carries out one action of the node machine at `now`: the lease calls and the life of
    /// the membership here, serving, stopping and draining partitions in `serving.rs`;
    /// `false` when the membership is over.
    fn perform(
        self: &Arc<Self>,
        action: NodeAction,
        now: u64,
        done: &mpsc::Sender<Done>,
        leaving: &mut Option<oneshot::Sender<()>>,
    ) -> bool {
        match action {
            NodeAction::Call(call) => self.call(call, done.clone()),
            NodeAction::Stopping {
                partition,
                epoch,
                why,
            } => log_stop(partition, epoch, why),
            NodeAction::HandingOff {
                partition,
                epoch,
                to,
            } => log_drain(partition, epoch, to.as_deref()),
            NodeAction::Claimed { previous } => {
                if let Some(p) = previous {
                    log_name_taken_over(&p);
                }
                self.life.send_replace(Life::Member);
            }
            NodeAction::Refuse(taken) => {
                self.end(refusal(&taken, self.config.name_wait_ms()));
                return false;
            }
            NodeAction::Superseded => {
                self.end(self.superseded());
                return false;
            }
            NodeAction::EpochWentBack {
                partition,
                seen,
                found,
            } => log_epoch_went_back(partition, seen, found),
            NodeAction::Left => {
                if let Some(tx) = leaving.take() {
                    let _ = tx.send(());
                }
                self.life.send_replace(Life::Left);
                return false;
            }
            serving => self.carry_out(serving, now, done),
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
}

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

/// The line of a planned move of a partition away from this node.
fn log_drain(partition: u32, epoch: u64, to: Option<&str>) {
    match to {
        Some(to) => tracing::info!(
            partition,
            epoch,
            to = %to,
            "handing the partition over to balance the nodes"
        ),
        None => tracing::info!(partition, epoch, "handing the partition back: leaving"),
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
