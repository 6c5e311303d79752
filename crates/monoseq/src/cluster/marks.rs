//! [`NodeMarks`]: a node's high-water marks on its own disk, outside the database they guard.
//!
//! A database that fails over to a standby that was behind, or is restored to an earlier
//! point, takes with it what it lost; marks kept in it would go back too. So every node keeps
//! a `monoseq.marks` file (`monoseq_store::Marks`, raised durably with each group before its
//! answer) in its marks directory, one per store (`<marks-dir>/<store ID>/`), and the nodes
//! share them: `GET /v1/marks` answers a node's marks and the losses accepted for the store,
//! each node max-merges every live peer's once per renewal round, and a node about to serve a
//! partition it takes over pulls them first, so its mark includes what former owners
//! acknowledged. Losses an operator accepted (`serve --accept-loss`) are kept beside the marks
//! (`monoseq.losses.json`) and shared the same way, so every node that later serves such a
//! partition continues its numbers above the loss.
//!
//! The directory's lock is held for the whole run, and the directory has an identity (a
//! random ID written at its first use, `monoseq-marks.id`) that the run records with its name
//! in the node table: a later run that holds the lock and finds that identity on its name knows
//! the run recorded there is dead (the kernel released its lock when it died), and takes the
//! name and its partitions back at once.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, bail};
use monoseq_store::{AcceptedLoss, EventStore, Mark, Marks};
use monoseq_wire::MarksBody;

use crate::base::Store;

/// The lock file that keeps two processes from using one store's marks.
pub const LOCK_FILE: &str = "monoseq-marks.lock";
/// The accepted losses of a store, beside its marks.
pub const LOSSES_FILE: &str = "monoseq.losses.json";
/// Longest wait for one peer's marks.
pub const PULL_TIMEOUT: Duration = Duration::from_millis(800);
/// The identity of a store's marks directory: a random ID written at its first use.
pub const ID_FILE: &str = "monoseq-marks.id";
/// How often a run waiting for another process's lock of the marks directory tries again.
const LOCK_RETRY: Duration = Duration::from_millis(50);

/// A node's marks directory, opened for one store.
#[derive(Debug)]
pub struct NodeMarks {
    dir: PathBuf,
    store_id: String,
    marks: Arc<Marks>,
    losses: Mutex<Vec<AcceptedLoss>>,
    dir_id: String,
    _lock: File,
}

