//! Runs the conformance suite against every backend of this crate: the in-memory reference,
//! and each embedded engine with manual flushing (the fast path) and with a flush per write.

use monoseq_kv::conformance::WithGuard;
use monoseq_kv::{Durability, Options};

fn options(durability: Durability) -> Options {
    Options::default()
        .durability(durability)
        .cache_bytes(4 << 20)
}

mod memory {
    monoseq_kv::conformance_tests!(monoseq_kv::MemoryStore::new);
}

#[cfg(feature = "fjall")]
mod fjall_manual {
    use super::*;
    monoseq_kv::conformance_tests!(
        || {
            let dir = tempfile::tempdir().expect("temporary directory");
            let store = monoseq_kv::FjallStore::open(dir.path(), options(Durability::Manual))
                .expect("open fjall store");
            WithGuard::new(store, dir)
        },
        32
    );
}

#[cfg(feature = "fjall")]
mod fjall_sync {
    use super::*;
    monoseq_kv::conformance_tests!(
        || {
            let dir = tempfile::tempdir().expect("temporary directory");
            let store = monoseq_kv::FjallStore::open(dir.path(), options(Durability::Sync))
                .expect("open fjall store");
            WithGuard::new(store, dir)
        },
        4
    );
}

#[cfg(feature = "redb")]
mod redb_manual {
    use super::*;
    monoseq_kv::conformance_tests!(
        || {
            let dir = tempfile::tempdir().expect("temporary directory");
            let store = monoseq_kv::RedbStore::open(dir.path(), options(Durability::Manual))
                .expect("open redb store");
            WithGuard::new(store, dir)
        },
        32
    );
}

#[cfg(feature = "redb")]
mod redb_sync {
    use super::*;
    monoseq_kv::conformance_tests!(
        || {
            let dir = tempfile::tempdir().expect("temporary directory");
            let store = monoseq_kv::RedbStore::open(dir.path(), options(Durability::Sync))
                .expect("open redb store");
            WithGuard::new(store, dir)
        },
        4
    );
}
