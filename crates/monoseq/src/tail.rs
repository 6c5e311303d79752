//! `monoseq tail`: a console consumer of one partition. Follows the partition through
//! `monoseq-client`'s tail (stored events, then live ones; it resumes by itself) and prints
//! each event as one JSON line on stdout, a retired range as a `{"gap": {...}}` line. With
//! `--consumer NAME` it starts after that consumer's stored position and stores its own with a
//! compare-and-set as it goes, and once more when it stops (at `--max-events`, on SIGINT or
//! SIGTERM, or when stdout closes). It rides out an outage of up to `--retry-timeout-secs`
//! (30 s), or of any length with `--retry-timeout-secs 0`. With `--group G --member M` it is
//! a member of consumer group `G` (`tail/group.rs`): it prints the events of the partitions
//! the group gives it, with their partition, and commits what it printed.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

mod group;

use anyhow::Context;
use clap::Args;
use futures_util::StreamExt;
use monoseq_client::{Client, FollowItem, PlogEntryBody};

/// A consumer's position is stored after at most this many printed entries…
const STORE_EVERY_ENTRIES: u64 = 1_000;
/// …and every this long when one was printed since (even while no other arrives).
const STORE_EVERY: Duration = Duration::from_secs(1);
/// Default of `--retry-timeout-secs`: the client's.
const RETRY_TIMEOUT_SECS_DEFAULT: u64 = monoseq_client::RETRY_TIMEOUT_DEFAULT.as_secs();

/// `monoseq tail`'s flags.
#[derive(Debug, Clone, Args)]
pub struct TailArgs {
    /// A node of the server or cluster, e.g. http://127.0.0.1:8080 (repeat for several).
    #[arg(long, required = true)]
    pub url: Vec<String>,
    /// The partition to follow (not with --group: the group gives the partitions).
    #[arg(long, required_unless_present = "group", conflicts_with = "group")]
    pub partition: Option<u32>,
    /// The first offset to print (1 is the first); with --consumer, only when that consumer
    /// has stored no position yet [default: 1].
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub from: Option<u64>,
    /// A named consumer: start after its stored position in the partition, and store the last
    /// offset printed (within a second, every 1000 entries, and at the end, SIGINT and SIGTERM
    /// included) with a compare-and-set, so two tails of one name cannot both advance it.
    #[arg(long, value_name = "NAME", conflicts_with = "group")]
    pub consumer: Option<String>,
    /// Join consumer group NAME (with --member): print the events of the partitions the
    /// group gives this member, each line `{"partition": P, "event": {...}}`, commit the last
    /// offset printed of each within a second (and at the end), and join again after an
    /// outage. The group's positions are consumer positions: `--consumer NAME` reads them.
    #[arg(
        long,
        value_name = "NAME",
        requires = "member",
        conflicts_with = "from"
    )]
    pub group: Option<String>,
    /// The member's name in --group (one process per name: a second session of the name
    /// replaces the first).
    #[arg(long, value_name = "NAME", requires = "group")]
    pub member: Option<String>,
    /// With --group: the session timeout, milliseconds (the server's default when not set).
    /// Without a heartbeat for this long the member's partitions go to the others.
    #[arg(long, value_name = "MS", requires = "group")]
    pub session_timeout_ms: Option<u64>,
    /// Stop after printing this many entries (events and gaps).
    #[arg(long, value_name = "N")]
    pub max_events: Option<u64>,
    /// How long an outage (no node answers) may last before the tail gives up and exits
    /// with an error; 0 waits out outages of any length (each is logged once as a warning,
    /// its end at info).
    #[arg(long, value_name = "SECS", default_value_t = RETRY_TIMEOUT_SECS_DEFAULT)]
    pub retry_timeout_secs: u64,
    /// A file holding a read token of the server (a write token with --consumer).
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// PEM file of the CA certificate(s) to trust for an https --url [default: the system's
    /// trusted CAs].
    #[arg(long, value_name = "FILE")]
    pub ca_cert: Option<PathBuf>,
}

/// A consumer's position as this tail knows it.
struct Position {
    name: String,
    /// The stored offset (`None`: none stored yet): the compare-and-set's `expected`.
    stored: Option<u64>,
    /// The last offset printed.
    printed: Option<u64>,
    /// Entries printed since the last store.
    unstored: u64,
}

