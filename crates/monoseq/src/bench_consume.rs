//! `monoseq bench-consume`: a load generator for the consumer side of a running server, on
//! its `--url` only. `fill` writes a number of events into one partition in batches; `catch-up`
//! reads a partition from an offset to its end in pages (`GET /v1/partitions/{p}/events`);
//! `tail` attaches live tails (`…/events/stream`) and writes commands at a steady rate while
//! they follow, and measures each event's way from its command's acknowledgement to its
//! arrival at every follower; `read`, `group` and `member` (`groups.rs`) read many partitions
//! through one stream, followers or a consumer group. Each prints one `consume:` line of
//! `key=value` fields, which `scripts/bench consume` and `scripts/bench groups` read. Every loop ends: by a count, by `--seconds` or by a drain
//! bound.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use futures_util::StreamExt;
use futures_util::stream::FuturesOrdered;
use hdrhistogram::Histogram;
use monoseq_client::{BatchCommandBody, Client};
use monoseq_wire::{PLOG_PAGE_MAX, PlogEntryBody, SSE_EVENT};

use crate::wire::CommandBody;

mod groups;

/// Default of `--seconds` for `tail`.
pub const TAIL_SECONDS_DEFAULT: u64 = 10;
/// Default of `--clients`: concurrent writers.
pub const WRITERS_DEFAULT: usize = 64;
/// Default of `--workspaces`: the workspaces of the followed partition the commands spread over.
pub const WORKSPACES_DEFAULT: u64 = 1_000;
/// Longest a `tail` waits, after its last command, for every follower to receive every event.
const DRAIN_BOUND: Duration = Duration::from_secs(30);
/// Longest one request of the tool may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// Default of `--depth`: pages a `catch-up` keeps in flight, so that the server reads the next
/// page while the reader decodes this one.
pub const CATCH_UP_DEPTH_DEFAULT: u64 = 2;
/// Batches a `fill` keeps in flight.
const FILL_BATCHES_IN_FLIGHT: usize = 4;
/// Commands/s an unpaced `tail` (`--rate 0`) has room to note acknowledgements for.
const UNPACED_RATE_MAX: u64 = 200_000;
/// Highest latency the histograms hold, in µs (a minute).
pub(crate) const LATENCY_US_MAX: u64 = 60_000_000;
/// Significant figures of the histograms.
const HISTOGRAM_FIGURES: u8 = 3;
/// The name of the commands `fill --marked-every` picks out.
const MARKED_COMMAND: &str = "bench.Marked";

/// `monoseq bench-consume` flags.
#[derive(Debug, Clone, Args)]
pub struct ConsumeBenchArgs {
    /// Server to load, e.g. http://127.0.0.1:8080.
    #[arg(long)]
    pub url: String,
    /// Bearer token (a write token: `fill` and `tail` write); prefer the environment variable.
    #[arg(long, env = "MONOSEQ_TOKEN", hide_env_values = true)]
    pub token: Option<crate::auth::TokenArg>,
    /// What to measure.
    #[command(subcommand)]
    pub mode: Mode,
}

