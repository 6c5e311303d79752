//! `monoseq verify` as an operator runs it, on the real binary: a missing or foreign directory
//! is an error that creates nothing; a directory a server wrote verifies clean; a damaged one
//! (an engine file with flipped bytes, a deleted identity file) fails naming the damage; and
//! in every case no byte, file or modification time in the directory changes.

mod common;

use std::collections::BTreeMap;
use std::hash::Hasher;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, SystemTime};

use common::{Server, run};
use serde_json::json;

/// Every file under `dir` with its length, a hash of its bytes and its modification time.
fn files(dir: &Path) -> BTreeMap<PathBuf, (usize, u64, SystemTime)> {
    let mut all = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            let meta = std::fs::metadata(&path).unwrap();
            if meta.is_dir() {
                stack.push(path);
            } else {
                let bytes = std::fs::read(&path).unwrap();
                let mut h = std::hash::DefaultHasher::new();
                h.write(&bytes);
                all.insert(path, (bytes.len(), h.finish(), meta.modified().unwrap()));
            }
        }
    }
    all
}

fn verify(dir: &Path) -> Output {
    run(&["verify", "--data-dir", dir.to_str().unwrap()])
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A data directory a server wrote six commands into and then stopped, adopted the way a
/// server start does (identity file, marks, store ID in the engine), so every check applies.
async fn served_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let client = reqwest::Client::new();
    let server = Server::start_ready(dir.path(), &["--partitions", "2"], &client).await;
    for ws in 1..=6 {
        let body = json!({
            "ws": ws, "ws_kind": 1, "command": "app.CreateOrder",
            "create": [{"raw_id": 1, "kind": "CDoc", "name": "app.Order",
                        "fields": {"total": 10}}],
            "argument": {"raw_id": 2, "name": "app.Arg", "children": [{"raw_id": 3, "name": "app.Line"}]}
        });
        let r = client
            .post(format!("{}/v1/commands", server.url))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    let status = server.terminate(Duration::from_secs(15));
    assert!(status.success(), "{status:?}");
    assert!(dir.path().join("monoseq.identity").exists());
    assert!(dir.path().join("monoseq.marks").exists());
    dir
}

#[test]
fn verify_on_a_missing_directory_fails_and_creates_nothing() {
    let parent = tempfile::tempdir().unwrap();
    let missing = parent.path().join("mistyped");
    let out = verify(&missing);
    assert!(!out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("does not exist"), "{}", text(&out));
    assert!(!missing.exists());
    assert!(files(parent.path()).is_empty());
}

#[test]
fn verify_refuses_a_directory_without_identity_or_engine_files() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("notes.txt"), b"not a store").unwrap();
    let before = files(dir.path());
    let out = verify(dir.path());
    assert!(!out.status.success());
    assert!(
        text(&out).contains("not a monoseq data directory"),
        "{}",
        text(&out)
    );
    assert_eq!(files(dir.path()), before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_of_a_served_directory_is_ok_and_changes_no_byte() {
    let dir = served_dir().await;
    let before = files(dir.path());
    let out = verify(dir.path());
    assert!(out.status.success(), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("2 partitions, 6 events, 6 workspaces, 6 records"),
        "{stdout}"
    );
    assert!(stdout.contains("ok: no problems"), "{stdout}");
    assert_eq!(files(dir.path()), before, "verify changed the directory");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_names_a_deleted_identity_file_and_changes_no_byte() {
    let dir = served_dir().await;
    std::fs::remove_file(dir.path().join("monoseq.identity")).unwrap();
    let before = files(dir.path());
    let out = verify(dir.path());
    assert!(!out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("monoseq.identity is missing"),
        "{}",
        text(&out)
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("file-missing"),
        "{}",
        text(&out)
    );
    assert_eq!(files(dir.path()), before, "verify changed the directory");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_names_flipped_bytes_in_an_engine_file_and_changes_no_byte() {
    let dir = served_dir().await;
    // The engine's largest table file: the events, WLog entries and records.
    let (table, len) = files(dir.path())
        .into_iter()
        .filter(|(p, _)| p.components().any(|c| c.as_os_str() == "tables"))
        .map(|(p, (len, _, _))| (p, len))
        .max_by_key(|(_, len)| *len)
        .expect("a table file after a graceful stop");
    let mut bytes = std::fs::read(&table).unwrap();
    for b in &mut bytes[len / 3..len / 3 + 8] {
        *b ^= 0xff;
    }
    std::fs::write(&table, &bytes).unwrap();
    let before = files(dir.path());
    let out = verify(dir.path());
    assert!(!out.status.success(), "{}", text(&out));
    let said = text(&out).to_lowercase();
    assert!(
        said.contains("damaged") || said.contains("checksum"),
        "{}",
        text(&out)
    );
    assert_eq!(files(dir.path()), before, "verify changed the directory");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_after_a_crash_changes_no_byte() {
    // A killed server leaves its engine to recover at the next open, which writes: verify must
    // not be that open.
    let dir = tempfile::tempdir().unwrap();
    let client = reqwest::Client::new();
    let server = Server::start_ready(dir.path(), &["--partitions", "2"], &client).await;
    for ws in 1..=20 {
        let body = json!({"ws": ws, "ws_kind": 1, "command": "app.Ping"});
        let r = client
            .post(format!("{}/v1/commands", server.url))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    server.kill();
    let before = files(dir.path());
    let out = verify(dir.path());
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("20 events"),
        "{}",
        text(&out)
    );
    assert_eq!(files(dir.path()), before, "verify changed the directory");
}
