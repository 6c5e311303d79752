//! The many-partition modes of `monoseq bench-consume`: `read` (one subscription stream, or
//! one live tail per partition, from offset 1 to the ends the partitions had when it began),
//! `group` (a consumer group's members, tasks of this process, catching up on every
//! partition) and `member` (one member that prints what it is given, for the rebalance
//! figures of `scripts/bench groups`). Every loop ends: by the ends reached, by `--seconds`,
//! or by the end of standard input.

use std::collections::{BTreeMap, BTreeSet};
use std::io::BufRead;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::{Args, ValueEnum};
use futures_util::StreamExt;
use monoseq_client::{GroupItem, GroupOptions};
use monoseq_wire::{SSE_EVENT, SSE_PROGRESS};

use super::Tool;

/// Default of `--seconds` of `read` and `group`: the longest a read may take.
const READ_SECONDS_DEFAULT: u64 = 600;
/// Default of `--seconds` of `member`: the longest a member stays.
const MEMBER_SECONDS_DEFAULT: u64 = 900;
/// How often a member commits what it read.
const COMMIT_EVERY: Duration = Duration::from_millis(200);
/// How often `group` looks whether its members reached every end.
const DONE_POLL: Duration = Duration::from_millis(5);

/// How `read` reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum How {
    /// One `GET /v1/events/stream` over every partition listed.
    Stream,
    /// One `GET /v1/partitions/{p}/events/stream` per partition.
    Followers,
}

/// `bench-consume read` flags.
#[derive(Debug, Clone, Args)]
pub struct ReadArgs {
    /// One stream, or a follower per partition.
    #[arg(long, value_enum)]
    how: How,
    /// The partitions, joined by commas, or `all`.
    #[arg(long, default_value = "all")]
    partitions: String,
    /// A filter of the stream, `name=value` (`command=bench.Marked`); repeatable.
    #[arg(long)]
    filter: Vec<String>,
    /// The longest the read may take.
    #[arg(long, default_value_t = READ_SECONDS_DEFAULT)]
    seconds: u64,
    /// Read live instead: from each partition's end, for this many seconds, while another
    /// process writes.
    #[arg(long)]
    live: Option<u64>,
}

/// `bench-consume group` flags.
#[derive(Debug, Clone, Args)]
pub struct GroupArgs {
    /// The group's name.
    #[arg(long, default_value = "bench")]
    group: String,
    /// Members (tasks of this process).
    #[arg(long, default_value_t = 4)]
    members: usize,
    /// The longest the read may take.
    #[arg(long, default_value_t = READ_SECONDS_DEFAULT)]
    seconds: u64,
}

/// `bench-consume member` flags.
#[derive(Debug, Clone, Args)]
pub struct MemberArgs {
    /// The group's name.
    #[arg(long, default_value = "bench")]
    group: String,
    /// This member's name.
    #[arg(long)]
    member: String,
    /// The session timeout, in milliseconds.
    #[arg(long)]
    session_timeout_ms: u64,
    /// The longest the member stays.
    #[arg(long, default_value_t = MEMBER_SECONDS_DEFAULT)]
    seconds: u64,
}

/// Each partition's end (the offset after its last event) now.
async fn ends(tool: &Tool, partitions: &[u32]) -> anyhow::Result<BTreeMap<u32, u64>> {
    let mut out = BTreeMap::new();
    for &p in partitions {
        out.insert(p, tool.client.read_partition(p, 1, 1).await?.end);
    }
    Ok(out)
}

/// `all` or partition numbers joined by commas.
fn listed(value: &str, of_server: u32) -> anyhow::Result<Vec<u32>> {
    if value == "all" {
        return Ok((0..of_server).collect());
    }
    let out: Vec<u32> = value
        .split(',')
        .map(str::parse)
        .collect::<Result<_, _>>()
        .context("--partitions is `all` or partition numbers joined by commas")?;
    if out.iter().any(|p| *p >= of_server) {
        bail!("--partitions names a partition the server (of {of_server}) does not have");
    }
    Ok(out)
}

