//! The Python example (`examples/python/monoseq_example.py`, standard library only) against a
//! live server: commands with keys and retries, read back, a named number; and the projector
//! (`examples/python/projector.py`): a partition followed with its consumer position, through
//! a server killed and restarted under it; and the projector fleet (`examples/python/fleet.py`):
//! three members of one consumer group, one SIGKILLed, nothing skipped.

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

/// Runs the projector example once; its standard output.
fn project(url: &str, state: &std::path::Path, extra: &[&str]) -> String {
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/python/projector.py");
    let out = Command::new("python3")
        .arg(&script)
        .args(["--url", url, "--partition", "0", "--consumer", "view"])
        .arg("--state")
        .arg(state)
        .args(extra)
        .output()
        .expect("python3 runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "the projector failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_projector_follows_a_partition_and_resumes_after_its_stored_position() {
    let dir = tempfile::tempdir().unwrap();
    let client = reqwest::Client::new();
    let server = Server::start_ready(dir.path(), &["--partitions", "4"], &client).await;
    let post = |ws: u64| {
        let (client, url) = (client.clone(), server.url.clone());
        async move {
            let r = client
                .post(format!("{url}/v1/commands"))
                .json(
                    &serde_json::json!({"ws": ws, "ws_kind": 1, "command": "app.Note",
                    "create": [{"raw_id": 1, "kind": "CDoc", "name": "app.Doc"}]}),
                )
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
        }
    };
    for i in 0..30 {
        post(4 * (i % 3 + 1)).await; // workspaces 4, 8, 12: partition 0
    }
    let state = dir.path().join("view.json");
    let first = project(&server.url, &state, &["--max-events", "10"]);
    assert!(
        first.contains("resuming partition 0 at offset 1"),
        "{first}"
    );
    assert!(first.contains("applied 10 events; position 10"), "{first}");
    // A restart resumes after the stored position: nothing applied twice, nothing skipped.
    let second = project(&server.url, &state, &["--idle-exit-s", "2"]);
    assert!(
        second.contains("resuming partition 0 at offset 11"),
        "{second}"
    );
    assert!(
        second.contains("applied 20 events; position 30; 30 events in the projection"),
        "{second}"
    );
    let view: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&state).unwrap()).unwrap();
    for ws in ["4", "8", "12"] {
        assert_eq!(view["workspaces"][ws]["events"], 10, "{view}");
        assert_eq!(view["workspaces"][ws]["created"], 10, "{view}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_projector_waits_out_a_server_killed_and_restarted_and_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let port = common::free_port();
    let url = format!("http://127.0.0.1:{port}");
    let data = dir.path().join("data");
    let server = common::FixedServer::start(&data, port, &[]);
    let client = reqwest::Client::new();
    let post = |n: u64| {
        let (client, url) = (client.clone(), url.clone());
        async move {
            let r = client
                .post(format!("{url}/v1/commands"))
                .json(&serde_json::json!({"ws": 4 * (n % 3 + 1), "ws_kind": 1,
                    "command": "app.Note", "create": [{"raw_id": 1, "kind": "CDoc", "name": "app.Doc"}]}))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
        }
    };
    common::wait_ready(&url, &client).await;
    for n in 0..10 {
        post(n).await;
    }
    let (u, state) = (url.clone(), dir.path().join("view.json"));
    let projector =
        tokio::task::spawn_blocking(move || project(&u, &state, &["--idle-exit-s", "6"]));
    let position = format!("{url}/v1/consumers/view/partitions/0");
    let mut stored = serde_json::Value::Null;
    for _ in 0..200 {
        stored = client
            .get(&position)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if stored["offset"] == 10 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(stored["offset"], 10, "{stored}");
    drop(server); // SIGKILL
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    let _server = common::FixedServer::start(&data, port, &[]);
    common::wait_ready(&url, &client).await;
    for n in 10..20 {
        post(n).await;
    }
    let out = projector.await.unwrap();
    assert!(out.contains("asking again"), "{out}");
    assert!(out.contains("the server answers again"), "{out}");
    assert!(
        out.contains("applied 20 events; position 20; 20 events in the projection"),
        "{out}"
    );
}

/// Every (partition, offset) a fleet member's log says it processed.
fn processed(logs: &[std::path::PathBuf]) -> std::collections::BTreeSet<(u64, u64)> {
    let mut done = std::collections::BTreeSet::new();
    for log in logs {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        for line in text.lines() {
            let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
                continue; // the last line of a SIGKILLed member may be cut
            };
            done.insert((
                v["partition"].as_u64().unwrap(),
                v["offset"].as_u64().unwrap(),
            ));
        }
    }
    done
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_python_fleet_of_three_loses_a_member_to_sigkill_and_skips_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let client = reqwest::Client::new();
    let server = Server::start_ready(dir.path(), &["--partitions", "4"], &client).await;
    let written = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let (c, u, w) = (client.clone(), server.url.clone(), written.clone());
    let post = move |ws: u64| {
        let (client, url, written) = (c.clone(), u.clone(), w.clone());
        async move {
            let r = client
                .post(format!("{url}/v1/commands"))
                .json(&serde_json::json!({"ws": ws, "ws_kind": 1, "command": "app.Note"}))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
            let a: serde_json::Value = r.json().await.unwrap();
            let at = (
                a["partition"].as_u64().unwrap(),
                a["plog_offset"].as_u64().unwrap(),
            );
            written.lock().unwrap().push(at);
        }
    };
    for ws in 1..=40 {
        post(ws).await;
    }
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/python/fleet.py");
    let logs: Vec<_> = ["a", "b", "c"]
        .iter()
        .map(|m| dir.path().join(format!("{m}.jsonl")))
        .collect();
    let mut members: Vec<std::process::Child> = ["a", "b", "c"]
        .iter()
        .zip(&logs)
        .map(|(m, log)| {
            Command::new("python3")
                .arg(&script)
                .args(["--url", &server.url, "--group", "fleet", "--member", m])
                .args(["--session-timeout-ms", "1500", "--idle-exit-s", "15"])
                .arg("--log")
                .arg(log)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("python3 runs")
        })
        .collect();
    let bound = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let covered = |want: &[(u64, u64)]| {
        let done = processed(&logs);
        want.iter().all(|w| done.contains(w))
    };
    // Every member holds a partition (4 over 3) once the group settled.
    let mut spread = false;
    while std::time::Instant::now() < bound {
        let group: serde_json::Value = client
            .get(format!("{}/v1/groups/fleet", server.url))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let members = group["members"].as_array().cloned().unwrap_or_default();
        spread = members.len() == 3
            && members
                .iter()
                .all(|m| !m["partitions"].as_array().unwrap().is_empty());
        if spread && covered(&written.lock().unwrap().clone()) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(spread, "three members share the four partitions");
    assert!(
        covered(&written.lock().unwrap().clone()),
        "the first events"
    );
    // SIGKILL a while events are written: its partitions go to b and c, delivered from the
    // group's commits on.
    let writer = {
        let post = post.clone();
        tokio::spawn(async move {
            for ws in 41..=80 {
                post(ws).await;
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
        })
    };
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    members[0].kill().unwrap();
    members[0].wait().unwrap();
    writer.await.unwrap();
    let all = written.lock().unwrap().clone();
    while !covered(&all) && std::time::Instant::now() < bound {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let done = processed(&logs);
    let missed: Vec<_> = all.iter().filter(|w| !done.contains(w)).collect();
    assert!(missed.is_empty(), "processed by no member: {missed:?}");
    let survivors = processed(&logs[1..]);
    // The last 10 were written at least 150 ms after the SIGKILL (5 ms between writes).
    let late: Vec<_> = all[70..]
        .iter()
        .filter(|w| !survivors.contains(w))
        .collect();
    assert!(
        late.is_empty(),
        "written after the SIGKILL, not processed by b or c: {late:?}"
    );
    // b and c leave once idle.
    for m in members.drain(1..) {
        let out = bounded_output(m, bound + std::time::Duration::from_secs(20));
        assert!(out.contains("processed"), "{out}");
    }
}

/// The output of a process that exits by itself before `deadline` (killed if not).
fn bounded_output(mut child: std::process::Child, deadline: std::time::Instant) -> String {
    while child.try_wait().unwrap().is_none() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let _ = child.kill();
    let out = child.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "a fleet member failed:\n{text}");
    text
}
