//! The sequence-storage conformance harness for [`PLogSeqStorage`] on any key-value store
//! (feature `conformance`): what `monoseq_core::conformance` needs to drive the suite —
//! the storage, and events appended to its PLog through the event store. Every backend's
//! tests run the suite through it. Also [`sample_event`], the typical small event the
//! benchmarks of every backend write. And the consumer positions' checks every backend passes
//! ([`positions_compare_and_set`], [`positions_one_writer_wins`]).

use monoseq_core::conformance::{EventShape, Harness};
use monoseq_core::{Number, PLogOffset, SeqValue, WsId, WsKind};
use monoseq_kv::KvStore;

pub use crate::positions::checks::{positions_compare_and_set, positions_one_writer_wins};
use crate::{
    AppId, CRECORD_ID_SEQUENCE, Event, EventStore, PLogSeqStorage, PartitionId, Record, RecordId,
    RecordKind, TrustLevel, WLOG_OFFSET_SEQUENCE, WLogOffset,
};

const APP: AppId = AppId(1);
const PARTITION: PartitionId = PartitionId(3);
const KIND: WsKind = WsKind(1);

/// A `PLogSeqStorage` on a fresh key-value store, with the event store that writes its PLog.
/// `_dir` (a temporary directory of an embedded store) is dropped last.
pub struct PLogHarness<K: KvStore + Clone> {
    storage: PLogSeqStorage<K>,
    events: EventStore<K>,
    _dir: Option<Box<dyn std::any::Any + Send + Sync>>,
}

impl<K: KvStore + Clone> PLogHarness<K> {
    /// The harness on `kv`; `dir` is a directory to keep until the harness is dropped.
    pub fn on(kv: K, dir: Option<Box<dyn std::any::Any + Send + Sync>>) -> PLogHarness<K> {
        PLogHarness::with_segments(kv, None, dir)
    }

    /// The harness on `kv` with its PLog in `segments` (which must hold partitions up to 3)
    /// when given; `dir` as for [`PLogHarness::on`].
    pub fn with_segments(
        kv: K,
        segments: Option<std::sync::Arc<crate::Segments>>,
        dir: Option<Box<dyn std::any::Any + Send + Sync>>,
    ) -> PLogHarness<K> {
        // Level 2 writes blindly, so the suite's events need no record table checks.
        let events = EventStore::with_plogs(kv, APP, TrustLevel::Level2, segments);
        PLogHarness {
            storage: events.seq_storage(PARTITION),
            events,
            _dir: dir,
        }
    }
}

impl<K: KvStore + Clone> Harness for PLogHarness<K> {
    type Storage = PLogSeqStorage<K>;

    fn storage(&self) -> &PLogSeqStorage<K> {
        &self.storage
    }

    fn shape(&self) -> EventShape {
        EventShape {
            kind: KIND,
            one: (WLOG_OFFSET_SEQUENCE.id, WLOG_OFFSET_SEQUENCE.initial),
            many: (CRECORD_ID_SEQUENCE.id, CRECORD_ID_SEQUENCE.initial),
        }
    }

    fn append(&self, offset: PLogOffset, ws: WsId, values: &[SeqValue]) {
        let mut wlog = None;
        let mut created = Vec::new();
        for v in values {
            if v.key.seq == WLOG_OFFSET_SEQUENCE.id {
                wlog = Some(v.value);
            } else {
                created.push(Record {
                    id: RecordId(v.value.0),
                    kind: RecordKind::CDoc,
                    name: "app.Doc".into(),
                    fields: vec![],
                });
            }
        }
        let event = Event {
            plog_offset: offset,
            ws,
            ws_kind: KIND,
            wlog_offset: WLogOffset(wlog.unwrap_or(Number(0)).0),
            registered_at_ms: 0,
            command: "app.Cmd".into(),
            argument: None,
            created,
            updated: vec![],
            idempotency: None,
        };
        self.events
            .append(PARTITION, &[event])
            .expect("the event store takes the event");
    }
}

/// A typical small command's event, as benchmarks write it: one new CDoc with two fields
/// (about 90 bytes encoded), at PLog offset `plog` and WLog offset `wlog` of workspace `ws`
/// (kind `kind`), creating record `id`.
#[must_use]
pub fn sample_event(plog: u64, ws: u64, kind: WsKind, wlog: u64, id: u64) -> Event {
    Event {
        plog_offset: PLogOffset(plog),
        ws: WsId(ws),
        ws_kind: kind,
        wlog_offset: WLogOffset(wlog),
        registered_at_ms: 1_767_225_600_000 + plog,
        command: "app.NewCustomer".into(),
        argument: None,
        created: vec![Record {
            id: RecordId(id),
            kind: RecordKind::CDoc,
            name: "app.Customer".into(),
            fields: vec![
                crate::Field::new("name", br#""Ann Example""#.to_vec()),
                crate::Field::new("limit", b"1000".to_vec()),
            ],
        }],
        updated: vec![],
        idempotency: None,
    }
}