/// Reads the partitions through one stream or a follower each until every one reached the
/// end it had when the read began; prints the events delivered, the events scanned, and the
/// rate of each.
pub(super) async fn read(tool: &Tool, of_server: u32, a: ReadArgs) -> anyhow::Result<()> {
    let partitions = listed(&a.partitions, of_server)?;
    let (ends, from, deadline) = match a.live {
        // Nothing ends a live read but its time: no end is ever reached.
        Some(s) => (
            partitions.iter().map(|p| (*p, u64::MAX)).collect(),
            "end",
            Instant::now() + Duration::from_secs(s),
        ),
        None => (
            ends(tool, &partitions).await?,
            "1",
            Instant::now() + Duration::from_secs(a.seconds),
        ),
    };
    let scanned: u64 = ends.values().map(|e| e.saturating_sub(1)).sum();
    let live = a.live.is_some();
    let began = Instant::now();
    let delivered = match a.how {
        How::Stream => {
            let list: Vec<String> = partitions.iter().map(u32::to_string).collect();
            let mut url = format!(
                "{}/v1/events/stream?partitions={}&from={from}",
                tool.url,
                list.join(",")
            );
            for f in &a.filter {
                url.push('&');
                url.push_str(f);
            }
            let answer = tool.http.get(&url).send().await?.error_for_status()?;
            drain(answer, ends.clone(), (true, live), deadline).await?
        }
        How::Followers => {
            if !a.filter.is_empty() {
                bail!("--filter is for --how stream (a partition's tail has no filter)");
            }
            let mut tasks = Vec::new();
            for (&p, &end) in &ends {
                let url = format!("{}/v1/partitions/{p}/events/stream?from={from}", tool.url);
                let answer = tool.http.get(&url).send().await?.error_for_status()?;
                let one = BTreeMap::from([(p, end)]);
                tasks.push(tokio::spawn(drain(answer, one, (false, live), deadline)));
            }
            let mut all = 0;
            for t in tasks {
                all += t.await??;
            }
            all
        }
    };
    let seconds = began.elapsed().as_secs_f64();
    let scanned = if live { delivered } else { scanned };
    println!(
        "consume: mode=read how={:?} partitions={} delivered={delivered} scanned={scanned} \
         seconds={seconds:.3} rate={:.0} delivered_rate={:.0}",
        a.how,
        partitions.len(),
        scanned as f64 / seconds,
        delivered as f64 / seconds
    );
    Ok(())
}

/// Reads an SSE answer until each partition of `ends` was read to its end (by its events,
/// or, `tagged`, by `progress` messages too), or, `live`, until `deadline`; the events
/// delivered. Scans each message for its kind and offsets without decoding its JSON (the
/// figures are of the server).
async fn drain(
    mut answer: reqwest::Response,
    ends: BTreeMap<u32, u64>,
    (tagged, live): (bool, bool),
    deadline: Instant,
) -> anyhow::Result<u64> {
    let mut next: BTreeMap<u32, u64> = ends.keys().map(|p| (*p, 1)).collect();
    let single = *ends.keys().next().context("no partition to read")?;
    let mut left = ends.iter().filter(|(_, end)| **end > 1).count();
    let mut buffer: Vec<u8> = Vec::new();
    let mut delivered = 0u64;
    while left > 0 {
        let wait = deadline.saturating_duration_since(Instant::now());
        if live && wait.is_zero() {
            return Ok(delivered);
        }
        let Ok(chunk) = tokio::time::timeout(wait, answer.chunk()).await else {
            if live {
                return Ok(delivered);
            }
            bail!("the read did not reach every end within --seconds ({left} partitions left)");
        };
        let Some(chunk) = chunk? else {
            bail!("a stream ended before its partitions' ends ({left} left)");
        };
        buffer.extend_from_slice(&chunk);
        let mut start = 0;
        while let Some(len) = find_blank_line(&buffer[start..]) {
            let block = &buffer[start..start + len];
            start += len + 2;
            let Some((kind, partition, after)) = scan(block, tagged) else {
                continue;
            };
            delivered += u64::from(kind == Kind::Event);
            let p = partition.unwrap_or(single);
            let (Some(n), Some(end)) = (next.get_mut(&p), ends.get(&p)) else {
                continue;
            };
            let was_short = *n < *end;
            *n = (*n).max(after);
            if was_short && *n >= *end {
                left -= 1;
            }
        }
        buffer.drain(..start);
    }
    Ok(delivered)
}

