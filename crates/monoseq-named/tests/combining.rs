//! The combining of the ready writes of different sequences into one durable write: calls on
//! many sequences are served by fewer storage writes than sequences, each caller still gets
//! its own number, and a stale state on one sequence of a combined write fails only that
//! sequence, which reads again and retries alone. Each test first holds
//! `DURABLE_WRITES_IN_FLIGHT` calls at a gate, so that the writes handed over next wait and go
//! out together.
//!
//! The tests run on one thread (`#[tokio::test]`), so that a few yields let every task spawned
//! so far reach the point where it waits for storage.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use monoseq_kv::MemoryStore;
use monoseq_named::{
    Address, Backend, BoxFuture, ConditionalWrite, DURABLE_WRITES_IN_FLIGHT, KvBackend,
    NextOptions, Object, Sequences, StorageError, Version, WriteFailure,
};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;

/// One `write_each` call as the backend answered it: each key with whether it was written.
type Call = Vec<(String, bool)>;

/// A key-value backend that records its `write_each` calls (each one durable write) and can
/// hold the next calls at a gate.
struct Recording {
    inner: KvBackend<Arc<MemoryStore>>,
    /// How many of the next calls to hold.
    to_hold: AtomicUsize,
    held: AtomicUsize,
    gate: Semaphore,
    loads: AtomicU32,
    calls: Mutex<Vec<Call>>,
}

impl Recording {
    fn new(store: &Arc<MemoryStore>) -> Arc<Recording> {
        Arc::new(Recording {
            inner: KvBackend::new(Arc::clone(store)),
            to_hold: AtomicUsize::new(0),
            held: AtomicUsize::new(0),
            gate: Semaphore::new(0),
            loads: AtomicU32::new(0),
            calls: Mutex::new(Vec::new()),
        })
    }

    /// The calls made so far.
    fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }

    /// Starts a call on each of `DURABLE_WRITES_IN_FLIGHT` plug sequences and waits until all
    /// their writes are held at the gate: the writes handed over from now on wait for a call.
    async fn hold_the_calls(self: &Arc<Self>, sequences: &Sequences) -> Vec<Caller> {
        self.to_hold
            .store(DURABLE_WRITES_IN_FLIGHT, Ordering::SeqCst);
        let plugs = (0..DURABLE_WRITES_IN_FLIGHT)
            .map(|i| call(sequences, &format!("orders/plug{i}")))
            .collect();
        settle_until("the plugs' writes to reach write_each", || {
            self.held.load(Ordering::SeqCst) >= DURABLE_WRITES_IN_FLIGHT
        })
        .await;
        plugs
    }

    fn release(&self) {
        self.gate.add_permits(DURABLE_WRITES_IN_FLIGHT);
    }

    /// Whether to hold this call.
    fn take_hold(&self) -> bool {
        self.to_hold
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
    }
}

impl Backend for Recording {
    fn load<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<Object>, StorageError>> {
        Box::pin(async move {
            let loaded = self.inner.load(key).await;
            self.loads.fetch_add(1, Ordering::SeqCst);
            loaded
        })
    }
    fn create<'a>(
        &'a self,
        key: &'a str,
        bytes: Vec<u8>,
    ) -> BoxFuture<'a, Result<Version, WriteFailure>> {
        self.inner.create(key, bytes)
    }
    fn replace<'a>(
        &'a self,
        key: &'a str,
        expected: &'a Version,
        bytes: Vec<u8>,
    ) -> BoxFuture<'a, Result<Version, WriteFailure>> {
        self.inner.replace(key, expected, bytes)
    }
    fn remove<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<(), StorageError>> {
        self.inner.remove(key)
    }
    fn write_each(
        &self,
        writes: Vec<ConditionalWrite>,
    ) -> BoxFuture<'_, Vec<Result<Version, WriteFailure>>> {
        Box::pin(async move {
            if self.take_hold() {
                self.held.fetch_add(1, Ordering::SeqCst);
                self.gate.acquire().await.unwrap().forget();
            }
            let keys: Vec<String> = writes.iter().map(|w| w.key.clone()).collect();
            let answers = self.inner.write_each(writes).await;
            let call = keys
                .into_iter()
                .zip(&answers)
                .map(|(key, answer)| (key, answer.is_ok()))
                .collect();
            self.calls.lock().unwrap().push(call);
            answers
        })
    }
    /// The key-value backend's own answer: these tests fail if it stops combining.
    fn combines(&self) -> bool {
        self.inner.combines()
    }
}

type Caller = JoinHandle<u64>;

fn address(text: &str) -> Address {
    text.parse().unwrap()
}

/// A `next` on `sequence` in a task of its own.
fn call(sequences: &Sequences, sequence: &str) -> Caller {
    let (sequences, a) = (sequences.clone(), address(sequence));
    tokio::spawn(async move { sequences.next(&a, &NextOptions::new()).await.unwrap() })
}

