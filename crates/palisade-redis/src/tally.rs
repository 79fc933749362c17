//! Counting node answers and deciding as soon as they settle the outcome.
//!
//! Acquisition must not wait for the slowest node when a majority has already
//! granted, nor for stragglers when a majority can no longer be reached. So the
//! requests go out together and the round ends the moment `granted >= needed` or
//! `granted + pending < needed`. Requests still in flight are not cancelled on the
//! server side (they were already written to the socket); callers that fail release
//! on every node, and a release sent on the same connection is ordered after them.

use std::future::Future;

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;

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

/// Drives the requests concurrently and returns once the outcome is settled, or
/// once every request answered when `wait_all` is set.
pub(crate) async fn gather<F>(
    requests: impl IntoIterator<Item = F>,
    needed: usize,
    wait_all: bool,
) -> Tally
where
    F: Future<Output = Answer>,
{
    let mut in_flight: FuturesUnordered<F> = requests.into_iter().collect();
    let mut tally = Tally::new(in_flight.len(), needed);
    while tally.pending > 0 {
        if !wait_all && tally.settled().is_some() {
            break;
        }
        match in_flight.next().await {
            Some(answer) => tally.record(answer),
            None => break,
        }
    }
    tally.counts.unsettled = tally.pending;
    tally
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

    #[tokio::test]
    async fn gather_stops_early_but_can_wait_for_all() {
        use std::future::ready;
        let answers = [Answer::Granted, Answer::Granted, Answer::Granted];
        let pending = std::future::pending::<Answer>;
        let early = gather(
            answers
                .iter()
                .map(|a| futures_util::future::Either::Left(ready(*a)))
                .chain(std::iter::once(futures_util::future::Either::Right(
                    pending(),
                ))),
            3,
            false,
        )
        .await;
        assert!(early.reached());
        assert_eq!(early.counts.unsettled, 1);

        let all = gather(answers.iter().map(|a| ready(*a)), 2, true).await;
        assert_eq!(all.counts.granted, 3);
        assert_eq!(all.counts.unsettled, 0);
    }
}
