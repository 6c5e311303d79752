//! Several nodes on one database: each partition is served by the node holding its **lease**,
//! whose **epoch** every write of the partition is fenced with (the database refuses a write of
//! an older epoch, so a node that lost a lease changes nothing however late its write lands).
//!
//! A node renews its leases every renewal interval, takes a fair share of free or expired
//! partitions (`ceil(partitions / live nodes)`), gives excess partitions back one per round when
//! nodes join, stops serving a partition whose lease it could not renew before the lease can
//! expire, and hands every partition back at once when it stops gracefully. A partition's new
//! owner actualizes it from the PLog before serving (the command processor's start).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use monoseq_cp::CommandProcessor;
use monoseq_kv::KvError;
use monoseq_store::{EventStore, TrustLevel};
use serde::{Deserialize, Serialize};

use crate::config::{APP, Store};

/// Default lease duration.
pub const LEASE_MS_DEFAULT: u64 = 10_000;
/// Default renewal interval.
pub const LEASE_RENEW_MS_DEFAULT: u64 = 2_000;
/// Shortest lease accepted.
pub const LEASE_MS_MIN: u64 = 500;
/// Longest lease accepted.
pub const LEASE_MS_MAX: u64 = 600_000;
/// A lease must last at least this many renewal intervals, so that a node keeps serving
/// through a renewal or two that fail or come late.
pub const RENEWALS_PER_LEASE_MIN: u64 = 3;
/// Longest wait for a released partition to finish its queued commands and flush.
const RELEASE_TIMEOUT: Duration = Duration::from_secs(5);

/// Cluster settings of `monoseq serve` (used when the storage is PostgreSQL); each also reads
/// `MONOSEQ_<NAME>` from the environment, and the `[cluster]` table of the settings file.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ClusterArgs {
    /// This node's name, unique among the running nodes of one database; a node restarted
    /// with the same name takes its partitions back at once [default: the host name and the
    /// configured listen port].
    #[arg(long, env = "MONOSEQ_NODE_ID")]
    pub node_id: Option<String>,
    /// The URL other nodes (and redirected clients) reach this node at [default:
    /// `http://` and the address it listens on].
    #[arg(long, env = "MONOSEQ_ADVERTISE_URL")]
    pub advertise_url: Option<String>,
    /// How long a partition's lease lasts without renewal, milliseconds [default: 10000].
    #[arg(long, env = "MONOSEQ_LEASE_MS")]
    pub lease_ms: Option<u64>,
    /// How often leases are renewed, milliseconds; at most a third of the lease [default:
    /// 2000].
    #[arg(long, env = "MONOSEQ_LEASE_RENEW_MS")]
    pub lease_renew_ms: Option<u64>,
    /// Answer a command for a partition another node owns with a redirect (307) to that node
    /// instead of forwarding it.
    #[arg(long, env = "MONOSEQ_REDIRECT")]
    pub redirect: bool,
    /// CA certificates trusted when forwarding to other nodes over HTTPS [default: this node's
    /// own --tls-cert, else the system's CAs].
    #[arg(long, env = "MONOSEQ_PEER_CA_CERT")]
    pub peer_ca_cert: Option<std::path::PathBuf>,
    /// Benchmarks only: write without the lease epoch condition, to measure what fencing
    /// costs. Nodes served so can overwrite each other's events.
    #[arg(long, hide = true)]
    pub no_fencing: bool,
}

/// The `[cluster]` table of the settings file.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterFile {
    node_id: Option<String>,
    advertise_url: Option<String>,
    lease_ms: Option<u64>,
    lease_renew_ms: Option<u64>,
    redirect: Option<bool>,
    peer_ca_cert: Option<std::path::PathBuf>,
}

/// Resolved cluster settings.
#[derive(Debug, Clone)]
pub struct ClusterSettings {
    /// This node's name.
    pub node_id: String,
    /// Where other nodes reach it.
    pub advertise_url: String,
    /// Lease duration.
    pub lease: Duration,
    /// Renewal interval.
    pub renew: Duration,
    /// Redirect instead of forwarding.
    pub redirect: bool,
    /// CA certificates trusted when forwarding over HTTPS.
    pub peer_ca_cert: Option<std::path::PathBuf>,
    /// Write without the epoch condition (benchmarks only).
    pub no_fencing: bool,
}

