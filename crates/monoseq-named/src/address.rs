//! Addresses of named sequences: [`Scope`] and [`Address`], their validation, their textual
//! form (what the CLI and the HTTP paths take) and the storage key layout of the reference design
//! (`resource=orders/sequence=counter/value`). Nothing path-like gets through: every segment
//! is checked against one small alphabet before a key is built.

use std::fmt;

use crate::error::AddressError;

/// Longest sequence name, in bytes.
pub const NAME_BYTES_MAX: usize = 128;
/// Longest resource name or plugin slug, in bytes.
pub const SCOPE_SEGMENT_BYTES_MAX: usize = 128;
/// Longest custom prefix, in bytes (its trailing `/` included).
pub const PREFIX_BYTES_MAX: usize = 256;

/// Where a sequence lives: the scopes of the reference design's `createSequence`, each with its key
/// layout.
///
/// | scope | key of sequence `counter` |
/// |-------|---------------------------|
/// | [`Scope::Global`] | `sequences/counter/value` (the reference design's default key generator) |
/// | [`Scope::Resource`] | `resource=orders/sequence=counter/value` |
/// | [`Scope::Plugin`] | `plugin=audit/sequence=counter/value` |
/// | [`Scope::ResourcePlugin`] | `resource=orders/plugin=backup/sequence=counter/value` |
/// | [`Scope::Prefix`] | `my-app/sequence=counter/value` |
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Scope {
    /// No scope: the reference design's default layout `sequences/{name}/value`.
    Global,
    /// Scoped to a resource (the reference design's recommended scope, docs/invariants.md).
    Resource(String),
    /// Scoped to a plugin.
    Plugin(String),
    /// Scoped to a plugin's use of a resource.
    ResourcePlugin {
        /// The resource name.
        resource: String,
        /// The plugin slug.
        plugin: String,
    },
    /// A custom key prefix: one or more segments, always ending with `/`.
    Prefix(String),
}

impl Scope {
    /// A resource scope.
    ///
    /// # Errors
    ///
    /// [`AddressError`] when `resource` is empty, too long or not made of `A-Z a-z 0-9 _ - . :`
    /// (or starts with `.`).
    pub fn resource(resource: impl Into<String>) -> Result<Scope, AddressError> {
        let resource = resource.into();
        check_segment("resource", &resource, SCOPE_SEGMENT_BYTES_MAX)?;
        Ok(Scope::Resource(resource))
    }

    /// A plugin scope.
    ///
    /// # Errors
    ///
    /// As [`Scope::resource`].
    pub fn plugin(plugin: impl Into<String>) -> Result<Scope, AddressError> {
        let plugin = plugin.into();
        check_segment("plugin", &plugin, SCOPE_SEGMENT_BYTES_MAX)?;
        Ok(Scope::Plugin(plugin))
    }

    /// A resource + plugin scope.
    ///
    /// # Errors
    ///
    /// As [`Scope::resource`], for either part.
    pub fn resource_plugin(
        resource: impl Into<String>,
        plugin: impl Into<String>,
    ) -> Result<Scope, AddressError> {
        let (resource, plugin) = (resource.into(), plugin.into());
        check_segment("resource", &resource, SCOPE_SEGMENT_BYTES_MAX)?;
        check_segment("plugin", &plugin, SCOPE_SEGMENT_BYTES_MAX)?;
        Ok(Scope::ResourcePlugin { resource, plugin })
    }

    /// A custom prefix such as `my-app/` or `tenants/7/` (a missing trailing `/` is added).
    ///
    /// # Errors
    ///
    /// [`AddressError`] when the prefix is empty, longer than [`PREFIX_BYTES_MAX`], or has a
    /// segment that is empty, `.`, `..` or outside the name alphabet.
    pub fn prefix(prefix: impl Into<String>) -> Result<Scope, AddressError> {
        let mut prefix = prefix.into();
        if !prefix.ends_with('/') {
            prefix.push('/');
        }
        if prefix.len() > PREFIX_BYTES_MAX {
            return Err(AddressError::TooLong {
                what: "prefix",
                len: prefix.len(),
                max: PREFIX_BYTES_MAX,
            });
        }
        for segment in prefix[..prefix.len() - 1].split('/') {
            check_segment("prefix segment", segment, PREFIX_BYTES_MAX)?;
        }
        Ok(Scope::Prefix(prefix))
    }

