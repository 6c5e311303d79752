//! The members' histories (`member.rs` writes them) and their check. A **holding** is one
//! session's hold of one partition, from its `assigned` (generation, starting position) to
//! its `revoked`, its `lost` or the member's death. Per partition, the holdings in generation
//! order must be:
//! - one per generation: two holdings given at the same generation are two holders at once;
//! - each starting at the group's position as the holdings before left it: the highest offset
//!   they committed and were answered `ok` for, or one of their commits whose answer never came
//!   (it may have landed), never below (an accepted commit lost) nor anywhere else;
//! - delivering from that position on, each offset once, in order, nothing skipped (a retired
//!   range comes as a gap);
//! - free of late commits: no commit of a holding sent after a later holding (of another
//!   session) was assigned may be accepted, since that assignment came after its claim of the
//!   partition's fence (one machine's clock orders the two, every process reading it);
//! - handed over cooperatively: a holding that ended with its partition `revoked` at
//!   generation G is followed by a holding given at a generation above G (the partition was
//!   given to the next holder only after this one gave it up), never at G or below;
//! - free of late deliveries: no event whose command was first sent after a later holding (of
//!   another session) was assigned may be delivered to a holding, since its reader stopped
//!   before the partition was released: a partition handed over before its holder gave it up
//!   is two holders at once.
//!
//! And every acknowledged event is delivered to some member.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;

use serde_json::Value;

/// Milliseconds since the epoch: every process on the machine reads the same clock.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Each member's records, in the order written.
pub struct Histories(Vec<Vec<Value>>);

/// One session's hold of one partition.
#[derive(Debug)]
struct Holding {
    member: usize,
    session: String,
    generation: u64,
    position: u64,
    assigned_at: u64,
    /// Ranges delivered (an event is one offset, a gap a range), in order.
    delivered: Vec<(u64, u64)>,
    /// Commits answered `ok`: offset and when sent.
    accepted: Vec<(u64, u64)>,
    /// Commits without an answer.
    unknown: Vec<u64>,
    /// The generation of the `revoked` message that ended it, if one did.
    revoked: Option<u64>,
}

/// What the check found.
#[derive(Debug, Default)]
pub struct Report {
    pub violations: Vec<String>,
    holdings: usize,
    deliveries: usize,
    redelivered: usize,
    commits: BTreeMap<String, usize>,
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} holdings, {} deliveries ({} of an offset delivered before), commits {:?}; {} \
             violations",
            self.holdings,
            self.deliveries,
            self.redelivered,
            self.commits,
            self.violations.len()
        )?;
        for v in self.violations.iter().take(20) {
            write!(f, "\n  {v}")?;
        }
        Ok(())
    }
}

fn u(r: &Value, field: &str) -> u64 {
    r[field].as_u64().unwrap_or_default()
}

fn text<'a>(r: &'a Value, field: &str) -> &'a str {
    r[field].as_str().unwrap_or_default()
}

