//! Consumer positions on PostgreSQL at the store level: the compare-and-set rules, and exactly
//! one winner among writers expecting the same position, each on its own connection of the
//! pool (a fresh schema of this test binary's private cluster per test).

use std::sync::Arc;

use monoseq_pg::testing::PgCluster;
use monoseq_pg::{PgOptions, PgStore};
use monoseq_store::conformance::{positions_compare_and_set, positions_one_writer_wins};
use monoseq_store::{AppId, EventStore, TrustLevel};

fn postgres() -> EventStore<Arc<PgStore>> {
    let cluster =
        PgCluster::shared().unwrap_or_else(|e| panic!("a private PostgreSQL cluster: {e}"));
    let store = cluster
        .fresh_store(PgOptions::default())
        .unwrap_or_else(|e| panic!("a fresh schema: {e}"));
    EventStore::new(Arc::new(store), AppId(1), TrustLevel::Level0)
}

#[test]
fn positions_compare_and_set_on_postgresql() {
    positions_compare_and_set(&postgres());
}

#[test]
fn of_writers_expecting_one_position_exactly_one_wins_on_postgresql() {
    positions_one_writer_wins(&postgres(), 8, 100);
}
