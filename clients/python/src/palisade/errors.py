"""The exceptions of the Palisade client.

Every refusal of the server carries a wire code (docs/http.md, "Errors"); each
code has one subclass of :class:`PalisadeError` here, so callers can catch the
case they handle. :class:`SessionExpired`, :class:`GrantTooLate`,
:class:`LeaseLost` and :class:`ProtocolError` are decided by the client itself.
"""

from __future__ import annotations

import re
from typing import Any, Dict, Mapping, Optional, Type

__all__ = [
    "PalisadeError",
    "NotLeader",
    "InvalidInput",
    "UnknownSession",
    "NotHolder",
    "StaleToken",
    "WouldBlock",
    "WaitTimeout",
    "LimitReached",
    "Unavailable",
    "Unauthenticated",
    "PermissionDenied",
    "Cancelled",
    "WrongShape",
    "SessionExpired",
    "GrantTooLate",
    "LeaseLost",
    "ProtocolError",
]


class PalisadeError(Exception):
    """Base of every error of this package.

    ``code`` is the server's wire code (``"stale_token"``, ``"would_block"``, …)
    or, for errors the client decides, a code of the same style
    (``"session_expired"``, ``"grant_too_late"``, ``"lease_lost"``,
    ``"protocol"``). ``message`` is the human-readable explanation.
    """

    #: The wire code of this class; instances may carry another (unknown codes).
    code: str = "error"

    def __init__(self, message: str = "", *, code: Optional[str] = None) -> None:
        super().__init__(message or self.__class__.__doc__ or self.code)
        self.message: str = message
        if code is not None:
            self.code = code

    def __str__(self) -> str:
        return f"{self.code}: {self.message}" if self.message else self.code


class NotLeader(PalisadeError):
    """The node is not the leader. The client follows ``leader`` by itself, so
    this is seen only from a cluster that never settles (it ends as
    :class:`Unavailable`)."""

    code = "not_leader"

    def __init__(
        self, message: str = "", *, code: Optional[str] = None, leader: Optional[str] = None
    ) -> None:
        super().__init__(message, code=code)
        #: The leader's client address, ``None`` during an election.
        self.leader: Optional[str] = leader


class InvalidInput(PalisadeError):
    """The request was malformed or out of bounds (a bad name, TTL, wait, token
    or key; an unknown field). Nothing changed."""

    code = "invalid_input"


class UnknownSession(PalisadeError):
    """The server does not know the session (never did, closed, or expired):
    its locks are no longer held."""

    code = "unknown_session"


class NotHolder(PalisadeError):
    """The session does not hold (or wait for) the lock. Nothing changed."""

    code = "not_holder"


class StaleToken(PalisadeError):
    """The token is not the lock's current grant. Nothing changed.

    ``current_token`` is the current holder's token (``None`` when not held),
    ``presented_token`` the one the request carried.
    """

    code = "stale_token"

    def __init__(
        self,
        message: str = "",
        *,
        code: Optional[str] = None,
        current_token: Optional[int] = None,
        presented_token: Optional[int] = None,
    ) -> None:
        super().__init__(message, code=code)
        self.current_token: Optional[int] = current_token
        self.presented_token: Optional[int] = presented_token


class WouldBlock(PalisadeError):
    """The lock is held by another session and the call did not wait."""

    code = "would_block"


class WaitTimeout(PalisadeError):
    """The wait ran out before the lock was granted."""

    code = "wait_timeout"


class LimitReached(PalisadeError):
    """A server limit was reached (sessions, waiters, locks, calls in flight)."""

    code = "limit_reached"


class Unavailable(PalisadeError):
    """No leader answered within ``retry_for``. The outcome of a write is
    unknown (an acquire is then cancelled in the background)."""

    code = "unavailable"


class Unauthenticated(PalisadeError):
    """No, bad or misplaced credentials, or a session key that does not match.
    Retrying with the same credentials cannot help."""

    code = "unauthenticated"


class PermissionDenied(PalisadeError):
    """The caller's roles do not cover this call on this name."""

    code = "permission_denied"


class Cancelled(PalisadeError):
    """The waiting acquire was cancelled by ``/v1/locks/cancel`` of the same
    session; nothing was granted."""

    code = "cancelled"


class WrongShape(PalisadeError):
    """The name is another recipe than the call takes it for (a plain lock on a
    semaphore, a read lock on a mutex), or the session holds it in the other
    mode; nothing changed."""

    code = "wrong_shape"


class SessionExpired(PalisadeError):
    """Client-side: the session's guarantee ran out (or the session is known to
    be gone) before or during the call, so nothing can be held on it."""

    code = "session_expired"


class GrantTooLate(PalisadeError):
    """Client-side: the lock was granted, but the answer arrived after the
    session's guarantee had run out (this process paused, or the network held
    the reply), so the grant may already be superseded. It has been released;
    try again."""

    code = "grant_too_late"


class LeaseLost(PalisadeError):
    """Client-side: the lease was lost while the ``with`` block ran. Whatever
    the block did after ``lost`` was set was not protected by the lock (only the
    fencing token, checked by the resource, makes it harmless)."""

    code = "lease_lost"


class ProtocolError(PalisadeError):
    """Client-side: the server answered something this client does not
    understand (not the JSON of docs/http.md)."""

    code = "protocol"


_DECIMAL = re.compile(r"[1-9][0-9]*")

_BY_CODE: Dict[str, Type[PalisadeError]] = {
    cls.code: cls
    for cls in (
        NotLeader,
        InvalidInput,
        UnknownSession,
        NotHolder,
        StaleToken,
        WouldBlock,
        WaitTimeout,
        LimitReached,
        Unavailable,
        Unauthenticated,
        PermissionDenied,
        Cancelled,
        WrongShape,
    )
}


def _token(value: Any) -> Optional[int]:
    """A token field of an error body (a decimal string: digits only, no sign,
    spaces or leading zeros), ``None`` if absent or not spelled so."""
    if isinstance(value, str) and (value == "0" or _DECIMAL.fullmatch(value)):
        return int(value)
    return None


def from_wire(error: Mapping[str, Any]) -> PalisadeError:
    """The exception for the ``error`` object of a refusal; an unknown code
    becomes a plain :class:`PalisadeError` carrying it."""
    code = str(error.get("code", "error"))
    message = str(error.get("message", ""))
    if code == "stale_token":
        return StaleToken(
            message,
            current_token=_token(error.get("current_token")),
            presented_token=_token(error.get("presented_token")),
        )
    if code == "unauthenticated" and error.get("session_id") is not None:
        # The server's one answer for "no such session" and "wrong key" (so
        # that session ids reveal nothing): this client's key is right, so
        # its session is gone.
        return UnknownSession(message)
    if code == "not_leader":
        leader = error.get("leader")
        return NotLeader(message, leader=str(leader) if leader else None)
    cls = _BY_CODE.get(code)
    if cls is None:
        return PalisadeError(message, code=code)
    return cls(message)
