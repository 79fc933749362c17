"""The client: sessions kept alive in the background, and leases on them.

How sessions map to locks
-------------------------
A lease lives on a server session. The client opens sessions on demand, one
pool per distinct TTL, and reuses them: an acquire takes the first live session
of its TTL that has nothing to do with that lock name (no lease on it, no
acquire, cancel or release of it in flight), and opens a new one only if there
is none. So a program that holds many locks with one TTL has one session and
one keep-alive thread, while two threads of one program that want the *same*
lock use two sessions and exclude each other through the server's FIFO queue,
exactly like two processes. (On one session, an acquire of a name it already
holds returns the same grant — the server's rule that makes retries safe —
which would let both threads in.)

Each session has a keep-alive thread and a watchdog thread. When a session is
lost (its guarantee ran out, the server says ``unknown_session``, or the client
is closed) every lease on it is lost, the session is never used again, and a
session whose guarantee merely ran out is closed in the background so that its
locks go free at once rather than after the TTL.

Recipes
-------
An acquire claims a plain lock by default, or, with ``claim=``, a semaphore
permit, a reader's or the writer's share of a read/write lock, or an
election's leadership (:mod:`palisade.claims`, docs/recipes.md). They use the
sessions exactly as plain locks do: two threads of one program taking permits
of one semaphore hold them on two sessions, like two processes.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import threading
import time
import weakref
from types import TracebackType
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Set, Type, Union
from urllib.parse import urlencode

from ._http import Abort, Connector, tls_context
from .claims import Claim, Lead, Permit, Read, wire_fields
from .errors import (
    GrantTooLate,
    InvalidInput,
    LeaseLost,
    NotHolder,
    PalisadeError,
    ProtocolError,
    SessionExpired,
    StaleToken,
    Unavailable,
    UnknownSession,
    WaitTimeout,
    WouldBlock,
    WrongShape,
)
from .models import Leader, LockInfo, Status, TokenCheck, _int

__all__ = ["Client", "Lease", "FENCING_TOKEN_HEADER"]

log = logging.getLogger("palisade")

#: The header fenced HTTP resources (``palisade fence-store``) read the token from.
FENCING_TOKEN_HEADER = "Fencing-Token"

#: Pause between keep-alive attempts after a failure (capped at a quarter TTL).
_RETRY_PAUSE = 0.1


def _ms(seconds: float) -> int:
    return int(round(seconds * 1000))


def _duration(value: float, what: str) -> float:
    """A duration argument, refused locally only when it cannot be sent at all
    (negative, NaN, infinite); the server judges the rest (e.g. a TTL of 0)."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise InvalidInput(f"{what} must be a number of seconds, not {value!r}") from None
    if not math.isfinite(v) or v < 0:
        raise InvalidInput(f"{what} must be a finite number of seconds >= 0, not {value!r}")
    return v


def _thread(target: Callable[[], None], name: str) -> None:
    threading.Thread(target=target, name=name, daemon=True).start()