/// What to measure.
#[derive(Debug, Clone, Subcommand)]
pub enum Mode {
    /// Write `--events` commands into the partitions `--partition` lists (round-robin), in
    /// batches of 1 000.
    Fill {
        /// The partitions to write, joined by commas (their workspaces: `ws mod partitions`).
        #[arg(long, value_delimiter = ',', required = true)]
        partition: Vec<u32>,
        /// Commands to write.
        #[arg(long)]
        events: u64,
        /// Workspaces of each partition the commands spread over.
        #[arg(long, default_value_t = WORKSPACES_DEFAULT)]
        workspaces: u64,
        /// Every this many commands of a batch, one is named `bench.Marked` instead of
        /// `bench.Create` (what a filter picks out); 0: none.
        #[arg(long, default_value_t = 0)]
        marked_every: u64,
    },
    /// Read partition `--partition` from `--from` to the end it had when the read began, in
    /// pages of `--limit`, with `--depth` pages asked ahead (a page is asked at the offset the
    /// one before it would end at if it is whole; a guess a gap or a short page proves wrong
    /// is dropped and asked again).
    CatchUp {
        /// The partition to read.
        #[arg(long)]
        partition: u32,
        /// The first offset to read.
        #[arg(long, default_value_t = 1)]
        from: u64,
        /// Entries per page.
        #[arg(long, default_value_t = PLOG_PAGE_MAX as u64)]
        limit: u64,
        /// Pages in flight (1: one page at a time).
        #[arg(long, default_value_t = CATCH_UP_DEPTH_DEFAULT, value_parser = clap::value_parser!(u64).range(1..=64))]
        depth: u64,
        /// Ask for the binary page (`Accept: application/vnd.monoseq.events`: each event's
        /// stored bytes, CRC-checked here) instead of JSON.
        #[arg(long)]
        binary: bool,
    },
    /// Attach `--followers` live tails, spread over `--partitions` (a comma-separated list;
    /// followers go round-robin), write `--rate` commands/s (0: as fast as `--clients` go) to
    /// workspaces of those partitions for `--seconds`, then wait until every follower has
    /// every event of its partition.
    Tail {
        /// Live tails to attach.
        #[arg(long, default_value_t = 0)]
        followers: usize,
        /// The partitions followed and written.
        #[arg(long, value_delimiter = ',', default_value = "0")]
        partitions: Vec<u32>,
        /// Commands/s in all (0: as fast as the writers go).
        #[arg(long, default_value_t = 0)]
        rate: u64,
        /// Seconds to write.
        #[arg(long, default_value_t = TAIL_SECONDS_DEFAULT)]
        seconds: u64,
        /// Concurrent writers, one command at a time each (0: write nothing, only follow for
        /// `--seconds` while another process writes).
        #[arg(long, default_value_t = WRITERS_DEFAULT)]
        clients: usize,
        /// Workspaces of each partition the commands spread over.
        #[arg(long, default_value_t = WORKSPACES_DEFAULT)]
        workspaces: u64,
    },
    /// Read the partitions `--partitions` lists (`all`: every one) from offset 1 to the ends
    /// they had when the read began, through one `GET /v1/events/stream` or one live tail per
    /// partition (`--how followers`).
    Read(groups::ReadArgs),
    /// `--members` members of consumer group `--group` (tasks of this process) read every
    /// partition from the group's positions to the ends they had when the read began.
    Group(groups::GroupArgs),
    /// One member of a consumer group that prints what it is given, for scripts/bench's
    /// rebalance figures: `joining`, `assigned P,…`, `revoked P,…`, `lost P,…`, and `event P`
    /// for the first event of each partition given; it leaves on a `leave` line (or the end)
    /// of its standard input.
    Member(groups::MemberArgs),
}

/// Runs the chosen mode and prints its `consume:` line.
pub async fn run(args: ConsumeBenchArgs) -> anyhow::Result<()> {
    if !args.url.starts_with("http://") {
        bail!("--url must start with http:// (the consumer bench runs on loopback)");
    }
    let mut builder = Client::builder([args.url.as_str()])
        .retry_timeout(Duration::ZERO)
        .request_timeout(REQUEST_TIMEOUT);
    let mut http = reqwest::Client::builder();
    if let Some(token) = &args.token {
        let secret = token.token("--token (MONOSEQ_TOKEN)")?.secret().to_owned();
        builder = builder.token(secret.clone());
        let mut headers = reqwest::header::HeaderMap::new();
        headers.insert(
            reqwest::header::AUTHORIZATION,
            format!("Bearer {secret}").parse()?,
        );
        http = http.default_headers(headers);
    }
    let tool = Tool {
        url: args.url.clone(),
        client: builder.build()?,
        http: http.build()?,
    };
    let partitions = tool
        .client
        .info()
        .await
        .context("asking /v1/info")?
        .partitions;
    match args.mode {
        Mode::Fill {
            partition,
            events,
            workspaces,
            marked_every,
        } => {
            let ws = Workspaces::new(&partition, partitions, workspaces)?;
            fill(&tool, &ws, events, marked_every).await
        }
        Mode::Read(a) => groups::read(&tool, partitions, a).await,
        Mode::Group(a) => groups::group(&tool, partitions, a).await,
        Mode::Member(a) => groups::member(&tool, a).await,
        Mode::CatchUp {
            partition,
            from,
            limit,
            depth,
            binary,
        } => catch_up(&tool, partition, (from, limit, depth), binary).await,
        Mode::Tail {
            followers,
            partitions: followed,
            rate,
            seconds,
            clients,
            workspaces,
        } => {
            let ws = Workspaces::new(&followed, partitions, workspaces)?;
            let load = Load {
                rate,
                seconds,
                clients,
            };
            tail(&tool, &ws, followers, load).await
        }
    }
}

