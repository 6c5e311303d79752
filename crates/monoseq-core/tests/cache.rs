//! The sequencer's cache of workspaces: a full cache takes a workspace in on its second miss
//! only, so workspaces seen once do not evict the ones in use, and numbers of a workspace kept
//! out of the cache still continue where they were.

mod common;

use common::{KIND, KIND2, WLOG, builder};
use monoseq_core::mem::MemSeqStorage;
use monoseq_core::{Number, NumberKey, Sequencer, Start, Step, Worker, WsId};
use std::sync::Arc;

type Seq = Sequencer<Arc<MemSeqStorage>>;

fn manual(cache: usize) -> (Seq, Worker<Arc<MemSeqStorage>>, Arc<MemSeqStorage>) {
    let storage = MemSeqStorage::new();
    let params = builder().cache_workspaces_max(cache).build().unwrap();
    let (seq, mut worker) = Sequencer::new_manual(params, Arc::clone(&storage));
    assert_eq!(worker.step(), Step::Idle);
    (seq, worker, storage)
}

/// One transaction on `ws` that takes a WLog offset; answers it.
fn wlog(seq: &mut Seq, ws: u64) -> Number {
    match seq.start(KIND, WsId(ws)).unwrap() {
        Start::Began(mut tx) => {
            let n = tx.next(WLOG).unwrap();
            tx.flush();
            n
        }
        Start::Busy(b) => panic!("busy: {b}"),
    }
}

fn hits(seq: &Seq) -> u64 {
    seq.cache_stats().hits
}

#[test]
fn a_workspace_seen_once_leaves_a_full_cache_alone() {
    let (mut seq, _worker, _storage) = manual(2);
    wlog(&mut seq, 1);
    wlog(&mut seq, 2);
    assert_eq!(seq.cached_workspaces(), 2);
    wlog(&mut seq, 3);
    assert_eq!(hits(&seq), 0);
    // An LRU that took 3 in would have evicted 1.
    assert_eq!(wlog(&mut seq, 1), Number(2));
    assert_eq!(wlog(&mut seq, 2), Number(2));
    assert_eq!(hits(&seq), 2);
}

#[test]
fn a_workspace_missed_twice_enters_a_full_cache() {
    let (mut seq, _worker, _storage) = manual(2);
    wlog(&mut seq, 1);
    wlog(&mut seq, 2);
    wlog(&mut seq, 3);
    wlog(&mut seq, 1);
    wlog(&mut seq, 2);
    let before = hits(&seq);
    // Second miss: 3 goes in, in place of the least recently used (1).
    assert_eq!(wlog(&mut seq, 3), Number(2));
    assert_eq!(hits(&seq), before);
    assert_eq!(wlog(&mut seq, 2), Number(3));
    assert_eq!(wlog(&mut seq, 3), Number(3));
    assert_eq!(hits(&seq), before + 2);
    assert_eq!(wlog(&mut seq, 1), Number(3));
    assert_eq!(hits(&seq), before + 2, "1 was evicted");
    assert_eq!(seq.cached_workspaces(), 2);
}

#[test]
fn numbers_of_workspaces_kept_out_of_the_cache_continue_from_backlog_and_storage() {
    let (mut seq, mut worker, storage) = manual(3);
    let mut expected = [0u64; 40];
    for round in 0..30u64 {
        for ws in 0..40u64 {
            // Workspaces in a varying order, most of them kept out of the 3-entry cache.
            let ws = (ws * 7 + round) % 40;
            expected[ws as usize] += 1;
            assert_eq!(wlog(&mut seq, ws), Number(expected[ws as usize]), "ws {ws}");
            if ws % 5 == 0 {
                assert_eq!(worker.step(), Step::Idle);
            }
        }
    }
    assert_eq!(worker.step(), Step::Idle);
    for (ws, &n) in expected.iter().enumerate() {
        let key = NumberKey {
            ws: WsId(ws as u64),
            seq: WLOG,
        };
        assert_eq!(storage.number(key), Number(n));
    }
    assert!(seq.cached_workspaces() <= 3);
}

#[test]
fn a_workspace_cached_under_another_kind_is_replaced_even_when_the_cache_is_full() {
    let (mut seq, _worker, _storage) = manual(1);
    wlog(&mut seq, 1);
    wlog(&mut seq, 2);
    // 1 is cached under KIND; a transaction of KIND2 on it must not leave that entry behind.
    match seq.start(KIND2, WsId(1)).unwrap() {
        Start::Began(mut tx) => {
            assert_eq!(tx.next(WLOG).unwrap(), Number(2));
            tx.flush();
        }
        Start::Busy(b) => panic!("busy: {b}"),
    }
    // A stale KIND entry would hand out 2 again.
    assert_eq!(wlog(&mut seq, 1), Number(3));
}
