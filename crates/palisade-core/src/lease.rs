//! The three states of a lease, as every guard reports them.

use std::time::Duration;

/// What a guard can still promise about its lock.
///
/// Computed on the holder's monotonic clock; never on a wall clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LeaseState {
    /// The lease is guaranteed for a comfortable while yet.
    Held,
    /// A renewal is overdue: the lease is still guaranteed, but for less than the
    /// jeopardy threshold. Work that cannot finish in [`remaining`] should stop.
    ///
    /// [`remaining`]: LeaseState::classify
    Jeopardy,
    /// The guarantee has run out. Another holder may already have the lock.
    Lost,
}

impl LeaseState {
    /// Classifies a remaining guaranteed validity: `Lost` at zero, `Jeopardy` at or
    /// below `jeopardy_below`, `Held` above it.
    pub fn classify(remaining: Duration, jeopardy_below: Duration) -> Self {
        if remaining.is_zero() {
            LeaseState::Lost
        } else if remaining <= jeopardy_below {
            LeaseState::Jeopardy
        } else {
            LeaseState::Held
        }
    }

    /// A short lowercase name, as printed by the CLI and in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            LeaseState::Held => "held",
            LeaseState::Jeopardy => "jeopardy",
            LeaseState::Lost => "lost",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_by_threshold() {
        let t = Duration::from_secs(1);
        assert_eq!(LeaseState::classify(Duration::ZERO, t), LeaseState::Lost);
        assert_eq!(LeaseState::classify(t, t), LeaseState::Jeopardy);
        assert_eq!(
            LeaseState::classify(t + Duration::from_nanos(1), t),
            LeaseState::Held
        );
    }
}
