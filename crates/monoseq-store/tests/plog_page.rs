//! Ordered page reads of a PLog for consumers: offset order, nothing at or beyond the end,
//! retired ranges as explicit gaps, a page that stops at a hole no loss retired, and pages
//! across several log blocks; pages through a filter hold only the events it keeps, say how far
//! they read, and report a damaged or misplaced event the filter would drop; pages of the
//! stored bytes hold what decoded pages hold, in the key-value store and in segment files.

use std::sync::Arc;

use monoseq_core::{PLogOffset, WsId, WsKind};
use monoseq_kv::{KvStore, MemoryStore};
use monoseq_store::{
    AcceptedLoss, AppId, ArgObject, DecodeError, Event, EventPeek, EventStore, Field, Gap,
    LOG_BLOCK_EVENTS, LossCause, Mark, PageItem, PartitionId, PlogPage, ReadError, Record,
    RecordId, RecordKind, Segments, Slot, StoredItem, TrustLevel, WLogOffset, retired_ranges,
};

const P: PartitionId = PartitionId(2);

fn store() -> EventStore<Arc<MemoryStore>> {
    EventStore::new(Arc::new(MemoryStore::new()), AppId(9), TrustLevel::Level0)
}

fn event(plog: u64) -> Event {
    Event {
        plog_offset: PLogOffset(plog),
        ws: WsId(P.0.into()),
        ws_kind: WsKind(1),
        wlog_offset: WLogOffset(plog),
        registered_at_ms: 42,
        command: "app.Cmd".into(),
        argument: None,
        created: vec![],
        updated: vec![],
        idempotency: None,
    }
}

fn append(store: &EventStore<Arc<MemoryStore>>, offsets: impl IntoIterator<Item = u64>) {
    let events: Vec<Event> = offsets.into_iter().map(event).collect();
    store.append(P, &events).expect("append");
}

/// The page as offsets, gaps as `(from, to)` ranges.
fn shape(items: &[PageItem]) -> Vec<(u64, u64)> {
    items
        .iter()
        .map(|i| match i {
            PageItem::Event(e) => (e.plog_offset.0, e.plog_offset.0),
            PageItem::Gap(g) => (g.from, g.to),
        })
        .collect()
}

fn loss(from: u64, to: u64, cause: LossCause) -> AcceptedLoss {
    AcceptedLoss {
        partition: P.0,
        plog_from: from,
        plog_to: to,
        mark: Mark {
            plog: to,
            ..Mark::default()
        },
        accepted_at_ms: 1,
        cause,
    }
}

#[test]
fn a_page_holds_events_in_offset_order_and_nothing_at_or_beyond_the_end() {
    let s = store();
    append(&s, 1..=10);
    let page = s.read_plog_page(P, 3, 100, 8, &[]).expect("read");
    assert_eq!(
        shape(&page),
        (3..8).map(|o| (o, o)).collect::<Vec<_>>(),
        "events 8, 9 and 10 are stored but not below the end: a crash could take them back"
    );
    let page = s.read_plog_page(P, 1, 4, 11, &[]).expect("read");
    assert_eq!(shape(&page), vec![(1, 1), (2, 2), (3, 3), (4, 4)]);
    assert!(
        s.read_plog_page(P, 11, 4, 11, &[])
            .expect("read")
            .is_empty()
    );
    assert!(
        s.read_plog_page(P, 50, 4, 11, &[])
            .expect("read")
            .is_empty()
    );
}

#[test]
fn a_retired_range_is_delivered_as_one_gap_in_its_place() {
    let s = store();
    append(&s, 1..=4);
    append(&s, 10..=12);
    let losses = [
        loss(5, 9, LossCause::AcceptedLoss),
        loss(1, 0, LossCause::Restore),
    ];
    let retired = retired_ranges(&losses, P.0);
    assert_eq!(retired.len(), 1, "an empty range retires nothing");
    let page = s.read_plog_page(P, 1, 100, 13, &retired).expect("read");
    assert_eq!(
        shape(&page),
        vec![
            (1, 1),
            (2, 2),
            (3, 3),
            (4, 4),
            (5, 9),
            (10, 10),
            (11, 11),
            (12, 12)
        ]
    );
    assert!(matches!(
        page[4],
        PageItem::Gap(Gap {
            cause: LossCause::AcceptedLoss,
            ..
        })
    ));
    let inside = s.read_plog_page(P, 7, 2, 13, &retired).expect("read");
    assert_eq!(
        shape(&inside),
        vec![(7, 9), (10, 10)],
        "a read from inside starts there"
    );
    assert_eq!(inside[0].next_offset(), 10);
}

