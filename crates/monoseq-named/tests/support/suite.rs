//! The behaviour suite every named-sequence backend passes: each function takes a fresh backend and
//! checks one behaviour of the reference design (or of the backend contract) through it.
//! `tests/operations.rs` runs it on the key-value backends, `tests/s3.rs` on the S3 server, and the
//! `monoseq` crate's `tests/pg_named.rs` on PostgreSQL (a crate above named and pg).

use std::collections::BTreeSet;
use std::num::NonZeroU64;
use std::sync::Arc;

use monoseq_named::{
    Address, Backend, ConditionalWrite, Metadata, NextError, NextOptions, ReadError, Scope,
    Sequences, SetError, SetOptions, VALUE_MAX, Version, WriteFailure,
};

pub type Shared = Arc<dyn Backend>;

fn address(text: &str) -> Address {
    text.parse().expect("valid address")
}

fn n(value: u64) -> NonZeroU64 {
    NonZeroU64::new(value).expect("non-zero")
}

fn metadata(pairs: &[(&str, &str)]) -> Metadata {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), serde_json::Value::from(*v)))
        .collect()
}

pub async fn next_returns_the_value_before_incrementing(backend: Shared) {
    let s = Sequences::new(backend);
    let a = address("orders/id");
    assert_eq!(s.get(&a).await.unwrap(), None);
    assert_eq!(s.next(&a, &NextOptions::new()).await.unwrap(), 1);
    assert_eq!(s.get(&a).await.unwrap(), Some(2));
    assert_eq!(s.next(&a, &NextOptions::new()).await.unwrap(), 2);
    assert_eq!(s.next(&a, &NextOptions::new()).await.unwrap(), 3);
    assert_eq!(s.get(&a).await.unwrap(), Some(4));
}

pub async fn increment_returns_the_value_after_incrementing(backend: Shared) {
    let s = Sequences::new(backend);
    let a = address("plugin=metrics/views:home");
    assert_eq!(s.increment(&a, &NextOptions::new()).await.unwrap(), 2);
    s.reset(&a, 5, &SetOptions::new()).await.unwrap();
    assert_eq!(s.increment(&a, &NextOptions::new()).await.unwrap(), 6);
    let by_ten = NextOptions::new().increment(n(10));
    assert_eq!(s.increment(&a, &by_ten).await.unwrap(), 16);
    assert_eq!(s.get(&a).await.unwrap(), Some(16));
}

pub async fn batch_next_returns_the_first_of_n_values(backend: Shared) {
    let s = Sequences::new(backend);
    let a = address("products/id");
    let hundred = NextOptions::new().increment(n(100));
    assert_eq!(s.next(&a, &hundred).await.unwrap(), 1);
    assert_eq!(s.next(&a, &hundred).await.unwrap(), 101);
    assert_eq!(s.next(&a, &NextOptions::new()).await.unwrap(), 201);
}

pub async fn initial_value_applies_only_to_a_new_sequence(backend: Shared) {
    let s = Sequences::new(backend);
    let a = address("invoices/number");
    let from_1000 = NextOptions::new().initial(1000);
    assert_eq!(s.next(&a, &from_1000).await.unwrap(), 1000);
    assert_eq!(
        s.next(&a, &NextOptions::new().initial(5)).await.unwrap(),
        1001
    );
    let b = address("invoices/zero");
    assert_eq!(s.next(&b, &NextOptions::new().initial(0)).await.unwrap(), 0);
}

pub async fn get_data_reports_name_value_times_and_metadata(backend: Shared) {
    let s = Sequences::new(backend);
    let a = address("resource=orders/plugin=backup/run");
    assert!(s.get_data(&a).await.unwrap().is_none());
    let before = now_ms();
    let options = NextOptions::new()
        .initial(1000)
        .metadata(metadata(&[("format", "INV-%04d")]));
    s.next(&a, &options).await.unwrap();
    let data = s.get_data(&a).await.unwrap().unwrap();
    assert_eq!(data.name, "run");
    assert_eq!(data.value, 1001);
    assert_eq!(data.revision, 1);
    assert_eq!(data.metadata, metadata(&[("format", "INV-%04d")]));
    assert!(data.created_at_ms >= before && data.created_at_ms <= now_ms());
    assert_eq!(data.updated_at_ms, data.created_at_ms);
    std::thread::sleep(std::time::Duration::from_millis(5));
    s.next(&a, &NextOptions::new()).await.unwrap();
    let later = s.get_data(&a).await.unwrap().unwrap();
    assert_eq!(later.created_at_ms, data.created_at_ms);
    assert!(later.updated_at_ms > data.updated_at_ms);
    assert_eq!(later.revision, 2);
    assert_eq!(
        later.metadata, data.metadata,
        "next without metadata keeps it"
    );
}

