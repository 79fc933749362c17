//! Group commit of commands: many client requests, one log entry, one fsync.
//!
//! One client request per entry would cost a log record, a trip through
//! openraft's core and a share of an fsync per grant. The proposer keeps at most two entries in flight (one flushing, one
//! ready behind it) and gathers every command that arrives meanwhile into the next
//! entry. Lock commands share entries freely, even on one lock — the machine
//! grants a lock at most once per entry (`Command::conflict_key`) — so a release
//! and the previous holder's next acquire ride in one entry instead of two. Only a
//! second session creation, or a session end (alone in its entry), starts the next
//! entry.

use openraft::OptionalSend;
use openraft::errors::ClientWriteError;
use openraft::raft::ClientWriteResult;
use openraft::raft::responder::Responder;
use palisade_core::machine::{Applied, Command, ConflictKey};
use tokio::sync::{mpsc, oneshot};

use crate::store::sm::EntryResponse;
use crate::typ::{Commands, NodeId, Raft, TypeConfig};

/// Most commands in one entry; bounds the entry's size (names are ≤ 256 bytes).
pub const MAX_BATCH: usize = 1024;
/// Entries submitted to openraft and not yet answered.
const IN_FLIGHT: usize = 2;
/// Commands waiting for an entry; beyond this, proposers wait (back-pressure).
const QUEUE: usize = 16 * 1024;

/// Why a command was not applied.
#[derive(Debug, Clone)]
pub enum ProposeError {
    /// This node is not the leader; the leader, if known.
    NotLeader(Option<NodeId>),
    /// Raft could not commit (shutting down, storage failure).
    Unavailable(String),
}

struct Pending {
    cmd: Command,
    reply: oneshot::Sender<Result<Applied, ProposeError>>,
}

/// What openraft calls when an entry is applied (or refused): answers the
/// entry's callers right there, on the state machine's task. A oneshot to a
/// task of ours that then answered them cost one more wake-up per entry on the
/// path of every acquire.
pub struct Answer<T>(Box<dyn FnOnce(T) + Send>);

impl<T: OptionalSend + 'static> Responder<TypeConfig, T> for Answer<T> {
    fn on_complete(self, result: T) {
        (self.0)(result)
    }
}

/// The handle that services use to propose commands.
#[derive(Clone)]
pub struct Proposer {
    tx: mpsc::Sender<Pending>,
}

impl Proposer {
    /// Starts the batching task for `raft`.
    pub fn start(raft: Raft) -> Self {
        let (tx, rx) = mpsc::channel(QUEUE);
        tokio::spawn(run(raft, rx));
        Proposer { tx }
    }

    /// Proposes `cmd` and waits until it is committed and applied.
    ///
    /// # Errors
    /// See [`ProposeError`].
    pub async fn propose(&self, cmd: Command) -> Result<Applied, ProposeError> {
        let (reply, answer) = oneshot::channel();
        let stopped = || ProposeError::Unavailable("the node is shutting down".into());
        self.tx
            .send(Pending { cmd, reply })
            .await
            .map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?
    }
}

/// The next entry's commands: `first`, then those already waiting in `rx`
/// that may share its entry (at most [`MAX_BATCH`]); the first that may not —
/// a second session creation, or a session end — is returned to start the
/// entry after. A session end takes an entry of its own.
fn gather<T>(
    first: T,
    key: impl Fn(&T) -> ConflictKey,
    rx: &mut mpsc::Receiver<T>,
) -> (Vec<T>, Option<T>) {
    let first_key = key(&first);
    let mut batch = vec![first];
    if first_key == ConflictKey::Exclusive {
        return (batch, None);
    }
    let mut creates_session = first_key == ConflictKey::NewSession;
    while batch.len() < MAX_BATCH {
        let Ok(next) = rx.try_recv() else { break };
        let conflicts = match key(&next) {
            ConflictKey::Shared => false,
            ConflictKey::NewSession => std::mem::replace(&mut creates_session, true),
            ConflictKey::Exclusive => true,
        };
        if conflicts {
            return (batch, Some(next));
        }
        batch.push(next);
    }
    (batch, None)
}

