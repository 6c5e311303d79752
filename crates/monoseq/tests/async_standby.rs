//! The database going back in time under three nodes, two ways: a primary whose standby is
//! **asynchronous** (replication stalled while commands are acknowledged, the primary killed
//! and the standby promoted), and a **base backup restored** (`pg_basebackup` taken under
//! load, more commands acknowledged, the server restored from the backup). The nodes' own marks
//! (`--marks-dir`) notice it: no number is acknowledged twice, the lost partitions are refused
//! and named in `/readyz` and the log, and after a restart with `--accept-loss` the nodes serve
//! again above the loss (after retrying the retirement of the lost numbers, when the database
//! refused it at first).

mod common;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::BIN;
use monoseq_pg::testing::{DATABASE, PgCluster, PgPair};
use serde_json::{Value, json};

const PARTITIONS: u64 = 6;
/// How long a client keeps retrying one command before giving it up (a refused partition).
const GIVE_UP: Duration = Duration::from_secs(3);

struct Node {
    id: String,
    child: Child,
    url: String,
    log: PathBuf,
}

impl Node {
    fn start(db: &str, id: &str, dir: &Path, extra: &[&str]) -> Node {
        let log = dir.join(format!("{id}.log"));
        let marks = dir.join(format!("marks-{id}"));
        let mut child = Command::new(BIN)
            .args(["serve", "--storage", db, "--listen", "127.0.0.1:0"])
            .args([
                "--node-id",
                id,
                "--lease-ms",
                "1500",
                "--lease-renew-ms",
                "300",
            ])
            .args(["--partitions", &PARTITIONS.to_string()])
            .args(["--marks-dir", &marks.display().to_string()])
            .args(extra)
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdout(Stdio::piped())
            .stderr(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&log)
                    .unwrap(),
            )
            .spawn()
            .unwrap();
        let url = common::listening_url(&mut child, &log);
        Node {
            id: id.to_owned(),
            child,
            url,
            log,
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn terminate(mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.child.try_wait().unwrap().is_none() {
            assert!(Instant::now() < deadline, "{} did not stop", self.id);
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[derive(Debug, Clone)]
struct Ack {
    ws: u64,
    partition: u64,
    plog: u64,
    wlog: u64,
    id: u64,
}

type Urls = Arc<Mutex<Vec<String>>>;

/// Sends one keyed command until acknowledged (`Some`) or given up after [`GIVE_UP`] of
/// refusals (`None`); any answer but 200, 503 and a refused partition's 500 fails the test.
async fn send(client: &reqwest::Client, urls: &Urls, ws: u64, key: &str, n: u64) -> Option<Ack> {
    let began = Instant::now();
    let mut attempt = n as usize;
    while began.elapsed() < GIVE_UP {
        attempt += 1;
        let url = {
            let urls = urls.lock().unwrap();
            urls[attempt % urls.len()].clone()
        };
        let body = json!({
            "ws": ws, "ws_kind": 1, "command": "t.Create",
            "create": [{"raw_id": 1, "kind": "CDoc", "name": "t.Doc", "fields": {"n": n}}],
        });
        let answer = client
            .post(format!("{url}/v1/commands"))
            .header("idempotency-key", key)
            .json(&body)
            .send()
            .await;
        let Ok(answer) = answer else {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        };
        let status = answer.status().as_u16();
        let body: Value = answer.json().await.unwrap_or(Value::Null);
        match status {
            200 => {
                return Some(Ack {
                    ws,
                    partition: body["partition"].as_u64().unwrap(),
                    plog: body["plog_offset"].as_u64().unwrap(),
                    wlog: body["wlog_offset"].as_u64().unwrap(),
                    id: body["ids"]["1"].as_u64().unwrap(),
                });
            }
            503 => tokio::time::sleep(Duration::from_millis(20)).await,
            // A refused partition. (A node that kept its lease through the loss has its next
            // write fenced off by the lease row's write count, so it never writes on what the
            // database lost: no `sequence_violation` either.)
            500 if body["code"] == "corrupted" => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            other => panic!("a client got a wrong answer {other}: {body}"),
        }
    }
    None
}

struct Load {
    acks: Arc<Mutex<Vec<Ack>>>,
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

fn start_load(urls: &Urls, clients: u64, round: &str) -> Load {
    let acks: Arc<Mutex<Vec<Ack>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let tasks = (0..clients)
        .map(|c| {
            let (urls, acks, stop) = (Arc::clone(urls), Arc::clone(&acks), Arc::clone(&stop));
            let round = round.to_owned();
            tokio::spawn(async move {
                let client = reqwest::Client::builder()
                    .timeout(Duration::from_secs(10))
                    .build()
                    .unwrap();
                let mut n = 0;
                while !stop.load(Ordering::SeqCst) {
                    n += 1;
                    let ws = (c * 7 + n) % 24 + 1;
                    let key = format!("{round}-c{c}-{n}");
                    match send(&client, &urls, ws, &key, n).await {
                        Some(ack) => acks.lock().unwrap().push(ack),
                        None => eprintln!("gave up {key} (workspace {ws})"),
                    }
                }
            })
        })
        .collect();
    Load { acks, stop, tasks }
}

impl Load {
    async fn stop(self) -> Vec<Ack> {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.tasks {
            t.await.expect("a client saw a wrong answer");
        }
        self.acks.lock().unwrap().clone()
    }

    fn count(&self) -> usize {
        self.acks.lock().unwrap().len()
    }
}

/// No PLog offset, WLog offset or record ID acknowledged twice.
fn assert_once(acks: &[Ack]) {
    let (mut plogs, mut wlogs, mut ids) = (HashSet::new(), HashSet::new(), HashSet::new());
    for a in acks {
        assert!(
            plogs.insert((a.partition, a.plog)),
            "PLog offset twice: {a:?}"
        );
        assert!(wlogs.insert((a.ws, a.wlog)), "WLog offset twice: {a:?}");
        assert!(ids.insert((a.ws, a.id)), "record ID twice: {a:?}");
    }
}

async fn readyz(client: &reqwest::Client, url: &str) -> (u16, Value) {
    match client.get(format!("{url}/readyz")).send().await {
        Ok(r) => {
            let status = r.status().as_u16();
            (status, r.json().await.unwrap_or(Value::Null))
        }
        Err(_) => (0, Value::Null),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_promoted_asynchronous_standby_that_lost_acknowledged_commands_is_refused_then_accepted()
{
    let pair = tokio::task::spawn_blocking(|| {
        let pair = PgPair::start().unwrap_or_else(|e| panic!("{e}"));
        // Asynchronous replication: commits return without waiting for the standby.
        let primary = pair.primary();
        primary
            .psql(
                "postgres",
                "ALTER SYSTEM SET synchronous_standby_names = ''",
            )
            .unwrap();
        primary.psql("postgres", "SELECT pg_reload_conf()").unwrap();
        let began = Instant::now();
        while primary
            .psql(
                "postgres",
                "SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'async'",
            )
            .unwrap()
            != "1"
        {
            assert!(
                began.elapsed() < Duration::from_secs(30),
                "never asynchronous"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        pair
    })
    .await
    .unwrap();
    let pair = Arc::new(pair);
    let db = pair.url(DATABASE);
    let dir = tempfile::tempdir().unwrap();
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let ids = ["a1", "a2", "a3"];
    let nodes = start_nodes(&db, &ids, dir.path(), &[]);
    let urls: Urls = Arc::new(Mutex::new(nodes.iter().map(|n| n.url.clone()).collect()));
    wait_ready(&client, &nodes[..1]).await;

    let load = start_load(&urls, 6, "first");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let p = Arc::clone(&pair);
    tokio::task::spawn_blocking(move || p.stall_replication().unwrap())
        .await
        .unwrap();
    let stalled_at = load.count();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let unreplicated = load.count() - stalled_at;
    assert!(
        unreplicated > 0,
        "nothing was acknowledged while replication stalled"
    );
    let p = Arc::clone(&pair);
    tokio::task::spawn_blocking(move || {
        p.kill_primary().unwrap();
        p.promote_standby().unwrap();
    })
    .await
    .unwrap();

    // The nodes reconnect to the promoted standby; partitions that lost events are refused.
    let refused = wait_refused(&client, &nodes).await;
    let first = load.stop().await;
    eprintln!(
        "{} acknowledged ({unreplicated} while replication stalled); refused: {refused:?}",
        first.len()
    );
    assert_once(&first);
    let (node, why) = &refused[0];
    assert!(
        why.contains("were acknowledged") && why.contains("--accept-loss"),
        "{node}: {why}"
    );
    let logged = nodes.iter().any(|n| {
        n.log()
            .lines()
            .any(|l| l.contains("ERROR") && l.contains("is refused") && l.contains("--accept-loss"))
    });
    assert!(
        logged,
        "no node logged the refusal with the command that continues"
    );

    // The operator's decision: every node restarted with --accept-loss.
    for n in nodes {
        n.terminate();
    }
    let nodes = start_nodes(&db, &ids, dir.path(), &["--accept-loss"]);
    *urls.lock().unwrap() = nodes.iter().map(|n| n.url.clone()).collect();
    wait_ready(&client, &nodes).await;
    assert!(
        nodes.iter().any(|n| n.log().contains("loss accepted")),
        "no node logged the accepted loss"
    );
    let load = start_load(&urls, 6, "second");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let second = load.stop().await;
    assert!(
        !second.is_empty(),
        "nothing acknowledged after --accept-loss"
    );
    let mut all = first.clone();
    all.extend(second.iter().cloned());
    assert_once(&all);
    eprintln!(
        "{} acknowledged after --accept-loss, none twice",
        second.len()
    );
    for n in &nodes {
        eprintln!("{}", warnings(n, usize::MAX));
    }
    for n in nodes {
        n.terminate();
    }
}

/// Starts one node per name on `db`, each with its own marks directory under `dir`.
fn start_nodes(db: &str, ids: &[&str], dir: &Path, extra: &[&str]) -> Vec<Node> {
    ids.iter()
        .map(|id| Node::start(db, id, dir, extra))
        .collect()
}

/// Waits until every one of `nodes` answers `/readyz` 200.
async fn wait_ready(client: &reqwest::Client, nodes: &[Node]) {
    let deadline = Instant::now() + Duration::from_secs(40);
    for n in nodes {
        while readyz(client, &n.url).await.0 != 200 {
            assert!(Instant::now() < deadline, "{} never ready", n.id);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// Waits until some partition is refused below its marks; the refusals, by node.
async fn wait_refused(client: &reqwest::Client, nodes: &[Node]) -> Vec<(String, String)> {
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        let refused = refused_partitions(client, nodes).await;
        if !refused.is_empty() {
            return refused;
        }
        if Instant::now() >= deadline {
            let logs: Vec<String> = nodes.iter().map(|n| warnings(n, 20)).collect();
            panic!("no partition was refused within 40 s\n{}", logs.join("\n"));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The last `n` WARN and ERROR lines of `node`'s log, each prefixed with its name.
fn warnings(node: &Node, n: usize) -> String {
    let log = node.log();
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("WARN") || l.contains("ERROR"))
        .collect();
    let tail = &lines[lines.len().saturating_sub(n)..];
    tail.iter()
        .map(|l| format!("{}: {l}", node.id))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Partitions whose readiness reason says they are refused below their marks, by node.
async fn refused_partitions(client: &reqwest::Client, nodes: &[Node]) -> Vec<(String, String)> {
    let mut refused = Vec::new();
    for n in nodes {
        let (status, body) = readyz(client, &n.url).await;
        if status != 503 {
            continue;
        }
        for part in body["partitions"].as_array().into_iter().flatten() {
            let why = part["reason"].as_str().unwrap_or_default();
            if why.starts_with("refused:") {
                refused.push((n.id.clone(), why.to_owned()));
            }
        }
    }
    refused
}

/// Makes PostgreSQL refuse every write of the store's data (`on`) or take them again (`off`):
/// a storage failure the nodes meet while retiring an accepted loss's numbers.
fn refuse_data_writes(cluster: &PgCluster, on: bool) {
    let sql = if on {
        "CREATE FUNCTION refuse_writes() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE \
         EXCEPTION 'data writes refused for the test'; END $$; CREATE TRIGGER refuse_writes \
         BEFORE INSERT OR UPDATE OR DELETE ON monoseq_kv FOR EACH ROW EXECUTE FUNCTION \
         refuse_writes()"
    } else {
        "DROP TRIGGER refuse_writes ON monoseq_kv; DROP FUNCTION refuse_writes()"
    };
    cluster.psql(DATABASE, sql).unwrap();
}

/// Waits until some node's log holds a line containing every one of `words`.
async fn wait_logged(nodes: &[Node], words: &[&str]) {
    let deadline = Instant::now() + Duration::from_secs(40);
    while !nodes
        .iter()
        .any(|n| n.log().lines().any(|l| words.iter().all(|w| l.contains(w))))
    {
        assert!(Instant::now() < deadline, "no node logged {words:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restored_database_is_refused_until_the_loss_is_accepted_and_a_failed_retirement_is_retried()
 {
    let cluster = Arc::new(
        tokio::task::spawn_blocking(|| PgCluster::start().unwrap_or_else(|e| panic!("{e}")))
            .await
            .unwrap(),
    );
    let db = cluster.url(DATABASE);
    let dir = tempfile::tempdir().unwrap();
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let ids = ["b1", "b2", "b3"];
    let nodes = start_nodes(&db, &ids, dir.path(), &[]);
    let urls: Urls = Arc::new(Mutex::new(nodes.iter().map(|n| n.url.clone()).collect()));
    wait_ready(&client, &nodes[..1]).await;

    // A base backup taken under load, then more commands acknowledged after it.
    let load = start_load(&urls, 6, "first");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let c = Arc::clone(&cluster);
    let backup = tokio::task::spawn_blocking(move || c.base_backup("backup").unwrap())
        .await
        .unwrap();
    let at_backup = load.count();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let first = load.stop().await;
    assert!(
        first.len() > at_backup,
        "nothing was acknowledged after the backup"
    );
    for n in nodes {
        n.terminate();
    }

    // The operator restores the database from the backup and starts the nodes again: the
    // partitions whose acknowledged events the backup lacks are refused.
    let c = Arc::clone(&cluster);
    tokio::task::spawn_blocking(move || c.restore(&backup).unwrap())
        .await
        .unwrap();
    let nodes = start_nodes(&db, &ids, dir.path(), &[]);
    *urls.lock().unwrap() = nodes.iter().map(|n| n.url.clone()).collect();
    let refused = wait_refused(&client, &nodes).await;
    let (node, why) = &refused[0];
    assert!(
        why.contains("were acknowledged") && why.contains("--accept-loss"),
        "{node}: {why}"
    );
    // Commands for a refused partition are refused too, not applied on the old state.
    let probe = start_load(&urls, 3, "refused");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let during = probe.stop().await;
    let mut all = first.clone();
    all.extend(during.iter().cloned());
    assert_once(&all);

    // The operator's decision: every node restarted with --accept-loss. The database refuses
    // writes at first: retiring the lost numbers fails, is logged, and is retried until the
    // database takes writes again.
    for n in nodes {
        n.terminate();
    }
    refuse_data_writes(&cluster, true);
    let nodes = start_nodes(&db, &ids, dir.path(), &["--accept-loss"]);
    *urls.lock().unwrap() = nodes.iter().map(|n| n.url.clone()).collect();
    wait_logged(
        &nodes,
        &["ERROR", "accepted loss failed", "data writes refused"],
    )
    .await;
    refuse_data_writes(&cluster, false);
    wait_ready(&client, &nodes).await;
    wait_logged(
        &nodes,
        &["moved the partition's next PLog offset past its accepted loss"],
    )
    .await;
    let load = start_load(&urls, 6, "second");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let second = load.stop().await;
    assert!(
        !second.is_empty(),
        "nothing acknowledged after --accept-loss"
    );
    all.extend(second.iter().cloned());
    assert_once(&all);
    eprintln!(
        "{} acknowledged before the restore ({} after the backup), {} refused, {} after \
         --accept-loss, none twice",
        first.len(),
        first.len() - at_backup,
        refused.len(),
        second.len()
    );
    for n in nodes {
        n.terminate();
    }
}
