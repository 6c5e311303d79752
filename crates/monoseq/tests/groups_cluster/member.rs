//! A member process of `tests/groups_cluster.rs`: joins a group through the Rust client and
//! writes its history, one JSON line per record, as things happen (a SIGKILL loses nothing
//! written): `joined` (its session), `assigned` and `revoked` (generation and partitions, each
//! given one with its starting position), `lost`, every `event` and `gap` with its partition,
//! offset and session, and every `commit` (written before it is sent) with its `answer`
//! (`ok`, the refusal's code, or `unknown` when none came in time). It commits the last
//! offset delivered of each partition it holds every [`COMMIT_EVERY`], in raw HTTP naming the
//! session and generation that offset was delivered in, through the nodes in turn from the
//! first (any node stores a commit), from a task of its own so that a slow commit never stops
//! the stream.

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use monoseq_client::{GroupItem, GroupOptions};
use serde_json::{Value, json};

use super::history::now_ms;

/// Set in a member process: its history file.
pub const MEMBER_VAR: &str = "MONOSEQ_GROUP_MEMBER";
/// The nodes, comma-separated, the first the one to join through.
pub const URLS_VAR: &str = "MONOSEQ_GROUP_MEMBER_URLS";
pub const GROUP_VAR: &str = "MONOSEQ_GROUP_MEMBER_GROUP";
pub const NAME_VAR: &str = "MONOSEQ_GROUP_MEMBER_NAME";
pub const TIMEOUT_VAR: &str = "MONOSEQ_GROUP_MEMBER_TIMEOUT_MS";

/// How often the member commits what it was delivered.
const COMMIT_EVERY: Duration = Duration::from_millis(200);
/// Longest wait for one commit's answer (retries included); past it the answer is unknown.
const COMMIT_WAIT: Duration = Duration::from_secs(3);
/// How long the member's client retries (joins through an outage, a failover).
const RETRY: Duration = Duration::from_secs(120);

/// The history file, written one whole line at a time.
struct History(Mutex<std::fs::File>);

impl History {
    fn write(&self, kind: &str, mut record: Value) {
        record["t"] = json!(now_ms());
        record["k"] = json!(kind);
        let mut line = record.to_string();
        line.push('\n');
        let mut file = self.0.lock().unwrap();
        file.write_all(line.as_bytes()).expect("write the history");
        file.flush().expect("flush the history");
    }
}

/// What the stream and the commits share: the session, its generation, and per partition
/// held the last offset delivered and the last committed.
#[derive(Default)]
struct Now {
    session: String,
    generation: u64,
    delivered: BTreeMap<u32, u64>,
    committed: BTreeMap<u32, u64>,
}

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set"))
}

/// Runs the member until it is killed (or its stream ends).
pub fn run() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(member());
}

async fn member() {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(env(MEMBER_VAR))
        .expect("the history file");
    let history = Arc::new(History(Mutex::new(file)));
    let urls: Vec<String> = env(URLS_VAR).split(',').map(str::to_owned).collect();
    let timeout: u64 = env(TIMEOUT_VAR).parse().expect("a timeout");
    let client = monoseq_client::Client::builder(urls.clone())
        .retry_timeout(RETRY)
        .request_timeout(Duration::from_secs(3))
        .build()
        .expect("a client");
    let options = GroupOptions::default().session_timeout(Duration::from_millis(timeout));
    let mut consumer = client.join_group(&env(GROUP_VAR), &env(NAME_VAR), options);
    let now: Arc<Mutex<Now>> = Arc::default();
    let target = Target {
        http: reqwest::Client::builder()
            .no_proxy()
            .timeout(COMMIT_WAIT)
            .build()
            .expect("an HTTP client"),
        urls,
        group: env(GROUP_VAR),
    };
    let committing = tokio::spawn(commits(target, Arc::clone(&now), Arc::clone(&history)));
    while let Some(item) = consumer.next().await {
        match item {
            Ok(item) => note(&item, &now, &history),
            Err(e) => {
                history.write("error", json!({ "error": e.to_string() }));
                break;
            }
        }
    }
    committing.abort();
}

