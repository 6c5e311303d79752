//! Streams over many partitions and consumer groups, over real HTTP against the real binary:
//! a subscription's events tagged with partition and offset in PLog order per partition,
//! resumed from a vector or started at the end; filters with their progress messages; a
//! group's members sharing the partitions, rebalancing on join, leave and a quiet member,
//! refusing a stale member's commit, and redelivering from the committed position; a plain
//! `PUT` or `DELETE` of a position a member holds refused; bad input.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::Server;
use common::sse::{Message, Sse};
use serde_json::{Value, json};

const PARTITIONS: u32 = 4;
const BOUND: Duration = Duration::from_secs(10);

fn start(dir: &std::path::Path) -> Server {
    Server::start(dir, &["--partitions", "4"])
}

async fn post(client: &reqwest::Client, url: &str, ws: u64, command: &str) -> Value {
    let body = json!({"ws": ws, "ws_kind": 1, "command": command});
    let r = client
        .post(format!("{url}/v1/commands"))
        .json(&body)
        .send()
        .await
        .unwrap();
    let code = r.status();
    let answer: Value = r.json().await.unwrap();
    assert_eq!(code, 200, "{answer}");
    answer
}

/// Commands on workspaces 0..n (spread over the partitions); each answer's partition and offset.
async fn post_many(client: &reqwest::Client, url: &str, n: u64, command: &str) -> Vec<(u32, u64)> {
    let mut out = Vec::new();
    for ws in 1..=n {
        let a = post(client, url, ws, command).await;
        out.push((
            a["partition"].as_u64().unwrap() as u32,
            a["plog_offset"].as_u64().unwrap(),
        ));
    }
    out
}

/// The next `event` message's (partition, offset), skipping others; `None` past the bound.
async fn next_event(sse: &mut Sse) -> Option<(u32, u64, Value)> {
    loop {
        let m = sse.next(BOUND).await?;
        if m.event == "event" {
            let p = m.data["partition"].as_u64().unwrap() as u32;
            let o = m.data["event"]["plog_offset"].as_u64().unwrap();
            return Some((p, o, m.data));
        }
    }
}

/// The next message named `name`, skipping others (heartbeats among them) for at most
/// [`BOUND`] in all.
async fn next_named(sse: &mut Sse, name: &str) -> Message {
    let deadline = std::time::Instant::now() + BOUND;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let m = sse
            .next(left)
            .await
            .unwrap_or_else(|| panic!("no {name} message within {BOUND:?}"));
        if m.event == name {
            return m;
        }
    }
}

async fn status(r: reqwest::RequestBuilder) -> (u16, Value) {
    let r = r.send().await.unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn a_subscription_delivers_every_partition_in_plog_order_and_resumes_from_a_vector() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path());
    let client = reqwest::Client::new();
    let written = post_many(&client, &server.url, 24, "app.Note").await;
    let mut sse = Sse::open(
        &client,
        &format!("{}/v1/events/stream?partitions=all", server.url),
        None,
    )
    .await;
    let mut got: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
    for _ in 0..written.len() {
        let (p, o, _) = next_event(&mut sse).await.expect("every written event");
        got.entry(p).or_default().push(o);
    }
    let mut want: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
    for (p, o) in &written {
        want.entry(*p).or_default().push(*o);
    }
    assert_eq!(got, want, "each partition's events once, in PLog order");
    drop(sse);

    // Resume from a vector: partition 0 after its second event, the others at their end.
    let mut vector: Vec<String> = Vec::new();
    for p in 0..PARTITIONS {
        let next = want.get(&p).map_or(1, |o| o.last().unwrap() + 1);
        let from = if p == 0 { want[&0][2] } else { next };
        vector.push(format!("{p}:{from}"));
    }
    let url = format!("{}/v1/events/stream", server.url);
    let mut resumed = Sse::open(&client, &format!("{url}?from={}", vector.join(",")), None).await;
    let more = post_many(&client, &server.url, 4, "app.Note").await;
    let mut expected: Vec<(u32, u64)> = want[&0][2..].iter().map(|&o| (0, o)).collect();
    expected.extend(more);
    let mut seen = Vec::new();
    for _ in 0..expected.len() {
        let (p, o, _) = next_event(&mut resumed).await.expect("the resumed events");
        seen.push((p, o));
    }
    seen.sort_unstable();
    expected.sort_unstable();
    assert_eq!(seen, expected);
}

