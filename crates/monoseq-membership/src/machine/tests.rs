//! Unit tests of the state machine on the in-memory table, stepped in 10 ms ticks with
//! every call answered at once.

use super::*;
use crate::memory::MemoryLeaseTable;

struct Node {
    m: Membership,
    serving: BTreeMap<u32, u64>,
    actions: Vec<Action>,
    /// Calls are not answered (the node cannot reach the table).
    cut_off: bool,
    /// Partitions whose drains never finish: each stays served until it is stopped.
    stuck_drains: Vec<u32>,
    /// Release calls still to fail (the table unreachable for them).
    failing_releases: u32,
    /// The table's time when this process started: its own clock counts from there.
    started_at: u64,
    /// When (by the table's clock) it claimed its name, and first served.
    claimed_at: Option<u64>,
    first_served_at: Option<u64>,
}

fn node(name: &str, run: &str, partitions: u32) -> Node {
    let cfg = Config::new(name, run, &format!("http://{name}"), partitions, 1_500, 300)
        .expect("valid parameters");
    Node {
        m: Membership::new(cfg, 0),
        serving: BTreeMap::new(),
        actions: Vec::new(),
        cut_off: false,
        stuck_drains: Vec::new(),
        failing_releases: 0,
        started_at: 0,
        claimed_at: None,
        first_served_at: None,
    }
}

fn step(table: &MemoryLeaseTable, n: &mut Node, table_now: u64) {
    let now = table_now - n.started_at;
    while let Some(a) = n.m.poll(now) {
        match &a {
            Action::Call(call) => {
                if n.cut_off {
                    n.m.reply(
                        now,
                        Reply::Status(Err(TableError {
                            message: "cut off".into(),
                        })),
                    );
                    continue;
                }
                if matches!(call, Call::Release { .. }) && n.failing_releases > 0 {
                    n.failing_releases -= 1;
                    let failed = call.failed(TableError {
                        message: "connection reset".into(),
                    });
                    n.m.reply(now, failed);
                    n.actions.push(a);
                    continue;
                }
                let cfg = n.m.config().clone();
                let r = execute(call, table, &cfg);
                n.m.reply(now, r);
            }
            Action::Serve {
                partition, epoch, ..
            } => {
                n.serving.insert(*partition, *epoch);
                n.first_served_at.get_or_insert(table_now);
            }
            Action::Claimed { .. } => {
                n.claimed_at = Some(table_now);
            }
            Action::Stop { partition, .. } => {
                n.serving.remove(partition);
            }
            Action::Drain {
                partition, epoch, ..
            } if !n.stuck_drains.contains(partition) => {
                n.serving.remove(partition);
                n.m.drained(now, *partition, *epoch, true);
            }
            _ => {}
        }
        n.actions.push(a);
    }
}

fn run(table: &MemoryLeaseTable, nodes: &mut [Node], from: u64, to: u64) {
    for now in (from..to).step_by(10) {
        table.set_now(now);
        for n in nodes.iter_mut() {
            step(table, n, now);
        }
    }
}

#[test]
fn nodes_started_together_split_the_partitions_without_one_taking_all_first() {
    let table = MemoryLeaseTable::new();
    let mut nodes = vec![node("a", "1", 64), node("b", "1", 64), node("c", "1", 64)];
    run(&table, &mut nodes, 0, 600);
    let counts: Vec<usize> = nodes.iter().map(|n| n.serving.len()).collect();
    assert_eq!(counts.iter().sum::<usize>(), 64, "{counts:?}");
    assert!(counts.iter().all(|c| (21..=22).contains(c)), "{counts:?}");
    let most = nodes
        .iter()
        .map(|n| {
            n.actions
                .iter()
                .filter(|a| matches!(a, Action::Serve { .. }))
                .count()
        })
        .max();
    assert_eq!(
        most,
        Some(22),
        "no node served more than its share at any time"
    );
}

