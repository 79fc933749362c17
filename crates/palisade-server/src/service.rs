//! The client-facing gRPC services: `palisade.v1.Locks` and `palisade.v1.Cluster`.
//!
//! Writes are proposed to Raft and answered once committed on a majority (each
//! member's copy synced to disk) and applied. Reads are linearizable: the leader
//! confirms its leadership with a quorum before reading. Followers answer
//! `not_leader` with the leader's address.
//!
//! Every call is first admitted by the [`Gatekeeper`] (who is calling, within
//! its call limit); calls on a session must come from the session's owner with
//! the session's key; calls on a lock need the caller's role to cover its name.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use openraft::async_runtime::WatchReceiver;
use openraft::errors::{ClientWriteError, LinearizableReadError, RaftError};
use palisade_core::FencingToken;
use palisade_core::machine::{
    Applied, Claim, Command, MachineError, Mode, Reply, SessionId, SessionOwner, Shape,
};
use palisade_proto::v1::cluster_server::{Cluster, ClusterServer};
use palisade_proto::v1::locks_server::{Locks, LocksServer};
use palisade_proto::v1::*;
use palisade_proto::{ErrorCode, LEADER_KEY};
use tonic::{Request, Response, Status};

use crate::leader_check::LeaderCheck;
use crate::leases::{KeepAliveError, LeaseKeeper};
use crate::proposer::{ProposeError, Proposer};
use crate::security::gate::admitted;
use crate::security::{Caller, Gatekeeper, SessionKeys, same_secret, session_key_digest};
use crate::store::sm::{Shared, WaitEnd};
use crate::typ::{NodeAddr, NodeId, Raft, default_peer_addr};

/// The longest an acquire may wait in one call: one hour. Longer waits are a
/// loop in the caller, which also notices a lost session in between.
pub const MAX_WAIT: Duration = Duration::from_secs(3600);

/// `Observe` streams one node serves at once; more get `limit_reached`. Each
/// wakes at every applied batch, so they are bounded like sessions are.
pub const MAX_OBSERVERS: usize = 1024;

/// Both client-facing services share this state.
#[derive(Clone)]
pub struct Api {
    raft: Raft,
    proposer: Proposer,
    shared: Arc<Shared>,
    leases: Arc<LeaseKeeper>,
    committed: Arc<dyn Fn() -> u64 + Send + Sync>,
    /// The index of the last entry in this node's log (see `watch_grant`).
    last_log_index: Arc<dyn Fn() -> u64 + Send + Sync>,
    /// The vote's term and the last log index at startup: while this node leads
    /// in that term, reads wait until that index is applied.
    read_floor: (u64, u64),
    read_floor_reached: Arc<std::sync::atomic::AtomicBool>,
    /// Leadership confirmations shared by concurrent keep-alives and reads.
    leader_check: LeaderCheck,
    gatekeeper: Arc<Gatekeeper>,
    /// Append-to-applied times of this node's log, for `Status`.
    commit_clock: Option<Arc<crate::commit_clock::CommitClock>>,
    /// Mints the key each new session gets.
    session_keys: SessionKeys,
    /// Room for [`MAX_OBSERVERS`] `Observe` streams.
    observers: Arc<tokio::sync::Semaphore>,
}

impl Api {
    /// The services over one node.
    pub fn new(
        raft: Raft,
        proposer: Proposer,
        shared: Arc<Shared>,
        leases: Arc<LeaseKeeper>,
        committed: Arc<dyn Fn() -> u64 + Send + Sync>,
        read_floor: (u64, u64),
        gatekeeper: Arc<Gatekeeper>,
    ) -> Self {
        let metrics = raft.metrics();
        Api {
            leader_check: LeaderCheck::new(raft.clone()),
            last_log_index: Arc::new(move || {
                use openraft::async_runtime::WatchReceiver;
                metrics.borrow_watched().last_log_index.unwrap_or(0)
            }),
            raft,
            proposer,
            shared,
            leases,
            committed,
            read_floor,
            read_floor_reached: Arc::new(std::sync::atomic::AtomicBool::new(read_floor.1 == 0)),
            gatekeeper,
            commit_clock: None,
            session_keys: SessionKeys::default(),
            observers: Arc::new(tokio::sync::Semaphore::new(MAX_OBSERVERS)),
        }
    }

    /// Mints session keys from `keys` (the operating system's generator
    /// otherwise).
    #[must_use]
    pub fn with_session_keys(mut self, keys: SessionKeys) -> Self {
        self.session_keys = keys;
        self
    }

    /// Reports `clock`'s percentiles in `Status`.
    #[must_use]
    pub fn with_commit_clock(mut self, clock: Arc<crate::commit_clock::CommitClock>) -> Self {
        self.commit_clock = Some(clock);
        self
    }

