//! Runs the key-value conformance suite (the definition of a backend) against `PgStore` on a
//! real PostgreSQL server: one private cluster for this test binary, a fresh schema per store.

use monoseq_pg::PgOptions;
use monoseq_pg::testing::PgCluster;

fn fresh() -> monoseq_pg::PgStore {
    let cluster = PgCluster::shared().unwrap_or_else(|e| panic!("{e}"));
    cluster
        .fresh_store(PgOptions::default().pool_connections(4))
        .unwrap_or_else(|e| panic!("{e}"))
}

mod pg {
    monoseq_kv::conformance_tests!(super::fresh, 64);
}