/// Writes `n` commands named `command` in batches of 500 over workspaces `first..first+n`.
async fn post_batches(client: &reqwest::Client, url: &str, first: u64, n: u64, command: &str) {
    for start in (first..first + n).step_by(500) {
        let commands: Vec<Value> = (start..(start + 500).min(first + n))
            .map(|ws| json!({"ws": ws, "ws_kind": 1, "command": command}))
            .collect();
        let r = client
            .post(format!("{url}/v1/commands/batch"))
            .json(&json!({ "commands": commands }))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let answer: Value = r.json().await.unwrap();
        let results = answer["results"]
            .as_array()
            .expect("a batch answers each command");
        assert!(
            results.iter().all(|r| r["status"] == 200),
            "every command written: {answer}"
        );
    }
}

/// A stream reader that stops reading while its partitions' hubs move far past their small
/// buffers falls behind them; it goes back to page reads of the store and still delivers every
/// event once, in PLog order per partition, with nothing skipped where it fell behind.
#[tokio::test]
async fn a_stream_reader_that_falls_behind_its_hubs_reads_pages_and_misses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(
        dir.path(),
        &["--partitions", "4", "--follower-buffer-events", "16"],
    );
    let client = reqwest::Client::new();
    post_batches(&client, &server.url, 1, 40, "app.Before").await;
    let mut sse = Sse::open(
        &client,
        &format!("{}/v1/events/stream?partitions=all", server.url),
        None,
    )
    .await;
    let mut got: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
    for _ in 0..40 {
        let (p, o, _) = next_event(&mut sse).await.expect("the first events");
        got.entry(p).or_default().push(o);
    }
    // Caught up, the reader follows the hubs. It now reads nothing while far more is written
    // than the hubs' buffers, the stream's channel and the socket's buffers hold together.
    const LATER: u64 = 20_000;
    post_batches(&client, &server.url, 41, LATER, "app.After").await;
    for _ in 0..LATER {
        let (p, o, _) = next_event(&mut sse).await.expect("every later event");
        got.entry(p).or_default().push(o);
    }
    for (p, offsets) in &got {
        let want: Vec<u64> = (1..=offsets.len() as u64).collect();
        assert_eq!(
            offsets, &want,
            "partition {p}: each event once, in PLog order"
        );
    }
    assert_eq!(
        got.values().map(Vec::len).sum::<usize>(),
        40 + LATER as usize
    );
}

