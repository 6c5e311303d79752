//! The embedded engine's journal files, as the vendored fjall writes them
//! (`vendor/fjall/PATCHES.md`, "Journal files written before they are used"): the next journal
//! is zero-filled ahead of its rotation, so the journal writers sync never allocates. Unix only
//! (allocated blocks come from `st_blocks`).
#![cfg(all(feature = "fjall", unix))]

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use fjall::{Database, KeyspaceCreateOptions, PersistMode};

/// Length of a new journal file (fjall's `PRE_ALLOCATED_BYTES`).
const JOURNAL_BYTES: u64 = 64 * 1024 * 1024;
/// Longest wait for the background thread to prepare a journal file: far above what it
/// needs (64 MiB written), only so a broken build fails instead of hanging.
const PREPARE_WAIT_MAX: Duration = Duration::from_secs(120);

/// The directory's files whose names end in `suffix`, sorted.
fn files_ending(dir: &Path, suffix: &str) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("the database's directory lists")
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|path| path.to_string_lossy().ends_with(suffix))
        .collect();
    found.sort();
    found
}

/// The active journal: the `.jnl` file of the highest number.
fn active_journal(dir: &Path) -> PathBuf {
    files_ending(dir, ".jnl")
        .into_iter()
        .max_by_key(|path| {
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            name.trim_end_matches(".jnl").parse::<u64>().unwrap_or(0)
        })
        .expect("the database has a journal")
}

/// Bytes of `path` backed by blocks on disk.
fn allocated(path: &Path) -> u64 {
    std::fs::metadata(path).expect("the file exists").blocks() * 512
}

