//! Memory benchmark: heap held by a sequencer (cache, backlog, worker buffers) while
//! 100 000, 1 000 000 and 10 000 000 workspaces rotate through the default 100 000-entry cache. A
//! counting allocator (`allocation-counter`) measures the peak heap of the thread that owns the
//! sequencer, where the cache and the backlog grow; the storage is a preallocated array built
//! before measuring. The figure must stay flat as the workspace count grows 10×.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use monoseq_core::{
    Batcher, Fence, Number, PLogOffset, Params, ReplayEnd, Runtime, SeqId, SeqStorage, SeqValue,
    Sequencer, Start, Status, StorageError, WsId, WsKind,
};

const KIND: WsKind = WsKind(1);

/// Numbers of `workspaces` workspaces × 3 sequences in one preallocated array.
struct ArrayStorage {
    numbers: Vec<[AtomicUsize; 3]>,
    checkpoint: AtomicUsize,
    fence: Fence,
}

impl SeqStorage for ArrayStorage {
    fn read_numbers(
        &self,
        ws: WsId,
        seqs: &[SeqId],
        out: &mut [Number],
    ) -> Result<(), StorageError> {
        let row = &self.numbers[ws.0 as usize];
        for (s, o) in seqs.iter().zip(out) {
            *o = Number(row[s.0 as usize - 1].load(Ordering::Relaxed) as u64);
        }
        Ok(())
    }

    fn read_next_plog_offset(&self) -> Result<PLogOffset, StorageError> {
        Ok(PLogOffset(
            self.checkpoint.load(Ordering::Relaxed).max(1) as u64
        ))
    }

    fn write_values_and_next_plog_offset(
        &self,
        values: &[SeqValue],
        next: PLogOffset,
    ) -> Result<(), StorageError> {
        for v in values {
            self.numbers[v.key.ws.0 as usize][v.key.seq.0 as usize - 1]
                .store(v.value.0 as usize, Ordering::Relaxed);
        }
        self.checkpoint.store(next.0 as usize, Ordering::Relaxed);
        Ok(())
    }

    fn fence(&self) -> &Fence {
        &self.fence
    }

    fn replay_plog(
        &self,
        _from: PLogOffset,
        _b: &mut Batcher<'_>,
    ) -> Result<ReplayEnd, StorageError> {
        Ok(ReplayEnd::Completed)
    }
}

fn run(workspaces: usize, runtime: &Runtime) -> (usize, f64) {
    let storage = ArrayStorage {
        numbers: (0..workspaces).map(|_| Default::default()).collect(),
        checkpoint: AtomicUsize::new(0),
        fence: Fence::new(),
    };
    let params = Params::builder()
        .kind(
            KIND,
            [
                (SeqId(1), Number(1)),
                (SeqId(2), Number(322_685_000_131_072)),
                (SeqId(3), Number(1)),
            ],
        )
        .build()
        .unwrap();
    let mut ns = 0.0;
    let info = allocation_counter::measure(|| ns = cycles_ns(params, storage, runtime));
    (info.bytes_max as usize, ns)
}

fn cycles_ns(params: Params, storage: ArrayStorage, runtime: &Runtime) -> f64 {
    let workspaces = storage.numbers.len();
    let mut seq = Sequencer::new(params, storage, runtime);
    assert_eq!(
        seq.handle().wait_actualized(Duration::from_secs(60)),
        Status::Ready
    );
    let cycles = 2_000_000usize;
    let began = Instant::now();
    let mut i = 0;
    while i < cycles {
        match seq.start(KIND, WsId((i % workspaces) as u64)).unwrap() {
            Start::Began(mut tx) => {
                tx.next(SeqId(1)).unwrap();
                tx.next(SeqId(2)).unwrap();
                tx.next(SeqId(2)).unwrap();
                tx.flush();
                i += 1;
            }
            Start::Busy(_) => std::thread::yield_now(),
        }
    }
    let ns = began.elapsed().as_nanos() as f64 / cycles as f64;
    seq.shutdown();
    ns
}

fn main() {
    // `cargo bench` passes flags such as `--bench`; this binary takes none.
    let runtime = Runtime::new(1).unwrap();
    let mut results = Vec::new();
    for workspaces in [100_000usize, 1_000_000, 10_000_000] {
        let (peak, ns) = run(workspaces, &runtime);
        println!(
            "memory: {workspaces:>9} workspaces: sequencer peak heap {:>7.1} MiB, {ns:.0} ns/cycle",
            peak as f64 / (1024.0 * 1024.0)
        );
        results.push(peak);
    }
    println!(
        "memory: ratio 1 000 000 / 100 000 workspaces = {:.2}, 10 000 000 / 1 000 000 = {:.2}",
        results[1] as f64 / results[0] as f64,
        results[2] as f64 / results[1] as f64
    );
}
