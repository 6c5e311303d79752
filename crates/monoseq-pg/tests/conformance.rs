//! Runs the key-value conformance suite (the definition of a backend) against `PgStore` on a
//! real PostgreSQL server, and against a `FencedPgStore` whose lease is held: one private
//! cluster for this test binary, a fresh schema per store.

use monoseq_pg::PgOptions;
use monoseq_pg::testing::PgCluster;

fn fresh() -> monoseq_pg::PgStore {
    let cluster = PgCluster::shared().unwrap_or_else(|e| panic!("{e}"));
    cluster
        .fresh_store(PgOptions::default().pool_connections(4))
        .unwrap_or_else(|e| panic!("{e}"))
}

/// A fenced view of a fresh store, holding partition 0's lease for longer than any test.
fn fresh_fenced() -> monoseq_pg::FencedPgStore {
    let store = fresh();
    let leases = store.leases();
    leases
        .ensure_partitions(1)
        .unwrap_or_else(|e| panic!("{e}"));
    let epoch = leases
        .acquire(0, "conformance", std::time::Duration::from_secs(3600))
        .unwrap_or_else(|e| panic!("{e}"))
        .unwrap_or_else(|| panic!("a fresh lease was not free"));
    store.fenced(0, epoch, "conformance")
}

mod pg {
    monoseq_kv::conformance_tests!(super::fresh, 64);
}

mod fenced {
    monoseq_kv::conformance_tests!(super::fresh_fenced, 64);
}
