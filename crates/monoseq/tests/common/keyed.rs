//! Keyed commands to a cluster and the closing checks after a fault: every command carries its
//! own `Idempotency-Key` and is retried (same key, same body) until a node acknowledges it,
//! through the Rust client (`monoseq-client`, to the partition's owner) or, where a test checks
//! what the nodes answer, in raw HTTP through the nodes in turn; every answer that is not an
//! acknowledgement is tallied by node and code. The closing checks: no PLog offset, WLog offset
//! or record ID acknowledged twice, every acknowledged event read back as acknowledged, no key
//! applied twice in any PLog, `monoseq verify` passing.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use monoseq_client::ErrorCode;
use serde_json::{Value, json};

use super::Backend;
use super::node::PARTITIONS;

/// Longest a sender retries one command before the test fails.
pub const COMMAND_DEADLINE: Duration = Duration::from_secs(90);
/// Longest wait for one answer: a node that cannot reach the database may hold a request
/// until its storage gives up; the sender then tries again with the same key.
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);
/// Most commands one client of a [`Load`] sends, whatever happens.
const COMMANDS_PER_CLIENT_MAX: u64 = 20_000;
/// Workspaces a [`Load`]'s clients send to (`1..=LOAD_WORKSPACES`) unless given a partition.
const LOAD_WORKSPACES: u64 = 30;

/// What a client was told for one command, and when.
#[derive(Debug, Clone)]
pub struct Ack {
    /// Its `Idempotency-Key` (empty: sent without one).
    pub key: String,
    pub ws: u64,
    pub partition: u64,
    pub plog: u64,
    pub wlog: u64,
    /// The real IDs of its records, by raw ID.
    pub ids: Vec<u64>,
    /// When it was acknowledged, and how long after it was first sent.
    pub at: Instant,
    pub took: Duration,
}

impl Ack {
    /// The acknowledgement `body` (a 200 answer to `POST /v1/commands`) of a command of
    /// workspace `ws` with `key` (empty: none), first sent at `sent`.
    pub fn of(key: &str, ws: u64, body: &Value, sent: Instant) -> Ack {
        let ids = body["ids"].as_object().expect("the real IDs");
        let mut ids: Vec<(u64, u64)> = ids
            .iter()
            .map(|(raw, id)| (raw.parse().expect("a raw ID"), id.as_u64().expect("an ID")))
            .collect();
        ids.sort_unstable();
        Ack {
            key: key.to_owned(),
            ws,
            partition: body["partition"].as_u64().expect("a partition"),
            plog: body["plog_offset"].as_u64().expect("a PLog offset"),
            wlog: body["wlog_offset"].as_u64().expect("a WLog offset"),
            ids: ids.into_iter().map(|(_, id)| id).collect(),
            at: Instant::now(),
            took: sent.elapsed(),
        }
    }
}

/// The URLs clients may use now (a load balancer's view).
pub type Urls = Arc<Mutex<Vec<String>>>;

pub fn urls<S: AsRef<str>>(list: &[S]) -> Urls {
    Arc::new(Mutex::new(
        list.iter().map(|u| u.as_ref().to_owned()).collect(),
    ))
}

/// Answers other than an acknowledgement, by node (`client` when the Rust client answered
/// after its retries) and code (`error` for no answer at all).
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

/// The Rust client of the nodes at `urls`, retrying a command at most `retry` before it
/// answers the last refusal.
pub fn rust_client<S: AsRef<str>>(urls: &[S], retry: Duration) -> monoseq_client::Client {
    monoseq_client::Client::builder(urls.iter().map(|u| u.as_ref().to_owned()))
        .retry_timeout(retry)
        .request_timeout(ANSWER_TIMEOUT)
        .build()
        .expect("a client of the nodes")
}

/// Command `n` of workspace `ws`: a document and a row created.
pub fn command(ws: u64, n: u64) -> Value {
    json!({
        "ws": ws, "ws_kind": 1, "command": "test.Create",
        "create": [{"raw_id": 1, "kind": "CDoc", "name": "test.Doc", "fields": {"n": n}},
                   {"raw_id": 2, "kind": "WRecord", "name": "test.Row"}],
    })
}

