"""`lost`: set when the server no longer knows the session, and by the timer
when keep-alives stop getting through. Waits are for events, with long
timeouts; nothing depends on a fixed short sleep."""

from __future__ import annotations

import http.client
import json
import signal
import threading
import time
from typing import Callable, List

import pytest

import palisade
from conftest import Cluster, Node

Clients = Callable[..., palisade.Client]


def close_session_behind_its_back(addr: str, lease: palisade.Lease) -> None:
    """What an operator or a bug elsewhere might do: the session is closed on
    the server with its own credentials, and the client is not told."""
    host, port = addr.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    conn.request("POST", "/v1/sessions/close", json.dumps(lease._session.ids()), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200, resp.read()
    conn.close()


def test_lost_when_the_server_drops_the_session(clients: Clients, node: Node) -> None:
    lost_calls: List[palisade.Lease] = []
    c = clients(ttl=2)
    with pytest.raises(palisade.LeaseLost):
        with c.lock("l/dropped", on_lost=lost_calls.append) as lease:
            close_session_behind_its_back(node.addr, lease)
            # The next keep-alive (a quarter TTL) hears unknown_session.
            assert lease.lost.wait(30), "lost was not set"
            assert lease.remaining() == 0.0
    assert lost_calls == [lease]
    # The client opens a new session for the next lock.
    with c.lock("l/dropped") as again:
        assert again.token > lease.token and again.session_id != lease.session_id


def test_block_error_is_not_masked_by_the_loss(clients: Clients, node: Node) -> None:
    c = clients(ttl=2)
    with pytest.raises(KeyError):
        with c.lock("l/masked") as lease:
            close_session_behind_its_back(node.addr, lease)
            assert lease.lost.wait(30)
            raise KeyError("the block's own error")


def test_lost_by_the_timer_when_the_node_is_stopped(start_cluster: Callable[..., Cluster]) -> None:
    """SIGSTOP the node past the TTL: keep-alives go unanswered (not refused),
    so only the timer can tell; the lease is lost, and once the node runs again
    the lock is granted to someone else with a higher token."""
    cluster = start_cluster(1)
    n = cluster.nodes[0]
    a = palisade.Client(cluster.endpoints, ttl=1.0, rpc_timeout=0.5)
    b = palisade.Client(cluster.endpoints, retry_for=60)
    try:
        lease = a.acquire("l/stopped")
        lost_at: List[float] = []
        n.signal(signal.SIGSTOP)
        try:
            assert lease.lost.wait(60), "lost was not set while the node was stopped"
            lost_at.append(time.monotonic())
            assert lease.remaining() == 0.0
            assert lease.guaranteed_until() <= lost_at[0]
        finally:
            n.signal(signal.SIGCONT)
        with b.lock("l/stopped", wait=60) as other:
            assert other.token > lease.token
        with pytest.raises(palisade.LeaseLost):
            lease.release()
    finally:
        a.close()
        b.close()


def test_session_expired_during_a_wait(start_cluster: Callable[..., Cluster]) -> None:
    """A waiting acquire whose session cannot be kept alive ends with an
    error, never with a grant it could not rely on."""
    cluster = start_cluster(1)
    n = cluster.nodes[0]
    holder = palisade.Client(cluster.endpoints, ttl=30)
    waiter = palisade.Client(cluster.endpoints, ttl=1.0, rpc_timeout=0.5, retry_for=2)
    try:
        held = holder.acquire("l/wait-expired")
        outcome: List[BaseException] = []

        def wait() -> None:
            try:
                waiter.acquire("l/wait-expired", wait=20).release()
            except BaseException as e:  # noqa: BLE001 - recorded for the assert
                outcome.append(e)

        t = threading.Thread(target=wait)
        t.start()
        deadline = time.monotonic() + 30
        while not (held_info := holder.get("l/wait-expired")) or not held_info.waiters:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        n.signal(signal.SIGSTOP)
        try:
            t.join(60)
        finally:
            n.signal(signal.SIGCONT)
        assert not t.is_alive()
        assert outcome and isinstance(
            outcome[0], palisade.SessionExpired
        ), outcome
        held.release()
    finally:
        holder.close()
        waiter.close()