    /// Reads the end of this node's log from `last_index` (the log store's own
    /// count; without it, openraft's metrics, which can lag the log a little).
    #[must_use]
    pub fn with_last_log_index(mut self, last_index: Arc<dyn Fn() -> u64 + Send + Sync>) -> Self {
        self.last_log_index = last_index;
        self
    }

    fn owner_of(&self, session: SessionId) -> Option<SessionOwner> {
        let machine = self.shared.machine.read().expect("poisoned");
        machine.session_owner(session).cloned()
    }

    /// Refuses unless `caller` opened `session` and `key` is its key.
    ///
    /// A session absent from this node's state may be committed but not yet
    /// applied (a new leader): it is looked up again after a linearizable
    /// barrier, and only then refused — with the same answer as a wrong key.
    async fn check_owner(
        &self,
        caller: &Caller,
        session: SessionId,
        key: &[u8],
    ) -> Result<(), Status> {
        // One answer, after the same barrier, for "no such session" and "wrong
        // key": a caller without the key learns nothing about which ids live.
        let refused = || {
            let mut status = ErrorCode::Unauthenticated.status(format!(
                "no session {session} with this key (closed, expired, never opened, or another key)"
            ));
            status.metadata_mut().insert(
                palisade_proto::SESSION_KEY,
                session
                    .0
                    .to_string()
                    .parse()
                    .expect("digits are valid metadata"),
            );
            caller.refuse(status)
        };
        let digest = session_key_digest(key);
        let matches = |owner: &SessionOwner| {
            !owner.key_sha256.is_empty()
                && same_secret(digest.as_bytes(), owner.key_sha256.as_bytes())
        };
        let owner = match self.owner_of(session) {
            Some(owner) if matches(&owner) => owner,
            _ => {
                self.linearize().await?;
                match self.owner_of(session) {
                    Some(owner) if matches(&owner) => owner,
                    _ => return Err(refused()),
                }
            }
        };
        if owner.identity != caller.identity {
            return Err(caller.refuse(
                ErrorCode::PermissionDenied
                    .status(format!("session {session} belongs to another identity")),
            ));
        }
        Ok(())
    }

    /// The `Locks` service.
    pub fn locks(&self) -> LocksServer<Api> {
        LocksServer::new(self.clone())
    }

    /// The `Cluster` service.
    pub fn cluster(&self) -> ClusterServer<Api> {
        ClusterServer::new(self.clone())
    }

    fn not_leader(&self, leader: Option<NodeId>) -> Status {
        let addr = leader
            .and_then(|id| {
                let m = self
                    .raft
                    .metrics()
                    .borrow_watched()
                    .membership_config
                    .clone();
                m.membership().get_node(&id).map(|n| n.addr.clone())
            })
            .unwrap_or_default();
        let mut status = ErrorCode::NotLeader.status(format!(
            "this node is not the leader; the leader is {}",
            if addr.is_empty() {
                "unknown (election in progress)"
            } else {
                &addr
            }
        ));
        if let Ok(v) = addr.parse() {
            status.metadata_mut().insert(LEADER_KEY, v);
        }
        status
    }

    /// Proposes a command and waits for it to be committed and applied.
    async fn propose(&self, cmd: Command) -> Result<Applied, Status> {
        match self.proposer.propose(cmd).await {
            Ok(applied) => match applied.outcome {
                // Conflicting commands are kept out of one entry by the proposer;
                // should one slip through, it is refused untouched: retry it.
                Err(MachineError::BatchConflict) => {
                    Err(ErrorCode::Unavailable.status("batch conflict; retry"))
                }
                _ => Ok(applied),
            },
            Err(ProposeError::NotLeader(leader)) => Err(self.not_leader(leader)),
            Err(ProposeError::Unavailable(why)) => Err(ErrorCode::Unavailable.status(why)),
        }
    }

    /// Confirms with a quorum that this node is still the leader, and waits until
    /// everything committed before now is applied.
    async fn linearize(&self) -> Result<(), Status> {
        match self.leader_check.confirm().await {
            Ok(_) => {}
            Err(RaftError::APIError(LinearizableReadError::ForwardToLeader(f))) => {
                return Err(self.not_leader(f.leader_id));
            }
            Err(e) => return Err(ErrorCode::Unavailable.status(e.to_string())),
        }
        // A leader restarted without losing its term resumes leading at once, and
        // openraft then reads at the committed index it found on disk — which
        // lags (it is not synced; see the log store), so an acquire or release
        // acknowledged just before the crash would be missing from the read.
        // Every entry in the log at startup may have been acknowledged: reads
        // wait until all of them are applied, once per process. In a later term
        // openraft's own rule covers it (a new leader reads only after its first
        // entry, which follows all of them, is applied) — and the old tail may
        // have been cut meanwhile, so the floor could be out of reach.
        use std::sync::atomic::Ordering;
        if !self.read_floor_reached.load(Ordering::Acquire) {
            let (floor_term, floor) = self.read_floor;
            let term = self.raft.metrics().borrow_watched().current_term;
            let applied = self
                .shared
                .last_applied
                .read()
                .expect("poisoned")
                .map_or(0, |l| l.index);
            if term == floor_term && applied < floor {
                self.raft
                    .wait(Some(Duration::from_secs(10)))
                    .applied_index_at_least(Some(floor), "entries found at startup applied")
                    .await
                    .map_err(|e| ErrorCode::Unavailable.status(e.to_string()))?;
            }
            self.read_floor_reached.store(true, Ordering::Release);
        }
        Ok(())
    }