#[tokio::test]
async fn from_end_starts_each_partition_at_its_end_and_last_event_id_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path());
    let client = reqwest::Client::new();
    post_many(&client, &server.url, 8, "app.Old").await;
    let mut sse = Sse::open(
        &client,
        &format!("{}/v1/events/stream?from=end", server.url),
        None,
    )
    .await;
    // Let every reader learn its end before the new command is written.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (p, o) = post_many(&client, &server.url, 1, "app.New").await[0];
    let (gp, go, data) = next_event(&mut sse).await.expect("the new event");
    assert_eq!((gp, go), (p, o));
    assert_eq!(data["event"]["command"], "app.New");
    // A resume vector in Last-Event-ID wins over `from`.
    let r = client
        .get(format!(
            "{}/v1/events/stream?partitions={p}&from=1",
            server.url
        ))
        .header("last-event-id", format!("{p}:{o}"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let mut resumed = Sse::from_response(r);
    let (rp, ro, _) = next_event(&mut resumed).await.unwrap();
    assert_eq!((rp, ro), (p, o));
}

#[tokio::test]
async fn a_filtered_stream_delivers_only_matches_and_reports_how_far_it_read() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path());
    let client = reqwest::Client::new();
    let mut written = Vec::new();
    for ws in 1..=12u64 {
        let command = if ws % 3 == 0 {
            "app.PayOrder"
        } else {
            "app.ShipOrder"
        };
        let a = post(&client, &server.url, ws, command).await;
        written.push((
            a["partition"].as_u64().unwrap() as u32,
            a["plog_offset"].as_u64().unwrap(),
            command,
        ));
    }
    let url = format!("{}/v1/events/stream?command_prefix=app.Pay", server.url);
    let mut sse = Sse::open(&client, &url, None).await;
    let mut matches = 0;
    let mut progress: BTreeMap<u32, u64> = BTreeMap::new();
    let want_matches = written.iter().filter(|w| w.2 == "app.PayOrder").count();
    let ends: BTreeMap<u32, u64> = written.iter().fold(BTreeMap::new(), |mut m, (p, o, _)| {
        let e = m.entry(*p).or_insert(0);
        *e = (*e).max(o + 1);
        m
    });
    // Heartbeats keep coming, so the whole wait is bounded, not each message's.
    let deadline = std::time::Instant::now() + BOUND;
    while matches < want_matches
        || ends
            .iter()
            .any(|(p, e)| progress.get(p).copied().unwrap_or(0) < *e)
    {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let m = sse.next(left).await.unwrap_or_else(|| {
            panic!("matches and progress up to each end {ends:?} within {BOUND:?}: {progress:?}")
        });
        match m.event.as_str() {
            "event" => {
                assert_eq!(m.data["event"]["command"], "app.PayOrder");
                matches += 1;
                let p = m.data["partition"].as_u64().unwrap() as u32;
                let next = m.data["event"]["plog_offset"].as_u64().unwrap() + 1;
                let e = progress.entry(p).or_insert(0);
                *e = (*e).max(next);
            }
            "progress" => {
                let p = m.data["partition"].as_u64().unwrap() as u32;
                progress.insert(p, m.data["next"].as_u64().unwrap());
            }
            _ => {}
        }
    }
    assert_eq!(matches, want_matches);
    // An exact name, a workspace and a kind filter too.
    let url = format!(
        "{}/v1/events/stream?command=app.ShipOrder&ws=4&kind=1",
        server.url
    );
    let mut sse = Sse::open(&client, &url, None).await;
    let (_, _, data) = next_event(&mut sse).await.unwrap();
    assert_eq!(
        (
            data["event"]["ws"].as_u64(),
            data["event"]["command"].as_str()
        ),
        (Some(4), Some("app.ShipOrder"))
    );
}

#[tokio::test]
async fn bad_stream_and_group_parameters_are_refused_naming_them() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path());
    let client = reqwest::Client::new();
    for (query, named) in [
        ("/v1/events/stream?limt=1", "limt"),
        ("/v1/events/stream?partitions=4", "partition 4"),
        ("/v1/events/stream?partitions=0,0", "twice"),
        ("/v1/events/stream?from=0:x", "partition:offset"),
        ("/v1/events/stream?command=", "empty"),
        ("/v1/events/stream?kind=70000", "kind"),
        ("/v1/groups/g/stream", "member"),
        ("/v1/groups/g/stream?member=a/b", "member"),
        (
            "/v1/groups/g/stream?member=a&session_timeout_ms=10",
            "session_timeout_ms",
        ),
        (
            "/v1/groups/g/stream?member=a&session_timeout_ms=300001",
            "session_timeout_ms",
        ),
        ("/v1/groups/g/stream?member=a&x=1", "`x`"),
        ("/v1/groups?x=1", "`x`"),
    ] {
        let (code, body) = status(client.get(format!("{}{query}", server.url))).await;
        assert_eq!(code, 400, "{query}: {body}");
        assert!(
            body["message"].as_str().unwrap().contains(named),
            "{query}: {body}"
        );
    }
    let long = "g".repeat(256);
    let (code, _) =
        status(client.get(format!("{}/v1/groups/{long}/stream?member=a", server.url))).await;
    assert_eq!(code, 400);
    let (code, body) = status(
        client
            .post(format!("{}/v1/groups/g/commit", server.url))
            .json(&json!({
                "session": "s", "generation": 1, "positions": [{"partition": 9, "offset": 1}]
            })),
    )
    .await;
    assert_eq!(
        (code, body["code"].as_str()),
        (404, Some("no_such_partition")),
        "{body}"
    );
    let (code, body) = status(
        client
            .post(format!("{}/v1/groups/g/commit", server.url))
            .json(&json!({"session": "", "generation": 1, "positions": []})),
    )
    .await;
    assert_eq!(code, 400, "{body}");
    let (code, body) = status(
        client
            .post(format!("{}/v1/groups/g/heartbeat", server.url))
            .json(&json!({"session": "nobody"})),
    )
    .await;
    assert_eq!(
        (code, body["code"].as_str()),
        (409, Some("unknown_session"))
    );
    let (code, body) = status(client.get(format!("{}/v1/groups/nosuch", server.url))).await;
    assert_eq!((code, body["code"].as_str()), (404, Some("unknown_group")));
}

