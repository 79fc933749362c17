//! The recipes beyond the mutex: what a name is ([`Shape`]) and what a session
//! asks of it ([`Claim`]).
//!
//! Every recipe is the same lock table underneath: a name has holders, a FIFO
//! queue and (for exclusive holders) a lock-delay, and every grant's token is
//! the index of the entry that made it. What differs is how many holders a
//! name admits at once and which of them may share it:
//!
//! | shape | holders at once | claims |
//! |---|---|---|
//! | [`Shape::Mutex`] | one | [`Claim::Lock`] |
//! | [`Shape::Semaphore`] | up to `permits`, each in its own slot | [`Claim::Permit`] |
//! | [`Shape::ReadWrite`] | up to [`MAX_READERS`] readers, or one writer | [`Claim::Read`], [`Claim::Write`] |
//! | [`Shape::Election`] | one leader, with a value | [`Claim::Lead`] |
//!
//! The queue is strictly FIFO for every shape: a claim is granted at once only
//! when nobody waits and it fits beside the holders, and a hand-off grants
//! waiters from the front for as long as they fit. For a read/write lock that
//! means a reader arriving behind a waiting writer waits too, so writers are
//! never starved by a stream of readers, and readers queued together behind a
//! writer are all granted by the entry that ends the write. Why FIFO rather than
//! writer preference: it starves neither side, and every grant is explained by
//! arrival order alone, which is what a user reads off `palisade locks`.
//!
//! What the tokens promise, per shape:
//! - mutex, election: every grant's token is above every earlier grant's, so a
//!   resource that keeps the highest token it saw refuses a holder that was
//!   overtaken (a paused leader after a new one was elected);
//! - semaphore: a permit's slot (`0..permits`) is handed to one holder at a
//!   time and every grant of a slot has a larger token than the last, so a
//!   resource fenced per `(name, slot)` refuses a permit holder whose slot was
//!   handed on;
//! - read/write: a writer's token is above every token granted before it
//!   (readers included), and readers granted together share one token. A store
//!   that refuses writes below the highest token it saw and reads below the
//!   highest write token refuses a reader overtaken by a writer.

use serde::{Deserialize, Serialize};

use super::error::MachineError;

/// Most permits one semaphore may have: the same bound as a lock's queue.
pub const MAX_PERMITS: u32 = super::MAX_WAITERS_PER_LOCK as u32;

/// Most readers of one read/write lock at once; more wait their turn.
pub const MAX_READERS: usize = super::MAX_WAITERS_PER_LOCK;

/// Longest value a candidate or leader may carry, in bytes (etcd's election
/// values are meant for an address or an id, not for data).
pub const MAX_VALUE_LEN: usize = 1024;

/// What a name is, fixed by the claim that creates its entry and kept while it
/// has holders, waiters or a lock-delay. A claim of another shape on it is
/// refused with [`MachineError::ShapeMismatch`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Shape {
    /// One holder at a time: the plain lock.
    Mutex,
    /// At most `permits` holders at once, each in its own numbered slot.
    Semaphore {
        /// How many holders at once, `1..=`[`MAX_PERMITS`].
        permits: u32,
    },
    /// Readers (up to [`MAX_READERS`] at once), or one writer.
    ReadWrite,
    /// One leader at a time, who carries a value; the waiters are candidates.
    Election,
}

impl Shape {
    /// How many holders the name admits at once.
    pub fn capacity(self) -> usize {
        match self {
            Shape::Mutex | Shape::Election => 1,
            Shape::Semaphore { permits } => permits as usize,
            // Readers beyond this wait, as behind a full semaphore: it bounds
            // the work of each grant and release (linear in the holders).
            Shape::ReadWrite => MAX_READERS,
        }
    }

