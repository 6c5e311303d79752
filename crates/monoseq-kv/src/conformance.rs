//! The conformance suite: the definition of "a backend". Every check takes a factory of fresh,
//! empty stores and panics with a description on the first broken obligation. The centre is a
//! property test that runs random operation sequences against a store and a `BTreeMap` model
//! side by side; the other checks pin single obligations with readable failures.
//!
//! A new backend plugs in with [`conformance_tests!`](crate::conformance_tests), which expands
//! to one `#[test]` per check; the expression gives a fresh, empty store each time it is
//! called (wrap the store in [`WithGuard`] to keep a temporary directory or a server alive):
//!
//! ```
//! mod my_backend_conforms {
//!     // With a new backend: `|| WithGuard::new(MyStore::open(&dir).unwrap(), dir)`.
//!     monoseq_kv::conformance_tests!(monoseq_kv::MemoryStore::new);
//! }
//! ```

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::ops::{Bound, ControlFlow};
use std::sync::{Arc, Barrier};

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

use crate::batch::{Op, WriteBatch};
use crate::error::{CasError, KvError, WriteError};
use crate::faulty::FaultyStore;
use crate::key::{Key, limits};
use crate::store::{KvStore, Order, Swap, Visitor};

/// Cases of the model property test when the caller does not choose. The `PROPTEST_CASES`
/// environment variable overrides the count the caller gives.
pub const MODEL_CASES_DEFAULT: u32 = 64;

/// A store together with something that must outlive it (a temporary directory, a server
/// handle): the store is dropped first. It is a store itself.
#[derive(Debug)]
pub struct WithGuard<S, G> {
    store: S,
    _guard: G,
}

impl<S, G> WithGuard<S, G> {
    /// `store`, keeping `guard` alive as long as it.
    pub fn new(store: S, guard: G) -> WithGuard<S, G> {
        WithGuard {
            store,
            _guard: guard,
        }
    }
}

