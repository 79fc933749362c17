"""Locks on one real node: grants, tokens, FIFO waiting, refusals, reads."""

from __future__ import annotations

import threading
import time
from typing import Callable, List, Tuple

import pytest

import palisade
from conftest import Node, eventually

Clients = Callable[..., palisade.Client]


def test_acquire_token_release(clients: Clients) -> None:
    c = clients(label="tester")
    with c.lock("t/basic", ttl=10) as lease:
        assert isinstance(lease.token, int) and lease.token > 0
        assert lease.name == "t/basic"
        assert not lease.lost.is_set()
        assert 0.0 < lease.remaining() <= 10.0
        assert lease.fencing_header() == ("Fencing-Token", str(lease.token))
        info = c.get("t/basic")
        assert info is not None
        assert (info.holder, info.token, info.holder_label, info.waiters) == (lease.session_id, lease.token, "tester", ())
        assert c.check_token("t/basic", lease.token) == palisade.TokenCheck(True, lease.token)
        assert any(lock.name == "t/basic" for lock in c.list())
        token = lease.token
    assert lease.remaining() == 0.0 and not lease.lost.is_set()
    assert c.get("t/basic") is None
    assert c.check_token("t/basic", token) == palisade.TokenCheck(False, None)
    lease.release()  # a second release does nothing


def test_tokens_rise(clients: Clients) -> None:
    a, b = clients(), clients()
    tokens = []
    for c in (a, b, a):
        with c.lock("t/rise") as lease:
            tokens.append(lease.token)
    assert tokens == sorted(tokens) and len(set(tokens)) == 3


def test_many_locks_share_one_session(clients: Clients) -> None:
    c = clients()
    with c.lock("t/share/1") as l1, c.lock("t/share/2") as l2:
        assert l1.session_id == l2.session_id
        assert l1.token != l2.token


def test_threads_of_one_client_exclude_each_other(clients: Clients) -> None:
    """Two threads of one client wanting the same lock use two sessions, so the
    server queues one behind the other."""
    c = clients()
    first = c.acquire("t/threads")
    got: List[palisade.Lease] = []
    t = threading.Thread(target=lambda: got.append(c.acquire("t/threads", wait=60)))
    t.start()
    eventually("the second thread queued", lambda: bool((c.get("t/threads") or first).waiters))  # type: ignore[union-attr]
    assert not got
    first.release()
    t.join(60)
    assert got and got[0].token > first.token and got[0].session_id != first.session_id
    got[0].release()


def test_waiters_are_granted_in_fifo_order(clients: Clients) -> None:
    holder, w1, w2 = clients(), clients(), clients()
    first = holder.acquire("t/fifo")
    granted: List[Tuple[str, palisade.Lease, float]] = []
    lock = threading.Lock()

    def wait_for(who: str, c: palisade.Client) -> None:
        lease = c.acquire("t/fifo", wait=60)
        with lock:
            granted.append((who, lease, time.monotonic()))

    def waiters() -> Tuple[int, ...]:
        info = holder.get("t/fifo")
        return info.waiters if info else ()

    t1 = threading.Thread(target=wait_for, args=("w1", w1))
    t1.start()
    eventually("w1 queued", lambda: len(waiters()) == 1)
    t2 = threading.Thread(target=wait_for, args=("w2", w2))
    t2.start()
    eventually("w2 queued", lambda: len(waiters()) == 2)
    assert not granted  # both block while the lock is held
    released_at = time.monotonic()
    first.release()
    eventually("w1 granted", lambda: len(granted) == 1, 60)
    assert granted[0][0] == "w1" and granted[0][1].token > first.token
    assert granted[0][2] >= released_at
    time.sleep(0.2)  # w2 must still be waiting: w1 holds the lock
    assert len(granted) == 1
    granted[0][1].release()
    t1.join(60)
    t2.join(60)
    assert [g[0] for g in granted] == ["w1", "w2"]
    assert granted[1][1].token > granted[0][1].token
    granted[1][1].release()


