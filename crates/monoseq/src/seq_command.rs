//! The operations of `monoseq seq`: each one's arguments on the command line ([`Operation`]),
//! what it does against a [`Target`] (storage opened by this process, or a running server) and
//! what it prints. Owns [`CommandError`], whose code is the library's stable code or the
//! server's.

use std::time::Duration;

use clap::{Args, Subcommand};
use monoseq_client::{SequencesClient, SequencesError};
use monoseq_named::{
    Address, DeleteError, Metadata, NextError, NextOptions, ReadError, SequenceData, Sequences,
    SetError, SetOptions,
};
use monoseq_named_http::Coded;
use monoseq_wire::ErrorCode;

/// Options of the operations that take numbers.
#[derive(Debug, Clone, Args)]
pub struct TakeArgs {
    /// The sequence, [SCOPE/]NAME.
    #[arg(value_parser = parse_address)]
    pub address: monoseq_named::Address,
    /// The first number if the sequence does not exist yet.
    #[arg(long, value_parser = parse_value)]
    pub initial: Option<u64>,
    /// How many numbers to take (the sequence moves on by this much).
    #[arg(long, value_parser = parse_increment)]
    pub increment: Option<std::num::NonZeroU64>,
    /// Metadata to store with the sequence, a JSON object.
    #[arg(long, value_parser = parse_metadata)]
    pub metadata: Option<Metadata>,
}

/// An operation of `monoseq seq`.
#[derive(Debug, Clone, Subcommand)]
pub enum Operation {
    /// Print the current value and advance it (the first of --increment numbers).
    Next(TakeArgs),
    /// Advance the value and print the value after it.
    Increment(TakeArgs),
    /// Take a block of COUNT numbers at once and print its first and last number.
    Reserve {
        /// The sequence, [SCOPE/]NAME.
        #[arg(value_parser = parse_address)]
        address: monoseq_named::Address,
        /// How many numbers the block holds.
        #[arg(value_parser = parse_increment)]
        count: std::num::NonZeroU64,
        /// The first number if the sequence does not exist yet.
        #[arg(long, value_parser = parse_value)]
        initial: Option<u64>,
    },
    /// Print the stored value (the next `next` returns it).
    Get {
        /// The sequence, [SCOPE/]NAME.
        #[arg(value_parser = parse_address)]
        address: monoseq_named::Address,
    },
    /// Print value, name, times and metadata as JSON.
    Data {
        /// The sequence, [SCOPE/]NAME.
        #[arg(value_parser = parse_address)]
        address: monoseq_named::Address,
    },
    /// Print true or false.
    Exists {
        /// The sequence, [SCOPE/]NAME.
        #[arg(value_parser = parse_address)]
        address: monoseq_named::Address,
    },
    /// Set the stored value (numbers may be handed out again).
    #[command(alias = "set")]
    Reset {
        /// The sequence, [SCOPE/]NAME.
        #[arg(value_parser = parse_address)]
        address: monoseq_named::Address,
        /// The new stored value.
        #[arg(value_parser = parse_value, allow_hyphen_values = true)]
        value: u64,
        /// Metadata to store with the sequence, a JSON object.
        #[arg(long, value_parser = parse_metadata)]
        metadata: Option<Metadata>,
    },
    /// Delete the sequence.
    Delete {
        /// The sequence, [SCOPE/]NAME.
        #[arg(value_parser = parse_address)]
        address: monoseq_named::Address,
    },
}

/// Where a command runs.
pub enum Target {
    /// Directly on storage (a data directory or a bucket) from this process.
    Local(Sequences),
    /// Through a running server's HTTP API.
    Remote(SequencesClient),
}

