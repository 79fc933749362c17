//! Palisade's shared vocabulary: the types every backend, the server and the client
//! agree on, with no I/O and no dependency on any backend.
//!
//! - [`FencingToken`]: the monotonic number a correctness lock hands out with every
//!   grant. Only correctness backends can produce one; efficiency guards (Redis,
//!   Redlock) have no way to obtain it, by construction.
//! - [`LeaseState`]: held / jeopardy / lost, the three states every guard reports.
//! - [`limits`]: the documented bounds on names and TTLs, and their validation.
//! - [`duration`]: the human duration syntax the CLI accepts (`10s`, `0.2s`, `150ms`).
//! - [`backend`]: how a correctness backend declares itself (name, URL schemes,
//!   review facts, how to connect), once, in its own crate.
//! - `conformance` (feature): the lock contract as a suite each backend runs.

pub mod backend;
#[cfg(feature = "runtime")]
pub mod clock;
#[cfg(feature = "conformance")]
pub mod conformance;
pub mod duration;
#[cfg(feature = "runtime")]
pub mod guarantee;
pub mod lease;
pub mod limits;
pub mod lock;
pub mod machine;
#[cfg(feature = "runtime")]
pub mod safety;
pub mod token;

pub use lease::LeaseState;
pub use limits::InputError;
pub use lock::{
    EfficiencyLease, FencedLease, FencedLocks, GuaranteedLease, LockError, LockOptions, Unreachable,
};
pub use token::FencingToken;
