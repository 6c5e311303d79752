//! Compaction bench: the figures behind the embedded engine's compaction settings and the
//! references written without a checksum of their own. It replays the soak's writes into a
//! fjall keyspace created as a new data directory's is ([`fjall_keyspace_options`]): per
//! command a WLog entry and a created record's reference (`docs/format.md`, key layout 4),
//! for `--workspaces` workspaces in turn (1 000, as the soak's load), in batches of 100
//! commands, with nothing synced (key layout 4's batches need no sync). Three variants, each
//! in a fresh directory:
//!
//! - `before`: fjall's default leveled compaction, references with their own checksum
//!   (versions 3 and 4), as the build before;
//! - `compaction`: this build's compaction settings, references as before;
//! - `this build`: this build's compaction settings and references (versions 5 and 6).
//!
//! Each prints the bytes the process wrote (journal, flushes and compactions, from
//! `/proc/self/io`), its CPU time, fjall's time compacting, and the tables' bytes per command
//! once compactions have settled. Run: `cargo bench -p monoseq-kv --bench compaction --
//! [--commands N] [--workspaces N]` (or `scripts/bench compaction`).
//!
//! `--memtable-mib N` and `--level0-tables N` (either or both) run this build's variant alone,
//! then the same with its memtable or its level-0 trigger changed: the figures behind the
//! memtable size the server keeps (`docs/benchmarks/soak.md`, "Memtables of 64 MiB").
//!
//! Three more changes, each weighed the same way (this build's variant, then with it), none of
//! them the server's (`docs/benchmarks/soak.md`, "The stored layout weighed by the replay"):
//!
//! - `--blocks-first N`: the WLog's and records' partition keys lead with the block of `N`
//!   offsets or IDs (`tag ‖ app ‖ block:be64 ‖ ws:varint`), so that the keys a memtable
//!   collects lie past those merged before while the workspaces' logs grow at one pace;
//! - `--block-kib N`: data blocks of `N` KiB instead of fjall's 4;
//! - `--chunked N`: every `N` commands, each workspace's WLog entries and created records'
//!   references since the last time written as one key each (PLog offsets as differences,
//!   every event's checksum kept), as a WLog index kept in chunks would write them (the
//!   last `N` commands' are held, not written: a server would keep them in memory).
//!
//! `--hot-share P` sends P % of the commands to `HOT_WORKSPACES` of the workspaces (the rest
//! to all of them in turn): a load whose workspaces do not keep pace.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fjall::{CompressionType, Database};
use monoseq_kv::{
    COMPACTION_LEVEL0_TABLES, COMPACTION_WORKER_NICE, MEMTABLE_BYTES, fjall_keyspace_options,
    leveled_compaction,
};

/// Commands per batch, as the soak's load sends them.
const BATCH: u64 = 100;
/// The block cache, as the server's default.
const CACHE_BYTES: u64 = 64 << 20;
/// A created record's first ID, as a workspace kind's initial value might be (each
/// workspace's records counted from it, as its WLog from 1).
const FIRST_RECORD_ID: u64 = 322_685_000_131_072;
/// Workspaces that take `--hot-share` of the commands.
const HOT_WORKSPACES: u64 = 10;

struct Variant {
    name: &'static str,
    fjall_default_compaction: bool,
    checksummed_refs: bool,
}

/// This build's settings changed: its memtable's bytes, the level-0 tables that trigger a
/// merge.
#[derive(Clone, Copy)]
struct Settings {
    memtable_bytes: u64,
    level0_tables: u8,
    /// Commands between two writes of every workspace's WLog and records as one key each
    /// (0: a key per entry, as this build).
    chunk_commands: u64,
    /// Data blocks' size (0: fjall's 4 KiB, as this build).
    block_bytes: u32,
    /// The leading block's events (0: the workspace first, as this build).
    blocks_first: u64,
}

impl Settings {
    const BUILD: Settings = Settings {
        memtable_bytes: MEMTABLE_BYTES,
        level0_tables: COMPACTION_LEVEL0_TABLES,
        blocks_first: 0,
        block_bytes: 0,
        chunk_commands: 0,
    };