/// Writes what `item` says and keeps `now` up to date.
fn note(item: &GroupItem, now: &Mutex<Now>, history: &History) {
    let mut now = now.lock().unwrap();
    let s = now.session.clone();
    match item {
        GroupItem::Joined(j) => {
            *now = Now {
                session: j.session.clone(),
                ..Now::default()
            };
            history.write("joined", json!({ "s": j.session }));
        }
        GroupItem::Assigned(a) => {
            now.generation = now.generation.max(a.generation);
            let parts: Vec<(u32, u64)> = a
                .partitions
                .iter()
                .map(|p| (p.partition, p.position))
                .collect();
            for &(p, position) in &parts {
                now.delivered.insert(p, position);
                now.committed.insert(p, position);
            }
            history.write(
                "assigned",
                json!({ "s": s, "g": a.generation, "parts": parts }),
            );
        }
        GroupItem::Revoked(r) => {
            now.generation = now.generation.max(r.generation);
            for p in &r.partitions {
                now.delivered.remove(p);
                now.committed.remove(p);
            }
            history.write(
                "revoked",
                json!({ "s": s, "g": r.generation, "parts": r.partitions }),
            );
        }
        GroupItem::Lost { partitions, reason } => {
            now.delivered.clear();
            now.committed.clear();
            history.write(
                "lost",
                json!({ "s": s, "parts": partitions, "why": reason }),
            );
        }
        GroupItem::Event { partition, event } => {
            now.delivered.insert(*partition, event.plog_offset);
            history.write(
                "event",
                json!({ "s": s, "p": partition, "o": event.plog_offset }),
            );
        }
        GroupItem::Gap { partition, gap } => {
            now.delivered.insert(*partition, gap.to);
            history.write(
                "gap",
                json!({ "s": s, "p": partition, "from": gap.from, "to": gap.to }),
            );
        }
        GroupItem::Progress(_) => {}
    }
}

/// Where the commits go: the nodes, tried in turn from the first, and the group.
struct Target {
    http: reqwest::Client,
    urls: Vec<String>,
    group: String,
}

impl Target {
    /// Commits `o` on `p` for session `s` at generation `g` through the nodes in turn (a
    /// commit is stored from any node) until one answers other than 503, at most
    /// [`COMMIT_WAIT`]: `ok`, the refusal's code, or `unknown`.
    async fn commit(&self, (s, g, p, o): (&str, u64, u32, u64)) -> String {
        let body =
            json!({"session": s, "generation": g, "positions": [{"partition": p, "offset": o}]});
        let deadline = tokio::time::Instant::now() + COMMIT_WAIT;
        for url in self.urls.iter().cycle() {
            let sent = self
                .http
                .post(format!("{url}/v1/groups/{}/commit", self.group))
                .json(&body)
                .send();
            let Ok(Ok(answer)) = tokio::time::timeout_at(deadline, sent).await else {
                if tokio::time::Instant::now() >= deadline {
                    return "unknown".to_owned();
                }
                continue;
            };
            let status = answer.status().as_u16();
            if status == 200 {
                return "ok".to_owned();
            }
            let answer: Value = answer.json().await.unwrap_or(Value::Null);
            if status != 503 {
                return answer["code"].as_str().unwrap_or("none").to_owned();
            }
            if tokio::time::Instant::now() >= deadline {
                return "unknown".to_owned();
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        "unknown".to_owned()
    }
}

/// Commits the last offset delivered of each partition held, every [`COMMIT_EVERY`], naming
/// the session and generation it was delivered in.
async fn commits(target: Target, now: Arc<Mutex<Now>>, history: Arc<History>) {
    let mut id = 0u64;
    loop {
        tokio::time::sleep(COMMIT_EVERY).await;
        let due: Vec<(String, u64, u32, u64)> = {
            let now = now.lock().unwrap();
            now.delivered
                .iter()
                .filter(|(p, o)| now.committed.get(p).is_none_or(|c| c < o))
                .map(|(&p, &o)| (now.session.clone(), now.generation, p, o))
                .collect()
        };
        for (s, g, p, o) in due {
            id += 1;
            history.write(
                "commit",
                json!({ "id": id, "s": s, "g": g, "p": p, "o": o }),
            );
            let answer = target.commit((&s, g, p, o)).await;
            if answer == "ok" {
                let mut now = now.lock().unwrap();
                if now.session == s && now.committed.contains_key(&p) {
                    now.committed.insert(p, o);
                }
            }
            history.write("answer", json!({ "id": id, "r": answer }));
        }
    }
}
