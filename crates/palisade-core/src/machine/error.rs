//! Why a command was refused, and why a snapshot was.

use serde::{Deserialize, Serialize};

use super::claim::Shape;
use super::command::SessionId;
use crate::{FencingToken, InputError};

/// Why the state machine refused a command. A refused command changed nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
#[serde(tag = "error", rename_all = "snake_case")]
pub enum MachineError {
    /// A lock name or a TTL is outside the documented limits.
    #[error("invalid input: {input}")]
    Input {
        /// The specific problem.
        #[serde(with = "super::wire::InputErrorDef")]
        input: InputError,
    },
    /// The requested lock-delay exceeds [`MAX_LOCK_DELAY_MS`](super::MAX_LOCK_DELAY_MS).
    #[error("lock delay {lock_delay_ms} ms exceeds the limit of {limit} ms")]
    LockDelayTooLong {
        /// The rejected value.
        lock_delay_ms: u64,
        /// The limit.
        limit: u64,
    },
    /// The session label exceeds [`MAX_LABEL_LEN`](super::MAX_LABEL_LEN) bytes.
    #[error("session label is {len} bytes long; the limit is {limit}")]
    LabelTooLong {
        /// Length of the rejected label, in bytes.
        len: usize,
        /// The limit.
        limit: usize,
    },
    /// No such session: never created, closed, or expired.
    #[error("unknown session {session} (closed, expired or never created)")]
    UnknownSession {
        /// The session named by the command.
        session: SessionId,
    },
    /// Release of a lock that nobody holds or waits for.
    #[error("no such lock {name:?}")]
    NoSuchLock {
        /// The lock named by the command.
        name: String,
    },
    /// Release by a session that does not hold the lock.
    #[error("session does not hold lock {name:?}")]
    NotHolder {
        /// The lock named by the command.
        name: String,
    },
    /// Release by the holder, but with the token of an earlier (or never issued)
    /// grant: probably a delayed duplicate, and obeying it would free a newer grant.
    #[error("stale token {presented} for this lock; the current grant is {current}")]
    StaleToken {
        /// The token in the command.
        #[serde(with = "super::wire::token")]
        presented: FencingToken,
        /// The token of the grant the session holds now.
        #[serde(with = "super::wire::token")]
        current: FencingToken,
    },
    /// Cancel of a wait that is not queued.
    #[error("session is not waiting for lock {name:?}")]
    NotWaiting {
        /// The lock named by the command.
        name: String,
    },
    /// Cancel of a wait that has already turned into a grant: the caller holds the
    /// lock and must release it rather than walk away.
    #[error("the lock was already granted to this session with token {token}")]
    AlreadyGranted {
        /// The token of that grant.
        #[serde(with = "super::wire::token")]
        token: FencingToken,
    },
    /// End of a lock-delay for a lock that is not in one (a duplicate proposal).
    #[error("lock {name:?} is not in lock-delay")]
    NotInLockDelay {
        /// The lock named by the command.
        name: String,
    },
    /// [`MAX_SESSIONS`](super::MAX_SESSIONS) sessions are already open.
    #[error("too many sessions (limit {limit})")]
    TooManySessions {
        /// The limit.
        limit: usize,
    },
    /// The lock's queue is at [`MAX_WAITERS_PER_LOCK`](super::MAX_WAITERS_PER_LOCK).
    #[error("too many waiters for lock {name:?} (limit {limit})")]
    TooManyWaiters {
        /// The lock named by the command.
        name: String,
        /// The limit.
        limit: usize,
    },
    /// The session already holds or waits for
    /// [`MAX_LOCKS_PER_SESSION`](super::MAX_LOCKS_PER_SESSION) locks.
    #[error("session {session} holds or waits for too many locks (limit {limit})")]
    TooManyLocks {
        /// The session named by the command.
        session: SessionId,
        /// The limit.
        limit: usize,
    },
    /// The command may not share its log entry with the commands before it (a
    /// second session creation, or a session end that is not alone; see
    /// [`Command::conflict_key`]). Batches are built to avoid this; the refusal
    /// keeps a faulty batch from giving two sessions one id or mixing a session's
    /// end with other work. Retrying the command is safe.
    ///
    /// [`Command::conflict_key`]: super::Command::conflict_key
    #[error("command conflicts with an earlier command in the same log entry")]
    BatchConflict,
    /// A claim of one shape on a name that is another (a read lock on a mutex,
    /// a semaphore of 3 on one of 5, a value proclaimed on a plain lock).
    #[error("{name:?} is a {held_as}, not a {asked}")]
    ShapeMismatch {
        /// The name.
        name: String,
        /// What it is, as its first claim made it.
        held_as: Shape,
        /// What the command took it for.
        asked: Shape,
    },
    /// A session asks for a name in one mode while it holds or waits for it in
    /// the other (a reader asking to write): there is no upgrade in place.
    #[error(
        "this session already holds or waits for {name:?} as {mode:?}; release it (or cancel the wait) and claim again"
    )]
    HeldInOtherMode {
        /// The name.
        name: String,
        /// The mode the session holds or waits in.
        mode: super::claim::Mode,
    },
    /// A semaphore of no permits, or of more than
    /// [`MAX_PERMITS`](super::claim::MAX_PERMITS).
    #[error("a semaphore has 1 to {limit} permits, not {permits}")]
    BadPermits {
        /// The rejected count.
        permits: u32,
        /// The limit.
        limit: u32,
    },
    /// A lock-delay asked by a shared claim (a permit, a read lock).
    #[error(
        "only an exclusive claim (a plain lock, a writer, a leader) may ask for a lock-delay, not a shared one on a {shape}: a lock-delay keeps the whole name unavailable after its holder expired"
    )]
    LockDelayNeedsExclusive {
        /// The shape of the claim.
        shape: Shape,
    },
    /// An election value over [`MAX_VALUE_LEN`](super::claim::MAX_VALUE_LEN) bytes.
    #[error("election value is {len} bytes long; the limit is {limit}")]
    ValueTooLong {
        /// Length of the rejected value, in bytes.
        len: usize,
        /// The limit.
        limit: usize,
    },
}

impl From<InputError> for MachineError {
    fn from(input: InputError) -> Self {
        MachineError::Input { input }
    }
}

/// The state breaks one of the machine's invariants; the message says which.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("lock state invariant violated: {0}")]
pub struct InvariantViolation(pub String);

/// Why bytes could not be turned back into a [`LockMachine`](super::LockMachine).
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// Starts like a snapshot of format 2 or later but ends before its format.
    #[error("lock state snapshot truncated before its format number")]
    Truncated,
    /// A format this version does not know (written by a newer version?).
    #[error(
        "lock state snapshot of format {0}, which this version cannot read (written by a newer version?)"
    )]
    UnknownFormat(u32),
    /// Not a snapshot of the compact format it claims to be.
    #[error("cannot decode lock state snapshot: {0}")]
    Decode(#[from] postcard::Error),
    /// Not a snapshot of the JSON format of earlier versions (format 1).
    #[error("cannot decode lock state snapshot (JSON, format 1): {0}")]
    DecodeJson(#[from] serde_json::Error),
    /// Decodes, but describes a state `apply` could never have produced (corruption
    /// or a bug); loading it would let replicas diverge.
    #[error(transparent)]
    Inconsistent(#[from] InvariantViolation),
}