def test_would_block_and_wait_timeout(clients: Clients) -> None:
    a, b = clients(), clients()
    with a.lock("t/busy") as lease:
        with pytest.raises(palisade.WouldBlock) as e:
            b.acquire("t/busy")
        assert e.value.code == "would_block"
        with pytest.raises(palisade.WaitTimeout):
            b.acquire("t/busy", wait=0.3)
        info = a.get("t/busy")
        assert info is not None and info.token == lease.token and info.waiters == ()


def test_bad_input_is_refused_and_changes_nothing(clients: Clients) -> None:
    c = clients()
    with c.lock("t/bad") as lease:
        before = c.list()
        with pytest.raises(palisade.InvalidInput) as e:
            c.acquire("")
        assert e.value.code == "invalid_input" and "empty" in e.value.message
        with pytest.raises(palisade.InvalidInput):
            c.acquire("x" * 100_000)
        with pytest.raises(palisade.InvalidInput):
            c.acquire("t/bad-ttl", ttl=0)
        with pytest.raises(palisade.InvalidInput):
            c.acquire("t/bad-ttl", ttl=-1)
        with pytest.raises(palisade.StaleToken) as stale:
            c._release(lease._session, "t/bad", lease.token - 1)
        assert stale.value.current_token == lease.token
        assert stale.value.presented_token == lease.token - 1
        with pytest.raises(palisade.NotHolder):
            c._release(lease._session, "t/bad-never-held", lease.token)
        assert c.list() == before
        assert c.check_token("t/bad", lease.token).current
        assert not lease.lost.is_set()
    assert c.get("t/bad") is None


def test_client_side_refusals() -> None:
    with pytest.raises(palisade.InvalidInput):
        palisade.Client([])
    with pytest.raises(palisade.InvalidInput):
        palisade.Client(["http://127.0.0.1:7420"])
    with pytest.raises(palisade.InvalidInput):
        palisade.Client(["127.0.0.1:7420"], token="secret")  # no CA: never in plaintext
    with pytest.raises(palisade.InvalidInput):
        palisade.Client(["127.0.0.1:7420"], wait=-1)


def test_unreachable_cluster_is_unavailable() -> None:
    from conftest import free_port

    c = palisade.Client([f"127.0.0.1:{free_port()}"], retry_for=0.5)
    with pytest.raises(palisade.Unavailable) as e:
        c.acquire("t/nobody")
    assert "connection refused" in e.value.message
    c.close()


def test_closing_the_client_releases_and_loses(clients: Clients, node: Node) -> None:
    lost: List[palisade.Lease] = []
    a = palisade.Client([node.addr])
    lease = a.acquire("t/close", on_lost=lost.append)
    a.close()
    assert lease.lost.is_set() and lost == [lease] and lease.remaining() == 0.0
    b = clients()
    with b.lock("t/close") as again:  # released at once, not after the TTL
        assert again.token > lease.token
    with pytest.raises(palisade.InvalidInput):
        a.acquire("t/close")


def test_status(clients: Clients, node: Node) -> None:
    st = clients().status()
    assert st.state == "leader" and st.leader == st.id == 1
    assert st.leader_addr() == node.addr and st.term >= 1


def test_names_are_sent_verbatim(clients: Clients) -> None:
    c = clients()
    name = "t/odd name&x=1?#%"
    with c.lock(name) as lease:
        info = c.get(name)
        assert info is not None and info.name == name and info.token == lease.token
        assert c.check_token(name, lease.token).current


def test_a_dropped_lease_is_released(clients: Clients) -> None:
    import gc

    c = clients()
    c.acquire("t/dropped")  # the lease is not kept
    gc.collect()
    eventually("the dropped lease released", lambda: c.get("t/dropped") is None)


def test_a_dropped_client_closes_its_sessions(node: Node) -> None:
    """The keep-alive threads do not keep a dropped client alive: it is
    collected, and its finalizer closes its sessions."""
    import gc
    import weakref

    c = palisade.Client([node.addr], ttl=60)
    c.acquire("t/dropped-client").release()  # a session now exists
    finalizer, ref = c._finalizer, weakref.ref(c)
    del c
    eventually("the client collected", lambda: gc.collect() >= 0 and ref() is None)
    assert not finalizer.alive
