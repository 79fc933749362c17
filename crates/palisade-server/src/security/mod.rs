//! Who may talk to a node, and what they may do.
//!
//! - **Two listeners.** Clients on `--listen`, peers on `--listen-peer`; the
//!   `Raft` service exists only on the peer listener, `Locks` and `Cluster` only
//!   on the client listener.
//! - **TLS** (rustls; the handshakes in [`conn::incoming`]) on both when `--tls-cert/--tls-key/--tls-ca`
//!   are given. On the peer listener a client certificate of the cluster's CA is
//!   required and must name a member (`palisade:node:ID`); the node id in every
//!   Raft message must be the certificate's ([`PeerCheck`]).
//! - **Clients** prove who they are by a certificate of the CA or by a bearer
//!   token (never over plaintext); the policy file ([`acl`]) gives each identity
//!   its rights by lock-name prefix. Without a policy file every authenticated
//!   identity may do everything; without TLS (loopback only, or `--insecure`)
//!   nobody is asked who they are.
//! - **Sessions belong to their owner**: a session's key (128 random bits) and
//!   its opener's identity are checked on every call that uses it.
//! - **Limits** ([`conn`]): connections per listener, idle connections,
//!   calls in flight per identity.

/// The policy file: now [`palisade_auth::policy`], shared with the fenced resources.
pub use palisade_auth::policy as acl;
pub mod conn;
pub mod gate;
pub mod identity;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

use palisade_proto::ErrorCode;
use palisade_proto::h2_channel::TlsDialing;
use sha2::{Digest, Sha256};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_rustls::rustls;
use tonic::{Request, Status};

use self::acl::{Grants, Policy};
use self::conn::{CallGuard, Counters, Limits};
use self::identity::{Principal, conn_info, peer_certs, principal_of};

/// The PEM files of a node's TLS identity.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    /// The node's certificate (it must name the node: `palisade:node:ID`).
    pub cert: PathBuf,
    /// Its private key.
    pub key: PathBuf,
    /// The cluster's CA: it signs every node and client certificate.
    pub ca: PathBuf,
}

/// A node's security settings.
#[derive(Debug, Clone, Default)]
pub struct SecurityConfig {
    /// TLS on both listeners; `None`: plaintext.
    pub tls: Option<TlsFiles>,
    /// The policy file; `None`: every authenticated caller may do everything.
    pub policy: Option<PathBuf>,
    /// Bounds on connections and calls.
    pub limits: Limits,
}

/// Loaded TLS material: the two listeners' acceptors and the configuration for
/// calls to peers.
///
/// The handshakes are Palisade's own (tokio-rustls in [`conn::incoming`]), not
/// tonic's: the client listener serves HTTP/1.1 beside HTTP/2 (the JSON API),
/// so its ALPN must offer both — tonic's offers `h2` only, and a client that
/// asks for `http/1.1` alone (Python's and most HTTP/1.1 libraries) would be
/// refused in the handshake.
#[derive(Clone)]
pub struct Tls {
    clients: TlsAcceptor,
    peers_in: TlsAcceptor,
    peers: TlsDialing,
}

/// Accepts TLS on one listener.
pub type TlsAcceptor = tokio_rustls::TlsAcceptor;

fn read(path: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))
}

/// The rustls configuration of a listener: the node's certificate, the CA
/// that client certificates must chain to (required on the peer listener,
/// optional on the client listener, where bearer tokens are the other way in),
/// and the protocols offered.
fn server_config(
    cert: &[u8],
    key: &[u8],
    ca: &[u8],
    client_cert_required: bool,
    alpn: &[&[u8]],
) -> Result<rustls::ServerConfig, String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let provider = rustls::crypto::CryptoProvider::get_default()
        .cloned()
        .unwrap_or_else(|| Arc::new(rustls::crypto::ring::default_provider()));
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca) {
        let c = c.map_err(|e| format!("CA certificate: {e}"))?;
        roots.add(c).map_err(|e| format!("CA certificate: {e}"))?;
    }
    if roots.is_empty() {
        return Err("CA certificate: no certificate in the PEM".into());
    }
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    );
    let verifier = if client_cert_required {
        verifier
    } else {
        verifier.allow_unauthenticated()
    }
    .build()
    .map_err(|e| format!("CA certificate: {e}"))?;
    let chain = CertificateDer::pem_slice_iter(cert)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("certificate: {e}"))?;
    let key = PrivateKeyDer::from_pem_slice(key).map_err(|e| format!("key: {e}"))?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS versions: {e}"))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .map_err(|e| format!("certificate and key: {e}"))?;
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(config)
}

