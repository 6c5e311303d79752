//! The event store with its PLogs in segment files (key layout 4): the same reads as the PLog
//! in the key-value store, level 0's conflicts refused before the log or the store is written,
//! the redo that brings the key-value store up to the logs (after a failed write, and after the
//! store lost its last batches), and data directories opened, reopened, cut below their marks
//! and copied.

use std::collections::BTreeMap;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use monoseq_core::{PLogOffset, ReplayEnd, ReplayedEvent, SeqStorage, SeqValue, WsId, WsKind};
use monoseq_kv::{
    Durability, EmbeddedStore, FaultOp, FaultyStore, Key, KvError, KvStore, MemoryStore, Options,
};
use monoseq_store::{
    APPLIED_LAG_MAX, AppId, AppendError, CRECORD_ID_SEQUENCE, DataDir, DataDirError, Event,
    EventStore, FORMAT_VERSION, FORMAT_VERSION_RECORD_REF_BARE, Field, Gap, Identity, KEY_LAYOUT,
    KEY_LAYOUT_CHUNKS, KEY_LAYOUT_SEGMENTS, Mark, Marks, OpenPolicy, PLOG_DIR, PageItem,
    PartitionId, ReadError, Record, RecordId, RecordKind, RecordRef, Segments, Slot, StoredRecords,
    TrustLevel, WLogOffset, WLogRef, open_data_dir, retired_ranges,
};

const APP: AppId = AppId(1);
const P0: PartitionId = PartitionId(0);
const P1: PartitionId = PartitionId(1);
const KIND: WsKind = WsKind(1);

type Faulty = Arc<FaultyStore<MemoryStore>>;

/// Record `n` of the test's numbering: a CRecord ID the sequencer could have handed out.
fn id(n: u64) -> RecordId {
    RecordId(CRECORD_ID_SEQUENCE.initial.0 + n)
}

fn field(name: &str, value: &str) -> Field {
    Field::new(name, value.as_bytes().to_vec())
}

fn record(n: u64, fields: Vec<Field>) -> Record {
    Record {
        id: id(n),
        kind: RecordKind::CDoc,
        name: "app.Doc".into(),
        fields,
    }
}

/// An event of `ws` at PLog offset `plog` and WLog offset `wlog`, creating and updating
/// nothing.
fn event(plog: u64, ws: u64, wlog: u64) -> Event {
    Event {
        plog_offset: PLogOffset(plog),
        ws: WsId(ws),
        ws_kind: KIND,
        wlog_offset: WLogOffset(wlog),
        registered_at_ms: 1_767_225_600_000 + plog,
        command: "app.Cmd".into(),
        argument: None,
        created: vec![],
        updated: vec![],
        idempotency: None,
    }
}

fn creating(plog: u64, ws: u64, wlog: u64, n: u64) -> Event {
    let mut e = event(plog, ws, wlog);
    e.created = vec![record(
        n,
        vec![field("name", "first"), field("at", &plog.to_string())],
    )];
    e
}

fn updating(plog: u64, ws: u64, wlog: u64, n: u64, fields: Vec<Field>) -> Event {
    let mut e = event(plog, ws, wlog);
    e.updated = vec![record(n, fields)];
    e
}

/// Segment logs of `partitions` partitions in `dir`, nothing required of them.
fn open_segments(dir: &Path, partitions: u32) -> Arc<Segments> {
    Arc::new(Segments::open(dir, partitions, &|_| 1).expect("the segment logs open"))
}

/// Segment logs of 2 partitions in `dir` in key layout 5, a chunk every `events` events.
fn open_chunked(dir: &Path, events: usize) -> Arc<Segments> {
    let segments = Segments::open(dir, 2, &|_| 1).expect("the segment logs open");
    Arc::new(segments.with_chunks(events))
}

fn faulty() -> Faulty {
    Arc::new(FaultyStore::new(MemoryStore::new()))
}

/// Numbers a deterministic workload: groups of events of several workspaces per partition,
/// each event creating a record or updating one its workspace created earlier (some groups
/// create and update the same record).
#[derive(Default)]
struct Workload {
    plog: BTreeMap<u32, u64>,
    wlog: BTreeMap<u64, u64>,
    records: BTreeMap<u64, Vec<u64>>,
    next_record: u64,
}

impl Workload {
    fn group(&mut self, p: PartitionId, len: u64) -> Vec<Event> {
        (0..len).map(|_| self.event(p)).collect()
    }

    fn event(&mut self, p: PartitionId) -> Event {
        let plog = {
            let next = self.plog.entry(p.0).or_insert(0);
            *next += 1;
            *next
        };
        let ws = 100 * u64::from(p.0 + 1) + plog % 5;
        let wlog = {
            let next = self.wlog.entry(ws).or_insert(0);
            *next += 1;
            *next
        };
        let made = self.records.entry(ws).or_default();
        if plog % 3 == 0 && !made.is_empty() {
            let n = made[(plog as usize / 3) % made.len()];
            let fields = vec![
                field("at", &plog.to_string()),
                field(&format!("f{}", plog % 4), "x"),
            ];
            return updating(plog, ws, wlog, n, fields);
        }
        self.next_record += 1;
        made.push(self.next_record);
        creating(plog, ws, wlog, self.next_record)
    }

    fn workspaces(&self) -> Vec<u64> {
        self.wlog.keys().copied().collect()
    }

    fn record_ids(&self) -> Vec<(u64, u64)> {
        self.records
            .iter()
            .flat_map(|(ws, ns)| ns.iter().map(move |n| (*ws, *n)))
            .collect()
    }
}

/// Every event replay passes from `from`, with its numbers sorted.
fn replayed<S: KvStore + Clone>(
    store: &EventStore<S>,
    p: PartitionId,
    from: u64,
) -> (ReplayEnd, Vec<(u64, WsKind, Vec<SeqValue>)>) {
    let mut seen = Vec::new();
    let end = store
        .seq_storage(p)
        .replay_plog(PLogOffset(from), &mut |e: ReplayedEvent<'_>| {
            let mut values = e.values.to_vec();
            values.sort_by_key(|v| (v.key, v.value));
            seen.push((e.offset.0, e.ws_kind, values));
            ControlFlow::Continue(())
        })
        .expect("the PLog replays");
    (end, seen)
}

fn events_from<S: KvStore>(
    store: &EventStore<S>,
    p: PartitionId,
    from: u64,
    to: u64,
) -> Vec<Event> {
    let mut events = Vec::new();
    store
        .for_each_event(p, PLogOffset(from), PLogOffset(to), &mut |e| events.push(e))
        .expect("the PLog reads");
    events
}

/// Asserts that `got` answers every read as `want` does for the events of `work`.
fn assert_same_reads<A: KvStore + Clone, B: KvStore + Clone>(
    got: &EventStore<A>,
    want: &EventStore<B>,
    work: &Workload,
) {
    for (&p, &last) in &work.plog {
        let p = PartitionId(p);
        for offset in 1..=last + 1 {
            assert_eq!(
                got.read_event(p, PLogOffset(offset)).expect("read"),
                want.read_event(p, PLogOffset(offset)).expect("read"),
                "the event at offset {offset} of partition {p}"
            );
        }
        for (from, to) in [
            (1, u64::MAX),
            (2, 5),
            (last / 2, last),
            (last, last + 7),
            (last + 1, u64::MAX),
        ] {
            assert_eq!(
                events_from(got, p, from, to),
                events_from(want, p, from, to),
                "PLog {from}..{to}"
            );
        }
        assert_eq!(events_from(got, p, 1, u64::MAX).len() as u64, last);
        for (from, limit, end) in [
            (1, 10_000, last + 1),
            (3, 7, last + 1),
            (1, 10_000, last / 2),
            (last, 5, u64::MAX),
        ] {
            assert_eq!(
                got.read_plog_page(p, from, limit, end, &[]).expect("page"),
                want.read_plog_page(p, from, limit, end, &[]).expect("page"),
                "the page of {limit} from {from} below {end}"
            );
        }
        let gap = [Gap {
            from: 2,
            to: 3,
            cause: monoseq_store::LossCause::AcceptedLoss,
        }];
        assert_eq!(
            got.read_plog_page(p, 1, 50, last + 1, &gap).expect("page"),
            want.read_plog_page(p, 1, 50, last + 1, &gap).expect("page"),
            "a page with a gap"
        );
        for from in [1, 2, last / 2, last, last + 1] {
            let (end, seen) = replayed(got, p, from);
            assert_eq!(
                (end, &seen),
                (replayed(want, p, from).0, &replayed(want, p, from).1),
                "replay from {from}"
            );
            assert_eq!(seen.len() as u64, last + 1 - from.min(last + 1));
        }
    }
    for ws in work.workspaces() {
        let ws = WsId(ws);
        for (from, limit) in [(1, 100_000), (2, 3), (40, 1_000)] {
            assert_eq!(
                got.read_wlog(ws, WLogOffset(from), limit).expect("WLog"),
                want.read_wlog(ws, WLogOffset(from), limit).expect("WLog"),
                "the WLog of {ws} from {from}"
            );
        }
    }
    for (ws, n) in work.record_ids() {
        let read = got.read_record(WsId(ws), id(n)).expect("record");
        assert!(read.is_some(), "record {n} of {ws}");
        assert_eq!(
            read,
            want.read_record(WsId(ws), id(n)).expect("record"),
            "record {n} of {ws}"
        );
    }
}

/// A kv-layout store and a segment-layout store given the same groups.
struct Twins {
    kv_layout: EventStore<Arc<MemoryStore>>,
    segmented: EventStore<Faulty>,
    kv: Faulty,
    segments: Arc<Segments>,
    work: Workload,
    _dir: tempfile::TempDir,
}

impl Twins {
    fn new(trust: TrustLevel) -> Twins {
        Twins::in_layout(trust, None)
    }

    /// Twins whose segmented store is in key layout 5, writing its chunks every
    /// `chunk_events` events of a partition.
    fn chunked(trust: TrustLevel, chunk_events: usize) -> Twins {
        Twins::in_layout(trust, Some(chunk_events))
    }

    fn in_layout(trust: TrustLevel, chunk_events: Option<usize>) -> Twins {
        let dir = tempfile::tempdir().expect("temporary directory");
        let segments = match chunk_events {
            None => open_segments(dir.path(), 2),
            Some(n) => open_chunked(dir.path(), n),
        };
        let kv = faulty();
        let segmented =
            EventStore::with_segments(Arc::clone(&kv), APP, trust, Arc::clone(&segments));
        Twins {
            kv_layout: EventStore::new(Arc::new(MemoryStore::new()), APP, trust),
            segmented,
            kv,
            segments,
            work: Workload::default(),
            _dir: dir,
        }
    }