/// The server, through the client crate (commands) and plain HTTP (reads).
struct Tool {
    url: String,
    client: Client,
    http: reqwest::Client,
}

/// The workspaces commands go to: `count` of each chosen partition (`ws mod partitions`).
struct Workspaces {
    partitions: Vec<u32>,
    of_server: u32,
    count: u64,
}

impl Workspaces {
    fn new(chosen: &[u32], of_server: u32, count: u64) -> anyhow::Result<Workspaces> {
        if chosen.is_empty() || chosen.iter().any(|p| *p >= of_server) || count == 0 {
            bail!(
                "--partitions must name partitions below the server's {of_server}, --workspaces at least 1"
            );
        }
        Ok(Workspaces {
            partitions: chosen.to_vec(),
            of_server,
            count,
        })
    }

    /// The `i`th workspace: round-robin over the partitions, then over `count` of each.
    fn nth(&self, i: u64) -> u64 {
        let len = self.partitions.len() as u64;
        let p = u64::from(self.partitions[(i % len) as usize]);
        let k = (i / len) % self.count + 1;
        k * u64::from(self.of_server) + p
    }
}

/// The command every writer sends (the one `monoseq bench` sends).
fn command(ws: u64) -> anyhow::Result<CommandBody> {
    named_command(ws, "bench.Create")
}

/// The same command under another name.
fn named_command(ws: u64, name: &str) -> anyhow::Result<CommandBody> {
    Ok(serde_json::from_str(&format!(
        r#"{{"ws": {ws}, "ws_kind": 1, "command": "{name}",
            "create": [{{"raw_id": 1, "kind": "CDoc", "name": "bench.Doc", "fields": {{"n": {ws}}}}}],
            "argument": {{"raw_id": 2, "name": "bench.Arg", "fields": {{"doc": {{"$raw": 1}}}}}}}}"#
    ))?)
}

/// Writes `events` commands in batches of `PLOG_PAGE_MAX`, a few batches in flight; every
/// `marked_every`th command of a batch (none when 0) is named `bench.Marked`.
async fn fill(tool: &Tool, ws: &Workspaces, events: u64, marked_every: u64) -> anyhow::Result<()> {
    let began = Instant::now();
    let batch = PLOG_PAGE_MAX as u64;
    let next = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..FILL_BATCHES_IN_FLIGHT {
        let (client, next) = (tool.client.clone(), Arc::clone(&next));
        let items: Vec<BatchCommandBody> = (0..batch)
            .map(|i| {
                let name = if marked_every > 0 && i % marked_every == 0 {
                    MARKED_COMMAND
                } else {
                    "bench.Create"
                };
                Ok(BatchCommandBody::new(named_command(ws.nth(i), name)?, None))
            })
            .collect::<anyhow::Result<_>>()?;
        tasks.push(tokio::spawn(async move {
            loop {
                let first = next.fetch_add(batch, Ordering::Relaxed);
                if first >= events {
                    return anyhow::Ok(());
                }
                let n = (events - first).min(batch) as usize;
                let answers = client.submit_batch(&items[..n]).await?;
                if let Some(Err(e)) = answers.into_iter().find(Result::is_err) {
                    bail!("a command of the fill was refused: {e}");
                }
            }
        }));
    }
    for task in tasks {
        task.await??;
    }
    let seconds = began.elapsed().as_secs_f64();
    println!(
        "consume: mode=fill events={events} seconds={seconds:.3} rate={:.0}",
        events as f64 / seconds
    );
    Ok(())
}

/// What `catch-up` counts of a page: events below `end`, gaps, where the next page starts.
struct PageCount {
    events: u64,
    gaps: u64,
    next: u64,
    end: u64,
}

/// Partition `p`'s page from `at`, JSON or `binary`, counted (events at or above `end`, when
/// given, are not).
async fn page_count(
    tool: &Tool,
    p: u32,
    (at, size, end): (u64, usize, Option<u64>),
    binary: bool,
) -> anyhow::Result<PageCount> {
    let below = |offset: u64| end.is_none_or(|end| offset < end);
    if binary {
        let page = tool
            .client
            .read_partition_stored(p, at, size, Duration::ZERO)
            .await?;
        let events = page.events().filter(|(o, _)| below(*o)).count() as u64;
        let gaps = page.entries.len() as u64 - page.events().count() as u64;
        return Ok(PageCount {
            events,
            gaps,
            next: page.next,
            end: page.end,
        });
    }
    let page = tool.client.read_partition(p, at, size).await?;
    let (mut events, mut gaps) = (0, 0);
    for entry in &page.events {
        match entry {
            PlogEntryBody::Event(e) if below(e.plog_offset) => events += 1,
            PlogEntryBody::Event(_) => {}
            PlogEntryBody::Gap { .. } => gaps += 1,
        }
    }
    Ok(PageCount {
        events,
        gaps,
        next: page.next,
        end: page.end,
    })
}

