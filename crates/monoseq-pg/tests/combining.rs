//! Combined writes on a real server: batches of several partitions that wait while every write
//! transaction of the store is in flight go out together in one transaction, and each still
//! gets its own outcome: a batch that finds a key present fails with its own index, a batch
//! whose fence no longer holds is refused and writes nothing, and the others are written.
//!
//! Each test fills every write slot of the store (`WRITE_TRANSACTIONS_DEFAULT`) with a put
//! that waits on a row another session holds, queues its batches one by one (checking that
//! each waits; the store's combine wait is longer than the test), then lets the first slot
//! go: the next transaction takes every batch waiting. A batch that waits past the combine
//! wait starts a transaction of its own while every slot stays taken.

use std::thread::{self, Scope, ScopedJoinHandle};
use std::time::{Duration, Instant};

use monoseq_kv::{Key, KvError, KvStore, WriteBatch, WriteError};
use monoseq_pg::testing::{DATABASE, PgCluster};
use monoseq_pg::{PgOptions, PgStore, WRITE_TRANSACTIONS_DEFAULT};

const LONG: Duration = Duration::from_secs(60);
const WAIT_MAX: Duration = Duration::from_secs(20);
/// The partition key of the rows the slots' puts wait on.
const SLOT: &[u8] = b"slot";

fn shared() -> &'static PgCluster {
    PgCluster::shared().unwrap_or_else(|e| panic!("{e}"))
}

fn fresh() -> PgStore {
    shared()
        .fresh_store(PgOptions::default().pool_connections(16).combine_wait(LONG))
        .unwrap_or_else(|e| panic!("{e}"))
}

fn psql(sql: &str) -> String {
    shared()
        .psql(DATABASE, sql)
        .unwrap_or_else(|e| panic!("{e}"))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Waits until `done` holds; fails after `WAIT_MAX` naming `what`.
fn wait_until(what: &str, done: impl Fn() -> bool) {
    let began = Instant::now();
    while !done() {
        assert!(began.elapsed() < WAIT_MAX, "waited {WAIT_MAX:?} for {what}");
        thread::sleep(Duration::from_millis(10));
    }
}

/// Holds slot row `n` of the store in `schema` locked from another session until
/// [`let_go`] cancels it.
fn hold_row(schema: &str, n: u8) {
    let sql = format!(
        "BEGIN; SELECT 1 FROM {schema}.monoseq_kv WHERE partition = '\\x{}'::bytea AND \
         clustering = '\\x{}'::bytea FOR UPDATE; SELECT pg_sleep(120) /* hold-{schema}-{n}. */; \
         COMMIT",
        hex(SLOT),
        hex(&[n])
    );
    // Ends with an error when cancelled; the lock goes with the transaction.
    let _ = shared().psql(DATABASE, &sql);
}

fn let_go(schema: &str, n: u8) {
    psql(&format!(
        "SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE query LIKE \
         '%hold-{schema}-{n}.%' AND pid <> pg_backend_pid()"
    ));
}

/// Lets every row of a schema go when dropped, so that a failed check does not leave its test
/// waiting for the sessions that hold them.
struct LetGoAll<'a>(&'a str);

impl Drop for LetGoAll<'_> {
    fn drop(&mut self) {
        let _ = shared().psql(
            DATABASE,
            &format!(
                "SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE query LIKE \
                 '%hold-{}-%' AND pid <> pg_backend_pid()",
                self.0
            ),
        );
    }
}

fn count(sql: &str) -> usize {
    psql(sql).parse().unwrap_or_else(|e| panic!("{sql}: {e}"))
}

/// What `PgStore::combining` counted during one run.
#[derive(Debug)]
struct Counted {
    transactions: u64,
    writes: u64,
    fallbacks: u64,
}

/// Sessions holding the slot rows and the puts waiting on them, one per write slot.
struct Slots<'s> {
    holders: Vec<ScopedJoinHandle<'s, ()>>,
    puts: Vec<ScopedJoinHandle<'s, Result<(), WriteError>>>,
}

