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
}

impl Settings {
    const BUILD: Settings = Settings {
        memtable_bytes: MEMTABLE_BYTES,
        level0_tables: COMPACTION_LEVEL0_TABLES,
    };
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
    let (mut commands, mut workspaces) = (30_000_000u64, 1_000u64);
    let mut changed = None::<Settings>;
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut number = || {
            it.next()
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("{arg} needs a number"))
        };
        match arg.as_str() {
            "--commands" => commands = number(),
            "--workspaces" => workspaces = number(),
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
            (
                format!(
                    "{}, {} MiB memtables, level 0 merged at {}",
                    this_build.name,
                    c.memtable_bytes >> 20,
                    c.level0_tables
                ),
                this_build,
                c,
            ),
        ],
    };
    let mut before_written = None;
    for (name, v, settings) in &runs {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let r = replay(dir.path(), v, *settings, (commands, workspaces));
        let base = *before_written.get_or_insert(r.written);
        println!(
            "| {} | {commands} | {:.0} | {:.1} | {:.0} | {:.2} | {:.1} | {:.1} |",
            name,
            commands as f64 / r.ingest_seconds,
            r.cpu_seconds,
            r.written as f64 / f64::from(1 << 20),
            r.written as f64 / base as f64,
            r.compacting_seconds,
            r.table_bytes as f64 / commands as f64
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

fn replay(
    dir: &Path,
    v: &Variant,
    settings: Settings,
    (commands, workspaces): (u64, u64),
) -> Replayed {
    let db = Database::builder(dir)
        .cache_size(CACHE_BYTES)
        .journal_compression(CompressionType::None)
        .compaction_worker_nice(COMPACTION_WORKER_NICE)
        .open()
        .expect("the database opens");
    let default_compaction = v.fjall_default_compaction;
    let kv = db
        .keyspace("kv", move || {
            let options = fjall_keyspace_options().max_memtable_size(settings.memtable_bytes);
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
    for first in (0..commands).step_by(BATCH as usize) {
        let mut batch = db.batch();
        for n in first..(first + BATCH).min(commands) {
            // Workspace IDs as the server hands them out (above 2^40), in turn.
            let ws = (1 << 40) + n % workspaces;
            let (wlog, plog) = (n / workspaces + 1, n + 1);
            let record = (ws << 8) | wlog;
            for (tag, at) in [(2u8, wlog), (3, record)] {
                entry_key(&mut key, tag, ws, at);
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
/// `docs/format.md`): tag, application 1, workspace, block; the position in the block.
fn entry_key(out: &mut Vec<u8>, tag: u8, ws: u64, at: u64) {
    out.clear();
    out.extend_from_slice(&[0, 0, tag, 1]);
    varint(out, ws);
    varint(out, at / 4096);
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
