//! The sequence-storage conformance suite (`monoseq_core::conformance`) on `PLogSeqStorage`
//! over PostgreSQL: a fresh schema of this test binary's private cluster per test.

use monoseq_pg::PgOptions;
use monoseq_pg::testing::PgCluster;
use monoseq_store::conformance::PLogHarness;

fn postgres() -> PLogHarness<std::sync::Arc<monoseq_pg::PgStore>> {
    let cluster =
        PgCluster::shared().unwrap_or_else(|e| panic!("a private PostgreSQL cluster: {e}"));
    let store = cluster
        .fresh_store(PgOptions::default())
        .unwrap_or_else(|e| panic!("a fresh schema: {e}"));
    PLogHarness::on(std::sync::Arc::new(store), None)
}

mod on_postgres {
    monoseq_core::seq_storage_conformance_tests!(super::postgres);
}