/// A workspace of partition `p` (of [`PARTITIONS`]): the `k`-th one.
pub fn ws_of(p: u64, k: u64) -> u64 {
    p + PARTITIONS * (k + 1)
}

/// One attempt's refusal: the status (`None`: no answer), the code (`error` for no answer)
/// and what came back.
type Refusal = (Option<u16>, String, String);

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
    attempt_raw(client, url, (ws, key, n))
        .await
        .map_err(|(status, code, text)| match status {
            None | Some(503) => (code, text),
            Some(other) => panic!("{url} gave a wrong answer {other} to {key}: {text}"),
        })
}

async fn attempt_raw(
    client: &reqwest::Client,
    url: &str,
    (ws, key, n): (u64, &str, u64),
) -> Result<Ack, Refusal> {
    let sent = Instant::now();
    let answer = client
        .post(format!("{url}/v1/commands"))
        .header("idempotency-key", key)
        .json(&command(ws, n))
        .send()
        .await;
    let answer = match answer {
        Ok(a) => a,
        Err(e) => return Err((None, "error".to_owned(), with_sources(&e))),
    };
    let status = answer.status().as_u16();
    let body = match answer.json::<Value>().await {
        Ok(body) => body,
        Err(e) => return Err((None, "error".to_owned(), format!("{status}: {e}"))),
    };
    if status != 200 {
        let code = body["code"].as_str().unwrap_or("none").to_owned();
        return Err((Some(status), code, body.to_string()));
    }
    Ok(Ack::of(key, ws, &body, sent))
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

/// How a [`Sender`] reaches the nodes.
#[derive(Clone)]
pub enum Through {
    /// The Rust client (`monoseq-client`): each command to its partition's owner, retried
    /// with its key; rebuilt when the URLs change (a node killed, one restarted elsewhere).
    Client,
    /// Each attempt to the next of the URLs in turn (a load balancer), in raw HTTP with this
    /// client: for tests of what the nodes answer (forwarding, codes under a fault).
    Turns(reqwest::Client),
}

/// Sends keyed commands until acknowledged; any answer but an acknowledgement, a 503, no
/// answer or one of the codes it was told to retry fails the test.
pub struct Sender {
    urls: Urls,
    through: Through,
    built: Option<(Vec<String>, monoseq_client::Client)>,
    answers: Arc<Answers>,
    deadline: Duration,
    retried: &'static [&'static str],
}

impl Sender {
    /// A sender through the nodes of `urls`, retrying each command up to [`COMMAND_DEADLINE`].
    pub fn new(urls: &Urls, through: Through) -> Sender {
        Sender {
            urls: Arc::clone(urls),
            through,
            built: None,
            answers: Arc::default(),
            deadline: COMMAND_DEADLINE,
            retried: &[],
        }
    }

    /// Tallies refusals in `answers`.
    pub fn tally(mut self, answers: &Arc<Answers>) -> Sender {
        self.answers = Arc::clone(answers);
        self
    }

    /// Retries one command at most `deadline`.
    pub fn deadline(mut self, deadline: Duration) -> Sender {
        self.deadline = deadline;
        self
    }

