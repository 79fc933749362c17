//! One leadership confirmation for many callers.
//!
//! A keep-alive needs a confirmation that this node is still the leader started
//! *after* it moved the session's countdown; a linearizable read needs one
//! started after its request arrived. Each `ensure_linearizable` is a trip
//! through openraft's core (and, with peers, a round of heartbeats to a
//! quorum) — with tens of thousands of keep-alives a second, most of the
//! leader's work. Callers that arrive while a confirmation runs wait for the
//! next one, which starts when the running one ends and answers all of them:
//! one confirmation per round trip instead of one per caller, and every
//! caller's confirmation still starts after the caller arrived.

use std::sync::{Arc, Mutex};

use openraft::ReadPolicy;
use tokio::sync::oneshot;

use crate::typ::{LinearizableReadError, Raft, RaftError};

/// What `Raft::ensure_linearizable` answers: this node led when the check
/// started after the caller arrived, and has applied what was committed then.
pub type Confirmation = Result<(), RaftError<LinearizableReadError>>;

#[derive(Default)]
struct Waiting {
    running: bool,
    next: Vec<oneshot::Sender<Confirmation>>,
}

/// See the module docs. Cheap to clone.
#[derive(Clone)]
pub struct LeaderCheck {
    raft: Raft,
    waiting: Arc<Mutex<Waiting>>,
}

impl LeaderCheck {
    /// Confirmations for `raft`.
    pub fn new(raft: Raft) -> Self {
        LeaderCheck {
            raft,
            waiting: Arc::default(),
        }
    }

    /// Waits for a leadership confirmation that started after this call, and
    /// for this node to have applied what it confirmed (as
    /// `Raft::ensure_linearizable`).
    pub async fn confirm(&self) -> Confirmation {
        let (tx, rx) = oneshot::channel();
        let start = {
            let mut w = self.waiting.lock().expect("poisoned");
            w.next.push(tx);
            !std::mem::replace(&mut w.running, true)
        };
        if start {
            tokio::spawn(self.clone().run());
        }
        match rx.await {
            Ok(confirmation) => confirmation,
            // The runner is gone only if the runtime is shutting down.
            Err(_) => Err(RaftError::Fatal(openraft::errors::Fatal::Stopped)),
        }
    }

    /// Confirms for everyone waiting, round after round, until nobody waits.
    async fn run(self) {
        loop {
            let batch = {
                let mut w = self.waiting.lock().expect("poisoned");
                if w.next.is_empty() {
                    w.running = false;
                    return;
                }
                std::mem::take(&mut w.next)
            };
            // Started after every caller in `batch` registered.
            // ReadIndex: a fresh round with a quorum (what openraft 0.9 always did).
            let confirmation = self
                .raft
                .ensure_linearizable(ReadPolicy::ReadIndex)
                .await
                .map(|_| ());
            for waiter in batch {
                let _ = waiter.send(confirmation.clone());
            }
        }
    }
}
