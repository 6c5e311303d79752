//! The embedded engine reads its tables' Bloom filters in small partitions: a point read of a
//! key no table holds, after a restart (nothing cached), loads a few KiB of the filter of the
//! table the key may be in, never the table's whole filter, whose size grows with the table
//! (3.7 MiB each on a 4 GiB store, where a restarted server's first seconds once read 4.0–5.1
//! GB of table blocks).
#![cfg(feature = "fjall")]

use std::time::{Duration, Instant};

use monoseq_kv::{BlockReads, Durability, FjallStore, Key, KvStore, Options, WriteBatch};

/// Keys per flushed table: its whole filter (10 bits a key) is then about 60 KiB.
const KEYS_PER_TABLE: u32 = 50_000;
/// Flushed tables that overlap: the engine moves the first to its last level as it is, then
/// merges (rewrites) the next four into it once four wait in level 0.
const TABLES: u32 = 5;
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

#[test]
fn a_point_read_after_a_restart_loads_one_filter_partition_not_a_tables_whole_filter() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    {
        let store = FjallStore::open(dir.path(), options()).expect("a new store opens");
        for table in 0..TABLES {
            let mut batch = WriteBatch::new();
            for i in 0..KEYS_PER_TABLE {
                // Even numbers only: the odd ones are the absent keys read below.
                let n = 2 * (i * TABLES + table);
                batch.put(Key::new(b"wlog", &key(n)), &n.to_le_bytes());
            }
            store.write(&batch).expect("a batch is written");
            store.flush_memtables().expect("the memtable is flushed");
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