impl Histories {
    /// The histories in these files, in member order (a line cut by a kill left out).
    pub fn read<'a>(paths: impl Iterator<Item = &'a Path>) -> Histories {
        Histories(
            paths
                .map(|p| {
                    std::fs::read_to_string(p)
                        .unwrap_or_default()
                        .lines()
                        .filter_map(|l| serde_json::from_str(l).ok())
                        .collect()
                })
                .collect(),
        )
    }

    /// The partitions member `m` holds as its history ends.
    pub fn held_now(&self, m: usize) -> Vec<u32> {
        let mut held = BTreeSet::new();
        for r in &self.0[m] {
            let parts = r["parts"].as_array().map(Vec::as_slice).unwrap_or_default();
            match text(r, "k") {
                "joined" | "lost" => held.clear(),
                "assigned" => held.extend(parts.iter().map(|p| p[0].as_u64().unwrap() as u32)),
                "revoked" => {
                    for p in parts {
                        held.remove(&(p.as_u64().unwrap() as u32));
                    }
                }
                _ => {}
            }
        }
        held.into_iter().collect()
    }

    /// Member `m`'s last session and the generation it knew.
    pub fn last_session(&self, m: usize) -> Option<(String, u64)> {
        let mut last = None;
        for r in &self.0[m] {
            match text(r, "k") {
                "joined" => last = Some((text(r, "s").to_owned(), 0)),
                "assigned" | "revoked" => {
                    if let Some((_, g)) = &mut last {
                        *g = (*g).max(u(r, "g"));
                    }
                }
                _ => {}
            }
        }
        last
    }

    /// Every (partition, offset) an event was delivered for.
    pub fn delivered(&self) -> BTreeSet<(u32, u64)> {
        self.0
            .iter()
            .flatten()
            .filter(|r| text(r, "k") == "event")
            .map(|r| (u(r, "p") as u32, u(r, "o")))
            .collect()
    }

    /// When the first event of `p` after `since` was delivered to a member other than `but`.
    pub fn first_event_after(&self, p: u32, since: u64, but: usize) -> Option<u64> {
        self.0
            .iter()
            .enumerate()
            .filter(|(m, _)| *m != but)
            .flat_map(|(_, h)| h)
            .filter(|r| text(r, "k") == "event" && u(r, "p") == u64::from(p))
            .map(|r| u(r, "t"))
            .filter(|&t| t > since)
            .min()
    }

    /// Commits of member `m` the server refused.
    pub fn refused_commits(&self, m: usize) -> usize {
        self.0[m]
            .iter()
            .filter(|r| text(r, "k") == "answer" && !["ok", "unknown"].contains(&text(r, "r")))
            .count()
    }

    /// The check of the module's documentation against the `acked` events, each with when
    /// its command was first sent (milliseconds since the epoch).
    pub fn check(&self, acked: &BTreeMap<(u32, u64), u64>) -> Report {
        let mut report = Report::default();
        let mut holdings: BTreeMap<u32, Vec<Holding>> = BTreeMap::new();
        for (m, records) in self.0.iter().enumerate() {
            self.replay(m, records, &mut holdings, &mut report);
        }
        for (p, list) in &mut holdings {
            list.sort_by_key(|h| h.generation);
            report.holdings += list.len();
            check_partition(*p, list, &mut report);
            late_deliveries(*p, list, acked, &mut report);
        }
        let delivered = self.delivered();
        let missing: Vec<_> = acked.keys().filter(|e| !delivered.contains(e)).collect();
        if !missing.is_empty() {
            report.violations.push(format!(
                "{} acknowledged events never delivered, e.g. {:?}",
                missing.len(),
                &missing[..missing.len().min(10)]
            ));
        }
        report
    }

    /// Member `m`'s records as holdings; what does not fit one is a violation.
    fn replay(
        &self,
        m: usize,
        records: &[Value],
        holdings: &mut BTreeMap<u32, Vec<Holding>>,
        report: &mut Report,
    ) {
        let mut open: HashMap<(String, u32), usize> = HashMap::new();
        let mut latest: HashMap<(String, u32), usize> = HashMap::new();
        let mut pending: HashMap<u64, (u32, usize, u64, u64)> = HashMap::new();
        for r in records {
            let s = text(r, "s").to_owned();
            let p = u(r, "p") as u32;
            let parts = r["parts"].as_array().map(Vec::as_slice).unwrap_or_default();
            match text(r, "k") {
                "assigned" => {
                    for part in parts {
                        let (p, position) =
                            (part[0].as_u64().unwrap() as u32, part[1].as_u64().unwrap());
                        let list = holdings.entry(p).or_default();
                        if open.contains_key(&(s.clone(), p)) {
                            report.violations.push(format!(
                                "m{m} session {s}: partition {p} assigned again while held"
                            ));
                        }
                        open.insert((s.clone(), p), list.len());
                        latest.insert((s.clone(), p), list.len());
                        list.push(Holding {
                            member: m,
                            session: s.clone(),
                            generation: u(r, "g"),
                            position,
                            assigned_at: u(r, "t"),
                            delivered: Vec::new(),
                            accepted: Vec::new(),
                            unknown: Vec::new(),
                            revoked: None,
                        });
                    }
                }
                kind @ ("revoked" | "lost") => {
                    for part in parts {
                        let p = part.as_u64().unwrap() as u32;
                        let Some(i) = open.remove(&(s.clone(), p)) else {
                            continue;
                        };
                        if kind == "revoked" {
                            holdings.get_mut(&p).unwrap()[i].revoked = Some(u(r, "g"));
                        }
                    }
                }
                kind @ ("event" | "gap") => {
                    let range = if kind == "event" {
                        (u(r, "o"), u(r, "o"))
                    } else {
                        (u(r, "from"), u(r, "to"))
                    };
                    report.deliveries += 1;
                    match open.get(&(s.clone(), p)) {
                        Some(&i) => holdings.get_mut(&p).unwrap()[i].delivered.push(range),
                        None => report.violations.push(format!(
                            "m{m} session {s}: {kind} {range:?} of partition {p}, which it does not hold"
                        )),
                    }
                }
                "commit" => match latest.get(&(s.clone(), p)) {
                    Some(&i) => {
                        pending.insert(u(r, "id"), (p, i, u(r, "o"), u(r, "t")));
                    }
                    None => report.violations.push(format!(
                        "m{m} session {s}: a commit on partition {p}, never assigned to it"
                    )),
                },
                "answer" => {
                    let answer = text(r, "r").to_owned();
                    *report.commits.entry(answer.clone()).or_default() += 1;
                    if let Some((p, i, o, t)) = pending.remove(&u(r, "id")) {
                        let h = &mut holdings.get_mut(&p).unwrap()[i];
                        match answer.as_str() {
                            "ok" => h.accepted.push((o, t)),
                            "unknown" => h.unknown.push(o),
                            _ => {}
                        }
                    }
                }
                "error" => report
                    .violations
                    .push(format!("m{m}'s stream failed: {}", text(r, "error"))),
                _ => {}
            }
        }
        // A commit sent just before the member died: it may have landed.
        for (_, (p, i, o, _)) in pending {
            holdings.get_mut(&p).unwrap()[i].unknown.push(o);
        }
    }
}

