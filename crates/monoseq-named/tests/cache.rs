//! The number cache (`Sequences::with_cache`, PostgreSQL's `CACHE`) on the in-memory and the
//! fjall key-value backends: one durable write per block, unique numbers across concurrent
//! callers and processes, a gap (never a repeat) after a restart, `reset`, `set` and `delete`
//! dropping the block (also one a refill in flight would install), `get` answering the block's
//! next number, the bound on blocks, and the errors of today near `VALUE_MAX`, on a fault, on
//! an invalid stored object, and at a timeout (a refill that lands late still answers its number).

/// The shared store fixtures; `redb` is not used here.
#[allow(dead_code)]
mod support {
    pub mod stores;
}

use std::collections::BTreeSet;
use std::num::{NonZeroU32, NonZeroU64};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use monoseq_kv::{FaultOp, FaultyStore, FjallStore, Key, KvStore, MemoryStore, Options};
use monoseq_named::{
    Address, Backend, BoxFuture, CacheOptions, ConditionalWrite, KV_TAG, KvBackend, NextError,
    NextOptions, Object, Sequences, SetOptions, StorageError, VALUE_MAX, Version, WriteFailure,
};
use tokio::sync::{Notify, Semaphore};

const CACHE: u64 = 32;

use support::stores::{Shared, fjall, memory};

fn address(text: &str) -> Address {
    text.parse().unwrap()
}

fn cache(numbers: u64) -> CacheOptions {
    CacheOptions::new(NonZeroU64::new(numbers).unwrap())
}

fn cached(backend: Shared) -> Sequences {
    Sequences::new(backend).with_cache(cache(CACHE))
}

/// A backend that counts the conditional writes that reach storage, and can hold one write of
/// the lanes after it landed (before its answer returns) or one `replace` (a `reset`'s write)
/// before it is made.
struct Counting {
    inner: Shared,
    writes: AtomicU32,
    hold_landed: AtomicBool,
    hold_replace: AtomicBool,
    holding: Notify,
    gate: Semaphore,
}

impl Counting {
    fn new(inner: Shared) -> Arc<Counting> {
        Arc::new(Counting {
            inner,
            writes: AtomicU32::new(0),
            hold_landed: AtomicBool::new(false),
            hold_replace: AtomicBool::new(false),
            holding: Notify::new(),
            gate: Semaphore::new(0),
        })
    }

    fn writes(&self) -> u32 {
        self.writes.load(Ordering::SeqCst)
    }

    async fn hold_if(&self, armed: &AtomicBool) {
        if armed.swap(false, Ordering::SeqCst) {
            self.holding.notify_one();
            self.gate.acquire().await.unwrap().forget();
        }
    }
}

impl Backend for Counting {
    fn load<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<Object>, StorageError>> {
        self.inner.load(key)
    }
    fn create<'a>(
        &'a self,
        key: &'a str,
        bytes: Vec<u8>,
    ) -> BoxFuture<'a, Result<Version, WriteFailure>> {
        self.writes.fetch_add(1, Ordering::SeqCst);
        self.inner.create(key, bytes)
    }
    fn replace<'a>(
        &'a self,
        key: &'a str,
        expected: &'a Version,
        bytes: Vec<u8>,
    ) -> BoxFuture<'a, Result<Version, WriteFailure>> {
        Box::pin(async move {
            self.hold_if(&self.hold_replace).await;
            self.writes.fetch_add(1, Ordering::SeqCst);
            self.inner.replace(key, expected, bytes).await
        })
    }
    fn remove<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<(), StorageError>> {
        self.inner.remove(key)
    }
    fn write_each(
        &self,
        writes: Vec<ConditionalWrite>,
    ) -> BoxFuture<'_, Vec<Result<Version, WriteFailure>>> {
        Box::pin(async move {
            self.writes
                .fetch_add(u32::try_from(writes.len()).unwrap(), Ordering::SeqCst);
            let answers = self.inner.write_each(writes).await;
            self.hold_if(&self.hold_landed).await;
            answers
        })
    }
    /// The key-value backend's own answer: refills go through the combined write path.
    fn combines(&self) -> bool {
        self.inner.combines()
    }
}

/// Runs each named check on the in-memory and on the fjall backend.
macro_rules! on_both {
    ($($name:ident),* $(,)?) => {
        mod on_memory {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(super::memory()).await;
                }
            )*
        }
        mod on_fjall {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(super::fjall()).await;
                }
            )*
        }
    };
}

