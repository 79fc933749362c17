//! Correctness locks on etcd v3, behind [`FencedLocks`]: etcd's own mutex recipe
//! (`client/v3/concurrency/mutex.go`) with a fencing token.
//!
//! # Design
//! - **Session** = one etcd lease (`LeaseGrant`), kept alive over a
//!   `LeaseKeepAlive` stream every third of its TTL. etcd's leader measures
//!   the lease and restarts every lease's countdown when leadership changes, so
//!   a lease never ends early. The client's guarantee counts from the moment
//!   the last acknowledged keep-alive was *sent*, on its monotonic clock, minus
//!   a safety margin; it is lost when keep-alives fail past it, or at once when
//!   etcd answers that the lease is gone.
//! - **Acquire**: one transaction creates this session's key
//!   `/palisade/locks/NAME/LEASE` attached to the lease (or finds it, if this
//!   session already queued). Its `create_revision` orders the queue: the lock
//!   is ours when no key of the lock's prefix has a lower one. A waiter watches
//!   only its predecessor's key (no herd) and re-checks after every deletion;
//!   after waking it checks its own key still exists (the session may have
//!   expired meanwhile).
//! - **Token** = the own key's `create_revision` (what etcd calls the lock's
//!   revision): a later holder's key was created later, and etcd's revisions
//!   only grow, across leader changes and restarts.
//! - A key of this session that `acquire` finds already there is one of three
//!   things, told apart by a random value written with each create: this very
//!   call's own create, retried after a lost reply (same value: it is ours); the
//!   key of a lease this process still holds (the same grant is returned, as
//!   before); or a leftover of a release or a give-up whose delete failed
//!   (during a leader change, say). A leftover is deleted and a new key created,
//!   so the new grant gets a new, higher token — never the earlier grant's again.
//! - A wait that ends unanswered (or `wait = 0` on a held lock) deletes the own
//!   key: nothing is left behind. A key whose delete failed (a release, a
//!   give-up, a lease dropped, all while etcd did not answer), whose create's
//!   outcome stayed unknown, or made by an acquisition abandoned midway (its
//!   future dropped) would otherwise wait in the queue owned by no one,
//!   blocking the lock as long as this session's lease is kept alive: such
//!   keys are remembered and deleted after a later keep-alive succeeds, each
//!   only if it is still that key (same create revision, or same random
//!   value). Lease TTLs are whole seconds in etcd: a TTL is
//!   rounded up, and the TTL etcd grants (it may raise it) is the one used.
//! - **Elections** (`Claim::Lead`, docs/recipes.md): etcd's election recipe is
//!   its mutex with a value, and so is this: the same queue under
//!   [`ELECTION_PREFIX`], the candidate's value stored in its key, the leader
//!   the lowest create revision, the token that revision. Semaphores and
//!   read/write locks are refused by name (`InvalidInput`). Proclaiming a new
//!   value and observing are not in the lock trait: read the prefix with
//!   etcd's own tools.
//! - No lock-delay. Plaintext gRPC (`http://`) by default; with [`EtcdTls`],
//!   TLS that trusts only the given CA and checks each member's name, and a
//!   client certificate when given: with `--client-cert-auth` and auth
//!   enabled, etcd takes the certificate's common name as the user, so its
//!   roles decide which lock names (keys under [`PREFIX`]) the caller may take.

mod pb {
    #![allow(missing_docs, clippy::all, clippy::pedantic)]
    tonic::include_proto!("etcdserverpb");
}

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use palisade_core::backend::{Descriptor, Facts, Scheme};
use palisade_core::guarantee::Guarantee;
use palisade_core::lock::BoxFuture;
use palisade_core::{
    FencedLease, FencedLocks, FencingToken, GuaranteedLease, LockError, LockOptions,
};
use pb::compare::{CompareResult, CompareTarget, TargetUnion};
use pb::kv_client::KvClient;
use pb::lease_client::LeaseClient;
use pb::request_op::Request as Op;
use pb::watch_client::WatchClient;
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

/// The backend's name in errors and URLs.
pub const BACKEND: &str = "etcd";

/// The key prefix every lock lives under.
pub const PREFIX: &str = "/palisade/locks/";

