//! fjall's key-value separation in the embedded engine (`docs/format.md`, "The embedded engine's
//! files"): a new data directory stores values of `KV_SEPARATION_BYTES` and more (events) in
//! blob files and the rest (WLog entries, numbers, small records) in its tables; a directory
//! created without separation keeps its tables as they are. Either reopens and reads back every
//! value, by point reads and by scans.
#![cfg(feature = "fjall")]

use std::ops::{Bound, ControlFlow};
use std::path::Path;

use fjall::config::CompressionPolicy;
use fjall::{CompressionType, Database, KeyspaceCreateOptions, PersistMode};
use monoseq_kv::{FjallStore, Key, KvStore, Options, Order, WriteBatch};

/// Values per kind written: enough to fill several data blocks and blob file entries.
const VALUES: u64 = 3_000;
/// The partition of the event-sized values, and of the small ones.
const EVENTS: &[u8] = b"\x01\x01\x03\x00";
const SMALL: &[u8] = b"\x02\x01\x07\x00";

/// An event-sized value (about 120 bytes, as an encoded event): above the threshold.
fn event(n: u64) -> Vec<u8> {
    format!("event {n:>8}: bench.Create bench.Arg {{\"doc\":{n}}} bench.Doc n={n} {:>40}", "")
        .into_bytes()
}

/// A WLog-entry-sized value (16 bytes): below the threshold.
fn small(n: u64) -> Vec<u8> {
    format!("wlog {n:>11}").into_bytes()
}

fn clustering(n: u64) -> [u8; 8] {
    n.to_be_bytes()
}

fn write(store: &FjallStore, from: u64, to: u64) {
    for chunk in (from..to).collect::<Vec<_>>().chunks(500) {
        let (events, smalls): (Vec<_>, Vec<_>) = chunk.iter().map(|&n| (event(n), small(n))).unzip();
        let keys: Vec<_> = chunk.iter().map(|&n| clustering(n)).collect();
        let mut batch = WriteBatch::new();
        for (i, c) in keys.iter().enumerate() {
            batch.insert_if_absent(Key::new(EVENTS, c), &events[i]);
            batch.put(Key::new(SMALL, c), &smalls[i]);
        }
        store.write(&batch).expect("a batch is written");
    }
}

/// Every value of `0..to` reads back: by point reads, and by a scan of each partition.
fn check(store: &FjallStore, to: u64) {
    for n in 0..to {
        let c = clustering(n);
        assert_eq!(store.get(Key::new(EVENTS, &c)).expect("get"), Some(event(n)), "event {n}");
        assert_eq!(store.get(Key::new(SMALL, &c)).expect("get"), Some(small(n)), "small {n}");
    }
    for (partition, value) in [(EVENTS, event as fn(u64) -> Vec<u8>), (SMALL, small)] {
        let mut seen = 0u64;
        store
            .scan(partition, Bound::Unbounded, Bound::Unbounded, Order::Ascending, &mut |c, v| {
                assert_eq!(c, clustering(seen), "scan order");
                assert_eq!(v, value(seen), "scanned value {seen}");
                seen += 1;
                ControlFlow::Continue(())
            })
            .expect("scan");
        assert_eq!(seen, to, "values scanned");
    }
}

/// Bytes in the keyspace's blob files (values stored apart from their keys).
fn blob_bytes(dir: &Path) -> u64 {
    let Ok(keyspaces) = std::fs::read_dir(dir.join("keyspaces")) else {
        return 0;
    };
    keyspaces
        .filter_map(Result::ok)
        .filter_map(|keyspace| std::fs::read_dir(keyspace.path().join("blobs")).ok())
        .flatten()
        .filter_map(Result::ok)
        .filter_map(|file| file.metadata().ok())
        .map(|meta| meta.len())
        .sum()
}

#[test]
fn a_new_directory_stores_events_apart_and_reads_them_back() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let store = FjallStore::open(dir.path(), Options::default()).expect("open");
    write(&store, 0, VALUES);
    store.flush_memtables().expect("flush");
    let blobs = blob_bytes(dir.path());
    let events_bytes: u64 = (0..VALUES).map(|n| event(n).len() as u64).sum();
    assert!(
        blobs >= events_bytes / 2,
        "the events went to blob files: {blobs} bytes there, {events_bytes} bytes of events"
    );
    assert!(
        blobs < events_bytes * 2,
        "the small values stayed in the tables: {blobs} bytes in blob files"
    );
    check(&store, VALUES);
    drop(store);

    let store = FjallStore::open(dir.path(), Options::default()).expect("reopen");
    check(&store, VALUES);
    write(&store, VALUES, 2 * VALUES);
    store.flush_memtables().expect("flush");
    assert!(blob_bytes(dir.path()) > blobs, "the reopened keyspace still separates");
    drop(store);
    let store = FjallStore::open(dir.path(), Options::default()).expect("reopen");
    check(&store, 2 * VALUES);
}

/// Creates `dir` as a build before separation did: the keyspace `kv` with LZ4 data blocks and
/// 32 MiB memtables, nothing stored apart; the values written through fjall with the engine's
/// key layout (`len:be16 ‖ partition ‖ clustering`) and flushed to a table.
fn create_unseparated(dir: &Path) {
    let db = Database::builder(dir)
        .journal_compression(CompressionType::None)
        .open()
        .expect("create the database");
    let kv = db
        .keyspace("kv", || {
            KeyspaceCreateOptions::default()
                .data_block_compression_policy(CompressionPolicy::all(CompressionType::Lz4))
                .max_memtable_size(32 * 1024 * 1024)
        })
        .expect("create the keyspace");
    let key = |partition: &[u8], n: u64| {
        let len = u16::try_from(partition.len()).expect("a short partition");
        [&len.to_be_bytes()[..], partition, &clustering(n)].concat()
    };
    for n in 0..VALUES {
        kv.insert(key(EVENTS, n), event(n)).expect("insert");
        kv.insert(key(SMALL, n), small(n)).expect("insert");
    }
    db.persist(PersistMode::SyncAll).expect("persist");
    kv.rotate_memtable_and_wait().expect("flush");
}

#[test]
fn a_directory_created_without_separation_opens_as_it_is() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    create_unseparated(dir.path());
    assert_eq!(blob_bytes(dir.path()), 0, "created without blob files");

    let store = FjallStore::open(dir.path(), Options::default()).expect("open");
    check(&store, VALUES);
    write(&store, VALUES, 2 * VALUES);
    store.flush_memtables().expect("flush");
    assert_eq!(blob_bytes(dir.path()), 0, "the keyspace keeps its own settings");
    drop(store);

    let store = FjallStore::open(dir.path(), Options::default()).expect("reopen");
    check(&store, 2 * VALUES);
}
