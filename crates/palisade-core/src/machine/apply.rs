//! The transition function. Every handler checks everything that could refuse the
//! command *before* it mutates anything, so a refusal leaves no trace.

use std::collections::{BTreeSet, VecDeque};

use super::MAX_WAITERS_PER_LOCK;
use super::claim::{Claim, Mode, Shape, check_value};
use super::command::{
    Applied, Command, ConflictKey, DelayedLock, Effect, Grant, Outcome, Reply, SessionId,
    SessionOwner, check_acquire_input, check_session_input,
};
use super::error::MachineError;
use super::state::{Holder, LockMachine, LockState, SessionState, Waiter};
use super::{MAX_LOCKS_PER_SESSION, MAX_SESSIONS};
use crate::FencingToken;
use crate::limits::validate_name;

/// The token for a grant made by the entry at `index`.
fn token_at(index: u64) -> FencingToken {
    FencingToken::new(index).expect("apply asserts index > last_applied >= 0, so index >= 1")
}

impl LockMachine {
    /// Applies the committed log entry at `index`.
    ///
    /// Deterministic: the result depends only on the current state, `index` and
    /// `cmd`. Never panics on any command; refusals are
    /// [`MachineError`]s that change nothing except [`last_applied`](Self::last_applied).
    ///
    /// # Panics
    /// If `index` is not greater than [`last_applied`](Self::last_applied): applying
    /// an entry twice or out of order is a bug in the caller and would silently
    /// fork this replica from the others.
    pub fn apply(&mut self, index: u64, cmd: Command) -> Applied {
        assert!(
            index > self.last_applied,
            "LockMachine::apply: log index {index} is not after the last applied index {}; \
             entries must be applied exactly once, in log order",
            self.last_applied
        );
        self.last_applied = index;
        self.apply_at(index, cmd)
    }

    /// Applies the commands committed together in the entry at `index`, in order.
    ///
    /// Every grant they make carries `index` as its token; the entry still grants
    /// each lock at most once, because a release of a grant made by this entry is
    /// refused (see [`Command::conflict_key`]). A second session creation, or a
    /// session end that is not alone, is refused with
    /// [`MachineError::BatchConflict`] and changes nothing.
    ///
    /// # Panics
    /// As [`LockMachine::apply`].
    pub fn apply_batch(&mut self, index: u64, cmds: Vec<Command>) -> Vec<Applied> {
        assert!(
            index > self.last_applied,
            "LockMachine::apply_batch: log index {index} is not after the last applied index {}",
            self.last_applied
        );
        self.last_applied = index;
        let alone = cmds.len() == 1;
        let mut created_session = false;
        cmds.into_iter()
            .map(|cmd| {
                let conflicts = match cmd.conflict_key() {
                    ConflictKey::Shared => false,
                    ConflictKey::NewSession => std::mem::replace(&mut created_session, true),
                    ConflictKey::Exclusive => !alone,
                };
                if conflicts {
                    Applied {
                        index,
                        outcome: Err(MachineError::BatchConflict),
                        grants: Vec::new(),
                        kind: cmd.kind(),
                        effect: Effect::None,
                    }
                } else {
                    self.apply_at(index, cmd)
                }
            })
            .collect()
    }

    fn apply_at(&mut self, index: u64, cmd: Command) -> Applied {
        let mut grants = Vec::new();
        let kind = cmd.kind();
        let mut effect = Effect::None;
        let outcome = match cmd {
            Command::CreateSession {
                ttl_ms,
                label,
                owner,
            } => {
                let outcome = self.create_session(index, ttl_ms, label, owner);
                if let Ok(Reply::SessionCreated { session }) = outcome {
                    effect = Effect::SessionStarted { session, ttl_ms };
                }
                outcome
            }
            Command::CloseSession { session } => {
                self.end_session(index, session, false, &mut grants, &mut effect)
            }
            Command::ExpireSession { session } => {
                self.end_session(index, session, true, &mut grants, &mut effect)
            }
            Command::ExpireInBatch { session } => {
                if self.holds_a_lock_granted_at(session, index) {
                    Err(MachineError::BatchConflict)
                } else {
                    self.end_session(index, session, true, &mut grants, &mut effect)
                }
            }
            Command::Acquire {
                session,
                name,
                wait,
                lock_delay_ms,
            } => self.claim(
                index,
                session,
                name,
                Claim::Lock,
                wait,
                lock_delay_ms,
                &mut grants,
            ),
            Command::Claim {
                session,
                name,
                claim,
                wait,
                lock_delay_ms,
            } => self.claim(
                index,
                session,
                name,
                claim,
                wait,
                lock_delay_ms,
                &mut grants,
            ),
            Command::Proclaim {
                session,
                name,
                token,
                value,
            } => self.proclaim(session, name, token, value),
            Command::Release {
                session,
                name,
                token,
            } => {
                let outcome = self.release(index, session, &name, token, &mut grants);
                if let Err(MachineError::StaleToken { .. } | MachineError::NotHolder { .. }) =
                    outcome
                {
                    effect = Effect::ReleaseRefused {
                        session,
                        name,
                        token,
                    };
                }
                outcome
            }
            Command::CancelWait { session, name } => {
                let outcome = self.cancel_wait(index, session, &name, &mut grants);
                if outcome.is_ok() {
                    effect = Effect::WaitCancelled { session, name };
                }
                outcome
            }
            Command::EndLockDelay { name, since } => {
                self.end_lock_delay(index, name, since, &mut grants)
            }
        };
        debug_assert!(
            outcome.is_ok() || grants.is_empty(),
            "a refusal granted a lock"
        );
        Applied {
            index,
            outcome,
            grants,
            kind,
            effect,
        }
    }

