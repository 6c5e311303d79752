//! Authentication of the HTTP API: the bearer tokens the server accepts (`admin` for every
//! request and alone for administration, `/v1/admin/*`; `write` for every other request;
//! `read` for `GET` and `HEAD`), whether a server without tokens lets its loopback
//! administer it (`--admin-on-loopback`), the middleware that checks every request before its
//! body is read, the token this node presents to its peers, and the `serve` flags and
//! `[security]` settings of tokens and TLS. Owns the tokens: they are kept only as SHA-256
//! digests, compared in constant time, and never logged, printed or put in an error.
//!
//! `settings.rs` reads and checks the settings; `check.rs` is the per-request check.

mod check;
mod settings;
#[cfg(test)]
mod tests;

#[cfg(test)]
pub(crate) use check::ADMIN_PATH_PREFIX;
pub use check::{Auth, require_token};
#[cfg(test)]
pub(crate) use settings::{EnvSecrets, Kind};
pub use settings::{Security, SecurityArgs, SecurityFile, TokenArg};
