//! Correctness locks on ZooKeeper, behind [`FencedLocks`]: Curator's
//! `InterProcessMutex` recipe with a fencing token.
//!
//! # Design
//! - **Session** = one ZooKeeper session (the `zookeeper-client` crate), its
//!   timeout negotiated with the ensemble. The client's guarantee counts from
//!   the moment its last successful round trip to the ensemble was *sent* (a
//!   `stat` of the root every third of the timeout; every request also restarts
//!   the server's session timer), on its monotonic clock, minus a safety margin.
//!   Connected = held; disconnected = jeopardy while that guarantee lasts;
//!   expired = lost at once.
//! - **Acquire**: an ephemeral-sequential child `_c_TAG-lock-NNNNNNNNNN` under
//!   the lock's container node `/palisade/locks/NAME` (a container: ZooKeeper
//!   removes it once empty, so locks leave nothing behind). The lowest sequence
//!   holds the lock; every other waiter watches only its predecessor (no herd)
//!   and looks again when it goes. TAG is 128 random bits drawn for the
//!   acquisition (Curator's "protected" mode): when a create's answer is lost
//!   (the connection dropped) while the session lives on, the node may exist
//!   though no one knows it. The acquisition looks for its tag (after a `sync`)
//!   and carries on with the node it finds, or creates one if there is none.
//!   Nodes sort by sequence, whatever their prefix.
//! - **Nothing left in a queue**: a node whose delete failed (release, give-up,
//!   a lease dropped), whose create's outcome stayed unknown, or made by an
//!   acquisition abandoned midway (its future dropped) would wait in
//!   the queue owned by no one, blocking the lock until this session ends — and
//!   the session lives as long as this process keeps it alive. They are
//!   remembered, and deleted by the session's heartbeat once the ensemble
//!   answers again.
//! - **Token** = the `czxid` of the own znode: the zxid of the transaction that
//!   created it. Zxids carry the leader's epoch in their high 32 bits, so they
//!   only grow across leader changes and restarts, and a later holder's node was
//!   created later.
//! - A wait that ends unanswered (or `wait = 0` on a held lock) deletes the own
//!   node. Lock names are escaped into one path segment (`jobs/nightly` is
//!   `/palisade/locks/jobs%2Fnightly`). No lock-delay.
//! - **Elections** (`Claim::Lead`, docs/recipes.md): Curator's `LeaderLatch`
//!   is this same queue of ephemeral-sequential nodes, so an election is one:
//!   under [`ELECTIONS`] rather than [`LOCKS`] (an election and a lock of one
//!   name are two things), the candidate's value as its node's data, the
//!   leader the lowest sequence, the token its `czxid`. Semaphores and
//!   read/write locks are refused by name (`InvalidInput`). Proclaiming and
//!   observing are not in the lock trait: read the children with ZooKeeper's
//!   own tools.
//! - Plaintext by default; with [`ZkTls`], TLS to every server (ZooKeeper's
//!   `secureClientPort`) that trusts only the given CA, checks each server's
//!   name (the host of the connect string) and presents a client certificate
//!   when given (for `ssl.clientAuth=need`). Lock nodes stay open to every
//!   client that gets in: ZooKeeper checks a delete against the *parent's*
//!   ACL, and every client must create and delete children of a lock's node,
//!   so no ACL could keep one client from deleting another's node. Who may
//!   take locks is decided by who may connect.

use std::sync::Arc;
use std::time::{Duration, Instant};

use palisade_core::backend::{Descriptor, Facts, Scheme};
use palisade_core::guarantee::Guarantee;
use palisade_core::lock::BoxFuture;
use palisade_core::{
    FencedLease, FencedLocks, FencingToken, GuaranteedLease, LockError, LockOptions,
};
use zookeeper_client as zk;

/// The backend's name in errors and URLs.
pub const BACKEND: &str = "zookeeper";

/// Where every lock lives.
pub const LOCKS: &str = "/palisade/locks";

/// Where every election lives (one container per name, as for a lock).
pub const ELECTIONS: &str = "/palisade/elections";

fn unavailable(detail: impl std::fmt::Display) -> LockError {
    LockError::Unavailable {
        backend: BACKEND,
        detail: detail.to_string(),
        why: palisade_core::Unreachable::Unknown,
    }
}

