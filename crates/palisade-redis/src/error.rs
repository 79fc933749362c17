//! The one error type of this crate.

use std::fmt;
use std::time::Duration;

use palisade_core::InputError;

/// How the nodes answered one round of requests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NodeCounts {
    /// Nodes that granted (or, for extend/release, still held our value).
    pub granted: usize,
    /// Nodes that answered no: the key is held by another value.
    pub refused: usize,
    /// Nodes that did not answer within the per-node timeout.
    pub timed_out: usize,
    /// Nodes that answered with an error, or could not be reached.
    pub failed: usize,
    /// Nodes not asked because their uptime is below the configured minimum
    /// (the "delayed restart" rule).
    pub ineligible: usize,
    /// Nodes whose answer was not needed: the outcome was settled without them.
    pub unsettled: usize,
}

impl fmt::Display for NodeCounts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} granted, {} refused, {} timed out, {} failed",
            self.granted, self.refused, self.timed_out, self.failed
        )?;
        if self.ineligible > 0 {
            write!(f, ", {} too recently restarted", self.ineligible)?;
        }
        if self.unsettled > 0 {
            write!(f, ", {} not awaited", self.unsettled)?;
        }
        Ok(())
    }
}

/// Everything that can go wrong with a Redis lock.
#[derive(Debug, thiserror::Error)]
pub enum RedisLockError {
    /// The request itself is unusable; nothing was sent.
    #[error("invalid input: {0}")]
    InvalidInput(#[from] InputError),
    /// Fewer than a majority of the nodes granted.
    #[error("no quorum: needed {needed} of {nodes} nodes, got {counts}{}", failures.iter().map(|f| format!("; {f}")).collect::<String>())]
    NoQuorum {
        /// Nodes needed: ⌊N/2⌋+1.
        needed: usize,
        /// Nodes in the set.
        nodes: usize,
        /// How the nodes answered.
        counts: NodeCounts,
        /// `URL: why` for each node that timed out or failed (connection
        /// refused, an error reply).
        failures: Vec<String>,
    },
    /// A majority granted, but too slowly: what is left of the lease after the
    /// elapsed time and the drift allowance is not enough for the stated work.
    /// The lock was released on every node.
    #[error(
        "validity exhausted: {ttl:?} ttl - {elapsed:?} elapsed - {drift:?} drift leaves \
         {remaining:?}, the work needs {required:?}"
    )]
    ValidityExhausted {
        /// The lease length requested.
        ttl: Duration,
        /// Time the acquisition or extension took, on the monotonic clock.
        elapsed: Duration,
        /// The clock-drift allowance.
        drift: Duration,
        /// What was left (zero if nothing).
        remaining: Duration,
        /// What the caller said the work needs (zero: any positive validity).
        required: Duration,
    },
    /// Extend or release found our value on fewer than a majority of the nodes:
    /// the lock expired or is held by someone else. No other value was touched.
    #[error("not the holder of {name:?}: our value is on too few nodes ({counts})")]
    NotHolder {
        /// The lock name.
        name: String,
        /// How the nodes answered.
        counts: NodeCounts,
    },
    /// The guard's validity had already run out; an expired lock cannot be extended.
    #[error("the lease on {name:?} already expired; acquire it again")]
    LeaseExpired {
        /// The lock name.
        name: String,
    },
    /// Fewer than a majority of the nodes could be reached when connecting.
    #[error("only {reachable} redis nodes reachable, {needed} needed: {}", errors.join("; "))]
    Unreachable {
        /// Nodes that accepted a connection.
        reachable: usize,
        /// Nodes needed: ⌊N/2⌋+1.
        needed: usize,
        /// One line per unreachable node.
        errors: Vec<String>,
    },
    /// Talking to a node failed outside of a quorum round (e.g. the audit).
    #[error("redis node {url}: {source}")]
    Node {
        /// The node's URL, password removed.
        url: String,
        /// The underlying error.
        #[source]
        source: redis::RedisError,
    },
}

impl RedisLockError {
    /// Whether trying again later may succeed (contention, nodes down, slowness),
    /// as opposed to input that will always be refused.
    pub fn is_retryable(&self) -> bool {
        !matches!(self, RedisLockError::InvalidInput(_))
    }
}

/// The backend-neutral error of the lock traits ([`palisade_core::lock`]).
impl From<RedisLockError> for palisade_core::LockError {
    fn from(e: RedisLockError) -> Self {
        use palisade_core::LockError as L;
        match e {
            RedisLockError::InvalidInput(i) => L::InvalidInput(i.to_string()),
            e @ (RedisLockError::NotHolder { .. } | RedisLockError::LeaseExpired { .. }) => {
                L::NotHolder(e.to_string())
            }
            e => L::Unavailable {
                backend: "redis",
                detail: e.to_string(),
                why: palisade_core::Unreachable::Unknown,
            },
        }
    }
}