    fn lock_info(&self, view: palisade_core::machine::LockView) -> LockInfo {
        lock_info(&self.shared, view)
    }
}

impl Api {
    /// The slot of `session`'s grant of `name` under `token` (`0` if it is
    /// not a permit, or no longer held).
    fn slot_of(&self, session: SessionId, name: &str, token: FencingToken) -> u32 {
        let machine = self.shared.machine.read().expect("poisoned");
        machine
            .get(name)
            .and_then(|v| {
                v.holders
                    .into_iter()
                    .find(|h| h.session == session && h.token == token)
            })
            .map_or(0, |h| h.slot)
    }
}

/// What an acquire asks of its name, from the request's claim fields; a
/// field that does not belong to the claim is refused rather than ignored.
fn claim_of(r: &AcquireRequest) -> Result<Claim, Status> {
    let kind = ClaimKind::try_from(r.claim)
        .map_err(|_| input(format!("unknown claim kind {}", r.claim)))?;
    if r.permits != 0 && kind != ClaimKind::ClaimPermit {
        return Err(input("permits is for CLAIM_PERMIT only"));
    }
    if !r.value.is_empty() && kind != ClaimKind::ClaimLead {
        return Err(input("value is for CLAIM_LEAD only"));
    }
    Ok(match kind {
        ClaimKind::ClaimLock => Claim::Lock,
        ClaimKind::ClaimPermit => Claim::Permit { permits: r.permits },
        ClaimKind::ClaimRead => Claim::Read,
        ClaimKind::ClaimWrite => Claim::Write,
        ClaimKind::ClaimLead => Claim::Lead {
            value: r.value.clone(),
        },
    })
}

/// The documented mapping from a refusal of the state machine to an error code.
pub fn machine_status(e: &MachineError) -> Status {
    // Exhaustive on purpose: a new refusal must choose its wire code here.
    let code = match e {
        MachineError::Input { .. }
        | MachineError::LockDelayTooLong { .. }
        | MachineError::LabelTooLong { .. }
        | MachineError::BadPermits { .. }
        | MachineError::LockDelayNeedsExclusive { .. }
        | MachineError::ValueTooLong { .. } => ErrorCode::InvalidInput,
        MachineError::ShapeMismatch { .. } | MachineError::HeldInOtherMode { .. } => {
            ErrorCode::WrongShape
        }
        MachineError::UnknownSession { .. } => ErrorCode::UnknownSession,
        MachineError::StaleToken { .. } => ErrorCode::StaleToken,
        MachineError::TooManySessions { .. }
        | MachineError::TooManyWaiters { .. }
        | MachineError::TooManyLocks { .. } => ErrorCode::LimitReached,
        // A release or cancel naming a lock the session does not hold or wait
        // for; `AlreadyGranted` is turned into a release by `cancel` before it
        // could get here.
        MachineError::NoSuchLock { .. }
        | MachineError::NotHolder { .. }
        | MachineError::NotWaiting { .. }
        | MachineError::AlreadyGranted { .. } => ErrorCode::NotHolder,
        // Leader-internal proposals (a duplicate end of lock-delay, a batch the
        // proposer should not have built): nothing the caller did; retry.
        MachineError::NotInLockDelay { .. } | MachineError::BatchConflict => ErrorCode::Unavailable,
    };
    let mut status = code.status(e.to_string());
    if let MachineError::StaleToken { presented, current } = e {
        // Decimal digits are always valid ASCII metadata.
        for (key, token) in [
            (palisade_proto::PRESENTED_TOKEN_KEY, presented),
            (palisade_proto::CURRENT_TOKEN_KEY, current),
        ] {
            if let Ok(value) = token.get().to_string().parse() {
                status.metadata_mut().insert(key, value);
            }
        }
    }
    status
}

fn unexpected(reply: &Reply) -> Status {
    Status::internal(format!("unexpected state machine reply {reply:?}"))
}

fn input(e: impl std::fmt::Display) -> Status {
    ErrorCode::InvalidInput.status(e.to_string())
}

