//! The page cache's counts of a file's pages (`cachestat(2)`, Linux 6.5 or later), for tests
//! that a write-back left nothing dirty: the `testing` feature.

use std::fs::File;
use std::os::fd::AsRawFd;

/// `struct cachestat_range`: the whole file.
#[repr(C)]
struct Range {
    offset: u64,
    len: u64,
}

/// `struct cachestat`: counts of the file's pages.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PageCounts {
    /// Pages in the page cache.
    pub cached: u64,
    /// Pages written to and not yet sent to the disk.
    pub dirty: u64,
    /// Pages sent to the disk and not yet taken by it.
    pub writeback: u64,
    /// Pages evicted.
    pub evicted: u64,
    /// Pages evicted recently.
    pub recently_evicted: u64,
}

/// `cachestat`'s number, the same on every Linux architecture (new system calls share one
/// table).
const SYS_CACHESTAT: libc::c_long = 451;

/// The page cache's counts of `file`'s pages.
///
/// # Errors
///
/// The system call's error: `ENOSYS` before Linux 6.5.
pub fn page_counts(file: &File) -> std::io::Result<PageCounts> {
    let range = Range { offset: 0, len: 0 };
    let mut counts = PageCounts::default();
    // SAFETY: `cachestat` reads `range` and writes `counts`, live `#[repr(C)]` values of the
    // kernel's layout (two and five `u64`s) borrowed for the call; the descriptor is borrowed
    // from a `File` open for the call. It touches no other memory.
    #[expect(unsafe_code, reason = "see safety")]
    let rc = unsafe {
        libc::syscall(
            SYS_CACHESTAT,
            file.as_raw_fd(),
            &raw const range,
            &raw mut counts,
            0,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(counts)
}
