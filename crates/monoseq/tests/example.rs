//! The Python example (`examples/python/monoseq_example.py`, standard library only) against a
//! live server: commands with keys and retries, read back, a named number.

mod common;

use std::process::Command;

use common::Server;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_example_runs_against_a_live_server() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_ready(dir.path(), &[], &reqwest::Client::new()).await;
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples/python/monoseq_example.py");
    let out = Command::new("python3")
        .arg(&script)
        .args(["--url", &server.url])
        .output()
        .expect("python3 runs (it is on every CI machine: scripts/test uses it for pip)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the example failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.trim_end().ends_with("ok"), "{stdout}");
    assert!(stdout.contains("invoice number 1000"), "{stdout}");
}