#[test]
fn a_joining_node_gets_its_share_within_two_renewals() {
    let table = MemoryLeaseTable::new();
    let mut nodes = vec![node("a", "1", 64), node("b", "1", 64)];
    run(&table, &mut nodes, 0, 1_000);
    nodes.push(node("c", "1", 64));
    nodes[2].m = Membership::new(nodes[2].m.config().clone(), 1_000);
    run(&table, &mut nodes, 1_000, 1_600);
    let counts: Vec<usize> = nodes.iter().map(|n| n.serving.len()).collect();
    assert!(counts.iter().all(|c| (21..=22).contains(c)), "{counts:?}");
}

#[test]
fn a_second_run_of_a_live_name_takes_nothing_and_refuses_naming_the_first() {
    let table = MemoryLeaseTable::new();
    let mut nodes = vec![node("a", "1", 8)];
    run(&table, &mut nodes, 0, 1_000);
    let mut second = node("a", "2", 8);
    second.m = Membership::new(second.m.config().clone(), 1_000);
    nodes.push(second);
    run(&table, &mut nodes, 1_000, 4_000);
    assert_eq!(nodes[0].serving.len(), 8, "the first run keeps serving");
    assert!(nodes[1].serving.is_empty());
    assert!(
        !nodes[1]
            .actions
            .iter()
            .any(|a| matches!(a, Action::Serve { .. })),
        "the second run never served"
    );
    let refusal = nodes[1].actions.iter().find_map(|a| match a {
        Action::Refuse(t) => Some(t.clone()),
        _ => None,
    });
    let refusal = refusal.expect("the second run refused");
    assert_eq!(refusal.url, "http://a");
    assert_eq!(refusal.run_id, "1");
}

#[test]
fn a_restart_takes_its_leases_back_before_they_expire() {
    let table = MemoryLeaseTable::new();
    let mut nodes = vec![node("a", "1", 4), node("b", "1", 4)];
    run(&table, &mut nodes, 0, 1_000);
    let before: Vec<u32> = nodes[0].serving.keys().copied().collect();
    assert_eq!(before.len(), 2);
    // Run 1 of "a" dies at 1000; run 2, a new process whose clock starts at 0, at 1200.
    let mut restarted = node("a", "2", 4);
    restarted.started_at = 1_200;
    nodes[0] = restarted;
    run(&table, &mut nodes, 1_200, 2_400);
    let after: Vec<u32> = nodes[0].serving.keys().copied().collect();
    assert_eq!(
        after, before,
        "taken back under the name, not by the other node"
    );
    // The leases of run 1 were renewed last at about 900 and expire at about 2400: run 2
    // took them over from its stale heartbeat before that.
    assert!(
        nodes[0]
            .actions
            .iter()
            .any(|a| matches!(a, Action::Claimed { previous: Some(_) }))
    );
    // The earlier run stopped before its name went stale: nothing is waited for after the
    // claim but the next read.
    let (claimed, served) = (
        nodes[0].claimed_at.unwrap(),
        nodes[0].first_served_at.unwrap(),
    );
    assert!(
        served - claimed <= 50,
        "claimed at {claimed} ms, served only at {served} ms"
    );
}

/// Node `name`'s run `run`, holding the lock of the directory whose identity is `dir`.
fn node_in(name: &str, run: &str, partitions: u32, dir: &str) -> Node {
    let mut n = node(name, run, partitions);
    let cfg =
        n.m.config()
            .clone()
            .with_dir_id(dir)
            .expect("a valid identity");
    n.m = Membership::new(cfg, 0);
    n
}

