//! Damage suite (invariant 10 of docs/invariants.md): a real data directory holding acknowledged
//! events in the PLogs' segment files, their WLog entries and records in table files and in the
//! journal, is damaged one way at a time — engine files deleted, the journal cut, bytes flipped in
//! the manifest, journal, table and segment files, segments cut or deleted, our identity and marks
//! files deleted or garbled. For every case the server either refuses to start, naming the damage,
//! or serves correct data (an acknowledged event is read back as acknowledged or answered
//! `corrupted`, never missing); and whether it runs as it is or after an operator's
//! `--accept-loss`, no PLog offset, WLog offset or record ID acknowledged before is handed out
//! again. `verify` reports every damage that the server refuses or finds corrupt, and the two agree
//! on loss: where the server starts and reads every acknowledged event back, `verify` reports no
//! loss, and where `verify` reports a loss, the server refuses. A directory a server stopped
//! cleanly loses nothing when its journal is deleted, and both say so.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{Server, run};
use serde_json::{Value, json};

const PARTITIONS: u64 = 4;
const WORKSPACES: u64 = 12;
/// Commands per phase of the `Base::CleanThenKilled` directory.
const PHASE_COMMANDS: u64 = 48;

/// What clients were told.
#[derive(Debug, Default, Clone)]
struct Acked {
    /// (partition, PLog offset) → (workspace, WLog offset).
    events: HashMap<(u64, u64), (u64, u64)>,
    /// Highest PLog offset per partition.
    plog: HashMap<u64, u64>,
    /// Highest WLog offset per workspace, and record ID per (workspace, raw ID): raw ID 1 is a
    /// CDoc, 2 a WRecord, each of its own ID sequence.
    wlog: HashMap<u64, u64>,
    ids: HashMap<(u64, String), u64>,
}

impl Acked {
    fn record(&mut self, ws: u64, answer: &Value) {
        let p = answer["partition"].as_u64().expect("partition");
        let plog = answer["plog_offset"].as_u64().expect("plog_offset");
        let wlog = answer["wlog_offset"].as_u64().expect("wlog_offset");
        self.events.insert((p, plog), (ws, wlog));
        let m = self.plog.entry(p).or_default();
        *m = (*m).max(plog);
        let m = self.wlog.entry(ws).or_default();
        *m = (*m).max(wlog);
        for (raw, id) in answer["ids"].as_object().expect("ids") {
            let m = self.ids.entry((ws, raw.clone())).or_default();
            *m = (*m).max(id.as_u64().expect("id"));
        }
    }
}

fn command(ws: u64) -> Value {
    json!({
        "ws": ws, "ws_kind": 1, "command": "damage.Create",
        "create": [{"raw_id": 1, "kind": "CDoc", "name": "damage.Doc", "fields": {"ws": ws}},
                   {"raw_id": 2, "kind": "WRecord", "name": "damage.Row"}],
    })
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .expect("client")
}

