//! `PgStore` beyond the conformance suite: clear errors at open (bad connection string, no
//! server, wrong password, a newer schema version), reopening, long scans across pages,
//! calls from unusual contexts, and outages: calls fail within a bounded time while the
//! server is down and work again once it is back, with every acknowledged write kept.

use std::ops::{Bound, ControlFlow};
use std::sync::Arc;
use std::time::{Duration, Instant};

use monoseq_kv::{Key, KvStore, OpenError, Order, WriteBatch, WriteError};
use monoseq_pg::testing::{DATABASE, PASSWORD, PgCluster, free_port};
use monoseq_pg::{PgOptions, PgStore};

fn shared() -> &'static PgCluster {
    PgCluster::shared().unwrap_or_else(|e| panic!("{e}"))
}

/// Options with short waits, so that failures show quickly.
fn quick() -> PgOptions {
    PgOptions::default()
        .connect_timeout(Duration::from_secs(2))
        .statement_timeout(Duration::from_secs(5))
}

fn open_error(url: &str, options: PgOptions) -> OpenError {
    match PgStore::open(url, options) {
        Ok(store) => panic!("open of {url} succeeded: {store:?}"),
        Err(e) => e,
    }
}

fn be(n: u64) -> [u8; 8] {
    n.to_be_bytes()
}

#[test]
fn a_malformed_connection_string_is_an_invalid_option() {
    for url in [
        "postgresql://user@host:notaport/db",
        "host=localhost port='",
        "postgresql://",
    ] {
        let e = open_error(url, quick());
        assert!(
            matches!(e, OpenError::InvalidOption(_)),
            "{url}: expected an invalid option, got {e}"
        );
    }
}

#[test]
fn nothing_listening_on_the_port_fails_the_open_quickly_and_says_so() {
    let port = free_port().unwrap();
    let url = format!("postgresql://postgres:x@127.0.0.1:{port}/monoseq");
    let began = Instant::now();
    let e = open_error(&url, quick());
    assert!(began.elapsed() < Duration::from_secs(10), "{e}");
    let message = format!("{e}: {:?}", std::error::Error::source(&e));
    assert!(matches!(e, OpenError::Storage { .. }), "{message}");
    assert!(message.contains(&port.to_string()), "{message}");
    assert!(message.contains("check that the server runs"), "{message}");
}

#[test]
fn a_wrong_password_fails_the_open_and_names_the_credentials() {
    let url = shared().url(DATABASE).replace(PASSWORD, "not-the-password");
    let e = open_error(&url, quick());
    let message = match &e {
        OpenError::Storage { source, .. } => source.to_string(),
        other => panic!("expected a storage error, got {other}"),
    };
    assert!(message.contains("credentials"), "{message}");
    assert!(!e.to_string().contains("not-the-password"), "{e}");
}

#[test]
fn a_database_with_a_newer_schema_version_is_refused_with_both_versions() {
    let cluster = shared();
    let store = cluster.fresh_store(quick()).unwrap();
    let schema = store.schema().to_owned();
    drop(store);
    cluster
        .psql(
            DATABASE,
            &format!("UPDATE {schema}.monoseq_meta SET value = 7 WHERE name = 'schema_version'"),
        )
        .unwrap();
    let e = open_error(&cluster.url(DATABASE), quick().schema(schema.clone()));
    let message = match &e {
        OpenError::Storage { source, .. } => source.to_string(),
        other => panic!("expected a storage error, got {other}"),
    };
    assert!(message.contains("version 7"), "{message}");
    assert!(message.contains("version 5"), "{message}");
    // Refused, not changed: the recorded version stays.
    let version = cluster
        .psql(
            DATABASE,
            &format!("SELECT value FROM {schema}.monoseq_meta WHERE name = 'schema_version'"),
        )
        .unwrap();
    assert_eq!(version, "7");
}