impl ClusterArgs {
    /// Flags and environment over the file over the defaults; `configured` is the listen
    /// address as configured (its port may be 0), `local` the address the server listens on,
    /// `scheme` `http` or `https`.
    ///
    /// # Errors
    ///
    /// A node ID or URL that is not acceptable, or a lease and renewal interval that do not fit.
    pub fn resolve(
        &self,
        file: &ClusterFile,
        configured: SocketAddr,
        local: SocketAddr,
        scheme: &str,
    ) -> anyhow::Result<ClusterSettings> {
        let lease_ms = self.lease_ms.or(file.lease_ms).unwrap_or(LEASE_MS_DEFAULT);
        let renew_ms = self
            .lease_renew_ms
            .or(file.lease_renew_ms)
            .unwrap_or(LEASE_RENEW_MS_DEFAULT);
        check_lease(lease_ms, renew_ms)?;
        let node_id = match self.node_id.clone().or_else(|| file.node_id.clone()) {
            Some(id) => id,
            None => format!("{}-{}", host_name(), configured.port()),
        };
        check_node_id(&node_id)?;
        let advertise_url = match self
            .advertise_url
            .clone()
            .or_else(|| file.advertise_url.clone())
        {
            Some(url) => url.trim_end_matches('/').to_owned(),
            None => default_url(local, scheme)?,
        };
        check_url(&advertise_url)?;
        Ok(ClusterSettings {
            node_id,
            advertise_url,
            lease: Duration::from_millis(lease_ms),
            renew: Duration::from_millis(renew_ms),
            redirect: self.redirect || file.redirect.unwrap_or(false),
            peer_ca_cert: self
                .peer_ca_cert
                .clone()
                .or_else(|| file.peer_ca_cert.clone()),
            no_fencing: self.no_fencing,
        })
    }
}

fn check_lease(lease_ms: u64, renew_ms: u64) -> anyhow::Result<()> {
    if !(LEASE_MS_MIN..=LEASE_MS_MAX).contains(&lease_ms) {
        bail!("--lease-ms must be between {LEASE_MS_MIN} and {LEASE_MS_MAX}, got {lease_ms}");
    }
    if renew_ms == 0 || renew_ms.saturating_mul(RENEWALS_PER_LEASE_MIN) > lease_ms {
        bail!(
            "--lease-renew-ms must be at least 1 and at most a third of --lease-ms \
             ({lease_ms} ms): renewals must come well before the lease expires, got {renew_ms}"
        );
    }
    Ok(())
}

fn check_node_id(id: &str) -> anyhow::Result<()> {
    let ok = !id.is_empty()
        && id.len() <= 128
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':'));
    if !ok {
        bail!(
            "--node-id {id:?} is not acceptable: 1 to 128 characters of letters, digits, \
             '-', '_', '.' and ':'"
        );
    }
    Ok(())
}

fn check_url(url: &str) -> anyhow::Result<()> {
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"));
    match rest {
        Some(host) if !host.is_empty() && !host.contains('/') => Ok(()),
        _ => bail!(
            "--advertise-url {url:?} is not acceptable: give http://host:port or \
             https://host:port, without a path"
        ),
    }
}

fn default_url(local: SocketAddr, scheme: &str) -> anyhow::Result<String> {
    if local.ip().is_unspecified() {
        bail!(
            "the server listens on every interface ({local}): give --advertise-url, the URL \
             other nodes reach this one at"
        );
    }
    Ok(format!("{scheme}://{local}"))
}

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "monoseq".to_owned())
}

/// One partition's lease as the database holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LeaseRow {
    /// The partition.
    pub partition: u32,
    /// Its epoch: raised by every takeover.
    pub epoch: u64,
    /// The holder (`None`: free).
    pub node_id: Option<String>,
    /// Milliseconds until the lease expires by the database's clock (negative: expired).
    pub expires_in_ms: i64,
}

/// A node as the database knows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NodeRow {
    /// Its name.
    pub node_id: String,
    /// Where it is reached.
    pub url: String,
    /// Milliseconds since its last heartbeat.
    pub seen_ms_ago: u64,
}

/// Leases and nodes, read in one snapshot.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct TableStatus {
    /// Every partition's lease.
    pub leases: Vec<LeaseRow>,
    /// Every node that has not left.
    pub nodes: Vec<NodeRow>,
}

