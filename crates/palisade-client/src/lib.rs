//! The Palisade client: connect to any nodes, follow the leader, keep a session
//! alive in the background, and take **correctness** locks whose guards carry a
//! fencing token.
//!
//! ```no_run
//! # async fn demo() -> Result<(), palisade_client::ClientError> {
//! use palisade_client::{AcquireOptions, Client, ClientConfig};
//! let client = Client::connect(ClientConfig::new(["127.0.0.1:7420"])).await?;
//! let guard = client.acquire("reports/nightly", &AcquireOptions::default()).await?;
//! // Hand the token to the resource; it must reject any lower token.
//! println!("Fencing-Token: {}", guard.token());
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! # What a guard promises
//! [`FencedGuard::remaining`] is how long the lock is still *guaranteed*: measured
//! on this process's monotonic clock from the moment the last successful
//! keep-alive was **sent**, minus a safety margin. The server restarts the session's
//! countdown when it *receives* the keep-alive, which is later, so the client's
//! figure is conservative. [`FencedGuard::lost`] completes when it reaches zero.
//! Even so, a process can pause right after checking: that is what the fencing
//! token is for. The resource must check it.
//!
//! This crate does not depend on the server: it needs only the wire types.

mod connector;
mod error;
mod guard;
mod session;
mod types;

use std::sync::Arc;

use palisade_core::backend::{Descriptor, Facts, Scheme, Tls};
use palisade_core::{FencedLocks, LockError};
use std::time::Duration;

pub use error::ClientError;
pub use guard::{FENCING_TOKEN_HEADER, FencedGuard};
pub use palisade_core::machine::Claim;
pub use palisade_core::{FencingToken, LeaseState};
use palisade_proto::v1::cluster_client::ClusterClient;
use palisade_proto::v1::locks_client::LocksClient;
use palisade_proto::v1::{
    AcquireRequest, AddLearnerRequest, CancelAcquireRequest, ChangeMembershipRequest,
    CheckTokenRequest, ClaimKind, GetRequest, ListRequest, ObserveRequest, ObserveResponse,
    StatusRequest, TakeSnapshotRequest,
};
pub use types::{
    ClusterStatus, Holder, LockView, Member, SessionId, SnapshotInfo, TakenSnapshot, TokenStatus,
};

use connector::Connector;
use session::Session;

/// TLS options and bearer token from the client flags (`--ca`, `--cert/--key`,
/// `--token-file`).
///
/// # Errors
/// When a file cannot be read, or a certificate or token is given without the
/// CA (credentials never travel in plaintext).
pub fn credentials_from_files(
    ca: Option<&std::path::Path>,
    cert_and_key: Option<(&std::path::Path, &std::path::Path)>,
    token_file: Option<&std::path::Path>,
) -> Result<(Option<TlsOptions>, Option<String>), ClientError> {
    let tls = match ca {
        Some(ca) => Some(TlsOptions::from_files(ca, cert_and_key)?),
        None if cert_and_key.is_some() || token_file.is_some() => {
            return Err(ClientError::InvalidInput(
                "--cert and --token-file need --ca (credentials never travel in plaintext)".into(),
            ));
        }
        None => None,
    };
    let token = match token_file {
        Some(path) => Some(
            std::fs::read_to_string(path)
                .map_err(|e| {
                    ClientError::InvalidInput(format!("token file {}: {e}", path.display()))
                })?
                .trim()
                .to_owned(),
        ),
        None => None,
    };
    Ok((tls, token))
}

/// How to reach the cluster and what session to open.
#[derive(Clone)]
pub struct ClientConfig {
    /// Any nodes of the cluster, `HOST:PORT`. The leader is found from there.
    pub endpoints: Vec<String>,
    /// The session's lease. Locks are held as long as the session lives.
    pub session_ttl: Duration,
    /// Subtracted from every guarantee, to cover clock-rate differences between
    /// this host and the leader. `None`: a tenth of the TTL, at least 50 ms.
    pub safety_margin: Option<Duration>,
    /// Time allowed to each RPC attempt.
    pub rpc_timeout: Duration,
    /// How long to keep retrying across leader changes before giving up.
    pub retry_for: Duration,
    /// Shown by `palisade locks` next to the locks this session holds.
    pub label: String,
    /// Rewrites the addresses nodes name as leader (their advertised `HOST:PORT`)
    /// into the address this client must dial — for clients that reach the
    /// cluster through a proxy or NAT. Addresses not in the map are dialled as named.
    pub address_map: std::collections::HashMap<String, String>,
    /// TLS to the nodes; `None`: plaintext (a node without TLS listens on
    /// loopback only, unless started with `--insecure`).
    pub tls: Option<TlsOptions>,
    /// A bearer token that says who this client is, for clusters that do not
    /// take client certificates. Sent only over TLS.
    pub bearer_token: Option<String>,
    /// Dials the nodes; `None`: the operating system's TCP. A deterministic
    /// simulation gives its own network here.
    pub dialer: Option<std::sync::Arc<dyn Dialer>>,
}