/// Takes a wait whose RPC went away before it was answered out of the queue.
/// Disarmed once answered.
///
/// A grant made meanwhile is left with the session: the client may be retrying
/// this very call on another node and be told of that grant, so releasing it
/// here could take the lock from a client that holds it (found by `palisade
/// sim`). A client that gives up cancels with `CancelAcquire` (which does
/// release), in turn with its later acquires of the lock; otherwise the grant
/// ends with the session.
struct AbandonedWait {
    api: Option<Api>,
    session: SessionId,
    name: String,
}

impl AbandonedWait {
    fn disarm(mut self) {
        self.api = None;
    }
}

impl Drop for AbandonedWait {
    fn drop(&mut self) {
        if let Some(api) = self.api.take() {
            let (session, name) = (self.session, std::mem::take(&mut self.name));
            api.shared.unwatch_grant(session, &name);
            tokio::spawn(async move {
                let _ = api.propose(Command::CancelWait { session, name }).await;
            });
        }
    }
}

/// How an acquire's proposal and wait ended.
enum Waited {
    /// Granted (token, slot), or refused.
    Answered(Result<(FencingToken, u32), Status>),
    /// Queued, and the wait ran out before a grant was heard of.
    TimedOut,
}

impl Api {
    /// Proposes an acquire and, if it was queued, waits up to `wait` for the
    /// grant `granted` will bring. Each end unwatches the grant unless the
    /// watch has fired or (queued by an earlier call of this session) still
    /// serves that call.
    async fn grant_or_wait(
        &self,
        command: Command,
        session: SessionId,
        name: &str,
        wait: Duration,
        granted: tokio::sync::oneshot::Receiver<WaitEnd>,
    ) -> Waited {
        let unwatched = |answer| {
            self.shared.unwatch_grant(session, name);
            Waited::Answered(answer)
        };
        let applied = match self.propose(command).await {
            Ok(a) => a,
            Err(status) => return unwatched(Err(status)),
        };
        match applied.outcome {
            Ok(Reply::Acquired { token, slot, .. }) => unwatched(Ok((token, slot))),
            // Already queued by an earlier call of this session: a call that does
            // not wait must not cancel that wait.
            Ok(Reply::Queued { .. }) if wait.is_zero() => {
                Waited::Answered(Err(ErrorCode::WouldBlock.status(format!(
                    "lock {name:?} is held; this session is already waiting for it"
                ))))
            }
            Ok(Reply::Queued { .. }) => match tokio::time::timeout(wait, granted).await {
                Ok(Ok(WaitEnd::Granted(token, slot))) => Waited::Answered(Ok((token, slot))),
                Ok(Ok(WaitEnd::Cancelled)) => Waited::Answered(Err(ErrorCode::Cancelled
                    .status(format!("the wait for lock {name:?} was cancelled")))),
                Ok(Err(_)) => Waited::Answered(Err(ErrorCode::UnknownSession
                    .status(format!("session {session} ended while waiting")))),
                Err(_) => {
                    self.shared.unwatch_grant(session, name);
                    Waited::TimedOut
                }
            },
            Ok(Reply::WouldBlock { holder_token }) => {
                unwatched(Err(ErrorCode::WouldBlock.status(format!(
                    "lock {name:?} is held{}",
                    holder_token
                        .map(|t| format!(" (token {t})"))
                        .unwrap_or_default()
                ))))
            }
            Ok(other) => Waited::Answered(Err(unexpected(&other))),
            Err(e) => unwatched(Err(machine_status(&e))),
        }
    }

    /// Leaves the queue after a wait ran out; granted in the meantime, the
    /// grant stands and is the caller's.
    async fn cancel_timed_out_wait(
        &self,
        session: SessionId,
        name: &str,
        wait: Duration,
    ) -> Result<(FencingToken, u32), Status> {
        let applied = self
            .propose(Command::CancelWait {
                session,
                name: name.to_owned(),
            })
            .await?;
        match applied.outcome {
            Err(MachineError::AlreadyGranted { token }) => {
                Ok((token, self.slot_of(session, name, token)))
            }
            Ok(_) | Err(MachineError::NotWaiting { .. }) => {
                Err(ErrorCode::WaitTimeout
                    .status(format!("lock {name:?} not granted within {wait:?}")))
            }
            Err(e) => Err(machine_status(&e)),
        }
    }
}

/// Leaves the queue, or releases the lock if it was granted meanwhile.
async fn cancel(api: &Api, session: SessionId, name: String) -> Result<(), Status> {
    let applied = api
        .propose(Command::CancelWait {
            session,
            name: name.clone(),
        })
        .await?;
    match applied.outcome {
        Ok(_) | Err(MachineError::NotWaiting { .. }) => Ok(()),
        Err(MachineError::AlreadyGranted { token }) => {
            let applied = api
                .propose(Command::Release {
                    session,
                    name,
                    token,
                })
                .await?;
            applied.outcome.map(|_| ()).map_err(|e| machine_status(&e))
        }
        Err(e) => Err(machine_status(&e)),
    }
}

