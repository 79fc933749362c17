//! The leader's lease keeper: session countdowns and lock-delays, on the leader's
//! monotonic clock.
//!
//! Keep-alives are not log entries: they only move a deadline in the leader's
//! memory. When a deadline passes, the leader proposes `ExpireInBatch`; that entry,
//! once committed, is what frees the locks — so every replica frees them at the
//! same log index. Sessions expiring together share entries (the proposer batches
//! them like acquires). A node that becomes leader knows no deadlines: it restarts every
//! session's countdown at the full TTL (and every pending lock-delay at its full
//! length) before it expires anything. A lease can therefore outlive its holder by
//! up to one TTL per election, never end early.
//!
//! Clock jumps do not matter here: `Instant` is monotonic. What safety needs is
//! that the leader's clock does not run much faster than the client's; the
//! client's safety margin covers that.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use openraft::ServerState;
use openraft::async_runtime::WatchReceiver;
use palisade_core::machine::{Command, MachineError, SessionId};

use crate::proposer::Proposer;
use crate::store::sm::{LeaseEvent, Shared};
use crate::typ::Raft;

/// How often deadlines are checked. Expiry may lag a deadline by this much, which
/// only makes leases longer.
const TICK: Duration = Duration::from_millis(25);

struct Countdown {
    deadline: Instant,
    ttl: Duration,
    /// An expiry is in flight: keep-alives are refused from now on.
    expiring: bool,
}

/// The leader's countdowns. Every operation costs O(log n) in the number of
/// sessions: keep-alives move one deadline, expiry pops the due ones from an
/// ordered index, and applied entries arrive as events (a full rescan of the
/// machine happens only when leadership changes, a snapshot is installed, and
/// every ten seconds as a safety net).
#[derive(Default)]
struct Tracked {
    /// The term these deadlines belong to; `None` when not leader.
    term: Option<u64>,
    sessions: HashMap<SessionId, Countdown>,
    /// The deadlines of the sessions not already expiring, in order.
    due: BTreeSet<(Instant, SessionId)>,
    /// Locks in lock-delay: the index the delay began at, and when it ends.
    /// Ordered, so that delays ending together are proposed in one order on
    /// every run (a seed replays the same log).
    delays: BTreeMap<String, (u64, Instant)>,
}

impl Tracked {
    /// Starts tracking `session` (if it is not already) at a full TTL from `now`.
    fn track(&mut self, session: SessionId, ttl: Duration, now: Instant) {
        if let std::collections::hash_map::Entry::Vacant(e) = self.sessions.entry(session) {
            let deadline = now + ttl;
            e.insert(Countdown {
                deadline,
                ttl,
                expiring: false,
            });
            self.due.insert((deadline, session));
        }
    }

    fn untrack(&mut self, session: SessionId) {
        if let Some(c) = self.sessions.remove(&session) {
            self.due.remove(&(c.deadline, session));
        }
    }

    /// Restarts `session`'s countdown; `None` if untracked, `Some(Err)` if it
    /// is being expired.
    fn renew(&mut self, session: SessionId, now: Instant) -> Option<Result<Duration, ()>> {
        let c = self.sessions.get_mut(&session)?;
        if c.expiring {
            return Some(Err(()));
        }
        self.due.remove(&(c.deadline, session));
        c.deadline = now + c.ttl;
        self.due.insert((c.deadline, session));
        Some(Ok(c.ttl))
    }

    /// Puts a session whose batched expiry was refused (see
    /// [`Command::ExpireInBatch`]) back in line, due now: the next tick proposes
    /// it again. It stays marked expiring, so keep-alives stay refused.
    fn expire_again(&mut self, session: SessionId, now: Instant) {
        if let Some(c) = self.sessions.get_mut(&session) {
            self.due.remove(&(c.deadline, session));
            c.deadline = now;
            self.due.insert((now, session));
        }
    }

    /// The sessions whose deadline has passed, in deadline order, each marked
    /// expiring (its keep-alives refused from now on) and out of the due index.
    fn take_due_sessions(&mut self, now: Instant) -> Vec<SessionId> {
        let mut due = Vec::new();
        while let Some(&(deadline, id)) = self.due.first() {
            if deadline > now {
                break;
            }
            self.due.pop_first();
            if let Some(c) = self.sessions.get_mut(&id) {
                c.expiring = true;
            }
            due.push(id);
        }
        due
    }