impl Tls {
    /// Reads the PEM files.
    ///
    /// # Errors
    /// A message naming the file that could not be read or used.
    pub fn load(files: &TlsFiles) -> Result<Tls, String> {
        let (cert, key, ca) = (read(&files.cert)?, read(&files.key)?, read(&files.ca)?);
        let named = |e: String| {
            let files = [&files.cert, &files.key, &files.ca].map(|f| f.display().to_string());
            format!("{}: {e}", files.join(", "))
        };
        let peers =
            TlsDialing::from_pem(&ca, Some((&cert, &key))).map_err(|e| named(e.to_string()))?;
        let clients =
            server_config(&cert, &key, &ca, false, &[b"h2", b"http/1.1"]).map_err(named)?;
        let peers_in = server_config(&cert, &key, &ca, true, &[b"h2"]).map_err(named)?;
        Ok(Tls {
            clients: TlsAcceptor::from(Arc::new(clients)),
            peers_in: TlsAcceptor::from(Arc::new(peers_in)),
            peers,
        })
    }

    /// For the client listener: a client certificate is verified when presented
    /// but not required (bearer tokens are the other way in); HTTP/2 (gRPC and
    /// JSON) and HTTP/1.1 (JSON).
    pub fn client_listener(&self) -> TlsAcceptor {
        self.clients.clone()
    }

    /// For the peer listener: a certificate of the cluster's CA is required.
    pub fn peer_listener(&self) -> TlsAcceptor {
        self.peers_in.clone()
    }

    /// For calls to peers: this node's certificate, and only the cluster's CA
    /// trusted.
    pub fn to_peers(&self) -> TlsDialing {
        self.peers.clone()
    }
}

/// The digest under which a session key is stored (lower-case hex SHA-256).
pub fn session_key_digest(key: &[u8]) -> String {
    hex::encode(Sha256::digest(key))
}

/// Where session keys come from: the operating system's generator in
/// production; a seeded generator under the deterministic simulator, whose
/// replays must mint the same keys (a key's digest is part of the log).
#[derive(Clone, Default)]
pub struct SessionKeys(Option<Arc<Mutex<rand::rngs::StdRng>>>);

impl SessionKeys {
    /// Keys from a generator seeded with `seed`: for simulation only, since
    /// anyone who knows the seed knows every key.
    pub fn seeded(seed: u64) -> Self {
        use rand::SeedableRng;
        SessionKeys(Some(Arc::new(Mutex::new(
            rand::rngs::StdRng::seed_from_u64(seed),
        ))))
    }

    /// A fresh session key of 128 bits.
    pub fn mint(&self) -> Vec<u8> {
        use rand::Rng;
        match &self.0 {
            None => rand::random::<[u8; 16]>().to_vec(),
            Some(rng) => rng.lock().expect("poisoned").random::<[u8; 16]>().to_vec(),
        }
    }
}

impl std::fmt::Debug for SessionKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "SessionKeys(seeded)"
        } else {
            "SessionKeys(os)"
        })
    }
}