fn zk_error(e: zk::Error) -> LockError {
    match e {
        zk::Error::NoAuth | zk::Error::AuthFailed => {
            LockError::PermissionDenied(format!("zookeeper: {e}"))
        }
        zk::Error::SessionExpired => LockError::SessionExpired,
        zk::Error::BadArguments(_) => LockError::InvalidInput(format!("zookeeper: {e}")),
        e => unavailable(e),
    }
}

struct Session {
    client: zk::Client,
    ttl: Duration,
    guarantee: Guarantee,
    /// Set right after the session is built (the task needs the session).
    heartbeat: std::sync::OnceLock<tokio::task::AbortHandle>,
    /// The nodes of the holds granted and not yet released: closing the
    /// session deletes them (a lease still alive keeps the ZooKeeper session
    /// itself open, so its ephemeral nodes would otherwise stay).
    held: std::sync::Mutex<std::collections::HashSet<String>>,
    /// Nodes of this session that may sit in a queue owned by no one; the
    /// heartbeat deletes them.
    strays: std::sync::Mutex<Vec<Stray>>,
    /// A sweep of the strays is under way.
    sweeping: std::sync::atomic::AtomicBool,
}

/// A node of this session that no acquisition or lease owns any more.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Stray {
    /// A node whose delete failed.
    Node(String),
    /// Whatever nodes carry `tag` under `parent`: a create whose answer was
    /// lost and not found again in time.
    Tagged { parent: String, tag: String },
}

impl Session {
    /// Deletes `path`, or remembers it for the heartbeat when the ensemble
    /// does not answer.
    async fn delete_or_remember(&self, path: &str) {
        match self.client.delete(path, None).await {
            Ok(()) | Err(zk::Error::NoNode | zk::Error::SessionExpired) => {}
            Err(e) => {
                tracing::debug!(%path, error = %e, "zookeeper delete failed; retried by the heartbeat");
                self.remember(Stray::Node(path.to_owned()));
            }
        }
    }

    fn remember(&self, stray: Stray) {
        self.strays.lock().expect("poisoned").push(stray);
    }

    /// Deletes the remembered strays; those the ensemble does not answer for
    /// are kept for the next round.
    async fn sweep_strays(&self) {
        let strays = std::mem::take(&mut *self.strays.lock().expect("poisoned"));
        for stray in strays {
            let done = match &stray {
                Stray::Node(path) => matches!(
                    self.client.delete(path, None).await,
                    Ok(()) | Err(zk::Error::NoNode | zk::Error::SessionExpired)
                ),
                Stray::Tagged { parent, tag } => match self.tagged_children(parent, tag).await {
                    Ok(found) => {
                        let mut all = true;
                        for name in found {
                            all &= matches!(
                                self.client.delete(&format!("{parent}/{name}"), None).await,
                                Ok(()) | Err(zk::Error::NoNode | zk::Error::SessionExpired)
                            );
                        }
                        all
                    }
                    Err(zk::Error::SessionExpired) => true,
                    Err(_) => false,
                },
            };
            if !done {
                self.remember(stray);
            }
        }
    }

    /// The children of `parent` that carry `tag`, lowest sequence first, as
    /// the ensemble has them now (`sync` first: a read may otherwise be served
    /// by a server that has not applied our create yet).
    async fn tagged_children(&self, parent: &str, tag: &str) -> Result<Vec<String>, zk::Error> {
        match self.client.sync(parent).await {
            Ok(()) => {}
            Err(zk::Error::NoNode) => return Ok(Vec::new()),
            Err(e) => return Err(e),
        }
        let mut found: Vec<String> = match self.client.get_children(parent).await {
            Ok((children, _)) => children
                .into_iter()
                .filter(|c| c.starts_with(tag))
                .collect(),
            Err(zk::Error::NoNode) => Vec::new(),
            Err(e) => return Err(e),
        };
        sort_queue(&mut found);
        Ok(found)
    }
}

/// Remembers an acquisition's tag for the heartbeat unless disarmed (its
/// `session` taken) before it is dropped.
struct Abandoned<'a> {
    session: Option<&'a Session>,
    parent: &'a str,
    tag: &'a str,
}

impl Drop for Abandoned<'_> {
    fn drop(&mut self) {
        if let Some(s) = self.session {
            s.remember(Stray::Tagged {
                parent: self.parent.to_owned(),
                tag: self.tag.to_owned(),
            });
        }
    }
}