class _Session:
    """One server session, its guarantee, and the threads that keep it."""

    def __init__(
        self,
        client: "Client",
        session_id: str,
        key: str,
        requested_ttl: float,
        ttl: float,
        margin: float,
        guaranteed_until: float,
    ) -> None:
        # Weak: the background threads must not keep a client its program has
        # dropped alive (its finalizer then closes the sessions).
        self._client = weakref.ref(client)
        self._conn = client._conn
        self.id = session_id
        self.key = key
        self.requested_ttl = requested_ttl
        self.ttl = ttl
        self.margin = margin
        #: Lock names this session is busy with (guarded by ``client._lock``).
        self.busy: Set[str] = set()
        self._cond = threading.Condition()
        # On this process's monotonic clock: the send time of the last
        # acknowledged keep-alive (or of the create) + TTL - margin. Only moves
        # forward, except to "now" when the session is known to be gone.
        self._until = guaranteed_until
        self._dead = False
        # Weak: a lease its program dropped unreleased is collected, and
        # released in the background by Lease.__del__.
        self._leases: "weakref.WeakSet[Lease]" = weakref.WeakSet()
        self._aborts: Set[Abort] = set()  # of acquires in flight on the session
        self._stop = threading.Event()

    def start(self) -> None:
        _thread(self._keep_alive, f"palisade-keepalive-{self.id}")
        _thread(self._watchdog, f"palisade-watchdog-{self.id}")

    def ids(self) -> Dict[str, Any]:
        """What every call on the session presents."""
        return {"session_id": self.id, "session_key": self.key}

    @property
    def dead(self) -> bool:
        with self._cond:
            return self._dead

    def guaranteed_until(self) -> float:
        with self._cond:
            return self._until

    def remaining(self) -> float:
        with self._cond:
            return 0.0 if self._dead else max(0.0, self._until - time.monotonic())

    def alive(self) -> bool:
        return self.remaining() > 0.0

    def adopt(self, lease: "Lease") -> bool:
        """Takes ``lease`` on, unless the guarantee has run out already (then
        the grant came too late to be relied on)."""
        with self._cond:
            if self._dead or self._until <= time.monotonic():
                return False
            self._leases.add(lease)
            return True

    def watch(self, abort: Abort) -> None:
        """Aborts ``abort`` when the session is lost (now, if it is)."""
        with self._cond:
            if not self._dead:
                self._aborts.add(abort)
                return
        abort.abort()

    def unwatch(self, abort: Abort) -> None:
        with self._cond:
            self._aborts.discard(abort)

    def forget(self, lease: "Lease") -> None:
        with self._cond:
            self._leases.discard(lease)

    def _advance(self, until: float) -> None:
        with self._cond:
            if not self._dead and until > self._until:
                self._until = until

    def lose(self, reason: str) -> None:
        """The session can no longer be relied on: every lease on it is lost.
        ``reason``: ``expired`` (the guarantee ran out), ``unknown_session``
        (the server said so), ``abandoned`` (a release or cancel could not be
        confirmed), ``closed`` (by :meth:`Client.close`, which closes it)."""
        with self._cond:
            if self._dead:
                return
            self._dead = True
            self._until = min(self._until, time.monotonic())
            leases, self._leases = list(self._leases), weakref.WeakSet()
            aborts, self._aborts = self._aborts, set()
            self._cond.notify_all()
        self._stop.set()
        for abort in aborts:
            # A long poll on a lost session ends now (SessionExpired), and the
            # server takes the wait out of the queue as the caller went away.
            abort.abort()
        client = self._client()
        if client is not None:
            client._retire(self)
        # A close is the caller's own doing; anything else is news.
        log.log(logging.INFO if reason == "closed" else logging.WARNING, "palisade session %s lost (%s)", self.id, reason)
        for lease in leases:
            lease._mark_lost()
        if reason in ("expired", "abandoned"):
            # Its holders have been told; closing frees the locks for others
            # now instead of after the TTL (if the server still has it).
            _thread(lambda: self.close_on_server(self._conn.retry_for), f"palisade-close-{self.id}")

    def close_on_server(self, budget: float) -> None:
        """Best effort: closing releases every lock of the session at once."""
        try:
            self._conn.simple("POST", "/v1/sessions/close", self.ids(), budget=budget)
        except PalisadeError as e:
            log.debug("closing session %s: %s", self.id, e)

    def _watchdog(self) -> None:
        """Sets ``lost`` the moment the guarantee passes — a timer, so that a
        keep-alive stuck on a silent node does not delay it."""
        with self._cond:
            while not self._dead:
                left = self._until - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            if self._dead:
                return
        self.lose("expired")

    def _keep_alive(self) -> None:
        """A keep-alive every quarter TTL, every 0.1 s after a failure."""
        conn = self._conn
        every = self.ttl / 4
        attempt_timeout = min(conn.rpc_timeout, every)
        pause = every
        while not self._stop.wait(pause):
            sent = time.monotonic()  # the guarantee runs from the send time
            try:
                reply = conn.simple("POST", "/v1/sessions/keepalive", self.ids(), budget=attempt_timeout)
                ttl = min(float(reply["ttl_ms"]) / 1000.0, self.ttl)
            except UnknownSession:
                self.lose("unknown_session")
                return
            except (PalisadeError, KeyError, TypeError, ValueError) as e:
                log.debug("keep-alive of session %s failed: %s; retrying", self.id, e)
                pause = min(_RETRY_PAUSE, every)
                continue
            self._advance(sent + ttl - self.margin)
            pause = every