/// A member's open session: its stream, its id, and a task sending its heartbeats.
struct Member {
    sse: Sse,
    session: String,
    beats: Option<tokio::task::JoinHandle<()>>,
    held: BTreeMap<u32, u64>,
    generation: u64,
}

impl Member {
    async fn join(
        client: &reqwest::Client,
        url: &str,
        group: &str,
        name: &str,
        extra: &str,
        beat: bool,
    ) -> Member {
        let mut sse = Sse::open(
            client,
            &format!("{url}/v1/groups/{group}/stream?member={name}{extra}"),
            None,
        )
        .await;
        let joined = next_named(&mut sse, "joined").await;
        let session = joined.data["session"].as_str().unwrap().to_owned();
        let beats = beat.then(|| {
            let (client, url, group, session) = (
                client.clone(),
                url.to_owned(),
                group.to_owned(),
                session.clone(),
            );
            let every = Duration::from_millis(joined.data["heartbeat_ms"].as_u64().unwrap());
            tokio::spawn(async move {
                loop {
                    let _ = client
                        .post(format!("{url}/v1/groups/{group}/heartbeat"))
                        .json(&json!({ "session": session }))
                        .send()
                        .await;
                    tokio::time::sleep(every).await;
                }
            })
        });
        Member {
            sse,
            session,
            beats,
            held: BTreeMap::new(),
            generation: 0,
        }
    }

    /// Reads messages until it holds `count` partitions and no message came for a while;
    /// returns the events delivered meanwhile.
    async fn settle(&mut self, count: usize) -> Vec<(u32, u64)> {
        let mut events = Vec::new();
        loop {
            let quiet = if self.held.len() == count {
                Duration::from_millis(700)
            } else {
                BOUND
            };
            let Some(m) = self.sse.next(quiet).await else {
                assert_eq!(self.held.len(), count, "{:?}", self.held);
                return events;
            };
            self.apply(&m, &mut events);
        }
    }

    fn apply(&mut self, m: &Message, events: &mut Vec<(u32, u64)>) {
        match m.event.as_str() {
            "assigned" => {
                self.generation = m.data["generation"].as_u64().unwrap();
                for a in m.data["partitions"].as_array().unwrap() {
                    let p = a["partition"].as_u64().unwrap() as u32;
                    assert!(
                        self.held
                            .insert(p, a["position"].as_u64().unwrap())
                            .is_none()
                    );
                }
            }
            "revoked" => {
                self.generation = m.data["generation"].as_u64().unwrap();
                for p in m.data["partitions"].as_array().unwrap() {
                    assert!(self.held.remove(&(p.as_u64().unwrap() as u32)).is_some());
                }
            }
            "event" => {
                let p = m.data["partition"].as_u64().unwrap() as u32;
                assert!(
                    self.held.contains_key(&p),
                    "an event of partition {p}, not held"
                );
                events.push((p, m.data["event"]["plog_offset"].as_u64().unwrap()));
            }
            _ => {}
        }
    }

