//! Idempotency keys: one fresh key per logical command, reused on each of its retries.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// Keys made by this process so far (makes two keys of one process differ for sure).
static MADE: AtomicU64 = AtomicU64::new(0);

/// A fresh `Idempotency-Key`: `mc-` and 48 hex digits (128 random bits from the standard
/// library's per-process hasher keys, a per-process counter, the time in nanoseconds folded
/// with the process ID). Unique enough that two logical commands never share one; not a
/// secret.
#[must_use]
pub fn new_idempotency_key() -> String {
    let n = MADE.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let random = |salt: u64| {
        let mut h = RandomState::new().build_hasher();
        h.write_u64(salt);
        h.write_u64(n);
        h.finish()
    };
    let pid = u64::from(std::process::id());
    format!(
        "mc-{:016x}{:016x}{:016x}",
        random(1),
        random(2),
        nanos ^ (pid << 40) ^ n
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn keys_differ_and_are_valid_header_values() {
        let a = super::new_idempotency_key();
        let b = super::new_idempotency_key();
        assert_ne!(a, b);
        assert_eq!(a.len(), 51);
        assert!(a.bytes().all(|c| c.is_ascii_graphic()));
    }
}
