//! Counting node answers and deciding as soon as they settle the outcome.
//!
//! Acquisition must not wait for the slowest node when a majority has already
//! granted, nor for stragglers when a majority can no longer be reached. So the
//! requests go out together and the round ends the moment `granted >= needed` or
//! `granted + pending < needed` (see `batch`, which sends the requests and feeds
//! each caller's tally). Requests still in flight are not cancelled (they were
//! already written to the socket); callers that fail release on every node, and a
//! release sent on the same connection is ordered after them.

use crate::error::NodeCounts;

/// One node's answer to one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Answer {
    Granted,
    Refused,
    TimedOut,
    Failed,
    /// Not asked: up for less than the minimum uptime (delayed-restart rule).
    Ineligible,
}

/// The running count of a round.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Tally {
    pub needed: usize,
    pub pending: usize,
    pub counts: NodeCounts,
}

impl Tally {
    pub fn new(asked: usize, needed: usize) -> Self {
        Tally {
            needed,
            pending: asked,
            counts: NodeCounts::default(),
        }
    }

    /// A round in which no node answered: the requests could not be sent (the
    /// runtime is shutting down).
    pub fn unanswered(asked: usize, needed: usize) -> Self {
        let mut tally = Tally::new(asked, needed);
        tally.pending = 0;
        tally.counts.failed = asked;
        tally
    }

    pub fn record(&mut self, answer: Answer) {
        debug_assert!(self.pending > 0, "more answers than requests");
        self.pending -= 1;
        let c = &mut self.counts;
        match answer {
            Answer::Granted => c.granted += 1,
            Answer::Refused => c.refused += 1,
            Answer::TimedOut => c.timed_out += 1,
            Answer::Failed => c.failed += 1,
            Answer::Ineligible => c.ineligible += 1,
        }
    }

    /// `Some(true)`: a majority granted. `Some(false)`: it can no longer.
    /// `None`: the outstanding answers still decide.
    pub fn settled(&self) -> Option<bool> {
        if self.counts.granted >= self.needed {
            Some(true)
        } else if self.counts.granted + self.pending < self.needed {
            Some(false)
        } else {
            None
        }
    }

    pub fn reached(&self) -> bool {
        self.counts.granted >= self.needed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settles_on_majority_or_impossibility() {
        let mut t = Tally::new(5, 3);
        t.record(Answer::Granted);
        t.record(Answer::Refused);
        assert_eq!(t.settled(), None);
        t.record(Answer::TimedOut);
        assert_eq!(t.settled(), None, "2 pending can still make 3");
        t.record(Answer::Failed);
        assert_eq!(t.settled(), Some(false));

        let mut t = Tally::new(5, 3);
        for _ in 0..3 {
            t.record(Answer::Granted);
        }
        assert_eq!(t.settled(), Some(true));
    }

    #[test]
    fn ineligible_nodes_cannot_help() {
        // 5 nodes, 3 needed: three too young settle it as soon as they answer.
        let mut t = Tally::new(5, 3);
        for _ in 0..3 {
            t.record(Answer::Ineligible);
        }
        assert_eq!(t.settled(), Some(false));
        assert_eq!(t.counts.ineligible, 3);
    }
}