#[test]
fn a_hole_no_loss_retired_stops_the_page_instead_of_being_skipped() {
    let s = store();
    append(&s, 1..=3);
    append(&s, 5..=6);
    let page = s.read_plog_page(P, 1, 100, 7, &[]).expect("read");
    assert_eq!(shape(&page), vec![(1, 1), (2, 2), (3, 3)]);
    let page = s.read_plog_page(P, 4, 100, 7, &[]).expect("read");
    assert!(
        page.is_empty(),
        "offset 4 is missing: nothing after it is delivered"
    );
}

#[test]
fn pages_cross_log_blocks_without_losing_an_event() {
    let s = store();
    let last = LOG_BLOCK_EVENTS * 2 + 7;
    append(&s, 1..=last);
    let mut next = 1;
    let mut seen = 0;
    while next <= last {
        let page = s.read_plog_page(P, next, 999, last + 1, &[]).expect("read");
        assert!(!page.is_empty());
        for item in &page {
            assert_eq!(
                shape(std::slice::from_ref(item))[0].0,
                next,
                "in order, none skipped"
            );
            next = item.next_offset();
            seen += 1;
        }
    }
    assert_eq!(seen, last);
}

/// The page from `from` read as stored bytes, each event decoded here (and checked to name the
/// offset it was read at), and where the next page starts.
fn stored_page(
    s: &EventStore<Arc<MemoryStore>>,
    (from, limit, end): (u64, usize, u64),
    retired: &[Gap],
) -> (Vec<PageItem>, u64) {
    let mut items = Vec::new();
    let next = s
        .visit_plog_page_stored(P, (from, limit, end), retired, &mut |item| {
            items.push(match item {
                StoredItem::Event { offset, bytes } => {
                    let e = Event::decode(bytes).expect("the stored bytes are an event");
                    assert_eq!(e.plog_offset.0, offset);
                    PageItem::Event(Box::new(e))
                }
                StoredItem::Gap(gap) => PageItem::Gap(gap),
            });
        })
        .expect("read");
    (items, next)
}

/// Every page from a spread of offsets and sizes below `end`: the stored bytes' page is the
/// decoded page.
fn assert_stored_pages_alike(s: &EventStore<Arc<MemoryStore>>, end: u64, retired: &[Gap]) {
    for from in [1, 3, 4, 5, 7, 10, LOG_BLOCK_EVENTS, end - 1, end, end + 5] {
        for limit in [1, 2, 999, 10_000] {
            let decoded = s
                .read_plog_page_where(P, (from, limit, end), retired, None)
                .expect("read");
            let stored = stored_page(s, (from, limit, end), retired);
            assert_eq!(
                stored,
                (decoded.items, decoded.next),
                "from {from}, limit {limit}"
            );
        }
    }
}

#[test]
fn a_page_of_stored_bytes_holds_what_a_decoded_page_holds_in_the_kv_store_and_segment_files() {
    let last = LOG_BLOCK_EVENTS * 2 + 7;
    let retired = retired_ranges(&[loss(5, 9, LossCause::AcceptedLoss)], P.0);
    let kv = store();
    append(&kv, 1..=4);
    append(&kv, 10..=last);
    assert_stored_pages_alike(&kv, last + 1, &retired);
    let dir = tempfile::tempdir().expect("a directory");
    let segments = Arc::new(Segments::open(dir.path(), P.0 + 1, &|_| 1).expect("open"));
    let logged = EventStore::with_segments(
        Arc::new(MemoryStore::new()),
        AppId(9),
        TrustLevel::Level0,
        Arc::clone(&segments),
    );
    append(&logged, 1..=4);
    // The retired offsets hold the one byte `00` in the log: no event, inside the gap.
    segments.retire_to(P, 9).expect("retire");
    append(&logged, 10..=last);
    assert_stored_pages_alike(&logged, last + 1, &retired);
    let whole = stored_page(&logged, (1, 10_000, last + 1), &retired);
    assert_eq!(
        shape(&whole.0)[..6],
        [(1, 1), (2, 2), (3, 3), (4, 4), (5, 9), (10, 10)]
    );
    // A hole no loss retired stops the page, as it stops a decoded one.
    let holed = store();
    append(&holed, 1..=3);
    append(&holed, 5..=6);
    assert_eq!(stored_page(&holed, (1, 100, 7), &[]).1, 4);
    assert_eq!(stored_page(&holed, (4, 100, 7), &[]), (vec![], 4));
}

