//! What goes into the log ([`Command`]) and what comes out of applying it
//! ([`Applied`]).

use std::fmt;

use serde::{Deserialize, Serialize};

use super::claim::Claim;
use super::error::MachineError;
use crate::FencingToken;

/// A session's id: the log index of the [`Command::CreateSession`] entry that
/// created it, hence unique for the life of the cluster and never reused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SessionId(pub u64);

impl fmt::Display for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// The owner of a session: only a caller with this identity that presents the
/// key whose SHA-256 is `key_sha256` may act on the session. Checked by the
/// service before it proposes a command; the machine only stores it (it is
/// immutable, and session ids are never reused, so a check against any applied
/// state that has the session is sound).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionOwner {
    /// The caller's identity (empty when the cluster runs without authentication).
    pub identity: String,
    /// Lower-case hex SHA-256 of the session key (empty only for sessions created
    /// before keys existed; such a session accepts no key).
    pub key_sha256: String,
}

/// One log entry's worth of change to the lock state.
///
/// Only the leader proposes these; the three session-ending and delay-ending
/// commands encode decisions the leader took on its own monotonic clock, so that
/// replicas never need a clock of their own.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Command {
    /// Opens a session; its id is this entry's index.
    CreateSession {
        /// Lease length the leader will enforce, in milliseconds; recorded so a new
        /// leader can restart the countdown at full length.
        ttl_ms: u64,
        /// Free text for operators (host, pid, purpose), at most
        /// [`MAX_LABEL_LEN`](super::MAX_LABEL_LEN) bytes.
        label: String,
        /// Who may use the session: the authenticated identity that opened it,
        /// and the digest of the key it was given. The leader chose the key at
        /// random before proposing; only its digest is written to the log.
        #[serde(default)]
        owner: SessionOwner,
    },
    /// Clean goodbye: releases everything the session holds, hands each lock to its
    /// next waiter, drops its waits. Never starts a lock-delay, since the holder
    /// said it was done.
    CloseSession {
        /// The session that is leaving.
        session: SessionId,
    },
    /// The leader saw the session's lease run out. Like [`Command::CloseSession`],
    /// except that a held lock whose `lock_delay_ms` is non-zero stays unavailable
    /// until [`Command::EndLockDelay`]: the dead holder may still be mid-write.
    ExpireSession {
        /// The session whose lease ran out.
        session: SessionId,
    },
    /// [`Command::ExpireSession`] that may share its entry with other expiries and
    /// lock commands, so that thousands of sessions expiring together cost a few
    /// entries instead of one each. Refused with
    /// [`MachineError::BatchConflict`](super::MachineError::BatchConflict), changing
    /// nothing, when the session holds a lock granted by this same entry (ending
    /// it would grant that lock a second time with the same token); the leader
    /// proposes it again in a later entry.
    ///
    /// A separate variant, not a new rule for `ExpireSession`, so that a node of
    /// an older version cannot decode it and stops instead of applying it under
    /// the old rule and diverging from the others.
    ExpireInBatch {
        /// The session whose lease ran out.
        session: SessionId,
    },
    /// Take a lock, or queue for it.
    Acquire {
        /// Who asks.
        session: SessionId,
        /// Which lock.
        name: String,
        /// Queue if the lock is unavailable, instead of answering
        /// [`Reply::WouldBlock`].
        wait: bool,
        /// Lock-delay to apply if this session's lease later expires while it holds
        /// the lock; at most [`MAX_LOCK_DELAY_MS`](super::MAX_LOCK_DELAY_MS).
        lock_delay_ms: u64,
    },
    /// Give a lock back. Only the holder, presenting its current token, may.
    Release {
        /// Who releases.
        session: SessionId,
        /// Which lock.
        name: String,
        /// The token of the grant being released; a stale one is refused so a
        /// delayed release from an earlier grant cannot free a later one.
        #[serde(with = "super::wire::token")]
        token: FencingToken,
    },
    /// A waiter gives up (its wait timed out on the client or the leader).
    CancelWait {
        /// Who gives up.
        session: SessionId,
        /// Which lock it was waiting for.
        name: String,
    },
    /// Take a permit of a semaphore, a read or write lock, or an election's
    /// leadership, or queue for it: [`Command::Acquire`] for every
    /// [`Claim`] (an `Acquire` is a `Claim` of [`Claim::Lock`]). Released,
    /// cancelled and ended like any lock.
    ///
    /// A variant of its own, so that a node of an older version stops at it
    /// rather than skip fields it does not know and diverge.
    Claim {
        /// Who asks.
        session: SessionId,
        /// Which name.
        name: String,
        /// What it asks of the name.
        claim: Claim,
        /// Queue if the claim does not fit now, instead of answering
        /// [`Reply::WouldBlock`].
        wait: bool,
        /// As for [`Command::Acquire`]; only an exclusive claim may ask one.
        lock_delay_ms: u64,
    },
    /// The leader of an election changes the value observers see. Only the
    /// leader, presenting its token, may.
    Proclaim {
        /// Who proclaims.
        session: SessionId,
        /// Which election.
        name: String,
        /// The leader's token.
        #[serde(with = "super::wire::token")]
        token: FencingToken,
        /// The new value, at most [`MAX_VALUE_LEN`](super::claim::MAX_VALUE_LEN) bytes.
        value: String,
    },
    /// The leader's lock-delay timer for `name` ran out: the lock goes to its first
    /// waiter or becomes free.
    EndLockDelay {
        /// Which lock.
        name: String,
        /// The index at which the delay being ended began (`LockView::
        /// lock_delay_since`). A late or duplicate entry for an earlier delay then
        /// cannot cut a newer delay short. `None` ends whichever delay is running.
        #[serde(default)]
        since: Option<u64>,
    },
}

