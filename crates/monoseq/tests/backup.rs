//! Backups under load: a backup is taken while clients write, the clients keep writing, the
//! server stops, and the backup is restored into new directories. Started as-is it is refused;
//! continued with the live marks, and (separately) with a margin, clients write again, and no
//! PLog offset, WLog offset or record ID is acknowledged twice across the whole history.

mod common;

use std::collections::HashSet;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::Server;
use serde_json::{Value, json};

const CLIENTS: u64 = 8;
const WORKSPACES: u64 = 20;

/// What a client was told, and when.
#[derive(Debug, Clone)]
struct Ack {
    ws: u64,
    partition: u64,
    plog: u64,
    wlog: u64,
    ids: Vec<u64>,
    at: Instant,
    took: Duration,
}

fn command(ws: u64, n: u64) -> Value {
    json!({
        "ws": ws, "ws_kind": 1, "command": "backup.Create",
        "create": [{"raw_id": 1, "kind": "CDoc", "name": "backup.Doc", "fields": {"n": n}},
                   {"raw_id": 2, "kind": "WRecord", "name": "backup.Row"}]
    })
}

/// Clients writing to `url` until `stop`; every acknowledgement lands in `acks`.
fn load(
    url: &str,
    acks: &Arc<Mutex<Vec<Ack>>>,
    stop: &Arc<AtomicBool>,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..CLIENTS)
        .map(|c| {
            let (url, acks, stop) = (url.to_owned(), Arc::clone(acks), Arc::clone(stop));
            tokio::spawn(async move {
                let client = reqwest::Client::builder()
                    .timeout(Duration::from_secs(10))
                    .build()
                    .unwrap();
                let mut n = c;
                while !stop.load(Ordering::Relaxed) {
                    let ws = n % WORKSPACES + 1;
                    n += CLIENTS;
                    let sent = Instant::now();
                    let r = client
                        .post(format!("{url}/v1/commands"))
                        .json(&command(ws, n))
                        .send()
                        .await
                        .expect("the server answers");
                    if r.status() == 503 {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                        continue;
                    }
                    let status = r.status();
                    let body: Value = r.json().await.expect("a JSON answer");
                    assert_eq!(status, 200, "{body}");
                    let ids = ["1", "2"]
                        .iter()
                        .map(|k| body["ids"][k].as_u64().unwrap())
                        .collect();
                    acks.lock().unwrap().push(Ack {
                        ws,
                        partition: body["partition"].as_u64().unwrap(),
                        plog: body["plog_offset"].as_u64().unwrap(),
                        wlog: body["wlog_offset"].as_u64().unwrap(),
                        ids,
                        at: Instant::now(),
                        took: sent.elapsed(),
                    });
                }
            })
        })
        .collect()
}