/// The command a filter keeps in the filtered page tests.
const MARKED: &str = "app.Marked";

/// Event `plog`, named [`MARKED`] when `marked`, with an argument, a created record and an
/// update of record 1 after the first (so a dropped event's structure is read past, not only its head).
fn full_event(plog: u64, marked: bool) -> Event {
    let fields = vec![Field::new("name", b"value".to_vec())];
    let record = |id| Record {
        id: RecordId(id),
        kind: RecordKind::CDoc,
        name: "app.Doc".into(),
        fields: fields.clone(),
    };
    Event {
        command: if marked { MARKED } else { "app.Plain" }.into(),
        argument: Some(ArgObject {
            id: RecordId(1_000 + plog),
            kind: RecordKind::ODoc,
            name: "app.Arg".into(),
            fields: fields.clone(),
            children: vec![],
        }),
        created: vec![record(plog)],
        updated: if plog > 1 { vec![record(1)] } else { vec![] },
        ..event(plog)
    }
}

/// Appends events at `offsets` (in order, each its own group), those in `marked` named
/// [`MARKED`].
fn append_marked(store: &EventStore<Arc<MemoryStore>>, offsets: &[u64], marked: &[u64]) {
    for &o in offsets {
        store
            .append(P, &[full_event(o, marked.contains(&o))])
            .expect("append");
    }
}

fn marked(e: &EventPeek<'_>) -> bool {
    e.command == MARKED.as_bytes()
}

