//! What the status page shows (`GET /status.json`): every member with its role,
//! term, indices and health, each asked over the peer port (`NodeStatus`); the
//! locks with holder, token, waiters and time left (the leader's countdowns);
//! and the latest expiries and lock-delays.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use openraft::async_runtime::Instant as _;
use openraft::async_runtime::WatchReceiver;
use palisade_core::machine::{Mode, SessionId, Shape};
use palisade_proto::h2_channel::{H2Channel, TlsDialing};
use palisade_proto::v1::RaftPayload;
use palisade_proto::v1::raft_client::RaftClient;
use serde::{Deserialize, Serialize};

use crate::leases::LeaseKeeper;
use crate::store::sm::{RecentEvent, Shared};
use crate::typ::{NodeId, Raft};

/// Most locks listed; the total is given beside them.
pub const MAX_LOCKS_SHOWN: usize = 500;

/// How long a member has to answer before the page calls it unreachable.
const ASK_TIMEOUT: Duration = Duration::from_millis(800);

/// What one member is asked (`NodeStatus`): the sessions and delayed locks
/// whose time left the asker wants, answered only by the leader.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct ReportRequest {
    /// Sessions whose lease countdown to report.
    pub sessions: Vec<u64>,
    /// Locks in lock-delay whose remaining delay to report.
    pub delayed: Vec<String>,
}

/// A member's own account of itself.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct NodeReport {
    /// Its id.
    pub id: NodeId,
    /// `leader`, `follower`, `candidate`, `learner` or `shutdown`.
    pub role: String,
    /// Its term.
    pub term: u64,
    /// The leader it knows.
    pub leader: Option<NodeId>,
    /// Index of the last entry in its log.
    pub last_log_index: u64,
    /// Index of the last entry it knows committed.
    pub commit_index: u64,
    /// Index of the last entry applied to its lock state.
    pub applied_index: u64,
    /// Last index covered by its snapshot.
    pub snapshot_index: u64,
    /// The leader's countdown of each requested session, in milliseconds.
    pub lease_left_ms: BTreeMap<u64, u64>,
    /// The leader's countdown of each requested lock-delay, in milliseconds.
    pub delay_left_ms: BTreeMap<String, u64>,
    /// On the leader: each other member's replication progress.
    pub peers: BTreeMap<NodeId, PeerProgress>,
}

/// How far a member is behind, as the leader sees it.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub struct PeerProgress {
    /// Entries of the leader's log it has not stored.
    pub lag: u64,
    /// Milliseconds since it last acknowledged the leader.
    pub last_ack_ms: Option<u64>,
}

/// One member as the page shows it.
#[derive(Debug, Serialize)]
pub struct MemberStatus {
    /// Its id.
    pub id: NodeId,
    /// Where clients reach it.
    pub addr: String,
    /// Whether it votes (otherwise a learner).
    pub voter: bool,
    /// `up` when it answered, `unreachable` when it did not.
    pub health: &'static str,
    /// Why it did not answer.
    pub error: Option<String>,
    /// Its own report, when it answered.
    pub report: Option<NodeReport>,
    /// Entries of the leader's log it has not stored (known to the leader only).
    pub lag: Option<u64>,
    /// Milliseconds since it last acknowledged the leader (leader only).
    pub last_ack_ms: Option<u64>,
}

/// One lock as the page shows it.
#[derive(Debug, Serialize)]
pub struct LockStatus {
    /// Its name (the page shows it as text, never as markup).
    pub name: String,
    /// The holding session.
    pub holder: Option<u64>,
    /// The holding session's label.
    pub holder_label: Option<String>,
    /// The holder's fencing token (the newest grant's, for a recipe held by
    /// several).
    pub token: Option<u64>,
    /// `mutex`, `semaphore`, `read_write` or `election` (docs/recipes.md).
    pub shape: &'static str,
    /// A semaphore's size (0 for the other shapes).
    pub permits: u32,
    /// Every holder in grant order (one for a mutex, a writer, a leader).
    pub holders: Vec<HolderStatus>,
    /// Queued sessions, next in line first, with their labels.
    pub waiters: Vec<(u64, String)>,
    /// Whether the lock is in lock-delay.
    pub in_lock_delay: bool,
    /// The leader's countdown: the holder's lease, or the lock-delay; `None`
    /// when no leader could be asked.
    pub time_left_ms: Option<u64>,
}