#[tonic::async_trait]
impl Locks for Api {
    async fn create_session(
        &self,
        req: Request<CreateSessionRequest>,
    ) -> Result<Response<CreateSessionResponse>, Status> {
        let caller = admitted(&req)?;
        caller.may_hold_sessions()?;
        let r = req.into_inner();
        let key = self.session_keys.mint();
        let command = Command::CreateSession {
            ttl_ms: r.ttl_ms,
            label: r.label,
            owner: SessionOwner {
                identity: caller.identity.clone(),
                key_sha256: session_key_digest(&key),
            },
        };
        // Bad input is refused before it reaches the log: it changes nothing,
        // not even the commit index.
        command.check_input().map_err(|e| machine_status(&e))?;
        // The bound is the leader's to keep: a follower's count may lag, and
        // its open would be refused as not the leader's anyway.
        let (leading, leader) = {
            let metrics = self.raft.metrics();
            let m = metrics.borrow_watched();
            (m.state == openraft::ServerState::Leader, m.current_leader)
        };
        if !leading {
            return Err(self.not_leader(leader));
        }
        // Held until the session is applied (or the open failed), when
        // `sessions_of` counts it instead.
        let _opening = self.gatekeeper.reserve_session(&caller, || {
            let machine = self.shared.machine.read().expect("poisoned");
            machine.sessions_of(&caller.identity)
        })?;
        let applied = self.propose(command).await?;
        match applied.outcome {
            Ok(Reply::SessionCreated { session }) => {
                // Starts the countdown now rather than at the next sync.
                let _ = self.leases.keep_alive(session);
                Ok(Response::new(CreateSessionResponse {
                    session_id: session.0,
                    ttl_ms: r.ttl_ms,
                    session_key: key,
                }))
            }
            Ok(other) => Err(unexpected(&other)),
            Err(e) => Err(machine_status(&e)),
        }
    }

    async fn keep_alive(
        &self,
        req: Request<KeepAliveRequest>,
    ) -> Result<Response<KeepAliveResponse>, Status> {
        let caller = admitted(&req)?;
        caller.may_hold_sessions()?;
        let r = req.into_inner();
        let session = SessionId(r.session_id);
        self.check_owner(&caller, session, &r.session_key).await?;
        let ttl = match self.leases.keep_alive(session) {
            Ok(ttl) => ttl,
            Err(KeepAliveError::NotLeader) => {
                let leader = self.raft.metrics().borrow_watched().current_leader;
                return Err(self.not_leader(leader));
            }
            Err(KeepAliveError::UnknownSession) => {
                return Err(ErrorCode::UnknownSession.status(format!("unknown session {session}")));
            }
        };
        // The countdown moved only in this node's memory. Confirming leadership
        // after moving it proves no other leader existed when it moved, and any
        // later leader restarts the countdown at full TTL: the promise holds.
        self.linearize().await?;
        Ok(Response::new(KeepAliveResponse {
            ttl_ms: ttl.as_millis() as u64,
        }))
    }

    async fn close_session(
        &self,
        req: Request<CloseSessionRequest>,
    ) -> Result<Response<CloseSessionResponse>, Status> {
        let caller = admitted(&req)?;
        let r = req.into_inner();
        let session = SessionId(r.session_id);
        self.check_owner(&caller, session, &r.session_key).await?;
        let applied = self.propose(Command::CloseSession { session }).await?;
        applied.outcome.map_err(|e| machine_status(&e))?;
        Ok(Response::new(CloseSessionResponse {}))
    }

    async fn acquire(
        &self,
        req: Request<AcquireRequest>,
    ) -> Result<Response<AcquireResponse>, Status> {
        let caller = admitted(&req)?;
        let r = req.into_inner();
        let session = SessionId(r.session_id);
        let wait = Duration::from_millis(r.wait_ms);
        if wait > MAX_WAIT {
            return Err(input(format!(
                "wait {wait:?} exceeds the limit of {MAX_WAIT:?}"
            )));
        }
        let command = match claim_of(&r)? {
            // The plain lock stays the command older nodes know.
            Claim::Lock => Command::Acquire {
                session,
                name: r.name.clone(),
                wait: !wait.is_zero(),
                lock_delay_ms: r.lock_delay_ms,
            },
            claim => Command::Claim {
                session,
                name: r.name.clone(),
                claim,
                wait: !wait.is_zero(),
                lock_delay_ms: r.lock_delay_ms,
            },
        };
        // Bad input is refused before it reaches the log.
        command.check_input().map_err(|e| machine_status(&e))?;
        caller.may_lock(&r.name)?;
        self.check_owner(&caller, session, &r.session_key).await?;
        // Registered before proposing: a grant applied between the proposal and
        // the registration would otherwise be missed. Only entries after the
        // log's current end can answer it: this node may still be applying
        // older ones (after a restart, or as a leader not yet caught up), and
        // an old grant of this lock to this session must not answer this call
        // (a race found while chasing a `palisade sim` failure in which a
        // client got back a token it had released long before).
        let from = (self.last_log_index)() + 1;
        let granted = self.shared.watch_grant(session, &r.name, from);
        // Armed while the call may leave a wait behind: a client that goes
        // away mid-wait must not keep its place in the queue.
        let guard = AbandonedWait {
            api: Some(self.clone()),
            session,
            name: r.name.clone(),
        };
        let waited = self
            .grant_or_wait(command, session, &r.name, wait, granted)
            .await;
        guard.disarm();
        let (token, slot) = match waited {
            Waited::Answered(answer) => answer?,
            Waited::TimedOut => self.cancel_timed_out_wait(session, &r.name, wait).await?,
        };
        Ok(Response::new(AcquireResponse {
            token: token.get(),
            slot,
        }))
    }

