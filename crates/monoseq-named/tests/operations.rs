//! Named sequences on the key-value backends (in memory, fjall, redb): the behaviour suite, and the
//! behaviours that need control over timing — a writer stalled between its read and its conditional
//! write (the failure of the reference design's lock-with-TTL design), timeouts under endless
//! contention, storage faults, restart of a durable store, and the reservation mode.

#[macro_use]
mod support {
    pub mod stores;
    pub mod suite;
}

use std::collections::BTreeSet;
use std::num::NonZeroU64;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use monoseq_kv::{FjallStore, MemoryStore, Options};
use monoseq_named::{
    Address, Backend, BoxFuture, ConditionalWrite, KvBackend, LANE_CALLS_MAX, NextError,
    NextOptions, Object, ReserveOptions, Reserver, Sequences, StorageError, Version, WriteFailure,
};
use support::stores::{Shared, fjall, memory, redb};
use tokio::sync::{Notify, Semaphore};

backend_suite!(on_memory, memory());
backend_suite!(on_fjall, fjall());
backend_suite!(on_redb, redb());

fn address(text: &str) -> Address {
    text.parse().unwrap()
}

/// A backend whose writes can be held at a gate (a caller stalled between its read and its
/// conditional write) and that counts reads, writes and refused writes.
struct Stalling {
    inner: Shared,
    armed: AtomicBool,
    gate: Semaphore,
    holding: Notify,
    conflicts: AtomicU32,
    loads: AtomicU32,
    writes: AtomicU32,
}

impl Stalling {
    fn new(inner: Shared) -> Arc<Stalling> {
        Arc::new(Stalling {
            inner,
            armed: AtomicBool::new(false),
            gate: Semaphore::new(0),
            holding: Notify::new(),
            conflicts: AtomicU32::new(0),
            loads: AtomicU32::new(0),
            writes: AtomicU32::new(0),
        })
    }

    async fn hold_if_armed(&self) {
        if self.armed.swap(false, Ordering::SeqCst) {
            self.holding.notify_one();
            self.gate.acquire().await.unwrap().forget();
        }
    }

    fn count(&self, result: Result<Version, WriteFailure>) -> Result<Version, WriteFailure> {
        self.writes.fetch_add(1, Ordering::SeqCst);
        if matches!(result, Err(WriteFailure::Conflict)) {
            self.conflicts.fetch_add(1, Ordering::SeqCst);
        }
        result
    }
}

impl Backend for Stalling {
    fn load<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<Object>, StorageError>> {
        self.loads.fetch_add(1, Ordering::SeqCst);
        self.inner.load(key)
    }
    fn create<'a>(
        &'a self,
        key: &'a str,
        bytes: Vec<u8>,
    ) -> BoxFuture<'a, Result<Version, WriteFailure>> {
        Box::pin(async move {
            self.hold_if_armed().await;
            self.count(self.inner.create(key, bytes).await)
        })
    }
    fn replace<'a>(
        &'a self,
        key: &'a str,
        expected: &'a Version,
        bytes: Vec<u8>,
    ) -> BoxFuture<'a, Result<Version, WriteFailure>> {
        Box::pin(async move {
            self.hold_if_armed().await;
            self.count(self.inner.replace(key, expected, bytes).await)
        })
    }
    fn remove<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<(), StorageError>> {
        self.inner.remove(key)
    }
}

/// Concurrent callers of one sequence queue while a write is in flight, then one durable
/// conditional write serves them all, each with its own number; the batch after a successful
/// write writes on what it wrote, without reading first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_calls_share_one_durable_write_and_each_gets_its_own_number() {
    const CALLERS: usize = 200;
    let stalling = Stalling::new(fjall());
    let sequences = Sequences::new(Arc::clone(&stalling));
    let a = address("orders/id");
    let call = |sequences: &Sequences| {
        let (sequences, a) = (sequences.clone(), a.clone());
        tokio::spawn(async move { sequences.next(&a, &NextOptions::new()).await })
    };

    stalling.armed.store(true, Ordering::SeqCst);
    let first = call(&sequences);
    stalling.holding.notified().await;
    let queued: Vec<_> = (0..CALLERS).map(|_| call(&sequences)).collect();
    while sequences.waiting_calls(&a) < CALLERS {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    stalling.gate.add_permits(1);

    let mut handed = BTreeSet::from([first.await.unwrap().unwrap()]);
    for caller in queued {
        let value = caller.await.unwrap().unwrap();
        assert!(handed.insert(value), "{value} handed out twice");
    }
    let expected: BTreeSet<u64> = (1..=CALLERS as u64 + 1).collect();
    assert_eq!(handed, expected);
    assert_eq!(
        stalling.writes.load(Ordering::SeqCst),
        2,
        "one write per batch"
    );
    assert_eq!(
        stalling.loads.load(Ordering::SeqCst),
        1,
        "one read, before the first"
    );
    assert_eq!(sequences.get(&a).await.unwrap(), Some(CALLERS as u64 + 2));
}