pub async fn reset_and_set_change_the_next_value_with_metadata(backend: Shared) {
    let s = Sequences::new(backend);
    let a = address("counter");
    s.next(&a, &NextOptions::new()).await.unwrap();
    let options = SetOptions::new().metadata(metadata(&[("resetBy", "admin")]));
    let data = s.reset(&a, 1000, &options).await.unwrap();
    assert_eq!(data.value, 1000);
    assert_eq!(s.next(&a, &NextOptions::new()).await.unwrap(), 1000);
    let data = s.set(&a, 500, &SetOptions::new()).await.unwrap();
    assert_eq!(data.metadata, metadata(&[("resetBy", "admin")]), "kept");
    let options = SetOptions::new().metadata(metadata(&[("reason", "migration")]));
    s.set(&a, 500, &options).await.unwrap();
    let data = s.get_data(&a).await.unwrap().unwrap();
    assert_eq!(data.value, 500);
    assert_eq!(data.metadata, metadata(&[("reason", "migration")]));
    // Reset creates a sequence that does not exist.
    let b = address("fresh");
    s.reset(&b, VALUE_MAX, &SetOptions::new()).await.unwrap();
    assert_eq!(s.get(&b).await.unwrap(), Some(VALUE_MAX));
}

pub async fn delete_removes_and_exists_tells(backend: Shared) {
    let s = Sequences::new(backend);
    let a = address("prefix=my-app/counter");
    assert!(!s.exists(&a).await.unwrap());
    s.delete(&a).await.unwrap(); // absent is fine
    s.next(&a, &NextOptions::new().initial(7)).await.unwrap();
    assert!(s.exists(&a).await.unwrap());
    s.delete(&a).await.unwrap();
    assert!(!s.exists(&a).await.unwrap());
    assert_eq!(s.get(&a).await.unwrap(), None);
    assert_eq!(s.next(&a, &NextOptions::new()).await.unwrap(), 1);
}

pub async fn scopes_store_at_the_seed_key_layout(backend: Shared) {
    let s = Sequences::new(Arc::clone(&backend));
    let cases = [
        (Scope::Global, "sequences/counter/value"),
        (
            Scope::resource("orders").unwrap(),
            "resource=orders/sequence=counter/value",
        ),
        (
            Scope::plugin("audit").unwrap(),
            "plugin=audit/sequence=counter/value",
        ),
        (
            Scope::resource_plugin("orders", "backup").unwrap(),
            "resource=orders/plugin=backup/sequence=counter/value",
        ),
        (
            Scope::prefix("my-app/").unwrap(),
            "my-app/sequence=counter/value",
        ),
    ];
    for (i, (scope, key)) in cases.into_iter().enumerate() {
        let a = Address::new(scope, "counter").unwrap();
        assert_eq!(a.key(), key);
        let initial = 10 * i as u64;
        assert_eq!(
            s.next(&a, &NextOptions::new().initial(initial))
                .await
                .unwrap(),
            initial,
            "each scope is its own sequence"
        );
        let object = backend.load(key).await.unwrap().expect("stored at the key");
        let json: serde_json::Value = serde_json::from_slice(&object.bytes).unwrap();
        assert_eq!(json["value"], initial + 1);
        assert_eq!(json["name"], "counter");
        assert!(json["createdAt"].is_u64() && json["updatedAt"].is_u64());
    }
}

pub async fn invalid_stored_object_is_reported_and_left_unchanged(backend: Shared) {
    let s = Sequences::new(Arc::clone(&backend));
    let garbage: &[&[u8]] = &[
        b"not json",
        b"{\"value\": -1}",
        b"{\"format\":1,\"name\":\"broken\",\"value\":\"12\",\"revision\":1,\"createdAt\":1,\"updatedAt\":1,\"metadata\":{}}",
        b"{\"format\":1,\"name\":\"other\",\"value\":12,\"revision\":1,\"createdAt\":1,\"updatedAt\":1,\"metadata\":{}}",
    ];
    for bytes in garbage {
        let a = address("orders/broken");
        backend.remove(a.key()).await.unwrap();
        backend.create(a.key(), bytes.to_vec()).await.unwrap();
        let next = s.next(&a, &NextOptions::new()).await.unwrap_err();
        assert!(matches!(next, NextError::InvalidStored { .. }), "{next}");
        let reset = s.reset(&a, 5, &SetOptions::new()).await.unwrap_err();
        assert!(matches!(reset, SetError::InvalidStored { .. }), "{reset}");
        let read = s.get_data(&a).await.unwrap_err();
        assert!(matches!(read, ReadError::InvalidStored { .. }), "{read}");
        assert!(s.exists(&a).await.unwrap());
        let object = backend.load(a.key()).await.unwrap().unwrap();
        assert_eq!(object.bytes, *bytes, "nothing overwritten");
    }
    let a = address("orders/broken");
    s.delete(&a).await.unwrap();
    assert_eq!(s.next(&a, &NextOptions::new()).await.unwrap(), 1);
}