/// The database table of leases (PostgreSQL's in production). Every call may block.
pub trait LeaseTable: Send + Sync + 'static {
    /// Rows for partitions `0..partitions` exist.
    fn ensure_partitions(&self, partitions: u32) -> Result<(), KvError>;
    /// Records that `node_id` at `url` is alive now.
    fn heartbeat(&self, node_id: &str, url: &str) -> Result<(), KvError>;
    /// Forgets `node_id`.
    fn leave(&self, node_id: &str) -> Result<(), KvError>;
    /// Takes `partition` if it is free or expired, raising its epoch; the new epoch.
    fn acquire(
        &self,
        partition: u32,
        node_id: &str,
        lease: Duration,
    ) -> Result<Option<u64>, KvError>;
    /// Extends every lease of `held` still held with its epoch; the partitions renewed.
    fn renew(
        &self,
        node_id: &str,
        held: &[(u32, u64)],
        lease: Duration,
    ) -> Result<Vec<u32>, KvError>;
    /// Frees `partition` at once if still held with `epoch`.
    fn release(&self, node_id: &str, partition: u32, epoch: u64) -> Result<bool, KvError>;
    /// Every lease and node.
    fn status(&self) -> Result<TableStatus, KvError>;
    /// The store view whose every write is conditional on `partition`'s lease epoch.
    fn fenced(&self, partition: u32, epoch: u64) -> Store;
}

/// A lease this node holds.
#[derive(Debug, Clone, Copy)]
struct Held {
    epoch: u64,
    /// The node stops serving the partition at this instant unless a renewal moves it: the
    /// renewal's start plus the lease, less one renewal interval of margin.
    valid_until: Instant,
}

/// The cluster membership of one node.
pub struct Cluster {
    settings: ClusterSettings,
    partitions: u32,
    table: Arc<dyn LeaseTable>,
    cp: CommandProcessor<Store>,
    base: Store,
    trust: TrustLevel,
    held: Mutex<BTreeMap<u32, Held>>,
    view: RwLock<Arc<View>>,
    stopping: AtomicBool,
    /// The highest epoch seen of each partition: epochs only grow, so a lower one means the
    /// database went back in time (it lost acknowledged writes).
    epochs: Mutex<BTreeMap<u32, u64>>,
    /// Partitions whose lease went back: never served by this node again (a restart clears
    /// it, accepting the loss).
    went_back: Mutex<std::collections::BTreeSet<u32>>,
}

/// The last status read, with when.
#[derive(Debug, Clone)]
struct View {
    status: TableStatus,
    read_at: Instant,
}

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

impl Cluster {
    /// Joins the cluster: records the partitions and this node, gives back leases an earlier
    /// run of this node left, and starts the rounds of renewing and acquiring.
    ///
    /// # Errors
    ///
    /// When the database cannot be reached for the first round.
    pub async fn join(
        settings: ClusterSettings,
        table: Arc<dyn LeaseTable>,
        cp: CommandProcessor<Store>,
        base: Store,
        trust: TrustLevel,
    ) -> anyhow::Result<Arc<Cluster>> {
        let partitions = cp.config().partitions;
        let cluster = Arc::new(Cluster {
            settings,
            partitions,
            table,
            cp,
            base,
            trust,
            held: Mutex::new(BTreeMap::new()),
            view: RwLock::new(Arc::new(View {
                status: TableStatus::default(),
                read_at: Instant::now(),
            })),
            stopping: AtomicBool::new(false),
            epochs: Mutex::new(BTreeMap::new()),
            went_back: Mutex::new(std::collections::BTreeSet::new()),
        });
        let c = Arc::clone(&cluster);
        blocking(move || c.table.ensure_partitions(c.partitions))
            .await
            .context("recording the partitions' leases")?;
        cluster.round().await.context("joining the cluster")?;
        tracing::info!(
            node_id = %cluster.settings.node_id,
            advertise_url = %cluster.settings.advertise_url,
            lease_ms = cluster.settings.lease.as_millis() as u64,
            renew_ms = cluster.settings.renew.as_millis() as u64,
            partitions = ?cluster.cp.owned(),
            "joined the cluster"
        );
        if cluster.settings.no_fencing {
            tracing::warn!(
                "--no-fencing: partition writes carry no lease epoch; nodes can overwrite each \
                 other's events (benchmarks only)"
            );
        }
        tokio::spawn(Arc::clone(&cluster).rounds());
        tokio::spawn(Arc::clone(&cluster).watchdog());
        Ok(cluster)
    }

