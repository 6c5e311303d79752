//! The settings a new data directory's embedded engine is created with, held by what the
//! engine does:
//!
//! - it reads its tables' Bloom filters in small partitions: a point read of a key no table
//!   holds, after a restart (nothing cached), loads a few KiB of the filter of the table the key
//!   may be in, never the table's whole filter, whose size grows with the table (3.7 MiB each
//!   on a 4 GiB store, where a restarted server's first seconds once read 4.0–5.1 GB of table
//!   blocks);
//! - it merges flushed tables into level 1 only once [`COMPACTION_LEVEL0_TABLES`] of them wait
//!   (each such merge rewrites level 1, which every flushed table of the server's keys
//!   overlaps).
#![cfg(feature = "fjall")]

use std::time::{Duration, Instant};

use monoseq_kv::{
    BlockReads, COMPACTION_LEVEL0_TABLES, Durability, FjallStore, Key, KvStore, Options, WriteBatch,
};

/// Keys per flushed table: its whole filter (10 bits a key) is then about 25 KiB.
const KEYS_PER_TABLE: u32 = 20_000;
/// Flushed tables that overlap: the engine moves the first to its last level as it is, then
/// merges (rewrites) the next ones into it once [`COMPACTION_LEVEL0_TABLES`] wait in level 0.
const TABLES: u32 = COMPACTION_LEVEL0_TABLES as u32 + 1;
/// The most bytes one filter read may load: one partition (4 KiB) and its block's framing.
const FILTER_READ_BYTES_MAX: u64 = 8 << 10;

fn options() -> Options {
    Options::default()
        .durability(Durability::Manual)
        .cache_bytes(4 << 20)
}

fn filters(store: &FjallStore) -> BlockReads {
    store
        .engine_stats()
        .expect("the embedded engine reports its statistics")
        .filter_blocks
}

/// Key `n` of the test: every table holds the keys `n ≡ table (mod TABLES)` of one range, so
/// all of them overlap and the engine must merge (rewrite) them, not move them.
fn key(n: u32) -> [u8; 8] {
    let mut k = [0u8; 8];
    k[..4].copy_from_slice(&n.to_be_bytes());
    k[4..].copy_from_slice(b"data");
    k
}

/// Writes table `table` of the test and flushes it: the keys `n ≡ table (mod TABLES)`, even
/// numbers only (the odd ones are the absent keys read below).
fn write_table(store: &FjallStore, table: u32) {
    let mut batch = WriteBatch::new();
    for i in 0..KEYS_PER_TABLE {
        let n = 2 * (i * TABLES + table);
        batch.put(Key::new(b"wlog", &key(n)), &n.to_le_bytes());
    }
    store.write(&batch).expect("a batch is written");
    store.flush_memtables().expect("the memtable is flushed");
}

#[test]
fn flushed_tables_wait_in_level_0_until_sixteen_can_be_merged_into_level_1_at_once() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let store = FjallStore::open(dir.path(), options()).expect("a new store opens");
    let stats = || store.engine_stats().expect("statistics");
    // The first table is moved to the last level as it is (nothing is below it); the next ones
    // overlap it and wait in level 0 until enough of them are there to merge.
    let waiting = u32::from(COMPACTION_LEVEL0_TABLES) - 1;
    for table in 0..=waiting {
        write_table(&store, table);
    }
    // fjall's default merges at 4 tables: give a merge the time it would take to start and end.
    let quiet = Instant::now() + Duration::from_secs(3);
    while Instant::now() < quiet || stats().compactions_running > 0 {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        stats().level0_tables,
        u64::from(waiting),
        "{waiting} overlapping flushed tables did not wait in level 0 for a merge of {COMPACTION_LEVEL0_TABLES}"
    );
    write_table(&store, waiting + 1);
    let merged = Instant::now() + Duration::from_secs(60);
    while stats().level0_tables > 0 {
        assert!(
            Instant::now() < merged,
            "{COMPACTION_LEVEL0_TABLES} flushed tables in level 0 were left unmerged for 60 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_point_read_after_a_restart_loads_one_filter_partition_not_a_tables_whole_filter() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    {
        let store = FjallStore::open(dir.path(), options()).expect("a new store opens");
        for table in 0..TABLES {
            write_table(&store, table);
        }
        let merged = Instant::now() + Duration::from_secs(60);
        while store.engine_stats().expect("statistics").level0_tables > 0 {
            assert!(
                Instant::now() < merged,
                "the engine left {TABLES} overlapping flushed tables unmerged for 60 s"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    let store = FjallStore::open(dir.path(), options()).expect("the store opens again");
    let before = filters(&store);
    let reads = 200u32;
    let step = 2 * KEYS_PER_TABLE * TABLES / reads;
    for r in 0..reads {
        let absent = r * step + 1;
        assert_eq!(
            store.get(Key::new(b"wlog", &key(absent))).expect("a read"),
            None,
            "key {absent} was never written"
        );
    }
    let after = filters(&store);
    let loaded = after.from_file - before.from_file;
    let bytes = after.file_bytes - before.file_bytes;
    assert!(
        loaded + after.cached - before.cached > 0,
        "{reads} reads of absent keys consulted no filter read through the cache (filters \
         pinned whole in memory, which grows with the data)"
    );
    assert!(
        loaded > 0,
        "no filter was read from its table file after the restart"
    );
    assert!(
        bytes <= loaded * FILTER_READ_BYTES_MAX,
        "{loaded} filter reads from table files loaded {bytes} bytes, more than \
         {FILTER_READ_BYTES_MAX} each: whole filters, not partitions"
    );
}