/// A byte stream to a node, from a [`Dialer`].
pub trait DialedConn:
    tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static
{
}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static> DialedConn for T {}

/// What [`Dialer::dial`] returns.
pub type DialFuture = std::pin::Pin<
    Box<dyn std::future::Future<Output = std::io::Result<Box<dyn DialedConn>>> + Send>,
>;

/// Opens connections to nodes over a network other than the operating
/// system's (a simulator's).
pub trait Dialer: Send + Sync + std::fmt::Debug {
    /// Connects to `authority` (`HOST:PORT`).
    fn dial(&self, authority: String) -> DialFuture;
}

/// How this client speaks TLS to the nodes.
#[derive(Clone)]
pub struct TlsOptions {
    /// PEM of the CA that signed the nodes' certificates (the only one trusted).
    pub ca_pem: Vec<u8>,
    /// This client's certificate and key (PEM), when it authenticates by
    /// certificate.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
    /// The name to expect in the nodes' certificates; `None`: the host of each
    /// address dialled.
    pub server_name: Option<String>,
}

/// Secrets (the bearer token, the private key) never reach debug output.
impl std::fmt::Debug for ClientConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientConfig")
            .field("endpoints", &self.endpoints)
            .field("session_ttl", &self.session_ttl)
            .field("safety_margin", &self.safety_margin)
            .field("rpc_timeout", &self.rpc_timeout)
            .field("retry_for", &self.retry_for)
            .field("label", &self.label)
            .field("address_map", &self.address_map)
            .field("tls", &self.tls)
            .field("dialer", &self.dialer)
            .field(
                "bearer_token",
                &self.bearer_token.as_ref().map(|_| "<redacted>"),
            )
            .finish()
    }
}

impl std::fmt::Debug for TlsOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsOptions")
            .field("ca_pem_bytes", &self.ca_pem.len())
            .field(
                "identity",
                &self
                    .identity
                    .as_ref()
                    .map(|_| "<certificate and key redacted>"),
            )
            .field("server_name", &self.server_name)
            .finish()
    }
}

impl TlsOptions {
    /// Reads the CA and, when both are given, the client's certificate and key.
    ///
    /// # Errors
    /// [`ClientError::InvalidInput`] naming a file that cannot be read.
    pub fn from_files(
        ca: &std::path::Path,
        cert_and_key: Option<(&std::path::Path, &std::path::Path)>,
    ) -> Result<Self, ClientError> {
        let read = |p: &std::path::Path| {
            std::fs::read(p).map_err(|e| ClientError::InvalidInput(format!("{}: {e}", p.display())))
        };
        Ok(TlsOptions {
            ca_pem: read(ca)?,
            identity: match cert_and_key {
                Some((cert, key)) => Some((read(cert)?, read(key)?)),
                None => None,
            },
            server_name: None,
        })
    }
}

impl ClientConfig {
    /// Defaults: 10 s session TTL, 2 s per RPC, retry for 10 s.
    pub fn new<S: Into<String>>(endpoints: impl IntoIterator<Item = S>) -> Self {
        ClientConfig {
            endpoints: endpoints.into_iter().map(Into::into).collect(),
            session_ttl: Duration::from_secs(10),
            safety_margin: None,
            rpc_timeout: Duration::from_secs(2),
            retry_for: Duration::from_secs(10),
            label: default_label(),
            address_map: std::collections::HashMap::new(),
            tls: None,
            bearer_token: None,
            dialer: None,
        }
    }
}

fn default_label() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    format!("{}/pid {}", host.trim(), std::process::id())
}

