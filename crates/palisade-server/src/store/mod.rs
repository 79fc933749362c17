//! Durable state: the Raft log and vote ([`log::LogStore`], in Palisade's own
//! write-ahead log, [`wal`]) and the state machine with its snapshots
//! ([`sm::StateMachineStore`], its snapshot in [`snapshot`]), under the data
//! directory, which [`dir_lock`] keeps to one process.

pub mod dir_lock;
pub mod log;
pub mod sm;
pub mod snapshot;
pub mod wal;
