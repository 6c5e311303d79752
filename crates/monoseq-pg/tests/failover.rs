//! The database's own failover, on a primary with a synchronous standby (`PgPair`): the
//! standby lags and the primary is killed while a writer writes, the standby is promoted, and
//! a store opened on the multi-host connection string reconnects by itself. Every write acknowledged before the
//! kill, and the leases with their epochs, are on the promoted standby.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use monoseq_kv::{Key, KvError, KvStore, WriteBatch, WriteError};
use monoseq_pg::testing::{DATABASE, PgPair};
use monoseq_pg::{PgOptions, PgStore};

/// Longest the store may take to write again once the standby accepts writes.
const HEAL_WITHIN: Duration = Duration::from_secs(20);
const LEASE: Duration = Duration::from_millis(300);

/// A command-like batch: three insert-if-absent items of write number `n`.
fn batch(n: u64) -> WriteBatch {
    let mut batch = WriteBatch::new();
    for part in [&b"event"[..], b"wlog", b"record"] {
        batch.insert_if_absent(Key::new(part, &n.to_be_bytes()), &n.to_be_bytes());
    }
    batch
}

/// Stops the writer when dropped, also when an assertion of the main thread fails.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

#[derive(Default)]
struct Log {
    acknowledged: Vec<u64>,
    /// When the first write after the outage was acknowledged.
    healed_at: Option<Instant>,
    errors: Vec<String>,
}

#[test]
fn acknowledged_writes_and_leases_survive_a_killed_primary_and_the_store_reconnects_alone() {
    let pair = PgPair::start().unwrap_or_else(|e| panic!("{e}"));
    let options = PgOptions::default()
        .connect_timeout(Duration::from_secs(2))
        .statement_timeout(Duration::from_secs(5));
    let store = PgStore::open(&pair.url(DATABASE), options).unwrap();
    let leases = store.leases();
    leases.ensure_partitions(1).unwrap();
    let epoch = leases.acquire(0, "a", LEASE).unwrap().unwrap();
    let old = store.fenced(0, epoch, "a");
    old.put(Key::new(b"fenced", b"before"), b"1").unwrap();

    let (killed, stop) = (AtomicBool::new(false), AtomicBool::new(false));
    let log = Mutex::new(Log::default());
    let promoted_at = thread::scope(|s| {
        s.spawn(|| {
            let mut n = 0;
            while !stop.load(Ordering::SeqCst) {
                n += 1;
                match store.write(&batch(n)) {
                    Ok(()) => {
                        let mut log = log.lock().unwrap();
                        log.acknowledged.push(n);
                        if killed.load(Ordering::SeqCst) && log.healed_at.is_none() {
                            log.healed_at = Some(Instant::now());
                        }
                    }
                    Err(WriteError::Storage(e)) => {
                        log.lock().unwrap().errors.push(e.to_string());
                        thread::sleep(Duration::from_millis(50));
                    }
                    Err(other) => panic!("write {n}: {other}"),
                }
            }
        });
        let _stop = StopOnDrop(&stop);
        thread::sleep(Duration::from_millis(700));
        // The standby lags, then the primary dies: with synchronous replication nothing was
        // acknowledged meanwhile (with asynchronous replication, writes acknowledged in this
        // window would be missing on the promoted standby).
        pair.stall_replication().unwrap();
        thread::sleep(Duration::from_millis(300));
        pair.kill_primary().unwrap();
        killed.store(true, Ordering::SeqCst);
        let before_kill = log.lock().unwrap().acknowledged.clone();
        thread::sleep(Duration::from_millis(300));
        pair.promote_standby().unwrap();
        let promoted_at = Instant::now();
        while log.lock().unwrap().healed_at.is_none() && promoted_at.elapsed() < HEAL_WITHIN {
            thread::sleep(Duration::from_millis(20));
        }
        thread::sleep(Duration::from_millis(200));
        assert!(
            !before_kill.is_empty(),
            "nothing was written before the kill"
        );
        promoted_at
    });

    let log = log.into_inner().unwrap();
    let healed_at = log.healed_at.unwrap_or_else(|| {
        panic!(
            "no write succeeded within {HEAL_WITHIN:?} of the promotion: {:?}",
            log.errors
        )
    });
    assert!(healed_at.duration_since(promoted_at) < HEAL_WITHIN);
    assert!(!log.errors.is_empty(), "the outage was not noticed");
    // Every acknowledged write, before the kill and after the promotion, is on the new primary.
    for &n in &log.acknowledged {
        for part in [&b"event"[..], b"wlog", b"record"] {
            let value = store.get(Key::new(part, &n.to_be_bytes())).unwrap();
            assert_eq!(value, Some(n.to_be_bytes().to_vec()), "write {n} lost");
        }
    }
    let recovery = pair
        .standby()
        .psql(DATABASE, "SELECT pg_is_in_recovery()")
        .unwrap();
    assert_eq!(
        recovery, "f",
        "the store must be reading the promoted standby"
    );

    // The lease and its epoch survived; a takeover on the new primary fences the old epoch.
    let status = leases.status().unwrap();
    let lease = status.lease(0).unwrap();
    assert_eq!((lease.epoch, lease.node_id.as_deref()), (epoch, Some("a")));
    thread::sleep(LEASE);
    let mut taken = None;
    while taken.is_none() {
        taken = leases.acquire(0, "b", Duration::from_secs(60)).unwrap();
        thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(taken, Some(epoch + 1));
    let late = old.put(Key::new(b"fenced", b"after"), b"1");
    assert!(
        matches!(late, Err(WriteError::Storage(KvError::Fenced { .. }))),
        "{late:?}"
    );
    assert_eq!(
        old.get(Key::new(b"fenced", b"before")).unwrap(),
        Some(b"1".to_vec())
    );
}

#[test]
fn a_commit_whose_answer_was_lost_is_reported_unknown_and_settled_before_the_error_returns() {
    let pair = PgPair::start().unwrap_or_else(|e| panic!("{e}"));
    let options = PgOptions::default()
        .connect_timeout(Duration::from_secs(1))
        .statement_timeout(Duration::from_secs(2));
    let store = PgStore::open(&pair.url(DATABASE), options).unwrap();
    store.write(&batch(1)).unwrap();
    // The standby stops confirming: the next commit is written on the primary but waits, and
    // the store gives up on its answer after its call limit (3 s). The standby comes back a
    // little later, while the store settles the write.
    pair.stall_replication().unwrap();
    let began = Instant::now();
    let (written, took, found) = thread::scope(|s| {
        s.spawn(|| {
            thread::sleep(Duration::from_millis(3_800));
            pair.resume_replication().unwrap();
        });
        let written = store.write(&batch(2));
        let took = began.elapsed();
        let found: Vec<_> = [&b"event"[..], b"wlog", b"record"]
            .into_iter()
            .map(|part| store.get(Key::new(part, &2u64.to_be_bytes())).unwrap())
            .collect();
        (written, took, found)
    });
    let e = match written {
        Err(WriteError::Storage(e)) => e,
        other => panic!("expected a storage error, got {other:?}"),
    };
    assert!(e.is_outcome_unknown(), "{e}");
    assert!(
        took > Duration::from_millis(3_800),
        "the error returned after {took:?}, before the transaction ended: {e}"
    );
    assert!(
        found
            .iter()
            .all(|v| v.as_deref() == Some(&2u64.to_be_bytes()[..])),
        "the landed batch reads back whole right after the error ({e}): {found:?}"
    );
    assert!(
        matches!(store.write(&batch(2)), Err(WriteError::Conflict { .. })),
        "written once"
    );
}