/// Compares without an early exit, so the time taken does not tell how much of
/// a guessed key was right.
pub fn same_secret(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// An admitted call: who made it, what they may do. Holds the caller's call slot
/// and marks the connection busy until dropped.
pub struct Caller {
    /// The authenticated identity; empty on an open (plaintext) node.
    pub identity: String,
    /// The caller's address, for the log.
    peer: String,
    counters: Arc<Counters>,
    grants: Arc<Grants>,
    /// Sessions this identity may hold open (`None`: no per-identity bound).
    max_sessions: Option<usize>,
    _slot: OwnedSemaphorePermit,
    _busy: Option<CallGuard>,
}

impl Caller {
    /// Counts and logs a refusal of this caller's call, and returns it.
    pub fn refuse(&self, status: Status) -> Status {
        self.counters.refused_auth.inc();
        tracing::warn!(
            peer = self.peer,
            identity = self.identity,
            code = ?status.code(),
            reason = status.message(),
            "call refused"
        );
        status
    }

    fn deny(&self, what: &str) -> Status {
        self.refuse(
            ErrorCode::PermissionDenied
                .status(format!("identity {:?} may not {what}", self.identity)),
        )
    }

    /// Refuses unless the caller may hold sessions at all: some `lock` right.
    /// Checked when a session is opened and on every keep-alive, so an identity
    /// dropped from the policy (SIGHUP) loses its sessions within one TTL.
    ///
    /// # Errors
    /// `permission_denied`.
    pub fn may_hold_sessions(&self) -> Result<(), Status> {
        if self.grants.lock.is_empty() {
            Err(self.deny("hold sessions (it has no lock role)"))
        } else {
            Ok(())
        }
    }

    /// Refuses unless the caller may lock `name`.
    ///
    /// # Errors
    /// `permission_denied`.
    pub fn may_lock(&self, name: &str) -> Result<(), Status> {
        if self.grants.may_lock(name) {
            Ok(())
        } else {
            Err(self.deny(&format!("lock {name:?}")))
        }
    }

    /// Refuses unless the caller may read `name`.
    ///
    /// # Errors
    /// `permission_denied`.
    pub fn may_read(&self, name: &str) -> Result<(), Status> {
        if self.grants.may_read(name) {
            Ok(())
        } else {
            Err(self.deny(&format!("read {name:?}")))
        }
    }

    /// Whether the caller may read `name` (for filtering lists).
    pub fn can_read(&self, name: &str) -> bool {
        self.grants.may_read(name)
    }

    /// Whether the caller may read anything at all.
    pub fn reads_something(&self) -> bool {
        !self.grants.read.is_empty()
    }

    /// Refuses unless the caller may look at the node's metrics and status
    /// page: some `read` right, or `admin`.
    ///
    /// # Errors
    /// `permission_denied`.
    pub fn may_observe(&self) -> Result<(), Status> {
        if self.reads_something() || self.grants.admin {
            Ok(())
        } else {
            Err(self.deny("see this node's metrics and status (it has no read or admin role)"))
        }
    }

    /// Refuses unless the caller has the admin role.
    ///
    /// # Errors
    /// `permission_denied`.
    pub fn may_administer(&self) -> Result<(), Status> {
        if self.grants.admin {
            Ok(())
        } else {
            Err(self.deny("change membership (needs admin)"))
        }
    }
}

/// The call slots of each identity with calls in flight.
///
/// An identity's entry outlives its calls until the next sweep, which runs
/// when the map has doubled since the last one and drops every entry with no
/// call in flight: the map stays within about twice the number of identities
/// that have calls running, however many have come and gone.
#[derive(Default)]
struct CallSlots {
    /// Each identity's slots and how many it was given.
    by_identity: HashMap<String, (Arc<Semaphore>, usize)>,
    sweep_above: usize,
}

impl CallSlots {
    /// Takes one of `identity`'s `max` slots; `None` when all are in use.
    fn take(&mut self, identity: &str, max: usize) -> Option<OwnedSemaphorePermit> {
        if self.by_identity.len() > self.sweep_above {
            self.by_identity
                .retain(|_, (s, given)| s.available_permits() < *given);
            self.sweep_above = (2 * self.by_identity.len()).max(64);
        }
        let slots = match self.by_identity.get(identity) {
            Some((s, given)) if *given == max => s.clone(),
            // New, or its bound changed with a policy reload: calls already in
            // flight keep their old slots and the new bound starts afresh.
            _ => {
                let s = Arc::new(Semaphore::new(max));
                self.by_identity
                    .insert(identity.to_owned(), (s.clone(), max));
                s
            }
        };
        // Taken under the map's lock, so a sweep never drops an entry between
        // its look-up and the permit.
        slots.try_acquire_owned().ok()
    }
}

/// Sessions being opened (proposed, not yet applied) per identity, so that
/// concurrent opens cannot all pass the bound before any of them counts.
#[derive(Default)]
struct Opening {
    by_identity: HashMap<String, usize>,
}

/// One session being opened, counted for its identity until dropped (when
/// the state machine has applied it, or the open failed).
pub struct SessionReservation {
    gatekeeper: Arc<Gatekeeper>,
    identity: String,
}

impl Drop for SessionReservation {
    fn drop(&mut self) {
        let mut opening = self.gatekeeper.opening.lock().expect("poisoned");
        if let Some(n) = opening.by_identity.get_mut(&self.identity) {
            *n -= 1;
            if *n == 0 {
                opening.by_identity.remove(&self.identity);
            }
        }
    }
}

/// Authenticates and admits client calls.
pub struct Gatekeeper {
    tls: bool,
    policy_path: Option<PathBuf>,
    policy: RwLock<Option<Arc<Policy>>>,
    limits: Limits,
    slots: Mutex<CallSlots>,
    opening: Mutex<Opening>,
    /// What was turned away.
    pub counters: Arc<Counters>,
}

impl Gatekeeper {
    /// Reads the policy file, if any.
    ///
    /// # Errors
    /// A message when the policy cannot be read or is inconsistent, or when a
    /// policy is given without TLS (nobody could authenticate).
    pub fn new(config: &SecurityConfig, counters: Arc<Counters>) -> Result<Gatekeeper, String> {
        if config.policy.is_some() && config.tls.is_none() {
            return Err("a policy file needs TLS: without it no caller can authenticate (certificates need TLS, bearer tokens are refused over plaintext)".into());
        }
        let policy = config
            .policy
            .as_deref()
            .map(Policy::load)
            .transpose()?
            .map(Arc::new);
        Ok(Gatekeeper {
            tls: config.tls.is_some(),
            policy_path: config.policy.clone(),
            policy: RwLock::new(policy),
            limits: config.limits,
            slots: Mutex::new(CallSlots::default()),
            opening: Mutex::new(Opening::default()),
            counters,
        })
    }

    /// Whether callers must authenticate.
    pub fn is_open(&self) -> bool {
        !self.tls
    }

    /// Re-reads the policy file (on SIGHUP). On error the old policy stays.
    ///
    /// # Errors
    /// The reason the new file was not taken.
    pub fn reload(&self) -> Result<usize, String> {
        let Some(path) = &self.policy_path else {
            return Ok(0);
        };
        let policy = Policy::load(path)?;
        let users = policy.user_count();
        *self.policy.write().expect("poisoned") = Some(Arc::new(policy));
        Ok(users)
    }

    /// Counts one more session being opened by `caller`, unless that reaches
    /// its bound; `open_now` reads how many sessions it holds in the applied
    /// state. It is read under the lock a finished open releases its
    /// reservation under, after its session was applied, so an open is always
    /// counted once at least: in flight, applied, or (briefly) both.
    ///
    /// The bound is the leader's, not the state machine's: around a change
    /// of leader (opens in flight at the old one, entries the new one has not
    /// applied yet) an identity can pass it by those opens. The cluster-wide
    /// bound is the state machine's and exact.
    ///
    /// # Errors
    /// `limit_reached`, counted and logged.
    pub fn reserve_session(
        self: &Arc<Self>,
        caller: &Caller,
        open_now: impl FnOnce() -> usize,
    ) -> Result<Option<SessionReservation>, Status> {
        let Some(max) = caller.max_sessions else {
            return Ok(None);
        };
        let mut opening = self.opening.lock().expect("poisoned");
        let in_flight = opening
            .by_identity
            .get(&caller.identity)
            .copied()
            .unwrap_or(0);
        if open_now() + in_flight >= max {
            drop(opening);
            self.counters.refused_sessions.inc();
            tracing::warn!(
                peer = caller.peer,
                identity = caller.identity,
                limit = max,
                "session refused: too many open"
            );
            return Err(ErrorCode::LimitReached.status(format!(
                "identity {:?} has {max} sessions open, its limit: close one or raise max_sessions for its role",
                caller.identity
            )));
        }
        *opening
            .by_identity
            .entry(caller.identity.clone())
            .or_default() += 1;
        Ok(Some(SessionReservation {
            gatekeeper: self.clone(),
            identity: caller.identity.clone(),
        }))
    }

    fn refuse(&self, peer: &str, status: Status) -> Status {
        self.counters.refused_auth.inc();
        tracing::warn!(peer, code = ?status.code(), reason = status.message(), "call refused");
        status
    }

    /// Establishes who made the call, takes one of its call slots and marks the
    /// connection busy.
    ///
    /// # Errors
    /// `unauthenticated` (no, bad or misplaced credentials) or `limit_reached`
    /// (too many calls in flight for this identity).
    pub fn admit(
        &self,
        headers: &http::HeaderMap,
        extensions: &http::Extensions,
    ) -> Result<Caller, Status> {
        let conn = extensions.get::<conn::ConnInfo>();
        let peer = conn
            .and_then(|c| c.remote)
            .map_or_else(|| "?".to_owned(), |a| a.to_string());
        let unauthenticated =
            |why: &str| self.refuse(&peer, ErrorCode::Unauthenticated.status(why));
        let policy = self.policy.read().expect("poisoned").clone();
        let identity = if let Some(certs) = conn.and_then(|c| c.peer_certs.as_ref()) {
            match principal_of(&certs[0]) {
                Ok(Principal::Client(name)) => name,
                Ok(Principal::Node(id)) => {
                    return Err(unauthenticated(&format!(
                        "the certificate of node {id} is for the peer port, not the client port"
                    )));
                }
                Err(why) => return Err(unauthenticated(&why)),
            }
        } else if let Some(auth) = headers.get(http::header::AUTHORIZATION) {
            if !self.tls {
                return Err(unauthenticated(
                    "bearer tokens are refused over plaintext: they would travel in the clear",
                ));
            }
            let token = auth
                .to_str()
                .ok()
                .and_then(|v| v.strip_prefix("Bearer "))
                .ok_or_else(|| unauthenticated("authorization must be `Bearer TOKEN`"))?;
            match policy.as_ref().and_then(|p| p.user_of_token(token)) {
                Some(user) => user.to_owned(),
                None => return Err(unauthenticated("unknown or revoked bearer token")),
            }
        } else if self.tls {
            return Err(unauthenticated(
                "this node requires a client certificate of its CA or a bearer token",
            ));
        } else {
            String::new()
        };
        let grants = match &policy {
            None => Arc::new(Grants::all()),
            Some(p) => Arc::new(p.grants(&identity).cloned().unwrap_or_default()),
        };
        let max_calls = grants
            .max_calls
            .unwrap_or(self.limits.max_calls_per_identity);
        let slot = self
            .slots
            .lock()
            .expect("poisoned")
            .take(&identity, max_calls)
            .ok_or_else(|| {
                self.counters.refused_calls.inc();
                tracing::warn!(
                    peer,
                    identity,
                    limit = max_calls,
                    "call refused: too many in flight"
                );
                ErrorCode::LimitReached.status(format!(
                    "identity {identity:?} has {max_calls} calls in flight, the limit"
                ))
            })?;
        // On an open node every caller is the same anonymous identity: only
        // the cluster-wide bound applies there.
        let max_sessions = self.tls.then(|| {
            grants
                .max_sessions
                .unwrap_or(self.limits.max_sessions_per_identity)
        });
        Ok(Caller {
            identity,
            peer,
            counters: self.counters.clone(),
            grants,
            max_sessions,
            _slot: slot,
            _busy: conn.map(|c| c.begin_call()),
        })
    }
}

/// Checks that peer traffic comes from a member node.
#[derive(Clone)]
pub struct PeerCheck {
    /// Whether peers present certificates (TLS on).
    pub tls: bool,
    /// What was turned away.
    pub counters: Arc<Counters>,
}

impl PeerCheck {
    /// The node id the caller's certificate names, or `None` without TLS.
    /// `is_member` says whether an id is in this node's current membership
    /// (a node that has none yet, before it joined, accepts any node of the CA).
    ///
    /// # Errors
    /// `unauthenticated` for a certificate that names no node;
    /// `permission_denied` for a node that is not a member.
    pub fn node_of<T>(
        &self,
        req: &Request<T>,
        is_member: impl Fn(u64) -> bool,
    ) -> Result<Option<u64>, Status> {
        if !self.tls {
            return Ok(None);
        }
        let refuse = |status: Status| {
            self.counters.refused_auth.inc();
            let peer = conn_info(req).and_then(|c| c.remote);
            tracing::warn!(?peer, reason = status.message(), "raft message refused");
            status
        };
        let certs = peer_certs(req).ok_or_else(|| {
            refuse(ErrorCode::Unauthenticated.status("raft traffic needs a node certificate"))
        })?;
        match principal_of(&certs[0]) {
            Ok(Principal::Node(id)) if is_member(id) => Ok(Some(id)),
            Ok(Principal::Node(id)) => Err(refuse(
                ErrorCode::PermissionDenied.status(format!("node {id} is not a member")),
            )),
            Ok(Principal::Client(name)) => Err(refuse(ErrorCode::Unauthenticated.status(format!(
                "client certificate {name:?} presented on the peer port"
            )))),
            Err(why) => Err(refuse(ErrorCode::Unauthenticated.status(why))),
        }
    }

    /// Refuses a Raft message whose sender id differs from the certificate's.
    ///
    /// # Errors
    /// `permission_denied`.
    pub fn same_sender(&self, cert: Option<u64>, claimed: Option<u64>) -> Result<(), Status> {
        match cert {
            Some(id) if claimed != Some(id) => {
                self.counters.refused_auth.inc();
                tracing::warn!(cert = id, ?claimed, "raft message claims another sender");
                Err(ErrorCode::PermissionDenied.status(format!(
                    "node {id} sent a message in the name of {claimed:?}"
                )))
            }
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn call_slots_cap_each_identity_and_forget_idle_ones() {
        let mut slots = CallSlots::default();
        let held: Vec<_> = (0..3).map(|_| slots.take("a", 3).unwrap()).collect();
        assert!(slots.take("a", 3).is_none(), "a fourth call of a");
        assert!(
            slots.take("b", 3).is_some(),
            "another identity is not affected"
        );
        // Many identities come and go; only a's calls stay in flight.
        for i in 0..10_000 {
            drop(slots.take(&format!("passer-{i}"), 3).unwrap());
        }
        assert!(
            slots.by_identity.len() <= 130,
            "{}",
            slots.by_identity.len()
        );
        assert!(
            slots.take("a", 3).is_none(),
            "a's slots survived the sweeps"
        );
        drop(held);
        assert!(slots.take("a", 3).is_some());
    }

    #[test]
    fn secrets_compare_by_content_and_length() {
        assert!(same_secret(b"abc", b"abc"));
        assert!(!same_secret(b"abc", b"abd"));
        assert!(!same_secret(b"abc", b"ab"));
        assert!(!same_secret(b"", b"a"));
    }

    #[test]
    fn session_keys_are_fresh_and_digests_stable() {
        let keys = SessionKeys::default();
        let (a, b) = (keys.mint(), keys.mint());
        assert_eq!(a.len(), 16);
        assert_ne!(a, b);
        assert_eq!(session_key_digest(&a), session_key_digest(&a));
        assert_eq!(session_key_digest(&a).len(), 64);
        let (x, y) = (SessionKeys::seeded(5), SessionKeys::seeded(5));
        assert_eq!((x.mint(), x.mint()), (y.mint(), y.mint()));
        assert_ne!(SessionKeys::seeded(6).mint(), SessionKeys::seeded(5).mint());
    }
}