/// What a command may share a log entry with. Every grant an entry makes carries
/// the entry's index as its token, so an entry must never grant one lock twice,
/// and two sessions created by one entry would get the same id.
///
/// Lock commands share entries freely, even on the same lock: after a grant, the
/// lock can be freed again only by a release presenting the new token — which
/// [`LockMachine`](super::LockMachine) refuses within the granting entry — or by
/// the end of the holder's session: a close is exclusive, and a batched expiry
/// ([`Command::ExpireInBatch`]) of a session holding a lock granted by the same
/// entry is refused. So an entry grants each lock at most once whatever lock
/// commands it carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ConflictKey {
    /// Acquire, release, cancel-wait, end of lock-delay, batched expiry: shares an
    /// entry with any command that is not exclusive.
    Shared,
    /// Creates a session, whose id is the entry's index: one per entry.
    NewSession,
    /// Ends a session, touching every lock it holds: must be alone in its entry.
    Exclusive,
}

impl Command {
    /// The checks that need no state: TTL, label, name and lock-delay bounds.
    /// The machine applies them (so every replica refuses alike), and the leader
    /// runs them before proposing, so bad input never reaches the log.
    ///
    /// # Errors
    /// The refusal the machine would give.
    pub fn check_input(&self) -> Result<(), MachineError> {
        match self {
            Command::CreateSession { ttl_ms, label, .. } => check_session_input(*ttl_ms, label),
            Command::Acquire {
                name,
                lock_delay_ms,
                ..
            } => check_acquire_input(name, *lock_delay_ms),
            Command::Claim {
                name,
                claim,
                lock_delay_ms,
                ..
            } => {
                check_acquire_input(name, *lock_delay_ms)?;
                claim.check(*lock_delay_ms)
            }
            Command::Proclaim { name, value, .. } => {
                crate::limits::validate_name(name)?;
                super::claim::check_value(value)
            }
            Command::Release { name, .. }
            | Command::CancelWait { name, .. }
            | Command::EndLockDelay { name, .. } => Ok(crate::limits::validate_name(name)?),
            Command::CloseSession { .. }
            | Command::ExpireSession { .. }
            | Command::ExpireInBatch { .. } => Ok(()),
        }
    }