    async fn commit(
        &self,
        client: &reqwest::Client,
        url: &str,
        group: &str,
        p: u32,
        offset: u64,
    ) -> (u16, Value) {
        status(
            client
                .post(format!("{url}/v1/groups/{group}/commit"))
                .json(&json!({
                    "session": self.session, "generation": self.generation,
                    "positions": [{"partition": p, "offset": offset}]
                })),
        )
        .await
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        if let Some(b) = self.beats.take() {
            b.abort();
        }
    }
}

#[tokio::test]
async fn members_share_the_partitions_and_rebalance_on_join_and_leave() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path());
    let client = reqwest::Client::new();
    let url = server.url.clone();
    let mut a = Member::join(&client, &url, "fleet", "a", "", true).await;
    a.settle(4).await;
    // Rebalanced on the join (each settle waits up to `BOUND` for its share); how soon, 1 s at
    // most, is a figure: `scripts/bench groups`, "join → balanced".
    let mut b = Member::join(&client, &url, "fleet", "b", "", true).await;
    b.settle(2).await;
    a.settle(2).await;
    assert!(
        a.held.keys().all(|p| !b.held.contains_key(p)),
        "no partition held twice"
    );
    let (code, group) = status(client.get(format!("{url}/v1/groups/fleet"))).await;
    assert_eq!(code, 200);
    assert_eq!(group["members"].as_array().unwrap().len(), 2);
    assert!(
        group["partitions"]
            .as_array()
            .unwrap()
            .iter()
            .all(|p| p["state"] == "held")
    );
    // b leaves cleanly: a takes everything back.
    let (code, _) =
        status(client.delete(format!("{url}/v1/groups/fleet/members/{}", b.session))).await;
    assert_eq!(code, 204);
    let ended = next_named(&mut b.sse, "session_ended").await;
    assert_eq!(ended.data["reason"], "left");
    a.settle(4).await;
    // a's stream closes: the group is empty, and can then be deleted.
    drop(a);
    let mut members = 1;
    for _ in 0..50 {
        let (_, group) = status(client.get(format!("{url}/v1/groups/fleet"))).await;
        members = group["members"].as_array().unwrap().len();
        if members == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(members, 0, "a closed stream leaves the group");
    let (code, list) = status(client.get(format!("{url}/v1/groups"))).await;
    assert_eq!(
        (code, list["groups"][0]["group"].as_str()),
        (200, Some("fleet"))
    );
    let (code, _) = status(client.delete(format!("{url}/v1/groups/fleet"))).await;
    assert_eq!(code, 204);
}

#[tokio::test]
async fn a_member_that_lost_its_partition_cannot_commit_and_the_next_holder_resumes_at_the_commit()
{
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path());
    let client = reqwest::Client::new();
    let url = server.url.clone();
    let written = post_many(&client, &url, 16, "app.Note").await;
    // a holds every partition without heartbeats (a paused process): it is expired after 1 s.
    let mut a = Member::join(&client, &url, "g", "a", "&session_timeout_ms=1000", false).await;
    let events = a.settle(4).await;
    assert_eq!(events.len(), written.len());
    let p = written[0].0;
    let in_p: Vec<u64> = written.iter().filter(|w| w.0 == p).map(|w| w.1).collect();
    let (code, body) = a.commit(&client, &url, "g", p, in_p[0]).await;
    assert_eq!(code, 200, "{body}");
    let mut b = Member::join(&client, &url, "g", "b", "", true).await;
    // a's session ends for want of heartbeats; b gets everything, p from a's commit on.
    let ended = next_named(&mut a.sse, "session_ended").await;
    assert_eq!(ended.data["reason"], "session_expired");
    let delivered = b.settle(4).await;
    assert_eq!(b.held[&p], in_p[0], "p starts at the committed position");
    let redelivered: Vec<u64> = delivered.iter().filter(|d| d.0 == p).map(|d| d.1).collect();
    assert_eq!(
        redelivered,
        in_p[1..].to_vec(),
        "redelivery from the commit, nothing skipped"
    );
    // a wakes up and commits: refused, and the group's position stays b's.
    let (code, body) = a.commit(&client, &url, "g", p, *in_p.last().unwrap()).await;
    assert_eq!(
        (code, body["code"].as_str()),
        (409, Some("stale_generation")),
        "{body}"
    );
    let (code, body) = b.commit(&client, &url, "g", p, in_p[1]).await;
    assert_eq!(code, 200, "{body}");
    let (_, pos) = status(client.get(format!("{url}/v1/consumers/g/partitions/{p}"))).await;
    assert_eq!(
        pos["offset"].as_u64(),
        Some(in_p[1]),
        "tail --consumer g reads the group's position"
    );
    let (_, group) = status(client.get(format!("{url}/v1/groups/g"))).await;
    let row = &group["partitions"][p as usize];
    assert_eq!(row["offset"].as_u64(), Some(in_p[1]));
    assert_eq!(
        row["lag"].as_u64(),
        Some((in_p.len() - 2) as u64),
        "{group}"
    );
}

