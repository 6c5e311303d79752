//! What `monoseq seq …` runs: [`Command::parse`] turns the words after `seq` into a
//! [`Command`], [`run`] executes it against local storage ([`Target::Local`]) or a running
//! server ([`Target::Remote`]) and returns the text to print. The binary owns the choice of
//! target (a data directory, a bucket or a server URL) and the exit codes.
//!
//! # Example
//!
//! ```
//! use monoseq_kv::MemoryStore;
//! use monoseq_named::cli::{Command, Target, run};
//! use monoseq_named::{KvBackend, Sequences};
//!
//! # tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(async {
//! let sequences = Sequences::new(KvBackend::new(MemoryStore::new()));
//! let command = Command::parse(["next", "orders/invoice", "--initial", "1000"])?;
//! assert_eq!(run(&command, Target::Local(&sequences)).await?, "1000");
//! let command = Command::parse(["get", "orders/invoice"])?;
//! assert_eq!(run(&command, Target::Local(&sequences)).await?, "1001");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # })?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::num::NonZeroU64;
use std::time::Duration;

use crate::address::Address;
use crate::client::{Client, ClientError};
use crate::error::{DeleteError, NextError, ReadError, SetError, code};
use crate::record::{Metadata, SequenceData, VALUE_MAX};
use crate::sequences::{NextOptions, Sequences, SetOptions};

/// Usage of `monoseq seq`, to print on a usage error.
pub const USAGE: &str = "\
usage: monoseq seq OPERATION ADDRESS [ARGS]

  next ADDRESS [--initial N] [--increment N] [--timeout-ms N] [--metadata JSON]
                         print the current value and advance it (the first of N numbers)
  increment ADDRESS [same options]
                         advance and print the value after it
  get ADDRESS            print the stored value (the next `next` returns it)
  data ADDRESS           print value, name, times and metadata as JSON
  exists ADDRESS         print true or false
  reset ADDRESS VALUE [--metadata JSON] [--timeout-ms N]
                         set the stored value (numbers may be handed out again)
  set ADDRESS VALUE [same options]
                         the same as reset
  delete ADDRESS         delete the sequence

ADDRESS is [SCOPE/]NAME: invoice, orders/invoice (resource orders), plugin=audit/events,
resource=orders/plugin=backup/run, prefix=my-app/counter.";

/// A parsed `monoseq seq` command.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Command {
    /// `next`: print the first number taken.
    Next {
        /// The sequence.
        address: Address,
        /// Initial value, increment, timeout, metadata.
        options: NextOptions,
    },
    /// `increment`: print the value after incrementing.
    Increment {
        /// The sequence.
        address: Address,
        /// Initial value, increment, timeout, metadata.
        options: NextOptions,
    },
    /// `get`: print the stored value.
    Get {
        /// The sequence.
        address: Address,
    },
    /// `data`: print the stored sequence as JSON.
    Data {
        /// The sequence.
        address: Address,
    },
    /// `exists`: print `true` or `false`.
    Exists {
        /// The sequence.
        address: Address,
    },
    /// `reset` / `set`: set the stored value, print the sequence as JSON.
    Reset {
        /// The sequence.
        address: Address,
        /// The new stored value.
        value: u64,
        /// Timeout and metadata.
        options: SetOptions,
    },
    /// `delete`.
    Delete {
        /// The sequence.
        address: Address,
    },
}

/// The words of a `monoseq seq` command are wrong; print the message and [`USAGE`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct UsageError {
    code: &'static str,
    message: String,
}

impl UsageError {
    fn new(code: &'static str, message: impl Into<String>) -> UsageError {
        UsageError {
            code,
            message: message.into(),
        }
    }

    /// The stable code (`bad_request`, `invalid_address`, `invalid_value`,
    /// `invalid_increment`, `invalid_metadata`).
    pub fn code(&self) -> &'static str {
        self.code
    }
}

/// Parses a number argument as a stored value: `0..=VALUE_MAX`, digits only.
fn number(text: &str, what: &str, error_code: &'static str) -> Result<u64, UsageError> {
    let bad = |problem: &str| UsageError::new(error_code, format!("{what} {text:?} {problem}"));
    if text.starts_with('-') {
        return Err(bad("is negative"));
    }
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad("is not a whole number"));
    }
    match text.parse::<u64>() {
        Ok(value) if value <= VALUE_MAX => Ok(value),
        _ => Err(bad(&format!("is over the largest value {VALUE_MAX}"))),
    }
}

