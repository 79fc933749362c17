//! The replicated state itself, its snapshot form, and the invariants it keeps.

use std::collections::{BTreeSet, VecDeque};

use imbl::OrdMap;
use smallvec::SmallVec;

use serde::{Deserialize, Serialize};

use super::claim::{MAX_PERMITS, MAX_VALUE_LEN, Mode, RecipeBugs, Shape};
use super::command::{SessionId, SessionOwner};
use super::error::InvariantViolation;
use super::{MAX_LABEL_LEN, MAX_LOCK_DELAY_MS, MAX_LOCKS_PER_SESSION, MAX_SESSIONS};
use super::{MAX_WAITERS_PER_LOCK, wire};
use crate::FencingToken;

/// The whole lock state of a Palisade cluster, as every replica holds it.
///
/// Ordered maps and queues only, so that two replicas with equal states also
/// serialize to equal bytes. The two tables are persistent maps: a clone shares
/// them and costs O(1), so a snapshot is taken from a clone without holding up
/// the entries being applied meanwhile.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockMachine {
    /// Index of the last entry applied; every entry advances it, refused or not.
    pub(super) last_applied: u64,
    pub(super) sessions: OrdMap<SessionId, SessionState>,
    /// Only locks that are held or in lock-delay: a free lock has no entry, which
    /// keeps the state from growing with every name ever used.
    pub(super) locks: OrdMap<String, LockState>,
    /// Open sessions per owner identity: derived from `sessions`, never
    /// stored, so the leader can bound sessions per identity without a scan.
    #[serde(skip)]
    pub(super) sessions_per_owner: OrdMap<String, usize>,
    /// Planted bugs (none but in the simulator's tests): not state, so never
    /// serialized.
    #[serde(skip)]
    pub(super) bugs: RecipeBugs,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct SessionState {
    pub(super) ttl_ms: u64,
    pub(super) label: String,
    #[serde(default)]
    pub(super) owner: SessionOwner,
    /// Mirrors of the lock table, so ending a session and enforcing
    /// [`MAX_LOCKS_PER_SESSION`] need not scan every lock.
    pub(super) held: BTreeSet<String>,
    pub(super) waiting: BTreeSet<String>,
    /// The session's last few releases (lock name, token), oldest first, at
    /// most [`RELEASES_REMEMBERED`]: a release retried after its first attempt
    /// committed (the answer lost in a failover) is answered `Released` again,
    /// not `NotHolder`.
    #[serde(default)]
    pub(super) released: Vec<Release>,
}

/// A release a session remembers, to answer a retry of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Release {
    pub(super) name: String,
    #[serde(with = "wire::token")]
    pub(super) token: FencingToken,
}

/// How many releases a session remembers for retries: enough for every
/// release a client has in flight across one failover.
pub const RELEASES_REMEMBERED: usize = 8;

impl SessionState {
    /// Whether this session released `name` under `token` (recently).
    pub(super) fn has_released(&self, name: &str, token: FencingToken) -> bool {
        self.released
            .iter()
            .any(|r| r.name == name && r.token == token)
    }

    /// Remembers a release, forgetting the oldest past [`RELEASES_REMEMBERED`].
    pub(super) fn remember_release(&mut self, name: String, token: FencingToken) {
        if self.released.len() == RELEASES_REMEMBERED {
            self.released.remove(0);
        }
        self.released.push(Release { name, token });
    }

    pub(super) fn lock_count(&self) -> usize {
        self.held.len() + self.waiting.len()
    }
}

/// One name's entry: its shape, holders, queue and lock-delay.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct LockState {
    /// What the name is, fixed by the claim that created the entry.
    pub(super) shape: Shape,
    /// In grant order. Empty only while in lock-delay (or, for a read/write
    /// lock, never: an entry with no holder and no delay is removed).
    pub(super) holders: SmallVec<[Holder; 1]>,
    /// The lock-delay that applies if the exclusive holder expires (the
    /// holder's choice; `0` for shared holders); while in lock-delay, the one
    /// being served.
    pub(super) lock_delay_ms: u64,
    /// Index of the [`ExpireSession`](super::Command::ExpireSession) entry that
    /// started the current lock-delay.
    pub(super) delay_since: Option<u64>,
    pub(super) waiters: VecDeque<Waiter>,
}