/// Whether a failed request may have been carried out all the same: its
/// answer, not the request, may be what was lost.
fn outcome_unknown(e: &zk::Error) -> bool {
    !matches!(
        e,
        zk::Error::NoNode
            | zk::Error::NodeExists
            | zk::Error::NoAuth
            | zk::Error::AuthFailed
            | zk::Error::BadArguments(_)
            | zk::Error::InvalidAcl
            | zk::Error::SessionExpired
            | zk::Error::ClientClosed
            | zk::Error::NoChildrenForEphemerals
            | zk::Error::QuotaExceeded
            | zk::Error::Throttled
            | zk::Error::Unimplemented
    )
}

/// Puts lock nodes in queue order: by their sequence number (the ten digits
/// after `lock-`), whatever prefix they carry.
fn sort_queue(children: &mut [String]) {
    children.sort_by(|a, b| sequence(a).cmp(sequence(b)).then_with(|| a.cmp(b)));
}

fn sequence(name: &str) -> &str {
    name.rsplit_once("lock-").map_or(name, |(_, seq)| seq)
}

/// A fresh tag for one acquisition's node: `_c_` and 128 random bits in hex.
fn new_tag() -> String {
    format!("_c_{:032x}-", rand::random::<u128>())
}

impl Drop for Session {
    fn drop(&mut self) {
        if let Some(task) = self.heartbeat.get() {
            task.abort();
        }
    }
}

/// Correctness locks on a ZooKeeper ensemble: one session per value.
pub struct ZkLocks {
    session: Arc<Session>,
}

/// TLS to the ZooKeeper servers.
#[derive(Clone)]
pub struct ZkTls {
    /// PEM of the CA that signed the servers' certificates: the only one trusted.
    pub ca_pem: Vec<u8>,
    /// This client's certificate chain and key (PEM), for `ssl.clientAuth`.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
}

/// The key never reaches debug output.
impl std::fmt::Debug for ZkTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZkTls")
            .field("identity", &self.identity.is_some())
            .finish_non_exhaustive()
    }
}

impl ZkTls {
    fn options(&self) -> Result<zk::TlsOptions, LockError> {
        let text = |what: &str, pem: &[u8]| {
            String::from_utf8(pem.to_vec()).map_err(|_| {
                LockError::InvalidInput(format!("zookeeper TLS: the {what} is not PEM"))
            })
        };
        let bad = |what: &str, e: zk::Error| {
            LockError::InvalidInput(format!("zookeeper TLS: the {what}: {e}"))
        };
        let mut options = zk::TlsOptions::new()
            .with_pem_ca(&text("CA", &self.ca_pem)?)
            .map_err(|e| bad("CA", e))?;
        if let Some((cert, key)) = &self.identity {
            options = options
                .with_pem_identity(&text("certificate", cert)?, &text("key", key)?)
                .map_err(|e| bad("certificate or key", e))?;
        }
        Ok(options)
    }
}

impl ZkLocks {
    /// Connects to `cluster` in plaintext; see [`ZkLocks::connect_with`].
    ///
    /// # Errors
    /// As [`ZkLocks::connect_with`].
    pub async fn connect(cluster: &str, ttl: Duration) -> Result<ZkLocks, LockError> {
        Self::connect_with(cluster, ttl, None).await
    }