class Lease:
    """A granted lock: its fencing token, and how long it is still guaranteed.

    Use it as a context manager (leaving the block releases the lock) or call
    :meth:`release`. Pass :attr:`token` to every write on the protected
    resource, which must refuse tokens lower than the highest it has seen:
    that, not :attr:`lost`, is what makes a holder that paused past its lease
    harmless.
    """

    def __init__(
        self,
        client: "Client",
        session: _Session,
        name: str,
        token: int,
        on_lost: Optional[Callable[["Lease"], None]],
        claim: Optional[Claim] = None,
        slot: int = 0,
    ) -> None:
        self._client = client
        self._session = session
        self._name = name
        self._token = token
        self._on_lost = on_lost
        self._claim = claim
        self._slot = slot
        self._mu = threading.Lock()
        self._released = False
        #: Set the moment the lease can no longer be guaranteed (its session's
        #: guarantee ran out, the server no longer knows the session, or the
        #: client was closed). Never set by a release.
        self.lost = threading.Event()

    @property
    def name(self) -> str:
        """The lock name."""
        return self._name

    @property
    def token(self) -> int:
        """The fencing token: the Raft log index of the entry that granted it."""
        return self._token

    @property
    def session_id(self) -> int:
        """The id of the session that holds the lock (shown as ``holder``)."""
        return int(self._session.id)

    @property
    def claim(self) -> Optional[Claim]:
        """What was claimed: ``None`` for a plain lock, else the
        :class:`~palisade.Permit`, :class:`~palisade.Read`,
        :class:`~palisade.Write` or :class:`~palisade.Lead` given to acquire."""
        return self._claim

    @property
    def slot(self) -> int:
        """A semaphore permit's slot, ``0..permits`` (0 for every other
        claim). A slot is held by one holder at a time and its next grant has a
        larger token: fence the resource by ``(name, slot)``."""
        return self._slot

    def fencing_header(self) -> "tuple[str, str]":
        """The token as an HTTP header ``(name, value)`` for a fenced store."""
        return (FENCING_TOKEN_HEADER, str(self._token))

    def remaining(self) -> float:
        """Seconds the lock is still guaranteed, on this process's monotonic
        clock; 0.0 once lost or released."""
        with self._mu:
            if self._released:
                return 0.0
        return 0.0 if self.lost.is_set() else self._session.remaining()

    def guaranteed_until(self) -> float:
        """Until when (a ``time.monotonic()`` value) the lock is guaranteed:
        the send time of the last acknowledged keep-alive + TTL - margin."""
        return self._session.guaranteed_until()

    def _mark_lost(self) -> None:
        with self._mu:
            if self._released or self.lost.is_set():
                return
            self.lost.set()
        if self._on_lost is not None:
            try:
                self._on_lost(self)
            except Exception:  # a callback's bug must not kill the keep-alive
                log.exception("on_lost callback of lock %r raised", self._name)

    def release(self) -> None:
        """Releases the lock; the next waiter is granted it at once.

        Calling it again does nothing. Raises :class:`LeaseLost` if the lease
        was lost before (the lock was freed with its session); :class:`NotHolder`
        or :class:`StaleToken` if it was no longer this lease's (nothing
        changed); :class:`Unavailable` if no leader answered — the release is
        then retried in the background, and if that fails too the session is
        given up so that the lock goes free within its TTL.
        """
        with self._mu:
            if self._released:
                return
            self._released = True
        session, client = self._session, self._client
        session.forget(self)
        if self.lost.is_set() or session.dead:
            # The session is gone or being closed: that frees the lock.
            client._free(session, self._name)
            raise LeaseLost(f"the lease on {self._name!r} (token {self._token}) was lost before its release")
        try:
            client._release(session, self._name, self._token)
        except Unavailable as e:
            client._release_in_background(session, self._name, self._token)
            raise Unavailable(f"{e.message}; the release is retried in the background") from None
        except (NotHolder, StaleToken, UnknownSession) as e:
            client._free(session, self._name)
            if self.lost.is_set() or isinstance(e, UnknownSession):
                raise LeaseLost(f"the lease on {self._name!r} was lost: {e}") from e
            raise
        except BaseException:
            client._free(session, self._name)
            raise
        client._free(session, self._name)

    def proclaim(self, value: str) -> None:
        """As the leader of an election (a grant of :class:`~palisade.Lead`),
        changes the value observers see (``POST /v1/locks/proclaim`` with this
        lease's token). Proclaiming the same value again is harmless, so it is
        retried across leader changes like a release.

        Raises :class:`NotHolder` if this lease was released (refused without
        asking) or its session holds the name no more, :class:`StaleToken` if
        its session holds it under a newer grant, :class:`LeaseLost` if the
        lease was lost, :class:`WrongShape` if the name is no election,
        :class:`InvalidInput` for a value over 1024 bytes, or
        :class:`Unavailable` (the value may or may not have changed).
        """
        if not isinstance(value, str):
            raise InvalidInput(f"an election value is a str, not {value!r}")
        with self._mu:
            released = self._released
        if released:
            raise NotHolder(f"the lease on {self._name!r} (token {self._token}) was released")
        if self.lost.is_set() or self._session.dead:
            raise LeaseLost(f"the lease on {self._name!r} (token {self._token}) was lost before the proclaim")
        try:
            self._client._proclaim(self._session, self._name, self._token, value)
        except UnknownSession as e:
            raise LeaseLost(f"the lease on {self._name!r} was lost: {e}") from e
        except (NotHolder, StaleToken) as e:
            if self.lost.is_set():
                raise LeaseLost(f"the lease on {self._name!r} was lost: {e}") from e
            raise

    def __del__(self) -> None:
        # Dropped without a release (like the Rust guard): released in the
        # background, so that a forgotten lease does not hold the lock for as
        # long as the session lives.
        try:
            if self._released or self.lost.is_set():
                return
            self._released = True
            self._client._release_in_background(self._session, self._name, self._token)
        except Exception:  # attributes missing, or interpreter shutdown
            pass

    def __enter__(self) -> "Lease":
        if self.lost.is_set():
            # Never run a block that starts without a guarantee.
            try:
                self.release()
            except LeaseLost:
                pass
            raise LeaseLost(f"the lease on {self._name!r} was lost before the block started")
        return self

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        if exc_type is None:
            # LeaseLost if the lease was lost while the block ran; a release
            # error otherwise.
            self.release()
            return
        # The block's own exception is what the caller must see: release, but
        # do not replace it.
        try:
            self.release()
        except PalisadeError as e:
            log.debug("release of %r after the block raised: %s", self._name, e)

    def __repr__(self) -> str:
        claim = "" if self._claim is None else f"claim={self._claim!r}, slot={self._slot}, "
        return (
            f"Lease(name={self._name!r}, token={self._token}, session={self._session.id}, {claim}"
            f"remaining={self.remaining():.3f}, lost={self.lost.is_set()})"
        )