    /// Appends the next `len` events of partition `p` to both stores as one group.
    fn append(&mut self, p: PartitionId, len: u64) -> Vec<Event> {
        let group = self.work.group(p, len);
        self.kv_layout
            .append(p, &group)
            .expect("the kv layout takes the group");
        self.segmented
            .append(p, &group)
            .expect("the segment layout takes the group");
        group
    }

    /// Both stores' answers to `group`, which both must refuse; the segmented one must write
    /// nothing at all.
    fn refuse(&self, p: PartitionId, group: &[Event]) -> (AppendError, AppendError) {
        let seg = self.refuse_segmented(p, group);
        let kv = self
            .kv_layout
            .append(p, group)
            .expect_err("the kv layout refuses");
        (seg, kv)
    }

    /// The segmented store's refusal of `group`, checked to write nothing at all: no store
    /// write, no byte of the log's files.
    fn refuse_segmented(&self, p: PartitionId, group: &[Event]) -> AppendError {
        let writes = self.kv.calls(FaultOp::Write);
        let end = self.segments.end(p).expect("end");
        let files = log_bytes(self.segments.dir());
        let seg = self
            .segmented
            .append(p, group)
            .expect_err("the segment layout refuses");
        assert_eq!(
            self.kv.calls(FaultOp::Write),
            writes,
            "the refused group wrote to the store"
        );
        assert_eq!(
            self.segments.end(p).expect("end"),
            end,
            "the refused group reached the log"
        );
        assert_eq!(
            log_bytes(self.segments.dir()),
            files,
            "the refused group wrote to the log files"
        );
        seg
    }
}

/// Every byte of every segment file under `dir`, by path.
fn log_bytes(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut files = BTreeMap::new();
    for partition in std::fs::read_dir(dir).expect("the PLog directory") {
        let partition = partition.expect("entry").path();
        for file in std::fs::read_dir(&partition).expect("a partition's log") {
            let file = file.expect("entry").path();
            files.insert(file.clone(), std::fs::read(&file).expect("a segment file"));
        }
    }
    files
}

#[test]
fn appends_read_back_from_segment_files_as_from_the_kv_layout() {
    let mut t = Twins::new(TrustLevel::Level0);
    for len in [1, 2, 5, 1, 17] {
        t.append(P0, len);
        t.append(P1, len);
    }
    // Past a scan page (1 024 events) and a replay chunk, in groups of 50.
    for _ in 0..46 {
        t.append(P0, 50);
    }
    t.append(P0, 1);
    assert_eq!(t.segments.end(P0).expect("end"), 26 + 46 * 50 + 1 + 1);
    assert_eq!(t.segments.end(P1).expect("end"), 27);
    assert_same_reads(&t.segmented, &t.kv_layout, &t.work);
    let plog = t.segmented.plog_key(P0, PLogOffset(1));
    assert_eq!(
        t.kv.get(plog.as_key()).expect("get"),
        None,
        "the kv holds no PLog event"
    );
    assert!(t.kv_layout.kv().get(plog.as_key()).expect("get").is_some());
}

#[test]
fn a_group_not_at_the_logs_end_is_refused_and_writes_nothing() {
    let mut t = Twins::new(TrustLevel::Level0);
    t.append(P0, 3);
    let at_end = |e: &AppendError| match e {
        AppendError::NotAtEnd {
            event_index,
            offset,
            end,
        } => (*event_index, *offset, *end),
        other => panic!("expected NotAtEnd, got {other:?}"),
    };
    let ahead = [event(5, 900, 1)];
    assert_eq!(
        at_end(&t.refuse_segmented(P0, &ahead)),
        (0, 5, 4),
        "a gap before the group"
    );
    let taken = [event(3, 900, 1)];
    assert_eq!(
        at_end(&t.refuse_segmented(P0, &taken)),
        (0, 3, 4),
        "an offset the log holds"
    );
    let holed = [event(4, 900, 1), event(6, 900, 2)];
    assert_eq!(
        at_end(&t.refuse_segmented(P0, &holed)),
        (1, 6, 5),
        "a gap inside the group"
    );
    let message = t.refuse_segmented(P0, &holed).to_string();
    assert!(message.contains("nothing was written"), "{message}");
    assert!(
        t.segmented
            .read_wlog(WsId(900), WLogOffset(1), 10)
            .expect("WLog")
            .is_empty()
    );
    t.segmented
        .append(P0, &[event(4, 900, 1), event(5, 900, 2)])
        .expect("at the end");
    assert_eq!(t.segments.end(P0).expect("end"), 6);
}

/// The slot and event index of a sequence violation.
fn violation(e: &AppendError) -> (usize, Slot) {
    match e {
        AppendError::SequenceViolation {
            event_index, slot, ..
        } => (*event_index, *slot),
        other => panic!("expected a sequence violation, got {other:?}"),
    }
}

#[test]
fn level0_conflicts_refuse_the_group_and_write_nothing_to_the_store_or_the_log() {
    let mut t = Twins::new(TrustLevel::Level0);
    // Workspace 7 holds WLog offsets 1 and 2 and record 1.
    let base = [creating(1, 7, 1, 1), event(2, 7, 2)];
    t.kv_layout.append(P0, &base).expect("kv layout");
    t.segmented.append(P0, &base).expect("segments");
    let wlog = |offset| Slot::WLog {
        ws: WsId(7),
        offset: WLogOffset(offset),
    };
    let rec = |n| Slot::Record {
        ws: WsId(7),
        id: id(n),
    };
    let cases: Vec<(&str, Vec<Event>, (usize, Slot))> = vec![
        (
            "a WLog offset twice in the group",
            vec![event(3, 7, 3), event(4, 7, 3)],
            (1, wlog(3)),
        ),
        (
            "a WLog offset the store holds",
            vec![event(3, 8, 1), event(4, 7, 2)],
            (1, wlog(2)),
        ),
        (
            "a record ID twice in the group",
            vec![creating(3, 7, 3, 2), creating(4, 7, 4, 2)],
            (1, rec(2)),
        ),
        (
            "a record ID the store holds",
            vec![event(3, 7, 3), creating(4, 7, 4, 1)],
            (1, rec(1)),
        ),
        (
            "the first of two conflicts",
            vec![event(3, 8, 1), creating(4, 7, 1, 3), event(5, 7, 2)],
            (1, wlog(1)),
        ),
        (
            "a record updated, then created in the group",
            vec![
                updating(3, 7, 3, 1, vec![field("x", "1")]),
                creating(4, 7, 4, 1),
            ],
            (1, rec(1)),
        ),
    ];
    for (what, group, expected) in cases {
        let (seg, kv) = t.refuse(P0, &group);
        assert_eq!(violation(&seg), expected, "{what}");
        assert_eq!(
            violation(&seg),
            violation(&kv),
            "{what}: as in the kv layout"
        );
        assert!(
            seg.to_string().contains("nothing was written"),
            "{what}: {seg}"
        );
    }
    assert!(
        t.segmented
            .read_event(P0, PLogOffset(3))
            .expect("read")
            .is_none()
    );
    assert!(
        t.segmented
            .read_wlog(WsId(8), WLogOffset(1), 10)
            .expect("WLog")
            .is_empty()
    );
    assert!(
        t.segmented
            .read_record(WsId(7), id(2))
            .expect("record")
            .is_none()
    );
    assert_eq!(
        t.segmented.read_record(WsId(7), id(1)).expect("record"),
        Some(record(1, vec![field("name", "first"), field("at", "1")])),
        "the record is as created"
    );
    // The refusals left nothing behind: the next group takes the same numbers.
    let next = [event(3, 7, 3), creating(4, 7, 4, 2)];
    t.kv_layout.append(P0, &next).expect("kv layout");
    t.segmented.append(P0, &next).expect("segments");
    t.work.plog.insert(0, 4);
    t.work.wlog.insert(7, 4);
    t.work.records.insert(7, vec![1, 2]);
    assert_same_reads(&t.segmented, &t.kv_layout, &t.work);
}

#[test]
fn levels_1_and_2_overwrite_what_they_trust_on_segment_files_as_in_the_kv_layout() {
    for trust in [TrustLevel::Level1, TrustLevel::Level2] {
        let t = Twins::new(trust);
        let base = [creating(1, 7, 1, 1)];
        t.kv_layout.append(P0, &base).expect("kv layout");
        t.segmented.append(P0, &base).expect("segments");
        let again = [creating(2, 7, 2, 1)];
        t.kv_layout
            .append(P0, &again)
            .expect("kv layout puts the record");
        t.segmented
            .append(P0, &again)
            .expect("segments put the record");
        let twice = [event(3, 7, 3), event(4, 7, 3)];
        match trust {
            TrustLevel::Level1 => {
                let (seg, kv) = t.refuse(P0, &twice);
                assert_eq!(violation(&seg), violation(&kv));
            }
            _ => {
                t.kv_layout
                    .append(P0, &twice)
                    .expect("kv layout puts the WLog entry");
                t.segmented
                    .append(P0, &twice)
                    .expect("segments put the WLog entry");
            }
        }
        let overwritten = t.segmented.read_record(WsId(7), id(1)).expect("record");
        assert_eq!(
            overwritten.as_ref(),
            Some(&again[0].created[0]),
            "{trust:?}"
        );
        assert_eq!(
            overwritten,
            t.kv_layout.read_record(WsId(7), id(1)).expect("record")
        );
        assert_eq!(
            t.segmented
                .read_wlog(WsId(7), WLogOffset(1), 10)
                .expect("WLog"),
            t.kv_layout
                .read_wlog(WsId(7), WLogOffset(1), 10)
                .expect("WLog"),
            "{trust:?}"
        );
    }
}

/// Whether `e` is a storage error whose outcome is unknown.
fn outcome_unknown(e: &AppendError) -> bool {
    matches!(e, AppendError::Storage(KvError::OutcomeUnknown { .. }))
}

