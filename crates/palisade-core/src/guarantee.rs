//! How long a lease is still guaranteed, as every backend's client measures it
//! (behind the `runtime` feature: it needs tokio's watch channel and timers).
//!
//! The guarantee starts at the moment the grant or keep-alive that justified it
//! was *sent*, on this process's monotonic clock, and lasts the TTL minus a
//! safety margin. It only moves forward, except to "now" when the backend says
//! the lease is gone.

use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::LeaseState;
use crate::lock::BoxFuture;

/// A lease's guarantee, shared by the lease handles and the task that keeps it
/// alive. Cheap to clone; clones see the same deadline.
#[derive(Clone)]
pub struct Guarantee {
    until: watch::Sender<Instant>,
    ttl: Duration,
    margin: Duration,
}

impl Guarantee {
    /// The margin taken off every guarantee: a tenth of the TTL, at least 50 ms,
    /// at most half the TTL. It covers clock-rate differences between hosts.
    pub fn margin_for(ttl: Duration) -> Duration {
        (ttl / 10).max(Duration::from_millis(50)).min(ttl / 2)
    }

    /// A guarantee of `ttl` from `sent` (when the request that earned it left).
    pub fn new(sent: Instant, ttl: Duration) -> Self {
        let margin = Self::margin_for(ttl);
        Guarantee {
            until: watch::Sender::new(sent + ttl - margin),
            ttl,
            margin,
        }
    }

    /// The lease length.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// A keep-alive sent at `sent` was acknowledged: the guarantee moves forward
    /// (never back).
    pub fn renewed(&self, sent: Instant) {
        let until = sent + self.ttl - self.margin;
        self.until.send_if_modified(|current| {
            let later = until > *current;
            if later {
                *current = until;
            }
            later
        });
    }

    /// The lease is known to be gone: the guarantee ends now.
    pub fn end(&self) {
        self.until.send_replace(crate::clock::now());
    }

    /// Until when, on this process's monotonic clock.
    pub fn until(&self) -> Instant {
        *self.until.borrow()
    }

    /// How long yet (zero once over).
    pub fn remaining(&self) -> Duration {
        self.until().saturating_duration_since(crate::clock::now())
    }

    /// Held; jeopardy when less than half the TTL is left; lost at zero.
    pub fn state(&self) -> LeaseState {
        LeaseState::classify(self.remaining(), self.ttl / 2)
    }

    /// Completes when the guarantee runs out, following renewals.
    pub fn lost(&self) -> BoxFuture<'static, ()> {
        let mut rx = self.until.subscribe();
        Box::pin(async move {
            loop {
                let until = *rx.borrow_and_update();
                if until <= crate::clock::now() {
                    return;
                }
                tokio::select! {
                    () = tokio::time::sleep_until(until.into()) => {}
                    changed = rx.changed() => if changed.is_err() { return },
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn renewals_only_move_forward_and_end_ends_it() {
        let start = crate::clock::now();
        let g = Guarantee::new(start, Duration::from_secs(10));
        let first = g.until();
        assert_eq!(first, start + Duration::from_secs(9));
        g.renewed(start - Duration::from_secs(1));
        assert_eq!(g.until(), first, "an older renewal does not move it back");
        g.renewed(start + Duration::from_secs(1));
        assert!(g.until() > first);
        assert_eq!(g.state(), LeaseState::Held);
        let lost = g.lost();
        g.end();
        assert!(g.remaining().is_zero());
        assert_eq!(g.state(), LeaseState::Lost);
        tokio::time::timeout(Duration::from_secs(5), lost)
            .await
            .expect("lost() completes once ended");
    }
}
