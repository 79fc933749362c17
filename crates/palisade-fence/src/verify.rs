//! A token is believed only if the lock service issued it for that lock.
//!
//! Fencing alone trusts every token: the resource keeps the highest one it has
//! seen and refuses lower ones. So one write with a made-up token —
//! `18446744073709551615` — raises the fence past anything the lock service
//! will ever grant, and every real holder is refused from then on: fencing
//! fails closed against the legitimate holder. Authentication
//! ([`crate::access`]) keeps strangers out; this module keeps an authenticated
//! writer honest too.
//!
//! A [`TokenVerifier`] is asked before a resource accepts a token **above the
//! highest it has seen** (an equal or lower token needs no question: it was
//! believed before, or it is stale anyway). It asks the lock service
//! ([`TokenIssuer`]) whether the token is the lock's current grant:
//!
//! - current: accepted, and remembered, so later writes with it — to any object
//!   under that lock — cost nothing (one round trip per new token, not per
//!   write);
//! - above every token the service has issued: refused as
//!   [`VerifyError::FromTheFuture`] — it was made up;
//! - otherwise (released, expired or superseded): refused as
//!   [`VerifyError::NotCurrent`]. A holder must therefore make its first write
//!   of a grant while it holds the lock, which a correct holder does anyway;
//! - no answer: refused as [`VerifyError::Unavailable`] (fail closed; the
//!   writer may retry).
//!
//! What it costs: one linearizable read on the lock service (a leader round
//! trip to a quorum) for each grant's first write; nothing after. What it
//! protects: the highest token a resource holds was granted for that lock, so
//! no writer — authenticated or not — can lock the real holders out.
//!
//! Only Palisade's own server can answer (its tokens are its log's indexes, so
//! "issued through N" is exact); for tokens of etcd, ZooKeeper or PostgreSQL
//! the resource relies on authentication alone.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use palisade_core::FencingToken;

/// What the lock service says of a token for a lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IssuerAnswer {
    /// Whether the token is the lock's current grant.
    pub current: bool,
    /// The lock's current grant, `None` when not held.
    pub current_token: Option<FencingToken>,
    /// No token above this has been issued (for any lock).
    pub issued_through: u64,
}

/// A boxed future, for object-safe async.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The lock service a resource asks about tokens it has not seen.
pub trait TokenIssuer: Send + Sync {
    /// What the service says of `token` for `lock`, read linearizably.
    ///
    /// # Errors
    /// A message when the service did not answer.
    fn token_status<'a>(
        &'a self,
        lock: &'a str,
        token: FencingToken,
    ) -> BoxFuture<'a, Result<IssuerAnswer, String>>;
}

#[cfg(feature = "palisade-cluster")]
impl TokenIssuer for palisade_client::Admin {
    fn token_status<'a>(
        &'a self,
        lock: &'a str,
        token: FencingToken,
    ) -> BoxFuture<'a, Result<IssuerAnswer, String>> {
        Box::pin(async move {
            let s = palisade_client::Admin::token_status(self, lock, token)
                .await
                .map_err(|e| e.to_string())?;
            Ok(IssuerAnswer {
                current: s.current,
                current_token: s.current_token,
                issued_through: s.issued_through,
            })
        })
    }
}

/// Why a token was not believed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    /// Above every token the lock service has issued: made up.
    #[error(
        "token {token} was never issued by the lock service (it has issued tokens only up to {issued_through})"
    )]
    FromTheFuture {
        /// The token presented.
        token: FencingToken,
        /// The highest token the service can have issued.
        issued_through: u64,
    },
    /// Not the lock's current grant, and never seen by this resource.
    #[error(
        "token {token} is not the current grant of lock {lock:?} (current: {}); a grant's first write must come while it is held",
        current.map_or_else(|| "none".to_owned(), |t| t.to_string())
    )]
    NotCurrent {
        /// The lock asked about.
        lock: String,
        /// The token presented.
        token: FencingToken,
        /// The lock's current grant, if any.
        current: Option<FencingToken>,
    },
    /// The lock service did not answer; nothing was decided.
    #[error("cannot check token {token} with the lock service: {detail}")]
    Unavailable {
        /// The token presented.
        token: FencingToken,
        /// What went wrong.
        detail: String,
    },
}

impl VerifyError {
    /// A stable short name, for error bodies and metrics.
    pub fn code(&self) -> &'static str {
        match self {
            VerifyError::FromTheFuture { .. } => "token_not_issued",
            VerifyError::NotCurrent { .. } => "token_not_current",
            VerifyError::Unavailable { .. } => "token_check_unavailable",
        }
    }
}

/// Why a token was believed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Belief {
    /// It was verified before: no question asked.
    Known,
    /// The lock service said, just now, that it is the lock's current grant.
    Granted,
}

/// How many locks' verified tokens are remembered before the memory is
/// cleared (which costs only a second question per token).
pub const MAX_REMEMBERED_LOCKS: usize = 100_000;

/// How many verified tokens are remembered per lock (the newest).
const TOKENS_PER_LOCK: usize = 8;

/// Asks a [`TokenIssuer`] about new tokens, and remembers the answers that
/// were "yes". Cheap to share (`Arc`).
pub struct TokenVerifier {
    issuer: Box<dyn TokenIssuer>,
    verified: Mutex<HashMap<String, Vec<FencingToken>>>,
    checks: AtomicU64,
}

impl std::fmt::Debug for TokenVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenVerifier")
            .field("checks", &self.checks())
            .finish_non_exhaustive()
    }
}

impl TokenVerifier {
    /// A verifier asking `issuer`.
    pub fn new(issuer: impl TokenIssuer + 'static) -> Self {
        TokenVerifier {
            issuer: Box::new(issuer),
            verified: Mutex::new(HashMap::new()),
            checks: AtomicU64::new(0),
        }
    }

