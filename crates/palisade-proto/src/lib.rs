//! Palisade's wire types and gRPC stubs, package `palisade.v1`, generated at build
//! time from `proto/palisade/v1/palisade.proto` (by protox: no system `protoc`).
//!
//! Both the client and the server depend on this crate; it depends on neither.

#![allow(missing_docs)]
#![allow(clippy::all)]

pub mod h2_channel;

/// Version 1 of the protocol.
pub mod v1 {
    tonic::include_proto!("palisade.v1");
}

/// The metadata key that carries a machine-readable error code on a gRPC status.
pub const ERROR_KEY: &str = "palisade-error";
/// The metadata key that carries the leader's `HOST:PORT` on a NOT_LEADER status.
pub const LEADER_KEY: &str = "palisade-leader";
/// On a STALE_TOKEN status: the token the request presented (decimal).
pub const PRESENTED_TOKEN_KEY: &str = "palisade-presented-token";
/// On a STALE_TOKEN status: the token of the lock's current grant (decimal).
pub const CURRENT_TOKEN_KEY: &str = "palisade-current-token";
/// On an UNAUTHENTICATED status answering a call on a session: the session id
/// the call named (decimal). The one answer for "no such session" and "wrong
/// key", so a session id reveals nothing; a client that knows its key is right
/// reads it as "the session is gone".
pub const SESSION_KEY: &str = "palisade-session";

/// The machine-readable error codes carried under [`ERROR_KEY`]. Stable: clients
/// match on them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    /// This node is not the leader; the leader's address is under [`LEADER_KEY`]
    /// when known.
    NotLeader,
    /// The request is malformed or out of bounds (name, TTL, lock-delay, …).
    InvalidInput,
    /// The session does not exist (never did, closed, or expired).
    UnknownSession,
    /// The session does not hold the lock.
    NotHolder,
    /// The token presented is not the current holder's.
    StaleToken,
    /// The lock is held and the request did not wait.
    WouldBlock,
    /// The wait ran out before the lock was granted.
    WaitTimeout,
    /// A limit was reached (sessions, waiters, locks per session).
    LimitReached,
    /// The cluster could not answer (no quorum, shutting down, storage failure).
    Unavailable,
    /// The caller did not prove who it is: no or unknown credentials, a bearer
    /// token over plaintext, a node certificate on the client port, or a session
    /// key that does not match.
    Unauthenticated,
    /// The caller is known but its roles do not allow this call on this name.
    PermissionDenied,
    /// The waiting acquire was cancelled (`CancelAcquire` by its session).
    Cancelled,
    /// The name is another recipe than the call takes it for (a plain lock on
    /// a semaphore, a read lock on a mutex, a semaphore of 3 on one of 5), or
    /// the session holds it in the other mode (a reader asking to write).
    WrongShape,
}

impl ErrorCode {
    /// Every code, for tests and docs.
    pub const ALL: [ErrorCode; 13] = [
        ErrorCode::NotLeader,
        ErrorCode::InvalidInput,
        ErrorCode::UnknownSession,
        ErrorCode::NotHolder,
        ErrorCode::StaleToken,
        ErrorCode::WouldBlock,
        ErrorCode::WaitTimeout,
        ErrorCode::LimitReached,
        ErrorCode::Unavailable,
        ErrorCode::Unauthenticated,
        ErrorCode::PermissionDenied,
        ErrorCode::Cancelled,
        ErrorCode::WrongShape,
    ];

    /// The wire form.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::NotLeader => "not_leader",
            ErrorCode::InvalidInput => "invalid_input",
            ErrorCode::UnknownSession => "unknown_session",
            ErrorCode::NotHolder => "not_holder",
            ErrorCode::StaleToken => "stale_token",
            ErrorCode::WouldBlock => "would_block",
            ErrorCode::WaitTimeout => "wait_timeout",
            ErrorCode::LimitReached => "limit_reached",
            ErrorCode::Unavailable => "unavailable",
            ErrorCode::Unauthenticated => "unauthenticated",
            ErrorCode::PermissionDenied => "permission_denied",
            ErrorCode::Cancelled => "cancelled",
            ErrorCode::WrongShape => "wrong_shape",
        }
    }

    /// Parses the wire form.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.as_str() == s)
    }

    /// Builds a gRPC status carrying this code.
    pub fn status(self, message: impl Into<String>) -> tonic::Status {
        let grpc = match self {
            ErrorCode::NotLeader | ErrorCode::Unavailable => tonic::Code::Unavailable,
            ErrorCode::InvalidInput => tonic::Code::InvalidArgument,
            ErrorCode::UnknownSession => tonic::Code::NotFound,
            ErrorCode::NotHolder | ErrorCode::StaleToken | ErrorCode::WrongShape => {
                tonic::Code::FailedPrecondition
            }
            ErrorCode::WouldBlock => tonic::Code::Aborted,
            ErrorCode::WaitTimeout => tonic::Code::DeadlineExceeded,
            ErrorCode::LimitReached => tonic::Code::ResourceExhausted,
            ErrorCode::Unauthenticated => tonic::Code::Unauthenticated,
            ErrorCode::PermissionDenied => tonic::Code::PermissionDenied,
            ErrorCode::Cancelled => tonic::Code::Cancelled,
        };
        let mut status = tonic::Status::new(grpc, message);
        status.metadata_mut().insert(
            ERROR_KEY,
            tonic::metadata::MetadataValue::from_static(self.as_str()),
        );
        status
    }

    /// The code a status carries, if it is one of Palisade's.
    pub fn of(status: &tonic::Status) -> Option<Self> {
        status
            .metadata()
            .get(ERROR_KEY)
            .and_then(|v| v.to_str().ok())
            .and_then(Self::parse)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_through_a_status() {
        for code in ErrorCode::ALL {
            assert_eq!(ErrorCode::parse(code.as_str()), Some(code));
            assert_eq!(ErrorCode::of(&code.status("x")), Some(code));
        }
        assert_eq!(ErrorCode::of(&tonic::Status::internal("x")), None);
    }
}
