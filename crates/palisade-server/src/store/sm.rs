//! The state machine side of openraft: applies entries to the [`LockMachine`],
//! tells local waiters about grants, and takes and installs snapshots (kept in
//! [`super::snapshot::SnapshotFile`]).
//!
//! The machine lives in memory; it is rebuilt at start from the last snapshot and
//! the log entries after it, which openraft re-applies. Because a token is the log
//! index of the granting entry, re-applying the same entries yields the same
//! tokens: nothing here has to remember the highest token separately.

use std::collections::HashMap;
use std::io::{self, Cursor};
use std::path::Path;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use futures_util::{Stream, StreamExt};
use openraft::storage::{EntryResponder, RaftStateMachine};
use openraft::{OptionalSend, RaftSnapshotBuilder};
use palisade_core::FencingToken;
use palisade_core::machine::{
    Applied, CommandKind, DelayedLock, Effect, Grant, LockMachine, Reply, SessionId,
};
use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;

use super::snapshot::{SnapshotFile, StoredSnapshot};
use crate::io::Io;
use crate::typ::{
    Commands, Entry, EntryPayload, LogId, Snapshot, SnapshotData, SnapshotMeta, StoredMembership,
    TypeConfig,
};

/// How a waiting acquire ends, as the state machine tells its call. (The
/// session ending drops the sender instead.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitEnd {
    /// The lock was granted to the waiter with this token (and, for a
    /// semaphore permit, in this slot).
    Granted(FencingToken, u32),
    /// The session cancelled the wait (`CancelAcquire`).
    Cancelled,
}

/// A waiter's "the lock is yours" channel, registered before its acquire is
/// proposed so that a grant applied in between cannot be missed.
/// A registered wait: the first log index whose entries may answer it, and
/// where the answer goes.
type GrantSender = (u64, oneshot::Sender<WaitEnd>);

/// State shared between the state machine (writer) and the gRPC services
/// (readers, waiters).
pub struct Shared {
    /// The lock state.
    pub machine: RwLock<LockMachine>,
    /// The log id of the last applied entry (the machine only knows the index).
    pub last_applied: RwLock<Option<LogId>>,
    /// The cluster membership as of `last_applied`.
    pub membership: RwLock<StoredMembership>,
    waiters: Mutex<HashMap<(SessionId, String), GrantSender>>,
    /// What the lease keeper must start or stop tracking, in apply order;
    /// pushed while the machine's write lock is held, drained by the keeper.
    lease_events: Mutex<Vec<LeaseEvent>>,
    /// Wakes the lease keeper when sessions or lock-delays change.
    pub changed: tokio::sync::Notify,
    /// The index of the last entry applied (or snapshot installed), for
    /// whoever watches the state change: `Observe` streams.
    pub applied: tokio::sync::watch::Sender<u64>,
    /// What the last snapshot this node built or installed cost.
    pub snapshot_stats: Mutex<SnapshotStats>,
    /// The latest expiries and lock-delays, newest last (see [`RECENT`]).
    recent: Mutex<std::collections::VecDeque<RecentEvent>>,
}

/// How many [`RecentEvent`]s a node remembers.
pub const RECENT: usize = 50;

/// An expiry or a lock-delay, as an operator wants to see it afterwards.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RecentEvent {
    /// When this node applied it (its wall clock: for display, never for safety).
    pub at_unix_ms: u64,
    /// The log index of the entry.
    pub index: u64,
    /// What happened.
    pub kind: RecentEventKind,
    /// The session.
    pub session: u64,
    /// The lock, if the event concerns one.
    pub lock: Option<String>,
    /// The expired grant's fencing token (expiry of a holder).
    pub token: Option<u64>,
    /// The lock-delay's length.
    pub lock_delay_ms: Option<u64>,
}

/// What a [`RecentEvent`] records; in `/status.json` as `expiry` or `lock_delay`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RecentEventKind {
    /// A session's lease ran out (with `lock` and `token` when it held one).
    Expiry,
    /// A lock the expired session held stays unavailable for `lock_delay_ms`.
    LockDelay,
}

/// The cost of this node's most recent snapshots, for `Status` and benchmarks.
#[derive(Debug, Clone, Copy, Default)]
pub struct SnapshotStats {
    /// Last log index the current snapshot covers (0: none).
    pub index: u64,
    /// Its size in bytes (the machine's part).
    pub bytes: u64,
    /// How long the last build took, from cloning the state to the file synced.
    pub build: Option<Duration>,
    /// Builds since the node started.
    pub builds: u64,
    /// How long the last install from the leader took, from decoding the
    /// received bytes to the new state in place (the transfer not included).
    pub install: Option<Duration>,
}