    /// Every shape's [`as_str`](Self::as_str), in [`index`](Self::index) order.
    pub const NAMES: [&'static str; 4] = ["mutex", "semaphore", "read_write", "election"];

    /// This shape's place in [`NAMES`](Self::NAMES), for tallies by shape.
    pub fn index(self) -> usize {
        match self {
            Shape::Mutex => 0,
            Shape::Semaphore { .. } => 1,
            Shape::ReadWrite => 2,
            Shape::Election => 3,
        }
    }

    /// The word `palisade locks` and the status page show.
    pub fn as_str(self) -> &'static str {
        Self::NAMES[self.index()]
    }
}

impl std::fmt::Display for Shape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Shape::Semaphore { permits } => write!(f, "semaphore of {permits} permits"),
            Shape::ReadWrite => f.write_str("read/write lock"),
            other => f.write_str(other.as_str()),
        }
    }
}

/// Whether a holder keeps the name to itself or shares it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Alone: a mutex holder, a writer, a leader.
    Exclusive,
    /// Beside others of its kind: a permit holder, a reader.
    Shared,
}

/// What one session asks of a name.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Claim {
    /// The name as a mutex.
    #[default]
    Lock,
    /// One permit of a semaphore of `permits`.
    Permit {
        /// The semaphore's size; every claim on the name must agree on it.
        permits: u32,
    },
    /// A read lock: shared with other readers.
    Read,
    /// A write lock: alone.
    Write,
    /// Leadership of an election, as a candidate carrying `value`.
    Lead {
        /// What observers see while this candidate leads (an address, an id),
        /// at most [`MAX_VALUE_LEN`] bytes.
        value: String,
    },
}

impl Claim {
    /// The shape of name this claim fits.
    pub fn shape(&self) -> Shape {
        match self {
            Claim::Lock => Shape::Mutex,
            Claim::Permit { permits } => Shape::Semaphore { permits: *permits },
            Claim::Read | Claim::Write => Shape::ReadWrite,
            Claim::Lead { .. } => Shape::Election,
        }
    }

    /// Whether the claim wants the name to itself.
    pub fn mode(&self) -> Mode {
        match self {
            Claim::Lock | Claim::Write | Claim::Lead { .. } => Mode::Exclusive,
            Claim::Permit { .. } | Claim::Read => Mode::Shared,
        }
    }

    /// The value a candidate carries (empty for every other claim).
    pub fn value(&self) -> &str {
        match self {
            Claim::Lead { value } => value,
            _ => "",
        }
    }

    /// The checks that need no state: the permit count, the value's length,
    /// and that only an exclusive claim asks for a lock-delay (a lock-delay
    /// keeps the whole name unavailable after its holder expired, which only
    /// makes sense for a holder that had it alone).
    ///
    /// # Errors
    /// The refusal the machine would give.
    pub fn check(&self, lock_delay_ms: u64) -> Result<(), MachineError> {
        if let Claim::Permit { permits } = self
            && !(1..=MAX_PERMITS).contains(permits)
        {
            return Err(MachineError::BadPermits {
                permits: *permits,
                limit: MAX_PERMITS,
            });
        }
        check_value(self.value())?;
        if lock_delay_ms > 0 && self.mode() == Mode::Shared {
            return Err(MachineError::LockDelayNeedsExclusive {
                shape: self.shape(),
            });
        }
        Ok(())
    }
}

/// An election value's bound.
pub(crate) fn check_value(value: &str) -> Result<(), MachineError> {
    if value.len() > MAX_VALUE_LEN {
        return Err(MachineError::ValueTooLong {
            len: value.len(),
            limit: MAX_VALUE_LEN,
        });
    }
    Ok(())
}

/// Bugs planted on purpose in the recipes' rules, each a one-line departure
/// from them, so the simulator's own tests (and `palisade sim --plant`) can
/// show that its checks catch them. All off anywhere else; never stored or
/// replicated, so every node is given them by its process.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RecipeBugs {
    /// A semaphore admits one permit more than it has.
    pub extra_permit: bool,
    /// A writer is let in while readers hold (as if it were a reader).
    pub writer_beside_readers: bool,
    /// An election seats a second leader beside the first.
    pub second_leader: bool,
}
