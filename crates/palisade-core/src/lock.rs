//! The two lock APIs every backend implements, kept apart in the types.
//!
//! - [`FencedLocks`] / [`FencedLease`]: **correctness** locks. Every grant carries
//!   a [`FencingToken`] that only grows; the resource must check it. Backends:
//!   the Palisade server (and, as they are added, etcd, ZooKeeper, PostgreSQL).
//! - [`EfficiencyLease`]: **efficiency** locks (Redis, Redlock). No token, and no
//!   way to get one: a random lock value can make release safe, but it cannot
//!   order grants.
//!
//! A lease is measured on the holder's monotonic clock: [`FencedLease::remaining`]
//! is how long the backend still *guarantees* the hold, minus a safety margin;
//! [`FencedLease::lost`] completes when that reaches zero. A process can pause
//! right after checking — which is why the token exists.
//!
//! The traits are object-safe (futures are boxed) so that a backend can be chosen
//! at run time, by URL, in one place (the CLI's backend registry).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};

use crate::{FencingToken, LeaseState};

/// A boxed, sendable future: what the object-safe lock traits return.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// How to acquire one lock, whatever the backend.
#[derive(Debug, Clone, Default)]
pub struct LockOptions {
    /// How long to wait in the lock's queue. Zero: fail at once with
    /// [`LockError::WouldBlock`] if it is held.
    pub wait: Duration,
    /// After a holder's lease *expires* (not after a clean release), keep the lock
    /// unavailable this long. Backends without lock-delay refuse a non-zero value
    /// with [`LockError::InvalidInput`] rather than ignore it.
    pub lock_delay: Duration,
    /// What to ask of the name: a plain lock (the default), a semaphore
    /// permit, a read or write lock, an election's leadership. Backends that
    /// have only plain locks refuse the others with [`LockError::InvalidInput`]
    /// ([`LockOptions::plain_lock_only`]) rather than hand out a plain lock.
    pub claim: crate::machine::Claim,
}

impl LockOptions {
    /// For a backend with plain locks and elections (etcd, ZooKeeper, each
    /// through its own recipe): `None` for a plain lock, the candidate's value
    /// for an election, and [`LockError::InvalidInput`] naming the backend for
    /// a semaphore or a read/write lock.
    ///
    /// # Errors
    /// As said.
    pub fn lock_or_lead(&self, backend: &str) -> Result<Option<&str>, LockError> {
        match &self.claim {
            crate::machine::Claim::Lock => Ok(None),
            crate::machine::Claim::Lead { value } => {
                if value.len() > crate::machine::MAX_VALUE_LEN {
                    return Err(LockError::InvalidInput(format!(
                        "an election value is at most {} bytes",
                        crate::machine::MAX_VALUE_LEN
                    )));
                }
                Ok(Some(value.as_str()))
            }
            other => Err(LockError::InvalidInput(format!(
                "the {backend} backend has plain locks and elections only, not a {} \
                     (semaphores and read/write locks are on the Palisade server)",
                other.shape()
            ))),
        }
    }

    /// Refuses every claim but a plain lock, naming the backend: for the
    /// backends whose recipes are not (yet) Palisade's fenced ones.
    ///
    /// # Errors
    /// [`LockError::InvalidInput`] for a permit, read, write or lead claim.
    pub fn plain_lock_only(&self, backend: &str) -> Result<(), LockError> {
        match self.claim {
            crate::machine::Claim::Lock => Ok(()),
            ref other => Err(LockError::InvalidInput(format!(
                "the {backend} backend has plain locks only, not a {} (semaphores, read/write \
                 locks and elections are on the Palisade server)",
                other.shape()
            ))),
        }
    }
}

/// Why a lock operation failed. Typed, so callers can tell "try later" from
/// "fix your input" from "you are not allowed".
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LockError {
    /// Bad input (name, TTL, URL, option the backend does not support); nothing
    /// changed.
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// The lock is held and the call did not wait.
    #[error("the lock is held by another holder")]
    WouldBlock,
    /// The wait ran out before the lock was granted.
    #[error("the wait ran out before the lock was granted")]
    WaitTimeout,
    /// The session/lease the locks hang on is gone: nothing it held is held.
    #[error("the session expired: its locks are no longer held")]
    SessionExpired,
    /// Granted, but the answer came after the guarantee had run out; the grant
    /// was given back.
    #[error("the grant arrived after the guarantee ran out; it was released")]
    GrantTooLate,
    /// The release named a grant that is no longer the holder's.
    #[error("not the holder: {0}")]
    NotHolder(String),
    /// The backend refused the caller's credentials.
    #[error("unauthenticated: {0}")]
    Unauthenticated(String),
    /// The caller is not allowed this lock.
    #[error("permission denied: {0}")]
    PermissionDenied(String),
    /// A limit of the backend was reached.
    #[error("limit reached: {0}")]
    LimitReached(String),
    /// The backend could not be reached or could not answer in time. The outcome
    /// of a write is unknown.
    #[error("{backend} unavailable: {detail}")]
    Unavailable {
        /// Which backend (`palisade`, `postgres`, …).
        backend: &'static str,
        /// What happened.
        detail: String,
        /// What kind of failure it was, where the client can tell.
        why: Unreachable,
    },
}