    /// Retries answers with these codes too (whatever their status).
    pub fn retrying(mut self, codes: &'static [&'static str]) -> Sender {
        self.retried = codes;
        self
    }

    /// Command `n` of workspace `ws` with `key`, sent until a node acknowledges it; fails the
    /// test past the deadline.
    pub async fn send(&mut self, ws: u64, key: &str, n: u64) -> Ack {
        match self.try_send(ws, key, n).await {
            Ok(ack) => ack,
            Err(last) => panic!("command {key} was never acknowledged; last answer: {last}"),
        }
    }

    /// [`send`](Sender::send), giving up past the deadline with the last answer.
    pub async fn try_send(&mut self, ws: u64, key: &str, n: u64) -> Result<Ack, String> {
        let began = Instant::now();
        let mut turn = n as usize;
        let mut last = String::new();
        while began.elapsed() < self.deadline {
            turn += 1;
            let (url, answer) = self.once((ws, key, n), turn).await;
            let (status, code, text) = match answer {
                Ok(ack) => {
                    let took = began.elapsed();
                    return Ok(Ack { took, ..ack });
                }
                Err(refusal) => refusal,
            };
            let retried = matches!(status, None | Some(503)) || self.retried.contains(&&*code);
            assert!(
                retried,
                "{url} gave a wrong answer {status:?} to {key}: {text}"
            );
            self.answers.note(&url, &code);
            last = format!("{url}: {code}: {text}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Err(last)
    }

    /// One attempt (through the Rust client: one call, with its own retries); which node (or
    /// `client`) answered, and how.
    async fn once(
        &mut self,
        (ws, key, n): (u64, &str, u64),
        turn: usize,
    ) -> (String, Result<Ack, Refusal>) {
        let now = self.urls.lock().unwrap().clone();
        if let Through::Turns(client) = &self.through {
            let url = now[turn % now.len()].clone();
            let answer = attempt_raw(client, &url, (ws, key, n)).await;
            return (url, answer);
        }
        if self.built.as_ref().is_none_or(|(seen, _)| *seen != now) {
            let retry = self.deadline.min(ANSWER_TIMEOUT);
            self.built = Some((now.clone(), rust_client(&now, retry)));
        }
        let (_, client) = self.built.as_ref().expect("built above");
        let body: monoseq_client::CommandBody =
            serde_json::from_value(command(ws, n)).expect("a command body");
        let sent = Instant::now();
        let answer = match client.submit_with_key(&body, key).await {
            Ok(done) => {
                let o = done.outcome;
                Ok(Ack {
                    key: key.to_owned(),
                    ws,
                    partition: u64::from(o.partition),
                    plog: o.plog_offset,
                    wlog: o.wlog_offset,
                    ids: o.ids.into_values().collect(),
                    at: Instant::now(),
                    took: sent.elapsed(),
                })
            }
            Err(e) => {
                let code = if e.code() == ErrorCode::Transport {
                    "error"
                } else {
                    e.code().as_str()
                };
                Err((e.status(), code.to_owned(), e.to_string()))
            }
        };
        ("client".to_owned(), answer)
    }
}

/// What the clients of a [`Load`] send, and how.
#[derive(Clone)]
pub struct Plan {
    pub through: Through,
    /// Every client on a workspace of its own in this partition (else workspaces `1..=30`).
    pub partition: Option<u64>,
    /// Give a command up after this long (logged) instead of failing the test.
    pub give_up: Option<Duration>,
    /// Codes retried besides 503s and no answer.
    pub retried: &'static [&'static str],
    /// Commands a client sends in one `POST /v1/commands/batch`, each batch to the next node
    /// in turn, which relays the shares of partitions others own (with [`Through::Turns`]
    /// only); 0, one command a request.
    pub batch: u64,
}

impl Default for Plan {
    fn default() -> Plan {
        Plan {
            through: Through::Client,
            partition: None,
            give_up: None,
            retried: &[],
            batch: 0,
        }
    }
}

/// `POST /v1/commands/batch` to `url` of `commands`, each with its key (carried in the command
/// as `idempotency_key`): the answer's status and body.
pub async fn post_keyed_batch<'a>(
    http: &reqwest::Client,
    url: &str,
    commands: impl IntoIterator<Item = (&'a str, Value)>,
) -> Result<(u16, Value), reqwest::Error> {
    let commands: Vec<Value> = commands
        .into_iter()
        .map(|(key, mut command)| {
            command["idempotency_key"] = json!(key);
            command
        })
        .collect();
    let r = http
        .post(format!("{url}/v1/commands/batch"))
        .json(&json!({ "commands": commands }))
        .send()
        .await?;
    Ok((r.status().as_u16(), r.json::<Value>().await?))
}

