//! The sequence-storage conformance suite (`monoseq_core::conformance`) on `PLogSeqStorage`,
//! over the in-memory reference key-value store and over the embedded fjall store, and with
//! its PLog in segment files (key layout 4).

use std::sync::Arc;

use monoseq_kv::{Durability, FjallStore, MemoryStore, Options};
use monoseq_store::Segments;
use monoseq_store::conformance::PLogHarness;

fn memory() -> PLogHarness<Arc<MemoryStore>> {
    PLogHarness::on(Arc::new(MemoryStore::new()), None)
}

fn fjall() -> PLogHarness<Arc<FjallStore>> {
    let dir = tempfile::tempdir().expect("temporary directory");
    let options = Options::default()
        .durability(Durability::Manual)
        .cache_bytes(4 << 20);
    let kv = FjallStore::open(dir.path(), options).expect("open fjall store");
    PLogHarness::on(Arc::new(kv), Some(Box::new(dir)))
}

fn segments() -> PLogHarness<Arc<MemoryStore>> {
    let dir = tempfile::tempdir().expect("temporary directory");
    // The harness writes partition 3.
    let segments = Segments::open(dir.path(), 4, &|_| 1).expect("open the segment logs");
    PLogHarness::with_segments(
        Arc::new(MemoryStore::new()),
        Some(Arc::new(segments)),
        Some(Box::new(dir)),
    )
}

mod on_memory_store {
    monoseq_core::seq_storage_conformance_tests!(super::memory);
}

mod on_fjall_store {
    monoseq_core::seq_storage_conformance_tests!(super::fjall);
}

mod on_segment_files {
    monoseq_core::seq_storage_conformance_tests!(super::segments);
}
