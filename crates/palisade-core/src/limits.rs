//! The documented bounds on everything a caller can send, and their validation.
//!
//! Every backend checks input with these functions before it touches the network,
//! so bad input fails the same way everywhere and changes nothing.

use std::time::Duration;

/// Longest lock name, in bytes.
pub const MAX_NAME_LEN: usize = 256;
/// Shortest TTL a lease may have. Below this no network round trip fits.
pub const MIN_TTL: Duration = Duration::from_millis(10);
/// Longest TTL a lease may have: one day. A longer lease is almost surely a unit bug
/// (seconds passed as milliseconds), and would leave a dead holder's lock stuck.
pub const MAX_TTL: Duration = Duration::from_secs(24 * 60 * 60);

/// Input that no backend will act on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InputError {
    /// The lock name is empty.
    #[error("lock name is empty")]
    EmptyName,
    /// The lock name is longer than [`MAX_NAME_LEN`] bytes.
    #[error("lock name is {len} bytes long; the limit is {MAX_NAME_LEN}")]
    NameTooLong {
        /// Length of the rejected name, in bytes.
        len: usize,
    },
    /// The lock name contains a control character (newline, NUL, …).
    #[error("lock name contains a control character at byte {at}")]
    NameHasControlChar {
        /// Byte offset of the first control character.
        at: usize,
    },
    /// The TTL is outside [`MIN_TTL`]..=[`MAX_TTL`].
    #[error("ttl {ttl:?} is outside the allowed range {MIN_TTL:?}..={MAX_TTL:?}")]
    TtlOutOfRange {
        /// The rejected TTL.
        ttl: Duration,
    },
    /// Some other argument is unusable; the message says which and why.
    #[error("{0}")]
    Invalid(String),
}

/// Checks a lock name against the limits above.
///
/// # Errors
/// [`InputError::EmptyName`], [`InputError::NameTooLong`] or
/// [`InputError::NameHasControlChar`].
pub fn validate_name(name: &str) -> Result<(), InputError> {
    if name.is_empty() {
        return Err(InputError::EmptyName);
    }
    if name.len() > MAX_NAME_LEN {
        return Err(InputError::NameTooLong { len: name.len() });
    }
    if let Some((at, _)) = name.char_indices().find(|(_, c)| c.is_control()) {
        return Err(InputError::NameHasControlChar { at });
    }
    Ok(())
}

/// Checks a TTL against [`MIN_TTL`] and [`MAX_TTL`].
///
/// # Errors
/// [`InputError::TtlOutOfRange`].
pub fn validate_ttl(ttl: Duration) -> Result<(), InputError> {
    if (MIN_TTL..=MAX_TTL).contains(&ttl) {
        Ok(())
    } else {
        Err(InputError::TtlOutOfRange { ttl })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert_eq!(validate_name(""), Err(InputError::EmptyName));
        assert!(validate_name("jobs/nightly-report").is_ok());
        assert!(validate_name(&"x".repeat(MAX_NAME_LEN)).is_ok());
        assert_eq!(
            validate_name(&"x".repeat(MAX_NAME_LEN + 1)),
            Err(InputError::NameTooLong {
                len: MAX_NAME_LEN + 1
            })
        );
        assert_eq!(
            validate_name("a\nb"),
            Err(InputError::NameHasControlChar { at: 1 })
        );
    }

    #[test]
    fn ttls() {
        assert!(validate_ttl(Duration::ZERO).is_err());
        assert!(validate_ttl(MIN_TTL).is_ok());
        assert!(validate_ttl(MAX_TTL).is_ok());
        assert!(validate_ttl(MAX_TTL + Duration::from_millis(1)).is_err());
    }
}