/// Workspace 7: group A creates record 1 (offset 1); group B (offsets 2 and 3) updates it and
/// creates record 2, and its key-value write fails after its log sync; answers the twins and
/// group C (offset 4), which updates record 1 again.
fn failed_write() -> (Twins, Vec<Event>) {
    let t = Twins::new(TrustLevel::Level0);
    let a = [creating(1, 7, 1, 1)];
    let b = [
        updating(2, 7, 2, 1, vec![field("b", "2"), field("name", "second")]),
        creating(3, 7, 3, 2),
    ];
    let c = vec![updating(
        4,
        7,
        4,
        1,
        vec![field("c", "3"), field("at", "4")],
    )];
    for group in [&a[..], &b[..]] {
        t.kv_layout.append(P0, group).expect("kv layout");
    }
    t.segmented.append(P0, &a).expect("group A");
    t.kv.fail_next(FaultOp::Write, 1);
    let err = t
        .segmented
        .append(P0, &b)
        .expect_err("group B's store write fails");
    assert!(outcome_unknown(&err), "{err:?}");
    let message = monoseq_kv::chain(&err);
    assert!(
        message.contains("offsets 2 to 3") && message.contains("written again"),
        "{message}"
    );
    for offset in [2, 3] {
        assert!(
            t.segmented
                .read_event(P0, PLogOffset(offset))
                .expect("read")
                .is_some(),
            "B is in the log"
        );
    }
    assert_eq!(
        t.segmented
            .read_wlog(WsId(7), WLogOffset(2), 10)
            .expect("WLog"),
        vec![],
        "B has no WLog entry"
    );
    assert_eq!(
        t.segmented.read_record(WsId(7), id(2)).expect("record"),
        None
    );
    assert_eq!(
        t.segmented.read_record(WsId(7), id(1)).expect("record"),
        t.kv_layout
            .read_event(P0, PLogOffset(1))
            .expect("read")
            .map(|e| e.created[0].clone()),
        "record 1 as A left it"
    );
    (t, c)
}

/// The twins after group C reached both stores, with what they read alike.
fn assert_redone(t: &mut Twins) {
    t.work.plog.insert(0, 4);
    t.work.wlog.insert(7, 4);
    t.work.records.insert(7, vec![1, 2]);
    assert_same_reads(&t.segmented, &t.kv_layout, &t.work);
    let merged = t
        .segmented
        .read_record(WsId(7), id(1))
        .expect("record")
        .expect("record 1");
    let fields: Vec<_> = merged
        .fields
        .iter()
        .map(|f| (f.name.as_str(), f.value.as_slice()))
        .collect();
    assert_eq!(
        fields,
        [
            ("name", &b"second"[..]),
            ("at", b"4"),
            ("b", b"2"),
            ("c", b"3")
        ],
        "B's and C's updates merged in order"
    );
}

#[test]
fn a_group_whose_store_write_failed_after_its_log_sync_is_written_before_the_next_group() {
    let (mut t, c) = failed_write();
    t.kv_layout.append(P0, &c).expect("kv layout");
    t.segmented
        .append(P0, &c)
        .expect("group C, after B is written again");
    assert_redone(&mut t);
    assert_eq!(
        t.segmented.redo(false).expect("redo"),
        0,
        "nothing left to write"
    );
}

#[test]
fn a_group_whose_store_write_failed_merges_into_records_the_next_writer_read_before() {
    let (mut t, c) = failed_write();
    // A writer read record 1 before its group, as the command processor does.
    let mut stored = StoredRecords::new();
    let read = t
        .segmented
        .read_record(WsId(7), id(1))
        .expect("record")
        .expect("record 1");
    stored.insert(WsId(7), read);
    let current = t.segmented.append_onto(P0, &c, stored).expect("group C");
    t.kv_layout.append(P0, &c).expect("kv layout");
    assert_eq!(
        current.get(WsId(7), id(1)),
        t.kv_layout
            .read_record(WsId(7), id(1))
            .expect("record")
            .as_ref(),
        "the records answered are as stored"
    );
    assert_redone(&mut t);
}

#[test]
fn redo_writes_a_failed_groups_entries_and_records_from_the_log() {
    let (mut t, c) = failed_write();
    assert_eq!(t.segmented.redo(false).expect("redo"), 2, "B's two events");
    assert_eq!(t.segmented.redo(false).expect("redo"), 0, "once");
    assert_eq!(
        t.segmented
            .read_wlog(WsId(7), WLogOffset(2), 10)
            .expect("WLog")
            .len(),
        2
    );
    t.kv_layout.append(P0, &c).expect("kv layout");
    t.segmented.append(P0, &c).expect("group C");
    assert_redone(&mut t);
}

/// A copy of `t`'s store taking its writes until the flag is cleared: what a crash leaves of
/// the batches since the last sync.
fn copy_of_writes(t: &Twins) -> (Arc<MemoryStore>, Arc<AtomicBool>) {
    let copy = Arc::new(MemoryStore::new());
    let copying = Arc::new(AtomicBool::new(true));
    let (to, on) = (Arc::clone(&copy), Arc::clone(&copying));
    t.kv.on_write(move |batch| {
        if on.load(Ordering::SeqCst) {
            to.write(batch).expect("the copy takes the batch");
        }
    });
    (copy, copying)
}

#[test]
fn redo_rebuilds_the_entries_and_records_of_a_store_that_lost_its_last_batches() {
    let mut t = Twins::new(TrustLevel::Level0);
    let (copy, copying) = copy_of_writes(&t);
    for len in [3, 1, 8] {
        t.append(P0, len);
        t.append(P1, len);
    }
    copying.store(false, Ordering::SeqCst);
    for len in [4, 1, 30, 2] {
        t.append(P0, len);
    }
    t.append(P1, 9);
    // A restart: the logs opened again, over the store as the crash left it.
    let dir = t
        .segments
        .dir()
        .parent()
        .expect("the data directory")
        .to_path_buf();
    let reopened = open_segments(&dir, 2);
    let restarted = EventStore::with_segments(Arc::clone(&copy), APP, TrustLevel::Level0, reopened);
    let lost = events_from(&t.segmented, P0, 1, u64::MAX).len() - 12;
    assert!(
        restarted
            .read_wlog(WsId(100), WLogOffset(1), 1_000)
            .expect("WLog")
            .len()
            < t.segmented
                .read_wlog(WsId(100), WLogOffset(1), 1_000)
                .expect("WLog")
                .len(),
        "the copy lacks the last batches"
    );
    assert_eq!(restarted.redo(false).expect("redo") as usize, lost + 9);
    // Byte for byte as the appends wrote them: references to the creating events, and the
    // merged record where an update followed, in the same group or a later one.
    let mut forms = (0, 0);
    for (ws, n) in t.work.record_ids() {
        let value = raw_record(&restarted, ws, n);
        assert_eq!(value, raw_record(&t.segmented, ws, n), "record {n} of {ws}");
        if value[0] == FORMAT_VERSION_RECORD_REF_BARE {
            forms.0 += 1;
        } else {
            forms.1 += 1;
        }
    }
    assert!(forms.0 > 0 && forms.1 > 0, "{forms:?}");
    assert_same_reads(&restarted, &t.segmented, &t.work);
    assert_same_reads(&restarted, &t.kv_layout, &t.work);
    assert_eq!(restarted.redo(false).expect("redo"), 0);
    // And it goes on from the logs' ends.
    let next = t.work.group(P0, 3);
    restarted.append(P0, &next).expect("the next group");
}

#[test]
fn redo_refuses_a_store_holding_more_than_its_log_unless_the_loss_is_accepted() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let kv = faulty();
    let full = tempfile::tempdir().expect("temporary directory");
    let mut work = Workload::default();
    let groups: Vec<_> = (0..3).map(|_| work.group(P0, 4)).collect();
    {
        // The store applied 12 events; the log it meets holds the first 8.
        let ahead = EventStore::with_segments(
            Arc::clone(&kv),
            APP,
            TrustLevel::Level0,
            open_segments(full.path(), 1),
        );
        for g in &groups {
            ahead.append(P0, g).expect("append");
        }
        let short = EventStore::with_segments(
            faulty(),
            APP,
            TrustLevel::Level0,
            open_segments(dir.path(), 1),
        );
        for g in &groups[..2] {
            short.append(P0, g).expect("append");
        }
    }
    let behind = EventStore::with_segments(
        Arc::clone(&kv),
        APP,
        TrustLevel::Level0,
        open_segments(dir.path(), 1),
    );
    let err = behind
        .redo(false)
        .expect_err("the store is ahead of its log");
    let message = monoseq_kv::chain(&err);
    assert!(
        message.contains("up to offset 12") && message.contains("end at offset 8"),
        "{message}"
    );
    let writes = kv.calls(FaultOp::Write);
    assert!(
        behind.append(P0, &work.group(P0, 1)).is_err(),
        "no append before the loss is accepted"
    );
    assert_eq!(kv.calls(FaultOp::Write), writes);
    assert_eq!(behind.redo(true).expect("the loss accepted"), 0);
    assert_eq!(
        behind
            .redo(false)
            .expect("the store taken from the log's end on"),
        0
    );
    let mut at_end = groups[2].clone();
    for e in &mut at_end {
        e.wlog_offset = WLogOffset(e.wlog_offset.0 + 100);
        e.created.clear();
        e.updated.clear();
    }
    behind.append(P0, &at_end).expect("the log's next offsets");
    assert_eq!(
        behind
            .read_event(P0, PLogOffset(12))
            .expect("read")
            .as_ref(),
        at_end.last()
    );
}

/// The embedded engine of data directory `path`, writes durable on `sync`.
fn embedded(path: &Path) -> Arc<EmbeddedStore> {
    let options = Options::default()
        .durability(Durability::Manual)
        .cache_bytes(4 << 20);
    Arc::new(EmbeddedStore::open(path, options).expect("the engine opens"))
}

fn policy(accept_loss: bool) -> OpenPolicy {
    OpenPolicy {
        default_partitions: 2,
        accept_loss,
        ..OpenPolicy::default()
    }
}

/// The high-water mark that acknowledges `events` (one partition's, in order).
fn mark_of(events: &[Event]) -> Mark {
    let mut mark = Mark::default();
    for e in events {
        mark.plog = mark.plog.max(e.plog_offset.0);
        mark.wlog = mark.wlog.max(e.wlog_offset.0);
        for r in &e.created {
            mark.crecord = mark.crecord.max(r.id.0);
        }
    }
    mark
}

