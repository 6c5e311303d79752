//! schemathesis (PyPI; `scripts/test` installs it) against a live server on the embedded
//! engine, driven by `docs/openapi.json` and the repository's `schemathesis.toml` (what a plain
//! `st run` from the root finds): every operation, with examples, the coverage and fuzzing
//! phases and the document's links (a command's event and WLog, a sequence's value, data and
//! deletion) for stateful runs, with every check; all but the backup, which writes where it is
//! told. No answer may be a server error, break the document (status, content type, headers,
//! body), refuse a request the document says is valid or accept one it says is invalid;
//! nothing may be stored for a rejected command. The same run against a deliberately wrong
//! document must fail.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::Server;
use serde_json::Value;

/// The checks every run makes (`st run --checks`): all of them; what the configuration sets
/// aside is an artifact of the run, named there with its reason.
const CHECKS: &str = "all";
/// Examples per operation and phase: enough to reach every status the document lists in a
/// few seconds.
const MAX_EXAMPLES: &str = "25";
/// A fixed seed: CI runs the same cases every time (a failure replays exactly).
const SEED: &str = "20";

/// The `st` command of schemathesis, from the PATH `scripts/test` sets.
fn st() -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(std::env::var_os("HOME").map(|h| Path::new(&h).join(".local/bin")))
        .map(|dir| dir.join("st"))
        .find(|st| st.is_file())
        .expect("schemathesis's `st` is not on PATH: run the tests with scripts/test, which installs it")
}

/// Runs schemathesis with `document` against `url`; its exit status and output.
fn run(document: &Path, url: &str, only: Option<&str>) -> (bool, String) {
    let config = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../schemathesis.toml");
    let mut command = Command::new(st());
    command
        .arg("--config-file")
        .arg(config)
        .arg("run")
        .arg(document)
        .args([
            "--url",
            url,
            "--checks",
            CHECKS,
            "--max-examples",
            MAX_EXAMPLES,
        ])
        .args(["--workers", "1", "--seed", SEED])
        .env("NO_COLOR", "1");
    if let Some(operation) = only {
        command.args(["--include-operation-id", operation]);
    }
    // schemathesis keeps its cache (.schemathesis/) in its working directory.
    let scratch = tempfile::tempdir().expect("a working directory for schemathesis");
    command.current_dir(scratch.path());
    let out = command.output().expect("run schemathesis");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

fn document() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/openapi.json")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schemathesis_finds_every_operation_as_documented_and_nothing_stored_from_a_rejection() {
    let dir = tempfile::tempdir().unwrap();
    let client = reqwest::Client::new();
    let server = Server::start_ready(
        dir.path(),
        &["--partitions", "4", "--follower-heartbeat-ms", "100"],
        &client,
    )
    .await;
    let (passed, output) = run(&document(), &server.url, None);
    assert!(passed, "schemathesis failed:\n{output}");
    let summary: Vec<&str> = output
        .lines()
        .filter(|l| l.contains("generated") || l.contains("passed"))
        .collect();
    println!("schemathesis: {}", summary.join(" | "));

    // Every event stored is a command that was answered 200, alone or in a batch (replays
    // write nothing).
    let answers = server.answers();
    let acknowledged_alone = answers
        .iter()
        .filter(|a| a.method == "POST" && a.path == "/v1/commands" && a.status == 200)
        .filter(|a| a.headers.get("idempotency-replayed").map(String::as_str) != Some("true"))
        .count();
    let acknowledged_in_batches: usize = answers
        .iter()
        .filter(|a| a.method == "POST" && a.path == "/v1/commands/batch" && a.status == 200)
        .map(|a| {
            let answer: Value = serde_json::from_str(&a.body).unwrap();
            answer["results"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|r| r["status"] == 200 && r["replayed"] != true)
                .count()
        })
        .sum();
    let acknowledged = acknowledged_alone + acknowledged_in_batches;
    let rejected = answers
        .iter()
        .filter(|a| a.method == "POST" && a.path == "/v1/commands" && a.status >= 400)
        .count();
    let mut stored = 0;
    for partition in 0..4 {
        for offset in 1.. {
            let r = client
                .get(format!(
                    "{}/v1/partitions/{partition}/events/{offset}",
                    server.url
                ))
                .send()
                .await
                .unwrap();
            if r.status() == 404 {
                break;
            }
            let _: Value = r.json().await.unwrap();
            stored += 1;
        }
    }
    assert_eq!(
        stored, acknowledged,
        "events stored against commands acknowledged ({rejected} rejected)"
    );
    assert!(rejected > 0, "schemathesis sent no invalid command");
    println!(
        "schemathesis: {acknowledged} commands acknowledged, {stored} events stored, {rejected} rejected"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schemathesis_fails_on_a_deliberately_wrong_document() {
    let dir = tempfile::tempdir().unwrap();
    let client = reqwest::Client::new();
    let server = Server::start_ready(dir.path(), &[], &client).await;
    // The document says a command's PLog offset is a string; the server answers a number.
    let mut wrong: Value = serde_json::from_str(common::openapi::DOCUMENT).unwrap();
    wrong["components"]["schemas"]["Outcome"]["properties"]["plog_offset"] =
        serde_json::json!({"type": "string"});
    let path = dir.path().join("wrong.json");
    std::fs::write(&path, wrong.to_string()).unwrap();
    let (passed, output) = run(&path, &server.url, Some("submitCommand"));
    assert!(!passed, "schemathesis passed a wrong document:\n{output}");
    assert!(output.contains("Response violates schema"), "{output}");
}