/// Where elections' keys live (`ELECTION_PREFIX` NAME `/` LEASE), apart from
/// the locks': an election and a lock of one name are two things. As in etcd's
/// own election recipe (`client/v3/concurrency/election.go`), the leader is the
/// key with the lowest create revision; its value is 16 random bytes (this
/// create's, see the module docs) followed by the candidate's value.
pub const ELECTION_PREFIX: &str = "/palisade/elections/";

fn unavailable(detail: impl std::fmt::Display) -> LockError {
    LockError::Unavailable {
        backend: BACKEND,
        detail: detail.to_string(),
        why: palisade_core::Unreachable::Unknown,
    }
}

fn status_error(s: &tonic::Status) -> LockError {
    match s.code() {
        tonic::Code::Unauthenticated => {
            LockError::Unauthenticated(format!("etcd: {}", s.message()))
        }
        tonic::Code::PermissionDenied => {
            LockError::PermissionDenied(format!("etcd: {}", s.message()))
        }
        tonic::Code::InvalidArgument => LockError::InvalidInput(format!("etcd: {}", s.message())),
        _ => unavailable(format!("{}: {}", s.code(), s.message())),
    }
}

/// A TLS handshake that failed on a certificate, as a typed refusal: a
/// member whose certificate is not of the CA, or a member that refused this
/// client's (none, or not of its CA). Such a failure repeats on every try, so
/// it is not reported as "unavailable" (which callers retry). hyper and h2
/// pass rustls' error on as text, so the text is what can be read; a refusal
/// may also surface as a broken pipe, which is retried until the alert is
/// seen.
fn tls_refusal(s: &tonic::Status) -> Option<LockError> {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(s);
    while let Some(e) = cause {
        let text = e.to_string();
        if text.contains("invalid peer certificate") {
            return Some(LockError::Unauthenticated(format!(
                "etcd: the member's certificate is not trusted ({text})"
            )));
        }
        if let Some(alert) = text.split("received fatal alert: ").nth(1)
            && (alert.contains("Certificate") || alert.contains("UnknownCA"))
        {
            return Some(LockError::Unauthenticated(format!(
                "etcd: the member refused this client's certificate (TLS alert {alert}); \
                 give --cert/--key of a certificate its --trusted-ca-file issued"
            )));
        }
        cause = e.source();
    }
    None
}

/// The smallest key greater than every key that starts with `prefix`.
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// Channels to the cluster's members; calls fail over to the next on a
/// transport error.
struct Members {
    channels: Vec<Channel>,
    next: AtomicUsize,
    rpc_timeout: Duration,
}

impl Members {
    fn pick(&self) -> Channel {
        let i = self.next.load(Ordering::Relaxed) % self.channels.len();
        self.channels[i].clone()
    }

    fn rotate(&self) {
        self.next.fetch_add(1, Ordering::Relaxed);
    }