on_both!(
    sequential_calls_take_one_durable_write_per_block,
    concurrent_callers_get_consecutive_unique_numbers_from_few_writes,
    two_processes_hand_out_disjoint_numbers,
    reset_set_and_delete_drop_the_block,
    a_refill_that_landed_before_a_reset_installs_no_stale_block,
    a_refill_that_ran_during_a_reset_installs_no_stale_block,
    get_answers_the_blocks_next_number_here_and_the_ceiling_elsewhere,
    past_the_bound_the_least_recently_used_block_is_evicted,
    a_cache_of_one_writes_once_per_call_as_before,
    near_the_largest_value_the_errors_are_those_of_today,
    a_caller_out_of_time_during_a_refill_that_lands_gets_its_number,
);

async fn sequential_calls_take_one_durable_write_per_block(backend: Shared) {
    const CALLS: u64 = 10 * CACHE;
    let counting = Counting::new(backend);
    let s = cached(Arc::clone(&counting) as Shared);
    let a = address("orders/id");
    for expected in 1..=CALLS {
        assert_eq!(s.next(&a, &NextOptions::new()).await.unwrap(), expected);
    }
    assert_eq!(
        u64::from(counting.writes()),
        CALLS / CACHE,
        "one write per block"
    );
    // An increment of 5 refills (321..=325), the next call takes from the new block.
    let five = NextOptions::new().increment(NonZeroU64::new(5).unwrap());
    assert_eq!(s.increment(&a, &five).await.unwrap(), CALLS + 6);
    assert_eq!(u64::from(counting.writes()), CALLS / CACHE + 1);
    assert_eq!(s.next(&a, &NextOptions::new()).await.unwrap(), CALLS + 6);
    assert_eq!(u64::from(counting.writes()), CALLS / CACHE + 1);
}

async fn concurrent_callers_get_consecutive_unique_numbers_from_few_writes(backend: Shared) {
    const TASKS: u64 = 16;
    const CALLS: u64 = 64;
    let counting = Counting::new(backend);
    let s = cached(Arc::clone(&counting) as Shared);
    let a = address("orders/id");
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
            let (s, a) = (s.clone(), a.clone());
            tokio::spawn(async move {
                let mut got = Vec::new();
                for _ in 0..CALLS {
                    got.push(s.next(&a, &NextOptions::new()).await.unwrap());
                }
                got
            })
        })
        .collect();
    let mut all = BTreeSet::new();
    for task in tasks {
        let got = task.await.unwrap();
        assert!(got.windows(2).all(|w| w[0] < w[1]), "ordered per caller");
        for n in got {
            assert!(all.insert(n), "{n} handed out twice");
        }
    }
    assert_eq!(all, (1..=TASKS * CALLS).collect(), "consecutive, no gap");
    let writes = u64::from(counting.writes());
    assert!(
        writes <= 1 + TASKS * CALLS / CACHE,
        "{writes} writes for {} calls",
        TASKS * CALLS
    );
}

async fn two_processes_hand_out_disjoint_numbers(backend: Shared) {
    const CALLS: u64 = 200;
    let processes = [cached(Arc::clone(&backend)), cached(Arc::clone(&backend))];
    let a = address("orders/id");
    let tasks: Vec<_> = processes
        .iter()
        .flat_map(|s| [s.clone(), s.clone()])
        .map(|s| {
            let a = a.clone();
            tokio::spawn(async move {
                let mut got = Vec::new();
                for _ in 0..CALLS {
                    got.push(s.next(&a, &NextOptions::new()).await.unwrap());
                }
                got
            })
        })
        .collect();
    let mut all = BTreeSet::new();
    for task in tasks {
        let got = task.await.unwrap();
        assert!(got.windows(2).all(|w| w[0] < w[1]), "ordered per caller");
        for n in got {
            assert!(all.insert(n), "{n} handed out by both processes");
        }
    }
    let ceiling = Sequences::new(backend).get(&a).await.unwrap().unwrap();
    assert!(
        *all.last().unwrap() < ceiling,
        "all below the stored ceiling"
    );
    assert!(
        ceiling - 1 - 4 * CALLS <= 2 * CACHE,
        "at most a block each unused"
    );
}

async fn reset_set_and_delete_drop_the_block(backend: Shared) {
    let s = cached(backend);
    let a = address("orders/id");
    assert_eq!(s.next(&a, &NextOptions::new()).await.unwrap(), 1);
    s.reset(&a, 1000, &SetOptions::new()).await.unwrap();
    assert_eq!(s.get(&a).await.unwrap(), Some(1000));
    assert_eq!(s.next(&a, &NextOptions::new()).await.unwrap(), 1000);
    s.set(&a, 5000, &SetOptions::new()).await.unwrap();
    assert_eq!(s.next(&a, &NextOptions::new()).await.unwrap(), 5000);
    assert_eq!(s.next(&a, &NextOptions::new()).await.unwrap(), 5001);
    s.delete(&a).await.unwrap();
    assert_eq!(s.get(&a).await.unwrap(), None);
    let from_7 = NextOptions::new().initial(7);
    assert_eq!(s.next(&a, &from_7).await.unwrap(), 7, "created anew");
}