/// A command failed. [`CommandError::code`] is the stable code.
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    /// `next` / `increment` failed.
    #[error(transparent)]
    Next(#[from] NextError),
    /// `reset` / `set` failed.
    #[error(transparent)]
    Set(#[from] SetError),
    /// A read failed.
    #[error(transparent)]
    Read(#[from] ReadError),
    /// `delete` failed.
    #[error(transparent)]
    Delete(#[from] DeleteError),
    /// The server answered an error or could not be reached.
    #[error(transparent)]
    Client(#[from] SequencesError),
    /// `get` or `data` of a sequence that does not exist.
    #[error("sequence {address} does not exist")]
    NotFound {
        /// The sequence.
        address: String,
    },
}

impl CommandError {
    /// The stable code (the client's own for a server that could not be talked to).
    pub fn code(&self) -> ErrorCode {
        match self {
            CommandError::Next(e) => e.error_code(),
            CommandError::Set(e) => e.error_code(),
            CommandError::Read(e) => e.error_code(),
            CommandError::Delete(e) => e.error_code(),
            CommandError::Client(e) => e.code(),
            CommandError::NotFound { .. } => ErrorCode::NotFound,
        }
    }
}

fn data_json(data: &SequenceData) -> String {
    serde_json::to_string_pretty(data).expect("data serializes")
}

/// The options of `next`, `increment` and `reserve`.
fn next_options(take: &TakeArgs, timeout: Duration) -> NextOptions {
    let mut options = NextOptions::new().timeout(timeout);
    if let Some(initial) = take.initial {
        options = options.initial(initial);
    }
    if let Some(increment) = take.increment {
        options = options.increment(increment);
    }
    if let Some(metadata) = &take.metadata {
        options = options.metadata(metadata.clone());
    }
    options
}

impl Target {
    async fn next(&self, address: &Address, options: &NextOptions) -> Result<u64, CommandError> {
        Ok(match self {
            Target::Local(s) => s.next(address, options).await?,
            Target::Remote(c) => c.next(address, options).await?,
        })
    }

    async fn increment(
        &self,
        address: &Address,
        options: &NextOptions,
    ) -> Result<u64, CommandError> {
        Ok(match self {
            Target::Local(s) => s.increment(address, options).await?,
            Target::Remote(c) => c.increment(address, options).await?,
        })
    }

    async fn get(&self, address: &Address) -> Result<Option<u64>, CommandError> {
        Ok(match self {
            Target::Local(s) => s.get(address).await?,
            Target::Remote(c) => c.get(address).await?,
        })
    }

    async fn data(&self, address: &Address) -> Result<Option<SequenceData>, CommandError> {
        Ok(match self {
            Target::Local(s) => s.get_data(address).await?,
            Target::Remote(c) => c.get_data(address).await?,
        })
    }

    async fn exists(&self, address: &Address) -> Result<bool, CommandError> {
        Ok(match self {
            Target::Local(s) => s.exists(address).await?,
            Target::Remote(c) => c.exists(address).await?,
        })
    }

    async fn reset(
        &self,
        address: &Address,
        value: u64,
        options: &SetOptions,
    ) -> Result<SequenceData, CommandError> {
        Ok(match self {
            Target::Local(s) => s.reset(address, value, options).await?,
            Target::Remote(c) => c.reset(address, value, options).await?,
        })
    }

    async fn delete(&self, address: &Address) -> Result<(), CommandError> {
        match self {
            Target::Local(s) => s.delete(address).await?,
            Target::Remote(c) => c.delete(address).await?,
        }
        Ok(())
    }
}

/// Runs `operation` and returns what to print (one line, or pretty JSON for `data` and
/// `reset`); `timeout` bounds the operation's retries.
///
/// # Errors
///
/// A [`CommandError`] with the operation's error; `get` and `data` of an absent sequence are
/// [`CommandError::NotFound`].
pub async fn run(
    operation: &Operation,
    target: &Target,
    timeout: Duration,
) -> Result<String, CommandError> {
    let not_found = |address: &Address| CommandError::NotFound {
        address: address.to_string(),
    };
    Ok(match operation {
        Operation::Next(take) => {
            let options = next_options(take, timeout);
            target.next(&take.address, &options).await?.to_string()
        }
        Operation::Increment(take) => {
            let options = next_options(take, timeout);
            target.increment(&take.address, &options).await?.to_string()
        }
        Operation::Reserve {
            address,
            count,
            initial,
        } => {
            let mut options = NextOptions::new().timeout(timeout).increment(*count);
            if let Some(initial) = initial {
                options = options.initial(*initial);
            }
            let first = target.next(address, &options).await?;
            format!("{first} {}", first + (count.get() - 1))
        }
        Operation::Get { address } => target
            .get(address)
            .await?
            .ok_or_else(|| not_found(address))?
            .to_string(),
        Operation::Data { address } => data_json(
            &target
                .data(address)
                .await?
                .ok_or_else(|| not_found(address))?,
        ),
        Operation::Exists { address } => target.exists(address).await?.to_string(),
        Operation::Reset {
            address,
            value,
            metadata,
        } => {
            let mut options = SetOptions::new().timeout(timeout);
            if let Some(metadata) = metadata {
                options = options.metadata(metadata.clone());
            }
            data_json(&target.reset(address, *value, &options).await?)
        }
        Operation::Delete { address } => {
            target.delete(address).await?;
            format!("deleted {address}")
        }
    })
}

/// Why an operand of `seq` is refused (clap prints it with the argument's name).
#[derive(Debug, thiserror::Error)]
enum OperandError {
    /// A value below 0.
    #[error("{0} is negative")]
    Negative(String),
    /// Not digits only.
    #[error("{0:?} is not a whole number")]
    NotWhole(String),
    /// A value over [`monoseq_named::VALUE_MAX`].
    #[error("{0} is over the largest value {max}", max = monoseq_named::VALUE_MAX)]
    OverMax(String),
    /// An increment of 0.
    #[error("0 would hand out the same number twice; use 1 or more")]
    ZeroIncrement,
    /// Metadata that is not a JSON object: the parser's error.
    #[error("metadata must be a JSON object: {0}")]
    Metadata(serde_json::Error),
}

fn parse_address(text: &str) -> Result<monoseq_named::Address, monoseq_named::AddressError> {
    text.parse()
}

/// A stored value: `0..=VALUE_MAX`, digits only.
fn parse_value(text: &str) -> Result<u64, OperandError> {
    if text.starts_with('-') {
        return Err(OperandError::Negative(text.to_owned()));
    }
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(OperandError::NotWhole(text.to_owned()));
    }
    match text.parse::<u64>() {
        Ok(value) if value <= monoseq_named::VALUE_MAX => Ok(value),
        _ => Err(OperandError::OverMax(text.to_owned())),
    }
}

fn parse_increment(text: &str) -> Result<std::num::NonZeroU64, OperandError> {
    std::num::NonZeroU64::new(parse_value(text)?).ok_or(OperandError::ZeroIncrement)
}

fn parse_metadata(text: &str) -> Result<Metadata, OperandError> {
    serde_json::from_str(text).map_err(OperandError::Metadata)
}