    /// The lock-delays that have ended, by lock name, with the index each
    /// began at. Removed now; re-added at full length by the next full rescan
    /// if the proposal to end them does not commit. Naming the delay's start
    /// makes a late duplicate harmless to any newer delay of the same lock.
    fn take_due_delays(&mut self, now: Instant) -> Vec<(String, u64)> {
        let due: Vec<(String, u64)> = self
            .delays
            .iter()
            .filter(|(_, (_, end))| *end <= now)
            .map(|(n, (since, _))| (n.clone(), *since))
            .collect();
        for (name, _) in &due {
            self.delays.remove(name);
        }
        due
    }

    /// Makes `cmd` (an expiry or the end of a lock-delay, proposed in leader
    /// term `term` and not applied) due again at `now` — unless the term has
    /// changed since: the new term's rescan has restarted every countdown at
    /// full length, and expiring one now would end its lease early.
    fn retry(&mut self, term: u64, cmd: Command, now: Instant) {
        if self.term != Some(term) {
            return;
        }
        match cmd {
            Command::ExpireInBatch { session }
                if self.sessions.get(&session).is_some_and(|c| c.expiring) =>
            {
                self.expire_again(session, now);
            }
            Command::EndLockDelay {
                name,
                since: Some(since),
            } => {
                self.delays.entry(name).or_insert((since, now));
            }
            _ => {}
        }
    }

    fn clear(&mut self) {
        self.sessions.clear();
        self.due.clear();
        self.delays.clear();
    }
}

/// See the module docs.
pub struct LeaseKeeper {
    raft: Raft,
    proposer: Proposer,
    shared: Arc<Shared>,
    tracked: Mutex<Tracked>,
    /// The simulator's planted bug: see [`crate::io::Planted::no_lease_restart`].
    no_lease_restart: bool,
    /// The clock every countdown reads (skewed only by the simulator: see
    /// [`crate::io::Io::clock_rate`]).
    clock: palisade_core::clock::Skewed,
}

/// Why a keep-alive was refused.
#[derive(Debug)]
pub enum KeepAliveError {
    /// This node is not the leader (or has just become it and is not ready).
    NotLeader,
    /// The session does not exist or is being expired.
    UnknownSession,
}

impl LeaseKeeper {
    /// A keeper for `raft`, reading sessions from `shared`.
    pub fn new(raft: Raft, proposer: Proposer, shared: Arc<Shared>) -> Arc<Self> {
        Self::with_planted(raft, proposer, shared, crate::io::Planted::default(), 1.0)
    }

    /// [`LeaseKeeper::new`] with the simulator's planted bugs (tests only)
    /// and a clock running at `clock_rate` times the true rate (1 outside
    /// the simulator).
    pub fn with_planted(
        raft: Raft,
        proposer: Proposer,
        shared: Arc<Shared>,
        planted: crate::io::Planted,
        clock_rate: f64,
    ) -> Arc<Self> {
        Arc::new(LeaseKeeper {
            raft,
            proposer,
            shared,
            tracked: Mutex::new(Tracked::default()),
            no_lease_restart: planted.no_lease_restart,
            clock: palisade_core::clock::Skewed::new(clock_rate),
        })
    }

    /// Restarts a session's countdown at its full TTL. Returns the TTL.
    ///
    /// # Errors
    /// See [`KeepAliveError`].
    pub fn keep_alive(&self, session: SessionId) -> Result<Duration, KeepAliveError> {
        let mut t = self.tracked.lock().expect("poisoned");
        if t.term.is_none() {
            return Err(KeepAliveError::NotLeader);
        }
        let now = self.clock.now();
        match t.renew(session, now) {
            Some(Ok(ttl)) => return Ok(ttl),
            Some(Err(())) => return Err(KeepAliveError::UnknownSession),
            None => {}
        }
        // A new leader may not have applied every committed entry yet: a session
        // created just before the election can be committed but not yet in its
        // machine. Calling it unknown would kill a live session, so until an entry
        // of this term has been applied (then everything before it has), say
        // "not ready" and let the client retry.
        if !self.applied_own_term() {
            return Err(KeepAliveError::NotLeader);
        }
        // Created since the keeper last looked: look it up.
        let ttl = self
            .shared
            .machine
            .read()
            .expect("poisoned")
            .session(session)
            .map(|s| Duration::from_millis(s.ttl_ms))
            .ok_or(KeepAliveError::UnknownSession)?;
        t.track(session, ttl, now);
        Ok(ttl)
    }