#[test]
fn a_restart_that_holds_its_earlier_runs_directory_takes_name_and_leases_back_at_once() {
    let table = MemoryLeaseTable::new();
    let mut nodes = vec![node_in("a", "1", 4, "d1"), node_in("b", "1", 4, "d2")];
    run(&table, &mut nodes, 0, 1_000);
    let before: Vec<u32> = nodes[0].serving.keys().copied().collect();
    assert_eq!(before.len(), 2);
    // Run 1 of "a" dies at 1000; run 2 starts at 1020 with the same directory, so it holds the
    // lock run 1 held: run 1 is dead, long before its heartbeat (last at about 900) is stale.
    let mut restarted = node_in("a", "2", 4, "d1");
    restarted.started_at = 1_020;
    nodes[0] = restarted;
    run(&table, &mut nodes, 1_020, 1_300);
    let after: Vec<u32> = nodes[0].serving.keys().copied().collect();
    assert_eq!(after, before, "taken back under the name at once");
    let claimed = nodes[0].claimed_at.expect("claimed");
    let served = nodes[0].first_served_at.expect("served");
    assert!(
        claimed <= 1_040 && served <= 1_060,
        "claimed at {claimed} ms, served at {served} ms"
    );
    assert!(nodes[0].actions.iter().any(|a| matches!(
        a,
        Action::Claimed {
            previous: Some(NameTaken { dead: true, .. })
        }
    )));
    assert_eq!(table.node("a").expect("a's row").0, "2");
}

/// Run `run` of node `name` reached at `url`, holding the directory `dir`, started at `at`.
fn run_at(name: &str, run: &str, url: &str, dir: &str, at: u64) -> Node {
    let mut n = node_in(name, run, 4, dir);
    let cfg = Config::new(name, run, url, 4, 1_500, 300)
        .and_then(|c| c.with_dir_id(dir))
        .expect("valid parameters");
    n.m = Membership::new(cfg, 0);
    n.started_at = at;
    n
}

#[test]
fn after_a_blackout_each_restarted_run_reads_the_others_new_runs_within_a_poll_not_a_round() {
    let table = MemoryLeaseTable::new();
    let mut nodes = vec![node_in("a", "1", 4, "d1"), node_in("b", "1", 4, "d2")];
    run(&table, &mut nodes, 0, 1_000);
    let b_before: BTreeMap<u32, u64> = nodes[1].serving.clone();
    assert_eq!(b_before.len(), 2);
    // Both die at 1000. "a" restarts at 1020; "b" at 1200, on another address.
    nodes = vec![
        run_at("a", "2", "http://a", "d1", 1_020),
        run_at("b", "2", "http://b-2", "d2", 1_200),
    ];
    let mut seen_url = None;
    let mut seen_epochs = None;
    for now in (1_020..1_800).step_by(10) {
        table.set_now(now);
        step(&table, &mut nodes[0], now);
        if now >= 1_200 {
            step(&table, &mut nodes[1], now);
        }
        let view = nodes[0]
            .m
            .view()
            .map(|v| v.status.clone())
            .unwrap_or_default();
        if view.node("b").is_some_and(|r| r.url == "http://b-2") {
            seen_url.get_or_insert(now);
        }
        let taken_back = b_before
            .iter()
            .all(|(p, e)| view.lease(*p).is_some_and(|l| l.epoch > *e));
        if taken_back {
            seen_epochs.get_or_insert(now);
        }
    }
    let claimed = nodes[1].claimed_at.expect("b claimed its name");
    let served = nodes[1]
        .first_served_at
        .expect("b took its partitions back");
    let poll = nodes[0].m.config().handoff_poll_ms();
    let (renew, url, epochs) = (300, seen_url, seen_epochs);
    assert!(
        url.is_some_and(|t| t <= claimed + poll + 10),
        "b claimed at {claimed} ms, a read its new address at {url:?} (poll {poll}, round \
         {renew} ms)"
    );
    assert!(
        epochs.is_some_and(|t| t <= served + poll + 10),
        "b took its partitions back at {served} ms, a read it at {epochs:?} (poll {poll} ms)"
    );
    // Once every node was heard from since the claim and nothing changed, a reads at its
    // rounds again.
    let reads = |n: &Node| calls(n, |c| matches!(c, Call::Status)).len();
    let before = reads(&nodes[0]);
    run(&table, &mut nodes, 1_800, 1_800 + renew);
    assert!(
        reads(&nodes[0]) - before <= 2,
        "a still polls: {} reads in a round",
        reads(&nodes[0]) - before
    );
}

