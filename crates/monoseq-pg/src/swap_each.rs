//! [`PgStore`](crate::PgStore)'s [`KvStore::compare_and_swap_each`]: the compare-and-swaps of
//! several keys in one statement, so one round trip and one commit (one WAL flush) carry them
//! all, while each key swaps or not on its own condition. Owns that statement and what follows
//! it for the keys that did not swap: one read tells each its stored value, and a key found at
//! its expected value again (a concurrent writer restored it) is tried again.
//!
//! The statement is a data-modifying `WITH` over `unnest` of arrays: a conditional
//! `UPDATE … FROM` for the keys expected present, an `INSERT … ON CONFLICT DO NOTHING` for the
//! keys expected absent, answering the keys written. Isolation: READ COMMITTED is enough, as
//! for the single compare-and-swap (`store.rs`): each row's condition is re-checked on its
//! newest version under the row lock. Swaps that delete, and lists that name a key twice,
//! run one after another through the single compare-and-swap.
//!
//! [`KvStore::compare_and_swap_each`]: monoseq_kv::KvStore::compare_and_swap_each

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use monoseq_kv::{CasError, KvError, Swap, limits};
use tokio_postgres::types::ToSql;

use crate::error::Failure;
use crate::exec::Conn;
use crate::store::{Core, Inner};

/// Rounds of the statement for keys that a read right after found at their expected value
/// again (a concurrent writer changed them back in between), as for one compare-and-swap.
const ROUNDS_MAX: u32 = 64;
/// Attempts of a round that the server rolled back for a serialization failure or a deadlock.
const ATTEMPTS_MAX: u32 = 5;

/// The statement: `$1`..`$4` are the partitions, clusterings, expected values (NULL: expected
/// absent) and new values; it answers the keys it wrote.
fn statement_text(schema: &str) -> String {
    let kv = format!("{schema}.monoseq_kv");
    format!(
        "WITH input AS (SELECT * FROM unnest($1::bytea[], $2::bytea[], $3::bytea[], \
         $4::bytea[]) AS i (p, c, expected_value, new_value)), \
         updated AS (UPDATE {kv} t SET value = i.new_value FROM input i WHERE i.expected_value \
         IS NOT NULL AND t.partition = i.p AND t.clustering = i.c AND t.value = \
         i.expected_value RETURNING t.partition, t.clustering), \
         inserted AS (INSERT INTO {kv} (partition, clustering, value) SELECT p, c, new_value \
         FROM input WHERE expected_value IS NULL ON CONFLICT (partition, clustering) DO \
         NOTHING RETURNING partition, clustering) \
         SELECT partition, clustering FROM updated UNION ALL SELECT partition, clustering FROM \
         inserted"
    )
}

