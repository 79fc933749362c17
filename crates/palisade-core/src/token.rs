//! The fencing token: a number that only goes up.

use std::fmt;
use std::str::FromStr;

/// A fencing token: strictly increasing across all grants of a correctness lock.
///
/// A resource that remembers the highest token it accepted and refuses any lower
/// one cannot be written by a holder that was superseded while it was paused
/// (the essay's "token 33 after 34"). Tokens compare as plain integers; a token is
/// never `0` (`0` means "no write has been accepted yet" on the resource side).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FencingToken(u64);

impl FencingToken {
    /// Wraps a raw token value, as received over the wire or from an environment
    /// variable. Returns `None` for `0`, which no backend ever issues.
    pub fn new(value: u64) -> Option<Self> {
        (value != 0).then_some(Self(value))
    }

    /// The raw value, e.g. to store it in a database column.
    pub fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Why a string is not a fencing token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "not a fencing token: {0:?} (expected a positive decimal integer: digits only, no sign, spaces or leading zeros)"
)]
pub struct ParseTokenError(String);

impl FromStr for FencingToken {
    type Err = ParseTokenError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || ParseTokenError(s.to_owned());
        // One spelling per token: `u64::from_str` would also take "+3" and
        // "03", and a resource that compares tokens as text, or a log read by
        // eye, must not meet two spellings of one token.
        if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) || s.starts_with('0') {
            return Err(err());
        }
        s.parse::<u64>().ok().and_then(Self::new).ok_or_else(err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_positive_decimals_only() {
        assert_eq!("34".parse::<FencingToken>().unwrap().get(), 34);
        assert_eq!("10".parse::<FencingToken>().unwrap().get(), 10);
        assert_eq!(
            "18446744073709551615"
                .parse::<FencingToken>()
                .unwrap()
                .get(),
            u64::MAX
        );
        for bad in [
            "",
            "0",
            "-1",
            "+3",
            "3.0",
            " 3",
            "3 ",
            "03",
            "00",
            "18446744073709551616",
            "abc",
        ] {
            assert!(bad.parse::<FencingToken>().is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn orders_numerically() {
        let t33 = FencingToken::new(33).unwrap();
        let t34 = FencingToken::new(34).unwrap();
        assert!(t33 < t34);
        assert_eq!(t34.to_string(), "34");
    }
}