/// How to acquire one lock.
#[derive(Debug, Clone, Default)]
pub struct AcquireOptions {
    /// How long to wait in the lock's FIFO queue. Zero: fail at once with
    /// [`ClientError::WouldBlock`] if it is held.
    pub wait: Duration,
    /// After this holder's session expires (not after a clean release) the lock
    /// stays unavailable for this long. At most 60 s; only for an exclusive
    /// claim (a plain lock, a writer, a leader).
    pub lock_delay: Duration,
    /// What to ask of the name: a plain lock (the default), a permit of a
    /// semaphore, a read or write lock, or an election's leadership. The
    /// first claim on a name fixes what it is; another kind of claim on it
    /// fails with [`ClientError::WrongShape`].
    pub claim: Claim,
}

/// An acquire in flight: if its future is dropped before an answer, the
/// acquisition is cancelled in the background (in the lock's turn).
struct Unanswered<'a> {
    client: Option<Client>,
    name: &'a str,
    turn: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl Drop for Unanswered<'_> {
    fn drop(&mut self) {
        if let Some(client) = self.client.take() {
            client.cancel_in_background(self.name, self.turn.take());
        }
    }
}

/// A connection to a Palisade cluster with one session. Cheap to clone; the
/// session ends when the last clone is dropped (or on [`Client::close`]).
#[derive(Clone)]
pub struct Client {
    conn: Arc<Connector>,
    session: Arc<Session>,
    safety: Arc<palisade_core::safety::LockSafety>,
    /// Per lock name: held by an acquire while it runs and by the
    /// cancellation of an acquire whose answer was lost. The cancellation
    /// releases the lock if it was granted meanwhile, and a later acquire of
    /// the same name by this session would be given that very grant back: the
    /// two must not overlap, or the release would take away the grant the
    /// acquire just returned (found by `palisade sim`).
    turns: Arc<std::sync::Mutex<std::collections::HashMap<String, Arc<tokio::sync::Mutex<()>>>>>,
}

impl Client {
    /// Connects, opens a session and starts keeping it alive.
    ///
    /// # Errors
    /// [`ClientError::InvalidInput`] for no endpoints or a bad TTL,
    /// [`ClientError::Unavailable`] when no leader answered within `retry_for`.
    pub async fn connect(config: ClientConfig) -> Result<Client, ClientError> {
        if config.endpoints.is_empty() {
            return Err(ClientError::InvalidInput("no endpoints given".into()));
        }
        palisade_core::limits::validate_ttl(config.session_ttl)
            .map_err(|e| ClientError::InvalidInput(e.to_string()))?;
        let conn = Arc::new(Connector::new(&config)?);
        let session = Session::open(conn.clone(), &config).await?;
        Ok(Client {
            conn,
            session,
            safety: Arc::default(),
            turns: Arc::default(),
        })
    }

    /// The session id.
    pub fn session_id(&self) -> SessionId {
        self.session.id
    }

    /// The session's TTL as the server granted it.
    pub fn session_ttl(&self) -> Duration {
        self.session.ttl
    }

    /// How long the session (and every lock it holds) is still guaranteed.
    pub fn remaining(&self) -> Duration {
        self.session.remaining()
    }

    /// This client's lock-safety figures (see [`palisade_core::safety`]): the
    /// slack left at each release, overruns past the guarantee, lost leases,
    /// grants that came too late. Register [`LockSafety::collectors`] in your
    /// Prometheus registry, or write [`LockSafety::render`] out.
    ///
    /// [`LockSafety::collectors`]: palisade_core::safety::LockSafety::collectors
    /// [`LockSafety::render`]: palisade_core::safety::LockSafety::render
    pub fn lock_safety(&self) -> &palisade_core::safety::LockSafety {
        &self.safety
    }

    /// Until when the session is guaranteed, on this process's monotonic clock:
    /// the send time of the last acknowledged keep-alive + TTL − margin. Moves
    /// forward with each keep-alive; set to "now" when the session is known gone.
    pub fn guaranteed_until(&self) -> std::time::Instant {
        *self.session.subscribe().borrow()
    }

