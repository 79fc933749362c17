//! How a correctness-lock backend declares itself, once, in its own crate: its
//! name, its URL schemes, the facts `palisade review` writes down about it,
//! and how a session on it is opened. `palisade-backends` lists the
//! descriptors (one line each); everything that takes a lock by URL, reviews
//! a deployment or names a backend in a report goes through them, so nothing
//! else matches on backend names.

use std::collections::HashMap;
use std::time::Duration;

use crate::lock::BoxFuture;
use crate::{FencedLocks, LockError};

/// A backend: everything the product needs to know about it.
pub struct Descriptor {
    /// Its one name: in reports, drills, benchmarks (`zookeeper`, …).
    pub name: &'static str,
    /// The URL schemes it answers to, each with the shape of its URLs (for
    /// help and errors); the first is the one reports use.
    pub schemes: &'static [Scheme],
    /// What `palisade review` writes down about it.
    pub facts: Facts,
    /// Opens a session on the backend a URL names.
    pub connect: Connect,
}

/// One URL scheme of a backend.
pub struct Scheme {
    /// `etcd`, `zk`, …
    pub scheme: &'static str,
    /// `etcd://HOST:PORT[,HOST:PORT…]`, …
    pub shape: &'static str,
}

/// Opens a session: the URL's scheme and everything after `://`.
pub type Connect = for<'a> fn(
    scheme: &'a str,
    rest: &'a str,
    session: &'a SessionSpec,
) -> BoxFuture<'a, Result<Box<dyn FencedLocks>, LockError>>;

/// The design-review facts of a backend (the second source document's
/// questions: what is the lease measured on, is there a token, do clocks
/// matter).
#[derive(Debug, Clone, Copy)]
pub struct Facts {
    /// What it is, in a few words: `etcd (lease + mutex recipe)`.
    pub title: &'static str,
    /// What the lease is measured on.
    pub lease_on: &'static str,
    /// What the fencing token is.
    pub token: &'static str,
    /// Whether safety depends on clocks, and how.
    pub clocks: &'static str,
}

/// TLS to a backend, as PEM.
#[derive(Clone, Default)]
pub struct Tls {
    /// The CA that signed the servers' certificates (the only one trusted).
    pub ca_pem: Vec<u8>,
    /// This client's certificate and key, when it authenticates by
    /// certificate.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
    /// The name to expect in the servers' certificates; `None`: the host of
    /// each address dialled.
    pub server_name: Option<String>,
}

/// The private key never reaches debug output.
impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls")
            .field("ca_pem", &format_args!("{} bytes", self.ca_pem.len()))
            .field("identity", &self.identity.as_ref().map(|_| "<certificate>"))
            .field("server_name", &self.server_name)
            .finish()
    }
}

/// What every backend's session needs.
#[derive(Clone, Default)]
pub struct SessionSpec {
    /// How long the locks outlive this process going silent.
    pub ttl: Duration,
    /// TLS to the backend, if it takes it.
    pub tls: Option<Tls>,
    /// A bearer token, if the backend takes one.
    pub bearer_token: Option<String>,
    /// Palisade: how long one request may take (default: the client's).
    pub request_timeout: Option<Duration>,
    /// Palisade: how long to keep trying to reach a leader (nodes down, an
    /// election) before a call gives up (default: the client's).
    pub retry_for: Option<Duration>,
    /// Palisade: a name for this session in the servers' logs.
    pub label: Option<String>,
    /// Palisade: server addresses as the cluster advertises them, mapped to how
    /// this process reaches them (a drill's worker reaches every node through
    /// its own fault proxy, also the leader a follower names).
    pub address_map: HashMap<String, String>,
}

impl SessionSpec {
    /// Backends that authenticate clients by certificate refuse a bearer
    /// token rather than ignore it.
    ///
    /// # Errors
    /// [`LockError::InvalidInput`] when a token is given.
    pub fn refuse_bearer_token(&self, backend: &str) -> Result<(), LockError> {
        match self.bearer_token {
            Some(_) => Err(LockError::InvalidInput(format!(
                "{backend} authenticates clients by certificate: give --cert/--key \
                 (with --ca); --token-file is for palisade://"
            ))),
            None => Ok(()),
        }
    }
}

/// The comma-separated `HOST:PORT`s of a URL's rest (a trailing `/` and
/// empty items dropped).
pub fn endpoints(rest: &str) -> Vec<String> {
    rest.trim_end_matches('/')
        .split(',')
        .filter(|e| !e.is_empty())
        .map(str::to_owned)
        .collect()
}
