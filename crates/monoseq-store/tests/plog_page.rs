//! Ordered page reads of a PLog for consumers: offset order, nothing at or beyond the end,
//! retired ranges as explicit gaps, a page that stops at a hole no loss retired, and pages
//! across several log blocks.

use std::sync::Arc;

use monoseq_core::{PLogOffset, WsId, WsKind};
use monoseq_kv::MemoryStore;
use monoseq_store::{
    AcceptedLoss, AppId, Event, EventStore, Gap, LOG_BLOCK_EVENTS, LossCause, Mark, PageItem,
    PartitionId, TrustLevel, WLogOffset, retired_ranges,
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