    /// How long each of `sessions` has left before this leader expires it, and
    /// each of `delayed` locks before its lock-delay ends; `None` when this
    /// node is not the leader (only the leader counts down). Sessions and
    /// locks it does not track (yet) are left out.
    pub fn time_left<'a>(
        &self,
        sessions: impl IntoIterator<Item = SessionId>,
        delayed: impl IntoIterator<Item = &'a str>,
    ) -> Option<(HashMap<SessionId, Duration>, HashMap<String, Duration>)> {
        let t = self.tracked.lock().expect("poisoned");
        t.term?;
        let now = self.clock.now();
        let sessions = sessions
            .into_iter()
            .filter_map(|s| {
                let c = t.sessions.get(&s)?;
                Some((s, c.deadline.saturating_duration_since(now)))
            })
            .collect();
        let delayed = delayed
            .into_iter()
            .filter_map(|name| {
                let (_, ends) = t.delays.get(name)?;
                Some((name.to_owned(), ends.saturating_duration_since(now)))
            })
            .collect();
        Some((sessions, delayed))
    }

    /// Whether this node's state machine has applied an entry of its current term
    /// (and so every entry committed before it).
    fn applied_own_term(&self) -> bool {
        let m = self.raft.metrics();
        let m = m.borrow_watched();
        m.last_applied
            .is_some_and(|applied| applied.leader_id.term == m.current_term)
    }

    /// Runs until the task is aborted.
    pub async fn run(self: Arc<Self>) {
        // Read each tick rather than awaited: metrics change on every applied entry,
        // and waking for each would cost a scan per commit. A leadership change is
        // seen within a tick; until then keep-alives fail their leadership check.
        let metrics = self.raft.metrics();
        // Applied entries arrive as events, followed on every wake-up; a full
        // rescan of the machine runs when leadership moves, when a snapshot was
        // installed, and every ten seconds as a safety net (it also re-adds a
        // lock-delay whose end could not be proposed). The deadline check runs
        // every tick and on every wake-up.
        let mut dirty = true;
        let mut ticks_since_sync = 0u32;
        let mut last_term = None;
        loop {
            // Registered before the sync, so a change during the sync is not missed.
            let changed = self.shared.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let leader_term = {
                let m = metrics.borrow_watched();
                let leading = m.state == ServerState::Leader && m.current_leader == Some(m.id);
                leading.then_some(m.current_term)
            };
            if leader_term != last_term {
                dirty = true;
                last_term = leader_term;
            }
            if dirty || ticks_since_sync >= 400 {
                self.sync(leader_term);
                dirty = false;
                ticks_since_sync = 0;
            } else {
                self.follow(leader_term);
            }
            if leader_term.is_some() {
                self.expire_due();
            }
            tokio::select! {
                () = tokio::time::sleep(TICK) => ticks_since_sync += 1,
                () = &mut changed => {}
            }
        }
    }

    /// Aligns the tracked countdowns with the machine and with leadership: a
    /// full rescan, O(n log n).
    fn sync(&self, leader_term: Option<u64>) {
        let mut t = self.tracked.lock().expect("poisoned");
        let machine = self.shared.machine.read().expect("poisoned");
        // Taken under the machine's read lock: the machine reflects exactly
        // these events, so the rescan below covers them all.
        drop(self.shared.take_lease_events());
        let gained = leader_term.is_some() && leader_term != t.term;
        if leader_term != t.term {
            // Lost or gained leadership: forget every deadline. A new leader
            // starts every countdown afresh, at full length, below.
            t.clear();
            t.term = leader_term;
        }
        if t.term.is_none() {
            return;
        }
        let now = self.clock.now();
        let gone: Vec<SessionId> = t
            .sessions
            .keys()
            .filter(|id| !machine.has_session(**id))
            .copied()
            .collect();
        for id in gone {
            t.untrack(id);
        }
        for (id, ttl_ms) in machine.session_ttls() {
            t.track(id, Duration::from_millis(ttl_ms), now);
        }
        if gained && self.no_lease_restart {
            let ids: Vec<SessionId> = t.sessions.keys().copied().collect();
            for id in ids {
                t.expire_again(id, now);
            }
        }
        let delayed: HashMap<&str, (u64, u64)> = machine
            .delayed_locks()
            .map(|(name, since, ms)| (name, (since, ms)))
            .collect();
        t.delays
            .retain(|name, (since, _)| delayed.get(name.as_str()).is_some_and(|(s, _)| s == since));
        for (name, (since, ms)) in delayed {
            t.delays
                .entry(name.to_owned())
                .or_insert_with(|| (since, now + Duration::from_millis(ms)));
        }
    }

    /// Applies the events of the entries applied since the last look: O(k log n)
    /// for k events.
    fn follow(&self, leader_term: Option<u64>) {
        let mut t = self.tracked.lock().expect("poisoned");
        let events = self.shared.take_lease_events();
        if leader_term != t.term || events.contains(&LeaseEvent::Reset) {
            drop(t);
            self.sync(leader_term);
            return;
        }
        if t.term.is_none() {
            return;
        }
        let now = self.clock.now();
        for event in events {
            match event {
                LeaseEvent::SessionCreated { session, ttl } => t.track(session, ttl, now),
                LeaseEvent::SessionEnded { session } => t.untrack(session),
                LeaseEvent::DelayStarted {
                    name,
                    since,
                    length,
                } => {
                    t.delays.insert(name, (since, now + length));
                }
                LeaseEvent::Reset => {}
            }
        }
    }

    fn expire_due(self: &Arc<Self>) {
        let now = self.clock.now();
        let mut proposals = Vec::new();
        let term;
        {
            let mut t = self.tracked.lock().expect("poisoned");
            term = t.term;
            for session in t.take_due_sessions(now) {
                proposals.push(Command::ExpireInBatch { session });
            }
            for (name, since) in t.take_due_delays(now) {
                proposals.push(Command::EndLockDelay {
                    name,
                    since: Some(since),
                });
            }
        }
        let Some(term) = term else { return };
        for cmd in proposals {
            tracing::debug!(?cmd, "lease keeper proposes");
            let keeper = Arc::clone(self);
            tokio::spawn(async move {
                let retry = match keeper.proposer.propose(cmd.clone()).await {
                    // Refused because another expiry in its entry freed the
                    // same locks first: again, in the next entry.
                    Ok(applied) => matches!(applied.outcome, Err(MachineError::BatchConflict)),
                    // Not committed. If leadership moved, the new term's rescan
                    // starts every countdown afresh; if not (openraft can refuse
                    // a write while its leadership is unconfirmed, say, when it
                    // hears no follower), the expiry must be proposed again, or
                    // the session's locks would stay held for as long as this
                    // node leads (found by `palisade sim` with one-way
                    // partitions).
                    Err(e) => {
                        // At debug: retried every tick while it lasts.
                        tracing::debug!(error = ?e, "lease keeper proposal failed");
                        true
                    }
                };
                if retry {
                    let mut t = keeper.tracked.lock().expect("poisoned");
                    t.retry(term, cmd, keeper.clock.now());
                }
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_secs(2);

    fn id(n: u64) -> SessionId {
        SessionId(n)
    }

    #[test]
    fn a_session_falls_due_one_ttl_after_its_last_keep_alive() {
        let start = Instant::now();
        let mut t = Tracked::default();
        t.track(id(1), TTL, start);
        let at = |ms: u64| start + Duration::from_millis(ms);
        assert!(t.take_due_sessions(at(1999)).is_empty());
        // Renewed at 1.5 s: now due at 3.5 s, not at 2 s.
        assert_eq!(t.renew(id(1), at(1500)), Some(Ok(TTL)));
        assert!(t.take_due_sessions(at(3499)).is_empty());
        assert_eq!(t.take_due_sessions(at(3500)), vec![id(1)]);
        // Taken once: no second proposal, and keep-alives are refused now.
        assert!(t.take_due_sessions(at(9000)).is_empty());
        assert_eq!(t.renew(id(1), at(3600)), Some(Err(())));
        assert_eq!(t.renew(id(9), at(3600)), None, "untracked");
    }

    #[test]
    fn tracking_again_does_not_restart_a_countdown() {
        // The periodic rescan tracks every session of the machine; a session
        // already counted down must keep its deadline, or none would expire.
        let start = Instant::now();
        let mut t = Tracked::default();
        t.track(id(1), TTL, start);
        t.track(id(1), TTL, start + Duration::from_millis(1900));
        assert_eq!(t.take_due_sessions(start + TTL), vec![id(1)]);
    }

    #[test]
    fn sessions_fall_due_in_deadline_order_and_untracked_ones_never() {
        let start = Instant::now();
        let mut t = Tracked::default();
        t.track(id(1), Duration::from_secs(3), start);
        t.track(id(2), Duration::from_secs(1), start);
        t.track(id(3), Duration::from_secs(2), start);
        t.track(id(4), Duration::from_secs(1), start);
        t.untrack(id(4));
        assert_eq!(
            t.take_due_sessions(start + Duration::from_secs(5)),
            vec![id(2), id(3), id(1)]
        );
    }

    #[test]
    fn a_refused_expiry_is_due_again_at_once_and_still_refuses_keep_alives() {
        let start = Instant::now();
        let mut t = Tracked::default();
        t.track(id(1), TTL, start);
        assert_eq!(t.take_due_sessions(start + TTL), vec![id(1)]);
        let later = start + Duration::from_secs(3);
        t.expire_again(id(1), later);
        assert_eq!(t.renew(id(1), later), Some(Err(())));
        assert_eq!(t.take_due_sessions(later), vec![id(1)]);
    }

    #[test]
    fn lock_delays_end_once_each_in_name_order() {
        let start = Instant::now();
        let mut t = Tracked::default();
        t.delays
            .insert("b".into(), (7, start + Duration::from_secs(1)));
        t.delays
            .insert("a".into(), (9, start + Duration::from_secs(1)));
        t.delays
            .insert("c".into(), (8, start + Duration::from_secs(5)));
        let due = t.take_due_delays(start + Duration::from_secs(2));
        assert_eq!(due, vec![("a".to_owned(), 9), ("b".to_owned(), 7)]);
        assert!(t.take_due_delays(start + Duration::from_secs(2)).is_empty());
        assert_eq!(t.delays.len(), 1);
    }

    #[test]
    fn a_failed_expiry_is_due_again_in_its_term_and_never_in_the_next() {
        let start = Instant::now();
        let mut t = Tracked {
            term: Some(3),
            ..Tracked::default()
        };
        t.track(id(1), TTL, start);
        t.track(id(2), TTL, start);
        assert_eq!(t.take_due_sessions(start + TTL), vec![id(1), id(2)]);
        let later = start + Duration::from_secs(3);
        t.retry(3, Command::ExpireInBatch { session: id(1) }, later);
        assert_eq!(t.take_due_sessions(later), vec![id(1)]);
        // Leadership moved to term 4 and the rescan restarted session 2 at a
        // full TTL: the old term's failure must not cut that short.
        t.clear();
        t.term = Some(4);
        t.track(id(2), TTL, later);
        t.retry(3, Command::ExpireInBatch { session: id(2) }, later);
        assert!(t.take_due_sessions(later + TTL / 2).is_empty());
        assert_eq!(t.take_due_sessions(later + TTL), vec![id(2)]);
        // A lock-delay whose end was not committed ends again at once.
        t.retry(
            4,
            Command::EndLockDelay {
                name: "a".into(),
                since: Some(9),
            },
            later,
        );
        assert_eq!(t.take_due_delays(later), vec![("a".to_owned(), 9)]);
    }

    #[test]
    fn losing_leadership_forgets_every_countdown() {
        let start = Instant::now();
        let mut t = Tracked::default();
        t.track(id(1), TTL, start);
        t.delays.insert("a".into(), (1, start));
        t.clear();
        assert!(t.take_due_sessions(start + TTL * 10).is_empty());
        assert!(t.take_due_delays(start + TTL * 10).is_empty());
        assert_eq!(t.renew(id(1), start), None);
    }
}
