//! The snapshot form of a [`LockMachine`]: what a Raft snapshot carries, what a
//! node keeps on disk and what a new follower receives.
//!
//! Format 4 (this version writes it): the 8 bytes `PLSDSNAP`, a little-endian
//! `u32` format number, then a `postcard` body: the last applied index, every
//! session (id, TTL, label, owner, its last releases) and every lock (name,
//! shape, holders with their tokens, modes, slots and values, lock-delay,
//! waiters), each in key order. The per-session mirrors of the lock
//! table (what each session holds and waits for) are not stored: they are
//! rebuilt from the lock table on load, which halves the size and makes a
//! snapshot whose mirrors disagree with its locks impossible to write. A
//! million held locks take about 30 MB.
//!
//! Format 3 (earlier versions) is format 4 from before the recipes: each lock
//! a mutex with at most one holder; it loads as mutexes. Format 2 is format 3
//! without the sessions' releases; it still loads, as sessions that remember no
//! release. Format 1 (earlier still):
//! the machine as one JSON object. It still loads too, so a node upgraded in
//! place keeps its state; the next snapshot it takes is format 4. A format number this version does not know is refused by name
//! rather than guessed at.
//!
//! Both forms are deterministic: replicas with equal states write equal bytes.

use std::collections::{HashMap, VecDeque};

use imbl::OrdMap;

use serde::ser::SerializeStruct;
use serde::{Deserialize, Serialize, Serializer};

use super::MAX_SESSIONS;
use super::claim::{Mode, Shape};
use super::command::{SessionId, SessionOwner};
use super::error::{InvariantViolation, SnapshotError};
use super::state::{Holder, LockMachine, LockState, Release, SessionState, Waiter};
use super::wire;
use crate::FencingToken;

/// Starts every snapshot of format 2 and later.
const MAGIC: &[u8; 8] = b"PLSDSNAP";
/// The format this version writes.
const FORMAT: u32 = 4;
/// The formats before it, still read.
const FORMAT_3: u32 = 3;
const FORMAT_2: u32 = 2;

/// A lock as formats 1 to 3 stored it: a mutex, held or in lock-delay.
#[derive(Serialize, Deserialize)]
struct MutexRecord {
    holder: Option<MutexHolder>,
    lock_delay_ms: u64,
    delay_since: Option<u64>,
    waiters: VecDeque<MutexWaiter>,
}

#[derive(Serialize, Deserialize)]
struct MutexHolder {
    session: SessionId,
    #[serde(with = "wire::token")]
    token: FencingToken,
}

#[derive(Serialize, Deserialize)]
struct MutexWaiter {
    session: SessionId,
    lock_delay_ms: u64,
}

impl From<MutexRecord> for LockState {
    fn from(old: MutexRecord) -> LockState {
        LockState {
            shape: Shape::Mutex,
            holders: old
                .holder
                .into_iter()
                .map(|h| Holder {
                    session: h.session,
                    token: h.token,
                    mode: Mode::Exclusive,
                    slot: 0,
                    value: Box::default(),
                })
                .collect(),
            lock_delay_ms: old.lock_delay_ms,
            delay_since: old.delay_since,
            waiters: old
                .waiters
                .into_iter()
                .map(|w| Waiter {
                    session: w.session,
                    lock_delay_ms: w.lock_delay_ms,
                    mode: Mode::Exclusive,
                    value: Box::default(),
                })
                .collect(),
        }
    }
}

impl MutexRecord {
    /// A mutex in the old form (for the tests that old snapshots still load).
    #[cfg(test)]
    fn of(lock: &LockState) -> MutexRecord {
        assert_eq!(lock.shape, Shape::Mutex, "formats 1 to 3 hold only mutexes");
        MutexRecord {
            holder: lock.holders.first().map(|h| MutexHolder {
                session: h.session,
                token: h.token,
            }),
            lock_delay_ms: lock.lock_delay_ms,
            delay_since: lock.delay_since,
            waiters: lock
                .waiters
                .iter()
                .map(|w| MutexWaiter {
                    session: w.session,
                    lock_delay_ms: w.lock_delay_ms,
                })
                .collect(),
        }
    }
}