/// Seed 003's failure: a lock holder stalls past the lock's TTL, another process takes the
/// lock, both write, both hand out the same number. Here the stalled caller's conditional
/// write is refused, it reads again and hands out a fresh number.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_writer_cannot_hand_out_a_number_twice() {
    let store = Arc::new(MemoryStore::new());
    let stalling = Stalling::new(Arc::new(KvBackend::shared(Arc::clone(&store))));
    let stalled = Sequences::new(Arc::clone(&stalling));
    let other = Sequences::new(KvBackend::shared(store));
    let a = address("orders/id");
    assert_eq!(other.next(&a, &NextOptions::new()).await.unwrap(), 1);

    stalling.armed.store(true, Ordering::SeqCst);
    let slow = {
        let a = a.clone();
        tokio::spawn(async move { stalled.next(&a, &NextOptions::new()).await })
    };
    // The stalled caller has read value 2 and waits before writing 3.
    stalling.holding.notified().await;
    let mut handed = BTreeSet::from([1]);
    for expected in 2..=101 {
        let value = other.next(&a, &NextOptions::new()).await.unwrap();
        assert_eq!(value, expected);
        handed.insert(value);
    }
    stalling.gate.add_permits(1);
    let late = slow.await.unwrap().unwrap();
    assert!(handed.insert(late), "{late} handed out twice");
    assert_eq!(late, 102, "the stalled caller read again");
    assert_eq!(
        stalling.conflicts.load(Ordering::SeqCst),
        1,
        "its stale write was refused"
    );
    assert_eq!(other.next(&a, &NextOptions::new()).await.unwrap(), 103);
}

/// Stalled between its read and its write for longer than its timeout: the sequence is not
/// stuck for anyone else meanwhile, and the stalled caller waits for its write's outcome
/// rather than answering busy while the write may still land. Its write, on a stale read, is
/// refused; its time is up, so it answers busy, and nothing it tried was written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_stalled_past_its_timeout_blocks_no_one_and_answers_busy_only_once_refused() {
    let store = Arc::new(MemoryStore::new());
    let stalling = Stalling::new(Arc::new(KvBackend::shared(Arc::clone(&store))));
    let stalled = Sequences::new(Arc::clone(&stalling));
    let other = Sequences::new(KvBackend::shared(store));
    let a = address("orders/id");
    other.next(&a, &NextOptions::new()).await.unwrap();

    stalling.armed.store(true, Ordering::SeqCst);
    let slow = {
        let a = a.clone();
        let options = NextOptions::new().timeout(Duration::from_millis(100));
        tokio::spawn(async move { stalled.next(&a, &options).await })
    };
    stalling.holding.notified().await;
    // Others are served while the stalled write is still held (it is let go only below):
    // blocked, they would wait for it past this generous bound.
    let mut handed = BTreeSet::from([1]);
    let others = async {
        for _ in 0..20 {
            handed.insert(other.next(&a, &NextOptions::new()).await.unwrap());
        }
    };
    tokio::time::timeout(Duration::from_secs(30), others)
        .await
        .expect("others were not blocked");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !slow.is_finished(),
        "the caller answered while its write was still held"
    );
    stalling.gate.add_permits(1);
    let answer = slow.await.unwrap();
    assert!(
        matches!(answer, Err(NextError::Busy { .. })),
        "its write was refused and its time had run out: {answer:?}"
    );
    assert_eq!(stalling.conflicts.load(Ordering::SeqCst), 1);
    assert_eq!(handed, (1..=21).collect());
    assert_eq!(other.next(&a, &NextOptions::new()).await.unwrap(), 22);
}

/// A backend on which every conditional write loses, or every call fails.
struct Hostile {
    fail: bool,
    writes: AtomicU32,
}

