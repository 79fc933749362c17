//! The openraft type configuration and short names for its long generic types.

use std::io::Cursor;

use palisade_core::machine::Command;

use crate::store::sm::EntryResponse;

openraft::declare_raft_types!(
    /// Palisade's Raft: a log entry carries a batch of lock-machine [`Command`]s
    /// (see `proposer`); applying it yields an [`EntryResponse`].
    pub TypeConfig:
        D = Vec<Command>,
        R = EntryResponse,
        NodeId = u64,
        Node = openraft::BasicNode,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = Cursor<Vec<u8>>,
        AsyncRuntime = openraft::TokioRuntime,
);

/// A node id (as in `--id` and `--initial-cluster`).
pub type NodeId = u64;
/// The Raft handle.
pub type Raft = openraft::Raft<TypeConfig>;
/// A node's address record.
pub type Node = openraft::BasicNode;
/// openraft's error wrapper for our config.
pub type RaftError<E = openraft::error::Infallible> = openraft::error::RaftError<NodeId, E>;
/// Errors of a client write.
pub type ClientWriteError = openraft::error::ClientWriteError<NodeId, Node>;
/// Errors of a leadership check.
pub type CheckIsLeaderError = openraft::error::CheckIsLeaderError<NodeId, Node>;
/// A storage error.
pub type StorageError = openraft::StorageError<NodeId>;
