//! How the embedded backends lay a [`Key`] out in their single ordered key space:
//! `partition length (u16, big-endian) ‖ partition ‖ clustering`. The length prefix makes the
//! entries of one partition exactly the keys starting with `length ‖ partition`, ordered by
//! clustering columns; partitions themselves are ordered by length, then bytes (no scan
//! crosses partitions, so that order is never observed).

use std::ops::Bound;

use crate::key::{Key, limits};

const LEN_BYTES: usize = 2;
const _: () = assert!(limits::PARTITION_KEY_BYTES_MAX <= u16::MAX as usize);

/// Whether `partition` can be stored at all; longer ones are never present.
pub(crate) fn storable(partition: &[u8]) -> bool {
    partition.len() <= limits::PARTITION_KEY_BYTES_MAX
}

/// Appends the prefix shared by every entry of `partition`. Precondition: [`storable`].
fn push_prefix(partition: &[u8], out: &mut Vec<u8>) {
    debug_assert!(storable(partition));
    let len = u16::try_from(partition.len()).unwrap_or(u16::MAX);
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(partition);
}

/// Writes the encoding of `key` into `out` (cleared first). Precondition: the partition is
/// [`storable`].
pub(crate) fn encode_into(key: Key<'_>, out: &mut Vec<u8>) {
    out.clear();
    out.reserve(LEN_BYTES + key.partition.len() + key.clustering.len());
    push_prefix(key.partition, out);
    out.extend_from_slice(key.clustering);
}

/// The encoding of `key`. Precondition: the partition is [`storable`].
#[cfg(test)]
pub(crate) fn encode(key: Key<'_>) -> Vec<u8> {
    let mut out = Vec::new();
    encode_into(key, &mut out);
    out
}

/// The clustering columns of an encoded key of `partition`.
pub(crate) fn clustering<'k>(partition: &[u8], encoded: &'k [u8]) -> &'k [u8] {
    encoded
        .get(LEN_BYTES + partition.len()..)
        .unwrap_or_default()
}

/// The partition of an encoded key; `None` when the key is shorter than its length prefix
/// says (never written by [`encode_into`]).
pub(crate) fn partition_of(encoded: &[u8]) -> Option<&[u8]> {
    let len = encoded.get(..LEN_BYTES)?;
    let len = usize::from(u16::from_be_bytes([*len.first()?, *len.get(1)?]));
    encoded.get(LEN_BYTES..LEN_BYTES + len)
}

/// The smallest encoded key above every key of `partition`, if any: where the next partition's
/// keys begin. Precondition: the partition is [`storable`].
pub(crate) fn after_partition(partition: &[u8]) -> Option<Vec<u8>> {
    let mut prefix = Vec::with_capacity(LEN_BYTES + partition.len());
    push_prefix(partition, &mut prefix);
    successor(prefix)
}

/// Encoded bounds covering the entries of `partition` between `from` and `to`.
/// Precondition: the partition is [`storable`] and the range is not empty.
pub(crate) fn range(
    partition: &[u8],
    from: Bound<&[u8]>,
    to: Bound<&[u8]>,
) -> (Bound<Vec<u8>>, Bound<Vec<u8>>) {
    let mut prefix = Vec::with_capacity(LEN_BYTES + partition.len());
    push_prefix(partition, &mut prefix);
    let with = |clustering: &[u8]| {
        let mut key = prefix.clone();
        key.extend_from_slice(clustering);
        key
    };
    let lower = match from {
        Bound::Included(c) => Bound::Included(with(c)),
        Bound::Excluded(c) => Bound::Excluded(with(c)),
        Bound::Unbounded => Bound::Included(prefix.clone()),
    };
    let upper = match to {
        Bound::Included(c) => Bound::Included(with(c)),
        Bound::Excluded(c) => Bound::Excluded(with(c)),
        Bound::Unbounded => successor(prefix).map_or(Bound::Unbounded, Bound::Excluded),
    };
    (lower, upper)
}

/// The smallest byte string greater than every string starting with `prefix`, if any.
fn successor(mut prefix: Vec<u8>) -> Option<Vec<u8>> {
    while let Some(last) = prefix.pop() {
        if last < u8::MAX {
            prefix.push(last + 1);
            return Some(prefix);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partition_range_covers_exactly_its_partition() {
        let (lower, upper) = range(b"ab", Bound::Unbounded, Bound::Unbounded);
        let inside = encode(Key::new(b"ab", b"\xff\xff"));
        let empty = encode(Key::new(b"ab", b""));
        let other = encode(Key::new(b"abc", b""));
        let shorter = encode(Key::new(b"a", b"b\xff"));
        let contains = |k: &Vec<u8>| (lower.as_ref(), upper.as_ref()).contains(k);
        use std::ops::RangeBounds;
        assert!(contains(&inside) && contains(&empty));
        assert!(!contains(&other) && !contains(&shorter));
        assert_eq!(clustering(b"ab", &inside), b"\xff\xff");
    }

    #[test]
    fn an_encoded_key_names_its_partition_and_the_next_partition_sorts_after_it() {
        let key = encode(Key::new(b"ab", b"\xff\xff"));
        assert_eq!(partition_of(&key), Some(&b"ab"[..]));
        assert_eq!(partition_of(&encode(Key::new(b"", b"x"))), Some(&b""[..]));
        assert_eq!(partition_of(&[0, 5, b'a']), None, "cut short");
        assert_eq!(partition_of(&[0]), None);
        let next = after_partition(b"ab").expect("a successor");
        assert!(key < next);
        assert!(next <= encode(Key::new(b"ac", b"")));
    }

    #[test]
    fn successor_skips_trailing_max_bytes() {
        assert_eq!(successor(vec![1, 0xff]), Some(vec![2]));
        assert_eq!(successor(vec![0xff, 0xff]), None);
    }
}
