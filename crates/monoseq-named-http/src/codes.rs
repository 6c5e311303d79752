//! The stable code of each error of the named-sequence operations: the one place that gives a
//! domain error its wire code, for the HTTP API and for `monoseq seq`.

use monoseq_named::{AddressError, DeleteError, NextError, ReadError, SetError};
use monoseq_wire::ErrorCode;

/// An error of the named-sequence operations, with its stable code.
pub trait Coded {
    /// The code an answer or a message carries beside the error's text.
    fn error_code(&self) -> ErrorCode;
}

impl Coded for AddressError {
    fn error_code(&self) -> ErrorCode {
        ErrorCode::InvalidAddress
    }
}

impl Coded for NextError {
    fn error_code(&self) -> ErrorCode {
        match self {
            NextError::InvalidValue { .. } => ErrorCode::InvalidValue,
            NextError::MetadataTooLarge { .. } => ErrorCode::InvalidMetadata,
            NextError::Overflow { .. } => ErrorCode::Overflow,
            NextError::InvalidStored { .. } => ErrorCode::InvalidStored,
            NextError::Busy { .. } | NextError::LaneFull { .. } => ErrorCode::Busy,
            NextError::Storage(_) => ErrorCode::StorageUnavailable,
        }
    }
}

impl Coded for SetError {
    fn error_code(&self) -> ErrorCode {
        match self {
            SetError::InvalidValue { .. } => ErrorCode::InvalidValue,
            SetError::MetadataTooLarge { .. } => ErrorCode::InvalidMetadata,
            SetError::InvalidStored { .. } => ErrorCode::InvalidStored,
            SetError::Busy { .. } => ErrorCode::Busy,
            SetError::Storage(_) => ErrorCode::StorageUnavailable,
        }
    }
}

impl Coded for ReadError {
    fn error_code(&self) -> ErrorCode {
        match self {
            ReadError::InvalidStored { .. } => ErrorCode::InvalidStored,
            ReadError::Storage(_) => ErrorCode::StorageUnavailable,
        }
    }
}

impl Coded for DeleteError {
    fn error_code(&self) -> ErrorCode {
        match self {
            DeleteError::Storage(_) => ErrorCode::StorageUnavailable,
        }
    }
}