/// Whether the statement can carry `swaps`: every swap writes a value, and no key repeats.
fn fits_one_statement(swaps: &[Swap<'_>]) -> bool {
    let mut keys = HashSet::with_capacity(swaps.len());
    swaps
        .iter()
        .all(|swap| swap.new.is_some() && keys.insert(swap.key))
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
    /// [`KvStore::compare_and_swap_each`](monoseq_kv::KvStore) of a store whose tables live in
    /// `schema`, without a fence.
    pub(crate) fn compare_and_swap_each(
        &self,
        schema: &str,
        swaps: &[Swap<'_>],
    ) -> Vec<Result<(), CasError>> {
        if swaps.is_empty() {
            return Vec::new();
        }
        if !fits_one_statement(swaps) {
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
        let text = statement_text(schema);
        let mut attempt = 1;
        loop {
            let ran = self.run(
                self.inner.call_timeout(),
                swap_rounds(&self.inner, &text, swaps, &mut answers),
            );
            match ran {
                Ok(()) => break,
                Err(failure) if failure.is_retryable() && attempt < ATTEMPTS_MAX => {
                    std::thread::sleep(Duration::from_millis(1 << attempt));
                    attempt += 1;
                }
                Err(failure) if failure.outcome_unknown() => {
                    let settled = answers
                        .pending()
                        .first()
                        .is_some_and(|&first| self.settle(swaps[first].key));
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
}

/// Runs the statement for the pending swaps, round after round, on one connection, until each
/// swapped or found another value; answers them in `answers` as they settle.
async fn swap_rounds(
    inner: &Inner,
    text: &str,
    swaps: &[Swap<'_>],
    answers: &mut Answers,
) -> Result<(), Failure> {
    let conn = inner.conn().await?;
    for _ in 0..ROUNDS_MAX {
        let pending = answers.pending();
        if pending.is_empty() {
            conn.release();
            return Ok(());
        }
        let swapped = swap_once(&conn, text, swaps, &pending).await?;
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
            "compare-and-swap lost {ROUNDS_MAX} races in a row against writers that kept \
             restoring the expected value; retry later"
        ),
    });
    Ok(())
}

/// One statement over the swaps at `indices`: the indices of those it wrote.
async fn swap_once(
    conn: &Conn,
    text: &str,
    swaps: &[Swap<'_>],
    indices: &[usize],
) -> Result<HashSet<usize>, Failure> {
    let mut partitions = Vec::with_capacity(indices.len());
    let mut clusterings = Vec::with_capacity(indices.len());
    let mut expected = Vec::with_capacity(indices.len());
    let mut new = Vec::with_capacity(indices.len());
    for &i in indices {
        partitions.push(swaps[i].key.partition);
        clusterings.push(swaps[i].key.clustering);
        expected.push(swaps[i].expected);
        new.push(swaps[i].new);
    }
    let client = conn.client()?;
    let statement = client.prepare_cached(text).await?;
    let params: [&(dyn ToSql + Sync); 4] = [&partitions, &clusterings, &expected, &new];
    let rows = client.query(&statement, &params).await?;
    let by_key: HashMap<(&[u8], &[u8]), usize> = indices
        .iter()
        .map(|&i| ((swaps[i].key.partition, swaps[i].key.clustering), i))
        .collect();
    let mut swapped = HashSet::with_capacity(rows.len());
    for row in rows {
        let (partition, clustering): (Vec<u8>, Vec<u8>) = (row.try_get(0)?, row.try_get(1)?);
        let index = by_key
            .get(&(partition.as_slice(), clustering.as_slice()))
            .ok_or_else(|| {
                Failure::Corrupted(
                    "compare-and-swap of a list: the server answered a key it was not given"
                        .to_owned(),
                )
            })?;
        swapped.insert(*index);
    }
    Ok(swapped)
}

/// The stored values of the keys of the swaps at `indices`, in order.
async fn read_stored(
    inner: &Inner,
    conn: &Conn,
    swaps: &[Swap<'_>],
    indices: &[usize],
) -> Result<Vec<Option<Vec<u8>>>, Failure> {
    let mut values = vec![None; indices.len()];
    if indices.is_empty() {
        return Ok(values);
    }
    let partitions: Vec<&[u8]> = indices.iter().map(|&i| swaps[i].key.partition).collect();
    let clusterings: Vec<&[u8]> = indices.iter().map(|&i| swaps[i].key.clustering).collect();
    let client = conn.client()?;
    let statement = client.prepare_cached(&inner.sql.get_many).await?;
    let rows = client
        .query(&statement, &[&partitions, &clusterings])
        .await?;
    for row in rows {
        let ordinal: i64 = row.try_get(0)?;
        let slot = usize::try_from(ordinal - 1)
            .ok()
            .and_then(|i| values.get_mut(i))
            .ok_or_else(|| {
                Failure::Corrupted(format!(
                    "compare-and-swap of a list: the server answered key number {ordinal}"
                ))
            })?;
        *slot = Some(row.try_get::<_, Vec<u8>>(1)?);
    }
    Ok(values)
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
    fn deletes_and_repeated_keys_run_one_after_another() {
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
    fn an_empty_list_answers_nothing() {
        assert!(store().compare_and_swap_each(&[]).is_empty());
    }
}
