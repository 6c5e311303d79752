//! The conformance suite of [`SeqStorage`]: the definition of "a sequence storage". Every check
//! takes a factory of fresh, empty [`Harness`]es (a storage plus a way to append events to its
//! PLog) and panics with a description on the first broken obligation (see the obligations on
//! [`SeqStorage`]).
//!
//! A storage plugs in with
//! [`seq_storage_conformance_tests!`](crate::seq_storage_conformance_tests), which expands to one
//! `#[test]` per check:
//!
//! ```
//! mod mem_conforms {
//!     monoseq_core::seq_storage_conformance_tests!(monoseq_core::conformance::MemHarness::new);
//! }
//! ```

use std::ops::ControlFlow;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::mem::MemSeqStorage;
use crate::storage::{ReplayEnd, ReplayedEvent, SeqStorage, StorageErrorKind};
use crate::types::{Number, NumberKey, PLogOffset, SeqId, SeqValue, WsId, WsKind};

/// What numbers the events of a harness can carry: exactly one number of [`one`](Self::one)
/// (a WLog offset) and any count of numbers of [`many`](Self::many) (record IDs). Numbers
/// below a sequence's initial value may be left out by replay; the suite uses none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventShape {
    /// The workspace kind of every event.
    pub kind: WsKind,
    /// The sequence of which every event carries one number, with its initial value.
    pub one: (SeqId, Number),
    /// The sequence of which events carry any count of numbers, with its initial value.
    pub many: (SeqId, Number),
}

/// A storage under test, fresh and empty, with a way to write its PLog (which the trait only
/// reads).
pub trait Harness: Send + Sync {
    /// The storage under test.
    type Storage: SeqStorage;

    /// The storage.
    fn storage(&self) -> &Self::Storage;

    /// The numbers events can carry.
    fn shape(&self) -> EventShape;

    /// Appends to the PLog an event of `ws` at `offset` that used `values` (all of `ws`, one of
    /// `shape().one` and any of `shape().many`); offsets come contiguous from 1.
    ///
    /// # Panics
    ///
    /// When the append fails: the suite cannot go on.
    fn append(&self, offset: PLogOffset, ws: WsId, values: &[SeqValue]);
}

/// The in-memory reference storage as a [`Harness`].
#[derive(Debug)]
pub struct MemHarness(Arc<MemSeqStorage>);

impl MemHarness {
    /// A fresh, empty in-memory storage.
    #[must_use]
    pub fn new() -> MemHarness {
        MemHarness(MemSeqStorage::new())
    }
}

impl Default for MemHarness {
    fn default() -> Self {
        MemHarness::new()
    }
}

impl Harness for MemHarness {
    type Storage = Arc<MemSeqStorage>;

    fn storage(&self) -> &Arc<MemSeqStorage> {
        &self.0
    }

    fn shape(&self) -> EventShape {
        EventShape {
            kind: WsKind(1),
            one: (SeqId(1), Number(1)),
            many: (SeqId(2), Number(1_000)),
        }
    }

    fn append(&self, offset: PLogOffset, _ws: WsId, values: &[SeqValue]) {
        self.0
            .append_event(offset, WsKind(1), values)
            .expect("the in-memory PLog takes the event");
    }
}

/// Expands to one `#[test]` per check of the suite, each on fresh harnesses from `$fresh`.
#[macro_export]
macro_rules! seq_storage_conformance_tests {
    ($fresh:expr) => {
        #[test]
        fn empty_storage_reads_the_first_offset_zero_numbers_and_no_events() {
            $crate::conformance::empty_storage_reads_the_first_offset_zero_numbers_and_no_events(
                $fresh,
            );
        }
        #[test]
        fn writes_are_visible_to_later_reads_from_any_thread() {
            $crate::conformance::writes_are_visible_to_later_reads_from_any_thread($fresh);
        }
        #[test]
        fn values_are_visible_no_later_than_their_checkpoint() {
            $crate::conformance::values_are_visible_no_later_than_their_checkpoint($fresh);
        }
        #[test]
        fn read_numbers_many_answers_like_read_numbers_in_the_order_asked() {
            $crate::conformance::read_numbers_many_answers_like_read_numbers_in_the_order_asked(
                $fresh,
            );
        }
        #[test]
        fn replay_passes_every_event_once_in_order_from_the_offset() {
            $crate::conformance::replay_passes_every_event_once_in_order_from_the_offset($fresh);
        }
        #[test]
        fn replay_stops_when_the_batcher_asks() {
            $crate::conformance::replay_stops_when_the_batcher_asks($fresh);
        }
        #[test]
        fn the_batcher_may_read_and_write_the_storage_during_replay() {
            $crate::conformance::the_batcher_may_read_and_write_the_storage_during_replay($fresh);
        }
        #[test]
        fn a_newer_generation_fences_off_older_writes() {
            $crate::conformance::a_newer_generation_fences_off_older_writes($fresh);
        }
        #[test]
        fn no_write_of_an_older_generation_lands_after_a_claim_returns() {
            $crate::conformance::no_write_of_an_older_generation_lands_after_a_claim_returns(
                $fresh,
            );
        }
        #[test]
        fn invalid_calls_are_errors_not_panics() {
            $crate::conformance::invalid_calls_are_errors_not_panics($fresh);
        }
    };
}

