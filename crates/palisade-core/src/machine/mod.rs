//! The deterministic lock state machine that every Palisade server replica applies
//! to the committed Raft log.
//!
//! # What is in here, and what is not
//!
//! [`LockMachine`] holds sessions (id, TTL, label, what each holds and waits for)
//! and locks (shape, holders with their fencing tokens, FIFO queue of waiters,
//! lock-delay). A lock is a mutex unless the claim that created it made it a
//! semaphore, a read/write lock or an election (see [`claim`]). It changes
//! only through [`LockMachine::apply`], one committed log entry at a time, and every
//! replica that applies the same entries in the same order ends in the same state,
//! byte for byte ([`LockMachine::to_snapshot_bytes`] uses ordered maps and queues
//! for that reason).
//!
//! Time is deliberately absent. `apply` reads no clock, does no I/O and draws no
//! random number: a replica that consulted its own clock could disagree with the
//! others about whether a lease had run out, and two replicas that disagree about
//! who holds a lock are exactly the failure this system exists to prevent. So the
//! leader measures session leases and lock-delays on its own monotonic clock and,
//! when one runs out, *proposes* the consequence as an ordinary entry
//! ([`Command::ExpireSession`], [`Command::EndLockDelay`]). Keep-alives are not
//! entries at all; they only reset the leader's countdown. A new leader restarts
//! every countdown at the full TTL or delay (read them from [`LockMachine::sessions`]
//! and [`LockMachine::list`]), so a lease is never cut short by a leader change;
//! liveness depends on clocks, safety does not.
//!
//! # Fencing token = log index
//!
//! The token of a grant is the index of the log entry that made it: an
//! [`Command::Acquire`] that found the lock free, or the release, session end or
//! end of lock-delay that handed the lock to the next waiter(s), or the
//! cancelled wait of a writer that let the readers queued behind it in. (For
//! a mutex, a semaphore and an election a cancelled wait never grants: whoever
//! is first in line never fits, so removing a waiter cannot make room.)
//! Raft indices are unique, strictly increasing and durable on a majority before
//! anyone learns of the grant, so tokens need no counter of their own that could be
//! lost or reset: a token is never issued twice after any crash of any number of
//! nodes. One entry can hand several *different* locks to waiters at once (a
//! session that held three locks ends), or one read/write lock to several
//! readers, or several permits of one semaphore (in different slots); those
//! grants share the entry's index, and every later grant of any lock has a
//! strictly larger token. No hold granted by an entry ends in that entry, so
//! holders that share a token hold at the same time.
//!
//! # Input
//!
//! `apply` is total: every malformed or unauthorised command (bad name, absurd TTL,
//! unknown session, wrong token, a limit exceeded) yields a typed [`MachineError`]
//! and changes nothing but [`LockMachine::last_applied`]. The only panic is a log
//! index that does not increase, which is a bug in the caller, not bad input.

mod apply;
pub mod claim;
mod command;
mod error;
mod snapshot;
mod state;
mod view;
mod wire;

#[cfg(test)]
mod tests;

pub use claim::{Claim, MAX_VALUE_LEN, Mode, RecipeBugs, Shape};
pub use command::{
    Applied, Command, CommandKind, ConflictKey, DelayedLock, Effect, Grant, Outcome, Reply,
    SessionId, SessionOwner,
};
pub use error::{InvariantViolation, MachineError, SnapshotError};
pub use state::{LockMachine, RELEASES_REMEMBERED};
pub use view::{HolderView, LockView, MachineCounts, SessionView, TokenCheck};

/// Most waiters one lock may queue. Bounds the memory a single hot lock can take
/// and the length of a snapshot; a queue this long is a design problem upstream.
pub const MAX_WAITERS_PER_LOCK: usize = 10_000;

/// Most locks one session may hold and wait for, counted together (each costs
/// state in every replica).
pub const MAX_LOCKS_PER_SESSION: usize = 1_000;

/// Most sessions alive at once. A client that leaks sessions hits this instead of
/// exhausting the replicas' memory.
pub const MAX_SESSIONS: usize = 100_000;

/// Longest lock-delay, in milliseconds. Chubby caps its lock-delay at one minute:
/// longer only keeps a lock unusable after a crash with no gain in safety.
pub const MAX_LOCK_DELAY_MS: u64 = 60_000;

/// Longest session label, in bytes. Labels are for humans reading `status`.
pub const MAX_LABEL_LEN: usize = 256;
