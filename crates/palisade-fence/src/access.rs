//! Who may write to a fenced resource: the store's authentication and
//! authorisation, with the lock server's policy file format
//! ([`palisade_auth::policy`]) and certificates ([`palisade_auth::principal`]).
//!
//! Without this, fencing protects only against holders that play by the rules:
//! anyone who can reach the store could write with a token of their choosing
//! (`18446744073709551615`, say), after which every real holder's token is stale
//! for good. So a store started with a policy file (`--auth`) asks every
//! request who sends it — a client certificate of its CA, or a bearer token,
//! never over plaintext — and grants by object-key prefix:
//!
//! | right in the policy | lets an identity |
//! |---|---|
//! | `lock` on a prefix | write objects under it: `PUT`, `DELETE`, and a fenced `GET` (which raises the fence) |
//! | `read` on a prefix | read objects under it with a plain `GET` |
//!
//! `GET /metrics` needs an authenticated identity of the policy; `GET
//! /v1/health` is open (it tells only whether fencing is on). No credentials,
//! or credentials the policy does not know, is `401 unauthenticated`; a known
//! identity without the right is `403 permission_denied`.

use std::sync::{Arc, RwLock};

use palisade_auth::{Policy, Principal, principal_of};
use rustls_pki_types::CertificateDer;

/// The certificates a client presented on its TLS connection (verified by the
/// handshake against the store's CA), put on each request of that connection.
#[derive(Clone, Debug)]
pub struct PeerCertificates(pub Arc<Vec<CertificateDer<'static>>>);

/// What a request may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Right {
    /// Read an object with a plain `GET`.
    Read,
    /// Write an object (or raise its fence with a fenced read).
    Write,
    /// Scrape the store's metrics.
    Metrics,
}

/// Why a request was refused before it touched the store.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AccessError {
    /// No credentials, or credentials nobody in the policy holds (401).
    #[error("{0}")]
    Unauthenticated(String),
    /// A known identity without the right it needs (403).
    #[error("{0}")]
    PermissionDenied(String),
}

/// Who may do what on a store: everyone (no policy: a store on loopback, the
/// drills), or what a policy file grants.
#[derive(Clone, Debug, Default)]
pub enum Access {
    /// Every request may do everything.
    #[default]
    Open,
    /// Callers must authenticate; the policy grants by key prefix. Shared so
    /// that a reload (SIGHUP) replaces it for every connection at once.
    Policy(Arc<RwLock<Policy>>),
}

impl Access {
    /// Access by `policy`.
    pub fn policy(policy: Policy) -> Self {
        Access::Policy(Arc::new(RwLock::new(policy)))
    }

    /// Replaces the policy (a reload); an open store stays open.
    pub fn replace(&self, policy: Policy) {
        if let Access::Policy(shared) = self {
            *shared.write().unwrap_or_else(|e| e.into_inner()) = policy;
        }
    }

    /// Whether callers must authenticate.
    pub fn is_open(&self) -> bool {
        matches!(self, Access::Open)
    }

    /// The identity making a request, if it may exercise `right` on `key`
    /// (`None` for an open store, which asks nobody).
    ///
    /// `certs` are the verified client certificates of the connection;
    /// `authorization` is the request's `Authorization` header. A certificate
    /// wins over a bearer token; a node's certificate is not a client's.
    ///
    /// # Errors
    /// [`AccessError::Unauthenticated`] or [`AccessError::PermissionDenied`],
    /// each saying why.
    pub fn authorize(
        &self,
        certs: Option<&PeerCertificates>,
        authorization: Option<&[u8]>,
        right: Right,
        key: &str,
    ) -> Result<Option<String>, AccessError> {
        let Access::Policy(policy) = self else {
            return Ok(None);
        };
        let policy = policy.read().unwrap_or_else(|e| e.into_inner());
        let unauthenticated = |why: &str| AccessError::Unauthenticated(why.to_owned());
        let identity = if let Some(PeerCertificates(certs)) = certs
            && let Some(first) = certs.first()
        {
            match principal_of(first) {
                Ok(Principal::Client(name)) => name,
                Ok(Principal::Node(id)) => {
                    return Err(unauthenticated(&format!(
                        "the certificate of node {id} is a node's, not a client's"
                    )));
                }
                Err(why) => return Err(unauthenticated(&why)),
            }
        } else if let Some(header) = authorization {
            let token = std::str::from_utf8(header)
                .ok()
                .and_then(|v| v.strip_prefix("Bearer "))
                .ok_or_else(|| unauthenticated("authorization must be `Bearer TOKEN`"))?;
            policy
                .user_of_token(token)
                .ok_or_else(|| unauthenticated("unknown or revoked bearer token"))?
                .to_owned()
        } else {
            return Err(unauthenticated(
                "this store requires a client certificate of its CA or a bearer token",
            ));
        };
        let Some(grants) = policy.grants(&identity) else {
            return Err(unauthenticated(&format!(
                "{identity:?} is not a user of this store's policy"
            )));
        };
        let allowed = match right {
            Right::Read => grants.may_read(key),
            Right::Write => grants.may_lock(key),
            Right::Metrics => true,
        };
        if !allowed {
            let what = match right {
                Right::Read => "read",
                Right::Write | Right::Metrics => "write",
            };
            return Err(AccessError::PermissionDenied(format!(
                "{identity:?} may not {what} {key:?} (the policy grants {} on no prefix of it)",
                if right == Right::Read { "read" } else { "lock" }
            )));
        }
        Ok(Some(identity))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const POLICY: &str = r#"
        [roles.jobs]
        lock = ["jobs/"]
        read = ["jobs/"]
        [roles.audit]
        read = [""]
        [[users]]
        name = "nightly"
        token_sha256 = ["9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"]
        roles = ["jobs"]
        [[users]]
        name = "auditor"
        token_sha256 = ["2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"]
        roles = ["audit"]
    "#;

    #[test]
    fn rights_follow_the_policy_by_key_prefix() {
        let access = Access::policy(Policy::parse(POLICY).unwrap());
        let nightly = Some(&b"Bearer test"[..]); // sha256("test")
        let auditor = Some(&b"Bearer hello"[..]); // sha256("hello")
        assert_eq!(
            access.authorize(None, nightly, Right::Write, "jobs/out"),
            Ok(Some("nightly".into()))
        );
        assert!(matches!(
            access.authorize(None, nightly, Right::Write, "billing/ledger"),
            Err(AccessError::PermissionDenied(_))
        ));
        assert!(
            access
                .authorize(None, auditor, Right::Read, "billing/ledger")
                .is_ok()
        );
        assert!(matches!(
            access.authorize(None, auditor, Right::Write, "jobs/out"),
            Err(AccessError::PermissionDenied(_))
        ));
        for bad in [
            None,
            Some(&b"Bearer nope"[..]),
            Some(&b"Basic dGVzdA=="[..]),
        ] {
            assert!(matches!(
                access.authorize(None, bad, Right::Write, "jobs/out"),
                Err(AccessError::Unauthenticated(_))
            ));
        }
        assert!(
            Access::Open
                .authorize(None, None, Right::Write, "x")
                .is_ok()
        );
    }

    #[test]
    fn a_reload_revokes_at_once() {
        let access = Access::policy(Policy::parse(POLICY).unwrap());
        let copy = access.clone();
        copy.replace(Policy::parse("").unwrap());
        assert!(matches!(
            access.authorize(None, Some(b"Bearer test"), Right::Write, "jobs/out"),
            Err(AccessError::Unauthenticated(_))
        ));
    }
}
