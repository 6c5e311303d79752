//! `FencedPgStore` on a real server: once another node took a partition's lease, every batch
//! and compare-and-swap of the former epoch is refused with `KvError::Fenced` and writes
//! nothing; a takeover waits for a write of the former epoch already in flight, so the new
//! owner reads everything that write acknowledged; and under a race between writers and a
//! takeover, no write begun after the takeover commits and every acknowledged one is kept.

use std::ops::{Bound, ControlFlow};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use monoseq_kv::{CasError, Key, KvError, KvStore, Order, WriteBatch, WriteError};
use monoseq_pg::testing::{DATABASE, PgCluster};
use monoseq_pg::{FencedPgStore, Leases, PgOptions, PgStore};

const SHORT: Duration = Duration::from_millis(300);
const LONG: Duration = Duration::from_secs(60);
const PAST_SHORT: Duration = Duration::from_millis(450);

fn shared() -> &'static PgCluster {
    PgCluster::shared().unwrap_or_else(|e| panic!("{e}"))
}

/// A fresh store with partition 0's lease held by node "a" for `lease`.
fn held_by_a(pool: usize, lease: Duration) -> (PgStore, Leases, FencedPgStore) {
    let store = shared()
        .fresh_store(PgOptions::default().pool_connections(pool))
        .unwrap_or_else(|e| panic!("{e}"));
    let leases = store.leases();
    leases.ensure_partitions(1).unwrap();
    let epoch = leases.acquire(0, "a", lease).unwrap().unwrap();
    let view = store.fenced(0, epoch, "a");
    (store, leases, view)
}

/// Takes partition 0 for node "b" once a's short lease expired.
fn take_over(leases: &Leases) -> u64 {
    thread::sleep(PAST_SHORT);
    leases
        .acquire(0, "b", LONG)
        .unwrap()
        .expect("a's lease expired")
}

fn fenced_message(result: Result<(), WriteError>) -> String {
    match result {
        Err(WriteError::Storage(e @ KvError::Fenced { .. })) => e.to_string(),
        other => panic!("expected a fenced write, got {other:?}"),
    }
}

fn assert_cas_fenced(result: Result<(), CasError>) {
    assert!(
        matches!(result, Err(CasError::Storage(KvError::Fenced { .. }))),
        "expected a fenced compare-and-swap, got {result:?}"
    );
}

/// Every shape of batch the store sends differently: one upsert, upserts and deletes, a lone
/// insert-if-absent, and insert-if-absent conditions with other items.
fn batches(tag: &[u8]) -> Vec<WriteBatch> {
    let key = |n: u8| [tag, &[n]].concat();
    let mut put = WriteBatch::new();
    put.put(Key::new(b"p", &key(1)), b"v");
    let mut put_delete = WriteBatch::new();
    put_delete
        .put(Key::new(b"p", &key(2)), b"v")
        .delete(Key::new(b"p", b"stored"));
    let mut lone_insert = WriteBatch::new();
    lone_insert.insert_if_absent(Key::new(b"p", &key(3)), b"v");
    let mut conditional = WriteBatch::new();
    for n in 4..7 {
        conditional.insert_if_absent(Key::new(b"p", &key(n)), b"v");
    }
    conditional.put(Key::new(b"p", &key(7)), b"v");
    let mut big = WriteBatch::new();
    for n in 8..108 {
        big.insert_if_absent(Key::new(b"p", &key(n)), b"v");
    }
    vec![put, put_delete, lone_insert, conditional, big]
}

fn stored_count(store: &impl KvStore, tag: &[u8]) -> usize {
    let mut count = 0;
    store
        .scan(
            b"p",
            Bound::Unbounded,
            Bound::Unbounded,
            Order::Ascending,
            &mut |c, _| {
                count += usize::from(c.starts_with(tag));
                ControlFlow::Continue(())
            },
        )
        .unwrap();
    count
}

