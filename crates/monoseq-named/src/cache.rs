//! The server-side number cache of named sequences (PostgreSQL's `CACHE`), opt-in through
//! [`CacheOptions`]: one conditional write reserves a block of numbers for this process, and
//! the calls that follow take theirs from memory until the block runs out. Owns the blocks
//! (at most [`CacheOptions::blocks_max`], least recently used evicted), the reservation's size,
//! and the tickets that keep a refill from installing a block that a `reset`, `set` or
//! `delete` made stale meanwhile.
//!
//! A block holds only numbers of a write that returned `Ok` (durable), so a crash or a restart
//! never hands a number out twice: what was reserved and not handed out is a gap. The stored
//! value is the reservation's ceiling, which other processes see and reserve above.

use std::num::{NonZeroU32, NonZeroU64};
use std::sync::{Mutex, MutexGuard, PoisonError};

use schnellru::{ByLength, LruMap};

use crate::record::VALUE_MAX;

/// Default bound on the blocks one [`Sequences`](crate::Sequences) holds: sequences with a
/// block in memory; a refill past it evicts the least recently used one (its numbers become a
/// gap).
pub const CACHE_BLOCKS_MAX_DEFAULT: NonZeroU32 = NonZeroU32::new(65_536).expect("not zero");

/// The number cache of [`Sequences::with_cache`](crate::Sequences::with_cache).
///
/// # Example
///
/// ```
/// use std::num::{NonZeroU32, NonZeroU64};
/// use monoseq_named::CacheOptions;
///
/// let options = CacheOptions::new(NonZeroU64::new(32).unwrap())
///     .blocks_max(NonZeroU32::new(1024).unwrap());
/// assert_eq!(options.numbers_value().get(), 32);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheOptions {
    numbers: NonZeroU64,
    blocks_max: NonZeroU32,
}

impl Default for CacheOptions {
    /// No cache (one number per write, as without the option).
    fn default() -> CacheOptions {
        CacheOptions::new(NonZeroU64::MIN)
    }
}

impl CacheOptions {
    /// A cache of `numbers` numbers per sequence (1: no cache, every number durable before it
    /// is answered, no gaps), at most [`CACHE_BLOCKS_MAX_DEFAULT`] sequences at once.
    pub fn new(numbers: NonZeroU64) -> CacheOptions {
        CacheOptions {
            numbers,
            blocks_max: CACHE_BLOCKS_MAX_DEFAULT,
        }
    }

    /// Most sequences holding a block at once (default [`CACHE_BLOCKS_MAX_DEFAULT`]); past it
    /// the least recently used block is dropped, its numbers a gap.
    #[must_use]
    pub fn blocks_max(mut self, blocks_max: NonZeroU32) -> CacheOptions {
        self.blocks_max = blocks_max;
        self
    }

    /// The numbers one write reserves.
    pub fn numbers_value(&self) -> NonZeroU64 {
        self.numbers
    }

    /// The bound on blocks.
    pub fn blocks_max_value(&self) -> NonZeroU32 {
        self.blocks_max
    }
}

/// The blocks of one [`Sequences`](crate::Sequences).
pub(crate) struct NumberCache {
    numbers: u64,
    blocks: Mutex<Blocks>,
}

struct Blocks {
    by_key: LruMap<String, Entry, ByLength>,
    /// The last ticket handed to a refill.
    tickets: u64,
}

/// One sequence's block, and the ticket of the refill that may install the next.
#[derive(Default)]
struct Entry {
    /// Numbers `next..end` are reserved by a durable write and not handed out.
    block: Option<Block>,
    /// The refill in flight: only it may install a block. Dropping the entry (a `reset`,
    /// `set`, `delete`, or an eviction) turns its install into a gap.
    refill: Option<u64>,
}

#[derive(Clone, Copy)]
struct Block {
    next: u64,
    end: u64,
}