/// The machine as format 1 stored it: one JSON object, mirrors included.
#[derive(Deserialize)]
struct Format1 {
    last_applied: u64,
    sessions: OrdMap<SessionId, SessionState>,
    locks: std::collections::BTreeMap<String, MutexRecord>,
}

/// A session as format 3 stores it (its mirrors are rebuilt).
#[derive(Serialize, Deserialize)]
struct SessionRecord<L, O, R> {
    id: SessionId,
    ttl_ms: u64,
    label: L,
    owner: O,
    released: R,
}

/// A session as format 2 stored it.
#[derive(Deserialize)]
struct SessionRecord2 {
    id: SessionId,
    ttl_ms: u64,
    label: String,
    owner: SessionOwner,
}

/// The body of format 4 (and, with mutex records for locks, 3) as read.
#[derive(Deserialize)]
struct Body<L = LockState> {
    last_applied: u64,
    sessions: Vec<SessionRecord<String, SessionOwner, Vec<Release>>>,
    locks: Vec<(String, L)>,
}

impl From<Body<MutexRecord>> for Body {
    fn from(b: Body<MutexRecord>) -> Body {
        Body {
            last_applied: b.last_applied,
            sessions: b.sessions,
            locks: b.locks.into_iter().map(|(n, l)| (n, l.into())).collect(),
        }
    }
}

/// The body of format 2 as read.
#[derive(Deserialize)]
struct Body2 {
    last_applied: u64,
    sessions: Vec<SessionRecord2>,
    locks: Vec<(String, MutexRecord)>,
}

impl From<Body2> for Body {
    fn from(b: Body2) -> Body {
        Body {
            last_applied: b.last_applied,
            sessions: b
                .sessions
                .into_iter()
                .map(|s| SessionRecord {
                    id: s.id,
                    ttl_ms: s.ttl_ms,
                    label: s.label,
                    owner: s.owner,
                    released: Vec::new(),
                })
                .collect(),
            locks: b.locks.into_iter().map(|(n, l)| (n, l.into())).collect(),
        }
    }
}

/// The body of format 4 as written: the same fields, streamed from the
/// machine's maps without copying them into vectors first, with a call to the
/// pause hook every [`PAUSE_EVERY`] entries.
struct BodyOut<'a, P>(&'a LockMachine, std::cell::RefCell<P>);

/// Entries written between calls of the pause hook of
/// [`LockMachine::to_snapshot_bytes_paced`].
const PAUSE_EVERY: usize = 1024;

impl<P: FnMut()> Serialize for BodyOut<'_, P> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        /// The maps' iterators know their length, which postcard writes first.
        struct Seq<I>(std::cell::Cell<Option<I>>);
        impl<I: Iterator<Item = T>, T: Serialize> Serialize for Seq<I> {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.collect_seq(self.0.take().expect("serialized once"))
            }
        }
        let m = self.0;
        let mut written = 0usize;
        let mut pace = || {
            written += 1;
            if written.is_multiple_of(PAUSE_EVERY) {
                (self.1.borrow_mut())();
            }
        };
        let mut body = serializer.serialize_struct("Body", 3)?;
        body.serialize_field("last_applied", &m.last_applied)?;
        let sessions = m.sessions.iter().map(|(id, s)| {
            pace();
            SessionRecord {
                id: *id,
                ttl_ms: s.ttl_ms,
                label: s.label.as_str(),
                owner: &s.owner,
                released: &s.released,
            }
        });
        body.serialize_field("sessions", &Seq(Some(sessions).into()))?;
        let locks = m.locks.iter().map(|(name, lock)| {
            pace();
            (name.as_str(), lock)
        });
        body.serialize_field("locks", &Seq(Some(locks).into()))?;
        body.end()
    }
}

