//! Waiting for actualization: the one place outside the driver where the crate blocks a thread
//! or reads a clock. The state machine only signals (`StatusSignal::notify`, in `shared.rs`); a caller that
//! chose to wait ([`Sequencer::start_wait`], [`SequencerHandle::wait_actualized`]) blocks here
//! on a condition variable until the status leaves `None`/`Actualizing` or its wait passes.

use std::time::{Duration, Instant};

use crate::sequencer::{Sequencer, SequencerHandle, Start, StartError};
use crate::shared::{Shared, Status};
use crate::storage::SeqStorage;
use crate::types::{WsId, WsKind};

/// Blocks until the status of `shared` is no longer `None`/`Actualizing` or `wait` passed.
fn wait_actualized<S: SeqStorage>(shared: &Shared<S>, wait: Duration) {
    let deadline = Instant::now() + wait;
    let signal = &shared.status_signal;
    let mut guard = signal.lock.lock().unwrap_or_else(|e| e.into_inner());
    while matches!(shared.status(), Status::None | Status::Actualizing) {
        let now = Instant::now();
        if now >= deadline {
            return;
        }
        guard = signal
            .changed
            .wait_timeout(guard, deadline - now)
            .unwrap_or_else(|e| e.into_inner())
            .0;
    }
}

impl<S: SeqStorage> Sequencer<S> {
    /// Like [`start`](Self::start), but while actualization runs it blocks the calling thread until
    /// actualization ends, up to `wait` (the reference design's `StartEvent(wait)`,
    /// docs/invariants.md).
    ///
    /// # Errors
    ///
    /// As [`start`](Self::start).
    pub fn start_wait(
        &mut self,
        kind: WsKind,
        ws: WsId,
        wait: Duration,
    ) -> Result<Start<'_, S>, StartError> {
        if matches!(self.shared().status(), Status::None | Status::Actualizing) {
            wait_actualized(self.shared(), wait);
        }
        self.start(kind, ws)
    }
}

impl<S: SeqStorage> SequencerHandle<S> {
    /// Blocks the calling thread until actualization has finished or `wait` passed; answers
    /// the status then.
    #[must_use]
    pub fn wait_actualized(&self, wait: Duration) -> Status {
        wait_actualized(self.shared(), wait);
        self.shared().status()
    }
}
