//! The hot path allocates nothing: start, next and flush on workspaces whose numbers are in
//! memory perform no heap allocation (counted per thread by `allocation-counter`).

mod common;

use common::*;
use monoseq_core::mem::MemSeqStorage;
use monoseq_core::{Sequencer, Start, Step, WsId};

#[test]
fn cache_hit_cycles_do_not_allocate() {
    let (mut seq, mut worker) = Sequencer::new_manual(params(), MemSeqStorage::new());
    assert_eq!(worker.step(), Step::Idle);
    let cycle = |seq: &mut Sequencer<_>, ws: u64| {
        let Start::Began(mut tx) = seq.start(KIND, WsId(ws)).unwrap() else {
            panic!("busy");
        };
        tx.next(WLOG).unwrap();
        tx.next(CREC).unwrap();
        tx.next(CREC).unwrap();
        tx.flush();
    };
    // Warm up: load ten workspaces and let the backlog map reach its size.
    for _round in 0..3 {
        for ws in 0..10 {
            cycle(&mut seq, ws);
        }
    }
    let hot = allocation_counter::measure(|| {
        for _ in 0..10_000 {
            cycle(&mut seq, 3);
        }
    });
    assert_eq!(hot.count_total, 0, "one hot workspace allocated");
    let rotating = allocation_counter::measure(|| {
        for i in 0..10_000 {
            cycle(&mut seq, i % 10);
        }
    });
    assert_eq!(rotating.count_total, 0, "cache-hit rotation allocated");
    // The measurement itself works: a miss allocates its cache entry.
    let miss = allocation_counter::measure(|| cycle(&mut seq, 99));
    assert!(miss.count_total > 0);
}