/// A change the lease keeper follows, so it never rescans every session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseEvent {
    /// A session was created with this TTL.
    SessionCreated {
        /// The session.
        session: SessionId,
        /// Its TTL.
        ttl: std::time::Duration,
    },
    /// A session was closed or expired.
    SessionEnded {
        /// The session.
        session: SessionId,
    },
    /// A lock entered lock-delay at entry `since`, for `length`.
    DelayStarted {
        /// The lock.
        name: String,
        /// The entry that started it.
        since: u64,
        /// How long it lasts.
        length: std::time::Duration,
    },
    /// The whole state was replaced (a snapshot was installed): rescan.
    Reset,
}

impl Shared {
    /// Takes the lease events pushed since the last call. Call it while holding
    /// the machine's read lock to see exactly the events the machine reflects.
    pub fn take_lease_events(&self) -> Vec<LeaseEvent> {
        std::mem::take(&mut *self.lease_events.lock().expect("poisoned"))
    }

    fn push_lease_events(&self, events: impl IntoIterator<Item = LeaseEvent>) {
        self.lease_events.lock().expect("poisoned").extend(events);
    }

    /// The latest expiries and lock-delays this node applied, oldest first.
    pub fn recent(&self) -> Vec<RecentEvent> {
        self.recent
            .lock()
            .expect("poisoned")
            .iter()
            .cloned()
            .collect()
    }

    fn remember(&self, events: impl IntoIterator<Item = RecentEvent>) {
        let mut recent = self.recent.lock().expect("poisoned");
        recent.extend(events);
        while recent.len() > RECENT {
            recent.pop_front();
        }
    }

    /// Registers interest in a grant of `name` to `session` made by an entry
    /// at index `from` or later.
    ///
    /// `from` must be above every entry already in the log: a node may still be
    /// applying older entries (after a restart, or as a new leader that has not
    /// caught up), and an old entry that granted `name` to the same session
    /// long ago — a grant since released — must not answer today's call.
    pub fn watch_grant(
        &self,
        session: SessionId,
        name: &str,
        from: u64,
    ) -> oneshot::Receiver<WaitEnd> {
        let (tx, rx) = oneshot::channel();
        self.waiters
            .lock()
            .expect("poisoned")
            .insert((session, name.to_owned()), (from, tx));
        rx
    }

    /// Forgets a registration (the waiter gave up or was answered directly).
    pub fn unwatch_grant(&self, session: SessionId, name: &str) {
        self.waiters
            .lock()
            .expect("poisoned")
            .remove(&(session, name.to_owned()));
    }

    fn deliver(&self, grants: &[Grant]) {
        if grants.is_empty() {
            return;
        }
        let mut waiters = self.waiters.lock().expect("poisoned");
        for g in grants {
            let key = (g.session, g.name.clone());
            // The token is the index of the entry that made the grant.
            if waiters
                .get(&key)
                .is_some_and(|(from, _)| g.token.get() >= *from)
                && let Some((_, tx)) = waiters.remove(&key)
            {
                let _ = tx.send(WaitEnd::Granted(g.token, g.slot));
            }
        }
    }

    /// Answers the call waiting for `name` in `session`, if any: its wait was
    /// cancelled (by the entry at `index`), so it ends now instead of when its
    /// own wait runs out. An older cancellation, applied late, ends nothing.
    fn cancel_waiter(&self, session: SessionId, name: &str, index: u64) {
        let mut waiters = self.waiters.lock().expect("poisoned");
        let key = (session, name.to_owned());
        if waiters.get(&key).is_some_and(|(from, _)| index >= *from)
            && let Some((_, tx)) = waiters.remove(&key)
        {
            let _ = tx.send(WaitEnd::Cancelled);
        }
    }

    fn drop_session_waiters(&self, session: SessionId) {
        self.waiters
            .lock()
            .expect("poisoned")
            .retain(|(s, _), _| *s != session);
    }
}

/// The state machine handed to openraft.
#[derive(Clone)]
pub struct StateMachineStore {
    shared: Arc<Shared>,
    file: Arc<SnapshotFile>,
    io: Io,
    /// Told of every applied entry (see [`crate::commit_clock`]).
    clock: Option<Arc<crate::commit_clock::CommitClock>>,
    /// What applied entries did, for Prometheus.
    counters: crate::metrics::ApplyCounters,
}

