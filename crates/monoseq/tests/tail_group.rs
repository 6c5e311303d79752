//! `monoseq tail --group G --member M` against the real binary: it prints every event of the
//! partitions the group gives it, tagged with its partition, commits what it printed (so a
//! second member resumes after it, and `tail --consumer G` reads the same positions), and
//! joins again by itself after its server was killed and restarted.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use common::{BIN, FixedServer, Server, free_port};
use serde_json::{Value, json};

/// Writes `n` commands spread over the partitions; their (partition, offset).
async fn write(client: &reqwest::Client, url: &str, first: u64, n: u64) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    for ws in first..first + n {
        let r = client
            .post(format!("{url}/v1/commands"))
            .json(&json!({"ws": ws, "ws_kind": 1, "command": "app.Note"}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let a: Value = r.json().await.unwrap();
        out.push((
            a["partition"].as_u64().unwrap(),
            a["plog_offset"].as_u64().unwrap(),
        ));
    }
    out
}

/// Runs `monoseq tail` with `args` to its end; its lines as JSON.
fn tail(args: &[&str]) -> Vec<Value> {
    let out = Command::new(BIN).arg("tail").args(args).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// A tagged line's (partition, offset).
fn at(line: &Value) -> (u64, u64) {
    (
        line["partition"].as_u64().unwrap(),
        line["event"]["plog_offset"].as_u64().unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_tail_prints_its_partitions_commits_and_agrees_with_a_consumer_tail() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &["--partitions", "4"]);
    let client = reqwest::Client::new();
    let url = server.url.clone();
    let first = write(&client, &url, 1, 12).await;
    let base = ["--url", url.as_str(), "--group", "g"];
    let lines = tail(&[&base[..], &["--member", "t1", "--max-events", "12"]].concat());
    let printed: BTreeSet<(u64, u64)> = lines.iter().map(at).collect();
    assert_eq!(printed, first.iter().copied().collect(), "every event once");
    // What it printed is committed as the group's positions, per partition.
    let mut last: BTreeMap<u64, u64> = BTreeMap::new();
    for (p, o) in &first {
        let e = last.entry(*p).or_default();
        *e = (*e).max(*o);
    }
    for (p, o) in &last {
        let pos: Value = client
            .get(format!("{url}/v1/consumers/g/partitions/{p}"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(pos["offset"].as_u64(), Some(*o), "partition {p}: {pos}");
    }
    // Another member resumes after those commits: only what was written since.
    let second = write(&client, &url, 13, 4).await;
    let lines = tail(&[&base[..], &["--member", "t2", "--max-events", "4"]].concat());
    let printed: BTreeSet<(u64, u64)> = lines.iter().map(at).collect();
    assert_eq!(printed, second.iter().copied().collect());
    // `tail --consumer g` starts after the group's position on its partition.
    let (p, o) = write(&client, &url, 17, 1).await[0];
    let p_arg = p.to_string();
    let lines = tail(&[
        "--url",
        &url,
        "--partition",
        &p_arg,
        "--consumer",
        "g",
        "--max-events",
        "1",
    ]);
    assert_eq!(lines[0]["plog_offset"].as_u64(), Some(o), "{lines:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_tail_joins_again_after_its_server_is_killed_and_restarted() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let mut server = FixedServer::start(dir.path(), port, &[]);
    let client = reqwest::Client::new();
    common::wait_ready(&url, &client).await;
    let before = write(&client, &url, 1, 8).await;
    let mut child = Command::new(BIN)
        .args(["tail", "--url", &url, "--group", "g", "--member", "m"])
        .args(["--session-timeout-ms", "2000", "--retry-timeout-secs", "0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel::<(u64, u64)>();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { return };
            let v: Value = serde_json::from_str(&line).unwrap();
            if tx.send(at(&v)).is_err() {
                return;
            }
        }
    });
    let mut seen = BTreeSet::new();
    let take = |seen: &mut BTreeSet<(u64, u64)>, want: &[(u64, u64)]| {
        while !want.iter().all(|w| seen.contains(w)) {
            let got = rx
                .recv_timeout(Duration::from_secs(30))
                .unwrap_or_else(|_| panic!("the tail printed only {seen:?} of {want:?}"));
            seen.insert(got);
        }
    };
    take(&mut seen, &before);
    tokio::time::sleep(Duration::from_millis(1_500)).await; // its commits, within a second
    server.kill();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let _server = FixedServer::start(dir.path(), port, &[]);
    common::wait_ready(&url, &client).await;
    let after = write(&client, &url, 9, 8).await;
    take(&mut seen, &after);
    let _ = child.kill();
    let _ = child.wait();
}