impl LockState {
    /// Whether a claim in `mode` fits beside the current holders now (ignoring
    /// the queue; FIFO is the caller's business).
    pub(super) fn admits(&self, mode: Mode, bugs: RecipeBugs) -> bool {
        let extra = match self.shape {
            Shape::Semaphore { .. } => bugs.extra_permit,
            Shape::Election => bugs.second_leader,
            _ => false,
        };
        self.delay_since.is_none()
            && self.holders.len() < self.shape.capacity() + usize::from(extra)
            && match mode {
                Mode::Exclusive if bugs.second_leader && self.shape == Shape::Election => true,
                Mode::Exclusive if bugs.writer_beside_readers && self.shape == Shape::ReadWrite => {
                    self.holders.iter().all(|h| h.mode == Mode::Shared)
                }
                Mode::Exclusive => self.holders.is_empty(),
                Mode::Shared => self.holders.iter().all(|h| h.mode == Mode::Shared),
            }
    }

    /// The holder that is `session`, if it holds the name.
    pub(super) fn holder_of(&self, session: SessionId) -> Option<&Holder> {
        self.holders.iter().find(|h| h.session == session)
    }

    /// The newest grant's token, if the name is held at all.
    pub(super) fn newest_token(&self) -> Option<FencingToken> {
        self.holders.iter().map(|h| h.token).max()
    }

    /// The lowest semaphore slot no holder has (`0` for other shapes).
    pub(super) fn free_slot(&self) -> u32 {
        match self.shape {
            // The first gap in the sorted slots: O(n log n), not the O(n²)
            // of trying each slot against every holder.
            Shape::Semaphore { .. } => {
                let mut used: Vec<u32> = self.holders.iter().map(|h| h.slot).collect();
                used.sort_unstable();
                used.iter()
                    .zip(0..)
                    .find(|(slot, i)| **slot != *i)
                    .map_or(used.len() as u32, |(_, i)| i)
            }
            _ => 0,
        }
    }
}

/// A session holding a name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Holder {
    pub(super) session: SessionId,
    #[serde(with = "wire::token")]
    pub(super) token: FencingToken,
    pub(super) mode: Mode,
    /// The semaphore slot this grant occupies (`0` for other shapes).
    pub(super) slot: u32,
    /// An election leader's value (empty for other shapes).
    pub(super) value: Box<str>,
}

/// A session queued for a name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Waiter {
    pub(super) session: SessionId,
    /// Remembered until the grant, when it becomes the lock's lock-delay.
    pub(super) lock_delay_ms: u64,
    pub(super) mode: Mode,
    /// A candidate's value (empty for other shapes).
    pub(super) value: Box<str>,
}

impl LockMachine {
    /// An empty state, as before the first log entry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Plants `bugs` in the rules this machine applies from now on (the
    /// simulator's tests only; see [`RecipeBugs`]).
    pub fn plant(&mut self, bugs: RecipeBugs) {
        self.bugs = bugs;
    }

    /// Index of the last applied entry (`0` before any).
    pub fn last_applied(&self) -> u64 {
        self.last_applied
    }

    /// Inserts a session, counting it for its owner.
    pub(super) fn insert_session(&mut self, id: SessionId, state: SessionState) {
        *self
            .sessions_per_owner
            .entry(state.owner.identity.clone())
            .or_default() += 1;
        self.sessions.insert(id, state);
    }

    /// Removes a session, uncounting it for its owner.
    pub(super) fn remove_session(&mut self, id: SessionId) -> Option<SessionState> {
        let gone = self.sessions.remove(&id)?;
        let identity = &gone.owner.identity;
        match self.sessions_per_owner.get_mut(identity) {
            Some(n) if *n > 1 => *n -= 1,
            _ => {
                self.sessions_per_owner.remove(identity);
            }
        }
        Some(gone)
    }

