//! The embedded engine's background workers, as the vendored fjall runs them
//! (`vendor/fjall/PATCHES.md`). Linux only: thread states come from `/proc`.
#![cfg(all(feature = "fjall", target_os = "linux"))]

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use fjall::{Database, Keyspace, KeyspaceCreateOptions};
use monoseq_kv::{COMPACTION_WORKER_NICE, FjallStore, Options};

/// Held by each test while its database runs, so that the workers a test sees are its own.
static ONE_DATABASE: Mutex<()> = Mutex::new(());

/// This test's turn to run a database ([`ONE_DATABASE`]), and a directory for it.
fn alone() -> (MutexGuard<'static, ()>, tempfile::TempDir) {
    let turn = ONE_DATABASE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    (turn, tempfile::tempdir().expect("a temporary directory"))
}

/// The database in `dir` run by `workers` workers (0: nothing is flushed or merged but on
/// request), and its keyspace `logs`.
fn open_logs(dir: &Path, workers: usize) -> (Database, Keyspace) {
    let db = Database::builder(dir)
        .worker_threads_unchecked(workers)
        .open()
        .expect("the database opens");
    let tree = db
        .keyspace("logs", KeyspaceCreateOptions::default)
        .expect("the keyspace opens");
    (db, tree)
}

/// Keys of each level-0 table [`four_tables_over_the_same_keys`] writes.
const KEYS: u32 = 60_000;
/// Level-0 tables that start a merge under fjall's default leveled compaction.
const TABLES: usize = 4;

/// The value `round` wrote for every key: the round first, then filler.
fn value(round: u32) -> [u8; 96] {
    let mut v = [7_u8; 96];
    v[..4].copy_from_slice(&round.to_le_bytes());
    v
}

/// Writes tables over the same keys, a round each, until level 0 holds [`TABLES`]: the flush
/// of the last sends the workers a compaction request, and the tables must be merged, not
/// moved. The last round written.
fn four_tables_over_the_same_keys(tree: &Keyspace) -> u32 {
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
    last
}

/// How many table files the keyspace's folder holds (those of its tables, and any a merge is
/// writing).
fn table_files(keyspace: &Keyspace) -> usize {
    std::fs::read_dir(keyspace.path().join("tables")).map_or(0, Iterator::count)
}

/// The state letter (`R` running or runnable, `S` asleep, `D` in I/O, …) of each of this
/// process's threads named `fjall:worker`.
fn worker_states() -> Vec<char> {
    worker_stats()
        .values()
        .filter_map(|fields| fields.first()?.chars().next())
        .collect()
}

/// The niceness of each of this process's threads named `fjall:worker`, by thread ID.
fn worker_nices() -> BTreeMap<String, i32> {
    worker_stats()
        .into_iter()
        // Field 19 of `stat`, the 17th after the name.
        .map(|(tid, fields)| {
            (
                tid,
                fields[16].parse().expect("a thread's niceness is a number"),
            )
        })
        .collect()
}

/// The fields after the name in `stat` of each of this process's threads named
/// `fjall:worker`, by thread ID.
fn worker_stats() -> BTreeMap<String, Vec<String>> {
    let mut stats = BTreeMap::new();
    for task in std::fs::read_dir("/proc/self/task").expect("/proc/self/task lists the threads") {
        let Ok(task) = task else { continue };
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else {
            continue;
        };
        // "tid (comm) S …": the name may hold spaces, so split at the last parenthesis.
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        if &stat[open + 1..close] == "fjall:worker" {
            let fields = stat[close + 1..].split_whitespace().map(str::to_owned);
            stats.insert(
                task.file_name().to_string_lossy().into_owned(),
                fields.collect(),
            );
        }
    }
    stats
}

