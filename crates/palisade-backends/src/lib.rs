//! The one place where correctness-lock backends are registered, by URL scheme,
//! and the conventions every `palisade` command shares ([`exit`] statuses,
//! [`duration_arg`], [`FencingArg`]).
//!
//! Everything that takes a lock by URL (`palisade lock --backend URL`, the
//! drills' workers, the benchmarks) goes through [`connect`] and then only
//! through the [`FencedLocks`] trait. A new backend is a crate that implements
//! the trait and declares its [`Descriptor`], plus one line in [`REGISTRY`].
//!
//! This crate is on the product side: it links the backends' client crates and
//! nothing of the test rigs (`lab/`).

pub mod exit;

use std::time::Duration;

use clap::ValueEnum;
pub use palisade_core::backend::{Descriptor, SessionSpec, Tls};
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

/// Every correctness-lock backend, one line each. A new backend is a crate
/// that implements [`FencedLocks`] and declares its [`Descriptor`], plus one
/// line here; commands, reviews, drills and benchmarks find it through this
/// list, in this order (the order of reports).
pub static REGISTRY: &[&Descriptor] = &[
    &palisade_client::DESCRIPTOR,
    &palisade_zookeeper::DESCRIPTOR,
    &palisade_etcd::DESCRIPTOR,
    &palisade_postgres::DESCRIPTOR,
];

/// The backend that answers to `scheme`.
pub fn by_scheme(scheme: &str) -> Option<&'static Descriptor> {
    REGISTRY
        .iter()
        .copied()
        .find(|d| d.schemes.iter().any(|s| s.scheme == scheme))
}

/// The backend called `name` (`zookeeper`, …).
pub fn by_name(name: &str) -> Option<&'static Descriptor> {
    REGISTRY.iter().copied().find(|d| d.name == name)
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
        if by_scheme(scheme).is_none() {
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
    /// The backend this URL names (its scheme was checked when parsed).
    pub fn backend(&self) -> Option<&'static Descriptor> {
        by_scheme(&self.scheme)
    }
}

fn known() -> String {
    REGISTRY
        .iter()
        .flat_map(|d| d.schemes.iter().map(|s| s.shape))
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
    let backend = url.backend().ok_or_else(|| {
        LockError::InvalidInput(format!("no backend is registered for {:?}", url.scheme))
    })?;
    (backend.connect)(&url.scheme, &url.rest, session).await
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
