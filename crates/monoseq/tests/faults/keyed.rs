//! Keyed load on a cluster of nodes and the closing checks after a fault: every command carries
//! its own `Idempotency-Key` and is retried (same key, same body) through the nodes in turn
//! until one acknowledges it; every answer that is not an acknowledgement is tallied by node
//! and code, so a test can say which answers a fault produced.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::common::Backend;

/// Partitions of every cluster these tests start.
pub const PARTITIONS: u64 = 6;
/// Longest a client retries one command before the test fails.
pub const COMMAND_DEADLINE: Duration = Duration::from_secs(90);
/// Longest wait for one answer: a node that cannot reach the database may hold a request
/// until its storage gives up; the client then tries the next node with the same key.
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);
/// Most commands one client sends in one load, whatever happens.
const COMMANDS_PER_CLIENT_MAX: u64 = 20_000;

/// What a client was told for one command.
#[derive(Debug, Clone)]
pub struct Ack {
    pub key: String,
    pub ws: u64,
    pub partition: u64,
    pub plog: u64,
    pub wlog: u64,
    pub id: u64,
    /// The node that answered.
    pub via: String,
}

/// The URLs clients may use now (a load balancer's view).
pub type Urls = Arc<Mutex<Vec<String>>>;

pub fn urls(list: &[&str]) -> Urls {
    Arc::new(Mutex::new(list.iter().map(|u| (*u).to_owned()).collect()))
}

/// Answers other than an acknowledgement, by node and code (`error` for no answer at all).
#[derive(Debug, Default)]
pub struct Answers(Mutex<BTreeMap<(String, String), u64>>);

impl Answers {
    fn note(&self, url: &str, code: &str) {
        *self
            .0
            .lock()
            .unwrap()
            .entry((url.to_owned(), code.to_owned()))
            .or_default() += 1;
    }

    /// How often `code` was answered, by any node.
    pub fn count(&self, code: &str) -> u64 {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|((_, c), _)| c == code)
            .map(|(_, n)| n)
            .sum()
    }

    /// The codes `url` answered.
    pub fn codes_of(&self, url: &str) -> BTreeMap<String, u64> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|((u, _), _)| u == url)
            .map(|((_, c), n)| (c.clone(), *n))
            .collect()
    }

    pub fn summary(&self) -> String {
        format!("{:?}", self.0.lock().unwrap())
    }
}

/// An HTTP client that never goes through a proxy and waits at most `timeout` for an answer.
pub fn client(timeout: Duration) -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .connect_timeout(timeout.min(Duration::from_secs(2)))
        .timeout(timeout)
        .build()
        .expect("an HTTP client")
}

pub fn command(ws: u64, n: u64) -> Value {
    json!({
        "ws": ws, "ws_kind": 1, "command": "faults.Create",
        "create": [{"raw_id": 1, "kind": "CDoc", "name": "faults.Doc", "fields": {"n": n}}],
    })
}

/// A workspace of partition `p`: the `k`-th one.
pub fn ws_of(p: u64, k: u64) -> u64 {
    p + PARTITIONS * (k + 1)
}

/// One attempt of command `n` with `key` at `url`: `Ok` with the acknowledgement, or `Err`
/// with the code answered (`error` when nothing came back). A wrong answer (anything but
/// 200 or 503) fails the test.
pub async fn attempt(
    client: &reqwest::Client,
    url: &str,
    ws: u64,
    key: &str,
    n: u64,
) -> Result<Ack, (String, String)> {
    let answer = client
        .post(format!("{url}/v1/commands"))
        .header("idempotency-key", key)
        .json(&command(ws, n))
        .send()
        .await;
    let answer = match answer {
        Ok(a) => a,
        Err(e) => return Err(("error".to_owned(), with_sources(&e))),
    };
    let status = answer.status().as_u16();
    let body = match answer.json::<Value>().await {
        Ok(body) => body,
        Err(e) => return Err(("error".to_owned(), format!("{status}: {e}"))),
    };
    match status {
        200 => Ok(Ack {
            key: key.to_owned(),
            ws,
            partition: body["partition"].as_u64().unwrap(),
            plog: body["plog_offset"].as_u64().unwrap(),
            wlog: body["wlog_offset"].as_u64().unwrap(),
            id: body["ids"]["1"].as_u64().unwrap(),
            via: url.to_owned(),
        }),
        503 => Err((
            body["code"].as_str().unwrap_or("503").to_owned(),
            body.to_string(),
        )),
        other => panic!("{url} gave a wrong answer {other} to {key}: {body}"),
    }
}

