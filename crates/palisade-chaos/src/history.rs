//! What a drill records.

use serde::{Deserialize, Serialize};

/// Everything one run of one scenario saw, with the seed that replays it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct History {
    /// The scenario's name.
    pub scenario: String,
    /// The scenario's variant (e.g. `jump` / `no-jump`), empty when it has none.
    #[serde(default)]
    pub variant: String,
    /// The backend under test (`redis`, `redlock`, `palisade`).
    pub backend: String,
    /// Whether the resource checked tokens.
    pub fencing: bool,
    /// The random seed of the run.
    pub seed: u64,
    /// Events in the order they were recorded.
    pub events: Vec<Event>,
}

/// One thing that happened, on the harness's monotonic clock.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// Microseconds since the run started.
    pub at_us: u64,
    /// Which client process (1, 2, …); 0 for the harness itself (faults) and
    /// for the resource's own records.
    pub client: u32,
    /// What happened.
    pub kind: EventKind,
}

/// The kinds of event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum EventKind {
    /// The client asked for the lock.
    AcquireInvoke {
        /// The lock.
        lock: String,
    },
    /// The lock was granted. `valid_until_us`: when the client's guarantee ends,
    /// if the backend says (Redis validity).
    AcquireOk {
        /// The lock.
        lock: String,
        /// The fencing token, for correctness backends.
        token: Option<u64>,
        /// End of the guaranteed validity, harness clock.
        valid_until_us: Option<u64>,
        /// What the grant holds, when it is a recipe's claim rather than a
        /// plain lock.
        #[serde(default, skip_serializing_if = "Holding::is_lock")]
        holding: Holding,
    },
    /// The acquire definitely failed.
    AcquireFail {
        /// The lock.
        lock: String,
    },
    /// The acquire's outcome is unknown (timeout, connection lost).
    AcquireUnknown {
        /// The lock.
        lock: String,
    },
    /// The client started releasing: it no longer believes it holds the lock.
    ReleaseInvoke {
        /// The lock.
        lock: String,
    },
    /// The release was confirmed.
    ReleaseOk {
        /// The lock.
        lock: String,
    },
    /// The client learnt it lost the lock (guard's `lost()`).
    LeaseLost {
        /// The lock.
        lock: String,
    },
    /// The harness injected a fault (pause, partition, kill, clock jump, heal…).
    Fault {
        /// What was done, in words (`pause client 1`, `kill redis 3`).
        what: String,
    },
    /// The resource decided on a write made under `lock` (stamped when it decided,
    /// so writes appear in the resource's own order).
    Write {
        /// The lock the writer believed it held.
        lock: String,
        /// The resource written.
        resource: String,
        /// The token presented, if any.
        token: Option<u64>,
        /// Whether the resource accepted it.
        accepted: bool,
        /// The counter value the writer had read before writing.
        read: i64,
        /// The value it wrote (`read + 1` for a counter).
        wrote: i64,
    },
    /// The resource decided on a token-checked read made under a read lock:
    /// accepted only if no write with a higher token was accepted before it.
    Read {
        /// The lock the reader believed it held.
        lock: String,
        /// The resource read.
        resource: String,
        /// The token presented.
        token: Option<u64>,
        /// Whether the resource answered it.
        accepted: bool,
    },
}

/// What a grant holds: a plain lock, or one of the recipes' claims (see
/// docs/recipes.md). Two grants on one lock may be held at once only if both
/// are reads, or both are permits in different slots.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "as", rename_all = "snake_case")]
pub enum Holding {
    /// A mutex.
    #[default]
    Lock,
    /// Permit `slot` of a semaphore of `of`.
    Permit {
        /// Which of the permits (`0..of`).
        slot: u32,
        /// The semaphore's size.
        of: u32,
    },
    /// A shared read lock.
    Read,
    /// An exclusive write lock.
    Write,
    /// Leadership of an election.
    Lead,
}

impl Holding {
    /// What a grant of `claim` in `slot` (a permit's; ignored otherwise) holds.
    pub fn of(claim: &palisade_core::machine::Claim, slot: u32) -> Holding {
        use palisade_core::machine::Claim;
        match claim {
            Claim::Lock => Holding::Lock,
            Claim::Permit { permits } => Holding::Permit { slot, of: *permits },
            Claim::Read => Holding::Read,
            Claim::Write => Holding::Write,
            Claim::Lead { .. } => Holding::Lead,
        }
    }

    /// Whether this is a plain lock (what a history without recipes holds).
    pub fn is_lock(&self) -> bool {
        *self == Holding::Lock
    }

    /// Whether a grant holding `self` and another holding `other`, on the same
    /// lock, may both be held at once.
    pub fn compatible(self, other: Holding) -> bool {
        match (self, other) {
            (Holding::Read, Holding::Read) => true,
            (Holding::Permit { slot: a, .. }, Holding::Permit { slot: b, .. }) => a != b,
            _ => false,
        }
    }

    /// What tokens are compared within: the lock for most, the slot for a
    /// permit (each slot is a mutex of its own).
    pub fn slot(self) -> Option<u32> {
        match self {
            Holding::Permit { slot, .. } => Some(slot),
            _ => None,
        }
    }
}
