//! Operator commands over a data directory (the server must be stopped: the directory is
//! locked): `inspect` shows each partition's checkpoint against its PLog end; `verify` prints
//! what the `monoseq-verify` library finds in a copy of the directory.

use std::collections::BTreeMap;
use std::io::Write;
use std::ops::ControlFlow;

use anyhow::{Context, bail};
use indicatif::{ProgressBar, ProgressStyle};
use monoseq_core::{PLogOffset, ReplayedEvent, SeqStorage};
use monoseq_kv::KvStore;
use monoseq_store::{EventStore, PartitionId};
use monoseq_verify::{Progress, Report, Stage};

use crate::config::{APP, Settings, Storage};
use crate::storage::open_for_tool;

fn partitions(settings: &Settings, kv: &impl KvStore) -> anyhow::Result<u32> {
    let place = match settings.storage {
        Storage::Embedded => settings.data_dir.clone(),
        Storage::Postgres(_) => settings.storage.describe().into(),
    };
    let recorded = monoseq_store::recorded_partitions(kv, &place)?;
    Ok(recorded.unwrap_or(settings.partitions))
}

/// `monoseq inspect`.
pub fn inspect(settings: &Settings, full: bool) -> anyhow::Result<()> {
    let kv = open_for_tool(settings)?;
    let n = partitions(settings, &kv)?;
    let segments = crate::storage::tool_segments(settings, n)?;
    let store = EventStore::with_plogs(kv, APP, settings.trust, segments);
    // Written with `?`: a closed pipe (`inspect | head`) ends the command quietly.
    let mut out = std::io::stdout().lock();
    match settings.storage {
        Storage::Embedded => writeln!(out, "data directory: {}", settings.data_dir.display())?,
        Storage::Postgres(_) => writeln!(out, "storage: {}", settings.storage.describe())?,
    }
    writeln!(out, "partitions: {n}")?;
    writeln!(
        out,
        "{:>9} {:>12} {:>12} {:>10}{}",
        "partition",
        "checkpoint",
        "plog_end",
        "tail",
        if full { "  workspaces" } else { "" }
    )?;
    for p in 0..n {
        let seq = store.seq_storage(PartitionId(p));
        let checkpoint = seq
            .read_next_plog_offset()
            .context("reading the checkpoint")?;
        let mut last = checkpoint.0.saturating_sub(1);
        let mut workspaces = std::collections::HashSet::new();
        let from = if full { PLogOffset::FIRST } else { checkpoint };
        seq.replay_plog(from, &mut |e: ReplayedEvent<'_>| {
            last = last.max(e.offset.0);
            if full && let Some(v) = e.values.first() {
                workspaces.insert(v.key.ws);
            }
            ControlFlow::Continue(())
        })
        .context("scanning the PLog")?;
        let end = last + 1;
        write!(
            out,
            "{p:>9} {:>12} {:>12} {:>10}",
            checkpoint.0,
            end,
            end.saturating_sub(checkpoint.0)
        )?;
        if full {
            write!(out, "  {:>10}", workspaces.len())?;
        }
        writeln!(out)?;
    }
    Ok(())
}

/// Problems `verify` prints by default; the rest are counted.
pub const VERIFY_SHOWN_DEFAULT: usize = 20;

/// `monoseq verify`: reads a copy of the data directory (the directory itself is never
/// opened by the engine, so no byte of it changes), prints every problem the
/// `monoseq-verify` library finds (the first `shown`, then a count) and exits non-zero when
/// there is one.
pub fn verify(settings: &Settings, shown: usize) -> anyhow::Result<()> {
    let dir = &settings.data_dir;
    let where_ = match settings.storage {
        Storage::Embedded => dir.display().to_string(),
        Storage::Postgres(_) => settings.storage.describe(),
    };
    let bar = ProgressBar::new_spinner();
    bar.set_style(
        ProgressStyle::with_template("{spinner} {msg}: {pos} ({per_sec}, {elapsed})")
            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
    );
    bar.set_message("copying the data directory");
    let mut stage = None;
    let partitions = settings
        .partitions_configured
        .then_some(settings.partitions);
    let mut progress = |p: Progress| {
        if stage != Some(p.stage) {
            stage = Some(p.stage);
            bar.reset();
            bar.set_message(stage_name(p.stage));
        }
        bar.set_position(p.done);
    };
    let report = match &settings.storage {
        Storage::Embedded => monoseq_verify::verify_data_dir(dir, APP, partitions, &mut progress)
            .with_context(|| format!("verifying {where_}"))?,
        Storage::Postgres(_) => {
            // Reads only: a database needs no private copy.
            let kv = open_for_tool(settings)?;
            let n = self::partitions(settings, &kv)?;
            monoseq_verify::Verifier::new(&kv, APP)
                .partitions(n)
                .run(&mut progress)
        }
    };
    bar.finish_and_clear();
    print_report(&report, &where_, shown)
}

/// What the progress bar says during `stage`.
fn stage_name(stage: Stage) -> String {
    match stage {
        Stage::PLog {
            partition,
            partitions,
        } => format!("PLog of partition {partition}/{partitions}, events"),
        Stage::WLog => "WLog blocks".to_owned(),
        Stage::Records => "records blocks".to_owned(),
        Stage::Numbers => "numbers blocks".to_owned(),
        _ => "verifying".to_owned(),
    }
}

/// Prints what `verify` found (the first `shown` problems, then a count); an error when it
/// found a problem.
fn print_report(report: &Report, where_: &str, shown: usize) -> anyhow::Result<()> {
    println!(
        "verified {}: {} partitions, {} events, {} workspaces, {} records, {} stored numbers",
        where_, report.partitions, report.events, report.workspaces, report.records, report.numbers
    );
    if report.is_ok() {
        println!(
            "ok: no problems (PLogs whole, invariants 1-5 and 10 hold, every WLog entry, record \
             and stored number matches the PLog)"
        );
        return Ok(());
    }
    for p in report.problems.iter().take(shown) {
        println!("PROBLEM {p}");
    }
    let listed = report.problems.len().min(shown) as u64;
    if report.problems_total > listed {
        println!("... and {} more", report.problems_total - listed);
    }
    let mut kinds: BTreeMap<&str, u64> = BTreeMap::new();
    for p in &report.problems {
        *kinds.entry(p.kind()).or_default() += 1;
    }
    let kinds: Vec<String> = kinds.iter().map(|(k, n)| format!("{k} x{n}")).collect();
    bail!(
        "{} problems in {}: {}{}",
        report.problems_total,
        where_,
        kinds.join(", "),
        if report.problems_total > report.problems.len() as u64 {
            " (counted among the listed ones)"
        } else {
            ""
        }
    )
}
