"""What the read calls return: locks, token checks, the cluster's status.

The wire sends numbers that grow without bound (session ids, tokens, indices,
terms, node ids) as decimal strings; here they are ``int``.
"""

from __future__ import annotations

from dataclasses import dataclass
import re
from typing import Any, List, Mapping, Optional, Tuple

from .errors import ProtocolError

__all__ = ["LockInfo", "Holder", "Leader", "TokenCheck", "Member", "Status"]

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


def _small(value: Any, what: str) -> int:
    """A small wire number (a slot, a semaphore's size): a JSON integer."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    raise ProtocolError(f"{what} is not a number: {value!r}")


@dataclass(frozen=True)
class Holder:
    """One holder of a lock: its session (and that session's label), the
    token of its grant; ``shared`` for a reader or a semaphore permit (beside
    others), ``slot`` a permit's slot (0 otherwise), ``value`` an election
    leader's value (``""`` otherwise)."""

    session: int
    label: str
    token: int
    shared: bool = False
    slot: int = 0
    value: str = ""

    @classmethod
    def from_json(cls, h: Mapping[str, Any]) -> "Holder":
        """Builds it from an entry of the wire's ``holders``."""
        if not isinstance(h, Mapping):
            raise ProtocolError(f"not a holder: {h!r}")
        return cls(
            session=_int(h.get("session"), "holder session"),
            label=str(h.get("label") or ""),
            token=_int(h.get("token"), "holder token"),
            shared=bool(h.get("shared", False)),
            slot=_small(h.get("slot", 0), "slot"),
            value=str(h.get("value") or ""),
        )


@dataclass(frozen=True)
class LockInfo:
    """One lock as the leader sees it.

    ``holder`` (a session id) and ``token`` are ``None`` while the lock only has
    waiters or is in lock-delay; ``waiters`` is the FIFO queue of session ids.

    ``shape`` is ``"mutex"`` (a plain lock), ``"semaphore"``, ``"read_write"``
    or ``"election"`` (docs/recipes.md); ``permits`` a semaphore's size (0 for
    the other shapes); ``holders`` every holder in grant order — of a recipe
    as the server lists them, of a plain lock its one holder (if held), as the
    Rust client does. Of several holders, ``holder`` and ``token`` are the
    newest's.
    """

    name: str
    holder: Optional[int]
    holder_label: str
    token: Optional[int]
    waiters: Tuple[int, ...]
    in_lock_delay: bool
    shape: str = "mutex"
    permits: int = 0
    holders: Tuple[Holder, ...] = ()

    @classmethod
    def from_json(cls, lock: Mapping[str, Any]) -> "LockInfo":
        """Builds it from the wire's ``LOCK`` object."""
        holder = _opt_int(lock.get("holder"), "holder")
        holder_label = str(lock.get("holder_label") or "")
        token = _opt_int(lock.get("token"), "token")
        listed = lock.get("holders")
        if listed is not None:
            if not isinstance(listed, list):
                raise ProtocolError(f"holders is not a list: {listed!r}")
            holders = tuple(Holder.from_json(h) for h in listed)
        elif holder is not None and token is not None:
            # A plain lock (or a server from before the recipes): its one
            # holder is it.
            holders = (Holder(session=holder, label=holder_label, token=token),)
        else:
            holders = ()
        return cls(
            name=str(lock["name"]),
            holder=holder,
            holder_label=holder_label,
            token=token,
            waiters=tuple(_int(w, "waiter") for w in lock.get("waiters") or ()),
            in_lock_delay=bool(lock.get("in_lock_delay", False)),
            shape=str(lock.get("shape") or "mutex"),
            permits=_small(lock.get("permits", 0), "permits"),
            holders=holders,
        )

    def leader(self) -> "Optional[Leader]":
        """The election's leader as this view shows it; ``None`` when nobody
        leads (or the name is not an election)."""
        if self.shape != "election" or not self.holders:
            return None
        h = self.holders[-1]
        return Leader(name=self.name, session=h.session, label=h.label, token=h.token, value=h.value)


@dataclass(frozen=True)
class Leader:
    """The leader of an election: its session (and label), the token of its
    leadership, and the value it campaigned with or last proclaimed."""

    name: str
    session: int
    label: str
    token: int
    value: str


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
