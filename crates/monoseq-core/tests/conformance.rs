//! The sequence-storage conformance suite on the in-memory reference storage.

mod mem {
    monoseq_core::seq_storage_conformance_tests!(monoseq_core::conformance::MemHarness::new);
}