#[test]
fn a_run_of_the_name_with_another_directory_waits_for_staleness_and_refuses_a_live_one() {
    let table = MemoryLeaseTable::new();
    let mut nodes = vec![node_in("a", "1", 4, "d1"), node_in("b", "1", 4, "d2")];
    run(&table, &mut nodes, 0, 1_000);
    let owned: Vec<u32> = nodes[0].serving.keys().copied().collect();
    // A second process under "a" elsewhere (its own directory) while run 1 lives: refused,
    // and nothing moves.
    let mut twin = node_in("a", "2", 4, "d3");
    twin.started_at = 1_000;
    nodes.push(twin);
    run(&table, &mut nodes, 1_000, 4_000);
    assert!(
        nodes[2]
            .actions
            .iter()
            .any(|a| matches!(a, Action::Refuse(_)))
    );
    assert!(nodes[2].serving.is_empty());
    assert_eq!(nodes[0].serving.keys().copied().collect::<Vec<_>>(), owned);
    // Run 1 dies; a run with another directory cannot prove it: it waits for staleness.
    nodes.truncate(2);
    let mut elsewhere = node_in("a", "3", 4, "d3");
    elsewhere.started_at = 4_020;
    nodes[0] = elsewhere;
    run(&table, &mut nodes, 4_020, 6_000);
    let claimed = nodes[0].claimed_at.expect("claimed once stale");
    assert!(
        claimed >= 3_990 + 900,
        "claimed at {claimed} ms, before run 1's heartbeat was stale"
    );
    assert!(nodes[0].actions.iter().any(|a| matches!(
        a,
        Action::Claimed {
            previous: Some(NameTaken { dead: false, .. })
        }
    )));
}

#[test]
fn a_members_heartbeat_never_takes_the_name_by_its_directory() {
    let table = MemoryLeaseTable::new();
    table.ensure_partitions(1).expect("in memory");
    let claim = |run: &'static str| NameClaim {
        node_id: "a",
        run_id: run,
        url: "http://a",
        stale: Duration::from_millis(900),
        dir_id: "d1",
    };
    assert!(table.heartbeat(&claim("1")).expect("in memory"));
    assert!(
        table.heartbeat(&claim("2")).expect("in memory"),
        "a claim with the same directory takes the live name"
    );
    assert_eq!(
        table
            .heartbeat_and_renew(&claim("1"), &[], Duration::from_millis(1_500))
            .expect("in memory"),
        None,
        "the earlier run's member heartbeat does not take it back"
    );
    assert_eq!(table.node("a").expect("a's row").0, "2");
}

#[test]
fn a_run_claiming_the_name_a_leaving_run_gave_up_serves_nothing_while_that_run_drains() {
    let table = MemoryLeaseTable::new();
    let mut nodes = vec![node("a", "1", 4), node("b", "1", 4)];
    run(&table, &mut nodes, 0, 1_000);
    assert_eq!(nodes[0].serving.len(), 2);
    // Run 1 of "a" begins leaving at 1000 (its name goes first): one drain ends at once, the
    // other never does; run 2 of "a" starts then, and claims the name at once.
    nodes[0].stuck_drains = nodes[0].serving.keys().take(1).copied().collect();
    nodes[0].m.leave(1_000);
    let mut second = node("a", "2", 4);
    second.m = Membership::new(second.m.config().clone(), 1_000);
    nodes.push(second);
    for now in (1_000..5_000).step_by(10) {
        table.set_now(now);
        for n in nodes.iter_mut() {
            step(&table, n, now);
        }
        for p in 0..4 {
            let servers: Vec<usize> = (0..3)
                .filter(|&i| nodes[i].serving.contains_key(&p))
                .collect();
            assert!(
                servers.len() <= 1,
                "at {now} ms partition {p} is served by runs {servers:?} at once"
            );
        }
        assert!(
            nodes[0].serving.is_empty() || nodes[2].serving.is_empty(),
            "at {now} ms both runs of a serve: {:?} and {:?}",
            nodes[0].serving,
            nodes[2].serving
        );
    }
    assert!(
        nodes[2]
            .actions
            .iter()
            .any(|a| matches!(a, Action::Claimed { .. })),
        "run 2 claimed the name"
    );
    assert!(
        nodes[0].serving.is_empty(),
        "the leaving run stopped its drains when its name was no longer confirmed"
    );
    let counts: Vec<usize> = nodes[1..].iter().map(|n| n.serving.len()).collect();
    assert_eq!(counts, vec![2, 2], "b and run 2 of a share the partitions");
}

