//! Consumer groups on real nodes over a real PostgreSQL: a fleet of members, each one a
//! process of its own (this test binary run again as a member: the Rust client's
//! `join_group`, through a node of its own choosing), shares a group's partitions under keyed
//! load while a member is SIGKILLed or paused past its session, while the node hosting
//! members' sessions is SIGKILLed, and while the database fails over to its standby. Each
//! member writes its history line by line as it happens (every session, assignment,
//! revocation, delivery with its partition, offset, session and generation, every commit and
//! its answer), and the histories are checked afterwards (`history.rs`): the holders of a
//! partition follow one another in generation order, each starting at the last position the
//! ones before committed, no commit sent after the next holder's claim was accepted, no event
//! written after it delivered to the holder before, and every acknowledged event reached a
//! member. A member's heartbeat, commit and leave sent to a node
//! other than the one holding its stream reach its session.
//!
//! This file is its own harness (`harness = false`): run with `MONOSEQ_GROUP_MEMBER` set, the
//! binary plays a member instead (`member.rs`).

mod common;
#[path = "groups_cluster/history.rs"]
mod history;
#[path = "groups_cluster/member.rs"]
mod member;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::Backend;
use common::keyed::{self, Load, balanced};
use common::node::{LEASE_MS, Node};
use common::sse::Sse;
use history::{Histories, now_ms};
use serde_json::{Value, json};

const GROUP: &str = "fleet";
/// Session timeout of the fleet's members.
const SESSION_TIMEOUT_MS: u64 = 2_000;
/// Longest wait for the members to have every acknowledged event once the load stopped.
const CATCH_UP: Duration = Duration::from_secs(60);
/// Longest wait for a group to reach a state a test waits for.
const SETTLE: Duration = Duration::from_secs(60);

/// A member process: its history file and the child.
struct MemberProcess {
    name: String,
    history: PathBuf,
    child: Child,
}

impl MemberProcess {
    /// Member `name` of [`GROUP`] through `urls` (the first is the node it joins through).
    fn start(dir: &Path, name: &str, urls: &[String]) -> MemberProcess {
        let history = dir.join(format!("{name}.history"));
        let log = std::fs::File::create(dir.join(format!("{name}.log"))).expect("a member log");
        let child = Command::new(std::env::current_exe().expect("this test binary"))
            .env(member::MEMBER_VAR, &history)
            .env(member::URLS_VAR, urls.join(","))
            .env(member::GROUP_VAR, GROUP)
            .env(member::NAME_VAR, name)
            .env(member::TIMEOUT_VAR, SESSION_TIMEOUT_MS.to_string())
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("a member process");
        MemberProcess {
            name: name.to_owned(),
            history,
            child,
        }
    }

    fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([signal, &self.child.id().to_string()])
            .status()
            .expect("kill");
        assert!(status.success(), "kill {signal} {}", self.name);
    }

    /// SIGKILL: the member dies mid-stream, without leaving or committing.
    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for MemberProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A fleet and what it knows of its members.
struct Fleet {
    members: Vec<MemberProcess>,
}

impl Fleet {
    /// Member `m{i}` joining through `through[i]`, the other nodes after it.
    fn start(dir: &Path, nodes: &[String], through: &[usize]) -> Fleet {
        let members = through
            .iter()
            .enumerate()
            .map(|(i, &n)| {
                let mut urls = vec![nodes[n].clone()];
                urls.extend(nodes.iter().filter(|u| **u != nodes[n]).cloned());
                MemberProcess::start(dir, &format!("m{i}"), &urls)
            })
            .collect();
        Fleet { members }
    }

    fn histories(&self) -> Histories {
        Histories::read(self.members.iter().map(|m| m.history.as_path()))
    }

