//! Tables a compaction replaced, as the vendored fjall and lsm-tree delete them
//! (`vendor/fjall/PATCHES.md`, "Replaced tables deleted outside the version lock"): the version
//! history's maintenance, which holds the lock every read and write of the keyspace takes,
//! never deletes a table's file; a rotation hands the versions it took out to the flush worker,
//! which deletes the files no version refers to after its next flush.
#![cfg(feature = "fjall")]

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use fjall::{AbstractTree, Database, Keyspace, KeyspaceCreateOptions};

/// A new database in `dir` with its keyspace `kv`; `workers` background workers when given,
/// else fjall's default count.
fn open(dir: &std::path::Path, workers: Option<usize>) -> (Database, Keyspace) {
    let builder = Database::builder(dir);
    let builder = match workers {
        Some(n) => builder.worker_threads_unchecked(n),
        None => builder,
    };
    let db = builder.open().expect("a new database opens");
    let keyspace = db
        .keyspace("kv", KeyspaceCreateOptions::default)
        .expect("a keyspace opens");
    (db, keyspace)
}

/// The names of the keyspace's table files.
fn table_files(keyspace: &Keyspace) -> BTreeSet<String> {
    let tables = keyspace.path().join("tables");
    std::fs::read_dir(&tables)
        .unwrap_or_else(|e| panic!("listing {}: {e}", tables.display()))
        .map(|entry| {
            entry
                .expect("a directory entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect()
}

fn write_range(keyspace: &Keyspace, keys: std::ops::Range<u32>, fill: u8) {
    for key in keys {
        keyspace
            .insert(key.to_be_bytes(), [fill; 100])
            .expect("an insert");
    }
}

/// Two flushed tables merged into one by a compaction; returns the two replaced tables' files.
/// `flush` turns the active memtable into a table.
fn merge_two_tables(keyspace: &Keyspace, flush: impl Fn()) -> BTreeSet<String> {
    write_range(keyspace, 0..2_000, 1);
    flush();
    write_range(keyspace, 1_000..3_000, 2);
    flush();
    let replaced = table_files(keyspace);
    assert_eq!(
        replaced.len(),
        2,
        "two flushes write two tables: {replaced:?}"
    );
    keyspace.major_compact().expect("a major compaction");
    assert!(
        table_files(keyspace).difference(&replaced).count() >= 1,
        "the compaction wrote no table of its own"
    );
    replaced
}

fn assert_every_key_reads_back(keyspace: &Keyspace) {
    for key in 0u32..3_000 {
        let expected = if key < 1_000 { 1 } else { 2 };
        let value = keyspace
            .get(key.to_be_bytes())
            .expect("a read")
            .unwrap_or_else(|| panic!("key {key} is lost"));
        assert_eq!(
            value.as_ref(),
            [expected; 100],
            "key {key} reads a stale value"
        );
    }
}

#[test]
fn a_rotation_takes_replaced_tables_out_of_the_history_without_deleting_their_files() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    // No workers: nothing flushes or drops in the background, so what the rotation itself did
    // with the lock held is what the directory shows afterwards.
    let (_db, keyspace) = open(dir.path(), Some(0));
    let replaced = merge_two_tables(&keyspace, || {
        keyspace
            .tree
            .flush_active_memtable(0)
            .expect("the active memtable is flushed");
    });
    assert!(
        table_files(&keyspace).is_superset(&replaced),
        "precondition: a version before the compaction still holds the replaced tables"
    );

    // A rotation runs the version history's maintenance with its lock held, taking out every
    // version no snapshot needs, among them the last one holding the replaced tables.
    write_range(&keyspace, 3_000..3_010, 3);
    keyspace.rotate_memtable().expect("the memtable is rotated");
    let left = table_files(&keyspace);
    assert!(
        left.is_superset(&replaced),
        "the rotation deleted replaced tables while holding the version lock: {:?} of {replaced:?} are left",
        left.intersection(&replaced).collect::<Vec<_>>()
    );
    assert_every_key_reads_back(&keyspace);
}

#[test]
fn the_flush_worker_deletes_the_replaced_tables_a_rotation_retired() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (_db, keyspace) = open(dir.path(), None);
    let replaced = merge_two_tables(&keyspace, || {
        keyspace
            .rotate_memtable_and_wait()
            .expect("the memtable is rotated and flushed");
    });

    // The rotation retires the versions; the flush it queues is followed by their drop.
    write_range(&keyspace, 3_000..3_010, 3);
    keyspace
        .rotate_memtable_and_wait()
        .expect("the memtable is rotated and flushed");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let left: Vec<String> = table_files(&keyspace)
            .intersection(&replaced)
            .cloned()
            .collect();
        if left.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the replaced tables {left:?} were never deleted after the flush"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_every_key_reads_back(&keyspace);
}
