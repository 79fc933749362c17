//! Lock-safety telemetry, reported by clients (behind the `runtime` feature):
//! the figures that say how close a holder came to losing its lease — which
//! no server can see, because only the client knows when its work ended.
//!
//! - `palisade_lock_release_slack_seconds`: how much of the guarantee was left
//!   when the work ended and the release began;
//! - `palisade_lock_overrun_seconds`: how long work went on after its
//!   guarantee had run out (each one a window in which another holder may
//!   have been granted the lock: only fencing makes it harmless);
//! - `palisade_lock_leases_lost_total`: leases whose guarantee ran out while held;
//! - `palisade_lock_grants_too_late_total`: grants that arrived after the
//!   session's guarantee had run out, and were given back;
//! - `palisade_redis_validity_at_grant_seconds`: for Redis locks, the validity
//!   left when the grant arrived (the TTL less the time the acquire took and
//!   the drift allowance).

use std::time::{Duration, Instant};

use prometheus::{Encoder, Histogram, HistogramOpts, IntCounter, Registry, TextEncoder};

/// The lock-safety figures of one client, in a registry of their own: register
/// [`LockSafety::collectors`] in yours, or write [`LockSafety::render`] out.
pub struct LockSafety {
    registry: Registry,
    slack: Histogram,
    overrun: Histogram,
    lost: IntCounter,
    too_late: IntCounter,
    validity: Histogram,
}

impl Default for LockSafety {
    fn default() -> Self {
        Self::new()
    }
}

/// Seconds from 1 ms to about a minute.
fn seconds_histogram(name: &str, help: &str) -> Histogram {
    let buckets = prometheus::exponential_buckets(0.001, 2.0, 17).expect("valid buckets");
    Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets)).expect("valid histogram")
}

impl LockSafety {
    /// Every figure at zero.
    pub fn new() -> Self {
        let counter = |name: &str, help: &str| IntCounter::new(name, help).expect("valid counter");
        let safety = LockSafety {
            registry: Registry::new(),
            slack: seconds_histogram(
                "palisade_lock_release_slack_seconds",
                "Guarantee left when the work under a lock ended and its release began.",
            ),
            overrun: seconds_histogram(
                "palisade_lock_overrun_seconds",
                "How long work under a lock went on after the lock's guarantee ran out.",
            ),
            lost: counter(
                "palisade_lock_leases_lost_total",
                "Leases whose guarantee ran out while the lock was held.",
            ),
            too_late: counter(
                "palisade_lock_grants_too_late_total",
                "Grants that arrived after the session's guarantee had run out (given back).",
            ),
            validity: seconds_histogram(
                "palisade_redis_validity_at_grant_seconds",
                "Validity left when a Redis lock's grant arrived.",
            ),
        };
        for c in safety.collectors() {
            safety.registry.register(c).expect("unique names");
        }
        safety
    }

    /// The figures, for a registry of the caller's.
    pub fn collectors(&self) -> Vec<Box<dyn prometheus::core::Collector>> {
        vec![
            Box::new(self.slack.clone()),
            Box::new(self.overrun.clone()),
            Box::new(self.lost.clone()),
            Box::new(self.too_late.clone()),
            Box::new(self.validity.clone()),
        ]
    }

    /// The work under a lease guaranteed until `guaranteed_until` ended at
    /// `ended`: the slack left, or the overrun past the guarantee (which also
    /// counts the lease as lost).
    pub fn work_ended(&self, guaranteed_until: Instant, ended: Instant) {
        match guaranteed_until.checked_duration_since(ended) {
            Some(slack) => self.slack.observe(slack.as_secs_f64()),
            None => {
                self.lost.inc();
                self.overrun
                    .observe((ended - guaranteed_until).as_secs_f64());
            }
        }
    }

    /// A grant arrived after the guarantee had run out.
    pub fn grant_too_late(&self) {
        self.too_late.inc();
    }

    /// A Redis lock was granted with `validity` left.
    pub fn granted_with_validity(&self, validity: Duration) {
        self.validity.observe(validity.as_secs_f64());
    }

    /// Everything in Prometheus' text format (for a node_exporter textfile
    /// collector, say).
    pub fn render(&self) -> String {
        let mut text = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut text)
            .expect("the text encoder writes to memory");
        String::from_utf8(text).expect("the text format is UTF-8")
    }

    /// Leases lost so far.
    pub fn leases_lost(&self) -> u64 {
        self.lost.get()
    }

    /// Slack observations so far: (count, sum in seconds).
    pub fn slack(&self) -> (u64, f64) {
        (self.slack.get_sample_count(), self.slack.get_sample_sum())
    }

    /// Overrun observations so far: (count, sum in seconds).
    pub fn overrun(&self) -> (u64, f64) {
        (
            self.overrun.get_sample_count(),
            self.overrun.get_sample_sum(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_ending_in_time_is_slack_and_after_is_an_overrun_and_a_loss() {
        let safety = LockSafety::new();
        let now = crate::clock::now();
        safety.work_ended(now + Duration::from_millis(1500), now);
        assert_eq!(safety.slack(), (1, 1.5));
        assert_eq!(safety.overrun().0, 0);
        safety.work_ended(now, now + Duration::from_millis(250));
        assert_eq!(safety.overrun(), (1, 0.25));
        assert_eq!(safety.leases_lost(), 1);
        let text = safety.render();
        assert!(
            text.contains("palisade_lock_overrun_seconds_sum 0.25"),
            "{text}"
        );
        assert!(text.contains("palisade_lock_leases_lost_total 1"), "{text}");
    }
}
