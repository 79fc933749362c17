//! The client's own view of what the server reports: no wire types, and no `0`
//! standing for "none".

use std::fmt;
use std::num::NonZeroU64;

use palisade_core::FencingToken;
use palisade_proto::v1;

use crate::ClientError;

/// A session's id as the cluster assigned it (never zero).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SessionId(NonZeroU64);

impl SessionId {
    /// The id from its wire form; `None` for 0, which the wire uses for "none".
    pub fn new(id: u64) -> Option<SessionId> {
        NonZeroU64::new(id).map(SessionId)
    }

    /// The number.
    pub fn get(self) -> u64 {
        self.0.get()
    }
}

impl fmt::Display for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// The current holder of a lock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holder {
    /// Its session.
    pub session: SessionId,
    /// The label the session was opened with.
    pub label: String,
    /// The token of its grant.
    pub token: FencingToken,
    /// A reader or a semaphore permit holder, beside others.
    pub shared: bool,
    /// A semaphore permit's slot (`0` otherwise).
    pub slot: u32,
    /// An election leader's value (empty otherwise).
    pub value: String,
}

/// What the leader says of a token for a lock ([`crate::Admin::token_status`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TokenStatus {
    /// Whether the token is the lock's current grant.
    pub current: bool,
    /// The current holder's token, `None` when the lock is not held.
    pub current_token: Option<FencingToken>,
    /// No token above this has been issued by the cluster (for any lock): a
    /// larger one comes "from the future" — it was made up, not granted.
    pub issued_through: u64,
}

/// One lock as the leader sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockView {
    /// Its name.
    pub name: String,
    /// Who holds it (of several holders, the newest); `None` while free (in
    /// lock-delay, or only waiters).
    pub holder: Option<Holder>,
    /// `mutex`, `semaphore`, `read_write` or `election`.
    pub shape: String,
    /// A semaphore's size (`0` for other shapes).
    pub permits: u32,
    /// Every holder, in grant order.
    pub holders: Vec<Holder>,
    /// The sessions waiting for it, in grant order.
    pub waiters: Vec<SessionId>,
    /// Whether it is kept unavailable after a holder's session expired.
    pub in_lock_delay: bool,
}

impl TryFrom<v1::LockInfo> for LockView {
    type Error = ClientError;

    fn try_from(l: v1::LockInfo) -> Result<Self, ClientError> {
        let holder = match (SessionId::new(l.holder_session), FencingToken::new(l.token)) {
            (Some(session), Some(token)) => Some(Holder {
                session,
                label: l.holder_label,
                token,
                shared: false,
                slot: 0,
                value: String::new(),
            }),
            (None, _) => None,
            (Some(session), None) => {
                return Err(ClientError::Protocol(format!(
                    "lock {:?} held by session {session} without a token",
                    l.name
                )));
            }
        };
        let waiters = l
            .waiters
            .into_iter()
            .map(|w| {
                SessionId::new(w)
                    .ok_or_else(|| ClientError::Protocol(format!("waiter 0 on {:?}", l.name)))
            })
            .collect::<Result<_, _>>()?;
        let mut holders = l
            .holders
            .into_iter()
            .map(|h| {
                let bad = || {
                    ClientError::Protocol(format!("a holder of {:?} without id or token", l.name))
                };
                Ok(Holder {
                    session: SessionId::new(h.session).ok_or_else(bad)?,
                    label: h.label,
                    token: FencingToken::new(h.token).ok_or_else(bad)?,
                    shared: h.shared,
                    slot: h.slot,
                    value: h.value,
                })
            })
            .collect::<Result<Vec<_>, ClientError>>()?;
        // A server from before the recipes lists no holders: its one holder is it.
        if holders.is_empty() {
            holders.extend(holder.clone());
        }
        let holder = holders.iter().max_by_key(|h| h.token).cloned().or(holder);
        let shape = if l.shape.is_empty() {
            "mutex".to_owned()
        } else {
            l.shape
        };
        Ok(LockView {
            name: l.name,
            holder,
            shape,
            permits: l.permits,
            holders,
            waiters,
            in_lock_delay: l.in_lock_delay,
        })
    }
}