fn key(ws: u64, seq: SeqId) -> NumberKey {
    NumberKey { ws: WsId(ws), seq }
}

fn read<S: SeqStorage>(s: &S, k: NumberKey) -> Number {
    let mut out = [Number(0)];
    s.read_numbers(k.ws, &[k.seq], &mut out)
        .expect("reading a number");
    out[0]
}

/// Writes `values` with checkpoint `next` as a freshly claimed generation.
fn write<S: SeqStorage>(s: &S, values: &[SeqValue], next: PLogOffset) {
    let generation = s.claim().expect("claiming the storage").generation;
    s.write_fenced(generation, values, next)
        .expect("writing values and checkpoint");
}

/// Events `1..=count` over five workspaces; every event carries one number of `one` and zero
/// to two of `many`, strictly increasing per workspace and sequence.
fn events(shape: EventShape, count: u64) -> Vec<(PLogOffset, WsId, Vec<SeqValue>)> {
    let mut last_one = [shape.one.1.0 - 1; 5];
    let mut last_many = [shape.many.1.0 - 1; 5];
    (1..=count)
        .map(|o| {
            let w = (o % 5) as usize;
            let ws = WsId(w as u64 + 1);
            last_one[w] += 1;
            let mut values = vec![SeqValue::new(ws, shape.one.0, Number(last_one[w]))];
            for _ in 0..o % 3 {
                last_many[w] += 1;
                values.push(SeqValue::new(ws, shape.many.0, Number(last_many[w])));
            }
            (PLogOffset(o), ws, values)
        })
        .collect()
}

fn append_all<H: Harness>(h: &H, events: &[(PLogOffset, WsId, Vec<SeqValue>)]) {
    for (o, ws, values) in events {
        h.append(*o, *ws, values);
    }
}

/// Every event replay passes from `from`, with its values sorted.
fn replay<S: SeqStorage>(
    s: &S,
    from: PLogOffset,
) -> (ReplayEnd, Vec<(PLogOffset, WsKind, Vec<SeqValue>)>) {
    let mut seen = Vec::new();
    let end = s
        .replay_plog(from, &mut |e: ReplayedEvent<'_>| {
            seen.push((e.offset, e.ws_kind, sorted(e.values.to_vec())));
            ControlFlow::Continue(())
        })
        .expect("replaying the PLog");
    (end, seen)
}

fn sorted(mut values: Vec<SeqValue>) -> Vec<SeqValue> {
    values.sort_by_key(|v| (v.key, v.value));
    values
}

/// Empty storage answers the checkpoint [`PLogOffset::FIRST`], `Number(0)` for every number
/// (one by one and many at once), and replays no event.
pub fn empty_storage_reads_the_first_offset_zero_numbers_and_no_events<H: Harness>(
    mut fresh: impl FnMut() -> H,
) {
    let h = fresh();
    let s = h.storage();
    let shape = h.shape();
    assert_eq!(
        s.read_next_plog_offset().expect("reading the checkpoint"),
        PLogOffset::FIRST,
        "empty storage must answer the first PLog offset, never 0"
    );
    let mut out = [Number(9); 3];
    s.read_numbers(WsId(1), &[shape.one.0, shape.many.0, SeqId(77)], &mut out)
        .expect("reading numbers");
    assert_eq!(out, [Number(0); 3], "numbers never written read as 0");
    let keys: Vec<NumberKey> = (1..=40).map(|w| key(w, shape.one.0)).collect();
    let mut out = vec![Number(9); keys.len()];
    s.read_numbers_many(&keys, &mut out)
        .expect("reading many numbers");
    assert!(out.iter().all(|n| *n == Number(0)), "{out:?}");
    let (end, seen) = replay(s, PLogOffset::FIRST);
    assert_eq!(end, ReplayEnd::Completed);
    assert!(seen.is_empty(), "an empty PLog replayed {seen:?}");
}

