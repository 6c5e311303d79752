//! Data written by an earlier version still opens and reads the same: each embedded engine has
//! a data directory in `tests/fixtures/<engine>-v1`, written by [`write_content`] when the
//! key layout (see `src/encoding.rs`) was first fixed. A change of the key layout or of an
//! engine's file format fails here first. `MONOSEQ_KV_WRITE_FIXTURES=1` rewrites the fixtures
//! (only for a deliberate format change, together with a migration).

use std::ops::{Bound, ControlFlow};
use std::path::{Path, PathBuf};

use monoseq_kv::{Durability, Key, KvStore, OpenError, Options, Order, WriteBatch};

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

fn fixture_dir(engine: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(format!("{engine}-v1"))
}

/// Entries of the fixture: two partitions (one a prefix of the other), empty partition and
/// clustering keys, an empty value and a deleted key.
fn write_content(store: &dyn KvStore) {
    let mut batch = WriteBatch::new();
    for n in 0..20u64 {
        batch.put(
            Key::new(b"plog/a/0", &n.to_be_bytes()),
            format!("event {n}").as_bytes(),
        );
    }
    batch
        .put(Key::new(b"plog/a", b""), b"prefix partition")
        .put(Key::new(b"", b"empty"), b"")
        .insert_if_absent(Key::new(b"records", &[0xff, 0xff]), b"last")
        .put(Key::new(b"gone", b"x"), b"deleted below");
    store.write(&batch).expect("write fixture");
    store.delete(Key::new(b"gone", b"x")).expect("delete");
    store.sync().expect("sync fixture");
}

fn check_content(store: &dyn KvStore, engine: &str) {
    let mut log = Vec::new();
    store
        .scan(
            b"plog/a/0",
            Bound::Unbounded,
            Bound::Unbounded,
            Order::Ascending,
            &mut |c, v| {
                log.push((c.to_vec(), v.to_vec()));
                ControlFlow::Continue(())
            },
        )
        .expect("scan");
    let expected: Vec<_> = (0..20u64)
        .map(|n| (n.to_be_bytes().to_vec(), format!("event {n}").into_bytes()))
        .collect();
    assert_eq!(log, expected, "{engine}: PLog-like partition");
    let got = store
        .get_many(&[
            Key::new(b"plog/a", b""),
            Key::new(b"", b"empty"),
            Key::new(b"records", &[0xff, 0xff]),
            Key::new(b"gone", b"x"),
        ])
        .expect("get_many");
    assert_eq!(
        got,
        vec![
            Some(b"prefix partition".to_vec()),
            Some(Vec::new()),
            Some(b"last".to_vec()),
            None
        ],
        "{engine}: point reads"
    );
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("create directory");
    for entry in std::fs::read_dir(from).expect("read fixture directory") {
        let entry = entry.expect("fixture entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("file type").is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).expect("copy fixture file");
        }
    }
}

/// fjall preallocates its journal with zeros; the fixture keeps only the written part.
fn trim_preallocated_journals(dir: &Path) {
    for entry in std::fs::read_dir(dir).expect("fixture directory").flatten() {
        if entry.path().extension().is_some_and(|e| e == "jnl") {
            let bytes = std::fs::read(entry.path()).expect("read journal");
            let used = bytes.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
            let file = std::fs::OpenOptions::new()
                .write(true)
                .open(entry.path())
                .expect("open journal");
            file.set_len(used as u64).expect("trim journal");
        }
    }
}

#[test]
fn data_written_by_the_first_layout_still_reads_the_same() {
    let options = Options::default()
        .durability(Durability::Sync)
        .cache_bytes(1 << 20);
    for (engine, open) in engines() {
        let fixture = fixture_dir(engine);
        if std::env::var_os("MONOSEQ_KV_WRITE_FIXTURES").is_some() {
            let _ = std::fs::remove_dir_all(&fixture);
            let store = open(&fixture, options).expect("create fixture");
            write_content(&*store);
            drop(store);
            trim_preallocated_journals(&fixture);
        }
        // Opening may write (recovery, compaction): work on a copy.
        let dir = tempfile::tempdir().expect("temporary directory");
        copy_dir(&fixture, dir.path());
        let store = open(dir.path(), options).expect("open fixture copy");
        check_content(&*store, engine);
    }
}