    /// Which command this is: the label metrics count it under, and how the
    /// apply path tells an expiry from a close without matching strings.
    pub fn kind(&self) -> CommandKind {
        match self {
            Command::CreateSession { .. } => CommandKind::CreateSession,
            Command::CloseSession { .. } => CommandKind::CloseSession,
            Command::ExpireSession { .. } => CommandKind::ExpireSession,
            Command::ExpireInBatch { .. } => CommandKind::ExpireInBatch,
            Command::Acquire { .. } => CommandKind::Acquire,
            Command::Claim { .. } => CommandKind::Claim,
            Command::Proclaim { .. } => CommandKind::Proclaim,
            Command::Release { .. } => CommandKind::Release,
            Command::CancelWait { .. } => CommandKind::CancelWait,
            Command::EndLockDelay { .. } => CommandKind::EndLockDelay,
        }
    }

    /// See [`ConflictKey`].
    pub fn conflict_key(&self) -> ConflictKey {
        match self {
            Command::CreateSession { .. } => ConflictKey::NewSession,
            Command::CloseSession { .. } | Command::ExpireSession { .. } => ConflictKey::Exclusive,
            Command::ExpireInBatch { .. }
            | Command::Acquire { .. }
            | Command::Claim { .. }
            | Command::Proclaim { .. }
            | Command::Release { .. }
            | Command::CancelWait { .. }
            | Command::EndLockDelay { .. } => ConflictKey::Shared,
        }
    }
}

/// The stateless checks of a [`Command::CreateSession`].
pub(crate) fn check_session_input(ttl_ms: u64, label: &str) -> Result<(), MachineError> {
    crate::limits::validate_ttl(std::time::Duration::from_millis(ttl_ms))?;
    if label.len() > super::MAX_LABEL_LEN {
        return Err(MachineError::LabelTooLong {
            len: label.len(),
            limit: super::MAX_LABEL_LEN,
        });
    }
    Ok(())
}

/// The stateless checks of a [`Command::Acquire`].
pub(crate) fn check_acquire_input(name: &str, lock_delay_ms: u64) -> Result<(), MachineError> {
    crate::limits::validate_name(name)?;
    if lock_delay_ms > super::MAX_LOCK_DELAY_MS {
        return Err(MachineError::LockDelayTooLong {
            lock_delay_ms,
            limit: super::MAX_LOCK_DELAY_MS,
        });
    }
    Ok(())
}

/// A lock handed to a session by one entry: what the server pushes to the client
/// that has been waiting for it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    /// The lock.
    pub name: String,
    /// Its new holder.
    pub session: SessionId,
    /// The fencing token: the index of the entry that made the grant.
    #[serde(with = "super::wire::token")]
    pub token: FencingToken,
    /// The semaphore slot granted (`0` for every other shape): a resource
    /// fenced per permit keys its fence by `(name, slot)`.
    #[serde(default)]
    pub slot: u32,
}

/// A lock that entered lock-delay because its holder's session expired. The
/// leader starts a timer of `lock_delay_ms` and then proposes
/// [`Command::EndLockDelay`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DelayedLock {
    /// The lock.
    pub name: String,
    /// How long it must stay unavailable, as chosen by the expired holder.
    pub lock_delay_ms: u64,
}

