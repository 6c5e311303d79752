//! The command line as a user meets it: output into a closed pipe, a mistyped data directory.

mod common;

use std::process::{Command, Stdio};

use common::{BIN, run};

#[test]
fn inspect_into_a_closed_pipe_ends_quietly() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let bench = run(&[
        "bench",
        "--bench-dir",
        data.to_str().unwrap(),
        "--seconds",
        "1",
        "--clients",
        "2",
    ]);
    assert!(
        bench.status.success(),
        "{}",
        String::from_utf8_lossy(&bench.stderr)
    );
    let mut child = Command::new(BIN)
        .args(["inspect", "--data-dir", data.to_str().unwrap(), "--full"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The reader goes away before anything is written (`monoseq inspect | head -0`).
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn inspect_of_a_mistyped_directory_fails_and_creates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("mistyped");
    let out = run(&["inspect", "--data-dir", missing.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("does not exist"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!missing.exists());
}

#[test]
fn seq_help_prints_the_usage_and_succeeds() {
    let out = run(&["seq", "help"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("usage: monoseq seq"), "{text}");
}

#[test]
fn a_failed_start_leaves_no_new_data_directory_behind() {
    let dir = tempfile::tempdir().unwrap();
    let fresh = dir.path().join("fresh");
    let out = run(&[
        "serve",
        "--data-dir",
        fresh.to_str().unwrap(),
        "--listen",
        "127.0.0.1:0",
        "--partitions",
        "0",
    ]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("partitions"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!fresh.exists(), "a refused start left {fresh:?} behind");
    // A busy port refuses the start before the storage is touched.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = taken.local_addr().unwrap().to_string();
    let out = run(&[
        "serve",
        "--data-dir",
        fresh.to_str().unwrap(),
        "--listen",
        &address,
    ]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("listening on"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!fresh.exists());
}