impl Position {
    /// Stores the last printed offset if it moved.
    async fn store(&mut self, client: &Client, p: u32) -> anyhow::Result<()> {
        let Some(offset) = self.printed.filter(|o| Some(*o) != self.stored) else {
            return Ok(());
        };
        client
            .store_consumer_position(&self.name, p, offset, self.stored)
            .await
            .with_context(|| {
                format!(
                    "storing consumer {}'s position {offset} in partition {p} (expected {:?}); \
                     another tail of that name may be running",
                    self.name, self.stored
                )
            })?;
        self.stored = Some(offset);
        self.unstored = 0;
        Ok(())
    }
}

/// Runs `monoseq tail`.
///
/// # Errors
///
/// A token file that cannot be read, a client that cannot be built, the tail's error (after
/// its own retries), a position conflict, or stdout closed.
pub async fn run(args: TailArgs) -> anyhow::Result<()> {
    let client = client(&args)?;
    if let (Some(group), Some(member)) = (&args.group, &args.member) {
        let timeout = args.session_timeout_ms.map(Duration::from_millis);
        return group::run(&client, group, member, timeout, args.max_events).await;
    }
    let p = args
        .partition
        .context("--partition is required without --group")?;
    let mut position = match &args.consumer {
        Some(name) => {
            let stored = client
                .consumer_position(name, p)
                .await
                .with_context(|| format!("reading consumer {name}'s position in partition {p}"))?;
            Some(Position {
                name: name.clone(),
                stored,
                printed: None,
                unstored: 0,
            })
        }
        None => None,
    };
    let from = match position.as_ref().and_then(|c| c.stored) {
        Some(stored) => stored + 1,
        None => args.from.unwrap_or(1),
    };
    let printed = print(&client, p, from, args.max_events, position.as_mut()).await;
    if let Some(position) = &mut position {
        position.store(&client, p).await?;
    }
    printed
}

/// The client of `args`' nodes, token and CA, retrying for `--retry-timeout-secs`.
fn client(args: &TailArgs) -> anyhow::Result<Client> {
    let retry = match args.retry_timeout_secs {
        0 => Duration::MAX,
        secs => Duration::from_secs(secs),
    };
    let mut builder = Client::builder(args.url.clone()).retry_timeout(retry);
    if let Some(path) = &args.token_file {
        let token = std::fs::read_to_string(path)
            .with_context(|| format!("reading the token file {}", path.display()))?;
        builder = builder.token(token.trim());
    }
    if let Some(path) = &args.ca_cert {
        let pem = std::fs::read(path)
            .with_context(|| format!("reading the CA file {}", path.display()))?;
        builder = builder.ca_pem(pem);
    }
    Ok(builder.build()?)
}

/// Prints the partition's entries from `from` until `max` were printed (or forever).
async fn print(
    client: &Client,
    p: u32,
    from: u64,
    max: Option<u64>,
    mut position: Option<&mut Position>,
) -> anyhow::Result<()> {
    if max == Some(0) {
        return Ok(());
    }
    let tail = client.follow(p, from);
    futures_util::pin_mut!(tail);
    let stop = crate::base::shutdown_signal();
    futures_util::pin_mut!(stop);
    let mut tick = tokio::time::interval(STORE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut count = 0u64;
    let mut out = std::io::stdout().lock();
    loop {
        let item = tokio::select! {
            item = tail.next() => item,
            () = &mut stop => break,
            _ = tick.tick() => {
                if let Some(position) = position.as_deref_mut() {
                    position.store(client, p).await?;
                }
                continue;
            }
        };
        let Some(item) = item else {
            break;
        };
        let item = item.with_context(|| format!("following partition {p}"))?;
        let (entry, last) = match item {
            FollowItem::Event(event) => {
                let offset = event.plog_offset;
                (PlogEntryBody::Event(event), offset)
            }
            FollowItem::Gap(gap) => {
                let to = gap.to;
                (PlogEntryBody::Gap { gap }, to)
            }
        };
        serde_json::to_writer(&mut out, &entry)?;
        out.write_all(b"\n")?;
        out.flush()?;
        count += 1;
        if let Some(position) = position.as_deref_mut() {
            position.printed = Some(last);
            position.unstored += 1;
            if position.unstored >= STORE_EVERY_ENTRIES {
                position.store(client, p).await?;
            }
        }
        if max.is_some_and(|max| count >= max) {
            break;
        }
    }
    Ok(())
}