    /// Waits until every partition is held and each member of `live` holds its share.
    async fn settled(&self, live: &[usize], partitions: u32) {
        let deadline = Instant::now() + SETTLE;
        loop {
            let h = self.histories();
            let held: Vec<usize> = live.iter().map(|&m| h.held_now(m).len()).collect();
            let share = (partitions as usize).div_ceil(live.len());
            if held.iter().sum::<usize>() == partitions as usize
                && held.iter().all(|&n| n + 1 >= share && n <= share)
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the fleet never settled: {held:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until the members delivered every acknowledged event (the load stopped).
    async fn caught_up(&self, acked: &BTreeMap<(u32, u64), u64>) {
        let deadline = Instant::now() + CATCH_UP;
        loop {
            let delivered = self.histories().delivered();
            let missing: Vec<(u32, u64)> = acked
                .keys()
                .filter(|e| !delivered.contains(e))
                .copied()
                .collect();
            if missing.is_empty() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{} acknowledged events never delivered to a member, e.g. {:?}",
                missing.len(),
                &missing[..missing.len().min(10)]
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Stops every member (SIGKILL: each history is complete up to its last line) and checks
    /// the histories against the acknowledged events.
    fn check(mut self, acked: &BTreeMap<(u32, u64), u64>) -> Histories {
        for m in &mut self.members {
            m.kill();
        }
        let h = self.histories();
        let report = h.check(acked);
        eprintln!("{report}");
        assert!(report.violations.is_empty(), "{report}");
        h
    }
}

/// The acknowledged events of a stopped load, each with when its command was first sent
/// (milliseconds since the epoch).
async fn stop(load: Load) -> BTreeMap<(u32, u64), u64> {
    let (acks, _) = load.stop().await;
    let (now, now_wall) = (Instant::now(), now_ms());
    acks.iter()
        .map(|a| {
            let ago = now.saturating_duration_since(a.at) + a.took;
            let sent = now_wall.saturating_sub(u64::try_from(ago.as_millis()).unwrap_or(u64::MAX));
            (
                (u32::try_from(a.partition).expect("a partition"), a.plog),
                sent,
            )
        })
        .collect()
}

/// Three nodes on database `db`, balanced.
async fn three_nodes(db: &str, dir: &Path) -> Vec<Node> {
    let nodes = Node::start_together(
        ["n0", "n1", "n2"]
            .iter()
            .map(|id| Node::on(db, id, dir))
            .collect(),
    );
    let client = keyed::client(Duration::from_secs(10));
    balanced(&client, &nodes[0].url, &["n0", "n1", "n2"]).await;
    nodes
}

fn partitions() -> u32 {
    u32::try_from(common::node::PARTITIONS).expect("a partition count")
}

/// The first delivery of each of `moved` after `since` (ms since the epoch), at any member
/// but `but`; waits for all of them at most `bound`, and answers the latest's delay.
async fn redelivered(
    fleet: &Fleet,
    moved: &[u32],
    but: usize,
    since: u64,
    bound: Duration,
) -> Duration {
    let deadline = Instant::now() + bound;
    loop {
        let h = fleet.histories();
        let firsts: Vec<Option<u64>> = moved
            .iter()
            .map(|&p| h.first_event_after(p, since, but))
            .collect();
        if firsts.iter().all(Option::is_some) {
            let last = firsts.iter().flatten().max().copied().unwrap_or(since);
            return Duration::from_millis(last.saturating_sub(since));
        }
        assert!(
            Instant::now() < deadline,
            "partitions {moved:?} were not delivered again within {bound:?}: {firsts:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn a_killed_members_partitions_deliver_at_the_others_within_its_timeout_and_a_paused_members_late_commits_are_refused()
 {
    let db = Backend::postgres_url();
    let dir = tempfile::tempdir().unwrap();
    let nodes = three_nodes(&db, dir.path()).await;
    let urls = common::node::urls_of(&nodes);
    let fleet = Fleet::start(dir.path(), &urls, &[0, 1, 2]);
    let load = Load::start(&keyed::urls(&urls), 3, "kill");
    fleet.settled(&[0, 1, 2], partitions()).await;
    load.progress(100, SETTLE).await.expect("the load runs");

    // m1 dies: its partitions deliver at the others within its session timeout plus 1 s.
    let mut fleet = fleet;
    let moved = fleet.histories().held_now(1);
    let (session, generation) = fleet.histories().last_session(1).expect("m1's session");
    let killed = now_ms();
    fleet.members[1].kill();
    let took = redelivered(
        &fleet,
        &moved,
        1,
        killed,
        Duration::from_millis(SESSION_TIMEOUT_MS + 1_000),
    )
    .await;
    eprintln!("m1's partitions {moved:?} delivered again at the others {took:?} after its SIGKILL");
    // Its session's commit, sent now through any node, is refused.
    let client = keyed::client(Duration::from_secs(10));
    let stale = client
        .post(format!("{}/v1/groups/{GROUP}/commit", urls[2]))
        .json(&json!({"session": session, "generation": generation,
                       "positions": [{"partition": moved[0], "offset": 0}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(stale.status(), 409);
    let body: Value = stale.json().await.unwrap();
    assert_eq!(body["code"], "stale_generation", "{body}");

    // m2 is paused past its session: its partitions move, and what it commits once it wakes
    // is refused (the history check finds any such commit that was accepted).
    fleet.settled(&[0, 2], partitions()).await;
    let paused = fleet.histories().held_now(2);
    fleet.members[2].signal("-STOP");
    let stopped = now_ms();
    redelivered(&fleet, &paused, 2, stopped, SETTLE).await;
    fleet.members[2].signal("-CONT");
    fleet.settled(&[0, 2], partitions()).await;
    load.progress(100, SETTLE).await.expect("the load runs");

    let acked = stop(load).await;
    fleet.caught_up(&acked).await;
    let h = fleet.check(&acked);
    // Whether the woken member commits before it reads its session's end is a race: the check
    // above fails on any late commit that was accepted, and the probe before it proves a stale
    // commit is refused, so the count is reported, not required.
    eprintln!(
        "the paused member's late commits refused: {}",
        h.refused_commits(2)
    );
}

async fn a_group_survives_the_sigkill_of_the_node_hosting_its_members_sessions() {
    let db = Backend::postgres_url();
    let dir = tempfile::tempdir().unwrap();
    let nodes = three_nodes(&db, dir.path()).await;
    let urls = common::node::urls_of(&nodes);
    // m0 and m1 join through n0, m2 through n1, m3 through n2.
    let fleet = Fleet::start(dir.path(), &urls, &[0, 0, 1, 2]);
    let shared = keyed::urls(&urls);
    let load = Load::start(&shared, 3, "node");
    fleet.settled(&[0, 1, 2, 3], partitions()).await;
    load.progress(100, SETTLE).await.expect("the load runs");

    let mut moved = fleet.histories().held_now(0);
    moved.extend(fleet.histories().held_now(1));
    shared.lock().unwrap().retain(|u| *u != urls[0]);
    let mut nodes = nodes;
    let n0 = nodes.remove(0);
    let killed = now_ms();
    n0.kill();
    // n0's members join again through the others; their old sessions expire (their renewals
    // stopped), and the node's partitions move to the other nodes.
    let bound = Duration::from_millis(SESSION_TIMEOUT_MS + LEASE_MS) + Duration::from_secs(10);
    let took = redelivered(&fleet, &moved, usize::MAX, killed, bound).await;
    eprintln!(
        "the partitions of n0's members {moved:?} delivered again {took:?} after n0's SIGKILL"
    );
    fleet.settled(&[0, 1, 2, 3], partitions()).await;
    let client = keyed::client(Duration::from_secs(10));
    let group: Value = client
        .get(format!("{}/v1/groups/{GROUP}", urls[1]))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let on_n0 = group["members"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["node"] == urls[0].as_str())
        .count();
    assert_eq!(
        on_n0, 0,
        "a session of the dead node is still listed: {group}"
    );
    load.progress(100, SETTLE).await.expect("the load runs");
    let acked = stop(load).await;
    fleet.caught_up(&acked).await;
    fleet.check(&acked);
}

async fn a_group_survives_a_database_failover_to_its_synchronous_standby() {
    let pair = tokio::task::spawn_blocking(|| {
        monoseq_pg::testing::PgPair::start().unwrap_or_else(|e| panic!("{e}"))
    })
    .await
    .unwrap();
    let pair = Arc::new(pair);
    let db = pair.url(monoseq_pg::testing::DATABASE);
    let dir = tempfile::tempdir().unwrap();
    let nodes = three_nodes(&db, dir.path()).await;
    let urls = common::node::urls_of(&nodes);
    let fleet = Fleet::start(dir.path(), &urls, &[0, 1, 2]);
    let load = Load::start(&keyed::urls(&urls), 3, "failover");
    fleet.settled(&[0, 1, 2], partitions()).await;
    load.progress(100, SETTLE).await.expect("the load runs");

    let p = Arc::clone(&pair);
    let failed_over = now_ms();
    tokio::task::spawn_blocking(move || {
        p.kill_primary().unwrap_or_else(|e| panic!("{e}"));
        p.promote_standby().unwrap_or_else(|e| panic!("{e}"));
    })
    .await
    .unwrap();
    load.progress(200, Duration::from_secs(60))
        .await
        .expect("the nodes serve again after the failover");
    fleet.settled(&[0, 1, 2], partitions()).await;
    eprintln!(
        "the fleet settled again {} ms after the failover began",
        now_ms() - failed_over
    );
    let acked = stop(load).await;
    fleet.caught_up(&acked).await;
    fleet.check(&acked);
}

/// The next message named `name` of `sse`, skipping others; `None` past `bound`.
async fn next_named(sse: &mut Sse, name: &str, bound: Duration) -> Option<Value> {
    let deadline = Instant::now() + bound;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let m = sse.next(left).await?;
        if m.event == name {
            return Some(m.data);
        }
    }
}

async fn status(r: reqwest::RequestBuilder) -> (u16, Value) {
    let r = r.send().await.unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

async fn heartbeats_commits_and_leaves_sent_to_another_node_reach_the_members_session() {
    const BEAT_EVERY: Duration = Duration::from_millis(SESSION_TIMEOUT_MS / 5);
    const BEATS: u64 = 10;
    let db = Backend::postgres_url();
    let dir = tempfile::tempdir().unwrap();
    let nodes = Node::start_together(vec![
        Node::on(&db, "a", dir.path()),
        Node::on(&db, "b", dir.path()),
    ]);
    let client = keyed::client(Duration::from_secs(10));
    balanced(&client, &nodes[0].url, &["a", "b"]).await;
    let (a, b) = (nodes[0].url.clone(), nodes[1].url.clone());
    let mut sender = keyed::Sender::new(&keyed::urls(&[&a]), keyed::Through::Client);
    sender.send(1, "e1", 1).await;
    let stream = format!("{a}/v1/groups/g/stream?member=m&session_timeout_ms={SESSION_TIMEOUT_MS}");
    let mut sse = Sse::open(&client, &stream, None).await;
    let joined = next_named(&mut sse, "joined", SETTLE)
        .await
        .expect("joined");
    let session = joined["session"].as_str().unwrap().to_owned();
    let assigned = next_named(&mut sse, "assigned", SETTLE)
        .await
        .expect("assigned");
    let generation = assigned["generation"].as_u64().unwrap();
    // Heartbeats only through b, for twice the session timeout: the session lives on at a.
    for _ in 0..BEATS {
        let (code, body) = status(
            client
                .post(format!("{b}/v1/groups/g/heartbeat"))
                .json(&json!({ "session": session })),
        )
        .await;
        assert_eq!(code, 204, "{body}");
        assert!(
            next_named(&mut sse, "session_ended", BEAT_EVERY)
                .await
                .is_none(),
            "the session ended though its heartbeats reached another node"
        );
    }
    // Commits through b, and no heartbeat, for twice the session timeout: each is stored,
    // fenced by the session, and counts as its heartbeat at a.
    let p = assigned["partitions"][0]["partition"].as_u64().unwrap();
    for _ in 0..BEATS {
        let (code, body) = status(client.post(format!("{b}/v1/groups/g/commit")).json(&json!({
            "session": session, "generation": generation,
            "positions": [{"partition": p, "offset": 0}]
        })))
        .await;
        assert_eq!(code, 200, "{body}");
        assert!(
            next_named(&mut sse, "session_ended", BEAT_EVERY)
                .await
                .is_none(),
            "the session ended though its commits reached another node"
        );
    }
    // A heartbeat of a session nobody hosts is refused by either node, relayed or not.
    for url in [&a, &b] {
        let (code, body) = status(
            client
                .post(format!("{url}/v1/groups/g/heartbeat"))
                .json(&json!({ "session": "m~0.0" })),
        )
        .await;
        assert_eq!(
            (code, body["code"].as_str()),
            (409, Some("unknown_session"))
        );
    }
    // The leave through b ends the stream at a.
    let (code, body) = status(client.delete(format!("{b}/v1/groups/g/members/{session}"))).await;
    assert_eq!(code, 204, "{body}");
    let ended = next_named(&mut sse, "session_ended", SETTLE)
        .await
        .expect("the session ended");
    assert_eq!(ended["reason"], "left", "{ended}");
}

/// What the command line asks of this harness, in libtest's terms: test names to run (a test
/// runs when its name contains one, or equals one under `--exact`; none runs all), `--list`,
/// and `--ignored`, under which nothing runs (no test here is ignored).
fn wanted(name: &str, args: &[String]) -> bool {
    let exact = args.iter().any(|a| a == "--exact");
    let mut filters = Vec::new();
    let mut rest = args.iter();
    while let Some(a) = rest.next() {
        match a.as_str() {
            "--skip" | "--test-threads" | "--format" | "--color" | "--logfile" | "-Z" => {
                rest.next();
            }
            "--ignored" => return false,
            _ if !a.starts_with('-') => filters.push(a.as_str()),
            _ => {}
        }
    }
    filters.is_empty()
        || filters
            .iter()
            .any(|f| if exact { name == *f } else { name.contains(f) })
}

type Test = (
    &'static str,
    fn() -> std::pin::Pin<Box<dyn Future<Output = ()>>>,
);

fn main() {
    if std::env::var_os(member::MEMBER_VAR).is_some() {
        member::run();
        return;
    }
    let tests: [Test; 4] = [
        (
            "a_killed_members_partitions_deliver_at_the_others_within_its_timeout_and_a_paused_members_late_commits_are_refused",
            || {
                Box::pin(a_killed_members_partitions_deliver_at_the_others_within_its_timeout_and_a_paused_members_late_commits_are_refused())
            },
        ),
        (
            "a_group_survives_the_sigkill_of_the_node_hosting_its_members_sessions",
            || Box::pin(a_group_survives_the_sigkill_of_the_node_hosting_its_members_sessions()),
        ),
        (
            "a_group_survives_a_database_failover_to_its_synchronous_standby",
            || Box::pin(a_group_survives_a_database_failover_to_its_synchronous_standby()),
        ),
        (
            "heartbeats_commits_and_leaves_sent_to_another_node_reach_the_members_session",
            || {
                Box::pin(
                    heartbeats_commits_and_leaves_sent_to_another_node_reach_the_members_session(),
                )
            },
        ),
    ];
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--list") {
        for (name, _) in tests.iter().filter(|(n, _)| wanted(n, &args)) {
            println!("{name}: test");
        }
        return;
    }
    let mut failed = Vec::new();
    let chosen: Vec<&Test> = tests.iter().filter(|(n, _)| wanted(n, &args)).collect();
    println!("\nrunning {} tests", chosen.len());
    for (name, test) in chosen {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a runtime");
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            runtime.block_on(test());
        }));
        drop(runtime);
        let verdict = if outcome.is_ok() { "ok" } else { "FAILED" };
        println!("test {name} ... {verdict}");
        if outcome.is_err() {
            failed.push(*name);
        }
    }
    if !failed.is_empty() {
        println!("\nfailures: {failed:?}");
        std::process::exit(101);
    }
    println!("\ntest result: ok");
}
