//! The one place where correctness-lock backends are registered, by URL scheme,
//! and the conventions every `palisade` command shares ([`exit`] statuses,
//! [`duration_arg`], [`FencingArg`]).
//!
//! Everything that takes a lock by URL (`palisade lock --backend URL`, the
//! drills' workers, the benchmarks) goes through [`connect`] and then only
//! through the [`FencedLocks`] trait. A new backend is a crate that implements
//! the trait, plus one arm in [`connect`] and one line in [`SCHEMES`].
//!
//! This crate is on the product side: it links the backends' client crates and
//! nothing of the test rigs (`lab/`).

pub mod exit;

use std::collections::HashMap;
use std::time::Duration;

use clap::ValueEnum;
use palisade_client::{Client, ClientConfig, TlsOptions};
use palisade_core::{FencedLocks, LockError};
use palisade_fence::Fencing;

/// Parses the CLI's durations: `10s`, `0.2s`, `150ms`, `2m`.
///
/// # Errors
/// The parse error, in words (for clap).
pub fn duration_arg(s: &str) -> Result<Duration, String> {
    palisade_core::duration::parse_duration(s).map_err(|e| e.to_string())
}

/// Whether the fenced store checks tokens (`--fencing on|off`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum FencingArg {
    /// Reject writes whose token is below the highest accepted (409).
    On,
    /// Accept every write (to show what goes wrong without fencing).
    Off,
}

impl From<FencingArg> for Fencing {
    fn from(f: FencingArg) -> Self {
        match f {
            FencingArg::On => Fencing::On,
            FencingArg::Off => Fencing::Off,
        }
    }
}

/// The registered schemes and the shape of their URLs (for help and errors).
pub const SCHEMES: &[(&str, &str)] = &[
    ("palisade", "palisade://HOST:PORT[,HOST:PORT…]"),
    ("etcd", "etcd://HOST:PORT[,HOST:PORT…]"),
    ("zk", "zk://HOST:PORT[,HOST:PORT…][/chroot]"),
    ("postgres", "postgres://USER@HOST:PORT/DB"),
    ("postgresql", "postgresql://USER@HOST:PORT/DB"),
];

/// What every backend's session needs.
#[derive(Clone, Default)]
pub struct SessionSpec {
    /// How long the locks outlive this process going silent.
    pub ttl: Duration,
    /// TLS to the backend, if it takes it.
    pub tls: Option<TlsOptions>,
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

/// A backend URL split into its scheme and the rest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendUrl {
    /// `palisade`, …
    pub scheme: String,
    /// Everything after `://`.
    pub rest: String,
}

impl std::str::FromStr for BackendUrl {
    type Err = LockError;

    fn from_str(s: &str) -> Result<Self, LockError> {
        let (scheme, rest) = s.split_once("://").ok_or_else(|| {
            LockError::InvalidInput(format!(
                "backend {s:?}: expected SCHEME://…, one of {}",
                known()
            ))
        })?;
        if !SCHEMES.iter().any(|(known, _)| *known == scheme) {
            return Err(LockError::InvalidInput(format!(
                "backend {s:?}: unknown scheme {scheme:?}; known: {}",
                known()
            )));
        }
        Ok(BackendUrl {
            scheme: scheme.to_owned(),
            rest: rest.to_owned(),
        })
    }
}

impl BackendUrl {
    /// The comma-separated `HOST:PORT`s after the scheme (a trailing `/` and
    /// empty items dropped).
    fn endpoints(&self) -> Vec<String> {
        self.rest
            .trim_end_matches('/')
            .split(',')
            .filter(|e| !e.is_empty())
            .map(str::to_owned)
            .collect()
    }
}

/// Backends that authenticate clients by certificate refuse a bearer token
/// rather than ignore it.
fn refuse_bearer_token(session: &SessionSpec, backend: &str) -> Result<(), LockError> {
    match session.bearer_token {
        Some(_) => Err(LockError::InvalidInput(format!(
            "{backend} authenticates clients by certificate: give --cert/--key \
             (with --ca); --token-file is for palisade://"
        ))),
        None => Ok(()),
    }
}

fn known() -> String {
    SCHEMES
        .iter()
        .map(|(_, shape)| *shape)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Opens a session on the backend `url` names.
///
/// # Errors
/// [`LockError::InvalidInput`] for a malformed URL; the backend's own errors
/// (unreachable, unauthenticated, …) otherwise.
pub async fn connect(
    url: &BackendUrl,
    session: &SessionSpec,
) -> Result<Box<dyn FencedLocks>, LockError> {
    match url.scheme.as_str() {
        "palisade" => {
            let endpoints = url.endpoints();
            if endpoints.is_empty() {
                return Err(LockError::InvalidInput(
                    "palisade:// needs at least one HOST:PORT".into(),
                ));
            }
            let mut config = ClientConfig::new(endpoints);
            config.session_ttl = session.ttl;
            config.tls = session.tls.clone();
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
            Ok(Box::new(Client::connect(config).await?))
        }
        "etcd" => {
            refuse_bearer_token(session, "etcd")?;
            let endpoints = url.endpoints();
            let tls = session.tls.as_ref().map(|t| palisade_etcd::EtcdTls {
                ca_pem: t.ca_pem.clone(),
                identity: t.identity.clone(),
                server_name: t.server_name.clone(),
            });
            Ok(Box::new(
                palisade_etcd::EtcdLocks::connect_with(&endpoints, session.ttl, tls.as_ref())
                    .await?,
            ))
        }
        "zk" => {
            refuse_bearer_token(session, "ZooKeeper")?;
            let tls = match &session.tls {
                Some(t) if t.server_name.is_some() => {
                    return Err(LockError::InvalidInput(
                        "the ZooKeeper backend checks each server's certificate against \
                         the host of the connect string; another name cannot be given"
                            .into(),
                    ));
                }
                Some(t) => Some(palisade_zookeeper::ZkTls {
                    ca_pem: t.ca_pem.clone(),
                    identity: t.identity.clone(),
                }),
                None => None,
            };
            Ok(Box::new(
                palisade_zookeeper::ZkLocks::connect_with(
                    url.rest.trim_end_matches('/'),
                    session.ttl,
                    tls.as_ref(),
                )
                .await?,
            ))
        }
        "postgres" | "postgresql" => {
            if session.tls.is_some() || session.bearer_token.is_some() {
                return Err(LockError::InvalidInput(
                    "the postgres backend takes its credentials in the URL; \
                     --ca/--cert/--token-file are for palisade://"
                        .into(),
                ));
            }
            let url = format!("{}://{}", url.scheme, url.rest);
            Ok(Box::new(
                palisade_postgres::PgLocks::connect(&url, session.ttl).await?,
            ))
        }
        other => Err(LockError::InvalidInput(format!(
            "no backend is registered for {other:?}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_a_registered_scheme() {
        let u: BackendUrl = "palisade://127.0.0.1:7420,127.0.0.1:7421".parse().unwrap();
        assert_eq!(u.scheme, "palisade");
        assert_eq!(u.rest, "127.0.0.1:7420,127.0.0.1:7421");
        for bad in ["127.0.0.1:7420", "redis://x:1", "zz://a", "://a"] {
            let e = bad.parse::<BackendUrl>().unwrap_err();
            assert!(matches!(e, LockError::InvalidInput(_)), "{bad}: {e:?}");
            assert!(e.to_string().contains("palisade://"), "{bad}: {e}");
        }
    }
}