fn filtered(
    s: &EventStore<Arc<MemoryStore>>,
    (from, limit, end): (u64, usize, u64),
    retired: &[Gap],
    keep: &dyn Fn(&EventPeek<'_>) -> bool,
) -> PlogPage {
    s.read_plog_page_where(P, (from, limit, end), retired, Some(keep))
        .expect("read")
}

#[test]
fn a_filtered_page_holds_exactly_the_kept_events_and_says_how_far_it_read() {
    let s = store();
    append_marked(&s, &(1..=10).collect::<Vec<_>>(), &[3, 7]);
    let page = filtered(&s, (1, 100, 11), &[], &marked);
    assert_eq!(shape(&page.items), vec![(3, 3), (7, 7)]);
    for item in &page.items {
        let PageItem::Event(e) = item else {
            panic!("{item:?}")
        };
        let stored = s
            .read_event(P, e.plog_offset)
            .expect("read")
            .expect("there");
        assert_eq!(**e, stored, "a kept event is the whole event");
    }
    assert_eq!((page.next, page.dropped), (11, 8));
    // The limit counts every event read, kept or not: the page ends where the unfiltered one
    // ends.
    let page = filtered(&s, (1, 5, 11), &[], &marked);
    let unfiltered = s.read_plog_page(P, 1, 5, 11, &[]).expect("read");
    assert_eq!(shape(&page.items), vec![(3, 3)]);
    assert_eq!(page.next, unfiltered.last().expect("events").next_offset());
    assert_eq!((page.next, page.dropped), (6, 4));
    // Without a filter, the page is the unfiltered one.
    let all = s
        .read_plog_page_where(P, (1, 5, 11), &[], None)
        .expect("read");
    assert_eq!((all.items, all.next, all.dropped), (unfiltered, 6, 0));
}

#[test]
fn a_filtered_page_that_keeps_nothing_still_moves_on() {
    let s = store();
    append_marked(&s, &(1..=10).collect::<Vec<_>>(), &[]);
    let page = filtered(&s, (0, 100, 11), &[], &marked);
    assert!(page.items.is_empty());
    assert_eq!((page.next, page.dropped), (11, 10));
    let page = filtered(&s, (4, 3, 11), &[], &|_| false);
    assert_eq!((page.items.len(), page.next, page.dropped), (0, 7, 3));
    // Nothing to read: the page starts and ends where it was asked.
    let page = filtered(&s, (11, 100, 11), &[], &marked);
    assert_eq!((page.items.len(), page.next, page.dropped), (0, 11, 0));
}

#[test]
fn a_filtered_page_delivers_gaps_and_stops_at_a_hole() {
    let s = store();
    append_marked(&s, &[1, 2, 3, 4, 10, 11, 12], &[11]);
    let retired = retired_ranges(&[loss(5, 9, LossCause::AcceptedLoss)], P.0);
    let page = filtered(&s, (1, 100, 13), &retired, &marked);
    assert_eq!(shape(&page.items), vec![(5, 9), (11, 11)]);
    assert_eq!((page.next, page.dropped), (13, 6));
    let inside = filtered(&s, (7, 2, 13), &retired, &marked);
    assert_eq!(shape(&inside.items), vec![(7, 9)]);
    assert_eq!(
        (inside.next, inside.dropped),
        (11, 1),
        "the gap and event 10 read"
    );
    // Offsets 5 to 9 missing and not retired: the page stops before them.
    let page = filtered(&s, (1, 100, 13), &[], &marked);
    assert!(page.items.is_empty());
    assert_eq!((page.next, page.dropped), (5, 4));
    let page = filtered(&s, (5, 100, 13), &[], &marked);
    assert_eq!(
        (page.items.len(), page.next, page.dropped),
        (0, 5, 0),
        "nothing read at a hole"
    );
}

/// Stores `bytes` as the PLog event at `offset`.
fn put_plog(s: &EventStore<Arc<MemoryStore>>, offset: u64, bytes: &[u8]) {
    s.kv()
        .put(s.plog_key(P, PLogOffset(offset)).as_key(), bytes)
        .expect("put");
}

#[test]
fn a_damaged_event_a_filter_would_drop_is_reported_not_skipped() {
    let s = store();
    append_marked(&s, &(1..=6).collect::<Vec<_>>(), &[6]);
    let at = Slot::PLog {
        partition: P,
        offset: PLogOffset(3),
    };
    // A flipped bit in event 3's record fields (past its head and command name).
    let mut bytes = full_event(3, false).encode().expect("encode");
    let last = bytes.len() - 1;
    bytes[last] ^= 0x10;
    put_plog(&s, 3, &bytes);
    for keep in [
        &marked as &dyn Fn(&EventPeek<'_>) -> bool,
        &|_| false,
        &|_| true,
    ] {
        let err = s
            .read_plog_page_where(P, (1, 100, 7), &[], Some(keep))
            .expect_err("damage is an error");
        assert!(
            matches!(
                err,
                ReadError::Corrupt { slot, source: DecodeError::Checksum { .. } } if slot == at
            ),
            "{err}"
        );
    }
    // Bytes whose checksum holds but whose structure does not (a record cut short): the
    // structure of a dropped event is checked too.
    let mut bytes = full_event(3, false).encode().expect("encode");
    bytes.truncate(bytes.len() - 2);
    let crc = crc32fast::hash(&bytes[5..]);
    bytes[1..5].copy_from_slice(&crc.to_le_bytes());
    put_plog(&s, 3, &bytes);
    let err = s
        .read_plog_page_where(P, (1, 100, 7), &[], Some(&marked))
        .expect_err("damage is an error");
    assert!(
        matches!(err, ReadError::Corrupt { slot, source: DecodeError::Truncated { .. } } if slot == at),
        "{err}"
    );
    // An event stored at another offset than it names, dropped or not.
    put_plog(&s, 3, &full_event(4, false).encode().expect("encode"));
    let err = s
        .read_plog_page_where(P, (1, 100, 7), &[], Some(&marked))
        .expect_err("misplaced");
    assert!(
        matches!(err, ReadError::Misplaced { slot, found: 4 } if slot == at),
        "{err}"
    );
}
