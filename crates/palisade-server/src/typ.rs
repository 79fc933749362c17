//! The openraft type configuration and short names for its long generic types.

use std::fmt;
use std::io::Cursor;

use serde::{Deserialize, Serialize};

use palisade_core::machine::Command;

use crate::store::sm::EntryResponse;

openraft::declare_raft_types!(
    /// Palisade's Raft: a log entry carries a batch of lock-machine [`Command`]s
    /// (see `proposer`); applying it yields an [`EntryResponse`].
    pub TypeConfig:
        D = Vec<Command>,
        R = EntryResponse,
        NodeId = u64,
        Node = NodeAddr,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = Cursor<Vec<u8>>,
        AsyncRuntime = openraft::TokioRuntime,
);

/// A node id (as in `--id` and `--initial-cluster`).
pub type NodeId = u64;
/// The Raft handle.
pub type Raft = openraft::Raft<TypeConfig>;
/// A node's address record.
pub type Node = NodeAddr;

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
pub type RaftError<E = openraft::error::Infallible> = openraft::error::RaftError<NodeId, E>;
/// Errors of a client write.
pub type ClientWriteError = openraft::error::ClientWriteError<NodeId, Node>;
/// Errors of a leadership check.
pub type CheckIsLeaderError = openraft::error::CheckIsLeaderError<NodeId, Node>;
/// A storage error.
pub type StorageError = openraft::StorageError<NodeId>;