impl Command {
    /// Parses the words after `monoseq seq`.
    ///
    /// # Errors
    ///
    /// A [`UsageError`] naming the first wrong word: unknown operation or option, a missing
    /// argument, a bad address, a negative, fractional or too large number, an increment of 0,
    /// metadata that is not a JSON object.
    pub fn parse<I, S>(words: I) -> Result<Command, UsageError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let words: Vec<String> = words.into_iter().map(|w| w.as_ref().to_owned()).collect();
        let mut words = words.iter().map(String::as_str);
        let operation = words
            .next()
            .ok_or_else(|| UsageError::new(code::BAD_REQUEST, "no operation given"))?;
        let address: Address = words
            .next()
            .ok_or_else(|| UsageError::new(code::BAD_REQUEST, "no address given"))?
            .parse()
            .map_err(|e: crate::AddressError| UsageError::new(e.code(), e.to_string()))?;
        let mut value = None;
        if matches!(operation, "reset" | "set") {
            let text = words
                .next()
                .ok_or_else(|| UsageError::new(code::INVALID_VALUE, "no value given"))?;
            value = Some(number(text, "value", code::INVALID_VALUE)?);
        }
        let mut next = NextOptions::new();
        let mut set = SetOptions::new();
        let mut takes_next_options = false;
        while let Some(flag) = words.next() {
            let argument = words.next().ok_or_else(|| {
                UsageError::new(code::BAD_REQUEST, format!("{flag} needs a value"))
            })?;
            match flag {
                "--initial" => {
                    next = next.initial(number(argument, "initial value", code::INVALID_VALUE)?);
                    takes_next_options = true;
                }
                "--increment" => {
                    let increment = number(argument, "increment", code::INVALID_INCREMENT)?;
                    let increment = NonZeroU64::new(increment).ok_or_else(|| {
                        UsageError::new(
                            code::INVALID_INCREMENT,
                            "increment 0 would hand out the same number twice; use 1 or more",
                        )
                    })?;
                    next = next.increment(increment);
                    takes_next_options = true;
                }
                "--timeout-ms" => {
                    let ms = number(argument, "timeout", code::BAD_REQUEST)?;
                    next = next.timeout(Duration::from_millis(ms));
                    set = set.timeout(Duration::from_millis(ms));
                }
                "--metadata" => {
                    let metadata: Metadata = serde_json::from_str(argument).map_err(|e| {
                        UsageError::new(
                            code::INVALID_METADATA,
                            format!("metadata must be a JSON object: {e}"),
                        )
                    })?;
                    next = next.metadata(metadata.clone());
                    set = set.metadata(metadata);
                }
                other => {
                    return Err(UsageError::new(
                        code::BAD_REQUEST,
                        format!("unknown option {other:?}"),
                    ));
                }
            }
        }
        let command = match operation {
            "next" => Command::Next {
                address,
                options: next,
            },
            "increment" => Command::Increment {
                address,
                options: next,
            },
            "reset" | "set" => Command::Reset {
                address,
                value: value.expect("parsed above"),
                options: set,
            },
            "get" | "data" | "exists" | "delete" => {
                if takes_next_options || next.metadata_value().is_some() {
                    return Err(UsageError::new(
                        code::BAD_REQUEST,
                        format!("{operation} takes no options"),
                    ));
                }
                match operation {
                    "get" => Command::Get { address },
                    "data" => Command::Data { address },
                    "exists" => Command::Exists { address },
                    _ => Command::Delete { address },
                }
            }
            other => {
                return Err(UsageError::new(
                    code::BAD_REQUEST,
                    format!("unknown operation {other:?}"),
                ));
            }
        };
        if matches!(command, Command::Reset { .. }) && takes_next_options {
            return Err(UsageError::new(
                code::BAD_REQUEST,
                "reset takes only --metadata and --timeout-ms",
            ));
        }
        Ok(command)
    }
}

