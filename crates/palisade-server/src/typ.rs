//! The openraft type configuration and short names for its long generic types.

use std::fmt;
use std::io::Cursor;

use serde::{Deserialize, Serialize};

use palisade_core::machine::Command;

use crate::store::sm::{EntryResponse, StateMachineStore};

/// The commands of one log entry (see `proposer`). Serialized exactly as the
/// `Vec<Command>` it wraps, so logs written under openraft 0.9 still load.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Commands(
    /// The commands, in order.
    pub Vec<Command>,
);

impl fmt::Display for Commands {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} command(s)", self.0.len())
    }
}

/// Palisade's Raft: a log entry carries a batch of lock-machine [`Command`]s
/// (see `proposer`); applying it yields an [`EntryResponse`], handed to the
/// proposer's own responder. Written out rather than with openraft's
/// `declare_raft_types!`, which cannot name a generic responder.
#[derive(Debug, Clone, Copy, Default, Eq, PartialEq, Ord, PartialOrd)]
pub struct TypeConfig {}

impl openraft::RaftTypeConfig for TypeConfig {
    type D = Commands;
    type R = EntryResponse;
    type NodeId = u64;
    type Node = NodeAddr;
    type Term = u64;
    type LeaderId = openraft::impls::leader_id_adv::LeaderId<u64, u64>;
    type Vote = openraft::impls::Vote<Self::LeaderId>;
    type Payload = openraft::EntryPayload<Commands, u64, NodeAddr>;
    type Entry =
        openraft::Entry<<Self::LeaderId as openraft::vote::RaftLeaderId>::Committed, Self::Payload>;
    type Responder<T>
        = crate::proposer::Answer<T>
    where
        T: openraft::OptionalSend + 'static;
    type Batch<T>
        = openraft::impls::InlineBatch<T>
    where
        T: openraft::OptionalSend + 'static;
    type AsyncRuntime = crate::runtime::PalisadeRuntime;
    type ErrorSource = openraft::impls::BoxedErrorSource;
}

/// A node id (as in `--id` and `--initial-cluster`).
pub type NodeId = u64;
/// A node's address record.
pub type Node = NodeAddr;
/// Who led a term (the committed form is the same type).
pub type LeaderId = openraft::impls::leader_id_adv::LeaderId<u64, NodeId>;
/// A log entry's id: the leader that wrote it and its index.
pub type LogId = openraft::LogId<LeaderId>;
/// A node's vote.
pub type Vote = openraft::Vote<LeaderId>;
/// What a log entry carries.
pub type EntryPayload = openraft::EntryPayload<Commands, NodeId, Node>;
/// A log entry.
pub type Entry = openraft::Entry<LeaderId, EntryPayload>;
/// The membership as of a log id.
pub type StoredMembership = openraft::StoredMembership<LeaderId, NodeId, Node>;
/// What a snapshot covers.
pub type SnapshotMeta = openraft::SnapshotMeta<LeaderId, NodeId, Node>;
/// A snapshot's bytes, as the stores and the network hand them over.
pub type SnapshotData = Cursor<Vec<u8>>;
/// A snapshot: what it covers and its bytes.
pub type Snapshot = openraft::Snapshot<LeaderId, NodeId, Node, SnapshotData>;
/// The Raft handle.
pub type Raft = openraft::Raft<TypeConfig, StateMachineStore>;

/// Where a member is reached: by clients, and by peers. Stored in the
/// membership (in the log), so every node can redirect clients to the leader and
/// reach its peers.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeAddr {
    /// The client address, `HOST:PORT`.
    pub addr: String,
    /// The peer address, `HOST:PORT`. Empty in memberships written before peers
    /// had a listener of their own: then [`default_peer_addr`] of `addr`.
    #[serde(default)]
    pub peer_addr: String,
}

impl NodeAddr {
    /// A member reached at `addr` by clients and `peer_addr` by peers.
    pub fn new(addr: impl Into<String>, peer_addr: impl Into<String>) -> Self {
        NodeAddr {
            addr: addr.into(),
            peer_addr: peer_addr.into(),
        }
    }

    /// Where peers reach it.
    pub fn peer(&self) -> String {
        if self.peer_addr.is_empty() {
            default_peer_addr(&self.addr).unwrap_or_default()
        } else {
            self.peer_addr.clone()
        }
    }
}

impl fmt::Display for NodeAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (peers: {})", self.addr, self.peer())
    }
}

/// The peer address a node has when none is given: the client port + 1 on the
/// same host (as etcd pairs 2379 with 2380). `None` when `client` has no port.
pub fn default_peer_addr(client: &str) -> Option<String> {
    let (host, port) = client.rsplit_once(':')?;
    let port: u16 = port.parse().ok()?;
    Some(format!("{host}:{}", port.checked_add(1)?))
}
/// openraft's error wrapper for our config.
pub type RaftError<E = openraft::errors::Infallible> = openraft::errors::RaftError<TypeConfig, E>;
/// Errors of a client write.
pub type ClientWriteError = openraft::errors::ClientWriteError<TypeConfig>;
/// Errors of a leadership check before a linearizable read.
pub type LinearizableReadError = openraft::errors::LinearizableReadError<TypeConfig>;
/// A storage error.
pub type StorageError = openraft::StorageError<TypeConfig>;
