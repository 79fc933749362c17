//! Exit statuses of `palisade`, shared by every subcommand and documented in the
//! README. Scripts depend on them; never renumber.

/// Something went wrong that is not one of the cases below (a message says what).
pub const FAILURE: i32 = 1;
/// The command line was malformed (clap's own status).
pub const USAGE: i32 = 2;
/// `check-token`: the cluster could not be asked (no node reachable, no leader),
/// as distinct from 1, "the token is stale".
pub const NOT_ASKED: i32 = 3;
/// `lock`: the lock was not obtained (no quorum, validity too short, wait expired).
pub const NOT_OBTAINED: i32 = 75;
/// `lock`: the lock was lost while CMD ran; CMD was stopped (SIGTERM, then SIGKILL).
pub const LOST: i32 = 76;