    /// What these settings change, for the table.
    fn label(&self) -> String {
        let mut label = format!(
            "{} MiB memtables, level 0 merged at {}",
            self.memtable_bytes >> 20,
            self.level0_tables
        );
        if self.blocks_first > 0 {
            label += &format!(", blocks of {} first", self.blocks_first);
        }
        if self.block_bytes > 0 {
            label += &format!(", data blocks of {} KiB", self.block_bytes >> 10);
        }
        if self.chunk_commands > 0 {
            label += &format!(", chunks every {} commands", self.chunk_commands);
        }
        label
    }
}

/// The load: how many commands, over how many workspaces, and the share (per cent) of them
/// sent to the first `HOT_WORKSPACES`.
#[derive(Clone, Copy)]
struct Load {
    commands: u64,
    workspaces: u64,
    hot_share: u64,
}

const VARIANTS: [Variant; 3] = [
    Variant {
        name: "before",
        fjall_default_compaction: true,
        checksummed_refs: true,
    },
    Variant {
        name: "compaction",
        fjall_default_compaction: false,
        checksummed_refs: true,
    },
    Variant {
        name: "this build",
        fjall_default_compaction: false,
        checksummed_refs: false,
    },
];

fn main() {
    let mut load = Load {
        commands: 30_000_000,
        workspaces: 1_000,
        hot_share: 0,
    };
    let mut changed = None::<Settings>;
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut number = || {
            it.next()
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("{arg} needs a number"))
        };
        match arg.as_str() {
            "--commands" => load.commands = number(),
            "--workspaces" => load.workspaces = number(),
            "--block-kib" => {
                changed.get_or_insert(Settings::BUILD).block_bytes =
                    u32::try_from(number() << 10).expect("a block size")
            }
            "--chunked" => changed.get_or_insert(Settings::BUILD).chunk_commands = number(),
            "--hot-share" => load.hot_share = number().min(100),
            "--blocks-first" => changed.get_or_insert(Settings::BUILD).blocks_first = number(),
            "--memtable-mib" => {
                changed.get_or_insert(Settings::BUILD).memtable_bytes = number() << 20;
            }
            "--level0-tables" => {
                let tables = u8::try_from(number()).expect("at most 255 level-0 tables");
                changed.get_or_insert(Settings::BUILD).level0_tables = tables;
            }
            _ => {} // `cargo bench` passes `--bench`.
        }
    }
    println!(
        "| variant | commands | commands/s written | CPU s | MiB written (all files) | written ÷ before | compacting s | table bytes per command |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    let this_build = &VARIANTS[2];
    let runs: Vec<(String, &Variant, Settings)> = match changed {
        None => VARIANTS
            .iter()
            .map(|v| (v.name.to_owned(), v, Settings::BUILD))
            .collect(),
        Some(c) => vec![
            (this_build.name.to_owned(), this_build, Settings::BUILD),
            (format!("{}, {}", this_build.name, c.label()), this_build, c),
        ],
    };
    let mut before_written = None;
    for (name, v, settings) in &runs {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let r = replay(dir.path(), v, *settings, load);
        let base = *before_written.get_or_insert(r.written);
        println!(
            "| {} | {} | {:.0} | {:.1} | {:.0} | {:.2} | {:.1} | {:.1} |",
            name,
            load.commands,
            load.commands as f64 / r.ingest_seconds,
            r.cpu_seconds,
            r.written as f64 / f64::from(1 << 20),
            r.written as f64 / base as f64,
            r.compacting_seconds,
            r.table_bytes as f64 / load.commands as f64
        );
    }
}

struct Replayed {
    ingest_seconds: f64,
    cpu_seconds: f64,
    written: u64,
    compacting_seconds: f64,
    table_bytes: u64,
}

