//! A `FaultyStore` that fails nothing is a backend: it passes the conformance suite.

mod faulty_memory {
    monoseq_kv::conformance_tests!(|| monoseq_kv::FaultyStore::new(monoseq_kv::MemoryStore::new()));
}
