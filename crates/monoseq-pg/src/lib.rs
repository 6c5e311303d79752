//! monoseq-pg: the PostgreSQL backend of the ordered key-value contract
//! ([`monoseq_kv::KvStore`]), for deployments that outgrow one machine's disk: [`PgStore`] keeps
//! every partition in one table, writes each batch in one transaction of a few multi-row
//! statements, and reads scans page by page.
//!
//! Its SQL keeps to what the distributed engines that speak PostgreSQL's protocol also run
//! (`INSERT … ON CONFLICT`, conditional `UPDATE`/`DELETE`, `unnest` of arrays).
//!
//! Several nodes share one database through [`Leases`] (partition ownership with epochs, by
//! the database's clock) and write through [`FencedPgStore`], whose every write commits only
//! while its partition's lease keeps the writer's epoch. The feature `testing` adds
//! `testing::PgCluster`, a private server for tests, and `testing::PgPair`, a primary with a
//! synchronous standby for failover tests.

// Library code answers errors; an `expect` states why it cannot fail.
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

mod combine;
mod core;
mod error;
mod exec;
mod fence;
mod fenced;
mod lease;
mod options;
mod plan;
mod scan;
mod schema;
mod sql;
mod store;
mod swap_each;
#[cfg(feature = "testing")]
pub mod testing;
mod write;

pub use combine::{COMBINE_BYTES_MAX, COMBINE_WRITES_MAX, Combining};
pub use fenced::FencedPgStore;
pub use lease::{
    ClusterStatus, LEASE_DURATION_MAX, LEASE_PARTITIONS_MAX, LeaseStatus, Leases, NodeStatus,
};
pub use options::{
    COMBINE_WAIT_DEFAULT, CONNECT_TIMEOUT_DEFAULT, IDLE_IN_TRANSACTION_TIMEOUT, KEEPALIVE_IDLE,
    POOL_CONNECTIONS_DEFAULT, POOL_CONNECTIONS_MAX, PgOptions, SCHEMA_DEFAULT,
    STATEMENT_TIMEOUT_DEFAULT, TIMEOUT_MAX, WRITE_TRANSACTIONS_DEFAULT,
};
pub use store::PgStore;