impl LockMachine {
    /// The state in format 2, as earlier versions wrote it (for the test that
    /// such snapshots still load).
    #[cfg(test)]
    pub(super) fn to_format_2_bytes(&self) -> Vec<u8> {
        #[derive(Serialize)]
        struct Body2Out<'a> {
            last_applied: u64,
            sessions: Vec<(SessionId, u64, &'a str, &'a SessionOwner)>,
            locks: Vec<(&'a str, MutexRecord)>,
        }
        let body = Body2Out {
            last_applied: self.last_applied,
            sessions: self
                .sessions
                .iter()
                .map(|(id, s)| (*id, s.ttl_ms, s.label.as_str(), &s.owner))
                .collect(),
            locks: self
                .locks
                .iter()
                .map(|(n, l)| (n.as_str(), MutexRecord::of(l)))
                .collect(),
        };
        let mut out = MAGIC.to_vec();
        out.extend_from_slice(&FORMAT_2.to_le_bytes());
        out.extend_from_slice(&postcard::to_allocvec(&body).expect("to memory"));
        out
    }

    /// The state in format 3, as the versions before the recipes wrote it
    /// (mutexes only).
    #[cfg(test)]
    pub(super) fn to_format_3_bytes(&self) -> Vec<u8> {
        #[derive(Serialize)]
        struct Body3Out<'a> {
            last_applied: u64,
            sessions: Vec<SessionRecord<&'a str, &'a SessionOwner, &'a Vec<Release>>>,
            locks: Vec<(&'a str, MutexRecord)>,
        }
        let body = Body3Out {
            last_applied: self.last_applied,
            sessions: self
                .sessions
                .iter()
                .map(|(id, s)| SessionRecord {
                    id: *id,
                    ttl_ms: s.ttl_ms,
                    label: s.label.as_str(),
                    owner: &s.owner,
                    released: &s.released,
                })
                .collect(),
            locks: self
                .locks
                .iter()
                .map(|(n, l)| (n.as_str(), MutexRecord::of(l)))
                .collect(),
        };
        let mut out = MAGIC.to_vec();
        out.extend_from_slice(&FORMAT_3.to_le_bytes());
        out.extend_from_slice(&postcard::to_allocvec(&body).expect("to memory"));
        out
    }

    /// The state in format 1, the JSON of the first versions (mutexes only).
    #[cfg(test)]
    pub(super) fn to_format_1_json(&self) -> serde_json::Value {
        let locks: serde_json::Map<String, serde_json::Value> = self
            .locks
            .iter()
            .map(|(n, l)| (n.clone(), serde_json::to_value(MutexRecord::of(l)).unwrap()))
            .collect();
        serde_json::json!({
            "last_applied": self.last_applied,
            "sessions": self.sessions,
            "locks": locks,
        })
    }

    /// The whole state, `last_applied` included, in the compact snapshot format
    /// (see the [module docs](self)).
    pub fn to_snapshot_bytes(&self) -> Vec<u8> {
        self.to_snapshot_bytes_paced(|| {})
    }

