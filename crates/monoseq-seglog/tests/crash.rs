//! A process killed at random while it appends and syncs numbered batches: reopened with the
//! last end it reported synced as the durable end, every synced batch is there, whole and in
//! order, and appends go on. A kill keeps what the process wrote in the page cache, so this
//! finds what a dying writer leaves (a segment half created, a seal half done, a write cut
//! short), not what a power cut loses: the tests that write torn tails by hand cover that.
//!
//! The child is this test binary run again with `MONOSEQ_SEGLOG_CRASH_DIR` set: its one test
//! (`crash_child`) then appends until killed, printing `synced {end}` after each sync.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::{assert_holds_payloads, payloads};
use monoseq_seglog::{SegLog, SegOptions};

const DIR_VAR: &str = "MONOSEQ_SEGLOG_CRASH_DIR";
const DURABLE_VAR: &str = "MONOSEQ_SEGLOG_CRASH_DURABLE";
const ROUNDS: u64 = 12;

/// Segments sealed every few batches, zero-filled ahead every batch or two.
fn options() -> SegOptions {
    SegOptions {
        segment_bytes: 4 << 10,
        preallocate_bytes: 1 << 10,
        ..SegOptions::default()
    }
}

/// A small xorshift generator: the kill points, from a seed the failure message prints.
fn next(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

#[test]
fn crash_child() {
    let (Ok(dir), Ok(durable)) = (std::env::var(DIR_VAR), std::env::var(DURABLE_VAR)) else {
        return;
    };
    let durable: u64 = durable.parse().expect("durable end");
    let mut log = SegLog::open(&dir, 0, options(), durable).expect("the child opens the log");
    let mut batch = 1;
    loop {
        let at = log.end();
        let to = at + 1 + batch % 17;
        log.append(at, &payloads(at, to)).expect("append");
        log.sync().expect("sync");
        println!("synced {to}");
        batch += 1;
    }
}

#[test]
fn every_synced_batch_survives_a_kill_whole_and_in_order() {
    let seed = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64)
        | 1;
    let mut rng = seed;
    let dir = tempfile::tempdir().expect("temporary directory");
    let (mut durable, mut segments) = (1, 0);
    for round in 0..ROUNDS {
        let mut child = Command::new(std::env::current_exe().expect("test binary"))
            .args(["--exact", "crash_child", "--nocapture", "--test-threads=1"])
            .env(DIR_VAR, dir.path())
            .env(DURABLE_VAR, durable.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn the child");
        let stdout = child.stdout.take().expect("stdout");
        let lines = 1 + next(&mut rng) % 40;
        let mut seen = 0;
        for line in BufReader::new(stdout).lines() {
            let line = line.expect("a line");
            if let Some(end) = line.strip_prefix("synced ") {
                durable = end.parse().expect("an end");
                seen += 1;
                if seen == lines {
                    break;
                }
            }
        }
        std::thread::sleep(Duration::from_micros(next(&mut rng) % 3000));
        child.kill().expect("kill the child");
        child.wait().expect("reap the child");
        assert_eq!(
            seen, lines,
            "seed {seed}, round {round}: the child stopped early"
        );
        let log = SegLog::open(dir.path(), 0, options(), durable)
            .unwrap_or_else(|e| panic!("seed {seed}, round {round}: {e}"));
        assert!(log.end() >= durable, "seed {seed}, round {round}");
        assert_holds_payloads(&log, 50);
        segments = log.segments();
    }
    assert!(segments > 2, "segments were sealed while the child ran");
}
