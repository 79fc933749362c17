"""Palisade's Python client: distributed locks with fencing tokens.

>>> import palisade
>>> client = palisade.Client(["127.0.0.1:7420"])       # doctest: +SKIP
>>> with client.lock("jobs/nightly", ttl=10) as lease:  # doctest: +SKIP
...     print(lease.token)

Recipes (docs/recipes.md) are claims of an acquire:

>>> permit = client.acquire("pool", claim=palisade.Permit(3), wait=30)    # doctest: +SKIP
>>> permit.slot                                                         # doctest: +SKIP
>>> leader = client.campaign("primary", "10.0.0.7:5432", wait=3600)      # doctest: +SKIP
>>> leader.proclaim("10.0.0.7:6432")                                    # doctest: +SKIP

It speaks the nodes' HTTP/JSON API (docs/http.md) with the standard library
only. See the README for the lease guarantee and what ``Lease.lost`` means.
"""

from .claims import Claim, Lead, Permit, Read, Write
from .client import FENCING_TOKEN_HEADER, Client, Lease
from .errors import (
    Cancelled,
    GrantTooLate,
    InvalidInput,
    LeaseLost,
    LimitReached,
    NotHolder,
    NotLeader,
    PalisadeError,
    PermissionDenied,
    ProtocolError,
    SessionExpired,
    StaleToken,
    Unauthenticated,
    Unavailable,
    UnknownSession,
    WaitTimeout,
    WouldBlock,
    WrongShape,
)
from .models import Holder, Leader, LockInfo, Member, Status, TokenCheck

__version__ = "0.1.0"

__all__ = [
    "Client",
    "Lease",
    "FENCING_TOKEN_HEADER",
    "Claim",
    "Permit",
    "Read",
    "Write",
    "Lead",
    "LockInfo",
    "Holder",
    "Leader",
    "Member",
    "Status",
    "TokenCheck",
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
