//! Named sequences on PostgreSQL: the same behaviour suite as the other key-value backends,
//! on a fresh schema of a private PostgreSQL cluster this test binary starts.

// The behaviour suite is `monoseq-named`'s own (its `tests/support/suite.rs`), run here
// because this crate sits above both `monoseq-named` and `monoseq-pg`.
#[macro_use]
#[path = "../../monoseq-named/tests/support"]
mod support {
    pub mod suite;
}

use std::sync::Arc;

use monoseq_named::KvBackend;
use monoseq_pg::PgOptions;
use monoseq_pg::testing::PgCluster;
use support::suite::Shared;

fn postgres() -> Shared {
    let cluster =
        PgCluster::shared().unwrap_or_else(|e| panic!("a private PostgreSQL cluster: {e}"));
    let store = cluster
        .fresh_store(PgOptions::default())
        .unwrap_or_else(|e| panic!("a fresh schema: {e}"));
    Arc::new(KvBackend::new(store))
}

backend_suite!(on_postgres, postgres());