#[test]
fn a_reopened_store_reads_what_was_written_and_records_its_version() {
    let cluster = shared();
    let store = cluster.fresh_store(quick()).unwrap();
    let schema = store.schema().to_owned();
    store.put(Key::new(b"p", b"a"), b"1").unwrap();
    drop(store);
    let store = PgStore::open(&cluster.url(DATABASE), quick().schema(schema.clone())).unwrap();
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
}

#[test]
fn long_scans_cross_pages_in_both_orders_and_stop_early_with_the_connection_in_step() {
    const N: u64 = 20_000;
    // One connection: a scan that stopped early must leave it usable for the next call.
    let store = shared().fresh_store(quick().pool_connections(1)).unwrap();
    let mut batch = WriteBatch::new();
    for n in 0..N {
        batch.put(Key::new(b"log", &be(n)), &be(n * 3));
        if batch.len() == 5_000 {
            store.write(&batch).unwrap();
            batch.clear();
        }
    }
    store.write(&batch).unwrap();
    for order in [Order::Ascending, Order::Descending] {
        let mut seen = Vec::new();
        store
            .scan(
                b"log",
                Bound::Unbounded,
                Bound::Unbounded,
                order,
                &mut |c, v| {
                    let n = u64::from_be_bytes(c.try_into().unwrap());
                    assert_eq!(v, be(n * 3));
                    seen.push(n);
                    ControlFlow::Continue(())
                },
            )
            .unwrap();
        let mut expected: Vec<u64> = (0..N).collect();
        if order == Order::Descending {
            expected.reverse();
        }
        assert!(
            seen == expected,
            "{order:?} scan saw {} entries",
            seen.len()
        );
    }
    // Bounded on both sides, across page boundaries.
    let (from, to) = (be(300), be(19_000));
    let mut count = 0;
    store
        .scan(
            b"log",
            Bound::Excluded(&from),
            Bound::Included(&to),
            Order::Descending,
            &mut |_, _| {
                count += 1;
                ControlFlow::Continue(())
            },
        )
        .unwrap();
    assert_eq!(count, 19_000 - 300);
    for stop_after in [1, 256, 257, 3_000] {
        let mut count = 0;
        store
            .scan(
                b"log",
                Bound::Unbounded,
                Bound::Unbounded,
                Order::Ascending,
                &mut |_, _| {
                    count += 1;
                    if count == stop_after {
                        ControlFlow::Break(())
                    } else {
                        ControlFlow::Continue(())
                    }
                },
            )
            .unwrap();
        assert_eq!(count, stop_after);
        assert_eq!(
            store.get(Key::new(b"log", &be(7))).unwrap(),
            Some(be(21).to_vec())
        );
    }
}

#[test]
fn a_visitor_may_call_the_store_again() {
    let store = shared().fresh_store(quick()).unwrap();
    for n in 0..10u64 {
        store.put(Key::new(b"a", &be(n)), &be(n)).unwrap();
    }
    let mut copied = 0;
    store
        .scan(
            b"a",
            Bound::Unbounded,
            Bound::Unbounded,
            Order::Ascending,
            &mut |c, v| {
                store.put(Key::new(b"b", c), v).unwrap();
                copied += 1;
                ControlFlow::Continue(())
            },
        )
        .unwrap();
    assert_eq!(copied, 10);
    assert_eq!(
        store.get(Key::new(b"b", &be(9))).unwrap(),
        Some(be(9).to_vec())
    );
}

#[test]
fn calls_from_inside_an_async_task_block_but_do_not_panic() {
    let store = Arc::new(shared().fresh_store(quick()).unwrap());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let inside = Arc::clone(&store);
    runtime.block_on(async move {
        inside.put(Key::new(b"p", b"async"), b"1").unwrap();
        assert_eq!(
            inside.get(Key::new(b"p", b"async")).unwrap(),
            Some(b"1".to_vec())
        );
        // Dropping the last handle on a task must not panic either.
        drop(inside);
    });
    drop(runtime);
    let inside = Arc::clone(&store);
    drop(store);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        tokio::task::spawn_blocking(move || inside.get(Key::new(b"p", b"async")).map(drop))
            .await
            .unwrap()
            .unwrap();
    });
}

