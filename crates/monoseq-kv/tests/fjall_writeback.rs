//! Table files written back while they are written (`vendor/fjall/PATCHES.md`, "Table files
//! written back as they grow"): the vendored lsm-tree starts the writeback of a table's pages
//! every `BYTES_PER_WRITEBACK` bytes, so that its final `fsync` does not send the whole table
//! to the disk at once, ahead of the small `fdatasync`s of the PLog segments.
#![cfg(all(feature = "fjall", target_os = "linux"))]

use std::fs::File;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

/// `struct cachestat_range` of `cachestat(2)`.
#[repr(C)]
struct CachestatRange {
    off: u64,
    len: u64,
}

/// `struct cachestat` of `cachestat(2)`.
#[repr(C)]
#[derive(Debug, Default)]
struct Cachestat {
    nr_cache: u64,
    nr_dirty: u64,
    nr_writeback: u64,
    nr_evicted: u64,
    nr_recently_evicted: u64,
}

/// `cachestat`'s number, the same on every Linux architecture (new system calls share one table).
const SYS_CACHESTAT: libc::c_long = 451;

/// The page cache's count of `file`'s pages: cached, dirty, under writeback.
fn cachestat(file: &File) -> Cachestat {
    let range = CachestatRange { off: 0, len: 0 };
    let mut stat = Cachestat::default();
    // SAFETY: `cachestat` reads `range` and writes `stat`, both live `#[repr(C)]` values of
    // the kernel's layout (two and five `u64`s) borrowed for the call; the descriptor is
    // borrowed from a `File` alive for the call. It touches no other memory.
    #[allow(unsafe_code)]
    let rc = unsafe {
        libc::syscall(
            SYS_CACHESTAT,
            file.as_raw_fd(),
            &raw const range,
            &raw mut stat,
            0,
        )
    };
    assert_eq!(
        rc,
        0,
        "cachestat(2) failed (the kernel needs to be 6.5 or later): {}",
        std::io::Error::last_os_error()
    );
    stat
}

/// A new directory on the disk the tests build on, not on a tmpfs, whose pages are never
/// written back.
fn on_disk() -> tempfile::TempDir {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("a temporary directory")
}

/// Waits, at most 15 s, until `done` holds of `file`'s page-cache counts; panics naming `what`
/// with the last counts otherwise.
fn wait_for(file: &File, what: &str, done: impl Fn(&Cachestat) -> bool) {
    // The kernel's own writeback leaves a page dirty for 30 s (`vm.dirty_expire_centisecs`)
    // when memory is not short: only a started writeback cleans pages within the bound.
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let now = cachestat(file);
        if done(&now) {
            return;
        }
        assert!(Instant::now() < deadline, "after 15 s, {what}: {now:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_table_being_written_has_its_pages_written_back_before_its_fsync() {
    let dir = on_disk();
    let path = dir.path().join("1");
    let mut writer = lsm_tree::table::Writer::new(path.clone(), 1, 0).expect("a table writer");
    // About 4.6 MiB of data blocks: 40 000 entries of a 8-byte key and a 100-byte value.
    for i in 0u64..40_000 {
        let value = [(i % 251) as u8; 100];
        writer
            .write(lsm_tree::InternalValue::from_components(
                i.to_be_bytes(),
                value,
                0,
                lsm_tree::ValueType::Value,
            ))
            .expect("an entry written");
    }
    let file = File::open(&path).expect("the table's file opens");
    let written = cachestat(&file);
    assert!(
        written.nr_cache >= 1024,
        "precondition: the writer has sent at least 4 MiB to the file: {written:?}"
    );
    // Every page but those of the last MiB (written after the last start) is written back,
    // though nothing synced the file.
    wait_for(
        &file,
        "the table's first MiBs are still dirty: no writeback was started while writing",
        |now| now.nr_dirty + now.nr_writeback <= 256 + 16,
    );
    let finished = writer.finish().expect("the table is finished");
    assert!(finished.is_some(), "the table holds its entries");
}

#[test]
fn starting_writeback_sends_a_files_dirty_pages_to_the_disk_without_an_fsync() {
    let dir = on_disk();
    let path = dir.path().join("table");
    let mut file = File::create_new(&path).expect("a new file");
    file.write_all(&vec![7u8; 8 << 20]).expect("8 MiB written");
    let before = cachestat(&file);
    assert!(
        before.nr_dirty >= 1024,
        "precondition: the 2048 pages just written are dirty: {before:?}"
    );

    lsm_tree::file::start_writeback(&file).expect("writeback starts");

    wait_for(
        &file,
        "pages are still dirty or under writeback since the writeback started",
        |now| now.nr_dirty == 0 && now.nr_writeback == 0,
    );
}