#[test]
fn a_node_cut_off_from_the_table_stops_serving_before_its_leases_expire() {
    let table = MemoryLeaseTable::new();
    let mut nodes = vec![node("a", "1", 4)];
    run(&table, &mut nodes, 0, 1_000);
    assert_eq!(nodes[0].serving.len(), 4);
    nodes[0].cut_off = true;
    for now in (1_000..3_000).step_by(10) {
        table.set_now(now);
        step(&table, &mut nodes[0], now);
        for p in 0..4 {
            if nodes[0].serving.contains_key(&p) {
                let (_, _, live) = table.lease(p).expect("row");
                assert!(live, "served at {now} after its lease expired");
            }
        }
    }
    assert!(nodes[0].serving.is_empty());
}

#[test]
fn a_partition_whose_epoch_went_back_is_never_served_again() {
    let table = MemoryLeaseTable::new();
    let mut a = node("a", "1", 1);
    for now in (0..1_000).step_by(10) {
        table.set_now(now);
        step(&table, &mut a, now);
    }
    assert_eq!(a.serving.get(&0), Some(&1));
    // The database is replaced by an older copy with no lease taken yet.
    let older = MemoryLeaseTable::new();
    older.set_now(1_000);
    older.ensure_partitions(1).expect("in memory");
    for now in (1_000..4_000).step_by(10) {
        older.set_now(now);
        step(&older, &mut a, now);
    }
    assert!(a.serving.is_empty(), "{:?}", a.serving);
    assert!(a.m.went_back().contains(&0));
}

#[test]
fn a_node_forwarding_to_a_partition_that_moves_learns_its_new_owner_within_a_poll() {
    let table = MemoryLeaseTable::new();
    let mut nodes = vec![node("a", "1", 8), node("b", "1", 8)];
    run(&table, &mut nodes, 0, 2_000);
    nodes.push(node("c", "1", 8));
    let mut taken: BTreeMap<u32, u64> = BTreeMap::new();
    let mut seen_by_a: BTreeMap<u32, u64> = BTreeMap::new();
    for now in (2_000..6_000).step_by(10) {
        table.set_now(now);
        for n in nodes.iter_mut() {
            step(&table, n, now);
        }
        for p in 0..8 {
            let held_by_c = table
                .lease(p)
                .is_some_and(|(_, o, live)| live && o.as_deref() == Some("c"));
            if held_by_c {
                taken.entry(p).or_insert(now);
            }
            let a_sees_c = nodes[0]
                .m
                .view()
                .and_then(|v| v.status.lease(p))
                .and_then(|l| l.live_owner())
                == Some("c");
            if a_sees_c {
                seen_by_a.entry(p).or_insert(now);
            }
        }
    }
    assert!(!taken.is_empty(), "c took no partition");
    let poll = nodes[0].m.config().handoff_poll_ms();
    for (p, at) in &taken {
        let seen = seen_by_a.get(p).copied();
        assert!(
            seen.is_some_and(|s| s <= at + poll + 10),
            "partition {p} taken by c at {at} ms, seen so by a at {seen:?} (poll {poll} ms)"
        );
    }
}

