//! Consumer positions on the reference store and on the embedded engine: the compare-and-set
//! rules, exactly one winner among writers expecting the same position, and a position that
//! survives closing and reopening the engine and is in a backup copy of it.

use std::sync::Arc;

use monoseq_kv::{FjallStore, KvStore, MemoryStore, Options};
use monoseq_store::conformance::{positions_compare_and_set, positions_one_writer_wins};
use monoseq_store::{AppId, ConsumerName, EventStore, PartitionId, SetPosition, TrustLevel};

/// Writers racing on one position per round.
const WRITERS: u64 = 8;
/// Rounds of the race.
const ROUNDS: u64 = 200;

fn on<K: KvStore>(kv: K) -> EventStore<K> {
    EventStore::new(kv, AppId(1), TrustLevel::Level0)
}

fn fjall(dir: &std::path::Path) -> EventStore<Arc<FjallStore>> {
    on(Arc::new(
        FjallStore::open(dir, Options::default()).expect("open the engine"),
    ))
}

#[test]
fn positions_compare_and_set_on_the_reference_store() {
    positions_compare_and_set(&on(MemoryStore::new()));
}

#[test]
fn of_writers_expecting_one_position_exactly_one_wins_on_the_reference_store() {
    positions_one_writer_wins(&on(MemoryStore::new()), WRITERS, ROUNDS);
}

#[test]
fn positions_compare_and_set_on_the_embedded_engine() {
    let dir = tempfile::tempdir().unwrap();
    positions_compare_and_set(&fjall(dir.path()));
}

#[test]
fn of_writers_expecting_one_position_exactly_one_wins_on_the_embedded_engine() {
    let dir = tempfile::tempdir().unwrap();
    positions_one_writer_wins(&fjall(dir.path()), WRITERS, ROUNDS);
}

#[test]
fn a_position_survives_reopening_the_engine_and_is_in_its_backup_copy() {
    let dir = tempfile::tempdir().unwrap();
    let live = dir.path().join("live");
    let name = ConsumerName::new("billing").unwrap();
    let set = |offset, expected| SetPosition {
        offset,
        expected,
        force: false,
    };
    {
        let store = fjall(&live);
        store
            .set_position(&name, PartitionId(3), set(41, None))
            .unwrap();
        store.sync().unwrap();
    }
    let store = fjall(&live);
    assert_eq!(store.position(&name, PartitionId(3)).unwrap(), Some(41));
    store
        .set_position(&name, PartitionId(3), set(42, Some(41)))
        .unwrap();
    let copy = dir.path().join("copy");
    store.kv().copy_to(&copy).unwrap();
    // Moved on after the copy: the copy keeps the position of its instant.
    store
        .set_position(&name, PartitionId(3), set(50, Some(42)))
        .unwrap();
    drop(store);
    let restored = fjall(&copy);
    assert_eq!(restored.position(&name, PartitionId(3)).unwrap(), Some(42));
    assert_eq!(
        restored.positions(&name).unwrap(),
        vec![(PartitionId(3), 42)]
    );
}
