//! [`PgStore`](crate::PgStore)'s [`KvStore::compare_and_swap_each`]: the compare-and-swaps of
//! several keys in one transaction, so one round trip and one commit (one WAL flush) carry them
//! all, while each key swaps or not on its own condition. Owns that transaction and what
//! follows it for the keys that did not swap: one read tells each its stored value, and a key
//! found at its expected value again (a concurrent writer restored it) is tried again.
//!
//! The transaction is `BEGIN`, the single compare-and-swap's conditional statement for each key
//! (`UPDATE`/`DELETE … WHERE value = $expected`, `INSERT … ON CONFLICT DO NOTHING`, each a
//! lookup of the primary key), and `COMMIT`, sent together. A statement that finds another
//! value writes nothing and fails nothing: the others commit. The keys go in ascending order,
//! so that two such transactions of different processes lock rows in the same order and never
//! deadlock each other. Isolation: READ COMMITTED is enough, as for the single compare-and-swap
//! (`store.rs`): each row's condition is re-checked on its newest version under the row lock.
//! A single swap, a swap that expects absence and deletes, and lists that name a key twice run
//! through the single compare-and-swap, one after another.
//!
//! A transaction whose answer was lost is settled on every key still unanswered (one
//! rolled-back transaction of insert-if-absent statements in key order, which waits for any
//! transaction that locked one of them), since the keys it swapped, and so locked, are unknown.
//!
//! [`KvStore::compare_and_swap_each`]: monoseq_kv::KvStore::compare_and_swap_each

use std::collections::HashSet;
use std::time::Duration;

use futures_util::future::{join_all, join3};
use monoseq_kv::{CasError, Key, KvError, Swap, limits};
use tokio_postgres::types::ToSql;

use crate::core::{CAS_ATTEMPTS_MAX, Inner, WRITE_ATTEMPTS_MAX, read_many};
use crate::error::Failure;
use crate::exec::Conn;
use crate::store::Core;

