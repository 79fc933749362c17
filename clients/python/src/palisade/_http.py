"""Talking to the nodes: persistent HTTP/1.1 connections, TLS, finding and
following the leader, retrying with backoff (as the Rust client's connector)."""

from __future__ import annotations

import http.client
import json
import logging
import socket
import ssl
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from .errors import InvalidInput, ProtocolError, Unavailable, from_wire

log = logging.getLogger("palisade")

#: What an attempt is made of: the JSON body (``None`` for a GET) and the
#: socket timeout of this attempt. Called once per attempt, so that a retried
#: acquire asks only for the wait that is left.
Attempt = Callable[[], Tuple[Optional[Dict[str, Any]], float]]


def split_endpoint(endpoint: str) -> Tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` too) as ``(host, port)``.

    A URL is refused rather than guessed at: whether the node speaks TLS is
    decided by ``ca``, not by a scheme.
    """
    if "://" in endpoint or ":" not in endpoint:
        raise InvalidInput(f"endpoint {endpoint!r}: expected HOST:PORT")
    host, _, port = endpoint.rpartition(":")
    host = host.strip("[]")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InvalidInput(f"endpoint {endpoint!r}: expected HOST:PORT")
    return host, int(port)


def tls_context(ca: str, cert: Optional[str], key: Optional[str]) -> ssl.SSLContext:
    """A client context that trusts only the cluster's CA and checks that each
    node's certificate names the host dialled."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # check_hostname and CERT_REQUIRED
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_verify_locations(cafile=ca)
        if cert is not None:
            ctx.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as e:
        raise InvalidInput(f"TLS files: {e}") from None
    # The server offers h2 and http/1.1; http.client speaks only HTTP/1.1.
    ctx.set_alpn_protocols(["http/1.1"])
    return ctx


def _describe(e: BaseException) -> str:
    """A transport failure in a person's words."""
    if isinstance(e, (socket.timeout, TimeoutError)):
        return "timed out"
    if isinstance(e, ConnectionRefusedError):
        return "connection refused"
    if isinstance(e, ConnectionResetError):
        return "connection reset"
    if isinstance(e, ssl.SSLCertVerificationError):
        return f"TLS: certificate verify failed: {e.verify_message}"
    return str(e) or type(e).__name__


# Failures that on a *reused* connection most likely mean the node closed it
# while it sat idle: worth one more try on a fresh connection to the same node
# before calling the node down.
_STALE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError)


class Abort:
    """Ends a call from another thread: the socket of its attempt in flight is
    shut down (which wakes a blocked read) and no new attempt is made. Used to
    end a long-polling acquire the moment its session is lost."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._aborted = False
        self._conn: Optional[http.client.HTTPConnection] = None

    def abort(self) -> None:
        with self._lock:
            self._aborted = True
            if self._conn is not None and self._conn.sock is not None:
                try:
                    self._conn.sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def _check(self) -> None:
        if self._aborted:
            raise ConnectionAbortedError("call aborted")

    def _attach(self, conn: Optional[http.client.HTTPConnection]) -> None:
        """Watches ``conn`` (connected); raises if aborted meanwhile."""
        with self._lock:
            self._conn = conn
            if conn is not None:
                self._check()


class Connector:
    """Connections to the nodes, and which one is the leader as far as we know.

    Thread-safe: a connection is used by one call at a time (taken from a pool
    per node and put back once its answer has been read), so concurrent calls
    — a long-polling acquire and the keep-alives — never share one.
    """

    def __init__(
        self,
        endpoints: Sequence[str],
        *,
        ssl_context: Optional[ssl.SSLContext],
        token: Optional[str],
        rpc_timeout: float,
        retry_for: float,
    ) -> None:
        if not endpoints:
            raise InvalidInput("no endpoints given")
        for e in endpoints:
            split_endpoint(e)
        self.rpc_timeout = rpc_timeout
        self.retry_for = retry_for
        self._ssl = ssl_context
        self._headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if token is not None:
            self._headers["Authorization"] = f"Bearer {token.strip()}"
        self._lock = threading.Lock()
        self._endpoints: List[str] = list(endpoints)
        self._leader: Optional[str] = None
        self._next = -1  # the first rotation starts at endpoints[0]
        self._idle: Dict[str, List[http.client.HTTPConnection]] = {}
        self._closed = False

    # -- which node -------------------------------------------------------

    def _target(self) -> str:
        with self._lock:
            if self._leader is not None:
                return self._leader
            self._next = (self._next + 1) % len(self._endpoints)
            return self._endpoints[self._next]

    def _follow(self, named: Optional[str], failed: str) -> None:
        """After ``not_leader`` from ``failed``: go to the node it named, or
        rotate through the endpoints during an election."""
        with self._lock:
            if named and named != failed:
                try:
                    split_endpoint(named)
                except InvalidInput:
                    named = None
            if named and named != failed:
                if named not in self._endpoints:
                    self._endpoints.append(named)
                self._leader = named
            else:
                self._leader = None

    def _forget_leader(self, addr: str) -> None:
        with self._lock:
            if self._leader == addr:
                self._leader = None

    # -- connections ------------------------------------------------------

    def _checkout(self, addr: str) -> Tuple[http.client.HTTPConnection, bool]:
        """An idle connection to ``addr`` (reused = True) or a new one."""
        with self._lock:
            pool = self._idle.get(addr)
            if pool:
                return pool.pop(), True
        host, port = split_endpoint(addr)
        if self._ssl is not None:
            return http.client.HTTPSConnection(host, port, context=self._ssl), False
        return http.client.HTTPConnection(host, port), False

    def _checkin(self, addr: str, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            if not self._closed:
                self._idle.setdefault(addr, []).append(conn)
                return
        conn.close()

    def _roundtrip(
        self,
        addr: str,
        method: str,
        path: str,
        payload: Optional[bytes],
        timeout: float,
        abort: Optional[Abort],
    ) -> Tuple[int, Optional[str], bytes]:
        """One request on one node: (status, Palisade-Leader header, body)."""
        while True:
            conn, reused = self._checkout(addr)
            # The connect timeout and every read of this attempt.
            conn.timeout = timeout
            if conn.sock is not None:
                conn.sock.settimeout(timeout)
            try:
                if abort is not None:
                    if conn.sock is None:
                        conn.connect()
                    abort._attach(conn)
                conn.request(method, path, body=payload, headers=self._headers)
                resp = conn.getresponse()
                data = resp.read()
            except _STALE:
                conn.close()
                if reused:
                    continue  # see _STALE; a fresh connection is not reused
                raise
            except BaseException:
                # Timed out or broken: the connection's state is unknown (an
                # answer may still arrive on it), so it is never reused. Closing
                # it also takes a long-polling acquire out of the lock's queue.
                conn.close()
                raise
            finally:
                if abort is not None:
                    abort._attach(None)
            self._checkin(addr, conn)
            return resp.status, resp.getheader("Palisade-Leader"), data

    def close(self) -> None:
        """Closes every idle connection; those in use close when their call ends."""
        with self._lock:
            self._closed = True
            pools, self._idle = self._idle, {}
        for pool in pools.values():
            for conn in pool:
                conn.close()

    # -- calls ------------------------------------------------------------

    def call(
        self, method: str, path: str, attempt: Attempt, budget: float, abort: Optional[Abort] = None
    ) -> Dict[str, Any]:
        """Calls the leader, following ``not_leader`` and retrying transport
        failures and ``unavailable`` with backoff, for at most ``budget``
        seconds; then :class:`Unavailable` saying what each node did.

        Every other refusal is raised at once as its :class:`PalisadeError`.
        ``attempt`` may raise to stop the retries (after ``abort``, say).
        """
        started = time.monotonic()
        give_up = started + budget
        backoff = 0.02
        tried: Dict[str, str] = {}  # each node's last failure, for the final error
        while True:
            body, timeout = attempt()
            addr = self._target()
            # Every attempt ends within the budget, answered or not.
            left = give_up - time.monotonic()
            timeout = max(min(timeout, left), 0.001)
            payload = None if body is None else json.dumps(body).encode()
            try:
                status, leader_header, data = self._roundtrip(addr, method, path, payload, timeout, abort)
                answer = _parse(status, data)
            except (OSError, http.client.HTTPException) as e:
                if abort is None or not abort._aborted:  # else not the node's fault
                    self._forget_leader(addr)
                why = _describe(e)
            else:
                if status == 200 and "error" not in answer:
                    with self._lock:
                        self._leader = addr
                    return answer
                err = answer.get("error")
                if not isinstance(err, dict):
                    raise ProtocolError(f"HTTP {status} from {addr} without an error object")
                code = err.get("code")
                if code == "not_leader":
                    self._follow(err.get("leader") or leader_header, addr)
                    why = "not the leader" if self._leader else "no leader elected yet"
                elif code == "unavailable":
                    self._forget_leader(addr)
                    why = str(err.get("message") or "unavailable")
                else:
                    raise from_wire(err)
            tried[addr] = why
            log.debug("%s %s on %s: %s; retrying", method, path.split("?")[0], addr, why)
            if time.monotonic() + backoff >= give_up:
                each = "; ".join(f"{a}: {w}" for a, w in tried.items())
                raise Unavailable(f"{each} (tried for {time.monotonic() - started:.1f} s)")
            time.sleep(backoff)
            backoff = min(backoff * 2, 0.5)

    def simple(
        self, method: str, path: str, body: Optional[Dict[str, Any]] = None, budget: Optional[float] = None
    ) -> Dict[str, Any]:
        """A call whose every attempt is the same, with ``rpc_timeout`` each."""
        return self.call(
            method,
            path,
            lambda: (body, self.rpc_timeout),
            self.retry_for if budget is None else budget,
        )


def _parse(status: int, data: bytes) -> Dict[str, Any]:
    """The JSON object of an answer. A body that is not one is a transport-level
    failure for 5xx (a proxy in between, a node going down) and a protocol error
    otherwise."""
    try:
        answer = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        answer = None
    if isinstance(answer, dict):
        return answer
    if status >= 500:
        raise http.client.HTTPException(f"HTTP {status} without JSON")
    raise ProtocolError(f"HTTP {status}: not a JSON object: {data[:200]!r}")


