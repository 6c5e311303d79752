//! Helpers shared by the sequencer's integration tests: parameters, a shared runtime, and
//! waiting for background work with a deadline instead of fixed sleeps.

#![allow(dead_code)]

pub mod scenarios;

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use monoseq_core::mem::MemSeqStorage;
use monoseq_core::{
    Number, Params, ParamsBuilder, Runtime, SeqId, SeqStorage, Sequencer, Start, Transaction, WsId,
    WsKind,
};

pub const KIND: WsKind = WsKind(1);
pub const KIND2: WsKind = WsKind(2);
pub const WLOG: SeqId = SeqId(1);
pub const CREC: SeqId = SeqId(2);
pub const OWREC: SeqId = SeqId(3);
pub const CREC_INITIAL: Number = Number(322_685_000_131_072);
pub const OWREC_INITIAL: Number = Number(322_680_000_131_072);

/// Generous bound for background work in tests; reaching it is a failure, not a wait.
pub const PATIENCE: Duration = Duration::from_secs(20);

pub fn builder() -> ParamsBuilder {
    Params::builder()
        .kind(
            KIND,
            [
                (WLOG, Number(1)),
                (CREC, CREC_INITIAL),
                (OWREC, OWREC_INITIAL),
            ],
        )
        .kind(KIND2, [(WLOG, Number(1)), (OWREC, OWREC_INITIAL)])
        .batcher_delay(Duration::from_millis(1))
        .retry_delay(Duration::from_millis(1), Duration::from_millis(20))
}

pub fn params() -> Params {
    builder().build().unwrap()
}

pub fn runtime() -> &'static Runtime {
    static RT: OnceLock<Runtime> = OnceLock::new();
    RT.get_or_init(|| Runtime::new(2).unwrap())
}

pub fn new_seq(params: Params, storage: &Arc<MemSeqStorage>) -> Sequencer<Arc<MemSeqStorage>> {
    Sequencer::new(params, Arc::clone(storage), runtime())
}

/// Starts a transaction, waiting for actualization and for room in the backlog; fails the
/// test if still busy after [`PATIENCE`].
pub fn begin<S: SeqStorage>(seq: &mut Sequencer<S>, kind: WsKind, ws: WsId) -> Transaction<'_, S> {
    let handle = seq.handle();
    let limit = seq.params().backlog_values_max();
    let room = seq
        .params()
        .kinds()
        .find(|(k, _)| *k == kind)
        .map_or(0, |(_, seqs)| seqs.count());
    wait_until("the backlog has room", || {
        handle.stats().backlog_values + room <= limit
    });
    match seq.start_wait(kind, ws, PATIENCE).unwrap() {
        Start::Began(tx) => tx,
        Start::Busy(b) => panic!("start still busy after {PATIENCE:?}: {b}"),
    }
}

/// Polls `cond` until it holds; fails the test after [`PATIENCE`].
pub fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}