class Client:
    """A client of a Palisade cluster.

    ``endpoints``: any nodes, ``HOST:PORT`` (a list, or one comma-separated
    string); the leader is found from there. Nothing is sent before the first
    call; sessions are opened on the first acquire (see the module docs).

    ``ttl`` is the default session TTL in seconds, ``wait`` and ``lock_delay``
    the defaults of :meth:`acquire`. ``ca`` (a CA PEM file) switches to TLS and
    is the only CA trusted; ``cert``/``key`` a client certificate; ``token`` a
    bearer token, refused without ``ca`` (credentials never travel in
    plaintext). ``label`` is shown next to the locks this client holds
    (default ``"HOST/pid N"``). ``rpc_timeout`` is each attempt's socket
    timeout, ``retry_for`` how long calls retry across leader changes.
    ``safety_margin`` is subtracted from every guarantee (default a tenth of
    the TTL, at least 50 ms; at most half the TTL).
    """

    def __init__(
        self,
        endpoints: Union[str, Sequence[str]],
        *,
        ttl: float = 10.0,
        wait: float = 0.0,
        lock_delay: float = 0.0,
        ca: Optional[str] = None,
        cert: Optional[str] = None,
        key: Optional[str] = None,
        token: Optional[str] = None,
        label: Optional[str] = None,
        rpc_timeout: float = 2.0,
        retry_for: float = 10.0,
        safety_margin: Optional[float] = None,
    ) -> None:
        if isinstance(endpoints, str):
            endpoints = [e.strip() for e in endpoints.split(",") if e.strip()]
        if ca is None and (token is not None or cert is not None):
            raise InvalidInput("a bearer token or client certificate needs ca= (credentials never travel in plaintext)")
        if (cert is None) != (key is None):
            raise InvalidInput("cert= and key= go together")
        if token is not None and (not token.strip() or not token.strip().isprintable()):
            raise InvalidInput("the bearer token is empty or not printable")
        self._ttl = _duration(ttl, "ttl")
        self._wait = _duration(wait, "wait")
        self._lock_delay = _duration(lock_delay, "lock_delay")
        if safety_margin is not None:
            _duration(safety_margin, "safety_margin")
        self._margin = safety_margin
        self._label = label if label is not None else f"{socket.gethostname()}/pid {os.getpid()}"
        self._conn = Connector(
            list(endpoints),
            ssl_context=tls_context(ca, cert, key) if ca is not None else None,
            token=token,
            rpc_timeout=_duration(rpc_timeout, "rpc_timeout"),
            retry_for=_duration(retry_for, "retry_for"),
        )
        self._lock = threading.Lock()
        self._sessions: List[_Session] = []
        self._closed = False
        # Closes the sessions when the client is closed, collected, or at exit.
        self._finalizer = weakref.finalize(self, _shutdown, self._lock, self._sessions, self._conn)

    # -- sessions ---------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise InvalidInput("the client is closed")

    def _session_for(self, ttl: float, name: str) -> _Session:
        """A live session of ``ttl`` not busy with ``name``, marked busy with it."""
        with self._lock:
            for s in self._sessions:
                if s.requested_ttl == ttl and name not in s.busy and s.alive():
                    s.busy.add(name)
                    return s
        session = self._open_session(ttl)
        with self._lock:
            if self._closed:
                closed = True
            else:
                closed = False
                self._sessions.append(session)
                session.busy.add(name)
        if closed:
            session.lose("closed")
            session.close_on_server(self._conn.rpc_timeout)
            self._check_open()
        return session

    def _open_session(self, ttl: float) -> _Session:
        sent = time.monotonic()  # the first guarantee runs from here
        reply = self._conn.simple("POST", "/v1/sessions", {"ttl_ms": _ms(ttl), "label": self._label})
        try:
            session_id, key = str(_int(reply.get("session_id"), "session_id")), str(reply["session_key"])
            granted = float(reply["ttl_ms"]) / 1000.0
        except (KeyError, TypeError, ValueError):
            raise ProtocolError(f"unexpected answer to create session: {reply!r}") from None
        margin = self._margin if self._margin is not None else max(granted / 10, 0.05)
        margin = min(margin, granted / 2)
        session = _Session(self, session_id, key, ttl, granted, margin, sent + granted - margin)
        session.start()
        return session

    def _retire(self, session: _Session) -> None:
        """A lost session is never picked again."""
        with self._lock:
            if session in self._sessions:
                self._sessions.remove(session)

    def _free(self, session: _Session, name: str) -> None:
        with self._lock:
            session.busy.discard(name)

    # -- locks ------------------------------------------------------------

    def acquire(
        self,
        name: str,
        ttl: Optional[float] = None,
        wait: Optional[float] = None,
        lock_delay: Optional[float] = None,
        on_lost: Optional[Callable[[Lease], None]] = None,
        *,
        claim: Optional[Claim] = None,
    ) -> Lease:
        """Acquires lock ``name`` and returns its :class:`Lease`.

        ``ttl``: the session TTL (default the client's); ``wait``: seconds to
        wait in the lock's FIFO queue (0: :class:`WouldBlock` at once if held);
        ``lock_delay``: after this holder's session expires (not after a clean
        release) the lock stays unavailable this long. ``on_lost(lease)`` is
        called (from a background thread) when the lease is lost.

        ``claim``: ``None`` (a plain lock), :class:`~palisade.Permit` ``(n)``,
        :class:`~palisade.Read` ``()``, :class:`~palisade.Write` ``()`` or
        :class:`~palisade.Lead` ``(value)`` (docs/recipes.md). A shared claim
        (a permit, a reader) takes no lock-delay: the client's default is not
        applied to it, and one given here is refused by the server.

        Raises :class:`WouldBlock`, :class:`WaitTimeout`, :class:`InvalidInput`,
        :class:`PermissionDenied`, :class:`WrongShape` (the name is another
        recipe, or this session holds it in the other mode),
        :class:`SessionExpired` (the session's guarantee ran out during the
        wait), :class:`GrantTooLate`, or :class:`Unavailable` — after which the
        outcome is unknown and the acquire is cancelled in the background.
        """
        self._check_open()
        claim_fields = wire_fields(claim)
        ttl = self._ttl if ttl is None else _duration(ttl, "ttl")
        wait = self._wait if wait is None else _duration(wait, "wait")
        if lock_delay is None:
            lock_delay = 0.0 if isinstance(claim, (Permit, Read)) else self._lock_delay
        else:
            lock_delay = _duration(lock_delay, "lock_delay")
        session = self._session_for(ttl, name)
        handed_over = False  # whether someone else now frees `name` on `session`
        try:
            give_up = time.monotonic() + wait

            def attempt() -> "tuple[Optional[Dict[str, Any]], float]":
                if not session.alive():
                    raise SessionExpired(f"session {session.id} expired while acquiring {name!r}")
                left = max(0.0, give_up - time.monotonic())
                body = dict(session.ids(), name=name, wait_ms=_ms(left), lock_delay_ms=_ms(lock_delay), **claim_fields)
                # A long poll: the answer may take the whole wait.
                return body, left + self._conn.rpc_timeout

            # A retry after a leader change is safe: the same session acquiring
            # a lock it already holds gets the same grant back.
            abort = Abort()
            session.watch(abort)
            try:
                reply = self._conn.call("POST", "/v1/locks/acquire", attempt, wait + self._conn.retry_for, abort)
            except Unavailable:
                handed_over = True
                self._cancel_in_background(session, name)
                raise
            except UnknownSession:
                session.lose("unknown_session")
                raise
            except WouldBlock:
                # A retry sent after the wait ran out asks with wait_ms 0.
                if wait > 0:
                    raise WaitTimeout(f"the wait for {name!r} ran out") from None
                raise
            finally:
                session.unwatch(abort)
            token = _int(reply.get("token"), "the token of an acquire")
            if token == 0:
                raise ProtocolError(f"unexpected answer to acquire: {reply!r}")
            slot = reply.get("slot", 0) if isinstance(claim, Permit) else 0
            if not isinstance(slot, int) or isinstance(slot, bool) or slot < 0:
                raise ProtocolError(f"unexpected answer to acquire: {reply!r}")
            lease = Lease(self, session, name, token, on_lost, claim, slot)
            if not session.adopt(lease):
                # Granted, but the answer came after the guarantee ran out: the
                # grant may have been expired and handed on already. The lost
                # session is being closed, which releases it.
                raise GrantTooLate(f"the grant of {name!r} (token {token}) arrived after the session's guarantee ran out")
            handed_over = True  # the lease frees it on release
            return lease
        finally:
            if not handed_over:
                self._free(session, name)

    def lock(
        self,
        name: str,
        ttl: Optional[float] = None,
        wait: Optional[float] = None,
        lock_delay: Optional[float] = None,
        on_lost: Optional[Callable[[Lease], None]] = None,
        *,
        claim: Optional[Claim] = None,
    ) -> Lease:
        """Same as :meth:`acquire` (the lock is taken by this call); meant for
        ``with client.lock(name) as lease:``, which releases it on leaving."""
        return self.acquire(name, ttl=ttl, wait=wait, lock_delay=lock_delay, on_lost=on_lost, claim=claim)

    def _proclaim(self, session: _Session, name: str, token: int, value: str) -> None:
        """The leader of ``name`` (``session`` with ``token``) says ``value``
        (the wire call)."""
        body = dict(session.ids(), name=name, token=str(token), value=value)
        try:
            self._conn.simple("POST", "/v1/locks/proclaim", body)
        except UnknownSession:
            session.lose("unknown_session")
            raise

    # -- elections --------------------------------------------------------

    def campaign(
        self,
        name: str,
        value: str,
        ttl: Optional[float] = None,
        wait: Optional[float] = None,
        lock_delay: Optional[float] = None,
        on_lost: Optional[Callable[[Lease], None]] = None,
    ) -> Lease:
        """Campaigns for leadership of the election ``name`` with ``value``
        and returns the leader's :class:`Lease` once this candidate leads:
        :meth:`acquire` with ``claim=Lead(value)``. Candidates queue FIFO; pass
        a ``wait`` long enough to stand in line (the client's default wait is
        0: :class:`WouldBlock` if someone leads). Leadership ends with
        :meth:`Lease.release` or the loss of the lease (``lease.lost``);
        :meth:`Lease.proclaim` changes the value."""
        return self.acquire(name, ttl=ttl, wait=wait, lock_delay=lock_delay, on_lost=on_lost, claim=Lead(value))

    def leader(self, name: str) -> Optional[Leader]:
        """The leader of the election ``name`` now (a linearizable read of the
        lock on the leader), ``None`` when nobody leads. Raises
        :class:`WrongShape` (decided here) if the name is held as another
        shape. A snapshot: it may have changed by the time it is returned, and
        only the token, checked by the resource, tells a leader it was
        overtaken."""
        info = self.get(name)
        if info is None:
            return None
        if info.shape != "election":
            raise WrongShape(f"{name!r} is a {info.shape}, not an election")
        return info.leader()

    def observe(
        self, name: str, interval: float = 0.25, stop: Optional[threading.Event] = None
    ) -> Iterator[Optional[Leader]]:
        """Yields the leader of the election ``name`` (``None`` when nobody
        leads) at the first look and then each time it changes (another
        session, token or value).

        This **polls**: it reads the lock (as :meth:`leader`) every
        ``interval`` seconds, so it reports the leader as it is at each look,
        and a leadership shorter than ``interval`` can be missed altogether
        (the server has no watch stream yet). It runs until ``stop`` is set
        (checked between looks, which it also ends early) or the caller stops
        iterating; errors of a look (:class:`Unavailable` after
        ``retry_for``, :class:`WrongShape`) end it by raising.
        """
        interval = _duration(interval, "interval")
        self._check_open()
        return self._observe(name, interval, stop)

    def _observe(self, name: str, interval: float, stop: Optional[threading.Event]) -> Iterator[Optional[Leader]]:
        first, last = True, None
        while stop is None or not stop.is_set():
            current = self.leader(name)
            if stop is not None and stop.is_set():
                return
            if first or current != last:
                yield current
            first, last = False, current
            if stop is None:
                time.sleep(interval)
            elif stop.wait(interval):
                return

    def _release(self, session: _Session, name: str, token: int, budget: Optional[float] = None) -> None:
        """Releases ``name`` held with ``token`` by ``session`` (the wire call)."""
        attempts = 0

        def attempt() -> "tuple[Optional[Dict[str, Any]], float]":
            nonlocal attempts
            attempts += 1
            return dict(session.ids(), name=name, token=str(token)), self._conn.rpc_timeout

        try:
            self._conn.call("POST", "/v1/locks/release", attempt, self._conn.retry_for if budget is None else budget)
        except (NotHolder, StaleToken):
            # A retry (the first attempt's answer was lost) that finds the grant
            # gone: the first attempt released it. Nothing else can have: the
            # server answered, so the session is alive, and a live session's
            # grant ends only by its own release.
            if attempts > 1:
                return
            raise
        except UnknownSession:
            session.lose("unknown_session")
            raise

    def _release_in_background(self, session: _Session, name: str, token: int) -> None:
        def run() -> None:
            try:
                self._release(session, name, token)
            except Unavailable:
                session.lose("abandoned")
            except PalisadeError:
                pass
            self._free(session, name)

        _thread(run, f"palisade-release-{session.id}")

    def _cancel_in_background(self, session: _Session, name: str) -> None:
        """After an acquire whose outcome is unknown: asks the server to forget
        the wait, which also releases a grant made meanwhile. ``name`` stays
        busy on the session until then, so no later acquire of it on this
        session can be given that grant and see it cancelled."""

        def run() -> None:
            try:
                self._conn.simple("POST", "/v1/locks/cancel", dict(session.ids(), name=name))
            except Unavailable:
                session.lose("abandoned")
            except PalisadeError:
                pass  # nothing to cancel (not_holder), or the session is gone
            self._free(session, name)

        _thread(run, f"palisade-cancel-{session.id}")

    # -- reads ------------------------------------------------------------

    def get(self, name: str) -> Optional[LockInfo]:
        """One lock, read linearizably on the leader; ``None`` when nobody
        holds or waits for it."""
        self._check_open()
        reply = self._conn.simple("GET", "/v1/lock?" + urlencode({"name": name}))
        lock = reply.get("lock")
        return None if lock is None else LockInfo.from_json(lock)

    def list(self) -> List[LockInfo]:
        """Every lock the caller may read, read linearizably on the leader."""
        self._check_open()
        reply = self._conn.simple("GET", "/v1/locks")
        return [LockInfo.from_json(lock) for lock in reply.get("locks") or ()]

    def check_token(self, name: str, token: int) -> TokenCheck:
        """Whether ``token`` is still the current holder's token for ``name``
        (truthy if so), and the current token."""
        self._check_open()
        reply = self._conn.simple("GET", "/v1/check-token?" + urlencode({"name": name, "token": str(int(token))}))
        current = reply.get("current_token")
        return TokenCheck(bool(reply.get("current")), None if current is None else _int(current, "current_token"))

    def status(self) -> Status:
        """The cluster as the node this client talks to (the leader once
        known) sees it."""
        self._check_open()
        return Status.from_json(self._conn.simple("GET", "/v1/status"))

    # -- lifetime ---------------------------------------------------------

    def close(self) -> None:
        """Closes every session — their leases are lost and their locks released
        at once — and the connections. Best effort (each session close gets one
        ``rpc_timeout``; a session not closed expires after its TTL)."""
        with self._lock:
            self._closed = True
        self._finalizer()  # runs once

    def __enter__(self) -> "Client":
        return self

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        # No credentials here: only where the client goes.
        return f"Client(endpoints={self._conn._endpoints!r}, tls={self._conn._ssl is not None})"


def _shutdown(lock: threading.Lock, sessions: List[_Session], conn: Connector) -> None:
    """Closes a client's sessions and connections (its finalizer: it must not
    refer to the client itself)."""
    with lock:
        todo = list(sessions)
        sessions.clear()
    for s in todo:
        s.lose("closed")  # first end every lease's guarantee…
        s.close_on_server(conn.rpc_timeout)  # …then free its locks
    conn.close()
