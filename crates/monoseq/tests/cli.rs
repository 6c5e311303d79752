//! The command line as a user meets it: output into a closed pipe, a mistyped data directory,
//! `monoseq seq` on clap (options anywhere, help, clashes, the backend it picks, a data
//! directory held by a server).

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

/// `monoseq seq <args>` to completion: (success, stdout, stderr), trimmed.
fn seq(args: &[&str]) -> (bool, String, String) {
    let mut all = vec!["seq"];
    all.extend_from_slice(args);
    let out = run(&all);
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).trim().to_owned(),
        String::from_utf8_lossy(&out.stderr).trim().to_owned(),
    )
}

#[test]
fn seq_takes_its_options_after_the_operation_too() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let data = data.to_str().unwrap();
    let (ok, out, err) = seq(&[
        "next",
        "orders/invoice",
        "--data-dir",
        data,
        "--initial",
        "7",
    ]);
    assert!(ok, "{err}");
    assert_eq!(out, "7");
    let (ok, out, err) = seq(&["--data-dir", data, "get", "orders/invoice"]);
    assert!(ok, "{err}");
    assert_eq!(out, "8");
}

#[test]
fn seq_refuses_repeated_and_conflicting_backends() {
    // Directories inside a temporary one: a command wrongly accepted creates nothing elsewhere.
    let dir = tempfile::tempdir().unwrap();
    let (d, e) = (dir.path().join("d"), dir.path().join("e"));
    let (d, e) = (d.to_str().unwrap(), e.to_str().unwrap());
    let cases: [&[&str]; 4] = [
        &[
            "next",
            "x",
            "--url",
            "http://127.0.0.1:1",
            "--url",
            "http://127.0.0.1:2",
        ],
        &["next", "x", "--s3-bucket", "b", "--data-dir", d],
        &[
            "next",
            "x",
            "--url",
            "http://127.0.0.1:1",
            "--storage",
            "postgres://h/db",
        ],
        &["--data-dir", d, "next", "x", "--data-dir", e],
    ];
    for args in cases {
        let (ok, _, err) = seq(args);
        assert!(!ok, "{args:?} was accepted");
        assert!(
            err.contains("cannot be used"),
            "{args:?} did not name the clash: {err}"
        );
    }
}

#[test]
fn seq_help_and_operation_help_succeed() {
    let (ok, out, err) = seq(&["help"]);
    assert!(ok, "{err}");
    assert!(out.contains("reserve") && out.contains("--url"), "{out}");
    let (ok, out, err) = seq(&["next", "--help"]);
    assert!(ok, "{err}");
    assert!(out.contains("--increment"), "{out}");
    let (ok, out, err) = seq(&["help", "reset"]);
    assert!(ok, "{err}");
    assert!(out.contains("<VALUE>"), "{out}");
}

#[test]
fn seq_without_a_backend_says_which_one_it_uses() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(BIN)
        .args(["seq", "next", "orders/invoice"])
        .current_dir(dir.path())
        .env_remove("MONOSEQ_URL")
        .env_remove("MONOSEQ_STORAGE")
        .env_remove("MONOSEQ_DATA_DIR")
        .env_remove("MONOSEQ_S3_BUCKET")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("using the data directory ./data"),
        "{stderr}"
    );
    assert!(dir.path().join("data").exists());
}

#[test]
fn seq_reserve_takes_a_block_and_prints_its_ends() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let data = data.to_str().unwrap();
    let (ok, out, err) = seq(&["reserve", "orders/id", "100", "--data-dir", data]);
    assert!(ok, "{err}");
    assert_eq!(out, "1 100");
    let (ok, out, err) = seq(&["next", "orders/id", "--data-dir", data]);
    assert!(ok, "{err}");
    assert_eq!(out, "101");
}

#[test]
fn seq_refuses_a_negative_value_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let (ok, _, err) = seq(&["reset", "x", "-5", "--data-dir", data.to_str().unwrap()]);
    assert!(!ok);
    assert!(err.contains("-5 is negative"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seq_on_a_data_directory_a_server_holds_waits_then_says_to_use_url() {
    let dir = tempfile::tempdir().unwrap();
    let client = reqwest::Client::new();
    let server = common::Server::start_ready(dir.path(), &["--partitions", "1"], &client).await;
    let data = dir.path().to_str().unwrap().to_owned();
    let began = std::time::Instant::now();
    let (ok, _, err) = seq(&["next", "x", "--data-dir", &data, "--timeout-ms", "300"]);
    assert!(!ok);
    assert!(began.elapsed() >= std::time::Duration::from_millis(300));
    assert!(
        err.contains("in use by another process") && err.contains("--url"),
        "{err}"
    );
    // Through the server it works, and an error names its code once.
    let url = server.url.clone();
    let (ok, out, err) = seq(&["next", "x", "--url", &url]);
    assert!(ok, "{err}");
    assert_eq!(out, "1");
    let (ok, _, err) = seq(&["get", "missing", "--url", &url]);
    assert!(!ok);
    assert_eq!(err.matches("not_found").count(), 1, "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seq_gets_a_data_directory_released_while_it_waits() {
    let dir = tempfile::tempdir().unwrap();
    let client = reqwest::Client::new();
    let server = common::Server::start_ready(dir.path(), &["--partitions", "1"], &client).await;
    let data = dir.path().to_owned();
    let waiting = std::thread::spawn(move || {
        Command::new(BIN)
            .args(["seq", "next", "x", "--timeout-ms", "20000", "--data-dir"])
            .arg(data)
            .output()
    });
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(
        server
            .terminate(std::time::Duration::from_secs(20))
            .success()
    );
    let out = waiting.join().unwrap().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "1");
}

/// fjall reports through the `log` crate (a crashed flush or compaction worker among others);
/// those records reach the same log as ours, under the same filter.
#[test]
fn the_storage_engines_own_log_records_reach_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let out = Command::new(BIN)
        .args(["seq", "next", "orders/invoice", "--data-dir"])
        .arg(&data)
        .env("RUST_LOG", "fjall=debug")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr
            .lines()
            .any(|l| l.contains("fjall") && l.contains("worker pool")),
        "no fjall record in the log:\n{stderr}"
    );
}