#[test]
fn a_node_asked_to_read_soon_reads_the_table_within_a_poll_not_a_renewal() {
    let table = MemoryLeaseTable::new();
    let mut nodes = vec![node("a", "1", 8), node("b", "1", 8)];
    run(&table, &mut nodes, 0, 2_000);
    let reads = |n: &Node| calls(n, |c| matches!(c, Call::Status)).len();
    let poll = nodes[0].m.config().handoff_poll_ms();
    // Up to a round's read of the table by "a", and a poll and more past it: no other read.
    let mut t = 2_000;
    let mut seen = reads(&nodes[0]);
    loop {
        run(&table, &mut nodes, t, t + 10);
        t += 10;
        if reads(&nodes[0]) > seen {
            break;
        }
        seen = reads(&nodes[0]);
    }
    run(&table, &mut nodes, t, t + 20);
    t += 20;
    seen = reads(&nodes[0]);
    run(&table, &mut nodes, t, t + poll + 20);
    t += poll + 20;
    assert_eq!(reads(&nodes[0]), seen, "a read nobody asked for");
    // Asked: it reads at once.
    nodes[0].m.read_soon(t);
    run(&table, &mut nodes, t, t + 20);
    t += 20;
    assert_eq!(
        reads(&nodes[0]),
        seen + 1,
        "no read within 20 ms of being asked"
    );
    // Asked again at once: not before a poll has passed since that read.
    let read_at = t - 20;
    nodes[0].m.read_soon(t);
    while t < read_at + poll - 10 {
        run(&table, &mut nodes, t, t + 10);
        t += 10;
        assert_eq!(
            reads(&nodes[0]),
            seen + 1,
            "read again after {} ms",
            t - read_at
        );
    }
    run(&table, &mut nodes, t, t + 30);
    assert_eq!(
        reads(&nodes[0]),
        seen + 2,
        "not read again after a poll ({poll} ms)"
    );
}

/// Node "a", alone for its first 2 s on `table`: it serves every one of `partitions`.
fn serving_alone(table: &MemoryLeaseTable, partitions: u32) -> Node {
    let mut n = node("a", "a-1", partitions);
    run(table, std::slice::from_mut(&mut n), 0, 2_000);
    assert_eq!(n.serving.len(), partitions as usize, "{:?}", n.actions);
    n
}

/// The calls `n` made that are of the kind `kind` picks, in order.
fn calls(n: &Node, kind: fn(&Call) -> bool) -> Vec<&Call> {
    n.actions
        .iter()
        .filter_map(|a| match a {
            Action::Call(c) if kind(c) => Some(c),
            _ => None,
        })
        .collect()
}

/// A node whose every lease call is answered `late` ms after it was sent (the call applied
/// at once): answers the call due by `now`, then makes the node's next calls. Reads of the
/// table are noted in `reads`.
struct Slow {
    late: u64,
    awaiting: Option<(u64, Reply)>,
    reads: Vec<u64>,
}

impl Slow {
    fn new(late: u64) -> Slow {
        Slow {
            late,
            awaiting: None,
            reads: Vec::new(),
        }
    }

    fn step(&mut self, table: &MemoryLeaseTable, n: &mut Node, now: u64) {
        if self.awaiting.as_ref().is_some_and(|(at, _)| *at <= now)
            && let Some((_, reply)) = self.awaiting.take()
        {
            n.m.reply(now, reply);
        }
        while let Some(a) = n.m.poll(now) {
            match a {
                Action::Call(call) => {
                    if call == Call::Status {
                        self.reads.push(now);
                    }
                    let cfg = n.m.config().clone();
                    self.awaiting = Some((now + self.late, execute(&call, table, &cfg)));
                }
                Action::Stop { partition, why, .. } => {
                    panic!("at {now} ms partition {partition} stopped: {why:?}")
                }
                Action::Serve {
                    partition, epoch, ..
                } => {
                    n.serving.insert(partition, epoch);
                }
                other => n.actions.push(other),
            }
        }
    }
}

#[test]
fn a_node_whose_table_answers_every_call_late_keeps_its_partitions_and_still_reads_the_table() {
    let table = MemoryLeaseTable::new();
    let mut n = serving_alone(&table, 4);
    // From now on every answer comes 200 ms after its call: two calls take longer than a
    // renewal interval (300 ms), and the name stays valid 750 ms after a heartbeat was sent.
    let mut slow = Slow::new(200);
    for now in (2_000..8_000).step_by(10) {
        table.set_now(now);
        slow.step(&table, &mut n, now);
    }
    // The table is read every round still (a round is two calls: 400 ms), so that the node
    // learns of joining nodes and takeovers.
    let reads = &slow.reads;
    let gaps = reads.windows(2).map(|w| w[1] - w[0]).max();
    assert!(reads.len() >= 14 && gaps <= Some(400), "reads at {reads:?}");
}

