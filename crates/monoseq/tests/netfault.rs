//! Real network faults between the nodes of a cluster and its database. Each node and the
//! PostgreSQL server run in a network namespace of their own (veth pairs to a bridge, private
//! 10.x addresses, `tests/faults/netns.rs`); faults are nftables rules inside a namespace:
//! a node cut off from the database, nodes cut off from one another, a blackholed link, and a
//! share of packets lost at random. Under keyed load (every command with its own
//! `Idempotency-Key`, retried through the nodes in turn), every test ends with the closing
//! checks: no number handed out twice, no key applied twice, every acknowledged event read
//! back, and `monoseq verify` passing. Needs root (`ip netns`); CI runs as root.

mod common;
mod faults;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::keyed::{self, Load, Plan, Through, attempt, balanced, closing_checks, owners, ws_of};
use common::node::{LogLine, Node};
use faults::LEASE_MS;
use faults::netns::{Host, Net, NetDb, Verdict};

/// Codes with which a node that does not serve a partition answers at once.
const NOT_SERVING: [&str; 3] = ["partition_unavailable", "not_owner", "storage_unavailable"];

/// Nodes in namespaces of their own on a database in another. Fields drop in order: the
/// nodes first, the database, then the namespaces.
struct Setup {
    nodes: Vec<Node>,
    db: NetDb,
    dir: tempfile::TempDir,
    hosts: Vec<Host>,
    db_host: Host,
    net: Net,
}

impl Setup {
    /// `count` nodes `n1`, `n2`, … listening on port 8080 of their own addresses, on a
    /// database in its own namespace; returns once they share the partitions.
    async fn start(count: usize) -> Setup {
        let (mut net, db_host, db) = tokio::task::spawn_blocking(|| {
            let mut net = Net::new();
            let db_host = net.host("db");
            let db = NetDb::start(&net, &db_host);
            (net, db_host, db)
        })
        .await
        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
        let dir = tempfile::tempdir().expect("a temporary directory");
        let mut hosts = Vec::new();
        let mut nodes = Vec::new();
        for i in 1..=count {
            let id = format!("n{i}");
            let host = net.host(&id);
            let listen = format!("{}:8080", host.ip);
            nodes.push(
                faults::node(&db.url, &id, dir.path())
                    .in_netns(&host.ns, &listen)
                    .start(),
            );
            hosts.push(host);
        }
        let setup = Setup {
            nodes,
            db,
            dir,
            hosts,
            db_host,
            net,
        };
        let ids = setup.ids();
        let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
        balanced(&probe_client(), &setup.nodes[0].url, &ids).await;
        setup
    }

    fn ids(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.id.clone()).collect()
    }

    fn urls(&self) -> keyed::Urls {
        let urls: Vec<&str> = self.nodes.iter().map(|n| n.url.as_str()).collect();
        keyed::urls(&urls)
    }

    /// Keyed load of `clients` clients through the nodes in turn (what each node answers is
    /// what these tests check), keys prefixed `tag`.
    fn load(&self, clients: u64, tag: &str) -> Load {
        let through = Through::Turns(keyed::client(keyed::ANSWER_TIMEOUT));
        let plan = Plan {
            through,
            ..Plan::default()
        };
        Load::start_with(&self.urls(), clients, tag, plan)
    }

    /// Every node's log length now: what a fault's effects are looked for after.
    fn log_marks(&self) -> Vec<usize> {
        self.nodes.iter().map(|n| n.log().len()).collect()
    }

    /// Stops the load, runs the closing checks through node `via`, stops the nodes
    /// gracefully.
    async fn finish(self, load: Load, extra: Vec<keyed::Ack>, via: usize) -> keyed::Answers {
        let (mut acks, answers) = load.stop().await;
        acks.extend(extra);
        eprintln!(
            "{} commands acknowledged; other answers by node and code: {}",
            acks.len(),
            answers.summary()
        );
        closing_checks(&self.nodes[via].url, &acks, &self.db.url, self.dir.path()).await;
        let Setup { nodes, .. } = self;
        for n in nodes {
            n.terminate(Duration::from_secs(30));
        }
        std::sync::Arc::try_unwrap(answers).expect("the clients are gone")
    }
}

fn probe_client() -> reqwest::Client {
    keyed::client(Duration::from_secs(10))
}