/// One holder of a lock as the page shows it.
#[derive(Debug, Serialize)]
pub struct HolderStatus {
    /// The holding session.
    pub session: u64,
    /// Its label.
    pub label: String,
    /// Its grant's fencing token.
    pub token: u64,
    /// A reader or a permit (held beside others), rather than alone.
    pub shared: bool,
    /// A semaphore permit's slot (0 for the other shapes).
    pub slot: u32,
    /// An election leader's value (empty for the other shapes).
    pub value: String,
}

/// Everything `/status.json` answers.
#[derive(Debug, Serialize)]
pub struct ClusterStatus {
    /// The node that answered.
    pub node: NodeId,
    /// The leader it knows.
    pub leader: Option<NodeId>,
    /// Its term.
    pub term: u64,
    /// Every member, by id.
    pub members: Vec<MemberStatus>,
    /// The first [`MAX_LOCKS_SHOWN`] locks by name.
    pub locks: Vec<LockStatus>,
    /// How many locks are held or in lock-delay in all.
    pub locks_total: u64,
    /// Queued acquires over all locks.
    pub waiters_total: u64,
    /// Live sessions.
    pub sessions: u64,
    /// The latest expiries and lock-delays this node applied, newest first.
    pub recent: Vec<RecentEvent>,
}

/// Builds reports and the page's data for one node.
pub struct StatusSource {
    raft: Raft,
    shared: Arc<Shared>,
    leases: Arc<LeaseKeeper>,
    committed: Arc<dyn Fn() -> u64 + Send + Sync>,
    tls: Option<TlsDialing>,
    io: crate::io::Io,
    /// One channel per member, made on first use.
    /// Ordered: connections close in one order when the node stops (a
    /// simulation's replay sends the same packets in the same order).
    peers: Mutex<BTreeMap<NodeId, (String, RaftClient<H2Channel>)>>,
}

impl StatusSource {
    /// A source for the node run by `raft`; `tls` and `io` dial peers as Raft
    /// does.
    pub fn new(
        raft: Raft,
        shared: Arc<Shared>,
        leases: Arc<LeaseKeeper>,
        committed: Arc<dyn Fn() -> u64 + Send + Sync>,
        tls: Option<TlsDialing>,
        io: crate::io::Io,
    ) -> Self {
        StatusSource {
            raft,
            shared,
            leases,
            committed,
            tls,
            io,
            peers: Mutex::default(),
        }
    }

    /// This node's report; the countdowns only if it leads.
    pub fn report(&self, req: &ReportRequest) -> NodeReport {
        let m = self.raft.metrics().borrow_watched().clone();
        let (lease_left_ms, delay_left_ms) = self
            .leases
            .time_left(
                req.sessions.iter().map(|s| SessionId(*s)),
                req.delayed.iter().map(String::as_str),
            )
            .map(|(sessions, delays)| {
                let ms = |d: Duration| d.as_millis() as u64;
                (
                    sessions.into_iter().map(|(s, d)| (s.0, ms(d))).collect(),
                    delays.into_iter().map(|(n, d)| (n, ms(d))).collect(),
                )
            })
            .unwrap_or_default();
        let last_log = m.last_log_index.unwrap_or(0);
        let peers = m
            .replication
            .iter()
            .flatten()
            .filter(|(id, _)| **id != m.id)
            .map(|(id, matched)| {
                let acked = m
                    .heartbeat
                    .as_ref()
                    .and_then(|h| h.get(id).cloned().flatten());
                (
                    *id,
                    PeerProgress {
                        lag: last_log.saturating_sub(matched.as_ref().map_or(0, |l| l.index)),
                        last_ack_ms: acked.map(|a| a.elapsed().as_millis() as u64),
                    },
                )
            })
            .collect();
        NodeReport {
            id: m.id,
            role: format!("{:?}", m.state).to_lowercase(),
            term: m.current_term,
            leader: m.current_leader,
            last_log_index: m.last_log_index.unwrap_or(0),
            commit_index: (self.committed)(),
            applied_index: m.last_applied.map_or(0, |l| l.index),
            snapshot_index: m.snapshot.map_or(0, |l| l.index),
            lease_left_ms,
            delay_left_ms,
            peers,
        }
    }