    /// Rebuilds the per-owner counts from the sessions (after a load that
    /// did not go through [`insert_session`](Self::insert_session)).
    pub(super) fn recount_owners(&mut self) {
        self.sessions_per_owner = OrdMap::new();
        for s in self.sessions.values() {
            *self
                .sessions_per_owner
                .entry(s.owner.identity.clone())
                .or_default() += 1;
        }
    }

    /// Verifies every structural invariant: each lock is held xor in lock-delay;
    /// holders and waiters are live sessions; no session waits twice for a lock or
    /// waits for one it holds; the per-session mirrors agree with the lock table;
    /// ids and tokens are not from the future; all limits hold.
    ///
    /// # Errors
    /// The first violation found.
    pub fn check_invariants(&self) -> Result<(), InvariantViolation> {
        let fail = |msg: String| Err(InvariantViolation(msg));
        // Each queue entry is checked against its session's mirror below; equal
        // totals then rule out mirror entries with no queue entry behind them.
        let mut waits_claimed = 0;
        if self.sessions.len() > MAX_SESSIONS {
            return fail(format!("{} sessions", self.sessions.len()));
        }
        for (id, s) in &self.sessions {
            self.check_session(*id, s)?;
            for name in &s.held {
                let held = self.locks.get(name).and_then(|l| l.holder_of(*id));
                if held.is_none() {
                    return fail(format!("session {id} thinks it holds {name:?}"));
                }
            }
            waits_claimed += s.waiting.len();
        }
        let mut waits_found = 0;
        for (name, lock) in &self.locks {
            self.check_lock(name, lock)?;
            for h in &lock.holders {
                let mirrored = self
                    .sessions
                    .get(&h.session)
                    .is_some_and(|s| s.held.contains(name));
                if !mirrored {
                    return fail(format!("holder {} of {name:?} unknown", h.session));
                }
            }
            for w in &lock.waiters {
                let mirrored = self
                    .sessions
                    .get(&w.session)
                    .is_some_and(|s| s.waiting.contains(name));
                if !mirrored {
                    return fail(format!("waiter {} of {name:?} unknown", w.session));
                }
                waits_found += 1;
            }
        }
        if waits_claimed != waits_found {
            return fail(format!(
                "sessions claim {waits_claimed} waits but the queues hold {waits_found}"
            ));
        }
        let mut owners: OrdMap<&str, usize> = OrdMap::new();
        for s in self.sessions.values() {
            *owners.entry(s.owner.identity.as_str()).or_default() += 1;
        }
        let counted = self
            .sessions_per_owner
            .iter()
            .map(|(identity, n)| (identity.as_str(), *n));
        if !owners.into_iter().eq(counted) {
            return fail("the sessions per owner disagree with the sessions".to_owned());
        }
        Ok(())
    }

    /// The invariants of one session on its own (not its mirrors).
    pub(super) fn check_session(
        &self,
        id: SessionId,
        s: &SessionState,
    ) -> Result<(), InvariantViolation> {
        let fail = |msg: String| Err(InvariantViolation(msg));
        if id.0 == 0 || id.0 > self.last_applied {
            return fail(format!("session id {id} outside 1..={}", self.last_applied));
        }
        if crate::limits::validate_ttl(std::time::Duration::from_millis(s.ttl_ms)).is_err() {
            return fail(format!("session {id} has ttl {} ms", s.ttl_ms));
        }
        if s.label.len() > MAX_LABEL_LEN {
            return fail(format!("session {id} label too long"));
        }
        if s.lock_count() > MAX_LOCKS_PER_SESSION {
            return fail(format!("session {id} has {} locks", s.lock_count()));
        }
        if s.released.len() > RELEASES_REMEMBERED
            || s.released.iter().any(|r| {
                crate::limits::validate_name(&r.name).is_err() || r.token.get() > self.last_applied
            })
        {
            return fail(format!("session {id} remembers a bad release"));
        }
        Ok(())
    }