/// Waits until the next journal's prepared file is there; its path.
fn wait_prepared(dir: &Path) -> PathBuf {
    let began = Instant::now();
    loop {
        if let Some(ready) = files_ending(dir, ".jnl.zeroed").pop() {
            return ready;
        }
        assert!(
            began.elapsed() < PREPARE_WAIT_MAX,
            "no prepared journal file appeared in {PREPARE_WAIT_MAX:?}: {:?}",
            std::fs::read_dir(dir).map(|d| d.count())
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Bytes that do not compress (the journal may compress large values).
fn incompressible(len: usize) -> Vec<u8> {
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

/// Inserts `count` values of 256 KiB under keys from `first`, syncs the journal and flushes
/// the memtable (a flush is where fjall rotates the journal).
fn write_and_flush(db: &Database, tree: &fjall::Keyspace, first: u32, count: u32) {
    let value = incompressible(256 * 1024);
    for key in first..first + count {
        tree.insert(key.to_be_bytes(), &value).expect("an insert");
    }
    db.persist(PersistMode::SyncData)
        .expect("the journal syncs");
    tree.rotate_memtable_and_wait()
        .expect("the memtable is flushed");
}

#[test]
fn the_journal_a_rotation_opens_is_written_whole_before_its_first_batch() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let db = Database::builder(dir.path())
        .open()
        .expect("a new database opens");
    let tree = db
        .keyspace("logs", KeyspaceCreateOptions::default)
        .expect("a keyspace opens");
    let first = active_journal(dir.path());

    // A small journal prepares nothing; one past 8 MiB of batches starts preparing.
    write_and_flush(&db, &tree, 0, 4);
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        files_ending(dir.path(), ".zeroing").is_empty()
            && files_ending(dir.path(), ".zeroed").is_empty(),
        "a 1 MiB journal started a preparation"
    );
    write_and_flush(&db, &tree, 4, 36);
    let ready = wait_prepared(dir.path());
    assert_eq!(
        std::fs::metadata(&ready).expect("prepared file").len(),
        JOURNAL_BYTES
    );
    assert!(
        allocated(&ready) >= JOURNAL_BYTES,
        "the prepared file has holes: {} of {JOURNAL_BYTES} bytes allocated",
        allocated(&ready)
    );

    // Past half a journal, the next flush rotates it first.
    write_and_flush(&db, &tree, 40, 100);
    let active = active_journal(dir.path());
    assert_ne!(active, first, "the journal rotated");
    assert!(!ready.exists(), "the rotation took the prepared file");
    assert!(
        allocated(&active) >= JOURNAL_BYTES,
        "the active journal is sparse: {} of {} bytes allocated, so every sync of its \
         batches allocates blocks",
        allocated(&active),
        std::fs::metadata(&active).expect("journal").len()
    );

    // Batches written into the prepared file are recovered.
    tree.insert(b"after", b"rotation").expect("an insert");
    db.persist(PersistMode::SyncData)
        .expect("the journal syncs");
    drop(tree);
    drop(db);
    let db = Database::builder(dir.path())
        .open()
        .expect("the database reopens");
    let tree = db
        .keyspace("logs", KeyspaceCreateOptions::default)
        .expect("the keyspace opens");
    assert_eq!(
        tree.get(b"after").expect("a read").as_deref(),
        Some(&b"rotation"[..])
    );
    assert_eq!(
        tree.get(139_u32.to_be_bytes()).expect("a read").as_deref(),
        Some(&incompressible(256 * 1024)[..])
    );
}

/// Least time a journal file's preparation takes with its pauses (64 pieces of 1 MiB, 20 ms
/// between two), with room for a first piece written before the watcher saw the file.
const PREPARE_PACED_MIN: Duration = Duration::from_secs(1);

#[test]
fn a_journal_file_is_prepared_in_paced_pieces_not_in_one_burst() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (db, tree) = open_logs(dir.path());
    // Watches the preparation from beside it: when its file first appears, the sizes it
    // passes through, and when it is whole.
    let watched = dir.path().to_path_buf();
    let watcher = std::thread::spawn(move || {
        let began = Instant::now();
        let mut first_seen = None;
        let mut sizes = std::collections::BTreeSet::new();
        while began.elapsed() < PREPARE_WAIT_MAX {
            if let Some(ready) = files_ending(&watched, ".jnl.zeroed").pop() {
                return (first_seen, Instant::now(), sizes, ready);
            }
            if let Some(partial) = files_ending(&watched, ".jnl.zeroing").pop()
                && let Ok(meta) = std::fs::metadata(&partial)
            {
                first_seen.get_or_insert_with(Instant::now);
                sizes.insert(meta.len());
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        panic!("no prepared journal file appeared in {PREPARE_WAIT_MAX:?}");
    });
    write_and_flush(&db, &tree, 0, 40);
    let (first_seen, whole_at, sizes, ready) = watcher.join().expect("the watcher ends");
    let first_seen = first_seen.expect("the file being prepared was seen before it was whole");
    let took = whole_at.saturating_duration_since(first_seen);
    assert!(
        took >= PREPARE_PACED_MIN,
        "the 64 MiB journal file was prepared in {took:?}: in a burst that every other \
         file's sync queues behind, not paced"
    );
    assert!(
        sizes.len() >= 16,
        "the prepared file grew in {} steps ({sizes:?}): not in pieces of 1 MiB",
        sizes.len()
    );
    assert_eq!(
        std::fs::metadata(&ready).expect("prepared file").len(),
        JOURNAL_BYTES
    );
}

#[test]
fn a_half_prepared_journal_file_is_removed_at_open_and_prepared_again() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    {
        let db = Database::builder(dir.path())
            .open()
            .expect("a new database opens");
        let tree = db
            .keyspace("logs", KeyspaceCreateOptions::default)
            .expect("a keyspace opens");
        tree.insert(b"k", b"v").expect("an insert");
    }
    // What a crash while preparing leaves: a partial file, and a prepared one for a journal
    // no rotation will open.
    for stale in ["1000.jnl.zeroing", "999.jnl.zeroed"] {
        std::fs::write(dir.path().join(stale), [1_u8; 4096]).expect("a stale file");
    }
    let db = Database::builder(dir.path())
        .open()
        .expect("the database reopens");
    let tree = db
        .keyspace("logs", KeyspaceCreateOptions::default)
        .expect("the keyspace opens");
    assert_eq!(tree.get(b"k").expect("a read").as_deref(), Some(&b"v"[..]));
    assert!(!dir.path().join("1000.jnl.zeroing").exists());
    assert!(!dir.path().join("999.jnl.zeroed").exists());
    write_and_flush(&db, &tree, 0, 40);
    let ready = wait_prepared(dir.path());
    assert_eq!(
        std::fs::metadata(&ready).expect("prepared file").len(),
        JOURNAL_BYTES
    );
}

/// Opens the database in `dir` with its keyspace "logs".
fn open_logs(dir: &Path) -> (Database, fjall::Keyspace) {
    let db = Database::builder(dir).open().expect("the database opens");
    let tree = db
        .keyspace("logs", KeyspaceCreateOptions::default)
        .expect("the keyspace opens");
    (db, tree)
}

/// Inserts keys `first..first + count` (small values) and syncs the journal.
fn write_synced(db: &Database, tree: &fjall::Keyspace, first: u32, count: u32) {
    for key in first..first + count {
        tree.insert(key.to_be_bytes(), key.to_le_bytes())
            .expect("an insert");
    }
    db.persist(PersistMode::SyncData)
        .expect("the journal syncs");
}

/// The replay counts the journal's bytes itself (`vendor/fjall/PATCHES.md`, "The journal's
/// position counted, not asked of the file"): a torn entry at its end (a crash mid-write) is
/// cut exactly where the last whole one ended, so what is written after the recovery follows
/// it and is recovered at the next open, with everything before.
#[test]
fn a_torn_journal_entry_is_cut_at_open_and_batches_written_after_it_are_recovered() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (db, tree) = open_logs(dir.path());
    write_synced(&db, &tree, 0, 500);
    drop((tree, db));
    // A replay cuts the journal where its entries end (its zeros after them too).
    drop(open_logs(dir.path()));
    let journal = active_journal(dir.path());
    let bytes = std::fs::read(&journal).expect("the journal reads");
    assert!(
        bytes.len() > 16 && bytes[bytes.len() - 1] != 0,
        "the journal ends at its last entry ({} bytes)",
        bytes.len()
    );
    // A torn entry: the first 7 bytes of the journal's first one (its start, cut inside its
    // sequence number), appended.
    let torn = bytes[..7].to_vec();
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .open(&journal)
        .expect("the journal opens");
    std::io::Write::write_all(&mut file, &torn).expect("appended");
    drop(file);

    let (db, tree) = open_logs(dir.path());
    assert_eq!(
        std::fs::metadata(&journal).expect("the journal").len(),
        bytes.len() as u64,
        "the torn entry was cut where the last whole entry ended"
    );
    write_synced(&db, &tree, 500, 500);
    drop((tree, db));
    let (_db, tree) = open_logs(dir.path());
    for key in [0_u32, 499, 500, 999] {
        assert_eq!(
            tree.get(key.to_be_bytes()).expect("a read").as_deref(),
            Some(&key.to_le_bytes()[..]),
            "key {key} recovered"
        );
    }
}