impl<S: KvStore, G: Send + Sync + 'static> KvStore for WithGuard<S, G> {
    fn get(&self, key: Key<'_>) -> Result<Option<Vec<u8>>, KvError> {
        self.store.get(key)
    }

    fn get_many(&self, keys: &[Key<'_>]) -> Result<Vec<Option<Vec<u8>>>, KvError> {
        self.store.get_many(keys)
    }

    fn scan(
        &self,
        partition: &[u8],
        from: Bound<&[u8]>,
        to: Bound<&[u8]>,
        order: Order,
        visit: &mut Visitor<'_>,
    ) -> Result<(), KvError> {
        self.store.scan(partition, from, to, order, visit)
    }

    fn write(&self, batch: &WriteBatch) -> Result<(), WriteError> {
        self.store.write(batch)
    }

    fn compare_and_swap(
        &self,
        key: Key<'_>,
        expected: Option<&[u8]>,
        new: Option<&[u8]>,
    ) -> Result<(), CasError> {
        self.store.compare_and_swap(key, expected, new)
    }

    fn compare_and_swap_each(&self, swaps: &[Swap<'_>]) -> Vec<Result<(), CasError>> {
        self.store.compare_and_swap_each(swaps)
    }

    fn first_present(&self, keys: &[Key<'_>]) -> Result<Option<usize>, KvError> {
        self.store.first_present(keys)
    }

    fn expect_inserts(&self, partitions: &[&[u8]]) -> Result<(), KvError> {
        self.store.expect_inserts(partitions)
    }

    fn sync(&self) -> Result<(), KvError> {
        self.store.sync()
    }
}

/// Expands to one `#[test]` per conformance check, each calling `$fresh` (an expression
/// callable as `FnMut() -> impl KvStore`, giving a fresh empty store) for its stores.
/// Use it in a test module of the backend's crate, with the `conformance` feature on.
#[macro_export]
macro_rules! conformance_tests {
    ($fresh:expr) => {
        $crate::conformance_tests!($fresh, $crate::conformance::MODEL_CASES_DEFAULT);
    };
    ($fresh:expr, $model_cases:expr) => {
        #[test]
        fn behaves_like_the_btreemap_model() {
            $crate::conformance::behaves_like_the_btreemap_model($fresh, $model_cases);
        }
        #[test]
        fn scans_follow_clustering_order_within_bounds() {
            $crate::conformance::scans_follow_clustering_order_within_bounds($fresh);
        }
        #[test]
        fn scans_stay_inside_their_partition() {
            $crate::conformance::scans_stay_inside_their_partition($fresh);
        }
        #[test]
        fn conflicting_batch_writes_nothing() {
            $crate::conformance::conflicting_batch_writes_nothing($fresh);
        }
        #[test]
        fn batch_items_take_effect_in_order() {
            $crate::conformance::batch_items_take_effect_in_order($fresh);
        }
        #[test]
        fn compare_and_swap_checks_the_stored_value() {
            $crate::conformance::compare_and_swap_checks_the_stored_value($fresh);
        }
        #[test]
        fn compare_and_swap_each_decides_each_swap_on_its_own() {
            $crate::conformance::compare_and_swap_each_decides_each_swap_on_its_own($fresh);
        }
        #[test]
        fn get_many_answers_in_the_order_asked() {
            $crate::conformance::get_many_answers_in_the_order_asked($fresh);
        }
        #[test]
        fn oversized_writes_are_rejected_whole() {
            $crate::conformance::oversized_writes_are_rejected_whole($fresh);
        }
        #[test]
        fn concurrent_inserts_of_one_key_have_one_winner() {
            $crate::conformance::concurrent_inserts_of_one_key_have_one_winner($fresh);
        }
        #[test]
        fn concurrent_compare_and_swaps_lose_no_update() {
            $crate::conformance::concurrent_compare_and_swaps_lose_no_update($fresh);
        }
        #[test]
        fn a_write_of_unknown_outcome_is_read_back_whole_or_absent() {
            $crate::conformance::a_write_of_unknown_outcome_is_read_back_whole_or_absent($fresh);
        }
    };
}

/// An owned key as `(partition, clustering)`.
type OwnedKey = (Vec<u8>, Vec<u8>);
/// Entries of one partition as `(clustering, value)`.
type Entries = Vec<(Vec<u8>, Vec<u8>)>;
type Model = BTreeMap<OwnedKey, Vec<u8>>;

fn fail(message: String) -> TestCaseError {
    TestCaseError::fail(message)
}

/// Every entry of `partition` between the bounds, in `order`, at most `limit` of them.
fn scan_all<S: KvStore + ?Sized>(
    store: &S,
    partition: &[u8],
    from: Bound<&[u8]>,
    to: Bound<&[u8]>,
    order: Order,
    limit: usize,
) -> Result<Entries, KvError> {
    let mut out = Vec::new();
    if limit == 0 {
        return Ok(out);
    }
    store.scan(partition, from, to, order, &mut |clustering, value| {
        out.push((clustering.to_vec(), value.to_vec()));
        if out.len() >= limit {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    })?;
    Ok(out)
}

fn model_scan(
    model: &Model,
    partition: &[u8],
    from: Bound<&[u8]>,
    to: Bound<&[u8]>,
    order: Order,
    limit: usize,
) -> Entries {
    let in_range = |c: &[u8]| {
        let above = match from {
            Bound::Included(b) => c >= b,
            Bound::Excluded(b) => c > b,
            Bound::Unbounded => true,
        };
        let below = match to {
            Bound::Included(b) => c <= b,
            Bound::Excluded(b) => c < b,
            Bound::Unbounded => true,
        };
        above && below
    };
    let entries = model
        .iter()
        .filter(|((p, c), _)| p.as_slice() == partition && in_range(c))
        .map(|((_, c), v)| (c.clone(), v.clone()));
    match order {
        Order::Ascending => entries.take(limit).collect(),
        Order::Descending => {
            let mut all: Vec<_> = entries.collect();
            all.reverse();
            all.truncate(limit);
            all
        }
    }
}

/// One swap of a [`Step::CasEach`]: key, whether to expect the model's value before the step,
/// else the expected value, and the new value.
type CasItem = (OwnedKey, bool, Option<Vec<u8>>, Option<Vec<u8>>);

/// One step of a model run.
#[derive(Debug, Clone)]
enum Step {
    Write(Vec<(Op, OwnedKey, Vec<u8>)>),
    Cas {
        key: (Vec<u8>, Vec<u8>),
        expect_current: bool,
        expected: Option<Vec<u8>>,
        new: Option<Vec<u8>>,
    },
    /// Compare-and-swaps in one `compare_and_swap_each`, each as in [`Step::Cas`].
    CasEach(Vec<CasItem>),
    Get((Vec<u8>, Vec<u8>)),
    GetMany(Vec<(Vec<u8>, Vec<u8>)>),
    /// `first_present` of the keys: the index of the first stored one.
    FirstPresent(Vec<(Vec<u8>, Vec<u8>)>),
    Sync,
    Scan {
        partition: Vec<u8>,
        from: Bound<Vec<u8>>,
        to: Bound<Vec<u8>>,
        order: Order,
        limit: usize,
    },
}

fn partition_strategy() -> impl Strategy<Value = Vec<u8>> {
    // Partitions that are prefixes of each other, empty and 0xff-ended ones catch encodings
    // that let one partition's scan see another's entries.
    prop::sample::select(vec![
        vec![],
        b"a".to_vec(),
        b"ab".to_vec(),
        vec![0xff],
        vec![0x00, 0x01],
    ])
}

fn clustering_strategy() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        prop::sample::select(vec![
            vec![],
            vec![0],
            vec![0, 0],
            vec![0, 1],
            vec![1],
            vec![1, 0],
            vec![0xff],
            vec![0xff, 0xff],
        ]),
        prop::collection::vec(any::<u8>(), 0..3),
    ]
}

fn key_strategy() -> impl Strategy<Value = (Vec<u8>, Vec<u8>)> {
    (partition_strategy(), clustering_strategy())
}

fn value_strategy() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(any::<u8>(), 0..6)
}

fn bound_strategy() -> impl Strategy<Value = Bound<Vec<u8>>> {
    prop_oneof![
        Just(Bound::Unbounded),
        clustering_strategy().prop_map(Bound::Included),
        clustering_strategy().prop_map(Bound::Excluded),
    ]
}

fn op_strategy() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => Just(Op::Put),
        3 => Just(Op::InsertIfAbsent),
        1 => Just(Op::Delete),
    ]
}

