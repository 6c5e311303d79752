//! The one error rule, seen from outside: when `monoseq serve` refuses to start, the printed
//! error names each cause once (a layer's message says what it was doing, its source what
//! failed), and it still says what to do.

use std::path::Path;
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_monoseq");
/// Causes shorter than this (an errno, a word) may honestly appear twice.
const SEGMENT_CHARS_MIN: usize = 12;

/// Runs `monoseq serve` with `args`, expects a refused start, and answers the error it printed.
fn refused(args: &[&str]) -> String {
    let out = Command::new(BIN)
        .arg("serve")
        .args(args)
        .env("NO_COLOR", "1")
        .env("RUST_LOG", "info")
        .output()
        .expect("run monoseq serve");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "the start was not refused: {stderr}");
    let (_, error) = stderr
        .split_once("refusing to start: ")
        .unwrap_or_else(|| panic!("no refusal printed: {stderr}"));
    error.lines().next().unwrap_or_default().to_owned()
}

/// Fails when a part of the chain (split at `": "`) appears more than once in it.
fn assert_each_cause_once(error: &str) {
    for segment in error.split(": ") {
        let segment = segment.trim();
        if segment.len() < SEGMENT_CHARS_MIN {
            continue;
        }
        assert_eq!(
            error.matches(segment).count(),
            1,
            "{segment:?} is printed more than once in: {error}"
        );
    }
}

fn data_dir(dir: &Path) -> String {
    dir.to_str().expect("a UTF-8 temporary path").to_owned()
}

#[test]
fn an_unreadable_identity_file_is_named_once_with_its_cause() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("monoseq.identity")).unwrap();
    let error = refused(&[
        "--data-dir",
        &data_dir(dir.path()),
        "--listen",
        "127.0.0.1:0",
    ]);
    assert_each_cause_once(&error);
    assert!(error.contains("monoseq.identity"), "{error}");
    assert!(
        error.contains("Is a directory"),
        "the cause is kept: {error}"
    );
}

#[test]
fn a_damaged_identity_file_says_how_to_recover() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("monoseq.identity"), "not json").unwrap();
    let error = refused(&[
        "--data-dir",
        &data_dir(dir.path()),
        "--listen",
        "127.0.0.1:0",
    ]);
    assert_each_cause_once(&error);
    assert!(error.contains("--accept-loss"), "says what to do: {error}");
}

#[test]
fn a_busy_port_is_named_once_with_its_cause() {
    let dir = tempfile::tempdir().unwrap();
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = busy.local_addr().unwrap().to_string();
    let error = refused(&["--data-dir", &data_dir(dir.path()), "--listen", &address]);
    assert_each_cause_once(&error);
    assert!(error.contains(&address), "{error}");
}

#[test]
fn a_missing_settings_file_is_named_once_with_its_cause() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("absent.toml");
    let error = refused(&[
        "--config",
        config.to_str().unwrap(),
        "--data-dir",
        &data_dir(&dir.path().join("data")),
        "--listen",
        "127.0.0.1:0",
    ]);
    assert_each_cause_once(&error);
    assert!(error.contains("absent.toml"), "{error}");
}

#[test]
fn a_data_dir_that_is_a_file_is_named_once_with_its_cause() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("file");
    std::fs::write(&file, "x").unwrap();
    let error = refused(&["--data-dir", &data_dir(&file), "--listen", "127.0.0.1:0"]);
    assert_each_cause_once(&error);
}

#[test]
fn another_partition_count_says_which_one_to_give() {
    let dir = tempfile::tempdir().unwrap();
    let path = data_dir(dir.path());
    let mut first = Command::new(BIN)
        .args(["serve", "--data-dir", &path, "--listen", "127.0.0.1:0"])
        .args(["--partitions", "3"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn monoseq serve");
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(first.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    assert!(line.starts_with("monoseq listening on"), "{line}");
    // SIGTERM: a graceful stop.
    let _ = Command::new("kill").arg(first.id().to_string()).status();
    first.wait().unwrap();
    let error = refused(&[
        "--data-dir",
        &path,
        "--listen",
        "127.0.0.1:0",
        "--partitions",
        "5",
    ]);
    assert_each_cause_once(&error);
    assert!(error.contains('3'), "names the recorded count: {error}");
}