/// Partitions `node` owns in `owners`.
fn owned_by(owners: &HashMap<u64, (String, u64)>, node: &str) -> Vec<u64> {
    let mut ps: Vec<u64> = owners
        .iter()
        .filter(|(_, (o, _))| o == node)
        .map(|(p, _)| *p)
        .collect();
    ps.sort_unstable();
    ps
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_cut_off_from_the_database_stops_serving_before_its_lease_can_be_taken_over() {
    let s = Setup::start(3).await;
    let client = probe_client();
    let load = s.load(8, "dbcut");
    load.progress(100, Duration::from_secs(60))
        .await
        .expect("the load runs before the fault");
    let before = owners(&client, &s.nodes[1].url).await;
    let theirs = owned_by(&before, "n1");
    assert!(!theirs.is_empty(), "n1 owns nothing: {before:?}");
    let marks = s.log_marks();

    // n1 and the database no longer exchange a packet; clients still reach n1.
    s.net.cut(&s.hosts[0], &[&s.db_host], Verdict::Blackhole);
    let cut = Instant::now();
    // A client that waits as long as it takes: how long n1 holds a command it took just after
    // the cut (its write cannot reach the database).
    let held = {
        let (url, ws) = (s.nodes[0].url.clone(), ws_of(theirs[0], 1));
        tokio::spawn(async move {
            let patient = keyed::client(Duration::from_secs(90));
            let answer = attempt(&patient, &url, ws, "cut-held", 1).await;
            (answer, cut.elapsed())
        })
    };
    let deadline = cut + Duration::from_secs(60);
    let mut shown = false;
    loop {
        if !shown && cut.elapsed() > Duration::from_millis(LEASE_MS * 3) {
            shown = true;
            // Known: a fenced write cut off mid-transaction keeps its lock on the lease row
            // until the server drops the session (idle_in_transaction_session_timeout), and
            // the other nodes' takeovers wait for it.
            eprintln!(
                "the takeover is slow; the database's sessions (pid, client, state, waiting \
                 on, in transaction for, query):\n{}",
                s.db.psql(
                    "SELECT pid, client_addr, state, wait_event_type, wait_event, \
                     now() - xact_start, left(query, 80) FROM pg_stat_activity \
                     WHERE pid <> pg_backend_pid()"
                )
            );
        }
        let now = owners(&client, &s.nodes[1].url).await;
        let moved = theirs.iter().all(|p| {
            now.get(p)
                .is_some_and(|(o, e)| o != "n1" && *e > before[p].1)
        });
        if moved {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "n1's partitions never moved: {now:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!(
        "n1's partitions {theirs:?} taken over {:?} after the cut",
        cut.elapsed()
    );
    // Past its lease, n1 answers that it does not serve them, without waiting on the database
    // it cannot reach: an answer that does not come within the probe's timeout (10 s) is
    // `error`, not one of `NOT_SERVING`.
    tokio::time::sleep(Duration::from_millis(LEASE_MS).saturating_sub(cut.elapsed())).await;
    let mut probes = Vec::new();
    for &p in &theirs {
        let asked = Instant::now();
        let answer = attempt(
            &client,
            &s.nodes[0].url,
            ws_of(p, 0),
            &format!("cut-probe-{p}"),
            0,
        )
        .await;
        match answer {
            Ok(ack) => panic!("n1 acknowledged a command while cut off from the database: {ack:?}"),
            Err((code, text)) => assert!(
                NOT_SERVING.contains(&code.as_str()),
                "n1 answered {code} after {:?} for partition {p}: {text}",
                asked.elapsed()
            ),
        }
        probes.push(p);
    }
    load.progress(100, Duration::from_secs(60))
        .await
        .expect("the other nodes serve every partition while n1 is cut off");

    s.net.heal(&s.hosts[0]);
    let ids = s.ids();
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    balanced(&client, &s.nodes[1].url, &ids).await;
    load.progress(100, Duration::from_secs(60))
        .await
        .expect("the load runs after the fault");

    // n1 stopped serving each partition before another node took it over.
    let logs: Vec<String> = s.nodes.iter().map(Node::log).collect();
    for &p in &theirs {
        let down = logs[0][marks[0]..]
            .lines()
            .filter_map(LogLine::parse)
            .find(|l| l.field("partition") == Some(p) && l.text.contains("stop"))
            .unwrap_or_else(|| panic!("n1 never logged that it stopped serving {p}:\n{}", logs[0]));
        let up = (1..logs.len())
            .flat_map(|i| logs[i][marks[i]..].lines().filter_map(LogLine::parse))
            .filter(|l| {
                l.field("partition") == Some(p)
                    && l.field("epoch").is_some_and(|e| e > before[&p].1)
            })
            .min_by(|a, b| a.at.cmp(b.at))
            .unwrap_or_else(|| panic!("no node logged taking partition {p} over"));
        eprintln!(
            "partition {p}: n1 stopped at {}, taken over at {}",
            down.at, up.at
        );
        assert!(
            down.at < up.at,
            "n1 still served partition {p} when another node took it over:\n{}\n{}",
            down.text,
            up.text
        );
    }
    let (answer, after) = held.await.expect("the patient client");
    eprintln!("a command sent to n1 just after the cut was answered after {after:?}: {answer:?}");
    let held = answer
        .err()
        .unwrap_or_else(|| panic!("n1 acknowledged a command while cut off from the database"));
    assert_ne!(
        held.0, "error",
        "n1 never answered a command it took while cut off: {held:?}"
    );
    s.finish(load, Vec::new(), 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_cut_off_from_one_another_answer_owner_unreachable_and_a_retry_through_the_owner_succeeds()
 {
    let s = Setup::start(3).await;
    let client = probe_client();
    let load = s.load(6, "peercut");
    load.progress(100, Duration::from_secs(60))
        .await
        .expect("the load runs before the fault");

    // Every node refuses every other node's packets; each still reaches the database.
    for host in &s.hosts {
        let others: Vec<&Host> = s.hosts.iter().filter(|h| h.ns != host.ns).collect();
        s.net.cut(host, &others, Verdict::Refuse);
    }
    let p = owned_by(&owners(&client, &s.nodes[0].url).await, "n2")[0];
    let asked = Instant::now();
    let through_n1 = attempt(&client, &s.nodes[0].url, ws_of(p, 1), "peer-probe", 1).await;
    // Answered within the probe's timeout (10 s; else the code is `error`): a refused
    // connection is not retried until the forwarder's own timeout.
    let (code, text) = through_n1.expect_err("n1 could not have reached n2");
    assert_eq!(code, "owner_unreachable", "{text}");
    eprintln!("owner_unreachable answered after {:?}", asked.elapsed());
    // The refusal is among the answers checked against docs/openapi.json.
    let logged = s.nodes[0].answers();
    assert!(
        logged
            .iter()
            .any(|a| a.status == 503 && a.body.contains("owner_unreachable")),
        "n1's answer log holds no owner_unreachable"
    );
    let direct = attempt(&client, &s.nodes[1].url, ws_of(p, 1), "peer-probe", 1)
        .await
        .unwrap_or_else(|e| panic!("the owner refused the retry: {e:?}"));
    assert_eq!(direct.partition, p);
    load.progress(200, Duration::from_secs(60))
        .await
        .expect("commands are acknowledged through retries while the nodes are cut off");

    for host in &s.hosts {
        s.net.heal(host);
    }
    load.progress(100, Duration::from_secs(60))
        .await
        .expect("the load runs after the fault");
    let answers = s.finish(load, vec![direct], 0).await;
    assert!(
        answers.count("owner_unreachable") > 0,
        "no client was told owner_unreachable: {}",
        answers.summary()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blackholed_link_between_nodes_ends_in_owner_unreachable_and_retries_elsewhere_lose_nothing()
 {
    let s = Setup::start(3).await;
    let load = s.load(6, "blackhole");
    load.progress(100, Duration::from_secs(60))
        .await
        .expect("the load runs before the fault");

    // A command forwarded by n1 to n2 leaves n1 a pooled connection to n2.
    let p = owned_by(&owners(&probe_client(), &s.nodes[0].url).await, "n2")[0];
    let patient = keyed::client(Duration::from_secs(60));
    let warm = attempt(&patient, &s.nodes[0].url, ws_of(p, 1), "blackhole-warm", 1)
        .await
        .unwrap_or_else(|e| panic!("n1 forwarded no command to n2: {e:?}"));
    // Packets between n1 and the other nodes vanish; every node still reaches the database.
    let others: Vec<&Host> = s.hosts[1..].iter().collect();
    s.net.cut(&s.hosts[0], &others, Verdict::Blackhole);
    // The probe gives up before the forwarder's timeout (10 s), so only an owner noticed
    // silent by the forwarder's liveness check (about 1 s) answers `owner_unreachable`; an
    // answer that waited for the timeout reads `error` here.
    let asked = Instant::now();
    let probe = keyed::client(Duration::from_secs(8));
    let through_n1 = attempt(&probe, &s.nodes[0].url, ws_of(p, 1), "blackhole-probe", 1).await;
    let waited = asked.elapsed();
    eprintln!(
        "a command forwarded on a pooled connection into a blackhole was answered after \
         {waited:?}"
    );
    let (code, text) = through_n1.expect_err("n1 could not have reached n2");
    assert_eq!(
        code, "owner_unreachable",
        "a silent owner was not noticed ({waited:?}): {text}"
    );
    let during = load.acked();
    load.progress(100, Duration::from_secs(60))
        .await
        .expect("clients that time out on n1 retry through the other nodes");

    s.net.heal(&s.hosts[0]);
    load.progress(100, Duration::from_secs(60))
        .await
        .expect("the load runs after the fault");
    eprintln!("{during} commands acknowledged by the time the probe was answered");
    s.finish(load, vec![warm], 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_packet_loss_on_every_node_loses_no_acknowledged_event_and_applies_no_key_twice() {
    let s = Setup::start(3).await;
    let load = s.load(8, "loss");
    load.progress(100, Duration::from_secs(60))
        .await
        .expect("the load runs before the fault");

    // Each node drops 10 % of what it sends and of what it receives: to and from the
    // database, the other nodes and the clients.
    for host in &s.hosts {
        s.net.lose(host, 10);
    }
    let before = load.acked();
    tokio::time::sleep(Duration::from_secs(10)).await;
    let lossy = load.acked() - before;
    eprintln!(
        "{lossy} commands acknowledged in 10 s of 10 % packet loss; n1's rules:\n{}",
        s.net.ruleset(&s.hosts[0])
    );
    for host in &s.hosts {
        s.net.heal(host);
    }
    load.progress(100, Duration::from_secs(60))
        .await
        .expect("the load runs after the fault");
    s.finish(load, Vec::new(), 0).await;
}
