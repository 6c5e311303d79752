//! Behaviours of the embedded backends beyond the conformance suite: data survives a close and
//! reopen in every durability mode, a data directory opens once at a time within a process,
//! options are validated, and group commit flushes on its own.

use std::ops::{Bound, ControlFlow};
use std::path::Path;
use std::time::Duration;

use monoseq_kv::{Durability, Key, KvStore, OpenError, Options, Order, WriteBatch, WriteError};

type Open = fn(&Path, Options) -> Result<Box<dyn KvStore>, OpenError>;

fn engines() -> Vec<(&'static str, Open)> {
    let mut engines: Vec<(&'static str, Open)> = Vec::new();
    #[cfg(feature = "fjall")]
    engines.push(("fjall", |dir, options| {
        Ok(Box::new(monoseq_kv::FjallStore::open(dir, options)?))
    }));
    #[cfg(feature = "redb")]
    engines.push(("redb", |dir, options| {
        Ok(Box::new(monoseq_kv::RedbStore::open(dir, options)?))
    }));
    engines
}

const MODES: [Durability; 3] = [
    Durability::Sync,
    Durability::GroupCommit {
        max_delay: Duration::from_millis(5),
    },
    Durability::Manual,
];

fn options(durability: Durability) -> Options {
    Options::default()
        .durability(durability)
        .cache_bytes(4 << 20)
}

fn count(store: &dyn KvStore, partition: &[u8]) -> usize {
    let mut n = 0;
    store
        .scan(
            partition,
            Bound::Unbounded,
            Bound::Unbounded,
            Order::Ascending,
            &mut |_, _| {
                n += 1;
                ControlFlow::Continue(())
            },
        )
        .expect("scan");
    n
}

#[test]
fn data_survives_close_and_reopen_in_every_durability_mode() {
    for (engine, open) in engines() {
        for mode in MODES {
            let dir = tempfile::tempdir().expect("temporary directory");
            {
                let store = open(dir.path(), options(mode)).expect("open");
                let mut batch = WriteBatch::new();
                for n in 0..500u64 {
                    batch.put(Key::new(b"log", &n.to_be_bytes()), &[7; 50]);
                }
                store.write(&batch).expect("write");
                store
                    .delete(Key::new(b"log", &0u64.to_be_bytes()))
                    .expect("delete");
                store
                    .compare_and_swap(Key::new(b"counter", b""), None, Some(b"1"))
                    .expect("cas");
            }
            let store = open(dir.path(), options(mode)).expect("reopen");
            assert_eq!(count(&*store, b"log"), 499, "{engine} {mode:?}");
            assert_eq!(
                store.get(Key::new(b"counter", b"")).expect("get"),
                Some(b"1".to_vec()),
                "{engine} {mode:?}"
            );
        }
    }
}

#[test]
fn insert_if_absent_after_reopen_finds_keys_written_before_it() {
    let conflicts = |store: &dyn KvStore, n: u64| {
        matches!(
            store.insert_if_absent(Key::new(b"log", &n.to_be_bytes()), b"again"),
            Err(monoseq_kv::WriteError::Conflict { .. })
        )
    };
    for (engine, open) in engines() {
        let dir = tempfile::tempdir().expect("temporary directory");
        {
            let store = open(dir.path(), options(Durability::Manual)).expect("open");
            // The first insert teaches the store this partition's highest key; later writes,
            // conditional or not, must keep it true.
            store
                .insert_if_absent(Key::new(b"log", &1u64.to_be_bytes()), b"1")
                .expect("insert");
            store
                .put(Key::new(b"log", &9u64.to_be_bytes()), b"9")
                .expect("put");
            store
                .compare_and_swap(Key::new(b"log", &12u64.to_be_bytes()), None, Some(b"12"))
                .expect("cas");
            for n in [1, 9, 12] {
                assert!(
                    conflicts(&*store, n),
                    "{engine}: key {n} written, not found"
                );
            }
            store.sync().expect("sync");
        }
        let store = open(dir.path(), options(Durability::Manual)).expect("reopen");
        for n in [12, 9, 1] {
            assert!(
                conflicts(&*store, n),
                "{engine}: key {n} lost its conflict on reopen"
            );
        }
        assert!(!conflicts(&*store, 13), "{engine}: a new key conflicted");
        assert!(
            !conflicts(&*store, 5),
            "{engine}: a key below the highest conflicted"
        );
    }
}

/// `first_present` of the big-endian keys `ns` of `partition`.
fn first_present_of(store: &dyn KvStore, partition: &[u8], ns: &[u64]) -> Option<usize> {
    let keys: Vec<[u8; 8]> = ns.iter().map(|n| n.to_be_bytes()).collect();
    let keys: Vec<Key<'_>> = keys.iter().map(|k| Key::new(partition, k)).collect();
    store.first_present(&keys).expect("first_present")
}

#[test]
fn announcing_inserts_changes_no_answer() {
    let key = |n: u64| n.to_be_bytes();
    for (engine, open) in engines() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let store = open(dir.path(), options(Durability::Manual)).expect("open");
        let first = |partition: &[u8], ns: &[u64]| first_present_of(&*store, partition, ns);
        for n in 1..=10 {
            store.put(Key::new(b"block1", &key(n)), b"x").expect("put");
        }
        store
            .expect_inserts(&[b"block1", b"block2"])
            .expect("expect_inserts");
        assert_eq!(
            first(b"block1", &[11, 12]),
            None,
            "{engine}: above the highest"
        );
        assert_eq!(
            first(b"block1", &[11, 4]),
            Some(1),
            "{engine}: a stored key"
        );
        assert_eq!(
            first(b"block2", &[1, 2]),
            None,
            "{engine}: an empty partition"
        );
        store.put(Key::new(b"block2", &key(2)), b"x").expect("put");
        assert_eq!(
            first(b"block2", &[1, 2]),
            Some(1),
            "{engine}: a key written after the announcement"
        );
        let mut batch = WriteBatch::new();
        batch.insert_if_absent(Key::new(b"block2", &key(2)), b"y");
        assert!(
            matches!(
                store.write(&batch),
                Err(WriteError::Conflict { index: 0, .. })
            ),
            "{engine}: an insert onto a key written after the announcement"
        );
    }
}