/// After a write returns `Ok`, reads from this and from another thread see its values and its
/// checkpoint; a later write of a key replaces the number stored before.
pub fn writes_are_visible_to_later_reads_from_any_thread<H: Harness>(mut fresh: impl FnMut() -> H) {
    let h = fresh();
    let s = h.storage();
    let seq = h.shape().many.0;
    let first: Vec<SeqValue> = (1..=20)
        .map(|w| SeqValue::new(WsId(w), seq, Number(w * 10)))
        .collect();
    write(s, &first, PLogOffset(5));
    write(s, &[SeqValue::new(WsId(3), seq, Number(31))], PLogOffset(6));
    let check = |s: &H::Storage| {
        assert_eq!(
            s.read_next_plog_offset().expect("checkpoint"),
            PLogOffset(6)
        );
        for w in 1..=20 {
            let want = if w == 3 { 31 } else { w * 10 };
            assert_eq!(read(s, key(w, seq)), Number(want), "workspace {w}");
        }
    };
    check(s);
    std::thread::scope(|scope| {
        scope
            .spawn(|| check(s))
            .join()
            .expect("the reading thread saw every write");
    });
}

/// A reader that sees a checkpoint also sees the values written with it (values first, or
/// both atomically; invariant 4 of docs/invariants.md), while another thread keeps writing.
pub fn values_are_visible_no_later_than_their_checkpoint<H: Harness>(mut fresh: impl FnMut() -> H) {
    const WRITES: u64 = 300;
    let h = fresh();
    let s = h.storage();
    let seq = h.shape().one.0;
    let generation = s.claim().expect("claiming").generation;
    let done = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let reader = scope.spawn(|| {
            let mut checks = 0u64;
            while !done.load(Ordering::Acquire) || checks == 0 {
                let c = s.read_next_plog_offset().expect("checkpoint").0;
                // The write with checkpoint c + 1 stored number c for both workspaces.
                if c > 1 {
                    for w in [1, 2] {
                        let n = read(s, key(w, seq));
                        assert!(
                            n.0 + 1 >= c,
                            "checkpoint {c} is visible but workspace {w} holds {n}, written \
                             with an older checkpoint: the checkpoint overtook its values"
                        );
                    }
                }
                checks += 1;
            }
        });
        for i in 1..=WRITES {
            let values = [
                SeqValue::new(WsId(1), seq, Number(i)),
                SeqValue::new(WsId(2), seq, Number(i)),
            ];
            s.write_fenced(generation, &values, PLogOffset(i + 1))
                .expect("writing");
        }
        done.store(true, Ordering::Release);
        reader
            .join()
            .expect("the reader found no checkpoint ahead of its values");
    });
}

/// [`SeqStorage::read_numbers_many`] answers, for dense and scattered workspaces, written and
/// never written keys, the same numbers as one [`SeqStorage::read_numbers`] per key, in the
/// order of the keys.
pub fn read_numbers_many_answers_like_read_numbers_in_the_order_asked<H: Harness>(
    mut fresh: impl FnMut() -> H,
) {
    let h = fresh();
    let s = h.storage();
    let shape = h.shape();
    let (a, b) = (shape.one.0, shape.many.0);
    let mut values = Vec::new();
    for w in (1..=300u64).filter(|w| w % 7 != 0) {
        values.push(SeqValue::new(WsId(w), a, Number(w + 1)));
        if w % 2 == 0 {
            values.push(SeqValue::new(WsId(w), b, Number(w * 3)));
        }
    }
    for w in [5_000u64, 70_000, 1 << 40] {
        values.push(SeqValue::new(WsId(w), b, Number(w)));
    }
    write(s, &values, PLogOffset(2));
    let dense: Vec<NumberKey> = (1..=300u64).flat_map(|w| [key(w, a), key(w, b)]).collect();
    let scattered: Vec<NumberKey> = [1u64, 64, 65, 299, 5_000, 70_000, 1 << 40, (1 << 40) + 1]
        .into_iter()
        .flat_map(|w| [key(w, a), key(w, b)])
        .collect();
    for keys in [dense, scattered] {
        let mut out = vec![Number(u64::MAX); keys.len()];
        s.read_numbers_many(&keys, &mut out)
            .expect("reading many numbers");
        for (k, got) in keys.iter().zip(&out) {
            assert_eq!(*got, read(s, *k), "{k:?}");
        }
    }
}

