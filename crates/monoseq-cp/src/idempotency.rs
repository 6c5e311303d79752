//! Safe retries (invariant 12 of docs/invariants.md): a command may carry an idempotency key (the
//! IETF httpapi draft's `Idempotency-Key`), scoped to the command's workspace. Each partition
//! remembers the keys of its last `idempotency_window_events` events — a hash of the key and the
//! event's PLog offset, not the answer — and a retry with a remembered key is answered from the
//! event itself, which holds the key, a fingerprint of the request and the raw-to-real IDs. The
//! window is rebuilt from the PLog tail at start, so retries stay safe across restarts and crashes.

use std::collections::{HashMap, VecDeque};
use std::hash::Hasher;
use std::io::Write as _;

#[cfg(test)]
use crate::command::Command;
use crate::error::CommandError;

/// Default span of the window: keys of the partition's last this many events are remembered.
pub const IDEMPOTENCY_WINDOW_EVENTS_DEFAULT: u64 = 100_000;
/// Longest accepted key, in bytes.
pub const IDEMPOTENCY_KEY_BYTES_MAX: usize = 255;

/// A client's idempotency key: 1 to [`IDEMPOTENCY_KEY_BYTES_MAX`] printable ASCII characters.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct IdempotencyKey(String);

impl IdempotencyKey {
    /// Validates `key`. A key in double quotes (the draft's structured-field string) is taken
    /// without its quotes.
    ///
    /// # Errors
    ///
    /// [`CommandError::InvalidKey`] for an empty, overlong or non-printable key.
    pub fn new(key: &str) -> Result<IdempotencyKey, CommandError> {
        let key = key
            .strip_prefix('"')
            .and_then(|k| k.strip_suffix('"'))
            .unwrap_or(key);
        if key.is_empty() || key.len() > IDEMPOTENCY_KEY_BYTES_MAX {
            return Err(CommandError::InvalidKey(format!(
                "an idempotency key has 1 to {IDEMPOTENCY_KEY_BYTES_MAX} characters, this one {}",
                key.len()
            )));
        }
        if !key.bytes().all(|b| (0x20..0x7f).contains(&b)) {
            return Err(CommandError::InvalidKey(
                "an idempotency key holds printable ASCII characters only".into(),
            ));
        }
        Ok(IdempotencyKey(key.to_owned()))
    }

    /// The key.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The 64-bit hash of the key in workspace `ws`, what the window remembers: a key is
    /// scoped to its workspace (the same key in another workspace is another key).
    pub(crate) fn hash_in(&self, ws: u64) -> u64 {
        let mut h = Fnv1a::default();
        h.write(&ws.to_le_bytes());
        h.write(self.0.as_bytes());
        h.finish()
    }
}

/// A command's fingerprint, taken as the command is encoded ([`crate::command::draft`]):
/// FNV-1a 64 of the command's canonical JSON, which the encoder writes here piece by piece, so
/// a retry of the same request matches and another body does not. The canonical JSON is the
/// serialization of [`crate::Command`] (fields in declaration order, `expected_wlog_offset` only when
/// given, maps in their order, no spaces): fingerprints are stored with every keyed event, so
/// it never changes ([`fingerprint`], the reference, is checked against it).
#[derive(Default)]
pub(crate) struct Fingerprint(Fnv1a);

impl Fingerprint {
    /// JSON text as it is: punctuation, or a value encoded already.
    pub(crate) fn text(&mut self, json: &[u8]) {
        self.0.write(json);
    }

    /// A string, quoted and escaped as JSON.
    pub(crate) fn string(&mut self, s: &str) {
        // Writing to the hasher cannot fail.
        let _ = serde_json::to_writer(HashWriter(&mut self.0), s);
    }

    /// A whole number.
    pub(crate) fn number(&mut self, n: u64) {
        let _ = write!(HashWriter(&mut self.0), "{n}");
    }

    pub(crate) fn finish(&self) -> u64 {
        self.0.finish()
    }
}

/// The reference fingerprint: FNV-1a 64 of the command serialized as JSON, what
/// [`Fingerprint`] must give for every command.
#[cfg(test)]
pub(crate) fn fingerprint(cmd: &Command) -> u64 {
    let mut h = Fnv1a::default();
    // Serializing a plain struct of strings, numbers and JSON values cannot fail; a failure
    // would only weaken the check to the bytes written so far.
    let _ = serde_json::to_writer(HashWriter(&mut h), cmd);
    h.finish()
}

struct Fnv1a(u64);

impl Default for Fnv1a {
    fn default() -> Fnv1a {
        Fnv1a(0xcbf2_9ce4_8422_2325)
    }
}

impl Hasher for Fnv1a {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }
}

struct HashWriter<'a>(&'a mut Fnv1a);