#[test]
fn first_present_finds_every_stored_key_whatever_the_bounds_learned() {
    let key = |n: u64| n.to_be_bytes();
    for (engine, open) in engines() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let store = open(dir.path(), options(Durability::Manual)).expect("open");
        let first = |ns: &[u64]| first_present_of(&*store, b"wlog", ns);
        for n in 1..=10 {
            store.put(Key::new(b"wlog", &key(n)), b"x").expect("put");
        }
        // Asked twice: the second visit learns the partition's bound (10).
        for _ in 0..2 {
            assert_eq!(first(&[11, 12]), None, "{engine}: keys above the highest");
            assert_eq!(
                first(&[11, 5, 3]),
                Some(1),
                "{engine}: a stored key below it"
            );
        }
        // Writes after the bound was learned raise it; deletes leave keys below it absent.
        store.put(Key::new(b"wlog", &key(20)), b"x").expect("put");
        store.delete(Key::new(b"wlog", &key(5))).expect("delete");
        assert_eq!(
            first(&[15, 20]),
            Some(1),
            "{engine}: a key written after learning"
        );
        assert_eq!(
            first(&[5, 21]),
            None,
            "{engine}: a deleted key and one above"
        );
        assert_eq!(
            first(&[21, 3]),
            Some(1),
            "{engine}: an old key after the new bound"
        );
        assert_eq!(first(&[]), None, "{engine}: no keys");
        let other: Vec<Key<'_>> = vec![Key::new(b"records", &[1])];
        assert_eq!(
            store.first_present(&other).expect("first_present"),
            None,
            "{engine}: another partition"
        );
    }
}