    async fn proclaim(
        &self,
        req: Request<ProclaimRequest>,
    ) -> Result<Response<ProclaimResponse>, Status> {
        let caller = admitted(&req)?;
        let r = req.into_inner();
        let token = FencingToken::new(r.token).ok_or_else(|| input("token 0 is never issued"))?;
        let session = SessionId(r.session_id);
        let command = Command::Proclaim {
            session,
            name: r.name.clone(),
            token,
            value: r.value,
        };
        command.check_input().map_err(|e| machine_status(&e))?;
        caller.may_lock(&r.name)?;
        self.check_owner(&caller, session, &r.session_key).await?;
        let applied = self.propose(command).await?;
        applied.outcome.map_err(|e| machine_status(&e))?;
        Ok(Response::new(ProclaimResponse {}))
    }

    async fn cancel_acquire(
        &self,
        req: Request<CancelAcquireRequest>,
    ) -> Result<Response<CancelAcquireResponse>, Status> {
        let caller = admitted(&req)?;
        let r = req.into_inner();
        palisade_core::limits::validate_name(&r.name).map_err(input)?;
        caller.may_lock(&r.name)?;
        let session = SessionId(r.session_id);
        self.check_owner(&caller, session, &r.session_key).await?;
        cancel(self, session, r.name).await?;
        Ok(Response::new(CancelAcquireResponse {}))
    }

    async fn release(
        &self,
        req: Request<ReleaseRequest>,
    ) -> Result<Response<ReleaseResponse>, Status> {
        let caller = admitted(&req)?;
        let r = req.into_inner();
        palisade_core::limits::validate_name(&r.name).map_err(input)?;
        let token = FencingToken::new(r.token).ok_or_else(|| input("token 0 is never issued"))?;
        caller.may_lock(&r.name)?;
        self.check_owner(&caller, SessionId(r.session_id), &r.session_key)
            .await?;
        let applied = self
            .propose(Command::Release {
                session: SessionId(r.session_id),
                name: r.name,
                token,
            })
            .await?;
        applied.outcome.map_err(|e| machine_status(&e))?;
        Ok(Response::new(ReleaseResponse {}))
    }

    async fn get(&self, req: Request<GetRequest>) -> Result<Response<GetResponse>, Status> {
        let caller = admitted(&req)?;
        let name = req.into_inner().name;
        palisade_core::limits::validate_name(&name).map_err(input)?;
        caller.may_read(&name)?;
        self.linearize().await?;
        let view = self.shared.machine.read().expect("poisoned").get(&name);
        Ok(Response::new(GetResponse {
            lock: view.map(|v| self.lock_info(v)),
        }))
    }

    type ObserveStream = std::pin::Pin<
        Box<dyn futures_util::Stream<Item = Result<ObserveResponse, Status>> + Send + 'static>,
    >;

