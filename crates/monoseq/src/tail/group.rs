//! `monoseq tail --group G --member M`: a member of consumer group `G` through
//! `monoseq-client`'s `join_group`. Prints each event of the partitions the group gives it as
//! one JSON line `{"partition": P, "event": {...}}` (a retired range as
//! `{"partition": P, "gap": {...}}`), commits the last offset printed of each partition within
//! a second, every 1000 entries and at the end, and joins again by itself after an outage (a
//! new session; delivery resumes after the group's committed positions, so lines printed but
//! not committed before a rebalance may be printed again, by this member or another).

use std::collections::BTreeMap;
use std::io::Write;
use std::time::Duration;

use anyhow::Context;
use futures_util::StreamExt;
use monoseq_client::{Client, GroupConsumer, GroupItem, GroupOptions};
use monoseq_wire::{ErrorCode, TaggedEventBody, TaggedGapBody};

use super::{STORE_EVERY, STORE_EVERY_ENTRIES};

/// What was printed and not committed yet, per partition.
#[derive(Default)]
struct Printed {
    last: BTreeMap<u32, u64>,
    unstored: u64,
}

impl Printed {
    /// Commits every partition's last printed offset; a partition the member lost is dropped
    /// (its next holder prints from the group's position).
    async fn commit(&mut self, member: &GroupConsumer) -> anyhow::Result<()> {
        for (p, offset) in std::mem::take(&mut self.last) {
            match member.commit(p, offset).await {
                Ok(()) => {}
                Err(e) if e.code() == ErrorCode::StaleGeneration => {
                    tracing::info!(partition = p, offset, "not committed: {e}");
                }
                Err(e) => {
                    return Err(e)
                        .with_context(|| format!("committing offset {offset} of partition {p}"));
                }
            }
        }
        self.unstored = 0;
        Ok(())
    }

    /// Forgets partitions the member no longer holds.
    fn forget(&mut self, partitions: &[u32]) {
        for p in partitions {
            self.last.remove(p);
        }
    }
}

/// Runs the group member until `max` entries were printed, a signal, or stdout closes; then
/// commits and leaves.
///
/// # Errors
///
/// The member's error (a refusal, or no node answering past the retry timeout), a commit
/// that failed past its retries, or stdout closed.
pub(super) async fn run(
    client: &Client,
    group: &str,
    member: &str,
    session_timeout: Option<Duration>,
    max: Option<u64>,
) -> anyhow::Result<()> {
    let mut options = GroupOptions::default();
    if let Some(t) = session_timeout {
        options = options.session_timeout(t);
    }
    let mut stream = client.join_group(group, member, options);
    let mut printed = Printed::default();
    let done = print(&mut stream, &mut printed, max, group).await;
    let committed = printed.commit(&stream).await;
    if let Err(e) = stream.leave().await {
        tracing::info!(group, member, "leaving the group: {e}");
    }
    done.and(committed)
}

/// Prints what the member is given until `max` entries were printed (or forever).
async fn print(
    stream: &mut GroupConsumer,
    printed: &mut Printed,
    max: Option<u64>,
    group: &str,
) -> anyhow::Result<()> {
    if max == Some(0) {
        return Ok(());
    }
    let stop = crate::base::shutdown_signal();
    futures_util::pin_mut!(stop);
    let mut tick = tokio::time::interval(STORE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut count = 0u64;
    let mut out = std::io::stdout().lock();
    loop {
        let item = tokio::select! {
            item = stream.next() => item,
            () = &mut stop => break,
            _ = tick.tick() => {
                printed.commit(stream).await?;
                continue;
            }
        };
        let Some(item) = item else {
            break;
        };
        let item = item.with_context(|| format!("member of group {group}"))?;
        let (p, last) = match item {
            GroupItem::Event { partition, event } => {
                let last = event.plog_offset;
                let line = TaggedEventBody {
                    partition,
                    event: *event,
                };
                serde_json::to_writer(&mut out, &line)?;
                (partition, last)
            }
            GroupItem::Gap { partition, gap } => {
                let last = gap.to;
                serde_json::to_writer(&mut out, &TaggedGapBody { partition, gap })?;
                (partition, last)
            }
            other => {
                note(other, printed, group);
                continue;
            }
        };
        out.write_all(b"\n")?;
        out.flush()?;
        printed.last.insert(p, last);
        printed.unstored += 1;
        count += 1;
        if printed.unstored >= STORE_EVERY_ENTRIES {
            printed.commit(stream).await?;
        }
        if max.is_some_and(|max| count >= max) {
            break;
        }
    }
    Ok(())
}

/// What a message other than an entry changes: the partitions held (logged), or a filtered
/// stream's progress.
fn note(item: GroupItem, printed: &mut Printed, group: &str) {
    match item {
        GroupItem::Joined(j) => {
            tracing::info!(group, member = %j.member, session = %j.session, "joined the group");
        }
        GroupItem::Assigned(a) => {
            let parts: Vec<u32> = a.partitions.iter().map(|p| p.partition).collect();
            tracing::info!(group, generation = a.generation, partitions = ?parts, "partitions given");
        }
        GroupItem::Revoked(r) => {
            tracing::info!(group, generation = r.generation, partitions = ?r.partitions, "partitions taken (rebalance)");
            printed.forget(&r.partitions);
        }
        GroupItem::Lost { partitions, reason } => {
            tracing::warn!(
                group,
                ?partitions,
                reason,
                "the session was lost; joining again"
            );
            printed.forget(&partitions);
        }
        GroupItem::Progress(p) if p.next > 1 => {
            printed.last.insert(p.partition, p.next - 1);
        }
        _ => {}
    }
}
