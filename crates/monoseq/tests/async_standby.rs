//! The database going back in time under three nodes, two ways: a primary whose standby is
//! **asynchronous** (replication stalled while commands are acknowledged, the primary killed
//! and the standby promoted), and a **base backup restored** (`pg_basebackup` taken under
//! load, more commands acknowledged, the server restored from the backup). The nodes' own marks
//! (`--marks-dir`) notice it: no number is acknowledged twice, the lost partitions are refused
//! and named in `/readyz` and the log, and after a restart with `--accept-loss` the nodes serve
//! again above the loss (after retrying the retirement of the lost numbers, when the database
//! refused it at first).

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::keyed::{self, Load, Plan, assert_once};
use common::node::Node;
use monoseq_pg::testing::{DATABASE, PgCluster, PgPair};
use serde_json::Value;

/// How long a client keeps retrying one command before giving it up (a refused partition).
const GIVE_UP: Duration = Duration::from_secs(3);

/// `clients` clients sending through the nodes of `urls`, keys prefixed `round`; a command
/// refused for `GIVE_UP` is given up. Beside 503s, a refused partition's 500 (`corrupted`) is
/// retried: a node that kept its lease through the loss has its next write fenced off by the
/// lease row's write count, so it never writes on what the database lost (no
/// `sequence_violation` either).
fn start_load(urls: &keyed::Urls, clients: u64, round: &str) -> Load {
    let plan = Plan {
        give_up: Some(GIVE_UP),
        retried: &["corrupted"],
        ..Plan::default()
    };
    Load::start_with(urls, clients, round, plan)
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
    let urls = keyed::urls(&common::node::urls_of(&nodes));
    wait_ready(&client, &nodes[..1]).await;

    let load = start_load(&urls, 6, "first");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let p = Arc::clone(&pair);
    tokio::task::spawn_blocking(move || p.stall_replication().unwrap())
        .await
        .unwrap();
    let stalled_at = load.acked();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let unreplicated = load.acked() - stalled_at;
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
    let first = load.stop().await.0;
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
        n.terminate(Duration::from_secs(30));
    }
    let nodes = start_nodes(&db, &ids, dir.path(), &["--accept-loss"]);
    *urls.lock().unwrap() = common::node::urls_of(&nodes);
    wait_ready(&client, &nodes).await;
    assert!(
        nodes.iter().any(|n| n.log().contains("loss accepted")),
        "no node logged the accepted loss"
    );
    let load = start_load(&urls, 6, "second");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let second = load.stop().await.0;
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
        n.terminate(Duration::from_secs(30));
    }
}

/// Starts one node per name on `db`, each with its own marks directory under `dir`.
fn start_nodes(db: &str, ids: &[&str], dir: &Path, extra: &[&str]) -> Vec<Node> {
    ids.iter()
        .map(|id| Node::on(db, id, dir).kept_marks().args(extra).start())
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
    let urls = keyed::urls(&common::node::urls_of(&nodes));
    wait_ready(&client, &nodes[..1]).await;

    // A base backup taken under load, then more commands acknowledged after it.
    let load = start_load(&urls, 6, "first");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let c = Arc::clone(&cluster);
    let backup = tokio::task::spawn_blocking(move || c.base_backup("backup").unwrap())
        .await
        .unwrap();
    let at_backup = load.acked();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let first = load.stop().await.0;
    assert!(
        first.len() > at_backup,
        "nothing was acknowledged after the backup"
    );
    for n in nodes {
        n.terminate(Duration::from_secs(30));
    }

    // The operator restores the database from the backup and starts the nodes again: the
    // partitions whose acknowledged events the backup lacks are refused.
    let c = Arc::clone(&cluster);
    tokio::task::spawn_blocking(move || c.restore(&backup).unwrap())
        .await
        .unwrap();
    let nodes = start_nodes(&db, &ids, dir.path(), &[]);
    *urls.lock().unwrap() = common::node::urls_of(&nodes);
    let refused = wait_refused(&client, &nodes).await;
    let (node, why) = &refused[0];
    assert!(
        why.contains("were acknowledged") && why.contains("--accept-loss"),
        "{node}: {why}"
    );
    // Commands for a refused partition are refused too, not applied on the old state.
    let probe = start_load(&urls, 3, "refused");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let during = probe.stop().await.0;
    let mut all = first.clone();
    all.extend(during.iter().cloned());
    assert_once(&all);

    // The operator's decision: every node restarted with --accept-loss. The database refuses
    // writes at first: retiring the lost numbers fails, is logged, and is retried until the
    // database takes writes again.
    for n in nodes {
        n.terminate(Duration::from_secs(30));
    }
    refuse_data_writes(&cluster, true);
    let nodes = start_nodes(&db, &ids, dir.path(), &["--accept-loss"]);
    *urls.lock().unwrap() = common::node::urls_of(&nodes);
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
    let second = load.stop().await.0;
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
        n.terminate(Duration::from_secs(30));
    }
}