    /// Runs `rpc` against a member, moving on to the next after a transport
    /// failure, for up to `budget`.
    async fn call<T, F, Fut>(&self, budget: Duration, mut rpc: F) -> Result<T, LockError>
    where
        F: FnMut(Channel) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let give_up = Instant::now() + budget;
        let mut last: String;
        loop {
            match tokio::time::timeout(self.rpc_timeout, rpc(self.pick())).await {
                Ok(Ok(reply)) => return Ok(reply.into_inner()),
                // `Cancelled` is what a request gets when its connection closes
                // under it: a transport failure like the others. Every call here
                // may be repeated (`create_key` recognises its own create; a
                // repeated lease grant leaves an unused lease that expires).
                Ok(Err(s)) if tls_refusal(&s).is_some() => {
                    return Err(tls_refusal(&s).expect("just matched"));
                }
                Ok(Err(s))
                    if matches!(
                        s.code(),
                        tonic::Code::Unavailable
                            | tonic::Code::Unknown
                            | tonic::Code::Internal
                            | tonic::Code::Cancelled
                    ) =>
                {
                    last = format!("{}: {}", s.code(), s.message());
                }
                Ok(Err(s)) => return Err(status_error(&s)),
                Err(_) => last = "timed out".into(),
            }
            self.rotate();
            if Instant::now() >= give_up {
                return Err(unavailable(last));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

struct Session {
    members: Members,
    lease: i64,
    ttl: Duration,
    guarantee: Guarantee,
    /// Set right after the session is built (the task needs the session).
    keep_alive: std::sync::OnceLock<tokio::task::AbortHandle>,
    /// The keys of the live `EtcdLease`s of this process: a key of this session
    /// found by `acquire` that is not one of these is a leftover (see there).
    held: std::sync::Mutex<std::collections::HashSet<Vec<u8>>>,
    /// Keys of this session that may sit in a queue owned by no one; deleted
    /// after a later keep-alive succeeds.
    strays: std::sync::Mutex<Vec<Stray>>,
    /// A sweep of the strays is under way.
    sweeping: std::sync::atomic::AtomicBool,
}

/// How long a key whose create's outcome is unknown is looked for: a create
/// still in flight inside etcd (proposed, not yet committed) may land after
/// the first look.
const UNKNOWN_CREATE_WATCH: Duration = Duration::from_secs(30);

/// A key of this session that no acquisition or lease owns any more.
#[derive(Debug, Clone)]
enum Stray {
    /// A key whose delete failed: deleted if it still has this create revision.
    Made { key: Vec<u8>, revision: i64 },
    /// A key whose create's outcome is unknown: deleted if it holds this
    /// value, looked for until `until`.
    Maybe {
        key: Vec<u8>,
        value: Vec<u8>,
        until: Instant,
    },
}

impl Session {
    /// Deletes the key of grant `revision`, or remembers it when etcd does
    /// not answer.
    async fn delete_or_remember(&self, key: &[u8], revision: i64) {
        if delete(self, key).await.is_err() {
            self.remember(Stray::Made {
                key: key.to_vec(),
                revision,
            });
        }
    }

    fn remember(&self, stray: Stray) {
        self.strays.lock().expect("poisoned").push(stray);
    }

    /// Deletes the remembered strays that are still what was remembered; keeps
    /// those etcd does not answer for, and unknown creates still watched.
    async fn sweep_strays(&self) {
        let strays = std::mem::take(&mut *self.strays.lock().expect("poisoned"));
        for stray in strays {
            let (key, compare_target, target) = match &stray {
                Stray::Made { key, revision } => (
                    key,
                    CompareTarget::Create,
                    TargetUnion::CreateRevision(*revision),
                ),
                Stray::Maybe { key, value, .. } => {
                    (key, CompareTarget::Value, TargetUnion::Value(value.clone()))
                }
            };
            let txn = delete_if(key, compare_target, target);
            let reply = self
                .members
                .call(Duration::from_secs(5), |ch| {
                    let txn = txn.clone();
                    async move { KvClient::new(ch).txn(txn).await }
                })
                .await;
            let done = match (&stray, reply) {
                (_, Err(_)) => false,
                (Stray::Made { .. }, Ok(_)) => true,
                (Stray::Maybe { until, .. }, Ok(r)) => r.succeeded || Instant::now() >= *until,
            };
            if !done {
                self.remember(stray);
            }
        }
    }

    fn stop_keep_alive(&self) {
        if let Some(task) = self.keep_alive.get() {
            task.abort();
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.stop_keep_alive();
        // Best effort: revoking deletes every key of the lease now, not at expiry.
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let (channel, lease) = (self.members.pick(), self.lease);
            rt.spawn(async move {
                let _ = LeaseClient::new(channel)
                    .lease_revoke(pb::LeaseRevokeRequest { id: lease })
                    .await;
            });
        }
    }
}

/// A lazily connecting channel to the member at `endpoint` (`HOST:PORT`).
fn member_channel(endpoint: &str, tls: Option<&EtcdTls>) -> Result<Channel, LockError> {
    let bad = |what: String| LockError::InvalidInput(format!("etcd endpoint {endpoint:?}: {what}"));
    let Some((host, _port)) = endpoint
        .rsplit_once(':')
        .filter(|_| !endpoint.contains("://"))
    else {
        return Err(bad("expected HOST:PORT".into()));
    };
    let scheme = if tls.is_some() { "https" } else { "http" };
    let mut channel = Endpoint::from_shared(format!("{scheme}://{endpoint}"))
        .map_err(|err| bad(err.to_string()))?
        .connect_timeout(Duration::from_secs(1))
        .tcp_nodelay(true);
    if let Some(tls) = tls {
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let mut config = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(&tls.ca_pem))
            .domain_name(tls.server_name.clone().unwrap_or_else(|| host.to_owned()));
        if let Some((cert, key)) = &tls.identity {
            config = config.identity(Identity::from_pem(cert, key));
        }
        channel = channel
            .tls_config(config)
            .map_err(|err| LockError::InvalidInput(format!("etcd TLS: {err}")))?;
    }
    Ok(channel.connect_lazy())
}

/// Correctness locks on an etcd cluster: one lease (session) per value.
pub struct EtcdLocks {
    session: Arc<Session>,
}

/// TLS to the etcd members (the CA that signed the members' certificates,
/// this client's certificate for `--client-cert-auth`, the name to expect).
pub type EtcdTls = palisade_core::backend::Tls;

impl EtcdLocks {
    /// Connects to `endpoints` (`HOST:PORT`, any members) in plaintext and
    /// opens a session of `ttl` (rounded up to whole seconds; at least 1 s).
    ///
    /// # Errors
    /// [`LockError::InvalidInput`] for no or malformed endpoints or a bad TTL;
    /// [`LockError::Unavailable`] when no member answers.
    pub async fn connect(endpoints: &[String], ttl: Duration) -> Result<EtcdLocks, LockError> {
        Self::connect_with(endpoints, ttl, None).await
    }

    /// As [`EtcdLocks::connect`], over TLS when `tls` is given.
    ///
    /// # Errors
    /// As [`EtcdLocks::connect`]; [`LockError::InvalidInput`] for a CA,
    /// certificate or key that does not parse; [`LockError::Unauthenticated`]
    /// when a member's certificate is not of the CA or the member refuses this
    /// client's.
    pub async fn connect_with(
        endpoints: &[String],
        ttl: Duration,
        tls: Option<&EtcdTls>,
    ) -> Result<EtcdLocks, LockError> {
        palisade_core::limits::validate_ttl(ttl)
            .map_err(|e| LockError::InvalidInput(e.to_string()))?;
        if endpoints.is_empty() {
            return Err(LockError::InvalidInput(
                "etcd:// needs at least one HOST:PORT".into(),
            ));
        }
        let mut channels = Vec::new();
        for e in endpoints {
            channels.push(member_channel(e, tls)?);
        }
        let members = Members {
            channels,
            next: AtomicUsize::new(0),
            rpc_timeout: Duration::from_secs(2),
        };
        let secs = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
        let sent = Instant::now();
        let granted = members
            .call(Duration::from_secs(10), |ch| async move {
                LeaseClient::new(ch)
                    .lease_grant(pb::LeaseGrantRequest {
                        ttl: secs.max(1) as i64,
                        id: 0,
                    })
                    .await
            })
            .await?;
        if !granted.error.is_empty() || granted.ttl <= 0 {
            return Err(unavailable(format!("lease grant: {}", granted.error)));
        }
        let ttl = Duration::from_secs(granted.ttl as u64);
        let guarantee = Guarantee::new(sent, ttl);
        let session = Arc::new(Session {
            members,
            lease: granted.id,
            ttl,
            guarantee,
            keep_alive: std::sync::OnceLock::new(),
            held: std::sync::Mutex::default(),
            strays: std::sync::Mutex::default(),
            sweeping: std::sync::atomic::AtomicBool::new(false),
        });
        let task = tokio::spawn(keep_alive(Arc::downgrade(&session)));
        let _ = session.keep_alive.set(task.abort_handle());
        Ok(EtcdLocks { session })
    }

    /// The session's lease id.
    pub fn lease_id(&self) -> i64 {
        self.session.lease
    }

    /// Acquires `name`; see [`FencedLocks::acquire`].
    ///
    /// # Errors
    /// [`LockError::InvalidInput`] (name, lock-delay), [`LockError::WouldBlock`],
    /// [`LockError::WaitTimeout`], [`LockError::SessionExpired`],
    /// [`LockError::Unavailable`].
    pub async fn acquire(&self, name: &str, options: &LockOptions) -> Result<EtcdLease, LockError> {
        palisade_core::limits::validate_name(name)
            .map_err(|e| LockError::InvalidInput(e.to_string()))?;
        if !options.lock_delay.is_zero() {
            return Err(LockError::InvalidInput(
                "the etcd backend has no lock-delay".into(),
            ));
        }
        let s = &self.session;
        if s.guarantee.remaining().is_zero() {
            return Err(LockError::SessionExpired);
        }
        let candidate = options.lock_or_lead(BACKEND)?;
        let root = if candidate.is_some() {
            ELECTION_PREFIX
        } else {
            PREFIX
        };
        let prefix = format!("{root}{name}/").into_bytes();
        let mut key = prefix.clone();
        key.extend_from_slice(format!("{:016x}", s.lease).as_bytes());
        // The random value of this acquisition's create: how its key is told
        // apart from a leftover (see the module docs). A candidate's value
        // follows it, for whoever reads the election.
        let nonce: [u8; 16] = rand::random();
        let mut value = nonce.to_vec();
        value.extend_from_slice(candidate.unwrap_or_default().as_bytes());
        // An acquisition abandoned midway (its future dropped, say by a
        // timeout around it) may have made a key no one will delete.
        let mut abandoned = Abandoned {
            session: Some(s),
            key: &key,
            value: &value,
        };
        let result = self
            .acquire_with(name, options, &prefix, &key, &value)
            .await;
        abandoned.session = None;
        result
    }

    async fn acquire_with(
        &self,
        name: &str,
        options: &LockOptions,
        prefix: &[u8],
        key: &[u8],
        value: &[u8],
    ) -> Result<EtcdLease, LockError> {
        let s = &self.session;
        let give_up = Instant::now() + options.wait;
        let budget = Duration::from_secs(10);
        let my_rev = match self.create_key(key, value, budget).await {
            Ok(rev) => rev,
            Err(e) => {
                // The create may have landed though its answer did not.
                s.remember(Stray::Maybe {
                    key: key.to_vec(),
                    value: value.to_vec(),
                    until: Instant::now() + UNKNOWN_CREATE_WATCH,
                });
                return Err(e);
            }
        };
        let Some(token) = u64::try_from(my_rev).ok().and_then(FencingToken::new) else {
            s.delete_or_remember(key, my_rev).await;
            return Err(unavailable(format!("etcd returned revision {my_rev}")));
        };
        let outcome = self
            .wait_for_predecessors(prefix, key, my_rev, options.wait, give_up)
            .await;
        match outcome {
            // The grant arrived after the session's guarantee ran out (this
            // process paused, or the reply was held): it may be superseded
            // already, so it is given back, never handed out.
            Ok(()) if s.guarantee.remaining().is_zero() => {
                s.delete_or_remember(key, my_rev).await;
                Err(LockError::GrantTooLate)
            }
            Ok(()) => {
                s.held.lock().expect("poisoned").insert(key.to_vec());
                Ok(EtcdLease {
                    session: self.session.clone(),
                    name: name.to_owned(),
                    key: key.to_vec(),
                    token,
                    released: false,
                })
            }
            Err(e) => {
                // Leave nothing behind: our queue entry goes.
                s.delete_or_remember(key, my_rev).await;
                Err(e)
            }
        }
    }

    /// Creates this session's key for a lock, or finds it; returns its create
    /// revision. See the module docs for what a key found already there means.
    async fn create_key(
        &self,
        key: &[u8],
        nonce: &[u8],
        budget: Duration,
    ) -> Result<i64, LockError> {
        let s = &self.session;
        for _ in 0..3 {
            let txn = pb::TxnRequest {
                compare: vec![pb::Compare {
                    result: CompareResult::Equal as i32,
                    target: CompareTarget::Create as i32,
                    key: key.to_vec(),
                    target_union: Some(TargetUnion::CreateRevision(0)),
                    range_end: Vec::new(),
                }],
                success: vec![pb::RequestOp {
                    request: Some(Op::RequestPut(pb::PutRequest {
                        key: key.to_vec(),
                        value: nonce.to_vec(),
                        lease: s.lease,
                        ..Default::default()
                    })),
                }],
                failure: vec![pb::RequestOp {
                    request: Some(Op::RequestRange(pb::RangeRequest {
                        key: key.to_vec(),
                        ..Default::default()
                    })),
                }],
            };
            let reply = s
                .members
                .call(budget, |ch| {
                    let txn = txn.clone();
                    async move { KvClient::new(ch).txn(txn).await }
                })
                .await?;
            if reply.succeeded {
                return Ok(reply.header.map_or(0, |h| h.revision));
            }
            let found = reply.responses.iter().find_map(|r| match &r.response {
                Some(pb::response_op::Response::ResponseRange(range)) => range.kvs.first().cloned(),
                _ => None,
            });
            // Gone between the compare and the read: create again.
            let Some(kv) = found else { continue };
            if kv.value == nonce || s.held.lock().expect("poisoned").contains(key) {
                return Ok(kv.create_revision);
            }
            // A leftover of an earlier hold or wait: delete it (if it is still
            // that very key) and create a new one behind everyone queued.
            let delete_leftover = delete_if(
                key,
                CompareTarget::Mod,
                TargetUnion::ModRevision(kv.mod_revision),
            );
            s.members
                .call(budget, |ch| {
                    let txn = delete_leftover.clone();
                    async move { KvClient::new(ch).txn(txn).await }
                })
                .await?;
        }
        Err(unavailable(
            "this session's key for the lock keeps changing under it".to_string(),
        ))
    }

    /// Waits until no key of `prefix` was created before ours.
    async fn wait_for_predecessors(
        &self,
        prefix: &[u8],
        key: &[u8],
        my_rev: i64,
        wait: Duration,
        give_up: Instant,
    ) -> Result<(), LockError> {
        let s = &self.session;
        let budget = Duration::from_secs(10);
        loop {
            let range = pb::RangeRequest {
                key: prefix.to_vec(),
                range_end: prefix_end(prefix),
                limit: 1,
                sort_order: pb::range_request::SortOrder::Descend as i32,
                sort_target: pb::range_request::SortTarget::Create as i32,
                max_create_revision: my_rev - 1,
                ..Default::default()
            };
            let found = s
                .members
                .call(budget, |ch| {
                    let range = range.clone();
                    async move { KvClient::new(ch).range(range).await }
                })
                .await?;
            let Some(predecessor) = found.kvs.first() else {
                // Ours is the oldest key; is it still there (session alive)?
                let mine = s
                    .members
                    .call(budget, |ch| {
                        let key = key.to_vec();
                        async move {
                            KvClient::new(ch)
                                .range(pb::RangeRequest {
                                    key,
                                    ..Default::default()
                                })
                                .await
                        }
                    })
                    .await?;
                return if mine.kvs.is_empty() {
                    Err(LockError::SessionExpired)
                } else {
                    Ok(())
                };
            };
            if wait.is_zero() {
                return Err(LockError::WouldBlock);
            }
            let now = Instant::now();
            if now >= give_up {
                return Err(LockError::WaitTimeout);
            }
            let start = found.header.map_or(0, |h| h.revision) + 1;
            let deleted = watch_delete(s, predecessor.key.clone(), start);
            match tokio::time::timeout(give_up - now, deleted).await {
                Ok(()) => continue,
                Err(_) => return Err(LockError::WaitTimeout),
            }
        }
    }
}

/// Completes when `key` is deleted at or after `start` (or the watch breaks,
/// which the caller answers by looking again).
async fn watch_delete(s: &Session, key: Vec<u8>, start: i64) {
    let (tx, rx) = mpsc::channel(1);
    let create = pb::WatchRequest {
        request_union: Some(pb::watch_request::RequestUnion::CreateRequest(
            pb::WatchCreateRequest {
                key,
                start_revision: start,
                ..Default::default()
            },
        )),
    };
    if tx.send(create).await.is_err() {
        return;
    }
    let Ok(reply) = WatchClient::new(s.members.pick())
        .watch(ReceiverStream::new(rx))
        .await
    else {
        s.members.rotate();
        tokio::time::sleep(Duration::from_millis(100)).await;
        return;
    };
    let mut events = reply.into_inner();
    while let Some(Ok(resp)) = events.next().await {
        if resp.canceled
            || resp
                .events
                .iter()
                .any(|e| e.r#type == pb::event::EventType::Delete as i32)
        {
            return;
        }
    }
    // The stream ended (the member went away): look again.
    s.members.rotate();
    tokio::time::sleep(Duration::from_millis(100)).await;
    drop(tx);
}

/// A transaction that deletes `key` only if its `target` still equals `value`
/// (it is still the key we mean, not a later one of the same name).
fn delete_if(key: &[u8], target: CompareTarget, value: TargetUnion) -> pb::TxnRequest {
    pb::TxnRequest {
        compare: vec![pb::Compare {
            result: CompareResult::Equal as i32,
            target: target as i32,
            key: key.to_vec(),
            target_union: Some(value),
            range_end: Vec::new(),
        }],
        success: vec![pb::RequestOp {
            request: Some(Op::RequestDeleteRange(pb::DeleteRangeRequest {
                key: key.to_vec(),
                ..Default::default()
            })),
        }],
        failure: Vec::new(),
    }
}

async fn delete(s: &Session, key: &[u8]) -> Result<i64, LockError> {
    let reply = s
        .members
        .call(Duration::from_secs(5), |ch| {
            let key = key.to_vec();
            async move {
                KvClient::new(ch)
                    .delete_range(pb::DeleteRangeRequest {
                        key,
                        ..Default::default()
                    })
                    .await
            }
        })
        .await?;
    Ok(reply.deleted)
}

/// Remembers an acquisition's key for the sweep unless disarmed (its
/// `session` taken) before it is dropped.
struct Abandoned<'a> {
    session: Option<&'a Session>,
    key: &'a [u8],
    value: &'a [u8],
}

impl Drop for Abandoned<'_> {
    fn drop(&mut self) {
        if let Some(s) = self.session {
            s.remember(Stray::Maybe {
                key: self.key.to_vec(),
                value: self.value.to_vec(),
                until: Instant::now() + UNKNOWN_CREATE_WATCH,
            });
        }
    }
}

/// Keeps the session's lease alive over one stream, reopened after failures.
async fn keep_alive(session: std::sync::Weak<Session>) {
    loop {
        let Some(s) = session.upgrade() else { return };
        let (every, lease) = (s.ttl / 3, s.lease);
        let (tx, rx) = mpsc::channel(4);
        // The first request goes in before the call: the server answers the
        // call's headers only once it has a request to answer.
        let mut sent = Instant::now();
        if tx
            .send(pb::LeaseKeepAliveRequest { id: lease })
            .await
            .is_err()
        {
            return;
        }
        let call = tokio::time::timeout(
            every.max(Duration::from_millis(100)),
            LeaseClient::new(s.members.pick()).lease_keep_alive(ReceiverStream::new(rx)),
        )
        .await;
        let mut replies = match call {
            Ok(Ok(r)) => r.into_inner(),
            failed => {
                tracing::debug!(?failed, "etcd keep-alive stream failed; next member");
                s.members.rotate();
                drop(s);
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        drop(s);
        loop {
            let reply =
                tokio::time::timeout(every.max(Duration::from_millis(100)), replies.next()).await;
            let Some(s) = session.upgrade() else { return };
            match reply {
                Ok(Some(Ok(r))) if r.ttl > 0 => {
                    s.guarantee.renewed(sent);
                    // etcd answers: a good moment to delete what was left in
                    // a queue while it did not. Beside the keep-alive, so a
                    // slow sweep never holds back the next one.
                    let pending = !s.strays.lock().expect("poisoned").is_empty();
                    if pending && !s.sweeping.swap(true, Ordering::SeqCst) {
                        let s = s.clone();
                        tokio::spawn(async move {
                            s.sweep_strays().await;
                            s.sweeping.store(false, Ordering::SeqCst);
                        });
                    }
                }
                Ok(Some(Ok(_))) => {
                    tracing::warn!(lease, "etcd lease expired");
                    s.guarantee.end();
                    return;
                }
                _ => {
                    tracing::debug!(lease, "etcd keep-alive failed; reopening");
                    s.members.rotate();
                    break;
                }
            }
            drop(s);
            tokio::time::sleep(every).await;
            sent = Instant::now();
            if tx
                .send(pb::LeaseKeepAliveRequest { id: lease })
                .await
                .is_err()
            {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

impl FencedLocks for EtcdLocks {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn acquire<'a>(
        &'a self,
        name: &'a str,
        options: &'a LockOptions,
    ) -> BoxFuture<'a, Result<Box<dyn FencedLease>, LockError>> {
        Box::pin(async move {
            let lease = EtcdLocks::acquire(self, name, options).await?;
            Ok(Box::new(lease) as Box<dyn FencedLease>)
        })
    }

    fn close(self: Box<Self>) -> BoxFuture<'static, Result<(), LockError>> {
        Box::pin(async move {
            let s = &self.session;
            s.stop_keep_alive();
            let lease = s.lease;
            s.members
                .call(Duration::from_secs(5), |ch| async move {
                    LeaseClient::new(ch)
                        .lease_revoke(pb::LeaseRevokeRequest { id: lease })
                        .await
                })
                .await
                .map(|_| ())
        })
    }
}

/// One hold of an etcd lock. Dropping it deletes the key in the background.
pub struct EtcdLease {
    session: Arc<Session>,
    name: String,
    key: Vec<u8>,
    token: FencingToken,
    released: bool,
}

impl EtcdLease {
    /// Releases the hold (deletes its key; the next waiter is woken by etcd).
    ///
    /// # Errors
    /// [`LockError::NotHolder`] when the key was already gone (the session
    /// expired); [`LockError::Unavailable`].
    pub async fn release(mut self) -> Result<(), LockError> {
        self.released = true;
        self.session
            .held
            .lock()
            .expect("poisoned")
            .remove(&self.key);
        let deleted = match delete(&self.session, &self.key).await {
            Ok(deleted) => deleted,
            Err(e) => {
                // The key may still be there, first in the queue: it is
                // deleted after a later keep-alive succeeds.
                self.session.remember(Stray::Made {
                    key: self.key.clone(),
                    revision: self.token.get() as i64,
                });
                return Err(e);
            }
        };
        match deleted {
            1 => Ok(()),
            _ => Err(LockError::NotHolder(format!(
                "the hold on {:?} had already ended (its session expired)",
                self.name
            ))),
        }
    }
}

impl GuaranteedLease for EtcdLease {
    fn lock_name(&self) -> &str {
        &self.name
    }

    fn fencing_token(&self) -> FencingToken {
        self.token
    }

    fn guarantee(&self) -> &Guarantee {
        &self.session.guarantee
    }

    fn release_boxed(self: Box<Self>) -> BoxFuture<'static, Result<(), LockError>> {
        Box::pin(async move { (*self).release().await })
    }
}

impl Drop for EtcdLease {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        self.session
            .held
            .lock()
            .expect("poisoned")
            .remove(&self.key);
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let (session, key) = (self.session.clone(), std::mem::take(&mut self.key));
            let revision = self.token.get() as i64;
            rt.spawn(async move { session.delete_or_remember(&key, revision).await });
        }
    }
}

impl std::fmt::Debug for EtcdLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdLease")
            .field("name", &self.name)
            .field("token", &self.token)
            .field("remaining", &self.remaining())
            .finish()
    }
}

/// The etcd backend, as the registry in `palisade-backends` lists it.
pub static DESCRIPTOR: Descriptor = Descriptor {
    name: "etcd",
    schemes: &[Scheme {
        scheme: "etcd",
        shape: "etcd://HOST:PORT[,HOST:PORT…]",
    }],
    facts: Facts {
        title: "etcd (lease + mutex recipe)",
        lease_on: "the etcd leader's lease countdown (monotonic)",
        token: "the lock key's create_revision",
        clocks: "no for tokens; a lease may outlive a paused holder",
    },
    connect: |_scheme, rest, session| {
        Box::pin(async move {
            session.refuse_bearer_token("etcd")?;
            let endpoints = palisade_core::backend::endpoints(rest);
            let locks =
                EtcdLocks::connect_with(&endpoints, session.ttl, session.tls.as_ref()).await?;
            Ok(Box::new(locks) as Box<dyn FencedLocks>)
        })
    },
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_end_bounds_exactly_the_prefix() {
        assert_eq!(prefix_end(b"/a/"), b"/a0".to_vec());
        assert_eq!(prefix_end(b"a\xff"), b"b".to_vec());
        assert_eq!(prefix_end(b"\xff\xff"), vec![0]);
    }
}