/// Reads partition `p` from `from` up to the end its first page named, through the client's
/// page read (JSON, or `binary`), `depth` pages in flight.
async fn catch_up(
    tool: &Tool,
    p: u32,
    (from, limit, depth): (u64, u64, u64),
    binary: bool,
) -> anyhow::Result<()> {
    let began = Instant::now();
    let size = usize::try_from(limit)?;
    let first = page_count(tool, p, (from, size, None), binary).await?;
    let end = first.end;
    let read =
        |at: u64| async move { (at, page_count(tool, p, (at, size, Some(end)), binary).await) };
    let (mut next, mut events, mut gaps, mut pages, mut dropped) = (from, 0u64, 0u64, 0u64, 0u64);
    let mut answer = Some((from, first));
    let mut in_flight = FuturesOrdered::new();
    let mut ask = from;
    loop {
        if let Some((at, got)) = answer.take() {
            if at != next {
                // Asked on a guess that a gap or a short page proved wrong.
                dropped += 1;
            } else {
                pages += 1;
                events += got.events;
                gaps += got.gaps;
                if got.next <= next {
                    bail!("the page from {next} did not advance (next {})", got.next);
                }
                next = got.next;
                if at.saturating_add(limit) != next {
                    // A gap or a short page: every page asked beyond it guessed wrong.
                    in_flight = FuturesOrdered::new();
                    ask = next;
                } else {
                    ask = ask.max(next);
                }
            }
        }
        if next >= end {
            break;
        }
        while ask < end && (in_flight.len() as u64) < depth {
            in_flight.push_back(read(ask));
            ask = ask.saturating_add(limit);
        }
        let Some((at, got)) = in_flight.next().await else {
            bail!("no page in flight below the end {end} (next {next})");
        };
        answer = Some((at, got?));
    }
    let seconds = began.elapsed().as_secs_f64();
    println!(
        "consume: mode=catch-up events={events} gaps={gaps} pages={pages} dropped={dropped} \
         depth={depth} binary={binary} seconds={seconds:.3} rate={:.0}",
        events as f64 / seconds
    );
    Ok(())
}

/// The write side of a `tail`.
#[derive(Debug, Clone, Copy)]
struct Load {
    rate: u64,
    seconds: u64,
    clients: usize,
}

/// When each command of the run was acknowledged: µs since `origin` + 1 by PLog offset (0: not
/// acknowledged), for each followed partition, from its end when the run began.
struct Acks {
    origin: Instant,
    from: Vec<u64>,
    at: Vec<Vec<AtomicU64>>,
}

impl Acks {
    /// Room for twice each followed partition's share of the commands of the run, from the
    /// ends `from` the partitions had when it began.
    fn new(origin: Instant, from: &[u64], load: Load) -> Acks {
        let rate = if load.rate > 0 {
            load.rate
        } else {
            UNPACED_RATE_MAX
        };
        let room = (rate * load.seconds * 2 / from.len() as u64) as usize;
        Acks {
            origin,
            at: from
                .iter()
                .map(|_| (0..room).map(|_| AtomicU64::new(0)).collect())
                .collect(),
            from: from.to_vec(),
        }
    }

    fn set(&self, slot: usize, offset: u64) {
        let i = offset.wrapping_sub(self.from[slot]) as usize;
        if let Some(cell) = self.at[slot].get(i) {
            cell.store(
                self.origin.elapsed().as_micros() as u64 + 1,
                Ordering::Relaxed,
            );
        }
    }

    fn get(&self, slot: usize, offset: u64) -> Option<u64> {
        let i = offset.wrapping_sub(self.from[slot]) as usize;
        let at = self.at[slot].get(i)?.load(Ordering::Relaxed);
        (at > 0).then(|| at - 1)
    }
}