    /// Acquires `name`, waiting up to `options.wait` in FIFO order. The server
    /// answers the moment the lock is granted.
    ///
    /// # Errors
    /// [`ClientError::WouldBlock`], [`ClientError::WaitTimeout`],
    /// [`ClientError::InvalidInput`], [`ClientError::SessionExpired`],
    /// [`ClientError::GrantTooLate`], [`ClientError::Unavailable`]. After
    /// `Unavailable` the outcome was unknown; the client has asked the server to
    /// cancel it.
    pub async fn acquire(
        &self,
        name: &str,
        options: &AcquireOptions,
    ) -> Result<FencedGuard, ClientError> {
        palisade_core::limits::validate_name(name)
            .map_err(|e| ClientError::InvalidInput(e.to_string()))?;
        self.session.check_alive()?;
        let turn = self.turn(name).lock_owned().await;
        // Dropped before an answer (the caller gave up on this future): the
        // server may grant it after all; cancel it, as after `Unavailable`.
        let mut unanswered = Unanswered {
            client: Some(self.clone()),
            name,
            turn: Some(turn),
        };
        let give_up = palisade_core::clock::now() + options.wait;
        let (claim, permits, value) = match &options.claim {
            Claim::Lock => (ClaimKind::ClaimLock, 0, String::new()),
            Claim::Permit { permits } => (ClaimKind::ClaimPermit, *permits, String::new()),
            Claim::Read => (ClaimKind::ClaimRead, 0, String::new()),
            Claim::Write => (ClaimKind::ClaimWrite, 0, String::new()),
            Claim::Lead { value } => (ClaimKind::ClaimLead, 0, value.clone()),
        };
        let request = |wait: Duration| AcquireRequest {
            session_id: self.session.id.get(),
            name: name.to_owned(),
            wait_ms: wait.as_millis() as u64,
            lock_delay_ms: options.lock_delay.as_millis() as u64,
            session_key: self.session.key.clone(),
            claim: claim.into(),
            permits,
            value: value.clone(),
        };
        // A retry after a leader change is safe: acquiring a lock the session
        // already holds returns the same grant, and a waiter is never queued twice.
        let result = self
            .conn
            .call(options.wait + self.conn.retry_for, |ch| {
                let wait = give_up.saturating_duration_since(palisade_core::clock::now());
                let mut req = tonic::Request::new(request(wait));
                req.set_timeout(wait + self.conn.rpc_timeout);
                async move { LocksClient::new(ch).acquire(req).await }
            })
            .await;
        // Answered: nothing to cancel on drop from here on.
        unanswered.client = None;
        match result {
            Ok(reply) => {
                let token = FencingToken::new(reply.token)
                    .ok_or_else(|| ClientError::Protocol("server granted token 0".into()))?;
                let guard = FencedGuard::new(self.clone(), name.to_owned(), token, reply.slot);
                // A grant is only worth something while the session is guaranteed:
                // one that arrives later may have been expired and handed on
                // already. Dropping the guard releases it (best effort).
                if self.session.check_alive().is_err() {
                    self.safety.grant_too_late();
                    guard.give_back();
                    return Err(ClientError::GrantTooLate);
                }
                Ok(guard)
            }
            Err(ClientError::Unavailable { detail, why }) => {
                self.cancel_in_background(name, unanswered.turn.take());
                Err(ClientError::Unavailable { detail, why })
            }
            Err(e) => Err(e),
        }
    }

    /// The turn of lock `name` (see `turns`).
    fn turn(&self, name: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut turns = self.turns.lock().expect("poisoned");
        turns.retain(|_, t| Arc::strong_count(t) > 1);
        turns.entry(name.to_owned()).or_default().clone()
    }

    /// Asks the server to forget an acquisition whose answer we did not get,
    /// holding `name`'s turn (taking it if not given) until it is done.
    fn cancel_in_background(&self, name: &str, turn: Option<tokio::sync::OwnedMutexGuard<()>>) {
        let (conn, session, name) = (self.conn.clone(), self.session.id.get(), name.to_owned());
        let key = self.session.key.clone();
        let lock = self.turn(&name);
        tokio::spawn(async move {
            let _turn = match turn {
                Some(turn) => turn,
                None => lock.lock_owned().await,
            };
            let _ = conn
                .call(conn.retry_for, |ch| {
                    let req = CancelAcquireRequest {
                        session_id: session,
                        name: name.clone(),
                        session_key: key.clone(),
                    };
                    async move { LocksClient::new(ch).cancel_acquire(req).await }
                })
                .await;
        });
    }