/// The rules of the module's documentation over partition `p`'s holdings in generation order.
fn check_partition(p: u32, list: &[Holding], report: &mut Report) {
    let mut floor = 0u64;
    let mut unknown: BTreeSet<u64> = BTreeSet::new();
    let mut seen: BTreeSet<u64> = BTreeSet::new();
    for (i, h) in list.iter().enumerate() {
        let who = format!(
            "partition {p}, m{} session {} at generation {}",
            h.member, h.session, h.generation
        );
        if i > 0 && list[i - 1].generation == h.generation {
            report
                .violations
                .push(format!("{who}: a second holder at the same generation"));
        }
        if let Some(before) = i.checked_sub(1).map(|b| &list[b])
            && before.session != h.session
            && let Some(gave_up) = before.revoked.filter(|&g| g >= h.generation)
        {
            report.violations.push(format!(
                "{who}: given the partition before m{} session {} gave it up (revoked at \
                 generation {gave_up})",
                before.member, before.session
            ));
        }
        if h.position < floor || (h.position != floor && !unknown.contains(&h.position)) {
            report.violations.push(format!(
                "{who}: started after {}, but the holders before left the position at {floor} \
                 (commits of unknown outcome: {unknown:?})",
                h.position
            ));
        }
        let mut next = h.position + 1;
        for &(from, to) in &h.delivered {
            if from != next {
                report
                    .violations
                    .push(format!("{who}: delivered {from}..={to} after {}", next - 1));
            }
            for o in from..=to {
                if !seen.insert(o) {
                    report.redelivered += 1;
                }
            }
            next = to + 1;
        }
        for later in list[i + 1..].iter().filter(|l| l.session != h.session) {
            for &(o, sent) in h
                .accepted
                .iter()
                .filter(|(_, sent)| *sent > later.assigned_at)
            {
                report.violations.push(format!(
                    "{who}: its commit of {o}, sent at {sent}, was accepted, though m{} session \
                     {} was assigned the partition at {} (generation {})",
                    later.member, later.session, later.assigned_at, later.generation
                ));
            }
        }
        floor = floor
            .max(h.position)
            .max(h.accepted.iter().map(|a| a.0).max().unwrap_or(0));
        unknown.extend(h.unknown.iter().copied());
    }
}

/// Slack between the test's clock readings of a command's sending (an `Instant` turned into
/// wall-clock time) and the members' readings of the wall clock.
const CLOCK_SLACK_MS: u64 = 10;

/// The late-delivery rule of the module's documentation over partition `p`'s holdings.
fn late_deliveries(
    p: u32,
    list: &[Holding],
    acked: &BTreeMap<(u32, u64), u64>,
    report: &mut Report,
) {
    for (i, h) in list.iter().enumerate() {
        let Some(next) = list[i + 1..]
            .iter()
            .filter(|l| l.session != h.session)
            .min_by_key(|l| l.assigned_at)
        else {
            continue;
        };
        let late = h
            .delivered
            .iter()
            .flat_map(|&(from, to)| from..=to)
            .filter(|o| {
                acked
                    .get(&(p, *o))
                    .is_some_and(|&sent| sent > next.assigned_at + CLOCK_SLACK_MS)
            });
        for o in late {
            report.violations.push(format!(
                "partition {p}, m{} session {} at generation {}: delivered {o}, sent after m{} \
                 session {} was assigned the partition at {} (generation {})",
                h.member,
                h.session,
                h.generation,
                next.member,
                next.session,
                next.assigned_at,
                next.generation
            ));
        }
    }
}
