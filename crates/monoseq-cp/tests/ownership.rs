//! Partition ownership in the command processor: a processor serves only the partitions it
//! acquired, hands one over cleanly, and a partition whose storage fences its writes (another
//! node took it over) stops serving it and writes nothing. The fence here is a small model of
//! the database's lease epoch (the real one is tested against PostgreSQL in `monoseq-pg` and
//! with real processes in the server's cluster tests).

use std::collections::HashSet;
use std::ops::Bound;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use monoseq_cp::{Command, CommandError, CommandProcessor, Config, Outcome};
use monoseq_kv::{
    CasError, Key, KvError, KvStore, MemoryStore, Order, Visitor, WriteBatch, WriteError,
};
use monoseq_store::{AppId, EventStore, PartitionId, TrustLevel};
use serde_json::json;

/// A view of a shared store whose writes succeed only while `lease` still holds `epoch`
/// (`None`: an unfenced view, for reads).
#[derive(Clone)]
struct Leased {
    inner: Arc<MemoryStore>,
    lease: Arc<AtomicU64>,
    epoch: Option<u64>,
}

impl Leased {
    fn check(&self) -> Result<(), KvError> {
        match self.epoch {
            Some(e) if self.lease.load(Ordering::SeqCst) != e => Err(KvError::Fenced {
                message: format!("epoch {e} was taken over"),
            }),
            _ => Ok(()),
        }
    }
}

impl KvStore for Leased {
    fn get(&self, key: Key<'_>) -> Result<Option<Vec<u8>>, KvError> {
        self.inner.get(key)
    }

    fn get_many(&self, keys: &[Key<'_>]) -> Result<Vec<Option<Vec<u8>>>, KvError> {
        self.inner.get_many(keys)
    }

    fn scan(
        &self,
        partition: &[u8],
        from: Bound<&[u8]>,
        to: Bound<&[u8]>,
        order: Order,
        visit: &mut Visitor<'_>,
    ) -> Result<(), KvError> {
        self.inner.scan(partition, from, to, order, visit)
    }

    fn write(&self, batch: &WriteBatch) -> Result<(), WriteError> {
        self.check().map_err(WriteError::Storage)?;
        self.inner.write(batch)
    }

    fn compare_and_swap(
        &self,
        key: Key<'_>,
        expected: Option<&[u8]>,
        new: Option<&[u8]>,
    ) -> Result<(), CasError> {
        self.check().map_err(CasError::Storage)?;
        self.inner.compare_and_swap(key, expected, new)
    }

    fn sync(&self) -> Result<(), KvError> {
        self.inner.sync()
    }
}

struct Shared {
    kv: Arc<MemoryStore>,
    lease: Arc<AtomicU64>,
}

impl Shared {
    fn new() -> Shared {
        Shared {
            kv: Arc::new(MemoryStore::new()),
            lease: Arc::new(AtomicU64::new(0)),
        }
    }

    /// The event store through a view fenced at `epoch` (`None`: unfenced). Trust level 2
    /// writes with plain puts, so only the fence keeps an old owner from overwriting events.
    fn store(&self, epoch: Option<u64>) -> EventStore<Leased> {
        let view = Leased {
            inner: Arc::clone(&self.kv),
            lease: Arc::clone(&self.lease),
            epoch,
        };
        EventStore::new(view, AppId(1), TrustLevel::Level2)
    }

    /// A new owner takes the lease over: the next epoch.
    fn take_over(&self) -> u64 {
        self.lease.fetch_add(1, Ordering::SeqCst) + 1
    }

