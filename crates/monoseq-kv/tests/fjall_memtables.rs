//! Flushed memtables, as the vendored fjall frees them (`vendor/fjall/PATCHES.md`, "Flushed
//! memtables freed outside the version lock"): the version history's maintenance, which holds
//! the lock every read and write of the keyspace takes, never frees one; the next rotation, or
//! the flush worker after the flush that rotation queued, frees it after releasing its locks.
#![cfg(feature = "fjall")]

use std::sync::Arc;

use fjall::{AbstractTree, Database, KeyspaceCreateOptions};

#[test]
fn a_flushed_memtable_is_freed_by_the_next_rotation_not_under_the_version_lock() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let db = Database::builder(dir.path())
        .open()
        .expect("a new database opens");
    let tree = db
        .keyspace("kv", KeyspaceCreateOptions::default)
        .expect("a keyspace opens");
    for key in 0u32..1_000 {
        tree.insert(key.to_be_bytes(), [7u8; 100])
            .expect("an insert");
    }
    let first = Arc::downgrade(&tree.tree.active_memtable());
    tree.rotate_memtable_and_wait()
        .expect("the memtable is rotated and flushed");
    for key in 1_000u32..1_010 {
        tree.insert(key.to_be_bytes(), [7u8; 100])
            .expect("an insert");
    }

    // What a rotation's maintenance does, with the lock held: drop every version older than
    // the latest. None of them may free the flushed memtable there.
    let retired = tree
        .tree
        .get_version_history_lock()
        .maintenance(tree.path(), u64::MAX)
        .expect("the version history's maintenance");
    drop(retired);
    assert!(
        first.upgrade().is_some(),
        "the version maintenance freed the flushed memtable while holding the version lock"
    );

    // The next rotation, or the flush after it once it dropped the versions that rotation
    // retired, frees it, with no lock held.
    tree.rotate_memtable_and_wait()
        .expect("the memtable is rotated and flushed");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while first.upgrade().is_some() {
        assert!(
            std::time::Instant::now() < deadline,
            "a flushed memtable no version refers to is still held after the next rotation and flush"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    for key in 0u32..1_010 {
        assert!(
            tree.get(key.to_be_bytes()).expect("a read").is_some(),
            "key {key} is lost"
        );
    }
}
