//! The simulated database: one key-value store and one lease table behind a synchronous
//! standby (a failover loses nothing acknowledged, and the database answers nothing while it
//! runs), with the faults a network and a database inflict on their callers: calls that fail
//! cleanly, writes whose request or answer is lost, nodes cut off. It can also go back in
//! time, as when an asynchronous standby that was behind is promoted or a backup is restored:
//! every applied write is logged with its time, and going back rebuilds the store, the lease
//! table and the record of fenced writers from the log's prefix. [`SimKv`] is one node's
//! fenced view of a partition, as `FencedPgStore` is in production: a write commits only
//! while the lease's epoch is the one the view was made with, and the database records which
//! node wrote under each (partition, epoch), so that the simulation can check that only one
//! ever did.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound;
use std::sync::{Arc, Mutex, MutexGuard};

use monoseq_kv::{
    CasError, Key, KeyBuf, KvError, KvStore, MemoryStore, Order, Visitor, WriteBatch, WriteError,
};
use monoseq_membership::{Call, Config, MemoryLeaseTable, Reply, TableError, execute};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::RENEW_MS;

/// Fault rates, per mille of calls, and how late a slow answer may come.
#[derive(Debug, Clone, Copy)]
pub struct DbFaults {
    /// Calls that fail cleanly (nothing applied).
    pub fail: u32,
    /// Writes whose request (half of these) or answer (the other half) is lost.
    pub unknown: u32,
    /// Lease calls whose answer comes late.
    pub late: u32,
    /// The latest a late answer comes, milliseconds.
    pub late_ms_max: u64,
}

impl Default for DbFaults {
    /// A healthy database: nothing fails, and one lease call in twenty is answered late by at
    /// most a quarter of a renewal interval (jitter, not a stall: a node makes up to three
    /// calls in a row between two heartbeats, and the name's validity spans two and a half
    /// intervals).
    fn default() -> DbFaults {
        DbFaults {
            fail: 0,
            unknown: 0,
            late: 50,
            late_ms_max: RENEW_MS / 4,
        }
    }
}

/// What the database decides of one call.
enum Fate {
    Normal,
    Fail,
    LoseRequest,
    LoseAnswer,
}

/// A write that was applied, as the log keeps it.
enum Applied {
    Batch(u32, WriteBatch),
    Swap(u32, KeyBuf, Option<Vec<u8>>, Option<Vec<u8>>),
    Lease(Call, Box<Config>),
    /// A client's unfenced compare-and-swap (a consumer position, which any node writes).
    Unfenced(KeyBuf, Option<Vec<u8>>, Option<Vec<u8>>),
}

impl Applied {
    /// The partition whose fenced view wrote it.
    fn partition(&self) -> Option<u32> {
        match self {
            Applied::Batch(p, _) | Applied::Swap(p, ..) => Some(*p),
            Applied::Lease(..) | Applied::Unfenced(..) => None,
        }
    }
}

struct DbState {
    rng: ChaCha8Rng,
    /// Every applied write with its time, oldest first.
    log: Vec<(u64, Applied)>,
    /// How often the database went back in time.
    went_back: u64,
    now: u64,
    /// A failover runs until then: nothing answers.
    down_until: u64,
    /// Nodes cut off from the database.
    cut: BTreeSet<String>,
    faults: DbFaults,
    /// The node whose fenced writes were accepted under each (partition, epoch), and when
    /// first.
    accepted: BTreeMap<(u32, u64), (String, u64)>,
    violations: Vec<String>,
}

/// The database every node reaches.
pub struct Db {
    kv: Mutex<Arc<MemoryStore>>,
    table: Mutex<Arc<MemoryLeaseTable>>,
    state: Mutex<DbState>,
}

impl Db {
    /// An empty database whose faults are decided by `seed`.
    pub fn new(seed: u64) -> Arc<Db> {
        Arc::new(Db {
            kv: Mutex::new(Arc::new(MemoryStore::new())),
            table: Mutex::new(Arc::new(MemoryLeaseTable::new())),
            state: Mutex::new(DbState {
                rng: ChaCha8Rng::seed_from_u64(seed ^ 0xdb),
                log: Vec::new(),
                went_back: 0,
                now: 0,
                down_until: 0,
                cut: BTreeSet::new(),
                faults: DbFaults::default(),
                accepted: BTreeMap::new(),
                violations: Vec::new(),
            }),
        })
    }

