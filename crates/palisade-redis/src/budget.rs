//! The validity arithmetic of Redlock (`validity = ttl − elapsed − drift`) and the
//! work-time rule.
//!
//! A lease of `ttl` that took `elapsed` to obtain, minus an allowance `drift` for the
//! nodes' clocks running at different rates, leaves `validity`. If the work needs
//! longer than that it must not start: with TTL 10 s, acquisition 4 s and drift
//! 0.2 s only ~5.8 s are usable, so 8 s of work must not begin.

use std::time::Duration;

/// The default clock-drift allowance: 1 % of the TTL plus 2 ms, as the Redlock
/// description suggests.
pub fn default_drift(ttl: Duration) -> Duration {
    ttl / 100 + Duration::from_millis(2)
}

/// What is left of a lease after `elapsed` and the `drift` allowance, or `None`
/// when nothing is.
pub fn validity(ttl: Duration, elapsed: Duration, drift: Duration) -> Option<Duration> {
    ttl.checked_sub(elapsed)?
        .checked_sub(drift)
        .filter(|v| !v.is_zero())
}

/// A budget for one lease, as `palisade redis budget` prints it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// The lease length.
    pub ttl: Duration,
    /// How long the acquisition took (or is expected to take).
    pub acquire: Duration,
    /// The clock-drift allowance.
    pub drift: Duration,
    /// The time the work needs, if stated.
    pub work: Option<Duration>,
}

impl Budget {
    /// The usable window in milliseconds; negative when the acquisition and drift
    /// already ate the whole lease (reported as is rather than clamped, so the
    /// shortfall is visible).
    pub fn usable_ms(&self) -> i128 {
        self.ttl.as_millis() as i128
            - self.acquire.as_millis() as i128
            - self.drift.as_millis() as i128
    }

    /// Whether work may start: some validity is left, and at least the stated work.
    pub fn may_start(&self) -> bool {
        match validity(self.ttl, self.acquire, self.drift) {
            None => false,
            Some(v) => self.work.is_none_or(|w| v >= w),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    #[test]
    fn the_explainers_example() {
        let b = Budget {
            ttl: ms(10_000),
            acquire: ms(4_000),
            drift: ms(200),
            work: Some(ms(8_000)),
        };
        assert_eq!(b.usable_ms(), 5_800);
        assert!(!b.may_start());
        assert!(
            Budget {
                work: Some(ms(5_000)),
                ..b
            }
            .may_start()
        );
    }

    #[test]
    fn default_drift_is_one_percent_plus_two_ms() {
        assert_eq!(default_drift(ms(10_000)), ms(102));
    }

    #[test]
    fn validity_never_negative() {
        assert_eq!(validity(ms(100), ms(99), ms(1)), None);
        assert_eq!(validity(ms(100), ms(200), ms(1)), None);
        assert_eq!(validity(ms(100), ms(50), ms(2)), Some(ms(48)));
    }
}
