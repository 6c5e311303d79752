//! Named sequences on the S3 backend against a real S3-compatible server (moto started on a
//! free port, or `MONOSEQ_S3_ENDPOINT`): the behaviour suite, one bucket per test. moto
//! honours `If-None-Match` / `If-Match` with 412 but does not make the check and the write
//! one atomic step, so these tests never race two writers on one key at the same instant
//! (calls of one `Sequences` on one sequence are serialised by its lane); the concurrency
//! tests run on the key-value backends.

#[macro_use]
mod support {
    pub mod moto;
    pub mod suite;
}

use std::sync::Arc;

use monoseq_named::{NextOptions, Sequences};
use support::suite::Shared;

fn s3() -> Shared {
    Arc::new(support::moto::backend("suite"))
}

backend_suite!(on_s3, s3());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_clients_of_one_bucket_share_a_sequence() {
    let backend = Arc::new(support::moto::backend("shared"));
    let a = Sequences::new(Arc::clone(&backend));
    let b = Sequences::new(backend);
    let address = "orders/invoice".parse().unwrap();
    let mut handed = Vec::new();
    for i in 0..20 {
        let s = if i % 2 == 0 { &a } else { &b };
        handed.push(s.next(&address, &NextOptions::new()).await.unwrap());
    }
    assert_eq!(handed, (1..=20).collect::<Vec<u64>>());
}