/// Appends `groups` of `work`'s events to `store` and to the kv-layout `twin`, then makes them
/// durable and raises each partition's mark over them; answers the events by partition.
fn write_acknowledged<S: KvStore + Clone>(
    dir: &DataDir,
    store: &EventStore<S>,
    twin: &EventStore<Arc<MemoryStore>>,
    work: &mut Workload,
    groups: &[(PartitionId, u64)],
) -> BTreeMap<u32, Vec<Event>> {
    let mut written: BTreeMap<u32, Vec<Event>> = BTreeMap::new();
    for &(p, len) in groups {
        let group = work.group(p, len);
        store
            .append(p, &group)
            .expect("the data directory takes the group");
        twin.append(p, &group).expect("the twin takes the group");
        written.entry(p.0).or_default().extend(group);
    }
    store.sync().expect("the engine syncs");
    for (p, events) in &written {
        dir.marks
            .raise(*p, &mark_of(events))
            .expect("the mark is raised");
    }
    written
}

fn twin() -> EventStore<Arc<MemoryStore>> {
    EventStore::new(Arc::new(MemoryStore::new()), APP, TrustLevel::Level0)
}

#[test]
fn a_new_data_directory_keeps_its_plogs_in_segment_files_its_index_in_chunks_and_serves_them_after_a_reopen()
 {
    let tmp = tempfile::tempdir().expect("temporary directory");
    let path = tmp.path().join("data");
    let (twin, mut work) = (twin(), Workload::default());
    {
        let kv = embedded(&path);
        let dir = open_data_dir(&path, &kv, APP, &policy(false)).expect("a new directory");
        assert!(dir.report.created);
        assert_eq!(dir.identity.key_layout, KEY_LAYOUT_CHUNKS);
        let segments = dir.segments.as_ref().expect("segment files");
        assert_eq!(segments.dir(), path.join(PLOG_DIR));
        for p in 0..2 {
            let first = path
                .join(PLOG_DIR)
                .join(p.to_string())
                .join(format!("{:020}.seg", 1));
            assert!(first.is_file(), "{}", first.display());
        }
        let store = dir.event_store(Arc::clone(&kv), APP, TrustLevel::Level0);
        write_acknowledged(
            &dir,
            &store,
            &twin,
            &mut work,
            &[(P0, 5), (P1, 2), (P0, 40), (P1, 1)],
        );
        assert_same_reads(&store, &twin, &work);
        let plog = store.plog_key(P0, PLogOffset(1));
        assert_eq!(
            kv.get(plog.as_key()).expect("get"),
            None,
            "the engine holds no PLog event"
        );
        assert!(store.is_chunked());
        let wlog = store.wlog_key(WsId(101), WLogOffset(1));
        assert_eq!(
            kv.get(wlog.as_key()).expect("get"),
            None,
            "the engine holds no WLog entry under a key of its own"
        );
    }
    let kv = embedded(&path);
    let dir = open_data_dir(&path, &kv, APP, &policy(false)).expect("reopened");
    assert!(!dir.report.created && dir.report.accepted.is_empty());
    assert_eq!(dir.identity.key_layout, KEY_LAYOUT_CHUNKS);
    let store = dir.event_store(Arc::clone(&kv), APP, TrustLevel::Level0);
    assert!(store.segments().is_some() && store.is_chunked());
    assert_same_reads(&store, &twin, &work);
    write_acknowledged(&dir, &store, &twin, &mut work, &[(P0, 3), (P1, 3)]);
    assert_same_reads(&store, &twin, &work);
}

#[test]
fn opening_a_data_directory_rebuilds_what_its_engine_lost_from_the_segment_files() {
    let tmp = tempfile::tempdir().expect("temporary directory");
    let (twin, mut work) = (twin(), Workload::default());
    let copy = Arc::new(MemoryStore::new());
    {
        let kv = faulty();
        let copying = Arc::new(AtomicBool::new(true));
        let (to, on) = (Arc::clone(&copy), Arc::clone(&copying));
        kv.on_write(move |batch| {
            if on.load(Ordering::SeqCst) {
                to.write(batch).expect("the copy takes the batch");
            }
        });
        let dir = open_data_dir(tmp.path(), &kv, APP, &policy(false)).expect("a new directory");
        let store = dir.event_store(Arc::clone(&kv), APP, TrustLevel::Level0);
        write_acknowledged(&dir, &store, &twin, &mut work, &[(P0, 4), (P1, 4)]);
        copying.store(false, Ordering::SeqCst);
        write_acknowledged(&dir, &store, &twin, &mut work, &[(P0, 6), (P1, 1), (P0, 9)]);
    }
    // The engine as a crash left it, without its last batches; the segment files whole.
    let dir = open_data_dir(tmp.path(), &copy, APP, &policy(false)).expect("reopened");
    assert!(dir.report.accepted.is_empty());
    let store = dir.event_store(Arc::clone(&copy), APP, TrustLevel::Level0);
    assert_eq!(
        store.redo(false).expect("redo"),
        0,
        "opening wrote them again"
    );
    assert_same_reads(&store, &twin, &work);
}

/// Cuts the segment file of partition `p` in `path` before the frame of offset `offset`
/// (whose file holds `events`, from offset 1).
fn cut_log(path: &Path, p: u32, events: &[Event], offset: u64) {
    let file = path
        .join(PLOG_DIR)
        .join(p.to_string())
        .join(format!("{:020}.seg", 1));
    let mut at = monoseq_seglog::HEADER_BYTES;
    for e in events.iter().take_while(|e| e.plog_offset.0 < offset) {
        at += monoseq_seglog::FRAME_HEAD_BYTES + e.encoded_len().expect("encodes") as u64;
    }
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&file)
        .expect("the segment file");
    f.set_len(at).expect("cut");
    f.sync_all().expect("synced");
}

#[test]
fn a_log_cut_below_its_mark_is_refused_and_with_accept_loss_retired_up_to_the_mark() {
    let tmp = tempfile::tempdir().expect("temporary directory");
    let path = tmp.path().join("data");
    let (twin, mut work) = (twin(), Workload::default());
    let written = {
        let kv = embedded(&path);
        let dir = open_data_dir(&path, &kv, APP, &policy(false)).expect("a new directory");
        let store = dir.event_store(Arc::clone(&kv), APP, TrustLevel::Level0);
        write_acknowledged(
            &dir,
            &store,
            &twin,
            &mut work,
            &[(P0, 4), (P0, 3), (P1, 2), (P0, 3)],
        )
    };
    let events = &written[&0];
    let mark = mark_of(events);
    assert_eq!(mark.plog, 10);
    cut_log(&path, 0, events, 7);
    let kv = embedded(&path);
    match open_data_dir(&path, &kv, APP, &policy(false)) {
        Err(e @ DataDirError::Segments { .. }) => {
            let message = e.to_string();
            assert!(message.contains("--accept-loss"), "{message}");
        }
        other => panic!("expected the segment files refused, got {other:?}"),
    }
    let dir = open_data_dir(&path, &kv, APP, &policy(true)).expect("the loss accepted");
    assert_eq!(
        dir.report.accepted,
        vec![monoseq_store::Loss {
            partition: 0,
            plog_end: 6,
            mark
        }]
    );
    assert_eq!(dir.report.retired_partitions, vec![0]);
    let loss = &dir.identity.losses[..];
    assert_eq!((loss.len(), loss[0].plog_from, loss[0].plog_to), (1, 7, 10));
    let segments = dir.segments.as_ref().expect("segment files");
    assert_eq!(
        segments.end(P0).expect("end"),
        11,
        "offsets 7 to 10 are retired in the log"
    );
    let store = dir.event_store(Arc::clone(&kv), APP, TrustLevel::Level0);
    for e in events {
        let read = store.read_event(P0, e.plog_offset).expect("read");
        assert_eq!(
            read.as_ref(),
            (e.plog_offset.0 <= 6).then_some(e),
            "offset {}",
            e.plog_offset
        );
    }
    assert_eq!(
        events_from(&store, P0, 1, u64::MAX),
        events[..6],
        "a walk ends there too"
    );
    let (end, seen) = replayed(&store, P0, 1);
    assert_eq!(
        (end, seen.len()),
        (ReplayEnd::Completed, 6),
        "replay ends at the retired offsets"
    );
    // The engine kept the WLog entries of the lost events: a WLog read leaves them out, as
    // it would had the engine lost them too.
    let mut workspaces: Vec<_> = events.iter().map(|e| e.ws).collect();
    workspaces.dedup();
    for ws in workspaces {
        let kept: Vec<_> = events
            .iter()
            .filter(|e| e.ws == ws && e.plog_offset.0 <= 6)
            .cloned()
            .collect();
        let read = store
            .read_wlog(ws, monoseq_store::WLogOffset(1), 1_000)
            .expect("a WLog read after the loss");
        assert_eq!(read, kept, "workspace {ws}");
    }
    // The next event takes the offset after the mark.
    let next = creating(11, 900, 1, 1_000);
    let taken = [creating(7, 900, 1, 1_000)];
    assert!(matches!(
        store.append(P0, &taken),
        Err(AppendError::NotAtEnd { end: 11, .. })
    ));
    store
        .append(P0, std::slice::from_ref(&next))
        .expect("the offset after the mark");
    let retired = retired_ranges(&dir.identity.losses, 0);
    let page = store
        .read_plog_page(P0, 1, 100, 12, &retired)
        .expect("page");
    let mut want: Vec<PageItem> = events[..6]
        .iter()
        .map(|e| PageItem::Event(Box::new(e.clone())))
        .collect();
    want.push(PageItem::Gap(retired[0]));
    want.push(PageItem::Event(Box::new(next.clone())));
    assert_eq!(page, want);
    assert_eq!(
        store.read_wlog(WsId(900), WLogOffset(1), 10).expect("WLog"),
        vec![next.clone()]
    );
    store.sync().expect("sync");
    dir.marks
        .raise(0, &mark_of(std::slice::from_ref(&next)).max(&mark))
        .expect("raise");
    drop((store, dir, kv));
    // Reopened as it is now, without accepting anything.
    let kv = embedded(&path);
    let dir = open_data_dir(&path, &kv, APP, &policy(false)).expect("reopened");
    assert!(dir.report.accepted.is_empty() && dir.report.retired_partitions.is_empty());
    let store = dir.event_store(Arc::clone(&kv), APP, TrustLevel::Level0);
    assert_eq!(
        store
            .read_plog_page(P0, 1, 100, 12, &retired)
            .expect("page"),
        want
    );
    assert_eq!(
        dir.segments
            .as_ref()
            .expect("segments")
            .end(P0)
            .expect("end"),
        12
    );
}

/// The engine's own records of a store, as a build of key layout 3 wrote them.
fn write_layout_3_meta(kv: &impl KvStore, store_id: &str) {
    let meta = |c: &[u8], v: &[u8]| {
        kv.put(Key::new(b"monoseq/meta", c), v).expect("meta");
    };
    meta(b"partitions", &2u32.to_be_bytes());
    meta(b"key_layout", &KEY_LAYOUT.to_be_bytes());
    meta(b"store_id", store_id.as_bytes());
}