    /// The invariants of one lock on its own (not the sessions' mirrors of it).
    pub(super) fn check_lock(
        &self,
        name: &str,
        lock: &LockState,
    ) -> Result<(), InvariantViolation> {
        let fail = |msg: String| Err(InvariantViolation(msg));
        if crate::limits::validate_name(name).is_err() {
            return fail(format!("invalid lock name {name:?}"));
        }
        if lock.holders.is_empty() == lock.delay_since.is_none() {
            return fail(format!(
                "lock {name:?} must be either held or in lock-delay"
            ));
        }
        if let Shape::Semaphore { permits } = lock.shape
            && !(1..=MAX_PERMITS).contains(&permits)
        {
            return fail(format!("semaphore {name:?} has {permits} permits"));
        }
        if lock.holders.len() > lock.shape.capacity() {
            return fail(format!(
                "{name:?} ({}) has {} holders",
                lock.shape,
                lock.holders.len()
            ));
        }
        if lock.holders.len() > 1 && lock.holders.iter().any(|h| h.mode == Mode::Exclusive) {
            return fail(format!("{name:?} has an exclusive holder beside others"));
        }
        if lock.lock_delay_ms > MAX_LOCK_DELAY_MS {
            return fail(format!(
                "lock {name:?} has lock-delay {}",
                lock.lock_delay_ms
            ));
        }
        if lock.delay_since.is_some_and(|i| i > self.last_applied) {
            return fail(format!("lock {name:?} lock-delay starts in the future"));
        }
        let mut holding = BTreeSet::new();
        let mut slots = BTreeSet::new();
        for h in &lock.holders {
            if !holding.insert(h.session) {
                return fail(format!("session {} holds {name:?} twice", h.session));
            }
            if h.token.get() > self.last_applied {
                return fail(format!("lock {name:?} token {} from the future", h.token));
            }
            self.check_claim(name, lock.shape, h.mode, &h.value, 0)?;
            if h.mode == Mode::Shared && lock.lock_delay_ms > 0 {
                return fail(format!("{name:?} has shared holders and a lock-delay"));
            }
            let slot_ok = match lock.shape {
                Shape::Semaphore { permits } => h.slot < permits && slots.insert(h.slot),
                _ => h.slot == 0,
            };
            if !slot_ok {
                return fail(format!("{name:?} holder {} has slot {}", h.session, h.slot));
            }
        }
        // No wake-up is ever lost: whoever is first in line does not fit now
        // (else the entry that made room would have granted it).
        if let Some(first) = lock.waiters.front()
            && lock.admits(first.mode, RecipeBugs::default())
        {
            return fail(format!(
                "{name:?} could grant its first waiter {} but did not",
                first.session
            ));
        }
        if lock.waiters.len() > MAX_WAITERS_PER_LOCK {
            return fail(format!("lock {name:?} has {} waiters", lock.waiters.len()));
        }
        let mut seen = BTreeSet::new();
        for w in &lock.waiters {
            if !seen.insert(w.session) {
                return fail(format!("session {} queued twice for {name:?}", w.session));
            }
            if holding.contains(&w.session) {
                return fail(format!(
                    "session {} holds and waits for {name:?}",
                    w.session
                ));
            }
            if w.lock_delay_ms > MAX_LOCK_DELAY_MS {
                return fail(format!(
                    "waiter of {name:?} asks lock-delay {}",
                    w.lock_delay_ms
                ));
            }
            self.check_claim(name, lock.shape, w.mode, &w.value, w.lock_delay_ms)?;
        }
        Ok(())
    }

    /// A holder's or waiter's claim fits the name's shape: the right mode, a
    /// value only in an election and within bounds, a lock-delay only when
    /// exclusive.
    fn check_claim(
        &self,
        name: &str,
        shape: Shape,
        mode: Mode,
        value: &str,
        lock_delay_ms: u64,
    ) -> Result<(), InvariantViolation> {
        let mode_ok = match shape {
            Shape::Mutex | Shape::Election => mode == Mode::Exclusive,
            Shape::Semaphore { .. } => mode == Mode::Shared,
            Shape::ReadWrite => true,
        };
        let value_ok =
            value.len() <= MAX_VALUE_LEN && (shape == Shape::Election || value.is_empty());
        let delay_ok = mode == Mode::Exclusive || lock_delay_ms == 0;
        if mode_ok && value_ok && delay_ok {
            Ok(())
        } else {
            Err(InvariantViolation(format!(
                "{name:?}, a {shape}, has a {mode:?} claim that does not fit it"
            )))
        }
    }
}