/// A refill's write lands, and before its answer returns a `reset` runs to the end: the
/// refill's caller gets its number, and the rest of its block is not installed over the reset.
async fn a_refill_that_landed_before_a_reset_installs_no_stale_block(backend: Shared) {
    let counting = Counting::new(backend);
    let s = cached(Arc::clone(&counting) as Shared);
    let a = address("orders/id");
    counting.hold_landed.store(true, Ordering::SeqCst);
    let refill = {
        let (s, a) = (s.clone(), a.clone());
        tokio::spawn(async move { s.next(&a, &NextOptions::new()).await })
    };
    counting.holding.notified().await;
    s.reset(&a, 1000, &SetOptions::new()).await.unwrap();
    counting.gate.add_permits(1);
    assert_eq!(refill.await.unwrap().unwrap(), 1, "its write landed first");
    assert_eq!(s.get(&a).await.unwrap(), Some(1000));
    assert_eq!(
        s.next(&a, &NextOptions::new()).await.unwrap(),
        1000,
        "the refill installed its block over the reset"
    );
}

/// A `reset` reads, and before it writes a refill reserves and installs a block; the reset's
/// write is refused, it reads again and writes: the block is dropped after it.
async fn a_refill_that_ran_during_a_reset_installs_no_stale_block(backend: Shared) {
    let counting = Counting::new(backend);
    let s = cached(Arc::clone(&counting) as Shared);
    let a = address("orders/id");
    assert_eq!(s.next(&a, &NextOptions::new()).await.unwrap(), 1);
    counting.hold_replace.store(true, Ordering::SeqCst);
    let reset = {
        let (s, a) = (s.clone(), a.clone());
        tokio::spawn(async move { s.reset(&a, 1000, &SetOptions::new()).await })
    };
    counting.holding.notified().await;
    // The reset dropped the block before reading: this call refills.
    assert_eq!(s.next(&a, &NextOptions::new()).await.unwrap(), 1 + CACHE);
    counting.gate.add_permits(1);
    reset.await.unwrap().unwrap();
    assert_eq!(
        s.next(&a, &NextOptions::new()).await.unwrap(),
        1000,
        "the block installed during the reset survived it"
    );
}

async fn get_answers_the_blocks_next_number_here_and_the_ceiling_elsewhere(backend: Shared) {
    let s = cached(Arc::clone(&backend));
    let elsewhere = Sequences::new(Arc::clone(&backend));
    let a = address("orders/id");
    assert_eq!(s.get(&a).await.unwrap(), None);
    assert_eq!(s.next(&a, &NextOptions::new()).await.unwrap(), 1);
    assert_eq!(s.next(&a, &NextOptions::new()).await.unwrap(), 2);
    assert_eq!(s.get(&a).await.unwrap(), Some(3));
    assert_eq!(s.get_data(&a).await.unwrap().unwrap().value, 3);
    assert_eq!(elsewhere.get(&a).await.unwrap(), Some(1 + CACHE));
    assert_eq!(
        elsewhere.get_data(&a).await.unwrap().unwrap().value,
        1 + CACHE
    );
    assert_eq!(
        elsewhere.next(&a, &NextOptions::new()).await.unwrap(),
        1 + CACHE
    );
    assert_eq!(
        s.next(&a, &NextOptions::new()).await.unwrap(),
        3,
        "its block stays"
    );
}

async fn past_the_bound_the_least_recently_used_block_is_evicted(backend: Shared) {
    const BLOCKS: u32 = 4;
    let counting = Counting::new(backend);
    let options = cache(CACHE).blocks_max(NonZeroU32::new(BLOCKS).unwrap());
    let s = Sequences::new(Arc::clone(&counting) as Shared).with_cache(options);
    let names: Vec<Address> = (0..=BLOCKS)
        .map(|i| address(&format!("orders/s{i}")))
        .collect();
    for a in &names {
        assert_eq!(s.next(a, &NextOptions::new()).await.unwrap(), 1);
    }
    let writes = counting.writes();
    assert_eq!(writes, BLOCKS + 1);
    for a in &names[1..] {
        assert_eq!(s.next(a, &NextOptions::new()).await.unwrap(), 2, "held");
    }
    assert_eq!(counting.writes(), writes, "the last {BLOCKS} are in memory");
    assert_eq!(
        s.next(&names[0], &NextOptions::new()).await.unwrap(),
        1 + CACHE,
        "the oldest was evicted: its numbers are a gap"
    );
    assert_eq!(counting.writes(), writes + 1);
}