pub async fn overflow_and_bad_values_are_errors_that_write_nothing(backend: Shared) {
    let s = Sequences::new(backend);
    let a = address("near-the-end");
    s.reset(&a, VALUE_MAX - 2, &SetOptions::new())
        .await
        .unwrap();
    let three = NextOptions::new().increment(n(3));
    let error = s.next(&a, &three).await.unwrap_err();
    assert!(matches!(error, NextError::Overflow { .. }), "{error}");
    assert_eq!(s.get(&a).await.unwrap(), Some(VALUE_MAX - 2));
    assert_eq!(
        s.next(&a, &NextOptions::new().increment(n(2)))
            .await
            .unwrap(),
        VALUE_MAX - 2
    );
    assert_eq!(s.get(&a).await.unwrap(), Some(VALUE_MAX));
    let error = s.next(&a, &NextOptions::new()).await.unwrap_err();
    assert!(matches!(error, NextError::Overflow { .. }), "{error}");
    let error = s
        .reset(&a, VALUE_MAX + 1, &SetOptions::new())
        .await
        .unwrap_err();
    assert!(matches!(error, SetError::InvalidValue { .. }), "{error}");
    assert_eq!(s.get(&a).await.unwrap(), Some(VALUE_MAX));
    let b = address("never-created");
    let error = s
        .next(&b, &NextOptions::new().initial(VALUE_MAX + 1))
        .await
        .unwrap_err();
    assert!(matches!(error, NextError::InvalidValue { .. }), "{error}");
    let huge: Metadata = [("blob".to_owned(), "x".repeat(9000).into())]
        .into_iter()
        .collect();
    let error = s
        .next(&b, &NextOptions::new().metadata(huge.clone()))
        .await
        .unwrap_err();
    assert!(
        matches!(error, NextError::MetadataTooLarge { .. }),
        "{error}"
    );
    let error = s
        .reset(&b, 1, &SetOptions::new().metadata(huge))
        .await
        .unwrap_err();
    assert!(
        matches!(error, SetError::MetadataTooLarge { .. }),
        "{error}"
    );
    assert!(!s.exists(&b).await.unwrap());
}

pub async fn conditional_writes_from_a_stale_read_are_refused(backend: Shared) {
    let key = "resource=contract/sequence=cas/value";
    backend.remove(key).await.unwrap();
    backend.create(key, b"one".to_vec()).await.unwrap();
    assert!(matches!(
        backend.create(key, b"again".to_vec()).await,
        Err(WriteFailure::Conflict)
    ));
    let read = backend.load(key).await.unwrap().unwrap();
    assert_eq!(read.bytes, b"one");
    backend
        .replace(key, &read.version, b"two".to_vec())
        .await
        .unwrap();
    // The same stale version again: refused, nothing written.
    assert!(matches!(
        backend.replace(key, &read.version, b"three".to_vec()).await,
        Err(WriteFailure::Conflict)
    ));
    assert_eq!(backend.load(key).await.unwrap().unwrap().bytes, b"two");
    backend.remove(key).await.unwrap();
    assert!(matches!(
        backend.replace(key, &read.version, b"four".to_vec()).await,
        Err(WriteFailure::Conflict)
    ));
    assert!(backend.load(key).await.unwrap().is_none());
}

pub async fn concurrent_callers_get_unique_gapless_numbers(backend: Shared) {
    let s = Sequences::new(backend);
    let a = address("orders/concurrent");
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let s = s.clone();
        let a = a.clone();
        tasks.push(tokio::spawn(async move {
            let mut got = Vec::new();
            for _ in 0..25 {
                got.push(s.next(&a, &NextOptions::new()).await.unwrap());
            }
            got
        }));
    }
    let mut all = BTreeSet::new();
    for task in tasks {
        for value in task.await.unwrap() {
            assert!(all.insert(value), "{value} handed out twice");
        }
    }
    assert_eq!(all, (1..=400).collect::<BTreeSet<u64>>());
    assert_eq!(s.get(&a).await.unwrap(), Some(401));
}

