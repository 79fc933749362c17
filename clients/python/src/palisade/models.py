"""What the read calls return: locks, token checks, the cluster's status.

The wire sends numbers that grow without bound (session ids, tokens, indices,
terms, node ids) as decimal strings; here they are ``int``.
"""

from __future__ import annotations

from dataclasses import dataclass
import re
from typing import Any, List, Mapping, Optional, Tuple

from .errors import ProtocolError

__all__ = ["LockInfo", "TokenCheck", "Member", "Status"]

_DECIMAL = re.compile(r"[1-9][0-9]*")


def _int(value: Any, what: str) -> int:
    """A number of the wire: a decimal string spelled one way (digits only, no
    sign, spaces or leading zeros) or a JSON integer; anything else is a
    protocol error, never a guess (``int(" 5")`` would take it)."""
    if isinstance(value, str) and (value == "0" or _DECIMAL.fullmatch(value)):
        return int(value)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    raise ProtocolError(f"{what} is not a number: {value!r}")


def _opt_int(value: Any, what: str) -> Optional[int]:
    return None if value is None else _int(value, what)


@dataclass(frozen=True)
class LockInfo:
    """One lock as the leader sees it.

    ``holder`` (a session id) and ``token`` are ``None`` while the lock only has
    waiters or is in lock-delay; ``waiters`` is the FIFO queue of session ids.
    """

    name: str
    holder: Optional[int]
    holder_label: str
    token: Optional[int]
    waiters: Tuple[int, ...]
    in_lock_delay: bool

    @classmethod
    def from_json(cls, lock: Mapping[str, Any]) -> "LockInfo":
        """Builds it from the wire's ``LOCK`` object."""
        return cls(
            name=str(lock["name"]),
            holder=_opt_int(lock.get("holder"), "holder"),
            holder_label=str(lock.get("holder_label") or ""),
            token=_opt_int(lock.get("token"), "token"),
            waiters=tuple(_int(w, "waiter") for w in lock.get("waiters") or ()),
            in_lock_delay=bool(lock.get("in_lock_delay", False)),
        )


@dataclass(frozen=True)
class TokenCheck:
    """The answer of :meth:`palisade.Client.check_token`: whether the token is
    still the current holder's, and the current token (``None`` when not held).
    A weaker check than the resource storing the token: the holder can lose the
    lock right after."""

    current: bool
    current_token: Optional[int]

    def __bool__(self) -> bool:
        return self.current


@dataclass(frozen=True)
class Member:
    """A member or learner of the cluster: its id, client and peer addresses."""

    id: int
    addr: str
    peer_addr: str

    @classmethod
    def from_json(cls, m: Mapping[str, Any]) -> "Member":
        """Builds it from the wire's member object."""
        return cls(id=_int(m["id"], "member id"), addr=str(m["addr"]), peer_addr=str(m["peer_addr"]))


@dataclass(frozen=True)
class Status:
    """One node's view of the cluster (``GET /v1/status``). ``leader`` is the
    leader's node id, ``None`` while none is known."""

    id: int
    leader: Optional[int]
    term: int
    state: str
    commit_index: int
    last_applied: int
    members: List[Member]
    learners: List[Member]
    snapshot_index: int
    snapshot_bytes: int
    commit_p50_us: int
    commit_p99_us: int

    @classmethod
    def from_json(cls, s: Mapping[str, Any]) -> "Status":
        """Builds it from the wire's status object."""
        return cls(
            id=_int(s["id"], "id"),
            leader=_opt_int(s.get("leader"), "leader"),
            term=_int(s["term"], "term"),
            state=str(s["state"]),
            commit_index=_int(s["commit_index"], "commit_index"),
            last_applied=_int(s["last_applied"], "last_applied"),
            members=[Member.from_json(m) for m in s.get("members") or ()],
            learners=[Member.from_json(m) for m in s.get("learners") or ()],
            snapshot_index=_int(s.get("snapshot_index", 0), "snapshot_index"),
            snapshot_bytes=_int(s.get("snapshot_bytes", 0), "snapshot_bytes"),
            commit_p50_us=_int(s.get("commit_p50_us", 0), "commit_p50_us"),
            commit_p99_us=_int(s.get("commit_p99_us", 0), "commit_p99_us"),
        )

    def leader_addr(self) -> Optional[str]:
        """The leader's client address, if it is a known member."""
        for m in self.members:
            if m.id == self.leader:
                return m.addr
        return None
