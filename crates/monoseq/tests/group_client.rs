//! The client's consumer group member (`monoseq-client`'s `join_group`) against the real
//! binary: two members share the partitions with no partition held twice, commit as they go
//! (the group's positions are the consumer positions under its name), and the one left takes
//! every partition over when the other closes its stream, nothing skipped; a member whose
//! server was killed and restarted joins again by itself (a new session) and resumes after
//! its commits.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{FixedServer, Server, free_port};
use futures_util::StreamExt;
use monoseq_client::{Client, CommandBody, ErrorCode, GroupConsumer, GroupItem, GroupOptions};

const PARTITIONS: u64 = 4;
const BOUND: Duration = Duration::from_secs(30);

/// What a member saw: each partition's delivered offsets, what it holds, and its sessions.
#[derive(Debug, Default)]
struct Seen {
    events: BTreeMap<u32, Vec<u64>>,
    held: BTreeSet<u32>,
    joins: u32,
    lost: u32,
}

type Shared = Arc<Mutex<Seen>>;

/// Consumes `member` in a task: records every item and commits each event as processed.
fn run(mut member: GroupConsumer) -> (Shared, tokio::task::JoinHandle<()>) {
    let seen = Shared::default();
    let out = seen.clone();
    let task = tokio::spawn(async move {
        while let Some(item) = member.next().await {
            let item = item.expect("the member's stream retries by itself");
            let Some((p, o)) = record(&mut seen.lock().unwrap(), item) else {
                continue;
            };
            match member.commit(p, o).await {
                Ok(()) => {}
                Err(e) if e.code() == ErrorCode::StaleGeneration => {}
                Err(e) => panic!("commit of {p}:{o}: {e}"),
            }
        }
    });
    (out, task)
}

/// Records one item; an event's (partition, offset) to commit.
fn record(seen: &mut Seen, item: GroupItem) -> Option<(u32, u64)> {
    match item {
        GroupItem::Joined(_) => seen.joins += 1,
        GroupItem::Assigned(a) => seen.held.extend(a.partitions.iter().map(|p| p.partition)),
        GroupItem::Revoked(r) => r.partitions.iter().for_each(|p| {
            seen.held.remove(p);
        }),
        GroupItem::Lost { partitions, .. } => {
            seen.lost += 1;
            partitions.iter().for_each(|p| {
                seen.held.remove(p);
            });
        }
        GroupItem::Event { partition, event } => {
            assert!(
                seen.held.contains(&partition),
                "an event of a partition held"
            );
            let offset = event.plog_offset;
            seen.events.entry(partition).or_default().push(offset);
            return Some((partition, offset));
        }
        GroupItem::Gap { .. } | GroupItem::Progress(_) => {}
    }
    None
}

/// Writes `n` commands spread over the partitions; their (partition, offset).
async fn write(client: &Client, first: u64, n: u64) -> Vec<(u32, u64)> {
    let mut out = Vec::new();
    for k in first..first + n {
        let done = client
            .submit(&CommandBody::new(1 + k % (PARTITIONS * 3), 1, "app.Note"))
            .await
            .unwrap();
        out.push((done.outcome.partition, done.outcome.plog_offset));
    }
    out
}

/// Each partition's last offset of `written`.
fn last_offsets(written: &[(u32, u64)]) -> BTreeMap<u32, u64> {
    let mut last = BTreeMap::new();
    for (p, o) in written {
        let e = last.entry(*p).or_insert(0);
        *e = (*e).max(*o);
    }
    last
}

/// The group's committed positions, as consumer positions.
async fn committed(client: &Client, group: &str) -> BTreeMap<u32, u64> {
    let positions = client.positions(group).await.unwrap();
    positions.iter().map(|p| (p.partition, p.offset)).collect()
}

