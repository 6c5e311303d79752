//! `Leases` on a real server: a lease is taken only when free or expired (by the database's
//! clock), every takeover increments the epoch, renewal needs the held epoch and names what
//! was lost, release frees at once (also several at once), the status shows leases and nodes in one snapshot, and of
//! concurrent takeovers exactly one wins (also of overlapping several at once). A heartbeat
//! with renewal renews only under the run's own name. Also the schema migrations in place:
//! version 1 gains the tables, version 2 the nodes' run IDs and the leases' write counts,
//! version 3 the counts.

use std::sync::{Arc, Barrier};
use std::thread;
use std::time::Duration;

use monoseq_kv::{Key, KvStore};
use monoseq_pg::testing::{DATABASE, PgCluster};
use monoseq_pg::{LEASE_DURATION_MAX, LEASE_PARTITIONS_MAX, PgOptions, PgStore};

const SHORT: Duration = Duration::from_millis(300);
const LONG: Duration = Duration::from_secs(60);
/// Longer than [`SHORT`], with a margin for a slow machine.
const PAST_SHORT: Duration = Duration::from_millis(450);

fn shared() -> &'static PgCluster {
    PgCluster::shared().unwrap_or_else(|e| panic!("{e}"))
}

fn fresh() -> PgStore {
    shared()
        .fresh_store(PgOptions::default().pool_connections(4))
        .unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn leases_and_fenced_views_are_cheap_handles_for_any_thread() {
    fn shareable<T: Clone + Send + Sync + std::fmt::Debug + 'static>() {}
    shareable::<monoseq_pg::Leases>();
    shareable::<monoseq_pg::FencedPgStore>();
    // A view outlives the store it was made from.
    let store = fresh();
    let leases = store.leases();
    leases.ensure_partitions(1).unwrap();
    let view = store.fenced(0, leases.acquire(0, "a", LONG).unwrap().unwrap(), "a");
    drop(store);
    view.put(Key::new(b"p", b"k"), b"v").unwrap();
    assert_eq!(leases.status().unwrap().lease(0).unwrap().epoch, 1);
}

#[test]
fn a_lease_is_taken_only_when_free_or_expired_and_every_takeover_increments_the_epoch() {
    let leases = fresh().leases();
    leases.ensure_partitions(2).unwrap();
    assert_eq!(leases.acquire(0, "a", SHORT).unwrap(), Some(1));
    // Live: neither another node nor the holder itself takes it.
    assert_eq!(leases.acquire(0, "b", SHORT).unwrap(), None);
    assert_eq!(leases.acquire(0, "a", SHORT).unwrap(), None);
    // Another partition is independent.
    assert_eq!(leases.acquire(1, "b", LONG).unwrap(), Some(1));
    thread::sleep(PAST_SHORT);
    assert_eq!(leases.acquire(0, "b", SHORT).unwrap(), Some(2));
    assert_eq!(leases.acquire(1, "a", SHORT).unwrap(), None, "a live lease");
    thread::sleep(PAST_SHORT);
    // The former holder takes it back with a new epoch too.
    assert_eq!(leases.acquire(0, "a", SHORT).unwrap(), Some(3));
    let status = leases.status().unwrap();
    let lease = status.lease(0).unwrap();
    assert_eq!((lease.epoch, lease.node_id.as_deref()), (3, Some("a")));
}

#[test]
fn a_partition_without_a_lease_row_cannot_be_acquired() {
    let leases = fresh().leases();
    leases.ensure_partitions(2).unwrap();
    assert_eq!(leases.acquire(2, "a", SHORT).unwrap(), None);
}

#[test]
fn renewal_extends_only_leases_held_with_their_epoch_and_omits_the_lost_ones() {
    let leases = fresh().leases();
    leases.ensure_partitions(3).unwrap();
    let e0 = leases.acquire(0, "a", SHORT).unwrap().unwrap();
    let e1 = leases.acquire(1, "a", SHORT).unwrap().unwrap();
    let held = [(0, e0), (1, e1)];
    for _ in 0..3 {
        thread::sleep(Duration::from_millis(150));
        assert_eq!(leases.renew("a", &held, SHORT).unwrap(), vec![0, 1]);
    }
    // 450 ms after the acquire the leases live on through the renewals.
    assert_eq!(leases.acquire(0, "b", SHORT).unwrap(), None);
    // A wrong epoch, another node, or a partition never held renews nothing.
    assert!(leases.renew("a", &[(0, e0 + 1)], SHORT).unwrap().is_empty());
    assert!(leases.renew("b", &held, SHORT).unwrap().is_empty());
    assert!(leases.renew("a", &[(2, 0)], SHORT).unwrap().is_empty());
    // Partition 1 expires and is taken over: its renewal is refused, partition 0's is not.
    leases.renew("a", &[(0, e0)], LONG).unwrap();
    thread::sleep(PAST_SHORT);
    assert_eq!(leases.acquire(1, "b", LONG).unwrap(), Some(e1 + 1));
    assert_eq!(leases.renew("a", &held, SHORT).unwrap(), vec![0]);
    let status = leases.status().unwrap();
    assert_eq!(status.lease(1).unwrap().node_id.as_deref(), Some("b"));
    assert!(status.lease(1).unwrap().expires_in_ms > 50_000);
}

#[test]
fn an_expired_lease_not_taken_over_is_renewed_with_its_epoch() {
    let leases = fresh().leases();
    leases.ensure_partitions(1).unwrap();
    let epoch = leases.acquire(0, "a", SHORT).unwrap().unwrap();
    thread::sleep(PAST_SHORT);
    assert_eq!(leases.renew("a", &[(0, epoch)], LONG).unwrap(), vec![0]);
    assert_eq!(leases.acquire(0, "b", SHORT).unwrap(), None);
}

#[test]
fn a_heartbeat_with_renewal_renews_only_while_the_name_is_this_runs() {
    let leases = fresh().leases();
    leases.ensure_partitions(2).unwrap();
    let e0 = leases.acquire(0, "a", SHORT).unwrap().unwrap();
    let e1 = leases.acquire(1, "a", SHORT).unwrap().unwrap();
    let held = [(0, e0), (1, e1), (1, e1 + 1)];
    let renew = |run: &str, url: &str, stale: Duration| {
        leases.heartbeat_and_renew("a", run, url, stale, &held, LONG)
    };
    // The name is new: claimed, and both leases held with their epochs extended.
    assert_eq!(renew("r1", "http://a:1", LONG).unwrap(), Some(vec![0, 1]));
    // Another run under the live name: nothing recorded, nothing extended.
    assert_eq!(renew("r2", "http://a:2", LONG).unwrap(), None);
    let status = leases.status().unwrap();
    let node = status.node("a").unwrap();
    assert_eq!(
        (node.run_id.as_str(), node.url.as_str()),
        ("r1", "http://a:1")
    );
    // The first run goes on; the second takes the name once it is stale.
    assert_eq!(renew("r1", "http://a:1", LONG).unwrap(), Some(vec![0, 1]));
    thread::sleep(PAST_SHORT);
    assert_eq!(renew("r2", "http://a:2", SHORT).unwrap(), Some(vec![0, 1]));
    assert_eq!(renew("r1", "http://a:1", LONG).unwrap(), None);
    // No lease held: the heartbeat alone.
    let alone = leases.heartbeat_and_renew("b", "r1", "http://b:1", LONG, &[], SHORT);
    assert_eq!(alone.unwrap(), Some(vec![]));
    assert!(leases.status().unwrap().node("b").is_some());
}

#[test]
fn a_refused_heartbeat_leaves_the_leases_to_expire() {
    let leases = fresh().leases();
    leases.ensure_partitions(1).unwrap();
    let epoch = leases.acquire(0, "a", SHORT).unwrap().unwrap();
    assert!(leases.heartbeat("a", "r1", "http://a:1", LONG).unwrap());
    let refused = leases.heartbeat_and_renew("a", "r2", "http://a:2", LONG, &[(0, epoch)], LONG);
    assert_eq!(refused.unwrap(), None);
    thread::sleep(PAST_SHORT);
    assert_eq!(leases.acquire(0, "b", SHORT).unwrap(), Some(epoch + 1));
}

#[test]
fn release_frees_the_lease_at_once_only_for_its_holder_and_epoch() {
    let leases = fresh().leases();
    leases.ensure_partitions(1).unwrap();
    let epoch = leases.acquire(0, "a", LONG).unwrap().unwrap();
    assert!(!leases.release("b", 0, epoch).unwrap(), "another node");
    assert!(!leases.release("a", 0, epoch + 1).unwrap(), "another epoch");
    assert_eq!(leases.acquire(0, "b", LONG).unwrap(), None);
    assert!(leases.release("a", 0, epoch).unwrap());
    let status = leases.status().unwrap();
    let lease = status.lease(0).unwrap();
    assert_eq!(lease.node_id, None);
    assert_eq!(lease.epoch, epoch, "a release keeps the epoch");
    assert!(lease.expires_in_ms <= 0, "{lease:?}");
    assert_eq!(leases.acquire(0, "b", LONG).unwrap(), Some(epoch + 1));
    assert!(!leases.release("a", 0, epoch).unwrap(), "released twice");
}

#[test]
fn releasing_several_frees_each_lease_held_with_its_epoch_and_leaves_the_others() {
    let leases = fresh().leases();
    leases.ensure_partitions(5).unwrap();
    let taken = leases.acquire_many(&[0, 1, 2, 3], "a", LONG).unwrap();
    assert_eq!(taken, [(0, 1), (1, 1), (2, 1), (3, 1)]);
    assert_eq!(leases.acquire(4, "b", LONG).unwrap(), Some(1));
    // 1 is asked with another epoch, 4 is b's, 9 has no row; 0, 2 and 3 are a's.
    let released = leases
        .release_many("a", &[(3, 1), (9, 1), (4, 1), (1, 2), (0, 1), (2, 1)])
        .unwrap();
    assert_eq!(released, [0, 2, 3]);
    let status = leases.status().unwrap();
    let owners: Vec<_> = status.leases.iter().map(|l| l.node_id.as_deref()).collect();
    assert_eq!(owners, [None, Some("a"), None, None, Some("b")]);
    let epochs: Vec<_> = status.leases.iter().map(|l| l.epoch).collect();
    assert_eq!(epochs, [1, 1, 1, 1, 1], "a release keeps the epochs");
    assert!(
        status
            .leases
            .iter()
            .filter(|l| l.node_id.is_none())
            .all(|l| l.expires_in_ms <= 0),
        "{status:?}"
    );
    assert!(
        leases.release_many("a", &[(0, 1)]).unwrap().is_empty(),
        "twice"
    );
    assert!(leases.release_many("a", &[]).unwrap().is_empty());
    assert_eq!(
        leases.acquire_many(&[0, 1, 2, 3], "b", LONG).unwrap(),
        [(0, 2), (2, 2), (3, 2)]
    );
}

#[test]
fn status_shows_leases_and_nodes_with_ages_by_the_database_clock() {
    let leases = fresh().leases();
    leases.ensure_partitions(3).unwrap();
    assert!(leases.heartbeat("a", "r1", "http://a:1", LONG).unwrap());
    assert!(leases.heartbeat("b", "r1", "http://b:1", LONG).unwrap());
    leases.acquire(0, "a", LONG).unwrap().unwrap();
    leases.acquire(2, "b", SHORT).unwrap().unwrap();
    thread::sleep(PAST_SHORT);
    assert!(leases.heartbeat("a", "r1", "http://a:2", LONG).unwrap());
    let status = leases.status().unwrap();
    let partitions: Vec<u32> = status.leases.iter().map(|l| l.partition).collect();
    assert_eq!(partitions, [0, 1, 2]);
    let [p0, p1, p2] = [0, 1, 2].map(|p| status.lease(p).unwrap().clone());
    assert_eq!((p0.epoch, p0.node_id.as_deref()), (1, Some("a")));
    assert!((50_000..=60_000).contains(&p0.expires_in_ms), "{p0:?}");
    assert_eq!(p0.live_owner(), Some("a"));
    assert_eq!(
        (p1.epoch, p1.node_id.as_deref(), p1.live_owner()),
        (0, None, None)
    );
    assert_eq!((p2.epoch, p2.node_id.as_deref()), (1, Some("b")));
    assert!(p2.expires_in_ms < 0, "{p2:?}");
    assert_eq!(p2.live_owner(), None, "expired");
    let (a, b) = (status.node("a").unwrap(), status.node("b").unwrap());
    assert_eq!(a.url, "http://a:2", "a heartbeat updates the URL");
    assert!(a.seen_ago_ms >= 0, "{a:?}");
    assert!(b.seen_ago_ms >= 400, "{b:?}");
    assert!(b.seen_ago_ms - a.seen_ago_ms >= 400, "{a:?} {b:?}");
    leases.leave("b", "r1").unwrap();
    let status = leases.status().unwrap();
    assert!(status.node("b").is_none());
    assert_eq!(status.nodes.len(), 1);
    assert_eq!(
        status.lease(2).unwrap().node_id.as_deref(),
        Some("b"),
        "leave keeps leases"
    );
}

#[test]
fn of_concurrent_takeovers_of_one_partition_exactly_one_wins() {
    const THREADS: usize = 12;
    const ROUNDS: u64 = 5;
    let leases = fresh().leases();
    leases.ensure_partitions(1).unwrap();
    for round in 1..=ROUNDS {
        let barrier = Arc::new(Barrier::new(THREADS));
        let won: Vec<(String, u64)> = thread::scope(|s| {
            let handles: Vec<_> = (0..THREADS)
                .map(|i| {
                    let (leases, barrier) = (leases.clone(), Arc::clone(&barrier));
                    s.spawn(move || {
                        let node = format!("n{i}");
                        barrier.wait();
                        let epoch = leases.acquire(0, &node, LONG).unwrap();
                        epoch.map(|epoch| (node, epoch))
                    })
                })
                .collect();
            handles
                .into_iter()
                .filter_map(|h| h.join().unwrap())
                .collect()
        });
        assert_eq!(won.len(), 1, "round {round}: winners {won:?}");
        let (node, epoch) = &won[0];
        assert_eq!(*epoch, round);
        assert!(leases.release(node, 0, *epoch).unwrap());
    }
}

#[test]
fn acquiring_several_takes_each_free_or_expired_lease_and_leaves_the_live_ones() {
    let leases = fresh().leases();
    leases.ensure_partitions(4).unwrap();
    assert_eq!(leases.acquire(1, "b", LONG).unwrap(), Some(1));
    assert_eq!(leases.acquire(2, "b", SHORT).unwrap(), Some(1));
    thread::sleep(PAST_SHORT);
    // 0 and 3 are free, 2 expired, 1 live; 9 has no row.
    let taken = leases.acquire_many(&[3, 9, 2, 1, 0], "a", LONG).unwrap();
    assert_eq!(taken, [(0, 1), (2, 2), (3, 1)]);
    assert!(
        leases
            .acquire_many(&[0, 1, 2, 3], "c", LONG)
            .unwrap()
            .is_empty()
    );
    let status = leases.status().unwrap();
    let owners: Vec<_> = status.leases.iter().map(|l| l.node_id.as_deref()).collect();
    assert_eq!(owners, [Some("a"), Some("b"), Some("a"), Some("a")]);
    assert!(leases.acquire_many(&[], "a", LONG).unwrap().is_empty());
}

#[test]
fn of_concurrent_takeovers_of_overlapping_partitions_each_partition_goes_to_one() {
    const THREADS: u32 = 8;
    const PARTITIONS: u32 = 16;
    let leases = fresh().leases();
    leases.ensure_partitions(PARTITIONS).unwrap();
    let barrier = Arc::new(Barrier::new(THREADS as usize));
    let taken: Vec<(u32, u64)> = thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|i| {
                let (leases, barrier) = (leases.clone(), Arc::clone(&barrier));
                s.spawn(move || {
                    // Each asks for half of the partitions, from its own starting point, in
                    // its own order: the rows are still locked in partition order.
                    let mut asked: Vec<u32> = (0..PARTITIONS / 2)
                        .map(|k| (i * 3 + k) % PARTITIONS)
                        .collect();
                    if i % 2 == 1 {
                        asked.reverse();
                    }
                    barrier.wait();
                    leases.acquire_many(&asked, &format!("n{i}"), LONG).unwrap()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    });
    let mut partitions: Vec<u32> = taken.iter().map(|(p, _)| *p).collect();
    partitions.sort_unstable();
    let before = partitions.len();
    partitions.dedup();
    assert_eq!(
        partitions.len(),
        before,
        "a partition taken twice: {taken:?}"
    );
    assert!(taken.iter().all(|(_, epoch)| *epoch == 1), "{taken:?}");
}

#[test]
fn ensure_partitions_is_idempotent_under_concurrent_callers_and_keeps_existing_leases() {
    let leases = fresh().leases();
    thread::scope(|s| {
        for _ in 0..6 {
            let leases = leases.clone();
            s.spawn(move || leases.ensure_partitions(200).unwrap());
        }
    });
    let epoch = leases.acquire(7, "a", LONG).unwrap().unwrap();
    leases.ensure_partitions(200).unwrap();
    leases.ensure_partitions(10).unwrap();
    let status = leases.status().unwrap();
    assert_eq!(status.leases.len(), 200);
    assert!(
        status
            .leases
            .iter()
            .all(|l| l.partition == 7 || l.epoch == 0)
    );
    assert_eq!(status.lease(7).unwrap().epoch, epoch);
    assert_eq!(status.lease(7).unwrap().node_id.as_deref(), Some("a"));
}

#[test]
fn out_of_range_partitions_and_leases_are_errors_that_say_the_range() {
    let leases = fresh().leases();
    leases.ensure_partitions(1).unwrap();
    for (e, says) in [
        (
            leases.ensure_partitions(LEASE_PARTITIONS_MAX + 1),
            "at most",
        ),
        (
            leases.acquire(LEASE_PARTITIONS_MAX, "a", SHORT).map(drop),
            "partitions go",
        ),
        (
            leases.acquire(u32::MAX, "a", SHORT).map(drop),
            "partitions go",
        ),
        (
            leases.acquire(0, "a", Duration::ZERO).map(drop),
            "at least 1 ms",
        ),
        (
            leases
                .acquire(0, "a", LEASE_DURATION_MAX + Duration::from_secs(1))
                .map(drop),
            "at most",
        ),
        (
            leases.renew("a", &[(0, 1)], Duration::ZERO).map(drop),
            "at least 1 ms",
        ),
        (
            leases
                .acquire_many(&[0, LEASE_PARTITIONS_MAX], "a", SHORT)
                .map(drop),
            "partitions go",
        ),
        (
            leases.acquire_many(&[0], "a", Duration::ZERO).map(drop),
            "at least 1 ms",
        ),
    ] {
        let message = e.unwrap_err().to_string();
        assert!(message.contains(says), "{message}");
    }
    assert_eq!(leases.acquire(0, "a", SHORT).unwrap(), Some(1));
}

#[test]
fn a_version_1_database_is_migrated_in_place_and_keeps_its_data() {
    let cluster = shared();
    let store = fresh();
    let schema = store.schema().to_owned();
    store.put(Key::new(b"p", b"a"), b"1").unwrap();
    drop(store);
    // What a version-1 build left: the key-value table only.
    cluster
        .psql(
            DATABASE,
            &format!(
                "DROP TABLE {schema}.monoseq_leases; DROP TABLE {schema}.monoseq_nodes; UPDATE \
                 {schema}.monoseq_meta SET value = 1 WHERE name = 'schema_version'"
            ),
        )
        .unwrap();
    let store = PgStore::open(
        &cluster.url(DATABASE),
        PgOptions::default().schema(schema.clone()),
    )
    .unwrap();
    assert_eq!(
        store.get(Key::new(b"p", b"a")).unwrap(),
        Some(b"1".to_vec())
    );
    let version = cluster
        .psql(
            DATABASE,
            &format!("SELECT value FROM {schema}.monoseq_meta WHERE name = 'schema_version'"),
        )
        .unwrap();
    assert_eq!(version, "5");
    let leases = store.leases();
    leases.ensure_partitions(1).unwrap();
    assert_eq!(leases.acquire(0, "a", SHORT).unwrap(), Some(1));
}

#[test]
fn a_live_name_is_kept_by_its_run_and_claimed_by_another_only_once_stale() {
    let leases = fresh().leases();
    assert!(leases.heartbeat("a", "r1", "http://a:1", SHORT).unwrap());
    assert!(
        !leases.heartbeat("a", "r2", "http://a:2", LONG).unwrap(),
        "a live run keeps its name"
    );
    let a = leases.status().unwrap().node("a").unwrap().clone();
    assert_eq!((a.run_id.as_str(), a.url.as_str()), ("r1", "http://a:1"));
    leases.leave("a", "r2").unwrap();
    assert!(
        leases.status().unwrap().node("a").is_some(),
        "only its run removes the row"
    );
    thread::sleep(PAST_SHORT);
    assert!(
        leases.heartbeat("a", "r2", "http://a:2", SHORT).unwrap(),
        "a stale name is claimed"
    );
    assert!(!leases.heartbeat("a", "r1", "http://a:1", LONG).unwrap());
    let a = leases.status().unwrap().node("a").unwrap().clone();
    assert_eq!(a.run_id, "r2");
}

#[test]
fn a_claim_with_the_directory_recorded_on_a_live_name_takes_it_and_a_members_heartbeat_never_does()
{
    let leases = fresh().leases();
    assert!(leases.claim("a", "r1", "http://a:1", LONG, "d1").unwrap());
    assert!(
        !leases.claim("a", "r2", "http://a:2", LONG, "d2").unwrap(),
        "another directory waits for staleness"
    );
    assert!(
        !leases.claim("a", "r2", "http://a:2", LONG, "").unwrap(),
        "no directory proves nothing"
    );
    assert!(
        leases.claim("a", "r2", "http://a:2", LONG, "d1").unwrap(),
        "the run recorded with this directory held its lock: it is dead"
    );
    let a = leases.status().unwrap().node("a").unwrap().clone();
    assert_eq!(
        (a.run_id.as_str(), a.url.as_str(), a.dir_id.as_str()),
        ("r2", "http://a:2", "d1")
    );
    assert_eq!(
        leases
            .heartbeat_and_renew("a", "r1", "http://a:1", LONG, &[], LONG)
            .unwrap(),
        None,
        "the earlier run's member heartbeat does not take the name back by its directory"
    );
    assert!(
        leases
            .heartbeat_and_renew("a", "r2", "http://a:2", LONG, &[], LONG)
            .unwrap()
            .is_some()
    );
    let a = leases.status().unwrap().node("a").unwrap().clone();
    assert_eq!(a.dir_id, "d1", "a member's heartbeat keeps its directory");
    // A member taking a stale name over records no directory: it cannot vouch for one.
    thread::sleep(PAST_SHORT);
    assert!(
        leases
            .heartbeat_and_renew("a", "r3", "http://a:3", SHORT, &[], LONG)
            .unwrap()
            .is_some()
    );
    assert_eq!(leases.status().unwrap().node("a").unwrap().dir_id, "");
}

/// Rebuilds a fresh store's lease and node tables as schema `version` (2: neither the nodes'
/// `run_id` nor the leases' `writes`; 3: no `writes`) created them, keeping their rows, and
/// records that version.
fn downgrade(cluster: &PgCluster, schema: &str, version: u32) {
    let leases = format!("{schema}.monoseq_leases");
    let nodes = format!("{schema}.monoseq_nodes");
    let node_columns = if version == 2 {
        "node_id text PRIMARY KEY, url text NOT NULL, seen_at timestamptz NOT NULL"
    } else {
        "node_id text PRIMARY KEY, url text NOT NULL, seen_at timestamptz NOT NULL, run_id text \
         NOT NULL DEFAULT ''"
    };
    let node_copy = if version == 2 {
        "node_id, url, seen_at"
    } else {
        "node_id, url, seen_at, run_id"
    };
    cluster
        .psql(
            DATABASE,
            &format!(
                "CREATE TEMP TABLE old_leases AS SELECT partition, epoch, node_id, expires_at \
                 FROM {leases}; CREATE TEMP TABLE old_nodes AS SELECT {node_copy} FROM {nodes}; \
                 DROP TABLE {leases}; DROP TABLE {nodes}; CREATE TABLE {leases} (partition \
                 integer PRIMARY KEY, epoch bigint NOT NULL, node_id text NULL, expires_at \
                 timestamptz NOT NULL); CREATE TABLE {nodes} ({node_columns}); INSERT INTO \
                 {leases} SELECT * FROM old_leases; INSERT INTO {nodes} SELECT * FROM old_nodes; \
                 UPDATE {schema}.monoseq_meta SET value = {version} WHERE name = \
                 'schema_version'"
            ),
        )
        .unwrap();
}

fn columns(cluster: &PgCluster, schema: &str, table: &str) -> String {
    cluster
        .psql(
            DATABASE,
            &format!(
                "SELECT string_agg(column_name, ',' ORDER BY ordinal_position) FROM \
                 information_schema.columns WHERE table_schema = '{schema}' AND table_name = \
                 '{table}'"
            ),
        )
        .unwrap()
}

/// A database of schema `version` (2 or 3), opened by two stores at once, is migrated in
/// place to the current version and keeps its data, its leases with their epochs and its
/// nodes; a new run claims a node's name only once its old heartbeat is stale.
fn an_older_database_is_migrated_in_place(version: u32) {
    let cluster = shared();
    let store = fresh();
    let schema = store.schema().to_owned();
    store.put(Key::new(b"p", b"a"), b"1").unwrap();
    let leases = store.leases();
    leases.ensure_partitions(2).unwrap();
    let epoch = leases.acquire(0, "old", LONG).unwrap().unwrap();
    // A version-3 build's run ID; a version-2 build had none.
    let old_run = if version == 2 { "" } else { "r0" };
    assert!(
        leases
            .heartbeat("old", old_run, "http://old:1", LONG)
            .unwrap()
    );
    drop((leases, store));
    downgrade(cluster, &schema, version);
    let (old_leases, old_nodes) = match version {
        2 => ("partition,epoch,node_id,expires_at", "node_id,url,seen_at"),
        _ => (
            "partition,epoch,node_id,expires_at",
            "node_id,url,seen_at,run_id",
        ),
    };
    assert_eq!(columns(cluster, &schema, "monoseq_leases"), old_leases);
    assert_eq!(columns(cluster, &schema, "monoseq_nodes"), old_nodes);
    // Two stores open it at once: one migrates, the other waits and finds it migrated.
    let url = cluster.url(DATABASE);
    let stores: Vec<PgStore> = thread::scope(|s| {
        let opens: Vec<_> = (0..2)
            .map(|_| {
                s.spawn(|| {
                    PgStore::open(
                        &url,
                        PgOptions::default()
                            .schema(schema.clone())
                            .pool_connections(2),
                    )
                    .unwrap()
                })
            })
            .collect();
        opens.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let current = (
        "partition,epoch,node_id,expires_at,writes",
        "node_id,url,seen_at,run_id,dir_id",
    );
    assert_eq!(
        (
            columns(cluster, &schema, "monoseq_leases").as_str(),
            columns(cluster, &schema, "monoseq_nodes").as_str()
        ),
        current
    );
    let version_now = cluster
        .psql(
            DATABASE,
            &format!("SELECT value FROM {schema}.monoseq_meta WHERE name = 'schema_version'"),
        )
        .unwrap();
    assert_eq!(version_now, "5");
    let store = &stores[0];
    assert_eq!(
        store.get(Key::new(b"p", b"a")).unwrap(),
        Some(b"1".to_vec())
    );
    // The lease held before the migration is still held, with its epoch, and fences writes.
    let leases = store.leases();
    let status = leases.status().unwrap();
    let lease = status.lease(0).unwrap();
    assert_eq!((lease.epoch, lease.live_owner()), (epoch, Some("old")));
    store
        .fenced(0, epoch, "old")
        .put(Key::new(b"p", b"b"), b"2")
        .unwrap();
    assert!(
        store
            .fenced(0, epoch + 1, "old")
            .put(Key::new(b"p", b"c"), b"3")
            .is_err()
    );
    assert_eq!(leases.renew("old", &[(0, epoch)], LONG).unwrap(), vec![0]);
    assert_eq!(leases.acquire(1, "new", LONG).unwrap(), Some(1));
    store
        .fenced(1, 1, "new")
        .put(Key::new(b"p", b"d"), b"4")
        .unwrap();
    // The old build's node shows with its run ID (empty from version 2). A new run under its
    // name does not take it while that heartbeat is fresh, and claims it once it is stale.
    let old = status.node("old").unwrap();
    assert_eq!(
        (old.url.as_str(), old.run_id.as_str()),
        ("http://old:1", old_run)
    );
    assert!(!leases.heartbeat("old", "r1", "http://old:2", LONG).unwrap());
    thread::sleep(PAST_SHORT);
    assert!(
        leases
            .heartbeat("old", "r1", "http://old:2", SHORT)
            .unwrap()
    );
    assert!(
        leases
            .heartbeat("new", "r2", "http://new:1", SHORT)
            .unwrap()
    );
    let status = stores[1].leases().status().unwrap();
    let old = status.node("old").unwrap();
    assert_eq!(
        (old.url.as_str(), old.run_id.as_str()),
        ("http://old:2", "r1")
    );
    assert_eq!(status.node("new").unwrap().run_id, "r2");
    leases.leave("old", "r1").unwrap();
    assert!(leases.status().unwrap().node("old").is_none());
    // Opening again changes nothing.
    drop(stores);
    let store = PgStore::open(&url, PgOptions::default().schema(schema.clone())).unwrap();
    assert_eq!(
        store.get(Key::new(b"p", b"b")).unwrap(),
        Some(b"2".to_vec())
    );
    assert_eq!(
        (
            columns(cluster, &schema, "monoseq_leases").as_str(),
            columns(cluster, &schema, "monoseq_nodes").as_str()
        ),
        current
    );
}

#[test]
fn a_version_2_database_gains_run_ids_and_write_counts_in_place_and_keeps_leases_nodes_and_data() {
    an_older_database_is_migrated_in_place(2);
}

#[test]
fn a_version_3_database_gains_write_counts_in_place_and_keeps_leases_nodes_and_data() {
    an_older_database_is_migrated_in_place(3);
}
