"""A real 3-node cluster: following the leader, and a leader killed with
SIGKILL while a client holds a lock and another waits for it."""

from __future__ import annotations

import signal
import threading
import time
from typing import Callable, List, Optional

import palisade
from conftest import Cluster, eventually

StartCluster = Callable[..., Cluster]


def test_follows_the_leader_from_any_node(start_cluster: StartCluster) -> None:
    cluster = start_cluster(3)
    leader = cluster.leader()
    followers = [a for a in cluster.endpoints if a != leader]
    # Only followers given: the first answer names the leader, which is then
    # remembered for every call.
    with palisade.Client(followers) as c:
        with c.lock("c/follow") as lease:
            assert c.check_token("c/follow", lease.token).current
            assert c.status().leader_addr() == leader
    # A follower's own answer is not_leader; the client never shows it.
    with palisade.Client([followers[0]]) as c:
        assert c.get("c/follow") is None


def test_leader_killed(start_cluster: StartCluster) -> None:
    """A holds a lock through the leader only (it is cut off with it, so its
    lease must run out); B knows every node and waits for the same lock. The
    leader is killed with SIGKILL. A's `lost` must be set before B is granted,
    and B's token must be higher."""
    cluster = start_cluster(3)
    leader = cluster.leader()
    a = palisade.Client([leader], ttl=2.0, rpc_timeout=0.5)
    b = palisade.Client(cluster.endpoints, ttl=5.0, retry_for=30)
    try:
        a_lost_at: List[float] = []
        lease_a = a.acquire("c/killed", on_lost=lambda _lease: a_lost_at.append(time.monotonic()))
        b_result: List[palisade.Lease] = []
        b_granted_at: List[float] = []
        b_error: List[BaseException] = []

        def b_waits() -> None:
            try:
                lease = b.acquire("c/killed", wait=120)
                b_granted_at.append(time.monotonic())
                b_result.append(lease)
            except BaseException as e:  # noqa: BLE001 - recorded for the assert
                b_error.append(e)

        t = threading.Thread(target=b_waits)
        t.start()

        def b_queued() -> bool:
            info = b.get("c/killed")
            return info is not None and len(info.waiters) == 1

        eventually("B queued behind A", b_queued)
        cluster.node(leader).signal(signal.SIGKILL)
        t.join(120)
        assert not t.is_alive(), "B was never granted"
        assert not b_error, b_error
        lease_b = b_result[0]
        assert lease_a.lost.is_set()
        assert a_lost_at and a_lost_at[0] < b_granted_at[0], (a_lost_at, b_granted_at)
        assert lease_a.guaranteed_until() < b_granted_at[0]
        assert lease_b.token > lease_a.token
        new_leader: Optional[str] = b.status().leader_addr()
        assert new_leader is not None and new_leader != leader
        lease_b.release()
    finally:
        a.close()
        b.close()