impl NodeMarks {
    /// Opens (creating) the marks of store `store_id` in `base` (`<base>/<store_id>/`), with
    /// `partitions` partitions; locks them so that no other process uses them, waiting up to
    /// `lock_wait` for another process that holds the lock (an earlier run still stopping, or
    /// paused) to release it, and gives the directory its identity at its first use.
    ///
    /// # Errors
    ///
    /// When the directory cannot be created or written (a read-only disk), when another
    /// process still holds its lock after `lock_wait`, or when the files are damaged or hold
    /// another partition count.
    pub fn open(
        base: &Path,
        store_id: &str,
        partitions: u32,
        lock_wait: Duration,
    ) -> anyhow::Result<NodeMarks> {
        let dir = base.join(store_id);
        std::fs::create_dir_all(&dir).map_err(|e| unwritable(&dir, &e))?;
        let lock_path = dir.join(LOCK_FILE);
        let lock = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| unwritable(&dir, &e))?;
        lock_within(&lock, base, lock_wait)?;
        let dir_id = dir_identity(&dir)?;
        let marks = match Marks::open(&dir, partitions)? {
            Some(m) => m,
            None => Marks::create(&dir, partitions)?,
        };
        let losses = read_losses(&dir)?;
        Ok(NodeMarks {
            dir,
            store_id: store_id.to_owned(),
            marks: Arc::new(marks),
            losses: Mutex::new(losses),
            dir_id,
            _lock: lock,
        })
    }

    /// The identity of this store's marks directory, whose lock this process holds.
    #[must_use]
    pub fn dir_id(&self) -> &str {
        &self.dir_id
    }

    /// The marks file, raised by the command processor with every group.
    #[must_use]
    pub fn marks(&self) -> Arc<Marks> {
        Arc::clone(&self.marks)
    }

    /// Where this store's marks are kept.
    #[must_use]
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The losses accepted for the store, oldest first.
    #[must_use]
    pub fn losses(&self) -> Vec<AcceptedLoss> {
        self.lock().clone()
    }

    /// The numbers of partition `p` retired by accepted losses.
    #[must_use]
    pub fn retired(&self, p: u32) -> Mark {
        self.lock()
            .iter()
            .filter(|l| l.partition == p)
            .fold(Mark::default(), |m, l| m.max(&l.mark))
    }

    /// What `GET /v1/marks` answers.
    #[must_use]
    pub fn answer(&self) -> MarksBody {
        MarksBody {
            store_id: self.store_id.clone(),
            partitions: self.marks.partitions(),
            marks: self
                .marks
                .all()
                .iter()
                .map(crate::wire::mark_body)
                .collect(),
            losses: self.losses().iter().map(crate::wire::loss_body).collect(),
        }
    }

    /// Max-merges a peer's marks and accepted losses into this node's files, durably;
    /// answers the partitions whose mark rose.
    ///
    /// # Errors
    ///
    /// When the peer's answer belongs to another store or partition count, or the files
    /// cannot be written.
    pub fn merge(&self, peer: &MarksBody) -> anyhow::Result<Vec<u32>> {
        if peer.store_id != self.store_id || peer.partitions != self.marks.partitions() {
            bail!(
                "the peer's marks are of store {} with {} partitions, this node's of store {} \
                 with {}",
                peer.store_id,
                peer.partitions,
                self.store_id,
                self.marks.partitions()
            );
        }
        let mut raised = Vec::new();
        for (p, mark) in peer.marks.iter().enumerate() {
            let p = u32::try_from(p).unwrap_or(u32::MAX);
            let mark = &crate::wire::mark(mark);
            if !self.marks.get(p)?.covers(mark) {
                self.marks.raise(p, mark)?;
                raised.push(p);
            }
        }
        for loss in &peer.losses {
            self.accept(crate::wire::loss(loss))?;
        }
        Ok(raised)
    }

    /// Records an accepted loss durably (once).
    ///
    /// # Errors
    ///
    /// When the losses file cannot be written.
    pub fn accept(&self, loss: AcceptedLoss) -> anyhow::Result<()> {
        let mut losses = self.lock();
        let known = losses
            .iter()
            .any(|l| l.partition == loss.partition && l.mark.covers(&loss.mark));
        if known {
            return Ok(());
        }
        let mut next = losses.clone();
        next.push(loss);
        next.sort_by_key(|l| (l.accepted_at_ms, l.partition));
        write_losses(&self.dir, &next)?;
        *losses = next;
        Ok(())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<AcceptedLoss>> {
        self.losses.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The refusal of a marks directory this process cannot write in.
fn unwritable(dir: &Path, e: &std::io::Error) -> anyhow::Error {
    anyhow::anyhow!(
        "the marks directory {} cannot be written ({e}); a node makes its high-water marks \
         durable there before each answer: give --marks-dir a writable directory on the node's \
         own disk (not a read-only one)",
        dir.display()
    )
}

/// Takes `lock`, waiting up to `wait` for another process that holds it: an earlier run of
/// this node still stopping (or paused), which must not be written beside.
fn lock_within(lock: &File, base: &Path, wait: Duration) -> anyhow::Result<()> {
    let began = std::time::Instant::now();
    let mut told = false;
    loop {
        match lock.try_lock() {
            Ok(()) => {
                if told {
                    tracing::info!(
                        marks_dir = %base.display(),
                        waited_ms = began.elapsed().as_millis(),
                        "the other process released the marks directory's lock"
                    );
                }
                return Ok(());
            }
            Err(std::fs::TryLockError::WouldBlock) => {}
            Err(std::fs::TryLockError::Error(e)) => {
                bail!("locking the marks directory {}: {e}", base.display())
            }
        }
        if began.elapsed() >= wait {
            bail!(
                "marks directory {} is in use by another process of this database (another \
                 node, or another run of this one that is still running or paused) after \
                 waiting {} ms: stop that process, or give each node its own --marks-dir",
                base.display(),
                wait.as_millis()
            );
        }
        if !told {
            told = true;
            tracing::warn!(
                marks_dir = %base.display(),
                wait_ms = wait.as_millis(),
                "another process holds the marks directory's lock (an earlier run still \
                 stopping, or paused?); waiting for it to end before joining the cluster"
            );
        }
        std::thread::sleep(LOCK_RETRY);
    }
}

/// The identity of marks directory `dir` (locked by this process): read from [`ID_FILE`], or
/// a new random one written durably there when it is missing or unreadable (a first use, or a
/// write cut short; a new identity only means the next start cannot prove this run dead).
fn dir_identity(dir: &Path) -> anyhow::Result<String> {
    let path = dir.join(ID_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) if is_identity(text.trim()) => return Ok(text.trim().to_owned()),
        Ok(_) => tracing::warn!(
            file = %path.display(),
            "the marks directory's identity file is damaged; writing a new identity (this start \
             waits for the earlier run's name to go stale)"
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    }
    let id = random_id();
    let tmp = dir.join(format!("{ID_FILE}.tmp"));
    std::fs::write(&tmp, format!("{id}\n")).map_err(|e| unwritable(dir, &e))?;
    File::open(&tmp)
        .and_then(|f| f.sync_all())
        .with_context(|| format!("syncing {}", tmp.display()))?;
    std::fs::rename(&tmp, &path).map_err(|e| unwritable(dir, &e))?;
    File::open(dir)
        .and_then(|d| d.sync_all())
        .with_context(|| format!("syncing {}", dir.display()))?;
    Ok(id)
}

/// Whether `text` is an identity as [`random_id`] writes them: 128 bits in lowercase
/// hexadecimal, every digit written.
fn is_identity(text: &str) -> bool {
    u128::from_str_radix(text, 16).is_ok_and(|v| format!("{v:032x}") == text)
}

/// 128 random bits in hexadecimal: two outputs of randomly keyed hashers over the process
/// ID and the time.
fn random_id() -> String {
    use std::hash::{BuildHasher, Hasher};
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let half = |salt: u8| {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u8(salt);
        h.write_u32(std::process::id());
        h.write_u128(nanos);
        h.finish()
    };
    let bits = (u128::from(half(0)) << u64::BITS) | u128::from(half(1));
    format!("{bits:032x}")
}

fn read_losses(dir: &Path) -> anyhow::Result<Vec<AcceptedLoss>> {
    let path = dir.join(LOSSES_FILE);
    match std::fs::read(&path) {
        Ok(bytes) => serde_json::from_slice(&bytes).with_context(|| {
            format!(
                "accepted losses file {} is damaged; restore it from another node's marks \
                 directory",
                path.display()
            )
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
    }
}

/// Writes the losses file by rename, durably.
fn write_losses(dir: &Path, losses: &[AcceptedLoss]) -> anyhow::Result<()> {
    let path = dir.join(LOSSES_FILE);
    let tmp = dir.join(format!("{LOSSES_FILE}.tmp"));
    let bytes = serde_json::to_vec_pretty(losses)?;
    std::fs::write(&tmp, bytes).with_context(|| format!("writing {}", tmp.display()))?;
    File::open(&tmp)
        .and_then(|f| f.sync_all())
        .with_context(|| format!("syncing {}", tmp.display()))?;
    std::fs::rename(&tmp, &path).with_context(|| format!("renaming {}", path.display()))?;
    File::open(dir)
        .and_then(|d| d.sync_all())
        .with_context(|| format!("syncing {}", dir.display()))?;
    Ok(())
}

/// The partitions whose stored PLog lacks the event at their mark (above any loss already
/// accepted), each with the loss to accept (`monoseq_store::find_losses`): blocking reads of
/// `store`, a point read per partition and a few more per lost one.
///
/// # Errors
///
/// When the marks file or the database cannot be read.
pub fn find_losses(
    node: &NodeMarks,
    store: &EventStore<Store>,
    now_ms: u64,
) -> anyhow::Result<Vec<AcceptedLoss>> {
    let marks = (0..node.marks.partitions())
        .map(|p| Ok((node.marks.get(p)?, node.retired(p))))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let found = monoseq_store::find_losses(store, &marks)
        .context("reading the stored PLogs against the marks")?;
    Ok(found.iter().map(|l| l.accepted(now_ms)).collect())
}

/// Pulls the marks of the nodes at `urls` (at once, each within [`PULL_TIMEOUT`]) and
/// max-merges them into `node`'s; a node that does not answer is skipped (logged at debug).
pub async fn pull_into(node: &Arc<NodeMarks>, prober: &crate::peers::Prober, urls: &[String]) {
    let pulls: Vec<_> = urls
        .iter()
        .map(|url| {
            let prober = prober.clone();
            let url = url.clone();
            tokio::spawn(async move {
                let answer = prober.marks(&url, PULL_TIMEOUT).await;
                (url, answer)
            })
        })
        .collect();
    for pull in pulls {
        let Ok((url, answer)) = pull.await else {
            continue;
        };
        if let Err(e) = answer.and_then(|peer| node.merge(&peer)) {
            tracing::debug!(peer = %url, "the peer's high-water marks were not merged: {e:#}");
        }
    }
}

/// Opens this node's marks for the database `opened` holds, merges those of every live peer
/// (found in `table`), and with `accept_loss` accepts every loss found: each partition whose
/// stored PLog lacks the event at its mark is recorded (logged, and written in the marks
/// directory), so that the command processor continues its numbers above the mark and the
/// partition's owner retires them in the database (`ensure_retired`). Sets `opened.marks`
/// and adds the store's accepted losses to `opened.identity`.
///
/// # Errors
///
/// When the marks directory cannot be opened, or the database not read for `accept_loss`.
pub async fn prepare(
    cluster: &super::ClusterSettings,
    prober: &crate::peers::Prober,
    table: &Arc<dyn super::FencedLeases>,
    opened: &mut crate::storage::Opened,
    accept_loss: bool,
) -> anyhow::Result<Arc<NodeMarks>> {
    let node = Arc::new(open_locked(cluster, &opened.identity).await?);
    let t = Arc::clone(table);
    match tokio::task::spawn_blocking(move || t.status()).await? {
        Ok(status) => {
            let alive = u64::try_from(cluster.lease.as_millis()).unwrap_or(u64::MAX);
            let urls: Vec<String> = status
                .nodes
                .iter()
                .filter(|n| n.node_id != cluster.node_id && n.seen_ms_ago < alive)
                .map(|n| n.url.clone())
                .collect();
            pull_into(&node, prober, &urls).await;
        }
        Err(e) => tracing::warn!(
            "the other nodes' high-water marks could not be pulled at start ({}); they are \
             pulled again before each partition is served",
            crate::base::chain(&e)
        ),
    }
    if accept_loss {
        let n = Arc::clone(&node);
        let store = EventStore::new(
            Arc::clone(&opened.kv),
            crate::base::APP,
            monoseq_store::TrustLevel::Level0,
        );
        let found =
            tokio::task::spawn_blocking(move || find_losses(&n, &store, now_ms())).await??;
        for loss in found {
            node.accept(loss)?;
            tracing::warn!(
                partition = loss.partition,
                plog_from = loss.plog_from,
                plog_to = loss.plog_to,
                wlog = loss.mark.wlog,
                crecord = loss.mark.crecord,
                owrecord = loss.mark.owrecord,
                marks_dir = %node.dir().display(),
                "loss accepted (--accept-loss): partition {}'s events at PLog offsets {}..={} \
                 were acknowledged and the database no longer has them; no PLog offset, WLog \
                 offset or record ID at or below the mark is handed out again",
                loss.partition,
                loss.plog_from,
                loss.plog_to
            );
        }
    }
    for loss in node.losses() {
        if !opened.identity.losses.contains(&loss) {
            opened.identity.losses.push(loss);
        }
    }
    opened.marks = Some(node.marks());
    Ok(node)
}

/// This node's marks of the store `identity` names, locked ([`NodeMarks::open`]), waiting for
/// another process's lock as long as a run waits for a live run of its name before refusing to
/// start.
async fn open_locked(
    cluster: &super::ClusterSettings,
    identity: &monoseq_store::Identity,
) -> anyhow::Result<NodeMarks> {
    let (dir, store_id, partitions) = (
        cluster.marks_dir.clone(),
        identity.store_id.clone(),
        identity.partitions,
    );
    let wait = lock_wait(cluster, partitions)?;
    tokio::task::spawn_blocking(move || NodeMarks::open(&dir, &store_id, partitions, wait)).await?
}

/// How long a start waits for another process to release the marks directory's lock.
fn lock_wait(cluster: &super::ClusterSettings, partitions: u32) -> anyhow::Result<Duration> {
    monoseq_membership::Config::new(
        &cluster.node_id,
        "marks",
        &cluster.advertise_url,
        partitions,
        u64::try_from(cluster.lease.as_millis()).unwrap_or(u64::MAX),
        u64::try_from(cluster.renew.as_millis()).unwrap_or(u64::MAX),
    )
    .map(|c| Duration::from_millis(c.name_wait_ms()))
    .map_err(|e| anyhow::anyhow!("{}", crate::base::chain(&e)))
}

/// Unix milliseconds now.
#[must_use]
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mark(plog: u64) -> Mark {
        Mark {
            plog,
            wlog: plog * 2,
            crecord: plog * 3,
            owrecord: 0,
        }
    }

    #[test]
    fn a_marks_directory_is_used_by_one_process_and_merges_its_peers() {
        let dir = tempfile::tempdir().unwrap();
        let node = NodeMarks::open(dir.path(), "store-a", 4, Duration::ZERO).unwrap();
        let err = NodeMarks::open(dir.path(), "store-a", 4, Duration::ZERO).unwrap_err();
        assert!(err.to_string().contains("--marks-dir"), "{err}");
        node.marks().raise(1, &mark(5)).unwrap();
        let mut peer = node.answer();
        peer.marks[1] = crate::wire::mark_body(&mark(3));
        peer.marks[2] = crate::wire::mark_body(&mark(9));
        assert_eq!(node.merge(&peer).unwrap(), vec![2]);
        assert_eq!(node.marks().get(1).unwrap(), mark(5));
        assert_eq!(node.marks().get(2).unwrap(), mark(9));
        peer.store_id = "store-b".into();
        assert!(node.merge(&peer).is_err(), "another store's marks");
        drop(node);
        let again = NodeMarks::open(dir.path(), "store-a", 4, Duration::ZERO).unwrap();
        assert_eq!(again.marks().get(2).unwrap(), mark(9), "durable");
    }

    #[test]
    fn a_marks_directory_keeps_its_identity_across_runs_and_a_damaged_one_is_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let first = NodeMarks::open(dir.path(), "s", 2, Duration::ZERO).unwrap();
        let id = first.dir_id().to_owned();
        assert!(is_identity(&id), "{id}");
        drop(first);
        let again = NodeMarks::open(dir.path(), "s", 2, Duration::ZERO).unwrap();
        assert_eq!(again.dir_id(), id);
        drop(again);
        std::fs::write(dir.path().join("s").join(ID_FILE), "not an id").unwrap();
        let replaced = NodeMarks::open(dir.path(), "s", 2, Duration::ZERO).unwrap();
        assert!(is_identity(replaced.dir_id()) && replaced.dir_id() != id);
        let other = tempfile::tempdir().unwrap();
        let elsewhere = NodeMarks::open(other.path(), "s", 2, Duration::ZERO).unwrap();
        assert_ne!(elsewhere.dir_id(), replaced.dir_id());
    }

    #[test]
    fn an_accepted_loss_is_kept_once_and_retires_its_mark() {
        let dir = tempfile::tempdir().unwrap();
        let node = NodeMarks::open(dir.path(), "s", 2, Duration::ZERO).unwrap();
        let loss = AcceptedLoss {
            partition: 1,
            plog_from: 4,
            plog_to: 7,
            mark: mark(7),
            accepted_at_ms: 1,
            cause: monoseq_store::LossCause::AcceptedLoss,
        };
        node.accept(loss).unwrap();
        node.accept(loss).unwrap();
        assert_eq!(node.losses().len(), 1);
        assert_eq!(node.retired(1), mark(7));
        assert_eq!(node.retired(0), Mark::default());
        drop(node);
        let again = NodeMarks::open(dir.path(), "s", 2, Duration::ZERO).unwrap();
        assert_eq!(again.losses(), vec![loss]);
    }
}