/// Why a backend could not be reached, as far as its client can tell: what a
/// command's hint is chosen by, not its words.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Unreachable {
    /// The client cannot tell (or the backend's client does not say).
    #[default]
    Unknown,
    /// Every server tried refused the connection: nothing listens there.
    Refused,
    /// Servers answered, but none leads yet.
    NoLeader,
    /// Nothing answered in time.
    TimedOut,
}

impl LockError {
    /// Whether the same call may succeed later.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            LockError::WouldBlock
                | LockError::WaitTimeout
                | LockError::GrantTooLate
                | LockError::Unavailable { .. }
        )
    }
}

/// A correctness-lock service: one session (or lease) of one client on one
/// backend, on which locks are acquired.
pub trait FencedLocks: Send + Sync {
    /// The backend's name, as in its URL scheme (`palisade`, …).
    fn backend(&self) -> &'static str;

    /// Acquires `name`, waiting up to `options.wait`.
    fn acquire<'a>(
        &'a self,
        name: &'a str,
        options: &'a LockOptions,
    ) -> BoxFuture<'a, Result<Box<dyn FencedLease>, LockError>>;

    /// Ends the session: every lock it holds is released.
    fn close(self: Box<Self>) -> BoxFuture<'static, Result<(), LockError>>;
}

/// One granted correctness lock. Dropping it releases the lock in the background
/// (best effort); [`FencedLease::release`] says whether that worked.
pub trait FencedLease: Send + Sync + fmt::Debug {
    /// The lock's name.
    fn name(&self) -> &str;
    /// The grant's fencing token: higher than every earlier grant's of this lock.
    fn token(&self) -> FencingToken;
    /// A semaphore permit's slot (`0` for every other grant): a resource fenced
    /// per permit keys its fence by `(name, slot)`.
    fn slot(&self) -> u32 {
        0
    }
    /// How long the hold is still guaranteed (zero once lost).
    fn remaining(&self) -> Duration;
    /// Until when the hold is guaranteed, on this process's monotonic clock.
    fn guaranteed_until(&self) -> Instant;
    /// Held, jeopardy (renewal overdue, still guaranteed) or lost.
    fn state(&self) -> LeaseState;
    /// Completes when the guarantee runs out. Owns what it needs.
    fn lost(&self) -> BoxFuture<'static, ()>;
    /// Releases the lock.
    fn release(self: Box<Self>) -> BoxFuture<'static, Result<(), LockError>>;
}

/// A grant whose guarantee is a [`Guarantee`](crate::guarantee::Guarantee)
/// its session keeps: a backend implements these four and has
/// [`FencedLease`] (the guarantee answers `remaining`, `guaranteed_until`,
/// `state` and `lost`), so no backend forwards them by hand.
pub trait GuaranteedLease: Send + Sync + fmt::Debug {
    /// The lock's name.
    fn lock_name(&self) -> &str;
    /// The grant's fencing token.
    fn fencing_token(&self) -> FencingToken;
    /// The guarantee of the session that holds it.
    fn guarantee(&self) -> &crate::guarantee::Guarantee;
    /// Releases the lock.
    fn release_boxed(self: Box<Self>) -> BoxFuture<'static, Result<(), LockError>>;
}

impl<T: GuaranteedLease> FencedLease for T {
    fn name(&self) -> &str {
        self.lock_name()
    }
    fn token(&self) -> FencingToken {
        self.fencing_token()
    }
    fn remaining(&self) -> Duration {
        self.guarantee().remaining()
    }
    fn guaranteed_until(&self) -> Instant {
        self.guarantee().until()
    }
    fn state(&self) -> LeaseState {
        self.guarantee().state()
    }
    fn lost(&self) -> BoxFuture<'static, ()> {
        self.guarantee().lost()
    }
    fn release(self: Box<Self>) -> BoxFuture<'static, Result<(), LockError>> {
        self.release_boxed()
    }
}

/// One granted efficiency lock: the same shape as [`FencedLease`] without a
/// token. Its safety depends on bounded pauses, delays and clock drift.
pub trait EfficiencyLease: Send + Sync + fmt::Debug {
    /// The lock's name.
    fn name(&self) -> &str;
    /// How long the hold is still valid by the backend's algorithm (zero once
    /// lost).
    fn remaining(&self) -> Duration;
    /// Until when, on this process's monotonic clock.
    fn guaranteed_until(&self) -> Instant;
    /// Held, jeopardy or lost.
    fn state(&self) -> LeaseState;
    /// Completes when the validity runs out.
    fn lost(&self) -> BoxFuture<'static, ()>;
    /// Releases the lock.
    fn release(self: Box<Self>) -> BoxFuture<'static, Result<(), LockError>>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_transient_failures_are_retryable() {
        assert!(
            LockError::Unavailable {
                backend: "palisade",
                detail: "x".into(),
                why: Unreachable::Unknown,
            }
            .is_retryable()
        );
        assert!(LockError::WouldBlock.is_retryable());
        for permanent in [
            LockError::InvalidInput("x".into()),
            LockError::Unauthenticated("x".into()),
            LockError::PermissionDenied("x".into()),
            LockError::SessionExpired,
        ] {
            assert!(!permanent.is_retryable(), "{permanent:?}");
        }
    }

    /// The traits stay object-safe: a backend is chosen at run time.
    #[test]
    fn the_traits_are_object_safe() {
        fn takes(_: Option<&dyn FencedLocks>, _: Option<&dyn FencedLease>) {}
        fn takes_efficiency(_: Option<&dyn EfficiencyLease>) {}
        takes(None, None);
        takes_efficiency(None);
    }
}
