//! The Palisade server: a lock service replicated with Raft (the `openraft` crate),
//! whose every grant carries a fencing token.
//!
//! # Design
//! - [`store::log`]: the Raft log and vote in Palisade's own write-ahead log; an
//!   append is acknowledged only after its fsync, and one fsync serves every
//!   entry that queued behind it. [`store::snapshot`]: the state's snapshot file.
//! - [`store::sm`]: applies entries to `palisade_core::machine::LockMachine` (pure,
//!   deterministic) and pushes grants to local waiters.
//! - [`leases`]: session countdowns on the leader's monotonic clock; expiry is a
//!   log entry; a new leader restarts every countdown at full TTL.
//! - [`proposer`]: group commit — concurrent commands on different locks share
//!   one log entry (and one fsync).
//! - [`service`]: the gRPC API ([`wire_errors`]: undecodable requests are
//!   `invalid_input`); [`json_api`]: the same calls as HTTP/JSON, on the same
//!   listener and through the same service; [`network`]: Raft traffic between
//!   nodes.
//! - [`security`]: TLS, separate client and peer listeners, authentication,
//!   roles by lock-name prefix, session ownership, connection limits.
//! - [`metrics`]: Prometheus counters, histograms and scrape-time gauges;
//!   [`http`]: the operators' HTTP listener that serves them.
//! - [`io`]: the disk and blocking work, the operating system's or a
//!   simulator's.
//! - [`node`]: wiring it together.
//!
//! The fencing token of a grant is the Raft log index of the entry that made it.
//! Log indices only grow and a committed entry is never removed, so a token is
//! never issued twice — across crashes and restarts of any or all nodes.

pub mod commit_clock;
pub mod http;
pub mod io;
pub mod json_api;
pub mod leader_check;
pub mod leases;
pub mod metrics;
pub mod network;
pub mod node;
pub mod proposer;
pub mod runtime;
pub mod security;
pub mod service;
pub mod status;
pub mod store;
pub mod typ;
pub mod wire_errors;

pub use node::{ServerConfig, ServerError, run, run_on, run_until};
