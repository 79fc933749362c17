"""Recipes on one real node: semaphore permits, read/write locks, elections
(docs/recipes.md). Waits are for conditions, with long timeouts; nothing
asserts a duration."""

from __future__ import annotations

import threading
from typing import Callable, List, Optional, Set, Tuple

import pytest

import palisade
from palisade import Lead, Permit, Read, Write
from conftest import eventually

Clients = Callable[..., palisade.Client]


def waiters(c: palisade.Client, name: str) -> int:
    info = c.get(name)
    return len(info.waiters) if info else 0


def test_a_semaphore_of_2_admits_2_at_once_in_distinct_slots(clients: Clients) -> None:
    a, b, c = clients(label="a"), clients(label="b"), clients()
    pa = a.acquire("r/sem2", claim=Permit(2))
    pb = b.acquire("r/sem2", claim=Permit(2))
    assert {pa.slot, pb.slot} == {0, 1}
    assert pa.claim == Permit(2) and pb.token > pa.token
    with pytest.raises(palisade.WouldBlock):
        c.acquire("r/sem2", claim=Permit(2))
    info = a.get("r/sem2")
    assert info is not None
    assert (info.shape, info.permits, info.waiters) == ("semaphore", 2, ())
    assert [(h.session, h.label, h.token, h.shared, h.slot) for h in info.holders] == [
        (pa.session_id, "a", pa.token, True, pa.slot),
        (pb.session_id, "b", pb.token, True, pb.slot),
    ]
    assert (info.holder, info.token) == (pb.session_id, pb.token)  # the newest holder
    slot = pa.slot
    pa.release()
    with c.lock("r/sem2", claim=Permit(2)) as pc:  # the freed slot
        assert pc.slot == slot and pc.token > pb.token
    pb.release()
    assert a.get("r/sem2") is None