    /// Connects to `cluster` (`HOST:PORT,HOST:PORT[/chroot]`, ZooKeeper's connect
    /// string) with a session timeout of `ttl` (the ensemble may bound it: the
    /// negotiated one is used).
    ///
    /// # Errors
    /// [`LockError::InvalidInput`] for a bad connect string, TTL or a chroot that
    /// does not exist, or a CA, certificate or key that does not parse;
    /// [`LockError::Unavailable`] when no server answers (over TLS, also when
    /// the handshake fails: the client library does not say why).
    pub async fn connect_with(
        cluster: &str,
        ttl: Duration,
        tls: Option<&ZkTls>,
    ) -> Result<ZkLocks, LockError> {
        palisade_core::limits::validate_ttl(ttl)
            .map_err(|e| LockError::InvalidInput(e.to_string()))?;
        if cluster.is_empty() || cluster.contains("://") {
            return Err(LockError::InvalidInput(format!(
                "zookeeper connect string {cluster:?}: expected HOST:PORT[,HOST:PORT…][/chroot]"
            )));
        }
        let tls_options = tls.map(ZkTls::options).transpose()?;
        let connector = zk::Client::connector().with_session_timeout(ttl);
        let sent = Instant::now();
        let connecting = async {
            match tls_options {
                None => connector.connect(cluster).await,
                Some(options) => {
                    // zookeeper-client builds its rustls configuration with the
                    // process's default provider, and a build that links both
                    // ring and aws-lc-rs has none until one is installed.
                    // Palisade uses ring.
                    let _ = rustls::crypto::ring::default_provider().install_default();
                    connector.with_tls(options).secure_connect(cluster).await
                }
            }
        };
        // zookeeper-client retries a refused TLS handshake quietly until its
        // own deadline, so over TLS "no answer" may also mean a certificate
        // refused; it does not say which.
        let unanswered = || {
            let over_tls = if tls.is_some() {
                " (over TLS this is also what a refused handshake looks like: a server \
                 certificate not of --ca, or no client certificate where the server needs one)"
            } else {
                ""
            };
            unavailable(format!(
                "no server of {cluster:?} answered in time{over_tls}"
            ))
        };
        let client = tokio::time::timeout(Duration::from_secs(10), connecting)
            .await
            .map_err(|_| unanswered())?
            .map_err(|e| match e {
                zk::Error::BadArguments(_) | zk::Error::NoHosts => {
                    LockError::InvalidInput(format!("zookeeper connect string {cluster:?}: {e}"))
                }
                zk::Error::Timeout => unanswered(),
                e => zk_error(e),
            })?;
        if client.check_stat("/").await.map_err(zk_error)?.is_none() {
            return Err(LockError::InvalidInput(format!(
                "zookeeper chroot of {cluster:?} does not exist: create it first"
            )));
        }
        let ttl = client.session_timeout();
        let session = Arc::new(Session {
            client,
            ttl,
            guarantee: Guarantee::new(sent, ttl),
            heartbeat: std::sync::OnceLock::new(),
            held: std::sync::Mutex::default(),
            strays: std::sync::Mutex::default(),
            sweeping: std::sync::atomic::AtomicBool::new(false),
        });
        let task = tokio::spawn(heartbeat(Arc::downgrade(&session)));
        let _ = session.heartbeat.set(task.abort_handle());
        Ok(ZkLocks { session })
    }

    async fn ensure_parent(&self, parent: &str) -> Result<(), LockError> {
        let client = &self.session.client;
        // `LOCKS` or `ELECTIONS`.
        let root = parent.rsplit_once('/').map_or(LOCKS, |(root, _)| root);
        for (path, mode) in [
            ("/palisade", zk::CreateMode::Persistent),
            (root, zk::CreateMode::Persistent),
            (parent, zk::CreateMode::Container),
        ] {
            match client
                .create(path, &[], &mode.with_acls(zk::Acls::anyone_all()))
                .await
            {
                Ok(_) | Err(zk::Error::NodeExists) => {}
                Err(e) => return Err(zk_error(e)),
            }
        }
        Ok(())
    }

    /// Acquires `name`; see [`FencedLocks::acquire`].
    ///
    /// # Errors
    /// [`LockError::InvalidInput`] (name, lock-delay), [`LockError::WouldBlock`],
    /// [`LockError::WaitTimeout`], [`LockError::SessionExpired`],
    /// [`LockError::Unavailable`].
    pub async fn acquire(&self, name: &str, options: &LockOptions) -> Result<ZkLease, LockError> {
        palisade_core::limits::validate_name(name)
            .map_err(|e| LockError::InvalidInput(e.to_string()))?;
        if !options.lock_delay.is_zero() {
            return Err(LockError::InvalidInput(
                "the zookeeper backend has no lock-delay".into(),
            ));
        }
        let s = &self.session;
        if s.guarantee.remaining().is_zero() {
            return Err(LockError::SessionExpired);
        }
        let candidate = options.lock_or_lead(BACKEND)?;
        let root = if candidate.is_some() {
            ELECTIONS
        } else {
            LOCKS
        };
        let parent = format!("{root}/{}", znode_segment(name));
        let data = candidate.unwrap_or_default().as_bytes();
        let tag = new_tag();
        // An acquisition abandoned midway (its future dropped, say by a
        // timeout around it) may have made a node no one will delete.
        let mut abandoned = Abandoned {
            session: Some(s),
            parent: &parent,
            tag: &tag,
        };
        let result = self
            .acquire_tagged(name, options, &parent, &tag, data)
            .await;
        abandoned.session = None;
        result
    }