async fn a_cache_of_one_writes_once_per_call_as_before(backend: Shared) {
    const CALLS: u32 = 20;
    let counting = Counting::new(backend);
    let s = Sequences::new(Arc::clone(&counting) as Shared).with_cache(cache(1));
    let a = address("orders/id");
    for expected in 1..=u64::from(CALLS) {
        assert_eq!(s.next(&a, &NextOptions::new()).await.unwrap(), expected);
        assert_eq!(
            Sequences::new(Arc::clone(&counting) as Shared)
                .get(&a)
                .await
                .unwrap(),
            Some(expected + 1),
            "stored before it was answered"
        );
    }
    assert_eq!(counting.writes(), CALLS);
}

async fn near_the_largest_value_the_errors_are_those_of_today(backend: Shared) {
    let plain = Sequences::new(Arc::clone(&backend));
    let s = cached(Arc::clone(&backend));
    for (name, s) in [("orders/plain", &plain), ("orders/cached", &s)] {
        let a = address(name);
        s.reset(&a, VALUE_MAX - 5, &SetOptions::new())
            .await
            .unwrap();
        let ten = NextOptions::new().increment(NonZeroU64::new(10).unwrap());
        let error = s.next(&a, &ten).await.unwrap_err();
        assert!(
            matches!(error, NextError::Overflow { .. }),
            "{name}: {error}"
        );
        for expected in VALUE_MAX - 5..VALUE_MAX {
            assert_eq!(s.next(&a, &NextOptions::new()).await.unwrap(), expected);
        }
        let error = s.next(&a, &NextOptions::new()).await.unwrap_err();
        assert!(
            matches!(error, NextError::Overflow { .. }),
            "{name}: {error}"
        );
        assert_eq!(s.get(&a).await.unwrap(), Some(VALUE_MAX), "{name}");
    }
}

/// A refill whose write landed but answers only after the caller's timeout: the caller waits
/// for it and gets its number (a busy answer would say nothing was written), and the block the
/// refill reserved serves the calls after it.
async fn a_caller_out_of_time_during_a_refill_that_lands_gets_its_number(backend: Shared) {
    let counting = Counting::new(backend);
    let s = cached(Arc::clone(&counting) as Shared);
    let a = address("orders/id");
    counting.hold_landed.store(true, Ordering::SeqCst);
    let short = NextOptions::new().timeout(Duration::from_millis(100));
    let call = {
        let (s, a) = (s.clone(), a.clone());
        tokio::spawn(async move { s.next(&a, &short).await })
    };
    counting.holding.notified().await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!call.is_finished(), "it answered before its write did");
    counting.gate.add_permits(1);
    assert_eq!(call.await.unwrap().unwrap(), 1);
    assert_eq!(s.next(&a, &NextOptions::new()).await.unwrap(), 2);
    assert_eq!(counting.writes(), 1, "one write reserved the block");
}

/// A restart (a new `Sequences` on the reopened store) continues above the reserved ceiling:
/// what the first run reserved and did not hand out is a gap, never handed out again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_continues_above_the_reserved_ceiling() {
    let dir = tempfile::tempdir().unwrap();
    let a = address("orders/id");
    let mut handed = BTreeSet::new();
    for run in 0..3u64 {
        let store = FjallStore::open(dir.path(), Options::default()).unwrap();
        let s = Sequences::new(KvBackend::new(store)).with_cache(cache(CACHE));
        for i in 0..5 {
            let n = s.next(&a, &NextOptions::new()).await.unwrap();
            assert_eq!(n, run * CACHE + i + 1);
            assert!(handed.insert(n), "{n} handed out again after a restart");
        }
    }
}

/// A storage fault during a refill reaches the waiting caller and installs nothing; an invalid
/// stored object is reported as today.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fault_or_an_invalid_object_during_a_refill_is_the_callers_error() {
    let store = Arc::new(FaultyStore::new(MemoryStore::new()));
    let s = Sequences::new(KvBackend::shared(Arc::clone(&store))).with_cache(cache(CACHE));
    let a = address("orders/id");
    store.fail_next(FaultOp::Write, 1);
    let error = s.next(&a, &NextOptions::new()).await.unwrap_err();
    assert!(matches!(error, NextError::Storage(_)), "{error}");
    assert_eq!(
        s.get(&a).await.unwrap(),
        None,
        "nothing written, nothing held"
    );
    assert_eq!(s.next(&a, &NextOptions::new()).await.unwrap(), 1);

    let b = address("orders/broken");
    let mut partition = vec![KV_TAG];
    partition.extend_from_slice(b.key().as_bytes());
    store
        .inner()
        .put(Key::new(&partition, b""), b"not a sequence")
        .unwrap();
    let error = s.next(&b, &NextOptions::new()).await.unwrap_err();
    assert!(matches!(error, NextError::InvalidStored { .. }), "{error}");
}
