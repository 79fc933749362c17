//! The Raft layer's links between nodes as the nemesis leaves them: which
//! directions are deaf, and which links lose, repeat or reorder messages.
//!
//! turmoil's TCP delivers every byte in order (or holds it), as TCP does; what
//! TCP hides from Raft — a request lost after a reconnect, a reply that never
//! comes back, a message sent twice, an old message overtaken by newer ones, a
//! node heard by the others but deaf to them — is decided here, one Raft message
//! at a time: each node's peer client asks [`Links::fate`] before it sends
//! (`palisade_server::io::MessageFates`).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::time::Duration;

use palisade_server::io::{MessageFate, MessageFates};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// How a flaky link mistreats the messages on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flaky {
    /// A quarter of the messages are lost: half of those before they arrive,
    /// half after (the reply is lost).
    Loss,
    /// A quarter of the messages arrive twice, the copy up to 300 ms later.
    Dup,
    /// A third of the messages are held up to 150 ms, so later ones overtake.
    Reorder,
}

/// The links between the nodes (shared by every node of one run).
pub struct Links {
    state: Mutex<State>,
}

struct State {
    rng: SmallRng,
    /// `(from, to)`: what `from` sends, `to` does not hear.
    deaf: BTreeSet<(u64, u64)>,
    /// Keyed by the pair in ascending order: both directions.
    flaky: BTreeMap<(u64, u64), Flaky>,
}

fn pair(a: u64, b: u64) -> (u64, u64) {
    (a.min(b), a.max(b))
}

impl Links {
    /// Healthy links; the fates of messages on unhealthy ones are drawn from `seed`.
    pub fn new(seed: u64) -> Links {
        Links {
            state: Mutex::new(State {
                rng: SmallRng::seed_from_u64(seed),
                deaf: BTreeSet::new(),
                flaky: BTreeMap::new(),
            }),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Node `to` stops hearing node `from` (the other direction is untouched).
    pub fn deafen(&self, from: u64, to: u64) {
        self.state().deaf.insert((from, to));
    }

    /// Node `to` hears node `from` again.
    pub fn hear(&self, from: u64, to: u64) {
        self.state().deaf.remove(&(from, to));
    }

    /// The link between `a` and `b` becomes `flaky` (`None`: healthy again).
    pub fn set_flaky(&self, a: u64, b: u64, flaky: Option<Flaky>) {
        let mut state = self.state();
        match flaky {
            Some(f) => state.flaky.insert(pair(a, b), f),
            None => state.flaky.remove(&pair(a, b)),
        };
    }
}

impl MessageFates for Links {
    fn fate(&self, from: u64, to: u64, _kind: &'static str) -> MessageFate {
        let mut state = self.state();
        // A request's reply travels back the other way: a call into a node
        // that cannot be heard from arrives, and its answer is lost.
        if state.deaf.contains(&(from, to)) {
            return MessageFate::LoseRequest;
        }
        if state.deaf.contains(&(to, from)) {
            return MessageFate::LoseReply;
        }
        let Some(flaky) = state.flaky.get(&pair(from, to)).copied() else {
            return MessageFate::Deliver;
        };
        let rng = &mut state.rng;
        match flaky {
            Flaky::Loss if rng.random_bool(0.25) => {
                if rng.random_bool(0.5) {
                    MessageFate::LoseRequest
                } else {
                    MessageFate::LoseReply
                }
            }
            Flaky::Dup if rng.random_bool(0.25) => {
                MessageFate::Duplicate(Duration::from_millis(rng.random_range(1..=300)))
            }
            Flaky::Reorder if rng.random_bool(1.0 / 3.0) => {
                MessageFate::Delay(Duration::from_millis(rng.random_range(1..=150)))
            }
            _ => MessageFate::Deliver,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deaf_direction_loses_requests_one_way_and_replies_the_other() {
        let links = Links::new(1);
        assert_eq!(links.fate(1, 2, "append"), MessageFate::Deliver);
        links.deafen(1, 2);
        assert_eq!(links.fate(1, 2, "append"), MessageFate::LoseRequest);
        assert_eq!(links.fate(2, 1, "vote"), MessageFate::LoseReply);
        assert_eq!(links.fate(1, 3, "append"), MessageFate::Deliver);
        links.hear(1, 2);
        assert_eq!(links.fate(1, 2, "append"), MessageFate::Deliver);
    }

    #[test]
    fn flaky_links_mistreat_some_messages_and_only_their_own() {
        let links = Links::new(2);
        links.set_flaky(2, 1, Some(Flaky::Dup));
        let fates: Vec<_> = (0..200).map(|_| links.fate(1, 2, "append")).collect();
        let dups = fates
            .iter()
            .filter(|f| matches!(f, MessageFate::Duplicate(_)))
            .count();
        assert!((20..100).contains(&dups), "{dups} of 200 duplicated");
        assert_eq!(links.fate(1, 3, "append"), MessageFate::Deliver);
        links.set_flaky(1, 2, None);
        assert!((0..50).all(|_| links.fate(2, 1, "append") == MessageFate::Deliver));
    }
}