/// Replay passes every event from the given offset to the end, each once, in increasing offset
/// order, with its kind and every number it used; from past the end it passes nothing.
pub fn replay_passes_every_event_once_in_order_from_the_offset<H: Harness>(
    mut fresh: impl FnMut() -> H,
) {
    // The last offset ends a chunk of 1 024: a replay that stops only at a chunk with room
    // left must still end there.
    const EVENTS: u64 = 5_119;
    let h = fresh();
    let shape = h.shape();
    let events = events(shape, EVENTS);
    append_all(&h, &events);
    let s = h.storage();
    for from in [1, 2, 4_095, 4_096, 4_097, EVENTS, EVENTS + 1, EVENTS + 100] {
        let (end, seen) = replay(s, PLogOffset(from));
        assert_eq!(end, ReplayEnd::Completed, "from {from}");
        let want: Vec<_> = events
            .iter()
            .filter(|(o, _, _)| o.0 >= from)
            .map(|(o, _, v)| (*o, shape.kind, sorted(v.clone())))
            .collect();
        assert_eq!(seen.len(), want.len(), "events replayed from {from}");
        for (got, want) in seen.iter().zip(&want) {
            assert_eq!(got, want, "replay from {from}");
        }
    }
}

/// When the batcher answers `Break`, replay passes no further event and answers
/// [`ReplayEnd::Stopped`].
pub fn replay_stops_when_the_batcher_asks<H: Harness>(mut fresh: impl FnMut() -> H) {
    let h = fresh();
    append_all(&h, &events(h.shape(), 100));
    for stop_after in [1u64, 37, 100] {
        let mut seen = 0;
        let end = h
            .storage()
            .replay_plog(PLogOffset(1), &mut |_: ReplayedEvent<'_>| {
                seen += 1;
                if seen == stop_after {
                    ControlFlow::Break(())
                } else {
                    ControlFlow::Continue(())
                }
            })
            .expect("replaying");
        assert_eq!((end, seen), (ReplayEnd::Stopped, stop_after));
    }
}

/// The batcher may read and write the storage while replay runs (actualization writes a full
/// window from inside it): replay holds no lock across a batcher call. A deadlock fails the
/// check after a while instead of hanging.
pub fn the_batcher_may_read_and_write_the_storage_during_replay<H: Harness + 'static>(
    mut fresh: impl FnMut() -> H,
) {
    let h = Arc::new(fresh());
    append_all(&*h, &events(h.shape(), 50));
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let replaying = Arc::clone(&h);
    std::thread::spawn(move || {
        let s = replaying.storage();
        let seq = replaying.shape().many.0;
        let generation = s.claim().expect("claiming").generation;
        let mut seen = 0u64;
        let end = s
            .replay_plog(PLogOffset(1), &mut |e: ReplayedEvent<'_>| {
                seen += 1;
                let values = [SeqValue::new(WsId(99), seq, Number(seen))];
                s.write_fenced(generation, &values, e.offset)
                    .expect("writing from the batcher");
                assert_eq!(read(s, key(99, seq)), Number(seen));
                ControlFlow::Continue(())
            })
            .expect("replaying");
        let _ = done_tx.send((end, seen));
    });
    match done_rx.recv_timeout(std::time::Duration::from_secs(30)) {
        Ok((end, seen)) => assert_eq!((end, seen), (ReplayEnd::Completed, 50)),
        Err(_) => panic!(
            "replay did not finish within 30 s while its batcher wrote to the storage: a lock \
             held across the batcher call deadlocks actualization"
        ),
    }
    assert_eq!(read(h.storage(), key(99, h.shape().many.0)), Number(50));
}