    fn state(&self) -> MutexGuard<'_, DbState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The store, unfenced and without faults (for the checks).
    pub fn kv(&self) -> Arc<MemoryStore> {
        Arc::clone(&self.kv.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// The lease table, without faults (for the checks).
    pub fn table(&self) -> Arc<MemoryLeaseTable> {
        Arc::clone(&self.table.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Moves the database's clock.
    pub fn set_now(&self, now: u64) {
        self.state().now = now;
        self.table().set_now(now);
    }

    /// Runs a lease call of the node of `config` (whose fate was decided) and logs it.
    pub fn lease_call(&self, call: &Call, config: &Config) -> Reply {
        let reply = execute(call, &*self.table(), config);
        let mut s = self.state();
        let now = s.now;
        s.log
            .push((now, Applied::Lease(call.clone(), Box::new(config.clone()))));
        reply
    }

    /// How many fenced writes of `partition` the database holds: the lease row's write count,
    /// which goes back with the database.
    fn writes(&self, partition: u32) -> u64 {
        let s = self.state();
        s.log
            .iter()
            .filter(|(_, a)| a.partition() == Some(partition))
            .count() as u64
    }

    /// How often the database went back in time so far.
    pub fn went_back(&self) -> u64 {
        self.state().went_back
    }

    /// Goes back to what the database held at `to` (an asynchronous standby promoted with a
    /// lost tail, or a backup restored): writes applied after it are gone, and nothing
    /// answers until `until` (the promotion or the restore).
    pub fn go_back(&self, to: u64, until: u64) {
        let mut s = self.state();
        let now = s.now;
        s.log.retain(|(t, _)| *t <= to);
        s.accepted.retain(|_, (_, t)| *t <= to);
        s.went_back += 1;
        s.down_until = s.down_until.max(until);
        let kv = MemoryStore::new();
        let table = MemoryLeaseTable::new();
        for (t, applied) in &s.log {
            match applied {
                Applied::Batch(_, batch) => {
                    let _ = kv.write(batch);
                }
                Applied::Swap(_, key, expected, new) | Applied::Unfenced(key, expected, new) => {
                    let _ = kv.compare_and_swap(key.as_key(), expected.as_deref(), new.as_deref());
                }
                Applied::Lease(call, config) => {
                    table.set_now(*t);
                    let _ = execute(call, &table, config);
                }
            }
        }
        table.set_now(now);
        *self.kv.lock().unwrap_or_else(|e| e.into_inner()) = Arc::new(kv);
        *self.table.lock().unwrap_or_else(|e| e.into_inner()) = Arc::new(table);
    }

    /// Sets the fault rates.
    pub fn set_faults(&self, faults: DbFaults) {
        self.state().faults = faults;
    }

    /// Fails over to the synchronous standby: nothing answers until `until`.
    pub fn fail_over(&self, until: u64) {
        let mut s = self.state();
        s.down_until = s.down_until.max(until);
    }

    /// The faults stop: no failover runs, no node is cut off, no call fails.
    pub fn heal(&self) {
        let mut s = self.state();
        s.down_until = s.now;
        s.cut.clear();
        s.faults = DbFaults::default();
    }

    /// Per mille of lease calls answered late now, and the latest such an answer comes
    /// (milliseconds).
    pub fn lateness(&self) -> (u32, u64) {
        let f = self.state().faults;
        (f.late, f.late_ms_max)
    }

    /// Cuts `node` off from the database, or joins it again.
    pub fn cut(&self, node: &str, cut: bool) {
        let mut s = self.state();

        if cut {
            s.cut.insert(node.to_owned());
        } else {
            s.cut.remove(node);
        }
    }

    /// Whether `node` reaches the database now.
    pub fn reachable(&self, node: &str) -> bool {
        let s = self.state();
        s.now >= s.down_until && !s.cut.contains(node)
    }

    /// Invariant violations the database saw (two nodes' writes accepted under one epoch).
    pub fn violations(&self) -> Vec<String> {
        self.state().violations.clone()
    }

    fn fate(&self, node: &str, write: bool) -> Result<Fate, KvError> {
        let mut s = self.state();
        if s.now < s.down_until || s.cut.contains(node) {
            return Err(unreachable());
        }
        let roll = s.rng.random_range(0..1_000u32);
        let DbFaults { fail, unknown, .. } = s.faults;
        Ok(match roll {
            r if write && r < unknown / 2 => Fate::LoseRequest,
            r if write && r < unknown => Fate::LoseAnswer,
            r if r < unknown + fail => Fate::Fail,
            _ => Fate::Normal,
        })
    }

    /// Decides the fate of a lease call of `node`: `Err` when it is not applied, `Ok(false)`
    /// when it is applied but its answer is lost, `Ok(true)` when it is answered.
    pub fn lease_call_fate(&self, node: &str) -> Result<bool, TableError> {
        let lost = |m: &str| TableError {
            message: m.to_owned(),
        };
        match self.fate(node, true) {
            Err(_) => Err(lost("the database is unreachable")),
            Ok(Fate::Fail | Fate::LoseRequest) => Err(lost("the request was lost")),
            Ok(Fate::LoseAnswer) => Ok(false),
            Ok(Fate::Normal) => Ok(true),
        }
    }

    fn accept(&self, node: &str, fence: (u32, u64), applied: Applied) {
        let mut s = self.state();
        let now = s.now;
        s.log.push((now, applied));
        let holder = s
            .accepted
            .entry(fence)
            .or_insert_with(|| (node.to_owned(), now))
            .0
            .clone();
        if holder != node {
            let v = format!(
                "partition {} epoch {}: writes of {holder} and of {node} were both accepted",
                fence.0, fence.1
            );
            s.violations.push(v);
        }
    }
}

fn unreachable() -> KvError {
    KvError::Backend {
        message: "the database is unreachable (simulated)".to_owned(),
        source: None,
    }
}

fn lost(what: &str) -> KvError {
    KvError::OutcomeUnknown {
        message: format!("simulated: {what}"),
    }
}

/// Whether the fence also requires the lease row's write count to be at least the highest this
/// view saw (as `FencedPgStore` does), so that a database that went back in time refuses the
/// next write of a view whose writes it lost.
const FENCE_COUNTS_WRITES: bool = true;

/// One node's view of one partition, every write fenced with the lease epoch it was made with.
pub struct SimKv {
    db: Arc<Db>,
    node: String,
    fence: (u32, u64),
    /// The highest write count of the partition's lease row this view saw (see
    /// `FencedPgStore`): a lower one means the database lost writes of this view.
    seen: std::sync::atomic::AtomicU64,
}

impl SimKv {
    /// `node`'s view of `partition` under `epoch`.
    pub fn new(db: Arc<Db>, node: &str, partition: u32, epoch: u64) -> SimKv {
        SimKv {
            db,
            node: node.to_owned(),
            fence: (partition, epoch),
            seen: std::sync::atomic::AtomicU64::new(0),
        }
    }

    fn fenced(&self) -> KvError {
        KvError::Fenced {
            message: format!("partition {} with epoch {}", self.fence.0, self.fence.1),
        }
    }

    /// Runs a write through the database's faults and the fence; `logged` is what the log
    /// keeps of it when it is applied.
    fn write_through<E: From<KvError>>(
        &self,
        logged: impl FnOnce() -> Applied,
        apply: impl FnOnce(&MemoryStore) -> Result<(), E>,
    ) -> Result<(), E> {
        use std::sync::atomic::Ordering;
        let fate = self.db.fate(&self.node, true)?;
        let allowed = self
            .db
            .table()
            .write_allowed(self.fence.0, self.fence.1, &self.node)
            && (!FENCE_COUNTS_WRITES
                || self.db.writes(self.fence.0) >= self.seen.load(Ordering::SeqCst));
        let run = || {
            if !allowed {
                return Err(E::from(self.fenced()));
            }
            let result = apply(&self.db.kv());
            if result.is_ok() {
                self.db.accept(&self.node, self.fence, logged());
                self.seen
                    .store(self.db.writes(self.fence.0), Ordering::SeqCst);
            }
            result
        };
        match fate {
            Fate::Normal => run(),
            Fate::Fail => Err(unreachable().into()),
            Fate::LoseRequest => Err(lost("the request was lost").into()),
            Fate::LoseAnswer => {
                let _ = run();
                Err(lost("the write was applied, then its answer was lost").into())
            }
        }
    }

    fn read_gate(&self) -> Result<(), KvError> {
        match self.db.fate(&self.node, false)? {
            Fate::Fail => Err(unreachable()),
            _ => Ok(()),
        }
    }
}

impl KvStore for SimKv {
    fn get(&self, key: Key<'_>) -> Result<Option<Vec<u8>>, KvError> {
        self.read_gate()?;
        self.db.kv().get(key)
    }

    fn get_many(&self, keys: &[Key<'_>]) -> Result<Vec<Option<Vec<u8>>>, KvError> {
        self.read_gate()?;
        self.db.kv().get_many(keys)
    }

    fn scan(
        &self,
        partition: &[u8],
        from: Bound<&[u8]>,
        to: Bound<&[u8]>,
        order: Order,
        visit: &mut Visitor<'_>,
    ) -> Result<(), KvError> {
        self.read_gate()?;
        self.db.kv().scan(partition, from, to, order, visit)
    }

    fn write(&self, batch: &WriteBatch) -> Result<(), WriteError> {
        self.write_through(
            || Applied::Batch(self.fence.0, batch.clone()),
            |kv| kv.write(batch),
        )
    }

    fn compare_and_swap(
        &self,
        key: Key<'_>,
        expected: Option<&[u8]>,
        new: Option<&[u8]>,
    ) -> Result<(), CasError> {
        self.write_through(
            || {
                Applied::Swap(
                    self.fence.0,
                    key.to_owned(),
                    expected.map(<[u8]>::to_vec),
                    new.map(<[u8]>::to_vec),
                )
            },
            |kv| kv.compare_and_swap(key, expected, new),
        )
    }

    fn sync(&self) -> Result<(), KvError> {
        self.read_gate()
    }
}

/// What becomes of one call of a client of the consumer side, decided by the client's own
/// random source (so that the database's own dice, and with them a seed's commands and
/// faults, are the same with or without such clients).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ClientFate {
    Normal,
    /// Fails cleanly: nothing applied.
    Fail,
    /// A write's request is lost: nothing applied, the outcome unknown to the caller.
    LoseRequest,
    /// A write is applied and its answer lost.
    LoseAnswer,
}

/// The database as a node reaches it for a client's unfenced call (consumer positions: any
/// node reads and writes them), with the fate its caller decided; the writes applied are
/// logged, so that a database going back keeps those before its point and loses the others.
pub(crate) struct ClientKv {
    pub(crate) db: Arc<Db>,
    pub(crate) node: String,
    pub(crate) fate: ClientFate,
}

impl ClientKv {
    fn gate(&self) -> Result<(), KvError> {
        if !self.db.reachable(&self.node) || self.fate == ClientFate::Fail {
            return Err(unreachable());
        }
        Ok(())
    }
}

impl KvStore for ClientKv {
    fn get(&self, key: Key<'_>) -> Result<Option<Vec<u8>>, KvError> {
        self.gate()?;
        self.db.kv().get(key)
    }

    fn get_many(&self, keys: &[Key<'_>]) -> Result<Vec<Option<Vec<u8>>>, KvError> {
        self.gate()?;
        self.db.kv().get_many(keys)
    }

    fn scan(
        &self,
        partition: &[u8],
        from: Bound<&[u8]>,
        to: Bound<&[u8]>,
        order: Order,
        visit: &mut Visitor<'_>,
    ) -> Result<(), KvError> {
        self.gate()?;
        self.db.kv().scan(partition, from, to, order, visit)
    }

    fn write(&self, _batch: &WriteBatch) -> Result<(), WriteError> {
        Err(KvError::Backend {
            message: "a client of the consumer side writes by compare-and-swap only".to_owned(),
            source: None,
        }
        .into())
    }

    fn compare_and_swap(
        &self,
        key: Key<'_>,
        expected: Option<&[u8]>,
        new: Option<&[u8]>,
    ) -> Result<(), CasError> {
        self.gate()?;
        if self.fate == ClientFate::LoseRequest {
            return Err(lost("the request was lost").into());
        }
        let kv = self.db.kv();
        let result = kv.compare_and_swap(key, expected, new);
        if result.is_ok() {
            let mut s = self.db.state();
            let now = s.now;
            s.log.push((
                now,
                Applied::Unfenced(
                    key.to_owned(),
                    expected.map(<[u8]>::to_vec),
                    new.map(<[u8]>::to_vec),
                ),
            ));
        }
        match self.fate {
            ClientFate::LoseAnswer => {
                Err(lost("the write was applied, then its answer was lost").into())
            }
            _ => result,
        }
    }

    fn sync(&self) -> Result<(), KvError> {
        self.gate()
    }
}