/// The successful answers to a command.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "reply", rename_all = "snake_case")]
pub enum Reply {
    /// [`Command::CreateSession`] succeeded.
    SessionCreated {
        /// The new session's id (the entry's index).
        session: SessionId,
    },
    /// [`Command::CloseSession`], [`Command::ExpireSession`] or
    /// [`Command::ExpireInBatch`] succeeded. Hand-offs
    /// to waiters are in [`Applied::grants`].
    SessionEnded {
        /// The session that is gone.
        session: SessionId,
        /// Every lock it held, by name.
        released: Vec<String>,
        /// The subset of `released` that entered lock-delay (only on expiry).
        lock_delay: Vec<DelayedLock>,
        /// Locks it was queued for; those waits are gone.
        dropped_waits: Vec<String>,
    },
    /// The session holds the lock.
    Acquired {
        /// Its fencing token.
        #[serde(with = "super::wire::token")]
        token: FencingToken,
        /// `true` when the session already held the lock and this is the same grant
        /// returned again (a retried request), not a new one.
        reacquired: bool,
        /// The semaphore slot (`0` for every other shape).
        #[serde(default)]
        slot: u32,
    },
    /// The session waits in the lock's FIFO queue; the grant will come as an
    /// [`Applied::grants`] entry of some later command.
    Queued {
        /// 1-based place in the queue: `1` is next in line.
        position: usize,
    },
    /// The lock is unavailable and the caller did not want to wait. Nothing changed.
    WouldBlock {
        /// The newest holder's token, or `None` while the lock is in lock-delay.
        #[serde(with = "super::wire::opt_token")]
        holder_token: Option<FencingToken>,
    },
    /// [`Command::Release`] succeeded. `retried`: this session had already
    /// released the lock under this token (an earlier attempt committed and
    /// its answer was lost); nothing changed this time.
    Released {
        /// Whether this was a retry of a release that had already committed.
        retried: bool,
    },
    /// [`Command::CancelWait`] succeeded.
    WaitCancelled,
    /// [`Command::EndLockDelay`] succeeded.
    LockDelayEnded,
    /// [`Command::Proclaim`] succeeded: observers now see the new value.
    Proclaimed,
}

/// What one command did: its answer, or why it was refused.
pub type Outcome = Result<Reply, MachineError>;

/// The result of applying one log entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Applied {
    /// The entry's log index.
    pub index: u64,
    /// The answer for whoever proposed the command.
    pub outcome: Outcome,
    /// Every grant this entry made, including hand-offs to waiters: the server
    /// notifies each grantee from this list, so no client ever polls. Empty when the
    /// outcome is an error.
    pub grants: Vec<Grant>,
    /// Which command this answers (what metrics count it as).
    pub kind: CommandKind,
    /// What the server has to act on besides the reply and the grants.
    pub effect: Effect,
}

/// What applying a command did that the server acts on besides answering and
/// handing out [`Applied::grants`]: the lease keeper's timers, the waiters it
/// wakes, the logs and the status page. Typed, so a consumer matches on it
/// rather than reading the command back beside the reply.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Effect {
    /// Nothing besides the reply and the grants (every refusal but a
    /// release's).
    #[default]
    None,
    /// A session began: every node starts its lease of `ttl_ms`.
    SessionStarted {
        /// The new session.
        session: SessionId,
        /// Its lease.
        ttl_ms: u64,
    },
    /// A session ended, closed by its owner or `expired`, and freed `freed`
    /// (each lock it held, with the token it held it by). The locks that
    /// entered lock-delay are in the reply.
    SessionEnded {
        /// The session.
        session: SessionId,
        /// It ended because its lease ran out, not by a close.
        expired: bool,
        /// What it held when it ended.
        freed: Vec<Grant>,
    },
    /// A waiter left the queue of `name`: its blocked call is answered now.
    WaitCancelled {
        /// The session that waited.
        session: SessionId,
        /// The lock it waited for.
        name: String,
    },
    /// A release was refused ([`MachineError::StaleToken`] or
    /// [`MachineError::NotHolder`]): worth a line in the log, since it is
    /// usually a delayed duplicate or a client that lost its lease.
    ReleaseRefused {
        /// Who asked.
        session: SessionId,
        /// The lock named.
        name: String,
        /// The token presented.
        #[serde(with = "super::wire::token")]
        token: FencingToken,
    },
}