/// Once a newer generation claimed the storage, a write of an older one fails with
/// [`StorageErrorKind::Fenced`] and changes nothing; the newer one writes; an unclaimed
/// generation never writes.
pub fn a_newer_generation_fences_off_older_writes<H: Harness>(mut fresh: impl FnMut() -> H) {
    let h = fresh();
    let s = h.storage();
    let seq = h.shape().one.0;
    let old = s.claim().expect("claiming").generation;
    s.write_fenced(
        old,
        &[SeqValue::new(WsId(1), seq, Number(5))],
        PLogOffset(3),
    )
    .expect("the only generation writes");
    let new = s.claim().expect("claiming again").generation;
    assert!(new > old, "generations grow: {old} then {new}");
    let err = s
        .write_fenced(
            old,
            &[SeqValue::new(WsId(1), seq, Number(2))],
            PLogOffset(2),
        )
        .expect_err("a write of the older generation must be refused");
    assert_eq!(err.kind(), StorageErrorKind::Fenced, "{err}");
    assert_eq!(
        read(s, key(1, seq)),
        Number(5),
        "a fenced write changed a number"
    );
    assert_eq!(
        s.read_next_plog_offset().expect("checkpoint"),
        PLogOffset(3)
    );
    s.write_fenced(
        new,
        &[SeqValue::new(WsId(1), seq, Number(6))],
        PLogOffset(4),
    )
    .expect("the newest generation writes");
    assert_eq!(read(s, key(1, seq)), Number(6));
    let err = s
        .write_fenced(
            crate::storage::Generation(0),
            &[SeqValue::new(WsId(1), seq, Number(1))],
            PLogOffset(5),
        )
        .expect_err("an unclaimed generation must never write");
    assert!(err.is_fenced(), "{err}");
}

/// While an older generation keeps writing from another thread, no write of it lands after a
/// claim returned: the checkpoint read right after the claim stays.
pub fn no_write_of_an_older_generation_lands_after_a_claim_returns<H: Harness>(
    mut fresh: impl FnMut() -> H,
) {
    let h = fresh();
    let s = h.storage();
    let seq = h.shape().one.0;
    let old = s.claim().expect("claiming").generation;
    let written = AtomicU64::new(0);
    std::thread::scope(|scope| {
        let writer = scope.spawn(|| {
            let mut refused = 0;
            for i in 1..=100_000u64 {
                let values = [SeqValue::new(WsId(1), seq, Number(i))];
                match s.write_fenced(old, &values, PLogOffset(i + 1)) {
                    Ok(()) => written.store(i, Ordering::Release),
                    Err(e) if e.is_fenced() => {
                        refused += 1;
                        if refused == 50 {
                            return;
                        }
                    }
                    Err(e) => panic!("unexpected error {e}"),
                }
            }
        });
        while written.load(Ordering::Acquire) < 20 {
            std::thread::yield_now();
        }
        s.claim().expect("claiming while the old generation writes");
        let checkpoint = s.read_next_plog_offset().expect("checkpoint");
        let number = read(s, key(1, seq));
        writer.join().expect("the old writer ended");
        assert_eq!(
            s.read_next_plog_offset().expect("checkpoint"),
            checkpoint,
            "a write of the older generation landed after the claim returned"
        );
        assert_eq!(read(s, key(1, seq)), number);
    });
}

/// Invalid calls answer errors, never panics: a checkpoint of 0, and `out` buffers of another
/// length than the keys.
pub fn invalid_calls_are_errors_not_panics<H: Harness>(mut fresh: impl FnMut() -> H) {
    let h = fresh();
    let s = h.storage();
    let seq = h.shape().one.0;
    let generation = s.claim().expect("claiming").generation;
    let calls: [(&str, &dyn Fn() -> bool); 3] = [
        ("a write of checkpoint 0", &|| {
            s.write_fenced(generation, &[], PLogOffset(0)).is_err()
        }),
        ("read_numbers with a short out", &|| {
            let mut out = [Number(0); 1];
            s.read_numbers(WsId(1), &[seq, SeqId(99)], &mut out)
                .is_err()
        }),
        ("read_numbers_many with a long out", &|| {
            let mut out = [Number(0); 3];
            s.read_numbers_many(&[key(1, seq)], &mut out).is_err()
        }),
    ];
    for (what, call) in calls {
        match catch_unwind(AssertUnwindSafe(call)) {
            Ok(true) => {}
            Ok(false) => panic!("{what} was accepted"),
            Err(_) => panic!("{what} panicked instead of answering an error"),
        }
    }
    assert_eq!(
        s.read_next_plog_offset().expect("checkpoint"),
        PLogOffset::FIRST,
        "a refused write changed the checkpoint"
    );
}