impl std::io::Write for HashWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.write(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The keys of a partition's recent events: key hash → PLog offset, bounded by the span of
/// offsets it covers.
#[derive(Debug)]
pub(crate) struct Window {
    span: u64,
    by_key: HashMap<u64, u64>,
    /// (offset, key hash) in offset order, for eviction.
    order: VecDeque<(u64, u64)>,
}

impl Window {
    pub(crate) fn new(span: u64) -> Window {
        Window {
            span: span.max(1),
            by_key: HashMap::new(),
            order: VecDeque::new(),
        }
    }

    /// The PLog offset of the event that carried a key of this hash, if remembered.
    pub(crate) fn get(&self, hash: u64) -> Option<u64> {
        self.by_key.get(&hash).copied()
    }

    /// Remembers that the event at `offset` carried a key of hash `hash`, and forgets keys of
    /// events `span` or more offsets before it.
    pub(crate) fn insert(&mut self, hash: u64, offset: u64) {
        self.by_key.insert(hash, offset);
        self.order.push_back((offset, hash));
        let oldest_kept = offset.saturating_sub(self.span - 1);
        while let Some(&(o, h)) = self.order.front() {
            if o >= oldest_kept {
                break;
            }
            self.order.pop_front();
            if self.by_key.get(&h) == Some(&o) {
                self.by_key.remove(&h);
            }
        }
    }

    /// Forgets keys of events at `offset` or after (their group was not written).
    pub(crate) fn forget_from(&mut self, offset: u64) {
        while let Some(&(o, h)) = self.order.back() {
            if o < offset {
                break;
            }
            self.order.pop_back();
            if self.by_key.get(&h) == Some(&o) {
                self.by_key.remove(&h);
            }
        }
    }

    /// The first offset the window covers when the PLog ends before `next`.
    pub(crate) fn start(&self, next: u64) -> u64 {
        next.saturating_sub(self.span).max(1)
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.by_key.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_printable_ascii_of_bounded_length_and_lose_their_quotes() {
        assert_eq!(IdempotencyKey::new("\"abc\"").unwrap().as_str(), "abc");
        assert_eq!(IdempotencyKey::new("a b-1").unwrap().as_str(), "a b-1");
        for bad in ["", "\"\"", "é", "a\nb"] {
            assert!(IdempotencyKey::new(bad).is_err(), "{bad:?}");
        }
        assert!(IdempotencyKey::new(&"k".repeat(IDEMPOTENCY_KEY_BYTES_MAX)).is_ok());
        assert!(IdempotencyKey::new(&"k".repeat(IDEMPOTENCY_KEY_BYTES_MAX + 1)).is_err());
    }

    #[test]
    fn the_window_forgets_keys_older_than_its_span_and_of_unwritten_groups() {
        let mut w = Window::new(10);
        w.insert(1, 1);
        w.insert(2, 5);
        assert_eq!(w.get(1), Some(1));
        w.insert(3, 11);
        assert_eq!(w.get(1), None, "offset 1 is 10 events before 11");
        assert_eq!(w.get(2), Some(5));
        w.insert(4, 12);
        w.insert(5, 13);
        w.forget_from(12);
        assert_eq!((w.get(3), w.get(4), w.get(5)), (Some(11), None, None));
        assert_eq!(w.len(), 2);
        assert_eq!(w.start(100), 90);
        assert_eq!(w.start(5), 1);
    }

    #[test]
    fn the_same_request_has_the_same_fingerprint_and_another_does_not() {
        let a: Command =
            serde_json::from_str(r#"{"ws": 1, "ws_kind": 1, "command": "c"}"#).unwrap();
        let b: Command =
            serde_json::from_str(r#"{"command": "c", "ws_kind": 1, "ws": 1}"#).unwrap();
        let c: Command =
            serde_json::from_str(r#"{"ws": 2, "ws_kind": 1, "command": "c"}"#).unwrap();
        assert_eq!(fingerprint(&a), fingerprint(&b));
        assert_ne!(fingerprint(&a), fingerprint(&c));
    }

    #[test]
    fn an_expected_wlog_offset_is_part_of_the_fingerprint_only_when_given() {
        let plain: Command =
            serde_json::from_str(r#"{"ws": 1, "ws_kind": 1, "command": "c"}"#).unwrap();
        // Fingerprints stored before the field existed still match a command without it.
        assert_eq!(fingerprint(&plain), 0x9582_0d04_d74a_c0ef);
        let on = |n| Command {
            expected_wlog_offset: Some(n),
            ..plain.clone()
        };
        assert_ne!(fingerprint(&on(0)), fingerprint(&plain));
        assert_ne!(fingerprint(&on(0)), fingerprint(&on(1)));
        assert_eq!(fingerprint(&on(1)), fingerprint(&on(1)));
    }
}