#[test]
fn a_second_open_in_the_same_process_is_locked_out() {
    for (engine, open) in engines() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let first = open(dir.path(), options(Durability::Sync)).expect("first open");
        match open(dir.path(), options(Durability::Sync)) {
            Err(OpenError::Locked { path }) => assert_eq!(path, dir.path(), "{engine}"),
            Err(other) => panic!("{engine}: expected Locked, got {other}"),
            Ok(_) => panic!("{engine}: a data directory opened twice"),
        }
        drop(first);
        open(dir.path(), options(Durability::Sync)).expect("open after close");
    }
}

#[test]
fn group_commit_delay_out_of_range_is_refused() {
    for (engine, open) in engines() {
        let dir = tempfile::tempdir().expect("temporary directory");
        for max_delay in [Duration::ZERO, monoseq_kv::GROUP_COMMIT_DELAY_MAX * 2] {
            let refused = open(dir.path(), options(Durability::GroupCommit { max_delay }));
            assert!(
                matches!(refused, Err(OpenError::InvalidOption(_))),
                "{engine}: max_delay {max_delay:?} accepted"
            );
        }
    }
}

#[test]
fn sync_from_many_threads_at_once_succeeds() {
    for (engine, open) in engines() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let store: std::sync::Arc<dyn KvStore> = open(
            dir.path(),
            options(Durability::GroupCommit {
                max_delay: Duration::from_millis(50),
            }),
        )
        .expect("open")
        .into();
        let threads: Vec<_> = (0..4u8)
            .map(|t| {
                let store = std::sync::Arc::clone(&store);
                std::thread::spawn(move || {
                    for n in 0..20u64 {
                        store
                            .put(Key::new(&[t], &n.to_be_bytes()), b"v")
                            .expect("put");
                        store.sync().expect("sync");
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().expect("writer");
        }
        for t in 0..4u8 {
            assert_eq!(count(&*store, &[t]), 20, "{engine}");
        }
    }
}

/// fjall recovers its sequence number from its journal only; a directory whose journal was
/// deleted after a clean shutdown (its table files hold everything) must still be read whole
/// by everything that reads at the visible sequence number (a backup's snapshot, fjall's full
/// iteration), and a write after the reopen must be newer than the entries it overwrites.
#[cfg(feature = "fjall")]
#[test]
fn a_fjall_directory_without_its_journal_is_read_whole_and_written_after() {
    use monoseq_kv::FjallStore;
    let dir = tempfile::tempdir().expect("temporary directory");
    let live = dir.path().join("live");
    let store = FjallStore::open(&live, options(Durability::Sync)).expect("open");
    for i in 0u32..200 {
        store
            .put(Key::new(b"p", &i.to_be_bytes()), b"old")
            .expect("put");
    }
    store.flush_memtables().expect("flush the memtable");
    drop(store);
    for entry in std::fs::read_dir(&live).expect("list") {
        let path = entry.expect("entry").path();
        if path.extension().is_some_and(|e| e == "jnl") {
            std::fs::remove_file(path).expect("delete the journal");
        }
    }
    let store = FjallStore::open(&live, options(Durability::Sync)).expect("reopen");
    assert_eq!(count(&store, b"p"), 200, "a scan sees every entry");
    let copied = store.copy_to(&dir.path().join("copy")).expect("copy");
    assert_eq!(copied.keys, 200, "a snapshot sees every entry");
    store
        .put(Key::new(b"p", &7u32.to_be_bytes()), b"new")
        .expect("overwrite");
    let copied = store.copy_to(&dir.path().join("copy2")).expect("copy");
    assert_eq!(copied.keys, 200);
    drop(store);
    let copy = FjallStore::open(dir.path().join("copy2"), options(Durability::Sync)).expect("open");
    assert_eq!(
        copy.get(Key::new(b"p", &7u32.to_be_bytes())).expect("get"),
        Some(b"new".to_vec()),
        "the write after the reopen is newer than the entry it overwrote"
    );
}
