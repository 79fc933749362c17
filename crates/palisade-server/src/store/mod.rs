//! Durable state: the Raft log and vote ([`log::LogStore`]) and the state machine
//! with its snapshots ([`sm::StateMachineStore`]), each in its own redb file under
//! the data directory.

pub mod log;
pub mod sm;