    async fn acquire_tagged(
        &self,
        name: &str,
        options: &LockOptions,
        parent: &str,
        tag: &str,
        data: &[u8],
    ) -> Result<ZkLease, LockError> {
        let s = &self.session;
        let give_up = Instant::now() + options.wait;
        let (me, czxid) = self.create_node(parent, tag, data, give_up).await?;
        let path = format!("{parent}/{me}");
        let Some(token) = u64::try_from(czxid).ok().and_then(FencingToken::new) else {
            s.delete_or_remember(&path).await;
            return Err(unavailable(format!("zookeeper returned czxid {czxid}")));
        };
        match self.wait_for_turn(parent, &me, options.wait, give_up).await {
            // The grant arrived after the session's guarantee ran out (this
            // process paused, or the reply was held): it may be superseded
            // already, so it is given back, never handed out.
            Ok(()) if s.guarantee.remaining().is_zero() => {
                s.delete_or_remember(&path).await;
                Err(LockError::GrantTooLate)
            }
            Ok(()) => {
                s.held.lock().expect("poisoned").insert(path.clone());
                Ok(ZkLease {
                    session: self.session.clone(),
                    name: name.to_owned(),
                    path,
                    token,
                    released: false,
                })
            }
            Err(e) => {
                s.delete_or_remember(&path).await;
                Err(e)
            }
        }
    }

    /// Creates this acquisition's node under `parent` and returns its name and
    /// `czxid`. Optimistically the child first (one write, as Curator does):
    /// the parents are created only when missing. The container may also
    /// vanish between its creation and our child's (it is removed when empty):
    /// create both again then. A create whose answer was lost is looked for by
    /// its tag until `give_up` (at least once); a node found is ours.
    async fn create_node(
        &self,
        parent: &str,
        tag: &str,
        data: &[u8],
        give_up: Instant,
    ) -> Result<(String, i64), LockError> {
        let s = &self.session;
        let mut missing_parent = 0;
        loop {
            let created = s
                .client
                .create(
                    &format!("{parent}/{tag}lock-"),
                    data,
                    &zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all()),
                )
                .await;
            let lost = match created {
                Ok((stat, sequence)) => return Ok((format!("{tag}lock-{sequence}"), stat.czxid)),
                Err(zk::Error::NoNode) if missing_parent < 6 => {
                    missing_parent += 1;
                    self.ensure_parent(parent).await?;
                    continue;
                }
                Err(e) if outcome_unknown(&e) => e,
                Err(e) => return Err(zk_error(e)),
            };
            match self.find_tagged(parent, tag, give_up).await {
                Ok(Some(found)) => return Ok(found),
                // Not made: create it again while the wait lasts.
                Ok(None) if Instant::now() < give_up => {}
                Ok(None) | Err(()) => {
                    s.remember(Stray::Tagged {
                        parent: parent.to_owned(),
                        tag: tag.to_owned(),
                    });
                    return Err(zk_error(lost));
                }
            }
        }
    }

    /// The node carrying `tag` under `parent`, if a create made one: looked
    /// for until the ensemble answers or `give_up` passes (`Err`). Extra
    /// nodes with the tag (a create retried after an earlier lost answer) are
    /// deleted; the first is kept.
    async fn find_tagged(
        &self,
        parent: &str,
        tag: &str,
        give_up: Instant,
    ) -> Result<Option<(String, i64)>, ()> {
        let s = &self.session;
        loop {
            let found = match s.tagged_children(parent, tag).await {
                Ok(found) => found,
                Err(e) if outcome_unknown(&e) && Instant::now() < give_up => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
                Err(_) => return Err(()),
            };
            let Some((first, extra)) = found.split_first() else {
                return Ok(None);
            };
            for name in extra {
                s.delete_or_remember(&format!("{parent}/{name}")).await;
            }
            match s.client.check_stat(&format!("{parent}/{first}")).await {
                Ok(Some(stat)) => return Ok(Some((first.clone(), stat.czxid))),
                // Gone already (never ours to keep): look again.
                Ok(None) => continue,
                Err(e) if outcome_unknown(&e) && Instant::now() < give_up => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(_) => return Err(()),
            }
        }
    }

    async fn wait_for_turn(
        &self,
        parent: &str,
        me: &str,
        wait: Duration,
        give_up: Instant,
    ) -> Result<(), LockError> {
        let client = &self.session.client;
        loop {
            let (mut children, _) = client.get_children(parent).await.map_err(zk_error)?;
            sort_queue(&mut children);
            let Some(at) = children.iter().position(|c| c == me) else {
                return Err(LockError::SessionExpired);
            };
            if at == 0 {
                return Ok(());
            }
            if wait.is_zero() {
                return Err(LockError::WouldBlock);
            }
            let now = Instant::now();
            if now >= give_up {
                return Err(LockError::WaitTimeout);
            }
            let predecessor = format!("{parent}/{}", children[at - 1]);
            let (exists, watcher) = client
                .check_and_watch_stat(&predecessor)
                .await
                .map_err(zk_error)?;
            if exists.is_none() {
                continue;
            }
            if tokio::time::timeout(give_up - now, watcher.changed())
                .await
                .is_err()
            {
                return Err(LockError::WaitTimeout);
            }
        }
    }
}

