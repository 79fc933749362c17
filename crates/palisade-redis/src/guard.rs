//! The guard of an efficiency lock.

use std::future::Future;
use std::time::{Duration, Instant};

use palisade_core::LeaseState;
use tokio::sync::watch;

use crate::batch::Request;
use crate::budget::validity;
use crate::error::{NodeCounts, RedisLockError};
use crate::redlock::{Redlock, Timings};

/// Proof of a Redis or Redlock acquisition, valid until [`RedisGuard::remaining`]
/// reaches zero.
///
/// There is deliberately no `token()`: the random value that identifies this
/// holder cannot order grants, so it cannot fence a resource. Dropping the guard
/// releases the lock in the background (best effort); call [`RedisGuard::release`]
/// to know the outcome.
pub struct RedisGuard {
    manager: Redlock,
    name: String,
    value: String,
    timings: Timings,
    /// The end of the guaranteed validity on our monotonic clock. A watch, so that
    /// [`RedisGuard::lost`] futures see extensions.
    deadline: watch::Sender<Instant>,
    released: bool,
}

impl RedisGuard {
    pub(crate) fn new(
        manager: Redlock,
        name: String,
        value: String,
        timings: Timings,
        deadline: Instant,
    ) -> Self {
        RedisGuard {
            manager,
            name,
            value,
            timings,
            deadline: watch::Sender::new(deadline),
            released: false,
        }
    }

    /// The lock name (the Redis key).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The lease length requested.
    pub fn ttl(&self) -> Duration {
        self.timings.ttl
    }

    /// How much of the validity is left now, on the monotonic clock. Zero means the
    /// lock may already belong to someone else.
    pub fn remaining(&self) -> Duration {
        self.deadline
            .borrow()
            .saturating_duration_since(Instant::now())
    }

    /// Held, jeopardy (a third of the TTL or less left: an extension is overdue) or
    /// lost.
    pub fn state(&self) -> LeaseState {
        LeaseState::classify(self.remaining(), self.timings.ttl / 3)
    }

    /// A future that completes when the validity runs out (following extensions),
    /// or when the guard is released or dropped. Owns what it needs, so it can be
    /// awaited beside calls to [`RedisGuard::extend`].
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut rx = self.deadline.subscribe();
        async move {
            loop {
                let deadline = *rx.borrow_and_update();
                if deadline <= Instant::now() {
                    return;
                }
                tokio::select! {
                    () = tokio::time::sleep_until(deadline.into()) => {}
                    changed = rx.changed() => if changed.is_err() { return },
                }
            }
        }
    }

    /// Extends the lease to a full TTL on a majority of the nodes.
    ///
    /// Must reach the majority before the current validity ends; the new validity
    /// is `ttl − elapsed − drift` from the start of the extension. Returns it.
    ///
    /// # Errors
    /// [`RedisLockError::LeaseExpired`] when the validity had already run out (an
    /// expired lock cannot be extended) or ran out during the extension,
    /// [`RedisLockError::NotHolder`] when too few nodes still held our value.
    pub async fn extend(&self) -> Result<Duration, RedisLockError> {
        let inner = &self.manager.inner;
        let t = self.timings;
        let start = Instant::now();
        let old_deadline = *self.deadline.borrow();
        if start >= old_deadline {
            return Err(self.expired());
        }
        let extend = Request::Extend {
            ttl_ms: t.ttl.as_millis() as u64,
        };
        let tally = inner.ask(extend, &self.name, &self.value, t, false).await;
        let end = Instant::now();
        if !tally.reached() {
            return Err(RedisLockError::NotHolder {
                name: self.name.clone(),
                counts: tally.counts,
            });
        }
        if end >= old_deadline {
            return Err(self.expired());
        }
        let elapsed = end - start;
        let Some(valid) = validity(t.ttl, elapsed, t.drift) else {
            return Err(RedisLockError::ValidityExhausted {
                ttl: t.ttl,
                elapsed,
                drift: t.drift,
                remaining: Duration::ZERO,
                required: Duration::ZERO,
            });
        };
        self.deadline.send_replace(start + (t.ttl - t.drift));
        Ok(valid)
    }

    /// Releases the lock on every node (compare-and-delete: a key that now holds
    /// another value is left alone).
    ///
    /// The deletes go to every node at once; this returns as soon as a majority
    /// confirmed, so a slow node does not slow the release. The other deletes are
    /// already on their connections and are applied in order after any request
    /// this guard sent earlier.
    ///
    /// # Errors
    /// [`RedisLockError::NotHolder`] when no node still held our value (the lease
    /// had expired); nothing was deleted then.
    pub async fn release(self) -> Result<NodeCounts, RedisLockError> {
        self.release_waiting_for_all(false).await
    }

    async fn release_waiting_for_all(
        mut self,
        wait_all: bool,
    ) -> Result<NodeCounts, RedisLockError> {
        self.released = true;
        let inner = &self.manager.inner;
        let t = self.timings;
        let counts = inner
            .ask(Request::Release, &self.name, &self.value, t, wait_all)
            .await
            .counts;
        if counts.granted == 0 {
            return Err(RedisLockError::NotHolder {
                name: self.name.clone(),
                counts,
            });
        }
        Ok(counts)
    }

    /// [`RedisGuard::release`], returning only once every node has answered (each
    /// bounded by the per-node timeout): for a process about to exit, whose
    /// runtime would drop the deletes still waiting to be written — those nodes
    /// would then keep the key until its TTL ran out.
    ///
    /// # Errors
    /// As [`RedisGuard::release`].
    pub async fn release_everywhere(self) -> Result<NodeCounts, RedisLockError> {
        self.release_waiting_for_all(true).await
    }

    fn expired(&self) -> RedisLockError {
        RedisLockError::LeaseExpired {
            name: self.name.clone(),
        }
    }
}

impl Drop for RedisGuard {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        // Best effort: without a runtime there is nobody to send the release, and
        // the key then simply expires after its TTL.
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let manager = self.manager.clone();
            let (name, value, t) = (
                std::mem::take(&mut self.name),
                std::mem::take(&mut self.value),
                self.timings,
            );
            rt.spawn(async move {
                manager.inner.release_everywhere(&name, &value, t).await;
            });
        }
    }
}

impl std::fmt::Debug for RedisGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisGuard")
            .field("name", &self.name)
            .field("remaining", &self.remaining())
            .finish_non_exhaustive()
    }
}

/// The Redis guard behind the backend-neutral efficiency-lock API (no token).
impl palisade_core::EfficiencyLease for RedisGuard {
    fn name(&self) -> &str {
        RedisGuard::name(self)
    }

    fn remaining(&self) -> Duration {
        RedisGuard::remaining(self)
    }

    fn guaranteed_until(&self) -> Instant {
        *self.deadline.borrow()
    }

    fn state(&self) -> LeaseState {
        RedisGuard::state(self)
    }

    fn lost(&self) -> palisade_core::lock::BoxFuture<'static, ()> {
        Box::pin(RedisGuard::lost(self))
    }

    fn release(
        self: Box<Self>,
    ) -> palisade_core::lock::BoxFuture<'static, Result<(), palisade_core::LockError>> {
        Box::pin(async move { (*self).release().await.map(|_| ()).map_err(Into::into) })
    }
}