    /// [`to_snapshot_bytes`](Self::to_snapshot_bytes), calling `pause` every
    /// thousand or so entries: a server encoding a large state beside live
    /// traffic can sleep there to leave the CPU to it. The bytes are the same.
    pub fn to_snapshot_bytes_paced(&self, pause: impl FnMut()) -> Vec<u8> {
        let mut out = Vec::with_capacity(64 + 32 * self.locks.len() + 64 * self.sessions.len());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&FORMAT.to_le_bytes());
        postcard::to_io(&BodyOut(self, pause.into()), &mut out)
            .expect("writing to a Vec cannot fail");
        out
    }

    /// Restores a state written by [`to_snapshot_bytes`](Self::to_snapshot_bytes)
    /// of this or an earlier version.
    ///
    /// # Errors
    /// [`SnapshotError::UnknownFormat`] for a format this version does not know,
    /// [`SnapshotError::Decode`] / [`SnapshotError::DecodeJson`] if the bytes
    /// are not such a snapshot, [`SnapshotError::Inconsistent`] if they decode to
    /// a state that breaks an invariant (see
    /// [`check_invariants`](Self::check_invariants)).
    pub fn from_snapshot_bytes(bytes: &[u8]) -> Result<Self, SnapshotError> {
        match bytes.strip_prefix(MAGIC) {
            Some(rest) => {
                let (format, body) = rest
                    .split_first_chunk::<4>()
                    .ok_or(SnapshotError::Truncated)?;
                match u32::from_le_bytes(*format) {
                    FORMAT => Ok(Self::from_body(postcard::from_bytes(body)?)?),
                    FORMAT_3 => Ok(Self::from_body(
                        postcard::from_bytes::<Body<MutexRecord>>(body)?.into(),
                    )?),
                    FORMAT_2 => Ok(Self::from_body(
                        postcard::from_bytes::<Body2>(body)?.into(),
                    )?),
                    other => Err(SnapshotError::UnknownFormat(other)),
                }
            }
            // Format 1 is a JSON object; anything else fails to parse as one.
            None => {
                let old: Format1 = serde_json::from_slice(bytes)?;
                let mut machine = LockMachine {
                    last_applied: old.last_applied,
                    sessions: old.sessions,
                    locks: old
                        .locks
                        .into_iter()
                        .map(|(n, l)| (n, LockState::from(l)))
                        .collect(),
                    ..LockMachine::default()
                };
                machine.recount_owners();
                machine.check_invariants()?;
                Ok(machine)
            }
        }
    }

    /// Builds the machine from a format 4 body, mirrors included, checking
    /// every invariant on the way (the mirrors agree with the lock table by
    /// construction, so the lookups of a full
    /// [`check_invariants`](Self::check_invariants) would be wasted).
    fn from_body(body: Body) -> Result<Self, InvariantViolation> {
        let fail = |msg: String| Err(InvariantViolation(msg));
        if body.sessions.len() > MAX_SESSIONS {
            return fail(format!("{} sessions", body.sessions.len()));
        }
        let mut machine = LockMachine {
            last_applied: body.last_applied,
            ..LockMachine::default()
        };
        // What each session holds and waits for, gathered in one pass over the
        // locks: far cheaper than a map lookup per lock.
        let mut mirrors: HashMap<SessionId, (Vec<String>, Vec<String>)> = body
            .sessions
            .iter()
            .map(|s| (s.id, Default::default()))
            .collect();
        if mirrors.len() != body.sessions.len() {
            return fail("a session is stored twice".to_owned());
        }
        for (name, lock) in body.locks {
            machine.check_lock(&name, &lock)?;
            let unknown =
                |who: SessionId| InvariantViolation(format!("session {who} of {name:?} unknown"));
            for h in &lock.holders {
                let (held, _) = mirrors
                    .get_mut(&h.session)
                    .ok_or_else(|| unknown(h.session))?;
                held.push(name.clone());
            }
            for w in &lock.waiters {
                let (_, waiting) = mirrors
                    .get_mut(&w.session)
                    .ok_or_else(|| unknown(w.session))?;
                waiting.push(name.clone());
            }
            if machine.locks.insert(name, lock).is_some() {
                return fail("a lock is stored twice".to_owned());
            }
        }
        for s in body.sessions {
            let (held, waiting) = mirrors.remove(&s.id).unwrap_or_default();
            let state = SessionState {
                ttl_ms: s.ttl_ms,
                label: s.label,
                owner: s.owner,
                held: held.into_iter().collect(),
                waiting: waiting.into_iter().collect(),
                released: s.released,
            };
            machine.check_session(s.id, &state)?;
            machine.insert_session(s.id, state);
        }
        Ok(machine)
    }
}