async fn submit(client: &reqwest::Client, url: &str, ws: u64) -> (u16, Value) {
    let r = client
        .post(format!("{url}/v1/commands"))
        .json(&command(ws))
        .send()
        .await
        .expect("send");
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

/// How the server that wrote a base directory stopped.
#[derive(Debug, Clone, Copy)]
enum Base {
    /// Two phases: the first ends in a clean shutdown (its events reach table files), the
    /// second in SIGKILL (its events are only in the journal). The second phase flushes no
    /// sequence numbers (a long flush delay), so its journal ends with the last acknowledged
    /// event.
    CleanThenKilled,
    /// One phase of `CLEAN_COMMANDS` commands ended by SIGTERM: everything is in table files.
    Clean,
}

/// Commands of the `Base::Clean` directory.
const CLEAN_COMMANDS: u64 = 200;

/// A data directory holding acknowledged events, written as `kind` says.
async fn base(dir: &Path, kind: Base) -> Acked {
    let client = client();
    let mut acked = Acked::default();
    let partitions = PARTITIONS.to_string();
    let phases: &[(&str, u64, bool)] = match kind {
        Base::CleanThenKilled => &[
            ("50", PHASE_COMMANDS, true),
            ("10000", PHASE_COMMANDS, false),
        ],
        Base::Clean => &[("50", CLEAN_COMMANDS, true)],
    };
    for &(delay, commands, clean) in phases {
        let args = ["--partitions", &partitions, "--flush-delay-ms", delay];
        let server = Server::start_ready(dir, &args, &client).await;
        for n in 0..commands {
            let ws = n % WORKSPACES + 1;
            let (status, answer) = submit(&client, &server.url, ws).await;
            assert_eq!(status, 200, "{answer}");
            acked.record(ws, &answer);
        }
        if clean {
            assert!(server.terminate(Duration::from_secs(20)).success());
        } else {
            server.kill();
        }
    }
    acked
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("create");
    for entry in std::fs::read_dir(from).expect("read dir") {
        let entry = entry.expect("entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("type").is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).expect("copy");
        }
    }
}

/// Every file under `dir` whose path (relative, with `/`) satisfies `pick`.
fn files(dir: &Path, pick: &dyn Fn(&str) -> bool) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).expect("read dir") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                stack.push(path);
            } else {
                let rel = path
                    .strip_prefix(dir)
                    .expect("inside")
                    .to_string_lossy()
                    .into_owned();
                if pick(&rel) {
                    out.push(path);
                }
            }
        }
    }
    out.sort();
    out
}

/// The data keyspace's files: the one holding table files of events.
fn data_keyspace(dir: &Path) -> PathBuf {
    files(dir, &|rel| rel.contains("/tables/"))
        .into_iter()
        .max_by_key(|p| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0))
        .and_then(|t| t.parent().and_then(Path::parent).map(Path::to_path_buf))
        .expect("a table file of events")
}

/// Bytes of the journal in use (it is preallocated with zeros).
fn journal_used(path: &Path) -> u64 {
    let bytes = std::fs::read(path).expect("read journal");
    bytes
        .iter()
        .rposition(|&b| b != 0)
        .map_or(0, |i| i as u64 + 1)
}

fn journal(dir: &Path) -> PathBuf {
    files(dir, &|rel| rel.ends_with(".jnl"))
        .into_iter()
        .max_by_key(|p| journal_used(p))
        .expect("a journal")
}

fn flip(path: &Path, at: u64) {
    let mut bytes = std::fs::read(path).expect("read");
    let at = (at as usize).min(bytes.len() - 1);
    bytes[at] ^= 0x5a;
    std::fs::write(path, bytes).expect("write");
}

fn truncate(path: &Path, len: u64) {
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .and_then(|f| f.set_len(len))
        .expect("truncate");
}

fn remove(paths: Vec<PathBuf>) {
    assert!(!paths.is_empty(), "nothing to delete");
    for p in paths {
        std::fs::remove_file(p).expect("delete");
    }
}

/// A way to damage a data directory.
struct Damage {
    name: String,
    apply: Box<dyn Fn(&Path)>,
    /// The damage must be detected: the server refuses to start without `--accept-loss`.
    refused: bool,
}

fn damage(name: impl Into<String>, refused: bool, apply: impl Fn(&Path) + 'static) -> Damage {
    Damage {
        name: name.into(),
        apply: Box::new(apply),
        refused,
    }
}

fn deletions() -> Vec<Damage> {
    vec![
        damage("delete the engine's version file", true, |d| {
            remove(vec![d.join("version")]);
        }),
        damage("delete the journal", false, |d| remove(vec![journal(d)])),
        damage("delete the data keyspace's table files", false, |d| {
            let ks = data_keyspace(d);
            remove(files(&ks, &|rel| rel.starts_with("tables/")));
        }),
        damage("delete the data keyspace's manifest versions", false, |d| {
            let ks = data_keyspace(d);
            remove(files(&ks, &|rel| rel.starts_with('v')));
        }),
        damage("delete the data keyspace's current pointer", false, |d| {
            remove(vec![data_keyspace(d).join("current")]);
        }),
        damage("delete the lock file", false, |d| {
            remove(vec![d.join("lock")])
        }),
        damage("delete the identity file", true, |d| {
            remove(vec![d.join("monoseq.identity")]);
        }),
        damage("delete the marks file", true, |d| {
            remove(vec![d.join("monoseq.marks")]);
        }),
        damage("garble the identity file", true, |d| {
            std::fs::write(d.join("monoseq.identity"), b"{\"format\": 1, \"sto").expect("w");
        }),
        damage("garble the marks file", true, |d| {
            flip(&d.join("monoseq.marks"), 4);
        }),
    ]
}

