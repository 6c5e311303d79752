//! Helpers shared by the event store's integration tests: a small command processor that runs
//! the sequencing transaction around an event write, as the real one will.

#![allow(dead_code)]

use std::sync::Arc;

use monoseq_core::{Sequencer, Start, Status, Worker, WsId, WsKind};
use monoseq_kv::MemoryStore;
use monoseq_store::{
    AppId, AppendError, ArgObject, Event, EventStore, Field, PLogSeqStorage, PartitionId, Record,
    RecordId, RecordKind, TrustLevel, WLOG_OFFSET_SEQUENCE, WLogOffset, built_in_params,
};

pub const APP: AppId = AppId(1);
pub const PARTITION: PartitionId = PartitionId(0);
pub const KIND: WsKind = WsKind(1);
pub const WS: WsId = WsId(1001);

pub type Kv = Arc<MemoryStore>;
pub type Storage = Arc<PLogSeqStorage<Kv>>;

/// What a command writes: kinds of the records it creates and of its argument's children
/// (`None`: no argument object), and the records it updates.
#[derive(Default, Clone)]
pub struct Command {
    pub creates: Vec<RecordKind>,
    pub argument_children: Option<usize>,
    pub updates: Vec<(RecordId, RecordKind, Vec<Field>)>,
}

impl Command {
    pub fn create(kind: RecordKind) -> Command {
        Command {
            creates: vec![kind],
            ..Command::default()
        }
    }
}

/// A command processor for one partition: a sequencer whose worker the test steps, over the
/// PLog-backed sequence storage of an event store.
pub struct Cp {
    pub seq: Sequencer<Storage>,
    pub worker: Worker<Storage>,
    pub store: EventStore<Kv>,
    pub storage: Storage,
}

impl Cp {
    pub fn new(kv: &Kv, trust: TrustLevel) -> Cp {
        Cp::on(EventStore::new(Arc::clone(kv), APP, trust))
    }

    /// A command processor writing to `store` (of application [`APP`]).
    pub fn on(store: EventStore<Kv>) -> Cp {
        let storage = Arc::new(store.seq_storage(PARTITION));
        let params = built_in_params([KIND, WsKind(2)]).build().unwrap();
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
    pub fn settle(&mut self) {
        for _ in 0..1000 {
            self.worker.step();
            if self.seq.status() == Status::Ready && self.seq.handle().stats().backlog_values == 0 {
                return;
            }
        }
        panic!("worker did not settle: {:?}", self.seq.status());
    }

    /// Runs one command in `ws`: start, numbers, event write, then flush (or actualize when
    /// the write fails). Does not step the worker.
    pub fn run(&mut self, ws: WsId, cmd: &Command) -> Result<Event, AppendError> {
        let Start::Began(mut tx) = self.seq.start(KIND, ws).unwrap() else {
            panic!("sequencer busy");
        };
        let wlog = tx.next(WLOG_OFFSET_SEQUENCE.id).unwrap();
        let argument = cmd.argument_children.map(|n| {
            let id = tx.next(RecordKind::ODoc.id_sequence()).unwrap();
            let children = (0..n)
                .map(|_| ArgObject {
                    id: RecordId(tx.next(RecordKind::ORecord.id_sequence()).unwrap().0),
                    kind: RecordKind::ORecord,
                    name: "app.Line".into(),
                    fields: vec![Field::new("qty", b"1".to_vec())],
                    children: vec![],
                })
                .collect();
            ArgObject {
                id: RecordId(id.0),
                kind: RecordKind::ODoc,
                name: "app.Order".into(),
                fields: vec![],
                children,
            }
        });
        let created = cmd
            .creates
            .iter()
            .map(|&kind| Record {
                id: RecordId(tx.next(kind.id_sequence()).unwrap().0),
                kind,
                name: "app.Doc".into(),
                fields: vec![Field::new("name", br#""x""#.to_vec())],
            })
            .collect();
        let updated = cmd
            .updates
            .iter()
            .map(|(id, kind, fields)| Record {
                id: *id,
                kind: *kind,
                name: "app.Doc".into(),
                fields: fields.clone(),
            })
            .collect();
        let event = Event {
            plog_offset: tx.plog_offset(),
            ws,
            ws_kind: KIND,
            wlog_offset: WLogOffset(wlog.0),
            registered_at_ms: 1_700_000_000_000,
            command: "app.Cmd".into(),
            argument,
            created,
            updated,
            idempotency: None,
        };
        match self.store.append(PARTITION, std::slice::from_ref(&event)) {
            Ok(()) => {
                tx.flush();
                Ok(event)
            }
            Err(e) => {
                tx.actualize();
                Err(e)
            }
        }
    }

    pub fn run_ok(&mut self, ws: WsId, cmd: &Command) -> Event {
        self.run(ws, cmd).unwrap()
    }
}