fn replay(dir: &Path, v: &Variant, settings: Settings, load: Load) -> Replayed {
    let db = Database::builder(dir)
        .cache_size(CACHE_BYTES)
        .journal_compression(CompressionType::None)
        .compaction_worker_nice(COMPACTION_WORKER_NICE)
        .open()
        .expect("the database opens");
    let default_compaction = v.fjall_default_compaction;
    let kv = db
        .keyspace("kv", move || {
            let mut options = fjall_keyspace_options().max_memtable_size(settings.memtable_bytes);
            if settings.block_bytes > 0 {
                options = options.data_block_size_policy(fjall::config::BlockSizePolicy::all(
                    settings.block_bytes,
                ));
            }
            if default_compaction {
                options.compaction_strategy(Arc::new(fjall::compaction::Leveled::default()))
            } else {
                options.compaction_strategy(Arc::new(leveled_compaction(settings.level0_tables)))
            }
        })
        .expect("the keyspace opens");
    let (written, cpu, started) = (io_written(), cpu_seconds(), Instant::now());
    let mut rng = 0x9E37_79B9_7F4A_7C15u64;
    let mut random = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let (mut key, mut value) = (Vec::new(), Vec::new());
    // Each workspace's last WLog offset.
    let mut wlogs = vec![0u64; usize::try_from(load.workspaces).expect("workspaces")];
    let (mut turn, mut hot) = (0u64, 0u64);
    // With `chunk_commands`: per workspace, the PLog offsets of its events since its last
    // chunk.
    let mut pending: Vec<Vec<u64>> = vec![Vec::new(); wlogs.len()];
    for first in (0..load.commands).step_by(BATCH as usize) {
        let mut batch = db.batch();
        for n in first..(first + BATCH).min(load.commands) {
            // The hot workspaces their share of the commands (spread evenly), the others in
            // turn.
            let index = if load.hot_share > 0
                && n * load.hot_share / 100 != (n + 1) * load.hot_share / 100
            {
                hot += 1;
                hot % HOT_WORKSPACES.min(load.workspaces)
            } else {
                turn += 1;
                turn % load.workspaces
            };
            let (ws, slot) = (workspace(index), usize::try_from(index).expect("an index"));
            wlogs[slot] += 1;
            let (wlog, plog) = (wlogs[slot], n + 1);
            let record = record_id(wlog);
            if settings.chunk_commands > 0 {
                pending[slot].push(plog);
                if (n + 1) % settings.chunk_commands == 0 {
                    write_chunks(&mut batch, &kv, &mut pending, &wlogs, &mut random);
                }
                continue;
            }
            for (tag, at) in [(2u8, wlog), (3, record)] {
                entry_key(&mut key, tag, ws, at, settings.blocks_first);
                value.clear();
                value.push(match (tag, v.checksummed_refs) {
                    (2, true) => 3,
                    (2, false) => 5,
                    (_, true) => 4,
                    (_, false) => 6,
                });
                if v.checksummed_refs {
                    value.extend_from_slice(&(random() as u32).to_le_bytes());
                }
                varint(&mut value, 1);
                varint(&mut value, plog);
                if tag == 3 {
                    varint(&mut value, 0);
                }
                value.extend_from_slice(&(random() as u32).to_le_bytes());
                batch.insert(&kv, key.clone(), value.clone());
            }
        }
        batch.commit().expect("the batch is written");
    }
    let ingest_seconds = started.elapsed().as_secs_f64();
    let level0_due = if default_compaction {
        4
    } else {
        settings.level0_tables
    };
    settle(&db, &kv, usize::from(level0_due));
    Replayed {
        ingest_seconds,
        cpu_seconds: cpu_seconds() - cpu,
        written: io_written() - written,
        compacting_seconds: db.time_compacting().as_secs_f64(),
        table_bytes: table_bytes(dir),
    }
}

/// The ID of workspace `index` (as the server hands them out, above 2^40).
fn workspace(index: u64) -> u64 {
    (1 << 40) + index
}

/// The ID of the record a workspace's event at WLog offset `wlog` creates (its records counted
/// from a kind's initial value as its WLog from 1).
fn record_id(wlog: u64) -> u64 {
    FIRST_RECORD_ID + wlog - 1
}

