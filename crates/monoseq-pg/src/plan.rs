//! [`Plan`]: a [`WriteBatch`] reduced to at most three set-based statements over distinct keys
//! (conditional inserts, upserts, deletes) with the same outcome as applying its items one
//! after another. Owns the in-order semantics of batches that touch a key more than once; pure
//! logic, no I/O.
//!
//! Why this is exact: only the first item of a key can depend on what storage holds (an
//! insert-if-absent there needs the key absent); every later item of that key sees the state
//! the earlier items left, which the batch alone determines. So the batch succeeds when no
//! item conflicts within the batch and every "first item is an insert-if-absent" key is
//! absent in storage, and then each key ends up as its last item left it.

use std::collections::BTreeMap;

use monoseq_kv::{Key, Op, WriteBatch};

/// A key whose first item in the batch is an insert-if-absent: it must be absent in storage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Condition<'a> {
    /// Position of that first item in the batch (what a conflict reports).
    pub(crate) index: usize,
    pub(crate) key: Key<'a>,
    /// The value that item inserts.
    pub(crate) value: &'a [u8],
}

/// What a batch does, as set-based statements over distinct keys, each list sorted by key
/// (so that concurrent batches lock rows of one statement in the same order).
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Plan<'a> {
    /// Keys that must be absent in storage, inserted with the value of their first item.
    pub(crate) conditions: Vec<Condition<'a>>,
    /// Keys written last by a put or an insert, with that value; conditional keys whose only
    /// item is their insert are left out (the insert already wrote them).
    pub(crate) upserts: Vec<(Key<'a>, &'a [u8])>,
    /// Keys removed last by a delete.
    pub(crate) deletes: Vec<Key<'a>>,
    /// The first insert-if-absent that conflicts with an earlier item of the same batch,
    /// whatever storage holds. When set, the batch fails: at the first of `conditions` (all
    /// before it) whose key is stored, else here; `upserts` and `deletes` are then empty.
    pub(crate) conflict_in_batch: Option<usize>,
}

#[derive(Debug)]
struct KeyState<'a> {
    /// Set when the key's first item is an insert-if-absent.
    condition: Option<Condition<'a>>,
    /// Whether the key is present after the items seen so far.
    present: bool,
    /// The value of the last item seen.
    value: &'a [u8],
    /// Whether an item after the first one touched the key.
    rewritten: bool,
}