def test_semaphore_contenders_never_exceed_the_permits_and_all_are_served(clients: Clients) -> None:
    """Six contenders (a client each, like six processes) for a semaphore of 2:
    by their own count never more than 2 hold at once, concurrent holders never
    share a slot, every one is served. Each holder keeps its permit until a
    second one holds too (or nobody is left to come), so two at once is
    reached without relying on timing."""
    contenders, permits = 6, 2
    cond = threading.Condition()
    holding: Set[int] = set()  # the slots held right now, by the holders' own account
    peak = 0
    done = 0
    grants: List[Tuple[int, int]] = []  # (slot, token)
    failures: List[BaseException] = []

    def contend(c: palisade.Client) -> None:
        nonlocal peak, done
        try:
            lease = c.acquire("r/sem-contended", claim=Permit(permits), wait=120)
            with cond:
                assert lease.slot not in holding, f"slot {lease.slot} granted twice at once"
                assert 0 <= lease.slot < permits
                holding.add(lease.slot)
                peak = max(peak, len(holding))
                assert len(holding) <= permits, f"{len(holding)} holders of a semaphore of {permits}"
                grants.append((lease.slot, lease.token))
                cond.notify_all()
                assert cond.wait_for(lambda: len(holding) == permits or done + len(holding) == contenders, 60)
                holding.discard(lease.slot)  # before the release: the count never overstates
                done += 1
                cond.notify_all()
            lease.release()
        except BaseException as e:  # reported by the test thread
            failures.append(e)

    threads = [threading.Thread(target=contend, args=(clients(),)) for _ in range(contenders)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    assert not failures, failures
    assert done == contenders and len(grants) == contenders
    assert peak == permits
    assert len(set(grants)) == contenders  # no slot granted twice with one token
    for s in range(permits):
        tokens = [t for slot, t in grants if slot == s]
        assert tokens == sorted(tokens)  # a slot's next grant is above its last
    assert clients().get("r/sem-contended") is None


def test_readers_share_and_a_writer_waits_with_a_larger_token(clients: Clients) -> None:
    # A client's default lock-delay is not applied to a shared claim (the
    # server refuses one for readers).
    r1, r2, r3, w = clients(lock_delay=5), clients(), clients(), clients()
    l1 = r1.acquire("r/doc", claim=Read())
    l2 = r2.acquire("r/doc", claim=Read())
    assert (l1.slot, l2.slot) == (0, 0)
    info = r1.get("r/doc")
    assert info is not None and info.shape == "read_write" and info.permits == 0
    assert [(h.token, h.shared) for h in info.holders] == [(l1.token, True), (l2.token, True)]
    with pytest.raises(palisade.WouldBlock):
        w.acquire("r/doc", claim=Write())
    got: List[palisade.Lease] = []
    t = threading.Thread(target=lambda: got.append(w.acquire("r/doc", claim=Write(), wait=120)))
    t.start()
    eventually("the writer queued", lambda: waiters(r1, "r/doc") == 1)
    # FIFO: a reader behind the waiting writer waits too.
    with pytest.raises(palisade.WouldBlock):
        r3.acquire("r/doc", claim=Read())
    l1.release()
    assert not got  # the other reader still holds
    l2.release()
    t.join(120)
    assert got, "the writer was not granted"
    writer = got[0]
    assert writer.token > max(l1.token, l2.token) and writer.slot == 0
    info = r1.get("r/doc")
    assert info is not None
    assert [(h.session, h.token, h.shared) for h in info.holders] == [(writer.session_id, writer.token, False)]
    with pytest.raises(palisade.WouldBlock):
        r3.acquire("r/doc", claim=Read())
    writer.release()
    with r3.lock("r/doc", claim=Read()) as l3:
        assert l3.token > writer.token


def test_a_claim_of_another_shape_is_wrong_shape_and_changes_nothing(clients: Clients) -> None:
    a, b = clients(), clients()
    with a.lock("r/shape-sem", claim=Permit(2)), a.lock("r/shape-mutex"), a.lock("r/shape-rw", claim=Read()):
        before = a.list()
        for name, claim in [
            ("r/shape-sem", None),
            ("r/shape-sem", Permit(3)),
            ("r/shape-sem", Read()),
            ("r/shape-mutex", Read()),
            ("r/shape-mutex", Lead("x")),
            ("r/shape-rw", Permit(2)),
            ("r/shape-rw", None),
        ]:
            with pytest.raises(palisade.WrongShape) as e:
                b.acquire(name, claim=claim, wait=5)
            assert e.value.code == "wrong_shape"
        assert a.list() == before
        with pytest.raises(palisade.WrongShape):
            a.leader("r/shape-mutex")  # decided by the client: not an election
    with pytest.raises(palisade.InvalidInput):
        Permit("3")  # type: ignore[arg-type]
    with pytest.raises(palisade.InvalidInput):
        b.acquire("r/shape-bad", claim=Permit(0))  # the server's judgement
    with pytest.raises(palisade.InvalidInput):
        b.acquire("r/shape-bad", claim=Read(), lock_delay=1)  # no lock-delay for a shared claim


def test_a_plain_lock_reads_as_a_mutex_with_its_one_holder(clients: Clients) -> None:
    c = clients(label="plain")
    with c.lock("r/plain") as lease:
        assert (lease.slot, lease.claim) == (0, None)
        info = c.get("r/plain")
        assert info is not None and (info.shape, info.permits) == ("mutex", 0)
        assert info.holders == (palisade.Holder(session=lease.session_id, label="plain", token=lease.token),)
        assert info.leader() is None


def test_election_proclaim_and_succession(clients: Clients) -> None:
    a, b, watcher = clients(label="a"), clients(label="b"), clients()
    assert watcher.leader("r/primary") is None
    seen: List[Optional[palisade.Leader]] = []
    stop = threading.Event()
    errors: List[BaseException] = []

    def observe() -> None:
        try:
            for leader in watcher.observe("r/primary", interval=0.05, stop=stop):
                seen.append(leader)
        except BaseException as e:
            errors.append(e)

    obs = threading.Thread(target=observe)
    obs.start()
    eventually("the first look", lambda: len(seen) >= 1)
    assert seen[0] is None

    first = a.campaign("r/primary", "10.0.0.7:5432")
    assert isinstance(first.claim, Lead) and first.slot == 0
    assert watcher.leader("r/primary") == palisade.Leader(
        name="r/primary", session=first.session_id, label="a", token=first.token, value="10.0.0.7:5432"
    )
    eventually("observed the first leader", lambda: bool(seen) and seen[-1] is not None)
    first.proclaim("10.0.0.7:6432")
    info = watcher.get("r/primary")
    assert info is not None and info.shape == "election"
    assert [(h.session, h.token, h.shared, h.value) for h in info.holders] == [
        (first.session_id, first.token, False, "10.0.0.7:6432")
    ]
    eventually("observed the new value", lambda: seen[-1] is not None and seen[-1].value == "10.0.0.7:6432")

    with pytest.raises(palisade.WouldBlock):
        b.campaign("r/primary", "10.0.0.8:5432")
    got: List[palisade.Lease] = []
    t = threading.Thread(target=lambda: got.append(b.campaign("r/primary", "10.0.0.8:5432", wait=120)))
    t.start()
    eventually("the second candidate queued", lambda: waiters(watcher, "r/primary") == 1)
    first.release()
    t.join(120)
    assert got, "the second candidate did not lead"
    second = got[0]
    assert second.token > first.token
    leader = watcher.leader("r/primary")
    assert leader is not None and (leader.session, leader.token, leader.value) == (
        second.session_id,
        second.token,
        "10.0.0.8:5432",
    )
    eventually("observed the second leader", lambda: seen[-1] is not None and seen[-1].token == second.token)
    with pytest.raises(palisade.NotHolder):
        first.proclaim("10.0.0.7:7432")  # released: refused without asking
    second.release()
    eventually("observed nobody leading", lambda: seen[-1] is None)
    stop.set()
    obs.join(60)
    assert not obs.is_alive() and not errors, errors

    leaders = [(x.session, x.token, x.value) for x in seen if x is not None]
    assert leaders == [
        (first.session_id, first.token, "10.0.0.7:5432"),
        (first.session_id, first.token, "10.0.0.7:6432"),
        (second.session_id, second.token, "10.0.0.8:5432"),
    ]
    assert all(x != y for x, y in zip(seen, seen[1:]))  # each a change


def test_a_stale_or_deposed_leader_cannot_proclaim(clients: Clients) -> None:
    a, b = clients(), clients()
    lease = a.campaign("r/stale", "a")
    with pytest.raises(palisade.StaleToken) as e:
        a._proclaim(lease._session, "r/stale", lease.token - 1, "forged")
    assert (e.value.current_token, e.value.presented_token) == (lease.token, lease.token - 1)
    with pytest.raises(palisade.WrongShape):
        with a.lock("r/stale-mutex") as plain:
            plain.proclaim("x")  # not an election
    with pytest.raises(palisade.InvalidInput):
        lease.proclaim("x" * 2000)  # over 1024 bytes
    # Deposed: its session is closed behind its back (as an operator might),
    # and the other candidate leads.
    a._conn.simple("POST", "/v1/sessions/close", lease._session.ids())
    second = b.campaign("r/stale", "b", wait=60)
    assert second.token > lease.token
    with pytest.raises(palisade.LeaseLost):
        lease.proclaim("a again")
    assert lease.lost.is_set()
    leader = b.leader("r/stale")
    assert leader is not None and (leader.token, leader.value) == (second.token, "b")
    second.release()