/// Waits until `check` holds of the members' sightings.
async fn until(members: &[&Shared], what: &str, check: impl Fn(&[&Seen]) -> bool) {
    let started = Instant::now();
    loop {
        {
            let guards: Vec<_> = members.iter().map(|m| m.lock().unwrap()).collect();
            let seen: Vec<&Seen> = guards.iter().map(|g| &**g).collect();
            if check(&seen) {
                return;
            }
            assert!(started.elapsed() < BOUND, "{what}: {seen:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Whether every written event was delivered to one of `seen`.
fn all_delivered(seen: &[&Seen], written: &[(u32, u64)]) -> bool {
    written.iter().all(|(p, o)| {
        seen.iter()
            .any(|s| s.events.get(p).is_some_and(|e| e.contains(o)))
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_share_the_partitions_commit_and_the_survivor_takes_over() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &["--partitions", "4"]);
    let client = Client::new(&server.url).unwrap();
    let mut written = write(&client, 0, 12).await;
    let (a, a_task) = run(client.join_group("fleet", "a", GroupOptions::default()));
    until(&[&a], "a holds every partition", |s| s[0].held.len() == 4).await;
    let (b, b_task) = run(client.join_group("fleet", "b", GroupOptions::default()));
    until(&[&a, &b], "a and b hold two each", |s| {
        s[0].held.len() == 2 && s[1].held.len() == 2
    })
    .await;
    assert!(
        a.lock().unwrap().held.is_disjoint(&b.lock().unwrap().held),
        "no partition held twice"
    );
    written.extend(write(&client, 12, 12).await);
    until(&[&a, &b], "every event delivered", |s| {
        all_delivered(s, &written)
    })
    .await;
    for (p, offsets) in &b.lock().unwrap().events {
        let sorted = offsets.windows(2).all(|w| w[0] < w[1]);
        assert!(sorted, "partition {p} in order at b: {offsets:?}");
    }

    // b's process ends (its stream closes): a takes its partitions, from b's commits on.
    b_task.abort();
    let _ = b_task.await;
    until(&[&a], "a holds every partition again", |s| {
        s[0].held.len() == 4
    })
    .await;
    let more = write(&client, 24, 8).await;
    until(&[&a], "a delivers what was written after", |s| {
        all_delivered(s, &more)
    })
    .await;
    written.extend(more);
    // The group's positions are consumer positions: each partition's last event, committed.
    let last = last_offsets(&written);
    let started = Instant::now();
    while committed(&client, "fleet").await != last {
        assert!(started.elapsed() < BOUND, "the commits");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    a_task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_joins_again_after_its_server_restarts_and_resumes_after_its_commits() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let mut server = FixedServer::start(dir.path(), port, &[]);
    let client = Client::new(&url).unwrap();
    let before = write(&client, 0, 8).await;
    let options = GroupOptions::default().session_timeout(Duration::from_millis(2_000));
    let member = client.join_group("g", "m", options);
    let committer = member.committer();
    let (m, task) = run(member);
    until(&[&m], "the first events", |s| all_delivered(s, &before)).await;
    // Each commit is made right after its event was recorded: wait for the last ones to land.
    let last = last_offsets(&before);
    let started = Instant::now();
    while committed(&client, "g").await != last {
        assert!(started.elapsed() < BOUND, "the commits");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    server.kill();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let _server = FixedServer::start(dir.path(), port, &[]);
    let after = write(&client, 8, 8).await;
    until(
        &[&m],
        "a new session delivers the events written after",
        |s| s[0].joins >= 2 && s[0].held.len() == 4 && all_delivered(s, &after),
    )
    .await;
    {
        let seen = m.lock().unwrap();
        assert!(seen.lost >= 1, "the lost session was reported: {seen:?}");
        for (p, offsets) in &seen.events {
            let once: BTreeSet<u64> = offsets.iter().copied().collect();
            assert_eq!(
                once.len(),
                offsets.len(),
                "partition {p}: resumed after the commits, nothing again: {offsets:?}"
            );
        }
    }
    // After the leave, the partitions it held cannot be committed through it.
    let held = committer.held();
    assert_eq!(held.len(), 4);
    committer.leave().await.unwrap();
    tokio::time::timeout(BOUND, task)
        .await
        .expect("the stream ends after the leave")
        .unwrap();
    let refused = committer.commit(held[0], u64::MAX).await.unwrap_err();
    assert_eq!(refused.code(), ErrorCode::StaleGeneration, "{refused}");
}