fn step_strategy() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => prop::collection::vec((op_strategy(), key_strategy(), value_strategy()), 0..6)
            .prop_map(Step::Write),
        2 => (
            key_strategy(),
            any::<bool>(),
            prop::option::of(value_strategy()),
            prop::option::of(value_strategy())
        )
            .prop_map(|(key, expect_current, expected, new)| Step::Cas {
                key,
                expect_current,
                expected,
                new,
            }),
        2 => prop::collection::vec(
            (
                key_strategy(),
                any::<bool>(),
                prop::option::of(value_strategy()),
                prop::option::of(value_strategy())
            ),
            0..5
        )
        .prop_map(Step::CasEach),
        1 => key_strategy().prop_map(Step::Get),
        1 => prop::collection::vec(key_strategy(), 0..5).prop_map(Step::GetMany),
        2 => prop::collection::vec(key_strategy(), 0..5).prop_map(Step::FirstPresent),
        1 => Just(Step::Sync),
        3 => (
            partition_strategy(),
            bound_strategy(),
            bound_strategy(),
            prop_oneof![Just(Order::Ascending), Just(Order::Descending)],
            prop_oneof![Just(usize::MAX), 0usize..4],
        )
            .prop_map(|(partition, from, to, order, limit)| Step::Scan {
                partition,
                from,
                to,
                order,
                limit,
            }),
    ]
}

fn key_of((p, c): &(Vec<u8>, Vec<u8>)) -> Key<'_> {
    Key::new(p, c)
}

fn as_bound(bound: &Bound<Vec<u8>>) -> Bound<&[u8]> {
    bound.as_ref().map(Vec::as_slice)
}

/// One item of a generated batch: operation, (partition, clustering), value.
type StepItem = (Op, OwnedKey, Vec<u8>);

fn run_step<S: KvStore>(store: &S, model: &mut Model, step: &Step) -> Result<(), TestCaseError> {
    match step {
        Step::Write(items) => write_step(store, model, items),
        Step::Cas {
            key,
            expect_current,
            expected,
            new,
        } => {
            let expected = if *expect_current {
                model.get(key).cloned()
            } else {
                expected.clone()
            };
            cas_step(store, model, key, expected, new.as_deref())
        }
        Step::CasEach(items) => cas_each_step(store, model, items),
        Step::Get(key) => {
            let got = store
                .get(key_of(key))
                .map_err(|e| fail(format!("get failed: {e}")))?;
            prop_assert_eq!(got, model.get(key).cloned(), "get {:?}", key);
            Ok(())
        }
        Step::GetMany(keys) => {
            let borrowed: Vec<Key<'_>> = keys.iter().map(key_of).collect();
            let got = store
                .get_many(&borrowed)
                .map_err(|e| fail(format!("get_many failed: {e}")))?;
            let expected: Vec<_> = keys.iter().map(|k| model.get(k).cloned()).collect();
            prop_assert_eq!(got, expected, "get_many {:?}", keys);
            Ok(())
        }
        Step::FirstPresent(keys) => {
            let borrowed: Vec<Key<'_>> = keys.iter().map(key_of).collect();
            let got = store
                .first_present(&borrowed)
                .map_err(|e| fail(format!("first_present failed: {e}")))?;
            let expected = keys.iter().position(|k| model.contains_key(k));
            prop_assert_eq!(got, expected, "first_present {:?}", keys);
            Ok(())
        }
        Step::Sync => store.sync().map_err(|e| fail(format!("sync failed: {e}"))),
        Step::Scan {
            partition,
            from,
            to,
            order,
            limit,
        } => scan_step(
            store,
            model,
            partition,
            (as_bound(from), as_bound(to)),
            *order,
            *limit,
        ),
    }
}

/// The model after `items` applied one after another, and the index of the first
/// insert-if-absent that finds its key present (the batch then writes nothing).
fn model_write(model: &Model, items: &[StepItem]) -> (Model, Option<usize>) {
    let mut next = model.clone();
    for (index, (op, key, value)) in items.iter().enumerate() {
        match op {
            Op::InsertIfAbsent if next.contains_key(key) => return (next, Some(index)),
            Op::Put | Op::InsertIfAbsent => {
                next.insert(key.clone(), value.clone());
            }
            Op::Delete => {
                next.remove(key);
            }
        }
    }
    (next, None)
}

fn write_step<S: KvStore>(
    store: &S,
    model: &mut Model,
    items: &[StepItem],
) -> Result<(), TestCaseError> {
    let mut batch = WriteBatch::new();
    for (op, key, value) in items {
        batch.push(*op, key_of(key), value);
    }
    let (next, conflict) = model_write(model, items);
    match (store.write(&batch), conflict) {
        (Ok(()), None) => *model = next,
        (Err(WriteError::Conflict { index, key }), Some(expected)) => {
            prop_assert_eq!(index, expected, "conflict reported at the wrong item");
            prop_assert_eq!(&key.partition, &items[expected].1.0);
            prop_assert_eq!(&key.clustering, &items[expected].1.1);
        }
        (got, expected) => {
            return Err(fail(format!(
                "write of {items:?}: got {got:?}, the model expects a conflict at {expected:?}"
            )));
        }
    }
    Ok(())
}

fn cas_step<S: KvStore>(
    store: &S,
    model: &mut Model,
    key: &OwnedKey,
    expected: Option<Vec<u8>>,
    new: Option<&[u8]>,
) -> Result<(), TestCaseError> {
    let current = model.get(key).cloned();
    match store.compare_and_swap(key_of(key), expected.as_deref(), new) {
        Ok(()) => {
            prop_assert_eq!(&expected, &current, "swapped although the value differs");
            match new {
                Some(value) => model.insert(key.clone(), value.to_vec()),
                None => model.remove(key),
            };
        }
        Err(CasError::Mismatch { current: reported }) => {
            prop_assert_ne!(&expected, &current, "mismatch although the value is equal");
            prop_assert_eq!(reported, current, "mismatch reports a wrong current value");
        }
        Err(other) => return Err(fail(format!("compare-and-swap failed: {other}"))),
    }
    Ok(())
}

