//! `POST /v1/commands/batch` against the real binary: every command of a batch runs as it would
//! alone and gets its own result in the order sent; one bad command fails only itself; a
//! command's key makes it safe to retry, in a batch or alone; a batch refused whole runs
//! nothing; and the client's `submit_batch` answers each command. (Every answer is also checked
//! against docs/openapi.json when the server stops.)

mod common;

use common::{Server, metric, metrics};
use monoseq_client::{BatchCommandBody, Client, CommandBody, KindBody, NewRecordBody};
use serde_json::{Value, json};

fn command(ws: u64, n: u64) -> Value {
    json!({"ws": ws, "ws_kind": 1, "command": "app.Create",
           "create": [{"raw_id": 1, "kind": "CDoc", "name": "app.Doc", "fields": {"n": n}}]})
}

async fn post_batch(client: &reqwest::Client, url: &str, body: &Value) -> (u16, Value) {
    let answer = client
        .post(format!("{url}/v1/commands/batch"))
        .json(body)
        .send()
        .await
        .unwrap();
    (answer.status().as_u16(), answer.json().await.unwrap())
}

async fn event_count(client: &reqwest::Client, url: &str, partition: u32) -> u64 {
    let mut offset = 0;
    while client
        .get(format!(
            "{url}/v1/partitions/{partition}/events/{}",
            offset + 1
        ))
        .send()
        .await
        .unwrap()
        .status()
        .is_success()
    {
        offset += 1;
    }
    offset
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_command_of_a_batch_runs_alone_and_a_bad_one_fails_only_itself() {
    let dir = tempfile::tempdir().unwrap();
    let http = reqwest::Client::new();
    let server = Server::start_ready(dir.path(), &["--partitions", "4"], &http).await;
    let batch = json!({"commands": [
        command(1, 1),
        {"ws": 2, "ws_kind": 1, "command": "app.Create", "create": "not a list"},
        command(5, 2),
        {"ws": 3, "ws_kind": 99, "command": "app.Create"},
        command(1, 3),
    ]});
    let (status, answer) = post_batch(&http, &server.url, &batch).await;
    assert_eq!(status, 200, "{answer}");
    let results = answer["results"].as_array().unwrap();
    let statuses: Vec<u64> = results
        .iter()
        .map(|r| r["status"].as_u64().unwrap())
        .collect();
    assert_eq!(statuses, [200, 400, 200, 400, 200], "{answer}");
    assert_eq!(results[1]["error"]["code"], "invalid_command");
    assert_eq!(results[3]["error"]["code"], "unknown_workspace_kind");
    // Workspaces 1 and 5 are partition 1: three events there, in some order, each once.
    let mut offsets: Vec<u64> = [0, 2, 4]
        .iter()
        .map(|&i| results[i]["outcome"]["plog_offset"].as_u64().unwrap())
        .collect();
    offsets.sort_unstable();
    assert_eq!(offsets, [1, 2, 3]);
    assert_eq!(event_count(&http, &server.url, 1).await, 3);
    for partition in [2, 3] {
        assert_eq!(
            event_count(&http, &server.url, partition).await,
            0,
            "a refused command wrote nothing"
        );
    }
}

/// A batch waits for the slowest partition it touches: its commands for one partition go in one
/// group commit, not split between a group its first command started and the next.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batchs_commands_for_one_partition_are_written_in_one_group_commit() {
    let dir = tempfile::tempdir().unwrap();
    let http = reqwest::Client::new();
    let server = Server::start_ready(dir.path(), &["--partitions", "4"], &http).await;
    let groups = async || {
        metric(
            &metrics(&http, &server.url).await,
            "monoseq_group_commands_count",
        )
    };
    for round in 0..5 {
        // 100 commands, all in workspaces of partition 1, its queue empty before.
        let commands: Vec<Value> = (0..100).map(|n| command(4 * n + 1, round)).collect();
        let before = groups().await;
        let (status, answer) = post_batch(&http, &server.url, &json!({"commands": commands})).await;
        assert_eq!(status, 200, "{answer}");
        let results = answer["results"].as_array().unwrap();
        assert!(
            results.iter().all(|r| r["status"] == 200),
            "every command is written: {answer}"
        );
        assert_eq!(
            groups().await - before,
            1,
            "round {round}: the batch's 100 commands went in one group commit"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_with_a_key_is_answered_from_its_original_in_a_batch_or_alone() {
    let dir = tempfile::tempdir().unwrap();
    let http = reqwest::Client::new();
    let server = Server::start_ready(dir.path(), &["--partitions", "4"], &http).await;
    let mut keyed = command(6, 1);
    keyed["idempotency_key"] = json!("order-17");
    let batch = json!({"commands": [keyed.clone(), command(7, 2)]});
    let (_, first) = post_batch(&http, &server.url, &batch).await;
    let original = first["results"][0]["outcome"].clone();
    assert_eq!(first["results"][0].get("replayed"), None);
    let (_, again) = post_batch(&http, &server.url, &json!({"commands": [keyed]})).await;
    assert_eq!(again["results"][0]["outcome"], original);
    assert_eq!(again["results"][0]["replayed"], true);
    // The same key on the single-command endpoint names the same command.
    let alone = http
        .post(format!("{}/v1/commands", server.url))
        .header("idempotency-key", "order-17")
        .json(&command(6, 1))
        .send()
        .await
        .unwrap();
    assert_eq!(alone.headers()["idempotency-replayed"], "true");
    assert_eq!(alone.json::<Value>().await.unwrap(), original);
    assert_eq!(
        event_count(&http, &server.url, 2).await,
        1,
        "one event for the key"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_refused_whole_runs_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let http = reqwest::Client::new();
    let server = Server::start_ready(dir.path(), &["--partitions", "4"], &http).await;
    let url = format!("{}/v1/commands/batch", server.url);
    let send = |body: String, json: bool| {
        let mut request = http.post(&url).body(body);
        if json {
            request = request.header("content-type", "application/json");
        }
        request.send()
    };
    let too_many = json!({"commands": vec![command(1, 1); 1001]}).to_string();
    for (body, json, status, code) in [
        (r#"{"commands": [{"#.to_owned(), true, 400, "malformed_json"),
        (r#"{"commands": 5}"#.to_owned(), true, 400, "invalid_batch"),
        (r#"{"orders": []}"#.to_owned(), true, 400, "invalid_batch"),
        (too_many, true, 413, "batch_too_large"),
        (
            json!({"commands": [command(1, 1)]}).to_string(),
            false,
            415,
            "content_type",
        ),
    ] {
        let answer = send(body, json).await.unwrap();
        assert_eq!(answer.status().as_u16(), status);
        let answer: Value = answer.json().await.unwrap();
        assert_eq!(answer["code"], code, "{answer}");
    }
    assert_eq!(event_count(&http, &server.url, 1).await, 0);
    let (status, answer) = post_batch(&http, &server.url, &json!({"commands": []})).await;
    assert_eq!((status, answer), (200, json!({"results": []})));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_submits_a_batch_and_answers_each_command() {
    let dir = tempfile::tempdir().unwrap();
    let server =
        Server::start_ready(dir.path(), &["--partitions", "4"], &reqwest::Client::new()).await;
    let client = Client::new(&server.url).unwrap();
    let mut commands: Vec<BatchCommandBody> = (1..=20)
        .map(|ws| {
            let mut command = CommandBody::new(ws, 1, "app.Create");
            command
                .create
                .push(NewRecordBody::new(1, KindBody::CDoc, "app.Doc"));
            BatchCommandBody::new(command, Some(format!("key-{ws}")))
        })
        .collect();
    commands.push(BatchCommandBody::new(
        CommandBody::new(3, 99, "app.Bad"),
        None,
    ));
    let results = client.submit_batch(&commands).await.unwrap();
    assert_eq!(results.len(), 21);
    let mut per_partition = [0u64; 4];
    for (i, result) in results[..20].iter().enumerate() {
        let ws = i + 1;
        let done = result.as_ref().unwrap();
        assert_eq!(done.outcome.partition as usize, ws % 4);
        assert_eq!(done.key, format!("key-{ws}"));
        per_partition[ws % 4] += 1;
    }
    assert_eq!(per_partition, [5; 4]);
    let refused = results[20].as_ref().unwrap_err();
    assert_eq!(
        (refused.status(), refused.code().as_str()),
        (Some(400), "unknown_workspace_kind")
    );
    // The same batch again: every keyed command is answered from its original.
    let again = client.submit_batch(&commands[..20]).await.unwrap();
    for (first, second) in results.iter().zip(&again) {
        let (first, second) = (first.as_ref().unwrap(), second.as_ref().unwrap());
        assert!(second.replayed);
        assert_eq!(first.outcome, second.outcome);
    }
}