impl Backend for Hostile {
    fn load<'a>(&'a self, _: &'a str) -> BoxFuture<'a, Result<Option<Object>, StorageError>> {
        Box::pin(async move {
            if self.fail {
                return Err(StorageError::message("reading", "disk on fire"));
            }
            Ok(None)
        })
    }
    fn create<'a>(
        &'a self,
        _: &'a str,
        _: Vec<u8>,
    ) -> BoxFuture<'a, Result<Version, WriteFailure>> {
        self.writes.fetch_add(1, Ordering::SeqCst);
        Box::pin(async { Err(WriteFailure::Conflict) })
    }
    fn replace<'a>(
        &'a self,
        _: &'a str,
        _: &'a Version,
        _: Vec<u8>,
    ) -> BoxFuture<'a, Result<Version, WriteFailure>> {
        self.writes.fetch_add(1, Ordering::SeqCst);
        Box::pin(async { Err(WriteFailure::Conflict) })
    }
    fn remove<'a>(&'a self, _: &'a str) -> BoxFuture<'a, Result<(), StorageError>> {
        Box::pin(async { Ok(()) })
    }
}

/// In simulated time (the backend answers at once, so only the backoff's sleeps pass time): the
/// call ends exactly at its timeout, not before and not a backoff step after.
#[tokio::test(start_paused = true)]
async fn endless_contention_ends_busy_at_the_timeout_after_backing_off() {
    let hostile = Arc::new(Hostile {
        fail: false,
        writes: AtomicU32::new(0),
    });
    let s = Sequences::new(Arc::clone(&hostile));
    let started = tokio::time::Instant::now();
    let options = NextOptions::new().timeout(Duration::from_millis(300));
    let error = s.next(&address("x"), &options).await.unwrap_err();
    let waited = started.elapsed();
    assert!(matches!(error, NextError::Busy { .. }), "{error}");
    assert!(error.to_string().contains("busy"), "{error}");
    assert_eq!(waited, Duration::from_millis(300), "ends at its timeout");
    let writes = hostile.writes.load(Ordering::SeqCst);
    // Jittered exponential backoff: a handful of attempts, not a spin.
    assert!((3..60).contains(&writes), "{writes} attempts in {waited:?}");
}