#[tokio::test]
async fn a_put_or_delete_of_a_groups_position_is_refused_while_a_member_holds_the_partition() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path());
    let client = reqwest::Client::new();
    let url = server.url.clone();
    let written = post_many(&client, &url, 16, "app.Note").await;
    let mut a = Member::join(&client, &url, "g", "a", "", true).await;
    a.settle(4).await;
    let p = written[0].0;
    let in_p: Vec<u64> = written.iter().filter(|w| w.0 == p).map(|w| w.1).collect();
    let (code, body) = a.commit(&client, &url, "g", p, in_p[0]).await;
    assert_eq!(code, 200, "{body}");
    let position = format!("{url}/v1/consumers/g/partitions/{p}");
    // What `tail --consumer g` stores, a forced rewind, a first position: all refused.
    for put in [
        json!({"offset": in_p[0] + 1, "expected": in_p[0]}),
        json!({"offset": 0, "expected": in_p[0], "force": true}),
        json!({"offset": 0}),
    ] {
        let (code, body) = status(client.put(&position).json(&put)).await;
        assert_eq!(
            (code, body["code"].as_str()),
            (409, Some("partition_held")),
            "{put}: {body}"
        );
        assert!(
            body["message"]
                .as_str()
                .unwrap()
                .contains("stop the group's members"),
            "{body}"
        );
    }
    let (code, body) = status(client.delete(format!("{url}/v1/consumers/g"))).await;
    assert_eq!(
        (code, body["code"].as_str()),
        (409, Some("partition_held")),
        "{body}"
    );
    // Through the Rust client (what `tail --consumer g` stores with) the refusal is named.
    let rust = monoseq_client::Client::builder([url.clone()])
        .build()
        .unwrap();
    let refused = rust
        .set_position("g", p, in_p[0] + 1, Some(in_p[0]))
        .await
        .unwrap_err();
    assert_eq!(refused.code().as_str(), "partition_held", "{refused}");
    // The position is the member's, and it still commits.
    let (_, pos) = status(client.get(&position)).await;
    assert_eq!(pos["offset"].as_u64(), Some(in_p[0]), "{pos}");
    let (code, body) = a.commit(&client, &url, "g", p, in_p[1]).await;
    assert_eq!(code, 200, "{body}");
    // Once the member left, an operator's rewind is taken, and the next member starts there.
    let (code, _) = status(client.delete(format!("{url}/v1/groups/g/members/{}", a.session))).await;
    assert_eq!(code, 204);
    next_named(&mut a.sse, "session_ended").await;
    let rewind = json!({"offset": in_p[0], "expected": in_p[1], "force": true});
    let mut answer = (0, Value::Null);
    for _ in 0..50 {
        answer = status(client.put(&position).json(&rewind)).await;
        if answer.0 == 200 {
            break;
        }
        // The leave gives the partitions up within a step of the member's host.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(answer.0, 200, "{}", answer.1);
    let mut b = Member::join(&client, &url, "g", "b", "", true).await;
    b.settle(4).await;
    assert_eq!(b.held[&p], in_p[0], "the next member starts at the rewind");
}