/// The store's compactions are background work: on a machine of two or more CPUs, every fjall
/// worker but the one kept for flushes runs at a lower priority, so that a compaction takes
/// the CPU the partitions leave rather than a fair share beside them.
#[test]
fn the_stores_compacting_workers_run_at_a_lower_priority_than_its_flush_worker() {
    let (_alone, dir) = alone();
    let before = worker_nices();
    let _store = FjallStore::open(dir.path(), Options::default()).expect("a new store opens");
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    // The store's own workers, once each has set its niceness as it starts.
    let ours = || {
        let mut nices: Vec<i32> = worker_nices()
            .into_iter()
            .filter(|(tid, _)| !before.contains_key(tid))
            .map(|(_, nice)| nice)
            .collect();
        nices.sort_unstable();
        nices
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut nices = ours();
    while Instant::now() < deadline && nices.iter().filter(|&&n| n == 0).count() != 1 {
        std::thread::sleep(Duration::from_millis(10));
        nices = ours();
    }
    let workers = nices.len();
    assert!(workers >= 1, "the store runs no fjall worker");
    if cpus < 2 || workers < 2 {
        assert_eq!(
            nices,
            vec![0; workers],
            "a lone worker flushes: it keeps its priority"
        );
        return;
    }
    let mut expected = vec![COMPACTION_WORKER_NICE; workers];
    expected[0] = 0;
    assert_eq!(
        nices, expected,
        "the flush worker must keep niceness 0 and every compacting worker have {COMPACTION_WORKER_NICE}"
    );
}

/// Voluntary context switches (wake-ups after a wait) of each of this process's threads named
/// `fjall:worker`, summed.
fn worker_wakeups() -> u64 {
    worker_stats()
        .keys()
        .filter_map(|tid| {
            let status = std::fs::read_to_string(format!("/proc/self/task/{tid}/status")).ok()?;
            status
                .lines()
                .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))?
                .trim()
                .parse::<u64>()
                .ok()
        })
        .sum()
}

/// fjall keeps worker 0 for memtable flushes: a compaction request it receives it passes on
/// to the other workers. Handed back to the shared queue and taken again at once, the request
/// made it spin on a whole core for as long as another worker compacted; sleeping a
/// millisecond between takes still woke it a thousand times a second. It must wait until
/// there is a flush instead.
#[test]
fn the_flush_worker_sleeps_instead_of_spinning_while_another_worker_compacts() {
    let (_alone, dir) = alone();
    let (_db, tree) = open_logs(dir.path(), 2);
    four_tables_over_the_same_keys(&tree);
    assert_eq!(worker_states().len(), 2, "the database runs two workers");

    // Sample both workers' states until the compaction has merged level 0.
    let (began, woken) = (Instant::now(), worker_wakeups());
    let deadline = Instant::now() + Duration::from_secs(120);
    let (mut compacting, mut both_running) = (0_u32, 0_u32);
    while tree.l0_table_count() > 0 && Instant::now() < deadline {
        let running = worker_states().iter().filter(|&&s| s == 'R').count();
        if running >= 1 {
            compacting += 1;
        }
        if running >= 2 {
            both_running += 1;
        }
        std::thread::sleep(Duration::from_micros(500));
    }
    assert!(
        tree.l0_table_count() == 0,
        "the compaction did not end within two minutes"
    );
    assert!(
        compacting >= 20,
        "a worker was seen running in only {compacting} samples: the compaction was too short \
         to watch; write more"
    );
    assert!(
        both_running * 4 < compacting,
        "both workers were running in {both_running} of the {compacting} samples taken while a \
         compaction ran: the flush worker spins instead of waiting"
    );
    // The compacting worker waits for its reads and writes now and then; a flush worker taking
    // the request back every millisecond would add a thousand wake-ups a second.
    let (took, wakeups) = (began.elapsed(), worker_wakeups() - woken);
    let per_second = wakeups as f64 / took.as_secs_f64();
    eprintln!("the workers woke {wakeups} times in the {took:?} of a compaction");
    assert!(
        per_second < 200.0,
        "the workers woke {wakeups} times in the {took:?} of a compaction ({per_second:.0} a \
         second): the flush worker polls instead of waiting"
    );
}

/// A database dropped while a merge is writing its output must not wait for the merge to end
/// (seconds to minutes on a large level, while the server has already said it stopped) nor
/// install the part it wrote (which would replace every input table with a part of their
/// keys): the merge is abandoned, its inputs kept whole, and done again after the next open.
#[test]
fn closing_the_database_abandons_a_merge_under_way_and_keeps_every_key() {
    let (_alone, dir) = alone();
    let (db, tree) = open_logs(dir.path(), 2);
    let last = four_tables_over_the_same_keys(&tree);

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
    let (_db, tree) = open_logs(dir.path(), 0);
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