/// Takes every write slot of `store` (whose tables are in `schema`) with a put that waits on a
/// row another session holds; answers once they all wait.
fn take_every_slot<'s>(s: &'s Scope<'s, '_>, store: &'s PgStore, schema: &'s str) -> Slots<'s> {
    let slots = u8::try_from(WRITE_TRANSACTIONS_DEFAULT).unwrap();
    let holders: Vec<_> = (0..slots)
        .map(|n| s.spawn(move || hold_row(schema, n)))
        .collect();
    let held = format!(
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep' AND query LIKE \
         '%hold-{schema}-%' AND pid <> pg_backend_pid()"
    );
    wait_until("the slot rows to be held", || count(&held) == holders.len());
    let puts: Vec<_> = (0..slots)
        .map(|n| s.spawn(move || store.put(Key::new(SLOT, &[n]), b"taken")))
        .collect();
    let waiting = format!(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'monoseq' AND \
         wait_event_type = 'Lock' AND query LIKE '%{schema}.monoseq_kv%'"
    );
    wait_until("every slot's put to wait", || count(&waiting) == puts.len());
    Slots { holders, puts }
}

impl Slots<'_> {
    /// Lets the slots' rows go (from `first` on) and waits for their puts.
    fn free(self, schema: &str, first: u8) {
        for n in first..u8::try_from(self.puts.len()).unwrap() {
            let_go(schema, n);
        }
        for put in self.puts {
            put.join().unwrap().unwrap();
        }
        for holder in self.holders {
            holder.join().unwrap();
        }
    }
}

/// Puts the rows the slots' puts wait on.
fn store_slot_rows(store: &PgStore) {
    for n in 0..u8::try_from(WRITE_TRANSACTIONS_DEFAULT).unwrap() {
        store.put(Key::new(SLOT, &[n]), b"free").unwrap();
    }
}

/// Runs `writes` (each on its own thread) while every write slot of `store` is taken, queued
/// in order; then frees the first slot and answers what each returned, and how the store
/// combined them.
fn while_every_slot_is_taken<'a, R: Send + 'a>(
    store: &'a PgStore,
    writes: Vec<Box<dyn FnOnce() -> R + Send + 'a>>,
) -> (Vec<R>, Counted) {
    let schema = store.schema().to_owned();
    store_slot_rows(store);
    let before = store.combining();
    thread::scope(|s| {
        let schema = schema.as_str();
        let _let_go_all = LetGoAll(schema);
        let slots = take_every_slot(s, store, schema);
        let mut writers = Vec::new();
        for (i, write) in writes.into_iter().enumerate() {
            writers.push(s.spawn(write));
            wait_until(&format!("batch {i} to wait for a transaction"), || {
                store.combining().waiting == i + 1
            });
        }
        let_go(schema, 0);
        let results: Vec<R> = writers.into_iter().map(|w| w.join().unwrap()).collect();
        let after = store.combining();
        slots.free(schema, 1);
        let combined = Counted {
            transactions: after.transactions - before.transactions,
            writes: after.writes - before.writes,
            fallbacks: after.fallbacks - before.fallbacks,
        };
        (results, combined)
    })
}

/// A command-like batch of partition `p`: three events inserted where absent, a number put,
/// an old entry deleted.
fn batch_of(p: u8) -> WriteBatch {
    let partition = [b'p', p];
    let mut batch = WriteBatch::new();
    for offset in 1..=3u8 {
        batch.insert_if_absent(Key::new(&partition, &[b'e', offset]), &[p, offset]);
    }
    batch
        .put(Key::new(&partition, b"number"), &[p])
        .delete(Key::new(&partition, b"old"));
    batch
}

/// Whether `store` holds everything `batch_of(p)` wrote.
fn holds_batch_of(store: &impl KvStore, p: u8) -> bool {
    let partition = [b'p', p];
    let events = (1..=3u8).all(|offset| {
        store.get(Key::new(&partition, &[b'e', offset])).unwrap() == Some(vec![p, offset])
    });
    events
        && store.get(Key::new(&partition, b"number")).unwrap() == Some(vec![p])
        && store.get(Key::new(&partition, b"old")).unwrap().is_none()
}

