//! The command processor on PostgreSQL with large groups. A partition on a thread of its own
//! runs its groups inside a tokio `block_on`, so every store call of a group is made within
//! one poll of its task; a group of commands for workspaces the sequencer has not seen makes
//! one storage read per workspace. Hundreds of them in one poll outlast tokio's cooperative
//! budget, which the PostgreSQL store's executor must not depend on (it once spun there, and a
//! node under batch load stopped answering).

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use monoseq_cp::{Command, CommandProcessor, Config, KindName, NewRecord};
use monoseq_pg::PgOptions;
use monoseq_pg::testing::PgCluster;
use monoseq_store::{AppId, EventStore, TrustLevel};

fn order(ws: u64) -> Command {
    Command {
        ws,
        ws_kind: 1,
        command: "big.Create".to_owned(),
        create: vec![NewRecord {
            raw_id: 1,
            kind: KindName::CDoc,
            name: "big.Doc".to_owned(),
            fields: Default::default(),
        }],
        update: Vec::new(),
        argument: None,
        expected_wlog_offset: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_of_hundreds_of_new_workspaces_on_postgresql_is_answered() {
    let cluster = PgCluster::shared().unwrap_or_else(|e| panic!("{e}"));
    let kv = Arc::new(
        cluster
            .fresh_store(PgOptions::default())
            .unwrap_or_else(|e| panic!("{e}")),
    );
    let store = EventStore::new(kv, AppId(1), TrustLevel::Level0);
    let config = Config {
        partitions: 1,
        partition_threads_max: 1,
        ..Config::default()
    };
    let cp = CommandProcessor::start(store, config).expect("start");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !cp.ready() {
        assert!(Instant::now() < deadline, "never ready: {:?}", cp.unready());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Queued together, so that groups of up to 256 commands form, each command in a workspace
    // of its own.
    let answers = tokio::time::timeout(
        Duration::from_secs(60),
        join_all((1..=600).map(|ws| cp.submit(order(ws)))),
    )
    .await
    .expect("600 commands in new workspaces answered within 60 s");
    let mut offsets: Vec<u64> = answers
        .into_iter()
        .map(|a| a.expect("applied").plog_offset)
        .collect();
    offsets.sort_unstable();
    offsets.dedup();
    assert_eq!(offsets.len(), 600, "one PLog offset per command");
    assert!(
        cp.shutdown(Duration::from_secs(30)).await,
        "stopped in time"
    );
}
