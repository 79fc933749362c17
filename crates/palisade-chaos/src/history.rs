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
}