/// A member of the cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    /// Its node id.
    pub id: u64,
    /// Where clients reach it.
    pub addr: String,
    /// Where peers reach it.
    pub peer_addr: String,
}

/// The cluster as the answering node sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterStatus {
    /// The node that answered.
    pub id: u64,
    /// The leader it knows of, if any.
    pub leader: Option<u64>,
    /// Its current term.
    pub term: u64,
    /// The highest log index it knows to be committed.
    pub commit_index: u64,
    /// The highest log index its state machine has applied.
    pub last_applied: u64,
    /// The voters.
    pub members: Vec<Member>,
    /// The learners (receive the log, do not vote).
    pub learners: Vec<Member>,
    /// Its Raft role (`Leader`, `Follower`, …).
    pub state: String,
    /// Its current snapshot, if it has one.
    pub snapshot: Option<SnapshotInfo>,
    /// Median and 99th percentile, over its last 1,024 batches of log
    /// entries, of the time from appending a batch to applying it: on the
    /// leader, the commit latency. `None` before any.
    pub commit_latency: Option<(std::time::Duration, std::time::Duration)>,
}

/// A snapshot taken on request ([`crate::Admin::take_snapshot`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TakenSnapshot {
    /// The node that took it.
    pub id: u64,
    /// The last log index it covers.
    pub index: u64,
    /// Its size in bytes.
    pub bytes: u64,
    /// How long building it took.
    pub build: std::time::Duration,
}

/// A node's current snapshot and what its latest snapshots cost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SnapshotInfo {
    /// The last log index it covers.
    pub index: u64,
    /// Its size in bytes.
    pub bytes: u64,
    /// The node's last build of a snapshot since it started.
    pub last_build: Option<std::time::Duration>,
    /// The node's last install of a snapshot sent by the leader since it started.
    pub last_install: Option<std::time::Duration>,
}

impl From<v1::Member> for Member {
    fn from(m: v1::Member) -> Self {
        Member {
            id: m.id,
            addr: m.addr,
            peer_addr: m.peer_addr,
        }
    }
}

impl From<v1::StatusResponse> for ClusterStatus {
    fn from(s: v1::StatusResponse) -> Self {
        ClusterStatus {
            id: s.id,
            leader: (s.leader != 0).then_some(s.leader),
            term: s.term,
            commit_index: s.commit_index,
            last_applied: s.last_applied,
            members: s.members.into_iter().map(Member::from).collect(),
            learners: s.learners.into_iter().map(Member::from).collect(),
            state: s.state,
            snapshot: (s.snapshot_index != 0).then(|| SnapshotInfo {
                index: s.snapshot_index,
                bytes: s.snapshot_bytes,
                last_build: s.snapshot_build_us.map(std::time::Duration::from_micros),
                last_install: s.snapshot_install_us.map(std::time::Duration::from_micros),
            }),
            commit_latency: s.commit_p50_us.zip(s.commit_p99_us).map(|(p50, p99)| {
                (
                    std::time::Duration::from_micros(p50),
                    std::time::Duration::from_micros(p99),
                )
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_means_none_on_the_wire_only() {
        assert_eq!(SessionId::new(0), None);
        let free = LockView::try_from(v1::LockInfo {
            name: "a".into(),
            holder_session: 0,
            holder_label: String::new(),
            token: 0,
            waiters: vec![3],
            in_lock_delay: true,
            ..Default::default()
        })
        .unwrap();
        assert_eq!(free.holder, None);
        assert_eq!(free.waiters, vec![SessionId::new(3).unwrap()]);
        let held = LockView::try_from(v1::LockInfo {
            name: "a".into(),
            holder_session: 7,
            holder_label: "x".into(),
            token: 9,
            waiters: vec![],
            in_lock_delay: false,
            ..Default::default()
        })
        .unwrap();
        assert_eq!(held.holder.unwrap().token.get(), 9);
        let broken = v1::LockInfo {
            name: "a".into(),
            holder_session: 7,
            token: 0,
            ..Default::default()
        };
        assert!(matches!(
            LockView::try_from(broken),
            Err(ClientError::Protocol(_))
        ));
        let status = ClusterStatus::from(v1::StatusResponse {
            leader: 0,
            ..Default::default()
        });
        assert_eq!(status.leader, None);
    }
}