/// A partition's writer runs its groups inside a tokio `block_on` on a thread of its own; every
/// store call there is polled within tokio's cooperative budget of that `block_on`, which only
/// its executor restores. Past the budget (about 128 operations), the pool and the timers
/// answer "yield" to each poll, and a store that kept polling would spin forever.
#[test]
fn many_calls_within_one_tokio_block_on_keep_answering_past_its_cooperative_budget() {
    let store = Arc::new(shared().fresh_store(quick()).unwrap());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let handle = runtime.handle().clone();
    let (done, finished) = std::sync::mpsc::channel();
    let inside = Arc::clone(&store);
    std::thread::spawn(move || {
        handle.block_on(async move {
            // No await between the calls: one poll of this future makes them all.
            for n in 0..500u64 {
                inside.put(Key::new(b"budget", &be(n)), &be(n)).unwrap();
                assert_eq!(
                    inside.get(Key::new(b"budget", &be(n))).unwrap(),
                    Some(be(n).to_vec())
                );
            }
        });
        let _ = done.send(());
    });
    finished
        .recv_timeout(Duration::from_secs(60))
        .expect("500 puts and gets within one poll of a tokio block_on finished");
    drop(runtime);
}

#[test]
fn a_batch_of_one_thousand_items_with_repeated_keys_applies_in_order() {
    let store = shared().fresh_store(quick()).unwrap();
    let mut batch = WriteBatch::new();
    for n in 0..1_000u64 {
        // Every key three times: insert, put, then a delete of every third.
        let key = be(n / 3);
        match n % 3 {
            0 => batch.insert_if_absent(Key::new(b"p", &key), b"first"),
            1 => batch.put(Key::new(b"p", &key), b"second"),
            _ if n % 9 == 2 => batch.delete(Key::new(b"p", &key)),
            _ => batch.put(Key::new(b"p", &key), b"third"),
        };
    }
    store.write(&batch).unwrap();
    assert_eq!(store.get(Key::new(b"p", &be(0))).unwrap(), None);
    assert_eq!(
        store.get(Key::new(b"p", &be(1))).unwrap(),
        Some(b"third".to_vec())
    );
    assert_eq!(
        store.get(Key::new(b"p", &be(333))).unwrap(),
        Some(b"first".to_vec())
    );
    // The same batch again: its first insert-if-absent of a stored key conflicts (key 1 is
    // stored; key 0 was deleted, so its insert goes through).
    match store.write(&batch) {
        Err(WriteError::Conflict { index, key }) => {
            assert_eq!(index, 3);
            assert_eq!(key.as_key(), Key::new(b"p", &be(1)));
        }
        other => panic!("expected a conflict, got {other:?}"),
    }
}

