"""TLS, client certificates, bearer tokens and the policy file's roles, on a
real node started with --tls-* and --auth."""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

import palisade
from conftest import Node, free_port, palisade_bin


@dataclass
class Secure:
    node: Node
    certs: Path
    locker_token: str
    reader_token: str

    def client(self, **kwargs: object) -> palisade.Client:
        kwargs.setdefault("ca", str(self.certs / "ca.pem"))
        return palisade.Client([self.node.addr], **kwargs)  # type: ignore[arg-type]


def new_token(name: str) -> "tuple[str, str]":
    """`palisade certs token NAME`: the token and its sha256 line."""
    out = subprocess.run([str(palisade_bin()), "certs", "token", name], check=True, capture_output=True, text=True).stdout
    token = re.search(r"token: ([0-9a-f]+)", out)
    sha = re.search(r"token_sha256 = \[\"([0-9a-f]{64})\"\]", out)
    assert token and sha, out
    return token.group(1), sha.group(1)


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secure]:
    base = tmp_path_factory.mktemp("secure")
    certs = base / "certs"
    subprocess.run(
        [str(palisade_bin()), "certs", "init", str(certs), "--nodes", "1", "--clients", "alice,mallory"],
        check=True,
        capture_output=True,
    )
    locker, locker_sha = new_token("locker")
    reader, reader_sha = new_token("reader")
    policy = base / "policy.toml"
    policy.write_text(
        f"""
[roles.jobs]
lock = ["jobs/"]
read = ["jobs/"]
[roles.readall]
read = [""]

[[users]]
name = "alice"
roles = ["jobs"]
[[users]]
name = "locker"
token_sha256 = ["{locker_sha}"]
roles = ["jobs"]
[[users]]
name = "reader"
token_sha256 = ["{reader_sha}"]
roles = ["readall"]
"""
    )
    node = Node(
        1,
        f"127.0.0.1:{free_port()}",
        f"127.0.0.1:{free_port()}",
        base / "data",
        [
            "--tls-cert", str(certs / "node-1.pem"),
            "--tls-key", str(certs / "node-1-key.pem"),
            "--tls-ca", str(certs / "ca.pem"),
            "--auth", str(policy),
        ],
    )
    try:
        node.start()
        yield Secure(node, certs, locker, reader)
    finally:
        node.kill()


def test_client_certificate(secure: Secure) -> None:
    with secure.client(cert=str(secure.certs / "client-alice.pem"), key=str(secure.certs / "client-alice-key.pem")) as c:
        with c.lock("jobs/cert") as lease:
            assert lease.token > 0
            info = c.get("jobs/cert")
            assert info is not None and info.token == lease.token
        # alice's role covers only jobs/.
        with pytest.raises(palisade.PermissionDenied) as e:
            c.acquire("other/cert")
        assert e.value.code == "permission_denied"


def test_bearer_token(secure: Secure) -> None:
    with secure.client(token=secure.locker_token) as c:
        with c.lock("jobs/token") as lease:
            assert c.check_token("jobs/token", lease.token).current


def test_read_only_role_cannot_lock(secure: Secure) -> None:
    with secure.client(token=secure.locker_token) as locker, secure.client(token=secure.reader_token) as reader:
        with locker.lock("jobs/read-only") as lease:
            with pytest.raises(palisade.PermissionDenied):
                reader.acquire("jobs/read-only")
            info = reader.get("jobs/read-only")  # reading is allowed
            assert info is not None and info.token == lease.token
            assert [lock.name for lock in reader.list()] == ["jobs/read-only"]


def test_unknown_token_is_unauthenticated(secure: Secure) -> None:
    with secure.client(token="00" * 32) as c:
        with pytest.raises(palisade.Unauthenticated) as e:
            c.acquire("jobs/wrong-token")
        assert e.value.code == "unauthenticated"
        with pytest.raises(palisade.Unauthenticated):
            c.list()


def test_no_credentials_is_unauthenticated(secure: Secure) -> None:
    with secure.client() as c:
        with pytest.raises(palisade.Unauthenticated):
            c.acquire("jobs/anonymous")


def test_certificate_not_in_the_policy_cannot_lock(secure: Secure) -> None:
    certs = secure.certs
    with secure.client(cert=str(certs / "client-mallory.pem"), key=str(certs / "client-mallory-key.pem")) as c:
        with pytest.raises(palisade.PermissionDenied):
            c.acquire("jobs/mallory")


def test_plaintext_to_a_tls_node_fails(secure: Secure) -> None:
    with palisade.Client([secure.node.addr], retry_for=0.5) as c:
        with pytest.raises(palisade.Unavailable):
            c.acquire("jobs/plaintext")


def test_an_untrusted_ca_is_refused(secure: Secure, tmp_path: Path) -> None:
    other = tmp_path / "other"
    subprocess.run([str(palisade_bin()), "certs", "init", str(other), "--nodes", "1"], check=True, capture_output=True)
    with palisade.Client([secure.node.addr], ca=str(other / "ca.pem"), token=secure.locker_token, retry_for=0.5) as c:
        with pytest.raises(palisade.Unavailable) as e:
            c.acquire("jobs/untrusted")
        assert "certificate verify failed" in e.value.message


def test_localhost_is_in_the_node_certificate(secure: Secure) -> None:
    """The hostname is checked against the name dialled; the node certificates
    cover localhost as well as 127.0.0.1."""
    port = secure.node.addr.rsplit(":", 1)[1]
    with palisade.Client([f"localhost:{port}"], ca=str(secure.certs / "ca.pem"), token=secure.locker_token) as c:
        with c.lock("jobs/localhost"):
            pass
