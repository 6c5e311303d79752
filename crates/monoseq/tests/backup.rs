//! Backups under load: a backup is taken while clients write, the clients keep writing, the
//! server stops, and the backup is restored into new directories. Started as-is it is refused;
//! continued with the live marks, and (separately) with a margin, clients write again, and no
//! PLog offset, WLog offset or record ID is acknowledged twice across the whole history.
//!
//! Who may back up and where: only an admin token (or, without tokens, a server started with
//! `--admin-on-loopback`), only into a new directory under `--backup-root`; every target that
//! breaks a rule is answered 400 with the rule's code and nothing is written, through the real
//! client (`Client::backup`) and `monoseq backup`.

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::Server;
use common::keyed::{self, Ack, Load, assert_once};
use serde_json::{Value, json};

/// Clients writing under load.
const CLIENTS: u64 = 8;

/// Keyed load on `url` for `secs`, keys prefixed `tag`; every acknowledgement.
async fn write_for(url: &str, secs: Duration, tag: &str) -> Vec<Ack> {
    let load = Load::start(&keyed::urls(&[url]), CLIENTS, tag);
    tokio::time::sleep(secs).await;
    load.stop().await.0
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
    let root = tmp.path().to_str().unwrap();
    let server = Server::start(
        &live,
        &[
            "--partitions",
            "4",
            "--backup-root",
            root,
            "--admin-on-loopback",
        ],
    );
    let http = reqwest::Client::new();
    server.ready(&http).await;

    // Write, take a backup in the middle, keep writing.
    let load = Load::start(&keyed::urls(&[&server.url]), CLIENTS, "before");
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
    let (before, _) = load.stop().await;
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
    let again = write_for(&server.url, Duration::from_secs(1), "marks").await;
    assert!(server.terminate(Duration::from_secs(30)).success());
    let said = std::fs::read_to_string(&log).unwrap();
    assert!(
        said.contains("restored backup continued with the live marks"),
        "{said}"
    );
    assert!(!again.is_empty(), "nothing written on the continued copy");
    assert_once(&[before.clone(), again].concat());
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
    let again = write_for(&server.url, Duration::from_secs(1), "margin").await;
    assert!(server.terminate(Duration::from_secs(30)).success());
    let said = std::fs::read_to_string(&log).unwrap();
    assert!(said.contains("--skip-ahead 1000000"), "{said}");
    assert!(
        !again.is_empty(),
        "nothing written on the copy with a margin"
    );
    assert_once(&[before, again].concat());
    verify(&margin);
}

const ADMIN: &str = "admin-token-0123456789abcdef-A1";
const WRITE: &str = "write-token-0123456789abcdef-W1";
const READ: &str = "read-token-0123456789abcdef-R1";

/// A client of `url` presenting `token`.
fn client_with(url: &str, token: Option<&str>) -> monoseq_client::Client {
    let mut builder = monoseq_client::Client::builder([url]);
    if let Some(token) = token {
        builder = builder.token(token);
    }
    builder.build().unwrap()
}

/// Every path under `dir`, recursively, without following links.
fn tree(dir: &Path) -> BTreeSet<PathBuf> {
    let mut all = BTreeSet::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.symlink_metadata().unwrap().is_dir() {
                todo.push(path.clone());
            }
            all.insert(path);
        }
    }
    all
}

/// Asserts `refused` is the API's `status` with `code`.
fn assert_refused(
    refused: Result<monoseq_client::BackupBody, monoseq_client::ClientError>,
    status: u16,
    code: &str,
    what: &str,
) {
    match refused {
        Ok(body) => panic!("{what}: a backup was taken into {}", body.to),
        Err(e) => {
            assert_eq!(
                (e.status(), e.code().as_str()),
                (Some(status), code),
                "{what}: {e}"
            );
        }
    }
}

