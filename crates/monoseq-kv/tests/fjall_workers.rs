//! The embedded engine's background workers, as the vendored fjall runs them
//! (`vendor/fjall/PATCHES.md`). Linux only: thread states come from `/proc`.
#![cfg(all(feature = "fjall", target_os = "linux"))]

use std::time::{Duration, Instant};

use fjall::{Database, KeyspaceCreateOptions};

/// The state letter (`R` running or runnable, `S` asleep, `D` in I/O, …) of each of this
/// process's threads named `fjall:worker`.
fn worker_states() -> Vec<char> {
    let mut states = Vec::new();
    for task in std::fs::read_dir("/proc/self/task").expect("/proc/self/task lists the threads") {
        let Ok(task) = task else { continue };
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else {
            continue;
        };
        // "tid (comm) S …": the name may hold spaces, so split at the last parenthesis.
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        if &stat[open + 1..close] == "fjall:worker"
            && let Some(state) = stat[close + 1..].trim_start().chars().next()
        {
            states.push(state);
        }
    }
    states
}

/// fjall keeps worker 0 for memtable flushes: a compaction request it receives it hands back
/// to the queue. Taken again at once, the request made it spin on a whole core for as long as
/// another worker compacted. It must sleep instead.
#[test]
fn the_flush_worker_sleeps_instead_of_spinning_while_another_worker_compacts() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let db = Database::builder(dir.path())
        .worker_threads(2)
        .open()
        .expect("a new database opens");
    let tree = db
        .keyspace("logs", KeyspaceCreateOptions::default)
        .expect("a keyspace opens");

    // Tables over the same keys until level 0 holds four: the flush of the fourth sends both
    // workers a compaction request, and the tables must be merged, not moved.
    let value = [7_u8; 96];
    for round in 0_u32..12 {
        for key in 0_u32..60_000 {
            let mut stored = value;
            stored[..4].copy_from_slice(&round.to_le_bytes());
            tree.insert(key.to_be_bytes(), stored).expect("an insert");
        }
        tree.rotate_memtable_and_wait()
            .expect("the memtable is flushed");
        if tree.l0_table_count() >= 4 {
            break;
        }
    }
    assert_eq!(worker_states().len(), 2, "the database runs two workers");

    // Sample both workers' states until the compaction has merged level 0.
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
}
