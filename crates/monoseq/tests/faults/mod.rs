//! Support of the fault tests (`tests/netfault.rs`, `tests/patroni.rs`,
//! `tests/follow_faults.rs`), beside the nodes, keyed load and closing checks of
//! `tests/common`: network namespaces and their nftables faults (`netns.rs`), a PostgreSQL
//! pair managed by Patroni and etcd (`patroni.rs`), and followers and consumers
//! (`readers.rs`).

#![allow(dead_code)]

pub mod netns;
pub mod patroni;
pub mod readers;

use std::path::{Path, PathBuf};

use crate::common::node::{Node, Start};

/// Lease of every node of the fault tests, and its renewal interval.
pub const LEASE_MS: u64 = 2_000;
pub const RENEW_MS: u64 = 400;

/// Node `id` of a fault test: [`Node::on`] with the fault tests' lease.
pub fn node(db: &str, id: &str, dir: &Path) -> Start {
    Node::on(db, id, dir).lease(LEASE_MS, RENEW_MS)
}

/// The directory of PostgreSQL's server binaries: `MONOSEQ_PG_BINDIR`, else the newest
/// `/usr/lib/postgresql/<version>/bin` that holds `initdb` (Debian's layout).
pub fn pg_bindir() -> PathBuf {
    if let Some(dir) = std::env::var_os(monoseq_pg::testing::BINDIR_ENV) {
        return PathBuf::from(dir);
    }
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let version = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").is_file().then_some((version, bin))
        })
        .collect();
    found.sort();
    found.pop().map(|(_, bin)| bin).unwrap_or_else(|| {
        panic!(
            "PostgreSQL's server binaries are not installed (no /usr/lib/postgresql/*/bin/initdb, \
             no {}): `apt-get install postgresql` (scripts/test does)",
            monoseq_pg::testing::BINDIR_ENV
        )
    })
}