/// Follows, writes, drains, and prints the latencies.
async fn tail(tool: &Tool, ws: &Workspaces, followers: usize, load: Load) -> anyhow::Result<()> {
    let origin = Instant::now();
    let mut from = Vec::new();
    for p in &ws.partitions {
        from.push(tool.client.read_partition(*p, 1, 1).await?.end);
    }
    let acks = Arc::new(Acks::new(origin, &from, load));
    let (done_tx, done_rx) = tokio::sync::watch::channel(None::<Vec<u64>>);
    let mut tails = Vec::new();
    for f in 0..followers {
        let slot = f % ws.partitions.len();
        let url = format!(
            "{}/v1/partitions/{}/events/stream?from={}",
            tool.url, ws.partitions[slot], from[slot]
        );
        let answer = tool.http.get(&url).send().await?.error_for_status()?;
        let done = done_rx.clone();
        tails.push((slot, tokio::spawn(follow(answer, origin, slot, done))));
    }
    let written = if load.clients == 0 {
        follow_only(load).await
    } else {
        write(tool, ws, load, &acks).await?
    };
    let ends = ws
        .partitions
        .iter()
        .map(|p| tool.client.read_partition(*p, 1, 1));
    let mut last = Vec::new();
    for end in futures_util::future::join_all(ends).await {
        last.push(end?.end);
    }
    let _ = done_tx.send(Some(last.clone()));
    let mut latency = histogram();
    let (mut delivered, mut missing, mut early) = (0u64, 0u64, 0u64);
    for (slot, task) in tails {
        let arrivals = task.await??;
        let expected = last[slot] - from[slot];
        missing += expected.saturating_sub(arrivals.len() as u64);
        for (offset, at) in arrivals {
            let Some(acked) = acks.get(slot, offset) else {
                continue;
            };
            delivered += 1;
            early += u64::from(at < acked);
            let _ = latency.record(at.saturating_sub(acked).max(1));
        }
    }
    print_tail(
        followers,
        load,
        &written,
        &latency,
        [delivered, missing, early],
    );
    Ok(())
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, LATENCY_US_MAX, HISTOGRAM_FIGURES).expect("valid bounds")
}

fn print_tail(followers: usize, load: Load, w: &Written, h: &Histogram<u64>, counts: [u64; 3]) {
    let [delivered, missing, early] = counts;
    println!(
        "consume: mode=tail followers={followers} clients={} target_rate={} ok={} failed={} \
         seconds={:.3} rate={:.0} delivered={delivered} missing={missing} before_ack={early} \
         p50={}us p90={}us p99={}us p999={}us max={}us ack_p50={}us ack_p99={}us",
        load.clients,
        load.rate,
        w.ok,
        w.failed,
        w.seconds,
        w.ok as f64 / w.seconds,
        h.value_at_quantile(0.5),
        h.value_at_quantile(0.9),
        h.value_at_quantile(0.99),
        h.value_at_quantile(0.999),
        h.max(),
        w.answers.value_at_quantile(0.5),
        w.answers.value_at_quantile(0.99),
    );
}

/// What the writers did.
struct Written {
    ok: u64,
    failed: u64,
    seconds: f64,
    answers: Histogram<u64>,
}

/// `load.clients` writers, each sending one command at a time on its share of `load.rate`
/// (none when 0) until `load.seconds` have passed; each acknowledgement is noted in `acks`.
/// Writes nothing for `load.seconds` while the followers follow (another process writes).
async fn follow_only(load: Load) -> Written {
    let began = Instant::now();
    tokio::time::sleep(Duration::from_secs(load.seconds)).await;
    Written {
        ok: 0,
        failed: 0,
        seconds: began.elapsed().as_secs_f64(),
        answers: histogram(),
    }
}

