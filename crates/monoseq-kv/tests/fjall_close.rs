//! Closing the embedded engine while it merges tables, as the vendored fjall does it
//! (`vendor/fjall/PATCHES.md`, "A merge under way abandoned at close").
#![cfg(feature = "fjall")]

use std::time::{Duration, Instant};

use fjall::{Database, Keyspace, KeyspaceCreateOptions};

/// Keys of each level-0 table; every table holds all of them, so the tables must be merged.
const KEYS: u32 = 60_000;
/// Level-0 tables that start a merge under fjall's default leveled compaction.
const TABLES: usize = 4;

/// The value `round` wrote for every key: the round first, then filler.
fn value(round: u32) -> [u8; 96] {
    let mut v = [7_u8; 96];
    v[..4].copy_from_slice(&round.to_le_bytes());
    v
}

/// How many table files the keyspace's folder holds (those of its tables, and any a merge is
/// writing).
fn table_files(keyspace: &Keyspace) -> usize {
    std::fs::read_dir(keyspace.path().join("tables")).map_or(0, Iterator::count)
}

/// A database dropped while a merge is writing its output must not wait for the merge to end
/// (seconds to minutes on a large level, while the server has already said it stopped) nor
/// install the part it wrote (which would replace every input table and lose the rest): the
/// merge is abandoned, its inputs kept whole, and done again after the next open.
#[test]
fn closing_the_database_abandons_a_merge_under_way_and_keeps_every_key() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let db = Database::builder(dir.path())
        .worker_threads(2)
        .open()
        .expect("a new database opens");
    let tree = db
        .keyspace("logs", KeyspaceCreateOptions::default)
        .expect("a keyspace opens");
    let mut last = 0;
    for round in 0_u32..12 {
        for key in 0..KEYS {
            tree.insert(key.to_be_bytes(), value(round))
                .expect("an insert");
        }
        tree.rotate_memtable_and_wait()
            .expect("the memtable is flushed");
        last = round;
        if tree.l0_table_count() >= TABLES {
            break;
        }
    }
    assert_eq!(
        tree.l0_table_count(),
        TABLES,
        "level 0 holds the tables written"
    );

    // The merge is under way once its first output file sits beside the tables the tree
    // holds (the first flush's table was moved below level 0, so they are one more).
    let held = tree.table_count();
    let deadline = Instant::now() + Duration::from_secs(60);
    while table_files(&tree) <= held && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(
        table_files(&tree) > held && tree.l0_table_count() == TABLES,
        "no merge of the {TABLES} tables was seen writing within a minute"
    );
    let closing = Instant::now();
    drop(tree);
    drop(db);
    let took = closing.elapsed();
    eprintln!("the database closed in {took:?} while merging");

    // Opened again without workers, so nothing merges meanwhile.
    let db = Database::builder(dir.path())
        .worker_threads_unchecked(0)
        .open()
        .expect("the database opens again");
    let tree = db
        .keyspace("logs", KeyspaceCreateOptions::default)
        .expect("the keyspace opens again");
    for key in 0..KEYS {
        let got = tree
            .get(key.to_be_bytes())
            .expect("a read")
            .unwrap_or_else(|| {
                panic!("key {key} was lost: the part of a merge written before close was installed")
            });
        assert_eq!(
            got[..4],
            last.to_le_bytes(),
            "key {key} holds an older value than the last written"
        );
    }
    assert_eq!(
        tree.l0_table_count(),
        TABLES,
        "the merge under way at close replaced its input tables (finished, or installed as far \
         as it got, before the database closed in {took:?}) instead of being abandoned"
    );
    assert_eq!(
        table_files(&tree),
        held,
        "the abandoned merge's output files were not removed at the open after it"
    );
}
