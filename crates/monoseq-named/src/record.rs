//! The stored object of a sequence (format 1, JSON, as the reference design's `{ value, name,
//! createdAt, updatedAt, ...metadata }` with the metadata nested) and [`SequenceData`], what
//! `get_data` answers. Owns encoding and the strict decoding that turns anything else into "not a
//! valid sequence" instead of a number.

use serde::{Deserialize, Serialize};

/// Largest value a sequence stores, and so the bound on every number it hands out: `i64::MAX`,
/// so that every number fits a signed 64-bit column (PostgreSQL `bigint`, Java `long`).
pub const VALUE_MAX: u64 = i64::MAX as u64;
/// Largest metadata object, in bytes of compact JSON.
pub const METADATA_BYTES_MAX: usize = 8 * 1024;
/// The stored format written by this version.
pub(crate) const FORMAT: u32 = 1;

/// Why a stored object is not a valid sequence.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum DecodeError {
    /// Not the JSON of a sequence object: the parser's message.
    #[error("not a sequence object in format {FORMAT}: {0}")]
    NotSequence(String),
    /// Written in a format this version does not read.
    #[error("format {0} is not supported (this version reads format {FORMAT})")]
    Format(u32),
    /// It is another sequence's object.
    #[error("it names sequence {found:?}, not {expected:?}")]
    OtherName {
        /// The name stored.
        found: String,
        /// The name asked for.
        expected: String,
    },
    /// Its value is over [`VALUE_MAX`].
    #[error("value {0} is over the largest value {VALUE_MAX}")]
    ValueTooLarge(u64),
    /// Revision 0, which is never written.
    #[error("revision 0 is never written")]
    RevisionZero,
}

/// Free-form metadata kept with a sequence (a JSON object).
pub type Metadata = serde_json::Map<String, serde_json::Value>;

/// A sequence as stored, with what `get_data` reports.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct SequenceData {
    /// The sequence name (without its scope).
    pub name: String,
    /// The value stored: what the next `next` returns.
    pub value: u64,
    /// Creation time, milliseconds since the Unix epoch.
    pub created_at_ms: u64,
    /// Time of the last write, milliseconds since the Unix epoch.
    pub updated_at_ms: u64,
    /// Writes since creation (1 after the first). Every write changes it, so two versions of a
    /// sequence never have the same bytes.
    pub revision: u64,
    /// The metadata of the last write that carried some.
    pub metadata: Metadata,
}

/// The JSON object stored for a sequence.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Stored<'a> {
    format: u32,
    #[serde(borrow)]
    name: std::borrow::Cow<'a, str>,
    value: u64,
    revision: u64,
    created_at: u64,
    updated_at: u64,
    metadata: Metadata,
}

impl SequenceData {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let stored = Stored {
            format: FORMAT,
            name: std::borrow::Cow::Borrowed(&self.name),
            value: self.value,
            revision: self.revision,
            created_at: self.created_at_ms,
            updated_at: self.updated_at_ms,
            metadata: self.metadata.clone(),
        };
        serde_json::to_vec(&stored).expect("a map of JSON values always serializes")
    }

    /// Decodes a stored object, checking that it is a sequence named `name`.
    pub(crate) fn decode(bytes: &[u8], name: &str) -> Result<SequenceData, DecodeError> {
        let stored: Stored<'_> =
            serde_json::from_slice(bytes).map_err(|e| DecodeError::NotSequence(e.to_string()))?;
        if stored.format != FORMAT {
            return Err(DecodeError::Format(stored.format));
        }
        if stored.name != name {
            return Err(DecodeError::OtherName {
                found: stored.name.into_owned(),
                expected: name.to_owned(),
            });
        }
        if stored.value > VALUE_MAX {
            return Err(DecodeError::ValueTooLarge(stored.value));
        }
        if stored.revision == 0 {
            return Err(DecodeError::RevisionZero);
        }
        Ok(SequenceData {
            name: stored.name.into_owned(),
            value: stored.value,
            created_at_ms: stored.created_at,
            updated_at_ms: stored.updated_at,
            revision: stored.revision,
            metadata: stored.metadata,
        })
    }
}

/// Compact-JSON size of `metadata`.
pub(crate) fn metadata_len(metadata: &Metadata) -> usize {
    serde_json::to_vec(metadata).map_or(usize::MAX, |v| v.len())
}

/// Now, in milliseconds since the Unix epoch (0 if the clock is before it).
pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data() -> SequenceData {
        let mut metadata = Metadata::new();
        metadata.insert("format".into(), "INV-%04d".into());
        SequenceData {
            name: "invoice".into(),
            value: 1001,
            created_at_ms: 5,
            updated_at_ms: 7,
            revision: 2,
            metadata,
        }
    }

    #[test]
    fn encoded_data_decodes_to_itself() {
        let bytes = data().encode();
        assert_eq!(SequenceData::decode(&bytes, "invoice").unwrap(), data());
        let text = String::from_utf8(bytes).unwrap();
        assert!(text.contains("\"createdAt\":5"), "{text}");
    }

    #[test]
    fn objects_that_are_not_sequences_do_not_decode() {
        let good = String::from_utf8(data().encode()).unwrap();
        for bad in [
            String::new(),
            "garbage".to_owned(),
            "{}".to_owned(),
            "[1,2]".to_owned(),
            good.replace("1001", "-3"),
            good.replace("1001", "1.5"),
            good.replace("1001", "\"1001\""),
            good.replace("1001", &(VALUE_MAX + 1).to_string()),
            good.replace("\"format\":1", "\"format\":2"),
            good.replace("\"revision\":2", "\"revision\":0"),
            good.replace('}', ",\"extra\":1}"),
        ] {
            assert!(
                SequenceData::decode(bad.as_bytes(), "invoice").is_err(),
                "{bad:?} decoded"
            );
        }
        assert!(SequenceData::decode(good.as_bytes(), "other").is_err());
    }
}