/// The swaps of `items`, expected values taken before any of them (as a caller builds them),
/// checked one by one against the model applied in list order.
fn cas_each_step<S: KvStore>(
    store: &S,
    model: &mut Model,
    items: &[CasItem],
) -> Result<(), TestCaseError> {
    let expected: Vec<Option<Vec<u8>>> = items
        .iter()
        .map(|(key, current, expected, _)| match current {
            true => model.get(key).cloned(),
            false => expected.clone(),
        })
        .collect();
    let swaps: Vec<Swap<'_>> = items
        .iter()
        .zip(&expected)
        .map(|((key, _, _, new), expected)| Swap {
            key: key_of(key),
            expected: expected.as_deref(),
            new: new.as_deref(),
        })
        .collect();
    let answers = store.compare_and_swap_each(&swaps);
    prop_assert_eq!(answers.len(), items.len(), "one answer per swap");
    for ((swap, answer), (key, ..)) in swaps.iter().zip(answers).zip(items) {
        let current = model.get(key).cloned();
        match answer {
            Ok(()) => {
                prop_assert_eq!(
                    swap.expected,
                    current.as_deref(),
                    "swapped a differing value"
                );
                match swap.new {
                    Some(value) => model.insert(key.clone(), value.to_vec()),
                    None => model.remove(key),
                };
            }
            Err(CasError::Mismatch { current: reported }) => {
                prop_assert_ne!(
                    swap.expected,
                    current.as_deref(),
                    "mismatch on an equal value"
                );
                prop_assert_eq!(reported, current, "mismatch reports a wrong current value");
            }
            Err(other) => return Err(fail(format!("compare_and_swap_each failed: {other}"))),
        }
    }
    Ok(())
}

fn scan_step<S: KvStore>(
    store: &S,
    model: &Model,
    partition: &[u8],
    (from, to): (Bound<&[u8]>, Bound<&[u8]>),
    order: Order,
    limit: usize,
) -> Result<(), TestCaseError> {
    let got = scan_all(store, partition, from, to, order, limit)
        .map_err(|e| fail(format!("scan failed: {e}")))?;
    let expected = model_scan(model, partition, from, to, order, limit);
    prop_assert_eq!(
        got,
        expected,
        "scan of {:?} from {:?} to {:?} {:?} limit {}",
        partition,
        from,
        to,
        order,
        limit
    );
    Ok(())
}

/// Random sequences of batches (puts, conditional inserts, deletes), compare-and-swaps (alone
/// and several in one `compare_and_swap_each`), gets, get-manys, first-presents, syncs and bounded scans in
/// both orders give the same answers as a `BTreeMap` model, including which item of a batch
/// conflicts and that a conflicting batch writes nothing.
///
/// Runs `cases` random sequences (`PROPTEST_CASES` overrides it), each on a fresh store.
///
/// # Panics
///
/// On the first difference, with the shrunk sequence of steps.
pub fn behaves_like_the_btreemap_model<S: KvStore>(fresh: impl FnMut() -> S, cases: u32) {
    let fresh = RefCell::new(fresh);
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(cases);
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(&prop::collection::vec(step_strategy(), 1..40), |steps| {
        let store = (fresh.borrow_mut())();
        let mut model = Model::new();
        for step in &steps {
            run_step(&store, &mut model, step)?;
        }
        // Whatever the steps did, the whole content matches at the end.
        for partition in [&b""[..], b"a", b"ab", &[0xff], &[0x00, 0x01]] {
            let got = scan_all(
                &store,
                partition,
                Bound::Unbounded,
                Bound::Unbounded,
                Order::Ascending,
                usize::MAX,
            )
            .map_err(|e| fail(format!("final scan failed: {e}")))?;
            let expected = model_scan(
                &model,
                partition,
                Bound::Unbounded,
                Bound::Unbounded,
                Order::Ascending,
                usize::MAX,
            );
            prop_assert_eq!(got, expected, "final content of partition {:?}", partition);
        }
        Ok(())
    });
    if let Err(error) = result {
        panic!("the store differs from the BTreeMap model: {error}");
    }
}

fn be(n: u64) -> [u8; 8] {
    n.to_be_bytes()
}

fn must<T, E: std::fmt::Display>(what: &str, result: Result<T, E>) -> T {
    result.unwrap_or_else(|error| panic!("{what} failed: {error}"))
}

/// Scans visit big-endian numbered entries in increasing or decreasing order, honour
/// included, excluded and open bounds, stop when the visitor breaks, and see nothing in an
/// empty or inverted range.
///
/// # Panics
///
/// On the first broken expectation.
pub fn scans_follow_clustering_order_within_bounds<S: KvStore>(mut fresh: impl FnMut() -> S) {
    let store = fresh();
    let p = b"log";
    write_numbered_out_of_order(&store, p, 300);
    let scan = |from: Bound<&[u8]>, to: Bound<&[u8]>, order: Order, limit: usize| {
        numbered(must("scan", scan_all(&store, p, from, to, order, limit)))
    };
    scans_follow_order_and_bounds(&scan);
    scans_of_empty_ranges_see_nothing(&scan);
    let unknown = scan_all(
        &store,
        b"nothing",
        Bound::Unbounded,
        Bound::Unbounded,
        Order::Ascending,
        usize::MAX,
    );
    assert!(
        must("scan", unknown).is_empty(),
        "an unknown partition is empty"
    );
}