    /// One lock, read linearizably. `None` when nobody holds or waits for it.
    ///
    /// # Errors
    /// [`ClientError::Unavailable`] and the like.
    pub async fn get(&self, name: &str) -> Result<Option<LockView>, ClientError> {
        get(&self.conn, name).await
    }

    /// All locks by name, read linearizably.
    ///
    /// # Errors
    /// [`ClientError::Unavailable`] and the like.
    pub async fn list(&self) -> Result<Vec<LockView>, ClientError> {
        list(&self.conn).await
    }

    /// Whether `token` is still the current holder's token for `name`, and the
    /// current token if any.
    ///
    /// # Errors
    /// [`ClientError::Unavailable`] and the like.
    pub async fn check_token(
        &self,
        name: &str,
        token: FencingToken,
    ) -> Result<(bool, Option<FencingToken>), ClientError> {
        let status = token_status(&self.conn, name, token).await?;
        Ok((status.current, status.current_token))
    }

    /// The cluster as the leader sees it.
    ///
    /// # Errors
    /// [`ClientError::Unavailable`] and the like.
    pub async fn status(&self) -> Result<ClusterStatus, ClientError> {
        status(&self.conn).await
    }

    /// Closes the session: every lock it holds is released at once.
    ///
    /// # Errors
    /// [`ClientError::Unavailable`] and the like; the session then expires after
    /// its TTL.
    pub async fn close(self) -> Result<(), ClientError> {
        self.session.close().await
    }
}

/// Calls that need no session: status, listing, token checks, membership.
#[derive(Clone)]
pub struct Admin {
    conn: Arc<Connector>,
}

/// A lock's changes, from [`Admin::observe`].
pub struct Observation {
    inner: tonic::Streaming<ObserveResponse>,
}

impl std::fmt::Debug for Observation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Observation").finish_non_exhaustive()
    }
}

impl Observation {
    /// The lock's next state (`Some(None)`: nobody holds or waits for it);
    /// `None` once the stream ended (the node went away): observe again.
    ///
    /// # Errors
    /// [`ClientError::Unavailable`] when the stream broke, and the like.
    pub async fn next(&mut self) -> Option<Result<Option<LockView>, ClientError>> {
        match self.inner.message().await {
            Ok(Some(reply)) => Some(reply.lock.map(LockView::try_from).transpose()),
            Ok(None) => None,
            Err(status) => Some(Err(ClientError::from_status(&status))),
        }
    }
}

impl Admin {
    /// Connects without opening a session.
    ///
    /// # Errors
    /// [`ClientError::InvalidInput`] for no endpoints or a malformed one.
    pub fn new(config: &ClientConfig) -> Result<Admin, ClientError> {
        if config.endpoints.is_empty() {
            return Err(ClientError::InvalidInput("no endpoints given".into()));
        }
        Ok(Admin {
            conn: Arc::new(Connector::new(config)?),
        })
    }

    /// The cluster as the leader sees it.
    ///
    /// # Errors
    /// [`ClientError::Unavailable`] and the like.
    pub async fn status(&self) -> Result<ClusterStatus, ClientError> {
        status(&self.conn).await
    }

    /// All locks, read linearizably.
    ///
    /// # Errors
    /// [`ClientError::Unavailable`] and the like.
    pub async fn list(&self) -> Result<Vec<LockView>, ClientError> {
        list(&self.conn).await
    }

    /// One lock, read linearizably; `None` when nobody holds or waits for it.
    ///
    /// # Errors
    /// [`ClientError::Unavailable`] and the like.
    pub async fn get(&self, name: &str) -> Result<Option<LockView>, ClientError> {
        get(&self.conn, name).await
    }

    /// Watches one lock: its state now (read linearizably), then each time it
    /// changes, pushed by the leader that answered as it applies the log —
    /// how `palisade elect --observe` follows an election. Changes applied
    /// together arrive as the latest. The stream ends when that node goes;
    /// call again to go on.
    ///
    /// # Errors
    /// [`ClientError::Unavailable`], [`ClientError::LimitReached`] (the node
    /// serves its most observers), and the like.
    pub async fn observe(&self, name: &str) -> Result<Observation, ClientError> {
        let inner = self
            .conn
            .call(self.conn.retry_for, |ch| {
                let req = ObserveRequest {
                    name: name.to_owned(),
                };
                async move { LocksClient::new(ch).observe(req).await }
            })
            .await?;
        Ok(Observation { inner })
    }