/// Every workspace's pending events as one WLog key and one records key: per event its PLog
/// offset as a difference from the one before and its checksum (a record also its index in
/// its event), under the key of the chunk's first WLog offset or record ID.
fn write_chunks(
    batch: &mut fjall::OwnedWriteBatch,
    kv: &fjall::Keyspace,
    pending: &mut [Vec<u64>],
    wlogs: &[u64],
    random: &mut impl FnMut() -> u64,
) {
    let (mut key, mut value) = (Vec::new(), Vec::new());
    for (index, events) in pending.iter_mut().enumerate() {
        if events.is_empty() {
            continue;
        }
        let ws = workspace(index as u64);
        let first = wlogs[index] + 1 - events.len() as u64;
        for (tag, at) in [(2u8, first), (3, record_id(first))] {
            entry_key(&mut key, tag, ws, at, 0);
            value.clear();
            value.push(7);
            varint(&mut value, 1);
            let mut before = 0;
            for &plog in events.iter() {
                varint(&mut value, plog - before);
                before = plog;
                if tag == 3 {
                    varint(&mut value, 0);
                }
                value.extend_from_slice(&(random() as u32).to_le_bytes());
            }
            batch.insert(kv, key.clone(), value.clone());
        }
        events.clear();
    }
}

/// Waits until no compaction runs or is due (fewer than `level0_due` tables in level 0), then
/// has fjall drop the tables compactions replaced (it does at a memtable's rotation).
fn settle(db: &Database, kv: &fjall::Keyspace, level0_due: usize) {
    let mut quiet = 0;
    while quiet < 4 {
        std::thread::sleep(Duration::from_millis(500));
        quiet = if db.active_compactions() == 0 && kv.l0_table_count() < level0_due {
            quiet + 1
        } else {
            0
        };
    }
    kv.insert(b"\x00\x01z", b"").expect("a key");
    kv.rotate_memtable_and_wait().expect("a flush");
    std::thread::sleep(Duration::from_secs(1));
}

/// A key as `monoseq-kv` encodes it (`len:be16 ‖ partition key ‖ clustering`, layout in
/// `docs/format.md`): tag, application 1, workspace, block (or, with `blocks_first` above 0,
/// the block of that many as `be64` before the workspace); the position in the block.
fn entry_key(out: &mut Vec<u8>, tag: u8, ws: u64, at: u64, blocks_first: u64) {
    out.clear();
    out.extend_from_slice(&[0, 0, tag, 1]);
    if let Some(block) = at.checked_div(blocks_first) {
        out.extend_from_slice(&block.to_be_bytes());
        varint(out, ws);
    } else {
        varint(out, ws);
        varint(out, at / 4096);
    }
    let len = u16::try_from(out.len() - 2).expect("a short key");
    out[..2].copy_from_slice(&len.to_be_bytes());
    out.extend_from_slice(&u16::try_from(at % 4096).expect("a position").to_be_bytes());
}

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Bytes this process has written to storage (`/proc/self/io`).
fn io_written() -> u64 {
    let io = std::fs::read_to_string("/proc/self/io").expect("/proc/self/io");
    io.lines()
        .find_map(|l| l.strip_prefix("write_bytes: "))
        .and_then(|v| v.trim().parse().ok())
        .expect("write_bytes")
}

/// CPU time of this process, user and system (`/proc/self/stat`, in clock ticks of 1/100 s).
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("/proc/self/stat");
    let fields: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (ticks(11) + ticks(12)) / 100.0
}

/// The bytes of the keyspace's table files (journals left out).
fn table_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .expect("a directory")
        .map(|entry| {
            let entry = entry.expect("an entry");
            let meta = entry.metadata().expect("metadata");
            if meta.is_dir() {
                table_bytes(&entry.path())
            } else if entry.path().extension().is_some_and(|x| x == "jnl") {
                0
            } else {
                meta.len()
            }
        })
        .sum()
}
