//! The fence itself: per resource, the highest token accepted so far.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use palisade_core::FencingToken;

use crate::durable::StoreError;
use crate::resource::{ResourceError, validate_resource};

/// Whether a resource enforces fencing.
///
/// [`Fencing::Off`] exists only to demonstrate what fencing prevents (the
/// "unfenced twin" of a fenced resource): every write is accepted, stale or not,
/// while the token of each write is still recorded so that the lost update can be
/// shown afterwards.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Fencing {
    /// Writes with a token lower than the highest accepted one are rejected.
    #[default]
    On,
    /// Every write is accepted. Unsafe; for demonstrations only.
    Off,
}

/// A write that the fence let through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Admitted {
    /// The token the write presented.
    pub token: FencingToken,
    /// The highest token the resource had accepted before this write, if any.
    pub previous: Option<FencingToken>,
}

impl Admitted {
    /// True when the previous highest token equals this one: the same holder
    /// writing again under the same grant.
    pub fn is_repeat(&self) -> bool {
        self.previous == Some(self.token)
    }

    /// True when the write went through although a higher token had already been
    /// accepted. Only possible with [`Fencing::Off`]: this is the lost update.
    pub fn was_stale(&self) -> bool {
        self.previous.is_some_and(|p| p > self.token)
    }

    /// The highest token the resource has accepted, this write included.
    pub fn highest(&self) -> FencingToken {
        self.previous.map_or(self.token, |p| p.max(self.token))
    }
}