    async fn observe(
        &self,
        req: Request<ObserveRequest>,
    ) -> Result<Response<Self::ObserveStream>, Status> {
        let caller = admitted(&req)?;
        let name = req.into_inner().name;
        palisade_core::limits::validate_name(&name).map_err(input)?;
        caller.may_read(&name)?;
        let room = self.observers.clone().try_acquire_owned().map_err(|_| {
            ErrorCode::LimitReached.status(format!(
                "this node serves {MAX_OBSERVERS} observe streams already"
            ))
        })?;
        // The first state is a linearizable read; the ones after follow this
        // node's apply order, which is the log's.
        self.linearize().await?;
        let mut applied = self.shared.applied.subscribe();
        let shared = self.shared.clone();
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        tokio::spawn(async move {
            let _room = room;
            let mut last: Option<Option<LockInfo>> = None;
            loop {
                applied.borrow_and_update();
                let view = shared.machine.read().expect("poisoned").get(&name);
                let now = view.map(|v| lock_info(&shared, v));
                if last.as_ref() != Some(&now) {
                    let sent = ObserveResponse { lock: now.clone() };
                    if tx.send(Ok(sent)).await.is_err() {
                        return;
                    }
                    last = Some(now);
                }
                tokio::select! {
                    changed = applied.changed() => if changed.is_err() { return },
                    () = tx.closed() => return,
                }
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }

    async fn list(&self, req: Request<ListRequest>) -> Result<Response<ListResponse>, Status> {
        let caller = admitted(&req)?;
        if !caller.reads_something() {
            return Err(caller.may_read("").unwrap_err());
        }
        self.linearize().await?;
        let views = self.shared.machine.read().expect("poisoned").list();
        // Only the names the caller may read.
        Ok(Response::new(ListResponse {
            locks: views
                .into_iter()
                .filter(|v| caller.can_read(&v.name))
                .map(|v| self.lock_info(v))
                .collect(),
        }))
    }

    async fn check_token(
        &self,
        req: Request<CheckTokenRequest>,
    ) -> Result<Response<CheckTokenResponse>, Status> {
        let caller = admitted(&req)?;
        let r = req.into_inner();
        palisade_core::limits::validate_name(&r.name).map_err(input)?;
        let token = FencingToken::new(r.token).ok_or_else(|| input("token 0 is never issued"))?;
        caller.may_read(&r.name)?;
        self.linearize().await?;
        let machine = self.shared.machine.read().expect("poisoned");
        let current = machine.get(&r.name).and_then(|v| v.token);
        let is_current = matches!(
            machine.check_token(&r.name, token),
            palisade_core::machine::TokenCheck::Current
        );
        Ok(Response::new(CheckTokenResponse {
            current: is_current,
            current_token: current.map_or(0, FencingToken::get),
            issued_through: machine.last_applied(),
        }))
    }

    async fn status(
        &self,
        req: Request<StatusRequest>,
    ) -> Result<Response<StatusResponse>, Status> {
        let _caller = admitted(&req)?;
        let m = self.raft.metrics().borrow_watched().clone();
        let snapshot = *self.shared.snapshot_stats.lock().expect("poisoned");
        let commit = |p: f64| {
            self.commit_clock
                .as_ref()
                .and_then(|c| c.percentile(p))
                .map(|d| d.as_micros() as u64)
        };
        let membership = m.membership_config.membership();
        let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
        let member = |(id, n): (&NodeId, &NodeAddr)| Member {
            id: *id,
            addr: n.addr.clone(),
            peer_addr: n.peer(),
        };
        Ok(Response::new(StatusResponse {
            id: m.id,
            leader: m.current_leader.unwrap_or(0),
            term: m.current_term,
            commit_index: (self.committed)(),
            last_applied: m.last_applied.map_or(0, |l| l.index),
            members: membership
                .nodes()
                .filter(|(id, _)| voters.contains(id))
                .map(member)
                .collect(),
            learners: membership
                .nodes()
                .filter(|(id, _)| !voters.contains(id))
                .map(member)
                .collect(),
            state: format!("{:?}", m.state).to_lowercase(),
            snapshot_index: snapshot.index,
            snapshot_bytes: snapshot.bytes,
            snapshot_build_us: snapshot.build.map(|d| d.as_micros() as u64),
            snapshot_install_us: snapshot.install.map(|d| d.as_micros() as u64),
            commit_p50_us: commit(50.0),
            commit_p99_us: commit(99.0),
        }))
    }
}

#[tonic::async_trait]
impl Cluster for Api {
    async fn take_snapshot(
        &self,
        req: Request<TakeSnapshotRequest>,
    ) -> Result<Response<TakeSnapshotResponse>, Status> {
        let caller = admitted(&req)?;
        caller.may_administer()?;
        let unavailable = |e: &dyn std::fmt::Display| ErrorCode::Unavailable.status(e.to_string());
        // Everything applied when asked must be in the snapshot that answers.
        let wanted = self
            .shared
            .last_applied
            .read()
            .expect("poisoned")
            .map_or(0, |l| l.index);
        let builds_before = self.shared.snapshot_stats.lock().expect("poisoned").builds;
        self.raft
            .trigger()
            .snapshot()
            .await
            .map_err(|e| unavailable(&e))?;
        let shared = self.shared.clone();
        let covers = |stats: &crate::store::sm::SnapshotStats| {
            stats.index >= wanted && stats.builds > builds_before
        };
        // A build already under way when asked may end short of `wanted`:
        // ask again until one covers it.
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(120);
        let mut asked_at = tokio::time::Instant::now();
        loop {
            let stats = *shared.snapshot_stats.lock().expect("poisoned");
            if covers(&stats) {
                return Ok(Response::new(TakeSnapshotResponse {
                    id: self.raft.metrics().borrow_watched().id,
                    snapshot_index: stats.index,
                    bytes: stats.bytes,
                    build_us: stats.build.map_or(0, |d| d.as_micros() as u64),
                }));
            }
            let now = tokio::time::Instant::now();
            if now > deadline {
                return Err(unavailable(&"no snapshot was built within 120 s"));
            }
            if now - asked_at > std::time::Duration::from_secs(5) {
                self.raft
                    .trigger()
                    .snapshot()
                    .await
                    .map_err(|e| unavailable(&e))?;
                asked_at = now;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }

    async fn add_learner(
        &self,
        req: Request<AddLearnerRequest>,
    ) -> Result<Response<MembershipResponse>, Status> {
        let caller = admitted(&req)?;
        caller.may_administer()?;
        let r = req.into_inner();
        if r.id == 0
            || !r.addr.contains(':')
            || !(r.peer_addr.is_empty() || r.peer_addr.contains(':'))
        {
            return Err(input("a learner needs an id > 0 and addresses HOST:PORT"));
        }
        let node = NodeAddr::new(r.addr, r.peer_addr);
        match self.raft.add_learner(r.id, node, true).await {
            Ok(resp) => Ok(Response::new(MembershipResponse {
                log_index: resp.log_id.index,
            })),
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f))) => {
                Err(self.not_leader(f.leader_id))
            }
            Err(e) => Err(ErrorCode::Unavailable.status(e.to_string())),
        }
    }

    async fn change_membership(
        &self,
        req: Request<ChangeMembershipRequest>,
    ) -> Result<Response<MembershipResponse>, Status> {
        let caller = admitted(&req)?;
        caller.may_administer()?;
        let voters: BTreeSet<NodeId> = req.into_inner().voters.into_iter().collect();
        if voters.is_empty() || voters.contains(&0) {
            return Err(input("voters must be non-empty node ids > 0"));
        }
        match self.raft.change_membership(voters, false).await {
            Ok(resp) => Ok(Response::new(MembershipResponse {
                log_index: resp.log_id.index,
            })),
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f))) => {
                Err(self.not_leader(f.leader_id))
            }
            Err(RaftError::APIError(e)) => Err(input(e)),
            Err(e) => Err(ErrorCode::Unavailable.status(e.to_string())),
        }
    }
}

