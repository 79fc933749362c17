//! How long this node's log entries take from append to applied: on the
//! leader, the commit latency (its own flush in parallel with a majority's
//! flushes and one round trip), which `Status` reports and `palisade bench
//! server` prints as `commit_p50_us`.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Batches remembered for the percentiles.
const KEEP: usize = 1024;

/// Append times of batches not yet applied, and the latest latencies.
pub struct CommitClock {
    inner: Mutex<Inner>,
    /// Every batch's append-to-applied time, for Prometheus.
    histogram: prometheus::Histogram,
}

impl Default for CommitClock {
    fn default() -> Self {
        CommitClock {
            inner: Mutex::default(),
            histogram: crate::metrics::latency_histogram(
                "palisade_commit_duration_seconds",
                "Time from a batch of entries handed to this node's log to its apply \
                 (on the leader: the commit latency).",
            ),
        }
    }
}

#[derive(Default)]
struct Inner {
    /// (last index of an appended batch, when openraft handed it to the log).
    appended: VecDeque<(u64, Instant)>,
    /// Append-to-applied times of the last [`KEEP`] batches, oldest first.
    latencies: VecDeque<Duration>,
}

impl CommitClock {
    /// A batch ending at `last_index` was handed to the log.
    pub fn appended(&self, last_index: u64) {
        let mut inner = self.inner.lock().expect("poisoned");
        // A follower's log can be cut back and rewritten; forget what was cut.
        while inner.appended.back().is_some_and(|(i, _)| *i >= last_index) {
            inner.appended.pop_back();
        }
        inner
            .appended
            .push_back((last_index, palisade_core::clock::now()));
        if inner.appended.len() > 16 * KEEP {
            // Appended but never applied (a node that only receives): bounded.
            inner.appended.pop_front();
        }
    }

    /// Every entry up to `index` is applied.
    pub fn applied(&self, index: u64) {
        let mut inner = self.inner.lock().expect("poisoned");
        let now = palisade_core::clock::now();
        while let Some(&(last, at)) = inner.appended.front() {
            if last > index {
                break;
            }
            inner.appended.pop_front();
            self.histogram.observe((now - at).as_secs_f64());
            inner.latencies.push_back(now - at);
            if inner.latencies.len() > KEEP {
                inner.latencies.pop_front();
            }
        }
    }

    /// The histogram of append-to-applied times.
    pub fn histogram(&self) -> &prometheus::Histogram {
        &self.histogram
    }

    /// The `p`th percentile (0–100) of the last 1,024 batches' append-to-applied
    /// times; `None` before any.
    pub fn percentile(&self, p: f64) -> Option<Duration> {
        let mut sorted: Vec<Duration> = self
            .inner
            .lock()
            .expect("poisoned")
            .latencies
            .iter()
            .copied()
            .collect();
        if sorted.is_empty() {
            return None;
        }
        sorted.sort_unstable();
        let rank = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
        sorted.get(rank.min(sorted.len() - 1)).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_batch_is_timed_once_from_its_append_to_its_apply() {
        let clock = CommitClock::default();
        assert_eq!(clock.percentile(50.0), None);
        clock.appended(3);
        clock.appended(5);
        clock.applied(4);
        assert_eq!(clock.inner.lock().unwrap().latencies.len(), 1);
        clock.applied(4);
        assert_eq!(clock.inner.lock().unwrap().latencies.len(), 1);
        // A cut-back log: the batch ending at 5 was replaced by one ending at 4.
        clock.appended(4);
        clock.appended(6);
        clock.applied(6);
        assert_eq!(clock.inner.lock().unwrap().latencies.len(), 3);
        assert!(clock.percentile(50.0).is_some());
        for i in 10..3000 {
            clock.appended(i);
            clock.applied(i);
        }
        assert_eq!(clock.inner.lock().unwrap().latencies.len(), KEEP);
    }
}