    fn session_mut(&mut self, session: SessionId) -> Result<&mut SessionState, MachineError> {
        self.sessions
            .get_mut(&session)
            .ok_or(MachineError::UnknownSession { session })
    }

    fn create_session(
        &mut self,
        index: u64,
        ttl_ms: u64,
        label: String,
        owner: SessionOwner,
    ) -> Outcome {
        check_session_input(ttl_ms, &label)?;
        if self.sessions.len() >= MAX_SESSIONS {
            return Err(MachineError::TooManySessions {
                limit: MAX_SESSIONS,
            });
        }
        let session = SessionId(index);
        self.insert_session(
            session,
            SessionState {
                ttl_ms,
                label,
                owner,
                held: BTreeSet::new(),
                waiting: BTreeSet::new(),
                released: Vec::new(),
            },
        );
        Ok(Reply::SessionCreated { session })
    }

    fn end_session(
        &mut self,
        index: u64,
        session: SessionId,
        expired: bool,
        grants: &mut Vec<Grant>,
        effect: &mut Effect,
    ) -> Outcome {
        let freed = self.locks_held_by(session);
        let gone = self
            .remove_session(session)
            .ok_or(MachineError::UnknownSession { session })?;
        // Waits go first so that no hand-off below can pick the departing
        // session; leaving a queue can let the waiters behind fit (readers
        // behind a departing writer), which the hand-offs below or the loop
        // here grant.
        for name in &gone.waiting {
            let lock = self
                .locks
                .get_mut(name)
                .expect("a session waits only on existing locks");
            lock.waiters.retain(|w| w.session != session);
            if !gone.held.contains(name) {
                self.grant_ready(index, name, grants);
            }
        }
        let mut lock_delay = Vec::new();
        for name in &gone.held {
            let lock = self
                .locks
                .get_mut(name)
                .expect("a session holds only existing locks");
            let at = lock
                .holders
                .iter()
                .position(|h| h.session == session)
                .expect("the session's mirror says it holds the lock");
            let holder = lock.holders.remove(at);
            if expired && holder.mode == Mode::Exclusive && lock.lock_delay_ms > 0 {
                // The dead holder may still be writing; keep everyone out for a while
                // and leave the queue as it is. (An exclusive holder was alone.)
                lock.delay_since = Some(index);
                lock_delay.push(DelayedLock {
                    name: name.clone(),
                    lock_delay_ms: lock.lock_delay_ms,
                });
            } else {
                self.grant_ready(index, name, grants);
            }
        }
        *effect = Effect::SessionEnded {
            session,
            expired,
            freed,
        };
        Ok(Reply::SessionEnded {
            session,
            released: gone.held.into_iter().collect(),
            lock_delay,
            dropped_waits: gone.waiting.into_iter().collect(),
        })
    }

    /// Whether `session` holds a lock granted by the entry at `index`.
    fn holds_a_lock_granted_at(&self, session: SessionId, index: u64) -> bool {
        let token = token_at(index);
        self.sessions.get(&session).is_some_and(|s| {
            s.held.iter().any(|name| {
                self.locks
                    .get(name)
                    .and_then(|l| l.holder_of(session))
                    .is_some_and(|h| h.token == token)
            })
        })
    }

