//! Efficiency locks on Redis: a single instance and Redlock over N independent
//! masters, implemented exactly as the algorithm specifies, plus the deployment
//! audit and the validity budget.
//!
//! # What these locks promise, and what they do not
//!
//! These are **efficiency** locks: they make it unlikely that two processes do the
//! same work at once. They are not **correctness** locks:
//!
//! - A holder that pauses (GC, page fault, `SIGSTOP`) or whose packets are delayed
//!   past its validity keeps acting while someone else holds the lock. Nothing here
//!   can stop it, and the guard has **no fencing token** to let a resource notice:
//!   the random value only makes release and extension safe, it cannot order grants.
//! - Redis expires keys by its wall clock. A clock jump on a node, or a node restarted
//!   without fsync-on-every-write persistence, can make it forget a lock early, so
//!   **safety depends on clocks and on restarts being delayed** (see [`audit`]).
//! - A single instance loses its locks on failover to an asynchronous replica.
//!
//! Use these where a rare double run costs little. Where it would corrupt data, use
//! a correctness backend (the Palisade server) and a fenced resource.
//!
//! # Layout
//! - [`Redlock`]: the lock manager over one node (single instance) or N nodes.
//! - [`RedisGuard`]: what a successful acquisition returns.
//! - [`budget`]: the validity arithmetic (`ttl − elapsed − drift`).
//! - [`audit`]: checks that a set of nodes meets Redlock's independence assumption.
//! - `node` (private): one connection per node and the three commands the
//!   algorithm needs; `tally` (private): deciding as soon as the answers settle it.

pub mod audit;
mod batch;
pub mod budget;
mod error;
mod guard;
mod node;
mod redlock;
mod tally;

pub use batch::BatchStats;
pub use error::{NodeCounts, RedisLockError};
pub use guard::RedisGuard;
pub use redlock::{AcquireOptions, Redlock, RedlockConfig};
