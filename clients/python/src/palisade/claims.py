"""What an acquire claims on a name: a plain lock (the default, ``claim=None``)
or one of the server's recipes (docs/recipes.md).

>>> client.acquire("pool", claim=Permit(3))              # doctest: +SKIP
>>> client.acquire("doc", claim=Read())                  # doctest: +SKIP
>>> client.acquire("doc", claim=Write(), wait=30)        # doctest: +SKIP
>>> client.acquire("primary", claim=Lead("10.0.0.7:5432"), wait=3600)  # doctest: +SKIP

A name's *shape* (mutex, semaphore of N, read/write lock, election) is fixed
by the first claim on it and kept while anyone holds or waits for it; a claim
of another shape is refused with :class:`~palisade.WrongShape`. As the Rust
client's ``Claim::Lock | Permit { permits } | Read | Write | Lead { value }``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Optional, Union

from .errors import InvalidInput

__all__ = ["Claim", "Permit", "Read", "Write", "Lead"]


@dataclass(frozen=True)
class Permit:
    """One of ``permits`` permits of a counting semaphore: up to ``permits``
    holders at once, each in a slot ``0..permits`` (:attr:`Lease.slot`). A
    slot's next grant has a larger token than its last, so a resource fences
    by ``(name, slot)``. Every claim on the name must give the same
    ``permits``. No lock-delay (a shared claim)."""

    permits: int

    def __post_init__(self) -> None:
        # Only what cannot be sent at all is refused here; the server judges
        # the range (1 to 10,000).
        if not isinstance(self.permits, int) or isinstance(self.permits, bool):
            raise InvalidInput(f"permits must be an int, not {self.permits!r}")


@dataclass(frozen=True)
class Read:
    """A reader of a read/write lock: readers hold beside each other, never
    beside a writer. FIFO: a reader behind a waiting writer waits too. No
    lock-delay (a shared claim)."""


@dataclass(frozen=True)
class Write:
    """The writer of a read/write lock: alone, with a token above every
    earlier grant of the name (readers' included)."""


@dataclass(frozen=True)
class Lead:
    """Leadership of an election, with a ``value`` observers see (an address,
    say; at most 1024 bytes). The leader changes it with
    :meth:`Lease.proclaim`. Every new leader's token is above the last."""

    value: str

    def __post_init__(self) -> None:
        if not isinstance(self.value, str):
            raise InvalidInput(f"an election value is a str, not {self.value!r}")


#: A recipe's claim; ``None`` (where a claim is optional) is a plain lock.
Claim = Union[Permit, Read, Write, Lead]


def wire_fields(claim: Optional[Claim]) -> Dict[str, Any]:
    """The acquire body's fields for ``claim`` (none for a plain lock, whose
    request stays what it always was)."""
    if claim is None:
        return {}
    if isinstance(claim, Permit):
        return {"claim": "permit", "permits": claim.permits}
    if isinstance(claim, Read):
        return {"claim": "read"}
    if isinstance(claim, Write):
        return {"claim": "write"}
    if isinstance(claim, Lead):
        return {"claim": "lead", "value": claim.value}
    raise InvalidInput(f"claim must be Permit(n), Read(), Write(), Lead(value) or None, not {claim!r}")