/// Where a command runs.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub enum Target<'a> {
    /// Directly on storage (a data directory or a bucket) from this process.
    Local(&'a Sequences),
    /// Through a running server's HTTP API.
    Remote(&'a Client),
}

/// A command failed. [`CommandError::code`] is the stable code.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
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
    Client(#[from] ClientError),
    /// `get` or `data` of a sequence that does not exist.
    #[error("sequence {address} does not exist")]
    NotFound {
        /// The sequence.
        address: String,
    },
}

impl CommandError {
    /// The stable code (see [`crate::code`]; `transport` or `protocol` for a server that
    /// could not be talked to).
    pub fn code(&self) -> &str {
        match self {
            CommandError::Next(e) => e.code(),
            CommandError::Set(e) => e.code(),
            CommandError::Read(e) => e.code(),
            CommandError::Delete(e) => e.code(),
            CommandError::Client(e) => e.code(),
            CommandError::NotFound { .. } => code::NOT_FOUND,
        }
    }
}

fn data_json(data: &SequenceData) -> String {
    serde_json::to_string_pretty(data).expect("data serializes")
}

/// Runs `command` and returns what to print (one line, or pretty JSON for `data`, `reset`).
///
/// # Errors
///
/// A [`CommandError`] with the operation's error; `get` and `data` of an absent sequence are
/// [`CommandError::NotFound`].
pub async fn run(command: &Command, target: Target<'_>) -> Result<String, CommandError> {
    let not_found = |address: &Address| CommandError::NotFound {
        address: address.to_string(),
    };
    Ok(match (command, target) {
        (Command::Next { address, options }, Target::Local(s)) => {
            s.next(address, options).await?.to_string()
        }
        (Command::Next { address, options }, Target::Remote(c)) => {
            c.next(address, options).await?.to_string()
        }
        (Command::Increment { address, options }, Target::Local(s)) => {
            s.increment(address, options).await?.to_string()
        }
        (Command::Increment { address, options }, Target::Remote(c)) => {
            c.increment(address, options).await?.to_string()
        }
        (Command::Get { address }, Target::Local(s)) => s
            .get(address)
            .await?
            .ok_or_else(|| not_found(address))?
            .to_string(),
        (Command::Get { address }, Target::Remote(c)) => c
            .get(address)
            .await?
            .ok_or_else(|| not_found(address))?
            .to_string(),
        (Command::Data { address }, Target::Local(s)) => data_json(
            &s.get_data(address)
                .await?
                .ok_or_else(|| not_found(address))?,
        ),
        (Command::Data { address }, Target::Remote(c)) => data_json(
            &c.get_data(address)
                .await?
                .ok_or_else(|| not_found(address))?,
        ),
        (Command::Exists { address }, Target::Local(s)) => s.exists(address).await?.to_string(),
        (Command::Exists { address }, Target::Remote(c)) => c.exists(address).await?.to_string(),
        (
            Command::Reset {
                address,
                value,
                options,
            },
            Target::Local(s),
        ) => data_json(&s.reset(address, *value, options).await?),
        (
            Command::Reset {
                address,
                value,
                options,
            },
            Target::Remote(c),
        ) => data_json(&c.reset(address, *value, options).await?),
        (Command::Delete { address }, Target::Local(s)) => {
            s.delete(address).await?;
            format!("deleted {address}")
        }
        (Command::Delete { address }, Target::Remote(c)) => {
            c.delete(address).await?;
            format!("deleted {address}")
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_command_words_get_typed_codes() {
        let code = |words: &[&str]| Command::parse(words).unwrap_err().code();
        assert_eq!(
            code(&["reset", "orders/invoice", "-5"]),
            code::INVALID_VALUE
        );
        assert_eq!(
            code(&["reset", "orders/invoice", "1.5"]),
            code::INVALID_VALUE
        );
        assert_eq!(
            code(&["reset", "orders/invoice", "9223372036854775808"]),
            code::INVALID_VALUE
        );
        assert_eq!(
            code(&["next", "orders/invoice", "--increment", "0"]),
            code::INVALID_INCREMENT
        );
        assert_eq!(code(&["next", "../invoice"]), code::INVALID_ADDRESS);
        assert_eq!(code(&["next", ""]), code::INVALID_ADDRESS);
        assert_eq!(
            code(&["next", "x", "--metadata", "[1]"]),
            code::INVALID_METADATA
        );
        assert_eq!(code(&["jump", "x"]), code::BAD_REQUEST);
        assert_eq!(code(&["get", "x", "--increment", "2"]), code::BAD_REQUEST);
        assert_eq!(code(&["next"]), code::BAD_REQUEST);
    }

    #[test]
    fn command_words_parse_into_options() {
        let command = Command::parse([
            "next",
            "orders/invoice",
            "--initial",
            "7",
            "--increment",
            "3",
        ])
        .unwrap();
        let Command::Next { address, options } = command else {
            panic!("not next")
        };
        assert_eq!(address.key(), "resource=orders/sequence=invoice/value");
        assert_eq!(options.initial_value(), 7);
        assert_eq!(options.increment_value().get(), 3);
        let command = Command::parse(["set", "n", "9223372036854775807"]).unwrap();
        assert!(matches!(command, Command::Reset { value, .. } if value == VALUE_MAX));
    }
}
