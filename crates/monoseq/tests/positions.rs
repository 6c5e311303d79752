//! Consumer positions end to end, against the real binary and the real client: compare-and-set
//! over HTTP (exactly one of many writers on one expected position wins), never backwards
//! unless forced, bad input answered 400/404/415 naming what is wrong, a read token that may
//! read but not set, each consumer's lag in `/metrics`, a position that survives a restart
//! and is in a backup, and on PostgreSQL, positions set through one node of two and read, and
//! raced for, through the other; `monoseq tail --consumer` resuming after what it stored, and
//! storing it while idle and when stopped by SIGTERM. Every answer is checked against the
//! OpenAPI document.

mod common;
mod security;

use std::path::Path;
use std::time::Duration;

use common::node::Node;
use common::{Backend, Server};
use futures_util::future::join_all;
use monoseq_client::{Client, ClientError, PartitionPositionBody};
use serde_json::{Value, json};

/// Writers racing on one position over HTTP.
const WRITERS: u64 = 16;

fn client(url: &str) -> Client {
    Client::builder([url]).build().unwrap()
}

/// `PUT` of `body` (sent as it is) to the position of `name` (already a path segment) on
/// `partition`: the status and the JSON answer.
async fn put_raw(
    http: &reqwest::Client,
    url: &str,
    name: &str,
    partition: &str,
    body: &str,
) -> (u16, Value) {
    let r = http
        .put(format!("{url}/v1/consumers/{name}/partitions/{partition}"))
        .header("content-type", "application/json")
        .body(body.to_owned())
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

/// Writes `n` events (at most 1 000) into workspace `ws` of `url` (partition `ws` mod the
/// partition count) in one batch.
async fn fill(http: &reqwest::Client, url: &str, ws: u64, n: u64) {
    let commands: Vec<Value> = (0..n)
        .map(|i| json!({"ws": ws, "ws_kind": 1, "command": "fill.Do", "create": [{"raw_id": 1, "kind": "CDoc", "name": "fill.Doc", "fields": {"n": i}}]}))
        .collect();
    let r = http
        .post(format!("{url}/v1/commands/batch"))
        .json(&json!({ "commands": commands }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let answer: Value = r.json().await.unwrap();
    for result in answer["results"].as_array().unwrap() {
        assert_eq!(result["status"], 200, "{result}");
    }
}

async fn get_raw(http: &reqwest::Client, url: &str, path: &str) -> (u16, Value) {
    let r = http.get(format!("{url}{path}")).send().await.unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

fn conflict_current(e: &ClientError) -> Option<u64> {
    match e {
        ClientError::PositionConflict { current, .. } => *current,
        other => panic!("not a position conflict: {other}"),
    }
}

/// Sends `WRITERS` set_position calls expecting `expected` at once (through `urls` in turn);
/// answers the offsets that were set.
async fn race(urls: &[String], name: &str, expected: u64) -> Vec<u64> {
    let clients: Vec<Client> = urls.iter().map(|u| client(u)).collect();
    let tries = (0..WRITERS).map(|w| {
        let c = clients[w as usize % clients.len()].clone();
        async move {
            let offset = expected + 1 + w;
            match c.set_position(name, 0, offset, Some(expected)).await {
                Ok(()) => Some(offset),
                Err(e) => {
                    assert_eq!(e.code().as_str(), "position_conflict", "{e}");
                    None
                }
            }
        }
    });
    join_all(tries).await.into_iter().flatten().collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_position_is_set_by_compare_and_set_and_never_moves_back_unless_forced() {
    let dir = tempfile::tempdir().unwrap();
    let http = reqwest::Client::new();
    let server = Server::start_ready(dir.path(), &["--partitions", "4"], &http).await;
    // Partition 3 (workspace 3 of 4): events 1 to 15, end 16.
    fill(&http, &server.url, 3, 15).await;
    let c = client(&server.url);
    // A name that needs encoding in a path travels as one segment.
    let name = "billing/v2 #1";
    assert_eq!(c.position(name, 3).await.unwrap(), None);
    assert_eq!(c.positions(name).await.unwrap(), vec![]);
    c.set_position(name, 3, 0, None).await.unwrap();
    assert_eq!(c.position(name, 3).await.unwrap(), Some(0));
    // Created only once.
    let again = c.set_position(name, 3, 5, None).await.unwrap_err();
    assert_eq!(
        (again.code().as_str(), conflict_current(&again)),
        ("position_conflict", Some(0))
    );
    c.set_position(name, 3, 12, Some(0)).await.unwrap();
    // A writer that read an older position loses, and learns the stored one.
    let stale = c.set_position(name, 3, 13, Some(0)).await.unwrap_err();
    assert_eq!(
        (stale.code().as_str(), conflict_current(&stale)),
        ("position_conflict", Some(12))
    );
    assert_eq!(stale.status(), Some(409));
    // Backwards without force: refused, saying how to force it.
    let back = c.set_position(name, 3, 10, Some(12)).await.unwrap_err();
    assert_eq!(
        (back.code().as_str(), conflict_current(&back)),
        ("position_backwards", Some(12))
    );
    assert!(back.to_string().contains("\"force\": true"), "{back}");
    assert_eq!(c.position(name, 3).await.unwrap(), Some(12));
    c.force_position(name, 3, 10, Some(12)).await.unwrap();
    assert_eq!(c.position(name, 3).await.unwrap(), Some(10));
    // Forcing still needs the expected position.
    let forced_stale = c.force_position(name, 3, 1, Some(12)).await.unwrap_err();
    assert_eq!(conflict_current(&forced_stale), Some(10));
    c.set_position(name, 1, 0, None).await.unwrap();
    assert_eq!(
        c.positions(name).await.unwrap(),
        vec![
            PartitionPositionBody {
                partition: 1,
                offset: 0
            },
            PartitionPositionBody {
                partition: 3,
                offset: 10
            },
        ]
    );
    // The answers as they travel.
    let (status, body) = get_raw(
        &http,
        &server.url,
        "/v1/consumers/billing%2Fv2%20%231/partitions/3",
    )
    .await;
    assert_eq!((status, body), (200, json!({"offset": 10})));
    let (status, body) = put_raw(
        &http,
        &server.url,
        "billing%2Fv2%20%231",
        "3",
        r#"{"offset": 7, "expected": 99}"#,
    )
    .await;
    assert_eq!(status, 409);
    assert_eq!(
        (body["code"].as_str(), body["current"].as_u64()),
        (Some("position_conflict"), Some(10))
    );
    let (status, body) = put_raw(
        &http,
        &server.url,
        "fresh",
        "0",
        r#"{"offset": 7, "expected": 6}"#,
    )
    .await;
    assert_eq!((status, &body["current"]), (409, &Value::Null), "{body}");
    let (status, body) = put_raw(
        &http,
        &server.url,
        "fresh",
        "0",
        r#"{"offset": 0, "expected": null}"#,
    )
    .await;
    assert_eq!((status, body), (200, json!({"offset": 0})));
    let (status, body) = get_raw(&http, &server.url, "/v1/consumers/fresh").await;
    assert_eq!(
        (status, body),
        (
            200,
            json!({"consumer": "fresh", "partitions": [{"partition": 0, "offset": 0}]})
        )
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn of_many_writers_expecting_one_position_over_http_exactly_one_wins() {
    let dir = tempfile::tempdir().unwrap();
    let http = reqwest::Client::new();
    let server = Server::start_ready(dir.path(), &["--partitions", "2"], &http).await;
    // Room for 20 rounds of 16 writers: each round moves the position at most 16 forward.
    fill(&http, &server.url, 2, 20 * WRITERS + 1).await;
    let c = client(&server.url);
    c.set_position("race", 0, 0, None).await.unwrap();
    let mut expected = 0;
    for round in 0..20 {
        let won = race(std::slice::from_ref(&server.url), "race", expected).await;
        assert_eq!(
            won.len(),
            1,
            "round {round}: {won:?} all succeeded from {expected}"
        );
        assert_eq!(c.position("race", 0).await.unwrap(), Some(won[0]));
        expected = won[0];
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_consumer_names_offsets_and_partitions_are_refused_naming_them() {
    let dir = tempfile::tempdir().unwrap();
    let http = reqwest::Client::new();
    let server = Server::start_ready(dir.path(), &["--partitions", "4"], &http).await;
    let url = &server.url;
    let long = "n".repeat(256);
    for (name, why) in [
        (long.as_str(), "too long"),
        ("caf%C3%A9", "not printable ASCII"),
        ("tab%09", "not printable ASCII"),
    ] {
        for path in [
            format!("/v1/consumers/{name}/partitions/0"),
            format!("/v1/consumers/{name}"),
        ] {
            let (status, body) = get_raw(&http, url, &path).await;
            assert_eq!(status, 400, "{path}: {body}");
            let message = body["message"].as_str().unwrap();
            assert!(
                message.contains("consumer name") && message.contains(why),
                "{message}"
            );
        }
        let (status, _) = put_raw(&http, url, name, "0", r#"{"offset": 1}"#).await;
        assert_eq!(status, 400);
    }
    assert!(
        client(url)
            .position(&"n".repeat(255), 0)
            .await
            .unwrap()
            .is_none()
    );
    for (body, names) in [
        (r#"{"offset": -1}"#, "offset is -1"),
        (r#"{"offset": "12"}"#, "offset is \"12\""),
        (r#"{"offset": 1.5}"#, "offset is 1.5"),
        (r#"{"offset": 18446744073709551616}"#, "offset is"),
        (r#"{"offset": 3, "expected": -2}"#, "expected is -2"),
        (r#"{"offset": 3, "force": "yes"}"#, "force is true or false"),
        (
            r#"{"offset": 3, "expect": 2}"#,
            "unknown fields [\"expect\"]",
        ),
        (r#"{"expected": 2}"#, "offset is missing"),
        ("[1]", "the body is"),
        ("{", "the body is"),
    ] {
        let (status, answer) = put_raw(&http, url, "c", "0", body).await;
        assert_eq!(status, 400, "{body}: {answer}");
        let message = answer["message"].as_str().unwrap();
        assert!(message.contains(names), "{body}: {message}");
    }
    let (status, body) = put_raw(&http, url, "c", "4", r#"{"offset": 1}"#).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (404, Some("no_such_partition"))
    );
    let (status, body) = get_raw(&http, url, "/v1/consumers/c/partitions/4").await;
    assert_eq!(
        (status, body["code"].as_str()),
        (404, Some("no_such_partition"))
    );
    for partition in ["x", "-1", "4294967296"] {
        let (status, body) = get_raw(
            &http,
            url,
            &format!("/v1/consumers/c/partitions/{partition}"),
        )
        .await;
        assert_eq!(status, 400, "{partition}: {body}");
        assert!(
            body["message"].as_str().unwrap().contains("partition"),
            "{body}"
        );
    }
    let (status, body) = get_raw(&http, url, "/v1/consumers/c/partitions/0").await;
    assert_eq!(
        (status, body["code"].as_str()),
        (404, Some("unknown_consumer"))
    );
    let (status, body) = get_raw(&http, url, "/v1/consumers/c").await;
    assert_eq!(
        (status, body["code"].as_str()),
        (404, Some("unknown_consumer"))
    );
    let r = http
        .put(format!("{url}/v1/consumers/c/partitions/0"))
        .body(r#"{"offset": 1}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 415);
    // 0 is a position: nothing processed yet.
    let (status, _) = put_raw(&http, url, "c", "0", r#"{"offset": 0}"#).await;
    assert_eq!(status, 200);
    // Nothing refused was stored.
    assert_eq!(
        client(url).positions("c").await.unwrap(),
        vec![PartitionPositionBody {
            partition: 0,
            offset: 0
        }]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_token_reads_positions_and_only_a_write_token_sets_them() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = security::both_tokens(dir.path());
    let server = security::launch(
        &dir.path().join("data"),
        "127.0.0.1:0",
        &["--tokens-file", tokens.to_str().unwrap()],
        &[],
    )
    .expect("server starts");
    let http = reqwest::Client::new();
    server.ready(&http, Some(security::WRITE)).await;
    let url = format!("{}/v1/consumers/c/partitions/0", server.url);
    let body = json!({"offset": 0});
    let send = |method, token, body| security::send(&http, method, &url, token, body);
    assert_eq!(
        send(reqwest::Method::PUT, Some(security::READ), Some(&body))
            .await
            .0,
        403
    );
    assert_eq!(send(reqwest::Method::PUT, None, Some(&body)).await.0, 401);
    assert_eq!(send(reqwest::Method::GET, None, None).await.0, 401);
    assert_eq!(
        send(reqwest::Method::PUT, Some(security::WRITE), Some(&body))
            .await
            .0,
        200
    );
    let (status, _, answer) = send(reqwest::Method::GET, Some(security::READ), None).await;
    assert_eq!((status, answer), (200, json!({"offset": 0})));
}

/// The value of the series `name{labels}` in OpenMetrics `text`.
fn series(text: &str, name_labels: &str) -> Option<i64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name_labels)?.trim().parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_report_each_consumers_lag_behind_its_partitions_end() {
    let dir = tempfile::tempdir().unwrap();
    let http = reqwest::Client::new();
    let server = Server::start_ready(dir.path(), &["--partitions", "2"], &http).await;
    let c = client(&server.url);
    // Workspace 2 is in partition 0: five events, PLog offsets 1 to 5.
    for n in 0..5 {
        let r = http
            .post(format!("{}/v1/commands", server.url))
            .json(&json!({"ws": 2, "ws_kind": 1, "command": "lag.Do", "create": [{"raw_id": 1, "kind": "CDoc", "name": "lag.Doc", "fields": {"n": n}}]}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    c.set_position("behind", 0, 2, None).await.unwrap();
    c.set_position("done", 0, 5, None).await.unwrap();
    c.set_position("idle", 1, 0, None).await.unwrap();
    let text = http
        .get(format!("{}/metrics", server.url))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let lag = |consumer: &str, partition: u32| {
        series(
            &text,
            &format!(
                "monoseq_consumer_lag_events{{consumer=\"{consumer}\",partition=\"{partition}\"}}"
            ),
        )
    };
    assert_eq!(lag("behind", 0), Some(3), "{text}");
    assert_eq!(lag("done", 0), Some(0));
    assert_eq!(lag("idle", 1), Some(0));
    assert_eq!(series(&text, "monoseq_consumer_lag_truncated"), Some(0));
    assert!(
        text.contains("# HELP monoseq_consumer_lag_events"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_position_survives_a_restart_and_a_backup_restored_keeps_it() {
    let tmp = tempfile::tempdir().unwrap();
    let live = tmp.path().join("live");
    let http = reqwest::Client::new();
    let server = Server::start_ready(&live, &["--partitions", "2"], &http).await;
    fill(&http, &server.url, 1, 90).await;
    client(&server.url)
        .set_position("projector", 1, 40, None)
        .await
        .unwrap();
    assert!(server.terminate(Duration::from_secs(30)).success());

    let root = tmp.path().to_str().unwrap();
    let server = Server::start_ready(
        &live,
        &["--backup-root", root, "--admin-on-loopback"],
        &http,
    )
    .await;
    let c = client(&server.url);
    assert_eq!(c.position("projector", 1).await.unwrap(), Some(40));
    c.set_position("projector", 1, 41, Some(40)).await.unwrap();
    let backup = tmp.path().join("backup");
    common::backup_via_cli(&server.url, &backup);
    c.set_position("projector", 1, 90, Some(41)).await.unwrap();
    assert_eq!(
        c.set_position("projector", 1, 91, Some(90))
            .await
            .unwrap_err()
            .code()
            .as_str(),
        "position_beyond_end"
    );
    assert!(server.terminate(Duration::from_secs(30)).success());

    let restored = Server::try_start(
        &backup,
        &["--skip-ahead", "1000"],
        &tmp.path().join("restored.log"),
    )
    .expect("the backup continues with a margin");
    restored.ready(&http).await;
    assert_eq!(
        client(&restored.url)
            .position("projector", 1)
            .await
            .unwrap(),
        Some(41)
    );
}

/// Node `id` of a two-node cluster on PostgreSQL database `db`, with four partitions.
fn node(db: &str, id: &str, dir: &Path) -> Node {
    Node::on(db, id, dir).args(&["--partitions", "4"]).start()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_postgresql_a_position_set_through_one_node_is_read_and_raced_for_through_the_other() {
    let db = Backend::postgres_url();
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (node(&db, "a", dir.path()), node(&db, "b", dir.path()));
    let (ca, cb) = (client(&a.url), client(&b.url));
    let http = reqwest::Client::new();
    common::wait_ready(&a.url, &http).await;
    common::wait_ready(&b.url, &http).await;
    // Partition 2: events 1 to 12, end 13; partition 0: room for the race below.
    fill(&http, &a.url, 2, 12).await;
    fill(&http, &a.url, 4, 10 * WRITERS + 1).await;
    // Whichever node owns partition 2, both refuse a position at its end, naming the owner's
    // end (the other node asks the owner), and take the last event's offset.
    for c in [&ca, &cb] {
        match c.set_position("guarded", 2, 13, None).await {
            Err(ClientError::PositionBeyondEnd { end, .. }) => assert_eq!(end, 13),
            other => panic!("a position at the end was not refused: {other:?}"),
        }
    }
    cb.set_position("guarded", 2, 12, None).await.unwrap();
    ca.set_position("guarded-a", 2, 12, None).await.unwrap();
    // Positions need no partition owner: any node answers them from the database.
    ca.set_position("shared", 2, 10, None).await.unwrap();
    assert_eq!(cb.position("shared", 2).await.unwrap(), Some(10));
    cb.set_position("shared", 2, 11, Some(10)).await.unwrap();
    let stale = ca
        .set_position("shared", 2, 12, Some(10))
        .await
        .unwrap_err();
    assert_eq!(conflict_current(&stale), Some(11));
    assert_eq!(
        ca.positions("shared").await.unwrap(),
        vec![PartitionPositionBody {
            partition: 2,
            offset: 11
        }]
    );
    // Every consumer is listed through either node with the owner's end.
    for c in [&ca, &cb] {
        let page = c.consumers(None).await.unwrap();
        let shared = page.consumers.iter().find(|c| c.name == "shared").unwrap();
        assert_eq!(
            (shared.partitions[0].end, shared.partitions[0].lag),
            (Some(13), Some(1))
        );
    }
    // Writers on both nodes, expecting the same position: one wins per round.
    ca.set_position("race", 0, 0, None).await.unwrap();
    let urls = [a.url.clone(), b.url.clone()];
    let mut expected = 0;
    for round in 0..10 {
        let won = race(&urls, "race", expected).await;
        assert_eq!(
            won.len(),
            1,
            "round {round}: {won:?} all succeeded from {expected}"
        );
        expected = won[0];
    }
    assert_eq!(cb.position("race", 0).await.unwrap(), Some(expected));
}

/// `monoseq tail` of partition 0 of `url` as consumer `name`, stopping after `max` events: the
/// PLog offsets it printed.
async fn tail_as(url: &str, name: &str, max: u64) -> Vec<u64> {
    let (url, name, max) = (url.to_owned(), name.to_owned(), max.to_string());
    let out = tokio::task::spawn_blocking(move || {
        common::run(&[
            "tail",
            "--url",
            &url,
            "--partition",
            "0",
            "--consumer",
            &name,
            "--max-events",
            &max,
        ])
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["plog_offset"]
                .as_u64()
                .unwrap()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn monoseq_tail_as_a_consumer_resumes_after_the_position_it_stored() {
    let dir = tempfile::tempdir().unwrap();
    let http = reqwest::Client::new();
    let server = Server::start_ready(dir.path(), &["--partitions", "2"], &http).await;
    for n in 0..3 {
        post_to_partition_0(&http, &server.url, n).await;
    }
    assert_eq!(tail_as(&server.url, "printer", 2).await, vec![1, 2]);
    let c = client(&server.url);
    assert_eq!(c.position("printer", 0).await.unwrap(), Some(2));
    assert_eq!(tail_as(&server.url, "printer", 1).await, vec![3]);
    assert_eq!(c.position("printer", 0).await.unwrap(), Some(3));
}

/// Posts one command to workspace 2 (partition 0 of 2) of `url`.
async fn post_to_partition_0(http: &reqwest::Client, url: &str, n: u64) {
    let r = http
        .post(format!("{url}/v1/commands"))
        .json(&json!({"ws": 2, "ws_kind": 1, "command": "tail.Do", "create": [{"raw_id": 1, "kind": "CDoc", "name": "tail.Doc", "fields": {"n": n}}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

/// The PLog offset of the next line `monoseq tail` printed.
async fn next_printed(lines: &mut tokio::sync::mpsc::UnboundedReceiver<String>) -> u64 {
    let line = tokio::time::timeout(Duration::from_secs(10), lines.recv())
        .await
        .expect("a line within 10 s")
        .expect("the tail is still printing");
    serde_json::from_str::<Value>(&line).unwrap()["plog_offset"]
        .as_u64()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn monoseq_tail_as_a_consumer_stores_its_position_while_idle_and_when_stopped() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let http = reqwest::Client::new();
    let server = Server::start_ready(dir.path(), &["--partitions", "2"], &http).await;
    for n in 0..3 {
        post_to_partition_0(&http, &server.url, n).await;
    }
    let mut tail = std::process::Command::new(common::BIN)
        .args(["tail", "--url", &server.url, "--partition", "0"])
        .args(["--consumer", "idle"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = std::io::BufReader::new(tail.stdout.take().unwrap());
    let (printed, mut lines) = tokio::sync::mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for line in stdout.lines().map_while(Result::ok) {
            let _ = printed.send(line);
        }
    });
    for offset in 1..=3 {
        assert_eq!(next_printed(&mut lines).await, offset);
    }
    // Nothing more arrives: the position is stored anyway, within about a second.
    let c = client(&server.url);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while c.position("idle", 0).await.unwrap() != Some(3) {
        assert!(
            std::time::Instant::now() < deadline,
            "an idle tail never stored the position of what it printed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Stopped right after printing one more: it stores that before it exits.
    post_to_partition_0(&http, &server.url, 3).await;
    assert_eq!(next_printed(&mut lines).await, 4);
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &tail.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = tail.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() >= deadline {
            let _ = tail.kill();
            panic!("the tail did not exit within 10 s of SIGTERM");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(status.success(), "{status}");
    assert_eq!(c.position("idle", 0).await.unwrap(), Some(4));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_position_at_or_beyond_the_partitions_end_is_refused_naming_the_end_forced_or_not() {
    let dir = tempfile::tempdir().unwrap();
    let http = reqwest::Client::new();
    let server = Server::start_ready(dir.path(), &["--partitions", "2"], &http).await;
    let url = &server.url;
    // Partition 0: events 1 to 2, end 3.
    fill(&http, url, 2, 2).await;
    for body in [
        r#"{"offset": 3}"#,
        r#"{"offset": 5000}"#,
        r#"{"offset": 18446744073709551615}"#,
    ] {
        let (status, answer) = put_raw(&http, url, "c", "0", body).await;
        assert_eq!(
            (status, answer["code"].as_str(), answer["end"].as_u64()),
            (409, Some("position_beyond_end"), Some(3)),
            "{body}: {answer}"
        );
        assert!(
            answer["message"].as_str().unwrap().contains("at most 2"),
            "{answer}"
        );
    }
    // An empty partition (end 1) takes only 0, nothing processed.
    let (status, answer) = put_raw(&http, url, "c", "1", r#"{"offset": 1}"#).await;
    assert_eq!((status, answer["end"].as_u64()), (409, Some(1)), "{answer}");
    let (status, _) = put_raw(&http, url, "c", "1", r#"{"offset": 0}"#).await;
    assert_eq!(status, 200);
    // The last event's offset is a position; forcing never goes beyond the end either.
    let (status, _) = put_raw(&http, url, "c", "0", r#"{"offset": 2}"#).await;
    assert_eq!(status, 200);
    let (status, answer) = put_raw(
        &http,
        url,
        "c",
        "0",
        r#"{"offset": 3, "expected": 2, "force": true}"#,
    )
    .await;
    assert_eq!(
        (status, answer["code"].as_str()),
        (409, Some("position_beyond_end"))
    );
    let c = client(url);
    assert_eq!(c.position("c", 0).await.unwrap(), Some(2));
    match c.set_position("c", 0, 3, Some(2)).await {
        Err(ClientError::PositionBeyondEnd { end: 3, .. }) => {}
        other => panic!("not refused beyond the end: {other:?}"),
    }
    // Once event 3 is written, position 3 is taken.
    fill(&http, url, 2, 1).await;
    c.set_position("c", 0, 3, Some(2)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumers_are_listed_with_end_and_lag_and_deleted_with_their_lag_series() {
    let dir = tempfile::tempdir().unwrap();
    let http = reqwest::Client::new();
    let server = Server::start_ready(dir.path(), &["--partitions", "2"], &http).await;
    let url = &server.url;
    // Partition 0: events 1 to 8, end 9.
    fill(&http, url, 2, 8).await;
    let c = client(url);
    c.set_position("g", 0, 5, None).await.unwrap();
    c.set_position("g", 1, 0, None).await.unwrap();
    c.set_position("h", 0, 8, None).await.unwrap();
    let (status, body) = get_raw(&http, url, "/v1/consumers").await;
    assert_eq!(status, 200);
    assert_eq!(
        body,
        json!({"consumers": [
            {"name": "g", "partitions": [
                {"partition": 0, "offset": 5, "end": 9, "lag": 3},
                {"partition": 1, "offset": 0, "end": 1, "lag": 0}
            ]},
            {"name": "h", "partitions": [{"partition": 0, "offset": 8, "end": 9, "lag": 0}]}
        ], "truncated": false})
    );
    // The same lag as the metric's.
    let text = common::metrics(&http, url).await;
    assert_eq!(
        series(
            &text,
            "monoseq_consumer_lag_events{consumer=\"g\",partition=\"0\"}"
        ),
        Some(3),
        "{text}"
    );
    let (status, body) = get_raw(&http, url, "/v1/consumers?after=g").await;
    assert_eq!(status, 200);
    assert_eq!(body["consumers"].as_array().unwrap().len(), 1, "{body}");
    assert_eq!(body["consumers"][0]["name"], "h");
    let (status, body) = get_raw(&http, url, "/v1/consumers?after=").await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("`after`"),
        "{body}"
    );

    let r = http
        .delete(format!("{url}/v1/consumers/g"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let deleted: Value = r.json().await.unwrap();
    assert_eq!(
        deleted,
        json!({"consumer": "g", "removed": [
            {"partition": 0, "offset": 5},
            {"partition": 1, "offset": 0}
        ]})
    );
    assert_eq!(c.positions("g").await.unwrap(), vec![]);
    let page = c.consumers(None).await.unwrap();
    let names: Vec<&str> = page.consumers.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["h"]);
    // Its lag series are gone; the other consumer's stay.
    let text = common::metrics(&http, url).await;
    assert!(!text.contains("consumer=\"g\""), "{text}");
    assert!(text.contains("consumer=\"h\""), "{text}");
    let r = http
        .delete(format!("{url}/v1/consumers/g"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["code"], "unknown_consumer");
    assert_eq!(c.delete_consumer("g").await.unwrap(), vec![]);
    assert_eq!(c.delete_consumer("h").await.unwrap().len(), 1);
    assert!(c.consumers(None).await.unwrap().consumers.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_of_many_consumers_is_cut_at_whole_consumers_and_continues_after_the_last() {
    let dir = tempfile::tempdir().unwrap();
    let http = reqwest::Client::new();
    let server = Server::start_ready(dir.path(), &["--partitions", "2"], &http).await;
    let c = client(&server.url);
    // 501 consumers on both partitions: 1 002 positions, over one page's 1 000.
    let names: Vec<String> = (0..501).map(|i| format!("c{i:03}")).collect();
    for chunk in names.chunks(16) {
        let sets = chunk.iter().flat_map(|n| {
            let c = c.clone();
            [0, 1].map(move |p| {
                let c = c.clone();
                async move { c.set_position(n, p, 0, None).await.unwrap() }
            })
        });
        join_all(sets).await;
    }
    let first = c.consumers(None).await.unwrap();
    assert!(first.truncated);
    // Whole consumers only: 500 of them, two positions each.
    assert_eq!(first.consumers.len(), 500);
    assert!(first.consumers.iter().all(|c| c.partitions.len() == 2));
    let last = first.consumers.last().unwrap().name.clone();
    assert_eq!(last, "c499");
    let rest = c.consumers(Some(&last)).await.unwrap();
    assert!(!rest.truncated);
    let names: Vec<&str> = rest.consumers.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["c500"]);
}
