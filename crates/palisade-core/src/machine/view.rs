//! Read-only views of the state. Pure functions of the state, so a linearizable
//! read on the leader and a read of any replica at the same `last_applied` agree.

use serde::{Deserialize, Serialize};

use super::claim::{Mode, Shape};
use super::command::{Grant, SessionId, SessionOwner};
use super::state::{LockMachine, LockState, SessionState};
use crate::FencingToken;

/// One lock as seen from outside: who holds it, with which token, who waits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockView {
    /// The lock's name.
    pub name: String,
    /// What the name is (a mutex unless a recipe's claim made it).
    #[serde(default = "mutex")]
    pub shape: Shape,
    /// The holding session (for a shape with several holders, the newest);
    /// `None` only while in lock-delay.
    pub holder: Option<SessionId>,
    /// That holder's fencing token; `None` only while in lock-delay.
    #[serde(with = "super::wire::opt_token")]
    pub token: Option<FencingToken>,
    /// Every holder, in grant order: one for a mutex or an election, up to the
    /// permits for a semaphore, the readers or the writer of a read/write lock.
    #[serde(default)]
    pub holders: Vec<HolderView>,
    /// Queued sessions, next in line first.
    pub waiters: Vec<SessionId>,
    /// The holder's session expired and the lock is kept unavailable until the
    /// leader proposes [`EndLockDelay`](super::Command::EndLockDelay).
    pub in_lock_delay: bool,
    /// The holder's chosen lock-delay, or the one being served while in lock-delay.
    /// A new leader restarts a pending lock-delay timer at this full length.
    pub lock_delay_ms: u64,
    /// Index of the entry that started the current lock-delay, if any.
    pub lock_delay_since: Option<u64>,
}

fn mutex() -> Shape {
    Shape::Mutex
}

/// One holder of a name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HolderView {
    /// The holding session.
    pub session: SessionId,
    /// Its grant's fencing token.
    #[serde(with = "super::wire::token")]
    pub token: FencingToken,
    /// Alone (mutex, writer, leader) or shared (permit, reader).
    pub mode: Mode,
    /// Its semaphore slot (`0` for other shapes).
    pub slot: u32,
    /// An election leader's value (empty for other shapes).
    pub value: String,
}

/// One session as seen from outside.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionView {
    /// The session's id (the index of the entry that created it).
    pub id: SessionId,
    /// Its lease length; a new leader restarts the countdown at this full length.
    pub ttl_ms: u64,
    /// Its operator-facing label.
    pub label: String,
    /// Who may act on it.
    pub owner: SessionOwner,
    /// Locks it holds, by name, sorted.
    pub held: Vec<String>,
    /// Locks it is queued for, by name, sorted.
    pub waiting: Vec<String>,
}

/// How much state there is, for metrics: one pass over the lock table.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MachineCounts {
    /// Live sessions.
    pub sessions: u64,
    /// Locks with a holder.
    pub held: u64,
    /// Locks in lock-delay (no holder, not grantable yet).
    pub in_lock_delay: u64,
    /// Queued acquires, over every lock.
    pub waiters: u64,
    /// Holders by the shape of what they hold, in [`Shape::NAMES`] order (a
    /// semaphore's permits and a read/write lock's readers each count).
    pub holders_by_shape: [u64; 4],
}

/// The answer to "is this token still the lock's current grant?" (Chubby's
/// `CheckSequencer`), for resources that cannot store a token themselves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "check", rename_all = "snake_case")]
pub enum TokenCheck {
    /// The token belongs to the lock's current holder.
    Current,
    /// It does not: the lock was released, re-granted, is in lock-delay, or the
    /// token was never issued for it.
    Stale {
        /// The current grant's token, if the lock is held at all.
        #[serde(with = "super::wire::opt_token")]
        current: Option<FencingToken>,
    },
}

fn lock_view(name: &str, lock: &LockState) -> LockView {
    let newest = lock.holders.iter().max_by_key(|h| h.token);
    LockView {
        name: name.to_owned(),
        shape: lock.shape,
        holder: newest.map(|h| h.session),
        token: newest.map(|h| h.token),
        holders: lock
            .holders
            .iter()
            .map(|h| HolderView {
                session: h.session,
                token: h.token,
                mode: h.mode,
                slot: h.slot,
                value: h.value.to_string(),
            })
            .collect(),
        waiters: lock.waiters.iter().map(|w| w.session).collect(),
        in_lock_delay: lock.delay_since.is_some(),
        lock_delay_ms: lock.lock_delay_ms,
        lock_delay_since: lock.delay_since,
    }
}