    fn node(&self) -> CommandProcessor<Leased> {
        let config = Config {
            partitions: 2,
            flush_delay: Duration::from_millis(5),
            ..Config::default()
        };
        CommandProcessor::start_unowned(self.store(None), config).expect("start")
    }
}

fn order(ws: u64, n: u64) -> Command {
    serde_json::from_value(json!({
        "ws": ws, "ws_kind": 1, "command": "own.Create",
        "create": [{"raw_id": 1, "kind": "CDoc", "name": "own.Doc", "fields": {"n": n}}],
    }))
    .expect("command")
}

/// Submits until the partition answers (it answers busy while it actualizes).
async fn submit(cp: &CommandProcessor<Leased>, cmd: Command) -> Result<Outcome, CommandError> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match cp.submit(cmd.clone()).await {
            Err(CommandError::Busy(_)) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            other => return other,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_processor_serves_only_the_partitions_it_acquired() {
    let shared = Shared::new();
    let cp = shared.node();
    let e = submit(&cp, order(2, 1)).await.unwrap_err();
    assert!(matches!(e, CommandError::NotOwner { partition: 0 }), "{e}");
    assert!(matches!(e, CommandError::NotOwner { .. }));
    assert!(cp.owned().is_empty());

    cp.acquire(0, shared.store(Some(0))).expect("acquire");
    assert_eq!(cp.owned(), vec![0]);
    let first = submit(&cp, order(2, 1)).await.expect("served");
    assert_eq!((first.partition, first.plog_offset), (0, 1));
    let other = submit(&cp, order(3, 1)).await.unwrap_err();
    assert!(matches!(other, CommandError::NotOwner { partition: 1 }));

    assert!(
        cp.release(0, Duration::from_secs(10)).await,
        "stopped in time"
    );
    assert!(cp.owned().is_empty());
    let after = submit(&cp, order(2, 2)).await.unwrap_err();
    assert!(matches!(after, CommandError::NotOwner { partition: 0 }));

    // Acquired again, it continues after what it wrote before.
    cp.acquire(0, shared.store(Some(0))).expect("acquire again");
    let next = submit(&cp, order(2, 3)).await.expect("served again");
    assert_eq!((next.plog_offset, next.wlog_offset), (2, 2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_handed_over_continues_on_its_new_owner_without_reissuing_numbers() {
    let shared = Shared::new();
    let (a, b) = (shared.node(), shared.node());
    a.acquire(0, shared.store(Some(0))).expect("a acquires");
    let mut seen = HashSet::new();
    for n in 0..20 {
        let out = submit(&a, order(2 * (n % 3) + 2, n))
            .await
            .expect("a serves");
        assert!(seen.insert(out.plog_offset));
    }
    assert!(a.release(0, Duration::from_secs(10)).await);
    let epoch = shared.take_over();
    b.acquire(0, shared.store(Some(epoch))).expect("b acquires");
    for n in 0..20 {
        let out = submit(&b, order(2 * (n % 3) + 2, n))
            .await
            .expect("b serves");
        assert!(
            seen.insert(out.plog_offset),
            "PLog offset {} reissued",
            out.plog_offset
        );
    }
    assert_eq!(seen.len(), 40);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_owner_whose_writes_are_fenced_stops_serving_and_overwrites_nothing() {
    let shared = Shared::new();
    let (a, b) = (shared.node(), shared.node());
    a.acquire(0, shared.store(Some(0))).expect("a acquires");
    for n in 0..5 {
        submit(&a, order(2, n)).await.expect("a serves");
    }
    // B takes the partition over while A still believes it owns it (a paused node).
    let epoch = shared.take_over();
    b.acquire(0, shared.store(Some(epoch))).expect("b acquires");
    let mut acked = Vec::new();
    for n in 0..5 {
        acked.push(submit(&b, order(4, 100 + n)).await.expect("b serves"));
    }
    let before: Vec<_> = acked
        .iter()
        .map(|o| {
            b.store()
                .read_event(PartitionId(0), monoseq_core::PLogOffset(o.plog_offset))
                .expect("read")
                .expect("acknowledged event")
        })
        .collect();

    // A wakes up and writes: refused by the fence, answered "not the owner".
    let e = submit(&a, order(2, 99)).await.unwrap_err();
    assert!(matches!(e, CommandError::NotOwner { partition: 0 }), "{e}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while a.fenced().is_empty() {
        assert!(
            Instant::now() < deadline,
            "A never noticed it lost the partition"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(a.fenced(), vec![0]);
    let again = submit(&a, order(2, 98)).await.unwrap_err();
    assert!(matches!(again, CommandError::NotOwner { partition: 0 }));
    assert!(a.release(0, Duration::from_secs(10)).await);

    for (o, e) in acked.iter().zip(&before) {
        let now = b
            .store()
            .read_event(PartitionId(0), monoseq_core::PLogOffset(o.plog_offset))
            .expect("read")
            .expect("still there");
        assert_eq!(&now, e, "B's acknowledged event is unchanged");
    }
    let next = submit(&b, order(4, 200)).await.expect("b still serves");
    assert_eq!(next.plog_offset, acked[4].plog_offset + 1);
}

/// A primary and an asynchronous standby: writes reach the standby only while `replicating`;
/// after `failed_over` every call goes to the standby (a promoted standby that was behind).
#[derive(Default)]
struct Replicated {
    primary: MemoryStore,
    standby: MemoryStore,
    replicating: std::sync::atomic::AtomicBool,
    failed_over: std::sync::atomic::AtomicBool,
}

impl Replicated {
    fn serving(&self) -> &MemoryStore {
        if self.failed_over.load(Ordering::SeqCst) {
            &self.standby
        } else {
            &self.primary
        }
    }
}

impl KvStore for Replicated {
    fn get(&self, key: Key<'_>) -> Result<Option<Vec<u8>>, KvError> {
        self.serving().get(key)
    }

    fn get_many(&self, keys: &[Key<'_>]) -> Result<Vec<Option<Vec<u8>>>, KvError> {
        self.serving().get_many(keys)
    }

    fn scan(
        &self,
        partition: &[u8],
        from: Bound<&[u8]>,
        to: Bound<&[u8]>,
        order: Order,
        visit: &mut Visitor<'_>,
    ) -> Result<(), KvError> {
        self.serving().scan(partition, from, to, order, visit)
    }

    fn write(&self, batch: &WriteBatch) -> Result<(), WriteError> {
        self.serving().write(batch)?;
        if self.replicating.load(Ordering::SeqCst) && !self.failed_over.load(Ordering::SeqCst) {
            self.standby.write(batch)?;
        }
        Ok(())
    }

    fn compare_and_swap(
        &self,
        key: Key<'_>,
        expected: Option<&[u8]>,
        new: Option<&[u8]>,
    ) -> Result<(), CasError> {
        self.serving().compare_and_swap(key, expected, new)?;
        if self.replicating.load(Ordering::SeqCst) && !self.failed_over.load(Ordering::SeqCst) {
            let _ = self.standby.compare_and_swap(key, expected, new);
        }
        Ok(())
    }

    fn sync(&self) -> Result<(), KvError> {
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_whose_storage_lost_acknowledged_events_refuses_to_hand_their_numbers_out_again()
 {
    let kv = Arc::new(Replicated::default());
    kv.replicating.store(true, Ordering::SeqCst);
    let store = EventStore::new(Arc::clone(&kv), AppId(1), TrustLevel::Level0);
    let config = Config {
        partitions: 1,
        flush_delay: Duration::from_millis(5),
        ..Config::default()
    };
    let cp = CommandProcessor::start_unowned(store.clone(), config).expect("start");
    cp.acquire(0, store.clone()).expect("acquire");
    let busy_retry = |cp: CommandProcessor<Arc<Replicated>>, cmd: Command| async move {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            match cp.submit(cmd.clone()).await {
                Err(CommandError::Busy(_)) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                other => return other,
            }
        }
    };
    for n in 0..5 {
        busy_retry(cp.clone(), order(1, n))
            .await
            .expect("replicated");
    }
    // The standby falls behind: these are acknowledged on the primary only.
    kv.replicating.store(false, Ordering::SeqCst);
    let mut last = 0;
    for n in 5..8 {
        last = busy_retry(cp.clone(), order(1, n))
            .await
            .expect("acknowledged")
            .plog_offset;
    }
    assert_eq!(last, 8);
    // The partition stops (its lease could not be renewed while the primary was lost), the
    // standby is promoted, the partition starts again and reads its PLog there.
    assert!(cp.release(0, Duration::from_secs(10)).await);
    kv.failed_over.store(true, Ordering::SeqCst);
    cp.acquire(0, store.clone()).expect("acquire again");
    let e = busy_retry(cp.clone(), order(1, 99)).await.unwrap_err();
    assert!(matches!(e, CommandError::Corrupted(_)), "{e}");
    assert!(e.to_string().contains("up to 8"), "{e}");
    let again = busy_retry(cp.clone(), order(1, 98)).await.unwrap_err();
    assert!(matches!(again, CommandError::Corrupted(_)), "{again}");
    assert!(
        cp.unready()
            .iter()
            .any(|(p, why)| *p == 0 && why.contains("lost")),
        "{:?}",
        cp.unready()
    );
}

/// Sets field `name` of record `id` of workspace 2 to `n`.
fn set(id: u64, name: &str, n: u64) -> Command {
    serde_json::from_value(json!({
        "ws": 2, "ws_kind": 1, "command": "own.Set",
        "update": [{"id": id, "fields": {name: n}}],
    }))
    .expect("command")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_acquired_again_updates_what_the_other_owner_stored_not_what_it_wrote() {
    let shared = Shared::new();
    let (a, b) = (shared.node(), shared.node());
    a.acquire(0, shared.store(Some(0))).expect("a acquires");
    let id = submit(&a, order(2, 1)).await.expect("a serves").ids[&1];
    submit(&a, set(id, "a", 1)).await.expect("a updates");
    assert!(a.release(0, Duration::from_secs(10)).await);

    let epoch = shared.take_over();
    b.acquire(0, shared.store(Some(epoch))).expect("b acquires");
    submit(&b, set(id, "b", 2)).await.expect("b updates");
    assert!(b.release(0, Duration::from_secs(10)).await);

    let epoch = shared.take_over();
    a.acquire(0, shared.store(Some(epoch)))
        .expect("a acquires again");
    submit(&a, set(id, "a", 3)).await.expect("a updates again");
    let stored = shared
        .store(None)
        .read_record(monoseq_core::WsId(2), monoseq_store::RecordId(id))
        .expect("read")
        .expect("the record");
    let field = |name: &str| {
        let f = stored.fields.iter().find(|f| f.name == name);
        f.map(|f| f.value.clone())
    };
    assert_eq!(
        field("b"),
        Some(b"2".to_vec()),
        "b's update was lost: {stored:?}"
    );
    assert_eq!(field("a"), Some(b"3".to_vec()));
}