/// Why a fence did not let a write through.
#[derive(Debug, thiserror::Error)]
pub enum FenceError {
    /// The token is lower than one the resource already accepted: its holder was
    /// superseded (its lease expired while it was paused, say) and must not write.
    #[error("stale fencing token {presented}: the resource has already accepted token {highest}")]
    StaleToken {
        /// The token the write presented.
        presented: FencingToken,
        /// The highest token the resource has accepted.
        highest: FencingToken,
    },
    /// The resource name breaks the naming rules; nothing was recorded.
    #[error(transparent)]
    InvalidResource(#[from] ResourceError),
    /// The durable store failed; the write and its token were not committed.
    #[error(transparent)]
    Storage(#[from] StoreError),
}

/// The decision every fence makes, in one place: given the highest token accepted
/// so far, accept `token` or not.
pub(crate) fn decide(
    previous: Option<FencingToken>,
    token: FencingToken,
    fencing: Fencing,
) -> Result<Admitted, FenceError> {
    match previous {
        Some(highest) if highest > token && fencing == Fencing::On => Err(FenceError::StaleToken {
            presented: token,
            highest,
        }),
        _ => Ok(Admitted { token, previous }),
    }
}

/// What every fence offers, in memory or durable.
///
/// `admit` only orders admissions. If the protected write happens after `admit`
/// returns, two admitted holders can still write in the wrong order (34 admitted,
/// 35 admitted, 35 writes, 34 writes last). So each fence also has an `admit_with`
/// that runs the write inside the same critical section or transaction as the
/// check: use it whenever the resource is written, not just guarded.
pub trait TokenFence {
    /// Atomically accepts `token` for `resource` if it is at least the highest token
    /// accepted so far (equal means the same holder writing again), and records it.
    ///
    /// # Errors
    /// [`FenceError::StaleToken`] for a lower token (nothing recorded),
    /// [`FenceError::InvalidResource`], and [`FenceError::Storage`] for a durable
    /// fence whose store failed.
    fn admit(&self, resource: &str, token: FencingToken) -> Result<Admitted, FenceError>;

    /// The highest token accepted for `resource`, `None` if none yet.
    ///
    /// # Errors
    /// [`FenceError::InvalidResource`], or [`FenceError::Storage`].
    fn highest(&self, resource: &str) -> Result<Option<FencingToken>, FenceError>;
}

/// An in-memory fence, shared between threads.
///
/// Guarantees, while the process lives: no token lower than one already accepted
/// for a resource is ever accepted for it, and a write run by [`Fence::admit_with`]
/// is ordered with its check. Limits: everything is forgotten when the process
/// exits (use [`crate::DurableFence`] for a resource that outlives it), and entries
/// are never removed — forgetting a resource's highest token would let a stale
/// holder in — so memory grows with the number of distinct resources.
#[derive(Debug, Default)]
pub struct Fence {
    // One lock per resource so a slow protected write blocks only its own resource;
    // the outer lock is held just long enough to find or create the entry.
    resources: Mutex<HashMap<String, Arc<Mutex<Option<FencingToken>>>>>,
}

impl Fence {
    /// An empty fence.
    pub fn new() -> Self {
        Self::default()
    }

    fn slot(&self, resource: &str) -> Arc<Mutex<Option<FencingToken>>> {
        // A panic while holding a lock cannot leave a half-made entry (each update
        // is one store), so a poisoned lock is safe to keep using.
        let mut map = self
            .resources
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(slot) = map.get(resource) {
            return Arc::clone(slot);
        }
        Arc::clone(map.entry(resource.to_owned()).or_default())
    }

    /// Like [`TokenFence::admit`], and runs `write` while still holding the
    /// resource's lock, so that writes happen in token order. `write` runs only if
    /// the token is admitted.
    ///
    /// The token is recorded even if `write` panics: the holder presented it, and a
    /// lower one must not be accepted afterwards either way.
    ///
    /// # Errors
    /// As [`TokenFence::admit`].
    pub fn admit_with<T>(
        &self,
        resource: &str,
        token: FencingToken,
        write: impl FnOnce(&Admitted) -> T,
    ) -> Result<(Admitted, T), FenceError> {
        self.write_with(resource, token, Fencing::On, write)
    }

    /// Like [`Fence::admit_with`] with a choice of [`Fencing`]; with
    /// [`Fencing::Off`] every write is let through (see [`Admitted::was_stale`]).
    ///
    /// # Errors
    /// As [`TokenFence::admit`] (never `StaleToken` with [`Fencing::Off`]).
    pub fn write_with<T>(
        &self,
        resource: &str,
        token: FencingToken,
        fencing: Fencing,
        write: impl FnOnce(&Admitted) -> T,
    ) -> Result<(Admitted, T), FenceError> {
        validate_resource(resource)?;
        let slot = self.slot(resource);
        let mut highest = slot.lock().unwrap_or_else(PoisonError::into_inner);
        let admitted = decide(*highest, token, fencing)?;
        *highest = Some(admitted.highest());
        let out = write(&admitted);
        Ok((admitted, out))
    }
}

impl TokenFence for Fence {
    fn admit(&self, resource: &str, token: FencingToken) -> Result<Admitted, FenceError> {
        self.admit_with(resource, token, |_| ()).map(|(a, ())| a)
    }

    fn highest(&self, resource: &str) -> Result<Option<FencingToken>, FenceError> {
        validate_resource(resource)?;
        let map = self
            .resources
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        Ok(map
            .get(resource)
            .and_then(|slot| *slot.lock().unwrap_or_else(PoisonError::into_inner)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(n: u64) -> FencingToken {
        FencingToken::new(n).unwrap()
    }

    #[test]
    fn the_essay_example() {
        let fence = Fence::new();
        assert_eq!(
            fence.admit("file", t(33)).unwrap(),
            Admitted {
                token: t(33),
                previous: None
            }
        );
        assert!(!fence.admit("file", t(34)).unwrap().is_repeat());
        match fence.admit("file", t(33)) {
            Err(FenceError::StaleToken { presented, highest }) => {
                assert_eq!((presented, highest), (t(33), t(34)));
            }
            other => panic!("expected StaleToken, got {other:?}"),
        }
        assert!(fence.admit("file", t(34)).unwrap().is_repeat());
        assert_eq!(fence.highest("file").unwrap(), Some(t(34)));
        assert_eq!(fence.highest("other").unwrap(), None);
        // Resources are fenced independently.
        assert!(fence.admit("other", t(1)).is_ok());
    }

    #[test]
    fn write_runs_only_when_admitted() {
        let fence = Fence::new();
        let mut log = Vec::new();
        fence.admit_with("r", t(5), |a| log.push(a.token)).unwrap();
        assert!(fence.admit_with("r", t(4), |a| log.push(a.token)).is_err());
        assert_eq!(log, [t(5)]);
    }

    #[test]
    fn fencing_off_lets_stale_writes_through_but_keeps_the_highest() {
        let fence = Fence::new();
        fence.admit("r", t(34)).unwrap();
        let (a, ()) = fence.write_with("r", t(33), Fencing::Off, |_| ()).unwrap();
        assert!(a.was_stale());
        assert_eq!(a.highest(), t(34));
        assert_eq!(fence.highest("r").unwrap(), Some(t(34)));
    }

    #[test]
    fn bad_names_are_refused_and_not_recorded() {
        let fence = Fence::new();
        assert!(matches!(
            fence.admit("", t(1)),
            Err(FenceError::InvalidResource(ResourceError::Empty))
        ));
        assert!(matches!(
            fence.admit("a\0b", t(1)),
            Err(FenceError::InvalidResource(ResourceError::ControlChar {
                at: 1
            }))
        ));
        assert!(fence.resources.lock().unwrap().is_empty());
    }
}