    /// Grants waiters from the front of `name`'s queue for as long as they fit
    /// beside the holders, then forgets the entry if nobody holds, waits or
    /// serves a lock-delay.
    fn grant_ready(&mut self, index: u64, name: &str, grants: &mut Vec<Grant>) {
        let bugs = self.bugs;
        let lock = self
            .locks
            .get_mut(name)
            .expect("caller passes an existing lock");
        while let Some(next) = lock.waiters.front()
            && lock.admits(next.mode, bugs)
        {
            let next = lock.waiters.pop_front().expect("front exists");
            let token = token_at(index);
            let slot = lock.free_slot();
            if next.mode == Mode::Exclusive {
                lock.lock_delay_ms = next.lock_delay_ms;
            }
            lock.holders.push(Holder {
                session: next.session,
                token,
                mode: next.mode,
                slot,
                value: next.value,
            });
            let s = self
                .sessions
                .get_mut(&next.session)
                .expect("every waiter's session is alive");
            s.waiting.remove(name);
            s.held.insert(name.to_owned());
            grants.push(Grant {
                name: name.to_owned(),
                session: next.session,
                token,
                slot,
            });
        }
        if lock.holders.is_empty() && lock.delay_since.is_none() {
            debug_assert!(lock.waiters.is_empty(), "a free lock keeps no queue");
            self.locks.remove(name);
        } else if lock.holders.is_empty() {
            // In lock-delay: the exclusive holder's delay stays until it ends.
        } else if lock.holders.iter().all(|h| h.mode == Mode::Shared) {
            lock.lock_delay_ms = 0;
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn claim(
        &mut self,
        index: u64,
        session: SessionId,
        name: String,
        claim: Claim,
        wait: bool,
        lock_delay_ms: u64,
        grants: &mut Vec<Grant>,
    ) -> Outcome {
        check_acquire_input(&name, lock_delay_ms)?;
        claim.check(lock_delay_ms)?;
        let s = self
            .sessions
            .get(&session)
            .ok_or(MachineError::UnknownSession { session })?;
        let too_many = MachineError::TooManyLocks {
            session,
            limit: MAX_LOCKS_PER_SESSION,
        };
        let at_limit = s.lock_count() >= MAX_LOCKS_PER_SESSION;
        let already_queued = s.waiting.contains(&name);
        let (shape, mode) = (claim.shape(), claim.mode());
        let holder = |token: FencingToken, slot: u32| Holder {
            session,
            token,
            mode,
            slot,
            value: claim.value().into(),
        };
        // A shared holder's lock-delay is refused by `claim.check`.
        let granted_delay = if mode == Mode::Exclusive {
            lock_delay_ms
        } else {
            0
        };

        let bugs = self.bugs;
        let Some(lock) = self.locks.get_mut(&name) else {
            if at_limit {
                return Err(too_many);
            }
            let token = token_at(index);
            let mut holders = smallvec::SmallVec::new();
            holders.push(holder(token, 0));
            self.locks.insert(
                name.clone(),
                LockState {
                    shape,
                    holders,
                    lock_delay_ms: granted_delay,
                    delay_since: None,
                    waiters: VecDeque::new(),
                },
            );
            return self.granted(session, name, token, 0, grants);
        };
        if lock.shape != shape {
            return Err(MachineError::ShapeMismatch {
                name,
                held_as: lock.shape,
                asked: shape,
            });
        }

        if let Some(answer) = earlier_answer(lock, &name, session, mode, already_queued) {
            return answer;
        }
        // FIFO: a claim that fits still waits behind anyone already waiting.
        if lock.waiters.is_empty() && lock.admits(mode, bugs) {
            if at_limit {
                return Err(too_many);
            }
            let token = token_at(index);
            let slot = lock.free_slot();
            lock.holders.push(holder(token, slot));
            if mode == Mode::Exclusive {
                lock.lock_delay_ms = granted_delay;
            }
            return self.granted(session, name, token, slot, grants);
        }
        if !wait {
            return Ok(Reply::WouldBlock {
                holder_token: lock.newest_token(),
            });
        }
        if lock.waiters.len() >= MAX_WAITERS_PER_LOCK {
            return Err(MachineError::TooManyWaiters {
                name,
                limit: MAX_WAITERS_PER_LOCK,
            });
        }
        if at_limit {
            return Err(too_many);
        }
        lock.waiters.push_back(Waiter {
            session,
            lock_delay_ms,
            mode,
            value: claim.value().into(),
        });
        let position = lock.waiters.len();
        self.session_mut(session)?.waiting.insert(name);
        Ok(Reply::Queued { position })
    }

    /// Records a new grant of `name` to `session` (the lock already lists it
    /// among its holders) and answers it.
    fn granted(
        &mut self,
        session: SessionId,
        name: String,
        token: FencingToken,
        slot: u32,
        grants: &mut Vec<Grant>,
    ) -> Outcome {
        self.session_mut(session)?.held.insert(name.clone());
        grants.push(Grant {
            name,
            session,
            token,
            slot,
        });
        Ok(Reply::Acquired {
            token,
            reacquired: false,
            slot,
        })
    }

    fn release(
        &mut self,
        index: u64,
        session: SessionId,
        name: &str,
        token: FencingToken,
        grants: &mut Vec<Grant>,
    ) -> Outcome {
        validate_name(name)?;
        // A retry of a release that already committed (its answer was lost,
        // say in a failover): the same answer again, and nothing changes.
        if self.session_mut(session)?.has_released(name, token) {
            return Ok(Reply::Released { retried: true });
        }
        let lock = self
            .locks
            .get_mut(name)
            .ok_or_else(|| MachineError::NoSuchLock { name: name.into() })?;
        let Some(at) = lock.holders.iter().position(|h| h.session == session) else {
            return Err(MachineError::NotHolder { name: name.into() });
        };
        let held = lock.holders[at].token;
        if held != token {
            return Err(MachineError::StaleToken {
                presented: token,
                current: held,
            });
        }
        // Granted by this very entry: the session cannot have learnt the token
        // yet, so this is a guess. Refusing it is what keeps an entry from
        // granting one lock twice (see `ConflictKey`).
        if held.get() == index {
            return Err(MachineError::NotHolder { name: name.into() });
        }
        lock.holders.remove(at);
        let s = self.session_mut(session)?;
        s.held.remove(name);
        s.remember_release(name.to_owned(), token);
        self.grant_ready(index, name, grants);
        Ok(Reply::Released { retried: false })
    }

    fn cancel_wait(
        &mut self,
        index: u64,
        session: SessionId,
        name: &str,
        grants: &mut Vec<Grant>,
    ) -> Outcome {
        validate_name(name)?;
        let s = self.session_mut(session)?;
        if !s.waiting.remove(name) {
            let holder = self.locks.get(name).and_then(|l| l.holder_of(session));
            return match holder {
                Some(h) => Err(MachineError::AlreadyGranted { token: h.token }),
                None => Err(MachineError::NotWaiting { name: name.into() }),
            };
        }
        let lock = self
            .locks
            .get_mut(name)
            .expect("a session waits only on existing locks");
        lock.waiters.retain(|w| w.session != session);
        // For a mutex, a semaphore or an election this grants nothing: whoever
        // is now first did not fit before either. Readers queued behind a writer
        // that gave up may fit beside the readers holding the lock.
        self.grant_ready(index, name, grants);
        Ok(Reply::WaitCancelled)
    }

    fn end_lock_delay(
        &mut self,
        index: u64,
        name: String,
        since: Option<u64>,
        grants: &mut Vec<Grant>,
    ) -> Outcome {
        validate_name(&name)?;
        let lock = match self.locks.get_mut(&name) {
            Some(lock)
                if lock.delay_since.is_some()
                    && since.is_none_or(|s| lock.delay_since == Some(s)) =>
            {
                lock
            }
            _ => return Err(MachineError::NotInLockDelay { name }),
        };
        lock.delay_since = None;
        self.grant_ready(index, &name, grants);
        Ok(Reply::LockDelayEnded)
    }

    fn proclaim(
        &mut self,
        session: SessionId,
        name: String,
        token: FencingToken,
        value: String,
    ) -> Outcome {
        validate_name(&name)?;
        check_value(&value)?;
        self.session_mut(session)?;
        let lock = self
            .locks
            .get_mut(&name)
            .ok_or_else(|| MachineError::NoSuchLock { name: name.clone() })?;
        if lock.shape != Shape::Election {
            return Err(MachineError::ShapeMismatch {
                name,
                held_as: lock.shape,
                asked: Shape::Election,
            });
        }
        let Some(leader) = lock.holders.iter_mut().find(|h| h.session == session) else {
            return Err(MachineError::NotHolder { name });
        };
        if leader.token != token {
            return Err(MachineError::StaleToken {
                presented: token,
                current: leader.token,
            });
        }
        leader.value = value.into();
        Ok(Reply::Proclaimed)
    }
}

/// The answer already given to `session` for `name`, if this claim is a retry
/// of one that took effect (the client could not tell, e.g. across a leader
/// change): the same answer again, never a second grant or a second place in
/// the queue. `None` when the session neither holds nor waits for the lock.
fn earlier_answer(
    lock: &LockState,
    name: &str,
    session: SessionId,
    mode: Mode,
    already_queued: bool,
) -> Option<Outcome> {
    let in_other_mode = |held: Mode| MachineError::HeldInOtherMode {
        name: name.to_owned(),
        mode: held,
    };
    if let Some(h) = lock.holder_of(session) {
        if h.mode != mode {
            return Some(Err(in_other_mode(h.mode)));
        }
        return Some(Ok(Reply::Acquired {
            token: h.token,
            reacquired: true,
            slot: h.slot,
        }));
    }
    if !already_queued {
        return None;
    }
    let (position, w) = lock
        .waiters
        .iter()
        .enumerate()
        .find(|(_, w)| w.session == session)
        .expect("session mirror says it is queued");
    if w.mode != mode {
        return Some(Err(in_other_mode(w.mode)));
    }
    Some(Ok(Reply::Queued {
        position: position + 1,
    }))
}