/// An error with every error it came from, one after the other.
fn with_sources(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(&format!(": {s}"));
        source = s.source();
    }
    text
}

/// Sends command `n` with `key` until a node acknowledges it, trying the nodes of `urls` in
/// turn (starting at `n`), each answer that is not an acknowledgement noted in `answers`.
pub async fn send(
    client: &reqwest::Client,
    urls: &Urls,
    answers: &Answers,
    (ws, key, n): (u64, &str, u64),
) -> Ack {
    let began = Instant::now();
    let mut turn = n as usize;
    let mut last = String::new();
    loop {
        assert!(
            began.elapsed() < COMMAND_DEADLINE,
            "command {key} was never acknowledged; last answer: {last}"
        );
        turn += 1;
        let url = {
            let urls = urls.lock().unwrap();
            urls[turn % urls.len()].clone()
        };
        match attempt(client, &url, ws, key, n).await {
            Ok(ack) => return ack,
            Err((code, text)) => {
                answers.note(&url, &code);
                last = format!("{url}: {code}: {text}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
}

/// Clients under way: what they were told, the switch that stops them, their tasks.
pub struct Load {
    pub acks: Arc<Mutex<Vec<Ack>>>,
    pub answers: Arc<Answers>,
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    /// `clients` clients sending to workspaces `1..=30` through `urls`, keys prefixed `tag`.
    pub fn start(urls: &Urls, clients: u64, tag: &str) -> Load {
        let acks: Arc<Mutex<Vec<Ack>>> = Arc::default();
        let answers: Arc<Answers> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let tasks = (0..clients)
            .map(|c| {
                let (urls, acks, answers, stop) = (
                    Arc::clone(urls),
                    Arc::clone(&acks),
                    Arc::clone(&answers),
                    Arc::clone(&stop),
                );
                let tag = tag.to_owned();
                tokio::spawn(async move {
                    let client = client(ANSWER_TIMEOUT);
                    let mut n = 0;
                    while !stop.load(Ordering::SeqCst) && n < COMMANDS_PER_CLIENT_MAX {
                        n += 1;
                        let ws = (c * 7 + n) % 30 + 1;
                        let key = format!("{tag}-c{c}-{n}");
                        let ack = send(&client, &urls, &answers, (ws, &key, n)).await;
                        acks.lock().unwrap().push(ack);
                    }
                })
            })
            .collect();
        Load {
            acks,
            answers,
            stop,
            tasks,
        }
    }

    /// How many commands were acknowledged so far.
    pub fn acked(&self) -> usize {
        self.acks.lock().unwrap().len()
    }

    /// Waits until `more` further commands are acknowledged, at most `bound`; answers how long
    /// it took, or `None` when the bound passed.
    pub async fn progress(&self, more: usize, bound: Duration) -> Option<Duration> {
        let began = Instant::now();
        let target = self.acked() + more;
        while began.elapsed() < bound {
            if self.acked() >= target {
                return Some(began.elapsed());
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        None
    }

    /// Stops the clients (each finishes its command) and answers every acknowledgement.
    pub async fn stop(self) -> (Vec<Ack>, Arc<Answers>) {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.tasks {
            t.await.expect("a client saw a wrong answer");
        }
        let acks = self.acks.lock().unwrap().clone();
        (acks, self.answers)
    }
}

/// `GET /v1/cluster` of `url`.
pub async fn cluster(client: &reqwest::Client, url: &str) -> Option<Value> {
    client
        .get(format!("{url}/v1/cluster"))
        .send()
        .await
        .ok()?
        .json()
        .await
        .ok()
}

/// The live owner and epoch of each partition, by `url`'s reading (empty when it cannot
/// answer).
pub async fn owners(client: &reqwest::Client, url: &str) -> HashMap<u64, (String, u64)> {
    let Some(v) = cluster(client, url).await else {
        return HashMap::new();
    };
    v["partitions"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .filter_map(|p| {
            Some((
                p["partition"].as_u64()?,
                (p["owner"].as_str()?.to_owned(), p["epoch"].as_u64()?),
            ))
        })
        .collect()
}

/// Waits until every partition has a live owner and each of `nodes` holds its fair share.
pub async fn balanced(
    client: &reqwest::Client,
    url: &str,
    nodes: &[&str],
) -> HashMap<u64, (String, u64)> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let owners = owners(client, url).await;
        let share = (PARTITIONS as usize).div_ceil(nodes.len());
        let fair = owners.len() == PARTITIONS as usize
            && nodes.iter().all(|n| {
                let holds = owners.values().filter(|(o, _)| o == n).count();
                holds + 1 >= share && holds <= share
            });
        if fair {
            return owners;
        }
        assert!(Instant::now() < deadline, "never balanced: {owners:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The closing checks: no PLog offset, WLog offset or record ID acknowledged twice; every
/// acknowledged event reads back from `url` as acknowledged; no idempotency key applied twice
/// in any PLog; `monoseq verify` passes on database `db`.
pub async fn closing_checks(url: &str, acks: &[Ack], db: &str, dir: &Path) {
    let client = client(Duration::from_secs(20));
    let (mut plogs, mut wlogs, mut ids) = (HashSet::new(), HashSet::new(), HashSet::new());
    for a in acks {
        assert!(
            plogs.insert((a.partition, a.plog)),
            "PLog offset twice: {a:?}"
        );
        assert!(wlogs.insert((a.ws, a.wlog)), "WLog offset twice: {a:?}");
        assert!(ids.insert((a.ws, a.id)), "record ID twice: {a:?}");
    }
    for a in acks {
        let e: Value = client
            .get(format!(
                "{url}/v1/partitions/{}/events/{}",
                a.partition, a.plog
            ))
            .send()
            .await
            .expect("read an event")
            .json()
            .await
            .expect("an event");
        assert_eq!(
            e["ws"], a.ws,
            "acknowledged event lost or replaced: {a:?}: {e}"
        );
        assert_eq!(e["wlog_offset"], a.wlog, "{a:?}: {e}");
        assert_eq!(e["created"][0]["id"], a.id, "{a:?}: {e}");
        assert_eq!(e["idempotency_key"], a.key.as_str(), "{a:?}: {e}");
    }
    applied_once(&client, url).await;
    let out = Backend::Postgres(db.to_owned()).verify(dir);
    assert!(
        out.status.success(),
        "verify failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Reads every partition's PLog from `url` up to its first missing offset: no idempotency key
/// was written twice (a retry that reached another node after a fault was answered from the
/// original event, not applied again).
async fn applied_once(client: &reqwest::Client, url: &str) {
    let mut keys: HashMap<(u64, String), (u64, u64)> = HashMap::new();
    for p in 0..PARTITIONS {
        for offset in 1.. {
            let r = client
                .get(format!("{url}/v1/partitions/{p}/events/{offset}"))
                .send()
                .await
                .expect("read an event");
            if r.status() == 404 {
                break;
            }
            assert_eq!(r.status(), 200, "partition {p} offset {offset}");
            let e: Value = r.json().await.expect("an event");
            if let (Some(key), Some(ws)) = (e["idempotency_key"].as_str(), e["ws"].as_u64())
                && let Some(first) = keys.insert((ws, key.to_owned()), (p, offset))
            {
                panic!(
                    "command {key} of workspace {ws} applied twice: partition {} offset {} and \
                     partition {p} offset {offset}",
                    first.0, first.1
                );
            }
        }
    }
}