    fn write_key(&self, name: &str, key: &mut String) {
        match self {
            Scope::Global => {
                key.push_str("sequences/");
                key.push_str(name);
                key.push_str("/value");
                return;
            }
            Scope::Resource(resource) => {
                key.push_str("resource=");
                key.push_str(resource);
                key.push('/');
            }
            Scope::Plugin(plugin) => {
                key.push_str("plugin=");
                key.push_str(plugin);
                key.push('/');
            }
            Scope::ResourcePlugin { resource, plugin } => {
                key.push_str("resource=");
                key.push_str(resource);
                key.push_str("/plugin=");
                key.push_str(plugin);
                key.push('/');
            }
            Scope::Prefix(prefix) => key.push_str(prefix),
        }
        key.push_str("sequence=");
        key.push_str(name);
        key.push_str("/value");
    }
}

/// A sequence's full address: a scope and a name. Its storage key is computed once.
///
/// The textual form (CLI arguments, HTTP paths) is `[scope/]name`, the name always last:
///
/// | text | scope |
/// |------|-------|
/// | `invoice` | [`Scope::Global`] |
/// | `orders/invoice` or `resource=orders/invoice` | [`Scope::Resource`] |
/// | `plugin=audit/events` | [`Scope::Plugin`] |
/// | `resource=orders/plugin=backup/run` (or `orders/plugin=backup/run`) |
/// [`Scope::ResourcePlugin`] | | `prefix=my-app/counter`, `prefix=tenants/7/counter` |
/// [`Scope::Prefix`] (`my-app/`, `tenants/7/`) |
///
/// # Example
///
/// ```
/// use monoseq_named::Address;
///
/// let address: Address = "orders/invoice".parse()?;
/// assert_eq!(address.key(), "resource=orders/sequence=invoice/value");
/// assert_eq!(address.to_string(), "resource=orders/invoice");
/// assert!("orders/../invoice".parse::<Address>().is_err());
/// # Ok::<(), monoseq_named::AddressError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Address {
    scope: Scope,
    name: String,
    key: String,
}

impl Address {
    /// The address of sequence `name` in `scope`.
    ///
    /// # Errors
    ///
    /// [`AddressError`] when `name` is empty, longer than [`NAME_BYTES_MAX`], starts with `.`
    /// or has a byte outside `A-Z a-z 0-9 _ - . :` (so no `/`, no `=`, no `..`).
    pub fn new(scope: Scope, name: impl Into<String>) -> Result<Address, AddressError> {
        let name = name.into();
        check_segment("name", &name, NAME_BYTES_MAX)?;
        let mut key = String::with_capacity(name.len() + 64);
        scope.write_key(&name, &mut key);
        Ok(Address { scope, name, key })
    }

    /// The scope.
    pub fn scope(&self) -> &Scope {
        &self.scope
    }

    /// The sequence name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The storage key (the S3 object key; the key-value backend stores it under its own tag).
    pub fn key(&self) -> &str {
        &self.key
    }
}

impl std::str::FromStr for Address {
    type Err = AddressError;

    fn from_str(text: &str) -> Result<Address, AddressError> {
        if text.is_empty() {
            return Err(AddressError::Empty { what: "address" });
        }
        let segments: Vec<&str> = text.split('/').collect();
        let (name, scope_segments) = segments.split_last().expect("split yields one item");
        let scope = parse_scope(scope_segments)?;
        Address::new(scope, *name)
    }
}

fn parse_scope(segments: &[&str]) -> Result<Scope, AddressError> {
    let malformed = || AddressError::Malformed {
        text: segments.join("/"),
    };
    match segments {
        [] => Ok(Scope::Global),
        [first, rest @ ..] if first.starts_with("prefix=") => {
            let mut prefix = first["prefix=".len()..].to_owned();
            if prefix.is_empty() || rest.iter().any(|s| s.is_empty()) {
                return Err(AddressError::Empty {
                    what: "prefix segment",
                });
            }
            for segment in rest {
                prefix.push('/');
                prefix.push_str(segment);
            }
            Scope::prefix(prefix)
        }
        [one] => match one.split_once('=') {
            None => Scope::resource(*one),
            Some(("resource", resource)) => Scope::resource(resource),
            Some(("plugin", plugin)) => Scope::plugin(plugin),
            Some(_) => Err(malformed()),
        },
        [resource, plugin] => {
            let resource = match resource.split_once('=') {
                None => *resource,
                Some(("resource", resource)) => resource,
                Some(_) => return Err(malformed()),
            };
            match plugin.split_once('=') {
                Some(("plugin", plugin)) => Scope::resource_plugin(resource, plugin),
                _ => Err(malformed()),
            }
        }
        _ => Err(malformed()),
    }
}

