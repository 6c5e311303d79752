//! The client's consumer side (`monoseq-client`'s `read_partition` and `follow`) and
//! `monoseq tail` against the real binary: stored then live events in order, a tail that
//! resumes by itself after a `slow_follower` cut and across a server killed and restarted on
//! the same port (twice, further apart than its retry timeout, on a quiet partition), with no
//! offset repeated or skipped, and the console consumer's JSON lines.

mod common;

use std::time::Duration;

use common::{FixedServer, Server, free_port};
use futures_util::{Stream, StreamExt};
use monoseq_client::{Client, ClientError, CommandBody, FollowItem, PlogEntryBody};
use serde_json::{Value, json};

const PARTITIONS: u64 = 4;
/// Longest wait for one entry of a tail.
const ENTRY_BOUND: Duration = Duration::from_secs(30);

/// A command of a workspace of partition 1 (`k` picks one of several).
fn note(k: u64) -> CommandBody {
    CommandBody::new(1 + PARTITIONS * (k % 7), 1, "app.Note")
}

/// The PLog offsets of the next `n` entries of `tail` (gaps count their last offset).
async fn offsets<S>(tail: &mut S, n: usize) -> Vec<u64>
where
    S: Stream<Item = Result<FollowItem, ClientError>> + Unpin,
{
    let mut seen = Vec::with_capacity(n);
    while seen.len() < n {
        let item = tokio::time::timeout(ENTRY_BOUND, tail.next())
            .await
            .unwrap_or_else(|_| panic!("no entry within {ENTRY_BOUND:?} after {seen:?}"))
            .expect("the tail does not end")
            .expect("an entry");
        match item {
            FollowItem::Event(e) => seen.push(e.plog_offset),
            FollowItem::Gap(g) => seen.push(g.to),
        }
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_read_and_a_tail_give_stored_then_live_events_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let server =
        Server::start_ready(dir.path(), &["--partitions", "4"], &reqwest::Client::new()).await;
    let client = Client::new(&server.url).unwrap();
    for k in 0..5 {
        client.submit(&note(k)).await.unwrap();
    }
    let page = client.read_partition(1, 2, 3).await.unwrap();
    let page_offsets: Vec<u64> = page
        .events
        .iter()
        .map(|e| match e {
            PlogEntryBody::Event(e) => e.plog_offset,
            PlogEntryBody::Gap { gap } => gap.to,
        })
        .collect();
    assert_eq!(page_offsets, vec![2, 3, 4]);
    assert_eq!((page.next, page.end), (5, 6));

    let tail = client.follow(1, 1);
    futures_util::pin_mut!(tail);
    assert_eq!(offsets(&mut tail, 5).await, vec![1, 2, 3, 4, 5], "stored");
    for k in 5..10 {
        client.submit(&note(k)).await.unwrap();
    }
    assert_eq!(offsets(&mut tail, 5).await, vec![6, 7, 8, 9, 10], "live");

    // A long poll at the end answers once the next event is durable.
    let waiting = {
        let client = client.clone();
        tokio::spawn(async move {
            client
                .read_partition_wait(1, 11, 10, Duration::from_secs(20))
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    client.submit(&note(10)).await.unwrap();
    let page = waiting.await.unwrap().unwrap();
    assert_eq!(page.events.len(), 1, "{page:?}");
    assert_eq!(page.next, 12);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tail_cut_as_a_slow_follower_resumes_by_itself_without_a_repeat_or_a_skip() {
    let dir = tempfile::tempdir().unwrap();
    let http = reqwest::Client::new();
    let server = Server::start_ready(
        dir.path(),
        &["--partitions", "4", "--follower-buffer-events", "16"],
        &http,
    )
    .await;
    let url = server.url.clone();
    let client = Client::new(&url).unwrap();
    client.submit(&note(0)).await.unwrap();
    let tail = client.follow(1, 1);
    futures_util::pin_mut!(tail);
    assert_eq!(offsets(&mut tail, 1).await, vec![1]);
    // The tail is not read while large events fill the server's buffer for it.
    let big = "x".repeat(16 * 1024);
    let rounds = 40u64;
    for round in 0..rounds {
        let commands: Vec<Value> = (0..50)
            .map(|i| {
                json!({"ws": 1 + PARTITIONS * ((round * 50 + i) % 7), "ws_kind": 1,
                       "command": "app.Big",
                       "argument": {"raw_id": 1, "name": "app.Arg", "fields": {"pad": big}}})
            })
            .collect();
        let r = http
            .post(format!("{url}/v1/commands/batch"))
            .json(&json!({"commands": commands}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    let total = 1 + rounds * 50;
    let rest = offsets(&mut tail, (total - 1) as usize).await;
    assert_eq!(
        rest,
        (2..=total).collect::<Vec<_>>(),
        "every offset once, in order"
    );
    let metrics = common::metrics(&http, &url).await;
    assert!(
        common::metric(&metrics, "monoseq_followers_cut_slow_total") >= 1,
        "the tail was cut at least once: {metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tail_resumes_by_itself_across_a_server_killed_and_restarted() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let mut server = FixedServer::start(dir.path(), port, &[]);
    let client = Client::new(&url).unwrap();
    for k in 0..3 {
        client.submit(&note(k)).await.unwrap();
    }
    let mut tail = Box::pin(client.follow(1, 1));
    assert_eq!(offsets(&mut tail, 3).await, vec![1, 2, 3]);

    server.kill();
    let reader = tokio::spawn(async move {
        let seen = offsets(&mut tail, 3).await;
        // Nothing more than what was written arrives.
        let extra = tokio::time::timeout(Duration::from_millis(500), tail.next()).await;
        (seen, extra.is_err())
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let _server = FixedServer::start(dir.path(), port, &[]);
    for k in 3..6 {
        client.submit(&note(k)).await.unwrap();
    }
    let (seen, quiet) = reader.await.unwrap();
    assert_eq!(seen, vec![4, 5, 6], "resumed after 3, nothing repeated");
    assert!(quiet, "no entry beyond the last written");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tail_of_a_quiet_partition_survives_restarts_further_apart_than_its_retry_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let beats = ["--follower-heartbeat-ms", "200"];
    let mut server = FixedServer::start(dir.path(), port, &beats);
    let retry = Duration::from_secs(5);
    let client = Client::builder([url.as_str()])
        .retry_timeout(retry)
        .build()
        .unwrap();
    client.submit(&note(0)).await.unwrap();
    let mut tail = Box::pin(client.follow(1, 1));
    assert_eq!(offsets(&mut tail, 1).await, vec![1]);
    let reader = tokio::spawn(async move { offsets(&mut tail, 1).await });
    for _ in 0..2 {
        server.kill();
        tokio::time::sleep(Duration::from_millis(300)).await;
        server = FixedServer::start(dir.path(), port, &beats);
        // Reconnected, and quiet (heartbeats only) for longer than the retry timeout: the
        // outage is over, and the next one gets a retry timeout of its own.
        tokio::time::sleep(retry + Duration::from_secs(1)).await;
    }
    client.submit(&note(1)).await.unwrap();
    assert_eq!(reader.await.unwrap(), vec![2], "resumed after both outages");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn monoseq_tail_prints_each_event_as_one_json_line_and_stops_at_max_events() {
    let dir = tempfile::tempdir().unwrap();
    let server =
        Server::start_ready(dir.path(), &["--partitions", "4"], &reqwest::Client::new()).await;
    let client = Client::new(&server.url).unwrap();
    for k in 0..4 {
        client.submit(&note(k)).await.unwrap();
    }
    let url = server.url.clone();
    let out = tokio::task::spawn_blocking(move || {
        common::run(&[
            "tail",
            "--url",
            &url,
            "--partition",
            "1",
            "--from",
            "2",
            "--max-events",
            "3",
        ])
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON value a line"))
        .collect();
    let offsets: Vec<u64> = lines
        .iter()
        .map(|l| l["plog_offset"].as_u64().unwrap())
        .collect();
    assert_eq!(offsets, vec![2, 3, 4]);
    assert_eq!(lines[0]["command"], "app.Note");
}

/// `monoseq tail` of partition 1 of `url` with `--retry-timeout-secs secs`, its stdout lines
/// sent to the receiver.
fn tail_process(
    url: &str,
    secs: &str,
) -> (
    std::process::Child,
    tokio::sync::mpsc::UnboundedReceiver<String>,
) {
    use std::io::BufRead;
    let mut child = std::process::Command::new(common::BIN)
        .args(["tail", "--url", url, "--partition", "1"])
        .args(["--retry-timeout-secs", secs])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let (sent, lines) = tokio::sync::mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for line in stdout.lines().map_while(Result::ok) {
            let _ = sent.send(line);
        }
    });
    (child, lines)
}

/// The PLog offset of the next line a `monoseq tail` printed.
async fn printed(lines: &mut tokio::sync::mpsc::UnboundedReceiver<String>) -> u64 {
    let line = tokio::time::timeout(ENTRY_BOUND, lines.recv())
        .await
        .expect("a line in time")
        .expect("the tail still prints");
    serde_json::from_str::<Value>(&line).unwrap()["plog_offset"]
        .as_u64()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn monoseq_tail_gives_up_after_its_retry_timeout_and_with_0_waits_out_any_outage() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let mut server = FixedServer::start(dir.path(), port, &[]);
    let client = Client::new(&url).unwrap();
    client.submit(&note(0)).await.unwrap();
    let (mut brief, mut brief_lines) = tail_process(&url, "1");
    let (mut patient, mut patient_lines) = tail_process(&url, "0");
    assert_eq!(printed(&mut brief_lines).await, 1);
    assert_eq!(printed(&mut patient_lines).await, 1);
    server.kill();
    // An outage well past the brief tail's second: it gives up, with an error.
    let deadline = std::time::Instant::now() + ENTRY_BOUND;
    let status = loop {
        if let Some(status) = brief.try_wait().unwrap() {
            break status;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "a tail with a 1 s retry timeout outlived a long outage"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(!status.success());
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        patient.try_wait().unwrap().is_none(),
        "a tail with --retry-timeout-secs 0 gave up"
    );
    let _server = FixedServer::start(dir.path(), port, &[]);
    client.submit(&note(1)).await.unwrap();
    assert_eq!(printed(&mut patient_lines).await, 2);
    let _ = patient.kill();
    let _ = patient.wait();
}