/// Whether `store` holds nothing of `batch_of(p)` (its old entry still there).
fn holds_nothing_of(store: &impl KvStore, p: u8) -> bool {
    let partition = [b'p', p];
    let events = (1..=3u8).all(|offset| {
        store
            .get(Key::new(&partition, &[b'e', offset]))
            .unwrap()
            .is_none()
    });
    events
        && store
            .get(Key::new(&partition, b"number"))
            .unwrap()
            .is_none()
        && store.get(Key::new(&partition, b"old")).unwrap() == Some(b"kept".to_vec())
}

type Write<'a> = Box<dyn FnOnce() -> Result<(), WriteError> + Send + 'a>;

#[test]
fn concurrent_batches_of_several_partitions_share_one_transaction_and_are_all_readable() {
    let store = fresh();
    for p in 0..6u8 {
        store.put(Key::new(&[b'p', p], b"old"), b"kept").unwrap();
    }
    let store = &store;
    let writes: Vec<Write<'_>> = (0..6u8)
        .map(|p| Box::new(move || store.write(&batch_of(p))) as Write<'_>)
        .collect();
    let (results, combined) = while_every_slot_is_taken(store, writes);
    for (p, result) in results.into_iter().enumerate() {
        result.unwrap_or_else(|e| panic!("batch {p}: {e}"));
    }
    assert_eq!(
        (combined.transactions, combined.writes, combined.fallbacks),
        (1, 6, 0),
        "{combined:?}"
    );
    for p in 0..6u8 {
        assert!(holds_batch_of(store, p), "partition {p}");
    }
    // The database agrees: every row the batches left was written by one transaction.
    let transactions = count(&format!(
        "SELECT count(DISTINCT xmin::text) FROM {}.monoseq_kv WHERE partition <> '\\x{}'::bytea",
        store.schema(),
        hex(SLOT)
    ));
    assert_eq!(transactions, 1);
}

#[test]
fn a_batch_that_finds_a_key_present_fails_with_its_own_index_and_the_others_are_written() {
    let store = fresh();
    for p in 0..5u8 {
        store.put(Key::new(&[b'p', p], b"old"), b"kept").unwrap();
    }
    // Partition 2's second event is already stored: its batch conflicts at item 1.
    store.put(Key::new(b"p\x02", b"e\x02"), b"there").unwrap();
    let store = &store;
    let writes: Vec<Write<'_>> = (0..5u8)
        .map(|p| Box::new(move || store.write(&batch_of(p))) as Write<'_>)
        .collect();
    let (results, combined) = while_every_slot_is_taken(store, writes);
    for (p, result) in results.into_iter().enumerate() {
        match (p, result) {
            (2, Err(WriteError::Conflict { index, key })) => {
                assert_eq!(index, 1);
                assert_eq!(key.as_key(), Key::new(b"p\x02", b"e\x02"));
            }
            (2, other) => panic!("batch 2 must conflict at item 1, got {other:?}"),
            (_, result) => result.unwrap_or_else(|e| panic!("batch {p}: {e}")),
        }
    }
    assert_eq!(combined.fallbacks, 1, "{combined:?}");
    for p in [0, 1, 3, 4] {
        assert!(holds_batch_of(store, p), "partition {p}");
    }
    let partition = b"p\x02";
    assert_eq!(
        store.get(Key::new(partition, b"e\x02")).unwrap(),
        Some(b"there".to_vec())
    );
    assert_eq!(store.get(Key::new(partition, b"e\x01")).unwrap(), None);
    assert_eq!(store.get(Key::new(partition, b"number")).unwrap(), None);
    assert_eq!(
        store.get(Key::new(partition, b"old")).unwrap(),
        Some(b"kept".to_vec())
    );
}

#[test]
fn a_batch_whose_fence_no_longer_holds_writes_nothing_and_the_others_are_written() {
    let store = fresh();
    let leases = store.leases();
    leases.ensure_partitions(4).unwrap();
    let mut views = Vec::new();
    for p in 0..4u8 {
        store.put(Key::new(&[b'p', p], b"old"), b"kept").unwrap();
        let epoch = leases.acquire(p.into(), "a", LONG).unwrap().unwrap();
        views.push(store.fenced(p.into(), epoch, "a"));
    }
    // Node b takes partition 1 over: a's view of it is fenced.
    assert!(leases.release("a", 1, views[1].epoch()).unwrap());
    assert_eq!(leases.acquire(1, "b", LONG).unwrap(), Some(2));
    let views = &views;
    let writes: Vec<Write<'_>> = (0..4u8)
        .map(|p| Box::new(move || views[usize::from(p)].write(&batch_of(p))) as Write<'_>)
        .collect();
    let (results, combined) = while_every_slot_is_taken(&store, writes);
    for (p, result) in results.into_iter().enumerate() {
        match (p, result) {
            (1, Err(WriteError::Storage(e @ KvError::Fenced { .. }))) => {
                let message = e.to_string();
                assert!(message.contains("partition 1 with epoch 1"), "{message}");
                assert!(message.contains("epoch 2: node \"b\""), "{message}");
            }
            (1, other) => panic!("batch 1 must be fenced, got {other:?}"),
            (_, result) => result.unwrap_or_else(|e| panic!("batch {p}: {e}")),
        }
    }
    assert_eq!(combined.fallbacks, 1, "{combined:?}");
    for p in [0, 2, 3] {
        assert!(holds_batch_of(&store, p), "partition {p}");
    }
    assert!(holds_nothing_of(&store, 1));
}

#[test]
fn batches_that_touch_one_key_never_share_a_transaction() {
    let store = fresh();
    let store = &store;
    let put = |value: &'static [u8], shared: bool| {
        Box::new(move || {
            let mut batch = WriteBatch::new();
            batch.put(Key::new(value, b"own"), value);
            if shared {
                batch.put(Key::new(b"shared", b"k"), value);
            }
            store.write(&batch)
        }) as Write<'_>
    };
    let writes = vec![put(b"a", true), put(b"b", true), put(b"c", false)];
    let (results, combined) = while_every_slot_is_taken(store, writes);
    for result in results {
        result.unwrap();
    }
    // a and b both put k: b goes alone, c shares a's transaction.
    assert_eq!(
        (combined.transactions, combined.writes, combined.fallbacks),
        (1, 2, 0),
        "{combined:?}"
    );
    let shared = store.get(Key::new(b"shared", b"k")).unwrap();
    assert!(
        shared == Some(b"a".to_vec()) || shared == Some(b"b".to_vec()),
        "{shared:?}"
    );
    for value in [b"a", b"b", b"c"] {
        assert_eq!(
            store.get(Key::new(value, b"own")).unwrap(),
            Some(value.to_vec())
        );
    }
}

#[test]
fn a_batch_that_waits_past_the_combine_wait_starts_a_transaction_of_its_own() {
    let store = shared()
        .fresh_store(
            PgOptions::default()
                .pool_connections(16)
                .combine_wait(Duration::from_millis(50)),
        )
        .unwrap_or_else(|e| panic!("{e}"));
    store_slot_rows(&store);
    let schema = store.schema().to_owned();
    let before = store.combining();
    thread::scope(|s| {
        let schema = schema.as_str();
        let _let_go_all = LetGoAll(schema);
        let slots = take_every_slot(s, &store, schema);
        // Every slot stays taken, yet the batch is written after its wait.
        let began = Instant::now();
        store.write(&batch_of(7)).unwrap();
        assert!(began.elapsed() < WAIT_MAX, "{:?}", began.elapsed());
        assert!(holds_batch_of(&store, 7));
        let after = store.combining();
        assert_eq!(
            (after.transactions, after.writes),
            (before.transactions + 1, before.writes + 1)
        );
        slots.free(schema, 0);
    });
}
