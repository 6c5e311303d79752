//! Verification speed on the embedded store (fjall): a PLog of `MONOSEQ_BENCH_EVENTS` events
//! (default 1 000 000) spread round-robin over 10 000 workspaces, each event creating one CDoc,
//! with its WLog entries, records and a projection covering it, is built once; then the whole
//! verification (PLog, WLog comparison and orphans, records, numbers) is timed with and without
//! a partition list. Listing the engine's keys (what `verify_data_dir` does before) is timed
//! once and printed, with the peak resident memory after the runs.
//!
//! Run: `cargo bench -p monoseq-verify --bench verify`. Throughput is in events per second
//! ("elem/s").

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use monoseq_core::{Number, PLogOffset, SeqStorage, SeqValue, WsId, WsKind};
use monoseq_kv::{Durability, FjallStore, Key, KvStore, Options};
use monoseq_store::{
    AppId, CRECORD_ID_SEQUENCE, Event, EventStore, Field, KEY_LAYOUT, PartitionId, Record,
    RecordId, RecordKind, TrustLevel, WLOG_OFFSET_SEQUENCE, WLogOffset,
};
use monoseq_verify::{PartitionList, Verifier};

const APP: AppId = AppId(1);
const WORKSPACES: u64 = 10_000;
const GROUP_EVENTS: usize = 1000;
const CRECORD_FIRST: u64 = 322_685_000_131_072;

fn events_in_plog() -> u64 {
    std::env::var("MONOSEQ_BENCH_EVENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000)
}

/// A typical small command: one new CDoc with two fields (about 90 bytes encoded).
fn event(plog: u64, ws: u64, wlog: u64) -> Event {
    Event {
        plog_offset: PLogOffset(plog),
        ws: WsId(ws),
        ws_kind: WsKind(1),
        wlog_offset: WLogOffset(wlog),
        registered_at_ms: 1_767_225_600_000 + plog,
        command: "app.NewCustomer".into(),
        argument: None,
        created: vec![Record {
            id: RecordId(CRECORD_FIRST + wlog - 1),
            kind: RecordKind::CDoc,
            name: "app.Customer".into(),
            fields: vec![
                Field::new("name", br#""Ann Example""#.to_vec()),
                Field::new("limit", b"1000".to_vec()),
            ],
        }],
        updated: vec![],
        idempotency: None,
    }
}

/// Writes `n` events of partition 0 over `WORKSPACES` workspaces, their projection and the
/// engine's metadata.
fn populate(kv: &Arc<FjallStore>, n: u64) {
    let store = EventStore::new(Arc::clone(kv), APP, TrustLevel::Level2);
    let mut group = Vec::with_capacity(GROUP_EVENTS);
    for i in 0..n {
        let ws = 1 + i % WORKSPACES;
        group.push(event(i + 1, ws, i / WORKSPACES + 1));
        if group.len() == GROUP_EVENTS {
            store.append(PartitionId(0), &group).unwrap();
            group.clear();
        }
    }
    store.append(PartitionId(0), &group).unwrap();
    let values: Vec<SeqValue> = (1..=WORKSPACES.min(n))
        .flat_map(|ws| {
            let last = (n - ws) / WORKSPACES + 1;
            [
                SeqValue::new(WsId(ws), WLOG_OFFSET_SEQUENCE.id, Number(last)),
                SeqValue::new(
                    WsId(ws),
                    CRECORD_ID_SEQUENCE.id,
                    Number(CRECORD_FIRST + last - 1),
                ),
            ]
        })
        .collect();
    store
        .seq_storage(PartitionId(0))
        .write_values_and_next_plog_offset(&values, PLogOffset(n + 1))
        .unwrap();
    let meta = b"monoseq/meta".as_slice();
    kv.put(Key::new(meta, b"partitions"), &1u32.to_be_bytes())
        .unwrap();
    kv.put(Key::new(meta, b"key_layout"), &KEY_LAYOUT.to_be_bytes())
        .unwrap();
    kv.sync().unwrap();
}

fn peak_rss_mib() -> String {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .map(|l| l.trim_start_matches("VmHWM:").trim().to_owned())
        })
        .unwrap_or_else(|| "unknown".into())
}

fn verify(c: &mut Criterion) {
    let n = events_in_plog();
    let dir = tempfile::tempdir().unwrap();
    let options = Options::default().durability(Durability::Manual);
    let t = Instant::now();
    {
        let kv = Arc::new(FjallStore::open(dir.path(), options).unwrap());
        populate(&kv, n);
    }
    eprintln!("populated {n} events in {:.1?}", t.elapsed());
    let kv = FjallStore::open_read_only(dir.path(), options).unwrap();
    let t = Instant::now();
    let list = PartitionList::from_store(&kv, APP).unwrap();
    eprintln!(
        "listed {} blocks in {:.1?} ({:.0} events/s)",
        list.blocks(),
        t.elapsed(),
        n as f64 / t.elapsed().as_secs_f64()
    );
    let report = Verifier::new(&kv, APP)
        .partition_list(&list)
        .run(&mut |_| {});
    assert!(report.is_ok(), "{:?}", report.problems.first());
    assert_eq!(report.events, n);

    let mut g = c.benchmark_group("verify");
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(30))
        .throughput(Throughput::Elements(n));
    g.bench_function("listed", |b| {
        b.iter(|| {
            Verifier::new(&kv, APP)
                .partition_list(&list)
                .run(&mut |_| {})
        });
    });
    g.bench_function("unlisted", |b| {
        b.iter(|| Verifier::new(&kv, APP).run(&mut |_| {}));
    });
    g.finish();
    eprintln!("peak resident memory: {}", peak_rss_mib());
}

criterion_group!(benches, verify);
criterion_main!(benches);