async fn write(
    tool: &Tool,
    ws: &Workspaces,
    load: Load,
    acks: &Arc<Acks>,
) -> anyhow::Result<Written> {
    let began = Instant::now();
    let deadline = began + Duration::from_secs(load.seconds);
    let interval =
        (load.rate > 0).then(|| Duration::from_secs_f64(load.clients as f64 / load.rate as f64));
    let mut tasks = Vec::new();
    for c in 0..load.clients {
        let (client, acks) = (tool.client.clone(), Arc::clone(acks));
        let slots: Vec<u32> = ws.partitions.clone();
        let mut body = command(1)?;
        let nth: Vec<u64> = (0..ws.count * slots.len() as u64)
            .map(|i| ws.nth(i))
            .collect();
        tasks.push(tokio::spawn(async move {
            let (mut ok, mut failed, mut answers) = (0u64, 0u64, histogram());
            let mut i = c;
            let mut due = began
                + interval.map_or(Duration::ZERO, |d| {
                    d.mul_f64(c as f64 / load.clients as f64)
                });
            while Instant::now() < deadline {
                if let Some(step) = interval {
                    tokio::time::sleep_until(due.into()).await;
                    due += step;
                }
                body.ws = nth[i % nth.len()];
                i += load.clients;
                let sent = Instant::now();
                match client.submit_unkeyed(&body).await {
                    Ok(s) => {
                        ok += 1;
                        let _ = answers.record(sent.elapsed().as_micros() as u64);
                        if let Some(slot) = slots.iter().position(|p| *p == s.outcome.partition) {
                            acks.set(slot, s.outcome.plog_offset);
                        }
                    }
                    Err(_) => failed += 1,
                }
            }
            (ok, failed, answers)
        }));
    }
    let mut all = Written {
        ok: 0,
        failed: 0,
        seconds: 0.0,
        answers: histogram(),
    };
    for task in tasks {
        let (ok, failed, answers) = task.await?;
        all.ok += ok;
        all.failed += failed;
        let _ = all.answers.add(&answers);
    }
    all.seconds = began.elapsed().as_secs_f64();
    Ok(all)
}

/// One live tail: (offset, µs since `origin` it arrived at) of each event, until it has the
/// events below the ends `done` names for its partition's `slot`, or `DRAIN_BOUND` after that.
async fn follow(
    mut answer: reqwest::Response,
    origin: Instant,
    slot: usize,
    mut done: tokio::sync::watch::Receiver<Option<Vec<u64>>>,
) -> anyhow::Result<Vec<(u64, u64)>> {
    let mut arrivals = Vec::new();
    let mut buffer: Vec<u8> = Vec::new();
    let mut drain_until = None;
    let mut last_seen = 0u64;
    loop {
        let target = done.borrow().as_ref().map(|ends| ends[slot]);
        if let Some(end) = target {
            if last_seen + 1 >= end {
                return Ok(arrivals);
            }
            let until = *drain_until.get_or_insert_with(|| Instant::now() + DRAIN_BOUND);
            if Instant::now() >= until {
                return Ok(arrivals);
            }
        }
        let chunk = tokio::select! {
            chunk = answer.chunk() => chunk?,
            _ = done.changed(), if target.is_none() => continue,
            () = tokio::time::sleep(DRAIN_BOUND), if target.is_some() => continue,
        };
        let Some(chunk) = chunk else {
            bail!("a tail ended before the run did");
        };
        let at = origin.elapsed().as_micros() as u64;
        buffer.extend_from_slice(&chunk);
        let mut start = 0;
        while let Some(end) = buffer[start..].windows(2).position(|w| w == b"\n\n") {
            if let Some(offset) = event_id(&buffer[start..start + end]) {
                arrivals.push((offset, at));
                last_seen = last_seen.max(offset);
            }
            start += end + 2;
        }
        buffer.drain(..start);
    }
}

/// The `id:` of an SSE message block whose `event:` is an event.
fn event_id(block: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(block).ok()?;
    let mut is_event = false;
    let mut id = None;
    for line in text.lines() {
        if let Some(kind) = line.strip_prefix("event:") {
            is_event = kind.trim() == SSE_EVENT;
        } else if let Some(n) = line.strip_prefix("id:") {
            id = n.trim().parse().ok();
        }
    }
    id.filter(|_| is_event)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_sse_block_gives_the_id_of_an_event_only() {
        assert_eq!(event_id(b"event: event\nid: 42\ndata: {}"), Some(42));
        assert_eq!(event_id(b"event: heartbeat\ndata: {\"next\":3}"), None);
        assert_eq!(event_id(b"event: gap\nid: 7\ndata: {}"), None);
    }

    #[test]
    fn workspaces_fall_in_the_chosen_partitions() -> anyhow::Result<()> {
        let ws = Workspaces::new(&[2, 5], 8, 3)?;
        let got: Vec<u64> = (0..6).map(|i| ws.nth(i)).collect();
        assert_eq!(got, [10, 13, 18, 21, 26, 29]);
        assert!(got.iter().all(|w| [2, 5].contains(&(w % 8))));
        assert!(Workspaces::new(&[8], 8, 3).is_err());
        Ok(())
    }
}
