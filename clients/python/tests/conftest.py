"""Fixtures that run real Palisade processes (no mocks).

The binary is $PALISADE_BIN, default target/debug/palisade of the repository
(relative paths are taken from the repository root). Every node gets free
loopback ports and a temporary data directory, is waited for until it prints
"serving clients on", and is killed at the end.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Callable, Iterator, List, Optional, Sequence

import pytest

import palisade

REPO_ROOT = Path(__file__).resolve().parents[3]

#: Generous: a loaded 2-core machine may be slow to start a debug binary.
START_TIMEOUT = 60.0


def palisade_bin() -> Path:
    path = Path(os.environ.get("PALISADE_BIN", "target/debug/palisade"))
    if not path.is_absolute():
        path = REPO_ROOT / path
    if not path.exists():
        pytest.fail(f"no palisade binary at {path} (set PALISADE_BIN)")
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def eventually(what: str, check: Callable[[], bool], timeout: float = 30.0) -> None:
    """Waits until ``check()`` is true (polling), failing after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


class Proc:
    """A palisade process whose stderr goes to a file we can wait on."""

    def __init__(self, args: Sequence[str], log: Path, ready: str) -> None:
        self.log = log
        self._ready = ready
        self.args = [str(palisade_bin()), *args]
        self.proc: Optional[subprocess.Popen[bytes]] = None

    def launch(self) -> "Proc":
        """Starts the process without waiting for it."""
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(self.args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        return self

    def wait_ready(self) -> "Proc":
        """Waits until the log says it is ready (fails if it exits first)."""
        assert self.proc is not None
        deadline = time.monotonic() + START_TIMEOUT
        while self._ready not in self.log.read_text(errors="replace"):
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.args} exited {self.proc.returncode}:\n{self.log.read_text()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.args} not ready in {START_TIMEOUT} s:\n{self.log.read_text()}")
            time.sleep(0.05)
        return self

    def start(self) -> "Proc":
        """Starts it and waits until it is ready."""
        return self.launch().wait_ready()

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def kill(self) -> None:
        """SIGKILL (after SIGCONT, in case it is stopped) and reap."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
            self.proc.wait(timeout=30)


class Node(Proc):
    """One `palisade serve` node."""

    def __init__(self, node_id: int, addr: str, peer: str, data: Path, extra: Sequence[str] = ()) -> None:
        self.id = node_id
        self.addr = addr
        self.peer = peer
        args = ["serve", "--id", str(node_id), "--listen", addr, "--listen-peer", peer, "--data-dir", str(data), *extra]
        super().__init__(args, data.parent / f"node-{node_id}.log", "serving clients on")


class Cluster:
    """Nodes started together; killed at the end of the test that made them."""

    def __init__(self, nodes: List[Node]) -> None:
        self.nodes = nodes

    @property
    def endpoints(self) -> List[str]:
        return [n.addr for n in self.nodes]

    def node(self, addr: str) -> Node:
        return next(n for n in self.nodes if n.addr == addr)

    def leader(self, timeout: float = 60.0, **client_args: object) -> str:
        """The client address of the leader all live nodes agree on."""
        found: List[str] = []

        def check() -> bool:
            seen = set()
            for n in self.nodes:
                if n.proc is None or n.proc.poll() is not None:
                    continue
                try:
                    with palisade.Client([n.addr], retry_for=0.5, **client_args) as c:  # type: ignore[arg-type]
                        st = c.status()
                except palisade.PalisadeError:
                    return False
                seen.add(st.leader_addr())
            if len(seen) == 1 and None not in seen:
                found[:] = [str(seen.pop())]
                return True
            return False

        eventually("a leader", check, timeout)
        return found[0]

    def kill(self) -> None:
        for n in self.nodes:
            n.kill()


@pytest.fixture
def start_cluster(tmp_path: Path) -> Iterator[Callable[..., Cluster]]:
    """``start_cluster(size=1, extra=[...])`` starts nodes and waits for each."""
    made: List[Cluster] = []

    def start(size: int = 1, extra: Sequence[str] = ()) -> Cluster:
        base = tmp_path / f"cluster-{len(made)}"
        base.mkdir()
        ports = [(free_port(), free_port()) for _ in range(size)]
        spec = ",".join(f"{i + 1}=127.0.0.1:{p}/127.0.0.1:{q}" for i, (p, q) in enumerate(ports))
        nodes = []
        for i, (p, q) in enumerate(ports):
            args = list(extra) + (["--initial-cluster", spec] if size > 1 else [])
            nodes.append(Node(i + 1, f"127.0.0.1:{p}", f"127.0.0.1:{q}", base / f"data-{i + 1}", args))
        cluster = Cluster(nodes)
        made.append(cluster)
        # All launched before any is waited on: a node of a static cluster may
        # say it serves only once its peers answer.
        for n in nodes:
            n.launch()
        for n in nodes:
            n.wait_ready()
        return cluster

    yield start
    for c in made:
        c.kill()


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    """One plaintext single-node cluster shared by a test module (tests use
    lock names of their own)."""
    base = tmp_path_factory.mktemp("node")
    n = Node(1, f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}", base / "data")
    try:
        n.start()
        yield n
    finally:
        n.kill()


@pytest.fixture
def clients(node: Node) -> Iterator[Callable[..., palisade.Client]]:
    """``clients(**kwargs)`` makes a Client of the shared node; all are closed
    at the end of the test."""
    made: List[palisade.Client] = []

    def make(**kwargs: object) -> palisade.Client:
        c = palisade.Client([node.addr], **kwargs)  # type: ignore[arg-type]
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()