    /// See [`Client::check_token`].
    ///
    /// # Errors
    /// [`ClientError::Unavailable`] and the like.
    pub async fn check_token(
        &self,
        name: &str,
        token: FencingToken,
    ) -> Result<(bool, Option<FencingToken>), ClientError> {
        let status = token_status(&self.conn, name, token).await?;
        Ok((status.current, status.current_token))
    }

    /// Everything the leader says of `token` for `name`, read linearizably:
    /// whether it is current, the current token, and the highest token the
    /// cluster can have issued. What a fenced resource asks before it believes
    /// a token it has not seen.
    ///
    /// # Errors
    /// [`ClientError::Unavailable`] and the like.
    pub async fn token_status(
        &self,
        name: &str,
        token: FencingToken,
    ) -> Result<TokenStatus, ClientError> {
        token_status(&self.conn, name, token).await
    }

    /// Adds a node as a learner (it receives the log but does not vote).
    /// `addr` is its client address, optionally followed by `/` and its peer
    /// address (default: the client port + 1).
    ///
    /// # Errors
    /// [`ClientError::Unavailable`] and the like.
    pub async fn add_learner(&self, id: u64, addr: &str) -> Result<u64, ClientError> {
        let (client_addr, peer_addr) = addr.split_once('/').unwrap_or((addr, ""));
        let reply = self
            .conn
            .call(self.conn.retry_for, |ch| {
                let req = AddLearnerRequest {
                    id,
                    addr: client_addr.to_owned(),
                    peer_addr: peer_addr.to_owned(),
                };
                async move { ClusterClient::new(ch).add_learner(req).await }
            })
            .await?;
        Ok(reply.log_index)
    }

    /// Has the node the call reaches (the leader, unless only one endpoint is
    /// given) take a snapshot of its state now and compact its log; answers
    /// once it is on disk.
    ///
    /// # Errors
    /// [`ClientError::Unavailable`] and the like.
    pub async fn take_snapshot(&self) -> Result<TakenSnapshot, ClientError> {
        let reply = self
            .conn
            .call(self.conn.retry_for, |ch| async move {
                ClusterClient::new(ch)
                    .take_snapshot(TakeSnapshotRequest {})
                    .await
            })
            .await?;
        Ok(TakenSnapshot {
            id: reply.id,
            index: reply.snapshot_index,
            bytes: reply.bytes,
            build: std::time::Duration::from_micros(reply.build_us),
        })
    }

    /// Makes exactly `voters` the voting members (learners are promoted; members
    /// not listed are removed).
    ///
    /// # Errors
    /// [`ClientError::Unavailable`] and the like.
    pub async fn change_membership(&self, voters: &[u64]) -> Result<u64, ClientError> {
        let reply = self
            .conn
            .call(self.conn.retry_for, |ch| {
                let req = ChangeMembershipRequest {
                    voters: voters.to_vec(),
                };
                async move { ClusterClient::new(ch).change_membership(req).await }
            })
            .await?;
        Ok(reply.log_index)
    }
}

async fn status(conn: &Connector) -> Result<ClusterStatus, ClientError> {
    conn.call(conn.retry_for, |ch| async move {
        LocksClient::new(ch).status(StatusRequest {}).await
    })
    .await
    .map(ClusterStatus::from)
}

/// One lock by name, from the leader.
async fn get(conn: &Connector, name: &str) -> Result<Option<LockView>, ClientError> {
    let reply = conn
        .call(conn.retry_for, |ch| {
            let req = GetRequest {
                name: name.to_owned(),
            };
            async move { LocksClient::new(ch).get(req).await }
        })
        .await?;
    reply.lock.map(LockView::try_from).transpose()
}

async fn list(conn: &Connector) -> Result<Vec<LockView>, ClientError> {
    let reply = conn
        .call(conn.retry_for, |ch| async move {
            LocksClient::new(ch).list(ListRequest {}).await
        })
        .await?;
    reply.locks.into_iter().map(LockView::try_from).collect()
}