/// Where `\n\n` starts in `buf`.
fn find_blank_line(buf: &[u8]) -> Option<usize> {
    let mut at = 0;
    while let Some(i) = buf[at..].iter().position(|b| *b == b'\n') {
        let i = at + i;
        if buf.get(i + 1) == Some(&b'\n') {
            return Some(i);
        }
        at = i + 1;
    }
    None
}

#[derive(Debug, PartialEq, Eq)]
enum Kind {
    Event,
    Progress,
}

/// An SSE message's kind, partition (tagged streams) and the offset after what it covers.
fn scan(block: &[u8], tagged: bool) -> Option<(Kind, Option<u32>, u64)> {
    let text = std::str::from_utf8(block).ok()?;
    let kind_at = text.find("event: ")? + "event: ".len();
    let kind_end = kind_at + text[kind_at..].find('\n')?;
    let kind = match &text[kind_at..kind_end] {
        k if k == SSE_EVENT => Kind::Event,
        k if k == SSE_PROGRESS => Kind::Progress,
        _ => return None,
    };
    if !tagged {
        let id: u64 = number_after(text, "id: ")?;
        return Some((kind, None, id + 1));
    }
    let partition = u32::try_from(number_after(text, "\"partition\":")?).ok()?;
    let after = match kind {
        Kind::Event => number_after(text, "\"plog_offset\":")? + 1,
        Kind::Progress => number_after(text, "\"next\":")?,
    };
    Some((kind, Some(partition), after))
}

/// The decimal number right after the first `key` in `text`.
fn number_after(text: &str, key: &str) -> Option<u64> {
    let at = text.find(key)? + key.len();
    let digits = text[at..]
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len() - at);
    text[at..at + digits].parse().ok()
}

/// `--members` members catch up on every partition; prints the events delivered (with
/// those delivered again after a rebalance), the events to read, and the rate.
pub(super) async fn group(tool: &Tool, of_server: u32, a: GroupArgs) -> anyhow::Result<()> {
    let partitions: Vec<u32> = (0..of_server).collect();
    let ends = ends(tool, &partitions).await?;
    let events: u64 = ends.values().map(|e| e.saturating_sub(1)).sum();
    let shared = Arc::new(Shared {
        read: partitions.iter().map(|_| AtomicU64::new(1)).collect(),
        delivered: AtomicU64::new(0),
    });
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let began = Instant::now();
    let mut tasks = Vec::new();
    for m in 0..a.members {
        let consumer = tool
            .client
            .join_group(&a.group, &format!("m{m}"), GroupOptions::default());
        let task = group_member(consumer, Arc::clone(&shared), stop_rx.clone());
        tasks.push(tokio::spawn(task));
    }
    let deadline = began + Duration::from_secs(a.seconds);
    let reached = || {
        ends.iter()
            .all(|(p, end)| shared.read[*p as usize].load(Ordering::Relaxed) >= *end)
    };
    while !reached() && Instant::now() < deadline && !tasks.iter().any(|t| t.is_finished()) {
        tokio::time::sleep(DONE_POLL).await;
    }
    let seconds = began.elapsed().as_secs_f64();
    let done = reached();
    let _ = stop_tx.send(true);
    for t in tasks {
        t.await??;
    }
    if !done {
        bail!("the group did not read every partition to its end within --seconds");
    }
    let delivered = shared.delivered.load(Ordering::Relaxed);
    println!(
        "consume: mode=group members={} events={events} delivered={delivered} \
         seconds={seconds:.3} rate={:.0}",
        a.members,
        events as f64 / seconds
    );
    Ok(())
}

/// What a group's members note as they read.
struct Shared {
    /// The offset after the last event read, by partition.
    read: Vec<AtomicU64>,
    /// Events delivered (again after a rebalance included).
    delivered: AtomicU64,
}

/// One member of `group`: reads until told to stop, committing what it read every
/// [`COMMIT_EVERY`] (as a consumer does, so that a partition moved as the members join is
/// read again only from there), then commits and leaves.
async fn group_member(
    mut consumer: monoseq_client::GroupConsumer,
    shared: Arc<Shared>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let mut last: BTreeMap<u32, u64> = BTreeMap::new();
    let mut tick = tokio::time::interval(COMMIT_EVERY);
    while !*stop.borrow() {
        let item = tokio::select! {
            item = consumer.next() => item,
            _ = tick.tick() => {
                commit_read(&consumer, &mut last).await;
                continue;
            }
            _ = stop.changed() => break,
        };
        match item {
            Some(Ok(GroupItem::Event { partition, event })) => {
                shared.delivered.fetch_add(1, Ordering::Relaxed);
                last.insert(partition, event.plog_offset);
                if let Some(r) = shared.read.get(partition as usize) {
                    r.fetch_max(event.plog_offset + 1, Ordering::Relaxed);
                }
            }
            Some(Ok(GroupItem::Revoked(b))) => {
                for p in &b.partitions {
                    last.remove(p);
                }
            }
            Some(Ok(_)) => {}
            Some(Err(e)) => return Err(e.into()),
            None => break,
        }
    }
    commit_read(&consumer, &mut last).await;
    let _ = consumer.leave().await;
    Ok(())
}