/// A lock name as one znode path segment: `%` and `/` are escaped (so
/// `jobs/nightly` is one lock, not a nested path), and so are the dots of the
/// names ZooKeeper refuses (`.` and `..`).
pub fn znode_segment(name: &str) -> String {
    if name == "." || name == ".." {
        return name.replace('.', "%2E");
    }
    name.replace('%', "%25").replace('/', "%2F")
}

/// A round trip every third of the session timeout moves the guarantee; an
/// expired session ends it at once.
async fn heartbeat(session: std::sync::Weak<Session>) {
    let mut states = match session.upgrade() {
        Some(s) => s.client.state_watcher(),
        None => return,
    };
    loop {
        let Some(s) = session.upgrade() else { return };
        let every = s.ttl / 3;
        let sent = Instant::now();
        let probe = tokio::time::timeout(every, s.client.check_stat("/")).await;
        match probe {
            Ok(Ok(_)) => {
                s.guarantee.renewed(sent);
                // The ensemble answers: a good moment to delete what was left
                // in a queue while it did not. Beside the heartbeat, so a slow
                // sweep never holds back the next probe.
                let pending = !s.strays.lock().expect("poisoned").is_empty();
                if pending && !s.sweeping.swap(true, std::sync::atomic::Ordering::SeqCst) {
                    let s = s.clone();
                    tokio::spawn(async move {
                        s.sweep_strays().await;
                        s.sweeping.store(false, std::sync::atomic::Ordering::SeqCst);
                    });
                }
            }
            Ok(Err(zk::Error::SessionExpired)) => {
                s.guarantee.end();
                return;
            }
            _ => {}
        }
        if matches!(
            states.peek_state(),
            zk::SessionState::Expired | zk::SessionState::Closed | zk::SessionState::AuthFailed
        ) {
            tracing::warn!("zookeeper session ended");
            s.guarantee.end();
            return;
        }
        drop(s);
        tokio::select! {
            () = tokio::time::sleep(every) => {}
            _ = states.changed() => {}
        }
    }
}

impl FencedLocks for ZkLocks {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn acquire<'a>(
        &'a self,
        name: &'a str,
        options: &'a LockOptions,
    ) -> BoxFuture<'a, Result<Box<dyn FencedLease>, LockError>> {
        Box::pin(async move {
            let lease = ZkLocks::acquire(self, name, options).await?;
            Ok(Box::new(lease) as Box<dyn FencedLease>)
        })
    }

    fn close(self: Box<Self>) -> BoxFuture<'static, Result<(), LockError>> {
        Box::pin(async move {
            // First every lease stops claiming its hold, then the nodes go. The
            // ZooKeeper session itself ends when its last holder (this, or a
            // lease still alive) is dropped.
            let s = &self.session;
            s.guarantee.end();
            if let Some(task) = s.heartbeat.get() {
                task.abort();
            }
            let held = std::mem::take(&mut *s.held.lock().expect("poisoned"));
            let mut result = Ok(());
            for path in held {
                match s.client.delete(&path, None).await {
                    Ok(()) | Err(zk::Error::NoNode) => {}
                    Err(e) => result = Err(zk_error(e)),
                }
            }
            result
        })
    }
}

/// One hold of a ZooKeeper lock. Dropping it deletes the node in the background.
pub struct ZkLease {
    session: Arc<Session>,
    name: String,
    path: String,
    token: FencingToken,
    released: bool,
}

