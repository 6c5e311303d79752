//! A group's fence in a consumer position: the session that holds the partition and the
//! generation it was given at (`crate::groups`), and the checked layout both the fenced
//! position and a group's state share: a version byte, the CRC-32 of the body, the body.

/// Format version of a position carrying a group's fence.
pub const FENCED_POSITION_VERSION: u8 = 2;
/// Version and CRC-32 before a stored body.
pub(crate) const HEADER_BYTES: usize = 5;

/// What is wrong with stored position or group bytes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum BytesError {
    /// Nothing is stored.
    #[error("no bytes")]
    Empty,
    /// Written by a newer build.
    #[error("format version {found}; this build reads version {reads}: upgrade monoseq")]
    Version {
        /// The version stored.
        found: u8,
        /// The version this build reads.
        reads: u8,
    },
    /// Shorter than its header.
    #[error("truncated before the checksum ends")]
    NoChecksum,
    /// The body does not match its checksum.
    #[error("checksum mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    Checksum {
        /// The checksum stored.
        stored: u32,
        /// The checksum of the body stored.
        computed: u32,
    },
    /// A varint (`what`: which number) runs past 64 bits.
    #[error("{what} is over 64 bits")]
    Overflow {
        /// Which number.
        what: &'static str,
    },
    /// The bytes end inside a varint (`what`: which number).
    #[error("truncated inside {what}")]
    Truncated {
        /// Which number.
        what: &'static str,
    },
    /// Bytes follow a position's offset.
    #[error("{0} bytes after the offset")]
    Trailing(usize),
    /// A fence's session is not UTF-8.
    #[error("the session is not UTF-8")]
    SessionNotUtf8,
    /// A group's state does not parse: the parser's message.
    #[error("{0}")]
    Json(String),
}

/// A position's fence: who may commit it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fence {
    /// The session holding the partition.
    pub session: String,
    /// The generation it was given at.
    pub generation: u64,
}

/// `version`, the CRC-32 (little-endian) of `body`, then `body`.
pub(crate) fn with_header(version: u8, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_BYTES + body.len());
    out.push(version);
    out.extend_from_slice(&crc32fast::hash(body).to_le_bytes());
    out.extend_from_slice(body);
    out
}

/// The body of `bytes` laid out by [`with_header`] with `version`, or what is wrong.
pub(crate) fn checked_body(bytes: &[u8], version: u8) -> Result<&[u8], BytesError> {
    let (&found, rest) = bytes.split_first().ok_or(BytesError::Empty)?;
    if found != version {
        return Err(BytesError::Version {
            found,
            reads: version,
        });
    }
    let (crc, body) = rest
        .split_first_chunk::<4>()
        .ok_or(BytesError::NoChecksum)?;
    let (stored, computed) = (u32::from_le_bytes(*crc), crc32fast::hash(body));
    if stored != computed {
        return Err(BytesError::Checksum { stored, computed });
    }
    Ok(body)
}

/// Appends `v` as a varint.
fn push_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// A varint (`what`: which number, for the error) and what follows it.
pub(crate) fn take_varint<'a>(
    body: &'a [u8],
    what: &'static str,
) -> Result<(u64, &'a [u8]), BytesError> {
    let mut v = 0u64;
    for (i, &b) in body.iter().enumerate() {
        if i == 9 && b > 1 {
            return Err(BytesError::Overflow { what });
        }
        v |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return Ok((v, &body[i + 1..]));
        }
    }
    Err(BytesError::Truncated { what })
}

/// The bytes of a fenced position: version 2, CRC-32 of the body, then the body: the offset
/// and the generation as varints, then the session's bytes.
#[must_use]
pub fn encode_fenced(offset: u64, fence: &Fence) -> Vec<u8> {
    let mut body = Vec::with_capacity(20 + fence.session.len());
    push_varint(&mut body, offset);
    push_varint(&mut body, fence.generation);
    body.extend_from_slice(fence.session.as_bytes());
    with_header(FENCED_POSITION_VERSION, &body)
}

/// The offset and fence of fenced position bytes.
pub(crate) fn decode_fenced(bytes: &[u8]) -> Result<(u64, Fence), BytesError> {
    let body = checked_body(bytes, FENCED_POSITION_VERSION)?;
    let (offset, rest) = take_varint(body, "a number")?;
    let (generation, rest) = take_varint(rest, "a number")?;
    let session = std::str::from_utf8(rest)
        .map_err(|_| BytesError::SessionNotUtf8)?
        .to_owned();
    Ok((
        offset,
        Fence {
            session,
            generation,
        },
    ))
}