/// Writes entries `n × 10 → n` for `n` in `1..=count`, highest first and across batches, so
/// that scan order can come from the keys alone.
fn write_numbered_out_of_order<S: KvStore>(store: &S, partition: &[u8], count: u64) {
    let mut batch = WriteBatch::new();
    for n in (1..=count).rev() {
        batch.put(Key::new(partition, &be(n * 10)), &be(n));
        if batch.len() == 37 {
            must("write", store.write(&batch));
            batch.clear();
        }
    }
    must("write", store.write(&batch));
}

/// The numbers `n` of entries written by [`write_numbered_out_of_order`], checking each value.
fn numbered(entries: Entries) -> Vec<u64> {
    entries
        .iter()
        .map(|(c, v)| {
            let n = u64::from_be_bytes(c.as_slice().try_into().expect("8-byte key"));
            assert_eq!(v.as_slice(), be(n / 10), "value of entry {n}");
            n / 10
        })
        .collect()
}

/// A scan of the numbered partition: bounds, order, limit → the numbers visited.
type NumberedScan<'a> = dyn Fn(Bound<&[u8]>, Bound<&[u8]>, Order, usize) -> Vec<u64> + 'a;

fn scans_follow_order_and_bounds(scan: &NumberedScan<'_>) {
    use Bound::{Excluded, Included, Unbounded};
    use Order::{Ascending, Descending};
    let (b10, b20, b50) = (be(100), be(200), be(500));
    let all = usize::MAX;
    assert_eq!(
        scan(Unbounded, Unbounded, Ascending, all),
        (1..=300).collect::<Vec<_>>()
    );
    assert_eq!(
        scan(Unbounded, Unbounded, Descending, all),
        (1..=300).rev().collect::<Vec<_>>()
    );
    assert_eq!(
        scan(Included(&b10), Included(&b20), Ascending, all),
        (10..=20).collect::<Vec<_>>()
    );
    assert_eq!(
        scan(Excluded(&b10), Excluded(&b20), Ascending, all),
        (11..20).collect::<Vec<_>>()
    );
    assert_eq!(
        scan(Included(&b10), Excluded(&b20), Descending, all),
        (10..20).rev().collect::<Vec<_>>()
    );
    assert_eq!(
        scan(Excluded(&b50), Unbounded, Ascending, 3),
        vec![51, 52, 53]
    );
    assert_eq!(scan(Unbounded, Included(&b50), Descending, 2), vec![50, 49]);
    // Bounds between stored keys.
    assert_eq!(
        scan(Included(&be(105)), Included(&be(135)), Ascending, all),
        vec![11, 12, 13]
    );
}

fn scans_of_empty_ranges_see_nothing(scan: &NumberedScan<'_>) {
    use Bound::{Excluded, Included};
    use Order::{Ascending, Descending};
    let (b10, b20) = (be(100), be(200));
    let all = usize::MAX;
    assert!(scan(Included(&b20), Included(&b10), Ascending, all).is_empty());
    assert!(scan(Excluded(&b10), Excluded(&b10), Ascending, all).is_empty());
    assert!(scan(Included(&b10), Excluded(&b10), Descending, all).is_empty());
    assert_eq!(
        scan(Included(&b10), Included(&b10), Descending, all),
        vec![10]
    );
}

/// A partition's scan never sees entries of another partition, even one whose key extends
/// it, is a prefix of it, or ends in `0xff` bytes.
///
/// # Panics
///
/// On the first entry seen in the wrong partition.
pub fn scans_stay_inside_their_partition<S: KvStore>(mut fresh: impl FnMut() -> S) {
    let store = fresh();
    let partitions: [&[u8]; 7] = [b"", b"a", b"ab", b"b", &[0xff], &[0xff, 0xff], b"a\x00"];
    let clusterings: [&[u8]; 4] = [b"", b"\x00", b"b", b"\xff\xff"];
    let mut batch = WriteBatch::new();
    for p in partitions {
        for c in clusterings {
            batch.put(Key::new(p, c), p);
        }
    }
    must("write", store.write(&batch));
    for p in partitions {
        for order in [Order::Ascending, Order::Descending] {
            let got = must(
                "scan",
                scan_all(
                    &store,
                    p,
                    Bound::Unbounded,
                    Bound::Unbounded,
                    order,
                    usize::MAX,
                ),
            );
            let mut expected: Vec<(Vec<u8>, Vec<u8>)> = clusterings
                .iter()
                .map(|c| (c.to_vec(), p.to_vec()))
                .collect();
            expected.sort();
            if order == Order::Descending {
                expected.reverse();
            }
            assert_eq!(got, expected, "scan of partition {p:?} {order:?}");
        }
    }
}