async fn token_status(
    conn: &Connector,
    name: &str,
    token: FencingToken,
) -> Result<TokenStatus, ClientError> {
    let reply = conn
        .call(conn.retry_for, |ch| {
            let req = CheckTokenRequest {
                name: name.to_owned(),
                token: token.get(),
            };
            async move { LocksClient::new(ch).check_token(req).await }
        })
        .await?;
    Ok(TokenStatus {
        current: reply.current,
        current_token: FencingToken::new(reply.current_token),
        issued_through: reply.issued_through,
    })
}

/// The Palisade client behind the backend-neutral correctness-lock API.
impl palisade_core::FencedLocks for Client {
    fn backend(&self) -> &'static str {
        "palisade"
    }

    fn acquire<'a>(
        &'a self,
        name: &'a str,
        options: &'a palisade_core::LockOptions,
    ) -> palisade_core::lock::BoxFuture<
        'a,
        Result<Box<dyn palisade_core::FencedLease>, palisade_core::LockError>,
    > {
        Box::pin(async move {
            let options = AcquireOptions {
                wait: options.wait,
                lock_delay: options.lock_delay,
                claim: options.claim.clone(),
            };
            let guard = Client::acquire(self, name, &options).await?;
            Ok(Box::new(guard) as Box<dyn palisade_core::FencedLease>)
        })
    }

    fn close(
        self: Box<Self>,
    ) -> palisade_core::lock::BoxFuture<'static, Result<(), palisade_core::LockError>> {
        Box::pin(async move { (*self).close().await.map_err(Into::into) })
    }
}

/// The Palisade server as a backend, as the registry in `palisade-backends`
/// lists it.
pub static DESCRIPTOR: Descriptor = Descriptor {
    name: "palisade",
    schemes: &[Scheme {
        scheme: "palisade",
        shape: "palisade://HOST:PORT[,HOST:PORT…]",
    }],
    facts: Facts {
        title: "Palisade (Raft-replicated lock server)",
        lease_on: "the leader's monotonic clock; a new leader restarts every countdown at full \
                   length; the client relies on the send time of its last acknowledged \
                   keep-alive + TTL − margin",
        token: "the Raft log index of the granting entry: strictly increasing per lock, never \
                reused across crashes",
        clocks: "no: expiry is a log entry decided on the leader's monotonic clock; a wrong \
                 clock cannot make two grants share a token",
    },
    connect: |_scheme, rest, session| {
        Box::pin(async move {
            let endpoints = palisade_core::backend::endpoints(rest);
            if endpoints.is_empty() {
                return Err(LockError::InvalidInput(
                    "palisade:// needs at least one HOST:PORT".into(),
                ));
            }
            let mut config = ClientConfig::new(endpoints);
            config.session_ttl = session.ttl;
            config.tls = session.tls.clone().map(TlsOptions::from);
            config.bearer_token = session.bearer_token.clone();
            config.address_map = session.address_map.clone();
            if let Some(t) = session.request_timeout {
                config.rpc_timeout = t;
            }
            if let Some(t) = session.retry_for {
                config.retry_for = t;
            }
            if let Some(label) = &session.label {
                config.label = label.clone();
            }
            Ok(Box::new(Client::connect(config).await?) as Box<dyn FencedLocks>)
        })
    },
};

/// The backend vocabulary's TLS is the client's.
impl From<Tls> for TlsOptions {
    fn from(t: Tls) -> Self {
        TlsOptions {
            ca_pem: t.ca_pem,
            identity: t.identity,
            server_name: t.server_name,
        }
    }
}

/// For a session opened by URL (`palisade_backends::connect`).
impl From<TlsOptions> for Tls {
    fn from(t: TlsOptions) -> Self {
        Tls {
            ca_pem: t.ca_pem,
            identity: t.identity,
            server_name: t.server_name,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_output_shows_no_secret() {
        let mut c = ClientConfig::new(["127.0.0.1:7420"]);
        c.bearer_token = Some("s3cret-token".into());
        c.tls = Some(TlsOptions {
            ca_pem: b"CA".to_vec(),
            identity: Some((b"CERT".to_vec(), b"PRIVATE-KEY".to_vec())),
            server_name: None,
        });
        let shown = format!("{c:?}");
        assert!(!shown.contains("s3cret-token") && !shown.contains("PRIVATE-KEY"));
        assert!(shown.contains("127.0.0.1:7420") && shown.contains("redacted"));
    }
}