impl NumberCache {
    /// The cache `options` ask for; `None` for a cache of one number (none).
    pub(crate) fn new(options: CacheOptions) -> Option<NumberCache> {
        (options.numbers.get() > 1).then(|| NumberCache {
            numbers: options.numbers.get(),
            blocks: Mutex::new(Blocks {
                by_key: LruMap::new(ByLength::new(options.blocks_max.get())),
                tickets: 0,
            }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Blocks> {
        self.blocks.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes `increment` consecutive numbers of `key`'s block, answering the first; `None`
    /// when the block does not hold them all (then it is left as it is).
    pub(crate) fn take(&self, key: &str, increment: u64) -> Option<u64> {
        let mut blocks = self.lock();
        let entry = blocks.by_key.get(key)?;
        let block = entry.block.as_mut()?;
        if block.end - block.next < increment {
            return None;
        }
        let first = block.next;
        block.next += increment;
        if block.next == block.end {
            entry.block = None;
        }
        Some(first)
    }

    /// The number the next `take` of `key` would answer, if its block holds one.
    pub(crate) fn peek(&self, key: &str) -> Option<u64> {
        let blocks = self.lock();
        blocks
            .by_key
            .peek(key)
            .and_then(|entry| entry.block.map(|block| block.next))
    }

    /// Starts a refill of `key`: the ticket its [`install`](NumberCache::install) must show.
    /// A block still there stays usable until the refill installs its own.
    pub(crate) fn begin_refill(&self, key: &str) -> u64 {
        let mut blocks = self.lock();
        blocks.tickets += 1;
        let ticket = blocks.tickets;
        if let Some(entry) = blocks.by_key.get(key) {
            entry.refill = Some(ticket);
        } else {
            let entry = Entry {
                block: None,
                refill: Some(ticket),
            };
            blocks.by_key.insert(key.to_owned(), entry);
        }
        ticket
    }

    /// Installs the numbers `next..end` of a durable reservation as `key`'s block, if the
    /// refill of `ticket` is still the one that may (no `drop_block` or eviction since it
    /// began); otherwise they are a gap.
    pub(crate) fn install(&self, key: &str, ticket: u64, next: u64, end: u64) {
        let mut blocks = self.lock();
        let Some(entry) = blocks.by_key.peek_mut(key) else {
            return;
        };
        if entry.refill != Some(ticket) {
            return;
        }
        entry.refill = None;
        entry.block = (next < end).then_some(Block { next, end });
    }

    /// Drops `key`'s block, and the right of a refill in flight to install one.
    pub(crate) fn drop_block(&self, key: &str) {
        self.lock().by_key.remove(key);
    }

    /// The value a refill stores: past the `end` its callers need, up to `numbers` past
    /// `start`, never past [`VALUE_MAX`] (a block near it is only shorter).
    pub(crate) fn ceiling(&self, start: u64, end: u64) -> u64 {
        start.saturating_add(self.numbers).min(VALUE_MAX).max(end)
    }

    /// How many sequences hold an entry (a block or a refill in flight).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().by_key.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cache(numbers: u64, blocks_max: u32) -> NumberCache {
        let options = CacheOptions::new(NonZeroU64::new(numbers).unwrap())
            .blocks_max(NonZeroU32::new(blocks_max).unwrap());
        NumberCache::new(options).unwrap()
    }

    #[test]
    fn a_cache_of_one_number_is_none() {
        assert!(NumberCache::new(CacheOptions::default()).is_none());
    }

    #[test]
    fn a_block_hands_out_its_numbers_in_order_then_runs_out() {
        let c = cache(4, 8);
        assert_eq!(c.take("a", 1), None, "no block yet");
        let ticket = c.begin_refill("a");
        c.install("a", ticket, 2, 5);
        assert_eq!(c.peek("a"), Some(2));
        assert_eq!(c.take("a", 2), Some(2));
        assert_eq!(c.take("a", 2), None, "only 4 is left");
        assert_eq!(c.take("a", 1), Some(4));
        assert_eq!(c.peek("a"), None);
        assert_eq!(c.take("a", 1), None);
    }

    #[test]
    fn a_dropped_block_refuses_the_install_of_the_refill_in_flight() {
        let c = cache(4, 8);
        let ticket = c.begin_refill("a");
        c.drop_block("a");
        c.install("a", ticket, 1, 5);
        assert_eq!(c.take("a", 1), None);
        let later = c.begin_refill("a");
        c.install("a", ticket, 1, 5);
        assert_eq!(c.take("a", 1), None, "an older ticket installs nothing");
        c.install("a", later, 10, 14);
        assert_eq!(c.take("a", 1), Some(10));
    }

    #[test]
    fn past_the_bound_the_least_recently_used_block_is_evicted() {
        let c = cache(4, 2);
        for key in ["a", "b"] {
            let ticket = c.begin_refill(key);
            c.install(key, ticket, 1, 5);
        }
        assert_eq!(c.take("a", 1), Some(1), "a is now the most recent");
        let ticket = c.begin_refill("c");
        c.install("c", ticket, 1, 5);
        assert_eq!(c.len(), 2);
        assert_eq!(c.peek("b"), None, "b was evicted");
        assert_eq!(c.peek("a"), Some(2));
        assert_eq!(c.peek("c"), Some(1));
    }

    #[test]
    fn the_ceiling_reserves_the_block_within_the_largest_value() {
        let c = cache(32, 8);
        assert_eq!(c.ceiling(1, 2), 33);
        assert_eq!(c.ceiling(1, 101), 101, "a batch larger than a block");
        assert_eq!(c.ceiling(VALUE_MAX - 3, VALUE_MAX - 2), VALUE_MAX);
    }
}
