//! The server on a real PostgreSQL server (a private cluster this test binary starts): the
//! database going away under load and coming back — commands answer 503 with `Retry-After`
//! meanwhile, `/readyz` says so, the server serves again on its own, no acknowledged event is
//! lost and no number handed out twice, and `verify` passes — and clear refusals at start for
//! a malformed or unreachable connection string, wrong credentials, and a database written by
//! a newer schema or holding another partition count.

mod common;

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{Backend, Server};
use monoseq_pg::testing::PgCluster;
use serde_json::{Value, json};

fn command(ws: u64, n: u64) -> Value {
    json!({
        "ws": ws, "ws_kind": 1, "command": "pg.Create",
        "create": [{"raw_id": 1, "kind": "CDoc", "name": "pg.Doc", "fields": {"n": n}}],
    })
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .expect("client")
}

/// (partition, PLog offset, workspace, WLog offset, record ID) of every acknowledged command.
type Acks = Arc<Mutex<Vec<(u64, u64, u64, u64, u64)>>>;

#[derive(Default)]
struct Seen {
    unavailable: usize,
    retry_after: bool,
}

async fn load(url: String, acks: Acks, seen: Arc<Mutex<Seen>>, stop: Arc<AtomicBool>, c: u64) {
    let client = client();
    let mut n = 0;
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        let ws = (c + n) % 8 + 1;
        let Ok(r) = client
            .post(format!("{url}/v1/commands"))
            .json(&command(ws, n))
            .send()
            .await
        else {
            continue;
        };
        let status = r.status().as_u16();
        let retry_after = r.headers().contains_key("retry-after");
        let v: Value = r.json().await.unwrap_or(Value::Null);
        match status {
            200 => acks.lock().unwrap().push((
                v["partition"].as_u64().unwrap(),
                v["plog_offset"].as_u64().unwrap(),
                ws,
                v["wlog_offset"].as_u64().unwrap(),
                v["ids"]["1"].as_u64().unwrap(),
            )),
            503 => {
                {
                    let mut s = seen.lock().unwrap();
                    s.unavailable += 1;
                    s.retry_after |= retry_after;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            other => panic!("answer {other} during an outage: {v}"),
        }
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
async fn the_database_going_away_under_load_loses_nothing_and_the_server_heals_alone() {
    let cluster = PgCluster::start().expect("a private PostgreSQL cluster");
    let url = cluster.create_database().expect("a database");
    let backend = Backend::Postgres(url.clone());
    let dir = tempfile::tempdir().expect("temporary directory");
    let client = client();
    let args = ["--partitions", "2", "--storage", &url];
    let server = Server::start_ready(dir.path(), &args, &client).await;
    let acks: Acks = Arc::default();
    let seen: Arc<Mutex<Seen>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..6)
        .map(|c| {
            let (acks, seen, stop) = (Arc::clone(&acks), Arc::clone(&seen), Arc::clone(&stop));
            tokio::spawn(load(server.url.clone(), acks, seen, stop, c))
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = acks.lock().unwrap().len();
    assert!(before > 0, "load before the outage");
    cluster.stop_server().expect("stop PostgreSQL");
    // While it is away: busy answers with Retry-After, and readiness says not ready.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut not_ready = false;
    while Instant::now() < deadline && !(not_ready && seen.lock().unwrap().unavailable > 0) {
        not_ready |= readyz(&client, &server.url).await.0 == 503;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        not_ready,
        "/readyz answered ready while the database was away"
    );
    cluster.start_server().expect("start PostgreSQL again");
    let deadline = Instant::now() + Duration::from_secs(60);
    let during = acks.lock().unwrap().len();
    while acks.lock().unwrap().len() < during + 50 {
        assert!(
            Instant::now() < deadline,
            "the server did not serve again on its own"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.await.expect("a client saw a wrong answer");
    }
    let (unavailable, retry_after) = {
        let seen = seen.lock().unwrap();
        (seen.unavailable, seen.retry_after)
    };
    assert!(
        unavailable > 0 && retry_after,
        "busy answers carry Retry-After"
    );
    let acks = acks.lock().unwrap().clone();
    let (mut plogs, mut wlogs, mut ids) = (HashSet::new(), HashSet::new(), HashSet::new());
    for &(p, plog, ws, wlog, id) in &acks {
        assert!(plogs.insert((p, plog)), "PLog offset {plog} of {p} twice");
        assert!(wlogs.insert((ws, wlog)), "WLog offset {wlog} of {ws} twice");
        assert!(ids.insert((ws, id)), "record ID {id} of {ws} twice");
    }
    for &(p, plog, ws, wlog, _) in &acks {
        let e: Value = client
            .get(format!("{}/v1/partitions/{p}/events/{plog}", server.url))
            .send()
            .await
            .expect("read")
            .json()
            .await
            .expect("json");
        assert_eq!(
            (e["ws"].as_u64(), e["wlog_offset"].as_u64()),
            (Some(ws), Some(wlog))
        );
    }
    assert!(server.terminate(Duration::from_secs(20)).success());
    let verify = backend.verify(dir.path());
    assert!(
        verify.status.success(),
        "{}{}",
        String::from_utf8_lossy(&verify.stdout),
        String::from_utf8_lossy(&verify.stderr)
    );
}

fn refused(args: &[&str]) -> String {
    let dir = tempfile::tempdir().expect("temporary directory");
    let log = dir.path().join("log");
    match Server::try_start(&dir.path().join("data"), args, &log) {
        Ok(_) => panic!("the server started with {args:?}"),
        Err(stderr) => stderr,
    }
}

#[test]
fn bad_connection_strings_and_credentials_are_refused_at_start_with_what_is_wrong() {
    let err = refused(&["--storage", "mysql://localhost/db"]);
    assert!(err.contains("unknown storage"), "{err}");
    let port = monoseq_pg::testing::free_port().expect("a free port");
    let err = refused(&[
        "--storage",
        &format!("postgres://nobody@127.0.0.1:{port}/db"),
    ]);
    assert!(
        err.contains("refusing to start") && err.contains("connect"),
        "{err}"
    );
    let cluster = PgCluster::shared().expect("a private PostgreSQL cluster");
    let url = cluster.create_database().expect("a database");
    let wrong = url.replacen(monoseq_pg::testing::PASSWORD, "not-the-password", 1);
    assert_ne!(wrong, url);
    let err = refused(&["--storage", &wrong]);
    assert!(
        err.contains("refusing to start") && err.contains("password"),
        "{err}"
    );
    assert!(
        !err.contains("not-the-password"),
        "a password is never logged: {err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_of_a_newer_schema_or_another_partition_count_is_refused() {
    let cluster = PgCluster::shared().expect("a private PostgreSQL cluster");
    let url = cluster.create_database().expect("a database");
    let dir = tempfile::tempdir().expect("temporary directory");
    let client = client();
    let server = Server::start_ready(
        dir.path(),
        &["--partitions", "2", "--storage", &url],
        &client,
    )
    .await;
    assert!(server.terminate(Duration::from_secs(20)).success());
    let err = refused(&["--partitions", "3", "--storage", &url]);
    assert!(err.contains("holds 2 partitions"), "{err}");
    let db = url.rsplit('/').next().expect("a database name");
    cluster
        .psql(
            db,
            "UPDATE public.monoseq_meta SET value = 99 WHERE name = 'schema_version'",
        )
        .expect("raise the schema version");
    let err = refused(&["--storage", &url]);
    assert!(err.contains("version 99"), "{err}");
}

fn monoseq(args: &[&str]) -> (bool, String) {
    let out = common::run(args);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_seq_and_bench_work_on_postgres() {
    let cluster = PgCluster::shared().expect("a private PostgreSQL cluster");
    let url = cluster.create_database().expect("a database");
    let dir = tempfile::tempdir().expect("temporary directory");
    let client = client();
    let server = Server::start_ready(
        dir.path(),
        &["--partitions", "2", "--storage", &url],
        &client,
    )
    .await;
    for ws in 1..=4 {
        let r = client
            .post(format!("{}/v1/commands", server.url))
            .json(&command(ws, 1))
            .send()
            .await
            .expect("send");
        assert_eq!(r.status().as_u16(), 200);
    }
    assert!(server.terminate(Duration::from_secs(20)).success());
    let (ok, text) = monoseq(&["inspect", "--storage", &url, "--full"]);
    assert!(ok, "{text}");
    assert!(
        text.contains("partitions: 2") && text.contains("postgres://"),
        "{text}"
    );
    assert!(
        !text.contains(monoseq_pg::testing::PASSWORD),
        "no password shown: {text}"
    );
    let (ok, text) = monoseq(&["seq", "--storage", &url, "next", "orders/invoice"]);
    assert!(ok, "{text}");
    assert_eq!(text.trim(), "1");
    let (ok, text) = monoseq(&["seq", "--storage", &url, "get", "orders/invoice"]);
    assert_eq!((ok, text.trim()), (true, "2"));
    let (ok, text) = monoseq(&[
        "bench",
        "--storage",
        &url,
        "--seconds",
        "1",
        "--clients",
        "4",
    ]);
    assert!(ok && text.contains("mode=in-process"), "{text}");
    let (ok, text) = monoseq(&["verify", "--storage", &url]);
    assert!(ok, "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_answers_while_the_storage_opens_and_readiness_says_it_is_not_ready() {
    let cluster = PgCluster::start().unwrap_or_else(|e| panic!("{e}"));
    let url = cluster.url(monoseq_pg::testing::DATABASE);
    let pid: String = std::fs::read_to_string(cluster.data_dir().unwrap().join("postmaster.pid"))
        .unwrap()
        .lines()
        .next()
        .unwrap()
        .to_owned();
    // A paused database: the server's connection waits in its handshake, so opening lasts.
    let signal = |s: &str| {
        assert!(
            std::process::Command::new("kill")
                .args([s, &pid])
                .status()
                .unwrap()
                .success()
        );
    };
    signal("-STOP");
    let port = monoseq_pg::testing::free_port().unwrap();
    let listen = format!("127.0.0.1:{port}");
    let dir = tempfile::tempdir().unwrap();
    let mut child = std::process::Command::new(common::BIN)
        .args(["serve", "--storage", &url, "--listen", &listen])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .current_dir(dir.path())
        .spawn()
        .unwrap();
    let base = format!("http://{listen}");
    let client = client();
    let deadline = Instant::now() + Duration::from_secs(20);
    let health = loop {
        if let Ok(r) = client.get(format!("{base}/healthz")).send().await {
            break r.status();
        }
        assert!(Instant::now() < deadline, "no answer while opening");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(health, 200);
    let (status, body) = readyz(&client, &base).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["code"], "not_ready", "{body}");
    let refused = client
        .post(format!("{base}/v1/commands"))
        .json(&command(1, 1))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 503);
    assert!(refused.headers().contains_key("retry-after"));

    signal("-CONT");
    let deadline = Instant::now() + Duration::from_secs(60);
    while readyz(&client, &base).await.0 != 200 {
        assert!(
            Instant::now() < deadline,
            "never ready once the database answered"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let ok = client
        .post(format!("{base}/v1/commands"))
        .json(&command(1, 2))
        .send()
        .await
        .unwrap();
    assert_eq!(ok.status(), 200);
    let _ = child.kill();
    let _ = child.wait();
}

/// A command of workspace 3 with no records (only its event and WLog entry).
fn bare(n: u64) -> monoseq_cp::Command {
    monoseq_cp::Command {
        ws: 3,
        ws_kind: 1,
        command: format!("pg.Bare{n}"),
        create: Vec::new(),
        update: Vec::new(),
        argument: None,
        expected_wlog_offset: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_after_a_commit_whose_answer_was_lost_is_answered_from_the_landed_event() {
    use monoseq_cp::{CommandProcessor, Config, IdempotencyKey};
    use monoseq_pg::testing::{DATABASE, PgPair};
    use monoseq_pg::{PgOptions, PgStore};
    use monoseq_store::{AppId, EventStore, TrustLevel};

    let pair = PgPair::start().unwrap_or_else(|e| panic!("{e}"));
    let options = PgOptions::default()
        .connect_timeout(Duration::from_secs(1))
        .statement_timeout(Duration::from_secs(2));
    let kv = Arc::new(PgStore::open(&pair.url(DATABASE), options).expect("open"));
    let store = EventStore::new(kv, AppId(1), TrustLevel::Level0);
    let config = Config {
        partitions: 1,
        ..Config::default()
    };
    let cp = CommandProcessor::start(store, config).expect("start");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !cp.ready() {
        assert!(Instant::now() < deadline, "never ready: {:?}", cp.unready());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let key = |k: &str| Some(IdempotencyKey::new(k).expect("key"));
    let first = cp.submit_keyed(bare(0), key("a")).await.expect("first");
    // The standby stops confirming: the command's commit is written on the primary and
    // waits; the store gives up on its answer (3 s) and settles the write while the standby
    // comes back.
    pair.stall_replication().expect("stall");
    let pair = Arc::new(pair);
    let resumer = {
        let pair = Arc::clone(&pair);
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(3_800));
            pair.resume_replication()
        })
    };
    let lost = cp.submit_keyed(bare(1), key("b")).await;
    resumer.join().expect("resumer").expect("resume");
    let lost = lost.expect_err("the answer of the stalled commit is lost");
    assert!(lost.is_transient(), "{lost}");
    let deadline = Instant::now() + Duration::from_secs(30);
    let again = loop {
        match cp.submit_keyed(bare(1), key("b")).await {
            Ok(o) => break o,
            Err(e) if e.is_transient() && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("the retry was not answered: {e}"),
        }
    };
    assert!(
        again.replayed,
        "the lost commit had landed: the retry is answered from its event, not applied again \
         (offset {})",
        again.plog_offset
    );
    assert_eq!(again.plog_offset, first.plog_offset + 1);
    let next = cp.submit_keyed(bare(2), key("c")).await.expect("next");
    assert_eq!(next.plog_offset, first.plog_offset + 2);
    assert!(cp.shutdown(Duration::from_secs(10)).await);
}