impl ZkLease {
    /// Releases the hold (deletes its node; the next waiter's watch fires).
    ///
    /// # Errors
    /// [`LockError::NotHolder`] when the node was already gone (the session
    /// expired); [`LockError::Unavailable`].
    pub async fn release(mut self) -> Result<(), LockError> {
        self.released = true;
        self.session
            .held
            .lock()
            .expect("poisoned")
            .remove(&self.path);
        match self.session.client.delete(&self.path, None).await {
            Ok(()) => Ok(()),
            Err(zk::Error::NoNode) => Err(LockError::NotHolder(format!(
                "the hold on {:?} had already ended (its session expired)",
                self.name
            ))),
            Err(e) => {
                // The node may still be there, first in the queue: the
                // heartbeat deletes it once the ensemble answers.
                if outcome_unknown(&e) {
                    self.session.remember(Stray::Node(self.path.clone()));
                }
                Err(zk_error(e))
            }
        }
    }
}

impl GuaranteedLease for ZkLease {
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

impl Drop for ZkLease {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        self.session
            .held
            .lock()
            .expect("poisoned")
            .remove(&self.path);
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let (session, path) = (self.session.clone(), std::mem::take(&mut self.path));
            rt.spawn(async move { session.delete_or_remember(&path).await });
        }
    }
}

impl std::fmt::Debug for ZkLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZkLease")
            .field("name", &self.name)
            .field("token", &self.token)
            .field("remaining", &self.remaining())
            .finish()
    }
}

/// The ZooKeeper backend, as the registry in `palisade-backends` lists it.
pub static DESCRIPTOR: Descriptor = Descriptor {
    name: BACKEND,
    schemes: &[Scheme {
        scheme: "zk",
        shape: "zk://HOST:PORT[,HOST:PORT…][/chroot]",
    }],
    facts: Facts {
        title: "ZooKeeper (ephemeral-sequential recipe)",
        lease_on: "the ZooKeeper session timeout, on the server",
        token: "the lock node's czxid",
        clocks: "no for tokens; a session may outlive a paused holder",
    },
    connect: |_scheme, rest, session| {
        Box::pin(async move {
            session.refuse_bearer_token("ZooKeeper")?;
            let tls = match &session.tls {
                Some(t) if t.server_name.is_some() => {
                    return Err(LockError::InvalidInput(
                        "the ZooKeeper backend checks each server's certificate against \
                         the host of the connect string; another name cannot be given"
                            .into(),
                    ));
                }
                Some(t) => Some(ZkTls {
                    ca_pem: t.ca_pem.clone(),
                    identity: t.identity.clone(),
                }),
                None => None,
            };
            let locks =
                ZkLocks::connect_with(rest.trim_end_matches('/'), session.ttl, tls.as_ref())
                    .await?;
            Ok(Box::new(locks) as Box<dyn FencedLocks>)
        })
    },
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_queue_is_in_sequence_order_whatever_the_prefix() {
        let mut q: Vec<String> = [
            "lock-0000000012",
            "_c_ffff-lock-0000000010",
            "_c_0000-lock-0000000011",
            "lock-0000000009",
        ]
        .map(String::from)
        .to_vec();
        sort_queue(&mut q);
        assert_eq!(
            q,
            [
                "lock-0000000009",
                "_c_ffff-lock-0000000010",
                "_c_0000-lock-0000000011",
                "lock-0000000012"
            ]
        );
        let (a, b) = (new_tag(), new_tag());
        assert_ne!(a, b);
        assert!(
            a.starts_with("_c_") && a.ends_with('-') && a.len() == 36,
            "{a}"
        );
    }

    #[test]
    fn only_refusals_are_known_not_to_have_been_carried_out() {
        assert!(outcome_unknown(&zk::Error::ConnectionLoss));
        assert!(outcome_unknown(&zk::Error::Timeout));
        assert!(!outcome_unknown(&zk::Error::NoNode));
        assert!(!outcome_unknown(&zk::Error::SessionExpired));
    }

    #[test]
    fn names_become_one_distinct_segment() {
        assert_eq!(znode_segment("jobs/nightly"), "jobs%2Fnightly");
        assert_eq!(znode_segment("a%2Fb"), "a%252Fb");
        assert_ne!(znode_segment("a/b"), znode_segment("a%2Fb"));
        assert_eq!(znode_segment(".."), "%2E%2E");
        assert_eq!(znode_segment("plain-name_1"), "plain-name_1");
    }
}
