//! The client's one error type.

use palisade_core::{FencingToken, Unreachable};
use palisade_proto::ErrorCode;

/// What can go wrong talking to a Palisade cluster.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ClientError {
    /// The request is malformed or out of bounds; nothing changed.
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// The lock is held and the request did not wait.
    #[error("the lock is held by another session")]
    WouldBlock,
    /// The wait ran out before the lock was granted.
    #[error("the wait ran out before the lock was granted")]
    WaitTimeout,
    /// The session is gone (expired or closed): its locks are no longer held.
    #[error("the session expired: its locks are no longer held")]
    SessionExpired,
    /// The lock was granted, but the answer arrived after the session's guarantee
    /// had run out (this process paused, or the network held the reply), so the
    /// grant could already be superseded. It has been released; try again.
    #[error("the grant arrived after the session's guarantee ran out; it was released")]
    GrantTooLate,
    /// The session does not hold the lock (e.g. it was released already).
    #[error("not the holder: {0}")]
    NotHolder(String),
    /// The token does not name the lock's current grant (a release with a token
    /// that a later grant superseded). The tokens are `None` only from a server
    /// that does not send them.
    #[error("stale token: {detail}")]
    StaleToken {
        /// The token the request presented.
        presented: Option<FencingToken>,
        /// The token of the lock's current grant.
        current: Option<FencingToken>,
        /// The server's words.
        detail: String,
    },
    /// A server limit was reached.
    #[error("limit reached: {0}")]
    LimitReached(String),
    /// The server did not accept this client's credentials (certificate, bearer
    /// token or session key). Retrying with the same ones cannot help.
    #[error("unauthenticated: {0}")]
    Unauthenticated(String),
    /// The caller's roles do not allow this call on this lock name.
    #[error("permission denied: {0}")]
    PermissionDenied(String),
    /// No leader answered in time. The outcome of a write is unknown.
    #[error("cluster unavailable: {detail}")]
    Unavailable {
        /// What each node did, in words.
        detail: String,
        /// What kind of failure it was (nothing listening, no leader yet,
        /// no answer in time), for a caller to act on without reading words.
        why: Unreachable,
    },
    /// The waiting acquire was cancelled (`cancel_acquire` of this session);
    /// nothing was granted.
    #[error("the wait was cancelled")]
    Cancelled,
    /// The name is another recipe than the call takes it for (a plain lock on
    /// a semaphore, a semaphore of 3 on one of 5), or the session holds it in
    /// the other mode; nothing changed.
    #[error("wrong shape: {0}")]
    WrongShape(String),
    /// The server answered something this client does not understand.
    #[error("protocol error: {0}")]
    Protocol(String),
}

impl ClientError {
    /// Whether the same call may succeed later.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            ClientError::WouldBlock
                | ClientError::WaitTimeout
                | ClientError::GrantTooLate
                | ClientError::Unavailable { .. }
        )
    }

    /// Maps a status that is not a redirect to an error.
    pub(crate) fn from_status(status: &tonic::Status) -> Self {
        let msg = status.message().to_owned();
        match ErrorCode::of(status) {
            Some(ErrorCode::InvalidInput) => ClientError::InvalidInput(msg),
            Some(ErrorCode::WouldBlock) => ClientError::WouldBlock,
            Some(ErrorCode::WaitTimeout) => ClientError::WaitTimeout,
            Some(ErrorCode::UnknownSession) => ClientError::SessionExpired,
            Some(ErrorCode::NotHolder) => ClientError::NotHolder(msg),
            Some(ErrorCode::StaleToken) => {
                let token = |key| {
                    status
                        .metadata()
                        .get(key)
                        .and_then(|v| v.to_str().ok())
                        .and_then(|v| v.parse::<u64>().ok())
                        .and_then(FencingToken::new)
                };
                ClientError::StaleToken {
                    presented: token(palisade_proto::PRESENTED_TOKEN_KEY),
                    current: token(palisade_proto::CURRENT_TOKEN_KEY),
                    detail: msg,
                }
            }
            Some(ErrorCode::LimitReached) => ClientError::LimitReached(msg),
            // The server's one answer for "no such session" and "wrong key":
            // this client's key is right, so its session is gone.
            Some(ErrorCode::Unauthenticated)
                if status.metadata().contains_key(palisade_proto::SESSION_KEY) =>
            {
                ClientError::SessionExpired
            }
            Some(ErrorCode::Unauthenticated) => ClientError::Unauthenticated(msg),
            Some(ErrorCode::PermissionDenied) => ClientError::PermissionDenied(msg),
            Some(ErrorCode::Cancelled) => ClientError::Cancelled,
            Some(ErrorCode::WrongShape) => ClientError::WrongShape(msg),
            Some(ErrorCode::NotLeader | ErrorCode::Unavailable) | None => {
                ClientError::Unavailable {
                    detail: format!("{}: {msg}", status.code()),
                    why: Unreachable::Unknown,
                }
            }
        }
    }
}

/// The backend-neutral error of the lock traits ([`palisade_core::lock`]).
impl From<ClientError> for palisade_core::LockError {
    fn from(e: ClientError) -> Self {
        use palisade_core::LockError as L;
        match e {
            ClientError::InvalidInput(m) | ClientError::WrongShape(m) => L::InvalidInput(m),
            ClientError::WouldBlock => L::WouldBlock,
            // A cancelled wait ended ungranted, as one that ran out does.
            ClientError::WaitTimeout | ClientError::Cancelled => L::WaitTimeout,
            ClientError::SessionExpired => L::SessionExpired,
            ClientError::GrantTooLate => L::GrantTooLate,
            ClientError::NotHolder(m) | ClientError::StaleToken { detail: m, .. } => {
                L::NotHolder(m)
            }
            ClientError::LimitReached(m) => L::LimitReached(m),
            ClientError::Unauthenticated(m) => L::Unauthenticated(m),
            ClientError::PermissionDenied(m) => L::PermissionDenied(m),
            ClientError::Unavailable { detail, why } => L::Unavailable {
                backend: "palisade",
                detail,
                why,
            },
            ClientError::Protocol(detail) => L::Unavailable {
                backend: "palisade",
                detail,
                why: Unreachable::Unknown,
            },
        }
    }
}