/// The kinds of [`Command`], one per variant, in a fixed order: counters kept
/// per kind live in an array indexed by [`CommandKind::index`], so a command
/// added to the machine needs a kind here ([`Command::kind`] is an exhaustive
/// match) and is then counted without anything else to remember.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CommandKind {
    /// [`Command::CreateSession`].
    CreateSession,
    /// [`Command::CloseSession`].
    CloseSession,
    /// [`Command::ExpireSession`].
    ExpireSession,
    /// [`Command::ExpireInBatch`].
    ExpireInBatch,
    /// [`Command::Acquire`].
    Acquire,
    /// [`Command::Claim`].
    Claim,
    /// [`Command::Proclaim`].
    Proclaim,
    /// [`Command::Release`].
    Release,
    /// [`Command::CancelWait`].
    CancelWait,
    /// [`Command::EndLockDelay`].
    EndLockDelay,
}

impl CommandKind {
    /// Every kind, each at its [`index`](Self::index).
    pub const ALL: [CommandKind; 10] = [
        CommandKind::CreateSession,
        CommandKind::CloseSession,
        CommandKind::ExpireSession,
        CommandKind::ExpireInBatch,
        CommandKind::Acquire,
        CommandKind::Claim,
        CommandKind::Proclaim,
        CommandKind::Release,
        CommandKind::CancelWait,
        CommandKind::EndLockDelay,
    ];

    /// The kind's place in [`ALL`](Self::ALL), for arrays of per-kind counters.
    pub const fn index(self) -> usize {
        self as usize
    }

    /// The name as it is spelled in the log (`acquire`, `expire_in_batch`, …)
    /// and in metrics labels.
    pub const fn as_str(self) -> &'static str {
        match self {
            CommandKind::CreateSession => "create_session",
            CommandKind::CloseSession => "close_session",
            CommandKind::ExpireSession => "expire_session",
            CommandKind::ExpireInBatch => "expire_in_batch",
            CommandKind::Acquire => "acquire",
            CommandKind::Claim => "claim",
            CommandKind::Proclaim => "proclaim",
            CommandKind::Release => "release",
            CommandKind::CancelWait => "cancel_wait",
            CommandKind::EndLockDelay => "end_lock_delay",
        }
    }

    /// A session ended because its lease ran out (alone or in a batch), not
    /// by its owner's close.
    pub const fn is_expiry(self) -> bool {
        matches!(
            self,
            CommandKind::ExpireSession | CommandKind::ExpireInBatch
        )
    }
}

// `ALL` lists every kind exactly once, in discriminant order, checked when the
// crate compiles: walking the kinds by `next` (an exhaustive match, so a new
// kind must say where it goes) meets each at its index in `ALL` and ends at
// `ALL`'s end.
const _: () = {
    const fn next(kind: CommandKind) -> Option<CommandKind> {
        match kind {
            CommandKind::CreateSession => Some(CommandKind::CloseSession),
            CommandKind::CloseSession => Some(CommandKind::ExpireSession),
            CommandKind::ExpireSession => Some(CommandKind::ExpireInBatch),
            CommandKind::ExpireInBatch => Some(CommandKind::Acquire),
            CommandKind::Acquire => Some(CommandKind::Claim),
            CommandKind::Claim => Some(CommandKind::Proclaim),
            CommandKind::Proclaim => Some(CommandKind::Release),
            CommandKind::Release => Some(CommandKind::CancelWait),
            CommandKind::CancelWait => Some(CommandKind::EndLockDelay),
            CommandKind::EndLockDelay => None,
        }
    }
    let mut kind = Some(CommandKind::CreateSession);
    let mut i = 0;
    while let Some(k) = kind {
        assert!(k.index() == i && CommandKind::ALL[i].index() == i);
        kind = next(k);
        i += 1;
    }
    assert!(i == CommandKind::ALL.len());
};