/// What a build of an older `layout` left in `path` through `old`: the identity
/// ("layout-N-store"), marks, and two groups (given to `twin` too), synced.
fn write_old_directory<S: KvStore + Clone>(
    path: &Path,
    layout: u32,
    old: &EventStore<S>,
    twin: &EventStore<Arc<MemoryStore>>,
    work: &mut Workload,
) {
    let mut identity = Identity::new(2, layout, FORMAT_VERSION);
    identity.store_id = format!("layout-{layout}-store");
    identity.write(path).expect("identity");
    let marks = Marks::create(path, 2).expect("marks");
    for (p, len) in [(P0, 5), (P1, 3)] {
        let group = work.group(p, len);
        old.append(p, &group).expect("append");
        twin.append(p, &group).expect("append");
        marks.raise(p.0, &mark_of(&group)).expect("raise");
    }
    old.kv().sync().expect("sync");
}

#[test]
fn a_data_directory_in_key_layout_4_keeps_a_key_per_wlog_entry_and_serves_as_before() {
    let tmp = tempfile::tempdir().expect("temporary directory");
    let path = tmp.path().join("data");
    let (twin, mut work) = (twin(), Workload::default());
    {
        // What a build of layout 4 left: its records in the engine, the identity, marks,
        // segment files and a WLog entry a key.
        let kv = embedded(&path);
        write_layout_3_meta(&*kv, "layout-4-store");
        kv.put(
            Key::new(b"monoseq/meta", b"key_layout"),
            &KEY_LAYOUT_SEGMENTS.to_be_bytes(),
        )
        .expect("meta");
        let segments = open_segments(&path, 2);
        let old = EventStore::with_segments(Arc::clone(&kv), APP, TrustLevel::Level0, segments);
        write_old_directory(&path, KEY_LAYOUT_SEGMENTS, &old, &twin, &mut work);
    }
    for _ in 0..2 {
        let kv = embedded(&path);
        let dir = open_data_dir(&path, &kv, APP, &policy(false)).expect("layout 4 opens");
        assert_eq!(dir.identity.key_layout, KEY_LAYOUT_SEGMENTS);
        let store = dir.event_store(Arc::clone(&kv), APP, TrustLevel::Level0);
        assert!(store.segments().is_some() && !store.is_chunked());
        assert_same_reads(&store, &twin, &work);
        write_acknowledged(&dir, &store, &twin, &mut work, &[(P0, 2)]);
        let last = work.wlog[&101];
        let wlog = store.wlog_key(WsId(101), WLogOffset(last));
        assert!(
            kv.get(wlog.as_key()).expect("get").is_some(),
            "a WLog entry a key, as layout 4 writes it"
        );
    }
}

#[test]
fn a_data_directory_in_key_layout_3_keeps_its_plogs_in_the_engine() {
    let tmp = tempfile::tempdir().expect("temporary directory");
    let path = tmp.path().join("data");
    let (twin, mut work) = (twin(), Workload::default());
    {
        // What a build of layout 3 left: the engine's records, the identity, marks, events.
        let kv = embedded(&path);
        write_layout_3_meta(&*kv, "layout-3-store");
        let old = EventStore::new(Arc::clone(&kv), APP, TrustLevel::Level0);
        write_old_directory(&path, KEY_LAYOUT, &old, &twin, &mut work);
    }
    for _ in 0..2 {
        let kv = embedded(&path);
        let dir = open_data_dir(&path, &kv, APP, &policy(false)).expect("layout 3 opens");
        assert_eq!(dir.identity.key_layout, KEY_LAYOUT);
        assert!(dir.segments.is_none());
        let store = dir.event_store(Arc::clone(&kv), APP, TrustLevel::Level0);
        assert!(store.segments().is_none());
        assert_same_reads(&store, &twin, &work);
        write_acknowledged(&dir, &store, &twin, &mut work, &[(P0, 2)]);
        let last = work.plog[&0];
        let plog = store.plog_key(P0, PLogOffset(last));
        assert!(
            kv.get(plog.as_key()).expect("get").is_some(),
            "the PLog is in the engine"
        );
        assert!(!path.join(PLOG_DIR).exists(), "no segment files");
    }
}

#[test]
fn segment_files_copied_to_another_directory_open_and_hold_the_same_events() {
    let mut t = Twins::new(TrustLevel::Level0);
    for len in [3, 20, 1] {
        t.append(P0, len);
        t.append(P1, len + 1);
    }
    let dest = tempfile::tempdir().expect("temporary directory");
    let bytes = t.segments.copy_to(dest.path()).expect("copied");
    let relative = |files: BTreeMap<PathBuf, Vec<u8>>, root: &Path| -> BTreeMap<PathBuf, Vec<u8>> {
        files
            .into_iter()
            .map(|(p, b)| {
                (
                    p.strip_prefix(root).expect("under the root").to_path_buf(),
                    b,
                )
            })
            .collect()
    };
    let copied = relative(log_bytes(&dest.path().join(PLOG_DIR)), dest.path());
    let source_root = t
        .segments
        .dir()
        .parent()
        .expect("the data directory")
        .to_path_buf();
    // Each file copied up to its data: the active segments without their zero-filled room.
    let source = relative(log_bytes(t.segments.dir()), &source_root);
    assert_eq!(
        copied.keys().collect::<Vec<_>>(),
        source.keys().collect::<Vec<_>>()
    );
    for (path, bytes) in &copied {
        let (data, room) = source[path].split_at(bytes.len());
        assert_eq!(data, bytes.as_slice(), "{}", path.display());
        assert!(room.iter().all(|&b| b == 0), "{}", path.display());
    }
    assert_eq!(bytes, copied.values().map(|b| b.len() as u64).sum::<u64>());
    let ends = [
        t.segments.end(P0).expect("end"),
        t.segments.end(P1).expect("end"),
    ];
    let opened =
        Segments::open(dest.path(), 2, &|p| ends[p as usize]).expect("the copy opens whole");
    let copy =
        EventStore::with_segments(Arc::clone(&t.kv), APP, TrustLevel::Level0, Arc::new(opened));
    assert_same_reads(&copy, &t.segmented, &t.work);
    copy.append(P0, &t.work.group(P0, 2))
        .expect("the copy takes the next group");
}

#[test]
fn an_engine_that_came_up_empty_is_rebuilt_from_the_segment_files_when_the_loss_is_accepted() {
    let tmp = tempfile::tempdir().expect("temporary directory");
    let path = tmp.path().join("data");
    let (twin, mut work) = (twin(), Workload::default());
    {
        let kv = embedded(&path);
        let dir = open_data_dir(&path, &kv, APP, &policy(false)).expect("a new directory");
        let store = dir.event_store(Arc::clone(&kv), APP, TrustLevel::Level0);
        write_acknowledged(&dir, &store, &twin, &mut work, &[(P0, 7), (P1, 3), (P0, 2)]);
    }
    // The engine's files lost: everything but the identity, the marks and the segment files.
    let kept = [
        monoseq_store::IDENTITY_FILE,
        monoseq_store::MARKS_FILE,
        PLOG_DIR,
    ];
    for entry in std::fs::read_dir(&path).expect("the data directory") {
        let entry = entry.expect("entry");
        if !kept.iter().any(|k| entry.file_name() == *k) {
            let p = entry.path();
            if p.is_dir() {
                std::fs::remove_dir_all(&p).expect("removed");
            } else {
                std::fs::remove_file(&p).expect("removed");
            }
        }
    }
    let kv = embedded(&path);
    let refused = open_data_dir(&path, &kv, APP, &policy(false)).expect_err("an empty engine");
    assert!(
        matches!(refused, DataDirError::EngineEmpty { .. }),
        "{refused:?}"
    );
    let dir = open_data_dir(&path, &kv, APP, &policy(true)).expect("accepted");
    assert!(
        dir.report.accepted.is_empty(),
        "the segment files hold every event"
    );
    let store = dir.event_store(Arc::clone(&kv), APP, TrustLevel::Level0);
    assert_same_reads(&store, &twin, &work);
    write_acknowledged(&dir, &store, &twin, &mut work, &[(P0, 2)]);
}

/// A store whose writes reach `synced` only when synced: what a crash leaves of it.
fn durable_copy(kv: &Faulty) -> Arc<MemoryStore> {
    let synced = Arc::new(MemoryStore::new());
    let pending = Arc::new(std::sync::Mutex::new(Vec::<monoseq_kv::WriteBatch>::new()));
    let held = Arc::clone(&pending);
    kv.on_write(move |batch| held.lock().expect("pending").push(batch.clone()));
    let to = Arc::clone(&synced);
    kv.on_sync(move || {
        for batch in pending.lock().expect("pending").drain(..) {
            to.write(&batch).expect("the copy takes the batch");
        }
    });
    synced
}

#[test]
fn an_accepted_loss_interrupted_before_its_retirement_opens_again_without_accepting_it_again() {
    let tmp = tempfile::tempdir().expect("temporary directory");
    let path = tmp.path().join("data");
    let kv = faulty();
    let synced = durable_copy(&kv);
    let (twin, mut work) = (twin(), Workload::default());
    let written = {
        let dir = open_data_dir(&path, &kv, APP, &policy(false)).expect("a new directory");
        let store = dir.event_store(Arc::clone(&kv), APP, TrustLevel::Level0);
        let written = write_acknowledged(&dir, &store, &twin, &mut work, &[(P0, 6), (P0, 4)]);
        kv.sync().expect("sync");
        written
    };
    cut_log(&path, 0, &written[&0], 7);
    // The start that accepts the loss records it, then fails to retire its numbers: every
    // read of the store fails from the read of partition 0's checkpoint on.
    let weak = Arc::downgrade(&kv);
    kv.on_read(move |partition| {
        if partition.first() == Some(&0x05)
            && let Some(kv) = weak.upgrade()
        {
            kv.fail(FaultOp::Read, true);
        }
    });
    let failed = open_data_dir(&path, &kv, APP, &policy(true)).expect_err("retiring fails");
    assert!(
        matches!(failed, DataDirError::Actualize { partition: 0, .. }),
        "{failed:?}"
    );
    assert_eq!(
        Identity::read(&path)
            .expect("identity")
            .expect("identity")
            .losses
            .len(),
        1
    );
    // A crash there, and a start without --accept-loss: the loss is accepted already.
    let dir = open_data_dir(&path, &synced, APP, &policy(false)).expect("the accepted loss");
    assert!(dir.report.accepted.is_empty());
    assert_eq!(dir.report.retired_partitions, vec![0]);
    let store = dir.event_store(Arc::clone(&synced), APP, TrustLevel::Level0);
    store
        .append(P0, &[creating(11, 900, 1, 1_000)])
        .expect("the offset after the mark");
}