/// Wraps a storage error for openraft, keeping it as the `source()`.
fn io_err(e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> io::Error {
    io::Error::other(e)
}

impl StateMachineStore {
    /// Opens the snapshot under `data_dir` and restores the state from it.
    ///
    /// # Errors
    /// When the snapshot cannot be read or decoded.
    pub fn open(data_dir: &Path) -> io::Result<Self> {
        Self::open_on(data_dir, &Io::os())
    }

    /// [`StateMachineStore::open`] on `io`: its disk, and its way of running
    /// blocking work (snapshots encoded, decoded and saved).
    ///
    /// # Errors
    /// As [`StateMachineStore::open`].
    pub fn open_on(data_dir: &Path, io: &Io) -> io::Result<Self> {
        let (file, current) = SnapshotFile::open_on(data_dir, io)?;
        let mut machine = LockMachine::new();
        let mut last_applied = None;
        let mut membership = StoredMembership::default();
        let mut stats = SnapshotStats::default();
        if let Some(stored) = current {
            machine = LockMachine::from_snapshot_bytes(&stored.data).map_err(io_err)?;
            last_applied = stored.meta.last_log_id;
            membership = stored.meta.last_membership;
            stats.index = last_applied.map_or(0, |l| l.index);
            stats.bytes = stored.data.len() as u64;
        }
        machine.plant(io.planted.recipes);
        Ok(StateMachineStore {
            shared: Arc::new(Shared {
                machine: RwLock::new(machine),
                last_applied: RwLock::new(last_applied),
                membership: RwLock::new(membership),
                waiters: Mutex::new(HashMap::new()),
                lease_events: Mutex::new(Vec::new()),
                changed: tokio::sync::Notify::new(),
                applied: tokio::sync::watch::Sender::new(stats.index),
                snapshot_stats: Mutex::new(stats),
                recent: Mutex::default(),
            }),
            file: Arc::new(file),
            io: io.clone(),
            clock: None,
            counters: crate::metrics::ApplyCounters::default(),
        })
    }

    /// Tells `clock` of every entry applied from now on.
    #[must_use]
    pub fn with_commit_clock(mut self, clock: Arc<crate::commit_clock::CommitClock>) -> Self {
        self.clock = Some(clock);
        self
    }

    /// What the entries applied so far did (shared with every clone).
    pub fn counters(&self) -> crate::metrics::ApplyCounters {
        self.counters.clone()
    }

    /// The state the services read.
    pub fn shared(&self) -> Arc<Shared> {
        self.shared.clone()
    }

    /// Makes `stored` the current snapshot, durably, off the async threads.
    async fn save_snapshot(&self, stored: StoredSnapshot) -> io::Result<StoredSnapshot> {
        let file = self.file.clone();
        self.io
            .blocking(move || file.save(&stored).map(|()| stored))
            .await?
    }

    /// Applies one entry (under the machine's lock, released before returning:
    /// no lock is held across an await) and says what it produced.
    fn apply_one(&self, entry: Entry, sessions_changed: &mut bool) -> EntryResponse {
        let index = entry.log_id.index;
        tracing::trace!(index, term = entry.log_id.leader_id.term, payload = ?entry.payload, "applying");
        if let Some(observe) = &self.io.on_apply {
            use std::hash::{Hash, Hasher};
            // A digest that does not depend on the process: the entry's JSON
            // through a hasher with fixed keys.
            let mut digest = std::hash::DefaultHasher::new();
            serde_json::to_vec(&entry.payload)
                .unwrap_or_default()
                .hash(&mut digest);
            (observe.0)(crate::io::AppliedEntry {
                index,
                term: entry.log_id.leader_id.term,
                leader: entry.log_id.leader_id.node_id,
                digest: digest.finish(),
            });
        }
        // The machine lock is held until last_applied is updated too, so a
        // snapshot never pairs a machine state with another entry's log id.
        let mut machine = self.shared.machine.write().expect("poisoned");
        let applied = match entry.payload {
            EntryPayload::Blank => {
                self.counters.count_other_entry();
                EntryResponse::Raft
            }
            EntryPayload::Membership(m) => {
                self.counters.count_other_entry();
                *self.shared.membership.write().expect("poisoned") =
                    StoredMembership::new(Some(entry.log_id), m);
                EntryResponse::Raft
            }
            EntryPayload::Normal(Commands(cmds)) => {
                let applied = machine.apply_batch(index, cmds);
                *sessions_changed |= applied.iter().any(|a| wakes_lease_keeper(a.kind));
                self.counters.count_entry(&applied);
                self.note_expiries_and_refusals(&applied);
                let mut events = Vec::new();
                for a in &applied {
                    match &a.effect {
                        Effect::SessionStarted { session, ttl_ms } => {
                            events.push(LeaseEvent::SessionCreated {
                                session: *session,
                                ttl: Duration::from_millis(*ttl_ms),
                            });
                        }
                        Effect::SessionEnded { session, .. } => {
                            self.shared.drop_session_waiters(*session);
                            events.push(LeaseEvent::SessionEnded { session: *session });
                            events.extend(lock_delays(a).iter().map(|d| {
                                LeaseEvent::DelayStarted {
                                    name: d.name.clone(),
                                    since: a.index,
                                    length: Duration::from_millis(d.lock_delay_ms),
                                }
                            }));
                        }
                        // A cancelled wait's call is answered at once (see
                        // `cancel_waiter`).
                        Effect::WaitCancelled { session, name } => {
                            self.shared.cancel_waiter(*session, name, index);
                        }
                        Effect::ReleaseRefused { .. } | Effect::None => {}
                    }
                    self.shared.deliver(&a.grants);
                }
                self.shared.push_lease_events(events);
                EntryResponse::Commands(applied)
            }
        };
        *self.shared.last_applied.write().expect("poisoned") = Some(entry.log_id);
        drop(machine);
        if let Some(clock) = &self.clock {
            clock.applied(index);
        }
        applied
    }
}

/// Whether the lease keeper rescans after an entry of this kind: the
/// sessions or the lock-delays changed. Exhaustive, so a new kind must say.
fn wakes_lease_keeper(kind: CommandKind) -> bool {
    match kind {
        CommandKind::CreateSession
        | CommandKind::CloseSession
        | CommandKind::ExpireSession
        | CommandKind::ExpireInBatch
        | CommandKind::EndLockDelay => true,
        CommandKind::Acquire
        | CommandKind::Claim
        | CommandKind::Proclaim
        | CommandKind::Release
        | CommandKind::CancelWait => false,
    }
}

/// The locks that entered lock-delay when the session of `a` ended.
fn lock_delays(a: &Applied) -> &[DelayedLock] {
    match &a.outcome {
        Ok(Reply::SessionEnded { lock_delay, .. }) => lock_delay,
        _ => &[],
    }
}

impl StateMachineStore {
    /// Logs (and remembers for the status page) every lease expiry with each
    /// lock and token it freed, every lock-delay started, and every release
    /// refused for a stale or foreign token.
    fn note_expiries_and_refusals(&self, applied: &[Applied]) {
        let mut events = Vec::new();
        let at_unix_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        for a in applied {
            match &a.effect {
                Effect::SessionEnded {
                    session,
                    expired: true,
                    freed: held,
                } => {
                    if held.is_empty() {
                        tracing::info!(session = session.0, index = a.index, "lease expired");
                    }
                    let event = |lock: Option<&Grant>| RecentEvent {
                        at_unix_ms,
                        index: a.index,
                        kind: RecentEventKind::Expiry,
                        session: session.0,
                        lock: lock.map(|g| g.name.clone()),
                        token: lock.map(|g| g.token.get()),
                        lock_delay_ms: None,
                    };
                    if held.is_empty() {
                        events.push(event(None));
                    }
                    for g in held {
                        tracing::info!(
                            session = session.0,
                            lock = %g.name,
                            token = g.token.get(),
                            index = a.index,
                            "lease expired: lock released"
                        );
                        events.push(event(Some(g)));
                    }
                    for d in lock_delays(a) {
                        tracing::info!(
                            session = session.0,
                            lock = %d.name,
                            lock_delay_ms = d.lock_delay_ms,
                            index = a.index,
                            "lock-delay started"
                        );
                        events.push(RecentEvent {
                            at_unix_ms,
                            index: a.index,
                            kind: RecentEventKind::LockDelay,
                            session: session.0,
                            lock: Some(d.name.clone()),
                            token: None,
                            lock_delay_ms: Some(d.lock_delay_ms),
                        });
                    }
                }
                Effect::ReleaseRefused {
                    session,
                    name,
                    token,
                } => {
                    let reason = a.outcome.as_ref().err().map(ToString::to_string);
                    tracing::info!(
                        session = session.0,
                        lock = %name,
                        token = token.get(),
                        reason = reason.as_deref().unwrap_or(""),
                        "release refused"
                    );
                }
                _ => {}
            }
        }
        if !events.is_empty() {
            self.shared.remember(events);
        }
    }
}

/// How long the snapshot encoder runs before it pauses (three times as long).
const ENCODE_SLICE: Duration = Duration::from_millis(1);

/// Runs `work` on a thread of its own at a lower CPU priority (nice 10): on a
/// busy node, requests are served first and encoding a snapshot takes the CPU
/// they leave. A fresh thread, because a thread's nice value can be raised but
/// not lowered back without privilege.
async fn in_background<T: Send + 'static>(
    io: &Io,
    work: impl FnOnce() -> T + Send + 'static,
) -> io::Result<T> {
    if !io.threads {
        return Ok(work());
    }
    let (tx, rx) = oneshot::channel();
    std::thread::Builder::new()
        .name("palisade-snapshot".into())
        .spawn(move || {
            // On Linux a thread id's priority is that thread's alone; elsewhere
            // it would be the whole process's, so it is left alone there.
            #[cfg(target_os = "linux")]
            let _ = rustix::process::setpriority_process(Some(rustix::thread::gettid()), 10);
            let _ = tx.send(work());
        })?;
    rx.await
        .map_err(|_| io::Error::other("the snapshot thread ended without an answer"))
}