/// Commits the last offset read of each partition `last` names (a commit refused because
/// the partition moved is dropped: its new member commits it).
async fn commit_read(consumer: &monoseq_client::GroupConsumer, last: &mut BTreeMap<u32, u64>) {
    for (p, offset) in std::mem::take(last) {
        let _ = consumer.commit(p, offset).await;
    }
}

/// One member that prints what it is given (see `Mode::Member`).
pub(super) async fn member(tool: &Tool, a: MemberArgs) -> anyhow::Result<()> {
    let (leave_tx, mut leave_rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            match line {
                Ok(l) if l.trim() == "leave" => break,
                Ok(_) => {}
                Err(_) => break,
            }
        }
        let _ = leave_tx.send(());
    });
    let options =
        GroupOptions::default().session_timeout(Duration::from_millis(a.session_timeout_ms));
    println!("joining");
    let mut consumer = tool.client.join_group(&a.group, &a.member, options);
    let (mut fresh, mut last, mut committed) = (BTreeSet::new(), BTreeMap::new(), BTreeMap::new());
    let mut tick = tokio::time::interval(COMMIT_EVERY);
    let bound = tokio::time::sleep(Duration::from_secs(a.seconds));
    tokio::pin!(bound);
    let list =
        |ps: &mut dyn Iterator<Item = u32>| ps.map(|p| p.to_string()).collect::<Vec<_>>().join(",");
    loop {
        tokio::select! {
            item = consumer.next() => match item {
                Some(Ok(GroupItem::Assigned(b))) => {
                    fresh.extend(b.partitions.iter().map(|p| p.partition));
                    println!("assigned {}", list(&mut b.partitions.iter().map(|p| p.partition)));
                }
                Some(Ok(GroupItem::Revoked(b))) => {
                    println!("revoked {}", list(&mut b.partitions.iter().copied()));
                }
                Some(Ok(GroupItem::Lost { partitions, reason })) => {
                    println!("lost {} {reason}", list(&mut partitions.iter().copied()));
                }
                Some(Ok(GroupItem::Event { partition, event })) => {
                    last.insert(partition, event.plog_offset);
                    if fresh.remove(&partition) {
                        println!("event {partition}");
                    }
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(e.into()),
                None => break,
            },
            _ = tick.tick() => {
                for (&p, &offset) in &last {
                    if committed.get(&p) != Some(&offset) && consumer.commit(p, offset).await.is_ok() {
                        committed.insert(p, offset);
                    }
                }
                last.retain(|p, _| consumer.held().contains(p));
            }
            _ = leave_rx.recv() => break,
            () = &mut bound => break,
        }
    }
    let _ = consumer.leave().await;
    println!("left");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_gives_its_kind_partition_and_the_offset_after_it() {
        let event =
            b"event: event\ndata: {\"partition\":3,\"event\":{\"plog_offset\":41,\"ws\":7}}";
        assert_eq!(scan(event, true), Some((Kind::Event, Some(3), 42)));
        let progress = b"event: progress\ndata: {\"partition\":2,\"next\":90}";
        assert_eq!(scan(progress, true), Some((Kind::Progress, Some(2), 90)));
        let tail = b"id: 12\nevent: event\ndata: {\"plog_offset\":12}";
        assert_eq!(scan(tail, false), Some((Kind::Event, None, 13)));
        assert_eq!(scan(b"id: 0:5,1:7", true), None);
        assert_eq!(scan(b"event: heartbeat\ndata: {}", true), None);
        assert_eq!(find_blank_line(b"a\nb\n\nc"), Some(3));
        assert_eq!(find_blank_line(b"a\nb\n"), None);
    }
}
