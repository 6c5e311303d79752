//! Sequences on PostgreSQL: the event store and the PLog-backed sequence storage run unchanged
//! on `PgStore`, and after a restart (a new store on the same schema) actualization replays the
//! PLog tail, so numbers continue and none is handed out again.

use std::collections::HashSet;
use std::sync::Arc;

use monoseq_core::{PLogOffset, SeqStorage, Sequencer, Start, Status, Worker, WsId, WsKind};
use monoseq_pg::testing::{DATABASE, PgCluster};
use monoseq_pg::{PgOptions, PgStore};
use monoseq_store::{
    AppId, CRECORD_ID_SEQUENCE, Event, EventStore, PLogSeqStorage, PartitionId, Record, RecordId,
    RecordKind, TrustLevel, WLOG_OFFSET_SEQUENCE, WLogOffset, built_in_params,
};

const APP: AppId = AppId(1);
const PARTITION: PartitionId = PartitionId(0);
const KIND: WsKind = WsKind(1);

type Kv = Arc<PgStore>;
type Storage = Arc<PLogSeqStorage<Kv>>;

/// One partition's command processing: a sequencer whose worker the test steps.
struct Cp {
    seq: Sequencer<Storage>,
    worker: Worker<Storage>,
    store: EventStore<Kv>,
    storage: Storage,
}

impl Cp {
    fn new(kv: &Kv) -> Cp {
        let store = EventStore::new(Arc::clone(kv), APP, TrustLevel::Level0);
        let storage = Arc::new(store.seq_storage(PARTITION));
        let params = built_in_params([KIND]).build().unwrap();
        let (seq, worker) = Sequencer::new_manual(params, Arc::clone(&storage));
        let mut cp = Cp {
            seq,
            worker,
            store,
            storage,
        };
        cp.settle();
        cp
    }

    /// Steps the worker until actualization is over and the backlog is flushed.
    fn settle(&mut self) {
        for _ in 0..1000 {
            self.worker.step();
            if self.seq.status() == Status::Ready && self.seq.handle().stats().backlog_values == 0 {
                return;
            }
        }
        panic!("worker did not settle: {:?}", self.seq.status());
    }

    /// One command in `ws` that creates a CDoc: start, numbers, event write, flush.
    fn run(&mut self, ws: WsId) -> Event {
        let Start::Began(mut tx) = self.seq.start(KIND, ws).unwrap() else {
            panic!("sequencer busy");
        };
        let wlog = tx.next(WLOG_OFFSET_SEQUENCE.id).unwrap();
        let id = tx.next(CRECORD_ID_SEQUENCE.id).unwrap();
        let event = Event {
            plog_offset: tx.plog_offset(),
            ws,
            ws_kind: KIND,
            wlog_offset: WLogOffset(wlog.0),
            registered_at_ms: 1_700_000_000_000,
            command: "app.NewCustomer".into(),
            argument: None,
            created: vec![Record {
                id: RecordId(id.0),
                kind: RecordKind::CDoc,
                name: "app.Customer".into(),
                fields: vec![],
            }],
            updated: vec![],
            idempotency: None,
        };
        self.store
            .append(PARTITION, std::slice::from_ref(&event))
            .unwrap();
        tx.flush();
        event
    }
}

#[test]
fn numbers_continue_after_a_restart_on_postgres_and_none_is_handed_out_again() {
    let cluster = PgCluster::shared().unwrap_or_else(|e| panic!("{e}"));
    let kv: Kv = Arc::new(cluster.fresh_store(PgOptions::default()).unwrap());
    let schema = kv.schema().to_owned();
    let mut cp = Cp::new(&kv);
    let mut events = Vec::new();
    for i in 0..300u64 {
        events.push(cp.run(WsId(1 + i % 7)));
        if i % 50 == 49 {
            cp.settle();
        }
    }
    cp.settle();
    assert_eq!(cp.storage.read_next_plog_offset().unwrap(), PLogOffset(301));
    // A tail the checkpoint does not cover: the process stops before its worker flushes.
    const TAIL: u64 = 13;
    for i in 0..TAIL {
        events.push(cp.run(WsId(1 + i % 7)));
    }
    drop(cp);
    drop(kv);

    // The restart: a new store (new connections) on the same schema.
    let kv: Kv = Arc::new(
        PgStore::open(&cluster.url(DATABASE), PgOptions::default().schema(schema)).unwrap(),
    );
    let mut cp = Cp::new(&kv);
    assert_eq!(cp.storage.replayed_events(), TAIL);
    let last = events.last().unwrap().clone();
    let next = cp.run(last.ws);
    assert_eq!(next.plog_offset, PLogOffset(301 + TAIL));
    assert_eq!(next.wlog_offset.0, last.wlog_offset.0 + 1);
    assert!(next.created[0].id > last.created[0].id);
    events.push(next);
    for i in 0..20u64 {
        events.push(cp.run(WsId(1 + i % 9)));
    }
    // PLog offsets contiguous from 1; WLog offsets and record IDs unique per workspace.
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e.plog_offset, PLogOffset(i as u64 + 1));
    }
    let mut wlog = HashSet::new();
    let mut ids = HashSet::new();
    for e in &events {
        assert!(wlog.insert((e.ws, e.wlog_offset)), "WLog offset reissued");
        assert!(ids.insert((e.ws, e.created[0].id)), "record ID reissued");
    }
    // The PLog on PostgreSQL holds exactly these events.
    for e in events.iter().step_by(37) {
        let stored = cp.store.read_event(PARTITION, e.plog_offset).unwrap();
        assert_eq!(stored.as_ref(), Some(e));
    }
    cp.settle();
    assert_eq!(
        cp.storage.read_next_plog_offset().unwrap(),
        PLogOffset(events.len() as u64 + 1)
    );
}