/// A batch whose insert-if-absent item finds its key present fails with a conflict naming
/// that item and key, and writes none of its items, in any partition.
///
/// # Panics
///
/// When the conflict is not reported or part of the batch is visible.
pub fn conflicting_batch_writes_nothing<S: KvStore>(mut fresh: impl FnMut() -> S) {
    let store = fresh();
    must(
        "insert",
        store.insert_if_absent(Key::new(b"wlog", &be(7)), b"taken"),
    );
    must("put", store.put(Key::new(b"checkpoint", b""), b"old"));
    let mut batch = WriteBatch::new();
    batch
        .put(Key::new(b"checkpoint", b""), b"new")
        .insert_if_absent(Key::new(b"plog", &be(1)), b"event")
        .delete(Key::new(b"wlog", &be(7)))
        .insert_if_absent(Key::new(b"wlog", &be(8)), b"mine")
        .insert_if_absent(Key::new(b"records", &be(1)), b"record");
    // Deleting and re-inserting inside the batch is fine; the conflict is elsewhere.
    batch.insert_if_absent(Key::new(b"wlog", &be(7)), b"again");
    batch.insert_if_absent(Key::new(b"wlog", &be(8)), b"twice");
    match store.write(&batch) {
        Err(WriteError::Conflict { index, key }) => {
            assert_eq!(
                index, 6,
                "the first conflicting item is the second insert of wlog 8"
            );
            assert_eq!(key.as_key(), Key::new(b"wlog", &be(8)));
        }
        other => panic!("expected a conflict, got {other:?}"),
    }
    assert_eq!(
        must("get", store.get(Key::new(b"checkpoint", b""))),
        Some(b"old".to_vec())
    );
    assert_eq!(
        must("get", store.get(Key::new(b"wlog", &be(7)))),
        Some(b"taken".to_vec())
    );
    for key in [
        Key::new(b"plog", &be(1)),
        Key::new(b"wlog", &be(8)),
        Key::new(b"records", &be(1)),
    ] {
        assert_eq!(
            must("get", store.get(key)),
            None,
            "{key} was written by a failed batch"
        );
    }
    // The conflict-free part alone goes through.
    let mut batch = WriteBatch::new();
    batch
        .insert_if_absent(Key::new(b"plog", &be(1)), b"event")
        .insert_if_absent(Key::new(b"wlog", &be(8)), b"mine");
    must("write", store.write(&batch));
    assert_eq!(
        must("get", store.get(Key::new(b"plog", &be(1)))),
        Some(b"event".to_vec())
    );
    // One-key insert-if-absent conflicts too.
    assert!(matches!(
        store.insert_if_absent(Key::new(b"plog", &be(1)), b"other"),
        Err(WriteError::Conflict { index: 0, .. })
    ));
}

/// Items of one batch take effect in order: a later put wins over an earlier one, a delete
/// then insert-if-absent of one key succeeds, and an empty batch is fine.
///
/// # Panics
///
/// When the final values differ.
pub fn batch_items_take_effect_in_order<S: KvStore>(mut fresh: impl FnMut() -> S) {
    let store = fresh();
    must("write", store.write(&WriteBatch::new()));
    must("put", store.put(Key::new(b"p", b"x"), b"0"));
    let mut batch = WriteBatch::new();
    batch
        .put(Key::new(b"p", b"a"), b"1")
        .put(Key::new(b"p", b"a"), b"2")
        .delete(Key::new(b"p", b"x"))
        .insert_if_absent(Key::new(b"p", b"x"), b"3")
        .put(Key::new(b"p", b"gone"), b"4")
        .delete(Key::new(b"p", b"gone"));
    must("write", store.write(&batch));
    let got = must(
        "scan",
        scan_all(
            &store,
            b"p",
            Bound::Unbounded,
            Bound::Unbounded,
            Order::Ascending,
            usize::MAX,
        ),
    );
    assert_eq!(
        got,
        vec![
            (b"a".to_vec(), b"2".to_vec()),
            (b"x".to_vec(), b"3".to_vec())
        ]
    );
    must("delete", store.delete(Key::new(b"p", b"never written")));
}

/// Compare-and-swap swaps only when the stored value (or absence) equals the expected one,
/// reports the stored value otherwise, can create and delete, and tells an empty value from
/// an absent key.
///
/// # Panics
///
/// On the first wrong answer.
pub fn compare_and_swap_checks_the_stored_value<S: KvStore>(mut fresh: impl FnMut() -> S) {
    let store = fresh();
    let key = Key::new(b"counter", b"invoice");
    must("create", store.compare_and_swap(key, None, Some(b"1")));
    match store.compare_and_swap(key, None, Some(b"9")) {
        Err(CasError::Mismatch { current }) => assert_eq!(current, Some(b"1".to_vec())),
        other => panic!("expected a mismatch, got {other:?}"),
    }
    match store.compare_and_swap(key, Some(b"2"), Some(b"3")) {
        Err(CasError::Mismatch { current }) => assert_eq!(current, Some(b"1".to_vec())),
        other => panic!("expected a mismatch, got {other:?}"),
    }
    must("swap", store.compare_and_swap(key, Some(b"1"), Some(b"2")));
    assert_eq!(must("get", store.get(key)), Some(b"2".to_vec()));
    must(
        "swap to empty",
        store.compare_and_swap(key, Some(b"2"), Some(b"")),
    );
    match store.compare_and_swap(key, None, Some(b"x")) {
        Err(CasError::Mismatch { current }) => assert_eq!(current, Some(Vec::new())),
        other => panic!("an empty value is not absence; got {other:?}"),
    }
    must("delete", store.compare_and_swap(key, Some(b""), None));
    assert_eq!(must("get", store.get(key)), None);
    match store.compare_and_swap(key, Some(b""), None) {
        Err(CasError::Mismatch { current }) => assert_eq!(current, None),
        other => panic!("expected a mismatch on an absent key, got {other:?}"),
    }
    // Deleting an absent key that is expected absent is a successful no-op.
    must("delete absent", store.compare_and_swap(key, None, None));
}