/// `monoseq backup --url URL --to TO` with `MONOSEQ_TOKEN=token`.
fn backup_command(url: &str, to: &Path, token: &str) -> std::process::Output {
    std::process::Command::new(common::BIN)
        .args(["backup", "--url", url, "--to"])
        .arg(to)
        .env("MONOSEQ_TOKEN", token)
        .output()
        .expect("run monoseq backup")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backups_are_written_only_under_the_root_by_an_admin_token_and_restore() {
    let tmp = tempfile::tempdir().unwrap();
    let base = std::fs::canonicalize(tmp.path()).unwrap();
    let root = base.join("root");
    let away = base.join("away");
    // The data directory lies under the root: a backup there is refused all the same.
    let data = root.join("data");
    for dir in [&root, &away] {
        std::fs::create_dir(dir).unwrap();
    }
    let tokens = base.join("tokens");
    std::fs::write(
        &tokens,
        format!("admin {ADMIN}\nwrite {WRITE}\nread {READ}\n"),
    )
    .unwrap();
    let server = Server::start(
        &data,
        &[
            "--partitions",
            "2",
            "--tokens-file",
            tokens.to_str().unwrap(),
            "--open-health",
            "--backup-root",
            root.to_str().unwrap(),
        ],
    );
    server.ready(&reqwest::Client::new()).await;
    let writer = client_with(&server.url, Some(WRITE));
    let mut order = monoseq_client::CommandBody::new(7, 1, "app.CreateOrder");
    order.create.push(monoseq_client::NewRecordBody::new(
        1,
        monoseq_client::KindBody::CDoc,
        "app.Order",
    ));
    let written = writer.submit(&order).await.expect("a command");

    // The places a request may not write to.
    std::fs::create_dir(root.join("existing")).unwrap();
    std::fs::write(root.join("file"), b"not a directory").unwrap();
    std::os::unix::fs::symlink(&away, root.join("link")).unwrap();
    std::os::unix::fs::symlink(away.join("made"), root.join("dangling")).unwrap();
    let before = (tree(&root), tree(&away));

    // Scopes: read and write tokens may not back up.
    let good = root.join("good");
    let good_text = good.to_str().unwrap();
    for token in [READ, WRITE] {
        let refused = client_with(&server.url, Some(token))
            .backup(good_text)
            .await;
        assert_refused(refused, 403, "forbidden", token);
    }
    assert_refused(
        client_with(&server.url, None).backup(good_text).await,
        401,
        "unauthorized",
        "no token",
    );

    // Every rule, with an admin token.
    let admin = client_with(&server.url, Some(ADMIN));
    let text = |p: PathBuf| p.to_str().unwrap().to_owned();
    let cases = [
        (String::new(), "backup_path_empty"),
        ("relative/backup".to_owned(), "backup_path_relative"),
        (
            format!("{}/../away/b", root.display()),
            "backup_path_not_normal",
        ),
        (text(away.join("b")), "backup_path_outside_root"),
        (text(root.clone()), "backup_path_outside_root"),
        (
            text(root.join("missing").join("b")),
            "backup_path_parent_missing",
        ),
        (text(root.join("link").join("b")), "backup_path_leaves_root"),
        (text(data.join("b")), "backup_path_in_data_dir"),
        (text(data.clone()), "backup_path_in_data_dir"),
        (text(root.join("file")), "backup_path_is_file"),
        (text(root.join("existing")), "backup_path_exists"),
        (text(root.join("dangling")), "backup_path_exists"),
    ];
    for (to, code) in &cases {
        assert_refused(admin.backup(to).await, 400, code, to);
    }
    assert_eq!(
        (tree(&root), tree(&away)),
        before,
        "a refused backup wrote nothing"
    );

    // The command line: a write token is refused naming the scope; an admin token is not.
    let cli = root.join("by-cli");
    let out = backup_command(&server.url, &cli, WRITE);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && said.contains("forbidden") && said.contains("admin token"),
        "{said}"
    );
    assert!(!cli.exists());
    let out = backup_command(&server.url, &cli, ADMIN);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    verify(&cli);

    // A good backup, through the client: restored, it serves what was written before it.
    let taken = admin
        .backup(good_text)
        .await
        .expect("a backup under the root");
    assert_eq!(taken.to, good_text);
    assert!(taken.keys > 0, "{taken:?}");
    assert_refused(
        admin.backup(good_text).await,
        400,
        "backup_path_exists",
        "again",
    );
    assert!(server.terminate(Duration::from_secs(30)).success());
    verify(&good);
    let restored = base.join("restored");
    copy_dir(&good, &restored);
    let marks = data.join("monoseq.marks");
    let server = Server::try_start(
        &restored,
        &["--marks-from", marks.to_str().unwrap()],
        &base.join("restored.log"),
    )
    .expect("the backup continues with the live marks");
    server.ready(&reqwest::Client::new()).await;
    let event = client_with(&server.url, None)
        .event(written.outcome.partition, written.outcome.plog_offset)
        .await
        .expect("a read")
        .expect("the event written before the backup");
    assert_eq!(event.command, "app.CreateOrder");
    assert!(server.terminate(Duration::from_secs(30)).success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_tokens_backups_need_the_loopback_flag_and_a_root() {
    let tmp = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(tmp.path()).unwrap();
    let to = root.join("b");
    let to_text = to.to_str().unwrap();
    let http = reqwest::Client::new();

    // No tokens, no flag: administration is refused, naming the flag; commands are not.
    let plain = Server::start_ready(
        &root.join("plain"),
        &["--backup-root", root.to_str().unwrap()],
        &http,
    )
    .await;
    let client = client_with(&plain.url, None);
    assert_refused(
        client.backup(to_text).await,
        403,
        "admin_on_loopback_off",
        "plain",
    );
    let refused = http
        .post(format!("{}/v1/admin/backup", plain.url))
        .json(&json!({"to": to_text}))
        .send()
        .await
        .unwrap();
    let body: Value = refused.json().await.unwrap();
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("--admin-on-loopback"),
        "{body}"
    );
    let mut order = monoseq_client::CommandBody::new(3, 1, "app.CreateOrder");
    order.create.push(monoseq_client::NewRecordBody::new(
        1,
        monoseq_client::KindBody::CDoc,
        "app.Order",
    ));
    client.submit(&order).await.expect("commands need no token");
    drop(plain);

    // The flag without a root: backups are disabled.
    let no_root = Server::start_ready(&root.join("no-root"), &["--admin-on-loopback"], &http).await;
    let refused = client_with(&no_root.url, None).backup(to_text).await;
    assert_refused(refused, 403, "backups_disabled", "no root");
    drop(no_root);
    assert!(!to.exists(), "a refused backup wrote nothing");
}