/// Cuts of the engine's journal: it holds WLog entries, records and numbers, which a start
/// writes again from the PLogs' segment files, so a cut loses nothing acknowledged.
fn journal_cuts() -> Vec<Damage> {
    let mut out = Vec::new();
    for cut in [40u64, 300, 1_000] {
        out.push(damage(
            format!("cut the journal's last {cut} bytes"),
            false,
            move |d| {
                let j = journal(d);
                let used = journal_used(&j);
                truncate(&j, used.saturating_sub(cut));
            },
        ));
    }
    out.push(damage("cut the journal in half", false, |d| {
        let j = journal(d);
        let used = journal_used(&j);
        truncate(&j, used / 2);
    }));
    out
}

fn flips() -> Vec<Damage> {
    let mut out = Vec::new();
    for (what, num) in [("start", 0u64), ("middle", 1), ("end", 2)] {
        out.push(damage(
            format!("flip a byte at the {what} of the journal"),
            false,
            move |d| {
                let j = journal(d);
                let used = journal_used(&j);
                flip(&j, [24, used / 2, used.saturating_sub(20)][num as usize]);
            },
        ));
        out.push(damage(
            format!("flip a byte at the {what} of the newest manifest version"),
            false,
            move |d| {
                let ks = data_keyspace(d);
                let v = files(&ks, &|rel| rel.starts_with('v'))
                    .into_iter()
                    .max_by_key(|p| p.to_string_lossy().into_owned())
                    .expect("a manifest version");
                let len = std::fs::metadata(&v).expect("meta").len();
                flip(&v, [0, len / 2, len - 1][num as usize]);
            },
        ));
        out.push(damage(
            format!("flip a byte at the {what} of a table file"),
            false,
            move |d| {
                let ks = data_keyspace(d);
                for t in files(&ks, &|rel| rel.starts_with("tables/")) {
                    let len = std::fs::metadata(&t).expect("meta").len();
                    flip(&t, [len / 10, len / 2, len * 9 / 10][num as usize]);
                }
            },
        ));
    }
    out
}

/// Every segment file of the PLogs, largest first.
fn segments(dir: &Path) -> Vec<PathBuf> {
    let mut found = files(dir, &|rel| {
        rel.starts_with("plog/") && rel.ends_with(".seg")
    });
    found.sort_by_key(|p| std::cmp::Reverse(segment_used(p)));
    assert!(!found.is_empty(), "no segment file");
    found
}

/// Bytes of a segment file holding frames (its zero-filled room after them excluded).
fn segment_used(path: &Path) -> u64 {
    journal_used(path)
}

/// Damage to the PLogs' segment files: below an acknowledged mark it is refused, and an
/// accepted one cuts the log there; above every frame (the zero-filled room) it is cut and
/// served.
fn segment_damage() -> Vec<Damage> {
    vec![
        damage(
            "flip a byte in the middle of a segment's frames",
            true,
            |d| {
                let s = &segments(d)[0];
                flip(s, segment_used(s) / 2);
            },
        ),
        damage("flip a byte in a segment's last frame", true, |d| {
            let s = &segments(d)[0];
            flip(s, segment_used(s) - 3);
        }),
        damage("cut a segment's last 100 bytes", true, |d| {
            let s = &segments(d)[0];
            truncate(s, segment_used(s) - 100);
        }),
        damage("flip a byte of a segment's header", true, |d| {
            flip(&segments(d)[0], 20);
        }),
        damage("delete a segment file", true, |d| {
            remove(vec![segments(d).remove(0)]);
        }),
        damage("write garbage after a segment's frames", false, |d| {
            let s = &segments(d)[0];
            flip(s, segment_used(s) + 4_000);
        }),
    ]
}