async fn run(raft: Raft, mut rx: mpsc::Receiver<Pending>) {
    let in_flight = std::sync::Arc::new(tokio::sync::Semaphore::new(IN_FLIGHT));
    let mut carry: Option<Pending> = None;
    loop {
        let first = match carry.take() {
            Some(p) => p,
            None => match rx.recv().await {
                Some(p) => p,
                None => return,
            },
        };
        // Let commands that arrived in the same instant (a release and the
        // previous holder's next acquire, answered by one entry) join this entry.
        tokio::task::yield_now().await;
        let (batch, next) = gather(first, |p| p.cmd.conflict_key(), &mut rx);
        carry = next;
        let (cmds, replies): (Vec<Command>, Vec<_>) =
            batch.into_iter().map(|p| (p.cmd, p.reply)).unzip();
        // At most IN_FLIGHT entries are submitted and not yet answered: one being
        // flushed and one queued behind it, so the next entry is ready the moment
        // openraft takes it, while commands keep gathering into batches meanwhile.
        let permit = in_flight
            .clone()
            .acquire_owned()
            .await
            .expect("the semaphore is never closed");
        // Submitted here, in order; answered where openraft completes it. If
        // openraft drops the answer unanswered (it stopped), the callers hear
        // that their reply channel closed: "shutting down".
        let answer = Answer(Box::new(move |result: ClientWriteResult<TypeConfig>| {
            drop(permit);
            answer(replies, result);
        }));
        if let Err(fatal) = raft.client_write_ff(Commands(cmds), Some(answer)).await {
            tracing::debug!(error = %fatal, "raft stopped; proposals end");
        }
    }
}

/// Answers each command's caller from the result of their shared entry.
fn answer(
    replies: Vec<oneshot::Sender<Result<Applied, ProposeError>>>,
    result: ClientWriteResult<TypeConfig>,
) {
    let result = match result {
        Ok(r) => match r.data {
            EntryResponse::Commands(applied) if applied.len() == replies.len() => Ok(applied),
            other => Err(ProposeError::Unavailable(format!(
                "unexpected apply result {other:?}"
            ))),
        },
        Err(ClientWriteError::ForwardToLeader(f)) => Err(ProposeError::NotLeader(f.leader_id)),
        Err(e) => Err(ProposeError::Unavailable(e.to_string())),
    };
    match result {
        Ok(applied) => {
            for (reply, a) in replies.into_iter().zip(applied) {
                let _ = reply.send(Ok(a));
            }
        }
        Err(e) => {
            for reply in replies {
                let _ = reply.send(Err(e.clone()));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use palisade_core::machine::{SessionId, SessionOwner};

    fn acquire(session: u64, name: &str) -> Command {
        Command::Acquire {
            session: SessionId(session),
            name: name.into(),
            wait: true,
            lock_delay_ms: 0,
        }
    }

    fn create() -> Command {
        Command::CreateSession {
            ttl_ms: 2000,
            label: String::new(),
            owner: SessionOwner::default(),
        }
    }

    fn close(session: u64) -> Command {
        Command::CloseSession {
            session: SessionId(session),
        }
    }

    /// Queues `cmds` and gathers entries until the queue is empty.
    fn entries(cmds: Vec<Command>) -> Vec<Vec<Command>> {
        let (tx, mut rx) = mpsc::channel(QUEUE);
        let mut rest = cmds.into_iter();
        let first = rest.next().expect("a command");
        for c in rest {
            tx.try_send(c).expect("room");
        }
        let mut out = Vec::new();
        let mut next = Some(first);
        while let Some(first) = next.take().or_else(|| rx.try_recv().ok()) {
            let (batch, carried) = gather(first, Command::conflict_key, &mut rx);
            out.push(batch);
            next = carried;
        }
        out
    }

    #[test]
    fn lock_commands_share_one_entry_even_on_one_lock() {
        let cmds = vec![acquire(1, "a"), acquire(2, "a"), acquire(3, "b")];
        assert_eq!(entries(cmds.clone()), vec![cmds]);
    }

    #[test]
    fn a_second_session_creation_starts_the_next_entry() {
        let got = entries(vec![create(), acquire(1, "a"), create(), acquire(2, "b")]);
        assert_eq!(
            got,
            vec![
                vec![create(), acquire(1, "a")],
                vec![create(), acquire(2, "b")]
            ]
        );
    }

    #[test]
    fn a_session_end_takes_an_entry_of_its_own() {
        let got = entries(vec![acquire(1, "a"), close(1), acquire(2, "a")]);
        assert_eq!(
            got,
            vec![vec![acquire(1, "a")], vec![close(1)], vec![acquire(2, "a")]]
        );
    }

    #[test]
    fn an_entry_holds_at_most_max_batch_commands_in_arrival_order() {
        let cmds: Vec<Command> = (0..MAX_BATCH as u64 + 5)
            .map(|i| acquire(1, &format!("lock-{i}")))
            .collect();
        let got = entries(cmds.clone());
        assert_eq!(
            got.iter().map(Vec::len).collect::<Vec<_>>(),
            vec![MAX_BATCH, 5]
        );
        assert_eq!(got.concat(), cmds);
    }
}