/// What applying one log entry produced: the machine's answer for a command,
/// nothing for Raft's own entries (blank, membership).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum EntryResponse {
    /// A blank or membership entry.
    Raft,
    /// The results of the entry's commands, in order.
    Commands(Vec<Applied>),
}

impl RaftStateMachine<TypeConfig> for StateMachineStore {
    type SnapshotData = SnapshotData;
    type SnapshotBuilder = Self;

    async fn applied_state(&mut self) -> io::Result<(Option<LogId>, StoredMembership)> {
        Ok((
            *self.shared.last_applied.read().expect("poisoned"),
            self.shared.membership.read().expect("poisoned").clone(),
        ))
    }

    async fn apply<Strm>(&mut self, mut entries: Strm) -> io::Result<()>
    where
        Strm: Stream<Item = io::Result<EntryResponder<TypeConfig>>> + Unpin + OptionalSend,
    {
        let mut sessions_changed = false;
        while let Some(item) = entries.next().await {
            let (entry, responder) = item?;
            let reply = self.apply_one(entry, &mut sessions_changed);
            // Every entry that has a responder must be answered, blank and
            // membership entries too, or its writer never returns.
            if let Some(responder) = responder {
                responder.send(reply);
            }
        }
        if sessions_changed {
            self.shared.changed.notify_waiters();
        }
        let index = self.shared.machine.read().expect("poisoned").last_applied();
        self.shared.applied.send_replace(index);
        Ok(())
    }