/// Waits up to a few seconds for readiness; a damaged store may never get there.
async fn settle(client: &reqwest::Client, url: &str) {
    let deadline = Instant::now() + Duration::from_secs(3);
    while Instant::now() < deadline {
        if let Ok(r) = client.get(format!("{url}/readyz")).send().await
            && r.status().is_success()
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// What reading every acknowledged event back found.
#[derive(Debug, Default)]
struct Reads {
    /// Answered `corrupted`.
    corrupted: usize,
    /// Answered 503 (the partition is not serving).
    unavailable: usize,
}

impl Reads {
    /// Whether every acknowledged event read back as acknowledged.
    fn whole(&self) -> bool {
        self.corrupted == 0 && self.unavailable == 0
    }
}

/// Every acknowledged event reads back as acknowledged, or is answered `corrupted` or
/// unavailable; never "not found" and never other data.
async fn check_reads(client: &reqwest::Client, url: &str, acked: &Acked, case: &str) -> Reads {
    let mut reads = Reads::default();
    for (&(p, plog), &(ws, wlog)) in &acked.events {
        let r = client
            .get(format!("{url}/v1/partitions/{p}/events/{plog}"))
            .send()
            .await
            .expect("send");
        let status = r.status().as_u16();
        let body: Value = r.json().await.unwrap_or(Value::Null);
        match status {
            200 => assert!(
                body["ws"] == ws && body["wlog_offset"] == wlog,
                "{case}: event {plog} of partition {p} reads back as {body}, acknowledged as \
                 workspace {ws} WLog offset {wlog}"
            ),
            500 => {
                assert_eq!(body["code"], "corrupted", "{case}: {body}");
                reads.corrupted += 1;
            }
            503 => reads.unavailable += 1,
            _ => panic!(
                "{case}: acknowledged event {plog} of partition {p} answered {status} {body}: \
                 a damaged store was served as if whole"
            ),
        }
    }
    reads
}

/// The kinds of problem by which `verify` says acknowledged events are lost: the PLog ends
/// below a high-water mark, has a hole, ends below the checkpoint of the stored numbers, or
/// below what the engine applied of it.
const LOSS_KINDS: [&str; 4] = [
    "below-mark",
    "plog-gap",
    "checkpoint-ahead",
    "applied-ahead",
];

/// Whether `verify`'s output reports a loss (its summary counts problems by kind).
fn reports_loss(verify_out: &str) -> bool {
    LOSS_KINDS
        .iter()
        .any(|kind| verify_out.contains(&format!("{kind} x")))
}

/// The pair rule between `verify` and `serve` on one directory: where the server started and
/// read every acknowledged event back, `verify` reports no loss; and where `verify` reports a
/// loss, the server refuses to start (so it did not start here).
fn check_verify_agrees_with_a_start(reads: &Reads, verify_out: &str, case: &str) {
    assert!(
        !(reads.whole() && reports_loss(verify_out)),
        "{case}: the server started and read every acknowledged event back, but verify reports \
         acknowledged events lost: {verify_out}"
    );
    assert!(
        !reports_loss(verify_out),
        "{case}: verify reports acknowledged events lost, but the server started on the \
         directory ({reads:?}): {verify_out}"
    );
}

/// New commands to every workspace: whatever succeeds gets numbers above everything
/// acknowledged before.
async fn check_no_reissue(client: &reqwest::Client, url: &str, acked: &Acked, case: &str) {
    for ws in 1..=WORKSPACES {
        let deadline = Instant::now() + Duration::from_secs(2);
        loop {
            let (status, answer) = submit(client, url, ws).await;
            if status == 200 {
                let p = answer["partition"].as_u64().expect("partition");
                let plog = answer["plog_offset"].as_u64().expect("plog");
                let wlog = answer["wlog_offset"].as_u64().expect("wlog");
                assert!(
                    plog > acked.plog[&p],
                    "{case}: PLog offset {plog} of partition {p} handed out again (acknowledged \
                     up to {})",
                    acked.plog[&p]
                );
                assert!(
                    wlog > acked.wlog[&ws],
                    "{case}: WLog offset {wlog} of workspace {ws} handed out again \
                     (acknowledged up to {})",
                    acked.wlog[&ws]
                );
                for (raw, id) in answer["ids"].as_object().expect("ids") {
                    let id = id.as_u64().expect("id");
                    let before = acked.ids[&(ws, raw.clone())];
                    assert!(
                        id > before,
                        "{case}: record ID {id} of workspace {ws} handed out again \
                         (acknowledged up to {before})"
                    );
                }
                break;
            }
            if Instant::now() > deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Runs every damage on its own copy of one base directory written as `kind` says.
async fn run_cases(kind: Base, cases: Vec<Damage>) {
    let root = tempfile::tempdir().expect("temporary directory");
    let base_dir = root.path().join("base");
    let acked = base(&base_dir, kind).await;
    let client = client();
    for (i, case) in cases.iter().enumerate() {
        let dir = root.path().join(format!("case{i}"));
        copy_dir(&base_dir, &dir);
        (case.apply)(&dir);
        let name = &case.name;
        let verified = run(&["verify", "--data-dir", &dir.to_string_lossy()]);
        let verify_out = format!(
            "{}{}",
            String::from_utf8_lossy(&verified.stdout),
            String::from_utf8_lossy(&verified.stderr)
        );
        let log = root.path().join(format!("case{i}.log"));
        match Server::try_start(&dir, &[], &log) {
            Ok(server) => {
                assert!(
                    !case.refused,
                    "{name}: the server started on a store that lost acknowledged data"
                );
                settle(&client, &server.url).await;
                let reads = check_reads(&client, &server.url, &acked, name).await;
                assert!(
                    reads.corrupted == 0 || !verified.status.success(),
                    "{name}: the server found {} corrupt events, verify none: {verify_out}",
                    reads.corrupted
                );
                check_verify_agrees_with_a_start(&reads, &verify_out, name);
                check_no_reissue(&client, &server.url, &acked, name).await;
                server.kill();
            }
            Err(stderr) => {
                assert!(
                    stderr.contains("refusing to start"),
                    "{name}: a refused start must say so: {stderr}"
                );
                assert!(
                    !verified.status.success(),
                    "{name}: the server refused the store but verify passed it: {verify_out}"
                );
                let log = root.path().join(format!("case{i}.accept.log"));
                match Server::try_start(&dir, &["--accept-loss"], &log) {
                    Ok(server) => {
                        settle(&client, &server.url).await;
                        check_no_reissue(&client, &server.url, &acked, name).await;
                        server.kill();
                    }
                    Err(stderr) => assert!(
                        stderr.contains("refusing to start"),
                        "{name} (--accept-loss): {stderr}"
                    ),
                }
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleted_engine_and_identity_files_are_refused_or_served_whole() {
    run_cases(Base::CleanThenKilled, deletions()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_journal_loses_nothing_acknowledged_and_reissues_nothing() {
    run_cases(Base::CleanThenKilled, journal_cuts()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damaged_segment_files_are_refused_and_an_accepted_cut_reissues_nothing() {
    run_cases(Base::CleanThenKilled, segment_damage()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flipped_bytes_in_manifest_journal_and_tables_never_serve_wrong_data() {
    run_cases(Base::CleanThenKilled, flips()).await;
}

/// The journal of a directory a server stopped cleanly holds nothing the table files do not:
/// deleting it loses nothing, the server serves every event, and `verify` agrees.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_journal_deleted_after_a_clean_shutdown_loses_nothing_and_verify_agrees() {
    let case = damage(
        "delete every journal file after a clean shutdown",
        false,
        |d| {
            remove(files(d, &|rel| rel.ends_with(".jnl")));
        },
    );
    run_cases(Base::Clean, vec![case]).await;
}