/// Runs the load on `url` for `secs`; every acknowledgement.
async fn write_for(url: &str, secs: Duration) -> Vec<Ack> {
    let acks = Arc::new(Mutex::new(Vec::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let tasks = load(url, &acks, &stop);
    tokio::time::sleep(secs).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.expect("a client");
    }
    Arc::try_unwrap(acks).unwrap().into_inner().unwrap()
}

/// Panics naming any PLog offset, WLog offset or record ID acknowledged twice.
fn assert_each_once(history: &[&[Ack]]) {
    let (mut plog, mut wlog, mut ids) = (HashSet::new(), HashSet::new(), HashSet::new());
    let mut n = 0;
    for a in history.iter().flat_map(|h| h.iter()) {
        n += 1;
        assert!(
            plog.insert((a.partition, a.plog)),
            "PLog offset acknowledged twice: {a:?}"
        );
        assert!(
            wlog.insert((a.ws, a.wlog)),
            "WLog offset acknowledged twice: {a:?}"
        );
        for id in &a.ids {
            assert!(
                ids.insert((a.ws, *id)),
                "record ID {id} acknowledged twice: {a:?}"
            );
        }
    }
    assert!(n > 0);
}

fn copy_dir(from: &Path, to: &Path) {
    let status = std::process::Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .status()
        .expect("cp");
    assert!(status.success());
}

fn verify(dir: &Path) {
    let out = common::run(&["verify", "--data-dir", dir.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "verify {}: {}{}",
        dir.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn percentile(mut v: Vec<Duration>, p: f64) -> Duration {
    if v.is_empty() {
        return Duration::ZERO;
    }
    v.sort();
    v[((v.len() - 1) as f64 * p) as usize]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_backup_restored_under_load_hands_out_no_number_twice() {
    let tmp = tempfile::tempdir().unwrap();
    let live = tmp.path().join("live");
    let server = Server::start(&live, &["--partitions", "4"]);
    let http = reqwest::Client::new();
    server.ready(&http).await;

    // Write, take a backup in the middle, keep writing.
    let acks = Arc::new(Mutex::new(Vec::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let tasks = load(&server.url, &acks, &stop);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let backup = tmp.path().join("backup");
    let (url, to) = (server.url.clone(), backup.clone());
    let began = Instant::now();
    let out = tokio::task::spawn_blocking(move || {
        common::run(&["backup", "--url", &url, "--to", to.to_str().unwrap()])
    })
    .await
    .unwrap();
    let ended = Instant::now();
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    tokio::time::sleep(Duration::from_millis(1500)).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }
    let before: Vec<Ack> = Arc::try_unwrap(acks).unwrap().into_inner().unwrap();
    assert!(server.terminate(Duration::from_secs(30)).success());

    // What commands saw while the backup ran, against the second before it.
    let during: Vec<Duration> = before
        .iter()
        .filter(|a| a.at >= began && a.at <= ended)
        .map(|a| a.took)
        .collect();
    let baseline: Vec<Duration> = before
        .iter()
        .filter(|a| a.at < began && a.at + Duration::from_secs(1) >= began)
        .map(|a| a.took)
        .collect();
    eprintln!(
        "backup: {said}commands during the backup ({:?}): {} answered, p50 {:?} p99 {:?} max {:?}; \
         the second before: {} answered, p50 {:?} p99 {:?} max {:?}",
        ended - began,
        during.len(),
        percentile(during.clone(), 0.5),
        percentile(during.clone(), 0.99),
        percentile(during.clone(), 1.0),
        baseline.len(),
        percentile(baseline.clone(), 0.5),
        percentile(baseline.clone(), 0.99),
        percentile(baseline.clone(), 1.0),
    );
    let after_backup = before.iter().filter(|a| a.at > ended).count();
    assert!(after_backup > 0, "nothing was written after the backup");

    // The copy is whole, and stamped.
    verify(&backup);
    assert!(backup.join("monoseq.backup").exists());

    // Restored as-is: refused, saying what to do.
    let restored = tmp.path().join("restored");
    copy_dir(&backup, &restored);
    let log = tmp.path().join("refused.log");
    let refused = Server::try_start(&restored, &[], &log)
        .err()
        .expect("a refused start");
    assert!(
        refused.contains("restored backup")
            && refused.contains("--marks-from")
            && refused.contains("--skip-ahead"),
        "{refused}"
    );

    // With the live marks.
    let log = tmp.path().join("marks.log");
    let marks = live.join("monoseq.marks");
    let server = Server::try_start(&restored, &["--marks-from", marks.to_str().unwrap()], &log)
        .expect("continued with the live marks");
    server.ready(&http).await;
    let again = write_for(&server.url, Duration::from_secs(1)).await;
    assert!(server.terminate(Duration::from_secs(30)).success());
    let said = std::fs::read_to_string(&log).unwrap();
    assert!(
        said.contains("restored backup continued with the live marks"),
        "{said}"
    );
    assert_each_once(&[&before, &again]);
    assert!(!restored.join("monoseq.backup").exists());
    verify(&restored);
    // The stamp is gone: the next start needs no flag.
    let server = Server::try_start(&restored, &[], &tmp.path().join("again.log"))
        .expect("a continued copy starts as any store");
    drop(server);

    // With a margin instead.
    let margin = tmp.path().join("margin");
    copy_dir(&backup, &margin);
    let log = tmp.path().join("margin.log");
    let server = Server::try_start(&margin, &["--skip-ahead", "1000000"], &log)
        .expect("continued with a margin");
    server.ready(&http).await;
    let again = write_for(&server.url, Duration::from_secs(1)).await;
    assert!(server.terminate(Duration::from_secs(30)).success());
    let said = std::fs::read_to_string(&log).unwrap();
    assert!(said.contains("--skip-ahead 1000000"), "{said}");
    assert_each_once(&[&before, &again]);
    verify(&margin);
}