/// The stored value of record `n` of `ws`, as the key-value store holds it.
fn raw_record<S: KvStore>(store: &EventStore<S>, ws: u64, n: u64) -> Vec<u8> {
    let key = store.record_key(WsId(ws), id(n));
    store
        .kv()
        .get(key.as_key())
        .expect("get")
        .expect("the record's key")
}

/// Puts `value` as the stored value of record `n` of `ws`.
fn put_raw_record<S: KvStore>(store: &EventStore<S>, ws: u64, n: u64, value: &[u8]) {
    let mut batch = monoseq_kv::WriteBatch::new();
    batch.put(store.record_key(WsId(ws), id(n)).as_key(), value);
    store.kv().write(&batch).expect("the store takes the write");
}

/// The reference to created record `index` of `event` in partition `p`.
fn reference(p: PartitionId, event: &Event, index: u32) -> RecordRef {
    let bytes = event.encode().expect("encodes");
    RecordRef {
        partition: p,
        plog_offset: event.plog_offset,
        index,
        event_crc: monoseq_store::event_crc(&bytes).expect("a header"),
    }
}

#[test]
fn a_wlog_entry_names_its_event_without_a_checksum_of_its_own_in_segment_layout_only() {
    let mut t = Twins::new(TrustLevel::Level0);
    let group = t.append(P0, 20);
    let raw = |store: &dyn KvStore, e: &Event| {
        let key = t.segmented.wlog_key(e.ws, e.wlog_offset);
        store.get(key.as_key()).expect("get").expect("the entry")
    };
    let mut earlier = monoseq_kv::WriteBatch::new();
    for e in &group {
        let r = WLogRef {
            partition: P0,
            plog_offset: e.plog_offset,
            event_crc: monoseq_store::event_crc(&e.encode().expect("encodes")).expect("a header"),
        };
        let (mut bare, mut checked) = (Vec::new(), Vec::new());
        r.encode_bare_into(&mut bare);
        r.encode_into(&mut checked);
        let segmented = raw(t.segmented.kv(), e);
        assert_eq!(segmented, bare, "key layout 4 writes version 5");
        assert_eq!(
            raw(t.kv_layout.kv(), e),
            checked,
            "key layout 3 keeps version 3"
        );
        assert_eq!(segmented.len() + 4, checked.len());
        let key = t.segmented.wlog_key(e.ws, e.wlog_offset);
        earlier.put(key.as_key(), &checked);
    }
    assert_same_reads(&t.segmented, &t.kv_layout, &t.work);
    // Version 3 entries in a layout 4 store (as earlier builds wrote them) read as ever.
    t.segmented
        .kv()
        .write(&earlier)
        .expect("the store takes the write");
    assert_same_reads(&t.segmented, &t.kv_layout, &t.work);
}

#[test]
fn a_created_record_is_stored_as_a_reference_to_its_event_until_updated() {
    let t = Twins::new(TrustLevel::Level0);
    let mut two = creating(1, 7, 1, 1);
    two.created.push(record(2, vec![field("name", "second")]));
    let group = [
        two.clone(),
        creating(2, 7, 2, 3),
        updating(3, 7, 3, 3, vec![field("b", "1")]),
    ];
    for store in [&t.segmented as &dyn AppendTo, &t.kv_layout] {
        store.append_group(P0, &group);
    }
    for (n, index) in [(1, 0), (2, 1)] {
        let value = raw_record(&t.segmented, 7, n);
        let mut want = Vec::new();
        reference(P0, &two, index).encode_bare_into(&mut want);
        assert_eq!(value, want, "record {n}: a reference to its event");
        assert!(value.len() < 16, "{} bytes", value.len());
        assert_eq!(
            raw_record(&t.kv_layout, 7, n)[0],
            FORMAT_VERSION,
            "layout 3 keeps it whole"
        );
    }
    assert_eq!(
        raw_record(&t.segmented, 7, 3)[0],
        FORMAT_VERSION,
        "record 3, updated in its creating group, is stored merged"
    );
    let later = [updating(
        4,
        7,
        4,
        2,
        vec![field("name", "changed"), field("c", "2")],
    )];
    t.segmented.append(P0, &later).expect("the update");
    t.kv_layout.append(P0, &later).expect("the update");
    assert_eq!(
        raw_record(&t.segmented, 7, 2),
        raw_record(&t.kv_layout, 7, 2),
        "now whole"
    );
    assert_eq!(
        raw_record(&t.segmented, 7, 1)[0],
        FORMAT_VERSION_RECORD_REF_BARE
    );
    for n in 1..=3 {
        let read = t.segmented.read_record(WsId(7), id(n)).expect("record");
        assert!(read.is_some());
        assert_eq!(
            read,
            t.kv_layout.read_record(WsId(7), id(n)).expect("record"),
            "{n}"
        );
    }
    // The same update of record 1, merged into the record its reference resolves to.
    let again = [updating(5, 7, 5, 1, vec![field("at", "5")])];
    t.segmented.append(P0, &again).expect("the update");
    t.kv_layout.append(P0, &again).expect("the update");
    assert_eq!(
        raw_record(&t.segmented, 7, 1),
        raw_record(&t.kv_layout, 7, 1)
    );
    // Absence checks see the key either way: level 0 refuses to create record 1 again.
    let (seg, kv) = t.refuse(P0, &[creating(6, 7, 6, 1)]);
    assert_eq!(violation(&seg), violation(&kv));
}

/// An append through either store type, for a loop over both.
trait AppendTo {
    fn append_group(&self, p: PartitionId, group: &[Event]);
}

impl<S: KvStore> AppendTo for EventStore<S> {
    fn append_group(&self, p: PartitionId, group: &[Event]) {
        self.append(p, group).expect("the group");
    }
}

#[test]
fn a_reference_to_a_damaged_event_is_a_read_error_and_to_a_retired_one_no_record() {
    let t = Twins::new(TrustLevel::Level0);
    let first = creating(1, 7, 1, 1);
    let group = [first.clone(), creating(2, 7, 2, 2), creating(3, 7, 3, 3)];
    t.segmented.append(P0, &group).expect("the group");
    t.segments
        .retire_to(P1, 4)
        .expect("offsets of partition 1 retired");
    let dangling_as = |n: u64, r: RecordRef, found: &str, bare: bool| {
        let mut value = Vec::new();
        if bare {
            r.encode_bare_into(&mut value);
        } else {
            r.encode_into(&mut value);
        }
        put_raw_record(&t.segmented, 7, n, &value);
        let err = t.segmented.read_record(WsId(7), id(n)).expect_err("damage");
        let message = err.to_string();
        assert!(matches!(err, ReadError::Dangling { .. }), "{err:?}");
        let place = format!("PLog offset {} of partition {}", r.plog_offset, r.partition);
        assert!(message.contains(&place), "{message}");
        assert!(
            message.contains(found) && message.contains("restore"),
            "{message}"
        );
        // An update of it is refused, and writes nothing.
        let update = [updating(4, 7, 4, n, vec![field("x", "1")])];
        let refused = t.segmented.append(P0, &update).expect_err("refused");
        assert!(
            refused.to_string().contains("damaged") || monoseq_kv::chain(&refused).contains(&place),
            "{refused}"
        );
        assert_eq!(t.segments.end(P0).expect("end"), 4);
    };
    // Each in both versions: with a checksum of its own (4, as earlier builds wrote it) and
    // without (6, as this build writes it): a damaged one dangles either way.
    let dangling = |n: u64, r: RecordRef, found: &str| {
        for bare in [false, true] {
            dangling_as(n, r, found, bare);
        }
    };
    let mut r = reference(P0, &first, 0);
    r.event_crc ^= 1;
    dangling(1, r, "checksum differs");
    dangling(
        1,
        RecordRef {
            plog_offset: PLogOffset(99),
            ..reference(P0, &first, 0)
        },
        "no event",
    );
    // A reference to an offset an accepted loss retired: the record was lost with its event,
    // read as absent (as the event's WLog entry is left out), and an update of it is refused
    // as of an unknown record, with nothing written.
    let mut value = Vec::new();
    RecordRef {
        partition: P1,
        plog_offset: PLogOffset(2),
        ..reference(P0, &first, 0)
    }
    .encode_into(&mut value);
    put_raw_record(&t.segmented, 7, 2, &value);
    assert_eq!(
        t.segmented.read_record(WsId(7), id(2)).expect("a read"),
        None
    );
    let update = [updating(4, 7, 4, 2, vec![field("x", "1")])];
    let refused = t.segmented.append(P0, &update).expect_err("refused");
    assert!(
        matches!(refused, AppendError::UnknownRecord { .. }),
        "{refused:?}"
    );
    assert_eq!(t.segments.end(P0).expect("end"), 4);
    dangling(3, reference(P0, &first, 1), "does not create");
    dangling(3, reference(P0, &first, 0), "does not create");
    // A frame damaged in its segment file: the log's own check refuses it (a reopened log
    // cuts it, when above its durable end, and the reference dangles as above).
    let mut value = Vec::new();
    reference(P0, &first, 0).encode_into(&mut value);
    put_raw_record(&t.segmented, 7, 1, &value);
    let bytes = first.encode().expect("encodes");
    let mut damaged = false;
    for (path, mut file) in log_bytes(t.segments.dir()) {
        if let Some(at) = file
            .windows(bytes.len())
            .position(|w| w == bytes.as_slice())
        {
            file[at + bytes.len() - 2] ^= 0x40;
            std::fs::write(&path, &file).expect("damaged");
            damaged = true;
        }
    }
    assert!(damaged, "the event's frame is in a segment file");
    let err = t.segmented.read_record(WsId(7), id(1));
    assert!(
        matches!(err, Err(ReadError::Storage(KvError::Corrupted { .. }))),
        "{err:?}"
    );
}

/// Segment logs of 2 partitions in a new directory on the disk the tests build on (ext4 here),
/// where one flush covers every partition ([`Segments::shares_flush`]); `None` (the test is
/// skipped, and says so) elsewhere.
fn shared_flush_segments() -> Option<(tempfile::TempDir, Arc<Segments>)> {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("a directory");
    let segments = open_segments(dir.path(), 2);
    if !segments.shares_flush() {
        eprintln!(
            "skipped: {} is not on ext4 (no shared flush)",
            dir.path().display()
        );
        return None;
    }
    Some((dir, segments))
}

