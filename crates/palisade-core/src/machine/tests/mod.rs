//! Tests of the lock state machine: one unit test per rule, plus a property test
//! over random command sequences.

mod proptests;
mod recipes;
mod unit;

use super::*;
use crate::FencingToken;

/// A machine plus the next log index to use, so tests read like a log.
struct Harness {
    m: LockMachine,
    next: u64,
}

impl Harness {
    fn new() -> Self {
        Self {
            m: LockMachine::new(),
            next: 1,
        }
    }

    fn apply(&mut self, cmd: Command) -> Applied {
        let index = self.next;
        self.next += 1;
        let applied = self.m.apply(index, cmd);
        assert_eq!(applied.index, index);
        assert_eq!(self.m.last_applied(), index);
        self.m.check_invariants().unwrap();
        applied
    }

    /// Like [`apply`](Self::apply) without the full invariant check, for loops
    /// that build states of thousands of entries.
    fn bulk(&mut self, cmd: Command) -> Applied {
        let index = self.next;
        self.next += 1;
        self.m.apply(index, cmd)
    }

    fn session(&mut self) -> SessionId {
        match self.apply(create(10_000, "test")).outcome {
            Ok(Reply::SessionCreated { session }) => session,
            other => panic!("session not created: {other:?}"),
        }
    }

    /// Applies `cmd`, asserts it left the state as it was (apart from
    /// `last_applied`), and returns what it applied.
    fn unchanged(&mut self, cmd: Command) -> Applied {
        let before = self.m.to_snapshot_bytes();
        let applied = self.apply(cmd);
        assert!(applied.grants.is_empty(), "granted: {:?}", applied.grants);
        let mut expected = LockMachine::from_snapshot_bytes(&before).unwrap();
        expected.last_applied = applied.index;
        assert_eq!(self.m, expected);
        assert_eq!(self.m.to_snapshot_bytes(), expected.to_snapshot_bytes());
        applied
    }

    /// Applies `cmd`, asserts it was refused and changed nothing, returns why.
    fn refused(&mut self, cmd: Command) -> MachineError {
        let applied = self.unchanged(cmd);
        applied
            .outcome
            .expect_err("command should have been refused")
    }
}

fn tok(v: u64) -> FencingToken {
    FencingToken::new(v).unwrap()
}

fn create(ttl_ms: u64, label: &str) -> Command {
    Command::CreateSession {
        ttl_ms,
        label: label.to_owned(),
        owner: Default::default(),
    }
}

fn acquire(session: SessionId, name: &str, wait: bool, lock_delay_ms: u64) -> Command {
    Command::Acquire {
        session,
        name: name.to_owned(),
        wait,
        lock_delay_ms,
    }
}

fn release(session: SessionId, name: &str, token: FencingToken) -> Command {
    Command::Release {
        session,
        name: name.to_owned(),
        token,
    }
}

fn cancel(session: SessionId, name: &str) -> Command {
    Command::CancelWait {
        session,
        name: name.to_owned(),
    }
}

fn end_delay(name: &str) -> Command {
    Command::EndLockDelay {
        name: name.to_owned(),
        since: None,
    }
}

fn claim(session: SessionId, name: &str, claim: Claim, wait: bool) -> Command {
    Command::Claim {
        session,
        name: name.to_owned(),
        claim,
        wait,
        lock_delay_ms: 0,
    }
}
