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