/// A writer's group on segments that share one flush ([`Segments::shares_flush`], ext4):
/// its WLog entries and records reach the key-value store only once a sync made its frames
/// durable, so the store never holds what the log may lose; a group never applied (its mark's
/// raise failed) is written from the log before the partition's next group.
#[test]
fn a_deferred_groups_entries_and_records_wait_for_the_flush_and_an_unapplied_one_is_redone() {
    let Some((_dir, segments)) = shared_flush_segments() else {
        return;
    };
    let kv = faulty();
    let store = EventStore::with_segments(Arc::clone(&kv), APP, TrustLevel::Level0, segments);
    let first = vec![creating(1, 7, 1, 1), creating(2, 7, 2, 2)];
    store
        .append_deferred(P0, &first, StoredRecords::default())
        .expect("the group is written back");
    let wlog =
        |store: &EventStore<Faulty>| store.read_wlog(WsId(7), WLogOffset(1), 10).expect("a read");
    assert!(
        wlog(&store).is_empty(),
        "the WLog entries reached the store before the flush"
    );
    assert_eq!(store.read_record(WsId(7), id(1)).expect("a read"), None);
    store.sync().expect("the flush");
    store.apply_deferred(P0).expect("the batch");
    assert_eq!(wlog(&store).len(), 2);
    assert!(store.read_record(WsId(7), id(2)).expect("a read").is_some());
    // Never applied: the next group writes it from the log first.
    let second = vec![creating(3, 7, 3, 3)];
    store
        .append_deferred(P0, &second, StoredRecords::default())
        .expect("the group is written back");
    let third = vec![creating(4, 7, 4, 4)];
    store
        .append_deferred(P0, &third, StoredRecords::default())
        .expect("the group is written back");
    store.sync().expect("the flush");
    store.apply_deferred(P0).expect("the batch");
    let events = wlog(&store);
    assert_eq!(
        events.iter().map(|e| e.plog_offset.0).collect::<Vec<_>>(),
        [1, 2, 3, 4],
        "the unapplied group's entries are missing"
    );
    assert!(store.read_record(WsId(7), id(3)).expect("a read").is_some());
    // Applying again finds nothing kept.
    store.apply_deferred(P0).expect("nothing to apply");
}

/// The page cache's counts of the pages of `partition`'s segment files in data directory `dir`,
/// summed.
#[cfg(target_os = "linux")]
fn segment_pages(dir: &Path, partition: u32) -> monoseq_seglog::page_cache::PageCounts {
    let log = dir.join(PLOG_DIR).join(partition.to_string());
    let mut sum = monoseq_seglog::page_cache::PageCounts::default();
    for entry in std::fs::read_dir(&log).expect("the log's directory") {
        let path = entry.expect("an entry").path();
        if path.extension().is_some_and(|e| e == "seg") {
            let file = std::fs::File::open(&path).expect("a segment");
            let counts = monoseq_seglog::page_cache::page_counts(&file)
                .expect("cachestat(2) (Linux 6.5 or later)");
            sum.dirty += counts.dirty;
            sum.writeback += counts.writeback;
        }
    }
    sum
}