#[tokio::test]
async fn storage_faults_are_errors_not_retries() {
    let s = Sequences::new(Hostile {
        fail: true,
        writes: AtomicU32::new(0),
    });
    let error = s
        .next(&address("x"), &NextOptions::new())
        .await
        .unwrap_err();
    assert!(matches!(error, NextError::Storage(_)), "{error}");
    assert!(error.to_string().contains("disk on fire"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn numbers_survive_a_restart_of_the_embedded_store() {
    let dir = tempfile::tempdir().unwrap();
    let a = address("orders/id");
    for round in 0..3u64 {
        let store = FjallStore::open(dir.path(), Options::default()).unwrap();
        let s = Sequences::new(KvBackend::new(store));
        for i in 0..10 {
            assert_eq!(
                s.next(&a, &NextOptions::new()).await.unwrap(),
                round * 10 + i + 1
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reservers_hand_out_unique_numbers_and_hold_at_most_one_block() {
    let s = Sequences::new(KvBackend::new(MemoryStore::new()));
    let a = address("orders/reserved");
    let block = NonZeroU64::new(100).unwrap();
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let reserver = Reserver::new(s.clone(), a.clone(), ReserveOptions::new(block));
        tasks.push(tokio::spawn(async move {
            let mut got = Vec::new();
            for _ in 0..1000 {
                got.push(reserver.next().await.unwrap());
                assert!(reserver.held() <= 100);
            }
            // Let a prefetch in flight land, then check the bound again.
            tokio::time::sleep(Duration::from_millis(20)).await;
            assert!(reserver.held() <= 100);
            got
        }));
    }
    let mut all = BTreeSet::new();
    for task in tasks {
        let got = task.await.unwrap();
        assert!(
            got.windows(2).all(|w| w[0] < w[1]),
            "increasing per reserver"
        );
        for value in got {
            assert!(all.insert(value), "{value} handed out twice");
        }
    }
    // Each reserver took whole segments of 50; at most one block each is unused.
    let stored = s.get(&a).await.unwrap().unwrap();
    assert!(
        (4000..=4000 + 4 * 100).contains(&(stored - 1)),
        "stored {stored}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reserver_prefetches_the_next_segment_before_the_current_runs_out() {
    let s = Sequences::new(KvBackend::new(MemoryStore::new()));
    let a = address("orders/prefetched");
    let reserver = Reserver::new(
        s.clone(),
        a.clone(),
        ReserveOptions::new(NonZeroU64::new(200).unwrap()),
    );
    assert_eq!(reserver.next().await.unwrap(), 1);
    assert_eq!(s.get(&a).await.unwrap(), Some(101), "one segment of 100");
    for expected in 2..=10 {
        assert_eq!(reserver.next().await.unwrap(), expected);
    }
    // A tenth used: the next segment is fetched in the background.
    let deadline = Instant::now() + Duration::from_secs(5);
    while reserver.held() != 190 {
        assert!(Instant::now() < deadline, "no prefetch");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert_eq!(s.get(&a).await.unwrap(), Some(201));
    for expected in 11..=300 {
        assert_eq!(reserver.next().await.unwrap(), expected);
    }
}

#[tokio::test]
async fn a_reserver_reports_a_failed_fetch_and_recovers() {
    let store = Arc::new(MemoryStore::new());
    let s = Sequences::new(KvBackend::shared(Arc::clone(&store)));
    let a = address("orders/failing");
    s.reset(&a, monoseq_named::VALUE_MAX - 5, &Default::default())
        .await
        .unwrap();
    let reserver = Reserver::new(
        s.clone(),
        a.clone(),
        ReserveOptions::new(NonZeroU64::new(20).unwrap()),
    );
    let error = reserver.next().await.unwrap_err();
    assert!(matches!(error, NextError::Overflow { .. }), "{error}");
    s.reset(&a, 1, &Default::default()).await.unwrap();
    assert_eq!(reserver.next().await.unwrap(), 1);
}

/// A backend whose reads take a while.
struct Slow(Shared);

impl Backend for Slow {
    fn load<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<Object>, StorageError>> {
        Box::pin(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            self.0.load(key).await
        })
    }
    fn create<'a>(
        &'a self,
        key: &'a str,
        bytes: Vec<u8>,
    ) -> BoxFuture<'a, Result<Version, WriteFailure>> {
        self.0.create(key, bytes)
    }
    fn replace<'a>(
        &'a self,
        key: &'a str,
        expected: &'a Version,
        bytes: Vec<u8>,
    ) -> BoxFuture<'a, Result<Version, WriteFailure>> {
        self.0.replace(key, expected, bytes)
    }
    fn remove<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<(), StorageError>> {
        self.0.remove(key)
    }
}

/// A `Sequences` outlives runtimes (a CLI may make one per command): a writer task cancelled
/// mid-operation by its runtime's shutdown does not leave the sequence queued behind it.
#[test]
fn a_sequence_keeps_working_after_its_runtime_stopped_mid_operation() {
    let s = Sequences::new(Slow(memory()));
    let a = address("orders/id");
    let runtime = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    };
    let abandoned = runtime().block_on(async {
        tokio::time::timeout(Duration::from_millis(10), s.next(&a, &NextOptions::new())).await
    });
    assert!(abandoned.is_err(), "the first call was abandoned mid-read");
    let value = runtime().block_on(async {
        tokio::time::timeout(Duration::from_secs(5), s.next(&a, &NextOptions::new())).await
    });
    assert_eq!(value.expect("no hang").unwrap(), 1);
}

/// While a sequence's writer is stalled, calls of this process queue in its lane up to
/// `LANE_CALLS_MAX`; the next one answers busy at once (a typed error, `NextError::LaneFull`), and the
/// queued ones are all served, each with its own number, once the writer moves on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_past_the_lane_bound_answer_busy_at_once_and_the_queued_ones_are_served() {
    let store = Arc::new(MemoryStore::new());
    let stalling = Stalling::new(Arc::new(KvBackend::shared(store)));
    let seqs = Sequences::new(Arc::clone(&stalling));
    let a = address("orders/id");
    let options = NextOptions::new().timeout(Duration::from_secs(120));
    stalling.armed.store(true, Ordering::SeqCst);
    let spawn = |seqs: &Sequences| {
        let (seqs, a, options) = (seqs.clone(), a.clone(), options.clone());
        tokio::spawn(async move { seqs.next(&a, &options).await })
    };
    // The lane's leader takes the first call and stalls in its write.
    let mut calls = vec![spawn(&seqs)];
    stalling.holding.notified().await;
    calls.extend((0..LANE_CALLS_MAX).map(|_| spawn(&seqs)));
    let deadline = Instant::now() + Duration::from_secs(60);
    while seqs.waiting_calls(&a) < LANE_CALLS_MAX {
        assert!(Instant::now() < deadline, "the calls never queued");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    // Not queued: a queued call would wait for the stalled writer, let go only below.
    let error = tokio::time::timeout(Duration::from_secs(30), seqs.next(&a, &options))
        .await
        .expect("a call past the bound is answered at once, not queued")
        .unwrap_err();
    assert!(
        matches!(
            error,
            NextError::LaneFull { waiting, max, .. } if waiting == LANE_CALLS_MAX && max == LANE_CALLS_MAX
        ),
        "{error}"
    );
    assert!(error.to_string().contains("retry later"), "{error}");
    assert_eq!(seqs.waiting_calls(&a), LANE_CALLS_MAX, "nothing was queued");
    stalling.gate.add_permits(1);
    let mut handed = BTreeSet::new();
    for call in calls {
        let n = call.await.unwrap().unwrap();
        assert!(handed.insert(n), "{n} handed out twice");
    }
    assert_eq!(handed, (1..=LANE_CALLS_MAX as u64 + 1).collect());
    assert_eq!(seqs.waiting_calls(&a), 0);
}

#[tokio::test]
async fn a_write_whose_answer_was_lost_never_hands_its_number_out_twice() {
    use monoseq_kv::FaultyStore;
    let store = Arc::new(FaultyStore::new(MemoryStore::new()));
    let s = Sequences::new(KvBackend::shared(Arc::clone(&store)));
    let a = address("lost/answers");
    // The create lands but its answer is lost: a gap, the number comes from the next write.
    store.lose_answers_next(1);
    let first = s.next(&a, &NextOptions::new()).await.expect("first");
    // A create whose request is lost: read back, absent, created again.
    let b = address("lost/requests");
    store.lose_requests_next(1);
    assert_eq!(s.next(&b, &NextOptions::new()).await.expect("created"), 1);
    let mut seen = BTreeSet::from([first]);
    for n in 0..20 {
        match n % 3 {
            0 => store.lose_answers_next(1),
            1 => store.lose_requests_next(1),
            _ => {}
        }
        let got = s.next(&a, &NextOptions::new()).await.expect("next");
        assert!(seen.insert(got), "{got} handed out twice");
        assert!(got > *seen.range(..got).next_back().unwrap_or(&0));
    }
    let stored = s.get(&a).await.expect("get").expect("exists");
    assert!(
        stored > *seen.last().unwrap(),
        "the stored value is above every number handed out"
    );
}

/// A create whose request was lost while another process created the sequence with the very
/// same bytes (the same first value in the same millisecond) is refused, through `create` and
/// through `write_each`: found bytes equal to its own do not prove that it wrote them, and
/// claiming them would hand the other process's numbers out a second time.
#[tokio::test]
async fn a_lost_create_never_claims_the_same_bytes_written_by_another_process() {
    use monoseq_kv::{FaultyStore, Key, KvStore};
    let store = Arc::new(FaultyStore::new(MemoryStore::new()));
    let backend = KvBackend::shared(Arc::clone(&store));
    for (n, key) in [
        "resource=lost/sequence=a/value",
        "resource=lost/sequence=b/value",
    ]
    .into_iter()
    .enumerate()
    {
        let bytes = b"the same first state".to_vec();
        let mut partition = vec![monoseq_named::KV_TAG];
        partition.extend_from_slice(key.as_bytes());
        store
            .inner()
            .put(Key::new(&partition, b""), &bytes)
            .expect("the other process's create");
        store.lose_requests_next(1);
        let answer = match n {
            0 => backend.create(key, bytes).await,
            _ => {
                let write = ConditionalWrite {
                    key: key.to_owned(),
                    expected: None,
                    bytes,
                };
                backend.write_each(vec![write]).await.remove(0)
            }
        };
        assert!(
            matches!(answer, Err(WriteFailure::Conflict)),
            "{key}: {answer:?}"
        );
    }
}
