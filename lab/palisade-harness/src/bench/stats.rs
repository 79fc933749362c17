//! Latency samples and their percentiles.

use std::time::Duration;

/// Latencies of one kind of operation, in microseconds.
#[derive(Debug, Default, Clone)]
pub struct Samples(Vec<u64>);

impl Samples {
    /// Records one latency.
    pub fn push(&mut self, d: Duration) {
        self.0.push(d.as_micros() as u64);
    }

    /// Adds another set of samples.
    pub fn extend(&mut self, other: Samples) {
        self.0.extend(other.0);
    }

    /// Number of samples.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Sorts the samples; percentiles need it.
    pub fn sorted(mut self) -> Sorted {
        self.0.sort_unstable();
        Sorted(self.0)
    }
}

/// Sorted latencies in microseconds.
#[derive(Debug, Default, Clone)]
pub struct Sorted(pub Vec<u64>);

impl Sorted {
    /// The `p`-th percentile (0‥100), nearest-rank; `None` without samples.
    pub fn percentile(&self, p: f64) -> Option<u64> {
        if self.0.is_empty() {
            return None;
        }
        let rank = ((p / 100.0) * self.0.len() as f64).ceil() as usize;
        Some(self.0[rank.clamp(1, self.0.len()) - 1])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let mut s = Samples::default();
        for us in 1..=100u64 {
            s.push(Duration::from_micros(us));
        }
        let s = s.sorted();
        assert_eq!(s.percentile(50.0), Some(50));
        assert_eq!(s.percentile(99.0), Some(99));
        assert_eq!(s.percentile(100.0), Some(100));
        assert_eq!(Sorted::default().percentile(50.0), None);
    }
}