#[test]
fn after_a_takeover_every_write_of_the_former_epoch_is_refused_and_writes_nothing() {
    // One connection: a refused write must hand it back cleanly (no transaction left open).
    let (store, leases, old) = held_by_a(1, SHORT);
    store.put(Key::new(b"p", b"stored"), b"before").unwrap();
    for batch in batches(b"ok") {
        old.write(&batch).unwrap();
    }
    old.compare_and_swap(Key::new(b"p", b"cas"), None, Some(b"1"))
        .unwrap();
    let written = stored_count(&store, b"ok");
    let epoch = take_over(&leases);
    for batch in batches(b"late") {
        let message = fenced_message(old.write(&batch));
        assert!(message.contains("partition 0 with epoch 1"), "{message}");
        assert!(message.contains("epoch 2"), "{message}");
        assert!(message.contains("\"b\""), "{message}");
    }
    assert_cas_fenced(old.compare_and_swap(Key::new(b"p", b"cas"), Some(b"1"), Some(b"2")));
    assert_cas_fenced(old.compare_and_swap(Key::new(b"p", b"cas"), Some(b"1"), None));
    assert_cas_fenced(old.compare_and_swap(Key::new(b"p", b"cas2"), None, Some(b"1")));
    // Nothing of them is visible, and the old epoch's reads still work.
    assert_eq!(stored_count(&old, b"late"), 0);
    assert_eq!(stored_count(&store, b"ok"), written);
    assert_eq!(
        old.get(Key::new(b"p", b"cas")).unwrap(),
        Some(b"1".to_vec())
    );
    assert_eq!(old.get(Key::new(b"p", b"cas2")).unwrap(), None);
    assert_eq!(
        store.get(Key::new(b"p", b"stored")).unwrap(),
        None,
        "deleted by the first epoch's batch"
    );
    // The new owner writes through its own epoch, on the same (single) connection.
    let new = store.fenced(0, epoch, "b");
    for batch in batches(b"new") {
        new.write(&batch).unwrap();
    }
    new.compare_and_swap(Key::new(b"p", b"cas"), Some(b"1"), Some(b"2"))
        .unwrap();
    assert_eq!(
        store.get(Key::new(b"p", b"cas")).unwrap(),
        Some(b"2".to_vec())
    );
    assert_eq!(stored_count(&store, b"new"), written);
}

#[test]
fn a_release_fences_its_holder_as_the_next_takeover_does() {
    let (store, leases, old) = held_by_a(2, LONG);
    assert!(leases.release("a", 0, old.epoch()).unwrap());
    let message = fenced_message(old.put(Key::new(b"p", b"after release"), b"v"));
    assert!(message.contains("released"), "{message}");
    leases.acquire(0, "b", LONG).unwrap().unwrap();
    fenced_message(old.put(Key::new(b"p", b"after takeover"), b"v"));
    assert_eq!(store.get(Key::new(b"p", b"after release")).unwrap(), None);
}

#[test]
fn an_expired_lease_not_taken_over_still_admits_its_writes() {
    let (_store, _leases, old) = held_by_a(2, SHORT);
    thread::sleep(PAST_SHORT);
    old.put(Key::new(b"p", b"k"), b"v").unwrap();
    old.compare_and_swap(Key::new(b"p", b"k"), Some(b"v"), Some(b"w"))
        .unwrap();
}

#[test]
fn views_of_a_missing_lease_or_an_epoch_never_granted_are_fenced() {
    let (store, _leases, _old) = held_by_a(2, LONG);
    for (partition, epoch, says) in [
        (5, 1, "missing"),
        (u32::MAX, 1, "missing"),
        (0, 2, "not newer"),
        (0, u64::MAX, "not newer"),
    ] {
        let view = store.fenced(partition, epoch, "a");
        let message = fenced_message(view.put(Key::new(b"p", b"k"), b"v"));
        assert!(message.contains(says), "{message}");
        assert_cas_fenced(view.compare_and_swap(Key::new(b"p", b"k"), None, Some(b"v")));
    }
    assert_eq!(store.get(Key::new(b"p", b"k")).unwrap(), None);
}

/// Holds an uncommitted insert of `p`/`k` in the store's table for `hold`, from another
/// session, then rolls it back.
fn hold_key_lock(schema: &str, hold: Duration) {
    let sql = format!(
        "BEGIN; INSERT INTO {schema}.monoseq_kv VALUES ('\\x70'::bytea, '\\x6b'::bytea, \
         '\\x00'::bytea); SELECT pg_sleep({}); ROLLBACK",
        hold.as_secs_f64()
    );
    shared().psql(DATABASE, &sql).unwrap();
}