impl fmt::Display for Address {
    /// The canonical textual form (parses back to the same address).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.scope {
            Scope::Global => {}
            Scope::Resource(resource) => write!(f, "resource={resource}/")?,
            Scope::Plugin(plugin) => write!(f, "plugin={plugin}/")?,
            Scope::ResourcePlugin { resource, plugin } => {
                write!(f, "resource={resource}/plugin={plugin}/")?
            }
            Scope::Prefix(prefix) => write!(f, "prefix={prefix}")?,
        }
        f.write_str(&self.name)
    }
}

fn check_segment(what: &'static str, text: &str, max: usize) -> Result<(), AddressError> {
    if text.is_empty() {
        return Err(AddressError::Empty { what });
    }
    if text.len() > max {
        return Err(AddressError::TooLong {
            what,
            len: text.len(),
            max,
        });
    }
    if text.starts_with('.') {
        return Err(AddressError::PathLike {
            what,
            text: text.to_owned(),
        });
    }
    if let Some(c) = text
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ':')))
    {
        return Err(if c == '/' || c == '\\' {
            AddressError::PathLike {
                what,
                text: text.to_owned(),
            }
        } else {
            AddressError::InvalidChar {
                what,
                text: text.to_owned(),
                found: c,
            }
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_scope_has_the_seed_key_layout() {
        let key = |text: &str| text.parse::<Address>().unwrap().key().to_owned();
        assert_eq!(key("counter"), "sequences/counter/value");
        assert_eq!(
            key("orders/counter"),
            "resource=orders/sequence=counter/value"
        );
        assert_eq!(
            key("resource=orders/counter"),
            "resource=orders/sequence=counter/value"
        );
        assert_eq!(
            key("plugin=audit/counter"),
            "plugin=audit/sequence=counter/value"
        );
        assert_eq!(
            key("resource=orders/plugin=backup/counter"),
            "resource=orders/plugin=backup/sequence=counter/value"
        );
        assert_eq!(
            key("orders/plugin=backup/counter"),
            "resource=orders/plugin=backup/sequence=counter/value"
        );
        assert_eq!(
            key("prefix=my-app/counter"),
            "my-app/sequence=counter/value"
        );
        assert_eq!(key("prefix=a/b/counter"), "a/b/sequence=counter/value");
    }

    #[test]
    fn display_parses_back_to_the_same_address() {
        for text in [
            "counter",
            "orders/views:home",
            "plugin=audit/x",
            "resource=o/plugin=p/n",
            "prefix=a/b/n",
        ] {
            let address: Address = text.parse().unwrap();
            let again: Address = address.to_string().parse().unwrap();
            assert_eq!(address, again);
        }
    }

    #[test]
    fn path_like_empty_and_oversized_names_are_rejected() {
        for bad in [
            "",
            "..",
            ".",
            "a/..",
            "../a",
            "a//b",
            "a/",
            "/a",
            "a/b/c",
            "x=y/n",
            "a\\b",
            "a b",
            "prefix=../n",
            "prefix=/n",
            "prefix=a//n",
            "plugin=/n",
            "resource=a/resource=b/n",
        ] {
            assert!(bad.parse::<Address>().is_err(), "{bad:?} was accepted");
        }
        let long = "n".repeat(NAME_BYTES_MAX + 1);
        assert!(matches!(
            long.parse::<Address>(),
            Err(AddressError::TooLong { .. })
        ));
        assert!("n".repeat(NAME_BYTES_MAX).parse::<Address>().is_ok());
        assert!(matches!(
            Address::new(Scope::Global, ".."),
            Err(AddressError::PathLike { .. })
        ));
        assert!(matches!(
            Address::new(Scope::Global, "a/b"),
            Err(AddressError::PathLike { .. })
        ));
        assert!(Scope::prefix("a/../b").is_err());
    }
}