    /// Where partition `p` is served, by the last status read.
    #[must_use]
    pub fn owner(&self, p: u32) -> Owner {
        let view = self.view();
        let age = view.read_at.elapsed().as_millis() as i64;
        let row = view.status.leases.iter().find(|l| l.partition == p);
        let Some(LeaseRow {
            node_id: Some(node),
            expires_in_ms,
            ..
        }) = row
        else {
            return Owner::Nobody;
        };
        if *expires_in_ms <= age {
            return Owner::Nobody;
        }
        if *node == self.settings.node_id {
            return Owner::Here;
        }
        match view.status.nodes.iter().find(|n| &n.node_id == node) {
            Some(n) => Owner::Node {
                node_id: n.node_id.clone(),
                url: n.url.clone(),
            },
            None => Owner::Nobody,
        }
    }

    fn view(&self) -> Arc<View> {
        Arc::clone(&self.view.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// What `GET /v1/cluster` answers: this node, every node with its partitions, and every
    /// partition's owner, epoch and lease age, read from the database now.
    ///
    /// # Errors
    ///
    /// When the database cannot be read.
    pub async fn status_json(self: &Arc<Self>) -> anyhow::Result<serde_json::Value> {
        let c = Arc::clone(self);
        let status = blocking(move || c.table.status()).await?;
        let lease_ms = self.settings.lease.as_millis() as i64;
        let served = self.cp.owned();
        let partitions: Vec<_> = status
            .leases
            .iter()
            .map(|l| {
                serde_json::json!({
                    "partition": l.partition,
                    "epoch": l.epoch,
                    "owner": l.node_id.as_ref().filter(|_| l.expires_in_ms > 0),
                    "expires_in_ms": l.expires_in_ms,
                    "lease_age_ms": lease_ms - l.expires_in_ms,
                    "served_here": served.contains(&l.partition),
                })
            })
            .collect();
        let nodes: Vec<_> = status
            .nodes
            .iter()
            .map(|n| {
                let mine: Vec<u32> = status
                    .leases
                    .iter()
                    .filter(|l| l.node_id.as_ref() == Some(&n.node_id) && l.expires_in_ms > 0)
                    .map(|l| l.partition)
                    .collect();
                serde_json::json!({
                    "node_id": n.node_id,
                    "url": n.url,
                    "seen_ms_ago": n.seen_ms_ago,
                    "alive": (n.seen_ms_ago as i64) < lease_ms,
                    "partitions": mine,
                })
            })
            .collect();
        Ok(serde_json::json!({
            "node_id": self.settings.node_id,
            "lease_ms": lease_ms,
            "renew_ms": self.settings.renew.as_millis() as u64,
            "nodes": nodes,
            "partitions": partitions,
        }))
    }

    /// Leaves the cluster: stops the rounds, finishes and flushes every partition served here,
    /// gives its lease back (so another node takes it at its next round) and forgets the node.
    pub async fn leave(self: &Arc<Self>) {
        self.stopping.store(true, Ordering::SeqCst);
        let held: Vec<(u32, Held)> = self.held().iter().map(|(p, h)| (*p, *h)).collect();
        for (p, h) in held {
            self.hand_back(p, h.epoch).await;
        }
        let c = Arc::clone(self);
        if let Err(e) = blocking(move || c.table.leave(&c.settings.node_id)).await {
            tracing::warn!("leaving the cluster failed: {e}; the node's row expires on its own");
        }
        tracing::info!(node_id = %self.settings.node_id, "left the cluster; partitions handed over");
    }

    fn held(&self) -> std::sync::MutexGuard<'_, BTreeMap<u32, Held>> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Renewal rounds until the node stops.
    async fn rounds(self: Arc<Self>) {
        let mut tick = tokio::time::interval(self.settings.renew);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        while !self.stopping.load(Ordering::SeqCst) {
            tick.tick().await;
            if self.stopping.load(Ordering::SeqCst) {
                break;
            }
            if let Err(e) = self.round().await {
                tracing::warn!(
                    "a lease round failed: {e:#}; partitions stop being served here when their \
                     leases can no longer be renewed in time"
                );
            }
        }
    }

    /// Stops serving every partition whose lease could not be renewed in time, checked four
    /// times per renewal interval.
    async fn watchdog(self: Arc<Self>) {
        let mut tick = tokio::time::interval(self.settings.renew / 4);
        while !self.stopping.load(Ordering::SeqCst) {
            tick.tick().await;
            let now = Instant::now();
            let late: Vec<u32> = {
                let mut held = self.held();
                let late: Vec<u32> = held
                    .iter()
                    .filter(|(_, h)| h.valid_until <= now)
                    .map(|(p, _)| *p)
                    .collect();
                for p in &late {
                    held.remove(p);
                }
                late
            };
            for p in late {
                tracing::error!(
                    partition = p,
                    "the partition's lease could not be renewed in time; it stops being served \
                     here before the lease can expire"
                );
                self.stop_serving(p);
            }
        }
    }

    /// One round: heartbeat, renew, drop what was lost, then take or give back partitions
    /// toward a fair share.
    async fn round(self: &Arc<Self>) -> anyhow::Result<()> {
        let began = Instant::now();
        let c = Arc::clone(self);
        blocking(move || {
            c.table
                .heartbeat(&c.settings.node_id, &c.settings.advertise_url)
        })
        .await?;
        self.renew(began).await?;
        self.drop_fenced();
        let c = Arc::clone(self);
        let status = blocking(move || c.table.status()).await?;
        self.check_epochs(&status);
        *self.view.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(View {
            status: status.clone(),
            read_at: Instant::now(),
        });
        if self.stopping.load(Ordering::SeqCst) {
            return Ok(());
        }
        let target = self.fair_share(&status);
        let held = self.held().len();
        if held < target {
            self.take(&status, target - held).await?;
        } else if held > target && self.others_want(&status, target) {
            self.give_back_one().await;
        }
        Ok(())
    }

    /// Renews every held lease; a lease not renewed (another node took it) stops being served.
    async fn renew(self: &Arc<Self>, began: Instant) -> anyhow::Result<()> {
        let held: Vec<(u32, u64)> = self.held().iter().map(|(p, h)| (*p, h.epoch)).collect();
        if held.is_empty() {
            return Ok(());
        }
        let c = Arc::clone(self);
        let asked = held.clone();
        let renewed =
            blocking(move || c.table.renew(&c.settings.node_id, &asked, c.settings.lease)).await?;
        let valid_until = self.valid_until(began);
        let mut lost = Vec::new();
        {
            let mut map = self.held();
            for (p, epoch) in held {
                if renewed.contains(&p) {
                    if let Some(h) = map.get_mut(&p).filter(|h| h.epoch == epoch) {
                        h.valid_until = valid_until;
                    }
                } else if map.get(&p).is_some_and(|h| h.epoch == epoch) {
                    map.remove(&p);
                    lost.push(p);
                }
            }
        }
        for p in lost {
            tracing::warn!(
                partition = p,
                "the partition's lease was taken over by another node; it stops being served here"
            );
            self.stop_serving(p);
        }
        Ok(())
    }

    fn valid_until(&self, began: Instant) -> Instant {
        began + self.settings.lease - self.settings.renew
    }

    /// Refuses, for good, every partition whose lease epoch is lower than one seen before:
    /// the database lost acknowledged writes (a failover to a standby that was behind, or a
    /// restored backup), and serving the partition could hand its lost numbers out again.
    fn check_epochs(self: &Arc<Self>, status: &TableStatus) {
        let mut newly = Vec::new();
        {
            let mut seen = self.epochs.lock().unwrap_or_else(|e| e.into_inner());
            let mut refused = self.went_back.lock().unwrap_or_else(|e| e.into_inner());
            for l in &status.leases {
                let highest = seen.entry(l.partition).or_insert(l.epoch);
                if l.epoch < *highest {
                    if refused.insert(l.partition) {
                        newly.push((l.partition, *highest, l.epoch));
                    }
                } else {
                    *highest = l.epoch;
                }
            }
        }
        for (p, was, now) in newly {
            tracing::error!(
                partition = p,
                epoch_seen = was,
                epoch_now = now,
                "the database's lease of the partition went back in time: the database lost \
                 acknowledged writes (a failover to a standby that was behind, or a restored \
                 backup?). This node no longer serves the partition, so that no number is \
                 handed out twice; restore the database, or restart the node to accept the loss"
            );
            if self.held().remove(&p).is_some() {
                self.stop_serving(p);
            }
        }
    }

    /// Partitions whose storage refused a write (another node owns them) are released here.
    fn drop_fenced(self: &Arc<Self>) {
        for p in self.cp.fenced() {
            self.held().remove(&p);
            self.stop_serving(p);
        }
    }

    /// Stops serving `p` here at once (commands for it are answered "not the owner" from now
    /// on); its queued commands finish in the background.
    fn stop_serving(self: &Arc<Self>, p: u32) {
        let cp = self.cp.clone();
        tokio::spawn(async move {
            if !cp.release(p, RELEASE_TIMEOUT).await {
                tracing::warn!(partition = p, "the partition did not stop in time");
            }
        });
    }

    /// `ceil(partitions / live nodes)`.
    fn fair_share(&self, status: &TableStatus) -> usize {
        let lease_ms = self.settings.lease.as_millis() as u64;
        let live = status
            .nodes
            .iter()
            .filter(|n| n.seen_ms_ago < lease_ms || n.node_id == self.settings.node_id)
            .count()
            .max(1);
        (self.partitions as usize).div_ceil(live)
    }

    /// Whether a live node other than this one holds fewer than `target` partitions (so
    /// giving one back helps balance).
    fn others_want(&self, status: &TableStatus, target: usize) -> bool {
        let lease_ms = self.settings.lease.as_millis() as u64;
        status.nodes.iter().any(|n| {
            n.node_id != self.settings.node_id && n.seen_ms_ago < lease_ms && {
                let holds = status
                    .leases
                    .iter()
                    .filter(|l| l.node_id.as_ref() == Some(&n.node_id) && l.expires_in_ms > 0)
                    .count();
                holds < target
            }
        })
    }

    /// Takes up to `wanted` free or expired partitions (and gives back, so that they can be
    /// taken again with a new epoch, those an earlier run of this node left behind).
    async fn take(self: &Arc<Self>, status: &TableStatus, wanted: usize) -> anyhow::Result<()> {
        let mut taken = 0;
        for row in self.candidates(status) {
            if taken == wanted || self.stopping.load(Ordering::SeqCst) {
                break;
            }
            let began = Instant::now();
            if row.node_id.as_deref() == Some(&self.settings.node_id) {
                if row.expires_in_ms > 0 {
                    tracing::warn!(
                        partition = row.partition,
                        "the partition's lease is held under this node's name by an earlier \
                         run (or by another process with the same --node-id); taking it over \
                         with a new epoch"
                    );
                }
                let (c, p, epoch) = (Arc::clone(self), row.partition, row.epoch);
                blocking(move || c.table.release(&c.settings.node_id, p, epoch)).await?;
            }
            let (c, p) = (Arc::clone(self), row.partition);
            let epoch =
                blocking(move || c.table.acquire(p, &c.settings.node_id, c.settings.lease)).await?;
            if let Some(epoch) = epoch {
                self.serve(p, epoch, began)?;
                taken += 1;
            }
        }
        Ok(())
    }

    /// Free, expired or left-behind partitions not served here, starting at a place that
    /// depends on the node's name (so that nodes starting together try different ones first).
    fn candidates<'a>(&'a self, status: &'a TableStatus) -> Vec<&'a LeaseRow> {
        let held = self.held();
        let went_back = self.went_back.lock().unwrap_or_else(|e| e.into_inner());
        let me = &self.settings.node_id;
        let mut rows: Vec<&LeaseRow> = status
            .leases
            .iter()
            .filter(|l| !held.contains_key(&l.partition) && !went_back.contains(&l.partition))
            .filter(|l| {
                l.node_id.is_none() || l.expires_in_ms <= 0 || l.node_id.as_ref() == Some(me)
            })
            .collect();
        let start = name_hash(me) % u64::from(self.partitions.max(1));
        rows.sort_by_key(|l| {
            (u64::from(l.partition) + u64::from(self.partitions) - start)
                % u64::from(self.partitions)
        });
        rows
    }

    /// Starts serving `p` under `epoch`: its writes go through the fenced view.
    fn serve(self: &Arc<Self>, p: u32, epoch: u64, began: Instant) -> anyhow::Result<()> {
        let view = if self.settings.no_fencing {
            Arc::clone(&self.base)
        } else {
            self.table.fenced(p, epoch)
        };
        let store = EventStore::new(view, APP, self.trust);
        self.epochs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(p, epoch);
        self.held().insert(
            p,
            Held {
                epoch,
                valid_until: self.valid_until(began),
            },
        );
        self.cp.acquire(p, store)?;
        tracing::info!(
            partition = p,
            epoch,
            "took the partition's lease; actualizing it"
        );
        Ok(())
    }

    /// Gives back the partition with the highest number, after finishing its commands.
    async fn give_back_one(self: &Arc<Self>) {
        let last = self.held().iter().next_back().map(|(p, h)| (*p, h.epoch));
        if let Some((p, epoch)) = last {
            tracing::info!(
                partition = p,
                "giving the partition back to balance the nodes"
            );
            self.hand_back(p, epoch).await;
        }
    }

    /// Stops serving `p` (queued commands finish, numbers flushed), then frees its lease.
    async fn hand_back(self: &Arc<Self>, p: u32, epoch: u64) {
        self.held().remove(&p);
        if !self.cp.release(p, RELEASE_TIMEOUT).await {
            tracing::warn!(
                partition = p,
                "the partition did not stop in time; its lease is left to expire"
            );
            return;
        }
        let c = Arc::clone(self);
        if let Err(e) = blocking(move || c.table.release(&c.settings.node_id, p, epoch)).await {
            tracing::warn!(
                partition = p,
                "giving the lease back failed: {e}; it expires on its own"
            );
        }
    }
}

/// Connections of the lease calls' own pool.
pub const LEASE_POOL_CONNECTIONS: usize = 2;

/// The leases of a PostgreSQL database.
pub struct PgLeaseTable {
    store: Arc<monoseq_pg::PgStore>,
    leases: monoseq_pg::Leases,
}

impl PgLeaseTable {
    /// The lease table of `store`'s database, reached through `own`: a store with a pool of
    /// its own, so that renewals never wait behind the partitions' writes for a connection.
    #[must_use]
    pub fn new(store: Arc<monoseq_pg::PgStore>, own: &monoseq_pg::PgStore) -> PgLeaseTable {
        PgLeaseTable {
            store,
            leases: own.leases(),
        }
    }
}

impl LeaseTable for PgLeaseTable {
    fn ensure_partitions(&self, partitions: u32) -> Result<(), KvError> {
        self.leases.ensure_partitions(partitions)
    }

    fn heartbeat(&self, node_id: &str, url: &str) -> Result<(), KvError> {
        self.leases.heartbeat(node_id, url)
    }

    fn leave(&self, node_id: &str) -> Result<(), KvError> {
        self.leases.leave(node_id)
    }

    fn acquire(
        &self,
        partition: u32,
        node_id: &str,
        lease: Duration,
    ) -> Result<Option<u64>, KvError> {
        self.leases.acquire(partition, node_id, lease)
    }

    fn renew(
        &self,
        node_id: &str,
        held: &[(u32, u64)],
        lease: Duration,
    ) -> Result<Vec<u32>, KvError> {
        self.leases.renew(node_id, held, lease)
    }

    fn release(&self, node_id: &str, partition: u32, epoch: u64) -> Result<bool, KvError> {
        self.leases.release(node_id, partition, epoch)
    }

    fn status(&self) -> Result<TableStatus, KvError> {
        let status = self.leases.status()?;
        Ok(TableStatus {
            leases: status
                .leases
                .into_iter()
                .map(|l| LeaseRow {
                    partition: l.partition,
                    epoch: l.epoch,
                    node_id: l.node_id,
                    expires_in_ms: l.expires_in_ms,
                })
                .collect(),
            nodes: status
                .nodes
                .into_iter()
                .map(|n| NodeRow {
                    node_id: n.node_id,
                    url: n.url,
                    seen_ms_ago: n.seen_ago_ms.max(0) as u64,
                })
                .collect(),
        })
    }

    fn fenced(&self, partition: u32, epoch: u64) -> Store {
        Arc::new(self.store.fenced(partition, epoch))
    }
}

/// `monoseq cluster …`.
#[derive(Debug, clap::Subcommand)]
pub enum ClusterCmd {
    /// Show the nodes, their partitions, epochs and lease ages, as a node reads them from the
    /// database.
    Status {
        /// Any node of the cluster.
        #[arg(long, env = "MONOSEQ_URL")]
        url: String,
        /// A bearer token, when the nodes require one.
        #[arg(long, env = "MONOSEQ_TOKEN", hide_env_values = true)]
        token: Option<String>,
        /// Print the node's JSON answer instead of a table.
        #[arg(long)]
        json: bool,
    },
}

/// Runs a `monoseq cluster` command.
///
/// # Errors
///
/// When the node cannot be reached or answers with an error.
pub async fn run_command(command: ClusterCmd) -> anyhow::Result<()> {
    let ClusterCmd::Status { url, token, json } = command;
    let url = format!("{}/v1/cluster", url.trim_end_matches('/'));
    let mut request = reqwest::Client::new().get(&url);
    if let Some(t) = token {
        request = request.bearer_auth(t);
    }
    let answer = request
        .send()
        .await
        .with_context(|| format!("asking {url}"))?;
    let status = answer.status();
    let body: serde_json::Value = answer
        .json()
        .await
        .with_context(|| format!("reading the answer of {url}"))?;
    if !status.is_success() {
        bail!(
            "{url} answered {status}: {}",
            body["message"].as_str().unwrap_or("no message")
        );
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&body)?);
    } else {
        print_status(&body);
    }
    Ok(())
}