/// Waits until `sql` (a count) answers at least 1.
fn wait_for(sql: &str) {
    let began = Instant::now();
    while shared().psql(DATABASE, sql).unwrap() == "0" {
        assert!(
            began.elapsed() < Duration::from_secs(10),
            "waited for {sql}"
        );
        thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_takeover_waits_for_a_write_of_the_former_epoch_in_flight() {
    let (store, leases, old) = held_by_a(2, SHORT);
    let schema = store.schema().to_owned();
    thread::sleep(PAST_SHORT);
    let write_returned = Mutex::new(None);
    thread::scope(|s| {
        // Another session holds key k, so the old epoch's write passes its fence and waits.
        s.spawn(|| hold_key_lock(&schema, Duration::from_secs(2)));
        wait_for(&format!(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep' AND query LIKE \
             '%{schema}.monoseq_kv%'"
        ));
        s.spawn(|| {
            let mut batch = WriteBatch::new();
            batch
                .put(Key::new(b"p", b"k"), b"old")
                .put(Key::new(b"p", b"k2"), b"old");
            let result = old.write(&batch);
            *write_returned.lock().unwrap() = Some(result);
        });
        wait_for(&format!(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'monoseq' AND \
             wait_event_type = 'Lock' AND query LIKE '%{schema}.monoseq_kv%'"
        ));
        assert_eq!(leases.acquire(0, "b", LONG).unwrap(), Some(2));
        // The new owner's first read sees the whole write, which committed first.
        assert_eq!(
            store.get(Key::new(b"p", b"k")).unwrap(),
            Some(b"old".to_vec())
        );
        assert_eq!(
            store.get(Key::new(b"p", b"k2")).unwrap(),
            Some(b"old".to_vec())
        );
    });
    let result = write_returned.lock().unwrap().take().unwrap();
    result.unwrap();
    fenced_message(old.put(Key::new(b"p", b"k3"), b"late"));
}

/// What one write through the former epoch's view did.
#[derive(Debug)]
struct Attempt {
    tag: u64,
    began_after_takeover: bool,
    ok: bool,
}

fn race_batch(writer: u64, n: u64) -> (u64, WriteBatch) {
    let tag = writer << 32 | n;
    let key = |i: u64| [tag.to_be_bytes(), i.to_be_bytes()].concat();
    let mut batch = WriteBatch::new();
    match n % 3 {
        0 => batch.insert_if_absent(Key::new(b"r", &key(0)), b"v"),
        1 => {
            for i in 0..3 {
                batch.insert_if_absent(Key::new(b"r", &key(i)), b"v");
            }
            &mut batch
        }
        _ => {
            for i in 0..100 {
                batch.put(Key::new(b"r", &key(i)), b"v");
            }
            &mut batch
        }
    };
    (tag, batch)
}

fn writes_of_tag(store: &impl KvStore, tag: u64) -> usize {
    let from = tag.to_be_bytes();
    let to = (tag + 1).to_be_bytes();
    let mut count = 0;
    store
        .scan(
            b"r",
            Bound::Included(&from),
            Bound::Excluded(&to),
            Order::Ascending,
            &mut |_, _| {
                count += 1;
                ControlFlow::Continue(())
            },
        )
        .unwrap();
    count
}

#[test]
fn under_a_race_with_a_takeover_no_late_write_commits_and_every_acknowledged_one_is_kept() {
    const WRITERS: u64 = 4;
    let (store, leases, old) = held_by_a(8, SHORT);
    let taken = AtomicBool::new(false);
    let stop = AtomicBool::new(false);
    let attempts = Mutex::new(Vec::new());
    let mut seen_by_new_owner = Vec::new();
    thread::scope(|s| {
        for writer in 0..WRITERS {
            let (old, taken, stop, attempts) = (&old, &taken, &stop, &attempts);
            s.spawn(move || {
                let mut n = 0;
                while !stop.load(Ordering::SeqCst) {
                    let (tag, batch) = race_batch(writer, n);
                    n += 1;
                    let began_after_takeover = taken.load(Ordering::SeqCst);
                    let ok = match old.write(&batch) {
                        Ok(()) => true,
                        Err(WriteError::Storage(KvError::Fenced { .. })) => false,
                        Err(other) => panic!("writer {writer}: {other}"),
                    };
                    attempts.lock().unwrap().push(Attempt {
                        tag,
                        began_after_takeover,
                        ok,
                    });
                }
            });
        }
        let epoch = loop {
            if let Some(epoch) = leases.acquire(0, "b", LONG).unwrap() {
                break epoch;
            }
            thread::sleep(Duration::from_millis(5));
        };
        taken.store(true, Ordering::SeqCst);
        assert_eq!(epoch, 2);
        // The new owner's first read, right after the takeover.
        store
            .scan(
                b"r",
                Bound::Unbounded,
                Bound::Unbounded,
                Order::Ascending,
                &mut |c, _| {
                    if let Some(tag) = c.get(..8) {
                        seen_by_new_owner.push(u64::from_be_bytes(tag.try_into().unwrap()));
                    }
                    ControlFlow::Continue(())
                },
            )
            .unwrap();
        thread::sleep(Duration::from_millis(300));
        stop.store(true, Ordering::SeqCst);
    });
    seen_by_new_owner.dedup();
    let attempts = attempts.into_inner().unwrap();
    let ok = attempts.iter().filter(|a| a.ok).count();
    let refused = attempts.len() - ok;
    assert!(ok > 0 && refused > 0, "{ok} written, {refused} refused");
    for attempt in &attempts {
        let stored = writes_of_tag(&store, attempt.tag);
        match attempt.ok {
            true => {
                assert!(!attempt.began_after_takeover, "{attempt:?} committed late");
                assert!(stored > 0, "{attempt:?} acknowledged but not stored");
                assert!(
                    seen_by_new_owner.binary_search(&attempt.tag).is_ok(),
                    "{attempt:?} committed after the new owner's first read"
                );
            }
            false => assert_eq!(stored, 0, "{attempt:?} refused but stored"),
        }
    }
}

#[test]
fn a_database_that_lost_writes_of_a_view_refuses_its_next_write_and_says_it_went_back() {
    let (store, _leases, view) = held_by_a(2, LONG);
    for batch in batches(b"before") {
        view.write(&batch).unwrap();
    }
    view.compare_and_swap(Key::new(b"p", b"cas"), None, Some(b"1"))
        .unwrap();
    // The database goes back in time (a standby that was behind is promoted): the lease row,
    // with its epoch unchanged, no longer counts the view's last writes.
    let schema = store.schema().to_owned();
    shared()
        .psql(
            DATABASE,
            &format!("UPDATE {schema}.monoseq_leases SET writes = writes - 2 WHERE partition = 0"),
        )
        .unwrap();
    for batch in batches(b"after") {
        let message = fenced_message(view.write(&batch));
        assert!(message.contains("went back in time"), "{message}");
        assert!(message.contains("partition 0"), "{message}");
    }
    assert_cas_fenced(view.compare_and_swap(Key::new(b"p", b"cas"), Some(b"1"), Some(b"2")));
    assert_eq!(
        store.get(Key::new(b"p", b"cas")).unwrap(),
        Some(b"1".to_vec())
    );
    assert_eq!(
        store.get(Key::new(b"p", b"after\x01")).unwrap(),
        None,
        "nothing of a refused write is stored"
    );
    // A view of a new acquisition (after the partition was checked against its marks)
    // writes again.
    let fresh = store.fenced(0, view.epoch(), "a");
    fresh.put(Key::new(b"p", b"again"), b"1").unwrap();
}

#[test]
fn a_former_holder_of_an_epoch_the_database_granted_again_to_another_node_is_fenced() {
    let (store, leases, a) = held_by_a(2, LONG);
    // The database goes back in time to before a's acquisition, a still running, and node b
    // then acquires the lease: it gets the same epoch number a holds.
    let schema = store.schema().to_owned();
    shared()
        .psql(
            DATABASE,
            &format!(
                "UPDATE {schema}.monoseq_leases SET epoch = epoch - 1, node_id = NULL, \
                 expires_at = now() WHERE partition = 0"
            ),
        )
        .unwrap();
    let epoch = leases
        .acquire(0, "b", LONG)
        .unwrap()
        .expect("a's acquisition was lost");
    assert_eq!(epoch, a.epoch(), "b holds the epoch number a holds");
    let message = fenced_message(a.put(Key::new(b"p", b"a"), b"1"));
    assert!(message.contains("node \"b\" holds this epoch"), "{message}");
    assert!(message.contains("went back in time"), "{message}");
    assert_cas_fenced(a.compare_and_swap(Key::new(b"p", b"cas"), None, Some(b"1")));
    assert_eq!(
        store.get(Key::new(b"p", b"a")).unwrap(),
        None,
        "a wrote nothing"
    );
    // b's own view of the epoch writes.
    let b = store.fenced(0, epoch, "b");
    b.put(Key::new(b"p", b"b"), b"1").unwrap();
}

#[test]
fn concurrent_writes_of_one_view_are_all_counted_and_none_is_refused() {
    let (_store, _leases, view) = held_by_a(4, LONG);
    let view = &view;
    thread::scope(|s| {
        for t in 0..4u8 {
            s.spawn(move || {
                for n in 0..25u8 {
                    view.put(Key::new(b"p", &[t, n]), b"v")
                        .unwrap_or_else(|e| panic!("thread {t} write {n}: {e}"));
                }
            });
        }
    });
}
