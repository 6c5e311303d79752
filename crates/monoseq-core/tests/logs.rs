//! The driver's log lines: an actualization's start and end at info, a poison at error with
//! its reason. A subscriber of this test binary's own records every event (the driver logs
//! from the runtime's threads, so it is installed globally: one test per binary).

mod common;

use std::fmt::Write as _;
use std::sync::{Arc, Mutex};

use common::*;
use monoseq_core::mem::{MemSeqStorage, Op};
use monoseq_core::{PoisonReason, SeqValue, WsId};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

/// Records `LEVEL message field=value ...` for every event.
#[derive(Clone, Default)]
struct Recorder(Arc<Mutex<Vec<String>>>);

struct Line<'a>(&'a mut String);

impl Visit for Line<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        let _ = write!(self.0, " {}={value:?}", field.name());
    }
}

impl Subscriber for Recorder {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, event: &Event<'_>) {
        let mut line = event.metadata().level().to_string();
        event.record(&mut Line(&mut line));
        self.0.lock().unwrap().push(line);
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

impl Recorder {
    fn find(&self, level: Level, text: &str) -> Option<String> {
        let prefix = level.to_string();
        self.0
            .lock()
            .unwrap()
            .iter()
            .find(|l| l.starts_with(&prefix) && l.contains(text))
            .cloned()
    }
}

#[test]
fn the_driver_logs_actualizations_at_info_and_a_poison_at_error_with_its_reason() {
    let recorder = Recorder::default();
    tracing::subscriber::set_global_default(recorder.clone()).expect("first subscriber");
    let storage = MemSeqStorage::new();
    storage
        .append_event(
            monoseq_core::PLogOffset(1),
            KIND,
            &[SeqValue::new(WsId(1), WLOG, monoseq_core::Number(1))],
        )
        .unwrap();
    let mut seq = new_seq(params(), &storage);
    let handle = seq.handle();
    let tx = begin(&mut seq, KIND, WsId(1));
    wait_until("the actualization's end is logged", || {
        recorder
            .find(Level::INFO, "sequencer actualization ended")
            .is_some()
    });
    assert!(
        recorder
            .find(Level::INFO, "sequencer actualization started")
            .is_some()
    );
    let ended = recorder
        .find(Level::INFO, "sequencer actualization ended")
        .unwrap();
    assert!(ended.contains("events_replayed=1"), "{ended}");
    assert!(ended.contains("duration_ms="), "{ended}");
    assert!(ended.contains("next_offset=2"), "{ended}");
    // A storage call of the worker panics: the poison is logged with its reason.
    storage.set_hook(|op| match op {
        Op::WriteCheckpoint(_) => panic!("a bug inside storage code"),
        _ => Ok(()),
    });
    let mut tx = tx;
    let n = tx.next(WLOG).unwrap();
    storage
        .append_event(tx.plog_offset(), KIND, &[SeqValue::new(WsId(1), WLOG, n)])
        .unwrap();
    tx.flush();
    wait_until("the worker's panic poisoned the sequencer", || {
        handle.stats().poisoned
    });
    wait_until("the poison is logged", || {
        recorder.find(Level::ERROR, "poisoned").is_some()
    });
    let line = recorder.find(Level::ERROR, "poisoned").unwrap();
    assert!(
        line.contains(&PoisonReason::WorkerPanicked.to_string()),
        "{line}"
    );
}