fn print_status(v: &serde_json::Value) {
    if v["clustered"] == serde_json::json!(false) {
        println!("one node on embedded storage serves every partition");
        return;
    }
    // `Value`'s own formatting ignores widths: every cell becomes a string first.
    let text = |v: &serde_json::Value| match v {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Null => "(none)".to_owned(),
        other => other.to_string(),
    };
    println!(
        "{:<24} {:<32} {:>8} {:>6}  partitions",
        "node", "url", "seen ms", "alive"
    );
    for n in v["nodes"].as_array().into_iter().flatten() {
        println!(
            "{:<24} {:<32} {:>8} {:>6}  {}",
            text(&n["node_id"]),
            text(&n["url"]),
            text(&n["seen_ms_ago"]),
            text(&n["alive"]),
            text(&n["partitions"])
        );
    }
    println!();
    println!(
        "{:>9} {:<24} {:>6} {:>12}",
        "partition", "owner", "epoch", "lease age ms"
    );
    for p in v["partitions"].as_array().into_iter().flatten() {
        println!(
            "{:>9} {:<24} {:>6} {:>12}",
            text(&p["partition"]),
            text(&p["owner"]),
            text(&p["epoch"]),
            text(&p["lease_age_ms"])
        );
    }
}

/// FNV-1a of a name: a stable spread of nodes' starting partitions.
fn name_hash(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Runs a blocking lease call off the async runtime.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, KvError> + Send + 'static,
) -> anyhow::Result<T> {
    Ok(tokio::task::spawn_blocking(f).await??)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_renewal_interval_must_fit_three_times_into_the_lease() {
        assert!(check_lease(3_000, 1_000).is_ok());
        let e = check_lease(2_000, 1_000).unwrap_err().to_string();
        assert!(e.contains("--lease-renew-ms"), "{e}");
        assert!(check_lease(3_000, 0).is_err());
        assert!(check_lease(100, 10).is_err(), "below the shortest lease");
    }

    #[test]
    fn node_ids_and_urls_are_checked() {
        assert!(check_node_id("node-1.a:2").is_ok());
        assert!(check_node_id("").is_err());
        assert!(check_node_id("a b").is_err());
        assert!(check_url("http://10.0.0.1:8080").is_ok());
        assert!(check_url("https://n1.example:443").is_ok());
        assert!(check_url("ftp://x").is_err());
        assert!(check_url("http://x/path").is_err());
        let any: SocketAddr = "0.0.0.0:8080".parse().unwrap();
        assert!(
            default_url(any, "http").is_err(),
            "an unspecified address is not a URL"
        );
    }
}