    /// Asks member `id` at `peer_addr` for its report.
    async fn ask(
        &self,
        id: NodeId,
        peer_addr: &str,
        req: &ReportRequest,
    ) -> Result<NodeReport, String> {
        let client = {
            let mut peers = self.peers.lock().expect("poisoned");
            match peers.get(&id) {
                // A member re-added at another address gets a new channel.
                Some((addr, client)) if addr == peer_addr => client.clone(),
                _ => {
                    let channel =
                        crate::network::peer_channel(&self.io, self.tls.as_ref(), id, peer_addr)
                            .ok_or_else(|| format!("unusable address {peer_addr}"))?;
                    let client = RaftClient::new(channel);
                    peers.insert(id, (peer_addr.to_owned(), client.clone()));
                    client
                }
            }
        };
        let json = serde_json::to_vec(req).map_err(|e| e.to_string())?;
        let mut request = tonic::Request::new(RaftPayload {
            json,
            data: Vec::new(),
        });
        request.set_timeout(ASK_TIMEOUT);
        let reply = tokio::time::timeout(ASK_TIMEOUT, client.clone().node_status(request))
            .await
            .map_err(|_| "no answer in time".to_owned())?
            .map_err(|s| s.message().to_owned())?;
        serde_json::from_slice(&reply.into_inner().json).map_err(|e| e.to_string())
    }

    /// Everything the page shows, asking every other member meanwhile.
    pub async fn cluster(&self) -> ClusterStatus {
        let m = self.raft.metrics().borrow_watched().clone();
        let me = m.id;
        // A clone of the persistent state is O(1); everything below reads it
        // without holding up the entries applied meanwhile.
        let machine = self.shared.machine.read().expect("poisoned").clone();
        let counts = machine.counts();
        let locks = machine.list_up_to(MAX_LOCKS_SHOWN);
        let wanted = ReportRequest {
            sessions: locks.iter().filter_map(|l| l.holder.map(|s| s.0)).collect(),
            delayed: locks
                .iter()
                .filter(|l| l.in_lock_delay)
                .map(|l| l.name.clone())
                .collect(),
        };
        let membership = m.membership_config.membership().clone();
        let voters: Vec<NodeId> = membership.voter_ids().collect();
        let asks = membership.nodes().map(|(id, node)| {
            let (id, peer) = (*id, node.peer());
            let wanted = &wanted;
            async move {
                let answer = if id == me {
                    Ok(self.report(wanted))
                } else {
                    self.ask(id, &peer, wanted).await
                };
                (id, answer)
            }
        });
        let answers: HashMap<NodeId, Result<NodeReport, String>> =
            futures_util::future::join_all(asks)
                .await
                .into_iter()
                .collect();
        // Progress and countdowns are the leader's: its own report, or the
        // answer of the member that says it leads.
        let leader_report = answers
            .values()
            .filter_map(|a| a.as_ref().ok())
            .find(|r| r.role == "leader");
        let members = membership
            .nodes()
            .map(|(id, node)| {
                let answer = answers.get(id);
                let report = answer.and_then(|a| a.as_ref().ok()).cloned();
                let progress = leader_report.and_then(|r| r.peers.get(id));
                MemberStatus {
                    id: *id,
                    addr: node.addr.clone(),
                    voter: voters.contains(id),
                    health: if report.is_some() {
                        "up"
                    } else {
                        "unreachable"
                    },
                    error: answer.and_then(|a| a.as_ref().err()).cloned(),
                    lag: progress.map(|p| p.lag),
                    last_ack_ms: progress.and_then(|p| p.last_ack_ms),
                    report,
                }
            })
            .collect();
        let locks = locks
            .into_iter()
            .map(|l| {
                let time_left_ms = leader_report.and_then(|r| match l.holder {
                    Some(s) => r.lease_left_ms.get(&s.0).copied(),
                    None => r.delay_left_ms.get(&l.name).copied(),
                });
                let label = |s: SessionId| machine.session_label(s).unwrap_or("").to_owned();
                let holders = l
                    .holders
                    .iter()
                    .map(|h| HolderStatus {
                        session: h.session.0,
                        label: label(h.session),
                        token: h.token.get(),
                        shared: h.mode == Mode::Shared,
                        slot: h.slot,
                        value: h.value.clone(),
                    })
                    .collect();
                LockStatus {
                    holder_label: l.holder.map(label),
                    holder: l.holder.map(|s| s.0),
                    token: l.token.map(|t| t.get()),
                    shape: l.shape.as_str(),
                    permits: match l.shape {
                        Shape::Semaphore { permits } => permits,
                        _ => 0,
                    },
                    holders,
                    waiters: l.waiters.iter().map(|w| (w.0, label(*w))).collect(),
                    in_lock_delay: l.in_lock_delay,
                    time_left_ms,
                    name: l.name,
                }
            })
            .collect();
        let mut recent = self.shared.recent();
        recent.reverse();
        ClusterStatus {
            node: me,
            leader: m.current_leader,
            term: m.current_term,
            members,
            locks,
            locks_total: counts.held + counts.in_lock_delay,
            waiters_total: counts.waiters,
            sessions: counts.sessions,
            recent,
        }
    }
}