/// On a shared flush a deferred group's append leaves its frames in the page cache, and the
/// flush ([`EventStore::sync`]) writes back every partition's before it flushes the disk's
/// cache: none of their pages is dirty or still under writeback when it returns.
#[cfg(target_os = "linux")]
#[test]
fn the_shared_flush_writes_back_every_partitions_deferred_frames_before_it_returns() {
    let Some((dir, segments)) = shared_flush_segments() else {
        return;
    };
    let store = EventStore::with_segments(faulty(), APP, TrustLevel::Level0, segments);
    for (partition, ws) in [(P0, 7), (P1, 8)] {
        let group: Vec<Event> = (1..=20).map(|n| creating(n, ws, n, n)).collect();
        store
            .append_deferred(partition, &group, StoredRecords::default())
            .expect("the group is appended");
    }
    for p in 0..2 {
        let pages = segment_pages(dir.path(), p);
        assert!(
            pages.dirty > 0,
            "partition {p}'s frames were written back at its append, not by the flush: {pages:?}"
        );
    }
    store.sync().expect("the flush");
    for p in 0..2 {
        let pages = segment_pages(dir.path(), p);
        assert_eq!(
            (pages.dirty, pages.writeback),
            (0, 0),
            "partition {p}'s frames are not all on the disk after the flush"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Key layout 5: the WLog entries and created records' references held and written in chunks

/// The stored keys of `kv` whose partition key starts with `tag`.
fn keys_tagged(kv: &MemoryStore, tag: u8) -> usize {
    kv.keys()
        .iter()
        .filter(|k| k.partition.first() == Some(&tag))
        .count()
}

/// A chunked store over `kv` and the segment files of `t`'s directory, opened again as a
/// restart opens them, its held index read back from the files.
fn restarted_chunked<S: KvStore>(t: &Twins, kv: S, chunk_events: usize) -> EventStore<S> {
    let dir = t.segments.dir().parent().expect("the data directory");
    let reopened = open_chunked(dir, chunk_events);
    let store = EventStore::with_segments(kv, APP, TrustLevel::Level0, reopened);
    store.redo(false).expect("redo");
    store
}

#[test]
fn chunked_appends_read_as_the_kv_layout_whether_held_or_in_chunks() {
    let mut t = Twins::chunked(TrustLevel::Level0, 7);
    for (round, len) in [2, 3, 2, 6, 1, 9, 4, 1, 1, 12, 5].into_iter().enumerate() {
        t.append(P0, len);
        t.append(P1, (len + round as u64) % 5 + 1);
        assert_same_reads(&t.segmented, &t.kv_layout, &t.work);
    }
    let kv = t.kv.inner();
    assert_eq!(
        keys_tagged(kv, 0x02),
        0,
        "no WLog entry under a key of its own"
    );
    assert!(keys_tagged(kv, 0x09) > 0, "WLog chunks");
    assert!(keys_tagged(kv, 0x0a) > 0, "records chunks");
    let entries: usize = t.work.wlog.values().map(|&n| n as usize).sum();
    assert!(
        keys_tagged(kv, 0x09) * 2 < entries,
        "{} WLog chunks for {entries} entries",
        keys_tagged(kv, 0x09)
    );
}

#[test]
fn a_restart_reads_the_held_index_back_from_the_segment_files() {
    let mut t = Twins::chunked(TrustLevel::Level0, 10);
    for len in [4, 9, 3, 2] {
        t.append(P0, len);
        t.append(P1, len + 1);
    }
    let restarted = restarted_chunked(&t, Arc::clone(&t.kv), 10);
    assert_same_reads(&restarted, &t.kv_layout, &t.work);
    // It goes on from the logs' ends, closing chunks that began before the restart.
    for len in [5, 8, 1] {
        let group = t.work.group(P0, len);
        restarted.append(P0, &group).expect("the next group");
        t.kv_layout.append(P0, &group).expect("kv layout");
    }
    assert_same_reads(&restarted, &t.kv_layout, &t.work);
    let again = restarted_chunked(&t, Arc::clone(&t.kv), 10);
    assert_same_reads(&again, &t.kv_layout, &t.work);
}

#[test]
fn a_restart_after_the_engine_lost_its_last_batches_writes_their_chunks_again() {
    let mut t = Twins::chunked(TrustLevel::Level0, 6);
    let (copy, copying) = copy_of_writes(&t);
    for len in [3, 1, 8] {
        t.append(P0, len);
        t.append(P1, len);
    }
    copying.store(false, Ordering::SeqCst);
    for len in [4, 1, 9, 2] {
        t.append(P0, len);
    }
    assert!(keys_tagged(&copy, 0x09) < keys_tagged(t.kv.inner(), 0x09));
    let restarted = restarted_chunked(&t, Arc::clone(&copy), 6);
    assert_same_reads(&restarted, &t.kv_layout, &t.work);
    let next = t.work.group(P0, 7);
    restarted.append(P0, &next).expect("the next group");
    t.kv_layout.append(P0, &next).expect("kv layout");
    assert_same_reads(&restarted, &t.kv_layout, &t.work);
}

/// Events `from..from + len` of workspace 7 (PLog and WLog offsets and record IDs alike), each
/// creating a record: nothing for the engine but index entries, held in memory.
fn only_creating(from: u64, len: u64) -> Vec<Event> {
    (from..from + len).map(|n| creating(n, 7, n, n)).collect()
}

#[test]
fn groups_adding_only_to_the_held_index_write_nothing_to_the_engine_until_their_applied_end_lags() {
    let t = Twins::chunked(TrustLevel::Level0, 100_000);
    let append = |group: &[Event]| {
        t.segmented.append(P0, group).expect("segmented");
        t.kv_layout.append(P0, group).expect("kv layout");
    };
    let writes = || t.kv.calls(FaultOp::Write);
    let before = writes();
    let lag = APPLIED_LAG_MAX as u64;
    let mut next = 1;
    while next - 1 + 100 < lag {
        append(&only_creating(next, 100));
        next += 100;
    }
    assert_eq!(
        writes(),
        before,
        "groups held only, their applied end left out"
    );
    append(&only_creating(next, 100));
    next += 100;
    assert_eq!(
        writes(),
        before + 1,
        "the applied end recorded at the lag bound"
    );
    // An update is the engine's to keep: written at once, with the applied end.
    append(&[updating(next, 7, next, 3, vec![field("name", "second")])]);
    next += 1;
    assert_eq!(writes(), before + 2, "the update written");
    for _ in 0..3 {
        append(&only_creating(next, 10));
        next += 10;
    }
    assert_eq!(writes(), before + 2, "held only again");
    // A restart (a crash: nothing was closed) redoes the events whose applied end the engine
    // does not hold, and reads as the key-value layout.
    let dir = t.segments.dir().parent().expect("the data directory");
    let reopened = open_chunked(dir, 100_000);
    let restarted = EventStore::with_segments(Arc::clone(&t.kv), APP, TrustLevel::Level0, reopened);
    assert_eq!(
        restarted.redo(false).expect("redo"),
        30,
        "the last three groups"
    );
    let reads = |store: &EventStore<Faulty>| {
        let wlog = store
            .read_wlog(WsId(7), WLogOffset(1), 10_000)
            .expect("WLog");
        let records: Vec<_> = (1..next)
            .map(|n| store.read_record(WsId(7), id(n)).expect("record"))
            .collect();
        (wlog, records)
    };
    let (wlog, records) = reads(&restarted);
    assert_eq!(wlog.len() as u64, next - 1);
    assert_eq!(
        (wlog, records),
        (
            t.kv_layout
                .read_wlog(WsId(7), WLogOffset(1), 10_000)
                .expect("WLog"),
            (1..next)
                .map(|n| t.kv_layout.read_record(WsId(7), id(n)).expect("record"))
                .collect()
        )
    );
    assert_eq!(restarted.redo(false).expect("redo"), 0, "once");
    restarted
        .append(P0, &only_creating(next, 5))
        .expect("it goes on from the log's end");
}

#[test]
fn a_chunk_closing_write_that_failed_is_written_again_before_the_next_group() {
    let mut t = Twins::chunked(TrustLevel::Level0, 5);
    t.append(P0, 3);
    let closing = t.work.group(P0, 4);
    t.kv_layout.append(P0, &closing).expect("kv layout");
    t.kv.fail_next(FaultOp::Write, 1);
    let err = t
        .segmented
        .append(P0, &closing)
        .expect_err("the write fails");
    assert!(outcome_unknown(&err), "{err:?}");
    let before = keys_tagged(t.kv.inner(), 0x09);
    t.append(P0, 2);
    assert!(
        keys_tagged(t.kv.inner(), 0x09) > before,
        "the chunks written"
    );
    assert_same_reads(&t.segmented, &t.kv_layout, &t.work);
    let restarted = restarted_chunked(&t, Arc::clone(&t.kv), 5);
    assert_same_reads(&restarted, &t.kv_layout, &t.work);
}

#[test]
fn level0_refuses_a_wlog_offset_or_record_id_held_or_in_a_chunk_and_writes_nothing() {
    let mut t = Twins::chunked(TrustLevel::Level0, 4);
    t.append(P0, 4);
    t.append(P0, 2);
    // In chunks: events 1 to 4 (workspace 101's WLog offset 1, workspace 102's record 2);
    // held: events 5 and 6 (workspace 100's record 5, workspace 101's WLog offset 2).
    let wlog_chunked = [creating(7, 101, 1, 90)];
    let wlog_held = [creating(7, 101, 2, 91)];
    let record_chunked = [creating(7, 102, 2, 2)];
    let record_held = [creating(7, 100, 2, 5)];
    let in_group = [creating(7, 101, 3, 92), creating(8, 101, 4, 92)];
    for (group, slot) in [
        (
            &wlog_chunked[..],
            Slot::WLog {
                ws: WsId(101),
                offset: WLogOffset(1),
            },
        ),
        (
            &wlog_held[..],
            Slot::WLog {
                ws: WsId(101),
                offset: WLogOffset(2),
            },
        ),
        (
            &record_chunked[..],
            Slot::Record {
                ws: WsId(102),
                id: id(2),
            },
        ),
        (
            &record_held[..],
            Slot::Record {
                ws: WsId(100),
                id: id(5),
            },
        ),
    ] {
        let err = t.refuse_segmented(P0, group);
        assert_eq!(violation(&err), (0, slot), "{err}");
    }
    let err = t.refuse_segmented(P0, &in_group);
    assert_eq!(
        violation(&err),
        (
            1,
            Slot::Record {
                ws: WsId(101),
                id: id(92)
            }
        ),
        "{err}"
    );
    assert_same_reads(&t.segmented, &t.kv_layout, &t.work);
    // The next numbers are taken.
    t.segmented
        .append(P0, &[creating(7, 101, 3, 93)])
        .expect("the next WLog offset and a new record");
}

#[test]
fn levels_1_and_2_put_a_record_created_again_under_its_own_key_and_refuse_a_wlog_offset_taken() {
    for trust in [TrustLevel::Level1, TrustLevel::Level2] {
        let mut t = Twins::chunked(trust, 4);
        t.append(P0, 6);
        // Record 1 of workspace 101, in a chunk, created again by a later event.
        let mut again = creating(7, 101, 3, 1);
        again.created[0].fields = vec![field("name", "again")];
        t.segmented.append(P0, &[again.clone()]).expect("put");
        t.kv_layout.append(P0, &[again.clone()]).expect("put");
        t.work.plog.insert(0, 7);
        t.work.wlog.insert(101, 3);
        assert_eq!(
            t.segmented.read_record(WsId(101), id(1)).expect("read"),
            Some(again.created[0].clone()),
            "{trust:?}"
        );
        assert_same_reads(&t.segmented, &t.kv_layout, &t.work);
        let restarted = restarted_chunked(&t, Arc::clone(&t.kv), 4).with_trust(trust);
        assert_same_reads(&restarted, &t.kv_layout, &t.work);
        let err = t.refuse_segmented(P0, &[creating(8, 101, 2, 95)]);
        assert_eq!(
            violation(&err),
            (
                0,
                Slot::WLog {
                    ws: WsId(101),
                    offset: WLogOffset(2)
                }
            ),
            "a workspace's WLog grows at its end only, at {trust:?}"
        );
    }
}

#[test]
fn a_workspace_moving_between_partitions_keeps_its_chunks_apart() {
    // Workspace 7 writes on P0, then P1, then P0 again, each partition closing its chunks
    // in its own time: every chunk holds a run no other chunk's range crosses.
    moving_workspace_keeps_its_chunks_apart([0, 1]);
}

/// As above, the workspace starting on the higher partition: a start reads the partitions'
/// held parts back in partition order, so its later runs are held before its earlier ones.
#[test]
fn a_workspace_moving_to_a_lower_partition_keeps_its_chunks_apart() {
    moving_workspace_keeps_its_chunks_apart([1, 0]);
}

/// Workspace 7 writes on `first`, then `then`, alternately, each partition closing its chunks
/// in its own time, with a restart in the middle: every read answers as the key-value layout.
fn moving_workspace_keeps_its_chunks_apart([first, then]: [usize; 2]) {
    let t = Twins::chunked(TrustLevel::Level0, 6);
    let (mut plog, mut wlog) = ([0u64; 2], 0u64);
    let mut all = Vec::new();
    for (p, len) in [
        (first, 2),
        (then, 3),
        (first, 2),
        (then, 4),
        (first, 3),
        (then, 2),
        (first, 5),
        (then, 1),
    ] {
        let group: Vec<Event> = (0..len)
            .map(|_| {
                plog[p] += 1;
                wlog += 1;
                creating(plog[p], 7, wlog, wlog)
            })
            .collect();
        let partition = PartitionId(p as u32);
        t.segmented.append(partition, &group).expect("segmented");
        t.kv_layout.append(partition, &group).expect("kv layout");
        all.extend(group);
    }
    let check = |store: &EventStore<Faulty>, last: u64| {
        for from in 1..=last {
            assert_eq!(
                store
                    .read_wlog(WsId(7), WLogOffset(from), 1_000)
                    .expect("WLog"),
                t.kv_layout
                    .read_wlog(WsId(7), WLogOffset(from), 1_000)
                    .expect("WLog"),
                "from {from}"
            );
        }
        for n in 1..=last {
            assert_eq!(
                store.read_record(WsId(7), id(n)).expect("record"),
                t.kv_layout.read_record(WsId(7), id(n)).expect("record"),
                "record {n}"
            );
        }
    };
    check(&t.segmented, wlog);
    assert_eq!(all.len() as u64, wlog);
    let restarted = restarted_chunked(&t, Arc::clone(&t.kv), 6);
    check(&restarted, wlog);
    // Both partitions go on until everything is in chunks.
    let (first, then) = (PartitionId(first as u32), PartitionId(then as u32));
    for p in [first, then, first, then] {
        let i = p.0 as usize;
        plog[i] += 1;
        wlog += 1;
        let group: Vec<Event> = (0..6)
            .map(|k| creating(plog[i] + k, 7, wlog + k, wlog + k))
            .collect();
        plog[i] += 5;
        wlog += 5;
        restarted.append(p, &group).expect("segmented");
        t.kv_layout.append(p, &group).expect("kv layout");
    }
    check(&restarted, wlog);
}

#[test]
fn a_damaged_chunk_is_a_read_error_naming_it() {
    let mut t = Twins::chunked(TrustLevel::Level0, 3);
    t.append(P0, 9);
    let kv = t.kv.inner();
    let chunk = kv
        .keys()
        .into_iter()
        .find(|k| k.partition.first() == Some(&0x09))
        .expect("a WLog chunk");
    let mut value = kv.get(chunk.as_key()).expect("get").expect("the chunk");
    value.truncate(value.len() - 2);
    let mut batch = monoseq_kv::WriteBatch::new();
    batch.put(chunk.as_key(), &value);
    kv.write(&batch).expect("write");
    let damaged = t
        .work
        .workspaces()
        .into_iter()
        .find_map(|ws| t.segmented.read_wlog(WsId(ws), WLogOffset(1), 100).err())
        .expect("a read of the damaged chunk fails");
    assert!(
        matches!(
            damaged,
            ReadError::Corrupt {
                slot: Slot::WLog { .. },
                ..
            }
        ),
        "{damaged:?}"
    );
    assert!(damaged.to_string().contains("damaged"), "{damaged}");
}

#[test]
fn a_records_chunk_under_another_key_than_its_run_is_a_read_error() {
    let mut t = Twins::chunked(TrustLevel::Level0, 30);
    t.append(P0, 60);
    let kv = t.kv.inner();
    let chunk = kv
        .keys()
        .into_iter()
        .find(|k| k.partition.first() == Some(&0x0a))
        .expect("a records chunk");
    let first = u64::from_be_bytes(chunk.clustering.as_slice().try_into().expect("be64"));
    let value = kv.get(chunk.as_key()).expect("get").expect("the chunk");
    let mut batch = monoseq_kv::WriteBatch::new();
    batch.put(
        Key::new(&chunk.partition, &(first + 1).to_be_bytes()),
        &value,
    );
    kv.write(&batch).expect("write");
    let misplaced = t
        .work
        .record_ids()
        .into_iter()
        .filter(|&(_, n)| id(n).0 > first + 1)
        .find_map(|(ws, n)| t.segmented.read_record(WsId(ws), id(n)).err())
        .expect("a read through the misplaced chunk fails");
    assert!(
        matches!(
            misplaced,
            ReadError::Misplaced {
                slot: Slot::Record { .. },
                ..
            }
        ),
        "{misplaced:?}"
    );
}