#[test]
fn an_outage_fails_calls_within_the_timeouts_and_the_store_heals_when_the_server_is_back() {
    let cluster = PgCluster::start().unwrap_or_else(|e| panic!("{e}"));
    let store = PgStore::open(&cluster.url(DATABASE), quick()).unwrap();
    let mut acknowledged = Vec::new();
    for n in 0..20u64 {
        store.put(Key::new(b"p", &be(n)), &be(n)).unwrap();
        acknowledged.push(n);
    }
    cluster.stop_server().unwrap();
    // Every kind of call fails, with a storage error, within a connect timeout plus a
    // statement timeout.
    let limit = Duration::from_secs(2 + 5 + 2);
    let began = Instant::now();
    let put = store.put(Key::new(b"p", b"during"), b"x");
    assert!(matches!(put, Err(WriteError::Storage(_))), "{put:?}");
    assert!(store.get(Key::new(b"p", &be(1))).is_err());
    let scan = store.scan(
        b"p",
        Bound::Unbounded,
        Bound::Unbounded,
        Order::Ascending,
        &mut |_, _| ControlFlow::Continue(()),
    );
    assert!(scan.is_err());
    assert!(
        store
            .compare_and_swap(Key::new(b"p", b"c"), None, Some(b"1"))
            .is_err()
    );
    assert!(
        began.elapsed() < limit * 4,
        "calls took {:?}",
        began.elapsed()
    );
    let message = put.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(message.contains("PostgreSQL"), "{message}");

    cluster.start_server().unwrap();
    store.put(Key::new(b"p", b"after"), b"y").unwrap();
    let mut stored = Vec::new();
    store
        .scan(
            b"p",
            Bound::Unbounded,
            Bound::Included(&be(u64::MAX)),
            Order::Ascending,
            &mut |c, _| {
                if c.len() == 8 {
                    stored.push(u64::from_be_bytes(c.try_into().unwrap()));
                }
                ControlFlow::Continue(())
            },
        )
        .unwrap();
    assert_eq!(stored, acknowledged);
    assert_eq!(store.get(Key::new(b"p", b"during")).unwrap(), None);
}

#[test]
fn acknowledged_writes_survive_an_immediate_server_stop() {
    // An immediate stop skips the shutdown checkpoint: the server recovers from its log, as
    // after a crash (the machine's page cache survives, so this checks the commit rule, not
    // the disk).
    let cluster = PgCluster::start().unwrap_or_else(|e| panic!("{e}"));
    let store = PgStore::open(&cluster.url(DATABASE), quick()).unwrap();
    for n in 0..50u64 {
        let mut batch = WriteBatch::new();
        batch
            .insert_if_absent(Key::new(b"log", &be(n)), &be(n))
            .put(Key::new(b"head", b""), &be(n));
        store.write(&batch).unwrap();
    }
    store.sync().unwrap();
    cluster.crash_server().unwrap();
    cluster.start_server().unwrap();
    assert_eq!(
        store.get(Key::new(b"head", b"")).unwrap(),
        Some(be(49).to_vec())
    );
    let mut count = 0;
    store
        .scan(
            b"log",
            Bound::Unbounded,
            Bound::Unbounded,
            Order::Ascending,
            &mut |_, _| {
                count += 1;
                ControlFlow::Continue(())
            },
        )
        .unwrap();
    assert_eq!(count, 50);
}

/// The rows of `monoseq_kv` sequential scans read so far in `database`, and the scans of any
/// kind (sequential or by index) so far, as the server's statistics report them.
fn scans(cluster: &PgCluster, database: &str) -> (u64, u64) {
    let out = cluster
        .psql(
            database,
            "SELECT seq_tup_read, seq_scan + coalesce(idx_scan, 0) FROM pg_stat_user_tables \
             WHERE relname = 'monoseq_kv'",
        )
        .unwrap();
    let counts: Vec<u64> = out.split('|').filter_map(|n| n.parse().ok()).collect();
    match counts[..] {
        [rows, scans] => (rows, scans),
        _ => panic!("not two counts: {out:?}"),
    }
}

/// A store on a fresh database whose one connection keeps every plan it makes for its life
/// (as PostgreSQL does after a statement's fifth run, and no ANALYZE replaces it); the
/// database's name.
fn store_keeping_its_first_plans(cluster: &PgCluster) -> (PgStore, String) {
    let url = cluster.create_database().unwrap();
    let database = url.rsplit('/').next().unwrap().to_owned();
    cluster
        .psql(
            &database,
            &format!("ALTER DATABASE {database} SET plan_cache_mode = force_generic_plan"),
        )
        .unwrap();
    let options = quick().pool_connections(1).write_transactions(1);
    let store = PgStore::open(&url, options).unwrap();
    cluster
        .psql(
            &database,
            "ALTER TABLE monoseq_kv SET (autovacuum_enabled = false)",
        )
        .unwrap();
    (store, database)
}

