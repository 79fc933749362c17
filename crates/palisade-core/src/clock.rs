//! The monotonic clock every lease countdown reads.
//!
//! Lease code never calls `std::time::Instant::now()` directly: it reads this
//! clock, which is tokio's. Outside a simulation that is the same monotonic
//! clock; inside one (a runtime with tokio's paused clock, as `palisade sim`
//! runs every node and client) it is the simulation's virtual time, so that
//! countdowns, timers and the instants they are compared with agree.

use std::time::Instant;

/// Now, on the runtime's monotonic clock, as a `std::time::Instant`.
pub fn now() -> Instant {
    tokio::time::Instant::now().into_std()
}

/// A clock that runs at `rate` times the true rate from the moment it is made:
/// what a node whose oscillator is off by `rate − 1` reads. Production makes
/// them with rate 1 (the plain clock); the deterministic simulator skews a
/// node's lease countdowns with one, to check that the clients' safety margin
/// covers a leader whose clock runs fast.
#[derive(Debug, Clone, Copy)]
pub struct Skewed {
    origin: Instant,
    rate: f64,
}

impl Skewed {
    /// A clock at `rate` times the true rate (1: the plain clock).
    pub fn new(rate: f64) -> Self {
        Skewed {
            origin: now(),
            rate,
        }
    }

    /// Now, on this clock.
    pub fn now(&self) -> Instant {
        let true_now = now();
        if self.rate == 1.0 {
            return true_now;
        }
        self.origin + true_now.duration_since(self.origin).mul_f64(self.rate)
    }
}

impl Default for Skewed {
    fn default() -> Self {
        Skewed::new(1.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_skewed_clock_runs_at_its_rate() {
        let fast = Skewed::new(1.5);
        let plain = Skewed::default();
        let (f0, p0) = (fast.now(), plain.now());
        tokio::time::sleep(std::time::Duration::from_secs(2)).await;
        assert_eq!(fast.now() - f0, std::time::Duration::from_secs(3));
        assert_eq!(plain.now() - p0, std::time::Duration::from_secs(2));
    }
}