#[test]
fn a_node_whose_table_answers_in_half_a_renewal_interval_still_takes_its_share() {
    let table = MemoryLeaseTable::new();
    let mut a = serving_alone(&table, 4);
    // b joins; its calls are answered 150 ms late, so that its heartbeat and read fill a
    // renewal interval: a hands it two partitions, which b must still acquire.
    let mut b = node("b", "b-1", 4);
    b.started_at = 2_000;
    let mut slow = Slow::new(150);
    for now in (2_000..8_000).step_by(10) {
        table.set_now(now);
        step(&table, &mut a, now);
        let local = now - b.started_at;
        slow.step(&table, &mut b, local);
    }
    assert_eq!(a.serving.len(), 2, "a: {:?}", a.actions);
    assert_eq!(b.serving.len(), 2, "b: {:?}", b.actions);
}

#[test]
fn a_node_takes_every_free_partition_of_its_share_in_one_call() {
    let table = MemoryLeaseTable::new();
    let n = serving_alone(&table, 16);
    let acquires = calls(&n, |c| matches!(c, Call::Acquire { .. }));
    assert_eq!(
        acquires,
        [&Call::Acquire {
            partitions: (0..16).collect()
        }]
    );
}

#[test]
fn a_leaving_node_releases_every_drained_partition_in_one_call() {
    let table = MemoryLeaseTable::new();
    let mut n = serving_alone(&table, 16);
    n.actions.clear();
    n.m.leave(2_000);
    run(&table, std::slice::from_mut(&mut n), 2_000, 2_500);
    let releases = calls(&n, |c| matches!(c, Call::Release { .. }));
    let epochs = table.status().expect("in memory").leases;
    let freed: Vec<(u32, u64)> = epochs.iter().map(|l| (l.partition, l.epoch)).collect();
    assert_eq!(releases, [&Call::Release { leases: freed }]);
    assert!(
        epochs.iter().all(|l| l.node_id.is_none()),
        "every lease is free: {epochs:?}"
    );
    assert!(n.actions.iter().any(|a| matches!(a, Action::Left)));
}

/// Node a, alone with 4 partitions, begins leaving at 2 000 ms with its first `failures`
/// release calls failing; runs to 2 400 ms (the leases last 1 500 ms). When it was done
/// leaving, and the leases the table still gives it.
fn leave_with_failing_releases(failures: u32) -> (Option<u64>, Vec<u32>) {
    let table = MemoryLeaseTable::new();
    let mut n = serving_alone(&table, 4);
    n.failing_releases = failures;
    n.actions.clear();
    n.m.leave(2_000);
    let mut left_at = None;
    for now in (2_000..2_400).step_by(10) {
        table.set_now(now);
        step(&table, &mut n, now);
        if left_at.is_none() && n.actions.iter().any(|a| matches!(a, Action::Left)) {
            left_at = Some(now);
        }
    }
    let status = table.status().expect("in memory");
    let still = status
        .leases
        .iter()
        .filter(|l| l.node_id.as_deref() == Some("a"))
        .map(|l| l.partition)
        .collect();
    (left_at, still)
}

#[test]
fn a_leaving_node_tries_a_failed_release_once_more_before_it_is_done() {
    let (left_at, still) = leave_with_failing_releases(1);
    assert_eq!(
        still,
        Vec::<u32>::new(),
        "every lease freed by the second try"
    );
    let left_at = left_at.expect("the node left");
    // The second try goes half a renewal (150 ms) after the first, long before the leases
    // would expire (1 500 ms).
    assert!((2_150..2_300).contains(&left_at), "left at {left_at} ms");
}

#[test]
fn a_leaving_node_whose_releases_keep_failing_leaves_its_leases_to_expire() {
    let (left_at, still) = leave_with_failing_releases(u32::MAX);
    assert!(left_at.is_some_and(|t| t < 2_300), "left at {left_at:?}");
    assert_eq!(still, [0, 1, 2, 3]);
}