/// Lets every task spawned so far run until it waits.
async fn settle() {
    for _ in 0..64 {
        tokio::task::yield_now().await;
    }
}

/// Settles until `done`; panics naming `what` if it does not happen within 10 s (the writes
/// went elsewhere than to `write_each`, or were never handed over).
async fn settle_until(what: &str, done: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    while !done() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "waited 10 s for {what}: does the backend still combine?"
        );
        settle().await;
    }
}

/// 16 sequences with 8 calls each, handed over while a call is in flight: the next call
/// carries the writes of all 16, and each caller gets its own number, gapless per sequence.
#[tokio::test]
async fn calls_on_many_sequences_are_served_by_fewer_durable_writes_than_sequences() {
    const SEQUENCES: usize = 16;
    const CALLS: u64 = 8;
    let recording = Recording::new(&Arc::new(MemoryStore::new()));
    let sequences = Sequences::new(Arc::clone(&recording));
    let plugs = recording.hold_the_calls(&sequences).await;
    let callers: Vec<(usize, Caller)> = (0..SEQUENCES)
        .flat_map(|i| (0..CALLS).map(move |_| i))
        .map(|i| (i, call(&sequences, &format!("orders/s{i}"))))
        .collect();
    // Each lane reads its sequence once (unknown yet) and hands its write over.
    let plug_loads = DURABLE_WRITES_IN_FLIGHT as u32;
    settle_until("every lane to read its sequence", || {
        recording.loads.load(Ordering::SeqCst) >= plug_loads + SEQUENCES as u32
    })
    .await;
    settle().await;
    recording.release();

    for plug in plugs {
        assert_eq!(plug.await.unwrap(), 1);
    }
    let mut handed = vec![BTreeSet::new(); SEQUENCES];
    for (i, caller) in callers {
        let value = caller.await.unwrap();
        assert!(handed[i].insert(value), "{value} handed out twice on s{i}");
    }
    for numbers in &handed {
        assert_eq!(numbers, &(1..=CALLS).collect::<BTreeSet<u64>>());
    }
    let calls = recording.calls();
    let writes_after_plugs = calls.len() - DURABLE_WRITES_IN_FLIGHT;
    assert!(
        writes_after_plugs < SEQUENCES,
        "{writes_after_plugs} durable writes served {SEQUENCES} sequences: {calls:?}"
    );
    let all = calls
        .iter()
        .find(|call| call.len() == SEQUENCES)
        .unwrap_or_else(|| panic!("no write carried every sequence: {calls:?}"));
    assert!(all.iter().all(|(_, written)| *written), "{calls:?}");
}

/// Another process advances one of three sequences, so this process's memory of it is stale:
/// in the combined write of the three, only that one is refused; the others are written and
/// answered, and the refused one reads again and retries in a call of its own.
#[tokio::test]
async fn a_stale_state_on_one_sequence_fails_only_that_sequence_in_a_combined_write() {
    let store = Arc::new(MemoryStore::new());
    let recording = Recording::new(&store);
    let sequences = Sequences::new(Arc::clone(&recording));
    let other_process = Sequences::new(KvBackend::new(Arc::clone(&store)));
    let names = ["orders/a", "orders/b", "orders/c"];
    for name in names {
        assert_eq!(call(&sequences, name).await.unwrap(), 1);
    }
    let a = address(names[0]);
    assert_eq!(
        other_process.next(&a, &NextOptions::new()).await.unwrap(),
        2
    );

    let plugs = recording.hold_the_calls(&sequences).await;
    let callers: Vec<Caller> = names.iter().map(|name| call(&sequences, name)).collect();
    settle().await;
    let loads_before = recording.loads.load(Ordering::SeqCst);
    recording.release();
    for plug in plugs {
        plug.await.unwrap();
    }
    let values: Vec<u64> = futures_join(callers).await;

    assert_eq!(
        values,
        [3, 2, 2],
        "a continues after the other process's number"
    );
    let key = |name: &str| address(name).key().to_owned();
    let keys: Vec<String> = names.iter().map(|name| key(name)).collect();
    // The calls after the warm-up that carried any of the three (not the plugs').
    let calls: Vec<Call> = recording.calls()[names.len()..]
        .iter()
        .filter(|call| call.iter().any(|(k, _)| keys.contains(k)))
        .cloned()
        .collect();
    assert_eq!(
        calls,
        [
            vec![
                (keys[0].clone(), false),
                (keys[1].clone(), true),
                (keys[2].clone(), true)
            ],
            vec![(keys[0].clone(), true)],
        ],
        "one call carried the three, a failed alone in it and was retried alone"
    );
    assert_eq!(
        recording.loads.load(Ordering::SeqCst),
        loads_before + 1,
        "only a read again"
    );
    assert_eq!(sequences.get(&a).await.unwrap(), Some(4));
}

async fn futures_join(callers: Vec<Caller>) -> Vec<u64> {
    let mut values = Vec::with_capacity(callers.len());
    for caller in callers {
        values.push(caller.await.unwrap());
    }
    values
}