/// Client `c` of a [`Load`] sending keyed batches of `plan.batch` commands, each to the next
/// node in turn, until `stop`: a command refused for now (503, a code `plan.retried` names, or
/// no answer) goes again in the next batch with its key, until acknowledged or
/// [`COMMAND_DEADLINE`] passes; any other answer fails the test.
async fn batch_client(
    (urls, http): (Urls, reqwest::Client),
    (c, tag, plan): (u64, String, Plan),
    acks: Arc<Mutex<Vec<Ack>>>,
    stop: Arc<AtomicBool>,
) {
    let mut n = 0;
    let mut turn = c as usize;
    while !stop.load(Ordering::SeqCst) && n < COMMANDS_PER_CLIENT_MAX {
        let mut pending: Vec<(u64, String, u64, Instant)> = (0..plan.batch)
            .map(|_| {
                n += 1;
                let ws = (c * 7 + n) % LOAD_WORKSPACES + 1;
                (ws, format!("{tag}-c{c}-{n}"), n, Instant::now())
            })
            .collect();
        let began = Instant::now();
        while !pending.is_empty() {
            assert!(
                began.elapsed() < COMMAND_DEADLINE,
                "commands {pending:?} were never acknowledged"
            );
            turn += 1;
            let url = {
                let now = urls.lock().unwrap();
                now[turn % now.len()].clone()
            };
            let commands = pending
                .iter()
                .map(|(ws, key, n, _)| (key.as_str(), command(*ws, *n)));
            let answer = post_keyed_batch(&http, &url, commands).await;
            let results = match answer {
                Ok((200, body)) => body["results"].as_array().cloned().unwrap_or_default(),
                Ok((503, _)) | Err(_) => Vec::new(),
                Ok((status, body)) => {
                    panic!("{url} gave a wrong answer {status} to a batch: {body}")
                }
            };
            let mut left = Vec::new();
            for (i, (ws, key, n, sent)) in pending.into_iter().enumerate() {
                let Some(result) = results.get(i) else {
                    left.push((ws, key, n, sent));
                    continue;
                };
                let code = result["error"]["code"].as_str().unwrap_or("none");
                match result["status"].as_u64() {
                    Some(200) => {
                        acks.lock()
                            .unwrap()
                            .push(Ack::of(&key, ws, &result["outcome"], sent))
                    }
                    Some(503) => left.push((ws, key, n, sent)),
                    _ if plan.retried.contains(&code) => left.push((ws, key, n, sent)),
                    _ => panic!("{url} gave a wrong answer to {key} in a batch: {result}"),
                }
            }
            pending = left;
            if !pending.is_empty() {
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
    /// `clients` clients sending through the Rust client to the nodes of `urls`, keys
    /// prefixed `tag`.
    pub fn start(urls: &Urls, clients: u64, tag: &str) -> Load {
        Load::start_with(urls, clients, tag, Plan::default())
    }

    /// [`start`](Load::start) as `plan` says.
    pub fn start_with(urls: &Urls, clients: u64, tag: &str, plan: Plan) -> Load {
        let acks: Arc<Mutex<Vec<Ack>>> = Arc::default();
        let answers: Arc<Answers> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        assert!(
            plan.batch == 0 || matches!(plan.through, Through::Turns(_)),
            "batches go to the nodes in turn"
        );
        let tasks = (0..clients)
            .map(|c| {
                if let (Through::Turns(http), true) = (&plan.through, plan.batch > 0) {
                    let to = (Arc::clone(urls), http.clone());
                    let (acks, stop) = (Arc::clone(&acks), Arc::clone(&stop));
                    return tokio::spawn(batch_client(
                        to,
                        (c, tag.to_owned(), plan.clone()),
                        acks,
                        stop,
                    ));
                }
                let mut sender = Sender::new(urls, plan.through.clone())
                    .tally(&answers)
                    .retrying(plan.retried)
                    .deadline(plan.give_up.unwrap_or(COMMAND_DEADLINE));
                let (acks, stop, plan) = (Arc::clone(&acks), Arc::clone(&stop), plan.clone());
                let tag = tag.to_owned();
                tokio::spawn(async move {
                    let mut n = 0;
                    while !stop.load(Ordering::SeqCst) && n < COMMANDS_PER_CLIENT_MAX {
                        n += 1;
                        let ws = match plan.partition {
                            Some(p) => ws_of(p, c),
                            None => (c * 7 + n) % LOAD_WORKSPACES + 1,
                        };
                        let key = format!("{tag}-c{c}-{n}");
                        match sender.try_send(ws, &key, n).await {
                            Ok(ack) => acks.lock().unwrap().push(ack),
                            Err(last) if plan.give_up.is_some() => {
                                eprintln!("gave up {key} (workspace {ws}): {last}");
                            }
                            Err(last) => {
                                panic!("command {key} was never acknowledged; last answer: {last}")
                            }
                        }
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

/// Waits until each of [`PARTITIONS`] partitions has a live owner and each of `nodes` holds
/// its fair share.
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

/// The closing checks: [`assert_once`], [`assert_read_back`] and [`assert_applied_once`]
/// through `url`, then `monoseq verify` on database `db`.
pub async fn closing_checks(url: &str, acks: &[Ack], db: &str, dir: &Path) {
    let client = rust_client(&[url], Duration::from_secs(20));
    assert_once(acks);
    assert_read_back(&client, acks).await;
    assert_applied_once(&client).await;
    verify(db, dir);
}

/// No PLog offset, WLog offset or record ID acknowledged twice.
pub fn assert_once(acks: &[Ack]) {
    let (mut plogs, mut wlogs, mut ids) = (HashSet::new(), HashSet::new(), HashSet::new());
    for a in acks {
        assert!(
            plogs.insert((a.partition, a.plog)),
            "PLog offset twice: {a:?}"
        );
        assert!(wlogs.insert((a.ws, a.wlog)), "WLog offset twice: {a:?}");
        for id in &a.ids {
            assert!(ids.insert((a.ws, *id)), "record ID {id} twice: {a:?}");
        }
    }
}

/// Every acknowledged event reads back through `client` as acknowledged: its workspace, WLog
/// offset, record and argument IDs, and its key (or none).
pub async fn assert_read_back(client: &monoseq_client::Client, acks: &[Ack]) {
    for a in acks {
        let partition = u32::try_from(a.partition).expect("a partition number");
        let e = client
            .event(partition, a.plog)
            .await
            .unwrap_or_else(|e| panic!("read {a:?} back: {e}"))
            .unwrap_or_else(|| panic!("acknowledged event lost: {a:?}"));
        assert_eq!(e.ws, a.ws, "acknowledged event replaced: {a:?}: {e:?}");
        assert_eq!(e.wlog_offset, a.wlog, "{a:?}: {e:?}");
        let mut stored: Vec<u64> = e.created.iter().map(|r| r.id).collect();
        stored.extend(e.argument.as_ref().map(|arg| arg.id));
        let mut acked = a.ids.clone();
        stored.sort_unstable();
        acked.sort_unstable();
        assert_eq!(stored, acked, "the IDs of {a:?}: {e:?}");
        let key = (!a.key.is_empty()).then_some(&*a.key);
        assert_eq!(e.idempotency_key.as_deref(), key, "{a:?}: {e:?}");
    }
}

/// Reads every partition's PLog through `client` up to its first missing offset: no
/// idempotency key was written twice (a retry that reached another node after a fault, a
/// failover or a handover was answered from the original event, not applied again).
pub async fn assert_applied_once(client: &monoseq_client::Client) {
    let mut keys: HashMap<(u64, String), (u64, u64)> = HashMap::new();
    for p in 0..PARTITIONS {
        let partition = u32::try_from(p).expect("a partition number");
        for offset in 1.. {
            let e = client
                .event(partition, offset)
                .await
                .unwrap_or_else(|e| panic!("partition {p} offset {offset}: {e}"));
            let Some(e) = e else {
                break;
            };
            if let Some(key) = e.idempotency_key
                && let Some(first) = keys.insert((e.ws, key.clone()), (p, offset))
            {
                panic!(
                    "command {key} of workspace {} applied twice: partition {} offset {} and \
                     partition {p} offset {offset}",
                    e.ws, first.0, first.1
                );
            }
        }
    }
}

/// `monoseq verify` passes on database `db` (data directory `dir`).
pub fn verify(db: &str, dir: &Path) {
    let out = Backend::Postgres(db.to_owned()).verify(dir);
    assert!(
        out.status.success(),
        "verify failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