    /// How many questions it has asked the lock service.
    pub fn checks(&self) -> u64 {
        self.checks.load(Ordering::Relaxed)
    }

    /// Whether `token` was already found to be a grant of `lock`.
    pub fn is_known(&self, lock: &str, token: FencingToken) -> bool {
        let verified = self.verified.lock().unwrap_or_else(|e| e.into_inner());
        verified.get(lock).is_some_and(|t| t.contains(&token))
    }

    /// Believes `token` for `lock` if the lock service granted it: at once if
    /// it was verified before ([`Belief::Known`]), else after one question
    /// ([`Belief::Granted`]).
    ///
    /// # Errors
    /// See [`VerifyError`] (each one the answer to a question asked).
    pub async fn verify(&self, lock: &str, token: FencingToken) -> Result<Belief, VerifyError> {
        if self.is_known(lock, token) {
            return Ok(Belief::Known);
        }
        self.checks.fetch_add(1, Ordering::Relaxed);
        let answer = self
            .issuer
            .token_status(lock, token)
            .await
            .map_err(|detail| VerifyError::Unavailable { token, detail })?;
        if answer.current {
            self.remember(lock, token);
            return Ok(Belief::Granted);
        }
        if token.get() > answer.issued_through {
            return Err(VerifyError::FromTheFuture {
                token,
                issued_through: answer.issued_through,
            });
        }
        Err(VerifyError::NotCurrent {
            lock: lock.to_owned(),
            token,
            current: answer.current_token,
        })
    }

    fn remember(&self, lock: &str, token: FencingToken) {
        let mut verified = self.verified.lock().unwrap_or_else(|e| e.into_inner());
        if verified.len() >= MAX_REMEMBERED_LOCKS && !verified.contains_key(lock) {
            verified.clear();
        }
        let tokens = verified.entry(lock.to_owned()).or_default();
        if !tokens.contains(&token) {
            if tokens.len() == TOKENS_PER_LOCK {
                // Drop the lowest: a lock's grants rise, so it is the oldest.
                let lowest = tokens.iter().enumerate().min_by_key(|(_, t)| **t);
                if let Some((at, _)) = lowest {
                    tokens.swap_remove(at);
                }
            }
            tokens.push(token);
        }
    }
}

/// The lock that fences object `key`: `lock` when given (the writer's
/// `Fencing-Lock` header), which must be the key itself or a prefix of it
/// ending at a `/`; the key itself otherwise. A writer cannot fence a key with
/// an unrelated lock's token.
///
/// # Errors
/// A message when `lock` does not cover `key`.
pub fn lock_for_key<'a>(key: &'a str, lock: Option<&'a str>) -> Result<&'a str, String> {
    let Some(lock) = lock else {
        return Ok(key);
    };
    let covers = key == lock
        || (key.starts_with(lock) && (lock.ends_with('/') || key[lock.len()..].starts_with('/')));
    if lock.is_empty() || !covers {
        return Err(format!(
            "lock {lock:?} does not cover object {key:?}: the lock must be the key or a prefix of it ending at a '/'"
        ));
    }
    Ok(lock)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A lock service of one lock whose grant and issued-through are set by
    /// the test.
    struct OneLock(Mutex<(u64, u64)>);

    impl TokenIssuer for OneLock {
        fn token_status<'a>(
            &'a self,
            lock: &'a str,
            token: FencingToken,
        ) -> BoxFuture<'a, Result<IssuerAnswer, String>> {
            let (current, issued) = *self.0.lock().unwrap();
            let current = (lock == "jobs/nightly")
                .then_some(current)
                .and_then(FencingToken::new);
            Box::pin(async move {
                Ok(IssuerAnswer {
                    current: current == Some(token),
                    current_token: current,
                    issued_through: issued,
                })
            })
        }
    }

    fn t(n: u64) -> FencingToken {
        FencingToken::new(n).unwrap()
    }

    #[tokio::test]
    async fn believes_grants_once_and_refuses_made_up_tokens() {
        let v = TokenVerifier::new(OneLock(Mutex::new((7, 9))));
        assert_eq!(v.verify("jobs/nightly", t(7)).await, Ok(Belief::Granted));
        assert_eq!(v.verify("jobs/nightly", t(7)).await, Ok(Belief::Known));
        assert_eq!(v.checks(), 1, "a verified token is not asked about again");
        assert!(matches!(
            v.verify("jobs/nightly", t(u64::MAX)).await,
            Err(VerifyError::FromTheFuture {
                issued_through: 9,
                ..
            })
        ));
        assert!(matches!(
            v.verify("jobs/nightly", t(8)).await,
            Err(VerifyError::NotCurrent { current: Some(c), .. }) if c == t(7)
        ));
        assert!(matches!(
            v.verify("billing", t(7)).await,
            Err(VerifyError::NotCurrent { current: None, .. })
        ));
        assert_eq!(v.checks(), 4);
    }

    #[test]
    fn a_lock_covers_its_key_and_the_keys_below_it() {
        assert_eq!(lock_for_key("a/b", None), Ok("a/b"));
        assert_eq!(lock_for_key("a/b", Some("a/b")), Ok("a/b"));
        assert_eq!(lock_for_key("a/b/c", Some("a/b")), Ok("a/b"));
        assert_eq!(lock_for_key("a/b/c", Some("a/")), Ok("a/"));
        for bad in ["a/bc", "a/b/c/d/e", "", "b"] {
            assert!(lock_for_key("a/b", Some(bad)).is_err(), "{bad:?}");
        }
        assert!(lock_for_key("a/bc", Some("a/b")).is_err());
    }
}
