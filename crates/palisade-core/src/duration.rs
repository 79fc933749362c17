//! The duration syntax of the CLI: a decimal number and a unit, e.g. `10s`, `0.2s`,
//! `150ms`, `2m`. Fractions are allowed because the Redlock arithmetic is quoted
//! with them (TTL 10 s, drift 0.2 s).

use std::time::Duration;

/// Why a string is not a duration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid duration {input:?}: {why} (examples: 10s, 0.2s, 150ms, 2m, 1h)")]
pub struct ParseDurationError {
    input: String,
    why: &'static str,
}

/// Parses `<number><unit>` where unit is one of `us`, `ms`, `s`, `m`, `h`.
///
/// # Errors
/// When the number or the unit is missing or malformed, or the value overflows.
pub fn parse_duration(input: &str) -> Result<Duration, ParseDurationError> {
    let err = |why| ParseDurationError {
        input: input.to_owned(),
        why,
    };
    let s = input.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .ok_or_else(|| err("missing unit"))?;
    let (number, unit) = s.split_at(split);
    if number.is_empty() || number.starts_with('.') || number.ends_with('.') {
        return Err(err("missing or malformed number"));
    }
    let value: f64 = number.parse().map_err(|_| err("malformed number"))?;
    let nanos_per_unit: f64 = match unit {
        "us" | "µs" => 1e3,
        "ms" => 1e6,
        "s" => 1e9,
        "m" => 60e9,
        "h" => 3600e9,
        _ => return Err(err("unknown unit")),
    };
    let nanos = (value * nanos_per_unit).round();
    if !nanos.is_finite() || nanos > u64::MAX as f64 {
        return Err(err("too large"));
    }
    Ok(Duration::from_nanos(nanos as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units_and_fractions() {
        assert_eq!(parse_duration("10s").unwrap(), Duration::from_secs(10));
        assert_eq!(parse_duration("0.2s").unwrap(), Duration::from_millis(200));
        assert_eq!(parse_duration("150ms").unwrap(), Duration::from_millis(150));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("1h").unwrap(), Duration::from_secs(3600));
        assert_eq!(parse_duration("5us").unwrap(), Duration::from_micros(5));
    }

    #[test]
    fn rejects_garbage() {
        for bad in ["", "10", "s", "1.s", ".5s", "1x", "-1s", "1..2s", "1e9999h"] {
            assert!(parse_duration(bad).is_err(), "{bad:?} accepted");
        }
    }
}