const YOUNG_ROWS: u64 = 20_000;
/// A key [`fill`] stores (its row 5), and one it does not.
const FILLED: Key<'static> = Key::new(b"p", b"\x00\x00\x00\x05");
const NOT_FILLED: Key<'static> = Key::new(b"p", b"\x7f");

/// Fills the table of `database` with [`YOUNG_ROWS`] rows of partition `p`, clustering and
/// value the row's number (big-endian, 4 bytes), after the store made its plans.
fn fill(cluster: &PgCluster, database: &str) {
    cluster
        .psql(
            database,
            &format!(
                "INSERT INTO monoseq_kv SELECT 'p'::bytea, int4send(i), int4send(i) FROM \
                 generate_series(1, {YOUNG_ROWS}) AS i"
            ),
        )
        .unwrap();
}

/// Rows of the table read by sequential scans while `reads` ran (the last of them a second
/// after the others, so that the connection reports its statistics).
fn rows_scanned_by(cluster: &PgCluster, database: &str, mut reads: impl FnMut()) -> u64 {
    let (rows_before, scans_before) = scans(cluster, database);
    reads();
    // A backend reports its table statistics when it goes idle a second after its last report.
    std::thread::sleep(Duration::from_millis(1100));
    reads();
    let deadline = Instant::now() + Duration::from_secs(15);
    let (mut rows, mut scanned) = scans(cluster, database);
    while scanned == scans_before && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
        (rows, scanned) = scans(cluster, database);
    }
    assert!(scanned > scans_before, "the reads were never reported");
    rows - rows_before
}

#[test]
fn reading_keys_never_scans_the_table_even_with_a_plan_made_while_it_was_empty() {
    let cluster = shared();
    let (store, database) = store_keeping_its_first_plans(cluster);
    let (present, absent) = (FILLED, NOT_FILLED);
    assert_eq!(store.get_many(&[present, absent]).unwrap(), [None, None]);
    fill(cluster, &database);
    let scanned = rows_scanned_by(cluster, &database, || {
        for _ in 0..5 {
            let values = store.get_many(&[present, absent, present]).unwrap();
            let five = Some(b"\x00\x00\x00\x05".to_vec());
            assert_eq!(values, [five.clone(), None, five]);
        }
    });
    assert!(
        scanned < YOUNG_ROWS,
        "ten reads scanned {scanned} rows of a table of {YOUNG_ROWS}: they read it whole"
    );
}

#[test]
fn naming_a_conflict_never_scans_the_table_even_with_a_plan_made_while_it_was_empty() {
    let cluster = shared();
    let (store, database) = store_keeping_its_first_plans(cluster);
    let (present, absent) = (FILLED, NOT_FILLED);
    // A batch that conflicts within itself reads its keys too: the plan is made on the empty
    // table.
    let mut twice = WriteBatch::new();
    twice
        .insert_if_absent(absent, b"a")
        .insert_if_absent(absent, b"b");
    assert!(matches!(
        store.write(&twice),
        Err(WriteError::Conflict { index: 1, .. })
    ));
    fill(cluster, &database);
    let scanned = rows_scanned_by(cluster, &database, || {
        for _ in 0..5 {
            let mut batch = WriteBatch::new();
            batch
                .insert_if_absent(absent, b"x")
                .insert_if_absent(present, b"y");
            let refused = store.write(&batch);
            assert!(
                matches!(refused, Err(WriteError::Conflict { index: 1, .. })),
                "{refused:?}"
            );
        }
    });
    assert!(
        scanned < YOUNG_ROWS,
        "ten conflicts scanned {scanned} rows of a table of {YOUNG_ROWS}: they read it whole"
    );
    assert_eq!(
        store.get(absent).unwrap(),
        None,
        "a refused batch wrote nothing"
    );
}
