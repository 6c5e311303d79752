//! A `FaultyStore` that fails nothing is a backend: it passes the conformance suite.

mod faulty_memory {
    monoseq_kv::conformance_tests!(|| monoseq_kv::FaultyStore::new(monoseq_kv::MemoryStore::new()));
}

/// A poisoned `FaultyStore` fails every write and sync as a poisoned engine does, naming the
/// first failure; reads pass, and healing does not undo it.
#[test]
fn a_poisoned_store_fails_writes_and_syncs_naming_the_first_failure_until_reopened() {
    use monoseq_kv::{FaultyStore, Key, KvStore, MemoryStore};
    let store = FaultyStore::new(MemoryStore::new());
    store
        .put(Key::new(b"p", b"a"), b"1")
        .expect("before the poison");
    store.poison("the disk is full");
    store.poison("a later failure");
    store.heal();
    let write = store.put(Key::new(b"p", b"b"), b"2").expect_err("a write");
    let sync = store.sync().expect_err("a sync");
    for e in [write.to_string(), sync.to_string()] {
        assert!(e.starts_with(monoseq_kv::POISONED), "{e}");
        assert!(e.contains("the disk is full"), "{e}");
        assert!(!e.contains("a later failure"), "{e}");
    }
    assert!(monoseq_kv::is_poisoned(&write));
    assert_eq!(
        store.get(Key::new(b"p", b"a")).expect("a read"),
        Some(b"1".to_vec())
    );
}