/// Whether one transaction carries `swaps`: several, each writing or deleting, no key twice.
fn fits_one_transaction(swaps: &[Swap<'_>]) -> bool {
    let mut keys = HashSet::with_capacity(swaps.len());
    swaps.len() > 1
        && swaps
            .iter()
            .all(|swap| (swap.expected.is_some() || swap.new.is_some()) && keys.insert(swap.key))
}

/// The answers of a [`KvStore::compare_and_swap_each`](monoseq_kv::KvStore) as they come in.
struct Answers(Vec<Option<Result<(), CasError>>>);

impl Answers {
    /// Indices still without an answer.
    fn pending(&self) -> Vec<usize> {
        (0..self.0.len()).filter(|&i| self.0[i].is_none()).collect()
    }

    fn set(&mut self, index: usize, answer: Result<(), CasError>) {
        self.0[index] = Some(answer);
    }

    /// Answers every pending swap with `error` (the first keeps it, the others get a copy of
    /// the same kind).
    fn fail_pending(&mut self, error: KvError) {
        let copy = |error: &KvError| match error {
            KvError::OutcomeUnknown { message } => KvError::OutcomeUnknown {
                message: message.clone(),
            },
            other => KvError::Backend {
                message: other.to_string(),
                source: None,
            },
        };
        let pending = self.pending();
        for &index in pending.iter().skip(1) {
            self.set(index, Err(CasError::Storage(copy(&error))));
        }
        if let Some(&first) = pending.first() {
            self.set(first, Err(CasError::Storage(error)));
        }
    }

    fn into_results(self) -> Vec<Result<(), CasError>> {
        self.0
            .into_iter()
            .map(|answer| {
                answer.unwrap_or_else(|| {
                    Err(CasError::Storage(KvError::Corrupted {
                        message: "a compare-and-swap of a list was left without an answer"
                            .to_owned(),
                    }))
                })
            })
            .collect()
    }
}

impl Core {
    /// [`KvStore::compare_and_swap_each`](monoseq_kv::KvStore), without a fence.
    pub(crate) fn compare_and_swap_each(&self, swaps: &[Swap<'_>]) -> Vec<Result<(), CasError>> {
        if !fits_one_transaction(swaps) {
            return swaps
                .iter()
                .map(|s| self.compare_and_swap(s.key, s.expected, s.new, None))
                .collect();
        }
        let mut answers = Answers(swaps.iter().map(|_| None).collect());
        for (index, swap) in swaps.iter().enumerate() {
            if let Some((what, len, max)) = limits::exceeded(swap.key, swap.new.unwrap_or_default())
            {
                answers.set(index, Err(CasError::TooLarge { what, len, max }));
            }
        }
        let mut attempt = 1;
        loop {
            let ran = self.run(
                self.inner.call_timeout(),
                swap_rounds(&self.inner, swaps, &mut answers),
            );
            match ran {
                Ok(()) => break,
                Err(failure) if failure.is_retryable() && attempt < WRITE_ATTEMPTS_MAX => {
                    std::thread::sleep(Duration::from_millis(1 << attempt));
                    attempt += 1;
                }
                Err(failure) if failure.outcome_unknown() => {
                    let settled = self.settle_each(swaps, &answers.pending());
                    answers.fail_pending(
                        failure.into_unknown("a compare-and-swap of a list", settled),
                    );
                    break;
                }
                Err(failure) => {
                    answers.fail_pending(
                        failure.into_kv("a compare-and-swap of a list, which did not swap"),
                    );
                    break;
                }
            }
        }
        answers.into_results()
    }

    /// [`Core::settle`] for the keys of the swaps at `indices` together: one transaction of
    /// their insert-if-absent statements in key order (the order a swapping transaction locks
    /// them in), rolled back. True when it ended within the call's time limit.
    fn settle_each(&self, swaps: &[Swap<'_>], indices: &[usize]) -> bool {
        let mut keys: Vec<Key<'_>> = indices.iter().map(|&i| swaps[i].key).collect();
        keys.sort();
        let inner = &self.inner;
        self.run(inner.call_timeout(), async {
            let conn = inner.conn().await?;
            let client = conn.client()?;
            let insert = client.prepare_cached(&inner.sql.kv.cas_insert).await?;
            let empty: &[u8] = b"";
            let params: Vec<[&(dyn ToSql + Sync); 3]> = keys
                .iter()
                .map(|key| [&key.partition as _, &key.clustering as _, &empty as _])
                .collect();
            let inserts = params.iter().map(|params| client.execute(&insert, params));
            let (begin, inserted, rollback) = join3(
                client.batch_execute("BEGIN"),
                join_all(inserts),
                client.batch_execute("ROLLBACK"),
            )
            .await;
            begin?;
            for inserted in inserted {
                inserted?;
            }
            rollback?;
            conn.release();
            Ok(())
        })
        .is_ok()
    }
}

/// Runs the transaction for the pending swaps, round after round, on one connection, until
/// each swapped or found another value; answers them in `answers` as they settle.
async fn swap_rounds(
    inner: &Inner,
    swaps: &[Swap<'_>],
    answers: &mut Answers,
) -> Result<(), Failure> {
    let conn = inner.conn().await?;
    for _ in 0..CAS_ATTEMPTS_MAX {
        let pending = answers.pending();
        if pending.is_empty() {
            conn.release();
            return Ok(());
        }
        let swapped = swap_once(inner, &conn, swaps, &pending).await?;
        let (done, missed): (Vec<usize>, Vec<usize>) =
            pending.into_iter().partition(|i| swapped.contains(i));
        for index in done {
            answers.set(index, Ok(()));
        }
        let stored = read_stored(inner, &conn, swaps, &missed).await?;
        for (index, current) in missed.into_iter().zip(stored) {
            if current.as_deref() != swaps[index].expected {
                answers.set(index, Err(CasError::Mismatch { current }));
            }
        }
    }
    conn.release();
    answers.fail_pending(KvError::Corrupted {
        message: format!(
            "compare-and-swap lost {CAS_ATTEMPTS_MAX} races in a row against writers that kept \
             restoring the expected value; retry later"
        ),
    });
    Ok(())
}

/// One transaction over the swaps at `indices`, in key order: the indices of those that wrote.
async fn swap_once(
    inner: &Inner,
    conn: &Conn,
    swaps: &[Swap<'_>],
    indices: &[usize],
) -> Result<HashSet<usize>, Failure> {
    let client = conn.client()?;
    let update = client.prepare_cached(&inner.sql.kv.cas_update).await?;
    let delete = client.prepare_cached(&inner.sql.kv.cas_delete).await?;
    let insert = client.prepare_cached(&inner.sql.kv.cas_insert).await?;
    let mut order = indices.to_vec();
    order.sort_by_key(|&i| swaps[i].key);
    let params: Vec<Vec<&(dyn ToSql + Sync)>> = order.iter().map(|&i| params(&swaps[i])).collect();
    let statements = order.iter().zip(&params).map(|(&i, params)| {
        let statement = match (swaps[i].expected, swaps[i].new) {
            (Some(_), Some(_)) => &update,
            (Some(_), None) => &delete,
            _ => &insert,
        };
        client.execute(statement, params)
    });
    let (begin, changed, commit) = join3(
        client.batch_execute("BEGIN"),
        join_all(statements),
        client.batch_execute("COMMIT"),
    )
    .await;
    begin?;
    let mut swapped = HashSet::with_capacity(order.len());
    for (index, changed) in order.into_iter().zip(changed) {
        if changed? == 1 {
            swapped.insert(index);
        }
    }
    commit?;
    Ok(swapped)
}

/// The parameters of the single compare-and-swap's statement for `swap`: the key, then the
/// expected value when there is one, then the new value when there is one.
fn params<'a>(swap: &'a Swap<'_>) -> Vec<&'a (dyn ToSql + Sync)> {
    let mut params: Vec<&(dyn ToSql + Sync)> = vec![&swap.key.partition, &swap.key.clustering];
    if let Some(expected) = &swap.expected {
        params.push(expected);
    }
    if let Some(new) = &swap.new {
        params.push(new);
    }
    params
}

/// The stored values of the keys of the swaps at `indices`, in order.
async fn read_stored(
    inner: &Inner,
    conn: &Conn,
    swaps: &[Swap<'_>],
    indices: &[usize],
) -> Result<Vec<Option<Vec<u8>>>, Failure> {
    if indices.is_empty() {
        return Ok(Vec::new());
    }
    let keys = indices.iter().map(|&i| swaps[i].key);
    read_many(inner, conn, keys, "compare-and-swap of a list").await
}

#[cfg(test)]
mod tests {
    use monoseq_kv::{CasError, Key, KvStore, Swap};

    use crate::PgOptions;
    use crate::testing::PgCluster;

    fn store() -> crate::PgStore {
        let cluster = PgCluster::shared().unwrap_or_else(|e| panic!("{e}"));
        cluster.fresh_store(PgOptions::default()).unwrap()
    }

    fn swap<'a>(key: &'a [u8], expected: Option<&'a [u8]>, new: &'a [u8]) -> Swap<'a> {
        Swap {
            key: Key::new(key, b""),
            expected,
            new: Some(new),
        }
    }

    #[test]
    fn each_key_swaps_or_mismatches_on_its_own_condition() {
        let store = store();
        store.put(Key::new(b"a", b""), b"1").unwrap();
        store.put(Key::new(b"b", b""), b"1").unwrap();
        store.put(Key::new(b"present", b""), b"1").unwrap();
        let results = store.compare_and_swap_each(&[
            swap(b"a", Some(b"1"), b"2"),
            swap(b"b", Some(b"stale"), b"2"),
            swap(b"new", None, b"1"),
            swap(b"present", None, b"2"),
        ]);
        assert!(results[0].is_ok(), "{:?}", results[0]);
        assert!(
            matches!(&results[1], Err(CasError::Mismatch { current: Some(v) }) if v == b"1"),
            "{:?}",
            results[1]
        );
        assert!(results[2].is_ok(), "{:?}", results[2]);
        assert!(
            matches!(&results[3], Err(CasError::Mismatch { current: Some(v) }) if v == b"1"),
            "{:?}",
            results[3]
        );
        let get = |key: &[u8]| store.get(Key::new(key, b"")).unwrap();
        assert_eq!(get(b"a"), Some(b"2".to_vec()));
        assert_eq!(get(b"b"), Some(b"1".to_vec()));
        assert_eq!(get(b"new"), Some(b"1".to_vec()));
        assert_eq!(get(b"present"), Some(b"1".to_vec()));
    }

    #[test]
    fn a_swap_missing_its_key_mismatches_with_the_key_absent() {
        let store = store();
        let results = store.compare_and_swap_each(&[swap(b"gone", Some(b"1"), b"2")]);
        assert!(
            matches!(&results[0], Err(CasError::Mismatch { current: None })),
            "{:?}",
            results[0]
        );
        assert_eq!(store.get(Key::new(b"gone", b"")).unwrap(), None);
    }

    #[test]
    fn repeated_keys_and_deletes_take_effect_in_order() {
        let store = store();
        store.put(Key::new(b"a", b""), b"1").unwrap();
        let delete = Swap {
            key: Key::new(b"a", b""),
            expected: Some(b"1"),
            new: None,
        };
        let results = store.compare_and_swap_each(&[
            swap(b"b", None, b"1"),
            swap(b"b", Some(b"1"), b"2"),
            delete,
        ]);
        assert!(results.iter().all(Result::is_ok), "{results:?}");
        assert_eq!(store.get(Key::new(b"a", b"")).unwrap(), None);
        assert_eq!(store.get(Key::new(b"b", b"")).unwrap(), Some(b"2".to_vec()));
    }

    #[test]
    fn a_delete_and_a_mismatched_delete_commit_with_the_other_swaps() {
        let store = store();
        store.put(Key::new(b"a", b""), b"1").unwrap();
        store.put(Key::new(b"b", b""), b"1").unwrap();
        store.put(Key::new(b"c", b""), b"1").unwrap();
        let delete = |key, expected| Swap {
            key: Key::new(key, b""),
            expected: Some(expected),
            new: None,
        };
        let results = store.compare_and_swap_each(&[
            delete(b"a", b"1"),
            delete(b"b", b"stale"),
            swap(b"c", Some(b"1"), b"2"),
        ]);
        assert!(results[0].is_ok(), "{:?}", results[0]);
        assert!(
            matches!(&results[1], Err(CasError::Mismatch { current: Some(v) }) if v == b"1"),
            "{:?}",
            results[1]
        );
        assert!(results[2].is_ok(), "{:?}", results[2]);
        assert_eq!(store.get(Key::new(b"a", b"")).unwrap(), None);
        assert_eq!(store.get(Key::new(b"b", b"")).unwrap(), Some(b"1".to_vec()));
        assert_eq!(store.get(Key::new(b"c", b"")).unwrap(), Some(b"2".to_vec()));
    }

    #[test]
    fn an_empty_list_answers_nothing() {
        assert!(store().compare_and_swap_each(&[]).is_empty());
    }
}