/// Parses `1=HOST:PORT,2=HOST:PORT/PEERHOST:PEERPORT`: each node's client
/// address and, after a slash, its peer address (default: the client port + 1).
///
/// # Errors
/// A message naming the malformed part.
pub fn parse_initial_cluster(s: &str) -> Result<BTreeMap<NodeId, NodeAddr>, String> {
    let mut nodes = BTreeMap::new();
    for part in s.split(',').filter(|p| !p.trim().is_empty()) {
        let (id, addr) = part
            .split_once('=')
            .ok_or_else(|| format!("{part:?}: expected ID=HOST:PORT"))?;
        let id: NodeId = id
            .trim()
            .parse()
            .map_err(|_| format!("{part:?}: bad node id"))?;
        let (addr, peer) = match addr.trim().split_once('/') {
            Some((addr, peer)) => (addr.to_owned(), peer.to_owned()),
            None => (
                addr.trim().to_owned(),
                default_peer_addr(addr.trim()).unwrap_or_default(),
            ),
        };
        if id == 0 || !addr.contains(':') || !peer.contains(':') {
            return Err(format!(
                "{part:?}: expected ID>0 and HOST:PORT[/PEERHOST:PEERPORT]"
            ));
        }
        if nodes.insert(id, NodeAddr::new(addr, peer)).is_some() {
            return Err(format!("node id {id} listed twice"));
        }
    }
    if nodes.is_empty() {
        return Err("empty cluster".into());
    }
    Ok(nodes)
}

/// `view` on the wire, with its sessions' labels from `shared`'s machine.
fn lock_info(shared: &Shared, view: palisade_core::machine::LockView) -> LockInfo {
    let machine = shared.machine.read().expect("poisoned");
    let label_of = |id: SessionId| {
        machine
            .session_label(id)
            .map(str::to_owned)
            .unwrap_or_default()
    };
    let holders = view
        .holders
        .iter()
        .map(|h| HolderInfo {
            session: h.session.0,
            label: label_of(h.session),
            token: h.token.get(),
            shared: h.mode == Mode::Shared,
            slot: h.slot,
            value: h.value.clone(),
        })
        .collect();
    LockInfo {
        name: view.name,
        holder_session: view.holder.map_or(0, |s| s.0),
        holder_label: view.holder.map(label_of).unwrap_or_default(),
        token: view.token.map_or(0, FencingToken::get),
        waiters: view.waiters.iter().map(|s| s.0).collect(),
        in_lock_delay: view.in_lock_delay,
        shape: view.shape.as_str().to_owned(),
        permits: match view.shape {
            Shape::Semaphore { permits } => permits,
            _ => 0,
        },
        holders,
    }
}
