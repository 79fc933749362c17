//! Names of fenced resources, and object keys of the fenced object store.

use std::fmt;

/// Longest resource name, in bytes (the same bound as a lock name, so a lock and the
/// resource it protects can share a name).
pub const MAX_RESOURCE_LEN: usize = palisade_core::limits::MAX_NAME_LEN;

/// Longest object key of the fenced object store, in bytes.
pub const MAX_KEY_LEN: usize = 256;

/// A resource name that no fence will record.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResourceError {
    /// The name is empty.
    #[error("resource name is empty")]
    Empty,
    /// The name is longer than [`MAX_RESOURCE_LEN`] bytes.
    #[error("resource name is {len} bytes long; the limit is {MAX_RESOURCE_LEN}")]
    TooLong {
        /// Length of the rejected name, in bytes.
        len: usize,
    },
    /// The name contains a control character (newline, NUL, …).
    #[error("resource name contains a control character at byte {at}")]
    ControlChar {
        /// Byte offset of the first control character.
        at: usize,
    },
}

/// Checks a resource name: 1..=[`MAX_RESOURCE_LEN`] bytes, no control characters.
///
/// # Errors
/// The first rule the name breaks.
pub fn validate_resource(name: &str) -> Result<(), ResourceError> {
    if name.is_empty() {
        return Err(ResourceError::Empty);
    }
    if name.len() > MAX_RESOURCE_LEN {
        return Err(ResourceError::TooLong { len: name.len() });
    }
    if let Some((at, _)) = name.char_indices().find(|(_, c)| c.is_control()) {
        return Err(ResourceError::ControlChar { at });
    }
    Ok(())
}

/// An object key that the fenced object store refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// The key is empty.
    #[error("object key is empty")]
    Empty,
    /// The key is longer than [`MAX_KEY_LEN`] bytes.
    #[error("object key is {len} bytes long; the limit is {MAX_KEY_LEN}")]
    TooLong {
        /// Length of the rejected key, in bytes.
        len: usize,
    },
    /// The key contains a character outside `[A-Za-z0-9._/-]`.
    #[error("object key contains {ch:?} at byte {at}; allowed are A-Z a-z 0-9 . _ / -")]
    BadChar {
        /// The first disallowed character.
        ch: char,
        /// Its byte offset.
        at: usize,
    },
    /// A `/`-separated segment of the key is empty, `.` or `..`.
    #[error("object key has an empty, \".\" or \"..\" segment")]
    BadSegment,
}

/// A valid object key: 1..=[`MAX_KEY_LEN`] bytes of `[A-Za-z0-9._/-]`, whose
/// `/`-separated segments are neither empty nor `.` nor `..`.
///
/// The segment rule exists because HTTP clients normalise `.`/`..` segments and
/// repeated slashes away before sending, so such a key could not be addressed
/// reliably, and because a key that maps onto a file path must not escape its
/// directory.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectKey(String);

impl ObjectKey {
    /// Validates `key`.
    ///
    /// # Errors
    /// The first rule the key breaks.
    pub fn new(key: &str) -> Result<Self, KeyError> {
        if key.is_empty() {
            return Err(KeyError::Empty);
        }
        if key.len() > MAX_KEY_LEN {
            return Err(KeyError::TooLong { len: key.len() });
        }
        if let Some((at, ch)) = key
            .char_indices()
            .find(|&(_, c)| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '/' | '-')))
        {
            return Err(KeyError::BadChar { ch, at });
        }
        if key
            .split('/')
            .any(|s| s.is_empty() || s == "." || s == "..")
        {
            return Err(KeyError::BadSegment);
        }
        Ok(Self(key.to_owned()))
    }

    /// The key as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resource_names() {
        assert_eq!(validate_resource(""), Err(ResourceError::Empty));
        assert_eq!(
            validate_resource(&"x".repeat(257)),
            Err(ResourceError::TooLong { len: 257 })
        );
        assert!(validate_resource(&"x".repeat(256)).is_ok());
        assert_eq!(
            validate_resource("ab\ncd"),
            Err(ResourceError::ControlChar { at: 2 })
        );
        assert!(validate_resource("accounts/7 — ünïcode ok").is_ok());
    }

    #[test]
    fn object_keys() {
        for good in [
            "a",
            "a/b/c",
            "file.txt",
            "A-Z_0.9",
            "..a/b..",
            &"k".repeat(256),
        ] {
            assert!(ObjectKey::new(good).is_ok(), "{good:?} refused");
        }
        assert_eq!(ObjectKey::new(""), Err(KeyError::Empty));
        assert_eq!(
            ObjectKey::new(&"k".repeat(257)),
            Err(KeyError::TooLong { len: 257 })
        );
        assert_eq!(
            ObjectKey::new("a b"),
            Err(KeyError::BadChar { ch: ' ', at: 1 })
        );
        assert!(matches!(
            ObjectKey::new("é"),
            Err(KeyError::BadChar { ch: 'é', .. })
        ));
        for bad in ["..", "a/../b", "a/..", "./a", "a//b", "/a", "a/"] {
            assert_eq!(ObjectKey::new(bad), Err(KeyError::BadSegment), "{bad:?}");
        }
    }
}