/// `compare_and_swap_each` answers each swap in order on its own condition: a swap, a create,
/// a delete and their mismatches side by side, a stale swap failing only itself, a key named
/// twice swapped in list order, and an empty list answered with nothing.
///
/// # Panics
///
/// On the first wrong answer or stored value.
pub fn compare_and_swap_each_decides_each_swap_on_its_own<S: KvStore>(
    mut fresh: impl FnMut() -> S,
) {
    let store = fresh();
    let key = |name: &'static [u8]| Key::new(b"each", name);
    for name in [&b"swap"[..], b"stale", b"present", b"delete", b"kept"] {
        must("put", store.put(key(name), b"1"));
    }
    let swap = |name, expected, new| Swap {
        key: key(name),
        expected,
        new,
    };
    let answers = store.compare_and_swap_each(&[
        swap(b"swap", Some(b"1"), Some(b"2")),
        swap(b"stale", Some(b"0"), Some(b"2")),
        swap(b"new", None, Some(b"1")),
        swap(b"present", None, Some(b"2")),
        swap(b"delete", Some(b"1"), None),
        swap(b"kept", Some(b"0"), None),
        swap(b"twice", None, Some(b"1")),
        swap(b"twice", Some(b"1"), Some(b"2")),
    ]);
    let outcome = |answer: &Result<(), CasError>| match answer {
        Ok(()) => Ok(()),
        Err(CasError::Mismatch { current }) => Err(current.clone()),
        Err(other) => panic!("compare_and_swap_each failed: {other}"),
    };
    let one = Some(b"1".to_vec());
    let got: Vec<_> = answers.iter().map(outcome).collect();
    let expected = [Ok(()), Err(one.clone()), Ok(()), Err(one.clone()), Ok(())];
    let expected = [&expected[..], &[Err(one.clone()), Ok(()), Ok(())]].concat();
    assert_eq!(got, expected, "the answers, in order");
    let stored = |name| must("get", store.get(key(name)));
    assert_eq!(stored(b"swap"), Some(b"2".to_vec()));
    assert_eq!(stored(b"stale"), one, "a failed condition writes nothing");
    assert_eq!(stored(b"new"), one);
    assert_eq!(stored(b"present"), one);
    assert_eq!(stored(b"delete"), None);
    assert_eq!(stored(b"kept"), one);
    assert_eq!(stored(b"twice"), Some(b"2".to_vec()));
    assert!(store.compare_and_swap_each(&[]).is_empty());
}

/// `get_many` answers every key, present or not, in the order asked, repeated keys included.
///
/// # Panics
///
/// When an answer is missing, extra, or out of place.
pub fn get_many_answers_in_the_order_asked<S: KvStore>(mut fresh: impl FnMut() -> S) {
    let store = fresh();
    let mut batch = WriteBatch::new();
    for n in 0..50u64 {
        batch.put(Key::new(&be(n % 3), &be(n)), &be(n * 2));
    }
    must("write", store.write(&batch));
    let wanted: Vec<u64> = vec![49, 3, 100, 3, 0, 7, 51];
    let numbers: Vec<[u8; 8]> = wanted.iter().map(|&n| be(n)).collect();
    let partitions: Vec<[u8; 8]> = wanted.iter().map(|&n| be(n % 3)).collect();
    let keys: Vec<Key<'_>> = partitions
        .iter()
        .zip(&numbers)
        .map(|(p, c)| Key::new(p, c))
        .collect();
    let got = must("get_many", store.get_many(&keys));
    let expected: Vec<Option<Vec<u8>>> = wanted
        .iter()
        .map(|&n| (n < 50).then(|| be(n * 2).to_vec()))
        .collect();
    assert_eq!(got, expected);
    assert!(must("get_many", store.get_many(&[])).is_empty());
}

/// Writes over a size limit fail with `TooLarge` and write nothing of their batch; a write
/// exactly at every limit succeeds.
///
/// # Panics
///
/// When an oversized write is accepted or a limit-sized one refused.
pub fn oversized_writes_are_rejected_whole<S: KvStore>(mut fresh: impl FnMut() -> S) {
    let store = fresh();
    let p = vec![7u8; limits::PARTITION_KEY_BYTES_MAX];
    let c = vec![9u8; limits::CLUSTERING_BYTES_MAX];
    let v = vec![1u8; limits::VALUE_BYTES_MAX];
    must("write at the limits", store.put(Key::new(&p, &c), &v));
    assert_eq!(
        must("get", store.get(Key::new(&p, &c))).map(|v| v.len()),
        Some(v.len())
    );
    let long_p = vec![7u8; limits::PARTITION_KEY_BYTES_MAX + 1];
    let long_c = vec![9u8; limits::CLUSTERING_BYTES_MAX + 1];
    let long_v = vec![1u8; limits::VALUE_BYTES_MAX + 1];
    for (key, value) in [
        (Key::new(&long_p, b""), &b""[..]),
        (Key::new(b"", &long_c), &b""[..]),
        (Key::new(b"p", b"c"), &long_v[..]),
    ] {
        let mut batch = WriteBatch::new();
        batch.put(Key::new(b"ok", b"1"), b"x").put(key, value);
        assert!(
            matches!(
                store.write(&batch),
                Err(WriteError::TooLarge { index: 1, .. })
            ),
            "an oversized item must be refused"
        );
        assert_eq!(must("get", store.get(Key::new(b"ok", b"1"))), None);
        assert!(matches!(
            store.compare_and_swap(key, None, Some(value)),
            Err(CasError::TooLarge { .. })
        ));
        assert_eq!(must("get", store.get(key)), None);
    }
}

const THREADS: usize = 4;