impl<'a> Plan<'a> {
    /// The plan of `batch`.
    pub(crate) fn new(batch: &'a WriteBatch) -> Plan<'a> {
        let mut keys: BTreeMap<Key<'a>, KeyState<'a>> = BTreeMap::new();
        let mut conflict_in_batch = None;
        for (index, item) in batch.iter().enumerate() {
            let present = item.op != Op::Delete;
            match keys.get_mut(&item.key) {
                None => {
                    let condition = (item.op == Op::InsertIfAbsent).then_some(Condition {
                        index,
                        key: item.key,
                        value: item.value,
                    });
                    keys.insert(
                        item.key,
                        KeyState {
                            condition,
                            present,
                            value: item.value,
                            rewritten: false,
                        },
                    );
                }
                Some(state) => {
                    if item.op == Op::InsertIfAbsent && state.present {
                        conflict_in_batch = Some(index);
                        break;
                    }
                    state.present = present;
                    state.value = item.value;
                    state.rewritten = true;
                }
            }
        }
        let mut plan = Plan {
            conflict_in_batch,
            ..Plan::default()
        };
        for (key, state) in keys {
            if let Some(condition) = state.condition {
                plan.conditions.push(condition);
            }
            if conflict_in_batch.is_some() || (state.condition.is_some() && !state.rewritten) {
                continue;
            }
            if state.present {
                plan.upserts.push((key, state.value));
            } else {
                plan.deletes.push(key);
            }
        }
        plan
    }

    /// The index a failed batch reports, given which of `conditions` found their key stored:
    /// the first conflicting item in batch order. `None` when nothing conflicts.
    pub(crate) fn first_conflict(&self, stored: impl Fn(&Condition<'a>) -> bool) -> Option<usize> {
        let from_storage = self
            .conditions
            .iter()
            .filter(|c| stored(c))
            .map(|c| c.index)
            .min();
        match (from_storage, self.conflict_in_batch) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use monoseq_kv::{Key, Op, WriteBatch};
    use proptest::prelude::*;

    use super::Plan;

    type Model = BTreeMap<(Vec<u8>, Vec<u8>), Vec<u8>>;

    /// The batch applied item by item: the contract's definition.
    fn sequential(model: &Model, batch: &WriteBatch) -> Result<Model, usize> {
        let mut next = model.clone();
        for (index, item) in batch.iter().enumerate() {
            let key = (item.key.partition.to_vec(), item.key.clustering.to_vec());
            match item.op {
                Op::InsertIfAbsent if next.contains_key(&key) => return Err(index),
                Op::Put | Op::InsertIfAbsent => {
                    next.insert(key, item.value.to_vec());
                }
                Op::Delete => {
                    next.remove(&key);
                }
            }
        }
        Ok(next)
    }

    /// The plan applied as the store runs it: conditions, then upserts, then deletes.
    fn planned(model: &Model, batch: &WriteBatch) -> Result<Model, usize> {
        let plan = Plan::new(batch);
        let owned = |k: Key<'_>| (k.partition.to_vec(), k.clustering.to_vec());
        if let Some(index) = plan.first_conflict(|c| model.contains_key(&owned(c.key))) {
            return Err(index);
        }
        let mut next = model.clone();
        for c in &plan.conditions {
            next.insert(owned(c.key), c.value.to_vec());
        }
        for (key, value) in &plan.upserts {
            next.insert(owned(*key), value.to_vec());
        }
        for key in &plan.deletes {
            next.remove(&owned(*key));
        }
        Ok(next)
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![Just(Op::Put), Just(Op::InsertIfAbsent), Just(Op::Delete)]
    }

    proptest! {
        #[test]
        fn a_plan_has_the_outcome_of_its_batch_applied_in_order(
            stored in prop::collection::btree_map(
                (0u8..2, 0u8..4).prop_map(|(p, c)| (vec![p], vec![c])),
                prop::collection::vec(any::<u8>(), 0..2),
                0..6,
            ),
            items in prop::collection::vec((op(), 0u8..2, 0u8..4, any::<u8>()), 0..10),
        ) {
            let mut batch = WriteBatch::new();
            for (op, p, c, v) in &items {
                batch.push(*op, Key::new(&[*p], &[*c]), &[*v]);
            }
            prop_assert_eq!(planned(&stored, &batch), sequential(&stored, &batch));
        }
    }

    #[test]
    fn distinct_keys_give_one_statement_per_kind_and_no_rewrites() {
        let mut batch = WriteBatch::new();
        batch
            .insert_if_absent(Key::new(b"plog", b"\x02"), b"e2")
            .insert_if_absent(Key::new(b"plog", b"\x01"), b"e1")
            .put(Key::new(b"cp", b""), b"7")
            .delete(Key::new(b"old", b"x"));
        let plan = Plan::new(&batch);
        let keys: Vec<_> = plan.conditions.iter().map(|c| (c.index, c.key)).collect();
        // Sorted by key, each with its batch position.
        assert_eq!(
            keys,
            vec![
                (1, Key::new(b"plog", b"\x01")),
                (0, Key::new(b"plog", b"\x02"))
            ]
        );
        assert_eq!(plan.upserts, vec![(Key::new(b"cp", b""), &b"7"[..])]);
        assert_eq!(plan.deletes, vec![Key::new(b"old", b"x")]);
        assert_eq!(plan.conflict_in_batch, None);
    }

    #[test]
    fn an_insert_after_a_put_of_its_key_conflicts_without_asking_storage() {
        let mut batch = WriteBatch::new();
        batch
            .insert_if_absent(Key::new(b"a", b""), b"1")
            .put(Key::new(b"b", b""), b"2")
            .insert_if_absent(Key::new(b"b", b""), b"3")
            .insert_if_absent(Key::new(b"c", b""), b"4");
        let plan = Plan::new(&batch);
        assert_eq!(plan.conflict_in_batch, Some(2));
        // Only the condition before the conflict is left to check against storage.
        assert_eq!(plan.conditions.len(), 1);
        assert_eq!(plan.first_conflict(|_| true), Some(0));
        assert_eq!(plan.first_conflict(|_| false), Some(2));
    }
}