fn session_view(id: SessionId, s: &SessionState) -> SessionView {
    SessionView {
        id,
        ttl_ms: s.ttl_ms,
        label: s.label.clone(),
        owner: s.owner.clone(),
        held: s.held.iter().cloned().collect(),
        waiting: s.waiting.iter().cloned().collect(),
    }
}

impl LockMachine {
    /// The lock called `name`, or `None` if it is free (free locks are not stored).
    pub fn get(&self, name: &str) -> Option<LockView> {
        self.locks.get(name).map(|lock| lock_view(name, lock))
    }

    /// Every lock that is held or in lock-delay, sorted by name.
    pub fn list(&self) -> Vec<LockView> {
        self.locks
            .iter()
            .map(|(name, lock)| lock_view(name, lock))
            .collect()
    }

    /// How many sessions, held locks, delayed locks and waiters there are.
    /// Walks every lock: call it on a clone (O(1)) rather than under the lock
    /// the state machine applies entries with.
    pub fn counts(&self) -> MachineCounts {
        let mut counts = MachineCounts {
            sessions: self.sessions.len() as u64,
            ..MachineCounts::default()
        };
        for lock in self.locks.values() {
            counts.held += u64::from(!lock.holders.is_empty());
            counts.in_lock_delay += u64::from(lock.delay_since.is_some());
            counts.waiters += lock.waiters.len() as u64;
            counts.holders_by_shape[lock.shape.index()] += lock.holders.len() as u64;
        }
        counts
    }

    /// The first `limit` locks by name that are held or in lock-delay (a
    /// status page need not copy a million).
    pub fn list_up_to(&self, limit: usize) -> Vec<LockView> {
        self.locks
            .iter()
            .take(limit)
            .map(|(name, lock)| lock_view(name, lock))
            .collect()
    }

    /// Session `id`'s label, if it is alive.
    pub fn session_label(&self, id: SessionId) -> Option<&str> {
        self.sessions.get(&id).map(|s| s.label.as_str())
    }

    /// The session `id`, if it is alive.
    pub fn session(&self, id: SessionId) -> Option<SessionView> {
        self.sessions.get(&id).map(|s| session_view(id, s))
    }

    /// Who may act on a live session (cheaper than [`LockMachine::session`]).
    pub fn session_owner(&self, id: SessionId) -> Option<&SessionOwner> {
        self.sessions.get(&id).map(|s| &s.owner)
    }

    /// How many live sessions `identity` owns (O(log n); the leader's bound on
    /// sessions per identity).
    pub fn sessions_of(&self, identity: &str) -> usize {
        self.sessions_per_owner.get(identity).copied().unwrap_or(0)
    }

    /// Every live session's id and TTL in milliseconds, sorted by id, copying
    /// nothing else (the lease keeper's full rescan).
    pub fn session_ttls(&self) -> impl Iterator<Item = (SessionId, u64)> + '_ {
        self.sessions.iter().map(|(id, s)| (*id, s.ttl_ms))
    }

    /// Whether session `id` is alive.
    pub fn has_session(&self, id: SessionId) -> bool {
        self.sessions.contains_key(&id)
    }

    /// Every lock in lock-delay: its name, the index of the entry that started
    /// the delay, and its length in milliseconds.
    pub fn delayed_locks(&self) -> impl Iterator<Item = (&str, u64, u64)> + '_ {
        self.locks.iter().filter_map(|(name, l)| {
            l.delay_since
                .map(|since| (name.as_str(), since, l.lock_delay_ms))
        })
    }

    /// Every live session, sorted by id.
    pub fn sessions(&self) -> Vec<SessionView> {
        self.sessions
            .iter()
            .map(|(id, s)| session_view(*id, s))
            .collect()
    }

    /// Whether `token` is a current grant of lock `name` (for a shape with
    /// several holders, any one's).
    pub fn check_token(&self, name: &str, token: FencingToken) -> TokenCheck {
        let Some(lock) = self.locks.get(name) else {
            return TokenCheck::Stale { current: None };
        };
        if lock.holders.iter().any(|h| h.token == token) {
            TokenCheck::Current
        } else {
            TokenCheck::Stale {
                current: lock.newest_token(),
            }
        }
    }

    /// The grants `session` holds now, sorted by lock name; empty for an unknown
    /// session.
    pub fn locks_held_by(&self, session: SessionId) -> Vec<Grant> {
        let Some(s) = self.sessions.get(&session) else {
            return Vec::new();
        };
        s.held
            .iter()
            .filter_map(|name| {
                let h = self.locks.get(name)?.holder_of(session)?;
                Some(Grant {
                    name: name.clone(),
                    session,
                    token: h.token,
                    slot: h.slot,
                })
            })
            .collect()
    }
}