    async fn get_snapshot_builder(&mut self) -> Self {
        self.clone()
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: SnapshotData,
    ) -> io::Result<()> {
        let started = Instant::now();
        let data = snapshot.into_inner();
        // Decoding a million locks takes seconds of CPU: not on an async thread.
        let (machine, data) = self
            .io
            .blocking(move || (LockMachine::from_snapshot_bytes(&data), data))
            .await?;
        let mut machine = machine.map_err(io_err)?;
        machine.plant(self.io.planted.recipes);
        let bytes = data.len() as u64;
        self.save_snapshot(StoredSnapshot {
            meta: meta.clone(),
            data,
        })
        .await?;
        {
            // Replaced together, so readers never pair one state with another's id.
            let mut current = self.shared.machine.write().expect("poisoned");
            let old = std::mem::replace(&mut *current, machine);
            *self.shared.last_applied.write().expect("poisoned") = meta.last_log_id;
            *self.shared.membership.write().expect("poisoned") = meta.last_membership.clone();
            drop(current);
            // Freeing a million locks is not free either.
            if self.io.threads {
                tokio::task::spawn_blocking(move || drop(old));
            }
        }
        {
            let mut stats = self.shared.snapshot_stats.lock().expect("poisoned");
            stats.index = meta.last_log_id.map_or(0, |l| l.index);
            stats.bytes = bytes;
            stats.install = Some(started.elapsed());
        }
        tracing::info!(
            index = meta.last_log_id.map_or(0, |l| l.index),
            bytes,
            ms = started.elapsed().as_millis() as u64,
            "snapshot installed"
        );
        self.shared.push_lease_events([LeaseEvent::Reset]);
        self.shared.changed.notify_waiters();
        self.shared
            .applied
            .send_replace(meta.last_log_id.map_or(0, |l| l.index));
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> io::Result<Option<Snapshot>> {
        let file = self.file.clone();
        let stored = self.io.blocking(move || file.load()).await??;
        Ok(stored.map(|s| Snapshot {
            meta: s.meta,
            snapshot: Cursor::new(s.data),
        }))
    }
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachineStore {
    type SnapshotData = SnapshotData;

    async fn build_snapshot(&mut self) -> io::Result<Snapshot> {
        let started = Instant::now();
        // Taken together under the machine's lock so state, last id and
        // membership agree. The clone shares the machine's persistent maps
        // (O(1)); entries applied meanwhile copy the paths they change, so the
        // encoding below neither blocks them nor sees them.
        let (machine, last, membership) = {
            let machine = self.shared.machine.read().expect("poisoned");
            (
                machine.clone(),
                *self.shared.last_applied.read().expect("poisoned"),
                self.shared.membership.read().expect("poisoned").clone(),
            )
        };
        let io = self.io.clone();
        let data = in_background(&self.io, move || {
            // At most a quarter of a core: in trials on 2 cores, encoding at
            // full speed beside live traffic raised other clients' acquire p99
            // several-fold even at the lowest CPU priority (a sleep of the same
            // length did not); paced, it stays level (`palisade bench scale`,
            // acquire_p99_during_snapshot_us).
            let mut busy_since = Instant::now();
            machine.to_snapshot_bytes_paced(|| {
                let busy = busy_since.elapsed();
                if busy >= ENCODE_SLICE {
                    io.pace(busy * 3);
                    busy_since = Instant::now();
                }
            })
        })
        .await?;
        let meta = SnapshotMeta {
            last_log_id: last,
            last_membership: membership,
        };
        let stored = self
            .save_snapshot(StoredSnapshot {
                meta: meta.clone(),
                data,
            })
            .await?;
        let took = started.elapsed();
        {
            let mut stats = self.shared.snapshot_stats.lock().expect("poisoned");
            stats.index = last.map_or(0, |l| l.index);
            stats.bytes = stored.data.len() as u64;
            stats.build = Some(took);
            stats.builds += 1;
        }
        tracing::info!(
            index = last.map_or(0, |l| l.index),
            bytes = stored.data.len(),
            ms = took.as_millis() as u64,
            "snapshot built"
        );
        Ok(Snapshot {
            meta,
            snapshot: Cursor::new(stored.data),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(session: u64, name: &str, token: u64) -> Grant {
        Grant {
            name: name.into(),
            session: SessionId(session),
            slot: 0,
            token: FencingToken::new(token).expect("nonzero"),
        }
    }

    #[test]
    fn recent_events_keep_their_names_in_status_json() {
        // status.js and scripts read these two strings.
        let names = [RecentEventKind::Expiry, RecentEventKind::LockDelay]
            .map(|k| serde_json::to_value(k).unwrap());
        assert_eq!(
            names,
            [serde_json::json!("expiry"), serde_json::json!("lock_delay")]
        );
    }

    #[test]
    fn an_old_grant_applied_late_does_not_answer_a_newer_wait() {
        let dir = tempfile::tempdir().unwrap();
        let shared = StateMachineStore::open(dir.path()).unwrap().shared();
        // The call registered when the log ended at 40: the grant of the same
        // lock to the same session by entry 12 (re-applied after a restart) is
        // not its answer; the grant by entry 41 is.
        let mut rx = shared.watch_grant(SessionId(7), "db", 41);
        shared.deliver(&[grant(7, "db", 12)]);
        assert!(rx.try_recv().is_err(), "still waiting");
        shared.cancel_waiter(SessionId(7), "db", 30);
        assert!(rx.try_recv().is_err(), "an old cancellation ends nothing");
        shared.deliver(&[grant(7, "db", 41)]);
        match rx.try_recv() {
            Ok(WaitEnd::Granted(token, _)) => assert_eq!(token.get(), 41),
            other => panic!("expected the grant of entry 41, got {other:?}"),
        }
    }

    #[test]
    fn a_cancellation_after_the_wait_began_ends_it() {
        let dir = tempfile::tempdir().unwrap();
        let shared = StateMachineStore::open(dir.path()).unwrap().shared();
        let mut rx = shared.watch_grant(SessionId(7), "db", 41);
        shared.cancel_waiter(SessionId(7), "db", 45);
        assert!(matches!(rx.try_recv(), Ok(WaitEnd::Cancelled)));
    }
}