/// Of several threads inserting the same keys at the same time, exactly one wins each key, and
/// the stored value is the winner's.
///
/// # Panics
///
/// When two inserts of one key both succeed or none does.
pub fn concurrent_inserts_of_one_key_have_one_winner<S: KvStore>(mut fresh: impl FnMut() -> S) {
    const KEYS: u64 = 50;
    let store = Arc::new(fresh());
    let start = Arc::new(Barrier::new(THREADS));
    let threads: Vec<_> = (0..THREADS)
        .map(|thread| {
            let (store, start) = (Arc::clone(&store), Arc::clone(&start));
            std::thread::spawn(move || {
                start.wait();
                let mut won = Vec::new();
                for n in 0..KEYS {
                    let mut batch = WriteBatch::new();
                    batch
                        .insert_if_absent(Key::new(b"plog", &be(n)), &[thread as u8])
                        .insert_if_absent(Key::new(b"wlog", &be(n)), &[thread as u8]);
                    match store.write(&batch) {
                        Ok(()) => won.push(n),
                        Err(WriteError::Conflict { .. }) => {}
                        Err(other) => panic!("insert failed: {other}"),
                    }
                }
                won
            })
        })
        .collect();
    let mut winners = BTreeMap::new();
    for (thread, handle) in threads.into_iter().enumerate() {
        for n in handle.join().expect("inserting thread panicked") {
            assert!(
                winners.insert(n, thread).is_none(),
                "key {n} was inserted twice"
            );
        }
    }
    assert_eq!(
        winners.len() as u64,
        KEYS,
        "some key was inserted by nobody"
    );
    for (n, thread) in winners {
        for p in [&b"plog"[..], b"wlog"] {
            assert_eq!(
                must("get", store.get(Key::new(p, &be(n)))),
                Some(vec![thread as u8])
            );
        }
    }
}

/// Threads incrementing one counter by compare-and-swap, retrying on mismatch, lose no
/// increment.
///
/// # Panics
///
/// When the final count differs from the number of successful swaps.
pub fn concurrent_compare_and_swaps_lose_no_update<S: KvStore>(mut fresh: impl FnMut() -> S) {
    const INCREMENTS: u64 = 50;
    let store = Arc::new(fresh());
    let key = Key::new(b"named", b"counter");
    let start = Arc::new(Barrier::new(THREADS));
    let threads: Vec<_> = (0..THREADS)
        .map(|_| {
            let (store, start) = (Arc::clone(&store), Arc::clone(&start));
            std::thread::spawn(move || {
                start.wait();
                for _ in 0..INCREMENTS {
                    let mut current = must("get", store.get(key));
                    loop {
                        let next = current
                            .as_deref()
                            .map_or(0, |v| u64::from_be_bytes(v.try_into().expect("8 bytes")))
                            + 1;
                        match store.compare_and_swap(key, current.as_deref(), Some(&be(next))) {
                            Ok(()) => break,
                            Err(CasError::Mismatch { current: stored }) => current = stored,
                            Err(other) => panic!("compare-and-swap failed: {other}"),
                        }
                    }
                }
            })
        })
        .collect();
    for handle in threads {
        handle.join().expect("incrementing thread panicked");
    }
    assert_eq!(
        must("get", store.get(key)),
        Some(be(INCREMENTS * THREADS as u64).to_vec())
    );
}

/// A write whose answer was lost ([`KvError::OutcomeUnknown`], injected here by
/// [`FaultyStore`] around the backend, as a dropped connection would cause) is told apart from
/// every other error, and a read after it finds the batch whole (when it landed) or absent
/// (when it did not), in every partition it touched; a compare-and-swap likewise.
///
/// # Panics
///
/// When the error is not reported as unknown or a read finds part of a batch.
pub fn a_write_of_unknown_outcome_is_read_back_whole_or_absent<S: KvStore>(
    mut fresh: impl FnMut() -> S,
) {
    let store = FaultyStore::new(fresh());
    let batch = |n: u64| {
        let mut batch = WriteBatch::new();
        batch
            .insert_if_absent(Key::new(b"plog", &be(n)), b"event")
            .insert_if_absent(Key::new(b"wlog", &be(n)), b"entry")
            .put(Key::new(b"checkpoint", b""), &be(n));
        batch
    };
    let landed = |n: u64| -> Vec<bool> {
        [Key::new(b"plog", &be(n)), Key::new(b"wlog", &be(n))]
            .into_iter()
            .map(|k| must("get", store.get(k)).is_some())
            .collect()
    };
    store.lose_answers_next(1);
    match store.write(&batch(1)) {
        Err(e) if e.is_outcome_unknown() => {}
        other => panic!("expected an unknown outcome, got {other:?}"),
    }
    assert_eq!(landed(1), [true, true], "a landed batch reads back whole");
    assert_eq!(
        must("get", store.get(Key::new(b"checkpoint", b""))),
        Some(be(1).to_vec())
    );
    store.lose_requests_next(1);
    match store.write(&batch(2)) {
        Err(e) if e.is_outcome_unknown() => {}
        other => panic!("expected an unknown outcome, got {other:?}"),
    }
    assert_eq!(landed(2), [false, false], "a lost batch reads back absent");
    // Retried after reading back: the landed batch conflicts, the lost one goes through.
    assert!(matches!(
        store.write(&batch(1)),
        Err(WriteError::Conflict { index: 0, .. })
    ));
    must("write", store.write(&batch(2)));
    assert_eq!(landed(2), [true, true]);
    let key = Key::new(b"named", b"");
    must("put", store.put(key, b"1"));
    store.lose_answers_next(1);
    match store.compare_and_swap(key, Some(b"1"), Some(b"2")) {
        Err(e) if e.is_outcome_unknown() => {}
        other => panic!("expected an unknown outcome, got {other:?}"),
    }
    assert_eq!(must("get", store.get(key)), Some(b"2".to_vec()));
    // Any other error still means nothing was written.
    assert!(!KvError::poisoned("a test").is_outcome_unknown());
}
