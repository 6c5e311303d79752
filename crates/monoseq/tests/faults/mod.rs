//! Support of the fault tests (`tests/netfault.rs`, `tests/patroni.rs`): nodes started in
//! network namespaces or on loopback (`node.rs`), the namespaces and their nftables faults
//! (`netns.rs`), a PostgreSQL pair managed by Patroni and etcd (`patroni.rs`), the keyed
//! load with its closing checks (`keyed.rs`), and followers and consumers (`readers.rs`).

#![allow(dead_code)]

pub mod keyed;
pub mod netns;
pub mod node;
pub mod patroni;
pub mod readers;

use std::path::PathBuf;

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