pub async fn writes_of_several_keys_succeed_or_fail_each_on_its_own(backend: Shared) {
    let keys = [
        "resource=contract/sequence=each-a/value",
        "resource=contract/sequence=each-b/value",
        "resource=contract/sequence=each-c/value",
        "resource=contract/sequence=each-d/value",
    ];
    for key in keys {
        backend.remove(key).await.unwrap();
    }
    let a = backend.create(keys[0], b"a1".to_vec()).await.unwrap();
    backend.create(keys[1], b"b1".to_vec()).await.unwrap();
    let stale = backend.load(keys[1]).await.unwrap().unwrap().version;
    let b = backend
        .replace(keys[1], &stale, b"b2".to_vec())
        .await
        .unwrap();
    backend.create(keys[3], b"d1".to_vec()).await.unwrap();
    let write = |key: &str, expected: Option<&Version>, bytes: &[u8]| ConditionalWrite {
        key: key.to_owned(),
        expected: expected.cloned(),
        bytes: bytes.to_vec(),
    };
    let answers = backend
        .write_each(vec![
            write(keys[0], Some(&a), b"a2"),
            write(keys[1], Some(&stale), b"b3"),
            write(keys[2], None, b"c1"),
            write(keys[3], None, b"d2"),
        ])
        .await;
    assert_eq!(answers.len(), 4);
    assert!(answers[0].is_ok(), "{:?}", answers[0]);
    assert!(
        matches!(answers[1], Err(WriteFailure::Conflict)),
        "{:?}",
        answers[1]
    );
    assert!(answers[2].is_ok(), "{:?}", answers[2]);
    assert!(
        matches!(answers[3], Err(WriteFailure::Conflict)),
        "{:?}",
        answers[3]
    );
    let stored = |key| {
        let backend = Arc::clone(&backend);
        async move { backend.load(key).await.unwrap().unwrap() }
    };
    let a2 = stored(keys[0]).await;
    assert_eq!(a2.bytes, b"a2");
    assert_eq!(
        Some(&a2.version),
        answers[0].as_ref().ok(),
        "the answered version is the stored one"
    );
    assert_eq!(
        stored(keys[1]).await.version,
        b,
        "a refused write changes nothing"
    );
    assert_eq!(stored(keys[2]).await.bytes, b"c1");
    assert_eq!(stored(keys[3]).await.bytes, b"d1");
    for key in keys {
        backend.remove(key).await.unwrap();
    }
}

pub async fn concurrent_callers_on_many_sequences_get_unique_gapless_numbers(backend: Shared) {
    const SEQUENCES: usize = 8;
    const CALLS: u64 = 20;
    let s = Sequences::new(backend);
    let mut tasks = Vec::new();
    for i in 0..SEQUENCES {
        for _ in 0..2 {
            let s = s.clone();
            let a = address(&format!("orders/many{i}"));
            tasks.push(tokio::spawn(async move {
                let mut got = Vec::new();
                for _ in 0..CALLS / 2 {
                    got.push(s.next(&a, &NextOptions::new()).await.unwrap());
                }
                (i, got)
            }));
        }
    }
    let mut handed = vec![BTreeSet::new(); SEQUENCES];
    for task in tasks {
        let (i, got) = task.await.unwrap();
        for value in got {
            assert!(
                handed[i].insert(value),
                "{value} handed out twice on sequence {i}"
            );
        }
    }
    for (i, numbers) in handed.iter().enumerate() {
        assert_eq!(
            numbers,
            &(1..=CALLS).collect::<BTreeSet<u64>>(),
            "sequence {i}"
        );
        let a = address(&format!("orders/many{i}"));
        assert_eq!(s.get(&a).await.unwrap(), Some(CALLS + 1));
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// Declares one `#[tokio::test]` per suite behaviour, each on a backend made by `$make`
/// (an async expression evaluating to a [`Shared`]).
#[macro_export]
macro_rules! backend_suite {
    ($module:ident, $make:expr) => {
        mod $module {
            #[allow(unused_imports)]
            use super::*;
            $crate::backend_suite!(@tests $make;
                next_returns_the_value_before_incrementing,
                increment_returns_the_value_after_incrementing,
                batch_next_returns_the_first_of_n_values,
                initial_value_applies_only_to_a_new_sequence,
                get_data_reports_name_value_times_and_metadata,
                reset_and_set_change_the_next_value_with_metadata,
                delete_removes_and_exists_tells,
                scopes_store_at_the_seed_key_layout,
                invalid_stored_object_is_reported_and_left_unchanged,
                overflow_and_bad_values_are_errors_that_write_nothing,
                conditional_writes_from_a_stale_read_are_refused,
                concurrent_callers_get_unique_gapless_numbers,
                writes_of_several_keys_succeed_or_fail_each_on_its_own,
                concurrent_callers_on_many_sequences_get_unique_gapless_numbers,
            );
        }
    };
    (@tests $make:expr; $($name:ident,)*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                let backend = $make;
                $crate::support::suite::$name(backend).await;
            }
        )*
    };
}
